"""A run's ``[target]``: the summary of the real run it stands for, compared statistic by
statistic in the summary's own view (a load generator's from sending a request, vLLM's metrics
from its arrival at the API server), printed by the ``compare`` report and used by ``schedlab
calibrate`` when no ``--target`` is given. Every file is written by the test."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment
from test_calibrate import TINY_RUN

#: Two requests sent at t = 0, 10-token prompts, 3 output tokens; one slot, 1 ms a prompt token,
#: 4 ms a decode step; a front end of 0.5 ms each way, 1 ms a request (handlers unlimited, no
#: tokenizing), 0.25 ms a token back. Both reach the engine at 1.5 ms. Engine: request 0's
#: first token at 11.5, last at 19.5; request 1's at 29.5 and 37.5 -- TTFT 10 and 28 (mean
#: 19), from the engine's arrival. Client: every byte 0.75 ms after its token left the engine,
#: from t = 0 -- TTFT 12.25 and 30.25 (mean 21.25), latency 20.25 and 38.25 (mean 29.25).
FRONTEND = """[frontend]
network_ms = 0.5
request_ms = 1.0
tokenize_ms_per_token = 0.0
token_ms = 0.25
workers = 0
"""


def tiny(reports: str, target: str) -> str:
    """The experiment: the hand-computed tiny run, the front end above, the [target] given."""
    return f"[experiment]\nreports = {reports}\n" + TINY_RUN + FRONTEND + f"[target]\n{target}\n"


SCRAPE = """vllm:time_to_first_token_seconds_bucket{le="0.015"} 1
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 2
vllm:time_to_first_token_seconds_sum 0.04
vllm:time_to_first_token_seconds_count 2
"""


def experiment(tmp_path, target: str, reports: str = "[]"):
    (tmp_path / "bench.json").write_text(json.dumps({"completed": 2, "mean_ttft_ms": 20.0, "mean_e2el_ms": 30.0}))
    (tmp_path / "metrics.txt").write_text(SCRAPE)
    path = tmp_path / "tiny.toml"
    path.write_text(tiny(reports, target))
    return path


def test_a_client_summary_is_compared_with_the_simulated_client_by_hand(tmp_path):
    run = run_experiment(load(experiment(tmp_path, 'path = "bench.json"'))).all_runs()[0]
    vs = run.metrics["vs_target"]
    assert vs["measured"] == {"ttft_ms.mean": 20.0, "e2e_ms.mean": 30.0}
    assert vs["simulated"] == pytest.approx({"ttft_ms.mean": 21.25, "e2e_ms.mean": 29.25})
    assert vs["errors_pct"] == pytest.approx({"ttft_ms.mean": 6.25, "e2e_ms.mean": -2.5})
    assert vs["mean_abs_error_pct"] == pytest.approx(4.375)
    assert run.metrics["ttft_ms"]["mean"] == pytest.approx(19.0)  # the engine's own view differs
    assert run.meta["target"]["view"] == "client"
    # throughput over the client's span, 0 to 38.25 ms (the engine's: 1.5 to 37.5 ms)
    from schedlab.targets import Summary, simulated

    rate = {"request_throughput_rps": 1.0}
    assert simulated(Summary("b", "vllm bench serve", rate), run) == pytest.approx({"request_throughput_rps": 2 / 0.03825})
    assert simulated(Summary("m", "vLLM /metrics", rate), run) == pytest.approx({"request_throughput_rps": 2 / 0.036})


def test_vllm_metrics_are_compared_with_the_simulated_engine_by_hand(tmp_path):
    """The scrape's mean TTFT is 0.04 s / 2 = 20 ms. vLLM >= 0.17's histogram starts when the API
    server receives a request (0.5 ms), before its 1 ms of handling: 11 and 29 ms, mean 20 -- 0%;
    from the engine's arrival (``vllm_ttft_from = "engine"``, vLLM <= 0.16) the engine's 19 ms: -5%."""
    path = experiment(tmp_path, 'path = "metrics.txt"\nstatistics = ["ttft_ms.mean"]')
    run = run_experiment(load(path)).all_runs()[0]
    vs = run.metrics["vs_target"]
    assert vs["simulated"] == pytest.approx({"ttft_ms.mean": 20.0})
    assert vs["errors_pct"] == pytest.approx({"ttft_ms.mean": 0.0})
    assert run.meta["target"]["view"] == "engine"
    path = experiment(tmp_path, 'path = "metrics.txt"\nstatistics = ["ttft_ms.mean"]\nvllm_ttft_from = "engine"')
    vs = run_experiment(load(path)).all_runs()[0].metrics["vs_target"]
    assert vs["simulated"] == pytest.approx({"ttft_ms.mean": 19.0})
    assert vs["errors_pct"] == pytest.approx({"ttft_ms.mean": -5.0})


def test_the_compare_report_prints_the_table(tmp_path, capsys):
    path = experiment(tmp_path, 'path = "bench.json"', reports='["compare"]')
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "compare.txt").read_text()
    assert "bench.json (vllm bench serve, as the client sees requests)" in text
    assert re.search(r"ttft_ms\.mean\s+20\.00\s+21\.25\s+\+6\.2%", text)
    assert re.search(r"mean \|error\|\s+4\.38%", text)
    assert "left out" not in text


def test_a_statistic_the_file_has_no_number_for_is_said_under_the_table(tmp_path, capsys):
    """null (how the tools write a statistic they have none for) is not compared: said, not silently missing."""
    path = experiment(tmp_path, 'path = "bench.json"', reports='["compare"]')
    (tmp_path / "bench.json").write_text(json.dumps({"completed": 2, "mean_ttft_ms": None, "mean_e2el_ms": 30.0,
                                                     "p99_e2el_ms": float("nan"), "request_goodput": None}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "compare.txt").read_text()
    assert "ttft_ms.mean" not in text and re.search(r"e2e_ms\.mean\s+30\.00\s+29\.25", text)
    # request_goodput is null whenever the run had no --goodput: not a statistic lost
    assert text.rstrip().endswith("left out of the comparison: mean_ttft_ms (null), p99_e2el_ms (nan)")


@pytest.mark.parametrize("target, message", [
    ('path = "bench.json"\nstatistics = ["ttft_ms.p99"]', r"\[target\].*statistics.*holds no 'ttft_ms.p99'; it holds "
                                                          r"ttft_ms.mean, e2e_ms.mean"),
    ('path = "bench.json"\nstatistic = ["ttft_ms.mean"]', r"\[target\].*statistic"),
    ('path = "missing.json"', r"\[target\].*missing.json: file not found"),
    ('statistics = ["ttft_ms.mean"]', r"\[target\].*path"),
])
def test_bad_target_tables_are_named(tmp_path, target, message):
    with pytest.raises(ConfigError, match=message):
        run_experiment(load(experiment(tmp_path, target)))


def test_calibrate_fits_to_the_runs_own_target(tmp_path, capsys):
    """A run made with 4 ms decode steps gives the summary; the experiment starts at 7 ms and
    names the summary in [target]: calibrate finds 4 ms without --target."""
    truth = run_experiment(load(experiment(tmp_path, 'path = "bench.json"'))).all_runs()[0]
    summary = {"completed": 2, "mean_ttft_ms": truth.metrics["vs_target"]["simulated"]["ttft_ms.mean"],
               "mean_e2el_ms": truth.metrics["vs_target"]["simulated"]["e2e_ms.mean"]}
    (tmp_path / "truth.json").write_text(json.dumps(summary))
    path = tmp_path / "fit.toml"
    path.write_text(tiny("[]", 'path = "truth.json"').replace("decode_ms_per_step = 4.0",
                                                                                   "decode_ms_per_step = 7.0"))
    assert main(["calibrate", str(path), "--fit", "cost_model.decode_ms_per_step=1:10", "--max-evaluations", "40",
                 "--predict", 'target.path="bench.json"']) == 0
    out = capsys.readouterr().out
    assert "2 statistics of" in out and "truth.json" in out
    fitted = float(re.search(r"decode_ms_per_step = ([0-9.]+)", out.split("# paste")[1]).group(1))
    assert fitted == pytest.approx(4.0, rel=0.02)
    # the prediction is read against the other summary (20 / 30 ms): about the 4.375% mean error
    # of the run made with 4 ms steps
    prediction = out.split("prediction with the fit")[1]
    assert "simulated vs bench.json" in prediction
    assert float(re.search(r"mean \|error\|\s+([0-9.]+)%", prediction).group(1)) == pytest.approx(4.375, abs=0.3)


def test_runs_fitted_together_each_against_its_own_target(tmp_path, capsys):
    """Two runs (2 and 3 requests), each with the summary of a run made with 4 ms steps: fitted
    together from 7 ms, the step comes back at 4 ms; the statistics are named by run, and each
    run's table is printed."""
    truths = {}
    for name, n in (("a", 2), ("b", 3)):
        path = tmp_path / f"{name}.toml"
        path.write_text(tiny("[]", 'path = "bench.json"').replace(
            "num_requests = 2", f"num_requests = {n}"))
        (tmp_path / "bench.json").write_text(json.dumps({"mean_ttft_ms": 20.0, "mean_e2el_ms": 30.0}))
        sim = run_experiment(load(path)).all_runs()[0].metrics["vs_target"]["simulated"]
        truths[name] = {"mean_ttft_ms": sim["ttft_ms.mean"], "mean_e2el_ms": sim["e2e_ms.mean"]}
        (tmp_path / f"truth_{name}.json").write_text(json.dumps(truths[name]))
    assert truths["a"] != truths["b"]
    path = tmp_path / "joint.toml"
    path.write_text(tiny("[]", 'path = "truth_a.json"').replace(
        "decode_ms_per_step = 4.0", "decode_ms_per_step = 7.0")
        + '\n[[runs]]\nname = "stage-a"\n\n[[runs]]\nname = "stage-b"\nworkload = {num_requests = 3}\n'
          'target = {path = "truth_b.json"}\n')
    from schedlab.calibrate import Parameter, calibrate

    fit, specs, results = calibrate(load(path), [Parameter("cost_model.decode_ms_per_step", 1.0, 10.0)],
                                    run_name=["stage-*"], max_evaluations=40, diagnose=False)
    assert fit.values["cost_model.decode_ms_per_step"] == pytest.approx(4.0, rel=0.02)
    assert [s.name for s in specs] == ["stage-a", "stage-b"] and len(results) == 2
    assert set(fit.errors) == {f"stage-{r}: {s}" for r in "ab" for s in ("ttft_ms.mean", "e2e_ms.mean")}
    assert main(["calibrate", str(path), "--run", "stage-a,stage-b", "--fit", "cost_model.decode_ms_per_step=1:10",
                 "--max-evaluations", "30"]) == 0
    out = capsys.readouterr().out
    assert "4 statistics of 2 runs fitted together" in out
    assert "stage-a at the fit" in out and "stage-b at the fit" in out and "truth_b.json" in out
    with pytest.raises(ConfigError, match="no run named 'nope'"):
        calibrate(load(path), [Parameter("cost_model.decode_ms_per_step", 1.0, 10.0)], run_name=["stage-a", "nope"])
    with pytest.raises(ConfigError, match="each judged against their own"):
        calibrate(load(path), [Parameter("cost_model.decode_ms_per_step", 1.0, 10.0)], run_name=["stage-*"],
                  target=object())


