"""The paged KV cache (with swap space) against a shadow model that tracks every sequence."""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from schedlab_plugins.kv_caches import PagedKVCache


class FakeSeq:
    def __init__(self, n: int):
        self.n = n
        self.num_computed_tokens = 0
        self.reserved_tokens = 0
        self.kv_state = None


class PagedMachine(RuleBasedStateMachine):
    """Shadow: blocks held per running sequence, blocks per swapped sequence."""

    @initialize(num_blocks=st.integers(1, 12), block_size=st.integers(1, 4), swap=st.integers(0, 10))
    def setup(self, num_blocks, block_size, swap):
        self.kv = PagedKVCache(num_blocks, block_size, swap_blocks=swap, bytes_per_block=100, host_link_gbps=1.0)
        self.bs = block_size
        self.held: dict[FakeSeq, int] = {}
        self.swapped: dict[FakeSeq, int] = {}
        self.made = 0

    def blocks(self, tokens):
        return math.ceil(tokens / self.bs)

    def free(self):
        return self.kv.num_blocks - sum(self.held.values())

    @rule(tokens=st.integers(1, 20), reserve=st.booleans(), extra=st.integers(0, 10))
    def admit(self, tokens, reserve, extra):
        seq = FakeSeq(self.made)
        self.made += 1
        reserve_tokens = tokens + extra if reserve else 0
        need = self.blocks(max(tokens, reserve_tokens))
        ok = self.kv.allocate(seq, tokens, reserve_tokens=reserve_tokens)
        assert ok == (need <= self.free())
        if ok:
            seq.num_computed_tokens = tokens
            seq.reserved_tokens = reserve_tokens
            self.held[seq] = need

    @precondition(lambda self: self.held)
    @rule(data=st.data(), tokens=st.integers(1, 6))
    def extend(self, data, tokens):
        seq = data.draw(st.sampled_from(sorted(self.held, key=lambda s: s.n)))
        target = self.blocks(max(seq.num_computed_tokens + tokens, seq.reserved_tokens))
        need = target - self.held[seq]
        assert self.kv.blocks_needed(seq, tokens) == need
        ok = self.kv.allocate(seq, tokens)
        assert ok == (need <= self.free())
        if ok:
            seq.num_computed_tokens += tokens
            self.held[seq] = target

    @precondition(lambda self: self.held)
    @rule()
    def decode_step_in_bulk(self):
        """grow(n): the fast engine's decode allocation for every sequence at once."""
        needs = {s: self.blocks(max(s.num_computed_tokens + 1, s.reserved_tokens)) - self.held[s] for s in self.held}
        total = sum(needs.values())
        if total > self.free():
            return
        self.kv.grow(total)
        for s, need in needs.items():
            s.num_computed_tokens += 1
            self.held[s] += need

    @precondition(lambda self: self.held)
    @rule(data=st.data(), preempted=st.booleans())
    def release(self, data, preempted):
        seq = data.draw(st.sampled_from(sorted(self.held, key=lambda s: s.n)))
        self.kv.free(seq, preempted=preempted)
        del self.held[seq]

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def swap_out(self, data):
        seq = data.draw(st.sampled_from(sorted(self.held, key=lambda s: s.n)))
        blocks = self.held[seq]
        fits = sum(self.swapped.values()) + blocks <= self.kv.swap_blocks
        ms = self.kv.swap_out(seq)
        assert (ms is not None) == fits
        if fits:
            assert ms == blocks * 100 / 1e9 * 1e3
            self.swapped[seq] = self.held.pop(seq)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data):
        seq = data.draw(st.sampled_from(sorted(self.swapped, key=lambda s: s.n)))
        need = self.blocks(max(seq.num_computed_tokens + 1, seq.reserved_tokens))
        ms = self.kv.swap_in(seq)
        assert (ms is not None) == (need <= self.free())
        if ms is not None:  # a swapped-in sequence decodes in that same iteration
            del self.swapped[seq]
            seq.num_computed_tokens += 1
            self.held[seq] = need

    @invariant()
    def agrees_with_shadow(self):
        if not hasattr(self, "kv"):
            return
        used = sum(self.held.values())
        assert self.kv.num_used_blocks() == used
        assert self.kv.num_used_blocks() + self.kv.num_free_blocks() == self.kv.num_blocks
        assert used <= self.kv.num_blocks
        assert self.kv.swap_used == sum(self.swapped.values()) <= self.kv.swap_blocks
        for seq, blocks in self.held.items():
            assert self.kv.held(seq) == blocks
        self.kv.check_invariants()


TestPagedKVCache = PagedMachine.TestCase
TestPagedKVCache.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
