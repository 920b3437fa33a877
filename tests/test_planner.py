"""Capacity planning: the planner's answer is the cheapest deployment of the exhaustive grid."""

from __future__ import annotations

import math
import re

import pytest

from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment
from schedlab.study.planner import pareto
from study_case import BASE, MAX_INSTANCES, PLAN, PRICES, TARGET

DEGREES = (1, 2)
MAX_NUM_SEQS = (8, 64)  # as PLAN's [plan] table says


def exhaustive_toml() -> str:
    """Every deployment of the grid as its own run, written out by hand."""
    runs = []
    for gpu in PRICES:
        for tp in DEGREES:
            for seqs in MAX_NUM_SEQS:
                for n in range(1, MAX_INSTANCES + 1):
                    runs.append(f"""
[[runs]]
name = "{gpu}/{tp}/{seqs}/{n}"
cost_model = {{gpu = "{gpu}", tensor_parallel = {tp}}}
kv_cache = {{gpu = "{gpu}", tensor_parallel = {tp}}}
scheduler = {{max_num_seqs = {seqs}}}
cluster = {{instances = {n}}}
""")
    return BASE.replace('[cost_model]\nkind = "roofline"', '[cost_model]\nkind = "roofline"\ngpu = "l4"') \
               .replace('[kv_cache]\nkind = "paged"', '[kv_cache]\nkind = "paged"\ngpu = "l4"') + "".join(runs)


@pytest.fixture(scope="module")
def exhaustive(tmp_path_factory):
    path = tmp_path_factory.mktemp("grid") / "grid.toml"
    path.write_text(exhaustive_toml())
    return {run.name: run for run in run_experiment(load(path)).all_runs()}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.toml"
    path.write_text(PLAN)
    return run_experiment(load(path)).studies[0]


def test_planner_finds_the_cheapest_deployment_of_the_exhaustive_grid(exhaustive, planned):
    # by hand from the exhaustive runs: deployments meeting the target, cheapest first, ties to
    # the higher attainment, then to the earlier candidate (GPU, degree, max_num_seqs as written)
    meeting = []
    for order, (name, run) in enumerate(exhaustive.items()):
        gpu, tp, seqs, n = name.split("/")
        attainment = run.metrics["slo"]["attainment"]
        if attainment >= TARGET:
            meeting.append((int(n) * int(tp) * PRICES[gpu], -attainment, order, (gpu, int(tp), int(seqs), int(n))))
    assert meeting, "the grid must hold an answer for this test to mean anything"
    cost, _, _, (gpu, tp, seqs, n) = min(meeting)
    plan = planned.plan
    assert plan.cheapest["point"] == {"gpu": gpu, "tensor_parallel": tp, "scheduler.max_num_seqs": seqs}
    assert plan.cheapest["instances"] == n
    assert plan.cheapest["cost"] == pytest.approx(cost)
    # the answer is not the first candidate nor a single instance of the cheapest GPU
    assert (gpu, n) != ("l4", 1)
    # pruned: fewer deployments simulated than the grid holds
    assert len(plan.deployments) < len(exhaustive) == plan.grid_size
    assert len(plan.deployments) == 11  # as the README says


def test_every_planned_deployment_matches_the_same_run_of_the_grid(exhaustive, planned):
    for run in planned.runs:
        p = run.point
        twin = exhaustive[f"{p['gpu']}/{p['tensor_parallel']}/{p['scheduler.max_num_seqs']}/{p['cluster.instances']}"]
        assert run.metrics["slo"] == twin.metrics["slo"]
        assert run.metrics["ttft_ms"] == twin.metrics["ttft_ms"]
        tp, price = p["tensor_parallel"], PRICES[p["gpu"]]
        assert run.metrics["cost_per_hour"] == pytest.approx(p["cluster.instances"] * tp * price)


def test_each_candidate_answer_is_its_fewest_instances_meeting_the_target(exhaustive, planned):
    for entry in planned.plan.candidates:
        p = entry["point"]
        passing = [n for n in range(1, MAX_INSTANCES + 1)
                   if exhaustive[f"{p['gpu']}/{p['tensor_parallel']}/{p['scheduler.max_num_seqs']}/{n}"]
                   .metrics["slo"]["attainment"] >= TARGET]
        if entry["status"] == "found":
            assert entry["instances"] == min(passing)
        elif entry["status"] == "fails":
            assert passing == []
        else:  # too expensive: nothing it could meet the target with is cheaper than the answer
            assert entry["status"] == "too-expensive"
            unit = p["tensor_parallel"] * PRICES[p["gpu"]]
            assert all(n * unit > planned.plan.cheapest["cost"] - 1e-9 for n in passing)


