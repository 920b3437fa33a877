"""Speculative decoding: acceptance against its closed form, hand-computed steps, the budget,
the batch-size schedule, cost models, configuration errors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.protocols import Batch
from schedlab.speculative import Speculation, SpeculativeConfig, expected_tokens_per_step
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import IterationChecker, check_run, compare_runs, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

ENGINES = ("fast", "reference")


class _Seq:
    def __init__(self, rid: int):
        self.request = Request(rid, 0.0, 1, 10_000)  # draws exist for the output's positions
        self.spec_state = None


def _step_moments(alpha: float, k: int) -> tuple[float, float]:
    """Mean and variance of the tokens of one step with k drafts (1 + the accepted leading run)."""
    p = [alpha ** j * (1 - alpha) for j in range(k)] + [alpha ** k]  # P(m = j), j = 0..k
    mean = sum((1 + j) * q for j, q in enumerate(p))
    second = sum((1 + j) ** 2 * q for j, q in enumerate(p))
    return mean, second - mean * mean


@pytest.mark.parametrize("alpha,k", [(0.5, 2), (0.7, 4), (0.9, 7)])
def test_acceptance_draws_follow_the_closed_form(alpha, k):
    """Walking requests step by step as the engines do (a step at position g yields 1 + m
    tokens and the next starts there), the mean tokens per step is (1 - a^(k+1)) / (1 - a)
    and each draft position j is reached with probability a^j."""
    spec = Speculation(SpeculativeConfig(method="ngram", num_speculative_tokens=k, acceptance_rate=alpha), seed=11)
    tokens = []
    reached = np.zeros(k + 1)
    for rid in range(200):
        seq, position = _Seq(rid), 0
        for _ in range(200):
            m = spec.accepted(seq, position, k)
            reached[: m + 1] += 1
            tokens.append(1 + m)
            position += 1 + m
    n = len(tokens)
    mean, var = _step_moments(alpha, k)
    assert mean == pytest.approx(expected_tokens_per_step(alpha, k), rel=1e-12)
    assert abs(np.mean(tokens) - mean) < 5 * math.sqrt(var / n)
    for j in range(k + 1):  # P(m >= j) = a^j
        p = alpha ** j
        assert abs(reached[j] / n - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_acceptance_by_position_follows_its_shares():
    """With per-position shares m_j (vLLM's per-position acceptance), draft j is accepted in a
    share m_j of the steps that verify it, and a step yields 1 + m_1 + ... + m_k tokens on average."""
    shares = (0.9, 0.6, 0.3, 0.05)
    spec = Speculation(SpeculativeConfig(method="ngram", num_speculative_tokens=4, acceptance_by_position=shares),
                       seed=5)
    reached, tokens = np.zeros(5), []
    for rid in range(300):
        seq, position = _Seq(rid), 0
        for _ in range(100):
            m = spec.accepted(seq, position, 4)
            reached[: m + 1] += 1
            tokens.append(1 + m)
            position += 1 + m
    n = len(tokens)
    for j, p in enumerate((1.0,) + shares):  # P(draft j accepted) = m_j
        assert abs(reached[j] / n - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-12, j
    assert abs(np.mean(tokens) - expected_tokens_per_step(0.0, 4, shares)) < 0.02
    assert expected_tokens_per_step(0.0, 4, shares) == pytest.approx(1 + 0.9 + 0.6 + 0.3 + 0.05)
    # a position's draws depend on the step's position and the draft's index, whatever the order of asking
    a = [spec.accepted(_Seq(7), p, 4) for p in range(200)]
    assert a == [spec.accepted(_Seq(7), p, 4) for p in reversed(range(200))][::-1]
    assert [spec.accepted(_Seq(7), p, 2) for p in range(200)] == [min(m, 2) for m in a]


@pytest.mark.parametrize("engine", ENGINES)
def test_acceptance_by_position_by_hand(engine):
    """Shares [1, 0]: every step accepts its first draft and rejects its second. Prompt 4, output 9,
    n-gram k = 2, linear costs (0.5 ms a prompt or draft token, 8 ms a decode step): the prefill
    gives token 1 at 2 ms; each decode step (8 + 2 x 0.5 = 9 ms) gives 2 tokens, so tokens 3, 5,
    7, 9 at 11, 20, 29 and 38 ms: 4 decode steps, 8 drafts verified, 4 accepted."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2, acceptance_by_position=[1.0, 0.0])
    r = run_engine([Request(0, 0.0, 4, 9)], ContinuousScheduler(ContinuousConfig(allocation="grow")),
                   LinearCostModel(LinearConfig(prefill_ms_per_token=0.5)), PagedKVCache(16, 4),
                   engine=engine, speculative=spec)
    assert r.requests["first_token_ms"].tolist() == [2.0]
    assert r.requests["finish_ms"].tolist() == [38.0]
    c = r.counters
    assert (c["spec_draft_tokens"], c["spec_accepted_tokens"]) == (8, 4)


@pytest.mark.parametrize("table,message", [
    ({"acceptance_by_position": [0.5, 0.7]}, "must not increase"),
    ({"acceptance_by_position": [0.5, 1.2, 0.1]}, "every rate must be in [0, 1]"),
    ({"acceptance_by_position": [0.8, 0.5]}, "gives 2 rate(s), but a step may verify 3 drafts"),
    ({"acceptance_by_position": [0.8, 0.5, 0.2], "acceptance_sd": 0.1}, "with acceptance_by_position leave it out"),
])
def test_bad_acceptance_by_position_is_refused(table, message):
    from schedlab.configs import FieldError

    with pytest.raises(FieldError, match=re.escape(message)):
        SpeculativeConfig(method="ngram", num_speculative_tokens=3, **table)


def test_draws_depend_on_seed_request_and_position_only():
    spec = Speculation(SpeculativeConfig(method="ngram", acceptance_rate=0.6, num_speculative_tokens=5), seed=3)
    a = [spec.accepted(_Seq(7), p, 5) for p in range(300)]
    b = [spec.accepted(_Seq(7), p, 5) for p in reversed(range(300))][::-1]
    assert a == b  # any order of asking
    assert [spec.accepted(_Seq(7), p, 2) for p in range(300)] == [min(m, 2) for m in a]  # fewer drafts: a prefix
    other = Speculation(SpeculativeConfig(method="ngram", acceptance_rate=0.6, num_speculative_tokens=5), seed=4)
    assert a != [other.accepted(_Seq(7), p, 5) for p in range(300)]
    assert a != [spec.accepted(_Seq(8), p, 5) for p in range(300)]


def test_per_request_rates_have_the_configured_mean_and_spread():
    spec = Speculation(SpeculativeConfig(method="ngram", acceptance_rate=0.7, acceptance_sd=0.15), seed=0)
    rates = np.array([spec.rate(Request(i, 0.0, 1, 1)) for i in range(4000)])
    assert abs(rates.mean() - 0.7) < 5 * 0.15 / math.sqrt(4000)
    assert rates.std() == pytest.approx(0.15, rel=0.06)
    assert ((rates > 0) & (rates < 1)).all()
    assert spec.rate(Request(5, 0.0, 1, 1)) == rates[5]  # a function of the request


@pytest.mark.parametrize("alpha,k", [(0.6, 4), (0.8, 2)])
def test_engines_mean_tokens_per_step_match_the_closed_form(alpha, k):
    """Over thousands of steps the run's mean acceptance length (vLLM's: 1 + accepted drafts
    per step) is the closed form, and the acceptance rate is its share of the k drafts."""
    requests = [Request(i, 0.0, 16, 300) for i in range(24)]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k, acceptance_rate=alpha)
    runs = [run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=8, allocation="grow")),
                       kv_blocks=2048, speculative=spec, seed=5, engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    s = runs[0].metrics["speculative"]
    mean, var = _step_moments(alpha, k)
    assert s["drafts"] > 2000
    assert abs(s["mean_acceptance_length"] - mean) < 5 * math.sqrt(var / s["drafts"])
    assert s["acceptance_rate"] == pytest.approx((s["mean_acceptance_length"] - 1) / k, rel=1e-12)
    # the last step of a request keeps at most what it still needs: fewer tokens than drafts accepted
    assert s["tokens_per_step"] < s["mean_acceptance_length"]
    check_run(runs[0], requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_all_accepted_by_hand(engine):
    # One request, prompt 4, output 10; linear costs 0.5 ms per prompt (and draft) token, 8 ms a
    # decode step; n-gram drafts k = 3, proposing costs 1 ms a step; every draft accepted.
    # Prefill: 4 x 0.5 + 1 = 3 ms -> first token at 3.
    # Each decode step: 8 + 3 x 0.5 + 1 = 10.5 ms. Steps yield 4, 4, then 1 (only one left):
    # tokens 5, 9, 10 at 13.5, 24, 34.5. TPOT (34.5 - 3) / 9 = 3.5 ms; three ITL samples of 10.5.
    # KV (blocks of 4): each step takes slots for computed + 1 + 3 tokens: 8, 12, 16 -> 2, 3, 4
    # blocks, nothing to release as every draft is kept (the last step keeps 13 tokens: still 4 blocks).
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, acceptance_rate=1.0, proposer_ms=1.0)
    check = IterationChecker(kv_blocks=16) if engine == "fast" else None
    r = run_engine([Request(0, 0.0, 4, 10)], ContinuousScheduler(ContinuousConfig(allocation="grow")),
                   LinearCostModel(LinearConfig(prefill_ms_per_token=0.5)), PagedKVCache(16, 4),
                   engine=engine, speculative=spec, check=check)
    assert r.requests["first_token_ms"].tolist() == [3.0]
    assert r.requests["finish_ms"].tolist() == [34.5]
    assert r.metrics["tpot_ms"]["mean"] == 3.5
    assert r.metrics["itl_ms"]["mean"] == 10.5 and r.metrics["itl_ms"]["max"] == 10.5
    assert r.metrics["iterations"] == 4
    assert r.counters["kv_peak_blocks"] == 4
    c = r.counters
    assert (c["spec_drafts"], c["spec_draft_tokens"], c["spec_accepted_tokens"], c["decode_tokens"]) == (3, 9, 9, 9)
    s = r.metrics["speculative"]
    assert (s["acceptance_rate"], s["mean_acceptance_length"], s["tokens_per_step"]) == (1.0, 4.0, 3.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_all_rejected_with_a_drafter_by_hand(engine):
    # Prompt 4, output 3; target: 0.5 ms per prompt/draft token, 8 ms a decode step. EAGLE-style
    # drafter k = 2 (so 2 lookahead KV slots), its own linear cost: 0.25 ms a token, 1 ms a step.
    # Every draft rejected.
    # Prefill: target 2; drafter: one pass over the 4 prompt tokens (1) + one one-token pass (1)
    #   -> 4 ms, first token at 4.
    # Each decode step: target 8 + 2 x 0.5 = 9; drafter's pass over 1 + 2 tokens (2 drafts x 0.25
    #   + 1) = 1.5, then one one-token pass 1 -> 11.5 ms; one token a step: 15.5, 27.
    # KV (blocks of 4): the prefill takes slots for its 4 tokens and the drafter's 2 lookahead
    # slots, as vLLM's allocate_slots does for a prompt chunk too (6: 2 blocks); decode step 1
    # takes slots for 4 + 1 + 2 + 2 = 9 tokens (3 blocks) and keeps 5 tokens, but the request
    # keeps the blocks, as in vLLM (its next step reuses them); step 2 needs 10 slots: still 3.
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=2, acceptance_rate=0.0, draft={"kind": "linear"})
    draft = LinearCostModel(LinearConfig(prefill_ms_per_token=0.25, decode_ms_per_step=1.0))
    used_after = []

    class Spy(IterationChecker):
        def __call__(self, instance, record):
            super().__call__(instance, record)
            used_after.append(record.kv_used_after)

    check = Spy(kv_blocks=16) if engine == "fast" else None
    r = run_engine([Request(0, 0.0, 4, 3)], ContinuousScheduler(ContinuousConfig(allocation="grow")),
                   LinearCostModel(LinearConfig(prefill_ms_per_token=0.5)), PagedKVCache(16, 4),
                   engine=engine, speculative=spec, draft_cost=draft, check=check)
    assert r.requests["first_token_ms"].tolist() == [4.0]
    assert r.requests["finish_ms"].tolist() == [27.0]
    assert r.metrics["tpot_ms"]["mean"] == 11.5
    assert r.counters["kv_peak_blocks"] == 3
    assert r.counters["kv_block_ms"] == 2 * 4.0 + 3 * 11.5 + 3 * 11.5  # blocks in use x iteration time
    if engine == "fast":
        assert used_after == [2, 3, 0]  # the rejected drafts' and lookahead slots stay until the finish
    s = r.metrics["speculative"]
    assert (s["draft_tokens"], s["accepted_tokens"], s["acceptance_rate"], s["tokens_per_step"]) == (4, 0, 0.0, 1.0)


