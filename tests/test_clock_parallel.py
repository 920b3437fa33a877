"""The SM clock (``[clock]``) with data-parallel layouts (schedlab.energy.clock, schedlab.engine.lockstep).

Ranks stepping together (a MoE model with ``[cluster] data_parallel``) step at one clock: each
rank's own part and the experts of every rank's tokens are timed by the law on their own work
split (compute ``c / r``, memory ``m`` unchanged: ``+ max(c / r, m) - max(c, m)``), the fixed
clock every rank's, the governor's chosen from the whole step. Checked here: a step at a fixed
half clock and a governed step, by hand (time and energy, the power law evaluated in the test);
both engines against each other with conservation on random workloads (the linear prices and
the roofline, fixed clocks and the governor); a dense model's independent ranks; the TOML path
and what is refused (a cost model that does not split a rank's work). Pipelines at a clock:
``test_pipeline_energy.py``.

The hand-computed cases use ``test_data_parallel_energy.py``'s ranks (0.5 ms per prompt token,
8 ms a decode step; experts 1 ms + 0.0625 ms per token of all ranks + 0.125 ms per token of the
largest rank; the work at :class:`ParallelPrices`) on its GPU (1,000 GB/s, 100 TFLOPS, 40 W idle,
400 W board, clocks 200-2,000 MHz), the clock's efficiencies set to 1 so that its split is the
work at the peak rates: ``c = flops / 1e11``, ``m = bytes / 1e9`` ms.
"""

from __future__ import annotations

import math
import textwrap

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.energy.clock import ClockConfig, ClockedCostModel
from schedlab.engine.rank_cost import DUMMY, ClockedRankCost, RankCost, rank_view
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.protocols import Batch
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import (blocks_for_largest, check_energy, compare_runs, dyadic_linear_costs, examples,
                              fast_run_agreeing_with_reference, requests_lists)
from schedlab.testing.parallel import LinearParallelCost, run_data_parallel
from schedlab.parallelism import Parallelism
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.power import UtilisationConfig, UtilisationPowerModel
from schedlab_plugins.power.common import find_clock
from schedlab_plugins.power.utilisation import build_utilisation
from schedlab_plugins.routers import RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from test_data_parallel import BASE, ROUTERS, by_id, fresh_router, schedulers
from test_data_parallel_energy import GPU, PRESETS, metered_runs_agreeing, same_energy

ENGINES = ("fast", "reference")
#: a GPU preset with a clock range (the RTX PRO 6000 server preset has no highest clock)
H100 = "h100-80gb"
#: voltage 0.55 at 200 MHz; 80% of the work's power on the core rail; the knee at the lowest
#: clock (none: memory traffic never slows -- these tests are of how steps, ranks and stages are
#: clocked, not of the knee, which tests/test_energy.py checks by hand)
LAW = dict(compute_efficiency=1.0, bandwidth_efficiency=1.0, voltage_floor=0.55, core_share=0.8, knee_mhz=200.0)


class WorkingCost(LinearParallelCost):
    """:class:`LinearParallelCost` saying an iteration's whole work too (a clock asks ``work``)."""

    def work(self, batch):
        own = self.rank_work(batch)
        if not batch.num_batched_tokens:
            return own
        experts = self.experts_work((batch.num_batched_tokens,))
        return own[0] + experts[0], own[1] + experts[1]


def clocked(linear: LinearConfig | None = None, **clock) -> ClockedCostModel:
    inner = WorkingCost(LinearCostModel(linear or LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)))
    return ClockedCostModel(inner, GPU, ClockConfig(**{**LAW, **clock}))


def ranks_at(linear: LinearConfig | None = None, **clock):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                         allocation="grow", chunked_prefill=True))
        return scheduler, clocked(linear, **clock), PagedKVCache(64, 16)
    return make


def utilisation(standby_s: float = 0.0, tail_s: float = 0.0):
    """The utilisation model on :data:`GPU` (awake 0.2, activity 1), finding the clock where a run
    does: among the layers of what the rank sees."""
    config = UtilisationConfig(awake=0.2, activity=1.0, standby_s=standby_s, tail_s=tail_s)
    return lambda cost: UtilisationPowerModel(config, GPU, 1, cost.work, clock=find_clock(cost),
                                              kernel=cost.kernel_ms, board_w=400.0, idle_w=40.0)


