"""Inputs to ``schedlab calibrate`` that fuzzing found read wrongly -- a traceback, a fit run
against impossible numbers, a message naming the wrong option -- each now one line naming what
to change, or left out with a note. Every file is written by the test."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from schedlab.calibrate import FAILED, Parameter, _identifiability
from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.results.compare import STATISTIC_NAMES, comparison_rows, format_comparison, pct_error
from schedlab.targets import read_summary
from test_calibrate import TEMPLATE_BENCH, TINY_RUN, _write, counted_runs, tiny_experiment

FIT = ["--fit", "cost_model.decode_ms_per_step=1:10", "--max-evaluations", "4", "--starts", "1"]


def error_line(code: int, err: str) -> str:
    assert code == 2 and "Traceback" not in err, err
    return err.strip().split("\n")[-1]


# -- a measured 0 -----------------------------------------------------------------------------------------
def test_a_measured_zero_has_no_error_in_percent():
    """A log whose every TTFT is 0 (coarse timestamps) stopped the run with a ZeroDivisionError."""
    assert pct_error(6.0, 4.0) == 50.0
    assert math.isnan(pct_error(6.0, 0.0))
    measured = {name: 0.0 if name.startswith("ttft_ms") else 10.0 for name in STATISTIC_NAMES}
    simulated = {name: 12.0 for name in STATISTIC_NAMES}
    lines = format_comparison("t", comparison_rows(simulated, measured)).splitlines()
    ttft = [line for line in lines if line.startswith("TTFT")]
    assert len(ttft) == 5 and all(line.endswith("       --") for line in ttft)
    assert "(--: measured 0, no error in percent; left out of the mean)" in lines
    assert lines[-1].endswith("20.00%")  # (12 - 10) / 10 over the other ten


def log_experiment(tmp_path, ttft_s: float):
    """The tiny run's tables replaying a log of three requests whose TTFTs are all ``ttft_s``."""
    rows = [{"input_toks": 10, "output_toks": 3, "queued_ts": t, "scheduled_ts": t, "first_token_ts": t + ttft_s,
             "last_token_ts": t + ttft_s + 0.008} for t in (0.0, 0.05, 0.1)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    path = tmp_path / "log.toml"
    path.write_text("[experiment]\nreports = []\n" + TINY_RUN.replace(
        'kind = "synthetic"\nnum_requests = 2\narrival = "all-at-once"\nprompt = { dist = "fixed", value = 10 }\n'
        'output = { dist = "fixed", value = 3 }', 'kind = "vllm_log"\npath = "log.jsonl"'))
    assert 'path = "log.jsonl"' in path.read_text()
    return path


def test_a_log_whose_every_ttft_is_0_runs_and_calibrates(tmp_path, capsys):
    path = log_experiment(tmp_path, ttft_s=0.0)
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--jobs", "1"]) == 0
    assert main(["calibrate", str(path), *FIT]) == 0, capsys.readouterr().err
    assert "(--: measured 0, no error in percent; left out of the mean)" in capsys.readouterr().out


# -- summaries ------------------------------------------------------------------------------------------
SERIES = ('vllm:e2e_request_latency_seconds_bucket{{{labels}le="0.5"}} {count}\n'
          'vllm:e2e_request_latency_seconds_bucket{{{labels}le="+Inf"}} {count}\n'
          'vllm:e2e_request_latency_seconds_sum{{{labels}}} 1.0\n'
          'vllm:e2e_request_latency_seconds_count{{{labels}}} {count}\n')


@pytest.mark.parametrize("data, message", [
    # numpy's "Percentiles must be in the range [0, 100]" traceback
    ({**TEMPLATE_BENCH, "p150_ttft_ms": 30.0}, "p150_ttft_ms: a percentile is from 0 to 100, got 150"),
    # printed as "counts -3 requests" (1e300: a 301-digit count; 20.7 cut to 20)
    ({**TEMPLATE_BENCH, "completed": -3}, "completed: a count of requests is a whole number >= 0, got -3"),
    ({**TEMPLATE_BENCH, "completed": 20.7}, "completed: a count of requests is a whole number >= 0, got 20.7"),
    ({**TEMPLATE_BENCH, "completed": 1e300}, "completed: a count of requests is a whole number >= 0, got 1e+300"),
    # fitted to as they were
    ({**TEMPLATE_BENCH, "median_ttft_ms": 40.0}, "ttft_ms.p90 (1) is below ttft_ms.p50 (40): a percentile never "
                                                 "falls as the quantile rises"),
    # a negative bound gave negative latencies, measured and simulated
    ('vllm:e2e_request_latency_seconds_bucket{le="-1"} 1\n' + SERIES.format(labels="", count=3),
     "line 1: vllm:e2e_request_latency_seconds_bucket: le='-1': a bucket's upper bound cannot be negative"),
    # two label sets' finite counts summed to inf: an OverflowError traceback
    (SERIES.format(labels='pod="a",', count=1e308) + SERIES.format(labels='pod="b",', count=1e308),
     "vllm:e2e_request_latency_seconds: its label sets' counts or sums add up past a float's range"),
])
def test_a_summary_that_cannot_be_is_refused(tmp_path, data, message):
    path = _write(tmp_path / ("t.json" if isinstance(data, dict) else "t.prom"), data)
    with pytest.raises(ConfigError) as info:
        read_summary(path)
    assert message in str(info.value)


def test_a_baseline_scrape_of_other_buckets_is_refused(tmp_path):
    """Only +Inf was left in common, so every quantile came out NaN ("measured nan"), unexplained."""
    def scrape(bounds, counts):
        return "".join(f'vllm:e2e_request_latency_seconds_bucket{{le="{b}"}} {c}\n' for b, c in zip(bounds, counts)) \
            + f"vllm:e2e_request_latency_seconds_sum 5.0\nvllm:e2e_request_latency_seconds_count {counts[-1]}\n"

    after = _write(tmp_path / "after.prom", scrape(["0.25", "0.5", "1", "+Inf"], [4, 8, 12, 15]))
    before = _write(tmp_path / "before.prom", scrape(["0.3", "0.6", "+Inf"], [1, 2, 3]))
    with pytest.raises(ConfigError, match=r"the baseline's buckets share no bound with the target's but \+Inf "
                                          r"\(le=0.3, 0.6 against le=0.25, 0.5, 1\)"):
        read_summary(after, baseline=before)


# -- the command's options ------------------------------------------------------------------------------------
def test_a_hold_the_run_refuses_is_named_as_the_holds_before_any_bound(tmp_path, capsys):
    """It was blamed on the --fit bound in a warning, then reported as the file's own value."""
    path = tiny_experiment(tmp_path)
    code = main(["calibrate", str(path), *FIT, "--hold", "cost_model.prefill_ms_per_token=-1"])
    err = capsys.readouterr().err
    assert error_line(code, err).endswith("(with --hold cost_model.prefill_ms_per_token=-1)")
    assert "warning" not in err and f"{path}: run 'tiny' [cost_model]: " in err


def test_a_predict_override_is_checked_before_the_fit(tmp_path, capsys, monkeypatch):
    """It stopped the command only after every simulation of the fit, named as the file's."""
    path = tiny_experiment(tmp_path)
    runs = counted_runs(monkeypatch)
    code = main(["calibrate", str(path), *FIT, "--predict", "workload.bogus=1"])
    assert error_line(code, capsys.readouterr().err).startswith(
        f"schedlab: error: {path}: run 'tiny (predict)' [workload]: unknown key 'bogus'")
    assert runs == []


@pytest.mark.parametrize("runs, args, message", [
    # --part was ignored (even 99:3) when runs were fitted together
    ("", ["--run", "a,b", "--part", "0:1"], "--predict, --statistics and --part take one run"),
    # which run had nothing to compare with went unsaid, and --target (refused for joint fits) was suggested
    ('[[runs]]\nname = "a"\ntarget = {path = "t.json"}\n', ["--run", "a,b"],
     "run 'b': has no [target] table and its workload keeps no measured run"),
    # it fitted the targets' statistics while its report said "latencies of single requests"
    ('[[runs]]\nname = "a"\ntarget = {path = "t.json"}\n', ["--run", "a,b", "--objective", "requests"],
     "--objective requests pairs the requests of a measured run's log; run 'a' is judged by its [target] table's "
     "summary statistics"),
])
def test_runs_fitted_together_are_named(tmp_path, capsys, runs, args, message):
    _write(tmp_path / "t.json", {"mean_ttft_ms": 20.0, "mean_e2el_ms": 30.0})
    path = tiny_experiment(tmp_path, (runs or '[[runs]]\nname = "a"\n') + '[[runs]]\nname = "b"\n')
    assert message in error_line(main(["calibrate", str(path), *FIT, *args]), capsys.readouterr().err)


def test_nothing_to_compare_on_a_measured_run_suggests_no_summary_option(tmp_path, capsys):
    """It said to leave the statistics out with --statistics, which a measured run refuses."""
    rows = [{"input_toks": 10, "output_toks": 3, "queued_ts": 0.0, "scheduled_ts": 0.0, "first_token_ts": 0.01,
             "last_token_ts": 0.02}]
    (tmp_path / "one.jsonl").write_text(json.dumps(rows[0]) + "\n")
    path = tmp_path / "one.toml"
    path.write_text("[experiment]\nreports = []\n[workload]\nkind = \"vllm_log\"\npath = \"one.jsonl\"\n"
                    "[cost_model]\nkind = \"linear\"\n[kv_cache]\nkind = \"paged\"\nnum_blocks = 1\nblock_size = 1\n")
    line = error_line(main(["calibrate", str(path), *FIT]), capsys.readouterr().err)
    assert "no request finished, or none with a second token" in line and "--statistics" not in line


# -- the diagnosis ----------------------------------------------------------------------------------------------
def diagnosis(score):
    """_identifiability of one parameter on [0, 10] at 5, with ``score(x)`` the mean error."""
    def evaluate(x):
        value = score(float(x[0]))
        return value, None, {"s": value}

    return _identifiability([Parameter("k", 0.0, 10.0)], np.array([5.0]), np.array([0.0]), np.array([10.0]),
                            {"s": score(5.0)}, evaluate)


def test_a_fit_that_stopped_short_is_not_read_as_an_unconstrained_one():
    """A move of 0.5 that lowers the error by 1 point was reported as -1 points of rise, "the
    statistics hardly constrain it"."""
    flagged, lines = diagnosis(lambda x: 10.0 + 2.0 * (x - 5.0))  # (lower below the fit: 9 at 4.5)
    assert lines == ["k: -1.000 points of mean error for a move over 5% of its range"]
    assert flagged == ["k: a move over 5% of its range lowers the mean error by 1.000 points -- the fit stopped short "
                       "of the best value; raise --max-evaluations (or --starts)"]


def test_a_drop_of_noise_is_a_flat_parameter_not_a_fit_that_stopped_short():
    """A move that lowers the error by 0.01 points (below FLAT_POINTS, 0.05) was "the fit stopped
    short; raise --max-evaluations", and the flat warning was lost: the parameter is unconstrained."""
    flagged, lines = diagnosis(lambda x: 10.0 + 0.02 * (x - 5.0))  # 9.99 at 4.5, 10.01 at 5.5
    assert lines == ["k: -0.010 points of mean error for a move over 5% of its range"]
    assert flagged == ["k: moving it over 5% of its range changes the mean error by -0.010 points -- the statistics "
                       "hardly constrain it"]


def test_a_move_the_engine_refuses_is_no_rise_of_a_million_points():
    flagged, lines = diagnosis(lambda x: FAILED if x > 5.0 else 10.0)
    assert lines == ["k: a move over 5% of its range fails in the engine"] and flagged == []


def test_failed_candidates_are_counted_with_the_first_reason(tmp_path, capsys):
    """Every candidate but the start failed (a decode step of up to 1e200 ms), and the report said
    only "widen the bounds"."""
    path = log_experiment(tmp_path, ttft_s=0.01)
    code = main(["calibrate", str(path), "--fit", "cost_model.decode_ms_per_step=1:1e200", "--max-evaluations", "8",
                 "--starts", "1"])
    out = capsys.readouterr().out
    assert code == 0
    failed = [line for line in out.splitlines() if "candidates failed in the engine" in line]
    assert len(failed) == 1 and failed[0].startswith("  ! ") and "(the first: " in failed[0], out
    assert "the simulated clock would pass" in failed[0]


def test_a_log_whose_every_request_failed_says_so(tmp_path, capsys):
    """It blamed the default `start = 0`: "start = 0 skips all 0 requests with timestamps"."""
    path = log_experiment(tmp_path, ttft_s=0.01)
    row = {"input_toks": 10, "output_toks": 3, "queued_ts": None, "scheduled_ts": None, "first_token_ts": None,
           "last_token_ts": None}
    (tmp_path / "log.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    line = error_line(main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--jobs", "1"]),
                      capsys.readouterr().err)
    assert line.endswith("log.jsonl: no request of the log has timestamps (every one failed): nothing to replay")


