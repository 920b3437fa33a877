"""The run loop: hands arrivals to instances in time order and lets them advance in between.

Open-loop workloads give every request up front (lazily, in arrival order); each instance
runs every iteration that starts before the next arrival, then the router places it, seeing
each instance as it is at that time -- an iteration still in progress holds its requests and
their KV (:mod:`schedlab.engine.load`).

Closed-loop workloads release a client's next request when its previous one finishes, on any
instance. So instances advance in lockstep: the instance that is furthest behind runs, and
only the iterations that start no later than every other busy instance's clock -- a request
another instance releases can only arrive after that clock, so nothing is ever run past a
request that could have joined it. One instance runs at full speed; several interleave their
decode runs at each other's event boundaries, which costs speed, not exactness.
"""

from __future__ import annotations

import heapq
import math
import operator
from typing import Iterable, Sequence

from ..errors import SimulationError, StallError
from .client import ClientArrivals
from .instance import Instance
from .load import RoutingClock, views_of

INF = math.inf


class ArrivalQueue:
    """The workload's ordered stream merged with requests released later (closed loop)."""

    def __init__(self, stream: Iterable, workload=None):
        self._stream = iter(stream)
        self._head = next(self._stream, None)
        self._released: list = []
        self._workload = workload

    def next_time(self) -> float:
        t = self._head.arrival_ms if self._head is not None else INF
        if self._released and self._released[0][0] < t:
            return self._released[0][0]
        return t

    def pop(self, t: float = INF):
        head = self._head
        if self._released and (head is None or self._released[0][0] < head.arrival_ms):
            return heapq.heappop(self._released)[2]
        self._head = next(self._stream, None)
        return head

    def release(self, request) -> None:
        heapq.heappush(self._released, (request.arrival_ms, request.id, request))

    def finished(self, request, t: float) -> bool:
        """The engine finished (or rejected) ``request`` at ``t``: queue what the closed loop releases."""
        released = False
        for follow_up in self._workload.on_finish(request, t):
            self.release(follow_up)
            released = True
        return released


def arrival_queue(requests: Iterable, workload, client_side) -> ArrivalQueue | ClientArrivals:
    """The arrivals as the engine sees them: the workload's own, or through a client side
    (:mod:`schedlab.engine.client`) when the run has one."""
    if client_side is None:
        return ArrivalQueue(requests, workload)
    return ClientArrivals(requests, client_side, workload=workload)


def simulate(requests: Iterable, instances: Sequence[Instance], *, router=None, workload=None,
             client_side=None) -> None:
    """Run until every request has finished, been rejected or been aborted.

    :param requests: requests in arrival order (a workload's ``requests(seed)``).
    :param instances: the instances to serve them; with more than one, ``router`` is required.
    :param workload: the workload, when it is closed-loop (its ``on_finish`` releases requests).
    :param client_side: a :class:`~schedlab.frontend.ClientSide` (front end, timeouts), or None:
        requests then reach the engine when the workload says and clients never give up.
    :raises StallError: work is left that no instance can make progress on.
    """
    if len(instances) > 1 and router is None:
        raise ValueError("several instances need a router")
    closed = workload is not None and getattr(workload, "closed_loop", False)
    for inst in instances:
        inst.track_finished = closed
        if client_side is not None:
            inst.hangup_ms = client_side.network_ms
    arrivals = arrival_queue(requests, workload, client_side)
    aborting = client_side is not None and client_side.client is not None and client_side.client.gives_up
    clock = RoutingClock()
    views = views_of(instances, clock)
    delivered = 0
    while True:
        t = arrivals.next_time()
        if closed:
            if _advance_lockstep(instances, t, arrivals, workload):
                continue  # something ran or finished; the next arrival may have moved earlier
        else:
            for inst in instances:
                status = inst.advance(t)
                if status == "blocked" and t == INF:
                    raise StallError(inst._stall_message("no arrivals are left and the scheduler plans nothing"))
        if t == INF:
            return
        clock.now = t
        if aborting:
            for inst in instances:
                inst.settle(t)
        while arrivals.next_time() <= t:
            request = arrivals.pop(t)
            if request is None:  # an event of the client side (a reception, a client giving up)
                continue
            target = instances[route(router, request, views)] if router is not None else instances[0]
            target.arrive(request, delivered)
            delivered += 1
            if closed:
                _release(target, arrivals)  # a request rejected at once releases its successor


