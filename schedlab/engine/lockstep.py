"""Data-parallel ranks of a MoE deployment stepping together, in the fast engine.

vLLM's ``--data-parallel-size D`` (with or without ``--enable-expert-parallel``; SGLang's
``--enable-dp-attention``) runs ``D`` engine cores, each with its own scheduler, KV cache and
requests (a router, vLLM's DP load balancer, picks the rank of each arrival). Their MoE
layers exchange tokens every step, so the ranks step together: while any rank has requests,
every rank runs a step (one with nothing scheduled runs a dummy batch,
``DPEngineCoreProc.run_busy_loop`` / ``execute_dummy_batch``), and the step lasts as long as
the slowest rank's own part (attention, dense layers, its swaps) plus the routed experts of
all ranks' tokens, dispatch and combine included (the cost model's ``rank_ms`` and
``experts_ms``, see :mod:`schedlab.protocols`). When no rank has work, the ranks pause -- at
their next check that none has (``sync``): vLLM's DP engine cores count a wave's steps and
check only at the first and every ``dp_sync_interval``-th (16; vLLM 0.28 and older every 32nd,
not the first: ``DPEngineCoreProc._has_global_unfinished_reqs``), running dummy batches in
between; SGLang's DP attention checks at every step.

Each rank is a fast :class:`~schedlab.engine.instance.Instance` whose cost model is a
:class:`~schedlab.engine.rank_cost.RankCost`: the cluster plans every rank, times the step
from their batches, sets it, and lets each rank execute its plan.

**Bulk runs.** A run of identical decode steps is executed in one go only when every rank's
would be: each rank's plan decodes only and its plugins allow bulk runs (or it is idle and
stays so), and the step time stays linear -- the step is ``max_r(rank part_r(j)) + experts``,
the experts' part is constant in a decode run (tokens do not change), and each rank's part
grows linearly, so the maximum is linear while the same rank stays the slowest: the run ends
before another rank's line crosses it. It also ends at every rank's own events (a finish, a
KV shortage, a wake-up) and at the next arrival. Otherwise the ranks step one at a time.

**Speculative decoding** (``[speculative]``). Each rank drafts and verifies its own sequences:
its batch carries its decodes' drafts (``1 + k`` tokens each through its own layers and
through every rank's experts), its part its drafter's passes
(:class:`~schedlab.drafting.DraftingCostModel`), and its instance draws the acceptance of each
of its sequences as a colocated one does. Such steps are never alike, so the ranks step one at
a time.

**Asynchronous scheduling** (``async_scheduling``, vLLM's default and the preset's): each rank plans a
step while the one before it runs, by :mod:`schedlab.engine.ahead`'s rules; a rank whose plan
made ahead is empty runs a dummy batch in the next step and plans the one after at its own
time, as vLLM's DP engine core does.

**Clocks** (``[clock]``). Every rank steps at one clock: the cost model's ``lockstep_at``
times the step's parts and experts at the fixed clock, or chooses the governor's level from
the whole step (:mod:`schedlab.energy.clock`); a bulk run at a fixed clock holds while each
rank's part stays linear at it (``rank_step_increment``), and the governor steps one at a time.

**Several deployments** (``[cluster] instances = N``): N copies of the deployment behind a
router that picks the deployment of each arrival (:class:`Deployment`: each seen as its ranks
summed); each deployment's own router picks the rank. A deployment's ranks step together and
apart from the other deployments': each :class:`DataParallelCluster` stands in for an instance
with the colocated driver (:func:`schedlab.engine.driver.simulate`), which also autoscales whole
deployments (:func:`schedlab.engine.scaling.deployment_scaling`).

**Energy** (``[power]``). A rank that executes its plan is metered by its instance, its power
model asking the :class:`~schedlab.engine.rank_cost.RankCost` what the step did on its GPUs (its
own part and its share of every rank's experts). A rank that computes nothing in a step -- idle,
or only copying blocks to or from swap space -- runs the dummy batch and is metered here, with a
timeline row (its energy belongs to no request: the meter's ``dummy_j``); over a bulk run its
work does not change and its steps grow as the slowest rank's, so its meter takes the run in
closed form too. When no rank has work, every rank idles.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from ..errors import SimulationError, StallError
from ..protocols import Batch
from . import bulk
from .clock import check_iteration_ms, check_part_ms
from .driver import arrival_queue, route
from .instance import Instance
from .load import Release, RoutingClock, serving, views_of
from .plan import FastPlan
from .rank_cost import DUMMY, NOTHING, RankCost
from .run_limit import limits_running
from .stall import check_kv_released
from .sequence import DECODING

INF = math.inf


def rank_batch(inst: Instance, plan: FastPlan) -> Batch:
    """The batch ``inst`` will execute for ``plan`` (what its ``_execute`` computes, drafts
    included, without changing anything: a plan that leaves decoders out is read, not parked)."""
    if not plan.partial_decode:
        return inst.batch_of(plan, inst.n_decoding if plan.decodes_all else 0)
    batch = inst.batch_of(plan, 0)  # the prompts; then the decodes the plan names
    # (and those whose token is discarded, with their drafts: batch_of counted those)
    contexts = [s.num_computed_tokens + plan.overshoot_tokens(s) for s in plan.overshoots]
    for s in inst.running:
        if s.status == DECODING and s.plan_mark == plan.serial:
            drafts = plan.drafts_of(s)[0]
            batch.spec_tokens += drafts
            contexts.append(s.num_computed_tokens + 1 + drafts)
    batch.num_decode, batch.decode_context_tokens = len(contexts), sum(contexts)
    if contexts and inst.track_range:
        batch.decode_context_max, batch.decode_context_min = max(contexts), min(contexts)
    return batch


def _increment(value) -> tuple[float, float] | None:
    """A cost model's decode increment as ``(increment, steps it holds)``; None: no bulk run."""
    if value is None:
        return None
    inc, valid = value if type(value) is tuple else (value, INF)
    if not inc >= 0.0:
        return None
    return inc, valid


