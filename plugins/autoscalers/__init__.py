"""Built-in autoscalers (``[cluster] autoscaler = {kind = ...}``): how many instances should serve.

* ``target_utilization`` -- Kubernetes' Horizontal Pod Autoscaler rule: ``desired =
  ceil(serving * current / target)`` of a per-instance signal (KV-cache usage, as vLLM's
  ``kv_cache_usage_perc``, or outstanding requests), left alone within a 10% tolerance, warming
  instances counted as HPA counts unready pods (never a scale-down while the serving ones are
  above target), and scaled down only to the highest recommendation of the last five minutes
  (HPA's ``--horizontal-pod-autoscaler-downscale-stabilization``, default 300 s).
* ``queue_length`` -- KEDA's queue scalers: ``desired = ceil(queue / target_per_instance)`` of the
  requests waiting (or outstanding) over the serving instances, left alone within HPA's 10%
  tolerance, one more instance while the window's SLO attainment is below ``min_attainment``,
  and the same down-scale stabilisation.

Both go through HPA's normalisation (:class:`HPANormalizer`, ``horizontal.go``): the down-scale
stabilisation, then the scale-up rate limit of HPA's default ``behavior`` -- at most ``max(4
pods, 100%)`` more than at the start of the last 15 s (``scale_up_limit``, ``scale_up_pods``,
``scale_up_percent``, ``scale_up_period_s``; ``"legacy"``: HPA without a ``behavior`` field,
``max(2 x current, 4)`` per decision; ``"none"``: no limit).

Both read only :class:`schedlab.engine.scaling.Signals`; the engine keeps their answer within
``min_instances`` and ``max_instances``, warms new instances for ``cold_start_s`` and drains the
ones it removes, aborting what a draining instance still holds ``drain_timeout_s`` after its
drain began if that is set (see :mod:`schedlab.engine.scaling`, which also states what it assumes
of a drain against Kubernetes' and vLLM's defaults, and :mod:`schedlab.engine.drain`).

Warming instances on a scale-down. ``target_utilization`` counts a warming instance as HPA counts
a ``Pending`` pod (``groupPods``: "unready"): left out of a scale-down's ratio, so ``desired =
ceil(ratio * serving)`` may cancel warming instances (``queue_length``'s External metric has no
per-pod view: HPA only counts them in the current count its tolerance is relative to). A pod that is ``Running`` but not yet serving
its metrics -- a vLLM pod loading its weights, usually the longer part of a cold start -- is a
pod "missing metrics" to HPA instead, taken on a scale-down as being at target, which holds the
count up: ``target_utilization``'s ``warming_as = "missing"`` models that. Under the default
300 s stabilisation with a cold start shorter than it, the scale-up that started the warming
instances is still in the window and nothing differs.
"""

from __future__ import annotations

import math

import attrs

import schedlab
from schedlab.configs import MAX_INSTANCES, FieldError, float_field, int_field, str_field


@attrs.frozen
class ScalingConfig:
    """The keys every autoscaler has (the engine reads them: :mod:`schedlab.engine.scaling`)."""

    min_instances: int = int_field(1, min=1, max=MAX_INSTANCES, help="never fewer instances serving or warming")
    max_instances: int | None = int_field(None, min=1, max=MAX_INSTANCES, optional=True,
                                          help="never more (default: [cluster] instances, the instances built)")
    initial: int | None = int_field(None, min=1, max=MAX_INSTANCES, optional=True,
                                    help="instances serving at the start, warm (default: min_instances)")
    interval_s: float = float_field(15.0, min=0.1,
                                    help="seconds between decisions (HPA's sync period: 15 s; at least 0.1: a "
                                         "decision per step would only cost simulation time)")
    cold_start_s: float = float_field(60.0, min=0.0,
                                      help="seconds from starting an instance to its serving (pod start and weight "
                                           "loading), paid for")
    window_s: float = float_field(60.0, min=0.0, min_exclusive=True,
                                  help="seconds of arrivals, finishes and SLO attainment the signals count")
    stabilization_s: float = float_field(300.0, min=0.0,
                                         help="scale down only to the highest recommendation of this many seconds "
                                              "(HPA's downscale stabilisation window, 300 s)")
    drain_timeout_s: float | None = float_field(
        None, min=0.0, optional=True,
        help="seconds a draining instance has to finish what it holds; at its first iteration boundary at or "
             "after then it aborts the rest, queued ones too, and is off (the shorter of vLLM's --shutdown-timeout "
             "and the pod's terminationGracePeriodSeconds, 30 s by default; 0: abort at once, vLLM's default; not "
             "for a disaggregated cluster's pools). Default: none, every request finishes however long it takes")

    def __attrs_post_init__(self):
        if self.max_instances is not None and self.max_instances < self.min_instances:
            raise FieldError("max_instances", f"must be at least min_instances ({self.min_instances})")
        if self.initial is not None and (self.initial < self.min_instances or
                                         (self.max_instances is not None and self.initial > self.max_instances)):
            raise FieldError("initial", "must be between min_instances and max_instances")


