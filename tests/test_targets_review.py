"""Fixes of the metrics review (/work/reviews/metrics.md) in schedlab/targets.py: each statistic of a
tool computed from a simulated run as that tool computes it. Every file is written here in the
tool's own layout, every expected number worked out by hand in the test's docstring."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment
from schedlab.targets import Summary, TargetWarning, _weighted_statistic, read_summary, simulated


def _write(path, content):
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def _runs(tmp_path, toml: str) -> dict:
    """The runs of the experiment ``toml`` (written beside the test's files), by name."""
    path = tmp_path / "run.toml"
    path.write_text(toml)
    return {run.name: run for run in run_experiment(load(path)).all_runs()}


#: 0.1 ms a prompt token, 20 ms a decode step
LINEAR_COSTS = """
[cost_model]
kind = "linear"
prefill_ms_per_token = 0.1
decode_ms_per_step = 20.0
"""

#: both engines, each run compared with the file metrics.prom
BOTH_ENGINES = """
[[runs]]
name = "fast"

[[runs]]
name = "reference"
engine = "reference"
"""


# --- 1. iteration_tokens: vLLM 0.33 observes the prompt tokens it computed ---------------------

PREFIX_RUN = """
[experiment]
name = "iter"
reports = []

[workload]
kind = "inline"
requests = [{prompt_tokens = 400, output_tokens = 2, arrival_ms = 0.0, prefix_group = "a", prefix_tokens = 320},
            {prompt_tokens = 400, output_tokens = 2, arrival_ms = 1000.0, prefix_group = "a", prefix_tokens = 320}]

[scheduler]
kind = "vllm"
max_num_seqs = 8
max_num_batched_tokens = 2048
async_scheduling = false

[kv_cache]
kind = "paged"
num_blocks = 200
block_size = 16
prefix_caching = true
""" + LINEAR_COSTS + """
[target]
path = "metrics.prom"
statistics = ["iteration_tokens.mean"]
""" + BOTH_ENGINES


def test_iteration_tokens_count_the_prompt_less_its_prefix_hits(tmp_path):
    """vLLM 0.33's ``vllm:iteration_tokens_total`` observes ``prompt_token_stats.computed`` +
    the generated tokens (``v1/metrics/loggers.py``): a prompt less its prefix-cache hits. Two
    400-token prompts sharing their first 320 tokens (20 blocks of 16), the second sent after the
    first finished: the first computes all 400 (401 with its first token), the second only 80
    (81), each then decodes its second token alone: mean (401 + 1 + 81 + 1) / 4 = 121 (the whole
    prompt, as before: 201)."""
    _write(tmp_path / "metrics.prom", "\n".join([
        'vllm:iteration_tokens_total_bucket{le="+Inf"} 4', "vllm:iteration_tokens_total_sum 484",
        "vllm:iteration_tokens_total_count 4", ""]))
    from schedlab.targets import _iteration_tokens

    for name, run in _runs(tmp_path, PREFIX_RUN).items():   # both engines
        assert run.all_requests()["cached_tokens"].tolist() == [0, 320], name
        tokens, iterations = _iteration_tokens(run)
        assert sorted(np.repeat(tokens, iterations.astype(int)).tolist()) == [1.0, 1.0, 81.0, 401.0], name
        assert run.metrics["vs_target"]["simulated"]["iteration_tokens.mean"] == pytest.approx(121.0), name
        assert run.metrics["vs_target"]["errors_pct"]["iteration_tokens.mean"] == pytest.approx(0.0, abs=1e-9), name



def test_preempted_requests_prompts_are_said_to_be_read_low():
    """A preempted request's row sums the prefix hits of each admission; vLLM subtracts its first
    admission's only: said for the 1 row of the 4 that is preempted, has hits and a first token
    (not for one without hits, nor one turned away)."""
    from schedlab.targets import _warn_preempted_prompts

    req = {"first_token_ms": np.array([5.0, 5.0, 5.0, -1.0]), "rejected": np.array([0, 0, 0, 1]),
           "preemptions": np.array([1, 1, 0, 1]), "cached_tokens": np.array([32, 0, 32, 32])}
    summary = Summary("m.prom", "vLLM /metrics", {"iteration_tokens.mean": 1.0})
    with pytest.warns(TargetWarning) as caught:
        _warn_preempted_prompts(summary, req)
    assert [str(w.message) for w in caught] == [
        "m.prom: iteration_tokens: 1 preempted requests' cached_tokens add up the prefix hits of every admission, "
        "vLLM subtracts the first's: their prompts' computed tokens may be read low"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TargetWarning)
        _warn_preempted_prompts(summary, {**req, "preemptions": np.array([0, 1, 0, 1])})

# --- 3. TTFT against /metrics: every request that got a first token ----------------------------

#: one slot, 0.1 ms a prompt token, 20 ms a decode step; the chat client gives up after 100 ms
ABANDON_RUN = """
[experiment]
name = "ttft"
reports = []
timeline = false

[workload]
kind = "inline"
requests = [{prompt_tokens = 100, output_tokens = 11, arrival_ms = 0.0, request_class = "chat"},
            {prompt_tokens = 100, output_tokens = 2, arrival_ms = 0.0, request_class = "batch"}]

[scheduler]
kind = "continuous"
max_num_seqs = 1

[client]
classes = {chat = {timeout_ms = 100.0}}
""" + LINEAR_COSTS + """
[target]
path = "metrics.prom"
statistics = ["ttft_ms.mean", "ttft_ms.p50", "e2e_ms.mean"]
""" + BOTH_ENGINES

#: vLLM's TTFT histogram holds both requests (10 and 120 ms), its E2E only the finished one (140 ms)
ABANDON_SCRAPE = "\n".join([
    'vllm:time_to_first_token_seconds_bucket{le="0.05"} 1', 'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 2',
    "vllm:time_to_first_token_seconds_sum 0.13", "vllm:time_to_first_token_seconds_count 2",
    'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 1', "vllm:e2e_request_latency_seconds_sum 0.14",
    "vllm:e2e_request_latency_seconds_count 1", ""])


def test_the_engines_ttft_counts_a_request_abandoned_after_its_first_token(tmp_path):
    """vLLM observes a TTFT when the first token's output is processed
    (``IterationStats.update_from_output``), and a request its client then abandons is aborted
    with no finished-request statistic: its TTFT is in the histogram, its E2E is not. Request 0's
    100-token prompt takes 10 ms (first token at 10), its decodes 20 ms each: its chat client gives up
    at 100 ms, in the step of 90 to 110, and the engine aborts it at that step's end. Request 1
    then prefills from 110 to 120 (TTFT 120) and decodes its second token by 140. TTFT mean (10 +
    120) / 2 = 65 ms, where the completed request's alone was 120; p50: rank 1 of 2 falls in (0,
    50 ms], which holds 1 of 1: 50; E2E: the completed request's 140 ms."""
    _write(tmp_path / "metrics.prom", ABANDON_SCRAPE)
    for name, run in _runs(tmp_path, ABANDON_RUN).items():
        assert run.metrics["timed_out"] == 1 and run.metrics["ttft_ms"]["mean"] == pytest.approx(120.0), name
        vs = run.metrics["vs_target"]
        assert vs["measured"] == pytest.approx({"ttft_ms.mean": 65.0, "ttft_ms.p50": 50.0, "e2e_ms.mean": 140.0})
        assert vs["simulated"] == pytest.approx(vs["measured"]), name
        # a load generator counts the successful requests only: the completed one's 120 ms
        bench = Summary("b", "vllm bench serve", {"ttft_ms.mean": 1.0})
        assert simulated(bench, run) == pytest.approx({"ttft_ms.mean": 120.0}), name


# --- 4. guidellm's percentiles are nearest rank -------------------------------------------------

#: ten one-token requests sent at once to one slot, each prompt 10 ms: TTFT (= latency) 10, 20 ... 100
TEN_RUN = """
[experiment]
name = "ten"
reports = []
timeline = false

[workload]
kind = "inline"
requests = [""" + ", ".join(["{prompt_tokens = 100, output_tokens = 1, arrival_ms = 0.0}"] * 10) + """]

[scheduler]
kind = "continuous"
max_num_seqs = 1
""" + LINEAR_COSTS + """
[target]
path = "guidellm.json"
""" + BOTH_ENGINES


def _guidellm(ttft: dict, latency_s: dict) -> dict:
    """A guidellm report of one benchmark: TTFT (ms) and request latency (s) of its successful
    requests, ``mean``, ``median`` and ``percentiles``."""
    def dist(values):
        return {"mean": values["mean"], "median": values["median"], "count": 10,
                "percentiles": {key: value for key, value in values.items() if key.startswith("p")}}

    return {"benchmarks": [{"metrics": {"time_to_first_token_ms": {"successful": dist(ttft)},
                                        "request_latency": {"successful": dist(latency_s)}}}]}


def test_guidellm_percentiles_of_ttft_and_latency_are_nearest_rank(tmp_path):
    """guidellm takes every percentile as the first value whose cumulative probability reaches it
    (``Percentiles.from_pdf``: ``cumsum`` of the probabilities, ``searchsorted`` left); ``median``
    is its p50. Of 10, 20 ... 100 ms, each of probability 0.1: p10 10 (cdf 0.1), p50 50 (cdf
    0.5), p90 100 -- nine tenths sum to 0.8999999999999999, below 0.9 --, p99 100. numpy's linear
    percentiles, read before, were 19, 55, 91 and 99.1. The mean is 55 either way."""
    ttft = {"mean": 55.0, "median": 50.0, "p10": 10.0, "p50": 50.0, "p90": 100.0, "p99": 100.0}
    _write(tmp_path / "guidellm.json", _guidellm(ttft, {k: v / 1e3 for k, v in ttft.items()}))
    expected = {"ttft_ms.mean": 55.0, "ttft_ms.p10": 10.0, "ttft_ms.p50": 50.0, "ttft_ms.p90": 100.0,
                "ttft_ms.p99": 100.0, "e2e_ms.mean": 55.0, "e2e_ms.p10": 10.0, "e2e_ms.p50": 50.0,
                "e2e_ms.p90": 100.0, "e2e_ms.p99": 100.0}
    for name, run in _runs(tmp_path, TEN_RUN).items():
        vs = run.metrics["vs_target"]
        assert vs["measured"] == pytest.approx(expected), name
        assert vs["simulated"] == pytest.approx(expected), name


def test_a_weighted_percentile_sums_probabilities_as_guidellm_does():
    """Ten values of weight 1: guidellm's probabilities 0.1 summed reach 0.8999999999999999 at the
    ninth, so its p90 is the tenth value; weights summed first, 9 / 10 = 0.9 exactly, picked the
    ninth. Equal values are one entry of their summed weight: 5, 5, 7 of weights 1, 1, 2 have cdf
    0.5 at 5, so p50 is 5, p51 is 7."""
    values = np.arange(1.0, 11.0)
    assert _weighted_statistic(values, np.ones(10), "p90") == 10.0
    assert _weighted_statistic(values, np.ones(10), "p50") == 5.0
    assert _weighted_statistic(np.array([7.0, 5.0, 5.0]), np.array([2.0, 1.0, 1.0]), "p50") == 5.0
    assert _weighted_statistic(np.array([7.0, 5.0, 5.0]), np.array([2.0, 1.0, 1.0]), "p51") == 7.0


# --- 5. inference-perf's server rates: over a window that runs past the run ----------------------

#: two one-token requests sent at once to one slot, 10 ms a prompt: the engine's makespan 0 to 20 ms
TWO_RUN = TEN_RUN.split("[target]")[0].replace(
    ", ".join(["{prompt_tokens = 100, output_tokens = 1, arrival_ms = 0.0}"] * 10),
    ", ".join(["{prompt_tokens = 100, output_tokens = 1, arrival_ms = 0.0}"] * 2)) + '[[runs]]\nname = "two"\n'

#: summary_prometheus_metrics.json: the server's counters as rates over inference-perf's window
IP_SERVER = {"successes": {"count": 2, "rate": 0.1, "prompt_len": {"mean": 100.0, "rate": 10.0},
                           "output_len": {"mean": 1.0, "rate": 0.1}, "request_latency": {"mean": 0.015}}}


@pytest.mark.parametrize("config, pad", [
    (None, 15 + 2),   # inference-perf's default scrape_interval
    ("metrics:\n  type: prometheus\n  prometheus:\n    url: http://prom:9090\n    scrape_interval: 5\n", 5 + 2),
    ("metrics:\n  prometheus:\n    scrape_interval: 0   # its client's fallback\n", 30 + 2),
    ("server:\n  type: vllm\nmetrics:\n  prometheus:\n    scrape_interval: '60'\n", 60 + 2),
    # flow style, as valid YAML as the block style (it was read line by line and missed: 15 + 2)
    ("server: {type: vllm, model_name: m}\nmetrics: {type: prometheus, prometheus: {scrape_interval: 30}}\n",
     30 + 2),
])
def test_inference_perf_server_rates_divide_by_its_prometheus_window(tmp_path, config, pad):
    """inference-perf queries ``sum(rate(X[{duration}s]))`` at ``scrape_interval`` + 2 s after
    the run (``wait()``; a stage's at its end + the same), from the run's start: the run's 2
    requests over its 0.02 s and that pad. So 2 / (0.02 + pad) requests a second, 2 output
    tokens and 2 + 200 in all over the same."""
    (tmp_path / "run").mkdir()
    if config is not None:
        _write(tmp_path / "run" / "config.yaml", config)
    summary = read_summary(_write(tmp_path / "run" / "summary_prometheus_metrics.json", IP_SERVER))
    assert summary.window_pad_s == pad
    run = _runs(tmp_path, TWO_RUN)["two"]
    window = 0.02 + pad
    assert simulated(summary, run) == pytest.approx({"e2e_ms.mean": 15.0, "request_throughput_rps": 2 / window,
                                                     "output_throughput_tps": 2 / window,
                                                     "total_throughput_tps": 202 / window})


def test_an_inference_perf_config_that_is_not_yaml_is_said_not_skipped(tmp_path):
    """A config.yaml beside the report that is no YAML was ignored without a word (the report read
    as a vLLM server's, with the default scrape interval): now the same, with a warning naming it."""
    config = _write(tmp_path / "config.yaml", "server: {type: tgi\nmetrics: [\n")
    with pytest.warns(TargetWarning, match=rf"^{re.escape(str(config))}: not readable as YAML .*: the report beside "
                                           r"it is read as a vLLM server's"):
        summary = read_summary(_write(tmp_path / "summary_prometheus_metrics.json", IP_SERVER))
    assert summary.window_pad_s == 15 + 2 and summary.server == "vllm"


def test_an_inference_perf_scrape_interval_that_is_no_number_is_refused(tmp_path):
    config = _write(tmp_path / "config.yaml", "metrics:\n  prometheus:\n    scrape_interval: soon\n")
    with pytest.raises(ConfigError) as info:
        read_summary(_write(tmp_path / "summary_prometheus_metrics.json", IP_SERVER))
    assert str(info.value) == (f"{config}: metrics.prometheus.scrape_interval: must be a number of seconds >= 0, "
                               f"got 'soon'")


# --- 6. vllm bench serve --goodput's request_goodput ----------------------------------------------

#: vllm bench serve --goodput ttft:15 at --request-rate 100 (no --save-detailed): its duration starts
#: 1 / 100 s before the first send
GOODPUT_BENCH = {"completed": 2, "failed": 0, "request_rate": 100.0, "request_throughput": 60.0,
                 "request_goodput": 30.0, "mean_ttft_ms": 15.0}


def test_request_goodput_is_read_against_the_runs_slo_over_vllms_duration(tmp_path):
    """``request_goodput = good_completed / dur_s`` (``vllm/benchmarks/serve.py``). The run's two
    one-token requests have TTFT 10 and 20 ms: with ``[slo] ttft_ms = 15`` one meets it (a
    one-token request's TPOT is 0: it meets any). vLLM's duration runs from 1 / rate = 10 ms
    before the first send to the last response at 20 ms: 1 / 0.03 = 33.33 a second, against the
    file's 30: +11.1%. (The run's own ``slo.goodput_rps`` is over the engine's 0.02 s: 50.)"""
    _write(tmp_path / "bench.json", GOODPUT_BENCH)
    summary = read_summary(tmp_path / "bench.json")
    assert summary.values == {"ttft_ms.mean": 15.0, "request_throughput_rps": 60.0, "slo.goodput_rps": 30.0}
    toml = TWO_RUN.replace('[[runs]]', '[slo]\nttft_ms = 15.0\n\n[target]\npath = "bench.json"\n'
                           'statistics = ["slo.goodput_rps"]\n\n[[runs]]')
    run = _runs(tmp_path, toml)["two"]
    assert run.metrics["slo"]["goodput_rps"] == pytest.approx(50.0)
    vs = run.metrics["vs_target"]
    assert vs["simulated"] == pytest.approx({"slo.goodput_rps": 1 / 0.03})
    assert vs["errors_pct"] == pytest.approx({"slo.goodput_rps": (1 / 0.03 - 30.0) / 30.0 * 100})


def test_request_goodput_without_a_runs_slo_is_refused_and_null_is_none(tmp_path):
    """A run without ``[slo]`` has no targets to count goodput by: refused, saying how to go on.
    Without ``--goodput`` vLLM writes ``request_goodput`` null: no statistic."""
    path = _write(tmp_path / "bench.json", GOODPUT_BENCH)
    run = _runs(tmp_path, TWO_RUN)["two"]
    with pytest.raises(ConfigError) as info:
        simulated(read_summary(path), run)
    assert str(info.value) == (
        f"{path}: slo.goodput_rps (vllm bench serve --goodput's request_goodput) needs the run's [slo] table with "
        f"the --goodput targets: add one, or leave the statistic out (the [target] table's statistics, calibrate's "
        f"--statistics)")
    summary = read_summary(_write(tmp_path / "plain.json", {**GOODPUT_BENCH, "request_goodput": None}))
    assert "slo.goodput_rps" not in summary.values and summary.dropped == {}   # (no statistic lost: none asked for)
    from schedlab.targets import check_statistic_names

    check_statistic_names(["slo.goodput_rps", "ttft_ms.p99"], "--statistics")



def test_request_goodput_is_left_out_with_a_warning_for_a_run_without_slo(tmp_path):
    """A ``[target]`` or ``--target`` file with ``request_goodput`` on a run without ``[slo]``: the
    statistic is left out, said once, and the others are kept; with ``[slo]`` it stays."""
    from schedlab.targets import TargetWarning, incomparable_left_out

    summary = read_summary(_write(tmp_path / "bench.json", GOODPUT_BENCH))
    with pytest.warns(TargetWarning, match=r"slo\.goodput_rps need a \[slo\] table with its --goodput targets "
                                           r"to compare: left out"):
        kept = incomparable_left_out(summary, {"workload", "scheduler"}, "run [target]")
    assert set(kept.values) == set(summary.values) - {"slo.goodput_rps"}
    assert incomparable_left_out(summary, {"workload", "slo"}, "run [target]") is summary

# --- 2. ITL of steps of several tokens: SGLang and inference-perf count per token ----------------

#: one request, a 100-token prompt (10 ms) and 9 output tokens; n-gram drafts of 3 all accepted
#: (rate 1): its first token at 10 ms, then two steps of 4 tokens, each 20 ms + 3 drafts x 0.1 ms
SPEC_RUN = """
[experiment]
name = "spec"
reports = []
timeline = false

[workload]
kind = "inline"
requests = [{prompt_tokens = 100, output_tokens = 9, arrival_ms = 0.0}]

[scheduler]
kind = "vllm"
max_num_seqs = 1
async_scheduling = false
""" + LINEAR_COSTS + """
[target]
path = "metrics.prom"
statistics = ["itl_ms.mean"]

[[runs]]
name = "fast"
speculative = { method = "ngram", num_speculative_tokens = 3, acceptance_rate = 1.0 }

[[runs]]
name = "reference"
engine = "reference"
speculative = { method = "ngram", num_speculative_tokens = 3, acceptance_rate = 1.0 }

[[runs]]
name = "plain"
"""

#: SGLang's ITL histogram of that request: each step's 20.3 ms in the sum, its 4 tokens in the bucket of
#: 20.3 / 4 = 5.075 ms (collector.observe_inter_token_latency)
SGLANG_ITL = "\n".join([
    'sglang:inter_token_latency_seconds_bucket{le="0.01"} 8', 'sglang:inter_token_latency_seconds_bucket{le="+Inf"} 8',
    "sglang:inter_token_latency_seconds_sum 0.0406", "sglang:inter_token_latency_seconds_count 8", ""])


def test_sglangs_itl_mean_is_per_token_with_speculative_steps(tmp_path):
    """SGLang's /metrics adds a step's gap to the ITL sum and counts each of its tokens: mean 2 x
    20.3 / 8 = 5.075 ms. The simulated steps are one gap each (vLLM's own count: 20.3), so the
    mean is taken as SGLang's: the gaps' sum over the tokens after the first, 40.6 / 8. Without
    speculation (20 ms steps of one token) both are 20."""
    _write(tmp_path / "metrics.prom", SGLANG_ITL)
    runs = _runs(tmp_path, SPEC_RUN)
    for name in ("fast", "reference"):
        assert runs[name].metrics["itl_ms"]["mean"] == pytest.approx(20.3), name
        assert runs[name].metrics["vs_target"]["simulated"] == pytest.approx({"itl_ms.mean": 5.075}), name
        assert runs[name].metrics["vs_target"]["errors_pct"]["itl_ms.mean"] == pytest.approx(0.0, abs=1e-9), name
    assert runs["plain"].metrics["vs_target"]["simulated"] == pytest.approx({"itl_ms.mean": 20.0})


def test_which_itl_sources_count_per_token(tmp_path):
    """SGLang's bench_serving with its native backend (``sglang``, the default, or
    ``sglang-native``) gives each of a chunk's k tokens the gap over k; its OpenAI backends and
    ``vllm bench serve`` count one gap per chunk; inference-perf's lifecycle report gives the
    chunk's first token the gap and the rest 0. Means: 5.075 ms per token, 20.3 per step."""
    _write(tmp_path / "metrics.prom", SGLANG_ITL)
    run = _runs(tmp_path, SPEC_RUN)["fast"]
    sglang = {"completed": 1, "mean_e2e_latency_ms": 50.6, "mean_itl_ms": 5.075}
    inference_perf = {"successes": {"count": 1, "latency": {"inter_token_latency": {"mean": 0.005075}}}}
    for name, content, per_token in [
            ("native.jsonl", {**sglang, "backend": "sglang"}, True),
            ("native2.jsonl", {**sglang, "backend": "sglang-native"}, True),
            ("default.jsonl", sglang, True),
            ("oai.jsonl", {**sglang, "backend": "sglang-oai", "mean_itl_ms": 20.3}, False),
            ("vllm_backend.jsonl", {**sglang, "backend": "vllm", "mean_itl_ms": 20.3}, False),
            ("bench.json", {"completed": 1, "mean_itl_ms": 20.3}, False),
            ("summary_lifecycle_metrics.json", inference_perf, True)]:
        summary = read_summary(_write(tmp_path / name, content))
        assert summary.itl_per_token is per_token, name
        assert simulated(summary, run)["itl_ms.mean"] == pytest.approx(5.075 if per_token else 20.3), name


def test_per_step_percentiles_against_a_per_token_source_are_said(tmp_path):
    """The engines do not record a step's tokens, so the percentiles stay per step: against SGLang's
    histogram (every token in (0, 10 ms]: p50 5 ms) the simulated p50 is read from two 20.3-ms
    steps (the last finite bound, 10), and a warning says so; the mean alone, or a run whose
    steps give one token each, says nothing."""
    _write(tmp_path / "metrics.prom", SGLANG_ITL)
    runs = _runs(tmp_path, SPEC_RUN)
    summary = read_summary(tmp_path / "metrics.prom")
    assert summary.values["itl_ms.p50"] == pytest.approx(5.0)
    with pytest.warns(TargetWarning) as caught:
        sim = simulated(summary, runs["fast"])
    assert sim["itl_ms.mean"] == pytest.approx(5.075) and sim["itl_ms.p50"] == pytest.approx(10.0)
    assert [str(w.message) for w in caught] == [
        f"{tmp_path / 'metrics.prom'}: SGLang /metrics counts an ITL per token, and the simulated run's steps gave "
        f"4.00 tokens each (speculative decoding): itl_ms.mean is per token, its percentiles per step (the engines "
        f"do not record a step's tokens)"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TargetWarning)
        simulated(summary.select(["itl_ms.mean"]), runs["fast"])
        simulated(summary, runs["plain"])
