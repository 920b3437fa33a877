"""A drain timeout (``[cluster.autoscaler] drain_timeout_s``, :mod:`schedlab.engine.drain`): a
draining instance aborts what it still holds -- running and queued -- at its first plan at or after
its drain's start plus the timeout, and is off then.

By hand, in both engines: a colocated instance (the deadline on an iteration's end, inside one,
and 0 -- abort at once), its energy and GPU-hours stopping then; a timer cancelled by a scale-up
and one that cannot be (it has come at the very tick); a pipelined instance whose batch in flight
lands without the aborted prompt; a data-parallel deployment's ranks. Then both engines alike
on random colocated fleets (vLLM's scheduler synchronous or planning ahead, SGLang's overlap
loop, prefix caches, swap space, clients that give up), pipelined instances and deployments
with binding timeouts; the TOML's property (every request finished, rejected or aborted; the
aborts counted in ``fleet.drain_aborted``); no timeout (the default) leaving a run as it was;
and the config's errors.

Hand-computed colocated runs: the ``linear`` model at 0.5 ms per prompt token and 8 ms per decode
step, one running request per instance (``max_num_seqs = 1``); an 8-token prompt takes 4 ms.
"""

from __future__ import annotations

import copy
import textwrap

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.engine.scaling import ScalingController, ScalingLimits
from schedlab.engine.load import RoutingClock
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.study.experiment import load
from schedlab.testing import (blocks_for_largest, check_energy, check_run, compare_runs, dyadic_linear_costs,
                              examples, fast_run_agreeing_with_reference, requests_lists, run_cluster)
from schedlab.testing.parallel import LinearParallelCost, run_deployments, run_pipelined
from schedlab_plugins.autoscalers import QueueLength, QueueLengthConfig
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.power import FixedActiveConfig, FixedActivePowerModel
from schedlab_plugins.routers import LeastOutstandingRouter, RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.schedulers.sglang import SglangScheduler
from schedlab_plugins.schedulers.tgi import TgiConfig, TgiScheduler

from test_cold_restart import make_cache
from test_data_parallel import rank
from test_data_parallel_deployments import BASE as DP_BASE
from test_disagg_scaling import TOML as DISAGG_TOML, Script, on_at, toml_runs
from test_fleet import FLEET, POLICIES, scaled
from test_pipeline_parallel import client_side, tight
from test_pipeline_scaling import TOML as PIPELINE_TOML
from test_sglang import rejections_for, sglang_configs

ENGINES = ("fast", "reference")
HOUR_MS = 3.6e6


class Phases:
    """A policy that answers by time: ``(until_ms, answer)`` pairs, the last answer after them."""

    def __init__(self, *phases):
        self.phases = phases

    def decide(self, signals) -> int:
        return next((answer for until, answer in self.phases if signals.now_ms < until), self.phases[-1][1])


