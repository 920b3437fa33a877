"""Step SGLang 0.5.23's own ``Scheduler`` through a case, on the CPU, with no model.

The way SGLang's own CPU unit tests drive its scheduling code
(``test/registered/unit/managers/test_prefill_adder.py``, ``test_schedule_policy.py``, the
``sglang.test.kits.unified_radix_cache`` fixtures): a ``ServerArgs`` published for the
scheduler role; a ``ModelConfig`` read from a weights-free Llama-shaped ``config.json``; the
memory pools SGLang builds for a plain full-attention model -- ``ReqToTokenPool`` with a row per
request slot (``--max-running-requests``, or SGLang's own from the pool: its configurator's
``resolve_max_num_reqs``), ``MHATokenToKVPool`` of ``max_total_tokens`` tokens in pages of
``page_size`` (tiny tensors: one layer, one head of size 1) with the allocator its configurator
picks for it (``TokenToKVPoolAllocator`` at page size 1, else ``PagedTokenToKVPoolAllocator``,
whose CPU path is its torch one) -- and the tree cache its registry builds
(``create_tree_cache``: a ``UnifiedRadixCache`` with one FULL component, LRU eviction; with
``--disable-radix-cache`` the same tree built disabled, which caches nothing and makes the
``PrefillAdder`` admit requests that ignore EOS by ``add_one_req_ignore_eos``).

The ``Scheduler`` is made with ``Scheduler.__new__`` and completed with its own ``init_*``
methods wherever they run on a CPU (``init_model_config``, ``init_running_status``,
``init_chunked_prefill``, ``init_schedule_policy``, ``init_pool_stats_observer``,
``init_load_publisher``, ``init_beam_coordinator``, ``init_batch_result_processor``,
``init_disaggregation``, ...); the parts that only talk to other processes or the GPU
(metrics, IPC sockets, the grammar backend, DP attention, the profiler) are stand-ins that do
nothing. The model worker is a stand-in whose ``forward_batch_generation`` returns one token
per request in the batch, the same tokens as the vLLM harness's
(:func:`~schedlab.diffcheck.tokens.output_token_id`), and an EOS token where a request with a
``max_tokens`` stops early. A request without ``max_tokens`` is sent with ``ignore_eos`` (the
preset's ``ignore_eos = "no_max_tokens"``).

One step is what ``Scheduler.event_loop_normal`` does once (overlap scheduling off):
``get_next_batch_to_run``, then ``run_batch`` and ``process_batch_result`` -- SGLang's real
``PrefillAdder``, ``SchedulePolicy``, ``update_running_batch`` / ``retract_decode``, the
new-token-ratio tracker, the allocator and the radix cache all run. A step that runs a batch
lasts 1 ms; a step with no batch takes no time: with nothing running SGLang is idle and resets
its new-token ratio (``on_idle``), and the clock jumps to the next arrival.

With ``overlap_schedule`` a step is what ``Scheduler.event_loop_overlap`` does once, in its
order: read the arrivals, ``get_next_batch_to_run`` while the batch before is still in flight
(its result queued, unprocessed: ``enable_skip_finishing_decode`` leaves out the requests whose
queued token ends them by length), launch the new batch, then process the batch before's
result (``process_batch_result`` with the result processor's ``enable_overlap``: a request
retracted or finished meanwhile drops its token). A batch starts when the one before ends, so
the plan of a batch is made at the start of the batch before it, and a result is processed at
its batch's end. The forward pass itself runs synchronously (``run_batch`` without
``enable_overlap``: no CUDA streams or future map here); the token model counts a request's
token in flight, which SGLang reads from its future map.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import tempfile
import warnings
from array import array

from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Sides
from schedlab.diffcheck.cli import VersionError
from schedlab.diffcheck.tokens import output_token_id, prompt_token_ids

from . import stubs
from .case import Outcome

SGLANG_VERSION = "0.5.23"

# Token ids go up to 2**31 (schedlab.diffcheck.tokens); SGLang ends a request whose sampled
# token is not below vocab_size ("NaN happened"), so the vocabulary covers them all.
VOCAB_SIZE = 2**31 - 1
EOS_TOKEN = 2
TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": MAX_MODEL_LEN, "torch_dtype": "float16", "bos_token_id": 1,
    "eos_token_id": EOS_TOKEN, "rms_norm_eps": 1e-6,
}
ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "SGLANG_LOGGING_LEVEL": "ERROR"}
MAX_STEPS = 100_000


def _rid(request_id: int) -> str:
    """SGLang's request id for the case's request ``request_id``."""
    return f"{request_id:06d}."


class SglangVersionError(VersionError):
    pass


class _Nothing:
    """A stand-in for a part that does not schedule (metrics, IPC, profiler): every method
    accepts anything and does nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Metrics(_Nothing):
    enable_metrics = False
    forward_ct_decode = 0
    num_generated_tokens = 0
    num_retracted_reqs = 0
    recent_cache_hit_rate = 0.0


