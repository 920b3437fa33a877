"""Data-parallel ranks of a MoE deployment stepping together (issue 19.2): hand-computed steps,
vLLM's DP load balancer, the fast engine against the reference engine, the rules every run
keeps, the cost models' parts and the TOML that declares the layout.

Hand-computed cases use :class:`LinearParallelCost` with the ``linear`` model's 0.5 ms per
prompt token and 8 ms per decode step as a rank's part, and experts costing 1 ms + 0.0625 ms
per token of all ranks + 0.125 ms per token of the largest rank (its dispatch and combine). A
rank with nothing to do runs a dummy batch: one decode, 8 ms.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import attrs

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.parallelism import Parallelism
from schedlab.protocols import Batch
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import (
    RecordingRouter, blocks_for_largest, check_clients_gave_up, check_run, compare_runs, dyadic_linear_costs,
    examples, fast_run_agreeing_with_reference, requests_lists, run_engine, small_closed_loop,
)
from schedlab.testing.parallel import LinearParallelCost, run_data_parallel
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixKVCache
from schedlab_plugins.routers import (DataParallelRouter, DataParallelRouterConfig, LeastOutstandingRouter,
                                      RoundRobinRouter)
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, SglangConfig, SglangScheduler
from test_sglang import assert_only_turned_away, rejections_for, sglang_configs, sglang_pool, whole_pages

ENGINES = ("fast", "reference")
SETTINGS = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rank(blocks: int = 64, *, max_num_seqs: int = 4, budget: int = 256, context_ms: float = 0.0, block_size: int = 16):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                                         allocation="grow", chunked_prefill=True))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0,
                                                               per_context_token_ms=context_ms)))
        return scheduler, cost, PagedKVCache(blocks, block_size)
    return make


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def fresh_router():
    return DataParallelRouter(DataParallelRouterConfig(stats_interval_ms=0.0))


# -- hand-computed steps -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_an_idle_rank_runs_dummy_batches_and_the_step_waits_for_the_experts(engine):
    # One request (prompt 16, 2 tokens) on rank 0; rank 1 has nothing and runs a dummy batch.
    # Step 1: rank 0 prefills 16 tokens (8 ms), rank 1's dummy 8 ms; experts of (16, 1) tokens:
    #         1 + 0.0625 x 17 + 0.125 x 16 = 4.0625 -> first token at 12.0625.
    # Step 2: a decode (8 ms) beside a dummy (8 ms); experts of (1, 1): 1 + 0.125 + 0.125 = 1.25
    #         -> finished at 12.0625 + 9.25 = 21.3125.
    r = run_data_parallel([Request(0, 0.0, 16, 2)], rank(), 2, RoundRobinRouter(), engine=engine)
    assert by_id(r, "instance")[0] == 0
    assert by_id(r, "first_token_ms")[0] == 12.0625
    assert by_id(r, "finish_ms")[0] == 21.3125
    assert r.meta["data_parallel"] == {"ranks": 2, "steps": 2, "dummy_rank_steps": 2, "experts_ms": 5.3125}
    assert r.counters["busy_ms"] == 21.3125  # only rank 0 served requests; dummy steps are not its busy time


@pytest.mark.parametrize("engine", ENGINES)
def test_the_slowest_rank_sets_the_step_for_every_rank(engine):
    # Rank 0 prefills 32 tokens (16 ms), rank 1 prefills 8 (4 ms); experts of (32, 8):
    # 1 + 0.0625 x 40 + 0.125 x 32 = 7.5 -> both first tokens at 23.5, though rank 1's own
    # work took 4 ms. Then both decode (8 ms each) with experts of (1, 1) = 1.25 -> 32.75.
    requests = [Request(0, 0.0, 32, 2), Request(1, 0.0, 8, 2)]
    r = run_data_parallel(requests, rank(), 2, RoundRobinRouter(), engine=engine)
    assert by_id(r, "instance") == {0: 0, 1: 1}
    assert by_id(r, "first_token_ms") == {0: 23.5, 1: 23.5}
    assert by_id(r, "finish_ms") == {0: 32.75, 1: 32.75}
    assert r.meta["data_parallel"]["dummy_rank_steps"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_ranks_pause_when_none_has_work(engine):
    # r0 finishes at 21.3125 (as above); r1 arrives at 100 to the idle deployment, which runs
    # no steps in between: its first token at 100 + 12.0625.
    requests = [Request(0, 0.0, 16, 2), Request(1, 100.0, 16, 2)]
    r = run_data_parallel(requests, rank(), 2, fresh_router(), engine=engine)
    assert by_id(r, "first_token_ms")[1] == 112.0625
    assert r.meta["data_parallel"]["steps"] == 4


class Placed:
    """Sends request i to rank ``places[i]``."""

    def __init__(self, places):
        self.places = places

    def route(self, request, instances):
        return self.places[request.id]


def test_a_decode_run_ends_where_another_ranks_step_overtakes():
    """Rank 0 decodes one context of 151 tokens, rank 1 three of 2; each step's rank part grows
    by 1/64 ms per decode, so rank 1's part (three decodes) overtakes rank 0's after 73 steps.
    The fast engine's bulk runs must end there, and agree with the step-by-step engine."""
    requests = [Request(0, 0.0, 150, 120), Request(1, 0.0, 1, 120), Request(2, 0.0, 1, 120), Request(3, 0.0, 1, 120)]
    make = rank(200, budget=1024, context_ms=2.0 ** -6)
    fast, ref = (run_data_parallel(requests, make, 2, Placed([0, 1, 1, 1]), engine=engine) for engine in ENGINES)
    compare_runs(fast, ref, rel=1e-12)
    assert fast.meta["events"] < ref.meta["events"]
    # the step times, summed independently: rank 0's part 8 + c/64 (its one context c), rank 1's
    # 8 + (its three contexts)/64, whichever is larger, plus the experts of (1, 3) tokens
    c0, c1 = 151, 3 * 2
    t = 75.0 + 1 + 0.0625 * 153 + 0.125 * 150  # step 1: prompts of 150 and 3 x 1 tokens
    for _ in range(119):
        t += max(8 + c0 / 64, 8 + c1 / 64) + 1 + 0.0625 * 4 + 0.125 * 3
        c0, c1 = c0 + 1, c1 + 3
    assert by_id(fast, "finish_ms") == {i: t for i in range(4)}


