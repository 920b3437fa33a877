"""The shipped H100 runs (experiments/data/inference_perf_h100) and the experiment that replays
them: the experiment's stages are the reports' stages, the comparison reads the reports, and
the simulation stays where the README's table puts it on the stages whose outcome does not
hinge on the saturation point (the lowest rate, and the highest, where the client's cap of 440
requests in flight decides the queue)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import attrs
import pytest

from schedlab.study.experiment import load, run_experiment
from schedlab.targets import read_summary

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "h100_inference_perf.toml"
DATA = ROOT / "experiments" / "data" / "inference_perf_h100"
VARIANTS = ("vllm", "batch_size", "chunking_and_prefix_caching")
OUTPUT_TOKENS = 64


def report(variant: str, stage: int) -> dict:
    return json.loads((DATA / variant / f"stage_{stage}_lifecycle_metrics.json").read_text())


def test_every_stage_run_replays_its_report():
    """21 runs, one per report; each sends what the stage sent (floor(rate x 60 s) requests at
    the stage's requested rate) and compares with that stage's report."""
    exp = load(EXPERIMENT)
    assert len(exp.studies) == 21
    for study in exp.studies:
        variant, stage = re.fullmatch(r"(.+)-(\d)", study.name).groups()
        data = report(variant, int(stage))
        tables = study.base.tables
        path = (EXPERIMENT.parent / tables["target"]["path"]).resolve()
        assert path == DATA / variant / f"stage_{stage}_lifecycle_metrics.json"
        (stage_table,) = tables["workload"]["stages"]
        assert stage_table["rate"] == data["load_summary"]["requested_rate"]
        sent = data["successes"]["count"] + (data.get("failures") or {}).get("count", 0)
        assert int(stage_table["rate"] * stage_table["duration_s"] + 1e-9) == sent


def test_the_reports_read_as_inference_perf_summaries():
    s = read_summary(DATA / "vllm" / "stage_0_lifecycle_metrics.json")
    assert s.kind == "inference-perf" and s.view == "client" and s.requests == 60
    assert s.values["ttft_ms.mean"] == pytest.approx(31.127, abs=0.01)
    assert s.values["e2e_ms.mean"] == pytest.approx(480.482, abs=0.01)


def replay(variant: str, stages, overrides=()) -> dict:
    """The experiment's runs of ``variant``'s ``stages``, by name."""
    exp = load(EXPERIMENT, list(overrides))
    names = {f"{variant}-{k}" for k in stages}
    exp = attrs.evolve(exp, studies=[s for s in exp.studies if s.name in names])
    return {r.name: r for r in run_experiment(exp).all_runs()}


def itl(vs: dict, side: str) -> float:
    return (vs[side]["e2e_ms.mean"] - vs[side]["ttft_ms.mean"]) / (OUTPUT_TOKENS - 1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_low_and_saturated_stages_stay_within_the_readme_bounds(variant):
    """Stage 0 (1 request/s): the inter-token latency within 5% and the latency within 10%;
    stage 2 (62-86 requests/s, below capacity, a step of up to ~100 decodes beside a prompt):
    both within 5% -- with FlashAttention 2's mixed-step penalty, which the H100 does not pay,
    they were 4-17% long; stage 6 (past capacity, 440 in flight): the inter-token latency within
    12%, the latency within 15%. Without the client's cap the same stage's queue grows for the
    whole minute and the latency is off by more than 100%."""
    runs = replay(variant, (0, 2, 6))
    low, mid, high = (runs[f"{variant}-{k}"].metrics["vs_target"] for k in (0, 2, 6))
    assert abs(itl(low, "simulated") / itl(low, "measured") - 1) < 0.05
    assert abs(low["errors_pct"]["e2e_ms.mean"]) < 10
    # the client's TTFT at 1 request/s (30-33 ms): short by the load generator's own ~10-13 ms, no
    # longer by the API server's way out too (9.9 ms, measured on vLLM's own client: -66% without it)
    assert -45 < low["errors_pct"]["ttft_ms.mean"] < -30
    assert abs(itl(mid, "simulated") / itl(mid, "measured") - 1) < 0.05
    assert abs(mid["errors_pct"]["e2e_ms.mean"]) < 5
    assert abs(itl(high, "simulated") / itl(high, "measured") - 1) < 0.12
    assert abs(high["errors_pct"]["e2e_ms.mean"]) < 15
    uncapped = replay(variant, (6,), ["workload.max_concurrency=1000000"])[f"{variant}-6"].metrics["vs_target"]
    assert uncapped["errors_pct"]["e2e_ms.mean"] > 100


def test_the_tool_derives_the_inter_token_latency_from_the_means_by_hand(tmp_path):
    """Measured 480 ms latency and 30 ms TTFT: (480 - 30) / 63 = 7.142857 ms a token; simulated
    450 and 11.1: 6.966667 -- -2.467% -- beside the E2E and TTFT errors the run reports."""
    sys.path.insert(0, str(ROOT / "tools"))
    import validate_h100

    report = tmp_path / "stage.json"
    report.write_text(json.dumps({"load_summary": {"requested_rate": 1.0}}))
    vs = {"measured": {"e2e_ms.mean": 480.0, "ttft_ms.mean": 30.0},
          "simulated": {"e2e_ms.mean": 450.0, "ttft_ms.mean": 11.1},
          "errors_pct": {"e2e_ms.mean": -6.25, "ttft_ms.mean": -63.0}}
    run = {"name": "vllm-0", "metrics": {"vs_target": vs}, "meta": {"target": {"path": str(report)}}}
    (tmp_path / "summary.json").write_text(json.dumps({"studies": [{"runs": [run]}]}))
    ((name, e2e, ttft, gap),) = validate_h100.rows(tmp_path)
    assert (name, e2e, ttft) == ("vllm-0", -6.25, -63.0)
    assert gap == pytest.approx(100 * (6.966667 / 7.142857 - 1), abs=1e-3)
    assert "| **median \\|error\\| over 1 stages** | 6.2% | 63.0% | 2.5% |" in validate_h100.table(tmp_path)
