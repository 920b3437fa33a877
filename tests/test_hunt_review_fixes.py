"""Fixes from the review of ``schedlab hunt`` (/tmp/review_hunt/FINDINGS.md): the shrinker keeps to
the declared space (prefix share, even arrivals), rejected requests are reported and make a
workload infeasible unless ``allow_rejected``, ``hunt.json`` is strict JSON, Ctrl-C keeps what was
found, and errors of ``--set hunt.*`` name the override."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.hunt.hunt import load_hunt, run_hunt
from schedlab.hunt.output import summary_json
from schedlab.hunt.report import summary, summary_lines, write_outcome, write_partial
from schedlab.hunt.space import Candidate, make_space, workload_stats
from schedlab.study.executor import InProcessExecutor

#: ``runs.a.requests / workload.requests`` is 1 on every workload, so the shrinker keeps every
#: candidate it tries: what it reaches is the smallest workload it may build.
BASE = """
    [experiment]
    name = "fixes"
    seed = 1
    [cost_model]
    kind = "linear"
    [[runs]]
    name = "a"
    [[runs]]
    name = "b"
    scheduler = {max_num_seqs = 2}
    [hunt]
    objective = "runs.a.requests / workload.requests"
    budget = 8
    random = 0
    shrink_budget = 300
    [hunt.workload]
    requests = [3, 6]
    rate = [0.5, 8.0]
    cv = [0.0, 4.0]
    prompt = [16, 64]
    output = [1, 4]