SCALE_UP_LIMITS = ("behavior", "legacy", "none")


@attrs.frozen
class HPAScalingConfig(ScalingConfig):
    """The keys of a policy that goes through Kubernetes' HPA controller (:class:`HPANormalizer`):
    its tolerance and its scale-up rate limit. The defaults are HPA's (``autoscaling/v2``
    ``defaults.go``: a Pods policy of 4 and a Percent policy of 100, each per 15 s, the larger
    allowed, ``selectPolicy: Max``)."""

    tolerance: float = float_field(0.1, min=0.0, help="no change while the usage ratio is within 1 +- this (HPA: 0.1)")
    scale_up_limit: str = str_field("behavior", choices=SCALE_UP_LIMITS,
                                    help="'behavior': HPA's scale-up policies (the default behavior: scale_up_pods "
                                         "and scale_up_percent per scale_up_period_s); 'legacy': HPA without a "
                                         "behavior field, max(2 x current, 4) per decision; 'none': no limit")
    scale_up_pods: int = int_field(4, min=0, help="'behavior': at most this many instances more than at the start of "
                                                  "the period (0: no such policy; HPA's default: 4)")
    scale_up_percent: int = int_field(100, min=0, help="'behavior': or this many percent more, rounded up, whichever "
                                                       "allows more (0: no such policy; HPA's default: 100)")
    scale_up_period_s: float = float_field(15.0, min=0.0, min_exclusive=True,
                                           help="'behavior': the period both policies count the changes over "
                                                "(HPA's default: 15 s)")

    def __attrs_post_init__(self):
        ScalingConfig.__attrs_post_init__(self)
        if self.scale_up_limit == "behavior" and self.scale_up_pods == 0 and self.scale_up_percent == 0:
            raise FieldError("scale_up_pods", "0 with scale_up_percent = 0 would never allow a scale-up; set "
                                              "scale_up_limit = 'none' for no limit")


class Stabilized:
    """Down-scale stabilisation: the highest recommendation of the last ``seconds``."""

    def __init__(self, seconds: float):
        self.window_ms = seconds * 1e3
        self.recent: list[tuple[float, int]] = []

    def __call__(self, now_ms: float, recommendation: int) -> int:
        self.recent = [(t, r) for t, r in self.recent if t > now_ms - self.window_ms]
        self.recent.append((now_ms, recommendation))
        return max(r for _, r in self.recent)


