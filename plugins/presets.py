"""Built-in model and GPU presets, registered through the same hooks a third-party plugin uses.

Model numbers are the Hugging Face ``config.json`` values (``num_hidden_layers``,
``num_key_value_heads``, ``num_attention_heads``, ``hidden_size / num_attention_heads``) and
the checkpoint's parameter count. GPU numbers are from NVIDIA datasheets: memory is the
nominal capacity (taken as GiB), bandwidth is peak HBM/GDDR bandwidth in GB/s, compute is
dense bf16 tensor TFLOPS (half the "with sparsity" figure), and the host link is one
direction of the GPU's PCIe or NVLink-C2C connection to the CPU. How GPUs talk to each other
is the machine's, not the GPU's: ``plugins/cost_models/collectives.py`` has the machines
(``TOPOLOGIES``) and the one each GPU preset is usually found in (``GPU_DEFAULT_TOPOLOGY``).
Each preset's note is its help text in ``schedlab plugins``.

The roofline cost model's efficiencies (how much of the datasheet's bandwidth and compute the
kernels reach) are measured, not from a datasheet: :data:`MEASURED_EFFICIENCY` holds what
``tools/derive_roofline.py`` derives from the profiled GPUs, and a GPU of the same
architecture takes its profiled sibling's (:data:`SAME_ARCHITECTURE`); every other setting
falls back to the pooled defaults (``plugins/cost_models/roofline.py``, ``DERIVATION``). The
help text of each GPU says which numbers are measured and which come from its datasheet.
"""

from __future__ import annotations

import attrs

import schedlab
from schedlab.capacity import GpuSpec, ModelSpec

