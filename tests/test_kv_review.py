"""Fixes from a review of the KV caches and what uses them: vLLM V0's watermark turns away a
preempted request that can never come back (it stalled the instance), ``swap_full = "fail"``
without swap space is refused when built, and the kit notices swap space never given back."""

from __future__ import annotations

import pytest

from schedlab.errors import ConfigError, StallError
from schedlab.model import Request
from schedlab.testing import check_run, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.schedulers.presets import VllmV0Config

ENGINES = ("fast", "reference")


def cost():
    return LinearCostModel(LinearConfig())


@pytest.mark.parametrize("engine", ENGINES)
def test_vllm_v0_turns_away_a_preempted_request_whose_recompute_never_fits(engine):
    """25 blocks of 2 tokens, watermark 0.25: 6 kept free, 19 above it. X (prompt 30, output 10)
    passes V0's arrival check (its prompt's 15 blocks <= 19; the whole 39 tokens' 20 blocks <= 25:
    decodes may take every block), grows into the watermark, is preempted as the newest request,
    and its recompute of 39 tokens needs 20 blocks > 19: V0's can_allocate says NEVER and ignores
    it. schedlab kept it at the head of the queue and the instance stalled."""
    config = VllmV0Config(max_num_seqs=4, max_num_batched_tokens=64, watermark=0.25)   # recompute
    requests = [Request(0, 0.0, 2, 20), Request(1, 1.0, 30, 10)]
    result = run_engine(requests, ContinuousScheduler(config), cost(), PagedKVCache(25, 2), engine=engine)
    check_run(result, requests, kv_blocks=25, rejections="any")   # (turned away after it was served: V0's way)
    assert result.counters["num_preemptions"] >= 1 and result.metrics["rejected"] == 1
    reasons = result.metrics["rejection_reasons"]
    assert list(reasons) == ["its recompute of # tokens needs # KV blocks but the cache has # above the "
                             "watermark (vLLM V# ignores it: can_allocate says NEVER)"]   # (digits as #)
    assert result.requests["rejected"].tolist() == [0, 1]
    assert result.requests["generated_tokens"].tolist()[0] == 20   # Y is served whole
    scheduler = ContinuousScheduler(config)   # the numbers: 39 tokens (prompt 30 + 9 made) in 20 blocks > 19
    x = type("Seq", (), {"num_tokens": 39, "request": requests[1]})()
    assert scheduler._recompute_never_fits(PagedKVCache(25, 2), x, 0) == (
        "its recompute of 39 tokens needs 20 KV blocks but the cache has 19 above the watermark (vLLM V0 ignores "
        "it: can_allocate says NEVER)")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_swapped_request_that_can_never_come_back_says_why_the_run_stalls(engine):
    """The swap form: vLLM V0's _can_swap answers LATER for ever too (it hangs), so the run stalls --
    now saying which request and why. A holds all 100 blocks (399 tokens of 4) when B, more
    important, preempts it; 1 block is the watermark."""
    a = Request(0, 0.0, 8, 392, priority=2)
    b = Request(1, 0.4 + 8 * 389 + 0.5, 4, 3, priority=0)
    config = VllmV0Config(max_num_seqs=4, max_num_batched_tokens=512, preemption="swap", policy="priority",
                          priority_preemption=True)
    kv = PagedKVCache(100, 4, swap_blocks=200, bytes_per_block=2 ** 20, host_link_gbps=1.0)
    with pytest.raises(StallError, match=r"request 0 is swapped out holding 100 KV blocks, more than the 99 above "
                                         r"the watermark: vLLM V0's _can_swap answers LATER for ever"):
        run_engine([a, b], ContinuousScheduler(config), cost(), kv, engine=engine)


def test_swap_full_fail_without_swap_space_is_refused_when_built():
    """The note said "every preemption recomputes"; the first preemption then failed the run with
    "swap space is full" -- there was none."""
    scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow",
                                                     preemption="swap", swap_full="fail"))
    kv = PagedKVCache(12, 4)
    assert scheduler.setting_notes(kv) == []
    with pytest.raises(ConfigError, match=r"preemption = 'swap' with swap_full = 'fail' and the KV cache "
                                          r"\(PagedKVCache\) has no swap space: the first preemption would fail"):
        run_engine([Request(i, 0.0, 8, 30) for i in range(4)], scheduler, cost(), kv)
    assert scheduler.kv_problem(PagedKVCache(12, 4, swap_blocks=8, bytes_per_block=0)) is None
    recompute = ContinuousScheduler(ContinuousConfig(allocation="grow", preemption="swap"))
    assert recompute.kv_problem(kv) is None and "every preemption recomputes" in recompute.setting_notes(kv)[0]


