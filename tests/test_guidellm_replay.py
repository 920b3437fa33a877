"""Replaying one benchmark of a guidellm report (``kind = "guidellm"``): both per-request layouts
its versions write, errored requests, a sampled report refused unless asked, and a run written as
a report replayed to its own latencies. Every file is written by the test."""

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
    with pytest.raises(WorkloadError, match=r"keeps 1 of its 40 successful requests \(guidellm --sample-requests\)"):
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
