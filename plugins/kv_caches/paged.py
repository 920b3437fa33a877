"""Paged KV cache (vLLM's PagedAttention block pool) without prefix caching, plus CPU swap space.

Blocks are counted, not identified: with no prefix caching no block is ever shared, so the
pool is one number. A sequence holds ``max(ceil(reserved / B), ceil(computed / B))`` blocks
(``B`` = block size); allocation takes the difference, release gives it back. Swap space
(vLLM V0) holds whole sequences' blocks on the host; moving them costs
``blocks x bytes_per_block / host_link_bandwidth``.
"""

from __future__ import annotations


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class PagedKVCache:
    """Count-only block pool; ``grow`` lets the fast engine allocate many decode blocks at once."""

    prefix_caching = False

    def __init__(self, num_blocks: int, block_size: int = 16, *, swap_blocks: int = 0,
                 bytes_per_block: int = 0, host_link_gbps: float = 25.0):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.used = 0
        self.swap_blocks = swap_blocks
        self.swap_used = 0
        self.bytes_per_block = bytes_per_block
        self.host_link_gbps = host_link_gbps

    # -- queries -------------------------------------------------------------------------
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.used

    def num_used_blocks(self) -> int:
        return self.used

    def held(self, seq) -> int:
        """Blocks ``seq`` holds between iterations."""
        c = seq.num_computed_tokens
        r = seq.reserved_tokens
        return -(-(c if c > r else r) // self.block_size)

    def cached_tokens(self, seq) -> int:
        return 0

    def blocks_needed(self, seq, num_new_tokens: int, *, cached_tokens: int = 0, reserve_tokens: int = 0) -> int:
        tokens = seq.num_computed_tokens + cached_tokens + num_new_tokens
        if reserve_tokens > tokens:
            tokens = reserve_tokens
        if seq.reserved_tokens > tokens:
            tokens = seq.reserved_tokens
        return -(-tokens // self.block_size) - self.held(seq)

    # -- changes ---------------------------------------------------------------------------
    def allocate(self, seq, num_new_tokens: int, *, cached_tokens: int = 0, reserve_tokens: int = 0) -> bool:
        need = self.blocks_needed(seq, num_new_tokens, cached_tokens=cached_tokens, reserve_tokens=reserve_tokens)
        if need > self.num_blocks - self.used:
            return False
        self.used += need
        return True

    def grow(self, num_blocks: int) -> None:
        """Take ``num_blocks`` decode blocks for many sequences at once (the engine attributes them)."""
        if num_blocks > self.num_blocks - self.used:
            raise AssertionError(f"grow({num_blocks}) with only {self.num_blocks - self.used} free blocks")
        self.used += num_blocks

    def free(self, seq, *, preempted: bool = False) -> None:
        self.used -= self.held(seq)

    # -- swap space ------------------------------------------------------------------------
    def transfer_ms(self, blocks: int) -> float:
        """Time to move ``blocks`` over the host link, in ms."""
        return blocks * self.bytes_per_block / (self.host_link_gbps * 1e9) * 1e3

    def swap_out(self, seq) -> float | None:
        """Move ``seq``'s blocks to swap space; None if it does not fit there."""
        blocks = self.held(seq)
        if self.swap_used + blocks > self.swap_blocks:
            return None
        self.used -= blocks
        self.swap_used += blocks
        seq.kv_state = blocks
        return self.transfer_ms(blocks)

    def free_swapped(self, seq) -> None:
        """Drop a swapped-out ``seq``'s copy in swap space (its client gave up)."""
        self.swap_used -= seq.kv_state
        seq.kv_state = None

    def swap_in(self, seq) -> float | None:
        """Bring ``seq`` back with room for its next token; None if the GPU lacks the blocks."""
        blocks = seq.kv_state
        tokens = seq.num_computed_tokens + 1
        if seq.reserved_tokens > tokens:
            tokens = seq.reserved_tokens
        need = -(-tokens // self.block_size)
        if need > self.num_blocks - self.used:
            return None
        self.used += need
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
        assert 0 <= self.swap_used <= self.swap_blocks, (self.swap_used, self.swap_blocks)