#: (spec, source note) for every built-in model.
MODELS: tuple[tuple[ModelSpec, str], ...] = (
    (ModelSpec("llama-2-7b", num_layers=32, num_kv_heads=32, head_dim=128, num_params=6_738_415_616,
               num_attention_heads=32, hidden_size=4096,
               hf_id="meta-llama/Llama-2-7b-hf"),
     "meta-llama/Llama-2-7b-hf config.json: 32 layers, 32 heads (MHA), hidden 4096; 6.74B params"),
    (ModelSpec("llama-2-13b", num_layers=40, num_kv_heads=40, head_dim=128, num_params=13_015_864_320,
               num_attention_heads=40, hidden_size=5120,
               hf_id="meta-llama/Llama-2-13b-hf"),
     "meta-llama/Llama-2-13b-hf config.json: 40 layers, 40 heads (MHA), hidden 5120; 13.0B params"),
    (ModelSpec("llama-2-70b", num_layers=80, num_kv_heads=8, head_dim=128, num_params=68_976_648_192,
               num_attention_heads=64, hidden_size=8192,
               hf_id="meta-llama/Llama-2-70b-hf"),
     "meta-llama/Llama-2-70b-hf config.json: 80 layers, 64 heads / 8 KV heads, hidden 8192; 69.0B params"),
    (ModelSpec("llama-3-8b", num_layers=32, num_kv_heads=8, head_dim=128, num_params=8_030_261_248,
               num_attention_heads=32, hidden_size=4096,
               hf_id="meta-llama/Meta-Llama-3-8B"),
     "meta-llama/Meta-Llama-3-8B config.json: 32 layers, 32 heads / 8 KV heads, hidden 4096; 8.03B params"),
    (ModelSpec("llama-3-70b", num_layers=80, num_kv_heads=8, head_dim=128, num_params=70_553_706_496,
               num_attention_heads=64, hidden_size=8192,
               hf_id="meta-llama/Meta-Llama-3-70B"),
     "meta-llama/Meta-Llama-3-70B config.json: 80 layers, 64 heads / 8 KV heads, hidden 8192; 70.6B params"),
    (ModelSpec("mistral-7b", num_layers=32, num_kv_heads=8, head_dim=128, num_params=7_241_732_096,
               num_attention_heads=32, hidden_size=4096,
               hf_id="mistralai/Mistral-7B-v0.1"),
     "mistralai/Mistral-7B-v0.1 config.json: 32 layers, 32 heads / 8 KV heads, hidden 4096; 7.24B params"),
    (ModelSpec("qwen2.5-7b", num_layers=28, num_kv_heads=4, head_dim=128, num_params=7_615_616_512,
               num_attention_heads=28, hidden_size=3584,
               hf_id="Qwen/Qwen2.5-7B"),
     "Qwen/Qwen2.5-7B config.json: 28 layers, 28 heads / 4 KV heads, hidden 3584; 7.62B params"),
    (ModelSpec("qwen2.5-72b", num_layers=80, num_kv_heads=8, head_dim=128, num_params=72_706_203_648,
               num_attention_heads=64, hidden_size=8192,
               hf_id="Qwen/Qwen2.5-72B"),
     "Qwen/Qwen2.5-72B config.json: 80 layers, 64 heads / 8 KV heads, hidden 8192; 72.7B params"),
    # A draft model for speculative decoding beside the Llama-3 8B models (same tokenizer). Its
    # embeddings are tied: the table is read every iteration as the lm_head, so vocab_size is
    # left unset and the roofline counts every parameter as read.
    (ModelSpec("llama-3.2-1b", num_layers=16, num_kv_heads=8, head_dim=64, num_params=1_235_814_400,
               num_attention_heads=32, hidden_size=2048,
               hf_id="meta-llama/Llama-3.2-1B"),
     "meta-llama/Llama-3.2-1B config.json: 16 layers, 32 heads / 8 KV heads, head_dim 64, hidden 2048, FFN 8192, "
     "tied embeddings; 1.24B params (a draft model for Llama-3/3.1 8B)"),
    # The three models of the shared calibration profiles; parameter counts computed from the
    # config.json shapes by tools/derive_roofline.py (untied embeddings, norms included).
    (ModelSpec("llama-3.1-8b", num_layers=32, num_kv_heads=8, head_dim=128, num_params=8_030_261_248,
               num_attention_heads=32, hidden_size=4096, vocab_size=128256,
               hf_id="meta-llama/Llama-3.1-8B"),
     "meta-llama/Llama-3.1-8B config.json: 32 layers, 32 heads / 8 KV heads, hidden 4096, FFN 14336; 8.03B params"),
    (ModelSpec("qwen3-32b", num_layers=64, num_kv_heads=8, head_dim=128, num_params=32_762_123_264,
               num_attention_heads=64, hidden_size=5120, vocab_size=151936,
               hf_id="Qwen/Qwen3-32B"),
     "Qwen/Qwen3-32B config.json: 64 layers, 64 heads / 8 KV heads, head_dim 128, hidden 5120, FFN 25600; "
     "32.8B params"),
    (ModelSpec("qwen3-30b-a3b", num_layers=48, num_kv_heads=4, head_dim=128, num_params=30_532_122_624,
               num_attention_heads=32, hidden_size=2048, vocab_size=151936, num_experts=128,
               experts_per_token=8, active_params=3_353_032_704,
               hf_id="Qwen/Qwen3-30B-A3B-Instruct-2507"),
     "Qwen/Qwen3-30B-A3B-Instruct-2507 config.json: 48 layers, 32 heads / 4 KV heads, hidden 2048, "
     "128 experts of FFN 768, 8 per token; 30.5B params resident, 3.3B active"),
)