def test_each_request_against_its_replay_in_the_client_s_view(tmp_path):
    """A client's log is paired with the simulated client (the hand-computed times above: TTFT
    12.25 and 30.25, latency 20.25 and 38.25, TPOT 4 each), an engine's log with the engine
    (TTFT 10 and 28, latency 18 and 36)."""
    from schedlab.results.compare import paired_errors
    from schedlab_plugins.workloads.measured import MeasuredRequests

    requests = run_experiment(load(experiment(tmp_path, 'path = "bench.json"'))).all_runs()[0].requests
    log = dict(source="log", arrival_ms=np.array([0.0, 0.0]), ttft_ms=np.array([12.25, 25.0]),
               tpot_ms=np.array([4.0, 5.0]), e2e_ms=np.array([20.25, 40.0]), output_tokens=np.array([3, 3]))
    client = paired_errors(requests, MeasuredRequests(**log, view="client"))
    assert client == pytest.approx({"ttft_ms[0]": 0.0, "ttft_ms[1]": 100 * (30.25 - 25) / 25, "tpot_ms[0]": 0.0,
                                    "tpot_ms[1]": -20.0, "e2e_ms[0]": 0.0, "e2e_ms[1]": 100 * (38.25 - 40) / 40})
    engine = paired_errors(requests, MeasuredRequests(**log, view="engine"))
    assert engine["ttft_ms[1]"] == pytest.approx(100 * (28 - 25) / 25)
    assert engine["e2e_ms[0]"] == pytest.approx(100 * (18 - 20.25) / 20.25)


