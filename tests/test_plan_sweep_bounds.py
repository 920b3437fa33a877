"""Plans and sweeps that would simulate a deployment twice, or far too many points, are refused when read.

- ``[plan] tensor_parallel = [1, 1]`` (or two names of one GPU preset, or ``64`` and ``64.0`` in a
  ``[plan.space]`` list) ran each deployment twice under one name;
- a ``[plan.space]`` key the plan sets itself (``cluster.instances``, ``gpu_keys``,
  ``tensor_parallel_keys``) was silently overridden, so each point was shown twice;
- a 200 x 200 sweep (40,000 simulations) started without a word.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from schedlab.configs import FieldError
from schedlab.errors import ConfigError
from schedlab.study.experiment import load
from schedlab.study import sweep
from schedlab.study.planner import PlanConfig, candidates
from study_case import PLAN, TINY_WORKLOAD

SPACE = '"scheduler.max_num_seqs" = [8, 64]'
WORKLOAD = TINY_WORKLOAD + """
[scheduler]
kind = "continuous"
"""


def plan_file(tmp_path, old: str, new: str):
    assert old in PLAN
    path = tmp_path / "p.toml"
    path.write_text(PLAN.replace(old, new))
    return path


def load_error(path) -> str:
    with pytest.raises(ConfigError) as info:
        load(path)
    return str(info.value)


def plan_config(**table):
    return PlanConfig(**{"constraints": ["slo.attainment >= 0.9"], "gpus": {"l4": 0.8}, **table})


# --- 1. duplicates --------------------------------------------------------------------------------

def test_a_repeated_tensor_parallel_degree_is_refused(tmp_path):
    path = plan_file(tmp_path, "tensor_parallel = [1, 2]", "tensor_parallel = [1, 2, 1]")
    assert load_error(path) == f"{path}: [plan]: tensor_parallel: lists 1 twice"
    with pytest.raises(FieldError, match="^tensor_parallel: lists 2 twice$"):
        plan_config(tensor_parallel=[2, 2])


def test_two_names_of_one_gpu_preset_are_refused(tmp_path):
    path = plan_file(tmp_path, "gpus = {l4 = 0.8, a100-40gb = 1.3}", "gpus = {l4 = 0.8, L4 = 0.7, a100-40gb = 1.3}")
    assert load_error(path) == (f"{path}: [plan]: gpus: 'l4' and 'L4' name the same GPU preset; "
                                "list each GPU once")


@pytest.mark.parametrize("values, message", [
    ("[8, 64, 8]", "'scheduler.max_num_seqs' lists 8 twice"),
    ("[8, 64, 8.0]", "'scheduler.max_num_seqs' lists 8 and 8.0, the same number"),
])
def test_a_value_repeated_in_a_plan_space_list_is_refused_at_construction(tmp_path, values, message):
    path = plan_file(tmp_path, SPACE, f'"scheduler.max_num_seqs" = {values}')
    assert load_error(path) == f"{path}: [plan]: space: {message}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_config(space={"scheduler": {"max_num_seqs": eval(values)}})


def test_the_plan_keys_must_not_repeat():
    with pytest.raises(FieldError, match=r"^gpu_keys: lists 'kv_cache.gpu' twice$"):
        plan_config(gpu_keys=["kv_cache.gpu", "cost_model.gpu", "kv_cache.gpu"])
    with pytest.raises(FieldError, match=r"^tensor_parallel_keys: 'cost_model.gpu' is in gpu_keys too"):
        plan_config(tensor_parallel_keys=["cost_model.gpu"])


# --- 2. [plan.space] keys the plan sets itself -----------------------------------------------------

@pytest.mark.parametrize("space, message", [
    ('"cluster.instances" = [1, 2]',
     "space: 'cluster.instances' is searched by the plan itself (the fewest instances that meet the "
     "constraints); set min_instances and max_instances instead"),
    ("cluster.instances = [1, 2]",  # unquoted: TOML reads a nested table, the same key
     "space: 'cluster.instances' is searched by the plan itself"),
    ('"cost_model.gpu" = ["l4", "a100-40gb"]',
     "space: 'cost_model.gpu' is set by the plan itself (gpu_keys), to each GPU of gpus; "
     "list the GPUs in gpus = {name = price per GPU-hour} instead"),
    ('"kv_cache.tensor_parallel" = [1, 2]',
     "space: 'kv_cache.tensor_parallel' is set by the plan itself (tensor_parallel_keys), to each degree of "
     "tensor_parallel; list the degrees in tensor_parallel = [...] instead"),
    ('"cost_model" = [{kind = "roofline", model = "llama-3-8b", gpu = "h100-80gb"}]',
     "space: 'cost_model' lists a table that sets 'cost_model.gpu', which is set by the plan itself"),
    ('"cluster" = [5]', "space: 'cluster' lists 5, not a table, but the plan sets 'cluster.instances' in it"),
])
def test_a_plan_space_key_the_plan_sets_itself_is_refused(tmp_path, space, message):
    path = plan_file(tmp_path, SPACE, SPACE + "\n" + space)
    error = load_error(path)
    assert error.startswith(f"{path}: [plan]: {message}")
    assert "\n" not in error


def test_a_custom_gpu_key_is_protected_too():
    with pytest.raises(ConfigError, match=r"^space: 'cost_model\.hardware' is set by the plan itself \(gpu_keys\)"):
        plan_config(gpu_keys=["cost_model.hardware"], space={"cost_model.hardware": ["x", "y"]})


def test_a_whole_table_in_the_space_keeps_the_gpu_and_degree_the_plan_sets(tmp_path):
    table = '{kind = "roofline", model = "llama-3-8b"}'
    path = plan_file(tmp_path, SPACE, f'"cost_model" = [{table}]')
    study = load(path).studies[0]
    found = candidates(study, str(path))
    assert [(c.tables["cost_model"]["gpu"], c.tables["cost_model"]["tensor_parallel"]) for c in found] == [
        ("l4", 1), ("l4", 2), ("a100-40gb", 1), ("a100-40gb", 2)]


# --- 3. how many points ------------------------------------------------------------------------------

def grid(n: int, m: int) -> str:
    return (f'"scheduler.max_num_seqs" = [{", ".join(map(str, range(1, n + 1)))}]\n'
            f'"workload.rate" = [{", ".join(map(str, range(1, m + 1)))}]\n')


def test_a_sweep_of_40000_points_is_refused_when_the_file_is_read(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text(WORKLOAD + "\n[sweep]\n" + grid(200, 200))
    assert load_error(path) == (f"{path}: [sweep]: 200 x 200 = 40,000 points; at most 10,000 "
                                "(each point is a whole simulation)")
    path.write_text(WORKLOAD + '\n[[runs]]\nname = "wide"\n[runs.sweep]\n' + grid(101, 100))
    assert load_error(path).startswith(f"{path}: [[runs]] 'wide' [sweep]: 101 x 100 = 10,100 points; at most 10,000")


def test_the_size_is_checked_before_the_points_are_made(tmp_path, monkeypatch):
    # 10**12 points: making them would not finish (nor fit in memory); multiplying the lengths is instant
    def made(axes):
        raise AssertionError("the points were made before their number was checked")

    monkeypatch.setattr(sweep, "_points", made)
    path = tmp_path / "huge.toml"
    path.write_text(WORKLOAD + "\n[sweep]\n" + "".join(
        f'"workload.k{i}" = [{", ".join(map(str, range(100)))}]\n' for i in range(6)))
    assert load_error(path) == (f"{path}: [sweep]: 100 x 100 x 100 x 100 x 100 x 100 = 1,000,000,000,000 points; "
                                "at most 10,000 (each point is a whole simulation)")


def test_the_sweep_bound_is_exact():
    from schedlab.study.sweep import MAX_SWEEP_POINTS, expand_sweep

    assert MAX_SWEEP_POINTS == 10_000
    table = {"a": list(range(100)), "b": list(range(100))}
    assert len(expand_sweep(table, "f.toml: [sweep]")) == 10_000
    with pytest.raises(ConfigError, match=r"^f\.toml: \[sweep\]: 10,001 points; at most 10,000"):
        expand_sweep({"a": list(range(10_001))}, "f.toml: [sweep]")


def test_a_plan_of_too_many_candidates_is_refused_when_the_file_is_read(tmp_path):
    path = plan_file(tmp_path, SPACE, grid(100, 60))
    assert load_error(path) == (f"{path}: [plan]: 2 gpus x 2 tensor_parallel x 100 x 60 = 24,000 candidates; "
                                "at most 10,000 (each candidate is a search over instances)")
    with pytest.raises(ConfigError, match=r"^1 gpus x 1 tensor_parallel x 10,001 = 10,001 candidates; at most 10,000"):
        plan_config(space={"scheduler.max_num_seqs": list(range(1, 10_002))})
    assert len(plan_config(space={"scheduler.b": list(range(100)), "scheduler.c": list(range(100))}).space[
        "scheduler.b"]) == 100


def test_validate_reports_the_bound_on_one_line(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text(WORKLOAD + "\n[sweep]\n" + grid(200, 200))
    done = subprocess.run([sys.executable, "-m", "schedlab", "validate", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == (f"schedlab: error: {path}: [sweep]: 200 x 200 = 40,000 points; at most 10,000 "
                           "(each point is a whole simulation)\n")


def test_max_instances_beyond_what_a_cluster_may_have_is_refused_when_the_file_is_read(tmp_path):
    # validate said OK, and the run stopped at its first probe: [cluster]: instances: must be <= 1024
    path = plan_file(tmp_path, "max_instances = 4", "max_instances = 2000")
    assert load_error(path) == f"{path}: [plan]: max_instances: must be <= 1024, got 2000"


def test_runs_that_add_up_to_too_many_simulations_are_refused_before_their_points_are_built(tmp_path, monkeypatch):
    """Each run within its limits (10,000 points, 10,000 replicas), the file over 100,000 in all."""
    from schedlab.study import experiment

    assert experiment.MAX_SIMULATIONS == 100_000
    built = []
    real = experiment._validate
    monkeypatch.setattr(experiment, "_validate", lambda study, *a: built.append(study.name) or real(study, *a))
    sweep_100 = '[runs.sweep]\n"scheduler.max_num_seqs" = [' + ", ".join(map(str, range(1, 101))) + "]\n"
    path = tmp_path / "many.toml"
    path.write_text(WORKLOAD + "\n".join(
        f'[[runs]]\nname = "r{i}"\nreplicas = {r}\n{sweep_100}' for i, r in enumerate((500, 500, 1))))
    assert load_error(path) == (f"{path}: its runs add up to more than 100,000 simulations, the most one file runs "
                                "(sweep points x replicas; the largest: 'r0' 50,000, 'r1' 50,000, 'r2' 100): fewer "
                                "points or replicas, or split it into several files")
    assert built == ["r0", "r1"]  # r2 (the one over) was not built
    path.write_text(WORKLOAD + "\n".join(
        f'[[runs]]\nname = "r{i}"\nreplicas = {r}\n{sweep_100}' for i, r in enumerate((500, 500))))
    assert [s.name for s in load(path).studies] == ["r0", "r1"]  # exactly 100,000: allowed


def test_a_plan_whose_attainment_needs_slo_targets_the_run_lacks_is_said(tmp_path):
    """Constraints on p99s and no [slo]: the frontier and its plot were NaN without a word."""
    import warnings as w

    from schedlab.errors import InputWarning
    from study_case import BASE

    text = BASE[:BASE.index("[slo]")]  # the same run without its [slo] targets
    path = tmp_path / "p.toml"
    path.write_text(text + '\n[plan]\nconstraints = ["ttft_ms.p99 <= 500"]\ngpus = {l4 = 0.8}\nmax_instances = 2\n')
    with pytest.warns(InputWarning, match=r"\[plan\]: attainment 'slo\.attainment' needs \[slo\] targets, which the "
                                          r"run has not"):
        load(path)
    path.write_text(text + '\n[plan]\nconstraints = ["ttft_ms.p99 <= 500"]\ngpus = {l4 = 0.8}\nmax_instances = 2\n'
                    'attainment = "request_throughput_rps"\n')
    with w.catch_warnings():
        w.simplefilter("error", InputWarning)
        load(path)  # a metric the run has: nothing to say


def test_a_plan_constraint_on_slo_metrics_the_run_lacks_is_refused_when_read(tmp_path):
    """Every deployment would fail it (the metric is absent), and the plan say nothing meets it."""
    from study_case import BASE

    path = tmp_path / "p.toml"
    path.write_text(BASE[:BASE.index("[slo]")] + '\n[plan]\nconstraints = ["slo.attainment >= 0.99"]\n'
                    'gpus = {l4 = 0.8}\nmax_instances = 2\n')
    assert load_error(path) == (f"{path}: [plan]: constraints: 'slo.attainment' needs [slo] targets (ttft_ms, "
                                "tpot_ms), and run 'tiny_plan' has none")
    path.write_text(BASE[:BASE.index("[slo]")] + '\n[plan]\nconstraints = ["slo.attainment >= 0.99"]\n'
                    'gpus = {l4 = 0.8}\nmax_instances = 2\n[plan.space]\n"slo.ttft_ms" = [500, 1000]\n')
    assert len(load(path).studies) == 1  # the space sets the targets
