"""The SM clock: what locking it lower does to an iteration's time and power, and a governor
that lowers it while the SLO allows (``[clock]``).

The law. An iteration's work splits into what the SMs compute and what the memory moves::

    c = flops / (peak bf16 FLOPS x compute_efficiency)      (ms at the highest clock)
    m = bytes / (peak bandwidth x bandwidth_efficiency)    (ms; the memory clock is not touched)

(the cost model's work: FP8 GEMMs' FLOPs already counted at the bf16 rate, ``plugins/cost_models/work.py``).
The two efficiencies are ``[clock]``'s own settings, fixed defaults (0.77 and 0.91) that are not
read from the cost model: the roofline's ``mfu`` is 0.69 by default and 0.61 on the H100 preset,
it reads weights at ``bandwidth_efficiency`` 0.846 (its default and the H100 preset's) and the KV
cache at ``kv_read_efficiency`` 0.91. Their ratio decides where an iteration turns compute-bound
at a lower clock, their values how much longer a compute-bound one takes: set them to the cost
model's to split and stretch the work as it times it.

At the clock ``r = f / f_max`` the compute takes ``c / r``. The memory traffic takes ``m`` down
to a knee ``k`` and ``m k / r`` below it: HBM data reaches the SMs through the L2 and the
crossbar, which run on the SM clock, so below some clock they, not the DRAM, set the bandwidth.
The iteration's time becomes (the roofline's ``max`` of the two moves, the rest does not)::

    time(r) = time(1) + max(c / r, m max(1, k / r)) - max(c, m)

Prefill (compute-bound) slows as ``1 / r``; decode (memory-bound) does not slow down to the knee
-- unless its compute outlasts its memory traffic first -- and slows as ``k / r`` below it. What
the sources measured (the constants below quote the numbers the law takes from them):

* decode hardly slows as the clock comes down, prefill does: DynamoLLM (Stojkovic et al., HPCA
  2025) and "Towards Greener LLMs" (Stojkovic et al., 2024) on H100s (their frequency sections
  were not in the text available to check, only their front matter); Maliakel et al.
  ("Characterizing LLM Inference Energy-Performance Tradeoffs", arXiv 2501.08219v4) on an RTX
  PRO 6000: 1-6% slower end to end, 42% less energy, at 180 instead of 2,842 MHz;
* but not at every clock: on an A100 (Voltana) LLM inference at 1,005 instead of 1,410 MHz
  "does increase execution time", sub-linearly, and its energy against the clock is U-shaped
  ("at low frequencies, execution time dominates energy, whereas at high frequencies, power
  dominates; in the middle lies an energy sweet point"); throttLL'eM (A100, A10G) and GreenLLM
  fit latency against the SM clock rather than take decode as unaffected by it;
* Ma et al. ("The Illusion of Power Capping in LLM Decode", arXiv 2605.11999v1) on an H200:
  locking the SM clock recovers "up to 32% of decode energy at minimal throughput loss".

No text read gives the knee of an H100, H200 or A100 as a number; :data:`DEFAULT_KNEE` puts it at
Voltana's 1,005 of 1,410 MHz, the lowest clock at which a measurement on a datacenter GPU saw
energy still fall -- the highest the bottom of its U can be, so that every saving the law finds
rests on clocks a measurement saw save. :data:`CLOCK_LAW_BY_GPU` holds the GPUs measured on
their own (the RTX PRO 6000: no knee above 180 MHz).

Power follows CMOS dynamic power, ``P ~ C V^2 f`` (the law GPU DVFS measurement studies fit,
e.g. Mei, Wang and Chu, "A survey and measurement study of GPU DVFS on energy conservation",
Digital Communications and Networks, 2017), with the core voltage at its floor (Vmin, a share
``voltage_floor`` of the highest clock's) at and below the knee and rising linearly to 1 from
there to ``f_max`` -- NVIDIA V-F curves are flat at Vmin below a knee: ``v(r)``. The clock tree
and idle SMs of an awake GPU draw ``r v(r)^2`` of their power at full clock; the power of the
work itself -- SMs issuing loads or multiplying, caches, the memory's interface -- is split: the
``core_share`` on the core's voltage rail costs ``v(r)^2`` per unit of work, the rest (DRAM and
its interface, on their own clock) the same at any SM clock (:func:`clock_power_factor`). So a
memory-bound step's energy falls with the clock down to the knee and rises below it (its time
grows as ``k / r``, the awake share falls only as ``r``, idle power not at all): the U, its
bottom at the knee. ``core_share = 0.7`` with a floor of 0.65 is what it takes for Maliakel et
al.'s measurement to come out of this law (memory-bound decode on an RTX PRO 6000 at 180 instead
of 2,842 MHz: 42% less energy at about the same speed; typical NVIDIA V-F curves run from about
0.7 V to 1.05-1.1 V). Elsewhere the floor is :data:`DEFAULT_VOLTAGE_FLOOR`, 0.749: what makes the
bottom of the U save the 32% Ma et al. measured at most on an H200 (``tools/derive_clock.py``;
an effective figure, which also carries how much of a step's energy the power model lets the
clock touch). The utilisation power model applies these factors.

The governor (``policy = "slo"``, in the spirit of DynamoLLM's per-instance frequency
control and of GreenLLM's separate prefill and decode clocks): a decode-only iteration runs
at the lowest clock level, from ``min_mhz`` (default: the knee, below which no iteration takes
less energy) up, whose time stays within ``headroom x tpot_ms`` -- the time between a
decode's tokens -- and an iteration with prompt tokens at the highest clock (its prefill is
compute-bound, and waits for it are TTFT). Under light load most iterations only decode and
the clock comes down; as the load grows, prompts ride along more often and it goes back up.
The choice depends on the iteration's shape alone, so both engines make it alike, and a bulk
decode run ends where its growing context would need the next level up
(:meth:`ClockedCostModel.decode_step_increment`). Setting the clock takes time
(``nvmlDeviceSetGpuLockedClocks``; Velička, Vysocký and Říha, arXiv 2502.20075, measured the
switching latency on a GH200, an A100 and an RTX Quadro 6000 and found it differs widely between
them): the governor does not model it, nor hold a level for a minimum time -- no figure was read
to set one.

Speculative decoding (:class:`~schedlab.drafting.DraftingCostModel`, which the clock wraps). A
step is the target's verify pass and then the drafter's passes, one after the other, each bound
by its own resource: the law stretches each on its own split (the wrapped model's
``work_parts``) and the step by their sum -- a small drafter's pass over many tokens turns
compute-bound at a clock at which the target's step, or the passes' summed work, is still
memory-bound. One clock runs the whole step (the GPU's); the governor chooses it from the whole
step, drafting included.

Data-parallel ranks stepping together (:mod:`schedlab.engine.lockstep`). A step lasts
``max_r(rank part_r) + experts``: each rank's own part and the routed experts of every rank's
tokens run one after the other, so the law times each on its own work split -- a rank's part
from the cost model's ``rank_work`` of its batch (the dummy's for a rank with nothing to
compute; pass by pass, ``rank_work_parts``, where the rank drafts), the experts from the
work of the busiest expert GPU, the one the step waits for (``busiest_experts_work`` of the
step's tokens: with ``expert_balancedness`` below 1 it computes ``1 / balancedness`` of the mean
GPU's pairs, so its experts may turn compute-bound at a clock at which the mean GPU's are
still memory-bound; ``experts_work``, the mean GPU's, for a cost model that does not say the
busiest's) -- and swaps, on the host link, not at all. Energy still meters every GPU at the mean
share (``experts_work``, :class:`~schedlab.engine.rank_cost.RankCost`): the ``D x tp`` GPUs
together do the step's whole expert work whatever the balance, and the mean share keeps that
total (the busiest GPU's extra pairs are the others' missing ones). The
ranks step together, so they step at one clock: a rank locked lower would make every other
rank wait for it. A fixed clock is every rank's; the governor chooses from the step as a whole
-- the highest clock when any rank has prompt tokens, else the lowest level at which the whole
step (swaps included: what the decodes wait for) stays within ``headroom x tpot_ms``
(:meth:`ClockedCostModel.lockstep_at`). With the governor the ranks step one at a time (no
bulk runs: the level the step needs depends on every rank at once).

Pipelined instances (:mod:`schedlab.engine.pipeline`). Each stage's slice of a batch is timed by
the law on the stage's own work (the wrapped model's ``stage_work``: its layers' share), the
activations' sends between stages, on the links, not at all. A fixed clock is every stage's.
The governor chooses one clock per batch when it enters the pipeline -- every stage computes
that batch at it -- the highest when the batch has prompt tokens, else the lowest level at which
the batch's own trip through the pipeline (its stages' times and the sends between them) stays
within ``headroom x tpot_ms``: a decode's next token comes when its batch lands, so that trip is
its time between tokens, less any wait behind the other batches in flight (queueing, which the
headroom leaves room for, as for one GPU) (:meth:`ClockedCostModel.pipeline_at`). With
speculative decoding the last stage runs the target's slice and then the drafter's passes, each
stretched on its own split (the wrapped model's ``stage_work_parts``), as one GPU's step is.
"""

