"""Energy (``[power]``) and the SM clock (``[clock]``) of pipelined instances that speculate
(:mod:`schedlab.drafting`, :mod:`schedlab.energy.clock`, :mod:`schedlab.engine.stage_cost`).

vLLM builds the drafter on the last pipeline stage, so its passes are the last stage's work and
kernels: ``stage_work`` adds every pass's work to the last stage's share, ``stage_kernel_ms``
its passes' kernels (``proposer_ms`` is the host's), and the clock stretches the last stage's
target slice and each drafter pass on its own split (``stage_work_parts``). Checked here: the
split by hand, a stage's joules and clock by hand, two pipelined runs by hand in both engines
(at the full clock and at half), both engines against each other with conservation on random
workloads (linear prices and the roofline), the TOML, and the refusal of a drafter that says no
work.

The hand-computed runs are ``test_pipeline_speculative.py``'s EAGLE case (2 stages, each half
the ``linear`` model's iteration; the drafter 0.25 ms a token and 1 ms a decode step, k = 2,
every draft rejected) metered as ``test_pipeline_energy.py`` meters (:func:`slice_j`: no
``kernel_ms``, so a slice's kernels run all of it), the drafter's work at :data:`DRAFT_WORK`.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from schedlab.drafting import DraftingCostModel
from schedlab.energy.clock import ClockConfig, ClockedCostModel
from schedlab.engine.stage_cost import StageCost, stage_kernels, stage_view
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.parallelism import Parallelism
from schedlab.protocols import Batch
from schedlab.speculative import SpeculativeConfig, budget_problem
from schedlab.study.experiment import load
from schedlab.testing import (check_energy, check_run, dyadic_linear_costs, examples,
                              fast_run_agreeing_with_reference, requests_lists)
from schedlab.testing.parallel import LinearParallelCost, ParallelPrices, run_pipelined
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.power import UtilisationConfig
from schedlab_plugins.power.utilisation import build_utilisation
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from test_clock_parallel import LAW
from test_data_parallel import SPECULATIVE
from test_data_parallel_energy import GPU, PRESETS
from test_data_parallel_speculative import blocks_with_drafts, drafter_of
from test_pipeline_energy import metered_pipelines_agreeing, slice_j, utilisation
from test_pipeline_parallel import BASE, ROUTERS, schedulers
from test_pipeline_speculative import DRAFTER, by_id, instance
from test_speculative_differential import speculative_configs
from test_speculative_energy import STEP, Priced, drafting

ENGINES = ("fast", "reference")
#: the hand-computed runs' drafter's work on one GPU: 5e8 bytes of weights and 1e6 a context
#: token, 1e10 FLOPs a token
DRAFT_WORK = ParallelPrices(rank_bytes=5e8, bytes_per_token=0.0, bytes_per_context_token=1e6, flops_per_token=1e10)
EAGLE = SpeculativeConfig(method="eagle", num_speculative_tokens=2, acceptance_rate=0.0, draft={"kind": "linear"})


class PricedStages(Priced):
    """:class:`Priced` over 2 stages: the host's share on the first, the kernels and the work
    halved, a send of 0.25 ms."""

    def pipeline_ms(self, batch: Batch):
        half = self.kernel_ms(batch) / 2
        return (self.prices[2] + half, half), 0.25

    def stage_work(self, batch: Batch):
        byt, flops = self.work(batch)
        return ((byt / 2, flops / 2),) * 2


def staged(proposer_ms: float = 0.5) -> DraftingCostModel:
    """``test_speculative_energy.drafting``'s target over 2 stages, with its drafter (k = 2)."""
    cost = drafting(proposer_ms)
    return DraftingCostModel(PricedStages(*cost.target.prices), cost.drafter, cost.config)


# -- by hand -----------------------------------------------------------------------------------------------


