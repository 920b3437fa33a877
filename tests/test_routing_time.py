"""Routers read the time they are asked at, not the request's arrival.

A decode pool's router is asked when a prompt's KV is ready to move, a whole prefill after the
request arrived; a router keeping a clock of its own (``vllm_dp``'s load snapshot,
``prefix_affinity``'s eviction timer) must read that time (``instances.now``,
:func:`schedlab.engine.pool.routing_time`), or it runs late by the prefill -- and, as handoffs
are not in arrival order, backwards.
"""

from __future__ import annotations

import pytest

from schedlab.engine.pool import routing_time
from schedlab.model import Request
from schedlab.testing import run_disaggregated
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.routers import (DataParallelRouter, DataParallelRouterConfig, LeastOutstandingRouter,
                                      PrefixAffinityConfig, PrefixAffinityRouter)
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

MIB = 2**20


class TimedRouter:
    """Least outstanding, keeping ``(request id, routing time)`` of every request it places."""

    def __init__(self):
        self.inner = LeastOutstandingRouter()
        self.times: dict[int, float] = {}

    def route(self, request, instances):
        self.times[request.id] = routing_time(request, instances)
        return self.inner.route(request, instances)


def instance():
    scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow"))
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0))
    return scheduler, cost, PagedKVCache(64, 16, bytes_per_block=16 * MIB)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_decode_pools_router_is_asked_at_the_handoff_and_a_prefill_pools_at_the_arrival(engine):
    """100-token prompts take 50 ms to prefill (0.5 ms a token): the decode router's time is each
    request's ``kv_ready_ms``, 50 ms or more after its arrival; the prefill router's the arrival."""
    requests = [Request(id=i, arrival_ms=10.0 * i, prompt_tokens=100, output_tokens=4) for i in range(6)]
    prefill_router, decode_router = TimedRouter(), TimedRouter()
    result = run_disaggregated(requests, instance, instance, prefill_instances=2, decode_instances=2,
                               prefill_router=prefill_router, decode_router=decode_router,
                               bandwidth_gbps=16 * MIB / 1e6, latency_ms=0.25, engine=engine)
    req = result.requests
    ready = {int(i): float(t) for i, t in zip(req["id"], req["kv_ready_ms"])}
    assert prefill_router.times == {r.id: r.arrival_ms for r in requests}
    assert decode_router.times == ready
    assert all(ready[r.id] >= r.arrival_ms + 50.0 for r in requests)


class View:
    """An instance as a router sees it, by hand."""

    def __init__(self, index, waiting=0, running=0):
        self.index, self.waiting, self.running, self.outstanding = index, waiting, running, waiting + running
        self.kv = type("Gauge", (), {"usage": 0.0})()


class Pool(list):
    """Hand-made views with a routing time, as a pool (:class:`~schedlab.engine.pool.ViewPool`) has."""

    def __init__(self, now: float, views):
        super().__init__(views)
        self.now = now


def pool_at(now: float, views) -> Pool:
    return Pool(now, views)


def test_the_dp_balancers_snapshot_ages_by_the_routing_time():
    """vLLM's balancer reads the ranks again once its snapshot is ``stats_interval_ms`` old. The
    first request goes to idle rank 0 and the snapshot counts it there as waiting (score 4 x 1
    against rank 1's 1 running). A request that arrived at 50 ms but is routed at 150 ms finds
    that snapshot stale and reads the ranks as they are now -- rank 0 idle, rank 1 running 5 --
    so it goes to rank 0; by its arrival the snapshot would be fresh and send it to rank 1."""
    def second_choice(asked_at: float) -> int:
        router = DataParallelRouter(DataParallelRouterConfig(rule="v0.19", stats_interval_ms=100.0))
        first = Request(id=0, arrival_ms=0.0, prompt_tokens=8, output_tokens=2)
        assert router.route(first, pool_at(0.0, [View(0), View(1, running=1)])) == 0
        late = Request(id=1, arrival_ms=50.0, prompt_tokens=8, output_tokens=2)
        return router.route(late, pool_at(asked_at, [View(0), View(1, running=5)]))

    assert second_choice(150.0) == 0
    assert second_choice(50.0) == 1


def test_a_plain_list_of_views_routes_at_the_arrival():
    """A router driven by hand with a plain list (no routing clock) reads the request's arrival."""
    request = Request(id=0, arrival_ms=42.0, prompt_tokens=8, output_tokens=2)
    assert routing_time(request, [View(0)]) == 42.0
    assert routing_time(request, pool_at(float("-inf"), [View(0)])) == 42.0
    assert routing_time(request, pool_at(99.0, [View(0)])) == 99.0


def test_prefix_affinity_evicts_by_the_routing_time():
    """With a 1 s interval and no room (``max_tree_tokens = 0``), a request arriving at 0.5 s but
    routed at 1.5 s runs the eviction first: the holder of the old prompt is forgotten, so the
    same prompt again goes by load, not by its cached blocks."""
    router = PrefixAffinityRouter(PrefixAffinityConfig(eviction_interval_s=1.0, max_tree_tokens=0))
    blocks = tuple(range(4))
    a = Request(id=0, arrival_ms=0.0, prompt_tokens=64, output_tokens=2, block_hashes=blocks, hash_block_tokens=16)
    assert router.route(a, pool_at(0.0, [View(0, running=1), View(1, running=2)])) == 0
    b = Request(id=1, arrival_ms=500.0, prompt_tokens=64, output_tokens=2, block_hashes=blocks, hash_block_tokens=16)
    # instance 0 is now the busier one: a remembered prefix would still send b there
    kept = PrefixAffinityRouter(PrefixAffinityConfig(eviction_interval_s=1.0, max_tree_tokens=0))
    kept.route(a, pool_at(0.0, [View(0, running=1), View(1, running=2)]))
    assert kept.route(b, pool_at(500.0, [View(0, running=3), View(1, running=2)])) == 0
    assert router.route(b, pool_at(1500.0, [View(0, running=3), View(1, running=2)])) == 1
