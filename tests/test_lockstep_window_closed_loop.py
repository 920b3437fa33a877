"""A closed loop over two lockstep units (data-parallel deployments, pipelined instances) whose
scheduler holds requests behind a batching window: the fast engine's closed-loop driver let the
unit furthest behind run only up to the other's clock, and when both waited for the window at one
clock each call moved one of them on by one ulp -- 4.6e18 calls to reach a 1 ms window (engine
review s78). A unit that planned nothing says until when it waits (``waits_until``), and the
other may run up to then. Both engines must give the same rows, in a bounded number of steps --
with two identical units, also when their batches land at the same time: the later-listed unit
landed its batch at the other's clock first, releasing its client's next request first, where the
reference engine orders iterations that start together by instance (found with this test)."""

from __future__ import annotations

import pytest

import schedlab.engine.driver as driver
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import compare_runs

LAYOUTS = {
    "data_parallel": ('model = "mixtral-8x7b"\ngpu = "h100-80gb"\ntensor_parallel = 1\n',
                      'data_parallel = 2\nexpert_parallel = true\ninstances = 2\n'),
    "pipeline": ('model = "llama-3-8b"\ngpu = "h100-80gb"\ntensor_parallel = 2\n',
                 "pipeline_parallel = 2\ninstances = 2\n"),
}


def experiment(tmp_path, layout: str, engine: str):
    cost, cluster = LAYOUTS[layout]
    path = tmp_path / f"{layout}_{engine}.toml"
    path.write_text(f"""
[experiment]
reports = []
engine = "{engine}"
[workload]
kind = "closed_loop"
clients = 2
num_requests = 4
prompt = {{dist = "fixed", value = 100}}
output = {{dist = "fixed", value = 10}}
[cost_model]
kind = "roofline"
{cost}[scheduler]
kind = "vllm"
async_scheduling = false
max_wait_ms = 1.0
[kv_cache]
kind = "paged"
num_blocks = 400
[cluster]
{cluster}router = {{kind = "least_outstanding"}}
""")
    return load(path)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_two_lockstep_units_behind_a_window_finish_and_agree(tmp_path, layout, monkeypatch):
    calls = [0]
    advance = driver._advance_lockstep

    def counted(*args):
        calls[0] += 1
        if calls[0] > 10_000:  # (a few dozen suffice; the bug took ~1e18)
            raise AssertionError("the closed-loop driver keeps advancing by an ulp")
        return advance(*args)

    monkeypatch.setattr(driver, "_advance_lockstep", counted)
    fast = run_experiment(experiment(tmp_path, layout, "fast")).all_runs()[0]
    reference = run_experiment(experiment(tmp_path, layout, "reference")).all_runs()[0]
    assert 0 < calls[0] <= 10_000
    assert fast.metrics["finished"] == reference.metrics["finished"] == 4
    # the window holds each unit's first request 1 ms before its first step
    assert (fast.requests["first_scheduled_ms"] >= 1.0).all()
    compare_runs(fast, reference, rel=1e-9)