# -- vLLM's DP load balancer --------------------------------------------------------------------------------


class View:
    def __init__(self, waiting, running, index):
        self.waiting, self.running, self.index = waiting, running, index


def ranks(*counts) -> list:
    """Views of ranks 0, 1, ... with these (waiting, running) counts."""
    return [View(waiting, running, i) for i, (waiting, running) in enumerate(counts)]


def test_the_dp_load_balancer_scores_waiting_four_times_running_and_counts_what_it_sent():
    router = DataParallelRouter(DataParallelRouterConfig(rule="v0.19"))  # a 100 ms snapshot
    views = ranks((1, 0), (0, 3))  # scores 4 and 3
    assert router.route(Request(0, 0.0, 1, 1), views) == 1
    # before the next snapshot the front end counts the request it sent as waiting: 4 vs 7
    assert router.route(Request(1, 50.0, 1, 1), ranks((9, 9), (9, 9))) == 0
    assert router.route(Request(2, 60.0, 1, 1), views) == 1   # 8 vs 7: the snapshot is still the same
    # 100 ms after the snapshot a new one is read: 0 vs 1 -> rank 0 (ties would go to the lowest)
    assert router.route(Request(3, 100.0, 1, 1), ranks((0, 0), (0, 1))) == 0
    assert router.route(Request(4, 100.0, 1, 1), ranks((0, 0), (0, 1))) == 1   # 4 vs 1
    assert router.route(Request(5, 100.0, 1, 1), ranks((0, 0), (0, 1))) == 0   # 4 vs 5


def test_the_dp_load_balancers_snapshot_follows_the_pool_an_autoscaler_changes():
    """The snapshot is of the instances it was read from: a pool that loses an instance, gains
    one or is renumbered within the 100 ms is read again at once (before: the old per-position
    counts, and an answer naming a position the pool no longer has)."""
    router = DataParallelRouter(DataParallelRouterConfig(rule="v0.19"))
    assert router.route(Request(0, 0.0, 1, 1), [View(0, 9, 0), View(0, 9, 1), View(0, 0, 2)]) == 2  # 9, 9, 0
    # 10 ms later instance 2 has drained out: positions 0 and 1 only, read afresh (3 vs 2; the
    # old snapshot, 9, 9, 4, answered 2)
    assert router.route(Request(1, 10.0, 1, 1), [View(0, 3, 0), View(0, 2, 1)]) == 1
    # the same size, but instance 3 took position 1: read again, its own counts (2 vs 0)
    assert router.route(Request(2, 20.0, 1, 1), [View(0, 2, 0), View(0, 0, 3)]) == 1
    # the same pool within the 100 ms: the snapshot stands, with what was sent (2 vs 4)
    assert router.route(Request(3, 30.0, 1, 1), [View(9, 9, 0), View(9, 9, 3)]) == 0
    # a new instance joins: seen at once (its 0 against 6 and 4)
    assert router.route(Request(4, 40.0, 1, 1), [View(1, 2, 0), View(1, 0, 3), View(0, 0, 4)]) == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_burst_is_spread_over_the_ranks_before_the_next_snapshot(engine):
    requests = [Request(i, 0.0, 8, 4) for i in range(6)]
    r = run_data_parallel(requests, rank(), 3, DataParallelRouter(), engine=engine)
    assert sorted(by_id(r, "instance").values()) == [0, 0, 1, 1, 2, 2]


# -- the fast engine against the reference engine; the rules of every run ---------------------------------


@st.composite
def schedulers(draw):
    max_seqs = draw(st.integers(1, 5))
    allocation = draw(st.sampled_from(["reserve", "grow"]))
    preemption = draw(st.sampled_from(["recompute", "swap"])) if allocation == "grow" else "recompute"
    return ContinuousConfig(max_num_seqs=max_seqs, allocation=allocation, preemption=preemption,
                            max_num_batched_tokens=draw(st.integers(max(max_seqs, 8), 96)),
                            chunked_prefill=draw(st.booleans()),
                            running_order=draw(st.sampled_from(["admission", "decodes_first"])),
                            policy=draw(st.sampled_from(["fcfs", "priority"])))


ROUTERS = {"vllm_dp": lambda: DataParallelRouter(DataParallelRouterConfig(stats_interval_ms=16.0)),
           "fresh": fresh_router, "round_robin": RoundRobinRouter, "least_outstanding": LeastOutstandingRouter}


@SETTINGS
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=80, all_at_zero=False, priorities=True,
                      prefix_groups=2),
       schedulers(), st.integers(2, 3), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 40),
       st.integers(1, 8), st.booleans(), st.booleans())
def test_lockstep_ranks_agree_between_engines_and_keep_the_rules(requests, cfg, ranks, router, cost, spare,
                                                                 block_size, prefix, ahead):
    """Random arrivals, chunked or whole prompts, recompute preemptions on caches barely big
    enough, ranks planning ahead (asynchronous scheduling; finished requests holding their slots
    as victims): both engines give the same timestamps, counters and steps; every request is
    served once with its tokens, never before it arrived, within the caches and slots."""
    if ahead and cfg.preemption == "recompute":
        cfg = attrs.evolve(cfg, async_scheduling=True)
    need = blocks_for_largest(requests, block_size)
    blocks = need + spare

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, block_size, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), kv

    runs = [run_data_parallel(requests, make, ranks, ROUTERS[router](), engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].meta["data_parallel"] == runs[1].meta["data_parallel"]
    assert runs[0].meta["events"] <= runs[1].meta["events"]
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * ranks, kv_blocks=blocks * ranks)
    assert all(kv.num_used_blocks() == 0 for run in runs for kv in run.meta["kvs"])


