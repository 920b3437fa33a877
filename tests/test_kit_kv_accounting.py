"""``schedlab.testing.kv.AccountedKV``: a KV cache's block accounting, checked at every call.

Covered here:

* Every built-in cache passes when wrapped: paged (with swap space), prefix and radix, each with and
  without a host tier. Both engines run, under vLLM's and SGLang's rules, on tight pools with
  preemption. Wrapping changes nothing: the wrapped run equals the plain one exactly.
* The wrapper keeps the cache's members: an optional member is there exactly when the cache has it,
  and writes reach the cache.
* Three caches the kit used to pass (audit s57, gap 7 and mutants k08 and k04) are each caught,
  on hand-built request lists:
  * ``blocks_needed`` ignores shared hit blocks, so it over-reports;
  * ``blocks_needed`` ignores ``reserve_tokens``, so it under-reports;
  * a free count that a preemption's ``free`` forgets to update.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.kv_window import SlidingWindow
from schedlab.model import Request
from schedlab.testing import (
    IterationChecker, blocks_for_largest, check_run, compare_runs, examples, kit_settings, requests_lists, run_engine,
)
from schedlab.testing.kv import AccountedKV
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixKVCache
from schedlab_plugins.kv_caches.host_tier import HostTier
from schedlab_plugins.kv_caches.paged import blocks_for
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, SglangConfig, SglangScheduler

ENGINES = ("fast", "reference")
KINDS = ("paged", "prefix", "prefix+host", "radix", "radix+host")


def cache(kind: str, blocks: int, block_size: int, swap: int = 0):
    host = HostTier(6, bytes_per_block=2 ** 20) if kind.endswith("+host") else None
    if kind == "paged":
        return PagedKVCache(blocks, block_size, swap_blocks=swap, bytes_per_block=2 ** 20)
    if kind.startswith("prefix"):
        return PrefixKVCache(blocks, block_size, swap_blocks=swap, bytes_per_block=2 ** 20, host=host)
    return RadixKVCache(blocks, block_size, host=host, bytes_per_block=2 ** 20)


@st.composite
def continuous(draw):
    """vLLM's rules: growing or reserving, recompute or swap preemption, chunks, planning ahead."""
    grow = draw(st.booleans())
    swap = grow and draw(st.booleans())
    return ContinuousConfig(max_num_seqs=draw(st.integers(1, 4)), max_num_batched_tokens=draw(st.integers(16, 128)),
                            chunked_prefill=draw(st.booleans()), allocation="grow" if grow else "reserve",
                            preemption="swap" if swap else "recompute", prefill_first=draw(st.booleans()),
                            async_scheduling=not swap and draw(st.booleans()))


@st.composite
def sglang(draw):
    """SGLang's rules: passes on the radix tree, retraction (a low new-token ratio), overlap scheduling."""
    chunk = draw(st.sampled_from([0, 8, 16]))
    return SglangConfig(max_running_requests=draw(st.integers(1, 4)),
                        max_prefill_tokens=draw(st.sampled_from([16, 1000])), chunked_prefill_size=chunk,
                        enable_mixed_chunk=bool(chunk) and draw(st.booleans()),
                        schedule_policy=draw(st.sampled_from(["fcfs", "lpm", "lof"])),
                        init_new_token_ratio=draw(st.sampled_from([0.0, 0.05, 0.7])),
                        overlap_schedule=draw(st.booleans()))


SCHEDULERS = {"continuous": (continuous(), ContinuousScheduler), "sglang": (sglang(), SglangScheduler)}


