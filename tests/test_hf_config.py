"""A model from its Hugging Face config.json: parameter counts against the checkpoints' own
(published or counted by hand below), the KV layout, quantised weights, TOML and CLI use, and
errors that name the file and the key."""

from __future__ import annotations

import json
import textwrap

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.capacity import ModelSpec, capacity_command
from schedlab.catalog import load_catalog
from schedlab.configs import from_table
from schedlab.errors import ConfigError
from schedlab.hf_config import model_fields
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.presets import MODELS

PRESET = {spec.name: spec for spec, _ in MODELS}

# The shapes of each model's config.json on the Hugging Face hub (only the keys read).
LLAMA_3_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "_name_or_path": "meta-llama/Meta-Llama-3-8B"}
LLAMA_3_2_1B = {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
QWEN2_5_7B = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "intermediate_size": 18944,
              "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
              "tie_word_embeddings": False, "sliding_window": 131072, "use_sliding_window": False}
MIXTRAL_8X7B = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
                "num_experts_per_tok": 2, "tie_word_embeddings": False, "sliding_window": None}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "tie_word_embeddings": False, "use_sliding_window": False,
                 "sliding_window": None}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
               "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
               "first_k_dense_replace": 3, "moe_layer_freq": 1, "topk_method": "noaux_tc", "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
               "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
GPT_OSS_120B = {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "intermediate_size": 2880,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
                "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128, "attention_bias": True,
                "layer_types": ["sliding_attention", "full_attention"] * 18, "tie_word_embeddings": False,
                "quantization_config": {"quant_method": "mxfp4",
                                        "modules_to_not_convert": ["model.layers.*.self_attn", "model.embed_tokens",
                                                                   "lm_head"]}}
GEMMA_2_9B = {"model_type": "gemma2", "num_hidden_layers": 42, "hidden_size": 3584, "intermediate_size": 14336,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
              "sliding_window": 4096, "torch_dtype": "float32"}


def spec(config: dict, name: str = "m") -> ModelSpec:
    """The spec a [models.<name>] table with ``config`` makes (from_table: field errors become ConfigErrors)."""
    return from_table(ModelSpec, {"name": name, **model_fields(config, "config.json")}, where="config.json")


# --- parameter counts: the checkpoints' own -----------------------------------------------------

@pytest.mark.parametrize("config, total", [
    (LLAMA_3_8B, 8_030_261_248),      # the checkpoint's count (model card: 8.03B)
    (LLAMA_3_2_1B, 1_235_814_400),    # tied: one table
    # Q/K/V biases counted: 28 x (28 + 2 x 4) x 128 = 129,024 of them
    (QWEN2_5_7B, 7_615_616_512),
    (MIXTRAL_8X7B, 46_702_792_704),
    # four norms a layer, a tied table (gemma's default when the file says nothing): by hand,
    # 42 x (44,040,192 attention + 14,336 norms + 154,140,672 MLP) + 256,000 x 3,584 + 3,584
    (GEMMA_2_9B, 9_241_705_984),
])
def test_dense_and_moe_counts_are_the_checkpoints(config, total):
    assert spec(config).num_params == total


def test_mixtral_and_qwen3_moe_active_parameters_by_hand():
    # Mixtral: 32 x (41,943,040 attention + 8,192 norms + 32,768 router + 2 x 176,160,768 experts)
    # + 2 x 32,000 x 4,096 + 4,096
    assert spec(MIXTRAL_8X7B).active_params == 12_879_925_248
    q = spec(QWEN3_30B_A3B)
    assert (q.num_params, q.active_params) == (30_532_122_624, 3_353_032_704)
    assert q.num_experts == 128 and q.experts_per_token == 8


