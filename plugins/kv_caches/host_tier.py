"""A host-memory (CPU DRAM) tier under a GPU prefix cache: blocks the GPU evicts, kept by key.

Follows vLLM 0.33's ``SimpleCPUOffloadConnector`` with ``lazy_offload``
(``vllm/v1/simple_kv_offload/manager.py``): the CPU pool is a second block pool of
``cpu_bytes // bytes_per_block`` blocks with prefix-cache identities, and

* a GPU block that carries an identity is copied to it when the GPU pool evicts the block
  (lazy mode copies blocks near the head of the GPU free queue, i.e. about to be evicted);
  a block whose key is already there is not copied again and keeps its place;
* a copy takes a free host block, evicting the least recently used one when the tier is
  full (the CPU pool's free queue);
* a prefix lookup that misses on the GPU continues in the host tier, block by block
  (``get_num_new_matched_tokens``: consecutive hits, at most ``num_tokens - 1`` tokens in
  all); the blocks found are loaded into fresh GPU blocks and their host copies become the
  most recently used (touched while the load runs, then freed to the tail of the queue).

The same component serves SGLang's radix cache as HiCache does (``hiradix_cache.py`` with
``write_back``: device nodes evicted to host, loaded back on a match).

Timing. A reload of ``n`` blocks costs ``n x bytes_per_block / host_link`` plus a fixed
``latency``, added to the iteration that admits the request (LMCache's default synchronous
retrieval in ``start_load_kv``, before the forward pass; vLLM's native connectors load
asynchronously instead, see the README). Copies to the host are not charged: every system
named here runs them on a separate stream, off the forward pass.

Simplifications: a copy to the host happens at the moment of the GPU eviction (vLLM copies a
few steps ahead, HiCache at eviction); host blocks being loaded are not pinned, so a tier
smaller than one admission's traffic can drop a block in the same allocation that loads it
(after its copy); the host LRU is refreshed by copies and loads only, not by GPU hits
(HiCache's nodes share one access time across tiers).
"""

from __future__ import annotations

from collections import OrderedDict

#: Counters a tier adds to the run's counters once an engine attaches it (see
#: :data:`schedlab.engine.recorder.COUNTERS`).
STORE_COUNTER = "host_store_blocks"
EVICT_COUNTER = "host_evictions"


class HostTier:
    """An LRU of block keys in host memory, ``capacity`` blocks of ``bytes_per_block`` bytes.

    :ivar stored: blocks copied to the tier.
    :ivar evicted: blocks dropped from the tier to make room.
    :ivar loaded: blocks loaded back to the GPU.
    :ivar dropped: blocks dropped by :meth:`reset_prefix_cache` (a restart).
    """

    def __init__(self, capacity: int, *, bytes_per_block: int = 0, link_gbps: float = 25.0,
                 latency_us: float = 0.0):
        if capacity < 0:
            raise ValueError(f"host tier capacity must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self.bytes_per_block = bytes_per_block
        self.link_gbps = link_gbps
        self.latency_us = latency_us
        self._lru: OrderedDict[tuple, int] = OrderedDict()  # key -> block index; head = next to evict
        self.stored = 0
        self.evicted = 0
        self.loaded = 0
        self.dropped = 0
        self._counters: dict | None = None

    def attach(self, counters: dict) -> None:
        """Mirror copies and evictions into a run's counters (the engines call this)."""
        self._counters = counters

    # -- queries -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._lru)

    def index_of(self, key: tuple) -> int | None:
        """The block index ``key`` was stored at, or None if the tier does not hold it."""
        return self._lru.get(key)

    def load_ms(self, blocks: int) -> float:
        """Time to bring ``blocks`` blocks back over the host link, in ms (0 for none)."""
        if not blocks:
            return 0.0
        return blocks * self.bytes_per_block / (self.link_gbps * 1e9) * 1e3 + self.latency_us / 1e3

    # -- changes ---------------------------------------------------------------------------
    def store(self, key: tuple, index: int) -> None:
        """Copy a block the GPU evicts; a key already held stays where it is."""
        lru = self._lru
        if key in lru or not self.capacity:
            return
        if len(lru) >= self.capacity:
            lru.popitem(last=False)
            self.evicted += 1
            if self._counters is not None:
                self._counters[EVICT_COUNTER] += 1
        lru[key] = index
        self.stored += 1
        if self._counters is not None:
            self._counters[STORE_COUNTER] += 1

    def load(self, keys) -> None:
        """Load held blocks back to the GPU: each becomes the most recently used."""
        lru = self._lru
        n = 0
        for key in keys:
            lru.move_to_end(key)
            n += 1
        self.loaded += n

    def reset_prefix_cache(self) -> None:
        """Drop every copy: the host memory of an engine process that stopped (an autoscaled
        instance's restart; its GPU cache's ``reset_prefix_cache`` calls this). The counters go
        on: the copies count as ``dropped``, not evicted."""
        self.dropped += len(self._lru)
        self._lru.clear()

    # -- inspection (tests) ----------------------------------------------------------------
    def lru_keys(self) -> list:
        """Held keys, next to be evicted first."""
        return list(self._lru)

    def check_invariants(self) -> None:
        assert 0 <= len(self._lru) <= self.capacity, (len(self._lru), self.capacity)
        assert self.stored == len(self._lru) + self.evicted + self.dropped, (
            self.stored, len(self._lru), self.evicted, self.dropped)
