"""Saturation detection: the waiting queue's trend, offered load against measured capacity,
the verdict in summary.json, and the marks in the table and the plots."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.cli import main
from schedlab.results import ExperimentResults, RunResult, Study
from schedlab.results.stability import admission_times, queue_stability, run_stability, stability_text, _per_min
from schedlab.results.storage import load as load_results
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.reports.plot_cdf import latency_cdf_figure
from schedlab_plugins.reports.plot_compare import compare_figure
from schedlab_plugins.reports.plot_timeline import timeline_figure
from schedlab_plugins.reports.table import render


def fcfs(arrival, service) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(arrival, start, finish)`` of a single FCFS server (the Lindley recursion)."""
    arrival = np.asarray(arrival, dtype=float)
    start, finish = np.empty(arrival.size), np.empty(arrival.size)
    free = -np.inf
    for i, (a, s) in enumerate(zip(arrival.tolist(), np.asarray(service, dtype=float).tolist())):
        free = start[i] = max(a, free)
        free = finish[i] = free + s
    return arrival, start, finish


def mm1(n: int, load: float, seed: int):
    """An M/M/1 run in ms: arrivals at 1 per ms on average, mean service ``load`` ms."""
    rng = np.random.default_rng(seed)
    gaps = rng.standard_exponential(n)
    return fcfs(np.cumsum(gaps) - gaps[0], rng.exponential(load, n))


# -- the statistic, by hand ---------------------------------------------------------------------------


def test_deterministic_overload_by_hand():
    # one arrival per ms (t = 0..199), 2 ms of service each: the server keeps up with half of
    # them, so the queue grows by 0.5 per ms; while it is non-empty a completion comes every
    # 2 ms (capacity 500/s) and the offered 1000/s are twice that
    out = queue_stability(*fcfs(np.arange(200.0), np.full(200, 2.0)))
    assert out["verdict"] == "unstable"
    assert out["arrival_rps"] == 1000.0
    assert out["capacity_rps"] == 500.0 and out["load"] == 2.0
    assert out["growth_share"] == pytest.approx(0.5, abs=0.01)
    assert out["waiting_slope_per_min"] == pytest.approx(30_000, rel=0.02)
    assert out["reason"] == "waiting grows 30,000 requests/min"
    assert stability_text(out) == "unstable: waiting grows 30,000 requests/min (arrivals 1e+03/s, capacity 500/s)"
    fit = out["fit"]
    assert (fit["start_ms"], fit["end_ms"]) == (0.0, 199.0)
    assert fit["waiting_at_end"] - fit["waiting_at_start"] == pytest.approx(99.5, abs=2)


def test_a_server_that_keeps_up_never_queues():
    # one arrival every 2 ms, 1 ms of service: nobody ever waits
    out = queue_stability(*fcfs(np.arange(100) * 2.0, np.ones(100)))
    assert out["verdict"] == "stable" and out["growth_share"] == 0.0 and out["saturated_share"] == 0.0
    assert out["capacity_rps"] is None and out["load"] is None  # a server that keeps up shows no capacity
    assert out["reason"] == "waiting does not grow (0.0% of arrivals accumulate)"


def test_too_few_requests_and_a_backlog_at_once_have_no_verdict():
    tiny = queue_stability(*fcfs(np.arange(5.0), np.full(5, 10.0)))
    assert tiny["verdict"] == "n/a" and tiny["reason"] == "too few requests to tell (5 < 20)"
    backlog = queue_stability(*fcfs(np.zeros(50), np.full(50, 2.0)))
    assert backlog["verdict"] == "n/a" and backlog["arrival_rps"] is None
    assert backlog["reason"] == "all 50 requests arrive at once: a backlog to drain, no arrival rate"
    assert backlog["capacity_rps"] == 500.0  # the rate the backlog drained at


def test_a_burst_that_drains_does_not_make_a_trend():
    # a burst of 40 at t = 0 on top of one arrival every 4 ms, 2 ms of service: the queue
    # drains within the first fifth of the window, and the median pairwise slope ignores it
    arrival = np.sort(np.concatenate([np.zeros(40), np.arange(1, 201) * 4.0]))
    out = queue_stability(*fcfs(arrival, np.full(arrival.size, 2.0)))
    assert out["verdict"] == "stable" and out["growth_share"] == 0.0


