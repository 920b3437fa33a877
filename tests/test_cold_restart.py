"""A restarted instance starts cold: ``reset_prefix_cache()`` and the autoscaler's use of it.

An autoscaled instance that drained and went off has lost its engine process, so when it is
switched on again its prefix cache, host-memory tier and swap space are empty
(:mod:`schedlab.engine.scaling`). First the caches' ``reset_prefix_cache`` (vLLM's name): it
refuses while a block is in use and, after it, a cache behaves exactly as a new one (hypothesis:
random engine-like operations, a reset once everything is released, then the same operations on
the reset cache and on a fresh one). Then the autoscaler: by hand, a request sharing a prefix
with one served before its instance went off finds nothing after the restart and its whole
prefix while the instance stays on (colocated and pipelined, both engines, vLLM's block pool and
SGLang's radix tree); a cache without the member keeps its prefixes and the run says so; and
both engines agree on random autoscaled prefix-caching fleets.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedlab.engine.scaling import ScalingLimits
from schedlab.model import Request
from schedlab.testing import (blocks_for_largest, check_run, compare_runs, dyadic_linear_costs, examples,
                              requests_lists, run_cluster, run_disaggregated)
from schedlab.testing.parallel import LinearParallelCost, run_deployments, run_pipelined
from schedlab_plugins.autoscalers import QueueLength, QueueLengthConfig
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixKVCache
from schedlab_plugins.kv_caches.host_tier import HostTier
from schedlab_plugins.routers import LeastOutstandingRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, SglangConfig
from schedlab_plugins.schedulers.sglang import SglangScheduler
from test_disaggregated import LATENCY_MS, LINK_GBPS, pool
from test_energy import Newest, Scripted
from test_pipeline_parallel import client_side
from test_prefix_cache import OPS, Driver, Seq, admit, make_request, req
from test_sglang import rejections_for, sglang_configs

ENGINES = ("fast", "reference")


def make_cache(kind: str, num_blocks: int, bs: int, *, swap: int = 0, host: int = 0):
    tier = HostTier(host) if host else None
    if kind == "prefix":
        return PrefixKVCache(num_blocks, bs, swap_blocks=swap, host=tier)
    if kind == "radix":
        return RadixKVCache(num_blocks, bs, host=tier)
    return PagedKVCache(num_blocks, bs, swap_blocks=swap)


# -- the caches ------------------------------------------------------------------------------------------------


def test_a_reset_forgets_every_prefix_and_host_copy_and_keeps_the_run_counters():
    # B = 4, 3 GPU blocks, a host tier of 4. a (12 tokens, prefix "s" of 8: blocks g3, g7, then its
    # own block r0_2) is served and finished; b (a 12-token prompt of group "t") evicts all three to
    # the host (a request's own blocks go too beside a host tier, as vLLM's connector stores them).
    host = HostTier(4)
    cache = PrefixKVCache(3, 4, host=host)
    a = Seq(req(0, 12, prefix_group="s", prefix_tokens=8))
    admit(cache, a)
    cache.free(a)
    b = Seq(req(1, 12, prefix_group="t", prefix_tokens=12))
    admit(cache, b)
    cache.free(b)
    assert set(host.lru_keys()) == {("g", "s", 3), ("g", "s", 7), ("r", 0, 2)}
    assert cache.cached_keys() == {("g", "t", 3), ("g", "t", 7), ("g", "t", 11)}
    again = Seq(req(2, 12, prefix_group="s", prefix_tokens=8))
    assert cache.cached_tokens(again) == 8                      # both blocks, from the host
    epoch, evictions, stored = cache.epoch, cache.evictions, host.stored
    cache.reset_prefix_cache()
    cache.check_invariants()
    assert cache.cached_tokens(again) == 0
    assert cache.cached_keys() == set() and cache.lru_keys() == [] and host.lru_keys() == []
    assert cache.free_queue_layout() == [3] and cache.num_free_blocks() == 3
    assert cache.epoch != epoch                                  # memoized hits are stale
    assert (cache.evictions, host.stored, host.evicted) == (evictions, stored, 0)  # the run's counts go on
    assert host.dropped == 3


def test_the_radix_tree_is_reset_to_its_root():
    host = HostTier(4)
    cache = RadixKVCache(3, 4, host=host)
    a = Seq(req(0, 12, prefix_group="s", prefix_tokens=8))
    admit(cache, a)
    a.num_generated = 1
    cache.free(a)
    b = Seq(req(1, 12, prefix_group="t", prefix_tokens=12))
    admit(cache, b)                                              # evicts a's node to the host
    cache.free(b)
    assert host.lru_keys() and cache.cached_keys()
    cache.reset_prefix_cache()
    cache.check_invariants()
    assert cache.layout() == {} and host.lru_keys() == [] and cache.num_free_blocks() == 3
    assert cache.cached_tokens(Seq(req(2, 12, prefix_group="t", prefix_tokens=12))) == 0


@pytest.mark.parametrize("kind", ["prefix", "radix", "paged"])
def test_a_reset_refuses_while_a_block_is_in_use_and_changes_nothing(kind):
    cache = make_cache(kind, 8, 4, swap=4, host=4)
    a = Seq(req(0, 9, prefix_group="s", prefix_tokens=8))
    admit(cache, a)
    free, used = cache.num_free_blocks(), cache.num_used_blocks()
    with pytest.raises(RuntimeError, match="in use"):
        cache.reset_prefix_cache()
    cache.check_invariants()
    assert (cache.num_free_blocks(), cache.num_used_blocks()) == (free, used)
    if kind != "paged":
        assert cache.cached_tokens(Seq(req(1, 9, prefix_group="s", prefix_tokens=8))) == 8
    if kind != "radix":                                          # swap space is in use too
        a.status = "decoding"
        assert cache.swap_out(a) is not None and cache.num_used_blocks() == 0
        with pytest.raises(RuntimeError, match="swap"):
            cache.reset_prefix_cache()
        cache.free_swapped(a)
    else:
        cache.free(a)
    cache.reset_prefix_cache()
    cache.check_invariants()


def test_a_radix_reset_between_passes_leaves_the_next_pass_as_a_new_caches():
    """SGLang's scheduler opens a pass on every plan: an instance that goes off after an empty
    plan has one open, with nothing held; after the reset the next pass runs as a new cache's."""
    used, fresh = RadixKVCache(6, 4), RadixKVCache(6, 4)
    a = Seq(req(0, 8, prefix_group="s", prefix_tokens=8))
    used.begin_pass()
    admit(used, a)
    used.free(a)
    used.begin_pass()                                            # an empty plan
    used.reset_prefix_cache()
    used.check_invariants()
    for cache in (used, fresh):
        cache.begin_pass()
        admit(cache, Seq(req(1, 8, prefix_group="s", prefix_tokens=8)))
        # a second admission in the same pass does not see the first's blocks (SGLang's rule)
        assert cache.cached_tokens(Seq(req(2, 9, prefix_group="s", prefix_tokens=8))) == 0
        cache.end_pass()
        cache.check_invariants()
    assert used.layout() == fresh.layout() and used.num_free_blocks() == fresh.num_free_blocks()


