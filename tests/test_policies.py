"""Interactive and background work: token-fair scheduling (VTC), length-ordered queues (SJF,
SGLang's LOF), priorities without inversion, and the batching window of seed 004.

Hand-computed scenarios run on both engines (every timestamp is worked out in the comments);
hypothesis checks the fast engine against the reference engine for each policy, VTC's
fairness bound and the priority order.
"""

from __future__ import annotations

import bisect
import itertools

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.configs import from_table
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.results.metrics import client_service, jain_index
from schedlab.testing import (
    blocks_for_largest, check_run, compare_runs, dyadic_linear_costs, examples, requests_lists, run_engine,
)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.schedulers import (ContinuousConfig, ContinuousScheduler, LengthPredictor, StaticConfig,
                                         StaticScheduler, VtcConfig, VtcScheduler)

ENGINES = ("fast", "reference")
COST = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0)
SETTINGS = settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def run(requests, scheduler, engine, *, kv=None, cost=COST, **kw):
    return run_engine(requests, scheduler, LinearCostModel(cost), kv, engine=engine, **kw)


# -- the batching window (seed 004) ------------------------------------------------------------------------

LONE = [Request(0, 0.0, 10, 3)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("make", [
    lambda: StaticScheduler(StaticConfig(batch_size=4, max_wait_ms=10.0)),
    lambda: ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_wait_ms=10.0)),
], ids=["static", "continuous"])
def test_a_lone_request_on_an_idle_server_waits_the_whole_window(engine, make):
    # Seed 004's first-request penalty. Prompt 10 (0.5 ms at the default 0.05 ms/token), 3
    # tokens (two 8 ms decode steps). Without a window: prefill 0..0.5, finish 16.5. With a
    # 10 ms window nobody else comes: the accelerator idles until 10, prefill 10..10.5, and
    # the decode steps end at 18.5 and 26.5.
    r = run_engine(LONE, make(), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 10.0}
    assert by_id(r, "first_token_ms") == {0: 10.5}
    assert by_id(r, "finish_ms") == {0: 26.5}
    assert r.metrics["queue_ms"]["max"] == 10.0
    plain = run_engine(LONE, ContinuousScheduler(ContinuousConfig(max_num_seqs=4)), engine=engine)
    assert by_id(plain, "first_token_ms") == {0: 0.5} and by_id(plain, "finish_ms") == {0: 16.5}


THREE = [Request(i, t, 10, 2) for i, t in enumerate([0.0, 2.0, 5.0])]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_full_batch_opens_the_window_early(engine):
    # Batch of 3, window 20 ms: the third request (t=5) fills the batch, which starts at once:
    # prefill 30 tokens = 1.5 ms -> first tokens at 6.5, one decode step -> 14.5.
    r = run_engine(THREE, StaticScheduler(StaticConfig(batch_size=3, max_wait_ms=20.0)), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 5.0, 1: 5.0, 2: 5.0}
    assert by_id(r, "finish_ms") == {0: 14.5, 1: 14.5, 2: 14.5}


@pytest.mark.parametrize("engine", ENGINES)
def test_an_expired_window_starts_a_partial_batch(engine):
    # Window 4 ms: at t=4 the oldest request (t=0) has waited 4 ms, so requests 0 and 1 start:
    # prefill 20 tokens = 1 ms -> 5, decode -> 13. Request 2 (t=5) waits for the batch to end;
    # at 13 it has waited longer than 4 ms, so it starts at once: 13.5, 21.5.
    r = run_engine(THREE, StaticScheduler(StaticConfig(batch_size=3, max_wait_ms=4.0)), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 4.0, 1: 4.0, 2: 13.0}
    assert by_id(r, "first_token_ms") == {0: 5.0, 1: 5.0, 2: 13.5}
    assert by_id(r, "finish_ms") == {0: 13.0, 1: 13.0, 2: 21.5}


@pytest.mark.parametrize("engine", ENGINES)
def test_min_batch_opens_the_window(engine):
    # min_batch 2 of 4 free slots: the second arrival (t=3) opens the window.
    reqs = [Request(0, 0.0, 10, 2), Request(1, 3.0, 10, 2)]
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_wait_ms=50.0, min_batch=2))
    r = run_engine(reqs, sched, engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 3.0, 1: 3.0}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("interactive_wait, arrival, opens", [(0.0, 3.0, 3.0), (2.0, 1.0, 2.0)])
def test_an_interactive_request_shortens_the_window(engine, interactive_wait, arrival, opens):
    # A background request waits from t=0 in a 20 ms window. An interactive request arrives:
    # the window becomes interactive_wait long (from the oldest arrival, t=0): with 0 it opens
    # at the interactive arrival (3); with 2 ms it opens at 2 (the interactive one came at 1).
    # Both requests start together: the background one rides along.
    reqs = [Request(0, 0.0, 10, 2, request_class="batch"), Request(1, arrival, 10, 2, request_class="interactive")]
    cfg = ContinuousConfig(max_num_seqs=4, max_wait_ms=20.0, interactive_wait_ms=interactive_wait)
    r = run_engine(reqs, ContinuousScheduler(cfg), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: opens, 1: opens}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lone_interactive_request_does_not_wait_in_an_adaptive_window(engine):
    reqs = [Request(0, 0.0, 10, 3, request_class="interactive")]
    r = run_engine(reqs, StaticScheduler(StaticConfig(max_wait_ms=20.0, interactive_wait_ms=0.0)), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0}
    # without interactive_wait_ms the window is the same for every class
    r = run_engine(reqs, StaticScheduler(StaticConfig(max_wait_ms=20.0)), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 20.0}