def test_deepseek_v3_latent_attention_shared_experts_and_dense_first_layers():
    """By hand: MLA attention a layer = q_a 7168x1536 + norm 1536 + q_b 1536x128x192 + kv_a
    7168x576 + norm 512 + kv_b 512x128x256 + o 128x128x7168 = 187,107,328; 3 dense layers of
    that + 14,336 norms + 3 x 7168 x 18432; 58 MoE layers with 256 + 1 shared experts of 3 x
    7168 x 2048, a router of 7168 x 256 and its 256 biases; two 129,280 x 7,168 tables + a norm.
    The 671,026,419,200 is also the count published for the checkpoint without its MTP module."""
    d = spec(DEEPSEEK_V3)
    assert d.num_params == 671_026_419_200
    assert d.active_params == 3 * 583_483_392 + 58 * (187_121_664 + 9 * 44_040_192 + 1_835_008 + 256) \
        + 2 * 129_280 * 7_168 + 7_168
    assert d.kv_latent_dim == 576 and d.weight_dtype_bytes == 1.0
    # the FP8 checkpoint keeps its embedding and LM head in bf16, as the preset now does (it read
    # them at 1 byte: 232 MB a rank short at TP 8)
    assert d.table_dtype_bytes == PRESET["deepseek-v3"].table_dtype_bytes == 2.0
    # its RoPE part (the query's rotary half meets it; decodes absorbed), and the query/key heads of
    # 128 + 64 against the value heads' 128 (prefill attention)
    assert (d.kv_rope_dim, d.qk_head_dim, d.head_dim) == (64, 192, 128) == (
        PRESET["deepseek-v3"].kv_rope_dim, PRESET["deepseek-v3"].qk_head_dim, PRESET["deepseek-v3"].head_dim)
    assert d.kv_bytes_per_token(8) == d.kv_bytes_per_token(1) == 61 * 576 * 2  # the latent on every rank
    # one routed expert summed over the 58 MoE layers, as the roofline reads it
    assert d.expert_params == 58 * 3 * 7168 * 2048
    # the dense width and the shared expert, as written (TGI's launcher reads them)
    assert (d.intermediate_size, d.shared_experts) == (18432, 1) == (PRESET["deepseek-v3"].intermediate_size,
                                                                     PRESET["deepseek-v3"].shared_experts)


def test_gpt_oss_layers_window_and_mxfp4_experts_match_the_preset():
    g, preset = spec(GPT_OSS_120B), PRESET["gpt-oss-120b"]
    assert (g.sliding_window, g.sliding_window_layers, g.expert_dtype_bytes) == (128, 18, 0.53125)
    assert g.kv_bytes_per_token() == preset.kv_bytes_per_token() == 2 * 18 * 8 * 64 * 2
    # the preset leaves out biases; the file has attention_bias: Q/K/V biases of (64 + 16) x 64 a layer
    assert g.num_params - preset.num_params == 36 * 80 * 64
    assert g.active_params - preset.active_params == 36 * 80 * 64


def test_the_file_reproduces_the_presets_it_was_built_from():
    for config, name in ((LLAMA_3_8B, "llama-3-8b"), (QWEN3_30B_A3B, "qwen3-30b-a3b"),
                         (MIXTRAL_8X7B, "mixtral-8x7b"), (LLAMA_3_2_1B, "llama-3.2-1b")):
        got, want = spec(config, name), PRESET[name]
        for field in ("num_layers", "num_kv_heads", "head_dim", "num_params", "num_attention_heads",
                      "hidden_size", "vocab_size", "tied_embeddings", "num_experts", "experts_per_token",
                      "kv_latent_dim", "sliding_window", "weight_dtype_bytes", "expert_dtype_bytes",
                      "intermediate_size", "shared_experts", "kv_rope_dim", "qk_head_dim"):
            assert getattr(got, field) == getattr(want, field), (name, field)


# --- layout: windows, quantisation, multimodal ---------------------------------------------------

def test_sliding_windows_by_family_and_switched_off():
    assert (spec(GEMMA_2_9B).sliding_window, spec(GEMMA_2_9B).sliding_window_layers) == (4096, 21)
    gemma3 = {**GEMMA_2_9B, "model_type": "gemma3_text", "num_hidden_layers": 48, "sliding_window": 1024}
    assert spec(gemma3).sliding_window_layers == 40  # five of every six
    mistral = {**LLAMA_3_8B, "model_type": "mistral", "sliding_window": 4096}
    assert spec(mistral).sliding_window_layers == 32  # every layer
    assert spec(QWEN2_5_7B).sliding_window is None  # use_sliding_window = false
    assert spec(MIXTRAL_8X7B).sliding_window is None  # null


