"""Replaying measured runs: the log loaders, prefix block ids, the comparison and calibrate.

Every file is written by the test."""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest

from schedlab.calibrate import Parameter, calibrate, parse_parameter, parse_part
from schedlab.errors import ConfigError, InputWarning, WorkloadError
from schedlab.results.compare import STATISTIC_NAMES, errors_pct, mean_abs_error, statistics
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.workloads.measured import load_vllm_bench, load_vllm_log, prefix_block_ids


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def log_row(i, prompt, output, queued, first, last, **extra):
    return {"request_id": f"bench-{i}", "input_toks": prompt, "output_toks": output, "queued_ts": queued,
            "scheduled_ts": queued + 0.001, "first_token_ts": first, "last_token_ts": last, **extra}


def test_prefix_block_ids_name_shared_prefixes():
    a = list(range(40))              # 2 full 16-token blocks + 8 tokens
    b = list(range(32)) + [99] * 20  # shares the first 32 tokens, then differs
    c = [7] + list(range(1, 40))     # differs in the first block
    ids = prefix_block_ids([a, b, c], 16)
    assert len(ids[0]) == 2 and len(ids[1]) == 3 and len(ids[2]) == 2
    assert ids[0] == ids[1][:2]
    assert ids[2][0] != ids[0][0] and ids[2][1] != ids[0][1]  # chained: a different first block changes all
    assert ids == prefix_block_ids([a, b, c], 16)              # deterministic


def test_vllm_log_by_hand(tmp_path):
    path = write_jsonl(tmp_path / "requests.jsonl", [
        log_row(0, 20, 3, 100.0, 100.5, 100.7, input_tok_ids=list(range(20))),
        log_row(1, 40, 1, 100.25, 101.0, 101.0, input_tok_ids=list(range(16)) + [5] * 24),
    ])
    arrival, columns, measured = load_vllm_log(path, hash_block_tokens=16)
    assert arrival.tolist() == [0.0, 250.0]
    assert columns.prompt_tokens.tolist() == [20, 40] and columns.output_tokens.tolist() == [3, 1]
    assert measured.ttft_ms == pytest.approx([500.0, 750.0])
    assert measured.tpot_ms[0] == pytest.approx(100.0) and np.isnan(measured.tpot_ms[1])
    assert measured.e2e_ms == pytest.approx([700.0, 750.0])
    hashes = columns.per_row["block_hashes"]
    assert len(hashes[0]) == 1 and len(hashes[1]) == 2 and hashes[0][0] == hashes[1][0]
    assert columns.constant["hash_block_tokens"] == 16
    # start/limit select a part; arrivals count from its first request (the first ran beside it: said)
    with pytest.warns(InputWarning, match="ran while requests left out were in the server"):
        arrival, columns, measured = load_vllm_log(path, start=1)
    assert arrival.tolist() == [0.0] and columns.prompt_tokens.tolist() == [40]


