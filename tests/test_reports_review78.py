"""Fixes for review s78 (reports): trace spans of aborted requests, the table footer of replicated
runs, replicated timelines / CDFs, clipped text, and the measured timeline."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from schedlab.study.experiment import load, run_experiment



def synthetic_experiment(name: str, requests: int, rate: float, *, seqs: int | None = None, seed: int | None = None,
                         timeline: bool = True, prompt: tuple = (200, 800), output: tuple = (20, 80),
                         tables: str = "", runs: str) -> str:
    """An experiment of uniform synthetic requests on the linear cost model (the ``continuous``
    scheduler with ``seqs`` slots, when given), with more ``tables`` and its ``runs``."""
    return (f'[experiment]\nname = "{name}"\n' + (f"seed = {seed}\n" if seed is not None else "")
            + ("" if timeline else "timeline = false\n") + 'reports = ["json"]\n\n'
            + f'[workload]\nkind = "synthetic"\nnum_requests = {requests}\nrate = {rate}\n'
            + f'prompt = {{dist = "uniform", low = {prompt[0]}, high = {prompt[1]}}}\n'
            + f'output = {{dist = "uniform", low = {output[0]}, high = {output[1]}}}\n\n'
            + '[cost_model]\nkind = "linear"\n\n'
            + (f'[scheduler]\nkind = "continuous"\nmax_num_seqs = {seqs}\n\n' if seqs is not None else "")
            + tables + runs)


SLO = "[slo]\nttft_ms = 150\ntpot_ms = 12\n\n"


def run_timeouts(folder: Path, n: int, rate: float, seqs: int, timeout: float):
    toml = folder / "e.toml"
    toml.write_text(synthetic_experiment("review78", n, rate, seqs=seqs, seed=5,
                                         tables=f"[client]\ntimeout_ms = {timeout}\n\n",
                                         runs='[[runs]]\nname = "to"\n\n[[runs]]\nname = "rep"\nreplicas = 3\n'))
    return run_experiment(load(toml))



@pytest.fixture(scope="module")
def timeout_results(tmp_path_factory):
    """One request at a time and a 250 ms client timeout: requests aborted never scheduled, and
    scheduled but before their first token."""
    return run_timeouts(tmp_path_factory.mktemp("review78"), n=16, rate=20.0, seqs=1, timeout=250)


@pytest.fixture(scope="module")
def replicated_results(tmp_path_factory):
    """Replicas whose counts differ (28, 28 and 27 timed out)."""
    return run_timeouts(tmp_path_factory.mktemp("review78r"), n=30, rate=10.0, seqs=2, timeout=400)


def run_named(results, name):
    return next(r for r in results.all_runs() if r.name == name)


# -- finding 2: trace spans of requests aborted before their first token -------------------------

def spans_by_request(doc):
    spans: dict[str, list] = {}
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "request" and ev["ph"] in "be":
            spans.setdefault(ev["id"], []).append((ev["ph"], ev["name"], ev["ts"]))
    return spans


def test_trace_of_aborted_requests_has_no_sentinel_spans(timeout_results):
    from schedlab_plugins.reports.trace import trace_events
    run = run_named(timeout_results, "to")
    req = run.requests
    doc = trace_events(run)
    assert all(ev["ts"] >= 0 for ev in doc["traceEvents"] if "ts" in ev)
    spans = spans_by_request(doc)
    instants = {ev["name"]: ev for ev in doc["traceEvents"] if ev["ph"] == "i"}
    never, no_token = 0, 0
    for k in range(len(req["id"])):
        rid = int(req["id"][k])
        arrival, sched = float(req["arrival_ms"][k]), float(req["first_scheduled_ms"][k])
        first, finish = float(req["first_token_ms"][k]), float(req["finish_ms"][k])
        begun = {name: ts for ph, name, ts in spans[f"r{rid}"] if ph == "b"}
        ended = {name: ts for ph, name, ts in spans[f"r{rid}"] if ph == "e"}
        if int(req["aborted"][k]) == 0:
            assert f"aborted {rid}" not in instants
            continue
        assert instants[f"aborted {rid}"]["ts"] == pytest.approx(finish * 1000)
        if first >= 0:  # aborted while decoding: its decode span runs to the abort
            assert begun["decode"] == pytest.approx(first * 1000)
            assert ended["decode"] == pytest.approx(finish * 1000)
            continue
        assert "decode" not in begun
        if sched < 0:
            never += 1
            assert set(begun) == {f"request {rid}", "queued"}
            assert begun["queued"] == pytest.approx(arrival * 1000)
            assert ended["queued"] == pytest.approx(finish * 1000)
        elif first < 0:
            no_token += 1
            assert set(begun) >= {"prefill"}
            assert begun["prefill"] == pytest.approx(sched * 1000)
            assert ended["prefill"] == pytest.approx(finish * 1000)
    assert never >= 1 and no_token >= 1, (never, no_token)  # the run has both kinds


DISAGG_EXPERIMENT = '''
[experiment]
name = "review78d"
seed = 3
reports = ["json"]

[workload]
kind = "synthetic"
num_requests = 40
rate = 40
prompt = {dist = "lognormal", median = 800, sigma = 0.6, high = 4096}
output = {dist = "lognormal", median = 100, sigma = 0.8, high = 512}

[scheduler]
kind = "vllm"
max_num_seqs = 4
async_scheduling = false

[cost_model]
kind = "roofline"
model = "llama-3-8b"
gpu = "a100-80gb"

[kv_cache]
kind = "paged"
model = "llama-3-8b"
gpu = "a100-80gb"

[client]
timeout_ms = 1500

[[runs]]
name = "pd"
[runs.cluster]
mode = "disaggregated"
link = {bandwidth_gbps = 25, latency_us = 10}
'''


def test_disaggregated_trace_of_aborted_requests(tmp_path):
    from schedlab_plugins.reports.trace import trace_events
    toml = tmp_path / "d.toml"
    toml.write_text(DISAGG_EXPERIMENT)
    run = run_experiment(load(toml)).all_runs()[0]
    req = run.requests
    doc = trace_events(run)
    assert all(ev["ts"] >= 0 for ev in doc["traceEvents"] if "ts" in ev)
    spans = spans_by_request(doc)
    checked = 0
    for k in range(len(req["id"])):
        if int(req["aborted"][k]) == 0 or int(req["rejected"][k]):
            continue
        rid = int(req["id"][k])
        finish = float(req["finish_ms"][k])
        # aborted on its prefill instance: one span on it, as any request's
        prefill_side = {name: ts for ph, name, ts in spans.get(f"r{rid}p", spans.get(f"r{rid}")) if ph == "e"}
        decode_side = spans.get(f"r{rid}d", [])
        if float(req["first_token_ms"][k]) < 0:
            assert not any(name == "decode" for _, name, _ in decode_side)
        if float(req["kv_ready_ms"][k]) < 0:  # aborted before the hand-over: the prefill side alone
            checked += 1
            assert decode_side == [] and "decode" not in prefill_side
            assert prefill_side[f"request {rid}"] == pytest.approx(finish * 1000)
            last = "queued" if float(req["first_scheduled_ms"][k]) < 0 else "prefill"
            assert prefill_side[last] == pytest.approx(finish * 1000)
    assert checked >= 1


# -- finding 5: the table's footer for replicated runs ---------------------------------------------

def test_table_footer_formats_replica_mean_counts(replicated_results):
    from schedlab_plugins.reports.table import render
    rep = run_named(replicated_results, "rep")
    assert len(rep.replicas) == 3
    timed_out = [int(x.metrics["timed_out"]) for x in rep.replicas]
    aborted = [int(x.metrics["aborted"]) for x in rep.replicas]

    def by_hand(counts):
        total = sum(counts)
        return str(total // 3) if total % 3 == 0 else f"{total / 3:.1f}"

    line = next(ln for ln in render(replicated_results).splitlines() if ln.startswith("rep: "))
    assert line.startswith(f"rep: {by_hand(timed_out)} requests timed out")
    assert f"; {by_hand(aborted)} of them aborted" in line
    assert "means over 3 replicas" in line
    assert len(set(timed_out)) > 1  # (a mean that is no whole number)
    assert not any(len(num.split(".")[1]) > 1 for num in __import__("re").findall(r"\d+\.\d+", line))
    single = next(ln for ln in render(replicated_results).splitlines() if ln.startswith("to: "))
    assert "replicas" not in single


# -- finding 3: a replicated run's timeline and CDF describe replica 1 throughout -----------------

REPLICATED_EXPERIMENT = '''
[experiment]
name = "review78rep"
seed = 5
reports = ["json"]

[workload]
kind = "mix"
[workload.classes.chat]
kind = "synthetic"
num_requests = 40
rate = 10.0
prompt = {dist = "uniform", low = 200, high = 800}
output = {dist = "uniform", low = 20, high = 80}
[workload.classes.rare]
kind = "synthetic"
num_requests = 1
rate = 1.0
prompt = {dist = "uniform", low = 200, high = 800}
output = {dist = "uniform", low = 1, high = 1}

[cost_model]
kind = "linear"

[scheduler]
kind = "continuous"
max_num_seqs = 4

[frontend]
network_ms = 5

[client]
timeout_ms = 1500

[[runs]]
name = "rep"
replicas = 3
'''


@pytest.fixture(scope="module")
def overloaded_replicas(tmp_path_factory):
    toml = tmp_path_factory.mktemp("review78rep") / "e.toml"
    toml.write_text(REPLICATED_EXPERIMENT)
    return run_named(run_experiment(load(toml)), "rep")


def finished_by_hand(req) -> tuple[int, int]:
    """Completed for their clients: neither rejected nor timed out; out of every row."""
    return int(((req["rejected"] == 0) & (req["timed_out"] == 0)).sum()), int(req["id"].size)


def test_replicated_timeline_describes_replica_one(overloaded_replicas):
    from schedlab_plugins.reports.plot_timeline import timeline_figure
    run = overloaded_replicas
    finished, total = finished_by_hand(run.requests)
    assert run.metrics["finished"] != finished  # the mean over replicas is not replica 1's count
    fig = timeline_figure(run, dpi=50)
    text = fig._suptitle.get_text()
    assert text.startswith("timeline: rep (replica 1 of 3)")
    assert f"finished {finished}/{total}" in text
    own = run.replicas[0].metrics["stability"]
    assert own["verdict"] in ("unstable", "inconclusive")
    trend = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "trend:run"]
    assert len(trend) == 1
    fit = own["fit"]
    x, y = trend[0].get_xdata(), trend[0].get_ydata()
    assert x[-1] == pytest.approx(fit["end_ms"] / 1e3) and y[-1] == pytest.approx(fit["waiting_at_end"])
    # the drawn waiting queue's own trend: it ends near the queue drawn at the end of the arrivals
    waiting = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "timeline:waiting:0"][0]
    assert y[-1] <= float(np.max(waiting.get_ydata())) + 1


def test_replicated_cdf_label_counts_replica_one(overloaded_replicas):
    from schedlab_plugins.reports.plot_cdf import latency_cdf_figure
    run = overloaded_replicas
    finished, total = finished_by_hand(run.requests)
    fig = latency_cdf_figure([run], "cdf", dpi=50)
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines() if (line.get_gid() or "").startswith("cdf:")}
    assert len(labels) == 1
    label = labels.pop()
    assert label.startswith("rep (replica 1 of 3)")
    assert label.endswith(f"({finished}/{total} finished)")


# -- finding 4: subtitles and outside legends fit the figure --------------------------------------

def clipped(fig) -> list[str]:
    """Title and legend text drawn past the figure's left or right edge (cut off in the PNG)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width = fig.bbox.width
    out = []
    texts = ([fig._suptitle] if fig._suptitle is not None else []) + [t for leg in fig.legends for t in leg.get_texts()]
    for text in texts:
        box = text.get_window_extent(renderer)
        if box.x0 < 0 or box.x1 > width:
            out.append(f"{text.get_text()[:40]!r} at x {box.x0:.0f}..{box.x1:.0f} of 0..{width:.0f}")
    return out


