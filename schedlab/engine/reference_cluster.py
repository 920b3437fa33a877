"""The reference engine for several instances: every instance step by step, in plain time order.

One loop over time (a heap orders the instances' next plans, so a step costs O(log N); a
disaggregated cluster's pools change each other's plan times and are scanned). The next thing
to happen is either an *event* -- a request arriving (or
released by a closed loop), or, in a disaggregated cluster, a finished prompt handed to the
decode pool -- or an instance's next plan (at its clock, or when its sleep ends). Events
come first on a tie, and are routed seeing every instance as it is then; plans go in time
order, ties to the lowest instance index. An instance that planned nothing sleeps until its
wake-up time, its next abort or until an event of its own wakes it.

With a client side (:mod:`schedlab.frontend`) a request is first an event where the API server
receives it; it waits in a first-come queue for a free handler, and its arrival at the engine
is an event when its handling ends -- or, if its client's disconnect comes first (an event too),
at the disconnect, cancelled without a handler. In a closed loop, a client's deadline is an event too:
a client that gives up sends its next request then.

Disaggregation (rules and sources in :mod:`schedlab.engine.transfer`) is written out here
again, plainly, for the differential tests against the fast engine's
:mod:`schedlab.engine.disagg`: :class:`PrefillRole` and :class:`DecodeRole` are an
instance's part of the flow, run at its own plans.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import attrs

from ..errors import StallError
from ..frontend import give_up_ms
from ..model import FollowUps
from .ahead import refuse_planning_ahead
from .instance import default_rejection_reason
from .load import RoutingClock, route_index, views_of
from .plan import received_rejection_hook, refusal
from .reference import RefSequence, ReferenceEngine
from .run_limit import limits_running
from .stall import check_kv_released, stall_message
from .transfer import (FIRST_TOKEN, KV_LEASE_MS, KVLink, Transfer, abort_heard_ms, carry_over, first_step_done,
                       kv_bytes_per_token, pool_reason, prefill_request, pull_keywords, pulled_hit,
                       pull_reservation, pulled_counters, tokens_moved)

INF = math.inf


def _routed(router, request, pool: Sequence, views: Sequence, clock: RoutingClock, t: float) -> ReferenceEngine:
    """The instance of ``pool`` the router picks, seeing every instance as it is at ``t``."""
    if router is None:
        return pool[0]
    clock.now = t
    return pool[route_index(router, request, router.route(request, views), len(pool))]


class PlanOrder:
    """The busy instances by their next plan time (ties: lowest index), from a heap: an
    instance's plan time changes only when it steps or something is delivered to it, and the
    loop says so (:meth:`update`). Entries it has moved past are dropped as they surface."""

    def __init__(self, instances: Sequence[ReferenceEngine]):
        self.instances = list(instances)
        self.heap: list = []
        self.announced: dict = {}

    def update(self, inst: ReferenceEngine) -> None:
        self._announce(inst, inst.next_plan_time() if inst.has_work() else INF)

    def _announce(self, inst, t: float) -> None:
        if self.announced.get(inst.index) != t:
            self.announced[inst.index] = t
            if t < INF:
                heapq.heappush(self.heap, (t, inst.index, inst))

    def first(self) -> tuple[float, ReferenceEngine | None]:
        heap = self.heap
        while heap:
            t, index, inst = heap[0]
            if self.announced.get(index) == t:
                return t, inst
            heapq.heappop(heap)
        return INF, None


class PlanScan(PlanOrder):
    """The same order by a scan of every instance, for clusters whose instances change each
    other's plan times (disaggregated pools: a pull gives a prefill instance a time to free blocks at)."""

    def update(self, inst: ReferenceEngine) -> None:
        pass

    def first(self) -> tuple[float, ReferenceEngine | None]:
        busy = [(inst.next_plan_time(), inst.index, inst) for inst in self.instances if inst.has_work()]
        if not busy:
            return INF, None
        t, _, inst = min(busy, key=lambda x: (x[0], x[1]))
        return t, inst