from __future__ import annotations

import math

import attrs

from ..capacity import GpuSpec
from ..configs import float_field, str_field
from ..engine.clock import check_iteration_ms, check_pipeline_ms, check_step_increment, hops_ms
from ..errors import ConfigError
from ..protocols import Batch

POLICIES = ("fixed", "slo")

#: The knee as a share of the highest clock where no measurement of the GPU places it: 1,005 of
#: 1,410 MHz, the lowest clock at which a published sweep on a datacenter GPU still saw LLM
#: inference take less energy -- Voltana (supercomputing-system-ai-lab.github.io/projects/voltana,
#: A100): "reducing GPU frequency from 1410 MHz to 1005 MHz (by ~28.7%) does increase execution
#: time, the increase is sub-linear. Consequently, the total energy follows a U-shaped curve".
#: Where below 1,005 MHz the bottom of that U lies is not in the text read, so the law puts it
#: there, the highest it can be: every saving then rests on clocks a measurement saw save.
DEFAULT_KNEE = 1005.0 / 1410.0

#: Core voltage at and below the knee (a share of the highest clock's) where no measurement of
#: the GPU gives one: the floor at which the law, at that knee, saves what Ma et al. measured
#: clock locking to save at most on an H200 -- "recovering up to 32% of decode energy at minimal
#: throughput loss" (arXiv 2605.11999v1, abstract) -- on Llama-3.1-8B decode steps on the
#: ``h200-141gb`` preset under the utilisation power model's defaults (``python
#: tools/derive_clock.py``). An effective figure: it also carries the power model's share of a
#: step's energy that the clock can touch.
DEFAULT_VOLTAGE_FLOOR = 0.749

