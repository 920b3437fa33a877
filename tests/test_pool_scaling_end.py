"""An autoscaled disaggregated pool is paid until the cluster's end, a request turned away on
arrival included: the fast engine's clocks do not move for one (the reference engine's do), and
the pools closed at the last clock -- 35 ms instead of 500, 14x too few GPU-hours and 8x too little
idle energy; none at all when every request was turned away (engines review s78). The colocated
autoscaler counted it on both engines."""

from __future__ import annotations

import pytest

from schedlab.study.experiment import load, run_experiment
from schedlab.testing import compare_runs

LATE_REJECT = """
[experiment]
reports = []
[workload]
kind = "inline"
requests = [{{prompt_tokens = 64, output_tokens = 4, arrival_ms = 0.0}},
            {{prompt_tokens = 2000, output_tokens = 4, arrival_ms = {late}}}]
[scheduler]
kind = "vllm"
async_scheduling = false
[cost_model]
kind = "linear"
[kv_cache]
kind = "paged"
block_size = 16
num_blocks = 50
bytes_per_block = 1048576
[cluster]
mode = "disaggregated"
link = {{bandwidth_gbps = 25, latency_us = 10}}
prefill = {{instances = 2, router = {{kind = "round_robin"}}, autoscaler = {{kind = "queue_length", interval_s = 0.1, min_instances = 1}}}}
decode = {{instances = 1}}
[[runs]]
name = "fast"
[[runs]]
name = "reference"
engine = "reference"
"""


@pytest.mark.parametrize("late", [500.0, 900.0])
def test_a_late_request_turned_away_keeps_the_pools_paid_until_it_came(tmp_path, late):
    """The 2,000-token prompt needs more than the 50 x 16 tokens of KV: turned away at ``late``.
    One prefill instance (the autoscaler's minimum) and the decode instance are on until then:
    2 GPUs x late ms."""
    path = tmp_path / "late.toml"
    path.write_text(LATE_REJECT.format(late=late))
    fast, reference = run_experiment(load(path)).all_runs()
    assert fast.requests["rejected"].tolist() == [0, 1]
    for run in (fast, reference):
        assert run.metrics["gpu_hours"] == pytest.approx(2 * late / 3.6e6)
    compare_runs(fast, reference, rel=1e-9)
