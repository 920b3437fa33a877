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
no sends), as the schedlab side's :class:`~schedlab.diffcheck.schedlab_side.OneMsStages` times
it; requests that arrive meanwhile are added once the engine is back from the oldest batch.
What a batch samples is fixed when it is scheduled (the model runner's view): a token for every
request whose prefill completes in it, kept by ``update_from_output`` unless the request has
finished meanwhile -- even one preempted while the batch was in flight.

Requests arrive at the start of their iteration, in (arrival, id) order, with
``arrival_time = arrival + id * 1e-6`` so that the priority policy's ties (``Request.__lt__``
and the victim choice ``max(running, key=(priority, arrival_time))``) follow arrival order as
with real, distinct clock readings, and schedlab's tie-break by arrival order.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Sides
from schedlab.diffcheck.cli import VersionError
from schedlab.diffcheck.tokens import output_token_id, prompt_token_ids

from .case import Outcome

VLLM_VERSION = "0.33.0"

# A Llama-shaped config.json small enough for ModelConfig to read; no weights are ever loaded.
TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": 1024,
    "max_position_embeddings": MAX_MODEL_LEN, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
    "rms_norm_eps": 1e-6,
}
ENVIRONMENT = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
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
    """

    def __init__(self, *, allow_other_version: bool = False):
        set_environment()
        logging.getLogger("vllm").setLevel(logging.ERROR)  # its warnings about CPU kernels do not concern us
        import vllm

        self.version = vllm.__version__
        if self.version.split("+")[0] != VLLM_VERSION and not allow_other_version:
            raise VllmVersionError(f"vLLM {self.version} is installed; this harness follows vLLM {VLLM_VERSION} "
                                   "(pip install 'schedlab[vllm]'), or pass --allow-other-vllm")
        import torch
        from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        self._v = dict(torch=torch, CacheConfig=CacheConfig, ParallelConfig=ParallelConfig,
                       SchedulerConfig=SchedulerConfig, VllmConfig=VllmConfig, SamplingParams=SamplingParams,
                       sha256=sha256, get_request_block_hasher=get_request_block_hasher, Scheduler=Scheduler,
                       register_all_kvcache_specs=register_all_kvcache_specs, FullAttentionSpec=FullAttentionSpec,
                       KVCacheConfig=KVCacheConfig, KVCacheGroupSpec=KVCacheGroupSpec,
                       ModelRunnerOutput=ModelRunnerOutput, Request=Request,
                       StructuredOutputManager=StructuredOutputManager)
        self._model_dir = tempfile.TemporaryDirectory(prefix="vllm_diff_model_")
        with open(os.path.join(self._model_dir.name, "config.json"), "w") as f:
            json.dump(TINY_MODEL_CONFIG, f)
        self.model_config = ModelConfig(model=self._model_dir.name, dtype="float16", seed=0,
                                        skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN)
        init_none_hash(sha256)  # vLLM's module-level seed of the hash chain; the same every time

    def scheduler_config_kwargs(self, case: Case, sides: Sides | None) -> dict:
        s = case.settings
        kwargs = dict(max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                      max_model_len=MAX_MODEL_LEN, long_prefill_token_threshold=s.long_prefill_token_threshold,
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
                                        enable_prefix_caching=s.prefix_caching)
        vllm_config = v["VllmConfig"](scheduler_config=scheduler_config, model_config=self.model_config,
                                      cache_config=cache_config, parallel_config=v["ParallelConfig"]())
        for key, value in kwargs.items():
            if key not in ("max_model_len", "is_encoder_decoder") and getattr(scheduler_config, key) != value:
                raise AssertionError(f"vLLM changed scheduler setting {key}: {value!r} -> "
                                     f"{getattr(scheduler_config, key)!r}")
        if cache_config.block_size != s.block_size or cache_config.enable_prefix_caching != s.prefix_caching:
            raise AssertionError("vLLM changed the cache settings")
        spec = v["FullAttentionSpec"](block_size=s.block_size, num_kv_heads=1, head_size=1, dtype=v["torch"].float32)
        kv_cache_config = v["KVCacheConfig"](num_blocks=s.num_blocks + 1, kv_cache_tensors=[],
                                             kv_cache_groups=[v["KVCacheGroupSpec"](["layer"], spec)])
        cache_config.num_gpu_blocks = s.num_blocks + 1
        v["register_all_kvcache_specs"](vllm_config)
        return v["Scheduler"](vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=s.block_size,
                              log_stats=True, structured_output_manager=v["StructuredOutputManager"](vllm_config))

    def _request(self, r, block_size: int):
        v = self._v
        params = v["SamplingParams"](max_tokens=r.output_tokens, ignore_eos=True)
        return v["Request"](request_id=f"{r.id:04d}", prompt_token_ids=prompt_token_ids(r), sampling_params=params,
                            pooling_params=None, arrival_time=r.arrival + r.id * ARRIVAL_TIE_BREAK,
                            priority=r.priority,
                            block_hasher=v["get_request_block_hasher"](block_size, v["sha256"]))

    def run(self, case: Case, sides: Sides | None = None) -> tuple[dict[int, Outcome], str | None]:
        """Per-request outcomes and, if the run stalled, why."""
        if case.settings.pipeline_parallel > 1:
            return self.run_pipelined(case, sides)
        v = self._v
        ModelRunnerOutput = v["ModelRunnerOutput"]
        sched = self.scheduler(case, sides)
        pending = case.in_arrival_order()
        ids = {f"{r.id:04d}": r.id for r in pending}
        first_scheduled: dict[int, int] = {}
        first_token: dict[int, int] = {}
        finish: dict[int, int] = {}
        cached = {r.id: 0 for r in pending}
        generated = {r.id: 0 for r in pending}
        live = {}
        now = 0
        nxt = 0
        empty_steps = 0
        error = None
        while True:
            while nxt < len(pending) and pending[nxt].arrival <= now:
                req = self._request(pending[nxt], case.settings.block_size)
                live[req.request_id] = req
                sched.add_request(req)
                nxt += 1
            if all(req.is_finished() for req in live.values()):
                if nxt == len(pending):
                    break
                now = pending[nxt].arrival
                continue
            waiting_before = {rid for rid, req in live.items() if not req.is_finished() and req not in sched.running}
            out = sched.schedule()
            scheduled = out.num_scheduled_tokens
            sampled = []
            for rid in scheduled:
                req = live[rid]
                rid_int = ids[rid]
                first_scheduled.setdefault(rid_int, now)
                if rid in waiting_before:  # admitted (or resumed) now: its prefix hit
                    cached[rid_int] += req.num_computed_tokens - scheduled[rid]
                if req.is_prefill_chunk:
                    sampled.append([])
                else:
                    sampled.append([output_token_id(rid_int, generated[rid_int])])
                    generated[rid_int] += 1
                    if generated[rid_int] == 1:
                        first_token[rid_int] = now + 1
                    if generated[rid_int] == req.max_tokens:
                        finish[rid_int] = now + 1
            req_ids = list(scheduled)
            sched.update_from_output(out, ModelRunnerOutput(
                req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
            if out.total_num_scheduled_tokens:
                now += 1
                empty_steps = 0
                continue
            empty_steps += 1
            if out.preempted_req_ids and empty_steps < MAX_EMPTY_STEPS:
                continue  # a step that only preempted runs no model: schedule again at once
            if nxt < len(pending):
                now = pending[nxt].arrival
                continue
            error = f"vLLM stalled at {now} ms: it schedules nothing and nothing is left to arrive"
            break
        outcomes = {}
        for r in pending:
            req = live.get(f"{r.id:04d}")
            outcomes[r.id] = Outcome(first_scheduled.get(r.id), first_token.get(r.id), finish.get(r.id),
                                     req.num_preemptions if req is not None else 0, cached[r.id])
        return outcomes, error

    def run_pipelined(self, case: Case, sides: Sides | None = None) -> tuple[dict[int, Outcome], str | None]:
        """:meth:`run` through vLLM's batch queue of ``pipeline_parallel`` batches (see the
        module docstring)."""
        from collections import deque

        from schedlab.engine.stages import StageClock

        ModelRunnerOutput = self._v["ModelRunnerOutput"]
        stages = case.settings.pipeline_parallel
        sched = self.scheduler(case, sides)
        clock = StageClock(stages)
        pending = case.in_arrival_order()
        ids = {f"{r.id:04d}": r.id for r in pending}
        first_scheduled: dict[int, int] = {}
        first_token: dict[int, int] = {}
        finish: dict[int, int] = {}
        cached = {r.id: 0 for r in pending}
        sampled_so_far = {r.id: 0 for r in pending}  # tokens sampled for it, landed or in flight
        generated = {r.id: 0 for r in pending}       # tokens landed
        live = {}
        queue: deque = deque()  # newest at the left, as vLLM's batch_queue
        now = 0.0
        nxt = 0
        empty_steps = 0
        error = None
        while True:
            while nxt < len(pending) and pending[nxt].arrival <= now:
                req = self._request(pending[nxt], case.settings.block_size)
                live[req.request_id] = req
                sched.add_request(req)
                nxt += 1
            if not sched.has_requests() and not queue:
                if nxt == len(pending):
                    break
                now = float(pending[nxt].arrival)
                continue
            if sched.has_requests():
                waiting_before = {rid for rid, req in live.items()
                                  if not req.is_finished() and req not in sched.running}
                out = sched.schedule()
                scheduled = out.num_scheduled_tokens
                sampled = []
                for rid in scheduled:
                    req = live[rid]
                    rid_int = ids[rid]
                    first_scheduled.setdefault(rid_int, int(now))
                    if rid in waiting_before:
                        cached[rid_int] += req.num_computed_tokens - scheduled[rid]
                    if req.is_prefill_chunk:
                        sampled.append([])
                    else:
                        sampled.append([output_token_id(rid_int, sampled_so_far[rid_int])])
                        sampled_so_far[rid_int] += 1
                executed = out.total_num_scheduled_tokens > 0
                # an empty batch runs no model, but the workers answer in order: it is back with
                # the batch before it (StageClock with no stage time)
                done_at = clock.launch(now, (1.0 if executed else 0.0,) * stages, 0.0)
                queue.appendleft((out, list(scheduled), sampled, done_at))
                if executed or out.preempted_req_ids:
                    empty_steps = 0 if executed else empty_steps + 1
                    if len(queue) < stages and empty_steps < MAX_EMPTY_STEPS:
                        continue  # schedule again before blocking on the oldest batch
                elif not any(entry[0].total_num_scheduled_tokens for entry in queue):
                    # Nothing in flight and nothing to schedule: vLLM queues empty batches, each
                    # done at once, until a request arrives; none of them changes anything.
                    if not sched.has_unfinished_requests():
                        queue.clear()  # that schedule only told the workers of finished requests
                        continue
                    if nxt < len(pending):
                        now = float(pending[nxt].arrival)
                        continue
                    error = f"vLLM stalled at {int(now)} ms: it schedules nothing and nothing is left to arrive"
                    break
            out, req_ids, sampled, done_at = queue.pop()  # block until the oldest batch is back
            if done_at > now:
                now = done_at
            finished_before = {rid for rid in req_ids if live[rid].is_finished()}
            sched.update_from_output(out, ModelRunnerOutput(
                req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
            for rid, tokens in zip(req_ids, sampled):
                if not tokens or rid in finished_before:
                    continue  # a partial prefill, or the request finished before this batch landed
                rid_int = ids[rid]
                generated[rid_int] += 1
                if generated[rid_int] == 1:
                    first_token[rid_int] = int(now)
                if live[rid].is_finished():
                    finish[rid_int] = int(now)
        outcomes = {}
        for r in pending:
            req = live.get(f"{r.id:04d}")
            outcomes[r.id] = Outcome(first_scheduled.get(r.id), first_token.get(r.id), finish.get(r.id),
                                     req.num_preemptions if req is not None else 0, cached[r.id])
        return outcomes, error
