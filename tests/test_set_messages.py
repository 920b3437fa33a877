"""Errors about a value that came from ``--set`` say so, quote the ``--set``, and for one that
sets a key for every run, name the runs that take it and the ``--set runs.<name>...`` for them.
A key or value from the file keeps its message word for word."""

from __future__ import annotations

import textwrap

import attrs
import pytest

import schedlab
from schedlab.cli import main
from schedlab.configs import int_field, str_field
from schedlab.errors import ConfigError, UnknownPluginError
from schedlab.study.experiment import load
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler


@attrs.frozen
class EdfConfig:
    deadline_ms: int = int_field(1000, min=1, help="a request's deadline")
    max_num_seqs: int = int_field(16, min=1, help="most sequences running at once")
    policy: str = str_field("edf", choices=("edf", "fcfs"), help="queue order")


class Edf:
    @schedlab.hookimpl
    def schedlab_register_schedulers(self, register):
        register("edf", lambda config: ContinuousScheduler(ContinuousConfig(max_num_seqs=config.max_num_seqs)),
                 config=EdfConfig, help="earliest deadline first (a test plugin)")


HEAD = """
    [workload]
    kind = "inline"
    requests = [{prompt_tokens = 10, output_tokens = 3}, {prompt_tokens = 12, output_tokens = 4}]
    [cost_model]
    kind = "linear"
    """
TWO_RUNS = HEAD + """
    [scheduler]
    kind = "continuous"
    max_num_seqs = 16

    [[runs]]
    name = "fcfs"

    [[runs]]
    name = "edf"
    scheduler = { kind = "edf" }
    """
CONTINUOUS_KEYS = ", ".join(sorted(attrs.fields_dict(ContinuousConfig)))


def write(tmp_path, text: str):
    path = tmp_path / "edf.toml"
    path.write_text(textwrap.dedent(text))
    return path


def error(path, *overrides, kind=ConfigError) -> str:
    with pytest.raises(kind) as info:
        load(path, list(overrides), plugin_objects=[Edf()])
    return str(info.value)


# -- a key for every run that one run's scheduler does not have ----------------------------------------------


