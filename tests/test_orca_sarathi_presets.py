"""The ``orca`` and ``static`` reservations and the ``sarathi`` preset, against microsoft/sarathi-serve's
reference schedulers (``sarathi/core/scheduler``, ``core/block_space_manager``, ``config/config.py``).

* A reservation never reads a request's true output unless nothing else is known: a request with
  ``max_tokens`` reserves ``prompt + max_tokens`` (the Orca paper), one without the rest of
  ``max_model_len`` (the run's model's context, reduced to what the cache holds); only with no
  model and no ``max_model_len`` its own output (an oracle, kept for runs that name no model).
  ``reserve_max_model_len``: all of ``max_model_len`` for every request, as Sarathi-Serve's Orca
  and FasterTransformer baselines (``ceil(max_model_len / block_size)`` blocks each).
* Orca has no token budget (``OrcaSchedulerConfig``: ``max_num_seqs x max_model_len``): no
  prompt the cache holds is split or rejected for it.
* ``sarathi``: Sarathi-Serve's defaults and its decodes-first, chunk-the-last-prompt schedule.

The cost model is the kit's linear one: 0.05 ms per prompt token, 8 ms per iteration that decodes.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedlab.catalog import load_catalog
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.study.experiment import load
from schedlab.study.simulation import assemble
from schedlab.testing import IterationChecker, check_run, kit_settings, requests_lists, run_engine
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.schedulers import ContinuousScheduler, StaticConfig, StaticScheduler
from schedlab_plugins.schedulers.presets import OrcaConfig, SarathiConfig
from test_engine_defaults import run_text

MODEL_512 = SimpleNamespace(max_position_embeddings=512)


def four_requests(max_tokens=None):
    """The review's scenario s1: four requests at t = 0, prompt 100, output 50."""
    return [Request(i, 0.0, 100, 50, max_tokens=max_tokens) for i in range(4)]


def run_s1(scheduler, max_tokens=None):
    """s1 on a paged cache of 64 blocks x 16 tokens (1,024 tokens)."""
    return run_engine(four_requests(max_tokens), scheduler, kv=PagedKVCache(64, 16))


def ttfts(result) -> list[float]:
    return sorted(float(t) for t in result.requests["first_token_ms"] - result.requests["arrival_ms"])


# Two at a time: each reserves 512 tokens = 32 blocks of the 64. The first pair's prefill (200 tokens)
# takes 10 ms and yields its first tokens, 49 decodes (8 ms each) finish it at 402 ms; the second
# pair is admitted then, first tokens at 412 ms, done at 804 ms: 100 iterations.
TWO_AT_A_TIME = {"iterations": 100, "ttft": [10.0, 10.0, 412.0, 412.0], "makespan_ms": 804.0}
# All four at once: each reserves 150 tokens = 10 blocks. One prefill of 400 tokens (20 ms), then 49
# decodes: done at 412 ms, 50 iterations.
ALL_AT_ONCE = {"iterations": 50, "ttft": [20.0] * 4, "makespan_ms": 412.0}


def assert_schedule(result, expected):
    assert result.metrics["finished"] == 4
    assert result.metrics["iterations"] == expected["iterations"]
    assert ttfts(result) == pytest.approx(expected["ttft"])
    assert result.metrics["makespan_ms"] == pytest.approx(expected["makespan_ms"])
    assert result.metrics["num_preemptions"] == 0


# -- orca ----------------------------------------------------------------------------------------------------

def test_orca_without_max_tokens_reserves_the_models_context_not_the_true_output():
    # the model's context of 512 (max_model_len = "auto" with model_context, as run_defaults sets it)
    config = OrcaConfig(max_model_len="auto", model_context=512)
    assert config.default_max_tokens == "auto"
    assert_schedule(run_s1(ContinuousScheduler(config)), TWO_AT_A_TIME)
    # a max_model_len given as a number: the same
    assert_schedule(run_s1(ContinuousScheduler(OrcaConfig(max_model_len=512))), TWO_AT_A_TIME)


def test_orca_with_max_tokens_reserves_prompt_plus_max_tokens():
    assert_schedule(run_s1(ContinuousScheduler(OrcaConfig(max_model_len=512)), max_tokens=50), ALL_AT_ONCE)


def test_orca_with_no_model_and_no_max_model_len_reserves_the_own_output_as_before():
    assert_schedule(run_s1(ContinuousScheduler(OrcaConfig())), ALL_AT_ONCE)
    # and the oracle can be asked for by name with a max_model_len
    assert_schedule(run_s1(ContinuousScheduler(OrcaConfig(max_model_len=512, default_max_tokens="output"))),
                    ALL_AT_ONCE)


def test_reserve_max_model_len_is_sarathi_serves_orca_baseline_even_with_max_tokens():
    config = OrcaConfig(max_model_len=512, reserve_max_model_len=True)
    assert_schedule(run_s1(ContinuousScheduler(config), max_tokens=50), TWO_AT_A_TIME)
    with pytest.raises(ConfigError, match="reserve_max_model_len needs a max_model_len"):
        OrcaConfig(reserve_max_model_len=True)


