"""Fixes from the cost-model review (reviews/costs.md, session s77): each test fails on the code
before the fix. Expected values are worked out by hand from the model shapes and the GPU
datasheet numbers, not by the code under test."""

from __future__ import annotations

import math

import attrs
import pytest

from schedlab.capacity import ModelSpec, Presets
from schedlab.catalog import load_catalog
from schedlab.errors import ConfigError
from schedlab.hf_config import model_fields
from schedlab.parallelism import Parallelism
from schedlab.protocols import Batch
from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.work import gemm_factors

PRESETS = Presets.from_catalog(load_catalog(entry_points=False))


def _roofline(model, gpu: str, *, parallelism: Parallelism | None = None, **settings) -> RooflineCostModel:
    spec = PRESETS.model(model) if isinstance(model, str) else model
    config = RooflineConfig(model=spec.name, gpu=gpu, **settings)
    extra = {"parallelism": parallelism} if parallelism is not None else {}
    return RooflineCostModel(spec, PRESETS.gpu(gpu), config, **extra)


# --- review 9: zero expert shares -------------------------------------------------------------


@pytest.mark.parametrize("key", ["expert_read_share", "expert_gemm_share"])
def test_a_zero_expert_share_is_refused_when_configured(key):
    """Both divide the experts' time: 0 ran into a ZeroDivisionError mid-run."""
    with pytest.raises(ValueError, match=f"{key}: must be > 0"):
        RooflineConfig(model="mixtral-8x7b", gpu="h100-80gb", **{key: 0.0})
    # a small positive share is still a setting
    assert getattr(RooflineConfig(model="mixtral-8x7b", gpu="h100-80gb", **{key: 0.01}), key) == 0.01


def test_a_zero_expert_share_in_a_gpu_efficiency_table_is_refused():
    gpu = attrs.evolve(PRESETS.gpu("h100-80gb"), name="h100-zero",
                       efficiency={**PRESETS.gpu("h100-80gb").efficiency, "expert_gemm_share": 0.0})
    with pytest.raises(ConfigError, match="h100-zero.*expert_gemm_share: must be > 0"):
        RooflineCostModel(PRESETS.model("mixtral-8x7b"), gpu, RooflineConfig(model="mixtral-8x7b", gpu="h100-zero"))


# --- review 8: MLA and tensor parallel sizes that do not divide the heads ------------------------


@pytest.mark.parametrize("tp", [3, 6, 256])
def test_latent_attention_refuses_a_tp_that_does_not_divide_its_heads(tp):
    """DeepSeek-V3 has 128 attention heads: TP 3 and 6 ran (21.3 heads a rank), as vLLM refuses."""
    deepseek = PRESETS.model("deepseek-v3")
    assert deepseek.kv_latent_dim is not None and deepseek.num_attention_heads == 128
    message = f"128 attention heads cannot be split evenly over tensor_parallel={tp}"
    with pytest.raises(ConfigError, match=message):
        deepseek.kv_bytes_per_token(tp)
    with pytest.raises(ConfigError, match=message):
        _roofline(deepseek, "b200", tensor_parallel=tp)


def test_latent_attention_keeps_its_kv_on_every_rank_at_a_dividing_tp():
    deepseek = PRESETS.model("deepseek-v3")
    for tp in (1, 2, 4, 8, 16, 32, 64, 128):
        assert deepseek.kv_bytes_per_token(tp) == 61 * 576 * 2  # 70,272 B: the latent on every rank


# --- review 7: the LM head on the last pipeline stage at TP 1 --------------------------------------


