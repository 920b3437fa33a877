"""A pipelined instance in the fast engine: several batches in flight, one per stage.

The rules and their vLLM sources are in :mod:`schedlab.engine.stages`. A
:class:`PipelinedInstance` wraps a fast :class:`~schedlab.engine.instance.Instance` (whose cost
model is a :class:`~schedlab.engine.rank_cost.RankCost`) and stands in for it with the driver
(:func:`schedlab.engine.driver.simulate` runs it like any instance):

* **launch** (at the instance's time): the scheduler plans a batch from the sequences that are
  not in flight; the batch's KV slots are taken then (the plan does it), its stage times come
  from the cost model's ``pipeline_ms`` (its swaps lengthen the first stage) and the stages'
  clock gives its completion (an empty plan with batches in flight queues an empty batch, which
  holds its slot until it is back with the batch before it, as in vLLM); its decodes then sit
  out, marked in flight, and so do prompts whose last chunk it holds: a prompt's chunks count as computed at the launch
  (:func:`~schedlab.engine.stages.launch_chunks`), so one with tokens left gets its next chunk
  in the next batch. Batches are launched until ``pipeline_parallel`` are in flight or a plan
  comes back empty;
* **landing** (at the oldest batch's completion, in launch order): its sequences come back and
  the instance executes the batch's plan then -- tokens, first tokens, finishes -- over the
  time since the previous landing (or its launch, if later), so the instance's busy time and
  KV integrals cover each moment once; a prompt preempted since the launch loses its chunk
  (:meth:`PipelinedInstance._drop_stale`), a request preempted while this batch held its
  decode or its prompt's last chunk gets the batch's tokens all the same
  (:meth:`PipelinedInstance._give`), and victims no batch in flight holds any more go back to
  the front of the queue. Then it launches again.

Arrivals wait for the next landing (vLLM blocks on the oldest batch). The pipeline runs one
batch at a time: no bulk decode runs.

Planning ahead (:class:`~schedlab.engine.stages.Stagger`), one batch more is kept in flight; before
each plan the requests whose decode is due join the decoders with their tokens still in flight
(``in_flight`` counts those tokens, ``Plan.phantom`` gives their KV slots) and decoders whose
decode is not due sit out (:meth:`PipelinedInstance._show`); a landing re-marks its decoders with
its own plan (a later plan may have marked them) and takes those with tokens still in flight
back out of sight.

With ``[speculative]`` a batch's decodes verify their drafts (``plan.drafts_of``: the batch
carries them, and their KV slots are taken at the launch) and the drafter's time is on the last
stage; acceptance is drawn at the landing (``Instance._verify``), and the landing sets the next
drafts' ``k`` from the batch as launched (:mod:`schedlab.engine.stages`).

With ``[power]`` the instance's meter is a :class:`~schedlab.energy.pipeline.PipelineMeter`: a
batch's stage slices are metered at its launch (at the clock ``[clock]`` gives the batch,
:func:`~schedlab.engine.stages.stage_times`), its energy shared out to its tokens at its landing,
and a landing that gives no token is followed by a row over the batch's time in flight
(:func:`~schedlab.engine.stages.hole_row`).

Clients that give up (:mod:`schedlab.frontend`) are heard of when the instance next launches,
or when a batch lands, before its output, if they came while it was awaited (the rule, and
vLLM's code it follows, in :mod:`schedlab.engine.stages`): ``Instance._abort_due`` frees a
request's blocks and slot at once, also while its batch is in the pipeline, and that batch's
landing drops its part (:meth:`PipelinedInstance._drop_stale`).

Autoscaled (:func:`~schedlab.engine.scaling.pipeline_scaling`), a draining instance is off from
:attr:`PipelinedInstance.idle_since` once nothing is in flight or queued: its clock may have moved
on, to the time the driver told it to wait for.
"""

from __future__ import annotations

import math
from collections import deque

from ..errors import StallError
from .ahead import plans_ahead
from .instance import Instance
from .lockstep import rank_batch
from .plan import FastPlan, ask_scheduler
from .rank_cost import RankCost
from .stall import check_kv_counts
from .sequence import ABORTED, DECODING, FINISHED, PARKED, PREFILLING
from .load import load
from .stages import (IN_FLIGHT, Bumped, Holds, StageClock, Stagger, VisibleRunning, bumped_chunks, count_bumped,
                     dropped_chunks, hole_row, instance_view, launch_chunks, refuse_ahead, restore, rewind, stage_times,
                     stale, tokens_for)