# Found by Hypothesis: rank 1's plan made ahead at 183.78 came out empty (its cache full, the
# request that finished in the step in flight still holding its blocks), so it ran a dummy
# batch at 190.72 and had to plan the step after at its own time; the fast engine ran the
# ranks two steps in bulk from there, rank 1 idle in both.
@example([Request(i, t, p, o, max_tokens=m, prefix_group=g, prefix_tokens=pt) for i, (t, p, o, m, g, pt) in enumerate([
    (0.0, 30, 2, 30, 1, 1), (0.125, 5, 24, None, None, 0), (0.125, 1, 1, None, None, 0), (11.0, 1, 1, 1, None, 0),
    (11.0, 1, 1, 1, None, 0), (23.375, 13, 4, None, 0, 1), (23.375, 22, 16, None, None, 0), (24.75, 1, 1, None, None, 0),
    (24.75, 1, 1, None, None, 0), (24.75, 1, 1, 1, None, 0), (29.875, 1, 1, 1, None, 0), (142.875, 1, 6, None, None, 0),
    (156.25, 1, 1, None, None, 0), (159.875, 1, 1, 1, None, 0)])],
    SglangConfig(max_running_requests=3, max_prefill_tokens=16, chunked_prefill_size=0, init_new_token_ratio=0.0,
                 min_new_token_ratio_factor=0.14, new_token_ratio_decay_steps=1, clip_max_new_tokens=8,
                 retract_decode_steps=0, num_reserved_decode_tokens=512, overlap_schedule=True, context_length=0),
    2, "fresh", LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=4.0, per_seq_ms=0.25,
                             per_context_token_ms=0.015625), 2, 1, False)
# Found by Hypothesis: SGLang's running time limit (3 ms) aborted request 4 on rank 0 at 58.875, as request 7
# arrived; the fast engine's data-parallel driver settled the ranks' aborts before routing only for clients that
# give up, so its router still counted request 4 running and sent request 7 to rank 1.
@example([Request(i, t, p, o) for i, (t, p, o) in enumerate([
    (0.0, 1, 1), (0.0, 1, 1), (2.125, 18, 3), (2.25, 35, 2), (2.25, 15, 2), (2.25, 1, 1), (47.375, 1, 1),
    (58.875, 1, 1)])],
    SglangConfig(max_running_requests=1, max_prefill_tokens=16, chunked_prefill_size=0, init_new_token_ratio=0.0,
                 min_new_token_ratio_factor=0.14, new_token_ratio_decay_steps=1, clip_max_new_tokens=8,
                 retract_decode_steps=0, num_reserved_decode_tokens=512, overlap_schedule=True,
                 running_timeout_ms=3.0, context_length=0),
    2, "fresh", LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0, per_seq_ms=0.25,
                             per_context_token_ms=0.015625), 0, 1, False)
@SETTINGS
@given(requests_lists(min_size=1, max_size=14, max_prompt=40, max_output=30, all_at_zero=False, prefix_groups=2),
       sglang_configs(), st.integers(2, 3), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 12),
       st.integers(1, 4), st.booleans())
def test_sglang_ranks_agree_between_engines_with_and_without_overlap(requests, cfg, ranks, router, cost, spare,
                                                                     block_size, radix):
    """SGLang's scheduler on lockstep ranks (its DP attention beside expert parallelism), its
    overlap scheduler drawn: tight caches (retractions, discarded tokens, decodes after an EOS),
    both engines give the same timestamps, counters and steps, within the rules."""
    cfg = whole_pages(cfg, block_size)
    # (a pool of 6 tokens more than the longest prompt: SGLang refuses a prompt of pool - 6 or more)
    blocks = sglang_pool(requests, block_size, spare, prefix_cache=radix)

    def make():
        kv = (RadixKVCache if radix else PagedKVCache)(blocks, block_size)
        return SglangScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), kv

    runs = [run_data_parallel(requests, make, ranks, ROUTERS[router](), engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests, max_running=cfg.max_running_requests * ranks, kv_blocks=blocks * ranks,
              rejections=rejections_for(cfg))
    assert_only_turned_away(runs[0], cfg)


@SETTINGS
@given(requests_lists(min_size=1, max_size=12, max_prompt=40, max_output=30, all_at_zero=False, prefix_groups=2),
       sglang_configs(), st.integers(1, 3), dyadic_linear_costs(), st.integers(0, 12), st.booleans(),
       st.sampled_from([5.0, 10.5, 20.25, 40.0]))
def test_sglang_ranks_with_clients_giving_up_agree_and_a_lone_one_drops_them_as_one_engine(requests, cfg, ranks, cost,
                                                                                          spare, radix, timeout):
    """SGLang's ranks with clients giving up, its overlap loop drawn: both engines alike, every
    request served or aborted once. Each rank reads aborts as SGLang's own loop does -- at the
    loop top, when the batch in flight has just started (a running request then runs once more:
    ``to_finish``) -- so a lone rank gives the rows of one colocated instance with the same
    costs, wherever it ran no dummy step."""
    blocks = sglang_pool(requests, 4, spare, prefix_cache=radix)

    def make():
        kv = (RadixKVCache if radix else PagedKVCache)(blocks, 4)
        return SglangScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), kv

    runs = [run_data_parallel(requests, make, ranks, ROUTERS["round_robin"]() if ranks > 1 else None, engine=engine,
                              client_side=client_side(timeout)) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests, max_running=cfg.max_running_requests * ranks, kv_blocks=blocks * ranks,
              rejections=rejections_for(cfg))
    if ranks == 1 and not runs[0].meta["data_parallel"]["dummy_rank_steps"]:
        scheduler, parallel_cost, kv = make()
        one = run_engine(requests, scheduler, parallel_cost, kv, client_side=client_side(timeout))
        for column in ("first_scheduled_ms", "first_token_ms", "finish_ms", "aborted", "generated_tokens"):
            assert runs[0].requests[column].tolist() == one.requests[column].tolist(), column


