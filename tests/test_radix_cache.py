"""The radix-tree KV cache (SGLang's RadixAttention on block keys).

Small cases are worked out by hand in the comments; B is the block size, ``gK`` the key of a
shared-prefix block whose last token is K, ``r(i, j)`` request i's own block j. The property
tests drive the cache the way the engines do (the driver of ``test_prefix_cache``) and compare
it with a shadow model written here from the rules: blocks keyed by their whole path, lock
counts derived from the running sequences' paths, eviction by scanning for the least recently
used unlocked leaf.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from schedlab.testing import examples
from schedlab_plugins.kv_caches.prefix import PrefixKVCache, block_key, first_own_block
from schedlab_plugins.kv_caches.radix import RadixKVCache
from test_prefix_cache import (OPS, Driver, DriverMachine, Seq, admit, assert_bulk_equals_each, make_request, req,
                               requests_specs, spec_key)

G = lambda e: ("g", "sys", e)  # noqa: E731
P = lambda e: ("g", "p", e)    # noqa: E731


def finish(cache, seq, generated, computed=None):
    """The sequence decoded to ``generated`` tokens (blocks grown as the fast engine does), then finishes."""
    seq.status = "decoding"
    target = seq.request.prompt_tokens + generated - 1 if computed is None else computed
    while seq.num_computed_tokens < target:
        cache.grow(cache.blocks_needed(seq, 1))
        seq.num_computed_tokens += 1
    seq.num_generated = generated
    cache.free(seq)


@settings(max_examples=examples(300), deadline=None)
@given(kw=requests_specs(), bs=st.integers(1, 9))
def test_own_keys_start_where_first_own_block_says(kw, bs):
    """The radix cache writes ``("r", id, j)`` keys directly from ``first_own_block`` on."""
    request = make_request(7, kw)
    own = first_own_block(request, bs)
    kinds = [block_key(request, j, bs)[0] for j in range(-(-request.prompt_tokens // bs) + 3)]
    assert all(k != "r" for k in kinds[:own]) and all(k == "r" for k in kinds[own:])


# --- hand-computed cases ----------------------------------------------------------------------


def test_shared_prefix_locks_finish_insertion_and_whole_node_eviction():
    # B=4, 12 blocks. A and B: 14-token prompts sharing a 12-token system prompt.
    cache = RadixKVCache(12, 4)
    a = Seq(req(0, 14, prefix_group="sys", prefix_tokens=12))
    b = Seq(req(1, 14, prefix_group="sys", prefix_tokens=12))
    assert admit(cache, a) == 0
    # A's 3 full blocks form one node, locked by A; its 4th (partial) block is private
    assert cache.layout() == {(G(3), G(7), G(11)): ((G(3), G(7), G(11)), 1, 1)}
    assert cache.num_free_blocks() == 8
    a.status = "decoding"
    assert cache.cached_tokens(b) == 12
    assert cache.blocks_needed(b, 2, cached_tokens=12) == 1       # 4 blocks, 3 of them A's
    assert admit(cache, b) == 12
    assert cache.layout()[(G(3), G(7), G(11))][1] == 2            # locked by A and B
    assert cache.num_free_blocks() == 7
    # A decodes 3 tokens (17 computed: blocks 0-3 full, block 4 partial) and finishes: block 3,
    # r(0,3), enters the tree as an unlocked leaf; its partial block is freed
    finish(cache, a, generated=4)
    # (access ticks: A's admission 1, B's 2, A's finish touches the path root-first: 3, 4)
    assert cache.layout() == {(G(3), G(7), G(11)): ((G(3), G(7), G(11)), 1, 3),
                              (G(3), G(7), G(11), ("r", 0, 3)): ((("r", 0, 3),), 0, 4)}
    # A grew one block (7 -> 6 free) and gave back two: the partial one and the evictable leaf
    assert cache.num_free_blocks() == 6 + 1 + 1
    finish(cache, b, generated=1)                                 # B finished at its prefill: nothing new
    assert cache.layout()[(G(3), G(7), G(11))] == ((G(3), G(7), G(11)), 0, 5)
    assert cache.num_used_blocks() == 0 and cache.num_free_blocks() == 12
    assert (cache.unused, cache.evictable) == (8, 4)
    cache.check_invariants()

    # C (36 unique tokens, 9 blocks): 8 unused, short by 1: the only leaf, r(0,3), goes
    c = Seq(req(2, 36))
    admit(cache, c)
    assert cache.evictions == 1
    assert set(cache.layout()) == {(G(3), G(7), G(11)), tuple(("r", 2, j) for j in range(9))}
    # D (8 tokens, 2 blocks): short by 2; the system prompt's node is now a leaf and goes whole (3 blocks)
    d = Seq(req(3, 8))
    admit(cache, d)
    assert cache.evictions == 4
    assert cache.unused == 1
    assert cache.cached_tokens(Seq(req(4, 14, prefix_group="sys", prefix_tokens=12))) == 0
    cache.check_invariants()


def test_a_match_ending_inside_a_node_splits_it():
    # B=4. A caches a 16-token prefix (one node of 4 blocks) and finishes. B shares only 8 tokens:
    # its hit stops inside A's node, which is split there; B's own blocks hang below the head.
    cache = RadixKVCache(20, 4)
    a = Seq(req(0, 17, prefix_group="p", prefix_tokens=16))
    admit(cache, a)
    finish(cache, a, generated=1)
    b = Seq(req(1, 17, prefix_group="p", prefix_tokens=8))
    assert cache.cached_tokens(b) == 8
    # 5 blocks: 2 hit blocks revived from the evictable node + 3 fresh ones
    assert cache.blocks_needed(b, 9, cached_tokens=8) == 5
    assert admit(cache, b) == 8
    layout = cache.layout()
    assert layout[(P(3), P(7))][:2] == ((P(3), P(7)), 1)
    assert layout[(P(3), P(7), P(11), P(15))][:2] == ((P(11), P(15)), 0)          # the tail, still cached
    assert layout[(P(3), P(7), ("r", 1, 2), ("r", 1, 3))][:2] == ((("r", 1, 2), ("r", 1, 3)), 1)
    assert cache.num_free_blocks() == 20 - 5
    cache.check_invariants()


def test_recomputed_last_block_switches_to_the_trees_copy():
    # B=4, prompts of exactly 12 tokens sharing them all. At least one token must be computed, so B's
    # hit stops at 8 and B recomputes block 2 -- which is in the tree: B uses the tree's copy (SGLang
    # frees the duplicate), so the two requests hold 3 blocks, not 4.
    cache = RadixKVCache(10, 4)
    a = Seq(req(0, 12, prefix_group="p", prefix_tokens=12))
    admit(cache, a)
    a.status = "decoding"
    b = Seq(req(1, 12, prefix_group="p", prefix_tokens=12))
    assert cache.cached_tokens(b) == 8
    assert cache.blocks_needed(b, 4, cached_tokens=8) == 0          # 1 fresh block, returned at once
    assert admit(cache, b) == 8
    assert cache.num_used_blocks() == 3
    assert cache.layout() == {(P(3), P(7), P(11)): ((P(3), P(7), P(11)), 2, 2)}
    # the paged prefix cache keeps B's recomputed block as a private duplicate
    paged = PrefixKVCache(10, 4)
    admit(paged, Seq(req(0, 12, prefix_group="p", prefix_tokens=12)))
    admit(paged, Seq(req(1, 12, prefix_group="p", prefix_tokens=12)))
    assert paged.num_used_blocks() == 4
    # once A has finished the node is evictable: B's hit revives 2 blocks and its duplicate 1
    cache.free(b)
    finish(cache, a, generated=1)
    c = Seq(req(2, 12, prefix_group="p", prefix_tokens=12))
    assert cache.blocks_needed(c, 4, cached_tokens=8) == 3
    admit(cache, c)
    assert cache.num_used_blocks() == 3
    cache.check_invariants()


def test_retraction_keeps_the_prompt_and_frees_the_decode_blocks():
    # B=4. A (9-token prompt, 8 shared) decodes 5 tokens: 13 computed = blocks g3, g7 (its locked path),
    # block 2 (full, decode) and block 3 (partial). Retracted, it frees blocks 2 and 3 and unlocks its
    # path; back in the queue with 14 tokens it finds only the prompt's blocks (SGLang recomputes the
    # generated tokens). The paged prefix cache (vLLM) also keeps block 2 under A's own key.
    radix, paged = RadixKVCache(8, 4), PrefixKVCache(8, 4)
    for cache in (radix, paged):
        a = Seq(req(0, 9, output=10, prefix_group="p", prefix_tokens=8))
        admit(cache, a)
        a.status = "decoding"
        while a.num_computed_tokens < 13:
            cache.grow(cache.blocks_needed(a, 1))
            a.num_computed_tokens += 1
        a.num_generated = 5
        assert cache.num_used_blocks() == 4
        cache.free(a, preempted=True)
        a.num_computed_tokens = 0
        a.status = "waiting"
        assert cache.num_used_blocks() == 0
        cache.check_invariants()
    for cache, hit in ((radix, 8), (paged, 12)):
        back = Seq(req(0, 9, output=10, prefix_group="p", prefix_tokens=8))
        back.num_generated = 5
        assert cache.cached_tokens(back) == hit
    assert radix.layout() == {(P(3), P(7)): ((P(3), P(7)), 0, 1)}


def test_discarding_an_aborted_chunked_prefill_drops_its_newest_chunk_from_the_tree():
    # B=4, SGLang's passes. A (16-token prompt, all shared) computes its first chunk of 8 in pass 1
    # and its second of 4 in pass 2; its client gives up before pass 3. SGLang put the first chunk
    # in the tree at pass 2 (stash_chunked_request) but drops the request at pass 3 before it
    # stashes the second: a later request finds 8 tokens, not 12. Freeing it as finished (free)
    # would have kept both; every block is free either way.
    def run(release):
        cache = RadixKVCache(8, 4)
        a = Seq(req(0, 16, output=2, prefix_group="p", prefix_tokens=16))
        cache.begin_pass()
        admit(cache, a, n=8)
        cache.end_pass()
        cache.begin_pass()
        assert cache.allocate(a, 4)
        a.num_computed_tokens = 12
        cache.end_pass()
        release(cache, a)
        assert cache.num_used_blocks() == 0
        cache.check_invariants()
        cache.begin_pass()
        return cache.cached_tokens(Seq(req(1, 16, output=2, prefix_group="p", prefix_tokens=16)))

    assert run(lambda cache, seq: cache.discard(seq)) == 8
    assert run(lambda cache, seq: cache.free(seq)) == 12


def test_locked_paths_are_never_evicted_and_a_refusal_changes_nothing():
    cache = RadixKVCache(6, 2)
    a = Seq(req(0, 8, prefix_group="p", prefix_tokens=8))
    admit(cache, a)                                    # 4 full blocks: one node, locked
    a.status = "decoding"
    b = Seq(req(1, 4, prefix_group="q", prefix_tokens=4))
    admit(cache, b)
    finish(cache, b, generated=1)                      # b's node (2 blocks) stays, evictable
    assert cache.num_free_blocks() == 2
    before = (cache.layout(), cache.unused, cache.evictable, cache.evictions)
    c = Seq(req(2, 7))
    assert cache.blocks_needed(c, 7) == 4
    assert not cache.allocate(c, 7)
    assert (cache.layout(), cache.unused, cache.evictable, cache.evictions) == before
    d = Seq(req(3, 3))
    assert cache.allocate(d, 3)                        # 2 blocks, none unused: q's whole node is evicted
    assert cache.evictions == 2
    assert all(lock for _, lock, _ in cache.layout().values())
    cache.check_invariants()


# --- where the radix cache and the paged prefix cache differ --------------------------------------


def test_whole_node_eviction_versus_vllms_block_lru():
    # B=4, 4 blocks. A (9 tokens, 8 shared) caches g3 g7 and finishes. D needs 3 blocks with 2 free:
    # SGLang evicts the least recently used leaf -- the whole two-block node -- while vLLM takes its
    # free queue's head, whose blocks a request releases last-first: only g7 goes.
    hits = {}
    for cache in (RadixKVCache(4, 4), PrefixKVCache(4, 4)):
        a = Seq(req(0, 9, prefix_group="p", prefix_tokens=8))
        admit(cache, a)
        finish(cache, a, generated=1)
        admit(cache, Seq(req(1, 12)))
        hits[type(cache).__name__] = (cache.cached_tokens(Seq(req(2, 9, prefix_group="p", prefix_tokens=8))),
                                      cache.evictions)
    assert hits == {"RadixKVCache": (0, 2), "PrefixKVCache": (4, 1)}


def test_a_retracted_requests_decode_blocks_are_reused_first_unlike_vllm():
    # B=4, 6 blocks. A (9 tokens, 8 shared) caches p3 p7 and finishes; its partial block is free.
    # R (4 unique tokens) decodes to 12 computed tokens (3 blocks) and is preempted. SGLang frees
    # R's two decode blocks (only its prompt block stays in the tree), so C (12 tokens) finds 3 free
    # blocks and A's prefix survives. vLLM 0.33 caches R's full blocks under R's own keys at the tail
    # of its free queue; C takes the head: A's partial block, then p7 and p3 -- the prefix is gone,
    # while R would find all 12 of its tokens again (SGLang: 4).
    hits = {}
    for cache in (RadixKVCache(6, 4), PrefixKVCache(6, 4)):
        a = Seq(req(0, 9, prefix_group="p", prefix_tokens=8))
        admit(cache, a)
        finish(cache, a, generated=1)
        r = Seq(req(1, 4, output=20))
        admit(cache, r)
        r.status = "decoding"
        while r.num_computed_tokens < 12:
            cache.grow(cache.blocks_needed(r, 1))
            r.num_computed_tokens += 1
        r.num_generated = 9
        cache.free(r, preempted=True)
        r.num_computed_tokens, r.status = 0, "waiting"
        admit(cache, Seq(req(2, 12)))
        hits[type(cache).__name__] = (cache.cached_tokens(Seq(req(3, 9, prefix_group="p", prefix_tokens=8))),
                                      cache.cached_tokens(r), cache.evictions)
    assert hits == {"RadixKVCache": (8, 4, 0), "PrefixKVCache": (0, 12, 2)}


# --- a shadow model -------------------------------------------------------------------------------


class RadixShadow:
    """The rules, written out plainly: every block is named by its whole path of keys; a node is a
    label on consecutive blocks of one path; a node's lock count is the number of running sequences
    whose locked path covers it; eviction scans every node for the least recently used unlocked leaf.

    Same interface as ``test_prefix_cache.Shadow`` so that its ``Driver`` can mirror every call.
    """

    def __init__(self, num_blocks, bs):
        self.bs = bs
        self.num_blocks = num_blocks
        self.unused = num_blocks
        self.node = {}       # block path -> node label
        self.info = {}       # node label -> [tick, uid]
        self.paths = {}      # sequence name -> its locked path (a tuple of keys)
        self.tick = 0
        self.uid = 0
        self.evictions = 0

    # structure
    def keys(self, seq, n):
        return tuple(spec_key(seq.request, j, self.bs) for j in range(n))

    def blocks(self, label):
        return sorted((p for p, n in self.node.items() if n == label), key=len)

    def end(self, label):
        return self.blocks(label)[-1]

    def lock(self, label):
        end = self.end(label)
        return sum(1 for p in self.paths.values() if p[:len(end)] == end)

    def has_child(self, label):
        end = self.end(label)
        return any(len(p) == len(end) + 1 and p[:-1] == end for p in self.node)

    def match(self, keys, start):
        j = start
        while j < len(keys) and keys[:j + 1] in self.node:
            j += 1
        return j

    def evictable(self):
        return sum(1 for p, n in self.node.items() if self.lock(n) == 0)

    def free_blocks(self):
        return self.unused + self.evictable()

    def held(self, seq):
        return math.ceil(max(seq.num_computed_tokens, seq.reserved_tokens) / self.bs)

    # edits
    def split_at(self, path):
        """Make a node end at ``path`` (its head gets a new label, the tail keeps the old one);
        both are accessed now, the head first (SGLang's ``_split_node``)."""
        if not path:
            return
        label = self.node[path]
        if self.end(label) == path:
            return
        self.uid += 1
        self.tick += 1
        self.info[self.uid] = [self.tick, self.uid]
        self.tick += 1
        self.info[label][0] = self.tick
        for p in self.blocks(label):
            if len(p) <= len(path):
                self.node[p] = self.uid

    def new_node(self, keys, start, stop):
        self.uid += 1
        self.info[self.uid] = [self.tick, self.uid]
        for j in range(start, stop):
            self.node[keys[:j + 1]] = self.uid

    def touch(self, path):
        seen = []
        for j in range(1, len(path) + 1):
            label = self.node[path[:j]]
            if label not in seen:
                seen.append(label)
        for label in seen:
            self.tick += 1
            self.info[label][0] = self.tick

    def take(self, count):
        if count > self.unused:
            freed = 0
            while freed < count - self.unused:
                leaves = {n for n in self.node.values() if self.lock(n) == 0 and not self.has_child(n)}
                victim = min(leaves, key=lambda n: tuple(self.info[n]))
                gone = self.blocks(victim)
                for p in gone:
                    del self.node[p]
                del self.info[victim]
                freed += len(gone)
            self.unused += freed
            self.evictions += freed
        self.unused -= count

    # the driver's interface
    def cached_tokens(self, seq):
        limit = (seq.num_tokens - 1) // self.bs
        return self.match(self.keys(seq, limit), 0) * self.bs

    def _plan(self, name, seq, n, cached, reserve):
        held = self.held(seq)
        path = self.paths.get(name, ())
        tokens = seq.num_computed_tokens + cached + n
        want = cached // self.bs if not held else 0
        full = tokens // self.bs if seq.status != "decoding" else 0
        limit = max(want, full)
        hits = revived = shared = unshared = reached = 0
        if limit > len(path):
            keys = self.keys(seq, limit)
            assert keys[:len(path)] == path
            reached = self.match(keys, len(path))
            hits = min(reached, want)
            for j in range(len(path), reached):
                locked = self.lock(self.node[keys[:j + 1]]) > 0
                if j < want:
                    revived += not locked
                elif locked:
                    shared += 1
                else:
                    unshared += 1
        fresh = math.ceil(max(tokens, reserve, seq.reserved_tokens) / self.bs) - held - hits
        return fresh, revived, shared, unshared, full, limit

    def needed(self, name, seq, n, cached=0, reserve=0):
        fresh, revived, shared, _, _, _ = self._plan(name, seq, n, cached, reserve)
        return fresh + revived - shared

    def allocate(self, name, seq, n, cached=0, reserve=0):
        fresh, revived, shared, unshared, full, limit = self._plan(name, seq, n, cached, reserve)
        if fresh + revived - shared > self.free_blocks():
            return False
        path = self.paths.get(name, ())
        if limit > len(path):
            keys = self.keys(seq, limit)
            reached = self.match(keys, len(path))
            self.split_at(keys[:reached])
            self.paths[name] = keys[:reached]          # locked from now on
            self.take(fresh - shared - unshared)
            if reached < full:
                self.new_node(keys, reached, full)
                self.paths[name] = keys[:full]
            self.touch(self.paths[name])
        else:
            self.take(fresh)
        return True

    def decode_need(self, name, seq):
        return max(0, math.ceil(max(seq.num_computed_tokens + 1, seq.reserved_tokens) / self.bs) - self.held(seq))

    def decode(self, items):
        self.take(sum(self.decode_need(name, seq) for name, seq in items))

    def release(self, name, seq, preempted=False):
        path = self.paths.pop(name, ())
        private = self.held(seq) - len(path)
        if not preempted:
            full = seq.num_computed_tokens // self.bs
            end = path
            if full > len(path):
                keys = self.keys(seq, full)
                reached = self.match(keys, len(path))
                self.split_at(keys[:reached])
                end = keys[:reached]
                if reached < full:
                    self.new_node(keys, reached, full)
                    private -= full - reached
                    end = keys[:full]
            self.touch(end)
        self.unused += private

    def layout(self):
        out = {}
        for label in set(self.node.values()):
            blocks = self.blocks(label)
            out[blocks[-1]] = (tuple(p[-1] for p in blocks), self.lock(label), self.info[label][0])
        return out


# whole prompts shared and a multiple of every block size drawn: a request whose prompt is all
# cached recomputes its last block, which is already in the tree (the duplicate case)
TWINS = st.fixed_dictionaries({"prompt_tokens": st.sampled_from([4, 8, 12]), "output_tokens": st.integers(1, 6),
                               "prefix_group": st.just("t")}).map(lambda kw: {**kw, "prefix_tokens": kw["prompt_tokens"]})
RADIX_OPS = st.one_of(OPS.filter(lambda op: op[0] not in ("swap_out", "swap_in")), st.tuples(st.just("new"), TWINS))


def observable(cache):
    return cache.num_free_blocks(), cache.layout(), cache.evictions, cache.unused


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_blocks=st.integers(2, 12), bs=st.integers(1, 4), ops=st.lists(RADIX_OPS, max_size=60))
def test_decode_one_by_one_equals_bulk_grow(num_blocks, bs, ops):
    """The reference engine allocates decode blocks one sequence at a time, the fast engine in one
    ``grow``: evicting only the shortfall makes the two end in the same state."""
    assert_bulk_equals_each(lambda: RadixKVCache(num_blocks, bs), ops, observable)


