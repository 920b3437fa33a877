"""Model presets: parameter counts from config shapes, quantised weights, latent and
sliding-window KV, and the embedding table as the roofline reads it -- by hand."""

from __future__ import annotations

import math

import attrs
import pytest

from schedlab.capacity import GIB, ModelSpec, Presets
from schedlab.catalog import load_catalog
from schedlab.errors import ConfigError
from schedlab.protocols import Batch
from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.step_overhead import GPU_ONLY
from schedlab_plugins.presets import MODELS, shape_params

PRESETS = Presets.from_catalog(load_catalog(entry_points=False))
MODEL = {spec.name: spec for spec, _ in MODELS}


@pytest.mark.parametrize("name, shapes, tied", [
    ("llama-2-7b", (32, 4096, 32, 32, 128, 11008, 32000), False),
    ("llama-2-13b", (40, 5120, 40, 40, 128, 13824, 32000), False),
    ("llama-2-70b", (80, 8192, 64, 8, 128, 28672, 32000), False),
    ("llama-3-70b", (80, 8192, 64, 8, 128, 28672, 128256), False),
    ("llama-3.1-8b", (32, 4096, 32, 8, 128, 14336, 128256), False),
    ("mistral-7b", (32, 4096, 32, 8, 128, 14336, 32000), False),
    ("llama-3.2-1b", (16, 2048, 32, 8, 64, 8192, 128256), True),
])
def test_the_shape_count_reproduces_the_checkpoints(name, shapes, tied):
    """shape_params (which the newer presets use) gives the checkpoint's own count."""
    total, active = shape_params(*shapes, tied=tied)
    assert total == active == MODEL[name].num_params


def test_the_shape_count_of_qwen3_dense_and_moe():
    assert shape_params(64, 5120, 64, 8, 128, 25600, 151936, qk_norm=True)[0] == MODEL["qwen3-32b"].num_params
    total, active = shape_params(48, 2048, 32, 4, 128, 0, 151936, qk_norm=True, experts=128, top_k=8, expert_ffn=768)
    assert (total, active) == (MODEL["qwen3-30b-a3b"].num_params, MODEL["qwen3-30b-a3b"].active_params)


@pytest.mark.parametrize("name, billions, active", [
    ("codellama-34b", 33.7, None), ("llama-3.3-70b", 70.6, None), ("mixtral-8x7b", 46.7, 12.9),
    ("mixtral-8x22b", 140.6, 39.2), ("qwen3-0.6b", 0.60, None), ("qwen3-1.7b", 1.72, None), ("qwen3-4b", 4.02, None),
    ("qwen3-8b", 8.19, None), ("qwen3-14b", 14.8, None), ("qwen3-235b-a22b", 235.1, 22.2),
    ("gpt-oss-20b", 20.9, None), ("gpt-oss-120b", 116.8, None), ("deepseek-v3", 671, 37),
])
def test_new_presets_have_the_published_sizes(name, billions, active):
    spec = PRESETS.model(name)
    assert spec.num_params / 1e9 == pytest.approx(billions, rel=0.01)  # the model cards round
    if active is not None:
        assert spec.params_per_token / 1e9 == pytest.approx(active, rel=0.01)


def test_gpt_oss_weights_are_mxfp4_experts_and_bf16_rest():
    """Its checkpoints: 12.8 GiB and 60.8 GiB (4.25-bit experts); bf16 throughout would be 39 and 218."""
    assert PRESETS.model("gpt-oss-20b").weight_bytes() / GIB == pytest.approx(12.8, rel=0.01)
    assert PRESETS.model("gpt-oss-120b").weight_bytes() / GIB == pytest.approx(60.8, rel=0.01)
    spec = PRESETS.model("gpt-oss-20b")
    experts = spec.expert_params * spec.num_experts
    assert spec.weight_bytes(2) == pytest.approx(((spec.num_params - experts) * 2 + experts * 0.53125) / 2)


