"""FP8 weights times FP8 activations (W8A8) in the roofline: their GEMMs run at the GPU's FP8
rate where it has one, checked against a measured FP8 profile; everything else stays at bf16."""

from __future__ import annotations

import math

import attrs
import pytest

from schedlab.capacity import ModelSpec, Presets
from schedlab.catalog import load_catalog
from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel

#: DeepSeek-V3.2-Exp's dense MLP on one RTX PRO 6000 Blackwell Server Edition, FP8 block-scaled
#: weights (128 x 128) and activations quantised on the fly, timed inside vLLM 0.28 by
#: LLMServingSim's profiler (github.com/casys-kaist/LLMServingSim, MIT:
#: profiler/perf/RTXPRO6000/deepseek-ai/DeepSeek-V3.2-Exp/fp8/tp1/dense.csv at 0235d160):
#: (tokens, gate_up_proj us, down_proj us). gate_up_proj is 7168 x 36864, down_proj 18432 x 7168.
MEASURED = (
    (1, 183.087, 187.226), (16, 187.933, 193.313), (64, 202.145, 203.14), (128, 216.819, 224.105),
    (256, 268.197, 161.498), (512, 387.07, 286.643), (1024, 713.582, 423.714), (2048, 1325.72, 691.747),
)
SHAPES = {"gate_up_proj": 7168 * 36864, "down_proj": 18432 * 7168}
GPU = "rtx-pro-6000-server"


def _presets() -> Presets:
    return Presets.from_catalog(load_catalog(entry_points=False))


def _one_gemm(params: int, *, fp8_activations: bool, gpu: str = GPU) -> RooflineCostModel:
    """A model whose every weight is one FP8 matrix of ``params`` weights, without the fixed
    per-layer times, so that ``tokens_ms`` is that GEMM's roofline alone."""
    model = ModelSpec("one-gemm", num_layers=1, num_kv_heads=1, head_dim=128, num_params=params,
                      weight_dtype_bytes=1.0, fp8_activations=fp8_activations)
    config = RooflineConfig(model=model.name, gpu=gpu, layer_overhead_us=0.0, attention_layer_us=0.0)
    return RooflineCostModel(model, _presets().gpu(gpu), config)


def test_fp8_gemms_follow_the_measured_profile_at_the_fp8_rate():
    """gate_up_proj within 8% from 1 to 2,048 tokens at the FP8 rate (with the bf16 GEMMs' fitted
    efficiency curve); at the bf16 rate it would be 68-114% too slow from 256 tokens. down_proj
    (a long reduction: 18,432) agrees at 1,024-2,048 tokens; below, its kernel is slower than
    the roofline's either way (a weight read at 0.7 TB/s at 1-128 tokens, tile waves at 256-512:
    not modelled)."""
    gate_up = _one_gemm(SHAPES["gate_up_proj"], fp8_activations=True)
    gate_up_bf16 = _one_gemm(SHAPES["gate_up_proj"], fp8_activations=False)
    down = _one_gemm(SHAPES["down_proj"], fp8_activations=True)
    down_bf16 = _one_gemm(SHAPES["down_proj"], fp8_activations=False)
    for tokens, gate_up_us, down_us in MEASURED:
        assert gate_up.tokens_ms(tokens) == pytest.approx(gate_up_us * 1e-3, rel=0.08), tokens
        if tokens >= 256:
            assert gate_up_bf16.tokens_ms(tokens) > 1.6 * gate_up_us * 1e-3, tokens
        if tokens >= 1024:
            assert down.tokens_ms(tokens) == pytest.approx(down_us * 1e-3, rel=0.15), tokens
            assert down_bf16.tokens_ms(tokens) > 1.6 * down_us * 1e-3, tokens


def _compute_ms(cost: RooflineCostModel, total_ms: float, read_ms: float) -> float:
    """The compute leg of ``hypot(read, compute)``."""
    return math.sqrt(total_ms ** 2 - read_ms ** 2)


