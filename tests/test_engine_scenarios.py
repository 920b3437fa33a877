"""Small scenarios computed by hand: every timestamp below is worked out in the comments.

Each scenario runs on both engines; the expected numbers never come from the code.
"""

from __future__ import annotations

import numpy as np
import pytest

from schedlab.errors import SimulationError
from schedlab.model import Request
from schedlab.testing import compare_runs, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, StaticConfig, StaticScheduler

ENGINES = ("fast", "reference")


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def itl_samples(result) -> list[float]:
    itl = result.itl
    out = []
    for f, d, c, w in zip(itl["first"], itl["inc"], itl["count"], itl["weight"]):
        out += [f + j * d for j in range(c) for _ in range(w)]
    return sorted(out)


FOUR = [Request(i, 0.0, 10, o) for i, o in enumerate([3, 5, 2, 4])]


@pytest.mark.parametrize("engine", ENGINES)
def test_static_batching_by_hand(engine):
    # Batch size 2, prompts of 10 tokens, seed costs (0.05 ms/prompt token, 8 ms/decode step).
    # Batch 1 = requests 0 (3 tokens) and 1 (5 tokens): prefill 20 tokens = 1 ms -> first tokens at 1;
    #   request 0 needs 2 more decode steps -> 17; request 1 needs 4 -> 33 (its slot partner idles).
    # Batch 2 starts at 33: prefill 1 ms -> 34; request 2 (2 tokens) -> 42; request 3 (4) -> 58.
    r = run_engine(FOUR, StaticScheduler(StaticConfig(batch_size=2)), engine=engine)
    assert by_id(r, "first_token_ms") == {0: 1.0, 1: 1.0, 2: 34.0, 3: 34.0}
    assert by_id(r, "finish_ms") == {0: 17.0, 1: 33.0, 2: 42.0, 3: 58.0}
    m = r.metrics
    assert m["iterations"] == 9                           # 1 + 4 decode, then 1 + 3 decode
    assert m["slot_utilisation"] == pytest.approx(14 / (9 * 2))  # 14 tokens in 9 iterations x 2 slots
    assert m["throughput_tps"] == pytest.approx(14 / 0.058)
    assert m["makespan_ms"] == 58.0
    assert itl_samples(r) == [8.0] * 10                  # every later token comes one 8 ms step after
    assert m["ttft_ms"]["p50"] == pytest.approx(17.5)    # median of 1, 1, 34, 34


@pytest.mark.parametrize("engine", ENGINES)
def test_continuous_batching_by_hand(engine):
    # Two slots. t=0: admit 0 and 1 (prefill 20 tokens, 1 ms) -> first tokens at 1.
    # Decode steps at 9 and 17: request 0 has 3 tokens at 17 and leaves; request 1 has 3.
    # t=17: admit request 2 (prefill 10 tokens = 0.5 ms) while 1 decodes: 8.5 ms -> 25.5
    #   (request 2's first token, request 1's 4th).
    # t=25.5: decode both, 8 ms -> 33.5: request 1's 5th token and request 2's 2nd: both finish.
    # t=33.5: request 3 alone: prefill 0.5 ms -> 34; three decodes -> 58.
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=2, max_num_batched_tokens=100))
    r = run_engine(FOUR, sched, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 1.0, 1: 1.0, 2: 25.5, 3: 34.0}
    assert by_id(r, "finish_ms") == {0: 17.0, 1: 33.5, 2: 33.5, 3: 58.0}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 0.0, 2: 17.0, 3: 33.5}
    assert r.metrics["iterations"] == 9
    # request 1's gap across the mixed iteration is 8.5 ms; every other gap is one 8 ms step
    assert itl_samples(r) == [8.0] * 9 + [8.5]


@pytest.mark.parametrize("engine", ENGINES)
def test_arrival_waits_for_the_running_iteration_and_idle_time_is_skipped(engine):
    # Request 0 arrives at 0 (prompt 10, 3 tokens): prefill 0..0.5, decodes end at 8.5 and 16.5.
    # Request 1 arrives at 5, mid-iteration: it is admitted at the boundary 8.5 (prefill 0.5 +
    #   decode 8 -> first token at 17); its second token at 25.
    # Request 2 arrives at 100 on an idle server: prefill 100..100.5.
    reqs = [Request(0, 0.0, 10, 3), Request(1, 5.0, 10, 2), Request(2, 100.0, 10, 1)]
    r = run_engine(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=4)), engine=engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 8.5, 2: 100.0}
    assert by_id(r, "first_token_ms") == {0: 0.5, 1: 17.0, 2: 100.5}
    assert by_id(r, "finish_ms") == {0: 17.0, 1: 25.0, 2: 100.5}
    # request 0's third token shares the 8.5..17 iteration with request 1's prefill
    assert r.metrics["ttft_ms"]["max"] == 12.0