def test_kv_per_token_of_sliding_window_and_latent_attention():
    # gpt-oss-20b: 12 of its 24 layers are full: 2 x 12 x 8 KV heads x 64 x 2 bytes
    assert PRESETS.model("gpt-oss-20b").kv_bytes_per_token() == 2 * 12 * 8 * 64 * 2 == 24_576
    assert PRESETS.model("gpt-oss-20b").kv_bytes_per_token(8) == 2 * 12 * 1 * 64 * 2
    # DeepSeek-V3: one 576-element latent per token and layer, on every rank alike
    v3 = PRESETS.model("deepseek-v3")
    assert v3.kv_bytes_per_token() == v3.kv_bytes_per_token(8) == 61 * 576 * 2 == 70_272
    # every layer sliding: a sequence's KV counted whole (exact up to the window)
    every = attrs.evolve(PRESETS.model("llama-3-8b"), sliding_window=4096, sliding_window_layers=32)
    assert every.kv_bytes_per_token() == PRESETS.model("llama-3-8b").kv_bytes_per_token()


def test_capacity_text_shows_latent_and_quantised_weights():
    from schedlab.capacity import format_capacity, size_kv_cache

    text = format_capacity(size_kv_cache(PRESETS.model("deepseek-v3"), PRESETS.gpu("h200-141gb"), tensor_parallel=8))
    assert "61 layers x 576 latent (K and V, on every rank) x 2 B = 68.625 KiB" in text
    # the FP8 checkpoint's embedding and LM head stay bf16: 2 x 129,280 x 7,168 = 1.85B of the 671B
    assert "1-byte weights, 2-byte KV" in text
    assert "669.15B params x 1 B + 1.85B embedding and LM head params x 2 B / 8 ranks" in text
    text = format_capacity(size_kv_cache(PRESETS.model("gpt-oss-20b"), PRESETS.gpu("l4")))
    assert "12 layers (the full-attention ones)" in text
    # vLLM's hybrid manager: the 12 window layers form one more group of 12; a sequence holds at most
    # ceil(127 / 16) + 1 = 9 of its blocks once the window slides
    assert "window layers       12 layers keep 128 tokens in 1 more group(s) of 12 layers" in text
    assert "up to 9 blocks a sequence" in text
    whole = format_capacity(size_kv_cache(PRESETS.model("gpt-oss-20b"), PRESETS.gpu("l4"), hybrid=False))
    assert "24 layers" in whole and "window layers" not in whole
    assert "expert params x 0.53125 B" in text


def test_bad_shapes_are_refused():
    base = PRESETS.model("llama-3-8b")
    with pytest.raises(ConfigError, match="sliding_window_layers .40. exceeds num_layers .32."):
        attrs.evolve(base, sliding_window=128, sliding_window_layers=40)
    with pytest.raises(ConfigError, match="sliding_window is not"):
        attrs.evolve(base, sliding_window_layers=4)


# --- the embedding table in the roofline ---------------------------------------------------------


#: the roofline's bytes and FLOPs alone: no fixed times, the experts read and computed as dense layers are
BARE = {"layer_overhead_us": 0.0, "attention_layer_us": 0.0, "expert_layer_us": 0.0, "expert_us": 0.0,
        "expert_read_share": 1.0, "expert_gemm_share": 1.0}


def _bare(spec: ModelSpec, gpu="a100-80gb", **config) -> RooflineCostModel:
    return RooflineCostModel(spec, PRESETS.gpu(gpu), RooflineConfig(model=spec.name, gpu=gpu,
                                                                    **{**BARE, **GPU_ONLY, **config}))


def test_an_untied_embedding_is_looked_up_not_read_and_multiplies_nothing():
    """Llama-2-7B on an A100 (weights at 0.776 of 2,039 GB/s, GEMMs at 0.66 of 312 TFLOPS): the
    32,000 x 4,096 input table leaves the weight read and the FLOPs, each token reads one row;
    the LM head of the same size is read whole and multiplies the sampled rows only."""
    spec = PRESETS.model("llama-2-7b")
    bw, peak = 2039e6 * 0.776, 312e9 * 0.66
    table = 32000 * 4096
    layers = spec.num_params - 2 * table
    for tokens in (1, 700):
        expected = math.hypot(layers * 2 / bw, 2 * layers * tokens / peak) + tokens * 4096 * 2 / bw
        assert _bare(spec).tokens_ms(tokens) == pytest.approx(expected, rel=1e-12)
    for rows in (1, 64):
        assert _bare(spec).logits_ms(rows) == pytest.approx(math.hypot(table * 2 / bw, 2 * table * rows / peak),
                                                            rel=1e-12)
    # a 700-token prefill passes one row through the LM head, not 700
    prefill = _bare(spec).iteration_ms(Batch(num_prefill=1, prefill_tokens=700))
    assert prefill < _bare(spec).tokens_ms(700) + _bare(spec).logits_ms(2) + 1.0
    # without a declared vocabulary every parameter is read and multiplied by every token
    whole = attrs.evolve(spec, vocab_size=None)
    assert _bare(whole).tokens_ms(1) == pytest.approx(math.hypot(spec.num_params * 2 / bw, 2 * spec.num_params / peak),
                                                      rel=1e-12)
    assert _bare(whole).logits_ms(1) == 0.0