def test_vllm_log_requests_arrive_at_the_engines_receipt_not_when_its_loop_took_them(tmp_path):
    """vLLM stamps queued_ts when its engine loop takes a request, between two steps, and
    arrival_time on the client side's clock before sending it. Request 0 was taken 2 ms after its
    arrival_time stamp, the log's smallest gap (the clocks' offset and the fastest hand-off);
    request 1 32 ms after its stamp, so 30 ms after the engine had it: it arrives 30 ms before its
    queued_ts, 220 ms after request 0, and its TTFT and latency count from there."""
    rows = [log_row(0, 20, 3, 100.0, 100.5, 100.7, arrival_time=4999.998),
            log_row(1, 20, 3, 100.25, 101.0, 101.2, arrival_time=5000.218)]
    path = write_jsonl(tmp_path / "log.jsonl", rows)
    for mode in ("auto", "arrival_time"):
        arrival, _, measured = load_vllm_log(path, arrivals=mode)
        assert arrival == pytest.approx([0.0, 220.0]) and measured.arrivals_from == "arrival_time"
        assert measured.ttft_ms == pytest.approx([500.0, 780.0]) and measured.e2e_ms == pytest.approx([700.0, 980.0])
        assert measured.tpot_ms == pytest.approx([100.0, 100.0])
        assert measured.scheduled_ms == pytest.approx([1.0, 251.0])  # (scheduled 1 ms after queued)
    # start keeps the whole log's offset: request 1 alone still arrives 30 ms before its queued_ts
    with pytest.warns(InputWarning, match="ran while requests left out"):
        _, _, measured = load_vllm_log(path, start=1)
    assert measured.ttft_ms == pytest.approx([780.0])
    # vLLM's own view: from queued_ts
    arrival, _, measured = load_vllm_log(path, arrivals="queued_ts")
    assert arrival == pytest.approx([0.0, 250.0]) and measured.ttft_ms == pytest.approx([500.0, 750.0])
    assert measured.arrivals_from == "queued_ts"
    # a line without arrival_time: auto replays from queued_ts, arrival_time asks for it by line
    partial = write_jsonl(tmp_path / "partial.jsonl", [rows[0], log_row(1, 20, 3, 100.25, 101.0, 101.2)])
    with pytest.warns(InputWarning, match="1 of the 2 lines have no arrival_time"):
        assert load_vllm_log(partial)[2].ttft_ms == pytest.approx([500.0, 750.0])
    with pytest.raises(WorkloadError, match=r"partial.jsonl: line 2: arrival_time: missing or not a number"):
        load_vllm_log(partial, arrivals="arrival_time")
    # stamps that cannot be one request's (taken 60 s after the smallest gap) are said
    far = write_jsonl(tmp_path / "far.jsonl", [rows[0], {**rows[1], "arrival_time": 4940.218}])
    with pytest.warns(InputWarning, match=r"far.jsonl: a request's queued_ts is 60 s after its arrival_time"):
        load_vllm_log(far)


def test_vllm_log_token_ids_from_a_prompts_file(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [log_row(0, 32, 2, 1.0, 1.1, 1.2), log_row(1, 32, 2, 1.5, 1.6, 1.7)])
    prompts = write_jsonl(tmp_path / "w.jsonl", [{"input_tok_ids": list(range(32))}, {"input_tok_ids": list(range(32))}])
    _, columns, _ = load_vllm_log(log, prompts=prompts)
    assert columns.per_row["block_hashes"][0] == columns.per_row["block_hashes"][1]
    short = write_jsonl(tmp_path / "short.jsonl", [{"input_tok_ids": list(range(31))}, {"input_tok_ids": [1]}])
    with pytest.raises(WorkloadError, match=r"short.jsonl: line 1: 31 input_tok_ids but line 1 .* input_toks = 32"):
        load_vllm_log(log, prompts=short)


def test_vllm_log_leaves_out_a_request_the_run_recorded_no_metrics_for(tmp_path):
    """LLMServingSim's bench runner writes every timestamp null for a request that came back with
    no metrics (a failed one): left out with a warning naming its line, the prompts file still
    read line by line in the log's order, and start counting the requests kept."""
    failed = {"request_id": "bench-1", "input_toks": 7, "output_toks": 0, "arrival_time": None, "queued_ts": None,
              "scheduled_ts": None, "first_token_ts": None, "last_token_ts": None}
    log = write_jsonl(tmp_path / "log.jsonl", [log_row(0, 16, 2, 1.0, 1.1, 1.2), failed,
                                               log_row(2, 16, 3, 1.5, 1.75, 1.95)])
    prompts = write_jsonl(tmp_path / "w.jsonl", [{"input_tok_ids": list(range(16))}, {"input_tok_ids": [1] * 7},
                                                 {"input_tok_ids": list(range(16))}])
    with pytest.warns(InputWarning, match=r"log.jsonl: 1 of the 3 requests have no timestamps .* left out: line 2$"):
        arrival, columns, measured = load_vllm_log(log, prompts=prompts)
    assert arrival == pytest.approx([0.0, 500.0]) and columns.prompt_tokens.tolist() == [16, 16]
    assert measured.ttft_ms == pytest.approx([100.0, 250.0]) and measured.tpot_ms == pytest.approx([100.0, 100.0])
    hashes = columns.per_row["block_hashes"]
    assert hashes[0] == hashes[1] and len(hashes[0]) == 1
    with pytest.warns(InputWarning):
        arrival, columns, _ = load_vllm_log(log, start=1)
    assert columns.output_tokens.tolist() == [3]
    with pytest.warns(InputWarning), pytest.raises(WorkloadError, match="start = 2 skips all 2 requests with timestamps"):
        load_vllm_log(log, start=2)
    # a timestamp missing alone is still an error
    partial = {**log_row(0, 16, 2, 1.0, 1.1, 1.2), "first_token_ts": None}
    with pytest.raises(WorkloadError, match="line 1: first_token_ts: must be a number, got None"):
        load_vllm_log(write_jsonl(tmp_path / "partial.jsonl", [partial]))


