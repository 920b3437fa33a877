"""Priority rules: record what each plan of a scheduler did, then check it against the requests' priorities.

:func:`~schedlab.testing.check_run` and :class:`~schedlab.testing.IterationChecker` hold for every
scheduler. Whether a plan honours priorities depends on the scheduler's policy, so these checks are
opt-in, for schedulers that promise vLLM's priority rules (``Request.priority``: lower value = more
important)::

    scheduler = RecordingScheduler(MyScheduler())
    run_engine(requests, scheduler, kv_blocks=blocks_for_largest(requests, 16) + 2)
    check_victims_least_important(scheduler, requests)
    check_admissions_follow_priority(scheduler, requests)

The checks take the priorities from ``requests`` as sent, not from what the engine served. The
engines let ``limit_request`` set a priority, so a ``limit_request`` that rebuilds a request and
drops its priority passes them. These checks fail it once that drop puts a request in the wrong
order, and the message says which priorities the scheduler saw. A scheduler that ranks requests
on purpose in its ``limit_request`` should be given the requests as it ranks them.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import attrs


class Queued(NamedTuple):
    """A waiting request as the engine holds it: its id, and its priority and arrival time as
    served (after the scheduler's ``limit_request``)."""

    id: int
    priority: int
    arrival_ms: float


@attrs.frozen
class PlanRecord:
    """What one ``schedule(plan)`` call saw and did.

    :ivar now: the plan's time (``plan.now``).
    :ivar waiting: the waiting queue before the call, in queue order.
    :ivar running: ids of the running requests before the call, in admission order.
    :ivar admitted: ids the plan admitted (``plan.admitted``).
    :ivar preempted: ids the plan preempted (``plan.preempted``). This includes swap-outs and
        ``Plan.requeue``.
    :ivar waiting_after: ids still waiting after the call, in queue order. Requests rejected
        from the queue have left it, and victims of this plan have joined it.
    :ivar running_after: ids running after the call, in admission order.
    :ivar finished: ids among ``preempted`` that had finished. A plan made ahead may preempt a
        finished request that still holds its slot, which frees the slot (``Plan.preempt``); its
        answer is complete.

    ``running`` and ``running_after`` list what ``plan.running`` lists. So a finished request
    that still holds its slot in a plan made ahead is left out, as is, on a pipeline, a request
    whose batch is in flight.
    """

    now: float
    waiting: tuple[Queued, ...]
    running: tuple[int, ...]
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    waiting_after: tuple[int, ...]
    running_after: tuple[int, ...]
    finished: tuple[int, ...] = ()


_OWN = ("inner", "records")


class RecordingScheduler:
    """Wraps a scheduler and keeps a :class:`PlanRecord` of every ``schedule(plan)`` call in
    ``records``, like :class:`~schedlab.testing.RecordingRouter` does for routers.

    The wrapper is transparent, so a wrapped run is the run of ``inner``. Every other attribute
    is read from ``inner``, and set on it too: the optional members of the Scheduler protocol
    (``stable_between_events``, ``new_waiting_queue``, ``limit_request``, ``slots``,
    ``stall_hint``, ...) are present exactly when ``inner`` has them. The wrapper's type also
    carries ``inner``'s class name, so the engines' messages name the plugin ("scheduler X's
    limit_request ...", stall messages) the same way as in an unwrapped run. It still passes
    ``isinstance(wrapper, RecordingScheduler)``.

    The fast engine does not call the scheduler for an iteration whose plan it already knows.
    Those are decode-only iterations of a ``stable_between_events`` scheduler, which admit and
    preempt nothing. So the two engines keep different numbers of records, but the same
    admissions and preemptions. Each call reads the whole waiting queue, which costs
    O(n log n) for a keyed queue. That is fine for tests, though slow for long runs.
    """

    __slots__ = _OWN

    def __new__(cls, inner, *args, **kwargs):
        return object.__new__(_named(cls, type(inner).__name__))

    def __init__(self, inner):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "records", [])

    def schedule(self, plan):
        waiting = tuple(Queued(s.request.id, s.request.priority, s.request.arrival_ms) for s in plan.waiting)
        running = _ids(plan.running)
        returned = self.inner.schedule(plan)
        preempted = plan.preempted
        self.records.append(PlanRecord(plan.now, waiting, running, _ids(plan.admitted), _ids(preempted),
                                       _ids(plan.waiting), _ids(plan.running),
                                       _ids(s for s in preempted if s.status == "finished")))
        return returned

    def __getattr__(self, name):
        if name in _OWN:  # (not set yet: a half-built wrapper must not recurse)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def __delattr__(self, name):
        if name in _OWN:
            object.__delattr__(self, name)
        else:
            delattr(self.inner, name)

    def __repr__(self) -> str:
        return f"RecordingScheduler({self.inner!r})"


