"""Real config.json files of current models (``tests/data/hf_configs``: the hub's files, trimmed to the
keys that matter) against ground truth worked out by hand: the checkpoints' published parameter
counts, and KV bytes a token written out layer kind by layer kind (2 x KV heads x head_dim x 2 bytes
a full-attention layer; MLA's 576-wide latent x 2 bytes; sliding-window, chunked, cross-attention and
linear-attention layers keep a bounded number of tokens a sequence and are left out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.capacity import ModelSpec, capacity_command
from schedlab.catalog import load_catalog
from schedlab.configs import from_table
from schedlab.errors import ConfigError
from schedlab.hf_config import model_fields

DATA = Path(__file__).parent / "data" / "hf_configs"


def config(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def spec(cfg: dict) -> ModelSpec:
    return from_table(ModelSpec, {"name": "m", **model_fields(cfg, "config.json")}, where="config.json")


def full_kv(layers: int, kv_heads: int, head_dim: int) -> int:
    """K and V of ``layers`` full-attention layers, 2 bytes an element."""
    return 2 * layers * kv_heads * head_dim * 2


# name: (total params, active params or None, KV bytes a token), each by hand or from the model card
EXACT = {
    "llama-3.1-8b": (8_030_261_248, None, full_kv(32, 8, 128)),
    "llama-3.3-70b": (70_553_706_496, None, full_kv(80, 8, 128)),
    "mistral-7b-v0.3": (7_248_023_552, None, full_kv(32, 8, 128)),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248, full_kv(32, 8, 128)),
    "qwen2.5-7b": (7_615_616_512, None, full_kv(28, 4, 128)),
    # the language model of Qwen2.5-VL-7B is Qwen2.5-7B's, Q/K/V biases included (its 8.29B adds the vision tower)
    "qwen2.5-vl-7b": (7_615_616_512, None, full_kv(28, 4, 128)),
    "qwen3-8b": (8_190_735_360, None, full_kv(36, 8, 128)),
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704, full_kv(48, 4, 128)),
    "phi-3.5-mini": (3_821_079_552, None, full_kv(32, 32, 96)),  # its 262,144-token window spans every context
    "phi-4": (14_659_507_200, None, full_kv(40, 10, 128)),
    "gemma-2-9b": (9_241_705_984, None, full_kv(21, 8, 256)),  # 21 of 42 layers slide over 4,096 tokens
    "deepseek-v3": (671_026_419_200, None, 61 * (512 + 64) * 2),  # without the MTP module
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_checkpoint_counts_and_kv_per_token(name):
    total, active, kv = EXACT[name]
    s = spec(config(name))
    assert s.num_params == total
    if active is not None:
        assert s.active_params == active
    assert s.kv_bytes_per_token() == kv


def test_llama_4_scout_shared_expert_and_chunked_layers():
    """Scout: 48 MoE layers, each 16 routed experts + 1 shared one of 3 x 5120 x 8192 and a router
    of 5120 x 16; its RoPE layers (three of four) attend to 8,192-token chunks, the 12 NoPE layers
    to the whole sequence. Read through ``text_config``, without ``moe_layers`` (``interleave_moe_layer_step``)."""
    s = spec(config("llama-4-scout-17b-16e"))
    attn = 2 * 5120 * 40 * 128 + 2 * 5120 * 8 * 128
    expert = 3 * 5120 * 8192
    tables = 2 * 202048 * 5120 + 5120
    assert s.num_params == 48 * (attn + 2 * 5120 + 5120 * 16 + 17 * expert) + tables
    assert s.active_params == 48 * (attn + 2 * 5120 + 5120 * 16 + 2 * expert) + tables
    assert abs(s.num_params / 109e9 - 1) < 0.03  # model card: 109B with the vision tower
    assert abs(s.active_params / 17e9 - 1) < 0.03  # 17B active
    assert s.kv_bytes_per_token() == full_kv(12, 8, 128)
    assert (s.sliding_window, s.sliding_window_layers, s.shared_experts) == (8192, 36, 1)
    assert s.max_position_embeddings == 10_485_760


def test_llama_4_maverick_interleaved_dense_layers():
    """Maverick's shape: every other layer MoE (128 experts), the others a dense MLP of 16,384."""
    cfg = config("llama-4-scout-17b-16e")
    cfg["text_config"] = {**cfg["text_config"], "num_local_experts": 128, "interleave_moe_layer_step": 2}
    s = spec(cfg)
    attn = 2 * 5120 * 40 * 128 + 2 * 5120 * 8 * 128
    expert = 3 * 5120 * 8192
    dense = 24 * (attn + 2 * 5120 + 3 * 5120 * 16384)
    tables = 2 * 202048 * 5120 + 5120
    assert s.num_params == dense + 24 * (attn + 2 * 5120 + 5120 * 128 + 129 * expert) + tables
    assert abs(s.num_params / 400e9 - 1) < 0.03  # model card: 400B total


