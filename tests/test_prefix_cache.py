"""The prefix-caching KV cache (vLLM V1 block pool semantics).

Small cases are worked out by hand in the comments. The property tests drive the cache the
way the engines do and compare it with a shadow model written here: a plain list of physical
blocks with explicit keys and reference counts, and a list as the LRU free queue.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from schedlab.model import Request
from schedlab_plugins.kv_caches.paged import PagedKVCache
from schedlab_plugins.kv_caches.prefix import PrefixKVCache


class Seq:
    """Stand-in for an engine sequence: the counters the cache reads, kept by the test."""

    def __init__(self, request: Request):
        self.request = request
        self.num_computed_tokens = 0
        self.num_generated = 0
        self.reserved_tokens = 0
        self.kv_state = None
        self.status = "waiting"

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_tokens + self.num_generated


def req(rid, prompt, output=4, **kw) -> Request:
    return Request(id=rid, arrival_ms=0.0, prompt_tokens=prompt, output_tokens=output, **kw)


def admit(cache, seq, n=None, reserve=0):
    """Engine admission: hit, allocate, then the counters the engine sets."""
    hit = cache.cached_tokens(seq)
    if n is None:
        n = seq.num_tokens - hit
    assert cache.allocate(seq, n, cached_tokens=hit, reserve_tokens=reserve)
    seq.num_computed_tokens = hit + n
    seq.reserved_tokens = reserve
    return hit


# --- hand-computed cases ----------------------------------------------------------------------


def test_shared_prefix_refcounts_free_counts_and_lru_eviction():
    # B=4, 10 blocks. A and B share a 12-token (3-block) system prompt; prompts are 14 tokens.
    cache = PrefixKVCache(10, 4)
    a = Seq(req(0, 14, prefix_group="sys", prefix_tokens=12))
    b = Seq(req(1, 14, prefix_group="sys", prefix_tokens=12))
    g3, g7, g11 = ("g", "sys", 3), ("g", "sys", 7), ("g", "sys", 11)

    assert cache.cached_tokens(a) == 0
    assert cache.blocks_needed(a, 14) == 4          # ceil(14/4)
    assert admit(cache, a) == 0
    assert cache.num_free_blocks() == 6
    # blocks 0..2 (last tokens 3, 7, 11 < 12) are full and shareable; block 3 (12..13) is not full
    assert cache.cached_keys() == {g3, g7, g11}
    assert [cache.ref_count(k) for k in (g3, g7, g11)] == [1, 1, 1]

    assert cache.cached_tokens(b) == 12
    assert cache.blocks_needed(b, 2, cached_tokens=12) == 1   # 4 blocks, 3 of them shared and referenced
    assert admit(cache, b) == 12
    assert cache.num_free_blocks() == 5
    assert cache.num_used_blocks() == 5
    assert [cache.ref_count(k) for k in (g3, g7, g11)] == [2, 2, 2]

    cache.free(a)                                    # only A's private last block comes back
    assert cache.num_free_blocks() == 6
    assert [cache.ref_count(k) for k in (g3, g7, g11)] == [1, 1, 1]
    assert cache.lru_keys() == []
    cache.free(b)                                    # B's private block, then 2, 1, 0 (reverse order)
    assert cache.num_free_blocks() == 10
    assert [cache.ref_count(k) for k in (g3, g7, g11)] == [0, 0, 0]
    assert cache.free_queue_layout() == [7, g11, g7, g3]
    cache.check_invariants()

    # A unique 32-token request needs 8 blocks: the 7 anonymous ones, then the LRU head g11.
    c = Seq(req(2, 32))
    admit(cache, c)
    assert cache.cached_keys() == {g3, g7}
    assert cache.evictions == 1
    assert cache.num_free_blocks() == 2
    assert cache.free_queue_layout() == [g7, g3]

    # A group request now hits 2 free cached blocks: 4 blocks total = 2 fresh + 2 revived.
    d = Seq(req(3, 14, prefix_group="sys", prefix_tokens=12))
    assert cache.cached_tokens(d) == 8
    assert cache.blocks_needed(d, 6, cached_tokens=8) == 4
    assert cache.blocks_needed(d, 6, cached_tokens=8) > cache.num_free_blocks()
    assert not cache.allocate(d, 6, cached_tokens=8)          # refused, nothing changed
    assert cache.free_queue_layout() == [g7, g3]
    cache.free(c)                                            # 8 anonymous blocks at the tail
    assert cache.free_queue_layout() == [g7, g3, 8]
    assert admit(cache, d) == 8
    assert [cache.ref_count(k) for k in (g3, g7, g11)] == [1, 1, 1]   # g11 registered again by d
    assert cache.free_queue_layout() == [6]
    assert cache.num_free_blocks() == 6
    cache.check_invariants()


def test_hit_is_capped_below_num_tokens():
    cache = PrefixKVCache(16, 4)
    a = Seq(req(0, 12, prefix_group="p", prefix_tokens=12))
    admit(cache, a)
    assert len(cache.cached_keys()) == 3             # the whole 12-token prompt is cached
    b = Seq(req(1, 12, prefix_group="p", prefix_tokens=12))
    assert cache.cached_tokens(b) == 8               # floor((12 - 1) / 4) * 4
    admit(cache, b)
    # b recomputed block 2, whose key was cached: a duplicate cached under the same key (vLLM
    # keeps duplicates), not a second reference; a lookup still finds a's block first
    assert cache.ref_count(("g", "p", 11)) == 1
    assert cache.ref_count(("g", "p", 3)) == 2
    assert cache.num_used_blocks() == 3 + 1
    cache.free(b)
    assert cache.free_queue_layout() == [16 - 4, ("g", "p", 11)]
    # a prompt of exactly one block can never hit: floor(3 / 4) = 0
    c = Seq(req(2, 4, prefix_group="p", prefix_tokens=4))
    assert cache.cached_tokens(c) == 0
    # with generated tokens the cap moves: 12 + 1 tokens -> 12 cached
    b.num_generated = 1
    assert cache.cached_tokens(b) == 12
    cache.check_invariants()


@pytest.mark.parametrize(
    "block_size, expected",
    [
        # ids per 8 tokens. A: prompt 24, ids (10, 11, 12) -> registers every full block.
        # B: prompt 20, ids (10, 11, 99); C: prompt 20, ids (10, 77, 78).
        # B=4: keys (id, e % 8) for e = 3, 7, 11, 15: B matches (10,3) (10,7) (11,3) (11,7);
        #      limit floor(19/4) = 4 blocks -> 16. C matches (10,3) (10,7), then (77,3) -> 8.
        (4, {"B": 16, "C": 8}),
        # B=16: block 0 ends at e=15 -> (ids[1], 7): B has 11 -> hit 16; C has 77 -> 0.
        (16, {"B": 16, "C": 0}),
        # B=6: e = 5 -> (10,5); e = 11 -> (11,3); e = 17 -> (ids[2],1). B: 99 misses -> 12.
        #      C: (77,3) misses at block 1 -> 6.
        (6, {"B": 12, "C": 6}),
    ],
)
def test_hash_ids_with_other_block_sizes(block_size, expected):
    cache = PrefixKVCache(64, block_size)
    a = Seq(req(0, 24, block_hashes=(10, 11, 12), hash_block_tokens=8))
    admit(cache, a)
    b = Seq(req(1, 20, block_hashes=(10, 11, 99), hash_block_tokens=8))
    c = Seq(req(2, 20, block_hashes=(10, 77, 78), hash_block_tokens=8))
    assert cache.cached_tokens(b) == expected["B"]
    assert cache.cached_tokens(c) == expected["C"]


def test_hash_keys_stop_at_prompt_and_id_list_end():
    # B=4, ids per 8 tokens. prompt 20 with only 2 ids (tokens 0..15 named): blocks 0..3 are
    # identified, block 4 (16..19) has no id -> private. prefix_group takes over where ids end.
    cache = PrefixKVCache(64, 4)
    a = Seq(req(0, 20, block_hashes=(1, 2), hash_block_tokens=8, prefix_group="g", prefix_tokens=20))
    admit(cache, a)
    assert cache.cached_keys() == {("h", 1, 3), ("h", 1, 7), ("h", 2, 3), ("h", 2, 7), ("g", "g", 19)}


def test_an_id_repeated_at_another_position_is_not_a_hit():
    # A bad trace: id 5 at positions 0 and 1. Block 1 has block 0's key; a hit on it would
    # reference one block twice, so the lookup stops there.
    cache = PrefixKVCache(8, 4)
    a = Seq(req(0, 8, block_hashes=(5, 5), hash_block_tokens=4))
    admit(cache, a)
    assert cache.cached_keys() == {("h", 5, 3)}
    b = Seq(req(1, 12, block_hashes=(5, 5, 6), hash_block_tokens=4))
    assert cache.cached_tokens(b) == 4
    admit(cache, b)
    assert cache.num_free_blocks() == 8 - 2 - 2
    cache.free(a)
    cache.free(b)
    assert cache.num_free_blocks() == 8
    cache.check_invariants()


def test_preempted_request_finds_its_blocks_until_evicted():
    cache = PrefixKVCache(8, 4)
    p = Seq(req(7, 10, output=20))                    # no shareable prefix
    admit(cache, p)                                    # 3 blocks
    assert cache.cached_keys() == set()
    p.num_generated = 1                                # prefill done: 11 tokens, 10 computed
    for _ in range(3):                                 # decode steps at computed 10, 11, 12
        assert cache.allocate(p, 1)
        p.num_computed_tokens += 1
        p.num_generated += 1
    assert (p.num_computed_tokens, p.num_tokens) == (13, 14)
    assert cache.num_used_blocks() == 4
    cache.free(p, preempted=True)
    p.num_computed_tokens = 0
    # full blocks 0..2 (12 computed tokens incl. 2 generated) keep own keys; block 3 is anonymous
    r = [("r", 7, j) for j in range(3)]
    assert cache.free_queue_layout() == [5, r[2], r[1], r[0]]
    assert cache.num_free_blocks() == 8
    assert cache.cached_tokens(p) == 12                # prompt + generated, capped at 13

    x = Seq(req(8, 24))                                # 6 blocks: 5 anonymous + evicts r2
    admit(cache, x)
    assert cache.cached_tokens(p) == 8
    cache.free(x)
    assert cache.free_queue_layout() == [r[1], r[0], 6]
    y = Seq(req(9, 4))                                 # 1 block: evicts r1
    admit(cache, y)
    assert cache.cached_tokens(p) == 4
    assert cache.evictions == 2

    # resume: 1 cached block revived + 3 fresh for 14 tokens
    assert cache.blocks_needed(p, 10, cached_tokens=4) == 4
    assert admit(cache, p) == 4
    assert cache.ref_count(r[0]) == 1
    assert cache.num_free_blocks() == 8 - 1 - 4
    cache.check_invariants()


def test_preempt_keeps_shared_blocks_and_skips_duplicates():
    cache = PrefixKVCache(10, 2)
    a = Seq(req(0, 6, prefix_group="s", prefix_tokens=4))
    admit(cache, a)                                    # blocks: g1, g3, private block 2
    assert cache.cached_keys() == {("g", "s", 1), ("g", "s", 3)}
    cache.free(a, preempted=True)
    # block 2 is full (6 computed) -> ("r", 0, 2); reverse order: r2, g3, g1
    assert cache.free_queue_layout() == [7, ("r", 0, 2), ("g", "s", 3), ("g", "s", 1)]
    a.num_computed_tokens = 0
    assert cache.cached_tokens(a) == 4                 # capped: floor(5 / 2) = 2 blocks
    a.num_generated = 1
    assert cache.cached_tokens(a) == 6


def test_a_duplicate_answers_for_its_key_once_the_first_copy_is_evicted():
    cache = PrefixKVCache(10, 2)
    g1, g3 = ("g", "s", 1), ("g", "s", 3)
    a = Seq(req(0, 4, prefix_group="s", prefix_tokens=4))
    admit(cache, a)                                    # g1, g3
    c = Seq(req(1, 4, prefix_group="s", prefix_tokens=4, output=8))
    assert admit(cache, c) == 2                        # capped at floor(3/2) = 1 block
    assert cache.ref_count(g3) == 1                    # c's block 1 is a second g3; lookups find a's first
    c.num_generated = 1
    assert cache.allocate(c, 1)                        # decode: 5 tokens -> 3 blocks
    c.num_computed_tokens, c.num_generated = 5, 2
    cache.free(a)
    assert cache.free_queue_layout() == [6, g3]
    cache.free(c, preempted=True)                      # partial block 2 to the head; c's g3, then g1, to the tail
    c.num_computed_tokens = 0
    assert cache.free_queue_layout() == [7, g3, g3, g1]
    x = Seq(req(2, 16))                                # 8 blocks: 7 anonymous + evicts a's g3
    admit(cache, x)
    assert cache.free_queue_layout() == [g3, g1]
    assert cache.ref_count(g3) == 0                    # c's copy answers for g3 now
    assert cache.cached_tokens(c) == 4                 # 2 blocks of its 6 tokens
    other = Seq(req(3, 6, prefix_group="s", prefix_tokens=4))
    assert cache.cached_tokens(other) == 4
    cache.check_invariants()


def test_blocks_after_a_duplicate_are_still_identified():
    cache = PrefixKVCache(12, 2)
    g1, g3, g5, g7 = (("g", "s", e) for e in (1, 3, 5, 7))
    a = Seq(req(0, 8, prefix_group="s", prefix_tokens=8))
    assert cache.allocate(a, 2)                        # first chunk: block 0 -> g1
    a.num_computed_tokens = 2
    b = Seq(req(1, 10, prefix_group="s", prefix_tokens=8))
    assert admit(cache, b) == 2                        # hits g1, then registers g3 g5 g7
    assert cache.cached_keys() == {g1, g3, g5, g7}
    assert cache.allocate(a, 4)                        # a's blocks 1, 2: second copies of g3 g5
    a.num_computed_tokens = 6
    assert cache.num_free_blocks() == 12 - 1 - 4 - 2
    cache.free(b)
    assert cache.free_queue_layout() == [6, g7, g5, g3]
    x = Seq(req(2, 18))                                # 9 blocks: evicts b's g7 g5 g3
    admit(cache, x)
    cache.free(x)
    assert cache.cached_keys() == {g1, g3, g5}         # a's copies of g3 and g5 remain
    assert cache.allocate(a, 2)                        # block 3 full now: g7 again, a's
    assert cache.cached_keys() == {g1, g3, g5, g7}
    assert cache.num_free_blocks() == 8
    cache.check_invariants()


def test_swapped_in_sequence_identifies_nothing_until_preempted():
    cache = PrefixKVCache(8, 2, swap_blocks=8)
    a = Seq(req(0, 4, prefix_group="s", prefix_tokens=4, output=10))
    admit(cache, a)
    a.num_generated = 1                                # 5 tokens, 4 computed
    assert cache.swap_out(a) is not None
    assert cache.free_queue_layout() == [6, ("g", "s", 3), ("g", "s", 1)]
    x = Seq(req(1, 16))
    admit(cache, x)                                    # all 8 blocks: both keys evicted
    cache.free(x)
    assert cache.swap_in(a) is not None                # ceil(5 / 2) = 3 fresh blocks
    a.num_computed_tokens, a.num_generated = 5, 2      # it decodes in that iteration
    assert cache.allocate(a, 1)                        # a reference-engine decode step
    a.num_computed_tokens, a.num_generated = 6, 3
    assert cache.cached_keys() == set()                # swapped-in blocks stay anonymous
    assert cache.num_free_blocks() == 5
    cache.free(a, preempted=True)                      # now its 3 full blocks get own keys
    assert cache.free_queue_layout() == [5, ("r", 0, 2), ("r", 0, 1), ("r", 0, 0)]


def test_stale_hit_keeps_the_pool_consistent():
    # A hit asked for, then partly evicted before the allocation that uses it: the missing
    # block is taken fresh and registered (the engine counts its tokens as computed).
    cache = PrefixKVCache(6, 2)
    a = Seq(req(0, 4, prefix_group="s", prefix_tokens=4))
    admit(cache, a)
    cache.free(a)
    assert cache.free_queue_layout() == [4, ("g", "s", 3), ("g", "s", 1)]
    b = Seq(req(1, 5, prefix_group="s", prefix_tokens=4))
    hit = cache.cached_tokens(b)
    assert hit == 4
    c = Seq(req(2, 9))                                 # 5 blocks: 4 anonymous + evicts g3
    admit(cache, c)
    cache.free(c)                                      # partial block 4 to the head, 4 full ones to the tail
    assert cache.free_queue_layout() == [1, ("g", "s", 1), 4]
    # 3 blocks for 5 tokens: g1 revived, 2 fresh (one of them standing in for g3)
    assert cache.blocks_needed(b, 1, cached_tokens=hit) == 3
    assert cache.allocate(b, 1, cached_tokens=hit)
    assert cache.num_free_blocks() == 3
    assert cache.cached_keys() == {("g", "s", 1), ("g", "s", 3)}
    assert cache.ref_count(("g", "s", 1)) == 1 and cache.ref_count(("g", "s", 3)) == 1
    cache.check_invariants()


def test_swap_releases_like_a_finish_and_returns_fresh_blocks():
    cache = PrefixKVCache(6, 2, swap_blocks=3, bytes_per_block=1000, host_link_gbps=1.0)
    a = Seq(req(0, 4, prefix_group="s", prefix_tokens=4, output=5))
    admit(cache, a)
    a.num_generated = 1                                # 5 tokens, 4 computed: decoding
    assert cache.allocate(a, 1)                        # 3 blocks
    a.num_computed_tokens, a.num_generated = 5, 2
    assert cache.num_used_blocks() == 3
    ms = cache.swap_out(a)
    assert ms == pytest.approx(3 * 1000 / 1e9 * 1e3)
    assert cache.num_free_blocks() == 6
    assert cache.swap_used == 3
    assert cache.free_queue_layout() == [4, ("g", "s", 3), ("g", "s", 1)]
    b = Seq(req(2, 4, prefix_group="s", prefix_tokens=4))
    admit(cache, b, n=2)                               # hits g1, revived
    assert cache.swap_out(b) is None                   # swap space full; nothing changes
    assert cache.ref_count(("g", "s", 1)) == 1
    assert cache.swap_in(a) == pytest.approx(ms)       # ceil(6 / 2) = 3 fresh blocks from the head
    assert cache.num_free_blocks() == 6 - 2 - 3
    assert cache.free_queue_layout() == [("g", "s", 3)]
    assert cache.swap_used == 0
    cache.check_invariants()
    cache.free(a)                                      # no identified blocks: 3 anonymous, the partial
    assert cache.free_queue_layout() == [1, ("g", "s", 3), 2]  # one at the head, 2 full ones at the tail


def test_blocks_before_eviction_counts_the_anonymous_head():
    cache = PrefixKVCache(6, 2)
    assert cache.blocks_before_eviction() == 6
    a = Seq(req(0, 5, prefix_group="s", prefix_tokens=4))
    admit(cache, a)                                    # g1, g3 and a partial block
    cache.free(a)                                      # the partial block joins the 3 unused at the head
    assert cache.free_queue_layout() == [4, ("g", "s", 3), ("g", "s", 1)]
    assert cache.blocks_before_eviction() == 4
    cache.grow(4)
    assert cache.blocks_before_eviction() == 0         # the next block grow takes is cached


def test_grow_takes_from_the_head_and_refuses_too_many():
    cache = PrefixKVCache(5, 2)
    a = Seq(req(0, 2, prefix_group="s", prefix_tokens=2))
    admit(cache, a)
    cache.free(a)
    assert cache.free_queue_layout() == [4, ("g", "s", 1)]
    cache.grow(4)
    assert cache.cached_keys() == {("g", "s", 1)}
    cache.grow(1)
    assert cache.cached_keys() == set() and cache.evictions == 1
    with pytest.raises(AssertionError):
        cache.grow(1)


def test_unbounded_cache_second_pass_hits():
    # B=4, ids per 8 tokens; every request runs to completion before the next one.
    # pass 1: R0 (20, a b c) 0 | R1 (16, a b) 3 blocks capped -> 12 | R2 (13, a x) 8 | R3 0
    # R0 registers (a,3) (a,7) (b,3) (b,7) (c,3); R1's block 3 (b,7) is a duplicate;
    # R2 registers (x,3); R3 has no ids.
    # pass 2: R0 floor(19/4)=4 blocks -> 16 | R1 12 | R2 (a,3) (a,7) (x,3) -> 12 | R3 0
    specs = [(20, ("a", "b", "c")), (16, ("a", "b")), (13, ("a", "x")), (9, None)]
    cache = PrefixKVCache(10**9, 4)
    hits = []
    rid = 0
    for _ in range(2):
        for prompt, ids in specs:
            seq = Seq(req(rid, prompt, output=6, block_hashes=ids, hash_block_tokens=8))
            rid += 1
            hits.append(admit(cache, seq))
            seq.num_generated = 1
            for _ in range(5):                         # decode through grow, as the fast engine does
                need = cache.blocks_needed(seq, 1)
                cache.grow(need)
                seq.num_computed_tokens += 1
                seq.num_generated += 1
            cache.free(seq)
    assert hits == [0, 12, 8, 0, 16, 12, 12, 0]
    assert sum(hits) == 60
    assert cache.evictions == 0
    assert cache.num_used_blocks() == 0
    cache.check_invariants()


# --- a shadow model and an engine-like driver ----------------------------------------------------


def spec_key(request, j, bs):
    """Block identity as the assignment states it (written independently of the module)."""
    end = (j + 1) * bs - 1
    if request.block_hashes is not None and end < request.prompt_tokens \
            and end < len(request.block_hashes) * request.hash_block_tokens:
        return ("h", request.block_hashes[end // request.hash_block_tokens], end % request.hash_block_tokens)
    if request.prefix_group is not None and end < request.prefix_tokens:
        return ("g", request.prefix_group, end)
    return ("r", request.id, j)


class Shadow:
    """Every physical block explicit: its key, its references; the free queue a list of block numbers."""

    def __init__(self, num_blocks, bs, swap_blocks):
        self.bs = bs
        self.key = [None] * num_blocks
        self.ref = [0] * num_blocks
        self.free = list(range(num_blocks))
        self.table = {}          # key -> physical blocks cached under it, oldest first (vLLM keeps duplicates)
        self.owned = {}          # sequence name -> [physical blocks in index order]
        self.ident = {}          # sequence name -> number of leading identified blocks
        self.sealed = {}
        self.swap_blocks = swap_blocks
        self.swap_used = 0
        self.swapped = {}

    def _find(self, request, j):
        k = spec_key(request, j, self.bs)
        blocks = self.table.get(k)
        if not blocks and k[0] != "r":
            blocks = self.table.get(("r", request.id, j))
        return blocks[0] if blocks else None

    def _cache(self, b, k):
        self.key[b] = k
        self.table.setdefault(k, []).append(b)

    def hit_blocks(self, request, limit):
        found = []
        for j in range(limit):
            b = self._find(request, j)
            if b is None:
                break
            found.append(b)
        return found

    def cached_tokens(self, seq):
        return len(self.hit_blocks(seq.request, (seq.num_tokens - 1) // self.bs)) * self.bs

    def _pop(self):
        b = self.free.pop(0)
        assert self.ref[b] == 0, "a referenced block was evicted"
        k = self.key[b]
        if k is not None:
            self.table[k].remove(b)
            if not self.table[k]:
                del self.table[k]
            self.key[b] = None
        return b

    def _plan(self, name, seq, n, cached, reserve):
        owned = self.owned.get(name, [])
        hits = self.hit_blocks(seq.request, cached // self.bs) if cached and not owned else []
        total = math.ceil(max(seq.num_computed_tokens + cached + n, reserve, seq.reserved_tokens) / self.bs)
        fresh = total - len(owned) - len(hits)
        return hits, fresh, fresh + sum(1 for b in hits if self.ref[b] == 0)

    def needed(self, name, seq, n, cached=0, reserve=0):
        return self._plan(name, seq, n, cached, reserve)[2]

    def allocate(self, name, seq, n, cached=0, reserve=0):
        hits, fresh, need = self._plan(name, seq, n, cached, reserve)
        if need > len(self.free):
            return False
        owned = self.owned.setdefault(name, [])
        self.ident.setdefault(name, 0)
        self.sealed.setdefault(name, False)
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
            owned.append(b)
        self.ident[name] += len(hits)
        for _ in range(fresh):
            b = self._pop()
            self.ref[b] = 1
            owned.append(b)
        if not self.sealed[name]:
            full = (seq.num_computed_tokens + cached + n) // self.bs
            j = self.ident[name]
            while j < full:
                k = spec_key(seq.request, j, self.bs)
                if k[0] == "r":
                    self.sealed[name] = True
                    break
                self._cache(owned[j], k)
                j += 1
            self.ident[name] = j
        return True

    def decode_need(self, name, seq):
        total = math.ceil(max(seq.num_computed_tokens + 1, seq.reserved_tokens) / self.bs)
        return max(0, total - len(self.owned[name]))

    def decode(self, items):
        for name, seq in items:
            for _ in range(self.decode_need(name, seq)):
                b = self._pop()
                self.ref[b] = 1
                self.owned[name].append(b)

    def release(self, name, seq, preempted=False):
        owned = self.owned.pop(name, [])
        ident = self.ident.pop(name, 0)
        self.sealed.pop(name, None)
        if preempted:
            for j in range(ident, seq.num_computed_tokens // self.bs):
                self._cache(owned[j], ("r", seq.request.id, j))
        # vLLM 0.33 BlockPool.free_blocks: blocks that are not full have no hash and go to the
        # head of the free queue; full ones to the tail, the request's last block first
        full = seq.num_computed_tokens // self.bs
        head = []
        for j in reversed(range(len(owned))):
            b = owned[j]
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if j < full:
                    self.free.append(b)
                else:
                    head.append(b)
        self.free[:0] = head

    def swap_out(self, name, seq):
        held = len(self.owned.get(name, []))
        if self.swap_used + held > self.swap_blocks:
            return False
        self.release(name, seq)
        self.swap_used += held
        self.swapped[name] = held
        return True

    def swap_in(self, name, seq):
        need = math.ceil(max(seq.num_computed_tokens + 1, seq.reserved_tokens) / self.bs)
        if need > len(self.free):
            return False
        self.owned[name] = []
        for _ in range(need):
            b = self._pop()
            self.ref[b] = 1
            self.owned[name].append(b)
        self.ident[name] = 0
        self.sealed[name] = True
        self.swap_used -= self.swapped.pop(name)
        return True

    # observations
    def layout(self):
        out = []
        for b in self.free:
            if self.key[b] is not None:
                out.append(self.key[b])
            elif out and isinstance(out[-1], int):
                out[-1] += 1
            else:
                out.append(1)
        return out

    def refs(self):
        return {k: self.ref[blocks[0]] for k, blocks in self.table.items()}


class Driver:
    """Plays the engine for one cache: sequence counters, admission, prefill, decode, finish.

    Operations pick sequences with integers (``pick % count``) so that one script can drive
    several drivers identically. With ``shadow``, every call is mirrored and cross-checked.
    """

    def __init__(self, cache, *, bulk, shadow=None):
        self.cache = cache
        self.bulk = bulk
        self.shadow = shadow
        self.seqs = {}           # name -> Seq
        self.next_name = 0

    def _named(self, status):
        return sorted(name for name, s in self.seqs.items() if s.status == status)

    def _pick(self, status, pick):
        names = self._named(status)
        return names[pick % len(names)] if names else None

    def add(self, request):
        name = self.next_name
        self.next_name += 1
        self.seqs[name] = Seq(request)
        return name

    def _computed(self, name, seq):
        """The step's tokens are computed: a completed prefill yields a token."""
        if seq.num_computed_tokens == seq.num_tokens:
            seq.num_generated += 1
            if seq.num_generated >= seq.request.target_tokens:
                self._release(name, seq, preempted=False)
                del self.seqs[name]
            else:
                seq.status = "decoding"
        else:
            seq.status = "prefilling"

    def _release(self, name, seq, preempted):
        if self.shadow is not None:
            self.shadow.release(name, seq, preempted)
        self.cache.free(seq, preempted=preempted)

    def admit(self, pick, n_pick, reserve):
        name = self._pick("waiting", pick)
        if name is None:
            return
        seq = self.seqs[name]
        cache, shadow = self.cache, self.shadow
        hit = cache.cached_tokens(seq)
        n = 1 + n_pick % (seq.num_tokens - hit)
        r = seq.request.prompt_tokens + seq.request.max_output_tokens if reserve else 0
        need = cache.blocks_needed(seq, n, cached_tokens=hit, reserve_tokens=r)
        free = cache.num_free_blocks()
        if shadow is not None:
            assert hit == shadow.cached_tokens(seq)
            assert need == shadow.needed(name, seq, n, hit, r)
        ok = cache.allocate(seq, n, cached_tokens=hit, reserve_tokens=r)
        assert ok == (need <= free)
        if shadow is not None:
            assert shadow.allocate(name, seq, n, hit, r) == ok
        if ok:
            assert cache.num_free_blocks() == free - need
            seq.reserved_tokens = r
            seq.num_computed_tokens = hit + n
            self._computed(name, seq)

    def extend(self, pick, n_pick):
        name = self._pick("prefilling", pick)
        if name is None:
            return
        seq = self.seqs[name]
        n = 1 + n_pick % (seq.num_tokens - seq.num_computed_tokens)
        need = self.cache.blocks_needed(seq, n)
        free = self.cache.num_free_blocks()
        if self.shadow is not None:
            assert need == self.shadow.needed(name, seq, n)
        ok = self.cache.allocate(seq, n)
        assert ok == (need <= free)
        if self.shadow is not None:
            assert self.shadow.allocate(name, seq, n) == ok
        if ok:
            seq.num_computed_tokens += n
            self._computed(name, seq)

    def decode(self):
        names = self._named("decoding")
        if not names:
            return
        seqs = [self.seqs[n] for n in names]
        need = sum(self.cache.blocks_needed(s, 1) for s in seqs)
        if self.shadow is not None:
            assert need == sum(self.shadow.decode_need(n, s) for n, s in zip(names, seqs))
        if need > self.cache.num_free_blocks():
            return
        if self.bulk:
            self.cache.grow(need)
        else:
            for s in seqs:
                assert self.cache.allocate(s, 1)
        if self.shadow is not None:
            self.shadow.decode(list(zip(names, seqs)))
        for name, s in zip(names, seqs):
            s.num_computed_tokens += 1
            s.num_generated += 1
            if s.num_generated >= s.request.target_tokens:
                self._release(name, s, preempted=False)
                del self.seqs[name]

    def finish(self, pick):
        names = self._named("prefilling") + self._named("decoding")
        if not names:
            return
        name = sorted(names)[pick % len(names)]
        self._release(name, self.seqs[name], preempted=False)
        del self.seqs[name]

    def preempt(self, pick):
        names = sorted(self._named("prefilling") + self._named("decoding"))
        if not names:
            return
        name = names[pick % len(names)]
        seq = self.seqs[name]
        self._release(name, seq, preempted=True)
        seq.num_computed_tokens = 0
        seq.reserved_tokens = 0
        seq.status = "waiting"

    def swap_out(self, pick):
        name = self._pick("decoding", pick)
        if name is None:
            return
        seq = self.seqs[name]
        ms = self.cache.swap_out(seq)
        if self.shadow is not None:
            assert self.shadow.swap_out(name, seq) == (ms is not None)
        if ms is not None:
            seq.status = "swapped"

    def swap_in(self, pick):
        name = self._pick("swapped", pick)
        if name is None:
            return
        seq = self.seqs[name]
        ms = self.cache.swap_in(seq)
        if self.shadow is not None:
            assert self.shadow.swap_in(name, seq) == (ms is not None)
        if ms is not None:                             # it decodes in this iteration
            seq.status = "decoding"
            seq.num_computed_tokens += 1
            seq.num_generated += 1
            if seq.num_generated >= seq.request.target_tokens:
                self._release(name, seq, preempted=False)
                del self.seqs[name]

    def apply(self, op):
        getattr(self, op[0])(*op[1:])


