"""Disaggregated prefill and decode in the fast engine: a prefill pool, a decode pool, KV links.

The flow and its sources are in :mod:`schedlab.engine.transfer`. Here each fast
:class:`~schedlab.engine.instance.Instance` gets a *stage*: the part of the flow it runs at its
own iteration boundaries, and the times it must stop at (a transfer landing, blocks being
released), so its bulk decode runs never step over them. :class:`DisaggregatedCluster` holds
the pools, routes arrivals to the prefill pool and finished prompts to the decode pool; the
driver (:func:`schedlab.engine.driver.simulate_disaggregated`) runs the instances event by
event, the pools meeting where a finished prompt is handed over.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Sequence as Seq

from .ahead import refuse_planning_ahead
from .driver import route
from .instance import Instance, default_rejection_reason
from .load import RoutingClock, views_of
from .plan import received_rejection_hook, refusal
from .sequence import ABORTED, DECODING, PARKED, SWAPPED, Sequence
from .transfer import (FIRST_TOKEN, KV_LEASE_MS, KVLink, Transfer, abort_heard_ms, carry_over, first_step_done,
                       kv_bytes_per_token, pool_reason, prefill_request, pull_keywords, pulled_hit,
                       pull_reservation, pulled_counters, tokens_moved)

INF = math.inf
TRANSFERRING = "transferring"  # a decode-side sequence before it joins the running set


class PrefillStage:
    """A prefill instance's part: hand finished prompts on, free their blocks once pulled."""

    __slots__ = ("cluster", "releases", "held")

    def __init__(self, cluster: "DisaggregatedCluster"):
        self.cluster = cluster
        self.releases: list = []  # (time, seq_no, transfer): blocks to free when their transfer lands
        self.held = 0             # prompts handed on (or abandoned) whose blocks are not freed yet

    outstanding = 0
    fresh = ()  # (a decode instance's requests before their first token: DecodeStage.fresh)
    alone = 0
    #: an abort during a step does not drop its output here: a prompt completed by the step of an
    #: abort is aborted at its hand-off (:meth:`hand_off`)
    drops_output_in_step = False

    def has_work(self) -> bool:
        return bool(self.releases)

    def next_time(self) -> float:
        return self.releases[0][0] if self.releases else INF

    def before_plan(self, inst: Instance) -> None:
        releases = self.releases
        now = inst.now
        on_finish = inst._on_finish
        while releases and releases[0][0] <= now:
            t, _, tr = heapq.heappop(releases)
            inst.kv.free(tr.prefill_seq)
            self.held -= 1
            if on_finish is not None:  # done here: the scheduler may admit into the freed blocks
                on_finish(tr.prefill_seq, t)

    def after_plan(self, inst: Instance, plan) -> None:
        pass

    def hand_off(self, inst: Instance, seq: Sequence, t: float) -> bool:
        """The prompt is done (and a token sampled): pass the request to the decode pool (True);
        with ``first_token = "prefill"`` let it finish here when that token was all it asked for
        (False). With ``"decode"`` the proxy discards that token: the decode instance samples the
        client's first. A client that left while the prompt ran is not served on (True): the
        prefill instance heard of it during the step -- aborted then, before the step's output,
        its blocks freed at once -- or, with a proxy that does not pass disconnects on, the proxy
        drops the completed prompt, whose blocks wait out their lease (rule 4)."""
        tr = seq.transfer
        request = tr.request
        on_prefill = self.cluster.first_token == "prefill"
        gone = request.timeout_ms is not None and abort_heard_ms(request, inst.hangup_ms) < t
        heard = self.cluster.prefill_hears_disconnect
        # (a one-token answer whose client left during the step is aborted too: review s81 diffuzz, 2)
        if on_prefill and request.target_tokens <= 1 and not (gone and heard):
            seq.request = request  # its row shows the client's request, not max_tokens = 1
            return False
        tr.ready_ms = t
        if not on_prefill:  # the proxy discards its token: the client's tokens are the decode instance's
            inst.counters["generated_tokens"] -= 1
            seq._generated = 0
            seq.first_token_ms = seq.last_token_ms = -1.0
        if gone:
            if heard and on_prefill:  # the step's token is never sent
                inst.counters["generated_tokens"] -= 1
                seq._generated = 0
                seq.first_token_ms = seq.last_token_ms = -1.0
            seq.request = request
            seq.status = ABORTED
            inst.rec.request_done(seq, inst.index, t, aborted=True)
            self.held += 1
            self.release_at(t if heard else t + self.cluster.kv_lease_ms, tr)
            return True
        self.held += 1
        self.cluster.handed_off(tr)
        return True

    def abort(self, inst: Instance, seq: Sequence, now: float) -> bool:
        return False  # the prefill instance's own requests are aborted as on any instance

    def release_at(self, t: float, tr: Transfer) -> None:
        heapq.heappush(self.releases, (t, tr.seq_no, tr))

    def held_transfers(self, index: int) -> list:
        """The prompts instance ``index`` handed on whose KV no decode instance has pulled yet
        (not routed, or in a decode instance's pull queue): for a stall's message."""
        cluster = self.cluster
        waiting = [tr for _, _, tr in cluster._handoffs]
        for d in cluster.decode:
            waiting += d.stage.pull_queue
        return [tr for tr in waiting if tr.prefill_index == index]


