"""The ``plots`` report: files written by ``schedlab run`` and ``schedlab plot``, and what they draw."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from schedlab.cli import main
from schedlab.configs import from_table
from schedlab.errors import ConfigError
from schedlab.results import ExperimentResults, RunResult, Study
from schedlab.results.storage import load as load_results
from schedlab.study.experiment import load, run_experiment
from schedlab.study.search import Probe, SearchOutcome
from schedlab_plugins.reports.plot_cdf import MAX_CDF_POINTS, cdf_points, latency_cdf_figure
from schedlab_plugins.reports.plot_common import metric_label, metric_unit, setting_label
from schedlab_plugins.reports.plot_search import search_figure
from schedlab_plugins.reports.plot_sweep import sweep_figure
from schedlab_plugins.reports.plot_timeline import timeline_figure
from schedlab_plugins.reports.plots import PlotsConfig, PlotsReport, plan, safe_stem, timeline_runs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DPI = PlotsConfig().dpi

ROUTER_MODULE = '''
import schedlab

class AlternateRouter:
    def __init__(self, config=None):
        pass

    def route(self, request, instances):
        return request.id % len(instances)

@schedlab.hookimpl
def schedlab_register_routers(register):
    register("plots_test_alternate", AlternateRouter, help="request id modulo the instance count")
'''

EXPERIMENT = '''
[experiment]
name = "plots-test"
plugins = ["plots_test_router"]
reports = ["json", "plots"]

[workload]
kind = "file"
path = "requests.json"
arrival = "poisson"
rate = 40

[cost_model]
kind = "linear"

[scheduler]
kind = "continuous"
max_num_seqs = 8
allocation = "grow"

[kv_cache]
kind = "paged"
num_blocks = 40

[[runs]]
name = "static"
scheduler = { kind = "static", batch_size = 4 }

[[runs]]
name = "pair"
cluster = { instances = 2, router = { kind = "plots_test_alternate" } }

[[runs]]
name = "rates"
sweep = { "workload.rate" = [20, 80], "scheduler.max_num_seqs" = [4, 8] }

[[runs]]
name = "probe"
workload = { kind = "closed_loop", path = "requests.json", num_requests = 30 }
search = { key = "workload.clients", low = 1, high = 16, constraint = "ttft_ms.p99 <= 60" }
'''


def _requests(n: int) -> list[dict]:
    return [{"prompt_tokens": 40 + (i * 37) % 200, "output_tokens": 5 + (i * 53) % 60} for i in range(n)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The experiment above, run once through ``schedlab run``; plus the same results fresh."""
    root = tmp_path_factory.mktemp("plots_lab")
    (root / "requests.json").write_text(json.dumps({"requests": _requests(40)}))
    (root / "plots_test_router.py").write_text(ROUTER_MODULE)
    toml = root / "exp.toml"
    toml.write_text(EXPERIMENT)
    out = root / "out"
    sys.path.insert(0, str(root))
    try:
        assert main(["run", str(toml), "--out", str(out)]) == 0
        fresh = run_experiment(load(toml))
    finally:
        sys.path.remove(str(root))
    return {"root": root, "out": out, "fresh": fresh}


def _search_study(results):
    return results.study("probe")


def expected_files(results) -> set[str]:
    outcome = _search_study(results).search
    assert outcome.status == "found"  # the experiment is set up so the search finds a boundary
    return {
        "latency_cdf.png",
        "latency_cdf_rates.png", "sweep_rates.png",
        "search_probe.png",
        "timeline_static.png", "timeline_pair.png",
        f"timeline_probe_clients_{outcome.value}.png", f"timeline_probe_clients_{outcome.failing}.png",
        "timeline_rates_rate_20_max_num_seqs_4.png", "timeline_rates_rate_20_max_num_seqs_8.png",
        "timeline_rates_rate_80_max_num_seqs_4.png", "timeline_rates_rate_80_max_num_seqs_8.png",
    }


def _png_names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# -- files --------------------------------------------------------------------------------------------


def test_run_writes_the_expected_valid_pngs(lab):
    folder = lab["out"] / "plots"
    assert _png_names(folder) == expected_files(lab["fresh"])
    for path in folder.iterdir():
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE, path.name
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[2] in (3, 4), path.name
        assert 300 <= image.shape[0] <= 2000 and 500 <= image.shape[1] <= 2000, (path.name, image.shape)
        assert image[..., :3].std() > 0.01, f"{path.name} is blank"
    # figure sizes in inches times 110 dpi: CDF 13 x 4.4, timeline 10 x 7.6
    assert matplotlib.image.imread(folder / "latency_cdf.png").shape[:2] == (484, 1430)
    assert matplotlib.image.imread(folder / "timeline_static.png").shape[:2] == (836, 1100)


