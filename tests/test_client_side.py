"""The client's view (issue 20.1, 20.3): the API server in front of the engine, and clients that
give up.

Hand-computed scenarios pin the rules down (schedlab/frontend.py); differential tests run the
fast engine's closed forms (schedlab/engine/client.py, bulk runs cut at aborts) against the
reference engine's events on random workloads; hypothesis properties check what every run with
timeouts must satisfy: each request finishes, is rejected or is aborted exactly once, the KV
cache is empty at the end, an aborted request is in no iteration after its abort, and routers
see it leave then.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedlab.frontend import ClientConfig, ClientSide, FrontendConfig, client_times
from schedlab.model import Request
from schedlab.testing import (
    IterationChecker, check_run, compare_runs, dyadic_linear_costs, examples, requests_lists, run_cluster, run_engine,
)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixKVCache
from schedlab_plugins.routers import LeastOutstandingRouter, RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, SglangConfig, SglangScheduler
from schedlab_plugins.workloads.closed_loop import ClosedLoopConfig, make_closed_loop_workload
from test_sglang import rejections_for, sglang_configs, sglang_pool, whole_pages

ENGINES = ("fast", "reference")
SETTINGS = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
FRONT = FrontendConfig(network_ms=0.5, request_ms=1.0, tokenize_ms_per_token=0.125, token_ms=0.25, workers=1)


def column(result, name):
    return result.requests[name].tolist()


# -- the front end, by hand ------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_one_request_through_the_front_end_by_hand(engine):
    """Sent at 0: received at 0.5, handled for 1 + 10 x 0.25 ms, so queued at the engine at 4.0;
    its 10-token prefill (0.05 ms/token) gives the first token at 4.5, decodes of 8 ms the
    others at 12.5 and 20.5; every token reaches the client 0.25 + 0.5 ms later."""
    side = ClientSide(FrontendConfig(network_ms=0.5, request_ms=1.0, tokenize_ms_per_token=0.25, token_ms=0.25))
    r = run_engine([Request(0, 0.0, 10, 3)], ContinuousScheduler(), LinearCostModel(), engine=engine,
                   client_side=side)
    assert column(r, "sent_ms") == [0.0]
    assert column(r, "arrival_ms") == [4.0]
    assert column(r, "first_token_ms") == [4.5]
    assert column(r, "finish_ms") == [20.5]
    assert column(r, "client_first_ms") == [5.25]
    assert column(r, "client_done_ms") == [21.25]
    m = r.metrics
    assert m["ttft_ms"]["mean"] == 0.5            # the engine's view: queued -> first token
    assert m["e2e_ms"]["mean"] == 16.5
    assert m["client"]["ttft_ms"]["mean"] == 5.25  # the client's: sent -> first byte
    assert m["client"]["e2el_ms"]["mean"] == 21.25
    assert m["client"]["tpot_ms"]["mean"] == m["tpot_ms"]["mean"] == 8.0
    assert m["client"]["ntpot_ms"]["mean"] == 21.25 / 3
    assert m["client"]["frontend_ms"]["mean"] == 4.0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("workers, arrivals", [
    (1, [4.0, 7.625, 11.375, 15.25]),   # one handler: each waits for the one before
    (2, [4.0, 7.125, 10.25, 13.375]),   # two: nobody waits (requests 3 ms apart, handling < 6 ms)
    (0, [4.0, 7.125, 10.25, 13.375]),   # no limit
])
def test_the_api_server_handles_requests_first_come_first_served(engine, workers, arrivals):
    """Request i: sent at 3i ms, prompt 20 + i: received 0.5 ms later, handled for
    1 + 0.125 x (20 + i) ms = 3.5, 3.625, 3.75, 3.875 ms. One handler: request 1 starts when
    request 0 is done (4.0) and reaches the engine at 7.625; request 2 then at 7.625 + 3.75."""
    front = FrontendConfig(network_ms=0.5, request_ms=1.0, tokenize_ms_per_token=0.125, token_ms=0.0,
                           workers=workers)
    requests = [Request(i, 3.0 * i, 20 + i, 2) for i in range(4)]
    r = run_engine(requests, ContinuousScheduler(), LinearCostModel(), engine=engine, client_side=ClientSide(front))
    assert column(r, "arrival_ms") == arrivals
    assert column(r, "sent_ms") == [0.0, 3.0, 6.0, 9.0]


def test_without_a_client_side_the_client_sees_what_the_engine_does():
    requests = [Request(i, 2.0 * i, 30, 5) for i in range(6)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=2)), LinearCostModel())
    assert column(r, "sent_ms") == column(r, "arrival_ms")
    assert column(r, "client_first_ms") == column(r, "first_token_ms")
    assert column(r, "client_done_ms") == column(r, "finish_ms")
    for name in ("ttft_ms", "tpot_ms"):
        assert r.metrics["client"][name] == r.metrics[name]
    assert r.metrics["client"]["e2el_ms"] == r.metrics["e2e_ms"]


# -- timeouts and aborts, by hand -------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_client_that_gives_up_has_its_request_aborted_at_the_next_step(engine):
    """100 tokens to generate at 8 ms each; the client gives up 100 ms after sending (at 100)
    and the engine hears of it 0.5 ms later: the decode iterations end at 4.5 + 8k, and the
    one ending at 100.5 (k = 12) is the first step at or after it. By then 13 tokens came."""
    side = ClientSide(FrontendConfig(network_ms=0.5, request_ms=1.0, tokenize_ms_per_token=0.25, token_ms=0.25),
                      ClientConfig(timeout_ms=100.0))
    kv = PagedKVCache(64, 16)
    r = run_engine([Request(0, 0.0, 10, 100), Request(1, 200.0, 10, 2)], ContinuousScheduler(), LinearCostModel(),
                   kv, engine=engine, client_side=side)
    assert column(r, "aborted") == [1, 0]
    assert column(r, "timed_out") == [1, 0]
    assert column(r, "finish_ms")[0] == 100.5
    assert column(r, "generated_tokens") == [13, 2]
    assert column(r, "client_done_ms")[0] == 100.0    # when the client gave up
    assert column(r, "client_first_ms")[0] == 5.25    # its first byte had come
    assert kv.num_used_blocks() == 0
    m = r.metrics
    assert (m["finished"], m["timed_out"], m["aborted"], m["rejected"]) == (1, 1, 1, 0)
    assert m["ttft_ms"]["max"] == 0.5                 # over the completed request only


@pytest.mark.parametrize("engine", ENGINES)
def test_the_makespan_runs_to_the_last_request_the_engine_dropped(engine):
    """Two 10-token prompts at 0: the 2-token answer finishes early, the 100-token one is
    dropped at the step ending at or after 100 ms, when its client gave up. The engine worked
    until then: the makespan ends there, and the GPU was busy all of it (not 7x longer than the
    makespan of the completed request alone)."""
    side = ClientSide(client=ClientConfig(timeout_ms=100.0))
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0))
    r = run_engine([Request(0, 0.0, 10, 100), Request(1, 0.0, 10, 2)], ContinuousScheduler(), cost,
                   engine=engine, client_side=side)
    # prefill of both: 20 x 0.5 = 10 ms (first tokens); decode steps end at 10 + 8k
    assert column(r, "finish_ms") == [106.0, 18.0]
    assert column(r, "aborted") == [1, 0]
    m = r.metrics
    assert m["makespan_ms"] == 106.0
    assert m["busy_share"] == pytest.approx(1.0)
    assert m["throughput_tps"] == pytest.approx(2 / 0.106)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_whose_client_left_before_it_arrived_is_aborted_on_arrival(engine):
    """The API server takes 2 + 4000 x 0.125 ms to handle a 4,000-token prompt; the client gives
    up after 300 ms, the engine hears of it at 300.5, before the request reaches it at 502.5."""
    side = ClientSide(FrontendConfig(network_ms=0.5, request_ms=2.0, tokenize_ms_per_token=0.125, token_ms=0.0),
                      ClientConfig(timeout_ms=300.0))
    r = run_engine([Request(0, 0.0, 4000, 5)], ContinuousScheduler(), LinearCostModel(), engine=engine,
                   client_side=side)
    assert column(r, "arrival_ms") == [502.5]
    assert column(r, "aborted") == [1]
    assert column(r, "finish_ms") == [502.5]
    assert column(r, "generated_tokens") == [0]
    assert column(r, "first_scheduled_ms") == [-1.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_whose_client_left_while_it_waited_for_the_api_server_holds_no_handler(engine):
    """One handler, 10 ms a request, clients give up 15 ms after sending (vLLM's
    ``with_cancellation`` cancels the handler's task at the disconnect). A (sent 0) is handled
    0-10. B (sent 1, disconnect 16) starts at 10: handled in full (a tokenizer thread cannot be
    stopped), it reaches the engine at 20, already abandoned. C (sent 2) is still waiting at its
    disconnect, 17: cancelled, it takes no handler, so D (sent 3, patient) starts at 20, not 30,
    and reaches the engine at 30 (it reached it at 40 when C was handled in full)."""
    front = FrontendConfig(network_ms=0.0, request_ms=10.0, tokenize_ms_per_token=0.0, token_ms=0.0, workers=1)
    side = ClientSide(front, ClientConfig(timeout_ms=15.0, classes={"patient": {"timeout_ms": 1e6}}))
    requests = [Request(0, 0.0, 4, 1), Request(1, 1.0, 4, 1), Request(2, 2.0, 4, 1),
                Request(3, 3.0, 4, 1, request_class="patient")]
    r = run_engine(requests, ContinuousScheduler(), LinearCostModel(), engine=engine, client_side=side)
    assert column(r, "arrival_ms") == [10.0, 20.0, 17.0, 30.0]
    assert column(r, "aborted") == [0, 1, 1, 0]
    assert column(r, "timed_out") == [0, 1, 1, 0]
    assert column(r, "generated_tokens") == [1, 0, 0, 1]
    assert column(r, "client_done_ms")[1:3] == [16.0, 17.0]  # when their clients gave up


@pytest.mark.parametrize("engine", ENGINES)
def test_timeouts_per_class(engine):
    """Chats give up after 20 ms, documents never: with one slot, the chat queued behind the
    document is abandoned while the document runs."""
    side = ClientSide(client=ClientConfig(classes={"chat": {"timeout_ms": 20.0}}))
    requests = [Request(0, 0.0, 10, 10, request_class="doc"), Request(1, 1.0, 10, 2, request_class="chat")]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), LinearCostModel(),
                   engine=engine, client_side=side)
    assert column(r, "aborted") == [0, 1]
    assert column(r, "finish_ms")[1] == 24.5  # the iteration boundary at or after 21: 0.5 + 8 x 3
    assert column(r, "waiting_ms")[1] == 23.5  # it waited from its arrival to its abort


def test_a_request_finished_in_the_engine_but_late_for_its_client_counts_as_failed():
    """The last token leaves the engine at 20.5; with 5 ms more to the client it lands at 25.5,
    after the client's 25 ms: failed for the client, finished (not aborted) in the engine. In
    a run: queued at 2.5 (the network), the last token at 19.0, at the client at 24.0 > 23."""
    request = Request(0, 0.0, 10, 3, timeout_ms=25.0)
    assert client_times(request, 4.5, 20.5, 5.0) == (9.5, 25.0, True)
    assert client_times(request, 4.5, 20.5, 4.5) == (9.0, 25.0, False)
    side = ClientSide(FrontendConfig(network_ms=2.5, request_ms=0.0, tokenize_ms_per_token=0.0, token_ms=2.5),
                      ClientConfig(timeout_ms=23.0))
    r = run_engine([Request(0, 0.0, 10, 3)], ContinuousScheduler(), LinearCostModel(), client_side=side)
    assert column(r, "finish_ms") == [19.0]
    assert column(r, "client_done_ms") == [23.0]      # it gave up
    assert column(r, "aborted") == [0] and column(r, "timed_out") == [1]
    assert r.metrics["finished"] == 0 and r.metrics["timed_out"] == 1


def test_goodput_and_attainment_count_abandoned_requests_as_missed():
    """One slot; each request takes 0.5 + 3 x 8 = 24.5 ms: the first finishes at 24.5, within
    the clients' 30 ms, the others cannot."""
    side = ClientSide(client=ClientConfig(timeout_ms=30.0))
    requests = [Request(i, 0.0, 10, 4) for i in range(4)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), LinearCostModel(),
                   client_side=side)
    from schedlab.results.metrics import compute_metrics

    meta = dict(r.meta, slo={"ttft_ms": 1000.0, "tpot_ms": 1000.0})
    m = compute_metrics(r.requests, r.counters, r.itl, meta)
    assert m["timed_out"] == 3
    assert m["slo"]["met"] == m["finished"] == 1
    assert m["slo"]["attainment"] == m["finished"] / 4


