"""The metric names files may use (schedlab.results.metric_names) against the metrics runs really have,
and summary.json's layout against what the README documents."""

from __future__ import annotations

import json
import textwrap
import re
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.results.metric_names import METRICS, check_metric_name
from schedlab.results.storage import SUMMARY_LAYOUT, summary_dict, summary_problem
from schedlab.study.experiment import load, run_experiment

ROOT = Path(__file__).resolve().parent.parent

# Every optional group at once: two classes from two clients, two instances, an [slo] table,
# speculative decoding, a power model, and requests too long for the cache (rejections with a reason).
EVERYTHING = """
[experiment]
name = "everything"

[workload]
kind = "mix"

[workload.classes.chat]
kind = "synthetic"
num_requests = 100
prompt = {dist = "uniform", low = 10, high = 200}
output = {dist = "uniform", low = 2, high = 60}
rate = 20
client = "alice"

[workload.classes.huge]
kind = "synthetic"
num_requests = 3
prompt = {dist = "fixed", value = 5000}
output = {dist = "fixed", value = 10}
rate = 1
client = "bob"

[kv_cache]
kind = "paged"
num_blocks = 64

[cluster]
instances = 2

[slo]
ttft_ms = 200
classes.chat = {tpot_ms = 50}

[speculative]
method = "ngram"

[power]
kind = "fixed_active"
active_w = 300
standby_w = 90
idle_w = 30
"""


def leaves(node, prefix=""):
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from leaves(value, name + ".")
        else:
            yield name


def schema_leaves(node, prefix=""):
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from schema_leaves(value, name + ".")
        else:
            yield name


@pytest.fixture(scope="module")
def everything(tmp_path_factory):
    path = tmp_path_factory.mktemp("everything") / "everything.toml"
    path.write_text(EVERYTHING)
    return run_experiment(load(path))


def test_every_metric_of_a_run_fits_the_declared_names(everything):
    run = everything.all_runs()[0]
    names = list(leaves(run.metrics))
    assert len(names) > 150
    for name in names:
        assert check_metric_name(name) == name


def test_every_declared_name_occurs_in_a_run_with_every_optional_group(everything):
    """The shape declares nothing that compute_metrics does not make ("*" matches any key)."""
    run = everything.all_runs()[0]
    assert run.metrics["rejected"] == 3 and set(run.metrics["per_client"]) == {"alice", "bob"}
    pattern = {re.sub(r"(per_class|per_instance|per_client|rejection_reasons)\.[^.]+", r"\1.*", name)
               for name in leaves(run.metrics)}
    declared = {name for name in schema_leaves(METRICS)
                if not name.startswith(("vs_measured.", "vs_target.", "pools.", "transfer.", "fleet.", "hourly.",
                                        "warmup.", "cooldown."))  # a search's: tests/test_search_warmup.py
                # and tests/test_search_cooldown.py
                and not name.endswith("stability.from_sample")  # fleet, hourly, streamed: tests/test_fleet.py
                and name not in ("cost_per_hour", "cost_per_mtok", "energy_cost_per_hour",
                                         "kwh_per_hour")}  # plans add these
    assert declared == pattern


def test_a_disaggregated_runs_pool_and_transfer_metrics_are_declared(tmp_path):
    path = tmp_path / "pd.toml"
    path.write_text(EVERYTHING.replace("[cluster]\ninstances = 2\n", "[cluster]\nmode = \"disaggregated\"\n")
                    .replace("num_blocks = 64", "num_blocks = 64\nbytes_per_block = 1048576"))
    run = run_experiment(load(path)).all_runs()[0]
    assert run.metrics["transfer"]["transfers"] > 0
    names = set(leaves(run.metrics))
    for name in names:
        if not name.endswith("stability.fit"):  # null when there is nothing to fit
            assert check_metric_name(name) == name
    declared = {name for name in schema_leaves(METRICS) if name.startswith(("pools.", "transfer."))}
    assert declared <= names


