"""Replicas: derived seeds, means with 95% intervals, paired differences, and how they show."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from schedlab.errors import ConfigError
from schedlab.results.storage import jsonable, load as load_results, save
from schedlab.study.experiment import load, run_experiment
from schedlab.study.replicas import mean_interval, paired_difference, replica_seed, t_quantile_975
from schedlab_plugins.reports.plot_compare import compare_figure
from schedlab_plugins.reports.plot_sweep import sweep_figure
from schedlab_plugins.reports.table import render

EXPERIMENT = """
[experiment]
name = "reps"
seed = 21
replicas = 4
timeline = false

[workload]
kind = "synthetic"
num_requests = 80
rate = 9.0
prompt = {dist = "lognormal", median = 300, sigma = 0.6, high = 3000}
output = {dist = "lognormal", median = 60, sigma = 0.7, high = 500}

[cost_model]
kind = "linear"

[scheduler]
kind = "continuous"
max_num_seqs = 8

[[runs]]
name = "base"

[[runs]]
name = "same_again"

[[runs]]
name = "more_slots"
scheduler = {max_num_seqs = 32}

[[runs]]
name = "load"
sweep = {"workload.rate" = [3.0, 9.0]}
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("reps") / "reps.toml"
    path.write_text(EXPERIMENT)
    return run_experiment(load(path))


def t_cdf(q: float, df: int) -> float:
    """Student's t CDF by Simpson's rule on the density (an independent check of the table)."""
    x = np.linspace(0.0, q, 200_001)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    h = x[1] - x[0]
    return 0.5 + h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())


@pytest.mark.parametrize("df", [1, 2, 3, 4, 9, 19, 29, 30, 31, 45, 100, 1000])
def test_t_quantiles_are_the_975_quantiles_of_student_t(df):
    assert t_cdf(t_quantile_975(df), df) == pytest.approx(0.975, abs=2e-6)


@pytest.mark.parametrize("k", [2, 3, 5, 10])
def test_intervals_cover_the_true_mean_at_the_nominal_rate_for_normal_samples(k):
    rng = np.random.default_rng(20240)
    trials = 4000
    covered = sum(mean_interval(rng.normal(3.0, 2.0, size=k)).contains(3.0) for _ in range(trials))
    # exact for normal samples: 95%; binomial standard error 0.34 points at 4,000 trials
    assert covered / trials == pytest.approx(0.95, abs=0.012)


def test_intervals_cover_a_skewed_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(7)
    trials = 3000
    covered = sum(mean_interval(rng.exponential(5.0, size=40)).contains(5.0) for _ in range(trials))
    assert 0.925 <= covered / trials <= 0.96  # t intervals run a little short on skewed data


def test_interval_by_hand():
    iv = mean_interval([1.0, 2.0, 6.0, float("nan"), None])
    # mean 3, s = sqrt(((-2)^2 + (-1)^2 + 3^2) / 2) = sqrt(7), t(0.975, 2) = 4.302653
    assert iv.mean == 3.0 and iv.count == 3
    assert iv.half_width == pytest.approx(4.302653 * math.sqrt(7) / math.sqrt(3))
    assert math.isnan(mean_interval([4.0]).low) and mean_interval([4.0]).mean == 4.0
    assert mean_interval([]).count == 0


def test_replica_seeds_are_derived_from_the_seed_alone():
    seeds = [replica_seed(21, i) for i in range(6)]
    assert len(set(seeds)) == 6 and all(0 <= s < 2**32 for s in seeds)
    assert seeds == [replica_seed(21, i) for i in range(6)]  # deterministic
    assert seeds[:3] != [replica_seed(22, i) for i in range(3)]  # another seed, other replicas