class _NoGrammar(_Nothing):
    grammar_queue = ()

    def has_waiting_grammars(self):
        return False


class _NoDpAttention(_Nothing):
    def maybe_prepare_mlp_sync_batch(self, batch, need_sync=None):
        return batch

    def maybe_convert_decode_to_extend(self, batch):
        return batch


class _NoNgram:
    def prepare_for_forward(self, batch, chunked_req=None):
        return batch


class _NoLoadInquirer(_Nothing):
    def _get_num_pending_tokens(self, chunk_deduct=0):
        return 0


class _TokenModel:
    """The forward pass: one sampled token per request in the batch (a middle prefill chunk's
    token is discarded by SGLang itself), EOS at a request's ``stop``-th token."""

    def __init__(self, torch, stops: dict):
        self.torch = torch
        self.stops = stops  # rid -> the output length at which it emits EOS (None: never)
        #: overlap scheduling: the requests whose token the batch in flight computes (not yet in
        #: their output_ids)
        self.in_flight: set = set()

    def forward_batch_generation(self, batch, **kwargs):
        from sglang.srt.managers.utils import GenerationBatchResult

        tokens = []
        for req in batch.reqs:
            k = len(req.output_ids) + (1 if id(req) in self.in_flight else 0)
            rid = int(req.rid[:-1])
            tokens.append(EOS_TOKEN if self.stops.get(rid) == k + 1 else output_token_id(rid, k))
        return GenerationBatchResult(next_token_ids=self.torch.tensor(tokens, dtype=self.torch.int64))