def test_frontier_is_pareto_optimal_over_the_simulated_deployments(planned):
    deployments = {d["run"]: d for d in planned.plan.deployments}
    frontier = [deployments[name] for name in planned.plan.frontier]
    assert frontier and [d["cost"] for d in frontier] == sorted(d["cost"] for d in frontier)
    for d in deployments.values():
        beaten = any(f["cost"] <= d["cost"] and f["attainment"] >= d["attainment"] for f in frontier)
        assert beaten  # every deployment is on or behind the frontier
    for f in frontier:
        assert not any(d["cost"] <= f["cost"] and d["attainment"] > f["attainment"] for d in deployments.values())


def test_pareto_by_hand():
    points = [(1.0, 0.2, "a"), (2.0, 0.9, "b"), (2.0, 0.5, "c"), (3.0, 0.8, "d"), (4.0, 1.0, "e"),
              (0.5, math.nan, "f")]
    assert pareto(points) == ["a", "b", "e"]


def test_candidates_that_cannot_hold_the_model_are_skipped_with_the_reason(tmp_path):
    text = PLAN.replace('model = "llama-3-8b"', 'model = "llama-3-70b"') \
               .replace("gpus = {l4 = 0.8, a100-40gb = 1.3}", "gpus = {l4 = 0.8, h100-80gb = 3.0}") \
               .replace("tensor_parallel = [1, 2]", "tensor_parallel = [2, 4]") \
               .replace('"scheduler.max_num_seqs" = [8, 64]', '"scheduler.max_num_seqs" = [64]') \
               .replace("max_instances = 4", "max_instances = 2")
    (tmp_path / "p.toml").write_text(text)
    plan = run_experiment(load(tmp_path / "p.toml")).studies[0].plan
    status = {(c["point"]["gpu"], c["point"]["tensor_parallel"]): c for c in plan.candidates}
    for tp in (2, 4):
        assert status[("l4", tp)]["status"] == "infeasible"
        assert "does not fit on l4" in status[("l4", tp)]["reason"]
    assert status[("h100-80gb", 4)]["status"] in ("found", "too-expensive", "fails")


@pytest.mark.parametrize("old, new, message", [
    ("gpus = {l4 = 0.8, a100-40gb = 1.3}\n", "", "[plan]: missing required key 'gpus'"),
    ("gpus = {l4 = 0.8, a100-40gb = 1.3}", "gpus = {l4 = -1}", "l4: the price per GPU-hour must be a finite number > 0"),
    ("gpus = {l4 = 0.8, a100-40gb = 1.3}", "gpus = {l4 = inf}", "l4: the price per GPU-hour must be a finite number"),
    (f'constraints = ["slo.attainment >= {TARGET}"]', "constraints = []", "constraints: name at least one"),
    (f'constraints = ["slo.attainment >= {TARGET}"]', 'constraints = ["slo.attainment >>= 1"]', "bad constraint"),
    ("tensor_parallel = [1, 2]", "tensor_parallel = [0]", "tensor_parallel: must be whole numbers >= 1"),
    (f"max_instances = {MAX_INSTANCES}", "max_instances = 0", "max_instances"),
    (f"max_instances = {MAX_INSTANCES}", "max_instanses = 3", "unknown key 'max_instanses'"),
    # a key no run table holds labelled every candidate and changed nothing
    # a plan's base run has one instance: its router was not checked until the plan ran two
    ('router = {kind = "least_outstanding"}', 'router = {kind = "nope"}', "[cluster.router]: unknown router 'nope'"),
    ('"scheduler.max_num_seqs" = [8, 64]', '"nope.x" = [1]',
     "[plan]: space: cannot vary 'nope.x'; keys start with one of workload, scheduler"),
])
def test_plan_table_errors_name_the_key(tmp_path, old, new, message):
    assert old in PLAN
    (tmp_path / "p.toml").write_text(PLAN.replace(old, new))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(tmp_path / "p.toml")


def test_all_candidates_infeasible_is_an_error_at_load(tmp_path):
    text = PLAN.replace('model = "llama-3-8b"', 'model = "llama-3-70b"')
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(ConfigError, match="does not fit on l4"):
        load(tmp_path / "p.toml")


def test_a_run_has_one_of_sweep_search_plan(tmp_path):
    (tmp_path / "p.toml").write_text(PLAN + '\n[sweep]\n"workload.rate" = [1, 2]\n')
    with pytest.raises(ConfigError, match="one of sweep, search or plan"):
        load(tmp_path / "p.toml")