# --- vllm bench serve's own window: its duration and its successful requests ---------------------------------

#: Two requests of 100 prompt and 3 output tokens on the linear cost model at its defaults (0.05 ms a prompt
#: token: a 5 ms prefill; 8 ms a decode step) behind the default [frontend]: the way in is 0.05 + 1 + 100 x
#: 0.002 = 1.25 ms, a token's way back 9.9 + 0.05 = 9.95 ms. Alone, a request's client TTFT is 1.25 + 5 +
#: 9.95 = 16.2 ms and its E2EL 16.2 + 2 x 8 = 32.2 ms.
CONSTANT_PAIR = """kind = "synthetic"
num_requests = 2
rate = 1
arrival = "constant"
prompt = {dist = "fixed", value = 100}
output = {dist = "fixed", value = 3}
"""
LINEAR_PAIR = """[experiment]
reports = []
[cost_model]
kind = "linear"
[scheduler]
kind = "continuous"
[frontend]
[target]
path = "bench.json"
"""


THROUGHPUT_NAMES = ("request_throughput_rps", "output_throughput_tps", "total_throughput_tps")


def linear_pair(tmp_path, bench: dict, extra: str = "", workload: str = CONSTANT_PAIR):
    """The run above (its [workload] ``workload``, ``extra`` tables) against ``bench`` as its [target]."""
    (tmp_path / "bench.json").write_text(json.dumps(bench).replace('"Infinity"', "Infinity"))
    (tmp_path / "pair.toml").write_text(LINEAR_PAIR + extra + "[workload]\n" + workload)
    return run_experiment(load(tmp_path / "pair.toml")).all_runs()[0]


