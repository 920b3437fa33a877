"""Autoscaling pipelined instances (``[cluster] pipeline_parallel`` with ``[cluster.autoscaler]``):
a scale-up with a cold start and a drain with a batch in flight by hand, a drained instance kept
on by a batch whose requests all left, metered by hand, both engines alike on random workloads
and scaling settings (with conservation, and energy with ``[power]``), the TOML and the refusal
of a dense model's data-parallel ranks.

Hand-computed runs use :mod:`tests.test_pipeline_parallel`'s instance: 2 stages, each half of the
``linear`` model's iteration (0.5 ms per prompt token, 8 ms per decode step), a stage sending the
next 0.25 ms + 0.0625 ms per token. An 8-token prompt alone takes 2 + 0.75 + 2 = 4.75 ms, one
decode alone 4 + 0.3125 + 4 = 8.3125 ms, two decodes together 8.375 ms. An instance is 2 GPUs.
"""

from __future__ import annotations

import copy
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.energy.timeline import power_steps
from schedlab.engine.scaling import ScalingLimits
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.testing import (blocks_for_largest, check_energy, check_run, compare_runs, dyadic_linear_costs,
                              examples, fast_run_agreeing_with_reference, requests_lists)
from schedlab.testing.parallel import LinearParallelCost, run_pipelined
from schedlab_plugins.autoscalers import QueueLength, QueueLengthConfig, TargetUtilization, TargetUtilizationConfig
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.power import FixedActiveConfig, FixedActivePowerModel
from schedlab_plugins.routers import LeastOutstandingRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

from test_disagg_scaling import Script, on_at
from test_pipeline_energy import same_energy, utilisation
from test_pipeline_parallel import BASE, ROUTERS, _requests, by_id, client_side, instance, tight

ENGINES = ("fast", "reference")
HOUR_MS = 3.6e6


def fixed_power(cost):
    """300 W a stage while it computes its slice, 40 W otherwise (no standby beyond idle)."""
    return FixedActivePowerModel(FixedActiveConfig(), 1, active_w=300.0, standby_w=40.0, idle_w=40.0)


class Newest:
    """Sends every request to the serving instance listed last."""

    def route(self, request, instances):
        return len(instances) - 1


