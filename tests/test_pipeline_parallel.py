"""Pipeline parallelism (issue 19.3): the stages' clock by hand, batches in flight as vLLM's
batch queue keeps them, the fast engine against the reference engine, the rules every run
keeps, the cost models' stage split and the TOML layout.

Hand-computed cases use :class:`LinearParallelCost` over 2 stages: each stage takes half the
``linear`` model's iteration (0.5 ms per prompt token, 8 ms per decode step) and a stage sends
the next 0.25 ms + 0.0625 ms per token.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedlab.engine.stages import StageClock
from schedlab.model import Request
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import (
    RecordingRouter, blocks_for_largest, check_clients_gave_up, check_run, compare_runs, dyadic_linear_costs,
    examples, fast_run_agreeing_with_reference, requests_lists, small_closed_loop,
)
from schedlab.testing.parallel import LinearParallelCost, run_pipelined
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.routers import LeastKVRouter, LeastOutstandingRouter, RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

ENGINES = ("fast", "reference")


def instance(blocks: int = 64, *, stages: int = 2, max_num_seqs: int = 4, budget: int = 256, ahead: bool = False):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                                         allocation="grow", chunked_prefill=True,
                                                         async_scheduling=ahead))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                                  stages=stages, moe=False)
        return scheduler, cost, PagedKVCache(blocks, 16)
    return make


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def assert_requests(result, **columns) -> None:
    """Each column of ``result``'s request rows, per request id, is as given (``first_token_ms={0:
    9.25, 1: 13.25}``, ...)."""
    for column, expected in columns.items():
        assert by_id(result, column) == expected, column


# -- the stages' clock ----------------------------------------------------------------------------------------


def test_a_stage_takes_one_batch_at_a_time_in_launch_order():
    clock = StageClock(3)
    # batch 1 at 0: stage 0 0-2, send 1, stage 1 3-5, send, stage 2 6-8
    assert clock.launch(0.0, (2.0, 2.0, 2.0), 1.0) == 8.0
    # batch 2 at 0: stage 0 free at 2 -> 2-3; stage 1 (ready at 4) is busy until 5 -> 5-6; stage 2 until 8 -> 8-9
    assert clock.launch(0.0, (1.0, 1.0, 1.0), 1.0) == 9.0
    # batch 3 at 20, everything free: 20 + 3 stages + 2 sends
    assert clock.launch(20.0, (1.0, 1.0, 1.0), 0.5) == 24.0


# -- hand-computed runs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_crosses_both_stages_and_its_requests_wait_for_it(engine):
    # Two prompts of 8 at 0 in one batch: 16 tokens, 8 ms of iteration, 4 per stage; send 0.25 +
    # 0.0625 x 16 = 1.25 -> lands at 4 + 1.25 + 4 = 9.25 (first tokens). Nothing else can be
    # scheduled meanwhile (both requests are in flight). Their decodes: 8 ms -> 4 per stage,
    # send 0.375 -> 9.25 + 8.375 = 17.625.
    r = run_pipelined([Request(0, 0.0, 8, 2), Request(1, 0.0, 8, 2)], instance(), 2, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 9.25, 1: 9.25}
    assert by_id(r, "finish_ms") == {0: 17.625, 1: 17.625}
    assert r.counters["iterations"] == 2 and r.counters["busy_ms"] == 17.625


@pytest.mark.parametrize("engine", ENGINES)
def test_a_second_batch_fills_the_pipeline_behind_the_first(engine):
    # A token budget of 16 splits a burst: batch A (r0's 16-token prompt, 8 ms: 4 a stage, send
    # 1.25) launches at 0: stage 0 0-4, stage 1 5.25-9.25. Batch B (r1's prompt) launches at 0
    # too, right behind it: stage 0 4-8, stage 1 9.25-13.25. A lands at 9.25 and r0's decode
    # (8 ms: 4 a stage, send 0.3125) goes in: stage 0 9.25-13.25, stage 1 13.5625-17.5625. B lands
    # at 13.25, r1's decode: stage 0 13.25-17.25, stage 1 (busy until 17.5625) 17.5625-21.5625.
    requests = [Request(0, 0.0, 16, 2), Request(1, 0.0, 16, 2)]
    r = run_pipelined(requests, instance(budget=16), 2, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 9.25, 1: 13.25}
    assert by_id(r, "finish_ms") == {0: 17.5625, 1: 21.5625}
    # the instance was busy from 0 to 21.5625, each moment counted once
    assert r.counters["busy_ms"] == 21.5625 and r.counters["iterations"] == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_an_arrival_waits_for_the_next_landing(engine):
    # r0's prompt (8 tokens, 4 ms: 2 a stage, send 0.75) lands at 4.75; r1 arrives at 1, while the
    # engine waits on r0's batch, and goes in with r0's decode at 4.75: 8 + 4 = 12 ms, 6 a stage,
    # send 0.25 + 0.0625 x 9 -> 4.75 + 6 + 0.8125 + 6 = 17.5625.
    r = run_pipelined([Request(0, 0.0, 8, 2), Request(1, 1.0, 8, 2)], instance(), 2, engine=engine)
    assert by_id(r, "first_scheduled_ms")[1] == 4.75
    assert by_id(r, "first_token_ms")[1] == 17.5625 == by_id(r, "finish_ms")[0]


# -- a long prompt's chunks follow each other into the pipeline (vLLM: computed at scheduling) -----------------


def chunking(blocks: int = 64, *, stages: int = 2, per_token: float = 0.5):
    """A 16-token budget (a 48-token prompt goes in 3 chunks) over ``stages`` stages, each taking
    its share of the ``linear`` model's iteration (``per_token`` ms a prompt token, 8 ms a decode
    step); a stage sends the next 0.25 ms + 0.0625 ms a token, ``blocks`` KV blocks of 16."""
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=16,
                                                         allocation="grow", chunked_prefill=True))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=per_token, decode_ms_per_step=8.0)),
                                  stages=stages, moe=False)
        return scheduler, cost, PagedKVCache(blocks, 16)
    return make


@pytest.mark.parametrize("engine", ENGINES)
def test_a_long_prompts_next_chunk_enters_the_pipeline_behind_the_last(engine):
    # A 48-token prompt, 3 chunks of 16: 8 ms each, 4 a stage, send 1.25. Chunk 1 launches at
    # 0 (stage 0 0-4, stage 1 5.25-9.25); chunk 2 at once behind it (0-4 is taken: stage 0 4-8,
    # stage 1 9.25-13.25); two batches are in flight, the most vLLM's batch queue holds, so
    # chunk 3 launches when chunk 1 lands at 9.25: stage 0 9.25-13.25, stage 1 14.5-18.5. The
    # first token comes with the last chunk, at 18.5 -- not after three trips of 9.25 (27.75),
    # as when each chunk waited for the one before. Its decode (8 ms, 4 a stage, send 0.3125)
    # launches then: 18.5 + 4 + 0.3125 + 4 = 26.8125.
    requests = [Request(0, 0.0, 48, 2)]
    r = run_pipelined(requests, chunking(), 2, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 18.5} and by_id(r, "finish_ms") == {0: 26.8125}
    assert by_id(r, "prefill_chunks") == {0: 3}
    c = r.counters
    assert c["iterations"] == 4 and c["busy_ms"] == 26.8125 and c["prefill_tokens"] == 48
    check_run(r, requests, kv_blocks=64)


@pytest.mark.parametrize("engine", ENGINES)
def test_three_stages_take_a_prompts_three_chunks_back_to_back(engine):
    # 0.75 ms a prompt token: a chunk of 16 takes 12 ms, 4 a stage, send 1.25; one trip is
    # 3 x 4 + 2 x 1.25 = 14.5. All three chunks launch at 0 and follow each other one stage
    # time apart: the last leaves stage 0 at 12, and reaches stage 2 as chunk 2 leaves it, at
    # 14.5 + 4 = 18.5 -> 22.5 = 14.5 + 2 x 4 (three trips one after the other: 43.5).
    requests = [Request(0, 0.0, 48, 1)]
    r = run_pipelined(requests, chunking(stages=3, per_token=0.75), 3, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 22.5} == by_id(r, "finish_ms")
    assert r.counters["iterations"] == 3 and r.counters["busy_ms"] == 22.5
    check_run(r, requests, kv_blocks=64)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_decode_and_a_chunked_prompt_share_the_pipeline(engine):
    # r0 (prompt 8, 4 tokens) and r1 (prompt 48, 2 tokens) at 0, a budget of 16:
    # A (r0's prompt + r1's first 8: 8 ms, 4 a stage, send 1.25) at 0: stage 0 0-4, stage 1 5.25-9.25;
    # B (r1's next 16; r0 waits for its first token) at 0: stage 0 4-8, stage 1 9.25-13.25.
    # A lands at 9.25, r0's first token; C (r0's decode + r1's next 15 of the budget: 15.5 ms,
    #   7.75 a stage, send 1.25): stage 0 9.25-17, stage 1 18.25-26.
    # B lands at 13.25; D (r1's last 9 tokens: 4.5 ms, 2.25 a stage, send 0.8125): stage 0 17-19.25,
    #   stage 1 (C's until 26) 26-28.25.
    # C lands at 26, r0's 2nd token; E (r0's decode: 4 a stage, send 0.3125): stage 0 26-30, stage 1 30.3125-34.3125.
    # D lands at 28.25, r1's first token; F (r1's decode): stage 0 30-34, stage 1 34.3125-38.3125 (r1 done).
    # E lands at 34.3125, r0's 3rd token; G (r0's decode): stage 0 34.3125-38.3125, stage 1 38.625-42.625.
    requests = [Request(0, 0.0, 8, 4), Request(1, 0.0, 48, 2)]
    r = run_pipelined(requests, chunking(), 2, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 9.25, 1: 28.25}
    assert by_id(r, "finish_ms") == {0: 42.625, 1: 38.3125}
    assert by_id(r, "prefill_chunks") == {0: 1, 1: 4}
    assert r.counters["iterations"] == 7 and r.counters["busy_ms"] == 42.625
    check_run(r, requests, max_running=4, kv_blocks=64)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_prompt_preempted_with_a_chunk_in_flight_starts_over_and_the_chunk_lands_without_it(engine):
    # 4 blocks of 16. r0 (prompt 16, 3 tokens) and r1 (prompt 48, 1 token) at 0, a budget of 16:
    # A (r0's prompt) at 0, lands 9.25; B (r1's first 16) behind it, lands 13.25.
    # At 9.25: C (r0's decode, its 2nd block, + r1's next 15, r1's 2nd block: 15.5 ms, 7.75 a
    #   stage, send 1.25): stage 0 9.25-17, stage 1 18.25-26. All 4 blocks are taken.
    # At 13.25 (B landed) r1's last 17 tokens want a 3rd block: r1, the newest running request,
    #   is preempted -- its 2 blocks (the one its chunk in C took too) freed, its prompt to start over.
    # C lands at 26 without r1's chunk: r0's 2nd token. r1 cannot come back (its 48 tokens need 3
    #   blocks, 2 are free): E (r0's decode) 26-30, 30.3125-34.3125, r0 done, its blocks free.
    # At 34.3125 r1 starts over: F (16) stage 0 34.3125-38.3125, stage 1 39.5625-43.5625; G (16)
    #   38.3125-42.3125, 43.5625-47.5625; F lands, H (the last 16) 43.5625-47.5625, 48.8125-52.8125.
    requests = [Request(0, 0.0, 16, 3), Request(1, 0.0, 48, 1)]
    r = run_pipelined(requests, chunking(4), 2, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 9.25, 1: 52.8125}
    assert by_id(r, "finish_ms") == {0: 34.3125, 1: 52.8125}
    c = r.counters
    assert c["num_preemptions"] == 1 and c["iterations"] == 7 and c["busy_ms"] == 52.8125
    assert c["recomputed_tokens"] == 16  # B's chunk, landed before the preemption; C's never counted
    assert c["prefill_tokens"] == 16 + 16 + 48 and c["kv_peak_blocks"] == 4
    check_run(r, requests, kv_blocks=4)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_newest_request_is_preempted_while_its_last_chunk_is_in_flight_and_still_gets_its_token(engine):
    # 2 blocks of 16, a budget of 16. r0 (prompt 16, 3 tokens) and r1 (prompt 16, 2 tokens) at 0:
    # A (r0's prompt: 8 ms, 4 a stage, send 1.25): stage 0 0-4, stage 1 5.25-9.25; B (r1's) behind
    #   it: stage 0 4-8, stage 1 9.25-13.25.
    # At 9.25 A lands, r0's first token; its decode (17th token) needs a 2nd block, none is free.
    #   vLLM's victim is running[-1], the newest request -- r1, whose batch is in flight: its
    #   block is freed and it waits for that batch (not r0, the only one a scheduler blind to
    #   batches in flight could see). C (r0's decode: 8 ms, 4 a stage, send 0.3125): stage 0
    #   9.25-13.25, stage 1 13.5625-17.5625. A step that preempts admits nothing.
    # At 13.25 B lands: the prompt it held was computed, so r1 gets its first token (vLLM keeps
    #   it) and goes to the front of the queue; it now recomputes 17 tokens (2 blocks), none free.
    #   Nothing else to launch.
    # At 17.5625 C lands, r0's 2nd token; D (its decode) 17.5625-21.5625, 21.875-25.875: r0's
    #   3rd and last token, its blocks free. E (16 of r1's 17: 8 ms) 25.875-29.875, 31.125-35.125;
    #   F (the last one: 0.5 ms, 0.25 a stage, send 0.3125) 29.875-30.125, 35.125-35.375: done.
    requests = [Request(0, 0.0, 16, 3), Request(1, 0.0, 16, 2)]
    r = run_pipelined(requests, chunking(2), 2, engine=engine)
    assert_requests(r, first_token_ms={0: 9.25, 1: 13.25}, finish_ms={0: 25.875, 1: 35.375},
                    preemptions={0: 0, 1: 1}, generated_tokens={0: 3, 1: 2})
    c = r.counters
    assert c["num_preemptions"] == c["recompute_preemptions"] == c["in_flight_preemptions"] == 1
    assert c["iterations"] == 6 and c["generated_tokens"] == 5 and c["decode_tokens"] == 2
    # B's chunk landed after r1 was preempted: computed in vain for its KV, as a dropped chunk
    assert c["prefill_tokens"] == 16 + 16 + 1 and c["kv_peak_blocks"] == 2
    assert c["busy_ms"] == 35.375 - 4.0  # B's landing executes nothing of its own (a hole, 9.25-13.25)
    check_run(r, requests, kv_blocks=2)


def small_blocks(blocks: int):
    """A budget of 3 tokens over 2 stages (0.5 ms a prompt token, 8 ms a decode step; a stage
    sends the next 0.25 ms + 0.0625 ms a token), ``blocks`` KV blocks of 4 tokens."""
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=2, max_num_batched_tokens=3,
                                                         allocation="grow", chunked_prefill=True))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                                  stages=2, moe=False)
        return scheduler, cost, PagedKVCache(blocks, 4)
    return make


@pytest.mark.parametrize("engine", ENGINES)
def test_a_decode_preempted_in_flight_keeps_its_token_and_may_finish_from_the_queue(engine):
    # 2 blocks of 4 tokens, a budget of 3. r0 (prompt 3, 4 tokens) and r1 (prompt 3, 2 tokens) at 0:
    # A (r0's 3: 1.5 ms, 0.75 a stage, send 0.4375): 0-0.75, 1.1875-1.9375; B (r1's 3): 0.75-1.5,
    #   1.9375-2.6875. Each holds one block.
    # 1.9375: r0's first token; C (its decode, the 4th slot of its block: 4 a stage, send
    #   0.3125): 1.9375-5.9375, 6.25-10.25.
    # 2.6875: r1's first token; D (its decode, the 4th slot of its block): 5.9375-9.9375, 10.25-14.25.
    # 10.25: C lands, r0's 2nd token; its next decode needs a 2nd block, none is free. The newest
    #   running request, r1, is in flight in D: preempted, its block freed. E (r0's decode):
    #   10.25-14.25, 14.5625-18.5625.
    # 14.25: D lands. Its decode gave r1 its 2nd and last token: r1 finishes from the queue.
    # 18.5625: r0's 3rd token; its 4th a trip later, 4 + 0.3125 + 4: 26.875.
    requests = [Request(0, 0.0, 3, 4), Request(1, 0.0, 3, 2)]
    r = run_pipelined(requests, small_blocks(2), 2, engine=engine)
    assert_requests(r, first_token_ms={0: 1.9375, 1: 2.6875}, finish_ms={0: 26.875, 1: 14.25},
                    preemptions={0: 0, 1: 1}, generated_tokens={0: 4, 1: 2})
    c = r.counters
    assert c["num_preemptions"] == c["in_flight_preemptions"] == 1 and c["iterations"] == 6
    assert c["generated_tokens"] == 6 and c["decode_tokens"] == c["decode_seq_steps"] == 4
    assert r.metrics["preemptions"]["in_flight"] == 1
    assert c["prefill_tokens"] == 6 and c["kv_peak_blocks"] == 2
    check_run(r, requests, kv_blocks=2)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_empty_batch_holds_a_slot_of_the_queue_as_in_vllm(engine):
    """Three stages, two slots, both requests in flight: vLLM 0.33 queues the empty batch its
    scheduler returns, and that batch holds a slot until it is back with the batch before it,
    so when r0's decode preempts r1 in flight the queue is full and nothing is admitted before
    r1's batch lands; r1 is then at the head, and r2 waits for r0 to finish (not admitted at 20
    past the held r1, as with the slot free). The outcomes are vLLM 0.33's own scheduler's
    (``python tools/vllm_diff.py --replay`` of this case, 1 ms a stage)."""
    from schedlab.vllm_diff.case import Outcome, case_from_json
    from schedlab.vllm_diff.schedlab_side import SchedlabRunner

    case = case_from_json(
        '{"group":"pipeline","seed":46,"settings":{"block_size":8,"num_blocks":17,"max_num_seqs":2,'
        '"max_num_batched_tokens":18,"long_prefill_token_threshold":0,"prefix_caching":false,"policy":"fcfs",'
        '"pipeline_parallel":3},"requests":[{"id":0,"arrival":0,"prompt_tokens":92,"output_tokens":6},'
        '{"id":1,"arrival":0,"prompt_tokens":29,"output_tokens":6},{"id":2,"arrival":0,"prompt_tokens":1,'
        '"output_tokens":1}]}')
    vllm = {0: Outcome(0, 8, 23, 0, 0), 1: Outcome(5, 9, 27, 1, 0), 2: Outcome(23, 27, 27, 0, 0)}
    assert SchedlabRunner(engine).run(case) == (vllm, None)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("ahead, tokens", [
    (False, [4.75, 13.0625, 21.375]),
    (True, [4.75, 13.0625, 21.375]),
])
def test_planning_ahead_a_decode_waits_for_its_token_to_come_back(engine, ahead, tokens):
    """One request, 8 + 3 tokens, two stages (2 ms a stage for the prompt, 4 ms for a decode; sends
    0.75 and 0.3125 ms). Its prompt lands at 4.75. Synchronously each decode waits for the token
    before it: launched at 4.75, it crosses both stages (4 + 0.3125 + 4) by 13.0625, and the next
    by 21.375. Planning ahead (vLLM's V2 model runner: a queue of 3, each decode due 2 plans after
    the last) plan 2 is empty and plan 3, at 0, decodes on the first token's placeholder -- but
    the first stage embeds the token itself, broadcast from the last stage when it is sampled: it
    starts at 4.75, when the prompt lands, and the decode lands at 13.0625; plan 5 decodes the third
    token once the second is back, landing at 21.375. A lone request decodes once per trip through
    the pipeline, as synchronously (it landed at 10.3125 and 14.3125: a token a stage behind the one
    it needs, faster than one GPU could decode it)."""
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow",
                                                         chunked_prefill=True, async_scheduling=ahead))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                                  stages=2, moe=False)
        return scheduler, cost, PagedKVCache(64, 16)

    requests = [Request(0, 0.0, 8, 3)]
    r = run_pipelined(requests, make, 2, engine=engine)
    assert_requests(r, first_token_ms={0: tokens[0]}, finish_ms={0: tokens[-1]})
    check_run(r, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_victim_in_flight_is_passed_over_until_its_batch_lands_as_vllm_does(engine):
    """Three stages, two slots. r4's last decode is in flight when r0's decode needs its blocks:
    r4, the newest, is preempted in flight. vLLM 0.33 passes over a waiting request whose output
    is still in flight (``num_stale_output_tokens``) and admits r6 behind it in the next batch,
    before r4's batch lands; that batch then brings r4 its last token. The outcomes are vLLM
    0.33's own scheduler's (``python tools/vllm_diff.py --replay`` of this case, 1 ms a stage)."""
    from schedlab.vllm_diff.case import Outcome, case_from_json
    from schedlab.vllm_diff.schedlab_side import SchedlabRunner

    case = case_from_json(
        '{"group":"pipeline","seed":15,"settings":{"block_size":4,"num_blocks":31,"max_num_seqs":2,'
        '"max_num_batched_tokens":9,"long_prefill_token_threshold":0,"prefix_caching":false,"policy":"fcfs",'
        '"pipeline_parallel":3},"requests":[{"id":0,"arrival":0,"prompt_tokens":1,"output_tokens":13},'
        '{"id":4,"arrival":1,"prompt_tokens":102,"output_tokens":8},{"id":6,"arrival":3,"prompt_tokens":1,'
        '"output_tokens":1}]}')
    vllm = {0: Outcome(0, 3, 39, 0, 0), 4: Outcome(3, 17, 38, 1, 0), 6: Outcome(36, 40, 40, 0, 0)}
    assert SchedlabRunner(engine).run(case) == (vllm, None)


# -- clients that give up: aborted while their batch is in flight ----------------------------------------------


def tight(blocks: int):
    """:func:`instance` with a token budget of 16 (a burst's prompts go in separate batches)
    and ``blocks`` KV blocks of 16 tokens."""
    return instance(blocks, budget=16)


def timeline(result, column):
    return result.timeline[column].tolist()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_prompt_aborted_in_flight_frees_its_blocks_for_the_next_batch_and_lands_without_tokens(engine):
    # As in test_a_second_batch_fills_the_pipeline_behind_the_first: batch A (r0's 16-token
    # prompt: 8 ms, 4 a stage, send 1.25) and batch B (r1's) launch at 0; A lands at 9.25, B at
    # 13.25. r1's client gives up at 5 while B is in the pipeline; the engine, blocked on A,
    # hears of it when A lands at 9.25: r1 leaves with no token, its block (16 tokens, the
    # slots B took) back at once. r2 (15 tokens, arrived at 1) is admitted at 9.25 in that
    # block: with r1's block still held, r0's decode (a 2nd block) would have filled the 3.
    # Batch C (r0's decode + r2's prompt: 8 + 7.5 = 15.5 ms, 7.75 a stage, send 1.25) launches
    # at 9.25: stage 0 9.25-17, stage 1 (B's until 13.25) 18.25-26. B lands at 13.25 without
    # r1: no token, so its time is idle (a row of 0 ms at 9.25, the blocks held to 13.25);
    # nothing to launch (r0 and r2 are in C). C lands at 26: r0's 2nd token, r2's first, done.
    requests = [Request(0, 0.0, 16, 2), Request(1, 0.0, 16, 2, timeout_ms=5.0), Request(2, 1.0, 15, 1)]
    r = run_pipelined(requests, tight(3), 2, engine=engine)
    assert by_id(r, "aborted") == {0: 0, 1: 1, 2: 0} and by_id(r, "timed_out") == {0: 0, 1: 1, 2: 0}
    assert by_id(r, "finish_ms") == {0: 26.0, 1: 9.25, 2: 26.0}
    assert by_id(r, "generated_tokens") == {0: 2, 1: 0, 2: 1}
    assert by_id(r, "first_scheduled_ms")[2] == 9.25
    # one row per landing, over the time since the last: KV held 2, 3 (r1's block taken by r2), 3
    assert timeline(r, "time_ms") == [0.0, 9.25, 13.25] and timeline(r, "duration_ms") == [9.25, 0.0, 12.75]
    assert timeline(r, "kv_used") == [2, 3, 3] and timeline(r, "prefill_tokens") == [16, 0, 15]
    c = r.counters
    assert c["kv_block_ms"] == 2 * 9.25 + 3 * 4.0 + 3 * 12.75 and c["kv_peak_blocks"] == 3
    assert c["busy_ms"] == 9.25 + 12.75 and c["iterations"] == 3
    assert c["generated_tokens"] == 3 and c["prefill_tokens"] == 16 + 15 and c["decode_tokens"] == 1
    assert r.metrics["timed_out"] == r.metrics["aborted"] == 1 and r.metrics["makespan_ms"] == 26.0
    check_run(r, requests, kv_blocks=3)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_decode_aborted_in_flight_drops_its_token_and_the_block_it_took(engine):
    # A and B as above: r0's first token at 9.25, r1's at 13.25. At 9.25 batch C is r0's decode
    # (8 ms, 4 a stage, send 0.3125; its 17th token takes a 2nd block): stage 0 9.25-13.25,
    # stage 1 13.5625-17.5625. r0's client gives up at 10; B lands at 13.25 and r0 leaves with
    # its one token, its 2 blocks freed. Batch D (r1's decode, a 2nd block) launches at 13.25:
    # stage 0 13.25-17.25, stage 1 17.5625-21.5625. C lands at 17.5625 without r0's token (no
    # token: idle since 13.25), D at 21.5625: r1's 2nd token. Then r1 alone, 8.3125 ms a
    # token: its 10th at 21.5625 + 8 x 8.3125 = 88.0625.
    requests = [Request(0, 0.0, 16, 10, timeout_ms=10.0), Request(1, 0.0, 16, 10)]
    r = run_pipelined(requests, tight(4), 2, engine=engine)
    assert by_id(r, "aborted") == {0: 1, 1: 0}
    assert by_id(r, "first_token_ms") == {0: 9.25, 1: 13.25}
    assert by_id(r, "finish_ms") == {0: 13.25, 1: 88.0625}
    assert by_id(r, "generated_tokens") == {0: 1, 1: 10}
    assert timeline(r, "time_ms")[:5] == [0.0, 9.25, 13.25, 17.5625, 21.5625]
    assert timeline(r, "kv_used")[:4] == [2, 3, 2, 2] and timeline(r, "decodes")[:4] == [0, 0, 0, 1]
    c = r.counters
    # 2 blocks to 9.25, 3 to 13.25 (r0's 2nd), then r1's 2 to the end
    assert c["kv_block_ms"] == 2 * 9.25 + 3 * 4.0 + 2 * (88.0625 - 13.25) and c["kv_peak_blocks"] == 3
    assert c["busy_ms"] == 88.0625 - (17.5625 - 13.25) and c["iterations"] == 4 + 8
    assert c["generated_tokens"] == 11 and c["decode_tokens"] == c["decode_seq_steps"] == 9
    check_run(r, requests, kv_blocks=4)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_abort_that_comes_while_its_batch_is_awaited_drops_that_batchs_token(engine):
    # As above, but r0's client gives up at 15, while the engine waits for batch C (r0's decode,
    # landing at 17.5625; D, r1's decode with its 2nd block, launched at 13.25). vLLM reads the
    # abort once C is back, before its output (step_with_batch_queue): r0 leaves at 17.5625 with
    # its one token, C's token for it dropped (C lands with nothing: idle since 13.25). Its 2
    # blocks were held until then: 2 blocks to 9.25, 3 to 13.25, 4 to 17.5625, then r1's 2.
    requests = [Request(0, 0.0, 16, 10, timeout_ms=15.0), Request(1, 0.0, 16, 10)]
    r = run_pipelined(requests, tight(4), 2, engine=engine)
    assert by_id(r, "aborted") == {0: 1, 1: 0}
    assert by_id(r, "finish_ms") == {0: 17.5625, 1: 88.0625}
    assert by_id(r, "generated_tokens") == {0: 1, 1: 10}
    c = r.counters
    assert c["kv_block_ms"] == 2 * 9.25 + 3 * 4.0 + 4 * (17.5625 - 13.25) + 2 * (88.0625 - 17.5625)
    assert c["kv_peak_blocks"] == 4 and timeline(r, "kv_used")[:4] == [2, 3, 4, 2]
    assert c["busy_ms"] == 88.0625 - (17.5625 - 13.25)
    assert c["generated_tokens"] == 11 and c["decode_tokens"] == 9
    check_run(r, requests, kv_blocks=4)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pipeline_with_nothing_in_flight_hears_an_abort_when_it_comes(engine):
    # A batching window (2 requests, or the oldest waiting 100 ms) holds r0 back; its client
    # gives up at 10, which wakes the idle instance: r0 is dropped then, not at the window's end.
    # r1 (at 30) waits alone until 130: its prompt (4 ms, 2 a stage, send 0.75) lands at 134.75,
    # its decode (8 ms, 4 a stage, send 0.3125) at 143.0625.
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_wait_ms=100.0, min_batch=2))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                                  stages=2, moe=False)
        return scheduler, cost, PagedKVCache(64, 16)

    requests = [Request(0, 0.0, 8, 2, timeout_ms=10.0), Request(1, 30.0, 8, 2)]
    r = run_pipelined(requests, make, 2, engine=engine)
    assert by_id(r, "aborted") == {0: 1, 1: 0}
    assert by_id(r, "finish_ms") == {0: 10.0, 1: 143.0625} and by_id(r, "first_scheduled_ms")[1] == 130.0
    check_run(r, requests)


# -- the engines agree; the rules of every run --------------------------------------------------------------


@st.composite
def schedulers(draw, ahead: bool = True):
    """Continuous-batching settings; ``ahead``: planning ahead too (not with speculation)."""
    max_seqs = draw(st.integers(1, 5))
    allocation = draw(st.sampled_from(["reserve", "grow"]))
    preemption = draw(st.sampled_from(["recompute", "swap"])) if allocation == "grow" else "recompute"
    return ContinuousConfig(max_num_seqs=max_seqs, allocation=allocation, preemption=preemption,
                            max_num_batched_tokens=draw(st.integers(max(max_seqs, 8), 64)),
                            chunked_prefill=draw(st.booleans()),
                            running_order=draw(st.sampled_from(["admission", "decodes_first"])),
                            policy=draw(st.sampled_from(["fcfs", "priority"])),
                            # planning ahead: one batch more in flight, decodes staggered (engine.stages)
                            async_scheduling=ahead and preemption == "recompute" and draw(st.booleans()))


ROUTERS = {"round_robin": RoundRobinRouter, "least_outstanding": LeastOutstandingRouter, "least_kv": LeastKVRouter}


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=60, all_at_zero=False, priorities=True,
                      prefix_groups=2),
       schedulers(), st.integers(2, 4), st.integers(1, 2), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(),
       st.integers(0, 30), st.integers(1, 8), st.booleans())
def test_pipelined_instances_agree_between_engines_and_keep_the_rules(requests, cfg, stages, instances, router, cost,
                                                                      spare, block_size, prefix):
    need = blocks_for_largest(requests, block_size)
    blocks = need + spare

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, block_size, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), kv

    runs = [run_pipelined(requests, make, stages, instances, ROUTERS[router]() if instances > 1 else None,
                          engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * instances, kv_blocks=blocks * instances)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=60, all_at_zero=False),
       st.integers(2, 3), st.integers(1, 2), dyadic_linear_costs(), st.integers(0, 2), st.sampled_from([0.0, 0.5]),
       st.sampled_from([0.0, 1.5, 6.0]))
def test_pipelines_behind_an_api_server_agree_between_engines(requests, stages, instances, cost, workers, network,
                                                              request_ms):
    """Requests reach the pipelined instances through the API server (0-2 handlers, a network
    hop, handling time): both engines alike, every request served once."""
    from schedlab.frontend import ClientSide, FrontendConfig

    side = ClientSide(FrontendConfig(network_ms=network, request_ms=request_ms, tokenize_ms_per_token=0.0625,
                                     token_ms=0.25, workers=workers))
    blocks = blocks_for_largest(requests, 4) + 8

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=3, max_num_batched_tokens=64)),
                LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), PagedKVCache(blocks, 4))

    runs = [run_pipelined(requests, make, stages, instances, RoundRobinRouter() if instances > 1 else None,
                          engine=engine, client_side=side) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests)
    req = runs[0].requests
    assert (req["arrival_ms"] >= req["sent_ms"] + network).all()  # each request crossed the front end


def client_side(timeout_ms: float | None, network_ms: float = 0.0, workers: int = 0, request_ms: float = 0.0):
    """The API server in front (``workers`` handlers, ``request_ms`` each, a network hop) and,
    with ``timeout_ms``, clients that give up."""
    from schedlab.frontend import ClientConfig, ClientSide, FrontendConfig

    front = FrontendConfig(network_ms=network_ms, request_ms=request_ms, tokenize_ms_per_token=0.0, token_ms=0.0,
                           workers=workers)
    return ClientSide(front, ClientConfig(timeout_ms=timeout_ms) if timeout_ms is not None else None)


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=60, all_at_zero=None, priorities=True,
                      prefix_groups=2),
       schedulers(), st.integers(2, 4), st.integers(1, 2), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(),
       st.integers(0, 30), st.booleans(), st.integers(1, 160), st.sampled_from([0.0, 0.5, 2.0]), st.integers(0, 2),
       st.sampled_from([0.0, 1.5]))
def test_clients_that_give_up_on_pipelines_agree_between_engines_and_conserve(requests, cfg, stages, instances, router,
                                                                              cost, spare, prefix, timeout, network,
                                                                              workers, request_ms):
    """Through the API server (0-2 handlers) with clients giving up, so that requests are
    aborted waiting, swapped out, between batches and in batches in flight: both engines alike,
    every request served, rejected or aborted once, slots and KV within bounds, every block back."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), kv

    side = client_side(timeout + network, network, workers, request_ms)
    runs = [run_pipelined(requests, make, stages, instances, ROUTERS[router]() if instances > 1 else None,
                          engine=engine, client_side=side) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * instances, kv_blocks=blocks * instances)
    check_run(runs[1], requests, max_running=cfg.max_num_seqs * instances, kv_blocks=blocks * instances)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=120, max_output=20, all_at_zero=None, prefix_groups=2),
       st.integers(2, 3), st.integers(8, 24), st.sampled_from(["recompute", "swap"]),
       st.sampled_from(["fcfs", "priority"]), dyadic_linear_costs(), st.integers(0, 12), st.booleans(),
       st.sampled_from([None, 20.0, 80.0]), st.booleans())
