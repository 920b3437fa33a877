"""SGLang's scheduler (engines.md §4), following SGLang 0.5.23 (PyPI release), with or without
its overlap scheduler: ``python/sglang/srt/managers/scheduler.py`` (``get_next_batch_to_run``,
``_get_new_batch_prefill_raw``, ``update_running_batch``), ``schedule_policy.py``
(``PrefillAdder``), ``mem_cache/prefill_budget.py`` (``PrefillBudget``), ``schedule_batch.py``
(``check_decode_mem``, ``retract_decode``, ``release_req``) and
``scheduler_components/new_token_ratio_tracker.py``. ``tools/sglang_diff.py`` steps SGLang's own
code beside it (README "Checked against SGLang").

Each iteration:

1. **Prefill first.** If requests wait (and the batch is not marked full) or a chunked prefill
   is under way, a prefill batch is formed; if it is not empty it runs and the decodes wait --
   unless ``enable_mixed_chunk``, where the decodes ride along in the same iteration.
2. **Admission** (``PrefillAdder``) in waiting-queue order (``schedule_policy``, see
   :mod:`.sglang_policy`). Memory is a token budget: free + evictable KV minus an offset that
   starts at every running request's ``min(max_new_tokens - generated, 4096)``, times
   ``new_token_ratio`` -- or times 1.0 for a request that ignores EOS, whose length is known --
   and grows by each admitted request's prompt tokens + one page + ``min(max_new_tokens,
   4096)`` (its whole ``max_new_tokens``, also for a retracted request; none for a chunk that
   does not end the prompt):

   * the chunked request's next chunk goes first (``add_chunked_req``): at most
     ``chunked_prefill_size`` tokens, and at most the budget left if that is positive;
   * then, while the pass's prompt budget (``max_prefill_tokens``) and chunk budget
     (``chunked_prefill_size``) are not spent: a request needs ``extend + min(max_new_tokens -
     generated, 4096) + page`` tokens *below* the budget, counted with its own cached prefix
     locked (no longer evictable); if not, admission stops and the batch is marked *full* (no
     more attempts until a request leaves, is retracted, or a chunk ends a pass). With chunking
     off, a request whose prompt reaches the prompt budget left stops admission (the first of a
     batch may exceed it); with chunking on, a prompt longer than the chunk budget left is cut
     there and continued next iteration (one chunked request at a time);
   * after each admission the pass stops if the budget is spent (``budget_state``);
   * the prompt and chunk budgets are charged whole pages (``ceil_paged_tokens``);
   * without a prefix cache (``--disable-radix-cache``: the ``paged`` cache with
     ``prefix_caching = false``) a request that ignores EOS is admitted by its known length
     instead (``add_one_req_ignore_eos``): its prompt's pages and a page more must fit what is
     left, and with every request finishing in order of its tokens left (``max_new_tokens`` times
     the ratio, 1.0 for those ignoring EOS, less its output), each freeing what it holds, more
     than a token per request must stay free all the way; neither the offset budget nor the
     prompt budget is checked for it;
   * at most ``max_running_requests`` run: by default SGLang's own from the pool
     (``resolve_max_num_reqs``: pool / context x 512, kept between 2,048 and 4,096), and either
     way at most half the pool's tokens.
3. **Decode**, when no prefill batch formed. If the KV cache cannot take the next decode step
   (``check_decode_mem``, which evicts the tree's shortfall all the same: least recently used
   first, as much of it as is evictable), requests are **retracted** (``retract_decode``): the
   one with the fewest generated tokens (ties: the longest prompt) first, at least one, until the
   next decode step fits (a page for each request whose KV ends on a page boundary), keeping at
   least one; after each retraction the radix cache evicts until
   ``retract_decode_steps`` (20) tokens per remaining request are free (``release_req``). A
   retracted request's KV is freed (its cached prompt stays in the tree), it goes to the back of
   the waiting queue and is prefilled again later (prompt and generated tokens).
   With pages of more than a token and the radix tree SGLang estimates a step's pages before it
   allocates them and evicts to the estimate: a decode batch until a page per request is free
   (``alloc_paged_token_slots_decode``), a prefill batch until its prompt tokens and a page per
   request are (``alloc_paged_token_slots_extend``) -- least recently used first, as many whole
   nodes as that takes, though fewer pages may do. The engines' runs of decode steps evict only
   what they take, so the scheduler asks to be asked again before a step finds fewer free pages
   than requests running.
4. **new_token_ratio**: starts at ``init_new_token_ratio x schedule_conservativeness`` (0.7),
   falls by ``(init - min) / 600`` at every decode-only iteration down to ``min = init x 0.14``;
   after a retraction it becomes ``(generated + 20 x running) / (sum(max_new_tokens) + 1)`` of
   the requests still running (capped at 1), and it is reset to the initial value when the
   server goes idle.

Which requests ignore EOS (``ignore_eos``): schedlab requests carry no sampling parameters, so
a setting names them -- by default those without ``max_tokens``, which generate exactly their
output length as a benchmark client asking for it would (``"no_max_tokens"``); ``"all"``; or
``"none"``, every request at the ratio as SGLang did before 0.5.

**Clients that give up** (``Scheduler.abort_request``, read with the arrivals before each plan):
a queued request leaves at once, the chunked prefill in progress at that plan, and a running
request keeps its slot and KV until the next iteration that computes it, whose token nobody
sees (``to_finish``; the engines do this for ``aborts_run_once_more``) -- one preempted or
retracted meanwhile keeps the mark, waits, and leaves after it is admitted again; an aborted chunked
prefill's newest chunk is never cached (``KVCache.discard``). A queued request's abort is not
a finish here: the running batch keeps its "full" mark. With overlap scheduling the loop reads
aborts when the batch in flight has just started, so the plan made then still holds the
request, and the next result that holds it ends it (:mod:`schedlab.engine.ahead`). Checked
against SGLang: ``tools/sglang_diff.py --groups abort,overlap_abort,priority_abort``. Within one
pass the engines apply aborts before arrivals; SGLang reads both in the order they came, so an
arrival that finds a full queue just before a queued request's abort is turned away there
(the harness's arrivals come on whole ms and its aborts half a ms in, so it never meets this).

**Queue limit** (``max_queued_requests``, ``--max-queued-requests``): SGLang checks it whenever
a request enters the waiting queue (``_add_request_to_queue``, ``_abort_on_queued_limit``) --
arrivals, read at the next pass in arrival order; a retracted request, right after the
retraction; requests preempted by priority, once the pass is over, in the order they were
chosen. One that finds the queue full is turned away (``Plan.reject``: counted as rejected,
"The request queue is full.", its client answered at once); with priority scheduling, the
least important queued request (ties: the latest queued) is instead if the newcomer is strictly
more important. A retracted request turned away keeps the tokens it got. **Waiting timeout**
(``waiting_timeout_ms``, SGLang's ``SGLANG_REQ_WAITING_TIMEOUT`` in seconds): a request queued
that long since it entered the queue is aborted, "Request waiting timeout reached." -- SGLang
polls at the top of its loop, before it reads the arrivals, and aborts after them; the scheduler
asks to be woken when the longest-queued request's time is up. **Running timeout**
(``running_timeout_ms``, ``SGLANG_REQ_RUNNING_TIMEOUT``): a request in a batch that long after
it was first scheduled is aborted at the same poll, as a client's abort is (it runs once more, a
chunked prefill is dropped), "Request running timeout reached." -- counted as rejected too; the
engines carry it (:mod:`schedlab.engine.run_limit`). SGLang polls only the batches in flight: a
retracted request whose time is up while it is queued is aborted at the pass after the one that
admits it again. None of the three is modelled with disaggregation (SGLang ignores the limit
there) or pipeline parallelism (refused).
``tools/sglang_diff.py --groups queue_limit,waiting_timeout,running_timeout``.

**Overlap scheduling** (``overlap_schedule``; SGLang's default, ``event_loop_overlap``): each
batch is planned while the one before it runs (:mod:`schedlab.engine.ahead`: arrivals after that
batch's start wait for the next plan, and the requests it finishes keep their KV until the plan
is made), and SGLang plans before it has processed that batch's result:

* every request the batch in flight gives a token counts one output token short
  (``Plan.token_in_flight``): in admission's offset, in the retraction order and ratio;
* the requests it finishes are still in the running batch: they count in ``running_bs`` and,
  with one token to go, in admission's offset; those finishing by length are left out of the
  decode (``_reqs_finishing_inflight``), and if the decode does not fit while some do, nothing
  is retracted: the step is skipped (their KV comes back once the result is processed); those
  stopping at an EOS SGLang cannot foresee are decoded once more, the token thrown away
  (``Plan.overshoot``);
* the "full" mark a finished request clears is cleared a plan later (``filter_batch`` sees it
  finished only then), or by the decode that leaves it out;
* a retracted request loses the token in flight (its queued result is skipped) and computes it
  again (``Plan.preempt(discard_in_flight=True)``);
* with the ``radix`` cache, the prompts the batch in flight completes are not in the tree yet --
  its chunks that do not end a prompt are (``stash_chunked_request`` inserts them at the next
  plan) -- and the blocks a pass computed twice are freed once its result is processed
  (``begin_pass(in_flight)``).

A request finished at an EOS SGLang cannot foresee is in the batch a retraction picks from:
retracted, it computes its last token again (un-finished, ``Plan.preempt(discard_in_flight=True)``).
``tools/sglang_diff.py --groups overlap`` compares it with SGLang's own loop.

The ratio changes at every decode iteration, but it is only read when a prefill batch is
formed, and that happens only at events (an arrival, a finish, a retraction, a chunk): while
requests wait and the batch is full nothing is attempted. So the plan is stable between
events and the ratio is computed when needed from the engine's decode-step clock
(``plan.decode_steps``), in closed form.

**Data-parallel attention** (``--enable-dp-attention --dp D``: ``[cluster] data_parallel = D``,
each rank a scheduler of its own): SGLang changes three settings per rank, and so does the
scheduler when the run hands it that layout (:func:`dp_attention`) -- ``chunked_prefill_size``
is divided by ``D`` (the value written or the GPU's default alike) and ``schedule_conservativeness``
scaled by 0.3 (``server_args._handle_data_parallelism``), and a ``max_running_requests`` set is
divided by ``D``, at least 1 (``ModelRunner``: ``max_running_requests // dp_size``; unset, SGLang's
own from the rank's pool is per rank already). The run's ``meta["scheduler"]`` shows the values
a rank ran with. The ranks are picked round robin unless ``[cluster] rank_router`` or ``router``
says otherwise (``rank_router_kind``: ``--load-balance-method auto``).

Simplifications (each deliberate):

* Memory is counted in KV blocks and a page is a block (SGLang's default page size is 1 token;
  the differential harness runs pages of 1-16 tokens too: ``--groups paged,paged_retract,
  paged_chunked,no_radix,overlap_paged``). With larger pages the budgets are charged and the
  decodes checked in whole pages, as SGLang's, and a ``chunked_prefill_size`` that is not whole
  pages is refused, as SGLang refuses it; a chunk that continues a prompt from part of a page is
  charged its tokens' pages here, not ``ceil_paged_tokens`` of its length. A request's blocks are
  taken when it is admitted rather than after the pass, so the budget's offset counts what SGLang
  adds to it less the prompt tokens already taken.
* With the ``radix`` cache, each pass is opened on the cache (``begin_pass``): prefix hits see
  only blocks inserted by earlier passes, as SGLang inserts a prefill's KV after the forward.
* Finished requests leave the running batch at once; SGLang filters decode-finished requests
  out at the next step, before it schedules, which is the same.
* With ``enable_mixed_chunk`` the decodes' blocks are taken before admission (the budget adds
  them back and charges a token per running request, as SGLang's ``num_mixed_decode_tokens``),
  and a failed decode allocation retracts as in step 3 (SGLang skips the decodes for that
  iteration).
* If a chunk of the chunked request does not fit, it waits and the decodes run (SGLang would
  fail with "Prefill out of memory"); if the last running request cannot decode because the
  chunked request holds the memory, the chunked request is retracted too (SGLang aborts the
  last request).
* Request lengths are SGLang's: a prompt of ``min(context_length, pool) - 6`` tokens or more
  is rejected, and one whose prompt + ``max_tokens`` exceeds the context; ``max_new_tokens`` is
  cut to ``min(context_length, pool) - 2 - prompt`` and to what an empty pool holds after the
  prompt's pages, a page and a token (one that ignores EOS still does). Without a prefix cache a
  request ignoring EOS that is left that much is rejected: ``add_one_req_ignore_eos`` would need
  a token more, and SGLang keeps it, and every request queued behind it, waiting for ever.
* Priorities (``enable_priority_scheduling``): ``fcfs`` and ``lof`` sort the waiting queue by
  priority first -- higher values first by default, as SGLang's, unlike vLLM's --, ``fcfs`` then
  by the time each request (re-)entered the queue; and unless ``disable_priority_preemption``,
  once the batch has no slot left (``max_running_requests``) an arrival preempts running
  requests whose priority is more than ``priority_scheduling_preemption_threshold`` below its
  own, least important and latest queued first, as many as free its admission's tokens
  (``PrefillAdder.preempt_to_schedule``: their estimated future tokens count as freed). A
  preempted request releases its KV (the tree keeps what it holds) and re-enters the queue at
  the back once the pass is over. With overlap scheduling a request the batch in flight finishes
  is still SGLang's to preempt: that batch's result is skipped for it, and it computes its last
  token again (``Plan.preempt(discard_in_flight=True)`` un-finishes it). Once the batch was full
  in a pass, every later admission of the pass needs a preemption too, as SGLang's flag stays set.
  ``retraction_policy = "priority"`` retracts the least important first. Not with
  ``enable_mixed_chunk`` (refused).
* Policies ``random`` and ``routing-key``, LoRA batching, grammar queues and speculative
  decoding are not modelled (overlap scheduling is refused with speculation,
  pipeline parallelism and disaggregation: ``"auto"`` turns it off). SGLang's ``--dp`` without
  ``--enable-dp-attention`` is independent replicas: ``[cluster] instances`` with ``router =
  {kind = "round_robin"}``, not ``data_parallel``.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedlab.configs import FieldError, bool_field, float_field, int_field, str_field
import warnings

from schedlab.errors import ConfigError, InputWarning, SimulationError
from schedlab.kv_window import sequence_blocks
from schedlab.parallelism import SINGLE, Parallelism

from .sglang_policy import CACHE_AWARE, POLICIES, Policy, SglangQueue

IGNORE_EOS = ("no_max_tokens", "all", "none")


def _overlap_schedule(_inst, attribute, value):
    if not (isinstance(value, bool) or value == "auto"):
        raise FieldError(attribute.name, f"must be true, false or \"auto\", got {value!r}")


@attrs.frozen
class SglangConfig:
    max_running_requests: int = int_field(
        0, min=0, help="most requests running at once (0: SGLang's own, from the KV pool: pool / context x 512, "
                       "between 2,048 and 4,096; either way at most half the pool's tokens)")
    max_prefill_tokens: int = int_field(16384, min=1, help="prompt tokens of one prefill batch (the first may exceed it)")
    chunked_prefill_size: int = int_field(
        8192, min=0, help="prompt tokens per prefill iteration; longer prompts are chunked (0 = off; SGLang sizes it "
                          "by the run's GPU: 2,048 under 20 GiB, 4,096 under 60, 8,192 under 160, else 16,384)")
    enable_mixed_chunk: bool = bool_field(False, help="decodes run in the same iteration as a prefill batch")
    schedule_policy: str = str_field("fcfs", choices=POLICIES,
                                     help="waiting order: arrival, longest prefix match, depth-first by shared "
                                          "prefix, longest max_tokens, highest response ratio (tokens the server "
                                          "ran since it queued over its uncached prompt), fewest tokens to prefill "
                                          "(a chunked prompt leaves room for shorter ones; all but fcfs and lof "
                                          "need a prefix cache)")
    ignore_eos: str = str_field("no_max_tokens", choices=IGNORE_EOS,
                                help="which requests ignore EOS, so that admission counts their remaining tokens at "
                                     "ratio 1.0: those without max_tokens, all (each then runs to its max_tokens: "
                                     "give outputs equal to it), or none (SGLang before 0.5)")
    schedule_conservativeness: float = float_field(1.0, min=0.0, help="scales the initial new_token_ratio")
    init_new_token_ratio: float = float_field(0.7, min=0.0, help="SGLANG_INIT_NEW_TOKEN_RATIO")
    min_new_token_ratio_factor: float = float_field(0.14, min=0.0, help="the ratio's floor as a share of the initial ratio")
    new_token_ratio_decay_steps: int = int_field(600, min=1, help="decode iterations to decay from the initial ratio "
                                                                  "to the floor")
    clip_max_new_tokens: int = int_field(4096, min=1, help="SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: cap on a request's "
                                                           "max_new_tokens in admission estimates")
    retract_decode_steps: int = int_field(20, min=0, help="SGLANG_RETRACT_DECODE_STEPS: tokens per remaining request "
                                                          "the cache frees after a retraction; the ratio's estimate")
    num_reserved_decode_tokens: int = int_field(
        512, min=0, help="disaggregated decode: tokens kept free per running or incoming request when pulling a "
                         "request's KV (--num-reserved-decode-tokens)")
    overlap_schedule: bool | str = attrs.field(default="auto", validator=_overlap_schedule, metadata={"help": (
        "SGLang's overlap scheduler (on unless --disable-overlap-schedule): each batch is planned while the one "
        "before it runs, with that batch's tokens not yet counted; arrivals wait a batch more and finished "
        "requests hold their KV one plan longer (schedlab.engine.ahead); \"auto\": on unless the run uses "
        "pipeline parallelism, disaggregation or [speculative], which it is not modelled with")})
    enable_priority_scheduling: bool = bool_field(
        False, help="sort the waiting queue by request priority (fcfs and lof) and let a more important arrival "
                    "preempt running requests (--enable-priority-scheduling)")
    schedule_low_priority_values_first: bool = bool_field(
        False, help="lower priority values are more important (SGLang's default: higher ones; vLLM's: lower)")
    priority_scheduling_preemption_threshold: int = int_field(
        10, help="how much more important an arrival must be than a running request to preempt it")
    disable_priority_preemption: bool = bool_field(False, help="priority scheduling without preemption")
    retraction_policy: str = str_field("length", choices=("length", "priority"),
                                       help="which running requests a decode out of memory retracts first: fewest "
                                            "generated tokens (then longest prompt), or least important first")
    max_queued_requests: int = int_field(
        0, min=0, help="most requests in the waiting queue (--max-queued-requests; 0 = no limit): a request that "
                       "arrives, or re-enters after a retraction or preemption, beyond it is turned away (rejected), "
                       "or with priority scheduling the least important queued one if the newcomer is more important")
    waiting_timeout_ms: float = float_field(
        0.0, min=0.0, help="SGLANG_REQ_WAITING_TIMEOUT (in seconds there): a request queued this long since it "
                           "entered the queue (arrived, or came back after a retraction or preemption) is aborted at "
                           "the next pass, counted as rejected (0 = off, SGLang's default)")
    running_timeout_ms: float = float_field(
        0.0, min=0.0, help="SGLANG_REQ_RUNNING_TIMEOUT (in seconds there): a request running this long since it was "
                           "first scheduled (retractions do not reset it) is aborted at the next pass as if its "
                           "client gave up, counted as rejected; one whose time comes while it is queued again "
                           "at the pass after it is readmitted (0 = off, SGLang's default)")
    context_length: int = int_field(
        0, min=0, help="the model's context (--context-length; by default the run's model's): a prompt of "
                       "min(context, pool) - 6 tokens or more is rejected, and one whose prompt + max_tokens exceeds "
                       "the context; max_new_tokens is cut to min(context, pool) - 2 - prompt (0 = no context, the "
                       "pool alone)")

    def __attrs_post_init__(self):
        if self.enable_mixed_chunk and not self.chunked_prefill_size:
            raise FieldError("enable_mixed_chunk", "needs chunked_prefill_size > 0 (SGLang mixes only chunked prefills)")
        if self.retraction_policy == "priority" and not self.enable_priority_scheduling:
            raise FieldError("retraction_policy",
                             "\"priority\" needs enable_priority_scheduling = true (SGLang's rule)")
        if self.preempts_by_priority and self.enable_mixed_chunk:
            raise FieldError("enable_priority_scheduling", "priority preemption with enable_mixed_chunk is not "
                                                           "modelled (set disable_priority_preemption = true)")

    @property
    def preempts_by_priority(self) -> bool:
        return self.enable_priority_scheduling and not self.disable_priority_preemption

    @property
    def priority_sign(self) -> int:
        """SGLang's ``priority_sign``: 1 if lower values go first, -1 if higher ones do; 0 off."""
        if not self.enable_priority_scheduling:
            return 0
        return 1 if self.schedule_low_priority_values_first else -1

    @property
    def plans_ahead(self) -> bool:
        """Whether batches are planned ahead (``overlap_schedule``; ``"auto"`` is on here, and the
        run's assembly turns it off where it is not modelled)."""
        return self.overlap_schedule is True or self.overlap_schedule == "auto"

    #: SGLang's cache is its radix tree (on unless ``--disable-radix-cache``): a run whose
    #: ``[kv_cache]`` names no kind gets it, as the ``vllm`` preset gets prefix caching
    kv_cache_kind: ClassVar[str] = "radix"
    #: SGLang's controller picks a data-parallel rank round robin (``--load-balance-method auto``,
    #: ``_handle_load_balance_method``: all but a disaggregated prefill server): a data-parallel run
    #: that names no rank router gets it, where other schedulers get vLLM's balancer (``vllm_dp``)
    rank_router_kind: ClassVar[str] = "round_robin"
    #: DP attention's ranks exchange their batch sizes every step (``prepare_mlp_sync_batch``), so
    #: they stop as soon as none has work (``[cluster] dp_sync_interval``'s default here)
    dp_sync_interval: ClassVar[int] = 1

    @staticmethod
    def cost_model_defaults(table: dict) -> dict:
        """Without its overlap scheduler (``overlap_schedule = false`` in ``table``) SGLang does
        the host's work between steps, so a cost model that can overlap it with the GPU's does not
        (the run's assembly applies this to a ``[cost_model]`` table that leaves
        ``async_scheduling`` out). ``"auto"``, turned off where planning ahead is not modelled,
        keeps the overlap's time: SGLang overlaps there."""
        return {"async_scheduling": False} if table.get("overlap_schedule") is False else {}

    @staticmethod
    def speculative_defaults(table: dict, method: str) -> dict:
        """What SGLang does with EAGLE or a draft model (``server_args``, the
        ``speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE")`` branch): ``max_running_requests``
        48 where unset, and mixed chunks off ("Mixed chunked prefill is disabled because of using
        eagle speculative decoding") -- refused here rather than changed under the user's hand.
        The run's assembly applies this when the run has ``[speculative]``."""
        if method not in ("eagle", "draft_model"):
            return {}
        if table.get("enable_mixed_chunk") is True:
            raise ConfigError("enable_mixed_chunk = true with [speculative] method = "
                              f"{method!r}: SGLang turns mixed chunks off with EAGLE and draft-model speculation "
                              "(leave it out)")
        return {} if "max_running_requests" in table else {"max_running_requests": 48}

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """What SGLang 0.5.23 picks where ``table`` is silent: ``context_length`` the run's model's
        (``ModelConfig.context_len``, from ``max_position_embeddings``), and
        ``chunked_prefill_size`` by the device's memory (``arg_groups/memory_hook.py``,
        ``_handle_gpu_memory_settings``): 2,048 tokens under 20 GiB (T4), 4,096 under 60 (A10,
        RTX 4090, A100 40GB, L40S), 8,192 under 160 (A100 80GB, H100, H200), else 16,384 (B200,
        MI300). The run's assembly applies them (``gpu`` or ``model`` None: not named)."""
        out = {}
        if model is not None and model.max_position_embeddings and "context_length" not in table:
            out["context_length"] = model.max_position_embeddings
        if "chunked_prefill_size" not in table and gpu is not None:
            memory = gpu.memory_gib
            out["chunked_prefill_size"] = 2048 if memory < 20 else 4096 if memory < 60 else 8192 if memory < 160 \
                else 16384
        return out


