"""GPU efficiencies measured from profiles (tools/derive_roofline.py): the fit recovers known
numbers, the shipped presets predict the measured layers of Vidur's subset (tests/data/vidur),
and every GPU preset says which of its numbers are measured."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest

from schedlab.capacity import GpuSpec, ModelSpec, Presets
from schedlab.catalog import load_catalog
from schedlab.errors import ConfigError
from schedlab_plugins.cost_models.roofline import DERIVATION, RooflineConfig, RooflineCostModel
from schedlab_plugins.presets import (GPUS, MEASURED_EFFICIENCY, MEASURED_EXPERTS, MEASURED_LATENT_DECODE,
                                      SAME_ARCHITECTURE, expert_efficiency)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import derive_roofline  # noqa: E402

CATALOG = load_catalog(entry_points=False)
PRESETS = Presets.from_catalog(CATALOG)


# --- the fit -----------------------------------------------------------------------------------


def test_the_fit_recovers_the_numbers_a_series_was_made_with(monkeypatch):
    """Layers of four sizes on a made-up 1,000 GB/s, 100 TFLOPS GPU, timed exactly by the
    model with weight read 0.85, 20 us per layer, 0.70 T / (T + 32): the fit finds them."""
    monkeypatch.setitem(derive_roofline.GPUS, "test-gpu", (1000, 100, 1))
    bw, peak = 1000e6, 100e9
    series = []
    for size in (50e6, 120e6, 400e6, 900e6):
        s = derive_roofline.Series("test-gpu", f"{size:g}", size, size, np.array(derive_roofline.TOKENS, float),
                                   np.zeros(len(derive_roofline.TOKENS)))
        s.dense_ms = derive_roofline.linear_ms(s, 0.85, 0.020, 0.70, 32, bw, peak)
        series.append(s)
    fit = derive_roofline.fit_linear(series, "test-gpu")
    assert fit["weight_read_efficiency"] == pytest.approx(0.85, abs=5e-4)
    assert fit["layer_overhead_us"] == pytest.approx(20.0, abs=0.05)
    assert (fit["mfu"], fit["gemm_half_tokens"]) == (0.70, 32)
    assert fit["rms_log_error"] == pytest.approx(0.0, abs=1e-6)
    # a layer that fits in the L2 cache is left out
    monkeypatch.setitem(derive_roofline.GPUS, "test-gpu", (1000, 100, 100))
    assert derive_roofline.fit_linear(series, "test-gpu")["series"] == 3


# --- the shipped presets against measured layers --------------------------------------------------


SUBSET = derive_roofline.vidur_series(REPO / "tests" / "data" / "vidur")


def one_layer(s: derive_roofline.Series) -> ModelSpec:
    """A model of one layer holding the series' weights (one rank's share), so the roofline's
    ``tokens_ms`` is exactly the dense part of that layer."""
    return ModelSpec(f"layer of {s.name}", num_layers=1, num_kv_heads=1, head_dim=128,
                     num_params=s.weight_bytes / 2)


def roofline_ms(s: derive_roofline.Series) -> np.ndarray:
    gpu = PRESETS.gpu(s.gpu)
    model = one_layer(s)
    cost = RooflineCostModel(model, gpu, RooflineConfig(model=model.name, gpu=gpu.name, attention_layer_us=0.0))
    return np.array([cost.tokens_ms(int(t)) for t in s.tokens])


def test_the_subset_holds_the_three_gpus():
    assert {s.gpu for s in SUBSET} == {"h100-80gb", "a100-80gb", "a40"}
    assert len(SUBSET) == 16  # 4 model/GPU pairs x TP 1, 2, 4, 8


@pytest.mark.parametrize("gpu", ["h100-80gb", "a100-80gb", "a40"])
def test_the_roofline_predicts_the_measured_layers(gpu):
    """Each GPU preset's measured efficiencies, in the roofline (its attention apart), against
    Vidur's measured dense part of a layer (its GEMMs, norms, rotary, activation) at 1-4,096 tokens, TP 1-8:
    within 8% at the median, 35% at worst (the bend between weight-bound and compute-bound)."""
    errors = []
    for s in (s for s in SUBSET if s.gpu == gpu):
        errors.extend(np.abs(roofline_ms(s) / s.dense_ms - 1.0))
    errors = np.array(errors)
    assert np.median(errors) < 0.08
    assert errors.max() < 0.35


def test_the_roofline_is_the_formula_the_derivation_fits():
    """tokens_ms of a one-layer model is derive_roofline.linear_ms with the preset's numbers."""
    for s in SUBSET[:4]:
        e = PRESETS.gpu(s.gpu).efficiency
        gbps, tflops, _ = derive_roofline.GPUS[s.gpu]
        expected = derive_roofline.linear_ms(s, e["bandwidth_efficiency"], e["layer_overhead_us"] * 1e-3, e["mfu"],
                                             e["gemm_half_tokens"], gbps * 1e6, tflops * 1e9)
        np.testing.assert_allclose(roofline_ms(s), expected, rtol=1e-12)