SWEEP_EXPERIMENT = '''
[experiment]
name = "review78sweep"
timeline = false
reports = ["json"]

[workload]
kind = "synthetic"
num_requests = 40
rate = 12.0
prompt = {dist = "uniform", low = 100, high = 900}
output = {dist = "uniform", low = 10, high = 60}

[cost_model]
kind = "linear"

[[runs]]
name = "cat"
sweep = { "scheduler.max_num_seqs" = [2, 4, 8, 16, 32, 64], "workload.prompt" = [{dist = "uniform", low = 100, high = 200}, {dist = "uniform", low = 100, high = 900}] }
'''


def test_sweep_subtitle_and_legend_fit_the_figure(tmp_path):
    from schedlab_plugins.reports.plot_config import PlotsConfig
    from schedlab_plugins.reports.plots import plan
    toml = tmp_path / "e.toml"
    toml.write_text(SWEEP_EXPERIMENT)
    results = run_experiment(load(toml))
    config = PlotsConfig(mark_last_zero="num_preemptions", sweep_metrics=("ttft_ms.p99", "num_preemptions"))
    figures = {item.filename: item.draw for item in plan(results, config)}
    fig = figures["sweep_cat.png"]()
    assert clipped(fig) == []
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    # every line of the sweep keeps its legend entry, whole
    for prompt in ("prompt={dist=uniform,low=100,high=200}", "prompt={dist=uniform,low=100,high=900}"):
        assert prompt in labels
    assert "max_num_seqs" in fig._suptitle.get_text()


