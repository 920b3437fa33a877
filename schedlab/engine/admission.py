"""A server's cap on requests in flight: TGI's ``max_concurrent_requests`` (128 by default), a
semaphore its router takes before validating a request and gives back when the response ends;
a request that finds none free is answered at once "Model is overloaded" (HTTP 429).

Both engines keep one per instance when the scheduler declares ``max_in_flight``: ``accept``
at arrival, ``end`` when the request leaves (finished or aborted; the recorder calls it), and
``refusal(t)`` counts the requests accepted and not ended by ``t`` -- one finishing in an
iteration still in progress at ``t`` is in flight, whatever an engine has applied already.
"""

from __future__ import annotations

import heapq


class ConcurrencyLimit:
    """Requests in flight on one instance against a cap."""

    __slots__ = ("limit", "accepted", "ended", "_ends")

    def __init__(self, limit: int):
        self.limit = limit
        self.accepted = 0
        self.ended = 0
        self._ends: list[float] = []  # end times not yet passed by an arrival

    def refusal(self, t: float) -> str | None:
        """Why a request arriving at ``t`` is refused, or None."""
        ends = self._ends
        while ends and ends[0] <= t:
            heapq.heappop(ends)
            self.ended += 1
        if self.accepted - self.ended >= self.limit:
            return f"Model is overloaded: {self.limit} requests in flight (max_concurrent_requests)"
        return None

    def accept(self) -> None:
        self.accepted += 1

    def end(self, t: float) -> None:
        heapq.heappush(self._ends, t)
