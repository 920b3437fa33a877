"""schedlab hunt (issue 22): the expression language, the search space, the shrinker, the
search, and planted bugs with a known worst case that a hunt must find and shrink."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedlab
from schedlab.configs import float_field, int_field
from schedlab.errors import ConfigError
from schedlab.hunt.expression import parse_condition, parse_expression
from schedlab.hunt.evaluate import Score
from schedlab.hunt.hunt import load_hunt, replay_value, run_hunt, worst_of_both
from schedlab.hunt.optimize import Trial
from schedlab.hunt.output import requests_jsonl
from schedlab.hunt.report import summary, summary_lines, write_outcome
from schedlab.hunt.space import Candidate, gamma_gaps_s, make_space, workload_stats
from schedlab.shrinking import greedy_shrink, lower_values, removals
from schedlab.study.executor import InProcessExecutor
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler


# -- planted bugs: third-party schedulers with a known worst case --------------------------------


@attrs.frozen
class StarverConfig:
    max_num_seqs: int = int_field(8, min=1, help="running cap")
    long_prompt: int = int_field(1000, min=1, help="prompts longer than this wait while others run or wait")


class LongPromptStarver:
    """FCFS, except that a prompt longer than ``long_prompt`` tokens is admitted only when no
    other request runs: a steady stream of short requests starves it (planted bug 1)."""

    def __init__(self, config: StarverConfig):
        self.config = config
        self.slots = config.max_num_seqs

    def schedule(self, plan):
        plan.decode_all()
        running = len(plan.running)
        for seq in list(plan.waiting):
            if running >= self.config.max_num_seqs:
                break
            if seq.request.prompt_tokens > self.config.long_prompt and running > 0:
                continue
            if not plan.admit(seq, seq.num_tokens, reserve=True):
                break
            running += 1


@attrs.frozen
class NervousConfig:
    high_water: float = float_field(0.9, min=0.0, max=1.0, help="KV share above which it preempts")


class NervousPreempter(ContinuousScheduler):
    """vLLM-style continuous batching that preempts its newest running request whenever the KV
    cache is above ``high_water`` -- and readmits it next iteration: with two requests that
    fill the cache it preempts in a loop (planted bug 2)."""

    stable_between_events = False

    def __init__(self, config: NervousConfig):
        super().__init__(ContinuousConfig(allocation="grow", max_num_seqs=8, max_num_batched_tokens=4096))
        self.high_water = config.high_water

    def schedule(self, plan):
        super().schedule(plan)
        kv = plan.kv
        running = [seq for seq in plan.running if seq not in plan.admitted]
        if len(plan.running) > 1 and running and kv.num_used_blocks() >= self.high_water * kv.num_blocks:
            plan.preempt(running[-1])


class PlantedBugs:
    @schedlab.hookimpl
    def schedlab_register_schedulers(self, register):
        register("long-prompt-starver", LongPromptStarver, config=StarverConfig)
        register("nervous-preempter", NervousPreempter, config=NervousConfig)


STARVER = """
    [experiment]
    name = "starver"
    seed = 3
    [kv_cache]
    kind = "paged"
    num_blocks = 4096
    [[runs]]
    name = "buggy"
    scheduler = {kind = "long-prompt-starver", long_prompt = 1000}
    [[runs]]
    name = "fcfs"
    scheduler = {kind = "continuous", max_num_seqs = 8}
    [hunt]
    property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"
    [hunt.workload]
    requests = [1, 20]
    rate = [1.0, 50.0]
    cv = [0.0, 4.0]
    prompt = [1, 2000]
    output = [1, 200]
"""

NERVOUS = """
    [experiment]
    name = "nervous"
    seed = 5
    [kv_cache]
    kind = "paged"
    num_blocks = 64
    block_size = 16
    [[runs]]
    name = "buggy"
    scheduler = {kind = "nervous-preempter"}
    [hunt]
    property = "runs.buggy.num_preemptions / workload.requests < 2"
    [hunt.workload]
    requests = [1, 20]
    rate = [1.0, 50.0]
    cv = [0.0, 4.0]
    prompt = [1, 600]
    output = [1, 400]