# -- both engines agree ------------------------------------------------------------------------------


@st.composite
def client_sides(draw, timeouts=True):
    front = None
    if draw(st.booleans()):
        front = FrontendConfig(network_ms=draw(st.sampled_from([0.0, 0.5, 2.0])),
                               request_ms=draw(st.sampled_from([0.0, 0.25, 3.0])),
                               tokenize_ms_per_token=draw(st.sampled_from([0.0, 0.125, 1.0])),
                               token_ms=draw(st.sampled_from([0.0, 0.25])),
                               workers=draw(st.integers(0, 3)))
    client = None
    if timeouts and draw(st.booleans()):
        network = front.network_ms if front is not None else 0.0
        timeout = draw(st.sampled_from([8.0, 30.0, 75.5, 200.0]))
        chat = draw(st.sampled_from([None, 12.5, 500.0]))
        client = ClientConfig(timeout_ms=max(timeout, network + 1),
                              classes={"chat": {"timeout_ms": max(chat, network + 1)}} if chat else {})
    return ClientSide(front, client)


def with_classes(requests):
    return [Request(r.id, r.arrival_ms, r.prompt_tokens, r.output_tokens, max_tokens=r.max_tokens,
                    priority=r.priority, request_class="chat" if r.id % 2 else "default",
                    prefix_group=r.prefix_group, prefix_tokens=r.prefix_tokens) for r in requests]


