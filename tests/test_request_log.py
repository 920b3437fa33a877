"""The ``request_log`` report: a run written as a vLLM per-request log replays as that run.

The round trip is the test: a run's log, read back by ``vllm_log`` and run with the same settings,
gives every request the same first token and finish; requests that never finished are ``null``
lines the reader leaves out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from schedlab.errors import InputWarning
from schedlab.cli import main
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.reports.request_log import RequestLogReport

SETTINGS = """
[scheduler]
kind = "vllm"
max_num_seqs = 8
max_num_batched_tokens = 512
[cost_model]
kind = "linear"
decode_ms_per_step = 6.0
per_seq_ms = 0.5
prefill_ms_per_token = 0.04
"""


def run(tmp_path, name, workload, extra=""):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[experiment]\nname = "{name}"\nreports = ["request_log"]\n' + workload + SETTINGS + extra)
    results = run_experiment(load(path))
    RequestLogReport().write(results, tmp_path / name)
    return results.all_runs()[0], tmp_path / name / "logs" / f"{name}.jsonl"


def test_a_log_replays_as_the_run_it_was_written_from(tmp_path):
    workload = ('[workload]\nkind = "synthetic"\nnum_requests = 60\narrival = "poisson"\nrate = 4.0\n'
                'prompt = { dist = "uniform", low = 100, high = 1500 }\noutput = { dist = "uniform", low = 20, high = 300 }\n')
    truth, log = run(tmp_path, "truth", workload)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 60
    # a loaded run (8 slots at 4 requests/s): requests waited, so the replay is not trivially idle
    assert max(line["scheduled_ts"] - line["arrival_time"] for line in lines) > 0.5
    replay, _ = run(tmp_path, "replay", f'[workload]\nkind = "vllm_log"\npath = "{log}"\n')
    for column in ("prompt_tokens", "generated_tokens"):
        np.testing.assert_array_equal(replay.requests[column], truth.requests[column])
    for column in ("arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms"):
        np.testing.assert_allclose(replay.requests[column], truth.requests[column], rtol=0, atol=1e-6)
    # the replay keeps what the log measured, and it is the truth run's latencies
    assert replay.metrics["ttft_ms"]["p50"] == pytest.approx(truth.metrics["ttft_ms"]["p50"], abs=1e-6)


def test_requests_that_never_finished_are_null_lines_the_replay_leaves_out(tmp_path):
    # a 16-block cache of 16 tokens: a 400-token prompt (plus its answer) can never fit
    cache = '[kv_cache]\nkind = "paged"\nnum_blocks = 16\nblock_size = 16\n'
    workload = ('[workload]\nkind = "synthetic"\nnum_requests = 20\narrival = "poisson"\nrate = 2.0\n'
                'prompt = { dist = "uniform", low = 20, high = 400 }\noutput = { dist = "uniform", low = 5, high = 20 }\n')
    truth, log = run(tmp_path, "small", workload, cache)
    rejected = int(truth.requests["rejected"].sum())
    assert 0 < rejected < 20
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    nulls = [line for line in lines if line["first_token_ts"] is None]
    assert len(nulls) == rejected
    assert all(line["queued_ts"] is None and line["last_token_ts"] is None for line in nulls)
    with pytest.warns(InputWarning, match=f"{rejected} of the 20 requests have no timestamps"):
        replay, _ = run(tmp_path, "again", f'[workload]\nkind = "vllm_log"\npath = "{log}"\n', cache)
    assert len(replay.requests["id"]) == 20 - rejected
    assert not replay.requests["rejected"].any()


def test_the_report_is_named_in_toml_and_writes_one_log_per_run(tmp_path, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text('[experiment]\nname = "s"\nreports = ["request_log"]\n[workload]\nkind = "synthetic"\n'
                    'num_requests = 5\nrate = 1.0\nprompt = { dist = "fixed", value = 50 }\n'
                    'output = { dist = "fixed", value = 4 }\n' + SETTINGS
                    + '[sweep]\n"scheduler.max_num_seqs" = [1, 2]\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    logs = sorted((tmp_path / "out" / "logs").glob("*.jsonl"))
    assert len(logs) == 2
    for log in logs:
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert [line["input_toks"] for line in lines] == [50] * 5
        assert [line["output_toks"] for line in lines] == [4] * 5
        # the first request's prefill alone: 50 prompt tokens at 0.04 ms + a sequence's 0.5 ms (no decode)
        first = lines[0]
        assert first["arrival_time"] == first["queued_ts"] == first["scheduled_ts"] == 0.0
        assert first["first_token_ts"] == pytest.approx(0.0025)