def factors(r: float) -> tuple[float, float]:
    """The law's ``(awake, work)`` power factors at clock ratio ``r`` (:data:`LAW`, 200-2,000 MHz)."""
    v = 1.0 if r >= 1.0 else 0.55 + 0.45 * (r - 0.1) / 0.9
    return r * v * v, 0.2 + 0.8 * v * v


def step_j(d: float, bytes_: float, flops: float, kernels: float, r: float, phases=None) -> float:
    """A step's joules on :data:`GPU` at clock ``r``: ``(40 d + 360 min(g, k + a (d - k))) / 1000``
    with the awake share ``a = 0.2 x awake(r)`` and ``g = a d + work(r) x``: ``x = max(m, c)`` of
    the totals, or summed over ``phases`` (``(bytes, flops)`` pairs) where they are bound apart."""
    awake, work = factors(r)
    a = 0.2 * awake
    x = sum(max(b / 1e9, f / 1e11) for b, f in phases) if phases else max(bytes_ / 1e9, flops / 1e11)
    g = a * d + work * x
    return (40 * d + 360 * min(g, kernels + a * (d - kernels))) / 1000


def test_the_power_factors_of_the_test_law_by_hand():
    # at 1000 MHz: v = 0.55 + 0.45 x 800 / 1800 = 0.75, v^2 = 0.5625; awake 0.5 x 0.5625, work 0.2 + 0.8 x 0.5625
    assert factors(0.5) == pytest.approx((0.28125, 0.65), rel=1e-15)
    assert step_j(20.9125, 4.45e9, 8.85e11, 20.9125, 0.5) == pytest.approx(3.330878125, rel=1e-12)


# -- hand-computed steps -----------------------------------------------------------------------------------


def one_prompt_on_two_ranks(make, engine: str, power=None):
    """Request 0 (prompt 16, 2 tokens) on rank 0 of two ranks stepping together (rank 1 runs the
    dummy), each rank from ``make``."""
    return run_data_parallel([Request(0, 0.0, 16, 2)], make, 2, RoundRobinRouter(), engine=engine, power=power)


def assert_two_steps(r, steps: tuple[float, float], experts: tuple[float, float]) -> None:
    """The prompt's step and the decode's, as :func:`one_prompt_on_two_ranks` ran them: their
    times (the first token at the first's end) and their experts' times."""
    assert by_id(r, "first_token_ms")[0] == pytest.approx(steps[0], rel=1e-12)
    assert by_id(r, "finish_ms")[0] == pytest.approx(sum(steps), rel=1e-12)
    assert r.meta["data_parallel"]["experts_ms"] == pytest.approx(sum(experts), rel=1e-12)