class DecodeStage:
    """A decode instance's part: pull waiting requests' KV when there is room, let them join
    the running set once it has landed (see :mod:`schedlab.engine.transfer` for the rules)."""

    __slots__ = ("cluster", "slots", "pull_queue", "in_flight", "landed", "fresh", "alone")
    #: an abort during a step drops the step's output for the request, as on any vLLM engine core
    #: (``Instance._in_step_aborts``)
    drops_output_in_step = True

    def __init__(self, cluster: "DisaggregatedCluster", slots: int | None):
        self.cluster = cluster
        self.slots = slots
        self.pull_queue: deque = deque()   # handed over, waiting for blocks here
        self.in_flight: list = []          # (landing time, seq_no, transfer)
        self.landed: deque = deque()       # KV here, waiting for a running slot
        #: first_token = "decode": running, their first token (the recompute of the last prompt
        #: token) to come -> whether their first step is a run of its own (see first_tokens)
        self.fresh: dict = {}
        self.alone = 0  # of those, the ones that are: their runs of decode iterations are one long

    @property
    def outstanding(self) -> int:
        return len(self.pull_queue) + len(self.in_flight) + len(self.landed)

    def has_work(self) -> bool:
        return bool(self.pull_queue or self.in_flight or self.landed)

    def next_time(self) -> float:
        return self.in_flight[0][0] if self.in_flight else INF

    def receive(self, inst: Instance, tr: Transfer) -> None:
        """A finished prompt routed here: a sequence of this instance, waiting for its KV."""
        p = tr.prefill_seq
        seq = Sequence(tr.request, tr.seq_no, inst.clock)
        seq.status = TRANSFERRING
        carry_over(p, seq)
        if self.cluster.first_token == "prefill":  # (DistServe: the first token is the prefill side's)
            seq._generated = 1
            seq.first_token_ms = seq.last_token_ms = p.first_token_ms
        seq.transfer = tr
        tr.decode_index = inst.index
        tr.decode_seq = seq
        self.pull_queue.append(tr)
        if tr.request.timeout_ms is not None:  # its client may still give up
            heapq.heappush(inst.aborts, (abort_heard_ms(tr.request, inst.hangup_ms), tr.seq_no, seq))

    def abort(self, inst: Instance, seq: Sequence, now: float) -> bool:
        """The client of ``seq`` gave up: if it is waiting for its KV here, let it go (see
        :mod:`schedlab.engine.transfer`, rule 4) and say so (True); False: it is not."""
        if seq.status != TRANSFERRING:
            return False
        tr = seq.transfer
        if tr.pulled_ms < 0:  # not pulled: the prefill side is told to free its blocks
            self.pull_queue.remove(tr)
            self.cluster.schedule_release(tr, now)
        elif tr in self.landed:
            self.landed.remove(tr)
            inst.kv.free(seq)
        else:  # still on its way: its blocks here are freed when it lands
            tr.abandoned = True
        return True

    def hand_off(self, inst: Instance, seq: Sequence, t: float) -> bool:
        return False  # a request finishes where it decodes

    def before_plan(self, inst: Instance) -> None:
        in_flight, landed = self.in_flight, self.landed
        now = inst.now
        while in_flight and in_flight[0][0] <= now:
            tr = heapq.heappop(in_flight)[2]
            if tr.abandoned:
                inst.kv.free(tr.decode_seq)
            else:
                landed.append(tr)
        slots = self.slots
        fresh = self.cluster.first_token == "decode"
        per_request = inst.spec is not None and inst.spec.per_request
        while landed and (slots is None or len(inst.running) < slots):
            tr = landed.popleft()
            seq = tr.decode_seq
            inst.enter_running(seq)
            if fresh:
                # (one holding its last prompt token's block as a reservation, without speculation, is not
                # counted in the decoders' block growth until its first step is done: that step alone)
                alone = tr.lifted and inst.spec is None
                self.fresh[seq] = alone
                self.alone += alone
                if per_request:  # (drafts per batch size: vLLM pads no admission, its first step has one row)
                    seq.draft_k = 0
            inst._add_decoder(seq)
            # its ITL group: its first token, on the prefill side; with first_token = "decode" none
            # (-1: Instance._apply takes no gap to its first token)
            inst.off_cycle[seq] = seq.last_token_ms
            tr.joined_ms = now
            # (a request joins as an arrival would: a scheduler trusted to plan alike between events
            # -- stable_between_events -- is asked at this plan)
            inst.ask_at_step = inst.clock.steps

    def first_tokens(self, inst: Instance, t: float) -> None:
        """After a decode iteration that ended at ``t`` (the first of a run): the fresh requests it
        decoded got their first token then (those parked out of it or swapped out still wait; one
        preempted to be recomputed, or aborted, leaves the list: a prefill makes its first token).
        Without speculation, one whose reservation held the last prompt token's block
        (``Transfer.lifted``) grows as any decoder from here: it leaves the decode set and comes
        back with its scheduler's reservation, counted then."""
        fresh = self.fresh
        for seq in list(fresh):
            status = seq.status
            if status == PARKED or status == SWAPPED:
                continue
            self.alone -= fresh.pop(seq)
            if status != DECODING or seq.first_token_ms >= 0:
                continue  # (preempted, aborted, or recomputed here since: its first token came then)
            seq.first_token_ms = t
            if first_step_done(seq, inst.spec):
                inst._shift_decoder(seq, PARKED)
                seq.reserved_tokens = seq.transfer.reserve
                inst._shift_decoder(seq)

    def after_plan(self, inst: Instance, plan) -> None:
        queue = self.pull_queue
        if not queue or plan.preempted or inst.waiting or inst.swapped:
            return
        kv = inst.kv
        slots = self.slots
        now = inst.now
        headroom = getattr(inst.scheduler, "pull_headroom", None)
        received = pull_keywords(kv)
        while queue and (slots is None or len(inst.running) < slots):
            tr = queue[0]
            seq = tr.decode_seq
            prompt = seq.prompt
            hit = pulled_hit(kv, prompt, inst.prefix_hit(seq)) if inst.prefix_hit is not None else 0
            reserve = pull_reservation(inst.scheduler, seq.request, inst.spec, inst.longest, inst.kv)
            if headroom is not None:
                keep = headroom(inst.running_view, len(self.in_flight) + len(self.landed), kv.block_size)
                if kv.blocks_needed(seq, prompt - hit, cached_tokens=hit, reserve_tokens=reserve, **received) + keep \
                        > kv.num_free_blocks():
                    break
            host = inst.host_tier
            loaded = host.loaded if host is not None else 0
            allocated = kv.allocate(seq, prompt - hit, cached_tokens=hit, reserve_tokens=reserve, **received)
            if not allocated:
                refusal(kv, allocated)
                break
            queue.popleft()
            seq._computed, seq.reserved_tokens = pulled_counters(tr, prompt, reserve, kv.block_size,
                                                                 self.cluster.first_token)
            seq.max_computed = seq._computed
            link = self.cluster.link(tr.prefill_index, inst.index)
            tr.tokens = prompt - hit
            moved = tokens_moved(kv, prompt, hit)
            tr.bytes = link.bytes_moved(moved)
            tr.pulled_ms = now
            tr.landed_ms = link.start(now, moved)
            if host is not None and host.loaded != loaded:  # part of the local hit comes from host memory
                ms = host.load_ms(host.loaded - loaded)
                inst.counters["host_load_blocks"] += host.loaded - loaded
                inst.counters["host_load_ms"] += ms
                if now + ms > tr.landed_ms:  # the reload runs beside the pull; the later one lands it
                    tr.landed_ms = now + ms
            heapq.heappush(self.in_flight, (tr.landed_ms, tr.seq_no, tr))
            self.cluster.schedule_release(tr, tr.landed_ms)  # the prefill instance plans again at the landing
            # (the blocks it took were free when the scheduler planned, and may have set when it wants to
            # be asked again -- SGLang's paged decodes: before the unused pages run out --: it is asked
            # at the next plan, which a run of decode iterations does not pass)
            inst.ask_at_step = inst.clock.steps + 1
            if plan.wake_steps is None or plan.wake_steps > 1:
                plan.wake_steps = 1


