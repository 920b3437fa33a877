"""SGLang's radix-tree prefix cache (RadixAttention), on schedlab's block keys.

Follows SGLang 0.5.23 (PyPI release; ``python/sglang/srt/mem_cache/unified_radix_cache.py`` and
``unified_cache/unified_tree_core.py`` -- the default tree, ``UnifiedRadixCache`` with one FULL
component and LRU eviction -- ``mem_cache/common.py``, ``managers/schedule_batch.py``,
``managers/scheduler_components/batch_result_processor.py``); ``tools/sglang_diff.py`` steps
SGLang's own tree under its own scheduler beside this one (README "Checked against SGLang"):

* The cache is a radix tree whose edges are runs of KV pages. A node holds a *segment* of
  consecutive pages; matching a request walks down from the root as long as its keys match,
  and a node is split where a match or an insertion stops inside it (``_split_node``, which
  stamps both halves as just used).
* Every computed page goes into the tree: a prompt's pages once they are computed
  (``cache_unfinished_req`` after each prefill chunk), the whole sequence -- prompt and
  generated tokens -- when the request finishes (``cache_finished_req``). Decode pages stay
  private to the running request until then.
* A running request *locks* its path (``inc_lock_ref`` on every node from its last node to
  the root); a locked node is never evicted. When the request finishes or is retracted, the
  path is unlocked (``dec_lock_ref``) and stays cached.
* Memory: the pool's free pages are used first; only when they run out are unlocked *leaves*
  evicted, least recently used first, a whole node at a time, until the shortfall is freed
  (``evict_to_free_tokens``); a parent whose last child goes becomes a leaf and a candidate in
  turn. Free and evictable pages both count as available (``available_size() +
  evictable_size()`` in the scheduler's checks).
* Passes (with a scheduler that opens them, SGLang's: :meth:`RadixKVCache.begin_pass`,
  :meth:`RadixKVCache.end_pass`). A prefill's pages join the tree after the forward pass, so a
  request admitted in the same pass does not find them and computes them too; the pass's
  evictions wait until its admissions are decided (SGLang allocates the batch after the loop
  whose lookups split and touch the tree); pages a prefill computes again are freed when the pass
  ends. Lookups of waiting requests split and touch like SGLang's ``match_prefix``
  (:meth:`RadixKVCache.touch`). With SGLang's overlap scheduler a pass is planned while the
  last one's batch runs (``begin_pass(in_flight=True)``): that batch's prompts join the tree a
  pass later (its chunks that do not end a prompt do not wait -- nor what such a chunk computed
  beside another prompt of the pass, whose copy the chunk's stash puts in the tree first), and
  its duplicates are freed a pass later too (but for a chunk's copies of blocks an earlier pass
  inserted: its stash frees them as the next pass is planned). Siblings keep the order in which
  SGLang inserts them, which ``dfs-weight`` breaks ties by.
  Without passes (other schedulers) pages are matched as soon as they are allocated, as in vLLM.
* Duplicates: when an insertion finds pages already in the tree (two requests computed the
  same prefix, or a request recomputed its last cached page because at least one token must
  be computed), the request switches to the tree's copy and its own is freed.

Block keys and granularity. schedlab has no tokens; a cache page is a block of ``block_size``
tokens and its key comes from the workload's prefix metadata exactly as in the ``paged``
prefix cache (:func:`~.prefix.block_key`: Mooncake hash ids, shared-prefix groups, else the
request's own ``("r", id, j)``). So the tree matches whole blocks: SGLang's default
``page_size`` is 1 and matches single tokens, which here would mean ``block_size = 1`` (exact,
but one key per token -- slow for long prompts). With larger blocks a shared prefix that ends
inside a block loses that block's tokens, and the hit is capped at ``floor((num_tokens - 1)
/ B)`` blocks where SGLang at page size 1 recomputes only the last token. Generated tokens get
``("r", id, j)`` keys, so nothing but the same request (after a retraction) can match them:
schedlab cannot know that a follow-up prompt repeats an earlier answer.

Simplifications (deliberate, documented):

* :meth:`RadixKVCache.cached_tokens` and :meth:`RadixKVCache.blocks_needed` change nothing;
  only :meth:`RadixKVCache.touch` (called where SGLang's scheduler matches) splits and touches.
  Access times are a counter, so ties cannot happen.
* Within a pass, cached pages a prefill computes again are locked at once (and counted free
  until the pass ends); SGLang locks them when it inserts the batch's KV, so its eviction at the
  end of the pass could still take them.
* No swap space (SGLang retracts instead): ``swap_out`` is absent, so a scheduler that asks
  for a swap falls back to recompute.
* Reservation (``reserve_tokens``), which SGLang does not have, is supported as private blocks
  beyond the computed tokens.
* A victim preempted after a prefill chunk was scheduled for it (vLLM's rule in the
  ``continuous`` scheduler; SGLang retracts only before scheduling) keeps the chunk's pages in
  the tree, unlocked, as the ``paged`` prefix cache keeps them hashed.

Host tier (SGLang HiCache, ``hiradix_cache.py``). With a :class:`~.host_tier.HostTier`
(``host``), the blocks of every node are copied to host memory when it is inserted (the tier's
``write_through``, SGLang's default policy) or when it is evicted (``write_back``); last block
first, so that a prefix's head outlives its tail there (schedlab's choice: SGLang writes and
frees a node whole),
and a match that ends in the tree continues in the host tier: :meth:`RadixKVCache.cached_tokens`
counts both, and an admission loads the host blocks into fresh blocks that join the new node it
inserts (``init_load_back``), the engine charging the reload time -- unless the host part is
under ``LOAD_BACK_THRESHOLD`` (10) tokens, which HiCache recomputes instead (``load_back``: "skip
loading back if the total size is too small"; only pages under 10 tokens meet it, SGLang's default
``page_size = 1`` among them). Unlike HiCache, the host tier is a flat LRU of blocks, not
host-only nodes of the same tree (see :mod:`.host_tier`); its memory quota for a load-back is
not modelled.

Accounting. Blocks are in one of four states: *free* (in no node and held by no sequence),
*evictable* (in an unlocked node), *protected* (in a locked node), or *private* (held by a
running sequence outside the tree: its partial last block, its decode blocks, reserved
blocks). A sequence holds ``max(ceil(reserved / B), ceil(computed / B))`` blocks, the first
``length`` of which are its locked path; the rest are private. ``num_free_blocks`` = free +
evictable; ``num_used_blocks`` = protected + private.
"""