def test_qwen3_next_gated_attention_and_linear_layers():
    """Qwen3-Next-80B-A3B: 12 gated full-attention layers (q_proj twice as wide: the gate; Q/K norms),
    36 Gated DeltaNet layers, 512 experts of 3 x 2048 x 512 (10 a token) + a shared one and its gate."""
    s = spec(config("qwen3-next-80b-a3b"))
    full = 2048 * 2 * 16 * 256 + 2 * 2048 * 2 * 256 + 16 * 256 * 2048 + 2 * 256
    key, value = 16 * 128, 32 * 128
    linear = (2048 * (2 * key + 2 * value) + 2048 * 2 * 32 + (2 * key + value) * 4 + 2 * 32 + 128
              + value * 2048)
    expert = 3 * 2048 * 512
    common = 2 * 2048 + 2048 * 512 + expert + 2048  # norms, router, shared expert and its gate
    tables = 2 * 151936 * 2048 + 2048
    assert s.num_params == 12 * full + 36 * linear + 48 * (common + 512 * expert) + tables == 79_674_391_296
    assert s.active_params == 12 * full + 36 * linear + 48 * (common + 10 * expert) + tables
    assert abs(s.num_params / 80e9 - 1) < 0.03 and abs(s.active_params / 3.9e9 - 1) < 0.03
    assert s.kv_bytes_per_token() == full_kv(12, 2, 256)
    # a linear layer's state: conv (2 x 2048 + 4096) x 3 + recurrent 32 x 128 x 128, 2 bytes each, in
    # tokens of a full layer's 2 x 2 x 256 x 2 bytes: 536
    assert s.sliding_window_layers == 36
    assert s.sliding_window == -(-((2 * key + value) * 3 * 2 + 32 * 128 * 128 * 2) // (2 * 2 * 256 * 2)) == 536


def test_deepseek_v2_lite_mla_without_q_lora():
    """27 layers, MLA with Q projected directly (no q_lora_rank), 64 routed experts + 2 shared, 6 a
    token, the first layer dense; model card: 15.7B total, 2.4B active (without the embedding table)."""
    s = spec(config("deepseek-v2-lite"))
    attn = 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    expert = 3 * 2048 * 1408
    tables = 2 * 102400 * 2048 + 2048
    moe = 2048 * 64 + 2 * expert
    assert s.num_params == 27 * (attn + 2 * 2048) + 3 * 2048 * 10944 + 26 * (moe + 64 * expert) + tables
    assert s.active_params == 27 * (attn + 2 * 2048) + 3 * 2048 * 10944 + 26 * (moe + 6 * expert) + tables
    assert abs(s.num_params / 15.7e9 - 1) < 0.03
    assert abs((s.active_params - 102400 * 2048) / 2.4e9 - 1) < 0.03
    assert s.kv_bytes_per_token() == s.kv_bytes_per_token(8) == 27 * (512 + 64) * 2


def test_kimi_k2_is_deepseek_v3_shaped():
    """Kimi-K2: 61 layers, 64 MLA heads, 384 routed experts + 1 shared, 8 a token, one dense layer,
    FP8 blocks; model card: 1T total, 32B active."""
    s = spec(config("kimi-k2"))
    attn = 7168 * 1536 + 1536 + 1536 * 64 * 192 + 7168 * 576 + 512 + 512 * 64 * 256 + 64 * 128 * 7168
    expert = 3 * 7168 * 2048
    router = 7168 * 384 + 384
    tables = 2 * 163840 * 7168 + 7168
    base = 61 * (attn + 2 * 7168) + 3 * 7168 * 18432 + tables
    assert s.num_params == base + 60 * (router + 385 * expert) == 1_026_408_232_448
    assert s.active_params == base + 60 * (router + 9 * expert)
    assert abs(s.num_params / 1e12 - 1) < 0.03 and abs(s.active_params / 32e9 - 1) < 0.03
    assert s.kv_bytes_per_token() == 61 * 576 * 2 and s.weight_dtype_bytes == 1.0


def test_glm_4_5_air_biases_and_shared_expert():
    """GLM-4.5-Air: 46 layers (the first dense), 96 heads of 128 / 8 KV heads with Q/K/V biases, 128
    experts of 3 x 4096 x 1408 + 1 shared, 8 a token; model card: 106B total, 12B active (no tables)."""
    s = spec(config("glm-4.5-air"))
    attn = 2 * 4096 * 96 * 128 + 2 * 4096 * 8 * 128 + (96 + 16) * 128
    expert = 3 * 4096 * 1408
    tables = 2 * 151552 * 4096 + 4096
    base = 46 * (attn + 2 * 4096) + 3 * 4096 * 10944 + tables
    assert s.num_params == base + 45 * (4096 * 128 + 129 * expert)
    assert s.active_params == base + 45 * (4096 * 128 + 9 * expert)
    assert abs(s.num_params / 106e9 - 1) < 0.03
    assert abs((s.active_params - 2 * 151552 * 4096) / 12e9 - 1) < 0.03
    assert s.kv_bytes_per_token() == full_kv(46, 8, 128)


@pytest.mark.parametrize("name, layers, experts, total, active", [
    ("gpt-oss-20b", 24, 32, 20.91e9, 3.61e9), ("gpt-oss-120b", 36, 128, 116.83e9, 5.13e9)])
def test_gpt_oss_against_the_model_card(name, layers, experts, total, active):
    """The model card's active count leaves out the embedding table (201,088 x 2,880); biases and
    sinks are not counted (0.03%). Half the layers slide over 128 tokens; experts in MXFP4."""
    s = spec(config(name))
    assert abs(s.num_params / total - 1) < 0.003
    assert abs((s.active_params - 201088 * 2880) / active - 1) < 0.003
    assert s.kv_bytes_per_token() == full_kv(layers // 2, 8, 64)
    assert (s.sliding_window, s.sliding_window_layers, s.expert_dtype_bytes) == (128, layers // 2, 0.53125)


@pytest.mark.parametrize("name, layers, hidden, heads, kv_heads, head_dim, ffn, full_layers, card", [
    ("gemma-3-12b", 48, 3840, 16, 8, 256, 15360, 8, 12.2e9), ("gemma-3-27b", 62, 5376, 32, 16, 128, 21504, 10, 27.4e9)])
def test_gemma_3_text_config_with_transformers_defaults(name, layers, hidden, heads, kv_heads, head_dim, ffn,
                                                        full_layers, card):
    """Gemma 3's saved ``text_config`` leaves out its vocabulary (262,208), the 12B's head_dim (256, not
    3840 / 16) and the 5:1 pattern: transformers' defaults. Four norms a layer, Q/K norms, one tied table;
    the card's count adds a 0.42B vision tower. One layer in six is global; the rest slide over 1,024."""
    s = spec(config(name))
    per_layer = (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 2 * head_dim + 4 * hidden
                 + 3 * hidden * ffn)
    assert s.head_dim == head_dim
    assert s.num_params == layers * per_layer + 262208 * hidden + hidden
    assert abs((s.num_params + 0.42e9) / card - 1) < 0.01
    assert s.kv_bytes_per_token() == full_kv(full_layers, kv_heads, head_dim)
    assert (s.sliding_window, s.sliding_window_layers) == (1024, layers - full_layers)
    assert s.weight_bytes_per_param == 2 and s.max_position_embeddings == 131072


def test_mllama_cross_attention_layers_hold_the_image_not_the_text():
    """Llama-3.2-11B-Vision: 40 layers, 8 of them cross-attention to the image (4 tiles x (40 x 40 + 1)
    patch tokens a sequence): a text token's KV is in the 32 self-attention layers."""
    s = spec(config("llama-3.2-11b-vision"))
    assert s.kv_bytes_per_token() == full_kv(32, 8, 128)
    assert (s.sliding_window, s.sliding_window_layers) == (4 * (40 * 40 + 1), 8)
    assert s.num_params == 40 * (2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 2 * 4096 + 3 * 4096 * 14336) \
        + 2 * 128256 * 4096 + 4096


# --- quantised checkpoints -------------------------------------------------------------------------

@pytest.mark.parametrize("name, field, per_weight", [
    # 4 bits, a 16-bit scale and a 4-bit zero point per 128 weights
    ("qwen2.5-7b-instruct-awq", "weight_dtype_bytes", 0.5 + (2 + 0.5) / 128),
    ("llama-3.1-8b-instruct-gptq-int4", "weight_dtype_bytes", 0.5 + (2 + 0.5) / 128),
    ("qwen3-8b-fp8", "weight_dtype_bytes", 1.0),  # FP8 in 128 x 128 blocks
    ("llama-3.1-8b-instruct-fp8-ct", "weight_dtype_bytes", 1.0),  # compressed-tensors, float, 8 bits
    ("deepseek-v3", "weight_dtype_bytes", 1.0),
    ("gpt-oss-120b", "expert_dtype_bytes", 0.53125),  # 4 bits + an 8-bit scale per 32
])
def test_quantised_weights(name, field, per_weight):
    assert getattr(spec(config(name)), field) == per_weight


def test_compressed_tensors_int4_experts_and_modelopt_nvfp4():
    """Kimi-K2-Thinking's scheme: int4 in groups of 32 (a 16-bit scale each) on the routed experts
    only (attention and shared experts ignored); NVFP4: 4 bits + an FP8 scale per 16."""
    int4 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"]}
    s = spec({**config("kimi-k2"), "quantization_config": int4})
    assert s.expert_dtype_bytes == 0.5 + 2 / 32
    # kept in 16 bits, by hand: every layer's MLA projections (q_a, q_b, kv_a, kv_b, o) and the 60
    # MoE layers' shared expert; the rest -- routed experts, the dense first layer's MLP, norms,
    # routers -- at int4's bytes, the tables at 2
    mla = 7168 * 1536 + 1536 * 64 * 192 + 7168 * 576 + 512 * 64 * 256 + 64 * 128 * 7168
    kept = 61 * mla + 60 * 3 * 7168 * 2048
    tables = 2 * 163840 * 7168
    assert s.weight_bytes() == pytest.approx(2 * kept + (0.5 + 2 / 32) * (s.num_params - tables - kept) + 2 * tables,
                                             rel=1e-7)   # (the final norm: at the mean bytes)
    dense = spec({**config("llama-3.1-8b"), "quantization_config": {**int4, "ignore": ["lm_head"]}})
    assert dense.weight_dtype_bytes == 0.5 + 2 / 32
    nvfp4 = spec({**config("llama-3.1-8b"), "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
    assert nvfp4.weight_dtype_bytes == 0.5 + 1 / 16


def test_a_multimodal_files_outer_dtype_and_quantisation_hold_for_its_text_config():
    cfg = {**config("gemma-3-27b"), "quantization_config": {"quant_method": "fp8"}}
    assert spec(cfg).weight_dtype_bytes == 1.0
    with pytest.raises(ConfigError, match="config.json: torch_dtype: 'int8'"):
        spec({**config("gemma-3-27b"), "torch_dtype": "int8"})


@pytest.mark.parametrize("change, message", [
    ({"config_groups": {"g": {"weights": {"num_bits": "4"}}}},
     "quantization_config.config_groups.g.weights.num_bits: expected a whole number > 0"),
    ({"config_groups": {"a": {"weights": {"num_bits": 8}}, "b": {"weights": {"num_bits": 4}}}},
     r"quantization_config.config_groups: groups of \[0.5, 1.0\] bytes a weight are not read"),
    ({"config_groups": None}, "quantization_config.config_groups: missing"),
])
def test_compressed_tensors_errors_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        spec({**config("llama-3.1-8b"), "quantization_config": {"quant_method": "compressed-tensors", **change}})


@pytest.mark.parametrize("name", sorted(p.stem for p in DATA.glob("*.json")))
def test_every_real_config_sizes_a_kv_pool(name, tmp_path):
    """Each file gives a capacity report at TP 8 (Phi-4's 10 KV heads: TP 2; Qwen2.5-7B's 28
    and AFM-4.5B's and ERNIE-4.5's 20 attention heads: TP 4, as vLLM requires). The files of
    ``refused/`` are refused (:func:`test_hybrid_layouts_in_unread_keys_are_refused`)."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text((DATA / f"{name}.json").read_text())
    tp = 2 if name == "phi-4" else 4 if name.startswith("qwen2.5-") and "7b" in name or name in (
        "afm-4.5b", "ernie-4.5-21b-a3b") else 8   # (20 attention heads)
    text = capacity_command({"model": str(tmp_path / name), "gpu": "h200-141gb", "tensor_parallel": tp},
                            load_catalog(entry_points=False))
    assert text.startswith(f"KV capacity of {name} on h200-141gb")


@pytest.mark.parametrize("stages, per_block", [(1, 2 * 8 * 8 * 256 * 2 * 16),    # the whole model's: 1 MiB
                                               (5, -(-2 * 8 * 8 * 256 * 2 * 10 // 48) * 16)])   # 10 of 48 layers
def test_a_kv_block_holds_every_kv_byte_when_layers_do_not_divide_them(stages, per_block):
    """Gemma-3-12B keeps 65,536 KV bytes a token over 8 of its 48 layers; spread over 48 they are
    1,365.33 a layer: the block used to lose the fraction (63.984 KiB a token), and a pipeline stage
    of 10 layers now takes its share rounded up."""
    from schedlab.capacity import Presets, _pool_numbers
    from schedlab.parallelism import Parallelism

    gpu = Presets.from_catalog(load_catalog(entry_points=False), {}).gpu("h100-80gb")
    s = spec(config("gemma-3-12b"))
    _, _, bytes_per_block, _ = _pool_numbers(s, gpu, 0.9, 1, 0, 16, Parallelism(pipeline_parallel=stages))
    assert bytes_per_block == per_block


@pytest.mark.parametrize("name, per_weight", [("qwen2.5-7b-instruct-awq", 0.5 + (2 + 0.5) / 128),
                                              ("llama-3.1-8b-instruct-gptq-int4", 0.5 + (2 + 0.5) / 128),
                                              ("qwen3-8b-fp8", 1.0)])
def test_a_quantised_checkpoint_keeps_its_embedding_and_lm_head_in_16_bits(name, per_weight):
    """The tables are vocab x hidden each (one when tied); the rest at the quantised bytes. Qwen2.5-7B-AWQ:
    2 x 152,064 x 3,584 = 1.09B params at 2 B, not 0.52 B (its weights were 1.6 GB light)."""
    s = spec(config(name))
    tables = s.vocab_size * s.hidden_size * (1 if s.tied_embeddings else 2)
    assert s.table_dtype_bytes == 2.0
    assert s.weight_bytes() == pytest.approx((s.num_params - tables) * per_weight + tables * 2, rel=1e-12)
    # the roofline reads the LM head at 2 bytes a weight: its work's bytes say so
    from schedlab_plugins.cost_models.work import ModelWork
    work = ModelWork(s)
    assert work.lm_head_bytes == s.vocab_size * s.hidden_size * 2
    # every weight but the looked-up input table (none when tied): the LM head at 2 bytes, the rest quantised
    assert work.dense_bytes == pytest.approx((s.num_params - tables) * per_weight + s.vocab_size * s.hidden_size * 2,
                                             rel=1e-12)


def test_data_parallel_experts_are_spread_at_their_own_bytes():
    """gpt-oss-120b with data_parallel = 2 and expert parallelism: each rank holds its dense weights
    at 2 bytes and half the MXFP4 experts at 0.53125 bytes (they were taken at the KV's 2 bytes)."""
    from schedlab.capacity import Presets, _pool_numbers
    from schedlab.parallelism import Parallelism

    gpu = Presets.from_catalog(load_catalog(entry_points=False), {}).gpu("h100-80gb")
    s = spec(config("gpt-oss-120b"))
    experts = s.expert_params * s.num_experts
    _, weights, _, _ = _pool_numbers(s, gpu, 0.9, 1, 0, 16, Parallelism(data_parallel=2, expert_parallel=True))
    assert weights == pytest.approx((s.num_params - experts) * 2 + experts * 0.53125 / 2, rel=1e-12)


# -- layers of one kind each: Nemotron-H ------------------------------------------------------------------------


def test_nemotron_h_mamba_attention_and_mlp_layers_by_hand():
    """Nemotron-H-56B: 118 layers, each one kind (hybrid_override_pattern): 54 Mamba-2, 10
    attention, 54 relu² MLPs. Only the 10 attention layers keep K and V; a Mamba layer keeps its
    convolution and SSM state, as many bytes as 2,078 tokens of one attention layer."""
    s = spec(config("nemotron-h-56b"))
    inner, conv_dim = 256 * 64, 256 * 64 + 2 * 8 * 256   # mamba heads x head dim; + B and C of 8 groups
    mamba = (8192 * (2 * inner + 2 * 8 * 256 + 256) + conv_dim * (4 + 1) + 3 * 256 + inner + inner * 8192 + 8192)
    attention = 2 * 8192 * 64 * 128 + 2 * 8192 * 8 * 128 + 8192
    mlp = 2 * 8192 * 32768 + 8192
    assert s.num_params == 54 * mamba + 10 * attention + 54 * mlp + 2 * 131072 * 8192 + 8192
    assert s.num_params == pytest.approx(56e9, rel=0.01)   # the name's 56B
    assert s.kv_bytes_per_token() == full_kv(10, 8, 128)
    state = conv_dim * 3 * 2 + 256 * 64 * 256 * 2   # conv_kernel - 1 columns; the SSM state, both in 16 bits
    assert (s.num_layers, s.sliding_window_layers) == (64, 54)
    assert s.sliding_window == -(-state // (2 * 8 * 128 * 2)) == 2078


def test_nemotron_3_nano_moe_layers_and_a_float32_state():
    """Nemotron 3 Nano 30B-A3B: 23 Mamba-2, 6 attention and 23 MoE layers (128 routed experts of
    two matrices, top 6, one shared expert of 3,712); its SSM state in float32."""
    s = spec(config("nemotron-3-nano-30b-a3b"))
    assert s.num_params == pytest.approx(31.6e9, rel=0.01) and s.active_params == pytest.approx(3.58e9, rel=0.01)
    expert = 2 * 2688 * 1856
    assert s.num_params - s.active_params == 23 * (128 - 6) * expert
    assert s.kv_bytes_per_token() == full_kv(6, 2, 128) == 6144
    conv_dim = 64 * 64 + 2 * 8 * 128
    assert s.sliding_window == -(-(conv_dim * 3 * 2 + 64 * 64 * 128 * 4) // 1024) == 2084


def test_a_pattern_that_does_not_spell_the_layers_is_named():
    with pytest.raises(ConfigError, match=r"hybrid_override_pattern: expected one of M, \*, - or E per layer "
                                          r"\(52 layers\), got 'MEM'"):
        spec({**config("nemotron-3-nano-30b-a3b"), "hybrid_override_pattern": "MEM"})


# -- DeepSeek-V3.2's sparse attention, quantised checkpoints ------------------------------------------------------


def test_deepseek_v3_2_keeps_its_indexer_keys_beside_the_latent():
    """DSA's lightning indexer keeps 128 FP8 values and a 4-byte scale per token and layer
    (vLLM's DeepseekV32IndexerCache), beside MLA's 576-wide latent."""
    s = spec(config("deepseek-v3.2"))
    assert s.kv_index_bytes == 132
    assert s.kv_bytes_per_token() == s.kv_bytes_per_token(8) == 61 * (576 * 2 + 132)
    assert spec(config("deepseek-v3")).kv_index_bytes == 0
    # each query attends to the 2,048 keys its indexer of 64 heads of 128 picks
    assert (s.sparse_attention_keys, s.index_heads, s.index_head_dim) == (2048, 64, 128)
    assert spec(config("deepseek-v3")).sparse_attention_keys is None


def test_norms_left_in_16_bits_are_not_attention_left_in_16_bits():
    """GLM-5-FP8 leaves its attention's norms and indexer projection unquantised, not its
    attention: every weight is FP8. A checkpoint that leaves the attention block itself has only
    its experts at FP8."""
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    norms = ["model.layers.0.self_attn.kv_a_layernorm", "model.layers.0.self_attn.indexer.k_norm.bias",
             "model.layers.0.self_attn.indexers_proj", "lm_head"]
    s = spec({**config("deepseek-v3.2"), "quantization_config": {**fp8, "modules_to_not_convert": norms}})
    assert (s.weight_dtype_bytes, s.expert_dtype_bytes) == (1.0, None)
    kept = spec({**config("deepseek-v3.2"), "quantization_config": {**fp8, "ignore": ["re:.*self_attn.*"]}})
    assert kept.expert_dtype_bytes == 1.0
    attention = 61 * (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168)
    tables = 2 * 129280 * 7168
    assert kept.weight_bytes() == pytest.approx(2 * attention + (kept.num_params - tables - attention) + 2 * tables,
                                                rel=1e-7)


@pytest.mark.parametrize("algo, per_weight, w8a8", [
    ("FP8", 1.0, True), ("FP8_PER_CHANNEL_PER_TOKEN", 1.0, True), ("FP8_PB_WO", 1.0, False),
    ("MXFP8", 1 + 1 / 32, True), ("NVFP4", 0.5 + 1 / 16, False),
])
def test_a_modelopt_checkpoint_keeps_its_quantisation_beside_its_config(tmp_path, algo, per_weight, w8a8):
    """NVIDIA's ModelOpt checkpoints write it to hf_quant_config.json, not config.json (vLLM reads
    it there): without it their weights were taken for 16-bit ones, twice the bytes."""
    from schedlab.hf_config import spec_from_path

    (tmp_path / "config.json").write_text(json.dumps(config("llama-3.1-8b")))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algo, "exclude_modules": ["lm_head"]}}))
    s = spec_from_path(str(tmp_path), "--model")
    assert (s.weight_dtype_bytes, s.fp8_activations) == (per_weight, w8a8)
    (tmp_path / "hf_quant_config.json").write_text('{"producer": {"name": "modelopt"}}')
    with pytest.raises(ConfigError, match="hf_quant_config.json: expected a 'quantization' table"):
        spec_from_path(str(tmp_path), "--model")


def test_a_dense_fp8_checkpoint_keeps_the_modules_it_names_in_16_bits():
    """Llama-3.1-405B-FP8 (fbgemm_fp8) leaves every attention projection and its first and last
    layers' MLPs unquantised, naming each module. On Llama-3.3-70B's shape, by hand: attention
    64 x 128 query and output, 8 x 128 keys and values over 8,192 -- 150,994,944 a layer, 80
    layers -- and two MLPs of 3 x 8,192 x 28,672, all at 2 bytes; the rest at 1, the tables at 2.
    A compressed-tensors ``re:`` pattern is matched against every layer's projections."""
    layers = 80
    mods = ["lm_head"] + [f"model.layers.{i}.self_attn.{p}" for i in range(layers)
                          for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    mods += [f"model.layers.{i}.mlp" for i in (0, layers - 1)]
    quant = {"quant_method": "fbgemm_fp8", "modules_to_not_convert": mods}
    cfg = {**config("llama-3.3-70b"), "quantization_config": quant}
    s = spec(cfg)
    kept = 80 * (2 * 8192 * 64 * 128 + 2 * 8192 * 8 * 128) + 2 * 3 * 8192 * 28672
    tables = 2 * 128256 * 8192
    assert s.weight_bytes() == pytest.approx(2 * kept + (s.num_params - tables - kept) + 2 * tables, rel=1e-7)
    assert s.fp8_activations
    pattern = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*self_attn.*"], "config_groups": {
        "g": {"weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float"}}}}
    attention_only = spec({**config("llama-3.3-70b"), "quantization_config": pattern})
    assert attention_only.weight_bytes() == pytest.approx(s.weight_bytes() - 2 * 3 * 8192 * 28672, rel=1e-7)
    plain = spec({**config("llama-3.3-70b"), "quantization_config": {"quant_method": "fbgemm_fp8"}})
    assert plain.weight_dtype_bytes == 1.0


def test_a_moe_checkpoint_keeps_only_the_modules_it_names():
    """DeepSeek-V3.1-NVFP4 (ModelOpt) leaves each layer's attention input projections in 16 bits
    (q_a, q_b, kv_a, kv_b) and quantises the rest -- o_proj, the shared experts, the dense first
    layers' MLPs and the routed experts -- to NVFP4. By hand on DeepSeek-V3's shape."""
    names = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
    exclude = ["lm_head"] + [f"model.layers.{i}.self_attn.{n}" for i in range(61) for n in names] + ["model.layers.61*"]
    s = spec({**config("deepseek-v3"), "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                                               "exclude_modules": exclude}})
    nvfp4 = 0.5 + 1 / 16
    kept = 61 * (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256)
    tables = 2 * 129280 * 7168
    assert s.expert_dtype_bytes == nvfp4
    assert s.weight_bytes() == pytest.approx(2 * kept + nvfp4 * (s.num_params - tables - kept) + 2 * tables, rel=1e-7)


@pytest.mark.parametrize("quant, kv_bytes", [
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, 1),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "fp8"}, 1),
    ({"quant_method": "modelopt", "quant_algo": "FP8",
      "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}, 1),
    ({"quant_method": "modelopt", "quant_algo": "FP8",   # a dynamic scheme: vLLM falls back to auto
      "kv_cache_scheme": {"dynamic": True, "num_bits": 8, "type": "float"}}, None),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}, None),  # not mapped
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, None),
    ({"quant_method": "fp8", "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}, None),
])
def test_a_modelopt_checkpoint_that_asks_for_an_fp8_cache_gets_one_under_auto(quant, kv_bytes):
    """vLLM resolves --kv-cache-dtype auto to fp8_e4m3 for a ModelOpt checkpoint whose
    kv_cache_quant_algo (or static 8-bit float kv_cache_scheme) is FP8 (resolve_kv_cache_dtype_string);
    other methods' schemes bring only scales. Llama-3.1-8B: 2 x 32 layers x 8 heads x 128 elements."""
    s = spec({**config("llama-3.1-8b"), "quantization_config": quant})
    assert s.kv_dtype_bytes == kv_bytes
    assert s.kv_bytes_per_token() == (65_536 if kv_bytes == 1 else 131_072)


def test_hf_quant_config_json_asks_for_the_fp8_cache_too_and_an_explicit_dtype_wins(tmp_path):
    from schedlab.capacity import with_kv_cache_dtype
    from schedlab.hf_config import spec_from_path

    (tmp_path / "config.json").write_text(json.dumps(config("llama-3.1-8b")))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}))
    s = spec_from_path(str(tmp_path), "--model")
    assert s.kv_bytes_per_token() == 65_536
    assert with_kv_cache_dtype(s, "auto").kv_bytes_per_token() == 65_536
    assert with_kv_cache_dtype(s, "bfloat16").kv_bytes_per_token() == 131_072   # --kv-cache-dtype bfloat16