def test_a_ranks_view_at_a_clock_stretches_its_own_kernels_and_tells_the_steps_clock():
    view = rank_view(clocked(mhz=1000.0))
    assert isinstance(view, ClockedRankCost) and find_clock(view) is view
    assert type(rank_view(WorkingCost(LinearCostModel(LinearConfig())))) is RankCost  # no clock: no clock_ratio
    view.ratio, view.experts_ms = 0.5, 4.9125
    # a prefill of 16 tokens: c = 8 ms, m = 3.6 ms -> 8 more at half clock; the dummy (c 0.5, m 2.11) none
    assert view.kernel_ms(Batch(num_prefill=1, prefill_tokens=16)) == pytest.approx(8 + 8 + 4.9125)
    view.dummy = True
    assert view.kernel_ms(Batch()) == pytest.approx(8 + 4.9125)
    assert view.clock_ratio(Batch()) == 0.5 and view.r_min == pytest.approx(0.1) and view.fixed == 0.5


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lockstep_step_at_a_fixed_half_clock_by_hand(engine):
    # Request 0 (prompt 16, 2 tokens) on rank 0; rank 1 runs the dummy (a decode over 1 token). At
    # 1000 of 2000 MHz (r = 0.5) each part grows by max(c / r, m) - max(c, m):
    # Step 1: rank 0 prefills 16: 8 ms; c = 16 x 5e10 / 1e11 = 8, m = (2e9 + 16e8) / 1e9 = 3.6 -> +8: 16
    #   rank 1's dummy: 8 ms; c = 0.5, m = 2.11 -> memory-bound even at half clock: 8
    #   experts of (16, 1): 1 + 0.0625 x 17 + 0.125 x 16 = 4.0625; each GPU's share 8.5 tokens:
    #   c = m = 0.85 -> +0.85: 4.9125. The step: 16 + 4.9125 = 20.9125 (12.0625 at full clock)
    # Step 2: rank 0 decodes over 17 tokens (c 0.5, m 2.27) and rank 1's dummy: 8 each; experts of
    #   (1, 1): 1.25, c = m = 0.1 -> +0.1: 1.35. The step: 9.35.
    r = one_prompt_on_two_ranks(ranks_at(mhz=1000.0), engine, utilisation())
    assert_two_steps(r, (20.9125, 9.35), (4.9125, 1.35))
    # Energy at r = 0.5: the work of test_data_parallel_energy's dummy case, the kernels stretched
    # as the parts: rank 0's run the whole step; rank 1's the dummy's 8 and the experts' 4.9125 of
    # step 1 (it waits 8 ms for rank 0), the whole of step 2.
    rank0 = step_j(20.9125, 4.45e9, 8.85e11, 20.9125, 0.5) + step_j(9.35, 2.37e9, 6e10, 9.35, 0.5)
    rank1 = step_j(20.9125, 2.96e9, 1.35e11, 8 + 4.9125, 0.5) + step_j(9.35, 2.21e9, 6e10, 9.35, 0.5)
    ranks = r.meta["energy"]["instances"]
    assert [i["busy_j"] for i in ranks] == pytest.approx([rank0, rank1], rel=1e-12)
    assert ranks[1]["dummy_j"] == pytest.approx(rank1, rel=1e-12)
    assert by_id(r, "energy_j")[0] == pytest.approx(rank0, rel=1e-12)
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_governor_clocks_a_lockstep_step_from_the_whole_step(engine):
    # Levels 450 MHz apart: r = 0.1, 0.325, 0.55, 0.775, 1; the target 9.4 ms (headroom 1).
    # Step 1 has prompt tokens: full clock, 12.0625 ms. Step 2 (the decode over 17 and the dummy):
    #   r = 0.1:   rank 0 +(5 - 2.27), the experts +(1 - 0.1): 8 + 2.73 + 1.25 + 0.9 = 12.88 > 9.4
    #   r = 0.325: the ranks' parts stay 8 (0.5 / 0.325 < 2.11), but the experts take
    #              0.1 / 0.325 - 0.1 more: 9.4577 > 9.4 -- the parts alone would have allowed it
    #   r = 0.55:  8 + 1.25 + 0.1 / 0.55 - 0.1 = 9.3318 <= 9.4: this level, for every rank
    r = run_data_parallel([Request(0, 0.0, 16, 2)], ranks_at(policy="slo", tpot_ms=9.4, headroom=1.0, step_mhz=450.0),
                          2, RoundRobinRouter(), engine=engine, power=utilisation())
    second = 8 + 1.25 + 0.1 / 0.55 - 0.1
    assert by_id(r, "first_token_ms")[0] == pytest.approx(12.0625, rel=1e-12)
    assert by_id(r, "finish_ms")[0] == pytest.approx(12.0625 + second, rel=1e-12)
    rank0 = step_j(12.0625, 4.45e9, 8.85e11, 12.0625, 1.0) + step_j(second, 2.37e9, 6e10, second, 0.55)
    rank1 = step_j(12.0625, 2.96e9, 1.35e11, 12.0625, 1.0) + step_j(second, 2.21e9, 6e10, second, 0.55)
    assert [i["busy_j"] for i in r.meta["energy"]["instances"]] == pytest.approx([rank0, rank1], rel=1e-12)
    check_energy(r)