# Found by Hypothesis: a request swapped in by a plan, then aborted while that step ran, left the
# decode set before its token under the wrong inter-token group (the fast engine's KeyError).
@example([Request(i, 0.0, p, o, priority=pr) for i, (p, o, pr) in enumerate(
    [(1, 5, 1), (1, 1, 0), (8, 7, 0), (16, 17, 0), (25, 40, 1), (1, 1, 0), (1, 1, 0), (46, 12, 0), (1, 1, 0)])],
    ClientSide(None, ClientConfig(timeout_ms=200.0, classes={"chat": {"timeout_ms": 500.0}})),
    LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=8.0, per_seq_ms=0.25, per_context_token_ms=0.015625),
    3, False, "swap", "priority", False, 5, False)
@SETTINGS
@given(requests=requests_lists(max_size=12, max_prompt=48, max_output=40, priorities=True, prefix_groups=2),
       side=client_sides(), cost=dyadic_linear_costs(), max_seqs=st.integers(1, 4), chunked=st.booleans(),
       preemption=st.sampled_from(["recompute", "swap"]), policy=st.sampled_from(["fcfs", "priority"]),
       prefix=st.booleans(), spare=st.integers(0, 20), ahead=st.booleans())
def test_both_engines_agree_with_a_client_side(requests, side, cost, max_seqs, chunked, preemption, policy,
                                               prefix, spare, ahead):
    """Front end (FIFO handlers or none), timeouts per class, preemptions and swaps in a small
    cache, plans made ahead (asynchronous scheduling): per-request times, counters and metrics
    agree; every request is accounted for once and the cache is empty at the end."""
    requests = with_classes(requests)
    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // 4) for r in requests)
    cfg = ContinuousConfig(max_num_seqs=max_seqs, max_num_batched_tokens=64, chunked_prefill=chunked,
                           allocation="grow", preemption=preemption, policy=policy,
                           async_scheduling=ahead and preemption == "recompute")
    kvs = {}

    def run(engine):
        cache = PrefixKVCache if prefix else PagedKVCache
        kvs[engine] = cache(need + spare, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
        return run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(cost), kvs[engine], engine=engine,
                          client_side=side)

    fast, ref = run("fast"), run("reference")
    compare_runs(fast, ref, rel=1e-12)
    check_run(fast, requests, kv_blocks=need + spare)
    check_run(ref, requests, kv_blocks=need + spare)
    req = fast.requests
    assert all(not (a and r) for a, r in zip(req["aborted"].tolist(), req["rejected"].tolist()))