def test_plan_is_the_same_in_two_worker_processes(tmp_path, planned):
    from schedlab.study.executor import ProcessExecutor
    from study_case import saved_bytes

    (tmp_path / "plan.toml").write_text(PLAN)
    executor = ProcessExecutor(2)
    try:
        parallel = run_experiment(load(tmp_path / "plan.toml"), executor=executor)
    finally:
        executor.close()
    serial = run_experiment(load(tmp_path / "plan.toml"))
    assert parallel.studies[0].plan == serial.studies[0].plan == planned.plan
    assert saved_bytes(parallel, tmp_path / "two") == saved_bytes(serial, tmp_path / "one")


def test_a_pipelined_candidate_pays_for_every_stage(tmp_path):
    """An instance of 2 pipeline stages at tensor parallel 2 runs on 4 GPUs: its price per hour
    is 4 x the GPU's."""
    from schedlab.study.planner import candidates

    router = 'router = {kind = "least_outstanding"}'
    text = PLAN.replace(router, router + "\npipeline_parallel = 2")
    (tmp_path / "p.toml").write_text(text)
    study = load(tmp_path / "p.toml").studies[0]
    prices = {(c.gpu, c.tensor_parallel): c.unit_cost for c in candidates(study, "p.toml")}
    assert prices[("l4", 2)] == pytest.approx(0.8 * 2 * 2)
    assert prices[("a100-40gb", 1)] == pytest.approx(1.3 * 2)


def test_a_data_parallel_candidate_pays_for_every_rank(tmp_path):
    """DP 2 was priced as one rank: a 2-GPU deployment at half the price of the same GPUs as two
    instances, and picked as the cheapest. Now 2 x tensor parallel x the GPU's price, and the
    answer names the instance's GPUs."""
    from schedlab.study.planner import candidates, deployment_text

    router = 'router = {kind = "least_outstanding"}'
    for extra, ranks in (("data_parallel = 2", 2), ("data_parallel = 4", 4)):
        (tmp_path / "p.toml").write_text(PLAN.replace(router, router + "\n" + extra))
        study = load(tmp_path / "p.toml").studies[0]
        found = {(c.gpu, c.tensor_parallel): c for c in candidates(study, "p.toml")}
        assert found[("l4", 2)].unit_cost == pytest.approx(0.8 * 2 * ranks)
        assert found[("a100-40gb", 1)].unit_cost == pytest.approx(1.3 * ranks)
        assert found[("l4", 2)].gpus_per_instance == 2 * ranks
    entry = {"instances": 3, "point": {"gpu": "l4", "tensor_parallel": 2}, "gpus_per_instance": 8}
    assert deployment_text(entry) == "3 instances x 8 l4 (tensor parallel)"


# -- the audit's findings: a misspelt GPU, a deployment vLLM would not start, the reasons and messages ------------

def test_a_gpu_that_is_no_preset_is_refused_when_the_file_is_read(tmp_path):
    (tmp_path / "p.toml").write_text(PLAN.replace("a100-40gb = 1.3", "a100-40g = 1.3"))
    with pytest.raises(ConfigError, match=r"^\S*p\.toml: \[plan\]: gpus: unknown gpu 'a100-40g' \(did you mean "
                                          r"'a100-40gb'\?\); known: a100-40gb, a100-80gb, .*\bl4\b") as caught:
        load(tmp_path / "p.toml")
    assert "\n" not in str(caught.value)
    custom = "[gpus.card]\nmemory_gib = 80\nhbm_bandwidth_gbps = 2000\nbf16_tflops = 300\nhost_link_gbps = 25\n"
    (tmp_path / "c.toml").write_text(custom + PLAN.replace("a100-40gb = 1.3", "card = 1.3"))
    assert set(load(tmp_path / "c.toml").studies[0].plan.gpus) == {"l4", "card"}  # a [gpus.<name>] table is known
    (tmp_path / "t.toml").write_text(custom + PLAN.replace("a100-40gb = 1.3", "crad = 1.3"))
    with pytest.raises(ConfigError, match=r"unknown gpu 'crad' \(did you mean 'card'\?\); known: .*\bcard\b"):
        load(tmp_path / "t.toml")


VLLM_40K = PLAN.replace('kind = "continuous"', 'kind = "vllm"\nmax_model_len = 40000') \
               .replace("num_requests = 300", "num_requests = 80").replace(f"max_instances = {MAX_INSTANCES}",
                                                                          "max_instances = 2")
