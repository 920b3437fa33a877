"""The ``utilisation`` power model: a GPU draws more the busier its bound resources are.

Per GPU, during an iteration that lasts ``d`` ms and (by the cost model's ``work``) reads and
computes on each GPU, phase after phase -- the dense GEMMs, the routed experts, attention
(:mod:`schedlab.energy.work`) -- ``bytes_i`` and ``flops_i``::

    u      = sum over the phases of max(bytes_i / peak bandwidth, flops_i / peak bf16 FLOPS) / d
    power  = idle + (board - idle) x min(1, awake + activity x u)

Each phase is bound by its own resource: a mixed step's prompt GEMMs by compute while its
decodes' attention reads the KV cache, so their times at peak add up (a cost model whose work
has no phases is one phase: ``max`` of its totals). (A W8A8 FP8 checkpoint's GEMM FLOPs count
at the bf16 peak's rate -- about half each where the GPU multiplies them at FP8,
``plugins/cost_models/work.py`` -- so they are not taken for twice the compute they are.)
``board`` is the datasheet's power limit (the GPU throttles to stay under it), ``idle`` its
power with nothing to do; ``awake`` is the share an awake GPU draws with its clocks up and no
kernel running, ``activity`` how fast power climbs with the time the work keeps the GPU's
bound resources busy. Memory-bound decode at small batches draws well below the limit; large
batches and prefill approach it -- unlike a fixed "active" power. The same ``awake`` share is
the standby power after the last iteration (for ``standby_s``), before the GPU drops to idle.

The host's part of a step. Where the cost model splits a step into the GPU's kernels and the
host's work around them (``kernel_ms(batch)``: the roofline and the profiled model do, see
``plugins/cost_models/step_overhead.py``), only the kernels' time ``k`` can reach the board
limit; the host's ``d - k`` draws the awake share. Per GPU, in energy::

    E = idle x d + (board - idle) x min(awake x d + activity x x,  k + awake x (d - k))

with ``x`` the work's time at the peak rates (ms: ``u x d`` above). Below the limit
this is the formula above -- the awake share is paid over the whole step, the work's energy
does not depend on how long it took -- so the split matters only where the kernels alone
would exceed the limit.

With speculative decoding (:mod:`schedlab.drafting`) a step's work and kernels are the target's
and the drafter's passes' together, summed (the module says why a sum serves here).

At an SM clock below the highest (``[clock]``, :mod:`schedlab.energy.clock`) the awake share
scales as ``r v(r)^2`` and the activity as ``1 - core_share + core_share v(r)^2`` (the work's
power on the core's rail falls with the voltage, the memory's does not). Standby is the awake
share at the clock the GPU idles at: a locked clock's, and under the SLO governor the clock of
the last iteration, which it set (as through NVML: the setting stays until the next iteration
changes it) -- :meth:`UtilisationPowerModel.standby_after`, which the meters ask.

Energy is exact over a bulk decode run: the bytes, FLOPs and duration of its iterations are
linear in the step, phase by phase, so each ``max`` and ``min`` cuts the sum into linear pieces,
each an arithmetic series (:meth:`UtilisationPowerModel.run_j`).

The defaults of ``awake`` and ``activity`` are fitted by ``tools/derive_roofline.py`` (its
power section) -- see :data:`DERIVATION`; board limits and clocks are datasheet numbers in the
GPU presets. This is a time-utilisation model, in the spirit of Fan, Weber and Barroso's server
model (power proportional to utilisation above idle, ISCA 2007): each phase is charged the
larger of its memory and compute times, so a phase that saturates both costs what one that
saturates either does. It is not Choi, Bedard, Fowler and Vuduc's energy roofline ("A roofline
model of energy", IPDPS 2013), where energies add even where times overlap: that is the
``additive`` model (:mod:`.additive`).
"""

from __future__ import annotations

import math

import attrs

from schedlab.capacity import Presets
from schedlab.configs import MAX_TENSOR_PARALLEL, float_field, int_field, str_field
from schedlab.energy.clock import clock_power_factor
from schedlab.energy.meter import shifted
from schedlab.energy.work import peak_ms, phases_of
from schedlab.errors import ConfigError
from schedlab.protocols import Batch

