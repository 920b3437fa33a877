"""Where a server's own TTFT and E2E histograms start a request's clock (schedlab/targets.py,
``_clock_start``). vLLM from 0.17 stamps ``arrival_time`` first thing in ``render_chat_async`` /
``render_cmpl_async`` (vllm/renderers/base.py), before the wait for the renderer's executor, the chat
template and the tokenizer; up to 0.16 ``InputProcessor.process_inputs`` (0.11:
``Processor.process_inputs``) stamped it after the OpenAI server had tokenized -- the engine's arrival.
SGLang's tokenizer manager times from the ``received_time`` its OpenAI handler stamps first. So with a
``[frontend]`` such a histogram holds the API server's queue and handling: it is compared with the
simulated first token (and finish) less ``sent_ms + network_ms``, unless ``[target] vllm_ttft_from =
"engine"`` says the vLLM is older. Every number is worked out by hand; both engines run each case."""

from __future__ import annotations

import json
import re

import pytest

from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment

#: Two requests sent at t = 0, 100-token prompts, 3 output tokens, one slot; 0.1 ms a prompt token and
#: 20 ms a decode step. The front end: 0.5 ms each way, one handler taking 1 ms + 0.01 ms a prompt token =
#: 2 ms a request. Both reach the API server at 0.5. Request 0 is handled 0.5 -> 2.5 (engine arrival 2.5),
#: request 1 waits for the handler and is handled 2.5 -> 4.5. Engine: request 0 prefills 2.5 -> 12.5
#: (first token), decodes two steps -> 52.5; request 1 waits for the slot, prefills 52.5 -> 62.5, finishes
#: at 102.5.
#:   from the engine's arrival (vLLM <= 0.16): TTFT 10 and 58 (mean 34), E2E 50 and 98 (mean 74);
#:   from the API server's receipt at 0.5 (vLLM >= 0.17, SGLang): TTFT 12 and 62 (mean 37) -- the
#:   handling (2 ms) and request 1's wait for the handler (2 ms) inside --, E2E 52 and 102 (mean 77).
#: The queue time (the engine core's queued -> scheduled, vllm:request_queue_time_seconds: loop_queue_ms) is
#: 0 and 40 either way (mean 20): request 1 reaches the engine at 4.5, during request 0's prefill, and its
#: loop takes it at 12.5 (queue_ms, from the arrival: 0 and 48).
RUN = """
[experiment]
name = "ttft_start"
reports = []
timeline = false

[workload]
kind = "inline"
requests = [{prompt_tokens = 100, output_tokens = 3, arrival_ms = 0.0},
            {prompt_tokens = 100, output_tokens = 3, arrival_ms = 0.0}]

[scheduler]
kind = "continuous"
max_num_seqs = 1

[cost_model]
kind = "linear"
prefill_ms_per_token = 0.1
decode_ms_per_step = 20.0

[frontend]
network_ms = 0.5
request_ms = 1.0
tokenize_ms_per_token = 0.01
token_ms = 0.25
workers = 1

[target]
TARGET

[[runs]]
name = "fast"

[[runs]]
name = "reference"
engine = "reference"
"""


def _histogram(name: str, bounds, counts, total: float) -> list[str]:
    return ([f'{name}_bucket{{le="{le}"}} {c}' for le, c in zip(bounds, counts)]
            + [f"{name}_sum {total}", f"{name}_count {counts[-1]}"])


#: A vLLM scrape of the run as vLLM >= 0.17 saw it: TTFT 12 and 62 ms -- none at or below 11 ms, one at or
#: below 50 (p50: rank 1 in (11, 50], which holds 1: 50) --, E2E 52 and 102, queued 0 and 40
VLLM_SCRAPE = "\n".join(
    _histogram("vllm:time_to_first_token_seconds", ["0.011", "0.05", "+Inf"], [0, 1, 2], 0.074)
    + _histogram("vllm:e2e_request_latency_seconds", ["0.06", "+Inf"], [1, 2], 0.154)
    + _histogram("vllm:request_queue_time_seconds", ["0.001", "0.05", "+Inf"], [1, 2, 2], 0.040)) + "\n"