def test_window_settings_are_checked():
    with pytest.raises(ConfigError, match="interactive_wait_ms"):
        from_table(StaticConfig, {"max_wait_ms": 5, "interactive_wait_ms": 10}, where="lab.toml: [scheduler]")
    with pytest.raises(ConfigError, match=r"\[scheduler\]: max_wait_ms: must be >= 0"):
        from_table(ContinuousConfig, {"max_wait_ms": -1}, where="lab.toml: [scheduler]")


# -- shortest job first and longest output first ---------------------------------------------------------------

# One slot, all at t=0, prompts of 2 tokens (1 ms), 4 ms per decode step: a request of o
# tokens holds the slot 1 + 4 (o - 1) ms.
JOBS = [Request(0, 0.0, 2, 5), Request(1, 0.0, 2, 1), Request(2, 0.0, 2, 2)]


@pytest.mark.parametrize("engine", ENGINES)
def test_shortest_job_first_cuts_the_mean_queue_time(engine):
    # FCFS: request 0 (17 ms) from 0, request 1 (1 ms) from 17, request 2 (5 ms) from 18 -> 23.
    #   Queue times 0, 17, 18: mean 35/3.
    # SJF with exact lengths: 1 from 0 (done at 1), 2 from 1 (done at 6), 0 from 6 (done at 23).
    #   Queue times 0, 1, 6: mean 7/3. Same makespan, much shorter waits.
    fcfs = run(JOBS, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), engine)
    sjf = run(JOBS, ContinuousScheduler(ContinuousConfig(max_num_seqs=1, policy="sjf")), engine)
    assert by_id(fcfs, "first_scheduled_ms") == {0: 0.0, 1: 17.0, 2: 18.0}
    assert by_id(sjf, "first_scheduled_ms") == {0: 6.0, 1: 0.0, 2: 1.0}
    assert by_id(sjf, "finish_ms") == {0: 23.0, 1: 1.0, 2: 6.0}
    assert fcfs.metrics["queue_ms"]["mean"] == pytest.approx(35 / 3)
    assert sjf.metrics["queue_ms"]["mean"] == pytest.approx(7 / 3)
    assert fcfs.metrics["makespan_ms"] == sjf.metrics["makespan_ms"] == 23.0


@pytest.mark.parametrize("engine", ENGINES)
def test_longest_output_first_sorts_by_max_tokens(engine):
    # SGLang's lof sorts by max_new_tokens, the limit a server knows, not the true length:
    # request 2 will stop after 1 token but allows 6, so it goes first (0..1), then request 1
    # (limit 3: 1..10), then request 0 (limit 2: 10..15). SJF, by true length, runs 2, 0, 1.
    reqs = [Request(0, 0.0, 2, 2), Request(1, 0.0, 2, 3), Request(2, 0.0, 2, 1, max_tokens=6)]
    lof = run(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=1, policy="lof")), engine)
    assert by_id(lof, "first_scheduled_ms") == {0: 10.0, 1: 1.0, 2: 0.0}
    assert by_id(lof, "finish_ms") == {0: 15.0, 1: 10.0, 2: 1.0}
    sjf = run(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=1, policy="sjf")), engine)
    assert by_id(sjf, "first_scheduled_ms") == {0: 1.0, 1: 6.0, 2: 0.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_sjf_preempts_the_longest_predicted_job(engine):
    # Blocks of 2 tokens, 4 blocks. Request 0 (prompt 2, 6 tokens) starts alone: prefill 0..1.
    # Request 1 (prompt 2, 4 tokens) joins at 1: decode + prefill 1..6, then 6..10. At 10 both
    # need a block and none is free. FCFS preempts the newest (1): 0 finishes at 22, 1 is
    # recomputed at 22 and finishes at 28. SJF preempts the longest predicted job (0): 1 runs
    # on and finishes at 18; 0 recomputes 5 tokens (2.5 ms) at 18 and ends 2 steps later, 28.5.
    reqs = [Request(0, 0.0, 2, 6), Request(1, 1.0, 2, 4)]
    results = {}
    for policy in ("fcfs", "sjf"):
        sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=2, allocation="grow", policy=policy))
        results[policy] = run(reqs, sched, engine, kv=PagedKVCache(4, 2))
    assert by_id(results["fcfs"], "finish_ms") == {0: 22.0, 1: 28.0}
    assert by_id(results["fcfs"], "preemptions") == {0: 0, 1: 1}
    assert by_id(results["sjf"], "finish_ms") == {0: 28.5, 1: 18.0}
    assert by_id(results["sjf"], "preemptions") == {0: 1, 1: 0}


def _mean_queue(requests, **cfg):
    r = run(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1, **cfg)), "fast")
    return r.metrics["queue_ms"]["mean"]


def test_prediction_noise_costs_queue_time():
    # Eight jobs at t=0, outputs 8, 7, ..., 1: FCFS runs the longest first, the worst order.
    # A job of o tokens holds the slot 4 o - 3 ms. Shortest first, the j-th waits
    # sum_{i=1..j} (4 i - 3) = 2 j^2 - j: 0, 1, 6, 15, 28, 45, 66, 91 -> mean 252 / 8 = 31.5.
    # Longest first: 0, 29, 54, 75, 92, 105, 114, 119 -> mean 588 / 8 = 73.5.
    jobs = [Request(i, 0.0, 2, 8 - i) for i in range(8)]
    assert _mean_queue(jobs) == 73.5
    assert _mean_queue(jobs, policy="sjf") == 31.5
    noisy = {sigma: [_mean_queue(jobs, policy="sjf", prediction_sigma=sigma, prediction_seed=seed)
                     for seed in range(12)] for sigma in (0.25, 2.0)}
    for waits in noisy.values():
        assert min(waits) >= 31.5    # no order beats shortest first (one server, all at t=0)
        assert max(waits) <= 73.5    # nor loses to longest first
    assert 31.5 < np.mean(noisy[0.25]) < np.mean(noisy[2.0]) < 73.5