def dp_attention(config: SglangConfig, ranks: int) -> SglangConfig:
    """The settings of one of ``ranks`` data-parallel-attention ranks (``--enable-dp-attention
    --dp ranks``), as SGLang changes them: ``server_args._handle_data_parallelism`` divides
    ``chunked_prefill_size`` by the ranks (whatever value it ends up with: written or the GPU's
    default; chunking left on that way off, mixed chunks with it, as ``is_mixed_chunk`` needs a
    chunk) and scales ``schedule_conservativeness`` by 0.3; ``ModelRunner`` gives each rank
    ``max_running_requests // dp_size`` of one set (at least 1 here; unset, SGLang's own from the
    rank's pool is per rank already). One rank: ``config`` as it is."""
    if ranks <= 1:
        return config
    chunk = config.chunked_prefill_size // ranks
    slots = max(1, config.max_running_requests // ranks) if config.max_running_requests else 0
    return attrs.evolve(config, chunked_prefill_size=chunk, enable_mixed_chunk=config.enable_mixed_chunk and chunk > 0,
                        schedule_conservativeness=config.schedule_conservativeness * 0.3, max_running_requests=slots)


def max_running_requests(config: SglangConfig, kv) -> int:
    """SGLang's request slots on ``kv``'s pool (``KVCacheConfigurator.resolve_max_num_reqs``):
    ``max_running_requests`` if set, else ``pool / context x 512`` kept between 2,048 and 4,096
    (the context: ``context_length``, or the pool without one); either way at most half the
    pool's tokens."""
    pool = kv.num_blocks * kv.block_size
    slots = config.max_running_requests
    if not slots:
        slots = max(min(int(pool / (config.context_length or pool) * 512), 4096), 2048)
    return max(1, min(slots, pool // 2))


class _Adder:
    """One prefill pass's budgets (SGLang ``PrefillAdder`` with its ``PrefillBudget``), in tokens.

    SGLang's budget is ``available + evictable - total_offset`` with the pass's prompt tokens in
    ``total_offset``; here they are taken from the cache as they are admitted, so ``taken``
    adds them back: ``remaining = free + taken - total`` (with the same float arithmetic). A mixed
    step's offsets start at a token per request of the running batch (``num_mixed_decode_tokens``),
    whose decode pages are taken here before admission: ``decoded`` adds those back.
    """

    __slots__ = ("rem_input", "rem_chunk", "total", "current", "taken", "count", "admitted", "eos_states", "pages",
                 "decoded")

    def __init__(self, rem_input: int, rem_chunk: int | None, running_offset: float, mixed: int = 0,
                 decoded: int = 0):
        self.rem_input = rem_input
        self.rem_chunk = rem_chunk
        self.total = mixed
        self.total += running_offset   # SGLang: total_offset += sum([... running requests])
        self.current = mixed           # prompt tokens and pages of this pass (no decode estimate)
        self.taken = 0                 # prompt tokens already taken from the cache
        self.decoded = decoded         # tokens of the pages a mixed step's decodes took before admission
        self.count = 0                 # requests in this prefill batch ...
        self.admitted: list = []       # ... which (``can_run_list``)
        #: without a prefix cache, the requests' (tokens left, tokens held) by tokens left, made at
        #: the pass's first request that ignores EOS (``PrefillAdder.req_states``)
        self.eos_states: list | None = None
        self.pages = 0                 # the pages the pass's prefills take (with a tree: _paged_eviction)

    def base(self, kv, locked: int = 0) -> int:
        """SGLang's ``available + evictable`` (less a prefix being looked at, ``locked`` blocks)."""
        return (kv.num_free_blocks() - locked) * kv.block_size + self.taken + self.decoded

    def remaining(self, kv, locked: int = 0) -> float:
        return self.base(kv, locked) - self.total

    def remaining_current(self, kv) -> float:
        """``remaining_current``: what is left after this pass's prompts and pages alone."""
        return self.base(kv) - self.current

    def charge(self, tokens: int, max_new: int, page: int) -> None:
        """``_update_prefill_budget``: ``tokens`` were just taken from the cache. The prompt and
        chunk budgets are charged whole pages, as SGLang's (``ceil_paged_tokens``; only AMD's
        ``exact_chunk_fill`` charges the tokens)."""
        self.total += tokens + page + max_new
        self.current += tokens + page
        self.taken += tokens
        paged = -(-tokens // page) * page
        self.rem_input -= paged
        if self.rem_chunk is not None:
            self.rem_chunk -= paged
        self.count += 1

    def state(self, kv) -> str:
        """``budget_state``: out of memory, out of prompt budget, or room for more."""
        base = self.base(kv)
        if not (base - self.total > 0 and base - self.current > 0):
            return NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return OTHER
        return CONTINUE


CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"
#: tokens per request kept free when admitting requests that ignore EOS without a prefix cache
IGNORE_EOS_RESERVE_TOKENS = 1
#: why ``max_queued_requests`` and the timeouts turn a request away (SGLang's abort messages)
QUEUE_FULL = "The request queue is full."
OUTRANKED = "The request is aborted by a higher priority request."
WAITED_TOO_LONG = "Request waiting timeout reached."
RAN_TOO_LONG = "Request running timeout reached."


class SglangScheduler:
    """SGLang's prefill-first scheduler with new-token-ratio admission and retraction."""

    stable_between_events = True

    def __init__(self, config: SglangConfig | None = None, parallelism: Parallelism = SINGLE):
        # a data-parallel-attention rank runs with SGLang's per-rank settings (dp_attention)
        self.config = c = dp_attention(config or SglangConfig(), parallelism.data_parallel)
        self.ranks = parallelism.data_parallel
        #: the request slots (``max_running_requests``; None until the first plan sizes SGLang's own
        #: from the pool, :func:`max_running_requests`)
        self.slots = c.max_running_requests or None
        self._slots_sized = False
        self.init_ratio = min(c.init_new_token_ratio * c.schedule_conservativeness, 1.0)
        self.min_ratio = min(self.init_ratio * c.min_new_token_ratio_factor, 1.0)
        self.ratio_decay = (self.init_ratio - self.min_ratio) / c.new_token_ratio_decay_steps
        self._ratio0 = self.init_ratio  # the ratio at decode step ``_anchor`` ...
        self._anchor = 0
        self._mixed = 0                 # ... and mixed iterations since (they do not decay it)
        self._chunked = None            # the request whose prefill continues in chunks
        self._batch_full = False
        self._last_finish_ms = 0.0
        self.policy = Policy(c.schedule_policy, c.priority_sign)
        self._queue: SglangQueue | None = None
        #: finished requests whose queue entry is forgotten at the plan after next (planning
        #: ahead, a request the batch in flight finishes is still SGLang's to preempt): the
        #: latest, then those of the plan before
        self._leaving: list[int] = []
        self._left: list[int] = []
        #: priority preemption: ``seq_no -> [tokens, prefix]``, what SGLang last knew of a request's
        #: length (``full_untruncated_fill_ids``, set when it was last looked at for admission) and
        #: of its cached prefix (``prefix_len``: that look, a cache-aware order's match, 0 after a
        #: retraction), which ``preempt_to_schedule`` reads before looking again
        self._looked: dict[int, list] | None = None
        if c.preempts_by_priority:
            self._looked = {}
            self.policy.matched = {}
        self._fresh_batch = False       # the last pass's batch becomes the running batch
        self._last_adder: _Adder | None = None  # the last prefill pass's budgets
        self._prefill_only = False      # the pass formed a prefill batch the decodes sit out
        #: requests ignoring EOS whose max_tokens :meth:`limit_request` cut (they still ignore it)
        self._cut_ignoring_eos: set = set()
        self._said_eos_before_max = False  # (ignore_eos = "all" beside an output short of its max_tokens)
        self._preempted_now: list = []  # preempted by priority in this pass, in SGLang's order
        #: SGLang's ``processed_tokens_counter`` (``hrrn``): each batch launched adds its
        #: ``extend_num_tokens`` -- a prefill batch its prompt tokens, a decode batch what the
        #: running batch's object last had, when it was formed as a prefill or mixed batch
        self.processed_tokens = 0
        self.in_pass = False
        self.now = 0.0                  # the time of the pass under way
        self._running_extend = 0
        self._counted_steps = 0         # decode iterations counted into processed_tokens
        self._mixed_uncounted = 0       # ... and mixed ones among them, counted when formed
        #: overlap scheduling: engines plan each batch while the one before runs (engine.ahead) ...
        self.plans_ahead = c.plans_ahead
        #: ... and a request finished at an EOS is decoded once more (Plan.overshoot)
        self.overshoots = c.plans_ahead
        #: a running request whose client gave up runs once more, its token dropped, before it
        #: leaves (Scheduler.abort_request sets its ``to_finish``)
        self.aborts_run_once_more = True
        #: SGLANG_REQ_RUNNING_TIMEOUT: the engines abort a request this long after it was first
        #: scheduled, as a client's abort (schedlab.engine.run_limit)
        self.running_timeout_ms = c.running_timeout_ms
        self.running_timeout_reason = RAN_TOO_LONG
        self._held_before = False       # the last plan saw finished requests holding their KV
        self._prefilled = -1            # ... and formed a prefill batch: the decode steps after it
        #: one entry per retraction: (time, ids of the retracted requests in order, new ratio)
        self.retraction_log: list[tuple[float, tuple, float]] = []

    # -- optional protocol members --------------------------------------------------------
    def new_waiting_queue(self):
        c = self.config
        hrrn = c.schedule_policy == "hrrn"
        limited = c.max_queued_requests > 0
        timed = c.waiting_timeout_ms > 0
        self._queue = SglangQueue(self if hrrn or limited or timed else None, hrrn=hrrn, arrivals=limited,
                                  timed=timed)
        return self._queue

    def setting_notes(self, kv) -> list[str]:
        """Settings the run's cache makes moot (said once, as a warning): a cache-aware order
        without a prefix cache runs first come first served, as SGLang's
        ``_validate_and_adjust_policy`` turns it without its radix tree (but
        ``shortest-prefill-first``, which it refuses: :meth:`kv_problem`)."""
        policy = self.config.schedule_policy
        if policy in CACHE_AWARE and policy != "shortest-prefill-first" and not getattr(kv, "prefix_caching", False):
            return [f"schedule_policy = {policy!r} orders by cached prefixes, and the KV cache ({type(kv).__name__}) "
                    "caches none: the queue is first come first served (kind = \"radix\", or prefix_caching = "
                    "true, for SGLang's tree)"]
        return []

    def kv_problem(self, kv) -> str | None:
        """A chunk that is not whole pages: SGLang refuses to start with one
        (``arg_groups/validation_hook.py``), as it cuts each chunk to whole pages
        (``PrefillAdder.add_one_req``). At start-up SGLang also sizes its request slots from the
        pool: so does this (:func:`max_running_requests`; else the first plan does). And
        ``shortest-prefill-first`` without prefix caching, which SGLang refuses too, and
        ``dfs-weight`` over a prefix cache that is not a radix tree (it walks the tree's nodes)."""
        self._size_slots(kv)
        if self.config.schedule_policy == "shortest-prefill-first" and not getattr(kv, "prefix_caching", False):
            return ("schedule_policy = 'shortest-prefill-first' needs prefix caching, which SGLang refuses to start "
                    "without (\"Experimental shortest-prefill-first requires prefix caching\", "
                    "SchedulePolicy._validate_and_adjust_policy); use the radix cache ([kv_cache] kind = \"radix\", "
                    "or prefix_caching = true) or another policy")
        if self.config.schedule_policy == "dfs-weight" and getattr(kv, "prefix_caching", False) \
                and not callable(getattr(kv, "dfs_weight_order", None)):
            return (f"schedule_policy = 'dfs-weight' walks SGLang's radix tree, which the KV cache "
                    f"({type(kv).__name__}) has not got: use [kv_cache] kind = \"radix\", or another policy (lpm "
                    "orders by the longest cached prefix on any prefix cache)")
        chunk, page = self.config.chunked_prefill_size, kv.block_size
        if chunk % page:
            rank = f" (a rank's: the value divided by data_parallel = {self.ranks})" if self.ranks > 1 else ""
            whole = chunk - chunk % page
            total = f" ({whole * self.ranks} for the {self.ranks} ranks)" if self.ranks > 1 else ""
            return (f"chunked_prefill_size = {chunk}{rank} is not a multiple of the page ({page} tokens, the KV "
                    "cache's block_size), which SGLang refuses: chunks are whole pages; set [kv_cache] block_size "
                    f"= 1 (SGLang's default page_size) or [scheduler] chunked_prefill_size to a multiple, such as "
                    f"{whole}{total}")
        return None

    def limit_request(self, request, kv):
        """``request`` with SGLang's ``max_new_tokens`` (``Scheduler.init_req_max_new_tokens``):
        cut to ``max_req_len - prompt - 1``, ``max_req_len`` being ``min(context, pool) - 1``
        (``TpModelWorker.get_worker_info``), and to what an empty pool holds after the prompt's
        pages, a page and a token (``max_new_tokens_for_memory``). A request the tokenizer
        manager rejects (prompt + ``max_tokens`` beyond the context) is left for
        :meth:`rejection_reason`. One that ignores EOS still does once cut (SGLang cuts its
        ``max_new_tokens``, not its ``ignore_eos``)."""
        if self.config.ignore_eos == "all" and request.output_tokens < request.max_output_tokens \
                and not self._said_eos_before_max:
            self._said_eos_before_max = True
            warnings.warn(f"[scheduler] ignore_eos = \"all\": request {request.id} stops at its EOS after "
                          f"{request.output_tokens} tokens, before its max_tokens {request.max_output_tokens}, "
                          "which SGLang's --ignore-eos never does (it generates max_tokens, and admission counts "
                          "them): give outputs equal to max_tokens, or ignore_eos = \"no_max_tokens\"",
                          InputWarning, stacklevel=2)
        context, page = self.config.context_length, kv.block_size
        pool = kv.num_blocks * page
        room = pool - -(-request.prompt_tokens // page) * page - page - 1
        if context:
            if request.max_tokens is not None and request.prompt_tokens + request.max_tokens > context:
                return request
            room = min(room, context - 2 - request.prompt_tokens)
        room = min(room, pool - 2 - request.prompt_tokens)
        if room < 1 or request.max_output_tokens <= room:
            return request
        if self.ignores_eos(request):
            self._cut_ignoring_eos.add(request.id)
        return attrs.evolve(request, max_tokens=room)

    def _length_reason(self, request, kv) -> str | None:
        """SGLang's length checks: the scheduler's ``max_req_input_len`` (``max_req_len - 5``)
        and, with a context, the tokenizer manager's ``validate_total_tokens`` (on by default) on
        a request that names its ``max_tokens``."""
        context = self.config.context_length
        pool = kv.num_blocks * kv.block_size
        longest = min(context, pool) - 6 if context else pool - 6
        if request.prompt_tokens >= longest:
            return (f"Input length ({request.prompt_tokens} tokens) exceeds the maximum allowed length "
                    f"({longest} tokens): " + (f"context_length {context}, " if context else "") + f"pool {pool}")
        if context and request.max_tokens is not None and request.prompt_tokens + request.max_tokens > context:
            return (f"prompt {request.prompt_tokens} + max_tokens {request.max_tokens} exceeds the model's context "
                    f"length ({context})")
        return None

    def rejection_reason(self, request, kv) -> str | None:
        reason = self._length_reason(request, kv)
        if reason:
            return reason
        pool = kv.num_blocks * kv.block_size
        most = request.max_output_tokens
        # Admission needs tokens + min(max_new_tokens left, clip) + a page < the pool; a request
        # retracted late carries its generated tokens back, so the worst case is prompt +
        # max_tokens + a page (larger than the first admission's when the clip cuts it).
        need = request.prompt_tokens + min(most, self.config.clip_max_new_tokens) + kv.block_size
        if request.prompt_tokens + most + kv.block_size >= pool or need >= pool:
            return (f"prompt {request.prompt_tokens} + max_tokens {most} + a page of {kv.block_size} does not fit "
                    f"below the KV pool's {pool} tokens (SGLang's admission check; SGLang would cut max_new_tokens "
                    "to nothing)")
        if getattr(kv, "window", None) is not None:  # (a cache whose window layers hold blocks of their own --
            # vLLM's paged cache under SGLang's scheduler: the request alone must fit, prompt and answer)
            blocks = sequence_blocks(kv, request.prompt_tokens + most, request.prompt_tokens,
                                     self.config.chunked_prefill_size if self.config.chunked_prefill_size > 0
                                     else request.prompt_tokens)
            if blocks > kv.num_blocks:
                return (f"needs {blocks} KV blocks (prompt {request.prompt_tokens} + max_tokens {most}, the model's "
                        f"window layers' blocks too) but the cache has {kv.num_blocks}")
        if not getattr(kv, "prefix_caching", False) and self.ignores_eos(request):
            # (add_one_req_ignore_eos: even alone it needs more than a token free after its prompt's
            # pages, a page and its whole answer -- SGLang would keep it waiting, and every request
            # behind it, for ever)
            page = kv.block_size
            room = pool - -(-request.prompt_tokens // page) * page - page - IGNORE_EOS_RESERVE_TOKENS
            if most >= room:
                self._cut_ignoring_eos.discard(request.id)
                return (f"ignores EOS without a prefix cache and asks for {most} tokens: SGLang admits such a request "
                        f"only if more than {IGNORE_EOS_RESERVE_TOKENS} token stays free after its prompt's pages, a "
                        f"page and its whole answer (add_one_req_ignore_eos), at most {room - 1} tokens here; it "
                        "would wait for ever, and the requests queued behind it too")
        return None

    def on_finish(self, seq, now_ms: float) -> None:
        self._cut_ignoring_eos.discard(seq.request.id)
        if self._queue is not None:  # (its queue entry and what SGLang last looked at: kept two plans)
            self._leaving.append(seq.seq_no)
        elif self._looked is not None:
            self._looked.pop(seq.seq_no, None)
        if seq.status == "aborted" and not seq.num_computed_tokens:
            return  # aborted while queued: SGLang pops it from the waiting queue, the batch is as it was
        self._last_finish_ms = now_ms
        if self.plans_ahead and seq.status == "finished":
            return  # SGLang sees it finished once its result is processed: after the next plan
        self._batch_full = False

    def pull_headroom(self, running, pending: int, block_size: int) -> int:
        """Blocks a disaggregated decode instance keeps free when it pulls a request's KV, as
        SGLang's decode server pre-allocates (``disaggregation/decode.py``,
        ``DecodePreallocQueue._allocatable_tokens``): ``num_reserved_decode_tokens`` for every
        running request and every one already being received, and at least what the longest
        running request still needs to finish were all the others retracted -- so that
        retraction, which keeps one request, can always make room."""
        reserved = -(-self.config.num_reserved_decode_tokens * (len(running) + pending) // block_size)
        if not running:
            return reserved
        clip = self.config.clip_max_new_tokens
        longest = max(-(-(s.request.prompt_tokens + min(s.request.max_output_tokens, clip)) // block_size)
                      for s in running)
        held = sum(-(-max(s.num_computed_tokens, s.reserved_tokens) // block_size) for s in running)
        return max(reserved, longest - held)

    # -- new_token_ratio ----------------------------------------------------------------------
    def new_token_ratio(self, plan) -> float:
        """The ratio now: decayed once per decode-only iteration since it was last set."""
        steps = plan.decode_steps - self._anchor - self._mixed
        if steps <= 0:
            return self._ratio0
        ratio = self._ratio0
        if steps * self.ratio_decay < ratio - self.min_ratio:  # SGLang subtracts once per step
            for _ in range(steps):
                ratio -= self.ratio_decay
            return ratio
        return self.min_ratio

    def _set_ratio(self, ratio: float, anchor: int) -> None:
        self._ratio0 = ratio
        self._anchor = anchor
        self._mixed = 0

    def ignores_eos(self, request) -> bool:
        mode = self.config.ignore_eos
        return mode == "all" or (mode == "no_max_tokens" and (request.max_tokens is None
                                                              or request.id in self._cut_ignoring_eos))

    # -- one iteration ------------------------------------------------------------------------
    def _size_slots(self, kv) -> None:
        if not self._slots_sized:
            self.slots = max_running_requests(self.config, kv)
            self._slots_sized = True

    def schedule(self, plan) -> None:
        self._size_slots(plan.kv)
        steps = plan.decode_steps
        if steps != self._counted_steps:
            self.processed_tokens += (steps - self._counted_steps - self._mixed_uncounted) * self._running_extend
            self._counted_steps = steps
            self._mixed_uncounted = 0
        if self._queue is not None:
            self._queue.stamp_arrivals(self.processed_tokens)
        self.in_pass = True
        self.now = plan.now
        queue = self._queue
        timeout = self.config.waiting_timeout_ms
        # the loop top: the requests queued too long are found, the arrivals read (each meeting the
        # queue limit), then the former aborted (SGLang's timeout aborts ride behind the arrivals)
        expired = queue.expired(plan.now, timeout) if timeout and queue.entries else ()
        if queue is not None and queue.arrivals:
            arrivals = [s for s in queue.arrivals if s.status == "waiting"]  # (not aborted meanwhile)
            queue.arrivals.clear()
            queue.stamp_entries(arrivals, plan.now)
            self._limit_queue(plan, arrivals)
        for seq in expired:
            if seq.status == "waiting":  # (not turned away by the limit meanwhile)
                plan.reject(seq, WAITED_TOO_LONG)
                self._forget(seq)
        if self._left or self._leaving:
            entered, before, looked = self._queue.entered, self._queue.processed_before, self._looked
            for n in self._left:
                entered.pop(n, None)
                before.pop(n, None)
                if looked is not None:
                    looked.pop(n, None)
            self._left, self._leaving = self._leaving, []
        self._prefill_only = False
        self._schedule(plan)
        self._wake_for_paged_decodes(plan)
        self.in_pass = False
        if timeout:
            first = queue.first_entry()
            if first is not None:  # asked again when the longest-queued request times out
                plan.wake_at(first + timeout)
        if self.config.preempts_by_priority and plan.waiting:
            # the "full" mark is cleared at every pass: with the ratio decaying, a request may
            # fit a decode step later without anything else happening
            plan.wake_after(1)

    def _limit_queue(self, plan, entering: list) -> None:
        """``_abort_on_queued_limit`` for the requests of ``entering``, just pushed into the
        waiting queue, in the order SGLang adds them (``_add_request_to_queue``): one that finds
        ``max_queued_requests`` queued is turned away -- with priority scheduling, the least
        important queued request (ties: the latest queued) if the newcomer is strictly more
        important."""
        if not entering or not self.config.max_queued_requests:
            return
        limit = self.config.max_queued_requests
        sign = self.config.priority_sign
        waiting = plan.waiting
        unseen = set(entering)  # (SGLang has not added these yet)
        queued = len(waiting) - len(unseen)
        for seq in entering:
            unseen.discard(seq)
            if queued + 1 <= limit:
                queued += 1
                continue
            victim, why = seq, QUEUE_FULL
            if sign:
                entered = waiting.entered
                least = max((s for s in waiting if s is not seq and s not in unseen),
                            key=lambda s: (s.request.priority * sign, entered[s.seq_no]), default=None)
                if least is not None and seq.request.priority * sign < least.request.priority * sign:
                    victim, why = least, OUTRANKED
            plan.reject(victim, why)
            self._forget(victim)

    def _forget(self, seq) -> None:
        """``seq`` was turned away: what this scheduler kept of it goes."""
        n = seq.seq_no
        self._queue.entered.pop(n, None)
        self._queue.processed_before.pop(n, None)
        if self._looked is not None:
            self._looked.pop(n, None)

    def _schedule(self, plan) -> None:
        kv = plan.kv
        begin_pass = getattr(kv, "begin_pass", None)
        if begin_pass is not None:  # the last pass's prefills are in the tree now ...
            if self.plans_ahead:  # ... unless their batch is the one in flight: no decode step ran
                # since (the fast engine runs decode steps without asking; a prefill is asked for)
                begin_pass(plan.made_ahead and plan.decode_steps == self._prefilled)
                self._prefilled = -1
            else:
                begin_pass()
        if not plan.running and plan.now > self._last_finish_ms:
            self._set_ratio(self.init_ratio, plan.decode_steps)  # the server was idle
        finishing = self._finishing(plan)
        # finishing by length SGLang leaves out of the next decode; at an EOS it cannot foresee,
        # it decodes them once more (the token is thrown away)
        by_length = [s for s in finishing if s.num_generated >= s.request.max_output_tokens]
        eos = [s for s in finishing if s.num_generated < s.request.max_output_tokens]
        if self.plans_ahead:
            if self._held_before:  # their results are processed: the running batch lets them go
                self._batch_full = False
            self._held_before = bool(finishing)
        mixed_bs = 0      # the running batch's size, which a mixed step's chunk budget leaves out
        joined = False    # ... and whether its decodes run in this step
        paged_tree = kv.block_size > 1 and getattr(kv, "make_room", None) is not None
        decode_bs = decode_pages = 0  # a mixed step's decodes and the pages they take
        if self.config.enable_mixed_chunk and (plan.num_decoding or finishing):
            if plan.num_decoding or eos:
                decode_bs = plan.num_decoding + len(eos)
                decode_pages = self._decode_need(kv, [s for s in plan.running if s.status == "decoding"], ())
                decode_pages += self._decode_need(kv, eos, eos)
                joined = self._decode(plan, eos)
                if not joined and not by_length:
                    if begin_pass is not None:
                        kv.end_pass()
                    self._retract(plan, eos)
                    return
                # (else the decodes sit this step out: the queued result frees the finishing
                # requests' KV at its end)
            mixed_bs = plan.num_decoding + len(finishing)
        formed = self._prefill(plan, mixed_bs, len(finishing), joined, decode_pages * kv.block_size if joined else 0)
        if self._looked is not None and plan.preempted:  # (priority preemption took some of them)
            gone = set(plan.preempted)
            by_length = [s for s in by_length if s not in gone]
            eos = [s for s in eos if s not in gone]
        if begin_pass is not None:  # the batch's KV is allocated now (``prepare_for_extend``)
            kv.end_pass()
        if paged_tree and (formed or joined):
            self._paged_eviction(kv, formed, decode_bs if joined else 0, decode_pages if joined else 0)
        if by_length and (not formed or self.config.enable_mixed_chunk):
            self._batch_full = False  # update_running_batch (or the mixed step) leaves them out
        if formed:
            self._prefilled = plan.decode_steps + (1 if joined else 0)
            if joined:
                self._mixed += 1
            else:
                plan.skip_decode()
                self._prefill_only = True
            return
        if paged_tree and (plan.num_decoding or eos) and not joined:
            # SGLang's paged decode evicts until a page per request is free (its check first evicts
            # the pages the step needs, fewer: where it does not fit, both evict all they can)
            kv.make_room(plan.num_decoding + len(eos))
        if (plan.num_decoding or eos) and not self._decode(plan, eos):
            self._evict_for_decode(plan, eos)
            if by_length:
                return  # SGLang: decode next step, once the queued result has freed their KV
            self._retract(plan, eos)

    def _paged_eviction(self, kv, formed: bool, decode_bs: int, decode_pages: int) -> None:
        """With pages of more than a token SGLang evicts more than a step's allocation needs, as
        it estimates its pages before it allocates them: a prefill batch evicts until its prompt
        tokens and a page per request are free (``alloc_paged_token_slots_extend``), a decode
        batch until a page per request is (``alloc_paged_token_slots_decode``). The pass's
        blocks are taken (and their exact shortfall evicted) by now: evict on, least recently
        used first, to where SGLang's estimates stop -- a mixed step's prefill first, then its
        ``decode_bs`` decodes, which took ``decode_pages`` pages."""
        page = kv.block_size
        need = -decode_pages if decode_bs else -(10**18)
        if formed:
            adder = self._last_adder
            need = max(need, -(-adder.taken // page) + adder.count - adder.pages - decode_pages)
        if decode_bs:
            need = max(need, decode_bs - decode_pages)
        kv.make_room(need)

    def _wake_for_paged_decodes(self, plan) -> None:
        """With pages of more than a token, every decode step may evict (a page per request free
        first, :meth:`_paged_eviction`), which the engines' runs of decode steps without asking
        do not: ask again before a step finds fewer unused pages than requests running (whether or
        not the tree holds anything evictable now: a request finishing puts its pages in it)."""
        kv = plan.kv
        if kv.block_size == 1 or getattr(kv, "make_room", None) is None:
            return
        running = sum(1 for s in plan.running if s.status in ("decoding", "prefilling"))
        if running:  # (a prefill step is no decode step: the next one is the first after it)
            plan.wake_after(kv.blocks_before_eviction() // running + (0 if self._prefill_only else 1))

    @staticmethod
    def _decode(plan, eos: list) -> bool:
        """Decode every decoding request and, once more, the ``eos`` ones (overshoot) if the KV
        cache has room for all (``check_decode_mem``); False, with nothing changed, if not."""
        if not eos:
            return not plan.num_decoding or plan.decode_all()
        kv = plan.kv
        free = kv.num_free_blocks()
        if free < plan.num_decoding + len(eos):  # (each needs a block at most: count only when short)
            need = sum(kv.blocks_needed(s, 0, reserve_tokens=s.num_computed_tokens + 1) for s in eos)
            if plan.num_decoding:
                need += sum(kv.blocks_needed(s, 1) for s in plan.running if s.status == "decoding")
            if need > free:
                return False
        if plan.num_decoding and not plan.decode_all():
            return False
        for s in eos:
            plan.overshoot(s)
        return True

    @staticmethod
    def _decode_need(kv, seqs, eos) -> int:
        """The blocks the next decode of ``seqs`` takes (``new_tokens_required_next_decode``: a
        page for each whose KV ends on a page boundary), the ``eos`` ones decoded once more."""
        stopping = set(eos)
        return sum(kv.blocks_needed(s, 0, reserve_tokens=s.num_computed_tokens + 1) if s in stopping
                   else kv.blocks_needed(s, 1) for s in seqs)

    @staticmethod
    def _evict_for_decode(plan, eos: list) -> None:
        """The decode step does not fit, but SGLang's check evicts the tree's shortfall anyway,
        before it retracts (or skips the step): ``check_decode_mem`` (schedule_batch.py:3432)
        -> ``check_decode_capacity`` -> ``evict_to_free_tokens`` (mem_cache/allocator/base.py:155,
        171), called by ``update_running_batch`` (scheduler.py:4469)."""
        kv = plan.kv
        make_room = getattr(kv, "make_room", None)
        if make_room is None:
            return
        need = sum(kv.blocks_needed(s, 1) for s in plan.running if s.status == "decoding")
        need += sum(kv.blocks_needed(s, 0, reserve_tokens=s.num_computed_tokens + 1) for s in eos)
        make_room(need)

    def _finishing(self, plan) -> list:
        """Overlap scheduling: the requests the batch in flight finishes, still in SGLang's
        running batch and holding their KV (``_reqs_finishing_inflight``; none otherwise)."""
        running = plan.running
        if not self.plans_ahead or len(running) == plan.num_decoding + len(plan.prefilling):
            return []  # (nobody finished holds a slot: no need to look at everyone)
        return [s for s in running.holding() if s.status == "finished"]

    def _generated(self, plan, seq) -> int:
        """``len(output_ids)``: the tokens SGLang has added to ``seq`` -- with overlap scheduling
        not the one the batch in flight computes."""
        n = seq.num_generated
        return n - 1 if self.plans_ahead and plan.token_in_flight(seq) else n

    def _prefill(self, plan, mixed_bs: int, finishing: int, joined: bool, decoded: int = 0) -> bool:
        """Form a prefill batch (``_get_new_batch_prefill_raw``); True if it is not empty.
        ``finishing``: requests the batch in flight finishes (overlap), in the running batch;
        ``joined``: the running decodes join the step (mixed)."""
        c = self.config
        chunked = self._chunked
        if chunked is not None and chunked.status != "prefilling":
            chunked = self._chunked = None
        # SGLang's running batch: the chunked request is not in it, finishing ones are
        running_bs = plan.num_decoding + finishing
        if chunked is not None or not running_bs or self._fresh_batch:
            # the last pass's batch held the chunked request, which leaves it (``filter_batch``);
            # or nothing runs that could ever leave; or the last pass's batch, formed while
            # nothing ran, replaced the running batch and with it the flag
            self._batch_full = False
        self._fresh_batch = False
        preempting = c.preempts_by_priority
        if preempting:  # SGLang clears the mark at every pass, to try preemption
            self._batch_full = False
        if (self._batch_full or not plan.waiting) and chunked is None:
            return False
        if self.slots - running_bs <= 0 and chunked is None and not preempting:
            self._batch_full = True
            return False
        self.policy.calc_priority(plan)
        looked = self._looked
        if looked is not None and self.policy.matched:
            for n, m in self.policy.matched.items():
                looked.setdefault(n, [0, 0])[1] = m
            self.policy.matched.clear()
        rem_chunk = c.chunked_prefill_size - mixed_bs if c.chunked_prefill_size else None
        adder = self._last_adder = _Adder(c.max_prefill_tokens - mixed_bs, rem_chunk, self._running_offset(plan),
                                          mixed_bs, decoded)
        if chunked is not None and not self._add_chunked(plan, chunked, adder, self.policy.chunk_limit(
                plan.waiting, chunked.num_tokens - chunked.num_computed_tokens, adder.rem_chunk or 0,
                plan.kv.block_size)):
            return False  # its chunk does not fit: the decodes run and free memory first
        kv = plan.kv
        touch = getattr(kv, "touch", None)
        limit = self.slots - running_bs
        for seq in list(plan.waiting):
            if adder.state(kv) == OTHER:
                break
            if adder.count >= limit:
                self._batch_full = True
            if self._batch_full:
                freed = self._preempt_for(plan, seq, adder) if preempting else 0
                if not freed:
                    break
                limit += freed
            if touch is not None:  # ``init_next_round_input`` looks its prefix up
                touch(seq)
            result = self._add_one(plan, seq, adder)
            if result != CONTINUE:
                if result == NO_TOKEN:
                    self._batch_full = adder.count > 0 or running_bs > 0
                break
        if self._preempted_now:  # SGLang re-queues them after the pass (``_add_request_to_queue``)
            back = self._preempted_now
            self._preempted_now = []
            plan.waiting.move_to_back(back)
            self._limit_queue(plan, back)
        # a batch formed while nothing ran becomes the running batch; so does a mixed batch
        # (SGLang empties the running batch into it, ``mix_with_running``): its "full" mark and
        # its token count are the new batch's. Planning ahead, a request the batch in flight
        # finishes is still in the running batch when the next pass merges this one into it
        # (it is filtered out after the merge), so the running batch stays.
        self._fresh_batch = adder.count > 0 and (not running_bs or joined)
        if adder.count:  # (``extend_num_tokens``: a mixed batch's decodes count a token each)
            extend = adder.taken + (mixed_bs if joined else 0)
            self.processed_tokens += extend
            if self._fresh_batch:  # it becomes the running batch, its count with it
                self._running_extend = extend
            if joined:
                self._mixed_uncounted += 1
        return adder.count > 0

    def _running_batch(self, plan) -> list:
        """SGLang's running batch, in order: the decoding requests and, planning ahead, those
        the batch in flight finishes (the chunked request and this pass's admissions are not in it)."""
        if self.plans_ahead:
            return [s for s in plan.running.holding() if s.status in ("decoding", "finished")]
        return [s for s in plan.running if s.status == "decoding"]

    def _future_tokens(self, plan, seq, ratio: float) -> float:
        """``seq``'s future tokens in the budget: ``min(max_new - generated, 4096)`` times the
        ratio (1.0 for a request that ignores EOS; ``_get_running_request_total_token_offset``)."""
        clip = self.config.clip_max_new_tokens
        n = seq.request.max_output_tokens - seq.num_generated
        if self.plans_ahead and plan.token_in_flight(seq):  # (SGLang has not counted that token yet)
            n += 1
        n = n if n < clip else clip
        return n * 1.0 if self.ignores_eos(seq.request) else n * ratio

    def _running_offset(self, plan) -> float:
        """The running requests' future tokens (:meth:`_future_tokens`), added up in running order."""
        batch = self._running_batch(plan)
        if not batch:
            return 0
        ratio = self.new_token_ratio(plan)
        return sum([self._future_tokens(plan, seq, ratio) for seq in batch])

    def _forget_prefix(self, seq) -> None:
        """A retracted or preempted request's ``prefix_len`` is 0 (``reset_for_retract``)."""
        if self._looked is not None and seq.seq_no in self._looked:
            self._looked[seq.seq_no][1] = 0

    def _stays_queued(self, seq) -> None:
        """``seq`` was preempted or retracted: if the batch in flight finishes it -- before SGLang
        knew, so it is queued again to compute its last token -- its queue entry stays."""
        if seq.status == "waiting" and seq.seq_no in self._left:
            self._left.remove(seq.seq_no)

    def _preempt_for(self, plan, seq, adder: _Adder) -> int:
        """Preempt running requests less important than ``seq`` by more than the threshold, least
        important and latest queued first, until their future tokens cover its admission
        (``PrefillAdder.preempt_to_schedule``); how many were preempted (0: none, as too few
        qualify)."""
        c = self.config
        sign = c.priority_sign
        kv = plan.kv
        entered = self._queue.entered
        batch = self._running_batch(plan)
        ranked = sorted(batch, key=lambda s: (s.request.priority * -sign, -entered.get(s.seq_no, 0)))
        ratio = self.new_token_ratio(plan)
        tokens, prefix = self._looked.get(seq.seq_no, (0, 0))
        short = tokens - prefix + min(seq.request.max_output_tokens, c.clip_max_new_tokens) - adder.remaining(kv)
        chosen = {}
        for running in ranked:
            if (seq.request.priority - running.request.priority) * -sign <= c.priority_scheduling_preemption_threshold:
                break
            chosen[running] = offset = self._future_tokens(plan, running, ratio)
            short -= offset
            if short <= 0:
                break
        if not chosen or short > 0:
            return 0
        make_room = getattr(kv, "make_room", None)
        left = len(batch)
        for running in batch:  # released in running order, each followed by an eviction
            if running in chosen:
                adder.total -= chosen[running]
                left -= 1
                plan.preempt(running, discard_in_flight=self.plans_ahead)
                self._forget_prefix(running)
                self._stays_queued(running)
                if make_room is not None:
                    make_room(-(-c.retract_decode_steps * left // kv.block_size))
        # they re-enter the queue after the pass, in the order they were chosen (``preempt_list``)
        self._preempted_now.extend(s for s in chosen if s.status == "waiting")
        return len(chosen)

    def _reserve(self, seq) -> int:
        """``min(max_new_tokens, 4096)``: what an admitted request adds to the budget's offset
        (its whole ``max_new_tokens``, also after a retraction)."""
        return min(seq.request.max_output_tokens, self.config.clip_max_new_tokens)

    def _add_chunked(self, plan, seq, adder: _Adder, limit: int | None = None) -> bool:
        """The chunked request's next chunk (``add_chunked_req``), at most ``limit`` tokens."""
        kv = plan.kv
        left = seq.num_tokens - seq.num_computed_tokens
        rem = min(adder.rem_chunk, int(adder.remaining(kv)))
        if rem <= 0:
            rem = adder.rem_chunk  # it must make progress to release its KV
        if limit is not None and limit < rem:
            rem = limit
        n = min(left, rem)
        start = seq.num_computed_tokens
        if n <= 0 or not plan.prefill(seq, n):
            return False
        adder.pages += -(-(start + n) // kv.block_size) - start // kv.block_size
        last = n == left
        adder.charge(n, self._reserve(seq) if last else 0, kv.block_size)
        adder.admitted.append(seq)
        if last:
            self._chunked = None
        return True

    def _add_one(self, plan, seq, adder: _Adder) -> str:
        """Try to add a waiting request to the batch (``add_one_req``)."""
        kv = plan.kv
        page = kv.block_size
        hit = plan.cached_tokens(seq)
        if self._looked is not None:
            self._looked[seq.seq_no] = [seq.num_tokens, hit]
        extend = seq.num_tokens - hit
        if not getattr(kv, "prefix_caching", False) and self.ignores_eos(seq.request):
            return self._add_one_ignoring_eos(plan, seq, adder, extend)
        left = seq.request.max_output_tokens - seq.num_generated
        max_new = min(left if left > 0 else 0, self.config.clip_max_new_tokens)
        total = extend + max_new + page
        # with its cached prefix locked, that prefix is no longer evictable (``_lock_node``)
        locked = kv.blocks_needed(seq, 0, cached_tokens=hit) if hit else 0
        if not total < adder.remaining(kv, locked):
            return NO_TOKEN
        paged = -(-extend // page) * page
        if adder.rem_chunk is None and adder.count and paged >= adder.rem_input:
            return OTHER
        if adder.rem_chunk is not None and paged > adder.rem_chunk:
            if self._chunked is not None and self.config.schedule_policy == "shortest-prefill-first":
                return OTHER  # (the chunked prompt goes on after this pass: one at a time; its cap left room)
            n = adder.rem_chunk // page * page
            n = (hit + n) // page * page - hit
            if n <= 0:
                return OTHER
            if not plan.admit(seq, n):
                return NO_TOKEN
            adder.charge(n, 0, page)
            adder.pages += -(-(hit + n) // page) - hit // page
            self._chunked = seq
        else:
            if not plan.admit(seq, extend):
                return NO_TOKEN
            adder.charge(extend, self._reserve(seq), page)
            adder.pages += -(-seq.num_tokens // page) - hit // page
        adder.admitted.append(seq)
        return adder.state(kv)

    def _add_one_ignoring_eos(self, plan, seq, adder: _Adder, extend: int) -> str:
        """``add_one_req_ignore_eos``: without a prefix cache (``--disable-radix-cache``) SGLang
        admits a request that ignores EOS if its prompt's pages and a page more
        (``per_req_token_overhead``, the paged allocator's alignment) fit what is left and, with the
        requests finishing in order of their tokens left (each freeing its tokens), every step of
        the way keeps more than a token per request free after them. There is no ``rem_total``
        check and no prompt budget check: a request's own length is known, so the ratio's
        estimate is not used for it."""
        kv = plan.kv
        page = kv.block_size
        paged = -(-extend // page) * page + page  # (``paged_input``)
        current = adder.remaining_current(kv)
        if not paged <= min(current, adder.remaining(kv)):
            return NO_TOKEN
        states = adder.eos_states
        ratio = self.new_token_ratio(plan)
        if states is None:  # the pass's first: this request, the running batch, those admitted
            states = adder.eos_states = []
            for s in [seq, *self._running_batch(plan), *adder.admitted]:
                state = self._eos_state(plan, s, ratio)
                if state is not None:
                    states.append(state)
            states.sort(key=lambda x: x[0])
        else:
            state = self._eos_state(plan, seq, ratio)
            if state is not None:  # SGLang's insertion: before the first entry with as many left or
                i = 0              # more, or, if none has, before the last one
                for i in range(len(states)):
                    if state[0] <= states[i][0]:
                        break
                states.insert(i, state)
        free, freed = current - paged, 0
        for i, (left, held) in enumerate(states):
            bs = len(states) - i
            if free + freed - left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return NO_TOKEN
            freed += held
        if adder.rem_chunk is not None and extend > adder.rem_chunk:
            if adder.rem_chunk <= 0 or self._chunked is not None:
                # (a second prompt cut in one pass: SGLang's ``new_chunked_req`` would forget the
                # first; only a mixed step's budget, less its decodes, leaves a part page for it)
                return OTHER
            n = adder.rem_chunk  # (not cut to whole pages on this path)
            if not plan.admit(seq, n):
                return NO_TOKEN
            adder.charge(n, 0, page)
            self._chunked = seq
        else:
            if not plan.admit(seq, extend):
                return NO_TOKEN
            adder.charge(extend, self._reserve(seq), page)
        adder.admitted.append(seq)
        return adder.state(kv)

    def _eos_state(self, plan, seq, ratio: float) -> tuple | None:
        """``add_req_state``: ``seq``'s (tokens left, tokens held) -- its ``max_new_tokens``
        times the ratio (1.0 if it ignores EOS) less its output, and its prompt and output --
        or None if it has none left. Planning ahead, SGLang has not counted the token in flight."""
        generated = seq.num_generated
        if self.plans_ahead and plan.token_in_flight(seq):
            generated -= 1
        left = seq.request.max_output_tokens * (1.0 if self.ignores_eos(seq.request) else ratio) - generated
        if left <= 0:
            return None
        return left, seq.request.prompt_tokens + generated

    @staticmethod
    def _overshoot_what_fits(plan, eos: list) -> None:
        for s in eos:
            plan.overshoot(s)

    def _retract(self, plan, eos: list = ()) -> None:
        """Decode is out of memory (``retract_decode``): retract until the step fits, then decode
        (and decode the ``eos`` ones once more). Planning ahead, the ``eos`` ones -- finished at
        an EOS by the batch in flight, which SGLang does not know yet -- are in SGLang's batch
        like the others: one retracted computes its last token again (``Plan.preempt`` with
        ``discard_in_flight`` un-finishes it)."""
        c = self.config
        kv = plan.kv
        make_room = getattr(kv, "make_room", None)
        if eos:  # SGLang's running batch, in its order: those finishing by length left out
            stopping = set(eos)
            running = [s for s in plan.running.holding() if s.status == "decoding" or s in stopping]
        else:
            running = [s for s in plan.running if s.status == "decoding"]
        if len(running) <= 1 and not plan.num_decoding:  # one request at an EOS, nothing to retract
            self._overshoot_what_fits(plan, eos)
            return
        generated = {s: self._generated(plan, s) for s in running}
        # fewest generated tokens last, ties: longest prompt last (a stable sort, reversed); with
        # the priority policy, the least important last
        sign = -c.priority_sign if c.retraction_policy == "priority" else 0
        order = sorted(running, key=lambda s: (s.request.priority * sign, generated[s], -s.request.prompt_tokens),
                       reverse=True)
        retracted, victims = [], []
        while not retracted or kv.num_free_blocks() < self._decode_need(kv, order, eos):
            if len(order) <= 1:
                break
            victim = order.pop()
            # with overlap scheduling its queued result is skipped: its token in flight is lost
            plan.preempt(victim, discard_in_flight=self.plans_ahead)
            self._forget_prefix(victim)
            self._stays_queued(victim)
            retracted.append(victim.request.id)
            victims.append(victim)
            if make_room is not None:  # the freed prefix is evictable now: SGLang evicts at once
                make_room(-(-c.retract_decode_steps * len(order) // kv.block_size))
        # (re-queued as SGLang retracted them)
        self._limit_queue(plan, [s for s in victims if s.status == "waiting"])
        if eos and victims:
            gone = set(victims)
            eos = [s for s in eos if s not in gone]
        self._batch_full = False
        generated = sum(generated[s] for s in order)
        max_new = sum(s.request.max_output_tokens for s in order)
        ratio = min(1.0, (generated + c.retract_decode_steps * len(order)) / (max_new + 1))
        self._set_ratio(ratio, plan.decode_steps + 1)  # this iteration's decode does not decay it
        self.retraction_log.append((plan.now, tuple(retracted), ratio))
        if kv.block_size > 1 and make_room is not None:  # (a page per request left: _paged_eviction)
            make_room(len(order))
        if self._decode(plan, eos):
            return
        chunked = self._chunked
        if chunked is not None and chunked.status == "prefilling" and not plan.is_scheduled(chunked):
            plan.preempt(chunked)
            self._forget_prefix(chunked)
            self._chunked = None
            self._limit_queue(plan, [chunked])
            self.retraction_log.append((plan.now, (chunked.request.id,), ratio))
            if self._decode(plan, eos):
                return
        if eos:  # (SGLang would retract one of them; the finished requests' blocks come back after this plan)
            if plan.decode_all():
                self._overshoot_what_fits(plan, eos)
            return
        raise SimulationError(
            f"SGLang scheduler: {len(order)} running request(s) cannot decode even after retraction "
            f"({kv.num_free_blocks()}/{kv.num_blocks} KV blocks free) -- SGLang stops here too (retract_decode: "
            "'No space left for only one request'; with pipeline_parallel the requests of a batch in flight hold "
            "blocks it cannot retract): give the cache more blocks or lower max_running_requests")
