"""The Ray backend gives the same results as local runs (skipped where Ray is not installed).

One local Ray instance is started for the whole module, with this machine's CPUs, and shut
down at the end; the executors find it running and leave it alone.
"""

from __future__ import annotations

import os

import pytest

from schedlab.cli import main
from schedlab.study.executor import InProcessExecutor, make_executor
from schedlab.study.experiment import load, run_experiment
from study_case import PLAN, saved_bytes, write_experiment

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def run_with(path, executor):
    try:
        return run_experiment(load(path), executor=executor)
    finally:
        executor.close()


@pytest.mark.parametrize("seed", [0, 2**31 + 7])
def test_ray_writes_the_same_bytes_as_one_process(local_ray, tmp_path, seed):
    path = write_experiment(tmp_path, seed)
    executor = make_executor("ray")
    assert executor.workers == int(local_ray.cluster_resources()["CPU"]) == os.cpu_count()
    on_ray = run_with(path, executor)
    assert on_ray.execution["executor"].startswith("Ray")
    assert local_ray.is_initialized()  # it was running before: the executor left it alone
    assert saved_bytes(on_ray, tmp_path / "ray") == saved_bytes(run_with(path, InProcessExecutor()), tmp_path / "one")


def test_ray_from_the_command_line(local_ray, tmp_path, capsys):
    path = write_experiment(tmp_path, 11)
    assert main(["run", str(path), "--backend", "ray", "--jobs", "1", "--out", str(tmp_path / "ray"), "--no-plots"]) == 0
    assert "Ray (a local Ray instance, 1 workers)" in capsys.readouterr().err
    assert main(["run", str(path), "--jobs", "1", "--out", str(tmp_path / "one"), "--no-plots"]) == 0
    for name in ("summary.json", "requests.csv", "timeline.csv"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()


def test_a_capacity_plan_on_ray_is_the_plan_of_one_process(local_ray, tmp_path):
    (tmp_path / "plan.toml").write_text(PLAN)
    on_ray = run_with(tmp_path / "plan.toml", make_executor("ray"))
    here = run_with(tmp_path / "plan.toml", InProcessExecutor())
    assert on_ray.studies[0].plan == here.studies[0].plan and on_ray.studies[0].plan.cheapest is not None
    assert saved_bytes(on_ray, tmp_path / "ray") == saved_bytes(here, tmp_path / "one")


HUNT = """
[experiment]
name = "hunt_on_ray"
seed = 2
[[runs]]
name = "small"
scheduler = {kind = "continuous", max_num_seqs = 2}
[[runs]]
name = "large"
scheduler = {kind = "continuous", max_num_seqs = 16}
[hunt]
objective = "runs.small.ttft_ms.p99 / runs.large.ttft_ms.p99"
budget = 24
random = 8
shrink_budget = 16
[hunt.workload]
requests = [1, 12]
rate = [1.0, 20.0]
prompt = [1, 500]
output = [1, 100]
"""


def test_a_hunt_on_ray_finds_what_it_finds_in_one_process(local_ray, tmp_path):
    from schedlab.hunt.hunt import load_hunt, run_hunt

    (tmp_path / "hunt.toml").write_text(HUNT)
    executor = make_executor("ray")
    try:
        on_ray = run_hunt(load_hunt(tmp_path / "hunt.toml"), executor)
    finally:
        executor.close()
    here = run_hunt(load_hunt(tmp_path / "hunt.toml"), InProcessExecutor())
    assert [t.score.value for t in on_ray.search] == [t.score.value for t in here.search]
    assert [t.score.value for t in on_ray.random] == [t.score.value for t in here.random]
    assert on_ray.shrunk == here.shrunk
