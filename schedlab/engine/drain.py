"""A drain timeout (``[cluster.autoscaler] drain_timeout_s``): a draining instance stopped with the
requests it still holds, in both engines.

An autoscaled instance that drains (:mod:`schedlab.engine.scaling`) finishes what it holds; with a
drain timeout, whatever it still holds that long after its drain began is aborted. vLLM 0.33 on
SIGTERM (``EngineCore._handle_shutdown``, at the top of its busy loop, between two steps) aborts
every request it holds when ``--shutdown-timeout`` is 0, and otherwise keeps stepping to finish
them for at most that long; Kubernetes kills the pod ``terminationGracePeriodSeconds`` (30 s)
after its SIGTERM. The timeout is the shorter of the two. Here:

* the instance aborts at its **first plan at or after the deadline** (the deadline ``D`` is the
  drain's start plus the timeout): an iteration in progress at ``D`` runs to its end and its
  tokens count; a pending run of decode iterations is cut to those that start before ``D``
  (:meth:`Instance.drain_by`); a pipelined instance aborts at its first launch at or after ``D``,
  a data-parallel deployment's ranks at their first step at or after ``D``;
* every request it holds is aborted then -- waiting (a terminated pod's queue is gone), running,
  swapped out, in a pipeline's batch in flight -- through each engine's queue of client aborts,
  as if every client's abort reached the engine at that instant: their KV freed, their rows
  written as the rows of requests whose clients gave up (``aborted`` and ``timed_out`` = 1:
  failed for their clients, left out of the latencies), each client done when the engine
  dropped its request -- its connection closed -- or when it gave up, if earlier
  (:func:`schedlab.frontend.client_times`); they miss the SLO. The rules of when an abort takes
  effect are the ones already there: planning ahead, the batch planned before is computed for
  nothing; SGLang's scheduler runs an aborted running request once more; a pipeline's batches in
  flight land without them;
* a request whose client's own abort has reached the engine by then is aborted as its client's
  (not counted here), and the deadline goes before the scheduler's running time limit
  (:mod:`schedlab.engine.run_limit`) at the same plan;
* the instance holds nothing afterwards (but a batch already launched) and goes off then; each
  engine counts the requests a drain aborted (``drain_aborted``, the autoscaler's summary);
* a draining instance taken back by a scale-up before its deadline serves on, its timer
  cancelled; one whose deadline has come is not taken back (the scale-up warms another);
* a disaggregated cluster's pools take no drain timeout (refused when the file is read).

The entries go after every client's abort due at that time (:data:`ORDER`): both engines then
abort in the same order.
"""

from __future__ import annotations

from .transfer import abort_heard_ms

#: added to a sequence's number in its drain abort entry: after the clients' entries of the same time
ORDER = 1 << 62

_DONE = ("finished", "aborted", "rejected")


def victims(inst, now: float) -> list:
    """The sequences ``inst`` (either engine's instance, colocated, pipelined or a data-parallel
    rank) holds at ``now`` that a drain timeout aborts -- queued (arrivals not yet planned too),
    running, swapped out, held back by a pipeline's batches in flight -- in number order, each
    marked ``drained``; not those already done, nor those whose client's abort has reached the
    engine by ``now`` (their own entries abort them)."""
    seqs = [*inst.waiting, *inst.running, *inst.swapped]
    ahead = getattr(inst, "ahead", None)
    if ahead is not None:
        seqs.extend(ahead.deferred)
    holds = getattr(inst, "holds", None)
    if holds is not None:
        seqs.extend(holds.held)
    hangup = inst.hangup_ms
    out = []
    for seq in dict.fromkeys(seqs):
        request = seq.request
        if seq.status in _DONE or (request.timeout_ms is not None and abort_heard_ms(request, hangup) <= now):
            continue
        seq.drained = True
        out.append(seq)
    return sorted(out, key=lambda s: s.seq_no)
