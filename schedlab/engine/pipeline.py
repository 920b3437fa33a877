"""A pipelined instance in the fast engine: several batches in flight, one per stage.

The rules and their vLLM sources are in :mod:`schedlab.engine.stages`. A
:class:`PipelinedInstance` wraps a fast :class:`~schedlab.engine.instance.Instance` (whose cost
model is a :class:`~schedlab.engine.rank_cost.RankCost`) and stands in for it with the driver
(:func:`schedlab.engine.driver.simulate` runs it like any instance):

* **launch** (at the instance's time): the scheduler plans a batch from the sequences that are
  not in flight; the batch's KV slots are taken then (the plan does it), its stage times come
  from the cost model's ``pipeline_ms`` (its swaps lengthen the first stage) and the stages'
  clock gives its completion; its sequences then sit out, marked in flight. Batches are
  launched until ``pipeline_parallel`` are in flight or a plan comes back empty;
* **landing** (at the oldest batch's completion, in launch order): its sequences come back and
  the instance executes the batch's plan then -- tokens, first tokens, finishes -- over the
  time since the previous landing (or its launch, if later), so the instance's busy time and
  KV integrals cover each moment once. Then it launches again.

Arrivals wait for the next landing (vLLM blocks on the oldest batch). The pipeline runs one
batch at a time: no bulk decode runs.
"""

from __future__ import annotations

import math
from collections import deque

from ..errors import SimulationError, StallError
from .instance import Instance
from .lockstep import rank_batch
from .plan import FastPlan
from .rank_cost import RankCost
from .sequence import DECODING, PARKED, PREFILLING
from .stages import IN_FLIGHT, StageClock, VisibleRunning

INF = math.inf


class Flight:
    """A batch in the pipeline."""

    __slots__ = ("plan", "decoders", "prefills", "launched", "completion", "tokens")

    def __init__(self, plan, decoders, prefills, launched, completion, tokens):
        self.plan = plan
        self.decoders = decoders    # sequences decoding in it (they come back decoding)
        self.prefills = prefills    # sequences with a prompt chunk in it
        self.launched = launched
        self.completion = completion
        self.tokens = tokens


