"""The ``best`` setting of the table and plots reports, and the ``compare.png`` bar chart."""

from __future__ import annotations

import math

import matplotlib.colors
import numpy as np
import pytest

from schedlab.cli import main
from schedlab.configs import from_table
from schedlab.errors import ConfigError
from schedlab.results import ExperimentResults, RunResult, Study
from schedlab_plugins.reports.best import best_runs, best_text, metric_number
from schedlab_plugins.reports.plot_compare import BEST_COLOR, PLAIN_COLOR, compare_figure
from schedlab_plugins.reports.plots import PlotsConfig, plan
from schedlab_plugins.reports.table import TableConfig, render
from study_case import TINY_WORKLOAD

DPI = 60
GOODPUT = "per_class.interactive.slo.goodput_rps"


def fake_run(name: str, metrics: dict, point: dict | None = None) -> RunResult:
    """A run that carries only metrics (what the table, best and compare read)."""
    return RunResult(name, {}, {}, {}, {}, {}, {}, {}, metrics, dict(point or {}))


def goodput_run(name: str, goodput, ttft_p99=None) -> RunResult:
    interactive = {"slo": {"goodput_rps": goodput}}
    if ttft_p99 is not None:
        interactive["ttft_ms"] = {"p99": ttft_p99}
    return fake_run(name, {"finished": 10, "per_class": {"interactive": interactive, "batch": {"slo": {}}}})


def single_runs(*runs) -> ExperimentResults:
    return ExperimentResults("exp", "", [Study(r.name, "run", [r]) for r in runs], {})


# -- picking the best ---------------------------------------------------------------------------------


def test_metric_number_reads_nested_names_and_only_finite_numbers():
    metrics = {"a": {"b": {"c": 2}}, "nan": math.nan, "inf": math.inf, "flag": True, "text": "x",
               "np": np.float64(1.5), "npi": np.int64(3)}
    assert metric_number(metrics, "a.b.c") == 2.0
    assert metric_number(metrics, "np") == 1.5 and metric_number(metrics, "npi") == 3.0
    for name in ("a.b", "a.b.c.d", "a.x.c", "nan", "inf", "flag", "text", "missing"):
        assert metric_number(metrics, name) is None, name


def test_best_runs_by_hand():
    a, b, c = goodput_run("a", 1.0), goodput_run("b", 3.25), goodput_run("c", math.nan)
    d, e = fake_run("d", {"finished": 1}), goodput_run("e", 3.25)
    runs = [a, b, c, d, e]
    assert best_runs(runs, GOODPUT) == ([b, e], 3.25)            # ties: every run at the best value
    assert best_runs(runs, GOODPUT, "lowest") == ([a], 1.0)      # NaN and absent take no part
    assert best_runs([c, d], GOODPUT) == ([], None)
    assert best_runs([], GOODPUT) == ([], None)
    with pytest.raises(ValueError, match="best_is"):
        best_runs(runs, GOODPUT, "largest")


def test_best_text_by_hand():
    b, e = goodput_run("b", 3.25), goodput_run("e", 3.25)
    assert best_text(GOODPUT, "highest", [b, e], 3.25) == f"best {GOODPUT} (highest): b, e = 3.25"
    assert best_text("ttft_ms.p99", "lowest", [b], 16950.4) == "best ttft_ms.p99 (lowest): b = 16,950"
    assert best_text("x", "lowest", [b], 12.0) == "best x (lowest): b = 12"
    assert best_text("x", "highest", [], None) == "best x (highest): no run has a value"


# -- the table ----------------------------------------------------------------------------------------


def _rows(text: str) -> dict[str, str]:
    """Run name (without the mark) -> its table line."""
    lines = text.splitlines()[3:]
    return {line.split()[0]: line for line in lines if line and not line.startswith(("*", "best", "KV"))}