class Cycle:
    """A policy that answers ``answers`` in turn, one a tick, whatever the load: instances drain
    while busy, and some are taken back before their timeout."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.ticks = 0

    def decide(self, signals) -> int:
        self.ticks += 1
        return self.answers[(self.ticks - 1) % len(self.answers)]


class Newest:
    """Sends every request to the serving instance listed last."""

    def route(self, request, instances):
        return len(instances) - 1


def by_id(run, column):
    return dict(zip(run.requests["id"].tolist(), run.requests[column].tolist()))


def fixed_power(cost):
    """300 W while the instance computes, 40 W otherwise."""
    return FixedActivePowerModel(FixedActiveConfig(), 1, active_w=300.0, standby_w=40.0, idle_w=40.0)


def one_at_a_time():
    return (ContinuousScheduler(ContinuousConfig(max_num_seqs=1, max_num_batched_tokens=512)),
            LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)), PagedKVCache(64, 4))


#: R0 (8 + 10 tokens) and R1 (8 + 2, queued behind it) go to instance 1, the newest serving; R2 and
#: R3 to instance 0 once instance 1 drains (at the tick at 10). R0's tokens: 4, then every 8 ms.
REQUESTS = [Request(0, 0.0, 8, 10), Request(1, 1.0, 8, 2), Request(2, 15.0, 8, 2), Request(3, 45.0, 8, 1)]


def drained(engine, timeout, policy=None, power=None):
    limits = ScalingLimits(1, 2, 2, interval_ms=10.0, cold_start_ms=0.0, window_ms=1000.0, drain_timeout_ms=timeout)
    return run_cluster(REQUESTS, one_at_a_time, 2, Newest(), engine=engine,
                       autoscaler=policy or Phases((10.0, 2), (1e9, 1)), limits=limits, power=power)


# -- by hand ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("timeout, stop", [(26.0, 36.0), (21.0, 36.0), (0.0, 12.0)])
def test_a_draining_instance_aborts_what_it_holds_at_its_timeout_and_is_off_then(engine, timeout, stop):
    # Both instances serve at first; the tick at 10 drains instance 1 (the highest index), holding
    # R0 (running: tokens at 4, 12, 20, 28, 36, ...; 76 without a timeout) and R1 (queued behind
    # it: 80 and 88 without one). Deadline 10 + 26 = 36, an iteration's end: both aborted at 36,
    # R0 with 5 tokens, R1 with none -- its queue is gone -- and the instance is off at 36 (the tick
    # at 40 says so). 10 + 21 = 31 falls in the iteration 28-36: it runs to its end, and the plan
    # at 36 aborts them. 0: the plan after the tick, at 12 (R0's 2nd token), aborts them.
    # R2 (at 15) and R3 (at 45) on instance 0: 19, 27 and 49, 49 -- the run's end.
    r = drained(engine, timeout, power=fixed_power)
    tokens = {36.0: 5, 12.0: 2}[stop]
    assert by_id(r, "instance") == {0: 1, 1: 1, 2: 0, 3: 0}
    assert by_id(r, "first_token_ms") == {0: 4.0, 1: -1.0, 2: 19.0, 3: 49.0}
    assert by_id(r, "finish_ms") == {0: stop, 1: stop, 2: 27.0, 3: 49.0}
    assert by_id(r, "generated_tokens") == {0: tokens, 1: 0, 2: 2, 3: 1}
    # counted as requests whose clients gave up are: failed for their clients, gone when dropped
    assert by_id(r, "aborted") == by_id(r, "timed_out") == {0: 1, 1: 1, 2: 0, 3: 0}
    assert by_id(r, "client_done_ms") == {0: stop, 1: stop, 2: 27.0, 3: 49.0}
    assert (r.metrics["finished"], r.metrics["aborted"], r.metrics["timed_out"], r.metrics["rejected"]) == (2, 2, 2, 0)
    scaling = r.meta["scaling"]
    assert scaling["intervals"] == [[0, 0.0, 49.0], [1, 0.0, stop]]
    assert scaling["gpu_hours"] == (49.0 + stop) / HOUR_MS == r.metrics["fleet"]["gpu_hours"]
    assert scaling["drain_aborted"] == r.metrics["fleet"]["drain_aborted"] == 2
    assert scaling["drains"] == [[1, 10.0, 10.0 + timeout, None]]  # (instance, start, deadline, taken back)
    draining = [[t, 1, 0, 1 if t < stop else 0, 1] for t in (10.0, 20.0, 30.0, 40.0)]
    assert scaling["history"] == [[0.0, 2, 0, 0, 2]] + draining
    # instance 1 computes from 0 to its stop (300 W) and draws nothing after it
    one = r.meta["energy"]["instances"][1]
    assert one["busy_j"] == pytest.approx(0.3 * stop, rel=1e-12) and one["idle_j"] == 0.0
    assert one["off"] == [[stop, 49.0]]
    check_energy(r)
    check_run(r, REQUESTS)  # each request once; every block back


@pytest.mark.parametrize("engine", ENGINES)
def test_without_a_timeout_the_drain_finishes_everything(engine):
    # The same run with no timeout (the default): R0 finishes at 76, R1 then runs, 80 and 88; the
    # instance is paid to its last iteration, and the summary has no drain_aborted.
    r = drained(engine, None)
    assert by_id(r, "finish_ms") == {0: 76.0, 1: 88.0, 2: 27.0, 3: 49.0}
    assert by_id(r, "aborted") == {0: 0, 1: 0, 2: 0, 3: 0} and r.metrics["finished"] == 4
    assert r.meta["scaling"]["intervals"] == [[0, 0.0, 88.0], [1, 0.0, 88.0]]
    assert "drain_aborted" not in r.meta["scaling"] and "drain_aborted" not in r.metrics["fleet"]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_instance_taken_back_before_its_timeout_serves_on(engine):
    # The tick at 20 asks for 2 again: instance 1, draining since 10 with its deadline at 35, is
    # taken back and its timer cancelled -- the run is the one without a timeout, request by request:
    # R0 and R1 finish at 76 and 88, R3 (at 45, the newest serving instance's again) after them, 92.
    policy = Phases((10.0, 2), (20.0, 1), (1e9, 2))
    r, none = drained(engine, 25.0, policy), drained(engine, None, copy.deepcopy(policy))
    assert by_id(r, "finish_ms") == by_id(none, "finish_ms") == {0: 76.0, 1: 88.0, 2: 27.0, 3: 92.0}
    for column in ("instance", "first_token_ms", "generated_tokens", "aborted"):
        assert by_id(r, column) == by_id(none, column), column
    assert r.meta["scaling"]["history"] == none.meta["scaling"]["history"]
    assert r.meta["scaling"]["history"][1:3] == [[10.0, 1, 0, 1, 1], [20.0, 2, 0, 0, 2]]
    assert r.meta["scaling"]["intervals"] == none.meta["scaling"]["intervals"]
    assert r.meta["scaling"]["drain_aborted"] == 0 and r.metrics["aborted"] == 0
    assert r.meta["scaling"]["drains"] == [[1, 10.0, 35.0, 20.0]]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_timer_that_has_come_cannot_be_cancelled(engine):
    # Deadline 10 + 20 = 30, the very tick that asks for 2 again: the autoscaler's events come
    # before the instance's plans, but a draining instance whose time has come is being stopped --
    # not taken back. Nothing is off to warm, so the tick changes nothing; the plan at 36 aborts R0
    # and R1; the tick at 40 finds instance 1 off (since 36) and warms it again, serving at once.
    r = drained(engine, 20.0, Phases((10.0, 2), (30.0, 1), (1e9, 2)))
    assert by_id(r, "finish_ms") == {0: 36.0, 1: 36.0, 2: 27.0, 3: 49.0}
    assert by_id(r, "instance")[3] == 1  # R3 at 45: the newest serving instance, warm again
    scaling = r.meta["scaling"]
    assert scaling["history"][3:] == [[30.0, 1, 0, 1, 2], [40.0, 2, 0, 0, 2]]
    assert scaling["intervals"] == [[0, 0.0, 49.0], [1, 0.0, 36.0], [1, 40.0, 49.0]]
    assert scaling["drain_aborted"] == 2 and scaling["scale_ups"] == 2
    assert scaling["drains"] == [[1, 10.0, 30.0, None]]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_planned_during_the_drain_stops_at_the_deadline(engine):
    # As above (deadline 36), R1's client giving up at 19 (sent at 1, a timeout of 18): its abort,
    # heard at the plan at 20, is its client's, not the drain's. The plan at 20 decodes R0 alone: a
    # run of identical iterations would go on to R0's last token at 76, but stops at the deadline's
    # iteration end, 36, where R0 is aborted.
    requests = [Request(0, 0.0, 8, 10), Request(1, 1.0, 8, 2, timeout_ms=18.0), Request(2, 15.0, 8, 2),
                Request(3, 45.0, 8, 1)]
    limits = ScalingLimits(1, 2, 2, interval_ms=10.0, cold_start_ms=0.0, window_ms=1000.0, drain_timeout_ms=26.0)
    r = run_cluster(requests, one_at_a_time, 2, Newest(), engine=engine, autoscaler=Phases((10.0, 2), (1e9, 1)),
                    limits=limits)
    assert by_id(r, "finish_ms") == {0: 36.0, 1: 20.0, 2: 27.0, 3: 49.0}
    assert by_id(r, "generated_tokens") == {0: 5, 1: 0, 2: 2, 3: 1}
    assert by_id(r, "aborted") == by_id(r, "timed_out") == {0: 1, 1: 1, 2: 0, 3: 0}
    assert r.meta["scaling"]["drain_aborted"] == 1 and r.meta["scaling"]["intervals"] == [[0, 0.0, 49.0], [1, 0.0, 36.0]]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("timeout", [0.0, 4.0])
def test_a_pipeline_aborts_a_prompt_in_flight_and_stays_on_until_its_batch_lands(engine, timeout):
    # tests/test_pipeline_scaling.py's pipeline (2 stages), both instances serving, every request to
    # the newest. A token budget of 16 puts r0's prompt (16 tokens, 1 out) and r1's (16, 2 out) in
    # batches A and B on instance 1, launched at 0: A lands at 9.25 (r0 done), B at 13.25. The tick
    # at 5 drains instance 1; its first launch at or after 5 (+ 0 or 4) is at A's landing, 9.25:
    # r1, its prompt in B, is aborted then; B lands without it at 13.25, when the instance goes off.
    # (Without a timeout r1 gets its tokens at 13.25 and 21.5625, the instance's off time.)
    requests = [Request(0, 0.0, 16, 1), Request(1, 0.0, 16, 2), Request(2, 25.0, 8, 1)]
    limits = ScalingLimits(1, 2, 2, interval_ms=5.0, cold_start_ms=0.0, window_ms=1000.0, drain_timeout_ms=timeout)
    r = run_pipelined(requests, tight(8), 2, 2, Newest(), engine=engine, autoscaler=Script(2, 1, 5.0), limits=limits)
    assert by_id(r, "instance") == {0: 1, 1: 1, 2: 0}
    assert by_id(r, "finish_ms") == {0: 9.25, 1: 9.25, 2: 29.75}
    assert by_id(r, "generated_tokens") == {0: 1, 1: 0, 2: 1} and by_id(r, "aborted") == {0: 0, 1: 1, 2: 0}
    scaling = r.meta["scaling"]
    assert scaling["intervals"] == [[0, 0.0, 29.75], [1, 0.0, 13.25]] and scaling["drain_aborted"] == 1
    assert scaling["gpu_hours"] == 2 * (29.75 + 13.25) / HOUR_MS  # each instance's 2 stages
    check_run(r, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_deployments_ranks_abort_at_their_first_step_after_the_timeout(engine):
    # tests/test_data_parallel_deployments.py's second deployment: on from 10, serving from 30,
    # drained at 40. R1 (at 31, 16 + 4 tokens) on its rank 0: steps 31-43.0625 (first token) and
    # 43.0625-52.3125; the deadline 40 + 5 = 45 falls in the second, and the ranks' step at 52.3125
    # aborts R1 with 2 tokens (70.8125 and 4 without a timeout). The deployment is off then, paid
    # for its 2 ranks.
    requests = [Request(0, 0.0, 16, 2), Request(1, 31.0, 16, 4), Request(2, 45.0, 16, 2), Request(3, 70.0, 16, 2)]
    limits = ScalingLimits(1, 2, 1, interval_ms=10.0, cold_start_ms=20.0, window_ms=1000.0, drain_timeout_ms=5.0)
    r = run_deployments(requests, rank(), 2, 2, Newest(), RoundRobinRouter, engine=engine,
                        autoscaler=Script(2, 1, 40.0), limits=limits)
    assert by_id(r, "instance") == {0: 0, 1: 2, 2: 1, 3: 0}
    assert by_id(r, "finish_ms") == {0: 21.3125, 1: 52.3125, 2: 66.3125, 3: 91.3125}
    assert by_id(r, "generated_tokens")[1] == 2 and by_id(r, "aborted") == {0: 0, 1: 1, 2: 0, 3: 0}
    scaling = r.meta["scaling"]
    assert scaling["intervals"] == [[0, 0.0, 91.3125], [1, 10.0, 52.3125]] and scaling["drain_aborted"] == 1
    assert scaling["gpu_hours"] == 2 * (91.3125 + 42.3125) / HOUR_MS
    check_run(r, requests)


#: Found by the differential test below: a deployment's ranks planning ahead, killed at 100 while
#: a plan made ahead held request 12's prompt (computed for nothing); its client's abort, due at
#: 115.25 during the next step, found it again in the reference engine, which took it for a
#: request aborted in that step and put it back to decoding (a crash at the next abort).
TWICE_ABORTED = [(0.0, 1, 6), (0.125, 1, 5), (55.125, 10, 5), (55.25, 1, 5), (55.25, 19, 5), (55.25, 1, 5), (55.25, 1, 5),
                 (55.25, 19, 30), (55.25, 32, 5), (55.25, 1, 5), (55.25, 29, 5), (55.25, 1, 5), (55.25, 35, 5),
                 (55.25, 1, 5), (55.25, 1, 5), (55.25, 1, 5), (55.25, 1, 5), (55.375, 1, 5), (155.375, 1, 1)]


def test_a_request_aborted_by_a_drain_and_later_by_its_client_is_aborted_once_in_both_engines():
    requests = [Request(i, at, prompt, out) for i, (at, prompt, out) in enumerate(TWICE_ABORTED)]
    blocks = blocks_for_largest(requests, 4) + 11
    cost = LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=8.0)

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=3, max_num_batched_tokens=32, allocation="grow",
                                                     chunked_prefill=True, async_scheduling=True)),
                LinearParallelCost(LinearCostModel(cost)), PagedKVCache(blocks, 4))

    limits = ScalingLimits(1, 2, 2, interval_ms=16.0, cold_start_ms=0.0, window_ms=20.0, drain_timeout_ms=3.0)
    fast, ref = (run_deployments(requests, make, 2, 2, LeastOutstandingRouter(), RoundRobinRouter, engine=engine,
                                 client_side=client_side(60.0), autoscaler=Cycle([2, 1, 2]), limits=limits)
                 for engine in ENGINES)
    assert agree(fast, ref, requests, rel=1e-12, ranks=2, clients_give_up=True) > 0
    assert by_id(fast, "finish_ms")[12] == 100.0 and by_id(fast, "aborted")[12] == 1


def test_a_pipeline_whose_batches_in_flight_lost_every_request_lands_them():
    # Found by the differential test below: 3 stages, one request a batch. At 47.25 instance 2's
    # first batch lands, the drain's deadline (44) has come, and its launch aborts every request
    # it holds -- two still in batches in flight, landing at 48 and 48.125. The driver's next time
    # was 48: the fast engine landed the second batch then, its launch due, and took an instance
    # holding no request for idle although a batch was in the pipeline (a stall at the end).
    arrivals = [0.0] * 5 + [0.125] * 2 + [42.5] * 10 + [42.625]
    requests = [Request(i, at, 33 if i == 8 else 1, 5) for i, at in enumerate(arrivals)] + [Request(18, 142.625, 1, 1)]
    blocks = blocks_for_largest(requests, 4)
    cost = LinearConfig(prefill_ms_per_token=0.125, decode_ms_per_step=4.0, per_seq_ms=0.25)
    config = ContinuousConfig(max_num_seqs=1, max_num_batched_tokens=16, allocation="grow", chunked_prefill=True)

    def make():
        return (ContinuousScheduler(config), LinearParallelCost(LinearCostModel(cost), stages=3, moe=False),
                PagedKVCache(blocks, 4))

    limits = ScalingLimits(1, 3, 3, interval_ms=4.0, cold_start_ms=0.0, window_ms=20.0, drain_timeout_ms=0.0)
    fast, ref = (run_pipelined(requests, make, 3, 3, LeastOutstandingRouter(), engine=engine,
                               autoscaler=Cycle([3, 1, 1]), limits=limits) for engine in ENGINES)
    assert agree(fast, ref, requests, rel=1e-12) > 0
    assert [2, 40.0, 48.125] in fast.meta["scaling"]["intervals"]  # off when its last batch landed


def test_the_controller_refuses_a_negative_timeout_and_instances_that_cannot_abort():
    policy = Script(1, 1, 0.0)
    with pytest.raises(ValueError, match="drain timeout must be >= 0 ms"):
        ScalingController(policy, ScalingLimits(1, 1, 1, 10.0, 0.0, 10.0, drain_timeout_ms=-1.0), [object()],
                          RoutingClock())

    class Plain:  # an instance without drain_by
        pass

    with pytest.raises(ValueError, match="Plain instances cannot abort what they hold at a drain timeout"):
        ScalingController(policy, ScalingLimits(1, 1, 1, 10.0, 0.0, 10.0, drain_timeout_ms=5.0), [Plain()],
                          RoutingClock())


# -- both engines alike -----------------------------------------------------------------------------------------

DRAINS = st.sampled_from([0.0, 3.0, 10.0, 30.0])  # ms: shorter than most requests, so that they bind


def policies(n: int):
    """A queue-length policy that scales down as soon as the queue allows, or one that flaps."""
    return st.one_of(st.sampled_from([1, 2]).map(lambda target: QueueLength(QueueLengthConfig(
        target_per_instance=target, stabilization_s=0.0))),
        st.lists(st.integers(1, n), min_size=2, max_size=6).map(Cycle))


@st.composite
def loads(draw, n: int, prefix_groups: int = 0) -> dict:
    """Bursts of requests of 5-30 tokens out, one more 100 ms after them (the ticks go on until
    then), and how ``n`` instances (all serving at first) scale: ticks of 4 or 16 ms, cold starts
    of 0 or 4 ms, a policy of :func:`policies`, a drain timeout; clients that may give up."""
    requests = draw(requests_lists(min_size=6, max_size=18, max_prompt=48, min_output=5, max_output=30,
                                   max_arrival_ms=300.0, bursts=True, prefix_groups=prefix_groups))
    requests.append(Request(len(requests), requests[-1].arrival_ms + 100.0, 1, 1))
    limits = ScalingLimits(1, n, n, interval_ms=draw(st.sampled_from([4.0, 16.0])),
                           cold_start_ms=draw(st.sampled_from([0.0, 4.0])), window_ms=20.0,
                           drain_timeout_ms=draw(DRAINS))
    return dict(requests=requests, limits=limits, policy=draw(policies(n)), cost=draw(dyadic_linear_costs()),
                timeout=draw(st.sampled_from([None, None, 60.0])))


def agree(fast, ref, requests, *, rel=0.0, ranks=1, clients_give_up=False, **check):
    """Both engines alike (rows, decisions, paid intervals, drain aborts); each run conserves its
    requests (``check``: :func:`check_run`'s); without clients that give up, every aborted request
    is the drain's; each request served by an instance (a deployment of ``ranks``) on at its
    arrival, and gone before that instance went off. Returns the drain aborts."""
    compare_runs(fast, ref, rel=rel)
    a, b = fast.meta["scaling"], ref.meta["scaling"]
    assert a["history"] == b["history"] and a["intervals"] == b["intervals"]
    # one instance's paid intervals never overlap (a drained one planning ahead, still computing an
    # iteration for nothing at a tick, was switched off and warmed again at that tick)
    for k in {j for j, _, _ in a["intervals"]}:
        spans = sorted((on, off) for j, on, off in a["intervals"] if j == k)
        assert all(off <= on for (_, off), (on, _) in zip(spans, spans[1:])), (k, spans)
    assert a["drain_aborted"] == b["drain_aborted"] <= fast.metrics["aborted"]
    if not clients_give_up:
        assert a["drain_aborted"] == fast.metrics["aborted"]
    for run in (fast, ref):
        check_run(run, requests, **check)
    req = fast.requests
    for i in range(req["id"].size):
        if req["rejected"][i]:
            continue
        # (a paid interval holding the arrival and the finish)
        arrival, k = float(req["arrival_ms"][i]), int(req["instance"][i]) // ranks
        assert any(on <= arrival and req["finish_ms"][i] <= off for j, on, off in a["intervals"] if j == k), i
    # a drain not taken back: what it aborted left at or after its deadline, and nothing it held
    # finished after that (its queue too is gone); a client's abort may come before the deadline
    rows = list(zip((req["instance"] // ranks).tolist(), req["arrival_ms"].tolist(), req["finish_ms"].tolist(),
                    req["aborted"].tolist(), req["rejected"].tolist()))
    for k, start, deadline, back in a["drains"]:
        held = [(finish, aborted) for j, arrival, finish, aborted, rejected in rows
                if j == k and arrival <= start < finish and not rejected]
        killed = [finish for finish, aborted in held if aborted and finish >= deadline]
        assert clients_give_up or all(finish >= deadline for finish, aborted in held if aborted), (k, start, held)
        if back is None and killed:
            assert all(finish <= min(killed) for finish, aborted in held if not aborted), (k, start, held)
    return a["drain_aborted"]


@st.composite
def colocated(draw):
    """2-3 instances: vLLM's scheduler (synchronous, or planning ahead) on a paged or prefix cache
    (a host tier, swap space), SGLang's (its overlap loop, running and waiting time limits,
    a queue limit) on its radix tree, or TGI's (chunked prefill or not) on its prefix cache;
    requests sharing two system prompts."""
    n = draw(st.integers(2, 3))
    case = draw(loads(n, prefix_groups=2))
    kind = draw(st.sampled_from(["paged", "prefix", "radix", "sglang", "tgi"]))
    swap = draw(st.sampled_from([0, 8])) if kind in ("paged", "prefix") else 0
    sglang = draw(sglang_configs()) if kind == "sglang" else None
    tgi = TgiConfig(prefill_chunking=draw(st.booleans()), max_batch_prefill_tokens=draw(st.sampled_from([16, 64])),
                    waiting_served_ratio=draw(st.sampled_from([0.0, 1.2]))) if kind == "tgi" else None
    continuous = ContinuousConfig(max_num_seqs=draw(st.sampled_from([1, 1, 2, 4])),  # (queues at the drains)
                                  max_num_batched_tokens=draw(st.sampled_from([16, 64])), allocation="grow",
                                  chunked_prefill=True, preemption="swap" if swap else "recompute",
                                  async_scheduling=not swap and draw(st.booleans()))
    return dict(case, n=n, kind={"sglang": "radix", "tgi": "prefix"}.get(kind, kind), swap=swap, sglang=sglang, tgi=tgi,
                continuous=continuous, host=draw(st.sampled_from([0, 0, 8])) if kind == "prefix" else 0,
                blocks=blocks_for_largest(case["requests"], 4) + draw(st.integers(0, 24)))


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(colocated())
def test_both_engines_abort_colocated_drains_alike(case):
    """Colocated fleets with binding drain timeouts: the same rows, column by column."""
    def run(engine):
        def make():
            scheduler = (SglangScheduler(case["sglang"]) if case["sglang"] is not None
                         else TgiScheduler(case["tgi"]) if case["tgi"] is not None
                         else ContinuousScheduler(case["continuous"]))
            return scheduler, LinearCostModel(case["cost"]), make_cache(case["kind"], case["blocks"], 4,
                                                                        swap=case["swap"], host=case["host"])
        return run_cluster(case["requests"], make, case["n"], LeastOutstandingRouter(), engine=engine,
                           autoscaler=copy.deepcopy(case["policy"]), limits=case["limits"],
                           client_side=client_side(case["timeout"]) if case["timeout"] is not None else None)

    fast, ref = run("fast"), run("reference")
    for column, values in fast.requests.items():
        assert values.tolist() == ref.requests[column].tolist(), column
    agree(fast, ref, case["requests"], rejections=rejections_for(case["sglang"]),
          clients_give_up=case["timeout"] is not None)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 3), st.integers(2, 3), st.booleans(), st.booleans(), st.data())
def test_both_engines_abort_pipelined_drains_alike(n, stages, ahead, prefix, data):
    """2-3 pipelined instances of 2-3 stages, planning ahead or not, vLLM's prefix cache or not."""
    case = data.draw(loads(n, prefix_groups=2))
    config = ContinuousConfig(max_num_seqs=data.draw(st.sampled_from([1, 1, 2, 4])),
                              max_num_batched_tokens=data.draw(st.sampled_from([16, 64])), allocation="grow",
                              chunked_prefill=True, async_scheduling=ahead)
    blocks = blocks_for_largest(case["requests"], 4) + data.draw(st.integers(0, 30))

    def make():
        cost = LinearParallelCost(LinearCostModel(case["cost"]), stages=stages, moe=False)
        return ContinuousScheduler(config), cost, (PrefixKVCache if prefix else PagedKVCache)(blocks, 4)

    fast, ref = (run_pipelined(case["requests"], make, stages, n, LeastOutstandingRouter(), engine=engine,
                               client_side=client_side(case["timeout"]) if case["timeout"] else None,
                               autoscaler=copy.deepcopy(case["policy"]), limits=case["limits"]) for engine in ENGINES)
    agree(fast, ref, case["requests"], rel=1e-12, clients_give_up=bool(case["timeout"]))


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 3), st.booleans(), st.data())
def test_both_engines_abort_the_drains_of_deployments_alike(n, ahead, data):
    """2-3 deployments of 2 ranks stepping together, planning ahead or not."""
    case = data.draw(loads(n))
    blocks = blocks_for_largest(case["requests"], 4) + data.draw(st.integers(0, 20))
    seqs = data.draw(st.sampled_from([1, 2, 3]))

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=32, allocation="grow",
                                                     chunked_prefill=True, async_scheduling=ahead)),
                LinearParallelCost(LinearCostModel(case["cost"])), PagedKVCache(blocks, 4))

    fast, ref = (run_deployments(case["requests"], make, n, 2, LeastOutstandingRouter(), RoundRobinRouter,
                                 engine=engine, client_side=client_side(case["timeout"]) if case["timeout"] else None,
                                 autoscaler=copy.deepcopy(case["policy"]), limits=case["limits"])
                 for engine in ENGINES)
    agree(fast, ref, case["requests"], rel=1e-12, ranks=2, clients_give_up=bool(case["timeout"]))


