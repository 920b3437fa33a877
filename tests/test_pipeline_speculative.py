"""Speculative decoding on pipelined instances: the drafter on the last stage by hand in both
engines, the fast engine against the reference engine on random workloads (clients giving up
too), the acceptance draws a colocated run makes and the TOML (with ``[power]`` and ``[clock]``:
``test_pipeline_speculative_energy.py``).

Hand-computed cases use :class:`LinearParallelCost` over 2 stages as ``test_pipeline_parallel.py``
does: each stage takes half the ``linear`` model's iteration (0.5 ms per prompt or draft token,
8 ms per decode step) and a stage sends the next 0.25 ms + 0.0625 ms per token. vLLM builds the
drafter on the last stage only, so its passes (or n-gram's ``proposer_ms``) lengthen that stage.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedlab.drafting import DraftingCostModel
from schedlab.model import Request
from schedlab.protocols import Batch
from schedlab.speculative import SpeculativeConfig, budget_problem
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import (check_run, compare_runs, dyadic_linear_costs, examples,
                              fast_run_agreeing_with_reference, requests_lists, run_engine)
from schedlab.testing.parallel import LinearParallelCost, run_pipelined
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from test_data_parallel import SPECULATIVE
from test_data_parallel_speculative import blocks_with_drafts, drafter_of
from test_pipeline_parallel import BASE, ROUTERS, client_side, schedulers
from test_speculative_differential import speculative_configs

ENGINES = ("fast", "reference")
TARGET = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)
#: the hand-computed cases' EAGLE-style drafter: 0.25 ms a token, 1 ms a decode step
DRAFTER = LinearConfig(prefill_ms_per_token=0.25, decode_ms_per_step=1.0)
NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=2, acceptance_rate=1.0, proposer_ms=1.0)
EAGLE = SpeculativeConfig(method="eagle", num_speculative_tokens=2, acceptance_rate=0.0, draft={"kind": "linear"})


def instance(*, budget: int = 256, block_size: int = 16, stages: int = 2):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=budget,
                                                         allocation="grow", chunked_prefill=True))
        return scheduler, LinearParallelCost(LinearCostModel(TARGET), stages=stages, moe=False), \
            PagedKVCache(64, block_size)
    return make


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def spec_counters(result) -> tuple:
    c = result.counters
    return c["spec_drafts"], c["spec_draft_tokens"], c["spec_accepted_tokens"], c["decode_tokens"]


# -- the last stage's drafting -----------------------------------------------------------------------------


def test_the_drafter_lengthens_the_last_stage_only():
    # A decode verifying 2 drafts: target 8 + 2 x 0.5 = 9 ms, 4.5 a stage, send 0.25 + 0.0625 x 3.
    # EAGLE: the drafter's pass over the 3 tokens (2 x 0.25 + 1 = 1.5) and one one-token pass (1).
    # n-gram: proposer_ms (1) only.
    target = LinearParallelCost(LinearCostModel(TARGET), stages=2, moe=False)
    batch = Batch(num_decode=1, decode_context_tokens=11, spec_tokens=2)
    eagle = DraftingCostModel(target, LinearCostModel(DRAFTER), EAGLE)
    assert eagle.pipeline_ms(batch) == ((4.5, 7.0), 0.4375)
    assert DraftingCostModel(target, None, NGRAM).pipeline_ms(batch) == ((4.5, 5.5), 0.4375)
    # a target that does not time stages: neither does its drafting wrapper (the run's check names the target)
    assert DraftingCostModel(LinearCostModel(TARGET), None, NGRAM).pipeline_ms is None


# -- hand-computed runs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_ngram_drafts_all_accepted_through_a_full_pipeline_by_hand(engine):
    # n-gram, k = 2, every draft accepted, 1 ms of proposing on the last stage. A budget of 16
    # puts r0's and r1's 16-token prompts (4 tokens each to generate) in batches of their own.
    # A (r0's prompt, 8 ms: 4 a stage, the last + 1; send 1.25): stage 0 0-4, stage 1 5.25-10.25.
    # B (r1's prompt) right behind: stage 0 4-8, stage 1 (busy until 10.25) 10.25-15.25.
    # A lands at 10.25 (r0's first token); C (r0 verifies 1 + 2: 9 ms, 4.5 a stage, the last
    # 5.5; send 0.4375): stage 0 10.25-14.75, stage 1 (busy until 15.25) 15.25-20.75.
    # B lands at 15.25 (r1's first token); D (r1 verifies): stage 0 15.25-19.75, stage 1 20.75-26.25.
    # C lands at 20.75: r0 keeps 1 + 2 tokens, 4 in all, done; nothing to launch (r1 is in D).
    # D lands at 26.25: r1 done.
    requests = [Request(0, 0.0, 16, 4), Request(1, 0.0, 16, 4)]
    r = run_pipelined(requests, instance(budget=16), 2, engine=engine, speculative=NGRAM)
    assert by_id(r, "first_token_ms") == {0: 10.25, 1: 15.25}
    assert by_id(r, "finish_ms") == {0: 20.75, 1: 26.25}
    assert spec_counters(r) == (2, 4, 4, 6)
    assert r.counters["iterations"] == 4 and r.counters["busy_ms"] == 26.25
    check_run(r, requests, kv_blocks=64)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_eagle_drafters_passes_on_the_last_stage_by_hand(engine):
    # EAGLE, k = 2, every draft rejected. r0: prompt 8, 3 tokens to generate.
    # Prompt: 4 ms, 2 a stage; the drafter's pass over its 8 tokens (2) and a one-token pass (1)
    #         on the last stage: 2 + 3 = 5; send 0.75 -> first token at 2 + 0.75 + 5 = 7.75.
    # Each decode: 9 ms, 4.5 a stage; drafting 1.5 + 1 on the last: 7; send 0.4375 -> 11.9375 a
    #         step, one token each (drafts rejected): 19.6875, 31.625.
    r = run_pipelined([Request(0, 0.0, 8, 3)], instance(block_size=4), 2, engine=engine, speculative=EAGLE,
                      draft_cost=LinearCostModel(DRAFTER))
    assert by_id(r, "first_token_ms") == {0: 7.75} and by_id(r, "finish_ms") == {0: 31.625}
    assert spec_counters(r) == (2, 4, 0, 2)
    assert r.counters["busy_ms"] == 31.625 and r.counters["iterations"] == 3
    # KV, blocks of 4: each decode takes slots for its computed tokens + 1 + 2 drafts + 2
    # lookahead: 8 + 5 = 13 (4 blocks), then 9 + 5 = 14 (still 4)
    assert r.counters["kv_peak_blocks"] == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_a_decode_preempted_in_flight_is_cached_up_to_the_tokens_vllm_knew(engine):
    """n-gram, k = 3, every draft accepted; blocks of 4, 5 blocks, prefix caching; budget 8.
    A (t=0) = r0's prompt (3) and r1's first 5 tokens: 2 ms a stage, send 0.75, lands at 4.75; B
    = r1's last prompt token, lands at 5. A lands: C = r0's decode, 1 + 3 tokens (4.75 ms a
    stage, send 0.5), slots to 7: its second block, 1 left. B lands: D = r1's decode, slots to 10:
    its third block, none left. C lands at 14.75 (r0: 5 tokens); r0's next decode needs a third
    block: FCFS preempts r1, the newest, with D in flight. vLLM cached r1's blocks as far as the
    tokens it knew when it scheduled D -- min(6 + 4, 7) = 7: one full block -- not D's draft
    slots (10: two). D lands at 19.5 (r1 held: its 4 tokens, 5 in all); r1 fits again only once
    r0 is done (24.75): it recomputes 11 - 4 = 7 tokens (1.75 ms a stage, send 0.6875), its last
    token at 28.9375 (with the drafts' slots counted as cached: 3 tokens, 26.6875)."""
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=8, allocation="grow",
                                                         chunked_prefill=True))
        return scheduler, LinearParallelCost(LinearCostModel(TARGET), stages=2, moe=False), PrefixKVCache(5, 4)

    ngram = SpeculativeConfig(method="ngram", num_speculative_tokens=3, acceptance_rate=1.0, proposer_ms=0.0)
    requests = [Request(0, 0.0, 3, 6), Request(1, 0.0, 6, 6)]
    r = run_pipelined(requests, make, 2, engine=engine, speculative=ngram)
    assert by_id(r, "first_token_ms") == {0: 4.75, 1: 5.0}
    assert by_id(r, "finish_ms") == {0: 24.75, 1: 28.9375}
    assert by_id(r, "preemptions") == {0: 0, 1: 1} and by_id(r, "cached_tokens") == {0: 0, 1: 4}
    assert r.counters["in_flight_preemptions"] == 1
    check_run(r, requests, kv_blocks=5)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_decode_aborted_in_flight_leaves_k_as_its_batch_was_launched(engine):
    # n-gram, every draft accepted, k = 2 after a batch of 1 and 1 after a batch of 2-4; no
    # proposer_ms. A budget of 16: batch A (r0's and r1's 8-token prompts, 8 ms: 4 a stage, send
    # 1.25) lands at 9.25; B (r2's 16-token prompt) behind it at 13.25.
    # At 9.25, k = 1 (A had 2): C (r0, r1 verify 1 + 1: 9 ms, 4.5 a stage, send 0.5): stage 0
    #   9.25-13.75, stage 1 14.25-18.75.
    # r1's client gives up at 10; the engine hears of it when B lands, at 13.25: r1 leaves with
    #   its one token (its slots in C freed), k = 2 (B had 1). D (r2 verifies 1 + 2: 9 ms, send
    #   0.4375): stage 0 13.75-18.25, stage 1 18.75-23.25.
    # C lands at 18.75 without r1: r0 keeps 1 + 1 (3 in all). The drafter proposed for C as
    #   launched, 2 sequences: k = 1. E (r0 verifies 1 + 1: 8.5 ms, 4.25 a stage, send 0.375):
    #   stage 0 18.75-23, stage 1 23.375-27.625 (with k = 2 it would land at 28.1875).
    # D lands at 23.25: r2 keeps 1 + 2, 4 in all, done. E lands at 27.625: r0 has 5, done.
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2, acceptance_rate=1.0,
                             k_by_batch_size=[[1, 1, 2], [2, 4, 1]])
    requests = [Request(0, 0.0, 8, 5), Request(1, 0.0, 8, 5, timeout_ms=10.0), Request(2, 0.0, 16, 4)]
    r = run_pipelined(requests, instance(budget=16), 2, engine=engine, speculative=spec)
    assert by_id(r, "aborted") == {0: 0, 1: 1, 2: 0}
    assert by_id(r, "first_token_ms") == {0: 9.25, 1: 9.25, 2: 13.25}
    assert by_id(r, "finish_ms") == {0: 27.625, 1: 13.25, 2: 23.25}
    assert by_id(r, "generated_tokens") == {0: 5, 1: 1, 2: 4}
    # r1's verify in C is dropped with its tokens: r0's in C and E (1 draft each), r2's in D (2)
    assert spec_counters(r) == (3, 4, 4, 7)
    assert r.counters["busy_ms"] == 27.625 and r.counters["iterations"] == 5
    check_run(r, requests, kv_blocks=64)


