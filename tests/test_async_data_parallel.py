"""Asynchronous scheduling on data-parallel ranks stepping together (:mod:`schedlab.engine.ahead`,
:mod:`schedlab.engine.lockstep`): hand-computed steps, both engines against each other on
random workloads, and the TOML that declares it.

Costs as in ``tests/test_data_parallel.py``: a rank's part is 0.5 ms per prompt token and 8 ms
per decode step, the experts 1 ms + 0.0625 ms per token of all ranks + 0.125 ms per token of the
largest rank; a rank with nothing to compute runs a dummy batch, one decode (8 ms).
"""

from __future__ import annotations

import textwrap

import attrs

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedlab.model import Request
from schedlab.testing import (
    blocks_for_largest, check_run, compare_runs, dyadic_linear_costs, examples, fast_run_agreeing_with_reference,
    requests_lists, run_engine, small_closed_loop,
)
from schedlab.testing.parallel import LinearParallelCost, run_data_parallel, run_deployments
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.routers import LeastOutstandingRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

from test_async_scheduling import BASE
from test_data_parallel import ROUTERS, client_side, schedulers as dp_schedulers
from test_data_parallel_energy import metered_runs_agreeing, utilisation

ENGINES = ("fast", "reference")


def rank(*, async_scheduling: bool = True, blocks: int = 64):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow",
                                                         chunked_prefill=True, async_scheduling=async_scheduling))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)))
        return scheduler, cost, PagedKVCache(blocks, 16)
    return make


class Placed:
    """Sends request i to rank ``places[i]``."""

    def __init__(self, places):
        self.places = places

    def route(self, request, instances):
        return self.places[request.id]


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