def test_pooled_defaults_are_worse_than_the_measured_ones_on_the_h100():
    """The point of per-GPU numbers: on the H100's measured layers, the pooled defaults err more."""
    measured, pooled = [], []
    for s in (s for s in SUBSET if s.gpu == "h100-80gb"):
        measured.extend(np.abs(np.log(roofline_ms(s) / s.dense_ms)))
        gpu = attrs.evolve(PRESETS.gpu("h100-80gb"), efficiency={})
        cost = RooflineCostModel(one_layer(s), gpu, RooflineConfig(model="x", gpu=gpu.name, attention_layer_us=0.0))
        pooled.extend(np.abs(np.log(np.array([cost.tokens_ms(int(t)) for t in s.tokens]) / s.dense_ms)))
    assert np.mean(measured) < np.mean(pooled)


# --- presets: measured or datasheet --------------------------------------------------------------


def test_every_gpu_preset_says_which_numbers_are_measured():
    """``schedlab plugins -v`` shows each preset's help: datasheet numbers, then which
    efficiencies were measured (on it, or on its architecture's profiled GPU) or pooled."""
    for spec, _ in GPUS:
        registered = PRESETS.gpu(spec.name)
        text = CATALOG["gpu"].get(spec.name).help
        assert "datasheet" in text
        efficiency = dict(registered.efficiency)
        # latent attention's decode: measured on the GPU, or on its architecture's, from its own source
        latent = spec.name if spec.name in MEASURED_LATENT_DECODE else SAME_ARCHITECTURE.get(spec.name)
        if latent in MEASURED_LATENT_DECODE:
            assert efficiency.pop("latent_decode_efficiency") == MEASURED_LATENT_DECODE[latent]
            assert "measured: latent_decode_efficiency" in text
        else:
            assert "latent_decode_efficiency" not in efficiency and "latent_decode" not in text
        # the routed experts: measured on the GPU (or its architecture's) by their own source too,
        # the 16-bit kernel's settings over the profile's, the FP8 kernel's under fp8_ keys
        experts = spec.name if spec.name in MEASURED_EXPERTS else SAME_ARCHITECTURE.get(spec.name)
        if experts in MEASURED_EXPERTS:
            for key, value in expert_efficiency(MEASURED_EXPERTS[experts]).items():
                assert efficiency.pop(key) == value
            assert "measured: the routed experts' settings, 16-bit, FP8 and 4-bit" in text
        else:
            assert "routed experts' settings" not in text
        if spec.name in MEASURED_EFFICIENCY:
            assert efficiency == MEASURED_EFFICIENCY[spec.name][0]
            assert "measured:" in text
        elif spec.name in SAME_ARCHITECTURE:
            sibling = SAME_ARCHITECTURE[spec.name]
            assert efficiency == MEASURED_EFFICIENCY[sibling][0]
            assert f"the {sibling} (same architecture)" in text
        else:
            assert efficiency == {}
            assert "pooled defaults" in text
        assert set(efficiency) <= set(DERIVATION)
        # every setting is named once: measured, or pooled
        named = text.split("measured: ", 1)[-1].split("; measured: ")[0]
        if spec.name in MEASURED_EFFICIENCY or spec.name in SAME_ARCHITECTURE:
            apart = experts in MEASURED_EXPERTS  # the experts' keys named by the note of their own
            assert all(key in named for key in DERIVATION
                       if key != "bandwidth_efficiency" and not (apart and key.startswith("expert"))), text


def test_the_config_wins_over_the_measured_value_and_that_over_the_pooled_one():
    model = PRESETS.model("llama-3-8b")
    h100 = RooflineCostModel(model, PRESETS.gpu("h100-80gb"), RooflineConfig(model=model.name, gpu="h100-80gb"))
    assert h100.settings.mfu == MEASURED_EFFICIENCY["h100-80gb"][0]["mfu"]
    assert h100.settings.kv_read_efficiency == DERIVATION["kv_read_efficiency"]  # no attention profile
    mine = RooflineCostModel(model, PRESETS.gpu("h100-80gb"),
                             RooflineConfig(model=model.name, gpu="h100-80gb", mfu=0.5))
    assert mine.settings.mfu == 0.5
    b200 = RooflineCostModel(model, PRESETS.gpu("b200"), RooflineConfig(model=model.name, gpu="b200"))
    assert b200.settings.mfu == DERIVATION["mfu"]
    assert b200.settings.bandwidth_efficiency == DERIVATION["bandwidth_efficiency"]