@pytest.mark.parametrize("tp", [1, 2])
def test_the_lm_head_is_timed_on_the_last_pipeline_stage(tp):
    """Llama-3-70B (80 layers) over 4 stages of 20: the middle stages are alike; the last one adds the
    LM head (and at TP > 1 its gather), at TP 1 as at TP 2. Its weight read alone is 128,256 x 8,192
    16-bit weights: 2.10 GB, 0.74 ms at the H100's 3.35 TB/s x 0.846."""
    cost = _roofline("llama-3-70b", "h100-80gb", tensor_parallel=tp, parallelism=Parallelism(pipeline_parallel=4))
    batch = Batch(num_decode=64, decode_context_tokens=64 * 1000, decode_context_max=1000, decode_context_min=1000)
    stages, _ = cost.pipeline_ms(batch)
    assert stages[1] == pytest.approx(stages[2])
    lm_read_ms = 128256 * 8192 * 2 / tp / (3350e9 * cost.settings.bandwidth_efficiency) * 1e3
    assert cost.settings.bandwidth_efficiency == 0.846  # the H100's measured weight read
    assert lm_read_ms == pytest.approx(0.7414 / tp, rel=1e-3)
    assert stages[3] - stages[1] == pytest.approx(cost.logits_ms(64), rel=1e-9)
    assert stages[3] - stages[1] > lm_read_ms
    assert sum(stages) == pytest.approx(cost.iteration_ms(batch), rel=1e-12)


# --- review 11: tied embeddings by default for OPT, BLOOM, Cohere ----------------------------------

#: facebook/opt-125m's config.json (the keys that matter): no tie_word_embeddings
OPT_125M = {"_name_or_path": "facebook/opt-125m", "activation_function": "relu", "architectures": ["OPTForCausalLM"],
            "do_layer_norm_before": True, "ffn_dim": 3072, "hidden_size": 768, "max_position_embeddings": 2048,
            "model_type": "opt", "num_attention_heads": 12, "num_hidden_layers": 12, "torch_dtype": "float16",
            "vocab_size": 50272, "word_embed_proj_dim": 768}


def test_opt_ties_its_embedding_when_the_config_leaves_the_key_out():
    """transformers' OPTConfig defaults tie_word_embeddings to True: the table is counted once.
    12 layers x (4 x 768^2 attention + 2 x 768 x 3,072 MLP) + 50,272 x 768 table + 25 norms of 768."""
    fields = model_fields(OPT_125M, "opt-125m")
    assert fields["tied_embeddings"] is True
    assert fields["num_params"] == 12 * (4 * 768**2 + 2 * 768 * 3072) + 50272 * 768 + 25 * 768  # 123,562,752
    # an explicit key still wins
    assert model_fields({**OPT_125M, "tie_word_embeddings": False}, "x")["tied_embeddings"] is False


@pytest.mark.parametrize("family", ["bloom", "cohere", "cohere2"])
def test_bloom_and_cohere_tie_by_default(family):
    from schedlab.hf_config import TIED_BY_DEFAULT

    assert family in TIED_BY_DEFAULT  # BloomConfig, CohereConfig, Cohere2Config: tie_word_embeddings = True


# --- review 3: W8A8 FP8 with some modules kept in 16 bits ------------------------------------------

#: Llama-3.1-8B's config.json (the keys that matter)
LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
               "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
               "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}


def _fp8_llama(kept: list[str] | None = None) -> ModelSpec:
    quant = {"quant_method": "fbgemm_fp8", **({"modules_to_not_convert": kept} if kept else {})}
    return ModelSpec("llama-fp8", **model_fields({**LLAMA_31_8B, "quantization_config": quant}, "llama-fp8"))


def test_one_kept_bf16_module_keeps_the_other_gemms_at_the_fp8_rate():
    """Keeping layer 0's q_proj (4,096^2 weights) in bf16 dropped every dense GEMM to the bf16 rate
    (prefill 1.8x slower). Its dense weights beside the tables: 8,030,261,248 - 2 x 128,256 x 4,096."""
    h100 = PRESETS.gpu("h100-80gb")
    ratio = 989 / 1979  # the H100 SXM's bf16 and FP8 dense TFLOPS
    whole, kept = _fp8_llama(), _fp8_llama(["model.layers.0.self_attn.q_proj"])
    assert gemm_factors(whole, h100)[0] == pytest.approx(ratio)
    share = 1 - 4096**2 / (8_030_261_248 - 2 * 128256 * 4096)
    assert kept.fp8_weight_share == pytest.approx(share, rel=1e-6)  # (hf_config counts the final norm apart)
    assert gemm_factors(kept, h100)[0] == pytest.approx(share * ratio + (1 - share), rel=1e-6)
    prefill = Batch(num_prefill=1, prefill_tokens=4096)
    fast, slow = (_roofline(m, "h100-80gb").iteration_ms(prefill) for m in (whole, kept))
    assert fast < slow < 1.01 * fast
    # every layer's modules kept: the bf16 rate (only the 2 x 32 norms of 4,096 are left outside them)
    everything = _fp8_llama(["model.layers.*"])
    assert everything.fp8_weight_share == pytest.approx(2 * 32 * 4096 / (8_030_261_248 - 2 * 128256 * 4096), rel=1e-3)
    assert gemm_factors(everything, h100)[0] == pytest.approx(1.0, abs=1e-4)