def test_long_prompts_chunked_into_the_pipeline_agree_between_engines_and_conserve(
        requests, stages, budget, preemption, policy, cost, spare, prefix, timeout, ahead):
    """Prompts of up to 120 tokens under budgets of 8-24, over 2 or 3 stages, in little KV: a
    prompt has several chunks in flight, is preempted or aborted with chunks in flight, and
    decodes beside other prompts' chunks (planning ahead too: decodes behind the last chunk).
    Both engines alike; every request served, rejected or aborted once; slots and KV within
    bounds; every block back."""
    blocks = blocks_for_largest(requests, 4) + spare
    cfg = ContinuousConfig(max_num_seqs=3, max_num_batched_tokens=budget, allocation="grow", preemption=preemption,
                           policy=policy, chunked_prefill=True, async_scheduling=ahead and preemption == "recompute")

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), kv

    side = client_side(timeout) if timeout is not None else None
    runs = [run_pipelined(requests, make, stages, engine=engine, client_side=side) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    for run in runs:
        check_run(run, requests, max_running=cfg.max_num_seqs, kv_blocks=blocks)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(5, 24), st.integers(2, 3), st.integers(0, 5), st.sampled_from([None, 15.0, 60.0]),
       st.booleans())
@example(2, 12, 2, 5, 15.0, False)  # a request arrives as a batch lands and as a waiting request's abort is heard
def test_closed_loops_over_pipelined_instances_agree_and_conserve(clients, num_requests, stages, seed, timeout, ahead):
    """Clients send their next request when the last is answered, or when they give up on it
    (a client's next request and its abort reach the engine together, one network hop later);
    the instances scheduling synchronously or planning ahead."""
    make_workload = small_closed_loop(clients, num_requests)
    side = client_side(timeout, 0.5) if timeout is not None else None
    runs = []
    for engine in ENGINES:
        workload = make_workload()
        runs.append(run_pipelined(workload.requests(seed), instance(48, stages=stages, ahead=ahead), stages, 2,
                                  RoundRobinRouter(), engine=engine, workload=workload, client_side=side))
    compare_runs(*runs, rel=1e-12)
    assert runs[0].requests["id"].size == num_requests and runs[0].requests["rejected"].sum() == 0
    assert all(kv.num_used_blocks() == 0 for run in runs for kv in run.meta["kvs"])


