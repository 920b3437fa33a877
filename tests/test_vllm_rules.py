"""vLLM V1's scheduling rules (0.33), each on a small scenario computed by hand, scheduling
synchronously (``tests/test_async_scheduling.py`` has the same rules planned ahead).

Every iteration costs exactly 1 ms, so times count iterations. Block sizes and pools are tiny
so that each rule decides the outcome. The scenarios are the ones the differential harness
(``tools/vllm_diff.py``) found where schedlab and vLLM's own ``Scheduler`` disagreed.
"""

from __future__ import annotations

import math

import pytest

from schedlab.model import Request
from schedlab.testing import IterationChecker, check_run, compare_runs, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import ContinuousScheduler
from schedlab_plugins.schedulers.presets import VllmConfig

ONE_MS = LinearConfig(prefill_ms_per_token=0.0, decode_ms_per_step=0.0, base_ms=1.0)
ENGINES = ["fast", "reference"]


def synchronous(**settings) -> VllmConfig:
    """The ``vllm`` preset scheduling synchronously, as vLLM before 0.13 and the harness on a CPU."""
    return VllmConfig(async_scheduling=False, **settings)


def simulate(requests, config, kv, engine="fast"):
    result = run_engine(requests, ContinuousScheduler(config), LinearCostModel(ONE_MS), kv, engine=engine)
    check_run(result, requests, kv_blocks=kv.num_blocks)
    return {int(i): row for i, row in zip(result.requests["id"], _rows(result))}, result


def _rows(result):
    r = result.requests
    keys = ("first_scheduled_ms", "first_token_ms", "finish_ms", "preemptions")
    return [dict(zip(keys, values)) for values in zip(*(r[k].tolist() for k in keys))]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_older_prefill_preempts_the_newer_decode_not_itself(engine):
    """A (older) is still prefilling in 4-token chunks when B (newer) decodes. At t=1 A's
    chunk takes the last block first (admission order), so B's decode finds none and B --
    the newest running request -- is preempted, once. Before the fix decodes went first and
    A could only preempt itself, again and again, until B finished.

    block 4, 3 blocks, budget 8, threshold 4:
    t=0  admit A (4 of 12, 1 block), B (4, 1 block); B's first token at 1
    t=1  A chunk 4 (block 3 of 3); B needs block 2 -> victim running[-1] = B: preempted
    t=2  A chunk 4 (B's freed block); A done: first token and finish at 3; B's 5 tokens
         need 2 blocks, none free
    t=3  B alone: threshold ignored, recomputes 5 tokens; second token at 4, last (6th) at 8
    """
    a = Request(0, 0.0, prompt_tokens=12, output_tokens=1)
    b = Request(1, 0.0, prompt_tokens=4, output_tokens=6)
    config = synchronous(max_num_seqs=4, max_num_batched_tokens=8, long_prefill_token_threshold=4)
    rows, result = simulate([a, b], config, PagedKVCache(3, 4), engine)
    assert rows[0] == dict(first_scheduled_ms=0.0, first_token_ms=3.0, finish_ms=3.0, preemptions=0)
    assert rows[1] == dict(first_scheduled_ms=0.0, first_token_ms=1.0, finish_ms=8.0, preemptions=1)
    assert result.counters["recomputed_tokens"] == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_priority_victim_may_be_already_scheduled(engine):
    """vLLM's priority policy preempts ``max(running, key=(priority, arrival))`` even when
    that request was scheduled earlier in the same step: its decode is withdrawn.

    block 2, 6 blocks, budget 8, threshold 2; X (priority 1) decodes, Y (priority 0) prefills:
    t=0  X alone (2 tokens, 1 block); token 1 at 1
    t=1  X decodes (block 2); Y admitted (2 of 8: whole prompt needs 4 of 4 free blocks)
    t=2  X (no new block), Y chunk (block 4)
    t=3  X (block 5), Y chunk (block 6)
    t=4  X decodes (no new block needed); Y's chunk finds no block: victim X, scheduled,
         withdrawn and preempted; Y's last chunk: first token and finish at 5
    t=5  X alone, recomputes 6 tokens: token 5 at 6, its 8th and last at 9
    Before the fix Y, the only unscheduled request, preempted itself.
    """
    x = Request(0, 0.0, prompt_tokens=2, output_tokens=8, priority=1)
    y = Request(1, 1.0, prompt_tokens=8, output_tokens=1, priority=0)
    config = synchronous(max_num_seqs=4, max_num_batched_tokens=8, long_prefill_token_threshold=2,
                        policy="priority")
    rows, _ = simulate([x, y], config, PagedKVCache(6, 2), engine)
    assert rows[0] == dict(first_scheduled_ms=0.0, first_token_ms=1.0, finish_ms=9.0, preemptions=1)
    assert rows[1] == dict(first_scheduled_ms=1.0, first_token_ms=5.0, finish_ms=5.0, preemptions=0)


