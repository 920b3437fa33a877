"""KV-capacity arithmetic, the model/GPU presets and the roofline cost model.

Expected values are written out from the preset constants (config.json values, datasheet
numbers), never computed with the code under test.
"""

from __future__ import annotations

import argparse
import math
import textwrap

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.capacity import (
    GIB,
    KIB,
    MIB,
    GpuSpec,
    ModelSpec,
    Presets,
    add_capacity_arguments,
    capacity_command,
    concurrency,
    format_capacity,
    size_kv_cache,
)
from schedlab.catalog import load_catalog
from schedlab.configs import FieldError, from_table
from schedlab.errors import ConfigError, UnknownPluginError
from schedlab.model import Request
from schedlab.protocols import Batch, CostModel
from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel, build_roofline
from schedlab_plugins.cost_models.step_overhead import GPU_ONLY
from schedlab_plugins.presets import GPUS, MODELS, as_registered

MODEL = {spec.name: spec for spec, _ in MODELS}
GPU = {spec.name: as_registered(spec, note)[0] for spec, note in GPUS}  # with measured efficiencies

# Public constants the expectations below are written from.
LLAMA3_8B_PARAMS = 8_030_261_248
LLAMA3_70B_PARAMS = 70_553_706_496
A100_80_BW_GBPS = 2039
A100_80_TFLOPS = 312


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(entry_points=False)


@pytest.fixture(scope="module")
def presets(catalog):
    return Presets.from_catalog(catalog)


# --- engines.md §7 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, per_token, per_block",
    [
        ("llama-2-7b", 512 * KIB, 8 * MIB),
        ("llama-3-8b", 128 * KIB, 2 * MIB),
        ("llama-3-70b", 320 * KIB, 5 * MIB),
    ],
)
def test_kv_bytes_match_engines_doc(presets, name, per_token, per_block):
    model = presets.model(name)
    assert model.kv_bytes_per_token() == per_token
    roomy = GpuSpec("roomy", memory_gib=1024, hbm_bandwidth_gbps=1000, bf16_tflops=100, host_link_gbps=32)
    sizing = size_kv_cache(model, roomy, block_size=16)
    assert sizing.bytes_per_token == per_token
    assert sizing.bytes_per_block == per_block


def test_other_model_kv_bytes():
    # 2 * layers * kv_heads * head_dim * 2 bytes
    assert MODEL["llama-2-13b"].kv_bytes_per_token() == 2 * 40 * 40 * 128 * 2  # 800 KiB
    assert MODEL["mistral-7b"].kv_bytes_per_token() == 128 * KIB
    assert MODEL["qwen2.5-7b"].kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2  # 56 KiB


def test_presets_are_registered_with_notes(catalog):
    assert {"llama-2-7b", "llama-2-13b", "llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2.5-7b"} <= set(
        catalog["model"].names())
    assert {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "l4"} <= set(catalog["gpu"].names())
    for entry in list(catalog["model"]) + list(catalog["gpu"]):
        assert isinstance(entry.factory, (ModelSpec, GpuSpec))
        assert entry.factory.name == entry.name == entry.name.lower()
        assert "datasheet" in entry.help or "config.json" in entry.help


# --- sizing ----------------------------------------------------------------------------------


def test_num_blocks_llama3_8b_on_a100_80gb():
    sizing = size_kv_cache(MODEL["llama-3-8b"], GPU["a100-80gb"], gpu_memory_utilization=0.9,
                           activation_reserve_gib=1.5, block_size=16)
    usable = 72 * GIB  # 80 GiB * 0.9
    weights = LLAMA3_8B_PARAMS * 2
    reserve = 3 * GIB // 2
    per_block = 16 * 128 * KIB
    assert sizing.usable_bytes == usable
    assert sizing.weight_bytes == weights
    assert sizing.reserve_bytes == reserve
    assert sizing.kv_pool_bytes == usable - weights - reserve == 59_638_276_096
    assert sizing.num_blocks == (usable - weights - reserve) // per_block == 28437
    assert sizing.tokens == 28437 * 16


@pytest.mark.parametrize("tensor_parallel, logged", [(1, 216_720), (2, 554_704)])
def test_the_pool_is_within_two_percent_of_vllms_own_log(tensor_parallel, logged):
    """Measured, not computed: "GPU KV cache size: N tokens" in vLLM 0.11.1's start-up logs of
    Llama-3.1-8B on an RTX A6000 (--enforce-eager, 2,048 batched tokens, gpu_memory_utilization
    0.9), LLMServingSim 2.0's power runs (../shared/calibration/energy/llmservingsim-power/raw_data/
    vllm_pulse_power_tp1.txt and _tp2.txt). The fixed reserve leaves 1.1% more tokens than vLLM
    kept on both; the reserve's docstring says where that comes from."""
    sizing = size_kv_cache(MODEL["llama-3.1-8b"], GPU["rtx-a6000"], tensor_parallel=tensor_parallel)
    assert abs(sizing.tokens / logged - 1) <= 0.02


def test_tensor_parallel_halves_kv_and_weights_per_rank():
    model = MODEL["llama-3-70b"]
    assert model.kv_bytes_per_token(2) == 160 * KIB
    assert model.weight_bytes(2) == LLAMA3_70B_PARAMS * 2 / 2
    assert model.kv_bytes_per_token(8) == 40 * KIB  # one KV head per rank
    # More ranks than KV heads: each rank keeps one (replicated) head, as vLLM does.
    assert model.kv_bytes_per_token(16) == 40 * KIB
    assert MODEL["llama-2-7b"].kv_bytes_per_token(2) == 256 * KIB