# -- the cost models' stages ---------------------------------------------------------------------------------


def _presets():
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog

    return Presets.from_catalog(load_catalog(entry_points=False))


def test_vllms_layer_split_gives_the_remainder_to_the_stages_before_the_last():
    from schedlab.parallelism import stage_layers

    assert stage_layers(48, 2) == (24, 24)
    assert stage_layers(30, 4) == (7, 8, 8, 7)   # vLLM get_pp_indices: 7 each, 2 more on the two before the last
    assert stage_layers(5, 3) == (2, 2, 1)   # a remainder of stages - 1 reaches the first stage too


def test_more_stages_than_layers_is_said_of_cluster(validated):
    """The error named [cost_model], which found it, not [cluster], where pipeline_parallel is."""
    from test_reports import SMALL

    model = 'model = "llama-3-8b"\ngpu = "h100-80gb"\n'
    code, err, path = validated(SMALL + '[cost_model]\nkind = "roofline"\n' + model + '[kv_cache]\nkind = "paged"\n'
                                + model + '[cluster]\npipeline_parallel = 64\n')
    assert code == 2
    assert err.endswith(f"{path}: [cluster]: pipeline_parallel = 64 exceeds the model's 32 layers (a stage holds at "
                        "least one)\n")
    assert "FutureWarning" not in err  # (the regex that trims the table warned of a nested set above it)


