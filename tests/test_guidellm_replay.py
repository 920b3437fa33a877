"""Replaying one benchmark of a guidellm report (``kind = "guidellm"``): both per-request layouts
its versions write, errored requests, a sampled report refused unless asked (where 0.2-0.3 and
0.4+ write the counts), synchronous and concurrent benchmarks as closed loops of their streams,
and a run written as a report replayed to its own latencies. Every file is written by the test."""

from __future__ import annotations

import json

import pytest

from schedlab.errors import WorkloadError
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.workloads.guidellm import GuidellmConfig, make_guidellm_workload


def old_entry(start, first, last, end, prompt, output, text="p"):
    """guidellm 0.2-0.3: times at the entry's top."""
    return {"request_id": "x", "prompt": text, "output": "o", "prompt_tokens": prompt, "output_tokens": output,
            "start_time": start, "end_time": end, "first_token_time": first, "last_token_time": last}


def new_entry(start, first, last, end, prompt, output, body=None):
    """guidellm 0.4+: start and end at the top, token times in info.timings, the body as a repr."""
    args = {"method": None, "stream": True, "body": body or {"prompt": "p", "max_tokens": 64, "ignore_eos": True}}
    return {"type_": "generative_request_stats", "request_args": repr(args), "prompt_tokens": prompt,
            "output_tokens": output, "request_start_time": start, "request_end_time": end,
            "info": {"timings": {"request_start": start, "first_token_iteration": first,
                                 "last_token_iteration": last, "request_end": end}}}


def json_entry(start, first, last, end, prompt, output, body=None):
    """guidellm 0.6+: the body as JSON text (``model_dump_json``: true and null, not True and None)."""
    entry = new_entry(start, first, last, end, prompt, output, body)
    args = {"method": "POST", "stream": True, "headers": None, "params": None,
            "body": body or {"messages": [{"role": "user", "content": "p"}], "max_completion_tokens": 64,
                             "stream": True, "ignore_eos": True}, "files": None, "content": None}
    return {**entry, "request_args": json.dumps(args, separators=(",", ":"))}