"""


def write(tmp_path, text: str, name: str = "hunt.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def hunted(tmp_path, text: str, overrides=()):
    hunt = load_hunt(write(tmp_path, text), list(overrides))
    return hunt, run_hunt(hunt, InProcessExecutor())


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


# -- finding 1: the shrinker keeps to the space ---------------------------------------------------


def test_a_share_of_one_keeps_every_requests_prefix_when_shrinking(tmp_path):
    text = BASE + """
    [hunt.workload.prefix]
    groups = 2
    tokens = [32, 64]
    share = [1.0, 1.0]
    """
    hunt, outcome = hunted(tmp_path, text)
    assert all(r["prefix_group"] is not None for r in outcome.worst.candidate.rows)
    assert len(outcome.shrunk.rows) == 3, "shrunk as far as the space allows"
    assert all(r["prefix_group"] is not None and r["prefix_tokens"] >= 32 for r in outcome.shrunk.rows)
    assert hunt.space.contains(outcome.shrunk)


def test_even_arrivals_stay_even_at_the_declared_rate(tmp_path):
    text = BASE.replace("rate = [0.5, 8.0]", "rate = [2.0, 2.0]").replace("cv = [0.0, 4.0]", "cv = [0.0, 0.0]")
    hunt, outcome = hunted(tmp_path, text)
    arrivals = sorted(r["arrival_ms"] for r in outcome.shrunk.rows)
    assert len(arrivals) == 3 and arrivals[0] == 0.0
    assert np.diff(arrivals).tolist() == [500.0, 500.0]
    assert workload_stats(outcome.shrunk.rows)["rate_rps"] == 2.0


def test_even_arrivals_get_a_rounder_common_gap_within_the_rate_range(tmp_path):
    text = BASE.replace("rate = [0.5, 8.0]", "rate = [2.0, 3.0]").replace("cv = [0.0, 4.0]", "cv = [0.0, 0.0]")
    hunt, outcome = hunted(tmp_path, text)
    gaps = np.diff(sorted(r["arrival_ms"] for r in outcome.shrunk.rows))
    assert np.ptp(gaps) < 1e-9 and 2.0 <= 1000.0 / gaps[0] <= 3.0
    assert float(gaps[0]).is_integer(), "the common gap rounded (to a whole number of ms at least)"
    assert hunt.space.contains(outcome.shrunk)


def test_evenly_spaced_arrivals_are_offered_a_rounder_common_gap_kept_within_the_rate_range():
    from schedlab.hunt.shrink import WorkloadShrinker

    space = _space(rate=[2.0, 3.0])
    gap = 1000.0 / math.e
    candidate = Candidate(_rows([5.0 + i * gap for i in range(4)]), {})
    assert space.contains(candidate)
    offered = [[r["arrival_ms"] for r in c.rows] for c in WorkloadShrinker(space)._rounder_even_gaps(candidate)]
    assert offered == [[5.0, 305.0, 605.0, 905.0], [5.0, 365.0, 725.0, 1085.0], [5.0, 372.0, 739.0, 1106.0]]
    rounding = WorkloadShrinker(space).passes()[3]  # rounder arrival times, only those within the space
    kept = [[r["arrival_ms"] for r in c.rows] for c in rounding(candidate) if c is not None]
    assert [5.0, 365.0, 725.0, 1085.0] in kept and [5.0, 372.0, 739.0, 1106.0] in kept
    assert [5.0, 305.0, 605.0, 905.0] not in kept, "a gap of 300 ms is a rate of 3.33 per second"
    assert all(np.ptp(np.diff(arrivals)) < 1e-9 for arrivals in kept), "every one kept stays even"


def _space(**workload):
    table = {"requests": [1, 6], "rate": [2.0, 2.0], "cv": [0.0, 0.0], "prompt": [16, 64], "output": [1, 4]}
    return make_space({**table, **workload}, {}, "test:")


def _rows(arrivals, **fields):
    return tuple({"arrival_ms": float(a), "prompt_tokens": 16, "output_tokens": 1, **fields} for a in arrivals)


def test_the_space_says_which_workloads_it_could_draw():
    even = _space()
    assert even.contains(Candidate(_rows([0, 500, 1000]), {}))
    assert even.contains(Candidate(_rows([7, 507]), {})), "a shift keeps the gaps"
    assert not even.contains(Candidate(_rows([0, 0, 0, 30]), {}))   # the review's shrunk arrivals
    assert not even.contains(Candidate(_rows([0, 499, 998]), {})), "rate 2.004, not 2"
    assert "requests" in even.outside(Candidate(_rows(range(0, 3500, 500)), {}))
    poisson = _space(cv=[1.0, 1.0], rate=[1.0, 1.0])
    assert poisson.contains(Candidate(_rows([0, 0, 10_000]), {}))
    assert not poisson.contains(Candidate(_rows([0, 30_000]), {})), "a gap no exponential quantile at rate 1 reaches"
    assert _space(cv=[0.0, 4.0], rate=[1.0, 1.0]).contains(Candidate(_rows([0, 30_000]), {}))
    shared = _space(cv=[0.0, 4.0], prefix={"groups": 2, "tokens": [32, 64], "share": [1.0, 1.0]})
    assert shared.contains(Candidate(_rows([0, 1], prefix_group=0, prefix_tokens=40, prompt_tokens=56), {}))
    assert not shared.contains(Candidate(_rows([0, 1], prefix_group=None, prefix_tokens=0), {}))
    mixed = (_rows([0], prefix_group=0, prefix_tokens=40, prompt_tokens=56)
             + _rows([1], prefix_group=0, prefix_tokens=50, prompt_tokens=66))
    assert "prefix group 0 of 50 tokens" in shared.outside(Candidate(mixed, {}))
    assert not _space().contains(Candidate(_rows([0], prompt_tokens=65), {}))


@pytest.mark.parametrize("workload", [
    {},
    {"rate": [0.5, 16.0], "cv": [0.0, 4.0]},
    {"cv": [0.3, 0.3], "prefix": {"groups": 3, "tokens": [8, 64], "share": [1.0, 1.0]}},
    {"cv": [0.0, 2.0], "prefix": {"groups": 2, "tokens": [8, 64], "share": [0.0, 0.0]},
     "classes": {"x": {"priority": 1}, "y": {"prompt": [100, 200]}}},
])
def test_every_point_of_the_cube_decodes_to_a_workload_the_space_contains(workload):
    space = _space(**workload)
    rng = np.random.default_rng(7)
    points = [rng.random(space.dimension) for _ in range(200)]
    points += [np.zeros(space.dimension), np.ones(space.dimension)]
    points += [np.where(rng.random(space.dimension) < 0.5, 0.0, 1.0) for _ in range(20)]  # the clipped corners
    for x in points:
        candidate = space.decode(x)
        assert space.outside(candidate) is None, (space.outside(candidate), candidate)


# -- finding 2: rejected requests -----------------------------------------------------------------


#: run ``a`` rejects prompts of 100 tokens or more (``max_model_len``)
REJECTING = (BASE.replace('name = "a"\n', 'name = "a"\n    scheduler = {max_model_len = 100}\n')
             .replace("prompt = [16, 64]", "prompt = [16, 130]").replace("budget = 8", "budget = 24")
             .replace("shrink_budget = 300", "shrink_budget = 40"))


def test_a_workload_with_rejected_requests_is_infeasible_and_reported(tmp_path):
    assert "max_model_len = 100" in REJECTING
    hunt, outcome = hunted(tmp_path, REJECTING)
    rejected = [t for t in outcome.search if t.score.rejected]
    assert rejected and len(rejected) < len(outcome.search), "some workloads with rejections, some without"
    assert not any(t.score.feasible for t in rejected)
    assert all(set(t.score.rejected) == {"a"} for t in rejected)
    info = summary(hunt, outcome)
    assert info["search"]["rejected"] == len(rejected) and info["allow_rejected"] is False
    assert info["shrunk"]["rejected"] == {"a": 0, "b": 0}
    line = next(x for x in summary_lines(hunt, outcome) if x.startswith("runs rejected requests on"))
    assert line.startswith(f"runs rejected requests on {len(rejected)} of 24 workloads (")
    assert "max_model_len" in line and "counted as infeasible ([hunt] allow_rejected = true counts them)" in line
    out = tmp_path / "out"
    out.mkdir()
    write_outcome(hunt, outcome, out)
    assert "# requests rejected: a 0, b 0" in (out / "counterexample.toml").read_text()
    assert strict_json((out / "hunt.json").read_text())["search"]["rejected"] == len(rejected)


def test_allow_rejected_counts_them_and_the_reproducer_says_how_many(tmp_path):
    text = REJECTING.replace("prompt = [16, 130]", "prompt = [120, 130]")  # every request rejected by run a
    hunt, outcome = hunted(tmp_path, text, ["hunt.allow_rejected=true"])
    assert outcome.worst is not None and outcome.worst.score.feasible
    assert outcome.worst.score.rejected == {"a": len(outcome.worst.candidate.rows)}
    out = tmp_path / "out"
    out.mkdir()
    write_outcome(hunt, outcome, out)
    header = (out / "counterexample.toml").read_text()
    assert f"# requests rejected: a {len(outcome.shrunk.rows)}, b 0" in header
    assert "counted as feasible (allow_rejected = true)" in (out / "summary.txt").read_text()


def test_when_every_workload_had_rejections_the_summary_says_so(tmp_path):
    text = REJECTING.replace("prompt = [16, 130]", "prompt = [120, 130]").replace("budget = 24", "budget = 8")
    hunt, outcome = hunted(tmp_path, text)
    assert outcome.worst is None
    lines = summary_lines(hunt, outcome)
    assert "search: 8 workloads, worst none feasible" in lines
    assert any(x.startswith("runs rejected requests on all 8 workloads (") and "max_model_len" in x for x in lines)
    assert not any("no workload met the constraints" in x for x in lines)


def test_allow_rejected_is_checked_like_the_other_keys(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_hunt(write(tmp_path, REJECTING), ["hunt.allow_rejected=3"])
    assert str(caught.value) == "--set hunt.allow_rejected: [hunt]: allow_rejected: must be true or false, got 3 (int)"
    path = write(tmp_path, REJECTING.replace("[hunt]\n", "[hunt]\n    allow_rejected = 'yes'\n"), "file.toml")
    with pytest.raises(ConfigError, match=r": \[hunt\]: allow_rejected: must be true or false, got 'yes'"):
        load_hunt(path)
    assert load_hunt(write(tmp_path, REJECTING), ["hunt.allow_rejected=true"]).config.allow_rejected


# -- finding 3: strict JSON -----------------------------------------------------------------------


def test_infinite_values_are_written_as_null():
    text = summary_json({"value": math.inf, "values": [-math.inf, math.nan, 1.5], "nested": {"x": math.inf}})
    assert strict_json(text) == {"value": None, "values": [None, None, 1.5], "nested": {"x": None}}


def test_an_objective_that_becomes_infinite_leaves_strict_json(tmp_path):
    text = BASE.replace('objective = "runs.a.requests / workload.requests"',
                        'objective = "runs.a.requests * workload.rate_rps"').replace("requests = [3, 6]",
                                                                                     "requests = [2, 3]")
    hunt, outcome = hunted(tmp_path, text)
    assert outcome.shrunk_score.value == math.inf, "every arrival at once: rate_rps is infinite"
    out = tmp_path / "out"
    out.mkdir()
    write_outcome(hunt, outcome, out)
    info = strict_json((out / "hunt.json").read_text())
    assert info["shrunk"]["value"] is None and info["shrunk"]["values"]["workload.rate_rps"] is None


# -- finding 4: an interrupt keeps what was found ------------------------------------------------


PLUGIN = """
    import os

    import schedlab
    from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler


    class Marking(ContinuousScheduler):
        \"\"\"Continuous batching that notes each run it serves in the file $HUNT_MARKER.\"\"\"

        def __init__(self, config):
            super().__init__(config)
            with open(os.environ.get("HUNT_MARKER", os.devnull), "a") as f:
                f.write("run\\n")


    @schedlab.hookimpl
    def schedlab_register_schedulers(register):
        register("marking", Marking, config=ContinuousConfig)