STATISTICS = '["ttft_ms.mean", "ttft_ms.p50", "e2e_ms.mean", "loop_queue_ms.mean"]'


def _runs(tmp_path, name: str, content: str, target: str = "") -> list:
    (tmp_path / name).write_text(content, encoding="utf-8")
    path = tmp_path / "run.toml"
    path.write_text(RUN.replace("TARGET", f'path = "{name}"\n{target}'))
    runs = run_experiment(load(path)).all_runs()
    assert [run.name for run in runs] == ["fast", "reference"]
    return runs


def test_the_engine_times_are_the_ones_worked_out(tmp_path):
    """The run itself, by hand (the front end's handler queue included), on both engines."""
    for run in _runs(tmp_path, "metrics.prom", VLLM_SCRAPE, f"statistics = {STATISTICS}"):
        req = run.all_requests()
        assert list(req["sent_ms"]) == [0.0, 0.0]
        assert list(req["arrival_ms"]) == pytest.approx([2.5, 4.5])
        assert list(req["taken_ms"]) == pytest.approx([2.5, 12.5])   # request 1 came during request 0's prefill
        assert list(req["first_token_ms"]) == pytest.approx([12.5, 62.5])
        assert list(req["finish_ms"]) == pytest.approx([52.5, 102.5])
        assert run.metrics["ttft_ms"]["mean"] == pytest.approx(34.0)   # the engine's own view is unchanged
        assert run.meta["frontend"]["network_ms"] == 0.5


def test_vllms_histograms_start_at_the_api_server_by_default(tmp_path):
    """vLLM 0.33 (the presets' version): TTFT 12 and 62 (mean 37; p50 through the buckets 50), E2E
    52 and 102 (mean 77) -- each 0 % off the scrape of the same run; the queue time still from the
    engine's queue, when its loop took each request (20). Read from the engine's arrival (the old
    rule) they were 34, 11 and 74."""
    for run in _runs(tmp_path, "metrics.prom", VLLM_SCRAPE, f"statistics = {STATISTICS}"):
        vs = run.metrics["vs_target"]
        assert vs["measured"] == pytest.approx({"ttft_ms.mean": 37.0, "ttft_ms.p50": 50.0, "e2e_ms.mean": 77.0,
                                                "loop_queue_ms.mean": 20.0})
        assert vs["simulated"] == pytest.approx(vs["measured"]), run.name
        assert run.meta["target"]["ttft_from"] == "api_server"


def test_one_request_holds_its_handling(tmp_path):
    """One request alone: its histogram TTFT is the handling (1 + 0.01 x 100 = 2 ms) plus the engine's
    TTFT (10 ms): 12; its E2E 2 + 50 = 52."""
    scrape = "\n".join(_histogram("vllm:time_to_first_token_seconds", ["0.05", "+Inf"], [1, 1], 0.012)
                       + _histogram("vllm:e2e_request_latency_seconds", ["0.06", "+Inf"], [1, 1], 0.052)) + "\n"
    (tmp_path / "metrics.prom").write_text(scrape, encoding="utf-8")
    path = tmp_path / "run.toml"
    path.write_text(RUN.replace("TARGET", 'path = "metrics.prom"\nstatistics = ["ttft_ms.mean", "e2e_ms.mean"]')
                    .replace("{prompt_tokens = 100, output_tokens = 3, arrival_ms = 0.0},\n            ", ""))
    for run in run_experiment(load(path)).all_runs():
        assert run.all_requests()["id"].size == 1
        assert run.metrics["ttft_ms"]["mean"] == pytest.approx(10.0)
        assert run.metrics["vs_target"]["simulated"] == pytest.approx({"ttft_ms.mean": 12.0, "e2e_ms.mean": 52.0})