def client_side(timeout_ms: float | None, network_ms: float = 0.0, workers: int = 0, request_ms: float = 0.0):
    from schedlab.frontend import ClientConfig, ClientSide, FrontendConfig

    front = FrontendConfig(network_ms=network_ms, request_ms=request_ms, tokenize_ms_per_token=0.0, token_ms=0.0,
                           workers=workers)
    return ClientSide(front, ClientConfig(timeout_ms=timeout_ms) if timeout_ms is not None else None)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(5, 24), st.integers(2, 3), st.integers(0, 5), st.sampled_from([None, 15.0, 60.0]))
def test_closed_loops_over_lockstep_ranks_agree_and_conserve(clients, num_requests, ranks, seed, timeout):
    """Clients send their next request when the last is answered, or when they give up on it."""
    make_workload = small_closed_loop(clients, num_requests)
    side = client_side(timeout, 0.5) if timeout is not None else None
    runs = []
    for engine in ENGINES:
        workload = make_workload()
        runs.append(run_data_parallel(workload.requests(seed), rank(48), ranks, fresh_router(), engine=engine,
                                      workload=workload, client_side=side))
    compare_runs(*runs, rel=1e-12)
    assert runs[0].requests["id"].size == num_requests and runs[0].requests["rejected"].sum() == 0
    assert all(kv.num_used_blocks() == 0 for run in runs for kv in run.meta["kvs"])


# -- clients that give up ----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_aborts_a_request_whose_client_gave_up_during_a_step(engine):
    # As in the first case: steps end at 12.0625 (prefill beside a dummy) and 21.3125 (a decode
    # beside a dummy). The client gives up at 20, during the decode step: as vLLM's engine core
    # (EngineCore.step), rank 0 aborts the request after that step, before its output, so it
    # leaves at 21.3125 with 1 of its 10 tokens. No rank has work then: the ranks pause until
    # request 1 comes at 100; its client gives up at 120, during its second step (its last
    # token's, due at 121.3125): aborted too, with its first token only.
    side = client_side(timeout_ms=20.0)
    r = run_data_parallel([Request(0, 0.0, 16, 10), Request(1, 100.0, 16, 2)], rank(), 2, RoundRobinRouter(),
                          engine=engine, client_side=side)
    assert by_id(r, "aborted") == {0: 1, 1: 1}
    assert by_id(r, "finish_ms") == {0: 21.3125, 1: 121.3125}
    assert by_id(r, "generated_tokens") == {0: 1, 1: 1}
    assert r.meta["data_parallel"]["steps"] == 4
    assert r.metrics["makespan_ms"] == 121.3125
    later = run_data_parallel([Request(0, 0.0, 16, 10), Request(1, 100.0, 16, 2)], rank(), 2, RoundRobinRouter(),
                              engine=engine, client_side=client_side(timeout_ms=21.3125))
    # (at a step's end itself the abort comes after its output, as an arrival would)
    assert by_id(later, "generated_tokens") == {0: 2, 1: 2} and by_id(later, "aborted") == {0: 1, 1: 0}


@SETTINGS
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=80, all_at_zero=False, prefix_groups=2),
       schedulers(), st.integers(2, 3), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 40),
       st.integers(1, 160), st.sampled_from([0.0, 0.5, 2.0]), st.integers(0, 2), st.sampled_from([0.0, 1.5]))