TWO = [Request(0, 0.0, 2, 4), Request(1, 0.0, 2, 4)]
COST = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_recompute_preemption_by_hand(engine):
    # Blocks of 2 tokens, 4 blocks. Both prompts (2 tokens) fit: prefill 4 tokens = 2 ms -> t=2,
    #   one token each, 2 computed, 1 block each.
    # t=2: computing token 3 needs a 2nd block each (2 free): 4 ms -> t=6. t=6: token 4 fits -> t=10.
    # t=10: computing token 5 needs a 3rd block each, none free: preempt the newest (request 1),
    #   freeing its 2 blocks; request 0 decodes alone -> t=14, its 4th token: it finishes.
    # t=14: request 1 recomputes prompt + 3 generated = 5 tokens (2.5 ms) -> t=16.5: its 4th token.
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=2, allocation="grow"))
    r = run_engine(TWO, sched, LinearCostModel(COST), PagedKVCache(4, 2), engine=engine)
    assert by_id(r, "finish_ms") == {0: 14.0, 1: 16.5}
    assert by_id(r, "preemptions") == {0: 0, 1: 1}
    assert by_id(r, "recomputed_tokens") == {0: 0, 1: 4}   # its 4 computed tokens were lost
    assert r.metrics["num_preemptions"] == 1
    assert r.metrics["preemptions"]["recomputed_tokens"] == 4
    assert itl_samples(r) == [4.0] * 5 + [6.5]           # request 1 waited 6.5 ms for its 4th token
    assert r.counters["kv_peak_blocks"] == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_swap_preemption_by_hand(engine):
    # Same start as above. Swap moves 1 MB blocks at 2 GB/s: 0.5 ms per block.
    # t=10: request 1 (2 blocks) is swapped out: +1 ms, so the iteration lasts 5 -> t=15, request 0 done.
    # t=15: request 1 comes back (2 blocks in: +1 ms) and decodes at once: 4 + 1 -> t=20.
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=2, allocation="grow", preemption="swap"))
    kv = PagedKVCache(4, 2, swap_blocks=4, bytes_per_block=10**6, host_link_gbps=2.0)
    r = run_engine(TWO, sched, LinearCostModel(COST), kv, engine=engine)
    assert by_id(r, "finish_ms") == {0: 15.0, 1: 20.0}
    assert by_id(r, "swaps") == {0: 0, 1: 1}
    assert by_id(r, "recomputed_tokens") == {0: 0, 1: 0}
    p = r.metrics["preemptions"]
    assert (p["swap"], p["recompute"], p["swapped_out_blocks"], p["swapped_in_blocks"]) == (1, 0, 2, 2)
    assert p["swap_transfer_ms"] == pytest.approx(2.0)
    assert p["swapped_out_bytes"] == 2 * 10**6


