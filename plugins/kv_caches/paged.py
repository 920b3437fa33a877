"""Paged KV cache (vLLM's PagedAttention block pool) without prefix caching, plus CPU swap space.

Blocks are counted, not identified: with no prefix caching no block is ever shared, so the
pool is one number. A sequence holds ``max(ceil(reserved / B), ceil(computed / B))`` blocks
(``B`` = block size); allocation takes the difference, release gives it back. Swap space
(vLLM V0) holds whole sequences' blocks on the host; moving them costs
``blocks x bytes_per_block / host_link_bandwidth``.

With a ``window`` (:class:`schedlab.kv_window.SlidingWindow`: a model whose sliding-window
layers keep only their window, in KV cache groups of their own) a sequence also holds its
window layers' blocks, :meth:`PagedKVCache.window_blocks`: each allocation frees those that
fell out of the window and takes those up to the step's end, from the same pool. A sequence
whose last allocation was a decode keeps ``SlidingWindow.held(c - 1, c)`` at ``c`` computed
tokens, so after the fast engine's bulk decode run (``grow(taken, freed)``: the blocks the run
took and the window blocks it gave back) its count follows its computed tokens without being
touched.
"""

from __future__ import annotations


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _decode(seq, num_new_tokens: int, cached_tokens: int, reserve_tokens: int, received: bool = False) -> bool:
    """An allocation of one token from ``seq``'s computed ones, with no reservation: a decode, after
    which its window holds ``held(c, c + 1)`` -- what a bulk run of decodes keeps it at."""
    return (num_new_tokens == 1 and not cached_tokens and not reserve_tokens and not seq.reserved_tokens
            and not received)