def test_budget_cuts_drafts_in_running_order():
    # Four requests with 2-token prompts, k = 3, a budget of 9 tokens. Iteration 1 prefills all
    # four (8 tokens). Iteration 2: 4 x (1 + 3) = 16 > 9, so as in vLLM the running requests
    # take their tokens in order: 4, 4, then 1 (no drafts) and the fourth waits.
    batches = []

    class Spy(IterationChecker):
        def __call__(self, instance, record):
            super().__call__(instance, record)
            batches.append(record.batch)

    requests = [Request(i, 0.0, 2, 30) for i in range(4)]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, acceptance_rate=0.5)
    cfg = ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=9, allocation="grow")
    r = run_engine(requests, ContinuousScheduler(cfg), speculative=spec, check=Spy(token_budget=9))
    assert (batches[1].num_decode, batches[1].spec_tokens, batches[1].num_batched_tokens) == (3, 6, 9)
    assert all(b.num_batched_tokens <= 9 for b in batches)
    compare_runs(r, run_engine(requests, ContinuousScheduler(cfg), speculative=spec, engine="reference"), rel=1e-12)


def test_k_by_batch_size_follows_vllm_ranges():
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=3, k_by_batch_size=[[1, 2, 4], [5, 8, 1], [10, 12, 0]])
    # sizes 1-2: 4 capped at num_speculative_tokens; 3-4: the gap keeps the previous k;
    # 9: the gap after 5-8 keeps 1; past the last range: 0.
    assert [cfg.k_for(b) for b in range(1, 15)] == [3, 3, 3, 3, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]