def _every_rank(name: str) -> property:
    """A deployment's attribute ``name``: read from its first rank, set on every rank."""
    def put(self, value) -> None:
        for r in self.members:
            setattr(r, name, value)

    return property(lambda self: getattr(self.members[0], name), put)


class Count:
    """A number that answers ``len()``: a deployment's waiting or running requests, summed over
    its ranks, where a router's view reads ``len(instance.waiting)``."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


class DeploymentKV:
    """A deployment's KV caches as one, for the routers and autoscalers that look at deployments:
    blocks in use, free and in all, summed over its ranks."""

    __slots__ = ("ranks",)

    def __init__(self, ranks: Sequence):
        self.ranks = ranks

    @property
    def num_blocks(self) -> int:
        return sum(r.kv.num_blocks for r in self.ranks)

    @property
    def block_size(self) -> int:
        return self.ranks[0].kv.block_size

    def num_used_blocks(self) -> int:
        return sum(r.kv.num_used_blocks() for r in self.ranks)

    def num_free_blocks(self) -> int:
        return sum(r.kv.num_free_blocks() for r in self.ranks)

    @property
    def reset_prefix_cache(self):
        """Every rank's cache reset, for an autoscaled deployment that went off (a restart starts
        cold, :mod:`schedlab.engine.scaling`); None when the ranks' caches cannot be reset (all
        ranks have the same kind)."""
        resets = [getattr(r.kv, "reset_prefix_cache", None) for r in self.ranks]
        if any(reset is None for reset in resets):
            return None

        def reset_every_rank() -> None:
            for reset in resets:
                reset()
        return reset_every_rank


#: pause as soon as no rank has work: every step checks (``(dp_sync_interval, check the first step)``)
EVERY_STEP = (1, False)


class NoPlan:
    """A rank's plan in a step of a wave's tail (no rank has work; they step until their next
    check): nothing scheduled, a dummy batch."""

    num_scheduled_tokens = 0
    swapped_in = ()
    preempted = ()
    transfer_ms = 0.0
    wake = None

    @staticmethod
    def is_empty() -> bool:
        return True


NO_PLAN = NoPlan()


class Deployment:
    """What a router over several data-parallel deployments, the driver and an autoscaler read of
    one deployment -- either engine's ranks stepping together (``self.members``) -- as of a
    plain instance (:class:`~schedlab.engine.load.InstanceView`): its ranks' requests and KV
    blocks summed, and what its last step gives back at its end (:attr:`release`, refreshed by
    :meth:`_released` after each step: the ranks all end a step together). What the driver sets
    on an instance goes to every rank."""

    pending = None  # no pending runs: the routers' views read the ranks' steps as they are
    index = 0       # the deployment's number in the run (its ranks have their own)
    #: autoscaled, draining with a drain timeout (:mod:`schedlab.engine.drain`): every rank aborts
    #: what it holds at the ranks' first step at or after this time (inf: none)
    drain_at = INF
    #: its ranks planned nothing and will not step before this time unless a request arrives (a
    #: batching window's wake-up): the closed-loop driver may run other units up to it (None: not
    #: known to be waiting)
    waits_until = None

    def _init_deployment(self, index: int, sync: tuple[int, bool] = EVERY_STEP) -> None:
        self.index = index
        self.release = Release()
        self.kv = DeploymentKV(self.members)
        self.sync_interval, self.sync_first = sync
        self.wave_steps = 0  # steps since the ranks last paused (vLLM's step_counter)

    def in_wave_tail(self) -> bool:
        """Whether the ranks step on after the last step even with no work: its count is not one
        at which they check that no rank has work (vLLM: the wave's first step, with
        ``sync_first``, and every ``sync_interval``-th)."""
        steps = self.wave_steps
        return bool(steps % self.sync_interval) and not (steps == 1 and self.sync_first)

    def _count_steps(self, k: int) -> None:
        """``k`` steps have run: counted in the wave, which ends -- the ranks pause, the count starts
        over -- if no rank has work at a check (``DPEngineCoreProc.run_busy_loop``)."""
        self.wave_steps += k
        if not self.in_wave_tail() and not self.has_work():
            self.wave_steps = 0

    @property
    def outstanding(self) -> int:
        return sum(r.outstanding for r in self.members)

    @property
    def waiting(self) -> Count:
        return Count(sum(len(r.waiting) for r in self.members))

    @property
    def running(self) -> Count:
        return Count(sum(serving(r) for r in self.members))

    def has_work(self) -> bool:
        return any(r.has_work() for r in self.members)

    @property
    def aborts(self) -> bool:
        return any(r.aborts for r in self.members)

    def drain_by(self, t: float) -> None:
        """Autoscaled, draining: every rank aborts what it holds at the first step at or after
        ``t`` (a drain timeout, :mod:`schedlab.engine.drain`; inf: none, a timer cancelled)."""
        self.drain_at = t

    @property
    def drain_aborted(self) -> int:
        """Requests a drain timeout aborted on the deployment's ranks."""
        return sum(r.drain_aborted for r in self.members)

    def _drain_due(self) -> None:
        """At a step's plans (``self.now``): once the drain timeout has come, every rank aborts
        what it holds, as if each client's abort reached it now."""
        if self.drain_at <= self.now:
            self.drain_at = INF
            for r in self.members:
                r.drain_kill()

    def _released(self, start: float) -> None:
        """The step from ``start`` has run, to ``self.now``: what its ranks' iterations give back
        at its end (a rank that ran a dummy batch recorded nothing)."""
        rel = self.release
        rel.at = self.now
        rel.requests = rel.running = rel.blocks = 0
        for r in self.members:
            own = r.release
            if own.at > start:
                rel.requests += own.requests
                rel.running += own.running
                rel.blocks += own.blocks

    def _stall_message(self, why: str) -> str:
        busy = next((r for r in self.members if r.has_work()), self.members[0])
        return busy._stall_message(why)

    hangup_ms = _every_rank("hangup_ms")
    track_finished = _every_rank("track_finished")
    plan_finishes_alone = _every_rank("plan_finishes_alone")
    on_request_done = _every_rank("on_request_done")
    closed_loop = _every_rank("closed_loop")


