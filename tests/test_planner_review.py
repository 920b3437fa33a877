"""Capacity planning, review planfleet findings 3-6 and J10: a constraint more instances make worse,
a mistake in [plan.space], an answer capped by min_instances, unpriced energy, and the search's
noise note for a target of 0.

The plans are of one candidate (Llama-3-8B on two A100-40GB pipeline stages, $1.25 per GPU-hour):
a few seconds each."""

from __future__ import annotations

import math
import re

import pytest

from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment
from schedlab.study.planner import monotone_in_instances
from schedlab.study.search import parse_constraint

BASE = """
[experiment]
name = "small"
timeline = false

[workload]
kind = "synthetic"
num_requests = 60
rate = 8.0
prompt = {dist = "lognormal", median = 400, sigma = 0.5, high = 2000}
output = {dist = "lognormal", median = 100, sigma = 0.5, high = 500}

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
pipeline_parallel = 2

[power]
kind = "utilisation"
pue = 1.5
host_idle_w = 200
host_busy_w = 300

[slo]
ttft_ms = 300
tpot_ms = 50

[plan]
gpus = {a100-40gb = 1.25}
max_instances = 4
"""


def plan_of(tmp_path, text: str):
    (tmp_path / "p.toml").write_text(text)
    return run_experiment(load(tmp_path / "p.toml")).studies[0]


def energy_plan(tmp_path, bound: float):
    return plan_of(tmp_path, BASE + f'constraints = ["energy.j_per_token <= {bound}"]\nenergy_price_per_kwh = 0.1\n')


def j_per_token(study) -> dict[int, float]:
    return {run.point["cluster.instances"]: run.metrics["energy"]["j_per_token"] for run in study.runs}


# -- 3: a constraint that more instances make worse -----------------------------------------------------------------

def test_an_energy_bound_failing_at_max_instances_is_met_at_min_instances(tmp_path):
    """At the same load 4 instances idle more than 1: J per token rises with instances. The bound
    fails at 4 and holds at 1; the plan said "no deployment meets ...; raise max_instances"."""
    study = energy_plan(tmp_path, 1.5)
    joules = j_per_token(study)
    assert sorted(joules) == [1, 4]  # the search's start, and the run at min_instances
    assert joules[1] <= 1.5 < joules[4]  # (the case this test is about)
    plan = study.plan
    assert plan.cheapest["instances"] == 1 and plan.cheapest["cost"] == pytest.approx(2 * 1.25)
    assert plan.cheapest["reason"] == "fails at 4 instances but holds at 1: not monotone in instances"
    assert plan.message.startswith("cheapest deployment with energy.j_per_token <= 1.5: 1 instance x 2 a100-40gb at "
                                   "$2.50/h GPUs + ")
    assert plan.message.endswith("; 2 of 4 deployments simulated; not monotone in instances: energy.j_per_token "
                                 "<= 1.5 fails at 4 instances but holds at 1 for 1 candidate")


def test_an_answer_found_at_min_instances_caps_the_next_wave(tmp_path):
    """The A100-40GB candidate ($2.50 an instance) fails at 4 and holds at 1: $2.50 caps the A100-80GB
    wave ($4.00 an instance), which is then not run at all; the same in two worker processes."""
    from schedlab.study.executor import ProcessExecutor

    text = BASE.replace("gpus = {a100-40gb = 1.25}", "gpus = {a100-40gb = 1.25, a100-80gb = 2.0}") \
        + 'constraints = ["energy.j_per_token <= 1.5"]\n'
    (tmp_path / "p.toml").write_text(text)
    study = run_experiment(load(tmp_path / "p.toml")).studies[0]
    status = {c["point"]["gpu"]: c for c in study.plan.candidates}
    assert status["a100-40gb"]["status"] == "found" and status["a100-40gb"]["instances"] == 1
    assert status["a100-80gb"]["status"] == "too-expensive"
    assert status["a100-80gb"]["reason"] == "1 instance cost $4.00/h, more than $2.50/h, the cheapest found then"
    assert [(run.point["gpu"], run.point["cluster.instances"]) for run in study.runs] == [("a100-40gb", 4),
                                                                                          ("a100-40gb", 1)]
    executor = ProcessExecutor(2)
    try:
        parallel = run_experiment(load(tmp_path / "p.toml"), executor=executor).studies[0]
    finally:
        executor.close()
    assert parallel.plan == study.plan