from __future__ import annotations

import heapq
import math

from .paged import blocks_for
from .prefix import block_key, first_own_block

#: HiCache's ``load_back_threshold``: a host hit of fewer tokens is computed again, not loaded
#: (``HiRadixCache.__init__``: 10, in every variant of it)
LOAD_BACK_THRESHOLD = 10


class _Node:
    """A tree node: a segment of consecutive blocks (keys ``keys``, block indices from ``start``).

    ``lock`` is SGLang's ``lock_ref``: running sequences whose path passes through or ends at
    the node; ``ends`` counts those whose path ends here (``lock = ends + sum(child locks)``).
    ``tick`` is the last access (a counter), ``uid`` the creation number (a heap tie-break),
    ``born`` the scheduling pass whose prefill step inserted it (see :meth:`RadixKVCache.begin_pass`).
    Planning ahead, ``owner`` is the hold of the prefill that made it and ``copies`` lists the
    other prefills that computed its blocks again before they reached SGLang's tree, as ``[hold,
    pass, stamp]`` (see :meth:`RadixKVCache.free`).
    """

    __slots__ = ("keys", "start", "parent", "children", "lock", "ends", "tick", "uid", "alive", "born", "chunk",
                 "stamp", "owner", "copies")

    def __init__(self, keys: list, start: int, parent, tick: int, uid: int, born: int = 0, chunk: bool = False,
                 stamp: tuple = (0, 0, 0)):
        self.keys = keys
        self.start = start
        self.parent = parent
        self.children: dict = {}
        self.lock = 0
        self.ends = 0
        self.tick = tick
        self.uid = uid
        self.alive = True
        self.born = born  # the pass whose prefill inserted it (0: visible to every lookup)
        self.chunk = chunk  # ... a chunk that does not end the prompt (SGLang inserts it at the next pass)
        self.stamp = stamp  # when SGLang puts it in the tree: its place among its siblings (``_stamp``)
        self.owner = None
        self.copies = None

    def __repr__(self) -> str:
        return f"_Node({self.keys!r}, start={self.start}, lock={self.lock}, tick={self.tick})"


class _Hold:
    """A sequence's ``kv_state``: the end of its locked path (``node``, ``length`` blocks from
    the root) and its block keys, computed once."""

    __slots__ = ("node", "length", "keys", "own")

    def __init__(self, root: _Node, own: int):
        self.node = root
        self.length = 0
        self.keys: list = []
        self.own = own  # from this block index on, keys are ("r", id, j)


class _Step:
    """What an allocation does, worked out before anything changes (see ``_plan``)."""

    __slots__ = ("fresh", "revived", "shared_dups", "free_dups", "full", "loads", "after_pass", "older_dups")

    def __init__(self, fresh: int, revived: int, shared_dups: int, free_dups: int, full: int, loads=(),
                 after_pass: bool = False, older_dups: int = 0):
        self.fresh = fresh              # blocks beyond those held, matched hits aside
        self.revived = revived          # matched hit blocks in unlocked nodes
        self.shared_dups = shared_dups  # newly full blocks found in the tree, in locked nodes
        self.free_dups = free_dups      # ... in unlocked nodes
        self.full = full                # the path length after the step (0: the step inserts nothing)
        self.loads = loads              # keys of the hit blocks loaded from the host tier (among ``fresh``)
        self.after_pass = after_pass    # duplicates are computed, then freed when the pass ends
        self.older_dups = older_dups    # duplicates of blocks inserted by an earlier pass's prefill

    @property
    def need(self) -> int:
        """Blocks leaving the free pool (free + evictable)."""
        if self.after_pass:  # every block computed; the tree's copies of duplicates locked at once
            return self.fresh + self.revived + self.free_dups
        return self.fresh + self.revived - self.shared_dups

    @property
    def taken(self) -> int:
        """Blocks taken out of the unused ones (beyond evictable blocks locked)."""
        if self.after_pass:
            return self.fresh
        return self.fresh - self.shared_dups - self.free_dups


