"""Built-in model and GPU presets, registered through the same hooks a third-party plugin uses.

Model numbers are the Hugging Face ``config.json`` values (``num_hidden_layers``,
``num_key_value_heads``, ``num_attention_heads``, ``hidden_size / num_attention_heads``) and
the checkpoint's parameter count. GPU numbers are from NVIDIA datasheets: memory is the
nominal capacity (taken as GiB) unless :data:`MEASURED_MEMORY_MIB` has the total the card
reports (what vLLM sizes its pool from; "24 GB" of GDDR6 with ECC on is 23,034 MiB), bandwidth is peak HBM/GDDR bandwidth in GB/s, compute is
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

from .cost_models.roofline import EXPERT_KERNELS, EXPERT_SETTINGS

def shape_params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, vocab: int, *,
                 tied: bool = False, qk_norm: bool = False, experts: int = 0, top_k: int = 0,
                 expert_ffn: int = 0) -> tuple[int, int]:
    """``(parameters, active parameters)`` of a Llama-shaped decoder from its ``config.json``:
    attention (Q and O of ``heads x head_dim``, K and V of ``kv_heads x head_dim``), two RMSNorms
    a layer (and Qwen3's per-head Q/K norms), a gated MLP of width ``ffn`` or ``experts`` routed
    experts of ``expert_ffn`` with a router (``top_k`` of them active), the embedding table and
    an LM head (one table when ``tied``) and the final norm. Biases and attention sinks are not
    counted (gpt-oss: 0.02% of its parameters)."""
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    norms = 2 * hidden + (2 * head_dim if qk_norm else 0)
    if experts:
        expert = 3 * hidden * expert_ffn
        total_layer = attn + norms + hidden * experts + experts * expert
        active_layer = attn + norms + hidden * experts + top_k * expert
    else:
        total_layer = active_layer = attn + norms + 3 * hidden * ffn
    tables = (1 if tied else 2) * vocab * hidden + hidden
    return layers * total_layer + tables, layers * active_layer + tables


def _shaped(name: str, hf_id: str, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
            vocab: int, *, tied: bool = False, qk_norm: bool = False, experts: int = 0, top_k: int = 0,
            expert_ffn: int = 0, **extra) -> ModelSpec:
    """A preset whose parameter counts come from its shapes (:func:`shape_params`)."""
    total, active = shape_params(layers, hidden, heads, kv_heads, head_dim, ffn, vocab, tied=tied, qk_norm=qk_norm,
                                 experts=experts, top_k=top_k, expert_ffn=expert_ffn)
    return ModelSpec(name, num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, num_params=total,
                     num_attention_heads=heads, hidden_size=hidden, vocab_size=vocab, tied_embeddings=tied,
                     num_experts=experts, experts_per_token=top_k, active_params=active if experts else None,
                     hf_id=hf_id, **extra)


#: (spec, source note) for every built-in model. Parameter counts are the checkpoints' (the
#: older presets) or :func:`shape_params` of the config's shapes, which reproduces those.
MODELS: tuple[tuple[ModelSpec, str], ...] = (
    (ModelSpec("llama-2-7b", num_layers=32, num_kv_heads=32, head_dim=128, num_params=6_738_415_616,
               num_attention_heads=32, hidden_size=4096, vocab_size=32000,
               hf_id="meta-llama/Llama-2-7b-hf"),
     "meta-llama/Llama-2-7b-hf config.json: 32 layers, 32 heads (MHA), hidden 4096, vocab 32,000; 6.74B params"),
    (ModelSpec("llama-2-13b", num_layers=40, num_kv_heads=40, head_dim=128, num_params=13_015_864_320,
               num_attention_heads=40, hidden_size=5120, vocab_size=32000,
               hf_id="meta-llama/Llama-2-13b-hf"),
     "meta-llama/Llama-2-13b-hf config.json: 40 layers, 40 heads (MHA), hidden 5120, vocab 32,000; 13.0B params"),
    (ModelSpec("llama-2-70b", num_layers=80, num_kv_heads=8, head_dim=128, num_params=68_976_648_192,
               num_attention_heads=64, hidden_size=8192, vocab_size=32000,
               hf_id="meta-llama/Llama-2-70b-hf"),
     "meta-llama/Llama-2-70b-hf config.json: 80 layers, 64 heads / 8 KV heads, hidden 8192, vocab 32,000; "
     "69.0B params"),
    (_shaped("codellama-34b", "codellama/CodeLlama-34b-hf", 48, 8192, 64, 8, 128, 22016, 32000),
     "codellama/CodeLlama-34b-hf config.json: 48 layers, 64 heads / 8 KV heads, hidden 8192, FFN 22016, "
     "vocab 32,000; 33.7B params"),
    (ModelSpec("llama-3-8b", num_layers=32, num_kv_heads=8, head_dim=128, num_params=8_030_261_248,
               num_attention_heads=32, hidden_size=4096, vocab_size=128256,
               hf_id="meta-llama/Meta-Llama-3-8B"),
     "meta-llama/Meta-Llama-3-8B config.json: 32 layers, 32 heads / 8 KV heads, hidden 4096, vocab 128,256; "
     "8.03B params"),
    (ModelSpec("llama-3-70b", num_layers=80, num_kv_heads=8, head_dim=128, num_params=70_553_706_496,
               num_attention_heads=64, hidden_size=8192, vocab_size=128256,
               hf_id="meta-llama/Meta-Llama-3-70B"),
     "meta-llama/Meta-Llama-3-70B config.json: 80 layers, 64 heads / 8 KV heads, hidden 8192, vocab 128,256; "
     "70.6B params"),
    (_shaped("llama-3.3-70b", "meta-llama/Llama-3.3-70B-Instruct", 80, 8192, 64, 8, 128, 28672, 128256),
     "meta-llama/Llama-3.3-70B-Instruct config.json: the Llama-3 70B shapes (80 layers, 64 heads / 8 KV heads, "
     "hidden 8192, FFN 28672, vocab 128,256); 70.6B params"),
    (ModelSpec("mistral-7b", num_layers=32, num_kv_heads=8, head_dim=128, num_params=7_241_732_096,
               num_attention_heads=32, hidden_size=4096, vocab_size=32000,
               hf_id="mistralai/Mistral-7B-v0.1"),
     "mistralai/Mistral-7B-v0.1 config.json: 32 layers, 32 heads / 8 KV heads, hidden 4096, vocab 32,000; 7.24B "
     "params (its 4,096-token sliding window on every layer is not modelled: KV counted whole)"),
    (_shaped("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 32, 4096, 32, 8, 128, 0, 32000, experts=8, top_k=2,
             expert_ffn=14336),
     "mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, 32 heads / 8 KV heads, hidden 4096, 8 experts of FFN "
     "14336, 2 per token, vocab 32,000; 46.7B params, 12.9B active"),
    (_shaped("mixtral-8x22b", "mistralai/Mixtral-8x22B-v0.1", 56, 6144, 48, 8, 128, 0, 32000, experts=8, top_k=2,
             expert_ffn=16384),
     "mistralai/Mixtral-8x22B-v0.1 config.json: 56 layers, 48 heads / 8 KV heads, hidden 6144, 8 experts of FFN "
     "16384, 2 per token, vocab 32,000; 140.6B params, 39.2B active"),
    (ModelSpec("qwen2.5-7b", num_layers=28, num_kv_heads=4, head_dim=128, num_params=7_615_616_512,
               num_attention_heads=28, hidden_size=3584, vocab_size=152064,
               hf_id="Qwen/Qwen2.5-7B"),
     "Qwen/Qwen2.5-7B config.json: 28 layers, 28 heads / 4 KV heads, hidden 3584, vocab 152,064; 7.62B params"),
    (ModelSpec("qwen2.5-72b", num_layers=80, num_kv_heads=8, head_dim=128, num_params=72_706_203_648,
               num_attention_heads=64, hidden_size=8192, vocab_size=152064,
               hf_id="Qwen/Qwen2.5-72B"),
     "Qwen/Qwen2.5-72B config.json: 80 layers, 64 heads / 8 KV heads, hidden 8192, vocab 152,064; 72.7B params"),
    # A draft model for speculative decoding beside the Llama-3 8B models (same tokenizer). Its
    # embeddings are tied: the table is read every iteration as the LM head.
    (ModelSpec("llama-3.2-1b", num_layers=16, num_kv_heads=8, head_dim=64, num_params=1_235_814_400,
               num_attention_heads=32, hidden_size=2048, vocab_size=128256, tied_embeddings=True,
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
    # The rest of the Qwen3 family (head_dim 128 throughout; the three small ones tie embeddings).
    *((_shaped(f"qwen3-{size}", f"Qwen/Qwen3-{size.upper()}", layers, hidden, heads, 8, 128, ffn, 151936,
               qk_norm=True, tied=tied),
       f"Qwen/Qwen3-{size.upper()} config.json: {layers} layers, {heads} heads / 8 KV heads, head_dim 128, hidden "
       f"{hidden}, FFN {ffn}{', tied embeddings' if tied else ''}, vocab 151,936")
      for size, layers, hidden, heads, ffn, tied in (("0.6b", 28, 1024, 16, 3072, True),
                                                     ("1.7b", 28, 2048, 16, 6144, True),
                                                     ("4b", 36, 2560, 32, 9728, True),
                                                     ("8b", 36, 4096, 32, 12288, False),
                                                     ("14b", 40, 5120, 40, 17408, False))),
    (_shaped("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", 94, 4096, 64, 4, 128, 0, 151936, qk_norm=True, experts=128,
             top_k=8, expert_ffn=1536),
     "Qwen/Qwen3-235B-A22B config.json: 94 layers, 64 heads / 4 KV heads, head_dim 128, hidden 4096, 128 experts "
     "of FFN 1536, 8 per token, vocab 151,936; 235B params, 22.2B active"),
    # gpt-oss: MXFP4 experts (4-bit values, an 8-bit scale per 32: 4.25 bits), the rest bf16;
    # every other layer attends to a 128-token sliding window.
    *((_shaped(f"gpt-oss-{size}", f"openai/gpt-oss-{size}", layers, 2880, 64, 8, 64, 0, 201088, experts=experts,
               top_k=4, expert_ffn=2880, expert_dtype_bytes=0.53125, sliding_window=128,
               sliding_window_layers=layers // 2),
       f"openai/gpt-oss-{size} config.json: {layers} layers (every other one a 128-token sliding window), 64 heads "
       f"/ 8 KV heads of 64, hidden 2880, {experts} experts of FFN 2880 in MXFP4, 4 per token, vocab 201,088; "
       f"{total} params (model card)")
      for size, layers, experts, total in (("20b", 24, 32, "20.9B"), ("120b", 36, 128, "116.8B"))),
    # DeepSeek-V3: multi-head latent attention (a 512 + 64 latent per token and layer holds K and
    # V), FP8 weights, 256 routed experts + 1 shared, 8 per token, the first 3 layers dense.
    (ModelSpec("deepseek-v3", num_layers=61, num_kv_heads=128, head_dim=128, num_params=671e9,
               num_attention_heads=128, hidden_size=7168, vocab_size=129280, num_experts=256, experts_per_token=8,
               active_params=37e9, weight_dtype_bytes=1.0, table_dtype_bytes=2.0, fp8_activations=True,
               kv_latent_dim=576, kv_rope_dim=64, qk_head_dim=192, moe_layers=58, hf_id="deepseek-ai/DeepSeek-V3"),
     "deepseek-ai/DeepSeek-V3 config.json: 61 layers, MLA (kv_lora_rank 512 + qk_rope_head_dim 64 = a 576-element "
     "KV latent per token and layer, bf16), 128 heads, hidden 7168, 256 routed experts of FFN 2048 + 1 shared, 8 "
     "per token in 58 layers (the first 3 dense: first_k_dense_replace), vocab 129,280, FP8 weights (the "
     "embedding and LM head bf16); 671B params, 37B active (model "
     "card; the MTP module's 14B not counted). Prefill attention over heads of 192 for QK and 128 for V; decodes "
     "absorbed over the latent"),
)

#: config.json values of each preset's ``hf_id`` beyond its shapes: (``max_position_embeddings``,
#: ``intermediate_size``). The context is vLLM's default ``max_model_len`` (the long-context models'
#: configs already hold their rope-scaled length: Llama-3.1/3.2/3.3 131,072, gpt-oss 131,072,
#: DeepSeek-V3 163,840); the intermediate size is as written -- a MoE model's dense width, which
#: TGI's launcher multiplies by the experts per token.
CONFIG_VALUES = {
    "llama-2-7b": (4096, 11008), "llama-2-13b": (4096, 13824), "llama-2-70b": (4096, 28672),
    "codellama-34b": (16384, 22016), "llama-3-8b": (8192, 14336), "llama-3-70b": (8192, 28672),
    "llama-3.3-70b": (131072, 28672), "mistral-7b": (32768, 14336), "mixtral-8x7b": (32768, 14336),
    "mixtral-8x22b": (65536, 16384), "qwen2.5-7b": (131072, 18944), "qwen2.5-72b": (131072, 29568),
    "llama-3.2-1b": (131072, 8192), "llama-3.1-8b": (131072, 14336), "qwen3-32b": (40960, 25600),
    "qwen3-30b-a3b": (262144, 6144), "qwen3-0.6b": (40960, 3072), "qwen3-1.7b": (40960, 6144),
    "qwen3-4b": (40960, 9728), "qwen3-8b": (40960, 12288), "qwen3-14b": (40960, 17408),
    "qwen3-235b-a22b": (40960, 12288), "gpt-oss-20b": (131072, 2880), "gpt-oss-120b": (131072, 2880),
    "deepseek-v3": (163840, 18432),
}
CONTEXT_LENGTHS = {name: context for name, (context, _) in CONFIG_VALUES.items()}
SHARED_EXPERTS = {"deepseek-v3": 1}
MODELS = tuple((attrs.evolve(spec, max_position_embeddings=CONFIG_VALUES[spec.name][0],
                             intermediate_size=CONFIG_VALUES[spec.name][1],
                             shared_experts=SHARED_EXPERTS.get(spec.name, 0)),
                f"{note}; context {CONTEXT_LENGTHS[spec.name]:,} tokens") for spec, note in MODELS)

#: (spec, source note) for every built-in GPU.
GPUS: tuple[tuple[GpuSpec, str], ...] = (
    (GpuSpec("a100-40gb", memory_gib=40, hbm_bandwidth_gbps=1555, bf16_tflops=312, host_link_gbps=32),
     "A100 40GB SXM datasheet: 40 GB HBM2, 1,555 GB/s, 312 TFLOPS bf16 dense; PCIe Gen4 x16 (32 GB/s each way); NVLink "
     "3 600 GB/s (300 each way)"),
    (GpuSpec("a100-80gb", memory_gib=80, hbm_bandwidth_gbps=2039, bf16_tflops=312, host_link_gbps=32),
     "A100 80GB SXM datasheet: 80 GB HBM2e, 2,039 GB/s, 312 TFLOPS bf16 dense; PCIe Gen4 x16 (32 GB/s each way); "
     "NVLink 3 600 GB/s (300 each way)"),
    (GpuSpec("h100-80gb", memory_gib=80, hbm_bandwidth_gbps=3350, bf16_tflops=989, fp8_tflops=1979, host_link_gbps=64),
     "H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS bf16 dense, 1,979 FP8 dense (3,958 sparse); PCIe Gen5 x16 "
     "(64 GB/s each way); NVLink 4 900 GB/s (450 each way)"),
    (GpuSpec("h100-pcie-80gb", memory_gib=80, hbm_bandwidth_gbps=2000, bf16_tflops=756, fp8_tflops=1513,
             host_link_gbps=64),
     "H100 PCIe datasheet: 80 GB HBM2e, 2 TB/s, 756 TFLOPS bf16 dense, 1,513 FP8 dense (3,026 sparse); PCIe Gen5 x16 "
     "(64 GB/s each way); NVLink bridge 600 GB/s (300 each way)"),
    (GpuSpec("h200-141gb", memory_gib=141, hbm_bandwidth_gbps=4800, bf16_tflops=989, fp8_tflops=1979,
             host_link_gbps=64),
     "H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS bf16 dense, 1,979 FP8 dense (3,958 sparse); PCIe Gen5 x16 "
     "(64 GB/s each way); NVLink 4 900 GB/s (450 each way)"),
    (GpuSpec("gh200-96gb", memory_gib=96, hbm_bandwidth_gbps=4000, bf16_tflops=989, fp8_tflops=1979,
             host_link_gbps=450),
     "GH200 Grace Hopper datasheet: 96 GB HBM3, 4 TB/s, 989 TFLOPS bf16 dense, 1,979 FP8 dense; NVLink-C2C 900 GB/s "
     "(450 each way); NVLink 4 to other GPUs"),
    (GpuSpec("l4", memory_gib=24, hbm_bandwidth_gbps=300, bf16_tflops=121, fp8_tflops=242.5, host_link_gbps=32),
     "L4 datasheet: 24 GB GDDR6, 300 GB/s, 121 TFLOPS bf16 dense (242 sparse), 242.5 FP8 dense (485 sparse); PCIe Gen4 "
     "x16 (32 GB/s each way), no NVLink"),
    # The GPUs of the shared calibration profiles (no NVLink: collectives go over PCIe).
    (GpuSpec("rtx-pro-6000", memory_gib=96, hbm_bandwidth_gbps=1792, bf16_tflops=503.8, fp8_tflops=1007.6,
             host_link_gbps=64),
     "RTX PRO 6000 Blackwell Workstation Edition datasheet: 96 GB GDDR7, 1,792 GB/s, 503.8 TFLOPS bf16 dense (4 PFLOPS "
     "FP4 sparse / 8), 1,007.6 FP8 dense (/ 4); PCIe Gen5 x16 (64 GB/s each way), no NVLink"),
    (GpuSpec("rtx-pro-6000-server", memory_gib=96, hbm_bandwidth_gbps=1597, bf16_tflops=503.8, fp8_tflops=1007.6,
             host_link_gbps=64),
     "RTX PRO 6000 Blackwell Server Edition datasheet: 96 GB GDDR7 at 1,597 GB/s (the profiled card), 503.8 TFLOPS "
     "bf16 dense, 1,007.6 FP8 dense (4 PFLOPS FP4 sparse / 4); PCIe Gen5 x16 (64 GB/s each way), no NVLink"),
    (GpuSpec("rtx-4090", memory_gib=24, hbm_bandwidth_gbps=1008, bf16_tflops=165.2, fp8_tflops=330.3,
             host_link_gbps=32),
     "GeForce RTX 4090 datasheet (Ada whitepaper): 24 GB GDDR6X, 1,008 GB/s, 165.2 TFLOPS bf16 and 330.3 FP8 dense "
     "with FP32 accumulate; PCIe Gen4 x16 (32 GB/s each way), no NVLink or P2P"),
    # The GPU of the shared power traces (LLMServingSim 2.0's validation node).
    # No machine preset has its NVLink bridge: collectives use the GPU's own link (collectives.machine).
    (GpuSpec("rtx-a6000", memory_gib=48, hbm_bandwidth_gbps=768, bf16_tflops=154.8, host_link_gbps=32,
             interconnect_gbps=56.25, interconnect_latency_us=5.0),
     "RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s, 154.8 TFLOPS bf16 dense with FP32 accumulate (309.7 sparse); PCIe "
     "Gen4 x16 (32 GB/s each way); NVLink bridge 112.5 GB/s (56.25 each way)"),
    # The third GPU of Vidur's profiles, and cards without a public profile.
    (GpuSpec("a40", memory_gib=48, hbm_bandwidth_gbps=696, bf16_tflops=149.7, host_link_gbps=32),
     "A40 datasheet: 48 GB GDDR6, 696 GB/s, 149.7 TFLOPS bf16 dense (299.4 sparse); PCIe Gen4 x16 (32 GB/s each way); "
     "NVLink bridge 112.5 GB/s (56.25 each way)"),
    (GpuSpec("l40s", memory_gib=48, hbm_bandwidth_gbps=864, bf16_tflops=362.05, fp8_tflops=733, host_link_gbps=32),
     "L40S datasheet: 48 GB GDDR6, 864 GB/s, 362.05 TFLOPS bf16 dense (733 sparse), 733 FP8 dense (1,466 sparse); PCIe "
     "Gen4 x16 (32 GB/s each way), no NVLink"),
    (GpuSpec("a10g", memory_gib=24, hbm_bandwidth_gbps=600, bf16_tflops=70, host_link_gbps=32),
     "A10G (AWS G5; AWS publishes no datasheet): 24 GB GDDR6, 600 GB/s, 70 TFLOPS bf16 tensor dense (the A10's 125 is "
     "not the A10G's; Baseten, 'NVIDIA A10 vs A10G for ML model inference'); PCIe Gen4 x16, no NVLink"),
    (GpuSpec("b200", memory_gib=180, hbm_bandwidth_gbps=8000, bf16_tflops=2250, fp8_tflops=4500, host_link_gbps=64,
             interconnect_gbps=900, interconnect_latency_us=5.0),
     "B200 (HGX B200) datasheet: 180 GB HBM3e, 8 TB/s, 2.25 PFLOPS bf16 dense (4.5 sparse), 4.5 FP8 dense (9 sparse); "
     "PCIe Gen5 x16 (64 GB/s each way); NVLink 5 1.8 TB/s (900 each way), NVSwitch"),
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
                             "gemm_half_tokens": 55, "kv_read_efficiency": 0.91, "attention_layer_us": 12.1,
                             "decode_attention_us": 0.1, "attention_efficiency": 0.48,
                             "mixed_decode_query_rows": 60, "mixed_decode_context_offset": 190, "empty_tile_ns": 3.0,
                             "expert_layer_us": 29.9, "expert_us": 0.0, "expert_read_share": 0.988,
                             "expert_gemm_share": 0.81},
                            "LLMServingSim's vLLM 0.19 profiles, 3 models at TP 1 and 2 (the MoE experts: "
                            "Qwen3-30B-A3B at TP 1)"),
    "rtx-4090": ({"bandwidth_efficiency": 0.963, "layer_overhead_us": 26.2, "mfu": 0.99, "gemm_half_tokens": 2,
                  "kv_read_efficiency": 0.93, "attention_layer_us": 21.3, "decode_attention_us": 0.16,
                  "attention_efficiency": 0.74, "mixed_decode_query_rows": 67,
                  "mixed_decode_context_offset": 160, "empty_tile_ns": 4.8},
                 "LLMServingSim's vLLM 0.19 profile, Llama-3.1-8B at TP 1"),
    "h100-80gb": ({"bandwidth_efficiency": 0.846, "layer_overhead_us": 26.8, "mfu": 0.61, "gemm_half_tokens": 18},
                  "Vidur's profiles, 6 models at TP 1-8"),
    "a100-80gb": ({"bandwidth_efficiency": 0.776, "layer_overhead_us": 36.0, "mfu": 0.66, "gemm_half_tokens": 0},
                  "Vidur's profiles, 8 models at TP 1-8"),
    "a40": ({"bandwidth_efficiency": 0.798, "layer_overhead_us": 24.2, "mfu": 0.69, "gemm_half_tokens": 23},
            "Vidur's profiles, 6 models at TP 1-8"),
}
#: ``latent_decode_efficiency`` measured on a GPU (``python tools/derive_latent_attention.py``:
#: aiconfigurator's timings of vLLM 0.14's MLA decode kernel, 128 heads, where its FLOPs bind);
#: a GPU of the same architecture (:data:`SAME_ARCHITECTURE`) takes its value, others their
#: kernel family's (``default_latent_decode_efficiency``).
MEASURED_LATENT_DECODE: dict[str, float] = {"h100-80gb": 0.624, "h200-141gb": 0.709, "a100-80gb": 0.1,
                                            "l40s": 0.061}
LATENT_DECODE_SOURCE = "aiconfigurator's vLLM 0.14 MLA decode timings"
#: The routed experts measured on a GPU (``python tools/derive_experts.py``: aiconfigurator's timings
#: of vLLM 0.24's MoE layer alone, the kernel vLLM picks for each shape, 13-16 shapes at tensor
#: parallel 1-8): per kind of expert (``EXPERT_KERNELS``: 16-bit, block-scaled FP8 W8A8, and 4-bit
#: weights with 16-bit activations such as gpt-oss's MXFP4) its ``EXPERT_SETTINGS``, in order:
#: expert_layer_us, expert_us, expert_read_share, expert_gemm_share.
MEASURED_EXPERTS: dict[str, dict[str, tuple[float, float, float, float]]] = {
    "h100-80gb": {"bf16": (40.5, 0.336, 1.22, 0.712), "fp8": (40.4, 0.258, 1.172, 0.388),
                  "w4a16": (42.3, 0.156, 1.043, 0.906)},
    "h200-141gb": {"bf16": (38.2, 0.326, 1.253, 0.806), "fp8": (40.2, 0.226, 1.196, 0.406),
                   "w4a16": (33.5, 0.089, 0.743, 0.905)},
    "b200": {"bf16": (26.2, 0.102, 1.16, 0.528), "fp8": (35.9, 0.085, 1.193, 0.241),
             "w4a16": (31.6, 0.211, 1.191, 0.344)},
    "l40s": {"bf16": (17.9, 0.718, 1.023, 0.597), "fp8": (25.6, 0.527, 0.979, 0.459),
             "w4a16": (51.2, 0.2, 0.981, 0.677)},
}
EXPERTS_SOURCE = "aiconfigurator's timings of vLLM 0.24's MoE kernels"
#: GPUs without a profile of their own that share a profiled GPU's chip family and its
#: datasheet's way of counting (and so, as far as anything public says, its kernels'
#: efficiency): they take its measured efficiencies with their own datasheet peaks. The L4 and
#: L40S are not here: the only Ada profile is a GeForce card, whose datasheet counts bf16 with
#: FP32 accumulate at half the rate a datacenter Ada's does (the 4090 reaches 0.99 of it).
SAME_ARCHITECTURE = {"a100-40gb": "a100-80gb", "h100-pcie-80gb": "h100-80gb", "h200-141gb": "h100-80gb",
                     "gh200-96gb": "h100-80gb", "rtx-pro-6000": "rtx-pro-6000-server", "a10g": "a40"}
#: The efficiencies only LLMServingSim's profiles measure (attention, its uneven contexts, and the
#: MoE experts on one of them); elsewhere pooled.
ATTENTION_KEYS = ("kv_read_efficiency", "attention_layer_us", "decode_attention_us", "attention_efficiency",
                  "mixed_decode_query_rows", "mixed_decode_context_offset", "empty_tile_ns",
                  "decode_skew_alpha", "mixed_skew_alpha", "expert_layer_us", "expert_us", "expert_read_share",
                  "expert_gemm_share")


def expert_efficiency(kinds: dict[str, tuple[float, ...]]) -> dict[str, float]:
    """A GPU's :data:`MEASURED_EXPERTS` entry as keys of its efficiency table: each kind's
    settings under the kind's prefix (``fp8_expert_us`` ...)."""
    return {EXPERT_KERNELS[kind] + name: value
            for kind, values in kinds.items() for name, value in zip(EXPERT_SETTINGS, values, strict=True)}


def _measured_apart(spec: GpuSpec, table: dict, what: str, source_note: str) -> tuple[dict, str]:
    """The entry of ``table`` (a measurement of one kind, kept apart from the profiles) for
    ``spec`` or, failing that, its architecture's GPU, with the note's words for it."""
    source = spec.name if spec.name in table else SAME_ARCHITECTURE.get(spec.name)
    if source not in table:
        return {}, ""
    of = "" if source == spec.name else f"the {source} (same architecture) in "
    return table[source], f"; measured: {what} ({of}{source_note})"


def with_efficiency(spec: GpuSpec) -> tuple[GpuSpec, str]:
    """``spec`` with the efficiencies measured on it (or on its architecture's profiled GPU),
    and a note saying which numbers are measured and which come from the datasheet."""
    latent, latent_note = _measured_apart(
        spec, {gpu: {"latent_decode_efficiency": v} for gpu, v in MEASURED_LATENT_DECODE.items()},
        "latent_decode_efficiency", LATENT_DECODE_SOURCE)
    experts, experts_note = _measured_apart(
        spec, {gpu: expert_efficiency(kinds) for gpu, kinds in MEASURED_EXPERTS.items()}, "the routed experts' settings, 16-bit, FP8 and 4-bit", EXPERTS_SOURCE)
    apart, apart_note = {**latent, **experts}, latent_note + experts_note
    source = spec.name if spec.name in MEASURED_EFFICIENCY else SAME_ARCHITECTURE.get(spec.name)
    if source is None:
        note = "efficiencies: pooled defaults (no profile of this GPU or its architecture)" + apart_note
        return attrs.evolve(spec, efficiency={**apart, **spec.efficiency}), note
    measured, where = MEASURED_EFFICIENCY[source]
    pooled = [k for k in ATTENTION_KEYS if k not in measured and k not in experts]
    of = "" if source == spec.name else f"the {source} (same architecture) in "
    note = f"measured: {', '.join(measured)} ({of}{where})"
    if pooled:
        note += f"; pooled: {', '.join(pooled)}"
    # the routed experts measured on the GPU itself replace its architecture's profile's
    return attrs.evolve(spec, efficiency={**measured, **apart, **spec.efficiency}), note + apart_note


# --- power (schedlab.energy) ---------------------------------------------------------------------
# Kept apart from GPUS so the power numbers can be read, sourced and changed on their own; they
# are merged into each GpuSpec when it is registered. board_w and the clocks are datasheet
# numbers. Datasheets give no idle power: it is set only where a measurement is at hand, else
# the power models take 12% of board_w (the measured A6000's share, 33 of 300 W, rounded up).
# The lowest lockable SM clock is 210 MHz on every one of these (nvidia-smi SUPPORTED_CLOCKS; listings
# seen for the A100 only), 180 MHz on the RTX PRO 6000 (Maliakel et al. locked it there).

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
    "rtx-pro-6000": ({"board_w": 600, "max_clock_mhz": 2842, "min_clock_mhz": 180},
                     "RTX PRO 6000 Blackwell Workstation Edition datasheet: 600 W total board power; clocks 180-2,842 "
                     "MHz: the range Maliakel et al. locked it to (arXiv 2501.08219v4, abstract)"),
    "rtx-pro-6000-server": ({"board_w": 600, "min_clock_mhz": 210},
                            "RTX PRO 6000 Blackwell Server Edition datasheet: up to 600 W (configurable 400-600 W)"),
    "rtx-4090": ({"board_w": 450, "max_clock_mhz": 2520, "min_clock_mhz": 210},
                 "GeForce RTX 4090 specifications: 450 W total graphics power, 2,520 MHz boost"),
    "l40s": ({"board_w": 350}, "L40S datasheet: 350 W max power consumption"),
    "a40": ({"board_w": 300}, "A40 datasheet: 300 W max power consumption"),
    "a10g": ({"board_w": 300}, "A10G: 300 W power limit as nvidia-smi reports it on an AWS G5 (NVIDIA/DCGM#232)"),
    "b200": ({"board_w": 1000}, "B200: 1,000 W power limit as nvidia-smi reports it on an HGX B200 "
                                "(NVIDIA/TensorRT-LLM#10278)"),
    "rtx-a6000": ({"board_w": 300, "idle_w": 33.0, "max_clock_mhz": 1800, "min_clock_mhz": 210},
                  "RTX A6000 datasheet: 300 W max power consumption, 1,800 MHz boost; idle 33 W: nvidia-smi before "
                  "the first request in LLMServingSim 2.0's power traces (calibration/energy/llmservingsim-power)"),
}


