"""Step vLLM 0.33's own V1 ``Scheduler`` through a case, on the CPU, with no model.

The set-up follows vLLM 0.33.0's scheduler unit tests (``tests/v1/core/utils.py``
``create_scheduler``, ``tests/v1/core/test_scheduler.py``): a ``ModelConfig`` read from a
local tiny model config (no hub access), ``SchedulerConfig``/``CacheConfig`` from the case, a
single full-attention KV cache group of ``num_blocks + 1`` blocks (``BlockPool`` keeps one as
its null block), and ``Scheduler(vllm_config, kv_cache_config, block_size, ...)``.

One engine step is ``schedule()`` then ``update_from_output()`` with one sampled token for each
scheduled request whose prefill is complete after this step (``not request.is_prefill_chunk``)
and none for a prefill chunk -- what the model runner returns (``vllm/v1/engine/core.py``
``EngineCore.step``). A step that schedules tokens lasts 1 ms; a step that schedules none
(for instance one that only preempted) takes no time, as ``EngineCore.step`` runs no model
for it; with nothing to schedule and nothing left to arrive, the run has stalled.

With ``pipeline_parallel = P`` > 1 the engine core is ``EngineCore.step_with_batch_queue`` with a
queue of ``P`` batches (``max_concurrent_batches``), stepped as its code reads: schedule and
queue a batch -- an empty one too, which occupies its slot and is back with the batch before it
(the workers answer in order) -- and schedule again while the queue has room and the batch
computed something or the scheduler has requests; otherwise block on the oldest batch, then
``update_from_output`` with what it sampled. A batch that computes anything
takes 1 ms on each of ``P`` stages in launch order (schedlab's :class:`~schedlab.engine.stages.StageClock`,
no sends; planning ahead, its first stage waits for the tokens its decodes embed, back with the
batches that sampled them: :meth:`~schedlab.engine.stages.Stagger.ready`), as the schedlab side's :class:`~schedlab.diffcheck.schedlab_side.OneMsStages` times
it; requests that arrive meanwhile are added once the engine is back from the oldest batch.
What a batch samples is fixed when it is scheduled (the model runner's view): a token for every
request whose prefill completes in it, kept by ``update_from_output`` unless the request has
finished meanwhile -- even one preempted while the batch was in flight.

With ``--vllm-set async_scheduling=true`` the vLLM side runs as vLLM has by default since 0.13:
its ``AsyncScheduler`` behind a batch queue of 2 on one stage (``VllmConfig.max_concurrent_batches``),
so each batch is scheduled while the one before it computes. A request in flight is scheduled
again at once with a placeholder for its token (``num_output_placeholders``), except when that
token is its ``max_tokens``-th (one at an EOS is scheduled once more); requests that arrive
meanwhile wait for the batch after. schedlab's ``vllm`` preset follows the vLLM side's setting
(:func:`schedlab.vllm_diff.schedlab_side.tables`). vLLM on a CPU turns ``async_scheduling`` off
in its config -- a platform check -- but the rules are the ``AsyncScheduler``'s, which the
harness builds itself.

A request with a ``max_tokens`` above its output (the ``eos`` group) stops at an EOS: its last
sampled token is the model's EOS id, which its sampling parameters know as vLLM's input
processor sets them (``update_from_generation_config``); the others ignore EOS and stop at
their ``max_tokens``. Planning ahead with ``pipeline_parallel = P`` > 1 the queue holds ``P + 1``
batches (the V2 model runner's ``max_concurrent_batches``) and is stepped exactly as
``step_with_batch_queue`` reads -- schedule while the queue has room, an empty batch too -- since
the ``AsyncScheduler`` lets a request decode again only ``P`` ``schedule()`` calls after its last
token was scheduled (``decode_stagger``, counted in every call); with nothing in flight it spins,
as vLLM's loop does, until a decode is due. The scheduler's ``ParallelConfig`` has the stages
(``decode_stagger`` reads them; the rest of the scheduler only formats its output by them).

With speculative decoding (the ``spec``, ``pipeline_spec`` and ``pipeline_dynamic_k`` groups) the ``VllmConfig`` carries a
``SpeculativeConfig`` (n-gram, or a draft model / EAGLE head whose config is the tiny model's,
never loaded). After every step the harness hands the scheduler the drafts the model runner
would propose -- ``num_spec_tokens_to_schedule`` for each scheduled request that sampled a
token, none for a prompt chunk (``update_draft_token_ids``, as ``EngineCore.post_step``; on a
pipeline as each batch lands, though when vLLM's engine core takes them there is a race of its
threads) -- and a decode samples the drafts
schedlab's acceptance draws accept (:meth:`schedlab.speculative.Speculation.accepted`, seed 0),
plus one token: both sides accept the same. A padded decode's placeholder drafts (-1) are
all rejected. Requests hash their blocks with vLLM's lookahead for EAGLE
(``num_hash_lookahead_tokens``). With asynchronous scheduling the scheduler itself puts
placeholders (-1) for the drafts of the batch in flight (``AsyncScheduler._update_after_schedule``)
and the workers fill them in, so the harness hands it no drafts; every placeholder of a decode stands for a real draft then, and only a padded
admission's (a request scheduled from the waiting queue) are all rejected. The tokens a batch
samples are decided when it is scheduled, from the request's output so far -- its batches in
flight included, as the model runner has them.

A case with a window (``window_tokens`` and ``window_groups``) gets vLLM's hybrid KV cache manager
as a model with full-attention and sliding-window layers would: one layer of each kind per group --
``full.0`` with a ``FullAttentionSpec``, ``swa.0`` ... with a ``SlidingWindowSpec`` of
``sliding_window = window_tokens``, all of one page size -- grouped by vLLM's own
``kv_cache_planning._get_kv_cache_groups_uniform_page_size`` (one full-attention group and
``window_groups`` sliding-window groups) and laid out over one pool of ``num_blocks + 1`` blocks by
``get_kv_cache_config_from_groups`` (``kv_cache_tensors`` aliasing one allocation). Its scheduler then
has a ``HybridKVCacheCoordinator`` (with prefix caching; ``KVCacheCoordinatorNoPrefixCache`` without)
and a ``SlidingWindowManager`` per window group. With ``kv_steps`` the runner also compares its
block pool with schedlab's after every step (:mod:`.kv_steps`).

Requests arrive at the start of their iteration, in (arrival, id) order, with
``arrival_time = arrival + id * 1e-6`` so that the priority policy's ties (``Request.__lt__``
and the victim choice ``max(running, key=(priority, arrival_time))``) follow arrival order as
with real, distinct clock readings, and schedlab's tie-break by arrival order.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile

from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Sides
from schedlab.diffcheck.cli import VersionError
from schedlab.diffcheck.tokens import output_token_id, prompt_token_ids
from schedlab.model import Request

from .case import Outcome
from .kv_steps import MODES as KV_STEP_MODES
from .kv_steps import applies, first_difference
from .schedlab_side import speculation

VLLM_VERSION = "0.33.0"

# A Llama-shaped config.json small enough for ModelConfig to read; no weights are ever loaded.
TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": 1024,
    "max_position_embeddings": MAX_MODEL_LEN, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
    "rms_norm_eps": 1e-6,
}
#: ... and the model runner vLLM 0.33 picks on a GPU, V2 (``VllmConfig.use_v2_model_runner``; a CPU
#: without Triton falls back to V1), whose rules the configs then follow: asynchronous scheduling
#: with the n-gram drafter and on pipelines (the scheduler's own rules are the same on both but for
#: pipelines planned ahead, staggered on V2, and the drafter's skipped passes)
ENVIRONMENT = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false", "VLLM_USE_V2_MODEL_RUNNER": "1"}
EOS_TOKEN_ID = TINY_MODEL_CONFIG["eos_token_id"]
ARRIVAL_TIE_BREAK = 1e-6
MAX_EMPTY_STEPS = 1000


class VllmVersionError(VersionError):
    pass


def set_environment() -> None:
    """What vLLM needs to import and build its configs on a CPU without the hub (kept if set)."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)


