"""A roofline cost model derived from a model preset and a GPU preset.

Decode is memory-bound: each iteration reads the weights once and the KV of every decoding
sequence. Prefill is compute-bound: ``2 * num_params`` FLOPs per prompt token plus the
attention FLOPs of each chunk over its cached context and itself. The parts are *added*::

    iteration_ms = overhead + weights / BW + decode_context_tokens * kv_bytes_per_token / BW
                   + prefill FLOPs / (bf16_tflops * mfu)

where ``BW = hbm_bandwidth * bandwidth_efficiency``. Adding instead of taking the maximum
is a conservative roofline (no overlap of memory traffic and compute); it keeps the cost
exactly linear in ``decode_context_tokens`` for a fixed batch composition, which is what
lets :meth:`RooflineCostModel.decode_step_increment` tell the engine the exact per-step
growth. With tensor parallelism every rank reads 1/tp of the weights and of the KV and does
1/tp of the FLOPs at its own GPU's rates; all-reduce time is not modelled (fold it into
``overhead_ms``). Not modelled either: the FLOPs of decode tokens (decode is taken to be
bound by memory traffic at any batch size) and the KV read of prefill attention.

The roofline itself is Williams, Waterman and Patterson (CACM 2009); its use for LLM
inference (weights and KV bytes for decode, FLOPs for prefill) follows "LLM Inference
Unveiled: Survey and Roofline Model Insights" (Yuan et al., 2024).
"""

from __future__ import annotations

import attrs
import numpy as np

from schedlab.capacity import GpuSpec, ModelSpec, Presets
from schedlab.configs import float_field, int_field, str_field
from schedlab.protocols import Batch


@attrs.frozen
class RooflineConfig:
    """Settings of the ``roofline`` cost model."""

    model: str = str_field(help="model preset (e.g. 'llama-3-8b') or a model declared in the experiment")
    gpu: str = str_field(help="GPU preset (e.g. 'a100-80gb') or a GPU declared in the experiment")
    tensor_parallel: int = int_field(1, min=1, help="tensor-parallel ranks the model is split over")
    bandwidth_efficiency: float = float_field(
        0.8, min=0.0, min_exclusive=True, max=1.0,
        help="share of peak memory bandwidth reached when reading weights and KV")
    mfu: float = float_field(
        0.5, min=0.0, min_exclusive=True, max=1.0,
        help="model FLOPs utilisation: share of peak bf16 TFLOPS reached in prefill")
    overhead_ms: float = float_field(
        1.0, min=0.0, help="fixed time per iteration (scheduling, kernel launches, sampling) in ms")


class RooflineCostModel:
    """Iteration time from bytes moved and FLOPs done (see the module docstring).

    :ivar model: the model spec; :ivar gpu: the GPU spec; :ivar config: the settings.
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, config: RooflineConfig | None = None):
        self.model = model
        self.gpu = gpu
        self.config = config if config is not None else RooflineConfig(model=model.name, gpu=gpu.name)
        tp = self.config.tensor_parallel
        # Rates per millisecond: GB/s * 1e9 / 1e3 and TFLOPS * 1e12 / 1e3.
        self._bytes_per_ms = gpu.hbm_bandwidth_gbps * 1e6 * self.config.bandwidth_efficiency
        self._flops_per_ms = gpu.bf16_tflops * 1e9 * self.config.mfu
        self._host_bytes_per_ms = gpu.host_link_gbps * 1e6
        self._kv_bytes_per_token = model.kv_bytes_per_token(tp)  # raises ConfigError on a bad split
        self._fixed_ms = self.config.overhead_ms + model.weight_bytes(tp) / self._bytes_per_ms
        self._kv_ms_per_token = self._kv_bytes_per_token / self._bytes_per_ms
        self._linear_flops_per_token = 2.0 * model.num_params / tp
        heads = model.num_attention_heads or 0
        # QK^T and attention-times-V: 2 * head_dim FLOPs each per (query, key) pair and head.
        self._attention_flops_per_pair = 4.0 * model.num_layers * heads * model.head_dim / tp

    # --- CostModel protocol -------------------------------------------------------------------

    def iteration_ms(self, batch: Batch) -> float:
        """Duration of one iteration of shape ``batch`` in ms (0.0 for an empty batch)."""
        if batch.num_decode == 0 and batch.prefill_tokens == 0:
            return 0.0
        ms = self._fixed_ms + batch.decode_context_tokens * self._kv_ms_per_token
        if batch.prefill_tokens:
            ms += self.prefill_compute_ms(batch.prefill_tokens, batch.prefill_context_tokens, batch.num_prefill)
        return ms

    def decode_step_increment(self, batch: Batch) -> float | None:
        """For a decode-only batch: each next step reads ``num_decode`` more KV tokens, so it
        takes ``num_decode * kv_bytes_per_token / BW`` longer. ``None`` when prefill runs."""
        if batch.prefill_tokens:
            return None
        return batch.num_decode * self._kv_ms_per_token

    # --- parts ----------------------------------------------------------------------------------

    def prefill_compute_ms(self, prefill_tokens: int, prefill_context_tokens: int = 0, num_prefill: int = 1) -> float:
        """Compute time of the prefill part of an iteration.

        Linear layers: ``2 * num_params`` FLOPs per token. Attention (only when the model
        declares ``num_attention_heads``): ``4 * layers * heads * head_dim`` FLOPs per
        (query, key) pair; a chunk of ``c`` tokens after ``p`` cached ones has
        ``c * p + c * (c + 1) / 2`` causal pairs. A :class:`Batch` only carries sums, so the
        chunks are taken to be of equal length (exact for one prefill; for several it
        undercounts the ``c**2`` part, by Cauchy-Schwarz).
        """
        n = max(1, num_prefill)
        pairs = prefill_tokens * prefill_context_tokens / n + prefill_tokens * (prefill_tokens / n + 1) / 2
        flops = self._linear_flops_per_token * prefill_tokens + self._attention_flops_per_pair * pairs
        return flops / self._flops_per_ms

    def swap_ms(self, num_tokens: int) -> float:
        """Time to copy ``num_tokens`` tokens of KV between GPU and CPU over the host link
        (each rank copies its own share in parallel)."""
        return num_tokens * self._kv_bytes_per_token / self._host_bytes_per_ms

    def request_cost(self, prompt_tokens, output_tokens):
        """``(prefill_ms, decode_ms)`` a request would cost running alone (numbers or numpy arrays).

        Prefill computes the whole prompt in one iteration and yields the first token; the
        other ``output_tokens - 1`` tokens take one batch-size-1 decode step each, step ``j``
        attending to ``prompt + j`` tokens. No prefix-cache reuse is assumed.
        """
        prompt = np.asarray(prompt_tokens, dtype=float)
        steps = np.maximum(np.asarray(output_tokens, dtype=float) - 1.0, 0.0)
        prefill = self._fixed_ms + self.prefill_compute_ms(prompt)
        first = self._fixed_ms + self._kv_ms_per_token * (prompt + 1.0)
        # Arithmetic series: steps * first + increment * (0 + 1 + ... + steps - 1).
        decode = steps * first + self._kv_ms_per_token * (steps * (steps - 1.0) / 2.0)
        if np.ndim(prefill) == 0:
            return float(prefill), float(decode)
        return prefill, decode


def build_roofline(config: RooflineConfig, presets: Presets) -> RooflineCostModel:
    """Factory: resolve the config's model and GPU names through ``presets``."""
    return RooflineCostModel(presets.model(config.model), presets.gpu(config.gpu), config)
