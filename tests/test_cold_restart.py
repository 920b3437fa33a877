"""A restarted instance starts cold: the KV caches' ``reset_prefix_cache()`` (vLLM's name).

It refuses while a block is in use and, after it, a cache behaves exactly as a new one
(hypothesis: random engine-like operations, a reset once everything is released, then the same
operations on the reset cache and on a fresh one).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.testing import examples
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixKVCache
from schedlab_plugins.kv_caches.host_tier import HostTier
from test_prefix_cache import OPS, Driver, Seq, admit, make_request, req


def make_cache(kind: str, num_blocks: int, bs: int, *, swap: int = 0, host: int = 0):
    tier = HostTier(host) if host else None
    if kind == "prefix":
        return PrefixKVCache(num_blocks, bs, swap_blocks=swap, host=tier)
    if kind == "radix":
        return RadixKVCache(num_blocks, bs, host=tier)
    return PagedKVCache(num_blocks, bs, swap_blocks=swap)


# -- the caches ------------------------------------------------------------------------------------------------


def test_a_reset_forgets_every_prefix_and_host_copy_and_keeps_the_run_counters():
    # B = 4, 3 GPU blocks, a host tier of 4. a (12 tokens, prefix "s" of 8: blocks g3, g7) is
    # served and finished; b (a 12-token prompt of group "t") evicts g3 and g7 to the host.
    host = HostTier(4)
    cache = PrefixKVCache(3, 4, host=host)
    a = Seq(req(0, 12, prefix_group="s", prefix_tokens=8))
    admit(cache, a)
    cache.free(a)
    b = Seq(req(1, 12, prefix_group="t", prefix_tokens=12))
    admit(cache, b)
    cache.free(b)
    assert set(host.lru_keys()) == {("g", "s", 3), ("g", "s", 7)}
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
    assert host.dropped == 2


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

