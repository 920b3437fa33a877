"""Energy of data-parallel ranks stepping together (a MoE model with ``[cluster] data_parallel``).

In a step each rank's GPUs run its own part (its batch, or the one-token dummy batch when it has
nothing to compute) and their share of the routed experts of every rank's tokens; a rank's power
model asks its :class:`~schedlab.engine.rank_cost.RankCost` for that work. Checked here: the cost
models' split of an iteration's work (by hand on a small model), lockstep steps metered by hand
(the utilisation model's formula worked out in the test), both engines against each other with
conservation (energy = the integral of power over the timeline) on random workloads, and the
TOML path.

The hand-computed steps are those of ``test_data_parallel.py`` (0.5 ms per prompt token, 8 ms a
decode step, a dummy batch a decode; experts 1 ms + 0.0625 ms per token of all ranks + 0.125 ms
per token of the largest rank), on a GPU of 1,000 GB/s (1e9 bytes a ms) and 100 TFLOPS (1e11
FLOPs a ms) drawing 40 W idle and 400 W at most: a step of ``d`` ms whose GPU kernels take ``k``
ms and which reads ``m`` ms of bytes and computes ``c`` ms of FLOPs at the peak rates takes
``(40 d + 360 min(0.2 d + max(m, c), k + 0.2 (d - k))) / 1000`` J (awake share 0.2, activity 1).
"""

from __future__ import annotations

import math
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.capacity import GpuSpec, ModelSpec, Presets
from schedlab.catalog import load_catalog
from schedlab.model import Request
from schedlab.parallelism import Parallelism
from schedlab.protocols import Batch
from schedlab.targets import _iteration_tokens
from schedlab.testing import (blocks_for_largest, check_energy, check_run, compare_runs, dyadic_linear_costs,
                              examples, fast_run_agreeing_with_reference, requests_lists)
from schedlab.testing.parallel import LinearParallelCost, ParallelPrices, run_data_parallel
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.work import ModelWork
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.power import UtilisationConfig, UtilisationPowerModel
from schedlab_plugins.power.utilisation import build_utilisation
from schedlab_plugins.routers import RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from test_data_parallel import BASE, ROUTERS, SPECULATIVE, by_id, fresh_router, schedulers

ENGINES = ("fast", "reference")
PRESETS = Presets.from_catalog(load_catalog(entry_points=False))
GPU = GpuSpec("test-gpu", memory_gib=80, hbm_bandwidth_gbps=1000, bf16_tflops=100, host_link_gbps=32,
              board_w=400, idle_w=40, max_clock_mhz=2000, min_clock_mhz=200)


def utilisation(standby_s: float = 0.0, tail_s: float = 0.0):
    """The utilisation model on :data:`GPU` (awake 0.2, activity 1), asking the rank what it did."""
    config = UtilisationConfig(awake=0.2, activity=1.0, standby_s=standby_s, tail_s=tail_s)
    return lambda cost: UtilisationPowerModel(config, GPU, 1, cost.work, kernel=cost.kernel_ms, board_w=400.0,
                                              idle_w=40.0)


def step_j(d: float, bytes_: float, flops: float, kernels: float) -> float:
    """A step's joules on :data:`GPU`, worked out from the module docstring's formula."""
    work = 0.2 * d + max(bytes_ / 1e9, flops / 1e11)
    return (40 * d + 360 * min(work, kernels + 0.2 * (d - kernels))) / 1000


def rank(prices: ParallelPrices = ParallelPrices(), blocks: int = 64):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                         allocation="grow", chunked_prefill=True))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                                  prices)
        return scheduler, cost, PagedKVCache(blocks, 16)
    return make


# -- the work of a step, split as its time is --------------------------------------------------------------

#: 4 experts of 100 parameters, 2 a token; 600 other parameters; 2 layers, 4 query heads, 2 KV
#: heads of 4 dimensions; 2 bytes a weight. No vocabulary declared: no embedding table apart.
TINY = ModelSpec(name="tiny-moe", num_layers=2, num_kv_heads=2, head_dim=4, num_params=1000.0, num_attention_heads=4,
                 num_experts=4, experts_per_token=2, active_params=800.0)


