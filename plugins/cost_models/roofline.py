"""A roofline cost model derived from a model preset and a GPU preset.

Each part of an iteration with ``T`` tokens (decodes + prefill chunk tokens) is timed from the
bytes it moves and the FLOPs it does, at efficiencies measured on real GPUs::

    gpu_ms = layers * layer_overhead_us / 1000
           + linear(T)            hypot(weight bytes / (BW * bandwidth_efficiency),
                                              2 * params per token * T / (TFLOPS * eta(T)))
           + layers * attention_layer_us / 1000    (the attention kernels' launch, every step)
           + decode_context_tokens * max(kv_bytes_per_token / (BW * kv_read_efficiency),
                                         decode FLOPs per pair / (TFLOPS * latent_decode_efficiency))
             (the full-attention layers'; each decode also reads its window layers' window,
              taken whole: a constant per decode, schedlab.kv_window. The FLOPs bind only for
              latent attention with many heads per GPU: vLLM decodes MLA absorbed, about 240
              FLOPs per KV byte in DeepSeek-V3 at tensor parallel 1; measured in vLLM, Hopper's
              kernel reaches 0.62-0.71 of the bf16 peak, Triton's on Ampere and Ada 0.06-0.10,
              tools/derive_latent_attention.py. Grouped-query attention does 2 x group /
              dtype_bytes FLOPs a byte, under the ridge but for multi-query or large groups:
              its FLOPs are bounded at attention_efficiency, FlashAttention's rate)
             + num_decode * layers * decode_attention_us / 1000
             (with a prefill chunk, in FlashAttention 2's varlen kernel: at least
              mixed_decode_query_rows query rows of attention FLOPs per decode context token
              -- it pads each query head of a decode to a tile -- and empty_tile_ns per empty
              tile: its grid gives every sequence as many query tiles as the longest query
              needs; FlashAttention 3, vLLM's kernel on Hopper, packs a decode's query heads
              into one tile per KV head and launches no empty tiles, and FlashInfer, its
              kernel on datacenter Blackwell, runs the decodes apart: as in a decode-only step)
           + uneven decode contexts: alpha x (the decodes' attention with every context at the
             longest - with their own), linear in num_decode x longest - decode_context_tokens;
             decode_skew_alpha in a decode-only step (and FlashAttention 3 / FlashInfer beside
             a chunk), mixed_skew_alpha for FlashAttention 2's varlen kernel beside a chunk,
             which has no split-KV for them: the longest context's tiles finish last
           + prefill attention FLOPs / (TFLOPS * attention_efficiency)
             (a sliding-window or chunked layer's query over at most its window's keys)
           + tensor-parallel communication at T tokens, S sequences (:mod:`.tensor_parallel`:
             2 all-reduces of T x hidden per layer, 1 for the embedding, the logits'
             all-gather; NCCL's algorithms over the machine's links, :mod:`.collectives`)
    iteration_ms = the step around it (:mod:`.step_overhead`: the host's work per step and per
                   sequence, hidden by asynchronous scheduling unless it is the longer; kernel
                   launches without CUDA graphs; the gap between steps) + overhead_ms

    eta(T) = mfu * T / (T + gemm_half_tokens)     (GEMMs of few tokens cannot fill the GPU)

``hypot`` (the 2-norm of the memory and compute times) is a smooth roofline: a pure weight
read at one token, compute-bound at thousands, and the 14-29% rise between them that the
profiles show for decode batches of 128 (a ``max`` stays flat there). The memory parts and
the compute of attention are *added*, so the cost stays exactly linear in
``decode_context_tokens`` for a fixed batch, which :meth:`RooflineCostModel.decode_step_increment`
tells the engine.

Weights: every rank reads ``1/tp`` of them each iteration (at the model's bytes per weight,
the routed experts at theirs: an FP8 or MXFP4 checkpoint; FP8 weights that meet FP8 activations,
``fp8_activations``, multiply at the GPU's ``fp8_tflops`` where it has FP8 tensor cores, at the
same efficiencies: DeepSeek-V3.2's FP8 ``gate_up_proj`` on the RTX PRO 6000 Server reaches 816
TFLOPS at 2,048 tokens in LLMServingSim's profile, 0.81 of the FP8 rate against the bf16 GEMMs'
fitted 0.76 there), except an untied input embedding
table (when the preset declares ``vocab_size``): it is looked up, one row per token, and
multiplies nothing. The LM head (a tied table is the LM head) is a GEMM of its own: the whole
matrix read every iteration, its FLOPs for the sampled rows only -- one per sequence, as vLLM
computes logits at each sequence's last position (every draft position when verifying) -- so
a prompt chunk's tokens do not pass through it. MoE models
(``num_experts``): attention and other dense weights as above; of the routed experts only
those some token picked are read -- ``E (1 - (1 - k/E)^T)`` of ``E`` under uniform routing --
and the FLOPs are those of the ``params per token`` (active parameters); the expert GEMMs
run at ``eta`` of the tokens each expert gets times ``expert_gemm_share`` (the fused MoE kernel),
their weights are read at ``expert_read_share`` of the dense read, each expert read costs
``expert_us`` besides (a narrow expert, as tensor parallelism makes them, does not reach the
bandwidth), and every MoE layer adds
``expert_layer_us`` (routing and sorting the tokens by expert; ``moe_layers`` of them where some
layers are dense, as DeepSeek-V3's first three). Experts whose weights are FP8 and
multiply FP8 activations take the GPU's ``fp8_`` expert settings, 4-bit experts its ``w4a16_`` ones
(other kernels: :data:`EXPERT_KERNELS`). With ``expert_parallel`` the experts are
spread over the ranks instead of split (the same bytes and FLOPs per rank in this model).

Speculative decoding's verify pass (``spec_tokens`` draft tokens beside the decodes' own):
the drafts are more tokens through the linear layers (nearly free while weight reads
dominate: why speculation pays at small batches), their KV is read with the context, and the
decodes' attention runs in the varlen kernel with several query rows each, which pads them to
a tile as it does decodes riding with a prefill chunk: ``mixed_decode_query_rows`` of FLOPs per
context token when that exceeds the KV read (an inference from the mixed-batch profiles; the
profiles hold no verify passes).

The KV cache's dtype (``kv_cache_dtype``, vLLM's ``--kv-cache-dtype``): an FP8 cache stores one
byte an element (:data:`schedlab.capacity.KV_CACHE_DTYPES`), so a decode reads half the bytes of
its context (and a preempted sequence swaps half). The attention kernels' fixed times and
efficiencies stay the 16-bit cache's -- no FP8-cache kernel is measured here -- and prefill
attention keeps the bf16 rate (vLLM's FlashAttention 3 path quantizes the queries to FP8 on
Hopper: not modelled).

Not modelled: decode-token FLOPs beyond the linear layers, the KV read of prefill attention.

The efficiencies are measured: per GPU where a profile exists (the GPU preset's
``efficiency``: Vidur's linear-layer profiles of H100, A100, A40 and LLMServingSim's vLLM 0.19
profiles of the RTX PRO 6000 and RTX 4090; a GPU of the same architecture takes its profiled
sibling's), pooled over them otherwise (:data:`DERIVATION`); ``tools/derive_roofline.py`` derives
them all. A setting given in the config wins over both. The roofline
itself is Williams, Waterman and Patterson (CACM 2009); its use for LLM inference follows
"LLM Inference Unveiled: Survey and Roofline Model Insights" (Yuan et al., 2024).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from schedlab.capacity import (
    GpuSpec, ModelSpec, Presets, check_weights_fit, kv_cache_dtype_field, with_kv_cache_dtype,
)
from schedlab.configs import MAX_TENSOR_PARALLEL, FieldError, bool_field, float_field, int_field, str_field
from schedlab.errors import ConfigError
from schedlab.parallelism import SINGLE, Parallelism
from schedlab.protocols import Batch

from .collectives import Collectives, interconnect_field, machine
from .expert_parallel import ExpertLayers, busiest_experts_work, check_expert_parallel
from .pipeline import PipelineSends, split_stages, stage_split
from .step_overhead import StepTiming, step_field
from .tensor_parallel import TensorParallelComm
from .vllm_all_reduce import tp_all_reduce_field
from .work import ModelWork, check_rank_tokens, fp8_factor, gemm_factors


#: The pooled efficiencies, for a GPU measured by no profile (neither its own nor its
#: architecture's, ``plugins/presets.py``): what ``python tools/derive_roofline.py`` prints as
#: "pooled" -- the median over the five profiled GPUs (H100 SXM, A100 80 GB, A40 from Vidur's
#: linear-layer profiles; RTX PRO 6000 Server and RTX 4090 from LLMServingSim's vLLM 0.19
#: profiles) of each GPU's fit to the dense part of a layer (GEMMs, norms, rotary, activation):
#:
#:   GPU (profile)                weight read  layer overhead  eta(T) = mfu T / (T + half)  RMS log err
#:   RTX PRO 6000 Server (LSS)       0.979        25.7 us        0.78 T / (T + 55)            0.042
#:   RTX 4090 (LSS)                  0.963        26.2 us*       0.99 T / (T + 2)             0.048
#:   H100 SXM (Vidur)                0.846        26.8 us        0.61 T / (T + 18)            0.099
#:   A100 80 GB (Vidur)              0.776        36.0 us        0.66 T / (T + 0)             0.065
#:   A40 (Vidur)                     0.798        24.2 us        0.69 T / (T + 23)            0.080
#:   pooled                          0.846        26.2 us        0.69 T / (T + 18)
#:
#: (a layer at one token takes hypot(bytes / (BW * weight read), its compute) + the layer
#: overhead -- the GEMMs' launch and tail and the small operators -- fitted over the GPU's layer
#: sizes; * one layer size only: the other GPUs' median overhead. The compute-bound share below the datasheet
#: rate also carries the small operators' growth with the tokens: 15% of an H100 layer of
#: Llama-2-7B at 4,096 tokens.) Attention, from LLMServingSim's profiles only (median of the 7
#: bundles; the 4090 alone: 0.93, 21.3 us, 0.16 us, 0.74, 67 rows, 160 tokens): decode
#: attention takes 12.1 us a layer and step, 0.11 us a decode and layer, and reads the KV at 0.91
#: of the bandwidth (4-5% RMS error per bundle over 16-256 decodes and 256-16k contexts, against
#: 16-31% for a read at 0.86 alone), prefill attention reaches 0.48 of the bf16 rate, and a decode in a step with a prefill chunk costs the
#: attention FLOPs of 60 query rows over its context plus 180 tokens (the varlen kernel pads its
#: one query to a tile, 2-4x dearer than reading its KV, and the tile has a fixed cost) and 3.0 ns
#: per head and layer for each of the ``ceil(chunk / 128) - 1`` empty query tiles the kernel
#: launches for it (its grid is sized by the longest query; 2.9-3.5 ns on the six RTX PRO 6000
#: bundles, whose heads per rank range 16-64, 4.8 on the 4090; fitted over chunks 256-2048,
#: 16-128 decodes, contexts 256-4k: 12-17% RMS error per bundle, against 17-19% without the
#: empty tiles and 28-33% for 70 rows alone).
#: MoE experts: a MoE layer takes ``expert_layer_us + hypot(experts read x (one's weights / (BW x
#: bandwidth_efficiency x expert_read_share) + expert_us), pair FLOPs / (peak x dense GEMM curve at
#: the rows per expert x expert_gemm_share))``. On the RTX PRO 6000 Server (Qwen3-30B-A3B at TP 1,
#: its ``moe.csv``: 1-2,048 tokens over 8-128 experts; tools/derive_roofline.py) 29.9 us of routing,
#: sorting and launches a layer, the weights at 0.988 of the dense read, the fused MoE kernel's GEMMs
#: at 0.81 of cuBLAS's at as many rows (3.2% RMS error on the 38 points whose experts do not fit in
#: the L2 cache, against 8.3% with no fixed time). On H100, H200, B200 and L40S, vLLM 0.24's MoE
#: layer timed alone by aiconfigurator (the kernel vLLM picks: Triton's fused MoE, FlashInfer's
#: TRT-LLM kernels on B200) over 13-16 shapes at TP 1-8, 16-bit, FP8 and 4-bit experts
#: (tools/derive_experts.py): 18-51 us a layer and 0.09-0.72 us an expert (a narrow expert does not
#: reach the bandwidth), median error 4-12%; the pooled values are each setting's median over the GPUs.
#: Uneven decode contexts (LLMServingSim's skew shots, ``skew.csv``: 330 decode-only and ~12,700
#: mixed batches per bundle, a few contexts ``skew`` times the others', timed as they are, at the
#: mean and all at the longest): a batch takes alpha of the gap from the mean to the longest, the
#: median shot's 0.037 decode-only (0.026-0.040 per bundle) and 0.103 beside a prefill chunk
#: (0.073-0.133). Without it the roofline was 1-5% short of the profiled model's steps on the
#: validation runs, most in mixed steps.
#: Query rows per tile of FlashAttention's varlen kernel (its ``kBlockM``, 128 for the head
#: sizes served here): the grid launches ``ceil(longest query / 128)`` tiles per sequence and head.
QUERY_TILE = 128

#: The attention kernels whose mixed-step behaviour the roofline knows. FlashAttention 2's varlen
#: kernel (vLLM's FLASH_ATTN backend below compute capability 9, and on 12.x: the profiled RTX
#: PRO 6000 and RTX 4090) gives each query head of a sequence its own tiles, as many as the
#: longest query needs -- it packs a decode's query heads together only when every query in the
#: call is one token (``seqlenq_ngroups_swapped``, a decode-only step). FlashAttention 3 (vLLM's
#: choice on Hopper, ``get_flash_attn_version``) always packs the query heads of a KV head into
#: the tile's rows for varlen queries (``should_pack_gqa``; vLLM's build also forces it when the
#: K and V head sizes match) and its varlen scheduler launches only the tiles each sequence's own
#: rows fill (``VarlenDynamicPersistentTileScheduler``, vllm-project/flash-attention ``hopper/``):
#: a decode beside a prefill chunk is timed as in a decode-only step, without empty tiles.
#: FlashInfer, vLLM's default backend on compute capability 10.x (``_get_backend_priorities``),
#: splits a step's decodes from its prefills and runs them in a decode kernel of their own
#: (``split_decodes_and_prefills``, ``BatchDecodeWithPagedKVCacheWrapper`` or TRT-LLM's
#: ``trtllm_batch_decode_with_kv_cache``; ``vllm/v1/attention/backends/flashinfer.py``): the same.
ATTENTION_KERNELS = ("flash-attention-2", "flash-attention-3", "flashinfer")


def default_attention_kernel(gpu: GpuSpec) -> str:
    """The attention kernel vLLM runs on ``gpu``: FlashAttention 3 on Hopper (compute capability
    9.x), FlashInfer on datacenter Blackwell (10.x), else FlashAttention 2 (unknown capability
    included: the profiled behaviour)."""
    cc = gpu.compute_capability
    if cc is not None and 9.0 <= cc < 10.0:
        return "flash-attention-3"
    if cc is not None and 10.0 <= cc < 11.0:
        return "flashinfer"
    return "flash-attention-2"

DERIVATION = {"bandwidth_efficiency": 0.846, "kv_read_efficiency": 0.91, "attention_layer_us": 12.1,
              "decode_attention_us": 0.11, "attention_efficiency": 0.48,
              "mixed_decode_query_rows": 60.0, "mixed_decode_context_offset": 180.0, "empty_tile_ns": 3.0,
              "layer_overhead_us": 26.2,
              "mfu": 0.69, "gemm_half_tokens": 18.0,
              "expert_layer_us": 29.9, "expert_us": 0.326, "expert_read_share": 1.16, "expert_gemm_share": 0.712,
              "decode_skew_alpha": 0.037, "mixed_skew_alpha": 0.103}


#: The kinds of routed experts whose MoE kernels are measured per GPU (:func:`expert_kernel`) -> the
#: prefix of their settings in a GPU's efficiency table: 16-bit experts' plain, block-scaled FP8
#: ones' (FP8 weights times FP8 activations) ``fp8_``, 4-bit weights with 16-bit activations (gpt-oss's
#: MXFP4) ``w4a16_``.
EXPERT_KERNELS = {"bf16": "", "fp8": "fp8_", "w4a16": "w4a16_"}
#: the settings each kind of expert has its own of
EXPERT_SETTINGS = ("expert_layer_us", "expert_us", "expert_read_share", "expert_gemm_share")
#: at most this many bytes a weight: 4-bit experts with their scales (MXFP4 4.25 bits, NVFP4 4.5)
W4_BYTES_PER_PARAM = 0.5625
#: The expert settings of a GPU without a measurement of its own, per kind other than 16-bit (whose
#: are :data:`DERIVATION`'s): each setting's median over the GPUs measured
#: (``python tools/derive_experts.py``).
EXPERTS_POOLED = {
    "fp8": {"expert_layer_us": 38.0, "expert_us": 0.242, "expert_read_share": 1.183, "expert_gemm_share": 0.397},
    "w4a16": {"expert_layer_us": 37.9, "expert_us": 0.178, "expert_read_share": 1.012, "expert_gemm_share": 0.791},
}

#: ``latent_decode_efficiency`` of a GPU without a measurement of its own, by the MLA decode kernel
#: vLLM runs on it (``python tools/derive_latent_attention.py``: aiconfigurator's vLLM 0.14 MLA
#: decode timings, the median of each family): FlashMLA-class kernels on compute capability 9.x and
#: 10.x (FlashAttention's MLA and FlashMLA on Hopper, CUTLASS MLA on datacenter Blackwell),
#: Triton's MLA kernel elsewhere (Ampere, Ada, consumer Blackwell).
LATENT_DECODE_POOLED = {"flash": 0.67, "triton": 0.08}


def default_latent_decode_efficiency(gpu: GpuSpec) -> float:
    """:data:`LATENT_DECODE_POOLED` of the MLA kernel family vLLM runs on ``gpu``."""
    cc = gpu.compute_capability
    return LATENT_DECODE_POOLED["flash" if cc is not None and 9.0 <= cc < 11.0 else "triton"]


def _measured(name: str, help: str, *, share: bool = True, positive: bool = False):
    """An efficiency setting: unset takes the GPU's measured value, else :data:`DERIVATION`'s.
    ``share``: in (0, 1]; else >= 0, or > 0 with ``positive`` (a divisor: 0 would divide by it)."""
    return float_field(None, min=0.0, min_exclusive=share or positive, max=1.0 if share else None, optional=True,
                       help=f"{help} (unset: the GPU preset's measured value, else {DERIVATION[name]:g})")


@attrs.frozen
class RooflineConfig:
    """Settings of the ``roofline`` cost model (efficiencies: the GPU's measured ones, else :data:`DERIVATION`)."""

    model: str = str_field(help="model preset (e.g. 'llama-3-8b') or a model declared in the experiment")
    gpu: str = str_field(help="GPU preset (e.g. 'a100-80gb') or a GPU declared in the experiment")
    tensor_parallel: int = int_field(1, min=1, max=MAX_TENSOR_PARALLEL,
                                     help="tensor-parallel ranks the model is split over")
    expert_parallel: bool = bool_field(False, help="MoE: experts spread over the ranks (vLLM --enable-expert-parallel)")
    kv_cache_dtype: str = kv_cache_dtype_field()
    bandwidth_efficiency: float | None = _measured(
        "bandwidth_efficiency", "share of peak memory bandwidth reached when reading weights")
    kv_read_efficiency: float | None = _measured(
        "kv_read_efficiency", "share of peak memory bandwidth reached when decode attention reads the KV cache")
    attention_layer_us: float | None = _measured(
        "attention_layer_us", "per decoder layer and step: the attention kernels' fixed time (launch, split-KV "
                              "reduction), us", share=False)
    decode_attention_us: float | None = _measured(
        "decode_attention_us", "per decode and decoder layer in a decode-only step: attention time besides its KV "
                               "read, us", share=False)
    mfu: float | None = _measured(
        "mfu", "share of peak bf16 TFLOPS the linear layers reach with many tokens (GEMM efficiency)")
    gemm_half_tokens: float | None = _measured(
        "gemm_half_tokens", "tokens at which GEMMs reach half of mfu: efficiency = mfu * T / (T + gemm_half_tokens)",
        share=False)
    attention_efficiency: float | None = _measured(
        "attention_efficiency", "share of peak bf16 TFLOPS prefill attention reaches")
    latent_decode_efficiency: float | None = float_field(
        None, min=0.0, min_exclusive=True, max=1.0, optional=True,
        help="share of peak bf16 TFLOPS a latent-attention (MLA) decode's absorbed FLOPs reach: where they "
             "outlast its KV read (many heads on a GPU), they time it (unset: the GPU preset's measured value, "
             f"else {LATENT_DECODE_POOLED['flash']:g} on compute capability 9.x-10.x, "
             f"{LATENT_DECODE_POOLED['triton']:g} elsewhere: vLLM's MLA kernels there)")
    mixed_decode_query_rows: float | None = _measured(
        "mixed_decode_query_rows", "a decode in an iteration with prefill costs the attention FLOPs of this many query "
                                   "rows over its context (+ mixed_decode_context_offset)", share=False)
    mixed_decode_context_offset: float | None = _measured(
        "mixed_decode_context_offset", "tokens added to such a decode's context: the fixed cost of the tile it is padded "
                                       "to", share=False)
    empty_tile_ns: float | None = _measured(
        "empty_tile_ns", "per query tile the varlen attention kernel launches for a decode beside a longer prefill "
                         "chunk and that exits at once (ceil(chunk / 128) - 1 per decode, head and layer), ns",
        share=False)
    attention_kernel: str | None = str_field(
        None, choices=ATTENTION_KERNELS, optional=True,
        help="the attention kernel decodes beside a prefill chunk (or verifying drafts) run in: "
             "'flash-attention-2' pads each query head of a decode to a tile of its own, 'flash-attention-3' "
             "packs a decode's query heads into one tile per KV head, 'flashinfer' runs the decodes in a decode "
             "kernel apart (unset: what vLLM runs on the GPU: FlashAttention 3 on compute capability 9.x, "
             "FlashInfer on 10.x, else FlashAttention 2)")
    layer_overhead_us: float | None = _measured(
        "layer_overhead_us", "per decoder layer: the GEMMs' fixed time and the small kernels not counted as bytes or "
                             "FLOPs (norms, rotary, activation), us", share=False)
    expert_layer_us: float | None = _measured(
        "expert_layer_us", "per MoE layer: the routed experts' fixed time (top-k routing, sorting the tokens by "
                           "expert, the kernels' launch), us", share=False)
    expert_us: float | None = _measured(
        "expert_us", "per MoE layer and expert read: a fixed time besides its weights' read (a narrow expert "
                     "does not reach the bandwidth), us; FP8 and 4-bit experts take the GPU's fp8_ and w4a16_ "
                     "values of every expert setting", share=False)
    expert_read_share: float | None = _measured(
        "expert_read_share", "the experts' weights are read at this share of bandwidth_efficiency (> 0)", share=False,
        positive=True)
    expert_gemm_share: float | None = _measured(
        "expert_gemm_share", "the fused MoE kernel's GEMMs reach this share of the dense GEMM efficiency at as many "
                             "rows per expert (> 0)", share=False, positive=True)
    decode_skew_alpha: float | None = _measured(
        "decode_skew_alpha", "uneven decode contexts: share of the gap to every decode at the longest context that "
                             "a decode-only step's attention takes", share=False)
    mixed_skew_alpha: float | None = _measured(
        "mixed_skew_alpha", "the same for decodes beside a prefill chunk in FlashAttention 2's varlen kernel",
        share=False)
    overhead_ms: float = float_field(
        0.0, min=0.0, help="time added to every step beyond the modelled parts, ms (what schedlab calibrate fits)")
    async_scheduling: bool = step_field("async_scheduling")
    cuda_graphs: bool = step_field("cuda_graphs")
    cuda_graph_max_tokens: int = step_field("cuda_graph_max_tokens")
    cuda_graph_prefill: bool = step_field("cuda_graph_prefill")
    host_step_us: float = step_field("host_step_us")
    host_per_seq_us: float = step_field("host_per_seq_us")
    tp_step_us: float = step_field("tp_step_us")
    eager_layer_us: float = step_field("eager_layer_us")
    async_gap_us: float = step_field("async_gap_us")
    interconnect: str | dict | None = interconnect_field()
    tp_all_reduce: str = tp_all_reduce_field()
    link_gbps: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                          help="bus bandwidth between the GPUs in GB/s (overrides the interconnect's)")
    link_latency_us: float | None = float_field(None, min=0.0, optional=True,
                                                help="fixed time of one collective in us (overrides NCCL's)")