# -- TOML ---------------------------------------------------------------------------------------------------------


def drain_limit(seconds) -> str:
    return f", drain_timeout_s = {seconds}"


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(["queue", "hpa"]), target=st.sampled_from([1, 2, 4]), cold=st.sampled_from([0.0, 0.5]),
       interval=st.sampled_from([0.25, 1.0]), drain=st.sampled_from([0, 0.05, 0.3]), rate=st.sampled_from([5, 20]),
       seed=st.integers(0, 3))
def test_a_drain_timeout_loses_no_request_and_counts_its_aborts(tmp_path, policy, target, cold, interval, drain,
                                                                rate, seed):
    """As tests/test_fleet.py's autoscaling property, with a drain timeout: every request finished,
    was rejected or was aborted -- the aborted ones all the drain's (no client gives up here),
    counted in fleet.drain_aborted -- served by an instance on and warm at its arrival, gone before
    that instance went off; GPU-hours the paid intervals'."""
    run = scaled(tmp_path, policy, 1, target, cold, interval, 0.0, 300, rate, seed=seed, limit=drain_limit(drain))
    m = run.metrics
    assert m["finished"] + m["rejected"] + m["aborted"] == m["requests"] == 300
    assert m["aborted"] == m["timed_out"] == m["fleet"]["drain_aborted"] == run.meta["scaling"]["drain_aborted"]
    intervals = run.meta["scaling"]["intervals"]
    req = run.requests
    rows = list(zip(req["instance"].tolist(), req["arrival_ms"].tolist(), req["finish_ms"].tolist(),
                    req["aborted"].tolist()))
    for inst, arrival, finish, _ in rows:
        home = on_at(intervals, inst, arrival)
        assert home is not None and (home[0] == 0.0 or arrival >= home[0] + cold * 1e3) and finish <= home[1]
    assert m["gpu_hours"] == pytest.approx(sum(off - on for _, on, off in intervals) / HOUR_MS)
    # every drain's deadline is its start + the timeout; of the requests a drain that was not taken
    # back caught, those still there past its deadline all left at one time -- the plan that aborted
    # them (some may have finished in the iteration that ended then) --, and none was aborted before it
    drains = run.meta["scaling"]["drains"]
    caught = set()
    for inst, start, deadline, back in drains:
        assert deadline == pytest.approx(start + drain * 1e3)
        if back is not None:
            continue
        held = [(finish, aborted) for i, arrival, finish, aborted in rows if i == inst and arrival <= start < finish]
        assert len({finish for finish, _ in held if finish > deadline}) <= 1, (inst, start, held)
        assert all(finish >= deadline for finish, aborted in held if aborted), (inst, start, held)
        caught.update((inst, finish) for finish, aborted in held if aborted)
    assert sum(1 for i, _, finish, aborted in rows if aborted and (i, finish) in caught) == m["aborted"]


