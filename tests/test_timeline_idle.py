"""The timeline figure draws an idle engine idle: a sample held until the next one once drew a run
busy 21% of the time with a sequence running all of it."""

from __future__ import annotations

import numpy as np

from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.reports.plot_timeline import instance_series

RUN = """
[workload]
kind = "synthetic"
num_requests = 2
arrival = "constant"
rate = 1
prompt = { dist = "fixed", value = 100 }
output = { dist = "fixed", value = 2 }
[scheduler]
kind = "vllm"
[cost_model]
kind = "linear"
prefill_ms_per_token = 0.04
decode_ms_per_step = 6.0
"""


def test_an_idle_gap_is_drawn_idle_by_hand(tmp_path):
    """Requests at 0 and 1,000 ms, each a 4 ms prefill then one 6 ms decode: the engine is busy
    0-10 and 1,000-1,010 ms and idle between, where nothing runs or waits."""
    path = tmp_path / "idle.toml"
    path.write_text(RUN)
    run = run_experiment(load(path)).all_runs()[0]
    (_, series), = instance_series(run)
    np.testing.assert_allclose(series["time_s"] * 1e3, [0.0, 4.0, 10.0, 1000.0, 1004.0, 1010.0])
    np.testing.assert_array_equal(series["running"], [1, 1, 0, 1, 1, 1])
    np.testing.assert_array_equal(series["waiting"], [0, 0, 0, 0, 0, 0])