def test_orca_run_defaults_take_the_models_context_and_size_the_budget_from_it():
    assert OrcaConfig.run_defaults(None, MODEL_512, {}) == {
        "max_model_len": "auto", "model_context": 512, "max_num_batched_tokens": 256 * 512}
    assert OrcaConfig.run_defaults(None, MODEL_512, {"max_num_seqs": 8}) == {
        "max_model_len": "auto", "model_context": 512, "max_num_batched_tokens": 8 * 512}
    assert OrcaConfig.run_defaults(None, MODEL_512, {"max_model_len": 300}) == {"max_num_batched_tokens": 256 * 300}
    assert OrcaConfig.run_defaults(None, None, {"max_model_len": 300, "max_num_batched_tokens": 4096}) == {}
    assert OrcaConfig.run_defaults(None, None, {}) == {}
    assert OrcaConfig().max_num_batched_tokens == 2**53  # no model, no max_model_len: a budget that never binds


def test_orca_in_a_run_on_a_named_model(tmp_path):
    """llama-3-8b (context 8,192) on an H100: the run's scheduler reserves the rest of 8,192 tokens
    for a request without max_tokens, and its budget is 256 x 8,192."""
    scheduler, _, kv = _assembled(tmp_path, "orca")
    assert scheduler.config.max_model_len == "auto" and scheduler.config.model_context == 8192
    assert scheduler.config.max_num_batched_tokens == 256 * 8192
    assert scheduler.kv_reservation(Request(0, 0.0, 100, 10)) == 8192
    assert scheduler.kv_reservation(Request(1, 0.0, 100, 10, max_tokens=20)) == 120
    assert not kv.prefix_caching


def test_orca_admits_a_70000_token_prompt_and_prefills_three_long_prompts_together():
    """The review's scenario s5: 16,384 blocks x 16; prompts of 70,000, 40,000 and 40,000 at t = 0.
    Sarathi-Serve's Orca admits all three in one iteration (no token budget); before, the 70,000-token
    prompt was rejected (over 65,536) and the 40,000s prefilled in iterations of their own."""
    requests = [Request(0, 0.0, 70_000, 10), Request(1, 0.0, 40_000, 10), Request(2, 0.0, 40_000, 10)]
    result = run_engine(requests, ContinuousScheduler(OrcaConfig()), kv=PagedKVCache(16_384, 16))
    assert result.metrics["finished"] == 3 and not result.rejections
    # one iteration prefills all 150,000 tokens (7,500 ms), then 9 decodes
    assert result.metrics["iterations"] == 10
    assert ttfts(result) == pytest.approx([7500.0] * 3)
    # with max_model_len 80,000 as Sarathi-Serve would have it: each reserves 80,000 (5,000 blocks)
    result = run_engine(requests, ContinuousScheduler(OrcaConfig(max_model_len=80_000)), kv=PagedKVCache(16_384, 16))
    assert result.metrics["finished"] == 3 and result.metrics["iterations"] == 10
    assert max(result.timeline["kv_used"]) == 15_000


# -- static --------------------------------------------------------------------------------------------------

def test_static_reserves_like_orca():
    assert_schedule(run_s1(StaticScheduler(StaticConfig(batch_size=128, max_model_len=512))), TWO_AT_A_TIME)
    assert_schedule(run_s1(StaticScheduler(StaticConfig(batch_size=128, max_model_len="auto", model_context=512))),
                    TWO_AT_A_TIME)
    assert_schedule(run_s1(StaticScheduler(StaticConfig(batch_size=128, max_model_len=512)), max_tokens=50),
                    ALL_AT_ONCE)
    assert_schedule(run_s1(StaticScheduler(StaticConfig(batch_size=128))), ALL_AT_ONCE)  # no model: as before
    assert_schedule(run_s1(StaticScheduler(StaticConfig(batch_size=128, max_model_len=512,
                                                        reserve_max_model_len=True)), max_tokens=50), TWO_AT_A_TIME)


def test_static_reservation_rejection_and_cut():
    scheduler = StaticScheduler(StaticConfig(max_model_len=512))
    kv = PagedKVCache(64, 16)
    assert scheduler.kv_reservation(Request(0, 0.0, 100, 50)) == 512
    assert scheduler.kv_reservation(Request(0, 0.0, 100, 50, max_tokens=60)) == 160
    assert scheduler.rejection_reason(Request(0, 0.0, 512, 5), kv) == (
        "prompt of 512 tokens leaves no room for an output token within max_model_len (512)")
    assert scheduler.limit_request(Request(0, 0.0, 500, 50, max_tokens=100), kv).max_tokens == 12
    # "auto": what the cache holds (1,024 tokens), at most the model's context
    auto = StaticScheduler(StaticConfig(max_model_len="auto", model_context=4096))
    assert auto.max_model_len_for(kv) == 1024
    assert auto.rejection_reason(Request(0, 0.0, 100, 50), kv) is None
    assert auto.kv_reservation(Request(0, 0.0, 100, 50)) == 1024
    assert StaticConfig.run_defaults(None, MODEL_512, {}) == {"max_model_len": "auto", "model_context": 512}
    assert StaticConfig.run_defaults(None, MODEL_512, {"max_model_len": 0}) == {}
    assert StaticConfig.run_defaults(None, None, {}) == {}


