"""Random differential cases, one generator per feature group.

Each group turns on one part of SGLang's scheduler (0.5.23) against small, fast cases
(1-8 requests, prompts up to 120 tokens, outputs up to 30; page size 1 but in the last five):

* ``lpm``        -- ``--schedule-policy lpm`` over shared prompt prefixes, ample memory;
* ``dfs_weight`` -- ``dfs-weight`` over shared prefixes, ample memory;
* ``fcfs``       -- ``fcfs`` or ``lof`` over shared prefixes, ample memory;
* ``eviction``   -- shared prefixes in a pool of 1x to 2x the largest request: the radix tree
  evicts, and admission counts evictable tokens;
* ``chunked``    -- a small ``--chunked-prefill-size`` and ``--max-prefill-tokens`` (or chunking
  off), ample memory;
* ``retract``    -- a pool of 1x to 2x the largest request, no shared prefixes, prompts up to 40
  tokens, answers up to 60 that all reach their ``max_tokens``, ``--schedule-conservativeness`` 0-0.3:
  admission estimates the answers at a low new-token ratio, decode runs out of memory and
  retracts;
* ``reserve``    -- half the requests stop at an EOS before their ``max_tokens`` (their
  reservations are estimates, the others' exact), a pool of 1x to 3x the largest request;
* ``mixed``      -- ``--enable-mixed-chunk``: a small ``--chunked-prefill-size`` (always on) and
  ``--max-prefill-tokens``, the running decodes joining each prefill step, memory ample or 1x to
  2x the largest request;
* ``all``        -- every policy, shared prefixes, chunking, tight memory, EOS and a lower
  conservativeness at once;
* ``overlap``    -- a case of any other group (drawn per seed) with SGLang's overlap scheduler on
  (its default): each batch planned while the one before runs;
* ``abort``      -- about 40% of the requests' clients give up half a ms into some iteration
  0-40 after their arrival; any policy, sometimes shared prefixes, chunking or tight memory:
  SGLang drops a queued request at once, a chunked prefill at its next plan, and runs a
  running one once more before it ends it (``Scheduler.abort_request``);
* ``overlap_abort`` -- the ``abort`` group's case with overlap scheduling on;
* ``priority``   -- ``--enable-priority-scheduling``: priorities 0-3, either direction, 1-4 slots,
  a preemption threshold of 0-2 (10, SGLang's default, preempts nobody at these priorities) or
  preemption off, any policy, sometimes shared prefixes, chunking, tight memory and the
  ``priority`` retraction policy;
* ``overlap_priority`` -- the ``priority`` group's case with overlap scheduling on;
* ``priority_abort`` -- the ``priority`` group's case with about 40% of the clients giving up as in
  ``abort`` and overlap scheduling in half: a request preempted or retracted after its abort was
  read keeps it (SGLang's ``to_finish``) and runs once more when it is admitted again;
* ``spf``        -- ``--schedule-policy shortest-prefill-first``: sometimes shared prefixes, chunking
  in 60% (a chunked prompt leaves room for shorter waiting ones), tight memory or overlap scheduling;
* ``hrrn``       -- ``--schedule-policy hrrn`` (highest response ratio next, on prompt tokens
  prefilled), arrivals spread out, sometimes shared prefixes, chunking, tight memory or overlap
  scheduling;
* ``queue_limit`` -- ``--max-queued-requests`` 1-3 and 1-3 slots: arrivals, and requests
  re-entering after a retraction (tight memory) or a preemption, are turned away when the queue
  is full -- with priorities (half the cases) the least important queued one may be instead;
  sometimes shared prefixes, chunking or overlap scheduling;
* ``waiting_timeout`` -- ``SGLANG_REQ_WAITING_TIMEOUT`` of 1-15 ms (steps) and 1-3 slots: a request
  queued that long since it entered the queue is aborted; sometimes a queue limit, priorities,
  tight memory (retracted requests enter again), shared prefixes, chunking or overlap scheduling;
* ``running_timeout`` -- ``SGLANG_REQ_RUNNING_TIMEOUT`` of 1-40 ms (steps) and 1-3 slots: a request in
  a batch that long after it was first scheduled is aborted as a client's abort is, one retracted
  meanwhile once it is readmitted; sometimes clients that give up too (before or after), a
  waiting timeout, a queue limit, priorities, tight memory, shared prefixes, chunking or overlap
  scheduling;
* ``queue_limit_abort`` -- the ``queue_limit`` group's case with about 40% of the clients giving up
  as in ``abort``: a queued request's abort frees its place in the queue for the arrivals read
  after it;
* ``paged``      -- ``--page-size`` 2, 4, 8 or 16 (SGLang's paged allocator, a radix tree of
  pages): shared prefixes (of whole pages in some requests), any order, ample memory or a pool of
  1x to 2x the largest request (the tree evicts), chunking in 30% (whole pages), and in 30% no
  ``--max-running-requests`` (SGLang's own, from the pool);
* ``paged_retract`` -- the ``retract`` case at page size 2-16 with 2-8 slots, prompts up to 8
  tokens in half the cases (up to 40 in the others) and, in 30%, about half the requests stopping
  at an EOS: decode needs a page for each request on a page boundary, and retracts until it fits;
* ``paged_chunked`` -- the ``chunked`` case at page size 2-16: chunks of whole pages (or chunking
  off in a third), the prompt and chunk budgets charged whole pages; ``--enable-mixed-chunk`` in
  30% of the chunked cases, a pool of 1x to 2x the largest request in 30%;
* ``no_radix``   -- ``--disable-radix-cache`` (schedlab: the ``paged`` cache without prefix
  caching) at page size 1 (40%) or 2-16: half the requests ignore EOS, which SGLang then admits
  by their known lengths (``add_one_req_ignore_eos``), the others stop at an EOS before their
  ``max_tokens``; a pool of 1x to 3x the largest request in 60%, chunking in 40%, no
  ``--max-running-requests`` in 30%, sometimes shared prefixes (nothing is cached) or an ``lpm``
  order (SGLang runs it first come first served);
* ``overlap_paged`` -- a case of ``paged``, ``paged_retract``, ``paged_chunked`` or ``no_radix``
  (drawn per seed) with overlap scheduling on.

"Ample" memory holds every request's prompt + max_tokens + 1 at once. A case depends only on
``(group, seed)``: the generator is ``random.Random(f"sglang:{group}:{seed}")``.
"""

