"""A host-memory (CPU DRAM) tier under a GPU prefix cache: copies of prefix-cache blocks, kept by key.

The CPU pool is a second block pool of ``host bytes per rank // bytes_per_block`` blocks with
prefix-cache identities (vLLM 0.33 ``v1/kv_offload``, SGLang ``HostKVCache``), and

* ``write_policy = "write_through"`` (the caches' settings default, as in both systems: vLLM's
  ``OffloadingConnector``, which ``--kv-offloading-size`` selects, stores every computed block,
  ``offloading/scheduler.py`` ``_build_store_jobs``; SGLang's default ``--hicache-write-policy``
  backs a node up when it is inserted): a block is copied when it gets its identity, so the
  tier holds copies of GPU blocks and a GPU eviction copies nothing (a request's own full blocks
  -- its unique prompt tail, its output -- too: the paged cache copies them when it leaves);
  ``"write_back"`` (this class's own default; SGLang's ``write_back``, vLLM's
  ``SimpleCPUOffloadConnector`` with ``lazy_offload`` roughly): a block is copied when the GPU
  pool evicts it. A block whose key is already held is not copied again and keeps its place;
* a copy takes a free host block, evicting the least recently used one when the tier is
  full (the CPU pool's free queue);
* a prefix lookup that misses on the GPU continues in the host tier, block by block
  (``get_num_new_matched_tokens``: consecutive hits, at most ``num_tokens - 1`` tokens in
  all); the blocks found are loaded into fresh GPU blocks and their host copies become the
  most recently used (touched while the load runs, then freed to the tail of the queue);
* with window layers (vLLM's hybrid KV manager) a copy carries the window KV of the positions
  the GPU keeps it for (``has_window``), as the ``OffloadingConnector`` offloads and looks up
  the window groups too: a page of each window group beside the full-attention page, so such a
  copy takes ``1 + groups`` of the tier's blocks, and its reload moves them all. The tier's
  capacity and its counters (stored, evicted, loaded, dropped) are in those pages.

The same component serves SGLang's radix cache as HiCache does (``hiradix_cache.py``).

Timing. A reload of ``n`` blocks costs ``n x bytes_per_block / host_link`` plus a fixed
``latency``, added to the iteration that admits the request: a synchronous load (the legacy
``LMCacheConnectorV1``'s; vLLM 0.33's native connectors and ``LMCacheMPConnector`` load
asynchronously, the request waiting in ``WAITING_FOR_REMOTE_KVS``, and HiCache overlaps a load
layer by layer; see the README). Copies to the host are not charged: vLLM stores asynchronously,
and so does HiCache's ``write_through``; HiCache's ``write_back`` waits for its copies at eviction
(``writing_check(write_back=True)``), which is not modelled.

Simplifications: a copy happens at the moment of the identification or GPU eviction; host
blocks being loaded are not pinned, so a tier smaller than one admission's traffic can drop a
block in the same allocation that loads it (after its copy); the host LRU is refreshed by copies
and loads only, not by GPU hits (vLLM's connector re-offers a request's chunks, HiCache's nodes
share one access time across tiers), and it may drop the copy of a block the GPU still holds
(HiCache evicts only device-evicted nodes, whole).
"""

from __future__ import annotations

from collections import OrderedDict

#: Counters a tier adds to the run's counters once an engine attaches it (see
#: :data:`schedlab.engine.recorder.COUNTERS`).
STORE_COUNTER = "host_store_blocks"
#: When blocks are copied to the tier (``write_policy``; see the module doc)
WRITE_POLICIES = ("write_through", "write_back")
EVICT_COUNTER = "host_evictions"