def test_engines_verify_the_drafts_proposed_for_the_previous_batch():
    """The drafts a step verifies were proposed after the previous step, for its batch size."""
    records = []

    class Spy(IterationChecker):
        def __call__(self, instance, record):
            super().__call__(instance, record)
            records.append(record)

    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4, k_by_batch_size=[[1, 1, 4], [2, 3, 2], [4, 64, 0]])
    requests = [Request(i, 40.0 * i, 8, 12) for i in range(6)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow")), speculative=spec,
                   check=Spy())
    compare_runs(r, run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow")),
                               speculative=spec, engine="reference"), rel=1e-12)
    assert {spec.k_for(r.batch.num_seqs) for r in records if r.batch.num_decode} >= {4, 2}
    for before, now in zip(records, records[1:]):
        # (each decode was in the step before: its last decode, or its prompt's last chunk)
        assert now.batch.spec_tokens == spec.k_for(before.batch.num_seqs) * now.batch.num_decode
        assert now.spec_k == 4  # (the most a decode may verify: drafts differ by request)


@pytest.mark.parametrize("engine", ENGINES)
def test_requests_that_cannot_hold_their_drafts_are_rejected(engine):
    # 16 blocks of 4 = 64 tokens. Prompt 30 + max_tokens 30 fits without speculation (59 slots),
    # not with k = 3 n-gram drafts (62 + ... : 59 + 3 = 62 fits) -- so use an EAGLE drafter, whose
    # 3 lookahead slots make 65. (No max_model_len: nothing caps the slots, see the next test.)
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=3, draft={"kind": "linear"})
    requests = [Request(0, 0.0, 30, 30), Request(1, 0.0, 30, 26)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow")), kv=PagedKVCache(16, 4),
                   engine=engine, speculative=spec, draft_cost=LinearCostModel())
    assert r.requests["rejected"].tolist() == [1, 0]
    assert "speculative slots" in r.rejections[0]
    check_run(r, requests, kv_blocks=16)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("longest,peak", [(60, 15), (64, 16)])