def observe(driver: Driver, base: dict) -> tuple:
    """What a caller can see of a cache: free and used blocks, every waiting sequence's hit, the
    sequences' progress, the eviction order (vLLM's free queue, the radix tree with its access
    times, the host tier's LRU), swap space, and the counters since ``base``."""
    cache = driver.cache
    waiting = {n: cache.cached_tokens(s) for n, s in driver.seqs.items() if s.status == "waiting"}
    out = [cache.num_free_blocks(), cache.num_used_blocks(), waiting,
           {n: (s.status, s.num_computed_tokens, s.num_generated) for n, s in driver.seqs.items()},
           getattr(cache, "swap_used", 0)]
    if isinstance(cache, PrefixKVCache):
        out += [cache.free_queue_layout(), cache.lru_keys(), {k: cache.ref_count(k) for k in cache.cached_keys()}]
    if isinstance(cache, RadixKVCache):
        out += [cache.layout()]
    host = getattr(cache, "host", None)
    out += [getattr(cache, "evictions", 0) - base["evictions"]]
    if host is not None:
        out += [host.lru_keys(), host.stored - base["stored"], host.evicted - base["evicted"],
                host.loaded - base["loaded"]]
    return tuple(out)


def counters(cache) -> dict:
    host = getattr(cache, "host", None)
    if host is None:
        return {"evictions": getattr(cache, "evictions", 0), "stored": 0, "evicted": 0, "loaded": 0}
    return {"evictions": getattr(cache, "evictions", 0), "stored": host.stored, "evicted": host.evicted,
            "loaded": host.loaded}


