"""Built-in autoscalers (``[cluster] autoscaler = {kind = ...}``): how many instances should serve.

* ``target_utilization`` -- Kubernetes' Horizontal Pod Autoscaler rule: ``desired =
  ceil(serving * current / target)`` of a per-instance signal (KV-cache usage, as vLLM's
  ``kv_cache_usage_perc``, or outstanding requests), left alone within a 10% tolerance, warming
  instances counted as HPA counts unready pods (never a scale-down while the serving ones are
  above target), and scaled down only to the highest recommendation of the last five minutes
  (HPA's ``--horizontal-pod-autoscaler-downscale-stabilization``, default 300 s).
* ``queue_length`` -- KEDA's queue scalers: ``desired = ceil(queue / target_per_instance)`` of the
  requests waiting (or outstanding) over the serving instances, one more instance while the
  window's SLO attainment is below ``min_attainment``, and the same down-scale stabilisation.

Both read only :class:`schedlab.engine.scaling.Signals`; the engine keeps their answer within
``min_instances`` and ``max_instances``, warms new instances for ``cold_start_s`` and drains the
ones it removes (see :mod:`schedlab.engine.scaling`).
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

    def __attrs_post_init__(self):
        if self.max_instances is not None and self.max_instances < self.min_instances:
            raise FieldError("max_instances", f"must be at least min_instances ({self.min_instances})")
        if self.initial is not None and (self.initial < self.min_instances or
                                         (self.max_instances is not None and self.initial > self.max_instances)):
            raise FieldError("initial", "must be between min_instances and max_instances")


class Stabilized:
    """Down-scale stabilisation: the highest recommendation of the last ``seconds``."""

    def __init__(self, seconds: float):
        self.window_ms = seconds * 1e3
        self.recent: list[tuple[float, int]] = []

    def __call__(self, now_ms: float, recommendation: int) -> int:
        self.recent = [(t, r) for t, r in self.recent if t > now_ms - self.window_ms]
        self.recent.append((now_ms, recommendation))
        return max(r for _, r in self.recent)


@attrs.frozen
class TargetUtilizationConfig(ScalingConfig):
    metric: str = str_field("kv_usage", choices=("kv_usage", "outstanding"),
                            help="'kv_usage': mean KV-cache usage of the serving instances (0-1); 'outstanding': "
                                 "requests queued or running per serving instance")
    target: float = float_field(0.6, min=0.0, min_exclusive=True, help="the value to hold the metric at")
    tolerance: float = float_field(0.1, min=0.0, help="no change while current / target is within 1 +- this (HPA: 0.1)")


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

    Down-scales are then stabilised (the highest recommendation of ``stabilization_s``)."""

    def __init__(self, config: TargetUtilizationConfig | None = None):
        self.config = config or TargetUtilizationConfig()
        self.stable = Stabilized(self.config.stabilization_s)

    def decide(self, s) -> int:
        cfg = self.config
        current_replicas = s.serving + s.warming
        if s.serving == 0:  # no ready pod has metrics: HPA makes no change
            return self.stable(s.now_ms, current_replicas)
        current = s.kv_usage if cfg.metric == "kv_usage" else s.outstanding / s.serving
        ratio = current / cfg.target
        if s.warming and ratio > 1.0:  # a scale-up with unready pods, counted as using nothing
            if ratio * s.serving / current_replicas <= 1.0 + cfg.tolerance:  # within it, or reversed
                desired = current_replicas
            else:  # (the new ratio x every pod is ratio x the ready ones, computed so)
                desired = max(math.ceil(ratio * s.serving), current_replicas)
        elif abs(ratio - 1.0) <= cfg.tolerance:
            desired = current_replicas
        else:
            desired = math.ceil(ratio * s.serving)
        return self.stable(s.now_ms, desired)


@attrs.frozen
class QueueLengthConfig(ScalingConfig):
    signal: str = str_field("outstanding", choices=("waiting", "outstanding"),
                            help="'waiting': requests not yet admitted; 'outstanding': queued or running")
    target_per_instance: float = float_field(16.0, min=0.0, min_exclusive=True,
                                             help="requests of the signal each instance should hold")
    min_attainment: float | None = float_field(None, min=0.0, max=1.0, optional=True,
                                               help="one instance more while the window's SLO attainment is below this")


class QueueLength:
    """KEDA-style queue scaling (``desired = ceil(queue / target)``), with an SLO guard."""

    def __init__(self, config: QueueLengthConfig | None = None):
        self.config = config or QueueLengthConfig()
        self.stable = Stabilized(self.config.stabilization_s)

    def decide(self, s) -> int:
        cfg = self.config
        queue = s.waiting if cfg.signal == "waiting" else s.outstanding
        desired = math.ceil(queue / cfg.target_per_instance)
        if cfg.min_attainment is not None and s.finished and s.slo_attainment < cfg.min_attainment:
            desired = max(desired, s.serving + s.warming + 1)
        return self.stable(s.now_ms, desired)


@schedlab.hookimpl
def schedlab_register_autoscalers(register):
    register("target_utilization", TargetUtilization, config=TargetUtilizationConfig,
             help="Kubernetes HPA: ceil(serving x current / target) of KV usage or outstanding requests")
    register("queue_length", QueueLength, config=QueueLengthConfig,
             help="KEDA queue scaling: ceil(queue / target per instance), +1 while SLO attainment is low")
