"""The ``sglang`` scheduler (SGLang 0.5.23's rules) and the ``radix`` cache in the engines.

Hand-computed scenarios run on both engines, planned synchronously (``overlap_schedule =
false``; overlap scheduling's cases are in tests/test_sglang_diff.py); every time in them is
worked out in the comments from the linear cost model (``P`` ms per prompt token, ``D`` ms per
decode iteration) and 1-token blocks, so that tokens and blocks coincide. The property tests
check the conformance kit's rules (with and without overlap scheduling), fast-against-reference
agreement, and that the radix cache hits exactly what the paged prefix cache hits wherever their
rules coincide. Scenarios about the new-token ratio set ``ignore_eos = "none"``: their requests
have no ``max_tokens``, which by default makes them EOS-ignoring, counted at ratio 1.0. Cases
found by stepping SGLang's own scheduler are in tests/test_sglang_diff.py.
"""

from __future__ import annotations

import textwrap
import warnings

from attrs import evolve as attrs_evolve

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.configs import from_table
from schedlab.errors import ConfigError, InputWarning
from schedlab.model import Request
from schedlab.study.experiment import load, run_experiment
from schedlab.study.simulation import assemble
from schedlab.testing import (IterationChecker, check_run, compare_runs, dyadic_linear_costs, examples,
                              requests_lists, run_engine)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, SglangConfig, SglangScheduler
from schedlab_plugins.schedulers.sglang import max_running_requests
from schedlab.testing import run_cluster
from schedlab.testing.parallel import LinearParallelCost, run_data_parallel
from schedlab_plugins.routers import RoundRobinRouter
from schedlab_plugins.workloads.closed_loop import ClosedLoopConfig, make_closed_loop_workload
from test_async_scheduling import BASE as ASYNC_TOML
from test_differential import continuous_configs

ENGINES = ("fast", "reference")
COST = LinearConfig(prefill_ms_per_token=0.125, decode_ms_per_step=4.0)   # P = 0.125, D = 4
SETTINGS = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sync(**settings) -> SglangConfig:
    """A config planned synchronously, as the timelines here are worked out."""
    return SglangConfig(overlap_schedule=False, **settings)


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def run(requests, scheduler, kv, engine):
    return run_engine(requests, scheduler, LinearCostModel(COST), kv, engine=engine)


# --- retraction ---------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_retraction_takes_the_fewest_generated_then_longest_prompt_and_reestimates_the_ratio(engine):
    # 60 one-token blocks; new_token_ratio 0 (init 0), so running requests reserve nothing.
    # t=0      R0 (prompt 10, max 30): 10 + 30 + 1 page < 60 free -> admitted; prefill 10 x P -> 1.25
    # t=1.25   R1 (15) and R2 (4) wait. R1: 15 + 30 + 1 < 50 - 0 -> admitted (offset now 31);
    #          R2: 4 + 30 + 1 >= 35 free - 31 -> no room: the batch is full. Prefill 15 x P -> 3.125
    # t=3.125  R0, R1 decode, 2 blocks a step: 35 free -> 17 steps fit (1 block left) -> 71.125
    # t=71.125 decode does not fit. Both have 18 tokens; the tie goes to the longer prompt: R1 is
    #          retracted (frees 15 + 17 = 32 -> 33 free: the next decode fits, stop). The ratio becomes
    #          (18 generated + 20 x 1) / (30 max + 1) -> capped at 1.0. R0 decodes -> 75.125, 19 tokens
    # t=75.125 R2 (then R1, re-queued at the back) wait: R2 needs 4 + 30 + 1 < 32 free - 11 x 1.0 -> no.
    #          R0 decodes its last 11 tokens -> 119.125
    # t=119.125 R2 admitted (35 < 60); R1 (33 tokens to recompute + min(30 - 18, 4096) + 1) >= 56 - 31 ->
    #          full. Prefill 4 x P -> 119.625; 29 decodes -> 235.625
    # t=235.625 R1 recomputes its 33 tokens -> 239.75 (19th token); 11 decodes -> 283.75
    reqs = [Request(0, 0.0, 10, 30), Request(1, 0.5, 15, 30), Request(2, 1.0, 4, 30)]
    sched = SglangScheduler(_sync(init_new_token_ratio=0.0, chunked_prefill_size=0, ignore_eos="none"))
    r = run(reqs, sched, PagedKVCache(60, 1), engine)
    assert sched.retraction_log == [(71.125, (1,), 1.0)]
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 1.25, 2: 119.125}
    assert by_id(r, "first_token_ms") == {0: 1.25, 1: 3.125, 2: 119.625}
    assert by_id(r, "finish_ms") == {0: 119.125, 1: 283.75, 2: 235.625}
    assert by_id(r, "preemptions") == {0: 0, 1: 1, 2: 0}
    assert by_id(r, "recomputed_tokens") == {0: 0, 1: 32, 2: 0}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("steps, ratio", [
    (20, (11 + 11 + 20 * 2) / 81),
    (1, (11 + 11 + 1 * 2) / 81),
    (0, (11 + 11) / 81),
])
def test_retraction_stops_once_the_next_decode_fits(engine, steps, ratio):
    # 50 one-token blocks, ratio 0 and max_new_tokens estimates clipped to 1 token, so all three start at
    # once: R0 (prompt 8): 8 + 1 + 1 page < 50; R1 (6): 8 < 50 - 10; R2 (4): 6 < 50 - 18. Prefill 18 x P
    # -> 2.25. 32 free, 3 blocks a step: 10 steps fit (2 left) -> t = 42.25, 11 tokens each. The victim:
    # equal tokens, longest prompt first: R0 (frees 8 + 10 = 18 -> 20 free). Two requests need 2 blocks:
    # one victim is enough whatever retract_decode_steps says (SGLang 0.4 went on until 20 tokens per
    # request were free); the steps enter the ratio (generated + steps x 2) / (40 + 40 + 1).
    reqs = [Request(0, 0.0, 8, 40), Request(1, 0.0, 6, 40), Request(2, 0.0, 4, 40)]
    retracted = (0,)
    sched = SglangScheduler(_sync(init_new_token_ratio=0.0, clip_max_new_tokens=1, chunked_prefill_size=0,
                                         retract_decode_steps=steps, ignore_eos="none"))
    r = run(reqs, sched, PagedKVCache(50, 1), engine)
    assert sched.retraction_log[0] == (42.25, retracted, ratio)
    check_run(r, reqs, kv_blocks=50)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_ratio_after_a_retraction_decays_only_from_the_next_decode_step(engine):
    # 80 one-token blocks; the ratio decays in one step from 0.7 to its floor 0.098 (decay 0.602).
    # R0 (prompt 8, max 60) prefills 0 -> 1.0 and decodes. R1 (prompt 15, max 30) arrives at 2: at 5.0
    # (1 decode, ratio 0.098) 45 < 71 - 58 x 0.098 -> admitted, prefill -> 6.875. 56 blocks free, 2 a step:
    # 28 steps fit; the 29th does not, at 6.875 + 112 = 118.875.
    # R2 (prompt 4, max 20) arrives at 100: at 102.875, 8 free - (34 + 5) x 0.098 = 4.2 <= 24: full.
    # At 118.875 R0 has 30 tokens, R1 29: R1 is retracted; ratio (30 + 20) / (60 + 1). R0 decodes -> 122.875.
    # At 122.875 (no decay yet) R2 is tried first: 42 free - 29 x 0.820 = 18.2 <= 25: refused (decayed once
    # it would have been 0.098 and let R2 in). R0's 60th token comes at 122.875 + 29 x 4 = 238.875.
    # (Admissions need a page more than the prompt and max_tokens: R0 69 < 80, R1 46 < 71 - 58 x 0.098,
    # R2 25, refused at 102.875 with 8 free.)
    reqs = [Request(0, 0.0, 8, 60), Request(1, 2.0, 15, 30), Request(2, 100.0, 4, 20)]
    sched = SglangScheduler(_sync(new_token_ratio_decay_steps=1, chunked_prefill_size=0, ignore_eos="none"))
    r = run(reqs, sched, PagedKVCache(80, 1), engine)
    assert sched.retraction_log == [(118.875, (1,), 50 / 61)]
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 5.0, 2: 238.875}


# --- new_token_ratio admission ------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("decay_steps, r1_arrival, admitted_at", [
    # 120 one-token blocks. R0 (prompt 10, max 100) runs alone: its token g comes at 1.25 + 4 (g - 1),
    # with 10 + g - 1 blocks held. R1 (prompt 20, max 40) needs 20 + 40 + 1 page = 61 tokens below
    # free - (100 - g) x ratio, the ratio decayed once per decode step since R0's prefill.
    # Decay over 10 steps (0.0602 per step): at g = 5 (t = 17.25, 4 steps) the ratio is 0.4592 and
    # 106 - 95 x 0.4592 = 62.4 > 61: admitted.
    (10, 14.0, 17.25),
    # arriving earlier, at g = 4 (t = 13.25): 0.5194 -> 107 - 96 x 0.5194 = 57.1 <= 61: refused, and the
    # batch stays full -- no new attempt -- until R0 finishes (t = 1.25 + 99 x 4 = 397.25)
    (10, 10.0, 397.25),
    # SGLang's default decay (600 steps): at g = 5 the ratio is still 0.696 -> 39.9: refused
    (600, 14.0, 397.25),
])
def test_admission_reserves_the_running_requests_decayed_ratio(engine, decay_steps, r1_arrival, admitted_at):
    reqs = [Request(0, 0.0, 10, 100), Request(1, r1_arrival, 20, 40)]
    sched = SglangScheduler(_sync(new_token_ratio_decay_steps=decay_steps, chunked_prefill_size=0,
                                         ignore_eos="none"))
    r = run(reqs, sched, PagedKVCache(120, 1), engine)
    assert by_id(r, "first_scheduled_ms")[1] == admitted_at


