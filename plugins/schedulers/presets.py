"""Engine presets: the ``continuous`` scheduler with each engine's rules and defaults, as far as
schedlab models them (engines.md §1, §2, §5, §6; what each leaves out is said below).

* ``vllm``    -- vLLM V1: blocks allocated as tokens are computed, recompute preemption of the
  newest request, chunked prefill on, prefix caching on (a ``paged`` cache's default with it),
  vLLM's API-server budget for the run's GPU (2,048 tokens / 256 sequences; 8,192 / 1,024 from
  70 GiB but on an A100; 16,384 / 1,024 from 160 GiB), ``max_model_len`` the run's model's
  context length (prompts that long rejected, ``max_tokens`` cut to the rest; ``"auto"``: the
  longest the KV cache holds, at most that),
  asynchronous scheduling where it is modelled (``async_scheduling = "auto"``: vLLM's default
  since 0.13, vllm-project/vllm PR #27614; ``false`` for earlier versions).
* ``vllm-v0`` -- vLLM V0 (``vllm/core/scheduler.py``, checked against v0.8.5), ``max_model_len``
  the run's model's context. Chunked prefill on for a context over 32,768 tokens unless given
  (``EngineArgs._set_default_args_v0``, since v0.5.3; not with a sliding window or MLA), in a
  2,048-token budget (v0.6.5 on; 512 before), each step as ``_schedule_chunked_prefill``: every
  decode, then started prompts' chunks, then swap-ins, then new prompts from what is left
  (``running_order = "decodes_first"``, ``prefill_first = false``). Otherwise whole prompts in a
  budget of ``max(max_model_len, 2048)``, each step as ``_schedule_default``: prompts only at its
  start and only with nothing swapped, a step with prompts skipping the decodes
  (``prefill_first``), else decodes, then swap-ins if nothing was preempted, and no prompt after
  them; a preempted request's recompute is never split (it waits for the budget). Watermark
  0.01 at admission and swap-in (``BlockSpaceManager.can_allocate`` / ``_can_swap``); a request
  turned away on arrival when its prompt's blocks exceed the pool less the watermark (V0's
  NEVER) or its whole sequence the pool, and after a preemption when its recompute's blocks
  exceed the pool less the watermark (NEVER again); recompute or swap preemption (swap needs swap
  space on the cache); ``context_overflow = "reject"`` (V0-era API servers: HTTP 400 for
  prompt + max_tokens > max_model_len); with ``policy = "priority"`` and no chunking,
  ``priority_preemption`` on (``_schedule_priority_preemption``). Not modelled: in the chunked
  path V0 admits new prompts even after a preemption in the same step and while sequences stay
  swapped (schedlab admits none then), pushes victims back only after that admission, reserves
  a prompt's whole KV at its first chunk, can swap a half-prefilled victim and never applies
  priority (FCFS in effect); V0 preempts for priority one step before the request is admitted
  (schedlab in the same step) and sorts its waiting queue only in steps without prompts; its
  prefix caching's admission, hit and eviction rules (V1's here); its asynchronous output
  processor's extra decode per request; aborting on a full swap space (``swap_full = "fail"``)
  and its 4 GiB default swap space.
* ``orca``    -- Orca (OSDI'22): iteration-level FCFS admission, whole prompts in the same
  iteration as the decodes, KV reserved at admission, so never a preemption. A request with
  ``max_tokens`` reserves ``prompt + max_tokens`` (the Orca paper's rule); one without reserves
  the rest of ``max_model_len`` (``default_max_tokens = "auto"``), which is the run's model's
  context length reduced to what the KV cache holds (``max_model_len = "auto"`` with
  ``model_context``, as ``trtllm`` sizes ``max_seq_len``) unless given; a prompt that leaves no
  room within it is rejected and a longer ``max_tokens`` cut to the rest. With no model named
  and no ``max_model_len`` a request without ``max_tokens`` reserves its own true output, an
  oracle no engine has. Sarathi-Serve's Orca (and FasterTransformer) baseline reserves all of
  ``max_model_len`` for every request, even one with ``max_tokens`` (``OrcaBlockSpaceManager``:
  ``ceil(max_model_len / block_size)`` blocks): ``reserve_max_model_len = true``. No token
  budget: ``max_num_batched_tokens`` is ``max_num_seqs x max_model_len`` (Sarathi-Serve's
  ``OrcaSchedulerConfig``), or 2**53 without a ``max_model_len``, so no prompt the KV cache
  holds is split or rejected for it. Sarathi-Serve's baselines also default to 128 sequences
  (256 here) and have no prefix cache (a ``[kv_cache]`` with ``prefix_caching = true`` is used).
* ``sarathi`` -- Sarathi-Serve's ``SarathiScheduler`` with its defaults: chunked prefill in a
  512-token budget (``chunk_size``), every decode first, then the ongoing prompt's chunk, then
  new requests in arrival order, the last one cut to what is left (``running_order =
  "decodes_first"``); admission only when the whole prompt's blocks fit above a watermark of
  0.01 (``reserve_full_prompt``); 128 sequences; recompute preemption of the newest request;
  no prefix caching (``kv_cache_defaults``), no asynchronous scheduling; ``max_model_len`` the
  run's model's context length (a prompt that long is rejected: Sarathi-Serve ignores only a
  longer one). Not modelled: Sarathi-Serve preempts whenever the pool has no free block
  (``can_append_slot``), even when the decode needs no new block, where schedlab preempts only
  for a block actually needed; it allocates a prompt's whole KV at admission, where schedlab
  allocates chunk by chunk (the same schedule, a lower ``kv_used`` while a prompt is chunked);
  its dynamic chunking schedule (``enable_dynamic_chunking_schedule``, off by default); its
  refusal to start when one ``max_model_len`` sequence does not fit the cache.
* ``trtllm``  -- TensorRT-LLM's PyTorch backend (``CapacityScheduler`` + ``MicroBatchScheduler``):
  ``capacity_policy = "GUARANTEED_NO_EVICT"`` (default) reserves ``prompt + max_tokens`` blocks
  at admission, head of line; ``"MAX_UTILIZATION"`` packs and pauses the newest started request
  when full. A request without ``max_tokens`` reserves ``max_seq_len - prompt`` (the executor's
  ``_deduce_max_tokens``) and still stops at its own output; a longer ``max_tokens`` is cut to
  that, a prompt of ``max_seq_len`` or more is rejected. ``max_seq_len`` is the run's model's
  context length unless given, reduced to what the KV cache holds (``KVCacheManager``: "reduced
  to" ``blocks x tokens_per_block``); 0 (no model) reserves a request's own output, as no
  TensorRT-LLM does. Each iteration gives every generation request its token first, then
  context chunks in arrival order (FIRST_COME_FIRST_SERVED); a chunk that is not a prompt's last
  is cut down to a multiple of the KV block size (``chunk_unit_size = tokens_per_block``), and a
  started prompt whose chunk comes to 0 lets the next one's last chunk in; generation requests past
  ``max_num_tokens`` wait, so the budget may be below ``max_batch_size``. Defaults as
  TensorRT-LLM's ``LlmArgs``: ``max_batch_size`` 2,048, ``max_num_tokens`` 8,192, chunked
  context off, block reuse on in blocks of 32 tokens (``kv_cache_defaults``: a ``[kv_cache]``
  table's own values win), the overlap scheduler on (``overlap_schedule = "auto"``: vLLM's
  asynchronous-scheduling rules, which TensorRT-LLM's overlap loop shares -- the next batch
  planned at the start of the one running, a request at its ``max_tokens`` not scheduled again
  (``GENERATION_TO_COMPLETE``), one at an EOS decoded once more -- off with disaggregation,
  pipeline parallelism or ``[speculative]``, where TensorRT-LLM runs other loops: a run asking for
  it there is refused). Admission asks a request's blocks free without its prefix hit
  (``getRemainingBlocksToCompletion`` / ``getNeededBlocksOneStep`` count the whole prompt), the
  hit still shared once admitted. Not modelled: a request that could reuse blocks another
  context computes in the same step waits a step for them (``beneficialToSkip``: schedlab gives
  it the hit at once, as vLLM does); the ``EQUAL_PROGRESS`` chunking policy; a waiting request whose chunk comes to 0 still holds
  back those behind it (TensorRT-LLM lets a later prompt's last chunk in); partial block reuse
  (``enable_partial_reuse``: schedlab reuses full blocks only); a max_tokens-less request's
  extra decode at an EOS with the overlap scheduler (its ``max_tokens`` is not known to be
  unreached); the attention-DP balancing and the C++ TRT engine backend.

Every key of ``continuous`` stays settable in the ``vllm``, ``vllm-v0``, ``orca`` and ``sarathi``
presets; only the defaults differ. ``trtllm`` has TensorRT-LLM's own keys (:class:`TrtllmConfig`).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedlab.configs import MAX_INT, FieldError, bool_field, float_field, int_field, str_field
from schedlab.errors import ConfigError

from .continuous import (DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS_HELP, ContinuousConfig, ContinuousScheduler,
                         async_scheduling_field)


@attrs.frozen
class VllmConfig(ContinuousConfig):
    max_num_seqs: int = int_field(256, min=1, help="most sequences running at once (vLLM's API server: 256; 1,024 "
                                                   "on the run's GPU if it has 70 GiB or more and is no A100)")
    max_num_batched_tokens: int = int_field(2048, min=1, help="token budget of one iteration (vLLM's API server: "
                                                              "2,048; 8,192 on the run's GPU if it has 70 GiB or more "
                                                              "and is no A100, 16,384 from 160 GiB)")
    chunked_prefill: bool = bool_field(True, help="split prompts that do not fit the remaining budget (on in V1)")
    allocation: str = str_field("grow", choices=("reserve", "grow"), help="V1 allocates as tokens are computed")
    async_scheduling: bool | str = async_scheduling_field("auto")

    #: what vLLM V1 turns on in its cache unless told not to (``enable_prefix_caching``: on for
    #: every model that supports it, ``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``);
    #: the run's assembly applies it to a ``[kv_cache]`` table that leaves the key out
    kv_cache_defaults: ClassVar[dict] = {"prefix_caching": True}
    #: vLLM refuses to start when one sequence of max_model_len does not fit the KV pool
    #: (ContinuousScheduler.start_up_problem; a plan skips such a deployment)
    refuses_unfit_max_model_len: ClassVar[bool] = True
    #: vLLM 0.33's ``--watermark`` (``KVCacheManager.allocate_slots``): kept free when a waiting or
    #: preempted request is admitted while another runs, not otherwise, and never a reason to turn a
    #: request away on arrival (V0's, the ``continuous`` default, is)
    watermark_while_running: ClassVar[bool] = True

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        _check_budget_holds_a_prompt(self, "V1")
        longest = self.max_model_len
        if self.long_prefill_token_threshold and _whole(longest) and longest and \
                self.long_prefill_token_threshold > longest:   # (SchedulerConfig.verify_max_model_len)
            raise ConfigError(f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) is greater than "
                              f"max_model_len ({longest}): vLLM refuses this (no prompt reaches it, so it never "
                              "caps a chunk); lower it or leave it at 0")

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """The settings vLLM picks for those ``table`` leaves out, on the run's ``gpu`` and
        ``model`` (either may be None: not named in the run):

        * ``max_model_len``: the model's context length (``max_position_embeddings``); with
          ``max_model_len = "auto"`` that length is ``model_context``, what the fit to the cache
          is capped at;
        * the API server's batch by the device (``EngineArgs.get_batch_defaults``, vLLM 0.33):
          16,384 tokens and 1,024 sequences from 160 GiB (B200), 8,192 and 1,024 from 70 GiB
          but on an A100 (H100, H200, RTX PRO 6000: "setting large max_num_batched_tokens for
          A100 reduces throughput", PR #17885), else 2,048 and 256;
        * without chunked prefill, a token budget of at least ``max_model_len`` (vLLM:
          ``max(max_model_len, default)``, so that every prompt it accepts fits one step);
        * a defaulted ``max_num_seqs`` at most the token budget, as vLLM caps it.

        The run's assembly applies them (:mod:`schedlab.study.simulation`)."""
        out = {}
        auto = table.get("max_model_len") in ("auto", -1)
        if model is not None and model.max_position_embeddings:
            if "max_model_len" not in table:
                out["max_model_len"] = model.max_position_embeddings
            elif auto and "model_context" not in table:
                out["model_context"] = model.max_position_embeddings
        if gpu is None:
            budget, seqs = 2048, 256
        elif gpu.memory_gib >= 160:
            budget, seqs = 16384, 1024
        elif gpu.memory_gib >= 70 and "a100" not in gpu.name.lower():
            budget, seqs = 8192, 1024
        else:
            budget, seqs = 2048, 256
        context = out.get("model_context", table.get("model_context", 0)) if auto else table.get(
            "max_model_len", out.get("max_model_len", 0))
        if table.get("chunked_prefill") is False and _whole(context):
            budget = max(budget, context)
        if "max_num_batched_tokens" not in table and (gpu is not None or budget != 2048):
            out["max_num_batched_tokens"] = budget
        given = table.get("max_num_batched_tokens", budget)
        if "max_num_seqs" not in table and _whole(given) and given > 0:
            out["max_num_seqs"] = min(seqs, given)
        return out


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_budget_holds_a_prompt(config: ContinuousConfig, version: str) -> None:
    """vLLM refuses to start when, without chunked prefill, the token budget is below
    ``max_model_len`` (V1: ``SchedulerConfig.verify_max_model_len``; V0: ``_verify_args``): a
    longer prompt could never be scheduled. Accepted, such a run would reject those prompts and a
    search over it answer for the shorter ones only."""
    longest = config.max_model_len
    if not config.chunked_prefill and longest != "auto" and longest > config.max_num_batched_tokens:
        raise ConfigError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) is smaller than max_model_len ({longest}): "
            f"vLLM {version} refuses this without chunked prefill (a longer prompt could never be scheduled); raise "
            "max_num_batched_tokens, lower max_model_len or set chunked_prefill = true")