def test_table_marks_the_best_run_and_names_it_under_the_table():
    results = single_runs(goodput_run("fcfs", 2.5), goodput_run("separated", 3.1), goodput_run("pooled", 2.9))
    columns = ("finished", GOODPUT)
    text = render(results, columns, best=GOODPUT)
    rows = _rows(text)
    assert rows["separated"].split()[:2] == ["separated", "*"]
    assert "*" not in rows["fcfs"] and "*" not in rows["pooled"]
    assert text.splitlines()[-1] == f"* best {GOODPUT} (highest): separated = 3.1"
    low = render(results, columns, best=GOODPUT, best_is="lowest")
    assert _rows(low)["fcfs"].split()[:2] == ["fcfs", "*"]
    assert low.splitlines()[-1] == f"* best {GOODPUT} (lowest): fcfs = 2.5"
    # the metric need not be a column; runs without it are skipped; none has it: said so, no mark
    assert render(results, ("finished",), best=GOODPUT).splitlines()[-1].endswith("separated = 3.1")
    none = render(results, columns, best="per_class.batch.slo.goodput_rps")
    assert none.splitlines()[-1] == "best per_class.batch.slo.goodput_rps (highest): no run has a value"
    assert "*" not in none
    # without the setting the table is what it always was
    plain = render(results, columns)
    assert "*" not in plain and "best" not in plain
    assert plain == render(results, columns, best=None)


def test_table_marks_every_tied_run_and_sweep_points_too():
    sweep = Study("s", "sweep", [goodput_run("s[x=1]", 3.0), goodput_run("s[x=2]", 1.0)], keys=("x",))
    results = ExperimentResults("exp", "", [Study("one", "run", [goodput_run("one", 3.0)]), sweep], {})
    text = render(results, (GOODPUT,), best=GOODPUT)
    rows = _rows(text)
    assert rows["one"].split()[1] == "*" and rows["s[x=1]"].split()[1] == "*"
    assert rows["s[x=2]"].split()[1] != "*"
    assert text.splitlines()[-1] == f"* best {GOODPUT} (highest): one, s[x=1] = 3"


def test_best_settings_are_checked():
    cfg = from_table(TableConfig, {"best": GOODPUT, "best_is": "lowest"}, where="x: [reports.table]")
    assert (cfg.best, cfg.best_is) == (GOODPUT, "lowest")
    assert TableConfig().best is None and TableConfig().best_is == "highest"
    for cls, table in ((TableConfig, "table"), (PlotsConfig, "plots")):
        with pytest.raises(ConfigError, match=r"\[reports\.%s\]: best_is: must be one of 'highest', 'lowest'" % table):
            from_table(cls, {"best": "ttft_ms.p99", "best_is": "max"}, where=f"x: [reports.{table}]")
    with pytest.raises(ConfigError, match="compare_metrics"):
        from_table(PlotsConfig, {"compare_metrics": "ttft_ms.p99"}, where="x: [reports.plots]")


EXPERIMENT = '''
[experiment]
name = "best-test"
reports = ["table", "plots"]

[workload]
kind = "synthetic"
num_requests = 40
prompt = {dist = "fixed", value = 64}
output = {dist = "fixed", value = 16}
arrival = "all-at-once"

[cost_model]
kind = "linear"

[scheduler]
kind = "continuous"

[kv_cache]
kind = "paged"
num_blocks = 400

[[runs]]
name = "two_slots"
scheduler = { max_num_seqs = 2 }

[[runs]]
name = "eight_slots"
scheduler = { max_num_seqs = 8 }

[[runs]]
name = "four_slots"
scheduler = { max_num_seqs = 4 }

[reports.table]
columns = ["throughput_tps"]
best = "throughput_tps"

[reports.plots]
compare_metrics = ["throughput_tps", "ttft_ms.p99"]
best = "ttft_ms.p99"
best_is = "lowest"
max_timelines = 0
'''