"""


def test_ctrl_c_during_the_search_writes_what_was_found_so_far(tmp_path):
    """SIGINT once the hunt has scored some workloads (its plugin scheduler marks each scheduler it
    builds in a file -- loading the file builds a few to check them -- so with --jobs 1 and batches
    of 2, the 12th means at least one batch is scored)."""
    (tmp_path / "hunt_marker_plugin.py").write_text(textwrap.dedent(PLUGIN))
    text = BASE.replace('name = "fixes"', 'name = "fixes"\n    plugins = ["hunt_marker_plugin"]')
    text = text.replace('name = "a"\n', 'name = "a"\n    scheduler = {kind = "marking"}\n')
    text = text.replace("budget = 8", "budget = 1000000\n    batch = 2\n    time_limit_s = 600")
    path = write(tmp_path, text)
    marker, out = tmp_path / "marker.txt", tmp_path / "out"
    env = dict(os.environ, HUNT_MARKER=str(marker))
    proc = subprocess.Popen([sys.executable, "-m", "schedlab", "hunt", str(path), "--out", str(out), "--jobs", "1"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300  # (a guard against hanging, not a timing assertion)
        while not (marker.exists() and len(marker.read_text().split()) >= 12):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the hunt never started its runs"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "schedlab: interrupted; what was found so far is written to" in stderr
    info = strict_json((out / "hunt.json").read_text())
    assert info["interrupted"] == "search"
    assert info["search"]["evaluations"] >= 2 and len(info["search"]["values"]) == info["search"]["evaluations"]
    assert info["shrunk"] is None and info["worst"]["value"] == 1.0
    assert "(the hunt was interrupted: the worst workload so far, not shrunk)" in (out / "worst.toml").read_text()
    assert (out / "worst.jsonl").read_text().count("\n") == info["worst"]["requests"]
    assert not (out / "counterexample.toml").exists()
    assert "interrupted during the search" in stdout
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "nothing left half-written"
    try:
        assert main(["run", str(out / "worst.toml"), "--out", str(tmp_path / "replay"), "--no-plots"]) == 0
    finally:
        sys.modules.pop("hunt_marker_plugin", None)


class StopAfter:
    """An in-process executor that raises KeyboardInterrupt (as Ctrl-C would) at its n-th task."""

    workers = 1

    def __init__(self, tasks: int):
        self.inner, self.left = InProcessExecutor(), tasks

    def submit(self, task):
        self.left -= 1
        if self.left < 0:
            raise KeyboardInterrupt
        return self.inner.submit(task)

    def close(self, now: bool = False) -> None:
        pass


def test_an_interrupt_while_shrinking_keeps_the_workload_shrunk_so_far(tmp_path):
    hunt = load_hunt(write(tmp_path, BASE))
    with pytest.raises(KeyboardInterrupt) as caught:
        run_hunt(hunt, StopAfter(2 * 8 + 2 * 5))  # the search's 8 workloads (2 runs each), then 5 shrink steps
    outcome = caught.value.hunt_outcome
    assert outcome.interrupted == "shrinking" and len(outcome.search) == 8
    assert outcome.shrunk is not None and outcome.shrink_evaluations == 5
    assert len(outcome.shrunk.rows) < len(outcome.worst.candidate.rows) and hunt.space.contains(outcome.shrunk)
    out = tmp_path / "out"
    out.mkdir()
    names = {p.name for p in write_partial(hunt, outcome, out)}
    assert names == {"hunt.json", "summary.txt", "worst.jsonl", "worst.toml", "counterexample.jsonl",
                     "counterexample.toml"}
    info = strict_json((out / "hunt.json").read_text())
    assert info["interrupted"] == "shrinking" and info["shrunk"]["requests"] == len(outcome.shrunk.rows)
    assert "interrupted while shrinking: the workload shrunk so far" in (out / "counterexample.toml").read_text()
    assert "interrupted during shrinking (5 evaluations)" in (out / "summary.txt").read_text()


# -- finding 5: --set hunt.* errors name the override --------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("hunt.budjet=3", "--set hunt.budjet: [hunt]: unknown key 'budjet' (did you mean 'budget'?)"),
    ("hunt.budget=abc", "--set hunt.budget: [hunt]: budget: must be a whole number"),
    ("hunt.workload.rate=[3.0, 1.0]", "--set hunt.workload.rate: [hunt.workload]: rate: low (3.0) must be <= high"),
    ('hunt.objective="runs.x.ttft_ms.p99"',
     "--set hunt.objective: [hunt] objective: 'runs.x.ttft_ms.p99': no such run"),
])
def test_errors_of_set_hunt_overrides_name_the_override(tmp_path, override, message):
    path = write(tmp_path, BASE)
    with pytest.raises(ConfigError) as caught:
        load_hunt(path, ["hunt.random=2", override])
    assert str(caught.value).startswith(message), str(caught.value)
    assert str(path) not in str(caught.value)


def test_errors_of_the_file_still_name_the_file_with_overrides_given(tmp_path, capsys):
    path = write(tmp_path, BASE.replace("budget = 8", "budjet = 8"))
    with pytest.raises(ConfigError) as caught:
        load_hunt(path, ["hunt.random=2"])
    assert str(caught.value).startswith(f"{path}: [hunt]: unknown key 'budjet'")
    missing = write(tmp_path, BASE.replace('objective = "runs.a.requests / workload.requests"', ""), "bare.toml")
    assert load_hunt(missing, ['hunt.objective="runs.a.requests / workload.requests"']).goal is not None
    assert main(["hunt", str(path), "--set", "hunt.budjet=3", "--set", "hunt.random=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"schedlab: error: {path}: [hunt]: unknown key 'budjet'"), "the file's, found first"
    good = write(tmp_path, BASE, "good.toml")
    assert main(["hunt", str(good), "--set", "hunt.budjet=3"]) == 2
    assert capsys.readouterr().err.strip().startswith("schedlab: error: --set hunt.budjet: [hunt]: unknown key")


def test_an_interrupt_while_the_reproducer_is_checked_keeps_the_finished_hunt(tmp_path, monkeypatch, capsys):
    """The hunt is done and its files staged when its counterexample is replayed to check it: a
    Ctrl-C then puts them in place, the replay said unchecked (they were thrown away, "no results
    were written": review s80 calhunt)."""
    import schedlab.hunt.hunt as hunt_module
    import schedlab.interrupts as interrupts

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hunt_module, "replay_value", stopped)
    monkeypatch.setattr(interrupts, "by_signal", lambda: True)
    out = tmp_path / "out"
    assert main(["hunt", str(write(tmp_path, BASE)), "--out", str(out), "--jobs", "1", "--set",
                 "hunt.shrink_budget=20"]) == 130
    err = capsys.readouterr().err
    assert "while the counterexample was replayed to check it: the finished hunt is written to" in err
    assert "no results were written" not in err
    info = strict_json((out / "hunt.json").read_text())
    assert "interrupted" not in info or not info["interrupted"]
    assert info["shrunk"] is not None and (out / "counterexample.toml").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "nothing left half-written"