def test_static_in_a_run_on_a_named_model(tmp_path):
    scheduler, _, _ = _assembled(tmp_path, "static")
    assert scheduler.config.max_model_len == "auto" and scheduler.config.model_context == 8192
    assert scheduler.kv_reservation(Request(0, 0.0, 100, 10)) == 8192


# -- sarathi -------------------------------------------------------------------------------------------------

def test_sarathi_is_registered_with_sarathi_serves_defaults():
    entry = load_catalog(entry_points=False)["scheduler"].get("sarathi")
    assert entry.config is SarathiConfig and entry.factory is ContinuousScheduler
    c = SarathiConfig()
    assert (c.chunked_prefill, c.allocation, c.running_order, c.watermark, c.max_num_batched_tokens,
            c.max_num_seqs, c.reserve_full_prompt, c.async_scheduling, c.preemption, c.prefill_first,
            c.long_prefill_token_threshold) == (True, "grow", "decodes_first", 0.01, 512, 128, True, False,
                                                "recompute", False, 0)
    assert SarathiConfig.kv_cache_defaults == {"prefix_caching": False}
    assert not ContinuousScheduler(c).plans_ahead
    assert SarathiConfig.run_defaults(None, MODEL_512, {}) == {"max_model_len": 512}


def test_sarathi_in_a_run_has_no_prefix_cache_unless_told(tmp_path):
    scheduler, _, kv = _assembled(tmp_path, "sarathi")
    assert scheduler.config.max_model_len == 8192 and scheduler.config.running_order == "decodes_first"
    assert not kv.prefix_caching and not scheduler.plans_ahead
    _, _, kv = _assembled(tmp_path, "sarathi", kv_cache="prefix_caching = true")
    assert kv.prefix_caching


def test_sarathi_token_schedule_on_the_reviews_s4():
    """Three 20-token prompts decoding; A (300) and B (700) arrive at 10 ms, 1,000 blocks. As
    ``sarathi_scheduler.py`` schedules it: the 3 decodes first, then A whole and B cut to 209
    (3 + 300 + 209 = 512); next, 4 decodes and B's remaining 491."""
    requests = [Request(i, 0.0, 20, 50) for i in range(3)] + [Request(3, 10.0, 300, 20), Request(4, 10.0, 700, 20)]
    result = run_engine(requests, ContinuousScheduler(SarathiConfig()), kv=PagedKVCache(1000, 16))
    t = result.timeline
    rows = [(int(d), int(p), int(tokens)) for d, p, tokens in zip(t["decodes"], t["prefills"], t["prefill_tokens"])]
    assert rows[:4] == [(0, 3, 60), (3, 0, 0), (3, 2, 509), (4, 1, 491)]
    assert t["time_ms"][2] == 11.0 and t["duration_ms"][2] == pytest.approx(8.0 + 509 * 0.05)
    assert result.metrics["finished"] == 5 and result.metrics["num_preemptions"] == 0


# -- conformance: the kit's limits hold for the new settings ----------------------------------------------

@kit_settings
@given(requests_lists(max_size=12), st.integers(1, 8), st.integers(8, 80), st.sampled_from([0, 64, "auto"]),
       st.booleans())
def test_the_presets_keep_every_limit(requests, block_size, num_blocks, longest, whole):
    """Every request finishes once with its tokens or is rejected with a reason; KV within the cache,
    running within max_num_seqs and tokens within the budget in every iteration."""
    kv = PagedKVCache(num_blocks, block_size)
    sarathi = SarathiConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=longest)
    check = IterationChecker(max_running=4, token_budget=32, kv_blocks=num_blocks)
    result = run_engine(requests, ContinuousScheduler(sarathi), kv=kv, check=check)
    check_run(result, requests, max_running=4, kv_blocks=num_blocks)
    orca = OrcaConfig(max_num_seqs=4, max_model_len=longest, reserve_max_model_len=whole and bool(longest))
    check = IterationChecker(max_running=4, kv_blocks=num_blocks)
    result = run_engine(requests, ContinuousScheduler(orca), kv=PagedKVCache(num_blocks, block_size), check=check)
    check_run(result, requests, max_running=4, kv_blocks=num_blocks)
    static = StaticConfig(batch_size=4, max_model_len=longest, reserve_max_model_len=whole and bool(longest))
    check = IterationChecker(max_running=4, kv_blocks=num_blocks)
    result = run_engine(requests, StaticScheduler(static), kv=PagedKVCache(num_blocks, block_size), check=check)
    check_run(result, requests, max_running=4, kv_blocks=num_blocks)


def _assembled(tmp_path, kind: str, kv_cache: str = ""):
    """(scheduler, cost model, KV cache) of a six-request run of ``kind`` on llama-3-8b and an H100."""
    path = tmp_path / "exp.toml"
    path.write_text(run_text("h100-80gb", kind=kind, kv_cache=kv_cache))
    exp = load(path)
    return assemble(exp.studies[0].base, exp.context, "x").instances[0]