def test_clients_that_give_up_on_lockstep_ranks_agree_between_engines_and_conserve(requests, cfg, ranks, router, cost,
                                                                                   spare, timeout, network, workers,
                                                                                   request_ms):
    """Through an API server (0-2 handlers) with clients giving up: both engines alike, every
    request served, rejected or aborted once, every block back."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        return (ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)),
                PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3))

    side = client_side(timeout + network, network, workers, request_ms)
    runs = [run_data_parallel(requests, make, ranks, ROUTERS[router](), engine=engine, client_side=side)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].meta["data_parallel"] == runs[1].meta["data_parallel"]
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * ranks, kv_blocks=blocks * ranks)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=2, max_size=14, max_prompt=48, max_output=12), st.integers(2, 3), st.integers(1, 3),
       dyadic_linear_costs())
def test_the_router_sees_each_rank_as_it_is_at_the_arrival(requests, ranks, max_num_seqs, cost):
    """The outstanding count a router reads is the number of requests routed to that rank
    earlier that finish after the arrival (a step in progress still holds its requests)."""
    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=32)),
                LinearParallelCost(LinearCostModel(cost)), PagedKVCache(64, 4))

    for engine in ENGINES:
        spy = RecordingRouter(LeastOutstandingRouter())
        result = run_data_parallel(requests, make, ranks, spy, engine=engine)
        place, finish = by_id(result, "instance"), by_id(result, "finish_ms")
        routed: list[int] = []
        for rid, seen in spy.seen:
            t = requests[rid].arrival_ms
            expected = [sum(1 for j in routed if place[j] == i and finish[j] > t) for i in range(ranks)]
            assert seen == expected, (engine, rid)
            routed.append(rid)


# -- the cost models' parts -------------------------------------------------------------------------------


def _presets():
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog

    return Presets.from_catalog(load_catalog(entry_points=False))


def _roofline(cuda_graphs: bool = True, cuda_graph_max_tokens: int = 512, **layout):
    from schedlab.parallelism import Parallelism
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel

    presets = _presets()
    config = RooflineConfig(model="qwen3-30b-a3b", gpu="rtx-pro-6000-server", cuda_graphs=cuda_graphs,
                            cuda_graph_max_tokens=cuda_graph_max_tokens)
    return RooflineCostModel(presets.model("qwen3-30b-a3b"), presets.gpu("rtx-pro-6000-server"), config,
                             parallelism=Parallelism(**layout))


def test_the_experts_of_a_step_follow_vllms_dispatch_and_the_busiest_gpu():
    """Qwen3-30B-A3B (128 experts, top 8, hidden 2048, 48 layers) on 2 ranks: each GPU holds
    64 experts; 200 tokens in all make 1600 (token, expert) pairs, 800 per GPU evenly, 800 /
    0.8 = 1000 on the busiest at balancedness 0.8. Every layer all-gathers 2 x the largest
    rank's tokens x (2048 + 128) x 2 bytes and reduce-scatters 2 x largest x 2048 x 2 bytes.
    Ranks of up to 512 tokens (the CUDA graph limit) are padded to the largest, rows that go
    through the experts too: 150 + 50 tokens compute 300 tokens' pairs; 600 + 50 (past the
    graphs) their own 650, as in eager mode."""
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES, Collectives

    even = _roofline(data_parallel=2, expert_parallel=True).expert_layers
    skewed = _roofline(data_parallel=2, expert_parallel=True, expert_balancedness=0.8).expert_layers
    pairs, experts = even.busiest_gpu(200)
    assert pairs * 8 == pytest.approx(800) and experts == pytest.approx(64 * (1 - (63 / 64) ** 800))
    assert skewed.busiest_gpu(200)[0] * 8 == pytest.approx(1000)
    # at most every token's pairs fit on one GPU: 8 each (it holds 64 experts), at a balancedness of
    # 1 / 2; below it no router goes (0.01 was taken and clamped in silence)
    assert _roofline(data_parallel=2, expert_parallel=True, expert_balancedness=0.5).expert_layers.busiest_gpu(10)[0] \
        == pytest.approx(10)
    from schedlab.parallelism import LayoutError

    with pytest.raises(LayoutError, match=r"^expert_balancedness = 0.01 is below 1 / 2 \(0.5\), every token's "
                                          r"experts on one of the 2 GPUs"):
        _roofline(data_parallel=2, expert_parallel=True, expert_balancedness=0.01)
    c = Collectives(TOPOLOGIES["pcie-gen5-host"], 2)
    comm = 48 * (c.all_gather_ms(2 * 150 * 2176 * 2) + c.reduce_scatter_ms(2 * 150 * 2048 * 2))
    assert even.step_ms((150, 50)) == pytest.approx(comm + even._compute(*even.busiest_gpu(300)), rel=1e-12)
    assert even.padded((150, 50)) == (150, 150) and even.padded((600, 50)) == (600, 50)
    comm = 48 * (c.all_gather_ms(2 * 600 * 2176 * 2) + c.reduce_scatter_ms(2 * 600 * 2048 * 2))
    assert even.step_ms((600, 50)) == pytest.approx(comm + even._compute(*even.busiest_gpu(650)), rel=1e-12)
    eager = _roofline(data_parallel=2, expert_parallel=True, cuda_graphs=False).expert_layers
    comm = 48 * (c.all_gather_ms(2 * 150 * 2176 * 2) + c.reduce_scatter_ms(2 * 150 * 2048 * 2))
    assert eager.padded((150, 50)) == (150, 50)
    assert eager.step_ms((150, 50)) == pytest.approx(comm + even._compute(*even.busiest_gpu(200)), rel=1e-12)
    # a graph limit of 128 (vLLM: min(2 x max_num_seqs, 512, max_num_batched_tokens) at 64 sequences)
    small = _roofline(data_parallel=2, expert_parallel=True, cuda_graph_max_tokens=128).expert_layers
    assert small.padded((150, 50)) == (150, 50) and small.padded((128, 50)) == (128, 128)
    assert skewed.step_ms((150, 50)) > even.step_ms((150, 50))
    # 128 experts over 3 GPUs: vLLM gives two of them 43, one 42; the busiest gets 43/128 of the pairs
    three = _roofline(data_parallel=3, expert_parallel=True).expert_layers
    assert three.local_experts == 43 and three.busiest_gpu(300)[0] * 8 == pytest.approx(300 * 8 * 43 / 128)
    assert even.step_ms((150, 50)) > even.step_ms((100, 100))  # padded to the largest rank


def test_a_rank_part_is_the_iteration_without_its_experts_and_ep_halves_each_gpus_expert_reads():
    from schedlab.protocols import Batch

    single = _roofline()
    dp = _roofline(data_parallel=2, expert_parallel=True)
    batch = Batch(num_decode=64, decode_context_tokens=64 * 1000)
    assert dp.rank_ms(batch) == pytest.approx(single.iteration_ms(batch) - single._experts_ms(64), rel=1e-12)
    assert dp.rank_ms(batch) < dp.iteration_ms(batch)
    # decode is memory-bound: 128 tokens over two GPUs read about half the experts each, so a
    # step of 64 + 64 decodes spends less in the experts than one GPU serving 64 alone
    assert dp.expert_layers._compute(*dp.expert_layers.busiest_gpu(128)) < single._experts_ms(64)
    assert single.experts_ms((1,)) is None  # no data parallelism: no lockstep experts


def test_the_profiled_experts_read_the_tp1_table_at_a_gpus_share():
    from pathlib import Path

    from schedlab.parallelism import Parallelism
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES
    from schedlab_plugins.cost_models.profile_bundle import ProfileBundle
    from schedlab_plugins.cost_models.profiled import ProfiledConfig, ProfiledCostModel

    root = (Path(__file__).resolve().parents[1] / "experiments" / "data" / "llmservingsim" / "profiles"
            / "RTXPRO6000" / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16")
    bundle = ProfileBundle(root, 1)
    model = _presets().model("qwen3-30b-a3b")
    config = ProfiledConfig(profile=str(root), model="qwen3-30b-a3b")
    cost = ProfiledCostModel(bundle, model, config, topology=TOPOLOGIES["pcie-gen5-host"],
                             parallelism=Parallelism(data_parallel=2, expert_parallel=True))
    layers = cost.expert_layers
    # 256 tokens: 2048 pairs, 1024 per GPU = the table's 128 tokens; 64 experts all hit
    pairs, experts = layers.busiest_gpu(256)
    assert pairs == pytest.approx(128) and experts == pytest.approx(64, abs=1e-4)
    assert layers._compute(pairs, experts) == pytest.approx(48 * bundle.moe(128, 64), rel=1e-5)
    # one token: 4 pairs on a GPU, about 4 experts read: half the table's one-token read of 8
    p1, e1 = layers.busiest_gpu(1)
    assert layers._compute(p1, e1) == pytest.approx(48 * bundle.moe(1, 8) * e1 / 8)


def test_kv_sizing_keeps_the_dense_weights_and_a_share_of_the_experts_on_each_rank():
    from schedlab.capacity import GIB, size_kv_cache
    from schedlab.parallelism import Parallelism

    presets = _presets()
    model, gpu = presets.model("qwen3-30b-a3b"), presets.gpu("rtx-pro-6000-server")
    alone = size_kv_cache(model, gpu)
    dp = size_kv_cache(model, gpu, parallelism=Parallelism(data_parallel=2, expert_parallel=True))
    experts = model.expert_params * model.num_experts * model.dtype_bytes
    assert dp.weight_bytes == pytest.approx(alone.weight_bytes - experts / 2, abs=1)
    assert dp.num_blocks == (dp.usable_bytes - dp.weight_bytes - dp.reserve_bytes) // dp.bytes_per_block
    assert dp.expert_gpus == 2 and alone.expert_gpus == 1
    assert (dp.num_blocks - alone.num_blocks) * dp.bytes_per_block == pytest.approx(experts / 2, abs=dp.bytes_per_block)
    assert experts / GIB > 50  # the experts are most of the 30.5B parameters


# -- TOML ---------------------------------------------------------------------------------------------------

BASE = """
    [experiment]
    name = "dp"
    [workload]
    kind = "synthetic"
    num_requests = 40
    rate = 40
    prompt = {dist = "uniform", low = 20, high = 600}
    output = {dist = "uniform", low = 2, high = 60}
    [scheduler]
    kind = "vllm"
    max_num_seqs = 32
    max_num_batched_tokens = 1024
    [kv_cache]
    kind = "paged"
    model = "qwen3-30b-a3b"
    gpu = "rtx-pro-6000-server"
    [cost_model]
    kind = "roofline"
    model = "qwen3-30b-a3b"
    gpu = "rtx-pro-6000-server"