def test_a_batch_of_swaps_only_lands_after_the_instance_has_scheduled_again():
    """A batch that only swaps a sequence out takes no stage time, so it lands with the batch
    before it. After that landing the instance schedules first (vLLM's batch queue): here it
    preempts a prompt for lack of blocks and plans nothing else; the swap batch then lands and
    the next plan swaps the sequence back in. The reference engine once landed both batches
    before scheduling, and the engines parted (a case hypothesis found, Llama-3.1-8B over 3
    stages with an EAGLE drafter). Since a prompt's next chunk follows its last into the
    pipeline, that case no longer swaps; these requests (found by a search for a swap-only batch
    launched to land with the batch before it, again once prompt chunks took the drafter's
    lookahead slots) do."""
    from schedlab.parallelism import Parallelism
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
    from test_pipeline_parallel import _presets

    presets = _presets()
    gpu = presets.gpu("h100-80gb")
    requests = [Request(0, 0.0, 57, 8, max_tokens=140), Request(1, 0.0, 83, 4), Request(2, 0.0, 47, 7)]
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=1, acceptance_rate=0.7, draft={"kind": "roofline"})
    config = ContinuousConfig(max_num_seqs=3, max_num_batched_tokens=26, chunked_prefill=True, allocation="grow",
                              preemption="swap")
    blocks = blocks_with_drafts(requests, spec, 16)

    def make():
        cost = RooflineCostModel(presets.model("llama-3.1-8b"), gpu, RooflineConfig(model="llama-3.1-8b",
                                                                                    gpu="h100-80gb"),
                                 parallelism=Parallelism(pipeline_parallel=3))
        return ContinuousScheduler(config), cost, PagedKVCache(blocks, 16, swap_blocks=64, bytes_per_block=2 ** 20,
                                                               host_link_gbps=2 ** 10 / 1e3)

    drafter = RooflineCostModel(presets.model("llama-3.2-1b"), gpu, RooflineConfig(model="llama-3.2-1b",
                                                                                   gpu="h100-80gb"))
    runs = [run_pipelined(requests, make, 3, engine=engine, speculative=spec, draft_cost=drafter)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    assert runs[0].counters["swap_out_blocks"] > 0 and runs[0].counters["num_preemptions"] == 1
    check_run(runs[0], requests, kv_blocks=blocks)


# -- the fast engine against the reference engine; the rules of every run ---------------------------------


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=12, max_prompt=60, max_output=60, all_at_zero=False, priorities=True,
                      prefix_groups=2),
       schedulers(), speculative_configs(), st.integers(2, 4), st.integers(1, 2),
       st.sampled_from(sorted(ROUTERS)),
       dyadic_linear_costs(), st.integers(0, 30), st.integers(1, 8), st.booleans(),
       st.one_of(st.none(), st.integers(1, 160)), st.integers(0, 3))
