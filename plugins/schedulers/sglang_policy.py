"""SGLang's waiting queue and its orders (``--schedule-policy``): ``fcfs``, ``lpm``,
``dfs-weight``, ``lof``, ``hrrn``, ``shortest-prefill-first``.

Follows SGLang 0.5.23, ``python/sglang/srt/managers/schedule_policy.py``
(``SchedulePolicy.calc_priority``). The waiting queue is a plain list that each prefill pass
re-sorts in place, with Python's stable sort, so ties keep the order of the previous pass;
arrivals and retracted requests are appended at the back (``waiting_queue.append``, unlike
vLLM, which puts preempted requests in front).

* ``fcfs`` -- no sorting: arrival order, retracted requests at the back. With priority
  scheduling, sorted by priority, then by the time each request entered the queue (a retracted
  or preempted request's re-entry counts).
* ``lof`` -- longest output first: sorted by ``-max_new_tokens`` (here ``max_tokens``); with
  priority scheduling by priority first.
* ``lpm`` -- longest prefix match first: sorted by the prefix-cache hit, longest first. With
  *in-batch prefix caching*: a request whose cache hit is at most 32 tokens is matched against
  the prompts of the waiting requests before it (a temporary radix tree of them); if at least
  32 of its tokens match one of those, it is *deprioritized* (sorted last), so that one request
  computes the shared prefix and the others can hit it later.
* ``dfs-weight`` -- depth first through the radix tree, the subtree with the most waiting
  requests first (:meth:`~schedlab_plugins.kv_caches.radix.RadixKVCache.dfs_weight_order`).
* ``hrrn`` -- highest response ratio next, with tokens for time: the tokens of the batches the
  server has launched since a request entered the queue (``processed_tokens_counter``: a decode
  batch counts what its batch object counted when formed as a prefill, as SGLang's does), over
  the prompt tokens it still needs (uncached), highest first; deprioritized as ``lpm``; ties by
  arrival (SGLang's: by request id, a random uuid in a server).
* ``shortest-prefill-first`` (SGLang's, "experimental") -- the fewest tokens still to prefill
  first (prompt and generated tokens less the cache hit, at least 1), deprioritized ones last as
  ``lpm``, ties by queue entry. A chunked prompt in progress leaves room in its pass for the
  shorter waiting prefills that fit the chunk budget (:meth:`Policy.chunk_limit`).

The cache-aware orders ignore priorities.

``lpm``, ``dfs-weight``, ``hrrn`` and ``shortest-prefill-first`` need a prefix cache (without one
they are ``fcfs``); above 128 waiting requests ``lpm`` and ``hrrn`` do not sort
(``_determine_active_policy``). They look every waiting request up in the cache, and the other
orders look the waiting requests up every 32nd pass
(``_touch_waiting_prefixes``, at most 128, the head last): with the ``radix`` cache a lookup
splits nodes and refreshes access times (``touch``), which decides what LRU eviction takes.
These lookups match the whole prompt, where an admission's stops a token short; the orders rank
by that whole match less the prompt's last token (``num_matched_prefix_tokens``), which with
pages of more than a token may be more than the admission will find (a 2-token prompt whose
2-token page is cached ranks by 1 token, and finds none).

The hit comes from the KV cache (``plan.cached_tokens``: the ``radix`` cache or the ``paged``
cache with prefix caching), so it is counted in whole blocks; the in-queue match uses the
same block keys (:func:`~schedlab_plugins.kv_caches.prefix.block_key`), so "32 tokens"
means ``ceil(32 / block_size)`` blocks.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from schedlab.queues import FcfsQueue
from schedlab_plugins.kv_caches.prefix import block_key

POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "hrrn", "shortest-prefill-first")
CACHE_AWARE = ("lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
#: ``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`` and ``..._DEPRIORITIZE_THRESHOLD`` (tokens).
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32
#: above this many waiting requests ``lpm`` does not sort (``WAITING_QUEUE_PREFIX_MATCH_MAX``).
LPM_MAX_QUEUE = 128
#: passes between two refreshes of the waiting requests' prefixes (``WAITING_PREFIX_REFRESH_INTERVAL``).
REFRESH_INTERVAL = 32


class SglangQueue(FcfsQueue):
    """SGLang's waiting list: append at the back, re-sorted stably by :meth:`reorder`. Each
    request keeps the stamp of its latest entry (``wait_queue_entry_time``) while it runs, and
    the prompt tokens prefilled before it (``arrival_processed_tokens``; ``counter`` counts them)."""

    __slots__ = ("entered", "_entries", "counter", "hrrn", "processed_before", "_unstamped", "arrivals", "entries")

    def __init__(self, counter=None, *, hrrn: bool = False, arrivals: bool = False, timed: bool = False) -> None:
        super().__init__()
        self.entered: dict[int, int] = {}  # seq_no -> its latest entry's number
        self._entries = 0
        #: the scheduler: ``processed_tokens``, and ``in_pass`` while it plans
        self.counter = counter
        self.hrrn = hrrn                             # stamp ``processed_before``
        self.processed_before: dict[int, int] = {}  # seq_no -> the counter at its entry
        self._unstamped: list = []                   # arrivals since the last pass
        #: the requests that entered between passes (arrivals), in order, if kept
        self.arrivals: list | None = [] if arrivals or timed else None
        #: if kept: ``(time, seq, entry number)`` of every entry, in order -- an arrival's time is
        #: the pass that reads it (:meth:`stamp_entries`), a re-entry's the pass it happens in
        #: (``counter.now``); stale entries (left, or entered again) are skipped by :meth:`expired`
        self.entries: deque | None = deque() if timed else None

    def push(self, seq) -> None:
        self._entries += 1
        self.entered[seq.seq_no] = self._entries
        counter = self.counter
        if counter is not None:  # (an arrival is read at the next pass, with the counter then)
            if counter.in_pass:
                if self.hrrn:
                    self.processed_before[seq.seq_no] = counter.processed_tokens
                if self.entries is not None:
                    self.entries.append((counter.now, seq, self._entries))
            else:
                if self.hrrn:
                    self._unstamped.append(seq.seq_no)
                if self.arrivals is not None:
                    self.arrivals.append(seq)
        self._items.append(seq)

    def stamp_entries(self, arrivals: list, now: float) -> None:
        """``arrivals`` (read by the pass at ``now``) enter the queue then, in this order."""
        if self.entries is not None:
            entered = self.entered
            self.entries.extend((now, seq, entered[seq.seq_no]) for seq in arrivals)

    def expired(self, now: float, timeout: float) -> list:
        """The queued requests that have waited ``timeout`` by ``now`` since they entered, in entry
        order (SGLang's ``SGLANG_REQ_WAITING_TIMEOUT`` poll; ``at + timeout``, the time the
        scheduler asks to be woken at, exactly)."""
        out = []
        entries, entered = self.entries, self.entered
        for at, seq, number in entries:
            if at + timeout > now:
                break
            if seq.status == "waiting" and entered.get(seq.seq_no) == number:
                out.append(seq)
        return out

    def first_entry(self) -> float | None:
        """When the longest-queued request entered (None: nobody queued)."""
        entries, entered = self.entries, self.entered
        while entries:
            at, seq, number = entries[0]
            if seq.status == "waiting" and entered.get(seq.seq_no) == number:
                return at
            entries.popleft()
        return None

    def stamp_arrivals(self, processed: int) -> None:
        """The arrivals since the last pass enter the queue now, with the counter at ``processed``."""
        for n in self._unstamped:
            self.processed_before[n] = processed
        self._unstamped.clear()

    def push_front(self, seq) -> None:
        """A retracted or preempted request: SGLang re-queues it at the back (``_add_request_to_queue``)."""
        self.push(seq)

    def move_to_back(self, seqs: list) -> None:
        """Re-queue ``seqs`` (queued already) at the back in this order, entering now -- as SGLang
        adds the requests a pass preempted once the pass is over."""
        gone = set(seqs)
        self._items = deque(s for s in self._items if s not in gone)
        counter = self.counter
        for seq in seqs:
            self._entries += 1
            self.entered[seq.seq_no] = self._entries
            if self.hrrn:
                self.processed_before[seq.seq_no] = counter.processed_tokens
            if self.entries is not None:
                self.entries.append((counter.now, seq, self._entries))
            self._items.append(seq)

    def reorder(self, key: Callable) -> None:
        """Sort by ``key``, ties in the current order (Python's ``list.sort`` is stable)."""
        self._items = deque(sorted(self._items, key=key))

    def arrange(self, order: list[int]) -> None:
        """Put the items in ``order`` (indices into the current order)."""
        items = list(self._items)
        self._items = deque(items[i] for i in order)


def _longest_output(seq) -> int:
    return -seq.request.max_output_tokens


class Policy:
    """One scheduler's ``SchedulePolicy``: the order plus its pass counter."""

    def __init__(self, name: str, priority_sign: int = 0):
        self.name = name
        self.refreshes = 0
        #: with ``--enable-priority-scheduling``: 1 if lower priority values go first, -1 if
        #: higher ones do (SGLang's default); 0 without priorities
        self.priority_sign = priority_sign
        #: ``seq_no -> tokens`` the cache-aware orders matched for each waiting request, if set
        #: to a dict (SGLang keeps the match as the request's ``prefix_len``)
        self.matched: dict | None = None
        #: ``shortest-prefill-first``: ``seq_no -> tokens to prefill`` of this pass's sort (None:
        #: another order, or no prefix cache)
        self.work: dict | None = None

    def chunk_limit(self, waiting, remaining: int, budget: int, page: int) -> int | None:
        """``shortest_prefill_chunk_limit``: with ``shortest-prefill-first``, the most a chunked
        prompt with ``remaining`` tokens to go may take of the pass's chunk ``budget`` -- the
        budget less the pages of the waiting prefills shorter than it, in queue order, that fit
        beside a page of it -- or None (no cap: another order, a budget under two pages, or no
        shorter prefill that fits)."""
        work = self.work
        if work is None or budget < 2 * page:
            return None
        reserved = 0
        for seq in waiting:
            n = work[seq.seq_no]
            charge = -(-n // page) * page
            if n >= remaining or reserved + charge > budget - page:
                break
            reserved += charge
        return (budget - reserved) // page * page if reserved else None

    def calc_priority(self, plan) -> None:
        """Re-sort ``plan.waiting`` for one prefill pass (``SchedulePolicy.calc_priority``)."""
        waiting = plan.waiting
        kv = plan.kv
        caching = getattr(kv, "prefix_caching", False)
        active = self.name
        if active in CACHE_AWARE and not caching:
            active = "fcfs"  # (SGLang's configured policy, ``_validate_and_adjust_policy``)
        configured = active
        self.work = None
        if active in ("lpm", "hrrn") and len(waiting) > LPM_MAX_QUEUE:
            active = "fcfs"
        sign = self.priority_sign
        if sign and configured == "fcfs":
            entered = waiting.entered
            waiting.reorder(lambda seq: (seq.request.priority * sign, entered[seq.seq_no]))
        elif active == "lof" and sign:
            waiting.reorder(lambda seq: (seq.request.priority * sign, -seq.request.max_output_tokens))
        elif active == "lof":
            waiting.reorder(_longest_output)
        elif active == "lpm":
            hits, deferred = _prefix_matches(plan, self.matched)
            waiting.reorder(lambda seq: float("inf") if seq.seq_no in deferred else -hits[seq.seq_no])
        elif active == "hrrn":
            hits, deferred = _prefix_matches(plan, self.matched)
            keys = _response_ratio_keys(waiting, hits, deferred)
            waiting.reorder(lambda seq: (keys[seq.seq_no], seq.seq_no))
        elif active == "shortest-prefill-first":
            hits, deferred = _prefix_matches(plan, self.matched)
            entered = waiting.entered
            self.work = {seq.seq_no: _prefill_work(seq, hits[seq.seq_no]) for seq in waiting}
            waiting.reorder(lambda seq: (seq.seq_no in deferred, self.work[seq.seq_no], entered[seq.seq_no]))
        elif active == "dfs-weight":
            _touch_all(plan, self.matched)
            waiting.arrange(kv.dfs_weight_order(list(waiting)))
        if active not in CACHE_AWARE and caching and waiting:
            refresh = self.refreshes % REFRESH_INTERVAL == 0
            self.refreshes += 1
            touch = getattr(kv, "touch", None)
            if refresh and touch is not None:
                for seq in reversed(list(waiting)[:LPM_MAX_QUEUE]):
                    touch(seq, whole=True)


def _touch_all(plan, matched: dict | None) -> None:
    touch = getattr(plan.kv, "touch", None)
    if touch is not None:
        for seq in plan.waiting:
            got = touch(seq, whole=True)
            if matched is not None:
                matched[seq.seq_no] = got


def _response_ratio_keys(waiting: SglangQueue, hits: dict, deferred: set) -> dict:
    """``seq_no -> sort key`` for ``hrrn`` (``_sort_by_hrrn``): minus the prompt tokens prefilled
    since the request entered the queue per prompt token it still has to prefill -- classic HRRN's
    waiting time over service time, with tokens for time; -inf with nothing to prefill, +inf when
    deprioritized as ``lpm`` does."""
    processed = waiting.counter.processed_tokens
    before = waiting.processed_before
    keys = {}
    for seq in waiting:
        n = seq.seq_no
        uncached = seq.request.prompt_tokens - hits[n]
        if n in deferred:
            keys[n] = float("inf")
        elif uncached <= 0:
            keys[n] = -float("inf")
        else:
            keys[n] = -max(0, processed - before.get(n, 0)) / uncached
    return keys


def _prefill_work(seq, hit: int) -> int:
    """``_shortest_prefill_work``: the tokens ``seq`` still has to prefill (prompt and generated
    tokens, less its cache hit), at least 1."""
    n = seq.num_tokens - hit
    return n if n > 1 else 1


def _prefix_matches(plan, matched_out: dict | None = None) -> tuple[dict, set]:
    """The cache-aware orders' lookups (``_compute_prefix_matches``): ``seq_no -> cache hit`` and
    the requests deprioritized by in-batch prefix caching."""
    bs = plan.kv.block_size
    depth = -(-IN_BATCH_DEPRIORITIZE_TOKENS // bs)  # blocks a match must reach to count
    touch = getattr(plan.kv, "touch", None)
    seen: set = set()                               # the first ``depth`` keys of waiting prompts
    hits = {}
    deferred = set()
    for seq in plan.waiting:
        hit = plan.cached_tokens(seq)  # at most all tokens but the last, in whole pages
        # the check reads the whole prompt's match (``prefix_len`` of ``match_kv_cache``) ...
        matched = touch(seq, whole=True) if touch is not None else hit
        if matched_out is not None:
            matched_out[seq.seq_no] = matched
        # ... and the order that match less the last token (``num_matched_prefix_tokens``: not cut to
        # pages, so with pages of more than a token it may exceed the admission's hit)
        hits[seq.seq_no] = min(max(matched, hit), seq.num_tokens - 1) if touch is not None else hit
        if matched > IN_BATCH_CHECK_TOKENS:
            continue
        # SGLang matches the whole prompt (and generated tokens); only full blocks have keys here
        if seq.num_tokens // bs < depth:
            continue  # too short to match ``depth`` blocks of anything
        head = tuple(block_key(seq.request, j, bs) for j in range(depth))
        if head in seen:
            deferred.add(seq.seq_no)
        else:
            seen.add(head)
    return hits, deferred