# -- review s78: layouts and keys read since ----------------------------------------------------------------------


@pytest.mark.parametrize("name, key", [("jamba-v0.1", "attn_layer_offset"), ("minimax-text-01", "attn_type_list")])
def test_hybrid_layouts_in_unread_keys_are_refused(name, key):
    """ai21labs/Jamba-v0.1 (attention in layers i % attn_layer_period == attn_layer_offset, the rest
    Mamba: 4 of 32; transformers' configuration_jamba.py) and MiniMaxAI/MiniMax-Text-01 (10 softmax
    layers of 80 in attn_type_list) were read as every layer attention: KV 8x too large, Jamba
    92.1B parameters where it has 51.6B. Refused, naming the key and how to give the model."""
    cfg = json.loads((DATA / "refused" / f"{name}.json").read_text())
    with pytest.raises(ConfigError, match=rf"^config.json: {key}: .*\[models.<name>\] instead of config"):
        spec(cfg)


def mamba2(hidden, heads, head_dim, groups, state, kernel=4):
    """One Mamba-2 mixer by hand: in_proj to x, z, B, C and dt; a biased depthwise conv over x, B, C;
    A_log, D, dt_bias; the gated norm; out_proj."""
    inner, conv_dim = heads * head_dim, heads * head_dim + 2 * groups * state
    return hidden * (2 * inner + 2 * groups * state + heads) + conv_dim * (kernel + 1) + 3 * heads + inner \
        + inner * hidden


