"""The run loop: hands arrivals to instances in time order and lets them advance in between.

Open-loop workloads give every request up front (lazily, in arrival order). Instances then act
event by event (:meth:`Instance.step`): a heap orders them by their next event, and an arrival
brings forward only the instances whose next event comes before it -- never the whole cluster
-- each as far as the arrival (instances do not meet between arrivals). A run of identical
decode iterations is kept pending rather than applied: it is applied whole when it ends, or cut
by the arrival of a request routed to its instance (the arrival joins at the end of the
iteration in progress). The router places each arrival
seeing every instance as it is at that time -- an iteration still in progress holds its
requests and their KV, a pending run the KV of its iteration in progress
(:mod:`schedlab.engine.load`) -- through a pool that keeps the instances ordered by load
(:mod:`schedlab.engine.pool`). So an arrival costs O(log N) over N instances, and the work
between arrivals is the events that happen, as on one instance. A request whose client gives
up (:mod:`schedlab.frontend`) is aborted at its instance's first plan at or after the abort's
time -- the instance's runs end there, as at an arrival -- and an instance between iterations at
an arrival's time aborts what is due before the router looks.

Closed-loop workloads release a client's next request when its previous one finishes, on any
instance. They run through the same event heap, one event at a time in time order, and each
event's finishes are released before the next event: a finish comes at the end of the
iteration that made it -- no earlier than the event that planned that iteration or ended its
run -- so a released request arrives after every event already done, and nothing is ever
run past a request that could have joined it. A pending run is cut only by a request routed
to its own instance, as in an open loop: O(log N) per event over N instances. Pipelined
instances in a closed loop, and disaggregated clusters (:func:`simulate_disaggregated`),
advance in lockstep instead, O(N) per step.
"""

from __future__ import annotations

import heapq
import math
from typing import Iterable, Sequence

from ..errors import StallError
from ..model import FollowUps
from .client import ClientArrivals
from .instance import Instance
from .load import RoutingClock, route_index, views_of
from .run_limit import limits_running
from .stall import check_kv_released

INF = math.inf


class ArrivalQueue:
    """The workload's ordered stream merged with requests released later (closed loop)."""

    def __init__(self, stream: Iterable, workload=None):
        closed = workload is not None and getattr(workload, "closed_loop", False)
        self._follow_ups = FollowUps(workload) if closed else None  # on_finish, its answers checked
        self._stream = iter(stream if self._follow_ups is None else self._follow_ups.stream(stream))
        self._head = next(self._stream, None)
        self._released: list = []

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
        for follow_up in self._follow_ups(request, t):
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
             client_side=None, scaling=None) -> None:
    """Run until every request has finished, been rejected or been aborted.

    :param requests: requests in arrival order (a workload's ``requests(seed)``).
    :param instances: the instances to serve them; with more than one, ``router`` is required.
    :param workload: the workload, when it is closed-loop (its ``on_finish`` releases requests).
    :param client_side: a :class:`~schedlab.frontend.ClientSide` (front end, timeouts), or None:
        requests then reach the engine when the workload says and clients never give up.
    :param scaling: a :class:`~schedlab.engine.scaling.ScalingController` (open loop only): the
        router then sees the serving instances only.
    :raises StallError: work is left that no instance can make progress on.
    """
    if len(instances) > 1 and router is None:
        raise ValueError("several instances need a router")
    closed = workload is not None and getattr(workload, "closed_loop", False)
    for inst in instances:
        inst.track_finished = closed
        # releases must come in the order the reference engine makes them (iterations in the
        # order they start) where anything else releases too: another instance, a client giving up
        inst.plan_finishes_alone = closed and (len(instances) > 1 or client_side is not None)
        if client_side is not None:
            inst.hangup_ms = client_side.network_ms
    arrivals = arrival_queue(requests, workload, client_side)
    # clients may give up: the run's [client] says so, or (found on the way) a request's own timeout_ms
    aborting = (client_side is not None and client_side.client is not None and client_side.client.gives_up
                or limits_running(instances))
    if closed and scaling is not None:
        raise ValueError("autoscaling needs an open-loop workload")
    if closed and not all(isinstance(inst, Instance) for inst in instances):
        _simulate_lockstep(arrivals, instances, router, workload, aborting)  # pipelined instances
    else:
        _simulate_events(arrivals, instances, router, scaling, aborting, closed)
    check_kv_released(instances)