def test_best_from_an_experiment_file(tmp_path, capsys):
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary in capsys.readouterr().out
    # 40 requests of 16 tokens, all at t = 0, linear costs: more slots, more tokens per 8 ms step
    rows = _rows(summary)
    assert rows["eight_slots"].split()[:2] == ["eight_slots", "*"]
    assert "*" not in rows["two_slots"] and "*" not in rows["four_slots"]
    assert "* best throughput_tps (highest): eight_slots = " in summary
    assert (tmp_path / "out" / "plots" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- compare.png ----------------------------------------------------------------------------------------


def _bars(fig) -> dict[str, object]:
    return {patch.get_gid(): patch for ax in fig.axes for patch in ax.patches if patch.get_gid()}


def test_compare_figure_draws_a_bar_per_run_and_highlights_the_best():
    runs = [goodput_run("fcfs", 2.5, ttft_p99=5000.0), goodput_run("separated", 3.1, ttft_p99=250.0),
            goodput_run("pooled", math.nan, ttft_p99=1600.0)]
    ttft = "per_class.interactive.ttft_ms.p99"
    fig = compare_figure(runs, [ttft, GOODPUT, "no.such.metric"], DPI, best=GOODPUT)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [ttft, GOODPUT]          # absent metrics left out
    bars = _bars(fig)
    assert set(bars) == {f"bar:{ttft}:fcfs", f"best:{ttft}:separated", f"bar:{ttft}:pooled",
                         f"bar:{GOODPUT}:fcfs", f"best:{GOODPUT}:separated"}  # NaN: no bar
    assert bars[f"bar:{ttft}:fcfs"].get_width() == 5000.0
    assert bars[f"best:{GOODPUT}:separated"].get_width() == 3.1
    # bars in file order, top to bottom
    top_to_bottom = [bars[f"bar:{ttft}:fcfs"], bars[f"best:{ttft}:separated"], bars[f"bar:{ttft}:pooled"]]
    assert [bar.get_y() for bar in top_to_bottom] == sorted(bar.get_y() for bar in top_to_bottom)
    assert panels[0].yaxis_inverted()
    for gid, bar in bars.items():
        want = BEST_COLOR if gid.startswith("best:") else PLAIN_COLOR
        assert matplotlib.colors.to_hex(bar.get_facecolor()) == matplotlib.colors.to_hex(want), gid
    assert [t.get_text() for t in panels[0].texts] == ["5,000", "250", "1,600"]   # each bar's value
    assert [t.get_text() for t in panels[1].texts] == ["2.5", "3.1", "-"]          # NaN: a dash
    labels = [t.get_text() for t in panels[0].get_yticklabels()]
    assert labels == ["fcfs", "separated (best)", "pooled"]
    assert f"best {GOODPUT} (highest): separated = 3.1" in fig._suptitle.get_text()
    # TTFT spans 20x: linear; a 30x range gets a log axis
    assert panels[0].get_xscale() == "linear"
    wide = compare_figure([goodput_run("a", 1.0, ttft_p99=100.0), goodput_run("b", 1.0, ttft_p99=5000.0)],
                          [ttft], DPI)
    assert wide.axes[0].get_xscale() == "log"


def test_compare_figure_without_best_and_without_anything_to_draw():
    runs = [goodput_run("a", 1.0), goodput_run("b", 2.0)]
    fig = compare_figure(runs, [GOODPUT], DPI)
    assert all(gid.startswith("bar:") for gid in _bars(fig))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["a", "b"]
    assert "best" not in fig._suptitle.get_text()
    assert compare_figure(runs, ["no.such.metric"], DPI) is None
    assert compare_figure([], [GOODPUT], DPI) is None


def test_compare_png_is_planned_only_when_asked_and_for_single_runs_only():
    a, b = goodput_run("a", 1.0), goodput_run("b", 2.0)
    sweep = Study("s", "sweep", [goodput_run("s[x=1]", 9.0, ttft_p99=1.0)], keys=("x",))
    results = ExperimentResults("exp", "", [Study("a", "run", [a]), sweep, Study("b", "run", [b])], {})
    names = [p.filename for p in plan(results, PlotsConfig(max_timelines=0))]
    assert "compare.png" not in names
    config = PlotsConfig(max_timelines=0, compare_metrics=(GOODPUT,), best=GOODPUT)
    planned = {p.filename: p for p in plan(results, config)}
    assert "compare.png" in planned
    fig = planned["compare.png"].draw()
    assert set(_bars(fig)) == {f"bar:{GOODPUT}:a", f"best:{GOODPUT}:b"}  # the sweep point (9.0) is not a bar
    only_sweep = ExperimentResults("exp", "", [sweep], {})
    assert "compare.png" not in [p.filename for p in plan(only_sweep, config)]


# -- report settings naming runs, keys and metrics: checked when the file is read ----------------------

SWEEPS = '''
[experiment]
name = "b"
reports = ["table", "json", "plots", "goodput", "crossover"]
''' + TINY_WORKLOAD + '''[slo]
ttft_ms = 100
[[runs]]
name = "a"
sweep = {"workload.rate" = [1, 2]}
[[runs]]
name = "b"
sweep = {"workload.rate" = [1, 2]}
[[runs]]
name = "c"
sweep = {"scheduler.max_num_seqs" = [1, 2]}
scheduler = {kind = "continuous"}
[[runs]]
name = "one"
[reports.crossover]
baseline = "a"
load = "workload.rate"
'''


def _load_reports(tmp_path, extra: str, text: str = SWEEPS):
    from schedlab.study.experiment import load

    path = tmp_path / "exp.toml"
    path.write_text(text + extra)
    return path, load(path)


@pytest.mark.parametrize("extra, message", [
    ('[reports.plots]\noverlays = {x = ["a", "nope"]}\n',
     "[reports.plots]: overlays.x: no study named 'nope'; the experiment has: a, b, c, one"),
    ('[reports.plots]\noverlays = {x = ["a", "c"]}\n',
     "[reports.plots]: overlays.x: sweep 'c' varies 'scheduler.max_num_seqs', not 'workload.rate' like 'a'"),
    ('[reports.crossover]\nbaseline = "nope"\nload = "workload.rate"\n',
     "[reports.crossover]: baseline 'nope' must be a sweep over 'workload.rate' (there is no run named 'nope'); "
     "sweeps over it: a, b"),
    ('[reports.crossover]\nbaseline = "one"\nload = "workload.rate"\n',
     "[reports.crossover]: baseline 'one' must be a sweep over 'workload.rate' ('one' is a single run); "
     "sweeps over it: a, b"),
    ('[reports.crossover]\nbaseline = "a"\nload = "workload.nope"\n',
     "[reports.crossover]: baseline 'a' must be a sweep over 'workload.nope' ('a' sweeps workload.rate); "
     "sweeps over it: none"),
    ('[reports.crossover]\nbaseline = "a"\nload = "workload.rate"\nstudies = ["nope"]\n',
     "[reports.crossover]: studies: 'nope' is not a sweep over 'workload.rate' (there is no run named 'nope'); "
     "sweeps over it: a, b"),
    ('[reports.crossover]\nbaseline = "a"\nload = "workload.rate"\nstudies = ["a"]\n',
     "[reports.crossover]: studies: 'a' is the baseline; list the sweeps compared with it"),
    ('[reports.goodput]\npanels = {x = ["nope"]}\n',
     "[reports.goodput]: panels.x: 'nope' is not a sweep over workload.rate; sweeps: a, b"),
    ('[reports.goodput]\nrate_key = "workload.nope"\n',
     "[reports.goodput]: rate_key: no sweep over 'workload.nope', so no goodput to find; swept keys: "
     "scheduler.max_num_seqs, workload.rate"),
    ('[reports.table]\nbaseline = "nope"\n',
     "[reports.table]: baseline: no replicated single run named 'nope' (the paired differences compare [[runs]] "
     "entries with replicas > 1 and no sweep, search or plan); they are: none"),
])
def test_report_settings_naming_no_such_run_or_key_fail_when_the_file_is_read(tmp_path, extra, message):
    text = SWEEPS.split("[reports.crossover]")[0] if extra.startswith("[reports.crossover]") else SWEEPS
    with pytest.raises(ConfigError) as info:
        _load_reports(tmp_path, extra, text)
    assert str(info.value) == f"{tmp_path / 'exp.toml'}: {message}"


@pytest.mark.parametrize("extra, message", [
    ('metric = "nope"\n', "[reports.crossover]: metric: unknown metric 'nope': there are "),
    ('ratios = ["ttft_ms.p999"]\n', "[reports.crossover]: ratios: unknown metric 'ttft_ms.p999' (did you mean "
                                    "'ttft_ms.p99'?): 'ttft_ms' has mean,"),
    ('[reports.goodput]\nmetric = "nope"\n', "[reports.goodput]: metric: unknown metric 'nope': there are "),
    ('[reports.goodput]\nmetrics = ["tpot_ms"]\n', "[reports.goodput]: metrics: 'tpot_ms' is a group of metrics"),
])
def test_unknown_metric_names_in_reports_fail_when_the_file_is_read(tmp_path, extra, message):
    with pytest.raises(ConfigError) as info:
        _load_reports(tmp_path, extra)
    assert str(info.value).startswith(f"{tmp_path / 'exp.toml'}: {message}")


def test_slo_metrics_in_reports_need_slo_targets(tmp_path):
    no_slo = SWEEPS.replace("[slo]\nttft_ms = 100\n", "")
    with pytest.raises(ConfigError) as info:
        _load_reports(tmp_path, "[reports.goodput]\nattainment = 0.5\n", no_slo)
    assert str(info.value) == (f"{tmp_path / 'exp.toml'}: [reports.goodput]: metric: 'slo.attainment' needs [slo] "
                               "targets (ttft_ms, tpot_ms), and runs 'a', 'b' have none")
    with pytest.raises(ConfigError, match=r"\[reports.crossover\]: ratios: 'slo.goodput_rps' needs \[slo\] targets"):
        _load_reports(tmp_path, 'ratios = ["slo.goodput_rps"]\n', no_slo.replace('"goodput", ', ""))
    _, exp = _load_reports(tmp_path, '[reports.goodput]\nmetrics = ["tpot_ms.p90"]\n')  # with [slo]: fine
    assert [s.kind for s in exp.studies] == ["sweep", "sweep", "sweep", "run"]


def test_validate_refuses_a_report_naming_no_such_run_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "exp.toml"
    path.write_text(SWEEPS + '[reports.plots]\noverlays = {x = ["nope"]}\n')
    assert main(["validate", str(path)]) == 2
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("[reports.plots]: overlays.x: no study named 'nope'") == 2
    assert "simulations" not in err and not (tmp_path / "out").exists()


def test_a_run_name_no_font_can_draw_leaks_no_warning(recwarn):
    from schedlab_plugins.reports.plot_common import new_figure
    from schedlab_plugins.reports.plots import png_bytes

    fig = new_figure(3, 2, DPI)
    fig.subplots().set_title("a\0b")  # a NUL: no font has it
    assert png_bytes(fig, DPI)[:8] == b"\x89PNG\r\n\x1a\n"
    assert [str(w.message) for w in recwarn] == []


def test_a_table_column_of_slo_metrics_without_slo_targets_is_refused(tmp_path, capsys):
    """validate said OK and every row showed '-'; a search on the metric was already refused."""
    from schedlab.cli import main

    path = tmp_path / "e.toml"
    workload = ('[workload]\nkind = "synthetic"\nnum_requests = 4\nprompt = {dist = "fixed", value = 10}\n'
                'output = {dist = "fixed", value = 5}\nrate = 1\n')
    path.write_text(workload + '[reports.table]\ncolumns = ["finished", "slo.attainment"]\n')
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {path}: [reports.table]: columns: 'slo.attainment' needs "
                                       "[slo] targets (ttft_ms, tpot_ms), and no run has them: every run would show "
                                       "-\n")
    path.write_text(workload + '[slo]\nttft_ms = 300\n[reports.table]\ncolumns = ["finished", "slo.attainment"]\n')
    assert main(["validate", str(path)]) == 0