from __future__ import annotations

import random

import attrs

from schedlab.diffcheck.case import Case
from schedlab.diffcheck.workloads import random_requests

from .case import POLICIES, POOL_MARGIN, SglangSettings, paged

GROUPS = ("lpm", "dfs_weight", "fcfs", "eviction", "chunked", "retract", "reserve", "mixed", "all", "overlap",
          "abort", "overlap_abort", "priority", "overlap_priority", "priority_abort", "hrrn", "spf", "queue_limit",
          "waiting_timeout", "running_timeout", "queue_limit_abort", "paged", "paged_retract", "paged_chunked",
          "no_radix", "overlap_paged")
#: the page sizes above one token the paged groups draw
PAGES = (2, 4, 8, 16)
#: the groups whose cases the ``overlap_paged`` group runs with overlap scheduling on
PAGED = ("paged", "paged_retract", "paged_chunked", "no_radix")
#: the groups whose cases the ``overlap`` group runs with overlap scheduling on
OVERLAPPED = GROUPS[:9]


def _need(r) -> int:
    """Pool tokens ``r`` needs alone: its prompt + max_tokens + :data:`POOL_MARGIN`, and at least
    prompt + 7, as SGLang refuses a prompt of pool - 6 tokens or more (``max_req_input_len``)."""
    return r.prompt_tokens + max(r.limit + POOL_MARGIN, 7)


def _need_paged(r, page: int, no_radix: bool = False) -> int:
    """:func:`_need` with pages of ``page`` tokens: the prompt's pages + max_tokens + a page + a
    token (what SGLang keeps back before it cuts ``max_new_tokens``) -- a token more for a request
    ignoring EOS without the radix cache (``add_one_req_ignore_eos``) --, and at least prompt + 7."""
    return max(paged(r.prompt_tokens, page) + r.limit + page + 1 + (no_radix and r.ignore_eos),
               r.prompt_tokens + 7)