_NAMED: dict = {}


def _named(cls: type, name: str) -> type:
    """A subclass of ``cls`` called ``name``, made once per pair."""
    cls = cls.__dict__.get("_recording_base", cls)
    sub = _NAMED.get((cls, name))
    if sub is None:
        sub = _NAMED[(cls, name)] = type(name, (cls,), {"__slots__": (), "__qualname__": name,
                                                        "__module__": cls.__module__, "_recording_base": cls})
    return sub


def _ids(seqs: Iterable) -> tuple[int, ...]:
    return tuple(s.request.id for s in seqs)


def _records(recorder) -> list[PlanRecord]:
    return recorder.records if isinstance(recorder, RecordingScheduler) else list(recorder)


def _priorities(requests: Sequence, records: list[PlanRecord]) -> tuple[dict, dict]:
    """The priorities as sent, by id, and the ones the scheduler saw in its queue."""
    sent = {r.id: r.priority for r in requests}
    seen = {q.id: q.priority for rec in records for q in rec.waiting}
    ids = set(seen).union(*((*rec.running, *rec.admitted, *rec.preempted, *rec.running_after) for rec in records))
    unknown = sorted(ids - sent.keys())
    if unknown:
        raise ValueError(f"requests {unknown[:10]} are in the scheduler's plans but not among the requests given: "
                         "pass every request of the run, as sent")
    return sent, seen


def _named_ids(ids: Iterable[int], sent: dict, seen: dict) -> str:
    """``3 (priority 0), 5 (priority 2)``, with a note where the scheduler saw a priority other than the one sent."""
    out = []
    for rid in ids:
        note = f"; the scheduler saw {seen[rid]}" if rid in seen and seen[rid] != sent[rid] else ""
        out.append(f"{rid} (priority {sent[rid]}{note})")
    return ", ".join(out)


def _dropped(ids: Iterable[int], sent: dict, seen: dict) -> str:
    if any(rid in seen and seen[rid] != sent[rid] for rid in ids):
        return (" The scheduler saw other priorities than the requests were sent with: does its limit_request "
                "rebuild requests (attrs.evolve keeps every field)?")
    return ""


def check_victims_least_important(recorder, requests: Sequence, *, newcomers: bool = True) -> None:
    """Assert that no plan preempted a request while a less important one, with a greater
    priority value, was still running after it.

    vLLM's priority policy picks its victim with ``max(running, key=(priority, arrival))``. So it
    frees the least important request's blocks first, and never a more important one while a
    less important one keeps running. ``recorder``: a :class:`RecordingScheduler` (or its
    records). ``requests``: the run's requests as sent, whose priorities are the truth.
    Swap-outs and ``Plan.requeue`` count as preemptions. Two kinds of preemption do not count. A
    finished request that still holds its slot in a plan made ahead only gives up that slot. A
    victim the same plan admits again is running after it.

    ``newcomers``: whether requests that joined the running set in this plan (admitted or
    swapped in) count among those kept running. ``False`` counts only requests that were running
    before the plan and still are. Use it for a scheduler that swaps a request in or admits one
    after it preempted, when the plan cannot take the newcomer back. Examples are vLLM V0's
    priority preemption and the built-in ``continuous`` scheduler with
    ``priority_preemption = true`` and ``preemption = "swap"``, which swaps a request in before it
    preempts for a newcomer.
    """
    records = _records(recorder)
    sent, seen = _priorities(requests, records)
    for rec in records:
        if not rec.preempted:
            continue
        victims = set(rec.preempted)
        before = set(rec.running)
        kept = [rid for rid in rec.running_after if rid not in victims and (newcomers or rid in before)]
        for victim in rec.preempted:
            if victim in rec.finished or victim in rec.running_after:  # (slot freed / admitted again)
                continue
            worse = [rid for rid in kept if sent[rid] > sent[victim]]
            if worse:
                raise AssertionError(
                    f"t={rec.now:.10g} ms: request {_named_ids([victim], sent, seen)} was preempted while less "
                    f"important request(s) {_named_ids(worse, sent, seen)} kept running. A victim must be the least "
                    f"important running request (lower value = more important, as in vLLM's priority policy). Running "
                    f"before: {list(rec.running)}, preempted {list(rec.preempted)}, admitted {list(rec.admitted)}."
                    + _dropped([victim, *worse], sent, seen))