def test_a_bench_run_that_did_not_stream_has_no_ttft_to_compare(tmp_path):
    """SGLang's bench_serving --disable-stream writes each request's latency as its TTFT and no
    inter-token latencies: the replay keeps the latency, leaves TTFT and TPOT out (NaN), and the
    comparison's mean |error| is over the latency alone."""
    from schedlab.results.compare import comparison_rows, format_comparison, measured_statistics

    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"request_rate": 4.0, "input_lens": [10, 20], "output_lens": [3, 5],
                                "ttfts": [0.4, 0.8], "itls": [[], []], "latencies": [0.4, 0.8], "errors": ["", ""]}))
    with pytest.warns(InputWarning, match="no request of several tokens has an inter-token latency"):
        bench = load_vllm_bench(path)
    assert np.isnan(bench.measured.ttft_ms).all() and np.isnan(bench.measured.tpot_ms).all()
    assert bench.measured.e2e_ms == pytest.approx([400.0, 800.0])
    truth = measured_statistics(bench.measured)
    simulated = {name: 1.1 * value if np.isfinite(value) else 5.0 for name, value in truth.items()}
    text = format_comparison("x", comparison_rows(simulated, truth))
    assert "TTFT" not in text.split("(not measured")[0] and "(not measured, left out: TTFT, TPOT)" in text
    assert text.rstrip().endswith("10.00%")   # +10% on each of the 5 latency statistics
    assert mean_abs_error({"a": 10.0, "b": float("nan"), "c": -20.0}) == pytest.approx(15.0)


@pytest.mark.parametrize("row, message", [
    ({"input_toks": 5, "output_toks": 2, "queued_ts": 1.0, "first_token_ts": 1.2}, "line 1: missing field 'last_token_ts'"),
    ({"input_toks": 0, "output_toks": 2, "queued_ts": 1.0, "first_token_ts": 1.2, "last_token_ts": 1.3},
     "line 1: input_toks: must be >= 1"),
    ({"input_toks": 5, "output_toks": 2, "queued_ts": 1.0, "first_token_ts": 0.5, "last_token_ts": 1.3},
     "line 1: timestamps out of order"),
    ({"input_toks": 10**20, "output_toks": 2, "queued_ts": 1.0, "first_token_ts": 1.2, "last_token_ts": 1.3},
     r"line 1: input_toks: must be at most 10\*\*8, got 100000000000000000000"),   # was an OverflowError
    ({"input_toks": 5, "output_toks": 10**9, "queued_ts": 1.0, "first_token_ts": 1.2, "last_token_ts": 1.3},
     r"line 1: output_toks: must be at most 10\*\*8"),
    # checks the prompts file and Mooncake traces had, on the log's own fields: they were accepted
    ({"input_toks": 10, "output_toks": 2, "queued_ts": 1.0, "first_token_ts": 1.2, "last_token_ts": 1.3,
      "input_tok_ids": [1, 2]}, r"line 1: 2 input_tok_ids for input_toks = 10 \(a prompt's token ids are its tokens"),
    # 10 tokens in 16-token blocks: at most ceil(10 / 16) = 1 id
    ({"input_toks": 10, "output_toks": 2, "queued_ts": 1.0, "first_token_ts": 1.2, "last_token_ts": 1.3,
      "block_hashes": [0, 1]}, r"line 1: block_hashes: 2 ids for input_toks = 10, more than ceil\(10 / "
                               r"hash_block_tokens = 16\) blocks"),
    # a measured queue time of -500 ms went into the comparison
    ({"input_toks": 10, "output_toks": 2, "queued_ts": 1.0, "scheduled_ts": 0.5, "first_token_ts": 1.2,
      "last_token_ts": 1.3}, r"line 1: scheduled_ts out of order \(need queued_ts <= scheduled_ts <= first_token_ts"),
    ({"input_toks": 10, "output_toks": 2, "queued_ts": 1.0, "scheduled_ts": 1.25, "first_token_ts": 1.2,
      "last_token_ts": 1.3}, r"line 1: scheduled_ts out of order"),
])
def test_vllm_log_errors_name_the_line(tmp_path, row, message):
    with pytest.raises(WorkloadError, match=message):
        load_vllm_log(write_jsonl(tmp_path / "bad.jsonl", [row]))


