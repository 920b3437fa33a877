"""The clock stretches a lockstep step's experts on the busiest expert GPU's work
(schedlab.energy.clock, ``busiest_experts_work`` of the cost models).

With ``[cluster] expert_balancedness`` below 1 the busiest GPU computes ``1 / balancedness`` of
the mean GPU's (token, expert) pairs, and the step's experts wait for it (``experts_ms``). The
clock's law stretches the experts' time by ``max(c / r, m) - max(c, m)`` of that GPU's split,
so they may slow at a clock at which the mean GPU's would not; power models still meter every
GPU at the mean share (their sum is the step's work). Checked here: the busiest GPU's work of the
linear test model, the roofline and the profiled model by hand (the mean's at balancedness 1);
a step at half clock and the governor's choice by hand, both engines; both engines against each
other with conservation on random workloads; the TOML.

The hand-computed cases are ``test_clock_parallel.py``'s (ranks of 0.5 ms per prompt token and
8 ms a decode step, experts 1 ms + 0.0625 ms per token of all ranks + 0.125 ms per token of the
largest rank, on its GPU at its law) with the experts' FLOPs at 4e9 a token instead of 1e10, so
that the mean GPU's experts stay memory-bound at half clock and the busiest's do not.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.configs import FieldError
from schedlab.energy.clock import ClockConfig, ClockedCostModel
from schedlab.engine.rank_cost import DUMMY
from schedlab.parallelism import Parallelism
from schedlab.protocols import Batch
from schedlab.testing import (blocks_for_largest, check_energy, dyadic_linear_costs, examples,
                              fast_run_agreeing_with_reference, requests_lists)
from schedlab.testing.parallel import ParallelPrices
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.profiled import ProfiledConfig, build_profiled
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.power import UtilisationConfig
from schedlab_plugins.power.utilisation import build_utilisation
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from test_clock_parallel import (H100, LAW, WorkingCost, _write, assert_two_steps, one_prompt_on_two_ranks, step_j,
                                 utilisation)
from test_data_parallel import ROUTERS, fresh_router, schedulers
from test_data_parallel_energy import GPU, MOE_PROFILE, PRESETS, metered_runs_agreeing

ENGINES = ("fast", "reference")
LINEAR = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)


def working(balancedness: float, linear: LinearConfig = LINEAR) -> WorkingCost:
    """The hand-computed ranks' cost model, the busiest expert GPU at ``balancedness``."""
    return WorkingCost(LinearCostModel(linear), ParallelPrices(expert_flops_per_token=4e9,
                                                               expert_balancedness=balancedness))


def ranks_at(balancedness: float, **clock):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                         allocation="grow", chunked_prefill=True))
        return scheduler, ClockedCostModel(working(balancedness), GPU, ClockConfig(**{**LAW, **clock})), \
            PagedKVCache(64, 16)
    return make


# -- the busiest GPU's work ---------------------------------------------------------------------------------


def test_the_linear_models_busiest_gpu_computes_1_over_balancedness_of_the_mean_gpus_flops():
    # (16, 1) tokens over 2 ranks: a mean share of 8.5 tokens, 8.5e8 bytes and 3.4e10 FLOPs
    assert working(1.0).experts_work((16, 1)) == pytest.approx((8.5e8, 3.4e10), rel=1e-15)
    assert working(1.0).busiest_experts_work((16, 1)) == working(1.0).experts_work((16, 1))
    assert working(0.5).busiest_experts_work((16, 1)) == pytest.approx((8.5e8, 6.8e10), rel=1e-15)
    assert working(0.5).experts_work((16, 1)) == working(1.0).experts_work((16, 1))  # energy: the mean share


def roofline(balancedness: float, expert_parallel: bool = True) -> RooflineCostModel:
    return RooflineCostModel(PRESETS.model("qwen3-30b-a3b"), PRESETS.gpu(H100), RooflineConfig(model="qwen3-30b-a3b",
                                                                                               gpu=H100),
                             parallelism=Parallelism(data_parallel=2, expert_parallel=expert_parallel,
                                                     expert_balancedness=balancedness))


