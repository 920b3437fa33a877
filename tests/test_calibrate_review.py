"""calibrate, from a review of it: the snippet holds a nested key's fitted value, the file's value
outside the --fit bounds is scored as the file's (not the bound's), and a fit that does not
improve says there is nothing to paste."""

from __future__ import annotations

import tomllib
from types import SimpleNamespace

import pytest

from schedlab.calibrate import Parameter, _still_descending, calibrate, report, snippet
from schedlab.study.experiment import load
from schedlab.targets import read_summary
from test_calibrate import PARAMETERS, TRUTH, WORKLOAD, WRONG_START, bench_summary, fit_experiment, truth_run


def test_the_snippet_holds_a_nested_keys_fitted_value_and_its_sibling_tables():
    """A fitted ``cluster.decode.cost_model.overhead_ms``: the snippet was ``[cluster] mode =
    "disaggregated"`` alone -- neither the fitted value nor the ``link`` table."""
    tables = {"cluster": {"mode": "disaggregated", "link": {"gbps": 100.0, "latency_us": 5.0},
                          "decode": {"instances": 1, "cost_model": {"kind": "roofline", "overhead_ms": 8.125}},
                          "prefill": {"instances": 2}},
              "workload": {"kind": "synthetic"}}
    text = snippet(SimpleNamespace(tables=tables), [Parameter("cluster.decode.cost_model.overhead_ms", 0.0, 10.0)])
    assert "[cluster.decode.cost_model]\nkind = \"roofline\"\noverhead_ms = 8.125\n" in text
    assert tomllib.loads(text) == {"cluster": tables["cluster"]}  # the whole table, as TOML reads it back


def test_the_snippet_writes_lists_and_inline_tables_as_toml():
    tables = {"workload": {"kind": "mix", "parts": [{"weight": 0.5, "name": "a b"}, {"weight": 0.5, "name": "c"}],
                           "rates": [1.0, 2.5], "odd key": True}}
    text = snippet(SimpleNamespace(tables=tables), [Parameter("workload.rates", 0.0, 1.0)])
    assert tomllib.loads(text) == tables


def test_a_file_value_outside_the_bounds_is_scored_as_the_files(tmp_path):
    """The file's ``decode_ms_per_step`` is the truth (6 ms, error 0) and the bounds are [7, 10]:
    "before the fit" is the file's 0.00%, not the bound's; the fit starts at 7 and says so; it
    cannot beat the file, so the report says to keep the file's values and has nothing to paste."""
    target = read_summary(bench_summary(truth_run(tmp_path), tmp_path / "bench.json"))
    exp = fit_experiment(tmp_path, WORKLOAD.format(), TRUTH)
    parameters = [Parameter("cost_model.decode_ms_per_step", 7.0, 10.0)]
    fit, spec, result = calibrate(exp, parameters, max_evaluations=12, target=target, diagnose=False)
    assert fit.outside == {"cost_model.decode_ms_per_step": 6.0}
    assert fit.file_error_pct == pytest.approx(0.0, abs=1e-6) and fit.start_error_pct > 1.0
    text = report(fit, spec, result, parameters, target=target)
    assert "before the fit (the file's values and the plugins' defaults): mean |error| 0.00%" in text
    assert (f"the fit's start differs from the file (the file's cost_model.decode_ms_per_step = 6 outside the --fit "
            f"bounds (the fit starts at the nearest bound)): mean |error| {fit.start_error_pct:.2f}% there") in text
    assert "is no better than the file's values (0.00%), which lie outside the bounds: keep them" in text
    assert "# nothing to paste: the fit did not improve on the file's values" in text
    assert "# paste into the experiment" not in text


def test_a_fit_that_improves_still_gives_its_snippet(tmp_path):
    target = read_summary(bench_summary(truth_run(tmp_path), tmp_path / "bench.json"))
    exp = fit_experiment(tmp_path, WORKLOAD.format(), dict(TRUTH, decode_ms_per_step=9.0))
    parameters = [Parameter("cost_model.decode_ms_per_step", 1.0, 20.0)]
    fit, spec, result = calibrate(exp, parameters, max_evaluations=24, target=target, diagnose=False)
    assert not fit.outside and fit.mean_abs_error_pct < fit.start_error_pct
    text = report(fit, spec, result, parameters, target=target)
    assert "# paste into the experiment:" in text and "outside the --fit bounds" not in text
    fitted = tomllib.loads(text.split("# paste into the experiment:\n")[1])
    assert fitted["cost_model"]["decode_ms_per_step"] == pytest.approx(fit.values[parameters[0].key], rel=1e-5)