L4_REFUSED = ("[scheduler]: vLLM would refuse to start: max_model_len 40,000 > the KV pool's 31,024 tokens; set "
              "[scheduler] max_model_len <= 31,024 or \"auto\"")


def test_a_deployment_vllm_would_refuse_to_start_is_infeasible_and_not_simulated(tmp_path):
    """llama-3-8b on one L4 holds 31,024 tokens of KV: a max_model_len of 40,000 does not fit,
    and vLLM refuses to start (the table's KV cache line says so of a run)."""
    (tmp_path / "p.toml").write_text(VLLM_40K)
    study = run_experiment(load(tmp_path / "p.toml")).studies[0]
    for entry in study.plan.candidates:
        p = entry["point"]
        if (p["gpu"], p["tensor_parallel"]) == ("l4", 1):
            assert entry["status"] == "infeasible"
            assert entry["reason"].endswith(" 'tiny_plan' " + L4_REFUSED)
        else:
            assert "refuse" not in entry["reason"]
    assert not any((r.point["gpu"], r.point["tensor_parallel"]) == ("l4", 1) for r in study.runs)  # none simulated
    assert study.plan.cheapest is not None


def test_only_a_scheduler_that_refuses_makes_a_deployment_infeasible(tmp_path):
    from schedlab.study.planner import feasibility

    (tmp_path / "c.toml").write_text(VLLM_40K.replace('kind = "vllm"', 'kind = "continuous"'))
    exp = load(tmp_path / "c.toml")
    assert all(reason == "" for _, reason in feasibility(exp.studies[0], exp.context, "c.toml"))
    (tmp_path / "v0.toml").write_text(VLLM_40K.replace('kind = "vllm"', 'kind = "vllm-v0"'))
    exp = load(tmp_path / "v0.toml")
    refused = [c.point for c, reason in feasibility(exp.studies[0], exp.context, "v0.toml") if reason]
    assert {(p["gpu"], p["tensor_parallel"]) for p in refused} == {("l4", 1)}


def test_a_plan_whose_every_deployment_vllm_would_refuse_is_an_error_at_load(tmp_path):
    (tmp_path / "p.toml").write_text(VLLM_40K.replace("gpus = {l4 = 0.8, a100-40gb = 1.3}", "gpus = {l4 = 0.8}")
                                     .replace("tensor_parallel = [1, 2]", "tensor_parallel = [1]"))
    with pytest.raises(ConfigError, match=r"^\S*p\.toml: " + re.escape(L4_REFUSED) + "$"):
        load(tmp_path / "p.toml")


def test_an_energy_price_without_power_is_said_when_the_file_is_read(tmp_path):
    import warnings

    from schedlab.errors import InputWarning

    priced = PLAN.replace("[plan]\n", "[plan]\nenergy_price_per_kwh = 0.12\n")
    (tmp_path / "p.toml").write_text(priced)
    with pytest.warns(InputWarning) as caught:
        load(tmp_path / "p.toml")
    said = [str(w.message) for w in caught if "energy_price_per_kwh" in str(w.message)]
    assert len(said) == 1 and said[0].endswith(
        "p.toml: [plan]: energy_price_per_kwh is set but the runs have no [power] table: no energy is metered, so no "
        "energy cost is reported; add [power] kind = \"utilisation\"")
    (tmp_path / "w.toml").write_text(priced.replace("[plan]\n", '[power]\nkind = "utilisation"\n\n[plan]\n'))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(tmp_path / "w.toml")
    assert not [w for w in caught if "energy_price_per_kwh" in str(w.message)]


def test_a_too_expensive_reason_names_the_cap_that_applied(planned):
    """The cap is the cheapest answer when the candidate's wave started (found by a cheaper
    candidate per instance), not the final answer: the reason says which."""
    expensive = [e for e in planned.plan.candidates if e["status"] == "too-expensive"]
    assert expensive
    found = [e for e in planned.plan.candidates if e["status"] == "found"]
    for entry in expensive:
        unit = entry["unit_cost"]
        match = re.fullmatch(r"fails up to (\d+) instances?, the most that cost no more than \$([\d.,]+)/h, the "
                             r"cheapest found then|1 instance cost \$[\d.,]+/h, more than \$([\d.,]+)/h, the "
                             r"cheapest found then", entry["reason"])
        assert match, entry["reason"]
        cap = float((match[2] or match[3]).replace(",", ""))
        assert any(f["unit_cost"] < unit and f["cost"] == pytest.approx(cap) for f in found)
        if match[1] is not None:
            assert int(match[1]) * unit <= cap + 1e-9 < (int(match[1]) + 1) * unit