def test_plot_command_redraws_the_same_files(lab, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(lab["out"], copy)
    shutil.rmtree(copy / "plots")
    assert main(["plot", str(copy)]) == 0
    assert _png_names(copy / "plots") == _png_names(lab["out"] / "plots")
    for name in _png_names(copy / "plots"):  # same data, same pixels
        assert (copy / "plots" / name).read_bytes() == (lab["out"] / "plots" / name).read_bytes(), name


def _figure_data(fig) -> list[tuple]:
    """Every line of every axes: (axes index, gid, label, x, y); plus the figure title."""
    out = [("title", fig._suptitle.get_text() if fig._suptitle else "")]
    for k, ax in enumerate(fig.axes):
        out.append((k, "axes", ax.get_title(), ax.get_xlabel(), ax.get_ylabel()))
        for line in ax.get_lines():
            out.append((k, line.get_gid(), line.get_label(), np.asarray(line.get_xdata(), dtype=float),
                        np.asarray(line.get_ydata(), dtype=float)))
    return out


def test_fresh_and_reloaded_results_plot_the_same_data(lab):
    fresh = plan(lab["fresh"])
    loaded = plan(load_results(lab["out"]))
    assert [p.filename for p in fresh] == [p.filename for p in loaded]
    assert {p.filename for p in fresh} == expected_files(lab["fresh"])
    kinds = set()
    for a, b in zip(fresh, loaded):
        da, db = _figure_data(a.draw()), _figure_data(b.draw())
        assert len(da) == len(db), a.filename
        lines = 0
        for x, y in zip(da, db):
            assert len(x) == len(y)
            for u, v in zip(x, y):
                if isinstance(u, np.ndarray):
                    np.testing.assert_array_equal(u, v, err_msg=a.filename)
                    lines += 1
                else:
                    assert u == v, a.filename
        assert lines > 0, f"{a.filename} draws no line"
        kinds.add(a.filename.split("_")[0])
    assert kinds == {"latency", "sweep", "search", "timeline"}


# -- what the figures show (experiment results) --------------------------------------------------------


def _lines(fig, prefix: str) -> dict[str, object]:
    return {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()
            if (line.get_gid() or "").startswith(prefix)}


def test_cdf_lines_are_the_finished_requests_latencies(lab):
    results = lab["fresh"]
    runs = [results.study("static").runs[0], results.study("pair").runs[0]]
    fig = latency_cdf_figure(runs, "t", DPI)
    lines = _lines(fig, "cdf:")
    assert set(lines) == {f"cdf:{m}:{i}" for m in ("ttft_ms", "tpot_ms", "e2e_ms") for i in (0, 1)}
    for i, run in enumerate(runs):
        r = run.requests
        ok = r["rejected"] == 0
        ttft = np.sort(r["first_token_ms"][ok] - r["arrival_ms"][ok])
        n = ttft.size
        line = lines[f"cdf:ttft_ms:{i}"]
        np.testing.assert_array_equal(line.get_xdata(), np.concatenate(([ttft[0]], ttft)))
        np.testing.assert_allclose(line.get_ydata(), np.arange(n + 1) / n)
        # an overloaded run says so in the legend (40 requests at 40/s overload static batches of 4)
        verdict = run.metrics["stability"]["verdict"]
        suffix = {"unstable": " (unstable)", "inconclusive": " (inconclusive)"}.get(verdict, "")
        assert line.get_label() == run.name + suffix and line.get_drawstyle() == "steps-post"
    assert lines["cdf:ttft_ms:0"].get_label() == "static (unstable)"


def test_timeline_has_a_line_per_instance_and_kv_as_a_fraction(lab):
    run = lab["fresh"].study("pair").runs[0]
    fig = timeline_figure(run, DPI)
    lines = _lines(fig, "timeline:")
    assert {"timeline:running:0", "timeline:running:1", "timeline:waiting:0", "timeline:waiting:1",
            "timeline:kv_used:0", "timeline:kv_used:1"} <= set(lines)
    t = run.timeline
    sel = t["instance"] == 1
    kv = lines["timeline:kv_used:1"]
    n = int(sel.sum())
    blocks_per_instance = 40  # [kv_cache] num_blocks is per instance
    np.testing.assert_allclose(kv.get_xdata()[:n], t["time_ms"][sel] / 1000)
    np.testing.assert_allclose(kv.get_ydata()[:n], t["kv_used"][sel] / blocks_per_instance)
    assert kv.get_drawstyle() == "steps-post"
    if run.metrics["num_preemptions"] > 0:
        pre = lines["timeline:preemptions"]
        assert pre.get_ydata()[-1] == run.metrics["num_preemptions"]
    title = fig._suptitle.get_text()
    assert "timeline: pair" in title and f"preemptions {run.metrics['num_preemptions']}" in title


def test_sweep_figure_has_a_line_per_second_key_value(lab):
    study = lab["fresh"].study("rates")
    fig = sweep_figure(study, ("ttft_ms.p99", "no_such.metric", "throughput_tps"), DPI)
    titled = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in titled] == ["ttft_ms.p99", "throughput_tps"]
    ax = titled[0]
    assert ax.get_xlabel() == "workload.rate (requests/s)" and ax.get_ylabel() == "TTFT p99 (ms)"
    assert titled[1].get_ylabel() == "throughput (tokens/s)"
    by_label = {line.get_label(): line for line in ax.get_lines() if line.get_gid().startswith("sweep:")}
    assert set(by_label) == {"max_num_seqs=4", "max_num_seqs=8"}
    for seqs in (4, 8):
        runs = [study.runs[0 if seqs == 4 else 1], study.runs[2 if seqs == 4 else 3]]  # grid order: rate, then seqs
        assert [r.point for r in runs] == [{"workload.rate": 20, "scheduler.max_num_seqs": seqs},
                                           {"workload.rate": 80, "scheduler.max_num_seqs": seqs}]
        line = by_label[f"max_num_seqs={seqs}"]
        np.testing.assert_array_equal(line.get_xdata(), [20.0, 80.0])
        np.testing.assert_array_equal(line.get_ydata(), [r.metrics["ttft_ms"]["p99"] for r in runs])


def test_sweep_figure_rings_the_overloaded_points_and_names_them(lab):
    study = lab["fresh"].study("rates")
    verdicts = {(r.point["workload.rate"], r.point["scheduler.max_num_seqs"]): r.metrics["stability"]["verdict"]
                for r in study.runs}
    # 40 blocks of KV cache cannot keep up with 80 requests/s
    assert verdicts[(80, 4)] == verdicts[(80, 8)] == "unstable"
    fig = sweep_figure(study, ("ttft_ms.p99",), DPI)
    ax = fig.axes[0]
    rings = {line.get_gid(): line for line in ax.get_lines() if line.get_gid().split(":")[0] in
             ("unstable", "inconclusive")}
    drawn = set()
    for gid, ring in rings.items():
        verdict, _, i = gid.split(":")
        seqs = (4, 8)[int(i)]
        for x, y in zip(ring.get_xdata(), ring.get_ydata()):
            run = next(r for r in study.runs if r.point == {"workload.rate": int(x), "scheduler.max_num_seqs": seqs})
            assert run.metrics["stability"]["verdict"] == verdict and y == run.metrics["ttft_ms"]["p99"]
            drawn.add((int(x), seqs))
    assert drawn == {k for k, v in verdicts.items() if v in ("unstable", "inconclusive")}
    assert "unstable (waiting grows): " in fig._suptitle.get_text()
    assert "rate=80,max_num_seqs=4" in fig._suptitle.get_text().split("unstable (waiting grows): ")[1]