def _simulate_lockstep(arrivals, instances: Sequence, router, workload, aborting: bool) -> None:
    """A closed loop over instances without the event interface (pipelined ones): the busy
    instance furthest behind runs the iterations that start no later than every other busy
    instance's clock -- a request another instance releases can only arrive after that clock.
    Exact, at O(N) per step and runs cut at each other's iterations."""
    clock = RoutingClock()
    views = views_of(instances, clock)
    delivered = 0
    while True:
        t = arrivals.next_time()
        if _advance_lockstep(instances, t, arrivals, workload):
            continue  # something ran or finished; the next arrival may have moved earlier
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
            if request.timeout_ms is not None:
                aborting = True
            _release(target, arrivals)  # a request rejected at once releases its successor


class EventHeap:
    """The instances' next events (:meth:`Instance.next_event`) in time order, ties to runs
    ending before plans, then to the lowest position; entries an instance has moved past are
    dropped as they surface."""

    def __init__(self, instances: Sequence[Instance]):
        self.instances = instances
        self.heap: list = []
        self.announced: list = [None] * len(instances)
        self.time = 0.0  # when the event :meth:`due` last gave happens

    def update(self, pos: int, event: tuple[float, int] | None = None) -> None:
        """Instance ``pos`` may have a new next event (``event``, if the caller knows it)."""
        if event is None:
            event = self.instances[pos].next_event()
        if event != self.announced[pos]:
            self.announced[pos] = event
            if event[0] < INF:
                heapq.heappush(self.heap, (event[0], event[1], pos))

    def next_time(self) -> float:
        """When the next instance event happens (INF: no instance has anything to come)."""
        heap, announced = self.heap, self.announced
        while heap:
            when, kind, pos = heap[0]
            if announced[pos] == (when, kind):
                return when
            heapq.heappop(heap)
        return INF

    def due(self, t: float) -> int | None:
        """The position of an instance whose event comes before an arrival at ``t`` (a run that
        ends at ``t`` too: the arrival sees it ended), or None."""
        heap = self.heap
        while heap:
            when, kind, pos = heap[0]
            if when > t or (when == t and kind == 1):
                return None
            heapq.heappop(heap)
            if self.announced[pos] == (when, kind):
                self.announced[pos] = None
                self.time = when
                return pos
        return None

    def planning_at(self, t: float) -> list[int]:
        """The positions of the instances that plan at ``t`` (after :meth:`due` has run out for
        an arrival at ``t``, their events are the heap's top); they are taken off the heap, to
        be put back by :meth:`update`."""
        heap, found = self.heap, []
        while heap and heap[0][0] == t:
            when, kind, pos = heapq.heappop(heap)
            if self.announced[pos] == (when, kind):
                self.announced[pos] = None
                found.append(pos)
        return found