@pytest.mark.parametrize("report, field, metric", [
    ("table", "columns", "energy.kwh"), ("table", "columns", "per_class.chat.energy.j_per_token"),
    ("table", "best", "energy.j_per_token"), ("table", "differences", "energy.avg_power_w"),
    ("plots", "compare_metrics", "energy.kwh"), ("plots", "best", "energy.kwh")])
def test_an_energy_metric_without_a_power_table_in_any_run_is_refused(tmp_path, capsys, report, field, metric):
    """A left-alone item: a table column (a bar, the best run) of energy.* without [power] showed '-' in every
    row, as slo.* without [slo] did before it was refused."""
    from schedlab.cli import main

    path = tmp_path / "e.toml"
    value = f'"{metric}"' if field == "best" else f'["{metric}"]'
    runs = '[[runs]]\nname = "plain"\n[[runs]]\nname = "metered"\n[runs.power]\nkind = "utilisation"\n'
    roofline = ('[cost_model]\nkind = "roofline"\nmodel = "llama-3.1-8b"\ngpu = "h100-80gb"\n'
                '[kv_cache]\nmodel = "llama-3.1-8b"\ngpu = "h100-80gb"\n')
    path.write_text(SMALL + roofline + f'[reports.{report}]\n{field} = {value}\n')
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {path}: [reports.{report}]: {field}: '{metric}' needs a "
                                       "[power] table (only runs with one meter energy), and no run has one: every "
                                       "run would show -\n")
    path.write_text(SMALL + roofline + f'[reports.{report}]\n{field} = {value}\n' + runs)   # one run meters it
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


