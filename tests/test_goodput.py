"""The ``goodput`` report: DistServe's goodput per GPU from sweeps over the request rate."""

from __future__ import annotations

import textwrap

import pytest

from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.reports.goodput import GoodputConfig, GoodputReport, crossing, systems


def test_the_goodput_is_where_attainment_first_crosses_the_target():
    # 0.95 at 2 req/s, 0.7 at 3: the 90% line is crossed a fifth of the way, at 2.2
    assert crossing([1, 2, 3, 4], [1.0, 0.95, 0.7, 0.2], 0.9) == (pytest.approx(2.2), "")
    # the first drop counts, even if a later rate recovers
    assert crossing([1, 2, 3], [1.0, 0.8, 0.95], 0.9) == (pytest.approx(1.5), "")
    assert crossing([1, 2, 3], [1.0, 0.95, 0.91], 0.9) == (3.0, ">=")
    assert crossing([1, 2, 3], [0.5, 0.95, 0.91], 0.9) == (0.0, "<")
    assert crossing([1, 2], [0.9, 0.9], 0.9) == (2.0, ">=")  # exactly at the target still meets it


def test_the_table_says_what_bounds_a_goodput_the_sweep_did_not_cross():
    """A sweep failing from its lowest rate printed '<0.00', as if nothing were served; its
    goodput is below that rate. The crossing's bracket is the goodput's resolution."""
    from schedlab_plugins.reports.goodput import System

    def system(attainment):
        rates = (4.0, 8.0, 12.0)
        goodput, bound = crossing(rates, attainment, 0.9)
        return System("s", "s", 2, rates, attainment, goodput, bound)

    none = system((0.5, 0.3, 0.1))
    assert (none.shown(), none.shown(per_gpu=True), none.between()) == ("<4.00", "<2.00", "below 4")
    crossed = system((1.0, 0.95, 0.7))  # 8 + 4 x 0.05 / 0.25 = 8.8 requests/s
    assert (crossed.shown(), crossed.shown(per_gpu=True), crossed.between()) == ("8.80", "4.40", "8-12")
    every = system((1.0, 0.95, 0.91))
    assert (every.shown(), every.between()) == (">=12.00", "12 or more")


TOML = """
    [experiment]
    reports = ["goodput"]
    [workload]
    kind = "synthetic"
    num_requests = 60
    prompt = {dist = "fixed", value = 200}
    output = {dist = "fixed", value = 20}
    arrival = "poisson"
    rate = 5
    [scheduler]
    kind = "vllm"
    [cost_model]
    kind = "linear"
    [kv_cache]
    kind = "paged"
    num_blocks = 400
    bytes_per_block = 1048576
    [slo]
    ttft_ms = 100
    tpot_ms = 12
    [reports.goodput]
    metrics = ["tpot_ms.p90"]
    {panels}
    [[runs]]
    name = "one"
    sweep = {"workload.rate" = [2, 8, 32, 128]}
    [[runs]]
    name = "pd"
    cluster = {mode = "disaggregated"}
    sweep = {"workload.rate" = [2, 8, 32, 128]}
    """


def test_the_report_divides_each_sweeps_goodput_by_its_gpus(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text(textwrap.dedent(TOML.replace("{panels}", 'panels = {both = ["one", "pd"]}')))
    exp = load(path)
    results = run_experiment(exp)
    found = {s.label: s for s in systems(results, GoodputConfig())}
    assert (found["one"].gpus, found["pd"].gpus) == (1, 2)
    for s in found.values():
        runs = {r.point["workload.rate"]: r.metrics["slo"]["attainment"] for r in results.study(s.label).runs}
        assert s.attainment == tuple(runs[r] for r in (2, 8, 32, 128))
        assert (s.goodput, s.bound) == crossing(s.rates, s.attainment, 0.9)
        assert s.per_gpu == pytest.approx(s.goodput / s.gpus)
    config = GoodputConfig(metrics=("tpot_ms.p90",), panels={"both": ["one", "pd"]})
    written = GoodputReport(config, stream=open(tmp_path / "out.txt", "w")).write(results, tmp_path)
    text = (tmp_path / "goodput.txt").read_text()
    assert [p.name for p in written] == ["goodput.txt", "goodput.png"]
    line = next(x for x in text.splitlines() if x.startswith("pd "))
    assert line.split()[1:] == ["2", f"{found['pd'].bound}{found['pd'].goodput:.2f}",
                                f"{found['pd'].bound}{found['pd'].per_gpu:.2f}", found["pd"].between()]


def test_a_panel_naming_no_sweep_is_an_error_that_lists_the_sweeps(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text(textwrap.dedent(TOML.replace("{panels}", 'panels = {both = ["one", "pdd"]}')))
    with pytest.raises(ConfigError, match=r"\[reports.goodput\]: panels.both: 'pdd' is not a sweep over "
                                          r"workload.rate; sweeps: one, pd"):
        load(path)  # when the file is read, before anything runs
    path.write_text(textwrap.dedent(TOML.replace("{panels}", 'panels = {both = ["one", "pd"]}')))
    results = run_experiment(load(path))
    config = GoodputConfig(panels={"both": ["one", "pdd"]})  # (and when written, e.g. by schedlab plot)
    with pytest.raises(ConfigError, match=r"panels.both: 'pdd' is not a sweep over workload.rate; sweeps: one, pd"):
        GoodputReport(config, stream=open(tmp_path / "out.txt", "w")).write(results, tmp_path)