def report(tmp_path, benchmarks, name="guidellm.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"benchmarks": benchmarks}))
    return str(path)


def benchmark(successful, errored=(), total=None):
    out = {"requests": {"successful": list(successful), "errored": list(errored), "incomplete": []},
           "config": {"strategy": {"type_": "constant"}}}
    if total is not None:
        out["metrics"] = {"request_totals": {"successful": total}}
    return out


@pytest.mark.parametrize("entry", [old_entry, new_entry, json_entry])
def test_both_layouts_by_hand(tmp_path, entry):
    """Sent at 10.0 and 10.5 s (out of order in the file): arrivals 0 and 500 ms; TTFT 100 and
    50 ms, latency 800 and 500 ms, TPOT (600 - 100) / 4 and (450 - 50) / 2; an errored request
    is counted, not replayed."""
    rows = [entry(10.5, 10.55, 10.95, 11.0, 30, 3), entry(10.0, 10.1, 10.6, 10.8, 12, 5)]
    path = report(tmp_path, [benchmark([], total=0), benchmark(rows, errored=[{"x": 1}], total=2)])
    w = make_guidellm_workload(GuidellmConfig(path=path, index=1))
    reqs = list(w.requests(0))
    assert [(r.arrival_ms, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 12, 5), (500.0, 30, 3)]
    m = w.measured
    assert m.view == "client"
    assert m.ttft_ms.tolist() == pytest.approx([100.0, 50.0])
    assert m.e2e_ms.tolist() == pytest.approx([800.0, 500.0])
    assert m.tpot_ms.tolist() == pytest.approx([500.0 / 4, 400.0 / 2])
    assert w.info["errored"] == 1 and w.info["strategy"] == "constant" and not w.info["sampled"]
    if entry is not old_entry:  # the body's max_tokens (64) is the client's limit
        assert [r.max_tokens for r in reqs] == [64, 64]


def test_request_args_that_read_as_nothing_are_said_once(tmp_path):
    from schedlab_plugins.workloads.measured import BenchReplayWarning

    rows = [{**json_entry(10.0 + i, 10.1 + i, 10.2 + i, 10.3 + i, 8, 2), "request_args": "{oops"} for i in range(3)]
    path = report(tmp_path, [benchmark(rows, total=3)])
    with pytest.warns(BenchReplayWarning, match=r"successful\[0\]: request_args is neither JSON .* nor are those of "
                                                r"2 other requests") as caught:
        reqs = list(make_guidellm_workload(GuidellmConfig(path=path)).requests(0))
    assert len([w for w in caught if issubclass(w.category, BenchReplayWarning)]) == 1
    assert [r.max_tokens for r in reqs] == [None, None, None]


def test_a_sampled_benchmark_is_refused_unless_asked(tmp_path):
    path = report(tmp_path, [benchmark([new_entry(1.0, 1.1, 1.2, 1.3, 8, 2)], total=40)])
    with pytest.raises(WorkloadError, match=r"keeps 1 of its 40 successful requests \(guidellm --sample-requests, "
                                            r"--output-sampling before 0\.4\)"):
        make_guidellm_workload(GuidellmConfig(path=path))
    w = make_guidellm_workload(GuidellmConfig(path=path, allow_sample=True))
    assert w.info["sampled"] and len(list(w.requests(0))) == 1


@pytest.mark.parametrize("content, settings, message", [
    ({"benchmarks": []}, {}, "the report's 'benchmarks' list is empty"),
    ({"nope": 1}, {}, "not a guidellm report"),
    ({"benchmarks": [benchmark([])]}, {"index": 3}, r"index 3: the report has 1 benchmarks \(0 to 0\)"),
    ({"benchmarks": [{"metrics": {}}]}, {}, r"keeps no per-request list \(requests.successful\)"),
    ({"benchmarks": [benchmark([{"prompt_tokens": 3, "output_tokens": 2}])]}, {}, "no start or end time"),
    ({"benchmarks": [benchmark([])]}, {}, "no successful requests"),
])
def test_bad_reports_are_named(tmp_path, content, settings, message):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(content))
    with pytest.raises(WorkloadError, match=message):
        make_guidellm_workload(GuidellmConfig(path=str(path), **settings))


def test_a_run_written_as_a_report_replays_to_its_own_latencies(tmp_path):
    """A schedlab run (linear costs, Poisson arrivals) written in guidellm 0.4+'s layout and
    replayed with the same settings: every one of the 15 statistics within 1e-6 %."""
    base = "[experiment]\nreports = []\n[scheduler]\nkind = \"vllm\"\nmax_num_seqs = 8\n[cost_model]\nkind = \"linear\"\n"
    truth = tmp_path / "truth.toml"
    truth.write_text(base + "[workload]\nkind = \"synthetic\"\nnum_requests = 60\nrate = 4.0\n"
                     "prompt = { dist = \"uniform\", low = 20, high = 600 }\noutput = { dist = \"uniform\", low = 2, high = 90 }\n")
    r = run_experiment(load(truth)).all_runs()[0].requests
    s = lambda col, i: 500 + r[col][i] / 1e3  # noqa: E731 -- seconds on the client's clock
    rows = [new_entry(s("arrival_ms", i), s("first_token_ms", i), s("finish_ms", i), s("finish_ms", i),
                      int(r["prompt_tokens"][i]), int(r["generated_tokens"][i]), body={"prompt": f"q{i}"})
            for i in range(len(r["id"]))]
    report(tmp_path, [benchmark(rows, total=len(rows))], "report.json")
    replay = tmp_path / "replay.toml"
    # the placeholder prompts ("q0", "q1", ...) share text, not prefixes: no prefix blocks from them
    replay.write_text(base + '[workload]\nkind = "guidellm"\npath = "report.json"\nprefix_blocks = "none"\n')
    vs = run_experiment(load(replay)).all_runs()[0].metrics["vs_measured"]
    assert len(vs["errors_pct"]) == 15 and vs["mean_abs_error_pct"] < 1e-6


