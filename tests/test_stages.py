"""Staged load (issue 20.4): constant-rate arrivals, and stages of a rate for a duration, back to
back or each after the previous one drains, for the synthetic and shared-prefix workloads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.configs import FieldError
from schedlab.frontend import ClientSide, FrontendConfig
from schedlab.testing import compare_runs, dyadic_linear_costs, examples, run_engine
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.workloads.arrivals import arrivals_ms
from schedlab_plugins.workloads.stages import parse_stages, stage_offsets_ms
from schedlab_plugins.workloads.synthetic import (
    SharedPrefixConfig, SyntheticConfig, make_shared_prefix_workload, make_synthetic_workload,
)

FIXED = {"dist": "fixed", "value": 8}


def synthetic(**settings):
    return make_synthetic_workload(SyntheticConfig(prompt=FIXED, output={"dist": "uniform", "low": 1, "high": 20},
                                                   **settings))


def times(workload, seed=0):
    return [r.arrival_ms for r in workload.requests(seed)]


def test_constant_arrivals_are_evenly_spaced():
    assert arrivals_ms("constant", 4, seed=3, rate=4.0).tolist() == [0.0, 250.0, 500.0, 750.0]
    assert times(synthetic(num_requests=3, arrival="constant", rate=10)) == [0.0, 100.0, 200.0]


def test_stages_back_to_back_by_hand():
    """2/s for 2 s (4 requests, 500 ms apart), a 0.5 s pause, then 4/s for 1 s from 2.5 s; a
    rate of 2.5/s for 1 s sends floor(2.5) = 2 requests."""
    w = synthetic(stages=[{"rate": 2, "duration_s": 2}, {"rate": 4, "duration_s": 1}, {"rate": 2.5, "duration_s": 1}],
                  arrival="constant", stage_gap_s=0.5)
    assert times(w) == [0.0, 500.0, 1000.0, 1500.0, 2500.0, 2750.0, 3000.0, 3250.0, 4000.0, 4400.0]
    assert w.num_requests == 10
    assert [r.id for r in w.requests(0)] == list(range(10))


def test_one_stage_is_the_unstaged_workload():
    """floor(rate x duration) requests at that rate: the same draws as num_requests at the rate."""
    staged = synthetic(stages=[{"rate": 5, "duration_s": 8}], arrival="poisson")
    plain = synthetic(num_requests=40, arrival="poisson", rate=5)
    for seed in (0, 7):
        a, b = list(staged.requests(seed)), list(plain.requests(seed))
        assert [r.arrival_ms for r in a] == pytest.approx([r.arrival_ms for r in b])
        assert [r.output_tokens for r in a] == [r.output_tokens for r in b]


def test_a_stage_sends_what_inference_perf_sends():
    """``int(stage.rate * stage.duration)``, the float product cut as inference-perf cuts it:
    0.29 x 100 is 28.999999999999996 in floating point, 28 requests there (29 here before)."""
    stages = parse_stages(({"rate": 0.29, "duration_s": 100}, {"rate": 0.57, "duration_s": 100},
                           {"rate": 4, "duration_s": 60}, {"rate": 2.5, "duration_s": 3}))
    assert [s.count for s in stages] == [28, 56, 240, 7]


@given(rate=st.floats(0.5, 50), seed=st.integers(0, 10**6))
@settings(max_examples=examples(40), deadline=None)
def test_changing_one_stage_rate_scales_its_gaps_and_leaves_the_others(rate, seed):
    """Common random numbers across stages: one stream of unit gaps, each stage scaling its own
    (here 20 requests in the second stage at any rate)."""
    def offsets(second_rate):
        stages = parse_stages(({"rate": 4, "duration_s": 5}, {"rate": second_rate, "duration_s": 20.5 / second_rate}))
        assert [s.count for s in stages] == [20, 20]
        return stage_offsets_ms("gamma", stages, seed, 2.0)

    base, other = offsets(2.0), offsets(rate)
    assert np.array_equal(base[0], other[0])
    assert np.allclose(base[1] * 2.0, other[1] * rate)


def test_staged_shared_prefix_keeps_its_sharing():
    config = SharedPrefixConfig(num_groups=3, prefix_tokens=50, suffix=FIXED, output=FIXED,
                                stages=[{"rate": 10, "duration_s": 1}, {"rate": 20, "duration_s": 1}],
                                arrival="constant")
    requests = list(make_shared_prefix_workload(config).requests(1))
    assert len(requests) == 30
    assert all(r.prefix_tokens == 50 and r.prefix_group in (0, 1, 2) for r in requests)
    assert [r.arrival_ms for r in requests[9:12]] == [900.0, 1000.0, 1050.0]


@pytest.mark.parametrize("settings, message", [
    ({"num_requests": 5, "stages": [{"rate": 1, "duration_s": 5}]}, "num_requests: give either num_requests or stages"),
    ({"rate": 5, "stages": [{"rate": 1, "duration_s": 5}]}, "rate: give either rate or stages"),
    ({"stages": []}, "stages: must be a non-empty list"),
    ({"stages": [{"rate": 1}]}, "stages: stage 1: missing 'duration_s'"),
    ({"stages": [{"rate": 1, "duration_s": 5}, {"rate": 1, "duration": 5}]},
     r"stages: stage 2: unknown key 'duration' \(did you mean 'duration_s'\?\)"),
    ({"stages": [{"rate": 0.1, "duration_s": 5}]}, "stages: stage 1: rate x duration_s = 0.5 sends no request"),
    ({"stages": [{"rate": -1, "duration_s": 5}]}, "stages: stage 1: rate must be a number > 0"),
    ({"stages": [{"rate": 1, "duration_s": 5}], "stage_start": "later"}, "stage_start: must be one of"),
    ({}, "num_requests: required"),
    # past the clock's end (10**12 ms): run refused it as 'arrival times must be at most ...', naming no key
    ({"stages": [{"rate": 1, "duration_s": 5}], "stage_gap_s": 1e308}, r"stage_gap_s: must be <= 1000000000.0"),
])
def test_bad_stage_settings_are_refused_by_name(settings, message):
    with pytest.raises(FieldError, match=message):
        SyntheticConfig(prompt=FIXED, output=FIXED, **settings)


# -- each stage after the previous one drains ---------------------------------------------------------


def drained(gap_s=0.25):
    return synthetic(stages=[{"rate": 50, "duration_s": 0.1}, {"rate": 100, "duration_s": 0.05},
                             {"rate": 20, "duration_s": 0.2}],
                     arrival="constant", stage_start="after_drain", stage_gap_s=gap_s)


def stage_of(rid):
    return 0 if rid < 5 else 1 if rid < 10 else 2


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("side", [None, ClientSide(FrontendConfig(network_ms=0.5, request_ms=1.0,
                                                                  tokenize_ms_per_token=0.125, token_ms=0.25))])
def test_each_stage_starts_when_the_previous_one_has_drained(engine, side):
    """Stage 2 starts 250 ms after its clients have the last byte of stage 1's last request;
    within a stage requests are 1 / rate apart."""
    w = drained()
    r = run_engine(w.requests(0), ContinuousScheduler(ContinuousConfig(max_num_seqs=2)), LinearCostModel(),
                   engine=engine, workload=w, client_side=side)
    req = r.requests
    assert req["id"].tolist() == list(range(14))
    sent = dict(zip(req["id"].tolist(), req["sent_ms"].tolist()))
    done = dict(zip(req["id"].tolist(), req["client_done_ms"].tolist()))
    for stage, first, count, gap in ((1, 5, 5, 10.0), (2, 10, 4, 50.0)):
        previous = [done[i] for i in done if stage_of(i) == stage - 1]
        assert sent[first] == max(previous) + 250.0
        assert [sent[i] - sent[first] for i in range(first, first + count)] == [gap * k for k in range(count)]


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost=dyadic_linear_costs(), seats=st.integers(1, 4), gap=st.sampled_from([0.0, 0.125, 2.0]))
def test_both_engines_agree_on_drained_stages(cost, seats, gap):
    runs = []
    for engine in ("fast", "reference"):
        w = drained(gap)
        runs.append(run_engine(w.requests(0), ContinuousScheduler(ContinuousConfig(max_num_seqs=seats)),
                               LinearCostModel(cost), engine=engine, workload=w))
    compare_runs(*runs, rel=1e-12)
