"""Fixes from the second review of ``schedlab hunt``: a finished hunt is never lost at its last
step (a model's relative ``config``, a run name with ``/``), a policy that raises or settings that
do not build together count as failed runs and the first such workload is written as
``failure.*``, optimisers that cannot run are refused on loading, ``min``/``max`` need two
arguments, random sampling follows a stopped search, and the summary says what was tested."""

from __future__ import annotations

import json

import attrs
import pytest

import schedlab
from schedlab.cli import main
from schedlab.configs import int_field
from schedlab.errors import ConfigError
from schedlab.hunt.evaluate import Candidate, run_spec, settings_for
from schedlab.hunt.expression import parse_condition, parse_expression
from schedlab.hunt.hunt import load_hunt, run_hunt
from schedlab.hunt.report import summary, summary_lines
from schedlab.study.executor import InProcessExecutor
from test_hunt import write

#: A small two-run hunt on the linear cost model.
BASE = """
    [experiment]
    name = "review"
    seed = 2
    [cost_model]
    kind = "linear"
    [kv_cache]
    kind = "paged"
    num_blocks = 4096
    [[runs]]
    name = "a"
    [[runs]]
    name = "b"
    scheduler = {max_num_seqs = 2}
    [hunt]
    objective = "runs.a.ttft_ms.max / runs.b.ttft_ms.max"
    budget = 8
    random = 0
    shrink_budget = 6
    [hunt.workload]
    requests = [2, 8]
    rate = [1.0, 20.0]
    cv = [0.0, 2.0]
    prompt = [16, 2000]
    output = [1, 20]
"""

LLAMA = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
         "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


@attrs.frozen
class CrashyConfig:
    max_num_seqs: int = int_field(8, min=1, help="running cap")


class Crashy:
    """FCFS, but it raises when a prompt over 1,000 tokens waits while another request runs (a
    planted bug of the kind a hunt exists to find)."""

    def __init__(self, config: CrashyConfig):
        self.config = config

    def schedule(self, plan):
        plan.decode_all()
        running = len(plan.running)
        for seq in list(plan.waiting):
            if seq.request.prompt_tokens > 1000 and running >= 1:
                raise IndexError("the planted bug")
            if running >= self.config.max_num_seqs or not plan.admit(seq, seq.num_tokens, reserve=True):
                break
            running += 1


class CrashyPlugin:
    @schedlab.hookimpl
    def schedlab_register_schedulers(self, register):
        register("crashy", Crashy, config=CrashyConfig)


# -- a finished hunt is kept ------------------------------------------------------------------------