# -- by hand ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_warm_pipeline_serves_from_its_cold_starts_end_and_drains_its_batch_in_flight(engine):
    # Instances 0 and 1 behind least-outstanding, only 0 serving at first. Ticks every 10 ms, a
    # cold start of 20 ms; the policy asks for 2 until 40 ms, then 1.
    #   R0 (at 0, 6 tokens) on 0: first token 4.75, decodes alone to 13.0625.
    #   tick 10: 2 wanted -> instance 1 warms, serves from 30.
    #   R1 (at 12, 3 tokens) on 0 (1 still warming): joins at R0's landing, 13.0625, one batch of
    #      R0's decode and R1's prompt (9 tokens: 12 ms, 6 a stage, send 0.8125) -> 25.875; then
    #      both decode, 8.375 ms a batch: 34.25, 42.625 (R1 done); R0 alone 50.9375 (done).
    #   R2 (at 31, 4 tokens) on 1 (0 holds 2, 1 none): 35.75, then 44.0625, 52.375, 60.6875.
    #   tick 40: 1 wanted -> instance 1 drains while R2's decode (35.75-44.0625) is in flight: it
    #      lands its batches and is off at its last landing, 60.6875; the ticks at 50 and 60 find it
    #      draining, the one at 70 off.
    #   R3 (at 45, 2 tokens) on 0, the only one serving: waits for R0's landing at 50.9375, 55.6875, 64.
    #   R4 (at 70, 2 tokens) on 0: 74.75, 83.0625 -- the run's end. The tick at 80, after the last
    #      arrival, decides too (a controller cannot know no request will come).
    requests = [Request(0, 0.0, 8, 6), Request(1, 12.0, 8, 3), Request(2, 31.0, 8, 4), Request(3, 45.0, 8, 2),
                Request(4, 70.0, 8, 2)]
    limits = ScalingLimits(1, 2, 1, interval_ms=10.0, cold_start_ms=20.0, window_ms=1000.0)
    policy = Script(2, 1, 40.0)
    r = run_pipelined(requests, instance(), 2, 2, LeastOutstandingRouter(), engine=engine, autoscaler=policy,
                      limits=limits, power=fixed_power)
    assert by_id(r, "instance") == {0: 0, 1: 0, 2: 1, 3: 0, 4: 0}
    assert by_id(r, "first_token_ms") == {0: 4.75, 1: 25.875, 2: 35.75, 3: 55.6875, 4: 74.75}
    assert by_id(r, "finish_ms") == {0: 50.9375, 1: 42.625, 2: 60.6875, 3: 64.0, 4: 83.0625}
    scaling = r.meta["scaling"]
    assert scaling["history"] == [[0.0, 1, 0, 0, 1], [10.0, 1, 1, 0, 2], [20.0, 1, 1, 0, 2], [30.0, 2, 0, 0, 2],
                                  [40.0, 1, 0, 1, 1], [50.0, 1, 0, 1, 1], [60.0, 1, 0, 1, 1], [70.0, 1, 0, 0, 1],
                                  [80.0, 1, 0, 0, 1]]
    assert scaling["intervals"] == [[0, 0.0, 83.0625], [1, 10.0, 60.6875]]
    assert (scaling["scale_ups"], scaling["scale_downs"]) == (1, 1)
    assert scaling["gpu_hours"] == 2 * (83.0625 + 50.6875) / HOUR_MS  # each instance's 2 stages
    assert r.metrics["gpu_hours"] == pytest.approx(scaling["gpu_hours"], rel=1e-15)
    assert [s.serving for s in policy.seen] == [1, 1, 2, 2, 1, 1, 1, 1]  # each before its decision
    # Instance 1 is metered from its switch-on at 10 (idle while warming) to its off: R2's prompt
    # (2 ms a stage) and 3 decodes (4 ms a stage) make 28 ms of slices at 300 W; the rest of its
    # 2 x 50.6875 stage-ms idles at 40 W. Nothing before 10 or after 60.6875.
    one = r.meta["energy"]["instances"][1]
    assert one["busy_j"] == pytest.approx(0.3 * 28, rel=1e-12)
    assert one["idle_j"] == pytest.approx(0.04 * (2 * 50.6875 - 28), rel=1e-12)
    assert one["off"] == [[0.0, 10.0], [60.6875, 83.0625]] and one["on_ms"] == 50.6875
    check_energy(r)
    check_run(r, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_draining_pipeline_stays_on_until_a_batch_that_lost_its_requests_lands(engine):
    # Both instances serve at first; every request goes to the newest serving one. A token budget
    # of 16 puts r0's prompt (16 tokens, 1 token out) and r1's (16, its client gone at 5 ms) in
    # batches A and B on instance 1, both launched at 0: A on stage 0 0-4 and stage 1 5.25-9.25,
    # B 4-8 and 9.25-13.25. A lands at 9.25: r0 finishes, r1's abort is heard -- nothing is
    # outstanding, but B is still in the pipeline. The tick at 5 drains instance 1; the one at
    # 10 finds it holding B; B lands, empty, at 13.25, when it goes off (the tick at 15 says so).
    # r2 (at 25, 1 token) on instance 0: 25-27, 27.75-29.75, the run's end.
    requests = [Request(0, 0.0, 16, 1), Request(1, 0.0, 16, 2, timeout_ms=5.0), Request(2, 25.0, 8, 1)]
    limits = ScalingLimits(1, 2, 2, interval_ms=5.0, cold_start_ms=0.0, window_ms=1000.0)
    r = run_pipelined(requests, tight(8), 2, 2, Newest(), engine=engine, autoscaler=Script(2, 1, 5.0), limits=limits,
                      power=fixed_power)
    assert by_id(r, "instance") == {0: 1, 1: 1, 2: 0}
    assert by_id(r, "finish_ms") == {0: 9.25, 1: 9.25, 2: 29.75} and by_id(r, "aborted") == {0: 0, 1: 1, 2: 0}
    scaling = r.meta["scaling"]
    assert scaling["history"] == [[0.0, 2, 0, 0, 2], [5.0, 1, 0, 1, 1], [10.0, 1, 0, 1, 1], [15.0, 1, 0, 0, 1],
                                  [20.0, 1, 0, 0, 1], [25.0, 1, 0, 0, 1]]
    assert scaling["intervals"] == [[0, 0.0, 29.75], [1, 0.0, 13.25]]
    assert scaling["gpu_hours"] == 2 * (29.75 + 13.25) / HOUR_MS
    # Energy by hand, 300 W a slice and 40 W otherwise while on: instance 1 computes 16 ms of
    # slices (A's and B's on both stages) and idles 2 x 13.25 - 16 stage-ms, then draws nothing;
    # instance 0 computes r2's 4 ms and idles the rest of 2 x 29.75.
    zero, one = r.meta["energy"]["instances"]
    assert one["busy_j"] + one["idle_j"] == pytest.approx(0.3 * 16 + 0.04 * 10.5, rel=1e-12)
    assert zero["busy_j"] + zero["idle_j"] == pytest.approx(0.3 * 4 + 0.04 * 55.5, rel=1e-12)
    assert one["off"] == [[13.25, 29.75]] and one["on_ms"] == 13.25 and zero["on_ms"] == 29.75
    edges, watts = power_steps(r, 1)
    assert edges[-2:].tolist() == [13.25, 29.75] and watts[-1] == 0.0
    check_energy(r, shared=False)  # (B's energy belongs to no request)
    check_run(r, requests)


# -- both engines, random workloads and scaling settings -------------------------------------------------------


@st.composite
def scaled_pipelines(draw):
    """2-3 pipelined instances of 2-4 stages behind a router, autoscaled by a built-in policy
    (random targets, ticks, cold starts, windows, stabilisation), clients that may give up,
    sometimes metered, sometimes with prefix caching (requests may share a system prompt)."""
    requests = draw(requests_lists(min_size=3, max_size=20, max_prompt=48, max_output=30, max_arrival_ms=300.0,
                                   all_at_zero=False, prefix_groups=2))
    n = draw(st.integers(2, 3))
    low = draw(st.integers(1, n))
    common = dict(min_instances=low, stabilization_s=draw(st.sampled_from([0, 0.02])))
    if draw(st.booleans()):
        policy = QueueLength(QueueLengthConfig(target_per_instance=draw(st.sampled_from([1, 2, 4])),
                                               signal=draw(st.sampled_from(["waiting", "outstanding"])), **common))
    else:
        policy = TargetUtilization(TargetUtilizationConfig(
            metric=draw(st.sampled_from(["kv_usage", "outstanding"])), target=draw(st.sampled_from([0.25, 1, 2])),
            **common))
    limits = ScalingLimits(low, n, draw(st.integers(low, n)), interval_ms=draw(st.sampled_from([4.0, 16.0, 50.0])),
                           cold_start_ms=draw(st.sampled_from([0.0, 8.0, 40.0])),
                           window_ms=draw(st.sampled_from([20.0, 100.0])))
    seqs = draw(st.integers(1, 4))
    config = ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=draw(st.sampled_from([16, 64])),
                              allocation="grow", chunked_prefill=True,
                              async_scheduling=draw(st.booleans()))  # (planning ahead: engine.stages)
    return dict(requests=requests, instances=n, stages=draw(st.integers(2, 4)), policy=policy, limits=limits,
                config=config, cost=draw(dyadic_linear_costs()),
                blocks=blocks_for_largest(requests, 4) + draw(st.integers(0, 30)), router=draw(st.sampled_from(
                    sorted(ROUTERS))), timeout=draw(st.sampled_from([None, None, 40.0, 120.0])),
                power=draw(st.sampled_from([None, (0.0, 0.0), (0.02, 0.005)])),
                prefix=draw(st.booleans()))  # vLLM's prefix cache: reset when an instance goes off


