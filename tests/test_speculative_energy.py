"""Speculative decoding's drafter in the energy model and at a clock (schedlab.drafting,
schedlab.energy.clock): its passes' work and kernels counted in a step, each pass stretched by
the clock's law on its own split, the governor choosing from them; by hand, then both engines
on random workloads (colocated and lockstep ranks) with conservation, and the TOML.

The hand-computed cases use :class:`Priced` models on :data:`GPU` (1,000 GB/s = 1e9 bytes a ms,
100 TFLOPS = 1e11 FLOPs a ms, 40 W idle, 400 W board, clocks 200-2,000 MHz), the utilisation
model at awake 0.2 and activity 1, and the clock's efficiencies at 1, so that a pass's split is
its work at the peak rates.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedlab.drafting import DraftingCostModel
from schedlab.energy.clock import ClockConfig, ClockedCostModel
from schedlab.engine.rank_cost import DUMMY, RankCost
from schedlab.errors import ConfigError
from schedlab.protocols import Batch
from schedlab.speculative import SpeculativeConfig, budget_problem
from schedlab.study.experiment import load
from schedlab.testing import (check_energy, compare_runs, examples, fast_run_agreeing_with_reference,
                              requests_lists, run_engine)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.power import UtilisationConfig, UtilisationPowerModel
from schedlab_plugins.power.common import find_clock
from schedlab_plugins.power.utilisation import build_utilisation
from schedlab_plugins.schedulers import ContinuousScheduler
from test_clock_parallel import LAW, WorkingCost
from test_data_parallel import BASE, SPECULATIVE, fresh_router, schedulers
from test_data_parallel_energy import GPU, PRESETS, metered_runs_agreeing
from test_data_parallel_speculative import blocks_with_drafts, drafter_of
from test_speculative import EXPERIMENT
from test_speculative_differential import speculative_configs

ENGINES = ("fast", "reference")


class Priced:
    """A cost model at linear prices: kernels ``kernel_base + kernel_per_token x tokens`` ms and
    ``host_ms`` around them; ``bytes_base + 1e6 x context`` bytes and ``1e10 x tokens`` FLOPs."""

    def __init__(self, kernel_base: float, kernel_per_token: float, host_ms: float, bytes_base: float):
        self.prices = kernel_base, kernel_per_token, host_ms, bytes_base

    def kernel_ms(self, batch: Batch) -> float:
        return self.prices[0] + self.prices[1] * batch.num_batched_tokens

    def iteration_ms(self, batch: Batch) -> float:
        return self.kernel_ms(batch) + self.prices[2]

    def work(self, batch: Batch) -> tuple[float, float]:
        context = batch.decode_context_tokens + batch.prefill_context_tokens
        return self.prices[3] + 1e6 * context, 1e10 * batch.num_batched_tokens


def drafting(proposer_ms: float = 0.5) -> DraftingCostModel:
    """The target (kernels 1 + 0.5 ms a token, 2 ms of host, 2.6e9 bytes of weights) and an
    EAGLE-style drafter (kernels 0.5 + 0.25 ms a token, 5e8 bytes), k = 2."""
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=2, draft={"kind": "priced"},
                             proposer_ms=proposer_ms)
    return DraftingCostModel(Priced(1.0, 0.5, 2.0, 2.6e9), Priced(0.5, 0.25, 1.0, 5e8), spec)


#: two decodes at 100 tokens of context each, verifying two drafts each: 6 tokens
STEP = Batch(num_decode=2, decode_context_tokens=200, spec_tokens=4)


def power(cost) -> UtilisationPowerModel:
    config = UtilisationConfig(awake=0.2, activity=1.0)
    return UtilisationPowerModel(config, GPU, 1, cost.work, clock=find_clock(cost), kernel=cost.kernel_ms,
                                 board_w=400.0, idle_w=40.0)


# -- by hand -----------------------------------------------------------------------------------------------


def test_a_speculative_steps_joules_count_the_drafters_work_and_kernels_by_hand():
    # The drafter's passes: one over the step's 6 tokens (context 200): kernels 0.5 + 1.5 = 2 ms,
    # 5e8 + 2e8 = 7e8 bytes, 6e10 FLOPs; then one of a token a sequence, context 200 + 2 = 202:
    # kernels 0.5 + 0.5 = 1 ms, 7.02e8 bytes, 2e10 FLOPs.
    # The target: kernels 1 + 3 = 4 ms, step 6 ms; 2.6e9 + 2e8 = 2.8e9 bytes (2.8 ms), 6e10 FLOPs (0.6 ms).
    # The step: 6 + 3 + 0.5 (proposing, on the host) = 9.5 ms; kernels 4 + 3 = 7 ms.
    cost = drafting()
    assert [(p.num_decode, p.decode_context_tokens, p.num_batched_tokens) for p in cost.passes(STEP)] == [
        (2, 200, 6), (2, 202, 2)]
    assert cost.iteration_ms(STEP) == pytest.approx(9.5)
    assert cost.kernel_ms(STEP) == pytest.approx(7.0)
    assert cost.work(STEP) == pytest.approx((2.8e9 + 7e8 + 7.02e8, 6e10 + 6e10 + 2e10))
    assert [w for part in cost.work_parts(STEP) for w in part] == pytest.approx([2.8e9, 6e10, 7e8, 6e10, 7.02e8,
                                                                                2e10])
    # Before, the power model saw the target's work and kernels over the 9.5 ms step:
    # g = 0.2 x 9.5 + max(2.8, 0.6) = 4.7 below the cap 4 + 0.2 x 5.5 = 5.1 -> (40 x 9.5 + 360 x 4.7) / 1000
    assert power(cost.target).iteration_j(STEP, 9.5) == pytest.approx(2.072)
    # Now its work is 4.202 ms of memory (1.4 of compute): g = 1.9 + 4.202 = 6.102, cap 7 + 0.2 x 2.5
    # -> (380 + 360 x 6.102) / 1000
    assert power(cost).iteration_j(STEP, 9.5) == pytest.approx(2.57672)
    # as a run builds it: the utilisation model finds the drafting wrapper's work and kernels
    assert build_utilisation(UtilisationConfig(awake=0.2, activity=1.0, board_w=400, idle_w=40, gpu="l4"), PRESETS,
                             cost)._work(STEP) == pytest.approx((4.202e9, 1.4e11))


def test_a_target_that_says_no_work_is_metered_by_a_roofline_of_its_model_with_the_drafters_passes():
    """(The profiled model's case: the utilisation model's roofline of ``model`` for the target.)"""
    cost = drafting()
    cost = DraftingCostModel(LinearCostModel(), cost.drafter, cost.config)
    assert cost.work is None and cost.unsaid_work is None
    model = build_utilisation(UtilisationConfig(model="llama-3.1-8b", gpu="a100-40gb"), PRESETS, cost)
    byt, flops = roofline("llama-3.1-8b").work(STEP)
    assert model._work(STEP) == pytest.approx((byt + 7e8 + 7.02e8, flops + 6e10 + 2e10))


def test_n_gram_adds_only_its_host_time():
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2, proposer_ms=0.5)
    cost = DraftingCostModel(Priced(1.0, 0.5, 2.0, 2.6e9), None, spec)
    assert cost.passes(STEP) == [] and cost.iteration_ms(STEP) == pytest.approx(6.5)
    assert cost.kernel_ms(STEP) == pytest.approx(4.0) and cost.work(STEP) == pytest.approx((2.8e9, 6e10))


def test_a_half_clock_stretches_each_pass_on_its_own_split_by_hand():
    # At 1,000 of 2,000 MHz (r = 0.5) each pass's compute doubles, its memory does not:
    # the target max(1.2, 2.8) - 2.8 = 0; the first draft pass max(1.2, 0.7) - 0.7 = 0.5; the
    # second max(0.4, 0.702) - 0.702 = 0 -> the step 9.5 + 0.5 = 10 ms, its kernels 7.5. (Their
    # sum, 4.202 ms of memory against 2.8 of compute, would not have slowed at all.)
    clock = ClockedCostModel(drafting(), GPU, ClockConfig(mhz=1000.0, **LAW))
    assert clock.iteration_ms(STEP) == pytest.approx(10.0)
    assert clock.kernel_ms(STEP) == pytest.approx(7.5)
    # Power at r = 0.5 under LAW: v = 0.55 + 0.45 x 0.4 / 0.9 = 0.75; awake 0.2 x 0.5 x 0.5625 =
    # 0.05625, work 0.2 + 0.8 x 0.5625 = 0.65: g = 0.05625 x 10 + 0.65 x 4.202 = 3.29380 below the
    # cap 7.5 + 0.05625 x 2.5 -> (40 x 10 + 360 x 3.2938) / 1000
    assert power(clock).iteration_j(STEP, 10.0) == pytest.approx(1.585768)


def test_the_governor_chooses_the_clock_from_the_drafters_passes_too_by_hand():
    # Levels 200, 1,100, 2,000 MHz (r = 0.1, 0.55, 1). At 0.55 the first draft pass's compute
    # 0.6 / 0.55 = 1.0909 outlasts its 0.7 ms of memory: the step is 9.5 + 0.3909 = 9.8909 ms (the
    # target's and the second pass's stay memory-bound). At 0.1 it is 9.5 + 3.2 + 5.3 + 1.298.
    def governed(tpot):
        return ClockedCostModel(drafting(), GPU, ClockConfig(policy="slo", tpot_ms=tpot, headroom=1.0,
                                                             step_mhz=900.0, **LAW))

    assert governed(9.9).clock_ratio(STEP) == 0.55
    assert governed(9.9).iteration_ms(STEP) == pytest.approx(9.5 + 0.6 / 0.55 - 0.7)
    assert governed(9.85).clock_ratio(STEP) == 1.0  # (their sum would have kept 9.5 ms at 0.55)
    assert governed(19.3).clock_ratio(STEP) == 0.1 and governed(19.3).iteration_ms(STEP) == pytest.approx(19.298)
    assert governed(9.9).clock_ratio(Batch(num_prefill=1, prefill_tokens=8)) == 1.0  # prompt tokens: full clock


def test_a_lockstep_ranks_work_and_kernels_include_its_drafting_by_hand():
    # A rank's own part (no experts here: the target's rank_work is its work) and its drafter's
    # passes; the dummy batch's drafter dummy run is k = 2 passes over its one token (context 1):
    # 2 x (5e8 + 1e6) bytes, 2 x 1e10 FLOPs, 2 x 0.75 ms of kernels.
    cost = drafting()
    target = cost.target
    target.rank_work, target.rank_kernel_ms, target.rank_ms = target.work, target.kernel_ms, target.iteration_ms
    target.experts_work = lambda tokens: (1e8, 1e9)
    cost = DraftingCostModel(target, cost.drafter, cost.config)
    assert cost.rank_work(STEP) == pytest.approx((4.202e9, 1.4e11))
    assert cost.rank_kernel_ms(STEP) == pytest.approx(7.0) and cost.rank_ms(STEP) == pytest.approx(9.5)
    assert cost.rank_work(DUMMY) == pytest.approx((2.6e9 + 1e6 + 2 * (5e8 + 1e6), 1e10 + 2e10))
    assert cost.rank_kernel_ms(DUMMY) == pytest.approx(1.5 + 1.5) and cost.rank_ms(DUMMY) == pytest.approx(3.5 + 1.5)
    view = RankCost(cost)
    view.step_tokens, view.experts_ms = (6, 1), 0.25
    assert view.work(STEP) == pytest.approx((4.202e9 + 1e8, 1.4e11 + 1e9))  # and its share of the experts
    assert view.kernel_ms(STEP) == pytest.approx(7.25)


# -- both engines, conservation ----------------------------------------------------------------------------

SETTINGS = settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLOCKS = {"none": None, "fixed": {"mhz": 765.0}, "slo": {"policy": "slo", "tpot_ms": 40.0}}


def roofline(model: str):
    return RooflineCostModel(PRESETS.model(model), PRESETS.gpu("a100-40gb"), RooflineConfig(model=model,
                                                                                             gpu="a100-40gb"))


@SETTINGS
@given(requests_lists(min_size=1, max_size=10, max_prompt=300, max_output=120, all_at_zero=False), schedulers(),
       st.integers(1, 4), st.sampled_from([0.0, 0.7, 1.0]), st.sampled_from(["eagle", "ngram"]),
       st.sampled_from(sorted(CLOCKS)), st.integers(0, 3))
def test_speculating_instances_agree_on_energy_at_a_clock_and_conserve_it(requests, cfg, k, alpha, method, clock,
                                                                         seed):
    """Llama-3.1-8B with a Llama-3.2-1B drafter (or n-gram) on the roofline, metered by the
    utilisation model, at the full clock, a fixed one or the governor's: both engines alike
    (times and energy, per request too), each run's energy its power's integral."""
    spec = SpeculativeConfig(method=method, num_speculative_tokens=k, acceptance_rate=alpha, proposer_ms=0.125,
                             draft=None if method == "ngram" else {"kind": "roofline"})
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    drafter = roofline("llama-3.2-1b") if method != "ngram" else None
    settings_ = CLOCKS[clock]
    at = (lambda c: ClockedCostModel(c, PRESETS.gpu("a100-40gb"), ClockConfig(**settings_))) if settings_ else None
    runs = [run_engine(requests, ContinuousScheduler(cfg), roofline("llama-3.1-8b"), PagedKVCache(2000, 16),
                       engine=engine, speculative=spec, draft_cost=drafter, seed=seed, clock=at,
                       power=lambda c: build_utilisation(UtilisationConfig(standby_s=0.05), PRESETS, c))
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    for run in runs:
        check_energy(run)


@SETTINGS
@given(requests_lists(min_size=1, max_size=10, max_prompt=60, max_output=60, all_at_zero=False), schedulers(),
       speculative_configs(), st.integers(2, 3), st.sampled_from([{"mhz": 1000.0}, {"policy": "slo", "tpot_ms": 16.0}]),
       st.integers(0, 20), st.integers(0, 3))
def test_speculating_lockstep_ranks_at_a_clock_are_metered_alike_and_conserve_energy(requests, cfg, spec, ranks,
                                                                                    clock, spare, seed):
    """Ranks stepping together at one clock, each drafting: a rank's part and its drafter's
    passes stretched on their own work, the governor choosing from the whole step; both engines
    draw the same energy per rank, conserved."""
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    blocks = blocks_with_drafts(requests, spec, 4) + spare

    def make():
        scheduler = ContinuousScheduler(cfg)
        kv = PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
        return scheduler, WorkingCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5))), kv

    def at(cost):
        return ClockedCostModel(cost, GPU, ClockConfig(**{**LAW, **clock}))

    config = UtilisationConfig(awake=0.2, activity=1.0)
    metered_runs_agreeing(requests, make, ranks, fresh_router,
                          lambda c: UtilisationPowerModel(config, GPU, 1, c.work, clock=find_clock(c),
                                                          kernel=c.kernel_ms, board_w=400.0, idle_w=40.0),
                          speculative=spec, draft_cost=drafter_of(spec), seed=seed, clock=at)


# -- TOML ----------------------------------------------------------------------------------------------------

#: test_speculative.py's Llama-3-8B with a Llama-3.2-1B draft model on an A100-80GB, metered
COLOCATED = (EXPERIMENT[:EXPERIMENT.index("[[runs]]")].replace('name = "spec"', 'name = "spec"\ntimeline = true')
             + '[power]\nkind = "utilisation"\n')
DRAFT = 'draft = {kind = "roofline", model = "llama-3.2-1b", gpu = "a100-80gb"}'


@pytest.mark.parametrize("clock", ["", '[clock]\nmhz = 705\n', '[clock]\npolicy = "slo"\ntpot_ms = 30\n'])
def test_speculation_with_power_and_a_clock_in_toml_runs_in_both_engines(tmp_path, clock):
    path = tmp_path / "exp.toml"
    path.write_text(COLOCATED + clock)
    fast = fast_run_agreeing_with_reference(path)
    check_energy(fast)
    assert fast.metrics["speculative"]["drafts"] > 0 and fast.metrics["energy"]["gpu_j"] > 0


def test_a_clock_slows_speculative_steps_and_saves_energy_in_toml(tmp_path):
    """At half the A100's clock the memory-bound decode steps barely slow, the prefills do, and
    the drafted run takes less energy per token than at the full clock."""
    runs = {}
    for name, clock in (("full", ""), ("half", "[clock]\nmhz = 705\n")):
        (tmp_path / name).mkdir()
        path = tmp_path / name / "exp.toml"
        path.write_text(COLOCATED + clock)
        runs[name] = fast_run_agreeing_with_reference(path)
    full, half = runs["full"].metrics, runs["half"].metrics
    assert half["energy"]["j_per_token"] < full["energy"]["j_per_token"]
    assert half["ttft_ms"]["p50"] > full["ttft_ms"]["p50"]


def test_speculating_lockstep_ranks_at_a_clock_in_toml_run_in_both_engines(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text((textwrap.dedent(BASE) + textwrap.dedent(SPECULATIVE)).replace("rtx-pro-6000-server", "h100-80gb")
                    + textwrap.dedent("""
        [power]
        kind = "utilisation"
        [clock]
        policy = "slo"
        tpot_ms = 40
        [cluster]
        data_parallel = 2
        expert_parallel = true
    """))
    fast = fast_run_agreeing_with_reference(path)
    check_energy(fast)
    assert fast.meta["instances"] == 2 and fast.metrics["speculative"]["drafts"] > 0


@pytest.mark.parametrize("table", ['[clock]\nmhz = 705\n', '[power]\nkind = "utilisation"\n'])
def test_a_drafter_that_says_no_work_is_refused_by_the_table_that_needs_it(tmp_path, table):
    path = tmp_path / "exp.toml"
    path.write_text(COLOCATED.replace('[power]\nkind = "utilisation"\n', "").replace(DRAFT, 'draft = {kind = "linear"}')
                    + table)
    with pytest.raises(ConfigError, match=r"the drafter's cost model LinearCostModel does not say the bytes and "
                                          r"FLOPs of its passes"):
        load(path)