@pytest.mark.parametrize("engine", ENGINES)
def test_admission_waits_until_the_whole_prompt_fits(engine):
    """``reserve_full_prompt`` (vLLM ``scheduler_reserve_full_isl``): B's first 3-token chunk
    would fit at t=2, its 12-token prompt (3 blocks) does not, so B waits for A to finish.

    block 4, 4 blocks, budget 4: A (8 tokens) prefills at t=0 and t=1, decodes at t=2
    (block 3) and t=3, finishes at 4; B is admitted at 4 and prefills 4 tokens at 4, 5, 6.
    With the rule off, B is admitted at t=2 with 3 tokens and preempts itself at t=3.
    """
    a = Request(0, 0.0, prompt_tokens=8, output_tokens=3)
    b = Request(1, 0.0, prompt_tokens=12, output_tokens=1)
    config = synchronous(max_num_seqs=4, max_num_batched_tokens=4)
    rows, _ = simulate([a, b], config, PagedKVCache(4, 4), engine)
    assert rows[0] == dict(first_scheduled_ms=0.0, first_token_ms=2.0, finish_ms=4.0, preemptions=0)
    assert rows[1] == dict(first_scheduled_ms=4.0, first_token_ms=7.0, finish_ms=7.0, preemptions=0)

    first_chunk_only = synchronous(max_num_seqs=4, max_num_batched_tokens=4, reserve_full_prompt=False)
    rows, _ = simulate([a, b], first_chunk_only, PagedKVCache(4, 4), engine)
    assert rows[1]["first_scheduled_ms"] == 2.0 and rows[1]["preemptions"] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lone_request_ignores_the_long_prefill_threshold(engine):
    """vLLM 0.33: with at most one request running or waiting there is nobody for the
    threshold to protect. 498 tokens, budget 128, threshold 100: 4 chunks, not 5."""
    alone = [Request(0, 0.0, prompt_tokens=498, output_tokens=1)]
    config = synchronous(max_num_seqs=4, max_num_batched_tokens=128, long_prefill_token_threshold=100)
    rows, result = simulate(alone, config, PagedKVCache(64, 16), engine)
    assert rows[0]["first_token_ms"] == 4.0
    assert result.counters["iterations"] == 4
    # with a second request waiting, both are held to 100 tokens per iteration:
    # t=0 A 100 + B 28 (budget), then A 100 + B 28 twice more, A 100 + B 16 (B done at 4),
    # A's last 98 tokens at t=4: first token at 5
    pair = alone + [Request(1, 0.0, prompt_tokens=100, output_tokens=1)]
    rows, _ = simulate(pair, config, PagedKVCache(64, 16), engine)
    assert rows[0]["first_token_ms"] == 5.0 and rows[1]["first_token_ms"] == 4.0


def test_freed_partial_blocks_are_reused_before_cached_ones():
    """vLLM 0.33 ``BlockPool.free_blocks``: a block without a hash (not full) goes to the
    head of the free queue, so the next allocation takes it instead of evicting a cached
    prefix. One at a time, 3 blocks of 4 tokens:

    P (the 4-token shared prefix) leaves its block cached: free queue [2 anonymous, P's block].
    A (6 private tokens) takes the 2 anonymous blocks; freeing them puts its partial block at
    the head and its full one at the tail: [partial, P's block, A's full block]. B (3 tokens)
    takes the partial block, so C still finds the prefix cached. Before the fix A's blocks
    both went to the tail and B evicted the prefix.
    """
    p = Request(0, 0.0, prompt_tokens=4, output_tokens=1, prefix_group="sys", prefix_tokens=4)
    a = Request(1, 0.0, prompt_tokens=6, output_tokens=1)
    b = Request(2, 0.0, prompt_tokens=3, output_tokens=1)
    c = Request(3, 0.0, prompt_tokens=6, output_tokens=1, prefix_group="sys", prefix_tokens=4)
    requests = [p, a, b, c]
    result = run_engine(requests, ContinuousScheduler(synchronous(max_num_seqs=1)), LinearCostModel(ONE_MS),
                        PrefixKVCache(3, 4))
    check_run(result, requests, kv_blocks=3)
    cached = dict(zip(result.requests["id"].tolist(), result.requests["cached_tokens"].tolist()))
    assert cached == {0: 0, 1: 0, 2: 0, 3: 4}