def test_every_replica_is_the_plain_run_with_its_seed(results, tmp_path):
    base = results.study("base").runs[0]
    assert [r.name for r in base.replicas] == ["base#1", "base#2", "base#3", "base#4"]
    assert base.meta["replica_seeds"] == [replica_seed(21, i) for i in range(4)]
    second = base.replicas[1]
    (tmp_path / "one.toml").write_text(EXPERIMENT.replace("seed = 21\nreplicas = 4", f"seed = {replica_seed(21, 1)}"))
    plain = run_experiment(load(tmp_path / "one.toml")).study("base").runs[0]
    assert json.dumps(jsonable(plain.metrics)) == json.dumps(jsonable(second.metrics))  # NaN == NaN here
    assert np.array_equal(plain.requests["finish_ms"], second.requests["finish_ms"])


def test_metrics_are_means_with_t_intervals(results):
    run = results.study("more_slots").runs[0]
    values = np.array([r.metrics["ttft_ms"]["p99"] for r in run.replicas])
    assert len(set(values.tolist())) == 4  # the replicas differ
    assert run.metrics["ttft_ms"]["p99"] == pytest.approx(values.mean())
    half = 3.182446 * values.std(ddof=1) / 2  # t(0.975, 3) s / sqrt(4)
    low, high = run.intervals["ttft_ms.p99"]
    assert (low, high) == pytest.approx((values.mean() - half, values.mean() + half))
    assert run.metrics["requests"] == 80  # equal in every replica: kept as it is
    assert "per_instance.0.requests" in run.intervals or "requests" in run.intervals


def test_a_key_some_replicas_lack_is_an_entry_that_did_not_occur_there():
    """Counts and totals of an absent entry (an hour, a rejection reason, a class) are 0 in that
    replica, its statistics have no value there; a table a replica did not compute is left out.
    Before: the hour a first replica lacked was null, and counters were averaged over the
    replicas that had them (queue_full: 3.0, not 1.5)."""
    from schedlab.study.replicas import _combine_metrics

    nan = math.nan
    one = {"requests": 10, "rejection_reasons": {},
           "hourly": {"0": {"requests": 4, "slo_attainment": 0.5, "gpu_hours": 1.0}},
           "per_class": {"chat": {"requests": 4, "throughput_tps": 2.0, "ttft_ms": {"p99": 30.0},
                                  "slo": {"attainment": 0.5, "met": 2}}}}
    two = {"requests": 10, "rejection_reasons": {"queue_full": 3},
           "hourly": {"0": {"requests": 2, "slo_attainment": 1.0, "gpu_hours": 1.0},
                      "1": {"requests": 2, "slo_attainment": 1.0, "gpu_hours": 0.5}},
           "per_class": {"chat": {"requests": 2, "throughput_tps": 1.0, "ttft_ms": {"p99": 10.0},
                                  "slo": {"attainment": 1.0, "met": 2}},
                         "batch": {"requests": 6, "throughput_tps": 3.0, "ttft_ms": {"p99": 90.0},
                                   "slo": {"attainment": nan, "met": 0}}},
           "fleet": {"scale_ups": 4}}
    intervals: dict = {}
    combined = _combine_metrics([one, two], "", intervals)
    assert combined["requests"] == 10
    assert combined["rejection_reasons"] == {"queue_full": 1.5}
    assert combined["hourly"]["0"] == {"requests": 3.0, "slo_attainment": 0.75, "gpu_hours": 1.0}
    assert combined["hourly"]["1"] == {"requests": 1.0, "slo_attainment": 1.0, "gpu_hours": 0.25}
    batch = combined["per_class"]["batch"]
    assert (batch["requests"], batch["throughput_tps"], batch["ttft_ms"]["p99"]) == (3.0, 1.5, 90.0)
    assert math.isnan(batch["slo"]["attainment"]) and batch["slo"]["met"] == 0.0
    assert combined["fleet"] == {"scale_ups": 4}   # a table only one replica computed: its value
    half = 12.706205 * math.sqrt(2 * 0.25 ** 2) / math.sqrt(2)   # t(0.975, 1) s / sqrt(2), values 0 and 0.5
    assert intervals["hourly.1.gpu_hours"] == pytest.approx([0.25 - half, 0.25 + half])
    # the first replica lacking an hour the others have (the draining hour) no longer makes it null
    assert _combine_metrics([{"hourly": {}}, {"hourly": {"3": {"requests": 1, "gpu_hours": 0.1}}}], "", {}) == \
        {"hourly": {"3": {"requests": 0.5, "gpu_hours": 0.05}}}


