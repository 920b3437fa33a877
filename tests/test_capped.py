"""A concurrency cap on generated workloads (``max_concurrency``): each request is sent when it
is due and one of N slots is free, first due first served -- how ``vllm bench serve
--max-concurrency`` and inference-perf's workers hold a server at a fixed number in flight."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.frontend import ClientSide, FrontendConfig
from schedlab.testing import compare_runs, dyadic_linear_costs, examples, run_engine
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.workloads.capped import CappedRequests, CappedWorkload
from schedlab_plugins.workloads.columns import RequestColumns
from schedlab_plugins.workloads.synthetic import SyntheticConfig, make_synthetic_workload

FIXED = {"dist": "fixed", "value": 8}


def synthetic(**settings):
    return make_synthetic_workload(SyntheticConfig(prompt=FIXED, output={"dist": "uniform", "low": 1, "high": 20},
                                                   **settings))


def test_the_cap_sends_the_next_due_request_when_a_slot_frees_by_hand():
    """Due at 0, 10, 20, 30 ms with 2 slots: 0 and 10 go at once; a slot freed at 25 sends
    the request due at 20 then (it waited 5 ms), one freed at 26 sends the request due at 30
    when it is due, and nothing is left after that."""
    w = CappedRequests(np.array([0.0, 10.0, 20.0, 30.0]), RequestColumns(np.full(4, 8), np.full(4, 4)), 2, name="t")
    first = list(w.requests(0))
    assert [(r.id, r.arrival_ms) for r in first] == [(0, 0.0), (1, 10.0)]
    assert [(r.id, r.arrival_ms) for r in w.on_finish(first[0], 25.0)] == [(2, 25.0)]
    assert [(r.id, r.arrival_ms) for r in w.on_finish(first[1], 26.0)] == [(3, 30.0)]
    assert w.on_finish(first[0], 40.0) == []


def test_a_capped_staged_workload_passes_finishes_on_to_its_stages():
    """Two stages that each start after the previous drains (3 requests at 10/s, then 2 at
    10/s, 1 s apart), capped at 2: the third request of stage 1 waits for a slot; stage 2
    starts 1 s after stage 1's last finish and sends both its requests, due 100 ms apart."""
    w = synthetic(stages=[{"rate": 10, "duration_s": 0.3}, {"rate": 10, "duration_s": 0.2}], arrival="constant",
                  stage_start="after_drain", stage_gap_s=1.0, max_concurrency=2)
    assert isinstance(w, CappedWorkload) and w.closed_loop
    r0, r1 = list(w.requests(0))
    assert (r0.arrival_ms, r1.arrival_ms) == (0.0, 100.0)
    (r2,) = w.on_finish(r0, 250.0)
    assert (r2.id, r2.arrival_ms) == (2, 250.0)
    assert w.on_finish(r1, 300.0) == []  # a free slot, but stage 1 has not drained
    stage2 = w.on_finish(r2, 400.0)
    assert [(r.id, r.arrival_ms) for r in stage2] == [(3, 1400.0), (4, 1500.0)]


def in_flight_at_most(run, cap):
    """Requests the client has sent and not yet heard the end of never exceed ``cap``."""
    sent, done = run.requests["sent_ms"], run.requests["client_done_ms"]
    events = sorted([(t, 1) for t in sent] + [(t, -1) for t in done], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak <= cap, peak


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_an_overloaded_server_holds_exactly_the_cap_in_flight(engine):
    """400 requests at 1,000/s against a server that finishes far fewer: without the cap they
    pile up (hundreds in flight); with it the client never has more than 8 out, and sends
    later than due."""
    for cap in (None, 8):
        w = synthetic(num_requests=400, arrival="constant", rate=1000.0, max_concurrency=cap)
        r = run_engine(w.requests(0), ContinuousScheduler(ContinuousConfig(max_num_seqs=4)), LinearCostModel(),
                       engine=engine, workload=w)
        ok, peak = in_flight_at_most(r, 8)
        assert len(r.requests["id"]) == 400
        if cap is None:
            assert peak > 100
        else:
            assert ok and peak == 8
            assert (r.requests["sent_ms"][8:] > np.arange(8, 400)).all()  # due at k ms, sent later


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost=dyadic_linear_costs(), seats=st.integers(1, 4), cap=st.integers(1, 6), rate=st.sampled_from([50.0, 400.0]),
       drained=st.booleans(), front=st.booleans())
def test_both_engines_agree_on_capped_workloads(cost, seats, cap, rate, drained, front):
    """The fast engine and the reference engine give the same per-request times for capped
    workloads, staged or not, with a front end or none, and both keep to the cap."""
    side = ClientSide(FrontendConfig(network_ms=0.5, request_ms=1.0, tokenize_ms_per_token=0.125,
                                     token_ms=0.25)) if front else None
    settings_ = (dict(stages=[{"rate": rate, "duration_s": 0.05}, {"rate": rate / 2, "duration_s": 0.1}],
                      stage_start="after_drain", stage_gap_s=0.5) if drained else dict(num_requests=25, rate=rate))
    runs = []
    for engine in ("fast", "reference"):
        w = synthetic(arrival="poisson", max_concurrency=cap, **settings_)
        runs.append(run_engine(w.requests(3), ContinuousScheduler(ContinuousConfig(max_num_seqs=seats)),
                               LinearCostModel(cost), engine=engine, workload=w, client_side=side))
        assert in_flight_at_most(runs[-1], cap)[0]
    compare_runs(*runs, rel=1e-12)


def test_max_concurrency_is_checked():
    with pytest.raises(Exception, match="max_concurrency"):
        synthetic(num_requests=4, rate=1.0, max_concurrency=0)
