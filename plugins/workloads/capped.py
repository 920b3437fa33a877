"""A concurrency cap on any workload: each request is due at its time and is sent when one of
``max_concurrency`` slots is free, first due first served.

This is how ``vllm bench serve --max-concurrency N`` runs (``vllm/benchmarks/serve.py``): it
creates every request's task when its arrival comes due and wraps the request in an
``asyncio.Semaphore(N)``, whose waiters are woken in order; the wait is the request's
``client_queue_time`` (schedlab's ``client.queue_ms``). With ``--request-rate inf`` every request is
due at once, and the cap is a closed loop of N clients. inference-perf caps the same way with ``num_workers x
worker_max_concurrency`` requests in flight. A slot frees when the client has the last byte
of a request (or the request failed), so the capped workload is closed-loop: it hears of every
finish, as the client side reports it (:mod:`schedlab.engine.client`), and passes it on to the
workload it caps when that one is closed-loop too (stages that each start after the previous
one drains, :mod:`.stages`).

Requests keep the ids and order of the capped workload (due order), which is the order they
are sent in; a request that waited for a slot is sent, and arrives, when the slot frees, and keeps
when it was due (``Request.due_ms``): its wait is the run's ``client.queue_ms``, and the run's
stability is judged from when requests were due (a backlog at the client is a backlog).
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

import attrs
import numpy as np

from schedlab.errors import WorkloadError

from .columns import OpenLoopWorkload, RequestColumns


class CappedWorkload:
    """``inner``'s requests, at most ``cap`` in flight (see the module docstring)."""

    closed_loop = True

    def __init__(self, inner, cap: int):
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise WorkloadError(f"max_concurrency must be a whole number >= 1, got {cap!r}")
        self.inner = inner
        self.cap = cap
        self.name = inner.name
        self.num_requests = inner.num_requests
        self.info = inner.info
        self._run = None

    def requests(self, seed: int) -> Iterator:
        """Start a run: the first ``cap`` requests are sent when they are due."""
        self._run = _CappedRun(iter(self.inner.requests(seed)), self.cap)
        return iter(self._run.send(None))

    def on_finish(self, request, now_ms: float) -> list:
        """A slot is free at ``now_ms``: the next request is sent then, or when it is due."""
        run = self._run
        if run is None:
            raise WorkloadError(f"{self.name}: on_finish called before requests(seed) started a run")
        run.free += 1
        if getattr(self.inner, "closed_loop", False):
            run.sources.append(iter(self.inner.on_finish(request, now_ms)))
        return run.send(now_ms)

    def __repr__(self) -> str:
        return f"<{self.name} workload: {self.num_requests} requests, at most {self.cap} at once>"


class _CappedRun:
    """One run: the requests not yet sent (lazily, in due order) and the free slots."""

    def __init__(self, first: Iterator, cap: int):
        self.sources = deque([first])
        self.free = cap

    def _next(self):
        while self.sources:
            request = next(self.sources[0], None)
            if request is not None:
                return request
            self.sources.popleft()
        return None

    def send(self, now_ms: float | None) -> list:
        out = []
        while self.free > 0:
            request = self._next()
            if request is None:
                break
            self.free -= 1
            if now_ms is not None and request.arrival_ms < now_ms:
                delay = now_ms - request.arrival_ms
                sent = None if request.sent_ms is None else request.sent_ms + delay
                request = attrs.evolve(request, arrival_ms=now_ms, sent_ms=sent, due_ms=request.due_at)
            out.append(request)
        return out


def CappedRequests(due_ms: np.ndarray, columns: RequestColumns, cap: int, *, name: str) -> CappedWorkload:
    """Requests due at ``due_ms`` (ms) with their ``columns``, at most ``cap`` in flight; numbered
    in the order they are due (ties: row order)."""
    timed = OpenLoopWorkload(lambda seed: (due_ms, columns), name=name, num_requests=len(columns))
    return CappedWorkload(timed, cap)