def test_a_models_relative_config_is_rebased_and_the_hunt_replays(tmp_path):
    """[models.X] config = "models/config.json" (relative to the hunt file, as the README shows) was
    copied unrebased: the hunt's own replay failed at the end and every result was lost."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(json.dumps(LLAMA))
    text = BASE.replace('kind = "linear"', 'kind = "roofline"\n    model = "mine"\n    gpu = "a100-40gb"')
    text = text.replace('num_blocks = 4096', 'model = "mine"\n    gpu = "a100-40gb"')
    path = write(tmp_path, text + '    [models.mine]\n    config = "models/config.json"\n')
    out = tmp_path / "elsewhere" / "out"
    assert main(["hunt", str(path), "--out", str(out), "--jobs", "1"]) == 0
    replay = (out / "counterexample.toml").read_text()
    assert 'config = "../../models/config.json"' in replay
    assert main(["run", str(out / "counterexample.toml"), "--out", str(tmp_path / "replay"), "--no-plots"]) == 0


def test_a_run_named_with_a_slash_gets_a_timeline_file_it_can_have(tmp_path):
    """(An expression cannot name such a run -- "/" divides -- but the run is drawn all the same.)"""
    text = BASE.replace('name = "a"', 'name = "c/d"').replace("runs.a.ttft_ms.max / runs.b.ttft_ms.max",
                                                              "runs.b.ttft_ms.max")
    path = write(tmp_path, text)
    out = tmp_path / "out"
    assert main(["hunt", str(path), "--out", str(out), "--jobs", "1"]) == 0
    assert (out / "timeline_c_d.png").is_file() and (out / "timeline_b.png").is_file()


def test_a_setting_for_run_a_dot_b_is_not_handed_to_run_a(tmp_path):
    """With runs ``a`` and ``a.b``, ``runs.a.b.scheduler.max_num_seqs`` is ``a.b``'s (the longest
    name): it was also given to ``a`` as a table ``b``, which the replay then refused."""
    runs = ("a", "a.b")
    settings = {"runs.a.b.scheduler.max_num_seqs": 5, "runs.a.scheduler.max_num_seqs": 3, "scheduler.x": 1}
    assert settings_for("a", settings, runs) == [("scheduler.max_num_seqs", 3), ("scheduler.x", 1)]
    assert settings_for("a.b", settings, runs) == [("scheduler.max_num_seqs", 5), ("scheduler.x", 1)]
    text = BASE.replace('name = "b"', 'name = "a.b"').replace("runs.b.", "runs.a.b.")
    text += '    [hunt.settings]\n    "runs.a.b.scheduler.max_num_seqs" = [1, 4]\n'
    hunt = load_hunt(write(tmp_path, text), [])
    probe = Candidate(({"prompt_tokens": 1, "output_tokens": 1, "arrival_ms": 0.0},),
                      {"runs.a.b.scheduler.max_num_seqs": 3})
    first, second = (run_spec(study, probe, ("a", "a.b")) for study in hunt.experiment.studies)
    assert "b" not in first.tables and second.tables["scheduler"]["max_num_seqs"] == 3
    out = tmp_path / "out"
    assert main(["hunt", str(write(tmp_path, text)), "--out", str(out), "--jobs", "1"]) == 0
    assert main(["run", str(out / "counterexample.toml"), "--out", str(tmp_path / "replay"), "--no-plots"]) == 0


# -- failed runs: counted, and the first written --------------------------------------------------


def test_a_policy_that_raises_on_a_workload_is_a_failed_run_written_as_failure(tmp_path, capsys):
    text = BASE.replace('[[runs]]\n    name = "a"', '[[runs]]\n    name = "a"\n    scheduler = {kind = "crashy"}')
    hunt = load_hunt(write(tmp_path, text), ["hunt.budget=24"], plugin_objects=(CrashyPlugin(),))
    outcome = run_hunt(hunt, InProcessExecutor())
    failed = [t for t in outcome.search if t.score.error is not None]
    assert failed, "some workload has a long prompt waiting behind another request"
    assert all("raised IndexError: the planted bug" in t.score.error for t in failed)
    assert outcome.first_failure is failed[0]
    info = summary(hunt, outcome)
    assert info["search"]["errors"] == len(failed) and info["random"]["errors"] == 0
    assert info["failure"]["requests"] == len(failed[0].candidate.rows)
    assert any(line.endswith("the first is failure.toml") for line in summary_lines(hunt, outcome))
    from schedlab.hunt.report import write_outcome

    (tmp_path / "out").mkdir()
    names = {p.name for p in write_outcome(hunt, outcome, tmp_path / "out")}
    assert {"failure.jsonl", "failure.toml"} <= names
    header = (tmp_path / "out" / "failure.toml").read_text().splitlines()[1]
    assert header.startswith(f"# a run failed with {len(failed[0].candidate.rows)} requests: ")
    rows = [json.loads(line) for line in (tmp_path / "out" / "failure.jsonl").read_text().splitlines()]
    assert len(rows) == len(failed[0].candidate.rows) and any(r["prompt_tokens"] > 1000 for r in rows)


def test_settings_that_do_not_build_together_are_a_failed_run_not_the_end_of_the_hunt(tmp_path):
    """Both ends of each range build (max_num_seqs 2..2048 with a budget of 64..2048), but a mix with
    more sequences than the token budget does not: such a candidate was a ConfigError that ended
    the hunt and lost what it had found."""
    text = BASE.replace("[[runs]]\n    name = \"a\"", "[scheduler]\n    kind = \"vllm\"\n    [[runs]]\n    name = \"a\"")
    text = text.replace("scheduler = {max_num_seqs = 2}", "")
    text += ('    [hunt.settings]\n    "scheduler.max_num_seqs" = [2, 2048]\n'
             '    "scheduler.max_num_batched_tokens" = [64, 2048]\n')
    hunt = load_hunt(write(tmp_path, text), ["hunt.budget=40"])
    outcome = run_hunt(hunt, InProcessExecutor())
    failed = [t for t in outcome.search if t.score.error is not None]
    assert failed and len(failed) < len(outcome.search)
    for trial in failed:
        settings = trial.candidate.settings
        assert settings["scheduler.max_num_batched_tokens"] < settings["scheduler.max_num_seqs"]
        assert trial.score.error.startswith("the settings scheduler.max_num_seqs = ")
        assert "do not build together: " in trial.score.error and not trial.score.feasible
    assert outcome.worst is not None and outcome.worst.score.feasible


# -- refused on loading -----------------------------------------------------------------------------


def test_an_optimiser_that_cannot_ask_several_at_once_is_refused_on_loading(tmp_path):
    pytest.importorskip("nevergrad")
    path = write(tmp_path, BASE)
    with pytest.raises(ConfigError, match=r"--set hunt.optimizer: \[hunt\]: optimizer: Nevergrad's 'NelderMead' "
                                          r"cannot run this search \(ValueError: .*parallelization\); set \[hunt\] "
                                          r"batch = 1"):
        load_hunt(path, ['hunt.optimizer="NelderMead"'])
    assert load_hunt(path, ['hunt.optimizer="NelderMead"', "hunt.batch=1"]).config.batch == 1


@pytest.mark.parametrize("text", ["max(runs.a.x)", "runs.a.x / min(0)", "min()"])
def test_min_and_max_take_two_or_more_arguments(text):
    with pytest.raises(ConfigError, match=r"(min|max) takes two or more arguments|unexpected"):
        parse_expression(text)
    assert parse_expression("max(runs.a.x, 2)").value(lambda name: 1.0) == 2.0


def test_a_threshold_is_shown_as_the_number_enforced():
    """Rounded to 6 digits, ``< 1.0000001`` read ``< 1`` and ``< 1234567`` ``< 1.23457e+06``."""
    assert parse_condition("runs.a.x < 1.0000001").text == "runs.a.x < 1.0000001"
    assert float(parse_condition("runs.a.x < 1234567").text.split("< ")[1]) == 1234567
    assert parse_condition("runs.b.busy_share <= 0.8").text == "runs.b.busy_share <= 0.8"
    assert parse_condition("runs.a.x < 3").text == "runs.a.x < 3"


# -- what the summary says --------------------------------------------------------------------------


def test_random_sampling_by_default_draws_as_many_as_the_search_evaluated(tmp_path):
    """A search stopped early (here by a falsified property) went on as a random sampling of the
    whole budget: 25 times the search's work, and a lopsided comparison."""
    text = BASE.replace('objective = "runs.a.ttft_ms.max / runs.b.ttft_ms.max"',
                        'property = "runs.a.ttft_ms.max / runs.b.ttft_ms.max < 0.5"').replace("random = 0\n", "")
    hunt = load_hunt(write(tmp_path, text), ["hunt.budget=200", "hunt.batch=4"])
    outcome = run_hunt(hunt, InProcessExecutor())
    assert len(outcome.search) < 200, "the ratio is at least 1 on most workloads: found at once"
    assert len(outcome.random) == len(outcome.search)


def test_a_property_tested_on_no_feasible_workload_is_not_said_to_hold(tmp_path):
    text = BASE.replace('objective = "runs.a.ttft_ms.max / runs.b.ttft_ms.max"',
                        'property = "runs.a.ttft_ms.max < 1e12"\n    constraints = ["runs.b.busy_share <= 0.0"]')
    hunt = load_hunt(write(tmp_path, text), [])
    outcome = run_hunt(hunt, InProcessExecutor())
    assert not any(t.score.feasible for t in outcome.search)
    assert "property not tested: no workload was feasible" in summary_lines(hunt, outcome)
    held = load_hunt(write(tmp_path, text.replace('constraints = ["runs.b.busy_share <= 0.0"]', ""), "h.toml"), [])
    lines = summary_lines(held, run_hunt(held, InProcessExecutor()))
    assert "property held on every feasible workload (all 8)" in lines