class HPANormalizer:
    """What Kubernetes' HPA controller does with a recommendation (``horizontal.go``) before it
    sets the replica count, ``current`` being the pods ready or not -- serving plus warming:

    * ``scale_up_limit = "behavior"`` (``normalizeDesiredReplicasWithBehaviors``, the
      ``autoscaling/v2`` default behavior): the recommendation is stabilised
      (``stabilizeRecommendationWithBehaviors``: a scale-up at once, a scale-down only to the
      highest recommendation of ``stabilization_s``, never above ``current``), then a scale-up
      is limited (``calculateScaleUpLimitWithScalingRules``, ``selectPolicy: Max``) to
      ``max(start + scale_up_pods, ceil(start * (1 + scale_up_percent / 100)))``, where ``start``
      is the count at the start of the last ``scale_up_period_s``: ``current`` less the instances
      added, plus those removed, by the decisions within it (``getReplicasChangePerPeriod``: a
      change exactly one period old no longer counts). A policy of 0 is left out. Both policies
      share one period (HPA gives each its own); the scale-down policies are HPA's default
      (100% per 15 s: none binds), so not modelled.
    * ``"legacy"`` (``normalizeDesiredReplicas``, an HPA whose spec has no ``behavior`` --
      ``defaults.go`` fills the default behavior only into a ``behavior`` that is there): the
      highest recommendation of ``stabilization_s`` whichever way it goes, then at most
      ``max(2 * current, 4)`` per decision, with no period.
    * ``"none"``: the stabilised recommendation, unlimited (schedlab before the limit).

    The answer is kept within ``[min_instances, max_instances]`` as the engine would keep it, so
    that the change recorded is the one the engine makes (it adds or removes exactly that many:
    draining instances taken back, then off ones warmed; warming ones cancelled, then serving
    ones drained)."""

    def __init__(self, config: HPAScalingConfig):
        self.config = config
        self.stable = Stabilized(config.stabilization_s)
        self.period_ms = config.scale_up_period_s * 1e3
        self.changes: list[tuple[float, int]] = []  # (time, instances added (+) or removed (-)), 'behavior' only

    def __call__(self, s, recommendation: int) -> int:
        """The count to ask the engine for, from the policy's ``recommendation`` at ``s``."""
        cfg = self.config
        current = s.serving + s.warming
        highest = self.stable(s.now_ms, recommendation)
        if cfg.scale_up_limit == "behavior":
            desired = recommendation if recommendation >= current else min(current, highest)
            if desired > current:
                desired = min(desired, max(self.scale_up_limit(s.now_ms, current), current))
        elif cfg.scale_up_limit == "legacy":
            desired = min(highest, max(2 * current, 4)) if highest > current else highest
        else:
            desired = highest
        desired = min(max(desired, s.min_instances), s.max_instances)
        if cfg.scale_up_limit == "behavior":
            cutoff = s.now_ms - self.period_ms
            self.changes = [(t, c) for t, c in self.changes if t > cutoff]
            if desired != current:
                self.changes.append((s.now_ms, desired - current))
        return desired

    def scale_up_limit(self, now_ms: float, current: int) -> int:
        """The most instances the scale-up policies allow at ``now_ms`` from ``current``."""
        cfg = self.config
        start = current - sum(c for t, c in self.changes if t > now_ms - self.period_ms)
        return max(start + cfg.scale_up_pods, math.ceil(start * (1 + cfg.scale_up_percent / 100)))


@attrs.frozen
class TargetUtilizationConfig(HPAScalingConfig):
    metric: str = str_field("kv_usage", choices=("kv_usage", "outstanding"),
                            help="'kv_usage': mean KV-cache usage of the serving instances (0-1); 'outstanding': "
                                 "requests queued or running per serving instance")
    target: float = float_field(0.6, min=0.0, min_exclusive=True, help="the value to hold the metric at")
    warming_as: str = str_field("pending", choices=("pending", "missing"),
                                help="how HPA sees a warming instance: 'pending', an unready pod (left out of a "
                                     "scale-down); 'missing', a Running pod not yet serving metrics (at target on a "
                                     "scale-down, which holds the count up); the same on a scale-up")