def test_vllm_bench_serve_s_duration_starts_one_gap_before_the_first_send(tmp_path):
    """At --request-rate 1 --burstiness inf vLLM's get_request sleeps 1 s before each request, the
    first included, and its duration starts before that sleep: with the sends at 0 and 1,000 ms
    (the simulated clock) the benchmark started at -1,000 and ended with the last byte at 1,000 +
    32.2: 2.0322 s -- 2 / 2.0322 = 0.98415 requests/s, 6 and 206 tokens over it (what vLLM
    itself prints for these times; from the first send it would be 2 / 1.0322 = 1.9376). The
    run's own throughput keeps the engine's makespan, 1.25 to 1,022.25 ms (2 / 1.021 s)."""
    bench = {"completed": 2, "failed": 0, "request_rate": 1.0, "burstiness": "Infinity", "duration": 2.0322,
             "mean_ttft_ms": 16.2, "mean_e2el_ms": 32.2, "request_throughput": 2 / 2.0322,
             "output_throughput": 6 / 2.0322, "total_token_throughput": 206 / 2.0322}
    run = linear_pair(tmp_path, bench)
    assert run.requests["sent_ms"].tolist() == [0.0, 1000.0]
    vs = run.metrics["vs_target"]
    assert vs["simulated"] == pytest.approx({"ttft_ms.mean": 16.2, "e2e_ms.mean": 32.2,
                                             "request_throughput_rps": 2 / 2.0322,
                                             "output_throughput_tps": 6 / 2.0322,
                                             "total_throughput_tps": 206 / 2.0322}, rel=1e-9)
    assert vs["simulated"]["request_throughput_rps"] == pytest.approx(0.98415, abs=1e-5)
    assert all(abs(e) < 1e-9 for e in vs["errors_pct"].values())
    assert run.metrics["request_throughput_rps"] == pytest.approx(2 / 1.021, rel=1e-9)   # unchanged


