"""Several data-parallel deployments of a MoE model behind a router (``[cluster] instances`` with
``data_parallel``), and autoscaling them: hand-computed steps, each deployment as a lone one,
the fast engine against the reference engine (clients that give up, closed loops, energy,
autoscalers), the rules every run keeps, and the TOML.

Hand-computed cases use :mod:`tests.test_data_parallel`'s rank: the ``linear`` model's 0.5 ms per
prompt token and 8 ms per decode step as a rank's part, experts costing 1 ms + 0.0625 ms per
token of the deployment's ranks + 0.125 ms per token of its largest rank; a rank with nothing to
do runs a dummy batch of 8 ms. Rank ``r`` of deployment ``d`` (2 ranks each) is instance ``2d + r``.
"""

from __future__ import annotations

import copy
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.engine.scaling import ScalingLimits
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import (blocks_for_largest, check_energy, check_run, compare_runs, dyadic_linear_costs,
                              examples, fast_run_agreeing_with_reference, requests_lists, small_closed_loop)
from schedlab.testing.parallel import LinearParallelCost, run_data_parallel, run_deployments
from schedlab_plugins.autoscalers import QueueLength, QueueLengthConfig
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.power import FixedActiveConfig, FixedActivePowerModel
from schedlab_plugins.routers import (DataParallelRouter, DataParallelRouterConfig, LeastOutstandingRouter,
                                      RoundRobinRouter)
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

from test_data_parallel import BASE, ROUTERS, SPECULATIVE, Placed, by_id, client_side, rank, schedulers
from test_disagg_scaling import Script, on_at

ENGINES = ("fast", "reference")
HOUR_MS = 3.6e6
SETTINGS = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Newest:
    """Sends every request to the serving deployment listed last."""

    def route(self, request, instances):
        return len(instances) - 1


