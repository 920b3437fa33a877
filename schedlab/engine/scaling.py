"""Autoscaling: a policy adds and removes instances of a colocated cluster as the load changes.

Both engines' open-loop drivers run the same :class:`ScalingController` between arrivals, at its
own event times (before an arrival at the same time):

* every ``interval_ms`` a *tick*: the controller reads the serving instances as a router does
  (their views at that time), counts what happened in the last window (arrivals, finishes,
  finishes within the SLO) and asks the policy (:class:`schedlab.protocols.Autoscaler`) how
  many instances should serve; the answer is kept within ``[min_instances, max_instances]``
  (how fast it may grow is the policy's: the built-ins apply HPA's scale-up rate limit
  themselves, ``schedlab_plugins.autoscalers.HPANormalizer``);
* more: instances that are off start *warming*, and serve -- join the router's pool -- only
  ``cold_start_ms`` later (Kubernetes' pod start, the engine loading its weights); an instance
  still draining is taken back first, at once (it never stopped) -- but not one whose drain
  timeout has come (it is being stopped: another is warmed);
* fewer: warming instances are cancelled first (newest first), then serving ones *drain*
  (highest index first): they leave the router's pool at once but finish every request they
  hold, and are off -- no longer paid for -- when their last iteration ends. No request is lost;
* with a *drain timeout* (``drain_timeout_ms``, ``[cluster.autoscaler] drain_timeout_s``; None,
  the default: none), a draining instance still holding requests that long after its drain
  began aborts them all, running and queued, at its first plan at or after that time (an
  iteration in progress runs to its end), and is off then (:mod:`schedlab.engine.drain`: the
  rules, and how the aborts are counted -- ``drain_aborted`` in the summary). A draining instance
  taken back before its timeout keeps serving and its timer is cancelled; one that empties
  before it goes off as without a timeout.

Two assumptions of the default are not Kubernetes' and vLLM's defaults (a run models a
deployment set up for them):

* a *graceful drain that finishes every request*, however long it takes. Kubernetes removes a pod
  by sending SIGTERM and kills it ``terminationGracePeriodSeconds`` later (30 s by default), and
  vLLM's ``--shutdown-timeout`` defaults to 0, "abort": on SIGTERM it aborts what it holds
  (vLLM 0.33 ``EngineCore._handle_shutdown``, at the top of its busy loop; a timeout above 0
  drains for that long, then aborts). By default the run models vLLM with ``--shutdown-timeout``
  and the pod's grace period at least its longest request; a drain timeout models the others:
  the shorter of the two (30: the grace period, vLLM's timeout above it; 0: vLLM's default,
  every request a scale-down catches fails at once). A pod killed mid-iteration is modelled as
  stopped at that iteration's end (its tokens count), within an iteration of the kill;
* a *draining instance taken back at once*. A pod marked for deletion cannot be revived: a
  scale-up during its drain creates a new pod, which pays a whole cold start. Here the instance
  serves again at once, as if its deletion could be called off (with a drain timeout: only
  before the timeout). Under a load that swings within a drain this understates cold starts; a
  smooth day has none to take back (the first 8 hours of ``experiments/fleet_day.toml``: 30 cold
  starts, no instance taken back).

Instances are paid for (GPU-hours) from the moment they start warming until they are off; the
controller keeps those intervals and the decisions (``history``) for the results, and switches
the instances' energy meters off and on with them (:mod:`schedlab.energy.meter`: an instance
that is off draws nothing). The cluster is
built with ``max_instances`` instances. An instance that drained and went off starts cold when it
is switched on again: its engine process is gone, so its KV cache is reset when it goes off --
holding nothing by then -- through the cache's ``reset_prefix_cache()`` (vLLM's name; prefixes,
host-memory copies and swap space gone, :class:`schedlab.protocols.KVCache`). A cache without that
optional member (a third-party plugin) keeps its prefixes instead; the summary counts those
switch-offs (``caches_kept``, 0 when every cache was reset) rather than warning, so that the
results say so wherever the run went (a worker process, a Ray task). The instances still on when
the run ends are not reset: their caches are left as the run left them. The router sees the
serving instances as a list that changes when they do: a router that remembered positions would
find them renumbered, so ``prefix_affinity`` and ``weighted`` key what they remember by each view's
``index`` and forget an instance that leaves, ``vllm_dp`` keys its load snapshot by ``index`` and
reads it again when the list changes, and a router whose settings name instances by
number (``class``, ``names_instances``) is refused with an autoscaler when the file is read.

Pipelined instances (:mod:`schedlab.engine.pipeline`, :mod:`schedlab.engine.reference_pipeline`)
scale the same way (:func:`pipeline_scaling`): a draining one keeps landing its batches in flight
and serving its queue, and is off from its last landing or abort once nothing is in flight or queued.
Its stages share one KV cache object (each stage holds its layers' part of the same blocks), which
is reset as a colocated instance's is. A drain timeout aborts at its first launch at or after
the deadline; its batches in flight then land without the aborted requests, and it is off at
the last landing.
Data-parallel deployments scale whole (:func:`deployment_scaling`): a draining one's ranks keep
stepping together until they hold nothing, and it is off from the end of its last step; every
rank's cache is reset then (``DeploymentKV.reset_prefix_cache``). A drain timeout aborts what
every rank holds at the ranks' first step at or after the deadline. Both engines' drivers read an
instance's next event again when its timer is set or cancelled (:meth:`ScalingController.take_touched`).
A disaggregated cluster's pools (:mod:`schedlab.engine.pool_scaling`) take no drain timeout.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import attrs

from ..errors import SimulationError
from .load import views_of

INF = math.inf


def checked_decision(policy, answer, t: float) -> int:
    """``answer``, what ``policy.decide`` returned at ``t``, if it is a whole number of instances
    >= 0 (the engine then clamps it to ``[min_instances, max_instances]``); else
    :class:`SimulationError` naming the policy: None, NaN or text would fail far from the plugin,
    and a fraction or a text number silently rounded would hide its bug (as a router's answer)."""
    try:
        desired = operator.index(answer) if not isinstance(answer, bool) else -1
    except TypeError:
        desired = -1
    if desired < 0:
        raise SimulationError(f"autoscaler {type(policy).__name__} returned {answer!r} ({type(answer).__name__}) "
                              f"from decide() at t={t:g} ms; expected a whole number of instances >= 0 (an int)")
    return desired
OFF, WARMING, SERVING, DRAINING = "off", "warming", "serving", "draining"


@attrs.frozen
class ScalingLimits:
    """How far and how fast a policy may scale (the ``[cluster.autoscaler]`` keys every policy has)."""

    min_instances: int
    max_instances: int
    initial: int
    interval_ms: float
    cold_start_ms: float
    window_ms: float
    #: a draining instance still holding requests this long after its drain began aborts them
    #: (``[cluster.autoscaler] drain_timeout_s``); None: it finishes them, however long it takes
    drain_timeout_ms: float | None = None


@attrs.frozen
class Signals:
    """What a policy sees at a tick (``now_ms``): the serving instances (``serving``), those
    warming and draining, their load as a router sees it -- requests ``waiting`` for admission,
    ``running``, ``outstanding`` (both and swapped), mean KV ``kv_usage`` -- summed over the
    serving instances, and over the last ``window_ms``: ``arrivals``, ``finished`` (requests
    that left the run: completed, or rejected, aborted or timed out, which miss) and ``slo_met``
    (finished within their TTFT and TPOT targets; ``slo_attainment`` = met / finished, as the
    run's ``slo.attainment`` counts it, NaN without finishes or without an ``[slo]``)."""

    now_ms: float
    serving: int
    warming: int
    draining: int
    min_instances: int
    max_instances: int
    waiting: int
    running: int
    outstanding: int
    kv_usage: float
    window_ms: float
    arrivals: int
    finished: int
    slo_met: int
    slo_attainment: float


class ScalingController:
    """The autoscaler of one open-loop colocated cluster (either engine's instances)."""

    def __init__(self, policy, limits: ScalingLimits, instances: Sequence, clock, *, slo_met=None,
                 gpus_per_instance: Sequence[int] | None = None, meters: Sequence | None = None,
                 tracked: bool = True, holding=None, idle_since=None):
        if limits.max_instances != len(instances):
            raise ValueError("the cluster is built with max_instances instances")
        timeout = limits.drain_timeout_ms
        if timeout is not None and not timeout >= 0.0:
            raise ValueError(f"a drain timeout must be >= 0 ms, got {timeout!r}")
        if timeout is not None and not all(callable(getattr(inst, "drain_by", None)) for inst in instances):
            raise ValueError(f"{type(instances[0]).__name__} instances cannot abort what they hold at a drain "
                             "timeout (no drain_by)")
        self.policy = policy
        self.limits = limits
        self.instances = list(instances)
        self.clock = clock
        self.slo_met = slo_met  # (seq, client view) -> within its SLO; None without an [slo]
        self.tracked = tracked  # the driver tells the router's pool of every change (else it scans)
        self.holding = holding  # (index) -> what it holds besides requests keeps a drained instance on
        self.idle_since = idle_since  # (index) -> when an instance holding nothing last worked (default: its clock)
        self.all_views = views_of(self.instances, clock)  # every instance, as a router would see it
        self.gpus = list(gpus_per_instance or [1] * len(instances))
        n = len(instances)
        self.state = [SERVING if i < limits.initial else OFF for i in range(n)]
        self.ready_at = [INF] * n
        self.since = [0.0 if i < limits.initial else None for i in range(n)]  # paid for since
        self.meters = [m for m in meters] if meters is not None else [None] * n
        for i, s in enumerate(self.state):
            if s == OFF and self.meters[i] is not None:
                self.meters[i].switch_off(0.0)
        self.drain_from = [None] * n
        self.deadline = [INF] * n  # a draining instance's drain timeout: it aborts what it holds then
        self.drains: list[list] = []  # with a drain timeout: [instance, start, deadline, taken back at or None]
        self.touched: list[int] = []  # instances whose deadline changed since the driver last looked
        self.intervals: list[tuple[int, float, float]] = []   # (instance, on, off)
        self.history: list[tuple] = [(0.0, limits.initial, 0, 0, limits.initial)]
        #: (time, instances serving) at every change: a tick's decisions and warm-ups between ticks
        self.serving_changes: list[tuple[float, int]] = [(0.0, limits.initial)]
        self.next_tick = limits.interval_ms
        self.window: list = []     # (time, kind) of arrivals (0) and finishes (1: missed, 2: met)
        self.scale_ups = self.scale_downs = 0
        self.caches_kept = 0  # instances switched off whose cache could not be reset (no reset_prefix_cache)
        self.pool = None
        self.members: list[int] = []
        self.position: dict[int, int] = {}
        self._rebuild()

    # -- the router's pool --------------------------------------------------------------------------
    def _rebuild(self) -> None:
        self.members = [i for i, s in enumerate(self.state) if s == SERVING]
        self.position = {index: pos for pos, index in enumerate(self.members)}
        self.pool = views_of([self.instances[i] for i in self.members], self.clock, tracked=self.tracked)

    def changed(self, index: int) -> None:
        """Instance ``index`` changed: tell the router's pool, if it serves."""
        pos = self.position.get(index)
        if pos is not None and self.tracked:
            self.pool.changed(pos)

    def target(self, position: int) -> int:
        """The instance at ``position`` of the router's pool."""
        return self.members[position]

    # -- what happened -----------------------------------------------------------------------------
    def arrived(self, t: float) -> None:
        self.window.append((t, 0))

    def finished(self, seq, t: float, rejected: bool, client: tuple) -> None:
        """A request left the run at ``t`` (a recorder listener; ``client``: its client's view,
        see :func:`schedlab.frontend.client_times`). One rejected, aborted or timed out counts as
        missed, as the run's SLO metrics count it (:func:`schedlab.results.metrics.slo_met`: every
        request, met or not); one rejected on arrival has no finish time (``t`` < 0) and leaves at
        its arrival. An overloaded engine turning requests away (SGLang's ``max_queued_requests``)
        then shows as low attainment, which is when a policy's SLO guard should add instances."""
        if rejected:
            self.window.append((t if t >= 0 else seq.request.arrival_ms, 1))
            return
        self.window.append((t, 2 if self.slo_met is not None and self.slo_met(seq, client) else 1))

    # -- events ------------------------------------------------------------------------------------
    def next_time(self) -> float:
        ready = min((self.ready_at[i] for i, s in enumerate(self.state) if s == WARMING), default=INF)
        return min(ready, self.next_tick)

    def apply(self, t: float) -> bool:
        """Everything due at ``t``: warm instances start serving, a tick decides. True when the
        router's pool changed."""
        changed = False
        for i, s in enumerate(self.state):
            if s == WARMING and self.ready_at[i] <= t:
                self.state[i] = SERVING
                self.ready_at[i] = INF
                changed = True
        if t >= self.next_tick:
            changed |= self._tick(t)
            self.next_tick += self.limits.interval_ms
        if changed:
            self._rebuild()
        serving = len(self.members)
        if serving != self.serving_changes[-1][1]:
            self.serving_changes.append((t, serving))
        return changed

    def _retire_drained(self) -> None:
        """Draining instances that hold nothing any more (as seen now: an iteration in progress
        still holds its requests, and ``holding`` says what else it must keep: a prefill
        instance's KV not yet pulled) are off since their last iteration ended. KV blocks still
        in use keep one on too: planning ahead, the requests the last batch finished give theirs
        back when the next plan is made, and the cache is reset only once they have. One whose
        clock is past the tick -- planning ahead, an iteration computed for nothing after its
        last request left -- is still working: it goes off at a later tick (from its end), and a
        scale-up at this one takes it back rather than warming it again (its paid intervals
        would overlap)."""
        holding = self.holding
        views = self.all_views
        t = self.clock.now
        for i, s in enumerate(self.state):
            if (s == DRAINING and not views[i].outstanding and not views[i].kv.num_used_blocks()
                    and not (holding is not None and holding(i)) and self._quiet_since(i) <= t):
                self._off(i, max(self.drain_from[i], self._quiet_since(i)))
                self._forget(i)

    def _forget(self, i: int) -> None:
        """Instance ``i``, drained, went off: its engine process is gone, so a restart starts
        with an empty cache (a warming instance cancelled served nothing since its last reset)."""
        reset = getattr(self.instances[i].kv, "reset_prefix_cache", None)
        if reset is None:
            self.caches_kept += 1
        else:
            reset()

    def _quiet_since(self, i: int) -> float:
        """When instance ``i``, holding nothing, last worked: its clock, which an idle instance
        moves only when a request reaches it (a pipelined instance's says so itself)."""
        return self.instances[i].now if self.idle_since is None else self.idle_since(i)

    def _off(self, i: int, t: float) -> None:
        if self.deadline[i] < INF:  # (drained before its timeout, or its requests aborted at it)
            self._set_deadline(i, INF)
        self.intervals.append((i, self.since[i], t))
        self.state[i] = OFF
        self.since[i] = self.drain_from[i] = None
        if self.meters[i] is not None:
            self.meters[i].switch_off(t)

    def signals(self, t: float) -> Signals:
        """What the policy sees at ``t``. The window counts only what happened by ``t``: an
        engine may record a finish when it plans the iteration that ends later (the reference
        engine does; the fast one applies a pending run at its end), and a tick must not see it."""
        lim = self.limits
        self.window = [(when, kind) for when, kind in self.window if when > t - lim.window_ms]
        past = [kind for when, kind in self.window if when <= t]
        arrivals = past.count(0)
        finished = len(past) - arrivals
        met = past.count(2)
        views = self.pool
        count = {s: self.state.count(s) for s in (SERVING, WARMING, DRAINING)}
        kv = [v.kv.num_used_blocks() / v.kv.num_blocks for v in views]
        return Signals(t, count[SERVING], count[WARMING], count[DRAINING], lim.min_instances, lim.max_instances,
                       sum(v.waiting for v in views), sum(v.running for v in views),
                       sum(v.outstanding for v in views), sum(kv) / len(kv) if kv else 0.0, lim.window_ms,
                       arrivals, finished, met, met / finished if finished and self.slo_met is not None else math.nan)

    def _tick(self, t: float) -> bool:
        self.clock.now = t  # the views, the draining ones' too, as at the tick
        self._retire_drained()
        lim = self.limits
        signals = self.signals(t)
        desired = checked_decision(self.policy, self.policy.decide(signals), t)
        desired = min(max(desired, lim.min_instances), lim.max_instances)
        have = signals.serving + signals.warming
        changed = False
        if desired > have:
            changed = self._scale_up(desired - have, t)
        elif desired < have:
            changed = self._scale_down(have - desired, t)
        counts = [self.state.count(s) for s in (SERVING, WARMING, DRAINING)]
        self.history.append((t, *counts, desired))
        return changed

    def _scale_up(self, more: int, t: float) -> bool:
        self.scale_ups += 1
        changed = False
        # (one whose drain timeout has come is being stopped: it aborts what it holds at its next plan)
        for i in sorted((i for i, s in enumerate(self.state) if s == DRAINING and self.deadline[i] > t),
                        reverse=True)[:more]:
            self.state[i] = SERVING  # still running: it serves again at once
            self.drain_from[i] = None
            if self.deadline[i] < INF:  # its timer is cancelled
                self._set_deadline(i, INF)
                next(d for d in reversed(self.drains) if d[0] == i)[3] = t
            more -= 1
            changed = True
        for i in [i for i, s in enumerate(self.state) if s == OFF][:more]:
            self.state[i] = WARMING
            self.ready_at[i] = t + self.limits.cold_start_ms
            self.since[i] = t
            if self.meters[i] is not None:
                self.meters[i].switch_on(t)
            if self.limits.cold_start_ms <= 0:
                self.state[i], self.ready_at[i] = SERVING, INF
                changed = True
        return changed

    def _scale_down(self, fewer: int, t: float) -> bool:
        self.scale_downs += 1
        warming = sorted((i for i, s in enumerate(self.state) if s == WARMING), key=lambda i: -self.since[i])
        for i in warming[:fewer]:
            self._off(i, t)  # paid for while it warmed
            self.ready_at[i] = INF
            fewer -= 1
        changed = False
        timeout = self.limits.drain_timeout_ms
        for i in sorted((i for i, s in enumerate(self.state) if s == SERVING), reverse=True)[:fewer]:
            self.state[i] = DRAINING
            self.drain_from[i] = t
            if timeout is not None:
                self._set_deadline(i, t + timeout)
                self.drains.append([i, t, t + timeout, None])
            changed = True
        return changed

    def _set_deadline(self, i: int, t: float) -> None:
        """Instance ``i`` aborts what it holds at its first plan at or after ``t`` (inf: never)."""
        self.deadline[i] = t
        self.instances[i].drain_by(t)
        self.touched.append(i)

    def take_touched(self) -> list[int]:
        """The instances whose drain deadline was set or cancelled since the last call (their next
        events may have moved: the drivers look again), in index order."""
        touched, self.touched = self.touched, []
        return sorted(set(touched))

    def finish(self, end: float | None = None) -> dict[str, Any]:
        """The run is over (every instance idle): close the paid intervals -- those still on at
        ``end`` (default: the last time any of these instances worked, :meth:`_quiet_since`; a
        disaggregated cluster's pools close at the cluster's end) -- and summarise (``caches_kept``:
        switch-offs that kept a cache without ``reset_prefix_cache``; with a drain timeout,
        ``drain_aborted``, the requests it aborted, and ``drains``: each drain's instance, start,
        deadline and when a scale-up took it back, or None)."""
        if end is None:
            end = max((self._quiet_since(i) for i in range(len(self.instances))), default=0.0)
        for i, s in enumerate(self.state):
            if s == SERVING:
                self._off(i, max(end, self.since[i]))
            elif s == DRAINING:
                self._off(i, max(self.drain_from[i], self._quiet_since(i)))
            elif s == WARMING:
                self._off(i, max(end, self.since[i]))
        gpu_ms = sum((off - on) * self.gpus[i] for i, on, off in self.intervals)
        summary = {"intervals": [list(x) for x in sorted(self.intervals, key=lambda x: (x[1], x[0]))],
                   "history": [list(h) for h in self.history],
                   "serving": [list(x) for x in self.serving_changes], "gpu_hours": gpu_ms / 3.6e6,
                   "scale_ups": self.scale_ups, "scale_downs": self.scale_downs, "end_ms": end,
                   "caches_kept": self.caches_kept}
        if self.limits.drain_timeout_ms is not None:  # (only then: a run without one is as before)
            summary["drain_aborted"] = sum(inst.drain_aborted for inst in self.instances)
            summary["drains"] = [list(d) for d in self.drains]
        return summary


def pipeline_scaling(policy, limits: ScalingLimits, pipelines: Sequence, clock, **kwargs) -> ScalingController:
    """The autoscaler of pipelined instances (either engine's: ``flights``, the batches in the
    pipeline, and ``idle_since``): a draining one stays on while a batch is in flight -- one
    whose requests all left too -- and is off from when it last worked (its clock may have moved
    on to the time it was told to wait for). ``kwargs``: as :class:`ScalingController`'s."""
    return ScalingController(policy, limits, pipelines, clock, holding=lambda i: bool(pipelines[i].flights),
                             idle_since=lambda i: pipelines[i].idle_since, **kwargs)


class _Together:
    """The energy meters of a deployment's ranks, switched off and on together."""

    def __init__(self, meters: Sequence):
        self.meters = list(meters)

    def switch_off(self, t: float) -> None:
        for m in self.meters:
            m.switch_off(t)

    def switch_on(self, t: float) -> None:
        for m in self.meters:
            m.switch_on(t)


def deployment_scaling(policy, limits: ScalingLimits, deployments: Sequence, clock, *,
                       meters: Sequence[Sequence] | None = None, **kwargs) -> ScalingController:
    """The autoscaler of data-parallel deployments (either engine's, ranks stepping together):
    each scales whole, its ranks' meters (``meters``: a list per deployment, or None) switched
    together; a draining one finishes the requests its ranks hold and is off from the end of its
    last step (its clock stays there until a request reaches it). ``kwargs``: as
    :class:`ScalingController`'s."""
    grouped = None
    if meters is not None and any(m is not None for group in meters for m in group):
        grouped = [_Together(group) for group in meters]
    return ScalingController(policy, limits, deployments, clock, meters=grouped, **kwargs)