@st.composite
def requests_specs(draw):
    """Keyword arguments of a small request: shared group prefixes and/or consistent hash ids."""
    prompt = draw(st.integers(1, 14))
    kw = {"prompt_tokens": prompt, "output_tokens": draw(st.integers(1, 6))}
    if draw(st.booleans()):
        kw["prefix_group"] = draw(st.sampled_from(["a", "b"]))
        kw["prefix_tokens"] = draw(st.integers(0, prompt))
    if draw(st.booleans()):
        # ids are filled in by make_request: (tokens per id, family, how many ids are shared)
        kw["hash_ids"] = (draw(st.integers(1, 5)), draw(st.integers(0, 1)), draw(st.integers(0, 4)))
    return kw


def make_request(rid, kw):
    """A request from ``requests_specs``; its ids name whole prefixes, as in a real trace:
    a family's shared ids depend on the position and the id size, the rest are the request's own."""
    kw = dict(kw)
    ids = kw.pop("hash_ids", None)
    if ids is not None:
        per, family, shared = ids
        kw["block_hashes"] = tuple(("f", family, per, i) if i < shared else ("u", rid, i)
                                   for i in range(-(-kw["prompt_tokens"] // per)))
        kw["hash_block_tokens"] = per
    return Request(id=rid, arrival_ms=0.0, **kw)


OPS = st.one_of(
    st.tuples(st.just("new"), requests_specs()),
    st.tuples(st.just("admit"), st.integers(0, 50), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("extend"), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("decode")),
    st.tuples(st.just("decode")),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("preempt"), st.integers(0, 50)),
    st.tuples(st.just("swap_out"), st.integers(0, 50)),
    st.tuples(st.just("swap_in"), st.integers(0, 50)),
)


def observable(cache):
    return (cache.num_free_blocks(), cache.cached_keys(), cache.free_queue_layout(),
            {k: cache.ref_count(k) for k in cache.cached_keys()}, cache.evictions)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_blocks=st.integers(2, 12), bs=st.integers(1, 4), swap=st.integers(0, 6),
       ops=st.lists(OPS, max_size=60))
def test_decode_one_by_one_equals_bulk_grow(num_blocks, bs, swap, ops):
    assert_bulk_equals_each(lambda: PrefixKVCache(num_blocks, bs, swap_blocks=swap), ops, observable)


def assert_bulk_equals_each(make_cache, ops, observe) -> None:
    """Replay ``ops`` on two caches, decoding one step at a time and in bulk runs: after every
    op the two look the same through ``observe`` and keep their invariants."""
    each = Driver(make_cache(), bulk=False)
    bulk = Driver(make_cache(), bulk=True)
    rid = 0
    for op in ops:
        for d in (each, bulk):
            if op[0] == "new":
                d.add(make_request(rid, op[1]))
            else:
                d.apply(op)
        rid += op[0] == "new"
        assert observe(each.cache) == observe(bulk.cache)
        each.cache.check_invariants()
        bulk.cache.check_invariants()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_blocks=st.integers(2, 12), bs=st.integers(1, 4), swap=st.integers(0, 6), bulk=st.booleans(),
       ops=st.lists(OPS.filter(lambda op: op[0] != "preempt"), max_size=60))