def test_an_fp8_share_needs_fp8_activations():
    with pytest.raises(ConfigError, match="fp8_weight_share .* needs fp8_activations"):
        ModelSpec("x", num_layers=1, num_kv_heads=1, head_dim=64, num_params=1e9, fp8_weight_share=0.5)


# --- review 6: the MLA kernels' FLOP rate bounds only latent attention's decodes ---------------------

#: Falcon-7B's shapes: multi-query, 71 query heads over one KV head of 64
FALCON_7B = ModelSpec("falcon-7b-shapes", num_layers=32, num_kv_heads=1, head_dim=64, num_params=6.92e9,
                      num_attention_heads=71, hidden_size=4544, vocab_size=65024)


@pytest.mark.parametrize("gpu,bandwidth,tflops", [("a100-80gb", 2039, 312), ("l40s", 864, 362.05)])
def test_multi_query_decodes_are_bound_by_their_kv_read_not_the_mla_kernel(gpu, bandwidth, tflops):
    """A context token's KV: 2 x 32 layers x 1 head x 64 x 2 B = 8,192 B at 0.91 of the bandwidth;
    its FLOPs: 2 x 32 x 71 x (64 + 64) = 581,632 at FlashAttention's 0.48 of the peak (not at the MLA
    Triton kernel's 0.10 / 0.061, which timed it 4.2x / 2.5x its read)."""
    cost = _roofline(FALCON_7B, gpu)
    assert (cost.settings.kv_read_efficiency, cost.settings.attention_efficiency) == (0.91, 0.48)
    read_ms = 8192 / (bandwidth * 1e9 * 0.91) * 1e3
    flops_ms = 581632 / (tflops * 1e12 * 0.48) * 1e3
    assert cost._decode_ms_per_token == pytest.approx(max(read_ms, flops_ms), rel=1e-12)
    assert cost._decode_ms_per_token == pytest.approx(read_ms, rel=1e-12)
    batch = Batch(num_decode=64, decode_context_tokens=64 * 2000, decode_context_max=2000, decode_context_min=2000)
    shorter = Batch(num_decode=64, decode_context_tokens=64 * 1999, decode_context_max=1999, decode_context_min=1999)
    assert cost.iteration_ms(batch) - cost.iteration_ms(shorter) == pytest.approx(64 * read_ms, rel=1e-6)


def test_latent_attention_decodes_keep_the_mla_kernel_bound():
    """DeepSeek-V3 at TP 1 on an A100: 2 x 61 x 128 x (2 x 576 - 64) = 16,990,208 FLOPs a context
    token at the Triton MLA kernel's 0.10 of 312 TFLOPS (0.545 us) outlast its 70,272 B read."""
    cost = _roofline("deepseek-v3", "a100-80gb")
    assert cost.settings.latent_decode_efficiency == 0.1
    flops = 2 * 61 * 128 * (2 * 576 - 64)
    assert flops == 16_990_208
    assert cost._decode_ms_per_token == pytest.approx(flops / (312e12 * 0.1) * 1e3, rel=1e-12)


# --- review 5: MoE fixed costs only on the MoE layers ----------------------------------------------

#: Llama-4-Maverick's text config (the keys that matter): 128 experts on every other layer
MAVERICK = {"model_type": "llama4_text", "num_local_experts": 128, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 2, "num_hidden_layers": 48, "hidden_size": 5120, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 202048, "attention_chunk_size": 8192}


