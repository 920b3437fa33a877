"""When an engine's loop takes a request (``taken_ms``): its instance's first plan at or after its arrival.

vLLM's engine core hands the requests that came meanwhile to its scheduler at the top of each
busy-loop iteration, just before it schedules (``EngineCore._process_input_queue`` ->
``Scheduler.add_request``, which stamps ``queued_ts``; with a batch queue, before each
``schedule()`` of ``step_with_batch_queue``); SGLang's event loop does the same
(``recv_requests`` + ``process_input_requests`` stamp ``queue_time_start``). A request that
arrives while a step runs is taken when the next plan is made -- the step's end, or, planning
ahead (:mod:`schedlab.engine.ahead`), the start of the batch in flight when the plan after it is
made --; one that reaches an idle engine at once. Their queue-time histograms
(``vllm:request_queue_time_seconds``, ``sglang:queue_time_seconds``) run from then to the first
scheduling: the run's ``loop_queue_ms`` (``first_scheduled_ms - taken_ms``), where ``queue_ms``
runs from the arrival.

Both engines keep an instance's requests not taken yet in an :class:`Untaken` and stamp them at
every plan, with the time the plan is made. The fast engine's runs of decode iterations end at
every arrival routed to their instance (:meth:`~schedlab.engine.instance.Instance.catch_up`, and
the data-parallel and pipelined drivers alike), so the step boundary that takes a request is
always a plan it makes. A request's decode-side sequence in a disaggregated cluster keeps the
prefill instance's taking (:data:`schedlab.engine.transfer.CARRIED_OVER`): that is where it was
queued. A request turned away or given up on before a plan took it keeps ``-1``.
"""

from __future__ import annotations


class Untaken:
    """The sequences that reached an instance and that no plan has taken yet (one per instance:
    no state is shared between instances or runs)."""

    __slots__ = ("seqs",)

    def __init__(self) -> None:
        self.seqs: list = []

    def add(self, seq) -> None:
        """``seq`` reached the instance (queued, or deferred to a later plan)."""
        self.seqs.append(seq)

    def take(self, t: float) -> None:
        """A plan is made at ``t``: it takes every sequence that arrived by then (those arriving
        later -- a plan made ahead, at the start of the batch in progress -- wait for the next)."""
        seqs = self.seqs
        if not seqs:
            return
        left = []
        for seq in seqs:
            if seq.request.arrival_ms <= t:
                seq.taken_ms = t
            else:
                left.append(seq)
        self.seqs = left
