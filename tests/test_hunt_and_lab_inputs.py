"""Hunt and lab-report inputs that passed ``validate`` and then crashed or failed late: float bounds
in ``[hunt.workload]``, ``runs`` that is no array in a hunt file, and ``[reports.lab]`` run names."""

from __future__ import annotations

import textwrap

import pytest

from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.hunt.hunt import load_hunt
from schedlab.study.experiment import load

HUNT = """
    [experiment]
    name = "tiny_hunt"
    seed = 1
    [cost_model]
    kind = "linear"
    [[runs]]
    name = "a"
    [[runs]]
    name = "b"
    scheduler = {max_num_seqs = 2}
    [hunt]
    budget = 2
    shrink_budget = 0
    objective = "runs.a.ttft_ms.p99 / runs.b.ttft_ms.p99"
    [hunt.workload]
    requests = [2, 4]
    rate = [0.5, 8.0]
    prompt = [16, 64]
    output = [1, 4]
"""

LAB = """
    [experiment]
    name = "tiny_lab"
    reports = ["lab"]
    [workload]
    kind = "synthetic"
    num_requests = 4
    arrival = "all-at-once"
    prompt = {dist = "fixed", value = 32}
    output = {dist = "fixed", value = 4}
    [cost_model]
    kind = "linear"
    [[runs]]
    name = "static"
    scheduler = {kind = "static", batch_size = 2}
    [[runs]]
    name = "continuous"
    [[runs]]
    name = "sw"
    sweep = {"scheduler.max_num_seqs" = [2, 4]}
"""