class ReferenceCluster:
    """Instances behind a router (one instance: no router needed), and the client side: the API
    server requests pass before the engine sees them and the clients' deadlines
    (:mod:`schedlab.frontend`), written out as events."""

    def __init__(self, instances: Sequence[ReferenceEngine], router=None, client_side=None, scaling=None):
        if len(instances) > 1 and router is None:
            raise ValueError("several instances need a router")
        self.instances = list(instances)
        self.router = router
        self.client_side = client_side
        self.scaling = scaling  # a ScalingController (schedlab.engine.scaling): the router sees who serves
        self.clock = scaling.clock if scaling is not None else RoutingClock()
        self.views = views_of(self.instances, self.clock, tracked=True)
        self.plans = PlanOrder(self.instances)
        self._position = {inst.index: pos for pos, inst in enumerate(self.instances)}

    # -- what a cluster kind decides -----------------------------------------------------------
    def deliver(self, request, seq_no: int, t: float) -> None:
        scaling = self.scaling
        if scaling is not None:
            pool = [self.instances[i] for i in scaling.members]
            inst = _routed(self.router, request, pool, scaling.pool, self.clock, t)
            scaling.arrived(t)
        else:
            inst = _routed(self.router, request, self.instances, self.views, self.clock, t)
        inst.wake(t)
        self.arrive_at(inst, request, seq_no, t)
        self.changed(inst)

    def arrive_at(self, inst, request, seq_no: int, t: float) -> None:
        """``request``, routed to ``inst`` at ``t``, arrives there (a deployment's router then
        picks its rank: :class:`~schedlab.engine.reference_lockstep.ReferenceDeployments`)."""
        inst.arrive(request, seq_no)

    def changed(self, inst: ReferenceEngine) -> None:
        """``inst`` stepped or was delivered to: its plan time and load may have changed."""
        self.plans.update(inst)
        if self.scaling is not None:
            self.scaling.changed(self._position[inst.index])
        elif self.views.tracked:
            self.views.changed(self._position[inst.index])

    def deliver_other(self, t: float) -> None:
        """Events other than arrivals at time ``t``: the autoscaler's (while the cluster has
        something to come, as :meth:`next_other` says; a subclass's events may come later)."""
        if self.scaling is not None and self.scaling.next_time() <= t and self._ticking(t):
            self.scaling.apply(t)
            for i in self.scaling.take_touched():  # a drain timeout set or cancelled: its next plan may move
                self.plans.update(self.instances[i])

    def next_other(self) -> float:
        if self.scaling is None:
            return INF
        t = self.scaling.next_time()
        return t if self._ticking(t) else INF

    def _ticking(self, t: float) -> bool:
        """The autoscaler decides at ``t`` while requests are to arrive or the instances have
        something to come (as the fast driver's ``_simulate_events``): not after the run's end."""
        return self._arrivals_left or self._stirring(t)

    def _stirring(self, t: float) -> bool:
        """Some instance has an event to come (its next plan), or an iteration ending after ``t``."""
        return self.plans.first()[0] < INF or any(inst.now > t for inst in self.instances)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, requests, workload=None) -> None:
        """Serve the workload's ``requests``; the workload's ``arrival_ms`` is when a client
        sends a request, which reaches the engine then, or through the client side's front end."""
        closed = workload is not None and getattr(workload, "closed_loop", False)
        on_finish = FollowUps(workload) if closed else None  # the workload's on_finish, its answers checked
        side = self.client_side
        front = side.frontend if side is not None else None
        if side is not None:
            for inst in self.instances:
                inst.hangup_ms = side.network_ms
        # clients may give up: the run's [client] says so, or a request sent has its own timeout_ms
        aborting = [side is not None and side.client is not None and side.client.gives_up
                    or limits_running(self.instances)]
        events: list = []     # (time, kind, order, request); at one time: deadlines, receptions, arrivals
        api_queue: list = []  # requests the API server has received and not started, first received first
        handlers = [0]        # handlers at work
        untaken: set = set()  # requests cancelled in the API server's queue, on their way to the engine
        queued: set = set()   # ids in api_queue
        waiting_for: dict = {}  # closed loop with a client side: id -> request its client still waits for

        def send(request) -> None:
            """A client sends ``request`` at its ``arrival_ms``."""
            sent = request.arrival_ms
            if request.timeout_ms is not None:
                aborting[0] = True
            if side is None:
                heapq.heappush(events, (sent, ARRIVAL, (sent, request.id), request))
                return
            timeout = side.timeout_for(request)
            if closed:
                waiting_for[request.id] = request
                if timeout is not None:
                    heapq.heappush(events, (sent + timeout, DEADLINE, (request.id,), request))
            if front is None:
                prepared = attrs.evolve(request, timeout_ms=timeout)
                heapq.heappush(events, (sent, ARRIVAL, (sent, request.id), prepared))
            else:
                received = sent + front.network_ms
                heapq.heappush(events, (received, RECEIVED, (request.id,), request))
                if timeout is not None and front.workers:  # its disconnect, if it is still waiting then
                    heapq.heappush(events, (sent + timeout + front.network_ms, CANCEL, (request.id,), request))

        def start_handling(t: float) -> None:
            """Free handlers take the longest-waiting received requests."""
            while api_queue and (not front.workers or handlers[0] < front.workers):
                request, received = api_queue.pop(0)
                queued.discard(request.id)
                handlers[0] += 1
                arrival = t + front.handling_ms(request.prompt_tokens)
                prepared = attrs.evolve(request, arrival_ms=arrival, sent_ms=request.arrival_ms,
                                        timeout_ms=side.timeout_for(request))
                heapq.heappush(events, (arrival, ARRIVAL, (received, request.id), prepared))

        def done(request, t):
            if not closed:
                return
            if side is None:
                follow_ups = on_finish(request, t)
            else:  # the client has the last byte output_delay_ms later, unless it gave up before
                client_t = t + side.output_delay_ms
                if request.id not in waiting_for or client_t > give_up_ms(request):
                    return
                del waiting_for[request.id]
                follow_ups = on_finish(request, client_t)
            for follow_up in follow_ups:
                send(follow_up)

        for inst in self.instances:
            inst.on_request_done = done
            inst.closed_loop = closed
        for request in requests if on_finish is None else on_finish.stream(requests):
            send(request)
        seq_no = 0
        while True:
            while events and events[0][1] == CANCEL and events[0][3].id not in queued:
                heapq.heappop(events)  # (a handler took it: no event)
            self._arrivals_left = bool(events)
            t_event = min(events[0][0] if events else INF, self.next_other())
            t_plan, inst = self.plans.first()
            if t_event <= t_plan and t_event < INF:
                self.clock.now = t_event
                self.deliver_other(t_event)
                settled = not aborting[0]
                while events and events[0][0] <= t_event:
                    if not settled and events[0][1] == ARRIVAL:
                        # aborted requests are gone before anything is routed -- only then: a reception or a
                        # client's deadline routes nothing (settling at them let a decode instance's aborts
                        # free KV before a plan at the same instant: review s81 diffuzz, finding 3)
                        settled = True
                        for inst in self.instances:
                            if getattr(inst, "aborts", None):
                                inst.settle(t_event)
                                self.changed(inst)
                    t, kind, _, request = heapq.heappop(events)
                    if kind == DEADLINE:
                        if waiting_for.pop(request.id, None) is not None:  # the client gives up
                            for follow_up in on_finish(request, t):
                                send(follow_up)
                    elif kind == RECEIVED:
                        api_queue.append((request, t))
                        queued.add(request.id)
                        start_handling(t)
                    elif kind == CANCEL:  # its client's disconnect: cancelled if no handler took it yet
                        if request.id in queued:
                            queued.discard(request.id)
                            received = api_queue.pop(next(i for i, (r, _) in enumerate(api_queue)
                                                          if r.id == request.id))[1]
                            cancelled = attrs.evolve(request, arrival_ms=t, sent_ms=request.arrival_ms,
                                                     timeout_ms=side.timeout_for(request))
                            heapq.heappush(events, (t, ARRIVAL, (received, request.id), cancelled))
                            untaken.add(request.id)
                    elif request.id in untaken:  # reaches the engine abandoned, holding no handler
                        untaken.discard(request.id)
                        self.deliver(request, seq_no, t)
                        seq_no += 1
                    else:
                        if front is not None:  # its handler is free again
                            handlers[0] -= 1
                            start_handling(t)
                        self.deliver(request, seq_no, t)
                        seq_no += 1
                continue
            if t_plan == INF:
                stuck = next((inst for inst in self.instances if inst.has_work()), None)
                if stuck is not None:
                    raise StallError("reference engine: " + stall_message(
                        stuck, "no arrivals are left and the scheduler plans nothing"))
                check_kv_released(self.instances)
                return
            inst.wake(t_plan)
            inst.step()
            self.changed(inst)