class RadixKVCache:
    """SGLang's radix-tree KV cache over ``num_blocks`` blocks of ``block_size`` tokens.

    :ivar evictions: blocks evicted from the tree to make room.
    :ivar epoch: changes whenever the set of cached blocks changes (an insertion or eviction).
    """

    prefix_caching = True
    #: planning ahead, a finished request decoded once more (``Plan.overshoot``) goes into the tree
    #: with the KV that decode writes for its last token: SGLang releases it once the result that
    #: finished it is processed, after that decode was launched (``cache_finished_req`` keys what
    #: the request has committed); the engines count it as computed at the release
    caches_overshoot = True

    def __init__(self, num_blocks: int, block_size: int = 16, *, host=None, bytes_per_block: int = 0,
                 load_back_threshold: int = LOAD_BACK_THRESHOLD):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.host = host                # a HostTier, or None
        #: a host hit of fewer tokens is computed again (HiCache's; 0: any hit is loaded)
        self.load_back_threshold = load_back_threshold
        self.bytes_per_block = bytes_per_block
        #: tokens after a block its key covers too: 1 under EAGLE, whose radix tree SGLang keys by
        #: token pairs (``convert_to_bigram_key``: the draft sequence is the target's shifted by one)
        self.hash_lookahead = 0
        self.evictions = 0
        self.epoch = 0
        self._empty()

    def _empty(self) -> None:
        """An empty tree over unused blocks, no pass open (a new cache, or one reset)."""
        self.unused = self.num_blocks   # blocks in no node and held by no sequence
        self.evictable = 0              # blocks in unlocked nodes
        self._tick = 0
        self._uid = 0
        self.root = _Node([], 0, None, 0, 0)
        self.root.lock = 1              # never evicted (SGLang gives the root lock_ref 1)
        self._heap: list = []           # (tick, uid, push, node): unlocked leaves, validated when popped
        self._pushes = 0
        self._count = 0                 # nodes in the tree (bounds the heap's stale entries)
        self._pass = 0                  # the scheduling pass, once a scheduler opens passes
        self._in_flight = -1            # ... and the one whose batch runs, not in the tree yet but its chunks
        self._pending = 0               # duplicate blocks computed this pass, freed when it ends ...
        self._overlapped = False        # ... or, planning ahead, once its batch's result is processed:
        self._queued = 0                # the last pass's duplicates
        self._aging = 0                 # and those of the pass before, whose batch was in flight
        self._stashed = 0               # chunks' copies of blocks in the tree, freed at the next pass
        self._deferring = False         # between begin_pass and end_pass: evictions wait ...
        self._owed = 0                  # ... for this many blocks
        self._lent = 0                  # cached blocks a prefill duplicates, locked early, counted free
        self._carried = 0               # ... planning ahead, those of the pass whose batch goes in flight,
        self._flying = 0                # ... counted free through the next pass if planned while it runs

    # -- queries -------------------------------------------------------------------------
    def num_free_blocks(self) -> int:
        return self.unused + self.evictable - self._owed + self._lent + self._flying

    def num_used_blocks(self) -> int:
        return self.num_blocks - self.unused - self.evictable

    @property
    def releasing_blocks(self) -> int:
        """Blocks in use that no sequence holds: duplicates a planned-ahead pass computed, freed
        once its batch's result is processed (:meth:`begin_pass`)."""
        return self._queued + self._aging + self._stashed

    @property
    def deferred_blocks(self) -> int:
        """Blocks the open pass took beyond the unused ones, evicted at :meth:`end_pass`: neither
        used nor free until then (``used + deferred + free - lent == num_blocks``)."""
        return self._owed

    @property
    def lent_blocks(self) -> int:
        """Blocks in use that :meth:`num_free_blocks` counts free: cached blocks a prefill of this
        pass (or, planning ahead, of the pass in flight) computes again, which SGLang locks only
        when it inserts the batch's KV; an allocation cannot take them."""
        return self._lent + self._flying

    def held(self, seq) -> int:
        """Blocks ``seq`` holds between iterations (its locked path included)."""
        c = seq.num_computed_tokens
        r = seq.reserved_tokens
        return -(-(c if c > r else r) // self.block_size)

    def use_hash_lookahead(self, tokens: int) -> None:
        """Key every block by the ``tokens`` after it too (EAGLE's bigram keys, which the engines ask
        for through :meth:`schedlab.speculative.Speculation.configure_cache`); before anything is cached."""
        if self.root.children or self.num_used_blocks():
            raise AssertionError("use_hash_lookahead() on a cache in use")
        self.hash_lookahead = tokens

    def _hold(self, seq) -> _Hold:
        hold = seq.kv_state
        if hold is None:
            hold = seq.kv_state = _Hold(self.root, first_own_block(seq.request, self.block_size))
        return hold

    def _keys(self, seq, hold: _Hold, upto: int) -> list:
        """The request's block keys ``0 .. upto - 1`` (memoized on the hold)."""
        keys = hold.keys
        have = len(keys)
        if have < upto:
            request, bs, own = seq.request, self.block_size, hold.own
            if have < own:
                look = self.hash_lookahead
                keys.extend(block_key(request, j, bs, look) for j in range(have, min(own, upto)))
                have = len(keys)
            if have < upto:
                rid = request.id
                keys.extend([("r", rid, j) for j in range(have, upto)])
        return keys

    def _match(self, node: _Node, depth: int, keys: list, limit: int, pieces: list | None = None,
               visible: bool = False):
        """Follow the tree from ``node`` (whose path ends at block ``depth``) along
        ``keys[depth:limit]``.

        Returns ``(end, reached, inside)``: the last node matched whole, the block index the
        match reached, and the node it stopped inside (None if it stopped at a node's end).
        ``pieces`` collects ``(locked, first, stop)`` for every node (part) matched. With
        ``visible``, nodes that this pass's prefill steps inserted end the match.
        """
        j = depth
        current = self._pass if visible and self._pass else math.inf
        in_flight = self._in_flight if visible else -1
        while j < limit:
            child = node.children.get(keys[j])
            if child is None or child.born >= current or (child.born == in_flight and not child.chunk):
                return node, j, None
            seg = child.keys
            n = len(seg)
            m = 1
            while m < n and j + m < limit and seg[m] == keys[j + m]:
                m += 1
            if pieces is not None:
                pieces.append((child.lock > 0, j, j + m, child.born))
            if m < n:
                return node, j + m, child
            node = child
            j += m
        return node, j, None

    def _host_run(self, keys: list, start: int, limit: int) -> int:
        """Where the run of blocks the host tier holds from ``start`` ends (at most ``limit``)."""
        host = self.host
        j = start
        while j < limit and host.index_of(keys[j]) == j:
            j += 1
        return j

    def cached_tokens(self, seq) -> int:
        limit = (seq.num_tokens - 1) // self.block_size
        if limit <= 0 or not (self.root.children or self.host):
            return 0
        keys = self._keys(seq, self._hold(seq), limit)
        reached = self._match(self.root, 0, keys, limit, visible=True)[1]
        if self.host is not None and reached < limit:
            host = self._host_run(keys, reached, limit)
            if (host - reached) * self.block_size >= self.load_back_threshold:
                reached = host
        return reached * self.block_size

    def _plan(self, seq, num_new_tokens: int, cached_tokens: int, reserve_tokens: int) -> _Step:
        """Work out an allocation. An admission (nothing held yet) matches its hit from the
        root; a prefill step (not a decode step) then extends the path over its newly full
        blocks, finding any that are already in the tree."""
        bs = self.block_size
        held = self.held(seq)
        hold = self._hold(seq)
        tokens = seq.num_computed_tokens + cached_tokens + num_new_tokens
        want = cached_tokens // bs if not held else 0
        full = tokens // bs if seq.status != "decoding" else 0
        hits = revived = shared_dups = free_dups = older_dups = 0
        loads = ()
        limit = max(want, full)
        if limit > hold.length:
            pieces: list = []
            keys = self._keys(seq, hold, limit)
            reached = self._match(hold.node, hold.length, keys, limit, pieces)[1]
            hits = min(reached, want)
            if hits < want and self.host is not None:
                loads = keys[hits:self._host_run(keys, hits, want)]
            for locked, first, stop, born in pieces:
                in_hits = max(0, min(stop, want) - first)
                if not locked:
                    revived += in_hits
                if locked:
                    shared_dups += stop - first - in_hits
                else:
                    free_dups += stop - first - in_hits
                if born < self._pass:
                    older_dups += stop - first - in_hits
        tokens = max(tokens, reserve_tokens, seq.reserved_tokens)
        fresh = blocks_for(tokens, bs) - held - hits
        return _Step(fresh, revived, shared_dups, free_dups, full if full > hold.length else 0, loads,
                     after_pass=self._pass > 0, older_dups=older_dups)

    def blocks_needed(self, seq, num_new_tokens: int, *, cached_tokens: int = 0, reserve_tokens: int = 0) -> int:
        return self._plan(seq, num_new_tokens, cached_tokens, reserve_tokens).need

    # -- changes ---------------------------------------------------------------------------
    def allocate(self, seq, num_new_tokens: int, *, cached_tokens: int = 0, reserve_tokens: int = 0) -> bool:
        step = self._plan(seq, num_new_tokens, cached_tokens, reserve_tokens)
        if step.need > self.unused + self.evictable - self._owed:
            return False
        if step.after_pass:  # SGLang locks those only when it inserts the batch's KV
            self._lent += step.free_dups
        hold = seq.kv_state
        want = cached_tokens // self.block_size if not self.held(seq) else 0
        limit = max(step.full, want)
        if limit > hold.length:
            # lock the matched path (hits, then blocks already in the tree) before taking
            # blocks, so that eviction cannot touch it
            keys = self._keys(seq, hold, limit)
            end, reached = self._descend(hold.node, hold.length, keys, limit)
            chunk = max(seq.num_computed_tokens, cached_tokens) + num_new_tokens < seq.num_tokens
            stamp = self._stamp(chunk)
            if self._pass:  # its copy of what another prefill of this pass computes joins the tree
                node = end  # with its chunk (stash_chunked_request), or with its own insertion
                while node is not hold.node and node.born == self._pass:
                    if chunk:
                        node.chunk = True
                    if stamp < node.stamp:
                        node.stamp = stamp
                    node = node.parent
            if self._overlapped and not chunk:
                self._note_copies(hold, end, stamp)
            self._lock_to(hold, end, reached)
            if step.loads:  # loaded into fresh blocks, which join the node inserted below
                self.host.load(step.loads)
            self._take(step.taken)
            if step.after_pass:
                dups = step.shared_dups + step.free_dups
                if chunk and self._overlapped:  # its stash, when the next pass is planned, finds
                    self._stashed += step.older_dups  # them in the tree and frees its copies
                    dups -= step.older_dups
                self._pending += dups
            if reached < step.full:  # the rest is new: one node, locked by this sequence
                node = self._new_node(end, keys[reached:step.full], reached, stamp, born=self._pass, chunk=chunk)
                node.owner = hold
                self._lock_to(hold, node, step.full)
            self._touch_path(hold.node)
        else:
            self._take(step.fresh)
        return True

    def begin_pass(self, in_flight: bool | None = None) -> None:
        """A scheduler that opens its passes (SGLang's) declares that a new one starts: the blocks
        the last pass's prefill steps inserted become visible to lookups.

        SGLang inserts a prefill step's KV into the tree after the forward pass
        (``cache_unfinished_req`` in ``process_batch_result_prefill``): a request admitted in
        the same pass as another that computes a shared prefix does not find it and computes it
        too, and when its KV is inserted the tree's copy wins and its own is freed. Until a
        scheduler calls this, blocks are visible as soon as they are allocated and duplicates
        are never computed (vLLM's rule).

        ``in_flight`` (SGLang's overlap scheduler; None: a scheduler that does not plan ahead):
        True if the pass is planned while the last pass's batch still runs, so that batch's
        prefills are not in the tree yet either -- but for chunks that do not end a prompt, which
        SGLang inserts when it plans the next pass (``stash_chunked_request``) --, and the
        duplicates it computed are freed only after this pass (when its result is processed;
        a chunk's copies of blocks an earlier pass put in the tree at once, by its stash);
        False if it has been processed."""
        self.end_pass()
        if in_flight is not None:
            self._overlapped = True
            freed = self._aging + (0 if in_flight else self._queued) + self._stashed
            self._stashed = 0
            self._flying = self._carried if in_flight else 0
            self._carried = 0
            self._aging = self._queued if in_flight else 0
            self._queued = 0
            self.unused += freed
        self._in_flight = self._pass if in_flight else -1
        self._pass += 1
        self.epoch += 1
        self._deferring = True

    def end_pass(self) -> None:
        """The pass's admissions are decided: evict what they took beyond the unused blocks.

        SGLang allocates a prefill batch's KV (``prepare_for_extend``) after the whole admission
        loop, whose lookups have split nodes and refreshed access times by then; blocks taken
        between :meth:`begin_pass` and this call come out of the unused ones, and the shortfall
        is evicted here, least recently used first, in one go. Cached blocks that a prefill
        computes again were locked at once but counted free meanwhile (SGLang locks them when
        it inserts the batch's KV). Then the duplicates the pass computed are freed (SGLang
        frees them when it inserts the batch's KV after the forward; here a little earlier, as
        nothing is allocated in between)."""
        self._deferring = False
        if self._owed:
            owed, self._owed = self._owed, 0
            self._evict(owed)
            self.unused -= owed
        if self._overlapped:  # (freed once the batch's result is processed: begin_pass)
            self._queued += self._pending
            self._carried += self._lent  # (and the tree's copies they duplicate locked only then)
        else:
            self.unused += self._pending  # the duplicates, once their KV is in the tree
        self._pending = 0
        self._lent = 0

    def make_room(self, blocks: int) -> None:
        """Evict unlocked leaves, least recently used first, until ``blocks`` blocks are unused
        or nothing evictable is left (SGLang ``evict_from_tree_cache`` after each retraction, and
        after each priority preemption)."""
        self.end_pass()
        short = min(blocks - self.unused, self.evictable)
        if short > 0:
            self._evict(short)

    def touch(self, seq, *, whole: bool = False) -> int:
        """Look ``seq``'s prompt up as SGLang's ``match_prefix`` does: split the node the match
        ends inside and refresh the access times of the matched path (lookups of waiting
        requests by SGLang's scheduler; :meth:`cached_tokens` changes nothing). The match stops a
        token short of the whole sequence, as an admission's (``init_next_round_input``), unless
        ``whole`` (the scheduling policy's lookups match every token). Returns the tokens matched."""
        limit = self._limit(seq, whole)
        if limit <= 0 or not self.root.children:
            return 0
        keys = self._keys(seq, self._hold(seq), limit)
        end, reached, inside = self._match(self.root, 0, keys, limit, visible=True)
        if inside is not None:
            end = self._split(inside, reached - inside.start)
        if end is not self.root:
            self._touch_path(end)
        return reached * self.block_size

    def _limit(self, seq, whole: bool) -> int:
        """Blocks a lookup may match: the full blocks of the sequence, or of all but its last token."""
        return (seq.num_tokens if whole else seq.num_tokens - 1) // self.block_size

    def dfs_weight_order(self, seqs) -> list[int]:
        """Indices of ``seqs`` in SGLang's ``dfs-weight`` order (``_dfs_weight_order``): each
        request weighs on the node its whole-prompt match ends at (the tree split there, as
        SGLang's lookups split it), a node weighs its requests and its subtree's; walk the tree depth
        first, heavier children first (ties in the order SGLang inserted them, ``_stamp``), and list
        a node's requests after its subtree's, the unmatched ones (at the root) last."""
        ends: dict = {}   # (node, depth) -> indices, depth inside node or at its end
        for i, seq in enumerate(seqs):
            limit = self._limit(seq, whole=True)
            if limit <= 0:
                ends.setdefault((self.root, 0), []).append(i)
                continue
            keys = self._keys(seq, self._hold(seq), limit)
            end, reached, inside = self._match(self.root, 0, keys, limit, visible=True)
            node = inside if inside is not None else end
            ends.setdefault((node, reached), []).append(i)
        cuts: dict = {}   # node -> depths inside it where a match ends (SGLang's splits)
        for node, depth in ends:
            if node is not self.root:
                cuts.setdefault(node, set()).add(depth)

        def chain(node) -> list:
            """The virtual nodes ``node`` splits into, top to bottom, as (node, end depth)."""
            bottom = node.start + len(node.keys)
            return [(node, d) for d in sorted(cuts.get(node, set()) - {bottom})] + [(node, bottom)]

        weight: dict = {}

        def weigh(node) -> int:
            below = sum(weigh(child) for child in node.children.values())
            for v in reversed(chain(node)):
                below += len(ends.get(v, ()))
                weight[v] = below
            return below

        order: list[int] = []

        def visit_children(node) -> None:
            kids = sorted(node.children.values(), key=lambda c: (-weight[chain(c)[0]], c.stamp))
            for child in kids:
                links = chain(child)
                visit_children(child)   # the chain's bottom holds the real node's children
                for v in reversed(links):
                    order.extend(ends.get(v, ()))

        for child in self.root.children.values():
            weigh(child)
        visit_children(self.root)
        order.extend(ends.get((self.root, 0), ()))
        return order

    def blocks_before_eviction(self) -> int:
        """Free blocks :meth:`grow` can take before it evicts a cached (tree) block."""
        return self.unused

    def grow(self, num_blocks: int) -> None:
        """Take ``num_blocks`` private decode blocks at once (the engine attributes them). Within
        a scheduling pass the shortfall is evicted when the pass ends, as for the same blocks
        taken one :meth:`allocate` at a time (the reference engine's way): SGLang allocates a
        mixed batch's decode slots with its prefill's, after the admissions' lookups."""
        usable = self.num_free_blocks() - self._lent - self._flying
        if num_blocks > usable:
            raise AssertionError(f"grow({num_blocks}) with only {usable} free blocks")
        if num_blocks:
            self._take(num_blocks)

    def free(self, seq, *, preempted: bool = False) -> None:
        """Release ``seq``. A finished sequence's full blocks go into the tree first (SGLang
        ``cache_finished_req``), unlocked; a retracted one keeps only what the tree already has
        (its prompt), its decode blocks are freed (``retract_decode``) -- and, planning ahead, so
        is the prompt its batch in flight computes, which SGLang never puts in the tree (nor its
        copy of a prompt another running prefill computes too: :meth:`_drop_copy`)."""
        self.end_pass()
        held = self.held(seq)
        hold = seq.kv_state
        if hold is None:
            self.unused += held
            return
        private = held - hold.length
        newest = hold.node
        if not preempted:
            full = seq.num_computed_tokens // self.block_size
            end, reached = hold.node, hold.length
            if full > hold.length:
                keys = self._keys(seq, hold, full)
                end, reached = self._descend(hold.node, hold.length, keys, full)
                if reached < full:
                    end = self._new_node(end, keys[reached:full], reached, self._stamp(None))
                    private -= full - reached
            self._touch_path(end)
        self.unused += private
        self._unlock(hold)
        if not preempted:
            seq.kv_state = None
        elif self._in_flight >= 0:
            node = newest
            while (node is not self.root and node.born == self._in_flight and not node.chunk and not node.lock
                   and not node.children):
                parent = node.parent
                self._remove_leaf(node)
                self.epoch += 1
                node = parent
            while node is not self.root and node.born == self._in_flight and not node.chunk:
                self._drop_copy(node, hold)
                node = node.parent

    def _note_copies(self, hold: _Hold, end: _Node, stamp: tuple) -> None:
        """Planning ahead, a prefill about to lock the path down to ``end``: the nodes another
        running prefill made, this pass or the one in flight, are not in SGLang's tree yet, so it
        computes their blocks again (a duplicate, freed when its KV is inserted)."""
        node = end
        while node is not hold.node:
            if node.lock and node.owner is not None and not node.chunk and (
                    node.born == self._pass or node.born == self._in_flight):
                if node.copies is None:
                    node.copies = []
                node.copies.append([hold, self._pass, stamp])
            node = node.parent

    def _drop_copy(self, node: _Node, hold: _Hold) -> None:
        """Planning ahead, the prefill of ``hold`` is preempted while the node's blocks, computed
        by the batch in flight, are not in SGLang's tree yet: its copy of them is freed at once
        (``release_kv_cache(checkpoint=False)`` frees every page the request owns beyond its
        tree-protected prefix, mem_cache/common.py:400-444; the result of the batch in flight is
        skipped for it). If the node's blocks were its own, the first other prefill that
        computed them takes its place: its copy is the one SGLang inserts, when its batch's result
        is processed (so the node is that pass's, and its duplicate is freed now)."""
        copies = node.copies
        if not copies:
            return
        mine = next((c for c in copies if c[0] is hold), None)
        if mine is None and node.owner is hold:
            mine = copies[0]
            node.owner, node.born, node.stamp = mine[0], mine[1], mine[2]
        if mine is None:
            return
        copies.remove(mine)
        n = len(node.keys)
        if mine[1] == self._pass:  # (this pass's duplicates: free() ended the pass's admissions)
            self._queued -= n
        else:
            self._aging -= n
        self.unused += n
        self.epoch += 1

    def discard(self, seq) -> None:
        """Release ``seq`` without putting its newest blocks in the tree (SGLang
        ``release_kv_cache(checkpoint=False)``, an aborted chunked prefill): its path is
        unlocked, and the chunk the last pass inserted for it -- which SGLang would have put in
        the tree at the next pass (``stash_chunked_request``), after the abort -- freed."""
        self.end_pass()
        held = self.held(seq)
        hold = seq.kv_state
        seq.kv_state = None
        if hold is None:
            self.unused += held
            return
        self.unused += held - hold.length
        newest = hold.node
        self._unlock(hold)
        if newest.chunk and newest.born == self._pass and not newest.lock and not newest.children:
            self._remove_leaf(newest)
            self.epoch += 1

    # -- tree edits ----------------------------------------------------------------------------
    def _descend(self, node: _Node, depth: int, keys: list, limit: int) -> tuple[_Node, int]:
        """Follow existing nodes along ``keys`` up to ``limit``, splitting the node the match
        stops inside, so that the returned node ends exactly where the match does."""
        end, reached, inside = self._match(node, depth, keys, limit)
        if inside is not None:
            end = self._split(inside, reached - inside.start)
        return end, reached

    def _split(self, node: _Node, m: int) -> _Node:
        """Split ``node`` after its first ``m`` blocks and return the new head (SGLang
        ``_split_node``: the head takes the node's place and lock count, the node keeps the
        tail and its children; both count as accessed now, the head first -- SGLang stamps a new
        node at creation and the tail after the split)."""
        self._uid += 1
        self._tick += 1
        head = _Node(node.keys[:m], node.start, node.parent, self._tick, self._uid, node.born, node.chunk, node.stamp)
        head.lock = node.lock
        head.owner = node.owner
        if node.copies:
            head.copies = [list(c) for c in node.copies]
        self._count += 1
        node.parent.children[head.keys[0]] = head
        node.keys = node.keys[m:]
        node.start += m
        node.parent = head
        head.children[node.keys[0]] = node
        self._tick += 1
        node.tick = self._tick
        if not node.lock and not node.children:
            self._push(node)
        return head

    def _stamp(self, chunk: bool | None) -> tuple:
        """When SGLang puts the blocks an insertion made now into its tree, as ``(pass, phase,
        order)``: the order of siblings in its tree, which ``dfs-weight`` breaks ties by.
        ``chunk``: a prefill that does (True) or does not (False) end its prompt, None a finished
        request's sequence. A prefill of pass P joins the tree when its result is processed --
        before pass P + 1 is scheduled, or after it when the scheduler plans ahead -- and a chunk
        that does not end its prompt when pass P + 1 is scheduled (``stash_chunked_request``);
        a finished request's sequence when the running batch's result is processed."""
        if not self._pass:
            return (0, 0, self._uid + 1)
        if chunk is None:  # (planning ahead, that result comes in after this pass was planned)
            when = (self._pass, 1) if self._overlapped else (self._pass + 1, 0)
        else:
            when = (self._pass + 1, (0 if chunk else 1) if self._overlapped else (1 if chunk else 0))
        return when + (self._uid + 1,)

    def _new_node(self, parent: _Node, keys: list, start: int, stamp: tuple, born: int = 0,
                  chunk: bool = False) -> _Node:
        """A new unlocked node (its blocks count as evictable until a sequence locks it)."""
        self._uid += 1
        node = _Node(list(keys), start, parent, self._tick, self._uid, born, chunk, stamp)
        parent.children[keys[0]] = node
        self._count += 1
        self.evictable += len(keys)
        self.epoch += 1
        host = self.host
        if host is not None and host.write_through:  # HiCache write_through: backed up at insertion
            for i in range(len(keys) - 1, -1, -1):     # (blocks loaded from the host are held already)
                host.store(keys[i], start + i)
        return node

    def _lock_to(self, hold: _Hold, end: _Node, depth: int) -> None:
        """Move the sequence's lock from its path end down to ``end`` (a descendant)."""
        old = hold.node
        if end is old:
            return
        if old is not self.root:
            old.ends -= 1
        node = end
        while node is not old:
            if not node.lock:
                self.evictable -= len(node.keys)
            node.lock += 1
            node = node.parent
        end.ends += 1
        hold.node = end
        hold.length = depth

    def _unlock(self, hold: _Hold) -> None:
        node = hold.node
        if node is self.root:
            return
        node.ends -= 1
        while node is not self.root:
            node.lock -= 1
            if not node.lock:
                self.evictable += len(node.keys)
                if not node.children:
                    self._push(node)
            node = node.parent
        hold.node = self.root
        hold.length = 0

    def _touch_path(self, end: _Node) -> None:
        """Refresh access times from the root down to ``end`` (deeper nodes more recent)."""
        path = []
        node = end
        while node is not self.root:
            path.append(node)
            node = node.parent
        for node in reversed(path):
            self._tick += 1
            node.tick = self._tick
            if not node.lock and not node.children:
                self._push(node)

    def _push(self, node: _Node) -> None:
        heap = self._heap
        if len(heap) > 4 * self._count + 1024:  # drop stale entries now and then
            heap[:] = [e for e in heap if self._candidate(e)]
            heapq.heapify(heap)
        self._pushes += 1  # a node may be pushed twice with one tick (unlocked, locked, unlocked)
        heapq.heappush(heap, (node.tick, node.uid, self._pushes, node))

    @staticmethod
    def _candidate(entry) -> bool:
        """Whether a heap entry still names an unlocked leaf with that access time."""
        tick, _, _, node = entry
        return node.alive and not node.lock and not node.children and node.tick == tick

    def _take(self, count: int) -> None:
        """Take ``count`` blocks out of the unused ones (a negative count returns blocks),
        evicting least recently used unlocked leaves while unused blocks are short (within a
        pass: later, see :meth:`end_pass`)."""
        if count > self.unused:
            if self._deferring:
                self._owed += count - self.unused
                self.unused = 0
                return
            self._evict(count - self.unused)
        self.unused -= count

    def _evict(self, blocks: int) -> None:
        """Evict unlocked leaves, least recently used first, until ``blocks`` blocks are freed
        (SGLang ``RadixCache.evict``: whole nodes; a parent left childless becomes a leaf)."""
        heap = self._heap
        freed = 0
        while freed < blocks:
            entry = heapq.heappop(heap)
            if not self._candidate(entry):
                continue  # stale: evicted, locked, grown or touched since it was pushed
            node = entry[3]
            n = len(node.keys)
            if self.host is not None and not self.host.write_through:  # HiCache write_back: the node
                keys, start = node.keys, node.start                          # goes to host memory now
                for i in range(n - 1, -1, -1):
                    self.host.store(keys[i], start + i)
            self._remove_leaf(node)
            freed += n
        self.evictions += freed
        self.epoch += 1

    def _remove_leaf(self, node: _Node) -> None:
        """Take the unlocked leaf ``node`` out of the tree, its blocks unused; a parent left
        childless becomes a leaf."""
        parent = node.parent
        del parent.children[node.keys[0]]
        node.alive = False
        self._count -= 1
        n = len(node.keys)
        self.evictable -= n
        self.unused += n
        if parent is not self.root and not parent.lock and not parent.children:
            self._push(parent)

    # -- a restart -------------------------------------------------------------------------------
    def reset_prefix_cache(self) -> None:
        """Empty the tree and the host tier, leaving the cache as freshly built (an autoscaled
        instance's restart; vLLM's name -- SGLang's ``Scheduler.flush_cache`` refuses while requests
        wait or run, then resets the tree and clears the KV pool). RuntimeError while a sequence
        holds a block (a locked node or a private block) or a pass owes evictions or duplicates.
        ``evictions`` goes on counting the run's evictions; ``epoch`` changes."""
        if self.num_used_blocks() or self._owed or self._pending or self.releasing_blocks:
            raise RuntimeError(f"cannot reset the prefix cache while {self.num_used_blocks()} blocks are in use")
        self._empty()
        self.epoch += 1
        if self.host is not None:
            self.host.reset_prefix_cache()

    # -- inspection (tests, metrics) ------------------------------------------------------------
    def nodes(self) -> list[_Node]:
        """Every node but the root, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def cached_keys(self) -> set:
        """Keys of every block in the tree."""
        return {key for node in self.nodes() for key in node.keys}

    def layout(self) -> dict:
        """The tree as ``{(key, ...) path of a node: (segment keys, lock, tick)}``, for comparing states."""
        out = {}
        for node in self.nodes():
            path = []
            n = node
            while n is not self.root:
                path[:0] = n.keys
                n = n.parent
            out[tuple(path)] = (tuple(node.keys), node.lock, node.tick)
        return out

    def check_invariants(self) -> None:
        assert 0 <= self.unused <= self.num_blocks, (self.unused, self.num_blocks)
        evictable = protected = 0
        for node in self.nodes():
            parent = node.parent
            assert node.alive and node.keys, node
            assert parent.children.get(node.keys[0]) is node, f"{node!r} is not its parent's child"
            assert node.start == parent.start + len(parent.keys), node
            assert node.lock == node.ends + sum(c.lock for c in node.children.values()), node
            assert node.ends >= 0 and node.tick <= self._tick, node
            if node.lock:
                protected += len(node.keys)
            else:
                evictable += len(node.keys)
                if not node.children:
                    assert any(e[3] is node and self._candidate(e) for e in self._heap), (
                        f"unlocked leaf {node!r} is not an eviction candidate")
        assert evictable == self.evictable, (evictable, self.evictable)
        if self.host is not None:
            self.host.check_invariants()
        assert self._pending >= 0 and (self._deferring or not self._pending), self._pending
        assert (self._owed == 0 and self._lent == 0) or self._deferring, (self._owed, self._lent)
        waiting = self._pending + self.releasing_blocks
        assert min(self._queued, self._aging, self._stashed) >= 0, (self._queued, self._aging, self._stashed)
        assert self.unused + evictable + protected + waiting <= self.num_blocks, (
            self.unused, evictable, protected, waiting)