def generate(group: str, seed: int) -> Case:
    """The case ``seed`` of feature ``group`` (one of :data:`GROUPS`)."""
    if group not in GROUPS:
        raise ValueError(f"unknown feature group {group!r}; groups: {', '.join(GROUPS)}")
    if group in ("overlap", "overlap_abort", "overlap_priority", "overlap_paged"):  # another group's case, ahead
        rng = random.Random(f"sglang:{group}:{seed}")
        case = generate(rng.choice(OVERLAPPED) if group == "overlap" else rng.choice(PAGED) if group == "overlap_paged"
                        else group[len("overlap_"):], seed)
        return attrs.evolve(case, settings=attrs.evolve(case.settings, overlap_schedule=True), group=group)
    rng = random.Random(f"sglang:{group}:{seed}")
    if group == "priority":
        return _priority_case(rng, seed)
    if group == "priority_abort":
        case = _priority_case(rng, seed)
        requests = [attrs.evolve(r, abort_at=r.arrival + rng.randint(0, 40) + 0.5) if rng.random() < 0.4 else r
                    for r in case.requests]
        settings = attrs.evolve(case.settings, overlap_schedule=rng.random() < 0.5)
        return attrs.evolve(case, settings=settings, requests=requests, group=group)
    if group == "hrrn":
        return _hrrn_case(rng, seed)
    if group == "spf":
        requests, _, tight, sizes = _sized(rng, prefixes_p=0.5, tight_p=0.3, chunk_p=0.6)
        settings = SglangSettings(**sizes, schedule_policy="shortest-prefill-first",
                                  schedule_conservativeness=rng.choice([0.1, 0.3, 1.0]) if tight else 1.0,
                                  overlap_schedule=rng.random() < 0.5)
        return Case(settings, requests, group=group, seed=seed)
    if group == "queue_limit":
        return _queue_limit_case(rng, seed)
    if group == "queue_limit_abort":  # the queue_limit case of this seed, with aborts
        case = generate("queue_limit", seed)
        requests = [attrs.evolve(r, abort_at=r.arrival + rng.randint(0, 40) + 0.5) if rng.random() < 0.4 else r
                    for r in case.requests]
        return attrs.evolve(case, requests=requests, group=group)
    if group in ("paged", "paged_retract", "paged_chunked", "no_radix"):
        return _paged_case(rng, group, seed)
    if group == "waiting_timeout":
        case = _queue_limit_case(rng, seed)
        settings = attrs.evolve(case.settings, waiting_timeout_ms=rng.randint(1, 15),
                                max_queued_requests=rng.choice((0, 0, case.settings.max_queued_requests)))
        return attrs.evolve(case, settings=settings, group=group)
    if group == "running_timeout":
        case = _queue_limit_case(rng, seed)
        settings = attrs.evolve(case.settings, running_timeout_ms=rng.randint(1, 40),
                                waiting_timeout_ms=rng.choice((0, 0, 0, rng.randint(1, 15))),
                                max_queued_requests=rng.choice((0, 0, 0, case.settings.max_queued_requests)))
        requests = case.requests
        if rng.random() < 0.3:  # clients that give up, before or after the server's limit
            requests = [attrs.evolve(r, abort_at=r.arrival + rng.randint(0, 40) + 0.5) if rng.random() < 0.4 else r
                        for r in requests]
        return attrs.evolve(case, settings=settings, requests=requests, group=group)
    policy = {"lpm": "lpm", "dfs_weight": "dfs-weight"}.get(group) or rng.choice(
        ("fcfs", "lof") if group == "fcfs" else ("fcfs",) if group in ("chunked", "retract", "reserve", "mixed")
        else POLICIES)
    aborting = group == "abort"
    prefixes = group in ("lpm", "dfs_weight", "fcfs", "eviction", "all") or (aborting and rng.random() < 0.5)
    retract = group == "retract"
    requests = random_requests(rng, prefixes=prefixes, eos=group in ("reserve", "all"), limited=retract,
                               longest_prompt=40 if retract else 120, longest_output=60 if retract else 30)
    if aborting:
        requests = [attrs.evolve(r, abort_at=r.arrival + rng.randint(0, 40) + 0.5) if rng.random() < 0.4 else r
                    for r in requests]
    largest = max(max(_need(r) for r in requests), 16)
    if group in ("eviction", "retract", "all") or (group in ("mixed", "abort") and rng.random() < 0.5):
        size = largest + rng.randint(0, largest)
    elif group == "reserve":
        size = largest + rng.randint(0, 2 * largest)
    else:
        size = sum(_need(r) for r in requests) + rng.randint(0, 20)
    size = max(size, 16)  # SGLang needs room for its own bookkeeping (max_req_input_len = size - 6)
    chunk, prefill = 0, 16384
    if group in ("chunked", "all") or (aborting and rng.random() < 0.5):
        chunk = rng.choice([0, rng.randint(1, 64), rng.randint(1, 64)])
        prefill = rng.randint(1, 200)
    elif group == "mixed":
        chunk, prefill = rng.randint(1, 64), rng.randint(1, 200)
    conservativeness = 1.0
    if retract:
        conservativeness = rng.choice([0.0, 0.05, 0.1, 0.3])
    elif group == "all":
        conservativeness = rng.choice([0.1, 0.3, 1.0, 1.0])
    settings = SglangSettings(max_total_tokens=size, max_running_requests=rng.randint(1, 6),
                              chunked_prefill_size=chunk, max_prefill_tokens=prefill, schedule_policy=policy,
                              schedule_conservativeness=conservativeness, enable_mixed_chunk=group == "mixed")
    return Case(settings, requests, group=group, seed=seed)


