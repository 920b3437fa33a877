"""Autoscaling a disaggregated cluster's pools: a decode scale-up with a cold start by hand, both
engines alike on random clusters and scaling settings (with conservation), and the TOML.

Hand-computed runs use :mod:`tests.test_disaggregated`'s instances: 0.5 ms per prompt token on
the prefill side, an 8 ms decode step, 16-token blocks of 16 MiB and a link of 16 MiB per ms
plus 0.5 ms.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.engine.pool_scaling import summed_history
from schedlab.engine.scaling import ScalingLimits
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import check_run, compare_runs, dyadic_linear_costs, examples, requests_lists, run_disaggregated
from schedlab_plugins.autoscalers import QueueLength, QueueLengthConfig, TargetUtilization, TargetUtilizationConfig
from schedlab_plugins.routers import LeastKVRouter, LeastOutstandingRouter, RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache

from test_disaggregated import BASE, LATENCY_MS, LINK_GBPS, MIB, by_id, gives_up, pool

ENGINES = ("fast", "reference")


class Script:
    """A policy that answers ``before`` until ``switch_ms``, then ``after``; it keeps what it saw."""

    def __init__(self, before: int, after: int, switch_ms: float):
        self.before, self.after, self.switch_ms = before, after, switch_ms
        self.seen = []

    def decide(self, signals) -> int:
        self.seen.append(signals)
        return self.before if signals.now_ms < self.switch_ms else self.after


# -- by hand ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("first_token", ["prefill", "decode"])
def test_a_decode_scale_up_serves_hand_offs_from_the_end_of_its_cold_start(engine, first_token):
    # One prefill instance (index 0, fixed); decode instances 1 and 2 behind least-outstanding,
    # only 1 serving at first. Ticks every 10 ms; a cold start of 20 ms; the policy asks for 2
    # until 40 ms, then 1. Prompts of 16 tokens take 8 ms to prefill; a pull moves 16 MiB in
    # 1 ms + 0.5 ms. The times below have the first token on the prefill side (first_token =
    # "prefill"); with it on the decode side (vLLM's proxy, the default) everything happens at the
    # same times but that each request's first token comes one decode step after it joins and each
    # finishes one step later: R0 at 89.5, R1 65.5, R2 55.5, R3 73.5 (instance 2 paid to 55.5).
    #   R0 arrives 0, first token 8 -> decode 1 (the only one serving), lands 9.5, joins 9.5,
    #      9 more tokens every 8 ms: finishes 9.5 + 72 = 81.5.
    #   tick 10: 2 wanted -> instance 2 warms, serves from 10 + 20 = 30.
    #   R1 arrives 12, first token 20 -> decode 1 (instance 2 still warming). Instance 1 is in its
    #      step 17.5-25.5: pulls at 25.5, lands 27, joins at the boundary 33.5; 3 more tokens:
    #      41.5, 49.5, 57.5.
    #   R2 arrives 22, first token 30 -> at 30 the autoscaler acts first: instance 2 serves, and
    #      least outstanding (instance 1 holds 2, instance 2 none) sends R2 there. Pulled 30,
    #      lands and joins 31.5; 2 more tokens: 39.5, 47.5.
    #   tick 40: 1 wanted -> instance 2 (the highest index) drains: it keeps R2 until 47.5.
    #   R3 arrives 41, first token 49 -> decode 1, the only one serving; pulled at the boundary
    #      49.5, lands 51, joins 57.5 (R1 finishes there), 1 more token: 65.5.
    # No request arrives after 41 and every hand-off is placed by 49, yet the decode pool's ticks
    # go on while the cluster has work (a controller cannot know no request will come): 50, 60, 70
    # and 80, inside R0's last step (73.5-81.5; to 89.5 a step later). At 50 instance 2 is off
    # (draining at 50 with the first token on the decode side, R2 to 55.5); the window's finishes
    # grow with R2, R1 and R3. Instance 2 was paid from 10 to its last iteration's end, 47.5; the
    # others from 0 to the cluster's end, 81.5.
    requests = [Request(0, 0.0, 16, 10), Request(1, 12.0, 16, 4), Request(2, 22.0, 16, 3), Request(3, 41.0, 16, 2)]
    policy = Script(2, 1, 40.0)
    limits = ScalingLimits(1, 2, 1, interval_ms=10.0, cold_start_ms=20.0, window_ms=1000.0)
    r = run_disaggregated(requests, pool(16), pool(16), prefill_instances=1, decode_instances=2,
                          decode_router=LeastOutstandingRouter(), bandwidth_gbps=LINK_GBPS, latency_ms=LATENCY_MS,
                          engine=engine, autoscalers={"decode": policy}, limits={"decode": limits},
                          first_token=first_token)
    step = 8.0 if first_token == "decode" else 0.0  # (the decode side's one more step)
    assert by_id(r, "instance") == {0: 1, 1: 1, 2: 2, 3: 1}
    assert by_id(r, "kv_ready_ms") == {0: 8.0, 1: 20.0, 2: 30.0, 3: 49.0}
    assert by_id(r, "first_token_ms") == ({0: 8.0, 1: 20.0, 2: 30.0, 3: 49.0} if not step else
                                          {0: 17.5, 1: 41.5, 2: 39.5, 3: 65.5})
    assert by_id(r, "kv_pulled_ms") == {0: 8.0, 1: 25.5, 2: 30.0, 3: 49.5}
    assert by_id(r, "decode_joined_ms") == {0: 9.5, 1: 33.5, 2: 31.5, 3: 57.5}
    assert by_id(r, "finish_ms") == {0: 81.5 + step, 1: 57.5 + step, 2: 47.5 + step, 3: 65.5 + step}
    scaling = r.meta["scaling"]
    decode = scaling["pools"]["decode"]
    assert decode["history"] == [[0.0, 1, 0, 0, 1], [10.0, 1, 1, 0, 2], [20.0, 1, 1, 0, 2], [30.0, 2, 0, 0, 2],
                                 [40.0, 1, 0, 1, 1], [50.0, 1, 0, 1 if step else 0, 1], [60.0, 1, 0, 0, 1],
                                 [70.0, 1, 0, 0, 1], [80.0, 1, 0, 0, 1]]
    assert decode["intervals"] == [[1, 0.0, 81.5 + step], [2, 10.0, 47.5 + step]]
    assert (decode["scale_ups"], decode["scale_downs"]) == (1, 1)
    assert scaling["pools"]["prefill"]["intervals"] == [[0, 0.0, 81.5 + step]]
    assert not scaling["pools"]["prefill"]["autoscaled"]
    assert scaling["gpu_hours"] == pytest.approx((81.5 + 81.5 + 37.5 + 3 * step) / 3.6e6)
    # the decode pool's arrivals are its hand-offs, as placed by each tick (the one at 20 and 30
    # before the hand-off at that very time)
    assert [s.arrivals for s in policy.seen] == [1, 1, 2, 3, 4, 4, 4, 4]
    assert [s.serving for s in policy.seen] == [1, 1, 2, 2, 1, 1, 1, 1]
    assert [s.finished for s in policy.seen] == [0, 0, 0, 0] + ([0, 1, 2, 3] if step else [1, 2, 3, 3])
    check_run(r, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_decode_pools_ticks_go_on_while_a_prompt_is_still_being_computed(engine):
    # One prefill instance (fixed), decode instances 1 and 2, ticks every 10 ms. R0 (30 tokens,
    # a one-token answer) arrives at 0, the last arrival: its prefill runs 0-15 and it ends
    # there (the first token on the prefill side: a one-token answer goes no further). At the tick
    # at 10 it is still upstream and its iteration still running, so a hand-off may yet come and
    # the tick is taken; by 20 it has ended: the ticks stop. (Both
    # engines apply an iteration when it starts; they once read the instance as idle at 10.)
    requests = [Request(0, 0.0, 30, 1)]
    limits = ScalingLimits(1, 2, 1, interval_ms=10.0, cold_start_ms=0.0, window_ms=1000.0)
    r = run_disaggregated(requests, pool(16), pool(16), prefill_instances=1, decode_instances=2,
                          decode_router=RoundRobinRouter(), bandwidth_gbps=LINK_GBPS, latency_ms=LATENCY_MS,
                          engine=engine, autoscalers={"decode": Script(1, 1, 0.0)}, limits={"decode": limits},
                          first_token="prefill")
    assert by_id(r, "finish_ms") == {0: 15.0}
    assert r.meta["scaling"]["pools"]["decode"]["history"] == [[0.0, 1, 0, 0, 1], [10.0, 1, 0, 0, 1]]
    check_run(r, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_draining_prefill_instance_stays_on_until_its_kv_is_pulled(engine):
    # Prefill instances 0 and 1 (round robin over the serving ones), one decode instance (2) of
    # 5 blocks. R0 (prompt 64: 4 blocks, 32 ms, 3 tokens) on 0, R1 (prompt 64, 2 tokens) at 1 ms
    # on 1: first tokens at 32 and 33. The decode instance pulls R0 at 32 (4 ms + 0.5: lands
    # 36.5), decodes 36.5-52.5 in all 5 blocks; R1's 4 blocks fit only when R0 has finished:
    # pulled 52.5, lands and joins 57, finishes 65. The tick at 40 scales the prefill pool to 1:
    # instance 1 drains with nothing left to run but R1's KV not yet pulled, so the tick at 50
    # finds it still draining and the one at 60 off since the landing freed it, at 57. R2 (at 61)
    # goes to instance 0, the only one serving: first token 69, pulled 69, lands 70.5, finishes
    # 78.5 -- the cluster's end, after one more tick at 70. (The first token on the prefill side: on
    # the decode side each request takes one step more there, and R1's KV waits until 60.5.)
    requests = [Request(0, 0.0, 64, 3), Request(1, 1.0, 64, 2), Request(2, 61.0, 16, 2)]
    limits = ScalingLimits(1, 2, 2, interval_ms=10.0, cold_start_ms=0.0, window_ms=1000.0)
    r = run_disaggregated(requests, pool(16), pool(5), prefill_instances=2, decode_instances=1,
                          prefill_router=RoundRobinRouter(), bandwidth_gbps=LINK_GBPS, latency_ms=LATENCY_MS,
                          engine=engine, autoscalers={"prefill": Script(2, 1, 40.0)}, limits={"prefill": limits},
                          first_token="prefill")
    assert by_id(r, "prefill_instance") == {0: 0, 1: 1, 2: 0}
    assert by_id(r, "kv_pulled_ms") == {0: 32.0, 1: 52.5, 2: 69.0}
    assert by_id(r, "kv_landed_ms") == {0: 36.5, 1: 57.0, 2: 70.5}
    assert by_id(r, "finish_ms") == {0: 52.5, 1: 65.0, 2: 78.5}
    prefill = r.meta["scaling"]["pools"]["prefill"]
    assert prefill["history"][4:] == [[40.0, 1, 0, 1, 1], [50.0, 1, 0, 1, 1], [60.0, 1, 0, 0, 1],
                                      [70.0, 1, 0, 0, 1]]
    assert prefill["intervals"] == [[0, 0.0, 78.5], [1, 0.0, 57.0]]
    assert r.meta["scaling"]["pools"]["decode"]["intervals"] == [[2, 0.0, 78.5]]
    check_run(r, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_turned_away_is_a_miss_in_the_prefill_pools_window(engine):
    # Prefill instances 0 and 1 (only 0 serving), one decode instance (2); ticks every 10 ms.
    # R0 (16 tokens, at 0) is prefilled in 8 ms and handed off: met on TTFT (8 <= 40). R1 (at 1)
    # has a 1,600-token prompt, more than the 16 x 16-token cache: turned away on arrival, a miss
    # as in the run's slo.attainment (before: left out, and the window read 1 of 1 met). R2 (at
    # 25) comes after the ticks at 10 and 20; both see 2 arrivals, 2 finishes, 1 met. R2 is handed
    # off at 33 (met) and ends at 50.5: the ticks at 30, 40 and 50 see it arrived, then met.
    requests = [Request(0, 0.0, 16, 2), Request(1, 1.0, 1600, 2), Request(2, 25.0, 16, 2)]
    policy = Script(1, 1, 0.0)
    limits = ScalingLimits(1, 2, 1, interval_ms=10.0, cold_start_ms=0.0, window_ms=1000.0)
    r = run_disaggregated(requests, pool(16), pool(16), prefill_instances=2, decode_instances=1,
                          prefill_router=RoundRobinRouter(), bandwidth_gbps=LINK_GBPS, latency_ms=LATENCY_MS,
                          engine=engine, autoscalers={"prefill": policy}, limits={"prefill": limits},
                          slo={"ttft_ms": 40.0, "tpot_ms": 40.0})
    assert r.metrics["rejected"] == 1
    assert [(s.now_ms, s.arrivals, s.finished, s.slo_met) for s in policy.seen] == [
        (10.0, 2, 2, 1), (20.0, 2, 2, 1), (30.0, 3, 2, 1), (40.0, 3, 3, 2), (50.0, 3, 3, 2)]
    assert policy.seen[0].slo_attainment == 0.5


def test_summed_history_adds_each_pools_latest_entry():
    a = [[0.0, 2, 0, 0, 2], [10.0, 2, 1, 0, 3]]
    b = [[0.0, 1, 0, 0, 1], [5.0, 1, 0, 0, 1], [10.0, 0, 0, 1, 0]]
    assert summed_history([a, b]) == [[0.0, 3, 0, 0, 3], [5.0, 3, 0, 0, 3], [10.0, 2, 1, 1, 3]]


# -- both engines, random clusters ---------------------------------------------------------------------------


def instance_factory(cost, blocks: int, seqs: int, prefix: bool = False):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=64,
                                                         allocation="grow", chunked_prefill=True))
        return scheduler, LinearCostModel(cost), (PrefixKVCache if prefix else PagedKVCache)(
            blocks, 4, bytes_per_block=4 * MIB)
    return make


@st.composite
def scaled_clusters(draw):
    """Pools of 1-3 instances, one or both autoscaled by a built-in policy (random targets,
    ticks, cold starts, windows, stabilisation), clients that may give up, prefix caching or not
    (requests may share a system prompt; an instance that goes off is reset), the first token
    on either side."""
    requests = draw(requests_lists(min_size=4, max_size=24, max_prompt=48, max_output=30, max_arrival_ms=400.0,
                                   all_at_zero=False, prefix_groups=2))
    sizes = {name: draw(st.integers(1, 3)) for name in ("prefill", "decode")}
    scaled = draw(st.sampled_from([("prefill",), ("decode",), ("prefill", "decode")]))
    policies, limits = {}, {}
    for name in scaled:
        sizes[name] = max(2, sizes[name])
        common = dict(min_instances=draw(st.integers(1, sizes[name])), stabilization_s=draw(st.sampled_from([0, 0.02])))
        if draw(st.booleans()):
            policy = QueueLength(QueueLengthConfig(target_per_instance=draw(st.sampled_from([1, 2, 4])),
                                                   signal=draw(st.sampled_from(["waiting", "outstanding"])),
                                                   min_attainment=draw(st.sampled_from([None, 0.9])), **common))
        else:
            policy = TargetUtilization(TargetUtilizationConfig(
                metric=draw(st.sampled_from(["kv_usage", "outstanding"])), target=draw(st.sampled_from([0.25, 1, 2])),
                **common))
        policies[name] = policy
        low = policy.config.min_instances
        limits[name] = ScalingLimits(low, sizes[name], draw(st.integers(low, sizes[name])),
                                     interval_ms=draw(st.sampled_from([4.0, 16.0, 50.0])),
                                     cold_start_ms=draw(st.sampled_from([0.0, 8.0, 40.0])),
                                     window_ms=draw(st.sampled_from([20.0, 100.0])))
    routers = [RoundRobinRouter, LeastOutstandingRouter, LeastKVRouter]
    prefix = draw(st.booleans())
    return dict(
        first_token=draw(st.sampled_from(["decode", "prefill"])),
        requests=requests, sizes=sizes, policies=policies, limits=limits,
        prefill=instance_factory(draw(dyadic_linear_costs()), draw(st.integers(30, 60)), draw(st.integers(1, 4)),
                                 prefix),
        decode=instance_factory(draw(dyadic_linear_costs()), draw(st.integers(30, 60)), draw(st.integers(1, 4)),
                                prefix),
        routers={name: draw(st.sampled_from(routers)) for name in ("prefill", "decode")},
        timeout=draw(st.sampled_from([None, None, 40.0, 120.0])))


def run_case(case, engine, policies=None):
    import copy

    sizes, routers = case["sizes"], case["routers"]
    return run_disaggregated(
        case["requests"], case["prefill"], case["decode"], prefill_instances=sizes["prefill"],
        decode_instances=sizes["decode"],
        prefill_router=routers["prefill"]() if sizes["prefill"] > 1 else None,
        decode_router=routers["decode"]() if sizes["decode"] > 1 else None,
        bandwidth_gbps=LINK_GBPS, latency_ms=0.125, engine=engine, kv_lease_ms=16.0,
        client_side=gives_up(case["timeout"]) if case["timeout"] is not None else None,
        autoscalers=copy.deepcopy(case["policies"]), limits=case["limits"], slo={"ttft_ms": 40.0, "tpot_ms": 8.0},
        first_token=case["first_token"])


def on_at(intervals, instance: int, t: float):
    """The paid interval of ``instance`` holding ``t``, or None."""
    return next(((on, off) for i, on, off in intervals if i == instance and on <= t <= off), None)


@settings(max_examples=examples(50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scaled_clusters())
def test_both_engines_scale_pools_alike_and_conserve_requests(case):
    fast, ref = (run_case(case, engine) for engine in ENGINES)
    compare_runs(fast, ref, rel=0)
    for name in ("prefill", "decode"):
        a, b = fast.meta["scaling"]["pools"][name], ref.meta["scaling"]["pools"][name]
        assert a["history"] == b["history"] and a["intervals"] == b["intervals"], name
    check_run(fast, case["requests"])  # each request once: finished, rejected or aborted
    assert all(kv.num_used_blocks() == 0 for kv in fast.meta["kvs"])
    n_prefill = case["sizes"]["prefill"]
    scaling = fast.meta["scaling"]
    cold = {}
    for name, pool_scaling in scaling["pools"].items():
        limits = case["limits"].get(name)
        cold[name] = limits.cold_start_ms if limits is not None else 0.0
        if limits is None:
            continue
        for _t, serving, warming, _draining, _desired in pool_scaling["history"]:
            assert limits.min_instances <= serving + warming <= limits.max_instances
        assert all(on == 0.0 or on % limits.interval_ms == 0 for _, on, _ in pool_scaling["intervals"])  # at ticks
    req = fast.requests
    for i in range(req["id"].size):
        if req["rejected"][i]:
            continue
        prefill_at = int(req["prefill_instance"][i]) if req["prefill_instance"][i] >= 0 else int(req["instance"][i])
        arrival = float(req["arrival_ms"][i])
        home = on_at(scaling["pools"]["prefill"]["intervals"], prefill_at, arrival)
        assert home is not None, (i, prefill_at, arrival)  # routed to an instance that was on...
        assert home[0] == 0.0 or arrival >= home[0] + cold["prefill"]  # ...and warm
        if req["kv_ready_ms"][i] >= 0:  # its prompt done there (and handed off, or abandoned)
            assert req["kv_ready_ms"][i] <= home[1]
        elif req["first_token_ms"][i] >= 0 and req["instance"][i] < n_prefill:  # answered there
            assert req["first_token_ms"][i] <= home[1]
        if req["kv_landed_ms"][i] >= 0:  # the prefill instance held the KV until it landed
            assert req["kv_landed_ms"][i] <= home[1]
        if req["instance"][i] >= n_prefill:  # handed off: the decode instance was warm when placed
            decode_at, handed = int(req["instance"][i]), float(req["kv_ready_ms"][i])
            there = on_at(scaling["pools"]["decode"]["intervals"], decode_at, handed)
            assert there is not None, (i, decode_at, handed)
            assert there[0] == 0.0 or handed >= there[0] + cold["decode"]
            assert req["finish_ms"][i] <= there[1]
    assert scaling["gpu_hours"] == pytest.approx(sum(off - on for _, on, off in scaling["intervals"]) / 3.6e6)


# -- TOML -------------------------------------------------------------------------------------------------------

#: test_disaggregated's base tables, with more requests in bursts and longer answers
BURSTS = (textwrap.dedent(BASE).replace("num_requests = 40", "num_requests = 300")
          .replace('arrival = "poisson"\nrate = 20', 'arrival = "gamma"\ncv = 3\nrate = 8')
          .replace("high = 60", "high = 120"))
assert "num_requests = 300" in BURSTS and "cv = 3" in BURSTS and "high = 120" in BURSTS
#: Llama-3-8B on A100s, the decode pool at tensor parallel 2 and autoscaled
TOML = """
    [slo]
    ttft_ms = 400
    tpot_ms = 40
    [cluster]
    mode = "disaggregated"
    router = {kind = "least_outstanding"}
    [cluster.prefill]
    instances = 2
    cost_model = {kind = "roofline", model = "llama-3-8b", gpu = "a100-80gb"}
    kv_cache = {kind = "paged", model = "llama-3-8b", gpu = "a100-80gb"}
    [cluster.decode]
    instances = 4
    cost_model = {kind = "roofline", model = "llama-3-8b", gpu = "a100-80gb", tensor_parallel = 2}
    kv_cache = {kind = "paged", model = "llama-3-8b", gpu = "a100-80gb", tensor_parallel = 2}
    autoscaler = {kind = "target_utilization", metric = "outstanding", target = 3, cold_start_s = 2, interval_s = 1,
                  stabilization_s = 2}
    [[runs]]
    name = "fast"
    [[runs]]
    name = "reference"
    engine = "reference"
    """


def toml_runs(tmp_path, text: str = TOML, base: str = BURSTS) -> dict:
    path = tmp_path / "exp.toml"
    path.write_text(base + textwrap.dedent(text))
    return {run.name: run for run in run_experiment(load(path)).all_runs()}


def test_a_toml_run_scales_its_decode_pool_and_reports_each_pool(tmp_path):
    runs = toml_runs(tmp_path)
    fast, ref = runs["fast"], runs["reference"]
    for name in ("prefill", "decode"):  # the roofline's costs are not dyadic: times to 1e-9
        a, b = fast.meta["scaling"]["pools"][name], ref.meta["scaling"]["pools"][name]
        assert a["history"] == b["history"]
        assert [x[0] for x in a["intervals"]] == [x[0] for x in b["intervals"]]
        assert [t for x in a["intervals"] for t in x[1:]] == pytest.approx([t for x in b["intervals"] for t in x[1:]],
                                                                           rel=1e-9)
    for column in ("instance", "prefill_instance"):
        assert fast.requests[column].tolist() == ref.requests[column].tolist(), column
    for column in ("first_token_ms", "finish_ms"):
        assert fast.requests[column] == pytest.approx(ref.requests[column], rel=1e-9), column
    fleet = fast.metrics["fleet"]
    decode = fleet["pools"]["decode"]
    assert decode["scale_ups"] > 0 and decode["scale_downs"] > 0 and decode["min_serving"] == 1
    assert fleet["pools"]["prefill"] == pytest.approx({"gpu_hours": fleet["pools"]["prefill"]["gpu_hours"],
                                                        "mean_gpus": fleet["pools"]["prefill"]["mean_gpus"],
                                                        "peak_serving": 2, "min_serving": 2, "scale_ups": 0,
                                                        "scale_downs": 0})
    # GPU-hours: the prefill pool's 2 GPUs all along, the decode pool's 2 GPUs an instance while paid
    pools = fast.meta["scaling"]["pools"]
    end = fast.meta["scaling"]["end_ms"]
    assert pools["prefill"]["intervals"] == [[0, 0.0, end], [1, 0.0, end]]
    decode_ms = sum(off - on for _, on, off in pools["decode"]["intervals"])
    assert fleet["pools"]["decode"]["gpu_hours"] == pytest.approx(2 * decode_ms / 3.6e6)
    assert fast.metrics["gpu_hours"] == pytest.approx((2 * end + 2 * decode_ms) / 3.6e6)
    assert fleet["gpu_hours"] == fast.metrics["gpu_hours"] < (2 + 2 * 4) * end / 3.6e6  # below the fixed pools'
    assert fleet["scale_ups"] == decode["scale_ups"]
    assert fast.metrics["finished"] == 300


def test_an_autoscaled_pool_is_metered_only_while_paid(tmp_path):
    """With [power], an instance's meter is off outside its paid intervals, in either pool."""
    text = TOML.replace("    [[runs]]", '    [power]\n    kind = "utilisation"\n    gpu = "a100-80gb"\n    [[runs]]', 1)
    text = text.replace("[cluster.prefill]\n    instances = 2",
                        "[cluster.prefill]\n    instances = 2\n    autoscaler = {kind = \"queue_length\", "
                        "target_per_instance = 1, cold_start_s = 1, interval_s = 1, stabilization_s = 0}")
    runs = toml_runs(tmp_path, text)
    fast, ref = runs["fast"], runs["reference"]
    assert fast.metrics["energy"]["gpu_j"] == pytest.approx(ref.metrics["energy"]["gpu_j"], rel=1e-9)
    start, end = fast.meta["energy"]["window_ms"]
    assert start == 0.0
    assert fast.meta["scaling"]["pools"]["prefill"]["scale_downs"] > 0
    for i, inst in enumerate(fast.meta["energy"]["instances"]):
        paid = sorted((on, off) for k, on, off in fast.meta["scaling"]["intervals"] if k == i)
        edges = [start] + [t for interval in paid for t in interval] + [end]
        unpaid = [[a, b] for a, b in zip(edges[::2], edges[1::2]) if b > a]
        off = [[a, b] for a, b in inst.get("off", []) if b > a]
        assert sum(off, []) == pytest.approx(sum(unpaid, []), rel=1e-12), i


