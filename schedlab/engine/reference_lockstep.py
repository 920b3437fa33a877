"""Data-parallel ranks stepping together, in the reference engine: one step at a time.

The rules (and vLLM's code they follow) are in :mod:`schedlab.engine.lockstep`; here they are
written out plainly for the differential tests. Every step: each rank plans; if none planned
anything, the ranks wait for the first wake-up or arrival (or plan again at once after a
preemption); otherwise every rank's part is timed -- its batch's ``rank_ms`` plus its swaps,
or a dummy batch's -- and the step lasts the largest part plus the cost model's
``experts_ms`` of every rank's tokens. Ranks with work execute their plans over it; all ranks
end the step together. With ``[power]`` each step of a rank that computed no token (the dummy
batch, after its swaps if it had any) is metered and gets a timeline row: its GPUs ran the
dummy and their share of the others' experts (:class:`~schedlab.engine.rank_cost.RankCost`).
With ``[clock]`` every step runs at the one clock the cost model's ``lockstep_at`` gives it
(:mod:`schedlab.energy.clock`), its parts and experts timed at it. With ``[speculative]`` a
rank's batch holds its decodes' drafts and its part its drafter's passes; each rank draws its
sequences' acceptance as a colocated engine does. With asynchronous scheduling each rank plans
ahead (:mod:`schedlab.engine.ahead`); when every plan is empty and one was made ahead, the
ranks run a dummy step if work is left. When no rank has work after a step whose count in the
wave is not one at which the ranks check (``sync``: vLLM's ``dp_sync_interval``), every rank
runs a dummy step; at a check they pause and the count starts over.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..errors import StallError
from .clock import check_iteration_ms, check_part_ms
from .load import views_of
from .lockstep import EVERY_STEP, NO_PLAN, Deployment
from .rank_cost import DUMMY, NOTHING
from .reference import RefPlan, ReferenceEngine
from .reference_cluster import PlanOrder, ReferenceCluster, _routed

INF = math.inf


def _is_empty(plan: RefPlan) -> bool:
    return not plan.num_scheduled_tokens and not plan.swapped_in and plan.transfer_ms == 0.0


class ReferenceDataParallel(ReferenceCluster, Deployment):
    """Reference ranks (each with a :class:`~schedlab.engine.rank_cost.RankCost`) behind a router.

    Alone, its loop -- arrivals, the client side's events and deadlines, aborts due before a
    routing -- is :class:`ReferenceCluster`'s; its plans are the ranks' steps together
    (:class:`_Steps`). Before every step each rank aborts what is due, as an engine core reads
    its aborts. As one of several deployments (:class:`ReferenceDeployments`) it is an instance
    of that loop: it steps at :meth:`next_plan_time`, an arrival routed to it wakes it, and one
    routed elsewhere does not.
    """

    def __init__(self, ranks: Sequence[ReferenceEngine], router=None, client_side=None, index: int = 0,
                 sync: tuple[int, bool] = EVERY_STEP):
        if len(ranks) > 1 and router is None:
            raise ValueError("several data-parallel ranks need a router")
        super().__init__(ranks, router, client_side=client_side)
        for e in self.instances:
            # an abort during a step drops its output, as on one engine core (EngineCore.step), and
            # planning ahead it comes after the plan made at the step's start (engine.ahead)
            e.aborts_drop_output = e.aborts_drop_output
        self.members = self.instances
        self._init_deployment(index, sync)
        self.views = views_of(self.instances, self.clock)  # read afresh at each routing
        self.plans = _Steps(self)
        self.now = 0.0
        self.asleep_until = None  # every rank planned nothing: the step waits for this time (or an event)
        self.empty = 0
        self.steps = 0
        self.dummy_steps = 0
        self.experts_ms = 0.0

    def deliver(self, request, seq_no: int, t: float) -> None:
        _routed(self.router, request, self.instances, self.views, self.clock, t).arrive(request, seq_no)

    def changed(self, inst) -> None:
        pass  # the ranks' views are read afresh; the next step is _Steps's to find

    def deliver_other(self, t: float) -> None:
        """An event at ``t`` finds the ranks between steps: they wait until then together."""
        self._wait_until(t)

    def next_step_time(self) -> float:
        """When the ranks step next: now, or after a step in which nobody planned anything, at
        the first wake-up or abort (inf: only an event wakes them)."""
        if not any(e.has_work() for e in self.instances):
            return self.now if self.in_wave_tail() else INF  # (the ranks step on to their next check)
        if self.asleep_until is None:
            return self.now
        aborts = [at for e in self.instances for at, _, seq in e.aborts if seq.status not in ("finished", "aborted")]
        return max(min([self.asleep_until, self.drain_at] + aborts), self.now)

    def wake(self, t: float) -> None:
        self._wait_until(t)

    # -- one deployment among several (ReferenceDeployments) ------------------------------------------
    def next_plan_time(self) -> float:
        return self.next_step_time()

    def settle(self, t: float) -> None:
        """Before requests arriving at ``t`` are routed: ranks between steps (or asleep) by ``t``
        wait until then and abort what is due."""
        if self.now <= t and any(at <= t and seq.status not in ("finished", "aborted")
                                 for e in self.instances for at, _, seq in e.aborts):
            self._wait_until(t)
            for e in self.instances:
                e.settle(t)

    def _wait_until(self, t: float) -> None:
        if t > self.now:
            for e in self.instances:
                e.wake(t)
            self.now = t
        self.asleep_until = None

    def step(self) -> None:
        """Run the next step (:meth:`run_step`), or count an empty one (a stall after 1000)."""
        if self.run_step():
            self.empty = 0
        else:
            self.empty += 1
            if self.empty > 1000:
                raise StallError("reference engine: the schedulers keep planning empty steps")

    def run_step(self) -> bool:
        """Abort what is due (everything, once a drain timeout has come: :mod:`schedlab.engine.drain`),
        plan every rank and run the step; False when nobody planned anything."""
        self._drain_due()
        for e in self.instances:
            if not e._aborts_at_plan_time():  # (planning ahead, the plan does: ReferenceEngine._plan)
                e.abort_due()
        tail = not any(e.has_work() for e in self.instances) and self.in_wave_tail()
        made_ahead = any(e.ahead is not None and e.ahead.made_ahead(e.now) for e in self.instances)
        # (each made when its last batch started, planning ahead; none in a wave's tail: dummy batches)
        plans = [NO_PLAN if tail else e._plan() for e in self.instances]
        if all(_is_empty(p) for p in plans) and not tail and \
                not (made_ahead and any(e.has_work() for e in self.instances)):
            if not any(p.preempted for p in plans):
                self.asleep_until = min((p.wake for p in plans if p.wake is not None), default=INF)
            return False
        # (every plan empty, one made ahead, work left: vLLM's DP engine cores run a dummy step)
        parts, tokens, batches = [], [], []
        for e, plan in zip(self.instances, plans):
            batch = None if _is_empty(plan) else e.plan_batch(plan)[0]
            if batch is not None and batch.num_batched_tokens:
                parts.append(check_iteration_ms(e.cost.inner.rank_ms(batch), batch, "rank_ms") + plan.transfer_ms)
                tokens.append(batch.num_batched_tokens)
            else:  # nothing to compute (idle, or only swapping): a dummy batch, and the swaps
                parts.append(check_iteration_ms(e.cost.inner.rank_ms(DUMMY), DUMMY, "rank_ms") + plan.transfer_ms)
                tokens.append(1)
            batches.append(batch)
        tokens = tuple(tokens)
        inner = self.instances[0].cost.inner
        experts = check_part_ms(inner.experts_ms(tokens), f"tokens {tokens} (rank by rank)", "experts_ms")
        ratio = 1.0
        clock = getattr(inner, "lockstep_at", None)
        if clock is not None:  # [clock]: one clock for the step (schedlab.energy.clock)
            own = [b if b is not None and b.num_batched_tokens else DUMMY for b in batches]
            ratio, parts, experts = clock(own, tokens, parts, experts)
        step_ms = max(parts) + experts
        for e, plan, batch in zip(self.instances, plans, batches):
            e.cost.step_tokens, e.cost.experts_ms, e.cost.dummy, e.cost.ratio = tokens, experts, False, ratio
            if batch is not None:
                e.cost.step_ms = step_ms - plan.transfer_ms
                e.cost.tokens = batch.num_batched_tokens
                e.cost.run = None
                e.events += 1
                e._execute(plan)
        for e, plan, batch in zip(self.instances, plans, batches):
            if e.meter is not None and (batch is None or not batch.num_batched_tokens):
                swaps = plan.transfer_ms if batch is not None else 0.0
                self._dummy_step(e, self.now + swaps, step_ms - swaps)
        end = self.now + step_ms
        for e, batch in zip(self.instances, batches):
            e.wake(end)
            e.now = end
            if batch is not None and e.ahead is not None:
                e.ahead.end = end
        start, self.now = self.now, end
        self._released(start)
        self.steps += 1
        self.dummy_steps += batches.count(None)
        self.experts_ms += experts
        self._count_steps(1)
        return True

    @staticmethod
    def _dummy_step(e: ReferenceEngine, start: float, duration: float) -> None:
        """Meter a step of ``duration`` ms from ``start`` in which rank ``e`` ran the dummy batch
        (after its swaps, if it had any), with a timeline row: its GPUs computed the dummy and
        their share of the other ranks' experts, for no request."""
        e.cost.dummy = True
        energy = e.meter.dummy(start, NOTHING, 1, duration, 0.0, duration)
        e.rec.sample(start, e.index, len(e.running), len(e.waiting), e.kv.num_used_blocks(), duration, 1, NOTHING,
                     energy)