# --- guidellm 0.2-0.3's own layout (src/guidellm/benchmark/benchmark.py at v0.3.0, the same at v0.2.0) ------------

def v03_entry(i, start, first, last, end, prompt, output):
    """A ``GenerativeTextResponseStats`` as guidellm 0.3's ``model_dump`` writes it: the scheduler's
    ``SchedulerRequestInfo``, the request and its times, and the computed fields."""
    return {"type_": "generative_text_response", "request_id": f"r{i}", "request_type": "text_completions",
            "scheduler_info": {"requested": True, "completed": True, "errored": False, "canceled": False,
                               "targeted_start_time": start, "queued_time": start - 0.001, "dequeued_time": start,
                               "scheduled_time": start, "worker_start": start, "request_start": start,
                               "request_end": end, "worker_end": end, "process_id": 0},
            "prompt": "p " * prompt, "output": "o " * output, "prompt_tokens": prompt, "output_tokens": output,
            "start_time": start, "end_time": end, "first_token_time": first, "last_token_time": last,
            "request_latency": end - start, "time_to_first_token_ms": 1e3 * (first - start),
            "time_per_output_token_ms": 1e3 * (last - first) / output,
            "inter_token_latency_ms": 1e3 * (last - first) / (output - 1) if output > 1 else 0.0,
            "tokens_per_second": (prompt + output) / (end - start), "output_tokens_per_second": output / (end - start)}


def v03_benchmark(entries, *, ran=None, strategy=None, warmup_number=None):
    """A ``GenerativeBenchmark`` of guidellm 0.2-0.3: ``args`` (with the strategy), ``run_stats``
    (``requests_made``, counting warmup and cooldown requests too), the metrics, then
    ``request_totals`` and ``request_samples`` at the benchmark's top and the ``requests``. With
    ``ran`` successful requests of which ``entries`` were kept, ``set_sample_size`` sampled it:
    ``request_samples`` is set; else it is null."""
    ran = len(entries) if ran is None else ran
    made = ran + (warmup_number or 0)
    start, end = min(e["start_time"] for e in entries), max(e["end_time"] for e in entries)
    strategy = strategy or {"type_": "synchronous"}
    return {
        "type_": "generative_benchmark", "id_": "b0", "run_id": "run0",
        "args": {"profile": {"type_": strategy["type_"]}, "strategy_index": 0, "strategy": strategy,
                 "max_number": made, "max_duration": None, "warmup_number": warmup_number, "warmup_duration": None,
                 "cooldown_number": None, "cooldown_duration": None},
        "run_stats": {"start_time": start, "end_time": end,
                      "requests_made": {"successful": made, "incomplete": 0, "errored": 0, "total": made},
                      "queued_time_avg": 0.001, "scheduled_time_delay_avg": 0.0, "scheduled_time_sleep_avg": 0.0,
                      "worker_start_delay_avg": 0.0, "worker_time_avg": 0.1,
                      "worker_start_time_targeted_delay_avg": 0.0,
                      "request_start_time_delay_avg": 0.0, "request_start_time_targeted_delay_avg": 0.0,
                      "request_time_delay_avg": 0.0, "request_time_avg": 0.1},
        "worker": {"type_": "generative_requests_worker"}, "request_loader": {"type_": "generative_request_loader"},
        "extras": {}, "metrics": {"requests_per_second": {}, "request_concurrency": {}, "request_latency": {}},
        "start_time": start, "end_time": end, "duration": end - start,
        "request_totals": {"successful": ran, "incomplete": 0, "errored": 0, "total": ran},
        "request_samples": ({"successful": len(entries), "incomplete": 0, "errored": 0, "total": None}
                            if ran > len(entries) else None),
        "requests": {"successful": list(entries), "errored": [], "incomplete": [], "total": None},
    }


