"""The fast engine's client side: requests reach the engine through the API server, and a closed
loop hears of a request when its client does (rules in :mod:`schedlab.frontend`).

:class:`ClientArrivals` takes the place of the driver's ``ArrivalQueue`` when a run has a
``[frontend]`` or ``[client]`` table. The workload's ``arrival_ms`` is then when the client
sends a request; what the queue hands out is the request as the engine sees it, arriving when
the API server has handled it (``sent_ms`` and ``timeout_ms`` filled in).

The API server takes requests first received, first handled, on ``workers`` handlers, so a
request's engine arrival depends on every request received before it. In an open loop every
request is known in advance, so each is handled as soon as it is pulled from the workload, in
send order (:class:`ApiServer` is the closed form of that queue). A closed loop sends a
request when an earlier one finishes, which the engine has not simulated yet; a request can
then be handled only once the driver has reached its reception time -- by then every request
that could be received before it has been sent -- so receptions are events of their own
(with ``workers = 0`` nothing waits, and requests are handled when released). The clients'
deadlines are events too in a closed loop: a client that gives up sends its next request then.
A request whose client's disconnect reaches the API server before a handler takes it is
cancelled there (vLLM's ``with_cancellation``): it holds no handler, and reaches the engine at
the disconnect, already abandoned (aborted at once, :meth:`Instance.arrive`).
"""

from __future__ import annotations

import heapq
import math
from typing import Iterable

import attrs

from ..configs import MAX_TIME_MS
from ..errors import ConfigError
from ..frontend import ClientSide, give_up_ms
from ..model import FollowUps

INF = math.inf


class ApiServer:
    """The front end's handlers in closed form: each request, taken in the order received,
    starts on the handler that is free first (or at once with ``workers = 0``)."""

    __slots__ = ("config", "_free")

    def __init__(self, config):
        self.config = config
        self._free = [0.0] * config.workers if config.workers else None  # heap: when each handler frees

    def received_ms(self, sent_ms: float) -> float:
        return sent_ms + self.config.network_ms

    def arrival_ms(self, received_ms: float, prompt_tokens: int, disconnect_ms: float = INF) -> float:
        """When the engine receives a request received at ``received_ms`` (call in reception order)
        -- or, if its client's disconnect (at ``disconnect_ms``) comes while it still waits for a
        handler, then: cancelled, it takes no handler (:func:`schedlab.frontend.disconnect_ms`)."""
        handling = self.config.handling_ms(prompt_tokens)
        free = self._free
        start = received_ms if free is None or received_ms > free[0] else free[0]
        if disconnect_ms <= start:
            return disconnect_ms
        if not start + handling <= MAX_TIME_MS:  # (named here: the request's arrival_ms check names no table)
            raise ConfigError(f"[frontend]: a request of {prompt_tokens:,} prompt tokens is handled for {handling:g} ms "
                              f"(request_ms + tokenize_ms_per_token x its prompt), which takes it past the clock's "
                              f"end ({MAX_TIME_MS:g} ms, about 31.7 years): are these milliseconds?")
        if free is not None:
            heapq.heapreplace(free, start + handling)
        return start + handling