#: Arrive and admit the whole prompt at once: a prompt of ids shared within a family (two tokens
#: an id), so that blocks get keys, are evicted (to the host) and are found again.
SERVE = st.tuples(st.just("serve"), st.integers(1, 14), st.integers(0, 2))


def apply(driver: Driver, op, rid: int) -> int:
    """Do ``op`` (request ``rid`` if it brings one); the next request id."""
    if op[0] == "new":
        driver.add(make_request(rid, op[1]))
    elif op[0] == "serve":
        prompt = max(1, min(op[1], (driver.cache.num_blocks - 1) * driver.cache.block_size))
        name = driver.add(make_request(rid, {"prompt_tokens": prompt, "output_tokens": 2, "hash_ids": (2, op[2], 4)}))
        seq = driver.seqs[name]
        driver.admit(driver._named("waiting").index(name), seq.num_tokens - driver.cache.cached_tokens(seq) - 1, False)
    else:
        driver.apply(op)
        return rid
    return rid + 1


def release_everything(driver: Driver) -> None:
    """The instance drains: every request it holds finishes, or leaves swap space (aborted)."""
    for seq in driver.seqs.values():
        if seq.status in ("prefilling", "decoding"):
            driver.cache.free(seq)
        elif seq.status == "swapped":
            driver.cache.free_swapped(seq)
    driver.seqs.clear()


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["prefix", "radix", "paged"]), num_blocks=st.integers(2, 10), bs=st.integers(1, 4),
       swap=st.integers(0, 6), host=st.sampled_from([0, 2, 50]), bulk=st.booleans(),
       before=st.lists(st.one_of(OPS, SERVE), max_size=50), after=st.lists(st.one_of(OPS, SERVE), max_size=50))
def test_a_reset_cache_behaves_as_a_new_one(kind, num_blocks, bs, swap, host, bulk, before, after):
    """Random allocations, prefills, decodes, finishes, preemptions and swaps; everything held is
    released and the cache reset; then the same operations on it and on a new cache give the
    same hits, free blocks, eviction orders and counts at every step."""
    if kind == "radix":  # SGLang retracts instead of swapping
        before = [op for op in before if op[0] not in ("swap_out", "swap_in")]
        after = [op for op in after if op[0] not in ("swap_out", "swap_in")]
    used = Driver(make_cache(kind, num_blocks, bs, swap=swap, host=host), bulk=bulk)
    rid = 0
    for op in before:
        rid = apply(used, op, rid)
    release_everything(used)
    used.cache.reset_prefix_cache()
    used.cache.check_invariants()
    reset = Driver(used.cache, bulk=bulk)          # the restarted engine: no sequence yet
    fresh = Driver(make_cache(kind, num_blocks, bs, swap=swap, host=host), bulk=bulk)
    bases = {id(d): counters(d.cache) for d in (reset, fresh)}
    assert observe(reset, bases[id(reset)]) == observe(fresh, bases[id(fresh)])
    rid = 0  # ids start again: a request id seen before the reset must not find anything either
    for op in after:
        for d in (reset, fresh):
            nxt = apply(d, op, rid)
        rid = nxt
        assert observe(reset, bases[id(reset)]) == observe(fresh, bases[id(fresh)]), op
        reset.cache.check_invariants()


# -- the autoscaler: by hand ------------------------------------------------------------------------------------

