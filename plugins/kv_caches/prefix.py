"""Paged KV cache with prefix caching, following vLLM V1's block pool; plus CPU swap space.

The pool keeps vLLM V1's rules (``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``):

* Only *full* blocks have an identity. Blocks are reference-counted; a prefix hit raises the
  counts of the blocks it reuses and takes them out of the free queue. A cached block nobody
  references stays in the free queue, still findable, until it is evicted; the free count
  includes it.
* The free queue is an LRU: allocation takes blocks from its head (evicting the identity of an
  identified block it takes); release appends a request's blocks to its tail in *reverse*
  order, so a request's last blocks are evicted before its first ones.
* A hit is capped at ``num_tokens - 1`` tokens, in whole blocks, so at least one token is
  always computed.
* Blocks are identified when an allocation makes them full (counting the tokens of the step
  being scheduled), so requests admitted later in the same scheduling pass can hit them.

Block identity. vLLM hashes a block's tokens chained with its parent's hash; schedlab has no
tokens, so workload metadata stands in for them. Cache block ``j`` of a request covers tokens
``[j*B, (j+1)*B)``; let ``e = (j+1)*B - 1`` be its last token. Its key (:func:`block_key`) is

* ``("h", block_hashes[e // H], e % H)`` when the request has ``block_hashes`` (Mooncake
  format: one id per ``H = hash_block_tokens`` tokens, each naming the whole prefix up to the
  end of its id block), ``e < prompt_tokens`` and ``e < len(block_hashes) * H``. Equal ids
  mean equal tokens up to the end of that id block, so equal keys mean an equal prefix up to
  ``e`` -- whatever ``B`` is relative to ``H`` (smaller, larger, or not a divisor);
* else ``("g", prefix_group, e)`` when the request has a ``prefix_group`` and
  ``e < prefix_tokens``;
* else ``("r", request.id, j)``: the block is the request's own. Such keys are registered only
  when a request is preempted (so that it finds its blocks again when it resumes), never at
  allocation and never for finished requests.

Keys are never chained: each one already names its whole prefix. The keys of a request are
monotone in ``j`` (``h`` blocks, then ``g`` blocks, then ``r`` blocks).

Cached when freed (TGI's radix allocator, :meth:`PrefixKVCache.cache_input_on_free`, which the
``tgi`` scheduler calls): no block is identified at allocation; when an allocation is freed --
a finish, an abort, or a requeue (``preempted``) -- the full blocks of the *input* it was admitted
with (the prompt, plus the answer so far for a continuation) get their keys, whether or not their
KV was computed, its own ``("r", id, j)`` ones only when it was requeued; the blocks of what it
generated since stay anonymous and go to the head of the free queue with its partial and reserved
blocks. TGI v3.3.7's ``RadixAllocator::free`` (``backends/v3/src/radix.rs``) inserts the
allocation's ``prefill_tokens`` cut to whole blocks, and nothing else, whenever they are longer
than the prefix its lookup found -- it never knows what ran: a request aborted while its prompt is
prefilled in chunks (TGI hears of it only when it sends its first token, so it prefills the whole
prompt first) leaves its whole prompt cached, and an allocation dropped before its prefill ran --
the request that ends a batch at the prefill budget, or a batch too small for ``min_size`` -- leaves
its never-computed input there: :meth:`PrefixKVCache.give_back`, which keys the request's own
blocks too, as it will look them up (the engines let it hit them before it ever ran:
:meth:`PrefixKVCache.input_cached_before_run`). A lookup there finds whole blocks up to the whole
input, and a request found whole computes its last token again while its allocation keeps every
block found (``queue.rs`` ``State::next_batch``: ``prefix_len -= 1``):
:meth:`PrefixKVCache.cached_tokens` answers ``num_tokens - 1`` and the allocation references all
the blocks, where vLLM's rule stops a hit a block short of a prompt of whole blocks.

Lookahead. With an EAGLE drafter vLLM 0.33 hashes each block together with the token after it
(``num_hash_lookahead_tokens`` = 1: the drafter's KV at the block's last position depends on
it; ``get_request_block_hasher``), so two prompts share a block only if they also agree on the
next token, and a prompt's last full block is its own. Here ``e`` is then the token after the
block (:meth:`PrefixKVCache.use_hash_lookahead`, which the engines call for such a drafter).

Simplifications (documented, deliberate):

* Duplicates. If a block's key is already cached when the block becomes full (two requests
  computed the same prefix at the same time without hitting each other, or the ``num_tokens
  - 1`` cap made a request recompute a cached block), the block is cached too, as a second
  block under the same key, and the sequence's later blocks go on being identified. A lookup
  returns the oldest such block still cached. This is vLLM's ``BlockHashToBlockMap`` ("we
  don't de-duplicate the blocks in the cache", 0.33: ``insert`` / ``get_one_block``).
* Preemption. A recompute-preempted sequence's full blocks that have no identity yet get the
  keys ``("r", id, j)`` and go to the free queue as identified blocks; its partial last block and reserved blocks are anonymous. A lookup for
  block ``j`` tries the natural key first, then ``("r", id, j)``, so the resumed request --
  whose ``num_tokens`` now includes its generated tokens -- hits its surviving blocks and
  recomputes only what was evicted meanwhile.
* Swap (vLLM V0 did not combine swap with prefix caching this way): ``swap_out`` releases the
  sequence's blocks as a finish would (identified blocks stay cached while unreferenced) and
  puts ``held`` blocks in swap space; ``swap_in`` takes fresh anonymous blocks. A swapped-in
  sequence identifies no blocks until it is preempted.
* Stale hits. If a hit passed to :meth:`PrefixKVCache.allocate` no longer matches the table
  (blocks evicted since :meth:`~PrefixKVCache.cached_tokens` was asked), the missing blocks
  are allocated fresh and registered as computed; the pool stays consistent. ``epoch``
  changes whenever the set of cached keys changes, for callers that memoize hits.

Host tier. With a :class:`~.host_tier.HostTier` (``host``), an identified block is copied to
host memory when it is identified (``write_through``) or when the free queue evicts it
(``write_back``), with its window KV if it keeps one (a page per window group more), and a
lookup continues there where the GPU's hit ends, block by block, as vLLM 0.33 asks its
``OffloadingConnector`` after the GPU lookup (``get_num_new_matched_tokens(request,
num_computed_tokens)``: consecutive hits from the GPU's end): :meth:`PrefixKVCache.cached_tokens`
counts both tiers, and an admission loads the host blocks into fresh GPU blocks that take their
keys (the engine charges the reload time, window pages and all). The
GPU's hit stops a block short of a prompt of whole blocks (``num_tokens - 1``), the host's does
not (``num_tokens // block_size`` blocks): a prompt whose last block is on the host loads it and
computes its last token again (the scheduler's ``num_computed_tokens -= 1`` once the load is in),
where the GPU alone recomputes the block.

Window layers. With a ``window`` (:mod:`schedlab.kv_window`), a sequence's window blocks are
anonymous blocks of the same pool (:class:`~.paged.PagedKVCache`): taken from the free queue's
head, returned to its tail as they fall out of the window or the sequence ends. A hit needs the
window blocks before its end kept too (vLLM 0.33's ``SlidingWindowManager.find_longest_cache_hit``:
the last run of ``ceil((W - 1) / B)`` kept positions at or below the full-attention hit, else a kept
run from block 0), and vLLM keeps them sparsely (``prefix_cache_retention_interval``, here
``retention``: 0 keeps those before the prompt's replay boundary ``(P - 1) // B`` and before the
junction its lookup found -- a full-attention hit longer than the window's --, N also before every
N tokens, None all): an identified block's ``win`` says its window blocks are kept, for as long as
it is cached (vLLM's slide out earlier; a tight pool evicts them sooner). The hit's window blocks
are taken afresh (vLLM touches the kept ones: in use either way).

Cost. Blocks without identity (decode blocks, unique prompt blocks, duplicates) are never
objects: a sequence keeps only the identified blocks it references (a prefix of its block
indices, ``kv_state``) and its anonymous blocks are ``held - len(identified)``, so ``grow``
needs no per-sequence work. The free queue is an ``OrderedDict`` whose entries are either an
identified block or a run of anonymous blocks with a count. Each call costs O(identified
blocks it touches) plus O(1) per anonymous run.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .paged import PagedKVCache, _decode, blocks_for


def block_key(request, j: int, block_size: int, lookahead: int = 0) -> tuple:
    """Identity of cache block ``j`` (tokens ``[j*B, (j+1)*B)``) of ``request`` (see the module
    doc); ``lookahead``: tokens after the block its identity covers too."""
    e = (j + 1) * block_size - 1 + lookahead
    hashes = request.block_hashes
    if hashes is not None and e < request.prompt_tokens:
        h = request.hash_block_tokens
        i = e // h
        if i < len(hashes):
            return ("h", hashes[i], e - i * h)
    if request.prefix_group is not None and e < request.prefix_tokens:
        return ("g", request.prefix_group, e)
    return ("r", request.id, j)


def first_own_block(request, block_size: int) -> int:
    """The first block index whose :func:`block_key` is the request's own ``("r", id, j)``;
    every later one is too (keys are monotone: ``h``, then ``g``, then ``r`` blocks): block
    ``j`` is shared while its last token ``(j + 1) * B - 1`` is within the shared prefix."""
    return request.shared_prefix_tokens // block_size


class _Block:
    """An identified block: its key, its index in the sequences using it, its reference count,
    and the next block cached under the same key (duplicates, in insertion order)."""

    __slots__ = ("key", "index", "ref", "dup", "win")

    def __init__(self, key: tuple, index: int, ref: int):
        self.key = key
        self.index = index
        self.ref = ref
        self.dup: _Block | None = None
        self.win = False  # with window layers: theirs at this position are cached too (see the module doc)

    def __repr__(self) -> str:
        return f"_Block({self.key!r}, ref={self.ref})"


class _Chain:
    """A sequence's ``kv_state``: the identified blocks it references (its block indices
    ``0 .. len(blocks) - 1``) and whether further full blocks may still be registered."""

    __slots__ = ("blocks", "sealed", "junction", "input")

    def __init__(self, sealed: bool = False):
        self.blocks: list[_Block] = []
        self.sealed = sealed
        self.input = 0  # cached when freed: the tokens the sequence was admitted with
        self.junction = 0  # with window layers: the shared prefix its lookup found uncached there (tokens)


class PrefixKVCache(PagedKVCache):
    """Paged block pool with vLLM V1 prefix caching (hash-identified full blocks, LRU free queue).

    Same interface and accounting as :class:`PagedKVCache`: a sequence holds
    ``max(ceil(reserved / B), ceil(computed / B))`` blocks; ``used`` counts blocks referenced
    by at least one sequence, so a shared block counts once.

    :ivar evictions: identified blocks whose identity was evicted to make room.
    :ivar epoch: changes whenever the set of cached keys changes (a block registered or evicted).
    """

    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, *, swap_blocks: int = 0,
                 bytes_per_block: int = 0, host_link_gbps: float = 25.0, host=None, window=None,
                 retention: int | None = 0):
        super().__init__(num_blocks, block_size, swap_blocks=swap_blocks,
                         bytes_per_block=bytes_per_block, host_link_gbps=host_link_gbps, window=window)
        if retention is not None and (retention < 0 or retention % block_size):
            raise ValueError(f"retention {retention} is not a multiple of the block size {block_size} (or None)")
        #: vLLM's prefix_cache_retention_interval: which window positions a request caches (0: its
        #: replay boundary's and a junction's; N: also before every N tokens; None: all)
        self.retention = retention
        #: blocks a window hit needs cached before its end (vLLM _contiguous_blocks_for_hit: ceil((W - 1) / B))
        self._need = -(-(window.tokens - 1) // block_size) if window is not None else 0
        self._full_hit: tuple = (None, -1, 0)  # (sequence, epoch, full-attention hit in blocks) of the last lookup
        self.host = host  # a HostTier, or None
        #: the pages a block's host copy adds when it carries its window KV: one per window group
        self._window_pages = window.groups if window is not None else 0
        self.evictions = 0
        self.epoch = 0
        self.hash_lookahead = 0
        self.on_free = False  # cache_input_on_free()
        self._empty()

    def use_hash_lookahead(self, tokens: int) -> None:
        """Identify every block by the ``tokens`` after it too (a drafter's lookahead block
        hashes, see the module doc); before anything is cached."""
        if self._table or self.used:
            raise AssertionError("use_hash_lookahead() on a cache in use")
        self.hash_lookahead = tokens

    def cache_input_on_free(self) -> None:
        """Identify blocks as TGI's radix allocator does: only when an allocation is freed, and
        only those of the input it was admitted with (see the module doc); before anything is
        cached. Called again, nothing changes."""
        if self.on_free:
            return
        if self._table or self.used:
            raise AssertionError("cache_input_on_free() on a cache in use")
        self.on_free = True

    def _empty(self) -> None:
        """Nothing cached: every block free, in one anonymous run (a new pool, or one reset)."""
        self._table: dict[tuple, _Block] = {}
        # head = next to be allocated; values: None for an identified block (the key is the
        # block), an int count for a run of anonymous blocks (the key is a run number)
        self._queue: OrderedDict[Any, int | None] = OrderedDict()
        self._next_run = 0
        self._push_run(self.num_blocks)
        self._unrun: set = set()  # ids of requests whose input give_back() cached before they ran

    # -- lookups ---------------------------------------------------------------------------
    def _find(self, request, j: int) -> _Block | None:
        key = block_key(request, j, self.block_size, self.hash_lookahead)
        block = self._table.get(key)
        if block is None and key[0] != "r":
            block = self._table.get(("r", request.id, j))
        if block is not None and block.index != j:  # an id reused at another position: bad trace
            return None
        return block

    def _find_host(self, request, j: int) -> tuple | None:
        """The key under which the host tier holds block ``j`` of ``request`` (as :meth:`_find`)."""
        host = self.host
        key = block_key(request, j, self.block_size, self.hash_lookahead)
        index = host.index_of(key)
        if index is None and key[0] != "r":
            key = ("r", request.id, j)
            index = host.index_of(key)
        return key if index == j else None

    def _hits(self, request, limit: int, gpu_limit: int | None = None) -> list:
        """The cached blocks ``0, 1, ...`` of ``request``: a :class:`_Block` for each found on the
        GPU, up to the first miss or ``gpu_limit`` (default ``limit``), then the key of each found
        in the host tier from there, up to the first miss or ``limit``."""
        found = []
        j = 0
        end = limit if gpu_limit is None or gpu_limit > limit else gpu_limit
        while j < end and (block := self._find(request, j)) is not None:
            found.append(block)
            j += 1
        if self.host is not None:
            while j < limit and (key := self._find_host(request, j)) is not None:
                found.append(key)
                j += 1
        return found

    def cached_tokens(self, seq) -> int:
        if self.on_free and self.window is None:
            return self._whole_input_hit(seq)
        tokens = seq.num_tokens
        if self.window is None:
            if self.host is not None and not tokens % self.block_size and self.block_size > 1:
                # the host may hold the last block (not of one-token blocks: the token recomputed
                # would be the whole block loaded, which vLLM loads; this load is left out)
                n = self._blocks_found(seq.request, tokens // self.block_size, (tokens - 1) // self.block_size)
                return tokens - 1 if n * self.block_size == tokens else n * self.block_size
            return self._blocks_found(seq.request, (tokens - 1) // self.block_size) * self.block_size
        n = self._blocks_found(seq.request, (tokens - 1) // self.block_size)
        self._full_hit = (seq, self.epoch, n)
        return self._window_hit(seq.request, n) * self.block_size

    def _blocks_found(self, request, limit: int, gpu_limit: int | None = None) -> int:
        """How many of ``request``'s blocks ``0, 1, ...`` are cached, as :meth:`_hits` finds them."""
        n = 0
        end = limit if gpu_limit is None or gpu_limit > limit else gpu_limit
        while n < end and self._find(request, n) is not None:
            n += 1
        host = self.host
        if host is not None:
            while n < limit and self._find_host(request, n) is not None:
                n += 1
        return n

    def _whole_input_hit(self, seq) -> int:
        """:meth:`cached_tokens` cached when freed, as TGI's queue caps a hit (``State::next_batch``):
        the whole blocks found, up to the whole input; a hit of the whole input computes its last
        token again ('for the transformer forward to work, we need to have at least one token of
        postfix': ``prefix_len -= 1``) but keeps every block found (:meth:`_hit_blocks`)."""
        tokens = seq.num_tokens
        hit = self._blocks_found(seq.request, tokens // self.block_size) * self.block_size
        return tokens - 1 if hit == tokens else hit

    def _hit_blocks(self, seq, cached_tokens: int, received: bool = False) -> int:
        """The blocks a hit of ``cached_tokens`` references: its whole blocks, or every block of an
        input of whole blocks found whole -- cached when freed (TGI), or its last block on the host
        tier (vLLM's connector) -- its last token computed again in its block; not for KV that
        arrives computed (``received``: a decode instance's pull brings the last block)."""
        tokens = seq.num_tokens
        if cached_tokens == tokens - 1 and not tokens % self.block_size and self.window is None and (
                self.on_free or (self.host is not None and self.block_size > 1)) and not received:
            return tokens // self.block_size
        return cached_tokens // self.block_size

    def _gpu_hit_limit(self, seq) -> int | None:
        """How many blocks of a lookup may come from the GPU: ``num_tokens - 1`` tokens' whole
        blocks beside a host tier (the rest of a whole input is the connector's), else no limit."""
        if self.host is None or self.on_free or self.window is not None:
            return None
        return (seq.num_tokens - 1) // self.block_size

    def _window_hit(self, request, full: int) -> int:
        """The hit in blocks where the window layers' blocks are cached too, below a full-attention
        hit of ``full`` blocks (vLLM's ``SlidingWindowManager.find_longest_cache_hit``): the end of
        the last run of ``need`` positions whose window blocks are cached, else a cached run from
        block 0 shorter than that (its window starts at token 0). A host copy that carries its window
        KV counts as cached (vLLM 0.33's ``OffloadingConnector`` stores the window groups' reachable
        blocks too and looks them up from the end, ``_sliding_window_lookup``)."""
        need = self._need
        if not need:
            return 0
        count = 0
        host = self.host
        for i in range(full - 1, -1, -1):
            block = self._find(request, i)
            if (block is not None and block.win) or (
                    host is not None and (key := self._find_host(request, i)) is not None and host.has_window(key)):
                count += 1
                if count == need:
                    return i + need
            else:
                count = 0
        return count

    def _window_mask(self, j: int, prompt: int, junction: int) -> bool:
        """Whether a request caches its window blocks at position ``j`` (vLLM's
        ``SlidingWindowManager.reachable_block_mask``): the ``need`` before its replay boundary
        (``(P - 1) // B``: where a resend of its prompt resumes) and before a junction, before every
        ``retention`` tokens, or all of them (``retention`` None)."""
        need = self._need
        if not need:
            return False
        retention = self.retention
        if retention is None:
            return True
        end = (prompt - 1) // self.block_size
        if end - need <= j < end:
            return True
        if junction:
            end = junction // self.block_size
            if end - need <= j < end:
                return True
        if retention:
            per = retention // self.block_size
            return per <= need or j % per >= per - need
        return False

    def _plan(self, seq, num_new_tokens: int, cached_tokens: int, reserve_tokens: int, received: bool = False):
        """(hits: GPU blocks to reference and host keys to load, fresh blocks to take -- the
        loads' included --, blocks leaving the free pool)."""
        held = self.held(seq)
        hits = self._hits(seq.request, self._hit_blocks(seq, cached_tokens, received),
                          self._gpu_hit_limit(seq)) if cached_tokens and not held else []
        tokens = seq.num_computed_tokens + cached_tokens + num_new_tokens
        if reserve_tokens > tokens:
            tokens = reserve_tokens
        if seq.reserved_tokens > tokens:
            tokens = seq.reserved_tokens
        fresh = blocks_for(tokens, self.block_size) - held
        revived = 0
        for block in hits:
            if type(block) is _Block:
                fresh -= 1
                if not block.ref:
                    revived += 1
        return hits, fresh, fresh + revived

    def _plan_slots(self, seq, num_new_tokens: int, cached_tokens: int, reserve_tokens: int,
                    received: bool = False) -> tuple:
        hits, fresh, need = self._plan(seq, num_new_tokens, cached_tokens, reserve_tokens, received)
        if self.window is None:
            return need, (hits, fresh, need, 0, False)
        change = self._window_change(seq, num_new_tokens, cached_tokens, reserve_tokens, received=received)
        return need + change, (hits, fresh, need, change,
                               _decode(seq, num_new_tokens, cached_tokens, reserve_tokens, received))

    def _take_slots(self, seq, num_new_tokens: int, cached_tokens: int, total: int, detail) -> None:
        hits, fresh, need, change, decode = detail
        if change < 0:  # the window's blocks that fell out of it go first (vLLM: before allocating)
            self._push_run(-change)
            self.used += change
        chain = seq.kv_state
        if chain is None:
            chain = seq.kv_state = _Chain(sealed=self.on_free)
            if self.on_free:  # (cached when freed: the input it was admitted with)
                chain.input = seq.num_tokens
                if self._unrun:  # (admitted: its own hit is no longer a first hit, give_back)
                    self._unrun.discard(seq.request.id)
            if self.window is not None:  # (a lookup shorter than its full-attention hit: this
                last, epoch, full = self._full_hit  # request caches its window at that junction)
                if last is not seq or epoch != self.epoch:
                    full = len(self._hits(seq.request, (seq.num_tokens - 1) // self.block_size))
                if full * self.block_size > cached_tokens:
                    chain.junction = full * self.block_size
        loads = None
        if hits:
            queue = self._queue
            for block in hits:
                if type(block) is _Block:
                    if not block.ref:
                        del queue[block]
                    block.ref += 1
                elif loads is None:
                    loads = [block]
                else:
                    loads.append(block)
            if loads is not None:
                self.host.load(loads)
        if fresh:
            self._take(fresh)
        if loads is not None:  # loaded into fresh blocks, which take the host blocks' keys
            j = len(chain.blocks)
            for i, key in enumerate(hits):
                if type(key) is not _Block:
                    hits[i] = block = _Block(key, j + i, 1)
                    block.win = self.host.has_window(key)  # (its window KV loaded with it)
                    self._insert(block)
            self.epoch += 1
        if hits:
            chain.blocks.extend(hits)
        self.used += need
        if change > 0:  # anonymous blocks: a hit's window is taken afresh too (see the module doc)
            self._take(change)
            self.used += change
        if self.window is not None:
            self._window_settle(seq, change, decode)
        if not chain.sealed:
            full = (seq.num_computed_tokens + cached_tokens + num_new_tokens) // self.block_size
            if full > len(chain.blocks):
                self._register(seq.request, chain, full)

    def _register(self, request, chain: _Chain, full: int) -> None:
        """Identify the sequence's newly full blocks up to index ``full`` (exclusive)."""
        blocks = chain.blocks
        j = len(blocks)
        added = False
        window = self.window is not None
        host = self.host
        write_through = host is not None and host.write_through
        while j < full:
            key = block_key(request, j, self.block_size, self.hash_lookahead)
            if key[0] == "r":
                chain.sealed = True
                break
            block = _Block(key, j, 1)
            self._insert(block)
            if window and self._window_mask(j, request.prompt_tokens, chain.junction):
                block.win = self._table[key].win = True  # (a duplicate's: found under the key)
            if write_through:  # copied to the host as it is computed (vLLM's OffloadingConnector)
                host.store(key, j, self._window_pages if block.win else 0)
            blocks.append(block)
            added = True
            j += 1
        if added:
            self.epoch += 1

    def give_back(self, allocations) -> bool:
        """TGI's allocations made and dropped before their prefill ran, cached when freed (see the
        module doc): ``allocations``, ``(sequence, reserve_tokens)`` pairs of waiting sequences
        holding nothing, in the order TGI's queue allocated them (``queue.rs`` ``State::next_batch``:
        the request that ends a batch at the prefill budget, or finds it full when chunking; every
        request of a batch too small for ``min_size``). Each is allocated as an admission would be
        -- the blocks of its hit (:meth:`cached_tokens`) referenced, fresh blocks for the rest of
        ``reserve_tokens`` taken from the head of the free queue, evicting -- while the earlier ones
        still hold theirs; then all are freed, the last first (TGI drops the one that ended the
        batch, then the batch's in reverse), as a requeue frees: the whole blocks of the input get
        their keys, the request's own ones too, though nothing was computed
        (``RadixAllocator::free`` inserts the allocation's ``prefill_tokens`` whatever ran), and
        the rest goes to the head of the free queue. The request then finds its whole input, as any
        request sharing its prefix finds that. One the free blocks cannot hold is not allocated, nor
        are those after it. Nothing is cached with window layers or a host tier (TGI's radix
        allocator has neither). Returns whether the set of cached keys changed (``epoch``): the
        hits of the next pass may differ."""
        if not self.on_free:
            raise AssertionError("give_back() on a cache not caching when freed (cache_input_on_free)")
        if self.window is not None or self.host is not None:
            return False
        epoch = self.epoch
        queue = self._queue
        taken = []
        for seq, reserve_tokens in allocations:
            if seq.kv_state is not None or self.held(seq):
                raise AssertionError(f"give_back(): request {seq.request.id} holds blocks")
            hits = self._hits(seq.request, self._hit_blocks(seq, self._whole_input_hit(seq)))
            tokens = reserve_tokens if reserve_tokens > seq.num_tokens else seq.num_tokens
            fresh = blocks_for(tokens, self.block_size) - len(hits)
            revived = sum(1 for block in hits if not block.ref)
            if fresh + revived > self.num_blocks - self.used:
                break
            for block in hits:
                if not block.ref:
                    del queue[block]
                block.ref += 1
            self._take(fresh)
            self.used += fresh + revived
            taken.append((seq, hits, fresh))
        for seq, hits, fresh in reversed(taken):
            chain = _Chain(sealed=True)
            chain.blocks = hits
            chain.input = seq.num_tokens
            self._release_chain(seq, chain, len(hits) + fresh, True)
            self._unrun.add(seq.request.id)
        return self.epoch != epoch

    def input_cached_before_run(self, seq) -> int:
        """The whole blocks of ``seq``'s input, in tokens, if :meth:`give_back` cached them before it
        was ever admitted, else 0: the most its first hit may be past its shared prefix
        (:func:`schedlab.engine.plan.check_hit`)."""
        if self._unrun and seq.request.id in self._unrun:
            return seq.num_tokens // self.block_size * self.block_size
        return 0

    def grow(self, num_blocks: int, freed: int = 0) -> None:
        """Take ``num_blocks`` anonymous decode blocks at once (the engine attributes them) and, with
        a window, give back the ``freed`` window blocks their decodes let go. The run interleaved
        them, but the freed ones went to the free queue's tail and the taken ones came from its
        head: giving back first then taking leaves the queue as the run did (it never needed more
        blocks than were free)."""
        if num_blocks - freed > self.num_blocks - self.used:
            raise AssertionError(f"grow({num_blocks}, {freed}) with only {self.num_blocks - self.used} free blocks")
        if freed:
            self._push_run(freed)
        if num_blocks:
            self._take(num_blocks)
        self.used += num_blocks - freed

    def free(self, seq, *, preempted: bool = False) -> None:
        self._release(seq, preempted)
        seq.kv_state = None

    def _release(self, seq, preempted: bool) -> None:
        self._release_chain(seq, seq.kv_state, self.held(seq), preempted)

    def _release_chain(self, seq, chain, held: int, preempted: bool) -> None:
        """Give back the ``held`` blocks of ``seq``, whose identified ones are ``chain``'s."""
        blocks = chain.blocks if chain is not None else ()
        known = len(blocks)
        queue = self._queue
        if self.on_free:
            released = self._release_input(seq, chain, held, known, preempted)
        else:
            released = self._release_blocks(seq, chain, held, known, seq.num_computed_tokens // self.block_size,
                                            preempted)
        for block in reversed(blocks):
            block.ref -= 1
            if not block.ref:
                queue[block] = None
                released += 1
        self.used -= released

    def _release_input(self, seq, chain, held: int, known: int, preempted: bool) -> int:
        """:meth:`_release` cached when freed: the full blocks of the input ``seq`` was admitted
        with get their keys (its own only when ``preempted``: a requeue), last block first, whether
        or not their KV was computed (TGI's ``RadixAllocator::free`` inserts the allocation's
        ``prefill_tokens`` and knows nothing of what ran); every other block it held goes to the
        head of the free queue."""
        request = seq.request
        top = min(held, (chain.input if chain is not None else 0) // self.block_size)
        keys = []
        for j in range(known, top):
            key = block_key(request, j, self.block_size, self.hash_lookahead)
            if key[0] == "r" and not preempted:
                break
            keys.append(key)
        self._push_run(held - known - len(keys), front=True)
        if keys:
            queue = self._queue
            window = self.window is not None
            for j in range(known + len(keys) - 1, known - 1, -1):
                block = _Block(keys[j - known], j, 0)
                self._insert(block)
                if window:
                    block.win = self._window_mask(j, request.prompt_tokens, chain.junction)
                if self.host is not None and self.host.write_through:
                    self.host.store(block.key, j, self._window_pages if block.win else 0)
                queue[block] = None
            self.epoch += 1
        window = self._window_release(seq)
        self._push_run(window)
        return held - known + window

    def _release_blocks(self, seq, chain, held: int, known: int, full: int, preempted: bool) -> int:
        """:meth:`_release`'s own blocks (vLLM's rules); returns how many leave use. Blocks that are
        not full (the partial last block, reserved room) have no hash: they go to the head of the
        free queue and are reused first, so cached blocks live longer (vLLM 0.33
        BlockPool.free_blocks). Full blocks go to the tail, last block first. The request's own full
        blocks (its unique prompt tail, its output) keep their ``("r", id, j)`` identity when a
        preempted request may find them again, and beside a host tier, which holds them as vLLM's
        connector does (it stores every full block: write-through copies them now, as the request
        leaves -- vLLM as each fills, which bulk decode steps do not track --, write-back when the GPU
        evicts them); otherwise they are an anonymous run in the same place."""
        queue = self._queue
        self._push_run(held - max(full, known), front=True)
        if preempted or self.host is not None:
            rid = seq.request.id
            added = False
            window = self.window is not None
            for j in range(full - 1, known - 1, -1):
                block = _Block(("r", rid, j), j, 0)
                self._insert(block)
                if window:
                    block.win = self._window_mask(j, seq.request.prompt_tokens,
                                                  chain.junction if chain is not None else 0)
                if self.host is not None and self.host.write_through:  # (vLLM hashed and stored them
                    # as computed; keyed only now)
                    self.host.store(block.key, j, self._window_pages if block.win else 0)
                queue[block] = None
                added = True
            if added:
                self.epoch += 1
        else:
            self._push_run(full - known)  # full private blocks: hashed in vLLM, never hit again
        window = self._window_release(seq)
        self._push_run(window)
        return held - known + window

    # -- the table of cached blocks -------------------------------------------------------
    def _insert(self, block: _Block) -> None:
        """Cache ``block`` under its key, after any block already cached under it."""
        first = self._table.get(block.key)
        if first is None:
            self._table[block.key] = block
            return
        while first.dup is not None:
            first = first.dup
        first.dup = block

    def _unlink(self, block: _Block) -> None:
        """Forget ``block`` (evicted); the next duplicate, if any, answers for its key."""
        table = self._table
        first = table[block.key]
        if first is block:
            if block.dup is None:
                del table[block.key]
            else:
                table[block.key] = block.dup
        else:
            while first.dup is not block:
                first = first.dup
            first.dup = block.dup
        block.dup = None

    def _cached_blocks(self):
        """Every cached block, duplicates included."""
        for block in self._table.values():
            while block is not None:
                yield block
                block = block.dup

    # -- the free queue ----------------------------------------------------------------------
    def _push_run(self, count: int, *, front: bool = False) -> None:
        """Add ``count`` anonymous blocks at the tail, or at the head with ``front`` (merged
        with an anonymous run already there)."""
        if count <= 0:
            return
        queue = self._queue
        if queue:
            end = next(iter(queue)) if front else next(reversed(queue))
            run = queue[end]
            if run is not None:
                queue[end] = run + count
                return
        self._next_run += 1
        queue[self._next_run] = count
        if front:
            queue.move_to_end(self._next_run, last=False)

    def blocks_before_eviction(self) -> int:
        """Free blocks :meth:`grow` can take before it evicts a cached one (the anonymous
        blocks at the head of the free queue)."""
        room = 0
        for run in self._queue.values():
            if run is None:
                break
            room += run
        return room

    def _take(self, count: int) -> None:
        """Remove ``count`` blocks from the head, evicting the identities of identified ones."""
        queue = self._queue
        evicted = 0
        while count:
            head = next(iter(queue))
            run = queue[head]
            if run is None:
                del queue[head]
                self._unlink(head)
                if self.host is not None and not self.host.write_through:  # write-back: copied now
                    self.host.store(head.key, head.index, self._window_pages if head.win else 0)
                evicted += 1
                count -= 1
            elif run > count:
                queue[head] = run - count
                count = 0
            else:
                del queue[head]
                count -= run
        if evicted:
            self.evictions += evicted
            self.epoch += 1

    # -- swap space ------------------------------------------------------------------------
    def swap_out(self, seq) -> float | None:
        """Copy ``seq``'s blocks to swap space and release them as a finish would; None if
        swap space lacks room."""
        blocks = self.held(seq) + self.window_blocks(seq)
        if self.swap_used + blocks > self.swap_blocks:
            return None
        self._release(seq, False)
        self.swap_used += blocks
        seq.kv_state = blocks
        return self.transfer_ms(blocks)

    def free_swapped(self, seq) -> None:
        """Drop a swapped-out ``seq``'s copy in swap space (its client gave up)."""
        self.swap_used -= seq.kv_state
        seq.kv_state = None

    def swap_in(self, seq) -> float | None:
        """Bring ``seq`` back into fresh anonymous blocks with room for its next token; None
        if the GPU lacks the blocks."""
        blocks = seq.kv_state
        need, window = self._swap_in_need(seq)
        if need + window > self.num_blocks - self.used:
            return None
        self._take(need + window)
        self.used += need + window
        if window:
            self._window_settle(seq, window)
        self.swap_used -= blocks
        seq.kv_state = _Chain(sealed=True)
        return self.transfer_ms(blocks)

    # -- a restart ------------------------------------------------------------------------
    def reset_prefix_cache(self) -> None:
        """Forget every cached block, the host tier's too, leaving the pool as freshly built: one
        anonymous run in the free queue (vLLM 0.33 ``BlockPool.reset_prefix_cache``: it refuses
        while blocks are in use, then clears the hash-to-block map and every block's hash). An
        autoscaled instance's restart calls it; RuntimeError while a sequence holds a block or
        swap space. ``evictions`` goes on counting the run's evictions; ``epoch`` changes."""
        self._check_idle()
        self._empty()
        self.epoch += 1
        if self.host is not None:
            self.host.reset_prefix_cache()

    # -- inspection (tests, metrics) ------------------------------------------------------------
    def cached_keys(self) -> set:
        """Keys of every identified block, referenced or not."""
        return set(self._table)

    def ref_count(self, key: tuple) -> int | None:
        """References to the block a lookup of ``key`` finds (0: cached but free), or None if
        not cached."""
        block = self._table.get(key)
        return None if block is None else block.ref

    def lru_keys(self) -> list:
        """Keys of the free identified blocks, next to be evicted first."""
        return [entry.key for entry, run in self._queue.items() if run is None]

    def free_queue_layout(self) -> list:
        """The free queue from the head: a key per identified block, a count per run of
        anonymous blocks (adjacent runs merged), for comparing pool states."""
        layout: list = []
        for entry, run in self._queue.items():
            if run is None:
                layout.append(entry.key)
            elif layout and isinstance(layout[-1], int):
                layout[-1] += run
            else:
                layout.append(run)
        return layout

    def check_invariants(self) -> None:
        super().check_invariants()
        queued = 0
        free_identified = 0
        cached_ids = {id(b) for b in self._cached_blocks()}
        for entry, run in self._queue.items():
            if run is None:
                assert id(entry) in cached_ids, f"queued block {entry!r} is not in the table"
                assert entry.ref == 0, f"referenced block {entry!r} is in the free queue"
                queued += 1
                free_identified += 1
            else:
                assert isinstance(run, int) and run > 0, f"bad anonymous run {run!r}"
                queued += run
        assert queued == self.num_blocks - self.used, (queued, self.num_blocks, self.used)
        referenced = 0
        cached = 0
        for key, first in self._table.items():
            block = first
            while block is not None:
                assert block.key == key, (key, block)
                assert block.ref >= 0, block
                cached += 1
                if block.ref:
                    referenced += 1
                block = block.dup
        assert free_identified == cached - referenced, "an unreferenced block is missing from the free queue"
        assert referenced <= self.used, (referenced, self.used)
        if self.host is not None:
            self.host.check_invariants()