def test_quantised_checkpoints_and_dtypes():
    awq = {**LLAMA_3_8B, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    assert spec(awq).weight_dtype_bytes == 0.5 + 2 / 128
    gptq8 = {**LLAMA_3_8B, "quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": -1}}
    assert spec(gptq8).weight_dtype_bytes == 1.0
    assert spec(GEMMA_2_9B).weight_bytes_per_param == 2  # a float32 checkpoint is served in 16 bits
    with pytest.raises(ConfigError, match="quant_method 'bitsandbytes' is not read; set weight_dtype_bytes"):
        spec({**LLAMA_3_8B, "quantization_config": {"quant_method": "bitsandbytes"}})
    with pytest.raises(ConfigError, match="torch_dtype: 'int8'"):
        spec({**LLAMA_3_8B, "torch_dtype": "int8"})


def _with_quant(config: dict, q: dict) -> ModelSpec:
    return spec({**config, "quantization_config": q})


def test_fp8_weights_meet_fp8_activations_only_in_w8a8_checkpoints():
    """W8A8 FP8 (vLLM's Fp8LinearMethod, ModelOpt FP8, compressed-tensors with 8-bit float input
    activations) multiplies at the FP8 rate; weight-only FP8, integer and 4-bit schemes do not."""
    assert spec(DEEPSEEK_V3).fp8_activations and spec(DEEPSEEK_V3).weight_dtype_bytes == 1.0
    assert _with_quant(LLAMA_3_8B, {"quant_method": "fbgemm_fp8"}).fp8_activations
    assert _with_quant(LLAMA_3_8B, {"quant_method": "modelopt", "quant_algo": "FP8"}).fp8_activations
    assert not _with_quant(LLAMA_3_8B, {"quant_method": "modelopt", "quant_algo": "NVFP4"}).fp8_activations
    weights = {"num_bits": 8, "type": "float", "strategy": "channel"}
    w8a8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": weights, "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}
    w8a16 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": weights}}}
    int8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {**weights, "type": "int"}, "input_activations": {"num_bits": 8, "type": "int"}}}}
    assert _with_quant(LLAMA_3_8B, w8a8).fp8_activations
    assert not _with_quant(LLAMA_3_8B, w8a16).fp8_activations
    assert not _with_quant(LLAMA_3_8B, int8).fp8_activations
    assert not _with_quant(LLAMA_3_8B, {"quant_method": "awq", "bits": 4, "group_size": 128}).fp8_activations
    assert not spec(LLAMA_3_8B).fp8_activations and not spec(GPT_OSS_120B).fp8_activations
    # a MoE checkpoint with its attention left in 16 bits: FP8 experts only
    experts_only = _with_quant(QWEN3_30B_A3B, {"quant_method": "fp8", "modules_to_not_convert": ["self_attn"]})
    assert experts_only.fp8_activations and experts_only.expert_dtype_bytes == 1.0
    assert experts_only.weight_bytes_per_param == 2
    assert PRESET["deepseek-v3"].fp8_activations


def test_a_multimodal_config_is_read_from_its_text_config():
    wrapped = {"model_type": "llava", "vision_config": {"hidden_size": 1024}, "text_config": LLAMA_3_8B,
               "_name_or_path": "org/vision-model"}
    s = spec(wrapped)
    assert s.num_params == 8_030_261_248 and s.hf_id == "org/vision-model"