@attrs.frozen
class VllmV0Config(ContinuousConfig):
    """vLLM V0's scheduler (``vllm/core/scheduler.py``, checked against v0.8.5). Without chunked
    prefill, ``_schedule_default``: prompts only at a step's start and only when nothing is
    swapped, a step with prompts skipping the decodes (``prefill_first``), else decodes, then
    swap-ins if nothing was preempted, and no prompt after them (``v0_steps``); with it,
    ``_schedule_chunked_prefill``: decodes, then started prompts' chunks, then new prompts
    (``running_order = "decodes_first"``, ``prefill_first = false``, set by :meth:`run_defaults`
    unless given). See the module docstring for what is not modelled."""

    allocation: str = str_field("grow", choices=("reserve", "grow"), help="V0 allocates as tokens are computed")
    watermark: float = float_field(0.01, min=0.0, max=1.0,
                                   help="share of blocks kept free at admission and swap-in (V0: 0.01)")
    prefill_first: bool = bool_field(
        True, help="an iteration that admits prompts skips decodes (V0 without chunked prefill; run_defaults sets "
                   "false with chunked prefill, as V0's _schedule_chunked_prefill, unless given)")
    context_overflow: str = str_field(
        "reject", choices=("cut", "reject"),
        help="a request whose prompt + its client's max_tokens exceeds max_model_len: 'reject' it (V0-era API "
             "servers: 400 \"maximum context length\", serving_engine._validate_input) or 'cut' max_tokens")
    refuses_unfit_max_model_len: ClassVar[bool] = True  # as V1 (VllmConfig)
    #: V0's step rules in ContinuousScheduler (without chunked prefill: no prompt after the decodes
    #: or swap-ins, a recompute never split; arrival rejection on the prompt against the watermark)
    v0_steps: ClassVar[bool] = True

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        _check_budget_holds_a_prompt(self, "V0")

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """vLLM V0's defaults (v0.6.5-0.8.5, ``vllm/config.py`` ``SchedulerConfig`` and
        ``vllm/engine/arg_utils.py`` ``_set_default_args_v0``) for the keys ``table`` leaves out,
        with the run's ``model`` (None: not named; ``gpu`` plays no part):

        * ``max_model_len``: the model's context length (``max_position_embeddings``);
        * ``chunked_prefill``: on when ``max_model_len`` is over 32,768 ("Enable chunked prefill
          by default for long context (> 32K) models", ``_set_default_args_v0``, since v0.5.3,
          PR #6666) unless the model has a sliding window or latent attention (MLA), where V0
          did not (nor with speculative decoding, LoRA or a multimodal model, which this
          default does not look at);
        * the token budget: ``max(max_model_len, 2048)`` without chunked prefill ("if
          max_model_len is too short, use 2048 as the default value for higher throughput":
          every prompt fits one step), 2048 with it (``_DEFAULT_MAX_NUM_BATCHED_TOKENS``; 512 up
          to v0.6.4, PR #10544); without a model and without chunking, the ``continuous``
          default;
        * with chunked prefill, ``prefill_first = false`` and ``running_order =
          "decodes_first"``: ``Scheduler._schedule_chunked_prefill`` schedules the running
          decodes, then the started prompts' chunks, then swap-ins, then new prompts from the
          budget left -- no prefill-first step;
        * without chunked prefill, ``priority_preemption`` with ``policy = "priority"``:
          ``_schedule_default`` always calls ``_schedule_priority_preemption`` in a step that
          scheduled no prompt (no switch turns it off; its chunked path never does);
        * a defaulted ``max_num_seqs`` (256) at most the token budget."""
        out = {}
        context = table.get("max_model_len", 0)
        if model is not None and model.max_position_embeddings and "max_model_len" not in table:
            out["max_model_len"] = context = model.max_position_embeddings
        if ("chunked_prefill" not in table and _whole(context) and context > 32768
                and not (model is not None and (model.sliding_window or model.kv_latent_dim))):
            out["chunked_prefill"] = True
        chunked = table.get("chunked_prefill", out.get("chunked_prefill")) is True
        if "max_num_batched_tokens" not in table:
            if chunked:
                out["max_num_batched_tokens"] = 2048
            elif _whole(context) and context > 0:
                out["max_num_batched_tokens"] = max(context, 2048)
        if chunked:
            for key, value in (("prefill_first", False), ("running_order", "decodes_first")):
                if key not in table:
                    out[key] = value
        elif table.get("policy") == "priority" and "priority_preemption" not in table:
            out["priority_preemption"] = True
        given = table.get("max_num_batched_tokens", out.get("max_num_batched_tokens"))
        if "max_num_seqs" not in table and _whole(given) and 0 < given < 256:
            out["max_num_seqs"] = given
        return out