# Found by Hypothesis (a clean-clone CI run): two prompts sharing a block, admitted in one pass
# and aborted, were the last requests; the block their pass computed twice was freed only at a
# plan that never came (the instance had no work left), so the cache ended one block short.
@example([Request(i, 0.0, p, o, prefix_group=g, prefix_tokens=pt) for i, (p, o, g, pt) in enumerate(
    [(1, 1, None, 0), (1, 1, None, 0), (1, 1, None, 0), (1, 1, None, 0), (12, 1, 1, 1), (1, 1, None, 0),
     (1, 1, None, 0), (3, 4, None, 0), (12, 22, 1, 1), (1, 1, None, 0)])],
    ClientSide(FrontendConfig(network_ms=0.0, request_ms=3.0, tokenize_ms_per_token=1.0, token_ms=0.0, workers=0),
               ClientConfig(timeout_ms=30.0, classes={"chat": {"timeout_ms": 12.5}})),
    SglangConfig(max_running_requests=2, max_prefill_tokens=64, chunked_prefill_size=0, init_new_token_ratio=0.0,
                 min_new_token_ratio_factor=0.14, new_token_ratio_decay_steps=1, clip_max_new_tokens=8,
                 retract_decode_steps=0, num_reserved_decode_tokens=512, overlap_schedule=True, context_length=0),
    LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=8.0), 0, 1, True)
