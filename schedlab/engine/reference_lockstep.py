"""Data-parallel ranks stepping together, in the reference engine: one step at a time.

The rules (and vLLM's code they follow) are in :mod:`schedlab.engine.lockstep`; here they are
written out plainly for the differential tests. Every step: each rank plans; if none planned
anything, the ranks wait for the first wake-up or arrival (or plan again at once after a
preemption); otherwise every rank's part is timed -- its batch's ``rank_ms`` plus its swaps,
or a dummy batch's -- and the step lasts the largest part plus the cost model's
``experts_ms`` of every rank's tokens. Ranks with work execute their plans over it; all ranks
end the step together.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

from ..errors import StallError
from .load import RoutingClock, views_of
from .rank_cost import DUMMY
from .reference import RefPlan, ReferenceEngine
from .reference_cluster import _routed

INF = math.inf


def _is_empty(plan: RefPlan) -> bool:
    return not plan.num_scheduled_tokens and not plan.swapped_in and plan.transfer_ms == 0.0


class ReferenceDataParallel:
    """Reference ranks (each with a :class:`~schedlab.engine.rank_cost.RankCost`) behind a router."""

    def __init__(self, ranks: Sequence[ReferenceEngine], router=None):
        if len(ranks) > 1 and router is None:
            raise ValueError("several data-parallel ranks need a router")
        self.ranks = list(ranks)
        self.router = router
        self.clock = RoutingClock()
        self.views = views_of(self.ranks, self.clock)
        self.now = 0.0
        self.asleep_until = None  # every rank planned nothing: the step waits for this time (or an arrival)
        self.steps = 0
        self.dummy_steps = 0
        self.experts_ms = 0.0

    def run(self, requests, workload=None) -> None:
        pending = [(r.arrival_ms, r.id, r) for r in requests]
        heapq.heapify(pending)
        closed = workload is not None and getattr(workload, "closed_loop", False)

        def done(request, t):
            if closed:
                for follow_up in workload.on_finish(request, t):
                    heapq.heappush(pending, (follow_up.arrival_ms, follow_up.id, follow_up))

        for e in self.ranks:
            e.on_request_done = done
        seq_no = 0
        empty = 0
        while True:
            t_event = pending[0][0] if pending else INF
            busy = any(e.has_work() for e in self.ranks)
            t_step = INF if not busy else (self.now if self.asleep_until is None else max(self.asleep_until, self.now))
            if t_event <= t_step and t_event < INF:
                self._wait_until(t_event)
                while pending and pending[0][0] <= t_event:
                    request = heapq.heappop(pending)[2]
                    _routed(self.router, request, self.ranks, self.views, self.clock, t_event).arrive(request, seq_no)
                    seq_no += 1
                continue
            if t_step == INF:
                if busy:
                    raise StallError("reference engine: no arrivals are left and the schedulers plan nothing")
                return
            self._wait_until(t_step)
            if self.step():
                empty = 0
            else:
                empty += 1
                if empty > 1000:
                    raise StallError("reference engine: the schedulers keep planning empty steps")

    def _wait_until(self, t: float) -> None:
        if t > self.now:
            for e in self.ranks:
                e.wake(t)
            self.now = t
        self.asleep_until = None

    def step(self) -> bool:
        """Plan every rank and run the step; False when nobody planned anything."""
        plans = []
        for e in self.ranks:
            e.serial += 1
            plan = RefPlan(e, e.serial)
            e.scheduler.schedule(plan)
            plans.append(plan)
        if all(_is_empty(p) for p in plans):
            if not any(p.preempted for p in plans):
                self.asleep_until = min((p.wake for p in plans if p.wake is not None), default=INF)
            return False
        parts, tokens, batches = [], [], []
        for e, plan in zip(self.ranks, plans):
            batch = None if _is_empty(plan) else e.plan_batch(plan)[0]
            if batch is not None and batch.num_batched_tokens:
                parts.append(e.cost.inner.rank_ms(batch) + plan.transfer_ms)
                tokens.append(batch.num_batched_tokens)
            else:  # nothing to compute (idle, or only swapping): a dummy batch, and the swaps
                parts.append(e.cost.inner.rank_ms(DUMMY) + plan.transfer_ms)
                tokens.append(1)
            batches.append(batch)
        experts = self.ranks[0].cost.inner.experts_ms(tuple(tokens))
        step_ms = max(parts) + experts
        for e, plan, batch in zip(self.ranks, plans, batches):
            if batch is not None:
                e.cost.step_ms = step_ms - plan.transfer_ms
                e.cost.tokens = batch.num_batched_tokens
                e.cost.run = None
                e.events += 1
                e._execute(plan)
        end = self.now + step_ms
        for e in self.ranks:
            e.wake(end)
            e.now = end
        self.now = end
        self.steps += 1
        self.dummy_steps += batches.count(None)
        self.experts_ms += experts
        return True