"""


def write(tmp_path, text: str, name: str = "hunt.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def hunt_in_process(path, overrides=()):
    hunt = load_hunt(path, list(overrides), plugin_objects=(PlantedBugs(),))
    return hunt, run_hunt(hunt, InProcessExecutor())


def test_hunt_finds_the_starved_long_prompt_and_shrinks_it_to_its_minimal_form(tmp_path):
    hunt, outcome = hunt_in_process(write(tmp_path, STARVER), ["hunt.random=0"])
    assert hunt.config.budget == 400, "the default budget"
    assert outcome.worst is not None and hunt.goal.found(outcome.worst.score.value)
    assert len(outcome.search) <= hunt.config.budget
    rows = outcome.shrunk.rows
    # the known minimal form: one long prompt, and one short request keeping the server busy
    assert len(rows) == 2
    assert sorted(r["prompt_tokens"] > 1000 for r in rows) == [False, True]
    assert hunt.goal.found(outcome.shrunk_score.value)
    write_outcome(hunt, outcome, tmp_path)
    replayed = replay_value(tmp_path / "counterexample.toml", hunt.goal, plugin_objects=(PlantedBugs(),))
    assert replayed == outcome.shrunk_score.value and replayed >= 3


def test_hunt_finds_the_preemption_loop_and_shrinks_it_to_the_requests_that_fill_the_cache(tmp_path):
    hunt, outcome = hunt_in_process(write(tmp_path, NERVOUS), ["hunt.random=0"])
    assert hunt.goal.found(outcome.worst.score.value)
    rows = outcome.shrunk.rows
    assert 2 <= len(rows) <= 5
    # the known minimal form: requests that together fill 90% of the cache, each needed
    assert sum(-(-(r["prompt_tokens"] + r["output_tokens"]) // 16) for r in rows) >= 0.9 * 64
    assert outcome.shrunk_score.values["runs.buggy.num_preemptions"] >= 2 * len(rows)
    from schedlab.hunt.evaluate import Evaluator
    from schedlab.hunt.space import Candidate
    from schedlab.study.runner import context_spec

    evaluator = Evaluator(hunt.experiment.studies, context_spec(hunt.experiment), hunt.goal, InProcessExecutor())
    fewer = [Candidate(rows[:i] + rows[i + 1:], {}) for i in range(len(rows))]
    assert not any(hunt.goal.found(score.value) for score, _ in evaluator.evaluate(fewer)), "1-minimal"


def test_the_same_seed_gives_the_same_hunt(tmp_path):
    path = write(tmp_path, STARVER)
    first = hunt_in_process(path, ["hunt.budget=40", "hunt.random=10", "hunt.shrink_budget=30"])[1]
    again = hunt_in_process(path, ["hunt.budget=40", "hunt.random=10", "hunt.shrink_budget=30"])[1]
    assert [t.score.value for t in first.search] == [t.score.value for t in again.search]
    assert [t.x for t in first.random] == [t.x for t in again.random]
    assert first.shrunk == again.shrunk
    other = hunt_in_process(path, ["hunt.budget=40", "hunt.random=10", "experiment.seed=4"])[1]
    assert [t.x for t in other.search] != [t.x for t in first.search]


def test_a_hunt_gives_the_same_answer_on_worker_processes(tmp_path):
    """--jobs 2: plugin modules rebuilt in each worker, results in submission order."""
    (tmp_path / "planted_mod.py").write_text(textwrap.dedent("""
        import schedlab
        from test_hunt import LongPromptStarver, StarverConfig

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("long-prompt-starver", LongPromptStarver, config=StarverConfig)
        """))
    text = STARVER.replace('name = "starver"', 'name = "starver"\n    plugins = ["planted_mod"]')
    path = write(tmp_path, text)
    overrides = ["hunt.budget=30", "hunt.random=8", "hunt.shrink_budget=20"]
    from schedlab.study.executor import make_executor

    import sys
    sys.path[:0] = [str(tmp_path)]
    try:
        hunt = load_hunt(path, overrides)
        local = run_hunt(hunt, InProcessExecutor())
        executor = make_executor("local", 2)
        try:
            parallel = run_hunt(load_hunt(path, overrides), executor)
        finally:
            executor.close()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("planted_mod", None)
    assert [t.score.value for t in parallel.search] == [t.score.value for t in local.search]
    assert parallel.shrunk == local.shrunk


# -- the expression language ------------------------------------------------------------------


def test_expressions_compute_by_hand():
    values = {"runs.a.ttft_ms.p99": 10.0, "runs.b.ttft_ms.p99": 4.0, "workload.requests": 3.0}
    expr = parse_expression("runs.a.ttft_ms.p99 / runs.b.ttft_ms.p99 + max(1, -2 * 3) - abs(-4) * workload.requests")
    assert expr.value(values.get) == 10 / 4 + 1 - 12
    assert parse_expression("-(1 + 2) * 3").value(values.get) == -9
    assert parse_expression("2 - 3 - 4").value(values.get) == -5, "left-associative"
    assert math.isnan(parse_expression("1 / (2 - 2)").value(values.get)), "division by zero is NaN"
    assert math.isnan(parse_expression("runs.a.missing + 1").value(values.get)), "a missing metric is NaN"


def test_conditions_and_their_violation():
    c = parse_condition("runs.a.ttft_ms.p99 / runs.b.ttft_ms.p99 < 2.0")
    assert (c.op, c.threshold) == ("<", 2.0)
    assert c.holds(1.5) and not c.holds(2.0) and not c.holds(math.nan)
    assert c.violation(1.0) == 0 and c.violation(3.0) == pytest.approx(1.0) and c.violation(math.nan) == math.inf


@pytest.mark.parametrize("text", ["__import__('os')", "runs.a.x +", "1 2", "max(1", "foo(1)", "a < b", ""])
def test_expressions_that_are_not_in_the_grammar_are_refused(text):
    with pytest.raises(ConfigError):
        parse_condition(text + " < 1") if text == "a < b" else parse_expression(text)


@pytest.mark.parametrize("objective, message", [
    ("runs.nope.ttft_ms.p99", "no such run"),
    ("runs.buggy.ttft_ms.p98", "unknown metric 'ttft_ms.p98'"),
    ("workload.nope", "workload statistics"),
    ("ttft_ms.p99", "write runs.<run>.<metric>"),
])
def test_a_misspelt_name_is_refused_when_the_file_is_read(tmp_path, objective, message):
    text = STARVER.replace('property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"',
                           f'objective = "{objective}"')
    with pytest.raises(ConfigError, match=message) as info:
        load_hunt(write(tmp_path, text), plugin_objects=(PlantedBugs(),))
    assert "hunt.toml: [hunt]" in str(info.value)


@pytest.mark.parametrize("old, new, message", [
    ("[hunt]\n", "[hunt]\nbudgit = 3\n", "[hunt]: unknown key 'budgit'"),
    ("requests = [1, 20]", "requests = [20, 1]", "[hunt.workload]: requests: low (20) must be <= high (1)"),
    ("prompt = [1, 2000]", "prompt = [0, 2000]", "[hunt.workload]: prompt"),
    ("[[runs]]\n", "[workload]\nkind = 'synthetic'\n[[runs]]\n", "[workload]: a hunt file has no workload"),
    ("[hunt]\n", "[hunt.settings]\n'scheduler.nope' = [1, 2]\n[hunt]\n", "unknown key 'nope'"),
    ("[hunt]\n", "[hunt]\nobjective = 'runs.buggy.ttft_ms.p99'\n", "give either objective"),
    # neither: it used to say "not both" too
    ('property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"', "",
     "give an objective (to maximise) or a property (to falsify): the hunt needs one"),
    # found by fuzzing: the whole budget ran before the hunt said the objective had no value
    ('property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"',
     'objective = "runs.buggy.ttft_ms.p99 / (2 - 2)"', "divides by a constant 0: it has no value for any workload"),
])
def test_bad_hunt_tables_name_the_file_table_and_key(tmp_path, old, new, message):
    text = textwrap.dedent(STARVER).replace(old, new, 1)
    with pytest.raises(ConfigError) as info:
        load_hunt(write(tmp_path, text), plugin_objects=(PlantedBugs(),))
    assert message in str(info.value) and "hunt.toml: [" in str(info.value)  # (the space's lacked the colon)


def test_a_file_without_hunt_table_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"no \[hunt\] table"):
        load_hunt(write(tmp_path, "[workload]\nkind = 'synthetic'\n"))


# -- the search space -------------------------------------------------------------------------

SPACE = {"requests": [2, 9], "rate": [1.0, 8.0], "cv": [0.0, 4.0], "prompt": [16, 4096], "output": [1, 512],
         "classes": {"chat": {}, "batch": {"prompt": [1000, 8000], "priority": 1}},
         "prefix": {"groups": 3, "tokens": [100, 1000], "share": [0.0, 1.0]}}


@settings(max_examples=200)
@given(st.lists(st.floats(0, 1), min_size=64, max_size=64))
def test_every_point_of_the_cube_decodes_to_a_workload_within_the_bounds(genes):
    space = make_space(SPACE, {"scheduler.max_num_seqs": [1, 8]}, "t")
    x = np.resize(np.array(genes), space.dimension)
    candidate = space.decode(x)
    rows = candidate.rows
    assert 2 <= len(rows) <= 9 and 1 <= candidate.settings["scheduler.max_num_seqs"] <= 8
    arrivals = [r["arrival_ms"] for r in rows]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals)
    for r in rows:
        klass = space.class_of(r)
        own = r["prompt_tokens"] - r["prefix_tokens"]
        assert klass.prompt[0] <= own <= klass.prompt[1] and klass.output[0] <= r["output_tokens"] <= klass.output[1]
        assert r["priority"] == (1 if r["request_class"] == "batch" else 0)
        assert (r["prefix_group"] is None) == (r["prefix_tokens"] == 0)


def test_even_gaps_at_cv_zero_and_gamma_quantiles_otherwise():
    assert gamma_gaps_s(np.array([0.1, 0.9]), 4.0, 0.0).tolist() == [0.25, 0.25]
    median = gamma_gaps_s(np.array([0.5]), 2.0, 1.0)[0]  # exponential: median ln 2 / rate
    assert median == pytest.approx(math.log(2) / 2.0)


def test_workload_statistics_by_hand():
    rows = [{"arrival_ms": 0.0, "prompt_tokens": 10, "output_tokens": 2},
            {"arrival_ms": 2000.0, "prompt_tokens": 30, "output_tokens": 4}]
    stats = workload_stats(rows)
    assert stats["rate_rps"] == 0.5 and stats["duration_s"] == 2.0 and stats["tokens_per_s"] == 23.0
    assert stats["max_gap_s"] == 2.0
    assert stats["prompt_tokens.mean"] == 20 and stats["output_tokens.max"] == 4


# -- the shrinker -----------------------------------------------------------------------------


def test_lower_values_try_the_least_first_then_smaller_steps():
    assert lower_values(100, 1) == [1, 51, 76, 88, 94, 97, 99]
    assert lower_values(5, 5) == [] and lower_values(6, 5) == [5]


def test_removals_drop_halves_then_single_items():
    assert list(removals([1, 2, 3, 4])) == [[3, 4], [1, 2], [2, 3, 4], [1, 3, 4], [1, 2, 4], [1, 2, 3]]


@settings(max_examples=60)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=12), st.integers(1, 400), st.integers(1, 5))
def test_greedy_shrink_reaches_a_minimum_whatever_its_width(items, total, width):
    def interesting(state):
        return sum(state) >= total

    if not interesting(items):
        return

    def smaller(state):
        for i, v in enumerate(state):
            for low in lower_values(v, 1):
                yield state[:i] + [low] + state[i + 1:]

    def fewer(state):
        yield from removals(state)

    one, used_one = greedy_shrink(items, interesting, (fewer, smaller), max_evaluations=100_000)
    wide, used_wide = greedy_shrink(items, interesting, (fewer, smaller), max_evaluations=100_000, width=width)
    assert one == wide and used_one == used_wide, "evaluating several at once changes nothing"
    assert sum(one) == total or (len(one) == 1 and one[0] <= total), "no token can go"


@pytest.mark.parametrize("width", [1, 3])
def test_greedy_shrink_spends_at_most_its_budget(width):
    """The budget counts evaluations up to each success (what one-at-a-time would spend); a
    batch may evaluate up to ``width - 1`` more past a success, never more than width x budget."""
    calls = []
    _, used = greedy_shrink(list(range(1000)), lambda s: calls.append(s) or True, (removals,), max_evaluations=7,
                            width=width, interesting_many=lambda batch: [calls.append(s) or True for s in batch])
    assert used == 7 and (len(calls) == 7 if width == 1 else 7 < len(calls) <= 7 * width)


# -- files: request file and reproducer --------------------------------------------------------


def test_inline_and_file_workloads_run_the_same_requests(tmp_path):
    from schedlab.study.experiment import load, run_experiment

    rows = [{"arrival_ms": 0.0, "prompt_tokens": 300, "output_tokens": 7, "priority": 1},
            {"arrival_ms": 1.5, "prompt_tokens": 20, "output_tokens": 30, "priority": 0}]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    inline = "[workload]\nkind = 'inline'\nrequests = [" + ", ".join(
        "{" + ", ".join(f"{k} = {v}" for k, v in r.items()) + "}" for r in rows) + "]\n"
    (tmp_path / "a.toml").write_text(inline + "[scheduler]\nkind = 'continuous'\npolicy = 'priority'\n")
    (tmp_path / "b.toml").write_text("[workload]\nkind = 'file'\npath = 'r.jsonl'\n"
                                     "[scheduler]\nkind = 'continuous'\npolicy = 'priority'\n")
    a = run_experiment(load(tmp_path / "a.toml")).all_runs()[0]
    b = run_experiment(load(tmp_path / "b.toml")).all_runs()[0]
    for column in ("arrival_ms", "first_token_ms", "finish_ms", "prompt_tokens"):
        assert a.requests[column].tolist() == b.requests[column].tolist()


def test_the_cli_writes_a_reproducer_that_schedlab_run_replays(tmp_path, capsys):
    from schedlab.cli import main

    text = STARVER.replace("long-prompt-starver", "continuous").replace(", long_prompt = 1000", ", max_num_seqs = 2")
    text = text.replace('property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"',
                        'objective = "runs.buggy.ttft_ms.p99 / runs.fcfs.ttft_ms.p99"\n'
                        'constraints = ["runs.fcfs.busy_share <= 0.9"]')
    text = text.replace("[hunt.workload]", "[hunt.settings]\n    'runs.buggy.scheduler.max_num_seqs' = [1, 4]\n"
                                           "    [hunt.workload]")
    path = write(tmp_path, text)
    out = tmp_path / "out"
    assert main(["hunt", str(path), "--out", str(out), "--jobs", "1", "--set", "hunt.budget=30",
                 "--set", "hunt.random=10", "--set", "hunt.shrink_budget=40",
                 "--set", "runs.fcfs.scheduler.max_num_seqs=3"]) == 0
    printed = capsys.readouterr()
    assert "replays to" not in printed.err
    summary = json.loads((out / "hunt.json").read_text())
    assert summary["search"]["evaluations"] == 30 and summary["random"]["evaluations"] == 10
    for name in ("counterexample.jsonl", "counterexample.toml", "worst.toml", "search.png", "counterexample.png",
                 "timeline_buggy.png", "timeline_fcfs.png"):
        assert (out / name).stat().st_size > 0
    hunt = load_hunt(path)
    assert replay_value(out / "counterexample.toml", hunt.goal) == summary["shrunk"]["value"]
    chosen = summary["shrunk"]["settings"]["runs.buggy.scheduler.max_num_seqs"]
    replay = (out / "counterexample.toml").read_text()
    assert f"scheduler = {{kind = \"continuous\", max_num_seqs = {chosen}}}" in replay, "the hunt's setting"
    assert 'scheduler = {kind = "continuous", max_num_seqs = 3}' in replay, "--set overrides"
    assert summary["shrunk"]["value"] >= (1 - hunt.config.tolerance) * summary["search"]["worst"]
    assert main(["run", str(out / "counterexample.toml"), "--out", str(tmp_path / "replay"), "--no-plots"]) == 0


def test_a_property_that_holds_everywhere_is_reported_and_nothing_is_shrunk(tmp_path):
    text = STARVER.replace("long-prompt-starver", "continuous").replace(", long_prompt = 1000", "")
    text = text.replace("< 3", "< 1000")
    hunt, outcome = hunt_in_process(write(tmp_path, text), ["hunt.budget=16", "hunt.random=4"])
    assert len(outcome.search) == 16 and outcome.shrunk is None
    (tmp_path / "out0").mkdir()
    written = write_outcome(hunt, outcome, tmp_path / "out0")
    assert {p.name for p in written} == {"hunt.json", "search.png", "summary.txt"}
    assert "property held on every feasible workload (all 20)" in (tmp_path / "out0" / "summary.txt").read_text()


def test_constraints_nothing_meets_leave_no_counterexample(tmp_path):
    text = STARVER.replace('[hunt]\n', '[hunt]\n    constraints = ["workload.requests > 100"]\n')
    hunt, outcome = hunt_in_process(write(tmp_path, text), ["hunt.budget=8", "hunt.random=0"])
    assert outcome.worst is None and outcome.shrunk is None
    assert all(t.score.violation > 0 for t in outcome.search)


def test_validate_checks_a_hunt_file_and_run_points_to_hunt(tmp_path, capsys):
    from schedlab.cli import main

    path = write(tmp_path, STARVER.replace("long-prompt-starver", "continuous").replace(", long_prompt = 1000", ""))
    assert main(["validate", str(path)]) == 0
    assert "OK (hunt: falsify runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3" in capsys.readouterr().out
    assert main(["run", str(path)]) == 2
    assert "a hunt file ([hunt]): run it with schedlab hunt" in capsys.readouterr().err
    assert main(["hunt", str(path), "--set", "hunt.budgit=3"]) == 2
    assert "[hunt]: unknown key 'budgit'" in capsys.readouterr().err


def test_a_time_limit_stops_the_search_early(tmp_path):
    hunt, outcome = hunt_in_process(write(tmp_path, STARVER.replace("< 3", "< 1000")),
                                    ["hunt.time_limit_s=1e-9", "hunt.random=0"])
    assert len(outcome.search) < hunt.config.budget
    assert f"search stopped at {len(outcome.search)} of 400 (time_limit_s = 1e-09)" in summary_lines(hunt, outcome)


def test_the_summary_says_when_the_search_or_the_shrinker_stopped_short(tmp_path):
    hunt, outcome = hunt_in_process(write(tmp_path, STARVER),
                                    ["hunt.budget=80", "hunt.random=0", "hunt.shrink_budget=3"])
    lines = summary_lines(hunt, outcome)
    assert len(outcome.search) < 80 and outcome.shrink_evaluations == 3
    assert f"search stopped at {len(outcome.search)} of 80: the property is falsified (stop_on_counterexample)" \
        in lines
    assert "shrink budget of 3 used up: a larger one may shrink it further" in lines


def test_an_objective_undefined_everywhere_is_reported_with_why(tmp_path):
    text = STARVER.replace('property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"',
                           'objective = "runs.buggy.ttft_ms.max / (runs.fcfs.ttft_ms.max - runs.fcfs.ttft_ms.max)"')
    hunt, outcome = hunt_in_process(write(tmp_path, text), ["hunt.budget=8", "hunt.random=4"])
    assert outcome.worst is None
    info = summary(hunt, outcome)
    assert info["search"]["undefined"] == 8 and info["random"]["undefined"] == 4
    assert ("the objective was undefined on all 12 workloads (division by zero in "
            "'runs.buggy.ttft_ms.max / (runs.fcfs.ttft_ms.max - runs.fcfs.ttft_ms.max)')") \
        in summary_lines(hunt, outcome)
    expression = parse_expression("runs.a.x / 2 + workload.requests")
    assert expression.why_undefined({"runs.a.x": None, "workload.requests": 1}.get) == \
        "no value for runs.a.x in 'runs.a.x / 2 + workload.requests'"


def test_a_plugin_hunts_reproducer_replays_from_any_folder(tmp_path):
    """The plugin module beside the hunt file is copied beside the reproducer, which a fresh
    ``schedlab run`` in a third folder imports from there."""
    import subprocess
    import sys

    from schedlab.cli import main
    from schedlab.hunt.output import missing_plugins

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.mkdir()
    c.mkdir()
    (a / "hunt_tiny_plugin.py").write_text(textwrap.dedent("""
        import schedlab
        from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("tiny-continuous", ContinuousScheduler, config=ContinuousConfig)
        """))
    text = STARVER.replace('name = "starver"', 'name = "starver"\n    plugins = ["hunt_tiny_plugin"]')
    text = text.replace('scheduler = {kind = "long-prompt-starver", long_prompt = 1000}',
                        'scheduler = {kind = "tiny-continuous", max_num_seqs = 2}')
    text = text.replace('property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"',
                        'objective = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max"')
    path = write(a, text)
    try:
        assert main(["hunt", str(path), "--out", str(b), "--jobs", "1", "--set", "hunt.budget=8",
                     "--set", "hunt.random=0", "--set", "hunt.shrink_budget=4"]) == 0
    finally:
        sys.modules.pop("hunt_tiny_plugin", None)
    assert (b / "hunt_tiny_plugin.py").is_file()
    done = subprocess.run([sys.executable, "-m", "schedlab", "run", str(b / "counterexample.toml"), "--out",
                           str(c / "replay"), "--no-plots"], cwd=c, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert missing_plugins(b, ["hunt_tiny_plugin", "no_such_plugin_module"]) == ["no_such_plugin_module"]


def test_a_reproducer_written_elsewhere_finds_the_files_the_hunt_file_names(tmp_path, monkeypatch):
    """The hunt file names a profile bundle relative to its own folder; the reproducer lives in
    the output folder, so its paths are rewritten relative to that folder and replay from there."""
    import os

    from schedlab.cli import main

    bundle = (Path(__file__).resolve().parents[1] / "experiments" / "data" / "llmservingsim" / "profiles"
              / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16")
    folder = tmp_path / "hunts"
    folder.mkdir()
    profile = os.path.relpath(bundle, folder)
    text = f"""
    [experiment]
    name = "relative"
    seed = 1
    [kv_cache]
    kind = "paged"
    num_blocks = 4096
    [cost_model]
    kind = "profiled"
    profile = "{profile}"
    model = "llama-3.1-8b"
    [[runs]]
    name = "small"
    scheduler = {{kind = "continuous", max_num_seqs = 2}}
    [[runs]]
    name = "large"
    scheduler = {{kind = "continuous", max_num_seqs = 8}}
    [hunt]
    objective = "runs.small.ttft_ms.p99 / runs.large.ttft_ms.p99"
    [hunt.workload]
    requests = [2, 8]
    rate = [1.0, 20.0]
    prompt = [1, 200]
    output = [1, 50]
    """
    path = write(folder, text)
    out = tmp_path / "elsewhere" / "out"
    assert main(["hunt", str(path), "--out", str(out), "--jobs", "1", "--set", "hunt.budget=8",
                 "--set", "hunt.random=0", "--set", "hunt.shrink_budget=4"]) == 0
    replay = (out / "counterexample.toml").read_text()
    rebased = os.path.relpath(bundle, out)
    assert rebased != profile and f'profile = "{rebased}"' in replay
    monkeypatch.chdir(tmp_path)  # the replay resolves paths against its own folder, not the working one
    assert main(["run", str(out / "counterexample.toml"), "--out", str(tmp_path / "replay"), "--no-plots"]) == 0


def test_rebase_paths_rewrites_relative_path_settings_only():
    from schedlab.hunt.output import rebase_paths

    tables = {"cost_model": {"kind": "profiled", "profile": "data/p", "model": "m"},
              "workload": {"kind": "file", "path": "/abs/requests.jsonl", "nested": {"path": "x.csv"}},
              "scheduler": {"kind": "continuous", "policy": "data/p"}}
    rebased = rebase_paths(tables, {"profile", "path"}, "/exp", "/exp/out/hunt")
    assert rebased["cost_model"] == {"kind": "profiled", "profile": "../../data/p", "model": "m"}
    assert rebased["workload"] == {"kind": "file", "path": "/abs/requests.jsonl", "nested": {"path": "../../x.csv"}}
    assert rebased["scheduler"] == tables["scheduler"]  # not a path setting


# -- every name checked when the file is read: settings, optional metrics, deep expressions ------------


def _refused(tmp_path, text: str, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_hunt(write(tmp_path, text), list(overrides), plugin_objects=(PlantedBugs(),))
    return str(info.value)


def _with_objective(objective: str, more: str = "") -> str:
    old = 'property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"'
    return textwrap.dedent(STARVER).replace(old, f'objective = "{objective}"') + textwrap.dedent(more)


@pytest.mark.parametrize("key, message", [
    ("runs.nope.scheduler.max_num_seqs", "runs.nope.scheduler.max_num_seqs: no such run; runs: buggy, fcfs "
                                         "(write runs.<run>.<table>.<key>)"),
    ("workload.rate", "workload.rate: a hunt makes every candidate's workload from [hunt.workload]; "
                      "give workload ranges there"),
    ("runs.fcfs.nope.max_num_seqs", "runs.fcfs.nope.max_num_seqs: write <table>.<key> or runs.<run>.<table>.<key>"),
    ("max_num_seqs", "max_num_seqs: write <table>.<key> or runs.<run>.<table>.<key>"),
])
def test_hunt_settings_name_a_run_and_a_table(tmp_path, key, message):
    text = textwrap.dedent(STARVER) + f'[hunt.settings]\n"{key}" = [4, 64]\n'
    assert _refused(tmp_path, text).startswith(f"{tmp_path / 'hunt.toml'}: [hunt.settings]: {message}")


def test_metrics_a_run_cannot_have_are_refused_when_the_file_is_read(tmp_path):
    where = f"{tmp_path / 'hunt.toml'}: [hunt] objective"
    assert _refused(tmp_path, _with_objective("runs.buggy.slo.attainment")) == (
        f"{where}: runs.buggy.slo.attainment: 'slo.attainment' needs [slo] targets (ttft_ms, tpot_ms), "
        "and run 'buggy' has none")
    assert _refused(tmp_path, _with_objective("runs.buggy.per_class.nope.ttft_ms.p99")) == (
        f"{where}: runs.buggy.per_class.nope.ttft_ms.p99: no request class 'nope'; per_class needs several "
        "classes in [hunt.workload.classes]")
    classes = "[hunt.workload.classes.chat]\n[hunt.workload.classes.batch]\n"
    assert _refused(tmp_path, _with_objective("runs.buggy.per_class.nope.ttft_ms.p99", classes)) == (
        f"{where}: runs.buggy.per_class.nope.ttft_ms.p99: no request class 'nope'; classes: batch, chat")
    hunt = load_hunt(write(tmp_path, _with_objective("runs.buggy.per_class.chat.slo.attainment",
                                                     classes + "[slo]\nttft_ms = 100\n")),
                     plugin_objects=(PlantedBugs(),))
    assert hunt.goal.expression.names == ("runs.buggy.per_class.chat.slo.attainment",)


def test_an_unknown_optimiser_is_refused_when_the_file_is_read(tmp_path):
    text = textwrap.dedent(STARVER).replace("[hunt]\n", "[hunt]\noptimizer = 'NoSuchOpt'\n")
    assert _refused(tmp_path, text).startswith(
        f"{tmp_path / 'hunt.toml'}: [hunt]: optimizer: Nevergrad has no optimiser 'NoSuchOpt'; e.g. "
        "PortfolioDiscreteOnePlusOne")


def test_set_on_the_workload_says_to_set_the_hunts_bounds(tmp_path):
    assert _refused(tmp_path, STARVER, ["workload.rate=3"]) == (
        "--set workload.rate: a hunt makes every candidate's workload from [hunt.workload]; set its range with "
        "--set hunt.workload.rate=[low, high]")
    assert _refused(tmp_path, STARVER, ["runs.fcfs.workload.num_requests=3"]).endswith(
        "set its range with --set hunt.workload.requests=[low, high]")
    hunt = load_hunt(write(tmp_path, STARVER), ["hunt.workload.rate=[2.0, 3.0]"], plugin_objects=(PlantedBugs(),))
    assert hunt.space.workload.rate == (2.0, 3.0)


def test_deep_expressions_are_refused_and_long_sums_evaluate():
    with pytest.raises(ConfigError, match=r"nested more than 50 levels deep \(parentheses, minus signs, function"):
        parse_expression("(" * 250 + "runs.off.ttft_ms.p99" + ")" * 250)
    with pytest.raises(ConfigError, match="nested more than 50 levels deep"):
        parse_expression("-" * 3000 + "1")
    assert parse_expression("(" * 50 + "2" + ")" * 50).value({}.get) == 2.0  # the deepest allowed
    assert parse_expression("- - 3").value({}.get) == 3.0
    total = parse_expression(" + ".join(["runs.a.x"] * 3000) + " - 1")
    assert total.value({"runs.a.x": 0.5}.get) == 1499.0 and total.names == ("runs.a.x",)
    assert parse_expression(" * ".join(["2"] * 1000) + " / 2" * 999).value({}.get) == 2.0


def test_a_condition_may_compare_with_a_negative_number():
    c = parse_condition("runs.off.ttft_ms.p99 - runs.chunked.ttft_ms.p99 > -5")
    assert (c.op, c.threshold, c.text) == (">", -5.0, "runs.off.ttft_ms.p99 - runs.chunked.ttft_ms.p99 > -5")
    assert c.holds(-4.0) and not c.holds(-5.0) and c.violation(-7.0) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="expected EXPRESSION OP NUMBER"):
        parse_condition("runs.a.x > -")


def test_a_worse_workload_from_random_sampling_is_the_one_shrunk_and_written(tmp_path):
    """A one-workload search against 30 random ones: random sampling finds the worse workload,
    and it -- not the search's -- is shrunk, written as worst.* and counterexample.*, and named."""
    text = STARVER.replace("long-prompt-starver", "continuous").replace(", long_prompt = 1000", ", max_num_seqs = 2")
    text = text.replace('property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"',
                        'objective = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max"')
    hunt, outcome = hunt_in_process(write(tmp_path, text),
                                    ["hunt.budget=1", "hunt.random=30", "hunt.shrink_budget=20"])
    searched, sampled = outcome.search_best, outcome.random_best
    assert len(outcome.search) == 1 and searched is not None and sampled.score.value > searched.score.value
    assert outcome.worst is sampled and outcome.worst_from == "random sampling"
    assert outcome.shrunk is not None and outcome.shrunk_score.value >= (1 - hunt.config.tolerance) * \
        sampled.score.value
    written = {p.name for p in write_outcome(hunt, outcome, tmp_path)}
    assert {"worst.toml", "counterexample.toml", "counterexample.png"} <= written
    assert (tmp_path / "worst.jsonl").read_text() == requests_jsonl(sampled.candidate)
    assert replay_value(tmp_path / "worst.toml", hunt.goal, plugin_objects=(PlantedBugs(),)) == sampled.score.value
    assert replay_value(tmp_path / "counterexample.toml", hunt.goal, plugin_objects=(PlantedBugs(),)) == \
        outcome.shrunk_score.value
    info = json.loads((tmp_path / "hunt.json").read_text())
    assert info["worst"]["from"] == "random sampling" and info["worst"]["value"] == sampled.score.value
    assert info["search"]["worst"] == searched.score.value and info["random"]["worst"] == sampled.score.value
    assert (f"the worst came from random sampling ({sampled.score.value:.4g} vs the search's "
            f"{searched.score.value:.4g})") in (tmp_path / "summary.txt").read_text().splitlines()
    again = run_hunt(hunt, InProcessExecutor())  # the same seed: the same choice and the same shrunk workload
    assert again.worst_from == "random sampling" and again.shrunk == outcome.shrunk