class SglangRunner:
    """Holds the imported SGLang pieces and the tiny model config; :meth:`run` steps one case.

    :param allow_other_version: run an SGLang other than 0.5.23 (the rules this harness and its
        notes cite may have moved).
    """

    def __init__(self, *, allow_other_version: bool = False):
        if importlib.util.find_spec("sglang") is None:  # before stubbing anything
            raise ImportError("No module named 'sglang'")
        for key, value in ENVIRONMENT.items():
            os.environ.setdefault(key, value)
        stubs.install()
        # SGLang warns at import that CUDA-only kernels (AWQ, GGUF, Triton) are not available here
        warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang\.")
        import sglang

        self.version = sglang.__version__
        if self.version != SGLANG_VERSION and not allow_other_version:
            raise SglangVersionError(f"SGLang {self.version} is installed; this harness follows SGLang "
                                     f"{SGLANG_VERSION} (pip install 'schedlab[sglang]'), or pass --allow-other-sglang")
        logging.getLogger("sglang").setLevel(logging.ERROR)
        self._model_dir = tempfile.TemporaryDirectory(prefix="sglang_diff_model_")
        with open(os.path.join(self._model_dir.name, "config.json"), "w") as f:
            json.dump(TINY_MODEL_CONFIG, f)
        self._model_config = None

    # -- building a scheduler --------------------------------------------------------------
    def server_args(self, case: Case, sides: Sides | None = None):
        from sglang.srt.server_args import ServerArgs

        s = case.settings
        kwargs = dict(model_path=self._model_dir.name, device="cpu", page_size=s.page_size,
                      disable_overlap_schedule=True, skip_tokenizer_init=True, max_total_tokens=s.max_total_tokens,
                      max_running_requests=s.max_running_requests or None,
                      disable_radix_cache=s.disable_radix_cache,
                      chunked_prefill_size=s.chunked_prefill_size or -1, max_prefill_tokens=s.max_prefill_tokens,
                      schedule_policy=s.schedule_policy, schedule_conservativeness=s.schedule_conservativeness,
                      enable_mixed_chunk=s.enable_mixed_chunk, context_length=MAX_MODEL_LEN,
                      enable_priority_scheduling=s.enable_priority_scheduling,
                      schedule_low_priority_values_first=s.schedule_low_priority_values_first,
                      priority_scheduling_preemption_threshold=s.priority_scheduling_preemption_threshold,
                      disable_priority_preemption=s.disable_priority_preemption,
                      retraction_policy=s.retraction_policy)
        if sides is not None:
            kwargs.update(sides.engine)
        return ServerArgs(**kwargs)

    def validate(self, case: Case, sides: Sides | None = None) -> None:
        """Raise TypeError or ValueError if SGLang refuses ``sides``."""
        self.server_args(case, sides)

    def scheduler(self, case: Case, sides: Sides | None = None):
        """A fresh SGLang ``Scheduler`` for ``case`` (raises if SGLang's argument processing
        changed a setting the comparison relies on)."""
        import torch
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.registry import create_tree_cache
        from sglang.srt.runtime_context import get_context, get_memory, get_parallel, get_schedule, reset_context
        from sglang.srt.server_args import set_global_server_args_for_scheduler
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        s = case.settings
        server_args = self.server_args(case, sides)
        reset_context()
        set_global_server_args_for_scheduler(server_args)
        sched = get_schedule()
        published = {"chunked_prefill_size": sched.chunked_prefill_size, "page_size": sched.page_size,
                     "max_prefill_tokens": sched.max_prefill_tokens, "schedule_policy": sched.schedule_policy,
                     "disable_overlap_schedule": sched.disable_overlap_schedule,
                     "schedule_conservativeness": sched.schedule_conservativeness,
                     "enable_mixed_chunk": sched.enable_mixed_chunk,
                     "disable_radix_cache": get_memory().disable_radix_cache}
        wanted = {"chunked_prefill_size": s.chunked_prefill_size or None, "page_size": s.page_size,
                  "max_prefill_tokens": s.max_prefill_tokens, "schedule_policy": s.schedule_policy,
                  "disable_overlap_schedule": True, "schedule_conservativeness": s.schedule_conservativeness,
                  "enable_mixed_chunk": s.enable_mixed_chunk, "disable_radix_cache": s.disable_radix_cache}
        if sides is None or not sides.engine:
            if published["chunked_prefill_size"] == -1:
                published["chunked_prefill_size"] = None
            if published != wanted:
                raise AssertionError(f"SGLang changed the settings: {wanted} -> {published}")

        size = s.max_total_tokens
        page = sched.page_size
        x = Scheduler.__new__(Scheduler)
        x.server_args = server_args
        # the fields __init__ copies from the published configuration
        x.forward_ct = 0
        x.processed_tokens_counter = 0
        x.cur_batch_for_debug = None
        x.schedule_policy = sched.schedule_policy
        x.enable_priority_scheduling = sched.enable_priority_scheduling
        x.abort_on_priority_when_disabled = sched.abort_on_priority_when_disabled
        x.schedule_low_priority_values_first = sched.schedule_low_priority_values_first
        x.priority_scheduling_preemption_threshold = sched.priority_scheduling_preemption_threshold
        x.enable_lora = x.enable_lora_overlap_loading = False
        x.max_loras_per_batch = 0
        x.enable_overlap = x.enable_overlap_mlx = x.enable_pdmux = False
        x.skip_tokenizer_init = True
        x.stream_interval = 1
        x.spec_algorithm = SpeculativeAlgorithm.from_string(None)
        x.page_size = page
        x.enable_hierarchical_cache = x.enable_lmcache = x.enable_session_radix_cache = False
        x.enable_hicache_storage = x.enable_unified_cache_external_linker = x.enable_decode_hicache = False
        x.max_recv_per_poll = 1
        x.max_new_tokens_limit = None
        x.enable_hisparse = x.attn_dp_enabled = x.enable_unified_memory = False
        x.dllm_config = None
        if self._model_config is None:
            x.init_model_config()
            self._model_config = x.model_config
        x.model_config = self._model_config
        # the request slots: KVCacheConfigurator.resolve_max_num_reqs on the pool (--max-running-requests,
        # else SGLang's own from the pool and the context; either way at most half the pool)
        slots = KVCacheConfigurator.resolve_max_num_reqs(_SlotSizing(x.model_config), size)
        # memory pools and tree cache (kv_cache_builder.build_kv_cache and the configurator's
        # _build_token_to_kv_pool_allocator for a plain model: one-token pages, or SGLang's paged allocator)
        req_pool = ReqToTokenPool(size=slots, max_context_len=MAX_MODEL_LEN + 4, device="cpu",
                                  enable_memory_saver=False)
        kv_pool = MHATokenToKVPool(size=size, page_size=page, dtype=torch.float16, head_num=1, head_dim=1,
                                   layer_num=1, device="cpu", enable_memory_saver=False)
        if page == 1:
            allocator = TokenToKVPoolAllocator(size=size, dtype=torch.float16, device="cpu", kvcache=kv_pool,
                                               need_sort=False)
        else:
            allocator = PagedTokenToKVPoolAllocator(size=size, page_size=page, dtype=torch.float16, device="cpu",
                                                    kvcache=kv_pool, need_sort=False)
        disable = get_memory().disable_radix_cache
        params = CacheInitParams(req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator, page_size=page,
                                 disable=disable, eviction_policy=get_memory().radix_eviction_policy,
                                 eviction_policy_config=get_memory().radix_eviction_policy_config,
                                 chunked_prefill_size=sched.chunked_prefill_size)
        # (the registry's route: the UnifiedRadixCache, disabled with --disable-radix-cache)
        x.tree_cache = create_tree_cache(_TreeContext(server_args, params, disable))
        x.req_to_token_pool, x.token_to_kv_pool_allocator = req_pool, allocator
        x.kv_shard_widening = 1
        x.disable_radix_cache = disable
        x.is_hybrid_swa = x.is_hybrid_ssm = False
        x.sliding_window_size = x.full_tokens_per_layer = x.swa_tokens_per_layer = None
        # what tp_worker.get_worker_info reports
        x.max_total_num_tokens = size
        x.max_prefill_tokens = sched.max_prefill_tokens
        x.max_running_requests = slots
        x.max_queued_requests = s.max_queued_requests or None
        x.max_req_len = min(x.model_config.context_len - 1, size - 1)
        x.max_req_input_len = x.max_req_len - 5
        x.device = "cpu"
        x.random_seed = 0
        x.min_free_slots_delayer = None
        if not get_parallel().pp_max_micro_batch_size:
            get_context().override("scheduler.pp_max_micro_batch_size_default", pp_max_micro_batch_size=slots)
        x.draft_worker = x.decode_offload_manager = x.hisparse_coordinator = None
        x.tp_worker = _Worker(kv_pool)
        x.model_worker = x.tp_worker
        x.init_running_status()
        x.init_chunked_prefill()
        x.maybe_init_dynamic_chunk_sizer()
        x.is_generation = True
        x.disaggregation_mode = DisaggregationMode.NULL
        x.metrics_collector = None
        x.metrics_reporter = _Metrics()
        x.scheduler_stage_metrics = None
        x.kv_events_publisher = _Nothing()
        x.init_schedule_policy()
        x.forward_stream = None
        x.future_map = x.spec_algorithm.create_future_map("cpu", req_pool, needs_cpu_seq_lens=True,
                                                          needs_confidence_relay=False)
        x.ngram_embedding_manager = _NoNgram()
        x.grammar_manager = _NoGrammar()
        x.require_mlp_sync = False
        x.dp_attn_adapter = _NoDpAttention()
        x.init_pool_stats_observer()
        x.init_load_publisher()
        x.load_inquirer = _NoLoadInquirer()
        x.output_streamer = _Nothing()
        x.init_beam_coordinator()
        x.init_batch_result_processor()
        x.init_lora_drainer()
        x.init_disaggregation()
        x.init_diffusion_llm()
        x.truncation_align_size = None
        x.rust_server = None
        x.enable_fpm = False
        x.profiler_manager = _Nothing()
        x._record_step_counters = lambda *args, **kwargs: None
        x.send_abort_output = lambda *args, **kwargs: None  # (to the tokenizer process)
        x.maybe_send_health_check_signal = lambda *args, **kwargs: None
        x.load_snapshot_writer = None
        x._sched_idled = False
        x.scripted_scheduler_hook = None
        x.forward_sleep_time = None
        x._confidence_budget_prepare = None
        return x

    def _request(self, x, r):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(max_new_tokens=r.limit, ignore_eos=r.ignore_eos)
        params.normalize(None)
        params.verify(VOCAB_SIZE)
        # (ids end with "." so that no id is a prefix of another: an abort names the requests
        # whose id starts with its own, AbortReq; zero-padded, they sort as the numbers do --
        # hrrn breaks ties by id)
        req = Req(_rid(r.id), "", array("q", prompt_token_ids(r)), params,
                  eos_token_ids=x.model_config.hf_eos_token_id, vocab_size=VOCAB_SIZE, priority=r.priority)
        x.init_req_max_new_tokens(req)  # (its cuts, by the context and the pool, are schedlab's too)
        if req.finished():
            raise AssertionError(f"SGLang aborted request {r.id} on arrival")
        req.logprob_start_len = -1
        return req

    # -- stepping ------------------------------------------------------------------------------
    def run(self, case: Case, sides: Sides | None = None) -> tuple[dict[int, Outcome], str | None]:
        """Per-request outcomes and, if the run stalled, why."""
        import torch

        x = self.scheduler(case, sides)
        pending = case.in_arrival_order()
        stops = {r.id: (None if r.ignore_eos or r.output_tokens == r.limit else r.output_tokens) for r in pending}
        model = _TokenModel(torch, stops)
        x.model_worker = model
        x.tp_worker.forward_batch_generation = model.forward_batch_generation
        run = _Run(x, pending)
        x.send_abort_output = run.turned_away  # (to the tokenizer process: the request ends there)
        with _timeouts(case.settings, run):
            if case.settings.overlap_schedule:
                error = self._step_overlapped(x, model, run)
            else:
                error = self._step(x, run)
        outcomes = {}
        for r in pending:
            req = run.live.get(r.id)
            outcomes[r.id] = Outcome(run.first_scheduled.get(r.id), run.first_token.get(r.id), run.finish.get(r.id),
                                     req.retraction_count if req is not None else 0, run.cached[r.id],
                                     run.chunks[r.id])
        return outcomes, error

    def _step(self, x, run) -> str | None:
        """``event_loop_normal``: plan, run and process one batch at a time."""
        for _ in range(MAX_STEPS):
            batch = run.next_batch(self)
            if not batch:
                x.last_batch = None
                if x.is_fully_idle():
                    x.new_token_ratio_tracker.reset()  # on_idle
                if run.idle():
                    continue
                return run.stalled()
            result = x.run_batch(batch)
            x.process_batch_result(batch, result)
            x.last_batch = batch
            run.now += 1
            run.processed()
        return f"SGLang ran {MAX_STEPS} steps without finishing"

    def _step_overlapped(self, x, model, run) -> str | None:
        """``event_loop_overlap``: plan a batch while the one before it runs, launch it, then
        process the one before's result. ``run.now`` is when the next plan is made: the start of
        the batch in flight, or (with none) the time the loop reached."""
        from collections import deque

        x.enable_skip_finishing_decode = True
        x.batch_result_processor = dataclasses.replace(x.batch_result_processor, enable_overlap=True)
        x.result_queue = deque()
        for _ in range(MAX_STEPS):
            batch = run.next_batch(self)
            if batch:
                result = x.run_batch(batch)
                x.result_queue.append((batch.copy(), result))
                # the tokens this batch commits: every request's but a middle prefill chunk's
                model.in_flight = {id(req) for req in batch.reqs if req is not x.chunked_req}
            if x.last_batch:
                done, done_result = x.result_queue.popleft()
                x.process_batch_result(done, done_result)
                run.now += 1  # the batch before ends: the new one starts and the next plan is made
                run.processed()
                if not batch:
                    model.in_flight = set()
                x.last_batch = batch
                continue
            x.last_batch = batch
            if not batch:
                if x.is_fully_idle():
                    x.new_token_ratio_tracker.reset()  # on_idle
                if not run.idle():
                    return run.stalled()
        return f"SGLang ran {MAX_STEPS} steps without finishing"