@pytest.mark.parametrize("stages", [2, 3])
def test_a_roofline_iteration_splits_into_stages_that_add_up(stages):
    from schedlab.parallelism import Parallelism, stage_layers
    from schedlab.protocols import Batch
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES, Collectives

    presets = _presets()
    config = RooflineConfig(model="llama-3.1-8b", gpu="rtx-pro-6000-server", overhead_ms=1.0)
    cost = RooflineCostModel(presets.model("llama-3.1-8b"), presets.gpu("rtx-pro-6000-server"), config,
                             parallelism=Parallelism(pipeline_parallel=stages))
    batch = Batch(num_decode=32, decode_context_tokens=32 * 900, num_prefill=1, prefill_tokens=512)
    times, send = cost.pipeline_ms(batch)
    assert sum(times) == pytest.approx(cost.iteration_ms(batch), rel=1e-12)
    layers = stage_layers(32, stages)
    host = cost.iteration_ms(batch) - cost.kernel_ms(batch)  # the host's share of the step, overhead_ms in it
    assert host >= 1.0
    logits = cost.logits_ms(33)  # the LM head over the 33 sampled rows: on the last stage, at TP 1 too
    per_layer = (cost.kernel_ms(batch) - logits) / 32
    assert times[0] == pytest.approx(host + layers[0] * per_layer)   # the host's work before the first stage
    assert times[-1] == pytest.approx(layers[-1] * per_layer + logits)
    # hidden states and residual: 2 x 544 tokens x 4096 x 2 bytes, one hop over the GPU's usual machine
    assert send == pytest.approx(Collectives(TOPOLOGIES["pcie-gen5-host"], 2).send_recv_ms(2 * 544 * 4096 * 2))