#: (spec, source note) for every built-in GPU.
GPUS: tuple[tuple[GpuSpec, str], ...] = (
    (GpuSpec("a100-40gb", memory_gib=40, hbm_bandwidth_gbps=1555, bf16_tflops=312, host_link_gbps=32),
     "A100 40GB SXM datasheet: 40 GB HBM2, 1,555 GB/s, 312 TFLOPS bf16 dense; PCIe Gen4 x16 (32 GB/s each way); "
     "NVLink 3 600 GB/s (300 each way)"),
    (GpuSpec("a100-80gb", memory_gib=80, hbm_bandwidth_gbps=2039, bf16_tflops=312, host_link_gbps=32),
     "A100 80GB SXM datasheet: 80 GB HBM2e, 2,039 GB/s, 312 TFLOPS bf16 dense; PCIe Gen4 x16 (32 GB/s each way); "
     "NVLink 3 600 GB/s (300 each way)"),
    (GpuSpec("h100-80gb", memory_gib=80, hbm_bandwidth_gbps=3350, bf16_tflops=989, host_link_gbps=64),
     "H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS bf16 dense; PCIe Gen5 x16 (64 GB/s each way); "
     "NVLink 4 900 GB/s (450 each way)"),
    (GpuSpec("h100-pcie-80gb", memory_gib=80, hbm_bandwidth_gbps=2000, bf16_tflops=756, host_link_gbps=64),
     "H100 PCIe datasheet: 80 GB HBM2e, 2 TB/s, 756 TFLOPS bf16 dense; PCIe Gen5 x16 (64 GB/s each way); "
     "NVLink bridge 600 GB/s (300 each way)"),
    (GpuSpec("h200-141gb", memory_gib=141, hbm_bandwidth_gbps=4800, bf16_tflops=989, host_link_gbps=64),
     "H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS bf16 dense; PCIe Gen5 x16 (64 GB/s each way); "
     "NVLink 4 900 GB/s (450 each way)"),
    (GpuSpec("gh200-96gb", memory_gib=96, hbm_bandwidth_gbps=4000, bf16_tflops=989, host_link_gbps=450),
     "GH200 Grace Hopper datasheet: 96 GB HBM3, 4 TB/s, 989 TFLOPS bf16 dense; NVLink-C2C 900 GB/s (450 each way); "
     "NVLink 4 to other GPUs"),
    (GpuSpec("l4", memory_gib=24, hbm_bandwidth_gbps=300, bf16_tflops=121, host_link_gbps=32),
     "L4 datasheet: 24 GB GDDR6, 300 GB/s, 121 TFLOPS bf16 dense (242 sparse); PCIe Gen4 x16 (32 GB/s each way), "
     "no NVLink"),
    # The GPUs of the shared calibration profiles (no NVLink: collectives go over PCIe).
    (GpuSpec("rtx-pro-6000", memory_gib=96, hbm_bandwidth_gbps=1792, bf16_tflops=503.8, host_link_gbps=64),
     "RTX PRO 6000 Blackwell Workstation Edition datasheet: 96 GB GDDR7, 1,792 GB/s, 503.8 TFLOPS bf16 dense "
     "(4 PFLOPS FP4 sparse / 8); PCIe Gen5 x16 (64 GB/s each way), no NVLink"),
    (GpuSpec("rtx-pro-6000-server", memory_gib=96, hbm_bandwidth_gbps=1597, bf16_tflops=503.8, host_link_gbps=64),
     "RTX PRO 6000 Blackwell Server Edition datasheet: 96 GB GDDR7 at 1,597 GB/s (the profiled card), "
     "503.8 TFLOPS bf16 dense; PCIe Gen5 x16 (64 GB/s each way), no NVLink"),
    (GpuSpec("rtx-4090", memory_gib=24, hbm_bandwidth_gbps=1008, bf16_tflops=165.2, host_link_gbps=32),
     "GeForce RTX 4090 datasheet (Ada whitepaper): 24 GB GDDR6X, 1,008 GB/s, 165.2 TFLOPS bf16 dense with FP32 accumulate; "
     "PCIe Gen4 x16 (32 GB/s each way), no NVLink or P2P"),
    # The third GPU of Vidur's profiles, and cards without a public profile.
    (GpuSpec("a40", memory_gib=48, hbm_bandwidth_gbps=696, bf16_tflops=149.7, host_link_gbps=32),
     "A40 datasheet: 48 GB GDDR6, 696 GB/s, 149.7 TFLOPS bf16 dense (299.4 sparse); PCIe Gen4 x16 (32 GB/s each "
     "way); NVLink bridge 112.5 GB/s (56.25 each way)"),
    (GpuSpec("l40s", memory_gib=48, hbm_bandwidth_gbps=864, bf16_tflops=362.05, host_link_gbps=32),
     "L40S datasheet: 48 GB GDDR6, 864 GB/s, 362.05 TFLOPS bf16 dense (733 sparse); PCIe Gen4 x16 (32 GB/s each "
     "way), no NVLink"),
    (GpuSpec("a10g", memory_gib=24, hbm_bandwidth_gbps=600, bf16_tflops=70, host_link_gbps=32),
     "A10G (AWS G5; AWS publishes no datasheet): 24 GB GDDR6, 600 GB/s, 70 TFLOPS bf16 tensor dense (the A10's "
     "125 is not the A10G's; Baseten, 'NVIDIA A10 vs A10G for ML model inference'); PCIe Gen4 x16, no NVLink"),
    (GpuSpec("b200", memory_gib=180, hbm_bandwidth_gbps=8000, bf16_tflops=2250, host_link_gbps=64,
             interconnect_gbps=900, interconnect_latency_us=5.0),
     "B200 (HGX B200) datasheet: 180 GB HBM3e, 8 TB/s, 2.25 PFLOPS bf16 dense (4.5 sparse); PCIe Gen5 x16 (64 GB/s "
     "each way); NVLink 5 1.8 TB/s (900 each way), NVSwitch"),
)