def test_a_tied_table_is_the_lm_head_and_read_whole():
    spec = PRESETS.model("llama-3.2-1b")
    assert spec.embedding_params == 0.0
    bw, peak = 2039e6 * 0.776, 312e9 * 0.66
    table = 128256 * 2048
    layers = spec.num_params - table
    assert _bare(spec).tokens_ms(1) == pytest.approx(math.hypot(layers * 2 / bw, 2 * layers / peak), rel=1e-12)
    assert _bare(spec).logits_ms(1) == pytest.approx(math.hypot(table * 2 / bw, 2 * table / peak), rel=1e-12)


def test_gpt_oss_reads_its_experts_at_mxfp4():
    """One token of gpt-oss-20b (GEMMs at the full 312 TFLOPS, for round numbers): the dense
    weights read at 2 bytes, the 4 experts it is routed to at 0.53125, one embedding row."""
    spec = PRESETS.model("gpt-oss-20b")
    cost = _bare(spec, mfu=1.0, gemm_half_tokens=0.0)
    bw, peak = 2039e6 * 0.776, 312e9
    expert = spec.expert_params
    table = 201088 * 2880
    dense = spec.num_params - 32 * expert - 2 * table
    matmul = spec.params_per_token - 4 * expert - 2 * table
    assert cost.tokens_ms(1) == pytest.approx(
        math.hypot(dense * 2 / bw, 2 * matmul / peak) + math.hypot(4 * expert * 0.53125 / bw, 2 * 4 * expert / peak)
        + 2880 * 2 / bw, rel=1e-12)


def test_the_dense_presets_intermediate_sizes_reproduce_their_parameter_counts():
    # intermediate_size is a second record of the MLP width (TGI's launcher reads it): with the
    # attention shapes, norms and embeddings it must give back each dense checkpoint's parameters
    checked = 0
    for spec, _ in MODELS:
        if spec.num_experts:
            continue
        h = spec.hidden_size
        attention = 2 * h * spec.num_attention_heads * spec.head_dim + 2 * h * spec.num_kv_heads * spec.head_dim
        params = (spec.num_layers * (attention + 3 * h * spec.intermediate_size + 2 * h)
                  + (1 if spec.tied_embeddings else 2) * spec.vocab_size * h + h)
        assert params == pytest.approx(spec.num_params, rel=5e-5), spec.name  # (Qwen's q/k/v biases, norms)
        checked += 1
    assert checked == 18
    assert {s.name: (s.intermediate_size, s.shared_experts) for s, _ in MODELS if s.num_experts}["deepseek-v3"] == (
        18432, 1)


@pytest.mark.parametrize("hf_id, preset", [
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),             # a preset's own id
    ("META-LLAMA/llama-3.1-8b", "llama-3.1-8b"),             # in any case
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),    # a tuned checkpoint of it: the same shapes
    ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),          # preset id meta-llama/Llama-2-7b-hf
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
])
def test_a_hugging_face_id_finds_its_base_models_preset(hf_id, preset):
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    assert presets.model(hf_id).name == preset


def test_an_unknown_hugging_face_id_says_how_to_declare_it():
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    with pytest.raises(ConfigError, match=r"unknown model 'org/new-model' \(a Hugging Face id no preset carries: "
                                          r"declare its config\.json"):
        presets.model("org/new-model")
    with pytest.raises(ConfigError, match="unknown model 'meta-llama/Llama-3.1-70B'"):  # no such preset: not the 8B
        presets.model("meta-llama/Llama-3.1-70B")
