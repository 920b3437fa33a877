"""Pipelined instances in the reference engine: batches launched and landed one by one.

The rules (and vLLM's code they follow) are in :mod:`schedlab.engine.stages`; the fast engine's
version is :mod:`schedlab.engine.pipeline`. Here a :class:`ReferencePipeline` wraps a
:class:`~schedlab.engine.reference.ReferenceEngine` and :class:`ReferencePipelineCluster` runs
several behind a router in plain time order: a batch landing is an event like an arrival, and
comes before an arrival at the same time (that batch has ended when the arrival is routed);
after each landing the instance launches again, before its next batch lands, even at the same
time (as the fast engine and vLLM's batch queue do). Decodes in a batch in flight, and prompts
whose last chunk is, are marked ``in_flight`` and the scheduler sees the running list without
them; a prompt with tokens left after its chunks in flight stays in sight and may send its next
chunk (:func:`~schedlab.engine.stages.launch_chunks`). A request whose client gave
up is aborted before the instance launches (``ReferenceEngine.abort_due``), or before a batch's
output if the abort came while the batch was awaited, in a batch in flight too; that batch lands
without it. With ``[power]`` the engine's meter is a
:class:`~schedlab.energy.pipeline.PipelineMeter`, handed each batch's stage slices at its launch.
An autoscaler (:func:`~schedlab.engine.scaling.pipeline_scaling`) acts after the landings at its
time, as in the fast engine. With ``[speculative]`` a batch carries each decode's drafts, the
engine draws their acceptance when it lands, and ``k`` for the next drafts is that of the batch
as launched. Planning ahead (:class:`~schedlab.engine.stages.Stagger`) the instance keeps one batch
more in flight, and before each plan shows the scheduler the requests whose decode is due, their
tokens in flight counted in ``in_flight``, and hides decoders whose decode is not
(:meth:`ReferencePipeline._show`).
"""

from __future__ import annotations

import math
from typing import Sequence

from ..errors import SimulationError, StallError
from .ahead import plans_ahead
from .load import load
from .plan import ask_scheduler
from .reference import RefPlan, ReferenceEngine
from .reference_cluster import ReferenceCluster
from .stall import check_kv_counts
from .stages import (IN_FLIGHT, Bumped, Holds, StageClock, Stagger, VisibleRunning, bumped_chunks, count_bumped,
                     dropped_chunks, hole_row, instance_view, launch_chunks, refuse_ahead, restore, rewind, stage_times,
                     stale, tokens_for)

INF = math.inf


class PipelinePlan(RefPlan):
    """A plan that sees only the running sequences not in flight (their slots still count); a
    preemption may pick one in flight (:mod:`schedlab.engine.stages`)."""

    def __init__(self, engine: ReferenceEngine, serial: int):
        super().__init__(engine, serial)
        self.bases: dict = {}  # planning ahead: each decode's computed tokens at the launch

    @property
    def running(self):
        return VisibleRunning(self._e.running)

    def phantom(self, seq) -> int:
        """Planning ahead: the tokens of ``seq`` in flight, counted as computed (their KV slots
        are taken), whose decodes have not landed."""
        return self._e.in_flight.get(seq, 0) if self._e.stagger is not None else 0

    def preempt(self, seq, *, discard_in_flight: bool = False) -> None:
        """As :meth:`RefPlan.preempt`; ``discard_in_flight`` is SGLang's overlap scheduler's, which
        is off on pipelines (its schedulers pass False here)."""
        if discard_in_flight:
            raise SimulationError("reference engine: preempt(discard_in_flight=True) is SGLang's overlap scheduler, "
                                  "which is not modelled with pipeline parallelism")
        e = self._e
        if e.stagger is not None and seq.status == "decoding" and seq in e.holds.flying:
            # planning ahead: shown to this plan (Stagger), its token still in flight; the slots
            # this plan took for it go with the rest
            pending = self._withdraw(seq, "preempt")
            seq.reserved_tokens = max(seq.reserved_tokens, seq.num_computed_tokens + pending)
            if pending:
                seq.cache_lag = 0  # (vLLM cached its tokens when it scheduled it)
            seq.status = IN_FLIGHT
        if seq.status != IN_FLIGHT or seq not in e.running:
            super().preempt(seq)
            return
        flying = seq in e.holds.flying  # (else planning ahead passed it over: its decode was not due)
        self._requeue(seq, e.in_flight.pop(seq, 0))  # a decode's slots in its batch go too
        if flying:
            e.counters["in_flight_preemptions"] += 1