def run_case(case, engine: str):
    stages = case["stages"]

    def make():
        cost = LinearParallelCost(LinearCostModel(case["cost"]), stages=stages, moe=False)
        return ContinuousScheduler(case["config"]), cost, (PrefixKVCache if case["prefix"] else PagedKVCache)(
            case["blocks"], 4)

    power = case["power"]
    return run_pipelined(case["requests"], make, stages, case["instances"], ROUTERS[case["router"]](),
                         engine=engine, client_side=client_side(case["timeout"]) if case["timeout"] else None,
                         power=utilisation(*power) if power is not None else None,
                         autoscaler=copy.deepcopy(case["policy"]), limits=case["limits"])


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scaled_pipelines())
def test_both_engines_scale_pipelines_alike_and_conserve_requests(case):
    fast, ref = (run_case(case, engine) for engine in ENGINES)
    compare_runs(fast, ref, rel=1e-12)
    a, b = fast.meta["scaling"], ref.meta["scaling"]
    assert a["history"] == b["history"] and a["intervals"] == b["intervals"]
    for run in (fast, ref):
        check_run(run, case["requests"])  # each request once: finished, rejected or aborted; every block back
    limits, stages = case["limits"], case["stages"]
    for _t, serving, warming, _draining, _desired in a["history"]:
        assert limits.min_instances <= serving + warming <= limits.max_instances
    assert all(on == 0.0 or on % limits.interval_ms == 0 for _, on, _ in a["intervals"])  # switched on at ticks
    req = fast.requests
    for i in range(req["id"].size):
        assert not req["rejected"][i]
        home = on_at(a["intervals"], int(req["instance"][i]), float(req["arrival_ms"][i]))
        assert home is not None, i  # routed to an instance that was on...
        assert home[0] == 0.0 or req["arrival_ms"][i] >= home[0] + limits.cold_start_ms  # ...and warm
        assert req["finish_ms"][i] <= home[1]  # and left it before it went off
    assert a["gpu_hours"] == pytest.approx(stages * sum(off - on for _, on, off in a["intervals"]) / HOUR_MS)
    if case["power"] is None:
        return
    same_energy(fast, ref)
    start, end = fast.meta["energy"]["window_ms"]
    for run in (fast, ref):
        check_energy(run, shared=not run.requests["aborted"].any())
        for k, inst in enumerate(run.meta["energy"]["instances"]):  # off exactly while not paid for
            paid = sorted((on, off) for i, on, off in run.meta["scaling"]["intervals"] if i == k)
            edges = [start] + [t for interval in paid for t in interval] + [end]
            unpaid = [[x, y] for x, y in zip(edges[::2], edges[1::2]) if y > x]
            assert [[x, y] for x, y in inst.get("off", []) if y > x] == unpaid, k
            steps, watts = power_steps(run, k)
            for x, y in unpaid:  # and draws nothing then
                inside = (steps[:-1] >= x) & (steps[1:] <= y)
                assert inside.any() and (watts[inside] == 0.0).all(), (k, x, y)