"""

#: speculative decoding with an EAGLE-style drafter (a small model on the ranks' GPU)
SPECULATIVE = """
    [speculative]
    method = "eagle"
    num_speculative_tokens = 3
    acceptance_rate = 0.7
    draft = {kind = "roofline", model = "llama-3.2-1b", gpu = "rtx-pro-6000-server"}
"""


def write(tmp_path, text: str):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + textwrap.dedent(text))
    return path


def test_a_data_parallel_deployment_in_toml_runs_in_both_engines_and_counts_its_gpus(tmp_path):
    path = write(tmp_path, """
        [cluster]
        data_parallel = 2
        expert_parallel = true
    """)
    fast = fast_run_agreeing_with_reference(path)
    assert fast.metrics["gpus"] == 2 and fast.meta["instances"] == 2
    assert fast.meta["parallelism"]["data_parallel"] == 2
    assert fast.meta["data_parallel"]["steps"] > 0
    assert fast.meta["kv_cache"]["expert_gpus"] == 2
    assert set(fast.requests["instance"].tolist()) == {0, 1}


def test_a_data_parallel_deployment_serves_through_the_api_server_and_drops_abandoned_requests(tmp_path):
    # 40 requests at 40/s on two ranks; clients give up after 300 ms (the longer answers).
    path = write(tmp_path, """
        [cluster]
        data_parallel = 2
        expert_parallel = true
        [frontend]
        [client]
        timeout_ms = 300
    """)
    check_clients_gave_up(fast_run_agreeing_with_reference(path), 300, 40)


def dense_ranks_and_instances(tmp_path, extra: str = "", overrides=()):
    """The dense model as data_parallel = 2 and as 2 instances behind vLLM's DP balancer."""
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE.replace("qwen3-30b-a3b", "llama-3.1-8b") + extra) + textwrap.dedent("""
        [[runs]]
        name = "dp"
        cluster = {data_parallel = 2}
        [[runs]]
        name = "instances"
        cluster = {instances = 2, router = {kind = "vllm_dp"}}
    """))
    runs = {r.name: r for r in run_experiment(load(path, list(overrides))).all_runs()}
    return runs["dp"], runs["instances"]


@pytest.mark.parametrize("speculative", ["", SPECULATIVE])
def test_a_dense_models_data_parallel_ranks_are_instances_behind_the_dp_balancer(tmp_path, speculative):
    """(With ``[speculative]`` too: each rank drafts and verifies as the instance would.)"""
    dp, instances = dense_ranks_and_instances(tmp_path, speculative)
    assert "data_parallel" not in dp.meta
    assert bool(dp.metrics.get("speculative", {}).get("drafts")) == bool(speculative)
    np.testing.assert_array_equal(dp.requests["finish_ms"], instances.requests["finish_ms"])


def test_a_dense_models_data_parallel_ranks_are_metered_as_instances(tmp_path):
    """Independent ranks draw what the same instances behind the balancer draw (ranks that step
    together: ``test_data_parallel_energy.py``)."""
    from schedlab.testing import check_energy

    dp, instances = dense_ranks_and_instances(tmp_path, '\n[power]\nkind = "utilisation"\n',
                                              ["experiment.timeline=true"])
    assert dp.metrics["energy"]["gpu_j"] > 0
    assert dp.metrics["energy"]["gpu_j"] == pytest.approx(instances.metrics["energy"]["gpu_j"], rel=1e-12)
    check_energy(dp)


