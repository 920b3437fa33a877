"""Small experiments shared by the executor tests (local and Ray): every kind of study, and a plan."""

from __future__ import annotations

from pathlib import Path

from schedlab.results.storage import save

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

# A small capacity plan (tests/test_planner.py checks it against the exhaustive grid).
BASE = """
[experiment]
name = "tiny_plan"
timeline = false

[workload]
kind = "synthetic"
num_requests = 300
rate = 16.0
prompt = {dist = "lognormal", median = 500, sigma = 0.6, high = 4000}
output = {dist = "lognormal", median = 150, sigma = 0.6, high = 800}

[cost_model]
kind = "roofline"
model = "llama-3-8b"

[kv_cache]
kind = "paged"
model = "llama-3-8b"

[scheduler]
kind = "continuous"

[cluster]
router = {kind = "least_outstanding"}

[slo]
ttft_ms = 1500
tpot_ms = 90
"""
PRICES = {"l4": 0.8, "a100-40gb": 1.3}
MAX_INSTANCES = 4
TARGET = 0.95

PLAN = BASE + f"""
[plan]
constraints = ["slo.attainment >= {TARGET}"]
gpus = {{l4 = 0.8, a100-40gb = 1.3}}
tensor_parallel = [1, 2]
max_instances = {MAX_INSTANCES}

[plan.space]
"scheduler.max_num_seqs" = [8, 64]
"""

#: Four short requests: the smallest workload a file needs, for tests that check how it is read.
TINY_WORKLOAD = """\
[workload]
kind = "synthetic"
num_requests = 4
prompt = {dist = "fixed", value = 10}
output = {dist = "fixed", value = 2}
arrival = "poisson"
rate = 10
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


#: Three million requests: a run long enough to be stopped by a signal while it simulates.
LONG_RUN = """
[experiment]
name = "long"
reports = ["table", "json"]

[workload]
kind = "synthetic"
num_requests = 3000000
prompt = {dist = "fixed", value = 100}
output = {dist = "fixed", value = 50}
arrival = "poisson"
rate = 60
"""