def test_search_figure_marks_the_chosen_value_and_the_threshold(lab):
    for results in (lab["fresh"], load_results(lab["out"])):
        study = _search_study(results)
        fig = search_figure(study, DPI)
        lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
        threshold = lines["threshold"]
        assert list(threshold.get_ydata()) == [60.0, 60.0]
        chosen = lines["chosen"]
        value = study.search.value
        assert list(chosen.get_xdata()) == [value, value]
        run = next(p.payload for p in study.search.probes if p.value == value)
        star = lines["chosen:probe"]
        assert (star.get_xdata()[0], star.get_ydata()[0]) == (value, run.metrics["ttft_ms"]["p99"])
        passing = [p for p in study.search.probes if p.holds]
        failing = [p for p in study.search.probes if not p.holds]
        np.testing.assert_array_equal(lines["search:passes"].get_xdata(), [p.value for p in passing])
        np.testing.assert_array_equal(lines["search:passes"].get_ydata(),
                                      [p.payload.metrics["ttft_ms"]["p99"] for p in passing])
        np.testing.assert_array_equal(lines["search:fails"].get_xdata(), [p.value for p in failing])
        assert all(p.payload.metrics["ttft_ms"]["p99"] <= 60 for p in passing)
        # (the title wraps a long message: a caveat on the 30-request probes' p99 makes it one)
        assert " ".join(study.search.message.split()) in " ".join(fig._suptitle.get_text().split())
        assert fig.axes[0].get_xlabel() == "workload.clients"
        assert fig.axes[0].get_ylabel() == "TTFT p99 (ms)"


# -- edge cases: rejections, nothing finished, no timeline ---------------------------------------------


def test_rejections_no_finished_requests_and_no_timeline(tmp_path):
    (tmp_path / "requests.json").write_text(json.dumps({"requests": [
        {"prompt_tokens": 20, "output_tokens": 4}, {"prompt_tokens": 500, "output_tokens": 4},
        {"prompt_tokens": 30, "output_tokens": 1}, {"prompt_tokens": 600, "output_tokens": 2}]}))
    (tmp_path / "exp.toml").write_text('''
[experiment]
name = "edge"
timeline = false
reports = ["json", "plots"]
[workload]
kind = "file"
path = "requests.json"
arrival = "all-at-once"
[scheduler]
kind = "continuous"
[kv_cache]
kind = "paged"
num_blocks = 4
[[runs]]
name = "some"
[[runs]]
name = "none"
kv_cache = { kind = "paged", num_blocks = 1, block_size = 1 }
''')
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "exp.toml"), "--out", str(out)]) == 0
    assert _png_names(out / "plots") == {"latency_cdf.png"}
    results = load_results(out)
    some, none = results.study("some").runs[0], results.study("none").runs[0]
    assert (some.metrics["finished"], some.metrics["rejected"]) == (2, 2)
    assert none.metrics["finished"] == 0 and math.isnan(none.metrics["ttft_ms"]["p99"])
    fig = latency_cdf_figure([some, none], "edge", DPI)
    lines = _lines(fig, "cdf:")
    # "some": both finished requests have TTFT and e2e; only the 4-token one has a TPOT
    assert set(lines) == {"cdf:ttft_ms:0", "cdf:tpot_ms:0", "cdf:e2e_ms:0"}
    assert lines["cdf:ttft_ms:0"].get_label() == "some (2/4 finished)"
    assert lines["cdf:tpot_ms:0"].get_ydata().tolist() == [0.0, 1.0]
    assert "no finished requests: none (0/4 finished)" in fig._suptitle.get_text()
    shutil.rmtree(out / "plots")
    assert main(["plot", str(out)]) == 0
    assert _png_names(out / "plots") == {"latency_cdf.png"}


# -- synthetic results: exact expectations -------------------------------------------------------------


def make_run(name, *, arrival, first, finish, generated, rejected=None, instance=None, timeline=None,
             metrics=None, meta=None, point=None) -> RunResult:
    n = len(arrival)
    requests = {
        "id": np.arange(n, dtype=np.int64),
        "arrival_ms": np.asarray(arrival, dtype=float),
        "first_scheduled_ms": np.asarray(arrival, dtype=float),
        "first_token_ms": np.asarray(first, dtype=float),
        "finish_ms": np.asarray(finish, dtype=float),
        "waiting_ms": np.zeros(n),
        "generated_tokens": np.asarray(generated, dtype=np.int64),
        "rejected": np.asarray(rejected if rejected is not None else [0] * n, dtype=np.int64),
        "instance": np.asarray(instance if instance is not None else [0] * n, dtype=np.int64),
    }
    empty = {c: np.empty(0) for c in ("time_ms", "instance", "running", "waiting", "kv_used", "preemptions")}
    tl = {k: np.asarray(v, dtype=float) for k, v in (timeline or empty).items()}
    base_metrics = {"requests": n, "finished": int(n - requests["rejected"].sum()), "num_preemptions": 0,
                    "kv_usage": {"peak": 0.5, "time_above_90": 0.0}}
    return RunResult(name, {}, requests, {}, {}, tl, {}, dict(meta or {"num_blocks": 40, "instances": 1}),
                     {**base_metrics, **(metrics or {})}, dict(point or {}))


def test_cdf_points_by_hand():
    x, y = cdf_points(np.array([30.0, 10.0, 20.0, np.nan]))
    assert x.tolist() == [10.0, 10.0, 20.0, 30.0]
    np.testing.assert_allclose(y, [0, 1 / 3, 2 / 3, 1])
    x, y = cdf_points(np.empty(0))
    assert x.size == 0 and y.size == 0


def test_cdf_of_many_requests_is_thinned_but_keeps_both_ends():
    values = np.arange(10_000, dtype=float)[::-1]
    x, y = cdf_points(values)
    assert x.size <= MAX_CDF_POINTS + 1
    assert (x[0], y[0]) == (0.0, 0.0) and (x[1], y[1]) == (0.0, 1e-4) and (x[-1], y[-1]) == (9999.0, 1.0)
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)


def test_cdf_figure_skips_rejected_requests_exactly():
    run = make_run("r", arrival=[0, 0, 0, 5], first=[10, 30, 20, -1], finish=[50, 90, 20, -1],
                   generated=[5, 4, 1, 0], rejected=[0, 0, 0, 1])
    lines = _lines(latency_cdf_figure([run], "t", DPI), "cdf:")
    assert lines["cdf:ttft_ms:0"].get_xdata().tolist() == [10.0, 10.0, 20.0, 30.0]
    # TPOT of the requests with 2+ tokens: (50-10)/4 = 10 and (90-30)/3 = 20
    assert lines["cdf:tpot_ms:0"].get_xdata().tolist() == [10.0, 10.0, 20.0]
    assert lines["cdf:e2e_ms:0"].get_xdata().tolist() == [20.0, 20.0, 50.0, 90.0]