def test_the_drafters_work_and_kernels_are_the_last_stages_by_hand():
    # STEP (2 decodes, 6 tokens, context 200). The target: kernels 4 ms, host 2: stages (2 + 2, 2);
    # work (2.8e9, 6e10), halved. The drafter's passes (test_speculative_energy): kernels 2 and
    # 1 ms, work (7e8, 6e10) and (7.02e8, 2e10); proposer_ms 0.5 on the last stage.
    cost = staged()
    assert cost.pipeline_ms(STEP) == ((4.0, 5.5), 0.25)
    assert [w for stage in cost.stage_work(STEP) for w in stage] == pytest.approx(
        [1.4e9, 3e10, 1.4e9 + 7e8 + 7.02e8, 3e10 + 6e10 + 2e10])
    parts = cost.stage_work_parts(STEP)
    assert [len(p) for p in parts] == [1, 3]
    assert [w for part in parts for pass_ in part for w in pass_] == pytest.approx(
        [1.4e9, 3e10, 1.4e9, 3e10, 7e8, 6e10, 7.02e8, 2e10])
    # the stages' work adds up to the colocated step's
    assert [sum(w) for w in zip(*cost.stage_work(STEP))] == pytest.approx(list(cost.work(STEP)))
    # kernels: the first stage less the target's host (2), the last with the passes' (3), not
    # proposer_ms (the step less its kernels would say a host of 2.5, off the first stage)
    assert stage_kernels(cost, STEP) == pytest.approx((2.0, 5.0))
    view = StageCost(cost)
    view.stage = 1
    assert view.work(STEP) == pytest.approx((2.802e9, 1.1e11)) and view.kernel_ms(STEP) == pytest.approx(5.0)


def test_a_last_stages_joules_count_the_drafters_passes_by_hand():
    # The utilisation model (awake 0.2, activity 1) on each stage's slice of STEP:
    #   stage 0, 4 ms, kernels 2, 1.4 ms of memory: g = 0.8 + 1.4 = 2.2 below 2 + 0.2 x 2
    #   stage 1, 5.5 ms, kernels 5, 2.802 ms of memory (1.1 of compute): g = 1.1 + 2.802 = 3.902
    #     below 5 + 0.2 x 0.5 (the target's slice alone: 1.1 + 1.4 = 2.5)
    view = stage_view(staged())
    power = utilisation()(view)
    view.stage = 0
    assert power.iteration_j(STEP, 4.0) == pytest.approx((160 + 360 * 2.2) / 1000)
    view.stage = 1
    assert power.iteration_j(STEP, 5.5) == pytest.approx((220 + 360 * 3.902) / 1000)


def test_a_half_clock_stretches_the_last_stages_passes_each_on_its_own_split_by_hand():
    # r = 0.5: stage 0 (c 0.3, m 1.4) and the target's last slice stay memory-bound; the first
    # draft pass (c 0.6 -> 1.2, m 0.7) gains 0.5; the second (c 0.2 -> 0.4, m 0.702) nothing.
    # The last stage's summed work (c 1.1 -> 2.2, m 2.802) would not have slowed at all.
    clock = ClockedCostModel(staged(), GPU, ClockConfig(mhz=1000.0, **LAW))
    stage_ms, send_ms, r = clock.pipeline_at(STEP)
    assert r == 0.5 and send_ms == 0.25 and stage_ms == pytest.approx((4.0, 6.0))
    view = stage_view(clock)
    view.ratio, view.stage = 0.5, 1
    assert view.kernel_ms(STEP) == pytest.approx(5.5)
    view.stage = 0
    assert view.kernel_ms(STEP) == pytest.approx(2.0)


def test_the_governor_clocks_a_batch_from_its_last_stages_passes_by_hand():
    # Levels 200, 1,100, 2,000 MHz (r = 0.1, 0.55, 1); the trip is both stages and one send:
    # 9.75 ms at the full clock. At 0.55 the first draft pass computes 0.6 / 0.55 = 1.0909 ms
    # against 0.7 of memory: 9.75 + 0.3909 (the summed work, 2 ms against 2.802, would stay 9.75).
    def governed(tpot):
        return ClockedCostModel(staged(), GPU, ClockConfig(policy="slo", tpot_ms=tpot, headroom=1.0, step_mhz=900.0,
                                                           **LAW))

    stage_ms, _, r = governed(10.2).pipeline_at(STEP)
    assert r == 0.55 and stage_ms == pytest.approx((4.0, 5.5 + 0.6 / 0.55 - 0.7))
    assert governed(10.1).pipeline_at(STEP)[2] == 1.0


#: the last stage's work in step A, phase by phase: the target's slice, then the drafter's two passes
A_LAST = ((1.4e9, 2e11), (5e8, 8e10), (5.09e8, 1e10))


