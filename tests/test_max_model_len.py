"""``max_model_len``: the longest sequence an engine serves (vLLM ``--max-model-len``).

vLLM 0.33 rejects a prompt of ``max_model_len`` tokens or more (``InputProcessor``: "The decoder
prompt (length N) is longer than the maximum model length"; at exactly ``max_model_len`` no
output token fits) and cuts a request's ``max_tokens`` to ``max_model_len - prompt``
(``get_max_tokens``). The ``vllm`` preset takes the model's context length
(``max_position_embeddings``) when the run names a model; without chunked prefill its token
budget is at least ``max_model_len`` (``max(max_model_len, default)``), so every prompt it
accepts fits one step. Hand-computed cases, both engines, and the assembly's defaults.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.configs import FieldError
from schedlab.errors import ConfigError
from schedlab.hf_config import model_fields
from schedlab.model import Request
from schedlab.study.experiment import load, run_experiment
from schedlab.study.simulation import assemble
from schedlab.testing import check_run, compare_runs, examples, requests_lists, run_engine
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.presets import CONTEXT_LENGTHS, MODELS
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.schedulers.presets import VllmConfig, VllmV0Config
from test_engine_defaults import run_text


def _run(requests, max_model_len, engine: str = "fast", blocks: int = 400, **config):
    settings = {"allocation": "grow", "chunked_prefill": True, **config}
    scheduler = ContinuousScheduler(ContinuousConfig(max_model_len=max_model_len, **settings))
    return run_engine(requests, scheduler, LinearCostModel(), PagedKVCache(blocks, 4), engine=engine)


def _rows(result) -> dict:
    req = result.requests
    return {rid: (int(req["max_tokens"][i]), int(req["generated_tokens"][i]), bool(req["rejected"][i]))
            for i, rid in enumerate(req["id"].tolist())}


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_long_prompts_are_rejected_and_outputs_cut_to_the_context_left(engine):
    requests = [
        Request(0, 0.0, prompt_tokens=100, output_tokens=5),                  # prompt = max_model_len: no room
        Request(1, 1.0, prompt_tokens=99, output_tokens=5),                   # room for 1 token
        Request(2, 2.0, prompt_tokens=60, output_tokens=30),                  # 90 <= 100: as asked
        Request(3, 3.0, prompt_tokens=70, output_tokens=50),                  # cut to 30
        Request(4, 4.0, prompt_tokens=70, output_tokens=10, max_tokens=50),  # finishes at 10 either way
        Request(5, 5.0, prompt_tokens=150, output_tokens=1),                  # longer than the context
        Request(6, 6.0, prompt_tokens=40, output_tokens=80, max_tokens=70),  # max_tokens 70 cut to 60
    ]
    result = _run(requests, 100, engine)
    assert _rows(result) == {0: (5, 0, True), 1: (1, 1, False), 2: (30, 30, False), 3: (30, 30, False),
                             4: (30, 10, False), 5: (1, 0, True), 6: (60, 60, False)}
    assert set(result.rejections) == {0, 5}
    assert "max_model_len (100)" in result.rejections[0]
    assert result.counters["generated_tokens"] == 1 + 30 + 30 + 10 + 60
    check_run(result, requests)


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("setting", ["auto", -1])
def test_auto_serves_the_longest_sequence_the_cache_holds(engine, setting):
    # vLLM's --max-model-len -1 / auto: 25 blocks of 4 hold 100 tokens, so the requests above are
    # served as with max_model_len = 100; capped by the model's context, at 90.
    requests = [Request(0, 0.0, prompt_tokens=100, output_tokens=5), Request(1, 1.0, prompt_tokens=99, output_tokens=5),
                Request(2, 2.0, prompt_tokens=70, output_tokens=50), Request(3, 3.0, prompt_tokens=89, output_tokens=5)]
    assert ContinuousConfig(max_model_len=setting).max_model_len == "auto"
    result = _run(requests, setting, engine, blocks=25)
    assert _rows(result) == {0: (5, 0, True), 1: (1, 1, False), 2: (30, 30, False), 3: (5, 5, False)}
    assert "max_model_len (100)" in result.rejections[0]
    capped = _run(requests, setting, engine, blocks=25, model_context=90)
    assert _rows(capped) == {0: (5, 0, True), 1: (5, 0, True), 2: (20, 20, False), 3: (1, 1, False)}
    check_run(capped, requests)


@pytest.mark.parametrize("value", ["big", -2, True, 1.5])
def test_max_model_len_is_a_whole_number_or_auto(value):
    with pytest.raises(FieldError, match="max_model_len.*whole number >= 0 or \"auto\""):
        ContinuousConfig(max_model_len=value)


def test_no_limit_serves_every_request_as_asked():
    requests = [Request(0, 0.0, prompt_tokens=150, output_tokens=40)]
    assert _rows(_run(requests, 0)) == {0: (40, 40, False)}
    assert not hasattr(ContinuousScheduler(ContinuousConfig()), "limit_request")  # nothing for the engine to call


@settings(max_examples=examples(100), deadline=None)
@given(requests_lists(max_size=10, max_prompt=90, max_output=60, all_at_zero=False),
       st.sampled_from([0, 2, 30, 64, 91]), st.booleans(), st.booleans(), st.sampled_from(["cut", "reject"]))
def test_both_engines_serve_within_the_context(requests, max_model_len, plans_ahead, chunked, overflow):
    settings = dict(async_scheduling=plans_ahead, chunked_prefill=chunked, context_overflow=overflow)
    fast = _run(requests, max_model_len, "fast", **settings)
    ref = _run(requests, max_model_len, "reference", **settings)
    compare_runs(fast, ref, rel=1e-12)
    check_run(fast, requests)
    by_id = {r.id: r for r in requests}
    for rid, (max_tokens, generated, rejected) in _rows(fast).items():
        r = by_id[rid]
        too_long = bool(max_model_len) and (r.prompt_tokens >= max_model_len or (
            overflow == "reject" and r.max_tokens is not None and r.prompt_tokens + r.max_tokens > max_model_len))
        assert rejected == too_long  # (the cache and the token budget hold every prompt drawn)
        if not rejected:
            assert generated == min(r.target_tokens, max_tokens)
            assert not max_model_len or r.prompt_tokens + generated <= max_model_len
            if not max_model_len or r.prompt_tokens + r.max_output_tokens <= max_model_len:
                assert max_tokens == r.max_output_tokens


def _config(tmp_path, *, kind="vllm", model="llama-2-7b", gpu="h100-80gb", scheduler=""):
    path = tmp_path / "exp.toml"
    path.write_text(run_text(gpu, scheduler, kind, model))
    exp = load(path)
    return assemble(exp.studies[0].base, exp.context, "x").instances[0][0].config


def test_the_vllm_preset_takes_the_models_context(tmp_path):
    assert _config(tmp_path).max_model_len == 4096
    assert _config(tmp_path, model="llama-3.1-8b").max_model_len == 131072
    assert _config(tmp_path, scheduler="max_model_len = 2000").max_model_len == 2000
    assert _config(tmp_path, kind="continuous").max_model_len == 0  # continuous: no limit unless set
    auto = _config(tmp_path, model="llama-3.1-8b", scheduler='max_model_len = "auto"')
    assert (auto.max_model_len, auto.model_context) == ("auto", 131072)  # what the fit is capped at


@pytest.mark.parametrize("model, gpu, scheduler, budget", [
    ("llama-3.1-8b", "h100-80gb", "chunked_prefill = false", 131072),   # max(131,072, 8,192)
    ("llama-2-7b", "h100-80gb", "chunked_prefill = false", 8192),       # max(4,096, 8,192)
    ("llama-2-7b", "a100-80gb", "chunked_prefill = false", 4096),       # max(4,096, 2,048)
    ("llama-2-7b", "a100-80gb", "chunked_prefill = false\nmax_model_len = 3000", 3000),
    ("llama-3.1-8b", "h100-80gb", "", 8192),                            # chunked: the GPU's default
    ("llama-3.1-8b", "h100-80gb", "chunked_prefill = false\nmax_num_batched_tokens = 4096\nmax_model_len = 4096", 4096),
])
def test_without_chunked_prefill_the_budget_holds_a_whole_context(tmp_path, model, gpu, scheduler, budget):
    assert _config(tmp_path, model=model, gpu=gpu, scheduler=scheduler).max_num_batched_tokens == budget


def test_without_a_gpu_the_defaults_follow_the_model_alone():
    spec, note = next((spec, note) for spec, note in MODELS if spec.name == "llama-2-7b")
    assert "context 4,096 tokens" in note
    assert VllmConfig.run_defaults(None, spec, {}) == {"max_model_len": 4096, "max_num_seqs": 256}
    assert VllmConfig.run_defaults(None, spec, {"chunked_prefill": False}) == {
        "max_model_len": 4096, "max_num_batched_tokens": 4096, "max_num_seqs": 256}
    assert VllmConfig.run_defaults(None, None, {"max_num_batched_tokens": 128}) == {"max_num_seqs": 128}


def test_the_vllm_v0_preset_takes_v0s_budget_from_the_context(tmp_path):
    # vLLM V0's SchedulerConfig (v0.8.5): max(max_model_len, 2048) tokens without chunked prefill, 2048 with it
    # (_DEFAULT_MAX_NUM_BATCHED_TOKENS; 512 up to v0.6.4); and EngineArgs._set_default_args_v0 turns chunked
    # prefill on by default for max_model_len > 32768 (since v0.5.3), where V0 then schedules decodes first
    # (_schedule_chunked_prefill): Llama-3.1-8B's 131,072 tokens are served in 2,048-token steps
    llama2, llama31 = (next(spec for spec, _ in MODELS if spec.name == name) for name in ("llama-2-7b", "llama-3.1-8b"))
    chunked = {"prefill_first": False, "running_order": "decodes_first"}
    assert VllmV0Config.run_defaults(None, llama2, {}) == {"max_model_len": 4096, "max_num_batched_tokens": 4096}
    assert VllmV0Config.run_defaults(None, llama31, {}) == {
        "max_model_len": 131072, "chunked_prefill": True, "max_num_batched_tokens": 2048, **chunked}
    assert VllmV0Config.run_defaults(None, llama31, {"chunked_prefill": False}) == {
        "max_model_len": 131072, "max_num_batched_tokens": 131072}
    assert VllmV0Config.run_defaults(None, llama2, {"chunked_prefill": True}) == {
        "max_model_len": 4096, "max_num_batched_tokens": 2048, **chunked}
    assert VllmV0Config.run_defaults(None, None, {"max_model_len": 1000}) == {"max_num_batched_tokens": 2048}
    assert VllmV0Config.run_defaults(None, llama2, {"max_num_batched_tokens": 100}) == {
        "max_model_len": 4096, "max_num_seqs": 100}
    assert VllmV0Config.run_defaults(None, None, {}) == {}  # no model: the continuous defaults
    config = _config(tmp_path, kind="vllm-v0")
    assert (config.max_model_len, config.max_num_batched_tokens, config.max_num_seqs) == (4096, 4096, 256)


def test_vllm_v0_refuses_a_budget_below_max_model_len_without_chunking(tmp_path):
    # V0's SchedulerConfig._verify_args: a prompt of max_model_len tokens must fit one step -- without
    # chunked prefill, which V0 turns on by default over 32K (_set_default_args_v0): so Llama-3.1-8B with
    # 16,384 tokens is accepted (chunked), and refused only with chunked_prefill = false
    with pytest.raises(ConfigError, match=r"exp\.toml: \[scheduler\]: max_num_batched_tokens \(16384\) is smaller "
                                          r"than max_model_len \(131072\): vLLM V0 refuses"):
        _config(tmp_path, kind="vllm-v0", model="llama-3.1-8b",
                scheduler="max_num_batched_tokens = 16384\nchunked_prefill = false")
    for scheduler in ("max_num_batched_tokens = 16384", "max_num_batched_tokens = 16384\nchunked_prefill = true"):
        chunked = _config(tmp_path, kind="vllm-v0", model="llama-3.1-8b", scheduler=scheduler)
        assert (chunked.max_num_batched_tokens, chunked.max_model_len, chunked.chunked_prefill) == (16384, 131072, True)
    assert _config(tmp_path, kind="vllm-v0", model="llama-3.1-8b",
                   scheduler="max_num_batched_tokens = 16384\nmax_model_len = 16384").max_model_len == 16384


def test_vllm_v1_refuses_a_budget_below_max_model_len_without_chunking(tmp_path):
    # vLLM 0.33's SchedulerConfig.verify_max_model_len: accepted, the run rejected every longer prompt and a
    # search over it answered for the short ones only
    with pytest.raises(ConfigError, match=r"exp\.toml: \[scheduler\]: max_num_batched_tokens \(4096\) is smaller "
                                          r"than max_model_len \(131072\): vLLM V1 refuses"):
        _config(tmp_path, model="llama-3.1-8b", gpu="h100-80gb",
                scheduler="chunked_prefill = false\nmax_num_batched_tokens = 4096")
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(4096\) is smaller than max_model_len \(5000\)"):
        _config(tmp_path, scheduler="chunked_prefill = false\nmax_num_batched_tokens = 4096\nmax_model_len = 5000")
    auto = _config(tmp_path, model="llama-3.1-8b", gpu="h100-80gb",
                   scheduler="chunked_prefill = false\nmax_num_batched_tokens = 4096\nmax_model_len = \"auto\"")
    assert auto.max_num_batched_tokens == 4096  # ("auto" fits the cache when the run is built: not checked here)


def test_a_run_on_a_short_context_model_rejects_what_vllm_would(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(run_text("h100-80gb", model="llama-2-7b").replace('value = 100}', 'value = 4000}', 1))
    run = run_experiment(load(path)).all_runs()[0]
    assert run.metrics["requests"] == 6 and run.metrics["rejected"] == 0
    assert run.requests["max_tokens"].tolist() == [10] * 6
    path.write_text(path.read_text().replace('value = 10}', 'value = 200}'))
    run = run_experiment(load(path)).all_runs()[0]
    assert run.requests["max_tokens"].tolist() == [96] * 6      # 4,096 - 4,000
    assert run.requests["generated_tokens"].tolist() == [96] * 6


def test_every_preset_has_a_context_length():
    assert {spec.name for spec, _ in MODELS} == set(CONTEXT_LENGTHS)
    assert all(spec.max_position_embeddings == CONTEXT_LENGTHS[spec.name] for spec, _ in MODELS)


BASE = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "vocab_size": 100, "intermediate_size": 128}


@pytest.mark.parametrize("keys, context", [
    ({"max_position_embeddings": 4096}, 4096),
    ({}, None),
    ({"n_positions": 2048, "max_position_embeddings": 4096}, 2048),       # vLLM: the smallest key
    ({"max_position_embeddings": 8192, "model_max_length": 131072}, 131072),  # Cohere's override
])
def test_a_config_file_gives_its_context_length(keys, context):
    fields = model_fields({**BASE, **keys}, "config.json")
    assert fields.get("max_position_embeddings") == context


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_vllm_before_0_33_rejects_what_does_not_fit_its_own_max_tokens(engine):
    """vLLM 0.13-0.2x took a client's max_tokens as a reservation: prompt + max_tokens beyond
    max_model_len was a 400 (vllm-project/vllm#42474); without max_tokens the rest is cut."""
    requests = [Request(0, 0.0, prompt_tokens=70, output_tokens=10, max_tokens=50),   # 120 > 100: rejected
                Request(1, 1.0, prompt_tokens=70, output_tokens=50),                  # no max_tokens: cut to 30
                Request(2, 2.0, prompt_tokens=50, output_tokens=20, max_tokens=50)]   # 100: fits
    result = _run(requests, 100, engine, context_overflow="reject")
    assert _rows(result) == {0: (50, 0, True), 1: (30, 30, False), 2: (50, 20, False)}
    assert "context_overflow is 'reject'" in result.rejections[0]
    cut = _run(requests, 100, engine)
    assert _rows(cut) == {0: (30, 10, False), 1: (30, 30, False), 2: (50, 20, False)}


def test_a_run_says_when_vllm_would_not_start(tmp_path):
    """vLLM refuses to start when one max_model_len sequence does not fit in the KV pool: the
    run's table says so beside the cache (Llama-3.1-8B on an L4: 31,024 tokens of 131,072,
    test_capacity.test_the_models_context_against_the_pool)."""
    from schedlab_plugins.reports.table import render

    path = tmp_path / "exp.toml"
    path.write_text(run_text("l4", model="llama-3.1-8b"))
    results = run_experiment(load(path))
    run = results.all_runs()[0]
    assert (run.meta["max_model_len"], run.meta["kv_cache"]["tokens"]) == (131072, 31024)
    refused = ("vLLM would refuse to start: max_model_len 131,072 > the KV pool's 31,024 tokens; set [scheduler] "
               "max_model_len <= 31,024 or \"auto\"")
    assert run.meta["start_up_problem"] == refused
    assert f"31,024 tokens; {refused}" in render(results, ["finished"])
    path.write_text(run_text("l4", 'max_model_len = "auto"', model="llama-3.1-8b"))
    run = run_experiment(load(path)).all_runs()[0]
    assert run.meta["max_model_len"] == run.meta["kv_cache"]["tokens"] == 31024  # vLLM's auto-fit
    assert run.meta["start_up_problem"] == ""


def _sglang(requests, context: int, engine: str):
    from schedlab_plugins.kv_caches import RadixKVCache
    from schedlab_plugins.schedulers.sglang import SglangConfig, SglangScheduler

    return run_engine(requests, SglangScheduler(SglangConfig(context_length=context)), LinearCostModel(),
                      RadixKVCache(2000, 1), engine=engine)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_sglang_bounds_requests_by_its_context_length(engine):
    """SGLang 0.5.23: the scheduler rejects a prompt of max_req_input_len = context - 1 - 5 tokens
    or more; the tokenizer manager a prompt + max_tokens beyond the context; max_new_tokens is cut
    to max_req_len - prompt - 1 = context - 2 - prompt."""
    requests = [Request(0, 0.0, prompt_tokens=94, output_tokens=1),                  # 94 >= 100 - 6
                Request(1, 1.0, prompt_tokens=93, output_tokens=20),                 # cut to 5
                Request(2, 2.0, prompt_tokens=60, output_tokens=10, max_tokens=50),  # 110 > 100
                Request(3, 3.0, prompt_tokens=60, output_tokens=50, max_tokens=40),  # 100: cut to 38
                Request(4, 4.0, prompt_tokens=50, output_tokens=30)]                 # as asked
    result = _sglang(requests, 100, engine)
    assert _rows(result) == {0: (1, 0, True), 1: (5, 5, False), 2: (50, 0, True), 3: (38, 38, False),
                             4: (30, 30, False)}
    assert "maximum allowed length (94 tokens)" in result.rejections[0]
    assert "exceeds the model's context length (100)" in result.rejections[2]
    check_run(result, requests)


def test_the_sglang_scheduler_takes_the_models_context(tmp_path):
    assert _config(tmp_path, kind="sglang").context_length == 4096
    assert _config(tmp_path, kind="sglang", scheduler="context_length = 1000").context_length == 1000


def test_a_long_prefill_threshold_past_max_model_len_is_refused_as_vllm_refuses_it():
    """No prompt reaches it, so it never caps a chunk (SchedulerConfig.verify_max_model_len)."""
    with pytest.raises(ConfigError, match=r"long_prefill_token_threshold \(4096\) is greater than max_model_len "
                                          r"\(1024\): vLLM refuses this"):
        VllmConfig(max_model_len=1024, long_prefill_token_threshold=4096)
    assert VllmConfig(max_model_len=1024, long_prefill_token_threshold=1024).long_prefill_token_threshold == 1024
    assert VllmConfig(max_model_len="auto", long_prefill_token_threshold=4096)   # (auto: known once the cache is)