@SETTINGS
@given(st.lists(st.integers(1, 30), min_size=2, max_size=9), st.sampled_from([0.3, 1.0, 3.0]), st.integers(0, 2**16))
def test_exact_shortest_first_is_never_beaten_on_one_slot(outputs, sigma, seed):
    """With one slot and every job present at t=0, shortest processing time first minimizes the
    mean wait (Smith's rule); equal prompts make the time grow with the output length."""
    jobs = [Request(i, 0.0, 4, o) for i, o in enumerate(outputs)]
    best = _mean_queue(jobs, policy="sjf")
    assert best <= _mean_queue(jobs) + 1e-9
    assert best <= _mean_queue(jobs, policy="sjf", prediction_sigma=sigma, prediction_seed=seed) + 1e-9


def test_length_prediction_errors_are_lognormal_and_deterministic():
    requests = [Request(i, 0.0, 1, 100) for i in range(4000)]
    exact = LengthPredictor(0.0)
    assert [exact(r) for r in requests[:3]] == [100.0, 100.0, 100.0]
    a, b = LengthPredictor(0.5, seed=7), LengthPredictor(0.5, seed=7)
    logs = np.log([a(r) / 100 for r in requests])
    assert [a(r) for r in requests[:50]] == [b(r) for r in reversed(requests[:50])][::-1]  # order-free
    assert abs(float(np.median(logs))) < 0.05 and abs(float(np.std(logs)) - 0.5) < 0.03
    other = LengthPredictor(0.5, seed=8)
    assert [other(r) for r in requests[:5]] != [a(r) for r in requests[:5]]
    capped = Request(0, 0.0, 1, 100, max_tokens=10)          # the prediction aims at what it generates
    assert LengthPredictor(0.0)(capped) == 10.0


def test_prediction_settings_are_checked():
    with pytest.raises(ConfigError, match="prediction_sigma only affects policy = 'sjf'"):
        ContinuousConfig(prediction_sigma=0.5)
    assert ContinuousConfig(policy="sjf", prediction_sigma=0.5).prediction_seed == 0


# -- priorities: no inversion without preemption -------------------------------------------------------------


def priority_inversions(result) -> list[tuple[int, int]]:
    """(low, high) pairs where a lower-priority request started while a higher-priority one had
    already arrived and had not started yet."""
    ids = result.requests["id"].tolist()
    prio = result.requests["priority"].tolist()
    arrival = result.requests["arrival_ms"].tolist()
    start = result.requests["first_scheduled_ms"].tolist()
    return [(ids[lo], ids[hi]) for lo, hi in itertools.permutations(range(len(ids)), 2)
            if prio[hi] < prio[lo] and arrival[hi] <= start[lo] < start[hi]]


@pytest.mark.parametrize("engine", ENGINES)
def test_priority_preemption_never_picks_a_sequence_swapped_in_by_the_same_plan(engine):
    # One slot, swap preemption, B = 4, 2 MiB blocks over 1.024 GB/s: 2.048 ms per 2 blocks; the
    # default costs (0.05 ms per prompt token, 8 ms per decode step). L (priority 2) runs from 0
    # (first token 0.2, a decode step to 8.2). At 8.2, H1 (priority 0, arrived at 1) swaps L out
    # (5 tokens + the withdrawn decode slot: 2 blocks) and is prefilled: 0.2 + 2.048, first token
    # 10.448, one decode step: done 18.448. The next plan swaps L back in (2.048 + a decode step:
    # to 28.496); H2 (priority 0, arrived at 2) waits, since L joined that plan -- it cannot be
    # withdrawn from it. At 28.496 L, running since the plan before, is swapped out for H2.
    requests = [Request(0, 0.0, 4, 20, priority=2), Request(1, 1.0, 4, 2, priority=0),
                Request(2, 2.0, 4, 2, priority=0)]
    cfg = ContinuousConfig(max_num_seqs=1, policy="priority", priority_preemption=True, allocation="grow",
                           preemption="swap")
    kv = PagedKVCache(64, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=1.024)
    r = run_engine(requests, ContinuousScheduler(cfg), kv=kv, engine=engine)
    assert by_id(r, "first_scheduled_ms") == pytest.approx({0: 0.0, 1: 8.2, 2: 28.496})
    assert by_id(r, "first_token_ms") == pytest.approx({0: 0.2, 1: 10.448, 2: 30.744})
    assert by_id(r, "swaps") == {0: 2, 1: 0, 2: 0}
    assert r.counters["swap_transfer_ms"] == pytest.approx(4 * 2.048)


@st.composite
def reserving_priority_configs(draw):
    seqs = draw(st.integers(1, 5))
    return ContinuousConfig(
        max_num_seqs=seqs, max_num_batched_tokens=draw(st.integers(max(seqs, 8), 120)),
        chunked_prefill=draw(st.booleans()), long_prefill_token_threshold=draw(st.sampled_from([0, 0, 7])),
        allocation="reserve", watermark=draw(st.sampled_from([0.0, 0.1])), prefill_first=draw(st.booleans()),
        policy="priority", priority_preemption=False)


@SETTINGS
@given(requests_lists(max_size=12, priorities=True), reserving_priority_configs(), st.integers(1, 6),
       st.integers(0, 40), st.sampled_from(ENGINES))