class _Clock:
    """``time`` as SGLang's scheduler and request stats read it under a waiting timeout: its
    ``perf_counter`` is the run's clock in seconds, a nanosecond later at every call -- SGLang's
    queue-entry stamps and timeout deadlines follow the harness's steps, and, as on a real clock,
    no two stamps are equal."""

    def __init__(self, run):
        self._run = run
        self._calls = 0

    def perf_counter(self) -> float:
        self._calls += 1
        return 1.0 + self._run.now / 1000 + self._calls * 1e-9

    def __getattr__(self, name):
        import time
        return getattr(time, name)


@contextlib.contextmanager
def _timeouts(settings, run):
    """SGLang with ``SGLANG_REQ_WAITING_TIMEOUT`` and ``SGLANG_REQ_RUNNING_TIMEOUT`` (seconds) on
    the harness's clock, for a case with either; nothing changed otherwise."""
    waiting, running = settings.waiting_timeout_ms, settings.running_timeout_ms
    if not (waiting or running):
        yield
        return
    from sglang.srt.environ import envs
    from sglang.srt.managers import scheduler
    from sglang.srt.observability import req_time_stats

    clock = _Clock(run)
    saved = scheduler.time, req_time_stats.time
    scheduler.time = req_time_stats.time = clock
    run.timed = True
    try:
        with (envs.SGLANG_REQ_WAITING_TIMEOUT.override(waiting / 1000 if waiting else -1),
              envs.SGLANG_REQ_RUNNING_TIMEOUT.override(running / 1000 if running else -1)):
            yield
    finally:
        scheduler.time, req_time_stats.time = saved