# event kinds, in the order they go at one time (a disconnect before a handler taking the request then)
DEADLINE, CANCEL, RECEIVED, ARRIVAL = 0, 1, 2, 3


# -- disaggregated prefill and decode -------------------------------------------------------------


class PrefillRole:
    """Hands finished prompts to the decode pool; frees their blocks once they have landed."""

    outstanding = 0
    drops_output_in_step = False  # (an abort during a prompt's last step: at its hand-off, the fast PrefillStage's)

    def __init__(self, cluster: "DisaggregatedReference"):
        self.cluster = cluster
        self.releases: list = []  # (time, seq_no, transfer)
        self.held = 0             # prompts handed on (or abandoned) whose blocks are not freed yet

    def has_work(self) -> bool:
        return bool(self.releases)

    def next_time(self) -> float:
        return min((t for t, _, _ in self.releases), default=INF)

    def before_plan(self, inst: ReferenceEngine) -> None:
        on_finish = getattr(inst.scheduler, "on_finish", None)
        for item in sorted(self.releases, key=lambda x: (x[0], x[1])):
            if item[0] <= inst.now:
                self.releases.remove(item)
                inst.kv.free(item[2].prefill_seq)
                self.held -= 1
                if on_finish is not None:
                    on_finish(item[2].prefill_seq, item[0])

    def after_plan(self, inst: ReferenceEngine, plan) -> None:
        pass

    def hand_off(self, inst: ReferenceEngine, seq: RefSequence, t: float) -> bool:
        tr = seq.transfer
        on_prefill = self.cluster.first_token == "prefill"  # (else the decode instance samples the first token)
        gone = tr.request.timeout_ms is not None and abort_heard_ms(tr.request, inst.hangup_ms) < t
        heard = self.cluster.prefill_hears_disconnect  # (else the proxy drops it: the KV waits out its lease)
        if on_prefill and tr.request.target_tokens <= 1 and not (gone and heard):
            seq.request = tr.request  # finishes here, with the client's request in its row
            return False
        tr.ready_ms = t
        if not on_prefill:  # the proxy discards the prefill instance's token
            inst.counters["generated_tokens"] -= 1
            seq.num_generated = 0
            seq.token_times = []
        if gone:
            if heard and on_prefill:  # aborted during its last step, before the step's output: no token
                inst.counters["generated_tokens"] -= 1
                seq.num_generated = 0
                seq.token_times = []
            seq.request = tr.request  # its client left while the prompt ran: not passed on
            seq.status = "aborted"
            inst.rec.request_done(seq, inst.index, t, aborted=True)
            self.releases.append((t if heard else t + self.cluster.kv_lease_ms, tr.seq_no, tr))
            self.held += 1
            return True
        self.held += 1
        self.cluster.handoffs.append(tr)
        if self.cluster.pool_scaling is not None:
            self.cluster.pool_scaling.handed_off(tr, t)
        return True

    def abort(self, inst: ReferenceEngine, seq: RefSequence) -> bool:
        return False

    def first_token(self, inst: ReferenceEngine, seq: RefSequence) -> None:
        pass  # (its requests' first token is their prompt's: never a decode)

    def held_transfers(self, index: int) -> list:
        """The prompts instance ``index`` handed on whose KV no decode instance has pulled yet."""
        waiting = list(self.cluster.handoffs)
        for d in self.cluster.decode:
            waiting += d.role.waiting_for_kv
        return [tr for tr in waiting if tr.prefill_index == index]