def test_timeline_steps_closing_point_and_preemptions_by_hand():
    timeline = {"time_ms": [0, 0, 100, 250, 300], "instance": [0, 1, 0, 0, 1], "running": [2, 1, 3, 1, 2],
                "waiting": [4, 0, 1, 0, 0], "kv_used": [10, 4, 20, 5, 8], "preemptions": [0, 0, 1, 3, 3]}
    run = make_run("two", arrival=[0, 0, 0], first=[10, 20, 30], finish=[400, 350, 280], generated=[3, 3, 3],
                   instance=[0, 1, 0], timeline=timeline, meta={"num_blocks": 80, "instances": 2},
                   metrics={"num_preemptions": 3})
    lines = _lines(timeline_figure(run, DPI), "timeline:")
    # instance 0: samples at 0, 100, 250 ms; held until its last finish (400 ms); 40 blocks each
    assert lines["timeline:running:0"].get_xdata().tolist() == [0.0, 0.1, 0.25, 0.4]
    assert lines["timeline:running:0"].get_ydata().tolist() == [2, 3, 1, 1]
    np.testing.assert_allclose(lines["timeline:kv_used:0"].get_ydata(), [0.25, 0.5, 0.125, 0.125])
    # instance 1: samples at 0 and 300 ms, last finish 350 ms
    assert lines["timeline:waiting:1"].get_xdata().tolist() == [0.0, 0.3, 0.35]
    np.testing.assert_allclose(lines["timeline:kv_used:1"].get_ydata(), [0.1, 0.2, 0.2])
    # cumulative preemptions: the first sample, then where they rose (100, 250 ms), held to the end
    pre = lines["timeline:preemptions"]
    assert pre.get_xdata().tolist() == [0.0, 0.1, 0.25, 0.4]
    assert pre.get_ydata().tolist() == [0, 1, 3, 3]


def test_timeline_without_block_count_shows_blocks():
    timeline = {"time_ms": [0, 10], "instance": [0, 0], "running": [1, 1], "waiting": [0, 0],
                "kv_used": [3, 4], "preemptions": [0, 0]}
    run = make_run("r", arrival=[0], first=[5], finish=[10], generated=[2], timeline=timeline,
                   meta={"instances": 1}, metrics={"kv_usage": {"peak": float("nan"), "time_above_90": float("nan")}})
    fig = timeline_figure(run, DPI)
    lines = _lines(fig, "timeline:")
    assert lines["timeline:kv_used:0"].get_ydata().tolist() == [3, 4]
    assert "timeline:preemptions" not in lines
    assert fig.axes[2].get_ylabel() == "KV in use\n(blocks)"
    assert "peak KV -" in fig._suptitle.get_text()


def _search(probes, status="found", value=None, failing=None, message="m"):
    return SearchOutcome(status, value, None, failing, tuple(probes), message)


def test_search_that_fails_everywhere_has_no_chosen_mark_and_skips_missing_runs():
    nan_run = make_run("s[c=1]", arrival=[0], first=[1], finish=[2], generated=[1],
                       metrics={"ttft_ms": {"p99": float("nan")}})
    slow = make_run("s[c=4]", arrival=[0], first=[1], finish=[2], generated=[1], metrics={"ttft_ms": {"p99": 500.0}})
    outcome = _search([Probe(1, False, nan_run), Probe(2, False, None), Probe(4, False, slow)],
                      status="fails-everywhere", failing=1, message="ttft_ms.p99 <= 200 fails even at c = 1")
    study = Study("s", "search", [nan_run, slow], keys=("c",), search=outcome, constraint="ttft_ms.p99 <= 200")
    fig = search_figure(study, DPI)
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    assert "chosen" not in lines and "search:passes" not in lines
    assert list(lines["threshold"].get_ydata()) == [200.0, 200.0]
    assert lines["search:fails"].get_xdata().tolist() == [4.0]
    assert lines["search:no-value"].get_xdata().tolist() == [1.0]
    assert "fails even at c = 1" in fig._suptitle.get_text() and "(2 runs)" in fig._suptitle.get_text()


def test_sweep_with_nan_metrics_and_text_values_still_draws(tmp_path):
    runs = [make_run(f"w[kind={k}]", arrival=[0], first=[1], finish=[2], generated=[1], point={"scheduler.kind": k},
                     metrics={"ttft_ms": {"p99": v}, "num_preemptions": 0})
            for k, v in (("static", float("nan")), ("continuous", 7.0))]
    study = Study("w", "sweep", runs, keys=("scheduler.kind",))
    fig = sweep_figure(study, ("ttft_ms.p99", "num_preemptions"), DPI)
    ax = fig.axes[0]
    line = ax.get_lines()[0]
    assert line.get_xdata().tolist() == [0.0, 1.0]
    assert np.isnan(line.get_ydata()[0]) and line.get_ydata()[1] == 7.0
    assert [t.get_text() for t in ax.get_xticklabels()] == ["static", "continuous"]
    assert sweep_figure(study, ("absent.metric",), DPI) is None
    results = ExperimentResults("x", "", [study], {})
    written = PlotsReport(PlotsConfig(sweep_metrics=("slo.attainment",))).write(results, tmp_path)  # no [slo]
    assert sorted(p.name for p in written) == ["latency_cdf_w.png"]  # no timeline, no sweep panel to draw
    assert (tmp_path / "plots" / "latency_cdf_w.png").read_bytes()[:8] == PNG_SIGNATURE


# -- names, choice of timelines, config ----------------------------------------------------------------


@pytest.mark.parametrize("name, stem", [
    ("queue[rate=5]", "queue_rate_5"),
    ("rates[rate=20,max_num_seqs=4]", "rates_rate_20_max_num_seqs_4"),
    ("files[path=data/small.json]", "files_path_data_small.json"),
    ("../../etc/passwd", "etc_passwd"),
    ("p[path=../a/b.json]", "p_path_a_b.json"),
    ("rate=0.5", "rate_0.5"),
    ("run 1: a*b?", "run_1_a_b"),
    ("[]", "run"),
    (".hidden", "hidden"),
])
def test_safe_stem_by_hand(name, stem):
    assert safe_stem(name) == stem


