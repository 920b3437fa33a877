"""Prefix caching and chunked prefill in the engine: hand-computed runs and differential checks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.model import Request
from schedlab.testing import blocks_for_largest, check_run, compare_runs, examples, requests_lists, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

SETTINGS = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
COST = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0))


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_two_requests_sharing_a_three_block_prefix(engine):
    # Blocks of 4 tokens; both prompts are 14 tokens whose first 12 (3 blocks) are a shared
    # system prompt. Request 0 at t=0: prefill 14 tokens (7 ms) -> first token at 7, one decode
    # step -> finishes at 11, its 3 full prefix blocks stay cached. Request 1 arrives at 10 and
    # is admitted at the boundary 11: 12 tokens hit, it prefills 2 (1 ms) -> first token at 12
    # (TTFT 2 instead of 8), finishes at 16.
    reqs = [Request(0, 0.0, 14, 2, prefix_group="sys", prefix_tokens=12),
            Request(1, 10.0, 14, 2, prefix_group="sys", prefix_tokens=12)]
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, allocation="grow"))
    r = run_engine(reqs, sched, COST, PrefixKVCache(64, 4), engine=engine)
    assert by_id(r, "first_token_ms") == {0: 7.0, 1: 12.0}
    assert by_id(r, "finish_ms") == {0: 11.0, 1: 16.0}
    assert by_id(r, "cached_tokens") == {0: 0, 1: 12}
    p = r.metrics["prefix_cache"]
    assert (p["queries"], p["hits"]) == (28, 12)
    assert p["hit_rate"] == pytest.approx(12 / 28)
    plain = run_engine(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=4, allocation="grow")), COST,
                       PagedKVCache(64, 4), engine=engine)
    assert by_id(plain, "first_token_ms") == {0: 7.0, 1: 18.0}


def test_repeated_workload_hit_rate_matches_a_hand_count():
    # Three prompts with Mooncake-style hash ids (one id per 8 tokens), cache blocks of 4: the
    # first pass computes everything; the same prompts again an hour later hit every full block
    # below the prompt's last token: floor((prompt - 1) / 4) * 4 tokens each.
    prompts = [(21, (1, 2, 3)), (16, (1, 2)), (9, (7, 8))]
    reqs = []
    for rep, t in ((0, 0.0), (1, 3.6e6)):
        for i, (p, ids) in enumerate(prompts):
            reqs.append(Request(len(reqs), t + i, p, 3, block_hashes=ids, hash_block_tokens=8))
    r = run_engine(reqs, ContinuousScheduler(ContinuousConfig(allocation="grow")), COST, PrefixKVCache(10_000, 4))
    # first pass: request 1 shares ids 1, 2 with request 0: tokens 0..15 -> blocks of 4 ending
    # before token 15 -> 12 tokens; request 2 shares nothing.
    hits_first = 0 + 12 + 0
    hits_second = (20 // 4) * 4 + (15 // 4) * 4 + (8 // 4) * 4   # 20 + 12 + 8
    p = r.metrics["prefix_cache"]
    assert p["hits"] == hits_first + hits_second == 52
    assert p["queries"] == 2 * (21 + 16 + 9)
    assert sorted(r.requests["cached_tokens"].tolist()) == [0, 0, 8, 12, 12, 20]


@SETTINGS
@given(requests_lists(max_size=10, max_prompt=48), st.integers(1, 6), st.integers(1, 8), st.integers(0, 2),
       st.booleans(), st.sampled_from(["fast", "reference"]))
def test_prefix_caching_without_shared_prefixes_changes_nothing(requests, seqs, block_size, spare_factor,
                                                                chunked, engine):
    """No shared prefixes and no preemption (reservation): the prefix cache only ever misses,
    so the run is identical to one without it, apart from the lookup counters."""
    need = blocks_for_largest(requests, block_size)
    blocks = need * (1 + spare_factor)
    cfg = ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=64, chunked_prefill=chunked)
    with_cache = run_engine(requests, ContinuousScheduler(cfg), COST, PrefixKVCache(blocks, block_size), engine=engine)
    without = run_engine(requests, ContinuousScheduler(cfg), COST, PagedKVCache(blocks, block_size), engine=engine)
    assert with_cache.metrics["prefix_cache"]["hits"] == 0
    for result in (with_cache, without):
        result.counters["prefix_queries"] = 0
        result.metrics["prefix_cache"] = {}
    compare_runs(with_cache, without, rel=0.0)


@SETTINGS
@given(requests_lists(max_size=10, max_prompt=48), st.integers(1, 6), st.sampled_from(["reserve", "grow"]),
       st.sampled_from(["fast", "reference"]))
def test_chunking_with_room_for_every_prompt_changes_nothing(requests, seqs, allocation, engine):
    """A token budget that holds every prompt of the run at once never splits one, so chunked
    prefill gives exactly the unchunked run. (A budget that merely holds each prompt alone can
    differ: chunking splits a prompt that does not fit what earlier admissions left.)"""
    budget = sum(r.prompt_tokens + r.max_output_tokens for r in requests) + seqs
    runs = [run_engine(requests, ContinuousScheduler(ContinuousConfig(
        max_num_seqs=seqs, max_num_batched_tokens=budget, allocation=allocation, chunked_prefill=chunked)),
        COST, PagedKVCache(4096, 4), engine=engine) for chunked in (True, False)]
    compare_runs(*runs, rel=0.0)
    assert runs[0].requests["prefill_chunks"].max() == 1


@SETTINGS
@given(requests_lists(max_size=10, max_prompt=80, prefix_groups=2), st.integers(1, 6), st.integers(8, 60),
       st.integers(1, 40), st.integers(1, 8))
def test_chunked_prefill_respects_the_budget_and_hits_stay_below_the_prompt(requests, seqs, budget, threshold,
                                                                           block_size):
    from schedlab.testing import IterationChecker

    budget = max(budget, seqs)
    cfg = ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, chunked_prefill=True,
                           long_prefill_token_threshold=threshold, allocation="grow")
    need = blocks_for_largest(requests, block_size)
    check = IterationChecker(max_running=seqs, token_budget=budget, kv_blocks=need * 2)
    r = run_engine(requests, ContinuousScheduler(cfg), COST, PrefixKVCache(need * 2, block_size), check=check)
    check_run(r, requests, max_running=seqs, kv_blocks=need * 2)
    req = r.requests
    fresh = req["preemptions"] == 0
    assert (req["cached_tokens"][fresh] <= req["prompt_tokens"][fresh] - 1).all()
    assert (req["cached_tokens"] % block_size == 0).all()