@pytest.mark.parametrize("minimize", [False, True])
def test_the_worst_of_both_is_the_searchs_on_a_tie_and_random_samplings_when_the_search_has_none(tmp_path, minimize):
    text = STARVER.replace('property = "runs.buggy.ttft_ms.max / runs.fcfs.ttft_ms.max < 3"',
                           f'objective = "runs.buggy.ttft_ms.max"\n    minimize = {str(minimize).lower()}')
    goal = load_hunt(write(tmp_path, text), plugin_objects=(PlantedBugs(),)).goal
    candidate = Candidate(({"prompt_tokens": 1, "output_tokens": 1, "arrival_ms": 0.0},), {})

    def trial(value, feasible=True):
        score = Score(value if feasible else math.nan, feasible, 0.0 if feasible else 1.0, {})
        return Trial(0, (), candidate, score)

    # goal.direction * 1.0 shows the policy worse than 0.0, minimised or maximised
    search, tie, worse, infeasible = trial(0.0), trial(0.0), trial(goal.direction * 1.0), trial(0.0, feasible=False)

    def check(found, sampled, trial, source):
        chosen, came_from = worst_of_both(found, sampled, goal)
        assert chosen is trial and came_from == source

    check([search], [tie], search, "search")
    check([search], [worse], worse, "random sampling")
    check([worse], [search], worse, "search")
    check([infeasible], [search], search, "random sampling")
    check([search], [], search, "search")
    check([infeasible], [infeasible], None, None)
    check([], [], None, None)


def test_a_hunt_that_meets_no_constraint_says_which_failed(tmp_path):
    """It said only "worst none feasible" after its whole budget."""
    hunt, outcome = hunt_in_process(write(tmp_path, STARVER), ["hunt.budget=6", "hunt.random=2",
                                                               'hunt.constraints=["workload.requests >= 1e9"]'])
    assert outcome.worst is None
    lines = summary_lines(hunt, outcome)
    index = lines.index("no workload met the constraints:")
    low = min(t.score.values["workload.requests"] for t in outcome.search + outcome.random)
    high = max(t.score.values["workload.requests"] for t in outcome.search + outcome.random)
    assert lines[index + 1] == \
        f"  workload.requests >= 1e+09: failed on 8 of 8 workloads (values {low:.4g} to {high:.4g})"