def test_num_blocks_with_tensor_parallel():
    sizing = size_kv_cache(MODEL["llama-3-70b"], GPU["h100-80gb"], tensor_parallel=4,
                           activation_reserve_gib=1.5)
    per_block = 16 * (2 * 80 * 2 * 128 * 2)  # 2 of 8 KV heads per rank
    usable = 81559 * 2**20 * 9 // 10  # the H100's 81,559 MiB x 0.9
    expected = (usable - LLAMA3_70B_PARAMS * 2 // 4 - 3 * GIB // 2) // per_block
    assert per_block == 1280 * KIB
    assert sizing.num_blocks == expected == 30579


def test_uneven_head_split_is_rejected():
    with pytest.raises(ConfigError, match="cannot be split evenly"):
        MODEL["llama-3-8b"].kv_bytes_per_token(3)
    with pytest.raises(ConfigError, match="not a multiple"):
        MODEL["qwen2.5-7b"].kv_bytes_per_token(6)  # 4 KV heads
    # the attention heads too (they ran: Qwen2.5-7B's 28 at TP 8, Llama-3-70B's 64 at TP 128)
    with pytest.raises(ConfigError, match=r"^qwen2\.5-7b: 28 attention heads cannot be split evenly over "
                                          r"tensor_parallel=8 \(vLLM refuses it too\); use a tensor_parallel "
                                          r"that divides 28$"):
        MODEL["qwen2.5-7b"].kv_bytes_per_token(8)
    with pytest.raises(ConfigError, match="64 attention heads cannot be split evenly over tensor_parallel=128"):
        MODEL["llama-3-70b"].kv_bytes_per_token(128)
    assert MODEL["qwen2.5-7b"].kv_bytes_per_token(4) == 2 * 28 * 1 * 128 * 2  # K and V, 28 layers, 1 head a rank


def test_model_that_does_not_fit_says_by_how_much():
    with pytest.raises(ConfigError) as info:
        size_kv_cache(MODEL["llama-3-70b"], GPU["a100-40gb"], activation_reserve_gib=1.5)
    message = str(info.value)
    short = LLAMA3_70B_PARAMS * 2 + 3 * GIB // 2 + 5 * MIB - 36 * GIB
    assert f"falls short by {short / GIB:.2f} GiB" in message  # 96.92 GiB
    assert "tensor_parallel = 4" in message  # 2 ranks still need 65.7 GiB each
    assert "llama-3-70b" in message and "a100-40gb" in message


def test_model_that_fits_nowhere_suggests_a_bigger_gpu():
    huge = ModelSpec("huge", num_layers=8, num_kv_heads=8, head_dim=128, num_params=500e9)
    with pytest.raises(ConfigError, match="GPU with more memory"):
        size_kv_cache(huge, GPU["l4"])


@pytest.mark.parametrize("kwargs", [
    {"gpu_memory_utilization": 0.0}, {"gpu_memory_utilization": 1.5}, {"block_size": 0},
    {"tensor_parallel": 0}, {"activation_reserve_gib": -1.0},
])
def test_bad_sizing_arguments(kwargs):
    with pytest.raises(ConfigError):
        size_kv_cache(MODEL["llama-3-8b"], GPU["a100-80gb"], **kwargs)


def test_concurrency_average_vs_p99():
    sizing = size_kv_cache(MODEL["llama-3-8b"], GPU["a100-80gb"], activation_reserve_gib=1.5)
    assert sizing.num_blocks == 28437
    assert concurrency(sizing, 1000) == 28437 // 63  # ceil(1000 / 16) = 63 blocks -> 451
    assert concurrency(sizing, 8000) == 28437 // 500 == 56
    assert concurrency(sizing, 16) == 28437
    assert concurrency(sizing, 17) == 28437 // 2
    with pytest.raises(ConfigError):
        concurrency(sizing, 0)


def test_format_capacity_shows_the_derivation():
    sizing = size_kv_cache(MODEL["llama-3-8b"], GPU["a100-80gb"], activation_reserve_gib=1.5)
    text = format_capacity(sizing, avg_tokens=1000, p99_tokens=8000)
    assert "= 128 KiB" in text
    assert "= 2 MiB" in text
    assert "72.00 GiB" in text
    assert "= 28437" in text
    assert f"= {28437 * 16} tokens" in text
    assert "-> 451 sequences" in text
    assert "-> 56 sequences" in text
    assert "8.1x fewer" in text  # 451 / 56


def test_format_capacity_when_a_p99_sequence_does_not_fit():
    sizing = size_kv_cache(MODEL["qwen2.5-7b"], GPU["l4"], activation_reserve_gib=1.5)
    text = format_capacity(sizing, avg_tokens=100, p99_tokens=sizing.tokens + 1)
    assert "not even one" in text


def test_the_models_context_against_the_pool():
    """vLLM's start-up check: one max_model_len sequence must fit in the pool. Llama-3.1-8B on an
    L4 (23,034 MiB): floor(23,034 MiB x 0.9) = 21,737,609,625 B, minus 2 x 8,030,261,248 B of
    weights and 1.5 GiB, is 4,066,474,393 B = 1,939 blocks of 2 MiB = 31,024 tokens, against its
    131,072-token context."""
    l4 = format_capacity(size_kv_cache(MODEL["llama-3.1-8b"], GPU["l4"], activation_reserve_gib=1.5), p99_tokens=200_000)
    assert "131072 tokens (vLLM's default max_model_len) do not fit in the pool" in l4
    assert "--max-model-len <= 31024 (or auto)" in l4
    assert "longer than the model's context, 131072" in l4
    a100 = format_capacity(size_kv_cache(MODEL["llama-2-7b"], GPU["a100-80gb"], activation_reserve_gib=1.5),
                           avg_tokens=4096, p99_tokens=4097)
    assert "4096 tokens (vLLM's default max_model_len) fit in the pool" in a100
    assert a100.count("longer than the model's context") == 1  # the p99 only (4,097 > 4,096)


def test_capacity_command_with_argparse(catalog):
    parser = argparse.ArgumentParser()
    add_capacity_arguments(parser)
    args = parser.parse_args(["--model", "Llama-3-8B", "--gpu", "a100-80gb", "--activation-reserve-gib", "1.5",
                              "--avg-tokens", "1000", "--p99-tokens", "8000"])
    text = capacity_command(args, catalog)
    assert "= 28437" in text and "-> 56 sequences" in text
    assert capacity_command({"model": "llama-3-8b", "gpu": "a100-80gb", "activation_reserve_gib": 1.5},
                            catalog).count("\n") == 10
    with pytest.raises(UnknownPluginError, match="did you mean 'a100-80gb'"):
        capacity_command({"model": "llama-3-8b", "gpu": "a100-80g"}, catalog)
    # a name cut short is completed before a near spelling of another ('h200' is not 'b200')
    with pytest.raises(UnknownPluginError, match="did you mean 'h200-141gb'"):
        capacity_command({"model": "llama-3-8b", "gpu": "h200"}, catalog)


def test_capacity_sizes_a_pipeline_stage_and_a_data_parallel_rank(catalog):
    """schedlab capacity had only --tensor-parallel, though a run sizes a stage's pool (its layers'
    KV, its share of the weights) and a DP rank's (the routed experts spread over every rank)."""
    import re

    def numbers(text):
        per_token = float(re.search(r"KV per token .* = ([0-9.]+) KiB", text).group(1))
        weights = float(re.search(r"weights .* = ([0-9.]+) GiB", text).group(1))
        return per_token, weights

    base = {"model": "qwen3-30b-a3b", "gpu": "h100-80gb"}
    one = capacity_command(base, catalog)
    stage = capacity_command({**base, "pipeline_parallel": 2}, catalog)
    rank = capacity_command({**base, "data_parallel": 2, "expert_parallel": True}, catalog)
    assert "(tensor_parallel=1, pipeline_parallel=2, block_size=16, 2-byte weights and KV, every number a " \
           "stage's)" in stage
    assert "x 24 / 48 layers (the largest of 2 stages) = 48 KiB" in stage and "x 2 B / 2 stages = " in stage
    assert "every number a data-parallel rank's" in rank and "the routed experts over 2 GPUs" in rank
    (kv1, w1), (kv2, w2), (kv3, w3) = numbers(one), numbers(stage), numbers(rank)
    model = MODEL["qwen3-30b-a3b"]
    experts_gib = model.expert_params * model.num_experts * 2 / 2 ** 30
    assert (kv2, kv3) == (kv1 / 2, kv1)
    assert w2 == pytest.approx(w1 / 2, abs=0.01) and w3 == pytest.approx(w1 - experts_gib / 2, abs=0.01)
    with pytest.raises(ConfigError, match=r"^--data-parallel 2: ranks that share experts are a MoE model's"):
        capacity_command({"model": "llama-3-8b", "gpu": "h100-80gb", "data_parallel": 2}, catalog)
    with pytest.raises(ConfigError, match=r"^--expert-parallel: spreads experts over data-parallel ranks: give "
                                          r"--data-parallel 2 or more"):
        capacity_command({**base, "expert_parallel": True}, catalog)
    with pytest.raises(ConfigError, match=r"^--pipeline-parallel = 64 exceeds the model's 48 layers"):
        capacity_command({**base, "pipeline_parallel": 64}, catalog)


# --- presets lookup and TOML declarations -------------------------------------------------------


def test_custom_specs_from_toml_tables(catalog):
    table = {"name": "tiny", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "num_params": 1e8}
    tiny = from_table(ModelSpec, table, where="lab.toml: [models.tiny]")
    assert tiny.kv_bytes_per_token() == 2 * 2 * 2 * 64 * 2
    card = from_table(GpuSpec, {"name": "card", "memory_gib": 16, "hbm_bandwidth_gbps": 500,
                                "bf16_tflops": 100, "host_link_gbps": 16}, where="lab.toml: [gpus.card]")
    presets = Presets.from_catalog(catalog, {"tiny": tiny, "card": card})
    assert presets.model("tiny") is tiny and presets.gpu("card") is card
    assert presets.model("llama-3-8b") == MODEL["llama-3-8b"]
    assert "tiny" in presets.model_names() and "card" in presets.gpu_names()
    with pytest.raises(UnknownPluginError, match="known: .*tiny"):
        presets.model("small")


def test_bad_custom_specs(catalog):
    with pytest.raises(ConfigError, match=r"lab.toml: \[models.x\]: num_layers"):
        from_table(ModelSpec, {"name": "x", "num_layers": 0, "num_kv_heads": 1, "head_dim": 8, "num_params": 1e6},
                   where="lab.toml: [models.x]")
    with pytest.raises(ConfigError, match="built-in model preset"):
        Presets.from_catalog(catalog, {"llama-3-8b": attrs.evolve(MODEL["llama-3-8b"], num_layers=1)})
    with pytest.raises(ConfigError, match="ModelSpec or a GpuSpec"):
        Presets.from_catalog(catalog, {"x": {"num_layers": 1}})


# --- hypothesis: sizing invariants ----------------------------------------------------------------


def _blocks(model, memory_gib, utilization, reserve_gib, tp):
    gpu = GpuSpec("g", memory_gib=memory_gib, hbm_bandwidth_gbps=1000, bf16_tflops=100, host_link_gbps=32)
    try:
        return size_kv_cache(model, gpu, gpu_memory_utilization=utilization,
                             activation_reserve_gib=reserve_gib, tensor_parallel=tp).num_blocks
    except ConfigError as exc:
        assert "does not fit" in str(exc)
        return 0


models = st.sampled_from(sorted(MODEL.values(), key=lambda m: m.name))
#: a model and a tensor-parallel degree that splits its attention heads (Qwen2.5-7B's 28 not 8)
layouts = models.flatmap(lambda m: st.tuples(st.just(m), st.sampled_from(
    [tp for tp in (1, 2, 4, 8) if not m.num_attention_heads or m.num_attention_heads % tp == 0])))
memories = st.floats(1.0, 300.0)
utilizations = st.floats(0.01, 1.0)
reserves = st.floats(0.0, 20.0)


@settings(max_examples=150, deadline=None)
@given(layouts, memories, memories, utilizations, utilizations, reserves, reserves)
def test_num_blocks_is_monotone(layout, mem_a, mem_b, util_a, util_b, res_a, res_b):
    model, tp = layout
    mem_lo, mem_hi = sorted((mem_a, mem_b))
    util_lo, util_hi = sorted((util_a, util_b))
    res_lo, res_hi = sorted((res_a, res_b))
    assert _blocks(model, mem_lo, util_a, res_a, tp) <= _blocks(model, mem_hi, util_a, res_a, tp)
    assert _blocks(model, mem_a, util_lo, res_a, tp) <= _blocks(model, mem_a, util_hi, res_a, tp)
    assert _blocks(model, mem_a, util_a, res_lo, tp) >= _blocks(model, mem_a, util_a, res_hi, tp)


@settings(max_examples=100, deadline=None)
@given(layouts, st.floats(200.0, 1000.0), st.integers(1, 64), st.integers(1, 100_000))
def test_sizing_accounting(layout, memory_gib, block_size, seq_tokens):
    model, tp = layout
    memory_gib += model.weight_bytes(tp) / 0.9 / 2**30  # room for the weights (DeepSeek-V3: 625 GiB)
    gpu = GpuSpec("g", memory_gib=memory_gib, hbm_bandwidth_gbps=1000, bf16_tflops=100, host_link_gbps=32)
    s = size_kv_cache(model, gpu, tensor_parallel=tp, block_size=block_size)
    assert s.kv_pool_bytes == s.usable_bytes - s.weight_bytes - s.reserve_bytes
    assert s.num_blocks * s.bytes_per_block <= s.kv_pool_bytes < (s.num_blocks + 1) * s.bytes_per_block
    assert s.bytes_per_block == s.bytes_per_token * block_size
    n = concurrency(s, seq_tokens)
    blocks_each = -(-seq_tokens // block_size)
    if model.sliding_window_layers:  # vLLM's hybrid manager: the window layers' blocks on top (kv_window)
        window_most = -(-(model.sliding_window - 1) // block_size) + 1
        blocks_each += min(blocks_each, window_most)
    assert s.sequence_blocks(seq_tokens) == blocks_each
    assert n * blocks_each <= s.num_blocks < (n + 1) * blocks_each


# --- roofline -------------------------------------------------------------------------------


def _roofline(model="llama-3-8b", gpu="a100-80gb", **overrides):
    return RooflineCostModel(MODEL[model], GPU[gpu], RooflineConfig(model=model, gpu=gpu, **{**GPU_ONLY, **overrides}))


# The A100 80 GB's efficiencies measured on Vidur's profiles (plugins/presets.py,
# MEASURED_EFFICIENCY) and the pooled attention ones (tools/derive_roofline.py), by hand:
WEIGHT_BW = A100_80_BW_GBPS * 1e6 * 0.776          # bytes per ms reading weights
KV_BW = A100_80_BW_GBPS * 1e6 * 0.91               # bytes per ms reading KV
PEAK = A100_80_TFLOPS * 1e9                        # FLOP per ms
EMBEDDING = 128256 * 4096                           # looked up, one row per token; multiplies nothing
LM_HEAD = 128256 * 4096                             # multiplies the sampled rows only
MATMUL = LLAMA3_8B_PARAMS - EMBEDDING - LM_HEAD     # the layers
WEIGHTS_MS = MATMUL * 2 / WEIGHT_BW                # 8.82 ms
ROW_MS = 4096 * 2 / WEIGHT_BW                        # one embedding row
KV_MS_PER_TOKEN = 128 * KIB / KV_BW
SMALL_OPS_MS = 32 * (36.0 + 12.1) * 1e-3            # 32 layers x (36.0 us + the attention kernels' 12.1 us)
DECODE_MS = 32 * 0.11e-3                            # a decode's attention besides its KV read
ATTN_FLOPS_PER_PAIR = 4 * 32 * 32 * 128             # layers x heads x head_dim x 4


def linear_ms(tokens, params=MATMUL, weights_ms=WEIGHTS_MS, peak=PEAK):
    """hypot(weight read, GEMM at 0.66 * T / (T + 0) of peak) and the embedding rows."""
    compute = 2 * params * tokens / (peak * 0.66)
    return SMALL_OPS_MS + math.hypot(weights_ms, compute) + tokens * ROW_MS


def lm_head_ms(rows):
    """The LM head: the whole matrix read, the sampled rows' FLOPs."""
    return math.hypot(LM_HEAD * 2 / WEIGHT_BW, 2 * LM_HEAD * rows / (PEAK * 0.66))


def test_roofline_is_a_cost_model():
    assert isinstance(_roofline(), CostModel)


def test_roofline_decode_iteration_by_hand():
    cost = _roofline(overhead_ms=1.0)
    expected = 1.0 + linear_ms(4) + lm_head_ms(4) + 4 * DECODE_MS + 4096 * KV_MS_PER_TOKEN
    got = cost.iteration_ms(Batch(num_decode=4, decode_context_tokens=4096))
    assert got == pytest.approx(expected, rel=1e-12)
    assert got == pytest.approx(12.33343, abs=1e-4)
    assert cost.iteration_ms(Batch()) == 0.0


def test_roofline_linear_layers_slow_down_with_tokens_as_profiled():
    """A 128-token decode batch's linear layers take longer than one token's (the profiles:
    14-29%), and thousands of tokens are compute-bound at 0.66 of peak (A100)."""
    profiled = _roofline("llama-3.1-8b", "rtx-pro-6000-server")
    one, many = profiled.tokens_ms(1), profiled.tokens_ms(128)
    assert 1.10 < many / one < 1.35
    cost = _roofline()
    big = cost.tokens_ms(8192)
    assert big == pytest.approx(linear_ms(8192), rel=1e-12)
    assert big > 2 * MATMUL * 8192 / PEAK / 0.66


def test_roofline_tensor_parallel_adds_the_all_reduce():
    # (no vocabulary declared: every weight read, no logits gathered -- the all-reduces alone)
    def cost_with(all_reduce):
        return RooflineCostModel(attrs.evolve(MODEL["llama-3-70b"], vocab_size=None), GPU["h100-80gb"],
                                 RooflineConfig(model="llama-3-70b", gpu="h100-80gb", tensor_parallel=4,
                                                layer_overhead_us=0.0, attention_layer_us=0.0,
                                                decode_attention_us=0.0, tp_all_reduce=all_reduce, **GPU_ONLY))
    cost = cost_with("nccl")
    # the H100's measured efficiencies: weights at 0.846 of the bandwidth, GEMMs at 0.61 T / (T + 18)
    weights = LLAMA3_70B_PARAMS * 2 / 4 / (3350e6 * 0.846)
    compute = 2 * LLAMA3_70B_PARAMS / 4 * 1 / (989e9 * 0.61 * 1 / 19)
    # (80 layers x 2 + the embedding's 1) all-reduces of 1 token x 8192 x 2 bytes over a DGX H100's
    # NVSwitch (4 ranks: 361 GB/s bus): NCCL's LL protocol, 6.6 + 6 hops x 0.6 us + 2 (tp-1)/tp x
    # bytes at half the bus bandwidth
    comm = (80 * 2 + 1) * (6.6 + 6 * 0.6 + 1.5 * 8192 * 2 / (0.5 * 361e3)) * 1e-3
    kv = 1000 * (80 * KIB) / (3350e6 * 0.91)
    got = cost.iteration_ms(Batch(num_decode=1, decode_context_tokens=1000))
    assert got == pytest.approx(math.hypot(weights, compute) + comm + kv, rel=1e-12)
    # by default vLLM's own all-reduce, as measured on 4 H100s: 4.83 us for 16 KB
    vllm = cost_with("vllm").iteration_ms(Batch(num_decode=1, decode_context_tokens=1000))
    assert vllm == pytest.approx(math.hypot(weights, compute) + (80 * 2 + 1) * 4.83e-3 + kv, rel=1e-12)
    with pytest.raises(ConfigError, match="hidden_size"):
        RooflineCostModel(attrs.evolve(MODEL["llama-3-70b"], hidden_size=None), GPU["h100-80gb"],
                          RooflineConfig(model="llama-3-70b", gpu="h100-80gb", tensor_parallel=2))


def test_roofline_prefill_by_hand():
    cost = _roofline(overhead_ms=0.5)
    attention = ATTN_FLOPS_PER_PAIR * (1000 * 1001 / 2) / (PEAK * 0.48)
    got = cost.iteration_ms(Batch(num_prefill=1, prefill_tokens=1000))
    assert got == pytest.approx(0.5 + linear_ms(1000) + lm_head_ms(1) + attention, rel=1e-12)
    # A chunk of 500 after 1500 cached tokens attends to them too.
    chunk = cost.iteration_ms(Batch(num_prefill=1, prefill_tokens=500, prefill_context_tokens=1500))
    pairs = 500 * 1500 + 500 * 501 / 2
    assert chunk == pytest.approx(0.5 + linear_ms(500) + lm_head_ms(1) + ATTN_FLOPS_PER_PAIR * pairs / (PEAK * 0.48),
                                  rel=1e-12)


def test_roofline_decodes_with_a_prefill_chunk_cost_padded_query_rows():
    """With a prefill chunk, each decode costs 60 query rows of attention FLOPs over its
    context plus 180 tokens (more than reading its KV), and the empty query tiles the kernel
    launches for it -- the chunk's 500 tokens need 4 tiles of 128 rows, a decode fills one --
    3 ns each per head and layer, as the profiles' mixed batches show."""
    cost = _roofline()
    batch = Batch(num_decode=10, decode_context_tokens=20_000, num_prefill=1, prefill_tokens=500)
    padded = 60 * ATTN_FLOPS_PER_PAIR * (20_000 + 10 * 180) / (PEAK * 0.48)
    assert padded > 20_000 * KV_MS_PER_TOKEN
    empty_tiles = 10 * 3 * 32 * 32 * 3.0e-6  # decodes x empty tiles x heads x layers x ms
    prefill = ATTN_FLOPS_PER_PAIR * (500 * 501 / 2) / (PEAK * 0.48)
    assert cost.iteration_ms(batch) == pytest.approx(
        linear_ms(510) + lm_head_ms(11) + padded + empty_tiles + prefill, rel=1e-12)
    # without padded rows the decodes cost what they cost alone: their KV read and per-decode time
    no_padding = _roofline(mixed_decode_query_rows=0.0, empty_tile_ns=0.0)
    assert no_padding.iteration_ms(batch) == pytest.approx(
        linear_ms(510) + lm_head_ms(11) + 20_000 * KV_MS_PER_TOKEN + 10 * DECODE_MS + prefill, rel=1e-12)
    # a chunk of one tile launches no empty tile
    small = Batch(num_decode=10, decode_context_tokens=20_000, num_prefill=1, prefill_tokens=128)
    small_prefill = ATTN_FLOPS_PER_PAIR * (128 * 129 / 2) / (PEAK * 0.48)
    assert cost.iteration_ms(small) == pytest.approx(linear_ms(138) + lm_head_ms(11) + padded + small_prefill,
                                                     rel=1e-12)


@pytest.mark.parametrize("kernel", ["flash-attention-3", "flashinfer"])
def test_roofline_flash_attention_3_times_decodes_beside_a_chunk_as_decode_only(kernel):
    """FlashAttention 3 packs a decode's query heads into its KV heads' tiles and launches no
    empty tiles, FlashInfer runs the decodes in a kernel of their own: the decodes of a mixed
    step cost their KV read and per-decode time, as in a decode-only step, and only the chunk's
    own linear and attention work is added."""
    fa3 = _roofline(attention_kernel=kernel)
    batch = Batch(num_decode=10, decode_context_tokens=20_000, num_prefill=1, prefill_tokens=500)
    prefill = ATTN_FLOPS_PER_PAIR * (500 * 501 / 2) / (PEAK * 0.48)
    decodes = 20_000 * KV_MS_PER_TOKEN + 10 * DECODE_MS
    assert fa3.iteration_ms(batch) == pytest.approx(linear_ms(510) + lm_head_ms(11) + decodes + prefill, rel=1e-12)
    # the same step in FlashAttention 2 (the profiled kernel) pays padded rows and empty tiles
    assert _roofline().iteration_ms(batch) - fa3.iteration_ms(batch) == pytest.approx(
        60 * ATTN_FLOPS_PER_PAIR * (20_000 + 10 * 180) / (PEAK * 0.48) + 10 * 3 * 32 * 32 * 3.0e-6 - decodes,
        rel=1e-9)
    # decode-only steps are the same in both kernels
    only = Batch(num_decode=10, decode_context_tokens=20_000)
    assert fa3.iteration_ms(only) == _roofline().iteration_ms(only)


def test_uneven_decode_contexts_cost_a_share_of_the_gap_to_the_longest():
    """Decodes of uneven context take alpha of the way from the even batch's attention to every
    decode at the longest context (LLMServingSim's skew shots: alpha 0.037 in a decode-only step,
    0.103 beside a prefill chunk in FlashAttention 2, whose varlen kernel has no split-KV).
    4 decodes of 1,000, 1,000, 1,000 and 5,000 tokens: 12,000 context tokens short of 4 x 5,000."""
    cost = _roofline()
    even = Batch(num_decode=4, decode_context_tokens=8_000)
    uneven = Batch(num_decode=4, decode_context_tokens=8_000, decode_context_max=5_000, decode_context_min=1_000)
    assert cost.iteration_ms(uneven) - cost.iteration_ms(even) == pytest.approx(
        0.037 * 12_000 * KV_MS_PER_TOKEN, rel=1e-9)
    # beside a 500-token chunk the decodes are padded query rows (more than their KV read)
    mixed = dict(num_decode=4, decode_context_tokens=8_000, num_prefill=1, prefill_tokens=500)
    padded_per_token = 60 * ATTN_FLOPS_PER_PAIR / (PEAK * 0.48)
    assert padded_per_token > KV_MS_PER_TOKEN
    assert cost.iteration_ms(Batch(**mixed, decode_context_max=5_000)) - cost.iteration_ms(Batch(**mixed)) == \
        pytest.approx(0.103 * 12_000 * padded_per_token, rel=1e-9)
    # FlashAttention 3 times those decodes as in a decode-only step: the decode-only share
    fa3 = _roofline(attention_kernel="flash-attention-3")
    assert fa3.iteration_ms(Batch(**mixed, decode_context_max=5_000)) - fa3.iteration_ms(Batch(**mixed)) == \
        pytest.approx(0.037 * 12_000 * KV_MS_PER_TOKEN, rel=1e-9)
    # even contexts (the longest is the mean) and the settings at 0 add nothing
    assert cost.iteration_ms(Batch(num_decode=4, decode_context_tokens=8_000, decode_context_max=2_000)) == \
        cost.iteration_ms(even)
    off = _roofline(decode_skew_alpha=0.0, mixed_skew_alpha=0.0)
    assert off.iteration_ms(uneven) == off.iteration_ms(even) == cost.iteration_ms(even)
    # the gap does not change along a decode run (every context grows by one), so the
    # increment the engine advances runs with is the even batch's
    assert cost.needs_context_range
    assert cost.decode_step_increment(uneven) == cost.decode_step_increment(even)


def test_the_attention_kernel_follows_the_gpus_compute_capability():
    """vLLM runs FlashAttention 3 on Hopper (compute capability 9.x), FlashInfer on datacenter
    Blackwell (10.x) and FlashAttention 2 elsewhere; a GPU without a known capability keeps the
    profiled kernel (2); a setting wins over both."""
    assert _roofline("llama-3-8b", "h100-80gb").settings.attention_kernel == "flash-attention-3"
    assert _roofline("llama-3-8b", "h200-141gb").settings.attention_kernel == "flash-attention-3"
    assert _roofline("llama-3-8b", "b200").settings.attention_kernel == "flashinfer"
    for gpu in ("a100-80gb", "rtx-pro-6000-server", "rtx-4090", "l40s"):
        assert _roofline("llama-3-8b", gpu).settings.attention_kernel == "flash-attention-2", gpu
    unknown = attrs.evolve(GPU["h100-80gb"], name="mystery", compute_capability=None)
    cost = RooflineCostModel(MODEL["llama-3-8b"], unknown, RooflineConfig(model="llama-3-8b", gpu="mystery"))
    assert cost.settings.attention_kernel == "flash-attention-2"
    chosen = _roofline("llama-3-8b", "h100-80gb", attention_kernel="flash-attention-2")
    assert chosen.settings.attention_kernel == "flash-attention-2"
    with pytest.raises(FieldError, match="attention_kernel"):
        RooflineConfig(model="llama-3-8b", gpu="h100-80gb", attention_kernel="flash-attention-9")


def test_roofline_moe_reads_resident_experts_and_computes_active_ones():
    """Qwen3-30B-A3B: one token reads 8 of 128 experts; 2048 tokens touch nearly all 128 but
    compute only the 3.35B active parameters per token."""
    m = MODEL["qwen3-30b-a3b"]
    cost = RooflineCostModel(m, GPU["rtx-pro-6000-server"],
                             RooflineConfig(model=m.name, gpu="rtx-pro-6000-server", layer_overhead_us=0.0,
                                            attention_layer_us=0.0))
    bw, peak = 1597e6 * 0.979, 503.8e9  # the RTX PRO 6000 Server's measured efficiencies
    expert = (m.num_params - m.active_params) / 120          # one expert, all layers
    dense = m.num_params - 128 * expert - 2 * 151936 * 2048  # attention, router, norms (the LM head apart)
    # the looked-up embedding table multiplies nothing: one row of 2048 x 2 bytes read per token;
    # the LM head (logits_ms) multiplies the sampled rows only
    matmul = m.active_params - 8 * expert - 2 * 151936 * 2048
    row = 2048 * 2 / bw
    # the experts (measured on this GPU's MoE profile): 29.9 us a MoE layer, their weights at
    # 0.988 of the dense read, the fused kernel's GEMMs at 0.81 of the dense curve
    moe_fixed, read_share, gemm_share = 48 * 29.9e-3, 0.988, 0.81
    one = math.hypot(dense * 2 / bw, 2 * matmul * 56 / (peak * 0.78)) \
        + moe_fixed + math.hypot(8 * expert * 2 / (bw * read_share), 2 * 8 * expert * 56 / (peak * 0.78 * gemm_share)) \
        + row
    assert cost.tokens_ms(1) == pytest.approx(one, rel=1e-12)
    touched = 128 * (1 - (1 - 8 / 128) ** 2048)
    assert touched == pytest.approx(128, rel=1e-9)
    per_expert = 2048 * 8 / touched
    many = 2048 * row + math.hypot(dense * 2 / bw, 2 * matmul * 2103 / (peak * 0.78)) + moe_fixed \
        + math.hypot(touched * expert * 2 / (bw * read_share),
                     2 * 8 * expert * 2048 / (peak * 0.78 * gemm_share * per_expert / (per_expert + 55)))
    assert cost.tokens_ms(2048) == pytest.approx(many, rel=1e-12)
    # decode of one token reads far less than all 30.5B parameters
    assert cost.tokens_ms(1) < 0.3 * m.num_params * 2 / bw


def test_decode_step_increment_only_for_decode_only_batches():
    cost = _roofline()
    assert cost.decode_step_increment(Batch(num_decode=8, decode_context_tokens=8000)) == pytest.approx(
        8 * KV_MS_PER_TOKEN, rel=1e-12)
    assert cost.decode_step_increment(Batch(num_decode=8, decode_context_tokens=8000, num_prefill=1,
                                            prefill_tokens=10)) is None


@settings(max_examples=300, deadline=None)
@given(layouts, st.integers(1, 1024), st.integers(0, 2_000_000), st.integers(1, 2000),
       st.booleans(), st.booleans(), st.sampled_from([0.0, 400.0, 20_000.0]))
def test_decode_step_increment_is_exact(layout, num_decode, context, steps, asynchronous, graphs, host_us):
    """The increment (and, where the host's work or the launches hide the GPU's growth, how
    many steps the flat stretch holds) predicts every later step of the run exactly."""
    model, tp = layout[0].name, layout[1]
    gpu = "h200-141gb"
    cost = RooflineCostModel(MODEL[model], GPU[gpu], RooflineConfig(
        model=model, gpu=gpu, tensor_parallel=tp, async_scheduling=asynchronous, cuda_graphs=graphs,
        cuda_graph_max_tokens=256, host_step_us=host_us))
    batch = Batch(num_decode=num_decode, decode_context_tokens=context)
    inc = cost.decode_step_increment(batch)
    held = math.inf
    if isinstance(inc, tuple):
        inc, held = inc
        assert held >= 1
    first = cost.iteration_ms(batch)
    for j in {1, min(steps, held - 1), held - 1}:
        if 1 <= j < held:
            later = cost.iteration_ms(Batch(num_decode=num_decode, decode_context_tokens=context + j * num_decode))
            assert abs(later - (first + j * inc)) <= 1e-12 * later
    if held < math.inf:  # the flat stretch ends: the next step is longer
        after = cost.iteration_ms(Batch(num_decode=num_decode, decode_context_tokens=context + held * num_decode))
        assert inc == 0.0 and after >= first


def test_request_cost_by_hand():
    cost = _roofline(overhead_ms=1.0)
    prefill, decode = cost.request_cost(10, 3)
    assert prefill == pytest.approx(1.0 + linear_ms(10) + lm_head_ms(1) + ATTN_FLOPS_PER_PAIR * 55 / (PEAK * 0.48),
                                    rel=1e-12)
    # The prefill yields token 1; tokens 2 and 3 are decode steps attending to 11 and 12 tokens.
    assert decode == pytest.approx(2 * (1.0 + linear_ms(1) + lm_head_ms(1) + DECODE_MS) + (11 + 12) * KV_MS_PER_TOKEN,
                                   rel=1e-12)
    _, none = cost.request_cost(10, 1)
    assert none == 0.0


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4000), st.integers(1, 300), st.integers(1, 300) | st.none())
def test_request_cost_matches_step_by_step_sum(prompt, output, max_tokens):
    cost = _roofline()
    request = Request(id=0, arrival_ms=0.0, prompt_tokens=prompt, output_tokens=output, max_tokens=max_tokens)
    _, decode = cost.request_cost(request.prompt_tokens, request.target_tokens)
    steps = request.target_tokens - 1
    total = sum(cost.iteration_ms(Batch(num_decode=1, decode_context_tokens=prompt + j)) for j in range(1, steps + 1))
    assert decode == pytest.approx(total, rel=1e-9, abs=1e-12)


def test_swap_ms_uses_host_link():
    cost = _roofline()
    assert cost.swap_ms(1000) == pytest.approx(1000 * 128 * KIB / (32e9 / 1e3), rel=1e-12)


def test_roofline_registered_and_built_from_presets(catalog, presets):
    entry = catalog["cost_model"].get("roofline")
    assert entry.config is RooflineConfig
    config = from_table(RooflineConfig, {"model": "llama-3-8b", "gpu": "a100-80gb", "tensor_parallel": 1},
                        where="lab.toml: [cost_model]")
    cost = entry.factory(config, presets)
    assert isinstance(cost, RooflineCostModel) and cost.model == MODEL["llama-3-8b"]
    with pytest.raises(UnknownPluginError, match="unknown gpu 'a100'"):
        build_roofline(RooflineConfig(model="llama-3-8b", gpu="a100"), presets)
    with pytest.raises(ConfigError, match="mfu"):
        from_table(RooflineConfig, {"model": "llama-3-8b", "gpu": "l4", "mfu": 1.5}, where="lab.toml: [cost_model]")
    with pytest.raises(ConfigError, match="split evenly"):
        build_roofline(RooflineConfig(model="llama-3-8b", gpu="l4", tensor_parallel=3), presets)


def test_a_run_sets_a_measured_block_count_over_an_inherited_model_and_gpu(tmp_path):
    """The most common per-run setting: a block count measured on the real server. A run may set
    it under a default [kv_cache] that names model and gpu (vLLM --num-gpu-blocks-override): the
    model and GPU still give the bytes of a block (Llama-3-8B: 128 KiB/token x 16 = 2 MiB)."""
    from schedlab.study.experiment import load, run_experiment
    from schedlab_plugins.reports.table import render

    (tmp_path / "exp.toml").write_text(textwrap.dedent('''
        [experiment]
        name = "override"
        [workload]
        kind = "synthetic"
        num_requests = 4
        prompt = {dist = "fixed", value = 100}
        output = {dist = "fixed", value = 10}
        rate = 10
        [kv_cache]
        kind = "paged"
        model = "llama-3-8b"
        gpu = "a100-40gb"
        [[runs]]
        name = "derived"
        [[runs]]
        name = "measured"
        kv_cache = {kind = "paged", num_blocks = 2588}
    '''))
    results = run_experiment(load(tmp_path / "exp.toml"))
    runs = {r.name: r.meta["kv_cache"] for r in results.all_runs()}
    assert runs["derived"]["num_blocks"] == runs["derived"]["derived_blocks"] == 10005
    assert runs["measured"]["num_blocks"] == 2588
    assert runs["measured"]["bytes_per_block"] == 2 * 2**20
    assert "2,588 blocks = 41,408 tokens (num_blocks set; model and gpu give 10,005)" in render(results)


@pytest.mark.parametrize("args, message", [
    (["--p99-tokens", "0"], "--p99-tokens 0: a sequence length is a whole number of tokens >= 1"),
    (["--avg-tokens", "-5"], "--avg-tokens -5: a sequence length is a whole number of tokens >= 1"),
    (["--tensor-parallel", "0"], "--tensor-parallel must be a whole number from 1 to "),
    (["--gpu-memory-utilization", "2"], "--gpu-memory-utilization must be in (0, 1], got 2.0"),
    (["--block-size", "0"], "--block-size must be a whole number from 1 to "),
    (["--activation-reserve-gib", "-1"], "--activation-reserve-gib must be a finite number >= 0"),
])
def test_capacity_errors_name_the_option(capsys, args, message):
    """They named the TOML key or nothing ('sequence length must be ...': which of the two?)."""
    from schedlab.cli import main

    assert main(["capacity", "--model", "llama-3-8b", "--gpu", "a100-40gb", *args]) == 2
    assert capsys.readouterr().err.startswith(f"schedlab: error: {message}")


# --- review s78: a Hugging Face id resolved by its base model -----------------------------------------------------


def test_a_tuned_checkpoints_id_gets_its_own_context_and_says_whose_shapes(presets):
    """Qwen/Qwen2.5-7B-Instruct resolves to qwen2.5-7b (the base's shapes) but its config.json says
    32,768 tokens where the base's says 131,072 (tests/data/hf_configs/qwen2.5-7b-instruct-awq.json is
    its config); Qwen/Qwen3-8B-Base's says 32,768 where Qwen/Qwen3-8B's says 40,960. The context is
    the checkpoint's, and the resolution says the shapes are the base preset's."""
    import json
    import warnings
    from pathlib import Path

    from schedlab.errors import InputWarning

    awq = json.loads((Path(__file__).parent / "data" / "hf_configs" / "qwen2.5-7b-instruct-awq.json").read_text())
    for hf_id, preset, context in [("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", awq["max_position_embeddings"]),
                                   ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b", 32768),
                                   ("Qwen/Qwen3-8B-Base", "qwen3-8b", 32768)]:
        with pytest.warns(InputWarning, match=rf"model '{hf_id}': no preset carries this Hugging Face id; its "
                                              rf"shapes are taken from preset '{preset}' .*32,768 tokens"):
            model = presets.model(hf_id)
        assert (model.name, model.max_position_embeddings) == (preset, 32768)
        assert attrs.evolve(model, max_position_embeddings=None) == attrs.evolve(MODEL[preset],
                                                                                 max_position_embeddings=None)
    with pytest.warns(InputWarning, match=r"preset 'llama-3.1-8b' \(meta-llama/Llama-3.1-8B\), its base model, its "
                                          r"context of 131,072 tokens too"):
        assert presets.model("meta-llama/Llama-3.1-8B-Instruct").max_position_embeddings == 131072
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a preset's own id: nothing to say
        assert presets.model("Qwen/Qwen2.5-7B").max_position_embeddings == MODEL["qwen2.5-7b"].max_position_embeddings