def test_long_names_are_cut_with_a_hash_that_tells_them_apart():
    a, b = safe_stem("x" * 200 + "a"), safe_stem("x" * 200 + "b")
    assert len(a) == len(b) == 80 and a != b and a.startswith("x" * 70)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=120))
def test_safe_stem_is_always_a_plain_file_name(name):
    stem = safe_stem(name)
    assert re.fullmatch(r"[A-Za-z0-9._-]+", stem)
    assert not stem.startswith((".", "-")) and len(stem) <= 80 and stem not in (".", "..")
    assert safe_stem(name) == stem


def _tiny(name, point=None, timeline=True):
    tl = {"time_ms": [0], "instance": [0], "running": [1], "waiting": [0], "kv_used": [1], "preemptions": [0]}
    return make_run(name, arrival=[0], first=[1], finish=[2], generated=[1], point=point,
                    timeline=tl if timeline else None)


def test_colliding_names_get_numbered_files():
    results = ExperimentResults("x", "", [Study("a/b", "run", [_tiny("a/b")]), Study("a_b", "run", [_tiny("a_b")]),
                                          Study("A_B", "run", [_tiny("A_B")])], {})
    assert [p.filename for p in plan(results)] == ["latency_cdf.png", "timeline_a_b.png", "timeline_a_b-2.png",
                                                   "timeline_A_B-3.png"]


def test_timelines_single_runs_then_search_boundaries_then_sweep_points():
    sweep = Study("sw", "sweep", [_tiny(f"sw[v={v}]", {"v": v}) for v in (1, 2, 3)], keys=("v",))
    probes = [_tiny("se[c=1]"), _tiny("se[c=8]"), _tiny("se[c=4]"), _tiny("se[c=5]")]
    outcome = _search([Probe(1, True, probes[0]), Probe(8, False, probes[1]), Probe(4, True, probes[2]),
                       Probe(5, False, probes[3])], value=4, failing=5)
    search = Study("se", "search", probes, keys=("c",), search=outcome, constraint="ttft_ms.p99 <= 1")
    results = ExperimentResults("x", "", [sweep, Study("one", "run", [_tiny("one")]), search,
                                          Study("off", "run", [_tiny("off", timeline=False)])], {})
    names = [r.name for r in timeline_runs(results, 12)]
    assert names == ["one", "se[c=4]", "se[c=5]", "sw[v=1]", "sw[v=2]", "sw[v=3]"]
    assert [r.name for r in timeline_runs(results, 4)] == names[:4]
    assert timeline_runs(results, 0) == []


@pytest.mark.parametrize("name, unit, label", [
    ("ttft_ms.p99", "ms", "TTFT p99 (ms)"), ("queue_ms.p50", "ms", "queue time p50 (ms)"),
    ("ttft_ms", "ms", "TTFT (ms)"), ("e2e_ms", "ms", "e2e latency (ms)"),
    ("throughput_tps", "tokens/s", "throughput (tokens/s)"),
    ("request_throughput_rps", "requests/s", "request_throughput (requests/s)"),
    ("slo.goodput_rps", "requests/s", "SLO goodput (requests/s)"),
    ("slot_utilisation", "fraction", "slot_utilisation (fraction)"),
    ("kv_usage.peak", "fraction", "KV usage peak (fraction)"),
    ("kv_usage.time_above_90", "fraction", "KV usage time_above_90 (fraction)"),
    ("prefix_cache.hit_rate", "fraction", "prefix_cache hit_rate (fraction)"),
    ("avg_queue", "requests waiting", "avg_queue (requests waiting)"), ("num_preemptions", "count", "num_preemptions (count)"),
    ("preemptions.swap_transfer_ms", "ms", "preemptions swap_transfer (ms)"),
])
def test_metric_units_are_said_once_in_axis_labels(name, unit, label):
    """``ttft_ms.p99 (ms)`` said the unit twice; the label is the metric in words, its unit once."""
    assert metric_unit(name) == unit
    assert metric_label(name) == label


@pytest.mark.parametrize("key, label", [
    ("workload.rate", "workload.rate (requests/s)"), ("scheduler.max_num_seqs", "scheduler.max_num_seqs (sequences)"),
    ("scheduler.max_wait_ms", "scheduler.max_wait_ms (ms)"), ("kv_cache.swap_space_gib", "kv_cache.swap_space_gib (GiB)"),
    ("scheduler.max_num_batched_tokens", "scheduler.max_num_batched_tokens (tokens)"),
    ("workload.clients", "workload.clients"), ("scheduler.kind", "scheduler.kind"),
])
def test_swept_settings_get_their_unit(key, label):
    assert setting_label(key) == label


def test_latency_cdf_axes_say_the_unit_once(lab):
    fig = latency_cdf_figure(lab["fresh"].study("static").runs, "t", DPI)
    assert [ax.get_xlabel() for ax in fig.axes[:3]] == ["TTFT (ms)", "TPOT (ms)", "e2e latency (ms)"]


def test_config_from_toml_table_and_bad_values():
    cfg = from_table(PlotsConfig, {"max_timelines": 3, "sweep_metrics": ["ttft_ms.p50"]}, where="x: [reports.plots]")
    assert cfg.max_timelines == 3 and cfg.sweep_metrics == ("ttft_ms.p50",) and cfg.dpi == 110
    with pytest.raises(ConfigError, match="max_timelines"):
        from_table(PlotsConfig, {"max_timelines": -1}, where="x: [reports.plots]")
    with pytest.raises(ConfigError, match="unknown key 'max_timeline'"):
        from_table(PlotsConfig, {"max_timeline": 3}, where="x: [reports.plots]")


def test_max_timelines_limits_the_files(lab, tmp_path):
    fresh = lab["fresh"]
    results = ExperimentResults(fresh.name, "", [fresh.study("static"), fresh.study("pair")], {})
    written = PlotsReport(PlotsConfig(max_timelines=1)).write(results, tmp_path)
    assert written == [tmp_path / "plots" / "latency_cdf.png", tmp_path / "plots" / "timeline_static.png"]
    assert _png_names(tmp_path / "plots") == {"latency_cdf.png", "timeline_static.png"}  # no temporary files left


