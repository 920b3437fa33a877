"""A stall is a scheduler planning nothing again and again with nothing new: the engines counted
every empty plan, the wake-ups that arrivals and client aborts cause too, so a batching window
holding back more than 1,000 arrivals -- or a disaggregated prefill instance waiting out the KV
lease of abandoned prompts while requests kept coming -- was stopped as "stalled" though a wake-up
was due (fuzz review s78). An arrival or an abort now starts the count over, in both engines; a
scheduler that wakes itself for ever is still caught (tests/test_kit_catches_bugs.py)."""

from __future__ import annotations

import pytest

from schedlab.study.experiment import load, run_experiment
from schedlab.testing import compare_runs

WINDOW = """
[experiment]
reports = []
engine = "{engine}"
[workload]
kind = "synthetic"
num_requests = 1200
prompt = {{dist = "fixed", value = 8}}
output = {{dist = "fixed", value = 2}}
arrival = "constant"
rate = 1000.0
[cost_model]
kind = "linear"
[kv_cache]
num_blocks = 100000
[scheduler]
kind = "continuous"
max_num_seqs = 2048
max_num_batched_tokens = 200000
min_batch = 1100
max_wait_ms = 5000
"""


def test_a_window_holding_back_more_than_a_thousand_arrivals_is_no_stall(tmp_path):
    """1,200 arrivals 1 ms apart; the window waits for 1,100 of them (each wakes an empty plan):
    the first batch starts when the 1,100th arrives, at 1,099 ms."""
    runs = {}
    for engine in ("fast", "reference"):
        path = tmp_path / f"{engine}.toml"
        path.write_text(WINDOW.format(engine=engine))
        runs[engine] = run_experiment(load(path)).all_runs()[0]
        assert runs[engine].metrics["finished"] == 1200
        assert runs[engine].requests["first_scheduled_ms"].min() == pytest.approx(1099.0)
    compare_runs(runs["fast"], runs["reference"], rel=1e-9)