def test_a_queue_that_grew_while_arrivals_stayed_below_capacity_is_stable():
    # 50 arrivals 4 ms apart, then 300 at 1.8 ms: the queue grows over the last part, but over
    # the run 349 arrivals in 740 ms are 0.95 of the 500/s the server completes while full
    arrival = np.concatenate([np.arange(50) * 4.0, 200.0 + np.arange(300) * 1.8])
    out = queue_stability(*fcfs(arrival, np.full(arrival.size, 2.0)))
    assert out["growth_share"] >= 0.05 and out["capacity_rps"] == 500.0
    assert out["load"] == pytest.approx(349 / 738.2 / 0.5)
    assert out["verdict"] == "stable"
    assert out["reason"].endswith("but arrivals stay below capacity (load 0.95)")


def test_rejected_requests_never_wait():
    arrival, start, finish = fcfs(np.arange(200.0), np.full(200, 2.0))
    req = {"arrival_ms": arrival, "first_scheduled_ms": start, "finish_ms": finish,
           "rejected": np.zeros(200, dtype=np.int64), "instance": np.zeros(200, dtype=np.int64)}
    assert run_stability(req)[0]["verdict"] == "unstable"
    req["rejected"] = np.ones(200, dtype=np.int64)
    req["first_scheduled_ms"] = np.full(200, -1.0)
    req["finish_ms"] = np.full(200, -1.0)  # (the recorder's row of a request refused on arrival)
    assert run_stability(req)[0]["verdict"] == "stable"


def test_requests_turned_away_from_the_queue_waited_until_then():
    # three arrivals at 0, 1, 2: one scheduled at 5, one turned away from the queue at 4 (its
    # finish), one refused on arrival (finish -1)
    req = {"arrival_ms": np.array([0.0, 1.0, 2.0]), "first_scheduled_ms": np.array([5.0, -1.0, -1.0]),
           "finish_ms": np.array([9.0, 4.0, -1.0]), "rejected": np.array([0, 1, 1])}
    assert admission_times(req).tolist() == [5.0, 4.0, 2.0]


# -- properties -----------------------------------------------------------------------------------------

queues = st.tuples(
    st.lists(st.floats(0.0, 5.0), min_size=20, max_size=300),   # gaps between arrivals
    st.floats(0.1, 4.0),                                        # mean service time
    st.integers(0, 2**32 - 1),
)


@settings(max_examples=60)
@given(queues, st.sampled_from([0.25, 0.5, 2.0, 1024.0]))
def test_verdict_does_not_depend_on_the_time_unit_or_the_request_order(queue, scale):
    gaps, mean_service, seed = queue
    rng = np.random.default_rng(seed)
    arrival, start, finish = fcfs(np.cumsum(gaps), rng.exponential(mean_service, len(gaps)))
    base = queue_stability(arrival, start, finish)
    scaled = queue_stability(arrival * scale, start * scale, finish * scale)  # powers of 2: exact
    assert scaled["verdict"] == base["verdict"]
    for key in ("growth_share", "load", "saturated_share"):
        assert scaled[key] == base[key], key
    if base["waiting_slope_per_min"] is not None:
        assert scaled["waiting_slope_per_min"] * scale == pytest.approx(base["waiting_slope_per_min"], rel=1e-12)
    order = rng.permutation(len(gaps))
    shuffled = queue_stability(arrival[order], start[order], finish[order])
    assert {k: shuffled[k] for k in base if k != "reason"} == {k: base[k] for k in base if k != "reason"}


def test_mm1_runs_are_told_apart_by_load():
    """Over 100 seeds of 1,000 arrivals each: none at load 0.8 is called unstable, at least 95
    at load 1.2 are (benchmarks/stability.py measures the whole table)."""
    low = [queue_stability(*mm1(1000, 0.8, seed))["verdict"] for seed in range(100)]
    high = [queue_stability(*mm1(1000, 1.2, seed))["verdict"] for seed in range(100)]
    assert low.count("unstable") == 0 and low.count("inconclusive") <= 2
    assert high.count("unstable") >= 95


# -- simulated runs --------------------------------------------------------------------------------------

MM1 = '''
[experiment]
name = "mm1"
seed = 3
reports = ["table", "json"]

[workload]
kind = "file"
path = "requests.jsonl"
arrival = "poisson"
rate = 40

# one sequence at a time, 1 ms per iteration: a request with n output tokens takes n ms
[scheduler]
kind = "continuous"
max_num_seqs = 1

[cost_model]
kind = "linear"
prefill_ms_per_token = 1.0
decode_ms_per_step = 1.0

[[runs]]
name = "mm1"
sweep = {"workload.rate" = [40, 60]}
'''


def write_requests(path, outputs) -> None:
    path.write_text("".join(json.dumps({"prompt_tokens": 1, "output_tokens": int(o)}) + "\n" for o in outputs))