def three_v03():
    return [v03_entry(i, 10.0 + i, 10.05 + i, 10.2 + i, 10.25 + i, 20 + i, 4) for i in (0, 4, 7)]


def without(table, *paths):
    """``table`` with the keys at ``paths`` ("a.b") taken out."""
    table = json.loads(json.dumps(table))
    for path in paths:
        *parents, last = path.split(".")
        inner = table
        for key in parents:
            inner = inner[key]
        del inner[last]
    return table


@pytest.mark.parametrize("drop, said", [
    ((), "keeps 3 of its 9 successful requests"),                        # request_totals at the top
    (("request_totals",), "keeps 3 of its 9 successful requests"),       # else run_stats.requests_made
    (("request_totals", "run_stats.requests_made"),                      # else request_samples alone
     r"keeps a sample of its successful requests \(3: request_samples is set, the count is not given\)"),
])
def test_a_sampled_0_3_report_is_refused_unless_asked(tmp_path, drop, said):
    """guidellm 0.3 --output-sampling 3 on a benchmark of 9 successful requests: the file keeps 3
    at random, counts 9 in ``request_totals`` (and ``run_stats.requests_made``) and sets
    ``request_samples``. It was replayed as if the 3 were the run, with no word."""
    path = report(tmp_path, [without(v03_benchmark(three_v03(), ran=9), *drop)])
    with pytest.raises(WorkloadError, match=said + r" \(guidellm --sample-requests, --output-sampling before "
                                                  r"0\.4\)"):
        make_guidellm_workload(GuidellmConfig(path=path))
    w = make_guidellm_workload(GuidellmConfig(path=path, allow_sample=True))
    assert w.info["sampled"] and len(list(w.requests(0))) == 1   # a closed loop of 1: the rest follow finishes


def test_a_whole_0_3_report_and_counts_that_are_not_the_lists_are_not_refused(tmp_path):
    """Every request kept (``request_samples`` null, the totals equal to the list); a warmup of 2
    counted in ``requests_made`` but not in the list is no sample; ``run_stats.completed``, which no
    guidellm writes, is not read as a count."""
    whole = v03_benchmark(three_v03())
    warmed = without(v03_benchmark(three_v03(), warmup_number=2), "request_totals")
    assert warmed["run_stats"]["requests_made"]["successful"] == 5
    unknown = {**benchmark([old_entry(1.0, 1.1, 1.2, 1.3, 8, 2)]), "run_stats": {"completed": 40}}
    path = report(tmp_path, [whole, warmed, unknown])
    for index in (0, 1, 2):
        w = make_guidellm_workload(GuidellmConfig(path=path, index=index))
        assert not w.info["sampled"]


# --- synchronous and concurrent benchmarks: closed loops of their streams ---------------------------------------

LINEAR = '[experiment]\nreports = []\n[scheduler]\nkind = "vllm"\nmax_num_seqs = 8\n[cost_model]\nkind = "linear"\n'