def test_a_ranks_work_and_its_share_of_the_experts_add_up_to_the_iteration_by_hand():
    # Two decodes over 10 context tokens and a chunk of 3 prompt tokens after 5 cached: 5 tokens.
    # Own part: 600 weights x 2 bytes = 1200, KV (10 + 5) x 64 bytes (K and V x 2 layers x 2 heads x
    # 4 x 2 bytes a token) = 960; FLOPs 2 x 600 = 1200 a token x 5, attention 128 a (query, key) pair
    # (4 x 2 layers x 4 heads x 4): the chunk's 3 x 5 + 3 x 4 / 2 = 21 pairs and the decodes' 10.
    # Experts of 5 tokens on one GPU: 4 x (1 - (1 - 2/4)^5) = 3.875 experts touched x 100 x 2
    # bytes; 2 x 2 x 100 FLOPs a token.
    w = ModelWork(TINY)
    batch = Batch(num_decode=2, decode_context_tokens=10, num_prefill=1, prefill_tokens=3, prefill_context_tokens=5)
    assert w.rank_work(batch) == (2160.0, 1200 * 5 + 128 * (21 + 10))
    assert w.experts_work((5,)) == (775.0, 2000.0)
    assert w.work(batch) == pytest.approx((2160 + 775, 9968 + 2000), rel=1e-15)
    # two ranks of 3 and 5 tokens: the 8 tokens touch 4 x (1 - 1/2^8) experts, half of them (and
    # half the 8 tokens' expert FLOPs) on each GPU; at TP 2 a quarter
    assert w.experts_work((3, 5)) == (4 * 255 / 256 * 100 * 2 / 2, 2 * 2 * 100 * 8 / 2)
    assert ModelWork(TINY, 2).experts_work((3, 5)) == (4 * 255 / 256 * 100 * 2 / 4, 2 * 2 * 100 * 8 / 4)
    assert w.rank_work(Batch()) == (0.0, 0.0)
    dense = ModelSpec(name="tiny-dense", num_layers=2, num_kv_heads=2, head_dim=4, num_params=600.0)
    assert ModelWork(dense).experts_work((3, 5)) == (0.0, 0.0)
    with pytest.raises(ValueError, match="at least one rank"):
        w.experts_work(())


def _qwen(**layout) -> RooflineCostModel:
    config = RooflineConfig(model="qwen3-30b-a3b", gpu="rtx-pro-6000-server")
    return RooflineCostModel(PRESETS.model("qwen3-30b-a3b"), PRESETS.gpu("rtx-pro-6000-server"), config,
                             parallelism=Parallelism(**layout))


@pytest.mark.parametrize("batch", [Batch(num_decode=64, decode_context_tokens=64 * 900),
                                   Batch(num_prefill=2, prefill_tokens=700, prefill_context_tokens=300),
                                   Batch(num_decode=3, decode_context_tokens=40, num_prefill=1, prefill_tokens=50)])
def test_the_rooflines_rank_work_and_experts_work_are_its_work_at_one_rank(batch):
    single = _qwen()
    tokens = batch.num_batched_tokens
    own, experts, whole = single.rank_work(batch), single.experts_work((tokens,)), single.work(batch)
    assert own[0] + experts[0] == pytest.approx(whole[0], rel=1e-12)
    assert own[1] + experts[1] == pytest.approx(whole[1], rel=1e-12)
    # Qwen3-30B-A3B on two ranks: each GPU reads half of the experts all their tokens touch (128
    # experts, 8 a token) and computes half of their pairs; ranks of up to 512 tokens replay CUDA
    # graphs, so the rank of 7 is padded to the other's rows
    m = PRESETS.model("qwen3-30b-a3b")
    dp = _qwen(data_parallel=2, expert_parallel=True)
    rows = 2 * tokens if tokens <= 512 else tokens + 7
    touched = 128 * (1 - (1 - 8 / 128) ** rows)
    expected = (touched * m.expert_params * 2 / 2, 2 * 8 * m.expert_params * rows / 2)
    assert dp.experts_work((tokens, 7)) == pytest.approx(expected, rel=1e-12)
    assert dp.rank_work(batch) == own  # a rank's own part does not depend on the layout
    with pytest.raises(ValueError, match="expected the tokens of 2 data-parallel ranks"):
        dp.experts_work((tokens,))