@pytest.mark.parametrize("measured, note", [
    # an id no preset carries: told apart by its size
    ("meta-llama/Llama-3.1-70B-Instruct", "t.json measured meta-llama/Llama-3.1-70B-Instruct, the run's cost model "
                                          "times llama-3-8b"),
    # an id a preset carries, another model
    ("Qwen/Qwen3-32B", "t.json measured Qwen/Qwen3-32B (qwen3-32b), the run's cost model times llama-3-8b"),
    ("meta-llama/Meta-Llama-3-8B-Instruct", ""),  # the same model, tuned: its preset
    ("someone/llama-8b-finetune", ""),            # unknown, but the same size: nothing to say
    (None, ""),                                   # the file names no model
])
def test_a_target_measured_on_another_model_is_noted(tmp_path, measured, note):
    """A 70B model's statistics were fitted to an 8B model's run without a word."""
    from schedlab.calibrate import model_mismatch

    exp = fit_experiment(tmp_path, WORKLOAD.format(), TRUTH)
    path = tmp_path / "m.toml"
    path.write_text(exp.path.read_text().replace('kind = "linear"', 'kind = "roofline"\nmodel = "llama-3-8b"\n'
                                                 'gpu = "a100-80gb"', 1).replace(
        "".join(f"{k} = {v}\n" for k, v in TRUTH.items()), ""))
    spec = load(path).studies[0].base
    target = SimpleNamespace(source="t.json", model=measured)
    assert model_mismatch(target, spec, load(path).context) == note


def test_a_bench_files_model_id_is_read():
    from schedlab.targets import _workload_shape

    assert _workload_shape({"model_id": "Qwen/Qwen3-32B"})["model"] == "Qwen/Qwen3-32B"
    assert _workload_shape({"model_id": ""})["model"] is None and _workload_shape({})["model"] is None


def test_a_fit_advances_a_progress_bar_by_its_simulations(tmp_path, monkeypatch):
    """A fit ran minutes and printed nothing until its report: a bar of its simulations now,
    its total the budget, one step a simulation, the best error so far beside it."""
    import schedlab.progress

    bars = []

    class Bar:
        def __init__(self, total, desc):
            self.total, self.desc, self.steps, self.postfix = total, desc, 0, ""
            bars.append(self)

        def update(self, n=1):
            self.steps += n

        def set_postfix_str(self, text=""):
            self.postfix = text

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(schedlab.progress, "progress", Bar)
    target = read_summary(bench_summary(truth_run(tmp_path), tmp_path / "bench.json"))
    exp = fit_experiment(tmp_path, WORKLOAD.format(), dict(TRUTH, decode_ms_per_step=9.0))
    fit, _, _ = calibrate(exp, [Parameter("cost_model.decode_ms_per_step", 1.0, 20.0)], max_evaluations=12,
                          target=target, diagnose=False)
    (bar,) = bars
    assert (bar.total, bar.desc) == (12, "calibrate") and bar.steps == fit.evaluations
    assert bar.postfix == f"best mean |error| {fit.mean_abs_error_pct:.2f}%"


def test_before_the_fit_is_the_file_as_written_not_the_held_start(tmp_path):
    """``--hold`` the true ``per_seq_ms``: "before the fit" was scored with the held value (so it
    read 0.00%, and "nothing to paste" kept the held value that fixes the file from the user).
    Now the file as written is "before", the start is said apart, and the snippet holds the held key."""
    target = read_summary(bench_summary(truth_run(tmp_path), tmp_path / "bench.json"))
    exp = fit_experiment(tmp_path, WORKLOAD.format(), dict(TRUTH, per_seq_ms=1.5))
    parameters = [Parameter("cost_model.decode_ms_per_step", 5.0, 7.0)]
    fit, spec, result = calibrate(exp, parameters, max_evaluations=14, target=target, diagnose=False,
                                  hold={"cost_model.per_seq_ms": 0.5})
    unheld, _, _ = calibrate(exp, parameters, max_evaluations=1, starts=1, target=target, diagnose=False)
    assert fit.start_error_pct == pytest.approx(0.0, abs=1e-6)           # the truth, with the held value
    assert fit.file_error_pct == pytest.approx(unheld.start_error_pct)   # the file's 1.5 ms, as a plain fit starts
    assert fit.file_error_pct > 5.0 and fit.before_error_pct == fit.file_error_pct
    text = report(fit, spec, result, parameters, target=target)
    assert f"before the fit (the file's values and the plugins' defaults): mean |error| {fit.file_error_pct:.2f}%" \
        in text
    assert "the fit's start differs from the file (held: cost_model.per_seq_ms = 0.5): mean |error| 0.00% there" \
        in text
    pasted = tomllib.loads(text.split("# paste into the experiment:\n")[1])
    assert pasted["cost_model"]["per_seq_ms"] == 0.5