def test_drafts_and_their_slots_stay_within_max_model_len(engine, longest, peak):
    """vLLM 0.33 cuts a decode's tokens to ``max_model_len - num_computed_tokens - 1`` and takes
    no KV slot past ``max_model_len``. Prompt 30 + max_tokens 30 with 3 EAGLE drafts, none accepted:
    29 decodes, the j-th at 30 + j computed tokens. At max_model_len 60 the decodes verify
    min(4, 59 - 30 - j) tokens: 4 up to j = 25, then 3, 2, 1 -- 26 x 3 + 2 + 1 + 0 = 81 drafts,
    and hold at most 60 slots, 15 blocks of 4. At 64 every decode verifies 4 (87 drafts) and the
    last, at 58 computed, takes min(58 + 4 + 3, 64) = 64 slots, 16 blocks. Unlimited, the request
    would need 65 slots: 17 blocks, more than the 16 the cache has (see the test above)."""
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=3, acceptance_rate=0.0, draft={"kind": "linear"})
    requests = [Request(0, 0.0, 30, 30)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow", max_model_len=longest)),
                   kv=PagedKVCache(16, 4), engine=engine, speculative=spec, draft_cost=LinearCostModel())
    assert r.requests["rejected"].tolist() == [0]
    assert r.metrics["speculative"]["draft_tokens"] == (81 if longest == 60 else 87)
    assert r.counters["kv_peak_blocks"] == peak
    assert r.metrics["num_preemptions"] == 0
    check_run(r, requests, kv_blocks=16)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_whose_capped_slots_cannot_fit_is_rejected(engine):
    """15 blocks of 4 = 60 tokens, max_model_len 64. Without speculation prompt 30 + max_tokens 30
    needs 59 slots (15 blocks) and is served; with EAGLE's 3 drafts and 3 lookahead slots its last
    decode takes up to max_model_len = 64 slots -- 16 blocks, not 65 -- so it is rejected, the
    message naming 30 + 5 speculative slots (64 - 30 + 1 - 30 = 5)."""
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=3, draft={"kind": "linear"})
    requests = [Request(0, 0.0, 30, 30)]
    scheduler = ContinuousScheduler(ContinuousConfig(allocation="grow", max_model_len=64))
    r = run_engine(requests, scheduler, kv=PagedKVCache(15, 4), engine=engine, speculative=spec,
                   draft_cost=LinearCostModel())
    assert r.requests["rejected"].tolist() == [1]
    assert "needs 16 KV blocks" in r.rejections[0] and "(max_tokens 30 + 5 speculative slots)" in r.rejections[0]
    plain = run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow", max_model_len=64)),
                       kv=PagedKVCache(15, 4), engine=engine)
    assert plain.requests["rejected"].tolist() == [0]


def test_reservations_hold_the_drafts_slots():
    """allocation = "reserve" reserves prompt + max_tokens plus the drafts and lookahead of a
    last step, so reserving sequences never need a block and are never preempted."""
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=2, acceptance_rate=0.5, draft={"kind": "linear"})
    requests = [Request(i, 0.0, 10, 22) for i in range(5)]
    for engine in ENGINES:
        r = run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="reserve")), kv=PagedKVCache(30, 4),
                       engine=engine, speculative=spec, draft_cost=LinearCostModel())
        # 10 + 22 + 2 + 2 = 36 tokens = 9 blocks each: three fit 30 blocks at once
        assert r.counters["kv_peak_blocks"] == 27
        assert r.metrics["num_preemptions"] == 0
        check_run(r, requests, kv_blocks=30)


def test_cost_models_see_the_verify_pass():
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel

    linear = LinearCostModel(LinearConfig(prefill_ms_per_token=0.05, decode_ms_per_step=8.0))
    assert linear.iteration_ms(Batch(4, 4000, spec_tokens=12)) == 8.0 + 12 * 0.05
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    roof = RooflineCostModel(presets.model("llama-3-8b"), presets.gpu("a100-80gb"),
                             RooflineConfig(model="llama-3-8b", gpu="a100-80gb"))
    plain = roof.iteration_ms(Batch(4, 4 * 1000))
    verify = roof.iteration_ms(Batch(4, 4 * 1003, spec_tokens=12))
    # more expensive than a plain decode, far cheaper than the 4 steps it may replace
    assert plain < verify < 1.5 * plain
    # a big batch's verify pass costs much more than its plain decode (compute and padded attention)
    big_plain = roof.iteration_ms(Batch(256, 256 * 2000))
    assert roof.iteration_ms(Batch(256, 256 * 2003, spec_tokens=768)) > 1.5 * big_plain
    assert roof.decode_step_increment(Batch(4, 4 * 1003, spec_tokens=12)) is None


