"""A ``[search]`` with several constraints (all must hold), and ``--set`` of ``[search]``, ``[sweep]``
and ``[plan]``.

The searches run one request (10 prompt tokens, 3 output tokens, arriving at 0) on the ``linear``
cost model with 1 ms per prompt token and 8 ms per decode step; the searched key is
``cost_model.base_ms`` (b, added to every iteration). By hand: the prefill iteration ends at
TTFT = 10 + b ms and each of the two decode steps takes TPOT = 8 + b ms. So ``ttft_ms.p99 <= 40``
holds up to b = 30, ``tpot_ms.p99 <= 30`` up to b = 22, and the probes of an integer search over
[0, 60] from 0 are 0, 1, 3, 7, 15, 31 (the bracket: offsets 1, 3, 7, 15, 31) and then the bisection.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.results.storage import constraint_list, load as load_results, summary_dict, summary_problem
from schedlab.study.experiment import load, run_experiment
from schedlab.study.search import parse_constraint
from schedlab_plugins.reports.lab import tune_target
from schedlab_plugins.reports.plot_search import search_figure
from study_case import PLAN

HEAD = """\
[experiment]
name = "two"
reports = ["table"]

[workload]
kind = "synthetic"
num_requests = 1
prompt = {dist = "fixed", value = 10}
output = {dist = "fixed", value = 3}
arrival = "all-at-once"

[cost_model]
kind = "linear"
prefill_ms_per_token = 1.0
decode_ms_per_step = 8.0