@pytest.mark.parametrize("engine", ENGINES)
def test_swap_space_full_falls_back_to_recompute(engine):
    # Swap space of 1 block cannot take request 1's 2 blocks: the preemption recomputes instead,
    # exactly as in the recompute scenario, and the refusal is counted.
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=2, allocation="grow", preemption="swap"))
    kv = PagedKVCache(4, 2, swap_blocks=1, bytes_per_block=10**6, host_link_gbps=2.0)
    r = run_engine(TWO, sched, LinearCostModel(COST), kv, engine=engine)
    assert by_id(r, "finish_ms") == {0: 14.0, 1: 16.5}
    assert r.metrics["preemptions"]["swap_failures"] == 1
    assert r.metrics["preemptions"]["recompute"] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_chunked_prefill_interleaves_decodes_by_hand(engine):
    # Budget 10 tokens, chunking on. Request 0 (prompt 4, 5 tokens) at 0; request 1 (prompt 20,
    # 2 tokens) at 1. Prefill 0.5 ms/token, decode 4 ms/step.
    # t=0: prefill request 0 (2 ms) -> t=2.
    # t=2: decode 0 (1 token of budget), chunk 9 of request 1: 4 + 4.5 = 8.5 -> t=10.5.
    # t=10.5: same again (9 more, 18 of 20) -> t=19.
    # t=19: decode 0, last 2 tokens of request 1: 4 + 1 = 5 -> t=24: request 1's first token.
    # t=24: decode both -> t=28: both finish.
    reqs = [Request(0, 0.0, 4, 5), Request(1, 1.0, 20, 2)]
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=10, chunked_prefill=True))
    r = run_engine(reqs, sched, LinearCostModel(COST), engine=engine)
    assert by_id(r, "first_token_ms") == {0: 2.0, 1: 24.0}
    assert by_id(r, "finish_ms") == {0: 28.0, 1: 28.0}
    assert by_id(r, "prefill_chunks") == {0: 1, 1: 3}
    assert itl_samples(r) == [4.0, 4.0, 5.0, 8.5, 8.5]
    assert r.metrics["itl_ms"]["max"] == 8.5
    assert r.metrics["ttft_ms"]["max"] == 23.0