def test_speculating_pipelines_agree_between_engines_and_keep_the_rules(requests, cfg, spec, stages, instances, router,
                                                                        cost, spare, block_size, prefix, timeout,
                                                                        seed):
    """Random arrivals, budgets that cut drafts short, swaps and recompute preemptions of
    sequences holding speculative slots, k by batch size, per-request acceptance rates, clients
    that give up while their batch is in flight: both engines alike, every request served,
    rejected or aborted once, slots and KV within bounds, every block back."""
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    blocks = blocks_with_drafts(requests, spec, block_size) + spare

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, block_size, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), kv

    side = client_side(timeout) if timeout is not None else None
    runs = [run_pipelined(requests, make, stages, instances, ROUTERS[router]() if instances > 1 else None,
                          engine=engine, client_side=side, speculative=spec, draft_cost=drafter_of(spec), seed=seed)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    for run in runs:
        check_run(run, requests, max_running=cfg.max_num_seqs * instances, kv_blocks=blocks * instances)
    c = runs[0].counters
    if timeout is None and c["decode_seq_steps"] and spec.acceptance_rate == 1.0 and not spec.k_by_batch_size:
        assert c["spec_accepted_tokens"] == c["spec_draft_tokens"] > 0


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=60, max_output=80, all_at_zero=False),
       st.integers(2, 3), st.integers(1, 4), st.sampled_from([0.5, 0.8]), st.sampled_from([0.0, 0.2]),
       st.integers(0, 3))