@pytest.mark.parametrize("method, lone, pair", [
    ("eagle", 3 * 1.0 + 0.5, 1.0),        # k = 0: the first pass alone, nothing sampled
    ("draft_model", 3 * 1.0 + 0.5, 3 * 1.0 + 0.5),  # the V2 runner drafts k_max whatever the step's k
    ("ngram", 0.5, 0.0),                  # no passes; nothing proposed at k = 0
])
def test_drafts_per_batch_size_cut_eagles_passes_but_not_its_first_nor_a_draft_models(method, lone, pair):
    """vLLM 0.33 (``schedlab.drafting``): with k = 3 for a lone request and 0 from two, EAGLE runs
    its first pass at k = 0 too (it keeps the drafter's KV cache in step) and a draft model runs
    all 3 passes whatever k. The drafter: 1 ms a pass (its decode step); proposer_ms 0.5."""
    from schedlab.drafting import DraftingCostModel

    spec = SpeculativeConfig(method=method, num_speculative_tokens=3, k_by_batch_size=[[1, 1, 3], [2, 64, 0]],
                             draft=None if method == "ngram" else {"kind": "linear"}, proposer_ms=0.5)
    drafter = None if method == "ngram" else LinearCostModel(LinearConfig(prefill_ms_per_token=0.25,
                                                                           decode_ms_per_step=1.0))
    cost = DraftingCostModel(LinearCostModel(LinearConfig(decode_ms_per_step=8.0)), drafter, spec)
    assert cost.draft_ms(Batch(1, 100)) == lone
    assert cost.draft_ms(Batch(2, 200)) == pair
    assert cost.iteration_ms(Batch(2, 200)) == 8.0 + pair


def test_a_request_that_can_never_be_padded_stalls_the_run_with_the_reason():
    """A one-token admission with a cache hit is padded to a decode's 1 + k rows (vLLM's
    pad_spec_decode) or not scheduled at all; beside a draft model's input slot a budget of 2
    leaves it 1 row, so vLLM would wait for ever. The run stops with an error that says so."""
    from schedlab.errors import StallError
    from schedlab_plugins.kv_caches import PrefixKVCache

    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=1, acceptance_rate=0.0,
                             draft={"kind": "linear"})
    # 0 computes the shared first token (1 waits: the budget is 0's and the slots'); then 1 finds it
    # cached and has one token left: padded
    requests = [Request(0, 0.0, 1, 1, prefix_group=0, prefix_tokens=1), Request(1, 0.0, 2, 1, prefix_group=0,
                                                                                prefix_tokens=1)]
    with pytest.raises(StallError, match=r"request 1 waits to be padded to a decode's 2 rows .* the budget leaves "
                                         r"it 1: vLLM schedules nothing in its place; raise max_num_batched_tokens"):
        run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=2, max_num_batched_tokens=2)),
                   kv=PrefixKVCache(8, 1), speculative=spec, draft_cost=LinearCostModel())


EXPERIMENT = """
[experiment]
name = "spec"
seed = 3
[workload]
kind = "synthetic"
num_requests = 30
rate = 5.0
prompt = {dist = "uniform", low = 20, high = 200}
output = {dist = "uniform", low = 20, high = 200}
[scheduler]
kind = "vllm"
[cost_model]
kind = "roofline"
model = "llama-3-8b"
gpu = "a100-80gb"
[kv_cache]
kind = "paged"
num_blocks = 2000
[speculative]
method = "draft_model"
num_speculative_tokens = 3
acceptance_rate = 0.8
draft = {kind = "roofline", model = "llama-3.2-1b", gpu = "a100-80gb"}
[[runs]]
name = "fast"
[[runs]]
name = "reference"
engine = "reference"
"""