def test_replicated_timeline_subtitle_fits(overloaded_replicas):
    from schedlab_plugins.reports.plot_timeline import timeline_figure
    fig = timeline_figure(overloaded_replicas, dpi=100)
    assert clipped(fig) == []
    # the stability line is all there, only wrapped
    from schedlab.results.stability import stability_text
    words = stability_text(overloaded_replicas.replicas[0].metrics["stability"]).split()
    assert fig._suptitle.get_text().split()[-len(words):] == words


def test_one_study_crossover_subtitle_fits(tmp_path):
    import schedlab_plugins.reports.crossover as co
    toml = tmp_path / "e.toml"
    toml.write_text(synthetic_experiment(
        "review78x", 30, 2.0, seqs=8, seed=4, timeline=False, tables=SLO,
        runs='[[runs]]\nname = "one"\nsweep = { "workload.rate" = [2.0, 8.0] }\n\n'
             '[[runs]]\nname = "two"\ncluster = { instances = 2 }\nsweep = { "workload.rate" = [2.0, 8.0] }\n'))
    results = run_experiment(load(toml))
    config = co.CrossoverConfig(baseline="one", load="workload.rate", metric="slo.attainment", better="higher")
    fig = co.figure(co.compare(results, config), config, "crossover: review78x")
    assert clipped(fig) == []
    assert fig.get_figwidth() >= 7.0


