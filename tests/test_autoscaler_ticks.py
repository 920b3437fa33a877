"""The autoscaler decides until the run's work is done, and counts every instance that served
(review s80, routers).

A controller cannot know that no request will come: its ticks used to stop with the last arrival,
so two runs identical up to 15 s decided differently before then (one with a request at 15 s
drained an idle instance at 1 s, one without paid it for 16 s), and a burst sent at once was never
scaled. ``peak_serving`` was read at the ticks only, after each decision: an instance that turned
warm between two ticks and was drained at the next never counted.
"""

from __future__ import annotations

import pytest

from schedlab.engine.scaling import ScalingLimits
from schedlab.model import Request
from schedlab.testing import run_cluster
from schedlab_plugins.autoscalers import QueueLength, QueueLengthConfig
from schedlab_plugins.routers import LeastOutstandingRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

ENGINES = ("fast", "reference")


def make():
    return ContinuousScheduler(ContinuousConfig(max_num_seqs=8)), None, None


def queue_length():
    return QueueLength(QueueLengthConfig(target_per_instance=2, stabilization_s=0, tolerance=0))


@pytest.mark.parametrize("engine", ENGINES)
def test_decisions_before_a_time_do_not_depend_on_what_arrives_after_it(engine):
    # Two instances serving, ticks every second. One long request at 100 ms (2,000 tokens, about 16 s);
    # a second run adds a 2-token request at 15 s. The tick at 1 s sees 1 outstanding request
    # against 2 per instance: one instance is enough, instance 1 (idle) drains and is off at once.
    limits = ScalingLimits(min_instances=1, max_instances=2, initial=2, interval_ms=1000, cold_start_ms=500,
                           window_ms=1000)
    alone = [Request(0, 100.0, 16, 2000, max_tokens=2000)]
    later = alone + [Request(1, 15000.0, 16, 2, max_tokens=2)]
    runs = [run_cluster(reqs, make, 2, LeastOutstandingRouter(), engine=engine, autoscaler=queue_length(),
                        limits=limits) for reqs in (alone, later)]
    histories = [r.meta["scaling"]["history"] for r in runs]
    before = [[h for h in hist if h[0] < 15000] for hist in histories]
    assert before[0] == before[1]
    assert before[0][:3] == [[0.0, 2, 0, 0, 2], [1000, 1, 0, 1, 1], [2000, 1, 0, 0, 1]]
    for r in runs:
        end = r.meta["scaling"]["end_ms"]
        assert end > 16000
        # a tick every second until the work is done, none after it
        assert [h[0] for h in r.meta["scaling"]["history"]] == [0.0] + [1000 * k for k in range(1, int(end // 1000) + 1)]
        assert r.meta["scaling"]["intervals"] == [[0, 0.0, end], [1, 0.0, 1000]]
        assert r.metrics["gpu_hours"] == pytest.approx((end + 1000) / 3.6e6, rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_burst_sent_at_once_is_scaled(engine):
    # 24 requests at 0 on one instance of up to 4: the tick at 1 s sees 24 outstanding, 2 per
    # instance wanted -> 4 (the most); nothing arrives after 0 (before: no tick ever came).
    limits = ScalingLimits(min_instances=1, max_instances=4, initial=1, interval_ms=1000, cold_start_ms=500,
                           window_ms=1000)
    requests = [Request(i, 0.0, 16, 400, max_tokens=400) for i in range(24)]
    r = run_cluster(requests, make, 4, LeastOutstandingRouter(), engine=engine, autoscaler=queue_length(),
                    limits=limits)
    scaling = r.meta["scaling"]
    assert scaling["history"][1] == [1000, 1, 3, 0, 4]
    assert scaling["scale_ups"] == 1
    assert set(r.requests["instance"].tolist()) == {0}  # (routed at 0, before anything warmed)


@pytest.mark.parametrize("engine", ENGINES)
def test_peak_serving_counts_an_instance_warm_between_two_ticks(engine):
    # One instance serving of up to 2, ticks every second, a cold start of 0.5 s. Six requests at
    # 100 ms (150 tokens each, done at 1,296.8): the tick at 1 s sees 6 outstanding -> 2 wanted,
    # instance 1 warms and serves from 1.5 s. The tick at 2 s sees 1 outstanding (the request of
    # 1.6 s, offered both instances): one is enough, instance 1 drains. The ticks saw 1, 1 and 1
    # serving; two served from 1.5 to 2 s.
    limits = ScalingLimits(min_instances=1, max_instances=2, initial=1, interval_ms=1000, cold_start_ms=500,
                           window_ms=1000)
    requests = [Request(i, 100.0, 16, 150, max_tokens=150) for i in range(6)]
    requests += [Request(6, 1600.0, 16, 20, max_tokens=20), Request(7, 2500.0, 16, 2, max_tokens=2)]
    r = run_cluster(requests, make, 2, LeastOutstandingRouter(), engine=engine, autoscaler=queue_length(),
                    limits=limits)
    scaling = r.meta["scaling"]
    assert [h[1] for h in scaling["history"]] == [1, 1, 1]
    assert scaling["serving"] == [[0.0, 1], [1500.0, 2], [2000, 1]]
    assert r.metrics["fleet"]["peak_serving"] == 2 and r.metrics["fleet"]["min_serving"] == 1