# --- memory: what the card reports ----------------------------------------------------------------
# The total nvidia-smi shows as memory.total. It is not the datasheet's "GB": HBM cards report
# about the nominal GiB (the H100 a little less), and datacenter GDDR6 cards run with ECC on, which
# takes 1/16 of it (an L40S's "48 GB" is 46,068 MiB, 45 GiB; the A40 too; the RTX A6000, a
# workstation card, runs with ECC off; GDDR7's RTX PRO 6000 reports 97,887 MiB with ECC on or off).
# vLLM sizes its KV pool from the total CUDA reports (torch.cuda.mem_get_info), which public logs
# show 0.4-0.65 GiB lower than nvidia-smi's (driver-reserved memory: an H100's 81,559 MiB is about
# 81,085 in torch, an H200's 143,771 is 143,156) -- too few readings per card to correct for here.
# Kept apart from GPUS, as the power numbers are, so a measured total reads apart from the
# datasheet; a GPU not listed takes its nominal GiB.

#: GPU preset -> (nvidia-smi memory.total in MiB, where it was seen)
MEASURED_MEMORY_MIB: dict[str, tuple[int, str]] = {
    "a100-40gb": (40960, "modal-labs/modal-client#2797; bottlerocket-os/bottlerocket-core-kit#834"),
    "a100-80gb": (81920, "modal-labs/modal-client#2797"),
    "h100-80gb": (81559, "modal-labs/modal-client#2797; NVIDIA/nccl#1264"),
    "l4": (23034, "modal-labs/modal-client#2797"),
    "l40s": (46068, "modal-labs/modal-client#2797; akash-network/provider-configs#99"),
    "a10g": (23028, "NVIDIA/DCGM#232 (an AWS G5 A10G); modal-labs/modal-client#2797"),
    "rtx-4090": (24564, "RLinf/RLinf#255"),
    "b200": (183359, "NVIDIA/TensorRT-LLM#10278"),
    "h100-pcie-80gb": (81559, "NVIDIA/DCGM#91"),
    "h200-141gb": (143771, "sgl-project/sglang#3196"),
    "gh200-96gb": (97871, "marin-community/marin#5446 (a GH200 480GB superchip)"),
    "rtx-pro-6000": (97887, "vllm-project/vllm#27542"),
    "rtx-pro-6000-server": (97887, "bigstack-oss/cubecos#312 (ECC on)"),
    "a40": (46068, "NVIDIA/gpu-operator#559 (ECC on, the datacenter default; 49,140 with ECC off)"),
    "rtx-a6000": (49140, "noonghunna/club-3090#1047 (ECC off, drivers from 515; 48,685 on 470)"),
}