@pytest.mark.parametrize("engine", ENGINES)
def test_the_ratio_is_reset_when_the_server_goes_idle(engine):
    # R0 as above runs alone and finishes at 397.25, having decayed the ratio to its floor (0.098).
    # R2 (prompt 10, max 100) arrives at 500 on an idle server: the ratio is back at 0.7. R3 (prompt
    # 20, max 40) arrives at 510; at t = 513.25 R2 has 4 tokens and 3 decays: 0.5194 -> refused (as
    # above), admitted when R2 finishes at 500 + 1.25 + 99 x 4 = 897.25. Without the reset the floor
    # ratio would have let it in at 513.25 (107 - 96 x 0.098 = 97.6 > 61).
    reqs = [Request(0, 0.0, 10, 100), Request(1, 500.0, 10, 100), Request(2, 510.0, 20, 40)]
    sched = SglangScheduler(_sync(new_token_ratio_decay_steps=10, chunked_prefill_size=0, ignore_eos="none"))
    r = run(reqs, sched, PagedKVCache(120, 1), engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 500.0, 2: 897.25}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("prompt, admitted_at", [
    # R0 (prompt 10, max 31) prefills 0 -> 1.25. R1 (max 30) arrives at 1; at 1.25 the ratio is 0.5 (no decode
    # yet): 50 free - 30 x 0.5 = 35 tokens remain. A request needing 35 (prompt 4 + 30 + a page) is refused --
    # SGLang admits only total < remaining -- and waits for R0 to finish (1.25 + 30 x 4); one needing 34 goes in.
    (4, 121.25),
    (3, 1.25),
])
def test_admission_needs_fewer_tokens_than_remain(engine, prompt, admitted_at):
    reqs = [Request(0, 0.0, 10, 31), Request(1, 1.0, prompt, 30)]
    sched = SglangScheduler(_sync(init_new_token_ratio=0.5, chunked_prefill_size=0, ignore_eos="none"))
    r = run(reqs, sched, PagedKVCache(60, 1), engine)
    assert by_id(r, "first_scheduled_ms")[1] == admitted_at


@pytest.mark.parametrize("engine", ENGINES)
def test_mixed_iterations_do_not_decay_the_ratio(engine):
    # Mixed chunks of 8; the ratio would fall to its floor in one decode-only step (decay over 1 step).
    # R0 (prompt 4, max 100) prefills 0 -> 0.5. R1 (prompt 20, 1 token) arrives at 0.25 and is prefilled in
    # three mixed iterations with R0's decodes (7 + 7 + 6 tokens: 0.5 -> 5.375 -> 10.25 -> 15.0). R2
    # (prompt 100, max 50) arrives at 12. At 15.0 the ratio is still 0.7 (only mixed iterations so far):
    # 193 free - 96 x 0.7 = 125.8 <= 151: refused; it goes in when R0 finishes, 15.0 + 96 x 4 = 399.
    # (Had the mixed iterations decayed it, 193 - 96 x 0.098 = 183.6 would have let R2 in at 15.0.)
    reqs = [Request(0, 0.0, 4, 100), Request(1, 0.25, 20, 1), Request(2, 12.0, 100, 50)]
    sched = SglangScheduler(_sync(chunked_prefill_size=8, enable_mixed_chunk=True,
                                         new_token_ratio_decay_steps=1, ignore_eos="none"))
    r = run(reqs, sched, PagedKVCache(200, 1), engine)
    assert by_id(r, "finish_ms")[1] == 15.0
    assert by_id(r, "prefill_chunks")[1] == 3
    assert by_id(r, "first_scheduled_ms")[2] == 399.0


def test_constants_follow_sglang():
    s = SglangScheduler()
    assert (s.init_ratio, s.min_ratio) == (0.7, 0.7 * 0.14)
    assert s.ratio_decay == pytest.approx((0.7 - 0.098) / 600)
    c = SglangConfig()
    assert (c.chunked_prefill_size, c.max_prefill_tokens, c.clip_max_new_tokens, c.retract_decode_steps) == (
        8192, 16384, 4096, 20)
    assert c.overlap_schedule == "auto" and c.plans_ahead  # SGLang's overlap scheduler is on by default
    half = SglangScheduler(_sync(schedule_conservativeness=0.5))
    assert half.init_ratio == 0.35 and half.min_ratio == pytest.approx(0.049)


# --- prefill first, chunks, mixed chunks ---------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mixed, r1_first_token, longest_gap", [
    # R0 (prompt 4, 10 tokens) prefills 0 -> 0.5 and decodes 0.5 -> 4.5. R1 (prompt 20) arrives at 1;
    # chunks of 8. Prefill first: 8 tokens 4.5 -> 5.5, 8 more -> 6.5, the last 4 -> 7.0 (R1's first
    # token); R0 waits through all three: its tokens at 4.5 and 11.0, a 6.5 ms gap.
    (False, 7.0, 6.5),
    # Mixed: R0's decode rides along and uses one token of each chunk: 7 tokens + a decode,
    # 4.5 -> 9.375, 7 more -> 14.25, the last 6 -> 19.0; R0 never waits more than 4.875 ms.
    (True, 19.0, 4.875),
])
def test_chunked_prefill_stalls_decodes_unless_mixed(engine, mixed, r1_first_token, longest_gap):
    reqs = [Request(0, 0.0, 4, 10), Request(1, 1.0, 20, 2)]
    sched = SglangScheduler(_sync(chunked_prefill_size=8, enable_mixed_chunk=mixed))
    r = run(reqs, sched, PagedKVCache(100, 1), engine)
    assert by_id(r, "first_token_ms") == {0: 0.5, 1: r1_first_token}
    assert by_id(r, "prefill_chunks") == {0: 1, 1: 3}
    assert r.metrics["itl_ms"]["max"] == longest_gap
    # either way R0's 10th token comes at 39.0: 11.0 + 7 x 4, or 19.0 + 5 x 4
    assert by_id(r, "finish_ms")[0] == 39.0


def test_mixed_chunks_need_chunked_prefill():
    with pytest.raises(ConfigError, match=r"x.toml: \[scheduler\]: enable_mixed_chunk: needs chunked_prefill_size > 0"):
        from_table(SglangConfig, {"enable_mixed_chunk": True, "chunked_prefill_size": 0}, where="x.toml: [scheduler]")


def test_priority_settings_follow_sglangs_rules():
    with pytest.raises(ConfigError, match=r"x.toml: \[scheduler\]: retraction_policy: \"priority\" needs "
                                          r"enable_priority_scheduling = true"):
        from_table(SglangConfig, {"retraction_policy": "priority"}, where="x.toml: [scheduler]")
    with pytest.raises(ConfigError, match="enable_priority_scheduling: priority preemption with enable_mixed_chunk"):
        from_table(SglangConfig, {"enable_priority_scheduling": True, "enable_mixed_chunk": True,
                                  "chunked_prefill_size": 64}, where="x.toml: [scheduler]")
    # without preemption, mixing is fine; SGLang's direction by default: higher values first
    cfg = SglangConfig(enable_priority_scheduling=True, enable_mixed_chunk=True, chunked_prefill_size=64,
                       disable_priority_preemption=True)
    assert not cfg.preempts_by_priority and cfg.priority_sign == -1
    assert SglangConfig(enable_priority_scheduling=True, schedule_low_priority_values_first=True).priority_sign == 1
    assert SglangConfig().priority_sign == 0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("policy, first_victim", [("length", 1), ("priority", 0)])
def test_retraction_policy_priority_retracts_the_least_important_first(engine, policy, first_victim):
    # a 24-token pool and a zero ratio: R0 runs from 0 (its prompt done at 0.5), and R1, arriving
    # then, needs 6 + 10 + 1 page = 17 below 24 - 5 held: admitted, as R0's answer is estimated at
    # nothing. 4 + 10 + 6 + 10 tokens do not fit in 24. When decode runs out, "length" retracts the
    # one with the fewest generated tokens, R1 (admitted later); "priority" the least important,
    # R0 (priority 0 against 5, higher values first)
    requests = [Request(0, 0.0, 4, 10, priority=0), Request(1, 0.5, 6, 10, priority=5)]
    scheduler = SglangScheduler(_sync(enable_priority_scheduling=True, retraction_policy=policy,
                                      init_new_token_ratio=0.0, ignore_eos="none"))
    r = run(requests, scheduler, RadixKVCache(24, 1), engine)
    assert scheduler.retraction_log[0][1] == (first_victim,)
    assert by_id(r, "preemptions")[first_victim] >= 1


def test_sglang_cuts_what_the_pool_cannot_hold_and_rejects_a_prompt_that_nearly_fills_it():
    # 40 tokens of KV in SGLang's radix tree: max_new_tokens is cut to 40 - 10 - 2 = 28
    # (max_new_tokens_for_memory: the pool less the prompt, a page and a token), and a prompt of
    # 40 - 6 = 34 tokens is refused (max_req_input_len = max_req_len - 5, max_req_len = pool - 1)
    r = run_engine([Request(0, 0.0, 10, 29), Request(1, 0.0, 10, 28), Request(2, 0.0, 34, 1)], SglangScheduler(),
                   kv=RadixKVCache(40, 1))
    assert by_id(r, "max_tokens") == {0: 28, 1: 28, 2: 1}
    assert by_id(r, "generated_tokens") == {0: 28, 1: 28, 2: 0}
    assert by_id(r, "rejected") == {0: 0, 1: 0, 2: 1}
    assert "maximum allowed length (34 tokens)" in r.rejections[2]