class LeakySwap(PagedKVCache):
    """A plugin's cache whose free_swapped forgets to give its copy's swap blocks back."""

    def free_swapped(self, seq):
        seq.kv_state = None


def test_the_kit_notices_swap_space_never_given_back():
    """A request whose client leaves while it is swapped out: the leaky cache passed check_run."""
    config = ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow", preemption="swap")
    for timeout in range(20, 400, 5):
        requests = [Request(i, 0.0, 8, 30, timeout_ms=float(timeout) if i == 3 else None) for i in range(4)]
        kv = LeakySwap(12, 4, swap_blocks=40, bytes_per_block=2 ** 20, host_link_gbps=1.0)
        result = run_engine(requests, ContinuousScheduler(config), cost(), kv)
        if kv.swap_used:
            break
    assert kv.swap_used and result.metrics["aborted"] == 1
    with pytest.raises(AssertionError, match=rf"{kv.swap_used} swap blocks still held after the run"):
        check_run(result, requests, kv_blocks=12)
    sound = PagedKVCache(12, 4, swap_blocks=40, bytes_per_block=2 ** 20, host_link_gbps=1.0)
    check_run(run_engine(requests, ContinuousScheduler(config), cost(), sound), requests, kv_blocks=12)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_vllm_presets_watermark_is_v1s_kept_only_while_a_request_runs(engine):
    """vLLM 0.33's --watermark (KVCacheManager.allocate_slots, has_scheduled_reqs=bool(self.running))
    keeps blocks free only when a waiting request is admitted beside a running one, and never turns
    a request away. 100 blocks of 4, watermark 0.1 (10 blocks): A, 383 tokens (96 blocks) at most,
    alone is served -- schedlab turned it away on arrival, as V0 does (96 > 90). B (4 tokens + 1)
    arrives while A holds 95 blocks (its 376 prompt tokens and a slot): 5 free, 2 + 10 > 5, so B
    waits for A to finish; without a watermark it joins at once."""
    from schedlab_plugins.schedulers.presets import VllmConfig

    a, b = Request(0, 0.0, 376, 8), Request(1, 50.0, 4, 4)
    config = VllmConfig(max_num_seqs=4, max_num_batched_tokens=512, watermark=0.1)
    result = run_engine([a, b], ContinuousScheduler(config), cost(), PagedKVCache(100, 4), engine=engine)
    check_run(result, [a, b], kv_blocks=100)
    assert result.metrics["rejected"] == 0
    first_scheduled, finish = result.requests["first_scheduled_ms"], result.requests["finish_ms"]
    assert first_scheduled[1] >= finish[0]   # B waited for A's blocks: the watermark held while A ran
    without = run_engine([a, b], ContinuousScheduler(VllmConfig(max_num_seqs=4, max_num_batched_tokens=512)), cost(),
                         PagedKVCache(100, 4), engine=engine)
    assert without.requests["first_scheduled_ms"][1] < without.requests["finish_ms"][0]   # no watermark: B joins
    # V0 (the continuous default) keeps its rule: turned away on arrival against the pool less the watermark
    v0 = run_engine([a], ContinuousScheduler(ContinuousConfig(watermark=0.1, allocation="grow")), cost(),
                    PagedKVCache(100, 4), engine=engine)
    assert v0.metrics["rejected"] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_the_vllm_presets_watermark_lets_a_lone_swapped_request_back(engine):
    """With V1's watermark a request larger than the pool less the watermark is served; swapped out
    (preemption = "swap"), it came back only past the whole watermark, which an empty pool of 16
    blocks less 4 never has for its 13: the run stalled. Alone, it keeps none, as at admission."""
    from schedlab_plugins.schedulers.presets import VllmConfig

    requests = [Request(0, 0.0, 4, 20), Request(1, 0.0, 36, 20)]
    config = VllmConfig(max_num_seqs=4, max_num_batched_tokens=64, watermark=0.3, preemption="swap",
                        async_scheduling=False)
    kv = PagedKVCache(16, 4, swap_blocks=64, bytes_per_block=2 ** 20)
    result = run_engine(requests, ContinuousScheduler(config), cost(), kv, engine=engine)
    check_run(result, requests, kv_blocks=16)
    assert result.counters["swap_preemptions"] == 1 and result.metrics["rejected"] == 0
    assert result.requests["generated_tokens"].tolist() == [20, 20]
