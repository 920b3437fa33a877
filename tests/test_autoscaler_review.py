"""The autoscaler findings of the routers/autoscalers review (/work/reviews/routers_autoscalers.md,
findings 6, 7 and 9), each against numbers worked out by hand from Kubernetes' HPA source
(``pkg/controller/podautoscaler/horizontal.go``, ``replica_calculator.go`` and
``pkg/apis/autoscaling/v2/defaults.go``):

* 6: HPA's scale-up rate limit -- the default behavior's ``max(start + 4, 2 x start)`` per 15 s,
  ``start`` the count at the start of the period (``getReplicasChangePerPeriod``); ``"legacy"``,
  an HPA without ``behavior``: ``max(2 x current, 4)`` per decision; ``"none"``: no limit;
* 7: ``queue_length`` leaves the count alone while ``queue / (target x (serving + warming))`` is
  within HPA's tolerance (``GetExternalPerPodMetricReplicas``);
* 9: ``warming_as = "missing"``: warming instances as Running pods missing metrics, taken at target
  on a scale-down (``calcPlainMetricReplicas``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from schedlab.configs import FieldError
from schedlab.engine.scaling import Signals
from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.autoscalers import (QueueLength, QueueLengthConfig, TargetUtilization,
                                          TargetUtilizationConfig)


def ticks(policy, steps, low=1, high=16):
    """``policy``'s answers to ``steps``, (time s, serving, warming, outstanding) each."""
    return [policy.decide(Signals(t * 1e3, serving, warming, 0, low, high, 0, 0, outstanding, 0.0, 60e3, 0, 0, 0,
                                  math.nan)) for t, serving, warming, outstanding in steps]


def hpa(**kw):
    return TargetUtilization(TargetUtilizationConfig(metric="outstanding", target=12, **kw))


# -- 6: the scale-up rate limit ---------------------------------------------------------------------------

def test_the_default_behavior_limits_a_step_to_4_pods_or_100_percent_per_15_s_by_hand():
    """One instance serving 300 requests wants ceil(300 / 12) = 25 -> 16 (the most). HPA's default
    behavior: from 1, max(1 + 4, 2 x 1) = 5; 15 s later the first change is exactly one period
    old and no longer counts (After(cutoff) is strict): max(5 + 4, 10) = 10; then
    max(14, 20) -> 16. The serving instance stays above target with the warming ones counted as
    using nothing (300 / 12 / 5 and / 10 well above 1.1)."""
    steps = [(15, 1, 0, 300), (30, 1, 4, 300), (45, 1, 9, 300), (60, 1, 15, 300)]
    assert ticks(hpa(), steps) == [5, 10, 16, 16]
    # an HPA without a behavior field: max(2 x 1, 4) = 4, then 8, then 16, per decision
    assert ticks(hpa(scale_up_limit="legacy"), [(15, 1, 0, 300), (30, 1, 3, 300), (45, 1, 7, 300)]) == [4, 8, 16]
    # no limit: the whole way at once, as before
    assert ticks(hpa(scale_up_limit="none"), [(15, 1, 0, 300)]) == [16]


def test_the_limit_counts_the_changes_of_the_last_period_only_by_hand():
    """Decisions every 5 s against a 15 s period: after 1 -> 5 at 0 s, the start of the period
    is 1 at 5 s and 10 s (limit 5, no change), and 5 at 15 s, when the change at 0 s is exactly
    one period old: max(9, 10) = 10."""
    steps = [(0, 1, 0, 300), (5, 1, 4, 300), (10, 1, 4, 300), (15, 1, 4, 300), (20, 1, 9, 300)]
    assert ticks(hpa(), steps) == [5, 5, 5, 10, 10]


def test_a_scale_down_within_the_period_raises_its_start_by_hand():
    """calculateScaleUpLimitWithScalingRules: start = current - added + deleted. 8 serving idle
    go down to 1, the minimum, at 0 s (no stabilisation); at 5 s a burst on the one left wants
    ceil(192 / 12) = 16: the period started at 8, so max(8 + 4, 16) = 16 are allowed, not
    max(1 + 4, 2) = 5 (which they are 20 s later, the scale-down out of the period)."""
    policy = hpa(stabilization_s=0)
    assert ticks(policy, [(0, 8, 0, 0), (5, 1, 0, 192)]) == [1, 16]
    assert ticks(hpa(stabilization_s=0), [(0, 8, 0, 0), (20, 1, 0, 192)]) == [1, 5]  # 20 s later: from 1


def test_the_policies_by_hand():
    """Pods only (percent 0), percent only (pods 0), and the percent rounded up."""
    up = [(15, 10, 0, 12 * 40)]  # 10 serving at ratio 4: wants 40 -> 16
    assert ticks(hpa(scale_up_percent=0), up) == [14]                  # 10 + 4
    assert ticks(hpa(scale_up_pods=0), up, high=64) == [20]            # 2 x 10
    assert ticks(hpa(scale_up_pods=0, scale_up_percent=10), [(15, 3, 0, 12 * 12)]) == [4]  # ceil(3 x 1.1) = 4
    assert ticks(hpa(scale_up_pods=2, scale_up_percent=50), [(15, 4, 0, 12 * 40)]) == [6]  # max(4 + 2, 6)
    assert ticks(hpa(scale_up_pods=2, scale_up_percent=50, scale_up_period_s=60),
                 [(0, 4, 0, 480), (30, 4, 2, 480), (60, 4, 2, 480)]) == [6, 6, 9]  # max(6 + 2, 9)


