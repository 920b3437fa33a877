"""The ``profiled`` cost model: iteration times composed from measured per-operator profiles.

It reads a profile bundle (:mod:`.profile_bundle`; LLMServingSim's layout, measured inside
vLLM) and composes an iteration from the :class:`~schedlab.protocols.Batch` as LLMServingSim's
trace generator does (``serving/core/trace_generator.py``; differences below)::

    iteration_ms = layers x ( dense ops at T tokens              (qkv, o, gate_up, down, norms, ...)
                            + attention(prefill chunk, its KV, decodes, their mean KV)
                              [+ alpha x (attention at the longest decode KV - at the mean)]
                            + MoE experts at T tokens            (MoE models)
                            + 2 all-reduces of T x hidden        (tensor parallel > 1) )
                 + once-per-iteration dense ops at T             (embedding, final norm)
                 + lm_head + sampler at S sequences
                 [+ the embedding's all-reduce at T and the logits' all-gather at S   (TP > 1)]
    iteration_ms = the step around it (:mod:`.step_overhead`: the host's work, hidden by
                   asynchronous scheduling unless it is the longer; kernel launches without
                   CUDA graphs; the gap between steps) + overhead_ms

with ``T`` = tokens computed this iteration (decodes + prefill chunk tokens) and ``S`` = the
sequences in it. Several prefill chunks are looked up as one chunk of their summed tokens
over their summed cached context, as LLMServingSim does. The skew term (FlashAttention's
varlen kernel is slower on uneven contexts than on even ones of the same mean) uses the
bundle's fitted alphas when it has them.

Communication is not in the profiles: each ``tp<N>/`` folder times one rank's share of
the work on one GPU. The all-reduces and the all-gather are NCCL's collectives over the
machine's links (:mod:`.tensor_parallel`, :mod:`.collectives`; ``interconnect`` names the
machine, by default the GPU preset's usual one). MoE experts are read from the TP-1 table
``moe.csv``, the only one the profiler writes, with LLMServingSim's balanced routing: ``E = min(T x top_k, experts)``
experts on ``T`` tokens. With ``expert_parallel`` each of the ``tp`` ranks holds ``experts /
tp`` whole experts and sees the tokens routed to at least one of them (LLMServingSim's
expert-parallel view). Without it, LLMServingSim reads the TP-1 time unchanged ("increasing
TP doesn't change the per-rank expert kernel", its bundle docs), but vLLM's fused-MoE layer
then splits every expert's intermediate dimension over the ranks, so a rank reads ``1 / tp``
of each activated expert's weights and does ``1 / tp`` of each token's expert FLOPs, with the
same tokens per expert and thread blocks: the work of a TP-1 kernel on ``T / tp`` tokens
routed to ``E / tp`` experts. So the time is read from the table there -- the measured cost of
half the work, which on the RTX PRO 6000 Qwen3-30B-A3B profile is 51-52% of the full work's
at 16-2048 tokens, not 50%: launches, routing and the top-k sum do not shrink with the shard
(as they do not for the large sharded dense GEMMs of these bundles, gate_up and down, which
take 48-58% of their TP-1 time at TP 2). Where ``T /
tp`` or ``E / tp`` falls below the table (a single token at TP 2), the expert block is a
weight read and its time is that of the first shape the table covers, scaled by the experts
read. The rule is not fitted to any measurement of MoE at TP 2 (the shared data has none).

Differences from LLMServingSim (its own lookups on the shipped bundles; within the profile
most iterations agree within 1%):

* MoE at TP > 1 (above): the experts' intermediate dimension split by TP gives about half
  LLMServingSim's expert time at TP 2 (Qwen3-30B-A3B: 20.4 against 39.5 ms at 32 decodes; the
  iteration 28-45% shorter), not fitted to a measurement;
* TP collectives: two all-reduces per layer, the embedding's all-reduce and the logits'
  all-gather, as vLLM (:mod:`.tensor_parallel`); LLMServingSim has one per layer for a MoE model
  and none for the embedding or the logits (Qwen3-30B-A3B at TP 2 over ``pcie-gen5-host``:
  +0.43 ms at 1 token, +22 ms at 2,048);
* past the profile (2,048 tokens on the shipped bundles) each table goes on along the chord of
  its top half, and a longer chunk's attention is its profiled-size pieces over the growing
  context (:meth:`~.profile_bundle.AttentionTable.at_contexts`); LLMServingSim extrapolates its
  last two points, which can go down (a 4,096-token prefill on Qwen3-32B: 762.7 ms here, 144.1
  there). A batch past the profiled tokens or
  sequences is warned of once (:class:`~.profile_bundle.ProfileRangeWarning`);
* non-decreasing smoothing pools the 1-token point (often measured slower than 2 tokens): a lone
  request's decode step is 2-3% short (Qwen3-32B: 43.57 against 44.81 ms);
* attention is put on one grid (:class:`~.profile_bundle.AttentionTable`): decode-only within
  0.7%, prefill-only -0.6 to -1.4% on average (worst -11.6% on a cell filled from neighbouring
  chunks), a small chunk with few decodes raised to their decode-only time, and no clamping of
  a slice below its own axis (where LLMServingSim read 335 us against neighbours of 68-167).

A bundle the composition would misread is refused (:class:`~.profile_bundle.ProfileBundle`: an
operator of ``meta.yaml``'s architecture missing, a hybrid or unknown architecture, a one-point
table, attention without prefill or decode shots, the legacy v0 layout); a bundle that names
no model, or hardware of another GPU than ``gpu``, is warned of.

Speculative decoding's verify pass (``spec_tokens`` draft tokens beside the decodes' own):
the drafts are more tokens for the dense ops and more rows for ``lm_head`` and the sampler
(logits at every draft position), and they enter the attention lookup as a prefill chunk of
that many tokens, so the decodes are timed as the profiles measured decodes riding in the
varlen kernel with a chunk (padded query tiles). The profiles hold no verify passes; this is
the nearest measured shape.

The profiles hold the GPU's kernel times (measured in eager mode, one kernel at a time); the
engine's CPU work per step -- scheduling, input preparation, output processing, launching
kernels where no CUDA graph replays them -- is :mod:`.step_overhead`'s, shared with the
roofline. ``overhead_ms`` adds a fixed time to every step on top (what ``schedlab calibrate``
can fit).

Speed: every table is built once at load; token-count results are memoised. Decode-only
iterations are piecewise linear in the step (the contexts grow by one token a step and the
tables are linear between grid points), so :meth:`ProfiledCostModel.decode_step_increment`
gives the engine the slope and how many steps it holds.
"""