def test_the_roofline_scales_the_mean_gpus_experts_to_the_busiest_gpus_by_hand():
    # Qwen3-30B-A3B: 128 experts, 8 a token; 2 GPUs hold 64 each. Ranks of 6 and 4 tokens replay CUDA
    # graphs, so both send 6 rows through the experts: 12 tokens routed in a layer make 96 pairs, 48
    # a GPU when even; at balancedness 0.5 the busiest GPU gets min(96, 12 x 8) = 96: twice the
    # FLOPs, and of its 64 experts 64 (1 - (63/64)^96) distinct ones where the even share reads
    # 64 (1 - (63/64)^48).
    model = PRESETS.model("qwen3-30b-a3b")
    assert (model.num_experts, model.experts_per_token) == (128, 8)
    mean_bytes, mean_flops = roofline(0.5).experts_work((6, 4))
    assert (mean_bytes, mean_flops) == roofline(1.0).experts_work((6, 4))
    byt, flops = roofline(0.5).busiest_experts_work((6, 4))
    assert flops == pytest.approx(2 * mean_flops, rel=1e-12)
    assert byt == pytest.approx(mean_bytes * (1 - (63 / 64) ** 96) / (1 - (63 / 64) ** 48), rel=1e-12)
    assert byt > mean_bytes
    # an even router, or every expert sharded over the GPUs: the busiest GPU is the mean one (a skew
    # of sharded experts changes nothing, so it is refused rather than taken in silence)
    assert roofline(1.0).busiest_experts_work((6, 4)) == roofline(1.0).experts_work((6, 4))
    assert roofline(1.0, expert_parallel=False).busiest_experts_work((6, 4)) == \
        roofline(1.0, expert_parallel=False).experts_work((6, 4))
    with pytest.raises(FieldError, match="expert_balancedness: applies to experts spread over the ranks"):
        roofline(0.5, expert_parallel=False)


def test_the_profiled_model_scales_its_experts_to_the_busiest_gpu_as_the_roofline_does():
    """The profiled model's work is the roofline's counts, its busiest GPU the same scaling."""
    from pathlib import Path

    profile = str(Path(__file__).resolve().parents[1] / MOE_PROFILE)

    def profiled(balancedness):
        config = ProfiledConfig(profile=profile, model="qwen3-30b-a3b", gpu="rtx-pro-6000-server")
        return build_profiled(config, PRESETS, Parallelism(data_parallel=2, expert_parallel=True,
                                                           expert_balancedness=balancedness))

    even, skewed = profiled(1.0), profiled(0.5)
    assert even.busiest_experts_work((6, 4)) == even.experts_work((6, 4))
    mean_bytes, mean_flops = skewed.experts_work((6, 4))
    byt, flops = skewed.busiest_experts_work((6, 4))
    assert flops == pytest.approx(2 * mean_flops, rel=1e-12)
    assert byt == pytest.approx(mean_bytes * (1 - (63 / 64) ** 96) / (1 - (63 / 64) ** 48), rel=1e-12)


# -- by hand: the step at a clock ---------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_half_clock_stretches_the_experts_on_the_busiest_gpus_work_by_hand(engine):
    # test_clock_parallel's fixed half clock (request 0, prompt 16 and 2 tokens, on rank 0; rank 1
    # on the dummy), the experts' FLOPs at 4e9 a token, balancedness 0.5:
    # Step 1: rank 0's prefill 16 -> 16 ms (c 8, m 3.6); the dummy 8 (c 0.5, m 2.11). The experts
    #   of (16, 1): 4.0625 ms. The mean GPU's 8.5 tokens: m = 0.85, c = 0.34 -> 0.68 < 0.85 at half
    #   clock: no stretch. The busiest GPU's c = 0.68 -> 1.36: +0.51 -> 4.5725. The step 20.5725.
    # Step 2: the decode over 17 and the dummy, 8 each; experts of (1, 1): 1.25, the mean's c 0.04
    #   -> 0.08 < 0.1, the busiest's 0.08 -> 0.16: +0.06 -> 1.31. The step 9.31.
    r = one_prompt_on_two_ranks(ranks_at(0.5, mhz=1000.0), engine, utilisation())
    assert_two_steps(r, (20.5725, 9.31), (4.5725, 1.31))
    # Energy: every GPU at the mean share of the experts (8.5e8 bytes and 3.4e10 FLOPs in step 1,
    # 1e8 and 4e9 in step 2) over the stretched steps; rank 1 waits 8 ms for rank 0 in step 1.
    # Rank 0's prompt is compute-bound (c 8) and its experts memory-bound (m 0.85): 8.85 ms of
    # work at peak, where the totals' max would say 8.34; the other steps are memory-bound throughout.
    rank0 = step_j(20.5725, 4.45e9, 8.34e11, 20.5725, 0.5, phases=[(3.6e9, 8.0e11), (8.5e8, 3.4e10)]) \
        + step_j(9.31, 2.37e9, 5.4e10, 9.31, 0.5)
    rank1 = step_j(20.5725, 2.96e9, 8.4e10, 8 + 4.5725, 0.5) + step_j(9.31, 2.21e9, 5.4e10, 9.31, 0.5)
    assert [i["busy_j"] for i in r.meta["energy"]["instances"]] == pytest.approx([rank0, rank1], rel=1e-12)
    check_energy(r)
    # an even router: the busiest GPU is the mean one, memory-bound at half clock -- no stretch
    assert_two_steps(one_prompt_on_two_ranks(ranks_at(1.0, mhz=1000.0), engine), (16 + 4.0625, 9.25), (4.0625, 1.25))