@pytest.mark.parametrize("reserve_full_prompt", [True, False])
def test_no_request_is_preempted_twice_by_the_old_self_preemption_loop(reserve_full_prompt):
    """The issue's loop: an older chunked prefill and a newer decode, one block short. The
    conformance checker sees every iteration and fails if a request is preempted twice with
    the KV cache unchanged -- which the old rules did (6 self-preemptions here)."""
    a = Request(0, 0.0, prompt_tokens=40, output_tokens=1)
    b = Request(1, 0.0, prompt_tokens=8, output_tokens=60)
    config = synchronous(max_num_seqs=4, max_num_batched_tokens=16, long_prefill_token_threshold=8,
                        reserve_full_prompt=reserve_full_prompt)
    checker = IterationChecker(kv_blocks=8, token_budget=16)
    result = run_engine([a, b], ContinuousScheduler(config), LinearCostModel(ONE_MS), PagedKVCache(8, 8),
                        check=checker)
    check_run(result, [a, b], kv_blocks=8)
    assert result.counters["num_preemptions"] <= 1
    reference = run_engine([a, b], ContinuousScheduler(config), LinearCostModel(ONE_MS), PagedKVCache(8, 8),
                           engine="reference")
    compare_runs(result, reference)


class SelfPreempting(ContinuousScheduler):
    """Preempts request 1 whenever it is prefilling (``rounds`` times, or for ever) and decodes
    the others: a preemption loop."""

    def __init__(self, config, rounds: float = math.inf):
        super().__init__(config)
        self.rounds = rounds

    def schedule(self, plan):
        for seq in list(plan.running):
            if seq.request.id == 1 and seq.status == "prefilling" and self.rounds > 0:
                self.rounds -= 1
                plan.preempt(seq)
                plan.decode_all()
                return
        super().schedule(plan)


def test_the_loop_checker_catches_a_loop():
    """A scheduler that preempts the same prefilling request every other iteration while the
    cache stays as it was must fail the check (the checker can fail)."""
    a = Request(0, 0.0, prompt_tokens=8, output_tokens=30)
    b = Request(1, 0.0, prompt_tokens=64, output_tokens=1)
    config = synchronous(max_num_seqs=4, max_num_batched_tokens=16, long_prefill_token_threshold=8)
    with pytest.raises(AssertionError, match="preempted twice"):
        run_engine([a, b], SelfPreempting(config), LinearCostModel(ONE_MS), PagedKVCache(64, 16),
                   check=IterationChecker())


def test_the_loop_check_can_be_turned_off():
    """``loops=False``: the loop above, three rounds of it, passes (the other limits are still
    checked); with the check on, the same run fails."""
    a = Request(0, 0.0, prompt_tokens=8, output_tokens=30)
    b = Request(1, 0.0, prompt_tokens=64, output_tokens=1)
    config = synchronous(max_num_seqs=4, max_num_batched_tokens=16, long_prefill_token_threshold=8)
    checker = IterationChecker(loops=False, token_budget=16)
    result = run_engine([a, b], SelfPreempting(config, rounds=3), LinearCostModel(ONE_MS), PagedKVCache(64, 16),
                        check=checker)
    assert result.counters["num_preemptions"] == 3 and checker.iterations == result.metrics["iterations"]
    with pytest.raises(AssertionError, match="preempted twice"):
        run_engine([a, b], SelfPreempting(config, rounds=3), LinearCostModel(ONE_MS), PagedKVCache(64, 16),
                   check=IterationChecker())


class _Steps:
    """A scheduler that notes each plan's prefills as (time, [(id, tokens), ...])."""

    def __init__(self, inner):
        self._inner, self.prefills = inner, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def schedule(self, plan):
        out = self._inner.schedule(plan)
        if plan.prefills:
            self.prefills.append((plan.now, [(s.request.id, n) for s, n in plan.prefills]))
        return out


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("chunked", [False, True])
def test_without_chunked_prefill_a_resumed_request_waits_for_a_budget_it_fits(engine, chunked):
    """Review vllm82: vLLM V1's waiting loop breaks when a request needs more tokens than the step
    has left and chunked prefill is off -- a resumed (preempted) one too. Block 2, 12 blocks, budget
    16 = max_model_len: C (6 + 10) runs; A (10 + 6) and B (1 + 8) join; at t=4 A needs a block and
    B is preempted (3 tokens computed), at t=5 C needs one and A is (14). At t=10 C finishes: A
    resumes with its 14 tokens, 2 left, and B's 3 wait for t=11 -- chunked, B takes 2 of them at
    t=10 and its last at 11 (schedlab chunked it with chunked prefill off too)."""
    c = Request(2, 0.0, prompt_tokens=6, output_tokens=10)
    a = Request(0, 1.0, prompt_tokens=10, output_tokens=6)
    b = Request(1, 2.0, prompt_tokens=1, output_tokens=8)
    config = synchronous(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=16, chunked_prefill=chunked)
    scheduler = _Steps(ContinuousScheduler(config))
    result = run_engine([c, a, b], scheduler, LinearCostModel(ONE_MS), PagedKVCache(12, 2), engine=engine)
    check_run(result, [c, a, b], kv_blocks=12)
    later = [(t, p) for t, p in scheduler.prefills if t >= 10]
    if chunked:
        assert later[:2] == [(10.0, [(0, 14), (1, 2)]), (11.0, [(1, 1)])]
    else:
        assert later[:2] == [(10.0, [(0, 14)]), (11.0, [(1, 3)])]