@pytest.mark.parametrize("engine", ENGINES)
def test_without_chunking_a_long_prompt_stalls_decodes(engine):
    # Same requests, budget 30, no chunking: at t=2 request 1's whole prompt (10 ms) rides with
    # request 0's decode: 14 ms -> t=16, then 4 ms steps: 20, 24, 28.
    reqs = [Request(0, 0.0, 4, 5), Request(1, 1.0, 20, 2)]
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=30))
    r = run_engine(reqs, sched, LinearCostModel(COST), engine=engine)
    assert by_id(r, "first_token_ms") == {0: 2.0, 1: 16.0}
    assert by_id(r, "finish_ms") == {0: 28.0, 1: 20.0}
    assert itl_samples(r) == [4.0, 4.0, 4.0, 4.0, 14.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_prefill_first_skips_decodes(engine):
    # vLLM V0 / SGLang order: at t=2 the iteration that admits request 1 (10 ms of prefill)
    # does not decode request 0, whose 2nd token then comes at 16 (gap 14), not with the prefill.
    reqs = [Request(0, 0.0, 4, 3), Request(1, 1.0, 20, 2)]
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=30, prefill_first=True))
    r = run_engine(reqs, sched, LinearCostModel(COST), engine=engine)
    # t=0..2 prefill 0; t=2..12 prefill 1 alone; t=12..16 decode both; t=16..20 decode 0.
    assert by_id(r, "first_token_ms") == {0: 2.0, 1: 12.0}
    assert by_id(r, "finish_ms") == {0: 20.0, 1: 16.0}
    assert itl_samples(r) == [4.0, 4.0, 14.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_impossible_request_is_rejected_with_a_reason(engine):
    # 4 blocks of 2 tokens hold 8 tokens; a 10-token prompt can never run.
    reqs = [Request(0, 0.0, 10, 2), Request(1, 0.0, 2, 2)]
    r = run_engine(reqs, ContinuousScheduler(ContinuousConfig(allocation="grow")), kv=PagedKVCache(4, 2),
                   engine=engine)
    assert by_id(r, "rejected") == {0: 1, 1: 0}
    assert "needs 6 KV blocks" in r.rejections[0] and "has 4" in r.rejections[0]
    assert r.metrics["rejected"] == 1 and r.metrics["finished"] == 1
    assert list(r.metrics["rejection_reasons"].values()) == [1]


@pytest.mark.parametrize("engine", ENGINES)
def test_max_tokens_caps_the_output(engine):
    reqs = [Request(0, 0.0, 10, 50, max_tokens=3)]
    r = run_engine(reqs, ContinuousScheduler(), engine=engine)
    assert by_id(r, "generated_tokens") == {0: 3}
    assert by_id(r, "finish_ms") == {0: 16.5}   # 0.5 prefill + 2 decode steps


def test_decode_runs_are_events_not_iterations():
    # 3 requests decoding 1000, 2000 and 3000 tokens from t=0: the fast engine executes the
    # prefill (24 tokens, 1.2 ms), then one bulk run per finish: 4 scheduler events for 3000
    # iterations.
    reqs = [Request(i, 0.0, 8, o) for i, o in enumerate([1000, 2000, 3000])]
    r = run_engine(reqs, ContinuousScheduler(), kv_blocks=10_000)
    assert r.metrics["iterations"] == 3000
    assert r.meta["events"] == 4
    assert np.array_equal(r.requests["finish_ms"], [1.2 + 999 * 8, 1.2 + 1999 * 8, 1.2 + 2999 * 8])


class _ShortReservation:
    """Reserves one token less than its request may compute: the engines must refuse."""

    def schedule(self, plan):
        seq = plan.waiting.peek()
        if seq is not None:
            plan.admit(seq, seq.num_tokens, reserve_tokens=seq.request.prompt_tokens + seq.request.max_output_tokens - 2)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_reservation_below_what_a_request_computes_is_refused(engine):
    # Prompt 8 + 5 tokens: the last token's KV is never written, so 12 tokens are the least.
    with pytest.raises(SimulationError, match="may compute 12 tokens, scheduler reserved 11"):
        run_engine([Request(0, 0.0, 8, 5)], _ShortReservation(), engine=engine)


class _AskEveryThirdDecode:
    """One request at a time; while one decodes, asks to be woken after 3 decode steps."""

    stable_between_events = True

    def __init__(self):
        self.asked_at: list[int] = []

    def schedule(self, plan):
        if not plan.running:
            seq = plan.waiting.peek()
            if seq is not None:
                plan.admit(seq, seq.num_tokens, reserve=True)
            return
        self.asked_at.append(plan.decode_steps)
        plan.decode_all()
        plan.wake_after(3)


def test_wake_after_ends_a_decode_run_after_that_many_steps():
    # Request 0 (10 tokens) decodes 9 steps while request 1 waits, so the engine must ask the
    # scheduler (nothing else happens until step 9): at steps 0, 3 and 6 on the fast engine, at
    # every step on the reference engine -- with the same results. Events on the fast engine:
    # the two prefills and three runs of 3 decodes.
    reqs = [Request(0, 0.0, 8, 10), Request(1, 0.0, 8, 1)]
    fast_scheduler, ref_scheduler = _AskEveryThirdDecode(), _AskEveryThirdDecode()
    fast = run_engine(reqs, fast_scheduler)
    ref = run_engine(reqs, ref_scheduler, engine="reference")
    assert fast_scheduler.asked_at == [0, 3, 6]
    assert ref_scheduler.asked_at == list(range(9))
    assert fast.meta["events"] == 5
    compare_runs(fast, ref, rel=1e-12)
    assert by_id(fast, "finish_ms") == {0: 0.4 + 9 * 8, 1: 0.4 + 9 * 8 + 0.4}


@pytest.mark.parametrize("engine", ENGINES)
def test_wake_after_needs_a_count_of_steps(engine):
    class Backwards(_AskEveryThirdDecode):
        def schedule(self, plan):
            plan.wake_after(-1)

    with pytest.raises(SimulationError, match=r"wake_after\(-1\)"):
        run_engine([Request(0, 0.0, 8, 2)], Backwards(), engine=engine)


def test_wake_after_holds_while_only_decoders_run():
    # One request alone: nothing waits, so the fast engine would decode on without asking --
    # but the scheduler asked to be asked at the next iteration (0) when it admitted it, and then
    # every 3 decode steps (TGI's segments need it): at steps 0, 3 and 6. Asked at the next
    # iteration every time: at every step, as the reference engine.
    class AskWhenItDecodes(_AskEveryThirdDecode):
        def schedule(self, plan):
            super().schedule(plan)
            if plan.admitted:
                plan.wake_after(0)

    reqs = [Request(0, 0.0, 8, 10)]
    every_third, silent = AskWhenItDecodes(), _AskEveryThirdDecode()
    run_engine(reqs, every_third)
    run_engine(reqs, silent)
    assert every_third.asked_at == [0, 3, 6]
    assert silent.asked_at == []  # (nothing asked at admission: decoding alone needs no decision)

    class EveryStep(_AskEveryThirdDecode):
        def schedule(self, plan):
            super().schedule(plan)
            plan.wake_after(0)

    fast_scheduler, ref_scheduler = EveryStep(), EveryStep()
    fast = run_engine(reqs, fast_scheduler)
    ref = run_engine(reqs, ref_scheduler, engine="reference")
    assert fast_scheduler.asked_at == ref_scheduler.asked_at == list(range(9))
    compare_runs(fast, ref)