from __future__ import annotations

import math
import re
import warnings
from bisect import bisect_right

import attrs

from schedlab.capacity import ModelSpec, Presets, check_weights_fit
from schedlab.configs import MAX_TENSOR_PARALLEL, bool_field, float_field, int_field, path_field, str_field
from schedlab.errors import ConfigError
from schedlab.parallelism import SINGLE, Parallelism
from schedlab.protocols import Batch

from .collectives import Collectives, Topology, interconnect_field, machine
from .profile_bundle import BundleError, BundleWarning, ProfileBundle, ProfileRangeWarning
from .expert_parallel import ExpertLayers, busiest_experts_work, check_expert_parallel
from .pipeline import PipelineSends, split_stages, stage_split
from .step_overhead import StepTiming, step_field
from .tensor_parallel import TensorParallelComm
from .vllm_all_reduce import tp_all_reduce_field
from .work import ModelWork, check_rank_tokens, fp8_factor, gemm_factors


@attrs.frozen
class ProfiledConfig:
    """Settings of the ``profiled`` cost model."""

    profile: str = path_field(help="profile bundle folder <hardware>/<model>/<variant> (meta.yaml, tp<N>/*.csv)")
    model: str = str_field(help="model preset: layers, hidden size and experts (the bundle profiles one layer)")
    gpu: str | None = str_field(None, optional=True,
                                help="GPU preset: its usual machine's links time the tensor-parallel collectives "
                                     "(unless interconnect is set)")
    interconnect: str | dict | None = interconnect_field()
    tp_all_reduce: str = tp_all_reduce_field()
    tensor_parallel: int = int_field(1, min=1, max=MAX_TENSOR_PARALLEL,
                                     help="tensor-parallel ranks; reads the bundle's tp<N>/ folder")
    expert_parallel: bool = bool_field(False, help="MoE: experts spread over the tensor-parallel ranks (vLLM "
                                                   "--enable-expert-parallel) instead of split by tensor parallelism")
    overhead_ms: float = float_field(0.0, min=0.0, help="time added to every step beyond the profiles and the "
                                                          "host's modelled work, ms (what schedlab calibrate fits)")
    async_scheduling: bool = step_field("async_scheduling")
    cuda_graphs: bool = step_field("cuda_graphs")
    cuda_graph_max_tokens: int = step_field("cuda_graph_max_tokens")
    cuda_graph_prefill: bool = step_field("cuda_graph_prefill")
    host_step_us: float = step_field("host_step_us")
    host_per_seq_us: float = step_field("host_per_seq_us")
    tp_step_us: float = step_field("tp_step_us")
    eager_layer_us: float = step_field("eager_layer_us")
    async_gap_us: float = step_field("async_gap_us")
    skew: bool = bool_field(True, help="apply the bundle's uneven-context correction to decode attention")
    link_gbps: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                          help="bus bandwidth between the GPUs in GB/s (overrides the interconnect's)")
    link_latency_us: float | None = float_field(None, min=0.0, optional=True,
                                                help="fixed time of one collective in us (overrides NCCL's)")


