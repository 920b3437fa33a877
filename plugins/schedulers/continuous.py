"""Continuous (iteration-level) batching, as Orca introduced it and vLLM runs it.

Every iteration follows vLLM V1's ``Scheduler.schedule`` (engines.md §1; the rules below are
checked step by step against vLLM 0.33's own scheduler, see ``tools/vllm_diff.py``):

1. running requests, in admission order (``running_order = "admission"``): each gets its
   decode token or its next prefill chunk (capped by ``long_prefill_token_threshold``, which
   is ignored while at most one request is running or waiting) while the token budget
   lasts. When a request's KV blocks do not fit, the victim -- the most recently admitted
   running request, or under a waiting order the one it would serve last (vLLM's priority
   policy: lowest priority, latest arrival) -- is preempted, even if it was already
   scheduled in this iteration (its work is withdrawn), until the blocks fit or the request
   itself is the victim. Preemption is by recompute, or with ``preemption = "swap"`` a copy
   to CPU swap space (vLLM V0, §2). ``running_order = "decodes_first"`` gives every decode
   its token before any prefill chunk (Sarathi-Serve);
2. swapped sequences come back before anything new is admitted (vLLM V0; its ``vllm-v0``
   preset without chunking admits nothing after them in the same step either, as
   ``_schedule_default`` schedules prompts only at a step's start);
3. waiting requests are admitted in queue order while ``max_num_seqs``, the per-iteration
   token budget ``max_num_batched_tokens`` and the KV cache allow -- but not in an iteration
   that preempted (vLLM). ``allocation = "reserve"`` holds KV for ``prompt + max_tokens`` at
   admission (the Orca paper, TensorRT-LLM ``GUARANTEED_NO_EVICT``): never preempts, wastes
   memory. A request without ``max_tokens`` holds the rest of ``max_model_len`` with
   ``default_max_tokens = "max_model_len"`` (TensorRT-LLM), or its own true output with
   ``"output"`` (the default here: an oracle no server has); ``reserve_max_model_len`` holds
   all of ``max_model_len`` for every request (Sarathi-Serve's Orca and FasterTransformer
   baselines: ``ceil(max_model_len / block_size)`` blocks each);
   ``"grow"`` allocates blocks as tokens are computed (vLLM, TRT-LLM ``MAX_UTILIZATION``),
   and with ``reserve_full_prompt`` admits a request only when its whole prompt's blocks
   fit, not only its first chunk's (vLLM ``scheduler_reserve_full_isl``).

``policy`` orders the waiting queue: ``fcfs``, ``priority``, ``sjf`` (shortest predicted
output first) or ``lof`` (SGLang's longest output first), see :mod:`.orders`; a batching
window (``max_wait_ms``, see :mod:`.window`) may hold new requests back so a batch forms.

``chunked_prefill`` splits a prompt that does not fit the remaining budget (Sarathi-Serve,
vLLM V1; the ``sarathi`` preset has Sarathi-Serve's settings); ``long_prefill_token_threshold``
caps one request's chunk (vLLM's, not Sarathi-Serve's dynamic chunking schedule). ``prefill_first``
makes an iteration that admits new prompts skip the decodes (vLLM V0 without chunking,
SGLang's default; V0 with chunking schedules decodes first: the ``vllm-v0`` preset then sets
``running_order = "decodes_first"``), which stalls running streams behind long prompts.
"""

from __future__ import annotations

import attrs

from schedlab.configs import FieldError, bool_field, float_field, int_field, str_field
from schedlab.errors import ConfigError, SimulationError
from schedlab.kv_window import sequence_blocks, start_up_blocks, tokens_fitting
from schedlab.queues import FcfsQueue, KeyedQueue

from .orders import waiting_key
from .window import (BatchingWindow, check_window_settings, interactive_class_field, interactive_wait_ms_field,
                     max_wait_ms_field, min_batch_field)


def async_scheduling_field(default):
    """vLLM's asynchronous scheduling: true, false or ``"auto"`` (on unless the run uses
    something it is not modelled with -- see :attr:`ContinuousConfig.plans_ahead` and
    :mod:`schedlab.study.simulation`)."""

    def check(_inst, attribute, value):
        if not (isinstance(value, bool) or value == "auto"):
            raise FieldError(attribute.name, f"must be true, false or \"auto\", got {value!r}")

    return attrs.field(default=default, validator=check, metadata={"help": (
        "vLLM's asynchronous scheduling (its default since 0.13): each batch is planned while the one before it "
        "runs, so arrivals wait a batch more and finished requests hold their slots one plan longer "
        "(schedlab.engine.ahead; on a pipeline a request decodes every pipeline_parallel plans, as vLLM's V2 "
        "model runner has it: schedlab.engine.stages); \"auto\": on unless preemption = 'swap', a batching "
        "window, disaggregation or pipeline parallelism with drafts per batch size, where it is not modelled")})


def max_model_len_field():
    """vLLM's ``--max-model-len``: a whole number (0 = no limit), or ``"auto"`` (vLLM's ``-1``,
    also accepted): the longest sequence the KV cache holds, at most ``model_context``."""

    def convert(value):
        return "auto" if value == -1 and not isinstance(value, bool) else value

    def check(_inst, attribute, value):
        if value == "auto":
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise FieldError(attribute.name, f"must be a whole number >= 0 or \"auto\", got {value!r}")

    return attrs.field(default=0, converter=convert, validator=check, metadata={"help": (
        "longest sequence served, prompt + output (vLLM --max-model-len): a longer prompt is rejected, max_tokens "
        "cut to what is left (0 = no limit; the vllm preset: the model's context length); \"auto\" (vLLM's -1): "
        "the longest the KV cache holds, at most model_context")})


#: ``default_max_tokens``' choices and help, shared with ``static``
DEFAULT_MAX_TOKENS = ("output", "max_model_len", "auto")
DEFAULT_MAX_TOKENS_HELP = (
    "what a reservation (allocation = 'reserve') holds for a request without max_tokens of its own: 'output', its "
    "true output (an oracle no server has), 'max_model_len', the rest of max_model_len (TensorRT-LLM deduces "
    "max_tokens = max_seq_len - prompt), or 'auto', 'max_model_len' when there is a max_model_len, else 'output'; "
    "the request still stops at its own output")
RESERVE_MAX_MODEL_LEN_HELP = (
    "a reservation holds all of max_model_len for every request, whatever its prompt and max_tokens (Sarathi-Serve's "
    "Orca and FasterTransformer baselines: ceil(max_model_len / block_size) blocks each); needs a max_model_len")


def check_reservation_settings(config) -> None:
    """``default_max_tokens = "max_model_len"`` and ``reserve_max_model_len`` need a ``max_model_len``."""
    if config.default_max_tokens == "max_model_len" and not config.max_model_len:
        raise ConfigError("default_max_tokens = 'max_model_len' needs a max_model_len (the rest of it is what a "
                          "request without max_tokens reserves)")
    if config.reserve_max_model_len and not config.max_model_len:
        raise ConfigError("reserve_max_model_len needs a max_model_len (all of it is what every request reserves)")


