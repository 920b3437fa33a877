"""Replaying the real client of a ``vllm bench serve`` run (issue 20.7).

The result files here are written by the tests in the exact layout of ``vllm bench serve
--save-result --save-detailed`` (vLLM's ``vllm/benchmarks/serve.py``: the run's settings,
its summary statistics, per-request lists aligned with ``input_lens`` in seconds, and the
server's per-request ``server_ttfts`` / ``server_queue_times`` when it sent them). The test
marked ``vllm`` runs the real client against a local server with a known timing model and is
skipped without vLLM.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest

from schedlab.errors import InputWarning, WorkloadError
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.workloads.measured import VllmBenchConfig, load_vllm_bench, make_vllm_bench_workload


def bench_result(prompts, outputs, ttfts, itls, starts, *, queue_times=None, rate="inf", burstiness=1.0,
                 max_concurrency=None, errors=None, server_ttfts=None, server_queue_times=None):
    """A result dict as ``vllm bench serve --save-result --save-detailed`` writes it (times in s)."""
    n = len(prompts)
    latencies = [t + sum(i) for t, i in zip(ttfts, itls)]
    errors = errors or [""] * n
    ok = [i for i in range(n) if not errors[i]]
    duration = max(s + lat for s, lat in zip(starts, latencies)) - min(starts)
    result = {
        "date": "20260101-000000", "endpoint_type": "openai", "backend": "openai", "label": None,
        "model_id": "test-model", "tokenizer_id": "test-model", "num_prompts": n,
        "request_rate": rate, "burstiness": burstiness, "max_concurrency": max_concurrency,
        "duration": duration, "completed": len(ok), "failed": n - len(ok),
        "total_input_tokens": sum(prompts[i] for i in ok), "total_output_tokens": sum(outputs[i] for i in ok),
        "request_throughput": len(ok) / duration, "request_goodput": None,
        "output_throughput": sum(outputs) / duration, "total_token_throughput": (sum(prompts) + sum(outputs)) / duration,
        "input_lens": prompts, "output_lens": [o if not e else 0 for o, e in zip(outputs, errors)],
        "ttfts": ttfts, "itls": itls, "latencies": latencies, "start_times": starts,
        "queue_times": queue_times if queue_times is not None else [0.0] * n,
        "generated_texts": [" w" * o for o in outputs], "errors": errors,
        "max_output_tokens_per_s": 0.0, "max_concurrent_requests": 1, "rtfx": 0.0,
        "mean_ttft_ms": 1e3 * float(np.mean(ttfts)), "median_ttft_ms": 1e3 * float(np.median(ttfts)),
        "std_ttft_ms": 1e3 * float(np.std(ttfts)), "p99_ttft_ms": 1e3 * float(np.percentile(ttfts, 99)),
    }
    if server_ttfts is not None or server_queue_times is not None:
        result["server_queue_times"] = server_queue_times or [None] * n
        result["server_ttfts"] = server_ttfts or [None] * n
    return result


def write(tmp_path, result, name="bench.json"):
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return path


def test_the_recorded_send_times_are_replayed(tmp_path):
    """Without a concurrency cap each request is sent when the client sent it (start_times are
    perf_counter seconds: only their differences count); a failed request is left out."""
    path = write(tmp_path, bench_result([10, 20, 30, 40], [3, 2, 4, 1], [0.1, 0.2, 0.3, 0.05],
                                        [[0.01, 0.01], [0.02], [0.01] * 3, []], [100.0, 100.25, 100.5, 100.125],
                                        rate=4.0, burstiness=0.5, errors=["", "", "timeout", ""]))
    with pytest.warns(InputWarning, match="1 of the 4 requests failed"):
        bench = load_vllm_bench(path)
    assert bench.sent_ms.tolist() == [0.0, 250.0, 125.0]
    assert bench.measured.view == "client"
    assert bench.measured.e2e_ms == pytest.approx([120.0, 220.0, 50.0])
    with pytest.warns(InputWarning, match="1 of the 4 requests failed"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    requests = list(workload.requests(0))
    assert [(r.arrival_ms, r.prompt_tokens) for r in requests] == [(0.0, 10), (125.0, 40), (250.0, 20)]
    assert [r.arrival_ms for r in workload.requests(5)] == [0.0, 125.0, 250.0]  # no redraw: no seed
    assert workload.info["replay"] == "client" and not getattr(workload, "closed_loop", False)


def test_files_without_start_times_redraw_arrivals_from_the_rate(tmp_path):
    result = bench_result([10, 20, 30], [3, 1, 2], [0.1, 0.2, 0.3], [[0.01, 0.03], [], [0.05]], [0.0] * 3,
                          rate=4.0)
    del result["start_times"], result["queue_times"], result["latencies"]
    path = write(tmp_path, result)
    with pytest.warns(InputWarning, match="no start_times"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert workload.info["replay"] == "redraw"
    first = [r.arrival_ms for r in workload.requests(7)]
    assert first == [r.arrival_ms for r in workload.requests(7)] and 0.0 < first[0] < first[1] < first[2]
    assert first[2] == pytest.approx(3 / 4.0 * 1000.0, rel=1e-12)   # vLLM's: the last n / rate after the start
    assert first != [r.arrival_ms for r in workload.requests(8)]
    assert load_vllm_bench(path).measured.e2e_ms == pytest.approx([140.0, 200.0, 350.0])  # ttft + sum(itls)


def test_redrawn_arrivals_are_sent_as_vllm_s_get_request_sends_them(tmp_path):
    """3 requests at --request-rate 1 (Poisson), no start_times: vLLM's get_request draws a gap
    before every request, the first included, and rescales their sums so that the last request
    goes exactly n / rate = 3 s after the benchmark's start. So whatever the seed the arrivals
    (ms from that start) begin after 0 and end at 3,000: the first-to-last span never reaches
    n / rate (independent gaps, as schedlab's own Poisson stream draws them, spanned up to 4.2 s
    over 20 seeds)."""
    result = bench_result([10, 10, 10], [3, 3, 3], [0.1] * 3, [[0.01, 0.01]] * 3, [0.0] * 3, rate=1.0)
    del result["start_times"], result["queue_times"], result["latencies"]
    with pytest.warns(InputWarning, match="no start_times"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(write(tmp_path, result))))
    for seed in range(20):
        sent = [r.arrival_ms for r in workload.requests(seed)]
        assert 0.0 < sent[0] <= sent[1] <= sent[2] and sent[2] == pytest.approx(3000.0, rel=1e-12)
    assert workload.measured.bench_start_ms == 0.0   # (drawn from the benchmark's start)


def test_a_target_reads_a_redrawn_replay_from_its_benchmark_s_start(tmp_path):
    """The file above replayed (seed 0: sends at 1,186.4, 2,965.4 and 3,000 ms from the start) and
    compared with itself: each 10-token request alone on the server takes 0.5 ms of prefill and two
    8 ms decodes, so the last byte comes at 3,016.5 ms and vLLM's duration, from the start (not
    from the first send, nor one mean gap, 1 s, before it), is 3.0165 s: 3 / 3.0165 requests/s."""
    result = bench_result([10, 10, 10], [3, 3, 3], [0.1] * 3, [[0.01, 0.01]] * 3, [0.0] * 3, rate=1.0)
    del result["start_times"], result["queue_times"], result["latencies"]
    path = write(tmp_path, result)
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[workload]\nkind = "vllm_bench"\npath = "{path}"\n[target]\npath = "{path}"\n'
                        '[scheduler]\nkind = "continuous"\n[cost_model]\nkind = "linear"\n')
    with pytest.warns(InputWarning, match="no start_times"):
        run = run_experiment(load(exp_path)).all_runs()[0]
    assert run.requests["sent_ms"] == pytest.approx([1186.386, 2965.440, 3000.0], abs=1e-3)
    assert run.requests["client_done_ms"].max() == pytest.approx(3016.5, rel=1e-12)
    assert run.metrics["vs_target"]["simulated"]["request_throughput_rps"] == pytest.approx(3 / 3.0165, rel=1e-12)


def test_a_replay_knows_when_its_benchmark_started(tmp_path):
    """--request-rate 4 (Poisson): the first request went one drawn gap after the benchmark's
    start, which the file gives: its last response ended at 100.9 + 0.5 = 101.4 s, less its
    duration, 1.7 s, is 99.7 -- 0.6 s before the first send (100.3), so -600 ms on the replay's
    clock (0: the first request due). With the first request failed its end is unknown and the
    gap is the draw's mean, 1 / 4 s, before that request's send (it was sent too): 100.3 - 0.25
    = 100.05 s, 850 ms before the one kept (100.9 s, now 0). Its 20-token prompt takes 1 ms
    and two 8 ms decodes: done at 17 ms, so vLLM's duration is 867 ms (1 / 0.867 requests/s;
    from the first kept send, 1 / 0.017)."""
    result = bench_result([10, 20], [3, 3], [0.1, 0.2], [[0.05, 0.05], [0.15, 0.15]], [100.3, 100.9], rate=4.0)
    result["duration"] = 1.7
    assert load_vllm_bench(write(tmp_path, result)).measured.bench_start_ms == pytest.approx(-600.0, abs=1e-6)
    result["errors"] = ["timeout", ""]
    path = write(tmp_path, result)
    with pytest.warns(InputWarning, match="1 of the 2 requests failed"):
        assert load_vllm_bench(path).measured.bench_start_ms == pytest.approx(-850.0, abs=1e-6)
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[workload]\nkind = "vllm_bench"\npath = "{path}"\n[target]\npath = "{path}"\n'
                        '[scheduler]\nkind = "continuous"\n[cost_model]\nkind = "linear"\n')
    with pytest.warns(InputWarning, match="1 of the 2 requests failed"):
        run = run_experiment(load(exp_path)).all_runs()[0]
    assert run.requests["client_done_ms"].tolist() == pytest.approx([17.0])
    assert run.metrics["vs_target"]["simulated"]["request_throughput_rps"] == pytest.approx(1 / 0.867, rel=1e-9)


def test_a_run_sent_at_its_traces_timestamps(tmp_path):
    """SGLang's bench_serving --use-trace-timestamps writes request_rate "trace": without
    start_times there is nothing to replay (said so, not "must be a number"); with them the
    send times are replayed, and drawing arrivals from the rate is refused."""
    result = bench_result([10, 20], [3, 2], [0.1, 0.2], [[0.01, 0.01], [0.02]], [5.0, 5.5], rate="trace")
    path = write(tmp_path, result)
    workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert [r.arrival_ms for r in workload.requests(0)] == [0.0, 500.0] and workload.info["request_rate"] == "trace"
    with pytest.raises(WorkloadError, match=r'replay = "redraw" draws arrivals from request_rate, but this run sent'):
        make_vllm_bench_workload(VllmBenchConfig(path=str(path), replay="redraw"))
    del result["start_times"], result["queue_times"]
    with pytest.raises(WorkloadError, match=r"request_rate is \"trace\": the run sent its requests at its dataset's "
                                            r"timestamps \(SGLang bench_serving --use-trace-timestamps\)"):
        make_vllm_bench_workload(VllmBenchConfig(path=str(write(tmp_path, result, "b2.json"))))


def test_a_file_without_send_times_says_its_arrivals_are_drawn_again(tmp_path):
    """Redrawn arrivals meet the server at other times than the measured ones: said once, naming
    whose file it is (SGLang's bench_serving --output-details writes vLLM's per-request lists but
    no start_times, and its E2E as *_e2e_latency_ms). At an infinite rate every request was sent
    at once, as the redraw sends them: nothing to say."""
    from schedlab_plugins.workloads.measured import BenchReplayWarning

    result = bench_result([10, 20, 30], [3, 1, 2], [0.1, 0.2, 0.3], [[0.01, 0.03], [], [0.05]], [0.0] * 3,
                          rate=4.0)
    del result["start_times"], result["queue_times"]
    path = write(tmp_path, result)
    with pytest.warns(BenchReplayWarning, match=r"bench\.json: no start_times \(this vLLM records no send times\), "
                                                r"so arrivals are drawn again from the request_rate"):
        make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    sglang = {k: v for k, v in result.items() if not k.endswith("_ttft_ms")}
    sglang.update(backend="sglang", mean_e2e_latency_ms=200.0, median_e2e_latency_ms=200.0)
    path = write(tmp_path, sglang, "sglang.jsonl")
    with pytest.warns(BenchReplayWarning, match=r"no start_times \(SGLang's bench_serving records no send times\)"):
        make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    result["request_rate"] = "inf"
    path = write(tmp_path, result, "all_at_once.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BenchReplayWarning)
        make_vllm_bench_workload(VllmBenchConfig(path=str(path)))


def capped_file(tmp_path):
    """8 requests all due at once (request rate inf) under --max-concurrency 2: each pair waited
    for the pair before it; the file's queue times say how long."""
    starts = [50.0, 50.0, 50.017, 50.017, 50.034, 50.034, 50.051, 50.051]
    queue = [0.0, 0.0, 0.017, 0.017, 0.034, 0.034, 0.051, 0.051]
    return write(tmp_path, bench_result([10] * 8, [3] * 8, [0.001] * 8, [[0.008, 0.008]] * 8, starts,
                                        queue_times=queue, max_concurrency=2))


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_capped_client_is_replayed_as_a_closed_loop(tmp_path, engine):
    """Two slots: requests 0 and 1 are due at 0 and sent at once; their shared prefill (20
    tokens at 0.05 ms) ends at 1.0 and two decodes of 8 ms at 17.0, when requests 2 and 3 go
    out; and so on: sends at 0, 17, 34, 51 -- fed back by the simulation, not copied from the
    file (a slower server would push them later)."""
    path = capped_file(tmp_path)
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[experiment]\nengine = "{engine}"\n[workload]\nkind = "vllm_bench"\npath = "{path}"\n'
                        '[scheduler]\nkind = "continuous"\nmax_num_seqs = 16\n')
    run = run_experiment(load(exp_path)).all_runs()[0]
    req = run.requests
    assert req["sent_ms"].tolist() == [0.0, 0.0, 17.0, 17.0, 34.0, 34.0, 51.0, 51.0]
    assert req["finish_ms"].tolist() == [17.0, 17.0, 34.0, 34.0, 51.0, 51.0, 68.0, 68.0]
    slower = tmp_path / "slower.toml"
    slower.write_text(exp_path.read_text() + '[cost_model]\nkind = "linear"\ndecode_ms_per_step = 16\n')
    run = run_experiment(load(slower)).all_runs()[0]
    assert run.requests["sent_ms"].tolist() == [0.0, 0.0, 33.0, 33.0, 66.0, 66.0, 99.0, 99.0]