def test_a_fixed_clock_lets_the_fast_engine_run_decode_steps_in_bulk():
    # Two long decodes, one a rank, at 300 of 2000 MHz where a decode's compute (c = 0.5 / 0.15 =
    # 3.33 ms) outlasts its memory at first (m = 2.1 + 0.01 x context ms) and not from a context of
    # 124 on: the law's max changes sides within the run, a rank's part growing by 0.02 - 0.01 ms a
    # step before and 0.02 after (8 ms + 0.02 per context token at the full clock). The fast engine
    # runs the pieces in bulk and agrees with the reference, which steps one at a time.
    requests = [Request(0, 0.0, 16, 120), Request(1, 0.0, 16, 120)]
    linear = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0, per_context_token_ms=0.02)
    runs = [run_data_parallel(requests, ranks_at(linear, mhz=300.0), 2, RoundRobinRouter(), engine=engine,
                              power=utilisation(0.02, 0.01)) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    same_energy(*runs)
    fast = runs[0]
    assert fast.meta["events"] < fast.meta["data_parallel"]["steps"]  # bulk runs: fewer events than steps
    for run in runs:
        check_energy(run)


def off_the_grid(requests: list) -> list:
    """``requests`` with their arrivals moved off the 1/8-ms grid by a fixed 3.14 ns. A clock's
    iteration times are not dyadic, so the engines add them with different roundings (the fast
    engine's closed form for a run, the reference's step-by-step sum): an arrival exactly at a
    step's end is at it in one engine and an ulp after it in the other, and each then admits it
    one step apart, both rightly. Hypothesis found one (a step ending at 98.25 ms at 500 MHz)."""
    return [attrs.evolve(r, arrival_ms=r.arrival_ms + math.pi * 1e-6) for r in requests]


# -- both engines, conservation ----------------------------------------------------------------------------

SETTINGS = settings(max_examples=examples(50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLOCKS = st.one_of(st.sampled_from([200.0, 500.0, 1000.0, 1500.0, 2000.0]).map(lambda mhz: {"mhz": mhz}),
                   st.sampled_from([6.0, 9.4, 12.0, 20.0]).map(lambda t: {"policy": "slo", "tpot_ms": t,
                                                                          "step_mhz": 300.0}))


@SETTINGS
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=80, all_at_zero=False, priorities=True),
       schedulers(), st.integers(2, 3), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 40),
       CLOCKS, st.sampled_from([0.0, 0.02]))