def _sized(rng: random.Random, *, prefixes_p: float, tight_p: float, chunk_p: float,
           priorities: bool = False) -> tuple[list, bool, bool, dict]:
    """The requests, whether they share prefixes and have a tight pool, and the pool, slot and
    chunk settings of a ``priority`` or ``hrrn`` case."""
    prefixes = rng.random() < prefixes_p
    tight = rng.random() < tight_p
    requests = random_requests(rng, priorities=priorities, prefixes=prefixes, eos=rng.random() < 0.3,
                               limited=tight, longest_prompt=40 if tight else 120, longest_output=60 if tight else 30)
    largest = max(max(_need(r) for r in requests), 16)
    size = largest + rng.randint(0, largest) if tight else sum(_need(r) for r in requests) + rng.randint(0, 20)
    chunk, prefill = 0, 16384
    if rng.random() < chunk_p:
        chunk, prefill = rng.randint(1, 64), rng.randint(1, 200)
    sizes = dict(max_total_tokens=max(size, 16), max_running_requests=rng.randint(1, 4), chunked_prefill_size=chunk,
                 max_prefill_tokens=prefill)
    return requests, prefixes, tight, sizes


def _priority_case(rng: random.Random, seed: int) -> Case:
    """A ``priority`` case (module docstring)."""
    requests, prefixes, tight, sizes = _sized(rng, prefixes_p=0.4, tight_p=0.4, chunk_p=0.3, priorities=True)
    settings = SglangSettings(
        **sizes, schedule_policy=rng.choice(("fcfs", "fcfs", "lof") + (POLICIES if prefixes else ())),
        schedule_conservativeness=rng.choice([0.1, 0.3, 1.0]) if tight else 1.0, enable_priority_scheduling=True,
        schedule_low_priority_values_first=rng.random() < 0.5,
        priority_scheduling_preemption_threshold=rng.choice((0, 0, 1, 2, 10)),
        disable_priority_preemption=rng.random() < 0.2,
        retraction_policy=rng.choice(("length", "priority")) if tight else "length")
    return Case(settings, requests, group="priority", seed=seed)


def _hrrn_case(rng: random.Random, seed: int) -> Case:
    """An ``hrrn`` case (module docstring)."""
    requests, _, tight, sizes = _sized(rng, prefixes_p=0.5, tight_p=0.3, chunk_p=0.4)
    settings = SglangSettings(**sizes, schedule_policy="hrrn",
                              schedule_conservativeness=rng.choice([0.1, 0.3, 1.0]) if tight else 1.0,
                              overlap_schedule=rng.random() < 0.5)
    return Case(settings, requests, group="hrrn", seed=seed)