@attrs.frozen
class OrcaConfig(ContinuousConfig):
    allocation: str = str_field("reserve", choices=("reserve",),
                                help="Orca reserves KV for prompt + max_tokens at admission (see default_max_tokens)")
    max_num_batched_tokens: int = int_field(
        MAX_INT, min=1, help="Orca has no token budget: by default max_num_seqs x max_model_len with a max_model_len "
                             "(as Sarathi-Serve's OrcaSchedulerConfig sizes it; no step holds more), else 2**53; "
                             "never binds unless set lower")
    default_max_tokens: str = str_field(
        "auto", choices=DEFAULT_MAX_TOKENS,
        help=DEFAULT_MAX_TOKENS_HELP + " (orca: 'auto', so the rest of the run's model's context)")

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """The settings for the keys ``table`` leaves out, with the run's ``model`` (None: not
        named; ``gpu`` plays no part): see :func:`reservation_run_defaults`; and a token budget
        that never binds, ``max_num_seqs x max_model_len`` (``max_model_len = "auto"``: its
        ``model_context``), as Sarathi-Serve's ``OrcaSchedulerConfig.get_max_num_batched_tokens``
        sizes it (2**53, the default, without one)."""
        out = reservation_run_defaults(model, table)
        if "max_num_batched_tokens" not in table:
            longest = table.get("max_model_len", out.get("max_model_len", 0))
            if longest in ("auto", -1):
                longest = table.get("model_context", out.get("model_context", 0))
            seqs = table.get("max_num_seqs", attrs.fields(OrcaConfig).max_num_seqs.default)
            if _whole(longest) and longest > 0 and _whole(seqs) and seqs > 0:
                out["max_num_batched_tokens"] = seqs * longest
        return out