def test_vllm_log_fields_that_agree_are_kept(tmp_path):
    """The same checks let a consistent line through: 32 token ids for 32 tokens (2 full 16-token
    blocks), 2 given ids for 20 tokens (ceil(20 / 16) = 2), scheduled 100 ms after queued."""
    path = write_jsonl(tmp_path / "ok.jsonl", [log_row(0, 32, 2, 1.0, 1.2, 1.3, input_tok_ids=list(range(32))),
                                               log_row(1, 32, 2, 1.5, 1.7, 1.8, input_tok_ids=list(range(32)))])
    _, columns, measured = load_vllm_log(path)
    assert [len(h) for h in columns.per_row["block_hashes"]] == [2, 2]
    assert measured.scheduled_ms == pytest.approx([1.0, 501.0])
    given = write_jsonl(tmp_path / "given.jsonl", [log_row(0, 20, 2, 1.0, 1.2, 1.3, block_hashes=[7, 8])])
    assert load_vllm_log(given)[1].per_row["block_hashes"] == [(7, 8)]


def test_vllm_bench_by_hand(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"request_rate": 4.0, "burstiness": 1.0, "input_lens": [10, 20, 30],
                                "output_lens": [3, 1, 2], "ttfts": [0.1, 0.2, 0.3],
                                "itls": [[0.01, 0.03], [], [0.05]], "errors": ["", "", ""]}))
    bench = load_vllm_bench(path)
    columns, measured = bench.columns, bench.measured
    assert (bench.rate, bench.burstiness, bench.max_concurrency) == (4.0, 1.0, None)
    assert bench.sent_ms is None  # no start_times: arrivals are drawn again
    assert columns.prompt_tokens.tolist() == [10, 20, 30]
    assert measured.ttft_ms == pytest.approx([100.0, 200.0, 300.0])
    assert measured.tpot_ms[0] == pytest.approx(20.0) and np.isnan(measured.tpot_ms[1])
    assert measured.e2e_ms == pytest.approx([140.0, 200.0, 350.0])
    from schedlab_plugins.workloads.measured import VllmBenchConfig, make_vllm_bench_workload

    with pytest.warns(InputWarning, match="no start_times"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    first = [r.arrival_ms for r in workload.requests(7)]
    # vLLM's get_request: a gap before the first request too, the last sent 3 / 4 s after the start
    assert first == [r.arrival_ms for r in workload.requests(7)] and 0.0 < first[0] < first[1] < first[2]
    assert first[2] == pytest.approx(750.0, rel=1e-12)
    assert first != [r.arrival_ms for r in workload.requests(8)]
    path.write_text(json.dumps({"input_lens": [1], "output_lens": [1], "ttfts": [0.1]}))
    with pytest.raises(WorkloadError, match=r"missing list 'itls' \(save the result with --save-detailed\)"):
        load_vllm_bench(path)


def test_statistics_and_errors_by_hand():
    lat = {"ttft_ms": np.array([1.0, 2.0, 3.0, 4.0]), "tpot_ms": np.array([10.0, 10.0, np.nan, 10.0]),
           "e2e_ms": np.array([5.0, 5.0, 5.0, 5.0])}
    stats = statistics(lat)
    assert stats["ttft_ms.mean"] == 2.5 and stats["ttft_ms.p50"] == 2.5 and stats["ttft_ms.p90"] == pytest.approx(3.7)
    assert stats["tpot_ms.mean"] == 10.0 and len(stats) == 15 == len(STATISTIC_NAMES)
    doubled = {k: 2 * v for k, v in stats.items()}
    errors = errors_pct(doubled, stats)
    assert all(e == pytest.approx(100.0) for e in errors.values()) and mean_abs_error(errors) == pytest.approx(100.0)


def test_parse_parameter_and_part():
    assert parse_parameter("cost_model.overhead_ms=0:5") == Parameter("cost_model.overhead_ms", 0.0, 5.0)
    for bad in ("cost_model.x", "x=5:1", "x=a:b"):
        with pytest.raises(ConfigError, match="KEY=LOW:HIGH"):
            parse_parameter(bad)
    rows, others = parse_part("0:3", 5)
    assert rows.tolist() == [0, 1, 2] and others.tolist() == [3, 4]
    with pytest.raises(ConfigError, match="FIRST:END"):
        parse_part("4:9", 5)


# --- calibrate recovers known parameters ------------------------------------------------------


def _measured_log_from_a_run(tmp_path, decode_ms, prefill_ms):
    """Simulate a run with known linear costs and write it as a vLLM request log."""
    exp_path = tmp_path / "truth.toml"
    exp_path.write_text(f"""
[experiment]
reports = []
[workload]
kind = "synthetic"
num_requests = 60
rate = 3.0
prompt = {{ dist = "uniform", low = 50, high = 400 }}
output = {{ dist = "uniform", low = 20, high = 200 }}
[scheduler]
kind = "vllm"
max_num_seqs = 8
[cost_model]
kind = "linear"
decode_ms_per_step = {decode_ms}
prefill_ms_per_token = {prefill_ms}
""")
    run = run_experiment(load(exp_path)).all_runs()[0]
    r = run.requests
    rows = [log_row(i, int(r["prompt_tokens"][i]), int(r["generated_tokens"][i]), r["arrival_ms"][i] / 1e3,
                    r["first_token_ms"][i] / 1e3, r["finish_ms"][i] / 1e3) for i in range(len(r["id"]))]
    return write_jsonl(tmp_path / "measured.jsonl", rows)


def _replay_of_a_known_run(tmp_path, decode_ms: float):
    """An experiment replaying the log of a run made with 12 ms a decode step and 0.08 ms a
    prompt token (:func:`_measured_log_from_a_run`), with ``decode_ms`` and 0.05 ms instead."""
    log = _measured_log_from_a_run(tmp_path, decode_ms=12.0, prefill_ms=0.08)
    exp_path = tmp_path / "replay.toml"
    exp_path.write_text(f"""
[experiment]
reports = []
[workload]
kind = "vllm_log"
path = "{log}"
[scheduler]
kind = "vllm"
max_num_seqs = 8
[cost_model]
kind = "linear"
decode_ms_per_step = {decode_ms}
prefill_ms_per_token = 0.05
""")
    return exp_path


def test_calibrate_recovers_known_parameters(tmp_path):
    exp = load(_replay_of_a_known_run(tmp_path, decode_ms=8.0))
    params = [Parameter("cost_model.decode_ms_per_step", 2.0, 30.0),
              Parameter("cost_model.prefill_ms_per_token", 0.01, 0.3)]
    fit, spec, result = calibrate(exp, params, max_evaluations=120)
    assert fit.values["cost_model.decode_ms_per_step"] == pytest.approx(12.0, rel=0.03)
    assert fit.values["cost_model.prefill_ms_per_token"] == pytest.approx(0.08, rel=0.15)
    assert fit.mean_abs_error_pct < 1.0
    assert result.metrics["vs_measured"]["mean_abs_error_pct"] == pytest.approx(fit.mean_abs_error_pct)
    from schedlab.calibrate import snippet

    text = snippet(spec, params)
    assert text.startswith("[cost_model]\nkind = \"linear\"\n") and "decode_ms_per_step = " in text


def test_a_streamed_replay_is_compared_over_every_request(tmp_path, monkeypatch):
    """A replay past exact_requests keeps a sample of its rows in memory; its comparison with the
    log, and calibrate's judge of it, still take every request (read back from the run's file)."""
    from schedlab.calibrate import MeasuredRun

    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    exp_path = _replay_of_a_known_run(tmp_path, decode_ms=10.0)
    exact = run_experiment(load(exp_path)).all_runs()[0]
    streamed = run_experiment(load(exp_path, ["experiment.exact_requests=10"])).all_runs()[0]
    assert exact.rows_file is None and streamed.rows_file is not None
    assert streamed.metrics["vs_measured"]["errors_pct"] == pytest.approx(exact.metrics["vs_measured"]["errors_pct"],
                                                                         rel=1e-12)
    assert MeasuredRun().errors(streamed) == pytest.approx(MeasuredRun().errors(exact), rel=1e-12)


def test_calibrate_needs_a_measured_run(tmp_path):
    exp_path = tmp_path / "x.toml"
    exp_path.write_text("""
[experiment]
reports = []
[workload]
kind = "synthetic"
num_requests = 3
arrival = "all-at-once"
prompt = { dist = "fixed", value = 10 }
output = { dist = "fixed", value = 5 }
""")
    with pytest.raises(ConfigError, match="keeps no measured run"):
        calibrate(load(exp_path), [Parameter("cost_model.decode_ms_per_step", 1.0, 10.0)])


def test_the_shipped_real_runs_stay_within_the_readme_errors():
    """experiments/vllm_validation.toml replays the six shipped real runs (TP 1 on one RTX PRO
    6000, TP 2 over PCIe without peer-to-peer, one RTX 4090, a MoE model at data parallel 2 with
    expert parallelism; vLLM 0.28's TP 2 over peer-to-peer and DP 2 + EP); the mean |error| over
    the 15 TTFT / TPOT / latency statistics must stay within what README "Fidelity" reports
    (rounded up)."""
    from pathlib import Path

    experiment = Path(__file__).resolve().parents[1] / "experiments" / "vllm_validation.toml"
    results = run_experiment(load(experiment))
    errors = {r.name: r.metrics["vs_measured"]["mean_abs_error_pct"] for r in results.all_runs()}
    bounds = {"profiled": 1.5, "roofline": 10.0, "profiled-tp2": 4.3, "roofline-tp2": 8.7,
              "profiled-4090": 1.2, "roofline-4090": 7.0, "profiled-dp2-ep": 5.4, "roofline-dp2-ep": 1.2,
              "profiled-tp2-v028": 0.5, "roofline-tp2-v028": 6.1, "profiled-dp2-ep-v028": 8.3,
              "roofline-dp2-ep-v028": 2.4}
    assert set(errors) == set(bounds)
    assert all(errors[name] <= bound for name, bound in bounds.items()), errors


def test_runs_replaying_different_logs_get_figures_of_their_own_log(tmp_path):
    """Every run was drawn against the first run's measurements, whatever log it replayed."""
    exp_path = _replay_of_a_known_run(tmp_path, decode_ms=10.0)
    log = next(tmp_path.glob("*.jsonl"))
    other = tmp_path / "other log.jsonl"
    other.write_text(log.read_text())
    exp_path.write_text(exp_path.read_text() + f'\n[[runs]]\nname = "a"\n[[runs]]\nname = "b"\n'
                        f'workload = {{kind = "vllm_log", path = "{other}"}}\n')
    results = run_experiment(load(exp_path))
    from schedlab_plugins.reports.measured import CompareReport, _by_source

    assert [(tag, [run.name for run in group]) for tag, group in _by_source(results.all_runs())] == [
        ("", ["a"]), ("_other_log", ["b"])]
    written = CompareReport(stream=io.StringIO()).write(results, tmp_path / "out")
    assert sorted(p.name for p in written if p.suffix == ".png") == [
        "measured_cdf.png", "measured_cdf_other_log.png", "measured_timeline.png", "measured_timeline_other_log.png"]


def test_measured_plots_are_written_whole_and_leak_no_font_warning(tmp_path, recwarn):
    """The compare report's measured-vs-simulated figures go through the plots report's PNG
    writer: a run name no font can draw warns nothing, and no temporary file is left behind."""
    exp_path = _replay_of_a_known_run(tmp_path, decode_ms=10.0)
    text = exp_path.read_text().replace("reports = []", 'reports = ["compare"]')
    exp_path.write_text(text + '\n[[runs]]\nname = "run\\u0001"\n')
    out = tmp_path / "out"
    results = run_experiment(load(exp_path))
    from schedlab_plugins.reports.measured import CompareReport

    written = CompareReport(stream=io.StringIO()).write(results, out)
    pngs = sorted(p.name for p in written if p.suffix == ".png")
    assert pngs == ["measured_cdf.png", "measured_timeline.png"]
    assert all((out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in pngs)
    assert sorted(p.name for p in (out / "plots").iterdir()) == pngs
    assert [str(w.message) for w in recwarn if "Glyph" in str(w.message)] == []


def test_a_log_in_milliseconds_is_warned_about(tmp_path):
    """Timestamps in ms read as seconds: arrivals 250 s apart and 6.5 s a token, with no word."""
    from schedlab.errors import InputWarning

    rows = [{"input_toks": 10, "output_toks": 3, "queued_ts": t, "first_token_ts": t + 20.0,
             "last_token_ts": t + 33.0} for t in (0.0, 250.0)]  # (ms: 6.5 ms a token)
    path = tmp_path / "ms.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.warns(InputWarning, match=r"its median time per output token is 6.5 s: vllm_log timestamps are "
                                          r"seconds -- are these milliseconds\?"):
        load_vllm_log(path)


def test_a_part_of_a_log_that_ran_beside_the_rest_is_said_to_be_replayed_lighter(tmp_path):
    """start / limit replay a part alone, on a server the rest no longer loads, while its measured
    latencies were taken under it: the comparison then measures the load removed (a 60-request
    slice of the shipped log read 67% off, 1-2% inside the whole replay). Requests 0 (0-10 s) and
    1 (1-2 s) overlap; 2 (20-21 s) and 3 (22-23 s) ran alone."""
    spans = [(0, 10), (1, 2), (20, 21), (22, 23)]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({"input_toks": 10, "output_toks": 4, "queued_ts": b, "first_token_ts": b + 0.5,
                                        "last_token_ts": e}) + "\n" for b, e in spans))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_vllm_log(path, start=2)   # the last two ran with nothing else in the server
        load_vllm_log(path)
    with pytest.warns(InputWarning, match=r"start and limit keep 1 of its 4 requests, and 1 of those ran while "
                                          r"requests left out were in the server.*calibrate --part"):
        load_vllm_log(path, start=1, limit=1)