class RooflineCostModel:
    """Iteration time from bytes moved and FLOPs done (see the module docstring).

    :ivar model: the model spec; :ivar gpu: the GPU spec; :ivar config: the settings.
    """

    needs_context_range = True  # uneven decode contexts slow attention down (the skew terms)

    def __init__(self, model: ModelSpec, gpu: GpuSpec, config: RooflineConfig | None = None, *,
                 parallelism: Parallelism = SINGLE):
        self.gpu = gpu
        self.parallelism = parallelism
        self.config = config if config is not None else RooflineConfig(model=model.name, gpu=gpu.name)
        # an FP8 cache: every KV read (decode attention, prefill over a cached context, swaps) halves
        self.model = model = with_kv_cache_dtype(model, self.config.kv_cache_dtype)
        #: every efficiency in effect: the config's, else the GPU's measured one, else the pooled default
        self.settings = c = resolve_efficiencies(self.config, gpu, model)
        tp = self.config.tensor_parallel
        # Rates per millisecond: GB/s * 1e9 / 1e3 and TFLOPS * 1e12 / 1e3.
        bw = gpu.hbm_bandwidth_gbps * 1e6
        self._weight_bytes_per_ms = bw * c.bandwidth_efficiency
        self._peak_flops_per_ms = gpu.bf16_tflops * 1e9
        # FP8 weights times FP8 activations run at the FP8 rate where the GPU has it (W8A8)
        factors = gemm_factors(model, gpu)
        self._dense_peak_per_ms = self._peak_flops_per_ms / factors[0]
        self._expert_peak_per_ms = self._peak_flops_per_ms / factors[1]
        self._host_bytes_per_ms = gpu.host_link_gbps * 1e6
        #: what an iteration reads and computes on each GPU (power models; :mod:`.work`)
        self._work = w = ModelWork(model, tp, factors, fp8_factor(gpu))  # raises ConfigError on a bad split
        self._kv_bytes_per_token = w.kv_bytes_per_token
        # what a decode reads per context token: its KV (DSA: its indexer's keys)
        self._kv_ms_per_token = w.decode_bytes_per_token / (bw * c.kv_read_efficiency)
        self._attention_flops_per_ms = self._peak_flops_per_ms * c.attention_efficiency
        #: a decode's attention per context token: its KV's read, or its FLOPs where they take
        #: longer -- latent attention decoded absorbed, many heads per GPU, at the MLA kernels'
        #: latent_decode_efficiency; other attention (GQA, MQA: FlashAttention, whose decodes
        #: pack a KV head's query heads together) at the attention kernels' attention_efficiency,
        #: not at the MLA kernels' rate (10% of the peak on A100: Falcon-7B's 71 query heads over
        #: one KV head were timed 4.2x their KV read)
        latent_flops_per_ms = self._peak_flops_per_ms * c.latent_decode_efficiency
        decode_flops_per_ms = latent_flops_per_ms if model.kv_latent_dim is not None \
            else self._attention_flops_per_ms
        self._decode_ms_per_token = max(self._kv_ms_per_token, w.decode_attention_flops_per_pair / decode_flops_per_ms)
        #: a decode's read of its window layers' KV: at most the window, taken as all of it
        #: (schedlab.kv_window; 0 without window layers), whatever the cache keeps of them; and
        #: DSA's sparse attention over its keys, every slot run (a context shorter than them
        #: masks the rest)
        self._window_ms = w.window_bytes_per_decode / (bw * c.kv_read_efficiency) \
            + max(w.sparse_bytes_per_decode / (bw * c.kv_read_efficiency),
                  w.sparse_flops_per_decode / latent_flops_per_ms)
        b = model.weight_bytes_per_param
        expert_total = model.expert_params * model.num_experts
        embedding = model.embedding_params  # an untied table: looked up, one row per token
        # The LM head (vocab x hidden, the tied table too) multiplies the sampled rows only.
        lm_head = model.lm_head_params
        # Dense weights: everything but the routed experts, the looked-up table and the LM head.
        self._dense_read_ms = (model.num_params - expert_total - embedding - lm_head) * b / tp \
            / self._weight_bytes_per_ms
        t = model.table_bytes_per_param  # (a quantised checkpoint keeps its tables in 16 bits)
        self._lm_read_ms = lm_head * t / tp / self._weight_bytes_per_ms
        self._lm_flops_per_row = 2.0 * lm_head / tp
        self._expert_read_ms = model.expert_params * model.expert_bytes_per_param / tp \
            / (self._weight_bytes_per_ms * c.expert_read_share)  # one expert
        # the MoE layers' fixed times (DeepSeek-V3's first 3 layers, Llama-4-Maverick's every other one
        # are dense: moe_layers)
        self._expert_fixed_ms = model.moe_layer_count * c.expert_layer_us * 1e-3
        self._expert_each_ms = model.moe_layer_count * c.expert_us * 1e-3  # per expert read, all MoE layers
        # a rank looks up the tokens of its vocabulary shard: 1/tp of the rows on average
        self._row_read_ms = (model.hidden_size or 0) * t / tp / self._weight_bytes_per_ms if embedding else 0.0
        self._dense_flops_per_token = w.dense_flops_per_token  # (the embedding and the LM head apart)
        self._expert_flops_per_token = w.expert_flops_per_token
        self._fixed_ms = model.num_layers * (c.layer_overhead_us + c.attention_layer_us) * 1e-3
        self._decode_ms = model.num_layers * c.decode_attention_us * 1e-3  # per decode, decode-only steps
        self.step = StepTiming(c, model.num_layers, tp)
        heads = model.num_attention_heads or 0
        # QK^T and attention-times-V: 2 * head_dim FLOPs each per (query, key) pair and head.
        self._attention_flops_per_pair = w.attention_flops_per_pair
        # (a padded decode's query rows over its context in the full-attention layers, over at
        # most the window in the window layers)
        self._mixed_rows_ms_per_token = c.mixed_decode_query_rows * w.full_flops_per_pair \
            / self._attention_flops_per_ms
        self._mixed_window_rows_ms_per_token = c.mixed_decode_query_rows * w.window_flops_per_pair \
            / self._attention_flops_per_ms
        self._window = w.window
        self._mixed_offset = c.mixed_decode_context_offset
        # per decode and empty query tile, all layers (see empty_tile_ns)
        self._empty_tile_ms = model.num_layers * heads / tp * c.empty_tile_ns * 1e-6
        # FlashAttention 3 packs a decode's query heads into its KV heads' tiles, FlashInfer runs
        # the decodes apart: either way no padding (ATTENTION_KERNELS). vLLM's MLA backends run
        # the decodes apart whatever the GPU (MLACommonImpl: a decode kernel, a prefill kernel).
        self._decodes_apart = c.attention_kernel != "flash-attention-2" or model.kv_latent_dim is not None
        self._decode_skew = c.decode_skew_alpha
        self._mixed_skew = c.mixed_skew_alpha
        communicates = tp > 1 or parallelism.lockstep or parallelism.pipelined
        topology = machine(c.interconnect, gpu, link_gbps=c.link_gbps, link_latency_us=c.link_latency_us) \
            if communicates else None
        self.comm = TensorParallelComm(model, Collectives(topology, tp), c.tp_all_reduce) if tp > 1 else None
        # Data and pipeline parallelism (schedlab.parallelism): the experts of a lockstep step,
        # the activations sent between stages.
        self.expert_layers = ExpertLayers(model, parallelism, tp, topology, self._expert_gpu_ms,
                                          graph_tokens=c.cuda_graph_max_tokens if c.cuda_graphs else 0) \
            if parallelism.lockstep and model.is_moe else None
        self.sends = PipelineSends(model, topology, parallelism.pipeline_parallel, tp) \
            if parallelism.pipelined else None
        self._tokens_memo: dict[int, float] = {}
        self._seq_memo: dict[int, float] = {}

    # --- CostModel protocol -------------------------------------------------------------------

    def iteration_ms(self, batch: Batch) -> float:
        """Duration of one iteration of shape ``batch`` in ms (0.0 for an empty batch)."""
        tokens = batch.num_decode + batch.spec_tokens + batch.prefill_tokens
        if tokens == 0:
            return 0.0
        return self.step.step_ms(self.gpu_ms(batch, tokens), tokens, batch.num_decode + batch.num_prefill,
                                 batch.num_prefill > 0)

    def kernel_ms(self, batch: Batch) -> float:
        """The GPU's time for the batch's kernels alone, without the host's share of a step (a
        drafter's passes run inside the target's step)."""
        tokens = batch.num_decode + batch.spec_tokens + batch.prefill_tokens
        return self.gpu_ms(batch, tokens) if tokens else 0.0

    def gpu_ms(self, batch: Batch, tokens: int) -> float:
        """The GPU's time for the kernels of a batch of ``tokens`` tokens (no host work)."""
        kv_read = batch.decode_context_tokens * self._decode_ms_per_token + batch.num_decode * self._window_ms
        # The sampled rows' logits are gathered from the vocabulary shards (tensor parallel).
        logits = self.logits_ms(batch.num_decode + batch.spec_tokens + batch.num_prefill)
        # Context tokens short of every decode at the longest one (0 for even contexts).
        excess = batch.num_decode * batch.decode_context_max - batch.decode_context_tokens \
            if batch.decode_context_max else 0
        # the decodes' attention in a decode-only step
        alone = kv_read + batch.num_decode * self._decode_ms + self._decode_skew * self._decode_ms_per_token * excess
        if not batch.prefill_tokens and not batch.spec_tokens:
            return self.tokens_ms(tokens) + alone + logits
        if self._decodes_apart:
            # FlashAttention 3 (the decodes' query heads share their KV heads' tiles) or
            # FlashInfer (a decode kernel of their own): as in a decode-only step, no empty tiles.
            decodes = alone
        else:
            # FlashAttention 2's varlen kernel pads each query head of a decode riding with a
            # prefill chunk (or verifying drafts) to a tile: query rows of compute, not a read --
            # never less than the decodes alone (a read-bound kernel dropped their per-decode time:
            # one prompt token added to a decode-only step made it cheaper).
            padded = self._mixed_rows_ms_per_token * (batch.decode_context_tokens
                                                      + batch.num_decode * self._mixed_offset)
            padded += self._mixed_skew * self._mixed_rows_ms_per_token * excess
            if self._mixed_window_rows_ms_per_token:
                # the window layers: each decode's context up to the window (sum min(ctx, W) taken as
                # min(sum, n W), exact when every context is under the window or every one past it),
                # and the longest context's excess, up to the window too
                seen = min(batch.decode_context_tokens, batch.num_decode * self._window)
                longest = batch.num_decode * min(batch.decode_context_max, self._window) - seen \
                    if batch.decode_context_max else 0
                padded += self._mixed_window_rows_ms_per_token * (
                    seen + batch.num_decode * self._mixed_offset + self._mixed_skew * longest)
            decodes = max(alone, padded)
        ms = self.tokens_ms(tokens) + decodes + logits
        if batch.prefill_tokens:
            ms += self.prefill_attention_ms(batch.prefill_tokens, batch.prefill_context_tokens, batch.num_prefill)
            if not self._decodes_apart:
                # The kernel's grid is sized by the longest query (taken as the mean chunk: a
                # Batch carries sums): every decode gets that many query tiles, all but one empty.
                chunk = batch.prefill_tokens / max(1, batch.num_prefill)
                ms += batch.num_decode * (math.ceil(chunk / QUERY_TILE) - 1) * self._empty_tile_ms
        return ms

    def decode_step_increment(self, batch: Batch) -> float | tuple[float, int] | None:
        """For a decode-only batch: each next step reads ``num_decode`` more KV tokens, so the
        GPU takes ``num_decode`` times a decode's attention per context token longer (its KV's
        read, ``kv_bytes_per_token / (BW * kv_read_efficiency)``, or its FLOPs if longer) --
        unless the host's work or the launches are the longer, then the step stays as it is
        for as many steps as the GPU's time stays below them (``(0.0, steps)``). ``None`` when
        prefill runs or drafts are verified."""
        if batch.prefill_tokens or batch.spec_tokens:
            return None
        return self._decode_increment(batch, self.gpu_ms(batch, batch.num_decode))

    def rank_step_increment(self, batch: Batch) -> float | tuple[float, int] | None:
        """:meth:`decode_step_increment` of a data-parallel rank's part (:meth:`rank_ms`): its
        kernels without the routed experts, which may leave it at the host's floor while the whole
        iteration is past it (the experts' part depends on the tokens alone)."""
        if batch.prefill_tokens or batch.spec_tokens:
            return None
        return self._decode_increment(batch, self.rank_kernel_ms(batch))

    def _decode_increment(self, batch: Batch, gpu: float) -> float | tuple[float, int]:
        n = batch.num_decode
        inc, steps = self.step.decode_increment(gpu, n * self._decode_ms_per_token, math.inf, n, n)
        return inc if steps == math.inf else (inc, steps)

    # --- parts ----------------------------------------------------------------------------------

    def gemm_efficiency(self, tokens: float) -> float:
        """Share of peak bf16 FLOPS a GEMM over ``tokens`` rows reaches."""
        c = self.settings
        return c.mfu * tokens / (tokens + c.gemm_half_tokens)

    def tokens_ms(self, tokens: int) -> float:
        """Everything that depends only on the iteration's token count: linear layers (weights
        and GEMMs), MoE experts, the embedding rows, all-reduce and the fixed overheads (not
        the LM head: :meth:`logits_ms`)."""
        ms = self._tokens_memo.get(tokens)
        if ms is not None:
            return ms
        peak = self._dense_peak_per_ms
        compute = self._dense_flops_per_token * tokens / (peak * self.gemm_efficiency(tokens))
        ms = self._fixed_ms + math.hypot(self._dense_read_ms, compute) + tokens * self._row_read_ms \
            + self._experts_ms(tokens)
        if self.comm is not None:
            ms += self.comm.tokens_ms(tokens)
        if len(self._tokens_memo) < 1 << 16:
            self._tokens_memo[tokens] = ms
        return ms

    def logits_ms(self, sequences: int) -> float:
        """The LM head over ``sequences`` sampled rows (a roofline of its own: the whole matrix
        read, the rows' FLOPs) and, at TP > 1, the all-gather of their logits."""
        ms = self._seq_memo.get(sequences)
        if ms is None:
            ms = 0.0
            if self._lm_read_ms and sequences > 0:
                compute = self._lm_flops_per_row * sequences / (self._peak_flops_per_ms * self.gemm_efficiency(sequences))
                ms = math.hypot(self._lm_read_ms, compute)
            if self.comm is not None:
                ms += self.comm.logits_ms(sequences)
            self._seq_memo[sequences] = ms
        return ms

    def _experts_ms(self, tokens: int) -> float:
        """The routed experts of an iteration of ``tokens`` tokens on this instance's GPUs (0
        for a dense model)."""
        m = self.model
        if not m.is_moe:
            return 0.0
        e, k = m.num_experts, m.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** tokens)  # distinct experts under uniform routing
        return self.expert_layers_ms(tokens, touched, self._expert_read_ms, self._expert_flops_per_token * tokens)

    def expert_layers_ms(self, tokens: float, experts: float, read_ms: float, flops: float) -> float:
        """Every MoE layer's routed experts on one GPU: ``experts`` experts read (``read_ms`` each,
        all layers; ``expert_us`` each besides), ``flops`` computed at the GEMM efficiency of the
        rows each expert gets from ``tokens`` tokens -- a smooth roofline, plus the fixed time."""
        rows = tokens * self.model.experts_per_token / max(experts, 1.0)
        compute = flops / (self._expert_peak_per_ms * self._expert_gemm_efficiency(rows))
        return self._expert_fixed_ms + math.hypot(experts * (read_ms + self._expert_each_ms), compute)

    def _expert_gemm_efficiency(self, rows: float) -> float:
        """Share of peak the fused MoE kernel's GEMMs reach at ``rows`` rows per expert."""
        return self.gemm_efficiency(rows) * self.settings.expert_gemm_share

    # --- data and pipeline parallelism (schedlab.parallelism) -----------------------------------

    def rank_ms(self, batch: Batch) -> float:
        """One data-parallel rank's part of a lockstep step: the iteration without its routed
        experts, which :meth:`experts_ms` times across the ranks (the host's share of the step
        taken over what is left)."""
        tokens = batch.num_decode + batch.spec_tokens + batch.prefill_tokens
        if tokens == 0:
            return 0.0
        return self.step.step_ms(self.rank_kernel_ms(batch), tokens, batch.num_decode + batch.num_prefill,
                                 batch.num_prefill > 0)

    def rank_kernel_ms(self, batch: Batch) -> float:
        """The GPU's kernels of :meth:`rank_ms` alone, without the host's share (power models:
        what the kernels of a rank's step are besides the experts)."""
        tokens = batch.num_decode + batch.spec_tokens + batch.prefill_tokens
        if tokens == 0:
            return 0.0
        return self.gpu_ms(batch, tokens) - self._experts_ms(tokens)

    def experts_ms(self, tokens) -> float | None:
        """The routed experts of a lockstep step whose data-parallel ranks run ``tokens``
        tokens each (:mod:`.expert_parallel`); None for a dense model, whose ranks do not
        wait for each other."""
        if self.expert_layers is None:
            return None
        return self.expert_layers.step_ms(tokens)

    def _expert_gpu_ms(self, tokens: float, experts: float) -> float:
        """Every layer's experts on one GPU of a data-parallel deployment: ``experts`` whole
        experts read, the pairs of ``tokens`` tokens computed (a smooth roofline, as above)."""
        if tokens <= 0.0:
            return 0.0
        m = self.model
        read = m.expert_params * m.expert_bytes_per_param \
            / (self._weight_bytes_per_ms * self.settings.expert_read_share)
        return self.expert_layers_ms(tokens, experts, read, 2.0 * m.experts_per_token * m.expert_params * tokens)

    def pipeline_ms(self, batch: Batch) -> tuple[tuple[float, ...], float]:
        """Pipeline parallelism (:mod:`.pipeline`): each stage's time for ``batch`` -- its
        layers' share of the iteration, the CPU overhead before the first, the logits' gather
        after the last -- and the activations' send from one stage to the next."""
        sequences = batch.num_decode + batch.spec_tokens + batch.num_prefill
        tokens = batch.num_decode + batch.spec_tokens + batch.prefill_tokens
        total = self.iteration_ms(batch)
        host = max(0.0, total - self.gpu_ms(batch, tokens)) if tokens else 0.0  # the host's share, before stage 1
        logits = self.logits_ms(sequences)  # the LM head (and at TP > 1 its gather): on the last stage
        stages = split_stages(total, host, logits, self.sends.layers)
        return stages, self.sends.send_ms(batch.num_batched_tokens)

    def prefill_attention_ms(self, prefill_tokens: int, prefill_context_tokens: int = 0, num_prefill: int = 1) -> float:
        """Attention compute of the prefill part of an iteration (only when the model declares
        ``num_attention_heads``): ``2 * layers * heads * (qk_head_dim + head_dim)`` FLOPs per
        (query, key) pair, each query's pairs capped at DSA's keys and its indexer's added
        (:meth:`.work.ModelWork.prefill_attention_flops`: its pairs, chunks taken as equal), at
        ``attention_efficiency`` of the bf16 peak."""
        return self._work.prefill_attention_flops(prefill_tokens, prefill_context_tokens, num_prefill) \
            / self._attention_flops_per_ms

    def swap_ms(self, num_tokens: int) -> float:
        """Time to copy ``num_tokens`` tokens of KV between GPU and CPU over the host link
        (each rank copies its own share in parallel)."""
        return num_tokens * self._kv_bytes_per_token / self._host_bytes_per_ms

    def request_cost(self, prompt_tokens, output_tokens):
        """``(prefill_ms, decode_ms)`` a request would cost running alone (numbers or numpy arrays).

        Prefill computes the whole prompt in one iteration and yields the first token; the
        other ``output_tokens - 1`` tokens take one batch-size-1 decode step each, step ``j``
        attending to ``prompt + j`` tokens. No prefix-cache reuse is assumed. Each step is
        timed as :meth:`iteration_ms` times it (host work and launches included).
        """
        prompt = np.asarray(prompt_tokens, dtype=float)
        steps = np.maximum(np.asarray(output_tokens, dtype=float) - 1.0, 0.0)
        chunk = np.maximum(prompt, 1).astype(np.int64)
        linear = np.vectorize(self.tokens_ms, otypes=[float])(chunk)
        gpu = linear + self.prefill_attention_ms(prompt) + self.logits_ms(1)
        prefill = np.vectorize(lambda g, t: self.step.step_ms(g, int(t), 1, True), otypes=[float])(gpu, chunk)
        # Step j (1..steps) has GPU time base + k (prompt + j); the step is max(that + shift,
        # floor) + add. The first `flat` steps sit on the floor; the others form an arithmetic series.
        k = self._decode_ms_per_token
        base = self.tokens_ms(1) + self.logits_ms(1) + self._decode_ms + self._window_ms
        shift, floor, add = self.step.shape(1, 1)
        if k > 0.0:
            flat = np.clip(np.floor((floor - shift - base) / k - prompt), 0.0, steps)
        else:
            flat = np.where(base + shift <= floor, steps, 0.0)
        rest = steps - flat
        # sum over j = flat+1 .. steps of (base + shift + add + k (prompt + j))
        series = rest * (base + shift + add + k * prompt) + k * (steps * (steps + 1.0) - flat * (flat + 1.0)) / 2.0
        decode = flat * (floor + add) + series
        if np.ndim(prefill) == 0:
            return float(prefill), float(decode)
        return prefill, decode


    # --- energy view (schedlab.energy): what the iteration moves and computes -------------------

    def work(self, batch: Batch) -> tuple[float, float]:
        """``(bytes, flops)`` one rank reads from its memory and computes in an iteration of
        ``batch``, the quantities this model times but the LM head's FLOPs (power models divide
        them by the peak rates and the iteration's duration to get the memory and compute
        utilisations; :mod:`.work` says why the LM head's are left out):

        * bytes: the weights this iteration reads (dense ones, and the experts some token
          picked), the KV the decodes attend over and the cached context a prefill chunk's
          attention reaches back over;
        * flops: the linear layers' ``2 x active params`` per token (experts included) and
          attention's ``4 x layers x heads x head_dim`` per (query, key) pair -- a decode's
          one query over its context, a prefill chunk's causal pairs.

        (:class:`~.work.ModelWork`.)
        """
        return self._work.work(batch)

    def rank_work(self, batch: Batch) -> tuple[float, float]:
        """:meth:`work` without the routed experts: a data-parallel rank's own part of a
        lockstep step, the work of :meth:`rank_ms`."""
        return self._work.rank_work(batch)

    def experts_work(self, tokens) -> tuple[float, float]:
        """``(bytes, flops)`` of a lockstep step's routed experts on each GPU when the
        data-parallel ranks run ``tokens[r]`` tokens each: the mean GPU's share of the experts
        :meth:`experts_ms` times, padded rows included (see :mod:`.work` and
        :meth:`.expert_parallel.ExpertLayers.padded`)."""
        check_rank_tokens(tokens, self.parallelism.data_parallel)
        layers = self.expert_layers
        return self._work.experts_work(layers.padded(tokens) if layers is not None else tokens)

    def busiest_experts_work(self, tokens) -> tuple[float, float]:
        """``(bytes, flops)`` of a lockstep step's routed experts on the busiest GPU, the one
        :meth:`experts_ms` waits for (the clock stretches the experts on it): :meth:`experts_work`
        scaled by ``expert_balancedness`` (:meth:`.expert_parallel.ExpertLayers.busiest_work`)."""
        return busiest_experts_work(self, tokens)

    def stage_work(self, batch: Batch) -> tuple[tuple[float, float], ...]:
        """``(bytes, flops)`` one GPU of each pipeline stage reads and computes in an iteration of
        ``batch``: its layers' share of :meth:`work`, the LM head on the last (see :mod:`.work`)."""
        return self._work.stage_work(batch, stage_split(self.sends).layers)


