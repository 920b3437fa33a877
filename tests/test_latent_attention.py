"""Latent attention (MLA) as vLLM runs it: prefill over 192-wide query/key heads, decodes absorbed
over the 576-element latent, whose FLOPs outlast the KV read with many heads on a GPU -- checked
by hand and against vLLM's measured MLA decode kernel (aiconfigurator, tests/data/aiconfigurator)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import attrs
import pytest

from schedlab.capacity import ModelSpec, Presets
from schedlab.catalog import load_catalog
from schedlab.errors import ConfigError
from schedlab.hf_config import spec_from_path
from schedlab.protocols import Batch
from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.roofline import LATENT_DECODE_POOLED, default_latent_decode_efficiency
from schedlab_plugins.cost_models.work import ModelWork
from schedlab_plugins.presets import MEASURED_LATENT_DECODE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import derive_latent_attention  # noqa: E402

PRESETS = Presets.from_catalog(load_catalog(entry_points=False))
DEEPSEEK = PRESETS.model("deepseek-v3")


def _roofline(gpu: str, tp: int, model: ModelSpec = DEEPSEEK, **settings) -> RooflineCostModel:
    return RooflineCostModel(model, PRESETS.gpu(gpu),
                             RooflineConfig(model=model.name, gpu=gpu, tensor_parallel=tp, **settings))


def test_attention_flops_per_pair_by_hand():
    """DeepSeek-V3, 61 layers of 128 heads: a prefill pair costs QK^T over 192 and AV over 128,
    2 x 61 x 128 x 320; an absorbed decode pair QK^T over the 576-wide latent and AV over its
    512 values, 2 x 61 x 128 x 1,088 -- 3.4 times as much; both split over the ranks. Grouped-
    query attention: 4 x layers x heads x head_dim for both."""
    one, eight = ModelWork(DEEPSEEK, 1), ModelWork(DEEPSEEK, 8)
    assert one.attention_flops_per_pair == 2 * 61 * 128 * 320 == 8 * eight.attention_flops_per_pair
    assert one.decode_attention_flops_per_pair == 2 * 61 * 128 * 1088 == 8 * eight.decode_attention_flops_per_pair
    llama = ModelWork(PRESETS.model("llama-3-8b"), 2)
    assert llama.attention_flops_per_pair == llama.decode_attention_flops_per_pair == 4 * 32 * 32 * 128 / 2
    decodes = Batch(num_decode=4, decode_context_tokens=4_000)
    bytes_, flops = one.work(decodes)
    assert flops - one.work(Batch(num_decode=4, decode_context_tokens=0))[1] == pytest.approx(
        4_000 * one.decode_attention_flops_per_pair)


def test_a_latent_prefill_expands_its_cached_context_first():
    """A DeepSeek-V3 chunk of 512 tokens after 3,000 cached, at tensor parallel 8: its causal pairs
    at 2 x 61 x 16 x 320, and kv_b_proj (512 -> 16 heads x (128 + 128)) over the 3,000 cached
    latents, three quarters of the attention itself at this chunk size."""
    w = ModelWork(DEEPSEEK, 8)
    pairs = 512 * 3000 + 512 * 513 / 2
    expand = 3000 * 2 * 61 * 512 * 16 * 256
    assert w.prefill_attention_flops(512, 3000) == pytest.approx(pairs * 2 * 61 * 16 * 320 + expand)
    assert w.prefill_attention_flops(512) == pytest.approx(512 * 513 / 2 * 2 * 61 * 16 * 320)
    # grouped-query attention has nothing to expand
    llama = ModelWork(PRESETS.model("llama-3-8b"))
    assert llama.prefill_attention_flops(512, 3000) == pytest.approx(pairs * 4 * 32 * 32 * 128)


def test_a_decode_is_timed_by_its_flops_with_all_heads_on_a_gpu_and_by_its_read_with_few():
    """H100 at tensor parallel 1: 16.99 MFLOP a context token at 0.624 x 989 TFLOPS (27.5 ns)
    outlast its 70,272 KV bytes at 0.91 x 3.35 TB/s (23.1 ns); at tensor parallel 8 the FLOPs
    are an eighth (3.4 ns) and the read times it."""
    kv = 61 * 576 * 2 / (3350e6 * 0.91)
    flops = 2 * 61 * 128 * 1088 / (989e9 * 0.624)
    assert flops > kv
    for tp, per_token in ((1, flops), (8, kv)):
        cost = _roofline("h100-80gb", tp)
        short, long = (Batch(num_decode=64, decode_context_tokens=64 * c) for c in (1_000, 3_000))
        assert cost.kernel_ms(long) - cost.kernel_ms(short) == pytest.approx(64 * 2_000 * per_token, rel=1e-9)
        # a decode-only step tells the engine the same growth per step
        assert cost.decode_step_increment(short) == pytest.approx(64 * per_token, rel=1e-9)


def test_the_efficiency_is_a_setting_and_gqa_decodes_stay_memory_bound():
    slow = _roofline("h100-80gb", 1, latent_decode_efficiency=0.1)
    batch = Batch(num_decode=8, decode_context_tokens=8 * 4_000)
    assert slow.decode_step_increment(batch) == pytest.approx(8 * 2 * 61 * 128 * 1088 / (989e9 * 0.1))
    # Llama-3-8B: 4 query heads a KV head, 4 FLOPs a KV byte: even below the slowest measured
    # kernel's rate (L40S's Triton, 0.061), the read sets the pace, as before
    llama = PRESETS.model("llama-3-8b")
    for gpu in ("h100-80gb", "a100-80gb", "l40s"):
        cost = _roofline(gpu, 1, llama, latent_decode_efficiency=0.05)
        gpu_spec = PRESETS.gpu(gpu)
        read = llama.kv_bytes_per_token(1) / (gpu_spec.hbm_bandwidth_gbps * 1e6 * cost.settings.kv_read_efficiency)
        assert cost.decode_step_increment(batch) == pytest.approx(8 * read, rel=1e-12)


def _measured_layer_ms(cost: RooflineCostModel, batch: int, context: int) -> float:
    """The roofline's time for one layer's decode attention over ``batch x context`` tokens
    beyond its context-free part (what a one-layer kernel timing at millions of tokens is)."""
    full = cost.kernel_ms(Batch(num_decode=batch, decode_context_tokens=batch * context))
    empty = cost.kernel_ms(Batch(num_decode=batch, decode_context_tokens=0))
    return (full - empty) / DEEPSEEK.num_layers


@pytest.mark.parametrize("gpu", sorted(MEASURED_LATENT_DECODE))
def test_decode_attention_follows_vllms_measured_mla_kernel(gpu):
    """vLLM 0.14's MLA decode kernel, one layer, 4-17M context tokens a step: at 128 heads
    (tensor parallel 1 or data-parallel attention) and 16 (tensor parallel 8) the roofline is
    within 12% at the median, and within 15% on 85% of the points with batches of 128 or more.
    Smaller batches over 64-128k contexts run up to 40% slower than that (too few sequences to
    fill the GPU: not modelled), and a few timings are noisy (a repeat of the same point 40%
    apart). Taking the decode as a KV read alone, as before, takes 1/5-1/10 of the time at 128
    heads on Triton's kernel (A100, L40S) and 1/1.1-1/2 on Hopper's (medians 1/10, 1/8.7, 1/1.17,
    1/1.46)."""
    rows = [r for r in derive_latent_attention.read_subset() if r["gpu"] == gpu]
    for heads, tp in ((128, 1), (16, 8)):
        cost = _roofline(gpu, tp)
        read_only = _roofline(gpu, tp, latent_decode_efficiency=1.0)
        points = [r for r in rows if r["num_heads"] == heads]
        assert len(points) >= 6
        errors = [_measured_layer_ms(cost, r["batch_size"], r["context"]) / r["latency_ms"] - 1 for r in points]
        assert statistics.median(abs(e) for e in errors) < 0.12, (heads, errors)
        full = [abs(e) for e, r in zip(errors, points) if r["batch_size"] >= 128]
        assert sum(e < 0.15 for e in full) >= 0.85 * len(full), (heads, errors)
        if heads == 128:
            before = [_measured_layer_ms(read_only, r["batch_size"], r["context"]) / r["latency_ms"] for r in points]
            assert statistics.median(before) < 0.9


def test_the_shipped_efficiencies_are_what_the_derivation_gives():
    result = derive_latent_attention.derive(derive_latent_attention.read_subset())
    assert {gpu: eff for gpu, (eff, _) in result["per_gpu"].items()} == MEASURED_LATENT_DECODE
    assert result["pooled"] == LATENT_DECODE_POOLED
    # and a GPU without a measurement takes its kernel family's
    assert default_latent_decode_efficiency(PRESETS.gpu("b200")) == LATENT_DECODE_POOLED["flash"]
    assert default_latent_decode_efficiency(PRESETS.gpu("rtx-pro-6000")) == LATENT_DECODE_POOLED["triton"]
    assert _roofline("b200", 1).settings.latent_decode_efficiency == LATENT_DECODE_POOLED["flash"]
    assert _roofline("a100-40gb", 1).settings.latent_decode_efficiency == MEASURED_LATENT_DECODE["a100-80gb"]


# --- DeepSeek-V3.2's sparse attention (DSA) --------------------------------------------------------


def _deepseek_v32() -> ModelSpec:
    return spec_from_path(str(Path(__file__).parent / "data" / "hf_configs" / "deepseek-v3.2.json"), "test")


def test_capped_pairs_count_each_querys_keys_up_to_the_cap():
    from schedlab_plugins.cost_models.work import capped_pairs

    for tokens in range(0, 9):
        for cached in range(0, 9):
            for cap in range(1, 12):
                assert capped_pairs(tokens, cached, cap) == sum(min(cached + j, cap) for j in range(1, tokens + 1))


def test_a_sparse_decode_reads_its_indexer_keys_per_context_token_and_2048_latents_whatever_its_context():
    """DeepSeek-V3.2, 61 layers: per context token a decode reads its 132-byte indexer key a layer
    and scores it with 64 heads of 128 (FP8: half a bf16 FLOP on an H100); whatever its context
    it attends to 2,048 latents of 1,152 bytes, absorbed, 128 heads of 1,088 a pair."""
    v32 = _deepseek_v32()
    h100 = PRESETS.gpu("h100-80gb")
    half = h100.bf16_tflops / h100.fp8_tflops
    w = ModelWork(v32, 1, fp8=half)
    assert w.decode_bytes_per_token == 61 * 132
    assert w.index_flops_per_key == 2 * 61 * 64 * 128 * half == w.decode_attention_flops_per_pair
    assert w.sparse_bytes_per_decode == 2048 * 61 * 1152
    assert w.sparse_flops_per_decode == 2048 * 2 * 61 * 128 * 1088
    # a step of 8 decodes over 3,000 context tokens each reads and computes that much attention
    decodes = Batch(num_decode=8, decode_context_tokens=24_000)
    bytes_, flops = w.work(decodes)
    bare = ModelWork(attrs.evolve(v32, sparse_attention_keys=None, index_heads=0, index_head_dim=0,
                                  kv_index_bytes=0), 1, fp8=half).work(Batch(num_decode=8))
    assert bytes_ - bare[0] == pytest.approx(24_000 * 61 * 132 + 8 * 2048 * 61 * 1152)
    assert flops - bare[1] == pytest.approx(24_000 * 2 * 61 * 64 * 128 * half + 8 * 2048 * 2 * 61 * 128 * 1088)
    # the roofline: per context token the indexer's read (its FLOPs are fewer a byte than the
    # ridge), per decode the sparse attention's 2,048 latents at the latent-decode rate
    cost = _roofline("h100-80gb", 1, v32)
    kv_eff, latent_eff = cost.settings.kv_read_efficiency, cost.settings.latent_decode_efficiency
    per_token = 61 * 132 / (3350e6 * kv_eff)
    assert per_token > 2 * 61 * 64 * 128 * half / (989e9 * latent_eff)
    assert cost.decode_step_increment(decodes) == pytest.approx(8 * per_token, rel=1e-12)
    sparse = max(2048 * 61 * 1152 / (3350e6 * kv_eff), 2048 * 2 * 61 * 128 * 1088 / (989e9 * latent_eff))
    one, two = (cost.kernel_ms(Batch(num_decode=1, decode_context_tokens=c)) for c in (100, 5_000))
    assert two - one == pytest.approx(4_900 * per_token, rel=1e-9)
    dense = _roofline("h100-80gb", 1, attrs.evolve(v32, sparse_attention_keys=None, index_heads=0,
                                                        index_head_dim=0, kv_index_bytes=0))
    assert one - dense.kernel_ms(Batch(num_decode=1, decode_context_tokens=0)) == pytest.approx(
        100 * per_token + sparse, rel=1e-9)


def test_a_sparse_prefill_caps_each_querys_latents_and_its_indexer_scores_every_pair():
    """A 4,096-token prompt: query j attends to min(j, 2,048) latents -- 2,098,176 + 2,048 x 2,048
    pairs -- and the indexer scores all 8,390,656 causal pairs."""
    v32 = _deepseek_v32()
    w = ModelWork(v32, 8, fp8=0.5)
    capped = 2048 * 2049 / 2 + 2048 * 2048
    assert w.prefill_attention_flops(4096) == pytest.approx(
        capped * 2 * 61 * 16 * 1088 + 4096 * 4097 / 2 * 2 * 61 * 64 * 128 * 0.5)
    # below the cap, every causal pair
    assert w.prefill_attention_flops(1000, 500) == pytest.approx(
        (1000 * 500 + 1000 * 1001 / 2) * (2 * 61 * 16 * 1088 + 2 * 61 * 64 * 128 * 0.5))


def test_sparse_attention_needs_its_indexer():
    with pytest.raises(ConfigError, match="sparse_attention_keys"):
        attrs.evolve(DEEPSEEK, sparse_attention_keys=2048)
    with pytest.raises(ConfigError, match="index_heads"):
        attrs.evolve(DEEPSEEK, index_heads=64)


def test_the_rope_part_belongs_to_a_latent():
    with pytest.raises(ConfigError, match="kv_rope_dim"):
        attrs.evolve(PRESETS.model("llama-3-8b"), kv_rope_dim=64)
    with pytest.raises(ConfigError, match="kv_rope_dim"):
        attrs.evolve(DEEPSEEK, kv_rope_dim=576)