# -- hand-computed steps -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_running_the_dummy_batch_draws_its_work_and_its_share_of_the_experts(engine):
    # Request 0 (prompt 16, 2 tokens) on rank 0; rank 1 runs the dummy batch (a decode over 1 token).
    # Work: a rank's 2e9 bytes + 1e8 a token + 1e7 a context token, 5e10 FLOPs a token; the experts
    # 1e8 bytes and 1e10 FLOPs per token of all ranks, half on each rank's GPU.
    # Step 1, 12.0625 ms (parts 8 and 8, experts of (16, 1) 4.0625): the experts' share is 17/2 tokens
    #   rank 0: 2e9 + 16e8 + 8.5e8 bytes (4.45 ms), 16 x 5e10 + 8.5e10 FLOPs (8.85 ms): compute-bound
    #   rank 1: 2e9 + 1e8 + 1e7 + 8.5e8 bytes (2.96 ms), 5e10 + 8.5e10 FLOPs (1.35 ms)
    # Step 2, 9.25 ms (parts 8 and 8, experts of (1, 1) 1.25): the share is 1 token
    #   rank 0: a decode over 17 tokens, 2e9 + 1e8 + 1.7e8 + 1e8 bytes (2.37 ms), 6e10 FLOPs
    #   rank 1: the dummy again, 2e9 + 1e8 + 1e7 + 1e8 bytes (2.21 ms)
    # Every kernel runs the whole step (each rank's part is 8 ms), no GPU reaches the limit.
    r = run_data_parallel([Request(0, 0.0, 16, 2)], rank(), 2, RoundRobinRouter(), engine=engine,
                          power=utilisation())
    rank0 = step_j(12.0625, 4.45e9, 8.85e11, 12.0625) + step_j(9.25, 2.37e9, 6e10, 9.25)
    rank1 = step_j(12.0625, 2.96e9, 1.35e11, 12.0625) + step_j(9.25, 2.21e9, 6e10, 9.25)
    assert rank0 == pytest.approx(4.537 + 1.8892, rel=1e-12)  # the formula, evaluated by hand
    assert rank1 == pytest.approx(2.4166 + 1.8316, rel=1e-12)
    ranks = r.meta["energy"]["instances"]
    assert [i["busy_j"] for i in ranks] == pytest.approx([rank0, rank1], rel=1e-12)
    assert [i["idle_j"] for i in ranks] == [0.0, 0.0]  # both busy from the first arrival to the end
    assert "dummy_j" not in ranks[0] and ranks[1]["dummy_j"] == pytest.approx(rank1, rel=1e-12)
    assert by_id(r, "energy_j")[0] == pytest.approx(rank0, rel=1e-12)  # the dummy's energy is nobody's
    e = r.metrics["energy"]
    assert e["gpu_j"] == pytest.approx(rank0 + rank1, rel=1e-12)
    assert e["j_per_token"] == pytest.approx((rank0 + rank1) / 2, rel=1e-12)
    assert e["per_instance"]["0"]["peak_power_w"] == pytest.approx(4.537 / 12.0625 * 1e3, rel=1e-12)
    assert e["per_instance"]["1"]["peak_power_w"] == pytest.approx(2.4166 / 12.0625 * 1e3, rel=1e-12)
    # the run's: the ranks' peaks together (stepping together, they draw them at once)
    assert e["peak_power_w"] == pytest.approx((4.537 + 2.4166) / 12.0625 * 1e3, rel=1e-12)
    assert e["peak_power_w"] >= e["avg_power_w"]
    # the idle rank's steps are rows of its timeline, as a busy rank's; compared with a real run's
    # iteration_tokens, they are no iterations (vLLM's histogram observes steps with outputs: the
    # prompt's 16 tokens and its first token, then the decode's 1)
    t = r.timeline
    assert t["duration_ms"][t["instance"] == 1].sum() == pytest.approx(21.3125)
    assert (t["decodes"][t["instance"] == 1] == 0).all()
    tokens, iterations = _iteration_tokens(r)
    assert sorted(tokens.tolist()) == [1.0, 17.0] and iterations.tolist() == [1.0, 1.0]
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_waiting_for_a_slower_one_is_capped_by_its_own_kernels(engine):
    # Rank 0 prefills 32 tokens (16 ms), rank 1 prefills 8 (4 ms); experts of (32, 8): 7.5 ms; the
    # step 23.5 ms. At 2e11 FLOPs a token (2 ms of the peak) and no bytes, both would exceed the
    # board limit: rank 0's kernels run the whole step (400 W), rank 1's only 4 + 7.5 = 11.5 ms --
    # the 12 ms it waits for rank 0 it draws the awake share: 40 x 23.5 + 360 x (11.5 + 0.2 x 12).
    # Then both decode (8 ms) with experts of (1, 1) = 1.25: 2 ms of FLOPs each in 9.25 ms.
    prices = ParallelPrices(rank_bytes=0.0, bytes_per_token=0.0, bytes_per_context_token=0.0, flops_per_token=2e11,
                            expert_bytes_per_token=0.0, expert_flops_per_token=0.0)
    requests = [Request(0, 0.0, 32, 2), Request(1, 0.0, 8, 2)]
    r = run_data_parallel(requests, rank(prices), 2, RoundRobinRouter(), engine=engine, power=utilisation())
    decode = (40 * 9.25 + 360 * (0.2 * 9.25 + 2)) / 1000
    assert by_id(r, "energy_j") == pytest.approx({0: 400 * 23.5 / 1000 + decode,
                                                  1: (40 * 23.5 + 360 * (11.5 + 0.2 * 12)) / 1000 + decode}, rel=1e-12)
    check_energy(r)