def test_hf_id_only_from_a_hub_name():
    assert spec(LLAMA_3_8B).hf_id == "meta-llama/Meta-Llama-3-8B"
    assert spec({**LLAMA_3_8B, "_name_or_path": "/models/llama"}).hf_id is None


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": None}, "missing 'num_hidden_layers' or 'n_layer' or 'num_layers'"),
    ({"hidden_size": "4096"}, "hidden_size: expected a whole number >= 0, got '4096'"),
    ({"num_local_experts": 8}, "8 routed experts but no 'num_experts_per_tok'"),
    ({"vocab_size": 0}, "must be > 0"),
    ({"layer_types": "sliding_attention", "sliding_window": 128}, "layer_types: expected a list of strs"),
    ({"num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": 5}, "mlp_only_layers: expected a list of ints"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": "128"}},
     "quantization_config.group_size: expected a whole number"),
    # a true/false as text was read by bool(): "false" meant true
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings: expected true or false, got 'false'"),
    ({"sliding_window": 4096, "use_sliding_window": "false"}, "use_sliding_window: expected true or false"),
    # a list of the wrong length named fewer window layers in silence
    ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 128},
     r"layer_types: 2 entries for 32 layers \(num_hidden_layers\)"),
    # LFM2's short-convolution layers were read as full attention: K and V per token they do not keep
    ({"layer_types": ["conv", "conv", "full_attention", "conv"] * 8},
     r"layer_types: 'conv' \(layers 0, 1, 3, 4, 5, 7, \.\.\.\) is a kind of layer schedlab does not model"),
    ({"rope_scaling": "yarn"}, r"rope_scaling: expected an object \(\{...\}\), got 'yarn'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "4"}}, "rope_scaling: factor: expected a number > 0"),
    # a number where the family's name goes was read as the family "-inf" or "1000000000.0"
    ({"model_type": float("-inf")}, r'model_type: expected a name such as "llama", got -inf'),
    ({"model_type": 1e9}, r'model_type: expected a name such as "llama", got 1000000000.0'),
    # 0 KV heads was read as every head (a quarter of the sequences a GQA model holds); a hidden size
    # that no head count divides was floored to a head size
    ({"num_key_value_heads": 0}, "num_key_value_heads: a model has at least one KV head, got 0"),
    ({"head_dim": 0}, "head_dim: a head is at least 1 wide, got 0"),
    ({"hidden_size": 4095}, r"hidden_size 4095 does not split into 32 heads \(num_attention_heads\) and no head_dim"),
])
def test_errors_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        spec({**LLAMA_3_8B, **change})


# Older multi-query and GLM configs (the keys vLLM's get_total_num_kv_heads reads), as on the hub.
FALCON_7B = {"model_type": "falcon", "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71,
             "vocab_size": 65024, "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True,
             "bias": False}
FALCON_40B = {"model_type": "falcon", "num_hidden_layers": 60, "hidden_size": 8192, "num_attention_heads": 128,
              "num_kv_heads": 8, "vocab_size": 65024, "new_decoder_architecture": True, "bias": False}
STARCODER = {"model_type": "gpt_bigcode", "n_layer": 40, "n_embd": 6144, "n_head": 48, "n_inner": 24576,
             "n_positions": 8192, "vocab_size": 49152, "multi_query": True}
GLM_4_9B_CHAT = {"model_type": "chatglm", "num_layers": 40, "hidden_size": 4096, "num_attention_heads": 32,
                 "multi_query_attention": True, "multi_query_group_num": 2, "kv_channels": 128,
                 "ffn_hidden_size": 13696, "padded_vocab_size": 151552, "add_qkv_bias": True, "seq_length": 131072}