class VllmRunner:
    """Holds the imported vLLM pieces and the tiny model config; :meth:`run` steps one case.

    :param allow_other_version: run a vLLM other than 0.33.0 (the rules this harness and its
        notes cite may have moved).
    :param kv_steps: compare the block pool with schedlab's after every step (:mod:`.kv_steps`):
        ``window`` (the cases with a window), ``all`` or ``off``; a difference is the run's error.
    :param engine: ignored by those comparisons, which run on the ``reference`` engine: the fast
        engine plans no iteration of a bulk run of decodes (a window's too).
    :param prefix_retention: vLLM's ``CacheConfig.prefix_cache_retention_interval`` -- which blocks of
        a sliding-window group it caches: ``"default"`` (0.33's ``0``: only those a hit at a prompt's
        replay boundary or a shared-prefix junction needs), ``"dense"`` (``None``: every full
        block, as schedlab has it) or a number of tokens.
    """

    def __init__(self, *, allow_other_version: bool = False, kv_steps: str = "off", engine: str = "fast",
                 prefix_retention: str = "default"):
        self.prefix_retention = prefix_retention
        if kv_steps not in KV_STEP_MODES:
            raise ValueError(f"kv_steps must be one of {', '.join(KV_STEP_MODES)}, not {kv_steps!r}")
        self.kv_steps = kv_steps
        self.engine = engine
        self._ours: dict = {}  # the schedlab runners of the step comparisons by engine, made when first needed
        self.last_steps: list[tuple] = []  # the pool after each step of the last run (.kv_steps)
        set_environment()
        logging.getLogger("vllm").setLevel(logging.ERROR)  # its warnings about CPU kernels do not concern us
        import vllm

        self.version = vllm.__version__
        if self.version.split("+")[0] != VLLM_VERSION and not allow_other_version:
            raise VllmVersionError(f"vLLM {self.version} is installed; this harness follows vLLM {VLLM_VERSION} "
                                   "(pip install 'schedlab[vllm]'), or pass --allow-other-vllm")
        import torch
        from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.core.kv_cache_planning import (_get_kv_cache_groups_uniform_page_size,
                                                    get_kv_cache_config_from_groups)
        from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager, register_all_kvcache_specs
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.v1.structured_output import StructuredOutputManager

        self._v = dict(torch=torch, CacheConfig=CacheConfig, ParallelConfig=ParallelConfig,
                       SchedulerConfig=SchedulerConfig, VllmConfig=VllmConfig, SamplingParams=SamplingParams,
                       sha256=sha256, get_request_block_hasher=get_request_block_hasher, Scheduler=Scheduler,
                       AsyncScheduler=AsyncScheduler,
                       register_all_kvcache_specs=register_all_kvcache_specs, FullAttentionSpec=FullAttentionSpec,
                       KVCacheConfig=KVCacheConfig, KVCacheGroupSpec=KVCacheGroupSpec,
                       ModelRunnerOutput=ModelRunnerOutput, DraftTokenIds=DraftTokenIds,
                       SpeculativeConfig=SpeculativeConfig, Request=Request, RequestStatus=RequestStatus,
                       StructuredOutputManager=StructuredOutputManager, SlidingWindowSpec=SlidingWindowSpec,
                       SlidingWindowManager=SlidingWindowManager,
                       groups_uniform_page_size=_get_kv_cache_groups_uniform_page_size,
                       config_from_groups=get_kv_cache_config_from_groups)
        self._model_dir = tempfile.TemporaryDirectory(prefix="vllm_diff_model_")
        with open(os.path.join(self._model_dir.name, "config.json"), "w") as f:
            json.dump(TINY_MODEL_CONFIG, f)
        self.model_config = ModelConfig(model=self._model_dir.name, dtype="float16", seed=0,
                                        skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN)
        init_none_hash(sha256)  # vLLM's module-level seed of the hash chain; the same every time

    def configure_ours(self, ours) -> None:
        """Give schedlab's runner this side's ``prefix_retention`` (its prefix cache's ``retention``)."""
        ours.retention = self.prefix_retention

    def scheduler_config_kwargs(self, case: Case, sides: Sides | None) -> dict:
        s = case.settings
        kwargs = dict(max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                      max_model_len=s.max_model_len, long_prefill_token_threshold=s.long_prefill_token_threshold,
                      enable_chunked_prefill=True, is_encoder_decoder=False, policy=s.policy, watermark=0.0,
                      async_scheduling=False)
        if sides is not None:
            kwargs.update(sides.engine)
        return kwargs

    def validate(self, case: Case, sides: Sides | None = None) -> None:
        """Raise TypeError or ValueError if vLLM refuses ``sides``."""
        self.scheduler(case, sides)

    def scheduler(self, case: Case, sides: Sides | None = None):
        """A fresh vLLM ``Scheduler`` for ``case`` (raises if vLLM's config post-processing
        changed a setting the comparison relies on)."""
        v = self._v
        s = case.settings
        kwargs = self.scheduler_config_kwargs(case, sides)
        scheduler_config = v["SchedulerConfig"](**kwargs)
        cache_config = v["CacheConfig"](block_size=s.block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                                        enable_prefix_caching=s.prefix_caching, **self._retention())
        vllm_config = v["VllmConfig"](scheduler_config=scheduler_config, model_config=self.model_config_for(case),
                                      cache_config=cache_config,
                                      parallel_config=v["ParallelConfig"](pipeline_parallel_size=s.pipeline_parallel),
                                      speculative_config=self.speculative_config(case))
        asynchronous = bool(kwargs.get("async_scheduling"))
        for key, value in kwargs.items():
            if key in ("max_model_len", "is_encoder_decoder", "async_scheduling"):
                continue  # async_scheduling: vLLM turns it off on a CPU; the rules are the class's below
            if getattr(scheduler_config, key) != value:
                raise AssertionError(f"vLLM changed scheduler setting {key}: {value!r} -> "
                                     f"{getattr(scheduler_config, key)!r}")
        if cache_config.block_size != s.block_size or cache_config.enable_prefix_caching != s.prefix_caching:
            raise AssertionError("vLLM changed the cache settings")
        if s.window is None:
            spec = v["FullAttentionSpec"](block_size=s.block_size, num_kv_heads=1, head_size=1,
                                          dtype=v["torch"].float32)
            kv_cache_config = v["KVCacheConfig"](num_blocks=s.num_blocks + 1, kv_cache_tensors=[],
                                                 kv_cache_groups=[v["KVCacheGroupSpec"](["layer"], spec)])
        else:
            kv_cache_config = self.hybrid_kv_cache_config(case, vllm_config)
        cache_config.num_gpu_blocks = s.num_blocks + 1
        v["register_all_kvcache_specs"](vllm_config)
        scheduler_class = v["AsyncScheduler"] if asynchronous else v["Scheduler"]
        return scheduler_class(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=s.block_size,
                              log_stats=True, structured_output_manager=v["StructuredOutputManager"](vllm_config))

    def _retention(self) -> dict:
        """``CacheConfig`` keywords for :attr:`prefix_retention` (none for vLLM's default)."""
        if self.prefix_retention == "default":
            return {}
        if self.prefix_retention == "dense":
            return {"prefix_cache_retention_interval": None}
        return {"prefix_cache_retention_interval": int(self.prefix_retention)}

    def hybrid_kv_cache_config(self, case: Case, vllm_config):
        """vLLM's ``KVCacheConfig`` of a model with one full-attention layer and ``window_groups``
        sliding-window layers of ``window_tokens`` (all of one page size): grouped and laid out
        by vLLM's own planning (see the module docstring), ``num_blocks + 1`` blocks shared."""
        v = self._v
        s = case.settings
        page = dict(block_size=s.block_size, num_kv_heads=1, head_size=1, dtype=v["torch"].float32)
        specs = {"full.0": v["FullAttentionSpec"](**page)}
        for i in range(s.window_groups):
            specs[f"swa.{i}"] = v["SlidingWindowSpec"](**page, sliding_window=s.window_tokens)
        groups = v["groups_uniform_page_size"](specs)
        kinds = [type(g.kv_cache_spec).__name__ for g in groups]
        if kinds != ["FullAttentionSpec"] + ["SlidingWindowSpec"] * s.window_groups:
            raise AssertionError(f"vLLM grouped the layers otherwise: {kinds}")
        cache_config = vllm_config.cache_config
        if cache_config.kv_cache_layout is None:
            cache_config.kv_cache_layout = "NHD"  # (the engine core resolves it from the workers' backends)
        config = v["config_from_groups"](vllm_config, groups,
                                         (s.num_blocks + 1) * specs["full.0"].page_size_bytes)
        if config.num_blocks != s.num_blocks + 1:
            raise AssertionError(f"vLLM laid out {config.num_blocks} blocks, not {s.num_blocks + 1}")
        return config

    def model_config_for(self, case: Case):
        """The tiny model's ``ModelConfig`` at ``case``'s ``max_model_len`` (a copy when it is not
        the harness's default)."""
        longest = case.settings.max_model_len
        if longest == self.model_config.max_model_len:
            return self.model_config
        config = copy.copy(self.model_config)
        config.max_model_len = longest
        return config

    def speculative_config(self, case: Case):
        """vLLM's ``SpeculativeConfig`` for ``case`` (None without speculation): n-gram, or a
        draft model / EAGLE head read from the tiny model's config (never loaded)."""
        s = case.settings
        if not s.num_speculative_tokens:
            return None
        kwargs = dict(method=s.spec_method, num_speculative_tokens=s.num_speculative_tokens,
                      target_model_config=self.model_config_for(case), target_parallel_config=self._v["ParallelConfig"]())
        if s.k_by_batch_size:
            kwargs["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in s.k_by_batch_size]
        if s.spec_method == "ngram":
            kwargs.update(prompt_lookup_max=3, prompt_lookup_min=1)
        else:
            kwargs.update(model=self._model_dir.name)
        return self._v["SpeculativeConfig"](**kwargs)

    def _request(self, r, block_size: int, hash_lookahead: int = 0):
        v = self._v
        if r.ignore_eos:
            params = v["SamplingParams"](max_tokens=r.limit, ignore_eos=True)
        else:  # it stops at the EOS its last token is (_Trace.schedule), or at max_tokens
            params = v["SamplingParams"](max_tokens=r.limit)
            params.update_from_generation_config({}, eos_token_id=EOS_TOKEN_ID)  # (vLLM's input processor)
        return v["Request"](request_id=f"{r.id:04d}", prompt_token_ids=prompt_token_ids(r), sampling_params=params,
                            pooling_params=None, arrival_time=r.arrival + r.id * ARRIVAL_TIE_BREAK,
                            priority=r.priority,
                            block_hasher=v["get_request_block_hasher"](block_size, v["sha256"], hash_lookahead))

    def run(self, case: Case, sides: Sides | None = None) -> tuple[dict[int, Outcome], str | None]:
        """Per-request outcomes and, if the run stalled, why."""
        if case.settings.pipeline_parallel > 1 or self.scheduler_config_kwargs(case, sides)["async_scheduling"]:
            return self.run_pipelined(case, sides)
        sched = self.scheduler(case, sides)
        trace = _Trace(self, case, sched)
        now = 0
        empty_steps = 0
        error = None
        while True:
            trace.arrive(now)
            trace.abort(now)
            if trace.livelocked(now):
                error = trace.livelock_error(now)
                break
            if all(req.is_finished() for req in trace.live.values()):
                if trace.all_arrived:
                    break
                now = trace.next_arrival
                continue
            out, sampled = trace.schedule(now)
            if out.total_num_scheduled_tokens:
                trace.abort(now + 1)  # (those that came during the step, before its output: EngineCore.step)
            for rid, tokens in zip(out.num_scheduled_tokens, sampled):
                if tokens and not trace.live[rid].is_finished():  # tokens at the end of this 1 ms step
                    trace.token(rid, now + 1, len(tokens))
            trace.update(out, sampled)
            if out.total_num_scheduled_tokens:
                now += 1
                empty_steps = 0
                continue
            empty_steps += 1
            if out.preempted_req_ids and empty_steps < MAX_EMPTY_STEPS:
                continue  # a step that only preempted runs no model: schedule again at once
            if not trace.all_arrived:
                now = trace.next_arrival
                continue
            error = f"vLLM stalled at {now} ms: it schedules nothing and nothing is left to arrive"
            break
        return trace.outcomes(), self.check_steps(case, sides, trace, error)

    def check_steps(self, case: Case, sides: Sides | None, trace, error: str | None) -> str | None:
        """``error``, and with ``kv_steps`` the first step where schedlab's block pool differs
        from vLLM's (:func:`.kv_steps.first_difference`)."""
        self.last_steps = trace.steps
        if not applies(self.kv_steps, case):
            return error
        # (the fast engine runs decodes in bulk, planning no iteration: the reference engine plans each)
        engine = "reference"
        ours = self._ours.get(engine)
        if ours is None:
            from .schedlab_side import SchedlabRunner

            ours = self._ours[engine] = SchedlabRunner(engine)
            ours.record_steps = True
            self.configure_ours(ours)
        _, failed = ours.run(case, sides)
        if failed is not None:
            return error  # (schedlab failed or turned requests away: the comparison of outcomes shows it)
        difference = first_difference(trace.steps, ours.steps)
        return "; ".join(e for e in (error, difference) if e) or None

    def run_pipelined(self, case: Case, sides: Sides | None = None) -> tuple[dict[int, Outcome], str | None]:
        """:meth:`run` through vLLM's batch queue of ``pipeline_parallel`` batches, or of 2 on one
        stage with asynchronous scheduling, or of ``P + 1`` on ``P`` stages planning ahead (the
        V2 model runner's rules: every ``schedule()`` call counts towards a request's next decode,
        ``AsyncScheduler.decode_stagger``, so the queue is stepped exactly as
        ``step_with_batch_queue`` reads, empty batches too). See the module docstring."""
        from collections import deque

        from schedlab.engine.stages import StageClock

        stages = case.settings.pipeline_parallel
        sched = self.scheduler(case, sides)
        ahead = stages > 1 and self.scheduler_config_kwargs(case, sides)["async_scheduling"]
        # VllmConfig.max_concurrent_batches
        queue_size = stages + 1 if ahead else stages if stages > 1 else 2
        trace = _Trace(self, case, sched)
        clock = StageClock(stages)
        queue: deque = deque()  # newest at the left, as vLLM's batch_queue
        now = 0.0
        empty_steps = 0
        error = None
        while True:
            trace.arrive(now)
            trace.abort(now)
            if trace.livelocked(now):
                error = trace.livelock_error(now)
                break
            if not sched.has_requests() and not queue:
                if trace.all_arrived:
                    break
                now = float(trace.next_arrival)
                continue
            if sched.has_requests():
                out, executed = _queue_batch(trace, clock, queue, now)
                idle = not executed and not any(entry[0].total_num_scheduled_tokens for entry in queue)
                if ahead and not idle and len(queue) < queue_size:
                    continue  # (model_executed or has_requests): schedule again before blocking
                if not ahead and (executed or out.preempted_req_ids):
                    empty_steps = 0 if executed else empty_steps + 1
                    if len(queue) < queue_size and empty_steps < MAX_EMPTY_STEPS:
                        continue  # schedule again before blocking on the oldest batch
                elif idle:
                    # Nothing in flight and nothing to schedule: vLLM queues empty batches, each
                    # done at once, until a request arrives -- or planning ahead, until a request's
                    # decode is due (each call counts); none of them changes anything else.
                    if ahead:
                        queue.clear()
                    if not sched.has_unfinished_requests():
                        queue.clear()  # that schedule only told the workers of finished requests
                        continue
                    if ahead and any(r.next_decode_eligible_step > sched.current_step for r in sched.running):
                        continue
                    if not trace.all_arrived:
                        now = float(trace.next_arrival)
                        continue
                    error = f"vLLM stalled at {int(now)} ms: it schedules nothing and nothing is left to arrive"
                    break
            now = _land_oldest(trace, queue, now)
        return trace.outcomes(), self.check_steps(case, sides, trace, error)


def _queue_batch(trace, clock, queue, now: float) -> tuple:
    """``schedule()`` at ``now`` and the batch into vLLM's queue (newest at the left), timed by
    the stages' ``clock``: 1 ms a stage, or none for an empty batch, which runs no model but is
    back with the batch before it (the workers answer in order). Returns its output and whether
    it computed anything."""
    out, sampled = trace.schedule(now)
    executed = out.total_num_scheduled_tokens > 0
    start = now
    if executed and queue:  # a decode of a token still in flight: the first stage waits for it
        mine = {rid for rid, tokens in zip(out.num_scheduled_tokens, sampled) if tokens}
        for prior, prior_sampled, done in queue:
            if done > start and any(tokens and rid in mine
                                    for rid, tokens in zip(prior.num_scheduled_tokens, prior_sampled)):
                start = done
    queue.appendleft((out, sampled, clock.launch(start, (1.0 if executed else 0.0,) * len(clock.free), 0.0)))
    return out, executed


def _land_oldest(trace, queue, now: float) -> float:
    """Block until the oldest batch is back, then ``update_from_output`` with what it sampled
    (after the aborts that came meanwhile: ``step_with_batch_queue``). Returns the time then."""
    out, sampled, done_at = queue.pop()
    if done_at > now:
        now = done_at
    trace.abort(now)
    finished_before = {rid for rid in out.num_scheduled_tokens if trace.live[rid].is_finished()}
    trace.update(out, sampled)
    for rid, tokens in zip(out.num_scheduled_tokens, sampled):
        if tokens and rid not in finished_before:  # (a partial prefill, or finished before it landed)
            trace.token(rid, int(now), len(tokens))
    return now


class _Drafted:
    """What :meth:`schedlab.speculative.Speculation.accepted` reads of a request: its id and
    output (``request``) and its draws (``spec_state``)."""

    def __init__(self, r):
        self.request = Request(id=r.id, arrival_ms=float(r.arrival), prompt_tokens=r.prompt_tokens,
                               output_tokens=r.output_tokens, max_tokens=r.max_tokens)
        self.spec_state = None


class _Trace:
    """One case on vLLM's scheduler: the requests as they arrive, and what each got when."""

    def __init__(self, runner: VllmRunner, case: Case, sched):
        self.runner, self.sched = runner, sched
        self.block_size = case.settings.block_size
        self.pending = case.in_arrival_order()
        self.ids = {f"{r.id:04d}": r.id for r in self.pending}
        self.outputs = {r.id: r.output_tokens for r in self.pending}
        # requests whose last token is an EOS (they stop before their max_tokens)
        self.eos = {r.id for r in self.pending if r.max_tokens is not None and r.output_tokens < r.max_tokens}
        self.first_scheduled: dict[int, int] = {}
        self.first_token: dict[int, int] = {}
        self.finish: dict[int, int] = {}
        self.cached = {r.id: 0 for r in self.pending}
        self.sampled = {r.id: 0 for r in self.pending}  # tokens sampled for it (landed or in flight)
        self.generated = {r.id: 0 for r in self.pending}  # tokens it has
        self.live: dict = {}
        self.nxt = 0
        # (when the abort reaches the engine, request id) of the requests whose clients give up
        self.aborts = sorted((r.abort_at, f"{r.id:04d}") for r in self.pending if r.abort_at is not None)
        # speculative decoding: schedlab's acceptance draws, per request (_Drafted), and the
        # drafts the model runner proposes after every step (update_draft_token_ids)
        self.spec = speculation(case)
        self.k = case.settings.num_speculative_tokens
        self.drafted = {r.id: _Drafted(r) for r in self.pending} if self.spec is not None else {}
        # a run in which no request arrives and none gets a token for longer than it takes to
        # compute every request ten times over has livelocked (livelocked)
        self.patience = 10 * sum(r.prompt_tokens + r.limit for r in self.pending) + 1000
        self.last_progress = 0.0
        self.hash_lookahead = getattr(sched, "num_hash_lookahead_tokens", 0)
        self.asynchronous = isinstance(sched, runner._v["AsyncScheduler"])
        # the pool after each schedule() that scheduled tokens: (time, blocks in use, {request:
        # window blocks}) (.kv_steps)
        self.num_blocks = case.settings.num_blocks
        self.steps: list[tuple] = []
        managers = sched.kv_cache_manager.coordinator.single_type_managers
        self.window_managers = [m for m in managers if isinstance(m, runner._v["SlidingWindowManager"])]

    @property
    def all_arrived(self) -> bool:
        return self.nxt == len(self.pending)

    @property
    def next_arrival(self) -> int:
        return self.pending[self.nxt].arrival

    def livelocked(self, now) -> bool:
        """No request has arrived or got a token for :attr:`patience` ms: vLLM goes round in
        circles -- with a window and asynchronous scheduling, for instance, a prompt chunk that
        cannot get its blocks while the chunk before it is in flight preempts its own request, which
        starts over (``allocate_slots`` frees a window's blocks once their tokens are processed)."""
        return now - self.last_progress > self.patience

    def livelock_error(self, now) -> str:
        return (f"vLLM livelocked: no request arrived or got a token from {self.last_progress:g} ms to {now:g} ms "
                "(it schedules, and preempts, for ever)")

    def arrive(self, now) -> None:
        """Add the requests that have arrived by ``now``."""
        if self.nxt < len(self.pending) and self.pending[self.nxt].arrival <= now:
            self.last_progress = max(self.last_progress, float(now))
        while self.nxt < len(self.pending) and self.pending[self.nxt].arrival <= now:
            req = self.runner._request(self.pending[self.nxt], self.block_size, self.hash_lookahead)
            self.live[req.request_id] = req
            self.sched.add_request(req)
            self.nxt += 1

    def abort(self, now) -> None:
        """Abort the requests whose client's abort has reached the engine by ``now`` (vLLM's
        ``EngineCore.abort_requests``: ``finish_requests(..., FINISHED_ABORTED)``); their
        tokens not yet processed are never output."""
        due = [rid for t, rid in self.aborts if t <= now and rid in self.live]  # (not arrived yet: at its arrival)
        if due:
            self.aborts = [(t, rid) for t, rid in self.aborts if rid not in due]
            self.sched.finish_requests(due, self.runner._v["RequestStatus"].FINISHED_ABORTED)

    def schedule(self, now) -> tuple:
        """``schedule()`` at ``now``: its output and what the model runner samples for each
        scheduled request (one token for a request whose prefill completes, none for a chunk;
        with speculation also the drafts it verified that schedlab's draws accept -- none of a
        padded decode's placeholders, which are -1)."""
        live, sched = self.live, self.sched
        waiting_before = {rid for rid, req in live.items() if not req.is_finished() and req not in sched.running}
        out = sched.schedule()
        if out.total_num_scheduled_tokens:
            self.steps.append((now, self.num_blocks - sched.kv_cache_manager.block_pool.get_num_free_blocks(),
                               self.window_blocks()))
        scheduled = out.num_scheduled_tokens
        spec_tokens = out.scheduled_spec_decode_tokens
        sampled = []
        for rid in scheduled:
            req = live[rid]
            rid_int = self.ids[rid]
            self.first_scheduled.setdefault(rid_int, int(now))
            if rid in waiting_before:  # admitted (or resumed) now: its prefix hit
                self.cached[rid_int] += req.num_computed_tokens - scheduled[rid]
            if req.is_prefill_chunk:
                sampled.append([])
                continue
            k = self.sampled[rid_int]
            drafts = spec_tokens.get(rid, ())
            accepted = 0
            # (a padded decode's placeholders are all rejected; planning ahead, every decode's
            # drafts are placeholders the workers fill in, and a padded one is an admission)
            real = rid not in waiting_before if self.asynchronous else drafts and min(drafts) >= 0
            if drafts and real:
                accepted = self.spec.accepted(self.drafted[rid_int], k, len(drafts))
            tokens = []
            for p in range(k, k + accepted + 1):
                eos = rid_int in self.eos and p + 1 == self.outputs[rid_int]
                tokens.append(EOS_TOKEN_ID if eos else output_token_id(rid_int, p))
            sampled.append(tokens)
            self.sampled[rid_int] += len(tokens)
        return out, sampled

    def window_blocks(self) -> dict[int, int]:
        """The blocks each request holds in the sliding-window groups (null ones apart: those
        ``remove_skipped_blocks`` freed), holders only, by id."""
        held: dict[int, int] = {}
        for manager in self.window_managers:
            for rid, blocks in manager.req_to_blocks.items():
                n = sum(not b.is_null for b in blocks)
                if n:
                    held[self.ids[rid]] = held.get(self.ids[rid], 0) + n
        return dict(sorted(held.items()))

    def update(self, out, sampled) -> None:
        req_ids = list(out.num_scheduled_tokens)
        self.sched.update_from_output(out, self.runner._v["ModelRunnerOutput"](
            req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        # the drafter proposes k for every request of the step that sampled a token -- none from a
        # prompt chunk, whose sampled token is discarded (EngineCore.post_step; planning ahead the
        # scheduler has placeholders for them already)
        if self.k and req_ids and not self.asynchronous:
            k = out.num_spec_tokens_to_schedule  # (k by the step's batch size, with drafts per batch size)
            drafts = [[output_token_id(self.ids[rid], 0)] * k if tokens else [] for rid, tokens in zip(req_ids, sampled)]
            self.sched.update_draft_token_ids(self.runner._v["DraftTokenIds"](req_ids, drafts))

    def token(self, rid: str, t: int, n: int = 1) -> None:
        """Request ``rid`` got ``n`` tokens at ``t`` (vLLM keeps none past its last): its first,
        or its last (it is finished)."""
        rid_int = self.ids[rid]
        self.last_progress = max(self.last_progress, float(t))
        before = self.generated[rid_int]
        self.generated[rid_int] = min(before + n, self.outputs[rid_int])
        if before == 0:
            self.first_token[rid_int] = t
        if self.generated[rid_int] == self.outputs[rid_int]:
            self.finish[rid_int] = t

    def outcomes(self) -> dict[int, Outcome]:
        out = {}
        for r in self.pending:
            req = self.live.get(f"{r.id:04d}")
            out[r.id] = Outcome(self.first_scheduled.get(r.id), self.first_token.get(r.id), self.finish.get(r.id),
                                req.num_preemptions if req is not None else 0, self.cached[r.id])
        return out