class SwapsOutOnce:
    """The continuous scheduler with swap preemption, but at its ``at``-th plan it only swaps its
    decoding sequences out: a step in which its rank copies blocks and computes nothing."""

    def __init__(self, at: int | None):
        self.inner = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                          allocation="grow", preemption="swap"))
        self.at, self.plans = at, 0

    def schedule(self, plan) -> None:
        self.plans += 1
        if self.plans == self.at:
            for seq in list(plan.running):
                plan.swap_out(seq)
            return
        self.inner.schedule(plan)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_that_only_swaps_runs_the_dummy_after_its_copies(engine):
    # Requests 0 and 1 (prompt 16, 3 tokens), one on each rank. Step 1: both prefill (13 ms). Step 2:
    # rank 0 only swaps its sequence out -- one block of 2^20 bytes at 2^20 bytes a ms: 1 ms -- and
    # runs the dummy (8 ms); rank 1 decodes (8 ms); experts of (1, 1): 1.25 -> 10.25 ms. Rank 0's
    # GPUs copy from 13 to 14 with no kernel (the awake share: 112 W) and run the dummy from 14 to
    # 23.25: 2e9 + 1e8 + 1e7 bytes and 5e10 FLOPs for it, 1e8 and 1e10 for its share of the
    # experts, kernels 8 + 1.25 ms.
    makes = iter([2, None])

    def make():
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)))
        kv = PagedKVCache(64, 16, swap_blocks=4, bytes_per_block=2 ** 20, host_link_gbps=2 ** 20 / 1e6)
        return SwapsOutOnce(next(makes)), cost, kv

    r = run_data_parallel([Request(0, 0.0, 16, 3), Request(1, 0.0, 16, 3)], make, 2, RoundRobinRouter(),
                          engine=engine, power=utilisation())
    assert r.counters["swap_out_blocks"] == 1
    t = r.timeline
    mine = (t["instance"] == 0) & (t["time_ms"] >= 13.0 - 1e-9) & (t["time_ms"] < 23.25 - 1e-9)
    rows = sorted(zip(t["time_ms"][mine], t["duration_ms"][mine], t["energy_j"][mine], t["decodes"][mine]))
    assert rows == [(pytest.approx(13.0), pytest.approx(1.0), pytest.approx(112 * 1.0 / 1000), 0),
                    (pytest.approx(14.0), pytest.approx(9.25), pytest.approx(step_j(9.25, 2.21e9, 6e10, 9.25)), 0)]
    assert r.meta["energy"]["instances"][0]["dummy_j"] == pytest.approx(step_j(9.25, 2.21e9, 6e10, 9.25))
    check_energy(r, shared=False)  # (the copies' energy belongs to no request either)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_tail_after_a_run_of_steps_starts_from_its_last_steps_power(engine):
    # Requests 0 and 1 (prompt 16, 40 tokens), one on each rank: a 13 ms step of prefills
    # (experts of (16, 16): 5 ms), then 39 decode steps of 9.25 ms (the fast engine runs them at
    # once), ending at 373.75. The ranks pause until request 2 comes at 2,000. The last step's
    # power on rank 0: a decode over 55 tokens, 2e9 + 1e8 + 55 x 1e7 + 1e8 bytes (2.75 ms) and
    # 6e10 FLOPs (0.6 ms) in 9.25 ms: 40 + 360 x (0.2 + 2.75 / 9.25) W; its tail falls from there
    # to standby (40 + 360 x 0.2 W) -- not from a power worked out with the next step's experts.
    requests = [Request(0, 0.0, 16, 40), Request(1, 0.0, 16, 40), Request(2, 2000.0, 100, 3)]
    r = run_data_parallel(requests, rank(), 2, RoundRobinRouter(), engine=engine, power=utilisation(0.02, 0.05))
    last_w = 40 + 360 * (0.2 + 2.75 / 9.25)
    assert r.meta["energy"]["instances"][0]["tails"][0] == [pytest.approx(373.75), pytest.approx(last_w - 112)]
    check_energy(r)