@pytest.mark.parametrize("layout", ["0.3", "0.4+"])
@pytest.mark.parametrize("gaps", [(0.01, 0.01), (0.06, 0.05)])
def test_a_synchronous_benchmark_is_replayed_one_request_at_a_time_by_hand(tmp_path, layout, gaps):
    """3 requests sent one after another (prompt 100, 200, 40; output 3, 2, 4), replayed on the
    linear model's defaults (0.05 ms a prompt token, 8 ms a decode step). Request 0 is sent at 0:
    prefill 5 ms, 2 decode steps, done at 21; request 1 then: 10 + 8 -> 39; request 2 then: 2 +
    3 x 8 -> 65. Sent at 0, 21 and 39 ms whether the real run sent them 10 ms apart (a slower
    simulated server: open loop they went out at 0, 10, 20 ms and overlapped) or 60 and 50 ms
    apart (a faster one: every request is due at the start, as guidellm's next one was due when
    the previous ended)."""
    starts = [100.0, 100.0 + gaps[0], 100.0 + gaps[0] + gaps[1]]
    shapes = [(100, 3), (200, 2), (40, 4)]
    if layout == "0.3":
        entries = [v03_entry(i, s, s + 0.004, s + 0.009, s + 0.0095, p, o)
                   for i, (s, (p, o)) in enumerate(zip(starts, shapes))]
        table = v03_benchmark(entries)
    else:
        entries = [new_entry(s, s + 0.004, s + 0.009, s + 0.0095, p, o, body={"prompt": "p", "max_tokens": o})
                   for s, (p, o) in zip(starts, shapes)]   # (each stops at its max_tokens, as 0.3's above)
        table = {**benchmark(entries, total=3), "config": {"strategy": {"type_": "synchronous"}}}
    report(tmp_path, [table], "report.json")
    exp = tmp_path / "sync.toml"
    exp.write_text(LINEAR + '[workload]\nkind = "guidellm"\npath = "report.json"\nprefix_blocks = "none"\n')
    r = run_experiment(load(exp)).all_runs()[0].requests
    assert r["sent_ms"].tolist() == [0.0, 21.0, 39.0]
    assert r["client_done_ms"].tolist() == [21.0, 39.0, 65.0]
    w = make_guidellm_workload(GuidellmConfig(path=str(tmp_path / "report.json")))
    assert w.closed_loop and w.info["strategy"] == "synchronous" and w.info["concurrency"] == 1


def test_a_concurrent_benchmark_holds_its_streams_by_hand(tmp_path):
    """concurrent@2 (0.4+: ``config.strategy.streams``), 4 requests: the first two are sent at 0;
    a slot freed at 25 ms sends the third then, one freed at 30 the fourth, nothing is left."""
    rows = [new_entry(5.0 + 0.1 * i, 5.05 + 0.1 * i, 5.1 + 0.1 * i, 5.2 + 0.1 * i, 10 + i, 3) for i in range(4)]
    strategy = {"type_": "concurrent", "streams": 2}
    path = report(tmp_path, [{**benchmark(rows, total=4), "config": {"strategy": strategy}}])
    w = make_guidellm_workload(GuidellmConfig(path=path))
    first = list(w.requests(0))
    assert [(r.id, r.arrival_ms, r.prompt_tokens) for r in first] == [(0, 0.0, 10), (1, 0.0, 11)]
    assert [(r.id, r.arrival_ms, r.prompt_tokens) for r in w.on_finish(first[0], 25.0)] == [(2, 25.0, 12)]
    assert [(r.id, r.arrival_ms, r.prompt_tokens) for r in w.on_finish(first[1], 30.0)] == [(3, 30.0, 13)]
    assert w.on_finish(first[0], 40.0) == []
    assert w.closed_loop and w.info["concurrency"] == 2
    assert w.measured.arrival_ms.tolist() == pytest.approx([0.0, 100.0, 200.0, 300.0])  # as recorded


def test_a_concurrent_ramp_up_staggers_the_first_streams(tmp_path):
    """concurrent@2 with rampup_duration 1 s (0.4+): the first two requests are due at 0 and
    500 ms; the third, sent when a slot frees at 100 ms, waits for the ramp's last start (500)."""
    rows = [new_entry(5.0 + 0.1 * i, 5.05 + 0.1 * i, 5.1 + 0.1 * i, 5.2 + 0.1 * i, 10 + i, 3) for i in range(3)]
    strategy = {"type_": "concurrent", "streams": 2, "rampup_duration": 1.0}
    path = report(tmp_path, [{**benchmark(rows, total=3), "config": {"strategy": strategy}}])
    w = make_guidellm_workload(GuidellmConfig(path=path))
    first = list(w.requests(0))
    assert [(r.id, r.arrival_ms) for r in first] == [(0, 0.0), (1, 500.0)]
    assert [(r.id, r.arrival_ms) for r in w.on_finish(first[0], 100.0)] == [(2, 500.0)]