SIMULATED = {"rejected": np.array([0, 0, 0, 1]), "prompt_tokens": np.array([100, 200, 300, 900]),
             "generated_tokens": np.array([10, 20, 30, 0]), "arrival_ms": np.array([2000.0, 0.0, 1000.0, 3000.0])}


@pytest.mark.parametrize("bench, notes", [
    # 3 finished, averaging 200 prompt and 20 output tokens; 4 sent over 3 s: 1 request/s
    ({"completed": 3, "total_input_tokens": 600, "total_output_tokens": 60, "request_rate": 1.0}, []),
    # within 10% (216.7 tokens) and 25% (1.2/s); a rate of inf (all at once) is no rate to check
    ({"completed": 3, "total_input_tokens": 650, "total_output_tokens": 60, "request_rate": 1.2}, []),
    ({"completed": 3, "total_input_tokens": 600, "total_output_tokens": 60, "request_rate": "inf"}, []),
    ({"completed": 4, "total_input_tokens": 1200, "total_output_tokens": 40, "request_rate": 2.0},
     ["b.json counts 4 requests, the simulated run finished 3",
      "b.json's requests average 300 prompt tokens, the simulated ones 200",
      "b.json's requests average 10 output tokens, the simulated ones 20",
      "b.json sent 2 requests/s, the simulated requests arrived at 1/s"]),
])
def test_a_benchmark_of_another_workload_is_noted(tmp_path, bench, notes):
    """Only the count of requests was checked against a summary: a fit to a benchmark of 2,000-token
    prompts from an experiment of 200-token ones, or at twice its rate, ran with no word."""
    from schedlab.calibrate import workload_mismatches

    data = {**TEMPLATE_BENCH, **bench}
    target = read_summary(_write(tmp_path / "b.json", json.dumps(data).replace('"inf"', "Infinity")))
    assert [n.replace(str(tmp_path) + "/", "") for n in workload_mismatches(target, SIMULATED)] == notes


def test_a_request_its_client_gave_up_on_is_no_finished_request(tmp_path):
    """The benchmark counts the requests that succeeded: a simulated request whose client gave up
    (``timed_out``, the third) is not finished, so 2 of them, averaging (100 + 200) / 2 = 150
    prompt and 15 output tokens, match a benchmark of 2 completed requests of those lengths."""
    from schedlab.calibrate import workload_mismatches

    data = {**TEMPLATE_BENCH, "completed": 2, "total_input_tokens": 300, "total_output_tokens": 30,
            "request_rate": 1.0}
    target = read_summary(_write(tmp_path / "b.json", json.dumps(data)))
    assert workload_mismatches(target, {**SIMULATED, "timed_out": np.array([0, 0, 1, 0])}) == []