def test_a_gpu_table_with_a_wrong_key_or_value_is_refused():
    model = PRESETS.model("llama-3-8b")
    typo = GpuSpec("mine", memory_gib=80, hbm_bandwidth_gbps=2000, bf16_tflops=300, host_link_gbps=32,
                   efficiency={"mfuu": 0.5})
    with pytest.raises(ConfigError, match="unknown key 'mfuu'.*valid keys: attention_efficiency"):
        RooflineCostModel(model, typo, RooflineConfig(model=model.name, gpu="mine"))
    too_big = attrs.evolve(typo, efficiency={"mfu": 2.0})
    with pytest.raises(ConfigError, match="GPU 'mine': efficiency: mfu"):
        RooflineCostModel(model, too_big, RooflineConfig(model=model.name, gpu="mine"))
    with pytest.raises(Exception, match="efficiency"):
        GpuSpec("mine", memory_gib=80, hbm_bandwidth_gbps=2000, bf16_tflops=300, host_link_gbps=32,
                efficiency={"mfu": -1})


def test_new_datasheet_presets():
    for name, (gbps, tflops) in {"l40s": (864, 362.05), "a10g": (600, 70), "b200": (8000, 2250),
                                 "a40": (696, 149.7)}.items():
        spec = PRESETS.gpu(name)
        assert (spec.hbm_bandwidth_gbps, spec.bf16_tflops) == (gbps, tflops)
    # the A40's 48 GB of GDDR6 runs with ECC on: 1/16 of 49,152 MiB kept for it, 46,080, less 12 reserved --
    # nvidia-smi shows 46,068 MiB, as an L40S's
    assert PRESETS.gpu("a40").memory_gib == 46068 / 1024
    assert PRESETS.gpu("rtx-a6000").memory_gib == 49140 / 1024  # a workstation card: ECC off
    assert PRESETS.gpu("gh200-96gb").memory_gib == 97871 / 1024


def test_measured_memory_totals_replace_the_datasheet_gb():
    """What vLLM sizes its pool from is the total the card reports: an L40S's "48 GB" of GDDR6
    with ECC is 46,068 MiB; an A100's 80 GB of HBM is 81,920 MiB, the nominal GiB."""
    from schedlab_plugins.presets import MEASURED_MEMORY_MIB

    assert PRESETS.gpu("l40s").memory_gib == 46068 / 1024
    assert PRESETS.gpu("l4").memory_gib == 23034 / 1024
    assert PRESETS.gpu("h100-80gb").memory_gib == 81559 / 1024
    assert PRESETS.gpu("a100-80gb").memory_gib == 80
    assert PRESETS.gpu("b200").memory_gib == 183359 / 1024
    for name, (mib, where) in MEASURED_MEMORY_MIB.items():
        assert PRESETS.gpu(name).memory_gib * 1024 == mib
        assert f"memory: {mib:,} MiB as nvidia-smi reports it ({where})" in CATALOG["gpu"].get(name).help


def test_every_gpu_a_plan_may_meter_has_its_board_power():
    """A plan that meters energy ([power]) must not lose a GPU for want of its board power: every
    preset has one (datasheets; nvidia-smi's power limit where no datasheet is published), but
    the GH200, whose module power covers its CPU too."""
    from schedlab_plugins.presets import GPU_POWER

    assert {name: PRESETS.gpu(name).board_w for name in ("l40s", "a40", "a10g", "b200")} == {
        "l40s": 350, "a40": 300, "a10g": 300, "b200": 1000}
    assert [name for name in PRESETS.gpu_names() if PRESETS.gpu(name).board_w is None] == ["gh200-96gb"]
    assert all(PRESETS.gpu(name).board_w == fields["board_w"] for name, (fields, _) in GPU_POWER.items())


@pytest.mark.parametrize("model, gpu", [("llama-2-7b", "l40s"), ("llama-2-7b", "a40"), ("llama-2-7b", "a100-80gb"),
                                        ("qwen3-0.6b", "rtx-pro-6000-server")])
def test_a_token_added_to_a_decode_only_step_never_makes_it_cheaper(model, gpu):
    """FlashAttention 2's varlen kernel, read-bound (a multi-head model, or few query heads per
    KV head): the decodes riding with a prompt token lost their per-decode attention time, so
    the step came out 0.2-0.9% cheaper than the decodes alone (the conformance kit's "more work
    never costs less", found by hypothesis). Now they cost at least what they cost alone."""
    from schedlab.protocols import Batch

    cost = RooflineCostModel(PRESETS.model(model), PRESETS.gpu(gpu), RooflineConfig(model=model, gpu=gpu))
    assert cost._decodes_apart is False  # FlashAttention 2 on these GPUs
    for n, context in ((64, 2048), (256, 1024), (256, 4096)):
        alone = cost.iteration_ms(Batch(n, n * context, 0, 0, 0, context, context))
        with_prompt = cost.iteration_ms(Batch(n, n * context, 1, 1, 0, context, context))
        with_draft = cost.iteration_ms(Batch(n, n * context, 0, 0, 0, context, context, spec_tokens=1))
        assert with_prompt > alone and with_draft > alone, (n, context, alone, with_prompt, with_draft)