def test_paired_differences_use_common_random_numbers(results):
    base, same, more = (results.study(n).runs[0] for n in ("base", "same_again", "more_slots"))
    same_d = paired_difference(base, same, "ttft_ms.p99")
    assert same_d.mean == 0 and same_d.within_noise  # same config, same seeds: identical replicas
    d = paired_difference(base, more, "ttft_ms.p99")
    by_hand = [m.metrics["ttft_ms"]["p99"] - b.metrics["ttft_ms"]["p99"] for b, m in zip(base.replicas, more.replicas)]
    assert d.mean == pytest.approx(np.mean(by_hand))
    assert not d.within_noise and d.high < 0  # 32 slots: a shorter TTFT tail on every draw


def test_table_shows_intervals_and_says_what_is_within_noise(results):
    text = render(results, ("ttft_ms.p99", "throughput_tps"), best="ttft_ms.p99", best_is="lowest",
                  differences=("ttft_ms.p99", "throughput_tps"))
    row = next(line for line in text.splitlines() if line.startswith("more_slots"))
    half = (lambda lo, hi: (hi - lo) / 2)(*results.study("more_slots").runs[0].intervals["ttft_ms.p99"])
    assert f"±{half:.1f}" in row or f"±{half:,.0f}" in row
    assert "paired differences vs base (4 replicas each, common random numbers" in text
    same = next(line for line in text.splitlines() if line.startswith("  same_again"))
    assert same.count("within noise") == 2  # identical replicas: both differences are 0
    more = next(line for line in text.splitlines() if line.startswith("  more_slots"))
    assert more.split("throughput_tps")[0].count("within noise") == 0


def test_best_within_noise_of_the_runner_up_is_said(results):
    text = render(results, ("ttft_ms.p99",), best="throughput_tps", best_is="highest")
    best_line = next(line for line in text.splitlines() if "best throughput_tps" in line)
    assert "within noise of" in best_line  # max_num_seqs barely changes throughput here