@pytest.mark.parametrize("gpu, ratio", [("h100-80gb", 989 / 1979), ("l40s", 362.05 / 733), ("a100-80gb", 1.0)])
def test_the_compute_leg_scales_by_the_datasheet_rates(gpu, ratio):
    """The GEMM's compute time with FP8 activations is the bf16 one times bf16 / FP8 TFLOPS of the
    GPU's datasheet; a GPU without FP8 tensor cores (A100) runs them in 16 bits."""
    params = SHAPES["gate_up_proj"]
    fp8, bf16 = _one_gemm(params, fp8_activations=True, gpu=gpu), _one_gemm(params, fp8_activations=False, gpu=gpu)
    read = bf16._dense_read_ms
    for tokens in (256, 2048, 8192):
        assert _compute_ms(fp8, fp8.tokens_ms(tokens), read) == pytest.approx(
            ratio * _compute_ms(bf16, bf16.tokens_ms(tokens), read), rel=1e-9)


def test_fp8_experts_and_a_16_bit_lm_head():
    """A W8A8 MoE model: the routed experts' GEMMs at the FP8 rate, the LM head (kept in 16 bits)
    and attention at bf16. (The experts' settings held alike: the two run different kernels,
    tests/test_experts_measured.py.)"""
    presets = _presets()
    model = presets.model("deepseek-v3")
    assert model.fp8_activations
    gpu = presets.gpu("h100-80gb")
    same = {"expert_layer_us": 25.0, "expert_us": 0.0, "expert_read_share": 1.0, "expert_gemm_share": 0.7}
    fp8 = RooflineCostModel(model, gpu, RooflineConfig(model=model.name, gpu=gpu.name, tensor_parallel=8, **same))
    bf16_model = attrs.evolve(model, fp8_activations=False)
    bf16 = RooflineCostModel(bf16_model, gpu, RooflineConfig(model=model.name, gpu=gpu.name, tensor_parallel=8,
                                                             **same))
    tokens = 8192
    fixed, read = fp8._expert_fixed_ms, model.num_experts * fp8._expert_read_ms
    experts_fp8 = _compute_ms(fp8, fp8._experts_ms(tokens) - fixed, read)
    experts_bf16 = _compute_ms(bf16, bf16._experts_ms(tokens) - fixed, read)
    assert experts_fp8 == pytest.approx(experts_bf16 * 989 / 1979, rel=1e-6)
    assert fp8.logits_ms(256) == bf16.logits_ms(256)
    assert fp8.prefill_attention_ms(4096) == bf16.prefill_attention_ms(4096)
    assert fp8.tokens_ms(tokens) < bf16.tokens_ms(tokens)


def _prefill(tokens: int):
    from schedlab.protocols import Batch

    return Batch(num_prefill=1, prefill_tokens=tokens, num_decode=0, decode_context_tokens=0,
                 prefill_context_tokens=0)


def test_power_models_count_fp8_gemm_flops_at_the_rate_they_run():
    """The work a power model divides by the bf16 peak: a W8A8 GEMM's FLOPs count bf16 / FP8 of
    theirs (half on an H100), so a prefill of an FP8 model is not twice as compute-bound as it
    is; attention counts whole; on an A100 (no FP8 tensor cores) everything counts whole."""
    presets = _presets()
    model = presets.model("deepseek-v3")
    plain = attrs.evolve(model, fp8_activations=False)
    config = RooflineConfig(model=model.name, gpu="h100-80gb", tensor_parallel=8)
    h100 = presets.gpu("h100-80gb")
    fp8 = RooflineCostModel(model, h100, config)
    bf16 = RooflineCostModel(plain, h100, config)
    work = fp8._work
    tokens = 4096
    gemm = (work.dense_flops_per_token + work.expert_flops_per_token) * tokens
    (b8, f8), (b16, f16) = fp8.work(_prefill(tokens)), bf16.work(_prefill(tokens))
    assert b8 == b16
    assert f16 - f8 == pytest.approx(gemm * (1 - 989 / 1979), rel=1e-12)
    # the experts of a lockstep step, counted alike
    assert work.experts_work((100, 300))[1] == pytest.approx(
        bf16._work.experts_work((100, 300))[1] * 989 / 1979, rel=1e-12)
    a100 = RooflineCostModel(model, presets.gpu("a100-80gb"), attrs.evolve(config, gpu="a100-80gb"))
    assert a100.work(_prefill(tokens)) == RooflineCostModel(plain, presets.gpu("a100-80gb"),
                                                              attrs.evolve(config, gpu="a100-80gb")).work(_prefill(tokens))