def test_requests_the_client_gave_up_on_are_not_counted_in_the_throughputs(tmp_path):
    """Both requests sent at 0 (a vLLM run at --request-rate inf: no gap before the first), the
    second of 50 tokens from a client that gives up after 100 ms. vLLM counts the successful
    request alone (1 request, 3 tokens; 103 with its prompt) over its whole duration, which ends
    when the second client gave up, at 100 ms: 10 requests/s, 30 and 1,030 tokens/s -- not the
    abandoned request and the tokens made for it before its abort (20 requests/s)."""
    bench = {"completed": 1, "failed": 1, "request_rate": "inf", "duration": 0.1, "mean_ttft_ms": 20.0,
             "request_throughput": 10.0, "output_throughput": 30.0, "total_token_throughput": 1030.0}
    workload = 'kind = "file"\npath = "two.json"\n'
    (tmp_path / "two.json").write_text(json.dumps([
        {"prompt_tokens": 100, "output_tokens": 3, "arrival_ms": 0},
        {"prompt_tokens": 100, "output_tokens": 50, "arrival_ms": 0, "request_class": "impatient"}]))
    run = linear_pair(tmp_path, bench, '[client]\nclasses = {impatient = {timeout_ms = 100}}\n', workload)
    assert run.metrics["finished"] == 1 and run.metrics["timed_out"] == 1
    assert run.requests["client_done_ms"].max() == pytest.approx(100.0)
    sim = run.metrics["vs_target"]["simulated"]
    assert {k: sim[k] for k in THROUGHPUT_NAMES} == pytest.approx({"request_throughput_rps": 10.0,
                                                                   "output_throughput_tps": 30.0,
                                                                   "total_throughput_tps": 1030.0}, rel=1e-9)


@pytest.mark.parametrize("settings, gap", [
    ({"request_rate": 4.0, "burstiness": float("inf")}, 0.25),        # evenly spaced: 1 / rate
    ({"request_rate": "inf"}, 0.0),                                   # all at once
    ({}, 0.0),                                                        # (vLLM's default rate: inf)
    ({"request_rate": 4.0, "burstiness": 1.0}, 0.25),                 # no lists: the draw's mean, 1 / rate
    # start_times 100.3 and 100.9 s, latencies 0.2 and 0.5: the end 101.4, less the duration 1.7, is the
    # start, 99.7; the first send 0.6 s after it
    ({"request_rate": 4.0, "burstiness": 1.0, "duration": 1.7, "start_times": [100.3, 100.9],
      "latencies": [0.2, 0.5], "errors": ["", ""]}, 0.6),
    # a failed request's end is not recorded: the mean
    ({"request_rate": 4.0, "burstiness": 1.0, "duration": 1.7, "start_times": [100.3, 100.9],
      "latencies": [0.2, 0.0], "errors": ["", "timeout"]}, 0.25),
    ({"request_rate": "inf", "burstiness": float("inf"), "ramp_up_strategy": "linear", "ramp_up_start_rps": 2,
      "ramp_up_end_rps": 8}, 0.5),                                   # a ramp starts at its first rate
    ({"request_rate": "trace"}, None),                                # SGLang's trace timestamps
])
def test_the_first_gap_of_a_vllm_bench_file(settings, gap):
    from schedlab.targets import bench_first_gap_s

    got = bench_first_gap_s(settings)
    assert got == (None if gap is None else pytest.approx(gap, rel=1e-12))