# Two instances, one serving at first; ticks every second, a cold start of 500 ms; every request
# goes to the newest serving instance. r0 (at 2000) and r1 (at 5000) have 20-token prompts whose
# first 16 tokens are a shared system prompt (group "sys"), 3 tokens out; blocks of 4 tokens, so
# a hit is the 4 blocks of the system prompt: 16 tokens ((20 - 1) // 4 = 4 blocks may hit).
#   tick 1000: 2 wanted -> instance 1 warms, serves from 1500; r0 at 2000 on instance 1.
#   restart:  tick 3000 asks for 1 -> instance 1 drains (it holds nothing); the tick at 4000 finds
#             it drained -- off since 3000, its cache reset -- and asks for 2 again: it warms at
#             4000 and serves from 4500, cold. r1 at 5000 on instance 1 finds nothing.
#   kept on:  2 all along; r1 on instance 1 finds the system prompt r0 left there.
RESTART = {1000.0: 2, 2000.0: 2, 3000.0: 1, 4000.0: 2, 5000.0: 2}
KEPT_ON = {1000.0: 2, 2000.0: 2, 3000.0: 2, 4000.0: 2, 5000.0: 2}
LIMITS = ScalingLimits(min_instances=1, max_instances=2, initial=1, interval_ms=1000.0, cold_start_ms=500.0,
                       window_ms=1000.0)
SHARED = [Request(0, 2000.0, 20, 3, prefix_group="sys", prefix_tokens=16),
          Request(1, 5000.0, 20, 3, prefix_group="sys", prefix_tokens=16)]
CACHES = {"prefix": lambda: PrefixKVCache(64, 4, host=HostTier(64)), "radix": lambda: RadixKVCache(64, 4)}


class KeepsItsPrefixes:
    """A third-party cache without ``reset_prefix_cache`` (the prefix cache behind it)."""

    def __init__(self, kv):
        self.kv = kv

    def __getattr__(self, name):
        if name == "reset_prefix_cache":
            raise AttributeError(name)
        return getattr(self.kv, name)


def by_id(run, column):
    return dict(zip(run.requests["id"].tolist(), run.requests[column].tolist()))


def colocated(engine, cache, script, wrap=lambda kv: kv):
    # 0.5 ms per prompt token, 4 ms per decode step: a 20-token prompt 10 ms, 4 tokens 2 ms.
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0))
    return run_cluster(SHARED, lambda: (ContinuousScheduler(ContinuousConfig()), cost, wrap(CACHES[cache]())), 2,
                       Newest(), engine=engine, autoscaler=Scripted(script), limits=LIMITS)


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("engine", ENGINES)
def test_an_instance_switched_off_and_on_has_forgotten_the_shared_prefix(engine, cache):
    cold = colocated(engine, cache, RESTART)
    assert by_id(cold, "instance") == {0: 1, 1: 1}
    assert sorted(cold.meta["scaling"]["intervals"]) == [[0, 0.0, 5018.0], [1, 1000.0, 3000.0], [1, 4000.0, 5018.0]]
    assert by_id(cold, "cached_tokens") == {0: 0, 1: 0}
    assert by_id(cold, "first_token_ms") == {0: 2010.0, 1: 5010.0}   # the whole prompt both times
    assert by_id(cold, "finish_ms") == {0: 2018.0, 1: 5018.0}        # + 2 decode steps
    assert cold.meta["scaling"]["caches_kept"] == 0
    warm = colocated(engine, cache, KEPT_ON)
    assert by_id(warm, "instance") == {0: 1, 1: 1}
    assert sorted(warm.meta["scaling"]["intervals"]) == [[0, 0.0, 5010.0], [1, 1000.0, 5010.0]]
    assert by_id(warm, "cached_tokens") == {0: 0, 1: 16}
    assert by_id(warm, "first_token_ms") == {0: 2010.0, 1: 5002.0}   # 4 tokens computed
    for run in (cold, warm):
        check_run(run, SHARED)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cache_that_cannot_be_reset_keeps_its_prefixes_and_the_run_says_so(engine):
    """Today's behaviour for a third-party cache without ``reset_prefix_cache``: warm restarts,
    counted in the autoscaler's summary rather than failing the run."""
    run = colocated(engine, "prefix", RESTART, wrap=KeepsItsPrefixes)
    assert sorted(run.meta["scaling"]["intervals"]) == [[0, 0.0, 5010.0], [1, 1000.0, 3000.0], [1, 4000.0, 5010.0]]
    assert by_id(run, "cached_tokens") == {0: 0, 1: 16}
    assert by_id(run, "first_token_ms") == {0: 2010.0, 1: 5002.0}
    assert run.meta["scaling"]["caches_kept"] == 1