# --- measured efficiencies (the roofline cost model) ------------------------------------------
# Kept apart from GPUS so the numbers measured on a GPU read apart from its datasheet; they
# are merged into each GpuSpec (its ``efficiency`` table) when it is registered.

#: What ``python tools/derive_roofline.py`` prints per profiled GPU: the dense part of a layer
#: (its GEMMs and the small operators between them) from Vidur's profiles (H100 SXM, A100 80 GB,
#: A40: 21-29 model x TP series each) or LLMServingSim's (RTX PRO 6000 Server: 4 series, RTX
#: 4090: 1, whose fixed time per layer is the others' median), and attention from
#: LLMServingSim's only.
MEASURED_EFFICIENCY: dict[str, tuple[dict, str]] = {
    "rtx-pro-6000-server": ({"bandwidth_efficiency": 0.979, "layer_overhead_us": 25.7, "mfu": 0.78,
                             "gemm_half_tokens": 55, "kv_read_efficiency": 0.86, "attention_efficiency": 0.48,
                             "mixed_decode_query_rows": 70},
                            "LLMServingSim's vLLM 0.19 profiles, 3 models at TP 1 and 2"),
    "rtx-4090": ({"bandwidth_efficiency": 0.963, "layer_overhead_us": 26.2, "mfu": 0.99, "gemm_half_tokens": 2,
                  "kv_read_efficiency": 0.92, "attention_efficiency": 0.74, "mixed_decode_query_rows": 77},
                 "LLMServingSim's vLLM 0.19 profile, Llama-3.1-8B at TP 1"),
    "h100-80gb": ({"bandwidth_efficiency": 0.846, "layer_overhead_us": 26.8, "mfu": 0.61, "gemm_half_tokens": 18},
                  "Vidur's profiles, 6 models at TP 1-8"),
    "a100-80gb": ({"bandwidth_efficiency": 0.776, "layer_overhead_us": 36.0, "mfu": 0.66, "gemm_half_tokens": 0},
                  "Vidur's profiles, 8 models at TP 1-8"),
    "a40": ({"bandwidth_efficiency": 0.798, "layer_overhead_us": 24.2, "mfu": 0.69, "gemm_half_tokens": 23},
            "Vidur's profiles, 6 models at TP 1-8"),
}
#: GPUs without a profile of their own that share a profiled GPU's chip family and its
#: datasheet's way of counting (and so, as far as anything public says, its kernels'
#: efficiency): they take its measured efficiencies with their own datasheet peaks. The L4 and
#: L40S are not here: the only Ada profile is a GeForce card, whose datasheet counts bf16 with
#: FP32 accumulate at half the rate a datacenter Ada's does (the 4090 reaches 0.99 of it).
SAME_ARCHITECTURE = {"a100-40gb": "a100-80gb", "h100-pcie-80gb": "h100-80gb", "h200-141gb": "h100-80gb",
                     "gh200-96gb": "h100-80gb", "rtx-pro-6000": "rtx-pro-6000-server", "a10g": "a40"}
#: The efficiencies only LLMServingSim's profiles measure (attention); elsewhere pooled.
ATTENTION_KEYS = ("kv_read_efficiency", "attention_efficiency", "mixed_decode_query_rows")


def with_efficiency(spec: GpuSpec) -> tuple[GpuSpec, str]:
    """``spec`` with the efficiencies measured on it (or on its architecture's profiled GPU),
    and a note saying which numbers are measured and which come from the datasheet."""
    source = spec.name if spec.name in MEASURED_EFFICIENCY else SAME_ARCHITECTURE.get(spec.name)
    if source is None:
        return spec, "efficiencies: pooled defaults (no profile of this GPU or its architecture)"
    measured, where = MEASURED_EFFICIENCY[source]
    pooled = [k for k in ATTENTION_KEYS if k not in measured]
    of = "" if source == spec.name else f"the {source} (same architecture) in "
    note = f"measured: {', '.join(measured)} ({of}{where})"
    if pooled:
        note += f"; pooled: {', '.join(pooled)}"
    return attrs.evolve(spec, efficiency={**measured, **spec.efficiency}), note


@schedlab.hookimpl
def schedlab_register_models(register):
    for spec, note in MODELS:
        register(spec.name, spec, help=note)


@schedlab.hookimpl
def schedlab_register_gpus(register):
    for spec, note in GPUS:
        spec, measured = with_efficiency(spec)
        register(spec.name, spec, help=f"{note}; {measured}")
