"""What an iteration reads and computes on one GPU: the roofline's bytes and FLOPs, for power models.

Power models turn an iteration's work into utilisations (``plugins/power/utilisation.py``:
``bytes / (peak bandwidth x duration)``, ``flops / (peak FLOPS x duration)``). The roofline
times these quantities (and the LM head's FLOPs, left out here: below); the profiled model
times measured kernels and says its work from the same counts, which depend on the model and
its split over GPUs only (no GPU rates).

Per GPU of an instance of ``tp`` tensor-parallel ranks, in an iteration of ``T`` tokens:

* bytes: every weight but the routed experts and the looked-up embedding table, ``/ tp``; the
  routed experts some token picked, ``E (1 - (1 - k/E)^T)`` of the ``E`` under uniform top-``k``
  routing, ``/ tp``; the KV the decodes attend over and the cached context a prefill chunk's
  attention reaches back over;
* flops: ``2 x active params / tp`` per token (the routed experts' ``2 x k x expert params``
  among them) and attention's ``2 x layers x heads x (qk_head_dim + head_dim) / tp`` per (query,
  key) pair -- ``4 x layers x heads x head_dim / tp`` with equal heads, a sliding-window (or chunked)
  layer's queries each over at most its window's keys; a latent-attention decode,
  absorbed as vLLM runs it, multiplies its query by the ``kv_latent_dim`` latent and its weights
  by the latent less the RoPE part: ``2 x layers x heads x (2 latent - rope) / tp``.
  The LM head's ``2 x vocab x hidden / tp`` FLOPs per sampled row are *not* counted (its read
  is), though the roofline times them (``logits_ms``): the shipped power fits were derived
  without them. Counting them and re-deriving (``tools/derive_roofline.py power``) was measured:
  ``compute`` 2.77 -> 2.59, ``awake`` 0.136 -> 0.135 (the utilisation model's 0.185 -> 0.183), no
  held-out figure moved by more than 0.4 points -- and the A6000 TP-2 gap after pulse 2 from
  -4.7% to -5.04%, past the 5% asked; so the work stays as fitted.
  They are counted at the rate of the GPU's bf16 peak, which power models divide by: where the
  GPU multiplies a W8A8 FP8 checkpoint's GEMMs at its FP8 rate (:func:`gemm_factors`), each of
  their FLOPs counts ``bf16_tflops / fp8_tflops`` (about half), as the roofline times them.

Both are said in phases, as the kernels run one after another (a
:class:`~schedlab.energy.work.Work`): the dense GEMMs with the LM head's read, the routed
experts, and attention (the KV it reads, its FLOPs), each bound by its own resource.

**Data-parallel ranks stepping together** (:mod:`.expert_parallel`) split this in two. A rank's
own part (:meth:`ModelWork.rank_work`) is the iteration without the routed experts; the
experts of a step (:meth:`ModelWork.experts_work`) are computed on the ``D x tp`` GPUs for the
tokens of all ``D`` ranks, so each GPU's share is ``1 / (D x tp)`` of their reads and FLOPs
whether whole experts are spread over the GPUs (``expert_parallel``) or every expert is sharded
over them. This is the mean GPU: a step's *time* waits for the busiest one
(``ExpertLayers.busiest_gpu``), but energy sums over all of them, and their mean work is
exact under uniform routing whatever the balance. At one rank the two parts add up to
:meth:`ModelWork.work`. The clock stretches the experts' time on the busiest GPU's work, which
the cost models scale from the mean's (``busiest_experts_work``,
:meth:`.expert_parallel.ExpertLayers.busiest_work`).

**Pipeline stages** (:meth:`ModelWork.stage_work`). A stage's GPUs hold a run of decoder layers
(vLLM's split, :func:`schedlab.parallelism.stage_layers`) and compute every token of the batch
through them, so a stage's work is its layers' share of the iteration's -- weights, the routed
experts its tokens pick in those layers, their KV and their attention, all alike per layer --
and the last stage reads the LM head's weights besides. The embedding's looked-up rows are not
counted in the work (as on one GPU), so the first stage holds nothing apart. The stages' work
adds up to :meth:`ModelWork.work`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from schedlab.capacity import ModelSpec
from schedlab.energy.work import Work, phases_of
from schedlab.protocols import Batch


def gemm_factors(model: ModelSpec, gpu) -> tuple[float, float]:
    """``(dense, experts)``: what a FLOP of the dense and of the routed experts' GEMMs counts at the
    bf16 peak's rate on ``gpu`` (a :class:`~schedlab.capacity.GpuSpec`, or None: 1). FP8 weights
    that meet FP8 activations (``model.fp8_activations``) multiply at ``fp8_tflops`` where the GPU
    has FP8 tensor cores: ``bf16_tflops / fp8_tflops``; every other GEMM: 1. A checkpoint that
    keeps some of its dense projections in 16 bits (``model.fp8_weight_share`` of the dense weights
    in FP8) counts ``share x ratio + (1 - share)``: its FP8 GEMMs at the FP8 rate, the kept ones at
    the bf16 rate (not all of them at the bf16 rate once one module is kept)."""
    if gpu is None or not (model.fp8_activations and gpu.fp8_tflops):
        return 1.0, 1.0
    ratio = gpu.bf16_tflops / gpu.fp8_tflops
    share = model.fp8_weight_share
    if share is None:
        share = 1.0 if model.weight_bytes_per_param == 1.0 else 0.0
    return (share * ratio + (1.0 - share),
            ratio if model.expert_bytes_per_param == 1.0 else 1.0)


def fp8_factor(gpu) -> float:
    """What an FP8 FLOP counts at the bf16 peak's rate on ``gpu`` (None: 1): ``bf16_tflops /
    fp8_tflops`` where it has FP8 tensor cores (DSA's indexer scores in FP8), else 1."""
    return gpu.bf16_tflops / gpu.fp8_tflops if gpu is not None and gpu.fp8_tflops else 1.0


def capped_pairs(tokens: float, cached: float, cap: float) -> float:
    """(query, key) pairs of a chunk of ``tokens`` queries after ``cached`` tokens when each query
    attends to at most ``cap`` keys: ``sum over j = 1..tokens of min(cached + j, cap)`` -- the
    causal pairs less the last ``t`` queries' excess over the cap (numbers or numpy arrays)."""
    over = np.clip(cached + tokens - cap, 0.0, tokens)  # the queries past the cap: the last ones
    excess = over * (cached - cap) + (tokens * (tokens + 1) - (tokens - over) * (tokens - over + 1)) / 2
    return tokens * cached + tokens * (tokens + 1) / 2 - excess


class ModelWork:
    """The bytes and FLOPs of an iteration on one GPU of ``model`` split over ``tensor_parallel``
    ranks (see the module docstring); ``factors``: :func:`gemm_factors` of the GPU; ``fp8``:
    :func:`fp8_factor` of it."""

    def __init__(self, model: ModelSpec, tensor_parallel: int = 1, factors: tuple[float, float] = (1.0, 1.0),
                 fp8: float = 1.0):
        m = self.model = model
        tp = self.tp = tensor_parallel
        lm_head = m.lm_head_params
        self.kv_bytes_per_token = m.kv_bytes_per_token(tp)  # raises ConfigError on a bad split
        #: KV bytes a decode reads from its window layers: their window's, a constant taken whole
        #: (a context shorter than the window reads less); 0 without window layers
        window = m.sliding_window_layers if m.kv_layers < m.num_layers else 0
        self.window_bytes_per_decode = (self.kv_bytes_per_token // m.kv_layers * window * m.window_tokens(tp)
                                        if window else 0)
        #: bytes of the LM head (the tied table too), read in full by the last pipeline stage
        self.lm_head_bytes = lm_head * m.table_bytes_per_param / tp
        #: bytes of every weight but the routed experts and the looked-up embedding table
        self.dense_bytes = (m.num_params - m.expert_params * m.num_experts - m.embedding_params) \
            * m.weight_bytes_per_param / tp + lm_head * (m.table_bytes_per_param - m.weight_bytes_per_param) / tp
        self.dense_flops_per_token = 2.0 * (m.params_per_token - m.experts_per_token * m.expert_params
                                            - m.embedding_params - lm_head) / tp
        self.expert_flops_per_token = 2.0 * m.experts_per_token * m.expert_params / tp
        #: the same, counted at the bf16 peak's rate (what :meth:`work` sums)
        self.factors = factors
        self._dense_counted = self.dense_flops_per_token * factors[0]
        self._expert_counted = self.expert_flops_per_token * factors[1]
        heads = 2.0 * m.num_layers * (m.num_attention_heads or 0) / tp
        #: a prefill's QK^T and attention-times-V per (query, key) pair
        self.attention_flops_per_pair = heads * ((m.qk_head_dim or m.head_dim) + m.head_dim)
        #: the layers whose queries each attend to at most ``window`` keys (sliding-window and
        #: chunked layers, and the constant-state layers hf_config maps onto them): their share of
        #: those FLOPs; 0 without window layers
        self.window = m.sliding_window or 0
        window_layers = m.sliding_window_layers if self.window else 0
        self.window_flops_per_pair = self.attention_flops_per_pair * window_layers / m.num_layers
        #: and the full-attention layers' share
        self.full_flops_per_pair = self.attention_flops_per_pair - self.window_flops_per_pair
        #: a decode's: latent attention absorbed (vLLM's MLA decode: ``q W_UK`` against the latent
        #: and its RoPE key, the weights against the latent) -- about 3.4x a prefill's in DeepSeek-V3
        self.latent_flops_per_pair = heads * (2 * m.kv_latent_dim - m.kv_rope_dim) \
            if m.kv_latent_dim is not None else self.attention_flops_per_pair
        #: sparse latent attention (DSA): each query attends to ``sparse_keys`` latents (vLLM's sparse
        #: MLA kernels run absorbed, prefill too, over every one of those slots), and its indexer
        #: reads every context token's key and scores it with ``index_heads`` heads in FP8 (on
        #: every rank: its weights are not split) -- so a decode's latent attention is a constant,
        #: and what grows with its context is the indexer
        self.sparse_keys = m.sparse_attention_keys or 0
        #: dense latent attention's prefill is not absorbed: vLLM first expands every cached
        #: context token's latent into its keys and values (``kv_b_proj``, in each chunk that
        #: reaches back over them: ``MLACommonImpl._compute_prefill_context``)
        self.context_expand_flops_per_token = heads * (m.kv_latent_dim - m.kv_rope_dim) * (
            (m.qk_head_dim or m.head_dim) - m.kv_rope_dim + m.head_dim) \
            if m.kv_latent_dim is not None and not self.sparse_keys else 0.0
        if self.sparse_keys:
            index_bytes = m.kv_layers * m.kv_index_bytes
            self.index_flops_per_key = 2.0 * m.kv_layers * m.index_heads * m.index_head_dim * fp8
            #: KV bytes a decode reads per context token
            self.decode_bytes_per_token = index_bytes
            #: and what it reads and computes whatever its context (sparse attention's keys)
            self.sparse_bytes_per_decode = self.sparse_keys * (self.kv_bytes_per_token - index_bytes)
            self.sparse_flops_per_decode = self.sparse_keys * self.latent_flops_per_pair
            self.decode_attention_flops_per_pair = self.index_flops_per_key
        else:
            self.index_flops_per_key = 0.0
            self.decode_bytes_per_token = self.kv_bytes_per_token
            self.sparse_bytes_per_decode = self.sparse_flops_per_decode = 0.0
            self.decode_attention_flops_per_pair = self.latent_flops_per_pair

    def prefill_attention_flops(self, prefill_tokens: float, prefill_context_tokens: float = 0,
                                num_prefill: int = 1) -> float:
        """Attention FLOPs of the prefill part of an iteration: a chunk of ``c`` tokens after ``p``
        cached ones has ``c * p + c * (c + 1) / 2`` causal pairs. A :class:`Batch` only carries
        sums, so the chunks are taken to be of equal length (exact for one prefill; for several
        it undercounts the ``c**2`` part, by Cauchy-Schwarz). Sliding-window (and chunked) layers
        cap each query's pairs at their window (:func:`capped_pairs`; a chunked layer's query sees
        at most its chunk). Latent attention adds the cached tokens' expansion into keys and
        values; sparse attention caps each query's pairs at ``sparse_keys``, absorbed, and adds
        the indexer over every causal pair."""
        n = max(1, num_prefill)
        c, p = prefill_tokens / n, prefill_context_tokens / n
        pairs = n * (c * p + c * (c + 1) / 2)
        if not self.sparse_keys:
            flops = self.full_flops_per_pair * pairs + self.context_expand_flops_per_token * prefill_context_tokens
            if self.window_flops_per_pair:
                flops += self.window_flops_per_pair * n * capped_pairs(c, p, self.window)
            return flops
        return self.latent_flops_per_pair * n * capped_pairs(c, p, self.sparse_keys) \
            + self.index_flops_per_key * pairs

    def work(self, batch: Batch) -> tuple[float, float]:
        """``(bytes, flops)`` one GPU reads and computes in an iteration of ``batch``, its routed
        experts included: a :class:`~schedlab.energy.work.Work` whose phases are the dense
        GEMMs (with the LM head's read), the routed experts and attention."""
        m = self.model
        tokens = batch.num_batched_tokens
        if tokens == 0:
            return 0.0, 0.0
        experts = 0.0
        if m.is_moe:
            e, k = m.num_experts, m.experts_per_token
            experts = e * (1.0 - (1.0 - k / e) ** tokens) * m.expert_params * m.expert_bytes_per_param / self.tp
        kv, attention = self._kv_bytes(batch), self._with_attention(0.0, batch)
        flops = self._with_attention((self._dense_counted + self._expert_counted) * tokens, batch)
        return Work(((self.dense_bytes, self._dense_counted * tokens), (experts, self._expert_counted * tokens),
                     (kv, attention)), (self.dense_bytes + experts + kv, flops))

    def rank_work(self, batch: Batch) -> tuple[float, float]:
        """:meth:`work` without the routed experts: one data-parallel rank's own part of a step
        (attention, the dense layers and the LM head on its own batch), in those two phases."""
        tokens = batch.num_batched_tokens
        if tokens == 0:
            return 0.0, 0.0
        kv, attention = self._kv_bytes(batch), self._with_attention(0.0, batch)
        flops = self._with_attention(self._dense_counted * tokens, batch)
        return Work(((self.dense_bytes, self._dense_counted * tokens), (kv, attention)),
                    (self.dense_bytes + kv, flops))

    def experts_work(self, tokens: Sequence[int]) -> tuple[float, float]:
        """``(bytes, flops)`` of a step's routed experts on each of the ``len(tokens) x tp`` GPUs
        when the data-parallel ranks run ``tokens[r]`` tokens each: the experts all their tokens
        pick, and ``k`` experts' FLOPs a token, spread evenly over the GPUs. ``(0, 0)`` for a
        dense model."""
        m = self.model
        if not tokens:
            raise ValueError("the experts of a step need the tokens of at least one rank")
        if not m.is_moe:
            return 0.0, 0.0
        total = sum(tokens)
        gpus = len(tokens) * self.tp
        e, k = m.num_experts, m.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** total)
        return touched * m.expert_params * m.expert_bytes_per_param / gpus, \
            2.0 * k * m.expert_params / gpus * total * self.factors[1]

    def stage_work(self, batch: Batch, layers: Sequence[int]) -> tuple[tuple[float, float], ...]:
        """``(bytes, flops)`` one GPU of each pipeline stage reads and computes in an iteration of
        ``batch`` when stage ``s`` holds ``layers[s]`` decoder layers: each layer's equal share of
        :meth:`work` (the LM head's weights apart), and the LM head's weights on the last stage."""
        if not layers or any(count < 1 for count in layers):
            raise ValueError(f"every pipeline stage needs at least one layer, got {tuple(layers)}")
        work = self.work(batch)
        byt, flops = work
        if byt == 0.0 and flops == 0.0:
            return ((0.0, 0.0),) * len(layers)
        n = sum(layers)
        per_bytes, per_flops = (byt - self.lm_head_bytes) / n, flops / n
        (dense_b, dense_f), *rest = phases_of(work)
        per_phase = [((dense_b - self.lm_head_bytes) / n, dense_f / n)] + [(b / n, f / n) for b, f in rest]
        stages = []
        for i, count in enumerate(layers):
            parts = [(count * b, count * f) for b, f in per_phase]
            total = (count * per_bytes, count * per_flops)
            if i == len(layers) - 1:  # the LM head's weights: the last stage's dense phase
                parts[0] = (parts[0][0] + self.lm_head_bytes, parts[0][1])
                total = (total[0] + self.lm_head_bytes, total[1])
            stages.append(Work(parts, total))
        return tuple(stages)

    def _kv_bytes(self, batch: Batch) -> float:
        return (batch.decode_context_tokens * self.decode_bytes_per_token
                + batch.prefill_context_tokens * self.kv_bytes_per_token
                + batch.num_decode * (self.window_bytes_per_decode + self.sparse_bytes_per_decode))

    def _with_attention(self, flops: float, batch: Batch) -> float:
        """``flops`` and the batch's attention: a prefill chunk's causal pairs (chunks taken as
        equal: a :class:`Batch` carries sums), each decode's one query over its context (its
        sparse attention's keys with DSA)."""
        if batch.prefill_tokens:
            flops += self.prefill_attention_flops(batch.prefill_tokens, batch.prefill_context_tokens,
                                                  batch.num_prefill)
        return flops + self.decode_attention_flops_per_pair * batch.decode_context_tokens \
            + batch.num_decode * self.sparse_flops_per_decode


def check_rank_tokens(tokens: Sequence[int], ranks: int) -> None:
    """:raises ValueError: ``tokens`` does not hold one count per data-parallel rank."""
    if len(tokens) != ranks:
        raise ValueError(f"expected the tokens of {ranks} data-parallel ranks, got {len(tokens)}")