def write(tmp_path, text: str, name: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def refused(capsys, argv) -> str:
    """The one error line of ``schedlab ARGV``, which must exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# -- G2: bounds of whole numbers ------------------------------------------------------------------


@pytest.mark.parametrize("old, new, overrides, shown", [
    ("requests = [2, 4]", "requests = [2, 4.0]", [], "[2, 4.0]"),   # a whole float: refused as int_field does
    ("requests = [2, 4]", "requests = [2, 4.5]", [], "[2, 4.5]"),
    ("", "", ["hunt.workload.requests=1e3"], "1000.0"),
])
def test_a_float_requests_bound_is_refused_by_validate_and_hunt_alike(tmp_path, capsys, old, new, overrides, shown):
    path = write(tmp_path, HUNT.replace(old, new), "hunt.toml")
    sets = [arg for o in overrides for arg in ("--set", o)]
    where = "--set hunt.workload.requests" if overrides else path  # an override's error names the override
    message = f"schedlab: error: {where}: [hunt.workload]: requests: must be whole numbers, got {shown}"
    assert refused(capsys, ["validate", path, *sets]) == message
    assert refused(capsys, ["hunt", path, *sets, "--out", str(tmp_path / "out"), "-j", "1"]) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["prompt", "output"])
def test_whole_float_token_bounds_are_refused(tmp_path, key):
    path = write(tmp_path, HUNT.replace(f"{key} = [", f"{key} = [1.0, 2.0]\n#"), "hunt.toml")
    with pytest.raises(ConfigError) as info:
        load_hunt(path)
    assert str(info.value) == f"{path}: [hunt.workload]: {key}: must be whole numbers, got [1.0, 2.0]"


def test_a_set_of_the_whole_hunt_table_says_to_give_one_of_its_keys(tmp_path):
    """It listed the run tables and runs.<run name>, but not hunt.<key>, which a hunt file takes."""
    with pytest.raises(ConfigError) as info:
        load_hunt(write(tmp_path, HUNT, "hunt.toml"), ["hunt=1"])
    assert str(info.value) == "--set hunt: give a key of the [hunt] table (hunt.budget=50, hunt.workload.requests=20)"


def test_whole_number_bounds_still_load(tmp_path):
    hunt = load_hunt(write(tmp_path, HUNT, "hunt.toml"))
    assert hunt.space.max_requests == 4 and isinstance(hunt.space.dimension, int)


# -- G3: runs that is not an array of tables --------------------------------------------------------


@pytest.mark.parametrize("runs", ["5", "true", "'abc'", "[1, 2]"])
def test_a_hunt_file_whose_runs_is_no_array_of_tables_is_refused(tmp_path, capsys, runs):
    text = textwrap.dedent(HUNT).replace("[[runs]]\nname = \"a\"\n[[runs]]\nname = \"b\"\n"
                                         "scheduler = {max_num_seqs = 2}\n", "")
    path = write(tmp_path, f"runs = {runs}\n" + text, "hunt.toml")
    message = f"schedlab: error: {path}: runs must be an array of tables ([[runs]])"
    assert refused(capsys, ["validate", path]) == message
    assert refused(capsys, ["hunt", path, "--out", str(tmp_path / "out"), "-j", "1"]) == message


# -- G6: the lab report's run names -------------------------------------------------------------------


@pytest.mark.parametrize("setting, message", [
    ("continuous = 'nope'", "continuous: no study named 'nope'; the studies are: static, continuous, sw"),
    ("tune = 'tuning'", "tune: no study named 'tuning'; the studies are: static, continuous, sw"),
    ("static = 'sw'", "static: study 'sw' is a sweep over 'scheduler.max_num_seqs', not a single run; "
                      "single runs ([[runs]] with no sweep, search or plan): static, continuous"),
    ("cost = 'sw'", "cost: study 'sw' is a sweep over 'scheduler.max_num_seqs', not a single run; "
                    "single runs ([[runs]] with no sweep, search or plan): static, continuous"),
    ("queue = 'static'", "queue: study 'static' is a run, not a sweep over 'workload.rate'; "
                         "sweeps over 'workload.rate': none"),
    ("queue = 'sw'", "queue: study 'sw' is a sweep over 'scheduler.max_num_seqs', not a sweep over "
                     "'workload.rate'; sweeps over 'workload.rate': none"),
    ("tune = 'continuous'", "tune: study 'continuous' is a run, not a search; searches: none"),
])
def test_lab_report_names_are_checked_when_the_file_is_read(tmp_path, capsys, setting, message):
    path = write(tmp_path, LAB + f"\n    [reports.lab]\n    {setting}\n", "lab.toml")
    expected = f"schedlab: error: {path}: [reports.lab]: {message}"
    assert refused(capsys, ["validate", path]) == expected
    out = tmp_path / "out"
    assert refused(capsys, ["run", path, "--out", str(out), "--no-plots", "-j", "1"]) == expected
    assert not out.exists()


def test_lab_report_default_names_may_be_missing_a_partial_lab(tmp_path, capsys):
    """``queue`` and ``tune`` keep their default names and name no study: those artifacts are skipped."""
    path = write(tmp_path, LAB, "lab.toml")
    load(path)
    out = tmp_path / "out"
    assert main(["run", path, "--out", str(out), "--no-plots", "-j", "1"]) == 0
    assert {"static.txt", "compare.txt", "maxseqs.txt", "cost.txt"} <= {p.name for p in out.iterdir()}
    assert "lab report: no study for queue.csv, tune.txt" in capsys.readouterr().err


def test_a_report_added_with_the_report_option_is_checked_before_the_run(tmp_path, capsys):
    """--report lab, not in the file's reports: its names were read only after every simulation."""
    text = LAB.replace('reports = ["lab"]', 'reports = ["json"]')
    path = write(tmp_path, text + '\n    [reports.lab]\n    static = "sw"\n', "lab.toml")
    out = tmp_path / "out"
    assert refused(capsys, ["run", path, "--out", str(out), "--no-plots", "-j", "1", "--report", "lab"]) == (
        f"schedlab: error: {path}: [reports.lab]: static: study 'sw' is a sweep over 'scheduler.max_num_seqs', "
        f"not a single run; single runs ([[runs]] with no sweep, search or plan): static, continuous")
    assert not out.exists()


def test_an_unknown_report_added_with_the_report_option_names_the_option(tmp_path, capsys):
    """Found by fuzzing: --report nope was blamed on a [reports.nope] table the file does not have."""
    path = write(tmp_path, LAB.replace('reports = ["lab"]', 'reports = ["json"]'), "lab.toml")
    message = refused(capsys, ["run", path, "--out", str(tmp_path / "out"), "--report", "nope"])
    assert message.startswith("schedlab: error: --report nope: unknown report 'nope'; registered: ")
    assert "[reports.nope]" not in message
