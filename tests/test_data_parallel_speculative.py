"""Speculative decoding on data-parallel ranks: hand-computed lockstep steps, the fast engine
against the reference engine (lockstep MoE ranks, with power meters too, and a dense model's
independent ranks), the acceptance draws a colocated run makes, and the TOML that declares it
(a dense model's ranks in TOML: ``test_data_parallel.py``; metered MoE ranks in TOML:
``test_data_parallel_energy.py``).

Hand-computed cases use :class:`LinearParallelCost` as in ``test_data_parallel.py``: a rank's
part is the ``linear`` model's iteration (0.5 ms per prompt or draft token, 8 ms a decode step),
the experts cost 1 ms + 0.0625 ms per token of all ranks + 0.125 ms per token of the largest
rank, and a rank with nothing to do runs a dummy batch (one decode, 8 ms).
"""

from __future__ import annotations

import textwrap

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.parallelism import Parallelism
from schedlab.speculative import SpeculativeConfig, budget_problem
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import (check_run, compare_runs, dyadic_linear_costs, examples,
                              fast_run_agreeing_with_reference, requests_lists, run_cluster, run_engine)
from schedlab.testing.parallel import LinearParallelCost, ParallelPrices, run_data_parallel
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.routers import RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from test_data_parallel import BASE, ROUTERS, SPECULATIVE, fresh_router, schedulers
from test_data_parallel_energy import PRESETS, metered_runs_agreeing, utilisation
from test_speculative_differential import speculative_configs

ENGINES = ("fast", "reference")
SETTINGS = settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: the drafter of the random cases: a linear model in binary fractions, so the engines agree exactly
DRAFTER = LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=0.5)
#: the drafter's work on one GPU (power models and the clock count it): a small model's prices
DRAFTER_WORK = ParallelPrices(rank_bytes=2.5e8, bytes_per_token=1e7, bytes_per_context_token=1e6,
                              flops_per_token=2.5e9)


def rank(blocks: int = 64, block_size: int = 4):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                         allocation="grow", chunked_prefill=True))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)))
        return scheduler, cost, PagedKVCache(blocks, block_size)
    return make


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


# -- hand-computed steps -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_ngram_drafts_all_accepted_on_two_ranks_by_hand(engine):
    # n-gram, k = 2, every draft accepted, 1 ms of proposing a step on a rank that drafts.
    # Request 0 (prompt 4, 7 tokens) on rank 0, request 1 (prompt 8, 2 tokens) on rank 1.
    # Step 1: prompts. Rank 0: 4 x 0.5 + 1 = 3; rank 1: 8 x 0.5 + 1 = 5; experts of (4, 8):
    #         1 + 0.0625 x 12 + 0.125 x 8 = 2.75 -> 7.75: both first tokens.
    # Step 2: each rank verifies 1 + 2 tokens: 8 + 2 x 0.5 + 1 = 10; experts of (3, 3):
    #         1 + 0.375 + 0.375 = 1.75 -> 19.5. Request 0 keeps 3 tokens (4 in all); request 1
    #         needed 1 more (its 2 accepted drafts count as accepted) and finishes at 19.5.
    # Step 3: rank 0 verifies again (10), rank 1 runs the dummy (8, n-gram: no drafter, nothing
    #         proposed); experts of (3, 1): 1 + 0.25 + 0.375 = 1.625 -> 31.125: request 0 has 7.
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2, acceptance_rate=1.0, proposer_ms=1.0)
    r = run_data_parallel([Request(0, 0.0, 4, 7), Request(1, 0.0, 8, 2)], rank(), 2, RoundRobinRouter(),
                          engine=engine, speculative=spec)
    assert by_id(r, "instance") == {0: 0, 1: 1}
    assert by_id(r, "first_token_ms") == {0: 7.75, 1: 7.75}
    assert by_id(r, "finish_ms") == {0: 31.125, 1: 19.5}
    assert r.meta["data_parallel"] == {"ranks": 2, "steps": 3, "dummy_rank_steps": 1, "experts_ms": 6.125}
    c = r.counters
    assert (c["spec_drafts"], c["spec_draft_tokens"], c["spec_accepted_tokens"], c["decode_tokens"]) == (3, 6, 6, 7)
    # KV, blocks of 4: rank 0's request takes slots for 4 + 3 (2 blocks), then 7 + 3 (3 blocks);
    # rank 1's for 8 + 3 (3 blocks)
    assert c["kv_peak_blocks"] == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_an_eagle_drafter_on_a_working_rank_and_its_dummy_run_beside_it_by_hand(engine):
    # EAGLE-style drafter, k = 2, every draft rejected; the drafter's own linear cost: 0.25 ms a
    # token, 1 ms a decode step. One request (prompt 4, 3 tokens) on rank 0; rank 1 has nothing
    # and runs the dummy batch with the drafter's dummy run: k = 2 passes over its one token
    # (1 ms each) -> 8 + 2 = 10 ms every step.
    # Step 1: rank 0's prompt: target 4 x 0.5 = 2; drafter: its pass over the 4 tokens (1) and
    #         one one-token pass (1) -> 4; the dummy's 10 is the slower. Experts of (4, 1):
    #         1 + 0.0625 x 5 + 0.125 x 4 = 1.8125 -> first token at 11.8125.
    # Steps 2, 3: rank 0 verifies 1 + 2 tokens: target 8 + 2 x 0.5 = 9; drafter: its pass over
    #         them (2 x 0.25 + 1 = 1.5) and a one-token pass (1) -> 11.5; experts of (3, 1):
    #         1.625 -> 13.125 a step, one token each: 24.9375, 38.0625.
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=2, acceptance_rate=0.0, draft={"kind": "linear"})
    drafter = LinearCostModel(LinearConfig(prefill_ms_per_token=0.25, decode_ms_per_step=1.0))
    r = run_data_parallel([Request(0, 0.0, 4, 3)], rank(), 2, RoundRobinRouter(), engine=engine, speculative=spec,
                          draft_cost=drafter)
    assert by_id(r, "first_token_ms") == {0: 11.8125}
    assert by_id(r, "finish_ms") == {0: 38.0625}
    assert r.meta["data_parallel"] == {"ranks": 2, "steps": 3, "dummy_rank_steps": 3, "experts_ms": 5.0625}
    c = r.counters
    assert (c["spec_drafts"], c["spec_draft_tokens"], c["spec_accepted_tokens"], c["decode_tokens"]) == (2, 4, 0, 2)
    # KV, blocks of 4: each decode step takes slots for its computed tokens + 1 + 2 drafts + 2
    # lookahead: 4 + 5 = 9 (3 blocks), then 5 + 5 = 10 (still 3: the rejected drafts' blocks kept)
    assert c["kv_peak_blocks"] == 3


