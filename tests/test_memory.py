"""KV memory as the limit: preemption accounting, swap round trips, progress on hostile configs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.testing import check_run, examples, requests_lists, run_engine
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

SETTINGS = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tight_cache(requests, block_size, spare, *, swap=0):
    need = max(-(-(r.prompt_tokens + r.max_output_tokens - 1) // block_size) for r in requests)
    return PagedKVCache(need + spare, block_size, swap_blocks=swap, bytes_per_block=4096, host_link_gbps=1.0)


def unique_kv_work(result) -> int:
    """KV tokens a run must compute at least once: prompt + tokens - 1 per finished request
    (the last token's KV is never needed)."""
    r = result.requests
    ok = r["rejected"] == 0
    return int((r["prompt_tokens"][ok] + r["generated_tokens"][ok] - 1).sum())


@SETTINGS
@given(requests_lists(min_size=2, max_size=12, max_prompt=30, max_output=60), st.integers(1, 4),
       st.integers(0, 6), st.integers(2, 8), st.booleans(), st.sampled_from(["fast", "reference"]))
def test_recompute_redoes_exactly_the_tokens_it_lost(requests, block_size, spare, seqs, chunked, engine):
    """Every KV token computed is either a first computation or counted as recomputed, and the
    recomputed count equals the tokens preemptions threw away (no prefix cache to save any)."""
    cfg = ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=64, allocation="grow", chunked_prefill=chunked)
    kv = tight_cache(requests, block_size, spare)
    lost = []
    sched = ContinuousScheduler(cfg)
    original = sched._preempt

    def spy(plan, victim):
        lost.append(victim.num_computed_tokens)
        return original(plan, victim)

    sched._preempt = spy
    result = run_engine(requests, sched, kv=kv, engine=engine)
    check_run(result, requests, max_running=seqs, kv_blocks=kv.num_blocks)
    c = result.counters
    assert c["prefill_tokens"] + c["decode_tokens"] == unique_kv_work(result) + c["recomputed_tokens"]
    assert c["recomputed_tokens"] == sum(lost) == int(result.requests["recomputed_tokens"].sum())
    assert c["num_preemptions"] == len(lost) == int(result.requests["preemptions"].sum())


@SETTINGS
@given(requests_lists(min_size=2, max_size=12, max_prompt=30, max_output=60), st.integers(1, 4),
       st.integers(0, 6), st.integers(2, 8), st.sampled_from(["fast", "reference"]))
def test_swap_restores_exactly_what_it_saved(requests, block_size, spare, seqs, engine):
    """With ample swap space every preemption swaps: each block sent out comes back, nothing is
    recomputed, and the transfer time is the blocks moved over the host link."""
    cfg = ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=64, allocation="grow", preemption="swap")
    kv = tight_cache(requests, block_size, spare, swap=10_000)
    result = run_engine(requests, ContinuousScheduler(cfg), kv=kv, engine=engine)
    check_run(result, requests, max_running=seqs, kv_blocks=kv.num_blocks)
    c = result.counters
    assert c["recompute_preemptions"] == 0 and c["recomputed_tokens"] == 0
    assert c["swap_out_blocks"] == c["swap_in_blocks"]
    assert c["swap_preemptions"] == int(result.requests["swaps"].sum())
    assert c["prefill_tokens"] + c["decode_tokens"] == unique_kv_work(result)
    per_block_ms = 4096 / 1e9 * 1e3
    assert abs(c["swap_transfer_ms"] - (c["swap_out_blocks"] + c["swap_in_blocks"]) * per_block_ms) < 1e-9
    assert kv.swap_used == 0


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=120, max_output=80), st.integers(1, 4),
       st.integers(1, 4), st.integers(1, 6), st.sampled_from(["reserve", "grow"]),
       st.sampled_from(["recompute", "swap"]), st.booleans(), st.booleans())
def test_hostile_configs_always_finish(requests, block_size, num_blocks, seqs, allocation, preemption,
                                       chunked, prefill_first):
    """Tiny caches (down to one block), prompts far larger than the cache, tiny budgets: every
    request finishes or is rejected with a reason; no hang, no stall error."""
    if allocation == "reserve":
        preemption = "recompute"
    cfg = ContinuousConfig(max_num_seqs=seqs, max_num_batched_tokens=max(seqs, 8), allocation=allocation,
                           preemption=preemption, chunked_prefill=chunked, prefill_first=prefill_first)
    kv = PagedKVCache(num_blocks, block_size, swap_blocks=2, bytes_per_block=64, host_link_gbps=1.0)
    result = run_engine(requests, ContinuousScheduler(cfg), kv=kv)
    check_run(result, requests, max_running=seqs, kv_blocks=num_blocks)
    for rid, reason in result.rejections.items():
        assert reason


def test_preemption_storm_is_counted_not_hung():
    """Sixteen long requests on a cache that holds barely one: many preemptions, all finish."""
    from schedlab.model import Request

    requests = [Request(i, 0.0, 8, 200) for i in range(16)]
    kv = PagedKVCache(14, 16)  # 224 tokens: one request's 207 fits, two never do for long
    result = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=16, allocation="grow")), kv=kv)
    check_run(result, requests, kv_blocks=14)
    assert result.metrics["num_preemptions"] > 16
    assert result.metrics["preemptions"]["recomputed_tokens"] > 0


def test_a_scheduler_that_makes_no_progress_is_stopped_with_a_clear_error():
    """A third-party scheduler that admits a request and preempts it again every iteration
    never produces a token: the engine reports a stall instead of spinning forever."""
    import pytest

    from schedlab.errors import StallError
    from schedlab.model import Request

    class Flapper:
        def schedule(self, plan):
            for seq in list(plan.running):
                plan.preempt(seq)
            seq = plan.waiting.peek()
            if seq is not None:
                plan.admit(seq, 1)   # one prompt token at a time, thrown away next iteration

    with pytest.raises(StallError, match="without a new token|empty iterations"):
        run_engine([Request(0, 0.0, 64, 4)], Flapper(), kv=PagedKVCache(64, 16))