from .common import (PowerSettings, board_and_idle, cost_setting, find_clock, find_member, host_fields, host_ranks,
                     resolve_gpu, resolve_tp)

#: What ``python tools/derive_roofline.py power`` printed: least squares in relative power error
#: over the ML.ENERGY v2 Llama-3.1-8B sweeps (A100-SXM4-40GB and H100 SXM, vLLM 0.5.4, chat, max
#: batch 32-1024: 14 points, their measured cycle times as the iterations' durations) and 17 decode
#: seconds of LLMServingSim 2.0's A6000 TP-2 trace (vLLM 0.11.1); RMS relative error 5.2%. Every
#: other sweep and the TP-1 trace are held out (README: Energy).
DERIVATION = {"awake": 0.185, "activity": 1.029}


@attrs.frozen
class GpuPowerSettings(PowerSettings):
    """The GPU, its count and its power limits, as the ``utilisation`` and ``additive`` models take them."""

    gpu: str | None = str_field(None, optional=True, help="GPU preset (default: the cost model's)")
    tensor_parallel: int | None = int_field(None, min=1, max=MAX_TENSOR_PARALLEL, optional=True,
                                            help="GPUs per instance (default: the cost model's)")
    model: str | None = str_field(None, optional=True,
                                  help="model preset, for cost models that do not say an iteration's bytes and "
                                       "FLOPs (default: the cost model's)")
    board_w: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                        help="board power limit per GPU, W (default: the GPU preset's)")
    idle_w: float | None = float_field(None, min=0.0, optional=True,
                                       help="idle power per GPU, W (default: the GPU preset's)")


@attrs.frozen
class UtilisationConfig(GpuPowerSettings):
    """Settings of the ``utilisation`` power model (defaults: GPU presets and :data:`DERIVATION`)."""

    awake: float = float_field(DERIVATION["awake"], min=0.0, max=1.0,
                               help="share of (board - idle) an awake GPU draws with no kernel running")
    activity: float = float_field(DERIVATION["activity"], min=0.0,
                                  help="share of (board - idle) per unit of utilisation of the bound resources")