def run_file(tmp_path, toml: str, overrides=()):
    (tmp_path / "exp.toml").write_text(toml)
    return run_experiment(load(tmp_path / "exp.toml", list(overrides)))


def test_mm1_at_utilisation_08_is_stable_and_at_12_unstable(tmp_path):
    # service = output tokens x 1 ms, geometric with mean 20: about exponential, mean 20 ms, so
    # 40 requests/s are utilisation 0.8 and 60/s 1.2
    outputs = np.random.default_rng(5).geometric(1 / 20, 2000)
    write_requests(tmp_path / "requests.jsonl", outputs)
    runs = {r.point["workload.rate"]: r for r in run_file(tmp_path, MM1).all_runs()}
    stable, overloaded = runs[40].metrics["stability"], runs[60].metrics["stability"]
    assert stable["verdict"] == "stable" and stable["load"] is None
    assert overloaded["verdict"] == "unstable"
    assert overloaded["capacity_rps"] == pytest.approx(1000 / outputs.mean(), rel=0.1)  # 50/s
    assert overloaded["load"] == pytest.approx(1.2, rel=0.1)
    assert overloaded["growth_share"] == pytest.approx(1 - 1 / 1.2, abs=0.05)
    assert overloaded["arrival_rps"] == pytest.approx(60, rel=0.05)


def test_md1_capacity_is_the_service_rate_exactly(tmp_path):
    write_requests(tmp_path / "requests.jsonl", np.full(1000, 20))  # 20 ms each: 50 requests/s
    runs = {r.point["workload.rate"]: r for r in run_file(tmp_path, MM1).all_runs()}
    overloaded = runs[60].metrics["stability"]
    assert overloaded["verdict"] == "unstable"
    assert overloaded["capacity_rps"] == pytest.approx(50.0, rel=1e-9)
    assert overloaded["load"] == pytest.approx(overloaded["arrival_rps"] / 50.0, rel=1e-9)
    assert runs[40].metrics["stability"]["verdict"] == "stable"


def test_a_closed_loop_is_stable_however_many_clients_wait(tmp_path):
    # 16 clients on 4 slots: 12 always wait, and the queue never grows
    write_requests(tmp_path / "requests.jsonl", np.full(10, 20))
    results = run_file(tmp_path, MM1.replace('sweep = {"workload.rate" = [40, 60]}', "") + '''
workload = {kind = "closed_loop", path = "requests.jsonl", clients = 16, num_requests = 400}
scheduler = {max_num_seqs = 4}
''')
    run = results.all_runs()[0]
    assert run.metrics["avg_queue"] == pytest.approx(12, abs=0.5)
    assert run.metrics["stability"]["verdict"] == "stable"


MIX = '''
[experiment]
name = "two"
seed = 1

[workload]
kind = "mix"
[workload.classes.heavy]
kind = "synthetic"
num_requests = 1500
prompt = {dist = "fixed", value = 1}
output = {dist = "fixed", value = 20}
rate = 60
[workload.classes.light]
kind = "synthetic"
num_requests = 500
prompt = {dist = "fixed", value = 1}
output = {dist = "fixed", value = 20}
rate = 20

[scheduler]
kind = "continuous"
max_num_seqs = 1

[cost_model]
kind = "linear"
prefill_ms_per_token = 1.0
decode_ms_per_step = 1.0

[[runs]]
name = "by_class"
cluster = {instances = 2, router = {kind = "class", classes = {heavy = [0], light = [1]}}}

[[runs]]
name = "balanced"
cluster = {instances = 2, router = {kind = "round_robin"}}
'''


def test_several_instances_each_get_a_verdict(tmp_path):
    # 60 + 20 requests/s of 20 ms each on two one-slot instances (50/s each): routed by class,
    # instance 0 gets 60/s and is overloaded while instance 1 idles along at 20/s; spread
    # evenly, each gets 40/s and keeps up
    runs = {r.name: r for r in run_file(tmp_path, MIX).all_runs()}
    by_class = runs["by_class"].metrics
    assert by_class["per_instance"]["0"]["stability"]["verdict"] == "unstable"
    assert by_class["per_instance"]["1"]["stability"]["verdict"] == "stable"
    assert by_class["stability"]["verdict"] == "unstable" and by_class["stability"]["unstable_instances"] == [0]
    assert by_class["per_instance"]["0"]["stability"]["capacity_rps"] == pytest.approx(50.0, rel=1e-9)
    assert by_class["per_instance"]["0"]["stability"]["requests"] == 1500
    balanced = runs["balanced"].metrics
    assert balanced["stability"]["verdict"] == "stable" and balanced["stability"]["unstable_instances"] == []
    assert {balanced["per_instance"][k]["stability"]["verdict"] for k in "01"} == {"stable"}