@SETTINGS
@given(requests=requests_lists(max_size=12, max_prompt=40, max_output=30, prefix_groups=2), side=client_sides(),
       cfg=sglang_configs(), cost=dyadic_linear_costs(), spare=st.integers(0, 12), block_size=st.integers(1, 4),
       radix=st.booleans())
def test_both_engines_agree_on_sglang_whose_aborted_requests_run_once_more(requests, side, cfg, cost, spare,
                                                                           block_size, radix):
    """SGLang's rule for a client that gives up (a queued request leaves at the plan that reads
    the abort, a running one after the next iteration that computes it, its token dropped),
    with its overlap scheduler drawn and tight pools (retractions): per-request times, counters
    and metrics agree, every request is accounted for once and the cache is empty at the end."""
    cfg = whole_pages(cfg, block_size)
    requests = with_classes(requests)
    # (a pool of 6 tokens more than the longest prompt: SGLang refuses a prompt of pool - 6 or more)
    blocks = sglang_pool(requests, block_size, spare, prefix_cache=radix)
    kvs = {}

    def run(engine):
        kvs[engine] = (RadixKVCache if radix else PagedKVCache)(blocks, block_size)
        return run_engine(requests, SglangScheduler(cfg), LinearCostModel(cost), kvs[engine], engine=engine,
                          client_side=side)

    fast, ref = run("fast"), run("reference")
    compare_runs(fast, ref, rel=1e-12)
    check_run(fast, requests, kv_blocks=blocks, rejections=rejections_for(cfg))
    check_run(ref, requests, kv_blocks=blocks, rejections=rejections_for(cfg))
    assert all(kv.num_used_blocks() == 0 for kv in kvs.values())


@SETTINGS
@given(requests=requests_lists(max_size=12, max_prompt=32, max_output=30), side=client_sides(),
       cost=dyadic_linear_costs(), instances=st.integers(2, 3), router=st.sampled_from(["rr", "lo"]),
       ahead=st.booleans())
def test_both_engines_agree_behind_a_router_with_a_client_side(requests, side, cost, instances, router, ahead):
    requests = with_classes(requests)

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=2, async_scheduling=ahead)), LinearCostModel(cost),
                PagedKVCache(200, 4))

    runs = [run_cluster(requests, make, instances, RoundRobinRouter() if router == "rr" else LeastOutstandingRouter(),
                        engine=engine, client_side=side) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests)


@SETTINGS
@given(side=client_sides(), cost=dyadic_linear_costs(), clients=st.integers(1, 4), think=st.sampled_from([0.0, 2.5]),
       instances=st.integers(1, 2), seed=st.integers(0, 5), ahead=st.booleans())