def reservation_run_defaults(model, table: dict) -> dict:
    """``max_model_len`` for a reserving scheduler (``orca``, ``static``) from the run's
    ``model``, where ``table`` leaves it out: ``"auto"`` with ``model_context`` the model's context
    length (``max_position_embeddings``), i.e. that length reduced to what the KV cache holds, as
    the ``trtllm`` preset sizes ``max_seq_len``. With ``default_max_tokens = "auto"`` a request
    without ``max_tokens`` then reserves the rest of it (its true output only with no model and
    no ``max_model_len``, which no engine does)."""
    if model is None or not model.max_position_embeddings or "max_model_len" in table:
        return {}
    out = {"max_model_len": "auto"}
    if "model_context" not in table:
        out["model_context"] = model.max_position_embeddings
    return out


@attrs.frozen
class SarathiConfig(ContinuousConfig):
    max_num_seqs: int = int_field(128, min=1, help="most sequences running at once (Sarathi-Serve's max_num_seqs: 128)")
    max_num_batched_tokens: int = int_field(512, min=1, help="token budget of one iteration, decodes included "
                                                             "(Sarathi-Serve's chunk_size: 512)")
    chunked_prefill: bool = bool_field(True, help="split prompts that do not fit the remaining budget (Sarathi-Serve)")
    allocation: str = str_field("grow", choices=("reserve", "grow"),
                                help="blocks for the whole prompt at admission, then one per new token (see the "
                                     "preset's docstring: allocated chunk by chunk here)")
    running_order: str = str_field(
        "decodes_first", choices=("admission", "decodes_first"),
        help="Sarathi-Serve: every decode first, then ongoing prefill chunks, then new requests ('admission': vLLM V1)")
    watermark: float = float_field(0.01, min=0.0, max=1.0,
                                   help="share of KV blocks kept free at admission (Sarathi-Serve: 0.01)")

    #: Sarathi-Serve has no prefix cache: a [kv_cache] table that leaves the key out has it off
    kv_cache_defaults: ClassVar[dict] = {"prefix_caching": False}

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """``max_model_len``: the run's model's context length (``max_position_embeddings``;
        Sarathi-Serve's ``ModelConfig`` takes it from the model's config), where ``table`` leaves it
        out (None: no model named; ``gpu`` plays no part)."""
        if model is not None and model.max_position_embeddings and "max_model_len" not in table:
            return {"max_model_len": model.max_position_embeddings}
        return {}


