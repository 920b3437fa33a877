"""Seed 001's lab from experiments/lab.toml: the artifacts' numbers, not only their format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from schedlab.cli import main
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.reports.lab import LabReport

LAB = Path(__file__).resolve().parent.parent / "experiments" / "lab.toml"


def parse_fields(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in (part.split("=") for part in line.split())}


def lab_artifacts(overrides=()):
    exp = load(LAB, list(overrides))
    results = run_experiment(exp)
    return LabReport().artifacts(results), results


def check_lab(artifacts, results):
    static = parse_fields(artifacts["static.txt"])
    assert set(static) == {"total_steps", "throughput_tps", "slot_util"}
    assert static["total_steps"] == int(static["total_steps"]) > 0
    assert 0 < static["slot_util"] < 0.7

    compare = parse_fields(artifacts["compare.txt"])
    assert compare["static_tps"] == static["throughput_tps"]
    assert compare["speedup"] >= 1.8
    assert compare["speedup"] == pytest.approx(compare["continuous_tps"] / compare["static_tps"], rel=1e-3)

    maxseqs = parse_fields(artifacts["maxseqs.txt"])
    assert maxseqs["max_num_seqs"] == 32
    assert 0 < maxseqs["peak_running"] <= 32

    lines = artifacts["queue.csv"].strip().split("\n")
    assert lines[0] == "rps,avg_queue,p99_wait_ms"
    rows = [list(map(float, line.split(","))) for line in lines[1:]]
    assert [r[0] for r in rows] == [5, 10, 20, 40]
    waits = [r[2] for r in rows]
    assert all(b >= a for a, b in zip(waits, waits[1:])), waits   # never falls as load rises
    assert waits[-1] > 2 * waits[0] + 8.0, waits                  # clearly higher at 40 than at 5

    cost = parse_fields(artifacts["cost.txt"])
    assert 0 < cost["decode_share"] < 1
    assert cost["decode_share"] == pytest.approx(
        cost["total_decode_ms"] / (cost["total_decode_ms"] + cost["total_prefill_ms"]), abs=1e-4)

    tune = parse_fields(artifacts["tune.txt"])
    assert tune["target_ttft_ms"] == 200
    n = int(tune["max_concurrency"])
    runs = {r.point["workload.clients"]: r for r in results.study("tune").runs}
    assert runs[n].metrics["ttft_ms"]["p99"] <= 200
    assert n + 1 in runs and runs[n + 1].metrics["ttft_ms"]["p99"] > 200  # range top (256) not reached
    assert tune["throughput_at_target"] == pytest.approx(runs[n].metrics["throughput_tps"], rel=1e-4)


def test_lab_on_the_shipped_requests():
    artifacts, results = lab_artifacts()
    check_lab(artifacts, results)
    # step 7 by hand from the request file: prompt x 0.05 ms and output x 8 ms
    data = json.loads((LAB.parent / "data" / "requests.json").read_text())["requests"]
    cost = parse_fields(artifacts["cost.txt"])
    assert cost["total_prefill_ms"] == pytest.approx(sum(r["prompt_tokens"] for r in data) * 0.05, abs=1e-4)
    assert cost["total_decode_ms"] == pytest.approx(sum(r["output_tokens"] for r in data) * 8.0, abs=1e-4)
    # step 6's queue: stable below the service rate, growing above it (40/s clearly; 20/s grows
    # too, but 100 requests are too few to be sure); steps 1-5 have no arrival rate; the closed
    # loop never lets its queue grow
    verdict = {r.point["workload.rate"]: r.metrics["stability"]["verdict"] for r in results.study("queue").runs}
    assert verdict == {5: "stable", 10: "stable", 20: "inconclusive", 40: "unstable"}
    assert {results.study(s).runs[0].metrics["stability"]["verdict"] for s in ("static", "continuous")} == {"n/a"}
    assert {r.metrics["stability"]["verdict"] for r in results.study("tune").runs} == {"stable"}


@pytest.mark.parametrize("seed,shape", [(7, "uniform"), (11, "lognormal")])
def test_lab_on_other_request_sets(tmp_path, seed, shape):
    """--set workload.path reruns the whole lab; the criteria hold on any reasonably varied set."""
    rng = np.random.default_rng(seed)
    if shape == "uniform":
        outputs = rng.integers(10, 1001, 100)
    else:
        outputs = np.clip(rng.lognormal(np.log(150), 1.0, 100), 10, 1000).astype(int)
    prompts = rng.integers(16, 1500, 100)
    path = tmp_path / "other.json"
    path.write_text(json.dumps([{"prompt_tokens": int(p), "output_tokens": int(o)} for p, o in zip(prompts, outputs)]))
    artifacts, results = lab_artifacts([f"workload.path={path}"])
    check_lab(artifacts, results)
    assert results.study("static").runs[0].metrics["requests"] == 100


def test_static_artifact_matches_a_hand_computation(tmp_path):
    # 20 requests all at t=0, batch 16: batch 1 = requests 0-15, batch 2 = 16-19.
    # A batch costs one prefill iteration (0.05 ms x its prompt tokens) and (longest - 1) decode
    # steps of 8 ms; it takes `longest` iterations.
    prompts = [10 * (i + 1) for i in range(20)]
    outputs = [(i * 37) % 50 + 5 for i in range(20)]
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"requests": [{"prompt_tokens": p, "output_tokens": o}
                                             for p, o in zip(prompts, outputs)]}))
    batches = [range(0, 16), range(16, 20)]
    steps = sum(max(outputs[i] for i in b) for b in batches)
    makespan = sum(0.05 * sum(prompts[i] for i in b) + 8.0 * (max(outputs[i] for i in b) - 1) for b in batches)
    exp = load(LAB, [f"workload.path={path}"])
    exp.studies = [s for s in exp.studies if s.name == "static"]
    artifacts = LabReport().artifacts(run_experiment(exp))
    static = parse_fields(artifacts["static.txt"])
    assert static["total_steps"] == steps
    assert static["throughput_tps"] == pytest.approx(sum(outputs) / (makespan / 1000), abs=1e-4)
    assert static["slot_util"] == pytest.approx(sum(outputs) / (steps * 16), abs=1e-4)
    assert set(artifacts) == {"static.txt"}


def test_lab_command_writes_the_six_artifacts(tmp_path):
    out = tmp_path / "lab"
    assert main(["run", str(LAB), "--out", str(out), "--no-plots"]) == 0
    for name in ("static.txt", "compare.txt", "maxseqs.txt", "queue.csv", "cost.txt", "tune.txt"):
        text = (out / name).read_text()
        assert text.endswith("\n") and "nan" not in text.lower(), name
    assert all(math.isfinite(v) for v in parse_fields((out / "compare.txt").read_text()).values())


def test_the_seeds_conditions_a_request_set_misses_are_said():
    """Even answers leave static batching few idle slots: seed 001's slot_util < 0.7 and speedup >=
    1.8 do not hold, and the report said nothing."""
    report = LabReport()
    artifacts = {"static.txt": "total_steps=100 throughput_tps=500.0 slot_util=0.8929\n",
                 "compare.txt": "static_tps=500.0 continuous_tps=775.35 speedup=1.5507\n",
                 "maxseqs.txt": "max_num_seqs=32 peak_running=32\n",
                 "queue.csv": "rps,avg_queue,p99_wait_ms\n5,0.1,34.5\n10,0.2,38.7\n20,3,731.2\n40,9,2299.8\n"}
    assert report.seed_misses(artifacts) == [
        "schedlab: lab report: static.txt's slot_util=0.8929 (the seed expects < 0.7)",
        "schedlab: lab report: compare.txt's speedup=1.5507 (the seed expects >= 1.8)"]
    artifacts["static.txt"] = "total_steps=100 throughput_tps=500.0 slot_util=0.291\n"
    artifacts["compare.txt"] = "static_tps=500.0 continuous_tps=2070.0 speedup=4.14\n"
    artifacts["queue.csv"] = "rps,avg_queue,p99_wait_ms\n5,0.1,34.5\n10,0.2,34.5\n"
    assert report.seed_misses(artifacts) == [
        "schedlab: lab report: queue.csv's p99_wait_ms does not rise with rps (the seed expects it to)"]