class _Run:
    """One case's clock, its arrivals and what is recorded per request."""

    def __init__(self, x, pending):
        self.x = x
        self.pending = pending
        self.nxt = 0
        self.now = 0
        self.live = {}
        self.first_scheduled, self.first_token, self.finish = {}, {}, {}
        self.cached = {r.id: 0 for r in pending}
        self.chunks = {r.id: [] for r in pending}
        # (when the abort reaches the scheduler, request id) of the requests whose clients give up
        self.aborts = sorted((r.abort_at, r.id) for r in pending if r.abort_at is not None)
        self.gone: set = set()  # aborted while queued
        self.timed = False      # SGLANG_REQ_WAITING_TIMEOUT or _RUNNING_TIMEOUT is on (_timeouts)

    def next_batch(self, runner):
        """Read the arrivals, then SGLang's ``get_next_batch_to_run`` (its admissions and chunks
        recorded as made now)."""
        x = self.x
        timed_out = x._poll_timeout_aborts() if self.timed else ()  # (decided before the arrivals are read)
        # the arrivals and aborts since the last pass, in the order they were sent
        # (``process_input_requests``): an abort before an arrival frees its queue slot first
        while self.aborts and self.aborts[0][0] <= self.now:
            self.ingest(runner, until=self.aborts[0][0])
            self.abort(until=self.aborts[0][0])
        self.ingest(runner)
        for abort in timed_out:  # (they ride behind the arrivals: RequestReceiver.recv_requests)
            x.abort_request(abort)
        waiting = {id(req) for req in x.waiting_queue}
        plan = x.get_next_batch_to_run(running_batch=x.running_batch, last_batch=x.last_batch)
        x.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch:
            self.planned(batch, waiting, self.now)
        return batch

    def ingest(self, runner, until: float | None = None) -> None:
        """Queue the requests that have arrived by now (before ``until``)."""
        pending = self.pending
        last = self.now if until is None else until
        while self.nxt < len(pending) and (pending[self.nxt].arrival < last if until is not None
                                           else pending[self.nxt].arrival <= last):
            req = runner._request(self.x, pending[self.nxt])
            self.live[pending[self.nxt].id] = req
            self.x._add_request_to_queue(req)
            self.nxt += 1

    def abort(self, until: float | None = None) -> None:
        """The aborts that have reached the scheduler by now (by ``until``), read with the arrivals
        (SGLang's ``process_input_requests`` -> ``Scheduler.abort_request``): a queued request
        leaves at once, a chunked prefill at the next plan, a running one after one more pass."""
        from sglang.srt.managers.io_struct import AbortReq

        last = self.now if until is None else until
        while self.aborts and self.aborts[0][0] <= last:
            _, rid = self.aborts.pop(0)
            req = self.live.get(rid)
            if req is not None and not req.finished():
                queued = any(q is req for q in self.x.waiting_queue)
                self.x.abort_request(AbortReq(rid=_rid(rid)))
                if queued:  # popped from the queue: it never runs again
                    self.finish[rid] = None
                    self.gone.add(rid)

    def turned_away(self, abort_req, req) -> None:
        """SGLang aborted ``req`` and tells its client (``send_abort_output``): a request the queue
        limit turns away, or one whose client gave up; it never finishes."""
        rid = int(req.rid[:-1])
        self.finish[rid] = None
        self.gone.add(rid)

    def next_abort(self) -> float:
        return self.aborts[0][0] if self.aborts else float("inf")

    def idle(self) -> bool:
        """Nothing runs: jump to the next arrival (True), or there is none (False)."""
        if self.nxt < len(self.pending):
            self.now = max(self.now, self.pending[self.nxt].arrival)
            return True
        return False

    def stalled(self) -> str | None:
        if all(req.finished() or rid in self.gone for rid, req in self.live.items()):
            return None
        return f"SGLang stalled at {self.now} ms: it runs nothing and nothing is left to arrive"

    def planned(self, batch, waiting: set, now: int) -> None:
        """Record a planned batch's prefill chunks and admissions (made at ``now``)."""
        if not batch.forward_mode.is_extend():
            return
        # a mixed step (--enable-mixed-chunk) extends its running decodes by their one
        # token too (ScheduleBatch.mix_with_running): they are not prefill chunks
        decoding = {id(req) for req in (batch.decoding_reqs or ())}
        for req in batch.reqs:
            if id(req) in decoding:
                continue
            rid = int(req.rid[:-1])
            self.chunks[rid].append(req.extend_len)
            if id(req) in waiting:  # admitted (or readmitted) now: its prefix hit
                self.cached[rid] += req.prefix_len
                self.first_scheduled.setdefault(rid, now)

    def processed(self) -> None:
        """A batch's result was processed at ``now``, its end."""
        now = self.now
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        for rid, req in self.live.items():
            if rid in self.finish:
                continue
            if isinstance(req.finished_reason, FINISH_ABORT) or isinstance(req.to_finish, FINISH_ABORT):
                self.finish[rid] = None  # (its client gave up: it never finished, nor sees this token)
                continue
            if len(req.output_ids) and rid not in self.first_token:
                self.first_token[rid] = now
            if req.finished():
                self.finish[rid] = now


