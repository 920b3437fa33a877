"""Speculative decoding: the fast engine against the reference engine, and the conformance kit.

Every decode step draws how many drafts each sequence keeps, so these runs exercise the fast
engine's re-anchoring of sequences that run ahead of its decode clock, the release of
rejected drafts' KV slots, drafts cut short by the token budget, reservations that include
the drafts' slots, preemption and swap of sequences holding speculative slots, prefix caches,
and plans made ahead while the drafts in flight are unverified (asynchronous scheduling).
Costs are dyadic (see ``test_differential``), so the comparison is exact.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedlab.model import Request
from schedlab.speculative import SpeculativeConfig
from schedlab.testing import (IterationChecker, check_run, compare_runs, dyadic_linear_costs, examples,
                              requests_lists, run_engine)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixKVCache
from schedlab_plugins.schedulers import (ContinuousConfig, ContinuousScheduler, SglangConfig, SglangScheduler,
                                         StaticConfig, StaticScheduler)

SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def speculative_configs(draw, by_position: bool = False):
    """``by_position``: sometimes acceptance by draft position (vLLM's per-position rates) instead
    of one rate (other files' checks read ``acceptance_rate``: off there)."""
    method = draw(st.sampled_from(["ngram", "eagle", "draft_model"]))
    k = draw(st.integers(1, 5))
    rate = draw(st.sampled_from([0.0, 0.5, 0.8, 1.0]))
    shares = draw(st.sampled_from([(), (0.9, 0.7, 0.5, 0.3, 0.1), (1.0, 0.5, 0.5, 0.0, 0.0)]))[:k] \
        if by_position else ()
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=k,
        acceptance_rate=rate if not shares else 0.7,  # (the default: by position, a rate is refused)
        acceptance_by_position=shares,
        # per-request rates from a Beta distribution (defined strictly inside (0, 1) only)
        acceptance_sd=draw(st.sampled_from([0.0, 0.2])) if 0.0 < rate < 1.0 and not shares else 0.0,
        k_by_batch_size=draw(st.sampled_from([(), ((1, 2, k), (3, 4, 1), (6, 9, 0))])),
        draft=None if method == "ngram" else {"kind": "linear"},
        proposer_ms=draw(st.sampled_from([0.0, 0.25])),
    )


@st.composite
def spec_setups(draw, starve: bool = True):
    """``starve``: budgets may leave a decode without any token (below (max_num_seqs - 1) x
    (1 + k) + 1), as vLLM allows; a request admitted then may be preempted again before it
    ever decodes, which the kit's loop check would flag."""
    requests = draw(requests_lists(min_size=2, max_size=10, max_prompt=40, max_output=60, priorities=True,
                                   prefix_groups=2))
    spec = draw(speculative_configs(by_position=True))
    k = spec.num_speculative_tokens
    kind = draw(st.sampled_from(["static", "sglang", "continuous", "continuous", "continuous"]))
    block_size = draw(st.integers(1, 6))
    if kind == "static":
        batch = draw(st.integers(1, 4))
        make = lambda: StaticScheduler(StaticConfig(batch_size=batch))  # noqa: E731
    elif kind == "sglang":
        chunk = -(-draw(st.sampled_from([0, 16])) // block_size) * block_size  # (whole pages, as SGLang's)
        sg = SglangConfig(max_running_requests=draw(st.integers(1, 6)), chunked_prefill_size=chunk,
                          enable_mixed_chunk=bool(chunk) and draw(st.booleans()))
        make = lambda: SglangScheduler(sg)  # noqa: E731
    else:
        max_seqs = draw(st.integers(2, 6))
        allocation = draw(st.sampled_from(["reserve", "grow", "grow"]))
        least = max_seqs if starve else (max_seqs - 1) * (1 + k) + 1
        preemption = draw(st.sampled_from(["recompute", "swap"])) if allocation == "grow" else "recompute"
        cfg = ContinuousConfig(
            max_num_seqs=max_seqs,
            # budgets below max_num_seqs x (1 + k) cut some decodes' drafts short; above the
            # drafter's lookahead, as vLLM (and schedlab's assembly) require, and with room for a
            # one-token admission padded to 1 + k rows (and a draft model's input slot): vLLM
            # schedules nothing in its place, so a lone such request would wait for ever
            max_num_batched_tokens=draw(st.integers(max(least, spec.lookahead + 1, 1 + k + spec.draft_input_slots),
                                                    max_seqs * (1 + k) + 8)),
            # (a draft model's input slot needs chunked prefill: schedlab's assembly refuses it without)
            chunked_prefill=True if allocation == "grow" or spec.draft_input_slots else draw(st.booleans()),
            long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5])),
            allocation=allocation,
            preemption=preemption,
            prefill_first=draw(st.booleans()),
            running_order=draw(st.sampled_from(["admission", "admission", "decodes_first"])),
            policy=draw(st.sampled_from(["fcfs", "priority"])),
            # each batch planned while the one before it runs, its drafts unverified (engine.ahead)
            async_scheduling=preemption == "recompute" and draw(st.booleans()),
        )
        make = lambda: ContinuousScheduler(cfg)  # noqa: E731
    cost = draw(dyadic_linear_costs())
    draft = LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=draw(st.sampled_from([0.5, 1.0])))
    # A cache just big enough for the largest request with its speculative slots, or a bit
    # more: preemptions and swaps are common, rejections rare.
    slack = k + spec.lookahead
    need = max(-(-(r.prompt_tokens + r.max_output_tokens + slack) // block_size) for r in requests)
    num_blocks = need + draw(st.sampled_from([0, 2, 8, 40]))
    prefix = draw(st.sampled_from(["none", "paged", "radix"]))
    seed = draw(st.integers(0, 3))
    return requests, make, cost, draft, spec, block_size, num_blocks, prefix, seed


def _run(setup, engine, check=None):
    requests, make, cost, draft, spec, block_size, num_blocks, prefix, seed = setup
    if prefix == "radix":  # SGLang's radix tree (no swap space)
        kv = RadixKVCache(num_blocks, block_size)
    else:
        kind = PrefixKVCache if prefix == "paged" else PagedKVCache
        kv = kind(num_blocks, block_size, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
    return run_engine(requests, make(), LinearCostModel(cost), kv, engine=engine, check=check, speculative=spec,
                      draft_cost=LinearCostModel(draft) if spec.draft is not None else None, seed=seed)


#: Planned ahead after a prefill-first step (which decoded nobody): the fast engine took request 4,
#: decoding but not in that step, for one whose token was in flight, so EAGLE's block hashes
#: (which need the next token) cached one token less of it when it was preempted than the
#: reference engine did.
_PREFILL_FIRST_CFG = ContinuousConfig(max_num_seqs=2, max_num_batched_tokens=2, chunked_prefill=True,
                                      allocation="grow", preemption="recompute", prefill_first=True,
                                      async_scheduling=True)
AFTER_A_PREFILL_FIRST_STEP = (
    [Request(i, 0.0, prompt, output) for i, (prompt, output) in enumerate(
        [(1, 1), (1, 1), (1, 1), (5, 1), (2, 2), (1, 1), (1, 6)])],
    lambda: ContinuousScheduler(_PREFILL_FIRST_CFG), LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=4.0),
    LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=0.5),
    SpeculativeConfig(method="eagle", num_speculative_tokens=1, acceptance_rate=0.0, draft={"kind": "linear"}),
    2, 5, "paged", 0)


@SETTINGS
@given(spec_setups())
@example(AFTER_A_PREFILL_FIRST_STEP)
def test_speculative_fast_engine_matches_reference(setup):
    fast = _run(setup, "fast")
    ref = _run(setup, "reference")
    compare_runs(fast, ref, rel=1e-12)
    check_run(fast, setup[0], kv_blocks=setup[6])


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_setups())
def test_speculative_steps_keep_the_kit_rules(setup):
    """Every step: drafts within k per decode and within the budget, tokens within 1 + accepted,
    the KV cache holding what the sequences hold; the observed run equals the reference run.
    (Not the loop check: with lookahead slots on these tight caches vLLM's rules themselves
    preempt a chunked recompute again and again while a decode grows -- IterationChecker's doc.)"""
    check = IterationChecker(kv_blocks=setup[6], loops=False)
    observed = _run(setup, "fast", check)
    compare_runs(observed, _run(setup, "reference"), rel=1e-12)
    assert check.iterations == observed.metrics["iterations"]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(max_size=8, max_prompt=300, max_output=200, all_at_zero=False), st.integers(1, 6),
       st.integers(1, 5), st.sampled_from([0.5, 0.9]), st.integers(6, 48), st.integers(40, 400), st.booleans())
def test_speculative_roofline_runs_match_reference(requests, max_seqs, k, alpha, budget, blocks, ahead):
    """A roofline target and a roofline draft model: costs are not dyadic, so the engines agree
    to rounding; budgets down to one decode cut drafts short; planning ahead, decodes of finished
    requests the drafts in flight ended share steps with those still decoding (the attention
    sees every context, theirs too)."""
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel

    presets = Presets.from_catalog(load_catalog(entry_points=False))

    def roofline(model):
        return RooflineCostModel(presets.model(model), presets.gpu("a100-80gb"), RooflineConfig(model=model, gpu="a100-80gb"))

    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=k, acceptance_rate=alpha,
                             draft={"kind": "roofline"})
    cfg = ContinuousConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs, k + 1),
                           allocation="grow", chunked_prefill=True, async_scheduling=ahead)
    runs = [run_engine(requests, ContinuousScheduler(cfg), roofline("llama-3-8b"), PagedKVCache(blocks, 16),
                       engine=engine, speculative=spec, draft_cost=roofline("llama-3.2-1b"), seed=1)
            for engine in ("fast", "reference")]
    compare_runs(*runs, rel=1e-9)