def test_sweep_values_with_slashes_make_safe_file_names(tmp_path):
    runs = [_tiny(f"files[path={p}]", {"workload.path": p}) for p in ("data/small.json", "../up.json")]
    results = ExperimentResults("x", "", [Study("files", "sweep", runs, keys=("workload.path",))], {})
    written = PlotsReport(PlotsConfig(max_timelines=2, sweep_metrics=("num_preemptions",))).write(results, tmp_path)
    assert [p.name for p in written] == ["latency_cdf_files.png", "sweep_files.png",
                                         "timeline_files_path_data_small.json.png", "timeline_files_path_up.json.png"]
    assert _png_names(tmp_path / "plots") == {p.name for p in written}


# -- mark_last_zero and overlays (sweep figures) --------------------------------------------------------


def _sweep_run(study, point, **metrics):
    label = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items())
    return make_run(f"{study}[{label}]", arrival=[0], first=[1], finish=[2], generated=[1], point=point,
                    metrics=metrics)


def _grid(name="cliff", preemptions=None, throughput=None):
    """max_num_seqs 8..64 x kind a/b/c: a stops being 0 after 16, b never does, c is not 0 at 8."""
    preemptions = preemptions or {"a": [0, 0, 5, 9], "b": [0, 0, 0, 0], "c": [3, 0, 0, 0]}
    throughput = throughput or {"a": [10.0, 20.0, 15.0, 12.0], "b": [10.0, 20.0, 30.0, 40.0],
                                "c": [1.0, 2.0, 3.0, 4.0]}
    runs = []
    for i, seqs in enumerate((8, 16, 32, 64)):
        for kind in preemptions:
            runs.append(_sweep_run(name, {"scheduler.max_num_seqs": seqs, "scheduler.kind": kind},
                                   num_preemptions=preemptions[kind][i], throughput_tps=throughput[kind][i]))
    return Study(name, "sweep", runs, keys=("scheduler.max_num_seqs", "scheduler.kind"))


def _gids(fig, prefix):
    return {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()
            if (line.get_gid() or "").startswith(prefix)}


def test_last_zero_by_hand():
    from schedlab_plugins.reports.plot_sweep import last_zero
    x = np.array([8.0, 16.0, 32.0, 64.0])
    assert last_zero(x, np.array([0, 0, 5, 0])) == 16.0   # the leading run of zeros, not the last zero
    assert last_zero(x, np.array([0, 0, 0, 0])) == 64.0
    assert last_zero(x, np.array([1, 0, 0, 0])) is None
    assert last_zero(x, np.array([0, math.nan, 0, 0])) == 8.0


def test_mark_last_zero_draws_a_vertical_line_per_line_on_every_panel():
    study = _grid()
    fig = sweep_figure(study, ("throughput_tps", "num_preemptions"), DPI, mark_last_zero="num_preemptions")
    marks = _gids(fig, "mark:")
    # lines in first-seen order of the other key: a (0), b (1), c (2); c starts above 0: no mark
    assert set(marks) == {f"mark:{m}:{i}" for m in ("throughput_tps", "num_preemptions") for i in (0, 1)}
    for metric in ("throughput_tps", "num_preemptions"):
        assert list(marks[f"mark:{metric}:0"].get_xdata()) == [16.0, 16.0]
        assert list(marks[f"mark:{metric}:1"].get_xdata()) == [64.0, 64.0]
        colours = {line.get_gid(): line.get_color() for line in _gids(fig, f"sweep:{metric}:").values()}
        assert marks[f"mark:{metric}:0"].get_color() == colours[f"sweep:{metric}:0"]
    title = fig._suptitle.get_text()
    assert "num_preemptions = 0 up to max_num_seqs = 16 (kind=a), 64 (kind=b)" in title
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[-1] == "last max_num_seqs with num_preemptions = 0"
    # without the option: no marks, no line in the title
    plain = sweep_figure(study, ("throughput_tps", "num_preemptions"), DPI)
    assert not _gids(plain, "mark:") and "up to" not in plain._suptitle.get_text()


def test_mark_last_zero_from_the_report_settings(tmp_path):
    results = ExperimentResults("x", "", [_grid()], {})
    config = from_table(PlotsConfig, {"mark_last_zero": "num_preemptions", "sweep_metrics": ["num_preemptions"]},
                        where="x: [reports.plots]")
    figures = {p.filename: p for p in plan(results, config)}
    fig = figures["sweep_cliff.png"].draw()
    assert list(_gids(fig, "mark:")["mark:num_preemptions:0"].get_xdata()) == [16.0, 16.0]
    # a metric no run has: nothing to mark, the figure is still drawn
    config = PlotsConfig(mark_last_zero="slo.met", sweep_metrics=("num_preemptions",))
    fig = plan(results, config)[-1].draw()
    assert not _gids(fig, "mark:")


def test_overlay_draws_sweeps_as_lines_and_single_runs_as_references():
    a = Study("vllm", "sweep", [_sweep_run("vllm", {"scheduler.max_num_seqs": s}, num_preemptions=p,
                                           throughput_tps=t) for s, p, t in ((8, 0, 10.0), (16, 0, 20.0),
                                                                              (32, 4, 12.0))],
              keys=("scheduler.max_num_seqs",))
    b = Study("orca", "sweep", [_sweep_run("orca", {"scheduler.max_num_seqs": s}, num_preemptions=0,
                                           throughput_tps=t) for s, t in ((8, 9.0), (32, 18.0), (64, 18.0))],
              keys=("scheduler.max_num_seqs",))
    off = Study("off", "run", [make_run("off", arrival=[0], first=[1], finish=[2], generated=[1],
                                        metrics={"throughput_tps": 14.0, "num_preemptions": 0})])
    results = ExperimentResults("x", "", [a, off, b], {})
    config = PlotsConfig(overlays={"policies": ["vllm", "orca", "off"]}, mark_last_zero="num_preemptions",
                         sweep_metrics=("throughput_tps", "num_preemptions"))
    planned = {p.filename: p for p in plan(results, config)}
    assert {"sweep_vllm.png", "sweep_orca.png", "sweep_policies.png"} <= set(planned)
    fig = planned["sweep_policies.png"].draw()
    lines = _gids(fig, "sweep:throughput_tps:")
    assert [lines[f"sweep:throughput_tps:{i}"].get_label() for i in (0, 1)] == ["vllm", "orca"]
    assert lines["sweep:throughput_tps:0"].get_xdata().tolist() == [8.0, 16.0, 32.0]
    assert lines["sweep:throughput_tps:1"].get_ydata().tolist() == [9.0, 18.0, 18.0]
    ref = _gids(fig, "ref:throughput_tps:")["ref:throughput_tps:off"]
    assert list(ref.get_ydata()) == [14.0, 14.0] and ref.get_linestyle() == "--" and ref.get_label() == "off"
    marks = _gids(fig, "mark:num_preemptions:")
    assert list(marks["mark:num_preemptions:0"].get_xdata()) == [16.0, 16.0]
    assert list(marks["mark:num_preemptions:1"].get_xdata()) == [64.0, 64.0]
    assert "16 (vllm), 64 (orca)" in fig._suptitle.get_text()