@pytest.mark.parametrize("family", sorted(SCHEDULERS))
@pytest.mark.parametrize("kind", KINDS)
def test_built_in_caches_keep_their_accounts_and_wrapping_changes_nothing(kind, family):
    strategy, make_scheduler = SCHEDULERS[family]

    @settings(kit_settings, max_examples=examples(40))
    @given(requests_lists(min_size=2, max_size=8, prefix_groups=2), strategy, st.sampled_from([1, 2, 4, 8]),
           st.integers(0, 3), st.sampled_from([0, 8, 64]), st.sampled_from(ENGINES), st.booleans())
    def check(requests, config, block_size, spare, swap, engine, stepwise):
        blocks = blocks_for_largest(requests, block_size) + spare + 1  # (tight: preemptions, retractions)
        runs = []
        for wrap in (True, False):
            kv = cache(kind, blocks, block_size, swap)
            # (an observer makes the fast engine step one iteration at a time; without, it grows in bulk)
            observer = IterationChecker(loops=False) if engine == "fast" and stepwise else None
            runs.append(run_engine(requests, make_scheduler(config), kv=AccountedKV(kv) if wrap else kv,
                                   engine=engine, check=observer))
        compare_runs(*runs, rel=0.0)
        check_run(runs[0], requests)

    check()


#: What the engines and built-in schedulers read off a cache (grep ``kv.`` and ``getattr(kv`` in schedlab/engine).
MEMBERS = ("allocate", "allocate_decodes", "begin_pass", "blocks_before_eviction", "blocks_needed", "block_size",
           "bytes_per_block", "cached_tokens", "caches_overshoot", "discard", "dfs_weight_order", "end_pass", "epoch",
           "free", "free_swapped", "grow", "hash_lookahead", "host", "make_room", "num_blocks", "num_free_blocks",
           "num_used_blocks", "prefix_caching", "releasing_blocks", "reset_prefix_cache", "sizing", "swap_blocks",
           "swap_in", "swap_out", "touch", "use_hash_lookahead", "window", "window_blocks")


@pytest.mark.parametrize("make", [lambda: PagedKVCache(8, 4, swap_blocks=4),
                                  lambda: PagedKVCache(16, 4, window=SlidingWindow(1, 8, 4)),
                                  lambda: PrefixKVCache(8, 4, host=HostTier(4)), lambda: RadixKVCache(8, 4)])
def test_the_wrapper_has_exactly_the_caches_members_and_writes_reach_it(make):
    inner = make()
    kv = AccountedKV(inner)
    assert type(kv).__name__ == type(inner).__name__  # (the engines' messages name the cache)
    for name in MEMBERS:
        assert hasattr(kv, name) == hasattr(inner, name), name
        if hasattr(inner, name) and not callable(getattr(inner, name)):
            assert getattr(kv, name) == getattr(inner, name), name
    kv.sizing = "sized"
    assert inner.sizing == "sized"


# --- caches the kit passed before -------------------------------------------------------------------------------


def ignoring_hits(kv, seq, num_new_tokens, cached_tokens, reserve_tokens) -> int:
    """The audit's k08: the blocks for the sequence's tokens, less those it holds -- its hit's shared blocks too."""
    tokens = max(seq.num_computed_tokens + cached_tokens + num_new_tokens, reserve_tokens, seq.reserved_tokens)
    return max(0, blocks_for(tokens, kv.block_size) - kv.held(seq))


class PrefixOverReports(PrefixKVCache):
    def blocks_needed(self, seq, num_new_tokens, *, cached_tokens=0, reserve_tokens=0, received=False):
        return ignoring_hits(self, seq, num_new_tokens, cached_tokens, reserve_tokens)


class RadixOverReports(RadixKVCache):
    def blocks_needed(self, seq, num_new_tokens, *, cached_tokens=0, reserve_tokens=0):
        return ignoring_hits(self, seq, num_new_tokens, cached_tokens, reserve_tokens)