# -- by hand ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_each_deployment_steps_on_its_own_behind_a_round_robin(engine):
    # Round robin over 2 deployments, then over each one's 2 ranks: R0 -> deployment 0 rank 0
    # (instance 0), R1 -> deployment 1 rank 0 (2), R2 -> deployment 0 rank 1 (1), R3 -> 3.
    # Deployment 0: prompts of 16 and 8 (8 and 4 ms), experts of (16, 8): 1 + 0.0625 x 24 +
    #   0.125 x 16 = 4.5 -> first tokens at 12.5; two decodes (8 ms), experts 1.25 -> 21.75.
    # Deployment 1: prompts of 32 and 16 (16 and 8 ms), experts 1 + 0.0625 x 48 + 0.125 x 32 = 8
    #   -> 24; two decodes -> 33.25 (R1 done); R3's decode beside a dummy -> 42.5.
    # Deployment 0 does not wait for deployment 1's longer steps.
    requests = [Request(0, 0.0, 16, 2), Request(1, 0.0, 32, 2), Request(2, 0.0, 8, 2), Request(3, 0.0, 16, 3)]
    r = run_deployments(requests, rank(), 2, 2, RoundRobinRouter(), RoundRobinRouter, engine=engine)
    assert by_id(r, "instance") == {0: 0, 1: 2, 2: 1, 3: 3}
    assert by_id(r, "first_token_ms") == {0: 12.5, 1: 24.0, 2: 12.5, 3: 24.0}
    assert by_id(r, "finish_ms") == {0: 21.75, 1: 33.25, 2: 21.75, 3: 42.5}
    assert r.meta["data_parallel"] == {
        "deployments": 2, "ranks": 2, "steps": 5, "dummy_rank_steps": 1, "experts_ms": 4.5 + 1.25 + 8 + 1.25 + 1.25,
        "per_deployment": [{"steps": 2, "dummy_rank_steps": 0, "experts_ms": 5.75},
                           {"steps": 3, "dummy_rank_steps": 1, "experts_ms": 10.5}]}
    check_run(r, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_arrival_elsewhere_neither_wakes_nor_cuts_a_deployment(engine):
    # R0 (at 0, 16 + 3 tokens) -> deployment 0 rank 0: its prefill beside a dummy, 8 + 4.0625
    #   (experts of (16, 1)) -> 12.0625.
    # R1 (at 5, 8 + 2) -> deployment 1, idle until then: 8 (a dummy's 8 > 4) + 1 + 0.0625 x 9 +
    #   0.125 x 8 = 2.5625 -> 15.5625; a decode beside a dummy, 9.25 -> 24.8125.
    # R2 (at 10, 16 + 2) -> deployment 0 rank 1, in its first step: it joins at 12.0625 beside
    #   R0's decode: 8 + 4.0625 -> 24.125 (R0's 2nd token, R2's 1st); two decodes -> 33.375.
    requests = [Request(0, 0.0, 16, 3), Request(1, 5.0, 8, 2), Request(2, 10.0, 16, 2)]
    r = run_deployments(requests, rank(), 2, 2, Placed([0, 1, 0]), RoundRobinRouter, engine=engine)
    assert by_id(r, "instance") == {0: 0, 1: 2, 2: 1}
    assert by_id(r, "first_token_ms") == {0: 12.0625, 1: 15.5625, 2: 24.125}
    assert by_id(r, "finish_ms") == {0: 33.375, 1: 24.8125, 2: 33.375}
    assert [d["steps"] for d in r.meta["data_parallel"]["per_deployment"]] == [3, 2]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_deployment_between_steps_aborts_what_is_due_before_the_router_looks(engine):
    # Least outstanding over 2 deployments, round robin within each. R0 (16 + 10 tokens, its
    # client gone at 13) -> deployment 0 rank 0; R1 (8 + 10) -> deployment 1; R2 (16 + 10) ->
    # deployment 0 rank 1 (1 each: the lowest). Deployment 0's first step: two prompts of 16
    # (8 ms each), experts of (16, 16): 1 + 2 + 2 = 5 -> 13, when R0's abort is due.
    # R3 (at 13, 16 + 2) finds deployment 0 between steps: it drops R0 first, so the router sees
    # 1 and 1 (not 2 and 1) -> deployment 0, rank 0 again: its prompt beside R2's decode, 8 +
    # 1 + 0.0625 x 17 + 0.125 x 16 = 12.0625 -> first token at 25.0625.
    from schedlab.testing import RecordingRouter

    requests = [Request(0, 0.0, 16, 10, timeout_ms=13.0), Request(1, 0.0, 8, 10), Request(2, 0.0, 16, 10),
                Request(3, 13.0, 16, 2)]
    spy = RecordingRouter(LeastOutstandingRouter())
    r = run_deployments(requests, rank(), 2, 2, spy, RoundRobinRouter, engine=engine)
    assert spy.seen[3] == (3, [1, 1])
    assert by_id(r, "instance") == {0: 0, 1: 2, 2: 1, 3: 0}
    assert by_id(r, "aborted") == {0: 1, 1: 0, 2: 0, 3: 0} and by_id(r, "finish_ms")[0] == 13.0
    assert by_id(r, "first_token_ms")[3] == 25.0625
    check_run(r, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_second_deployment_warms_serves_and_drains_its_requests(engine):
    # Deployments 0 and 1 (2 GPUs each), only 0 serving at first; ticks every 10 ms, a cold
    # start of 20 ms; the policy asks for 2 until 40 ms, then 1. Requests go to the newest
    # serving deployment; each deployment's ranks take turns. Every request is 16 + 2 tokens:
    # 12.0625 to its first token beside a dummy, 9.25 more to its last.
    #   R0 (at 0) -> deployment 0 rank 0: 12.0625, 21.3125.
    #   tick 10: deployment 1 warms, serves from 30.
    #   R1 (at 31) -> deployment 1 rank 0 (instance 2): 43.0625, 52.3125.
    #   tick 40: deployment 1 drains, holding R1; it is off at its last step's end, 52.3125 (the
    #     tick at 50 finds it draining, the one at 60 off).
    #   R2 (at 45) -> deployment 0 rank 1 (instance 1): 57.0625, 66.3125.
    #   R3 (at 70) -> deployment 0 rank 0: 82.0625, 91.3125 -- the run's end; the ticks at 80 and
    #     90 come after the last arrival, the work not yet done.
    requests = [Request(0, 0.0, 16, 2), Request(1, 31.0, 16, 2), Request(2, 45.0, 16, 2), Request(3, 70.0, 16, 2)]
    limits = ScalingLimits(1, 2, 1, interval_ms=10.0, cold_start_ms=20.0, window_ms=1000.0)
    policy = Script(2, 1, 40.0)
    r = run_deployments(requests, rank(), 2, 2, Newest(), RoundRobinRouter, engine=engine, autoscaler=policy,
                        limits=limits)
    assert by_id(r, "instance") == {0: 0, 1: 2, 2: 1, 3: 0}
    assert by_id(r, "first_token_ms") == {0: 12.0625, 1: 43.0625, 2: 57.0625, 3: 82.0625}
    assert by_id(r, "finish_ms") == {0: 21.3125, 1: 52.3125, 2: 66.3125, 3: 91.3125}
    scaling = r.meta["scaling"]
    assert scaling["history"] == [[0.0, 1, 0, 0, 1], [10.0, 1, 1, 0, 2], [20.0, 1, 1, 0, 2], [30.0, 2, 0, 0, 2],
                                  [40.0, 1, 0, 1, 1], [50.0, 1, 0, 1, 1], [60.0, 1, 0, 0, 1], [70.0, 1, 0, 0, 1],
                                  [80.0, 1, 0, 0, 1], [90.0, 1, 0, 0, 1]]
    assert scaling["intervals"] == [[0, 0.0, 91.3125], [1, 10.0, 52.3125]]
    assert scaling["gpu_hours"] == 2 * (91.3125 + 42.3125) / HOUR_MS  # each deployment's 2 ranks
    assert [s.serving for s in policy.seen] == [1, 1, 2, 2, 1, 1, 1, 1, 1]


# -- each deployment as a lone one; both engines alike ------------------------------------------------------------


@SETTINGS
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=60, all_at_zero=False, priorities=True),
       schedulers(), st.integers(2, 3), st.integers(2, 3), dyadic_linear_costs(), st.integers(0, 30), st.data())