def test_an_older_vllm_is_read_from_the_engines_arrival(tmp_path):
    """``vllm_ttft_from = "engine"`` (vLLM <= 0.16): TTFT 10 and 58 (mean 34; p50 rank 1 in (0, 11]
    holding 1: 11), E2E 50 and 98 (mean 74)."""
    for run in _runs(tmp_path, "metrics.prom", VLLM_SCRAPE,
                     f'statistics = {STATISTICS}\nvllm_ttft_from = "engine"'):
        assert run.metrics["vs_target"]["simulated"] == pytest.approx(
            {"ttft_ms.mean": 34.0, "ttft_ms.p50": 11.0, "e2e_ms.mean": 74.0, "loop_queue_ms.mean": 20.0}), run.name
        assert run.meta["target"]["ttft_from"] == "engine"
    for run in _runs(tmp_path, "metrics.prom", VLLM_SCRAPE,
                     f'statistics = {STATISTICS}\nvllm_ttft_from = "api_server"'):
        assert run.metrics["vs_target"]["simulated"]["ttft_ms.mean"] == pytest.approx(37.0)


def test_sglangs_histograms_start_at_its_openai_handler(tmp_path):
    """SGLang's TTFT and E2E (tokenizer manager, from ``received_time``): 37 and 77 as vLLM 0.33's."""
    scrape = "\n".join(_histogram("sglang:time_to_first_token_seconds", ["0.05", "+Inf"], [1, 2], 0.074)
                       + _histogram("sglang:e2e_request_latency_seconds", ["0.06", "+Inf"], [1, 2], 0.154)) + "\n"
    for run in _runs(tmp_path, "sglang.prom", scrape, 'statistics = ["ttft_ms.mean", "e2e_ms.mean"]'):
        assert run.metrics["vs_target"]["simulated"] == pytest.approx({"ttft_ms.mean": 37.0, "e2e_ms.mean": 77.0})


def test_inference_perfs_report_of_vllms_histograms_follows_the_same_rule(tmp_path):
    """inference-perf's summary_prometheus_metrics.json of a vLLM server (no config.yaml: vLLM, its
    default) holds the same histograms: 37 and 77, or 34 and 74 with ``vllm_ttft_from = "engine"``."""
    report = {"successes": {"count": 2, "time_to_first_token": {"mean": 0.037},
                            "request_latency": {"mean": 0.077}}}
    for target, expected in (("", {"ttft_ms.mean": 37.0, "e2e_ms.mean": 77.0}),
                             ('vllm_ttft_from = "engine"', {"ttft_ms.mean": 34.0, "e2e_ms.mean": 74.0})):
        for run in _runs(tmp_path, "summary_prometheus_metrics.json", json.dumps(report), target):
            assert run.metrics["vs_target"]["simulated"] == pytest.approx(expected), (target, run.name)


@pytest.mark.parametrize("name, content, target, message", [
    ("bench.json", json.dumps({"completed": 2, "mean_ttft_ms": 20.0}), 'vllm_ttft_from = "engine"',
     r"vllm_ttft_from.*applies to vLLM's own histograms.*bench.json is not \(vllm bench serve\)"),
    ("sglang.prom", "\n".join(_histogram("sglang:time_to_first_token_seconds", ["0.1", "+Inf"], [2, 2], 0.074)) + "\n",
     'vllm_ttft_from = "api_server"', r"vllm_ttft_from.*sglang.prom is not \(SGLang /metrics\)"),
    ("metrics.prom", VLLM_SCRAPE, 'vllm_ttft_from = "client"', r"vllm_ttft_from.*must be one of 'api_server', 'engine'"),
])
def test_vllm_ttft_from_is_refused_where_it_means_nothing(tmp_path, name, content, target, message):
    with pytest.raises(ConfigError, match=message):
        _runs(tmp_path, name, content, target)


# --- schedlab calibrate --target FILE --target-vllm-ttft-from: the [target] key on the command line --------------