def test_vllms_default_abort_fails_requests_a_long_timeout_does_not(tmp_path):
    """The same bursty fleet, both engines alike: drained at once (0 s, vLLM's default
    --shutdown-timeout) it aborts requests; with a timeout no request outlives, the run is the
    one without a timeout, row by row, but for fleet.drain_aborted = 0 in its summary."""
    runs = {drain: {engine: scaled(tmp_path, "hpa", 1, 2, 0.5, 0.25, 0.0, 300, 20, engine=engine, seed=1,
                                   limit=drain_limit(drain) if drain is not None else "")
                    for engine in ENGINES} for drain in (None, 0, 1000)}
    for drain, pair in runs.items():
        compare_runs(pair["fast"], pair["reference"], rel=1e-9)
        assert pair["fast"].meta["scaling"]["history"] == pair["reference"].meta["scaling"]["history"]
    at_once, none, long = (runs[d]["fast"] for d in (0, None, 1000))
    assert at_once.metrics["fleet"]["drain_aborted"] == at_once.metrics["aborted"] > 0
    assert "drain_aborted" not in none.metrics["fleet"] and "drain_aborted" not in none.meta["scaling"]
    assert long.metrics["fleet"].pop("drain_aborted") == 0
    assert long.meta["scaling"].pop("drain_aborted") == 0
    assert len(long.meta["scaling"].pop("drains")) >= long.metrics["fleet"]["scale_downs"] > 0  # (none binding)
    compare_runs(long, none, rel=0)
    for column, values in long.requests.items():
        assert values.tolist() == none.requests[column].tolist(), column
    assert long.meta["scaling"] == none.meta["scaling"]