def _simulate_events(arrivals, instances: Sequence[Instance], router, scaling=None, aborting: bool = False,
                     closed: bool = False) -> None:
    """The colocated driver: instances act event by event, an arrival brings forward only those
    whose events come before it (see the module docstring). With ``scaling``, the autoscaler's
    events (ticks, instances turning warm) come before arrivals at the same time, and go on
    while requests are to arrive or an instance has an event to come: a controller cannot know
    that no request will come (they stopped with the last arrival: review s80 routers, finding
    1), and a run whose work is done, or stuck, has nothing left to decide.
    With clients that give up (``aborting``, or once a request with its own
    ``timeout_ms`` arrives), an instance's aborts end its runs (see :meth:`Instance.step`); one
    between iterations at an arrival's time aborts what is due before the router looks
    (:meth:`Instance.settle`). A ``closed`` loop's events are done one at a time, each one's
    finishes released at once: a released request may arrive before the arrival in view."""
    clock = scaling.clock if scaling is not None else RoutingClock()
    pool = views_of(instances, clock, tracked=True) if scaling is None else None
    changed = pool.changed if scaling is None else scaling.changed
    events = EventHeap(instances)
    delivered = 0
    while True:
        t_arrival = arrivals.next_time()
        t_scaling = INF
        if scaling is not None:
            t_scaling = scaling.next_time()
            if t_arrival == INF and not _stirring(events, instances, t_scaling):
                t_scaling = INF
        t = t_arrival if t_arrival < t_scaling else t_scaling
        clock.now = t
        pos = events.due(t)
        while pos is not None:
            if closed:
                # A request this event releases arrives no earlier than the event: the views
                # are told of the change as at the event's time, never later than a routing.
                clock.now = events.time
                inst = instances[pos]
                inst.step()
                events.update(pos)
                changed(pos)
                if _release(inst, arrivals) and arrivals.next_time() < t:
                    t = t_arrival = arrivals.next_time()
            else:
                events.update(pos, instances[pos].act_until(t))
                changed(pos)
            pos = events.due(t)
        clock.now = t
        if t == INF:
            break
        if t_scaling <= t_arrival:
            if t_arrival == INF and not _stirring(events, instances, t):
                continue  # the last work ended before this tick: the run is over (or stuck)
            scaling.apply(t)
            for pos in scaling.take_touched():  # a drain timeout set or cancelled: its next event may move
                events.update(pos)
            continue
        if aborting:
            for pos in events.planning_at(t):
                instances[pos].settle(t)
                events.update(pos)
                changed(pos)
        while arrivals.next_time() <= t:
            request = arrivals.pop(t)
            if request is None:  # an event of the client side
                continue
            if scaling is not None:
                pos = scaling.target(route(router, request, scaling.pool))
                scaling.arrived(t)
            else:
                pos = route(router, request, pool) if router is not None else 0
            target = instances[pos]
            target.catch_up(t)
            target.arrive(request, delivered)
            delivered += 1
            if request.timeout_ms is not None:
                aborting = True
            if closed:
                _release(target, arrivals)  # a request rejected at once releases its successor
            events.update(pos)
            changed(pos)
    for inst in instances:
        if inst.has_work():
            raise StallError(inst._stall_message("no arrivals are left and the scheduler plans nothing"))