[scheduler]
kind = "continuous"
"""


def search_file(tmp_path, condition: str, *, low=0, high=60, maximize=True, extra="", name="two.toml"):
    path = tmp_path / name
    path.write_text(HEAD + extra + textwrap.dedent(f"""
        [search]
        key = "cost_model.base_ms"
        low = {low}
        high = {high}
        maximize = {str(maximize).lower()}
        {condition}
        """))
    return path


def searched(path, overrides=()):
    study = run_experiment(load(path, list(overrides))).studies[0]
    return study, [(p.value, p.holds) for p in study.search.probes]


def test_the_metrics_are_the_hand_computed_ones(tmp_path):
    study, _ = searched(search_file(tmp_path, 'constraint = "ttft_ms.p99 <= 40"', high=5))
    run = study.search.payload  # b = 5 holds: TTFT 15, TPOT 13, end to end 15 + 2 x 13
    assert run.metrics["ttft_ms"]["p99"] == 15.0 and run.metrics["tpot_ms"]["p99"] == 13.0
    assert run.metrics["e2e_ms"]["p99"] == 41.0


def test_tpot_fails_first(tmp_path):
    path = search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]')
    study, probes = searched(path)
    # 31 fails (both), bisect 15..31: 23 fails (TPOT 31), 19, 21, 22 hold
    assert probes == [(0, True), (1, True), (3, True), (7, True), (15, True), (31, False), (23, False),
                      (19, True), (21, True), (22, True)]
    assert (study.search.status, study.search.value, study.search.failing) == ("found", 22, 23)
    assert study.search.message == ("largest cost_model.base_ms with ttft_ms.p99 <= 40 and tpot_ms.p99 <= 30: "
                                    "22 (23 fails: tpot_ms.p99 = 31)")
    assert study.constraint == "ttft_ms.p99 <= 40 and tpot_ms.p99 <= 30"


def test_ttft_fails_first(tmp_path):
    path = search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 25", "tpot_ms.p99 <= 30"]')
    study, probes = searched(path)
    # TTFT <= 25 up to b = 15; 23 fails both, 19, 17, 16 fail TTFT only
    assert probes == [(0, True), (1, True), (3, True), (7, True), (15, True), (31, False), (23, False),
                      (19, False), (17, False), (16, False)]
    assert study.search.message == ("largest cost_model.base_ms with ttft_ms.p99 <= 25 and tpot_ms.p99 <= 30: "
                                    "15 (16 fails: ttft_ms.p99 = 26)")


def test_both_fail_at_the_failing_value(tmp_path):
    path = search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 33", "tpot_ms.p99 <= 31"]')
    study, probes = searched(path)
    # both hold up to b = 23 and fail from 24 on
    assert probes[-4:] == [(23, True), (27, False), (25, False), (24, False)]
    assert study.search.message.endswith(": 23 (24 fails: ttft_ms.p99 = 34, tpot_ms.p99 = 32)")


def test_fails_everywhere_names_the_failing_constraint(tmp_path):
    path = search_file(tmp_path, 'constraints = ["tpot_ms.p99 <= 30", "ttft_ms.p99 <= 5"]')
    study, probes = searched(path)
    assert probes == [(0, False)]
    assert study.search.status == "fails-everywhere" and study.search.value is None
    assert study.search.message == ("tpot_ms.p99 <= 30 and ttft_ms.p99 <= 5 fails even at cost_model.base_ms = 0: "
                                    "ttft_ms.p99 = 10")


def test_a_single_constraint_that_fails_everywhere_says_by_how_much(tmp_path):
    """It said only "fails even at ... = 0": an impossible target, or one in seconds, could not be told."""
    study, probes = searched(search_file(tmp_path, 'constraint = "ttft_ms.p99 <= 5"'))
    assert probes == [(0, False)]
    assert study.search.message == "ttft_ms.p99 <= 5 fails even at cost_model.base_ms = 0: ttft_ms.p99 = 10"


def test_holds_everywhere_says_what_it_said(tmp_path):
    path = search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]', high=20)
    study, _ = searched(path)
    assert study.search.message == ("ttft_ms.p99 <= 40 and tpot_ms.p99 <= 30 holds up to the top of the range "
                                    "(cost_model.base_ms = 20); raise high to search further")


def test_minimize(tmp_path):
    # smallest b with TPOT >= 20 (b >= 12) and TTFT >= 15 (b >= 5): from 60 down 59, 57, 53, 45, 29, 0 (fails
    # both), then 14 holds, 7 fails (TPOT 15), 10 fails, 12 holds, 11 fails (TPOT 19; TTFT 21 holds)
    path = search_file(tmp_path, 'constraints = ["tpot_ms.p99 >= 20", "ttft_ms.p99 >= 15"]', maximize=False)
    study, probes = searched(path)
    assert [v for v, _ in probes] == [60, 59, 57, 53, 45, 29, 0, 14, 7, 10, 12, 11]
    assert study.search.message == ("smallest cost_model.base_ms with tpot_ms.p99 >= 20 and ttft_ms.p99 >= 15: "
                                    "12 (11 fails: tpot_ms.p99 = 19)")


def test_the_answer_is_the_lower_of_the_two_single_searches(tmp_path):
    both, _ = searched(search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]'))
    ttft, _ = searched(search_file(tmp_path, 'constraint = "ttft_ms.p99 <= 40"'))
    tpot, _ = searched(search_file(tmp_path, 'constraint = "tpot_ms.p99 <= 30"'))
    assert (ttft.search.value, tpot.search.value, both.search.value) == (30, 22, 22)


def test_one_constraint_says_what_it_always_said(tmp_path):
    single, _ = searched(search_file(tmp_path, 'constraint = "ttft_ms.p99 <= 40"'))
    assert single.search.message == "largest cost_model.base_ms with ttft_ms.p99 <= 40: 30 (31 fails)"
    listed, _ = searched(search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 40"]'))
    assert listed.search.message == single.search.message and listed.constraint == single.constraint
    summary = summary_dict(run_experiment(load(search_file(tmp_path, 'constraint = "ttft_ms.p99 <= 40"'))))
    assert "constraints" not in summary["studies"][0]


def test_summary_json_lists_the_constraints_and_reads_back(tmp_path):
    path = search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]')
    path.write_text(path.read_text().replace('reports = ["table"]', 'reports = ["table", "json"]'))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--jobs", "1", "--no-plots"]) == 0
    text = (out / "summary.json").read_text()
    study = json.loads(text)["studies"][0]
    assert study["constraint"] == "ttft_ms.p99 <= 40 and tpot_ms.p99 <= 30"
    assert study["constraints"] == ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]
    assert study["search"]["message"].endswith("22 (23 fails: tpot_ms.p99 = 31)")
    assert summary_problem(json.loads(text)) is None
    back = load_results(out).studies[0]
    assert back.constraint == "ttft_ms.p99 <= 40 and tpot_ms.p99 <= 30" and back.search.value == 22
    # two workers probe ahead (speculatively): the same file, byte for byte
    assert main(["run", str(path), "--out", str(tmp_path / "out2"), "--jobs", "3", "--no-plots"]) == 0
    assert (tmp_path / "out2" / "summary.json").read_text() == text


def test_constraint_list():
    assert constraint_list("") == []
    assert constraint_list("ttft_ms.p99 <= 200") == ["ttft_ms.p99 <= 200"]
    assert constraint_list("a.b <= 1 and c > -2") == ["a.b <= 1", "c > -2"]


# -- checked when the file is read -------------------------------------------------------------------


@pytest.mark.parametrize("condition, message", [
    ('constraint = "ttft_ms.p99 <= 40"\nconstraints = ["tpot_ms.p99 <= 30"]',
     '[search]: constraints: give constraint = "..." (one) or constraints = [...] (all must hold), not both'),
    ("constraints = []", "[search]: constraints: name at least one, e.g. ['ttft_ms.p99 <= 200']"),
    ('constraints = ["ttft_ms.p99 <= 40", "tpot_ms.p999 <= 30"]',
     "[search]: constraints: unknown metric 'tpot_ms.p999' (did you mean 'tpot_ms.p99'?)"),
    ('constraints = ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= fast"]',
     "[search]: constraints: bad constraint 'tpot_ms.p99 <= fast': the threshold 'fast' is not a number"),
    ('constraints = ["ttft_ms.p99 <= 40", 30]', "[search]: constraints: every element must be text"),
    ('constraints = "ttft_ms.p99 <= 40"', "[search]: constraints: must be a list of conditions"),
    ('constraints = ["ttft_ms.p99 <= 40", "ttft_ms.p99 <= 40"]',
     "[search]: constraints: lists 'ttft_ms.p99 <= 40' twice"),
    ('constraints = ["ttft_ms.p99 <= 40", "slo.attainment >= 0.9"]',
     "[search]: constraints: 'slo.attainment' needs [slo] targets (ttft_ms, tpot_ms), and run 'two' has none"),
    ("", "[search]: constraint: name the condition to search for"),
    ('constraint = "ttft_ms.p99 <= 500 and tpot_ms.p99 <= 50"',
     "[search]: constraint: bad constraint 'ttft_ms.p99 <= 500 and tpot_ms.p99 <= 50': expected METRIC OP NUMBER"),
])
def test_bad_constraints_are_refused_when_the_file_is_read(tmp_path, condition, message):
    path = search_file(tmp_path, condition)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)


def test_and_in_one_constraint_points_to_the_list(tmp_path):
    with pytest.raises(ConfigError, match=r"for several conditions that must all hold, list them: constraints = "):
        load(search_file(tmp_path, 'constraint = "ttft_ms.p99 <= 500 and tpot_ms.p99 <= 50"'))


def test_slo_metrics_pass_with_slo_targets(tmp_path):
    path = search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 40", "slo.attainment >= 0.9"]',
                       extra="[slo]\nttft_ms = 100\n")
    assert load(path).studies[0].search.texts == ("ttft_ms.p99 <= 40", "slo.attainment >= 0.9")


# -- reports ------------------------------------------------------------------------------------------


def test_the_plot_has_a_panel_per_constraint(tmp_path):
    path = search_file(tmp_path, 'constraints = ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]')
    study, _ = searched(path)
    fig = search_figure(study, 60)
    assert len(fig.axes) == 2
    lines = [{line.get_gid(): line for line in ax.get_lines()} for ax in fig.axes]
    assert list(lines[0]["threshold:0"].get_ydata()) == [40.0, 40.0]
    assert list(lines[1]["threshold:1"].get_ydata()) == [30.0, 30.0]
    # 31 fails both; 23 fails TPOT only: a cross in the TPOT panel, a hollow circle in the TTFT one
    assert lines[0]["search:fails:0"].get_xdata().tolist() == [31.0]
    assert lines[0]["search:holds-here:0"].get_xdata().tolist() == [23.0]
    assert lines[0]["search:holds-here:0"].get_ydata().tolist() == [33.0]
    assert lines[1]["search:fails:1"].get_xdata().tolist() == [31.0, 23.0]
    assert lines[1]["search:fails:1"].get_ydata().tolist() == [39.0, 31.0]
    assert "search:holds-here:1" not in lines[1]
    assert lines[0]["search:passes:0"].get_xdata().tolist() == [0.0, 1.0, 3.0, 7.0, 15.0, 19.0, 21.0, 22.0]
    assert list(lines[1]["chosen:1"].get_xdata()) == [22.0, 22.0]
    assert (lines[1]["chosen:probe:1"].get_xdata()[0], lines[1]["chosen:probe:1"].get_ydata()[0]) == (22.0, 30.0)
    assert "23 fails: tpot_ms.p99 = 31" in fig._suptitle.get_text().replace("\n", " ")
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]


def test_the_lab_tune_target_is_the_ttft_threshold():
    assert tune_target("ttft_ms.p99 <= 200") == 200
    assert tune_target("tpot_ms.p99 <= 50") == 50
    assert tune_target("tpot_ms.p99 <= 50 and ttft_ms.p99 <= 300") == 300
    assert tune_target("tpot_ms.p99 <= 50 and e2e_ms.p99 <= 900") == 50


# -- --set of [search], [sweep] and [plan] --------------------------------------------------------------

RUNS = """
[[runs]]
name = "top"