def test_saved_results_keep_intervals_and_replicas(results, tmp_path):
    save(results, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    saved = summary["studies"][2]["runs"][0]
    assert len(saved["replicas"]) == 4 and saved["replicas"][0]["name"] == "more_slots#1"
    assert "wall_ms" not in saved["meta"]
    rows = (tmp_path / "requests.csv").read_text().splitlines()
    assert sum(row.startswith("more_slots#3,") for row in rows) == 80
    back = load_results(tmp_path).study("more_slots").runs[0]
    fresh = results.study("more_slots").runs[0]
    assert back.intervals["ttft_ms.p99"] == pytest.approx(fresh.intervals["ttft_ms.p99"])
    assert [r.name for r in back.replicas] == [r.name for r in fresh.replicas]


def test_plots_draw_the_intervals(results):
    fig = sweep_figure(results.study("load"), ["ttft_ms.p99"], 60)
    bands = [c for ax in fig.axes for c in ax.collections if (c.get_gid() or "").startswith("interval:")]
    assert [b.get_gid() for b in bands] == ["interval:ttft_ms.p99:0"]
    low, high = results.study("load").runs[1].intervals["ttft_ms.p99"]
    path = bands[0].get_paths()[0].vertices
    assert path[:, 1].min() == pytest.approx(min(results.study("load").runs[0].intervals["ttft_ms.p99"][0], low))
    assert path[:, 1].max() == pytest.approx(max(results.study("load").runs[0].intervals["ttft_ms.p99"][1], high))
    singles = [s.runs[0] for s in results.studies if s.kind == "run"]
    fig = compare_figure(singles, ["ttft_ms.p99"], 60)
    bars = {c.get_gid() for ax in fig.axes for c in ax.collections}
    assert {f"interval:ttft_ms.p99:{r.name}" for r in singles} <= bars


def test_searches_test_the_mean_of_their_replicas(tmp_path):
    text = EXPERIMENT.split("[[runs]]")[0] + textwrap.dedent("""
        [search]
        key = "scheduler.max_num_seqs"
        low = 1
        high = 32
        constraint = "ttft_ms.p99 <= 600"
        maximize = false
        """)
    (tmp_path / "s.toml").write_text(text.replace("replicas = 4", "replicas = 3"))
    study = run_experiment(load(tmp_path / "s.toml")).studies[0]
    outcome = study.search
    assert outcome.status == "found"
    for probe in outcome.probes:
        run = probe.payload
        assert len(run.replicas) == 3
        mean = np.mean([r.metrics["ttft_ms"]["p99"] for r in run.replicas])
        assert probe.holds == (mean <= 600)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_replicas_must_be_a_positive_whole_number(tmp_path, value):
    (tmp_path / "r.toml").write_text(EXPERIMENT.replace('name = "more_slots"', f'name = "more_slots"\nreplicas = {json.dumps(value)}'))
    with pytest.raises(ConfigError, match="replicas"):
        load(tmp_path / "r.toml")


def test_a_replicated_runs_stability_is_every_replicas_not_the_firsts():
    """The verdict (the table's mark, the sweep plot's rings) was replica 1's: a load two of five
    draws overload read stable."""
    from schedlab.study.replicas import combined_stability

    mean = {"verdict": "stable", "reason": "r1", "arrival_rps": 11.7}
    mixed = [{"verdict": "stable", "reason": "r1"}, {"verdict": "unstable", "reason": "grows"},
             {"verdict": "inconclusive", "reason": "noise"}, {"verdict": "unstable", "reason": "grows more"}]
    combined = combined_stability(mixed, mean)
    assert combined["verdict"] == "unstable" and combined["arrival_rps"] == 11.7
    assert combined["reason"] == "2 of 4 replicas unstable; replica 2: grows"
    undecided = combined_stability([mixed[0], mixed[2]], mean)
    assert undecided["verdict"] == "inconclusive" and undecided["reason"].startswith("1 of 2 replicas inconclusive")
    assert combined_stability([mixed[0], mixed[0]], mean)["reason"] == "all 2 replicas stable; replica 1: r1"


def test_a_replicated_run_reads_unstable_when_any_replica_does(tmp_path):
    path = tmp_path / "rep.toml"
    path.write_text(textwrap.dedent("""
        [experiment]
        seed = 4
        replicas = 5
        [workload]
        kind = "synthetic"
        num_requests = 300
        rate = 12.0
        prompt = {dist = "lognormal", median = 300, sigma = 0.6, high = 3000}
        output = {dist = "lognormal", median = 120, sigma = 0.7, high = 1000}
        [cost_model]
        kind = "linear"
        [scheduler]
        kind = "continuous"
        max_num_seqs = 16
    """))
    run = run_experiment(load(path)).all_runs()[0]
    verdicts = [r.metrics["stability"]["verdict"] for r in run.replicas]
    assert "unstable" in verdicts and verdicts[0] != "unstable"   # (the case: replica 1 alone reads otherwise)
    assert run.metrics["stability"]["verdict"] == "unstable"
    assert run.metrics["stability"]["reason"].startswith(f"{verdicts.count('unstable')} of 5 replicas unstable")


def test_floating_point_noise_of_agreeing_replicas_is_no_interval():
    """A replayed file draws nothing at random: replicas agree but for the last bits, and the table
    printed 8,038.5 ±2.73e-12 as if it were an interval."""
    import types

    from schedlab_plugins.reports.table import _cell

    def cell(low, high, mean):
        return _cell(types.SimpleNamespace(metrics={"x": mean}, intervals={"x": [low, high]}), "x")

    assert cell(8038.5 - 2.73e-12, 8038.5 + 2.73e-12, 8038.5) == "8,038.5"
    assert cell(0.2458 - 8.33e-17, 0.2458 + 8.33e-17, 0.2458) == "0.2458"
    assert cell(8000.0, 8100.0, 8050.0) == "8,050.0 ±50.0"