def reserves_max_model_len(config) -> bool:
    """Whether a reservation under ``config`` holds (the rest of) ``max_model_len`` rather than a
    request's own output for a request without ``max_tokens`` (``default_max_tokens``; ``"auto"``:
    when there is a ``max_model_len``), or for every request (``reserve_max_model_len``)."""
    return bool(config.reserve_max_model_len or config.default_max_tokens == "max_model_len"
                or (config.default_max_tokens == "auto" and config.max_model_len))


def served_max_model_len(config, kv, in_flight_tokens: int | None = None) -> int:
    """``config.max_model_len`` as served with ``kv`` (0: no limit); ``"auto"``: the most tokens
    the cache's blocks hold (:func:`schedlab.kv_window.tokens_fitting`), at most ``model_context``."""
    if config.max_model_len != "auto":
        return config.max_model_len
    fits = tokens_fitting(kv, kv.num_blocks, in_flight_tokens)
    return min(fits, config.model_context) if config.model_context else fits


def reserved_tokens(config, request, longest: int) -> int:
    """The tokens a reservation holds for ``request`` when :func:`reserves_max_model_len`, with
    ``longest`` the ``max_model_len`` served: ``prompt + max_tokens``, or without a max_tokens of its
    own (or with ``reserve_max_model_len``) all of ``longest`` -- never less than the request may
    compute (a longer one is cut to it on arrival, or rejected)."""
    tokens = request.prompt_tokens + request.max_output_tokens
    if request.max_tokens is not None and not config.reserve_max_model_len:
        return tokens
    return max(tokens, longest)


def cut_to_max_model_len(request, longest, reject_overflow: bool = False):
    """``request`` as served within ``longest`` (``max_model_len``; ``"auto"``: nothing to cut by
    yet): ``max_tokens`` cut to ``longest - prompt`` when longer (vLLM's ``get_max_tokens``), unless
    it is the client's own and ``reject_overflow`` (rejected instead)."""
    if longest == "auto":
        return request
    room = longest - request.prompt_tokens
    if room < 1 or request.max_output_tokens <= room:
        return request
    if request.max_tokens is not None and reject_overflow:
        return request
    return attrs.evolve(request, max_tokens=room)


@attrs.frozen
class ContinuousConfig:
    max_num_seqs: int = int_field(256, min=1, help="most sequences running at once (vLLM max_num_seqs)")
    max_num_batched_tokens: int = int_field(8192, min=1, help="token budget of one iteration, decodes included")
    chunked_prefill: bool = bool_field(False, help="split prompts that do not fit the remaining budget")
    long_prefill_token_threshold: int = int_field(0, min=0, help="cap on one request's prefill chunk (0 = none)")
    allocation: str = str_field("reserve", choices=("reserve", "grow"),
                                help="'reserve' prompt + max_tokens at admission (the Orca paper; a request without "
                                     "max_tokens: see default_max_tokens), or 'grow' as tokens are computed (vLLM)")
    preemption: str = str_field("recompute", choices=("recompute", "swap"), help="what a preemption does with the victim's KV")
    swap_full: str = str_field("recompute", choices=("recompute", "fail"),
                               help="when swap space is full: recompute instead (counted), or fail the run")
    watermark: float = float_field(0.0, min=0.0, max=1.0,
                                   help="share of KV blocks kept free at admission and swap-in (vLLM V0 uses 0.01; "
                                        "the vllm preset, as vLLM V1's --watermark, only while a request runs)")
    prefill_first: bool = bool_field(False, help="an iteration that admits prompts skips decodes (vLLM V0, SGLang)")
    running_order: str = str_field(
        "admission", choices=("admission", "decodes_first"),
        help="order running sequences get budget and blocks: 'admission' (vLLM V1: an older request's prefill chunk "
             "before a newer one's decode) or 'decodes_first' (Sarathi-Serve: all decodes, then prefill chunks)")
    reserve_full_prompt: bool = bool_field(
        True, help="with allocation = 'grow', admit a request only if KV for its whole prompt fits, not just the "
                   "first chunk (vLLM scheduler_reserve_full_isl, on by default since 0.2x)")
    admission_counts_hits: bool = bool_field(
        True, help="blocks a prefix-cache hit shares are not asked free at admission (vLLM); false: the whole "
                   "prompt's are (TensorRT-LLM's capacity scheduler counts a request's blocks to completion "
                   "without reuse), the hit still shared once admitted")
    policy: str = str_field("fcfs", choices=("fcfs", "priority", "sjf", "lof"),
                            help="waiting order and victim choice: arrival, (priority, arrival) as vLLM's priority "
                                 "policy, shortest predicted output first, or SGLang's longest max_tokens first")
    priority_preemption: bool = bool_field(
        False, help="a waiting request may preempt lower-priority running ones (off in vLLM V1; V0's priority policy "
                    "always does without chunking: vllm-v0)")
    prediction_sigma: float = float_field(
        0.0, min=0.0, help="policy 'sjf': lognormal sigma of the output-length prediction error (0 = exact)")
    prediction_seed: int = int_field(0, min=0, help="policy 'sjf': seed of the prediction errors, drawn per request id")
    max_wait_ms: float = max_wait_ms_field()
    min_batch: int = min_batch_field()
    interactive_class: str = interactive_class_field()
    interactive_wait_ms: float = interactive_wait_ms_field()
    async_scheduling: bool | str = async_scheduling_field(False)
    max_model_len: int | str = max_model_len_field()
    model_context: int = int_field(
        0, min=0, help="the model's context length, what max_model_len = \"auto\" is capped at (0 = none; the vllm "
                       "preset: the run's model's)")
    context_overflow: str = str_field(
        "cut", choices=("cut", "reject"),
        help="a request whose prompt + its client's max_tokens exceeds max_model_len: 'cut' max_tokens to what is "
             "left (vLLM 0.33, PR #57035) or 'reject' it (vLLM 0.13-0.2x: 400 \"maximum context length\"); without a "
             "max_tokens of its own it is cut either way")
    # -- TensorRT-LLM's rules (the trtllm preset); the defaults keep vLLM's --
    chunk_unit: int = int_field(
        1, min=0, help="with chunked_prefill, a prompt chunk that is not the prompt's last is cut down to a multiple "
                       "of this many tokens (TensorRT-LLM: tokens_per_block); 0 = the KV cache's block size, 1 = no "
                       "rounding (vLLM)")
    default_max_tokens: str = str_field(
        "output", choices=DEFAULT_MAX_TOKENS,
        help=DEFAULT_MAX_TOKENS_HELP + " (continuous: 'output'; the orca preset: 'auto')")
    reserve_max_model_len: bool = bool_field(False, help=RESERVE_MAX_MODEL_LEN_HELP)
    decodes_wait_for_budget: bool = bool_field(
        False, help="decodes beyond max_num_batched_tokens wait for a later iteration, so the budget may be below "
                    "max_num_seqs (TensorRT-LLM's micro-batch scheduler stops at the token budget); off: such a "
                    "budget is refused, as vLLM refuses it")

    def __attrs_post_init__(self):
        if self.watermark >= 1.0:
            raise FieldError("watermark", f"must be < 1 (the share of KV blocks kept free at admission: "
                                          f"{self.watermark:g} keeps all of them, so no request is ever admitted)")
        if self.max_num_batched_tokens < self.max_num_seqs and not self.decodes_wait_for_budget:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), or some running sequences could not decode (vLLM refuses the same; "
                "Sarathi-Serve would schedule every decode past its chunk, which schedlab does not model)")
        if self.preemption == "swap" and self.allocation == "reserve":
            raise ConfigError("preemption = 'swap' needs allocation = 'grow' (reserving sequences are never preempted)")
        check_reservation_settings(self)
        if self.reserve_max_model_len and self.allocation != "reserve":
            raise ConfigError("reserve_max_model_len needs allocation = 'reserve' (it is what a reservation holds)")
        if self.prediction_sigma and self.policy != "sjf":
            raise ConfigError(f"prediction_sigma only affects policy = 'sjf' (policy is {self.policy!r})")
        check_window_settings(self)
        if self.async_scheduling is True:
            # vLLM V1 only (no swapping), and a batching window's wake-ups are not planned ahead
            if self.preemption == "swap":
                raise ConfigError("async_scheduling needs preemption = 'recompute' (vLLM V1 does not swap)")
            if self._window_set:
                raise ConfigError("async_scheduling cannot be combined with a batching window (max_wait_ms, "
                                  "interactive_wait_ms)")

    @property
    def _window_set(self) -> bool:
        return bool(self.max_wait_ms or self.interactive_wait_ms)

    @property
    def plans_ahead(self) -> bool:
        """Whether batches are planned ahead: ``async_scheduling``, with ``"auto"`` on unless
        the scheduler swaps or holds a batching window (what it is not modelled with), as vLLM
        turns it on unless something it does not support is configured."""
        if self.async_scheduling == "auto":
            return self.preemption != "swap" and not self._window_set
        return self.async_scheduling