class PagedKVCache:
    """Count-only block pool; ``grow`` lets the fast engine allocate many decode blocks at once."""

    prefix_caching = False

    def __init__(self, num_blocks: int, block_size: int = 16, *, swap_blocks: int = 0,
                 bytes_per_block: int = 0, host_link_gbps: float = 25.0, window=None):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.used = 0
        self.swap_blocks = swap_blocks
        self.swap_used = 0
        self.bytes_per_block = bytes_per_block
        self.host_link_gbps = host_link_gbps
        self.window = window
        self._window_held: dict = {}  # sequence -> blocks its window layers hold (as of _window_end)
        # sequence -> the token count its last allocation, a decode, reached: at more computed
        # tokens it has run on in bulk and holds held(c - 1, c) (window_blocks)
        self._window_end: dict = {}
        if window is not None and window.block_size != block_size:
            raise ValueError(f"window of {window.block_size}-token blocks for a cache of {block_size}-token ones")

    # -- queries -------------------------------------------------------------------------
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.used

    def num_used_blocks(self) -> int:
        return self.used

    def held(self, seq) -> int:
        """Blocks ``seq`` holds between iterations (its window layers' apart: :meth:`window_blocks`)."""
        c = seq.num_computed_tokens
        r = seq.reserved_tokens
        return -(-(c if c > r else r) // self.block_size)

    def window_blocks(self, seq) -> int:
        """Blocks ``seq``'s window layers hold (0 without a window): what its last allocation left,
        or, if that was a decode and it has run on since (the fast engine's bulk runs), what a
        decode at each token would have left -- up to its last slot: its computed tokens, or the
        slot it holds for a token in flight (``reserved_tokens``, planning ahead)."""
        end = self._window_end.get(seq)
        if end is not None:
            c = seq.num_computed_tokens
            r = seq.reserved_tokens
            if r > c:
                c = r
            if c > end:
                return self.window.held(c - 1, c)
        return self._window_held.get(seq, 0)

    def _window_change(self, seq, num_new_tokens: int, cached_tokens: int, reserve_tokens: int,
                       computed: int | None = None, received: bool = False) -> int:
        """How many window blocks an allocation takes (negative: frees) -- those that fell out of
        the window go, those up to the step's end come (:meth:`SlidingWindow.held`). A sequence
        reserving room for ``R`` tokens (it is never to be preempted) keeps the most its window
        can hold: while decoding (:meth:`SlidingWindow.fewest` of ``R``) or while the rest of its
        tokens so far are computed in one step -- no later chunk or decode needs another block."""
        window = self.window
        start = (seq.num_computed_tokens if computed is None else computed) + cached_tokens
        end = start + num_new_tokens
        if received:  # (KV received computed -- a disaggregated decode instance's pull -- is processed
            start = end  # already: only the next token's window is kept, vLLM's allocate_external_computed_blocks)
        held = window.held(start, end)
        reserved = reserve_tokens if reserve_tokens > seq.reserved_tokens else seq.reserved_tokens
        if reserved:
            most = max(window.fewest(reserved), window.held(start, seq.num_tokens))
            if most > held:
                held = most
        return held - self.window_blocks(seq)

    def _window_release(self, seq) -> int:
        """Forget ``seq``'s window blocks; how many it held."""
        held = self.window_blocks(seq)
        self._window_held.pop(seq, None)
        self._window_end.pop(seq, None)
        return held

    def cached_tokens(self, seq) -> int:
        return 0

    def _plan_slots(self, seq, num_new_tokens: int, cached_tokens: int, reserve_tokens: int,
                    received: bool = False) -> tuple:
        """``(blocks leaving the free pool, what taking them needs)`` for :meth:`allocate`'s
        arguments (negative: a window's blocks come back); :meth:`_take_slots` takes them."""
        c = seq.num_computed_tokens
        r = seq.reserved_tokens
        tokens = c + cached_tokens + num_new_tokens
        if reserve_tokens > tokens:
            tokens = reserve_tokens
        if r > tokens:
            tokens = r
        need = -(-tokens // self.block_size) + (c if c > r else r) // -self.block_size
        if self.window is None:
            return need, need
        change = self._window_change(seq, num_new_tokens, cached_tokens, reserve_tokens, c, received)
        return need + change, (change, _decode(seq, num_new_tokens, cached_tokens, reserve_tokens, received))

    def _take_slots(self, seq, num_new_tokens: int, cached_tokens: int, total: int, detail) -> None:
        self.used += total
        if self.window is not None:
            self._window_settle(seq, *detail)

    def blocks_needed(self, seq, num_new_tokens: int, *, cached_tokens: int = 0, reserve_tokens: int = 0,
                      received: bool = False) -> int:
        total = self._plan_slots(seq, num_new_tokens, cached_tokens, reserve_tokens, received)[0]
        return total if total > 0 else 0

    # -- changes ---------------------------------------------------------------------------
    def allocate(self, seq, num_new_tokens: int, *, cached_tokens: int = 0, reserve_tokens: int = 0,
                 received: bool = False) -> bool:
        """:meth:`KVCache.allocate`; ``received`` (a windowed cache's): the tokens' KV arrives
        computed elsewhere (a disaggregated decode instance's pull), their window slid already."""
        total, detail = self._plan_slots(seq, num_new_tokens, cached_tokens, reserve_tokens, received)
        if total > self.num_blocks - self.used:
            return False
        self._take_slots(seq, num_new_tokens, cached_tokens, total, detail)
        return True

    def allocate_decodes(self, seqs) -> bool:
        """A slot for one more token of each sequence in ``seqs``, all or none: :meth:`allocate`
        ``(seq, 1)`` for each, each planned once (the engines' decode step where the cache has
        no ``grow``, as with a window)."""
        plans = [self._plan_slots(seq, 1, 0, 0) for seq in seqs]
        # (as the sum of blocks_needed: a window block one sequence frees is not counted for another)
        if sum(total for total, _ in plans if total > 0) > self.num_blocks - self.used:
            return False
        take = self._take_slots
        for seq, (total, detail) in zip(seqs, plans):
            take(seq, 1, 0, total, detail)
        return True

    def _window_settle(self, seq, change: int, decode: bool = False) -> None:
        """``seq``'s window blocks change by ``change``; ``decode``: the allocation was a decode
        (:func:`_decode`: its window count follows its computed tokens from there,
        :meth:`window_blocks`)."""
        held = self.window_blocks(seq) + change
        if held:
            self._window_held[seq] = held
        else:
            self._window_held.pop(seq, None)
        if decode:
            self._window_end[seq] = seq.num_computed_tokens + 1
        else:
            self._window_end.pop(seq, None)

    def grow(self, num_blocks: int, freed: int = 0) -> None:
        """Take ``num_blocks`` decode blocks for many sequences at once (the engine attributes them)
        and, with a window, give back the ``freed`` window blocks their decodes let go."""
        if num_blocks - freed > self.num_blocks - self.used:
            raise AssertionError(f"grow({num_blocks}, {freed}) with only {self.num_blocks - self.used} free blocks")
        self.used += num_blocks - freed

    def free(self, seq, *, preempted: bool = False) -> None:
        self.used -= self.held(seq) + self._window_release(seq)

    # -- swap space ------------------------------------------------------------------------
    def transfer_ms(self, blocks: int) -> float:
        """Time to move ``blocks`` over the host link, in ms."""
        return blocks * self.bytes_per_block / (self.host_link_gbps * 1e9) * 1e3

    def swap_out(self, seq) -> float | None:
        """Move ``seq``'s blocks (its window layers' too) to swap space; None if it does not fit there."""
        held = self.held(seq)
        blocks = held + self.window_blocks(seq)
        if self.swap_used + blocks > self.swap_blocks:
            return None
        self._window_release(seq)
        self.used -= blocks
        self.swap_used += blocks
        seq.kv_state = blocks
        return self.transfer_ms(blocks)

    def free_swapped(self, seq) -> None:
        """Drop a swapped-out ``seq``'s copy in swap space (its client gave up)."""
        self.swap_used -= seq.kv_state
        seq.kv_state = None

    def swapped_blocks(self, seq) -> int:
        """The blocks swapped-out ``seq`` holds in swap space: what :meth:`swap_out` moved and
        charged (window blocks, a pending slot included), what :meth:`swap_in` moves back. The
        engines count swaps by it (optional for a plugin's cache: else the computed tokens' blocks;
        a subclass keeping something else in ``kv_state`` overrides it)."""
        return seq.kv_state

    def _swap_in_need(self, seq) -> tuple[int, int]:
        """(blocks, window blocks) a swapped-out ``seq`` comes back into, with room for its next token."""
        tokens = seq.num_computed_tokens + 1
        if seq.reserved_tokens > tokens:
            tokens = seq.reserved_tokens
        window = 0 if self.window is None else self.window.held(seq.num_computed_tokens, seq.num_computed_tokens + 1)
        return -(-tokens // self.block_size), window

    def swap_in_blocks(self, seq) -> int:
        """The blocks swapped-out ``seq`` would take back (window blocks included), with room for
        its next token: what :meth:`swap_in` asks free, and what a scheduler holding a watermark
        checks against it first (vLLM V0 ``_can_swap``: ``num_blocks_touched``)."""
        need, window = self._swap_in_need(seq)
        return need + window

    def swap_in(self, seq) -> float | None:
        """Bring ``seq`` back with room for its next token; None if the GPU lacks the blocks."""
        blocks = seq.kv_state
        need, window = self._swap_in_need(seq)
        if need + window > self.num_blocks - self.used:
            return None
        self.used += need + window
        if window:
            self._window_settle(seq, window)
        self.swap_used -= blocks
        seq.kv_state = None
        return self.transfer_ms(blocks)

    # -- a restart ------------------------------------------------------------------------
    def reset_prefix_cache(self) -> None:
        """Leave the pool as freshly built (an autoscaled instance's restart; the protocol's
        optional member): nothing is cached here, so this only checks that no sequence holds a
        block or swap space (RuntimeError otherwise)."""
        self._check_idle()

    def _check_idle(self) -> None:
        if self.used or self.swap_used:
            raise RuntimeError(f"cannot reset the prefix cache while {self.used} blocks and {self.swap_used} "
                               "swap blocks are in use")

    def check_invariants(self) -> None:
        assert 0 <= self.used <= self.num_blocks, (self.used, self.num_blocks)
        held = [self.window_blocks(seq) for seq in self._window_held]
        assert all(n > 0 for n in held) and sum(held) <= self.used, (held, self.used)
        assert 0 <= self.swap_used <= self.swap_blocks, (self.swap_used, self.swap_blocks)