#: a small workload for files checked by ``schedlab validate``
SMALL = ('[workload]\nkind = "synthetic"\nnum_requests = 4\nprompt = {dist = "fixed", value = 10}\n'
         'output = {dist = "fixed", value = 5}\nrate = 1\n')


def test_an_slo_table_with_no_target_is_refused(validated):
    """An empty [slo] counted every request as meeting it: attainment 1, and a search on it held
    to the top of its range."""
    code, err, path = validated(SMALL + '[slo]\n')
    assert code == 2
    assert err == (f"schedlab: error: {path}: [slo]: ttft_ms: the table names no target (ttft_ms, tpot_ms or "
                   "classes), so every request would meet it and a search on its attainment hold everywhere; "
                   "give one\n")


def test_an_slo_target_under_a_millisecond_is_warned_about(validated):
    """A target typed in seconds (0.5 for 500 ms) is met by no request: attainment 0 and a
    search that fails everywhere, with nothing saying why. Targets of 1 ms and more pass quietly."""
    body = SMALL + 'request_class = "chat"\n[slo]\n'
    code, err, path = validated(body + 'ttft_ms = 0.5\ntpot_ms = 1\nclasses = {chat = {tpot_ms = 0.04}}\n')
    assert code == 0
    assert (f"{path}: [slo] ttft_ms = 0.5: targets are in milliseconds and no request meets one under 1 ms; "
            "for 0.5 s write ttft_ms = 500\n") in err
    assert "[slo] classes.chat.tpot_ms = 0.04: " in err and "write tpot_ms = 40\n" in err
    assert "[slo] tpot_ms" not in err
    code, err, _ = validated(body + 'ttft_ms = 1\ntpot_ms = 1\n')
    assert code == 0 and "milliseconds" not in err