def test_the_summary_table_says_which_requests_a_drain_aborted(tmp_path):
    from schedlab.study.experiment import run_experiment
    from schedlab_plugins.reports.table import render

    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    table = POLICIES["hpa"] % (1, 2, 0.5, 0.25, 0.0)
    results = run_experiment(load(path, ["workload.num_requests=300", "workload.rate=20", "cluster.instances=5",
                                         "workload.arrival=gamma", "workload.cv=3", "experiment.seed=1",
                                         f"cluster.autoscaler={table[:-1]}{drain_limit(0)}}}"]))
    drained = results.all_runs()[0].metrics["fleet"]["drain_aborted"]
    assert drained > 0
    assert (f"fleet: {drained} requests failed for their clients ({drained} aborted by the autoscaler's drain "
            f"timeout, fleet.drain_aborted; 0 timed out, their clients gave up; {drained} aborted in the engine in "
            "all; in requests.csv)") in render(results)


def test_pipelined_instances_and_deployments_take_a_drain_timeout_from_the_toml(tmp_path):
    path = tmp_path / "pipe.toml"
    path.write_text(PIPELINE_TOML.replace("stabilization_s = 2\n", "stabilization_s = 0\ndrain_timeout_s = 0\n", 1))
    fast = fast_run_agreeing_with_reference(path)
    assert fast.metrics["fleet"]["drain_aborted"] == fast.metrics["aborted"] > 0
    assert fast.metrics["finished"] + fast.metrics["aborted"] == 150
    path = tmp_path / "dp.toml"  # (bursts: the deployments scale down while busy)
    base = textwrap.dedent(DP_BASE).replace("num_requests = 40", "num_requests = 120")
    path.write_text(base.replace("rate = 40", 'rate = 10\narrival = "gamma"\ncv = 3') + textwrap.dedent("""
        [cluster]
        data_parallel = 2
        expert_parallel = true
        instances = 3
        router = {kind = "least_outstanding"}
        autoscaler = {kind = "queue_length", target_per_instance = 2, cold_start_s = 0.1, interval_s = 0.1,
                      stabilization_s = 0, drain_timeout_s = 0}
    """))
    assert 'cv = 3' in path.read_text()
    fast = fast_run_agreeing_with_reference(path)
    assert fast.metrics["fleet"]["drain_aborted"] == fast.metrics["aborted"] > 0
    assert fast.metrics["finished"] + fast.metrics["aborted"] == 120