def test_the_comparison_says_when_the_simulation_completed_fewer_requests(tmp_path):
    """Requests the simulation turned away drop out of its statistics while the measured ones keep
    every request (a fit could lower its error by turning the longest away): said under the title."""
    from schedlab_plugins.reports.measured import CompareReport

    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"input_toks": n, "output_toks": 4, "queued_ts": t, "first_token_ts": t + 0.1,
                                       "last_token_ts": t + 0.2}) + "\n"
                           for t, n in ((0.0, 10), (1.0, 3000), (2.0, 10))))
    path = tmp_path / "exp.toml"
    path.write_text(f'[workload]\nkind = "vllm_log"\npath = "{log}"\n[scheduler]\nkind = "vllm"\nmax_model_len = 2048\n'
                    'context_overflow = "reject"\n[cost_model]\nkind = "linear"\n')
    stream = io.StringIO()
    CompareReport(stream=stream).write(run_experiment(load(path)), tmp_path)
    assert "(simulated: 2 of the 3 replayed requests completed" in stream.getvalue()
    path.write_text(path.read_text().replace("max_model_len = 2048", "max_model_len = 4096"))
    stream = io.StringIO()
    CompareReport(stream=stream).write(run_experiment(load(path)), tmp_path)
    assert "replayed requests completed" not in stream.getvalue()