def test_tensor_parallel_stages_send_slices_and_all_gather_them():
    """vLLM's ``send_tensor_dict(..., all_gather_group=tp_group)``: each of the 2 ranks sends
    half of the hidden states and half of the residual to its peer on the next stage, whose
    ranks then all-gather each tensor whole (two all-gathers of tokens x hidden x 2 bytes)."""
    import attrs

    from schedlab_plugins.cost_models.collectives import TOPOLOGIES, Collectives
    from schedlab_plugins.cost_models.pipeline import PipelineSends

    presets = _presets()
    model, machine = presets.model("qwen3-32b"), TOPOLOGIES["pcie-gen5-host"]
    pair, group = Collectives(machine, 2, 2), Collectives(machine, 2)
    tensor = 300 * 5120 * 2   # 300 tokens' hidden states (or residual) in bf16
    sends = PipelineSends(model, machine, stages=2, tensor_parallel=2)
    assert sends.send_ms(300) == pytest.approx(pair.send_recv_ms(tensor) + 2 * group.all_gather_ms(tensor))
    # the all-gathers are on the path: slicing does not make a send cheaper than half of one
    assert sends.send_ms(300) > pair.send_recv_ms(tensor)
    # without tensor parallelism the whole of both tensors goes in one send, nothing gathered
    assert PipelineSends(model, machine, 2, 1).send_ms(300) == pytest.approx(pair.send_recv_ms(2 * tensor))
    # a tensor whose size does not divide by tp goes whole (vLLM's _should_use_all_gather)
    odd = attrs.evolve(model, hidden_size=5121)
    assert PipelineSends(odd, machine, 2, 2).send_ms(3) == pytest.approx(pair.send_recv_ms(2 * 3 * 5121 * 2))
    assert PipelineSends(odd, machine, 2, 2).send_ms(2) == pytest.approx(
        pair.send_recv_ms(2 * 5121 * 2) + 2 * group.all_gather_ms(2 * 5121 * 2))


