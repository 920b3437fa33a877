"""What text-generation-inference's launcher picks where it is not told (v3.3.7, commit dfb3fbe,
``launcher/src/main.rs``), from the GPU and the model's ``config.json``.

``max_batch_prefill_tokens``: the GPUs' f16 FLOPS over the model's FLOPs per token
(``compute_optimal``) when the launcher knows the card by its ``nvidia-smi`` name, else 4,096;
at most the model's ``max_position_embeddings``; at most the tokens whose KV and MLP
activations fit the memory the weights leave (``vram_maximum``). The attention backend is
flashinfer on compute capability 8.0 and up (every GPU preset here), which supports chunked
prefill and prefix caching: both on by default.

Kept as the launcher computes them, oddities included: ``Config::flop`` counts attention as
q, k, v, an extra q-sized term and o per layer and the MLP as ``6 x hidden x intermediate_size x
(experts per token + shared experts)`` (a MoE model's *dense* ``intermediate_size``);
``model_vram`` counts the q/k/v weights as ``(heads + 2 x kv_heads) x head_dim`` without the
hidden size. Simplifications: memory is the preset's (the total ``nvidia-smi`` reports where one is known,
81,559 MiB on an H100 80GB HBM3; else the datasheet's GB taken as GiB), and every MoE model's experts are counted where TGI reads only
``num_local_experts`` (Mixtral's and gpt-oss's key; others count 1) -- only the memory bound,
which rarely binds, sees either.
"""

from __future__ import annotations

import numpy as np

#: f16 TFLOPS per card (``ComputeType::f16_flop``) for the GPU presets whose ``nvidia-smi`` name
#: the launcher recognises (``Gpu::from``). Not recognised, so 4,096 tokens: "NVIDIA H100 PCIe",
#: "NVIDIA GH200 480GB", "NVIDIA GeForce RTX 4090" (its table says "nvidia-4090"), the RTX PRO
#: 6000 and RTX A6000, B200.
CARD_TFLOPS = {"a100-40gb": 312, "a100-80gb": 312, "h100-80gb": 900, "h200-141gb": 989, "l4": 121, "a40": 149,
               "l40s": 363, "a10g": 125}
DEFAULT_PREFILL_TOKENS = 4096
WIGGLE_ROOM = 0.95          # TGI_WIGGLE_ROOM
MEMORY_FRACTION = 1.0       # --cuda-memory-fraction


def _head_dim(model) -> int:
    """``config.json`` ``head_dim``, else ``hidden_size / num_attention_heads`` (a latent-attention
    config such as DeepSeek-V3's writes none)."""
    if model.kv_latent_dim:
        return model.hidden_size // model.num_attention_heads
    return model.head_dim


def model_flop(model) -> int | None:
    """FLOPs per token as ``Config::flop`` counts them; None without the shapes it needs."""
    if not (model.num_attention_heads and model.hidden_size and model.intermediate_size):
        return None
    heads, kv, hidden, hd = model.num_attention_heads, model.num_kv_heads, model.hidden_size, _head_dim(model)
    attention = 3 * (2 * heads * hd * hidden) + 2 * (2 * kv * hd * hidden)  # q, "attn", o; k, v
    mlp = 6 * hidden * model.intermediate_size * ((model.experts_per_token or 1) + model.shared_experts)
    return (attention + mlp) * model.num_layers


def vram_tokens(gpu, model, count: int) -> int | None:
    """``vram_maximum``: tokens whose KV and MLP activations fit what the weights leave of the GPUs'
    memory; None for a quantized checkpoint or when the weights alone do not fit (TGI: no bound)."""
    if model.weight_dtype_bytes is not None or model.expert_dtype_bytes is not None or model.dtype_bytes != 2:
        return None
    if not (model.num_attention_heads and model.hidden_size and model.intermediate_size and model.vocab_size):
        return None
    heads, kv, hidden, hd = model.num_attention_heads, model.num_kv_heads, model.hidden_size, _head_dim(model)
    experts = model.num_experts or 1
    layer = 3 * model.intermediate_size * experts * hidden + (heads + 2 * kv) * hd + heads * hd * hidden
    weights = 2 * (layer * model.num_layers + 2 * model.vocab_size * hidden)
    per_token = kv * 2 * hd * 2 * model.num_layers + (model.intermediate_size * 3 // 2) * experts * 2 * 3
    total = np.float32(gpu.memory_gib * 1024 * 2**20 * count)
    available = int(total * np.float32(MEMORY_FRACTION) * np.float32(WIGGLE_ROOM))
    if available < weights:
        return None
    return (available - weights) // per_token


def prefill_tokens(gpu, model, count: int = 1) -> int:
    """The launcher's ``max_batch_prefill_tokens`` on ``count`` of ``gpu`` (the shards) for
    ``model`` (either None: not named in the run)."""
    value = DEFAULT_PREFILL_TOKENS
    known = gpu is not None and gpu.name in CARD_TFLOPS
    flop = model_flop(model) if model is not None else None
    if known and flop:
        optimal = CARD_TFLOPS[gpu.name] * 10**12 * count // flop
        if optimal > 100:  # "Ignore calculations that's too low"
            value = optimal
    if model is not None and model.max_position_embeddings:
        value = min(value, model.max_position_embeddings)
    if gpu is not None and model is not None:  # (any card nvidia-smi reports memory for)
        bound = vram_tokens(gpu, model, count)
        if bound is not None:
            value = min(value, bound)
    return value