def test_multi_query_and_glm_configs_have_their_few_kv_heads():
    """Falcon-7B and StarCoder are multi-query (one KV head), GLM-4 two groups: read as every head,
    their KV per token was 71x, 48x and 16x too large. Parameters by hand (biases, norms' biases and
    StarCoder's position table are not counted): Falcon-7B a layer QKV 4544 x (71 + 2) x 64, the
    output 4544^2, the MLP 2 x 4544 x 18176, its LayerNorm 2 x 4544 -- tied 65024 x 4544; GLM-4 a layer
    2 x 4096 x 4096 + 2 x 4096 x 256 + the Q/K/V bias 36 x 128 + the SwiGLU 3 x 4096 x 13696 + two
    norms -- untied 2 x 151552 x 4096 (published: 9,399,951,360 with its final norm)."""
    falcon, falcon_40b, starcoder, glm = (spec(c) for c in (FALCON_7B, FALCON_40B, STARCODER, GLM_4_9B_CHAT))
    assert (falcon.num_kv_heads, falcon.head_dim, falcon.kv_bytes_per_token()) == (1, 64, 2 * 32 * 64 * 2)
    layer = 4544 * 73 * 64 + 4544**2 + 2 * 4544 * 18176 + 2 * 4544
    assert falcon.num_params == 32 * layer + 65024 * 4544 + 4544 and falcon.tied_embeddings
    assert (falcon_40b.num_kv_heads, falcon_40b.kv_bytes_per_token()) == (8, 2 * 60 * 8 * 64 * 2)
    assert (starcoder.num_kv_heads, starcoder.kv_bytes_per_token()) == (1, 2 * 40 * 128 * 2)
    assert starcoder.tied_embeddings and starcoder.max_position_embeddings == 8192
    assert (glm.num_kv_heads, glm.head_dim, glm.kv_bytes_per_token()) == (2, 128, 2 * 40 * 2 * 128 * 2)
    assert glm.num_params == 40 * (2 * 4096**2 + 2 * 4096 * 256 + 36 * 128 + 3 * 4096 * 13696 + 2 * 4096) \
        + 2 * 151552 * 4096 + 4096 == 9_399_951_360
    assert spec({**GLM_4_9B_CHAT, "vocab_size": 151329}).vocab_size == 151552   # the padded table is the one served


@pytest.mark.parametrize("rope, context", [
    (None, 4096),
    ({"rope_type": "linear", "factor": 4.0}, 16384),                      # vLLM scales the length by factor
    ({"type": "dynamic", "factor": 2.0}, 8192),                           # (the older key)
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 4096),   # already scaled
    ({"rope_type": "llama3", "factor": 8.0}, 4096),
    ({"rope_type": "default"}, 4096),
    ({"full_attention": {"rope_type": "linear", "factor": 2.0}, "sliding_attention": {"rope_type": "default"}}, 8192),
])
def test_the_context_is_vllms_default_max_model_len_under_rope_scaling(rope, context):
    """vLLM 0.33's _get_and_verify_max_len: a RoPE factor scales the file's length except for the
    types that keep it (yarn, llama3, longrope, ...); LongRoPE defaults to the original length."""
    config = {**LLAMA_3_8B, "max_position_embeddings": 4096}
    assert spec({**config, "rope_scaling": rope}).max_position_embeddings == context
    assert spec({**config, "rope_parameters": rope}).max_position_embeddings == context   # transformers v5's key
    longrope = {**config, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}
    assert spec(longrope).max_position_embeddings == 4096


# --- TOML and CLI ----------------------------------------------------------------------------------

EXPERIMENT = """
    [workload]
    kind = "synthetic"
    num_requests = 60
    rate = 20
    prompt = {{dist = "uniform", low = 100, high = 900}}
    output = {{dist = "uniform", low = 10, high = 200}}
    [scheduler]
    kind = "vllm"
    [kv_cache]
    kind = "paged"
    model = "{model}"
    gpu = "a100-80gb"
    [cost_model]
    kind = "roofline"
    model = "{model}"
    gpu = "a100-80gb"
    """


def test_a_model_from_its_config_runs_as_its_preset_does(tmp_path):
    """The same shapes by file and by preset: the same run, to the byte of every metric."""
    (tmp_path / "models" / "llama3").mkdir(parents=True)
    (tmp_path / "models" / "llama3" / "config.json").write_text(json.dumps(LLAMA_3_8B))
    by_file = tmp_path / "file.toml"
    by_file.write_text(textwrap.dedent(EXPERIMENT.format(model="my-llama")) + textwrap.dedent("""
        [models.my-llama]
        config = "models/llama3/config.json"
        """))
    by_preset = tmp_path / "preset.toml"
    by_preset.write_text(textwrap.dedent(EXPERIMENT.format(model="llama-3-8b")))
    a = run_experiment(load(by_file)).all_runs()[0]
    b = run_experiment(load(by_preset)).all_runs()[0]
    assert {**a.meta["kv_cache"], "model": "?"} == {**b.meta["kv_cache"], "model": "?"}
    assert a.meta["kv_cache"]["num_blocks"] == 28437  # (0.9 x 80 GiB - 16,060,522,496 B - 1.5 GiB) / 2 MiB
    assert json.dumps(a.metrics, sort_keys=True) == json.dumps(b.metrics, sort_keys=True)  # NaN == NaN
    assert a.metrics["finished"] == 60


