"""The run loop: hands arrivals to instances in time order and lets them advance in between.

Open-loop workloads give every request up front (lazily, in arrival order). Closed-loop
workloads release a client's next request when its previous one finishes, so instances stop
after iterations in which requests finished and the driver asks the workload what follows.
With several instances a router picks one per arrival, seeing each instance as it is at the
arrival time (every iteration that started before it has been scheduled). In closed-loop
runs with several instances an instance may already have run a bulk decode run past the
time a new request is released; the router then sees that instance's state up to one
decode run early -- a documented approximation that keeps runs deterministic.
"""

from __future__ import annotations

import heapq
import math
from typing import Iterable, Sequence

from ..errors import StallError
from .instance import Instance

INF = math.inf


class ArrivalQueue:
    """The workload's ordered stream merged with requests released later (closed loop)."""

    def __init__(self, stream: Iterable):
        self._stream = iter(stream)
        self._head = next(self._stream, None)
        self._released: list = []

    def next_time(self) -> float:
        t = self._head.arrival_ms if self._head is not None else INF
        if self._released and self._released[0][0] < t:
            return self._released[0][0]
        return t

    def pop(self):
        head = self._head
        if self._released and (head is None or self._released[0][0] < head.arrival_ms):
            return heapq.heappop(self._released)[2]
        self._head = next(self._stream, None)
        return head

    def release(self, request) -> None:
        heapq.heappush(self._released, (request.arrival_ms, request.id, request))


def simulate(requests: Iterable, instances: Sequence[Instance], *, router=None, workload=None) -> None:
    """Run until every request has finished or been rejected.

    :param requests: requests in arrival order (a workload's ``requests(seed)``).
    :param instances: the instances to serve them; with more than one, ``router`` is required.
    :param workload: the workload, when it is closed-loop (its ``on_finish`` releases requests).
    :raises StallError: work is left that no instance can make progress on.
    """
    if len(instances) > 1 and router is None:
        raise ValueError("several instances need a router")
    closed = workload is not None and getattr(workload, "closed_loop", False)
    for inst in instances:
        inst.track_finished = closed
    arrivals = ArrivalQueue(requests)
    seq_no = 0
    while True:
        t = arrivals.next_time()
        released = False
        blocked = None
        for inst in sorted(instances, key=lambda i: i.now) if len(instances) > 1 else instances:
            status = inst.advance(t, stop_on_finish=closed)
            if closed:
                for request, finished_at in inst.take_finished():
                    for follow_up in workload.on_finish(request, finished_at):
                        arrivals.release(follow_up)
                        released = True
            if status == "finished":
                released = True
            elif status == "blocked":
                blocked = inst
        if released:
            continue  # a finish may have released an earlier arrival; look again
        if t == INF:
            if blocked is not None:
                raise StallError(blocked._stall_message("no arrivals are left and the scheduler plans nothing"))
            return
        while arrivals.next_time() <= t:
            request = arrivals.pop()
            target = instances[router.route(request, instances)] if router is not None else instances[0]
            target.arrive(request, seq_no)
            seq_no += 1
            if closed:
                for done, finished_at in target.take_finished():  # rejected at once
                    for follow_up in workload.on_finish(done, finished_at):
                        arrivals.release(follow_up)