#: B's arrival -> (first scheduled, first token, finish of A and B; meta["data_parallel"]). Rank 0
#: serves A (prompt 16, 2 tokens) at 0 and B (the same); rank 1 is idle (a dummy every step).
#: Step 1 [0, 12.0625]: A's prefill 8 ms, experts of (16, 1) 1 + 0.0625 x 17 + 0.125 x 16 = 4.0625.
#: Step 2 was planned at 0: A's decode alone, 8 + experts (1, 1) 1.25 -> 21.3125.
PLANNED_AHEAD = {
    # B at 5, before step 2 starts but after its plan: step 3, planned at 12.0625 (A's last token in
    # flight, its slot held), is B's prefill -> 33.375; step 4 (planned at 21.3125) its decode ->
    # 42.625. Synchronously step 2 would hold B's prefill.
    5.0: ({0: 0.0, 1: 12.0625}, {0: 12.0625, 1: 33.375}, {0: 21.3125, 1: 42.625},
          {"ranks": 2, "steps": 4, "dummy_rank_steps": 4, "experts_ms": 10.625}),
    # B at 15, during step 2. Rank 0's plan made at 12.0625 is empty (A's last token in flight, B
    # not there yet): vLLM's DP engine core then blocks on step 2 and runs a dummy pass, so step 3
    # is a dummy on both ranks, 8 + 1.25 -> 30.5625; rank 0 plans B's prefill at its own time,
    # 30.5625 -> 42.625, and its decode ahead -> 51.875. (A lone instance plans again at 21.3125.)
    15.0: ({0: 0.0, 1: 30.5625}, {0: 12.0625, 1: 42.625}, {0: 21.3125, 1: 51.875},
           {"ranks": 2, "steps": 5, "dummy_rank_steps": 6, "experts_ms": 11.875}),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("arrival", sorted(PLANNED_AHEAD))
def test_an_arrival_waits_for_the_plan_after_the_one_made_ahead(engine, arrival):
    scheduled, first, finish, meta = PLANNED_AHEAD[arrival]
    r = run_data_parallel([Request(0, 0.0, 16, 2), Request(1, arrival, 16, 2)], rank(), 2, Placed([0, 0]),
                          engine=engine)
    assert by_id(r, "first_scheduled_ms") == scheduled
    assert by_id(r, "first_token_ms") == first
    assert by_id(r, "finish_ms") == finish
    assert r.meta["data_parallel"] == meta


@pytest.mark.parametrize("engine", ENGINES)
def test_ranks_with_nothing_left_pause_rather_than_run_a_dummy_step(engine):
    # A finishes at 21.3125 (as above); the plan made ahead at 12.0625 is empty and nothing is
    # left once A is released: no dummy step. B comes at 100 to idle ranks: planned at its own
    # time, first token at 112.0625, its decode planned ahead at 100 -> 121.3125.
    r = run_data_parallel([Request(0, 0.0, 16, 2), Request(1, 100.0, 16, 2)], rank(), 2, Placed([0, 0]),
                          engine=engine)
    assert by_id(r, "first_token_ms") == {0: 12.0625, 1: 112.0625}
    assert by_id(r, "finish_ms") == {0: 21.3125, 1: 121.3125}
    assert r.meta["data_parallel"]["steps"] == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_running_a_dummy_plans_its_arrival_at_its_own_time(engine):
    # A (prompt 16, 3 tokens) on rank 0, B (prompt 16, 2 tokens) at 5 on rank 1, which ran a
    # dummy in step 1 [0, 12.0625]: B is planned at 12.0625 -- not deferred like a busy rank's
    # arrival -- beside A's first decode. Step 2: rank 0 8 ms, rank 1 8 ms of prefill, experts of
    # (1, 16) 4.0625 -> 24.125, B's first token. Step 3: both decode, 9.25 -> 33.375.
    r = run_data_parallel([Request(0, 0.0, 16, 3), Request(1, 5.0, 16, 2)], rank(), 2, Placed([0, 1]), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 12.0625}
    assert by_id(r, "first_token_ms") == {0: 12.0625, 1: 24.125}
    assert by_id(r, "finish_ms") == {0: 33.375, 1: 33.375}


def schedulers():
    """test_data_parallel's schedulers, planning ahead (which needs recompute preemption)."""
    return dp_schedulers().map(lambda c: attrs.evolve(c, preemption="recompute", async_scheduling=True))


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=16, max_prompt=60, max_output=60, all_at_zero=False, prefix_groups=2),
       schedulers(), st.integers(2, 3), st.integers(2, 3), dyadic_linear_costs(), st.integers(0, 30))
def test_deployments_planning_ahead_agree_between_engines(requests, cfg, deployments, ranks, cost, spare):
    """Several deployments behind a router, each deployment's ranks planning ahead: both engines
    alike, and every request served once within the caches and slots."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), PagedKVCache(blocks, 4)

    runs = [run_deployments(requests, make, deployments, ranks, LeastOutstandingRouter(), ROUTERS["vllm_dp"],
                            engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].meta["data_parallel"] == runs[1].meta["data_parallel"]
    n = deployments * ranks
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * n, kv_blocks=blocks * n)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=80, all_at_zero=False, prefix_groups=2),
       schedulers(), st.integers(2, 3), dyadic_linear_costs(), st.integers(0, 40), st.integers(1, 160),
       st.sampled_from([0.0, 0.5, 2.0]), st.integers(0, 2))
def test_clients_giving_up_on_ranks_planning_ahead_agree_between_engines_and_conserve(requests, cfg, ranks, cost,
                                                                                     spare, timeout, network, workers):
    """Through an API server with clients giving up: a rank drops a request at the step boundary
    its disconnect reaches, wherever it is -- deferred, waiting, running; both engines alike,
    every request served, rejected or aborted once, every block back."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), PagedKVCache(blocks, 4)

    side = client_side(timeout + network, network, workers)
    runs = [run_data_parallel(requests, make, ranks, ROUTERS["vllm_dp"](), engine=engine, client_side=side)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].meta["data_parallel"] == runs[1].meta["data_parallel"]
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * ranks, kv_blocks=blocks * ranks)
    assert all(kv.num_used_blocks() == 0 for run in runs for kv in run.meta["kvs"])


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(5, 24), st.integers(2, 3), st.integers(0, 5))
def test_closed_loops_over_ranks_planning_ahead_agree_and_conserve(clients, num_requests, ranks, seed):
    """Clients send their next request when the last is answered, to ranks planning ahead."""
    make_workload = small_closed_loop(clients, num_requests)
    runs = []
    for engine in ENGINES:
        workload = make_workload()
        runs.append(run_data_parallel(workload.requests(seed), rank(blocks=48), ranks, ROUTERS["vllm_dp"](),
                                      engine=engine, workload=workload))
    compare_runs(*runs, rel=1e-12)
    assert runs[0].requests["id"].size == num_requests and runs[0].requests["rejected"].sum() == 0
    assert all(kv.num_used_blocks() == 0 for run in runs for kv in run.meta["kvs"])


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=80, all_at_zero=False),
       schedulers(), st.integers(2, 3), dyadic_linear_costs(), st.integers(0, 40))