def pipelined(engine, cache, script):
    # Two stages, each half of the iteration, a send of 0.25 ms + 0.0625 ms per token between
    # them: a 20-token prompt takes 5 + 1.5 + 5 = 11.5 ms, a 4-token one 1 + 0.5 + 1 = 2.5 ms.
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                                  stages=2, moe=False)
        return scheduler, cost, CACHES[cache]()
    return run_pipelined(SHARED, make, 2, 2, Newest(), engine=engine, autoscaler=Scripted(script), limits=LIMITS)


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_pipelined_instance_restarts_cold_too(engine, cache):
    """A pipelined instance's stages share one KV cache object: it is reset when the instance
    goes off, as a colocated instance's is."""
    cold, warm = pipelined(engine, cache, RESTART), pipelined(engine, cache, KEPT_ON)
    assert by_id(cold, "instance") == by_id(warm, "instance") == {0: 1, 1: 1}
    assert [i for i, on, off in sorted(cold.meta["scaling"]["intervals"])] == [0, 1, 1]
    assert by_id(cold, "cached_tokens") == {0: 0, 1: 0} and by_id(warm, "cached_tokens") == {0: 0, 1: 16}
    assert by_id(cold, "first_token_ms") == {0: 2011.5, 1: 5011.5}
    assert by_id(warm, "first_token_ms") == {0: 2011.5, 1: 5002.5}
    for run in (cold, warm):
        check_run(run, SHARED)


# -- both engines -----------------------------------------------------------------------------------------------


@st.composite
def prefix_fleets(draw):
    """2-3 instances with vLLM's prefix cache (with or without a host tier; preempting by
    recompute or to swap space) or SGLang's radix tree (under the continuous or the SGLang
    scheduler), requests in bursts sharing two system prompts, clients that may give up, a
    queue-length policy with short ticks and windows: instances go off and come back."""
    requests = draw(requests_lists(min_size=2, max_size=24, max_prompt=48, max_output=12, max_arrival_ms=600.0,
                                   all_at_zero=False, prefix_groups=2))
    n = draw(st.integers(2, 3))
    cache = draw(st.sampled_from(["prefix", "prefix+host", "radix", "radix+sglang"]))
    blocks = blocks_for_largest(requests, 4) + draw(st.integers(0, 24))
    host = draw(st.sampled_from([4, 64])) if cache == "prefix+host" else 0
    sglang = draw(sglang_configs()) if cache == "radix+sglang" else None
    swap = draw(st.sampled_from([0, 8])) if cache.startswith("prefix") else 0
    continuous = ContinuousConfig(max_num_seqs=draw(st.integers(1, 4)),
                                  max_num_batched_tokens=draw(st.sampled_from([16, 64])), allocation="grow",
                                  chunked_prefill=True, preemption="swap" if swap else "recompute")
    limits = ScalingLimits(1, n, draw(st.integers(1, n)), interval_ms=draw(st.sampled_from([4.0, 16.0, 50.0])),
                           cold_start_ms=draw(st.sampled_from([0.0, 8.0, 40.0])),
                           window_ms=draw(st.sampled_from([8.0, 40.0])))
    return dict(requests=requests, instances=n, kind=cache.split("+")[0], blocks=blocks, host=host, swap=swap,
                sglang=sglang, continuous=continuous, limits=limits, cost=draw(dyadic_linear_costs()),
                target=draw(st.sampled_from([1, 2])), timeout=draw(st.sampled_from([None, None, 40.0, 120.0])))


def run_fleet(case, engine):
    def make():
        scheduler = (SglangScheduler(case["sglang"]) if case["sglang"] is not None
                     else ContinuousScheduler(case["continuous"]))
        return scheduler, LinearCostModel(case["cost"]), make_cache(case["kind"], case["blocks"], 4,
                                                                    swap=case["swap"], host=case["host"])
    policy = QueueLength(QueueLengthConfig(target_per_instance=case["target"], stabilization_s=0.0))
    return run_cluster(case["requests"], make, case["instances"], LeastOutstandingRouter(), engine=engine,
                       autoscaler=policy, limits=case["limits"],
                       client_side=client_side(case["timeout"]) if case["timeout"] is not None else None)