# -- finding 1: measured_timeline.png draws each simulated run's whole cluster --------------------

LOGGED_EXPERIMENT = '''
[experiment]
name = "review78log"
reports = ["request_log"]
seed = 3

[workload]
kind = "synthetic"
num_requests = 40
rate = 3.0
prompt = {dist = "lognormal", median = 300, sigma = 0.6, high = 2000}
output = {dist = "lognormal", median = 60, sigma = 0.6, high = 300}

[cost_model]
kind = "linear"

[scheduler]
kind = "continuous"
max_num_seqs = 8

[[runs]]
name = "single"
'''

REPLAY_EXPERIMENT = '''
[experiment]
name = "review78replay"
reports = ["json"]

[workload]
kind = "vllm_log"
path = "LOG"

[cost_model]
kind = "linear"

[scheduler]
kind = "continuous"
max_num_seqs = 8

[[runs]]
name = "same"

[[runs]]
name = "two"
cluster = { instances = 2, router = { kind = "least_outstanding" } }
'''


def test_measured_timeline_draws_cluster_totals_and_an_exact_replay_matches(tmp_path):
    from schedlab.cli import main
    from schedlab_plugins.reports.measured import CompareReport
    (tmp_path / "log.toml").write_text(LOGGED_EXPERIMENT)
    assert main(["run", str(tmp_path / "log.toml"), "--out", str(tmp_path / "log"), "--no-plots", "--jobs", "1"]) == 0
    log = tmp_path / "log" / "logs" / "single.jsonl"
    (tmp_path / "replay.toml").write_text(REPLAY_EXPERIMENT.replace("LOG", str(log)))
    results = run_experiment(load(tmp_path / "replay.toml"))
    runs = results.all_runs()
    two = run_named(results, "two")
    fig = CompareReport()._timeline(runs)
    lines = {(ax.get_title().split()[0], line.get_label()): line for ax in fig.axes for line in ax.get_lines()}
    measured = {ax.get_title().split()[0]: next(l for l in ax.get_lines() if l.get_label() == "measured")
                for ax in fig.axes}
    times_ms = measured["running"].get_xdata() * 1e3
    for i, run in enumerate(runs):
        req = run.requests
        # by hand from the run's rows: every instance's requests scheduled and not finished, and
        # those arrived and not yet scheduled (none is rejected or aborted here)
        assert not req["rejected"].any()
        t = times_ms[:, None]
        running = ((req["first_scheduled_ms"] <= t) & (t < req["finish_ms"])).sum(axis=1)
        waiting = ((req["arrival_ms"] <= t) & (t < req["first_scheduled_ms"])).sum(axis=1)
        drawn_running = lines["running", run.name]
        np.testing.assert_array_equal(drawn_running.get_xdata(), measured["running"].get_xdata())
        np.testing.assert_array_equal(drawn_running.get_ydata(), running)
        np.testing.assert_array_equal(lines["waiting", run.name].get_ydata(), waiting)
    assert set(two.requests["instance"].tolist()) == {0, 1}
    # the exact replay (one instance, as logged) draws the measured curves themselves, idle gaps included
    for column in ("running", "waiting"):
        np.testing.assert_allclose(lines[column, "same"].get_ydata(), measured[column].get_ydata())
    assert (measured["running"].get_ydata() == 0).any()  # the engine was idle at some sampled time