class PipelinedInstance:
    """A fast instance whose batches go through ``stages`` pipeline stages."""

    pending = None  # no pending decode runs (the routers' views ask): batches land one at a time

    def __init__(self, inst: Instance, stages: int):
        if not isinstance(inst.cost, RankCost):
            raise TypeError("a pipelined instance's cost model must be a RankCost")
        if inst.spec is not None:
            raise SimulationError("speculative decoding with pipeline parallelism is not modelled")
        self.inst = inst
        self.stages = stages
        self.clock = StageClock(stages)
        self.flights: deque[Flight] = deque()
        self.now = 0.0            # when the instance acts next: plans, or lands its oldest batch
        self.to_plan = True       # a launch is due at ``now`` (else the oldest batch lands at ``now``)
        self.last_landing = -INF
        self._blocked = False      # planned nothing, with no wake-up: waits for an arrival
        inst.running_view = VisibleRunning(inst.running)
        self._pipeline_ms = inst.cost.inner.pipeline_ms
        # Every batch is timed at its launch, from its own decoders (below): the instance's
        # lazily pruned heaps of context anchors would only fill up as decoders leave and come back.
        self._needs_range = inst.track_range
        inst.track_range = False

    # -- what the driver and the routers read (an Instance's interface) ---------------------------
    @property
    def index(self) -> int:
        return self.inst.index

    @property
    def outstanding(self) -> int:
        return self.inst.outstanding

    @property
    def waiting(self):
        return self.inst.waiting

    @property
    def running(self):
        return self.inst.running

    @property
    def kv(self):
        return self.inst.kv

    @property
    def release(self):
        return self.inst.release

    @property
    def events(self) -> int:
        return self.inst.events

    @property
    def finished(self) -> list:
        return self.inst.finished

    @property
    def track_finished(self) -> bool:
        return self.inst.track_finished

    @track_finished.setter
    def track_finished(self, value: bool) -> None:
        self.inst.track_finished = value

    def arrive(self, request, seq_no: int):
        if request.timeout_ms is not None:  # a run's [client] is refused with pipelines; a request's own too
            raise SimulationError(f"request {request.id} has a client timeout: clients giving up are not "
                                  "simulated with pipeline parallelism")
        return self.inst.arrive(request, seq_no)

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
        if self._blocked or not self.inst.has_work():
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
        while True:
            if not self.to_plan:
                if self.now > until:
                    return "until"
                self._land()
                if stop_on_finish and inst.finished:
                    return "finished"
                continue
            if self.now >= until:
                return "until"
            inst.now = self.now
            plan = None
            while len(self.flights) < self.stages:
                plan = self._plan()
                if plan.is_empty():
                    break
                self._launch(plan)
                plan = None
            if self.flights:
                self.to_plan = False
                self.now = self.flights[0].completion
                continue
            # nothing in flight and nothing planned: wait for the plan's wake-up time (or ``until``)
            if not inst.has_work():
                if until < INF:
                    inst.now = self.now = until
                return "idle"
            empty += 1
            if empty > 1000:
                raise StallError(inst._stall_message("the scheduler keeps planning empty iterations"))
            wake = plan.wake if plan.wake is not None else INF
            target = until if until < wake else wake
            if plan.preempted or target <= self.now:
                continue
            if target == INF:
                return "blocked"
            inst._hold_blocks(target)
            inst.now = self.now = target

    def _plan(self) -> FastPlan:
        inst = self.inst
        inst.serial += 1
        plan = FastPlan(inst, inst.serial)
        inst.scheduler.schedule(plan)
        return plan

    def _launch(self, plan: FastPlan) -> None:
        """Time ``plan`` through the stages and take its sequences out until it lands."""
        inst = self.inst
        serial = plan.serial
        batch = rank_batch(inst, plan)
        decoding = [s for s in inst.running if s.status == DECODING and (plan.decodes_all or s.plan_mark == serial)]
        if self._needs_range and decoding:
            contexts = [s.num_computed_tokens + 1 for s in decoding]
            batch.decode_context_max, batch.decode_context_min = max(contexts), min(contexts)
        stage_ms, send_ms = self._pipeline_ms(batch) if batch.num_batched_tokens else ((0.0,) * self.stages, 0.0)
        if plan.transfer_ms:  # swaps before the first stage; the batch's time then includes them
            stage_ms = (stage_ms[0] + plan.transfer_ms, *stage_ms[1:])
            plan.transfer_ms = 0.0
        completion = self.clock.launch(inst.now, stage_ms, send_ms)
        for seq in plan.swapped_in:  # joined the decode set in this plan: its ITL group is its own last token
            inst.off_cycle.setdefault(seq, seq.last_token_ms)
        for seq in decoding:
            inst._remove_decoder(seq, IN_FLIGHT)
        prefills = [seq for seq, _ in plan.prefills]
        for seq in prefills:
            del inst.prefilling[seq]
            seq.status = IN_FLIGHT
        self.flights.append(Flight(plan, decoding, prefills, inst.now, completion, batch.num_batched_tokens))

    def _land(self) -> None:
        """The oldest batch's output is back: its sequences return and its plan executes."""
        inst = self.inst
        flight = self.flights.popleft()
        for seq in flight.prefills:
            seq.status = PREFILLING
        if flight.prefills:  # back in admission order, as the scheduler walks them
            inst.prefilling = {s: None for s in inst.running if s.status == PREFILLING}
        others = [s for s in inst.running if s.status == DECODING]  # decoding, but not in this batch
        for seq in others:
            inst._remove_decoder(seq, PARKED)
        for seq in flight.decoders:
            inst._add_decoder(seq)
        start = flight.launched if flight.launched > self.last_landing else self.last_landing
        if inst.now < start:
            inst._hold_blocks(start)
        inst.now = start
        cost = inst.cost
        cost.step_ms = flight.completion - start
        cost.tokens = flight.tokens
        cost.run = None
        inst.events += 1
        inst._execute(flight.plan, INF)
        if inst.now < flight.completion:  # a batch of swaps only: its copies, then it waits
            inst._hold_blocks(flight.completion)
        inst.now = self.now = self.last_landing = flight.completion
        for seq in others:
            inst._add_decoder(seq)
            inst.off_cycle[seq] = seq.last_token_ms
        self.to_plan = True