class _Steps:
    """The plan order :class:`ReferenceCluster` asks (``first``, ``update``): one entry, the
    ranks' next step."""

    def __init__(self, cluster: ReferenceDataParallel):
        self.cluster = cluster

    def update(self, inst) -> None:
        pass

    def first(self) -> tuple[float, ReferenceDataParallel | None]:
        t = self.cluster.next_step_time()
        return (t, self.cluster) if t < INF else (INF, None)


class ReferenceDeployments(ReferenceCluster):
    """Several data-parallel deployments (:class:`ReferenceDataParallel`, each its ranks stepping
    together) behind a router, in :class:`ReferenceCluster`'s loop: the router picks the
    deployment, seeing each as its ranks summed (:class:`~schedlab.engine.lockstep.Deployment`),
    and the deployment's own router picks the rank. An autoscaler (``scaling``,
    :func:`~schedlab.engine.scaling.deployment_scaling`) scales whole deployments."""

    def __init__(self, instances: Sequence[ReferenceDataParallel], router=None, client_side=None, scaling=None):
        super().__init__(instances, router, client_side=client_side, scaling=scaling)
        self.plans = _DeploymentOrder(self.instances)

    def arrive_at(self, deployment: ReferenceDataParallel, request, seq_no: int, t: float) -> None:
        deployment.deliver(request, seq_no, t)


class _DeploymentOrder(PlanOrder):
    """:class:`PlanOrder` of deployments: one whose ranks have no work may still step, through
    its wave's tail (:meth:`ReferenceDataParallel.next_step_time` says when)."""

    def update(self, inst: ReferenceDataParallel) -> None:
        self._announce(inst, inst.next_plan_time())