@pytest.mark.parametrize("strategy", [{"type_": "constant", "rate": 2.0}, {"type_": "poisson", "rate": 2.0}])
def test_rate_strategies_stay_open_loop(tmp_path, strategy):
    """constant and poisson without max_concurrency send on their own clock: each request at its
    recorded start, however the server does (0.3's ``args.strategy`` here). (throughput is a
    closed loop of its cap: tests/test_workloads_review.py.)"""
    entries = [v03_entry(i, 10.0 + 0.25 * i, 10.3 + 0.25 * i, 10.5 + 0.25 * i, 10.6 + 0.25 * i, 8, 3)
               for i in range(3)]
    path = report(tmp_path, [v03_benchmark(entries, strategy=strategy)])
    w = make_guidellm_workload(GuidellmConfig(path=path))
    assert not getattr(w, "closed_loop", False) and w.info["concurrency"] is None
    assert [r.arrival_ms for r in w.requests(0)] == [0.0, 250.0, 500.0]


def test_a_concurrent_strategy_without_streams_is_named(tmp_path):
    rows = [new_entry(1.0, 1.1, 1.2, 1.3, 8, 2)]
    path = report(tmp_path, [{**benchmark(rows, total=1), "config": {"strategy": {"type_": "concurrent"}}}])
    with pytest.raises(WorkloadError, match=r"benchmark 0: strategy concurrent: streams must be a whole number >= 1, "
                                            r"got None"):
        make_guidellm_workload(GuidellmConfig(path=path))


@pytest.mark.parametrize("entry", [old_entry, new_entry])
@pytest.mark.parametrize(("first", "last", "end", "message"), [
    (9.0, 10.9, 11.0, r"first token time 9.0 is before its start 10.0"),       # TTFT -1 s
    (10.9, 10.2, 11.0, r"last token time 10.2 is before its first token time 10.9"),  # TPOT < 0
    (10.1, 15.0, 11.0, r"last token time 15.0 is after its end 11.0"),
])
def test_token_times_out_of_order_are_named(tmp_path, entry, first, last, end, message):
    """As the inference-perf reader refuses them: they loaded and gave a negative measured TTFT
    or TPOT to compare against (review s80 workloads, finding 1)."""
    rows = [entry(10.0, 10.1, 10.5, 10.6, 8, 3), entry(10.0, first, last, end, 8, 5)]
    path = report(tmp_path, [benchmark(rows, total=2)])
    with pytest.raises(WorkloadError, match=r"benchmark 0: requests.successful\[1\]: its " + message):
        make_guidellm_workload(GuidellmConfig(path=path))


def test_an_empty_answer_is_left_out_and_said(tmp_path):
    """A successful request with 0 output tokens is left out with a warning, as vllm bench serve's,
    inference-perf's and ML.ENERGY's readers do (it stopped the whole load)."""
    from schedlab_plugins.workloads.measured import BenchReplayWarning

    rows = [new_entry(10.0, 10.1, 10.5, 10.6, 8, 3), {**new_entry(10.2, None, None, 10.3, 8, 0)}]
    path = report(tmp_path, [benchmark(rows, total=2)])
    with pytest.warns(BenchReplayWarning, match=r"benchmark 0: 1 of its 2 successful requests have 0 output tokens"):
        w = make_guidellm_workload(GuidellmConfig(path=path))
    assert [(r.arrival_ms, r.output_tokens) for r in w.requests(0)] == [(0.0, 3)]
    assert w.measured.ttft_ms.tolist() == pytest.approx([100.0])
    only = report(tmp_path, [benchmark([rows[1]], total=1)], name="empty.json")
    with pytest.warns(BenchReplayWarning), pytest.raises(WorkloadError, match=r"no successful requests with output "
                                                                              r"tokens \(1 with 0\)"):
        make_guidellm_workload(GuidellmConfig(path=only))