class DisaggregatedCluster:
    """Prefill and decode pools of fast instances, their routers and the links between them.

    Instance indices are global: the prefill pool's first, then the decode pool's. With
    ``scaling`` (:class:`~schedlab.engine.pool_scaling.PoolScaling`) a scaled pool's router sees
    its serving instances only.
    """

    def __init__(self, prefill: Seq[Instance], decode: Seq[Instance], *, prefill_router=None, decode_router=None,
                 bandwidth_gbps: float, latency_ms: float, kv_lease_ms: float = KV_LEASE_MS, scaling=None,
                 first_token: str = "decode", prefill_hears_disconnect: bool = True):
        if (len(prefill) > 1 and prefill_router is None) or (len(decode) > 1 and decode_router is None):
            raise ValueError("a pool of several instances needs a router")
        if first_token not in FIRST_TOKEN:
            raise ValueError(f"first_token must be one of {', '.join(map(repr, FIRST_TOKEN))}, got {first_token!r}")
        self.first_token = first_token
        refuse_planning_ahead([inst.scheduler for inst in (*prefill, *decode)], "disaggregated pools")
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.prefill_router = prefill_router
        self.decode_router = decode_router
        self.kv_lease_ms = kv_lease_ms
        self.prefill_hears_disconnect = prefill_hears_disconnect
        self._handoffs: list = []  # (ready time, seq_no, transfer), not yet routed
        #: prefill instances given a release time since the driver last looked (it re-reads
        #: their next event: schedlab.engine.driver.simulate_disaggregated)
        self.touched: list[int] = []
        self.scaling = scaling
        self._clock = scaling.clock if scaling is not None else RoutingClock()  # routers see both pools then
        self._prefill_views = views_of(self.prefill, self._clock)
        self._decode_views = views_of(self.decode, self._clock)
        self._stages = {}
        for inst in self.prefill:
            inst.stage = self._stages[inst.index] = PrefillStage(self)
        for inst in self.decode:
            inst.stage = DecodeStage(self, getattr(inst.scheduler, "slots", None))
        self._links: dict[tuple[int, int], KVLink] = {}
        for p in self.prefill:
            sender, _ = kv_bytes_per_token(p.kv)
            for d in self.decode:
                receiver, ranks = kv_bytes_per_token(d.kv)
                self._links[(p.index, d.index)] = KVLink(bandwidth_gbps, latency_ms, sender_bytes_per_token=sender,
                                                         receiver_bytes_per_token=receiver, receiver_ranks=ranks)
        decode0 = self.decode[0]
        # (the scheduler's, its answers checked, or the default; the prompt's KV arrives computed)
        self._decode_reason = received_rejection_hook(decode0.scheduler, default_rejection_reason)

    @property
    def instances(self) -> list[Instance]:
        return self.prefill + self.decode

    def link(self, prefill_index: int, decode_index: int) -> KVLink:
        return self._links[(prefill_index, decode_index)]

    def stage_of(self, prefill_index: int) -> PrefillStage:
        return self._stages[prefill_index]

    def schedule_release(self, tr: Transfer, t: float) -> None:
        """The prefill side frees the blocks of ``tr`` at ``t`` (its pull lands, or its lease
        runs out): that instance now has something to do then (listed in ``touched`` for the
        driver)."""
        self._stages[tr.prefill_index].release_at(t, tr)
        self.touched.append(tr.prefill_index)

    # -- arrivals ----------------------------------------------------------------------------
    def arrive(self, request, seq_no: int) -> Instance:
        """Route ``request`` to the prefill pool (or reject it); returns the prefill instance."""
        scaling = self.scaling
        target = self._pick(self.prefill, self.prefill_router, self._prefill_views,
                            scaling.prefill if scaling is not None else None, request, request.arrival_ms)
        if scaling is not None:
            scaling.arrived(request.arrival_ms)
        # vLLM's P/D proxy: the prefill instance serves the prompt with max_tokens = 1, its limits
        # (max_model_len) bounding the prompt only; the decode instance serves the client's request
        # as its own limits cut it (review specdisagg, findings 2 and 3)
        first = prefill_request(request, self.prefill_hears_disconnect)
        if target.limit_request is not None:
            first = target.limit_request(first, target.kv)
        reason = pool_reason("prefill", target._rejection_reason(first, target.kv))
        if not reason and target.spec is not None:  # (as Instance.arrive asks)
            reason = pool_reason("prefill", target.spec.rejection_reason(target._rejection_reason, first, target.kv,
                                                                         target.longest))
        at = target.index
        # the decode pool is uniform: its first instance answers for it, and records it -- unless the
        # request finishes on the prefill instance, a one-token answer whose token is the client's
        # (first_token = "prefill", hand_off) and never reaches the decode pool (review s80 specpp, 2)
        if not reason and not (self.first_token == "prefill" and request.target_tokens <= 1):
            decode0 = self.decode[0]
            if decode0.limit_request is not None:
                request = decode0.limit_request(request, decode0.kv)
            reason = pool_reason("decode", self._decode_reason(request, decode0.kv))
            if not reason and decode0.spec is not None:
                reason = pool_reason("decode", decode0.spec.rejection_reason(self._decode_reason, request, decode0.kv,
                                                                             decode0.longest))
            at = decode0.index
        if reason:
            seq = Sequence(request, seq_no, target.clock)
            seq.status = "rejected"
            if at == target.index:  # (turned away by the prefill pool, which it reached; not by the decode pool)
                seq.transfer = Transfer(request, seq_no, target.index, None)
            target.rec.reject(seq, at, reason)
            if target.track_finished:
                target.finished.append((request, request.arrival_ms))
            return target
        if request.timeout_ms is not None and abort_heard_ms(request, target.hangup_ms) <= request.arrival_ms:
            seq = Sequence(request, seq_no, target.clock)  # its client left before it got here
            seq.status = ABORTED
            target.rec.request_done(seq, target.index, request.arrival_ms, aborted=True)
            return target
        target.catch_up(request.arrival_ms)
        seq = target.arrive(first, seq_no)
        if seq is not None:  # (None: refused there, as by TGI's max_concurrent_requests)
            seq.transfer = Transfer(request, seq_no, target.index, seq)
        return target

    # -- handoffs ------------------------------------------------------------------------------
    def _pick(self, pool: list, router, views, controller, request, t: float) -> Instance:
        """The instance of ``pool`` the router picks at ``t``: among the serving ones when the
        pool is autoscaled (``controller``)."""
        if controller is not None:
            self._clock.now = t
            return pool[controller.target(route(router, request, controller.pool))]
        if router is None:
            return pool[0]
        self._clock.now = t
        return pool[route(router, request, views)]

    def handed_off(self, tr: Transfer) -> None:
        heapq.heappush(self._handoffs, (tr.ready_ms, tr.seq_no, tr))
        if self.scaling is not None:
            self.scaling.handed_off(tr, tr.ready_ms)

    def next_handoff(self) -> float:
        return self._handoffs[0][0] if self._handoffs else INF

    def deliver_handoffs(self, t: float) -> list[Instance]:
        """Route every finished prompt ready by ``t`` to a decode instance (in (time, arrival)
        order); returns the instances that received one."""
        scaling = self.scaling
        controller = scaling.decode if scaling is not None else None
        targets = []
        while self._handoffs and self._handoffs[0][0] <= t:
            tr = heapq.heappop(self._handoffs)[2]
            target = self._pick(self.decode, self.decode_router, self._decode_views, controller, tr.request,
                                tr.ready_ms)
            if scaling is not None:
                scaling.routed_to_decode(tr.ready_ms)
            target.catch_up(tr.ready_ms)
            target.stage.receive(target, tr)
            targets.append(target)
        return targets
