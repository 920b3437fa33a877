"""Invariants of every run, over random workloads and configurations (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.model import Request
from schedlab.testing import examples, IterationChecker, check_run, compare_runs, requests_lists, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, StaticConfig, StaticScheduler

SETTINGS = settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def continuous(draw):
    seqs = draw(st.integers(1, 8))
    allocation = draw(st.sampled_from(["reserve", "grow"]))
    return ContinuousConfig(
        max_num_seqs=seqs, max_num_batched_tokens=draw(st.integers(max(seqs, 16), 200)),
        chunked_prefill=draw(st.booleans()), allocation=allocation,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5, 17])),
        preemption=draw(st.sampled_from(["recompute", "swap"])) if allocation == "grow" else "recompute",
        prefill_first=draw(st.booleans()), policy=draw(st.sampled_from(["fcfs", "priority"])),
    )


@SETTINGS
@given(requests_lists(max_size=14, priorities=True), continuous(), st.integers(1, 8), st.integers(6, 80))
def test_continuous_runs_keep_every_limit(requests, cfg, block_size, num_blocks):
    """Every request finishes exactly once with exactly its tokens (or is rejected with a
    reason); running <= max_num_seqs and tokens <= budget in every iteration; KV blocks in use
    never exceed the cache; causality holds; no request is preempted twice with the cache
    unchanged."""
    check = IterationChecker(max_running=cfg.max_num_seqs, token_budget=cfg.max_num_batched_tokens,
                             kv_blocks=num_blocks)
    kv = PagedKVCache(num_blocks, block_size, swap_blocks=16, bytes_per_block=1000, host_link_gbps=1.0)
    result = run_engine(requests, ContinuousScheduler(cfg), kv=kv, check=check)
    check_run(result, requests, max_running=cfg.max_num_seqs, kv_blocks=num_blocks)
    assert check.iterations == result.metrics["iterations"]


@SETTINGS
@given(requests_lists(max_size=14), st.integers(1, 6), st.integers(1, 8), st.integers(6, 80))
def test_static_runs_keep_every_limit(requests, batch, block_size, num_blocks):
    check = IterationChecker(max_running=batch, kv_blocks=num_blocks)
    result = run_engine(requests, StaticScheduler(StaticConfig(batch_size=batch)),
                        kv=PagedKVCache(num_blocks, block_size), check=check)
    check_run(result, requests, max_running=batch, kv_blocks=num_blocks)


@SETTINGS
@given(requests_lists(max_size=12), continuous(), st.integers(8, 80))
def test_same_inputs_same_results(requests, cfg, num_blocks):
    a = run_engine(requests, ContinuousScheduler(cfg), kv=PagedKVCache(num_blocks, 4, swap_blocks=8))
    b = run_engine(requests, ContinuousScheduler(cfg), kv=PagedKVCache(num_blocks, 4, swap_blocks=8))
    compare_runs(a, b, rel=0.0)


@SETTINGS
@given(requests_lists(max_size=16, all_at_zero=True, max_tokens=False), st.integers(1, 6),
       st.sampled_from([0.125, 1.0, 8.0]))
def test_continuous_makespan_never_exceeds_static(requests, slots, iteration_ms):
    """All requests at t=0 and a batch-independent cost (every iteration takes the same
    time): refilling slots at every iteration (continuous) finishes no later than waiting for
    whole batches (static) with the same number of slots."""
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.0, decode_ms_per_step=0.0, base_ms=iteration_ms))
    budget = sum(r.prompt_tokens for r in requests) + slots
    static = run_engine(requests, StaticScheduler(StaticConfig(batch_size=slots)), cost)
    cont = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=slots, max_num_batched_tokens=budget)),
                      cost)
    assert cont.metrics["makespan_ms"] <= static.metrics["makespan_ms"]


@SETTINGS
@given(requests_lists(max_size=16, all_at_zero=True, max_tokens=False), st.integers(1, 6),
       st.sampled_from([0.0, 0.05, 0.5]), st.sampled_from([1.0, 8.0]))
def test_continuous_never_needs_more_iterations_than_static(requests, slots, prefill, decode):
    """With the seed's cost shape the *iteration count* still never grows; the makespan can:
    decode cost is charged to every iteration that decodes, and static batching's
    prefill-only iterations decode nothing. Four 1-token prompts with outputs 1, 2, 2, 2, two
    slots, prefill free, 1 ms decode, 0.125 ms per iteration: static runs prefill, decode,
    prefill, decode = 2.5 ms; continuous staggers the last two requests: prefill, then three
    mixed iterations = 3.5 ms. Both need 4 iterations."""
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=prefill, decode_ms_per_step=decode, base_ms=0.125))
    budget = sum(r.prompt_tokens for r in requests) + slots
    static = run_engine(requests, StaticScheduler(StaticConfig(batch_size=slots)), cost)
    cont = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=slots, max_num_batched_tokens=budget)),
                      cost)
    assert cont.metrics["iterations"] <= static.metrics["iterations"]


@SETTINGS
@given(requests_lists(min_size=2, max_size=14, all_at_zero=False, max_tokens=False),
       st.integers(1, 4), st.sampled_from([0.5, 0.75, 0.875]))
def test_compressing_arrivals_never_shortens_a_wait_by_more_than_one_iteration(requests, slots, factor):
    """FCFS continuous batching with a constant iteration time T: bringing every arrival
    earlier (times x factor < 1) can lower a request's queue wait by at most T, the
    admission granularity."""
    T = 8.0
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.0, decode_ms_per_step=0.0, base_ms=T))
    sched = lambda: ContinuousScheduler(ContinuousConfig(max_num_seqs=slots, max_num_batched_tokens=10_000))  # noqa: E731
    squeezed = [Request(r.id, r.arrival_ms * factor, r.prompt_tokens, r.output_tokens) for r in requests]
    base = run_engine(requests, sched(), cost)
    fast = run_engine(squeezed, sched(), cost)
    wait = base.requests["first_scheduled_ms"] - base.requests["arrival_ms"]
    wait_squeezed = fast.requests["first_scheduled_ms"] - fast.requests["arrival_ms"]
    assert (wait_squeezed >= wait - T - 1e-9).all(), (wait.tolist(), wait_squeezed.tolist())


@settings(max_examples=examples(40), deadline=None)
@given(requests_lists(max_size=10, all_at_zero=True, max_tokens=False, min_output=2, max_output=50))
def test_ten_times_longer_outputs_take_the_same_number_of_events(requests):
    """A decode-only workload (everything admitted at t=0, outputs of at least 2 tokens so
    every request decodes, no memory pressure): the fast
    engine's scheduler events depend on when sequences finish, not on how many tokens they
    generate, so x10 outputs leave the event count unchanged while iterations grow ~x10."""
    longer = [Request(r.id, 0.0, r.prompt_tokens, r.output_tokens * 10) for r in requests]
    sched = lambda: ContinuousScheduler(ContinuousConfig(max_num_seqs=len(requests)))  # noqa: E731
    a = run_engine(requests, sched(), kv_blocks=100_000)
    b = run_engine(longer, sched(), kv_blocks=100_000)
    assert a.meta["events"] == b.meta["events"]
    assert b.metrics["iterations"] >= 9 * a.metrics["iterations"]