#: A third instance starts serving at 100 ms while instance 0's iteration ends at 100.0625: the
#: router's pool, made anew for the new members, must still see that end (it once ranked
#: instance 0 by its load before it, routing the next arrivals differently in the fast engine).
POOL_REBUILT_MID_ITERATION = {
    "requests": [Request(i, at, prompt, output, max_tokens=most) for i, (at, prompt, output, most) in enumerate([
        (0.0, 1, 1, None), (0.0, 1, 1, None), (19.625, 1, 9, None), (19.625, 1, 3, None), (50.0, 1, 1, None),
        (59.625, 6, 12, None), (81.25, 1, 4, None), (81.25, 44, 2, None), (81.25, 1, 1, None), (100.0, 1, 1, None),
        (100.125, 1, 1, None), (100.125, 1, 1, None), (100.25, 1, 1, None), (100.375, 1, 1, 1), (100.375, 1, 1, 1),
        (100.375, 2, 1, 1), (100.375, 1, 1, 1)])],
    "instances": 3, "kind": "prefix", "blocks": 12, "host": 0, "swap": 0, "sglang": None,
    "continuous": ContinuousConfig(max_num_seqs=1, max_num_batched_tokens=16, chunked_prefill=True, allocation="grow"),
    "limits": ScalingLimits(min_instances=1, max_instances=3, initial=1, interval_ms=50.0, cold_start_ms=0.0,
                            window_ms=8.0),
    "cost": LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=4.0), "target": 1, "timeout": 40.0}


#: SGLang's overlap scheduler on a drained instance: nothing outstanding, but the requests its last
#: batch finished hold their KV until the next plan is made -- the instance went off (and its
#: radix cache was reset, which refused: blocks in use) before it gave them back.
HELD_AT_THE_DRAIN = {
    "requests": [Request(i, 0.0, 1, 1) for i in range(9)] + [
        Request(9, 117.625, 1, 9), Request(10, 117.625, 1, 1), Request(11, 181.625, 38, 7), Request(12, 181.75, 1, 1),
        Request(13, 200.0, 1, 1)],
    "instances": 2, "kind": "radix", "blocks": 12, "host": 0, "swap": 0,
    "sglang": SglangConfig(max_running_requests=1, max_prefill_tokens=16, chunked_prefill_size=0,
                           init_new_token_ratio=0.0, new_token_ratio_decay_steps=1, clip_max_new_tokens=8,
                           retract_decode_steps=0, overlap_schedule=True, priority_scheduling_preemption_threshold=0),
    "continuous": None,
    "limits": ScalingLimits(min_instances=1, max_instances=2, initial=1, interval_ms=4.0, cold_start_ms=0.0,
                            window_ms=8.0),
    "cost": LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=8.0), "target": 1, "timeout": None}


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_fleets())
@example(POOL_REBUILT_MID_ITERATION)
@example(HELD_AT_THE_DRAIN)
def test_both_engines_restart_prefix_caches_alike(case):
    """Fast and reference engines on autoscaled prefix-caching fleets: the same per-request rows
    (hits included), decisions and paid intervals; every cache reset when its instance went off
    (none kept), every block back at the end."""
    fast, ref = (run_fleet(case, engine) for engine in ENGINES)
    compare_runs(fast, ref, rel=0)
    for column, values in fast.requests.items():
        assert values.tolist() == ref.requests[column].tolist(), column
    assert fast.meta["scaling"]["history"] == ref.meta["scaling"]["history"]
    assert fast.meta["scaling"]["intervals"] == ref.meta["scaling"]["intervals"]
    for run in (fast, ref):
        assert run.meta["scaling"]["caches_kept"] == 0
        check_run(run, case["requests"], rejections=rejections_for(case["sglang"]))


# -- data-parallel deployments -----------------------------------------------------------------------------------


