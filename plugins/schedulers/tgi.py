"""Hugging Face text-generation-inference's router (engines.md §5).

Follows TGI v3.3.7 (commit dfb3fbe78e0d1d69251bd33065591c61bafdfaa8): ``backends/v3/src/backend.rs``
(``batching_task``), ``backends/v3/src/queue.rs`` (``State::next_batch``),
``backends/v3/src/block_allocator.rs`` and, for chunk sizes, ``server/.../flash_causal_lm.py``
(``generate_token``). One call of :meth:`TgiScheduler.schedule` is one forward pass.

Admission (``next_batch``): waiting requests in arrival order, each given KV blocks for
``prompt + max_tokens - 1`` tokens at once (``max_tokens`` of the segment: see below; the block
allocator's pool is the KV cache,
``max_batch_total_tokens = num_blocks x block_size`` as TGI infers it for flash-attention models,
minus block 0, which TGI keeps for health checks), while the prompt tokens not found in the
prefix cache fit ``max_batch_prefill_tokens`` (rounded up to a whole number of blocks) and the
batch is under ``max_batch_size``. The first request that does not fit ends the batch. Nothing
is ever preempted: every request holds its maximum from admission to finish. While a batch runs,
no new batch is taken when its requests' block tables -- a shared prefix's blocks counted once per
request -- add up to the whole pool (``token_budget`` = ``max_batch_total_tokens`` minus the
batch's ``max_tokens``, 0: ``next_batch`` returns nothing), which only prefix hits make possible.

``prefill_chunking = false`` (TGI's path for models or attention backends without chunked
prefill -- ``ATTENTION=paged``, ``PREFILL_CHUNKING=0``, speculation; the default before v3.0):

* with nothing running, the first batch is admitted and prefilled;
* while a batch runs, each loop first tries a new batch, which must hold at least
  ``floor(running x waiting_served_ratio)`` requests (computed in f32, as in Rust) -- unless
  ``waiting_tokens >= max_waiting_tokens``, where ``waiting_tokens`` is 1 after a prefill plus
  one per decode pass since, and then any new batch will do -- and at most
  ``max_batch_size - running``;
* a new batch is prefilled in a forward pass of its own (the running requests produce nothing),
  then the next pass decodes everyone, old and new, before the next try.

``prefill_chunking = true`` (TGI's default since v3.0 on flashinfer / flashdecoding attention):
``waiting_served_ratio``, ``max_waiting_tokens`` and, after the first batch, ``max_batch_size``
are ignored; the new batch's prompts fill ``max_batch_prefill_tokens`` minus the tokens the
running batch computes next (one per decode plus its pending chunks), the last request cut to fill
it exactly; they are prefilled in the same pass as the running batch's decodes and chunks, then
the next pass decodes (and continues chunks) before the next try. After each pass a request still
prefilling gets its next chunk, newest first, from ``max_batch_prefill_tokens - (batch size - 1)``
(at least one token), as TGI's server picks it.

Validation (``router/src/validation.rs``): a request whose prompt + ``max_new_tokens`` exceeds
``max_total_tokens``, or whose prompt exceeds ``max_input_tokens``, is refused with TGI's message;
where the launcher is not told them, the warmup sets them (``FlashCausalLM.warmup``): with
chunking ``max_total_tokens`` is the smaller of the KV pool and the model's context, without it
the warmup batch, ``max_batch_prefill_tokens``; ``max_input_tokens`` one less. Limits TGI refuses to
start with are config errors, or, where they depend on the KV pool (``max_batch_prefill_tokens`` or
``max_total_tokens`` over its tokens), :meth:`TgiScheduler.start_up_problem`'s (the run is simulated
and notes it; a plan counts the deployment infeasible). A request over the allocator's blocks is
refused too (TGI's launcher makes that impossible by bounding ``max_total_tokens``).

Answer segments (since v3.1.1, ``router/src/infer/mod.rs``): the router asks the backend for at
most ``DEFAULT_GENERATION_LENGTH`` = 1,024 new tokens at a time (``generation_segment``): the
block allocator reserves ``input + min(max_new_tokens, 1024) - 1``, and a request that has them and
is not done goes back to the *end* of the queue, its blocks freed, to be prefilled again with its
answer (:meth:`Plan.requeue`, counted as ``requeues``). The prefix cache then holds at most the
segment's *input* -- TGI's radix allocator keeps an allocation's input tokens, never what it
generated -- so every continuation computes at least the answer of the segment that just ended. Each
continuation is validated like a new request -- prompt + answer so far within
``max_input_tokens``, and with 1,024 more within ``max_total_tokens`` -- and the answer ends where
one is refused: ``limit_request`` cuts ``max_tokens`` to the segments that pass. Here a request
comes back in the pass after its segment's last token (TGI appends it from the router's stream, a
few milliseconds later, so it may miss that pass's try). Not modelled: TGI 3.3.7 asks every
continuation for 1,024 tokens, so an answer cut by ``max_new_tokens`` rather than EOS can run past it
to the next multiple of 1,024; here ``max_tokens`` holds.

Concurrency: the router holds at most ``max_concurrent_requests`` (128) requests from
validation to the end of the response; one more is refused at once, "Model is overloaded" (the
engines do it: ``max_in_flight``, :mod:`schedlab.engine.admission`).

Launcher defaults (:mod:`.tgi_launcher`, applied to a run that names its GPU and model): the
prefill budget from the GPUs' FLOPS and the model's FLOPs per token, chunked prefill and prefix
caching on (flashinfer attention), the model's context, and TGI's default ``max_new_tokens``
(``default_max_tokens = "max_total_tokens"``, below). On every TGI run the KV cache defaults to
flashinfer's 1-token blocks (:attr:`TgiConfig.kv_cache_defaults`) and the cost model to CUDA graphs
for decode-only passes of at most 32 (:meth:`TgiConfig.cost_model_defaults`).

Default ``max_new_tokens`` (``router/src/validation.rs`` ``validate_input``): a request without one
gets ``max_total_tokens - input`` ('Use the maximum possible number of tokens as default'), its
first segment ``min(that, 1024)``; each continuation is validated again and asks for what is left
of ``max_total_tokens``. With ``default_max_tokens = "max_total_tokens"`` (the default on a run
naming its GPU or model) a request without ``max_tokens`` reserves that, passes validation when its
prompt fits, and its answer ends at ``max_total_tokens - prompt`` (``max_tokens`` cut to it where
its own answer is longer); ``"output"`` (the class default, for hand-made cases) keeps schedlab's
convention: it reserves its own answer's length, an oracle no server has.

Prefix cache (TGI's ``RadixAllocator``, with a ``paged`` cache with prefix caching: the scheduler
calls its :meth:`~schedlab_plugins.kv_caches.PrefixKVCache.cache_input_on_free` before the first
pass): a request's input becomes findable when its allocation is freed -- at its finish, its abort,
or when it goes back for another segment --, not while it runs, and only the input's tokens, its
whole blocks, computed or not (``radix.rs`` ``RadixAllocator::free`` inserts the allocation's
``prefill_tokens`` and knows nothing of what ran); a hit keeps at least one token to compute, as TGI
does (``queue.rs`` ``State::next_batch``: ``prefix_len == input_length`` -> ``prefix_len -= 1``). A
prompt found whole is hit to its last token, which alone is computed again, and the allocation keeps
every block found (:meth:`~schedlab_plugins.kv_caches.PrefixKVCache.cached_tokens` cached when
freed); otherwise a hit is the whole blocks found. TGI's queue allocates a request's blocks before
it checks the prefill budget, and drops allocations it does not keep -- that of the request that
ends a batch at the budget (without chunking, or with chunking when the budget is already full:
``chunk_len == 0``), and every one of a batch too small for ``min_size`` -- so their inputs go in the
trie never computed: the request (and any sharing its prefix) later finds its whole input and
computes one token over KV never written
(:meth:`~schedlab_plugins.kv_caches.PrefixKVCache.give_back`, in TGI's order: allocated in turn,
freed the last first). Eviction follows that cache's LRU free queue, not TGI's free list then trie
leaves; a block cached twice (two requests computed the same prefix) stays cached twice, where
TGI's ``free`` gives back the later copy.

Simplifications: one instance, no sharding; no speculation of TGI's own (``[speculative]`` verifies
drafts as the engines do for every scheduler, a continuation's blocks holding their slots:
:meth:`TgiScheduler.use_speculative_slack`); whether a new batch is large enough
for ``waiting_served_ratio`` is decided before any block is taken, counting each request's prefix
hit in the cache as it stands (TGI allocates one by one and gives the blocks back: the same count
unless admitting one request would evict cached blocks a later one reuses); the padded-model path
(no block allocator) is not modelled. Not modelled either: a failed allocation's eviction of trie
leaves (``alloc_or_reclaim`` evicts before it finds too few, so every unreferenced cached prefix),
and a request whose client leaves while its prompt is prefilled in chunks goes on to its first token
in TGI (only sending a token notices the client gone) but stops at the abort here -- its whole
prompt is cached either way.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import numpy as np

from schedlab.configs import FieldError, bool_field, float_field, int_field, str_field
from schedlab.kv_window import sequence_blocks

from .tgi_launcher import prefill_tokens

HEALTH_CHECK_BLOCKS = 1  # block 0 of TGI's allocator is never handed out
FLASHINFER_BLOCK_SIZE = 1  # server/.../models/globals.py BLOCK_SIZE with ATTENTION=flashinfer
CUDA_GRAPH_MAX_BATCH = 32  # the launcher's default cuda_graphs: [1, 2, 4, 8, 16, 32]


@attrs.frozen
class TgiConfig:
    max_batch_prefill_tokens: int = int_field(4096, min=1,
                                              help="prompt tokens one prefill may compute (on a run naming its GPU "
                                                   "and model: TGI's launcher's, from the GPUs' FLOPS)")
    waiting_served_ratio: float = float_field(0.3, min=0.0,
                                              help="without chunking: a new batch joining a running one must hold "
                                                   "at least this share of the running requests")
    max_waiting_tokens: int = int_field(20, min=0, help="without chunking: after this many tokens (the prefill's and "
                                                        "one per decode pass) any new batch may join")
    max_batch_size: int = int_field(None, min=1, optional=True,
                                    help="most requests in a batch (unset = no limit, TGI's default; with chunking "
                                         "only the first batch is capped)")
    prefill_chunking: bool = bool_field(False, help="TGI v3's chunked prefill (flashinfer / flashdecoding attention; "
                                                    "on by default on a run naming its GPU)")
    max_input_tokens: int = int_field(None, min=1, optional=True,
                                      help="longest prompt accepted (unset: max_total_tokens - 1, TGI's default)")
    max_total_tokens: int = int_field(None, min=2, optional=True,
                                      help="most prompt + new tokens of one segment accepted (unset: with chunking "
                                           "min(KV pool, context_length), without max_batch_prefill_tokens -- what "
                                           "TGI's warmup returns)")
    context_length: int = int_field(None, min=1, optional=True,
                                    help="the model's context (config.json max_position_embeddings); unset: the "
                                         "run's model's")
    max_concurrent_requests: int = int_field(128, min=1,
                                             help="requests in flight the router takes; one more is answered "
                                                  "'Model is overloaded' (HTTP 429) and counted rejected")
    generation_segment: int = int_field(1024, min=0,
                                        help="new tokens scheduled at a time; a request that reaches them goes back "
                                             "to the end of the queue (DEFAULT_GENERATION_LENGTH, TGI v3.1.1 on; "
                                             "0 = whole answers, as v3.0)")
    default_max_tokens: str = str_field(
        "output", choices=("output", "max_total_tokens"),
        help="max_new_tokens of a request without max_tokens: 'max_total_tokens', TGI's validation default, "
             "max_total_tokens - input (it reserves min(that, generation_segment) and its answer ends there; on a "
             "run naming its GPU or model), or 'output', its true output (an oracle no server has)")

    #: TGI's default attention, flashinfer (compute capability 8.0 and up, head dims 64, 128, 256),
    #: turns prefix caching on and pages the KV cache in blocks of one token (``globals.py``
    #: ``BLOCK_SIZE``: 1 for flashinfer, 256 for flashdecoding, 16 for paged -- set ``[kv_cache]
    #: block_size`` to model those); it keeps every layer's KV for every token: one tensor per layer
    #: over the same blocks, a sliding window only limits what attention reads (no hybrid manager,
    #: schedlab.kv_window)
    kv_cache_defaults: ClassVar[dict] = {"prefix_caching": True, "disable_hybrid_kv_cache_manager": True,
                                         "block_size": FLASHINFER_BLOCK_SIZE}

    @staticmethod
    def cost_model_defaults(table: dict) -> dict:
        """TGI steps synchronously: its router sends a batch and waits for the shards' answer
        before it schedules the next (``generate_token`` prepares, runs and samples in turn), so
        a cost model that can overlap the host's work with the GPU's does not. It captures CUDA
        graphs for batches of 1, 2, 4, 8, 16 and 32 requests (the launcher's ``cuda_graphs``
        default) and replays one only for a decode pass of at most 32 (``FlashCausalLM.forward``:
        ``if cu_seqlen_prefill is not None or cuda_graph is None`` runs eagerly):
        ``cuda_graph_max_tokens = 32`` and ``cuda_graph_prefill = false`` (a pass that holds a
        prefill, however short, launches its kernels eagerly). The run's assembly applies these to
        a ``[cost_model]`` table that leaves them out."""
        return {"async_scheduling": False, "cuda_graph_max_tokens": CUDA_GRAPH_MAX_BATCH, "cuda_graph_prefill": False}

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """What TGI v3.3.7 picks where ``table`` is silent, on ``tensor_parallel`` shards of the
        run's ``gpu`` for its ``model`` (either None: not named): the model's context as
        ``context_length``; chunked prefill on a named GPU (flashinfer attention from compute
        capability 8.0, which every GPU preset has); and the launcher's
        ``max_batch_prefill_tokens`` (:mod:`.tgi_launcher`: the GPUs' FLOPS over the model's
        FLOPs per token, within the context and the memory). The run's assembly applies them."""
        out = {}
        if model is not None and model.max_position_embeddings and "context_length" not in table:
            out["context_length"] = model.max_position_embeddings
        if gpu is not None and "prefill_chunking" not in table:
            out["prefill_chunking"] = True
        if "max_batch_prefill_tokens" not in table and (gpu is not None or model is not None):
            out["max_batch_prefill_tokens"] = prefill_tokens(gpu, model, tensor_parallel)
        if "default_max_tokens" not in table and (gpu is not None or model is not None):
            out["default_max_tokens"] = "max_total_tokens"  # (router/src/validation.rs validate_input)
        return out

    def __attrs_post_init__(self):
        if self.max_input_tokens is not None and self.max_total_tokens is not None \
                and self.max_input_tokens >= self.max_total_tokens:
            raise FieldError("max_input_tokens", f"({self.max_input_tokens}) must be < max_total_tokens "
                                                 f"({self.max_total_tokens}), as TGI's launcher requires")
        if not self.prefill_chunking:
            total = self.max_total_tokens if self.max_total_tokens is not None else self.max_batch_prefill_tokens
            longest = self.max_input_tokens if self.max_input_tokens is not None else total - 1
            if longest > self.max_batch_prefill_tokens:
                raise FieldError("max_batch_prefill_tokens",
                                 f"({self.max_batch_prefill_tokens}) must be >= max_input_tokens ({longest}"
                                 f"{'' if self.max_input_tokens is not None else ' = max_total_tokens - 1'}) "
                                 f"without prefill chunking: TGI refuses to start otherwise")