def test_a_config_with_dense_layers_counts_its_moe_layers():
    spec = ModelSpec("maverick", **model_fields(MAVERICK, "maverick"))
    assert spec.moe_layers == 24 and spec.moe_layer_count == 24  # layers 1, 3, ..., 47
    deepseek = PRESETS.model("deepseek-v3")
    assert deepseek.moe_layers == 58 and deepseek.moe_layer_count == 58  # 61 less first_k_dense_replace 3
    # every layer a MoE layer: left unset, and counted whole
    mixtral = PRESETS.model("mixtral-8x7b")
    assert mixtral.moe_layers is None and mixtral.moe_layer_count == 32
    assert PRESETS.model("llama-3-8b").moe_layer_count == 0
    # the shipped config.json files: first_k_dense_replace 1 (GLM-4.5-Air's 46 layers, Kimi-K2's 61), and
    # Nemotron 3 Nano's 23 MoE (E) layers beside its 23 Mamba-2 and 6 attention ones
    import json
    from pathlib import Path

    data = Path(__file__).resolve().parent / "data" / "hf_configs"
    for name, layers, moe in (("glm-4.5-air", 46, 45), ("kimi-k2", 61, 60), ("nemotron-3-nano-30b-a3b", 29, 23),
                              ("qwen3-30b-a3b", 48, None)):
        read = ModelSpec("m", **model_fields(json.loads((data / f"{name}.json").read_text()), name))
        assert (read.num_layers, read.moe_layers) == (layers, moe), name
    with pytest.raises(ConfigError, match="moe_layers .* needs num_experts"):
        ModelSpec("x", num_layers=4, num_kv_heads=1, head_dim=64, num_params=1e9, moe_layers=2)
    with pytest.raises(ConfigError, match="at most num_layers"):
        attrs.evolve(mixtral, moe_layers=33)


def test_the_experts_fixed_times_are_paid_on_the_moe_layers_only():
    """DeepSeek-V3 on 8 H200s: 58 x expert_layer_us of routing a step, not 61 x; a decode-only step of
    32 tokens touches E (1 - (1 - 8/256)^32) experts a layer, each read costing expert_us besides."""
    cost = _roofline("deepseek-v3", "h200-141gb", tensor_parallel=8)
    every = _roofline(attrs.evolve(PRESETS.model("deepseek-v3"), moe_layers=None), "h200-141gb", tensor_parallel=8)
    c = cost.settings
    assert cost._expert_fixed_ms == pytest.approx(58 * c.expert_layer_us * 1e-3, rel=1e-12)
    assert every._expert_fixed_ms == pytest.approx(61 * c.expert_layer_us * 1e-3, rel=1e-12)
    assert cost._expert_each_ms == pytest.approx(58 * c.expert_us * 1e-3, rel=1e-12)
    touched = 256 * (1 - (1 - 8 / 256) ** 32)
    fixed = 3 * c.expert_layer_us * 1e-3
    assert every._experts_ms(32) - cost._experts_ms(32) > fixed  # the fixed time, and some of the reads'
    assert every._experts_ms(32) - cost._experts_ms(32) < fixed + touched * 3 * c.expert_us * 1e-3


# --- review 1: sliding-window layers' prefill attention ---------------------------------------------


def _pairs_capped(tokens: int, cached: int, window: int) -> int:
    """sum over the chunk's queries of min(their causal keys, window), one query at a time."""
    return sum(min(cached + j, window) for j in range(1, tokens + 1))