def test_without_shared_prefixes_it_counts_like_the_plain_pool(num_blocks, bs, swap, bulk, ops):
    # No prefix metadata and no preemption: no block ever gets an identity, so the prefix
    # cache must allocate, refuse and release exactly like the count-only PagedKVCache.
    plain = Driver(PagedKVCache(num_blocks, bs, swap_blocks=swap), bulk=bulk)
    prefix = Driver(PrefixKVCache(num_blocks, bs, swap_blocks=swap), bulk=bulk)
    rid = 0
    for op in ops:
        for d in (plain, prefix):
            if op[0] == "new":
                kw = {k: v for k, v in op[1].items() if k in ("prompt_tokens", "output_tokens")}
                d.add(make_request(rid, kw))
            else:
                d.apply(op)
        rid += op[0] == "new"
        assert plain.cache.num_free_blocks() == prefix.cache.num_free_blocks()
        assert plain.cache.swap_used == prefix.cache.swap_used
        assert {n: s.status for n, s in plain.seqs.items()} == {n: s.status for n, s in prefix.seqs.items()}
        assert prefix.cache.cached_keys() == set()
        prefix.cache.check_invariants()


class DriverMachine(RuleBasedStateMachine):
    """The engine-like steps every cache machine takes through its ``self.driver``: arrivals,
    admissions (whole or a chunk, reserving or not), chunks, decodes, finishes and recompute
    preemptions. Subclasses set up the cache, the shadow and the driver."""

    @rule(kw=requests_specs())
    def arrive(self, kw):
        self.driver.add(make_request(self.next_id, kw))
        self.next_id += 1

    @rule(pick=st.integers(0, 50), n_pick=st.integers(0, 50), reserve=st.booleans())
    def admit(self, pick, n_pick, reserve):
        self.driver.admit(pick, n_pick, reserve)

    @rule(pick=st.integers(0, 50), n_pick=st.integers(0, 50))
    def extend(self, pick, n_pick):
        self.driver.extend(pick, n_pick)

    @rule()
    def decode(self):
        self.driver.decode()

    @rule(pick=st.integers(0, 50))
    def finish(self, pick):
        self.driver.finish(pick)

    @rule(pick=st.integers(0, 50))
    def preempt(self, pick):
        self.driver.preempt(pick)