def test_an_interrupt_before_any_workload_was_scored_keeps_the_previous_hunt(tmp_path, monkeypatch, capsys):
    """A Ctrl-C before the first evaluation wrote a hunt.json of no evaluations and a summary in
    place of a finished hunt's folder: its counterexample and reproducer were gone (review s81
    badinput, finding 8). With nothing found, nothing is written."""
    import schedlab.hunt.hunt as hunt_module
    import schedlab.interrupts as interrupts

    path = write(tmp_path, BASE)
    out = tmp_path / "out"
    assert main(["hunt", str(path), "--out", str(out), "--jobs", "1", "--set", "hunt.shrink_budget=20"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert "counterexample.toml" in before

    def stopped_at_once(hunt, *args, **kwargs):
        exc = KeyboardInterrupt()
        exc.hunt_outcome = hunt_module.HuntOutcome(goal=hunt.goal, search=[], random=[], worst=None,
                                                   interrupted=hunt_module.SEARCH)
        raise exc

    monkeypatch.setattr(hunt_module, "hunt_on", stopped_at_once)
    monkeypatch.setattr(interrupts, "by_signal", lambda: True)
    capsys.readouterr()
    assert main(["hunt", str(path), "--out", str(out), "--jobs", "1"]) == 130
    assert "interrupted before any workload was evaluated; no results were written" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".out")]