def test_power_is_refused_for_cost_models_that_do_not_split_a_ranks_work(tmp_path, monkeypatch):
    """(Pipelines, once refused here, are metered: ``test_pipeline_energy.py``.)"""
    from schedlab_plugins.cost_models import RooflineCostModel

    lockstep = write(tmp_path, '[power]\nkind = "utilisation"\n[cluster]\ndata_parallel = 2\n')
    load(lockstep)  # the roofline says a rank's work
    monkeypatch.delattr(RooflineCostModel, "rank_work")
    with pytest.raises(ConfigError, match=r"\[power\]: RooflineCostModel does not say the work of data-parallel "
                                          r"ranks stepping together \(it needs rank_work and experts_work"):
        load(lockstep)


@pytest.mark.parametrize("cluster, message", [
    ("expert_parallel = true", "expert_parallel: spreads experts over data-parallel ranks"),
    ("expert_balancedness = 0.5", "expert_balancedness: applies to data-parallel ranks"),
    ("data_parallel = 2\nexpert_balancedness = 0", "expert_balancedness: must be > 0"),
    ("data_parallel = 2\npipeline_parallel = 2", "data_parallel and pipeline_parallel together"),
    # a skew that changed nothing: sharded experts take every token on every GPU
    ("data_parallel = 2\nexpert_balancedness = 0.5", "expert_balancedness: applies to experts spread over the ranks"),
    ("mode = 'disaggregated'\ndata_parallel = 2", "disaggregated cluster with data or pipeline parallelism"),
])
def test_layout_mistakes_name_the_key(tmp_path, cluster, message):
    path = write(tmp_path, "[cluster]\n" + cluster + "\n[[runs]]\nname = 'x'\n")
    with pytest.raises(ConfigError, match=message):
        run_experiment(load(path))


@pytest.mark.parametrize("kind", ["roofline", "profiled"])
def test_a_cost_models_expert_parallel_on_a_dense_model_is_refused(kind):
    """It changed nothing (the same numbers as without it), where [cluster] expert_parallel on the
    same model is refused."""
    from schedlab.configs import FieldError
    from schedlab_plugins.cost_models.profiled import ProfiledConfig, build_profiled
    from schedlab_plugins.cost_models.roofline import RooflineConfig, build_roofline

    build, config = ((build_roofline, RooflineConfig(model="llama-3-8b", gpu="h100-80gb", expert_parallel=True))
                     if kind == "roofline" else
                     (build_profiled, ProfiledConfig(profile="nowhere", model="llama-3-8b", expert_parallel=True)))
    with pytest.raises(FieldError, match=r"^expert_parallel: model 'llama-3-8b' has no routed experts to spread$"):
        build(config, _presets())


@pytest.mark.parametrize("speculative", ["", '[speculative]\nmethod = "ngram"\n'])
def test_a_cost_model_that_cannot_time_ranks_is_refused_by_name(tmp_path, speculative):
    """(With speculative decoding the message names the cost model, not speculation's wrapper.)"""
    path = write(tmp_path, speculative + """
        [cluster]
        data_parallel = 2
        [[runs]]
        name = "x"
        cost_model = {kind = "linear"}
    """)
    with pytest.raises(ConfigError, match=r"\[cost_model\]: LinearCostModel does not time data-parallel ranks"):
        run_experiment(load(path))


MOE_BUNDLE = ("RTXPRO6000", "Qwen", "Qwen3-30B-A3B-Instruct-2507", "bf16")


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=3_000, max_output=300, all_at_zero=False),
       st.integers(2, 3), st.booleans(), st.sampled_from([1.0, 0.6]), st.sampled_from([512, 2048]))
def test_profiled_lockstep_runs_match_the_reference(requests, ranks, expert_parallel, balancedness, budget):
    """The shipped MoE bundle: rank parts piecewise linear in the contexts (grid points, skew
    buckets), the experts from the TP-1 table, the dispatch over PCIe through host memory; the
    fast engine's shared decode runs must agree with stepping the ranks one at a time."""
    from pathlib import Path

    from schedlab.parallelism import Parallelism
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES
    from schedlab_plugins.cost_models.profile_bundle import ProfileBundle
    from schedlab_plugins.cost_models.profiled import ProfiledConfig, ProfiledCostModel

    root = Path(__file__).resolve().parents[1].joinpath("experiments", "data", "llmservingsim", "profiles", *MOE_BUNDLE)
    bundle = _BUNDLE.get(root) or _BUNDLE.setdefault(root, ProfileBundle(root, 1))
    model = _presets().model("qwen3-30b-a3b")
    layout = Parallelism(data_parallel=ranks, expert_parallel=expert_parallel,
                         expert_balancedness=balancedness if expert_parallel else 1.0)

    def make():
        cost = ProfiledCostModel(bundle, model, ProfiledConfig(profile=str(root), model="qwen3-30b-a3b"),
                                 topology=TOPOLOGIES["pcie-gen5-host"], parallelism=layout)
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=8, max_num_batched_tokens=budget,
                                                         chunked_prefill=True, allocation="grow"))
        return scheduler, cost, PagedKVCache(2_000, 16)

    runs = [run_data_parallel(requests, make, ranks, fresh_router(), engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    assert runs[0].meta["events"] <= runs[1].meta["events"]


_BUNDLE: dict = {}


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=400, max_output=200, all_at_zero=False), schedulers(),
       st.integers(2, 3), st.integers(0, 20))