def test_a_capped_file_without_send_times_keeps_its_cap(tmp_path):
    """An older file (no start_times) of the capped run: arrivals are redrawn (all at once, the
    rate is inf) and still sent two at a time -- sends at 0, 17, 34, 51 as above, not all at 0."""
    result = json.loads(capped_file(tmp_path).read_text())
    del result["start_times"], result["queue_times"]
    path = write(tmp_path, result, "old.json")
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[experiment]\n[workload]\nkind = "vllm_bench"\npath = "{path}"\n'
                        '[scheduler]\nkind = "continuous"\nmax_num_seqs = 16\n')
    run = run_experiment(load(exp_path)).all_runs()[0]
    assert run.requests["sent_ms"].tolist() == [0.0, 0.0, 17.0, 17.0, 34.0, 34.0, 51.0, 51.0]


def test_send_times_replays_a_capped_run_open_loop(tmp_path):
    workload = make_vllm_bench_workload(VllmBenchConfig(path=str(capped_file(tmp_path)), replay="send_times"))
    assert [r.arrival_ms for r in workload.requests(0)] == pytest.approx([0.0, 0.0, 17.0, 17.0, 34.0, 34.0, 51.0, 51.0])


def test_the_client_s_times_are_compared_with_the_simulated_client(tmp_path):
    """One request: sent at 0; through the front end (0.5 ms of network, 1 + 10 x 0.25 ms of
    handling) it is queued at 4.0, its first token leaves at 4.5 and its last at 20.5; each
    reaches the client 0.75 ms later. A file that measured exactly that shows no error; the
    server's own TTFT (0.5 ms from the engine queue) and queue time (0) are compared with the
    simulated engine's."""
    path = write(tmp_path, bench_result([10], [3], [0.00525], [[0.008, 0.008]], [7.0],
                                        server_ttfts=[0.0005], server_queue_times=[0.0]))
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[workload]\nkind = "vllm_bench"\npath = "{path}"\n'
                        '[frontend]\nnetwork_ms = 0.5\nrequest_ms = 1.0\ntokenize_ms_per_token = 0.25\ntoken_ms = 0.25\n')
    run = run_experiment(load(exp_path)).all_runs()[0]
    vs = run.metrics["vs_measured"]
    assert vs["measured"]["ttft_ms.mean"] == pytest.approx(5.25)
    assert vs["mean_abs_error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert vs["server"]["measured"]["ttft_ms.mean"] == pytest.approx(0.5)
    assert vs["server"]["errors_pct"]["ttft_ms.mean"] == pytest.approx(0.0, abs=1e-9)
    assert vs["server"]["measured"]["loop_queue_ms.mean"] == 0.0  # (server_queue_times: from queued_ts)
    # the engine's view would be off by the front end: 0.5 ms against 5.25 measured
    assert run.metrics["ttft_ms"]["mean"] == pytest.approx(0.5)


def test_the_server_s_ttft_runs_from_the_first_scheduling_as_vllm_s():
    """vLLM 0.33's per-request ``time_to_first_token_ms`` (``server_ttfts``) is first_token_ts -
    scheduled_ts: a request queued 100 ms and prefilled in 20 reports 20, not 120. Two simulated
    requests by hand: queued 0 and 100 ms, prefilled in 10 and 20 ms; the server measured 10 and
    20 ms of TTFT and 0 and 100 ms of queue: no error (the simulated TTFT from arrival, a mean of
    65 ms, was compared before: +333%)."""
    from types import SimpleNamespace

    from schedlab.results.compare import server_comparison

    requests = {"arrival_ms": np.array([0.0, 0.0]), "taken_ms": np.array([0.0, 0.0]),
                "first_scheduled_ms": np.array([0.0, 100.0]),
                "first_token_ms": np.array([10.0, 120.0]), "finish_ms": np.array([50.0, 160.0]),
                "generated_tokens": np.array([5, 5]), "rejected": np.array([0, 0]),
                "timed_out": np.array([0, 0]), "aborted": np.array([0, 0])}
    measured = SimpleNamespace(server_ttft_ms=np.array([10.0, 20.0]), server_queue_ms=np.array([0.0, 100.0]))
    server = server_comparison(requests, measured)
    assert server["measured"]["ttft_ms.mean"] == pytest.approx(15.0)
    assert server["measured"]["loop_queue_ms.mean"] == pytest.approx(50.0)
    for key in ("ttft_ms.mean", "ttft_ms.p50", "ttft_ms.p99", "loop_queue_ms.mean", "loop_queue_ms.p90"):
        assert server["errors_pct"][key] == pytest.approx(0.0, abs=1e-9), key


def test_a_server_log_is_still_compared_with_the_simulated_engine(tmp_path):
    from schedlab_plugins.workloads.measured import load_vllm_log

    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"input_toks": 10, "output_toks": 3, "queued_ts": 1.0, "first_token_ts": 1.0005,
                                "last_token_ts": 1.0165}) + "\n")
    assert load_vllm_log(path)[2].view == "engine"
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[workload]\nkind = "vllm_log"\npath = "{path}"\n[frontend]\n')
    vs = run_experiment(load(exp_path)).all_runs()[0].metrics["vs_measured"]
    assert vs["mean_abs_error_pct"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("change, message", [
    ({"max_concurrency": 0}, r"max_concurrency: must be a whole number >= 1 or null, got 0"),
    ({"start_times": [1.0, "x"]}, r"start_times\[1\]: must be a number of seconds >= 0, got 'x'"),
    ({"start_times": [1.0]}, r"start_times has 1 entries but input_lens has 2"),
    ({"queue_times": [0.0, -1.0]}, r"queue_times\[1\]: must be a number of seconds >= 0"),
    ({"server_ttfts": [0.1, "y"]}, r"server_ttfts\[1\]: must be a number of seconds >= 0"),
    ({"itls": [[0.01], 5]}, r"itls\[1\]: must be a list of seconds"),
    # a successful request's bad length was read before its type was checked (a TypeError), or
    # dropped it in silence (-3, null); a count past 10**8 overflowed int64
    ({"output_lens": [2, "2"]}, r"output_lens\[1\]: must be a whole number from 0 to 10\*\*8, got '2'"),
    ({"output_lens": [2, -3]}, r"output_lens\[1\]: must be a whole number from 0 to 10\*\*8, got -3"),
    ({"output_lens": [None, 2]}, r"output_lens\[0\]: must be a whole number from 0 to 10\*\*8, got None"),
    ({"input_lens": [10, 10**20]}, r"input_lens\[1\]: must be a whole number from 1 to 10\*\*8, got "),
    ({"input_lens": [10, 10**9]}, r"input_lens\[1\]: must be a whole number from 1 to 10\*\*8, got 1000000000"),
    # a latency shorter than the TTFT made the measured TPOT negative, and the fit ran against it
    ({"latencies": [0.11, 0.05]}, r"latencies\[1\] \(0.05 s\) is shorter than ttfts\[1\] \(0.1 s\): a request's "
                                  r"latency holds its time to first token"),
    # present, of another type: it said the list was missing and to save with --save-detailed
    ({"errors": 5}, r"errors: must be a list, got 5 \(int\)$"),
])
def test_bad_files_are_refused_naming_the_field(tmp_path, change, message):
    result = bench_result([10, 20], [2, 2], [0.1, 0.1], [[0.01], [0.01]], [1.0, 1.5])
    result.update(change)
    with pytest.raises(WorkloadError, match=message):
        load_vllm_bench(write(tmp_path, result))


def test_a_failed_requests_lengths_are_not_read_and_an_empty_answer_is_left_out_with_a_warning(tmp_path):
    result = bench_result([10, 20, 30], [2, 0, 2], [0.1, 0.1, 0.1], [[0.01], [], [0.01]], [1.0, 1.5, 2.0])
    result["errors"] = ["", "", "timed out"]
    result["output_lens"][2] = None   # whatever a failed request holds
    with pytest.warns(InputWarning, match=r"1 of the 2 requests without an error have output_lens 0"), \
            pytest.warns(InputWarning, match=r"1 of the 3 requests failed"):
        bench = load_vllm_bench(write(tmp_path, result))
    assert list(bench.columns.prompt_tokens) == [10]


def test_failed_requests_are_counted_in_one_warning_and_in_the_info(tmp_path):
    """2 of 5 requests failed ("Bad Request": vLLM writes ttft 0, itls [], latency 0, output_lens 0
    for them): the 3 others are replayed, and a one-line BenchReplayWarning naming the file says
    how many were left out; ``workload.info["failed"]`` counts them. They were left out without a
    word, and a file with none still says nothing."""
    from schedlab_plugins.workloads.measured import BenchReplayWarning

    result = bench_result([10, 20, 30, 40, 50], [2, 2, 2, 2, 2], [0.1, 0.0, 0.1, 0.0, 0.1],
                          [[0.01], [], [0.01], [], [0.01]], [1.0, 1.25, 1.5, 1.75, 2.0], rate=4.0,
                          errors=["", "Bad Request", "", "Bad Request", ""])
    path = write(tmp_path, result)
    with pytest.warns(BenchReplayWarning, match="^" + re.escape(str(path))
                      + r": 2 of the 5 requests failed \(errors, e\.g\. 'Bad Request'\): left out of the replay, "
                      r"though they loaded the server too$"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert [r.prompt_tokens for r in workload.requests(0)] == [10, 30, 50]
    assert workload.info["failed"] == 2
    clean = write(tmp_path, bench_result([10, 20], [2, 2], [0.1, 0.1], [[0.01], [0.01]], [1.0, 1.5], rate=4.0),
                  "clean.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BenchReplayWarning)
        assert make_vllm_bench_workload(VllmBenchConfig(path=str(clean))).info["failed"] == 0


def test_the_failed_requests_warning_is_one_line_of_the_run_s_output(tmp_path, capsys):
    """``schedlab run`` says it once, on one line naming the file."""
    from schedlab.cli import main

    write(tmp_path, bench_result([10, 20, 30], [2, 2, 2], [0.1, 0.0, 0.1], [[0.01], [], [0.01]], [1.0, 1.25, 1.5],
                                 rate=4.0, errors=["", "Bad Request", ""]))
    exp = tmp_path / "failed.toml"
    exp.write_text('[experiment]\nname = "failed"\nreports = ["json"]\n[workload]\nkind = "vllm_bench"\n'
                   'path = "bench.json"\n[[runs]]\nname = "a"\n')
    assert main(["run", str(exp), "--out", str(tmp_path / "out")]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "failed" in line and "warning" in line]
    assert said == [f"schedlab: warning: {tmp_path / 'bench.json'}: 1 of the 3 requests failed (errors, e.g. "
                    "'Bad Request'): left out of the replay, though they loaded the server too"], said


# -- the real client (needs vLLM) ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer the timing server counts alike (one token per word)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(500)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "unk_token": "[UNK]"}))
    return folder


def run_client(tmp_path: Path, load: list[str]) -> tuple[Path, np.ndarray]:
    """``vllm bench serve`` with ``load`` (its dataset, rate and concurrency arguments) against
    the timing server in a process of its own (16 slots, 5 ms + 0.1 ms per running request +
    0.02 ms per admitted prompt token a step): its ``--save-detailed`` file, and the steps the
    server ran (a row each: start s, length ms, running, prompt tokens admitted, ms late)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "timing_server.py"), "--port", str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        tag = load[load.index("--max-concurrency") + 1] if "--max-concurrency" in load else "open"
        name = f"bench-{tag}.json"
        beside = Path(sys.executable).with_name("vllm")  # a venv's script, when its bin/ is not on PATH
        command = [shutil.which("vllm") or (str(beside) if beside.exists() else "vllm"), "bench", "serve", "--backend", "openai", "--model", "test-model",
                   "--tokenizer", str(word_tokenizer(tmp_path / "tokenizer")), "--host", "127.0.0.1",
                   "--port", str(port), "--dataset-name", "random", *load, "--seed", "1", "--ignore-eos",
                   "--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", name]
        subprocess.run(command, check=True, timeout=600, capture_output=True)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/steps", timeout=30) as response:
            steps = np.array(json.load(response), dtype=float)
    finally:
        server.kill()
        server.wait()
    return tmp_path / name, steps


@pytest.mark.vllm
@pytest.mark.parametrize("cap", [None, 8])
def test_the_real_client_against_a_server_with_a_known_timing_model(tmp_path, cap):
    """``vllm bench serve`` sends 200 requests at 20/s (bursty gamma gaps, burstiness 0.5) to
    the timing server (16 slots, 5 ms + 0.1 ms per running request per step, 0.02 ms per
    prompt token); schedlab replays its file with the same model: the recorded send times (or,
    under a cap, the same due times and cap), and the mean latencies within 15%. The front end is
    this harness's: the server tokenizes nothing, and the client's own time per request is ~2 ms
    (the calibration test below fits 1.6-3 ms)."""
    pytest.importorskip("vllm")
    path = run_client(tmp_path, ["--random-input-len", "64", "--random-output-len", "16", "--num-prompts", "200",
                                 "--request-rate", "20", "--burstiness", "0.5"]
                      + (["--max-concurrency", str(cap)] if cap else []))[0]
    bench = load_vllm_bench(path)
    assert bench.max_concurrency == cap and bench.sent_ms is not None
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[workload]\nkind = "vllm_bench"\npath = "{path}"\n'
                        '[scheduler]\nkind = "continuous"\nmax_num_seqs = 16\nmax_num_batched_tokens = 100000\n'
                        '[cost_model]\nkind = "linear"\nbase_ms = 5\nper_seq_ms = 0.1\nprefill_ms_per_token = 0.02\n'
                        'decode_ms_per_step = 0\n[frontend]\nrequest_ms = 2\ntokenize_ms_per_token = 0\n')
    run = run_experiment(load(exp_path)).all_runs()[0]
    if cap is None:
        order = np.argsort(bench.sent_ms, kind="stable")
        assert run.requests["sent_ms"] == pytest.approx(bench.sent_ms[order])
    else:
        assert run.metrics["peak_running"] <= cap
    errors = run.metrics["vs_measured"]["errors_pct"]
    for name in ("ttft_ms.mean", "e2e_ms.mean", "tpot_ms.mean"):
        assert abs(errors[name]) <= 15.0, (name, errors)


@pytest.mark.vllm
def test_calibrate_recovers_the_servers_constants_from_the_real_clients_files(tmp_path):
    """``vllm bench serve`` runs twice against the timing server (5 ms + 0.1 ms per running
    request + 0.02 ms per admitted prompt token a step): one request at a time with prompts of
    160-3,040 tokens, so TTFT grows with the prompt alone and every later step is base + one
    sequence; and 16 at a time with short prompts and long answers, whose steps are mostly 16
    decodes. ``schedlab calibrate`` fits the two files together -- each request against its
    replay, and on the 15 statistics -- from a start far off (10 ms, 0.3 ms, 0.05 ms), with the
    client's own HTTP time as a fourth setting (``frontend.request_ms``; its truth is not known;
    the server tokenizes nothing): each of the server's three constants within 5%. (The client's
    own time grows with the streams it reads at once -- ~2 ms a request alone, ~3-4 ms among 16,
    with a tail: one constant for both runs misses each by ~1 ms, which long prompts make small
    beside the prefill the first run's TTFTs pin.)"""
    pytest.importorskip("vllm")
    from schedlab.calibrate import Parameter, calibrate

    spread = ["--random-range-ratio", "0.9", "--request-rate", "inf"]
    one, steps_one = run_client(tmp_path, spread + ["--random-input-len", "1600", "--random-output-len", "32",
                                                  "--num-prompts", "60", "--max-concurrency", "1"])
    full, steps_full = run_client(tmp_path, spread + ["--random-input-len", "40", "--random-output-len", "256",
                                                    "--num-prompts", "160", "--max-concurrency", "16"])
    for steps in (steps_one, steps_full):  # the server's tokens left near its clock (no stalls)
        assert np.median(steps[:, 4]) < 1.0 and np.percentile(steps[:, 4], 99) < 5.0
    exp_path = tmp_path / "fit.toml"
    exp_path.write_text('[experiment]\nreports = []\n[workload]\nkind = "vllm_bench"\n'
                        '[scheduler]\nkind = "continuous"\nmax_num_seqs = 16\nmax_num_batched_tokens = 100000\n'
                        '[cost_model]\nkind = "linear"\nbase_ms = 10\nper_seq_ms = 0.3\nprefill_ms_per_token = 0.05\n'
                        'decode_ms_per_step = 0\n[frontend]\ntokenize_ms_per_token = 0\n'
                        f'[[runs]]\nname = "one"\nworkload = {{path = "{one}"}}\n'
                        f'[[runs]]\nname = "sixteen"\nworkload = {{path = "{full}"}}\n')
    parameters = [Parameter("cost_model.base_ms", 0.0, 20.0), Parameter("cost_model.per_seq_ms", 0.0, 1.0),
                  Parameter("cost_model.prefill_ms_per_token", 0.0, 0.2), Parameter("frontend.request_ms", 0.0, 20.0)]
    truth = {"cost_model.base_ms": 5.0, "cost_model.per_seq_ms": 0.1, "cost_model.prefill_ms_per_token": 0.02}
    for objective in ("requests", "statistics"):
        fit, _, _ = calibrate(load(exp_path), parameters, run_name=["one", "sixteen"], max_evaluations=1200,
                              starts=3, objective=objective, diagnose=False)
        assert fit.start_error_pct > 100.0 and fit.mean_abs_error_pct < 5.0, fit
        for key, value in truth.items():
            assert fit.values[key] == pytest.approx(value, rel=0.05), (objective, key, fit.values)


def test_ttfts_written_in_milliseconds_are_warned_about(tmp_path):
    """Replayed as seconds, every error read -99.9%, with no word though the file's own
    mean_ttft_ms said otherwise."""
    result = bench_result([10, 20], [2, 2], [0.1, 0.1], [[0.01], [0.01]], [1.0, 1.5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_vllm_bench(write(tmp_path, result))  # seconds, as the client writes them: nothing to say
    result.update(ttfts=[100.0, 100.0], itls=[[10.0], [10.0]], latencies=[110.0, 110.0])  # 100 "s" against 100 ms
    with pytest.warns(InputWarning, match=r"its ttfts average 100 s, its mean_ttft_ms says 100 ms: ttfts, itls and "
                                          r"latencies are seconds \(vllm bench serve's layout\) -- are these "
                                          r"milliseconds\?"):
        load_vllm_bench(write(tmp_path, result))


@pytest.mark.parametrize("frontend", [False, True])
def test_a_clients_file_without_a_front_end_is_said_in_the_compare_table(tmp_path, frontend):
    """It was compared 'as the client sees requests' while the simulated client was the engine."""
    import io

    from schedlab_plugins.reports.measured import CompareReport

    path = write(tmp_path, bench_result([10], [3], [0.00525], [[0.008, 0.008]], [7.0]))
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[workload]\nkind = "vllm_bench"\npath = "{path}"\n' + ("[frontend]\n" if frontend else ""))
    shown = io.StringIO()
    CompareReport(stream=shown).write(run_experiment(load(exp_path)), tmp_path / "out")
    note = ("(a client's file against a run without [frontend]: the simulated client is the engine, without the API "
            "server's and the network's time -- add [frontend])")
    assert (note in shown.getvalue().splitlines()) is not frontend