def test_experiment_with_a_speculative_table(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(EXPERIMENT)
    results = run_experiment(load(path))
    fast, ref = (s.runs[0] for s in results.studies)
    compare_runs(fast, ref, rel=1e-9)
    assert fast.metrics["speculative"]["acceptance_rate"] > 0.4
    assert fast.meta["speculative"]["num_speculative_tokens"] == 3
    plain = run_experiment(load(path, ["speculative.num_speculative_tokens=1"])).studies[0].runs[0]
    assert plain.metrics["speculative"]["draft_tokens"] < fast.metrics["speculative"]["draft_tokens"]


@pytest.mark.parametrize("table,message", [
    ('method = "eagle"', "[speculative]: draft: method 'eagle' needs the drafter's cost model"),
    ('method = "ngram"\ndraft = {kind = "linear"}', "[speculative]: draft: method 'ngram' proposes on the CPU"),
    ('method = "ngram"\nnum_specualtive_tokens = 2', "[speculative]: unknown key 'num_specualtive_tokens' "
                                                     "(did you mean 'num_speculative_tokens'?)"),
    ('method = "ngram"\nacceptance_rate = 0.9\nacceptance_sd = 0.4', "[speculative]: acceptance_sd: must be below"),
    ('method = "ngram"\nk_by_batch_size = [[2, 4, 1]]', "k_by_batch_size: the first range must start at batch size 1"),
    ('method = "ngram"\nk_by_batch_size = [[1, 4, 1], [3, 5, 2]]', "ranges must be sorted and must not overlap"),
    ('method = "ngram"\nk_by_batch_size = [[1, 4]]', "every entry must be [first, last, k]"),
    ('method = "ngram"\nacceptance_rate = 1.5', "acceptance_rate: must be <= 1.0"),
    ('method = "draft_model"\ndraft = {kind = "rooflin"}', "[speculative.draft]: unknown cost_model 'rooflin'"),
    ('method = "draft_model"\ndraft = {kind = "linear", decode_ms = 1}', "[speculative.draft]: unknown key 'decode_ms'"),
])
def test_bad_speculative_tables_name_table_and_key(tmp_path, table, message):
    text = EXPERIMENT.split("[speculative]")[0] + "[speculative]\n" + table + "\n"
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_readme_quotes_the_speculation_experiment():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "experiments/speculative_decoding.toml" in readme


@pytest.mark.parametrize("overrides,message", [
    (["scheduler.max_num_batched_tokens=3"],
     "max_num_batched_tokens = 3 must exceed the drafter's 3 lookahead slots ([speculative] draft_model"),
    (["scheduler.chunked_prefill=false"], 'method = "draft_model" takes an input slot of the token budget'),
])
def test_a_budget_the_drafts_cannot_use_is_refused_naming_the_table(tmp_path, overrides, message):
    """vLLM refuses a budget at or below the lookahead ("not enough slots to schedule a token");
    a draft model's input slot beside every request needs chunked prefill."""
    path = tmp_path / "spec.toml"
    path.write_text(EXPERIMENT)
    with pytest.raises(ConfigError) as err:
        run_experiment(load(path, overrides))
    assert message in str(err.value) and "[scheduler]" in str(err.value)
    run_experiment(load(path, ["scheduler.max_num_batched_tokens=4", "speculative.num_speculative_tokens=3",
                               "workload.num_requests=3"]))  # (one slot above the lookahead: served)


def test_a_draft_models_input_slots_leave_fewer_tokens_for_prompts():
    """Budget 8, a draft model with k = 2, every draft rejected: the first prompt (6 tokens)
    takes 6 + 1 input slots, leaving the second none (n-gram: 2); it is chunked 3 + 3 beside the
    first's 3-token verify passes (n-gram: the rest, 4, at once). Times in 1 ms steps."""
    reqs = [Request(0, 0.0, 6, 3), Request(1, 0.0, 6, 1)]
    one_ms = LinearConfig(prefill_ms_per_token=0.0, decode_ms_per_step=0.0, base_ms=1.0)
    first = {}
    for method in ("draft_model", "ngram"):
        spec = SpeculativeConfig(method=method, num_speculative_tokens=2, acceptance_rate=0.0,
                                 draft={"kind": "linear"} if method != "ngram" else None)
        runs = [run_engine(reqs, ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=8,
                                                                      chunked_prefill=True, allocation="grow")),
                           LinearCostModel(one_ms), PagedKVCache(40, 16), engine=engine, speculative=spec)
                for engine in ENGINES]
        compare_runs(*runs, rel=0.0)
        first[method] = runs[0].requests["first_token_ms"].tolist()
    assert first == {"draft_model": [1.0, 3.0], "ngram": [1.0, 2.0]}


def test_eagle_block_keys_cover_the_token_after_the_block():
    """vLLM 0.33 hashes a block with the token after it for EAGLE (num_hash_lookahead_tokens):
    a group's shared prompt of 8 tokens in blocks of 4 shares block 0 only (token 8 is each
    request's own), one of 9 tokens shares both; Mooncake ids name the next id block then."""
    from schedlab_plugins.kv_caches.prefix import block_key

    def req(prefix, prompt=12, **kw):
        return Request(0, 0.0, prompt, 1, prefix_group=None if kw else 0, prefix_tokens=0 if kw else prefix, **kw)

    assert [block_key(req(8), j, 4) for j in (0, 1)] == [("g", 0, 3), ("g", 0, 7)]
    assert [block_key(req(8), j, 4, 1) for j in (0, 1)] == [("g", 0, 4), ("r", 0, 1)]
    assert [block_key(req(9), j, 4, 1) for j in (0, 1)] == [("g", 0, 4), ("g", 0, 8)]
    hashed = req(0, block_hashes=(7, 8, 9), hash_block_tokens=4)
    assert [block_key(hashed, j, 4, 1) for j in (0, 1, 2)] == [("h", 8, 0), ("h", 9, 0), ("r", 0, 2)]