class DataParallelCluster(Deployment):
    """Data-parallel ranks (fast instances) behind a router, stepping together.

    Alone, :func:`simulate_data_parallel` runs it. As one of several deployments behind a router
    (``[cluster] instances``), it stands in for an instance with the colocated driver
    (:func:`schedlab.engine.driver.simulate`, event by event, autoscaled or not): it plans every
    rank at the end of each step (:meth:`next_event`), at an arrival routed to it
    (:meth:`catch_up`), or -- when no rank planned anything -- at the first wake-up time or abort
    of its ranks; an arrival routed elsewhere does not wake it. A run of steps ends at the next
    arrival to the cluster, wherever it goes.

    :param ranks: the ranks, each an :class:`Instance` whose cost model is a :class:`RankCost`.
    :param router: picks the rank of each arrival (required for more than one rank).
    :param index: the deployment's number among several.
    """

    def __init__(self, ranks: Sequence[Instance], router=None, index: int = 0, sync: tuple[int, bool] = EVERY_STEP):
        if len(ranks) > 1 and router is None:
            raise ValueError("several data-parallel ranks need a router")
        for inst in ranks:
            if not isinstance(inst.cost, RankCost):
                raise TypeError("a data-parallel rank's cost model must be a RankCost")
            # an abort during a step drops its output, as on one engine core (EngineCore.step), and
            # planning ahead it comes after the plan made at the step's start (engine.ahead)
            inst.aborts_drop_output = inst.aborts_drop_output
        self.ranks = self.members = list(ranks)
        self.router = router
        self._init_deployment(index, sync)
        self.asleep = False      # as one of several deployments: no rank planned anything ...
        self.sleep_wake = INF    # ... until this time (inf: until an arrival)
        self.costs = [inst.cost for inst in self.ranks]
        self.inner = [c.inner for c in self.costs]
        self._clock = RoutingClock()
        self._views = views_of(self.ranks, self._clock)
        self.now = 0.0
        self._dummy_ms = [check_iteration_ms(c.rank_ms(DUMMY), DUMMY, "rank_ms") for c in self.inner]
        # [clock]: the step's clock, and a rank part's growth at it (schedlab.energy.clock)
        self._step_clock = getattr(self.inner[0], "lockstep_at", None)
        self._increments = [getattr(c, "rank_step_increment", None) or getattr(c, "decode_step_increment", None)
                            for c in self.inner]
        if self.inner[0].experts_ms((1,) * len(self.ranks)) is None:
            raise SimulationError("the ranks of a dense model do not step together: serve it as instances "
                                  "behind a router")
        # What the run did, for its results (meta["data_parallel"]).
        self.steps = 0
        self.dummy_steps = 0     # (rank, step) pairs that ran a dummy batch
        self.experts_ms = 0.0    # time of the steps spent in the routed experts' layers

    # -- arrivals ------------------------------------------------------------------------------
    def arrive(self, request, seq_no: int) -> Instance:
        """Route ``request`` to a rank (seeing every rank as it is at its arrival)."""
        self.waits_until = None
        if self.router is not None:
            self._clock.now = request.arrival_ms
            target = self.ranks[route(self.router, request, self._views)]
        else:
            target = self.ranks[0]
        target.arrive(request, seq_no)
        return target

    def next_abort(self) -> float:
        """When a rank next aborts a request whose client gave up (inf: none pending)."""
        return min((inst.next_abort() for inst in self.ranks if inst.aborts), default=INF)

    # -- the loop --------------------------------------------------------------------------------
    def advance(self, until: float, stop_on_finish: bool = False) -> str:
        """Run every step that starts before ``until``; returns ``"until"``, ``"idle"`` (no
        rank has work), ``"finished"`` (after a step in which requests finished, with
        ``stop_on_finish``) or ``"blocked"`` (work is left, nothing is planned, no wake-up)."""
        empty = 0
        self.waits_until = None
        while self.now < until:
            self._drain_due()
            for inst in self.ranks:  # each engine core reads its aborts before it plans
                if inst.aborts and inst.next_abort() <= self.now and not inst._aborts_at_plan_time():
                    inst._abort_due()  # (planning ahead, the plan does: Instance._plan_ahead)
            if not self.has_work():
                if self.in_wave_tail():  # no work, but the ranks step on to their next check
                    self._step([NO_PLAN] * len(self.ranks), until)
                    continue
                if until < INF:
                    self._move_to(until)
                return "idle"
            plans, dummy_step = self._plan_ranks()
            if dummy_step:
                self._step(plans, until)
                continue
            if all(p.is_empty() for p in plans):
                if not self.has_work():
                    continue  # (planning ahead freed the last finished requests' slots)
                empty += 1
                if empty > 1000:
                    raise StallError(self.ranks[0]._stall_message("the schedulers keep planning empty steps"))
                wake = min((p.wake for p in plans if p.wake is not None), default=INF)
                if any(p.preempted for p in plans) or wake <= self.now:
                    continue  # plan again at once
                quiet = min(wake, self.next_abort(), self.drain_at)  # an abort may free what a rank waits for
                target = min(quiet, until)
                if target == INF:
                    return "blocked"
                if until < quiet:  # (the closed-loop driver may run the others up to then: waits_until)
                    self.waits_until = quiet
                self._move_to(target)
                continue
            empty = 0
            self._step(plans, until)
            if stop_on_finish and any(inst.finished for inst in self.ranks):
                return "finished"
        return "until"

    # -- one deployment among several, event by event (schedlab.engine.driver.simulate) ---------------
    def next_event(self) -> tuple[float, int]:
        """As :meth:`Instance.next_event`: ``(t, 1)`` -- the ranks plan at ``t`` (after an arrival
        then), the end of the last step or, asleep, the first wake-up or abort; ``(inf, 1)``: it
        waits for an arrival."""
        if not self.has_work():
            return (self.now, 1) if self.in_wave_tail() else (INF, 1)
        return (min(self.sleep_wake, max(self.drain_at, self.now)) if self.asleep else self.now), 1

    def act_until(self, t: float) -> tuple[float, int]:
        """Step while the ranks plan before an arrival at ``t``; the next event then."""
        while True:
            event = self.next_event()
            if event[0] >= t:
                return event
            self._plan_step(t)

    def catch_up(self, t: float) -> None:
        """A request routed here arrives at ``t``: ranks between steps wait until then (in a
        step, the request joins the next)."""
        self.asleep = False
        if t > self.now:
            self._move_to(t)

    def settle(self, t: float) -> None:
        """Before requests arriving at ``t`` are routed: ranks between steps at ``t`` (asleep until
        then, at the latest) abort what is due (routers see the aborted requests gone)."""
        if self.next_abort() <= t:
            if self.asleep and self.sleep_wake <= t:
                self.catch_up(t)
            if self.now == t:
                for inst in self.ranks:
                    inst.settle(t)

    def _plan_step(self, until: float) -> None:
        """At :meth:`next_event`'s time: abort what is due, plan every rank and run the step (a
        run of them ending before ``until``), or sleep until a rank's wake-up or abort."""
        if self.asleep:
            self.catch_up(min(self.sleep_wake, self.drain_at))
        empty = 0
        while True:
            self._drain_due()
            for inst in self.ranks:
                if inst.aborts and inst.next_abort() <= self.now and not inst._aborts_at_plan_time():
                    inst._abort_due()  # (planning ahead, the plan does: Instance._plan_ahead)
            if not self.has_work():
                if self.in_wave_tail():  # no work, but the ranks step on to their next check
                    self._step([NO_PLAN] * len(self.ranks), until)
                return
            plans, dummy_step = self._plan_ranks()
            if dummy_step or not all(p.is_empty() for p in plans):
                self._step(plans, until)
                return
            if not self.has_work():
                return  # (planning ahead freed the last finished requests' slots)
            empty += 1
            if empty > 1000:
                raise StallError(self.ranks[0]._stall_message("the schedulers keep planning empty steps"))
            wake = min((p.wake for p in plans if p.wake is not None), default=INF)
            if not (any(p.preempted for p in plans) or wake <= self.now):
                self.asleep, self.sleep_wake = True, min(wake, self.next_abort())
                return

    def _plan_ranks(self) -> tuple[list, bool]:
        """Every rank's plan for the next step -- made ahead under asynchronous scheduling
        (:mod:`schedlab.engine.ahead`) -- and whether the ranks must run a dummy step though
        every plan is empty: one was made ahead and work is left (vLLM's DP engine core runs a
        dummy pass after scheduling nothing ahead, before it schedules again)."""
        plans, ahead = [], False
        for inst in self.ranks:
            if inst.ahead is None:
                plans.append(inst._plan())
            else:
                ahead = ahead or inst.ahead.made_ahead(inst.now)
                plans.append(inst._plan_ahead())
        dummy_step = ahead and all(p.is_empty() for p in plans) and self.has_work()
        return plans, dummy_step

    def _move_to(self, t: float) -> None:
        """Every rank waits, holding its blocks, until ``t`` (the end of a step: ranks that
        executed it are there already, but for rounding)."""
        for inst in self.ranks:
            if inst.now < t:
                inst._hold_blocks(t)
            inst.now = t
        self.now = t

    def _step(self, plans: list, until: float) -> None:
        ranks, inner = self.ranks, self.inner
        abort = self.next_abort()
        if abort < until:  # an abort, like an arrival, ends a run of steps
            until = abort
        if self.drain_at < until:  # so does a drain timeout, at the first step's end at or after it
            until = self.drain_at
        working = [not p.is_empty() for p in plans]
        batches = [rank_batch(inst, p) if w else DUMMY for inst, p, w in zip(ranks, plans, working)]
        # a rank computing nothing (idle, or only swapping) runs the dummy batch (and its swaps)
        parts = [(check_iteration_ms(inner[r].rank_ms(b), b, "rank_ms") if b.num_batched_tokens else self._dummy_ms[r])
                 + plans[r].transfer_ms
                 for r, b in enumerate(batches)]
        tokens = tuple(b.num_batched_tokens or 1 for b in batches)
        experts = check_part_ms(inner[0].experts_ms(tokens), f"tokens {tokens} (rank by rank)", "experts_ms")
        ratio = 1.0
        if self._step_clock is not None:  # one clock for the step, every rank's part and the experts at it
            own = [b if b.num_batched_tokens else DUMMY for b in batches]
            ratio, parts, experts = self._step_clock(own, tokens, parts, experts)
        d0 = max(parts) + experts
        k, inc = self._run(plans, working, batches, parts, d0, until)
        start = self.now
        for r, inst in enumerate(ranks):
            cost = self.costs[r]
            cost.step_tokens, cost.experts_ms, cost.dummy, cost.ratio = tokens, experts, False, ratio
            if working[r]:
                cost.step_ms = d0 - plans[r].transfer_ms
                cost.tokens = batches[r].num_batched_tokens
                cost.run = (inc, k) if k > 1 else None
                inst.events += 1
                inst._execute(plans[r], until)
        total = bulk.run_ms(k, d0, inc) if k > 1 else d0
        for r, inst in enumerate(ranks):
            if inst.meter is not None and not (working[r] and batches[r].num_batched_tokens):
                _meter_dummy(inst, self.costs[r], start, plans[r].transfer_ms if working[r] else 0.0, k, d0, inc,
                             total)
        self._move_to(start + total)
        for r, inst in enumerate(ranks):
            if working[r] and inst.ahead is not None:  # (the steps' end, whatever the rank's rounding)
                inst.ahead.ran(start + bulk.run_ms(k - 1, d0, inc) if k > 1 else start, self.now)
        self._released(start)
        self.steps += k
        self.dummy_steps += k * working.count(False)
        self.experts_ms += k * experts
        self._count_steps(k)

    def _run(self, plans, working, batches, parts, d0: float, until: float) -> tuple[int, float]:
        """How many identical steps to run from here, and each one's growth (see the module
        docstring); ``(1, 0.0)`` when the ranks step one at a time."""
        if not any(working):
            return 1, 0.0  # a dummy step after plans made ahead came out empty
        lines = []  # (rank part at the first step, its increment, steps it holds)
        for r, inst in enumerate(self.ranks):
            plan = plans[r]
            if inst.ahead is not None and not inst.ahead.settled:
                return 1, 0.0  # its next plan may differ (engine.ahead)
            if inst.to_finish:
                return 1, 0.0  # a request aborted runs once more, then leaves
            if inst.track_finished and inst.finished:
                # the plan turned a request away (SGLang's waiting timeout): a closed loop releases its
                # client's next one after this step, as the reference engine does -- not after a run
                return 1, 0.0
            if not working[r]:
                if inst.has_work() and (not inst.bulk_ok or (inst.ahead is not None and inst.ahead.made_ahead(inst.now))):
                    # an idle rank whose scheduler may change its mind any step, or one whose plan
                    # made ahead came out empty: it plans the step after this one at its own time
                    return 1, 0.0
                lines.append((parts[r], 0.0, INF))
                continue
            increment = self._increments[r]  # (None: speculation's cost model, whose steps are all unlike)
            if not (increment is not None and inst.bulk_ok and inst.n_decoding and plan.is_decode_only()):
                return 1, 0.0
            line = _increment(increment(batches[r]))
            if line is None:
                return 1, 0.0
            lines.append((parts[r], *line))
        a = max(range(len(lines)), key=lambda r: lines[r][:2])
        top, inc, _ = lines[a]
        k = INF
        for r, (part, grows, valid) in enumerate(lines):
            k = min(k, valid)
            if r != a and grows > inc:  # this rank's line overtakes the slowest's after ...
                j = math.floor((top - part) / (grows - inc))
                while j > 0 and top + j * inc < part + j * grows:
                    j -= 1
                k = min(k, j + 1)
        if k <= 1:
            return 1, 0.0
        for r, inst in enumerate(self.ranks):
            plan = plans[r]
            if working[r]:
                k = min(k, inst._run_length(plan, d0, inc, until, inst.decode_growth()))
            else:
                if plan.wake_steps is not None:
                    k = min(k, plan.wake_steps)
                if plan.wake is not None:
                    k = min(k, bulk.steps_before(self.now, plan.wake, d0, inc) if plan.wake > self.now else 1)
        abort = self.next_abort()
        if k > 1 and abort < INF and any(inst._drops_output() for inst in self.ranks):
            # an abort during a step drops its output: only a lone first step may hold it
            k = self.ranks[0]._ending_before(abort, int(k), d0, inc)
        return (int(k), inc) if k > 1 else (1, 0.0)

    def take_finished(self) -> list:
        done = []
        for inst in self.ranks:
            done.extend(inst.take_finished())
        return done