def test_overlay_errors_name_the_overlay():
    sweep = Study("s", "sweep", [_sweep_run("s", {"workload.rate": 1}, num_preemptions=0)], keys=("workload.rate",))
    other = Study("t", "sweep", [_sweep_run("t", {"scheduler.max_num_seqs": 1}, num_preemptions=0)],
                  keys=("scheduler.max_num_seqs",))
    probe = _tiny("p[c=1]")
    search = Study("p", "search", [probe], keys=("c",), search=_search([Probe(1, True, probe)], value=1),
                   constraint="ttft_ms.p99 <= 1")
    results = ExperimentResults("x", "", [sweep, other, search], {})
    with pytest.raises(ConfigError, match=r"overlays.both: no study named 'nope'"):
        plan(results, PlotsConfig(overlays={"both": ["s", "nope"]}))
    with pytest.raises(ConfigError, match=r"overlays.both: 'p' is a search"):
        plan(results, PlotsConfig(overlays={"both": ["s", "p"]}))
    figure = {p.filename: p for p in plan(results, PlotsConfig(overlays={"both": ["s", "t"]}))}["sweep_both.png"]
    with pytest.raises(ConfigError, match=r"overlays.both: sweep 't' varies 'scheduler.max_num_seqs', not "
                                          r"'workload.rate'"):
        figure.draw()
    with pytest.raises(ConfigError, match="overlays"):
        from_table(PlotsConfig, {"overlays": {"both": "s"}}, where="x: [reports.plots]")
    with pytest.raises(ConfigError, match="names a run twice"):
        from_table(PlotsConfig, {"overlays": {"both": ["s", "s"]}}, where="x: [reports.plots]")


@pytest.mark.parametrize("value, text", [(5, "5"), (0.2, "0.2"), (2000, "2000"), (10000, "10k"), (12500, "12.5k"),
                                         (16384, "16384"), (64000, "64k"), (1.5e6, "1.5M")])
def test_tick_text_by_hand(value, text):
    from schedlab_plugins.reports.plot_common import tick_text
    assert tick_text(value) == text


# -- damaged results folders -------------------------------------------------------------------------------


def _copy_without_plots(lab, tmp_path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(lab["out"], copy)
    shutil.rmtree(copy / "plots")
    return copy


@pytest.mark.parametrize("meta, kind", [(None, "null"), (5, "a number"), ("x", "a string"), ([], "an array")])
def test_plot_refuses_a_summary_whose_meta_is_not_an_object(lab, tmp_path, capsys, meta, kind):
    """Before: ``"meta": null`` ended in an AttributeError in plot_timeline.py."""
    copy = _copy_without_plots(lab, tmp_path)
    summary = json.loads((copy / "summary.json").read_text())
    summary["studies"][1]["runs"][0]["meta"] = meta
    (copy / "summary.json").write_text(json.dumps(summary))
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {copy}/summary.json: not a schedlab summary.json: "
                                       f"studies[1].runs[0].meta is {kind}, not an object\n")
    assert not (copy / "plots").exists()


def test_plot_refuses_a_summary_that_is_a_fifo_or_nested_too_deeply(lab, tmp_path, capsys):
    """A FIFO as summary.json blocked schedlab plot for ever; JSON nested 100,000 deep raised RecursionError."""
    copy = _copy_without_plots(lab, tmp_path)
    (copy / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {copy}/summary.json: not a schedlab summary.json: lists "
                                       "or objects nested too deeply to read\n")
    (copy / "summary.json").unlink()
    os.mkfifo(copy / "summary.json")
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {copy}/summary.json: is a FIFO (named pipe), not a "
                                       "regular file\n")


@pytest.mark.parametrize("name", ["requests.csv", "timeline.csv"])
def test_plot_refuses_a_csv_that_is_a_fifo(lab, tmp_path, capsys, name):
    """summary.json was checked; the CSVs were not: a FIFO blocked for ever, /dev/zero ate the memory."""
    copy = _copy_without_plots(lab, tmp_path)
    (copy / name).unlink()
    os.mkfifo(copy / name)
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err == f"schedlab: error: {copy}/{name}: is a FIFO (named pipe), not a regular file\n"