def test_keys_beside_config_win_and_errors_name_the_table(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B))
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(EXPERIMENT.format(model="small")) + textwrap.dedent("""
        [models.small]
        config = "config.json"
        num_params = 4e9
        """))
    run = run_experiment(load(path)).all_runs()[0]
    assert run.meta["kv_cache"]["bytes_per_token"] == 128 * 1024  # the file's shapes
    assert run.meta["kv_cache"]["num_blocks"] == 32281  # (0.9 x 80 GiB - 4e9 x 2 B - 1.5 GiB) / 2 MiB
    path.write_text(textwrap.dedent(EXPERIMENT.format(model="small")) + textwrap.dedent("""
        [models.small]
        config = "missing/config.json"
        """))
    with pytest.raises(ConfigError, match=r"exp.toml: \[models.small\]: config: no such file: .*missing/config.json"):
        load(path)
    (tmp_path / "bad.json").write_text("{ not json")
    path.write_text(textwrap.dedent(EXPERIMENT.format(model="small")) + textwrap.dedent("""
        [models.small]
        config = "bad.json"
        """))
    with pytest.raises(ConfigError, match=r"\[models.small\]: config: .*bad.json is not JSON"):
        load(path)
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_3_8B, "num_attention_heads": None}))
    path.write_text(textwrap.dedent(EXPERIMENT.format(model="small")) + textwrap.dedent("""
        [models.small]
        config = "config.json"
        """))
    with pytest.raises(ConfigError, match=r"\[models.small\]: .*config.json: missing 'num_attention_heads'"):
        load(path)


def test_capacity_reads_a_config_or_its_folder(tmp_path):
    catalog = load_catalog(entry_points=False)
    (tmp_path / "DeepSeek-V3").mkdir()
    (tmp_path / "DeepSeek-V3" / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    by_file = capacity_command({"model": str(tmp_path / "DeepSeek-V3" / "config.json"), "gpu": "h200-141gb",
                                "tensor_parallel": 8}, catalog)
    by_folder = capacity_command({"model": str(tmp_path / "DeepSeek-V3"), "gpu": "h200-141gb", "tensor_parallel": 8},
                                 catalog)
    assert by_file == by_folder and by_file.startswith("KV capacity of deepseek-v3 on h200-141gb")
    (tmp_path / "configs").mkdir()   # a file of its own name is named after it, not its folder ("configs")
    (tmp_path / "configs" / "Falcon-7B.json").write_text(json.dumps(FALCON_7B))
    assert capacity_command({"model": str(tmp_path / "configs" / "Falcon-7B.json"), "gpu": "h100-80gb"},
                            catalog).startswith("KV capacity of falcon-7b on h100-80gb")
    # the file's model sizes the cache as the preset does (the preset's 671e9 is the same count, rounded)
    preset = capacity_command({"model": "deepseek-v3", "gpu": "h200-141gb", "tensor_parallel": 8}, catalog)
    assert by_file.splitlines()[1] == preset.splitlines()[1]  # KV per token: the 576-wide latent
    with pytest.raises(ConfigError, match="--model: .*nowhere/config.json"):
        capacity_command({"model": str(tmp_path / "nowhere" / "config.json"), "gpu": "h200-141gb"}, catalog)


def test_spec_fields_are_all_model_spec_fields():
    """Everything the reader fills is a ModelSpec field (a renamed field would fail here first)."""
    names = {a.name for a in attrs.fields(ModelSpec)}
    for config in (LLAMA_3_8B, DEEPSEEK_V3, GPT_OSS_120B, GEMMA_2_9B, QWEN3_30B_A3B):
        assert set(model_fields(config, "config.json")) <= names


def test_a_config_path_given_as_a_model_name_says_how_to_declare_it(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(EXPERIMENT.format(model="models/llama3/config.json")))
    with pytest.raises(ConfigError, match=r"\[models.<name>\] config = 'models/llama3/config.json', then model"):
        load(path)


KEYS = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "vocab_size", "intermediate_size", "moe_intermediate_size", "tie_word_embeddings", "num_local_experts",
        "num_experts", "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace",
        "moe_layer_freq", "mlp_only_layers", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
        "v_head_dim", "sliding_window", "use_sliding_window", "layer_types", "sliding_window_pattern",
        "torch_dtype", "quantization_config", "text_config", "attention_bias", "shared_expert_intermediate_size")
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.integers(2**52, 2**64) | st.floats(allow_nan=False)
                       | st.sampled_from(["llama", "gemma2", "sliding_attention", "bfloat16", "awq", "fp8", "mxfp4"]),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                           st.sampled_from(["quant_method", "bits", "group_size", "num_hidden_layers"]), inner,
                           max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), JSONISH, max_size=4),
       st.sampled_from([{}, LLAMA_3_8B, QWEN3_30B_A3B, DEEPSEEK_V3, GPT_OSS_120B, GEMMA_2_9B]))