# -- both engines, conservation ----------------------------------------------------------------------------

SETTINGS = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same_energy(fast, ref) -> None:
    """Per rank: the same busy, idle and dummy energy and the same energy in its timeline rows."""
    a, b = fast.meta["energy"]["instances"], ref.meta["energy"]["instances"]
    for x, y in zip(a, b):
        for key in ("busy_j", "idle_j", "dummy_j", "busy_ms", "peak_w"):
            assert math.isclose(x.get(key, 0.0), y.get(key, 0.0), rel_tol=1e-9, abs_tol=1e-9), (key, x, y)
    for inst in range(len(a)):
        rows = [run.timeline["energy_j"][run.timeline["instance"] == inst].sum() for run in (fast, ref)]
        assert math.isclose(*rows, rel_tol=1e-9, abs_tol=1e-9)


def metered_runs_agreeing(requests, make, ranks: int, make_router, power, **options) -> list:
    """Both engines' runs of ``requests`` on ``ranks`` lockstep ranks (a fresh ``make_router()``
    each) with ``power`` (and ``options`` of :func:`run_data_parallel`, e.g. speculation), checked
    to agree (metrics, energy per rank) and to conserve energy; the runs, fast first."""
    runs = [run_data_parallel(requests, make, ranks, make_router(), engine=engine, power=power, **options)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    same_energy(*runs)
    for run in runs:
        check_energy(run, shared=run.counters["swap_out_blocks"] == 0)
    return runs


@SETTINGS
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=80, all_at_zero=False, priorities=True),
       schedulers(), st.integers(2, 3), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 40),
       st.sampled_from([0.0, 0.02]), st.sampled_from([0.0, 0.005]))
def test_lockstep_energy_agrees_between_engines_and_is_conserved(requests, cfg, ranks, router, cost, spare,
                                                                  standby_s, tail_s):
    """Random arrivals, idle ranks running the dummy, ranks that only swap in a step, pauses with
    every rank idle: both engines draw the same energy per rank and per request, and each run's
    energy is the integral of the power its timeline redraws."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        kv = PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), kv

    runs = metered_runs_agreeing(requests, make, ranks, ROUTERS[router], utilisation(standby_s, tail_s))
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * ranks, kv_blocks=blocks * ranks)
    dummies = runs[1].meta["data_parallel"]["dummy_rank_steps"]
    assert (sum(i.get("dummy_j", 0.0) for i in runs[1].meta["energy"]["instances"]) > 0) == (dummies > 0)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=400, max_output=200, all_at_zero=False), schedulers(),
       st.integers(2, 3), st.integers(0, 20))
def test_roofline_lockstep_energy_agrees_between_engines_and_is_conserved(requests, cfg, ranks, spare):
    """The roofline's work and kernels (host time apart) through the utilisation model as a run
    builds it against each rank's :class:`RankCost`: both engines alike, energy conserved."""
    from schedlab.engine.rank_cost import RankCost

    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // 16) for r in requests)

    def make():
        return ContinuousScheduler(cfg), _qwen(data_parallel=ranks, expert_parallel=True), PagedKVCache(
            need + spare, 16, swap_blocks=64, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)

    def power(cost: RankCost):
        return build_utilisation(UtilisationConfig(standby_s=0.05), PRESETS, cost)

    metered_runs_agreeing(requests, make, ranks, fresh_router, power)


# -- TOML ---------------------------------------------------------------------------------------------------