def test_each_sequences_acceptance_is_drawn_as_a_colocated_instance_draws_it(requests, stages, k, alpha, sd, seed):
    """With k drafts every step (no budget cuts, no preemption, no schedule by batch size) a
    request's accepted drafts depend on its draws alone: a pipelined instance verifies, accepts
    and generates what a colocated one does, however its batches interleave."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k, acceptance_rate=alpha, acceptance_sd=sd)
    config = ContinuousConfig(max_num_seqs=16, max_num_batched_tokens=4096, allocation="grow")
    blocks = 16 * blocks_with_drafts(requests, spec, 4)

    def make():
        return (ContinuousScheduler(config), LinearParallelCost(LinearCostModel(TARGET), stages=stages, moe=False),
                PagedKVCache(blocks, 4))

    piped = run_pipelined(requests, make, stages, speculative=spec, seed=seed)
    colocated = run_engine(requests, ContinuousScheduler(config), kv=PagedKVCache(blocks, 4), speculative=spec,
                           seed=seed)
    counted = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "decode_tokens", "decode_seq_steps")

    def verified(counters):  # (an admission's placeholder drafts depend on what it was admitted beside)
        return {**{n: counters[n] for n in counted}, "spec_drafts": counters["spec_drafts"] - counters[
            "spec_padded_drafts"], "spec_draft_tokens": counters["spec_draft_tokens"] - counters["spec_padded_tokens"]}
    assert verified(piped.counters) == verified(colocated.counters)
    assert by_id(piped, "generated_tokens") == by_id(colocated, "generated_tokens")
    assert piped.counters["num_preemptions"] == colocated.counters["num_preemptions"] == 0


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=400, max_output=120, all_at_zero=False),
       schedulers(),
       st.integers(2, 3), st.integers(1, 5), st.sampled_from([0.0, 0.5, 0.8, 1.0]),
       st.sampled_from(["ngram", "eagle", "draft_model"]), st.integers(0, 20), st.integers(0, 3))
def test_speculating_roofline_pipelines_match_the_reference(requests, cfg, stages, k, alpha, method, spare, seed):
    """Llama-3.1-8B's layers over 2-3 stages on the roofline, which asks for the longest and
    shortest decode context (drafts included), with a roofline draft model, an EAGLE-style
    linear head or n-gram proposing: costs are not binary fractions, so the engines agree to
    rounding."""
    from schedlab.parallelism import Parallelism
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
    from test_data_parallel_speculative import DRAFTER as LINEAR_HEAD
    from test_data_parallel_speculative import small_drafter
    from test_pipeline_parallel import _presets

    presets = _presets()
    spec = SpeculativeConfig(method=method, num_speculative_tokens=k, acceptance_rate=alpha, proposer_ms=0.125,
                             draft=None if method == "ngram" else {"kind": "roofline"})
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    blocks = blocks_with_drafts(requests, spec, 16) + spare
    drafter = {"ngram": None, "eagle": LinearCostModel(LINEAR_HEAD), "draft_model": small_drafter()}[method]

    def make():
        config = RooflineConfig(model="llama-3.1-8b", gpu="rtx-pro-6000-server")
        cost = RooflineCostModel(presets.model("llama-3.1-8b"), presets.gpu("rtx-pro-6000-server"), config,
                                 parallelism=Parallelism(pipeline_parallel=stages))
        return ContinuousScheduler(cfg), cost, PagedKVCache(blocks, 16, swap_blocks=64, bytes_per_block=2 ** 20,
                                                             host_link_gbps=2 ** 10 / 1e3)

    runs = [run_pipelined(requests, make, stages, engine=engine, speculative=spec, draft_cost=drafter, seed=seed)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    check_run(runs[0], requests, kv_blocks=blocks)


# -- TOML ---------------------------------------------------------------------------------------------------

PIPELINED = """
    [cluster]
    pipeline_parallel = 2