def test_a_held_scale_down_stays_at_the_current_count_under_the_default_behavior_by_hand():
    """stabilizeRecommendationWithBehaviors brings the recommendation within [lowest of the
    up-window (0 s: the recommendation), highest of the down-window] from the current count:
    16 wanted at 0 s but 5 allowed, then 1 wanted at 15 s (the serving one at 6: ratio 0.5, the
    warming ones left out) -- the count stays 5: the window's 16 does not drive a scale-up. An
    HPA without behavior (stabilizeRecommendation: the window's highest, whichever way) goes on
    up, limited: max(2 x 4, 4) = 8 at 15 s; without a limit it went to 16 at once."""
    assert ticks(hpa(), [(0, 1, 0, 192), (15, 1, 4, 6)]) == [5, 5]
    assert ticks(hpa(scale_up_limit="legacy"), [(0, 1, 0, 192), (15, 1, 3, 6)]) == [4, 8]
    assert ticks(hpa(scale_up_limit="none"), [(0, 1, 0, 192), (15, 1, 15, 6)]) == [16, 16]


def test_queue_length_goes_through_the_same_limit_by_hand():
    """KEDA goes through HPA: 300 queued over 1 serving, 16 each, want ceil(300 / 16) = 19 ->
    16; the default behavior allows 5, then 10, then 16."""
    policy = QueueLength(QueueLengthConfig())
    assert ticks(policy, [(15, 1, 0, 300), (30, 1, 4, 300), (45, 1, 9, 300)]) == [5, 10, 16]


STEP = """
[experiment]
name = "burst"
reports = []
timeline = false

[workload]
kind = "synthetic"
num_requests = 3150
arrival = "poisson"
rate = 45
prompt = {dist = "lognormal", median = 200, sigma = 0.3, low = 100, high = 400}
output = {dist = "lognormal", median = 300, sigma = 0.3, low = 200, high = 400}

[scheduler]
kind = "vllm"

[kv_cache]
kind = "paged"
num_blocks = 4000

[cost_model]
kind = "linear"

[cluster]
instances = 16
router = {kind = "least_outstanding"}
autoscaler = {kind = "target_utilization", metric = "outstanding", target = 12, min_instances = 1, interval_s = 15, cold_start_s = 60}
"""


def step_run(tmp_path, *overrides):
    path = tmp_path / "burst.toml"
    path.write_text(STEP)
    return run_experiment(load(path, list(overrides))).all_runs()[0]


@pytest.mark.parametrize("limit, expected", [("behavior", [5, 10, 16]), ("legacy", [4, 8, 16]), ("none", [16, 16, 16])])
def test_a_burst_on_one_instance_scales_1_5_10_16_in_both_engines(tmp_path, limit, expected):
    """45 requests/s of ~300-token answers from t = 0 on one warm instance of 16 (cold start 60 s,
    so it serves alone until 75 s): by the ticks at 15, 30 and 45 s it holds more than 16 x 12
    requests (counted here from the rows), so HPA wants all 16 each time, and the limit alone
    sets how many are paid for: 1 -> 5 -> 10 -> 16 under the default behavior."""
    runs = [step_run(tmp_path, f'cluster.autoscaler.scale_up_limit="{limit}"', f"experiment.engine={engine}")
            for engine in ("fast", "reference")]
    for run in runs:
        req = run.requests
        for t in (15e3, 30e3, 45e3):  # the premise: the one serving instance wants every instance
            assert int(((req["arrival_ms"] <= t) & (req["finish_ms"] > t)).sum()) > 16 * 12 + 8
        history = run.meta["scaling"]["history"]
        assert [h[0] for h in history[1:4]] == [15e3, 30e3, 45e3]
        assert [h[1] + h[2] for h in history[1:4]] == expected  # serving + warming (paid for)
        assert [h[1] for h in history[1:4]] == [1, 1, 1]
    fast, ref = runs
    assert fast.meta["scaling"]["history"] == ref.meta["scaling"]["history"]
    np.testing.assert_allclose(np.array(fast.meta["scaling"]["intervals"]), np.array(ref.meta["scaling"]["intervals"]),
                               rtol=1e-12)
    np.testing.assert_allclose(fast.requests["finish_ms"], ref.requests["finish_ms"], rtol=1e-12)