def test_one_overloaded_instance_makes_the_run_unstable_though_the_cluster_queue_barely_grows():
    # instance 0 gets 1,000 arrivals at 1/ms with 1.25 ms of service (load 1.25); instance 1
    # 9,000 at 9/ms that it serves at once: the cluster's queue absorbs 2% of all arrivals
    over = fcfs(np.arange(1000.0), np.full(1000, 1.25))
    fast = (np.arange(9000.0) / 9, np.arange(9000.0) / 9, np.arange(9000.0) / 9 + 0.01)
    req = {"arrival_ms": np.concatenate([over[0], fast[0]]), "first_scheduled_ms": np.concatenate([over[1], fast[1]]),
           "finish_ms": np.concatenate([over[2], fast[2]]), "rejected": np.zeros(10_000, dtype=np.int64),
           "instance": np.repeat([0, 1], [1000, 9000])}
    run, parts = run_stability(req, instances=2)
    assert parts[0]["verdict"] == "unstable" and parts[1]["verdict"] == "stable"
    assert run["growth_share"] < 0.05  # on its own the cluster's queue would pass
    assert run["verdict"] == "unstable" and run["unstable_instances"] == [0]
    assert run["reason"] == f"{parts[0]['reason']} on instance 0"


# -- summary.json, the table, the plots ------------------------------------------------------------------


def test_summary_json_and_the_table_carry_the_verdict(tmp_path, capsys):
    write_requests(tmp_path / "requests.jsonl", np.full(1000, 20))
    (tmp_path / "exp.toml").write_text(MM1)
    assert main(["run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out")]) == 0
    table = capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    runs = {r["name"]: r["metrics"]["stability"] for r in summary["studies"][0]["runs"]}
    assert runs["mm1[rate=40]"]["verdict"] == "stable"
    unstable = runs["mm1[rate=60]"]
    assert unstable["verdict"] == "unstable" and unstable["capacity_rps"] == pytest.approx(50.0)
    assert set(unstable) >= {"reason", "arrival_rps", "capacity_rps", "load", "saturated_share",
                             "waiting_slope_per_min", "growth_share", "growth", "noise", "window_ms", "fit"}
    rows = {line.split()[0]: line.split() for line in table.splitlines()[3:5]}
    assert rows["mm1[rate=60]"][1] == "!" and rows["mm1[rate=40]"][1] != "!"
    per_min = f"{float(format(unstable['waiting_slope_per_min'], '.2g')):,.0f}"
    assert (f"! mm1[rate=60]: unstable: waiting grows {per_min} requests/min (arrivals "
            f"{unstable['arrival_rps']:.3g}/s, capacity 50/s)") in table.splitlines()
    # saved and read back, the plots still know which runs to mark
    saved = load_results(tmp_path / "out")
    assert [r.metrics["stability"]["verdict"] for r in saved.all_runs()] == ["stable", "unstable"]


def fake_run(name: str, verdict: str | None) -> RunResult:
    stability = {"verdict": verdict, "reason": "waiting grows 35 requests/min", "arrival_rps": 12.0,
                 "capacity_rps": 9.6, "fit": {"start_ms": 0.0, "end_ms": 60_000.0, "waiting_at_start": -5.0,
                                               "waiting_at_end": 30.0}}
    metrics = {"finished": 10, "requests": 10, "ttft_ms": {"p99": 5.0}, "num_preemptions": 0,
               "kv_usage": {"peak": 0.5, "time_above_90": 0.0}}
    if verdict is not None:
        metrics["stability"] = stability
    n = 10
    requests = {"arrival_ms": np.arange(n) * 6000.0, "first_scheduled_ms": np.arange(n) * 6000.0 + 1,
                "first_token_ms": np.arange(n) * 6000.0 + 2, "finish_ms": np.arange(n) * 6000.0 + 3,
                "generated_tokens": np.full(n, 2), "rejected": np.zeros(n, dtype=np.int64),
                "instance": np.zeros(n, dtype=np.int64)}
    timeline = {"time_ms": np.arange(n) * 6000.0, "instance": np.zeros(n), "running": np.ones(n),
                "waiting": np.arange(n) * 3.0, "kv_used": np.ones(n), "preemptions": np.zeros(n)}
    return RunResult(name, {}, requests, {}, {}, timeline, {}, {"num_blocks": 10, "instances": 1}, metrics)