@pytest.mark.parametrize("value, message", [
    ("-1", r"drain_timeout_s: must be >= 0.0, got -1.0"),
    ('"30"', r"drain_timeout_s: must be a number, got '30' \(str\)"),
    ("true", r"drain_timeout_s: must be a number, got True \(bool\)"),
    ("inf", r"drain_timeout_s: must be a finite number, got inf"),
])
def test_a_bad_drain_timeout_names_the_file_table_and_key(tmp_path, value, message):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    with pytest.raises(ConfigError, match=r"fleet\.toml: \[cluster.autoscaler\]: " + message):
        load(path, [f'cluster.autoscaler={{kind = "queue_length", drain_timeout_s = {value}}}'])


def test_a_disaggregated_pool_refuses_a_drain_timeout_by_name(tmp_path, validated):
    text = DISAGG_TOML.replace("stabilization_s = 2}", "stabilization_s = 2, drain_timeout_s = 30}", 1)
    assert text != DISAGG_TOML
    message = r"exp\.toml: .*\[cluster.decode.autoscaler\]: drain_timeout_s: not modelled for a disaggregated pool"
    with pytest.raises(ConfigError, match=message):
        toml_runs(tmp_path, text)
    from test_disagg_scaling import BURSTS

    code, err, _ = validated(BURSTS + textwrap.dedent(text), "exp.toml")
    assert code != 0 and "[cluster.decode.autoscaler]: drain_timeout_s: not modelled" in err


def test_the_timeout_is_in_the_autoscalers_help():
    from schedlab_plugins.autoscalers import ScalingConfig

    field = attrs.fields_dict(ScalingConfig)["drain_timeout_s"]
    assert field.default is None and "--shutdown-timeout" in field.metadata["help"]
    assert np.isclose(ScalingConfig(drain_timeout_s=30).drain_timeout_s, 30.0)