def test_a_table_the_fit_makes_is_no_part_of_before_the_fit(tmp_path):
    """``--fit frontend.network_ms`` on a file without ``[frontend]`` makes the table, which turns
    the simulated front end on: "before the fit" is the file without it."""
    target = read_summary(bench_summary(truth_run(tmp_path), tmp_path / "bench.json"))
    exp = fit_experiment(tmp_path, WORKLOAD.format(), TRUTH)
    parameters = [Parameter("frontend.network_ms", 0.0, 20.0)]
    fit, spec, result = calibrate(exp, parameters, max_evaluations=10, target=target, diagnose=False)
    assert fit.created == ("frontend",)
    assert fit.file_error_pct == pytest.approx(0.0, abs=1e-6)  # the file is the truth
    text = report(fit, spec, result, parameters, target=target)
    assert "before the fit (the file's values and the plugins' defaults): mean |error| 0.00%" in text
    assert "[frontend] made by --fit (the file has none)" in text


def test_a_descent_cut_off_while_descending_is_told_from_one_that_converged():
    """Hand cases of the rule: a last quarter of candidates that still lowers the best error by 2
    points of a fit that gained 19 is cut off; one that lowers it by 0.02 has converged."""
    assert _still_descending([10.0, 8.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0], start_error=20.0)   # 3 -> 1
    assert not _still_descending([10.0, 5.0, 2.0, 1.0, 0.99, 0.98, 0.97, 0.96], start_error=20.0)  # 0.98 -> 0.96


def test_a_fit_whose_budget_ran_out_mid_descent_says_so(tmp_path):
    """Three constants from a wrong start in 24 simulations: the descent that found the fit was
    still lowering the error when its share ran out, and nothing said so (the report read as if
    converged, values some percent off). The same fit with 240 says nothing (tests/test_calibrate)."""
    target = read_summary(bench_summary(truth_run(tmp_path), tmp_path / "bench.json"))
    exp = fit_experiment(tmp_path, WORKLOAD.format(), WRONG_START)
    fit, _, _ = calibrate(exp, PARAMETERS, max_evaluations=24, target=target, diagnose=False)
    assert any(w.startswith("the descent that found the fit spent its ") and "while still lowering the error" in w
               and w.endswith("raise --max-evaluations (e.g. to 48)") for w in fit.warnings), fit.warnings


def test_a_key_the_runs_own_entry_sets_is_pasted_into_that_entry(tmp_path):
    """The run's ``[[runs]]`` entry sets ``cost_model.decode_ms_per_step`` itself: the snippet was
    a top-level ``[cost_model]``, which the entry overrides, so pasting it changed nothing (a
    1.99% fit re-ran at 15%). Now it is the entry's own table, and pasted there it gives the fit."""
    target = read_summary(bench_summary(truth_run(tmp_path), tmp_path / "bench.json"))
    own = "cost_model = { decode_ms_per_step = 9.0 }"
    path = tmp_path / "own.toml"
    path.write_text("[experiment]\nreports = []\n" + WORKLOAD.format() + "[cost_model]\nkind = \"linear\"\n"
                    + "".join(f"{k} = {v}\n" for k, v in TRUTH.items()) + f"[[runs]]\nname = \"light\"\n{own}\n")
    parameters = [Parameter("cost_model.decode_ms_per_step", 1.0, 20.0)]
    fit, spec, result = calibrate(load(path), parameters, max_evaluations=20, target=target, diagnose=False)
    assert fit.own_tables == {"light": ("cost_model",)}
    text = report(fit, spec, result, parameters, target=target)
    pasted = text.split("# paste into the experiment:\n")[1]
    assert pasted.startswith("# in the [[runs]] entry of 'light', in place of its own cost_model")
    line = next(row for row in pasted.splitlines() if row.startswith("cost_model = {"))
    path.write_text(path.read_text().replace(own, line))
    tables = load(path).studies[0].base.tables
    assert tables["cost_model"]["decode_ms_per_step"] == pytest.approx(fit.values[parameters[0].key], rel=1e-5)
    assert tables["cost_model"]["per_seq_ms"] == TRUTH["per_seq_ms"]