class ReferencePipeline(instance_view("e", reads=("now",), writes=("hangup_ms", "on_request_done", "closed_loop"))):
    """A reference instance whose batches go through ``stages`` stages (the cluster reads it as
    it reads a :class:`ReferenceEngine`)."""

    role = None
    pending = None  # no pending runs (the routers' views ask): a pipeline lands one batch at a time

    def __init__(self, engine: ReferenceEngine, stages: int):
        self.e = engine
        self.stages = stages
        self.clock = StageClock(stages)
        # planning ahead (schedlab.engine.stages): one batch more in flight, decodes staggered
        engine.stagger = Stagger(stages) if plans_ahead(engine.scheduler) else None
        if engine.stagger is not None:
            refuse_ahead(engine)
            engine.ahead, engine.drafts_ahead = None, False  # (not the colocated rules of engine.ahead)
        self.depth = stages + 1 if engine.stagger is not None else stages
        self.flights: list = []   # [plan, decoders and their statuses, chunks, launch time, completion, tokens, batch]
        self.told = 0             # the requests ended (ReferenceEngine.ended) as of the last plan
        self.launch_due = True    # a launch is due at the engine's time
        self.sleep_until = None
        self.last_landing = -INF
        self.drain_at = INF       # autoscaled, draining: it aborts what it holds at its first launch from then
        engine.in_flight = {}
        engine.holds = Holds()

    # -- what the cluster calls (what it reads comes from instance_view) ------------------------------
    def arrive(self, request, seq_no: int):
        return self.e.arrive(request, seq_no)

    def drain_by(self, t: float) -> None:
        """Autoscaled, draining: abort every request held at the first launch at or after ``t`` (a
        drain timeout, :mod:`schedlab.engine.drain`; inf: none, a timer cancelled)."""
        self.drain_at = t

    @property
    def drain_aborted(self) -> int:
        return self.e.drain_aborted

    def settle(self, t: float) -> None:
        """Before requests arriving at ``t`` are routed: an instance that launches next (none
        of its batches in flight) aborts what is due by ``t``; one waiting for a landing hears
        of it then."""
        e = self.e
        if self.launch_due and e.now <= t and any(at <= t and seq.status not in ("finished", "aborted")
                                                  for at, _, seq in e.aborts):
            e.wake(t)
            self.sleep_until = None
            e.abort_due()

    def has_work(self) -> bool:
        return bool(self.flights) or self.e.has_work()

    @property
    def idle_since(self) -> float:
        """With nothing in flight or queued: when it last worked (the engine's clock stays there
        until a request arrives)."""
        return self.e.now

    def next_plan_time(self) -> float:
        """When it launches next: now, or after an empty plan at its wake-up time or its next
        abort (inf while it waits for a batch to land)."""
        if not self.launch_due:
            return INF
        if self.sleep_until is None:
            return self.e.now
        pending = [at for at, _, seq in self.e.aborts if seq.status not in ("finished", "aborted")]
        return max(min([self.sleep_until, self.drain_at] + pending), self.e.now)

    def next_landing(self) -> float:
        """When its oldest batch lands; inf while a launch is due: after a landing the instance
        schedules again before it takes the next batch's output (vLLM's
        ``step_with_batch_queue``), even one that completed at the same time -- a batch of swaps
        only takes no stage time and lands with the batch before it."""
        return self.flights[0][4] if self.flights and not self.launch_due else INF

    def wake(self, t: float) -> None:
        """An arrival (or its sleep's end): it plans then, unless it waits for a batch to land."""
        if self.launch_due:
            self.e.wake(t)
            self.sleep_until = None

    # -- launching and landing -------------------------------------------------------------------
    def step(self) -> None:
        """Abort what is due (everything, once a drain timeout has come: :mod:`schedlab.engine.drain`),
        then launch batches until ``stages`` are in flight or the scheduler plans nothing."""
        e = self.e
        if self.drain_at <= e.now:
            self.drain_at = INF
            e.drain_kill()
        e.abort_due()
        plan = None
        while len(self.flights) < self.depth:
            e.untaken.take(e.now)  # (the launch's plan takes what arrived by now: engine.taking)
            e.serial += 1
            telling, self.told = e.ended > self.told, e.ended
            plan = PipelinePlan(e, e.serial)
            shown = self._show() if e.stagger is not None else None
            ask_scheduler(e.scheduler, plan)
            check_kv_counts(e.kv)
            empty = not plan.num_scheduled_tokens and not plan.swapped_in and plan.transfer_ms == 0.0
            if not empty:
                self._launch(plan)
            if shown is not None:
                self._unshow(shown)
            if empty:
                if not any(f[0] is not None for f in self.flights):
                    self.flights = []  # only empty batches left: each is back already
                    if e.stagger is not None and any(s.status == "decoding" and Stagger.hidden(s, e.serial)
                                                     for s in e.running):
                        continue  # vLLM schedules again at once, until a decode is due
                    break
                if not e.has_work():
                    if telling:  # (vLLM's has_finished_requests: that plan is queued too)
                        self._queue_empty()
                    break
                self._queue_empty()
                plan = None
                continue
            plan = None
        if self.flights:
            self.launch_due = False
            return
        e.empty_plans += 1
        if e.empty_plans > 1000:
            raise StallError(f"reference engine: instance {e.index}: the scheduler keeps planning empty iterations")
        wake = plan.wake if plan.wake is not None else INF
        if not plan.preempted and wake > e.now:
            self.sleep_until = wake

    def _queue_empty(self) -> None:
        """vLLM 0.33 queues an empty batch too: it holds its slot until it is back, with the batch
        before it (:mod:`schedlab.engine.stages`)."""
        now = self.e.now
        self.flights.append([None, [], [], now, self.clock.launch(now, [0.0] * self.stages, 0.0), 0, None])

    def _show(self) -> tuple[list, list]:
        """Planning ahead: before plan ``e.serial``, the requests in flight whose decode is due
        join the decoding ones, and those decoding whose decode is not due sit out (statuses
        put back by :meth:`_unshow`)."""
        e = self.e
        serial = e.serial
        shown, hidden = [], []
        for s in e.running:
            if s.status == IN_FLIGHT and Stagger.shown(s, serial):
                s.status = "decoding"
                shown.append(s)
            elif s.status == "decoding" and Stagger.hidden(s, serial):
                s.status = IN_FLIGHT
                hidden.append(s)
        return shown, hidden

    def _unshow(self, shown: tuple) -> None:
        """After the plan's launch: put back what :meth:`_show` changed and the plan left."""
        for s in shown[0]:
            if s.status == "decoding":  # not scheduled (nor preempted): its token is still in flight
                s.status = IN_FLIGHT
        for s in shown[1]:
            if s.status == IN_FLIGHT:
                s.status = "decoding"

    def _launch(self, plan: RefPlan) -> None:
        e = self.e
        e.empty_plans = 0
        batch = e.plan_batch(plan)[0]
        tokens = batch.num_batched_tokens
        stage_ms, send_ms, ratio = stage_times(e.cost.inner, batch, self.stages)
        stage_ms = list(stage_ms)
        stage_ms[0] += plan.transfer_ms  # swaps before the first stage; the batch's time then includes them
        plan.transfer_ms = 0.0
        decoders = plan.decoders()
        start = e.now if e.stagger is None else Stagger.ready(decoders, e.now)
        completion = self.clock.launch(start, stage_ms, send_ms)
        if e.meter is not None:  # each stage's slice, metered now that its times are known
            e.meter.launch(self.clock.starts, stage_ms, batch, ratio)
        members = set(decoders)
        flown = [(s, s.status, s.num_preemptions) for s in e.running if s in members]
        e.holds.launched(s for s, _, _ in flown)
        for s, _, _ in flown:
            s.status = IN_FLIGHT
        if e.stagger is None:
            for s in decoders:  # the KV slots the batch took for each, freed with it if it is aborted
                e.in_flight[s] = plan.drafts[s][1]
        else:  # its tokens in flight (drafts counted as accepted), their slots kept with its blocks
            for s in decoders:
                drafts, slots = plan.drafts[s]
                plan.bases[s] = s.num_computed_tokens
                e.in_flight[s] = e.in_flight.get(s, 0) + 1 + drafts
                s.reserved_tokens = max(s.reserved_tokens, s.num_computed_tokens + slots)
                s.cache_lag = 0  # (Stagger.cached)
            for s, padding in plan.padded.items():  # an admission's placeholder drafts count too
                e.in_flight[s] = e.in_flight.get(s, 0) + padding
        chunks = launch_chunks(plan.prefills)  # computed at once: a prompt with tokens left stays in sight
        e.holds.launched(s for s, _ in chunks)
        if e.spec is not None:  # (drafts per batch size: their next decodes verify the k of this batch)
            e.spec.propose([*decoders, *(s for s, chunk in chunks if chunk.last)], batch.num_seqs)
        for s, chunk in chunks:
            if chunk.last:
                s.status = IN_FLIGHT
        if e.stagger is not None:
            last = [s for s, chunk in chunks if chunk.last]
            for s in last:
                s.cache_lag = -1  # (Stagger.cached: its prompt's tokens are all known)
            e.stagger.launched(decoders + last, plan.serial, completion)
        self.flights.append([plan, flown, chunks, e.now, completion, tokens, batch])

    def land(self) -> None:
        """The oldest batch is back: its sequences return and its plan executes, over the time
        since the previous landing (or its launch, if later)."""
        e = self.e
        completion = self.flights[0][4]
        if self.flights[0][0] is not None and any(at < completion and seq.status not in ("finished", "aborted")
                                                  for at, _, seq in e.aborts):
            was, used = e.now, e.kv.num_used_blocks()  # vLLM reads the aborts that came meanwhile before
            e.now = completion                         # the batch's output; their blocks were held until then
            e.abort_due(strictly=True)
            e.now = was
            e.held_to_landing = used - e.kv.num_used_blocks()
        plan, flown, chunks, launched, completion, tokens, batch = self.flights.pop(0)
        if plan is None:  # an empty batch: nothing to execute, it frees its slot
            self.launch_due = True
            self.sleep_until = None
            return
        if not any(f[0] is not None for f in self.flights):
            self.flights = []  # only empty batches left behind it: each is back already
        e.holds.landed(s for s, _, _ in flown)
        e.holds.landed(s for s, _ in chunks)
        gone = {s for s, _, _ in flown if s.status == "aborted"}  # aborted meanwhile: no token from this batch
        aborted = [(s, 1 + plan.drafts[s][0]) for s, _, _ in flown if s in gone]  # (its share: counted apart)
        # planning ahead: finished by a batch before it, decoded once more, the token thrown away
        plan.overshoots = [s for s, _, _ in flown if s.status == "finished"]
        plan.overshoot_drafts = {s: plan.drafts[s][0] for s in plan.overshoots if plan.drafts[s][0]}
        # preempted meanwhile: its blocks are free, but what the batch computed for it is its own
        bumped = [Bumped(s, plan.drafts[s][0], True) for s, _, stamp in flown
                  if s not in gone and s.num_preemptions != stamp]
        gone.update(b.seq for b in bumped)
        live = [(s, chunk) for s, chunk in chunks if not stale(s, chunk)]  # not aborted or preempted since
        lost = (sum(1 + plan.drafts[s][0] for s in gone)                     # a decode's tokens
                + sum(c.tokens for s, c in chunks if stale(s, c)))           # a prompt chunk's
        gone.update(plan.overshoots)  # (computed: their tokens count in the batch's)
        plan.prefills = [(s, c.tokens) for s, c in live]
        plan.dropped = dropped_chunks(chunks) + [(b.seq, 1 + b.drafts) for b in bumped] + aborted
        bumped += bumped_chunks(chunks)
        flown = [(s, status) for s, status, _ in flown if s not in gone]
        for s, _ in flown:
            landed = 1 + plan.drafts[s][0] if e.stagger is not None else e.in_flight[s]
            if e.in_flight[s] == landed:
                del e.in_flight[s]
            else:
                e.in_flight[s] -= landed
        if e.stagger is not None:
            for s, _ in flown:  # its slots counted from its computed tokens now, as _execute reads them
                drafts, slots = plan.drafts[s]
                plan.drafts[s] = (drafts, slots - (s.num_computed_tokens - plan.bases[s]))
            for s, chunk in live:  # an admission's placeholder drafts, all rejected
                padding = plan.padded.get(s, 0) if chunk.last else 0
                if padding:
                    left = e.in_flight[s] - padding
                    if left:
                        e.in_flight[s] = left
                    else:
                        del e.in_flight[s]
        others = [s for s in e.running if s.status == "decoding"]  # not in this batch: sit it out
        for s in others:
            s.status = IN_FLIGHT
        for s, status in flown:
            s.status = status
        for s, chunk in live:
            if chunk.last:
                s.status = "prefilling"
        start = max(launched, self.last_landing)
        if e.now < start:
            e.wake(start)
        e.now = start
        e.cost.step_ms = completion - start
        e.cost.tokens = tokens - lost
        e.cost.run = None
        e.events += 1
        ahead = rewind(live)
        e._execute(plan)
        restore(ahead)
        if e.spec is not None and batch.num_seqs:  # the drafter proposed for the batch as launched
            e.spec_k = e.spec.k_for(batch.num_seqs)
        if e.now < completion:  # a batch of swaps only, or whose requests were all aborted: it waits
            e.wake(completion)
            if e.meter is not None:
                hole_row(e.meter, e.rec, e.index, len(e.running), len(e.waiting),
                         e.kv.num_used_blocks() + e.held_to_landing)
        e.held_to_landing = 0
        e.now = self.last_landing = completion
        if bumped:
            self._give(bumped, completion)
        if e.holds.held:
            e.holds.release(e.waiting)
        for s in others:
            s.status = "decoding"
        if e.stagger is not None:  # still in a batch in flight: back out of sight
            for s, _ in flown:
                s.cache_lag = 1  # (Stagger.cached)
            for s, chunk in live:
                if chunk.last:
                    s.cache_lag = 1
            for s in e.running:
                if s.status == "decoding" and s in e.in_flight:  # (a decode of it in a later batch)
                    s.status = IN_FLIGHT
            for s in [s for s in e.in_flight if s.status == "finished"]:
                del e.in_flight[s]
        self.launch_due = True
        self.sleep_until = None

    def _give(self, bumped: list, t: float) -> None:
        """The tokens the landing at ``t`` brings requests preempted while it was in flight (held
        back since), in arrival order; one whose last token that is finishes."""
        e = self.e
        before = load(e)
        for b in sorted(bumped, key=lambda b: b.seq.seq_no):
            s = b.seq
            n, accepted = tokens_for(e.spec, b, s.num_generated, s.request.target_tokens)
            s.num_generated += n
            s.token_times.append(t)
            count_bumped(e.counters, b, n, accepted)
            if s.num_generated < s.request.target_tokens:
                continue
            e.holds.drop(s)  # held back since its preemption: it holds no KV
            s.waiting_ms += t - s.waiting_since
            s.status = "finished"
            e.finish_done(s, t)
        e.release.add(t, before, load(e))


class ReferencePipelineCluster(ReferenceCluster):
    """Pipelined reference instances behind a router: landings are events, before arrivals and
    before the autoscaler's (``scaling``, :func:`~schedlab.engine.scaling.pipeline_scaling`) at
    the same time, which then sees them landed."""

    def __init__(self, instances: Sequence[ReferencePipeline], router=None, client_side=None, scaling=None):
        super().__init__(instances, router, client_side=client_side, scaling=scaling)

    def next_other(self) -> float:
        return min(min(inst.next_landing() for inst in self.instances), super().next_other())

    def _stirring(self, t: float) -> bool:
        return super()._stirring(t) or min(inst.next_landing() for inst in self.instances) < INF

    def deliver_other(self, t: float) -> None:
        while True:
            c, _, inst = min((inst.next_landing(), inst.index, inst) for inst in self.instances)
            if c > t:
                break
            inst.land()
            self.changed(inst)
        super().deliver_other(t)
