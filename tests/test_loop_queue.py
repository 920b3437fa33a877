"""When the engine's loop takes a request (``taken_ms``) and the queue time vLLM and SGLang report (``loop_queue_ms``).

vLLM's ``vllm:request_queue_time_seconds`` runs from ``queued_ts`` -- stamped when the engine
core's busy loop hands the request to its scheduler, at the top of an iteration, between two
steps -- to its first scheduling (:mod:`schedlab.engine.taking`). The hand-computed cases below
use the ``linear`` cost model's seed costs (0.05 ms per prompt token, 8 ms per decode step;
prompts of 10 tokens: a prefill of 0.5 ms); every expected number is worked out in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.model import Request
from schedlab.results.metric_names import check_metric_name
from schedlab.targets import Summary, check_statistic_names, read_summary, simulated
from schedlab.testing import check_run, dyadic_linear_costs, examples, requests_lists, run_disaggregated, run_engine
from schedlab.testing.parallel import LinearParallelCost, run_data_parallel, run_pipelined
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.routers import RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

ENGINES = ("fast", "reference")
SETTINGS = settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def one_slot(async_scheduling: bool = False) -> ContinuousScheduler:
    return ContinuousScheduler(ContinuousConfig(max_num_seqs=1, async_scheduling=async_scheduling))


# -- hand-computed ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_arriving_mid_step_is_taken_at_the_step_end(engine):
    # One slot. Request 0 (arrives 0, 3 tokens): prefill 0..0.5, decodes end at 8.5 and 16.5.
    # Request 1 arrives at 5, in the decode step 0.5..8.5: the loop takes it at 8.5 (the next plan,
    #   which has no slot for it); it is first scheduled at 16.5, when request 0 has left.
    # Request 2 arrives at 100 at an idle engine: taken at once, scheduled at once.
    reqs = [Request(0, 0.0, 10, 3), Request(1, 5.0, 10, 2), Request(2, 100.0, 10, 1)]
    r = run_engine(reqs, one_slot(), engine=engine)
    assert by_id(r, "taken_ms") == {0: 0.0, 1: 8.5, 2: 100.0}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 16.5, 2: 100.0}
    m = r.metrics
    assert m["loop_queue_ms"]["max"] == 8.0                         # 16.5 - 8.5
    assert m["loop_queue_ms"]["mean"] == pytest.approx(8.0 / 3)
    assert m["queue_ms"]["max"] == 11.5                             # 16.5 - 5: from the arrival, unchanged
    assert m["queue_ms"]["mean"] == pytest.approx(11.5 / 3)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_arrival_inside_a_bulk_decode_run_is_taken_at_the_next_step_boundary(engine):
    # One slot. Request 0 (20 tokens): prefill 0..0.5, then 19 decode steps of 8 ms, ending at
    #   0.5 + 8k -- the fast engine runs them as one bulk run, which the arrival cuts.
    # Request 1 arrives at 50, in the step 48.5..56.5: taken at 56.5; scheduled when request 0
    #   finishes, at 0.5 + 19 x 8 = 152.5: loop queue 96 ms, queue 102.5 ms.
    reqs = [Request(0, 0.0, 10, 20), Request(1, 50.0, 10, 2)]
    r = run_engine(reqs, one_slot(), engine=engine)
    assert by_id(r, "taken_ms") == {0: 0.0, 1: 56.5}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 152.5}
    assert r.metrics["loop_queue_ms"]["max"] == 96.0
    assert r.metrics["queue_ms"]["max"] == 102.5
    if engine == "fast":  # (the decode steps did run in bulk)
        assert r.meta["events"] < r.metrics["iterations"]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_arrival_at_a_step_boundary_is_taken_then(engine):
    # Request 1 arrives at 8.5, just as the step 0.5..8.5 ends: the plan made then takes it.
    reqs = [Request(0, 0.0, 10, 3), Request(1, 8.5, 10, 2)]
    r = run_engine(reqs, one_slot(), engine=engine)
    assert by_id(r, "taken_ms") == {0: 0.0, 1: 8.5}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 16.5}


@pytest.mark.parametrize("engine", ENGINES)
def test_planning_ahead_takes_a_request_when_the_plan_after_its_arrival_is_made(engine):
    # async_scheduling: the plan of each batch is made when the batch before it starts.
    # Request 0 (3 tokens): prefill 0..0.5 (planned at 0), decodes 0.5..8.5 (planned at 0) and
    #   8.5..16.5 (planned at 0.5).
    # Request 1 arrives at 5, after the plan made at 0.5: the next plan, made at 8.5 (the start of
    #   request 0's last step), takes it -- but request 0 still holds the one slot, so that plan is
    #   empty, and the engine plans again at 16.5, once that batch is back: scheduled at 16.5.
    # Request 2 at 100 (idle): taken and scheduled at once. Request 3 arrives at 100.25, in request 2's
    #   prefill 100..100.5 (its only token: the plan made ahead at 100 is empty, the next is made at
    #   100.5): taken and scheduled at 100.5.
    reqs = [Request(0, 0.0, 10, 3), Request(1, 5.0, 10, 2), Request(2, 100.0, 10, 1), Request(3, 100.25, 10, 1)]
    r = run_engine(reqs, one_slot(async_scheduling=True), engine=engine)
    assert by_id(r, "taken_ms") == {0: 0.0, 1: 8.5, 2: 100.0, 3: 100.5}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 16.5, 2: 100.0, 3: 100.5}
    assert r.metrics["loop_queue_ms"]["max"] == 8.0
    assert r.metrics["queue_ms"]["max"] == 11.5


def dp_rank():
    """A data-parallel rank: the ``linear`` model's 0.5 ms per prompt token and 8 ms per decode
    step as its part; experts 1 ms + 0.0625 ms per token of all ranks + 0.125 ms per token of the
    largest rank; an idle rank runs a dummy batch (one decode, 8 ms)."""
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                         allocation="grow", chunked_prefill=True))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)))
        return scheduler, cost, PagedKVCache(64, 16)
    return make


@pytest.mark.parametrize("engine", ENGINES)
def test_an_idle_data_parallel_rank_takes_a_request_at_the_lockstep_boundary(engine):
    # Two ranks stepping together ([cluster] data_parallel = 2), requests dealt round-robin.
    # Step 1: rank 0 prefills request 0 (16 tokens, 8 ms), rank 1 a dummy batch (8 ms); experts of
    #   (16, 1) tokens: 1 + 0.0625 x 17 + 0.125 x 16 = 4.0625 -> the step ends at 12.0625.
    # Request 1 reaches rank 1 at 5, in that step: rank 1's loop takes it at 12.0625 and schedules
    #   it then (loop queue 0, queue 7.0625).
    # Request 2 reaches rank 0 at 100, every rank idle: taken at once.
    reqs = [Request(0, 0.0, 16, 2), Request(1, 5.0, 16, 1), Request(2, 100.0, 16, 1)]
    r = run_data_parallel(reqs, dp_rank(), 2, RoundRobinRouter(), engine=engine)
    assert by_id(r, "instance") == {0: 0, 1: 1, 2: 0}
    assert by_id(r, "taken_ms") == {0: 0.0, 1: 12.0625, 2: 100.0}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 12.0625, 2: 100.0}
    assert r.metrics["loop_queue_ms"]["max"] == 0.0
    assert r.metrics["queue_ms"]["max"] == 7.0625


def disagg_pool(num_blocks: int = 16):
    """A prefill or decode instance: 0.5 ms a prompt token, 8 ms a decode step, 16-token blocks of 16 MiB."""
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                         allocation="grow"))
        cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0))
        return scheduler, cost, PagedKVCache(num_blocks, 16, bytes_per_block=16 * 2**20)
    return make


@pytest.mark.parametrize("engine", ENGINES)
def test_a_disaggregated_request_keeps_the_prefill_instances_taking(engine):
    # Request 0 (prompt 64) prefills 0..32 on the prefill instance. Request 1 (prompt 16) reaches it at
    #   10: taken there at 32, the end of that step, and prefilled 32..40. The rows are written by the
    #   decode instance, which received each prompt's KV later: the taking is the prefill instance's.
    reqs = [Request(0, 0.0, 64, 3), Request(1, 10.0, 16, 2)]
    r = run_disaggregated(reqs, disagg_pool(), disagg_pool(), engine=engine, bandwidth_gbps=16 * 2**20 / 1e6,
                          latency_ms=0.5)
    assert by_id(r, "instance") == {0: 1, 1: 1}    # (the decode instance's rows)
    assert by_id(r, "taken_ms") == {0: 0.0, 1: 32.0}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 32.0}
    assert r.metrics["queue_ms"]["max"] == 22.0
    assert r.metrics["loop_queue_ms"]["max"] == 0.0


def test_a_request_turned_away_on_arrival_is_never_taken():
    # A prompt longer than the cache holds (2 blocks of 16): rejected on arrival, its taken_ms -1.
    reqs = [Request(0, 0.0, 10, 2), Request(1, 1.0, 100, 2)]
    r = run_engine(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=2)), kv_blocks=2)
    assert by_id(r, "rejected") == {0: 0, 1: 1}
    assert by_id(r, "taken_ms") == {0: 0.0, 1: -1.0}
    assert r.metrics["loop_queue_ms"]["max"] == 0.0


# -- both engines, random workloads -------------------------------------------------------------------------------


def check_taken(result) -> None:
    """arrival <= taken <= first scheduled for every scheduled request, and loop_queue_ms is its summary."""
    req = result.requests
    scheduled = req["first_scheduled_ms"] >= 0
    arrival, taken, first = (req[c][scheduled] for c in ("arrival_ms", "taken_ms", "first_scheduled_ms"))
    bad = np.flatnonzero(~((arrival <= taken) & (taken <= first)))
    assert not bad.size, (f"request {int(req['id'][scheduled][bad[0]])}: arrival {arrival[bad[0]]}, taken "
                          f"{taken[bad[0]]}, first scheduled {first[bad[0]]}")
    done = (req["rejected"] == 0) & (req["timed_out"] == 0)
    loop = req["first_scheduled_ms"][done] - req["taken_ms"][done]
    if loop.size:
        assert result.metrics["loop_queue_ms"]["max"] == pytest.approx(loop.max())
        assert result.metrics["loop_queue_ms"]["mean"] == pytest.approx(loop.mean())


def assert_same_taking(fast, ref) -> None:
    for column in ("id", "taken_ms", "first_scheduled_ms"):
        assert by_id(fast, column) == by_id(ref, column), column


@st.composite
def instance_setups(draw):
    """One instance: few slots (requests wait while others decode), long outputs (bulk decode
    runs with arrivals inside them), sometimes planning ahead."""
    requests = draw(requests_lists(min_size=2, max_size=10, max_prompt=48, max_output=120, all_at_zero=False,
                                   max_arrival_ms=400.0))
    cfg = ContinuousConfig(max_num_seqs=draw(st.integers(1, 4)), max_num_batched_tokens=draw(st.integers(16, 96)),
                           chunked_prefill=draw(st.booleans()), allocation="grow",
                           async_scheduling=draw(st.booleans()))
    return requests, cfg, draw(dyadic_linear_costs()), draw(st.integers(8, 80))


@SETTINGS
@given(instance_setups())
def test_fast_and_reference_engines_take_every_request_at_the_same_time(setup):
    requests, cfg, cost, blocks = setup

    def run(engine):
        return run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(cost), PagedKVCache(blocks, 4),
                          engine=engine)

    fast, ref = run("fast"), run("reference")
    assert_same_taking(fast, ref)
    check_taken(fast)
    check_run(fast, requests)


def dp_or_pp_rank(cfg: ContinuousConfig, cost: LinearConfig, *, stages: int = 1):
    def make():
        return (ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), stages=stages, moe=stages == 1),
                PagedKVCache(96, 4))
    return make


@st.composite
def parallel_setups(draw):
    requests = draw(requests_lists(min_size=2, max_size=10, max_prompt=32, max_output=60, all_at_zero=False,
                                   max_arrival_ms=300.0))
    cfg = ContinuousConfig(max_num_seqs=draw(st.integers(1, 4)), max_num_batched_tokens=64, allocation="grow",
                           chunked_prefill=True, async_scheduling=draw(st.booleans()))
    return requests, cfg, draw(dyadic_linear_costs())


@SETTINGS
@given(parallel_setups())
def test_data_parallel_ranks_take_requests_alike_in_both_engines(setup):
    requests, cfg, cost = setup
    fast, ref = (run_data_parallel(requests, dp_or_pp_rank(cfg, cost), 2, RoundRobinRouter(), engine=engine)
                 for engine in ENGINES)
    assert_same_taking(fast, ref)
    check_taken(fast)


@SETTINGS
@given(parallel_setups())
def test_pipelined_instances_take_requests_alike_in_both_engines(setup):
    requests, cfg, cost = setup
    fast, ref = (run_pipelined(requests, dp_or_pp_rank(cfg, cost, stages=2), 2, engine=engine) for engine in ENGINES)
    assert_same_taking(fast, ref)
    check_taken(fast)


# -- what vLLM's and SGLang's histograms are read as ---------------------------------------------------------------


def scrape(name: str, seconds: list[float]) -> str:
    """A Prometheus histogram ``name`` holding ``seconds``, with buckets 0.005, 0.01, 0.1, 1, +Inf."""
    bounds = [0.005, 0.01, 0.1, 1.0, math.inf]
    lines = [f"# TYPE {name} histogram"]
    for bound in bounds:
        le = "+Inf" if bound == math.inf else repr(bound)
        lines.append(f'{name}_bucket{{le="{le}"}} {sum(s <= bound for s in seconds)}')
    lines += [f"{name}_sum {sum(seconds)!r}", f"{name}_count {len(seconds)}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", ["vllm:request_queue_time_seconds", "sglang:queue_time_seconds"])
def test_vllm_and_sglang_queue_histograms_are_read_as_loop_queue_ms(tmp_path, name):
    path = tmp_path / "metrics.txt"
    text = scrape(name, [0.002, 0.004, 0.05])
    if name.startswith("sglang"):  # (a scrape of SGLang's is recognised by its own histograms)
        text += scrape("sglang:e2e_request_latency_seconds", [0.5, 0.6, 0.7])
    else:
        text += scrape("vllm:e2e_request_latency_seconds", [0.5, 0.6, 0.7])
    path.write_text(text)
    summary = read_summary(path)
    assert summary.values["loop_queue_ms.mean"] == pytest.approx(56.0 / 3)
    assert not any(key.startswith("queue_ms.") for key in summary.values)


def test_tgi_queue_histogram_stays_queue_ms(tmp_path):
    path = tmp_path / "metrics.txt"
    path.write_text(scrape("tgi_request_queue_duration", [0.002, 0.004, 0.05])
                    + scrape("tgi_request_duration", [0.5, 0.6, 0.7]))
    summary = read_summary(path)
    assert summary.values["queue_ms.mean"] == pytest.approx(56.0 / 3)
    assert not any(key.startswith("loop_queue_ms.") for key in summary.values)


def test_a_scrape_is_compared_with_the_simulated_loop_queue_time(tmp_path):
    # The simulated run of the first hand-computed case: loop queue times 0, 8 and 0 ms; queue
    # times 0, 11.5 and 0 ms. vLLM's histogram is compared with the former.
    reqs = [Request(0, 0.0, 10, 3), Request(1, 5.0, 10, 2), Request(2, 100.0, 10, 1)]
    run = run_engine(reqs, one_slot())
    path = tmp_path / "metrics.txt"
    path.write_text(scrape("vllm:request_queue_time_seconds", [0.0, 0.0, 0.008])
                    + scrape("vllm:e2e_request_latency_seconds", [0.5, 0.6, 0.7]))
    summary = read_summary(path, statistics=["loop_queue_ms.mean"])
    assert isinstance(summary, Summary)
    assert simulated(summary, run)["loop_queue_ms.mean"] == pytest.approx(8.0 / 3)


def test_loop_queue_ms_is_a_metric_name_and_a_statistic():
    for name in ("loop_queue_ms.p99", "per_class.chat.loop_queue_ms.mean", "per_instance.0.loop_queue_ms.max"):
        assert check_metric_name(name) == name
    check_statistic_names(["loop_queue_ms.mean", "loop_queue_ms.p99", "queue_ms.p50"], "statistics")


def test_a_target_asking_a_vllm_scrape_for_queue_ms_is_told_its_name(tmp_path):
    # A [target] naming queue_ms keeps meaning queue_ms (from the arrival): a vLLM scrape holds no such
    # statistic, and the message names the one it holds.
    from schedlab.configs import FieldError
    from schedlab.targets import TargetConfig

    path = tmp_path / "metrics.txt"
    path.write_text(scrape("vllm:request_queue_time_seconds", [0.002, 0.004, 0.05])
                    + scrape("vllm:e2e_request_latency_seconds", [0.5, 0.6, 0.7]))
    with pytest.raises(FieldError, match=r"holds no 'queue_ms.mean'.*name them loop_queue_ms.mean"):
        TargetConfig(path=str(path), statistics=["queue_ms.mean"]).read()
    assert TargetConfig(path=str(path), statistics=["loop_queue_ms.mean"]).read().values == pytest.approx(
        {"loop_queue_ms.mean": 56.0 / 3})