def _release(inst: Instance, arrivals) -> bool:
    """Ask the workload what the instance's finished requests release."""
    released = False
    for request, finished_at in inst.take_finished():
        if arrivals.finished(request, finished_at):
            released = True
    return released


def simulate_disaggregated(requests: Iterable, cluster, *, workload=None, client_side=None) -> None:
    """Run a :class:`~schedlab.engine.disagg.DisaggregatedCluster` until every request has
    finished or been rejected.

    The pools wait on each other -- a finished prompt is routed to a decode instance when it
    is handed over, and a decode instance's pull frees blocks on a prefill instance when the
    transfer lands -- so the instances always advance in lockstep: the one that plans first
    runs (ties: lowest index), and only iterations that start no later than any other's next
    plan and the next arrival or hand-over. Nothing another instance does can reach it
    earlier: events happen at the end of iterations or, for released blocks, when a transfer
    lands, after the pull that starts it. An instance stops after an iteration that handed a
    request over or pulled one (which gives its prefill instance a new time to plan at), so
    the hand-over is routed, with every instance seen as it is at that time, before anyone
    runs past it. An instance that plans nothing sleeps (see ``Instance.next_plan_time``)
    instead of creeping forward with the others; an arrival or hand-over for it wakes it.
    """
    instances = cluster.instances
    closed = workload is not None and getattr(workload, "closed_loop", False)
    for inst in instances:
        inst.track_finished = closed
    arrivals = arrival_queue(requests, workload, client_side)
    delivered = 0
    while True:
        t = min(arrivals.next_time(), cluster.next_handoff())
        busy = [(inst.next_plan_time(), inst.index, inst) for inst in instances if inst.has_work()]
        first = min(busy) if busy else None
        if first is not None and first[0] < t:
            plan_at, _, inst = first
            bound = min([t] + [when for when, _, other in busy if other is not inst])
            inst.wake(plan_at)
            if bound <= plan_at:  # its next iteration starts no later than anyone's: always safe to run
                bound = math.nextafter(plan_at, INF)
            if inst.advance(bound, stop_on_finish=True) == "blocked":
                raise StallError(inst._stall_message("the scheduler plans nothing"))
            if closed:
                _release(inst, arrivals)
            continue
        if t == INF:
            if busy:
                raise StallError(busy[0][2]._stall_message("no arrivals are left and the scheduler plans nothing"))
            return
        cluster.deliver_handoffs(t)
        while arrivals.next_time() <= t:
            request = arrivals.pop(t)
            if request is None:  # an event of the client side
                continue
            target = cluster.arrive(request, delivered)
            delivered += 1
            if closed:
                _release(target, arrivals)


def _advance_lockstep(instances: Sequence[Instance], t: float, arrivals: ArrivalQueue, workload) -> bool:
    """Advance the busy instance furthest behind (closed loop; ``workload`` None: nothing to
    release). False when every instance has caught up with the next arrival ``t``, which can
    then be delivered."""
    behind = [i for i in instances if i.now < t and i.has_work()]
    if not behind:
        for inst in instances:  # idle ones jump to the arrival
            if inst.now < t:
                inst.advance(t)
        if t == INF:
            for inst in instances:
                if inst.has_work():
                    raise StallError(inst._stall_message("no arrivals are left and the scheduler plans nothing"))
        return False
    inst = min(behind, key=lambda i: (i.now, i.index))
    bound = min([t] + [o.now for o in instances if o is not inst and o.has_work()])
    if bound <= inst.now:  # its next iteration starts no later than anyone's: always safe to run
        bound = math.nextafter(inst.now, INF)
    if inst.advance(bound, stop_on_finish=True) == "blocked":  # only with nothing else left to happen
        raise StallError(inst._stall_message("no arrivals are left and the scheduler plans nothing"))
    if workload is not None:
        _release(inst, arrivals)
    return True


def route(router, request, instances: Sequence) -> int:
    """The router's choice among ``instances`` (:class:`~schedlab.engine.load.InstanceView` objects),
    checked: a bad index is the router's bug, not a silent wrap-around."""
    answer = router.route(request, instances)
    try:
        index = operator.index(answer)
    except TypeError:
        index = -1
    if not 0 <= index < len(instances):
        raise SimulationError(f"router {type(router).__name__} returned {answer!r} for request {request.id}; "
                              f"expected an instance index from 0 to {len(instances) - 1}")
    return index
