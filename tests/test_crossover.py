"""The ``crossover`` report: where a sweep stops beating a baseline sweep as load grows."""

from __future__ import annotations

import math

import pytest

from schedlab.errors import ConfigError
from schedlab.results import ExperimentResults, RunResult, Study
from schedlab_plugins.reports.crossover import CrossoverConfig, CrossoverReport, compare, crossover_load, render


def fake_run(name: str, point: dict, tpot: float, thr: float) -> RunResult:
    return RunResult(name, {}, {}, {}, {}, {}, {}, {}, {"tpot_ms": {"mean": tpot}, "throughput_tps": thr}, point)


def sweep(name: str, keys: tuple, rows: list[tuple[dict, float, float]]) -> Study:
    return Study(name, "sweep", [fake_run(f"{name}{i}", p, t, h) for i, (p, t, h) in enumerate(rows)], keys=keys)


LOAD = "workload.clients"


def results() -> ExperimentResults:
    plain = sweep("plain", (LOAD,), [({LOAD: c}, t, h) for c, t, h in [(1, 10.0, 100), (4, 10.0, 400), (16, 10.0, 1600)]])
    # two lines: rate 0.5 better only at load 1; rate 0.9 better everywhere
    spec = sweep("alpha", (LOAD, "speculative.acceptance_rate"), [
        ({LOAD: 1, "speculative.acceptance_rate": 0.5}, 5.0, 200),
        ({LOAD: 4, "speculative.acceptance_rate": 0.5}, 8.0, 500),
        ({LOAD: 16, "speculative.acceptance_rate": 0.5}, 14.0, 1200),
        ({LOAD: 1, "speculative.acceptance_rate": 0.9}, 4.0, 250),
        ({LOAD: 4, "speculative.acceptance_rate": 0.9}, 5.0, 800),
        ({LOAD: 16, "speculative.acceptance_rate": 0.9}, 9.0, 1700),
    ])
    worse = sweep("slow", (LOAD,), [({LOAD: c}, 20.0, 50) for c in (1, 4, 16)])
    return ExperimentResults("exp", "", [plain, spec, worse], {})


def test_a_tie_at_light_load_is_neither_side():
    """Both lines meet every SLO at a light load (attainment 1 and 1): the tie used to read as
    'never better' for a line that then wins and later loses."""
    load, side = crossover_load((1.0, 2.0, 4.0, 8.0), (1.0, 1.0, 1.25, 0.8), "higher")
    assert side == "inside" and 4.0 < load < 8.0
    # 1.25 -> 0.8 crosses 1 at 5/9 of the way, in log(load): 4 x 2^(5/9)
    assert load == pytest.approx(4.0 * 2 ** (5 / 9))
    # equal at every load: neither better nor worse (it read "never better", "< 1")
    assert crossover_load((1.0, 2.0), (1.0, 1.0), "higher") == (None, "tie")
    assert crossover_load((1.0, 2.0), (1.0, 0.9), "higher") == (None, "below")  # ties, then worse: never better


def test_crossover_load_by_hand():
    # ratios 0.5, 0.8, 1.4 at loads 1, 4, 16 (lower is better): between 4 and 16 the ratio
    # climbs 0.6 and reaches 1 a third of the way, in log(load): 4 * 4^(1/3) = 6.35
    load, side = crossover_load((1.0, 4.0, 16.0), (0.5, 0.8, 1.4), "lower")
    assert side == "inside" and load == pytest.approx(4 * 4 ** (1 / 3), rel=1e-12)
    assert crossover_load((1.0, 4.0), (0.5, 0.9), "lower") == (None, "above")
    assert crossover_load((1.0, 4.0), (1.1, 0.9), "lower") == (None, "below")
    # higher is better: 2.0 falls to 0.5, reaching 1 two thirds of the way: 4^(2/3)
    load, side = crossover_load((1.0, 4.0), (2.0, 0.5), "higher")
    assert side == "inside" and load == pytest.approx(4 ** (2 / 3), rel=1e-12)


def test_report_compares_every_line_with_the_baseline(tmp_path):
    config = CrossoverConfig(baseline="plain", load=LOAD, metric="tpot_ms.mean", ratios=("throughput_tps",), dpi=50)
    lines = compare(results(), config)
    assert [(line.study, line.label) for line in lines] == [("alpha", "acceptance_rate=0.5"),
                                                           ("alpha", "acceptance_rate=0.9"), ("slow", "slow")]
    half, nine, slow = lines
    assert half.ratios == (0.5, 0.8, 1.4) and half.side == "inside"
    assert half.crossover == pytest.approx(6.3496, rel=1e-4)
    assert nine.side == "above" and nine.crossover is None
    assert slow.side == "below"
    assert half.extra["throughput_tps"] == (2.0, 0.75)  # 200/100 at the lowest load, 1200/1600 at the highest
    text = render(lines, config)
    assert "6.35" in text and "> 16" in text and "< 1" in text
    written = CrossoverReport(config, stream=open(tmp_path / "stdout.txt", "w")).write(results(), tmp_path)
    assert [p.name for p in written] == ["crossover.txt", "crossover.csv", "crossover.png"]
    rows = (tmp_path / "crossover.csv").read_text().splitlines()
    assert rows[1].startswith("alpha,acceptance_rate=0.5,6.3496,inside,1 4 16,0.5 0.8 1.4,2,0.75")


def test_report_errors_name_the_setting():
    with pytest.raises(ConfigError, match="baseline 'nope' must be a sweep over 'workload.clients'"):
        compare(results(), CrossoverConfig(baseline="nope"))
    with pytest.raises(ConfigError, match="baseline 'alpha' must sweep only 'workload.clients'"):
        compare(results(), CrossoverConfig(baseline="alpha"))
    with pytest.raises(ConfigError, match="'missing' is not a sweep"):
        compare(results(), CrossoverConfig(baseline="plain", studies=("missing",)))


def test_missing_points_are_skipped():
    res = results()
    res.studies[1].runs[1].metrics["tpot_ms"]["mean"] = math.nan  # alpha 0.5 at load 4
    line = compare(res, CrossoverConfig(baseline="plain", metric="tpot_ms.mean"))[0]
    assert line.loads == (1.0, 16.0)
    assert line.crossover == pytest.approx(math.exp(math.log(16) * 0.5 / 0.9), rel=1e-12)