MOE_PROFILE = "experiments/data/llmservingsim/profiles/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.mark.parametrize("profiled, speculative", [(False, ""), (True, ""), (False, SPECULATIVE)])
def test_lockstep_ranks_with_power_in_toml_run_in_both_engines_and_report_energy_per_token(tmp_path, profiled,
                                                                                          speculative):
    """The roofline's (BASE) and the profiled model's ranks, metered through the run's assembly;
    the roofline's speculating too (each rank's verify passes and drafter)."""
    from pathlib import Path

    base = textwrap.dedent(BASE).replace('name = "dp"', 'name = "dp"\ntimeline = true')
    if profiled:
        profile = Path(__file__).resolve().parents[1] / MOE_PROFILE
        base = base.replace('kind = "roofline"', f'kind = "profiled"\nprofile = "{profile}"')
    path = tmp_path / "exp.toml"
    path.write_text(base + textwrap.dedent(speculative) + textwrap.dedent("""
        [power]
        kind = "utilisation"
        [cluster]
        data_parallel = 2
        expert_parallel = true
    """))
    fast = fast_run_agreeing_with_reference(path)
    e = fast.metrics["energy"]
    tokens = int(fast.requests["generated_tokens"].sum())
    assert e["gpu_j"] > 0 and e["j_per_token"] == pytest.approx(e["gpu_j"] / tokens)
    assert set(e["per_instance"]) == {"0", "1"}
    check_energy(fast)
    dummy = sum(i.get("dummy_j", 0.0) for i in fast.meta["energy"]["instances"])
    assert (dummy > 0) == (fast.meta["data_parallel"]["dummy_rank_steps"] > 0)
    assert bool(fast.metrics.get("speculative", {}).get("drafts")) == bool(speculative)


# -- the host of a deployment -------------------------------------------------------------------------------


@pytest.mark.parametrize("model, layout, hosts", [
    ("qwen3-30b-a3b", "data_parallel = 2\nexpert_parallel = true", 1),  # one deployment, its ranks stepping together
    ("qwen3-30b-a3b", "data_parallel = 2\nexpert_parallel = true\ninstances = 2", 2),  # two of them
    ("llama-3.1-8b", "data_parallel = 2", 1),                           # a dense model's ranks: one server
    ("qwen3-30b-a3b", "instances = 2", 2),                              # two instances, two hosts
])
def test_a_data_parallel_deployment_has_one_host(tmp_path, model, layout, hosts):
    """host_idle_w and host_busy_w are a deployment's -- one vLLM server on one host, as a
    tensor-parallel or pipelined instance is -- not each data-parallel rank's: over the window
    the hosts draw 100 W each, and 30 W more while their ranks run (ranks stepping together run
    alike; a dense model's, independent, each add half). Each rank's record carries half."""
    text = textwrap.dedent(BASE).replace("qwen3-30b-a3b", model)
    path = tmp_path / "exp.toml"
    path.write_text(text + "[power]\nkind = \"utilisation\"\nhost_idle_w = 100\nhost_busy_w = 30\n[cluster]\n"
                    + layout + "\n")
    fast = fast_run_agreeing_with_reference(path)
    e, record = fast.metrics["energy"], fast.meta["energy"]
    ranks = 2 if "data_parallel" in layout else 1
    insts = record["instances"]
    assert [(i["host_idle_w"], i["host_busy_w"]) for i in insts] == [(100.0 / ranks, 30.0 / ranks)] * len(insts)
    if "expert_parallel" in layout:  # a deployment's ranks step together: busy alike
        for d in range(hosts):
            assert insts[2 * d]["busy_ms"] == insts[2 * d + 1]["busy_ms"]
    busy_s = sum(i["busy_ms"] for i in insts) / ranks / 1e3  # (each deployment's, summed)
    assert e["host_j"] == pytest.approx(100 * hosts * e["window_ms"] / 1e3 + 30 * busy_s)
    assert record["model"].get("host_ranks", 1) == ranks


def test_a_rank_whose_cost_model_keeps_no_layout_is_refused_a_host():
    """A lockstep rank's power model must know how many ranks share its host; a cost model that
    keeps no ``parallelism`` cannot say: refused when the host draws power, fine when it does not."""
    from schedlab.engine.rank_cost import RankCost
    from schedlab.errors import ConfigError
    from schedlab_plugins.power.common import host_ranks

    rank = RankCost(LinearCostModel(LinearConfig()))
    assert host_ranks(rank, UtilisationConfig()) == 1
    with pytest.raises(ConfigError, match=r"host_idle_w, host_busy_w: a data-parallel deployment's ranks share one "
                                          r"host, but the cost model LinearCostModel does not say how many"):
        host_ranks(rank, UtilisationConfig(host_idle_w=100.0))
    roof = RooflineCostModel(PRESETS.model("qwen3-30b-a3b"), PRESETS.gpu("h100-80gb"),
                             RooflineConfig(model="qwen3-30b-a3b", gpu="h100-80gb"),
                             parallelism=Parallelism(data_parallel=4, expert_parallel=True))
    assert host_ranks(RankCost(roof), UtilisationConfig(host_idle_w=100.0)) == 4