def test_window_layers_prefill_attention_is_capped_by_their_window():
    """gpt-oss-120b: 36 layers, 18 of them attending to a 128-token window; 64 heads of 64, so a
    layer's (query, key) pair is 2 x 64 x (64 + 64) = 16,384 FLOPs. A 2,048-token prompt has
    2,048 x 2,049 / 2 = 2,098,176 causal pairs in a full layer, 128 x 129 / 2 + 1,920 x 128 =
    254,016 in a window layer."""
    cost = _roofline("gpt-oss-120b", "h100-80gb")
    work = cost._work
    assert _pairs_capped(2048, 0, 128) == 254_016
    assert work.prefill_attention_flops(2048) == pytest.approx(16384 * 18 * (2_098_176 + 254_016), rel=1e-12)
    # after a cached context of 1,000: full layers 2,048 x 1,000 + 2,098,176; window layers 2,048 x 128
    assert work.prefill_attention_flops(2048, 1000) == pytest.approx(
        16384 * 18 * (2048 * 1000 + 2_098_176 + 2048 * 128), rel=1e-12)
    assert work.prefill_attention_flops(100, 20) == pytest.approx(
        16384 * 18 * (100 * 20 + 100 * 101 / 2 + _pairs_capped(100, 20, 128)), rel=1e-12)
    assert cost.prefill_attention_ms(2048) == pytest.approx(
        16384 * 18 * (2_098_176 + 254_016) / (989e12 * cost.settings.attention_efficiency) * 1e3, rel=1e-12)
    # power models see the same FLOPs (the iteration's work, attention's phase)
    batch = Batch(num_prefill=1, prefill_tokens=2048)
    dense = work.work(batch)[1] - work.prefill_attention_flops(2048)
    assert dense == pytest.approx(2048 * (work._dense_counted + work._expert_counted), rel=1e-12)


def test_a_model_without_windows_keeps_full_causal_pairs():
    work = _roofline("llama-3.1-8b", "h100-80gb")._work
    assert work.window_flops_per_pair == 0.0
    assert work.prefill_attention_flops(512, 3000) == pytest.approx((512 * 3000 + 512 * 513 / 2) * 4 * 32 * 32 * 128)


def test_flash_attention_2_pads_window_layers_decodes_over_their_window_only():
    """Decodes beside a prefill chunk in FlashAttention 2's varlen kernel cost mixed_decode_query_rows of
    query rows over their context plus the tile offset: over at most 128 tokens in gpt-oss's window layers."""
    cost = _roofline("gpt-oss-120b", "a100-80gb", attention_kernel="flash-attention-2")
    c = cost.settings
    per_layer_pair = 2 * 64 * (64 + 64)
    rate = 312e12 * c.attention_efficiency / 1e3  # FLOPs a ms
    decodes = 32
    with_chunk = Batch(num_decode=decodes, decode_context_tokens=decodes * 4000, decode_context_max=4000,
                       decode_context_min=4000, num_prefill=1, prefill_tokens=256)
    chunk_only = Batch(num_prefill=1, prefill_tokens=256)
    offset = c.mixed_decode_context_offset
    # 18 full layers over the 4,000-token contexts, 18 window layers over 128 of them
    padded = c.mixed_decode_query_rows * per_layer_pair * (
        18 * decodes * (4000 + offset) + 18 * decodes * (128 + offset)) / rate
    empty_tiles = decodes * (math.ceil(256 / 128) - 1) * cost._empty_tile_ms
    decode_only = Batch(num_decode=decodes, decode_context_tokens=decodes * 4000, decode_context_max=4000,
                        decode_context_min=4000)
    decode_alone = cost.gpu_ms(decode_only, decodes) - cost.tokens_ms(decodes) - cost.logits_ms(decodes)
    assert padded > decode_alone  # the padded kernel binds
    expected = cost.gpu_ms(chunk_only, 256) - cost.tokens_ms(256) - cost.logits_ms(1) \
        + cost.tokens_ms(256 + decodes) + cost.logits_ms(decodes + 1) + padded + empty_tiles
    assert cost.gpu_ms(with_chunk, 256 + decodes) == pytest.approx(expected, rel=1e-9)