"""


def write(tmp_path, *parts: str):
    path = tmp_path / "exp.toml"
    path.write_text("".join(textwrap.dedent(p) for p in (BASE, *parts)))
    return path


def test_speculation_on_a_pipelined_deployment_in_toml_runs_in_both_engines(tmp_path):
    """PP 2 with an EAGLE-style drafter: both engines alike; decodes yield more than one token a
    step, so the same requests take fewer decode steps than without speculation."""
    fast = fast_run_agreeing_with_reference(write(tmp_path, PIPELINED, SPECULATIVE))
    assert fast.metrics["gpus"] == 2 and fast.metrics["finished"] == 40
    s = fast.metrics["speculative"]
    assert s["drafts"] > 0 and 0.0 < s["acceptance_rate"] < 1.0 and s["mean_acceptance_length"] > 1.0
    (tmp_path / "plain").mkdir()
    without = run_experiment(load(write(tmp_path / "plain", PIPELINED))).all_runs()[0]
    assert fast.counters["generated_tokens"] == without.counters["generated_tokens"]
    assert fast.counters["decode_seq_steps"] < without.counters["decode_seq_steps"]


def test_the_reference_pipeline_takes_no_landing_while_a_launch_is_due():
    """The rule the case above once broke, pinned on its own: after a landing the reference
    pipeline launches again before it takes the next batch's output, even one that completed at
    the same time (a batch of swaps only lands with the batch before it)."""
    from schedlab.engine.recorder import Recorder
    from schedlab.engine.reference import ReferenceEngine
    from schedlab.engine.reference_pipeline import ReferencePipeline

    cost = LinearParallelCost(LinearCostModel(LinearConfig()))
    engine = ReferenceEngine(ContinuousScheduler(ContinuousConfig()), cost, PagedKVCache(8, 16), Recorder())
    pipe = ReferencePipeline(engine, 2)
    pipe.flights = [[None, [], [], 0.0, 5.0, 1, None], [None, [], [], 0.0, 5.0, 1, None]]
    pipe.launch_due = True
    assert pipe.next_landing() == float("inf")
    assert pipe.next_plan_time() == engine.now
    pipe.launch_due = False
    assert pipe.next_landing() == 5.0
    assert pipe.next_plan_time() == float("inf")