def test_a_deployment_serves_its_requests_as_a_lone_deployment_would(requests, cfg, deployments, ranks, cost, spare,
                                                                    data):
    """Deployments share nothing: with the requests placed on them, each one's requests get the
    timestamps they get on a single deployment of its own (the single-deployment driver)."""
    places = data.draw(st.lists(st.integers(0, deployments - 1), min_size=len(requests), max_size=len(requests)))
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), PagedKVCache(blocks, 4)

    def rank_router():
        return DataParallelRouter(DataParallelRouterConfig(stats_interval_ms=16.0))

    whole = run_deployments(requests, make, deployments, ranks, Placed(places), rank_router)
    for d in range(deployments):
        mine = [req for req in requests if places[req.id] == d]
        if not mine:
            continue
        alone = run_data_parallel(mine, make, ranks, rank_router())
        for column in ("first_token_ms", "finish_ms", "generated_tokens", "preemptions"):
            got = by_id(whole, column)
            assert {req.id: got[req.id] for req in mine} == by_id(alone, column), (d, column)
        placed = by_id(whole, "instance")
        assert {req.id: placed[req.id] - d * ranks for req in mine} == by_id(alone, "instance")
        assert whole.meta["data_parallel"]["per_deployment"][d]["steps"] == alone.meta["data_parallel"]["steps"]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=2, max_size=14, max_prompt=48, max_output=12), st.integers(2, 3), st.integers(1, 3),
       dyadic_linear_costs(), st.sampled_from(["outstanding", "waiting", "running", "kv"]))