def test_any_json_object_gives_a_spec_or_a_config_error(config, base):
    """Whatever a config.json holds (alone or over a real one), the reader returns a valid
    ModelSpec or raises ConfigError naming the file -- never another exception."""
    config = {**base, **config}
    try:
        s = spec(config)
    except ConfigError as exc:
        assert str(exc).startswith("config.json") or str(exc).startswith("m:")
    else:
        assert s.num_params > 0 and s.num_layers >= 1 and s.kv_bytes_per_token() > 0


@pytest.mark.parametrize("first_dense, step, only_dense", [(0, 1, []), (3, 1, []), (1, 2, [5, 9]), (4, 3, [8, 2])])
def test_moe_layer_count_by_hand(first_dense, step, only_dense):
    """12 layers: the MoE ones are i >= first_dense with (i + 1) a multiple of step, less those
    listed dense; a huge layer count is refused at once instead of being walked layer by layer."""
    config = {**QWEN3_30B_A3B, "num_hidden_layers": 12, "first_k_dense_replace": first_dense,
              "decoder_sparse_step": step, "mlp_only_layers": only_dense}
    moe = sum(1 for i in range(12) if i >= first_dense and (i + 1) % step == 0 and i not in only_dense)
    s = spec(config)
    dense = spec({**config, "mlp_only_layers": list(range(12))})
    assert s.num_params - dense.num_params == moe * (128 * 3 * 2048 * 768 + 2048 * 128 - 3 * 2048 * 6144)
    with pytest.raises(ConfigError, match="num_layers: must be <= 2"):
        spec({**config, "num_hidden_layers": 2**62})


# -- review s78: layouts, expert keys and defaults read since -----------------------------------------------------


@pytest.mark.parametrize("change, key", [
    ({"model_type": "falcon_h1", "mamba_d_state": 256, "mamba_n_heads": 128}, "mamba_d_state"),  # Falcon-H1
    ({"model_type": "zamba2", "layers_block_type": ["mamba", "hybrid"] * 16}, "layers_block_type"),
    ({"model_type": "plamo", "ssm_cfg": {"d_state": 16}}, "ssm_cfg"),
    ({"model_type": "jamba", "attn_layer_period": 8, "attn_layer_offset": 4}, "attn_layer_offset"),
    ({"model_type": "jamba", "expert_layer_period": 2}, "expert_layer_period"),
    ({"model_type": "llama", "attn_layer_indices": [9, 18, 27]}, "attn_layer_indices"),   # Bamba's, elsewhere
    ({"model_type": "minimax_text_01", "attn_type_list": [0, 1] * 16}, "attn_type_list"),
])
def test_layouts_schedlab_does_not_read_are_refused(change, key):
    """A hybrid's layers kept in keys not read (Jamba, MiniMax-Text-01, Falcon-H1, Zamba, Plamo)
    were read as 32 attention layers, silently; now the key is named, with how to give the model."""
    with pytest.raises(ConfigError, match=rf"^config.json: {key}: .*Give the model by its keys in "
                                          r"\[models.<name>\] instead of config"):
        spec({**LLAMA_3_8B, **change})