def test_window_layers_keep_the_decode_increment_exact():
    """The fast engine steps decode-only batches by decode_step_increment: it stays the next step's rise."""
    for model, gpu in (("gpt-oss-120b", "h100-80gb"), ("gpt-oss-20b", "a100-80gb")):
        cost = _roofline(model, gpu)
        for n, ctx in ((1, 50), (16, 127), (64, 3000)):
            batch = Batch(num_decode=n, decode_context_tokens=n * ctx, decode_context_max=ctx, decode_context_min=ctx)
            after = Batch(num_decode=n, decode_context_tokens=n * (ctx + 1), decode_context_max=ctx + 1,
                          decode_context_min=ctx + 1)
            inc = cost.decode_step_increment(batch)
            inc = inc[0] if isinstance(inc, tuple) else inc
            assert cost.iteration_ms(after) - cost.iteration_ms(batch) == pytest.approx(inc, rel=1e-9, abs=1e-12)


# --- review 13: a bf16 bundle timing a quantised variant of its model --------------------------------

BUNDLES = "experiments/data/llmservingsim/profiles/RTXPRO6000"


def _bundle(path: str, tp: int = 1):
    from pathlib import Path

    from schedlab_plugins.cost_models.profile_bundle import ProfileBundle

    return ProfileBundle(Path(__file__).resolve().parents[1] / BUNDLES / path, tp)


def _bundle_warnings(bundle, model) -> list[str]:
    import warnings

    from schedlab_plugins.cost_models.profile_bundle import BundleWarning
    from schedlab_plugins.cost_models.profiled import check_bundle_model

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_bundle_model(bundle, model)
    return [str(w.message) for w in caught if issubclass(w.category, BundleWarning)]


def test_a_bf16_bundle_warns_when_it_times_a_quantised_variant():
    bundle = _bundle("Qwen/Qwen3-32B/bf16", 2)
    assert bundle.meta["variant"] == "bf16"
    qwen = PRESETS.model("qwen3-32b")
    assert _bundle_warnings(bundle, qwen) == []  # the profiled model itself
    awq = attrs.evolve(qwen, name="qwen3-32b-awq", hf_id="Qwen/Qwen3-32B-AWQ", weight_dtype_bytes=0.51953125,
                       table_dtype_bytes=2.0)
    said = _bundle_warnings(bundle, awq)
    assert len(said) == 1 and "variant is bf16" in said[0] and "quantisation (AWQ)" in said[0]
    # an id naming the format, the bytes left at 16 bits; or 1-byte weights under a plain id
    assert "quantisation (FP8)" in _bundle_warnings(bundle, attrs.evolve(qwen, hf_id="Qwen/Qwen3-32B-FP8"))[0]
    assert "GPTQ" in _bundle_warnings(bundle, attrs.evolve(qwen, hf_id="Qwen/Qwen3-32B-GPTQ-Int4"))[0]
    assert "weights are 1 bytes each" in _bundle_warnings(bundle, attrs.evolve(qwen, weight_dtype_bytes=1.0))[0]
    # a fine-tune keeps the bf16 weights: no warning
    assert _bundle_warnings(bundle, attrs.evolve(qwen, hf_id="Qwen/Qwen3-32B-Instruct")) == []


def test_a_bf16_moe_bundle_warns_of_quantised_experts():
    bundle = _bundle("Qwen/Qwen3-30B-A3B-Instruct-2507/bf16")
    qwen = PRESETS.model("qwen3-30b-a3b")
    assert _bundle_warnings(bundle, qwen) == []
    said = _bundle_warnings(bundle, attrs.evolve(qwen, expert_dtype_bytes=0.53125))
    assert len(said) == 1 and "routed experts' 0.53125" in said[0]


# --- review 12: a cost model whose weights do not fit on the GPU ----------------------------------