def test_the_router_sees_each_deployment_as_its_ranks_summed_at_the_arrival(requests, deployments, max_num_seqs, cost,
                                                                          look):
    """What a router reads of a deployment is the sum over its ranks of what it would read of
    each rank at that moment (a step in progress still holds its requests and blocks): the
    outstanding count is the number of requests routed there earlier that finish after the
    arrival, and waiting, running and KV blocks are the ranks' own views summed."""
    from schedlab.engine.load import views_of
    from schedlab.testing import RecordingRouter

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=32)),
                LinearParallelCost(LinearCostModel(cost)), PagedKVCache(64, 4))

    reads = {"outstanding": lambda v: v.outstanding, "waiting": lambda v: v.waiting, "running": lambda v: v.running,
             "kv": lambda v: (v.kv.num_used_blocks(), v.kv.num_free_blocks(), v.kv.num_blocks)}

    class Spy(RecordingRouter):
        """Records each deployment's view and its ranks' own views summed, at the same moment."""

        def route(self, request, instances):
            ranks = [views_of(view._inst.members, instances.clock) for view in instances]
            summed = [tuple(map(sum, zip(*[_tuple(reads[look](r)) for r in rs]))) for rs in ranks]
            self.seen.append((request.id, [_tuple(reads[look](v)) for v in instances], summed))
            return self.inner.route(request, instances)

    for engine in ENGINES:
        spy = Spy(LeastOutstandingRouter())
        result = run_deployments(requests, make, deployments, 2, spy, RoundRobinRouter, engine=engine)
        place, finish = by_id(result, "instance"), by_id(result, "finish_ms")
        routed: list[int] = []
        for rid, seen, summed in spy.seen:
            assert seen == summed, (engine, rid)
            if look == "outstanding":
                t = requests[rid].arrival_ms
                expected = [sum(1 for j in routed if place[j] // 2 == d and finish[j] > t) for d in range(deployments)]
                assert [s[0] for s in seen] == expected, (engine, rid)
            routed.append(rid)


def _tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


OUTER = {"round_robin": RoundRobinRouter, "least_outstanding": LeastOutstandingRouter, "newest": Newest}


@SETTINGS
@given(requests_lists(min_size=1, max_size=16, max_prompt=60, max_output=60, all_at_zero=False, priorities=True,
                      prefix_groups=2),
       schedulers(), st.integers(2, 3), st.integers(2, 3), st.sampled_from(sorted(OUTER)),
       st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 30), st.sampled_from([None, 20.0, 90.0]),
       st.integers(0, 2))
def test_deployments_agree_between_engines_and_keep_the_rules(requests, cfg, deployments, ranks, outer, inner, cost,
                                                              spare, timeout, workers):
    """Random arrivals and schedulers, caches barely big enough, clients that may give up
    through an API server: both engines give the same timestamps and steps; every request is
    served, rejected or aborted once, never before it arrived, within the caches and slots."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        return (ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)),
                PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3))

    side = client_side(timeout + 0.5, 0.5, workers) if timeout is not None else None
    runs = [run_deployments(requests, make, deployments, ranks, OUTER[outer](), ROUTERS[inner], engine=engine,
                            client_side=side) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].meta["data_parallel"] == runs[1].meta["data_parallel"]
    assert runs[0].meta["events"] <= runs[1].meta["events"]
    n = deployments * ranks
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * n, kv_blocks=blocks * n)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(5, 24), st.integers(2, 3), st.integers(0, 5), st.sampled_from([None, 15.0]))
def test_closed_loops_over_deployments_agree_and_conserve(clients, num_requests, deployments, seed, timeout):
    """Clients send their next request when the last is answered (or they gave up on it)."""
    make_workload = small_closed_loop(clients, num_requests)
    side = client_side(timeout, 0.5) if timeout is not None else None
    runs = []
    for engine in ENGINES:
        workload = make_workload()
        runs.append(run_deployments(workload.requests(seed), rank(48), deployments, 2, LeastOutstandingRouter(),
                                    ROUTERS["fresh"], engine=engine, workload=workload, client_side=side))
    compare_runs(*runs, rel=1e-12)
    assert runs[0].requests["id"].size == num_requests and runs[0].requests["rejected"].sum() == 0
    assert all(kv.num_used_blocks() == 0 for run in runs for kv in run.meta["kvs"])


def fixed_power(cost):
    """300 W while a rank's GPU computes, 40 W otherwise."""
    return FixedActivePowerModel(FixedActiveConfig(), 1, active_w=300.0, standby_w=40.0, idle_w=40.0)


@SETTINGS
@given(requests_lists(min_size=3, max_size=18, max_prompt=48, max_output=30, max_arrival_ms=300.0, all_at_zero=False),
       st.integers(2, 3), st.integers(1, 3), st.sampled_from([1, 2]), st.sampled_from([4.0, 16.0, 50.0]),
       st.sampled_from([0.0, 8.0, 40.0]), st.sampled_from(sorted(OUTER)), st.booleans(), st.data())
def test_both_engines_scale_deployments_alike_and_conserve_requests(requests, n, low, target, interval, cold, outer,
                                                                   metered, data):
    """An autoscaled fleet of deployments (queue length per deployment, random ticks and cold
    starts), sometimes metered: both engines alike; every request served by a deployment that
    was on and warm at its arrival and that stayed on until it finished; each deployment paid
    for its 2 ranks; with power, its ranks draw nothing while it is off."""
    low = min(low, n)
    limits = ScalingLimits(low, n, data.draw(st.integers(low, n)), interval_ms=interval, cold_start_ms=cold,
                           window_ms=100.0)
    policy = QueueLength(QueueLengthConfig(target_per_instance=target, min_instances=low))
    blocks = blocks_for_largest(requests, 4) + data.draw(st.integers(0, 20))
    cost = data.draw(dyadic_linear_costs())

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=3, max_num_batched_tokens=32, allocation="grow",
                                                     chunked_prefill=True)),
                LinearParallelCost(LinearCostModel(cost)), PagedKVCache(blocks, 4))

    fast, ref = (run_deployments(requests, make, n, 2, OUTER[outer](), ROUTERS["fresh"], engine=engine,
                                 autoscaler=copy.deepcopy(policy), limits=limits,
                                 power=fixed_power if metered else None) for engine in ENGINES)
    compare_runs(fast, ref, rel=1e-12)
    a, b = fast.meta["scaling"], ref.meta["scaling"]
    assert a["history"] == b["history"] and a["intervals"] == b["intervals"]
    check_run(fast, requests)
    req = fast.requests
    for i in range(req["id"].size):
        home = on_at(a["intervals"], int(req["instance"][i]) // 2, float(req["arrival_ms"][i]))
        assert home is not None, i
        assert home[0] == 0.0 or req["arrival_ms"][i] >= home[0] + cold
        assert req["finish_ms"][i] <= home[1]
    assert a["gpu_hours"] == pytest.approx(2 * sum(off - on for _, on, off in a["intervals"]) / HOUR_MS)
    if not metered:
        return
    for run in (fast, ref):
        check_energy(run, shared=False)  # (dummy batches' energy belongs to no request)
        for k, inst in enumerate(run.meta["energy"]["instances"]):  # a rank is on while its deployment is paid
            paid = sum(off - on for d, on, off in a["intervals"] if d == k // 2)
            assert inst.get("on_ms", paid) == pytest.approx(paid, rel=1e-12, abs=1e-9), k
    assert fast.metrics["energy"]["gpu_j"] == pytest.approx(ref.metrics["energy"]["gpu_j"], rel=1e-9)


# -- TOML ---------------------------------------------------------------------------------------------------------


def write(tmp_path, text: str):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE).replace("num_requests = 40", "num_requests = 60") + textwrap.dedent(text))
    return path


