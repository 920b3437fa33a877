"""How many KV blocks fit on a GPU, worked out from the model's shape and the GPU's memory.

A :class:`ModelSpec` (layers, KV heads, head size, parameters) and a :class:`GpuSpec`
(memory, bandwidths, compute) are plain frozen records; the built-in presets are registered
by :mod:`schedlab_plugins.presets` and looked up through :class:`Presets`.
:func:`size_kv_cache` sizes the block pool the way vLLM does::

    num_blocks = (memory * gpu_memory_utilization - weights - activation reserve) // block bytes

and :func:`format_capacity` prints that derivation, including how many sequences fit at the
average and at the long-tail (p99) length -- the number to plan for.

Units: memory sizes are binary (GiB = 2**30 bytes, as ``torch.cuda.mem_get_info`` reports
them); bandwidths are decimal GB/s (10**9 bytes per second) and compute is dense TFLOPS
(10**12), as GPU datasheets quote them.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import os
import warnings
from typing import TYPE_CHECKING, Any, Mapping

import attrs

from .configs import (
    MAX_BLOCK_SIZE, MAX_MEMORY_GIB, MAX_TENSOR_PARALLEL, FieldError, bool_field, bound_text, float_field, int_field,
    str_field,
)
from .errors import ConfigError, InputWarning, UnknownPluginError
from .hf_config import is_config_path, spec_from_path
from .kv_window import SlidingWindow, kv_groups, model_window, tokens_fitting
from .parallelism import SINGLE, Parallelism, stage_layers

if TYPE_CHECKING:
    from .catalog import Catalog
    from .registry import Registry

KIB = 2**10
MIB = 2**20
GIB = 2**30

#: Memory kept back from the KV pool besides the weights, the same for every engine and batch.
#: vLLM measures its part by profiling a forward pass at ``max_num_batched_tokens`` (with the
#: sampler at ``max_num_seqs``); for 7-8B models at 2048-8192 batched tokens its logs show
#: roughly 1.2 GiB of activation peak. vLLM 0.11's eager start-up logs of Llama-3.1-8B on an RTX
#: A6000 (tests/test_capacity.py) put the pool 1.1% below this one's. Recent vLLM allocates NCCL
#: and cuBLAS before its memory snapshot (not in the reserve) but also subtracts CUDA graphs'
#: memory (0.5-0.8 GiB in public logs), and a sampler warm-up that grows with ``max_num_seqs`` x
#: the vocabulary, so with graphs on it keeps a few percent fewer blocks than this reserve
#: leaves. SGLang (``mem_fraction_static``), TensorRT-LLM and TGI size their pools their own
#: ways: set ``num_blocks`` from the engine's log for them. Raise it for large token budgets or
#: wide models.
DEFAULT_ACTIVATION_RESERVE_GIB = 1.5

#: Most parameters a model may have: 10**15, 500 times the largest checkpoints (about 2 trillion),
#: so that its weight bytes stay far inside a float.
MAX_PARAMS = 10**15
#: Most bytes per weight or KV element: 8 (float64); served models use 0.5-2 (fp4-bf16).
MAX_DTYPE_BYTES = 8

#: vLLM's ``--kv-cache-dtype`` (``CacheConfig.cache_dtype``; SGLang's flag of the same name takes the
#: FP8 ones): bytes of one stored KV element, ``auto`` the model's own (``dtype_bytes``). An FP8
#: cache keeps one scale per layer for K and one for V (``k_scale``, ``v_scale``), nothing per
#: token; latent attention's latent and RoPE part are stored alike.
KV_CACHE_DTYPES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
                   "fp8_ds_mla": 1}
#: DeepSeek's FP8 layout of a sparse-attention (DSA) model's latent (vLLM's ``fp8_ds_mla``, which
#: ``DeepseekV32ForCausalLM.verify_and_update_config`` chooses for every FP8 cache there): the
#: latent's non-RoPE part in FP8 with a float32 scale per this many values, the RoPE part in 16 bits
#: (DeepSeek-V3.2: 512 + 4 x 4 + 2 x 64 = 656 bytes a token and layer; ``concat_and_cache_ds_mla``)
DS_MLA_SCALE_GROUP = 128

#: Tensor-parallel sizes tried when suggesting a fix for a model that does not fit.
_SUGGESTED_TP = (2, 4, 8)


# --- specs ------------------------------------------------------------------------------------


def _check_tensor_parallel(tensor_parallel: Any) -> int:
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) \
            or not 1 <= tensor_parallel <= MAX_TENSOR_PARALLEL:
        raise ConfigError(f"tensor_parallel must be a whole number from 1 to {MAX_TENSOR_PARALLEL}, "
                          f"got {tensor_parallel!r}")
    return tensor_parallel


@attrs.frozen
class ModelSpec:
    """The shape of a decoder-only transformer, as far as KV memory and a roofline need it.

    Values come from the model's Hugging Face ``config.json`` (``num_hidden_layers``,
    ``num_key_value_heads``, ``head_dim`` or ``hidden_size / num_attention_heads``) and its
    parameter count.
    """

    name: str = str_field(help="model name, e.g. 'llama-3-8b'")
    num_layers: int = int_field(min=1, help="transformer layers (config.json num_hidden_layers)")
    num_kv_heads: int = int_field(
        min=1, help="key/value heads per layer (num_key_value_heads; equals the attention heads without GQA)")
    head_dim: int = int_field(min=1, help="size of one attention head (hidden_size / num_attention_heads)")
    num_params: float = float_field(min=0.0, max=MAX_PARAMS, min_exclusive=True, help="total parameters, e.g. 8.03e9")
    dtype_bytes: int = int_field(2, min=1, max=MAX_DTYPE_BYTES,
                                 help="bytes per weight, activation and KV element (2 = bf16/fp16, 1 = fp8)")
    num_attention_heads: int | None = int_field(
        None, min=1, optional=True,
        help="query heads; only used for attention FLOPs in the roofline cost model (prefill, and the decodes' "
             "where compute outlasts the KV read, as latent attention's can) (leave unset to ignore them)")
    hidden_size: int | None = int_field(
        None, min=1, optional=True,
        help="model width (config.json hidden_size): the bytes of each tensor-parallel all-reduce")
    vocab_size: int | None = int_field(
        None, min=1, optional=True,
        help="vocabulary (config.json vocab_size): with hidden_size, the input embedding table is looked up "
             "(one row per token), not read in full each iteration like the LM head")
    tied_embeddings: bool = bool_field(
        False, help="config.json tie_word_embeddings: the embedding table is also the LM head, read in full "
                    "every iteration")
    num_experts: int = int_field(0, min=0, help="MoE: routed experts per layer (0 = a dense model)")
    experts_per_token: int = int_field(0, min=0, help="MoE: experts each token is routed to (top-k)")
    active_params: float | None = float_field(
        None, min=0.0, max=MAX_PARAMS, min_exclusive=True, optional=True,
        help="MoE: parameters one token passes through (attention, router, top-k experts, embeddings); "
             "unset = num_params")
    hf_id: str | None = str_field(
        None, optional=True,
        help="the Hugging Face model id (e.g. 'Qwen/Qwen3-32B'): a measured profile bundle must name it")
    weight_dtype_bytes: float | None = float_field(
        None, min=0.0, max=MAX_DTYPE_BYTES, min_exclusive=True, optional=True,
        help="bytes per weight when they differ from the KV's dtype_bytes (an FP8 checkpoint: 1); unset = dtype_bytes")
    table_dtype_bytes: float | None = float_field(
        None, min=0.0, max=MAX_DTYPE_BYTES, min_exclusive=True, optional=True,
        help="bytes per weight of the embedding table and the LM head when they differ from the other weights' "
             "(AWQ, GPTQ and FP8 checkpoints keep them in 16 bits: 2); unset = the weights'")
    expert_dtype_bytes: float | None = float_field(
        None, min=0.0, max=MAX_DTYPE_BYTES, min_exclusive=True, optional=True,
        help="MoE: bytes per routed-expert weight (MXFP4, 4 bits + a scale per 32: 0.53125); unset = the weights'")
    fp8_activations: bool = bool_field(
        False, help="the FP8 weights multiply FP8 activations (W8A8: quant_method 'fp8', ModelOpt FP8, "
                    "compressed-tensors with 8-bit float input_activations): their GEMMs run at the GPU's "
                    "fp8_tflops where it has FP8 tensor cores (vLLM's Fp8LinearMethod); elsewhere, and for "
                    "weight-only FP8, in 16 bits")
    fp8_weight_share: float | None = float_field(
        None, min=0.0, max=1.0, optional=True,
        help="W8A8 FP8 (fp8_activations) checkpoints that keep some layers' projections in 16 bits "
             "(modules_to_not_convert / ignore): the share of the dense weights (beside the routed experts and "
             "the tables) that are FP8, so that share of the dense GEMMs' FLOPs runs at fp8_tflops and the rest "
             "at the bf16 rate; unset = all of them when weight_dtype_bytes is 1, else none")
    kv_dtype_bytes: int | None = int_field(
        None, min=1, max=MAX_DTYPE_BYTES, optional=True,
        help="bytes per stored KV element when the cache keeps another dtype than the model's (vLLM "
             "--kv-cache-dtype fp8: 1; set it per deployment with kv_cache_dtype); unset = dtype_bytes")
    kv_latent_dim: int | None = int_field(
        None, min=1, optional=True,
        help="multi-head latent attention (DeepSeek-V2/V3: kv_lora_rank + qk_rope_head_dim): one latent per "
             "token and layer holds K and V, the same on every tensor-parallel rank")
    kv_index_bytes: int = int_field(
        0, min=0, help="bytes each token keeps per layer beside its KV for a sparse-attention indexer (DeepSeek-V3.2's "
                       "DSA: 128 FP8 values and a 4-byte scale, 132), the same on every rank")
    sparse_attention_keys: int | None = int_field(
        None, min=1, optional=True,
        help="sparse attention (DSA: DeepSeek-V3.2, GLM-5; config.json index_topk, 2,048): each query attends to "
             "this many keys its lightning indexer picks. vLLM's sparse MLA kernel runs over that many slots for "
             "every query (those past a short context masked), so a decode's latent attention is a constant; "
             "the indexer reads every context token's kv_index_bytes key and scores it")
    index_heads: int = int_field(0, min=0, help="DSA: the lightning indexer's heads (config.json index_n_heads, 64)")
    index_head_dim: int = int_field(0, min=0, help="DSA: the size of an indexer head (config.json index_head_dim, 128)")
    kv_rope_dim: int = int_field(
        0, min=0, help="multi-head latent attention: the part of kv_latent_dim that is the keys' shared RoPE part "
                       "(qk_rope_head_dim, 64 in DeepSeek-V3). vLLM decodes MLA absorbed: each query head is "
                       "multiplied by the whole latent and the attention weights by the latent less this part")
    qk_head_dim: int | None = int_field(
        None, min=1, optional=True,
        help="size of a query/key head where it differs from head_dim, the value head's (MLA: qk_nope_head_dim + "
             "qk_rope_head_dim, 192 in DeepSeek-V3): prefill attention's QK^T runs over it; unset = head_dim")
    model_type: str | None = str_field(
        None, optional=True,
        help="the architecture (config.json model_type, e.g. 'gpt_oss', 'llama4_text'): SGLang gives gpt-oss and "
             "Llama 4 a memory pool of their own for their window layers by it")
    sliding_window: int | None = int_field(
        None, min=1, optional=True, help="tokens a sliding-window layer attends to (config.json sliding_window)")
    sliding_window_layers: int = int_field(
        0, min=0, help="how many layers use the sliding window (gpt-oss: every other one; all of them: num_layers)")
    state_bytes: int | None = int_field(
        None, min=1, optional=True,
        help="the window layers are recurrent (Gated DeltaNet, Mamba-2: a config.json read sets it): the bytes of one "
             "layer's state a sequence keeps at tensor_parallel 1, in the model's dtype; sliding_window is then that "
             "state in tokens of one full-attention layer's KV, re-derived per rank (window_tokens): vLLM splits "
             "the state over the ranks where KV heads beyond num_kv_heads are replicated, and keeps it in the "
             "model's dtype (mamba_cache_dtype) under an fp8 KV cache")
    max_position_embeddings: int | None = int_field(
        None, min=1, optional=True,
        help="the context length (config.json max_position_embeddings): vLLM's default max_model_len, SGLang's "
             "context_length")
    intermediate_size: int | None = int_field(
        None, min=1, optional=True,
        help="config.json intermediate_size as written (a MoE model's dense width, not its experts'): TGI's "
             "launcher sizes its prefill budget by it")
    shared_experts: int = int_field(0, min=0, help="MoE: shared experts every token also passes (n_shared_experts)")
    moe_layers: int | None = int_field(
        None, min=1, optional=True,
        help="MoE: how many layers route their tokens to experts, where some layers are dense (DeepSeek-V3: 58 of "
             "61, first_k_dense_replace 3; Llama-4-Maverick: 24 of 48, interleave_moe_layer_step 2): the routing's "
             "and the expert kernels' fixed times are paid in these only; unset = every layer")

    def __attrs_post_init__(self) -> None:
        self._check_heads()
        moe_only = [key for key in ("experts_per_token", "shared_experts", "active_params")
                    if getattr(self, key) not in (None, 0)]
        if moe_only and not self.num_experts:
            raise ConfigError(f"{self.name}: {moe_only[0]} is set but num_experts is 0 (a dense model); "
                              "give num_experts for a mixture-of-experts model")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ConfigError(f"{self.name}: experts_per_token must be between 1 and num_experts "
                              f"({self.num_experts}), got {self.experts_per_token}")
        if self.active_params is not None and self.active_params > self.num_params:
            raise ConfigError(f"{self.name}: active_params ({self.active_params:g}) exceeds num_params "
                              f"({self.num_params:g})")
        if self.sliding_window_layers > self.num_layers:
            raise ConfigError(f"{self.name}: sliding_window_layers ({self.sliding_window_layers}) exceeds "
                              f"num_layers ({self.num_layers})")
        if self.kv_rope_dim and (self.kv_latent_dim is None or self.kv_rope_dim >= self.kv_latent_dim):
            raise ConfigError(f"{self.name}: kv_rope_dim ({self.kv_rope_dim}) is part of the latent: it needs "
                              f"kv_latent_dim set and larger (got {self.kv_latent_dim})")
        if self.sparse_attention_keys is not None and (self.kv_latent_dim is None or not self.kv_index_bytes):
            raise ConfigError(f"{self.name}: sparse_attention_keys is DeepSeek's sparse latent attention: it needs "
                              "kv_latent_dim and kv_index_bytes (the indexer's keys) set")
        if (self.index_heads or self.index_head_dim) and self.sparse_attention_keys is None:
            raise ConfigError(f"{self.name}: index_heads and index_head_dim describe a sparse-attention indexer: "
                              "set sparse_attention_keys too")
        if self.moe_layers is not None and (not self.num_experts or self.moe_layers > self.num_layers):
            raise ConfigError(f"{self.name}: moe_layers ({self.moe_layers}) counts a MoE model's expert layers: it "
                              f"needs num_experts set and at most num_layers ({self.num_layers})")
        if self.fp8_weight_share is not None and not self.fp8_activations:
            raise ConfigError(f"{self.name}: fp8_weight_share is the FP8 share of a W8A8 checkpoint's weights: it "
                              "needs fp8_activations = true")
        if self.sliding_window_layers and self.sliding_window is None:
            raise ConfigError(f"{self.name}: sliding_window_layers is set but sliding_window is not")
        if self.state_bytes is not None and (not self.sliding_window_layers or self.kv_latent_dim is not None):
            raise ConfigError(f"{self.name}: state_bytes is the recurrent state of the window layers: it needs "
                              "sliding_window_layers set (and no kv_latent_dim)")

    def _check_heads(self) -> None:
        """Grouped-query attention: each KV head serves a whole group of the query heads."""
        heads, kv = self.num_attention_heads, self.num_kv_heads
        if heads is None:
            return
        if kv > heads:
            raise ConfigError(f"{self.name}: num_kv_heads ({kv}) exceeds num_attention_heads ({heads})")
        if heads % kv:
            raise ConfigError(f"{self.name}: num_attention_heads ({heads}) must be a multiple of num_kv_heads ({kv}): "
                              "each KV head serves a whole group of query heads")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layer_count(self) -> int:
        """Layers that route to experts: :attr:`moe_layers`, else every layer of a MoE model (0 for
        a dense one)."""
        if not self.is_moe:
            return 0
        return self.moe_layers if self.moe_layers is not None else self.num_layers

    @property
    def params_per_token(self) -> float:
        """Parameters each token multiplies (all of them for a dense model)."""
        return self.active_params if self.active_params is not None else self.num_params

    @property
    def embedding_params(self) -> float:
        """Parameters of the input embedding table that are only looked up, never multiplied:
        ``vocab_size x hidden_size``; 0 when the table is tied to the LM head (then it is the
        LM head) or vocab or width is not declared."""
        if self.vocab_size is None or self.hidden_size is None or self.tied_embeddings:
            return 0.0
        return float(self.vocab_size * self.hidden_size)

    @property
    def lm_head_params(self) -> float:
        """Parameters of the LM head (the tied table too): ``vocab_size x hidden_size``; 0 when
        vocab or width is not declared."""
        if self.vocab_size is None or self.hidden_size is None:
            return 0.0
        return float(self.vocab_size * self.hidden_size)

    @property
    def table_bytes_per_param(self) -> float:
        return self.table_dtype_bytes if self.table_dtype_bytes is not None else self.weight_bytes_per_param

    @property
    def weight_bytes_per_param(self) -> float:
        return self.weight_dtype_bytes if self.weight_dtype_bytes is not None else float(self.dtype_bytes)

    @property
    def expert_bytes_per_param(self) -> float:
        return self.expert_dtype_bytes if self.expert_dtype_bytes is not None else self.weight_bytes_per_param

    @property
    def kv_element_bytes(self) -> int:
        """Bytes of one stored KV element: :attr:`kv_dtype_bytes`, else the model's dtype."""
        return self.kv_dtype_bytes if self.kv_dtype_bytes is not None else self.dtype_bytes

    @property
    def fp8_ds_mla(self) -> bool:
        """Whether the latent is kept in DeepSeek's ``fp8_ds_mla`` layout: a sparse-attention model's
        FP8 cache (vLLM uses no other there)."""
        return (self.kv_latent_dim is not None and self.sparse_attention_keys is not None
                and self.kv_element_bytes == 1)

    @property
    def latent_bytes(self) -> int:
        """Bytes of one token's latent in one layer (multi-head latent attention): ``kv_latent_dim``
        elements, or in :attr:`fp8_ds_mla` layout the non-RoPE part in FP8 with its float32 scales
        and the RoPE part in 16 bits."""
        if not self.fp8_ds_mla:
            return self.kv_latent_dim * self.kv_element_bytes
        rest = self.kv_latent_dim - self.kv_rope_dim
        return rest + 4 * math.ceil(rest / DS_MLA_SCALE_GROUP) + 2 * self.kv_rope_dim

    @property
    def kv_layers(self) -> int:
        """Layers whose KV grows with every token: the full-attention ones. A sliding-window
        layer holds at most ``sliding_window`` tokens of a sequence (vLLM frees the blocks that
        fall out of it), so it is left out -- unless every layer slides, when a sequence's KV
        is counted whole (exact up to the window)."""
        if self.sliding_window_layers and self.sliding_window_layers < self.num_layers:
            return self.num_layers - self.sliding_window_layers
        return self.num_layers

    def window_tokens(self, tensor_parallel: int = 1) -> int | None:
        """Tokens a window layer keeps a sequence on each rank: :attr:`sliding_window`, or with
        :attr:`state_bytes` (a recurrent layer) its state on a rank over one full-attention layer's
        KV per token on that rank. vLLM splits the state over the ranks (``mamba_utils.py``,
        ``mamba2_state_shape`` / ``gated_delta_net_state_shape``: heads and convolution channels
        divided by TP) in the model's dtype (``mamba_cache_dtype`` auto), while a token's KV stops
        shrinking once ``tensor_parallel`` exceeds the KV heads (they are replicated) and halves
        under an fp8 cache (:attr:`kv_element_bytes`): Qwen3-Next's state is 536 tokens at TP 1
        and 2 bytes, 268 at TP 4 (2 KV heads), 1,072 at fp8."""
        if self.state_bytes is None or self.sliding_window is None:
            return self.sliding_window
        tp = _check_tensor_parallel(tensor_parallel)
        per_token = 2 * self.kv_heads_per_rank(tp) * self.head_dim * self.kv_element_bytes
        rank_state = -(-self.state_bytes // tp)
        return max(1, -(-rank_state // per_token))

    @property
    def expert_params(self) -> float:
        """Parameters of one routed expert (all layers): resident and active counts differ by
        ``(num_experts - experts_per_token)`` experts."""
        if not self.is_moe or self.experts_per_token >= self.num_experts:
            return 0.0
        return (self.num_params - self.params_per_token) / (self.num_experts - self.experts_per_token)

    def kv_heads_per_rank(self, tensor_parallel: int = 1) -> int:
        """KV heads each tensor-parallel rank stores.

        Heads are split evenly across ranks. With fewer KV heads than ranks, each rank keeps
        one (replicated) head, as vLLM does -- a rank cannot hold a fraction of a head, so
        beyond ``tensor_parallel == num_kv_heads`` the per-rank KV size stops shrinking.

        :raises ConfigError: the heads -- the KV heads, or the attention heads -- cannot be spread
            evenly (vLLM rejects this too: ``ModelConfig.verify_with_parallel_config``).
        """
        tp = _check_tensor_parallel(tensor_parallel)
        heads = self.num_kv_heads
        if heads >= tp and heads % tp:
            raise ConfigError(
                f"{self.name}: {heads} KV heads cannot be split evenly over tensor_parallel={tp}; "
                f"use a tensor_parallel that divides {heads}")
        if heads < tp and tp % heads:
            raise ConfigError(
                f"{self.name}: tensor_parallel={tp} is not a multiple of its {heads} KV heads, so they "
                f"cannot be replicated evenly; use a multiple of {heads}")
        self._check_attention_heads(tp)
        return heads // tp if heads >= tp else 1

    def _check_attention_heads(self, tp: int) -> None:
        """:raises ConfigError: the attention heads cannot be spread evenly over ``tp`` ranks
        (vLLM's ``ModelConfig.verify_with_parallel_config`` refuses it, latent attention too)."""
        if self.num_attention_heads and self.num_attention_heads % tp:
            raise ConfigError(
                f"{self.name}: {self.num_attention_heads} attention heads cannot be split evenly over "
                f"tensor_parallel={tp} (vLLM refuses it too); use a tensor_parallel that divides "
                f"{self.num_attention_heads}")

    def pool_layers(self, hybrid: bool = True, swa_ratio: float | None = None) -> float:
        """Layers one block of the pool holds a page of. vLLM: a KV cache group's
        (:func:`schedlab.kv_window.kv_groups`, usually the full-attention layers) when some
        layers slide, else every layer; every layer without the hybrid manager (``hybrid``
        false: vLLM ``--disable-hybrid-kv-cache-manager`` keeps every token in every layer).
        SGLang's hybrid SWA memory (``swa_ratio``, its ``swa_full_tokens_ratio``): the
        full-attention layers plus that share of the window layers, whose own pool holds
        ``swa_ratio`` tokens for every full-attention one (``HybridSWAPoolConfigurator``)."""
        window = self.sliding_window_layers if self.sliding_window is not None else 0
        if not hybrid or not window or window >= self.num_layers:
            return self.num_layers
        if swa_ratio is not None:
            return self.num_layers - window + swa_ratio * window
        return kv_groups(self.num_layers, window)[0]

    def pool_bytes_per_token(self, tensor_parallel: int = 1, hybrid: bool = True,
                             swa_ratio: float | None = None) -> int:
        """Bytes one token takes in a block of the pool on each rank: :meth:`kv_bytes_per_token`
        per layer, over :meth:`pool_layers` (rounded up)."""
        per_layer = self.kv_bytes_per_token(tensor_parallel) // self.kv_layers
        return math.ceil(per_layer * self.pool_layers(hybrid, swa_ratio))

    def kv_bytes_per_token(self, tensor_parallel: int = 1) -> int:
        """KV bytes one token takes on each rank: ``2 (K and V) * layers * heads/tp * head_dim * dtype``
        over the layers that keep every token (:attr:`kv_layers`); with latent attention
        ``layers * kv_latent_dim * dtype`` (one latent for K and V, on every rank). ``dtype`` is
        the stored element's (:attr:`kv_element_bytes`)."""
        index = self.kv_layers * self.kv_index_bytes   # (a sparse-attention indexer's keys: on every rank)
        if self.kv_latent_dim is not None:  # (no KV heads to split, but the attention heads are)
            self._check_attention_heads(_check_tensor_parallel(tensor_parallel))
            return self.kv_layers * self.latent_bytes + index
        heads = self.kv_heads_per_rank(tensor_parallel)
        return 2 * self.kv_layers * heads * self.head_dim * self.kv_element_bytes + index

    def weight_bytes(self, tensor_parallel: int = 1) -> float:
        """Weight bytes on each rank (weights are sharded evenly; replicated norms are ignored);
        routed experts, and the embedding table and LM head, at their own bytes per weight."""
        tp = _check_tensor_parallel(tensor_parallel)
        experts = self.expert_params * self.num_experts
        tables = (self.embedding_params + self.lm_head_params) * (self.table_bytes_per_param - self.weight_bytes_per_param)
        return ((self.num_params - experts) * self.weight_bytes_per_param + tables
                + experts * self.expert_bytes_per_param) / tp


def with_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str) -> ModelSpec:
    """``model`` with its KV cache stored as ``kv_cache_dtype`` (a :data:`KV_CACHE_DTYPES` name, as
    vLLM's ``--kv-cache-dtype``); ``auto`` keeps the model's own. A deployment setting: the KV
    cache and the cost model each take it, so that the pool and the attention reads agree."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    size = KV_CACHE_DTYPES[kv_cache_dtype]
    if kv_cache_dtype == "fp8_ds_mla" and (model.kv_latent_dim is None or model.sparse_attention_keys is None):
        raise ConfigError(f"kv_cache_dtype 'fp8_ds_mla' is DeepSeek's layout for sparse latent attention (DeepSeek-"
                          f"V3.2), and {model.name} has none; use fp8")
    if size is None:
        return model
    model = attrs.evolve(model, kv_dtype_bytes=size)
    if model.state_bytes is not None:  # a recurrent state stays in the model's dtype: more tokens of 1-byte KV
        model = attrs.evolve(model, sliding_window=model.window_tokens(1))
    return model


def kv_cache_dtype_field():
    """The ``kv_cache_dtype`` setting of a KV cache's and a cost model's config."""
    return str_field("auto", choices=tuple(KV_CACHE_DTYPES),
                     help="how the KV cache stores K and V, as vLLM's --kv-cache-dtype: auto (the model's dtype), "
                          "bfloat16, float16, fp8 (fp8_e4m3, fp8_e5m2): one byte an element, twice the tokens "
                          "in the same memory and half the bytes each decode reads (a sparse-attention model's "
                          "in DeepSeek's fp8_ds_mla layout, as vLLM keeps it); set the same in [kv_cache] "
                          "and [cost_model]")


def _check_efficiency(_inst, attribute, value) -> None:
    if not isinstance(value, dict):
        raise FieldError(attribute.name, f"must be a table of setting = number, got {value!r}")
    for key, number in value.items():
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 <= number < math.inf:
            raise FieldError(attribute.name, f"{key}: must be a number >= 0, got {number!r}")


@attrs.frozen
class GpuSpec:
    """One accelerator: how much memory it has and how fast it moves and multiplies numbers."""

    name: str = str_field(help="GPU name, e.g. 'a100-80gb'")
    memory_gib: float = float_field(min=0.0, max=MAX_MEMORY_GIB, min_exclusive=True, help="device memory in GiB")
    hbm_bandwidth_gbps: float = float_field(min=0.0, min_exclusive=True, help="memory bandwidth in GB/s (datasheet)")
    bf16_tflops: float = float_field(min=0.0, min_exclusive=True, help="dense bf16 tensor throughput in TFLOPS")
    host_link_gbps: float = float_field(
        min=0.0, min_exclusive=True,
        help="one-direction GPU<->CPU bandwidth in GB/s (PCIe or NVLink-C2C); used for swap transfers")
    fp8_tflops: float | None = float_field(
        None, min=0.0, min_exclusive=True, optional=True,
        help="dense FP8 tensor throughput in TFLOPS, FP32 accumulate (datasheet): the GEMMs of a model with "
             "fp8_activations; unset = no FP8 tensor cores (Ampere and older: vLLM runs FP8 weights through a "
             "weight-only kernel in 16 bits)")
    interconnect_gbps: float | None = float_field(
        None, min=0.0, min_exclusive=True, optional=True,
        help="one-direction GPU<->GPU bandwidth in GB/s (NVLink, or PCIe peer to peer) for "
             "tensor-parallel all-reduce; unset = host_link_gbps")
    interconnect_latency_us: float = float_field(
        10.0, min=0.0, help="fixed time of one all-reduce between GPUs, in us (launch and synchronisation)")
    compute_capability: float | None = float_field(
        None, min=0.0, min_exclusive=True, optional=True,
        help="CUDA compute capability, e.g. 9.0 (NVIDIA's CUDA GPUs list): which attention kernel vLLM runs "
             "on it (9.x, Hopper: FlashAttention 3; 10.x, datacenter Blackwell: FlashInfer; unset or other: "
             "FlashAttention 2)")
    # -- power (schedlab.energy): what the power models read; unset where no source gives it
    board_w: float | None = float_field(
        None, min=0.0, min_exclusive=True, optional=True,
        help="board power limit in W (datasheet TDP / max TGP): the most the GPU draws")
    idle_w: float | None = float_field(
        None, min=0.0, optional=True,
        help="power in W of the idle GPU at its lowest clocks (nvidia-smi with no work); unset = 12% of board_w")
    max_clock_mhz: float | None = float_field(
        None, min=0.0, min_exclusive=True, optional=True, help="highest (boost) SM clock in MHz (datasheet)")
    min_clock_mhz: float | None = float_field(
        None, min=0.0, min_exclusive=True, optional=True,
        help="lowest SM clock in MHz that can be locked (nvidia-smi -q -d SUPPORTED_CLOCKS)")
    efficiency: dict = attrs.field(
        factory=dict, converter=lambda v: dict(v) if isinstance(v, Mapping) else v, validator=_check_efficiency,
        metadata={"help": "the roofline's efficiencies measured on this GPU, keyed by its settings (mfu, "
                          "gemm_half_tokens, bandwidth_efficiency, ...); a setting left out takes the pooled default"})

    def __attrs_post_init__(self) -> None:
        if self.max_clock_mhz is not None and self.min_clock_mhz is not None \
                and self.min_clock_mhz > self.max_clock_mhz:
            raise ConfigError(f"{self.name}: min_clock_mhz ({self.min_clock_mhz:g}) exceeds max_clock_mhz "
                              f"({self.max_clock_mhz:g})")
        if self.board_w is not None and self.idle_w is not None and self.idle_w > self.board_w:
            raise ConfigError(f"{self.name}: idle_w ({self.idle_w:g}) exceeds board_w ({self.board_w:g}), the most "
                              "the GPU draws")

    @property
    def link_gbps(self) -> float:
        """GPU<->GPU bandwidth for collectives (one direction, GB/s)."""
        return self.interconnect_gbps if self.interconnect_gbps is not None else self.host_link_gbps

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


# --- presets lookup -----------------------------------------------------------------------------


class Presets:
    """Model and GPU specs by name: the registered presets plus specs an experiment declares.

    Names are matched exactly, then in lower case (``"Llama-3-8B"`` finds ``"llama-3-8b"``).
    A custom spec may not reuse a preset's name (pick a new one, so results say which is meant).
    """

    def __init__(self, models: "Registry", gpus: "Registry",
                 custom: Mapping[str, ModelSpec | GpuSpec] | None = None):
        self._models = models
        self._gpus = gpus
        self._custom_models: dict[str, ModelSpec] = {}
        self._custom_gpus: dict[str, GpuSpec] = {}
        for name, spec in (custom or {}).items():
            if isinstance(spec, ModelSpec):
                target, registry, kind = self._custom_models, models, "model"
            elif isinstance(spec, GpuSpec):
                target, registry, kind = self._custom_gpus, gpus, "gpu"
            else:
                raise ConfigError(f"custom preset {name!r} must be a ModelSpec or a GpuSpec, got {type(spec).__name__}")
            if name in registry:
                raise ConfigError(f"custom {kind} {name!r} has the name of a built-in {kind} preset; choose another name")
            target[name] = spec

    @classmethod
    def from_catalog(cls, catalog: "Catalog", custom: Mapping[str, ModelSpec | GpuSpec] | None = None) -> "Presets":
        return cls(catalog["model"], catalog["gpu"], custom)

    def model(self, name: str) -> ModelSpec:
        """The model spec called ``name``; an unknown name lists the known ones."""
        return self._lookup("model", name, self._custom_models, self._models, ModelSpec)

    def gpu(self, name: str) -> GpuSpec:
        """The GPU spec called ``name``; an unknown name lists the known ones."""
        return self._lookup("gpu", name, self._custom_gpus, self._gpus, GpuSpec)

    def model_names(self) -> list[str]:
        return sorted(set(self._models.names()) | set(self._custom_models))

    def gpu_names(self) -> list[str]:
        return sorted(set(self._gpus.names()) | set(self._custom_gpus))

    @staticmethod
    def _lookup(kind: str, name: str, custom: dict, registry: "Registry", spec_type: type):
        for candidate in (name, name.lower() if isinstance(name, str) else name):
            if candidate in custom:
                return custom[candidate]
            if candidate in registry:
                entry = registry.get(candidate)
                if not isinstance(entry.factory, spec_type):
                    raise ConfigError(
                        f"{kind} preset {candidate!r} from {entry.provider} is not a {spec_type.__name__} "
                        f"(got {type(entry.factory).__name__})")
                return entry.factory
        if kind == "model" and isinstance(name, str) and "/" in name:  # a Hugging Face id
            found = _by_hf_id(name, [*custom.values(), *(registry.get(n).factory for n in registry.names())])
            if found is not None:
                return found
        known = sorted(set(registry.names()) | set(custom))
        lowered = str(name).lower()
        # a name cut short ('h200' for 'h200-141gb') before a near spelling ('b200')
        hint = sorted((k for k in known if lowered and k.startswith(lowered)), key=len)[:1] \
            or difflib.get_close_matches(lowered, known, n=1)
        also = f" (did you mean {hint[0]!r}?)" if hint else ""
        if kind == "model" and isinstance(name, str) and "/" in name and not name.endswith(".json"):
            also = (" (a Hugging Face id no preset carries: declare its config.json, [models.<name>] config = "
                    "\"path/to/config.json\", then model = \"<name>\")")
        if kind == "model" and str(name).endswith(".json"):
            also = (" (a config.json is declared as a model of its own: [models.<name>] config = "
                    f"{str(name)!r}, then model = \"<name>\")")
        raise UnknownPluginError(f"unknown {kind} {name!r}{also}; known: {', '.join(known) or '(none)'}")


#: what a fine-tuned checkpoint's Hugging Face id adds to its base model's (the shapes are the same)
_TUNED_SUFFIXES = ("-instruct", "-chat", "-it", "-hf", "-base")


def _base_id(hf_id: str) -> str:
    """``hf_id`` in lower case without the suffixes of a tuned or converted checkpoint:
    ``meta-llama/Llama-2-7b-chat-hf`` -> ``meta-llama/llama-2-7b``."""
    text = hf_id.lower()
    while text.endswith(_TUNED_SUFFIXES):
        text = text[:text.rindex("-")]
    return text


#: Context lengths of checkpoints that resolve to a preset by their base id (:func:`_base_id`) but
#: whose own config.json gives another ``max_position_embeddings`` than the preset's: the shapes are
#: the same, the context is not. ``Qwen/Qwen2.5-{7B,72B}-Instruct``: 32,768 (their config.json;
#: ``tests/data/hf_configs/qwen2.5-7b-instruct-awq.json`` is 7B-Instruct's), where the base
#: ``Qwen/Qwen2.5-7B`` / ``-72B`` say 131,072; ``Qwen/Qwen3-*-Base``: 32,768 (``Qwen/Qwen3-8B-Base``
#: config.json), where the post-trained ``Qwen/Qwen3-8B`` says 40,960. Patterns in lower case.
HF_ID_CONTEXT = {"qwen/qwen2.5-*-instruct": 32768, "qwen/qwen3-*-base": 32768}


def _by_hf_id(name: str, specs) -> "ModelSpec | None":
    """The preset whose ``hf_id`` is ``name`` (in any case), else the one of the same base model
    (``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b``, whose id is ``meta-llama/Llama-3.1-8B``).
    A base-model match says so (an :class:`~schedlab.errors.InputWarning`: the shapes are the
    preset's, which the checkpoint may not share in every respect), and takes the checkpoint's own
    context from :data:`HF_ID_CONTEXT` where it is known to differ -- it sets vLLM's
    ``max_model_len``, SGLang's and TGI's ``context_length``."""
    models = [spec for spec in specs if isinstance(spec, ModelSpec) and spec.hf_id]
    found = [spec for spec in models if spec.hf_id.lower() == name.lower()]
    if len(found) == 1:
        return found[0]
    found = [spec for spec in models if _base_id(spec.hf_id) == _base_id(name)]
    if len(found) != 1:
        return None
    spec = found[0]
    context = next((n for pattern, n in HF_ID_CONTEXT.items() if fnmatch.fnmatchcase(name.lower(), pattern)), None)
    if context is not None and context != spec.max_position_embeddings:
        spec = attrs.evolve(spec, max_position_embeddings=context)
        told = f"with this checkpoint's own context of {context:,} tokens (its config.json)"
    elif spec.max_position_embeddings is not None:
        told = (f"its context of {spec.max_position_embeddings:,} tokens too (if this checkpoint's config.json says "
                "otherwise, declare the file: [models.<name>] config = \"path/to/config.json\")")
    else:
        told = "no context known"
    warnings.warn(f"model {name!r}: no preset carries this Hugging Face id; its shapes are taken from preset "
                  f"{spec.name!r} ({spec.hf_id}), its base model, {told}", InputWarning, stacklevel=4)
    return spec


# --- sizing -----------------------------------------------------------------------------------


@attrs.frozen
class KVSizing:
    """The KV block pool of one tensor-parallel rank, and the numbers it was derived from.

    With tensor parallelism each rank holds 1/tp of the weights and of the KV heads; every
    rank holds the same block ids, so ``num_blocks`` is also the instance's block count.
    All byte counts are per rank.
    """

    model: ModelSpec
    gpu: GpuSpec
    tensor_parallel: int
    gpu_memory_utilization: float
    block_size: int
    bytes_per_token: int
    bytes_per_block: int
    memory_bytes: int  # the GPU's memory
    usable_bytes: int  # memory * gpu_memory_utilization, rounded down
    weight_bytes: int
    reserve_bytes: int  # activations and non-torch memory
    kv_pool_bytes: int  # usable - weights - reserve
    num_blocks: int
    # Data and pipeline parallelism (schedlab.parallelism): GPUs the routed experts are spread
    # over, and the pipeline stages (a stage holds its layers' weights and KV; the stage with
    # the most layers sets the block count, as vLLM takes the smallest pool of its workers).
    expert_gpus: int = 1
    pipeline_parallel: int = 1
    hybrid: bool = True  # vLLM's hybrid KV cache manager: window layers keep their window only
    swa_ratio: float | None = None  # SGLang's hybrid SWA memory instead (ModelSpec.pool_layers)
    # A speculative drafter on the same GPUs (a draft model or EAGLE head, with vLLM's
    # --speculative-config): its weights are in weight_bytes, its KV layers in bytes_per_token.
    draft: ModelSpec | None = None
    draft_shares_tables: bool = False  # ... an EAGLE head using the target's embedding and LM head

    @property
    def window(self) -> SlidingWindow | None:
        """The window layers' share of vLLM's pool (:mod:`schedlab.kv_window`), None without
        (SGLang's window layers have a pool of their own)."""
        if not self.hybrid or self.swa_ratio is not None:
            return None
        return model_window(self.model, self.block_size, self.tensor_parallel)

    def sequence_blocks(self, seq_tokens: int) -> int:
        """Blocks one sequence of ``seq_tokens`` tokens holds at its longest, its window
        layers' included (:meth:`~schedlab.kv_window.SlidingWindow.fewest`)."""
        window = self.window
        blocks = _ceil_div(seq_tokens, self.block_size)
        return blocks + window.fewest(seq_tokens) if window is not None else blocks

    @property
    def tokens(self) -> int:
        """KV tokens the pool holds (``num_blocks * block_size``)."""
        return self.num_blocks * self.block_size


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def drafter_weight_bytes(draft: ModelSpec, tp: int, shares_tables: bool = False) -> int:
    """Weight bytes of speculative decoding's drafter on each rank (split as the target is); with
    ``shares_tables`` (an EAGLE head: vLLM's proposer shares the target's embedding and LM head,
    ``_maybe_share_embeddings``, ``_maybe_share_lm_head``) without its declared tables."""
    weights = draft.weight_bytes(tp)
    if shares_tables:
        weights -= (draft.embedding_params + draft.lm_head_params) * draft.table_bytes_per_param / tp
    return max(0, math.ceil(weights))


def _pool_numbers(model: ModelSpec, gpu: GpuSpec, utilization: float, tp: int,
                  reserve_bytes: int, block_size: int, parallelism: Parallelism = SINGLE,
                  hybrid: bool = True, swa_ratio: float | None = None,
                  draft: ModelSpec | None = None, draft_shares_tables: bool = False) -> tuple[int, int, int, int]:
    """``(usable, weights, bytes_per_block, pool)`` for one rank, without any checks.

    Data parallelism keeps the dense weights on every rank (split by tensor parallelism) and
    spreads the routed experts over all ``data_parallel x tp`` GPUs. A ``draft`` (speculative
    decoding's drafter, split as the target is) adds its weights and its layers' KV to every
    block, as vLLM loads it beside the target and pages its KV layers with the target's. On a
    pipeline each stage is sized on its own (:func:`_stage_pools`) and the one with the fewest
    blocks is returned: vLLM gives every rank the smallest rank's block count."""
    usable = math.floor(gpu.memory_bytes * utilization)
    weights = model.weight_bytes(tp)
    if parallelism.lockstep and model.is_moe:  # the routed experts spread over every rank's GPUs
        experts = model.expert_params * model.num_experts * model.expert_bytes_per_param
        weights = weights - experts / tp + experts / (tp * parallelism.data_parallel)
    per_token = model.pool_bytes_per_token(tp, hybrid, swa_ratio)
    if parallelism.pipeline_parallel > 1:
        return _stage_pools(model, usable, weights, per_token, tp, reserve_bytes, block_size,
                            parallelism.pipeline_parallel, hybrid, swa_ratio, draft, draft_shares_tables)
    weights = math.ceil(weights)
    if draft is not None:
        weights += drafter_weight_bytes(draft, tp, draft_shares_tables)
        per_token += draft.pool_bytes_per_token(tp, hybrid, swa_ratio)
    return usable, weights, per_token * block_size, usable - weights - reserve_bytes


def _stage_pools(model: ModelSpec, usable: int, weights: float, per_token: int, tp: int, reserve_bytes: int,
                 block_size: int, stages: int, hybrid: bool, swa_ratio: float | None,
                 draft: ModelSpec | None, draft_shares_tables: bool) -> tuple[int, int, int, int]:
    """:func:`_pool_numbers` of the pipeline stage with the fewest blocks. Each stage holds its
    layers' share of the weights and of the KV (vLLM's ``get_pp_indices`` split), the first stage
    the input embedding and the last the LM head -- with tied embeddings each end a table of its
    own, as vLLM builds them (``is_first_rank`` / ``is_last_rank``) -- and the last the drafter,
    which vLLM builds there; vLLM then sets every rank's ``num_blocks`` to the smallest rank's."""
    table = model.lm_head_params * model.table_bytes_per_param / tp  # (0 when vocab or width is not declared)
    body = weights - (model.embedding_params + model.lm_head_params) * model.table_bytes_per_param / tp
    layers = stage_layers(model.num_layers, stages)
    chosen = None
    for i, n in enumerate(layers):
        stage_weights = math.ceil(body * n / model.num_layers + table * ((i == 0) + (i == stages - 1)))
        stage_per_token = -(-per_token * n // model.num_layers)  # (its layers' share, rounded up)
        if draft is not None and i == stages - 1:
            stage_weights += drafter_weight_bytes(draft, tp, draft_shares_tables)
            stage_per_token += draft.pool_bytes_per_token(tp, hybrid, swa_ratio)
        pool = usable - stage_weights - reserve_bytes
        per_block = stage_per_token * block_size
        if chosen is None or pool // per_block < chosen[3] // chosen[2]:
            chosen = (usable, stage_weights, per_block, pool)
    return chosen


def gpu_weight_bytes(model: ModelSpec, tensor_parallel: int = 1, parallelism: Parallelism = SINGLE) -> float:
    """Weight bytes the most loaded GPU holds: a rank's share (:meth:`ModelSpec.weight_bytes`), the
    routed experts spread over every data-parallel rank's GPUs (a lockstep MoE deployment), and on a
    pipeline the largest stage's -- its layers' share, the input embedding on the first, the LM
    head on the last (as :func:`_stage_pools` splits them)."""
    tp = _check_tensor_parallel(tensor_parallel)
    weights = model.weight_bytes(tp)
    if parallelism.lockstep and model.is_moe:
        experts = model.expert_params * model.num_experts * model.expert_bytes_per_param
        weights = weights - experts / tp + experts / (tp * parallelism.data_parallel)
    stages = parallelism.pipeline_parallel
    if stages <= 1:
        return weights
    table = model.lm_head_params * model.table_bytes_per_param / tp
    body = weights - (model.embedding_params + model.lm_head_params) * model.table_bytes_per_param / tp
    layers = stage_layers(model.num_layers, stages)
    return max(body * n / model.num_layers + table * ((i == 0) + (i == stages - 1)) for i, n in enumerate(layers))


def check_weights_fit(model: ModelSpec, gpu: GpuSpec, tensor_parallel: int = 1,
                      parallelism: Parallelism = SINGLE) -> None:
    """Refuse a deployment whose weights alone exceed a GPU's memory (:func:`gpu_weight_bytes`):
    a cost model would time it as if it ran. A deployment whose weights fit but leave no room for
    the KV cache is :func:`size_kv_cache`'s to refuse, when the experiment sizes one.

    :raises ConfigError: the weights do not fit; the message names the model, the GPU, both sizes
        and a tensor_parallel that fits (as :func:`size_kv_cache` suggests one)."""
    tp = _check_tensor_parallel(tensor_parallel)
    weights = gpu_weight_bytes(model, tp, parallelism)
    if weights <= gpu.memory_bytes:
        return
    layout = f"tensor_parallel={tp}"
    whose = "each rank's"
    if parallelism.pipeline_parallel > 1:
        layout += f", pipeline_parallel={parallelism.pipeline_parallel}"
        whose = "the largest stage's"
    reserve = math.ceil(DEFAULT_ACTIVATION_RESERVE_GIB * GIB)
    if parallelism.pipeline_parallel > 1 or parallelism.lockstep:   # (the layout's own split, stage or experts)
        better_tp = next((t for t in _SUGGESTED_TP if t > tp and _splits(model, t)
                          and gpu_weight_bytes(model, t, parallelism) + reserve <= 0.9 * gpu.memory_bytes), None)
    else:
        better_tp = _smallest_fitting_tp(model, gpu, 0.9, tp, reserve, 16)
    fix = (f"use tensor_parallel = {better_tp} or a GPU with more memory" if better_tp
           else "use a GPU with more memory (tensor parallelism up to 8 is not enough)")
    raise ConfigError(f"{model.name} does not fit on {gpu.name} with {layout}: {whose} weights are {_gib(weights)}, "
                      f"more than the GPU's {_gib(gpu.memory_bytes)} of memory; {fix}")


def _splits(model: ModelSpec, tp: int) -> bool:
    """Whether ``tp`` ranks can split ``model``'s attention heads."""
    try:
        model.kv_heads_per_rank(tp)
    except ConfigError:
        return False
    return True


def _smallest_fitting_tp(model: ModelSpec, gpu: GpuSpec, utilization: float, current_tp: int,
                         reserve_bytes: int, block_size: int, hybrid: bool = True,
                         swa_ratio: float | None = None, draft: ModelSpec | None = None,
                         draft_shares_tables: bool = False) -> int | None:
    for tp in _SUGGESTED_TP:
        if tp <= current_tp:
            continue
        try:
            _, _, per_block, pool = _pool_numbers(model, gpu, utilization, tp, reserve_bytes, block_size,
                                                  hybrid=hybrid, swa_ratio=swa_ratio, draft=draft,
                                                  draft_shares_tables=draft_shares_tables)
        except ConfigError:  # heads cannot be split this way
            continue
        if pool // per_block > 0:
            return tp
    return None


def size_kv_cache(model: ModelSpec, gpu: GpuSpec, *, gpu_memory_utilization: float = 0.9,
                  tensor_parallel: int = 1,
                  activation_reserve_gib: float = DEFAULT_ACTIVATION_RESERVE_GIB,
                  block_size: int = 16, parallelism: Parallelism = SINGLE, hybrid: bool = True,
                  swa_ratio: float | None = None, draft: ModelSpec | None = None,
                  draft_shares_tables: bool = False) -> KVSizing:
    """Size the KV block pool of ``model`` on ``gpu`` the way vLLM does.

    ``num_blocks = (memory * gpu_memory_utilization - weights/tp - activation reserve) //
    bytes_per_block``, per rank (see :class:`KVSizing`).

    :param activation_reserve_gib: memory kept for activations and non-torch allocations,
        see :data:`DEFAULT_ACTIVATION_RESERVE_GIB`.
    :param parallelism: data-parallel experts and pipeline stages (see :func:`_pool_numbers`).
    :param hybrid: vLLM's hybrid KV cache manager (its default): a model's sliding-window layers
        keep only their window (:mod:`schedlab.kv_window`); false keeps every token in every layer.
    :param swa_ratio: SGLang's hybrid SWA memory instead (:meth:`ModelSpec.pool_layers`): the pool
        counts full-attention tokens, the window layers' own pool (not modelled) ``swa_ratio`` of them.
    :param draft: speculative decoding's drafter on the same GPUs: its weights and KV layers come
        out of the pool (see :func:`_pool_numbers`); ``draft_shares_tables``: an EAGLE head, its
        embedding and LM head the target's (:func:`drafter_weight_bytes`).
    :raises ConfigError: a bad argument, or the model does not fit (the message says by how
        much memory it falls short and suggests tensor parallelism or a bigger GPU).
    """
    tp = _check_tensor_parallel(tensor_parallel)
    util = gpu_memory_utilization
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 < util <= 1.0:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ConfigError(f"block_size must be a whole number from 1 to {MAX_BLOCK_SIZE}, got {block_size!r}")
    reserve = activation_reserve_gib
    if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0.0 <= reserve <= MAX_MEMORY_GIB:
        raise ConfigError(f"activation_reserve_gib must be a finite number >= 0 and <= {bound_text(MAX_MEMORY_GIB)} "
                          f"(GiB), got {reserve!r}")
    reserve_bytes = math.ceil(reserve * GIB)

    usable, weights, per_block, pool = _pool_numbers(model, gpu, util, tp, reserve_bytes, block_size, parallelism,
                                                     hybrid, swa_ratio, draft, draft_shares_tables)
    num_blocks = pool // per_block
    if num_blocks <= 0:
        short = weights + reserve_bytes + per_block - usable
        better_tp = _smallest_fitting_tp(model, gpu, util, tp, reserve_bytes, block_size, hybrid, swa_ratio, draft,
                                         draft_shares_tables)
        fix = (f"use tensor_parallel = {better_tp} or a GPU with more memory" if better_tp
               else "use a GPU with more memory (tensor parallelism up to 8 is not enough)")
        whose = "" if draft is None else f" (the drafter {draft.name}'s among them)"
        raise ConfigError(
            f"{model.name} does not fit on {gpu.name} with tensor_parallel={tp}: "
            f"{_gib(usable)} usable ({gpu.memory_gib:g} GiB x {util:g}) minus {_gib(weights)} of weights{whose} "
            f"minus {_gib(reserve_bytes)} of activation reserve leaves {_gib(pool)} for the KV cache; "
            f"it falls short by {_gib(short)} of holding even one {block_size}-token block; {fix}")
    return KVSizing(
        model=model, gpu=gpu, tensor_parallel=tp, gpu_memory_utilization=float(util),
        block_size=block_size, bytes_per_token=per_block // block_size, bytes_per_block=per_block,
        memory_bytes=gpu.memory_bytes, usable_bytes=usable, weight_bytes=weights,
        reserve_bytes=reserve_bytes, kv_pool_bytes=pool, num_blocks=num_blocks,
        expert_gpus=tp * parallelism.data_parallel if parallelism.lockstep and model.is_moe else tp,
        pipeline_parallel=parallelism.pipeline_parallel, hybrid=hybrid, swa_ratio=swa_ratio, draft=draft,
        draft_shares_tables=draft_shares_tables,
    )


def concurrency(sizing: KVSizing, seq_tokens: int) -> int:
    """How many sequences of ``seq_tokens`` total tokens (prompt + output) fit in the pool at
    once; each needs ``ceil(seq_tokens / block_size)`` blocks of its own, and its window
    layers' (:meth:`KVSizing.sequence_blocks`)."""
    if isinstance(seq_tokens, bool) or not isinstance(seq_tokens, int) or seq_tokens < 1:
        raise ConfigError(f"sequence length must be a whole number of tokens >= 1, got {seq_tokens!r}")
    return sizing.num_blocks // sizing.sequence_blocks(seq_tokens)


# --- printing ---------------------------------------------------------------------------------


def _num(x: float) -> str:
    """A number without a pointless ``.0``: 128 -> '128', 0.875 -> '0.875'."""
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.3f}".rstrip("0").rstrip(".")


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def format_capacity(sizing: KVSizing, *, avg_tokens: int | None = None, p99_tokens: int | None = None) -> str:
    """The derivation of ``sizing``, one quantity per line with units.

    With ``avg_tokens`` and/or ``p99_tokens`` (total sequence lengths) it adds how many
    sequences fit at each; the pool must be planned for the long tail, not the average.
    """
    s, m = sizing, sizing.model
    tp = s.tensor_parallel
    heads = m.kv_heads_per_rank(tp)
    heads_text = f"{m.num_kv_heads} KV heads" if tp == 1 else f"{heads} KV heads per rank ({m.num_kv_heads} over tp={tp})"
    per_rank = "" if tp == 1 else f" / {tp} ranks"
    pool_layers = m.pool_layers(s.hybrid, s.swa_ratio)
    layers = f"{pool_layers:g} layers"
    window = s.window
    if window is not None:
        layers += (f" (a block holds one page of each of {pool_layers} layers: the {m.kv_layers} full-attention "
                   f"layers' group)" if pool_layers != m.kv_layers else " (the full-attention ones)")
    elif s.swa_ratio is not None and pool_layers != m.num_layers:
        layers += (f" ({m.kv_layers} full-attention + {s.swa_ratio:g} x {m.sliding_window_layers} window layers: "
                   f"SGLang's window pool holds {s.swa_ratio:g} tokens per full-attention one)")
    elif pool_layers < m.num_layers:
        layers += f" (the other {m.sliding_window_layers} keep {m.window_tokens(tp)} tokens)"
    if m.fp8_ds_mla:
        rest = m.kv_latent_dim - m.kv_rope_dim
        kv_text = (f"{layers} x ({rest} latent x 1 B + {math.ceil(rest / DS_MLA_SCALE_GROUP)} scales x 4 B + "
                   f"{m.kv_rope_dim} RoPE x 2 B: fp8_ds_mla, on every rank)")
    elif m.kv_latent_dim is not None:
        kv_text = f"{layers} x {m.kv_latent_dim} latent (K and V, on every rank) x {m.kv_element_bytes} B"
    else:
        kv_text = f"2 x {layers} x {heads_text} x {m.head_dim} head_dim x {m.kv_element_bytes} B"
    if m.kv_index_bytes:
        kv_text += f" + {m.kv_layers} x {m.kv_index_bytes} B of indexer keys"
    if m.weight_bytes_per_param == m.expert_bytes_per_param == m.table_bytes_per_param == m.kv_element_bytes:
        b = m.kv_element_bytes  # (an FP8 checkpoint with an FP8 cache too: 1)
        dtypes, weights_text = f"{b}-byte weights and KV", f"{m.num_params / 1e9:.2f}B params x {b} B"
    else:
        experts = m.expert_params * m.num_experts if m.expert_bytes_per_param != m.weight_bytes_per_param else 0.0
        tables = m.embedding_params + m.lm_head_params if m.table_bytes_per_param != m.weight_bytes_per_param else 0.0
        dtypes = f"{m.weight_bytes_per_param:g}-byte weights, {m.kv_element_bytes}-byte KV"
        weights_text = (f"{(m.num_params - experts - tables) / 1e9:.2f}B params x {m.weight_bytes_per_param:g} B"
                        + (f" + {tables / 1e9:.2f}B embedding and LM head params x {m.table_bytes_per_param:g} B"
                           if tables else "")
                        + (f" + {experts / 1e9:.2f}B expert params x {m.expert_bytes_per_param:g} B" if experts else ""))
    layout, whose = "", ", every number per rank" if tp > 1 else ""
    if s.pipeline_parallel > 1:  # a stage holds its layers' KV and its share of the weights
        most = max(stage_layers(m.num_layers, s.pipeline_parallel))
        kv_text += f" x {most} / {m.num_layers} layers (the largest of {s.pipeline_parallel} stages)"
        per_rank += f" / {s.pipeline_parallel} stages"
        layout, whose = f", pipeline_parallel={s.pipeline_parallel}", ", every number a stage's"
    if s.expert_gpus > tp:  # data-parallel ranks: the routed experts spread over all their GPUs
        per_rank += f", the routed experts over {s.expert_gpus} GPUs"
        layout = f", data_parallel={s.expert_gpus // tp}"
        whose = ", every number a data-parallel rank's" + ("" if tp == 1 else " GPU's")
    if s.draft is not None:  # (the drafter's KV layers in every block, its weights beside the target's)
        d = s.draft
        kv_text += f" + drafter {d.name}'s {_num(d.pool_bytes_per_token(tp, s.hybrid, s.swa_ratio) / KIB)} KiB"
        per_rank += f" + drafter {d.name}'s {_gib(drafter_weight_bytes(d, tp, s.draft_shares_tables))}"
    lines = [
        f"KV capacity of {m.name} on {s.gpu.name} "
        f"(tensor_parallel={tp}{layout}, block_size={s.block_size}, {dtypes}{whose})",
        f"  KV per token        {kv_text} = {_num(s.bytes_per_token / KIB)} KiB",
        f"  KV per block        {s.block_size} tokens x {_num(s.bytes_per_token / KIB)} KiB "
        f"= {_num(s.bytes_per_block / MIB)} MiB",
        f"  GPU memory          {_gib(s.memory_bytes)}",
        f"  usable              {_gib(s.memory_bytes)} x {s.gpu_memory_utilization:g} = {_gib(s.usable_bytes)}",
        f"  weights             {weights_text}{per_rank} = {_gib(s.weight_bytes)}",
        f"  activation reserve  {_gib(s.reserve_bytes)}",
        f"  KV pool             {s.usable_bytes / GIB:.2f} - {s.weight_bytes / GIB:.2f} - "
        f"{s.reserve_bytes / GIB:.2f} = {_gib(s.kv_pool_bytes)}",
        f"  blocks              {_gib(s.kv_pool_bytes)} // {_num(s.bytes_per_block / MIB)} MiB = {s.num_blocks}",
        f"  tokens              {s.num_blocks} blocks x {s.block_size} = {s.tokens} tokens",
    ]
    if window is not None:
        own = m.window_tokens(tp)
        kept = (f"{window.tokens} tokens" if window.tokens == own
                else f"{own} tokens (as {window.tokens} of a {pool_layers}-layer group)")
        lines.append(f"  window layers       {m.sliding_window_layers} layers keep {kept} in "
                     f"{window.groups} more group(s) of {pool_layers} layers: up to "
                     f"{window.fewest(window.tokens + s.block_size)} blocks a sequence (vLLM's hybrid manager)")
    context = m.max_position_embeddings
    if context:  # vLLM checks at start-up that one sequence of max_model_len fits (kv_cache_planning.py)
        if s.sequence_blocks(context) <= s.num_blocks:
            lines.append(f"  context             {context} tokens (vLLM's default max_model_len) fit in the pool")
        else:
            lines.append(f"  context             {context} tokens (vLLM's default max_model_len) do not fit in the "
                         f"pool: vLLM refuses to start unless --max-model-len <= {tokens_fitting(s, s.num_blocks)} "
                         "(or auto)")
    fits: dict[str, tuple[int, int]] = {}
    for label, length in (("average", avg_tokens), ("p99", p99_tokens)):
        if length is None:
            continue
        n = concurrency(s, length)
        fits[label] = (length, n)
        blocks = s.sequence_blocks(length)
        lines.append(f"  fit at {label:<7}      {length} tokens = {blocks} blocks each "
                     f"-> {n} sequences" + (f" (longer than the model's context, {context}: vLLM cuts or "
                                            "rejects such requests)" if context and length > context else ""))
    if "average" in fits and "p99" in fits:
        (avg_len, n_avg), (p99_len, n_p99) = fits["average"], fits["p99"]
        if n_p99 == 0:
            lines.append(f"  plan for the tail: not even one {p99_len}-token sequence fits; "
                         f"p99 requests will be rejected or cut off")
        elif n_p99 < n_avg:
            lines.append(f"  plan for the tail: only {n_p99} p99-length sequences fit, "
                         f"{n_avg / n_p99:.1f}x fewer than the {n_avg} the average suggests")
        elif n_p99 == n_avg:
            lines.append(f"  plan for the tail: p99-length sequences fit as many as average ones ({n_p99})")
        else:  # a p99 below the mean: a few very long sequences raise the mean above nearly all of them
            lines.append(f"  plan for the average: the p99 length ({p99_len}) is below the average ({avg_len}); "
                         f"{n_p99} p99-length sequences fit, but only {n_avg} average ones")
    return "\n".join(lines)


# --- CLI glue ---------------------------------------------------------------------------------


def add_capacity_arguments(parser) -> None:
    """Add the ``schedlab capacity`` options to an argparse parser."""
    parser.add_argument("--model", required=True,
                        help="model preset, e.g. llama-3-8b, or a Hugging Face config.json (or its folder)")
    parser.add_argument("--gpu", required=True, help="GPU preset, e.g. a100-80gb")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="tensor-parallel ranks (default 1)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="share of GPU memory the engine may use (default 0.9, as vLLM)")
    parser.add_argument("--activation-reserve-gib", type=float, default=DEFAULT_ACTIVATION_RESERVE_GIB,
                        help=f"memory kept for activations (default {DEFAULT_ACTIVATION_RESERVE_GIB} GiB)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    parser.add_argument("--avg-tokens", type=int, default=None, help="average sequence length (prompt + output)")
    parser.add_argument("--p99-tokens", type=int, default=None, help="p99 sequence length (prompt + output)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=tuple(KV_CACHE_DTYPES),
                        help="how the cache stores K and V, as vLLM's flag (default auto: the model's dtype)")
    parser.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                        help="as vLLM's flag: sliding-window layers keep every token too (default: their window)")
    parser.add_argument("--pipeline-parallel", type=int, default=1,
                        help="pipeline stages (default 1): the numbers are then a stage's")
    parser.add_argument("--data-parallel", type=int, default=1,
                        help="data-parallel ranks of a MoE model (default 1): the numbers are then a rank's")
    parser.add_argument("--expert-parallel", action="store_true",
                        help="with --data-parallel: whole experts spread over the ranks' GPUs (vLLM's flag)")


def capacity_command(options: Any, catalog: "Catalog") -> str:
    """The text ``schedlab capacity`` prints.

    :param options: an argparse namespace from :func:`add_capacity_arguments`, or a mapping
        with the same keys (``model``, ``gpu``, ``tensor_parallel``, ...).
    :raises ConfigError: unknown preset names, bad values, or a model that does not fit.
    """
    get = options.get if isinstance(options, Mapping) else (lambda key, default=None: getattr(options, key, default))
    presets = Presets.from_catalog(catalog)
    model = get("model")
    if not is_config_path(model) and os.path.isdir(model) and model not in presets.model_names():
        raise ConfigError(f"--model {model}: a folder without a config.json (a model's Hugging Face folder holds "
                          "one; or name a model preset)")
    spec = spec_from_path(model, "--model") if is_config_path(model) else presets.model(model)
    spec = with_kv_cache_dtype(spec, get("kv_cache_dtype", "auto"))
    for key in ("avg_tokens", "p99_tokens"):
        tokens = get(key)
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise ConfigError(f"{_option(key)} {tokens!r}: a sequence length is a whole number of tokens >= 1")
    try:
        layout = Parallelism(data_parallel=get("data_parallel", 1), expert_parallel=get("expert_parallel", False),
                             pipeline_parallel=get("pipeline_parallel", 1))
    except FieldError as exc:
        if exc.name == "expert_parallel":
            raise ConfigError("--expert-parallel: spreads experts over data-parallel ranks: give --data-parallel 2 "
                              "or more (over tensor-parallel ranks each holds 1/tp of them either way)") from None
        raise ConfigError(f"{_option(exc.name)}: {exc.message}") from None
    if layout.lockstep and not spec.is_moe:
        raise ConfigError(f"--data-parallel {layout.data_parallel}: ranks that share experts are a MoE model's; "
                          f"{spec.name}'s ranks are instances of their own (size one with --data-parallel 1)")
    try:
        sizing = size_kv_cache(
            spec, presets.gpu(get("gpu")),
            gpu_memory_utilization=get("gpu_memory_utilization", 0.9),
            tensor_parallel=get("tensor_parallel", 1),
            activation_reserve_gib=get("activation_reserve_gib", DEFAULT_ACTIVATION_RESERVE_GIB),
            block_size=get("block_size", 16), hybrid=not get("disable_hybrid_kv_cache_manager", False),
            parallelism=layout,
        )
    except ConfigError as exc:  # (its messages name the TOML keys; here the options are what to change)
        text = str(exc)
        for key in ("tensor_parallel", "pipeline_parallel", "gpu_memory_utilization", "activation_reserve_gib",
                    "block_size"):
            if text.startswith(key + " "):
                raise ConfigError(f"{_option(key)}{text[len(key):]}") from None
        raise
    return format_capacity(sizing, avg_tokens=get("avg_tokens"), p99_tokens=get("p99_tokens"))


def _option(key: str) -> str:
    """The ``schedlab capacity`` option of a setting (``block_size`` -> ``--block-size``)."""
    return "--" + key.replace("_", "-")