# -- finding 10: crossover.csv says "none" for a sweep with nothing to compare ---------------------

def test_crossover_without_comparable_values_is_no_data(tmp_path):
    import csv
    import io

    import schedlab_plugins.reports.crossover as co
    toml = tmp_path / "e.toml"
    toml.write_text(synthetic_experiment(
        "review78none", 8, 2.0, timeline=False, prompt=(300, 400), output=(5, 10),
        runs='[[runs]]\nname = "good"\nsweep = { "workload.rate" = [1.0, 4.0] }\n\n'
             '[[runs]]\nname = "bad"\nkv_cache = { num_blocks = 4 }\nsweep = { "workload.rate" = [1.0, 4.0] }\n'))
    results = run_experiment(load(toml))
    bad = next(s for s in results.studies if s.name == "bad")
    assert all(run.metrics["rejected"] == run.metrics["requests"] for run in bad.runs)  # nothing finished
    config = co.CrossoverConfig(baseline="good", load="workload.rate", metric="ttft_ms.p99")
    lines = co.compare(results, config)
    rows = list(csv.DictReader(io.StringIO(co.to_csv(lines, config))))
    assert [(row["study"], row["crossover"], row["side"]) for row in rows] == [("bad", "", "none")]
    assert co.crossover_load((), (), "lower") == (None, "none")
    assert co.crossover_load((1.0, 2.0), (1.1, 0.9), "lower") == (None, "below")  # (unchanged)
    assert "no values" in co.render(lines, config)


# -- finding 8: fleet.png draws the partial last hour per hour of its length ----------------------