#: r1 arrives while r0 runs and shares its 32-token system prompt: its hit is 2 blocks r0 holds
SHARED = [Request(0, 0.0, 40, 20, prefix_group="system", prefix_tokens=32),
          Request(1, 1.0, 40, 20, prefix_group="system", prefix_tokens=32)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("make,scheduler,need,taken", [
    # vLLM reserves prompt + max_tokens (60 tokens, 4 blocks of 16); 2 are r0's, shared
    (PrefixOverReports, lambda: ContinuousScheduler(ContinuousConfig(max_num_seqs=4)), 4, 2),
    # SGLang grows as it computes: the prompt's 3 blocks, 2 of them locked by r0
    (RadixOverReports, lambda: SglangScheduler(SglangConfig(overlap_schedule=False)), 3, 1),
])
def test_blocks_needed_ignoring_shared_hit_blocks_is_caught(engine, make, scheduler, need, taken):
    plain = run_engine(SHARED, scheduler(), kv=make(64, 16), engine=engine)
    check_run(plain, SHARED)  # (the run alone shows nothing wrong)
    with pytest.raises(AssertionError, match=(
            rf"^KV accounting \(blocks_needed is what allocate takes\): allocate\(<request 1>, 8, cached_tokens=32, "
            rf"reserve_tokens=\d+\) for request 1 \(waiting, 0 of 40 tokens computed, 0 reserved\) took {taken} "
            rf"blocks \(used \d+ -> \d+\), but blocks_needed with the same arguments said {need} just before; "
            r"blocks_needed over-reports")):
        run_engine(SHARED, scheduler(), kv=AccountedKV(make(64, 16)), engine=engine)


class ForgetsReservation(PagedKVCache):
    """Under-reports: ``blocks_needed`` leaves ``reserve_tokens`` out (``allocate`` honours it)."""

    def blocks_needed(self, seq, num_new_tokens, *, cached_tokens=0, reserve_tokens=0, received=False):
        return super().blocks_needed(seq, num_new_tokens, cached_tokens=cached_tokens)


@pytest.mark.parametrize("engine", ENGINES)
def test_blocks_needed_under_reporting_is_caught(engine):
    # vLLM's reserving admission: 20 + 30 tokens -> 4 blocks of 16 taken, blocks_needed says the prompt's 2
    requests = [Request(0, 0.0, 20, 30)]
    with pytest.raises(AssertionError, match=(
            r"^KV accounting \(blocks_needed is what allocate takes\): allocate\(<request 0>, 20, cached_tokens=0, "
            r"reserve_tokens=50\) for request 0 \(waiting, 0 of 20 tokens computed, 0 reserved\) took 4 blocks "
            r"\(used 0 -> 4\), but blocks_needed with the same arguments said 2 just before; blocks_needed "
            r"under-reports")):
        run_engine(requests, ContinuousScheduler(ContinuousConfig()), kv=AccountedKV(ForgetsReservation(64, 16)),
                   engine=engine)


class StaleFreeCount(PagedKVCache):
    """The audit's k04: a free counter of its own, which ``free`` forgets to raise for a preempted sequence."""

    def __init__(self, num_blocks, block_size=16):
        super().__init__(num_blocks, block_size)
        self.free_count = num_blocks

    def num_free_blocks(self):
        return self.free_count

    def allocate(self, seq, num_new_tokens, **kwargs):
        used = self.used
        ok = super().allocate(seq, num_new_tokens, **kwargs)
        self.free_count -= self.used - used
        return ok

    def grow(self, num_blocks, freed=0):
        super().grow(num_blocks, freed)
        self.free_count -= num_blocks - freed

    def free(self, seq, *, preempted=False):
        used = self.used
        super().free(seq, preempted=preempted)
        if not preempted:
            self.free_count += used - self.used


@pytest.mark.parametrize("engine", ENGINES)
def test_a_free_count_a_preemption_forgets_is_caught(engine):
    # blocks of 4, 10 in all: two 8-token prompts grow to 24 tokens (6 blocks) each; the pool is full when both
    # hold 5, and vLLM preempts the later one, r1 -- whose 5 blocks the free count never gets back
    requests = [Request(0, 0.0, 8, 16), Request(1, 0.0, 8, 16)]
    with pytest.raises(AssertionError, match=(
            r"^KV accounting \(num_used_blocks \+ num_free_blocks == num_blocks\): after free\(<request 1>, "
            r"preempted=True\), 5 used \+ 0 free = 5 blocks, but the cache has 10$")):
        run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow")),
                   kv=AccountedKV(StaleFreeCount(10, 4)), engine=engine)