def test_an_energy_bound_met_nowhere_does_not_advise_more_instances(tmp_path):
    """Failing at 4 and at 1, best at 1: raising max_instances cannot help, and is not advised."""
    study = energy_plan(tmp_path, 0.1)
    joules = j_per_token(study)
    assert sorted(joules) == [1, 4] and 0.1 < joules[1] < joules[4]
    plan = study.plan
    assert plan.cheapest is None
    assert plan.candidates[0]["status"] == "fails"
    assert plan.candidates[0]["reason"] == "fails even at 4 instances and at 1 instance"
    assert plan.message == (f"no deployment meets energy.j_per_token <= 0.1 within 4 instances of any candidate; best "
                            f"energy.j_per_token reached: {joules[1]:.4g} (1 instance x 2 a100-40gb); widen the space; "
                            "raising max_instances would not help: energy.j_per_token was best with fewer instances")


def test_an_slo_failing_at_max_instances_is_not_run_again_and_advises_more_instances(tmp_path):
    """A latency bound is monotone in instances: the search's one run at max_instances says it all."""
    study = plan_of(tmp_path, BASE + 'constraints = ["ttft_ms.p99 <= 1"]\n')
    assert [run.point["cluster.instances"] for run in study.runs] == [4]
    assert study.plan.message.endswith("(4 instances x 2 a100-40gb); raise max_instances or widen the space")


@pytest.mark.parametrize("text, monotone", [
    ("ttft_ms.p99 <= 500", True), ("per_class.chat.tpot_ms.p99 < 50", True), ("client.ttft_ms.p99 <= 9", True),
    ("slo.attainment >= 0.99", True), ("per_class.chat.slo.goodput_rps > 2", True),
    ("energy.j_per_token <= 1.5", False), ("slot_utilisation >= 0.5", False), ("ttft_ms.p99 >= 100", False),
    ("slo.attainment <= 0.5", False), ("throughput_tps >= 100", False),
])
def test_which_constraints_more_instances_never_break(text, monotone):
    assert monotone_in_instances(parse_constraint(text)) is monotone


# -- 4: a mistake in [plan.space] ------------------------------------------------------------------------------------

def test_a_space_value_no_deployment_can_take_is_an_error_not_infeasible(tmp_path):
    """A negative rate is refused on every GPU and degree: an error of the file, named with the
    point, as a sweep's is -- it was counted "infeasible" and its candidates silently dropped."""
    path = tmp_path / "p.toml"
    path.write_text(BASE + 'constraints = ["slo.attainment >= 0.99"]\n[plan.space]\n"workload.rate" = [-4.0, 8.0]\n')
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value) == (f"{path}: [workload]: rate: must be > 0, got -4.0 (at the plan's space point "
                                 "workload.rate = -4.0, with every GPU and degree)")


def test_a_space_value_whose_model_fits_no_gpu_is_still_infeasible(tmp_path):
    """15% of an A100-40GB (6 GiB) cannot hold a pipeline stage's half of Llama-3-8B's 15 GiB of
    weights: a deployment that cannot run, on every GPU of the plan, is infeasible (the other point
    answers)."""
    study = plan_of(tmp_path, BASE + 'constraints = ["slo.attainment >= 0.99"]\n[plan.space]\n'
                                     '"kv_cache.gpu_memory_utilization" = [0.15, 0.9]\n')
    status = {c["point"]["kv_cache.gpu_memory_utilization"]: c for c in study.plan.candidates}
    assert status[0.15]["status"] == "infeasible" and "does not fit on a100-40gb" in status[0.15]["reason"]
    assert status[0.9]["status"] == "found"


# -- 5: an answer capped by min_instances --------------------------------------------------------------------------

def test_an_answer_at_min_instances_says_fewer_were_not_tried(tmp_path):
    study = plan_of(tmp_path, BASE.replace("max_instances = 4", "min_instances = 3\nmax_instances = 4")
                    + 'constraints = ["slo.attainment >= 0.99"]\n')
    plan = study.plan
    assert plan.cheapest["instances"] == 3 and plan.cheapest["cost"] == pytest.approx(3 * 2 * 1.25)
    hint = "holds down to min_instances = 3; lower it to search further"
    assert plan.cheapest["reason"] == hint
    assert plan.message.endswith("; 2 of 2 deployments simulated; " + hint)


def test_an_autoscaled_answer_at_the_lowest_min_instances_it_takes_has_no_hint(tmp_path):
    """Over an autoscaler a plan needs min_instances >= 2: "lower it" would be refused."""
    autoscaler = ('router = {kind = "least_outstanding"}\nautoscaler = {kind = "target_utilization", '
                  'metric = "outstanding", target = 2, interval_s = 5, cold_start_s = 10, stabilization_s = 10}')
    text = BASE.replace('router = {kind = "least_outstanding"}', autoscaler) \
        .replace("max_instances = 4", "min_instances = 2\nmax_instances = 3")
    plan = plan_of(tmp_path, text + 'constraints = ["slo.attainment >= 0.99"]\n').plan
    assert plan.cheapest["instances"] == 2 and plan.cheapest["reason"] == ""
    assert "min_instances" not in plan.message