class TgiScheduler:
    """TGI's router: reserve at admission, FIFO batches, ratio-gated prefill passes."""

    stable_between_events = True

    def __init__(self, config: TgiConfig | None = None):
        self.config = config or TgiConfig()
        self.slots = self.config.max_batch_size
        self.answer_segment = self.config.generation_segment  # (the engines check reservations by it)
        self.max_in_flight = self.config.max_concurrent_requests  # (the engines refuse beyond it on arrival)
        self._ratio = np.float32(self.config.waiting_served_ratio)
        self._prefill_step = 0          # decode clock at the last prefill: waiting_tokens = 1 + steps since
        self._decode_next = None        # decode clock after a pass that joined a new batch: the next pass decodes
        self._left: dict = {}           # chunking: sequence still prefilling -> tokens left after the planned pass
        self._next_chunk: dict = {}     # chunking: sequence still prefilling -> its chunk in the next pass
        self._tables: dict = {}         # running sequence -> the blocks of its allocation (its block table)
        self._bound = False             # the KV cache told to cache as TGI's radix allocator does
        self._total = None              # default_max_tokens = "max_total_tokens": max_total_tokens (limits(kv))
        self._slack_for = None          # [speculative]: a request's slots past its tokens (use_speculative_slack)

    # -- optional protocol members --------------------------------------------------------

    def setting_notes(self, kv) -> list[str]:
        """Settings that do nothing with prefill chunking on (said once, as a warning): TGI v3's
        router drops the batching gate when it chunks (``backend.rs``: min_size None, 'chunking
        allow us to consistently run at the compute bound, making min_size useless')."""
        c = self.config
        moot = [key for key, default in (("waiting_served_ratio", 0.3), ("max_waiting_tokens", 20))
                if getattr(c, key) != default]  # (no values: a sweep over them says it once)
        if c.prefill_chunking and moot:
            verb, them = ("gate", "them") if len(moot) > 1 else ("gates", "it")
            return [f"{' and '.join(moot)} only {verb} prefill without chunking, and prefill_chunking is on (the "
                    f"default on a run naming its GPU): TGI ignores {them} (prefill_chunking = false to use {them})"]
        return []

    def start_up_problem(self, kv) -> str | None:
        """Why TGI's router would refuse to start with ``kv`` (``backends/v3/src/main.rs``): a
        ``max_input_tokens`` not below ``max_total_tokens`` (as the warmup settles it, :meth:`limits`),
        a prefill budget or a ``max_total_tokens`` over ``max_batch_total_tokens``, the KV pool's
        tokens (``num_blocks x block_size``)."""
        pool = kv.num_blocks * kv.block_size
        c = self.config
        if c.max_batch_prefill_tokens > pool:
            return (f"TGI would refuse to start: `max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. "
                    f"Given: {c.max_batch_prefill_tokens} and {pool} (the KV pool's tokens); set [scheduler] "
                    f"max_batch_prefill_tokens <= {pool:,}")
        longest, total = self.limits(kv)
        if longest >= total:  # (max_input_tokens given, max_total_tokens settled by the warmup)
            return (f"TGI would refuse to start: `max_input_tokens` must be < `max_total_tokens`. Given: {longest} and "
                    f"{total} (max_total_tokens as the warmup settles it on this KV pool); set [scheduler] "
                    f"max_input_tokens < {total:,}, or max_total_tokens")
        if total > pool:
            return (f"TGI would refuse to start: `max_total_tokens` must be <= `max_batch_total_tokens`. "
                    f"Given: {total} and {pool} (the KV pool's tokens); set [scheduler] max_total_tokens "
                    f"<= {pool:,}")
        return None

    def limits(self, kv) -> tuple[int, int]:
        """(max_input_tokens, max_total_tokens) as TGI's warmup settles them where the config
        is silent (``FlashCausalLM.warmup``): with chunking the KV pool's tokens or the
        context, whichever is smaller; without, the warmup batch's tokens, which are
        ``max_batch_prefill_tokens``; the input one token less."""
        c = self.config
        total = c.max_total_tokens
        if total is None:
            if c.prefill_chunking:
                total = kv.num_blocks * kv.block_size
                if c.context_length:
                    total = min(total, c.context_length)
            else:
                total = c.max_batch_prefill_tokens
        return (c.max_input_tokens if c.max_input_tokens is not None else total - 1), total

    def _chunk(self, max_new: int) -> int:
        """New tokens of one segment: ``min(max_new_tokens, DEFAULT_GENERATION_LENGTH)``."""
        segment = self.config.generation_segment
        return min(max_new, segment) if segment else max_new

    def _max_new(self, request, input_tokens: int) -> int:
        """The ``max_new_tokens`` TGI's validation gives a segment whose input is ``input_tokens``:
        the request's ``max_tokens``, or without one ``max_total_tokens - input`` (``validate_input``:
        'Use the maximum possible number of tokens as default'; each continuation is validated
        again, so it asks for what is left of ``max_total_tokens``)."""
        total = self._total
        if total is None or (request.max_tokens is not None  # (None: the 'output' convention)
                             and request.max_tokens != total - request.prompt_tokens):  # (limit_request's cut)
            return request.max_output_tokens
        return max(total - input_tokens, 0)

    def use_speculative_slack(self, slack_for) -> None:
        """With ``[speculative]``: ``slack_for(request)``, the KV slots a request's step holds past
        its tokens (its drafts and lookahead), which each continuation's blocks must hold too."""
        self._slack_for = slack_for

    def limit_request(self, request, kv):
        """``request`` as TGI serves it: an answer longer than ``generation_segment`` is
        served a segment at a time, the router validating each continuation like a new request
        (``Infer::generate_stream``): prompt + tokens so far must stay within
        ``max_input_tokens``, and with one more segment within ``max_total_tokens`` and the
        allocator's blocks; where one does not, the answer ends there -- ``max_tokens`` is cut
        to the segments that pass. The first segment's checks are :meth:`rejection_reason`'s."""
        segment = self.config.generation_segment
        longest_input, total = self.limits(kv)
        default = request.max_tokens is None and self.config.default_max_tokens == "max_total_tokens"
        if default:
            self._total = total
        prompt = request.prompt_tokens
        if default and 0 < total - prompt < request.output_tokens:
            # TGI's default max_new_tokens, max_total_tokens - input: the answer ends there
            request = attrs.evolve(request, max_tokens=total - prompt)
        if not segment or request.max_output_tokens <= segment:
            return request
        usable_tokens = (kv.num_blocks - HEALTH_CHECK_BLOCKS) * kv.block_size
        if self._slack_for is not None:  # (speculation: a segment's last step holds its drafts' slots too)
            usable_tokens -= self._slack_for(request)
        if default:  # each continuation asks for what is left of max_total_tokens: its input is checked, and
            passing = (longest_input - prompt) // segment  # a whole segment's blocks where they may not fit
            if total > usable_tokens + 1:
                passing = min(passing, (usable_tokens + 1 - segment - prompt) // segment)
        else:
            total = min(total, usable_tokens + 1)  # a segment reserves input + segment - 1 tokens
            # segment k (k >= 1) starts from prompt + k * segment tokens and asks for segment more
            passing = min((total - segment - prompt) // segment, (longest_input - prompt) // segment)
        served = (max(passing, 0) + 1) * segment
        if served >= request.max_output_tokens:
            return request
        return attrs.evolve(request, max_tokens=served)

    def rejection_reason(self, request, kv) -> str | None:
        longest_input, total = self.limits(kv)  # (without chunking, within max_batch_prefill_tokens)
        if self.config.default_max_tokens == "max_total_tokens":
            self._total = total
        chunk = self._chunk(self._max_new(request, request.prompt_tokens))
        if request.prompt_tokens + chunk > total:  # (TGI's messages and order, router/src/validation.rs)
            return (f"`inputs` tokens + `max_new_tokens` must be <= {total}. Given: {request.prompt_tokens} "
                    f"`inputs` tokens and {chunk} `max_new_tokens`")
        if request.prompt_tokens > longest_input:
            return (f"`inputs` must have less than {longest_input} tokens. Given: {request.prompt_tokens}")
        if chunk <= 0:  # (the default, max_total_tokens - input, at 0 past both: only where TGI would not start)
            return "`max_new_tokens` must be strictly positive"
        # (with window layers -- not TGI's, but a cache may have them -- the prompt's blocks there too)
        need = sequence_blocks(kv, self.kv_reservation(request), request.prompt_tokens, request.prompt_tokens,
                               reserve=True)
        usable = kv.num_blocks - HEALTH_CHECK_BLOCKS
        if need > usable:
            return (f"needs {need} KV blocks (prompt {request.prompt_tokens} + max_tokens "
                    f"{chunk} - 1) but TGI's block allocator has {usable} (block 0 is kept for health checks)")
        return None

    def kv_reservation(self, request, kv=None) -> int:
        """KV tokens held from admission (the block allocator's ``input + max_new_tokens - 1``,
        ``max_new_tokens`` the first segment's: without ``max_tokens``, TGI's default, from
        ``max_total_tokens`` as served on ``kv``)."""
        if kv is not None and self._total is None and self.config.default_max_tokens == "max_total_tokens":
            self._total = self.limits(kv)[1]
        return request.prompt_tokens + self._chunk(self._max_new(request, request.prompt_tokens)) - 1

    def _reserve_tokens(self, seq) -> int:
        """What TGI's queue asks the block allocator for: ``input + max_new_tokens - 1``, the
        input holding the answer so far when ``seq`` comes back for another segment (without
        ``max_tokens``, TGI's default: what is left of ``max_total_tokens``)."""
        return seq.num_tokens + self._chunk(self._max_new(seq.request, seq.num_tokens)) - 1

    def _requeue_segments(self, plan) -> None:
        """Send each decoding request that has just generated a whole segment back to the end
        of the queue (its blocks freed, to be prefilled again with its answer), and wake the
        engine when the next one will have."""
        segment = self.config.generation_segment
        soonest = None
        for seq in list(plan.running):
            if seq.status != "decoding" or seq.request.max_output_tokens <= segment:
                continue
            left = segment - seq.num_generated % segment
            if left == segment:
                plan.requeue(seq)
            elif soonest is None or left < soonest:
                soonest = left
        if soonest is not None:
            plan.wake_after(soonest)

    def _watch_prefills(self, plan) -> None:
        """A request prefilled in this pass may end a segment with its first token, or a few
        decode steps later: be asked at the next pass, when it decodes (the engine would not
        ask while only decoders run)."""
        segment = self.config.generation_segment
        for seq in plan.prefilling:
            if seq.request.max_output_tokens > segment:
                plan.wake_after(0)
                return

    # -- one forward pass ------------------------------------------------------------------
    def schedule(self, plan) -> None:
        c = self.config
        if not self._bound:  # TGI's radix allocator caches an allocation's input when it is freed
            self._bound = True
            on_free = getattr(plan.kv, "cache_input_on_free", None)
            if on_free is not None:
                on_free()
        if c.generation_segment:
            self._requeue_segments(plan)
            self._pass(plan)
            self._watch_prefills(plan)
        else:
            self._pass(plan)

    def _pass(self, plan) -> None:
        """One pass of ``batching_task``: the running batch's work and any new batch."""
        c = self.config
        running = len(plan.running)
        decode_next, self._decode_next = self._decode_next, None
        if not running:  # the outer loop of batching_task: a first batch, no size floor
            self._next_batch(plan, None, c.max_batch_size, c.max_batch_prefill_tokens, joining=False)
            return
        if decode_next is not None and plan.decode_steps == decode_next:
            # A new batch was just prefilled: batching_task decodes before it tries again.
            self._continue(plan)
            plan.wake_after(1)  # the next pass tries again, whatever happens meanwhile
            return
        full = self._tables_full(plan)  # token_budget 0: next_batch returns None
        if c.prefill_chunking:
            self._continue(plan)
            budget = c.max_batch_prefill_tokens - plan.num_scheduled_tokens  # TGI's current_tokens
            if budget > 0 and not full:
                self._next_batch(plan, None, None, budget, joining=True)
            return
        max_size = None if c.max_batch_size is None else c.max_batch_size - running
        waiting_tokens = 1 + plan.decode_steps - self._prefill_step
        if full:
            admitted = False
        elif waiting_tokens >= c.max_waiting_tokens:
            admitted = self._next_batch(plan, None, max_size, c.max_batch_prefill_tokens, joining=True)
        else:
            min_size = int(np.floor(np.float32(running) * self._ratio))  # f32, as TGI computes it
            admitted = self._next_batch(plan, min_size, max_size, c.max_batch_prefill_tokens, joining=True)
            if not admitted and min_size and plan.waiting and max_size != 0:
                # Too few for the ratio: any batch may join once waiting_tokens reaches
                # max_waiting_tokens, one token per decode pass from here.
                plan.wake_after(c.max_waiting_tokens - waiting_tokens)
        if not admitted:
            plan.decode_all()  # blocks are reserved: decodes always fit

    def _tables_full(self, plan) -> bool:
        """Whether TGI's ``token_budget`` is 0 (``backend.rs``): ``max_batch_total_tokens`` (the
        pool) minus the running batch's ``max_tokens``, the blocks of every request's block table
        -- a shared prefix's once per request -- times the block size. Only a prefix cache can
        make them more than the pool."""
        kv = plan.kv
        if not getattr(kv, "prefix_caching", False):
            return False
        tables = self._tables
        running = plan.running
        if len(tables) > len(running):  # (forget those no longer running)
            self._tables = tables = {seq: tables[seq] for seq in running if seq in tables}
        return sum(tables.get(seq, 0) for seq in running) >= kv.num_blocks

    def _continue(self, plan) -> None:
        """The running batch's part of a pass: every decode, and each pending chunk."""
        if plan.num_decoding:
            plan.decode_all()
        if self._next_chunk:
            for seq, n in self._next_chunk.items():
                if seq.status == "aborted":  # its client left mid-prefill: the engine took it out
                    del self._left[seq]
                    continue
                plan.prefill(seq, n)
                self._left[seq] -= n
            self._plan_chunks(len(plan.running))

    def _next_batch(self, plan, min_size, max_size, budget: int, *, joining: bool) -> bool:
        """TGI's ``State::next_batch``; admits the batch into this pass. True if it admitted any."""
        waiting = plan.waiting
        if not waiting or max_size == 0 or (min_size is not None and len(waiting) < min_size):
            return False
        block_size = plan.kv.block_size
        budget = -(-budget // block_size) * block_size  # padded to a multiple of the block size
        if min_size is not None and min_size > 1:
            count, allocated = self._fill(plan, budget, max_size, admit=False)
            if count < min_size:  # TGI builds the batch, finds it too small and gives its blocks back
                self._give_back(plan, allocated)
                return False
        steps = plan.decode_steps
        count, dropped = self._fill(plan, budget, max_size, admit=True)
        self._give_back(plan, dropped)
        if not count:
            return False
        if not self.config.prefill_chunking:
            plan.skip_decode()
        self._prefill_step = steps
        if joining:  # the decode clock after this pass, which decodes too when chunking
            self._decode_next = steps + (1 if self.config.prefill_chunking and plan.num_decoding else 0)
        if self._left:
            self._plan_chunks(len(plan.running))
        return True

    def _fill(self, plan, budget: int, max_size, *, admit: bool) -> tuple[int, list]:
        """TGI's loop over the queue: the head's blocks (input + max_new_tokens - 1) must be free and
        its uncached prompt must fit ``budget`` (with chunking the last one is cut to fit); the first
        that does not ends the batch. Returns the batch size and the allocations TGI drops unused --
        ``(sequence, reserve_tokens)``, in the order it made them: with ``admit`` the request that
        ended the batch at the budget, allocated before the budget was checked; with
        ``admit=False``, which only counts the batch against the cache as it stands, every request
        counted too (:meth:`_give_back` for when the batch is too small)."""
        kv = plan.kv
        waiting = plan.waiting
        chunking = self.config.prefill_chunking
        queue = None if admit else iter(waiting)
        free = kv.num_free_blocks() - HEALTH_CHECK_BLOCKS
        count = 0
        prefill_tokens = 0
        allocated = []
        while True:
            seq = waiting.peek() if admit else next(queue, None)  # admitting removes the head
            if seq is None:
                break
            hit = plan.cached_tokens(seq)
            postfix = seq.num_tokens - hit
            reserve = self._reserve_tokens(seq)
            need = kv.blocks_needed(seq, postfix, cached_tokens=hit, reserve_tokens=reserve)
            if need > free:
                break
            n = postfix
            if prefill_tokens + postfix > budget:
                if not chunking or budget <= prefill_tokens:
                    allocated.append((seq, reserve))  # (allocated, then pushed back: dropped)
                    break
                n = budget - prefill_tokens
            if admit:
                if not plan.admit(seq, n, reserve_tokens=reserve):
                    break
                self._tables[seq] = -(-reserve // kv.block_size)  # prefix blocks + suffix blocks
                if n < postfix:
                    self._left[seq] = postfix - n
                free = kv.num_free_blocks() - HEALTH_CHECK_BLOCKS
            else:
                free -= need
                allocated.append((seq, reserve))
            count += 1
            prefill_tokens += n
            if n < postfix or count == max_size:
                break
        return count, allocated

    @staticmethod
    def _give_back(plan, allocations) -> None:
        """TGI drops ``allocations`` unused (``queue.rs`` ``State::next_batch``: the entry goes back
        to the queue with its ``BlockAllocation``, whose ``Drop`` frees it) and
        ``RadixAllocator::free`` inserts each one's input in the trie, never computed: with a
        prefix cache caching when freed, :meth:`~schedlab_plugins.kv_caches.PrefixKVCache.give_back`.
        Where that changed what is cached, the next pass is asked (its hits, so its batch, may
        differ: no decode run skips it)."""
        if allocations:
            kv = plan.kv
            give_back = getattr(kv, "give_back", None)
            if give_back is not None and getattr(kv, "on_free", False) and give_back(allocations):
                plan.wake_after(0)

    def _plan_chunks(self, batch_size: int) -> None:
        """After a pass, the server gives each request still prefilling its next chunk, newest first,
        from ``max_batch_prefill_tokens - (batch_size - 1)`` (a token kept for every other request)."""
        budget = self.config.max_batch_prefill_tokens - (batch_size - 1)
        chunks = {}
        for seq in reversed(list(self._left)):
            left = self._left[seq]
            if not left:
                del self._left[seq]
                continue
            n = max(min(left, budget), 1)
            budget -= n
            chunks[seq] = n
        self._next_chunk = dict(reversed(list(chunks.items())))  # admission order, like the running batch
