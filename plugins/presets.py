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
    # The GPU of the shared power traces (LLMServingSim 2.0's validation node).
    # No machine preset has its NVLink bridge: collectives use the GPU's own link (collectives.machine).
    (GpuSpec("rtx-a6000", memory_gib=48, hbm_bandwidth_gbps=768, bf16_tflops=154.8, host_link_gbps=32,
             interconnect_gbps=56.25, interconnect_latency_us=5.0),
     "RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s, 154.8 TFLOPS bf16 dense with FP32 accumulate (309.7 sparse); "
     "PCIe Gen4 x16 (32 GB/s each way); NVLink bridge 112.5 GB/s (56.25 each way)"),
)


# --- power (schedlab.energy) ---------------------------------------------------------------------
# Kept apart from GPUS so the power numbers can be read, sourced and changed on their own; they
# are merged into each GpuSpec when it is registered. board_w and the clocks are datasheet
# numbers. Datasheets give no idle power: it is set only where a measurement is at hand, else
# the power models take 12% of board_w (the measured A6000's share, 33 of 300 W, rounded up).
# The lowest lockable SM clock is 210 MHz on every one of these (nvidia-smi SUPPORTED_CLOCKS).

#: GPU preset -> (power fields, source note)
GPU_POWER: dict[str, tuple[dict, str]] = {
    "a100-40gb": ({"board_w": 400, "max_clock_mhz": 1410, "min_clock_mhz": 210},
                  "A100 SXM4 datasheet: 400 W max TDP, 1,410 MHz boost"),
    "a100-80gb": ({"board_w": 400, "max_clock_mhz": 1410, "min_clock_mhz": 210},
                  "A100 80GB SXM4 datasheet: 400 W max TDP, 1,410 MHz boost"),
    "h100-80gb": ({"board_w": 700, "max_clock_mhz": 1980, "min_clock_mhz": 210},
                  "H100 SXM5 datasheet: up to 700 W (configurable), 1,980 MHz max boost"),
    "h100-pcie-80gb": ({"board_w": 350, "max_clock_mhz": 1755, "min_clock_mhz": 210},
                       "H100 PCIe datasheet: 300-350 W (configurable), 1,755 MHz max boost"),
    "h200-141gb": ({"board_w": 700, "max_clock_mhz": 1980, "min_clock_mhz": 210},
                   "H200 SXM datasheet: up to 700 W (configurable), 1,980 MHz max boost"),
    "l4": ({"board_w": 72, "max_clock_mhz": 2040, "min_clock_mhz": 210},
           "L4 datasheet: 72 W max TDP, 2,040 MHz max boost"),
    "rtx-pro-6000": ({"board_w": 600, "min_clock_mhz": 210},
                     "RTX PRO 6000 Blackwell Workstation Edition datasheet: 600 W total board power"),
    "rtx-pro-6000-server": ({"board_w": 600, "min_clock_mhz": 210},
                            "RTX PRO 6000 Blackwell Server Edition datasheet: up to 600 W (configurable 400-600 W)"),
    "rtx-4090": ({"board_w": 450, "max_clock_mhz": 2520, "min_clock_mhz": 210},
                 "GeForce RTX 4090 specifications: 450 W total graphics power, 2,520 MHz boost"),
    "rtx-a6000": ({"board_w": 300, "idle_w": 33.0, "max_clock_mhz": 1800, "min_clock_mhz": 210},
                  "RTX A6000 datasheet: 300 W max power consumption, 1,800 MHz boost; idle 33 W: nvidia-smi before "
                  "the first request in LLMServingSim 2.0's power traces (calibration/energy/llmservingsim-power)"),
}


def with_power(spec: GpuSpec) -> tuple[GpuSpec, str]:
    """``spec`` with its power numbers from :data:`GPU_POWER` (unchanged when it has none), and
    their source note."""
    fields, note = GPU_POWER.get(spec.name, ({}, ""))
    return (attrs.evolve(spec, **fields) if fields else spec), note


@schedlab.hookimpl
def schedlab_register_models(register):
    for spec, note in MODELS:
        register(spec.name, spec, help=note)


@schedlab.hookimpl
def schedlab_register_gpus(register):
    for spec, note in GPUS:
        spec, power_note = with_power(spec)
        register(spec.name, spec, help=f"{note}; {power_note}" if power_note else note)
