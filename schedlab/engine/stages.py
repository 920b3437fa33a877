"""Pipeline parallelism's two rules that both engines share: the stages' clock, and what a
scheduler sees while batches are in flight.

vLLM V1 with ``--pipeline-parallel-size P`` keeps up to ``P`` batches in flight
(``EngineCore.step_with_batch_queue``, ``batch_queue_size = max_concurrent_batches = P``): it
schedules a batch and launches it without waiting while the queue has room and the scheduler
has something to schedule, then blocks until the oldest batch's output is back, updates the
scheduler with it and schedules again. A request whose token is still being computed has
nothing new to schedule (``num_new_tokens == 0``), so it sits out the batches launched
meanwhile; it still holds its place among the running requests (``max_num_seqs``).

A batch goes through the stages in order; a stage works on one batch at a time, in launch
order, and hands its activations to the next stage (:class:`StageClock`).
"""

from __future__ import annotations

import math
from typing import Iterator

IN_FLIGHT = "in_flight"  # engine-internal: a sequence whose batch is in the pipeline


class StageClock:
    """When each stage of the pipeline is next free."""

    __slots__ = ("free",)

    def __init__(self, stages: int):
        self.free = [-math.inf] * stages

    def launch(self, t: float, stage_ms, send_ms: float) -> float:
        """A batch launched at ``t`` taking ``stage_ms[k]`` on stage ``k`` and ``send_ms`` from one
        stage to the next: each stage starts it once it has arrived and the stage's previous
        batch is done. Returns when its last stage finishes."""
        free = self.free
        ready = t
        for k, ms in enumerate(stage_ms):
            start = ready if ready > free[k] else free[k]
            free[k] = ready = start + ms
            if k + 1 < len(free):
                ready += send_ms
        return ready


class VisibleRunning:
    """The running sequences a scheduler may touch while batches are in flight: those not in
    the pipeline, in admission order. Its length counts every running sequence (an in-flight
    request keeps its slot)."""

    __slots__ = ("_running",)

    def __init__(self, running: dict):
        self._running = running

    def __iter__(self) -> Iterator:
        return (s for s in self._running if s.status != IN_FLIGHT)

    def __reversed__(self) -> Iterator:
        return (s for s in reversed(self._running) if s.status != IN_FLIGHT)

    def __len__(self) -> int:
        return len(self._running)

    def __bool__(self) -> bool:
        return bool(self._running)

    def __contains__(self, seq: object) -> bool:
        return seq in self._running and seq.status != IN_FLIGHT

    def last(self):
        return next(reversed(self), None)
