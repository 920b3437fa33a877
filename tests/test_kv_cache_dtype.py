"""The KV cache's dtype (vLLM's ``--kv-cache-dtype``): an FP8 cache keeps one byte an element, so
the same memory holds twice the tokens and a decode reads half the bytes of its context."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.capacity import KV_CACHE_DTYPES, Presets, capacity_command, with_kv_cache_dtype
from schedlab.catalog import load_catalog
from schedlab.configs import FieldError
from schedlab.errors import ConfigError, InputWarning
from schedlab.protocols import Batch
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
from schedlab_plugins.kv_caches.settings import PoolConfig, pool_size

CATALOG = load_catalog(entry_points=False)
PRESETS = Presets.from_catalog(CATALOG)
FP8 = [name for name, size in KV_CACHE_DTYPES.items() if size == 1 and name != "fp8_ds_mla"]  # (DSA models only)


def test_an_fp8_cache_keeps_one_byte_an_element():
    """Llama-3.1-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 = 65,536 elements a token; DeepSeek-V3:
    61 layers x a 576-wide latent (512 + 64 RoPE) = 35,136."""
    llama, deepseek = PRESETS.model("llama-3.1-8b"), PRESETS.model("deepseek-v3")
    assert llama.kv_bytes_per_token() == 131_072
    assert with_kv_cache_dtype(llama, "fp8").kv_bytes_per_token() == 65_536
    assert with_kv_cache_dtype(llama, "fp8").kv_bytes_per_token(tensor_parallel=4) == 16_384
    assert with_kv_cache_dtype(deepseek, "fp8_e4m3").kv_bytes_per_token() == 35_136
    assert with_kv_cache_dtype(deepseek, "fp8").kv_bytes_per_token(tensor_parallel=8) == 35_136  # on every rank
    assert with_kv_cache_dtype(llama, "auto") is llama
    assert with_kv_cache_dtype(llama, "bfloat16").kv_bytes_per_token() == 131_072
    # the weights and the activations keep their bytes
    fp8 = with_kv_cache_dtype(llama, "fp8")
    assert fp8.weight_bytes() == llama.weight_bytes() and fp8.dtype_bytes == 2


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(PRESETS.model_names()), st.sampled_from(FP8), st.sampled_from([1, 2, 4, 8]))
def test_every_preset_stores_half_the_kv_bytes_in_fp8(name, dtype, tp):
    """Over every model preset: the KV part of a token's bytes halves, a sparse-attention
    indexer's keys (already FP8) stay."""
    model = PRESETS.model(name)
    try:
        full = model.kv_bytes_per_token(tp)
    except ConfigError:
        return  # KV heads that do not split over tp ranks: refused alike
    index = model.kv_layers * model.kv_index_bytes
    assert full - index == 2 * (with_kv_cache_dtype(model, dtype).kv_bytes_per_token(tp) - index)


@pytest.mark.parametrize("model, gpu, tp", [("llama-3.1-8b", "h100-80gb", 1), ("llama-3.3-70b", "h100-80gb", 4),
                                            ("qwen3-30b-a3b", "h100-80gb", 1)])
def test_the_same_memory_holds_twice_the_blocks(model, gpu, tp):
    """The pool's bytes are the same (weights and reserve unchanged), its blocks half as large:
    floor(2 x pool / block) is 2n or 2n + 1 for n = floor(pool / block)."""
    auto = pool_size(PoolConfig(model=model, gpu=gpu, tensor_parallel=tp), PRESETS)
    fp8 = pool_size(PoolConfig(model=model, gpu=gpu, tensor_parallel=tp, kv_cache_dtype="fp8"), PRESETS)
    (n, sizing), (n8, sizing8) = auto, fp8
    assert sizing8.kv_pool_bytes == sizing.kv_pool_bytes
    assert sizing8.bytes_per_block * 2 == sizing.bytes_per_block
    assert 2 * n <= n8 <= 2 * n + 1


