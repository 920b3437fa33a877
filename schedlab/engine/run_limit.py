"""A scheduler's limit on how long a request may run (SGLang's ``SGLANG_REQ_RUNNING_TIMEOUT``).

A scheduler with ``running_timeout_ms`` > 0 has the engine abort a request that much time after
it was first scheduled (SGLang's ``forward_entry_time``, which retractions do not reset). SGLang
polls for such requests at the top of its loop and aborts them as it aborts a request whose
client gave up (``Scheduler.abort_request``), so both engines put the deadline in the queue of
client aborts: the rules for when an abort is heard (at the next plan; in SGLang's overlap loop,
when the batch in flight has just started) and what it does (a running request runs once more
then leaves, a chunked prefill is dropped) are the ones already there. What differs:

* SGLang polls only the batches in flight: a request whose time is up while it waits, retracted
  or preempted, stays queued, and is aborted at the plan after the one that admits it again
  (:func:`waits_on`, :func:`deadline`);
* the request leaves counted as rejected, with the scheduler's reason (``running_timeout_reason``),
  and its client is answered then, as when a full queue turns one away.

Each sequence carries ``server_abort`` (its next abort entry is this limit's, not its client's)
and ``overdue`` (its time came while it waited).
"""

from __future__ import annotations

from .transfer import abort_heard_ms

#: the reason a row gives when the scheduler names none
DEFAULT_REASON = "running timeout reached"


def deadline(seq, now: float, limit_ms: float, hangup_ms: float) -> float | None:
    """At an admission of ``seq`` at ``now`` (before ``first_scheduled_ms`` is written): when its
    running time is up -- ``limit_ms`` after its first admission; ``now`` if its time came while
    it waited, so that the next plan hears it -- or None (no entry: neither its first admission
    nor overdue, or its client's abort comes first, at that time or before)."""
    if seq.first_scheduled_ms < 0:
        at = now + limit_ms
    elif seq.overdue:  # (heard at the next loop top, even one at this very time: planning ahead)
        seq.overdue = False
        at = now
    else:
        return None
    request = seq.request
    if request.timeout_ms is not None and abort_heard_ms(request, hangup_ms) <= at:
        return None
    seq.server_abort = True
    return at


def waits_on(seq) -> bool:
    """``seq`` is waiting when its running time's entry comes up: it stays queued, overdue."""
    if not seq.server_abort:
        return False
    seq.server_abort = False
    seq.overdue = True
    return True


def stays_queued(seq, status: str) -> bool:
    """Whether an abort entry of ``seq``, which has come, leaves it where it is: this limit's
    entry of a waiting request (routers count it as staying) -- not one a drain timeout aborts
    (:mod:`schedlab.engine.drain`)."""
    return status == "waiting" and seq.server_abort and not seq.drained


def limits_running(instances) -> bool:
    """Whether a scheduler of ``instances`` (or of their data-parallel ``ranks``) limits running
    time: the drivers then abort what is due before they route, as with clients that give up."""
    return any(getattr(inst, "running_timeout_ms", 0.0) or limits_running(getattr(inst, "ranks", ()))
               for inst in instances)
