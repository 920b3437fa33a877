"""Replaying an inference-perf run from its per-request report (``kind = "inference_perf"``):
the record formats across its versions, failed requests, prefix blocks from prompt text, a
run schedlab wrote as such a report replayed to the same latencies, the warning that a
concurrency is not held open loop, and a concurrent run replayed as a closed loop. Every file is
written by the test."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from schedlab.errors import WorkloadError
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.workloads.inference_perf import (
    InferencePerfConfig, load_inference_perf, make_inference_perf_workload, text_block_ids,
)
from schedlab_plugins.workloads.measured import BenchReplayWarning


def record(start, end, payload, info, error=None):
    return {"start_time": start, "end_time": end, "request": json.dumps(payload), "response": "", "info": info,
            "error": error}


def write(tmp_path, records, name="per_request_lifecycle_metrics.json"):
    path = tmp_path / name
    path.write_text(json.dumps(records))
    return path


def test_both_record_formats_and_a_failure_by_hand(tmp_path):
    """An older record (counts and token times at info's top), a newer one (request_metrics,
    response_metrics with the server's usage, which wins over the client's count), and a
    failed one, out of order. Sent at 100.0 s and 100.5 s: arrivals 0 and 500 ms."""
    old = record(100.0, 100.8, {"prompt": "a", "max_tokens": 8},
                 {"input_tokens": 12, "output_tokens": 5, "output_token_times": [100.1, 100.2, 100.7]})
    new = record(100.5, 101.0, {"messages": [{"role": "user", "content": "b"}], "max_tokens": 2},
                 {"request_metrics": {"text": {"input_tokens": 30}},
                  "response_metrics": {"output_tokens": 4, "server_usage": {"completion_tokens": 3},
                                       "output_token_times": [100.55, 100.6, 100.95]}})
    failed = record(100.2, 100.3, {"prompt": "c"}, None, error={"error_type": "Timeout", "error_msg": "x"})
    sent, columns, measured, n_failed = load_inference_perf(write(tmp_path, [new, failed, old]), prefix_blocks="none")
    assert n_failed == 1
    assert sent.tolist() == pytest.approx([0.0, 500.0])
    assert columns.prompt_tokens.tolist() == [12, 30] and columns.output_tokens.tolist() == [5, 3]
    assert columns.per_row["max_tokens"] == [8, None]  # 2 < the 3 generated: not a cap that held
    assert measured.view == "client"
    assert measured.ttft_ms.tolist() == pytest.approx([100.0, 50.0])
    assert measured.e2e_ms.tolist() == pytest.approx([800.0, 500.0])
    assert measured.tpot_ms.tolist() == pytest.approx([(700.0 - 100.0) / 4, (450.0 - 50.0) / 2])


def test_a_content_part_whose_text_is_not_text_is_skipped():
    """Chat content parts: only string texts count (a null or an object there raised TypeError)."""
    from schedlab_plugins.workloads.inference_perf import prompt_text

    payload = {"messages": [{"role": "user", "content": [{"type": "text", "text": None},
                                                          {"type": "text", "text": {"a": 1}},
                                                          {"type": "text", "text": "hi"},
                                                          {"type": "image_url", "image_url": {"url": "x"}}]},
                            {"role": "user", "content": "there"}]}
    assert prompt_text(payload) == "hi\nthere"


def test_prefix_blocks_from_text_by_hand():
    """48 characters over 15 tokens (the prompts with text): 3.2 a token, blocks of 2 tokens =
    round(6.4) = 6 characters.
    The first two prompts share their first 12 characters (2 blocks) and differ after; the
    third shares nothing; a prompt of 3 tokens holds one full block."""
    texts = ["abcdefghijkl" + "XXXXXX", "abcdefghijkl" + "YYYYYY", "zzzzzzzzzzzz", None]
    tokens = np.array([6, 6, 3, 5])
    ids = text_block_ids(texts, tokens, block_tokens=2)
    assert ids[0][:2] == ids[1][:2] and ids[0][2] != ids[1][2]
    assert len(ids[0]) == 3 and len(ids[2]) == 1 and ids[2][0] not in ids[0]
    assert ids[3] is None


def test_a_run_written_as_a_report_replays_to_its_own_latencies(tmp_path):
    """A schedlab run (linear costs, Poisson arrivals) written as inference-perf would (send,
    first and last token, end, in seconds from 1,000 s) and replayed with the same settings:
    every one of the 15 statistics within 1e-6 %."""
    base = """
[experiment]
reports = []
[scheduler]
kind = "vllm"
max_num_seqs = 8
max_num_batched_tokens = 512
[cost_model]
kind = "linear"
"""
    truth_toml = tmp_path / "truth.toml"
    truth_toml.write_text(base + """