@pytest.mark.parametrize("speculative", ["", SPECULATIVE])
def test_deployments_in_toml_run_in_both_engines_and_count_their_gpus(tmp_path, speculative):
    """(With ``[speculative]`` too: every rank drafts and verifies its own sequences.)"""
    path = write(tmp_path, speculative + """
        [cluster]
        data_parallel = 2
        expert_parallel = true
        instances = 3
        rank_router = {kind = "round_robin"}
    """)
    fast = fast_run_agreeing_with_reference(path)
    assert fast.metrics["gpus"] == 6 and fast.meta["instances"] == 6
    dp = fast.meta["data_parallel"]
    assert (dp["deployments"], dp["ranks"]) == (3, 2) and len(dp["per_deployment"]) == 3
    assert dp["steps"] == sum(d["steps"] for d in dp["per_deployment"]) and all(
        d["steps"] > 0 for d in dp["per_deployment"])
    # the default router takes turns over the deployments, each deployment's over its ranks
    placed = fast.requests["instance"][np.argsort(fast.requests["id"])]
    assert (placed // 2).tolist() == [i % 3 for i in range(60)]
    assert (placed % 2).tolist() == [(i // 3) % 2 for i in range(60)]
    assert set(fast.metrics["per_instance"]) == {str(i) for i in range(6)}
    assert bool(fast.metrics.get("speculative", {}).get("drafts")) == bool(speculative)


def test_deployments_in_toml_are_metered_and_clocked_rank_by_rank(tmp_path):
    """Every rank is metered (its dummy batches too); a locked lower clock slows the steps and
    saves energy, as on one deployment (H100s: a clock range)."""
    runs = {}
    for name, clock in (("full", ""), ("half", "[clock]\nmhz = 1000\n")):
        path = tmp_path / f"{name}.toml"
        text = write(tmp_path, """
            [cluster]
            data_parallel = 2
            expert_parallel = true
            instances = 2
            router = {kind = "least_outstanding"}
            [power]
            kind = "utilisation"
        """).read_text()
        on_h100 = text.replace("rtx-pro-6000-server", "h100-80gb")
        path.write_text(on_h100.replace('name = "dp"', 'name = "dp"\ntimeline = true') + clock)
        runs[name] = fast_run_agreeing_with_reference(path)
    for run in runs.values():
        assert len(run.meta["energy"]["instances"]) == 4
        assert {int(i) // 2 for i in run.metrics["energy"]["per_instance"]} == {0, 1}
        check_energy(run)
    assert runs["half"].metrics["energy"]["gpu_j"] < runs["full"].metrics["energy"]["gpu_j"]
    # the first request's prompt, alone on its deployment, is compute-bound: later at the lower clock
    assert by_id(runs["half"], "first_token_ms")[0] > by_id(runs["full"], "first_token_ms")[0]


def test_a_toml_fleet_of_deployments_scales_and_pays_for_every_rank(tmp_path):
    path = write(tmp_path, """
        [cluster]
        data_parallel = 2
        expert_parallel = true
        instances = 3
        router = {kind = "least_outstanding"}
        autoscaler = {kind = "queue_length", target_per_instance = 3, cold_start_s = 0.2, interval_s = 0.1}
        [power]
        kind = "utilisation"
    """)
    fast = fast_run_agreeing_with_reference(path)
    scaling = fast.meta["scaling"]
    assert fast.metrics["fleet"]["scale_ups"] > 0
    paid_ms = sum(off - on for _, on, off in scaling["intervals"])
    assert {d for d, _, _ in scaling["intervals"]} <= {0, 1, 2}
    assert fast.metrics["gpu_hours"] == pytest.approx(2 * paid_ms / HOUR_MS) == scaling["gpu_hours"]
    assert fast.metrics["finished"] == 60
    for k, inst in enumerate(fast.meta["energy"]["instances"]):
        paid = sum(off - on for d, on, off in scaling["intervals"] if d == k // 2)
        start, end = fast.meta["energy"]["window_ms"]
        assert inst.get("on_ms", end - start) == pytest.approx(paid, rel=1e-12)


def test_one_deployment_with_instances_1_or_rank_router_is_the_deployment_as_before(tmp_path):
    """``instances = 1`` and ``rank_router`` in place of ``router`` name the same single deployment."""
    path = write(tmp_path, """
        [cluster]
        data_parallel = 2
        expert_parallel = true
        [[runs]]
        name = "before"
        [[runs]]
        name = "one"
        cluster = {instances = 1, rank_router = {kind = "vllm_dp"}}
        [[runs]]
        name = "rr"
        cluster = {rank_router = {kind = "round_robin"}}
        [[runs]]
        name = "rr_before"
        cluster = {router = {kind = "round_robin"}}
    """)
    runs = {r.name: r for r in run_experiment(load(path)).all_runs()}
    assert "deployments" not in runs["one"].meta["data_parallel"]
    np.testing.assert_array_equal(runs["one"].requests["finish_ms"], runs["before"].requests["finish_ms"])
    np.testing.assert_array_equal(runs["rr"].requests["finish_ms"], runs["rr_before"].requests["finish_ms"])
    assert not np.array_equal(runs["rr"].requests["instance"], runs["before"].requests["instance"])


def test_a_dense_models_deployments_are_independent_instances(tmp_path):
    """A dense model's ranks do not step together: 2 deployments of 2 ranks are 4 instances
    behind vLLM's DP balancer, as ``instances = 4`` behind it."""
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE.replace("qwen3-30b-a3b", "llama-3.1-8b")) + textwrap.dedent("""
        [[runs]]
        name = "dp"
        cluster = {data_parallel = 2, instances = 2}
        [[runs]]
        name = "instances"
        cluster = {instances = 4, router = {kind = "vllm_dp"}}
    """))
    runs = {r.name: r for r in run_experiment(load(path)).all_runs()}
    assert "data_parallel" not in runs["dp"].meta and runs["dp"].metrics["gpus"] == 4
    np.testing.assert_array_equal(runs["dp"].requests["finish_ms"], runs["instances"].requests["finish_ms"])
    assert len(set(runs["dp"].requests["instance"].tolist())) == 4


@pytest.mark.parametrize("cluster, message", [
    ("rank_router = {kind = 'round_robin'}", r"\[cluster\]: rank_router: picks a data-parallel rank: set "
                                             r"data_parallel > 1"),
    ("data_parallel = 2\nrouter = {kind = 'round_robin'}\nrank_router = {kind = 'round_robin'}",
     r"\[cluster\]: rank_router: one deployment's router is the rank's: give router or rank_router, not both"),
    ("data_parallel = 2\ninstances = 2\nrank_router = {kind = 'nope'}", r"\[cluster.rank_router\].*nope"),
    ("data_parallel = 2\ninstances = 2\nrank_router = 3", r"\[cluster\].*rank_router"),
])
def test_rank_router_mistakes_name_the_file_table_and_key(tmp_path, cluster, message):
    path = write(tmp_path, "[cluster]\n" + cluster + "\n[[runs]]\nname = 'x'\n")
    with pytest.raises(ConfigError, match=r"exp\.toml.*" + message):
        run_experiment(load(path))


def test_a_dense_models_ranks_take_no_rank_router_and_do_not_scale(tmp_path):
    dense = BASE.replace("qwen3-30b-a3b", "llama-3.1-8b")
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(dense) + "[cluster]\ndata_parallel = 2\ninstances = 2\n"
                    "rank_router = {kind = 'round_robin'}\n")
    with pytest.raises(ConfigError, match=r"exp\.toml.*\[cluster\]: rank_router: a dense model's data-parallel ranks "
                                          r"do not step together: its 4 ranks are independent instances"):
        load(path)
    path.write_text(textwrap.dedent(dense) + "[cluster]\ndata_parallel = 2\ninstances = 2\n"
                    "autoscaler = {kind = 'queue_length'}\n")
    with pytest.raises(ConfigError, match=r"exp\.toml.*\[cluster.autoscaler\]: autoscaling a dense model's "
                                          r"data-parallel ranks \(independent instances\) is not modelled"):
        load(path)
    # review multigpu82: the ranks' sync pacing did nothing there (the same run with and without)
    for key in ("dp_sync_interval = 4", "dp_sync_first_step = false"):
        path.write_text(textwrap.dedent(dense) + f"[cluster]\ndata_parallel = 2\n{key}\n")
        with pytest.raises(ConfigError, match=r"exp\.toml.*\[cluster\]: " + key.split()[0] + r": paces data-parallel "
                                              r"ranks stepping together, and a dense model's 2 ranks are independent"):
            load(path)


def test_an_autoscaler_must_count_the_deployments(tmp_path):
    path = write(tmp_path, "[cluster]\ndata_parallel = 2\nexpert_parallel = true\ninstances = 2\n"
                           "autoscaler = {kind = 'queue_length', max_instances = 4}\n")
    with pytest.raises(ConfigError, match=r"\[cluster.autoscaler\]: max_instances \(4\) must equal \[cluster\] "
                                          r"instances \(2\)"):
        load(path)