def _calibrate(tmp_path, capsys, *options: str) -> tuple[int, str, str]:
    """``schedlab calibrate`` of the run above (no [target] table) against VLLM_SCRAPE, fitting
    ``prefill_ms_per_token`` (from 0.1) to the TTFT mean alone."""
    (tmp_path / "metrics.prom").write_text(VLLM_SCRAPE, encoding="utf-8")
    path = tmp_path / "fit.toml"
    path.write_text(RUN.replace("[target]\nTARGET\n", ""))
    code = main(["calibrate", str(path), "--run", "fast", "--target", str(tmp_path / "metrics.prom"), *options,
                 "--statistics", "ttft_ms.mean", "--fit", "cost_model.prefill_ms_per_token=0.05:0.2",
                 "--starts", "1", "--max-evaluations", "30"])
    out, err = capsys.readouterr()
    return code, out, err


def _fitted(out: str) -> float:
    line = next(line for line in out.splitlines() if line.startswith("prefill_ms_per_token = "))
    return float(line.partition("=")[2])


def test_calibrate_takes_the_target_tables_vllm_ttft_from(tmp_path, capsys):
    """With ``p`` ms a prompt token (the decodes 20 ms), request 0's first token comes at 2.5 + 100p and
    request 1's at 2.5 + 100p + 40 + 100p (it waits for request 0's two decodes). From the engine's
    arrival (2.5 and 4.5: vLLM <= 0.16) the TTFT mean is (100p + 38 + 200p) / 2 = 19 + 150p: 34 at the
    file's 0.1, -8.1% off the scrape's 37, which p = 0.12 meets. From the API server's receipt at 0.5 (the
    default, vLLM >= 0.17) it is (2 + 100p + 42 + 200p) / 2 = 22 + 150p: 37 at 0.1 already."""
    code, out, _ = _calibrate(tmp_path, capsys, "--target-vllm-ttft-from", "engine")
    assert code == 0
    assert "before the fit (the file's values and the plugins' defaults): mean |error| 8.11% over 1 statistic" in out
    assert _fitted(out) == pytest.approx(0.12, abs=1e-4)
    for default in ((), ("--target-vllm-ttft-from", "api_server")):
        code, out, _ = _calibrate(tmp_path, capsys, *default)
        assert code == 0
        assert "mean |error| 0.00% over 1 statistic" in out
        # the file's 0.1 already meets it: the fit keeps it, with nothing to paste
        assert re.search(r"cost_model\.prefill_ms_per_token +0\.1 -> 0\.1 ", out), out
        assert "# nothing to paste: the fit did not improve on the file's values" in out


def test_calibrate_refuses_a_vllm_ttft_from_that_means_nothing(tmp_path, capsys):
    """The choices of [target]'s key, checked by argparse; a file that is not vLLM's own histograms and
    a run without --target (its [target] table has the key) refused as the table's key is."""
    with pytest.raises(SystemExit) as exit_:
        _calibrate(tmp_path, capsys, "--target-vllm-ttft-from", "client")
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert ("argument --target-vllm-ttft-from: invalid choice: 'client' (choose from 'api_server', 'engine')"
            in " ".join(err.split()))
    (tmp_path / "bench.json").write_text(json.dumps({"completed": 2, "mean_ttft_ms": 20.0}), encoding="utf-8")
    path = tmp_path / "fit.toml"
    path.write_text(RUN.replace("[target]\nTARGET\n", ""))
    fit = ["--fit", "cost_model.prefill_ms_per_token=0.05:0.2"]
    code = main(["calibrate", str(path), "--run", "fast", "--target", str(tmp_path / "bench.json"),
                 "--target-vllm-ttft-from", "engine", *fit])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert (f"--target-vllm-ttft-from engine: applies to vLLM's own histograms (a scrape of its /metrics, or "
            f"inference-perf's server metrics of a vLLM server); {tmp_path / 'bench.json'} is not (vllm bench serve); "
            f"leave it out") in " ".join(err.split())
    code = main(["calibrate", str(path), "--run", "fast", "--target-vllm-ttft-from", "engine", *fit])
    assert code == 2 and ("--target-vllm-ttft-from: applies to the file --target names; give --target (a run's "
                          "[target] table has its own index, baseline and vllm_ttft_from keys)"
                          in " ".join(capsys.readouterr().err.split()))