class RadixCacheMachine(DriverMachine):
    """The cache against the shadow model, under engine-like admissions, chunks, decodes, finishes
    and retractions."""

    @initialize(num_blocks=st.integers(2, 14), bs=st.integers(1, 4), bulk=st.booleans())
    def setup(self, num_blocks, bs, bulk):
        self.cache = RadixKVCache(num_blocks, bs)
        self.shadow = RadixShadow(num_blocks, bs)
        self.driver = Driver(self.cache, bulk=bulk, shadow=self.shadow)
        self.next_id = 0
        self.last_locks = {}

    @rule(kw=requests_specs() | TWINS)
    def arrive(self, kw):
        self.driver.add(make_request(self.next_id, kw))
        self.next_id += 1

    @invariant()
    def agrees_with_shadow(self):
        c, s = self.cache, self.shadow
        assert c.layout() == s.layout()
        assert c.num_free_blocks() == s.free_blocks()
        assert (c.unused, c.evictions) == (s.unused, s.evictions)
        c.check_invariants()
        assert c.num_used_blocks() + c.num_free_blocks() == c.num_blocks

    @invariant()
    def running_sequences_hold_their_blocks(self):
        # protected + private blocks = the blocks the running sequences hold, shared ones once
        c = self.cache
        running = [s for s in self.driver.seqs.values() if s.status in ("prefilling", "decoding")]
        private = sum(c.held(s) - s.kv_state.length for s in running)
        protected = sum(len(keys) for keys, lock, _ in c.layout().values() if lock)
        assert c.num_used_blocks() == private + protected
        for s in running:
            assert s.kv_state.length <= c.held(s)

    @invariant()
    def only_unlocked_nodes_are_evicted(self):
        locks = {path: lock for path, (_, lock, _) in self.cache.layout().items()}
        for path, lock in self.last_locks.items():
            if path not in locks:  # evicted (a split node's tail keeps its path)
                assert lock == 0, f"{path} was evicted while locked"
        self.last_locks = locks


RadixCacheMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestRadixCacheMachine = RadixCacheMachine.TestCase
