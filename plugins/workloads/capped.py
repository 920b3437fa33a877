"""Timed requests under a concurrency cap: each request is due at its time and is sent when one
of ``max_concurrency`` slots is free, first due first served.

This is how ``vllm bench serve --max-concurrency N`` runs (``vllm/benchmarks/serve.py``): it
creates every request's task when its arrival comes due and wraps the request in an
``asyncio.Semaphore(N)``, whose waiters are woken in order; the wait is the request's
``client_queue_time``. With ``--request-rate inf`` every request is due at once, and the cap is
a closed loop of N clients. A slot frees when the client has the last byte of a request (or
the request failed), so the workload is closed-loop: it hears of every finish, as the client
side reports it (:mod:`schedlab.engine.client`).

Requests are numbered in the order they are due (ties: their order in the file), which is the
order they are sent in.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from schedlab.errors import WorkloadError

from .columns import RequestColumns, check_seed, iter_requests


class CappedRequests:
    """Requests due at ``due_ms`` (ms), at most ``cap`` in flight (see the module docstring)."""

    closed_loop = True

    def __init__(self, due_ms: np.ndarray, columns: RequestColumns, cap: int, *, name: str):
        order = np.argsort(due_ms, kind="stable")
        self._due = np.asarray(due_ms, dtype=float)[order].tolist()
        self._columns = columns.select(order)
        self.cap = cap
        self.name = name
        self.num_requests = len(self._due)
        self.info: dict = {}
        self._next = None

    def requests(self, seed: int) -> Iterator:
        """Start a run: the first ``cap`` requests are sent when they are due."""
        check_seed(seed)
        first = min(self.cap, self.num_requests)
        self._next = first
        return iter_requests(np.array(self._due[:first]), self._columns.select(np.arange(first)))

    def on_finish(self, request, now_ms: float) -> list:
        """A slot is free at ``now_ms``: the next request is sent then, or when it is due."""
        if self._next is None:
            raise WorkloadError(f"{self.name}: on_finish called before requests(seed) started a run")
        k = self._next
        if k >= self.num_requests:
            return []
        self._next = k + 1
        sent = max(now_ms, self._due[k])
        return list(iter_requests(np.array([sent]), self._columns.select(np.array([k])), first_id=k))

    def __repr__(self) -> str:
        return f"<{self.name} workload: {self.num_requests} requests, at most {self.cap} at once>"