def test_the_governor_clocks_a_lockstep_step_from_the_busiest_gpus_experts_by_hand():
    # Step 2 above (the decode over 17 and the dummy, 8 ms each at any level here; experts 1.25 ms)
    # with levels r = 0.1, 0.325, 0.55, 0.775, 1 and a target of 9.26 ms. The busiest GPU's experts
    # (c 0.08, m 0.1) take 0.08 / r - 0.1 more below r = 0.8: 9.3962 at 0.325, 9.2955 at 0.55,
    # 9.2532 at 0.775 -- the first within 9.26. The mean GPU's (c 0.04) would allow 0.55 (9.25).
    def cost(balancedness):
        return ClockedCostModel(working(balancedness), GPU, ClockConfig(policy="slo", tpot_ms=9.26, headroom=1.0,
                                                                        step_mhz=450.0, **LAW))

    own = [Batch(num_decode=1, decode_context_tokens=17), DUMMY]
    r, parts, experts = cost(0.5).lockstep_at(own, (1, 1), [8.0, 8.0], 1.25)
    assert r == 0.775 and parts == pytest.approx([8.0, 8.0]) and experts == pytest.approx(1.25 + 0.08 / 0.775 - 0.1)
    assert cost(1.0).lockstep_at(own, (1, 1), [8.0, 8.0], 1.25)[0] == 0.55


# -- both engines, conservation ----------------------------------------------------------------------------

CLOCKS = st.one_of(st.sampled_from([200.0, 500.0, 1000.0, 1500.0]).map(lambda mhz: {"mhz": mhz}),
                   st.sampled_from([6.0, 9.4, 12.0, 20.0]).map(lambda t: {"policy": "slo", "tpot_ms": t,
                                                                          "step_mhz": 300.0}))


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=80, all_at_zero=False, priorities=True),
       schedulers(), st.integers(2, 3), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 40),
       CLOCKS, st.sampled_from([0.25, 0.5, 0.75]))
def test_lockstep_at_a_clock_with_an_uneven_router_agrees_between_engines_and_conserves_energy(
        requests, cfg, ranks, router, cost, spare, clock, balancedness):
    """Fixed clocks and the governor with the busiest expert GPU computing more than the mean:
    both engines step at the same clocks, draw the same energy per rank, and conserve it."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        kv = PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
        inner = WorkingCost(LinearCostModel(cost), ParallelPrices(expert_balancedness=balancedness))
        return ContinuousScheduler(cfg), ClockedCostModel(inner, GPU, ClockConfig(**{**LAW, **clock})), kv

    metered_runs_agreeing(requests, make, ranks, ROUTERS[router], utilisation(0.02, 0.005))


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=400, max_output=200, all_at_zero=False), schedulers(),
       st.integers(2, 3), st.integers(0, 20),
       st.one_of(st.sampled_from([600.0, 1200.0]).map(lambda mhz: {"mhz": mhz}),
                 st.sampled_from([15.0, 30.0]).map(lambda t: {"policy": "slo", "tpot_ms": t})),
       st.sampled_from([0.5, 0.7]))
def test_clocked_roofline_ranks_with_an_uneven_router_agree_between_engines(requests, cfg, ranks, spare, clock,
                                                                            balancedness):
    """Qwen3-30B-A3B's roofline ranks at ``expert_balancedness`` below 1 at a clock, metered by
    the utilisation model as a run builds it."""
    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // 16) for r in requests)
    gpu = PRESETS.gpu(H100)

    def make():
        ranks_cost = RooflineCostModel(PRESETS.model("qwen3-30b-a3b"), gpu,
                                       RooflineConfig(model="qwen3-30b-a3b", gpu=H100),
                                       parallelism=Parallelism(data_parallel=ranks, expert_parallel=True,
                                                               expert_balancedness=balancedness))
        return ContinuousScheduler(cfg), ClockedCostModel(ranks_cost, gpu, ClockConfig(**clock)), \
            PagedKVCache(need + spare, 16, swap_blocks=64, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)

    metered_runs_agreeing(requests, make, ranks, fresh_router,
                          lambda c: build_utilisation(UtilisationConfig(standby_s=0.05), PRESETS, c))


# -- TOML ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("clock", ["mhz = 600", 'policy = "slo"\ntpot_ms = 60'])
def test_lockstep_ranks_with_an_uneven_router_at_a_clock_in_toml_run_in_both_engines(tmp_path, clock):
    path = _write(tmp_path, textwrap.dedent(f"""
        [power]
        kind = "utilisation"
        [clock]
        {clock}
        [cluster]
        data_parallel = 2
        expert_parallel = true
        expert_balancedness = 0.6
    """))
    fast = fast_run_agreeing_with_reference(path)
    check_energy(fast)
    assert fast.meta["instances"] == 2 and fast.metrics["energy"]["gpu_j"] > 0