# -- TOML --------------------------------------------------------------------------------------------------------

#: test_pipeline_parallel's Qwen3-32B on RTX PRO 6000s, in bursts, 3 pipelined instances of 2
#: stages autoscaled on requests outstanding, metered
TOML = textwrap.dedent(BASE).replace("num_requests = 40", "num_requests = 150").replace(
    "rate = 20", 'rate = 6\narrival = "gamma"\ncv = 3') + """
[cluster]
pipeline_parallel = 2
instances = 3
router = {kind = "least_outstanding"}
[cluster.autoscaler]
kind = "target_utilization"
metric = "outstanding"
target = 3
cold_start_s = 2
interval_s = 1
stabilization_s = 2
[power]
kind = "utilisation"
"""
assert "num_requests = 150" in TOML and "cv = 3" in TOML


def test_a_toml_run_scales_pipelined_instances_and_pays_for_every_stage(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(TOML)
    fast = fast_run_agreeing_with_reference(path)
    scaling, fleet = fast.meta["scaling"], fast.metrics["fleet"]
    assert fleet["scale_ups"] > 0 and fleet["scale_downs"] > 0 and fleet["min_serving"] == 1
    paid_ms = sum(off - on for _, on, off in scaling["intervals"])
    assert fast.metrics["gpus"] == 6
    assert fast.metrics["gpu_hours"] == pytest.approx(2 * paid_ms / HOUR_MS) == scaling["gpu_hours"]
    assert fast.metrics["gpu_hours"] < 6 * scaling["end_ms"] / HOUR_MS  # below the three kept on
    assert fast.metrics["finished"] == 150
    start, end = fast.meta["energy"]["window_ms"]
    for k, inst in enumerate(fast.meta["energy"]["instances"]):
        paid = sorted((on, off) for i, on, off in scaling["intervals"] if i == k)
        assert inst.get("on_ms", end - start) == pytest.approx(sum(off - on for on, off in paid), rel=1e-12)
        assert len(inst["stages"]) == 2
    check_energy(fast)
    check_run(fast, _requests(path))


def test_a_dense_models_data_parallel_ranks_with_an_autoscaler_are_refused(tmp_path):
    """(Qwen3-32B is dense: its ranks are independent instances. A MoE model's deployments
    scale: tests/test_data_parallel_deployments.py.)"""
    from schedlab.study.experiment import load

    path = tmp_path / "exp.toml"
    path.write_text(TOML.replace("pipeline_parallel = 2\ninstances = 3\n", "data_parallel = 2\ninstances = 3\n"))
    with pytest.raises(ConfigError, match=r"exp\.toml.*\[cluster.autoscaler\]: autoscaling a dense model's "
                                          r"data-parallel ranks \(independent instances\) is not modelled"):
        load(path)