@pytest.mark.parametrize("found, message", [
    # it said to run an experiment with --out into it, which would replace the hunt's results
    ("hunt.json", "a hunt's results folder (hunt.json): schedlab plot redraws an experiment's results; the hunt's "
                  "figures are in it (run the hunt again to redraw them)"),
    # ... which the user had just done, with a reports list that left json out
    ("summary.txt", "no summary.json here: the experiment was run without the json report, which writes it; add "
                    "\"json\" to [experiment] reports (or --report json) and run it again"),
])
def test_plot_on_a_folder_without_summary_json_says_what_it_is(tmp_path, capsys, found, message):
    (tmp_path / found).write_text("{}")
    assert main(["plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"schedlab: error: {tmp_path}: {message}\n"


def test_timeline_copes_with_meta_values_of_the_wrong_type():
    """A results folder's meta may hold anything: a text block count draws blocks, a text instance
    count counts as one instance, an energy that is not a table draws no power panel."""
    timeline = {"time_ms": [0, 10], "instance": [0, 0], "running": [1, 1], "waiting": [0, 0],
                "kv_used": [20, 40], "preemptions": [0, 0]}
    run = make_run("r", arrival=[0], first=[5], finish=[10], generated=[2], timeline=timeline,
                   meta={"num_blocks": "80", "instances": 1, "energy": 5})
    fig = timeline_figure(run, DPI)
    assert len(fig.axes) == 3 and fig.axes[2].get_ylabel() == "KV in use\n(blocks)"
    assert _lines(fig, "timeline:")["timeline:kv_used:0"].get_ydata().tolist() == [20, 40]
    run = make_run("r", arrival=[0], first=[5], finish=[10], generated=[2], timeline=timeline,
                   meta={"num_blocks": 80, "instances": "two"})
    np.testing.assert_allclose(_lines(timeline_figure(run, DPI), "timeline:")["timeline:kv_used:0"].get_ydata(),
                               [0.25, 0.5])


def test_plot_refuses_a_requests_csv_cut_short(lab, tmp_path, capsys):
    """Before: plots of the first 4 rows, drawn without a word, while summary.json said 40 requests."""
    copy = _copy_without_plots(lab, tmp_path)
    lines = (copy / "requests.csv").read_text().splitlines(keepends=True)
    assert lines[1].startswith("static,")
    (copy / "requests.csv").write_text("".join(lines[:5]))
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {copy}/requests.csv: has 4 rows of run 'static', but "
                                       "summary.json counts 40 requests; is the file cut short? (run the experiment "
                                       "again to rewrite it)\n")
    assert not (copy / "plots").exists()


def test_plot_reads_requests_csv_by_its_header_and_names_a_missing_column(lab, tmp_path, capsys):
    """A spreadsheet that reordered the columns: every row was read as run '<its last column>', and
    the message said 0 rows of each run. Columns are read by name; a dropped one is named."""
    import csv
    import io

    from schedlab.results.storage import load as load_results

    copy = _copy_without_plots(lab, tmp_path)
    rows = list(csv.reader(io.StringIO((copy / "requests.csv").read_text())))
    def write(table):
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(table)
        (copy / "requests.csv").write_text(text.getvalue())

    write([r[::-1] for r in rows])
    reread = {r.name: r for r in load_results(copy).all_runs()}
    for run in load_results(lab["out"]).all_runs():
        for column in ("id", "arrival_ms", "first_token_ms", "finish_ms", "generated_tokens"):
            np.testing.assert_array_equal(reread[run.name].requests[column], run.requests[column])
    keep = [i for i, name in enumerate(rows[0]) if name != "finish_ms"]
    write([[r[i] for i in keep] for r in rows])
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {copy}/requests.csv: no column 'finish_ms' in its header; "
                                       "was it edited? (run the experiment again to rewrite it)\n")


def test_a_streamed_run_keeps_only_a_sample_of_its_rows():
    """Past exact_requests, requests.csv holds a sample (meta["requests_sampled"]): not a file cut short."""
    from schedlab.results.storage import short_run

    run = make_run("big", arrival=[0, 0], first=[1, 1], finish=[2, 2], generated=[1, 1], metrics={"requests": 9})
    assert short_run(ExperimentResults("e", "", [Study("big", "run", [run])], {})) == ("big", 2, 9)
    run.meta["requests_sampled"] = 2
    assert short_run(ExperimentResults("e", "", [Study("big", "run", [run])], {})) is None


@pytest.mark.parametrize("low, high, ticks", [(10, 1000, [10, 20, 50, 100, 200, 500, 1000]),
                                              (100, 100_000, [100, 300, 1000, 3000, 10_000, 30_000, 100_000]),
                                              (1, 1e6, [1, 10, 100, 1000, 10_000, 100_000, 1e6])])
def test_log_axis_ticks_thin_out_as_the_decades_grow(low, high, ticks):
    """Three decades at 1, 2, 5 put ten labels on a narrow panel and they ran together."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from schedlab_plugins.reports.plot_common import use_log_scale

    ax = Figure().add_subplot()
    ax.plot([low, high], [0, 1])
    use_log_scale(ax, "x", [low, high])
    ax.set_xlim(low, high)
    shown = [t for t in ax.xaxis.get_majorticklocs() if low * 0.999 <= t <= high * 1.001]
    assert shown == pytest.approx(ticks)


@pytest.mark.parametrize("damage, message", [
    (lambda s: s["studies"][_study(s, "keys")].__setitem__("keys", [5]), "studies[{i}].keys is not a list of setting "
                                                                         "names (text)"),
    (lambda s: s["studies"][_study(s, "search")]["search"].__setitem__("value", "x"),
     "studies[{i}].search.value is a string, not a number or null"),
    (lambda s: s["studies"][_study(s, "search")]["search"].pop("value"),
     "studies[{i}].search has no 'value' (a number or null)"),
    (lambda s: s["studies"][_study(s, "search")]["search"]["probes"][0].__setitem__("run", 3),
     "studies[{i}].search.probes[0].run is not a run's name (text)"),
])
def test_plot_names_the_damaged_key_of_a_summary(lab, tmp_path, capsys, damage, message):
    """They failed inside the built-in plots report, blamed as a plugin's bug (AttributeError,
    ValueError), or as a KeyError naming no file."""
    copy = _copy_without_plots(lab, tmp_path)
    summary = json.loads((copy / "summary.json").read_text())
    key = "keys" if "keys" in message else "search"
    i = _study(summary, key)
    damage(summary)
    (copy / "summary.json").write_text(json.dumps(summary))
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {copy}/summary.json: not a schedlab summary.json: "
                                       f"{message.format(i=i)}\n")


def _study(summary: dict, key: str) -> int:
    """The first study of ``summary`` with a non-empty ``key``."""
    return next(i for i, study in enumerate(summary["studies"]) if study.get(key))


def test_plot_names_the_summary_for_an_overlay_of_no_saved_study(lab, tmp_path, capsys):
    copy = _copy_without_plots(lab, tmp_path)
    summary = json.loads((copy / "summary.json").read_text())
    summary["reports"]["plots"] = {"overlays": {"a": ["nope"]}}
    (copy / "summary.json").write_text(json.dumps(summary))
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err.startswith(f"schedlab: error: {copy}/summary.json: [reports.plots] overlays.a: no "
                                              "study named 'nope'; the experiment has: ")


def test_plot_where_index_html_is_a_folder_says_to_move_it(lab, tmp_path, capsys):
    """The page could not be written over a folder, and the message advised running plot again,
    which failed alike. The plots are written; the folder is named as what to move."""
    copy = _copy_without_plots(lab, tmp_path)
    (copy / "index.html").unlink(missing_ok=True)
    (copy / "index.html").mkdir()
    assert main(["plot", str(copy)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {copy}/index.html: is a folder, so the page cannot be "
                                       "written there (the plots are written; move that folder away and run "
                                       "schedlab plot again)\n")
    assert any((copy / "plots").iterdir())
