"""Inputs refused with a message that says what is wrong, whichever way they come in: a CSV
header naming a column twice (request files through every reader, results folders, profile
bundles), a /metrics scrape holding a sample twice (as --target or as --target-baseline),
``calibrate --part -5:10``, a hunt goal naming no metric, and a misspelt metric name."""

from __future__ import annotations

import json
import textwrap

import pytest

from schedlab.cli import main
from schedlab.errors import ConfigError, SchedlabError, WorkloadError
from schedlab.hunt.hunt import load_hunt
from schedlab.results.metric_names import METRICS, check_metric_name
from schedlab.results.storage import load as load_results
from schedlab.targets import read_summary
from schedlab_plugins.cost_models.profile_bundle import BundleError, read_csv
from schedlab_plugins.workloads.records import read_records
from schedlab_plugins.workloads.request_file import FILE_FIELDS, REQUIRED_FIELDS


def twice(path, column: str, first: int, second: int) -> str:
    return (f"{path}: the header names column {column!r} twice (columns {first} and {second}): which one to read "
            f"is ambiguous; rename or remove one")


# -- 1. a CSV header naming a column twice ------------------------------------------------------------


def read_by_each(path, required=REQUIRED_FIELDS) -> dict[str, str]:
    """reader -> the WorkloadError message (or "read" when the file was read)."""
    out = {}
    for reader in ("arrow", "numpy", "python"):
        try:
            read_records(path, FILE_FIELDS, required=required, reader=reader)
            out[reader] = "read"
        except WorkloadError as exc:
            out[reader] = str(exc)
    return out


@pytest.mark.parametrize("header, rows, column, first, second", [
    ("arrival_ms,prompt_tokens,prompt_tokens,output_tokens", ["0,10,20,5", "1,11,21,6"], "prompt_tokens", 2, 3),
    # a quoted cell: the fast readers give way to csv.reader at once
    ("arrival_ms,prompt_tokens,output_tokens,prompt_tokens", ['0,10,5,"20"', "1,11,6,21"], "prompt_tokens", 2, 4),
    # the same name once stripped, an optional field, one line per row for pyarrow
    ("output_tokens, arrival_ms,prompt_tokens,arrival_ms ", ["5,0,10,1", "6,1,11,2"], "arrival_ms", 2, 4),
])
def test_a_request_file_naming_a_column_twice_is_refused_alike_by_every_reader(tmp_path, header, rows, column,
                                                                                 first, second):
    path = tmp_path / "requests.csv"
    path.write_text("\n".join([header] + rows) + "\n")
    want = twice(path, column, first, second)
    assert read_by_each(path) == {"arrow": want, "numpy": want, "python": want}
    assert read_by_each(path, required=()) == {"arrow": want, "numpy": want, "python": want}