class UtilisationPowerModel:
    """Power from memory and compute utilisation (see the module docstring).

    :param work: ``work(batch) -> (bytes, flops)`` per GPU, the cost model's view.
    :param clock: the instance's :class:`~schedlab.energy.clock.ClockedCostModel` (its
        ``clock_ratio(batch)`` is the iteration's SM clock over the highest), or None.
    :param kernel: ``kernel(batch) -> ms`` of the GPU's kernels in the step (the rest is the
        host's), or None: the whole step is the kernels'. Over a bulk decode run it must grow
        linearly, as the step does.
    :param host_ranks: the data-parallel ranks sharing the instance's host (each carries its
        share, :func:`.common.host_ranks`).
    """

    def __init__(self, config: UtilisationConfig, gpu, tensor_parallel: int, work, *, clock=None,
                 board_w: float, idle_w: float, idle_source: str = "", kernel=None, host_ranks: int = 1):
        self.config = c = config
        self.gpu = gpu
        self.tp = tensor_parallel
        self._work = work
        self._kernel = kernel
        self._clock = clock
        self._board, self._idle = board_w, idle_w
        self._idle_source = idle_source
        self._delta = board_w - idle_w
        self._bytes_per_ms = gpu.hbm_bandwidth_gbps * 1e6
        self._flops_per_ms = gpu.bf16_tflops * 1e9
        self._awake = c.awake
        #: the rule: None -- each phase's max(memory, compute) time at peak, times ``activity``;
        #: (memory, compute) -- the additive rule's activity-ms per ms of each at peak (:mod:`.additive`)
        self._additive: tuple[float, float] | None = None
        self._activity = getattr(c, "activity", 1.0)
        awake_factor = 1.0
        #: the governor's standby follows the last iteration's clock (None: standby_w always)
        self.standby_after = None
        if clock is not None:
            self._law = (clock.r_min, clock.config.voltage_floor, clock.config.core_share)
            if clock.fixed is not None:  # standby at the locked clock
                awake_factor = clock_power_factor(clock.fixed, *self._law)[0]
            else:  # standby_w: the highest clock's (before any iteration the GPU is fully idle)
                self.standby_after = self._standby_at_clock
        self.idle_w = tensor_parallel * idle_w
        self.standby_w = tensor_parallel * (idle_w + self._delta * min(1.0, self._awake * awake_factor))
        self.standby_ms = c.standby_s * 1e3
        self.tail_ms = c.tail_s * 1e3
        self.host_ranks = host_ranks
        self.host_idle_w, self.host_busy_w, self.pue = c.host_idle_w / host_ranks, c.host_busy_w / host_ranks, c.pue

    # --- PowerModel protocol -----------------------------------------------------------------------
    def iteration_j(self, batch: Batch, duration_ms: float) -> float:
        awake, work = self._factors(batch)
        w = self._work(batch)
        if self._additive is None:
            busy = self._activity * peak_ms(w, self._bytes_per_ms, self._flops_per_ms)
        else:
            busy = self._additive[0] * w[0] / self._bytes_per_ms + self._additive[1] * w[1] / self._flops_per_ms
        g = awake * duration_ms + work * busy
        return self._joules(duration_ms, g, self._cap(batch, duration_ms, awake))

    def run_j(self, batch: Batch, k: int, d0: float, inc: float) -> float:
        """The run's energy in closed form: every term is linear in the step ``j``, so the run
        splits where ``max`` or ``min`` changes sides, and each piece is an arithmetic series."""
        return self.run_j_peak(batch, k, d0, inc)[0]

    def run_j_peak(self, batch: Batch, k: int, d0: float, inc: float) -> tuple[float, float]:
        """:meth:`run_j` and the run's highest power (W). Within each linear piece power is a
        ratio of two linear terms, so monotone: the highest is at some piece's first or last
        iteration.

        The pieces: each phase's memory and compute times are linear in ``j`` and so is the
        kernels' time, so the run first splits where a phase's bound or ``min(kernels, step)``
        changes sides; within those pieces the work's time at peak is linear, and they split
        again where the work's energy meets the cap."""
        awake, work = self._factors(batch)
        w0, w1 = self._work(batch), self._work(shifted(batch, 1))
        p0, p1 = phases_of(w0), phases_of(w1)
        if len(p0) != len(p1):  # (a work whose phases change with the step: its totals, one phase)
            p0, p1 = phases_of(tuple(w0)), phases_of(tuple(w1))
        bw, peak = self._bytes_per_ms, self._flops_per_ms
        lines = [(b0 / bw, (b1 - b0) / bw, f0 / peak, (f1 - f0) / peak) for (b0, f0), (b1, f1) in zip(p0, p1)]
        a = work * self._activity
        additive = self._additive
        if self._kernel is None:
            k0, dk = d0, inc
        else:
            k0 = self._kernel(batch)
            dk = self._kernel(shifted(batch, 1)) - k0

        def busy(j: int) -> float:
            total = 0.0
            for m0, dm, c0, dc in lines:
                m, c = m0 + j * dm, c0 + j * dc
                if additive is None:
                    total += m if m > c else c
                else:  # (linear in j: the max's cuts below only split the run more finely)
                    total += additive[0] * m + additive[1] * c
            return total

        def energy(j: int) -> float:
            d = d0 + j * inc
            kern = k0 + j * dk
            kern = kern if kern < d else d
            return self._joules(d, awake * d + a * busy(j), kern + awake * (d - kern))

        def at(x: float | None, start: int, end: int) -> int | None:
            return None if x is None else min(end, max(start, start + math.ceil(x)))

        cuts = [_crossing(m0 - c0, dm - dc) for m0, dm, c0, dc in lines] + [_crossing(k0 - d0, dk - inc)]
        first = sorted({0, k} | {at(x, 0, k) for x in cuts if x is not None})
        bounds = set(first)
        for s, e in zip(first, first[1:]):
            if e - s < 2:
                continue
            x0 = busy(s)
            dx = busy(s + 1) - x0  # linear within the piece
            for y0, dy in ((k0 + s * dk, dk), (d0 + s * inc, inc)):  # the cap: kernels or step, whichever is less
                cut = at(_crossing((1.0 - awake) * y0 - a * x0, (1.0 - awake) * dy - a * dx), s, e)
                if cut is not None:
                    bounds.add(cut)
        bounds = sorted(bounds)
        total, top = 0.0, 0.0
        for s, e in zip(bounds, bounds[1:]):
            n = e - s
            first_j = energy(s)
            total += n * first_j + ((energy(s + 1) - first_j) * (n * (n - 1) // 2) if n > 1 else 0.0)
            for j, ej in ((s, first_j), (e - 1, energy(e - 1))):
                power = ej / (d0 + j * inc)
                if power > top:
                    top = power
        return total, top * 1e3

    def _standby_at_clock(self, batch: Batch) -> float:
        """``standby_after(batch)``: the standby power (W, all the instance's GPUs) after an
        iteration of ``batch`` under the SLO governor -- the awake share at the clock that
        iteration ran at, where the GPU stays until the next one."""
        return self.tp * (self._idle + self._delta * min(1.0, self._factors(batch)[0]))

    # --- parts ---------------------------------------------------------------------------------------
    def _factors(self, batch: Batch) -> tuple[float, float]:
        """``(awake share, activity factor)`` at the clock the iteration runs at."""
        if self._clock is None:
            return self._awake, 1.0
        awake, work = clock_power_factor(self._clock.clock_ratio(batch), *self._law)
        return self._awake * awake, work

    def _cap(self, batch: Batch, d: float, awake: float) -> float:
        """The most activity-ms a step of ``d`` ms can hold: the board limit over the kernels'
        time, the awake share over the host's."""
        if self._kernel is None:
            return d
        k = self._kernel(batch)
        return d if k >= d else k + awake * (d - k)

    def _joules(self, d: float, g: float, cap: float) -> float:
        """Energy of ``d`` ms at activity ``g`` (activity-ms) held to ``cap``, all GPUs of the instance."""
        return self.tp * (self._idle * d + self._delta * (g if g < cap else cap)) * 1e-3

    def describe(self) -> dict:
        c = self.config
        return {"kind": "utilisation", "gpu": self.gpu.name, "tensor_parallel": self.tp, "board_w": self._board,
                "idle_w": self._idle, "idle_source": self._idle_source, "awake": c.awake, "activity": c.activity,
                "standby_s": c.standby_s, **host_fields(c, self.host_ranks)}


def _crossing(x0: float, dx: float) -> float | None:
    """The step where ``x0 + j * dx`` crosses 0 (None when it never does)."""
    if dx == 0.0:
        return None
    j = -x0 / dx
    return j if 0.0 < j < math.inf else None  # (a vanishing dx: never within a run)


def build_utilisation(config: UtilisationConfig, presets: Presets | None = None, cost_model=None,
                      tensor_parallel: int | None = None) -> UtilisationPowerModel:
    """Factory: the GPU and degree from the power table or the cost model; the work view from
    the cost model, or from a roofline of the model preset when the cost model has none."""
    gpu = resolve_gpu(config.gpu, cost_model, presets, "utilisation")
    tp = resolve_tp(config.tensor_parallel, cost_model, tensor_parallel)
    unsaid = find_member(cost_model, "unsaid_work")  # speculative decoding's drafter says no work
    if unsaid:
        raise ConfigError(f"the utilisation power model needs the bytes and FLOPs of each iteration: {unsaid}")
    work = find_member(cost_model, "work")
    if work is None:
        name = config.model or cost_setting(cost_model, "model")
        if name is None or presets is None:
            raise ConfigError("the utilisation power model needs the bytes and FLOPs of each iteration: use a cost "
                              "model that says them (roofline), or set model = \"...\" in [power]")
        from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel

        work = RooflineCostModel(presets.model(name), gpu,
                                 RooflineConfig(model=name, gpu=gpu.name, tensor_parallel=tp)).work
        drafting = find_member(cost_model, "work_with")  # the target's, with the drafter's passes
        if drafting is not None:
            work = drafting(work)
    board, idle, source = board_and_idle(gpu, config.board_w, config.idle_w, "utilisation")
    return UtilisationPowerModel(config, gpu, tp, work, clock=find_clock(cost_model), kernel=find_member(
        cost_model, "kernel_ms"), board_w=board, idle_w=idle, idle_source=source,
        host_ranks=host_ranks(cost_model, config))