def test_bamba_attention_layers_from_attn_layer_indices():
    """ibm-ai-platform/Bamba-9B: attention in layers 9, 18 and 27 only (BambaConfig.layers_block_type),
    the other 29 Mamba-2 (128 heads of 64, state 128); a gated MLP in every layer. 9.78B parameters
    (the model card's 9.8B); KV from 3 layers, 12 KiB a token (it was read as 32 layers: 128 KiB)."""
    s = spec(config("bamba-9b"))
    attention = 2 * 4096 * 4096 + 2 * 4096 * 8 * 128
    layer_rest = 3 * 4096 * 14336 + 2 * 4096   # the MLP and two norms
    assert s.num_params == (29 * mamba2(4096, 128, 64, 1, 128) + 3 * attention + 32 * layer_rest
                            + 2 * 128256 * 4096 + 4096)
    assert s.num_params == pytest.approx(9.8e9, rel=0.005)
    assert s.kv_bytes_per_token() == full_kv(3, 8, 128) == 12 * 1024
    state = (8192 + 2 * 128) * 3 * 2 + 8192 * 128 * 2   # conv's kernel - 1 columns, SSM state, 16 bits each
    assert (s.sliding_window_layers, s.state_bytes) == (29, state)
    assert s.sliding_window == -(-state // (2 * 8 * 128 * 2)) == 525


def test_granite_4_0_h_mamba_layers_from_the_mamba_keys():
    """ibm-granite/granite-4.0-h-small: 36 "mamba" layers are Mamba-2 mixers of the mamba_* keys (they
    were read as Qwen3-Next's Gated DeltaNet with its default sizes, the mamba_* keys changing
    nothing), 4 attention layers; each layer also a MoE block (72 experts of 768, 10 a token) and a
    shared MLP of 1536. 32B parameters and 9B active, as IBM's model card says."""
    s = spec(config("granite-4.0-h-small"))
    mamba = mamba2(4096, 128, 64, 1, 128)
    attention = 2 * 4096 * 4096 + 2 * 4096 * 8 * 128
    expert, shared, router = 3 * 4096 * 768, 3 * 4096 * 1536, 4096 * 72
    common = 36 * mamba + 4 * attention + 40 * (2 * 4096 + router + shared) + 100352 * 4096 + 4096   # tied
    assert s.num_params == common + 40 * 72 * expert
    assert s.active_params == common + 40 * 10 * expert
    assert s.num_params == pytest.approx(32e9, rel=0.01) and s.active_params == pytest.approx(9e9, rel=0.03)
    assert s.kv_bytes_per_token() == full_kv(4, 8, 128)
    # the review's hand count: conv (8192 + 2 x 128) x 3 x 2 + SSM 128 x 64 x 128 x 2 = 2,147,840 B = 525 tokens
    assert (s.sliding_window_layers, s.state_bytes, s.sliding_window) == (36, 2_147_840, 525)
    bigger = spec({**config("granite-4.0-h-small"), "mamba_d_state": 256})
    assert bigger.sliding_window == -(-((8192 + 2 * 256) * 3 * 2 + 8192 * 256 * 2) // 4096) == 1037
    assert bigger.num_params - s.num_params == 36 * (4096 * 2 * 128 + 2 * 128 * 5)
    wider = spec({**config("granite-4.0-h-small"), "mamba_n_heads": 64, "mamba_d_head": 128})
    assert s.num_params - wider.num_params == 36 * (4096 * 64 + 3 * 64)
    # transformers 5.20 saves these layers as "linear_attention" (GraniteMoeHybridConfig.layers_block_type)
    renamed = [("linear_attention" if t == "mamba" else t) for t in config("granite-4.0-h-small")["layer_types"]]
    assert spec({**config("granite-4.0-h-small"), "layer_types": renamed}) == s


def test_a_dense_granite_4_0_h_has_its_shared_mlp_as_the_mlp():
    """num_local_experts 0 (Granite-4.0-H-Micro's layout): the layer's MLP is its shared MLP of
    shared_intermediate_size (transformers' GraniteMoeHybridDecoderLayer), not intermediate_size."""
    dense = spec({**config("granite-4.0-h-small"), "num_local_experts": 0, "num_experts_per_tok": 0})
    moe = spec(config("granite-4.0-h-small"))
    assert moe.num_params - dense.num_params == 40 * (72 * 3 * 4096 * 768 + 4096 * 72)
    assert dense.num_experts == 0


@pytest.mark.parametrize("family, kind", [("minimax", "linear_attention"), ("llama", "mamba"),
                                          ("lfm2", "linear_attention")])
def test_recurrent_layer_types_outside_the_families_read_are_refused(family, kind):
    """A "linear_attention" or "mamba" layer is sized from Qwen3-Next's / Qwen3.5's linear_* keys or
    Granite-4.0-H's / Bamba's mamba_* keys; elsewhere (MiniMax's lightning attention) it is refused."""
    cfg = {**config("llama-3.1-8b"), "model_type": family, "layer_types": [kind, "full_attention"] * 16}
    with pytest.raises(ConfigError, match=rf"layer_types: '{kind}' layers in a {family} model"):
        spec(cfg)


def test_command_r7b_slides_three_layers_of_four():
    """CohereForAI/c4ai-command-r7b-12-2024: sliding_window_pattern 4 -- layers 3, 7, ... full, the
    other 24 a window (Cohere2Config, transformers 5.20) of 4,096 + 1 tokens (vLLM commandr.py).
    KV 8 x 2 x 8 x 128 x 2 = 32 KiB a token: it was read as 32 sliding layers, counted whole (128 KiB)."""
    s = spec(config("command-r7b"))
    assert s.kv_bytes_per_token() == full_kv(8, 8, 128) == 32 * 1024
    assert (s.sliding_window_layers, s.sliding_window) == (24, 4097)
    unset = {k: v for k, v in config("command-r7b").items() if k != "sliding_window_pattern"}
    assert spec(unset).sliding_window_layers == 24   # Cohere2Config's default pattern: 4


def test_ernie_4_5_moe_keys_under_their_own_names():
    """baidu/ERNIE-4.5-21B-A3B: 64 experts (moe_num_experts) of 3 x 2560 x 1536, 6 a token (moe_k),
    2 shared (moe_num_shared_experts: one MLP of 2 x 1536), in layers 1-27 (moe_layer_start_index 1);
    layer 0 a dense MLP of 12,288; tied tables. 21.8B parameters, 3B active (it was read as a 3.35B
    dense model)."""
    s = spec(config("ernie-4.5-21b-a3b"))
    attention = 2 * 2560 * 20 * 128 + 2 * 2560 * 4 * 128
    expert = 3 * 2560 * 1536
    base = 28 * (attention + 2 * 2560) + 3 * 2560 * 12288 + 103424 * 2560 + 2560
    moe = 2560 * 64 + 2 * expert
    assert s.num_params == base + 27 * (moe + 64 * expert)
    assert s.active_params == base + 27 * (moe + 6 * expert)
    assert s.num_params == pytest.approx(21.8e9, rel=0.005) and s.active_params == pytest.approx(3e9, rel=0.15)
    assert (s.num_experts, s.experts_per_token, s.shared_experts, s.moe_layers) == (64, 6, 2, 27)
    # moe_layer_end_index: layers past it are dense (Ernie4_5_MoeDecoderLayer)
    cut = spec({**config("ernie-4.5-21b-a3b"), "moe_layer_end_index": 13})
    assert cut.moe_layers == 13
    assert s.num_params - cut.num_params == 14 * (moe + 64 * expert - 3 * 2560 * 12288)


@pytest.mark.parametrize("name, ffn, published", [
    ("nemotron-mini-4b", 9216, 4.19e9),   # nvidia/Nemotron-Mini-4B-Instruct model card: 4.19B
    ("afm-4.5b", 18432, 4.62e9),          # arcee-ai/AFM-4.5B: 4.5B by name, 4.62B counted
    ("apertus-8b", 21504, 8.05e9),        # swiss-ai/Apertus-8B-2509: 8.05B
    ("persimmon-8b", 16384, 9.3e9),       # adept/persimmon-8b-base: 9.3B
])
def test_ungated_mlp_families(name, ffn, published):
    """Nemotron's, Arcee's and Apertus's MLPs (relu² / xIELU) and Persimmon's are up and down only
    (transformers' NemotronMLP, ArceeMLP, ApertusMLP, PersimmonMLP): one matrix fewer than a gated
    MLP of the same width, in every layer."""
    cfg = config(name)
    s = spec(cfg)
    gated = spec({**cfg, "model_type": "llama"})
    qk_norm = 2 * 128 * 32 if name == "apertus-8b" else 0   # Apertus's per-head q_norm and k_norm
    assert gated.num_params - s.num_params == cfg["num_hidden_layers"] * cfg["hidden_size"] * ffn - qk_norm
    assert s.num_params == pytest.approx(published, rel=0.02)


def test_nemotron_mini_4b_by_hand():
    """Nemotron-Mini-4B: 32 layers of 2 x 3072 x 3072 + 2 x 3072 x 1024 attention and a 2 x 3072 x
    9216 MLP, untied tables of 256,000: 4,190,309,376 (the model card's 4.19B)."""
    layer = 2 * 3072 * 3072 + 2 * 3072 * 1024 + 2 * 3072 * 9216 + 2 * 3072
    assert spec(config("nemotron-mini-4b")).num_params == 32 * layer + 2 * 256000 * 3072 + 3072 == 4_190_309_376


def test_a_recurrent_state_per_rank_and_kv_dtype():
    """Qwen3-Next's Gated DeltaNet state (1,097,728 B a layer and sequence) is 536 tokens of a full
    layer's 2 x 2 x 256 x 2 B at TP 1. vLLM splits the state over the ranks (gated_delta_net_state_shape)
    while the 2 KV heads are replicated past TP 2: at TP 4 a rank keeps 274,432 B = 268 tokens of its
    1 x 256 x 2 x 2 B (it was 536: twice the state); at TP 8, 134. An fp8 KV cache does not shrink the
    state (vLLM's mamba_cache_dtype follows the model): 1,072 tokens of 1,024 B."""
    from schedlab.capacity import Presets, size_kv_cache, with_kv_cache_dtype

    s = spec(config("qwen3-next-80b-a3b"))
    state = (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 2
    assert s.state_bytes == state == 1_097_728
    assert [s.window_tokens(tp) for tp in (1, 2, 4, 8)] == [536, 536, -(-state // 4 // 1024), -(-state // 8 // 1024)]
    assert s.window_tokens(4) == 268 and s.window_tokens(8) == 134
    fp8 = with_kv_cache_dtype(s, "fp8")
    assert fp8.sliding_window == fp8.window_tokens(1) == state // (2 * 2 * 256) == 1072
    assert fp8.window_tokens(4) == 536
    gpu = Presets.from_catalog(load_catalog(entry_points=False), {}).gpu("h200-141gb")
    assert size_kv_cache(s, gpu, tensor_parallel=4).window.tokens == 268
    assert size_kv_cache(fp8, gpu, tensor_parallel=2).window.tokens == 548_864 // (2 * 1 * 256 * 1) == 1072
    # the roofline's decode reads each rank's state once a layer: 36 layers x 1,097,728 / 4 B at TP 4 (it
    # read 36 x 536 tokens x 1,024 B, twice that)
    from schedlab_plugins.cost_models.work import ModelWork

    assert s.sliding_window_layers == 36
    assert ModelWork(s, tensor_parallel=4).window_bytes_per_decode == 36 * 268 * 1024 == 36 * state // 4
    # a window's tokens are the window's at any TP and dtype
    gemma = spec(config("gemma-2-9b"))
    assert gemma.state_bytes is None
    assert gemma.window_tokens(8) == with_kv_cache_dtype(gemma, "fp8").sliding_window == 4096


def test_a_mamba_state_under_an_fp8_cache_a_checkpoint_asks_for():
    """Nemotron 3 Nano's Mamba-2 state -- conv (64 x 64 + 2 x 8 x 128) x 3 x 2 B + SSM 64 x 64 x 128 x 4 B
    (float32) = 2,134,016 B -- is 2,084 tokens of a layer's 2 x 2 x 128 x 2 B KV; a ModelOpt checkpoint
    asking for an FP8 cache (kv_cache_quant_algo) keeps the state as it is, so it is 4,168 tokens of
    1-byte KV (it was halved with the KV). Under --kv-cache-dtype fp8 likewise."""
    from schedlab.capacity import with_kv_cache_dtype

    state = (64 * 64 + 2 * 8 * 128) * 3 * 2 + 64 * 64 * 128 * 4
    s = spec(config("nemotron-3-nano-30b-a3b"))
    assert (s.state_bytes, s.sliding_window) == (state, 2084)
    fp8 = spec({**config("nemotron-3-nano-30b-a3b"),
                "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})
    assert fp8.kv_element_bytes == 1 and fp8.sliding_window == -(-state // (2 * 2 * 128)) == 4168
    assert with_kv_cache_dtype(s, "fp8").sliding_window == 4168
    assert with_kv_cache_dtype(s, "fp8").sliding_window * fp8.kv_bytes_per_token() // 6 >= state