def overlap_schedule_field():
    """TensorRT-LLM's overlap scheduler: true, false or ``"auto"``."""

    def check(_inst, attribute, value):
        if not (isinstance(value, bool) or value == "auto"):
            raise FieldError(attribute.name, f"must be true, false or \"auto\", got {value!r}")

    return attrs.field(default="auto", validator=check, metadata={"help": (
        "TensorRT-LLM's overlap scheduler (on unless disable_overlap_scheduler): each batch is planned while the one "
        "before it runs, by the rules of vLLM's asynchronous scheduling, which TensorRT-LLM's PyExecutor shares "
        "(schedlab.engine.ahead); \"auto\": on unless the run has disaggregation, pipeline parallelism or "
        "[speculative], where TensorRT-LLM's own loop is not modelled")})


@attrs.frozen
class TrtllmConfig:
    capacity_policy: str = str_field("GUARANTEED_NO_EVICT", choices=("GUARANTEED_NO_EVICT", "MAX_UTILIZATION"),
                                     help="reserve prompt + max_tokens, or pack and pause started requests")
    max_num_seqs: int = int_field(2048, min=1, help="max_batch_size (TensorRT-LLM's default: 2,048)")
    max_num_batched_tokens: int = int_field(8192, min=1, help="max_num_tokens per iteration (default 8,192); "
                                                              "may be below max_num_seqs: decodes past it wait")
    chunked_prefill: bool = bool_field(False, help="enable_chunked_context (off by default); a chunk that is not "
                                                   "the prompt's last is a multiple of the KV block size")
    max_seq_len: int = int_field(
        0, min=0, help="longest sequence, prompt + output, capped at what the KV cache holds, as TensorRT-LLM "
                       "caps it (default: the run's model's context length): a request without max_tokens reserves "
                       "the rest of it under GUARANTEED_NO_EVICT, a longer max_tokens is cut to it, a prompt that "
                       "leaves no room is rejected (0 = none: a request without max_tokens reserves its own output, "
                       "which no TensorRT-LLM does)")
    overlap_schedule: bool | str = overlap_schedule_field()

    #: what TensorRT-LLM's KvCacheConfig turns on unless told not to: block reuse
    #: (``enable_block_reuse = True``) in blocks of 32 tokens (``tokens_per_block``); the run's
    #: assembly applies them to a ``[kv_cache]`` table that leaves them out
    kv_cache_defaults: ClassVar[dict] = {"prefix_caching": True, "block_size": 32}

    @staticmethod
    def cost_model_defaults(table: dict) -> dict:
        """Without its overlap scheduler (``overlap_schedule = false``) TensorRT-LLM prepares each
        batch after the one before it, so a cost model that can overlap the host's work with the
        GPU's does not (applied to a ``[cost_model]`` table that leaves ``async_scheduling`` out)."""
        return {"async_scheduling": False} if table.get("overlap_schedule") is False else {}

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """``max_seq_len``: the run's model's context length (``max_position_embeddings``), as
        TensorRT-LLM infers it from the model's config when not given (None: no model named)."""
        if model is not None and model.max_position_embeddings and "max_seq_len" not in table:
            return {"max_seq_len": model.max_position_embeddings}
        return {}