def eagle_run(engine: str, clock=None):
    """r0 (prompt 8, 3 tokens) through 2 stages with the EAGLE drafter on the last, metered."""
    return run_pipelined([Request(0, 0.0, 8, 3)], instance(block_size=4), 2, engine=engine, speculative=EAGLE,
                         draft_cost=LinearParallelCost(LinearCostModel(DRAFTER), DRAFT_WORK, moe=False),
                         power=utilisation(), clock=clock)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_speculating_pipelines_stages_draw_for_the_drafter_on_the_last_by_hand(engine):
    # Times (test_pipeline_speculative): A, the prompt: stage 0 0-2, stage 1 2.75-7.75 (2 + the
    # drafter's 2 + 1); B, a decode verifying 2 drafts (context 11): stage 0 7.75-12.25, stage 1
    # 12.6875-19.6875 (4.5 + 1.5 + 1); C (context 12): 19.6875-24.1875, 24.625-31.625.
    # The target's work (ParallelPrices: 2e9 bytes, 1e8 a token, 1e7 a context token; 5e10 FLOPs a
    # token), half a stage: A (1.4e9, 2e11), B (1.205e9, 7.5e10), C (1.21e9, 7.5e10).
    # The drafter's passes (DRAFT_WORK): A's over 8 tokens (5e8, 8e10) and one of a token at
    # context 9 (5.09e8, 1e10); B's over 3 tokens at context 11 (5.11e8, 3e10), then context 12
    # (5.12e8, 1e10); C's (5.12e8, 3e10), (5.13e8, 1e10).
    r = eagle_run(engine)
    assert by_id(r, "first_token_ms") == {0: 7.75} and by_id(r, "finish_ms") == {0: 31.625}
    first = [slice_j(2, 1.4e9, 2e11), slice_j(4.5, 1.205e9, 7.5e10), slice_j(4.5, 1.21e9, 7.5e10)]
    last = [slice_j(5, 2.409e9, 2.9e11, phases=A_LAST), slice_j(7, 2.228e9, 1.15e11), slice_j(7, 2.235e9, 1.15e11)]
    # (40 d + 360 min(0.2 d + x, d)) / 1000: A's first slice at the limit, the rest below. A's last
    # slice: the target's compute-bound 2 ms, the passes' 0.8 (compute) and 0.509 (memory) -- x =
    # 3.309, where the max of its totals would say 2.9; B's and C's are memory-bound throughout.
    assert first == pytest.approx([0.8, (180 + 360 * 2.105) / 1000, (180 + 360 * 2.11) / 1000], rel=1e-12)
    assert last == pytest.approx([(200 + 360 * 4.309) / 1000, (280 + 360 * 3.628) / 1000,
                                  (280 + 360 * 3.635) / 1000], rel=1e-12)
    inst = r.meta["energy"]["instances"][0]
    assert [s["busy_j"] for s in inst["stages"]] == pytest.approx([sum(first), sum(last)], rel=1e-12)
    assert [s["busy_ms"] for s in inst["stages"]] == [11.0, 19.0]
    assert inst["idle_j"] == pytest.approx(0.04 * (31.625 - 11 + 31.625 - 19), rel=1e-12)
    assert by_id(r, "energy_j")[0] == pytest.approx(sum(first) + sum(last), rel=1e-12)
    # the target's last slices alone drew less: the drafter's work is counted
    assert sum(last) > sum([slice_j(5, 1.4e9, 2e11), slice_j(7, 1.205e9, 7.5e10), slice_j(7, 1.21e9, 7.5e10)]) + 0.4
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_half_clock_stretches_a_speculating_pipelines_last_stage_pass_by_pass_by_hand(engine):
    # r = 0.5: each (c, m) of the runs above stretched by max(c / r, m) - max(c, m):
    #   A: stage 0 (2, 1.4): +2 -> 4; stage 1 the target +2, the passes (0.8, 0.5) +0.8 and
    #      (0.1, 0.509) +0 -> 7.8 (the summed work (2.9, 2.409) would say 7.9)
    #   B: stage 0 (0.75, 1.205): +0.295 -> 4.795; stage 1 +0.295, (0.3, 0.511) +0.089, (0.1,
    #      0.512) +0 -> 7.384 (summed (1.15, 2.228): 7.072)
    #   C: stage 0 (0.75, 1.21): +0.29 -> 4.79; stage 1 +0.29, (0.3, 0.512) +0.088 -> 7.378
    # A: 0-4, send 0.75, 4.75-12.55; B: 12.55-17.345, send 0.4375, 17.7825-25.1665; C: 25.1665-29.9565,
    # 30.394-37.772.
    r = eagle_run(engine, clock=lambda c: ClockedCostModel(c, GPU, ClockConfig(mhz=1000.0, **LAW)))
    assert by_id(r, "first_token_ms")[0] == pytest.approx(12.55, rel=1e-12)
    assert by_id(r, "finish_ms")[0] == pytest.approx(37.772, rel=1e-12)
    first = [slice_j(4, 1.4e9, 2e11, 0.5), slice_j(4.795, 1.205e9, 7.5e10, 0.5), slice_j(4.79, 1.21e9, 7.5e10, 0.5)]
    last = [slice_j(7.8, 2.409e9, 2.9e11, 0.5, phases=A_LAST), slice_j(7.384, 2.228e9, 1.15e11, 0.5),
            slice_j(7.378, 2.235e9, 1.15e11, 0.5)]
    inst = r.meta["energy"]["instances"][0]
    assert [s["busy_ms"] for s in inst["stages"]] == pytest.approx([13.585, 22.562], rel=1e-12)
    assert [s["busy_j"] for s in inst["stages"]] == pytest.approx([sum(first), sum(last)], rel=1e-12)
    check_energy(r)