#: GPU preset -> (knee MHz, voltage floor, source) where a measurement of that GPU says them.
CLOCK_LAW_BY_GPU: dict[str, tuple[float, float, str]] = {
    "rtx-pro-6000": (180.0, 0.65,
                     "Maliakel et al., arXiv 2501.08219v4 (abstract): decode 'largely insensitive to GPU frequency', "
                     "1-6% longer end to end and 42% less energy at 180 instead of 2,842 MHz -- no knee above the "
                     "lowest clock measured; the floor, 0.65, with core_share 0.7 reproduces the 42%"),
}


def default_law(gpu: GpuSpec) -> tuple[float, float]:
    """``(knee MHz, voltage floor)`` of ``gpu`` where ``[clock]`` does not say them:
    :data:`CLOCK_LAW_BY_GPU`, else :data:`DEFAULT_KNEE` of its highest clock and
    :data:`DEFAULT_VOLTAGE_FLOOR`."""
    known = CLOCK_LAW_BY_GPU.get(gpu.name)
    if known is not None:
        return known[0], known[1]
    return DEFAULT_KNEE * gpu.max_clock_mhz, DEFAULT_VOLTAGE_FLOOR


@attrs.frozen
class ClockConfig:
    """Settings of ``[clock]``: a fixed SM clock per instance, or the SLO governor."""

    policy: str = str_field("fixed", choices=POLICIES,
                            help="'fixed': every iteration at mhz; 'slo': the lowest clock level that keeps each "
                                 "decode-only iteration within headroom x tpot_ms, the highest with prompt tokens")
    mhz: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                    help="fixed: the SM clock in MHz (default: the GPU's highest)")
    tpot_ms: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                        help="slo: the time between tokens to keep within (default: [slo] tpot_ms)")
    headroom: float = float_field(0.9, min=0.0, max=1.0, min_exclusive=True,
                                  help="slo: aim at this share of tpot_ms (queueing and prefill chunks take the rest)")
    step_mhz: float = float_field(105.0, min=1.0,
                                  help="slo: clock levels from the lowest to the highest, this far apart")
    voltage_floor: float | None = float_field(None, min=0.1, max=1.0, optional=True,
                                              help="core voltage at and below the knee (Vmin) as a share of that at "
                                                   "the highest clock (default: the GPU's in CLOCK_LAW_BY_GPU, else "
                                                   "DEFAULT_VOLTAGE_FLOOR, fitted to a measured saving)")
    knee_mhz: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                         help="the SM clock below which memory traffic slows with the clock (as "
                                              "knee / f) and the core voltage stays at voltage_floor (default: the "
                                              "GPU's in CLOCK_LAW_BY_GPU, else DEFAULT_KNEE x its highest clock; at "
                                              "or below its lowest clock: no knee)")
    min_mhz: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                        help="slo: the lowest clock the governor picks (default: the knee, below "
                                             "which no iteration takes less energy)")
    core_share: float = float_field(0.7, min=0.0, max=1.0,
                                    help="share of the work's power on the core rail (scales with V^2); the rest, "
                                         "memory and its interface, does not change with the SM clock")
    compute_efficiency: float = float_field(0.77, min=0.0, max=1.0, min_exclusive=True,
                                            help="share of peak FLOPS the compute reaches, for the clock law's "
                                                 "compute/memory split; a fixed default, not read from the cost "
                                                 "model (the roofline's mfu: 0.69, 0.61 on the H100 preset)")
    bandwidth_efficiency: float = float_field(0.91, min=0.0, max=1.0, min_exclusive=True,
                                              help="share of peak bandwidth the memory traffic reaches, for the "
                                                   "clock law's split; a fixed default, not read from the cost model "
                                                   "(the roofline's kv_read_efficiency is 0.91, its weight reads' "
                                                   "bandwidth_efficiency 0.846 by default and on the H100 preset)")
    gpu: str | None = str_field(None, optional=True, help="GPU preset (default: the cost model's)")


