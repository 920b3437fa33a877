"""A small experiment with every kind of study, shared by the executor tests (local and Ray)."""

from __future__ import annotations

from pathlib import Path

from schedlab.results_io import save

EXPERIMENT = """
[experiment]
name = "every_study"
seed = {seed}

[workload]
kind = "synthetic"
num_requests = 60
rate = 8.0
prompt = {{dist = "lognormal", median = 200, sigma = 0.5, high = 2000}}
output = {{dist = "lognormal", median = 50, sigma = 0.5, high = 400}}

[cost_model]
kind = "linear"

[scheduler]
kind = "continuous"
max_num_seqs = 8

[[runs]]
name = "one"

[[runs]]
name = "grid"
sweep = {{"scheduler.max_num_seqs" = [2, 4, 16]}}

[[runs]]
name = "tune"
search = {{key = "scheduler.max_num_seqs", low = 1, high = 40, constraint = "ttft_ms.p99 <= 400", maximize = false}}

[[runs]]
name = "rep"
replicas = 3
"""
FILES = ("summary.json", "summary.csv", "requests.csv", "timeline.csv", "config.json")


def write_experiment(folder: Path, seed: int) -> Path:
    path = folder / "every_study.toml"
    path.write_text(EXPERIMENT.format(seed=seed))
    return path


def saved_bytes(results, folder: Path) -> dict[str, bytes]:
    """The result files (all but timings.json, which holds wall-clock times) as bytes."""
    save(results, folder)
    return {name: (folder / name).read_bytes() for name in FILES}