def test_an_answer_above_min_instances_has_no_hint(tmp_path):
    plan = plan_of(tmp_path, BASE + 'constraints = ["slo.attainment >= 0.99"]\n').plan
    assert plan.cheapest["instances"] == 1 and plan.cheapest["reason"] == ""
    assert "min_instances" not in plan.message


# -- 6: energy without a price ---------------------------------------------------------------------------------------

def test_unpriced_energy_is_said_in_kwh_only(tmp_path):
    """No energy_price_per_kwh: "$0.00/h energy" read as free energy. Now the kWh per hour only,
    and no energy cost in the deployments or the runs' metrics (summary.json and summary.csv)."""
    study = plan_of(tmp_path, BASE + 'constraints = ["slo.attainment >= 0.99"]\n')
    plan = study.plan
    answer = next(run for run in study.runs if run.name == plan.cheapest["run"])
    e = answer.metrics["energy"]
    kwh = e["facility_j"] / e["window_ms"]  # J per ms = kW
    assert f"at $2.50/h GPUs + {kwh:.3g} kWh/h of energy, slo.attainment " in plan.message
    assert "$0.00" not in plan.message
    for d in plan.deployments:
        assert "kwh_per_hour" in d and "energy_cost_per_hour" not in d
    for run in study.runs:
        assert "kwh_per_hour" in run.metrics and "energy_cost_per_hour" not in run.metrics


def test_a_price_of_zero_is_a_price(tmp_path):
    plan = plan_of(tmp_path, BASE + 'constraints = ["slo.attainment >= 0.99"]\nenergy_price_per_kwh = 0\n').plan
    assert " GPUs + $0.00/h energy (" in plan.message
    assert all(d["energy_cost_per_hour"] == 0.0 for d in plan.deployments)


# -- J10: the search's noise note for a target of 0 ------------------------------------------------------------------

def test_no_noise_note_for_a_target_of_zero():
    """``num_preemptions = 0, within 5% of its target (<= 0)`` was said of every search: 0 is
    within 5% of 0 and nothing else is."""
    from types import SimpleNamespace

    from schedlab.study.caveats import answer_caveats
    from schedlab.study.search import Probe, SearchOutcome

    def run(preemptions):
        return SimpleNamespace(metrics={"requests": 400, "finished": 400, "rejected": 0, "timed_out": 0,
                                        "aborted": 0, "peak_running": 1, "num_preemptions": preemptions},
                               requests={}, rows_file=None, settings={}, replicas=[], intervals={})

    constraints = [parse_constraint("num_preemptions <= 0")]
    answer, failing = run(0), run(3)
    outcome = SearchOutcome("found", 17, answer, 18, [Probe(17, True, answer), Probe(18, False, failing)],
                            "largest workload.clients with num_preemptions <= 0: 17 (18 fails)")
    assert not re.search("within 5%", answer_caveats(outcome, constraints))
    near = [parse_constraint("num_preemptions <= 40")]  # 39 is within 5% of 40: still said
    answer = run(39)
    outcome = SearchOutcome("found", 17, answer, 18, [Probe(17, True, answer), Probe(18, False, failing)], "")
    assert "num_preemptions = 39, within 5% of its target (<= 40)" in answer_caveats(outcome, near)


# -- J3: the price of a million output tokens --------------------------------------------------------------------------


def test_the_price_of_a_million_output_tokens_by_hand():
    """The shipped plan's answer: $2.58/h at 2,619 output tokens/s makes 9.43 million tokens an
    hour, $0.2736 a million."""
    from schedlab.study.planner import cost_per_mtok

    assert cost_per_mtok(2.58, 2619.0) == pytest.approx(2.58 / (2619.0 * 3600 / 1e6)) == pytest.approx(0.27364, 1e-4)
    assert math.isnan(cost_per_mtok(2.58, 0.0)) and math.isnan(cost_per_mtok(2.58, None))


def test_every_deployment_of_a_plan_says_its_price_of_a_million_tokens(tmp_path):
    study = plan_of(tmp_path, BASE + 'constraints = ["slo.attainment >= 0.99"]\n')
    plan = study.plan
    for deployment in plan.deployments:
        run = next(r for r in study.runs if r.name == deployment["run"])
        expected = deployment["cost"] / (run.metrics["throughput_tps"] * 3600 / 1e6)
        assert deployment["cost_per_mtok"] == pytest.approx(expected) == run.metrics["cost_per_mtok"]
    cheapest = next(d for d in plan.deployments if d["run"] == plan.cheapest["run"])
    assert f"; GPUs ${cheapest['cost_per_mtok']:,.2f} a million output tokens at this load; " in plan.message