class ProfiledCostModel:
    """Iteration time from a profile bundle (see the module docstring)."""

    needs_context_range = True  # the skew correction needs the longest and shortest decode context

    def __init__(self, bundle: ProfileBundle, model: ModelSpec, config: ProfiledConfig, *,
                 topology: Topology | None = None, parallelism: Parallelism = SINGLE, gpu=None):
        self.bundle = bundle
        self._gpu = gpu  # the config's GPU preset (or None), for the work counts' FP8 GEMMs
        self.parallelism = parallelism
        self.model = model
        self.config = config
        self.layers = model.num_layers
        tp = config.tensor_parallel
        check_bundle_model(bundle, model)
        check_bundle_hardware(bundle, gpu)
        if bundle.is_moe and not model.is_moe:
            raise ConfigError(f"{bundle.root}: the bundle has moe.csv but model {model.name!r} declares no experts")
        if model.is_moe and not bundle.is_moe:
            raise ConfigError(f"{bundle.root / 'tp1' / 'moe.csv'}: missing file (model {model.name!r} is MoE)")
        if tp > 1 and topology is None:
            raise ConfigError(f"{bundle.root}: tensor_parallel = {tp} needs the machine's links (a topology)")
        self.comm = TensorParallelComm(model, Collectives(topology, tp), config.tp_all_reduce) if tp > 1 else None
        # Data and pipeline parallelism (schedlab.parallelism): the experts of a lockstep step
        # (whole experts from the TP-1 table), the activations sent between stages.
        if (parallelism.lockstep or parallelism.pipelined) and topology is None:
            raise ConfigError(f"{bundle.root}: data or pipeline parallelism needs the machine's links (a topology)")
        self.expert_layers = ExpertLayers(model, parallelism, tp, topology, self._expert_gpu_ms,
                                          graph_tokens=config.cuda_graph_max_tokens if config.cuda_graphs else 0) \
            if parallelism.lockstep and model.is_moe else None
        self.sends = PipelineSends(model, topology, parallelism.pipeline_parallel, tp) \
            if parallelism.pipelined else None
        self.step = StepTiming(config, model.num_layers, tp)
        self._attention = bundle.attention
        self._per_sequence = bundle.per_sequence
        self._skew = bundle.skew if config.skew else None
        self._tokens_memo: dict[int, float] = {}
        self._decode_rows: dict = {}
        self._decode_fixed: dict[int, float] = {}  # decode-only batch of n: all but attention
        self._seq_memo: dict[int, float] = {}
        self._last: tuple | None = None
        self._last_gpu: tuple = (None, 0.0)  # the last decode-only batch timed and its GPU time
        self._moe_anchor = self._first_tp_moe_shape() if model.is_moe else None
        self._work: ModelWork | None = None  # the work counts, for power models (see rank_work)
        self._said: set[str] = set()  # what past the profile this model has warned of

    # --- parts ----------------------------------------------------------------------------------

    def moe_ms(self, tokens: float) -> float:
        """One MoE layer's expert time on one rank at ``tokens`` tokens (balanced routing; see
        the module docstring for tensor parallelism)."""
        m = self.model
        tp = self.config.tensor_parallel
        experts, k = m.num_experts, m.experts_per_token
        table = self.bundle.moe
        if self.config.expert_parallel and tp > 1:
            local_experts = max(1, experts // tp)
            active = min(round(tokens * k / tp), local_experts)
            local_tokens = round(tokens * (1.0 - ((tp - 1) / tp) ** k))
            return table(local_tokens, active)
        active = min(round(tokens * k), experts)
        if tp == 1:
            return table(tokens, active)
        anchor = self._moe_anchor
        if anchor is None or (tokens / tp >= table.min_tokens and active / tp >= table.min_experts):
            return table(tokens / tp, active / tp)  # the same work as 1/tp of the tokens on 1/tp of the experts
        # Below the table (a few decode tokens): a weight read, in proportion to the experts read.
        anchor_tokens, anchor_experts = anchor
        return table(anchor_tokens / tp, anchor_experts / tp) * active / anchor_experts

    def _first_tp_moe_shape(self) -> tuple[int, int] | None:
        """The fewest tokens (and their experts) whose 1/tp share the TP-1 MoE table covers
        (None at TP 1, with expert parallelism, or when a rank's experts are fewer than its rows)."""
        m, tp, table = self.model, self.config.tensor_parallel, self.bundle.moe
        if table is None or tp == 1 or self.config.expert_parallel or m.num_experts / tp < table.min_experts:
            return None
        tokens = max(math.ceil(tp * table.min_tokens), math.ceil(tp * table.min_experts / m.experts_per_token))
        return tokens, min(tokens * m.experts_per_token, m.num_experts)

    def tokens_ms(self, tokens: int) -> float:
        """Everything that depends only on the tokens in the iteration."""
        ms = self._tokens_memo.get(tokens)
        if ms is None:
            b = self.bundle
            per_layer = b.dense_layer(tokens)
            if b.is_moe:
                per_layer += self.moe_ms(tokens)
            ms = self.layers * per_layer + b.dense_once(tokens)
            if self.comm is not None:
                ms += self.comm.tokens_ms(tokens)
            self._tokens_memo[tokens] = ms
            if tokens > b.profiled_tokens[0]:
                self._beyond_profile("tokens")
        return ms

    def _beyond_profile(self, what: str) -> None:
        """Warn, once per cost model and ``what``, that a batch goes past the profiled range."""
        if what not in self._said:
            self._said.add(what)
            warnings.warn(self.bundle.beyond_profile(what), ProfileRangeWarning, stacklevel=4)

    def _expert_gpu_ms(self, tokens: float, experts: float) -> float:
        """Every layer's experts on one GPU of a data-parallel deployment: the TP-1 table at
        the pairs it computes (in tokens) and the experts it reads; below the table's fewest
        experts, a weight read in proportion to the experts read (as at TP > 1)."""
        table = self.bundle.moe
        if experts < table.min_experts:
            return self.layers * table(max(tokens, table.min_tokens), table.min_experts) * experts / table.min_experts
        return self.layers * table(tokens, experts)

    def sequences_ms(self, sequences: int) -> float:
        """lm_head and sampler at ``sequences`` rows (and, at TP > 1, the logits' all-gather)."""
        ms = self._seq_memo.get(sequences)
        if ms is None:
            ms = self._per_sequence(sequences)
            if self.comm is not None:
                ms += self.comm.logits_ms(sequences)
            self._seq_memo[sequences] = ms
            if sequences > self.bundle.profiled_sequences[0]:
                self._beyond_profile("sequences")
        return ms

    def _skew_alpha(self, batch: Batch, mean: float) -> float:
        """The alpha for this batch's uneven decode contexts (0: no correction applies)."""
        n, hi, lo = batch.num_decode, batch.decode_context_max, batch.decode_context_min
        if self._skew is None or n <= 1 or hi <= mean:
            return 0.0
        rate = (mean - lo) / (hi - lo) if hi > lo else 0.5
        return self._skew(batch.prefill_tokens + batch.spec_tokens, n, rate, hi, batch.prefill_context_tokens)

    def attention_ms(self, batch: Batch) -> float:
        """One layer's attention, with the uneven-context correction (draft tokens as a chunk)."""
        n = batch.num_decode
        chunk = batch.prefill_tokens + batch.spec_tokens
        if not chunk:
            return self._decode_attention(batch, n, batch.decode_context_tokens / n)
        mean = batch.decode_context_tokens / n if n else 0.0
        alpha = self._skew_alpha(batch, mean)
        t, t_max = self._attention.at_contexts(chunk, batch.prefill_context_tokens, n, mean,
                                               batch.decode_context_max if alpha else mean)
        if t_max > t:
            t += alpha * (t_max - t)
        return t

    def _decode_attention(self, batch: Batch, n: int, mean: float) -> float:
        """Attention of a decode-only batch, from the memoised row of its decode count. What it
        looked up is kept for :meth:`decode_step_increment`, which asks about the same batch.
        (Hot path: the row's pieces and the skew lookup are read inline, see ``Table1D``.)"""
        row = self._decode_rows.get(n)
        if row is None:
            row = self._decode_rows[n] = self._attention.decode_row(n)
        xs, ys, slopes, last_piece = row.xs, row.ys, row.slopes, row.n - 2
        piece = bisect_right(xs, mean) - 1
        if piece > last_piece:
            piece = last_piece
        t = ys[0] if piece < 0 else ys[piece] + (mean - xs[piece]) * slopes[piece]
        hi = batch.decode_context_max
        skew = self._skew
        if skew is not None and n > 1 and hi > mean:
            lo = batch.decode_context_min
            alpha = skew.decode(n, (mean - lo) / (hi - lo), hi)
            hi_piece = bisect_right(xs, hi) - 1
            if hi_piece > last_piece:
                hi_piece = last_piece
            gap = (ys[0] if hi_piece < 0 else ys[hi_piece] + (hi - xs[hi_piece]) * slopes[hi_piece]) - t
            if alpha and gap > 0.0:
                t += alpha * gap
            skewed = True
        else:
            alpha, hi_piece, gap, skewed = 0.0, piece, 0.0, False
        self._last = (batch, row, piece, hi_piece, alpha, gap, skewed)
        return t

    # --- CostModel protocol -------------------------------------------------------------------

    def iteration_ms(self, batch: Batch) -> float:
        n = batch.num_decode
        if not batch.prefill_tokens and not batch.spec_tokens:  # decode only: n tokens, n sequences
            if not n:
                return 0.0
            return self.step.step_ms(self._decode_gpu_ms(batch, n), n, n)
        tokens = n + batch.spec_tokens + batch.prefill_tokens
        return self.step.step_ms(self._mixed_gpu_ms(batch, n, tokens), tokens, n + batch.num_prefill,
                                 batch.num_prefill > 0)

    def kernel_ms(self, batch: Batch) -> float:
        """The GPU's time for the batch's kernels alone, without the host's share of a step (a
        drafter's passes run inside the target's step)."""
        n = batch.num_decode
        if not batch.prefill_tokens and not batch.spec_tokens:
            return self._decode_gpu_ms(batch, n) if n else 0.0
        return self._mixed_gpu_ms(batch, n, n + batch.spec_tokens + batch.prefill_tokens)

    # --- data and pipeline parallelism (schedlab.parallelism) -----------------------------------

    def rank_ms(self, batch: Batch) -> float:
        """One data-parallel rank's part of a lockstep step: the iteration without its MoE
        layers' experts, which :meth:`experts_ms` times across the ranks."""
        tokens = batch.num_batched_tokens
        if tokens == 0:
            return 0.0
        return self.step.step_ms(self.rank_kernel_ms(batch), tokens, batch.num_decode + batch.num_prefill,
                                 batch.num_prefill > 0)

    def rank_kernel_ms(self, batch: Batch) -> float:
        """The GPU's kernels of :meth:`rank_ms` alone, without the host's share (power models:
        what the kernels of a rank's step are besides the experts)."""
        tokens = batch.num_batched_tokens
        if tokens == 0:
            return 0.0
        gpu = self.kernel_ms(batch)
        if self.bundle.is_moe:
            gpu -= self.layers * self.moe_ms(tokens)
        return gpu

    def rank_work(self, batch: Batch) -> tuple[float, float]:
        """``(bytes, flops)`` one GPU reads and computes in a data-parallel rank's own part of a
        lockstep step (the routed experts apart). The profiles hold times, not work: these are
        the roofline's counts of the same model and split (:class:`~.work.ModelWork`), as the
        utilisation power model takes them for this cost model outside data parallelism."""
        return self._model_work().rank_work(batch)

    def experts_work(self, tokens) -> tuple[float, float]:
        """``(bytes, flops)`` of a lockstep step's routed experts on each GPU when the
        data-parallel ranks run ``tokens[r]`` tokens each, padded rows included (the roofline's
        counts, see :meth:`rank_work` and :mod:`.work`; :meth:`.expert_parallel.ExpertLayers.padded`)."""
        check_rank_tokens(tokens, self.parallelism.data_parallel)
        layers = self.expert_layers
        return self._model_work().experts_work(layers.padded(tokens) if layers is not None else tokens)

    def busiest_experts_work(self, tokens) -> tuple[float, float]:
        """``(bytes, flops)`` of a lockstep step's routed experts on the busiest GPU, the one
        :meth:`experts_ms` waits for (:meth:`experts_work` scaled by ``expert_balancedness``, as
        the roofline's, :meth:`.expert_parallel.ExpertLayers.busiest_work`)."""
        return busiest_experts_work(self, tokens)

    def stage_work(self, batch: Batch) -> tuple[tuple[float, float], ...]:
        """``(bytes, flops)`` one GPU of each pipeline stage reads and computes in an iteration of
        ``batch`` (the roofline's counts split by the stages' layers, see :meth:`rank_work` and
        :mod:`.work`)."""
        return self._model_work().stage_work(batch, stage_split(self.sends).layers)

    def _model_work(self) -> ModelWork:
        """The model's work counts, made when first asked (only power models ask)."""
        if self._work is None:
            self._work = ModelWork(self.model, self.config.tensor_parallel, gemm_factors(self.model, self._gpu),
                                   fp8_factor(self._gpu))
        return self._work

    def experts_ms(self, tokens) -> float | None:
        """The routed experts of a lockstep step whose data-parallel ranks run ``tokens``
        tokens each (:mod:`.expert_parallel`); None for a dense model."""
        if self.expert_layers is None:
            return None
        return self.expert_layers.step_ms(tokens)

    def pipeline_ms(self, batch: Batch) -> tuple[tuple[float, ...], float]:
        """Pipeline parallelism (:mod:`.pipeline`): each stage's time for ``batch`` -- its
        layers' share; the embedding, final norm and the host's share of the step on the first stage; lm_head,
        the sampler and the logits' gather on the last -- and the activations' send between
        stages."""
        tokens = batch.num_batched_tokens
        sequences = batch.num_decode + batch.spec_tokens + batch.num_prefill
        total = self.iteration_ms(batch)
        first = self.bundle.dense_once(tokens) + max(0.0, total - self.kernel_ms(batch))  # and the host's share
        if self.comm is not None:
            first += self.comm.once_ms(tokens)
        stages = split_stages(total, first, self.sequences_ms(sequences), self.sends.layers)
        return stages, self.sends.send_ms(tokens)

    def _decode_gpu_ms(self, batch: Batch, n: int) -> float:
        fixed = self._decode_fixed.get(n)
        if fixed is None:
            fixed = self._decode_fixed[n] = self.tokens_ms(n) + self.sequences_ms(n)
        gpu = fixed + self.layers * self._decode_attention(batch, n, batch.decode_context_tokens / n)
        self._last_gpu = (batch, gpu)
        return gpu

    def _mixed_gpu_ms(self, batch: Batch, n: int, tokens: int) -> float:
        ms = self._tokens_memo.get(tokens)
        if ms is None:
            ms = self.tokens_ms(tokens)
        sequences = n + batch.spec_tokens + batch.num_prefill  # lm_head and sampler rows
        seq_ms = self._seq_memo.get(sequences)
        if seq_ms is None:
            seq_ms = self.sequences_ms(sequences)
        return ms + seq_ms + self.layers * self.attention_ms(batch)

    def decode_step_increment(self, batch: Batch) -> tuple[float, int] | None:
        """For a decode-only batch: the per-step growth of attention time and how many steps
        it holds (until the mean or longest context crosses a grid point, the longest crosses
        a skew bucket, or the skew term changes sign)."""
        piece = self._decode_piece(batch)
        if piece is None:
            return None
        inc, steps = piece
        return self.step.decode_increment(self._last_gpu[1], inc, steps, batch.num_decode, batch.num_decode)

    def rank_step_increment(self, batch: Batch) -> tuple[float, int] | None:
        """:meth:`decode_step_increment` of a data-parallel rank's part (:meth:`rank_ms`): its
        kernels without the MoE layers' experts, which may leave it at the host's floor while the
        whole iteration is past it (the experts' part depends on the tokens alone)."""
        piece = self._decode_piece(batch)
        if piece is None:
            return None
        inc, steps = piece
        n = batch.num_decode
        gpu = self._last_gpu[1] - (self.layers * self.moe_ms(n) if self.bundle.is_moe else 0.0)
        return self.step.decode_increment(gpu, inc, steps, n, n)

    def _decode_piece(self, batch: Batch) -> tuple[float, int] | None:
        """The kernels' growth a step over a decode run and how many steps it holds (None: not a
        decode-only batch); times ``batch`` first, so that ``_last_gpu`` is its GPU time."""
        n = batch.num_decode
        if batch.prefill_tokens or batch.spec_tokens or not n:
            return None
        mean = batch.decode_context_tokens / n
        if self._last_gpu[0] is not batch:
            self.iteration_ms(batch)
        last = self._last
        _, row, piece, hi_piece, alpha, gap, skewed = last
        xs, slopes, last_piece = row.xs, row.slopes, row.n - 2
        if piece < 0:  # below the grid: constant up to its first point
            inc, end = 0.0, xs[0] - mean
        else:
            inc = slopes[piece]
            end = xs[piece + 1] - mean if piece < last_piece else math.inf
        if skewed:  # the alpha may change where the longest context enters the next bucket
            hi = batch.decode_context_max
            end = min(end, self._skew.kv_big_edge(hi) - hi)
        if alpha:
            if hi_piece < 0:
                slope_hi, end_hi = 0.0, xs[0] - hi
            else:
                slope_hi = slopes[hi_piece]
                end_hi = xs[hi_piece + 1] - hi if hi_piece < last_piece else math.inf
            gap_slope = slope_hi - inc
            end = min(end, end_hi)
            if gap > 0.0:
                inc += alpha * gap_slope
                if gap_slope < 0.0:  # the correction reaches 0 within this piece
                    end = min(end, math.ceil(gap / -gap_slope) - 1)
            elif gap_slope > 0.0:  # no correction yet; it starts when the gap turns positive
                end = min(end, math.floor(-gap / gap_slope))
        steps = math.floor(end) + 1 if end < math.inf else 1 << 62
        return self.layers * inc, steps if steps > 1 else 1


def build_profiled(config: ProfiledConfig, presets: Presets, parallelism: Parallelism = SINGLE) -> ProfiledCostModel:
    """Factory: load the bundle at the configured tensor-parallel degree, resolve the presets.

    :raises ConfigError: with a ``gpu``, the model's weights alone exceed its memory at this split
        (:func:`schedlab.capacity.check_weights_fit`)."""
    model = presets.model(config.model)
    check_expert_parallel(config, model)
    topology = None
    gpu = presets.gpu(config.gpu) if config.gpu is not None else None
    if gpu is not None:
        check_weights_fit(model, gpu, config.tensor_parallel, parallelism)
    if config.tensor_parallel > 1 or parallelism.lockstep or parallelism.pipelined:
        if config.tensor_parallel == 1 and config.gpu is None and config.interconnect is None:
            raise ConfigError("profiled cost model: data or pipeline parallelism needs the machine's links: set "
                              "gpu = <preset> (its usual machine) or interconnect = <machine>")
        topology = machine(config.interconnect, gpu, link_gbps=config.link_gbps,
                           link_latency_us=config.link_latency_us, where="profiled cost model")
    bundle = ProfileBundle(config.profile, config.tensor_parallel)
    return ProfiledCostModel(bundle, model, config, topology=topology, parallelism=parallelism, gpu=gpu)


def _same_model(profiled: str, declared: str) -> bool:
    """Whether a profiled model id and a declared one name the same weights' shapes: equal
    ignoring case, or one a variant of the other (``Qwen/Qwen3-30B-A3B`` and
    ``Qwen/Qwen3-30B-A3B-Instruct-2507``: fine-tunes keep the shapes)."""
    a, b = profiled.strip().lower(), declared.strip().lower()
    if "/" not in b:  # a preset-style name: compare with the repository part
        a = a.rsplit("/", 1)[-1]
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith(short + "-")


def check_bundle_model(bundle: ProfileBundle, model: ModelSpec) -> None:
    """A bundle profiles one model: refuse to time another with it (its layers, widths and
    experts would be wrong while the run still looks plausible).

    :raises BundleError: ``meta.yaml``'s ``model`` is not ``model``'s ``hf_id`` (or, when the
        model declares none, its name).
    """
    profiled = bundle.meta.get("model")
    if not isinstance(profiled, str) or not profiled.strip():  # a bundle that does not say cannot be checked
        warnings.warn(f"{bundle.root / 'meta.yaml'}: names no model (no 'model' key), so the bundle is not checked "
                      f"against the cost model's model {model.name!r}: any model is accepted", BundleWarning,
                      stacklevel=3)
        return
    declared = model.hf_id or model.name
    if _same_model(profiled, declared):
        _check_bundle_variant(bundle, model, profiled, declared)
        return
    hint = (f"use the model this bundle profiles, or a bundle of {model.hf_id!r}" if model.hf_id else
            f"if {model.name!r} is that model, declare hf_id = {profiled!r} in its [models.{model.name}] table")
    raise BundleError(f"{bundle.root / 'meta.yaml'}: the bundle profiles {profiled!r}, but the cost model's "
                      f"model is {model.name!r} ({model.hf_id or 'no hf_id'}); {hint}")


#: bundle variants (``meta.yaml: variant``) whose kernels multiply 16-bit weights
SIXTEEN_BIT_VARIANTS = frozenset({"bf16", "bfloat16", "fp16", "float16", "half"})
#: a quantised checkpoint's id names its format: ``Qwen/Qwen3-32B-AWQ``, ``...-FP8``, ``...-GPTQ-Int4``
QUANTISED_ID = re.compile(r"(?:^|[-_./])(awq|gptq|fp8|fp4|nvfp4|mxfp4|int4|int8|w4a16|w8a8|w8a16|bnb|4bit|8bit)"
                          r"(?=$|[-_./])", re.IGNORECASE)


def _check_bundle_variant(bundle: ProfileBundle, model: ModelSpec, profiled: str, declared: str) -> None:
    """Warn when a bundle of 16-bit kernels (``meta.yaml: variant: bf16``) times a quantised
    variant of its model -- weights (or routed experts) not at 2 bytes, or an id naming a
    quantisation the profiled one does not (``Qwen/Qwen3-32B-AWQ`` against ``Qwen/Qwen3-32B``):
    the id check accepts it as the same shapes, but the times are the 16-bit kernels'."""
    variant = bundle.meta.get("variant")
    if not isinstance(variant, str) or variant.strip().lower() not in SIXTEEN_BIT_VARIANTS:
        return
    named = QUANTISED_ID.search(declared) if not QUANTISED_ID.search(profiled) else None
    sizes = {model.weight_bytes_per_param, model.expert_bytes_per_param if model.is_moe else 2.0}
    if named is None and sizes == {2.0}:
        return
    why = (f"its id names a quantisation ({named.group(1)})" if named is not None else
           f"its weights are {model.weight_bytes_per_param:g} bytes each"
           + (f", its routed experts' {model.expert_bytes_per_param:g}" if model.is_moe else ""))
    warnings.warn(f"{bundle.root / 'meta.yaml'}: the bundle's variant is {variant} (16-bit kernels), but the cost "
                  f"model's model {model.name!r} ({declared}) is quantised -- {why}: its steps are timed as the "
                  f"16-bit model's; use a bundle profiled with that checkpoint, or the roofline cost model",
                  BundleWarning, stacklevel=4)


#: GPU families a bundle's hardware and a GPU preset are told apart by: a name (lowercase,
#: letters and digits only) matching a pattern is of that family; the first match wins. A
#: name matching none is not compared (a custom preset, hardware not listed here).
GPU_FAMILIES = (
    ("GH200", r"gh200"), ("H200", r"h200"), ("H100", r"h100"), ("A100", r"a100"), ("B200", r"b200"),
    ("RTX PRO 6000", r"rtxpro6000|pro6000"), ("RTX A6000", r"rtxa6000|^(nvidia)?a6000$"),
    ("RTX 4090", r"4090"), ("RTX 3090", r"3090"), ("L40S", r"l40s"), ("A40", r"^(nvidia)?a40$"),
    ("A10G", r"a10g"), ("L4", r"^(nvidia)?l4$"), ("TPU", r"tpu"),
)


def gpu_family(name) -> str | None:
    """The :data:`GPU_FAMILIES` family a GPU name is of (None: not known)."""
    if not isinstance(name, str):
        return None
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return next((family for family, pattern in GPU_FAMILIES if re.search(pattern, key)), None)


def check_bundle_hardware(bundle: ProfileBundle, gpu) -> None:
    """Warn when the bundle's ``meta.yaml`` names hardware of another GPU family than the
    cost model's ``gpu`` preset: the kernel times are the profiled GPU's, while the preset's
    machine times the collectives (and the power models read its datasheet). Only names both
    known to :data:`GPU_FAMILIES` are compared."""
    if gpu is None:
        return
    named = [bundle.meta.get(key) for key in ("hardware", "gpu") if isinstance(bundle.meta.get(key), str)]
    profiled = next((family for family in map(gpu_family, named) if family), None)
    preset = gpu_family(gpu.name)
    if profiled is None or preset is None or profiled == preset:
        return
    warnings.warn(f"{bundle.root / 'meta.yaml'}: the bundle was profiled on {' / '.join(dict.fromkeys(named))} "
                  f"({profiled}), but the cost model's gpu is {gpu.name!r} ({preset}): the kernel times are the "
                  f"{profiled}'s, the collectives are timed over the {gpu.name} machine's links; use a bundle "
                  f"profiled on this GPU, or the {profiled}'s preset", BundleWarning, stacklevel=3)