def test_an_unknown_key_from_set_for_every_run_says_so_and_how_to_set_it_in_one_run(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert error(path, "scheduler.deadline_ms=300") == (
        f"{path}: [[runs]] 'fcfs' [scheduler]: unknown key 'deadline_ms' (from --set scheduler.deadline_ms=300, "
        f"which sets it for every run; this run's scheduler is 'continuous'); valid keys: {CONTINUOUS_KEYS}; "
        "to set it for run 'edf' only: --set runs.edf.scheduler.deadline_ms=300")
    exp = load(path, ["runs.edf.scheduler.deadline_ms=300"], plugin_objects=[Edf()])  # the advice works
    assert {s.name: s.base.tables["scheduler"].get("deadline_ms") for s in exp.studies} == {"fcfs": None, "edf": 300}


def test_several_runs_that_take_the_key_are_listed(tmp_path):
    path = write(tmp_path, TWO_RUNS + """
        [[runs]]
        name = "edf-2"
        scheduler = { kind = "edf", max_num_seqs = 4 }
        [[runs]]
        name = "not a bare key"
        scheduler = { kind = "edf" }
        """)
    message = error(path, "scheduler.deadline_ms=300")
    assert message.endswith("; to set it only for the runs whose scheduler takes it "
                            '(NAME: edf, edf-2, "not a bare key"): --set runs.NAME.scheduler.deadline_ms=300 for each')
    exp = load(path, ['runs."not a bare key".scheduler.deadline_ms=300'], plugin_objects=[Edf()])  # as advised
    assert exp.studies[3].base.tables["scheduler"]["deadline_ms"] == 300


def test_no_advice_when_no_other_run_takes_the_key(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    message = error(path, "scheduler.deadline_msx=300")
    assert "unknown key 'deadline_msx' (from --set scheduler.deadline_msx=300, which sets it for every run; " \
           "this run's scheduler is 'continuous'); valid keys: " in message
    assert "to set it" not in message


def test_an_unknown_key_from_set_for_one_run_names_that_set(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert error(path, "runs.fcfs.scheduler.deadline_ms=300") == (
        f"{path}: [[runs]] 'fcfs' [scheduler]: unknown key 'deadline_ms' (from --set "
        f"runs.fcfs.scheduler.deadline_ms=300; this run's scheduler is 'continuous'); valid keys: {CONTINUOUS_KEYS}")


def test_a_file_with_one_run_does_not_say_every_run(tmp_path):
    path = write(tmp_path, HEAD + '[scheduler]\nkind = "continuous"\n')
    assert error(path, "scheduler.deadline_ms=300") == (
        f"{path}: [scheduler]: unknown key 'deadline_ms' (from --set scheduler.deadline_ms=300; this run's "
        f"scheduler is 'continuous'); valid keys: {CONTINUOUS_KEYS}")


def test_a_set_into_a_table_the_file_lacks_sets_it_in_the_default_table(tmp_path):
    """The file has no [scheduler]: --set scheduler.KEY sets KEY in the default one (continuous)."""
    path = write(tmp_path, HEAD)
    assert error(path, "scheduler.deadline_ms=300").startswith(
        f"{path}: [scheduler]: unknown key 'deadline_ms' (from --set scheduler.deadline_ms=300; "
        "this run's scheduler is 'continuous'); valid keys: ")
    tables = load(path, ["scheduler.max_num_seqs=3"]).studies[0].base.tables
    assert tables["scheduler"] == {"kind": "continuous", "max_num_seqs": 3}
    tables = load(path, ["scheduler.kind=edf", "scheduler.deadline_ms=300"],
                  plugin_objects=[Edf()]).studies[0].base.tables
    assert tables["scheduler"] == {"kind": "edf", "deadline_ms": 300}


def test_a_table_without_a_kind_takes_the_default_kind(tmp_path):
    """A whole table from --set, a sweep's key or the file's own table with no kind: the default
    kind's (continuous), as a [[runs]] table without a kind merges."""
    path = write(tmp_path, HEAD)
    assert error(path, "scheduler={deadline_ms=300}").startswith(
        f"{path}: [scheduler]: unknown key 'deadline_ms' (from --set 'scheduler={{deadline_ms=300}}'; this run's "
        f"scheduler is 'continuous'); valid keys: {CONTINUOUS_KEYS}")
    swept = write(tmp_path, HEAD + '[sweep]\n"scheduler.max_num_seqs" = [4, 8]\n')
    exp = load(swept, plugin_objects=[Edf()])
    assert [s["scheduler.max_num_seqs"] for s in exp.studies[0].sweep] == [4, 8]   # (built: no missing kind)
    own = write(tmp_path, HEAD + "[scheduler]\nmax_num_seqs = 4\n")
    assert len(load(own, plugin_objects=[Edf()]).studies) == 1


def test_a_did_you_mean_stays_next_to_the_key(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert "unknown key 'max_num_seq' (did you mean 'max_num_seqs'?) (from --set runs.fcfs.scheduler.max_num_seq=8; " \
           "this run's scheduler is 'continuous'); valid keys: " in error(path, "runs.fcfs.scheduler.max_num_seq=8")


def test_a_key_set_through_a_table_it_makes_names_the_set(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert error(path, "scheduler.deadline.ms=1").startswith(
        f"{path}: [[runs]] 'fcfs' [scheduler]: unknown key 'deadline' (from --set scheduler.deadline.ms=1, "
        "which sets it for every run; this run's scheduler is 'continuous'); valid keys: ")


# -- wrong values -------------------------------------------------------------------------------------------


def test_a_wrong_value_from_set_names_the_set(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert error(path, "scheduler.max_num_seqs=abc") == (
        f"{path}: [[runs]] 'fcfs' [scheduler]: max_num_seqs: must be a whole number, got 'abc' (str) "
        "(from --set scheduler.max_num_seqs=abc)")
    assert error(path, "runs.edf.scheduler.max_num_seqs=0") == (
        f"{path}: [[runs]] 'edf' [scheduler]: max_num_seqs: must be >= 1, got 0 "
        "(from --set runs.edf.scheduler.max_num_seqs=0)")


def test_a_value_only_another_runs_kind_takes_gets_the_advice(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    message = error(path, "scheduler.policy=edf")
    assert message == (
        f"{path}: [[runs]] 'fcfs' [scheduler]: policy: must be one of 'fcfs', 'priority', 'sjf', 'lof'; got 'edf' "
        "(from --set scheduler.policy=edf, which sets it for every run; this run's scheduler is 'continuous'); "
        "to set it for run 'edf' only: --set runs.edf.scheduler.policy=edf")


def test_a_wrong_value_in_other_tables_and_experiment_names_the_set(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert error(path, "slo.ttft_ms=abc").endswith("[slo]: ttft_ms: must be a number, got 'abc' (str) "
                                                   "(from --set slo.ttft_ms=abc)")
    assert error(path, "experiment.seed=abc") == (
        f"{path}: [experiment]: seed: must be a whole number, got 'abc' (str) (from --set experiment.seed=abc)")
    assert error(path, "experiment.sed=1").startswith(
        f"{path}: [experiment]: unknown key 'sed' (did you mean 'seed'?) (from --set experiment.sed=1); valid keys: ")


def test_an_unknown_kind_from_set_names_the_set(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert error(path, "scheduler.kind=edff", kind=UnknownPluginError).startswith(
        f"{path}: [[runs]] 'fcfs' [scheduler]: unknown scheduler 'edff' (did you mean 'edf'?) "
        "(from --set scheduler.kind=edff); registered: ")
    assert "unknown scheduler 'edff' (did you mean 'edf'?) (from --set 'scheduler={kind=\"edff\"}'); " \
           in error(path, 'scheduler={kind="edff"}', kind=UnknownPluginError)


def test_a_key_set_in_a_default_table_reaches_every_run(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    studies = load(path, ["kv_cache.block_size=32"], plugin_objects=[Edf()]).studies
    assert [s.base.tables["kv_cache"] for s in studies] == [{"kind": "paged", "block_size": 32}] * 2


def test_a_set_through_a_value_names_the_run_and_the_set(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert error(path, "scheduler.max_num_seqs.x=1") == (
        f"{path}: [[runs]] 'fcfs': --set scheduler.max_num_seqs.x=1: cannot set 'scheduler.max_num_seqs.x': "
        "'scheduler.max_num_seqs' is 16, not a table")


def test_the_set_text_is_shell_quoted_and_a_long_one_cut(tmp_path):
    path = write(tmp_path, TWO_RUNS)
    assert "(from --set 'scheduler.max_num_seqs=\"a b\"')" in error(path, 'scheduler.max_num_seqs="a b"')
    long = "1" + "0" * 400
    message = error(path, f"scheduler.max_num_seqs={long}")
    assert f"(from --set scheduler.max_num_seqs={long[:80 - len('scheduler.max_num_seqs=')]}...)" in message


def test_a_pools_table_blames_the_runs_set(tmp_path):
    path = write(tmp_path, HEAD + """
        [scheduler]
        kind = "continuous"
        [cluster]
        mode = "disaggregated"
        """)
    assert error(path, "scheduler.max_num_seqs=abc").endswith(  # (the run's table: no pool overrides it)
        ": [scheduler]: max_num_seqs: must be a whole number, got 'abc' (str) "
        "(from --set scheduler.max_num_seqs=abc)")
    assert error(path, "cluster.prefill.scheduler.max_num_seqs=abc").endswith(
        "[cluster.prefill.scheduler]: max_num_seqs: must be a whole number, got 'abc' (str) "
        "(from --set cluster.prefill.scheduler.max_num_seqs=abc)")
    own = write(tmp_path, HEAD + """
        [scheduler]
        kind = "continuous"
        [cluster]
        mode = "disaggregated"
        prefill = {scheduler = {max_num_seqs = 0}}
        """)
    assert error(own, "scheduler.max_num_seqs=4").endswith(  # the pool's own value, from the file
        "[cluster.prefill.scheduler]: max_num_seqs: must be >= 1, got 0")


def test_cli_prints_one_line(tmp_path, capsys):
    (tmp_path / "edf_plugin.py").write_text(textwrap.dedent('''
        import schedlab
        from test_set_messages import Edf
        schedlab_register_schedulers = Edf().schedlab_register_schedulers
        '''))
    path = write(tmp_path, '[experiment]\nplugins = ["edf_plugin"]\n' + textwrap.dedent(TWO_RUNS))
    assert main(["validate", str(path), "--set", "scheduler.deadline_ms=300"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown key 'deadline_ms' (from --set scheduler.deadline_ms=300, which sets it for every run; " in err
    assert err.rstrip().endswith("to set it for run 'edf' only: --set runs.edf.scheduler.deadline_ms=300")


# -- values from the file, and swept ones: the messages as they were ---------------------------------------


@pytest.mark.parametrize("overrides", [(), ("cost_model.decode_ms_per_step=9",), ("runs.edf.scheduler.policy=fcfs",)])
def test_a_key_or_value_from_the_file_keeps_its_message(tmp_path, overrides):
    path = write(tmp_path, TWO_RUNS.replace('name = "fcfs"', 'name = "fcfs"\nscheduler = { deadline_ms = 5 }'))
    assert error(path, *overrides) == (
        f"{path}: [[runs]] 'fcfs' [scheduler]: unknown key 'deadline_ms'; valid keys: {CONTINUOUS_KEYS}")
    path = write(tmp_path, TWO_RUNS.replace("max_num_seqs = 16", 'max_num_seqs = "abc"'))
    assert error(path, *overrides) == (   # (the run takes the file's top-level table whole: said where it is)
        f"{path}: [[runs]] 'fcfs' [scheduler]: max_num_seqs: must be a whole number, got 'abc' (str) "
        "(in the file's top-level [scheduler], which this run takes)")


def test_a_file_value_beside_a_set_inside_it_is_not_blamed_on_the_set(tmp_path):
    path = write(tmp_path, TWO_RUNS.replace('name = "fcfs"', 'name = "fcfs"\n'
                                            'cost_model = { kind = "linear", decode_ms_per_step = -1 }'))
    message = error(path, "cost_model.prefill_ms_per_token=0.1")
    assert "(from --set" not in message and "[cost_model]: decode_ms_per_step: " in message


SYNTHETIC = """
    [workload]
    kind = "synthetic"
    num_requests = 5
    rate = 10
    prompt = {dist = "fixed", value = 20}
    output = {dist = "fixed", value = 5}
    """


def test_a_file_table_with_a_set_inside_it_says_so(tmp_path):
    path = write(tmp_path, SYNTHETIC)
    assert error(path, "workload.prompt.value=-1") == (
        f"{path}: [workload]: prompt: value must be a whole number >= 1 and <= 10**8, got -1 "
        "(as changed by --set workload.prompt.value=-1)")


def test_a_file_key_with_a_set_inside_it_keeps_its_message(tmp_path):
    path = write(tmp_path, TWO_RUNS.replace('name = "fcfs"', 'name = "fcfs"\nscheduler = { deadline = {a = 1} }'))
    assert error(path, "runs.fcfs.scheduler.deadline.b=2") == (
        f"{path}: [[runs]] 'fcfs' [scheduler]: unknown key 'deadline'; valid keys: {CONTINUOUS_KEYS}")


def test_a_swept_value_is_not_blamed_on_the_set(tmp_path):
    """... but on the sweep's point that set it (found by fuzzing: the sweep went unnamed)."""
    path = write(tmp_path, TWO_RUNS.replace('name = "fcfs"', 'name = "fcfs"\n'
                                            'sweep = { "scheduler.max_num_seqs" = [1, 0] }'))
    assert error(path, "scheduler.max_num_seqs=2") == (
        f"{path}: [[runs]] 'fcfs' [scheduler]: max_num_seqs: must be >= 1, got 0 "
        "(at the sweep's point scheduler.max_num_seqs = 0)")
    path = write(tmp_path, TWO_RUNS.replace('name = "fcfs"', 'name = "fcfs"\n'
                                            'sweep = { "scheduler.max_num_seqz" = [1, 2] }'))
    assert "unknown key 'max_num_seqz'" in error(path) and error(path).endswith(
        "(at the sweep's point scheduler.max_num_seqz = 1)")


# -- runs named with spaces or dots --------------------------------------------------------------------------

DOTTED_RUNS = HEAD + """
    [scheduler]
    kind = "continuous"

    [[runs]]
    name = "v1.2"

    [[runs]]
    name = "v1"

    [[runs]]
    name = "long run"
    """


def _seqs(exp) -> dict:
    return {s.name: s.base.tables["scheduler"].get("max_num_seqs") for s in exp.studies}


@pytest.mark.parametrize("key, target", [
    ('runs."long run".scheduler.max_num_seqs', "long run"),
    ("runs.'long run'.scheduler.max_num_seqs", "long run"),
    ("runs.long run.scheduler.max_num_seqs", "long run"),       # a known name, unquoted
    ("runs.v1.2.scheduler.max_num_seqs", "v1.2"),               # the longest known name wins
    ('runs."v1.2".scheduler.max_num_seqs', "v1.2"),
    ("runs.v1.scheduler.max_num_seqs", "v1"),
    ('runs."v1".scheduler.max_num_seqs', "v1"),
])
def test_a_run_named_with_spaces_or_dots_can_be_targeted(tmp_path, key, target):
    exp = load(write(tmp_path, DOTTED_RUNS), [f"{key}=5"])
    assert _seqs(exp) == {name: 5 if name == target else None for name in ("v1.2", "v1", "long run")}


def test_a_runs_whole_table_can_be_set(tmp_path):
    """runs.<name>.<table>={...} replaces that run's table, as scheduler={...} replaces every
    run's; a value that is not a table still needs a key."""
    exp = load(write(tmp_path, DOTTED_RUNS), ['runs."long run".scheduler={kind = "sglang", max_running_requests = 64}'])
    tables = {s.name: s.base.tables["scheduler"] for s in exp.studies}
    assert tables["long run"] == {"kind": "sglang", "max_running_requests": 64}
    assert tables["v1"] == tables["v1.2"] == {"kind": "continuous"}
    message = error(write(tmp_path, DOTTED_RUNS), 'runs."long run".scheduler=5')
    assert "write runs.<run name>.<table>.<key> (or runs.<run name>.<table>={...})" in message


@pytest.mark.parametrize("key, expected", [
    ('runs."long run.scheduler.max_num_seqs', 'write runs."run name".<table>.<key>'),
    ('runs."long run"scheduler.max_num_seqs', 'write runs."run name".<table>.<key>'),
    ('runs."nope".scheduler.max_num_seqs', "no run named 'nope'"),
    ('runs."long run".scheduler', "write runs.<run name>.<table>.<key>"),
    ('runs."long run".scheduler.max num', "each part of a dotted key must be"),
])
def test_a_bad_quoted_run_key_is_named(tmp_path, key, expected):
    message = error(write(tmp_path, DOTTED_RUNS), f"{key}=5")
    assert message.startswith(f"--set {key}") and expected in message


def test_the_runs_listed_for_a_missing_name_are_written_as_keys(tmp_path):
    message = error(write(tmp_path, DOTTED_RUNS), "runs.v2.scheduler.max_num_seqs=5")
    assert message.endswith('no run named \'v2\' in ' + str(tmp_path / "edf.toml") + '; runs: "v1.2", v1, "long run"')


def test_set_reaches_a_reports_settings(tmp_path):
    """--set reports.<report>.<key> changes a report's table as the file would (a misspelt key is
    refused as the file's would be)."""
    exp = load(write(tmp_path, DOTTED_RUNS), ['reports.table.columns=["finished", "ttft_ms.p99"]'])
    assert exp.report_tables["table"] == {"columns": ["finished", "ttft_ms.p99"]}
    message = error(write(tmp_path, DOTTED_RUNS), 'reports.table.colums=["finished"]')
    assert "[reports.table]: unknown key 'colums' (did you mean 'columns'?)" in message


def test_a_missing_data_file_names_the_experiment_and_the_table_that_points_at_it(tmp_path, capsys):
    """The data file's own message, after the experiment file and its table (audit s56: the
    message named only the data file, resolved beside the experiment, not where it came from)."""
    path = tmp_path / "exp.toml"
    path.write_text('[workload]\nkind = "vllm_log"\npath = "runs/log.jsonl"\n')
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"schedlab: error: {path}: [workload]: {tmp_path / 'runs' / 'log.jsonl'}: file not found"
    assert main(["validate", str(path), "--set", "workload.path=other.jsonl"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"[workload]: {tmp_path / 'other.jsonl'}: file not found "
                                                    "(from --set workload.path=other.jsonl)")


def test_a_missing_file_a_set_named_is_the_sets(tmp_path):
    """The error named the file's table, as if the file had named the missing path; and a file
    missing for one run is missing for all, so no advice to set it for some runs."""
    (tmp_path / "requests.json").write_text('[{"prompt_tokens": 10, "output_tokens": 3}]')
    path = tmp_path / "runs.toml"
    path.write_text('[workload]\nkind = "file"\npath = "requests.json"\n[cost_model]\nkind = "linear"\n'
                    '[[runs]]\nname = "a"\n[[runs]]\nname = "b"\nscheduler = {kind = "static"}\n')
    assert load(path).studies  # the file's own path is there
    with pytest.raises(schedlab.errors.WorkloadError) as err:
        load(path, ["workload.path=gone.json"])
    assert str(err.value).endswith("gone.json: file not found (from --set workload.path=gone.json)")


def test_a_runs_own_replicas_seed_and_engine_are_settable_from_the_command_line(tmp_path):
    """The one-draw note says 'replicas = 3 (in [experiment] or the run)', and --set
    runs.NAME.replicas=3 was refused."""
    path = write(tmp_path, TWO_RUNS)
    exp = load(path, ["runs.fcfs.replicas=3", "runs.fcfs.seed=7", "runs.edf.engine=reference"],
               plugin_objects=[Edf()])
    fcfs, edf = exp.studies
    assert (fcfs.replicas, fcfs.base.seed, fcfs.base.engine) == (3, 7, "fast")
    assert (edf.replicas, edf.base.engine) == (1, "reference")
    assert error(path, "runs.fcfs.replicas=0").endswith("[[runs]] 'fcfs': replicas must be a whole number from 1 to "
                                                        "10,000, got 0")
    assert "no run named 'other'" in error(path, "runs.other.replicas=2")