def test_no_lower_priority_request_starts_while_a_higher_one_waits(requests, cfg, block_size, spare, engine):
    """With ``policy = "priority"`` and no preemption (``allocation = "reserve"``), a request is
    never admitted while a more important one (lower value) that has arrived is still waiting.

    "That fits" needs no qualifier: admission takes the queue in (priority, arrival) order and
    stops at the first request that does not fit -- a free slot, the token budget left after
    decodes (without chunking the whole prompt must fit), KV blocks for prompt + max_tokens
    (above the watermark) -- so a higher-priority request that does not fit blocks every
    lower-priority one behind it (vLLM's head-of-line rule), and one that fits is taken
    first. Arrivals at an iteration boundary are queued before that iteration is planned."""
    need = blocks_for_largest(requests, block_size)
    kv = PagedKVCache(need + spare + int(need * cfg.watermark * 2) + 1, block_size)
    result = run(requests, ContinuousScheduler(cfg), engine, kv=kv)
    assert result.metrics["num_preemptions"] == 0
    assert priority_inversions(result) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_fcfs_inverts_priorities_where_the_priority_policy_does_not(engine):
    # One slot; request 0 (priority 2) runs from 0; at 1 request 1 (priority 2) and request 2
    # (priority 0) are waiting. FCFS then starts 1 before 2: an inversion the check catches.
    reqs = [Request(0, 0.0, 2, 3, priority=2), Request(1, 0.5, 2, 2, priority=2), Request(2, 0.5, 2, 2, priority=0)]
    fcfs = run(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), engine)
    prio = run(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=1, policy="priority")), engine)
    assert priority_inversions(fcfs) == [(1, 2)]
    assert priority_inversions(prio) == []


# -- VTC: token-fair scheduling -------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_vtc_serves_the_least_served_client_by_hand(engine):
    # One slot. Client a sends 3 requests of 4 tokens, client b 3 requests of 1 token, all at 0,
    # a's first; prompts 2. Counter = 1 per prompt token + 2 per output token but the first (VTC's
    # code charges decode steps): an a request costs 2 + 2 * 3 = 8 and holds the slot
    # 1 + 3 * 4 = 13 ms; a b request costs 2 + 0 = 2 and takes 1 ms.
    # t=0: both counters 0, tie -> the client seen first, a: a0 (0..13): a = 8.
    # t=13: b = 0 < 8 -> b3 (b = 2); t=14: 2 < 8 -> b4 (b = 4); t=15: 4 < 8 -> b5 (b = 6).
    #   (Charging only prompts, a would be 2 at t=14, tying b's 2, and a1 would go first.)
    # t=16: only a waits: a1 16..29, a2 29..42. FCFS would start the b requests at 39, 40, 41.
    reqs = [Request(i, 0.0, 2, 4, client="a") for i in range(3)] + \
           [Request(i, 0.0, 2, 1, client="b") for i in range(3, 6)]
    sched = VtcScheduler(VtcConfig(max_num_seqs=1))
    r = run(reqs, sched, engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 16.0, 2: 29.0, 3: 13.0, 4: 14.0, 5: 15.0}
    assert sched.counters() == {"a": 24.0, "b": 6.0}
    fcfs = run(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), engine)
    assert [by_id(fcfs, "first_scheduled_ms")[i] for i in (3, 4, 5)] == [39.0, 40.0, 41.0]
    # per-client service in the run's metrics is the paper's cost, every output token counted:
    # a 3 x (2 + 2 * 4) = 30 over 0..42 ms, b 3 x (2 + 2) = 12 over 0..16 ms
    pc = r.metrics["per_client"]
    assert (pc["a"]["service"], pc["b"]["service"]) == (30.0, 12.0)
    assert pc["a"]["service_rate"] == pytest.approx(30 / 0.042) and pc["b"]["service_rate"] == pytest.approx(12 / 0.016)
    f = r.metrics["fairness"]
    assert f["clients"] == 2
    assert f["jain_service"] == pytest.approx(42 ** 2 / (2 * (30 ** 2 + 12 ** 2)))
    x, y = 30 / 0.042, 12 / 0.016
    assert f["jain_service_rate"] == pytest.approx((x + y) ** 2 / (2 * (x * x + y * y)))