def test_when_nothing_meets_the_constraints_the_message_says_the_best_reached(tmp_path):
    text = VLLM_40K.replace("max_model_len = 40000", "max_model_len = 8192") \
                   .replace(f'constraints = ["slo.attainment >= {TARGET}"]',
                            f'constraints = ["slo.attainment >= {TARGET}", "tpot_ms.p99 <= 2"]')
    (tmp_path / "p.toml").write_text(text)
    study = run_experiment(load(tmp_path / "p.toml")).studies[0]
    assert study.plan.cheapest is None
    best = min(study.runs, key=lambda r: r.metrics["tpot_ms"]["p99"])
    p = best.point
    n = p["cluster.instances"]
    where = (f"{n} instance{'s' if n > 1 else ''} x {p['tensor_parallel']} {p['gpu']}, "
             f"max_num_seqs={p['scheduler.max_num_seqs']}")
    assert study.plan.message == (
        f"no deployment meets slo.attainment >= {TARGET} and tpot_ms.p99 <= 2 within 2 instances of any candidate; "
        f"best tpot_ms.p99 reached: {best.metrics['tpot_ms']['p99']:.4g} ({where}); "
        "raise max_instances or widen the space")


def test_a_plan_over_an_autoscaled_cluster_names_its_min_instances(tmp_path):
    """A plan tries from [plan] min_instances (1 unless set): autoscaling needs 2, and the message
    names the plan's key, not [cluster] instances, which the plan does not read; 2 loads."""
    router = 'router = {kind = "least_outstanding"}'
    scaled = PLAN.replace(router, router + '\nautoscaler = {kind = "queue_length", min_instances = 1, interval_s = 5}')
    (tmp_path / "p.toml").write_text(scaled)
    with pytest.raises(ConfigError, match=r"\[plan\]: min_instances: 1: the run's \[cluster\] autoscaler needs at "
                                          r"least 2 instances to scale between; set \[plan\] min_instances >= 2$"):
        load(tmp_path / "p.toml")
    (tmp_path / "two.toml").write_text(scaled.replace("[plan]\n", "[plan]\nmin_instances = 2\n"))
    assert load(tmp_path / "two.toml").studies[0].plan.min_instances == 2


@pytest.mark.parametrize("setting, message", [
    ("min_instances = 3", r"\[cluster.autoscaler\]: min_instances \(3\) is above \[plan\] min_instances \(2\), the "
                          r"most instances the plan's smallest deployments may serve; set \[plan\] min_instances >= 3, "
                          r"or a lower min_instances$"),
    ("initial = 4", r"\[cluster.autoscaler\]: initial \(4\) is above \[plan\] min_instances \(2\)"),
    ("max_instances = 3", r"\[cluster.autoscaler\]: max_instances \(3\): the plan sets the most instances that may "
                          r"serve, each deployment's count from \[plan\] min_instances \(2\) to max_instances"),
])
def test_a_plans_autoscaler_limits_above_its_fewest_instances_name_plan_min_instances(tmp_path, setting, message):
    """The plan's smallest deployments have [plan] min_instances instances: an autoscaler asking
    for more is refused naming that key, the source of the count (before: "min_instances (3) is
    above the 2 instances", with no word of where the 2 came from)."""
    router = 'router = {kind = "least_outstanding"}'
    scaled = PLAN.replace(router, router + f'\nautoscaler = {{kind = "queue_length", {setting}, interval_s = 5}}')
    (tmp_path / "p.toml").write_text(scaled.replace("[plan]\n", "[plan]\nmin_instances = 2\n"))
    with pytest.raises(ConfigError, match=message):
        load(tmp_path / "p.toml")


def test_a_sweep_over_instances_of_an_autoscaled_cluster_names_its_point(tmp_path):
    """A sweep's point set the instances, not [cluster] instances: the message says so."""
    router = 'router = {kind = "least_outstanding"}'
    scaled = BASE.replace(router, router + '\nautoscaler = {kind = "queue_length", min_instances = 1}') \
                 .replace('model = "llama-3-8b"', 'model = "llama-3-8b"\ngpu = "l4"')
    (tmp_path / "s.toml").write_text(scaled + '\n[sweep]\n"cluster.instances" = [1, 2]\n')
    with pytest.raises(ConfigError, match=r"autoscaling needs at least 2 instances \(the most that can serve\), but "
                                          r"this point's cluster.instances is 1: sweep or search it from 2$"):
        load(tmp_path / "s.toml")