class SwappingMachine(DriverMachine):
    """A :class:`DriverMachine` that also swaps sequences out to host memory and back in."""

    @rule(pick=st.integers(0, 50))
    def swap_out(self, pick):
        self.driver.swap_out(pick)

    @rule(pick=st.integers(0, 50))
    def swap_in(self, pick):
        self.driver.swap_in(pick)


class PrefixCacheMachine(SwappingMachine):
    """The cache against the shadow model, under engine-like admissions, chunks, decodes,
    finishes, recompute preemptions and swaps."""

    @initialize(num_blocks=st.integers(2, 12), bs=st.integers(1, 4), swap=st.integers(0, 6),
                bulk=st.booleans())
    def setup(self, num_blocks, bs, swap, bulk):
        self.cache = PrefixKVCache(num_blocks, bs, swap_blocks=swap)
        self.shadow = Shadow(num_blocks, bs, swap)
        self.driver = Driver(self.cache, bulk=bulk, shadow=self.shadow)
        self.next_id = 0
        self.last_refs = {}

    @invariant()
    def pool_accounting(self):
        c = self.cache
        assert c.num_used_blocks() + c.num_free_blocks() == c.num_blocks
        assert 0 <= c.num_used_blocks() <= c.num_blocks
        c.check_invariants()

    @invariant()
    def agrees_with_shadow(self):
        c, s = self.cache, self.shadow
        assert c.num_free_blocks() == len(s.free)
        assert c.cached_keys() == set(s.table)
        assert c.free_queue_layout() == s.layout()
        refs = s.refs()
        assert {k: c.ref_count(k) for k in c.cached_keys()} == refs
        assert c.swap_used == s.swap_used
        for name, seq in self.driver.seqs.items():
            if seq.status in ("prefilling", "decoding"):
                held = max(math.ceil(seq.reserved_tokens / c.block_size),
                           math.ceil(seq.num_computed_tokens / c.block_size))
                assert len(s.owned[name]) == held

    @invariant()
    def only_unreferenced_blocks_are_evicted(self):
        refs = {k: self.cache.ref_count(k) for k in self.cache.cached_keys()}
        for key, ref in self.last_refs.items():
            if key not in refs:
                assert ref == 0, f"{key} was evicted while referenced"
        self.last_refs = refs

    @invariant()
    def hits_leave_a_token_to_compute(self):
        for seq in self.driver.seqs.values():
            if seq.status == "waiting":
                hit = self.cache.cached_tokens(seq)
                assert hit <= seq.num_tokens - 1
                assert hit % self.cache.block_size == 0


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestPrefixCacheMachine = PrefixCacheMachine.TestCase