@pytest.mark.parametrize("engine", ENGINES)
def test_vtc_charges_no_prompt_its_client_gave_up_on(engine):
    """A request that leaves the queue because its client gave up got no service: VTC's code skips
    an aborted request uncharged. (Its 1,000-token prompt was charged, and client a then waited
    behind all of b's.) One slot: b0 (prompt 2, 10 tokens) holds it from 0, costing 2 + 2 x 9 =
    20; a1 (1,000 tokens, a 1 ms timeout) gives up waiting, a stays at 0. At 100 ms b2 and b3
    arrive, then a4 (prompts 2, one token each): a is lifted to the backlog's least counter, b's
    20, and the tie goes to b, seen first -> b2 (b = 22); a4 (20 < 22); b3."""
    reqs = [Request(0, 0.0, 2, 10, client="b"), Request(1, 0.5, 1000, 2, client="a", timeout_ms=1.0),
            Request(2, 100.0, 2, 1, client="b"), Request(3, 100.0, 2, 1, client="b"), Request(4, 100.0, 2, 1, client="a")]
    sched = VtcScheduler(VtcConfig(max_num_seqs=1))
    r = run(reqs, sched, engine)
    assert by_id(r, "aborted")[1] == 1
    first = by_id(r, "first_scheduled_ms")
    assert first[2] < first[4] < first[3]
    assert sched.counters() == {"a": 22.0, "b": 24.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_vtc_counters_move_within_a_decode_run(engine):
    # Budget 8 tokens, 3 slots, no chunking. At 0: a0 (prompt 1, 20 tokens), b1 (1, 1),
    # a2 (prompt 8, 1), b3 (1, 1). Counters a = b = 0: a0 (a = 1), then b1 (b = 1), then a tie
    # -> a, seen first: its head a2 needs 8 tokens > 6 left: admission stops.
    # Prefill 2 tokens 0..1: a0 and b1 get their first token (free: a = b = 1); b1 is done.
    # t=1: a0 decodes (budget 7 left), a2 (8) still does not fit; b3 is behind it (tie, a first).
    #   1..5: a0's 2nd token, a = 3 > b = 1: the order turned inside the decode run.
    # t=5: b3 goes first (prefill 1 token + decode: 4.5 ms -> 9.5); a2 waits for a budget of 8,
    #   i.e. until a0 finishes: tokens 3..20 at 9.5 + 4 k -> 77.5; a2 prefills 8 tokens 77.5..81.5.
    # The fast engine asks the scheduler again after one step only because the ranking can turn.
    reqs = [Request(0, 0.0, 1, 20, client="a"), Request(1, 0.0, 1, 1, client="b"),
            Request(2, 0.0, 8, 1, client="a"), Request(3, 0.0, 1, 1, client="b")]
    sched = VtcScheduler(VtcConfig(max_num_seqs=3, max_num_batched_tokens=8))
    r = run(reqs, sched, engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 0.0, 2: 77.5, 3: 5.0}
    assert by_id(r, "finish_ms") == {0: 77.5, 1: 1.0, 2: 81.5, 3: 9.5}
    # a: prompts 1 + 8, outputs but the first 19 + 0 -> 9 + 38 = 47; b: prompts 2, outputs 0 + 0 -> 2
    assert sched.counters() == {"a": 47.0, "b": 2.0}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("lift, order", [("last_left", [1, 2, 4, 3]), ("none", [1, 2, 3, 4])])
def test_vtc_lifts_a_returning_client(engine, lift, order):
    # One slot. b0 (prompt 2, 4 tokens) runs alone 0..13, tokens at 1, 5, 9, 13 (the first free):
    # b = 2 + 2 * 3 = 8. a1, a2, a3 (2, 1 each: cost 2, 1 ms) arrive at 2, b4 (2, 1) at 3; all
    # queue at the boundary t=5, when b = 2 + 2 * 1 = 4. Nobody is waiting when a1 comes, and b was
    # the last client to leave the queue, so a is lifted to 4 (the paper; the code leaves a at 0).
    # b4 is lifted to the smallest waiting counter: b stays at 4 (it is not below).
    # last_left: t=13 a = 4 < b = 8 -> a1 (a = 6); t=14 6 < 8 -> a2 (a = 8); t=15 a tie, 8 = 8:
    #   b, seen first (at 0), gets b4 (the older head would be a3); t=16 a3.
    # none: a starts at 0 and gets a1, a2, a3 (a = 2, 4, 6 after each: all below b's 8).
    reqs = [Request(0, 0.0, 2, 4, client="b")] + [Request(i, 2.0, 2, 1, client="a") for i in (1, 2, 3)] + \
           [Request(4, 3.0, 2, 1, client="b")]
    r = run(reqs, VtcScheduler(VtcConfig(max_num_seqs=1, lift_when_queue_empty=lift)), engine)
    start = by_id(r, "first_scheduled_ms")
    assert sorted(start, key=start.get)[1:] == order
    assert sorted(start.values()) == [0.0, 13.0, 14.0, 15.0, 16.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_vtc_never_charges_a_requests_first_token(engine):
    # VTC's code charges output on decode steps only (update_counter in _decode_batch): the token
    # a prefill makes is free. One slot, all at 0, every answer one token (no decode step at
    # all), prompts: a0 5, b1 11, a2 5, a3 5, b4 1 (0.5 ms per prompt token). Counters = prompts.
    # t=0: a = b = 0, a seen first -> a0 (a = 5) 0..2.5; t=2.5: b = 0 < 5 -> b1 (b = 11) 2.5..8;
    # t=8: 5 < 11 -> a2 (a = 10) 8..10.5; t=10.5: 10 < 11 -> a3 (a = 15) 10.5..13; t=13: b4 (b = 12).
    # Charging the first tokens too (2 each): a = 7 and b = 13 after a0 and b1, a2 makes a = 14 >
    # 13, and b4 would go before a3.
    reqs = [Request(0, 0.0, 5, 1, client="a"), Request(1, 0.0, 11, 1, client="b"), Request(2, 0.0, 5, 1, client="a"),
            Request(3, 0.0, 5, 1, client="a"), Request(4, 0.0, 1, 1, client="b")]
    sched = VtcScheduler(VtcConfig(max_num_seqs=1))
    r = run(reqs, sched, engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 2.5, 2: 8.0, 3: 10.5, 4: 13.0}
    assert sched.counters() == {"a": 15.0, "b": 12.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_vtc_breaks_ties_for_the_client_seen_first(engine):
    # VTC's code takes min(active_served, key=active_served.get): on equal counters the client
    # whose first request came first (dict order), not the older waiting request. One slot,
    # prompts 10 (5 ms), one token each (free). a0, b1, b2 at 0; a3 at 0.1, while a0 runs.
    # t=0: tie at 0, a seen first -> a0 (a = 10). a3 comes while b waits: a = max(10, 0) = 10.
    # t=5: b = 0 < 10 -> b1 (b = 10). t=10: a tie at 10 -> a (seen first) gets a3, though b2
    # has waited longer; t=15: b2.
    reqs = [Request(0, 0.0, 10, 1, client="a"), Request(1, 0.0, 10, 1, client="b"),
            Request(2, 0.0, 10, 1, client="b"), Request(3, 0.1, 10, 1, client="a")]
    sched = VtcScheduler(VtcConfig(max_num_seqs=1))
    r = run(reqs, sched, engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 5.0, 2: 15.0, 3: 10.0}
    assert sched.counters() == {"a": 20.0, "b": 20.0}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("lift, order, counters", [
    (None, [0, 1, 2, 3, 4], {"a": 55.0, "b": 15.0}),
    ("none", [0, 1, 2, 3, 4], {"a": 55.0, "b": 15.0}),
    ("last_left", [0, 1, 4, 2, 3], {"a": 60.0, "b": 65.0}),
])
def test_vtc_by_default_does_not_lift_a_client_that_finds_the_queue_empty(engine, lift, order, counters):
    # One slot, one token per request (free). a0 (prompt 50: 25 ms) runs alone 0..25: a = 50.
    # At 100 the queue is empty and b sends b1, b2, b3 (prompt 5: 2.5 ms each); a4 (5) at 100.01.
    # The code (the default, "none"): b starts at 0; b1 100..102.5 (b = 5); a4 finds b waiting:
    #   a = max(50, 5) = 50; b2 (b = 10), b3 (b = 15), then a4 (a = 55): 0, 1, 2, 3, 4.
    # The paper ("last_left"): b is lifted to a's 50, the counter of the last client to leave the
    #   queue; b1 (b = 55); a4 is lifted to 55; t=102.5: a tie, a seen first -> a4 (a = 60) at
    #   102.5, then b2 (b = 60) and b3 (b = 65): 0, 1, 4, 2, 3.
    reqs = [Request(0, 0.0, 50, 1, client="a")] + [Request(i, 100.0, 5, 1, client="b") for i in (1, 2, 3)] + \
           [Request(4, 100.01, 5, 1, client="a")]
    cfg = VtcConfig(max_num_seqs=1) if lift is None else VtcConfig(max_num_seqs=1, lift_when_queue_empty=lift)
    sched = VtcScheduler(cfg)
    r = run(reqs, sched, engine)
    start = by_id(r, "first_scheduled_ms")
    assert sorted(start, key=start.get) == order
    assert sorted(start.values()) == [0.0, 100.0, 102.5, 105.0, 107.5]
    assert sched.counters() == counters


def test_vtc_settings_are_checked():
    with pytest.raises(ConfigError, match="priority_preemption"):
        VtcConfig(priority_preemption=True)
    with pytest.raises(ConfigError, match="policy"):
        from_table(VtcConfig, {"policy": "priority"}, where="x")
    cfg = from_table(VtcConfig, {"input_price": 1, "output_price": 4, "max_num_seqs": 8}, where="x")
    assert (cfg.input_price, cfg.output_price) == (1.0, 4.0)


def test_vtc_is_registered():
    from schedlab.catalog import load_catalog

    entry = load_catalog(entry_points=False)["scheduler"].get("vtc")
    assert entry.factory is VtcScheduler and entry.config is VtcConfig


def test_a_single_client_run_has_no_per_client_section():
    r = run_engine([Request(0, 0.0, 4, 2), Request(1, 0.0, 4, 2)], ContinuousScheduler())
    assert "per_client" not in r.metrics and "fairness" not in r.metrics


def test_client_service_and_jain_index_by_hand():
    # alice: one finished request (prompt 10, 4 tokens) over 0..50 ms -> 10 + 8 = 18, 360 /s;
    # bob: one finished (prompt 2, 1 token: 4) and one rejected, over 10..30 ms -> 4, 200 /s.
    req = {"client": np.array(["alice", "bob", "bob"], dtype=object), "rejected": np.array([0, 0, 1]),
           "prompt_tokens": np.array([10, 2, 99]), "generated_tokens": np.array([4, 1, 0]),
           "arrival_ms": np.array([0.0, 10.0, 12.0]), "finish_ms": np.array([50.0, 30.0, -1.0])}
    out = client_service(req)
    assert out["alice"] == {"requests": 1, "finished": 1, "prompt_tokens": 10, "generated_tokens": 4,
                            "service": 18.0, "service_rate": 360.0}
    assert out["bob"]["service"] == 4.0 and out["bob"]["service_rate"] == 200.0
    assert jain_index([1, 1, 1]) == 1.0
    assert jain_index([5, 0, 0, 0]) == 0.25
    assert jain_index([18, 4]) == pytest.approx(22 ** 2 / (2 * (18 ** 2 + 4 ** 2)))


def backlogged_service_gaps(result, requests, ends, prices):
    """Largest |service_f - service_g| over the planning instants t at which both f and g still
    had a request waiting, from per-request columns, in VTC's cost (its code's): a request's
    prompt counts once it was admitted before t, its output tokens but the first once they were
    produced by t (the first at first_token_ms, free; then one at the end of every iteration
    until it finished -- exact here, where nothing is preempted and every iteration decodes
    every running sequence)."""
    w_in, w_out = prices
    cols = {c: by_id(result, c) for c in ("first_scheduled_ms", "first_token_ms", "finish_ms")}
    clients = sorted({r.client for r in requests})
    last_admission = {c: max(cols["first_scheduled_ms"][r.id] for r in requests if r.client == c) for c in clients}
    starts = sorted({0.0} | {e for e in ends})
    worst = 0.0
    for t in starts:
        waiting = [c for c in clients if last_admission[c] >= t]
        if len(waiting) < 2:
            continue
        service = dict.fromkeys(clients, 0.0)
        for r in requests:
            if cols["first_scheduled_ms"][r.id] < t:
                service[r.client] += w_in * r.prompt_tokens
            first, last = cols["first_token_ms"][r.id], min(cols["finish_ms"][r.id], t)
            if first < last:  # the iteration ends after the first token's, up to t
                service[r.client] += w_out * (bisect.bisect_right(ends, last) - bisect.bisect_right(ends, first))
        for f, g in itertools.combinations(waiting, 2):
            worst = max(worst, abs(service[f] - service[g]))
    return worst


class IterationEnds:
    """An observer keeping the end time of every iteration."""

    def __init__(self):
        self.ends: list[float] = []

    def __call__(self, instance, record):
        self.ends.append(record.start_ms + record.duration_ms)


def vtc_bound(requests, cfg, kv_tokens) -> float:
    """U = w_in * L + w_out * M (see the fairness test)."""
    longest_prompt = max(r.prompt_tokens for r in requests)
    most_output = min(kv_tokens, cfg.max_num_seqs * max(r.target_tokens for r in requests))
    return cfg.input_price * longest_prompt + cfg.output_price * most_output


@st.composite
def backlogged_clients(draw):
    """Two or three clients with 4-9 requests each, all at t=0, ids in a random interleaving."""
    n_clients = draw(st.integers(2, 3))
    owners = [c for c in "abc"[:n_clients] for _ in range(draw(st.integers(4, 9)))]
    owners = draw(st.permutations(owners))
    return [Request(i, 0.0, draw(st.integers(1, 24)), draw(st.integers(1, 24)), client=c)
            for i, c in enumerate(owners)]


@SETTINGS
@given(backlogged_clients(), st.integers(1, 4), st.integers(24, 96), st.booleans(),
       st.sampled_from([(1.0, 2.0), (1.0, 1.0), (0.5, 3.0), (0.0, 1.0)]), st.integers(1, 4), st.integers(0, 40))
def test_vtc_keeps_backlogged_clients_within_the_fairness_bound(requests, seqs, budget, chunked, prices, block_size,
                                                                spare):
    """The bound. Sheng et al. (OSDI'24, Sec. 4) prove that two clients backlogged over an
    interval receive services that differ by at most 2U (the "2x tight upper bound" of their
    abstract), U being the most a counter can gain at once: an admitted prompt (w_in * L_input)
    or the output of a full batch (w_out * M, M the tokens a batch holds). Their argument,
    redone for this engine: when f was last admitted, its counter was at most g's (VTC took
    the smallest), the admission added at most w_in * L (L: longest prompt), and after it only
    f's running sequences add to f's counter -- at most the M output tokens they still
    produce, M <= min(KV tokens, max_num_seqs * longest output), since KV is reserved for
    prompt + max_tokens and nothing is preempted. So whenever both are backlogged,
    |counter_f - counter_g| <= U = w_in * L + w_out * M (a sum: here the two gains can add
    up), and as every counter starts at 0 at t=0 (all requests arrive then, nobody is
    lifted), that bounds the service each has received since t=0 (2U over any interval
    within). The services are measured from per-request columns and iteration times, not
    read from the scheduler's counters."""
    w_in, w_out = prices
    cfg = VtcConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, chunked_prefill=chunked,
                    input_price=w_in, output_price=w_out)
    need = blocks_for_largest(requests, block_size)
    blocks = need + spare
    ends = IterationEnds()
    result = run_engine(requests, VtcScheduler(cfg), LinearCostModel(COST), PagedKVCache(blocks, block_size),
                        check=ends)
    check_run(result, requests)
    assert result.metrics["num_preemptions"] == 0
    gap = backlogged_service_gaps(result, requests, ends.ends, prices)
    assert gap <= vtc_bound(requests, cfg, blocks * block_size) + 1e-9


def test_fcfs_breaks_the_fairness_bound_that_vtc_keeps():
    # Client a's six requests come first: FCFS serves all of them while b waits; VTC alternates.
    # U = 1 * 4 + 2 * min(4096 * 16, 1 * 8) = 20; FCFS lets a get 5 requests ahead, each 4 + 2 * 7
    # = 18 (the first token free): 90 when a5 is admitted.
    requests = [Request(i, 0.0, 4, 8, client="a" if i < 6 else "b") for i in range(12)]
    cfg = VtcConfig(max_num_seqs=1)
    gaps = {}
    for name, sched in (("vtc", VtcScheduler(cfg)), ("fcfs", ContinuousScheduler(ContinuousConfig(max_num_seqs=1)))):
        ends = IterationEnds()
        result = run_engine(requests, sched, LinearCostModel(COST), check=ends)
        gaps[name] = backlogged_service_gaps(result, requests, ends.ends, (1.0, 2.0))
    bound = vtc_bound(requests, cfg, 4096 * 16)
    assert bound == 20.0
    assert gaps["vtc"] <= bound < gaps["fcfs"]
    assert gaps["fcfs"] == 90.0


@SETTINGS
@given(requests_lists(max_size=12, max_output=60), st.integers(1, 5), st.sampled_from(["reserve", "grow"]),
       st.integers(6, 60))
def test_vtc_with_one_client_is_fcfs(requests, seqs, allocation, blocks):
    """One client: VTC's order is arrival order, preempted requests back in front -- the same
    run as ``continuous`` with FCFS, with as few scheduler events (no extra wake-ups)."""
    vtc = run_engine(requests, VtcScheduler(VtcConfig(max_num_seqs=seqs, allocation=allocation)),
                     kv=PagedKVCache(blocks, 4))
    fcfs = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=seqs, allocation=allocation)),
                      kv=PagedKVCache(blocks, 4))
    compare_runs(vtc, fcfs, rel=0.0)
    assert vtc.meta["events"] == fcfs.meta["events"]