def _meter_dummy(inst: Instance, cost: RankCost, start: float, swap_ms: float, k: int, d0: float, inc: float,
                 total: float) -> None:
    """Meter ``k`` steps (``total`` ms from ``start``) in which ``inst`` ran the dummy batch --
    after its swaps, ``swap_ms`` of a single step it executed itself -- and give them a timeline
    row: its GPUs computed the dummy and their share of the others' experts."""
    cost.dummy = True
    if swap_ms:
        start, d0, total = start + swap_ms, d0 - swap_ms, total - swap_ms
    energy = inst.meter.dummy(start, NOTHING, k, d0, inc, total)
    if inst.rec.keep_timeline:
        inst.rec.sample(start, inst.index, len(inst.running), len(inst.waiting), inst.kv.num_used_blocks(), total, k,
                        NOTHING, energy)


def simulate_data_parallel(requests: Iterable, cluster: DataParallelCluster, *, workload=None,
                           client_side=None) -> None:
    """Run a :class:`DataParallelCluster` until every request has finished, been rejected or
    been aborted.

    Arrivals are routed in time order, each seeing the ranks as they are then; the ranks run
    every step that starts before the next arrival. A closed-loop workload's follow-ups are
    released after each step that finished requests. With a ``client_side``
    (:mod:`schedlab.frontend`) requests reach the ranks through the API server, and a rank
    aborts a request whose client gave up before its next step, as a colocated instance does;
    a run of steps ends at the next abort. Between steps at an arrival's time the ranks abort
    what is due before the router looks.
    """
    closed = workload is not None and getattr(workload, "closed_loop", False)
    for inst in cluster.ranks:
        inst.track_finished = closed
        if client_side is not None:
            inst.hangup_ms = client_side.network_ms
    arrivals = arrival_queue(requests, workload, client_side)
    # (or a scheduler's running time limit aborts requests: engine.run_limit)
    aborting = (client_side is not None and client_side.client is not None and client_side.client.gives_up
                or limits_running(cluster.ranks))
    delivered = 0
    while True:
        t = arrivals.next_time()
        status = cluster.advance(t, stop_on_finish=closed)
        if closed:
            _release(cluster, arrivals)
            if status == "finished":
                continue
        if status == "blocked" and t == INF:
            busy = next(inst for inst in cluster.ranks if inst.has_work())
            raise StallError(busy._stall_message("no arrivals are left and the scheduler plans nothing"))
        if t == INF:
            check_kv_released(cluster.ranks)
            return
        if aborting and cluster.now == t:
            for inst in cluster.ranks:
                inst.settle(t)
        while arrivals.next_time() <= t:
            request = arrivals.pop(t)
            if request is None:  # an event of the client side (a reception, a client giving up)
                continue
            cluster.arrive(request, delivered)
            delivered += 1
            if request.timeout_ms is not None:
                aborting = True
            if closed:
                _release(cluster, arrivals)  # a request rejected at once releases its successor


def _release(cluster: DataParallelCluster, arrivals) -> None:
    for request, finished_at in cluster.take_finished():
        arrivals.finished(request, finished_at)


def deployments_summary(deployments: Sequence) -> dict:
    """What several data-parallel deployments (either engine's) did, for a run's
    ``meta["data_parallel"]``: ranks per deployment, and the steps, dummy rank-steps and experts'
    time of each (``per_deployment``) and of all together."""
    each = [{"steps": d.steps, "dummy_rank_steps": d.dummy_steps, "experts_ms": d.experts_ms} for d in deployments]
    return {"deployments": len(deployments), "ranks": len(deployments[0].members),
            **{key: sum(e[key] for e in each) for key in ("steps", "dummy_rank_steps", "experts_ms")},
            "per_deployment": each}