def test_both_engines_agree_on_a_closed_loop_with_a_client_side(side, cost, clients, think, instances, seed, ahead):
    """A client sends its next request when its last byte arrives -- or when it gives up."""
    config = ClosedLoopConfig(clients=clients, num_requests=12, think_ms=think,
                              prompt={"dist": "uniform", "low": 1, "high": 40},
                              output={"dist": "uniform", "low": 1, "high": 30})

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=2, async_scheduling=ahead)), LinearCostModel(cost),
                PagedKVCache(200, 4))

    runs = []
    for engine in ENGINES:
        workload = make_closed_loop_workload(config)
        runs.append(run_cluster(workload.requests(seed), make, instances,
                                RoundRobinRouter() if instances > 1 else None, engine=engine, workload=workload,
                                client_side=side))
    compare_runs(*runs, rel=1e-12)
    req = runs[0].requests
    assert req["id"].size == 12
    # each client's next request is sent when the previous one's last byte arrived (or it gave up)
    for client in set(req["client"].tolist()):
        mine = sorted((s, d) for s, d, c in zip(req["sent_ms"].tolist(), req["client_done_ms"].tolist(),
                                                req["client"].tolist()) if c == client)
        for (_, done), (sent, _) in zip(mine, mine[1:]):
            assert sent == done + think


# -- properties of runs with timeouts ----------------------------------------------------------------


@SETTINGS
@given(requests=requests_lists(max_size=12, max_prompt=40, max_output=60, all_at_zero=False), side=client_sides(),
       cost=dyadic_linear_costs(), max_seqs=st.integers(1, 4), ahead=st.booleans())
def test_an_aborted_request_holds_nothing_after_its_abort(requests, side, cost, max_seqs, ahead):
    """Seen iteration by iteration: an aborted request is in no running set from its abort on,
    the cache holds exactly what the running requests' counters say, and at the end nothing."""
    requests = with_classes(requests)
    check = IterationChecker(max_running=max_seqs, kv_blocks=400)
    seen: list = []

    def spy(instance, record):
        check(instance, record)
        seen.append((record.start_ms, set(record.running_ids)))

    kv = PagedKVCache(400, 4)
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=max_seqs, async_scheduling=ahead)),
                   LinearCostModel(cost), kv, check=spy, client_side=side)
    check_run(r, requests, max_running=max_seqs, kv_blocks=400)
    assert kv.num_used_blocks() == 0
    for rid, aborted, at in zip(r.requests["id"].tolist(), r.requests["aborted"].tolist(),
                                r.requests["finish_ms"].tolist()):
        if aborted:
            assert not any(rid in running for start, running in seen if start >= at), rid


class Spy:
    """Wraps a router; keeps what it saw of every instance at every call."""

    def __init__(self, inner):
        self.inner = inner
        self.seen: list = []

    def route(self, request, instances):
        self.seen.append((request.id, request.arrival_ms, [v.outstanding for v in instances]))
        return self.inner.route(request, instances)


@SETTINGS
@given(requests=requests_lists(max_size=14, max_prompt=40, max_output=40, all_at_zero=False),
       timeout=st.sampled_from([10.0, 25.5, 60.0]), cost=dyadic_linear_costs(), instances=st.integers(2, 3),
       ahead=st.booleans())
def test_routers_see_an_aborted_request_leave_at_its_abort(requests, timeout, cost, instances, ahead):
    """The outstanding count a router reads is the requests routed earlier that leave the
    instance after the arrival -- finished, or aborted (their finish_ms is the abort)."""
    side = ClientSide(client=ClientConfig(timeout_ms=timeout))

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=1, async_scheduling=ahead)), LinearCostModel(cost),
                PagedKVCache(400, 4))

    results = []
    for engine in ENGINES:
        spy = Spy(LeastOutstandingRouter())
        result = run_cluster(requests, make, instances, spy, engine=engine, client_side=side)
        req = result.requests
        leaves = {i: (k, f) for i, k, f in zip(req["id"].tolist(), req["instance"].tolist(), req["finish_ms"].tolist())}
        routed: list = []
        for rid, t, outstanding in spy.seen:
            expected = [0] * instances
            for other in routed:
                k, leave = leaves[other]
                if leave > t:
                    expected[k] += 1
            assert outstanding == expected, (engine, rid)
            routed.append(rid)
        results.append(result)
    compare_runs(*results, rel=1e-12)
    assert math.isfinite(results[0].metrics["makespan_ms"]) or results[0].metrics["finished"] == 0


# -- experiment files --------------------------------------------------------------------------------

EXPERIMENT = """
[workload]
kind = "synthetic"
num_requests = 40
prompt = {dist = "fixed", value = 200}
output = {dist = "fixed", value = 20}
arrival = "constant"
rate = 50

[scheduler]
kind = "continuous"
max_num_seqs = 4
"""