# -- fast engine against the reference engine ------------------------------------------------------------------


linear_costs = dyadic_linear_costs


@st.composite
def tagged_requests(draw, **kw):
    """Requests from 1-3 clients, some of them interactive (arrivals and costs stay dyadic)."""
    requests = draw(requests_lists(**kw))
    clients = draw(st.sampled_from(["a", "ab", "abc"]))
    return [attrs.evolve(r, client=draw(st.sampled_from(clients)),
                         request_class=draw(st.sampled_from(["interactive", "batch", "batch"]))) for r in requests]


@st.composite
def windows(draw):
    wait = draw(st.sampled_from([0.0, 0.0, 2.5, 10.0, 40.0]))
    return {"max_wait_ms": wait, "min_batch": draw(st.integers(0, 3)),
            "interactive_wait_ms": min(wait, draw(st.sampled_from([0.0, 1.25])))}


@st.composite
def policy_configs(draw, cls=ContinuousConfig):
    seqs = draw(st.integers(1, 6))
    allocation = draw(st.sampled_from(["reserve", "grow"]))
    extra = {}
    if cls is VtcConfig:
        w_in, w_out = draw(st.sampled_from([(1.0, 2.0), (1.0, 1.0), (0.5, 3.0), (0.0, 1.0)]))
        extra = {"input_price": w_in, "output_price": w_out,
                 "lift_when_queue_empty": draw(st.sampled_from(["last_left", "none"]))}
    else:
        policy = draw(st.sampled_from(["fcfs", "priority", "sjf", "lof"]))
        extra = {"policy": policy, "priority_preemption": policy == "priority" and draw(st.booleans())}
        if policy == "sjf":
            extra.update(prediction_sigma=draw(st.sampled_from([0.0, 0.5, 2.0])),
                         prediction_seed=draw(st.integers(0, 9)))
    return cls(
        max_num_seqs=seqs, max_num_batched_tokens=draw(st.integers(max(seqs, 8), 160)),
        chunked_prefill=draw(st.booleans()), long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5, 17])),
        allocation=allocation,
        preemption=draw(st.sampled_from(["recompute", "swap"])) if allocation == "grow" else "recompute",
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1])), prefill_first=draw(st.booleans()),
        **draw(windows()), **extra)


