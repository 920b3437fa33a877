"""Engine presets: the ``continuous`` scheduler with each engine's defaults (engines.md §1, §2, §5, §6).

* ``vllm``    -- vLLM V1: blocks allocated as tokens are computed, recompute preemption of the
  newest request, chunked prefill on, prefix caching on (a ``paged`` cache's default with it),
  vLLM's API-server budget for the run's GPU (2,048 tokens / 256 sequences; 8,192 / 1,024 from
  70 GiB but on an A100; 16,384 / 1,024 from 160 GiB), ``max_model_len`` the run's model's
  context length (prompts that long rejected, ``max_tokens`` cut to the rest; ``"auto"``: the
  longest the KV cache holds, at most that),
  asynchronous scheduling where it is modelled (``async_scheduling = "auto"``: vLLM's default
  since 0.13, vllm-project/vllm PR #27614; ``false`` for earlier versions).
* ``vllm-v0`` -- vLLM V0: prefill-first iterations (a step with prompts skips decodes), whole
  prompts, watermark 0.01, recompute or swap preemption (swap needs swap space on the cache),
  ``max_model_len`` the run's model's context and a token budget of ``max(max_model_len, 2048)``
  (512 with chunked prefill), as V0's ``SchedulerConfig`` set them.
* ``orca``    -- Orca (OSDI'22): iteration-level FCFS admission with KV reserved for each
  request's maximum length, so never a preemption.
* ``trtllm``  -- TensorRT-LLM: ``capacity_policy = "GUARANTEED_NO_EVICT"`` reserves prompt +
  max output (default); ``"MAX_UTILIZATION"`` packs and pauses started requests when full.
  Chunked prefill off by default. (TensorRT-LLM uses 32 tokens per block: set
  ``[kv_cache] block_size = 32``.)

Every key of ``continuous`` stays settable; only the defaults differ.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedlab.configs import bool_field, float_field, int_field, str_field
from schedlab.errors import ConfigError

from .continuous import ContinuousConfig, ContinuousScheduler, async_scheduling_field


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

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        _check_budget_holds_a_prompt(self, "V1")

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
    allocation: str = str_field("grow", choices=("reserve", "grow"), help="V0 allocates as tokens are computed")
    watermark: float = float_field(0.01, min=0.0, max=1.0, help="share of blocks kept free at admission (V0: 0.01)")
    prefill_first: bool = bool_field(True, help="an iteration that admits prompts skips decodes")
    refuses_unfit_max_model_len: ClassVar[bool] = True  # as V1 (VllmConfig)

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        _check_budget_holds_a_prompt(self, "V0")

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """vLLM V0's ``SchedulerConfig`` defaults (0.4-0.6, ``vllm/config.py``) for the keys
        ``table`` leaves out, with the run's ``model`` (None: not named; ``gpu`` plays no part):

        * ``max_model_len``: the model's context length (``max_position_embeddings``);
        * the token budget: ``max(max_model_len, 2048)`` without chunked prefill ("if
          max_model_len is too short, use 2048 as the default value for higher throughput":
          every prompt fits one step), 512 with it ("the best balance between ITL and TTFT on
          A100"); without a model and without chunking, the ``continuous`` default;
        * a defaulted ``max_num_seqs`` (256) at most the token budget."""
        out = {}
        context = table.get("max_model_len", 0)
        if model is not None and model.max_position_embeddings and "max_model_len" not in table:
            out["max_model_len"] = context = model.max_position_embeddings
        if "max_num_batched_tokens" not in table:
            if table.get("chunked_prefill") is True:
                out["max_num_batched_tokens"] = 512
            elif _whole(context) and context > 0:
                out["max_num_batched_tokens"] = max(context, 2048)
        given = table.get("max_num_batched_tokens", out.get("max_num_batched_tokens"))
        if "max_num_seqs" not in table and _whole(given) and 0 < given < 256:
            out["max_num_seqs"] = given
        return out


@attrs.frozen
class OrcaConfig(ContinuousConfig):
    allocation: str = str_field("reserve", choices=("reserve",), help="Orca reserves KV for the maximum length")
    max_num_batched_tokens: int = int_field(65536, min=1, help="Orca has no token budget; a large one")


@attrs.frozen
class TrtllmConfig:
    capacity_policy: str = str_field("GUARANTEED_NO_EVICT", choices=("GUARANTEED_NO_EVICT", "MAX_UTILIZATION"),
                                     help="reserve prompt + max output, or pack and pause started requests")
    max_num_seqs: int = int_field(256, min=1, help="max_batch_size")
    max_num_batched_tokens: int = int_field(8192, min=1, help="max_num_tokens per iteration")
    chunked_prefill: bool = bool_field(False, help="enable_chunked_context (off by default)")


def trtllm(config: TrtllmConfig) -> ContinuousScheduler:
    grow = config.capacity_policy == "MAX_UTILIZATION"
    return ContinuousScheduler(ContinuousConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        chunked_prefill=config.chunked_prefill, allocation="grow" if grow else "reserve"))


def register_presets(register) -> None:
    register("vllm", ContinuousScheduler, config=VllmConfig,
             help="vLLM V1: grow-as-you-go KV, recompute preemption, chunked prefill, 2048-token budget")
    register("vllm-v0", ContinuousScheduler, config=VllmV0Config,
             help="vLLM V0: prefill-first, whole prompts, watermark 0.01, recompute or swap preemption")
    register("orca", ContinuousScheduler, config=OrcaConfig,
             help="Orca: iteration-level FCFS with KV reserved for the maximum length, no preemption")
    register("trtllm", trtllm, config=TrtllmConfig,
             help="TensorRT-LLM: GUARANTEED_NO_EVICT (reserve) or MAX_UTILIZATION (pack and pause)")