class _Worker:
    """What the scheduler reads of its tensor-parallel worker's model runner."""

    def __init__(self, kv_pool):
        self.model_runner = _ModelRunner(kv_pool)

    def forward_batch_generation(self, batch, **kwargs):  # replaced per run
        raise NotImplementedError


class _ModelRunner:
    def __init__(self, kv_pool):
        self.token_to_kv_pool = kv_pool
        self.attn_backend = object()
        self.prefill_aware_swa = False
        self.canary_manager = None


class _TreeContext:
    """The fields of ``TreeCacheBuildContext`` that ``create_tree_cache`` reads (for a plain
    model: ``default_radix_cache_factory`` then ``create_unified_radix_cache``)."""

    def __init__(self, server_args, params, disable_radix_cache: bool):
        self.server_args = server_args
        self.params = params
        self.is_hybrid_swa = False
        self.is_hybrid_ssm = False
        self.full_tokens_per_layer = None
        self.enable_hierarchical_cache = False
        self.disable_radix_cache = disable_radix_cache
        self.is_dsa = False


class _SlotSizing:
    """What ``KVCacheConfigurator.resolve_max_num_reqs`` reads of its configurator: the model's
    context, one data-parallel attention rank, no Mamba state."""

    def __init__(self, model_config):
        self.model_config = model_config
        self.attn_dp_size = 1
        self.mambaish_config = None