def test_a_roofline_whose_weights_exceed_the_gpu_is_refused():
    """Llama-3-70B at 16 bits: 70,553,706,496 x 2 B = 131.42 GiB on one L4 (22.49 GiB); at TP 8 the
    KV cache fits too, as capacity's message for a [kv_cache] sized there says."""
    from schedlab_plugins.cost_models import build_roofline

    assert 70_553_706_496 * 2 / 2**30 == pytest.approx(131.42, abs=0.005)
    with pytest.raises(ConfigError, match=r"llama-3-70b does not fit on l4 with tensor_parallel=1: each rank's weights "
                                          r"are 131\.42 GiB, more than the GPU's 22\.49 GiB of memory; use "
                                          r"tensor_parallel = 8 or a GPU with more memory"):
        build_roofline(RooflineConfig(model="llama-3-70b", gpu="l4"), PRESETS)
    with pytest.raises(ConfigError, match="on h100-80gb with tensor_parallel=1: .* use tensor_parallel = 2 "):
        build_roofline(RooflineConfig(model="llama-3-70b", gpu="h100-80gb"), PRESETS)
    assert build_roofline(RooflineConfig(model="llama-3-70b", gpu="h100-80gb", tensor_parallel=2), PRESETS)
    # a pipeline's stage holds half the layers: 65.7 GiB on each H100
    two_stages = Parallelism(pipeline_parallel=2)
    assert build_roofline(RooflineConfig(model="llama-3-70b", gpu="h100-80gb"), PRESETS, two_stages)
    with pytest.raises(ConfigError, match="pipeline_parallel=2: the largest stage's weights are 65.71 GiB"):
        build_roofline(RooflineConfig(model="llama-3-70b", gpu="l40s"), PRESETS, two_stages)


def test_a_profiled_model_whose_weights_exceed_its_gpu_is_refused():
    from schedlab.capacity import GpuSpec
    from schedlab_plugins.cost_models import ProfiledConfig, build_profiled

    bundle = str(__import__("pathlib").Path(__file__).resolve().parents[1] / BUNDLES / "meta-llama/Llama-3.1-8B/bf16")
    small = GpuSpec("gpu-8gib", memory_gib=8, hbm_bandwidth_gbps=300, bf16_tflops=100, host_link_gbps=32)
    presets = Presets.from_catalog(load_catalog(entry_points=False), custom={"gpu-8gib": small})
    # 8,030,261,248 x 2 B = 14.96 GiB
    with pytest.raises(ConfigError, match=r"llama-3.1-8b does not fit on gpu-8gib with tensor_parallel=1: each "
                                          r"rank's weights are 14\.96 GiB, more than the GPU's 8\.00 GiB"):
        build_profiled(ProfiledConfig(profile=bundle, model="llama-3.1-8b", gpu="gpu-8gib"), presets)
    # without a gpu nothing is known of the memory: not checked
    assert build_profiled(ProfiledConfig(profile=bundle, model="llama-3.1-8b"), presets)


def test_dispatch_and_combine_run_around_the_moe_layers_only():
    """DeepSeek-V3 data-parallel over 8 GPUs with expert parallelism: the all-gather and
    reduce-scatter around the experts are paid by its 58 MoE layers, not its 61 (the first three
    are dense)."""
    from schedlab_plugins.cost_models.expert_parallel import ExpertLayers
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES

    model = PRESETS.model("deepseek-v3")
    assert (model.num_layers, model.moe_layer_count) == (61, 58)
    layout = Parallelism(data_parallel=8, expert_parallel=True)
    layers = ExpertLayers(model, layout, 1, TOPOLOGIES["dgx-h100"], lambda tokens, experts: 0.0)
    c = layers.collectives
    one_layer = c.all_gather_ms(8 * 16 * (7168 + 256) * 2) + c.reduce_scatter_ms(8 * 16 * 7168 * 2)
    assert layers.step_ms([16] * 8) == pytest.approx(58 * one_layer)


def test_the_tp_suggested_for_weights_that_do_not_fit_counts_the_pipeline():
    """Llama-3-70B on A100-40GB over 2 stages: 65.7 GiB a stage at TP 1, 32.9 at TP 2, which fits
    (it suggested TP 4, from the whole model's split)."""
    from schedlab.capacity import check_weights_fit

    with pytest.raises(ConfigError, match=r"pipeline_parallel=2: the largest stage's weights are 65.71 GiB.*"
                                          r"use tensor_parallel = 2 or"):
        check_weights_fit(PRESETS.model("llama-3-70b"), PRESETS.gpu("a100-40gb"), 1, Parallelism(pipeline_parallel=2))
    check_weights_fit(PRESETS.model("llama-3-70b"), PRESETS.gpu("a100-40gb"), 2, Parallelism(pipeline_parallel=2))