def test_vs_measured_is_declared_as_compare_makes_it(everything):
    """Only a replayed measured run has it; its keys are those schedlab.results.compare makes."""
    from types import SimpleNamespace

    from schedlab.results.compare import vs_measured

    import numpy as np

    run = everything.all_runs()[0]
    measured = SimpleNamespace(ttft_ms=[10.0, 20.0], tpot_ms=[1.0, 2.0], e2e_ms=[50.0, 60.0])
    assert set(vs_measured(run.requests, measured)) == set(METRICS["vs_measured"]) - {"server"}
    # a client's file with the server's own per-request times has them compared too
    measured = SimpleNamespace(ttft_ms=[10.0, 20.0], tpot_ms=[1.0, 2.0], e2e_ms=[50.0, 60.0], view="client",
                               server_ttft_ms=np.array([5.0, np.nan]), server_queue_ms=np.array([1.0, 2.0]))
    made = vs_measured(run.requests, measured)
    assert set(made) == set(METRICS["vs_measured"])
    assert set(made["server"]) == set(METRICS["vs_measured"]["server"])
    assert check_metric_name("vs_measured.mean_abs_error_pct") == "vs_measured.mean_abs_error_pct"
    assert all(isinstance(made[group], dict) for group in ("errors_pct", "measured"))


def test_vs_target_is_declared_as_targets_makes_it(everything):
    """Only a run with a [target] has it; its keys are those schedlab.targets.vs_target makes."""
    from schedlab.targets import Summary, vs_target

    run = everything.all_runs()[0]
    made = vs_target(Summary("s", "vllm bench serve", {"ttft_ms.mean": 10.0, "e2e_ms.p99": 100.0}), run)
    assert set(made) == set(METRICS["vs_target"])
    assert all(set(made[group]) == {"ttft_ms.mean", "e2e_ms.p99"} for group in ("errors_pct", "measured", "simulated"))
    assert check_metric_name("vs_target.mean_abs_error_pct") == "vs_target.mean_abs_error_pct"


@pytest.mark.parametrize("name, message", [
    ("bogus", "unknown metric 'bogus' (did you mean 'gpus'?): there are "),
    ("ttft_ms.p999", "'ttft_ms' has mean, p50, p90, p95, p99, max"),
    ("ttft_ms", "'ttft_ms' is a group of metrics, not a number; name one of ttft_ms.mean"),
    ("throughput_tps.p99", "'throughput_tps' is a number, it has no 'p99'"),
    ("per_class.chat.goodput_rps", "'per_class.chat' has requests, finished"),
    ("per_class..ttft_ms.p99", "'per_class' has <name>"),
    ("", "a metric name must be dotted text"),
    (5, "a metric name must be dotted text"),
])
def test_names_that_do_not_fit_are_explained(name, message):
    with pytest.raises(ConfigError) as info:
        check_metric_name(name)
    assert message in str(info.value)


def test_names_of_optional_groups_fit_even_when_a_run_lacks_them():
    for name in ("slo.goodput_rps", "per_class.interactive.slo.attainment", "per_instance.3.ttft_ms.p99",
                 "per_client.tenant-7.service_rate", "rejection_reasons.needs # KV blocks", "fairness.jain_service"):
        assert check_metric_name(name) == name


# -- summary.json -------------------------------------------------------------------------------------


def readme_schema() -> str:
    text = (ROOT / "README.md").read_text()
    return re.search(r"```\n(summary\.json\n.*?)```", text, re.S).group(1)


def test_summary_json_has_the_layout_the_readme_documents(everything, tmp_path):
    summary = json.loads(json.dumps(summary_dict(everything)))
    assert summary_problem(summary) is None
    schema = readme_schema()
    documented = set(re.findall(r'"(\w+)":', schema))
    study = summary["studies"][0]
    run = study["runs"][0]
    assert set(summary) | set(study) | set(run) <= documented
    assert {"experiment", "source", "reports", "studies", "name", "kind", "keys", "constraint", "search", "runs",
            "point", "metrics", "meta", "counters"} <= documented
    for level in SUMMARY_LAYOUT.values():  # what `schedlab plot` requires is documented too
        assert set(level) <= documented | {"holds", "status", "message", "probes"}
    for key in ("engine", "instances", "slots", "num_blocks", "seed", "kv_cache"):
        assert key in run["meta"] and key in schema