def _queue_limit_case(rng: random.Random, seed: int) -> Case:
    """A ``queue_limit`` case (module docstring)."""
    priorities = rng.random() < 0.5
    requests, prefixes, tight, sizes = _sized(rng, prefixes_p=0.3, tight_p=0.4, chunk_p=0.3, priorities=priorities)
    sizes["max_running_requests"] = rng.randint(1, 3)
    settings = SglangSettings(
        **sizes, max_queued_requests=rng.randint(1, 3),
        schedule_policy=rng.choice(("fcfs", "fcfs", "lof") + (POLICIES if prefixes else ())),
        schedule_conservativeness=rng.choice([0.1, 0.3, 1.0]) if tight else 1.0,
        enable_priority_scheduling=priorities, schedule_low_priority_values_first=priorities and rng.random() < 0.5,
        priority_scheduling_preemption_threshold=rng.choice((0, 1, 10)) if priorities else 10,
        disable_priority_preemption=priorities and rng.random() < 0.3,
        retraction_policy=rng.choice(("length", "priority")) if priorities and tight else "length",
        overlap_schedule=rng.random() < 0.4)
    return Case(settings, requests, group="queue_limit", seed=seed)


def _paged_case(rng: random.Random, group: str, seed: int) -> Case:
    """A ``paged``, ``paged_retract``, ``paged_chunked`` or ``no_radix`` case (module docstring)."""
    no_radix = group == "no_radix"
    page = rng.choice((1, 1) + PAGES) if no_radix else rng.choice(PAGES)
    retract = group == "paged_retract"
    chunked_group = group == "paged_chunked"
    prefixes = group == "paged" and rng.random() < 0.8 or no_radix and rng.random() < 0.2
    eos = no_radix or retract and rng.random() < 0.3
    # (retracting: prompts of a page or so in half the cases, so that more run at once and one
    # retraction may not be enough)
    longest_prompt = rng.choice((8, 40)) if retract else 120
    requests = random_requests(rng, prefixes=prefixes, block_size=page, eos=eos, limited=retract,
                               longest_prompt=longest_prompt, longest_output=60 if retract else 30)
    largest = max(max(_need_paged(r, page, no_radix) for r in requests), 16)
    if retract or (group in ("paged", "paged_chunked") and rng.random() < (0.5 if group == "paged" else 0.3)):
        size = largest + rng.randint(0, largest)
        tight = True
    elif no_radix and rng.random() < 0.6:
        size = largest + rng.randint(0, 2 * largest)
        tight = True
    else:
        size = sum(_need_paged(r, page, no_radix) for r in requests) + rng.randint(0, 20)
        tight = False
    size = paged(max(size, 16), page)
    chunk, prefill, mixed = 0, 16384, False
    if chunked_group or rng.random() < (0.4 if no_radix else 0.3 if group == "paged" else 0):
        chunk = rng.choice([0, page * rng.randint(1, max(1, 64 // page)), page * rng.randint(1, max(1, 64 // page))]) \
            if chunked_group else page * rng.randint(1, max(1, 64 // page))
        prefill = rng.randint(1, 200)
        mixed = chunked_group and bool(chunk) and rng.random() < 0.3
    if retract:
        conservativeness = rng.choice([0.0, 0.05, 0.1, 0.3])
    elif tight:
        conservativeness = rng.choice([0.1, 0.3, 1.0, 1.0])
    else:
        conservativeness = 1.0
    if group == "paged":
        policy = rng.choice(POLICIES)
    elif no_radix:
        policy = rng.choice(("fcfs", "fcfs", "lof", "lpm"))
    else:
        policy = "fcfs"
    slots = 0 if group in ("paged", "no_radix") and rng.random() < 0.3 else rng.randint(2, 8) if retract \
        else rng.randint(1, 6)
    settings = SglangSettings(max_total_tokens=size, max_running_requests=slots, chunked_prefill_size=chunk,
                              max_prefill_tokens=prefill, schedule_policy=policy,
                              schedule_conservativeness=conservativeness, enable_mixed_chunk=mixed, page_size=page,
                              disable_radix_cache=no_radix)
    return Case(settings, requests, group=group, seed=seed)