# -- the fast engine against the reference engine; the rules of every run ---------------------------------


def blocks_with_drafts(requests, spec: SpeculativeConfig, block_size: int) -> int:
    """KV blocks the largest request needs alone with a last step's drafts and lookahead slots."""
    slack = spec.num_speculative_tokens + spec.lookahead
    return max(-(-(r.prompt_tokens + r.max_output_tokens + slack) // block_size) for r in requests)


def drafter_of(spec: SpeculativeConfig):
    """The linear drafter, saying its passes' work at :data:`DRAFTER_WORK` (a dense model)."""
    return LinearParallelCost(LinearCostModel(DRAFTER), DRAFTER_WORK, moe=False) if spec.draft is not None else None


@SETTINGS
@given(requests_lists(min_size=1, max_size=12, max_prompt=60, max_output=60, all_at_zero=False, priorities=True,
                      prefix_groups=2),
       schedulers(), speculative_configs(), st.integers(1, 3), st.sampled_from(sorted(ROUTERS)),
       dyadic_linear_costs(), st.integers(0, 40), st.integers(1, 8), st.booleans(), st.integers(0, 3), st.booleans())
def test_speculating_lockstep_ranks_agree_between_engines_and_keep_the_rules(requests, cfg, spec, ranks, router, cost,
                                                                            spare, block_size, prefix, seed, ahead):
    """Random arrivals, budgets that cut drafts short, swaps and recompute preemptions of
    sequences holding speculative slots, idle ranks running the dummy (and the drafter's dummy
    run), k by batch size, per-request acceptance rates, ranks planning ahead while their drafts
    are unverified: both engines alike, every request served once with its tokens, within the
    slots and each rank's cache."""
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    if ahead and cfg.preemption == "recompute":
        cfg = attrs.evolve(cfg, async_scheduling=True)
    blocks = blocks_with_drafts(requests, spec, block_size) + spare

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, block_size, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), kv

    runs = [run_data_parallel(requests, make, ranks, ROUTERS[router]() if ranks > 1 else None, engine=engine,
                              speculative=spec, draft_cost=drafter_of(spec), seed=seed) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].meta["data_parallel"] == runs[1].meta["data_parallel"]
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * ranks, kv_blocks=blocks)
    c = runs[0].counters
    if c["decode_seq_steps"] and spec.acceptance_rate == 1.0 and not spec.k_by_batch_size:
        assert c["spec_accepted_tokens"] == c["spec_draft_tokens"] > 0


@SETTINGS
@given(requests_lists(min_size=1, max_size=12, max_prompt=60, max_output=60, all_at_zero=False, priorities=True),
       schedulers(), speculative_configs(), st.integers(1, 3), st.sampled_from(sorted(ROUTERS)),
       dyadic_linear_costs(), st.integers(0, 40), st.integers(0, 3))