def test_a_search_in_summary_json_has_the_documented_fields(tmp_path):
    out = tmp_path / "lab"
    assert main(["run", str(ROOT / "experiments" / "lab.toml"), "--out", str(out), "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary_problem(summary) is None
    search = next(s["search"] for s in summary["studies"] if s["kind"] == "search")
    schema = readme_schema()
    for key in search:
        assert f'"{key}"' in schema, key
    for key in search["probes"][0]:
        assert f'"{key}"' in schema, key


@pytest.mark.parametrize("name, meant", [("ttft_ms.median", "ttft_ms.p50"), ("p99_ttft_ms", "ttft_ms.p99"),
                                         ("median_e2el_ms", "e2e_ms.p50"), ("mean_tpot_ms", "tpot_ms.mean")])
def test_a_median_or_vllm_bench_spelling_is_pointed_at_our_name(name, meant):
    """'ttft_ms.median' got 'did you mean ttft_ms.mean?' (another statistic), 'p99_ttft_ms' a group."""
    with pytest.raises(ConfigError, match=rf"^unknown metric '{name}' \(did you mean '{re.escape(meant)}'\?\)"):
        check_metric_name(name)


# --- review results82: a class or client named with a dot ----------------------------------------------


def test_a_name_with_dots_is_found_whole():
    from schedlab.results.metrics import metric_at

    metrics = {"per_class": {"gpt-4": {"ttft_ms": {"p99": 1.0}}, "gpt-4.1": {"ttft_ms": {"p99": 2.0}}},
               "per_client": {"10.0.0.1": {"service": 3.0}}, "ttft_ms": {"p99": 4.0}}
    assert metric_at(metrics, "per_class.gpt-4.ttft_ms.p99") == 1.0
    assert metric_at(metrics, "per_class.gpt-4.1.ttft_ms.p99") == 2.0   # (not gpt-4, then no key '1')
    assert metric_at(metrics, "per_client.10.0.0.1.service") == 3.0
    assert metric_at(metrics, "ttft_ms.p99") == 4.0
    assert metric_at(metrics, "per_class.gpt-4.2.ttft_ms.p99", "missing") == "missing"
    assert metric_at(metrics, "ttft_ms.p99.x", "missing") == "missing"
    for name in ("per_class.gpt-4.1.ttft_ms.p99", "per_client.10.0.0.1.service", "per_class.a.b.c.slo.attainment"):
        assert check_metric_name(name) == name
    with pytest.raises(ConfigError, match=r"unknown metric 'per_class.gpt-4.1.ttft_ms.p42'"):
        check_metric_name("per_class.gpt-4.1.ttft_ms.p42")


def test_a_dotted_class_is_reported_searched_and_its_slo_checked(tmp_path):
    """The table refused ``per_class.gpt-4.1.ttft_ms.p99`` ("'per_class.gpt-4' has requests, ..."), a
    search could not constrain it and plots could not draw it, though the metrics were computed."""
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent("""
        [experiment]
        name = "dots"
        [workload]
        kind = "inline"
        requests = [
          {prompt_tokens = 100, output_tokens = 3, arrival_ms = 0.0, request_class = "gpt-4.1"},
          {prompt_tokens = 200, output_tokens = 5, arrival_ms = 0.0, request_class = "b"},
          {prompt_tokens = 100, output_tokens = 2, arrival_ms = 10.0, request_class = "gpt-4.1"},
        ]
        [cost_model]
        kind = "linear"
        prefill_ms_per_token = 0.05
        decode_ms_per_step = 8.0
        [slo]
        ttft_ms = 20
        [scheduler]
        kind = "continuous"
        max_num_seqs = 4
        [[runs]]
        name = "c"
        search = {key = "scheduler.max_num_seqs", low = 1, high = 4,
                  constraint = "per_class.gpt-4.1.slo.attainment <= 0.5"}
        [reports.table]
        columns = ["finished", "per_class.gpt-4.1.ttft_ms.p50", "per_class.gpt-4.1.slo.attainment"]
    """))
    study = run_experiment(load(path)).studies[0]
    probes = {p.value: p for p in study.search.probes}
    # one sequence at a time: gpt-4.1's requests get their first tokens at 5 ms (100 tokens at 0.05 ms)
    # and at 68 ms (58 ms after arriving: behind b) -- one of two within 20 ms; at four, 15 and 18 ms
    one = probes[1].payload.metrics["per_class"]["gpt-4.1"]
    assert (one["ttft_ms"]["p50"], one["slo"]["attainment"]) == (31.5, 0.5) and probes[1].holds
    assert 4 in probes and not probes[4].holds
    assert probes[4].payload.metrics["per_class"]["gpt-4.1"]["ttft_ms"]["p50"] == pytest.approx(16.5)