def check_admissions_follow_priority(recorder, requests: Sequence, *, strict: bool = False) -> None:
    """Assert that no plan admitted a request while a more important one, with a smaller
    priority value, that was waiting before the plan was still waiting after it.

    This is what vLLM's priority policy guarantees. Its waiting queue is ordered by
    ``(priority, arrival)``, and admission takes the head while it fits and stops at the first
    request that does not (head-of-line). So:

    * a plan that admits nothing (the head does not fit the KV cache, the slots or the budget)
      passes;
    * a request the plan rejects (``Plan.reject``) is no longer waiting, so it holds back nobody;
    * only the queue as the plan found it counts. A victim of this plan returns to the queue
      during the plan and is not "waiting before", and arrivals the plan cannot see yet (a plan
      made ahead, while the batch before it runs) are not in the queue at all;
    * a preempted request goes back into the queue at its priority. If it re-enters ahead of a
      more important one, the check fails.

    ``strict``: also require admissions in the order of the scheduler's own queue
    (``new_waiting_queue``). Nothing may be admitted while a request ahead of it in the queue,
    as the plan found it, is still waiting. Under vLLM's queue that means arrival order within a
    priority; an FCFS scheduler that keeps vLLM's head-of-line rule passes too. A scheduler that
    back-fills (it skips a head that does not fit to admit smaller requests behind it) fails
    this. So does one that sorts its waiting requests itself at each plan, as the built-in
    ``sglang`` scheduler does: its queue holds no serving order to check.

    ``recorder``: a :class:`RecordingScheduler` (or its records). ``requests``: the run's
    requests as sent, whose priorities are the truth.
    """
    records = _records(recorder)
    sent, seen = _priorities(requests, records)
    for rec in records:
        if not rec.admitted:
            continue
        left = set(rec.waiting_after)
        still = [q.id for q in rec.waiting if q.id in left]
        if not still:
            continue
        for rid in rec.admitted:
            better = [w for w in still if sent[w] < sent[rid]]
            if better:
                raise AssertionError(
                    f"t={rec.now:.10g} ms: request {_named_ids([rid], sent, seen)} was admitted while more important "
                    f"request(s) {_named_ids(better, sent, seen)}, waiting before this plan, are still waiting "
                    f"after it (lower value = more important, as in vLLM's priority policy). Waiting before: "
                    f"{[q.id for q in rec.waiting]}, admitted {list(rec.admitted)}, preempted {list(rec.preempted)}."
                    + _dropped([rid, *better], sent, seen))
        if strict:
            position = {q.id: i for i, q in enumerate(rec.waiting)}
            for rid in rec.admitted:
                if rid not in position:  # (a victim of this plan, admitted again)
                    continue
                ahead = [w for w in still if position[w] < position[rid]]
                if ahead:
                    raise AssertionError(
                        f"t={rec.now:.10g} ms: request {_named_ids([rid], sent, seen)} was admitted past request(s) "
                        f"{_named_ids(ahead, sent, seen)}, ahead of it in the waiting queue and still waiting after "
                        f"the plan (strict: vLLM admits in queue order and stops at the first request that does not "
                        f"fit). Waiting before: {[q.id for q in rec.waiting]}, admitted {list(rec.admitted)}.")