def deployments(engine, cache, script, wrap=lambda kv: kv):
    """The same script over 2 deployments of 2 ranks stepping together (the newest deployment
    serves; within it the first rank with the fewest outstanding takes the request: rank 0)."""
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig())
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0)))
        return scheduler, cost, wrap(CACHES[cache]())
    return run_deployments(SHARED, make, 2, 2, Newest(), LeastOutstandingRouter, engine=engine,
                           autoscaler=Scripted(script), limits=LIMITS)


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_deployment_switched_off_and_on_has_forgotten_the_shared_prefix_on_every_rank(engine, cache):
    """Deployment 1's rank 0 (instance 2) serves r0 and, after the restart, r1: every rank's cache
    is reset when the deployment goes off, so r1 computes its whole prompt; kept on, it finds the
    system prompt r0 left."""
    cold = deployments(engine, cache, RESTART)
    assert by_id(cold, "instance") == {0: 2, 1: 2}
    assert by_id(cold, "cached_tokens") == {0: 0, 1: 0}
    assert cold.meta["scaling"]["caches_kept"] == 0
    warm = deployments(engine, cache, KEPT_ON)
    assert by_id(warm, "instance") == {0: 2, 1: 2}
    assert by_id(warm, "cached_tokens") == {0: 0, 1: 16}
    # a step: the larger rank part (0.5 ms a prompt token; the idle rank's dummy batch, a one-token
    # decode, 4 ms) + the experts (1 + 0.0625 per token of both ranks + 0.125 per token of the larger)
    assert by_id(cold, "first_token_ms") == {0: 2000 + 10 + 4.8125, 1: 5000 + 10 + 4.8125}  # 20 tokens
    assert by_id(warm, "first_token_ms") == {0: 2000 + 10 + 4.8125, 1: 5000 + 4 + 1.8125}   # 4 tokens
    held = deployments(engine, "prefix", RESTART, wrap=KeepsItsPrefixes)
    assert by_id(held, "cached_tokens") == {0: 0, 1: 16}
    assert held.meta["scaling"]["caches_kept"] == 1              # one deployment went off, warm
    for run in (cold, warm, held):
        check_run(run, SHARED)


# -- a disaggregated cluster's prefill pool ------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_prefill_instance_switched_off_and_on_has_forgotten_the_shared_prefix(engine):
    """The script above on a prefill pool of 2 (instance 1 the newest), one decode instance (2);
    0.5 ms a prompt token. r0's 20-token prompt runs on instance 1 from 2000 (first token 2010)
    and its KV is pulled at once, so instance 1 drains empty after the tick at 3000 and is off;
    switched on at 4000 (serving from 4500), it prefills r1's whole prompt at 5000: first token
    5010. Kept on, r1 finds the 16-token system prompt: 4 tokens, first token 5002. (The first token
    as DistServe makes it, on the prefill instance: first_token = "prefill".)"""
    def run(script):
        return run_disaggregated(SHARED, pool(64, block_size=4, kv=PrefixKVCache), pool(64, block_size=4),
                                 prefill_instances=2, decode_instances=1, prefill_router=Newest(),
                                 bandwidth_gbps=LINK_GBPS, latency_ms=LATENCY_MS, engine=engine,
                                 autoscalers={"prefill": Scripted(script)}, limits={"prefill": LIMITS},
                                 first_token="prefill")

    cold, warm = run(RESTART), run(KEPT_ON)
    for r in (cold, warm):
        assert by_id(r, "prefill_instance") == {0: 1, 1: 1}
        check_run(r, SHARED)
    assert by_id(cold, "cached_tokens") == {0: 0, 1: 0}
    assert by_id(cold, "first_token_ms") == {0: 2010.0, 1: 5010.0}
    assert by_id(warm, "cached_tokens") == {0: 0, 1: 16}
    assert by_id(warm, "first_token_ms") == {0: 2010.0, 1: 5002.0}
    prefill = cold.meta["scaling"]["pools"]["prefill"]
    assert [i for i, _, _ in prefill["intervals"]].count(1) == 2       # on, off at 3000, on again
    assert [row[1:3] for row in prefill["intervals"] if row[0] == 1][0] == [1000.0, 3000.0]
    assert prefill["caches_kept"] == 0