def test_bad_limit_settings_are_refused_in_one_line(tmp_path):
    with pytest.raises(FieldError, match=r"^scale_up_pods: 0 with scale_up_percent = 0 would never allow a scale-up; "
                                         r"set scale_up_limit = 'none' for no limit$"):
        TargetUtilizationConfig(scale_up_pods=0, scale_up_percent=0)
    assert QueueLengthConfig(scale_up_pods=0, scale_up_percent=0, scale_up_limit="none")  # no limit: fine
    for kw, message in [({"scale_up_limit": "max"}, "scale_up_limit: must be one of 'behavior', 'legacy', 'none'"),
                        ({"scale_up_period_s": 0}, "scale_up_period_s: must be > 0"),
                        ({"scale_up_pods": -1}, "scale_up_pods: must be >= 0"),
                        ({"scale_up_percent": 1.5}, "scale_up_percent: must be a whole number"),
                        ({"tolerance": -0.1}, "tolerance: must be >= 0")]:
        with pytest.raises(FieldError, match="^" + message):
            QueueLengthConfig(**kw)
    path = tmp_path / "burst.toml"
    path.write_text(STEP)
    with pytest.raises(ConfigError, match=r"\[cluster.autoscaler\].*scale_up_pods: 0 with scale_up_percent = 0") as e:
        load(path, ["cluster.autoscaler.scale_up_pods=0", "cluster.autoscaler.scale_up_percent=0"])
    assert "\n" not in str(e.value)


# -- 7: queue_length's tolerance ---------------------------------------------------------------------------

def queue(**kw):
    return QueueLength(QueueLengthConfig(target_per_instance=16, stabilization_s=0, scale_up_limit="none", **kw))


def test_queue_length_keeps_the_count_within_hpas_tolerance_by_hand():
    """The review's tick: 50 outstanding over 3 serving, 16 each: 50 / 48 = 1.04, within 10%:
    3 (before: ceil(50 / 16) = 4)."""
    assert ticks(queue(), [(15, 3, 0, 50)]) == [3]
    # relative to serving + warming (HPA's status replicas): 2 serving and 1 warming, still 3
    # (over the serving alone 50 / 32 = 1.56 would scale to 4)
    assert ticks(queue(), [(15, 2, 1, 50)]) == [3]
    # outside it: 60 / 48 = 1.25: ceil(60 / 16) = 4
    assert ticks(queue(), [(15, 3, 0, 60)]) == [4]
    # down within it: 174 / (16 x 12) = 0.906: 12 (before: ceil(10.9) = 11)
    assert ticks(queue(), [(15, 12, 0, 174)]) == [12]
    # down outside it: 160 / 192 = 0.83: ceil(10) = 10
    assert ticks(queue(), [(15, 12, 0, 160)]) == [10]
    # configurable: no tolerance, as before
    assert ticks(queue(tolerance=0.0), [(15, 3, 0, 50)]) == [4]
    assert ticks(queue(tolerance=0.3), [(15, 3, 0, 60)]) == [3]


def test_the_slo_guard_still_adds_one_within_the_tolerance_by_hand():
    policy = queue(min_attainment=0.9)
    s = Signals(15e3, 3, 0, 0, 1, 16, 0, 0, 50, 0.0, 60e3, 0, 10, 5, 0.5)  # attainment 0.5
    assert policy.decide(s) == 4  # 3 (within the tolerance) + 1


# -- 9: warming instances on a scale-down -----------------------------------------------------------------

def test_warming_instances_as_pods_missing_metrics_hold_a_scale_down_by_hand():
    """The review's tick: 4 serving at 6 outstanding each (target 12: ratio 0.5), 2 warming, no
    stabilisation. As Pending (unready) pods they are left out: ceil(0.5 x 4) = 2. As pods
    missing metrics they are at target on a scale-down: (0.5 x 4 + 2) / 6 = 0.67, out of the
    tolerance: ceil(0.67 x 6) = 4."""
    kw = {"stabilization_s": 0, "scale_up_limit": "none"}
    assert ticks(hpa(**kw), [(15, 4, 2, 24)]) == [2]
    assert ticks(hpa(warming_as="missing", **kw), [(15, 4, 2, 24)]) == [4]
    # target 10: 8 serving at 8.5 (ratio 0.85), 2 warming: (6.8 + 2) / 10 = 0.88: ceil(8.8) = 9
    # (pending: ceil(6.8) = 7)
    ten = {"metric": "outstanding", "target": 10, **kw}
    assert ticks(TargetUtilization(TargetUtilizationConfig(warming_as="missing", **ten)), [(15, 8, 2, 68)]) == [9]
    assert ticks(TargetUtilization(TargetUtilizationConfig(**ten)), [(15, 8, 2, 68)]) == [7]
    # 6 serving at 8.5, 4 warming: (5.1 + 4) / 10 = 0.91, within the tolerance: 10 (pending: 6)
    assert ticks(TargetUtilization(TargetUtilizationConfig(warming_as="missing", **ten)), [(15, 6, 4, 51)]) == [10]
    assert ticks(TargetUtilization(TargetUtilizationConfig(**ten)), [(15, 6, 4, 51)]) == [6]
    # a scale-up is the same either way (using nothing): ratio 5 over 2 serving, 1 warming: 10
    for how in ("pending", "missing"):
        assert ticks(hpa(warming_as=how, **kw), [(15, 2, 1, 120)]) == [10]