def test_roofline_lockstep_runs_match_the_reference(requests, cfg, ranks, spare):
    """The roofline's rank parts grow with the contexts (KV reads) and its experts are not
    linear in the tokens; swaps on small caches make ranks that only copy blocks in a step."""
    from schedlab.parallelism import Parallelism
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel

    presets = _presets()
    config = RooflineConfig(model="qwen3-30b-a3b", gpu="rtx-pro-6000-server")
    layout = Parallelism(data_parallel=ranks, expert_parallel=True)
    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // 16) for r in requests)

    def make():
        cost = RooflineCostModel(presets.model("qwen3-30b-a3b"), presets.gpu("rtx-pro-6000-server"), config,
                                 parallelism=layout)
        return ContinuousScheduler(cfg), cost, PagedKVCache(need + spare, 16, swap_blocks=64, bytes_per_block=2 ** 20,
                                                            host_link_gbps=2 ** 10 / 1e3)

    runs = [run_data_parallel(requests, make, ranks, fresh_router(), engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    check_run(runs[0], requests)


def test_a_class_rank_router_names_the_ranks_of_a_deployment(tmp_path):
    """A ``rank_router`` picks among one deployment's data-parallel ranks: an index out of range is
    said so (it read "the cluster has 2 instances" of a cluster of 3 deployments: review s80)."""
    text = """
        [cluster]
        data_parallel = 2
        expert_parallel = true
        instances = 3
        rank_router = {kind = "class", classes = {default = [2]}}
        [[runs]]
        name = "a"
    """
    with pytest.raises(ConfigError, match=r"\[cluster.rank_router\]: classes.default lists rank 2, but each deployment "
                                          r"has 2 ranks \(indices 0 to 1\)"):
        load(write(tmp_path, text))


# --- review multigpu82: a rank part at the host's floor in a decode run ---------------------------

RANK_FLOOR = """
    [experiment]
    name = "rank floor"
    [workload]
    kind = "synthetic"
    num_requests = 64
    rate = 1e6
    prompt = {dist = "fixed", value = 64}
    output = {dist = "fixed", value = 100}
    [scheduler]
    kind = "vllm"
    [cluster]
    data_parallel = 2
    expert_parallel = true
    [kv_cache]
    kind = "paged"
    model = "qwen3-30b-a3b"
"""

PROFILED_QWEN3_MOE = (Path(__file__).parent.parent / "experiments/data/llmservingsim/profiles/RTXPRO6000/Qwen/"
                      "Qwen3-30B-A3B-Instruct-2507/bf16")


@pytest.mark.parametrize("gpu, cost_model", [
    ("h100-80gb", 'kind = "roofline"\ncuda_graphs = false'),
    ("h100-80gb", 'kind = "roofline"\ncuda_graph_max_tokens = 8'),
    ("rtx-pro-6000-server", f'kind = "profiled"\nprofile = "{PROFILED_QWEN3_MOE}"\ncuda_graphs = false'),
], ids=["roofline eager", "roofline small graphs", "profiled eager"])
def test_a_ranks_part_on_the_hosts_floor_grows_as_the_reference_engine_times_it(tmp_path, gpu, cost_model):
    """The fast engine's bulk decode runs grew each rank's part by the whole iteration's increment
    (the experts' too): in eager mode a rank's part without the experts sits at the host's floor
    while the iteration is past it, and the fast engine's answers ended 5 ms late. Each rank part
    now grows by its own increment (``rank_step_increment``), and the run must be the reference's."""
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(RANK_FLOOR) + f'gpu = "{gpu}"\n[cost_model]\nmodel = "qwen3-30b-a3b"\n'
                    f'gpu = "{gpu}"\n{cost_model}\n')
    run = fast_run_agreeing_with_reference(path)
    assert len(run.requests["finish_ms"]) == 64 and run.meta["data_parallel"]["steps"] >= 100


def test_the_rooflines_rank_increment_is_its_rank_parts_growth():
    """Direct: over 50 steps of a decode run a rank's part grows by what ``rank_step_increment`` says
    (0 at the host's floor), where ``decode_step_increment`` says the whole iteration's growth."""
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    cost = RooflineCostModel(presets.model("qwen3-30b-a3b"), presets.gpu("h100-80gb"),
                             RooflineConfig(model="qwen3-30b-a3b", gpu="h100-80gb", cuda_graphs=False),
                             parallelism=Parallelism(data_parallel=2, expert_parallel=True))
    for n in (16, 64):
        batch = Batch(num_decode=n, decode_context_tokens=100 * n, decode_context_max=100, decode_context_min=100)
        later = Batch(num_decode=n, decode_context_tokens=150 * n, decode_context_max=150, decode_context_min=150)
        grown = cost.rank_ms(later) - cost.rank_ms(batch)
        inc = cost.rank_step_increment(batch)
        inc, steps = inc if type(inc) is tuple else (inc, math.inf)
        assert steps >= 50 and grown == pytest.approx(50 * inc, abs=1e-9)
        whole = cost.decode_step_increment(batch)
        whole = whole[0] if type(whole) is tuple else whole
        assert whole > 0.0 and grown < 50 * whole   # (the iteration's own growth: the bug's increment)


@pytest.mark.parametrize("tensor_parallel, link", [(1, "nvlink"), (2, "pcie"), (4, "pcie")])
def test_the_experts_dispatch_between_nvlink_pairs_takes_pcie(tensor_parallel, link):
    """Review multigpu82: on an H100 PCIe server (NVLink pairs, its usual machine) DP 2 x TP 2 puts
    the ranks on GPUs {0, 1} and {2, 3}, so each data-parallel group, {0, 2} or {1, 3}, crosses the
    pairs: its dispatch and combine run over PCIe (they took the pair's NVLink, half the time)."""
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    cost = RooflineCostModel(presets.model("qwen3-30b-a3b"), presets.gpu("h100-pcie-80gb"),
                             RooflineConfig(model="qwen3-30b-a3b", gpu="h100-pcie-80gb",
                                            tensor_parallel=tensor_parallel),
                             parallelism=Parallelism(data_parallel=2, expert_parallel=True))
    assert cost.expert_layers.collectives._link == link