@pytest.mark.parametrize("prefix,hit", [(8, 4), (9, 8)])
def test_eagle_prefix_hits_need_the_next_token_too(prefix, hit):
    """Request 1 arrives after request 0 served its prompt (the shared first ``prefix`` tokens);
    with an EAGLE drafter it hits the blocks whose next token is shared too, with n-gram every
    shared full block."""
    reqs = [Request(0, 0.0, 12, 1, prefix_group=0, prefix_tokens=prefix),
            Request(1, 50.0, 12, 1, prefix_group=0, prefix_tokens=prefix)]
    for method, expected in (("eagle", hit), ("ngram", 8)):
        spec = SpeculativeConfig(method=method, num_speculative_tokens=1, acceptance_rate=0.5,
                                 draft={"kind": "linear"} if method == "eagle" else None)
        runs = [run_engine(reqs, ContinuousScheduler(ContinuousConfig(chunked_prefill=True, allocation="grow")),
                           LinearCostModel(LinearConfig()), PrefixKVCache(20, 4), engine=engine, speculative=spec)
                for engine in ENGINES]
        compare_runs(*runs, rel=0.0)
        assert runs[0].requests["cached_tokens"].tolist() == [0, expected], method


@pytest.mark.parametrize("block, prefix, hit", [(1, 16, 15), (4, 16, 12), (4, 17, 16)])
def test_eagle_keys_sglangs_radix_tree_by_token_pairs(block, prefix, hit):
    """Review spec82: SGLang keys its radix tree by bigrams under EAGLE (``convert_to_bigram_key``:
    the draft sequence is the target's shifted by one), so a prompt sharing 16 tokens matches 15 of
    them (12 in pages of 4); the radix cache matched all 16. n-gram keeps the plain keys."""
    from schedlab_plugins.kv_caches import RadixKVCache
    from schedlab_plugins.schedulers import SglangConfig, SglangScheduler

    reqs = [Request(0, 0.0, prefix + 5, 3, prefix_group=0, prefix_tokens=prefix),
            Request(1, 50.0, prefix + 5, 3, prefix_group=0, prefix_tokens=prefix)]
    for method, expected in (("eagle", hit), ("ngram", prefix // block * block)):
        spec = SpeculativeConfig(method=method, num_speculative_tokens=2, acceptance_rate=0.5,
                                 draft={"kind": "linear"} if method == "eagle" else None)
        runs = [run_engine(reqs, SglangScheduler(SglangConfig()), LinearCostModel(LinearConfig()),
                           RadixKVCache(256, block), engine=engine, speculative=spec) for engine in ENGINES]
        compare_runs(*runs, rel=0.0)
        assert runs[0].requests["cached_tokens"].tolist() == [0, expected], method


def test_hash_lookahead_is_set_before_anything_is_cached():
    kv = PrefixKVCache(4, 4)
    kv.use_hash_lookahead(1)
    assert kv.hash_lookahead == 1
    assert kv.allocate(_KvSeq(), 4)
    with pytest.raises(AssertionError, match="on a cache in use"):
        kv.use_hash_lookahead(1)


class _KvSeq:
    """What a KV cache reads of a sequence."""

    def __init__(self):
        self.request = Request(0, 0.0, 8, 1)
        self.num_computed_tokens = 0
        self.reserved_tokens = 0
        self.kv_state = None


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_an_abort_during_a_verify_step_frees_the_slots_its_drafts_took(engine, asynchronous):
    """Blocks of one token, k = 2 (n-gram), every draft rejected, 1 ms a step. The prompt (4
    tokens) runs at [0, 1]; the verify step at [j, j + 1] takes its position + 3 slots: 3 + j + 3
    blocks synchronously, 11 at [5, 6]. Planning ahead, its plan (made at j - 1) counts the 2
    drafts of the step in flight as computed: j + 8 blocks, 13 at [5, 6]. The client gives up at
    5.5 ms: the token of [5, 6] never comes (5 tokens: at 1 to 5), and every block the request
    took -- those of [5, 6]'s drafts too, and planning ahead the step after it, made before the
    abort was read -- is free at the end."""
    request = Request(id=0, arrival_ms=0.0, prompt_tokens=4, output_tokens=40, timeout_ms=5.5)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2, acceptance_rate=0.0)
    kv = PagedKVCache(64, 1)
    cfg = ContinuousConfig(max_num_seqs=1, max_num_batched_tokens=64, allocation="grow", chunked_prefill=True,
                           async_scheduling=asynchronous)
    result = run_engine([request], ContinuousScheduler(cfg), LinearCostModel(LinearConfig(base_ms=1.0,
                        decode_ms_per_step=0.0, prefill_ms_per_token=0.0)), kv, engine=engine, speculative=spec)
    assert result.requests["aborted"].tolist() == [1]
    assert result.requests["generated_tokens"].tolist() == [5]
    assert result.counters["kv_peak_blocks"] == (13 if asynchronous else 11)
    assert kv.num_used_blocks() == 0


def test_the_drafters_weights_and_kv_layers_come_out_of_the_pool():
    """vLLM loads the drafter beside the target and pages its KV layers with the target's, so a
    block holds both. Llama-3-8B (32 layers, 8 KV heads of 128: 128 KiB a token) with Llama-3.2-1B
    (16 layers, 8 KV heads of 64: 2 x 16 x 8 x 64 x 2 B = 32 KiB) on an A100-80GB: 160 KiB a token,
    and the pool loses the drafter's weights (its parameters x 2 bytes) too."""
    from schedlab.capacity import Presets, size_kv_cache
    from schedlab.catalog import load_catalog

    presets = Presets.from_catalog(load_catalog(entry_points=False))
    target, gpu, draft = presets.model("llama-3-8b"), presets.gpu("a100-80gb"), presets.model("llama-3.2-1b")
    plain = size_kv_cache(target, gpu)
    both = size_kv_cache(target, gpu, draft=draft)
    assert (plain.bytes_per_token, both.bytes_per_token) == (128 * 1024, 160 * 1024)
    assert both.weight_bytes == plain.weight_bytes + math.ceil(draft.num_params * 2)
    assert both.num_blocks == (plain.usable_bytes - both.weight_bytes - plain.reserve_bytes) // (16 * 160 * 1024)
    assert 21_000 < both.num_blocks < 22_500 < 28_000 < plain.num_blocks  # about 23% fewer blocks
    tp2 = size_kv_cache(target, gpu, tensor_parallel=2, draft=draft)  # the drafter split as the target is
    assert tp2.bytes_per_token == (128 + 32) * 1024 // 2
    # an EAGLE head uses the target's embedding and LM head: its tied 128,256 x 2,048 table is not loaded twice
    head = size_kv_cache(target, gpu, draft=draft, draft_shares_tables=True)
    assert head.weight_bytes == plain.weight_bytes + math.ceil((draft.num_params - 128_256 * 2_048) * 2)


def test_a_runs_pool_holds_the_drafter_its_cost_model_names(tmp_path):
    """[speculative]'s draft cost model names the drafter; a pool sized from model and gpu makes
    room for it ([kv_cache] draft_model), unless draft_memory = false or the table names its own."""
    text = EXPERIMENT.replace('num_blocks = 2000', 'model = "llama-3-8b"\ngpu = "a100-80gb"')
    path = tmp_path / "spec.toml"
    path.write_text(text.replace('engine = "reference"', 'speculative = {draft_memory = false}'))
    results = run_experiment(load(path, ["workload.num_requests=3"]))
    with_drafter, without = (s.runs[0].meta["kv_cache"] for s in results.studies)
    assert with_drafter["draft_model"] == "llama-3.2-1b" and "draft_model" not in without
    assert with_drafter["bytes_per_token"] == 160 * 1024 and without["bytes_per_token"] == 128 * 1024
    assert with_drafter["num_blocks"] < 0.8 * without["num_blocks"]
    named = run_experiment(load(path, ["workload.num_requests=3", "kv_cache.draft_model=llama-3-8b"]))
    assert named.studies[0].runs[0].meta["kv_cache"]["bytes_per_token"] == 2 * 128 * 1024
    path.write_text(text.replace('method = "draft_model"', 'method = "ngram"').replace(
        'draft = {kind = "roofline", model = "llama-3.2-1b", gpu = "a100-80gb"}', ""))
    ngram = run_experiment(load(path, ["workload.num_requests=3"]))  # (n-gram drafts on the CPU: no drafter)
    assert "draft_model" not in ngram.studies[0].runs[0].meta["kv_cache"]


def test_a_rate_beside_rates_by_position_is_refused_and_a_capped_k_needs_no_more_rates():
    """Review s81 (badinput, 5-6): acceptance_rate beside acceptance_by_position was ignored silently
    (the run's meta recorded it); a k_by_batch_size k above num_speculative_tokens, capped at it when
    drafting, made three rates for k = 3 'not enough'."""
    from schedlab.configs import FieldError

    with pytest.raises(FieldError, match="acceptance_rate: acceptance_by_position gives each position's rate"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=3, acceptance_by_position=[0.9, 0.8, 0.7],
                          acceptance_rate=0.5)
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=3, acceptance_by_position=[0.9, 0.8, 0.7],
                            k_by_batch_size=[[1, 1000, 9]])
    assert cfg.k_for(1) == 3
    with pytest.raises(FieldError, match="gives 2 rate"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=3, acceptance_by_position=[0.9, 0.8])