def test_energy_of_ranks_planning_ahead_agrees_between_engines_and_is_conserved(requests, cfg, ranks, cost, spare):
    """Dummy steps after empty plans made ahead are metered alike by both engines, and each run's
    energy is the integral of its timeline's power."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), PagedKVCache(blocks, 4)

    metered_runs_agreeing(requests, make, ranks, ROUTERS["round_robin"], utilisation(0.02, 0.005))


def test_a_dp_ep_deployment_planning_ahead_runs_from_toml_in_both_engines(tmp_path):
    runs = {}
    for mode in ("true", "false"):
        path = tmp_path / f"{mode}.toml"
        path.write_text(textwrap.dedent(BASE).replace("async_scheduling = true", f"async_scheduling = {mode}")
                        + "[cluster]\ndata_parallel = 2\nexpert_parallel = true\n")
        runs[mode] = fast_run_agreeing_with_reference(path)
    assert runs["true"].metrics["finished"] == 20 and runs["true"].meta["data_parallel"]["steps"] > 0
    # the setting is read: planning ahead, an arrival in a step is scheduled a step later
    scheduled = [runs[mode].requests["first_scheduled_ms"] for mode in ("true", "false")]
    assert not (scheduled[0] == scheduled[1]).all()


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=40, max_output=30, all_at_zero=False),
       dp_schedulers(), st.booleans(), dyadic_linear_costs(), st.integers(0, 30),
       st.sampled_from([5.0, 10.5, 20.25, 40.0]), st.sampled_from(ENGINES))
def test_a_lone_rank_drops_requests_whose_clients_gave_up_as_one_engine_does(requests, cfg, ahead, cost, spare,
                                                                             timeout, engine):
    """A single lockstep rank (its experts part of every step) against a colocated instance with
    the same costs, clients giving up: an abort that comes during a step drops that step's
    output, and one planning ahead comes after the plan made at the step's start, which still
    holds the request (the colocated rules, checked against vLLM 0.33) -- the same rows, wherever
    the rank ran no dummy step (vLLM's DP engine core runs one after an empty plan made ahead,
    which a single engine does not)."""
    cfg = attrs.evolve(cfg, async_scheduling=ahead, preemption="recompute")
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), PagedKVCache(blocks, 4)

    ranked = run_data_parallel(requests, make, 1, None, engine=engine, client_side=client_side(timeout))
    assume(not ranked.meta["data_parallel"]["dummy_rank_steps"])
    scheduler, parallel_cost, kv = make()
    colocated = run_engine(requests, scheduler, parallel_cost, kv, engine=engine, client_side=client_side(timeout))
    for column in ("first_scheduled_ms", "first_token_ms", "finish_ms", "aborted", "generated_tokens", "preemptions"):
        assert ranked.requests[column].tolist() == colocated.requests[column].tolist(), column