def trtllm(config: TrtllmConfig) -> ContinuousScheduler:
    """The ``continuous`` scheduler with TensorRT-LLM's rules (see the module docstring)."""
    grow = config.capacity_policy == "MAX_UTILIZATION"
    longest = config.max_seq_len
    scheduler = ContinuousScheduler(ContinuousConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        chunked_prefill=config.chunked_prefill, allocation="grow" if grow else "reserve",
        # a request's blocks to completion (GNE) or its prompt's (MU) are asked free whatever a prefix
        # hit would share (kvCacheManager getRemainingBlocksToCompletion, getNeededBlocksOneStep)
        admission_counts_hits=False,
        # generation tokens first, then context chunks in whole KV blocks (MicroBatchScheduler)
        running_order="decodes_first", chunk_unit=0, decodes_wait_for_budget=True,
        # max_seq_len, reduced to what the KV cache holds (KVCacheManager); max_tokens deduced from it
        max_model_len="auto" if longest else 0, model_context=longest,
        default_max_tokens="max_model_len" if longest else "output",
        async_scheduling=config.overlap_schedule))
    #: TensorRT-LLM's overlap loop is modelled where vLLM's asynchronous rules are its own: not
    #: with disaggregation, pipelines or speculation, where a run naming it is refused
    scheduler.ahead_key = "overlap_schedule"
    return scheduler


def register_presets(register) -> None:
    register("vllm", ContinuousScheduler, config=VllmConfig,
             help="vLLM V1: grow-as-you-go KV, recompute preemption, chunked prefill, 2048-token budget")
    register("vllm-v0", ContinuousScheduler, config=VllmV0Config,
             help="vLLM V0: prefill-first, whole prompts, watermark 0.01, recompute or swap preemption")
    register("orca", ContinuousScheduler, config=OrcaConfig,
             help="Orca: iteration-level FCFS, KV reserved for prompt + max_tokens (without max_tokens: the rest of "
                  "the model's context), no preemption, no token budget")
    register("sarathi", ContinuousScheduler, config=SarathiConfig,
             help="Sarathi-Serve: chunked prefill in a 512-token budget, decodes first, watermark 0.01, "
                  "128 sequences")
    register("trtllm", trtllm, config=TrtllmConfig,
             help="TensorRT-LLM: GUARANTEED_NO_EVICT (reserve) or MAX_UTILIZATION (pack and pause)")