[[runs]]
name = "own"
search = {key = "cost_model.base_ms", low = 0, high = 10, constraint = "tpot_ms.p99 <= 30"}
"""


def two_runs(tmp_path, name="runs.toml"):
    return _write(tmp_path, HEAD + textwrap.dedent("""
        [search]
        key = "cost_model.base_ms"
        low = 0
        high = 60
        constraint = "ttft_ms.p99 <= 40"
        """) + RUNS, name)


def _write(tmp_path, text, name="runs.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def highs(path, overrides):
    return {s.name: s.search.high for s in load(path, overrides).studies}


def test_set_search_reaches_the_top_level_table_and_every_runs_own(tmp_path):
    path = two_runs(tmp_path)
    assert highs(path, []) == {"top": 60, "own": 10}
    assert highs(path, ["search.high=64"]) == {"top": 64, "own": 64}
    assert highs(path, ["runs.own.search.high=32"]) == {"top": 60, "own": 32}
    assert highs(path, ["runs.top.search.high=32"]) == {"top": 32, "own": 10}
    assert highs(path, ["search.high=64", "runs.own.search.high=5"]) == {"top": 64, "own": 5}  # the run's, last


def test_set_a_whole_search_and_the_constraints(tmp_path):
    path = two_runs(tmp_path)
    exp = load(path, ['search={key = "cost_model.base_ms", low = 0, high = 8, '
                      'constraints = ["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]}'])
    both = ("ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30")
    assert [(s.search.high, s.search.texts) for s in exp.studies] == [(8, both), (8, both)]
    # a --set of constraints replaces the file's constraint (and the other way round): not "both"
    exp = load(path, ['runs.top.search.constraints=["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]'])
    assert [s.search.texts for s in exp.studies] == [("ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"),
                                                     ("tpot_ms.p99 <= 30",)]
    study = run_experiment(load(path, ['runs.top.search.constraints=["ttft_ms.p99 <= 40", "tpot_ms.p99 <= 30"]',
                                       "runs.own.search.high=2"])).studies[0]
    assert study.search.message.endswith(": 22 (23 fails: tpot_ms.p99 = 31)")


@pytest.mark.parametrize("overrides, message", [
    (["search.high=inf"], "two.toml: [[runs]] 'top' [search]: high: must be a finite number, got inf "
                          "(from --set search.high=inf)"),
    (["search.hgh=3"], "two.toml: [[runs]] 'top' [search]: unknown key 'hgh' (did you mean 'high'?) "
                       "(from --set search.hgh=3, which sets it for every run); valid keys: "),
    (["runs.own.search.hgh=3"], "two.toml: [[runs]] 'own' [search]: unknown key 'hgh' (did you mean 'high'?) "
                                "(from --set runs.own.search.hgh=3); valid keys: "),
    (['search.constraints=["ttft_ms.p999 <= 3"]'],
     "two.toml: [[runs]] 'top' [search]: constraints: unknown metric 'ttft_ms.p999' (did you mean 'ttft_ms.p99'?)"),
    (['runs.own.search.constraint="slo.attainment >= 0.9"'],
     "two.toml: [[runs]] 'own' [search]: constraint: 'slo.attainment' needs [slo] targets (ttft_ms, tpot_ms), and "
     "run 'own' has none (from --set 'runs.own.search.constraint=\"slo.attainment >= 0.9\"')"),
    (["runs.own.search.low=-5"], "two.toml: [[runs]] 'own' [cost_model]: base_ms: must be >= 0.0, got -5.0 "
                                 "(the search's values, with --set runs.own.search.low=-5)"),
    (["search=5"], "two.toml: --set search=5: [search] must be a table, e.g. --set 'search={...}'"),
    (["plan.max_instances=8"], "two.toml: --set plan.max_instances=8: the file (top level or any [[runs]] entry) "
                               "has no [plan] table to set 'max_instances' in; give a whole one: --set 'plan={...}'"),
    (["runs.own.sweep.workload.rate=[1, 2]"],
     "two.toml: [[runs]] 'own': --set 'runs.own.sweep.workload.rate=[1, 2]': this run has no [sweep] table to set "
     "'workload.rate' in; give a whole one: --set 'runs.own.sweep={...}'"),
    (['sweep={"scheduler.max_num_seqs" = [8, 16]}'],
     "two.toml: [[runs]] 'top': a run can have one of sweep, search or plan, not several "
     "(with --set 'sweep={\"scheduler.max_num_seqs\" = [8, 16]}')"),
    (["nope.x=1"], "--set nope.x: the first part must be one of workload, "),
])
def test_set_errors_name_the_set(tmp_path, overrides, message):
    path = two_runs(tmp_path, "two.toml")
    with pytest.raises(ConfigError) as info:
        load(path, overrides)
    text = str(info.value).replace(f"{tmp_path}/", "")
    assert text.startswith(message), text


SWEEP = HEAD + """
[[runs]]
name = "grid"
sweep = {"cost_model.base_ms" = [1, 2], scheduler = {max_num_seqs = [4, 8]}}
"""


def points(path, overrides):
    return [sorted(p.items()) for p in load(path, overrides).studies[0].sweep]


@pytest.mark.parametrize("override, expected", [
    ('sweep={"scheduler.max_num_seqs" = [8, 16]}', [[("scheduler.max_num_seqs", 8)], [("scheduler.max_num_seqs", 16)]]),
    ('runs.grid.sweep={"scheduler.max_num_seqs" = [16]}', [[("scheduler.max_num_seqs", 16)]]),
    ('sweep."cost_model.base_ms"=[3]', [[("cost_model.base_ms", 3), ("scheduler.max_num_seqs", 4)],
                                        [("cost_model.base_ms", 3), ("scheduler.max_num_seqs", 8)]]),
    ("sweep.cost_model.base_ms=[3]", [[("cost_model.base_ms", 3), ("scheduler.max_num_seqs", 4)],
                                      [("cost_model.base_ms", 3), ("scheduler.max_num_seqs", 8)]]),
    # an axis the file writes nested (TOML's unquoted dotted key) is set there, not given twice
    ("runs.grid.sweep.scheduler.max_num_seqs=[2]", [[("cost_model.base_ms", 1), ("scheduler.max_num_seqs", 2)],
                                                    [("cost_model.base_ms", 2), ("scheduler.max_num_seqs", 2)]]),
    ("sweep.scheduler.max_num_batched_tokens=[512]",
     [[("cost_model.base_ms", b), ("scheduler.max_num_batched_tokens", 512), ("scheduler.max_num_seqs", s)]
      for b in (1, 2) for s in (4, 8)]),
])
def test_set_sweep(tmp_path, override, expected):
    assert points(_write(tmp_path, SWEEP), [override]) == expected


def test_set_sweep_errors_name_the_set(tmp_path):
    path = _write(tmp_path, SWEEP)
    with pytest.raises(ConfigError, match=r"\[sweep\]: 'cost_model.base_ms' lists 3 twice "
                                          r"\(with --set 'sweep.cost_model.base_ms=\[3, 3\]'\)$"):
        load(path, ["sweep.cost_model.base_ms=[3, 3]"])
    with pytest.raises(ConfigError, match=r"\[cost_model\]: base_ms: must be >= 0.0, got -1.0 "
                                          r"\(the sweep's values, with --set 'sweep.cost_model.base_ms=\[-1\]'\)$"):
        load(path, ["sweep.cost_model.base_ms=[-1]"])
    with pytest.raises(ConfigError, match=r"bad key 'sweep.\"a.b': write sweep.\"dotted.key\""):
        load(path, ['sweep."a.b=[1]'])


def test_set_plan(tmp_path):
    path = _write(tmp_path, PLAN, "plan.toml")
    plan = load(path, ["plan.tensor_parallel=[2]", "plan.max_instances=3"]).studies[0].plan
    assert (plan.tensor_parallel, plan.max_instances) == ((2,), 3)
    plan = load(path, ['plan.space."scheduler.max_num_seqs"=[16]', "plan.gpus.l4=0.5"]).studies[0].plan
    assert plan.space == {"scheduler.max_num_seqs": [16]} and plan.gpus == {"l4": 0.5, "a100-40gb": 1.3}
    plan = load(path, ["plan.min_instances=2"]).studies[0].plan
    assert plan.min_instances == 2
    with pytest.raises(ConfigError) as info:
        load(path, ["plan.tensor_parallel=[0]"])
    assert str(info.value) == (f"{path}: [plan]: tensor_parallel: must be whole numbers >= 1, got [0] "
                               "(from --set 'plan.tensor_parallel=[0]')")


@pytest.mark.parametrize("text, message", [
    ("slo.attainment >= 99", "slo.attainment is a share from 0 to 1, so it never holds; did you mean 0.99?"),
    ("per_class.chat.slo.attainment > 1.5", "per_class.chat.slo.attainment is a share from 0 to 1, so it never holds"),
    ("prefix_cache.hit_rate <= -0.1", "prefix_cache.hit_rate is a share from 0 to 1, so it never holds"),
])
def test_a_share_past_its_range_is_refused(text, message):
    """slo.attainment >= 99 (a percent) searched every candidate, then advised more instances."""
    with pytest.raises(ConfigError, match=rf"^bad constraint '{re.escape(text)}': {re.escape(message)}$"):
        parse_constraint(text)
    assert str(parse_constraint("slo.attainment >= 0.99")) == "slo.attainment >= 0.99"