def _has_swap_space(kv) -> bool:
    """Whether ``kv`` can swap sequences out: a ``swap_out`` and some swap blocks."""
    return callable(getattr(kv, "swap_out", None)) and bool(getattr(kv, "swap_blocks", 0))


class ContinuousScheduler:
    """Iteration-level batching with vLLM's admission, budget and preemption rules."""

    stable_between_events = True

    def __init__(self, config: ContinuousConfig | None = None):
        self.config = config or ContinuousConfig()
        self.slots = self.config.max_num_seqs
        self._reserve = self.config.allocation == "reserve"
        self._priority = self.config.policy == "priority"
        self._key = waiting_key(self.config.policy, self.config.prediction_sigma, self.config.prediction_seed)
        self._window = BatchingWindow.from_config(self.config)
        #: why the last plan left a waiting request out that nothing else will let in (the engine's
        #: stall error reads it), or None
        self.stall_hint: str | None = None
        self._swapped_in: list = []
        #: engines plan each batch while the one before it runs (schedlab.engine.ahead)
        self.plans_ahead = self.config.plans_ahead
        self._longest = None  # max_model_len as served on the run's cache (_spec_limit; read at the first plan)
        #: planning ahead, vLLM schedules a request whose last token is in flight once more when
        #: that token is an EOS (it cannot know), the token thrown away (Plan.overshoot); the
        #: engines ask beside such a request only (not those at their max_tokens: reads_held)
        self.overshoots = self.plans_ahead
        self.reads_held = False
        #: planning ahead with speculative decoding, vLLM counts the drafts in flight as computed
        #: (placeholders): their KV slots are taken, and a request they finish is decoded once more
        self.counts_drafts_ahead = self.plans_ahead
        #: planning ahead on a pipeline, vLLM's V2 model runner staggers a request's decodes by
        #: the stages (schedlab.engine.stages.Stagger)
        self.staggers_decodes = self.plans_ahead
        if self.config.max_model_len:  # (the protocol's optional member; absent: nothing to cut)
            self.limit_request = self._limit_request
        c = self.config
        #: chunk_unit as served: 0 is the KV cache's block size, read at the first plan (_chunk_unit)
        self._unit = c.chunk_unit or None
        #: a reservation for a request without max_tokens holds the rest of max_model_len (TensorRT-LLM),
        #: max_model_len as served on the run's cache read at the first use (_deduced_tokens)
        self._deduces = self._reserve and reserves_max_model_len(c)
        self._deduced = None
        #: vLLM V0's step rules (the vllm-v0 preset: ``v0_steps`` on its config); ``_v0_whole``:
        #: V0 without chunked prefill (``Scheduler._schedule_default``, vllm/core/scheduler.py v0.8.5)
        self._v0 = bool(getattr(c, "v0_steps", False))
        #: vLLM V1's watermark (the vllm preset: ``watermark_while_running`` on its config): kept free
        #: only while a request runs, at admission only; never a reason to turn a request away
        self._v1_watermark = bool(getattr(c, "watermark_while_running", False))
        self._v0_whole = self._v0 and c.prefill_first and not c.chunked_prefill
        if c.decodes_wait_for_budget and c.max_num_batched_tokens < c.max_num_seqs:
            # a decode-only plan may leave decodes waiting for the budget: never "every decode"
            self.stable_between_events = False

    # -- optional protocol members --------------------------------------------------------
    def setting_notes(self, kv) -> list[str]:
        """Settings the run's cache makes moot (said once, as a warning): swap preemption with no
        swap space recomputes every victim (each refused swap counted in ``swap_failures``)."""
        if self.config.preemption == "swap" and not _has_swap_space(kv) and self.config.swap_full != "fail":
            built_in = type(kv).__module__.partition(".")[0] == "schedlab_plugins"
            how = ("[kv_cache] swap_space_gib or swap_blocks gives it some" if built_in else
                   "a cache with swap space, swap_out() and swap_in(), gives it some")
            return [f"preemption = 'swap' and the KV cache ({type(kv).__name__}) has no swap space: every "
                    f"preemption recomputes ({how})"]
        return []

    def kv_problem(self, kv) -> str | None:
        """``swap_full = "fail"`` with a cache that has no swap space: the first preemption would
        fail the run (vLLM V0 aborts when it cannot swap), so it is refused when built."""
        if self.config.preemption == "swap" and self.config.swap_full == "fail" and not _has_swap_space(kv):
            return (f"preemption = 'swap' with swap_full = 'fail' and the KV cache ({type(kv).__name__}) has no swap "
                    "space: the first preemption would fail the run; give it some ([kv_cache] swap_space_gib or "
                    "swap_blocks) or set swap_full = \"recompute\"")
        return None

    def new_waiting_queue(self):
        if self._key is not None:
            return KeyedQueue(self._key)
        return FcfsQueue()

    def max_model_len_for(self, kv) -> int:
        """The longest sequence served with ``kv`` (0: no limit): ``max_model_len``, or with
        ``"auto"`` the most tokens the cache's blocks hold (vLLM's auto-fit,
        ``_auto_fit_max_model_len``: the largest length whose blocks fit), at most ``model_context``."""
        return served_max_model_len(self.config, kv, self.in_flight_tokens())

    def in_flight_tokens(self) -> int:
        """Tokens scheduled and not yet processed at most (vLLM ``max_in_flight_tokens``: a token
        budget per concurrent batch, two planning ahead): what a model's window layers keep on
        top of their window (:meth:`schedlab.kv_window.SlidingWindow.admission_cap`)."""
        return self.config.max_num_batched_tokens * (2 if self.config.plans_ahead else 1)

    def start_up_problem(self, kv) -> str | None:
        """Why the engine would refuse to start with ``kv`` (None: it starts). vLLM (the ``vllm``
        and ``vllm-v0`` presets: ``refuses_unfit_max_model_len`` on their config) checks that one
        sequence of ``max_model_len`` fits the KV pool (V1 ``check_enough_kv_cache_memory``, V0
        ``raise_if_cache_size_invalid``). A run is simulated all the same (the table notes it); a
        plan counts such a deployment infeasible (:mod:`schedlab.study.planner`)."""
        if not getattr(self.config, "refuses_unfit_max_model_len", False):
            return None
        longest = self.max_model_len_for(kv)
        if not longest or start_up_blocks(kv, longest, self.in_flight_tokens()) <= kv.num_blocks:
            return None
        tokens = tokens_fitting(kv, kv.num_blocks, self.in_flight_tokens())
        return (f"vLLM would refuse to start: max_model_len {longest:,} > the KV pool's {tokens:,} tokens; "
                f"set [scheduler] max_model_len <= {tokens:,} or \"auto\"")

    def rejection_reason(self, request, kv, *, received: bool = False) -> str | None:
        """Why ``request`` can never be served on ``kv`` (None: it can). ``received``: its prompt's KV
        arrives computed (a disaggregated decode instance), so its prefill's blocks do not count --
        a preempted request that would have to recompute a prompt that cannot fit is turned away
        then (:meth:`_never_fits`)."""
        c = self.config
        longest = self.max_model_len_for(kv)
        if longest and request.prompt_tokens >= longest:
            return (f"prompt of {request.prompt_tokens} tokens leaves no room for an output token within "
                    f"max_model_len ({longest})")
        if (longest and c.context_overflow == "reject" and request.max_tokens is not None
                and request.prompt_tokens + request.max_tokens > longest):
            return (f"prompt {request.prompt_tokens} + max_tokens {request.max_tokens} exceeds max_model_len "
                    f"({longest}) and context_overflow is 'reject'")
        if not c.chunked_prefill and request.prompt_tokens > c.max_num_batched_tokens:
            return (f"prompt of {request.prompt_tokens} tokens exceeds max_num_batched_tokens "
                    f"({c.max_num_batched_tokens}) and chunked prefill is off")
        unit = c.chunk_unit or kv.block_size
        budget = c.max_num_batched_tokens
        if unit > 1 and c.chunked_prefill and request.prompt_tokens > budget:
            if unit > budget:
                return (f"prompt of {request.prompt_tokens} tokens exceeds max_num_batched_tokens ({budget}) and "
                        f"chunks are cut to multiples of {unit} tokens (chunk_unit), more than the budget")
            budget -= budget % unit  # (alone, its chunks are the budget in whole units)
        if self._deduces:
            tokens = self._deduced_tokens(request, kv)
        else:
            tokens = request.prompt_tokens + request.max_output_tokens - (0 if self._reserve else 1)
        # alone, a prompt is prefilled in chunks of the whole budget (or at once without chunking)
        # (a reserving sequence keeps its window's blocks for the whole prompt, paged.py)
        chunk = budget if c.chunked_prefill and not self._reserve else request.prompt_tokens
        if received:
            need = sequence_blocks(kv, tokens)
        else:
            need = sequence_blocks(kv, tokens, request.prompt_tokens, chunk, reserve=self._reserve)
        if c.reserve_full_prompt and not self._reserve and not received:  # admission asks the whole prompt's blocks
            need = max(need, self._full_prompt_blocks(kv, request.prompt_tokens))
        usable = kv.num_blocks - self._alone_watermark_blocks(kv)
        if self._v0 and not self._reserve and not received and usable < kv.num_blocks:
            # V0 decides NEVER on the prompt alone against the watermark (``can_allocate``,
            # vllm/core/block_manager.py v0.8.5), and its decodes may take every block
            # (``can_append_slots``): the whole sequence is checked against all of them
            prompt = self._full_prompt_blocks(kv, request.prompt_tokens)
            if prompt > usable:
                return (f"its prompt of {request.prompt_tokens} tokens needs {prompt} KV blocks but the cache has "
                        f"{usable} above the watermark")
            usable = kv.num_blocks
        if need > usable:
            return (f"needs {need} KV blocks (prompt {request.prompt_tokens} + max_tokens "
                    f"{tokens - request.prompt_tokens if self._deduces else request.max_output_tokens}) but the "
                    f"cache has {usable}")
        return None

    def _limit_request(self, request, kv=None):
        """``request`` as the engine serves it: ``max_tokens`` cut to ``max_model_len - prompt``
        when longer (vLLM's ``get_max_tokens``). The protocol's optional ``limit_request``,
        set only with a ``max_model_len``: the engines call it on arrival, before
        :meth:`rejection_reason`."""
        longest = self.config.max_model_len if kv is None else self.max_model_len_for(kv)
        # ("auto" without a cache: nothing to cut by; a client's max_tokens under 'reject': rejection_reason)
        return cut_to_max_model_len(request, longest, self.config.context_overflow == "reject")

    def kv_reservation(self, request, kv=None) -> int:
        """KV tokens held from admission: ``prompt + max_tokens`` with ``allocation = "reserve"``
        (what :meth:`Plan.admit` reserves; with ``default_max_tokens = "max_model_len"`` a request
        without max_tokens holds ``max_model_len``, as served on ``kv``), else none (a disaggregated
        decode pool reserves as much when it pulls a request's KV)."""
        if self._deduces:
            return self._deduced_tokens(request, kv)
        return request.prompt_tokens + request.max_output_tokens if self._reserve else 0

    def _deduced_tokens(self, request, kv=None) -> int:
        """What a reserving ``request`` holds with ``default_max_tokens = "max_model_len"`` (or
        ``"auto"`` with a ``max_model_len``): ``prompt + max_tokens``, or without a max_tokens of its own
        all of ``max_model_len`` as served on ``kv`` (TensorRT-LLM: ``default_max_tokens = max_seq_len -
        prompt``, ``BaseWorker._deduce_max_tokens``; GUARANTEED_NO_EVICT then reserves ``prompt +
        max_new_tokens``); with ``reserve_max_model_len`` all of it for every request
        (:func:`reserved_tokens`). Without ``kv``, the one last read (or, before any,
        ``max_model_len`` itself, ``model_context`` with ``"auto"``)."""
        if kv is not None and self._deduced is None:
            self._deduced = self.max_model_len_for(kv)
        longest = self._deduced
        if longest is None:
            c = self.config
            longest = c.model_context if c.max_model_len == "auto" else c.max_model_len
        return reserved_tokens(self.config, request, longest)

    def _chunk_unit(self, kv) -> int:
        """``chunk_unit`` as served with ``kv`` (0: its block size)."""
        if self._unit is None:
            self._unit = kv.block_size
        return self._unit

    def _watermark_blocks(self, kv) -> int:
        if self._v1_watermark:   # vLLM V1's pool counts its null block (BlockPool keeps one): num_blocks + 1
            return int(self.config.watermark * (kv.num_blocks + 1))
        return int(self.config.watermark * kv.num_blocks)

    def _alone_watermark_blocks(self, kv) -> int:
        """The watermark a request alone in the cache must leave: vLLM V1 keeps none with nothing
        running (``allocate_slots(has_scheduled_reqs=bool(self.running))``, vLLM 0.33)."""
        return 0 if self._v1_watermark else self._watermark_blocks(kv)

    # -- one iteration -----------------------------------------------------------------------
    def schedule(self, plan) -> None:
        c = self.config
        self.stall_hint = None
        if self._unit is None:
            self._chunk_unit(plan.kv)
        # vLLM 0.33: the threshold exists so one long prompt cannot starve the others; with
        # at most one request running or waiting there is nobody to starve (a victim a pipeline's
        # batch in flight holds is waiting too: Plan.num_held)
        waiting = len(plan.waiting) + getattr(plan, "num_held", 0)
        self._threshold = c.long_prefill_token_threshold if len(plan.running) + waiting > 1 else 0
        self._swapped_in = []  # swapped in by this plan: no victims for priority preemption
        if c.prefill_first and not plan.has_swapped and plan.waiting and self._window_open(plan):
            self._admit(plan)
            if plan.admitted:
                plan.skip_decode()
                return
        if not self._schedule_running(plan):
            return
        if plan.preempted:
            return
        if plan.has_swapped:
            self._swap_in(plan, self._budget(plan))
            if plan.has_swapped:
                return
        if self._v0_whole:
            # V0 without chunking schedules prompts only at a step's start, when nothing is swapped
            # (``_schedule_default``, v0.8.5): a step that swapped in (or decoded) admits none
            return
        if plan.waiting and self._window_open(plan):
            self._admit(plan)

    def _budget(self, plan) -> int:
        """Tokens the next request may take: what is left of ``max_num_batched_tokens``, less
        the drafter's input slots of every request scheduled so far and of this one (vLLM
        0.33 ``input_budget - draft_slots``; none unless a draft model drafts)."""
        left = self.config.max_num_batched_tokens - plan.num_scheduled_tokens
        slots = plan.draft_input_slots
        return left - slots * (plan.num_scheduled_seqs + 1) if slots else left

    def _schedule_running(self, plan) -> bool:
        """Give running sequences their tokens. False if the running phase had to stop early
        (a sequence preempted itself), in which case nothing else is scheduled.

        ``running_order = "admission"`` is vLLM V1's loop (``Scheduler.schedule``, 0.33): the
        running list in admission order, each request's decode token or prefill chunk in
        turn, so an older request's chunk takes budget and blocks before a newer request's
        decode. When the unfinished prefills are all newer than every decode (always the
        case without ``long_prefill_token_threshold``), that order is "decodes, then
        prefills", and the engine's one-call ``decode_all`` gives the same result; the
        sequence-by-sequence walk runs only when an older prefill precedes a decode, or when
        speculative decoding's drafts (``1 + plan.spec_tokens`` tokens a decode) do not all
        fit the budget: then, as in vLLM, the decodes take their tokens in order, the one the
        budget runs out in gets fewer drafts and the rest wait. ``"decodes_first"`` always
        decodes first (Sarathi-Serve).
        """
        if self.overshoots and plan.made_ahead:
            held = self._held_at_eos(plan)
            if held is not None:
                return self._walk(plan, held)
        fits = self._decodes_fit(plan)
        if self.config.running_order == "admission" and (
                not fits or plan.has_prefilling and not self._prefills_trail(plan)):
            return self._walk(plan, list(plan.running))
        if plan.num_decoding:
            if not fits:
                if not self._walk(plan, [s for s in plan.running if s.status == "decoding"]):
                    return False
            else:
                while not plan.decode_all():
                    if self._key is not None or self._reuses_blocks(plan):
                        # A victim chosen by priority may come before the decode that does not
                        # fit, and vLLM has allocated its slot (caching its full blocks) by then;
                        # and with a prefix cache the decodes before the one that does not fit
                        # have taken their blocks -- evicting cached ones -- before the victim's
                        # come free (and with a window each frees its blocks out of it for the
                        # next): walk the decodes one by one as vLLM does.
                        if not self._walk(plan, [s for s in plan.running if s.status == "decoding"]):
                            return False
                        break
                    if not self._preempt_one(plan):
                        return False
        if plan.has_prefilling:
            return self._walk(plan, plan.prefilling)
        return True

    @staticmethod
    def _reuses_blocks(plan) -> bool:
        """The KV cache keeps freed blocks for prefix hits (which free block a decode takes
        matters), or frees a window's blocks as each decode allocates (a later decode takes what an
        earlier one freed: vLLM's ``allocate_slots`` removes the skipped blocks first)."""
        kv = plan.kv
        return bool(getattr(kv, "prefix_caching", False)) or getattr(kv, "window", None) is not None

    def _decodes_fit(self, plan) -> bool:
        """Every decode's verify tokens fit the budget (the last decode still gets all its drafts;
        draft input slots: see :meth:`_budget`). With drafts per batch size each decode has its
        own drafts (``plan.drafts_for``): summed when the most for everyone would not fit. With
        ``decodes_wait_for_budget`` the budget may be smaller than the decodes (TensorRT-LLM)."""
        k = plan.spec_tokens
        if not k:
            return not (self.config.decodes_wait_for_budget and plan.num_decoding > self._budget(plan))
        longest = self._spec_limit(plan)
        if longest and any(s.status == "decoding" and s.num_computed_tokens + plan.phantom(s) + 1 + k >= longest
                           for s in plan.running):
            return False  # some decode's drafts are cut at max_model_len: the walk does it
        slots = plan.draft_input_slots
        budget = self._budget(plan) + slots
        if plan.num_decoding * (1 + k + slots) <= budget:
            return True
        return sum(1 + plan.drafts_for(s) + slots for s in plan.running if s.status == "decoding") <= budget

    def _spec_limit(self, plan) -> int:
        """With speculation, the longest sequence served (``max_model_len``, 0: none), which a
        decode's drafts stay within (vLLM 0.33 ``Scheduler.schedule``); 0 without speculation."""
        if not plan.spec_tokens:
            return 0
        if self._longest is None:
            self._longest = self.max_model_len_for(plan.kv)
        return self._longest

    def _held_at_eos(self, plan) -> list | None:
        """In a plan made ahead: if a finished request holding its slot stopped at an EOS,
        every running request in the order vLLM walks them (admission order; with
        ``"decodes_first"`` the prefills last), held ones included; else None."""
        running = plan.running
        if len(running) == plan.num_decoding + len(plan.prefilling):
            return None  # nobody holds a slot
        seqs = running.holding()
        if not any(s.status == "finished" and plan.unseen_finish(s) for s in seqs):
            return None
        if self.config.running_order == "decodes_first":
            seqs = [s for s in seqs if s.status != "prefilling"] + [s for s in seqs if s.status == "prefilling"]
        return seqs

    @staticmethod
    def _prefills_trail(plan) -> bool:
        """Every prefilling sequence was admitted after every decoding one."""
        left = len(plan.prefilling)
        for seq in reversed(plan.running):
            if seq.status != "prefilling":
                return False
            left -= 1
            if not left:
                return True
        return True

    def _walk(self, plan, seqs) -> bool:
        """Schedule ``seqs`` in order (vLLM V1's running loop): a decode token or the next
        prefill chunk each, while the budget lasts. When a sequence's blocks do not fit, the
        victim rule picks whom to preempt -- possibly a sequence already scheduled in this
        iteration, whose work is withdrawn -- until they fit or the sequence itself is the
        victim. Then FCFS stops the running phase; the priority policy goes on with the
        next sequence (vLLM 0.33)."""
        threshold = self._threshold
        longest = self._spec_limit(plan)
        for seq in seqs:
            verify = 1 + plan.drafts_for(seq)  # a decode's tokens: its own and the drafts it verifies
            status = seq.status
            if status == "finished":  # holding its slot in a plan made ahead: decoded once more
                # if vLLM cannot know it finished (an EOS, or drafts took it to its max_tokens)
                if plan.unseen_finish(seq) and seq not in plan.preempted:
                    budget = self._budget(plan)
                    if budget <= 0:
                        break
                    n = verify if verify <= budget else budget
                    if longest:
                        n = min(n, longest - seq.num_computed_tokens - plan.phantom(seq) - 1)
                        if n < 1:
                            continue
                    if not self._overshoot(plan, seq, n):
                        return False
                continue
            if status not in ("decoding", "prefilling") or plan.is_scheduled(seq):
                continue  # preempted earlier in this walk, or decoding already
            budget = self._budget(plan)
            if budget <= 0:
                break
            decoding = status == "decoding"
            if decoding:
                n = verify if verify <= budget else budget  # vLLM: min(num_new_tokens, token_budget)
                if longest:  # ... and its input positions below max_model_len (the drafts in flight counted)
                    n = min(n, longest - seq.num_computed_tokens - plan.phantom(seq) - 1)
                    if n < 1:
                        continue  # (vLLM skips it in this step)
            else:
                left = n = seq.num_tokens - seq.num_computed_tokens
                if threshold and n > threshold:
                    n = threshold
                if n > budget:
                    n = budget
                if n < left and self._unit > 1:  # (TensorRT-LLM: a chunk not the last in whole units)
                    n -= n % self._unit
                    if not n:
                        continue  # (and the next prompt's last chunk may fit what is left)
            while not ((plan.decode(seq, n) if verify > 1 else plan.decode(seq)) if decoding
                       else plan.prefill(seq, n)):
                victim = self._victim(plan)
                self._preempt(plan, victim)
                if victim is seq:
                    if self._key is None:
                        return False
                    break
        return True

    def _overshoot(self, plan, seq, tokens: int) -> bool:
        """Decode ``seq`` (finished where vLLM has not seen it) once more, ``tokens`` with its
        drafts, preempting for its slots as for any decode; False if FCFS must stop the running
        phase (``seq`` itself was the victim)."""
        while not (plan.overshoot(seq, tokens) if tokens > 1 else plan.overshoot(seq)):
            victim = self._victim(plan)
            self._preempt(plan, victim)
            if victim is seq:
                return self._key is not None
        return True

    def _window_open(self, plan) -> bool:
        """False while the batching window holds new requests back (it then sets a wake-up)."""
        return self._window is None or not self._window.hold(plan, self.config.max_num_seqs - len(plan.running))

    def _victim(self, plan, candidates=None):
        """Whom to preempt: the most recently admitted running sequence (vLLM FCFS,
        ``self.running[-1]``), or under a waiting order the one it would serve last (vLLM's
        priority policy: ``max(running, key=(priority, arrival_time))``) -- even one already
        scheduled in this iteration. vLLM's arrival times are clock stamps, distinct and in
        arrival order; schedlab's may tie, so ties go to the later arrival. On a pipelined
        instance the choice includes requests whose batch is in flight, as vLLM's ``running``
        does (``plan.running.preemptible()``, :mod:`schedlab.engine.stages`). ``candidates``:
        choose among these running sequences only."""
        running = self._preemptible(plan) if candidates is None else candidates
        key = self._key
        if key is not None:
            return max(running, key=lambda s: (key(s), s.seq_no), default=None)
        return next(reversed(running), None)

    def _preemptible(self, plan):
        """The running sequences a preemption may pick: on a pipelined instance those in flight
        too (its running view's ``preemptible``; vLLM V1 recomputes), else the running view
        itself. Swapping preempts only sequences not in flight (their KV is being written; vLLM
        V0, which swapped, kept a pipeline stage's requests out of the other stages' batches)."""
        running = plan.running
        every = getattr(running, "preemptible", None)  # (a third-party engine's view may lack it)
        return every() if every is not None and self.config.preemption != "swap" else running

    def _preempt_one(self, plan) -> bool:
        """Preempt one victim; False if none is left."""
        victim = self._victim(plan)
        if victim is None:
            return False
        self._preempt(plan, victim)
        return True

    def _preempt(self, plan, victim) -> None:
        """Swap ``victim`` out (``preemption = "swap"``, decoding victims) or recompute it."""
        if self.config.preemption == "swap" and victim.status == "decoding":
            if plan.swap_out(victim):
                return
            if self.config.swap_full == "fail":
                raise SimulationError(
                    f"swap space is full (request {victim.request.id} could not be swapped out) and swap_full = 'fail'; "
                    "vLLM V0 aborts here ('lack of CPU swap space')")
        plan.preempt(victim)

    def _swap_in(self, plan, budget: int) -> int:
        """Swap sequences back in, head of line, while a slot, the budget and the KV cache allow;
        with a ``watermark``, only while the blocks a sequence comes back into leave the
        watermark free (vLLM V0 ``BlockSpaceManager._can_swap``, vllm/core/block_manager.py
        v0.8.5: ``free - touched >= watermark_blocks``, else LATER; the same in every vLLM that
        swapped, so for any ``continuous`` scheduler with a watermark)."""
        kv = plan.kv
        swap_in_blocks = getattr(kv, "swap_in_blocks", None)
        for seq in plan.swapped:
            if budget < 1 or len(plan.running) >= self.config.max_num_seqs:
                break
            # (V1's watermark only while a request runs, as at admission)
            watermark = self._watermark_blocks(kv) if plan.running else self._alone_watermark_blocks(kv)
            need = swap_in_blocks if watermark else None
            if need is not None and kv.num_free_blocks() - need(seq) < watermark:
                if need(seq) > kv.num_blocks - watermark:   # (vLLM V0 waits for ever too: say why, should it stall)
                    self.stall_hint = (f"request {seq.request.id} is swapped out holding {need(seq)} KV blocks, more "
                                       f"than the {kv.num_blocks - watermark} above the watermark: vLLM V0's _can_swap "
                                       "answers LATER for ever (preemption = \"recompute\" turns it away instead)")
                break
            if not plan.swap_in(seq):
                break
            self._swapped_in.append(seq)
            budget -= 1
        return budget

    def _admit(self, plan) -> None:
        c = self.config
        waiting = plan.waiting
        running = plan.running
        while True:
            if plan.has_swapped:  # rule 2: a victim priority preemption swapped out comes back before anyone newer
                return
            budget = self._budget(plan)
            if budget <= 0:
                return
            seq = waiting.peek()
            if seq is None:
                return
            if len(running) >= c.max_num_seqs and not self._make_room(plan, seq):
                return
            hit = plan.cached_tokens(seq)
            n = self._admission_tokens(seq, hit, budget)
            if not n:
                return
            if seq.num_preemptions and not self._reserve:  # (its recompute may need more than its prompt did)
                reason = self._recompute_never_fits(plan.kv, seq, hit)
                if reason is not None:
                    plan.reject(seq, reason)
                    continue
            padding = self._padding(plan, seq, hit)
            if padding and 1 + padding > budget:
                # vLLM: "prefer to not schedule than schedule un-padded" (should nothing else run, for ever)
                self.stall_hint = (f"request {seq.request.id} waits to be padded to a decode's {1 + padding} rows "
                                   f"(speculation) and the budget leaves it {budget}: vLLM schedules nothing in its "
                                   "place; raise max_num_batched_tokens")
                return
            reserve = self._deduced_tokens(seq.request, plan.kv) if self._deduces else 0
            while not (self._kv_allows(plan.kv, seq, n, hit, bool(plan.running))
                       and plan.admit(seq, n, reserve=self._reserve, reserve_tokens=reserve, padding=padding)):
                if not self._make_room(plan, seq):
                    reason = self._never_fits(plan, seq, n, hit)
                    if reason is None:
                        return
                    plan.reject(seq, reason)
                    break
            else:
                self._admitted(seq)

    def _admitted(self, seq) -> None:
        """``seq`` left the waiting queue into the batch (not turned away, not given up on): a
        subclass's hook, called before the next admission (VTC charges the prompt here)."""

    def _never_fits(self, plan, seq, n: int, hit: int) -> str | None:
        """Why waiting ``seq`` can never be admitted with ``n`` tokens, or None. Only a model's
        window layers make it so (:mod:`schedlab.kv_window`): they hold every token of a step, so
        a preempted request recomputing more tokens than it prefilled may need more blocks at
        once than the whole cache -- vLLM would wait for ever; schedlab turns it away. Arrival
        checks the prompt's own prefill (:meth:`rejection_reason`)."""
        kv = plan.kv
        if getattr(kv, "window", None) is None or len(plan.running) or kv.num_used_blocks():
            return None
        need = kv.blocks_needed(seq, n, cached_tokens=hit)
        usable = kv.num_blocks - self._alone_watermark_blocks(kv)
        if need <= usable:
            return None
        return (f"its recompute of {n} tokens in one step needs {need} KV blocks at once (the model's window layers "
                f"keep every token of a step) but the cache has {usable}")

    def _recompute_never_fits(self, kv, seq, hit: int) -> str | None:
        """Why preempted ``seq`` can never recompute its ``num_tokens`` tokens (from its prefix-cache
        ``hit``) in an empty cache, or None: with a model's window layers a chunk holds its window
        blocks for every token it computes, and with ``reserve_full_prompt`` admission asks the
        whole sequence's blocks free -- a recompute longer than its prompt may need more than the
        whole cache (vLLM would wait, or preempt it again, for ever; schedlab turns it away). vLLM V0
        checks the whole sequence against the blocks above the watermark (``can_allocate``,
        block_manager.py v0.8.5: NEVER, and the group is ignored), so a request that grew into the
        watermark while decoding cannot come back: it is turned away as V0 does."""
        if self._v0:
            whole = -(-seq.num_tokens // kv.block_size)
            usable = kv.num_blocks - self._watermark_blocks(kv)
            if whole > usable:
                return (f"its recompute of {seq.num_tokens} tokens needs {whole} KV blocks but the cache has {usable} "
                        "above the watermark (vLLM V0 ignores it: can_allocate says NEVER)")
        window = getattr(kv, "window", None)
        if window is None:
            return None
        c = self.config
        tokens = seq.num_tokens
        chunk = c.max_num_batched_tokens if c.chunked_prefill else tokens
        unit = c.chunk_unit or kv.block_size
        if c.chunked_prefill and chunk < tokens - hit and chunk >= unit > 1:
            chunk -= chunk % unit
        need = -(-tokens // kv.block_size) + window.prefill_peak(tokens, chunk, hit)
        if c.reserve_full_prompt:  # (the gate of _kv_allows, in an empty cache)
            whole = window.held(hit, tokens)
            need = max(need, -(-tokens // kv.block_size) + min(whole, self._window_admission_cap(kv, tokens)))
        usable = kv.num_blocks - self._alone_watermark_blocks(kv)
        if need <= usable:
            return None
        steps = " in one step" if chunk >= tokens - hit else f" in chunks of {chunk}"
        return (f"its recompute of {tokens - hit} tokens{steps} needs {need} KV blocks at once (the model's window "
                f"layers keep every token of a step) but the cache has {usable}")

    def _padding(self, plan, seq, hit: int) -> int:
        """Placeholder drafts for admitting ``seq`` (``Plan.admit(padding=...)``): vLLM 0.33 pads
        a waiting request with one token left to compute -- a prompt cached but for its last
        token, or a one-token prompt -- to a decode's ``1 + k`` rows when the running phase
        scheduled someone (or it has a hit) and no prompt chunk, so the step stays a uniform
        decode batch for CUDA graphs (``Scheduler.schedule``: ``pad_spec_decode``; not with drafts
        per batch size: ``plan.admission_padding`` is 0 then). Not under a threshold below
        ``1 + k`` (vLLM then fails its own assertion)."""
        k = plan.admission_padding
        if not k or seq.num_tokens - hit != 1:
            return 0
        longest = self._spec_limit(plan)
        if longest and seq.num_tokens + k + 1 > longest:
            return 0  # (vLLM pads only with room for the sampled token within max_model_len)
        threshold = self._threshold
        if threshold and threshold < 1 + k:
            return 0
        admitted = plan.admitted
        if any(plan.is_scheduled(s) and s not in admitted for s in plan.prefilling):
            return 0  # a running request's prompt chunk is in the step
        if not hit and plan.num_scheduled_seqs == len(admitted):
            return 0  # nobody from the running phase, and nothing cached
        return k

    def _admission_tokens(self, seq, hit: int, budget: int) -> int:
        """Tokens of waiting ``seq`` to compute if admitted within ``budget`` (0: it must wait)."""
        c = self.config
        n = seq.num_tokens - hit
        threshold = self._threshold
        if threshold and n > threshold and not c.chunked_prefill and not self._v0:
            # vLLM V1 caps a request's tokens at the threshold before it checks that a prompt fits the
            # budget unchunked (Scheduler.schedule's waiting loop, 0.33): without chunked prefill a long
            # prompt still goes in threshold-sized chunks (V0 applied it only when chunking)
            n = threshold
        if n > budget:
            # A fresh prompt waits for a budget it fits in, and without chunking so does a preempted
            # request's recompute (prompt + generated): vLLM V1's waiting loop breaks for a resumed
            # request as for a new one (``not enable_chunked_prefill and num_new_tokens >
            # token_budget``), and V0's ``_schedule_prefills`` fails ``can_schedule`` (v0.8.5, its
            # whole-prefill mode); both start only with a budget that holds max_model_len. Without that
            # guarantee here (max_model_len 0 or "auto", or past the budget) a recompute is chunked, as it was
            # before -- one past the whole budget would wait for ever.
            longest = c.max_model_len if type(c.max_model_len) is int else 0  # ("auto": not known here)
            whole = self._v0_whole or not self._v0 and 0 < longest <= c.max_num_batched_tokens
            if not c.chunked_prefill and (seq.num_preemptions == 0
                                          or whole and n <= c.max_num_batched_tokens):
                return 0
            n = budget
        if c.chunked_prefill and threshold and n > threshold:
            n = threshold
        if c.chunked_prefill and self._unit > 1 and n < seq.num_tokens - hit:
            n -= n % self._unit  # (TensorRT-LLM: a chunk not the last in whole units; 0: it waits)
        return n

    def _kv_allows(self, kv, seq, n: int, hit: int, running: bool = True) -> bool:
        """Admitting ``seq`` with ``n`` tokens would leave at least the watermark free (vLLM V1's
        only while a request is ``running``), and with ``reserve_full_prompt`` its whole sequence
        would fit (vLLM 0.33 ``scheduler_reserve_full_isl``: ``allocate_slots(full_sequence_must_fit=True)``)."""
        watermark = self._watermark_blocks(kv) if running else self._alone_watermark_blocks(kv)
        counts_hits = self.config.admission_counts_hits
        if not counts_hits and hit:   # (TensorRT-LLM: the blocks to completion, reuse or not)
            n, hit = n + hit, 0
        if self._reserve:
            if not watermark and counts_hits:
                return True
            if self._deduces:
                reserve_tokens = self._deduced_tokens(seq.request, kv)
            else:
                reserve_tokens = seq.request.prompt_tokens + seq.request.max_output_tokens
            need = kv.blocks_needed(seq, n, cached_tokens=hit, reserve_tokens=reserve_tokens)
        elif self.config.reserve_full_prompt:
            need = kv.blocks_needed(seq, seq.num_tokens - hit, cached_tokens=hit)
            window = getattr(kv, "window", None)
            if window is not None:  # vLLM caps the window's share (apply_admission_cap)
                whole = window.held(seq.num_computed_tokens + hit, seq.num_tokens)
                need -= whole - min(whole, self._window_admission_cap(kv, seq.num_tokens))
        elif not watermark:
            return True
        else:
            need = kv.blocks_needed(seq, n, cached_tokens=hit)
        return kv.num_free_blocks() - need >= watermark

    def _window_admission_cap(self, kv, tokens: int) -> int:
        """The window blocks vLLM budgets for a request at admission (``max_admission_blocks_per_request``)."""
        return kv.window.admission_cap(self.in_flight_tokens(), self.max_model_len_for(kv) or tokens)

    def _full_prompt_blocks(self, kv, prompt: int) -> int:
        """Blocks ``reserve_full_prompt`` asks free for a fresh prompt of ``prompt`` tokens: one per
        block, and a window's capped at its admission budget."""
        need = -(-prompt // kv.block_size)
        window = getattr(kv, "window", None)
        if window is not None:
            need += min(window.held(0, prompt), self._window_admission_cap(kv, prompt))
        return need

    def could_admit(self, plan, seq, budget: int) -> bool:
        """Whether waiting ``seq`` would pass the slot, budget and KV checks of :meth:`_admit`
        now (without admitting it; priority preemption aside)."""
        if len(plan.running) >= self.config.max_num_seqs:
            return False
        if self._unit is None:
            self._chunk_unit(plan.kv)
        hit = plan.cached_tokens(seq)
        n = self._admission_tokens(seq, hit, budget)
        return bool(n) and self._kv_allows(plan.kv, seq, n, hit, bool(plan.running))

    def _make_room(self, plan, seq) -> bool:
        """With ``priority_preemption``, preempt a lower-priority running sequence for ``seq``:
        one that was running when the iteration began (vLLM V0 preempts for priority before it
        swaps in or admits; the plan cannot withdraw a sequence that joined it)."""
        if not (self.config.priority_preemption and self._priority):
            return False
        joined = set(plan.admitted)
        joined.update(self._swapped_in)
        victim = self._victim(plan, [s for s in self._preemptible(plan) if s not in joined] if joined else None)
        if victim is None or (victim.request.priority, victim.request.arrival_ms) <= (
                seq.request.priority, seq.request.arrival_ms):
            return False
        self._preempt(plan, victim)
        return True