def test_a_pipeline_over_nodes_pays_the_network_only_where_a_stage_starts_a_node():
    """vLLM numbers ranks tensor-parallel first (``pp_rank x tp + tp_rank``): on 8-GPU nodes PP 4 x
    TP 4 leaves a node between stages 1 and 2 only, PP 8 x TP 2 between stages 3 and 4 only; the
    other hops send within a node (review s80 specpp, finding 3: every hop paid the network)."""
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES, Collectives
    from schedlab_plugins.cost_models.pipeline import PipelineSends, hop_crosses

    assert hop_crosses(4, 4, 8) == (False, True, False)
    assert hop_crosses(8, 2, 8) == (False, False, False, True, False, False, False)
    assert hop_crosses(2, 4, 8) == (False,) and hop_crosses(3, 1, 1) == (True, True)
    assert hop_crosses(3, 3, 8) == (False, True)  # stage 2 is GPUs 6, 7, 8: its rank 2 on the next node
    model, machine = _presets().model("llama-3-70b"), TOPOLOGIES["dgx-h100"]
    inside, across, group = Collectives(machine, 2, 2), Collectives(machine, 2, 1), Collectives(machine, 4)
    tensor = 8192 * model.hidden_size * model.dtype_bytes
    near = inside.send_recv_ms(2 * tensor / 4) + 2 * group.all_gather_ms(tensor)
    far = across.send_recv_ms(2 * tensor / 4) + 2 * group.all_gather_ms(tensor)
    assert far > 2 * near
    assert PipelineSends(model, machine, 4, 4).send_ms(8192) == pytest.approx((near, far, near))
    # within one node every hop is the same: one number
    assert PipelineSends(model, machine, 2, 4).send_ms(8192) == pytest.approx(near)