INF = math.inf


class Flight:
    """A batch in the pipeline."""

    __slots__ = ("plan", "decoders", "chunks", "launched", "completion", "tokens", "members", "seqs", "stamps",
                 "bases")

    def __init__(self, plan, decoders, chunks, launched, completion, tokens, members, seqs, stamps, bases=None):
        self.plan = plan
        self.decoders = decoders    # sequences decoding in it (they come back decoding)
        self.chunks = chunks        # its prompt chunks, as plan.prefills: (seq, Chunk)
        self.launched = launched
        self.completion = completion
        self.tokens = tokens
        self.members = members      # every decode in it -> the tokens it computes for it
        self.seqs = seqs            # sequences in it at its launch (speculation: k for the next drafts)
        self.stamps = stamps        # every decode in it -> its preemption count at the launch
        self.bases = bases          # planning ahead: every decode in it -> its computed tokens at the launch


class PipelinedInstance(instance_view("inst", reads=("finished",), writes=("hangup_ms", "track_finished"))):
    """A fast instance whose batches go through ``stages`` pipeline stages."""

    pending = None  # no pending decode runs (the routers' views ask): batches land one at a time

    def __init__(self, inst: Instance, stages: int):
        if not isinstance(inst.cost, RankCost):
            raise TypeError("a pipelined instance's cost model must be a RankCost")
        self.inst = inst
        self.stages = stages
        self.clock = StageClock(stages)
        self.flights: deque[Flight] = deque()
        self.told = 0             # the requests ended (Instance.ended) as of the last plan
        self.telling = False      # the last plan is the first since some ended (the workers hear of them)
        self.now = 0.0            # when the instance acts next: plans, or lands its oldest batch
        self.to_plan = True       # a launch is due at ``now`` (else the oldest batch lands at ``now``)
        self.last_landing = -INF
        self._blocked = False      # planned nothing, with no wake-up: waits for an arrival
        self._quiet = None         # it ran out of work then (None: it has work, or got a request since)
        self.waits_until = None    # planned nothing, nothing in flight: no launch before this unless a request comes
        self.drain_at = INF        # autoscaled, draining: it aborts what it holds at its first launch from then
        if inst.meter is not None and not callable(getattr(inst.meter, "launch", None)):
            raise TypeError("a pipelined instance is metered stage by stage: its meter must be a PipelineMeter")
        inst.running_view = VisibleRunning(inst.running)
        inst.in_flight = {}
        inst.holds = Holds()
        # planning ahead (schedlab.engine.stages): one batch more in flight, decodes staggered
        inst.stagger = Stagger(stages) if plans_ahead(inst.scheduler) else None
        if inst.stagger is not None:
            refuse_ahead(inst)
            inst.ahead = inst.marks = None  # (not the colocated rules of engine.ahead)
            inst.drafts_ahead = False
        self.depth = stages + 1 if inst.stagger is not None else stages
        self._cost = inst.cost.inner
        # Every batch is timed at its launch, from its own decoders (below): the instance's
        # lazily pruned heaps of context anchors would only fill up as decoders leave and come back.
        self._needs_range = inst.track_range
        inst.track_range = False

    # -- what the driver calls (what it and the routers read comes from instance_view) ---------------
    def arrive(self, request, seq_no: int):
        self._quiet = self.waits_until = None
        return self.inst.arrive(request, seq_no)

    @property
    def idle_since(self) -> float:
        """With nothing in flight or queued: when it last worked -- its last landing or abort,
        or a request's arrival (the autoscaler turns a drained instance off then,
        :func:`~schedlab.engine.scaling.pipeline_scaling`). Its clock may have moved on since, to
        the time the driver told it to wait for."""
        return self.now if self._quiet is None else self._quiet

    def drain_by(self, t: float) -> None:
        """Autoscaled, draining: abort every request held at the first launch at or after ``t`` (a
        drain timeout, :mod:`schedlab.engine.drain`; inf: none, a timer cancelled); batches in
        flight then land without them. One waiting for an arrival wakes then."""
        self.drain_at = t
        self._blocked = False

    @property
    def drain_aborted(self) -> int:
        return self.inst.drain_aborted

    def settle(self, t: float) -> None:
        """Before requests arriving at ``t`` are routed: an instance about to launch at ``t``
        aborts what is due by then (routers see the aborted requests gone); one waiting for a
        batch to land hears of them at the landing."""
        inst = self.inst
        if self.to_plan and self.now == t and inst.aborts and inst.next_abort() <= t:
            self._blocked = False
            inst._abort_due()

    def has_work(self) -> bool:
        return bool(self.flights) or self.inst.has_work()

    def take_finished(self) -> list:
        return self.inst.take_finished()

    def _stall_message(self, why: str) -> str:
        return self.inst._stall_message(why)

    # -- event by event (the open-loop driver, schedlab.engine.driver.simulate) ------------------
    def next_event(self) -> tuple[float, int]:
        """As :meth:`Instance.next_event`: ``(completion, 0)`` -- the oldest batch lands (before
        an arrival at that time); ``(t, 1)`` -- it launches at ``t``; ``(inf, 1)`` -- it waits for
        an arrival (idle, or blocked: work left, nothing planned, no wake-up)."""
        if not self.to_plan:
            return self.now, 0
        # (batches still in flight whose requests all left -- aborted, a drain timeout's too -- land
        # at the launches that follow: not idle)
        if self._blocked or not (self.inst.has_work() or self.flights):
            return INF, 1
        return self.now, 1

    def act_until(self, t: float) -> tuple[float, int]:
        """Land and launch while the next event comes before an arrival at ``t``."""
        self._blocked = self.advance(t) == "blocked"
        return self.next_event()

    def catch_up(self, t: float) -> None:
        """A request routed here arrives at ``t``: an instance waiting to launch waits until
        then (one with batches in flight takes it at its next landing)."""
        self._blocked = False
        self.advance(t)

    # -- the loop -------------------------------------------------------------------------------
    def advance(self, until: float, stop_on_finish: bool = False) -> str:
        """Land every batch that completes by ``until`` and launch at every landing before it.

        Returns ``"until"`` (reached ``until``), ``"finished"`` (stopped after a landing in which
        requests finished, when ``stop_on_finish``), ``"idle"`` (no work at all) or ``"blocked"``
        (work is left, but the scheduler plans nothing and has no wake-up time)."""
        inst = self.inst
        empty = 0
        self.waits_until = None
        while True:
            if not self.to_plan:
                if self.now > until:
                    return "until"
                if inst.aborts and inst.next_abort() < self.now and self.flights[0].plan is not None:
                    self._abort_before_landing()
                self._land()
                if stop_on_finish and inst.finished:
                    return "finished"
                continue
            if self.now >= until:
                return "until"
            inst.now = self.now
            if self.drain_at <= self.now:  # its drain timeout has come: it aborts what it holds (engine.drain)
                self.drain_at = INF
                inst.drain_kill()
            if inst.aborts and inst.next_abort() <= self.now:  # vLLM reads aborts before it schedules
                inst._abort_due()
            plan = None
            while len(self.flights) < self.depth:
                shown = self._show() if inst.stagger is not None else None
                plan = self._plan()
                empty = plan.is_empty()
                if not empty:
                    self._launch(plan)
                if shown is not None:
                    self._unshow(shown)
                if empty:
                    if not any(f.plan is not None for f in self.flights):
                        self.flights.clear()  # only empty batches left: each is back already
                        if inst.stagger is not None and any(s.status == DECODING and Stagger.hidden(s, inst.serial)
                                                            for s in inst.running):
                            continue  # vLLM schedules again at once, until a decode is due
                        break
                    if not inst.has_work():
                        if self.telling:  # (vLLM's has_finished_requests: that plan is queued too)
                            self._launch_empty()
                        break
                    self._launch_empty()
                    plan = None
                    continue
                plan = None
            if self.flights:
                self.to_plan = False
                self.now = self.flights[0].completion
                continue
            # nothing in flight and nothing planned: wait for the plan's wake-up time (or ``until``)
            if not inst.has_work():
                if self._quiet is None:
                    self._quiet = self.now
                if until < INF:
                    inst.now = self.now = until
                return "idle"
            empty += 1
            if empty > 1000:
                raise StallError(inst._stall_message("the scheduler keeps planning empty iterations"))
            wake = plan.wake if plan.wake is not None else INF
            abort = inst.next_abort() if inst.aborts else INF
            # an abort wakes it (as an arrival would): it may free what the plan waits for; and its drain timeout
            quiet = min(wake, abort, self.drain_at)
            target = until if until < quiet else quiet
            if plan.preempted or target <= self.now:
                continue
            if target == INF:
                return "blocked"
            if until < quiet:  # (the closed-loop driver may run the others up to then)
                self.waits_until = quiet
            inst._hold_blocks(target)
            inst.now = self.now = target

    def _abort_before_landing(self) -> None:
        """vLLM reads the aborts that came while it waited for the oldest batch before that
        batch's output (``step_with_batch_queue``'s ``_process_aborts_queue``): the batch, and
        any other in flight, drop their part for those requests (:mod:`schedlab.engine.stages`)."""
        inst = self.inst
        was, used = inst.now, inst.kv.num_used_blocks()
        inst.now = self.now
        inst._abort_due(strictly=True)
        inst.now = was
        inst.held_to_landing = used - inst.kv.num_used_blocks()  # (until the landing is done)

    def _plan(self) -> FastPlan:
        """The scheduler's plan for a launch at ``now``, which takes the requests that arrived by
        then (:mod:`schedlab.engine.taking`)."""
        inst = self.inst
        inst.untaken.take(inst.now)
        inst.serial += 1
        self.telling, self.told = inst.ended > self.told, inst.ended
        plan = FastPlan(inst, inst.serial)
        ask_scheduler(inst.scheduler, plan)
        check_kv_counts(inst.kv)
        return plan

    def _show(self) -> tuple[list, list]:
        """Planning ahead: before the next plan, the requests in flight whose decode is due join
        the decoders, and decoders whose decode is not due sit out (put back by :meth:`_unshow`
        once the plan is launched)."""
        inst = self.inst
        serial = inst.serial + 1  # (the plan's)
        shown, hidden = [], []
        for seq in inst.running:
            if seq.status == IN_FLIGHT and Stagger.shown(seq, serial):
                inst._shift_decoder(seq)  # (for the plan only: Instance._shift_decoder)
                shown.append(seq)
            elif seq.status == DECODING and Stagger.hidden(seq, serial):
                inst._shift_decoder(seq, IN_FLIGHT)
                hidden.append(seq)
        return shown, hidden

    def _unshow(self, shown: tuple) -> None:
        inst = self.inst
        for seq in shown[0]:
            if seq.status == DECODING:  # not scheduled (nor preempted): its token is still in flight
                inst._shift_decoder(seq, IN_FLIGHT)
        for seq in shown[1]:
            if seq.status == IN_FLIGHT:
                inst._shift_decoder(seq)

    def _launch_empty(self) -> None:
        """An empty plan while batches are in flight: vLLM 0.33 queues the empty batch too, and it
        holds its slot until it is back, with the batch before it (:mod:`schedlab.engine.stages`)."""
        t = self.inst.now
        self.flights.append(Flight(None, [], [], t, self.clock.launch(t, (0.0,) * self.stages, 0.0), 0, {}, 0, {}))

    def _launch(self, plan: FastPlan) -> None:
        """Time ``plan`` through the stages and take its sequences out until it lands."""
        inst = self.inst
        serial = plan.serial
        batch = rank_batch(inst, plan)
        decoding = [s for s in inst.running if s.status == DECODING and (plan.decodes_all or s.plan_mark == serial)]
        if self._needs_range and decoding:
            contexts = [s.num_computed_tokens + 1 + plan.drafts_of(s)[0] for s in decoding]
            batch.decode_context_max, batch.decode_context_min = max(contexts), min(contexts)
        stage_ms, send_ms, ratio = stage_times(self._cost, batch, self.stages)
        if plan.transfer_ms:  # swaps before the first stage; the batch's time then includes them
            stage_ms = (stage_ms[0] + plan.transfer_ms, *stage_ms[1:])
            plan.transfer_ms = 0.0
        start = inst.now if inst.stagger is None else Stagger.ready(decoding, inst.now)
        completion = self.clock.launch(start, stage_ms, send_ms)
        if inst.meter is not None:  # each stage's slice, metered now that its times are known
            inst.meter.launch(self.clock.starts, stage_ms, batch, ratio)
        for seq in plan.swapped_in:  # joined the decode set in this plan: its ITL group is its own last token
            inst.off_cycle.setdefault(seq, seq.last_token_ms)
        flying = inst.holds.flying
        for seq in decoding:
            if inst.stagger is not None and seq in flying:  # shown to the plan, its token in flight (_show)
                inst._shift_decoder(seq, IN_FLIGHT)
            else:
                inst._remove_decoder(seq, IN_FLIGHT)
        chunks = launch_chunks(plan.prefills)  # computed at once: a prompt with tokens left stays in sight
        for seq, chunk in chunks:
            if chunk.last:
                del inst.prefilling[seq]
                seq.status = IN_FLIGHT
        inst.holds.launched(decoding)
        inst.holds.launched(seq for seq, _ in chunks)
        if inst.spec is not None:  # (drafts per batch size: their next decodes verify the k of this batch)
            inst.spec.propose([*decoding, *(s for s, chunk in chunks if chunk.last)], batch.num_seqs)
        drafts = {s: plan.drafts_of(s) for s in decoding}  # (drafts verified, KV slots taken) of each decode
        if inst.stagger is None:
            inst.in_flight.update((s, slots) for s, (_, slots) in drafts.items())
        else:  # its tokens in flight (drafts counted as accepted), their slots kept with its blocks
            in_flight = inst.in_flight
            for s, (d, slots) in drafts.items():
                in_flight[s] = in_flight.get(s, 0) + 1 + d
                if s._computed + slots > s.reserved_tokens:
                    s.reserved_tokens = s._computed + slots
                s.cache_lag = 0  # (Stagger.cached)
            if plan.padded:  # an admission's placeholder drafts count too
                for s, padding in plan.padded.items():
                    in_flight[s] = in_flight.get(s, 0) + padding
            last = [s for s, chunk in chunks if chunk.last]
            for s in last:
                s.cache_lag = -1  # (Stagger.cached: its prompt's tokens are all known)
            inst.stagger.launched(decoding + last, serial, completion)
        bases = {s: s._computed for s in decoding} if inst.stagger is not None and inst.spec is not None else None
        self.flights.append(Flight(plan, decoding, chunks, inst.now, completion, batch.num_batched_tokens,
                                   {s: 1 + d for s, (d, _) in drafts.items()}, batch.num_seqs,
                                   {s: s.num_preemptions for s in decoding}, bases))

    def _land(self) -> None:
        """The oldest batch's output is back: its sequences return and its plan executes."""
        inst = self.inst
        flight = self.flights.popleft()
        if flight.plan is None:  # an empty batch: nothing to execute, it frees its slot
            self.to_plan = True
            return
        if not any(f.plan is not None for f in self.flights):
            self.flights.clear()  # only empty batches left behind it: each is back already
        inst.holds.landed(flight.decoders)
        inst.holds.landed(seq for seq, _ in flight.chunks)
        lost, bumped = self._drop_stale(flight)
        tokens = flight.tokens - lost
        chunks = flight.chunks
        for seq, chunk in chunks:
            if chunk.last:
                seq.status = PREFILLING
        if chunks:  # back in admission order, as the scheduler walks them
            inst.prefilling = {s: None for s in inst.running if s.status == PREFILLING}
        others = [s for s in inst.running if s.status == DECODING]  # decoding, but not in this batch
        for seq in others:
            inst._remove_decoder(seq, PARKED)
        serial = flight.plan.serial
        if flight.bases is not None:  # its slots counted from its computed tokens now, as _verify reads them
            plan = flight.plan
            for seq in flight.decoders:
                moved = seq._computed - flight.bases[seq]
                if moved:
                    drafts, slots = plan.drafts_of(seq)
                    plan._override(seq, drafts, slots - moved)
        for seq in flight.decoders:
            inst._add_decoder(seq)
            if seq.last_token_ms < inst.itl_merge:  # (its ITL group is its own last token, not a later landing's)
                inst.off_cycle.setdefault(seq, seq.last_token_ms)
            seq.plan_mark = serial  # (planning ahead, a later plan may have marked it too)
        start = flight.launched if flight.launched > self.last_landing else self.last_landing
        if inst.now < start:
            inst._hold_blocks(start)
        inst.now = start
        cost = inst.cost
        cost.step_ms = flight.completion - start
        cost.tokens = tokens
        cost.run = None
        inst.events += 1
        ahead = rewind(chunks)
        inst._execute(flight.plan, INF)
        restore(ahead)
        if inst.spec is not None and flight.seqs:  # the drafter proposed for the batch as launched
            inst.spec_k = inst.spec.k_for(flight.seqs)
        if inst.now < flight.completion:  # a batch of swaps only, or whose requests were all aborted: it waits
            inst._hold_blocks(flight.completion)
            if inst.meter is not None:
                hole_row(inst.meter, inst.rec, inst.index, len(inst.running), len(inst.waiting),
                         inst.kv.num_used_blocks() + inst.held_to_landing)
        inst.held_to_landing = 0
        inst.now = self.now = self.last_landing = flight.completion
        if bumped:
            self._give(bumped, flight.completion)
        if inst.holds.held:
            inst.holds.release(inst.waiting)
        for seq in others:
            inst._add_decoder(seq)
            inst.off_cycle[seq] = seq.last_token_ms
        if inst.stagger is not None:  # still in a batch in flight: back out of sight
            in_flight = inst.in_flight
            padded = flight.plan.padded
            for seq, chunk in chunks:  # an admission's placeholder drafts, all rejected
                padding = padded.get(seq, 0) if padded and chunk.last else 0
                if padding:
                    if in_flight[seq] == padding:
                        del in_flight[seq]
                    else:
                        in_flight[seq] -= padding
            for seq in flight.decoders + [s for s, chunk in chunks if chunk.last]:
                seq.cache_lag = 1  # (Stagger.cached)
                if seq.status == DECODING and seq in in_flight:
                    inst._remove_decoder(seq, IN_FLIGHT)
            for seq in [s for s in in_flight if s.status == FINISHED]:
                del in_flight[seq]
        self.to_plan = True

    def _give(self, bumped: list, t: float) -> None:
        """The landing at ``t`` brings requests preempted while it was in flight (held back since,
        :mod:`schedlab.engine.stages`) the tokens it computed for them (vLLM keeps them), in
        arrival order; one whose last token that is finishes."""
        inst = self.inst
        before = load(inst)
        for b in sorted(bumped, key=lambda b: b.seq.seq_no):
            seq = b.seq
            tokens, accepted = tokens_for(inst.spec, b, seq._generated, seq.target)
            seq._generated += tokens
            count_bumped(inst.counters, b, tokens, accepted)
            inst.token_at(seq, t)
            if seq._generated >= seq.target:
                inst.finish_held(seq, t)
        inst.release.add(t, before, load(inst))

    def _drop_stale(self, flight: Flight) -> tuple[int, list]:
        """Take out of ``flight`` the sequences aborted while it was in the pipeline (their
        blocks and slots are free already; vLLM's ``update_from_output`` skips a finished
        request's output), those preempted since (their blocks are free; a decode, or a prompt
        whose last chunk it holds, still gets what the batch computed for it: returned as
        :class:`~schedlab.engine.stages.Bumped`) and the prompt chunks of sequences preempted
        since (their prompts start over; a partial prefill gives no token). Returns the tokens
        they had in it, and the bumped."""
        in_flight = self.inst.in_flight
        lost = 0
        bumped = []
        gone = set()
        stamps, members = flight.stamps, flight.members
        overshoots = []
        aborted = []
        for seq in flight.decoders:
            if seq.status == ABORTED:
                lost += members[seq]
                gone.add(seq)
                aborted.append((seq, members[seq]))  # (computed all the same: its share is counted apart)
            elif seq.status == FINISHED:  # planning ahead: finished by a batch before, its token thrown away
                overshoots.append(seq)
                gone.add(seq)
                if members[seq] > 1:
                    flight.plan.add_overshoot_drafts(seq, members[seq] - 1)
            elif seq.num_preemptions != stamps[seq]:  # preempted in flight: its blocks are free
                lost += members[seq]
                gone.add(seq)
                bumped.append(Bumped(seq, members[seq] - 1, True))
            elif self.inst.stagger is None or in_flight[seq] == members[seq]:
                del in_flight[seq]
            else:
                in_flight[seq] -= members[seq]
        live = [(seq, chunk) for seq, chunk in flight.chunks if not stale(seq, chunk)]
        dropped = []
        if len(live) < len(flight.chunks):
            lost += sum(chunk.tokens for seq, chunk in flight.chunks if stale(seq, chunk))
            dropped = dropped_chunks(flight.chunks)
            bumped += bumped_chunks(flight.chunks)
            flight.chunks = live
            flight.plan.prefills = [(s, chunk.tokens) for s, chunk in live]
        if overshoots:
            flight.plan.overshoots = tuple(overshoots)
        if gone:
            # a bumped decode's energy stays its request's, as a dropped chunk's does
            dropped += [(b.seq, members[b.seq]) for b in bumped if b.decode] + aborted
            flight.decoders = [s for s in flight.decoders if s not in gone]
            if flight.plan.spec_override:
                flight.plan.spec_override = {s: d for s, d in flight.plan.spec_override.items() if s not in gone}
        if dropped:
            flight.plan.dropped = dropped
        return lost, bumped