class DecodeRole:
    """Pulls handed-over requests' KV when there is room; they join the running set once landed."""

    drops_output_in_step = True  # (an abort during a step drops its output, as on one instance)

    def __init__(self, cluster: "DisaggregatedReference", slots: int | None):
        self.cluster = cluster
        self.slots = slots
        self.waiting_for_kv: list = []   # transfers in the order they were handed over
        self.in_flight: list = []
        self.landed: list = []

    @property
    def outstanding(self) -> int:
        return len(self.waiting_for_kv) + len(self.in_flight) + len(self.landed)

    def has_work(self) -> bool:
        return bool(self.waiting_for_kv or self.in_flight or self.landed)

    def next_time(self) -> float:
        return min((tr.landed_ms for tr in self.in_flight), default=INF)

    def receive(self, inst: ReferenceEngine, tr: Transfer) -> None:
        p = tr.prefill_seq
        seq = RefSequence(tr.request, tr.seq_no)
        seq.status = "transferring"
        if self.cluster.first_token == "prefill":  # DistServe: its first token is the prefill instance's
            seq.num_generated = 1
            seq.token_times = list(p.token_times)
        carry_over(p, seq)
        seq.transfer = tr
        tr.decode_index = inst.index
        tr.decode_seq = seq
        self.waiting_for_kv.append(tr)
        if tr.request.timeout_ms is not None:
            inst.aborts.append([abort_heard_ms(tr.request, inst.hangup_ms), tr.seq_no, seq])

    def abort(self, inst: ReferenceEngine, seq: RefSequence) -> bool:
        """The client gave up on a request whose KV is not running here yet (True), as
        :mod:`schedlab.engine.transfer` rule 4 says."""
        if seq.status != "transferring":
            return False
        tr = seq.transfer
        if tr in self.waiting_for_kv:
            self.waiting_for_kv.remove(tr)
            prefill = self.cluster.by_index[tr.prefill_index]
            prefill.role.releases.append((inst.now, tr.seq_no, tr))  # (the decode side tells it: freed at once)
        elif tr in self.landed:
            self.landed.remove(tr)
            inst.kv.free(seq)
        else:
            tr.abandoned = True
        return True

    def hand_off(self, inst: ReferenceEngine, seq: RefSequence, t: float) -> bool:
        return False

    def before_plan(self, inst: ReferenceEngine) -> None:
        for tr in sorted(self.in_flight, key=lambda tr: (tr.landed_ms, tr.seq_no)):
            if tr.landed_ms <= inst.now:
                self.in_flight.remove(tr)
                if tr.abandoned:  # its client gave up on the way: the blocks go now
                    inst.kv.free(tr.decode_seq)
                else:
                    self.landed.append(tr)
        while self.landed and (self.slots is None or len(inst.running) < self.slots):
            tr = self.landed.pop(0)
            tr.decode_seq.status = "decoding"
            if self.cluster.first_token == "decode" and inst.spec is not None and inst.spec.per_request:
                tr.decode_seq.draft_k = 0  # its first step: no drafts, and vLLM pads none with drafts per batch size
            inst.running[tr.decode_seq] = None
            tr.joined_ms = inst.now

    def first_token(self, inst: ReferenceEngine, seq: RefSequence) -> None:
        """``seq`` decoded its first token here (``first_token = "decode"``): the reservation of its
        last prompt token's block, if it had one, goes back to its scheduler's (without speculation)."""
        if first_step_done(seq, inst.spec):
            seq.reserved_tokens = seq.transfer.reserve

    def after_plan(self, inst: ReferenceEngine, plan) -> None:
        if plan.preempted or inst.waiting or inst.swapped:
            return
        headroom = getattr(inst.scheduler, "pull_headroom", None)
        while self.waiting_for_kv and (self.slots is None or len(inst.running) < self.slots):
            tr = self.waiting_for_kv[0]
            seq = tr.decode_seq
            prompt = seq.request.prompt_tokens
            hit = pulled_hit(inst.kv, prompt, inst.prefix_hit(seq)) if inst.prefix_hit is not None else 0
            reserve = pull_reservation(inst.scheduler, seq.request, inst.spec, inst.longest, inst.kv)
            received = pull_keywords(inst.kv)
            if headroom is not None:
                need = inst.kv.blocks_needed(seq, prompt - hit, cached_tokens=hit, reserve_tokens=reserve, **received)
                if need + headroom(list(inst.running), len(self.in_flight) + len(self.landed),
                                   inst.kv.block_size) > inst.kv.num_free_blocks():
                    return
            host = getattr(inst.kv, "host", None)
            loaded = host.loaded if host is not None else 0
            allocated = inst.kv.allocate(seq, prompt - hit, cached_tokens=hit, reserve_tokens=reserve, **received)
            if not allocated:
                refusal(inst.kv, allocated)
                return
            self.waiting_for_kv.pop(0)
            seq.num_computed_tokens, seq.reserved_tokens = pulled_counters(tr, prompt, reserve, inst.kv.block_size,
                                                                           self.cluster.first_token)
            seq.max_computed = seq.num_computed_tokens
            link = self.cluster.links[(tr.prefill_index, inst.index)]
            tr.tokens = prompt - hit
            moved = tokens_moved(inst.kv, prompt, hit)
            tr.bytes = link.bytes_moved(moved)
            tr.pulled_ms = inst.now
            tr.landed_ms = link.start(inst.now, moved)
            if host is not None and host.loaded > loaded:  # blocks of the local hit reloaded from host memory
                blocks = host.loaded - loaded
                ms = blocks * host.bytes_per_block / (host.link_gbps * 1e9) * 1e3 + host.latency_us / 1e3
                inst.counters["host_load_blocks"] += blocks
                inst.counters["host_load_ms"] += ms
                tr.landed_ms = max(tr.landed_ms, inst.now + ms)
            self.in_flight.append(tr)
            self.cluster.by_index[tr.prefill_index].role.releases.append((tr.landed_ms, tr.seq_no, tr))