# -- both engines, conservation ----------------------------------------------------------------------------

CLOCKS = st.sampled_from([None, {"mhz": 500.0}, {"mhz": 1000.0}, {"policy": "slo", "tpot_ms": 12.0, "step_mhz": 300.0},
                          {"policy": "slo", "tpot_ms": 30.0, "step_mhz": 300.0}])


def at(clock):
    """``clock`` (settings of :class:`ClockConfig` under :data:`LAW`, or None) around each cost model."""
    return (lambda c: ClockedCostModel(c, GPU, ClockConfig(**{**LAW, **clock}))) if clock is not None else None


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=12, max_prompt=60, max_output=60, all_at_zero=False, priorities=True),
       schedulers(), speculative_configs(), st.integers(2, 4), st.integers(1, 2),
       st.sampled_from(sorted(ROUTERS)),
       dyadic_linear_costs(), st.integers(0, 30), CLOCKS, st.sampled_from([0.0, 0.02]), st.integers(0, 3))
@example(  # requests preempted in flight with drafts and chunks in it, finished by what their batches bring
    [Request(i, 0.0, p, o) for i, (p, o) in enumerate([(4, 10), (1, 1), (1, 10), (1, 10), (20, 10), (1, 9), (1, 1),
                                                       (1, 60), (1, 1), (1, 1), (1, 1)])],
    ContinuousConfig(max_num_seqs=5, max_num_batched_tokens=20, chunked_prefill=False, allocation="grow",
                     reserve_full_prompt=True),
    SpeculativeConfig(method="eagle", num_speculative_tokens=4, acceptance_rate=0.0, draft={"kind": "linear"}),
    3, 1, "least_kv", LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=4.0), 10, None, 0.0, 0)
def test_speculating_pipelines_agree_on_energy_at_a_clock_and_conserve_it(requests, cfg, spec, stages, instances,
                                                                         router, cost, spare, clock, standby_s, seed):
    """Random arrivals, budgets that cut drafts short, swaps and recompute preemptions, k by
    batch size, at the full clock, fixed ones and the governor's: both engines launch the same
    batches at the same clocks, draw the same energy per instance, stage and request, and
    conserve it."""
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    blocks = blocks_with_drafts(requests, spec, 4) + spare

    def make():
        kv = PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), kv

    runs = metered_pipelines_agreeing(requests, make, stages, instances, router, utilisation(standby_s, 0.005),
                                      speculative=spec, draft_cost=drafter_of(spec), seed=seed, clock=at(clock))
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * instances, kv_blocks=blocks * instances)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=400, max_output=120, all_at_zero=False),
       schedulers(),
       st.integers(2, 3), st.integers(1, 4), st.sampled_from([0.0, 0.7, 1.0]), st.sampled_from(["eagle", "ngram"]),
       st.sampled_from([None, {"mhz": 900.0}, {"policy": "slo", "tpot_ms": 30.0}]), st.integers(0, 3))