def test_a_dense_models_speculating_ranks_agree_between_engines_and_keep_the_rules(requests, cfg, spec, ranks, router,
                                                                                  cost, spare, seed):
    """A dense model's data-parallel ranks are independent instances behind the balancer (as
    the run assembles them), each drafting and verifying its own sequences."""
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    blocks = blocks_with_drafts(requests, spec, 4) + spare

    def make():
        return (ContinuousScheduler(cfg), LinearCostModel(cost),
                PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3))

    runs = [run_cluster(requests, make, ranks, ROUTERS[router]() if ranks > 1 else None, engine=engine,
                        speculative=spec, draft_cost=drafter_of(spec), seed=seed) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * ranks, kv_blocks=blocks)


def qwen(ranks: int) -> RooflineCostModel:
    config = RooflineConfig(model="qwen3-30b-a3b", gpu="rtx-pro-6000-server")
    return RooflineCostModel(PRESETS.model("qwen3-30b-a3b"), PRESETS.gpu("rtx-pro-6000-server"), config,
                             parallelism=Parallelism(data_parallel=ranks, expert_parallel=True))


def small_drafter() -> RooflineCostModel:
    config = RooflineConfig(model="llama-3.2-1b", gpu="rtx-pro-6000-server")
    return RooflineCostModel(PRESETS.model("llama-3.2-1b"), PRESETS.gpu("rtx-pro-6000-server"), config)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=400, max_output=200, all_at_zero=False), schedulers(),
       st.integers(2, 3), st.integers(1, 5), st.sampled_from([0.0, 0.5, 0.8, 1.0]),
       st.sampled_from(["ngram", "eagle", "draft_model"]), st.integers(0, 20), st.integers(0, 3))
def test_speculating_roofline_lockstep_ranks_match_the_reference(requests, cfg, ranks, k, alpha, method, spare, seed):
    """Qwen3-30B-A3B's ranks on the roofline (rank parts with padded verify attention, experts
    of every rank's tokens, drafts included) with a roofline draft model, an EAGLE-style linear
    head or n-gram proposing: costs are not binary fractions, so the engines agree to rounding."""
    spec = SpeculativeConfig(method=method, num_speculative_tokens=k, acceptance_rate=alpha, proposer_ms=0.125,
                             draft=None if method == "ngram" else {"kind": "roofline"})
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    blocks = blocks_with_drafts(requests, spec, 16) + spare
    drafter = {"ngram": None, "eagle": LinearCostModel(DRAFTER), "draft_model": small_drafter()}[method]

    def make():
        return ContinuousScheduler(cfg), qwen(ranks), PagedKVCache(blocks, 16, swap_blocks=64, bytes_per_block=2 ** 20,
                                                                    host_link_gbps=2 ** 10 / 1e3)

    runs = [run_data_parallel(requests, make, ranks, fresh_router(), engine=engine, speculative=spec,
                              draft_cost=drafter, seed=seed) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    check_run(runs[0], requests, kv_blocks=blocks)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=60, max_output=80, all_at_zero=False),
       st.integers(2, 3), st.integers(1, 4), st.sampled_from([0.5, 0.8]), st.sampled_from([0.0, 0.2]),
       st.integers(0, 3))