def _stirring(events: EventHeap, instances: Sequence[Instance], t: float) -> bool:
    """Some instance has an event to come, or an iteration that ends after ``t`` (applied when
    it started): the run is not over at ``t``."""
    return events.next_time() < INF or any(inst.now > t for inst in instances)


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

    Event by event, as the colocated driver runs (:func:`_simulate_events`): the instances wait
    in an :class:`EventHeap` by their next event, and an instance acts only while its event
    comes before the next arrival or hand-over -- the pools meet only there. A decode run is
    kept pending and cut when a finished prompt is routed to its instance (``catch_up``), so the
    other pool's iterations no longer cut it; routers read pending runs in closed form. Each
    step runs the instance's stage at the iteration boundary (:meth:`Instance.step`): a prefill
    instance hands finished prompts over (routed when the clock reaches them, with every
    instance as it is then), a decode instance pulls their KV, which frees the prefill side's
    blocks when it lands. A pull gives that prefill instance a new time to plan at
    (``cluster.touched``): it goes back on the heap. An instance that plans nothing sleeps until
    its wake-up time, its stage's next landing or release, or an arrival or hand-over for it.
    A closed loop's finishes are released after each step, and a run's last iteration is
    planned on its own so that they come in the order the reference engine makes them. The
    cluster's autoscalers (``cluster.scaling``, :mod:`schedlab.engine.pool_scaling`) act before
    hand-offs and arrivals at the same time.
    """
    instances = cluster.instances
    closed = workload is not None and getattr(workload, "closed_loop", False)
    for inst in instances:
        inst.track_finished = closed
        inst.plan_finishes_alone = closed
        if client_side is not None:
            inst.hangup_ms = client_side.network_ms
    position = {inst.index: pos for pos, inst in enumerate(instances)}
    arrivals = arrival_queue(requests, workload, client_side)
    # clients may give up: the run's [client] says so, or (found on the way) a request's own timeout_ms;
    # or a scheduler's running time limit aborts requests (engine.run_limit)
    aborting = (client_side is not None and client_side.client is not None and client_side.client.gives_up
                or limits_running(instances))
    events = EventHeap(instances)
    for pos in range(len(instances)):
        events.update(pos)
    scaling = cluster.scaling
    if closed and scaling is not None:
        raise ValueError("autoscaling needs an open-loop workload")

    def next_time() -> float:
        t = min(arrivals.next_time(), cluster.next_handoff())
        if scaling is not None:
            t_scaling = scaling.next_time(arrivals.next_time() < INF)
            if t_scaling < t:
                return t_scaling
        return t

    delivered = 0
    while True:
        t = next_time()
        pos = events.due(t)
        while pos is not None:
            inst = instances[pos]
            inst.step()
            events.update(pos)
            for index in cluster.touched:
                events.update(position[index])
            cluster.touched.clear()
            if closed:
                _release(inst, arrivals)
            t = next_time()
            pos = events.due(t)
        if scaling is not None and t < INF and scaling.next_time(arrivals.next_time() < INF) <= t:
            # (an instance whose last iteration ends after t, applied when it started, has that end to come)
            scaling.apply(t, arrivals.next_time() < INF, lambda: cluster.next_handoff() < INF or any(
                inst.next_event()[0] < INF or inst.now > t for inst in instances))
            continue
        if t == INF:
            for inst in instances:
                if inst.has_work():
                    raise StallError(inst._stall_message("no arrivals are left and the scheduler plans nothing"))
            check_kv_released(instances)
            return
        for target in cluster.deliver_handoffs(t):
            events.update(position[target.index])
        if aborting:  # aborts due by now go before anything more is routed (as in the colocated driver)
            for pos in events.planning_at(t):
                instances[pos].settle(t)
                events.update(pos)
            for index in cluster.touched:  # a dropped pull: its prefill instance frees the KV later
                events.update(position[index])
            cluster.touched.clear()
        while arrivals.next_time() <= t:
            request = arrivals.pop(t)
            if request is None:  # an event of the client side
                continue
            target = cluster.arrive(request, delivered)
            delivered += 1
            if request.timeout_ms is not None:
                aborting = True
            events.update(position[target.index])
            if closed:
                _release(target, arrivals)


def _advance_lockstep(instances: Sequence[Instance], t: float, arrivals: ArrivalQueue, workload) -> bool:
    """Advance the busy instance furthest behind (closed loop; ``workload`` None: nothing to
    release). False when every instance has caught up with the next arrival ``t``, which can
    then be delivered. A batch that lands at ``t`` lands first (as in the reference engine: the
    arrival, and aborts due then, find it landed), but what launches then waits for the arrival."""
    behind = [i for i in instances if i.has_work() and (i.now < t or (i.now == t and i.next_event() == (t, 0)))]
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
    # (a unit listed before it keeps its events at its own clock: at one time they go in list order, as
    # the reference engine orders iterations that start together -- an exact tie of two landings)
    bound = min([t] + [_releases_from(o) if o.index > inst.index else math.nextafter(_releases_from(o), -INF)
                       for o in instances if o is not inst and o.has_work()])
    if inst.now == t:  # its batch landing at t (the others are at t or later)
        bound = t
    elif bound <= inst.now:  # its next iteration starts no later than anyone's: always safe to run
        bound = math.nextafter(inst.now, INF)
    if inst.advance(bound, stop_on_finish=True) == "blocked":  # only with nothing else left to happen
        raise StallError(inst._stall_message("no arrivals are left and the scheduler plans nothing"))
    if workload is not None:
        _release(inst, arrivals)
    return True


def _releases_from(unit) -> float:
    """The earliest a busy unit may release a closed loop's next request: its clock -- or, when it
    planned nothing and waits (a batching window's wake-up, ``waits_until``) with no request
    since, that time. Without the wait, two units holding requests behind a window at one clock
    let each other on by one ulp a call, for ever."""
    waits = getattr(unit, "waits_until", None)
    return waits if waits is not None and waits > unit.now else unit.now


def route(router, request, instances: Sequence) -> int:
    """The router's choice among ``instances`` (:class:`~schedlab.engine.load.InstanceView` objects),
    checked: a bad index is the router's bug, not a silent wrap-around."""
    return route_index(router, request, router.route(request, instances), len(instances))