@pytest.mark.parametrize("engine", ENGINES)
def test_without_a_prefix_cache_a_request_ignoring_eos_needs_a_token_more_than_the_pool_cut(engine):
    # The same pool without a prefix cache (--disable-radix-cache): the requests ignoring EOS go
    # through add_one_req_ignore_eos, which needs more than a token free after the prompt's pages
    # and a page more (``paged_input``) and the whole answer: 40 - (10 + 1) - 28 = 1 is not. So
    # 0 (29 asked, cut to 28: its ignore_eos stays) and 1 (28) never get in -- SGLang keeps
    # them, and every request behind them, waiting for ever; schedlab turns them away -- while
    # 3 (27: 40 - 11 - 27 = 2 > 1) runs; so does 4, whose EOS makes it go by the ratio.
    reqs = [Request(0, 0.0, 10, 29), Request(1, 0.0, 10, 28), Request(3, 0.0, 10, 27),
            Request(4, 30.0, 10, 28, max_tokens=28)]
    r = run_engine(reqs, SglangScheduler(_sync()), LinearCostModel(ONE_MS), PagedKVCache(40, 1), engine=engine)
    assert by_id(r, "max_tokens") == {0: 28, 1: 28, 3: 27, 4: 28}
    assert by_id(r, "rejected") == {0: 1, 1: 1, 3: 0, 4: 0}
    assert "add_one_req_ignore_eos" in r.rejections[0]
    assert by_id(r, "generated_tokens") == {0: 0, 1: 0, 3: 27, 4: 28}
    assert by_id(r, "first_scheduled_ms") == {0: -1.0, 1: -1.0, 3: 0.0, 4: 30.0}


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_retracted_request_can_always_come_back(engine):
    """12 tokens of KV, estimates clipped at 8 new tokens: request 1 (prompt 1, 10 asked) would
    need 7 + 4 + 1 = 12 to come back after a retraction at 6 tokens, never below the pool -- the
    run once stalled (found by a random hypothesis seed). SGLang cuts max_new_tokens to what an
    empty pool holds: 12 - 1 - 2 = 9, and then 7 + 3 + 1 = 11 < 12: retracted once, it comes
    back and finishes; request 0 (7 asked, 1 + 7 <= 9) as asked."""
    cfg = _sync(max_running_requests=2, max_prefill_tokens=16, init_new_token_ratio=0.0,
                       new_token_ratio_decay_steps=1, clip_max_new_tokens=8, retract_decode_steps=0)
    reqs = [Request(0, 0.0, 1, 7, max_tokens=7), Request(1, 0.0, 1, 10)]
    # (SGLang's tree: without it, add_one_req_ignore_eos would never admit 1, cut to what an empty
    # pool holds -- it needs a token more)
    r = run(reqs, SglangScheduler(cfg), RadixKVCache(12, 1), engine)
    assert by_id(r, "rejected") == {0: 0, 1: 0}
    assert by_id(r, "max_tokens") == {0: 7, 1: 9}
    assert by_id(r, "generated_tokens") == {0: 7, 1: 9}
    assert by_id(r, "preemptions") == {0: 0, 1: 1}


# --- pages of more than one token ----------------------------------------------------------------

ONE_MS = LinearConfig(prefill_ms_per_token=0.0, decode_ms_per_step=0.0, per_seq_ms=0.0, per_context_token_ms=0.0,
                      base_ms=1.0)  # every iteration 1 ms, whatever it holds


@pytest.mark.parametrize("engine", ENGINES)
def test_the_prompt_and_chunk_budgets_are_charged_whole_pages(engine):
    # 16-token pages, 17-token prompts: SGLang charges each prompt 32 tokens of its prompt and
    # chunk budgets (``_update_prefill_budget``: ``ceil_paged_tokens``). With chunking off and 64
    # prompt tokens a pass, R0 leaves 32 and R1's 32 reaches it: one prompt a pass, at 0, 1, 2, 3
    # (charging 17 tokens, R0 left 47 and R1 went with it: two a pass). With 64-token chunks, R0
    # and R1 spend the chunk budget and R2 comes whole at 1 (charging 17, R2 was cut to 16 + 1).
    reqs = [Request(i, 0.0, 17, 1) for i in range(4)]
    r = run_engine(reqs, SglangScheduler(_sync(chunked_prefill_size=0, max_prefill_tokens=64)),
                   LinearCostModel(ONE_MS), RadixKVCache(64, 16), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}
    r = run_engine(reqs[:3], SglangScheduler(_sync(chunked_prefill_size=64)), LinearCostModel(ONE_MS),
                   RadixKVCache(64, 16), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 0.0, 2: 1.0}
    assert by_id(r, "prefill_chunks") == {0: 1, 1: 1, 2: 1}


@pytest.mark.parametrize("engine", ENGINES)
def test_retraction_goes_on_until_every_request_on_a_page_boundary_has_a_page(engine):
    # 19 pages of 16 tokens. At 20 ms the six running requests' KV ends on a page boundary and no
    # page is free: the next decode needs six pages. The first retracted (R5: fewest generated,
    # longest prompt) frees four; the five left need five (``check_decode_mem`` counts a page per
    # request on a boundary), so SGLang retracts R4 too. Counting a token per request, schedlab
    # stopped at R5 and the decode that followed failed ("cannot decode even after retraction").
    reqs = [Request(3, 0.0, 48, 64, max_tokens=64), Request(4, 0.0, 48, 100, max_tokens=100),
            Request(6, 0.0, 16, 40, max_tokens=40), Request(1, 2.0, 16, 40, max_tokens=40),
            Request(2, 2.0, 32, 64, max_tokens=64), Request(5, 3.0, 48, 64, max_tokens=64)]
    sched = SglangScheduler(_sync(chunked_prefill_size=0, schedule_conservativeness=0.01))
    r = run_engine(reqs, sched, LinearCostModel(ONE_MS), RadixKVCache(19, 16), engine=engine)
    assert [(t, ids) for t, ids, _ in sched.retraction_log[:1]] == [(20.0, (5, 4))]
    check_run(r, reqs)


@pytest.mark.parametrize("engine", ENGINES)
def test_without_a_prefix_cache_a_request_ignoring_eos_is_admitted_by_its_known_length(engine):
    # --disable-radix-cache: SGLang admits a request that ignores EOS by ``add_one_req_ignore_eos``.
    # R0 (300 + 100) is prefilled at 0; at 1 it holds 300 tokens of 1,000 and has 99 to go (offset
    # 99 at ratio 1). R1 (100 + 500): its 100 prompt tokens fit min(700, 601); with the requests
    # finishing by tokens left, R0 (99 left, 301 held) then R1 (500, 100), the free tokens stay
    # above one a request: 600 - 2 x 99 = 402 > 2, then 600 + 301 - 500 = 401 > 1. So R1 starts at 1.
    # With the radix tree on, the usual rule wants 100 + 500 + 1 < 601: R1 waits for R0's finish.
    reqs = [Request(0, 0.0, 300, 100), Request(1, 1.0, 100, 500)]
    sched = _sync(chunked_prefill_size=0)
    r = run_engine(reqs, SglangScheduler(sched), LinearCostModel(ONE_MS), PagedKVCache(1000, 1), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 1.0}
    r = run_engine(reqs, SglangScheduler(sched), LinearCostModel(ONE_MS), RadixKVCache(1000, 1), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 100.0}