def test_each_sequences_acceptance_is_drawn_as_a_colocated_instance_draws_it(requests, ranks, k, alpha, sd, seed):
    """With k drafts every step (no budget cuts, no preemption, no schedule by batch size) a
    request's accepted drafts depend on its draws alone: lockstep ranks verify, accept and
    generate what one colocated instance serving every request does, whichever rank a request is
    on, and the same seed gives the same run."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k, acceptance_rate=alpha, acceptance_sd=sd)
    config = ContinuousConfig(max_num_seqs=16, max_num_batched_tokens=4096, allocation="grow")
    blocks = 16 * blocks_with_drafts(requests, spec, 4)

    def make():
        scheduler = ContinuousScheduler(config)
        return scheduler, LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5))), \
            PagedKVCache(blocks, 4)

    ranked = [run_data_parallel(requests, make, ranks, fresh_router(), speculative=spec, seed=seed)
              for _ in range(2)]
    colocated = run_engine(requests, ContinuousScheduler(config), kv=PagedKVCache(blocks, 4), speculative=spec,
                           seed=seed)
    compare_runs(*ranked, rel=0.0)
    counted = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "decode_tokens", "decode_seq_steps")

    def verified(counters):  # (an admission's placeholder drafts depend on what it was admitted beside)
        return {**{n: counters[n] for n in counted}, "spec_drafts": counters["spec_drafts"] - counters[
            "spec_padded_drafts"], "spec_draft_tokens": counters["spec_draft_tokens"] - counters["spec_padded_tokens"]}
    assert verified(ranked[0].counters) == verified(colocated.counters)
    assert ranked[0].counters["num_preemptions"] == colocated.counters["num_preemptions"] == 0


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=60, max_output=60, all_at_zero=False), schedulers(),
       speculative_configs(), st.integers(2, 3), dyadic_linear_costs(), st.integers(0, 30), st.integers(0, 3))
def test_speculating_lockstep_ranks_are_metered_alike_and_conserve_energy(requests, cfg, spec, ranks, cost, spare,
                                                                         seed):
    """``[power]``: each rank's verify passes and dummy steps metered as without speculation;
    both engines draw the same energy per rank, and each run's is its power's integral."""
    assume(budget_problem(cfg, spec) is None)  # (schedlab and vLLM refuse it)
    blocks = blocks_with_drafts(requests, spec, 4) + spare

    def make():
        kv = PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), kv

    runs = metered_runs_agreeing(requests, make, ranks, fresh_router, utilisation(), speculative=spec,
                                 draft_cost=drafter_of(spec), seed=seed)
    check_run(runs[0], requests, kv_blocks=blocks)


# -- TOML ---------------------------------------------------------------------------------------------------


def write(tmp_path, text: str):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + textwrap.dedent(SPECULATIVE) + textwrap.dedent(text))
    return path


def test_speculation_on_a_data_parallel_moe_deployment_in_toml_runs_in_both_engines(tmp_path):
    """DP 2 + EP with an EAGLE-style drafter: both engines alike; each step yields more than one
    token a decode, so the ranks step fewer times than without speculation."""
    layout = """
        [cluster]
        data_parallel = 2
        expert_parallel = true
    """
    fast = fast_run_agreeing_with_reference(write(tmp_path, layout))
    assert fast.meta["instances"] == 2 and fast.metrics["gpus"] == 2
    assert set(fast.requests["instance"].tolist()) == {0, 1}
    assert fast.metrics["finished"] == 40
    s = fast.metrics["speculative"]
    assert s["drafts"] > 0 and 0.0 < s["acceptance_rate"] < 1.0 and s["mean_acceptance_length"] > 1.0
    (tmp_path / "plain").mkdir()
    plain = tmp_path / "plain" / "exp.toml"
    plain.write_text(textwrap.dedent(BASE) + textwrap.dedent(layout) + '[[runs]]\nname = "plain"\n')
    without = run_experiment(load(plain)).all_runs()[0]
    assert fast.meta["data_parallel"]["steps"] < without.meta["data_parallel"]["steps"]


@pytest.mark.parametrize("layout", ["[cluster]\ndata_parallel = 2\nexpert_parallel = true\n",
                                    "[cluster]\ndata_parallel = 2\n"])
def test_drafts_per_batch_size_with_data_parallelism_are_refused_as_vllm_turns_them_off(tmp_path, layout):
    """vLLM 0.33 turns ``num_speculative_tokens_per_batch_size`` off with data parallelism (ranks
    choosing different k would diverge); a run refuses it by name instead of drafting differently."""
    path = write(tmp_path, layout)
    path.write_text(path.read_text().replace("acceptance_rate = 0.7\n",
                                             "acceptance_rate = 0.7\nk_by_batch_size = [[1, 4, 3], [5, 256, 1]]\n"))
    with pytest.raises(ConfigError, match=r"\[speculative\]: k_by_batch_size: vLLM 0.33 turns drafts per batch size "
                                          r"off with data parallelism"):
        load(path)
    path.write_text(path.read_text().replace("data_parallel = 2", "pipeline_parallel = 2")
                    .replace("expert_parallel = true\n", ""))
    assert load(path).studies  # (on one rank, or a pipeline, drafts per batch size are fine)


def test_what_speculation_does_not_model_is_refused_by_table(tmp_path):
    """With or without data parallelism, a clock or the utilisation power model
    when the drafter's cost model does not say its passes' work (clocks and power with a drafter
    that does: ``test_speculative_energy.py``)."""
    unsaid = r"the drafter's cost model LinearCostModel does not say the bytes and FLOPs of its passes"
    lockstep = '[cluster]\ndata_parallel = 2\nexpert_parallel = true\n'
    for extra, message in (('[clock]\nmhz = 1500\ngpu = "h100-80gb"\n' + lockstep, unsaid),
                           ('[power]\nkind = "utilisation"\n' + lockstep, unsaid),
                           ('[clock]\nmhz = 1500\ngpu = "h100-80gb"\n', unsaid)):
        path = write(tmp_path, extra)
        path.write_text(path.read_text().replace('draft = {kind = "roofline", model = "llama-3.2-1b", '
                                                 'gpu = "rtx-pro-6000-server"}', 'draft = {kind = "linear"}'))
        with pytest.raises(ConfigError, match=message):
            load(path)