BAD = [
    # a cluster-wide autoscaler
    ("[cluster]\n    mode", '[cluster]\n    autoscaler = {kind = "queue_length"}\n    mode',
     r"\[cluster.autoscaler\]: a disaggregated cluster scales each pool on its own"),
    # a pool of one instance
    ("[cluster.decode]\n    instances = 4", "[cluster.decode]\n    instances = 1",
     r"\[cluster.decode.autoscaler\]: autoscaling needs \[cluster.decode\] instances >= 2"),
    # max_instances against the instances built
    ("target = 3,", "target = 3, max_instances = 3,",
     r"\[cluster.decode.autoscaler\]: max_instances \(3\) must equal \[cluster.decode\] instances \(4\)"),
    # an unknown key of the policy
    ("target = 3,", "targt = 3,", r"\[cluster.decode.autoscaler\]: unknown key 'targt'"),
    # an unknown policy
    ('kind = "target_utilization"', 'kind = "hpa"', r"\[cluster.decode.autoscaler\]: .*hpa"),
    # the prefill pool's, checked likewise
    ("[cluster.prefill]\n    instances = 2", "[cluster.prefill]\n    instances = 2\n    autoscaler = "
     "{kind = \"queue_length\", min_instances = 3}", r"\[cluster.prefill.autoscaler\]: .*min_instances"),
    # a router that names instances by number, the pool's own or the cluster's
    ("[cluster.decode]\n    instances = 4", "[cluster.decode]\n    instances = 4\n    router = {kind = \"class\", "
     "classes = {default = [0, 1]}}",
     r"\[cluster.decode.autoscaler\]: not with \[cluster.decode.router\] kind = 'class'"),
    ('router = {kind = "least_outstanding"}', 'router = {kind = "class", classes = {default = [0, 1]}}',
     r"\[cluster.decode.autoscaler\]: not with \[cluster.router\] kind = 'class': its settings name instances"),
]


@pytest.mark.parametrize("old, new, message", BAD)
def test_bad_pool_autoscalers_name_the_file_table_and_key(tmp_path, old, new, message):
    assert old in TOML
    with pytest.raises(ConfigError, match=message) as info:
        toml_runs(tmp_path, TOML.replace(old, new, 1))
    assert "exp.toml" in str(info.value)


def test_a_closed_loop_cannot_scale_a_pool(tmp_path):
    base = BURSTS.replace('kind = "synthetic"', 'kind = "closed_loop"\nclients = 4', 1)
    base = base.replace('arrival = "gamma"\ncv = 3\nrate = 8\n', "think_ms = 10\n")
    with pytest.raises(ConfigError, match=r"\[cluster.decode.autoscaler\]: autoscaling needs an open-loop"):
        toml_runs(tmp_path, base=base)