def with_memory(spec: GpuSpec) -> tuple[GpuSpec, str]:
    """``spec`` with the memory total its card reports (:data:`MEASURED_MEMORY_MIB`), and a note
    saying where that total was seen; unchanged, with no note, for a GPU without one."""
    if spec.name not in MEASURED_MEMORY_MIB:
        return spec, ""
    mib, where = MEASURED_MEMORY_MIB[spec.name]
    note = f"memory: {mib:,} MiB as nvidia-smi reports it ({where})"
    return attrs.evolve(spec, memory_gib=mib / 1024), note


# --- compute capability: which kernels the engine runs on the GPU ---------------------------------

#: GPU preset -> its CUDA compute capability (NVIDIA, "CUDA GPUs - Compute Capability",
#: developer.nvidia.com/cuda-gpus). The roofline reads it to know which attention kernel vLLM
#: runs there (``plugins/cost_models/roofline.py``, ``attention_kernel``).
COMPUTE_CAPABILITY: dict[str, float] = {
    "a100-40gb": 8.0, "a100-80gb": 8.0, "a40": 8.6, "a10g": 8.6, "rtx-a6000": 8.6,
    "l4": 8.9, "l40s": 8.9, "rtx-4090": 8.9,
    "h100-80gb": 9.0, "h100-pcie-80gb": 9.0, "h200-141gb": 9.0, "gh200-96gb": 9.0,
    "b200": 10.0, "rtx-pro-6000": 12.0, "rtx-pro-6000-server": 12.0,
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


def as_registered(spec: GpuSpec, note: str) -> tuple[GpuSpec, str]:
    """A built-in GPU as it is registered: its datasheet ``spec`` with the measured memory total
    and efficiencies, the power numbers and the compute capability merged in, and its help text."""
    spec, memory_note = with_memory(spec)
    spec, measured = with_efficiency(spec)
    spec, power_note = with_power(spec)
    capability = COMPUTE_CAPABILITY.get(spec.name)
    spec = attrs.evolve(spec, compute_capability=capability)
    text = f"{note}; " + (f"{memory_note}; " if memory_note else "") + measured
    text += f"; {power_note}" if power_note else ""
    if capability is not None:
        text += f"; compute capability {capability:.1f} (NVIDIA's CUDA GPUs list)"
    return spec, text


@schedlab.hookimpl
def schedlab_register_gpus(register):
    for spec, note in GPUS:
        spec, text = as_registered(spec, note)
        register(spec.name, spec, help=text)