def _roofline(dtype: str, gpu: str = "h100-80gb") -> RooflineCostModel:
    return RooflineCostModel(PRESETS.model("llama-3.1-8b"), PRESETS.gpu(gpu),
                             RooflineConfig(model="llama-3.1-8b", gpu=gpu, kv_cache_dtype=dtype))


@pytest.mark.parametrize("gpu", ["h100-80gb", "a100-80gb", "l40s"])
def test_a_decode_reads_half_the_bytes_of_its_context(gpu):
    """64 decodes of 2,000 tokens each: the step's kernels are shorter by exactly the KV read
    saved, 128,000 tokens x 65,536 bytes at the GPU's bandwidth x kv_read_efficiency; a prompt
    with no cached context takes the same time in either (its attention FLOPs are bf16's)."""
    auto, fp8 = _roofline("auto", gpu), _roofline("fp8", gpu)
    decodes = Batch(num_decode=64, decode_context_tokens=128_000, decode_context_max=2000, decode_context_min=2000)
    saved_ms = 128_000 * 65_536 / (PRESETS.gpu(gpu).hbm_bandwidth_gbps * 1e6 * auto.settings.kv_read_efficiency)
    assert auto.kernel_ms(decodes) - fp8.kernel_ms(decodes) == pytest.approx(saved_ms, rel=1e-9)
    assert saved_ms > 0.1 * auto.kernel_ms(decodes)  # not lost in the rounding
    prompt = Batch(num_prefill=1, prefill_tokens=1000)
    assert fp8.kernel_ms(prompt) == auto.kernel_ms(prompt)
    assert fp8.work(decodes)[0] < auto.work(decodes)[0]  # the power models see the smaller read too


def test_a_dtype_not_known_is_refused_with_the_known_ones():
    with pytest.raises(FieldError, match="kv_cache_dtype.*fp8_e4m3"):
        RooflineConfig(model="llama-3.1-8b", gpu="h100-80gb", kv_cache_dtype="nvfp8")
    with pytest.raises(FieldError, match="kv_cache_dtype.*fp8_e5m2"):
        PoolConfig(model="llama-3.1-8b", gpu="h100-80gb", kv_cache_dtype="int3")
    with pytest.raises(ConfigError, match="kv_cache_dtype 'fp4' is not one of auto"):
        with_kv_cache_dtype(PRESETS.model("llama-3.1-8b"), "fp4")
    # a pool of given blocks has no model to take the dtype's bytes from
    with pytest.raises(FieldError, match="kv_cache_dtype: sizes the pool from model and gpu"):
        PoolConfig(num_blocks=100, kv_cache_dtype="fp8")


def test_capacity_prints_the_one_byte_cache():
    text = capacity_command({"model": "llama-3.1-8b", "gpu": "h100-80gb", "kv_cache_dtype": "fp8"}, CATALOG)
    assert "2-byte weights, 1-byte KV" in text
    assert "2 x 32 layers x 8 KV heads x 128 head_dim x 1 B = 64 KiB" in text
    bf16 = capacity_command({"model": "llama-3.1-8b", "gpu": "h100-80gb"}, CATALOG)
    assert "x 2 B = 128 KiB" in bf16 and "2-byte weights and KV" in bf16


def test_capacity_of_an_fp8_checkpoint_with_an_fp8_cache():
    """Weights and KV both one byte: said as such, the weights counted at 1 byte (not the model's
    16-bit activations)."""
    import attrs

    from schedlab.capacity import format_capacity, size_kv_cache

    model = attrs.evolve(PRESETS.model("llama-3.1-8b"), weight_dtype_bytes=1.0, table_dtype_bytes=1.0)
    text = format_capacity(size_kv_cache(with_kv_cache_dtype(model, "fp8"), PRESETS.gpu("h100-80gb")))
    assert "1-byte weights and KV" in text and "8.03B params x 1 B = 7.48 GiB" in text