def test_a_column_named_twice_that_is_not_read_is_no_error(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text("prompt_tokens,note,output_tokens,note\n10,a,5,b\n11,c,6,d\n")
    assert read_by_each(path) == {"arrow": "read", "numpy": "read", "python": "read"}


def test_the_file_workload_says_it_too(tmp_path, capsys):
    (tmp_path / "requests.csv").write_text("arrival_ms,prompt_tokens,prompt_tokens,output_tokens\n0,10,20,5\n")
    exp = tmp_path / "exp.toml"
    exp.write_text('[experiment]\nreports = []\n[workload]\nkind = "file"\npath = "requests.csv"\n')
    assert main(["validate", str(exp)]) == 2
    assert twice(tmp_path / "requests.csv", "prompt_tokens", 2, 3) in capsys.readouterr().err


TINY = """
[experiment]
name = "tiny"
reports = ["json"]
[workload]
kind = "synthetic"
num_requests = 4
rate = 10.0
prompt = {dist = "fixed", value = 20}
output = {dist = "fixed", value = 3}
[cost_model]
kind = "linear"
[scheduler]
kind = "continuous"
max_num_seqs = 2
"""


def test_a_results_folder_whose_requests_csv_names_a_column_twice_is_refused(tmp_path):
    exp = tmp_path / "tiny.toml"
    exp.write_text(TINY)
    out = tmp_path / "results"
    assert main(["run", str(exp), "--out", str(out)]) == 0
    assert len(load_results(out).all_runs()[0].requests["id"]) == 4
    requests = out / "requests.csv"
    header, rest = requests.read_text().split("\n", 1)
    names = header.split(",")
    at = names.index("ttft_ms")
    names[at] = "arrival_ms"   # two arrival_ms columns: which one is the arrival?
    requests.write_text(",".join(names) + "\n" + rest)
    with pytest.raises(SchedlabError) as info:
        load_results(out)
    assert str(info.value) == twice(requests, "arrival_ms", names.index("arrival_ms") + 1, at + 1)


def test_a_profile_csv_naming_a_column_twice_is_refused(tmp_path):
    path = tmp_path / "dense.csv"
    path.write_text("layer,tokens,time_us,time_us\nqkv,1,10,20\n")
    with pytest.raises(BundleError) as info:
        read_csv(path, ("layer", "tokens", "time_us"), text=("layer",))
    assert str(info.value) == twice(path, "time_us", 3, 4)
    path.write_text("layer,tokens,time_us,other,other\nqkv,1,10,a,b\n")   # a column it does not read
    assert read_csv(path, ("layer", "tokens", "time_us"), text=("layer",))["time_us"] == [10.0]


# -- 2. a /metrics scrape holding one sample twice ----------------------------------------------------

SCRAPE = """# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="10.0"} 2
vllm:e2e_request_latency_seconds_bucket{engine="0",le="30.0"} 8
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 10
vllm:e2e_request_latency_seconds_sum{engine="0"} 200
vllm:e2e_request_latency_seconds_count{engine="0"} 10
"""
EARLY = SCRAPE.replace("} 2\n", "} 1\n").replace("} 8\n", "} 3\n").replace("} 10\n", "} 4\n").replace(
    "} 200\n", "} 50\n")


def doubled(text: str, line: int) -> str:
    """``text`` with its ``line`` (1-based) written again at the end."""
    return text + text.splitlines()[line - 1] + "\n"


def test_a_sample_given_twice_is_refused_as_target_and_as_baseline_alike(tmp_path):
    after, before = tmp_path / "after.prom", tmp_path / "before.prom"
    after.write_text(SCRAPE)
    before.write_text(EARLY)
    assert read_summary(after, baseline=before).values["e2e_ms.mean"] == pytest.approx(150e3 / 6)

    def message(path):
        return (f"{path}: line 7: vllm:e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"30.0\"}} repeats the "
                f"sample of line 3 (same metric, same labels): a scrape holds one sample per series -- two scrapes "
                f"joined in one file?")

    bad_after, bad_before = tmp_path / "bad_after.prom", tmp_path / "bad_before.prom"
    bad_after.write_text(doubled(SCRAPE, 3))
    bad_before.write_text(doubled(EARLY, 3))
    for kwargs in ({}, {"baseline": before}):
        with pytest.raises(ConfigError) as info:
            read_summary(bad_after, **kwargs)
        assert str(info.value) == message(bad_after)
    with pytest.raises(ConfigError) as info:
        read_summary(after, baseline=bad_before)
    assert str(info.value) == message(bad_before)


def test_a_sum_or_count_twice_and_labels_in_another_order_are_the_same_sample(tmp_path):
    path = tmp_path / "m.prom"
    path.write_text(doubled(SCRAPE, 5))
    with pytest.raises(ConfigError, match=r"line 7: vllm:e2e_request_latency_seconds_sum\{engine=\"0\"\} repeats "
                                          r"the sample of line 5"):
        read_summary(path)
    path.write_text(SCRAPE + 'vllm:e2e_request_latency_seconds_bucket{le="Inf",engine="0"} 10\n')
    with pytest.raises(ConfigError, match="line 7: .* repeats the sample of line 4"):
        read_summary(path)
    path.write_text(SCRAPE + SCRAPE.replace('engine="0"', 'engine="1"'))   # two engines: summed, as before
    assert read_summary(path).histograms["e2e_ms"].counts == (4.0, 16.0, 20.0)


# -- 3. calibrate --part with a negative FIRST ---------------------------------------------------------


@pytest.fixture
def log_experiment(tmp_path):
    rows = [{"input_toks": 20, "output_toks": 3, "queued_ts": i * 0.1, "scheduled_ts": i * 0.1,
             "first_token_ts": i * 0.1 + 0.02, "last_token_ts": i * 0.1 + 0.03} for i in range(5)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    exp = tmp_path / "fit.toml"
    exp.write_text('[experiment]\nreports = []\n[workload]\nkind = "vllm_log"\npath = "log.jsonl"\n'
                   '[cost_model]\nkind = "linear"\n')
    return exp


@pytest.mark.parametrize("part", [["--part", "-5:10"], ["--part=-5:10"]])
def test_a_negative_first_request_is_explained(log_experiment, capsys, part):
    code = main(["calibrate", str(log_experiment), "--fit", "cost_model.decode_ms_per_step=1:10", *part])
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("schedlab: error: --part '-5:10': FIRST must be >= 0: the log's requests count from its start "
                   "(0 is the first), not from its end (expected FIRST:END with 0 <= FIRST < END)\n")


def test_part_beyond_the_log_names_its_length(log_experiment, capsys):
    assert main(["calibrate", str(log_experiment), "--fit", "cost_model.decode_ms_per_step=1:10",
                 "--part", "2:-1"]) == 2
    assert "--part '2:-1': END must be >= 0" in capsys.readouterr().err
    assert main(["calibrate", str(log_experiment), "--fit", "cost_model.decode_ms_per_step=1:10",
                 "--part", "0:9"]) == 2
    assert ("--part '0:9': expected FIRST:END with 0 <= FIRST < END <= 5 (requests of the log)"
            in capsys.readouterr().err)


# -- 4. a hunt goal naming no metric -----------------------------------------------------------------

HUNT = """
    [experiment]
    name = "constant"
    [kv_cache]
    kind = "paged"
    num_blocks = 4096
    [[runs]]
    name = "fcfs"
    scheduler = {kind = "continuous", max_num_seqs = 8}
    [[runs]]
    name = "vllm"
    scheduler = {kind = "vllm", max_num_seqs = 8}
    [hunt]
    GOAL
    [hunt.workload]
    requests = [1, 20]
    rate = [1.0, 50.0]
    prompt = [1, 2000]
    output = [1, 200]
"""


def hunt_file(tmp_path, goal: str):
    path = tmp_path / "hunt.toml"
    path.write_text(textwrap.dedent(HUNT).replace("GOAL", goal))
    return path


@pytest.mark.parametrize("goal, key, text", [
    ('objective = "5"', "objective", "'5'"),
    ('objective = "(2 + 3) * max(1, 4)"', "objective", "'(2 + 3) * max(1, 4)'"),
    ('objective = "5"\nminimize = true', "objective", "'5'"),
    ('property = "5 < 3"', "property", "'5'"),
    ('objective = "runs.vllm.ttft_ms.p99"\nconstraints = ["1 < 2"]', "constraints", "'1'"),
])
def test_a_goal_naming_no_metric_is_refused_when_the_file_is_read(tmp_path, goal, key, text):
    path = hunt_file(tmp_path, goal)
    with pytest.raises(ConfigError) as info:
        load_hunt(path)
    assert str(info.value) == (f"{path}: [hunt] {key}: {text} names no metric: it is a constant, the same for every "
                               f"workload; name runs.<run>.<metric> (runs: fcfs, vllm) or workload.<statistic>, e.g. "
                               f"'runs.fcfs.ttft_ms.p99'")


def test_a_goal_on_the_workload_alone_needs_a_constraint_on_a_run(tmp_path):
    path = hunt_file(tmp_path, 'objective = "workload.tokens_per_s"')
    with pytest.raises(ConfigError) as info:
        load_hunt(path)
    assert str(info.value) == (f"{path}: [hunt] objective: 'workload.tokens_per_s' names no run's metric, and no "
                               f"constraint does: the runs' policies would play no part in the hunt; name "
                               f"runs.<run>.<metric> (runs: fcfs, vllm) in it or in a constraint")
    with pytest.raises(ConfigError, match="names no run's metric"):
        load_hunt(hunt_file(tmp_path, 'property = "workload.requests < 10"\nconstraints = ["workload.max_gap_s < 2"]'))
    # the most load a policy takes within its SLO: a hunt for capacity
    hunt = load_hunt(hunt_file(tmp_path, 'objective = "workload.tokens_per_s"\n'
                                         'constraints = ["runs.vllm.ttft_ms.p99 <= 200"]'))
    assert hunt.goal.names == ("workload.tokens_per_s", "runs.vllm.ttft_ms.p99")
    assert load_hunt(hunt_file(tmp_path, 'objective = "runs.vllm.ttft_ms.p99 / 2"')).goal.names == (
        "runs.vllm.ttft_ms.p99",)


# -- 5. a misspelt metric name: the close match, not every name -----------------------------------------


TOP = f"there are {len(METRICS)} metric names"
EXAMPLES = "such as ttft_ms, tpot_ms, e2e_ms, itl_ms, throughput_tps, busy_share"
ALL = "(all of them: METRICS in schedlab/results/metric_names.py)"


@pytest.mark.parametrize("name, message", [
    ("tft_ms.p99", f"unknown metric 'tft_ms.p99' (did you mean 'ttft_ms.p99'?): {TOP}, {EXAMPLES} {ALL}"),
    ("goodput", f"unknown metric 'goodput': {TOP}, none close to it, {EXAMPLES} {ALL}"),
    ("prefix_cache.hitrate", "unknown metric 'prefix_cache.hitrate' (did you mean 'prefix_cache.hit_rate'?): "
                             "'prefix_cache' has 13 names, such as queries, hits, hit_rate, gpu_hits, gpu_hit_rate, "
                             f"host_hits {ALL}"),
    # a short group: every name, as before, after the hint
    ("ttft_ms.p98", "unknown metric 'ttft_ms.p98' (did you mean 'ttft_ms.p99'?): 'ttft_ms' has mean, p50, p90, p95, "
                    "p99, max"),
    ("slo.goodput", "unknown metric 'slo.goodput' (did you mean 'slo.goodput_rps'?): 'slo' has attainment, "
                    "goodput_rps, met"),
    # more parts follow: only a group is suggested ('gpus' is a number: 'gpus.p99' would be no better)
    ("bogus.p99", f"unknown metric 'bogus.p99': {TOP}, none close to it, {EXAMPLES} {ALL}"),
    ("per_clas.chat.ttft_ms.p99", "unknown metric 'per_clas.chat.ttft_ms.p99' (did you mean "
                                  "'per_class.chat.ttft_ms.p99'?)"),
])
def test_an_unknown_metric_gets_the_close_match_first(name, message):
    with pytest.raises(ConfigError) as info:
        check_metric_name(name)
    assert str(info.value).startswith(message)
    assert "requests, finished, rejected" not in str(info.value)   # the top level's names are not all listed