def test_a_pipeline_in_a_box_of_nvlink_pairs_sends_between_pairs_over_pcie():
    """Vidur's H100 boxes: NVLink bridges GPUs 0-1 and 2-3, PCIe Gen5 between the pairs. PP 4 at
    TP 1 sends 0 -> 1 and 2 -> 3 over a bridge and 1 -> 2 over PCIe (every hop took the bridge)."""
    from schedlab_plugins.cost_models.collectives import BASE_US, HOP_US, PCIE_P2P_GBPS, TOPOLOGIES, Collectives
    from schedlab_plugins.cost_models.pipeline import ISLAND, ISLANDS, NODES, PipelineSends, hop_links

    assert hop_links(4, 1, 4, 2) == (ISLAND, ISLANDS, ISLAND)
    assert hop_links(2, 2, 4, 2) == (ISLANDS,)          # stage 0 is GPUs 0-1, stage 1 GPUs 2-3
    assert hop_links(4, 2, 4, 2) == (ISLANDS, NODES, ISLANDS)
    assert hop_links(4, 1, 8) == (ISLAND,) * 3          # one island: the node
    model, machine = _presets().model("llama-3-8b"), TOPOLOGIES["nvlink-pairs-h100"]
    both = 2 * 8192 * model.hidden_size * model.dtype_bytes  # hidden states and residual, bf16
    near = Collectives(machine, 2, 2).send_recv_ms(both)
    # one step over PCIe at the Gen5 peer-to-peer rate, Simple (the fastest at 134 MB)
    pcie = (BASE_US["ring"]["Simple"] + HOP_US["pcie"]["ring"]["Simple"] + both / (PCIE_P2P_GBPS["gen5"] * 1e3)) / 1e3
    assert pcie > 2 * near
    assert PipelineSends(model, machine, 4, 1).send_ms(8192) == pytest.approx((near, pcie, near))
    assert PipelineSends(model, machine, 2, 1).send_ms(8192) == pytest.approx(near)


def test_a_stage_clock_takes_each_hops_own_send():
    clock = StageClock(3)
    # stage 0 0-2, hop 1 ms, stage 1 3-5, hop 3 ms, stage 2 8-10
    assert clock.launch(0.0, (2.0, 2.0, 2.0), (1.0, 3.0)) == 10.0
    # the next batch: stage 0 2-3, stage 1 (ready at 4) 5-6, stage 2 (ready at 9) 10-11
    assert clock.launch(0.0, (1.0, 1.0, 1.0), (1.0, 3.0)) == 11.0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_crosses_each_hop_at_its_own_price(engine):
    # 3 stages, the second hop twice the first. A 24-token prompt: 12 ms, 4 a stage; sends 0.25 +
    # 0.0625 x 24 = 1.75 and 3.5 -> first token at 4 + 1.75 + 4 + 3.5 + 4 = 17.25. Its decode: 12 ms,
    # sends 0.3125 and 0.625 -> 17.25 + 12 + 0.9375 = 30.1875.
    from schedlab.testing.parallel import ParallelPrices

    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow"))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=12.0)),
                                  ParallelPrices(hop_send_scale=(1.0, 2.0)), stages=3, moe=False)
        return scheduler, cost, PagedKVCache(64, 16)

    r = run_pipelined([Request(0, 0.0, 24, 2)], make, 3, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 17.25}
    assert by_id(r, "finish_ms") == {0: 30.1875}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=12, max_prompt=60, max_output=40, all_at_zero=False),
       schedulers(), st.integers(2, 4), dyadic_linear_costs(), st.lists(st.sampled_from([0.0, 0.5, 1.0, 4.0]),
                                                                        min_size=3, max_size=3))
def test_pipelines_with_a_send_per_hop_agree_between_engines(requests, cfg, stages, cost, scales):
    from schedlab.testing.parallel import ParallelPrices

    blocks = blocks_for_largest(requests, 4) + 8

    def make():
        prices = ParallelPrices(hop_send_scale=tuple(scales[:stages - 1]))
        return (ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), prices, stages=stages, moe=False),
                PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3))

    runs = [run_pipelined(requests, make, stages, engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests, max_running=cfg.max_num_seqs, kv_blocks=blocks)


def test_kv_sizing_of_a_stage_holds_its_layers():
    from schedlab.capacity import size_kv_cache
    from schedlab.parallelism import Parallelism

    presets = _presets()
    model, gpu = presets.model("qwen3-32b"), presets.gpu("rtx-pro-6000-server")
    alone = size_kv_cache(model, gpu)
    staged = size_kv_cache(model, gpu, parallelism=Parallelism(pipeline_parallel=2))
    assert staged.bytes_per_block * 2 == alone.bytes_per_block      # 32 of the 64 layers' KV
    assert staged.weight_bytes == pytest.approx(alone.weight_bytes / 2, abs=1)
    assert staged.pipeline_parallel == 2
    assert staged.num_blocks > 2 * alone.num_blocks  # half the KV per token and half the weights


# -- TOML -----------------------------------------------------------------------------------------------------


BASE = """
    [experiment]
    name = "pp"
    [workload]
    kind = "synthetic"
    num_requests = 40
    rate = 20
    prompt = {dist = "uniform", low = 20, high = 3000}
    output = {dist = "uniform", low = 2, high = 60}
    [scheduler]
    kind = "vllm"
    max_num_seqs = 32
    max_num_batched_tokens = 1024
    [kv_cache]
    kind = "paged"
    model = "qwen3-32b"
    gpu = "rtx-pro-6000-server"
    [cost_model]
    kind = "roofline"
    model = "qwen3-32b"
    gpu = "rtx-pro-6000-server"
"""


def test_a_pipelined_deployment_in_toml_runs_in_both_engines_and_counts_its_gpus(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + textwrap.dedent("""
        [cluster]
        pipeline_parallel = 2
        instances = 2
    """))
    fast = fast_run_agreeing_with_reference(path)
    assert fast.metrics["gpus"] == 4
    assert fast.meta["kv_cache"]["pipeline_parallel"] == 2
    check_run(fast, _requests(path))


def test_a_pipelined_deployment_behind_the_api_server_in_toml(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + textwrap.dedent("""
        [cluster]
        pipeline_parallel = 2
        [frontend]
        workers = 1
    """))
    m = fast_run_agreeing_with_reference(path).metrics
    assert m["client"]["frontend_ms"]["p50"] > 0 and m["client"]["ttft_ms"]["p50"] > m["ttft_ms"]["p50"]


def test_a_pipelined_deployment_drops_requests_whose_clients_gave_up_in_toml(tmp_path):
    # 40 requests at 2/s on 2 stages (answers take 0.8-4.2 s); clients give up after 2 s.
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE).replace("rate = 20", "rate = 2") + textwrap.dedent("""
        [cluster]
        pipeline_parallel = 2
        [frontend]
        [client]
        timeout_ms = 2000
    """))
    fast = fast_run_agreeing_with_reference(path)
    check_clients_gave_up(fast, 2000, 40)
    check_run(fast, _requests(path))