[workload]
kind = "synthetic"
num_requests = 80
rate = 4.0
prompt = { dist = "uniform", low = 20, high = 600 }
output = { dist = "uniform", low = 2, high = 120 }
""")
    run = run_experiment(load(truth_toml)).all_runs()[0]
    r = run.requests
    records = [record(1000 + r["arrival_ms"][i] / 1e3, 1000 + r["finish_ms"][i] / 1e3, {"prompt": f"p{i}"},
                      {"input_tokens": int(r["prompt_tokens"][i]), "output_tokens": int(r["generated_tokens"][i]),
                       "output_token_times": [1000 + r["first_token_ms"][i] / 1e3, 1000 + r["finish_ms"][i] / 1e3]})
               for i in range(len(r["id"]))]
    write(tmp_path, records, "report.json")
    replay_toml = tmp_path / "replay.toml"
    # the placeholder prompts ("p0", "p1", ...) share text, not prefixes: no prefix blocks from them
    replay_toml.write_text(base + '[workload]\nkind = "inference_perf"\npath = "report.json"\nprefix_blocks = "none"\n')
    with pytest.warns(BenchReplayWarning, match="replayed open loop"):
        replay = run_experiment(load(replay_toml)).all_runs()[0]
    vs = replay.metrics["vs_measured"]
    assert len(vs["errors_pct"]) == 15
    assert vs["mean_abs_error_pct"] < 1e-6


@pytest.mark.parametrize("content, message", [
    ({"not": "a list"}, "expected a JSON list of requests"),
    ([{"start_time": 1.0, "end_time": 2.0}], "request 0: missing field 'info'"),
    ([record(1.0, 2.0, {}, {"input_tokens": 5})], "request 0: info holds no output token count"),
    ([record(2.0, 1.0, {}, {"input_tokens": 5, "output_tokens": 2})], "end_time 1.0 is before start_time 2.0"),
    ([record(1.0, 2.0, {}, None, error={"error_type": "x"})], r"no successful requests \(1 failed\)"),
    ([record(1.0, 2.0, {}, {"input_tokens": 10**20, "output_tokens": 2})],   # was an OverflowError
     r"request 0: input tokens: must be a whole number from 1 to 10\*\*8, got 100000000000000000000"),
])
def test_bad_reports_are_named(tmp_path, content, message):
    with pytest.raises(WorkloadError, match=message):
        load_inference_perf(write(tmp_path, content))


def three_records(starts=(100.0, 100.01, 100.02)):
    """Prompt 100, 200, 40 tokens and outputs 3, 2, 4, each capped at its output, sent at ``starts``."""
    shapes = [(100, 3), (200, 2), (40, 4)]
    return [record(s, s + 0.0095, {"prompt": f"q{i}", "max_tokens": o},
                   {"request_metrics": {"text": {"input_tokens": p}},
                    "response_metrics": {"output_tokens": o, "output_token_times": [s + 0.004, s + 0.009]}})
            for i, (s, (p, o)) in enumerate(zip(starts, shapes))]


def test_an_open_loop_replay_says_a_concurrency_is_not_held(tmp_path):
    """The report keeps no load type and no scheduled_time: sent at the recorded times (0, 10,
    20 ms), with a one-line warning naming the file. It was said nowhere (the docstring claimed
    the send times held the client's waits for a worker, which hold only at the real server's
    speed)."""
    path = write(tmp_path, three_records())
    with pytest.warns(BenchReplayWarning, match="^" + re.escape(str(path)) + r": replayed open loop at the recorded "
                      r"send times: inference-perf's per-request report keeps neither the load type nor when each "
                      r"request was due \(no scheduled_time\), so a concurrency its client held .* is not held; for a "
                      r"concurrent run set concurrency = its concurrency_level$"):
        w = make_inference_perf_workload(InferencePerfConfig(path=str(path), prefix_blocks="none"))
    assert not getattr(w, "closed_loop", False) and w.info["concurrency"] is None
    assert [r.arrival_ms for r in w.requests(0)] == pytest.approx([0.0, 10.0, 20.0])


def test_a_concurrent_run_is_replayed_as_a_closed_loop_by_hand(tmp_path):
    """load.type: concurrent at concurrency_level 1, told by ``concurrency = 1``: 3 requests on
    the linear model's defaults (0.05 ms a prompt token, 8 ms a decode step) are sent at 0, 21
    and 39 ms -- each when the one before ends (5 + 2 x 8 = 21; 10 + 8 = 18; 2 + 3 x 8 = 26 ->
    65) -- not at the recorded 0, 10, 20 ms; no warning. At concurrency 2, by hand: the first two
    at once, the third when a slot frees."""
    write(tmp_path, three_records(), "report.json")
    exp = tmp_path / "conc.toml"
    exp.write_text('[experiment]\nreports = []\n[scheduler]\nkind = "vllm"\nmax_num_seqs = 8\n[cost_model]\n'
                   'kind = "linear"\n[workload]\nkind = "inference_perf"\npath = "report.json"\n'
                   'prefix_blocks = "none"\nconcurrency = 1\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error", BenchReplayWarning)
        r = run_experiment(load(exp)).all_runs()[0].requests
    assert r["sent_ms"].tolist() == [0.0, 21.0, 39.0]
    assert r["client_done_ms"].tolist() == [21.0, 39.0, 65.0]
    w = make_inference_perf_workload(InferencePerfConfig(path=str(tmp_path / "report.json"), concurrency=2))
    first = list(w.requests(0))
    assert w.closed_loop and w.info["concurrency"] == 2
    assert [(q.id, q.arrival_ms, q.prompt_tokens) for q in first] == [(0, 0.0, 100), (1, 0.0, 200)]
    assert [(q.id, q.arrival_ms, q.prompt_tokens) for q in w.on_finish(first[1], 18.0)] == [(2, 18.0, 40)]