def test_the_gated_deltanet_state_dtype_is_a_mamba_key_read():
    """Qwen3-Next's ``mamba_ssm_dtype`` (its linear layers' state dtype) is read, not refused."""
    config = {"model_type": "qwen3_next", "num_hidden_layers": 8, "hidden_size": 1024, "intermediate_size": 2048,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 1000,
              "mamba_ssm_dtype": "float32"}
    halves = spec({**config, "mamba_ssm_dtype": None})
    assert spec(config).state_bytes - halves.state_bytes == 32 * 128 * 128 * 2   # 4 bytes an element, not 2


@pytest.mark.parametrize("key", ["n_shared_experts", "num_routed_experts", "moe_num_shared_experts"])
def test_expert_counts_under_names_not_read_are_refused(key):
    """Read as dense, ERNIE-4.5-21B-A3B's moe_num_experts came out at 3.35B parameters instead of 21.8B:
    an expert count beside no routed experts read is now named."""
    with pytest.raises(ConfigError, match=rf"^config.json: {key}: 4 experts, but no routed experts are read"):
        spec({**LLAMA_3_8B, key: 4})
    assert spec({**LLAMA_3_8B, key: 0}).num_experts == 0   # (a zero count is a dense model's)


@pytest.mark.parametrize("family", ["cohere2", "exaone4"])
@pytest.mark.parametrize("pattern, sliding", [(4, 24), (2, 16), (8, 28)])
def test_sliding_window_pattern_of_cohere2_and_exaone4(family, pattern, sliding):
    """Cohere2Config / Exaone4Config: layer i slides unless (i + 1) % sliding_window_pattern == 0 --
    of 32 layers, 32 - 32 // pattern slide; the rest keep every token."""
    s = spec({**LLAMA_3_8B, "model_type": family, "sliding_window": 4096, "sliding_window_pattern": pattern})
    assert s.sliding_window_layers == sliding
    assert s.kv_bytes_per_token() == 2 * (32 - sliding) * 8 * 128 * 2


def test_a_sliding_window_pattern_not_coded_is_refused():
    """Other families' patterns are not known: refused, where every layer was taken to slide."""
    with pytest.raises(ConfigError, match=r"^config.json: sliding_window_pattern: how a llama model's layers "
                                          r"alternate .* give layer_types"):
        spec({**LLAMA_3_8B, "sliding_window": 4096, "sliding_window_pattern": 4})
    with pytest.raises(ConfigError, match=r"^config.json: sliding_window_pattern: 'LLLG' as text is not read"):
        spec({**LLAMA_3_8B, "model_type": "exaone4", "sliding_window": 4096, "sliding_window_pattern": "LLLG"})
    # written out as layer_types (EXAONE 4.0's own files), it is read
    types = ["sliding_attention"] * 3 + ["full_attention"]
    s = spec({**LLAMA_3_8B, "model_type": "exaone4", "sliding_window": 4096, "sliding_window_pattern": "LLLG",
              "layer_types": types * 8})
    assert s.sliding_window_layers == 24


@pytest.mark.parametrize("family", ["smollm3", "ernie4_5", "ernie4_5_moe"])
def test_families_tied_by_default(family):
    """transformers' SmolLM3Config, Ernie4_5Config and Ernie4_5_MoeConfig default
    tie_word_embeddings to true (MptConfig too): a file that leaves it out has one table, not two
    (SmolLM3-3B: 128,256 x 2,048 = 263M parameters fewer)."""
    config = {**LLAMA_3_8B, "model_type": family, "hidden_size": 2048, "num_attention_heads": 16,
              "num_key_value_heads": 4, "intermediate_size": 11008, "num_hidden_layers": 36}
    del config["tie_word_embeddings"]
    s = spec(config)
    assert s.tied_embeddings
    assert spec({**config, "tie_word_embeddings": False}).num_params - s.num_params == 128256 * 2048
    from schedlab.hf_config import TIED_BY_DEFAULT
    assert "mpt" in TIED_BY_DEFAULT   # (an MPT file is refused earlier: its n_layers / d_model are not read)