def test_table_marks_unstable_and_inconclusive_runs_and_explains_them():
    runs = [fake_run("calm", "stable"), fake_run("hot", "unstable"), fake_run("warm", "inconclusive"),
            fake_run("old", None)]
    results = ExperimentResults("e", "", [Study(r.name, "run", [r]) for r in runs], {})
    lines = render(results, ("finished",)).splitlines()
    names = [line.split()[0:2] for line in lines[3:7]]
    assert names == [["calm", "10"], ["hot", "!"], ["warm", "?"], ["old", "10"]]
    assert lines[7:] == ["! hot: unstable: waiting grows 35 requests/min (arrivals 12/s, capacity 9.6/s)",
                         "? warm: inconclusive: waiting grows 35 requests/min (arrivals 12/s, capacity 9.6/s)"]


def test_plots_mark_overloaded_runs():
    calm, hot = fake_run("calm", "stable"), fake_run("hot", "unstable")
    fig = compare_figure([calm, hot], ["ttft_ms.p99"], 60)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["calm", "hot (unstable)"]
    bars = {p.get_gid(): p for p in ax.patches}
    assert bars["bar:ttft_ms.p99:hot"].get_hatch() == "//" and not bars["bar:ttft_ms.p99:calm"].get_hatch()
    labels = [line.get_label() for line in latency_cdf_figure([calm, hot], "t", 60).axes[0].get_lines()
              if (line.get_gid() or "").startswith("cdf:")]
    assert labels == ["calm", "hot (unstable)"]
    fig = timeline_figure(hot, 60)
    trend = next(line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "trend:run")
    # the fitted line, from where it crosses 0 (t = 5/35 of the window) to the last arrival
    assert list(trend.get_xdata()) == pytest.approx([60 * 5 / 35, 60.0])
    assert list(trend.get_ydata()) == pytest.approx([0.0, 30.0])
    assert "unstable: waiting grows 35 requests/min" in fig._suptitle.get_text()
    assert not any(line.get_gid() == "trend:run" for ax in timeline_figure(calm, 60).axes for line in ax.get_lines())


def test_a_growth_past_a_billion_per_minute_is_written_in_scientific_notation():
    """A rate of 1e300 requests/s printed its queue's growth as a 300-digit number (fuzz review)."""
    assert [_per_min(v) for v in (2.61, 83.2, 694.0, 29_512.0, 3.04e22)] == ["2.6", "83", "690", "30,000", "3e+22"]


def test_a_streamed_runs_verdict_reports_the_runs_rates_not_its_samples(tmp_path, monkeypatch):
    """Metrics review s79: past exact_requests the check ran on the uniform sample of rows as if it were the run:
    a 15 req/s run of 40,000 requests read 'arrivals 7.5/s, capacity 7.06/s'. The sample's counts and rates are
    reported at the run's scale now (here a 2,000-row sample of 8,000 requests), its verdict the sample's."""
    from schedlab.results import stream
    from schedlab.study.experiment import load, run_experiment

    monkeypatch.setattr(stream, "SAMPLE_ROWS", 2000)
    def stability(exact_requests: int) -> dict:
        path = tmp_path / f"s{exact_requests}.toml"
        path.write_text(
            f'[experiment]\nname = "s"\ntimeline = false\nexact_requests = {exact_requests}\n[workload]\n'
            'kind = "synthetic"\nnum_requests = 8000\nrate = 15\nprompt = {dist = "uniform", low = 20, high = 800}\n'
            'output = {dist = "uniform", low = 1, high = 200}\n[cost_model]\nkind = "linear"\n[scheduler]\n'
            'kind = "continuous"\nmax_num_seqs = 16\n')
        (run,) = run_experiment(load(path)).all_runs()
        return run.metrics["stability"]

    streamed, exact = stability(0), stability(100_000)
    assert streamed["from_sample"] == 2000 and "from_sample" not in exact
    assert streamed["requests"] == exact["requests"] == 8000
    assert streamed["arrival_rps"] == pytest.approx(exact["arrival_rps"], rel=0.05)
    assert exact["arrival_rps"] == pytest.approx(15.0, rel=0.05)
    assert streamed["capacity_rps"] == pytest.approx(exact["capacity_rps"], rel=0.15)
    assert streamed["waiting_slope_per_min"] == pytest.approx(exact["waiting_slope_per_min"], rel=0.25)
    assert f"arrivals {streamed['arrival_rps']:.3g}/s" in stability_text(streamed)