def _both_engines(requests, make, cost, block_size, num_blocks, swap):
    out = []
    for engine in ENGINES:
        kv = PagedKVCache(num_blocks, block_size, swap_blocks=swap, bytes_per_block=2 ** 20,
                          host_link_gbps=2 ** 10 / 1e3)
        out.append(run_engine(requests, make(), LinearCostModel(cost), kv, engine=engine))
    compare_runs(*out, rel=1e-12)
    check_run(out[0], requests, kv_blocks=num_blocks)
    return out[0]


@SETTINGS
@given(tagged_requests(max_size=12, priorities=True), policy_configs(VtcConfig), linear_costs(),
       st.integers(1, 8), st.integers(4, 60), st.sampled_from([0, 8, 64]))
def test_vtc_fast_engine_matches_reference(requests, cfg, cost, block_size, num_blocks, swap):
    _both_engines(requests, lambda: VtcScheduler(cfg), cost, block_size, num_blocks, swap)


@SETTINGS
@given(tagged_requests(min_size=4, max_size=12, max_prompt=24, max_output=120, all_at_zero=True),
       st.integers(2, 5), st.integers(8, 40), linear_costs())
def test_vtc_long_backlogged_runs_match_reference(requests, seqs, budget, cost):
    """Everything queued at once with long outputs: long decode runs in which the ranking of
    the backlogged clients turns (the case the lazy counters and the wake-ups are for)."""
    cfg = VtcConfig(max_num_seqs=seqs, max_num_batched_tokens=max(seqs, budget), allocation="grow")
    _both_engines(requests, lambda: VtcScheduler(cfg), cost, 4, 200, 0)