EXPERIMENT = """
[experiment]
name = "x"
reports = []
timeline = false

[workload]
kind = "synthetic"
num_requests = 120
rate = 200.0
prompt = {{dist = "fixed", value = 3000}}
output = {{dist = "fixed", value = 400}}

[cost_model]
{cost}

[kv_cache]
kind = "paged"
model = "llama-3.1-8b"
gpu = "l4"
gpu_memory_utilization = 0.95
{kv}

[scheduler]
kind = "vllm"
max_num_seqs = 256
"""

ROOFLINE = 'kind = "roofline"\nmodel = "llama-3.1-8b"\ngpu = "l4"'


def _load(tmp_path, cost, kv):
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT.format(cost=cost, kv=kv))
    return load(path)


def test_an_fp8_cache_runs_more_sequences_at_once(tmp_path):
    """On an L4 (24 GB) the 8B model's bf16 pool holds about 13 of these 3,400-token sequences;
    in FP8 about 26 run at once, and the run ends sooner."""
    runs = {}
    for dtype in ("auto", "fp8"):
        line = f'kv_cache_dtype = "{dtype}"'
        with warnings.catch_warnings():
            warnings.simplefilter("error", InputWarning)
            exp = _load(tmp_path, f"{ROOFLINE}\n{line}", line)
        runs[dtype] = run_experiment(exp).all_runs()[0].metrics
    assert runs["auto"]["peak_running"] <= 14
    assert runs["fp8"]["peak_running"] >= 2 * runs["auto"]["peak_running"] - 1
    assert runs["fp8"]["makespan_ms"] < 0.75 * runs["auto"]["makespan_ms"]
    assert runs["fp8"]["num_preemptions"] < runs["auto"]["num_preemptions"]


def test_a_cache_and_a_cost_model_in_two_dtypes_are_warned_about(tmp_path):
    with pytest.warns(InputWarning, match=r"\[kv_cache\] kv_cache_dtype = 'fp8' but \[cost_model\] kv_cache_dtype = "
                                          r"'auto': the pool holds one dtype's tokens"):
        _load(tmp_path, ROOFLINE, 'kv_cache_dtype = "fp8"')
    with pytest.warns(InputWarning, match=r"\[kv_cache\] kv_cache_dtype = 'auto' but \[cost_model\] kv_cache_dtype "
                                          r"= 'fp8_e5m2'"):
        _load(tmp_path, ROOFLINE + '\nkv_cache_dtype = "fp8_e5m2"', "")
    with pytest.warns(InputWarning, match=r"the 'linear' cost model has no kv_cache_dtype: it times attention as it "
                                          r"was measured"):
        _load(tmp_path, 'kind = "linear"', 'kv_cache_dtype = "fp8"')


def test_a_sparse_attention_models_fp8_cache_takes_deepseeks_fp8_ds_mla_layout():
    """vLLM keeps DeepSeek-V3.2's FP8 cache as fp8_ds_mla (verify_and_update_config): per token and
    layer 512 FP8 latent values + 4 float32 scales (one per 128) + 64 RoPE values in 16 bits = 656
    bytes, beside the indexer's 132; 61 layers. DeepSeek-V3 (dense MLA) keeps 576 one-byte values."""
    from schedlab.hf_config import spec_from_path

    v32 = spec_from_path("tests/data/hf_configs/deepseek-v3.2.json", "--model")
    assert v32.kv_bytes_per_token() == 61 * (576 * 2 + 132)
    for name in ("fp8", "fp8_e4m3", "fp8_ds_mla"):
        assert with_kv_cache_dtype(v32, name).kv_bytes_per_token(tensor_parallel=8) == 61 * (656 + 132)
    assert with_kv_cache_dtype(PRESETS.model("deepseek-v3"), "fp8").kv_bytes_per_token() == 61 * 576
    with pytest.raises(ConfigError, match="'fp8_ds_mla' is DeepSeek's layout for sparse latent attention"):
        with_kv_cache_dtype(PRESETS.model("deepseek-v3"), "fp8_ds_mla")
    with pytest.raises(ConfigError, match="fp8_ds_mla"):
        with_kv_cache_dtype(PRESETS.model("llama-3.1-8b"), "fp8_ds_mla")