# -- J2: a space that varies the load --------------------------------------------------------------------------------


def test_a_space_that_varies_the_load_is_warned_about(tmp_path):
    """The cheapest deployment across two rates is the one serving the lower: no load's answer."""
    from schedlab.errors import InputWarning

    text = BASE + 'constraints = ["slo.attainment >= 0.99"]\n[plan.space]\n"workload.rate" = [4.0, 8.0]\n'
    with pytest.warns(InputWarning, match=r"\[plan.space\]: workload.rate varies the load, so the cheapest deployment "
                                          r"is taken across loads"):
        plan_of(tmp_path, text)


def test_a_cheapest_deployment_whose_run_may_be_overloaded_says_so(tmp_path):
    """Capacity review s79 (high): a plan recommended one A100 for 31 req/s where its run measured a capacity of
    12.4/s. Here 60 requests at 40/s: one instance's queue grows, too briefly for a verdict of 'unstable'; the
    message says so beside the answer; at 8/s (stable) it says nothing of it."""
    constraint = 'constraints = ["finished >= 1"]\n'
    loaded = plan_of(tmp_path, BASE.replace("rate = 8.0", "rate = 40.0") + constraint)
    assert loaded.plan.cheapest["instances"] == 1
    verdict = {run.point["cluster.instances"]: run.metrics["stability"]["verdict"] for run in loaded.runs}
    assert verdict[1] == "inconclusive"
    assert re.search(r"; at the cheapest the run is inconclusive: waiting grows .* \(arrivals 36.9/s\): if it is "
                     r"overloaded, its percentiles say how long the run lasted, not what the server sustains \(more "
                     r"requests would show it\)$", loaded.plan.message), loaded.plan.message
    calm = plan_of(tmp_path, BASE + constraint)
    assert calm.plan.cheapest["instances"] == 1 and "at the cheapest the run" not in calm.plan.message


@pytest.mark.parametrize("setting, message", [
    ('constraints = ["cost_per_mtok <= 1"]',
     "[plan]: constraints: 'cost_per_mtok' is the plan's own price of a deployment, computed once the constraints "
     "have chosen it, so it cannot be one of them"),
    ('constraints = ["kwh_per_hour <= 1"]', "[plan]: constraints: 'kwh_per_hour' is the plan's own price"),
    ('constraints = ["finished >= 1"]\nattainment = "ttft_ms.p99"',
     "[plan]: attainment: the frontier's metric is one where higher is better, and 'ttft_ms.p99' is a time, lower "
     "is better"),
    ('constraints = ["finished >= 1"]\nattainment = "energy.j_per_token"',
     "[plan]: attainment: the frontier's metric is one where higher is better, and 'energy.j_per_token' is a count "
     "of failures or a cost, lower is better")])
def test_a_plan_constraint_on_its_own_price_or_a_lower_is_better_frontier_is_refused_when_read(tmp_path, setting,
                                                                                                message):
    """Capacity review s79: a constraint on the plan's own price passed validate, then failed after simulating
    with no file or table ('no metric cost_per_mtok'); a latency as the frontier's metric drew it upside down."""
    (tmp_path / "p.toml").write_text(BASE + setting + "\n")
    with pytest.raises(ConfigError) as err:
        load(tmp_path / "p.toml")
    assert f"p.toml: {message}" in str(err.value)


@pytest.mark.parametrize("constraint, need", [
    ("energy.j_per_token <= 1", "a [power] table (only runs with one meter energy)"),
    ("cost_per_hour <= 3", "a [plan] (only a plan prices the deployments it simulates)")])
def test_a_search_constraint_no_run_has_is_refused_when_read(tmp_path, constraint, need):
    """Capacity review s79: both passed validate and failed after the first probe, naming no file or table."""
    text = BASE.split("[power]")[0].replace('model = "llama-3-8b"\n', 'model = "llama-3-8b"\ngpu = "a100-40gb"\n') \
        + f'[search]\nkey = "workload.rate"\nlow = 1.0\nhigh = 8.0\ntolerance = 1.0\n' \
        f'constraint = "{constraint}"\n'
    (tmp_path / "s.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load(tmp_path / "s.toml")
    assert str(err.value).endswith(f"s.toml: [search]: constraint: '{constraint.split()[0]}' needs {need}, and run "
                                   "'small' has none"), str(err.value)