@SETTINGS
@given(tagged_requests(max_size=12, priorities=True), policy_configs(), linear_costs(),
       st.integers(1, 8), st.integers(4, 60), st.sampled_from([0, 8, 64]))
def test_ordered_and_windowed_continuous_matches_reference(requests, cfg, cost, block_size, num_blocks, swap):
    _both_engines(requests, lambda: ContinuousScheduler(cfg), cost, block_size, num_blocks, swap)


@SETTINGS
@given(tagged_requests(max_size=12), st.integers(1, 5), windows(), linear_costs(), st.integers(1, 8),
       st.integers(4, 60))
def test_windowed_static_matches_reference(requests, batch, window, cost, block_size, num_blocks):
    cfg = StaticConfig(batch_size=batch, **window)
    _both_engines(requests, lambda: StaticScheduler(cfg), cost, block_size, num_blocks, 0)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_long_prefill_threshold_chunks_prompts_without_chunked_prefill_too(engine):
    """vLLM 0.33 caps a request's tokens at ``long_prefill_token_threshold`` before it checks that a
    prompt fits the budget unchunked, so even with chunked prefill off a long prompt goes in chunks
    (Scheduler.schedule's waiting loop; vllm_diff review s78). Every iteration 1 ms. R0 (21 tokens,
    11 out) arrives at 1: first token 2, finished at 12. R1 (116 tokens, 15 out) arrives at 3 beside
    it: 16-token chunks from 3 to 10 (7 x 16 + 4), first token 11, finished at 11 + 14 = 25 (it was
    admitted whole: first token 4)."""
    config = ContinuousConfig(max_num_seqs=5, max_num_batched_tokens=160, chunked_prefill=False,
                              long_prefill_token_threshold=16)
    requests = [Request(0, 1.0, 21, 11), Request(1, 3.0, 116, 15)]
    one_ms = LinearConfig(prefill_ms_per_token=0.0, decode_ms_per_step=0.0, base_ms=1.0)
    result = run(requests, ContinuousScheduler(config), engine, kv=PagedKVCache(86, 2), cost=one_ms)
    assert by_id(result, "first_token_ms") == {0: 2.0, 1: 11.0}
    assert by_id(result, "finish_ms") == {0: 12.0, 1: 25.0}
    assert by_id(result, "prefill_chunks") == {0: 1, 1: 8}