def test_sglang_sizes_its_request_slots_from_the_pool():
    # resolve_max_num_reqs: pool / context x 512, kept in [2048, 4096], at most half the pool.
    # Llama-3-8B on an A100-80GB: 454,992 tokens, context 8,192 -> 28,437 -> 4,096.
    slots = lambda pool, context=0, asked=0: max_running_requests(  # noqa: E731
        SglangConfig(context_length=context, max_running_requests=asked), PagedKVCache(pool // 16, 16))
    assert slots(454_992, 8192) == 4096
    assert slots(1_048_576, 131_072) == 4096   # 1,048,576 / 131,072 x 512 = 4,096
    assert slots(262_144, 131_072) == 2048     # 1,024 -> at least 2,048
    assert slots(2_048) == 1024                # no context: 512 -> 2,048, but half the pool is 1,024
    assert slots(454_992, 8192, asked=64) == 64
    assert slots(96, 8192, asked=64) == 48     # asked for, still at most half the pool
    scheduler = SglangScheduler(SglangConfig(context_length=8192))
    assert scheduler.kv_problem(PagedKVCache(454_992 // 16, 16)) is None and scheduler.slots == 4096


@pytest.mark.parametrize("engine", ENGINES)
def test_a_large_pool_admits_more_than_2048_requests_in_one_pass(engine):
    # 2,100 4-token prompts at once on a 1,048,576-token pool with a 131,072-token context: 4,096
    # slots, so one pass admits them all (with a fixed 2,048, the last 52 waited a step). Each is
    # charged a 16-token page of the 40,000-token prompt budget: 33,600 in all.
    reqs = [Request(i, 0.0, 4, 1) for i in range(2100)]
    sched = SglangScheduler(_sync(context_length=131_072, chunked_prefill_size=0, max_prefill_tokens=40_000))
    r = run_engine(reqs, sched, LinearCostModel(ONE_MS), PagedKVCache(65_536, 16), engine=engine)
    assert set(by_id(r, "first_scheduled_ms").values()) == {0.0}
    assert sched.slots == 4096


# --- waiting orders ---------------------------------------------------------------------------


def _lpm_requests():
    # B = 4. R0 caches a 16-token system prompt of group a, then at t = 10 five requests arrive:
    # ids 1, 2: group c, 40 shared tokens of 44; 3: 20 unique tokens; 4: group a, 8 of 20 shared;
    # 5: group a, 16 of 20 shared. Every answer is one token, one request runs at a time.
    return [Request(0, 0.0, 17, 1, prefix_group="a", prefix_tokens=16),
            Request(1, 10.0, 44, 1, prefix_group="c", prefix_tokens=40),
            Request(2, 10.0, 44, 1, prefix_group="c", prefix_tokens=40),
            Request(3, 10.0, 20, 1),
            Request(4, 10.0, 20, 1, prefix_group="a", prefix_tokens=8),
            Request(5, 10.0, 20, 1, prefix_group="a", prefix_tokens=16)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("make_kv", [lambda: RadixKVCache(1000, 4), lambda: PrefixKVCache(1000, 4)],
                         ids=["radix", "paged-prefix"])
@pytest.mark.parametrize("policy, first_scheduled", [
    # lpm at t=10: hits 5: 16, 4: 8, the rest 0; request 2 matches 40 >= 32 tokens of request 1's
    # prompt in the queue and is deprioritized: 5, 4, 1, 3, 2. After 5 (4 tokens, 0.5 ms) and 4
    # (12 tokens) comes 1 (44 tokens, 10.5 + 1.5 -> 12 -> 17.5); then request 2 hits the 40 tokens
    # request 1 cached and goes before 3: 2 at 17.5 (4 tokens), 3 at 18.0.
    ("lpm", {0: 0.0, 1: 12.0, 2: 17.5, 3: 18.0, 4: 10.5, 5: 10.0}),
    # fcfs: 1 (44 tokens -> 15.5), 2 (hits 40: 4 tokens -> 16.0), 3 (20 -> 18.5), 4 (12 -> 20.0), 5
    ("fcfs", {0: 0.0, 1: 10.0, 2: 15.5, 3: 16.0, 4: 18.5, 5: 20.0}),
])
def test_longest_prefix_match_order(engine, make_kv, policy, first_scheduled):
    sched = SglangScheduler(_sync(max_running_requests=1, schedule_policy=policy, chunked_prefill_size=0))
    r = run(_lpm_requests(), sched, make_kv(), engine)
    assert by_id(r, "first_scheduled_ms") == first_scheduled
    assert by_id(r, "cached_tokens") == {0: 0, 1: 0, 2: 40, 3: 0, 4: 8, 5: 16}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("policy, first_scheduled, cached", [
    # two at a time; at t=10 requests 1 and 2 share 40 uncached tokens, 3 is unique (hits all 0).
    # lpm: 2 matches 40 >= 32 tokens of 1's prompt in the queue and goes last, so 1 and 3 run together
    # (64 tokens -> 18.0) and 2 then hits the 40 tokens 1 cached.
    ("lpm", {1: 10.0, 2: 18.0, 3: 10.0}, 40),
    # fcfs: 1 and 2 together, and the shared prefix is computed twice: SGLang puts a batch's pages into
    # its tree after the forward pass (88 tokens -> 21.0), then 3.
    ("fcfs", {1: 10.0, 2: 10.0, 3: 21.0}, 0),
])
def test_lpm_defers_a_request_sharing_an_uncached_prefix_with_one_before_it(engine, policy, first_scheduled, cached):
    reqs = [Request(0, 0.0, 4, 1),
            Request(1, 10.0, 44, 1, prefix_group="c", prefix_tokens=40),
            Request(2, 10.0, 44, 1, prefix_group="c", prefix_tokens=40),
            Request(3, 10.0, 20, 1)]
    sched = SglangScheduler(_sync(max_running_requests=2, schedule_policy=policy, chunked_prefill_size=0))
    r = run(reqs, sched, RadixKVCache(1000, 4), engine)
    assert {i: t for i, t in by_id(r, "first_scheduled_ms").items() if i} == first_scheduled
    assert by_id(r, "cached_tokens")[2] == cached


def test_lpm_does_not_sort_more_than_128_waiting_requests():
    # R0 caches group a's 16 tokens. At t=10, 129 unique 8-token prompts (ids 1-129) arrive, then id 130
    # sharing those 16 tokens; one runs at a time, 1 ms each. 130 waiting > 128: arrival order, id 1 at
    # 10; 129 waiting: id 2 at 11; 128 waiting: sorted, id 130 (16 cached) goes next, at 12.
    reqs = [Request(0, 0.0, 17, 1, prefix_group="a", prefix_tokens=16)]
    reqs += [Request(i, 10.0, 8, 1) for i in range(1, 130)]
    reqs.append(Request(130, 10.0, 20, 1, prefix_group="a", prefix_tokens=16))
    sched = SglangScheduler(_sync(max_running_requests=1, schedule_policy="lpm", chunked_prefill_size=0))
    first = by_id(run(reqs, sched, RadixKVCache(1000, 4), "fast"), "first_scheduled_ms")
    assert (first[1], first[2], first[130], first[3]) == (10.0, 11.0, 12.0, 12.5)


def test_lpm_without_a_prefix_cache_is_fcfs():
    reqs = _lpm_requests()
    orders = {}
    for policy in ("lpm", "fcfs"):
        sched = SglangScheduler(_sync(max_running_requests=1, schedule_policy=policy, chunked_prefill_size=0))
        orders[policy] = by_id(run(reqs, sched, PagedKVCache(1000, 4), "fast"), "first_scheduled_ms")
    assert orders["lpm"] == orders["fcfs"]


@pytest.mark.parametrize("engine", ENGINES)
def test_longest_output_first(engine):
    # one at a time; at t=0 requests 0..2 wait with max_tokens 5, 30, 10: 1, 2, 0
    reqs = [Request(0, 0.0, 8, 5), Request(1, 0.0, 8, 30), Request(2, 0.0, 8, 10)]
    sched = SglangScheduler(_sync(max_running_requests=1, schedule_policy="lof"))
    r = run(reqs, sched, PagedKVCache(200, 1), engine)
    first = by_id(r, "first_scheduled_ms")
    assert sorted(first, key=first.get) == [1, 2, 0]


# --- the queue limit (--max-queued-requests) -------------------------------------------------------

QUEUE_FULL = "The request queue is full."
OUTRANKED = "The request is aborted by a higher priority request."


@pytest.mark.parametrize("engine", ENGINES)
def test_queue_limit_turns_away_arrivals_that_find_it_full(engine):
    # One slot, at most 1 queued; prompts of 8 (prefill 8 x P = 1.0), answers of 2 tokens.
    # t=0    R0, R1, R2 arrive; SGLang reads them before it schedules: R0 queued, R1 and R2 find one
    #        request queued -> turned away. R0 admitted -> first token 1.0, decode -> 5.0
    # t=5    R3, R4 (arrived at 1.5, read now): R3 queued, R4 turned away. R3 -> 6.0, 10.0
    reqs = [Request(i, 0.0 if i < 3 else 1.5, 8, 2) for i in range(5)]
    r = run(reqs, SglangScheduler(_sync(max_running_requests=1, max_queued_requests=1)), PagedKVCache(200, 1), engine)
    assert by_id(r, "rejected") == {0: 0, 1: 1, 2: 1, 3: 0, 4: 1}
    assert by_id(r, "finish_ms") == {0: 5.0, 1: 0.0, 2: 0.0, 3: 10.0, 4: 5.0}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: -1.0, 2: -1.0, 3: 5.0, 4: -1.0}
    assert r.rejections == {1: QUEUE_FULL, 2: QUEUE_FULL, 4: QUEUE_FULL}
    assert r.metrics["rejected"] == 3 and r.metrics["finished"] == 2
    check_run(r, reqs)


@pytest.mark.parametrize("engine", ENGINES)
def test_queue_limit_with_priorities_turns_away_the_least_important_latest_queued(engine):
    # One slot, at most 2 queued, higher priority values first, no preemption. All arrive at 0:
    # R0 (priority 1) and R1 (1) are queued; R2 (2) finds 2 queued: the least important is a tie
    # of R0 and R1, the later queued goes -> R1 turned away, R2 queued. R3 (0) finds R0 least
    # important but not less than itself -> R3 turned away; so is R4 (1): as important as R0, not
    # more. R2 goes first: 0 -> 1.0 -> 5.0; then R0: 5.0 -> 6.0 -> 10.0.
    reqs = [Request(0, 0.0, 8, 2, priority=1), Request(1, 0.0, 8, 2, priority=1), Request(2, 0.0, 8, 2, priority=2),
            Request(3, 0.0, 8, 2, priority=0), Request(4, 0.0, 8, 2, priority=1)]
    sched = SglangScheduler(_sync(max_running_requests=1, max_queued_requests=2, enable_priority_scheduling=True,
                                  disable_priority_preemption=True))
    r = run(reqs, sched, PagedKVCache(200, 1), engine)
    assert r.rejections == {1: OUTRANKED, 3: QUEUE_FULL, 4: QUEUE_FULL}
    assert by_id(r, "finish_ms") == {0: 10.0, 1: 0.0, 2: 5.0, 3: 0.0, 4: 0.0}
    assert by_id(r, "first_scheduled_ms")[0] == 5.0
    check_run(r, reqs)


@pytest.mark.parametrize("engine", ENGINES)
def test_queue_limit_turns_away_a_retracted_request_with_the_tokens_it_got(engine):
    # The retraction scenario at the top, plus R3 (prompt 4, max 30) arriving at 2.0, and at most
    # 2 queued: R1 and R2 are read at 1.25 (queue: R1, R2), R1 is admitted; R3 is read at 3.125
    # (queue: R2, R3). At 71.125 R1 is retracted with 18 tokens and finds 2 queued: turned away.
    # R0 decodes on alone -> 119.125; R2 is admitted then (R3 does not fit beside it) -> 119.625,
    # 29 decodes -> 235.625; R3 then -> 236.125, 29 decodes -> 352.125.
    reqs = [Request(0, 0.0, 10, 30), Request(1, 0.5, 15, 30), Request(2, 1.0, 4, 30), Request(3, 2.0, 4, 30)]
    sched = SglangScheduler(_sync(init_new_token_ratio=0.0, chunked_prefill_size=0, ignore_eos="none",
                                  max_queued_requests=2))
    r = run(reqs, sched, PagedKVCache(60, 1), engine)
    assert sched.retraction_log == [(71.125, (1,), 1.0)]
    assert r.rejections == {1: QUEUE_FULL}
    assert by_id(r, "finish_ms") == {0: 119.125, 1: 71.125, 2: 235.625, 3: 352.125}
    assert by_id(r, "generated_tokens")[1] == 18 and by_id(r, "preemptions")[1] == 1
    assert by_id(r, "first_token_ms")[1] == 3.125
    check_run(r, reqs, rejections="any")


WAITED_TOO_LONG = "Request waiting timeout reached."


@pytest.mark.parametrize("engine", ENGINES)
def test_waiting_timeout_counts_from_the_pass_that_queued_the_request(engine):
    # One slot, SGLANG_REQ_WAITING_TIMEOUT of 3 ms. R0 (prompt 8, 3 tokens): 0 -> 1.0 -> 5.0 -> 9.0.
    # R1 arrives at 0.5, is read (queued) at 1.0; at the next pass, 5.0, it has waited 4 >= 3:
    # aborted. R2 and R3 arrive at 6.0 and are read at 9.0: R2 runs 9.0 -> 10.0; R3 waits from 9.0
    # and runs at 10.0 (1 ms queued, though 4 ms after its arrival) -> 11.0.
    reqs = [Request(0, 0.0, 8, 3), Request(1, 0.5, 8, 1), Request(2, 6.0, 8, 1), Request(3, 6.0, 8, 1)]
    sched = SglangScheduler(_sync(max_running_requests=1, waiting_timeout_ms=3.0))
    r = run(reqs, sched, PagedKVCache(200, 1), engine)
    assert r.rejections == {1: WAITED_TOO_LONG}
    assert by_id(r, "finish_ms") == {0: 9.0, 1: 5.0, 2: 10.0, 3: 11.0}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: -1.0, 2: 9.0, 3: 10.0}
    check_run(r, reqs)


@pytest.mark.parametrize("engine", ENGINES)
def test_waiting_timeout_wakes_the_scheduler_when_it_ends(engine):
    # R0 (prompt 8, 10 tokens) decodes alone from 1.0 to 37.0, one token every 4 ms; nothing else
    # happens meanwhile. R1, read at 1.0, waits for the one slot: with 6 ms its time is up at 7.0,
    # and it is aborted at the boundary after, 9.0 (the scheduler asked to be woken); with 40 ms
    # it outlasts R0 and runs at 37.0 -> 38.0.
    for timeout, rejected, finish in ((6.0, {1: WAITED_TOO_LONG}, 9.0), (40.0, {}, 38.0)):
        reqs = [Request(0, 0.0, 8, 10), Request(1, 0.5, 8, 1)]
        r = run(reqs, SglangScheduler(_sync(max_running_requests=1, waiting_timeout_ms=timeout)),
                PagedKVCache(200, 1), engine)
        assert r.rejections == rejected
        assert by_id(r, "finish_ms") == {0: 37.0, 1: finish}


@pytest.mark.parametrize("engine", ENGINES)
def test_shortest_prefill_first_takes_the_fewest_tokens_to_prefill_with_a_prefix_cache(engine):
    # One slot, three one-token answers queued at 0: prompts of 30, 10 and 20 (P = 0.125 ms a token).
    # With the radix cache: R1 (10) -> 1.25, R2 (20) -> 3.75, R0 (30) -> 7.5. Without a prefix
    # cache SGLang refuses to start (it ran as fcfs: "Experimental shortest-prefill-first requires
    # prefix caching", SchedulePolicy._validate_and_adjust_policy, 0.5.23).
    reqs = [Request(0, 0.0, 30, 1), Request(1, 0.0, 10, 1), Request(2, 0.0, 20, 1)]
    sched = SglangScheduler(_sync(max_running_requests=1, schedule_policy="shortest-prefill-first"))
    assert by_id(run(reqs, sched, RadixKVCache(200, 1), engine), "finish_ms") == {0: 7.5, 1: 1.25, 2: 3.75}
    sched = SglangScheduler(_sync(max_running_requests=1, schedule_policy="shortest-prefill-first"))
    assert "'shortest-prefill-first' needs prefix caching" in sched.kv_problem(PagedKVCache(200, 1))
    assert sched.setting_notes(PagedKVCache(200, 1)) == []  # (refused, not noted as run first come first served)
    dfs = SglangScheduler(_sync(schedule_policy="dfs-weight"))  # (crashed: PrefixKVCache has no tree to walk)
    assert "'dfs-weight' walks SGLang's radix tree, which the KV cache (PrefixKVCache)" in dfs.kv_problem(
        PrefixKVCache(200, 1))
    assert dfs.kv_problem(RadixKVCache(200, 1)) is None and dfs.kv_problem(PagedKVCache(200, 1)) is None
    fcfs_like = SglangScheduler(_sync(max_running_requests=1, schedule_policy="lpm"))
    assert fcfs_like.kv_problem(PagedKVCache(200, 1)) is None and fcfs_like.setting_notes(PagedKVCache(200, 1))


@pytest.mark.parametrize("engine", ENGINES)
def test_ignore_eos_all_beside_an_output_short_of_its_max_tokens_is_warned_of(engine):
    """SGLang's --ignore-eos generates max_new_tokens whatever the model's EOS (Req.
    _check_token_based_finish returns False at once): with ignore_eos = "all" a request whose
    output (10) stops before its max_tokens (50) is served as no SGLang configuration serves it --
    admission charges 50 tokens, the answer ends at 10. Said once; outputs equal to max_tokens
    are not."""
    short = [Request(0, 0.0, 10, 10, max_tokens=50), Request(1, 0.0, 10, 10, max_tokens=50)]
    with pytest.warns(InputWarning, match=r'ignore_eos = "all": request 0 stops at its EOS after 10 tokens, before '
                                          r"its max_tokens 50") as caught:
        run(short, SglangScheduler(_sync(ignore_eos="all")), RadixKVCache(400, 1), engine)
    assert sum("ignore_eos" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        run([Request(0, 0.0, 10, 50, max_tokens=50)], SglangScheduler(_sync(ignore_eos="all")), RadixKVCache(400, 1),
            engine)
        run(short, SglangScheduler(_sync(ignore_eos="no_max_tokens")), RadixKVCache(400, 1), engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_shortest_prefill_first_chunks_one_prompt_at_a_time(engine):
    # Chunks of 32, pages of 4. X (100 tokens) runs its first chunk [0, 4.0]; A, A2 (5 each) and B
    # (30) arrive meanwhile. At 4.0 X has 68 to go: A and A2 are shorter and fit beside a page
    # (charges 8 + 8 <= 28), B does not (8 + 8 + 32 > 28) -- X's chunk is cut to 32 - 16 = 16, A
    # and A2 join (26 tokens -> 7.25), and B, which would need a chunk of its own, waits: SGLang
    # tracks one chunked prompt. 7.25: X takes 32 (B's 32 would not fit beside it) -> 11.25;
    # 11.25: X's last 20 and B's first 12 -> 15.25; B's last 18 -> 17.5.
    reqs = [Request(0, 0.0, 100, 1), Request(1, 0.5, 5, 1), Request(2, 0.5, 5, 1), Request(3, 0.5, 30, 1)]
    sched = SglangScheduler(_sync(schedule_policy="shortest-prefill-first", chunked_prefill_size=32))
    r = run(reqs, sched, RadixKVCache(400, 4), engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 4.0, 2: 4.0, 3: 11.25}
    assert by_id(r, "finish_ms") == {0: 15.25, 1: 7.25, 2: 7.25, 3: 17.5}
    assert by_id(r, "prefill_chunks") == {0: 4, 1: 1, 2: 1, 3: 2}


RAN_TOO_LONG = "Request running timeout reached."


@pytest.mark.parametrize("engine", ENGINES)
def test_running_timeout_aborts_a_request_at_the_pass_after_its_time_and_runs_it_once_more(engine):
    # One slot, SGLANG_REQ_RUNNING_TIMEOUT of 6 ms. R0 (prompt 8, 5 tokens) is first scheduled at
    # 0: prefill -> 1.0 (token 1), decodes -> 5.0 (2), 9.0 (3). The pass at 9.0 is the first at or
    # after 0 + 6: R0 is aborted as a client's abort is -- it runs once more, 9.0 -> 13.0, that
    # token dropped, and leaves, turned away with 3 tokens. R1 (arrived at 0.5) gets the slot at
    # 13.0 -> 14.0.
    reqs = [Request(0, 0.0, 8, 5), Request(1, 0.5, 8, 1)]
    r = run(reqs, SglangScheduler(_sync(max_running_requests=1, running_timeout_ms=6.0)), PagedKVCache(200, 1), engine)
    assert r.rejections == {0: RAN_TOO_LONG}
    assert by_id(r, "finish_ms") == {0: 13.0, 1: 14.0}
    assert by_id(r, "generated_tokens") == {0: 3, 1: 1}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 13.0}
    assert r.metrics["rejected"] == 1 and r.metrics["finished"] == 1
    check_run(r, reqs, rejections="any")


@pytest.mark.parametrize("engine", ENGINES)
def test_running_timeout_of_a_retracted_request_comes_at_the_pass_after_its_readmission(engine):
    # The retraction scenario at the top with a running timeout of 100 ms. R1 is retracted at
    # 71.125 (18 tokens). R0, first scheduled at 0, decodes from 75.125 every 4 ms: the pass at
    # 103.125 is the first at or after 100 -> aborted with 26 tokens, it runs once more -> 107.125.
    # R1's time (1.25 + 100) comes while it is queued: it stays. At 107.125 R2 is admitted (R1 does
    # not fit beside it at a ratio of 1.0): -> 107.625, decodes; the pass at 207.625 is the first
    # at or after 107.125 + 100 -> R2 aborted with 26 tokens, once more -> 211.625. R1 is admitted
    # then, recomputes its 33 tokens -> 215.75 (its 19th token), and is aborted at that very next
    # pass: once more -> 219.75.
    reqs = [Request(0, 0.0, 10, 30), Request(1, 0.5, 15, 30), Request(2, 1.0, 4, 30)]
    sched = SglangScheduler(_sync(init_new_token_ratio=0.0, chunked_prefill_size=0, ignore_eos="none",
                                  running_timeout_ms=100.0))
    r = run(reqs, sched, PagedKVCache(60, 1), engine)
    assert sched.retraction_log == [(71.125, (1,), 1.0)]
    assert r.rejections == {0: RAN_TOO_LONG, 1: RAN_TOO_LONG, 2: RAN_TOO_LONG}
    assert by_id(r, "finish_ms") == {0: 107.125, 1: 219.75, 2: 211.625}
    assert by_id(r, "generated_tokens") == {0: 26, 1: 19, 2: 26}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 1.25, 2: 107.125}
    check_run(r, reqs, rejections="any")


@pytest.mark.parametrize("engine", ENGINES)
def test_running_timeout_leaves_a_request_whose_client_gives_up_first_to_its_client(engine):
    # R0 as in the first running-timeout case, but its client gives up 4 ms after sending: its
    # abort is heard at the pass at 5.0, before the 6 ms limit -> aborted by its client (not
    # turned away), once more -> 9.0.
    reqs = [Request(0, 0.0, 8, 5, timeout_ms=4.0)]
    r = run(reqs, SglangScheduler(_sync(max_running_requests=1, running_timeout_ms=6.0)), PagedKVCache(200, 1), engine)
    assert r.rejections == {}
    assert by_id(r, "aborted") == {0: 1} and by_id(r, "finish_ms") == {0: 9.0}


#: vLLM's asynchronous-scheduling experiment, on SGLang's scheduler with a queue limit
QUEUE_LIMITED = textwrap.dedent(ASYNC_TOML).replace('kind = "vllm"\nasync_scheduling = true\n',
                                                    'kind = "sglang"\nmax_queued_requests = 4\n')


@pytest.mark.parametrize("extra, why", [
    ("[cluster]\npipeline_parallel = 2\n", r"not modelled with \[cluster\] pipeline_parallel"),
    ("[cluster]\nmode = 'disaggregated'\n", r"not modelled with \[cluster\] disaggregated pools"),
])
def test_queue_limit_is_refused_where_it_is_not_modelled(tmp_path, extra, why):
    path = tmp_path / "exp.toml"
    assert "max_queued_requests = 4" in QUEUE_LIMITED
    path.write_text(QUEUE_LIMITED + extra)
    with pytest.raises(ConfigError, match=r"exp.toml.*\[scheduler\]: max_queued_requests: " + why):
        load(path)
    path.write_text(QUEUE_LIMITED + "[cluster]\ndata_parallel = 2\n")  # (ranks: each its own queue)
    assert load(path).studies[0].base.tables["scheduler"]["max_queued_requests"] == 4
    timed = QUEUE_LIMITED.replace("max_queued_requests = 4", "running_timeout_ms = 50.0")
    path.write_text(timed + extra)
    with pytest.raises(ConfigError, match=r"exp.toml.*\[scheduler\]: running_timeout_ms: " + why):
        load(path)


# --- property tests ------------------------------------------------------------------------------


@st.composite
def sglang_configs(draw, spf: bool = False):
    """SGLang settings; with ``spf``, shortest-prefill-first among the orders too -- which needs a
    prefix cache (``cacheable``): the other files' properties draw caches without one."""
    chunk = draw(st.sampled_from([0, 8, 16, 40]))
    mixed = bool(chunk) and draw(st.booleans())
    priorities = draw(st.booleans())
    return SglangConfig(
        max_running_requests=draw(st.integers(1, 6)),
        max_prefill_tokens=draw(st.sampled_from([16, 64, 1000])),
        chunked_prefill_size=chunk,
        enable_mixed_chunk=mixed,
        enable_priority_scheduling=priorities,
        schedule_low_priority_values_first=draw(st.booleans()),
        priority_scheduling_preemption_threshold=draw(st.sampled_from([0, 1, 10])),  # priorities are 0-2
        disable_priority_preemption=mixed or draw(st.booleans()),
        retraction_policy=draw(st.sampled_from(["length", "priority"])) if priorities else "length",
        schedule_policy=draw(st.sampled_from(["fcfs", "lpm", "lof", "hrrn"] + ["shortest-prefill-first"] * spf)),
        init_new_token_ratio=draw(st.sampled_from([0.0, 0.05, 0.7])),          # low: retractions are common
        min_new_token_ratio_factor=draw(st.sampled_from([0.14, 1.0])),
        new_token_ratio_decay_steps=draw(st.sampled_from([1, 5, 600])),
        clip_max_new_tokens=draw(st.sampled_from([8, 4096])),
        retract_decode_steps=draw(st.sampled_from([0, 1, 20])),
        overlap_schedule=draw(st.booleans()),
        max_queued_requests=draw(st.sampled_from([0, 0, 1, 3])),
        waiting_timeout_ms=draw(st.sampled_from([0.0, 0.0, 5.0, 30.0])),
        running_timeout_ms=draw(st.sampled_from([0.0, 0.0, 3.0, 20.0, 60.0])),
    )


def sglang_pool(requests, block_size: int, spare: int, prefix_cache: bool = True) -> int:
    """KV blocks for a run SGLang could serve every request of, ``spare`` more: a prompt of pool
    - 6 tokens or more is refused, and without a prefix cache a request ignoring EOS needs more
    than a token free after its prompt's pages, a page and its answer (add_one_req_ignore_eos:
    SGLang never serves another)."""
    least = max(max(-(-(r.prompt_tokens + r.max_output_tokens + 1) // block_size) + 1,
                    -(-(r.prompt_tokens + 7) // block_size)) for r in requests)
    if not prefix_cache:
        least = max(least, max(-(-(-(-r.prompt_tokens // block_size) * block_size + r.max_output_tokens + 2)
                                  // block_size) + 1 for r in requests))
    return least + spare


def cacheable(cfg: SglangConfig, kind: str) -> SglangConfig:
    """``cfg`` as SGLang would start with the cache ``kind`` (:data:`KVS`): shortest-prefill-first
    needs prefix caching (``SglangScheduler.kv_problem``), so without it the order is fcfs."""
    if kind == "paged" and cfg.schedule_policy == "shortest-prefill-first":
        return attrs_evolve(cfg, schedule_policy="fcfs")
    return cfg


def whole_pages(cfg: SglangConfig, page: int) -> SglangConfig:
    """``cfg`` with its chunk a whole number of ``page``-token pages, rounded up (SGLang refuses
    another: ``SglangScheduler.kv_problem``)."""
    chunk = cfg.chunked_prefill_size
    return attrs_evolve(cfg, chunked_prefill_size=-(-chunk // page) * page) if chunk % page else cfg


def rejections_for(cfg: SglangConfig | None) -> str:
    """What ``check_run`` lets ``cfg`` turn away: a request it served too, with a queue limit
    (a retracted request finds the queue full) or a timeout (running or, after a retraction, waiting)."""
    if cfg is not None and (cfg.max_queued_requests or cfg.running_timeout_ms or cfg.waiting_timeout_ms):
        return "any"
    return "unserved"


def assert_only_turned_away(result, cfg: SglangConfig) -> None:
    """Every request is served but those the queue limit or a timeout turned away (none without)."""
    reasons = set(result.rejections.values())
    allowed = ({QUEUE_FULL, OUTRANKED} if cfg.max_queued_requests else set()) | (
        {WAITED_TOO_LONG} if cfg.waiting_timeout_ms else set()) | ({RAN_TOO_LONG} if cfg.running_timeout_ms else set())
    assert reasons <= allowed, reasons
    if not cfg.enable_priority_scheduling:
        assert OUTRANKED not in reasons


@SETTINGS
@given(st.integers(1, 4), st.integers(0, 5), st.sampled_from([0.0, 2.5]), st.integers(1, 2), st.integers(0, 12),
       st.booleans(), dyadic_linear_costs(), st.sampled_from([0.0, 0.0, 12.0]))
def test_closed_loops_on_sglangs_overlap_scheduler_agree_and_conserve(clients, seed, think, instances, spare,
                                                                      priorities, cost, running_timeout):
    """Clients send their next request when the last is answered; SGLang's overlap scheduler,
    tight pools, answers stopping at an EOS (retractions may take one finished in flight) and,
    drawn, priorities with preemption. A closed loop's client has heard of a finish, so there a
    request finished in flight keeps its finish when it is preempted or retracted (``Plan.preempt``):
    both engines alike, every request served once, each client's requests one after another. With
    a running timeout drawn, a request it aborts is turned away and its client answered then."""
    config = ClosedLoopConfig(clients=clients, num_requests=12, think_ms=think, max_tokens=30,
                              prompt={"dist": "uniform", "low": 1, "high": 20},
                              output={"dist": "uniform", "low": 1, "high": 30},
                              priority=None)
    blocks = 20 + 30 + 8 + spare
    cfg = SglangConfig(max_running_requests=3, init_new_token_ratio=0.05, max_prefill_tokens=16,
                       chunked_prefill_size=0, enable_priority_scheduling=priorities,
                       priority_scheduling_preemption_threshold=0, overlap_schedule=True,
                       running_timeout_ms=running_timeout)

    def make():
        return SglangScheduler(cfg), LinearCostModel(cost), RadixKVCache(blocks, 1)

    runs = []
    for engine in ENGINES:
        workload = make_closed_loop_workload(config)
        requests = workload.requests(seed)
        if priorities:  # (a client's requests alternate between two priorities)
            requests = (attrs_evolve(r, priority=(r.id % 3)) for r in requests)
        runs.append(run_cluster(requests, make, instances, RoundRobinRouter() if instances > 1 else None,
                                engine=engine, workload=workload))
    compare_runs(*runs, rel=1e-12)
    req = runs[0].requests
    assert req["id"].size == 12
    assert set(runs[0].rejections.values()) <= ({RAN_TOO_LONG} if running_timeout else set())
    for client in set(req["client"].tolist()):
        mine = sorted((a, f) for a, f, c in zip(req["arrival_ms"].tolist(), req["finish_ms"].tolist(),
                                                req["client"].tolist()) if c == client)
        for (_, done), (sent, _) in zip(mine, mine[1:]):
            assert sent == done + think


KVS = {"radix": RadixKVCache, "paged-prefix": PrefixKVCache, "paged": PagedKVCache}


@SETTINGS
@given(requests_lists(min_size=2, max_size=10, max_prompt=40, max_output=30, prefix_groups=3, priorities=True),
       sglang_configs(spf=True), st.integers(1, 6), st.integers(0, 6), dyadic_linear_costs(),
       st.sampled_from(sorted(KVS)))
def test_sglang_fast_engine_matches_reference(requests, cfg, block_size, spare, cost, kind):
    """Tight caches (retraction, eviction), chunks, mixed chunks, every order, every cache,
    priorities with preemption."""
    cfg = cacheable(whole_pages(cfg, block_size), kind)
    blocks = max(-(-(r.prompt_tokens + r.max_output_tokens + 1) // block_size) + 1 for r in requests) + spare
    runs = {}
    for engine in ENGINES:
        kv = KVS[kind](blocks, block_size)
        runs[engine] = run_engine(requests, SglangScheduler(cfg), LinearCostModel(cost), kv, engine=engine)
    compare_runs(runs["fast"], runs["reference"], rel=1e-12)
    if kind == "radix":
        assert runs["fast"].meta["kv"].layout() == runs["reference"].meta["kv"].layout()


@SETTINGS
@given(requests_lists(min_size=1, max_size=10, max_prompt=40, max_output=30, prefix_groups=3, priorities=True),
       sglang_configs(spf=True), st.integers(1, 6), st.integers(0, 12), st.sampled_from(sorted(KVS)))
def test_sglang_keeps_the_conformance_rules(requests, cfg, block_size, spare, kind):
    cfg = cacheable(whole_pages(cfg, block_size), kind)
    # (a pool of 6 tokens more than the longest prompt: SGLang refuses a prompt of pool - 6 or more)
    blocks = sglang_pool(requests, block_size, spare, prefix_cache=kind != "paged")
    budget = max(cfg.chunked_prefill_size, cfg.max_running_requests) if cfg.chunked_prefill_size else None
    check = IterationChecker(max_running=cfg.max_running_requests, token_budget=budget, kv_blocks=blocks)
    result = run_engine(requests, SglangScheduler(cfg), kv=KVS[kind](blocks, block_size), check=check)
    check_run(result, requests, max_running=cfg.max_running_requests, kv_blocks=blocks, rejections=rejections_for(cfg))
    assert_only_turned_away(result, cfg)
    assert check.iterations == result.counters["iterations"]


@SETTINGS
@given(requests_lists(min_size=2, max_size=10, max_prompt=40, max_output=30, prefix_groups=3, priorities=True),
       st.integers(1, 4), st.sampled_from([0, 8, 40]), st.booleans(), st.sampled_from(["fcfs", "lof"]),
       st.sampled_from(ENGINES))
def test_priority_order_admits_no_request_past_a_more_important_waiting_one(requests, slots, chunk, low_first,
                                                                           policy, engine):
    """Without preemption, SGLang admits each pass a prefix of the queue sorted by priority: no
    request is admitted while a more important one waits (planned synchronously)."""
    cfg = _sync(max_running_requests=slots, chunked_prefill_size=chunk, schedule_policy=policy,
                enable_priority_scheduling=True, schedule_low_priority_values_first=low_first,
                disable_priority_preemption=True)
    blocks = max(r.prompt_tokens + r.max_output_tokens + 8 for r in requests)
    r = run(requests, SglangScheduler(cfg), RadixKVCache(blocks, 1), engine)
    sign = 1 if low_first else -1
    rows = list(zip(r.requests["arrival_ms"].tolist(), r.requests["first_scheduled_ms"].tolist(),
                    r.requests["priority"].tolist()))
    for arrival, admitted, priority in rows:
        for other_arrival, other_admitted, other_priority in rows:
            if other_priority * sign < priority * sign and other_arrival < admitted:
                assert other_admitted <= admitted, (rows, cfg)


@SETTINGS
@given(requests_lists(min_size=1, max_size=10, max_prompt=40, max_output=30, prefix_groups=3), continuous_configs(),
       st.integers(1, 6), st.integers(0, 30), dyadic_linear_costs())
def test_radix_cache_under_vllm_rules_matches_reference_and_keeps_the_rules(requests, cfg, block_size, spare, cost):
    """The radix cache with the ``continuous`` scheduler: reservation, chunking, preemption (swap
    requests fall back to recompute: the radix cache has no swap space)."""
    blocks = max(-(-(r.prompt_tokens + r.max_output_tokens) // block_size) for r in requests) + spare
    runs = {engine: run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(cost),
                               RadixKVCache(blocks, block_size), engine=engine) for engine in ENGINES}
    compare_runs(runs["fast"], runs["reference"], rel=1e-12)
    assert runs["fast"].meta["kv"].layout() == runs["reference"].meta["kv"].layout()
    check_run(runs["fast"], requests, kv_blocks=blocks, max_running=cfg.max_num_seqs)
    assert runs["fast"].counters["swap_preemptions"] == 0


# --- the radix cache hits what the paged prefix cache hits, where their rules coincide -----------


@st.composite
def shared_workloads(draw):
    """Requests whose keys name whole prefixes consistently: either shared-prefix groups or
    Mooncake-style hash ids (conversations: each id names its conversation's prefix up to there)."""
    n = draw(st.integers(1, 12))
    ticks = sorted(draw(st.lists(st.integers(0, 800), min_size=n, max_size=n)))
    hashes = draw(st.booleans())
    per = draw(st.integers(1, 8))
    out = []
    for i, t in enumerate(ticks):
        prompt = draw(st.integers(1, 48))
        kw = {}
        if hashes:
            conv, shared = draw(st.integers(0, 2)), draw(st.integers(0, 6))
            ids = -(-prompt // per)
            kw = {"block_hashes": tuple(("c", conv, j) if j < shared else ("u", i, j) for j in range(ids)),
                  "hash_block_tokens": per}
        elif draw(st.booleans()):
            kw = {"prefix_group": draw(st.integers(0, 2)), "prefix_tokens": draw(st.integers(0, prompt))}
        out.append(Request(i, t / 8, prompt, draw(st.integers(1, 20)), **kw))
    return out


@SETTINGS
@given(shared_workloads(), st.integers(1, 6), st.booleans(), st.integers(1, 8))
def test_radix_hits_equal_the_paged_prefix_caches_where_both_apply(requests, block_size, sglang, seqs):
    """With room for everything (no eviction, no preemption) and whole prompts admitted at once,
    both caches reuse exactly the same prefixes: same hits per request, same timings.

    Where they do not coincide: under memory pressure (whole-node LRU vs vLLM's block LRU, a
    retracted request's decode blocks freed vs cached, see test_radix_cache), after a preemption
    (SGLang recomputes the generated tokens), when two chunked prefills of one prefix overlap (SGLang switches to the tree's copy
    and keeps sharing; the paged cache keeps a private duplicate and stops sharing), and for a
    request mixing group and hash metadata (the tree matches paths, the paged cache single keys).
    Under SGLang's scheduler one request runs at a time: it opens passes on the radix cache, whose
    blocks join the tree after their pass, where the paged cache shares them within a batch."""
    blocks = 4 * sum(-(-(r.prompt_tokens + r.max_output_tokens) // block_size) for r in requests)
    if sglang:
        make = lambda: SglangScheduler(_sync(max_running_requests=1, chunked_prefill_size=0))  # noqa: E731
    else:
        make = lambda: ContinuousScheduler(ContinuousConfig(max_num_seqs=seqs, allocation="grow",  # noqa: E731
                                                            max_num_batched_tokens=4096))
    runs = {}
    for name, kv in (("radix", RadixKVCache(blocks, block_size)), ("paged", PrefixKVCache(blocks, block_size))):
        runs[name] = run_engine(requests, make(), LinearCostModel(COST), kv)
    radix, paged = runs["radix"], runs["paged"]
    assert paged.meta["kv"].evictions == 0 and radix.meta["kv"].evictions == 0
    assert radix.counters["num_preemptions"] == paged.counters["num_preemptions"] == 0
    assert by_id(radix, "cached_tokens") == by_id(paged, "cached_tokens")
    assert radix.counters["prefix_hits"] == paged.counters["prefix_hits"]
    assert radix.counters["prefix_queries"] == paged.counters["prefix_queries"]
    for column in ("first_scheduled_ms", "first_token_ms", "finish_ms"):
        assert by_id(radix, column) == by_id(paged, column)


def test_a_mixed_batchs_decode_slots_evict_when_the_pass_ends_in_both_engines():
    """Radix cache of 31 one-token blocks, mixed chunks: request 9 (15 tokens, the first a prefix
    it shares with request 7) finishes and leaves its prompt in the tree as one 15-block node;
    request 10 (16 tokens) then fills the rest. At t = 1.9375 request 10's decode slot and
    request 7's admission need two blocks: SGLang evicts after the pass's lookups, which split
    the node at request 7's one-token prefix, so only the 14-block tail goes and request 7
    finds its prefix. The fast engine took its bulk decode slot before the lookup and evicted
    the whole node (a random hypothesis seed found it); both engines now agree."""
    def req(i, prompt, output, max_tokens=None, group=None, prefix=0):
        return Request(i, 0.0, prompt, output, max_tokens=max_tokens, prefix_group=group, prefix_tokens=prefix)

    reqs = [req(i, 1, 1) for i in range(7)] + [req(7, 2, 2, None, 1, 1), req(8, 1, 1), req(9, 15, 1, 12, 1, 1),
                                                req(10, 16, 2, 12)]
    cfg = _sync(max_running_requests=2, max_prefill_tokens=16, chunked_prefill_size=16, enable_mixed_chunk=True,
                       schedule_policy="lof", init_new_token_ratio=0.0, new_token_ratio_decay_steps=1,
                       clip_max_new_tokens=8, retract_decode_steps=0)
    cost = LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=4.0)
    runs = {engine: run_engine(reqs, SglangScheduler(cfg), LinearCostModel(cost), RadixKVCache(31, 1), engine=engine)
            for engine in ("fast", "reference")}
    compare_runs(runs["fast"], runs["reference"], rel=1e-12)
    assert by_id(runs["fast"], "cached_tokens")[7] == 1
    assert by_id(runs["fast"], "first_scheduled_ms")[0] == 6.0  # after request 7's 1-token prefill, not 2


# --- overlap scheduling in a run's TOML ----------------------------------------------------------

# the vLLM preset's asynchronous-scheduling experiment, with SGLang's scheduler and radix cache
OVERLAP_TOML = ASYNC_TOML.replace('kind = "vllm"\n    async_scheduling = true\n', 'kind = "sglang"\n').replace(
    'kind = "paged"', 'kind = "radix"')
UNMODELLED = {"[cluster]\npipeline_parallel = 2\n": r"\[cluster\] pipeline_parallel",
              "[cluster]\nmode = 'disaggregated'\n": r"\[cluster\] disaggregated pools",
              "[speculative]\nmethod = 'ngram'\n": r"\[speculative\]"}


@pytest.mark.parametrize("extra", ["", *UNMODELLED])
def test_overlap_is_on_by_default_unless_the_layout_is_not_modelled_with_it(tmp_path, extra):
    """SGLang's default: ``"auto"`` plans ahead on one instance, and schedules synchronously --
    instead of refusing the run -- with a pipeline, disaggregated pools or speculation."""
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(OVERLAP_TOML) + extra)
    exp = load(path)
    schedulers = [parts[0] for parts in assemble(exp.studies[0].base, exp.context, "x").instances]
    assert schedulers and all(s.plans_ahead == (extra == "") for s in schedulers)
    run = run_experiment(exp).all_runs()[0]
    assert run.metrics["finished"] == 20 and run.meta["plans_ahead"] == (extra == "")


@pytest.mark.parametrize("extra, what", UNMODELLED.items())
def test_overlap_set_true_is_refused_by_name_where_not_modelled(tmp_path, extra, what):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(OVERLAP_TOML).replace('kind = "sglang"\n', 'kind = "sglang"\noverlap_schedule = true\n')
                    + extra)
    with pytest.raises(ConfigError, match=r"\[scheduler\]: overlap_schedule: not modelled with " + what
                                          + r".*set overlap_schedule = false"):
        load(path)


def test_overlap_schedule_must_be_a_bool_or_auto():
    with pytest.raises(ConfigError, match="overlap_schedule.*must be true, false or \"auto\", got 'yes'"):
        from_table(SglangConfig, {"overlap_schedule": "yes"}, where="[scheduler]")


@SETTINGS
@given(requests_lists(min_size=1, max_size=10, max_prompt=40, max_output=30, prefix_groups=3), st.integers(1, 3),
       st.booleans(), dyadic_linear_costs(), st.integers(0, 12), st.sampled_from([3.0, 20.0, 60.0]))
def test_running_timeout_on_data_parallel_ranks_agrees_between_engines(requests, ranks, overlap, cost, spare,
                                                                       timeout):
    """SGLang's DP attention (ranks stepping together, each its own scheduler and tree) with a
    running timeout, tight pools (retracted requests come back overdue), both loops: both engines
    alike, and nothing turned away but by the timeout."""
    cfg = SglangConfig(max_running_requests=3, init_new_token_ratio=0.05, max_prefill_tokens=16,
                       overlap_schedule=overlap, running_timeout_ms=timeout)
    blocks = max(r.prompt_tokens + r.max_output_tokens + 8 for r in requests) + spare

    def make():
        return SglangScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), RadixKVCache(blocks, 1)

    runs = [run_data_parallel(requests, make, ranks, RoundRobinRouter() if ranks > 1 else None, engine=engine)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert set(runs[0].rejections.values()) <= {RAN_TOO_LONG}
    check_run(runs[0], requests, rejections="any")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_turned_away_last_ends_the_makespan(engine):
    # R0 alone, as in the first running-timeout case: it leaves at 13.0, turned away. The run's
    # makespan (throughput, busy and KV shares) runs to it, not to the last request served.
    r = run([Request(0, 0.0, 8, 5)], SglangScheduler(_sync(running_timeout_ms=6.0)), PagedKVCache(200, 1), engine)
    assert r.rejections == {0: RAN_TOO_LONG}
    assert r.metrics["makespan_ms"] == 13.0
    assert r.metrics["busy_share"] == 1.0


def test_routers_count_a_queued_request_whose_running_time_is_up_as_staying():
    from schedlab.engine.ahead import Ahead
    from schedlab.engine.reference import RefSequence

    queued, running = RefSequence(Request(0, 0.0, 8, 5), 0), RefSequence(Request(1, 0.0, 8, 5), 1)
    queued.server_abort = running.server_abort = True  # (both: the scheduler's limit, due)
    running.status = "prefilling"
    ahead = Ahead()
    ahead.note_leaving([(5.0, 0, queued), (5.0, 1, running)])
    assert (ahead.leaving, ahead.leaving_running) == (1, 1)
    queued.server_abort = False  # its client's abort: it leaves
    ahead.note_leaving([(5.0, 0, queued), (5.0, 1, running)])
    assert (ahead.leaving, ahead.leaving_running) == (2, 1)


def test_a_request_aborted_by_its_deadline_and_its_client_in_one_window_leaves_once():
    """Found by hypothesis (data-parallel ranks, one rank): under overlap scheduling the running
    timeout marks 7 to run once more (``to_finish``) and its client's abort then comes by the
    start of that very iteration -- it was counted twice, leaving with its last token and
    turned away "after its last token", in both engines."""
    reqs = [Request(6, 90.875, 18, 14), Request(7, 119.0, 3, 2), Request(8, 126.875, 25, 1, max_tokens=1)]
    cfg = SglangConfig(max_running_requests=2, max_prefill_tokens=16, chunked_prefill_size=8,
                       init_new_token_ratio=0.0, new_token_ratio_decay_steps=1, clip_max_new_tokens=8,
                       retract_decode_steps=0, overlap_schedule=True, priority_scheduling_preemption_threshold=0,
                       max_queued_requests=1, running_timeout_ms=20.0)
    cost = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0, per_context_token_ms=0.015625)
    from test_data_parallel import client_side

    runs = [run_engine(reqs, SglangScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), RadixKVCache(10, 4),
                       engine=engine, client_side=client_side(40.0)) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], reqs, rejections="any")
    assert runs[0].rejections == {6: RAN_TOO_LONG, 7: RAN_TOO_LONG, 8: RAN_TOO_LONG}
    assert by_id(runs[0], "generated_tokens") == {6: 2, 7: 1, 8: 0}


def test_a_chunk_of_part_pages_is_refused_when_the_run_is_built(tmp_path):
    """SGLang cuts chunks to whole pages and refuses to start with a chunk that is not whole
    pages: with 8-token chunks and 16-token pages no prompt longer than 8 tokens could start (the
    run stalled with requests waiting and memory free); 24-token chunks left a part page."""
    path = tmp_path / "exp.toml"
    chunked = QUEUE_LIMITED.replace("max_queued_requests = 4", "chunked_prefill_size = %d")
    for chunk in (8, 24):
        path.write_text(chunked % chunk + "block_size = 16\n")
        with pytest.raises(ConfigError, match=rf"exp.toml.*\[scheduler\]: chunked_prefill_size = {chunk} is not a "
                                              r"multiple of the page \(16 tokens, the KV cache's block_size\)"):
            load(path)
    path.write_text(chunked % 32 + "block_size = 16\n")
    assert load(path).studies[0].base.tables["scheduler"]["chunked_prefill_size"] == 32


@pytest.mark.parametrize("engine", ENGINES)
def test_the_kits_runs_refuse_a_chunk_of_part_pages_too(engine):
    """The conformance kit's run_engine did not ask kv_problem: a plugin author's run stalled
    (a StallError, even for a 1-token prompt) where a run from TOML is refused."""
    scheduler = SglangScheduler(SglangConfig(chunked_prefill_size=8))
    with pytest.raises(ConfigError, match=r"^SglangScheduler: chunked_prefill_size = 8 is not a multiple of the page "
                                          r"\(16 tokens, the KV cache's block_size\)"):
        run_engine([Request(0, 0.0, 1, 2)], scheduler, kv=PagedKVCache(64, 16), engine=engine)
    result = run_engine([Request(0, 0.0, 1, 2)], SglangScheduler(SglangConfig(chunked_prefill_size=16)),
                        kv=PagedKVCache(64, 16), engine=engine)
    assert result.metrics["finished"] == 1