def test_clocked_lockstep_agrees_between_engines_and_conserves_energy(requests, cfg, ranks, router, cost, spare,
                                                                      clock, standby_s):
    """Fixed clocks and the governor, idle ranks on the dummy, ranks that only swap: both engines
    step at the same clocks, draw the same energy per rank, and conserve it."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        kv = PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), clocked(cost, **clock), kv

    metered_runs_agreeing(off_the_grid(requests), make, ranks, ROUTERS[router], utilisation(standby_s, 0.005))


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=400, max_output=200, all_at_zero=False), schedulers(),
       st.integers(2, 3), st.integers(0, 20),
       st.one_of(st.sampled_from([600.0, 1200.0]).map(lambda mhz: {"mhz": mhz}),
                 st.sampled_from([15.0, 30.0]).map(lambda t: {"policy": "slo", "tpot_ms": t})))
def test_clocked_roofline_lockstep_agrees_between_engines_and_conserves_energy(requests, cfg, ranks, spare, clock):
    """The roofline's ranks (Qwen3-30B-A3B) at a clock, metered by the utilisation model as a run
    builds it (its factory finding the clock in the rank's view)."""
    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // 16) for r in requests)
    gpu = PRESETS.gpu(H100)

    def make():
        roofline = RooflineCostModel(PRESETS.model("qwen3-30b-a3b"), gpu,
                                     RooflineConfig(model="qwen3-30b-a3b", gpu=H100),
                                     parallelism=Parallelism(data_parallel=ranks, expert_parallel=True))
        cost = ClockedCostModel(roofline, gpu, ClockConfig(**clock))
        return ContinuousScheduler(cfg), cost, PagedKVCache(need + spare, 16, swap_blocks=64,
                                                             bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)

    def power(cost):
        return build_utilisation(UtilisationConfig(standby_s=0.05), PRESETS, cost)

    metered_runs_agreeing(off_the_grid(requests), make, ranks, fresh_router, power)


# -- TOML ---------------------------------------------------------------------------------------------------

MOE = """
    [power]
    kind = "utilisation"
    [slo]
    tpot_ms = 60
    [cluster]
    data_parallel = 2
    expert_parallel = true
"""


def on_h100(text: str) -> str:
    """An experiment of test_data_parallel.py on H100s (a clock range), keeping a timeline."""
    return text.replace("rtx-pro-6000-server", H100).replace('name = "dp"', 'name = "dp"\ntimeline = true')


def _write(tmp_path, text: str, name: str = "exp.toml"):
    """BASE (Qwen3-30B-A3B) on H100s, with a timeline, and ``text``."""
    base = textwrap.dedent(on_h100(BASE))
    path = tmp_path / name
    path.write_text(base + textwrap.dedent(text))
    return path


def first_ttft(run) -> float:
    """The first arrival's TTFT (its prompt alone in the first step)."""
    req = run.requests
    first = req["arrival_ms"].argmin()
    return float(req["first_token_ms"][first] - req["arrival_ms"][first])


@pytest.mark.parametrize("clock", ['mhz = 1200', 'policy = "slo"'])
def test_lockstep_ranks_with_a_clock_in_toml_run_in_both_engines(tmp_path, clock):
    """The assembly puts each rank's roofline at the clock, its view a ClockedRankCost, and the
    power model finds the clock there: slower prefill, less energy than at the full clock."""
    clocked_run = fast_run_agreeing_with_reference(_write(tmp_path, MOE + f"[clock]\n{clock}\n"))
    full = fast_run_agreeing_with_reference(_write(tmp_path, MOE, "full.toml"))
    check_energy(clocked_run)
    assert clocked_run.metrics["energy"]["gpu_j"] < full.metrics["energy"]["gpu_j"]
    if clock.startswith("mhz"):  # a locked clock slows the compute-bound prompts: the first, alone, is later
        assert first_ttft(clocked_run) > first_ttft(full)
    else:  # the governor keeps prompt steps at the full clock and lowers decode steps, memory-bound
        # here, to clocks at which they do not slow: every token as at the full clock, for less energy
        for column in ("first_token_ms", "finish_ms"):
            assert clocked_run.requests[column] == pytest.approx(full.requests[column], rel=1e-12)


@pytest.mark.parametrize("clock", ['mhz = 900', 'policy = "slo"'])
def test_a_dense_models_ranks_take_a_clock_as_instances_behind_the_balancer(tmp_path, clock):
    """Independent ranks: each an instance at the clock, drawing what instances behind vLLM's DP
    balancer draw; both engines agree and the energy is conserved."""
    text = (on_h100(BASE.replace("qwen3-30b-a3b", "llama-3.1-8b"))
            + f'[power]\nkind = "utilisation"\n[slo]\ntpot_ms = 30\n[clock]\n{clock}\n')
    path = tmp_path / "dense.toml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent("""
        [[runs]]
        name = "dp"
        cluster = {data_parallel = 2}
        [[runs]]
        name = "dp-reference"
        engine = "reference"
        cluster = {data_parallel = 2}
        [[runs]]
        name = "instances"
        cluster = {instances = 2, router = {kind = "vllm_dp"}}
    """))
    runs = {r.name: r for r in run_experiment(load(path)).all_runs()}
    dp, ref, instances = runs["dp"], runs["dp-reference"], runs["instances"]
    compare_runs(dp, ref, rel=1e-9)
    assert "data_parallel" not in dp.meta
    assert dp.requests["finish_ms"].tolist() == instances.requests["finish_ms"].tolist()
    assert dp.metrics["energy"]["gpu_j"] == pytest.approx(instances.metrics["energy"]["gpu_j"], rel=1e-12)
    check_energy(dp)


def test_a_dense_models_ranks_at_a_clock_differ_from_the_full_clock(tmp_path):
    """The clock reaches independent ranks (a locked half clock slows prefill, saves energy)."""
    base = (BASE.replace("qwen3-30b-a3b", "llama-3.1-8b").replace("rtx-pro-6000-server", H100)
            + '[power]\nkind = "utilisation"\n[cluster]\ndata_parallel = 2\n')
    runs = {}
    for name, extra in (("full", ""), ("half", "[clock]\nmhz = 1000\n")):
        path = tmp_path / f"{name}.toml"
        path.write_text(textwrap.dedent(base) + extra)
        runs[name] = run_experiment(load(path)).all_runs()[0]
    assert first_ttft(runs["half"]) > first_ttft(runs["full"])
    assert runs["half"].metrics["energy"]["gpu_j"] < runs["full"].metrics["energy"]["gpu_j"]


def test_a_clock_is_refused_for_cost_models_that_do_not_split_a_ranks_work(tmp_path, monkeypatch):
    """(Pipelines, once refused here, take a clock: ``test_pipeline_energy.py``.)"""
    from schedlab_plugins.cost_models import RooflineCostModel

    lockstep = _write(tmp_path, '[clock]\nmhz = 1200\n[cluster]\ndata_parallel = 2\n', "lockstep.toml")
    load(lockstep)
    monkeypatch.delattr(RooflineCostModel, "experts_work")
    with pytest.raises(ConfigError, match=r"lockstep\.toml.*\[clock\]: RooflineCostModel does not say the work of "
                                          r"data-parallel ranks stepping together"):
        load(lockstep)