class HostTier:
    """An LRU of block keys in host memory, ``capacity`` blocks of ``bytes_per_block`` bytes.

    :ivar stored: blocks copied to the tier (window pages included, as every count here).
    :ivar evicted: blocks dropped from the tier to make room.
    :ivar loaded: blocks loaded back to the GPU.
    :ivar dropped: blocks dropped by :meth:`reset_prefix_cache` (a restart).
    """

    def __init__(self, capacity: int, *, bytes_per_block: int = 0, link_gbps: float = 25.0,
                 latency_us: float = 0.0, write_policy: str = "write_back"):
        if capacity < 0:
            raise ValueError(f"host tier capacity must be >= 0 blocks, got {capacity}")
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        self.capacity = capacity
        #: "write_through": the caches copy every identified block as it is computed (the host then
        #: holds duplicates of GPU blocks), "write_back": when the GPU evicts it (see the module doc)
        self.write_policy = write_policy
        self.write_through = write_policy == "write_through"
        #: keys whose window-layer KV was copied too (models with window layers) -> its pages
        self._win: dict = {}
        self._used = 0  # pages held: a block each, and each window copy's pages
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

    @property
    def used(self) -> int:
        """Blocks (pages) held: one per key, and the window pages its copy carries."""
        return self._used

    def index_of(self, key: tuple) -> int | None:
        """The block index ``key`` was stored at, or None if the tier does not hold it."""
        return self._lru.get(key)

    def load_ms(self, blocks: int) -> float:
        """Time to bring ``blocks`` blocks back over the host link, in ms (0 for none)."""
        if not blocks:
            return 0.0
        return blocks * self.bytes_per_block / (self.link_gbps * 1e9) * 1e3 + self.latency_us / 1e3

    # -- changes ---------------------------------------------------------------------------
    def has_window(self, key: tuple) -> bool:
        """Whether the copy of ``key`` carries its window layers' KV too."""
        return key in self._win

    def store(self, key: tuple, index: int, window: int = 0) -> None:
        """Copy a block (computed, under write-through; evicted by the GPU, under write-back); a key
        already held stays where it is. ``window``: the pages of its window layers' KV copied with
        it (one per window group; 0: none) -- a held key without them gains them."""
        lru = self._lru
        if not self.capacity:
            return
        if key in lru:
            if window and key not in self._win and self._make_room(window, keep=key):
                self._win[key] = window
                self._count_store(window)
            return
        if 1 + window > self.capacity:  # (a tier too small for a window copy keeps the block alone)
            window = 0
        self._make_room(1 + window)
        lru[key] = index
        if window:
            self._win[key] = window
        self._count_store(1 + window)

    def _make_room(self, pages: int, keep: tuple | None = None) -> bool:
        """Evict the least recently used copies until ``pages`` more fit; False (nothing evicted
        past it) when that would evict ``keep``."""
        lru = self._lru
        while self._used + pages > self.capacity:
            gone = next(iter(lru))
            if gone == keep:
                return False
            del lru[gone]
            freed = 1 + self._win.pop(gone, 0)
            self._used -= freed
            self.evicted += freed
            if self._counters is not None:
                self._counters[EVICT_COUNTER] += freed
        return True

    def _count_store(self, pages: int) -> None:
        self._used += pages
        self.stored += pages
        if self._counters is not None:
            self._counters[STORE_COUNTER] += pages

    def load(self, keys) -> None:
        """Load held blocks back to the GPU (with the window pages their copies carry): each
        becomes the most recently used."""
        lru, win = self._lru, self._win
        n = 0
        for key in keys:
            lru.move_to_end(key)
            n += 1 + win.get(key, 0)
        self.loaded += n

    def reset_prefix_cache(self) -> None:
        """Drop every copy: the host memory of an engine process that stopped (an autoscaled
        instance's restart; its GPU cache's ``reset_prefix_cache`` calls this). The counters go
        on: the copies count as ``dropped``, not evicted."""
        self.dropped += self._used
        self._used = 0
        self._lru.clear()
        self._win.clear()

    # -- inspection (tests) ----------------------------------------------------------------
    def lru_keys(self) -> list:
        """Held keys, next to be evicted first."""
        return list(self._lru)

    def check_invariants(self) -> None:
        assert self._used == len(self._lru) + sum(self._win.values()), (self._used, len(self._lru))
        assert 0 <= self._used <= self.capacity, (self._used, self.capacity)
        assert self._win.keys() <= self._lru.keys(), "a window copy without its block"
        assert all(pages > 0 for pages in self._win.values()), "a window copy of no pages"
        assert self.stored == self._used + self.evicted + self.dropped, (
            self.stored, self._used, self.evicted, self.dropped)