def expert_kernel(model: ModelSpec | None, gpu: GpuSpec) -> str:
    """Which measured MoE kernel times ``model``'s routed experts on ``gpu`` (:data:`EXPERT_KERNELS`):
    ``"bf16"`` (16-bit weights; a dense model too), ``"fp8"`` (FP8 weights times FP8 activations),
    ``"w4a16"`` (4-bit weights, 16-bit activations: MXFP4, INT4), else ``"other"`` (FP8 weights on
    a GPU without FP8 tensor cores, and any other format: the 16-bit settings, pooled)."""
    if model is None or not model.is_moe or model.expert_bytes_per_param >= 2.0:
        return "bf16"
    if model.expert_bytes_per_param <= W4_BYTES_PER_PARAM:
        return "w4a16"
    return "fp8" if gemm_factors(model, gpu)[1] != 1.0 else "other"


def resolve_efficiencies(config: RooflineConfig, gpu: GpuSpec, model: ModelSpec | None = None) -> RooflineConfig:
    """``config`` with every unset efficiency filled: the GPU's measured value
    (``GpuSpec.efficiency``), else the pooled :data:`DERIVATION`; and the attention kernel
    vLLM runs on the GPU when unset (:func:`default_attention_kernel`). The expert settings are
    those of the kernel ``model``'s experts run in (:func:`expert_kernel`): the GPU table's keys of
    that kind's prefix, else :data:`EXPERTS_POOLED`'s; experts of no measured kind take the
    pooled 16-bit ones.

    :raises ConfigError: the GPU's table names a setting the roofline does not have.
    """
    prefixed = {prefix + name: EXPERTS_POOLED[kind][name]
                for kind, prefix in EXPERT_KERNELS.items() if prefix for name in EXPERT_SETTINGS}
    known = {**DERIVATION, "latent_decode_efficiency": default_latent_decode_efficiency(gpu), **prefixed}
    unknown = sorted(set(gpu.efficiency) - set(known))
    if unknown:
        raise ConfigError(f"GPU {gpu.name!r}: efficiency has unknown key {unknown[0]!r}; "
                          f"valid keys: {', '.join(sorted(known))}")
    kernel = expert_kernel(model, gpu)
    prefix = EXPERT_KERNELS.get(kernel)
    filled = {}
    for name in (*DERIVATION, "latent_decode_efficiency"):
        if getattr(config, name) is not None:
            continue
        if name not in EXPERT_SETTINGS:
            filled[name] = float(gpu.efficiency.get(name, known[name]))
        elif prefix is None:  # a kind not measured per GPU: the pooled 16-bit settings
            filled[name] = float(DERIVATION[name])
        else:
            filled[name] = float(gpu.efficiency.get(prefix + name, known[prefix + name]))
    if config.attention_kernel is None:
        filled["attention_kernel"] = default_attention_kernel(gpu)
    try:
        return attrs.evolve(config, **filled)
    except FieldError as exc:
        raise ConfigError(f"GPU {gpu.name!r}: efficiency: {exc.name}: {exc.message}") from None


def build_roofline(config: RooflineConfig, presets: Presets, parallelism: Parallelism = SINGLE) -> RooflineCostModel:
    """Factory: resolve the config's model and GPU names through ``presets``.

    :raises ConfigError: the model's weights alone exceed the GPU's memory at this split
        (:func:`schedlab.capacity.check_weights_fit`: a run that could not load)."""
    model = presets.model(config.model)
    check_expert_parallel(config, model)
    gpu = presets.gpu(config.gpu)
    check_weights_fit(model, gpu, config.tensor_parallel, parallelism)
    return RooflineCostModel(model, gpu, config, parallelism=parallelism)