class ClientArrivals:
    """Engine arrivals of requests sent by a workload's clients (see the module docstring).

    The driver calls :meth:`next_time`, then -- once every instance has caught up with that
    time -- :meth:`pop` until the next time is later; ``pop`` returns the next request as the
    engine sees it, or None after an event of the client side (a reception, a deadline).
    """

    def __init__(self, stream: Iterable, side: ClientSide, *, workload=None):
        closed = workload is not None and getattr(workload, "closed_loop", False)
        self._follow_ups = FollowUps(workload) if closed else None  # on_finish, its answers checked
        self._stream = iter(stream if self._follow_ups is None else self._follow_ups.stream(stream))
        self._head = next(self._stream, None)
        self._side = side
        self._api = ApiServer(side.frontend) if side.frontend is not None else None
        self._delay = side.output_delay_ms
        self._closed = closed
        # Requests may be handled as soon as they are sent, unless a closed loop could still send
        # one that the API server would take first (a FIFO queue, workers > 0).
        self._eager = not closed or self._api is None or not side.frontend.workers
        self._sent: list = []        # (received, id, request): sent, waiting to be handled
        self._handled: list = []     # (engine arrival, received, id, request)
        self._deadlines: list = []   # (give-up time, id, request): closed loops only
        self._open: dict = {}        # closed loops: id -> request its client still waits for

    # -- the driver's side ---------------------------------------------------------------------
    def next_time(self) -> float:
        if self._eager:
            self._fill()
        t = self._handled[0][0] if self._handled else INF
        if not self._eager:
            received = self._next_received()
            if received < t:
                t = received
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] not in self._open:  # finished in time: no event
            heapq.heappop(deadlines)
        if deadlines and deadlines[0][0] < t:
            t = deadlines[0][0]
        return t

    def pop(self, t: float):
        """The next request the engine receives (at most ``t``, the driver's time), or None
        after handling a client-side event due by ``t``."""
        if self._deadlines and self._deadlines[0][0] <= t:
            give_up, _, request = heapq.heappop(self._deadlines)
            if self._open.pop(request.id, None) is not None:  # its client stops waiting
                self._notify(request, give_up)
            return None
        if not self._eager and self._next_received() <= t:
            self._handle(self._take_sent())
            return None
        return heapq.heappop(self._handled)[3]

    def release(self, request) -> None:
        """A follow-up request from a closed loop, sent at its ``arrival_ms``."""
        received = self._api.received_ms(request.arrival_ms) if self._api is not None else request.arrival_ms
        if self._eager:
            self._handle((received, request.id, request))
        else:
            heapq.heappush(self._sent, (received, request.id, request))

    def finished(self, request, t: float) -> bool:
        """The engine finished (or rejected) ``request`` at ``t``: tell the closed loop when its
        client has the last byte -- unless the client gives up first (a deadline event then)."""
        if self._open.get(request.id) is None:
            return False
        done = t + self._delay
        if done > give_up_ms(request):
            return False
        del self._open[request.id]
        return self._notify(request, done)

    # -- inside ---------------------------------------------------------------------------------
    def _notify(self, request, client_t: float) -> bool:
        released = False
        for follow_up in self._follow_ups(request, client_t):
            self.release(follow_up)
            released = True
        return released

    def _next_received(self) -> float:
        t = self._sent[0][0] if self._sent else INF
        head = self._head
        if head is not None:
            received = self._api.received_ms(head.arrival_ms) if self._api is not None else head.arrival_ms
            if received < t:
                return received
        return t

    def _take_sent(self) -> tuple:
        head = self._head
        if head is not None:
            received = self._api.received_ms(head.arrival_ms) if self._api is not None else head.arrival_ms
            if not self._sent or (received, head.id) <= self._sent[0][:2]:
                self._head = next(self._stream, None)
                return received, head.id, head
        return heapq.heappop(self._sent)

    def _fill(self) -> None:
        """Handle the workload's requests in send order while one could still come first."""
        while self._head is not None and (not self._handled or self._next_received() <= self._handled[0][0]):
            self._handle(self._take_sent())

    def _handle(self, item: tuple) -> None:
        received, rid, request = item
        side = self._side
        sent = request.arrival_ms
        timeout = side.timeout_for(request)
        if self._api is not None:
            disconnect = INF if timeout is None else sent + timeout + self._api.config.network_ms
            arrival = self._api.arrival_ms(received, request.prompt_tokens, disconnect)
        else:
            arrival = sent
        request = attrs.evolve(request, arrival_ms=arrival, sent_ms=sent if self._api is not None else None,
                               timeout_ms=timeout)
        heapq.heappush(self._handled, (arrival, received, rid, request))
        if self._closed:
            self._open[rid] = request
            give_up = give_up_ms(request)
            if give_up < INF:
                heapq.heappush(self._deadlines, (give_up, rid, request))