def voltage_ratio(r: float, r_min: float, floor: float) -> float:
    """Core voltage at clock ratio ``r`` as a share of that at the highest clock: ``floor`` at and
    below ``r_min`` (the V-F curve's knee: Vmin), linear from there to 1 at 1."""
    if r >= 1.0:
        return 1.0
    if r <= r_min:  # (a knee at or above the highest clock too: every lower clock at the floor, the limit
        return floor  # of a knee just below it)
    return floor + (1.0 - floor) * (r - r_min) / (1.0 - r_min)


def clock_power_factor(r: float, r_min: float, floor: float, core_share: float) -> tuple[float, float]:
    """``(awake, work)``: how the power of an awake GPU (``r v^2``) and the energy per unit of
    work (``1 - core_share + core_share v^2``) scale at clock ratio ``r``, the voltage at its
    ``floor`` from ``r_min`` (:attr:`ClockedCostModel.r_min`: the knee) down."""
    v2 = voltage_ratio(r, r_min, floor) ** 2
    return r * v2, 1.0 - core_share + core_share * v2


class ClockedCostModel:
    """The instance's cost model at a locked or governed SM clock (see the module docstring).

    It needs the wrapped model's ``work`` (the roofline has it). ``clock_ratio(batch)`` tells
    the power model the clock an iteration ran at.
    """

    def __init__(self, inner, gpu: GpuSpec, config: ClockConfig, *, tpot_ms: float | None = None):
        work = getattr(inner, "work", None)
        if work is None:
            why = getattr(inner, "unsaid_work", None)  # speculative decoding's drafter says none
            name = type(getattr(inner, "target", inner)).__name__  # (the target's, through drafting)
            raise ConfigError(why if why else f"the cost model {name} does not say the bytes "
                              "and FLOPs of an iteration (work); use the roofline cost model")
        if gpu.max_clock_mhz is None or gpu.min_clock_mhz is None:
            raise ConfigError(f"GPU {gpu.name!r} has no max_clock_mhz/min_clock_mhz in its preset")
        knee, floor = default_law(gpu)
        knee = config.knee_mhz if config.knee_mhz is not None else knee
        if config.knee_mhz is not None and knee > gpu.max_clock_mhz:  # (was clamped: at f_max, the same law)
            raise ConfigError(f"knee_mhz: {knee:g} is above {gpu.name}'s highest clock ({gpu.max_clock_mhz:g} MHz): "
                              "a knee there is the highest clock itself (memory traffic slows at every lower clock)")
        #: the settings with the GPU's law filled in (the power models read voltage_floor here)
        self.config = config = attrs.evolve(config, knee_mhz=knee, voltage_floor=(
            config.voltage_floor if config.voltage_floor is not None else floor))
        self.inner = inner
        self.gpu = gpu
        self._work = work
        # an iteration's passes one after the other (a speculative step's target and drafter
        # passes, each stretched on its own split), where the wrapped model says them
        self._parts = getattr(inner, "work_parts", None)
        self._rank_parts = getattr(inner, "rank_work_parts", None)
        self._stage_parts = getattr(inner, "stage_work_parts", None)
        self._busiest = getattr(inner, "busiest_experts_work", None)
        # a lockstep rank's parts at the highest clock, for the check of the layout and the
        # cluster (which clocks the step, lockstep_at), and a pipeline stage's work (which
        # pipeline_at clocks); None when the wrapped model lacks them
        for name in ("rank_ms", "experts_ms", "rank_work", "experts_work", "rank_kernel_ms", "stage_work"):
            setattr(self, name, getattr(inner, name, None))
        if getattr(inner, "pipeline_ms", None) is None:  # no stages to clock
            self.pipeline_ms = self.pipeline_at = None
        self.needs_context_range = bool(getattr(inner, "needs_context_range", False))
        self.request_cost = getattr(inner, "request_cost", None)
        f_max, f_min = gpu.max_clock_mhz, gpu.min_clock_mhz
        #: the knee as a share of the highest clock (no lower than the lowest clock's): memory
        #: traffic slows below it, and the core voltage is at its floor from it down -- so it is
        #: also the ``r_min`` the power models read (where the V-F line meets the floor)
        self.knee = self.r_min = min(1.0, max(knee, f_min) / f_max)
        self._flops_per_ms = gpu.bf16_tflops * 1e9 * config.compute_efficiency
        self._bytes_per_ms = gpu.hbm_bandwidth_gbps * 1e6 * config.bandwidth_efficiency
        if config.policy == "fixed":
            for name in ("min_mhz", "tpot_ms"):
                if getattr(config, name) is not None:
                    raise ConfigError(f"{name}: a setting of the 'slo' policy; the 'fixed' policy runs every "
                                      "iteration at mhz (set policy = \"slo\", or leave it out)")
            mhz = config.mhz if config.mhz is not None else f_max
            if not f_min <= mhz <= f_max:
                raise ConfigError(f"mhz: {mhz:g} is outside {gpu.name}'s clocks ({f_min:g}-{f_max:g} MHz)")
            self.fixed = mhz / f_max
            self.levels = (self.fixed,)
            self.target = math.inf
        else:
            if config.mhz is not None:
                raise ConfigError("mhz: the 'slo' policy chooses the clock; leave mhz out")
            target = config.tpot_ms if config.tpot_ms is not None else tpot_ms
            if target is None or not math.isfinite(target):
                raise ConfigError("the 'slo' policy needs a TPOT target: set tpot_ms in [clock] or [slo]")
            self.fixed = None
            self.target = config.headroom * target
            low = config.min_mhz if config.min_mhz is not None else self.knee * f_max
            if not f_min <= low <= f_max:
                raise ConfigError(f"min_mhz: {low:g} is outside {gpu.name}'s clocks ({f_min:g}-{f_max:g} MHz)")
            n = int((f_max - low) // config.step_mhz)
            self.levels = tuple(sorted({(low + i * config.step_mhz) / f_max for i in range(n + 1)} | {1.0}))

    # --- the law -----------------------------------------------------------------------------
    def split(self, batch: Batch) -> tuple[float, float]:
        """``(c, m)``: the iteration's compute and memory time at the highest clock, ms."""
        return self.times(*self._work(batch))

    def times(self, byt: float, flops: float) -> tuple[float, float]:
        """``(c, m)``: the compute and memory time of ``flops`` and ``byt`` at the highest clock, ms."""
        return flops / self._flops_per_ms, byt / self._bytes_per_ms

    def stretch(self, c: float, m: float, r: float) -> float:
        """How much longer the iteration is at clock ratio ``r``, ms: its compute ``c / r``, its
        memory traffic ``m`` down to the knee and ``m x knee / r`` below it."""
        return _stretch(c, m, r, self.knee)

    def splits(self, batch: Batch) -> list[tuple[float, float]]:
        """``(c, m)`` of each pass of the iteration, in turn: the wrapped model's ``work_parts``
        (speculative decoding: the target's pass and the drafter's, each its own ``max`` in the
        law, since they run one after the other), else the iteration as one pass."""
        if self._parts is None:
            return [self.split(batch)]
        return [self.times(*w) for w in self._parts(batch)]

    def rank_splits(self, batch: Batch) -> list[tuple[float, float]]:
        """:meth:`splits` of a lockstep rank's own part (``rank_work_parts``, else ``rank_work``)."""
        if self._rank_parts is None:
            return [self.rank_split(batch)]
        return [self.times(*w) for w in self._rank_parts(batch)]

    def stretch_all(self, splits: list, r: float) -> float:
        """How much longer passes of ``splits`` run one after the other take at ``r``, ms."""
        knee = self.knee
        return sum(_stretch(c, m, r, knee) for c, m in splits) if r < 1.0 else 0.0

    def ms_at(self, batch: Batch, r: float, base: float | None = None) -> float:
        d = check_iteration_ms(self.inner.iteration_ms(batch), batch) if base is None else base
        if r >= 1.0 or not d:
            return d
        return d + self.stretch_all(self.splits(batch), r)

    def clock_ratio(self, batch: Batch) -> float:
        """The clock (as a share of the highest) an iteration of ``batch`` runs at."""
        if self.fixed is not None:
            return self.fixed
        if batch.prefill_tokens or not batch.num_decode:
            return 1.0  # prompt tokens: the highest clock (TTFT)
        d = check_iteration_ms(self.inner.iteration_ms(batch), batch)
        splits = self.splits(batch)
        for r in self.levels:
            if d + self.stretch_all(splits, r) <= self.target:
                return r
        return 1.0

    # --- CostModel protocol ----------------------------------------------------------------------
    def iteration_ms(self, batch: Batch) -> float:
        return self.ms_at(batch, self.clock_ratio(batch))

    def work(self, batch: Batch) -> tuple[float, float]:
        return self._work(batch)

    def kernel_ms(self, batch: Batch) -> float:
        """The GPU's kernels at the iteration's clock (the wrapped model's, stretched as the
        step is); the whole step when the wrapped model does not split it."""
        inner = getattr(self.inner, "kernel_ms", None)
        if inner is None:
            return self.iteration_ms(batch)
        k, r = inner(batch), self.clock_ratio(batch)
        if r >= 1.0 or not k:
            return k
        return k + self.stretch_all(self.splits(batch), r)

    def decode_step_increment(self, batch: Batch):
        """The wrapped model's increment at this clock, held while the linear pieces stay the
        same: the sides of the ``max`` terms of the law, and -- with the governor -- the chosen
        level keeping the target and the level below it still missing it."""
        inner = getattr(self.inner, "decode_step_increment", None)
        base = check_step_increment(inner(batch), batch) if inner is not None else None
        if base is None:
            return None
        inc, steps = base if type(base) is tuple else (base, None)
        r = self.clock_ratio(batch)
        if r >= 1.0 and self.fixed is not None:
            return base
        d0 = check_iteration_ms(self.inner.iteration_ms(batch), batch)
        c0, m0 = self.split(batch)
        c1, m1 = self.split(_next(batch))

        def level(r):  # (time at the run's first iteration, increment, iterations the piece holds)
            if r >= 1.0:
                return d0, inc, None
            s0, s_inc, hold = _stretched_run(c0, m0, c1, m1, r, self.knee)
            return d0 + s0, inc + s_inc, hold

        t0, t_inc, hold = level(r)
        holds = [steps, hold]
        if self.fixed is None:
            if r < 1.0 and t_inc > 0.0:  # the chosen level keeps the target this long
                holds.append(max(1, math.floor((self.target - t0) / t_inc) + 1))
            i = self.levels.index(r)
            if i > 0:  # the level below keeps missing it
                p0, p_inc, p_hold = level(self.levels[i - 1])
                holds.append(p_hold)
                if p_inc < 0.0:
                    holds.append(max(1, math.ceil((p0 - self.target) / -p_inc)))
        holds = [h for h in holds if h is not None]
        return (t_inc, max(1, min(holds))) if holds else t_inc


    # --- data-parallel ranks stepping together (schedlab.engine.lockstep) -------------------------
    def rank_split(self, batch: Batch) -> tuple[float, float]:
        """``(c, m)`` of a lockstep rank's own part of a step (the wrapped model's ``rank_work``)."""
        return self.times(*self.rank_work(batch))

    def experts_split(self, tokens) -> tuple[float, float]:
        """``(c, m)`` of a lockstep step's routed experts on the busiest GPU, the one the step
        waits for (the wrapped model's ``busiest_experts_work``; its ``experts_work``, the mean
        GPU's, where it does not say the busiest's)."""
        return self.times(*(self._busiest or self.experts_work)(tokens))

    def lockstep_at(self, own: list, tokens: tuple, parts: list, experts: float) -> tuple[float, list, float]:
        """``(r, parts, experts)``: the clock of a lockstep step and its ranks' parts and experts
        at it (see the module docstring).

        :param own: the batch each rank's GPUs compute (the dummy for a rank with nothing to do);
        :param tokens: every rank's tokens (what the experts are timed for);
        :param parts: each rank's part at the highest clock, its swaps included;
        :param experts: the experts at the highest clock.
        """
        splits = [self.rank_splits(b) for b in own]
        e_split = self.experts_split(tokens)
        stretch_all = self.stretch_all

        def at(r):
            if r >= 1.0:
                return parts, experts
            return [p + stretch_all(s, r) for p, s in zip(parts, splits)], experts + self.stretch(*e_split, r)

        if self.fixed is not None:
            r = self.fixed
        elif any(b.prefill_tokens for b in own):
            r = 1.0  # prompt tokens on some rank: the highest clock (TTFT)
        else:
            r = 1.0
            for level in self.levels:
                p, e = at(level)
                if max(p) + e <= self.target:
                    r = level
                    break
        return (r, *at(r))

    def rank_step_increment(self, batch: Batch):
        """A lockstep rank's part's growth over a decode run at the fixed clock: the wrapped
        model's increment (as the cluster takes it without a clock) and the stretch's, held while
        the sides of the law's ``max`` terms stay the same. None with the governor: its steps are
        chosen one at a time."""
        inner = getattr(self.inner, "rank_step_increment", None) or getattr(self.inner, "decode_step_increment", None)
        if self.fixed is None or inner is None:  # (speculative decoding: steps all unlike)
            return None
        base = inner(batch)
        if base is None or self.fixed >= 1.0:
            return base
        inc, steps = base if type(base) is tuple else (base, None)
        c0, m0 = self.rank_split(batch)
        c1, m1 = self.rank_split(_next(batch))
        _, s_inc, hold = _stretched_run(c0, m0, c1, m1, self.fixed, self.knee)
        holds = [h for h in (steps, hold) if h is not None]
        return (inc + s_inc, max(1, min(holds))) if holds else inc + s_inc


    # --- pipelined instances (schedlab.engine.pipeline) --------------------------------------------
    def pipeline_at(self, batch: Batch) -> tuple[tuple[float, ...], float, float]:
        """``(stage_ms, send_ms, r)``: a pipelined batch's stages at its clock, the activations'
        send (on the links: not clocked) and the clock (see the module docstring)."""
        stage_ms, send_ms = check_pipeline_ms(self.inner.pipeline_ms(batch), batch)
        if self.fixed is not None and self.fixed >= 1.0:
            return stage_ms, send_ms, 1.0
        splits = self.stage_splits(batch)
        stretch_all = self.stretch_all

        def at(r):
            return stage_ms if r >= 1.0 else tuple(ms + stretch_all(s, r) for ms, s in zip(stage_ms, splits))

        if self.fixed is not None:
            r = self.fixed
        elif batch.prefill_tokens or not batch.num_decode:
            r = 1.0  # prompt tokens: the highest clock (TTFT)
        else:
            r, hops = 1.0, hops_ms(send_ms, len(stage_ms))
            for level in self.levels:
                if sum(at(level)) + hops <= self.target:
                    r = level
                    break
        return at(r), send_ms, r

    def stage_splits(self, batch: Batch) -> list[list[tuple[float, float]]]:
        """:meth:`splits` of each pipeline stage's slice of ``batch``: the wrapped model's
        ``stage_work_parts`` (speculative decoding: the last stage's target slice and the
        drafter's passes, one after the other), else each stage's ``stage_work`` as one pass."""
        if self._stage_parts is None:
            return [[self.times(*w)] for w in self.stage_work(batch)]
        return [[self.times(*w) for w in parts] for parts in self._stage_parts(batch)]

    def pipeline_ms(self, batch: Batch) -> tuple[tuple[float, ...], float]:
        """The stages' times at the batch's clock and the send (:meth:`pipeline_at`)."""
        stage_ms, send_ms, _ = self.pipeline_at(batch)
        return stage_ms, send_ms


def _stretch(c: float, m: float, r: float, knee: float) -> float:
    """The law: how much longer an iteration of compute ``c`` and memory ``m`` (ms at the highest
    clock) is at clock ratio ``r``, its memory traffic slowing as ``knee / r`` below the knee."""
    mr = m * knee / r if r < knee else m
    return (c / r if c / r > mr else mr) - (c if c > m else m)


def _stretched_run(c0: float, m0: float, c1: float, m1: float, r: float,
                   knee: float) -> tuple[float, float, int | None]:
    """``(stretch at the run's first iteration, its increment, iterations it stays linear)`` over
    a decode run whose first two iterations split as ``(c0, m0)`` and ``(c1, m1)``, at clock
    ``r < 1``: linear while neither ``max`` of the law changes sides (None: for ever). Below the
    knee the memory side is ``m x knee / r``, the same factor at every iteration of the run."""
    s0, s1 = _stretch(c0, m0, r, knee), _stretch(c1, m1, r, knee)
    slow = knee / r if r < knee else 1.0
    sides = [_steps_while_same_side(c0 / r - m0 * slow, (c1 - c0) / r - (m1 - m0) * slow),
             _steps_while_same_side(c0 - m0, (c1 - c0) - (m1 - m0))]
    return s0, s1 - s0, min((h for h in sides if h is not None), default=None)


def _next(batch: Batch) -> Batch:
    from .meter import shifted

    return shifted(batch, 1)


def _steps_while_same_side(x0: float, dx: float) -> int | None:
    """Iterations ``j = 0, 1, ...`` for which ``x0 + j * dx`` keeps the sign it has at ``j = 0``
    (None: for ever)."""
    if dx == 0.0 or (x0 >= 0.0) == (dx > 0.0):
        return None
    return max(1, math.ceil(-x0 / dx))