def test_fleet_last_partial_hour_is_drawn_per_hour_of_its_length(tmp_path):
    from schedlab_plugins.reports.fleet import fleet_figure, fleet_runs
    toml = tmp_path / "e.toml"
    toml.write_text(synthetic_experiment(
        "review78fleet", 500, 0.06, seed=2, tables="[slo]\nttft_ms = 60\ntpot_ms = 9\n\n",
        runs='[[runs]]\nname = "fixed"\ncluster = { instances = 2 }\n'))
    results = run_experiment(load(toml))
    runs = fleet_runs(results)
    run = runs[0]
    req = run.requests
    hour = 3.6e6
    last = int(req["arrival_ms"].max() // hour)
    assert last == 2
    end = float(req["finish_ms"].max())  # the last request done (a fixed cluster: paid up to it)
    part_s = (end - last * hour) / 1e3
    assert 0 < part_s < 3600
    arrivals = int((req["arrival_ms"] >= last * hour).sum())
    fig = fleet_figure(runs, dpi=50)
    drawn = {ax.get_ylabel().split("\n")[0]: ax.get_lines()[0] for ax in fig.axes if ax.get_lines()}
    rate, gpus = drawn["arrivals / s"], drawn["GPUs paid for"]
    # the last step starts at hour 2 and ends where the work ended
    assert rate.get_xdata()[-2] == 2 and rate.get_xdata()[-1] == pytest.approx(2 + part_s / 3600, rel=1e-6)
    assert rate.get_ydata()[-2] == pytest.approx(arrivals / part_s, rel=1e-6)
    assert gpus.get_ydata()[-2] == pytest.approx(2.0, rel=1e-6)  # 2 instances paid throughout
    assert list(gpus.get_ydata()[:2]) == pytest.approx([2.0, 2.0])


# -- finding 9: compare.png's overload hatch shows on a best bar ----------------------------------

def test_compare_best_inconclusive_bar_hatch_is_visible(overloaded_replicas):
    from matplotlib.colors import to_rgb

    from schedlab_plugins.reports.plot_compare import compare_figure
    run = overloaded_replicas
    assert run.metrics["stability"]["verdict"] == "inconclusive"
    fig = compare_figure([run], ["ttft_ms.p99"], 50, best="ttft_ms.p99", best_is="lowest")
    bar = next(p for ax in fig.axes for p in ax.patches if p.get_gid() == "best:ttft_ms.p99:rep")
    assert bar.get_hatch() == "//"
    fill = np.array(to_rgb(bar.get_facecolor()))
    for color in (bar.get_edgecolor(), bar.get_hatchcolor()):
        assert np.abs(np.array(to_rgb(color)) - fill).max() > 0.3  # a colour apart from the fill


# -- finding 7: goodput.png's extra panels: a log y axis only over a decade or more ---------------

def test_goodput_extra_panel_is_linear_over_a_narrow_range(tmp_path):
    import schedlab_plugins.reports.goodput as gp
    toml = tmp_path / "e.toml"
    toml.write_text(synthetic_experiment(
        "review78goodput", 60, 2.0, seqs=8, seed=4, timeline=False, tables=SLO,
        runs='[[runs]]\nname = "one"\nsweep = { "workload.rate" = [2.0, 4.0, 8.0, 16.0] }\n'))
    results = run_experiment(load(toml))
    # TPOT p90 by hand from each run's rows: (finish - first token) / (generated - 1), numpy's
    # linear percentile over the requests with more than one token
    tpots = []
    for run in results.all_runs():
        req = run.requests
        ok = (req["rejected"] == 0) & (req["generated_tokens"] > 1)
        tpot = (req["finish_ms"][ok] - req["first_token_ms"][ok]) / (req["generated_tokens"][ok] - 1)
        tpots.append(float(np.percentile(tpot, 90)))
    assert 1 < max(tpots) / min(tpots) < 10  # less than a decade
    config = gp.GoodputConfig(metrics=("tpot_ms.p90",))
    fig = gp.figure(gp.systems(results, config), config)
    panel = next(ax for ax in fig.axes if ax.get_title().endswith("tpot_ms.p90"))
    assert sorted(panel.get_lines()[0].get_ydata()) == pytest.approx(sorted(tpots))
    assert panel.get_yscale() == "linear"


def test_an_outside_legend_too_wide_for_one_column_wraps_its_labels():
    from matplotlib.lines import Line2D

    from schedlab_plugins.reports.plot_common import new_figure, outside_legend, titles
    fig = new_figure(4.0, 3.0, 100)
    fig.subplots(1, 1)
    labels = ["a short one", "a very long legend label " * 6]
    handles = [Line2D([], [], color="C0"), Line2D([], [], color="C1")]
    legend = outside_legend(fig, handles, labels, 6)
    titles(fig, "title", "a long subtitle of many words " * 8)
    assert clipped(fig) == []
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[0] == "a short one"
    assert texts[1].replace("\n", " ").split() == labels[1].split()  # every word, only wrapped
    assert "\n" in texts[1]