def write(tmp_path, text: str):
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT + text)
    return path


def test_a_frontend_table_with_no_keys_uses_the_documented_defaults(tmp_path):
    from schedlab.study.experiment import load, run_experiment

    results = run_experiment(load(write(tmp_path, "[frontend]\n")))
    run = results.all_runs()[0]
    # token_ms: vLLM PR #54628's median client - server TTFT gap, 11.0 ms at 512-token prompts, less
    # 1 ms of handling and 2 x 0.05 ms of network (tokenizing is inside vLLM 0.28's histogram)
    assert run.meta["frontend"] == {"network_ms": 0.05, "request_ms": 1.0, "tokenize_ms_per_token": 0.002,
                                    "token_ms": pytest.approx(9.9), "workers": 1}
    # every request: 0.05 ms of network, 1 + 200 x 0.002 ms of handling; 20 ms apart, none waits
    assert run.metrics["client"]["frontend_ms"]["p50"] == pytest.approx(1.45)
    assert run.metrics["client"]["frontend_ms"]["max"] == pytest.approx(1.45)
    assert run.metrics["client"]["ttft_ms"]["mean"] == pytest.approx(run.metrics["ttft_ms"]["mean"] + 1.45 + 9.9
                                                                     + 0.05)


def test_timeouts_come_from_the_client_table_per_class(tmp_path):
    from schedlab.study.experiment import load, run_experiment

    path = write(tmp_path, "[client]\ntimeout_ms = 1e9\nclasses = {default = {timeout_ms = 50}}\n"
                           "[cost_model]\nkind = \"linear\"\ndecode_ms_per_step = 20\n")
    run = run_experiment(load(path)).all_runs()[0]
    assert run.meta["client"]["classes"] == {"default": {"timeout_ms": 50}}
    assert run.metrics["timed_out"] == 40 == run.metrics["aborted"]   # 20 tokens x 20 ms > 50 ms
    assert run.metrics["finished"] == 0


@pytest.mark.parametrize("text, message", [
    ("[frontend]\nnetwork = 1\n", r"exp.toml: \[frontend\]: unknown key 'network' \(did you mean 'network_ms'\?\)"),
    ("[frontend]\nworkers = -1\n", r"\[frontend\]: workers: must be >= 0"),
    ("[client]\ntimeout_ms = 0\n", r"\[client\]: timeout_ms: must be > 0"),
    ("[client]\nclasses = {default = {timeout = 5}}\n", r"\[client\]: classes: default: unknown key 'timeout'"),
    ("[frontend]\nnetwork_ms = 2\n[client]\ntimeout_ms = 1.5\n",
     r"\[client\]: timeout_ms: must be longer than the network hop \(\[frontend\] network_ms = 2\), got 1.5"),
])
def test_bad_client_side_tables_are_refused_by_name(tmp_path, text, message):
    from schedlab.errors import ConfigError
    from schedlab.study.experiment import load

    with pytest.raises(ConfigError, match=message):
        load(write(tmp_path, text))


def test_a_closed_loop_bounded_only_by_a_long_duration_stops_at_the_request_cap(monkeypatch):
    """duration_ms = 1e11 with quick answers would send billions of requests (the run went on
    for minutes): past a run's most requests the loop stops with an error saying what to set."""
    from schedlab.errors import WorkloadError
    from schedlab_plugins.workloads import closed_loop

    monkeypatch.setattr(closed_loop, "MAX_REQUESTS", 5)  # (10**7 in earnest)
    config = ClosedLoopConfig(clients=2, duration_ms=1e11, prompt={"dist": "fixed", "value": 10},
                              output={"dist": "fixed", "value": 2})
    workload = make_closed_loop_workload(config)
    sent = list(workload.requests(0))
    assert [r.id for r in sent] == [0, 1]
    sent += workload.on_finish(sent[0], 10.0) + workload.on_finish(sent[1], 11.0)  # ids 2, 3
    sent += workload.on_finish(sent[2], 20.0)                                     # id 4, the fifth
    assert [r.id for r in sent] == [0, 1, 2, 3, 4]
    with pytest.raises(WorkloadError, match=r"closed_loop: duration_ms = 1e\+11 would send more than 5 requests "
                                            r"\(a run's most\); set num_requests or a shorter duration"):
        workload.on_finish(sent[3], 21.0)