def test_a_failure_without_a_reason_is_counted_by_the_files_own_count(tmp_path):
    """vLLM writes a non-200 response's reason, '' when it has none: the request read as an empty
    answer and failed = 0, while the file says failed = 1 (the measured-readers review)."""
    from schedlab_plugins.workloads.measured import BenchReplayWarning, VllmBenchConfig, make_vllm_bench_workload

    doc = {"request_rate": "inf", "completed": 2, "failed": 1, "input_lens": [10, 20, 30], "output_lens": [5, 0, 4],
           "ttfts": [0.1, 0.0, 0.2], "itls": [[0.01] * 4, [], [0.01] * 3], "latencies": [0.14, 0.0, 0.23],
           "start_times": [1.0, 1.0, 1.0], "errors": ["", "", ""]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    with pytest.warns(BenchReplayWarning, match=r"1 of the 3 requests failed \(no error text; the file counts "
                                                r"failed = 1\)"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert workload.info["failed"] == 1 and len(workload.measured.ttft_ms) == 2


def test_a_log_with_arrival_time_on_some_lines_says_it_falls_back_to_queued_ts(tmp_path):
    """One line without arrival_time moved every request to queued_ts silently (TTFT mean 165.7 ->
    149.4 ms on the shipped log)."""
    rows = [{"input_toks": 10, "output_toks": 4, "arrival_time": 100.0 + t, "queued_ts": t + 0.01,
             "first_token_ts": t + 0.1, "last_token_ts": t + 0.2} for t in (0.0, 1.0, 2.0)]
    del rows[1]["arrival_time"]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(InputWarning, match=r"1 of the 3 lines have no arrival_time \(the first: line 2\), so every "
                                          r"request arrives at its queued_ts"):
        load_vllm_log(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_vllm_log(path, arrivals="queued_ts")   # asked for: nothing to say