class DisaggregatedReference(ReferenceCluster):
    """A prefill pool and a decode pool of reference instances, with a router each, and their
    autoscalers (``scaling``: :class:`~schedlab.engine.pool_scaling.PoolScaling`): they act
    before hand-offs and arrivals at the same time; a scaled pool's router sees its serving
    instances only."""

    def __init__(self, prefill: Sequence[ReferenceEngine], decode: Sequence[ReferenceEngine], *,
                 prefill_router=None, decode_router=None, bandwidth_gbps: float, latency_ms: float,
                 kv_lease_ms: float = KV_LEASE_MS, client_side=None, scaling=None, first_token: str = "decode",
                 prefill_hears_disconnect: bool = True):
        if (len(prefill) > 1 and prefill_router is None) or (len(decode) > 1 and decode_router is None):
            raise ValueError("a pool of several instances needs a router")
        if first_token not in FIRST_TOKEN:
            raise ValueError(f"first_token must be one of {', '.join(map(repr, FIRST_TOKEN))}, got {first_token!r}")
        self.first_token = first_token
        refuse_planning_ahead([e.scheduler for e in (*prefill, *decode)], "disaggregated pools")
        self.instances = list(prefill) + list(decode)
        self.client_side = client_side
        self.router = prefill_router
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.decode_router = decode_router
        self.kv_lease_ms = kv_lease_ms
        self.prefill_hears_disconnect = prefill_hears_disconnect
        self.by_index = {inst.index: inst for inst in self.instances}
        self.pool_scaling = scaling
        self.clock = scaling.clock if scaling is not None else RoutingClock()
        self.prefill_views = views_of(self.prefill, self.clock)
        self.decode_views = views_of(self.decode, self.clock)
        self.views = views_of([], self.clock)  # the pools above are scanned, not tracked
        self.plans = PlanScan(self.instances)
        self.scaling = None
        self.handoffs: list = []
        for inst in self.prefill:
            inst.role = PrefillRole(self)
        for inst in self.decode:
            inst.role = DecodeRole(self, getattr(inst.scheduler, "slots", None))
        self.links = {}
        for p in self.prefill:
            sender, _ = kv_bytes_per_token(p.kv)
            for d in self.decode:
                receiver, ranks = kv_bytes_per_token(d.kv)
                self.links[(p.index, d.index)] = KVLink(bandwidth_gbps, latency_ms, sender_bytes_per_token=sender,
                                                        receiver_bytes_per_token=receiver, receiver_ranks=ranks)
        # (the decode pool's scheduler, checked, or the default; the prompt's KV arrives computed)
        self.decode_reason = received_rejection_hook(self.decode[0].scheduler, default_rejection_reason)

    def _pick(self, router, request, pool: list, views, controller, t: float) -> ReferenceEngine:
        """The instance of ``pool`` the router picks at ``t``; a scaled pool's among its serving ones."""
        if controller is None:
            return _routed(router, request, pool, views, self.clock, t)
        return _routed(router, request, [pool[i] for i in controller.members], controller.pool, self.clock, t)

    def deliver(self, request, seq_no: int, t: float) -> None:
        scaling = self.pool_scaling
        inst = self._pick(self.router, request, self.prefill, self.prefill_views,
                          scaling.prefill if scaling is not None else None, t)
        if scaling is not None:
            scaling.arrived(t)
        inst.wake(t)
        # (the prefill instance serves the prompt with max_tokens = 1 as its limits cut it; the decode
        # instance the client's request as its own cut it: vLLM's P/D proxy)
        first = prefill_request(request, self.prefill_hears_disconnect)
        if inst.limit_request is not None:
            first = inst.limit_request(first, inst.kv)
        decode0 = self.decode[0]
        # (the schedulers' rules, checked, or the default; with speculation its slack too, as ReferenceEngine.arrive)
        reason = pool_reason("prefill", inst.reason_of(first, inst.kv))
        if not reason and inst.spec is not None:
            reason = pool_reason("prefill", inst.spec.rejection_reason(inst.reason_of, first, inst.kv, inst.longest))
        at = inst.index
        # (the decode pool is uniform: its first instance answers for it, and records it; a one-token
        # answer whose token is the prefill instance's never reaches it, as DisaggregatedCluster.arrive)
        if not reason and not (self.first_token == "prefill" and request.target_tokens <= 1):
            if decode0.limit_request is not None:
                request = decode0.limit_request(request, decode0.kv)
            reason = pool_reason("decode", self.decode_reason(request, decode0.kv))
            if not reason and decode0.spec is not None:
                reason = pool_reason("decode", decode0.spec.rejection_reason(self.decode_reason, request, decode0.kv,
                                                                             decode0.longest))
            at = decode0.index
        if reason:
            seq = RefSequence(request, seq_no)
            seq.status = "rejected"
            if at == inst.index:  # (the prefill pool turned it away; the decode pool's rejection never reached it)
                seq.transfer = Transfer(request, seq_no, inst.index, None)
            inst.rec.reject(seq, at, reason)
            inst.on_request_done(request, request.arrival_ms)
            return
        if request.timeout_ms is not None and abort_heard_ms(request, inst.hangup_ms) <= request.arrival_ms:
            seq = RefSequence(request, seq_no)  # its client left before it got here
            seq.status = "aborted"
            inst.rec.request_done(seq, inst.index, request.arrival_ms, aborted=True)
            return
        seq = inst.arrive(first, seq_no)
        if seq is not None:  # (None: refused there, as by TGI's max_concurrent_requests)
            seq.transfer = Transfer(request, seq_no, inst.index, seq)

    def next_other(self) -> float:
        t = min((tr.ready_ms for tr in self.handoffs), default=INF)
        if self.pool_scaling is not None:
            t = min(t, self.pool_scaling.next_time(self._arrivals_left))
        return t

    def deliver_other(self, t: float) -> None:
        scaling = self.pool_scaling
        if scaling is not None and scaling.next_time(self._arrivals_left) <= t:
            # (an instance whose last iteration ends after t, applied when it started, has that end to come)
            scaling.apply(t, self._arrivals_left, lambda: bool(self.handoffs) or self.plans.first()[0] < INF
                          or any(inst.now > t for inst in self.instances))
        for tr in sorted(self.handoffs, key=lambda tr: (tr.ready_ms, tr.seq_no)):
            if tr.ready_ms <= t:
                self.handoffs.remove(tr)
                inst = self._pick(self.decode_router, tr.request, self.decode, self.decode_views,
                                  scaling.decode if scaling is not None else None, t)
                if scaling is not None:
                    scaling.routed_to_decode(t)
                inst.wake(t)
                inst.role.receive(inst, tr)