@pytest.mark.parametrize("engine", ENGINES)
def test_an_admissions_placeholder_drafts_count_as_drafts_verified(engine):
    """Review spec82: a one-token prompt admitted beside a decode is padded to 1 + k rows (vLLM's
    ``pad_spec_decode``: ``scheduled_spec_decode_tokens`` of -1s), which vLLM's spec-decoding stats
    count as drafts, all rejected -- and schedlab does on a decode pool. Synchronous, n-gram k = 2
    with position shares [1, 0]: A (prompt 4, answer 9) verifies 4 x 2 drafts, 4 accepted; B (a
    one-token prompt, answer 3) is admitted at 11 ms padded by 2, then verifies 2 drafts, 1 accepted:
    12 drafts in 6 steps, 5 accepted (acceptance 5/12, not 5/10)."""
    reqs = [Request(0, 0.0, 4, 9), Request(1, 3.0, 1, 3)]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2, acceptance_by_position=(1.0, 0.0))
    from schedlab_plugins.schedulers.presets import VllmConfig

    result = run_engine(reqs, ContinuousScheduler(VllmConfig(async_scheduling=False)),
                        LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                        PagedKVCache(64, 4), engine=engine, speculative=spec)
    assert result.requests["first_token_ms"].tolist()[1] == pytest.approx(11.0 + 8.0 + (2 + 1 + 2) * 0.5)
    s = result.metrics["speculative"]
    assert (s["draft_tokens"], s["drafts"], s["accepted_tokens"]) == (12, 6, 5)
    assert s["acceptance_rate"] == pytest.approx(5 / 12) and s["mean_acceptance_length"] == pytest.approx(1 + 5 / 6)