class TargetUtilization:
    """Kubernetes HPA, ``ReplicaCalculator.calcPlainMetricReplicas``
    (``pkg/controller/podautoscaler/replica_calculator.go``; the "Algorithm details" of
    kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/): the usage ratio
    ``current / target`` over the ready pods -- the serving instances; their mean KV usage, or
    outstanding requests per instance -- and ``currentReplicas``, the pods ready or not -- serving
    plus warming (a draining instance is a terminating pod, no longer counted):

    * no unready pods, or a ratio of at most 1 (the unready ones are then left out): the current
      count within the tolerance, else ``ceil(ratio * ready)``;
    * unready pods and a ratio above 1 (a scale-up): they count as using nothing, and the ratio is
      taken again over every pod, ``ratio * ready / (ready + unready)``; when that is within the
      tolerance or would reverse the direction (at most 1), HPA keeps ``currentReplicas`` -- it
      never scales down while the ready pods are above target, which would cancel instances
      still warming, their paid cold start lost -- else ``ceil(new ratio * all)``, never below
      ``currentReplicas``.

    * ``warming_as = "missing"``: warming instances are pods missing metrics instead
      (``calcPlainMetricReplicas``' ``missingPods``: Running, not serving metrics yet). On a
      scale-up they count as using nothing, as above; on a scale-down (a ratio below 1) as being
      at target: the ratio over every pod is ``(ratio * ready + unready) / all``, the current
      count within the tolerance, else ``ceil(new ratio * all)``.

    Then HPA's normalisation (:class:`HPANormalizer`): down-scales stabilised (the highest
    recommendation of ``stabilization_s``), scale-ups rate-limited."""

    def __init__(self, config: TargetUtilizationConfig | None = None):
        self.config = config or TargetUtilizationConfig()
        self.hpa = HPANormalizer(self.config)

    def decide(self, s) -> int:
        cfg = self.config
        current_replicas = s.serving + s.warming
        if s.serving == 0:  # no ready pod has metrics: HPA makes no change
            return self.hpa(s, current_replicas)
        current = s.kv_usage if cfg.metric == "kv_usage" else s.outstanding / s.serving
        ratio = current / cfg.target
        if s.warming and ratio > 1.0:  # a scale-up with unready pods, counted as using nothing
            if ratio * s.serving / current_replicas <= 1.0 + cfg.tolerance:  # within it, or reversed
                desired = current_replicas
            else:  # (the new ratio x every pod is ratio x the ready ones, computed so)
                desired = max(math.ceil(ratio * s.serving), current_replicas)
        elif s.warming and ratio < 1.0 and cfg.warming_as == "missing":  # at target: (ratio x ready + unready) / all
            held = ratio * s.serving + s.warming  # (the new ratio x every pod, computed so)
            desired = current_replicas if abs(held / current_replicas - 1.0) <= cfg.tolerance else math.ceil(held)
        elif abs(ratio - 1.0) <= cfg.tolerance:
            desired = current_replicas
        else:
            desired = math.ceil(ratio * s.serving)
        return self.hpa(s, desired)


@attrs.frozen
class QueueLengthConfig(HPAScalingConfig):
    signal: str = str_field("outstanding", choices=("waiting", "outstanding"),
                            help="'waiting': requests not yet admitted; 'outstanding': queued or running")
    target_per_instance: float = float_field(16.0, min=0.0, min_exclusive=True,
                                             help="requests of the signal each instance should hold")
    min_attainment: float | None = float_field(None, min=0.0, max=1.0, optional=True,
                                               help="one instance more while the window's SLO attainment is below this")


class QueueLength:
    """KEDA-style queue scaling, with an SLO guard. KEDA hands HPA the queue as an External metric
    with an ``AverageValue`` target, which HPA's ``GetExternalPerPodMetricReplicas`` turns into
    ``ceil(queue / target)`` -- unless the usage ratio ``queue / (target * current)``, ``current``
    being the pods ready or not (serving plus warming: the status replicas), is within the
    tolerance, when the count stays. One instance more than ``current`` while the window's SLO
    attainment is below ``min_attainment`` (a schedlab extension); then HPA's normalisation
    (:class:`HPANormalizer`: stabilised down, rate-limited up)."""

    def __init__(self, config: QueueLengthConfig | None = None):
        self.config = config or QueueLengthConfig()
        self.hpa = HPANormalizer(self.config)

    def decide(self, s) -> int:
        cfg = self.config
        queue = s.waiting if cfg.signal == "waiting" else s.outstanding
        current = s.serving + s.warming
        desired = math.ceil(queue / cfg.target_per_instance)
        if current and abs(1.0 - queue / (cfg.target_per_instance * current)) <= cfg.tolerance:
            desired = current
        if cfg.min_attainment is not None and s.finished and s.slo_attainment < cfg.min_attainment:
            desired = max(desired, current + 1)
        return self.hpa(s, desired)


@schedlab.hookimpl
def schedlab_register_autoscalers(register):
    register("target_utilization", TargetUtilization, config=TargetUtilizationConfig,
             help="Kubernetes HPA: ceil(serving x current / target) of KV usage or outstanding requests")
    register("queue_length", QueueLength, config=QueueLengthConfig,
             help="KEDA queue scaling (through HPA): ceil(queue / target per instance) outside a 10% "
                  "tolerance, +1 while SLO attainment is low")