def _requests(path):
    from schedlab.study.simulation import assemble

    exp = load(path)
    spec = exp.studies[0].base
    return list(assemble(spec, exp.context, "x").workload.requests(spec.seed))


def test_a_cost_model_without_stages_is_refused_by_name(tmp_path):
    from schedlab.errors import ConfigError

    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + "[cluster]\npipeline_parallel = 2\n[[runs]]\nname = 'x'\n"
                    "cost_model = {kind = 'linear'}\n")
    with pytest.raises(ConfigError, match=r"\[cost_model\]: LinearCostModel does not time pipeline stages"):
        run_experiment(load(path))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=2, max_size=14, max_prompt=48, max_output=12), st.integers(2, 3), st.integers(1, 3),
       dyadic_linear_costs(), st.sampled_from([None, 4.0, 12.5, 30.0]))
def test_the_router_sees_each_pipelined_instance_as_it_is_at_the_arrival(requests, stages, max_num_seqs, cost,
                                                                         timeout):
    """The outstanding count a router reads is the number of requests routed to that instance
    earlier that finish after the arrival: a batch in the pipeline still holds its requests. A
    request whose client gave up counts until the instance drops it (its finish_ms): at once
    if the instance launches at that time, else at its next landing."""
    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=32)),
                LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), PagedKVCache(64, 4))

    side = client_side(timeout) if timeout is not None else None
    for engine in ENGINES:
        spy = RecordingRouter(LeastOutstandingRouter())
        result = run_pipelined(requests, make, stages, 2, spy, engine=engine, client_side=side)
        place, finish = by_id(result, "instance"), by_id(result, "finish_ms")
        routed: list[int] = []
        for rid, seen in spy.seen:
            t = requests[rid].arrival_ms
            assert seen == [sum(1 for j in routed if place[j] == i and finish[j] > t) for i in range(2)], (engine, rid)
            routed.append(rid)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=3_000, max_output=200, all_at_zero=False),
       st.integers(2, 3), st.sampled_from([512, 2048]))
def test_profiled_pipelines_match_the_reference(requests, stages, budget):
    """The shipped MoE bundle split over stages, the activations sent over PCIe through host memory."""
    from pathlib import Path

    from schedlab.parallelism import Parallelism
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES
    from schedlab_plugins.cost_models.profile_bundle import ProfileBundle
    from schedlab_plugins.cost_models.profiled import ProfiledConfig, ProfiledCostModel

    root = Path(__file__).resolve().parents[1].joinpath("experiments", "data", "llmservingsim", "profiles",
                                                        "RTXPRO6000", "Qwen", "Qwen3-30B-A3B-Instruct-2507", "bf16")
    bundle = _BUNDLE.get(root) or _BUNDLE.setdefault(root, ProfileBundle(root, 1))
    model = _presets().model("qwen3-30b-a3b")

    def make():
        cost = ProfiledCostModel(bundle, model, ProfiledConfig(profile=str(root), model="qwen3-30b-a3b"),
                                 topology=TOPOLOGIES["pcie-gen5-host"],
                                 parallelism=Parallelism(pipeline_parallel=stages))
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=8, max_num_batched_tokens=budget,
                                                         chunked_prefill=True, allocation="grow"))
        return scheduler, cost, PagedKVCache(2_000, 16)

    runs = [run_pipelined(requests, make, stages, engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)


_BUNDLE: dict = {}


def test_a_pipelined_run_with_power_reports_its_energy_from_the_command_line(tmp_path, capsys):
    """Pipelines are metered stage by stage (``test_pipeline_energy.py``); once refused here, the
    command line now runs them and prints their energy."""
    from schedlab.cli import main

    path = tmp_path / "exp.toml"
    path.write_text('[experiment]\nname = "p"\n[workload]\nkind = "synthetic"\nnum_requests = 4\n'
                    'prompt = {dist = "fixed", value = 64}\noutput = {dist = "fixed", value = 8}\nrate = 10\n'
                    '[cost_model]\nkind = "roofline"\nmodel = "llama-3-8b"\ngpu = "a100-80gb"\n'
                    '[kv_cache]\nkind = "paged"\nmodel = "llama-3-8b"\ngpu = "a100-80gb"\n'
                    '[cluster]\npipeline_parallel = 2\n[power]\nkind = "utilisation"\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "energy.j_per_token" in out and "energy p: GPUs" in out, out


class _Idle:
    """A scheduler that never plans anything."""

    def schedule(self, plan) -> None:
        return None


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_pipelined_instances_whose_scheduler_plans_nothing_stall_with_a_message(engine):
    # two pipelined instances behind a router: the reference engine's stall message used to fail on its pipeline
    # wrapper (no .scheduler) with an AttributeError
    from schedlab.errors import StallError

    def make():
        return _Idle(), LinearParallelCost(LinearCostModel(), stages=2, moe=False), PagedKVCache(32, 16)

    with pytest.raises(StallError, match="stalled at .*scheduler _Idle, 1 waiting"):
        run_pipelined([Request(0, 0.0, 8, 2)], make, 2, instances=2, router=RoundRobinRouter(), engine=engine)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_sglang_out_of_blocks_behind_a_batch_in_flight_says_why_and_what_to_do(tmp_path, engine):
    """Review multigpu82: two requests whose KV does not fit together in 80 blocks, PP 2 and the
    ``sglang`` scheduler: the first one's blocks are held by the batch in flight, which SGLang's
    scheduler does not see and cannot retract, so the second cannot decode -- as SGLang's own
    ``retract_decode`` asserts. The run stops with that reason and the way out (more blocks)."""
    from schedlab.errors import SimulationError

    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(f"""
        [experiment]
        name = "pp sglang"
        engine = "{engine}"
        [workload]
        kind = "inline"
        requests = [{{prompt_tokens = 96, output_tokens = 1000, arrival_ms = 22.0}},
                    {{prompt_tokens = 222, output_tokens = 789, arrival_ms = 380.0}}]
        [scheduler]
        kind = "sglang"
        [kv_cache]
        kind = "paged"
        model = "qwen3-30b-a3b"
        gpu = "h100-80gb"
        num_blocks = NUM_BLOCKS
        [cost_model]
        kind = "roofline"
        model = "qwen3-30b-a3b"
        gpu = "h100-80gb"
        [cluster]
        pipeline_parallel = 2
    """))
    text = path.read_text()
    path.write_text(text.replace("NUM_BLOCKS", "80"))
    with pytest.raises(SimulationError, match=r"cannot decode even after retraction \(0/80 KV blocks free\) -- "
                                              r"SGLang stops here too .*batch in flight hold blocks it cannot "
                                              r"retract\): give the cache more blocks"):
        run_experiment(load(path))
    path.write_text(text.replace("NUM_BLOCKS", "160"))   # both fit (1,096 + 1,011 tokens: 69 + 64 blocks)
    run = next(iter(run_experiment(load(path)).all_runs()))
    assert list(run.requests["output_tokens"]) == [1000, 789]