def test_speculating_roofline_pipelines_agree_on_energy_and_conserve_it(requests, cfg, stages, k, alpha, method,
                                                                       clock, seed):
    """Llama-3.1-8B's stages on H100s (the host's share on the first stage, kernels apart) with a
    Llama-3.2-1B roofline drafter (or n-gram) on the last, through the utilisation model as a run
    builds it against the instance's StageCost, at the full clock, a fixed one and the governor's."""
    gpu = PRESETS.gpu("h100-80gb")
    spec = SpeculativeConfig(method=method, num_speculative_tokens=k, acceptance_rate=alpha, proposer_ms=0.125,
                             draft=None if method == "ngram" else {"kind": "roofline"})
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    drafter = (RooflineCostModel(PRESETS.model("llama-3.2-1b"), gpu, RooflineConfig(model="llama-3.2-1b",
                                                                                     gpu="h100-80gb"))
               if method != "ngram" else None)
    blocks = blocks_with_drafts(requests, spec, 16)

    def make():
        cost = RooflineCostModel(PRESETS.model("llama-3.1-8b"), gpu, RooflineConfig(model="llama-3.1-8b",
                                                                                     gpu="h100-80gb"),
                                 parallelism=Parallelism(pipeline_parallel=stages))
        return ContinuousScheduler(cfg), cost, PagedKVCache(blocks, 16, swap_blocks=64, bytes_per_block=2 ** 20,
                                                             host_link_gbps=2 ** 10 / 1e3)

    def power(cost):
        return build_utilisation(UtilisationConfig(standby_s=0.05), PRESETS, cost)

    clocked = (lambda c: ClockedCostModel(c, gpu, ClockConfig(**clock))) if clock is not None else None
    metered_pipelines_agreeing(requests, make, stages, 1, "round_robin", power, speculative=spec, draft_cost=drafter,
                               seed=seed, clock=clocked)


# -- TOML ---------------------------------------------------------------------------------------------------


def write(tmp_path, *parts: str):
    path = tmp_path / "exp.toml"
    text = "".join(textwrap.dedent(p) for p in (BASE, *parts)).replace("rtx-pro-6000-server", "h100-80gb")
    path.write_text(text.replace('name = "pp"', 'name = "pp"\ntimeline = true'))
    return path


PIPELINED = """
    [power]
    kind = "utilisation"
    [cluster]
    pipeline_parallel = 2
"""


@pytest.mark.parametrize("clock", ["", "[clock]\nmhz = 900\n", '[clock]\npolicy = "slo"\ntpot_ms = 80\n'])
def test_power_and_clocks_with_a_speculating_pipeline_in_toml_run_in_both_engines(tmp_path, clock):
    """PP 2 with an EAGLE-style drafter, metered: both engines alike, energy conserved, and the
    last stage -- with the drafter -- busier than the first."""
    fast = fast_run_agreeing_with_reference(write(tmp_path, PIPELINED, SPECULATIVE, clock))
    check_energy(fast, shared=not fast.counters["swap_out_blocks"])
    assert fast.metrics["speculative"]["drafts"] > 0 and fast.metrics["energy"]["gpu_j"] > 0
    first, last = fast.meta["energy"]["instances"][0]["stages"]
    assert last["busy_ms"] > first["busy_ms"]


@pytest.mark.parametrize("table", ["[clock]\nmhz = 900\n", '[power]\nkind = "utilisation"\n'])
def test_a_drafter_that_says_no_work_is_refused_on_pipelines_by_the_table_that_needs_it(tmp_path, table):
    """A ``linear`` drafter says no bytes and FLOPs: neither the clock nor the power model can
    say what the last stage did, and the error names the drafter's cost model."""
    drafted = SPECULATIVE.replace('{kind = "roofline", model = "llama-3.2-1b", gpu = "rtx-pro-6000-server"}',
                                  '{kind = "linear"}')
    assert drafted != SPECULATIVE
    path = write(tmp_path, PIPELINED.replace('[power]\n    kind = "utilisation"\n', ""), drafted, table)
    name = table[1:table.index("]")]
    with pytest.raises(ConfigError, match=rf"exp\.toml.*\[{name}\]: .*the drafter's cost model LinearCostModel does "
                                          r"not say the bytes and FLOPs of its passes"):
        load(path)
