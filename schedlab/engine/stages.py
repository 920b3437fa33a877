"""Pipeline parallelism's rules that both engines share: the stages' clock, a batch's stage
times (at the clock ``[clock]`` gives it, :func:`stage_times`), what a scheduler sees while
batches are in flight, what becomes of a request whose client gives up while its batch is in
flight, and (with ``[power]``) the timeline row over the time in flight of a batch that gave no
token (:func:`hole_row`, :mod:`schedlab.energy.pipeline`).

vLLM V1 with ``--pipeline-parallel-size P`` keeps up to ``P`` batches in flight
(``EngineCore.step_with_batch_queue``, ``batch_queue_size = max_concurrent_batches = P``): it
schedules a batch and launches it without waiting while the queue has room and the scheduler
has something to schedule, then blocks until the oldest batch's output is back, updates the
scheduler with it and schedules again. A request whose token is still being computed has
nothing new to schedule (``num_new_tokens == 0``), so it sits out the batches launched
meanwhile; it still holds its place among the running requests (``max_num_seqs``).

A batch goes through the stages in order; a stage works on one batch at a time, in launch
order, and hands its activations to the next stage (:class:`StageClock`).

**A long prompt's chunks follow each other into the pipeline** (chunked prefill). vLLM 0.11's
scheduler advances ``request.num_computed_tokens`` when it schedules a request, not when the
output lands (``Scheduler._update_after_schedule``, ``vllm/v1/core/sched/scheduler.py``: "allowing
us to schedule the prefill request again immediately in the next scheduling step"), so the next
``schedule()`` -- the next batch in the queue -- gives a prompt with tokens left its next chunk
while the previous one is still in the pipeline. A request with nothing left to schedule
(``num_new_tokens == 0`` in ``Scheduler.schedule``: "PP>1 and we have already scheduled all prompt
tokens but they are not finished yet", or a decode whose token is not back) is skipped. Only the
batch holding a prompt's last chunk gives it a token (the model runner discards what it samples
for a partial prefill, ``GPUModelRunner._bookkeeping_sync``), so its first token comes when that
batch lands, and it decodes after. No extra wait is needed between chunks: a stage takes batches
in launch order, so chunk ``c`` has written its KV in a stage's layers before chunk ``c + 1``
reaches that stage. So here (:func:`launch_chunks`, :func:`stale`, :func:`rewind`):

* a launch counts each prompt chunk as computed at once; a prefilling request whose prompt has
  tokens left stays visible to the scheduler (in one or more batches in flight, with one
  ``max_num_seqs`` slot and the blocks of every chunk scheduled); one whose last chunk is
  launched sits out until that batch lands;
* a landing executes its chunks as a step would, and the request keeps its chunks still in flight;
* a prompt preempted while it has chunks in flight (the scheduler may pick it as a victim) frees
  every block, its scheduled chunks' too, and starts over, as vLLM's preemption does
  (``kv_cache_manager.free``, ``num_computed_tokens = 0``); its chunks in flight land without it
  (no token comes of a partial prefill).

**Victims in flight.** vLLM's scheduler keeps a request in flight in ``self.running``, so a
preemption may pick it: FCFS takes ``self.running.pop()``, the most recently admitted request
whether or not its token is back, and the priority policy the largest ``(priority,
arrival_time)`` among them all (``Scheduler.schedule``). ``_preempt_request`` frees its blocks --
those its batch in flight writes too -- sets ``num_computed_tokens = 0`` and puts it back in the
waiting queue, marking what it has in flight as stale (``num_stale_output_tokens``). Admission
passes over a request with stale output in flight ("resuming now could resample a position that
output later delivers. It drains within the pipeline depth."), admitting the requests behind it.
When its batch lands, ``update_from_output`` still appends what the batch sampled for it (a
decode's token and accepted drafts; the first token, if the batch held its prompt's last chunk)
and finishes it if that was its last (``stopped_preempted_reqs``). So here (:class:`Holds`,
:class:`Bumped`): a scheduler's victims may be in flight (:meth:`VisibleRunning.preemptible`,
which the built-in ``vllm`` / ``continuous`` scheduler asks); a victim any batch in flight holds
-- its decode, its prompt's last chunk or an earlier one -- frees its KV at once and is held
back, counted as outstanding but not in the waiting queue (though as waiting where vLLM counts
its queue: ``Plan.num_held``), until the last such batch has landed: that landing gives it its tokens (finishing it if they were its last) and puts it at
the front of the queue. A step that preempts admits nothing (vLLM: ``if not preempted_reqs``),
so with two stages nothing is admitted before the victim's batch lands; with more, later
batches admit the requests behind it. Preemption in flight is always by recompute: its KV is
being written. (Checked against vLLM 0.33's own scheduler: ``tools/vllm_diff.py --groups
pipeline``.)

**Empty batches hold a slot.** vLLM 0.33's ``step_with_batch_queue`` queues whatever
``schedule()`` returns while the scheduler has requests, an empty batch too (every running
request in flight, nothing admissible), and schedules again while the queue has room; an empty
batch runs no model but the workers answer in order, so it is back with the batch before it and
holds its slot until it is popped in turn. The next batch may then wait for one landing more
than the stages alone would ask. So here an empty plan with a batch in flight queues an empty
batch (no stage time, :class:`StageClock`: it completes with the batch launched before it), and
planning goes on while there is room; its landing executes nothing. Empty batches with no real
batch ahead of them are back already and are dropped. vLLM also schedules once after the last
request has finished or been aborted, to tell the workers of it (``has_requests`` counts
``has_finished_requests``): that empty batch is queued too (``Instance.ended`` counts the
requests that ended, and the first plan after one ends queues its batch even with nothing left
to plan), so a request arriving while the aborted one's batches are in flight may find the queue
full.

**Speculative decoding** (``[speculative]``). vLLM 0.33 builds the drafter on the last stage
only (``gpu_model_runner.py``: ``if self.speculative_config and get_pp_group().is_last_rank``),
beside the target's final hidden states and LM head; the engine core takes the drafts with the
batch's output (``take_draft_token_ids`` after ``update_from_output``). So a batch's decodes
carry ``1 + k`` tokens through every stage (the verify pass) and the drafter's passes, or
n-gram's ``proposer_ms``, lengthen the last stage's time for that batch
(:class:`~schedlab.drafting.DraftingCostModel`'s ``pipeline_ms``). A decode's next step needs
its drafts, which come with its batch's output: scheduling a decode clears its drafts
(``request.spec_token_ids = []``), so while its batch is in flight it has nothing to schedule
and sits out, as without speculation. Acceptance is drawn when the batch lands, exactly as a
colocated step draws it (:class:`~schedlab.speculative.Speculation`). The drafts a landing's
decoders verify next number ``k`` for that batch as launched (the drafter proposed for the
batch the scheduler sent, aborted requests included).

**Planning ahead** (a scheduler that ``plans_ahead`` and ``staggers_decodes``: the ``vllm``
preset's ``async_scheduling``, on by ``"auto"``). vLLM 0.33's V2 model runner, its default on a
GPU, keeps ``P + 1`` batches in flight with asynchronous scheduling (``VllmConfig.
max_concurrent_batches``) and its ``AsyncScheduler`` counts a batch's tokens as computed when it
schedules it: a request given a token -- a decode, or its prompt's last chunk -- has a
placeholder for it (``num_output_placeholders``) and may decode again ``P`` ``schedule()`` calls
later (``next_decode_eligible_step = current_step + decode_stagger``, ``decode_stagger = P``),
whether or not that batch is back; every call counts, an empty one too. So here
(:class:`Stagger`):

* the instance keeps ``P + 1`` batches in flight, and every plan counts (``serial``);
* a plan sees a request whose token is in flight once its decode is due -- as a decoder, its KV
  slots running on past the tokens in flight (``Plan.phantom``), kept with its blocks -- unless
  that token is its ``max_tokens``-th (vLLM skips it when ``num_output_tokens + 1 >= max_tokens``;
  one at an EOS is decoded once more: when the EOS lands the request finishes and the later
  batch's decode is thrown away, an overshoot, its share of the energy ``discarded_j``), and
  passes over a decoder whose decode is not due yet;
* a request with several decodes in flight gets a token from each landing, in order; preempted
  meanwhile, it is held until the last of them has landed, each giving it its token (vLLM's
  stale output, delivered);
* with nothing in flight vLLM would spin (each empty batch back at once) until a decode is due:
  the instance plans again at once;
* a batch starts its first stage once the tokens its decodes embed are back (:meth:`Stagger.ready`):
  the last stage broadcasts each sampled token to the first, which waits for it before it builds
  the batch's input (``_pp_broadcast_prev_sampled_token_ids``, vllm-project/vllm#32618), so a lone
  request decodes once per trip through the pipeline, as synchronously -- planning ahead fills
  the stages with other requests' batches meanwhile, it does not shorten a request's trip;
* a request preempted or aborted with a token in flight has cached what vLLM knew
  (:meth:`Stagger.cached`): vLLM caches a decode's blocks up to the tokens it has when it
  schedules it, and those the batches back computed when one lands;
* with speculative decoding a decode's drafts in flight count as accepted (``in_flight`` holds
  ``1 + d`` for it, and an admission's placeholder drafts too), so the next decode's KV slots run
  from that position; the landing draws acceptance as synchronously and takes the batch's
  ``1 + d`` off, the rejected drafts' slots staying with the request's blocks. The slots a
  landing's decoders took count from their computed tokens at the launch (``bases``). With
  drafts per batch size each request verifies the ``k`` of the batch that last scheduled it, not
  of the last batch to land: vLLM gives it that many placeholders when it schedules it, so a
  launch sets ``draft_k`` on its decodes and last prompt chunks (``Speculation.propose``).

Checked against vLLM 0.33's ``AsyncScheduler`` behind the batch queue (``tools/vllm_diff.py
--groups pipeline,pipeline_abort,pipeline_prefix,pipeline_spec,pipeline_dynamic_k --vllm-set
async_scheduling=true``). Not modelled for SGLang's overlap scheduler (refused: it has its own
pipeline loop).

**Clients that give up** (``[client] timeout_ms``, :mod:`schedlab.frontend`). vLLM 0.33's engine
core reads aborts before it schedules a batch (``EngineCoreProc.run_busy_loop`` handles the
input queue between calls of ``step_with_batch_queue``, which returns after each launch while
the queue has room) and, while it blocks on the oldest batch, once that batch's output is back
(``step_with_batch_queue``: ``_process_aborts_queue`` before ``update_from_output``). An abort is
``Scheduler.finish_requests`` (``vllm/v1/core/sched/scheduler.py``): the request leaves the
running list (its ``max_num_seqs`` slot is free) and ``_free_request`` returns its blocks to the
pool at once -- ``_free_blocks`` -> ``KVCacheManager.free``, deferred only for a KV connector
that consumes remote KV (``defer_block_free``), which a pipelined instance here has not -- so a
batch scheduled next may take them while the request's own batch is still in the pipeline.
When that batch lands, ``update_from_output`` skips the request ("the request is already
finished. This can happen if the request is aborted while the model is executing it (e.g., in
pipeline parallelism ...)"): its tokens from the batch are dropped. So here:

* the instance hears of an abort before it launches a batch (with nothing in flight, when the
  disconnect arrives) and when a batch lands -- before its output, if the disconnect came
  while the engine awaited it, strictly before the landing (one at that instant comes after
  the output, as an arrival then does) -- and frees the request's blocks (those its batches in
  flight took too) and slot then, wherever it is;
* a batch that lands after one of its requests was aborted executes without it: the request
  gets no token from it, and the batch's time is unchanged (the stages computed its share all
  the same). A batch that lost every request gives no token: its time counts as idle, as a
  batch of swaps only does (the busy share stays a share of the makespan, which ends with the
  last request done).

Checked against vLLM 0.33's batch queue: ``tools/vllm_diff.py --groups pipeline_abort``.
"""

from __future__ import annotations

import math
from typing import Iterator

from ..errors import ConfigError
from .clock import check_pipeline_ms
from .rank_cost import NOTHING

IN_FLIGHT = "in_flight"  # engine-internal: a sequence whose batch is in the pipeline


def forwarded(holder: str, name: str, *, settable: bool = False) -> property:
    """A property reading (and with ``settable`` writing) attribute ``name`` of the object in
    ``self.<holder>``: a pipelined instance answers the driver and the routers with its engine
    instance's state."""
    def get(self):
        return getattr(getattr(self, holder), name)

    if not settable:
        return property(get)

    def put(self, value) -> None:
        setattr(getattr(self, holder), name, value)

    return property(get, put)


#: What the driver, the cluster and the routers read of an instance, in both engines.
INSTANCE_READS = ("index", "outstanding", "waiting", "running", "kv", "release", "events", "aborts")


def instance_view(holder: str, *, reads: tuple = (), writes: tuple = ("hangup_ms",)) -> type:
    """A base class whose objects answer :data:`INSTANCE_READS` (and ``reads``) from the engine
    instance in ``self.<holder>`` and pass ``writes`` through to it: a pipelined instance stands
    in for the instance it drives."""
    names = {name: forwarded(holder, name) for name in INSTANCE_READS + reads}
    names.update((name, forwarded(holder, name, settable=True)) for name in writes)
    return type(f"InstanceView[{holder}]", (), names)


def stage_times(cost, batch, stages: int) -> tuple[tuple, float, float]:
    """``(stage_ms, send_ms, r)`` of a batch entering the pipeline: its stages' times and the
    activations' send from one stage to the next (the cost model's ``pipeline_ms``; with
    ``[clock]`` its ``pipeline_at``, which chooses the batch's clock ``r``, see
    :mod:`schedlab.energy.clock`). A batch of no token (swaps only) takes no stage time, at the
    clock a batch of nothing runs at (a locked clock, else the highest)."""
    if batch.num_batched_tokens:
        at = getattr(cost, "pipeline_at", None)
        if at is not None:
            return at(batch)
        stage_ms, send_ms = check_pipeline_ms(cost.pipeline_ms(batch), batch)
        return stage_ms, send_ms, 1.0
    ratio = getattr(cost, "clock_ratio", None)
    return (0.0,) * stages, 0.0, ratio(batch) if ratio is not None else 1.0


def hole_row(meter, rec, index: int, running: int, waiting: int, kv_used: int) -> None:
    """With ``[power]``: after a landing that gave no token (its row lasts 0 ms), a timeline row
    of no token over the batch's time in flight, carrying the stages' energy over it (so the
    rows cover every moment a batch is in flight, :mod:`schedlab.energy.pipeline`)."""
    hole = meter.hole()
    if hole is not None:
        start, duration, energy = hole
        rec.sample(start, index, running, waiting, kv_used, duration, 0, NOTHING, energy)


class Stagger:
    """Planning ahead on a pipeline (the module docstring): a request scheduled for a token -- a
    decode, or its prompt's last chunk -- may decode again ``stages`` plans later
    (``AsyncScheduler.decode_stagger``), its batch still in flight or not; every plan counts, an
    empty one too. Both engines keep the plan due on the sequence (``decode_due``), and when
    the batch giving it that token is back (``token_ready_ms``): a batch that decodes it again
    starts its first stage no earlier (:meth:`ready`)."""

    __slots__ = ("stride",)

    def __init__(self, stages: int):
        self.stride = stages

    def launched(self, seqs, serial: int, completion: float) -> None:
        """``seqs`` got a token to come in the batch of plan ``serial``, back at ``completion``."""
        stride = self.stride
        for seq in seqs:
            seq.decode_due = serial + stride
            seq.token_ready_ms = completion

    @staticmethod
    def ready(decoders, t: float) -> float:
        """When a batch launched at ``t`` decoding ``decoders`` may start its first stage: once
        the token each decodes from is back. The last stage samples it and broadcasts it to the
        first, which waits for it before it embeds the batch's input (vLLM's
        ``_pp_broadcast_prev_sampled_token_ids``, waited on in ``_prepare_input_ids``), so one
        request decodes at most once per trip through the pipeline, however many plans its
        stagger counts -- empty plans take no time."""
        for seq in decoders:
            if seq.token_ready_ms > t:
                t = seq.token_ready_ms
        return t

    @staticmethod
    def shown(seq, serial: int) -> bool:
        """Whether plan ``serial`` sees ``seq``, whose token is in flight: its decode is due and
        that token is not its ``max_tokens``-th (vLLM skips only that one: a request at an EOS
        decodes once more, the token thrown away when the EOS lands)."""
        request = seq.request
        return seq.decode_due <= serial and (request.stops_at_eos or seq.num_generated + 1 < request.target_tokens)

    @staticmethod
    def cached(seq, computed: int, hash_lookahead: int = 0) -> int:
        """The tokens vLLM has cached of ``seq``, preempted or aborted with a token in flight, whose
        ``computed`` tokens count its prompt's chunks as computed: a prompt's, or ``num_tokens`` (those it
        has) less ``cache_lag`` -- vLLM caches the tokens it knows when it schedules a decode
        (``min(computed + new, num_tokens)``) and, when a batch lands, those the batches back
        computed: so the last of its tokens only if a decode was scheduled since it landed; with
        EAGLE's block hashes (``hash_lookahead``) not the block whose next token is unknown. A
        prompt whose last chunk is in flight (``cache_lag`` -1) has its ``computed`` tokens cached:
        they are all known."""
        known = seq.num_tokens - hash_lookahead
        if seq.cache_lag < 0 or not seq.num_generated:
            return computed if computed < known else known
        lag = seq.cache_lag if seq.cache_lag > hash_lookahead else hash_lookahead
        return seq.num_tokens - lag

    @staticmethod
    def hidden(seq, serial: int) -> bool:
        """Whether plan ``serial`` passes over ``seq``, decoding with no token in flight: its
        decode is not due yet."""
        return seq.decode_due > serial


def refuse_ahead(engine) -> None:
    """ConfigError if a pipelined ``engine`` plans ahead where that is not modelled: a scheduler
    without vLLM's staggered decodes (``staggers_decodes``; SGLang's overlap scheduler)."""
    scheduler = engine.scheduler
    if not getattr(scheduler, "staggers_decodes", False):
        raise ConfigError(f"{type(scheduler).__name__} plans batches ahead (overlap_schedule / async_scheduling), "
                          "which on a pipeline is modelled by vLLM's rules only: set it to false")


class StageClock:
    """When each stage of the pipeline is next free (and when each started the last batch)."""

    __slots__ = ("free", "starts")

    def __init__(self, stages: int):
        self.free = [-math.inf] * stages
        self.starts = [0.0] * stages

    def launch(self, t: float, stage_ms, send_ms) -> float:
        """A batch launched at ``t`` taking ``stage_ms[k]`` on stage ``k`` and ``send_ms`` from one
        stage to the next (a number for every hop, or a tuple of each hop's): each stage starts it
        once it has arrived and the stage's previous batch is done (``starts[k]``). Returns when
        its last stage finishes."""
        free, starts = self.free, self.starts
        ready = t
        per_hop = isinstance(send_ms, tuple)
        for k, ms in enumerate(stage_ms):
            starts[k] = start = ready if ready > free[k] else free[k]
            free[k] = ready = start + ms
            if k + 1 < len(free):
                ready += send_ms[k] if per_hop else send_ms
        return ready


class Chunk:
    """A prompt chunk in a batch in flight: the request's computed tokens before it, its
    tokens, the request's preemption count at the launch, and whether it ends the prompt."""

    __slots__ = ("start", "tokens", "stamp", "last")

    def __init__(self, start: int, tokens: int, stamp: int, last: bool):
        self.start = start
        self.tokens = tokens
        self.stamp = stamp
        self.last = last


def launch_chunks(prefills) -> list:
    """A batch's prompt chunks (``plan.prefills``: ``(sequence, tokens)``) enter the pipeline:
    each sequence's computed tokens advance by its chunk now, as vLLM's
    ``Scheduler._update_after_schedule`` advances them at scheduling. Returns ``(sequence,
    Chunk)`` in plan order; the caller takes the sequences whose last chunk this is out of the
    scheduler's sight until the batch lands."""
    chunks = []
    for seq, n in prefills:
        start = seq.num_computed_tokens
        seq.num_computed_tokens = start + n
        chunks.append((seq, Chunk(start, n, seq.num_preemptions, start + n == seq.num_tokens)))
    return chunks


def stale(seq, chunk: Chunk) -> bool:
    """``seq`` was aborted or preempted since ``chunk`` was launched: the chunk lands without it."""
    return seq.status == "aborted" or seq.num_preemptions != chunk.stamp


class Bumped:
    """A request preempted while a batch holding its decode, or its prompt's last chunk, was in
    flight: what that batch brings it when it lands (vLLM keeps the token). ``drafts``: the
    drafts its decode verified (0 for a prompt's last chunk); ``decode``: it was a decode."""

    __slots__ = ("seq", "drafts", "decode")

    def __init__(self, seq, drafts: int, decode: bool):
        self.seq = seq
        self.drafts = drafts
        self.decode = decode


def bumped_chunks(chunks) -> list:
    """The :class:`Bumped` of ``chunks`` (a landing batch's ``(sequence, Chunk)``): last chunks of
    prompts preempted (not aborted) since the launch."""
    return [Bumped(seq, 0, False) for seq, chunk in chunks if chunk.last and seq.status != "aborted" and stale(seq, chunk)]


def tokens_for(spec, bumped: Bumped, generated: int, target: int) -> tuple[int, int]:
    """``(tokens, accepted drafts)`` a bumped request's landing batch gives it, having generated
    ``generated`` of its ``target``: one, and the drafts its decode verified that the target
    accepts (``spec.accepted``, as a decode step draws them), no more than it has left."""
    accepted = spec.accepted(bumped.seq, generated, bumped.drafts) if bumped.drafts else 0
    tokens = 1 + accepted
    left = target - generated
    return (tokens if tokens < left else left), accepted


def count_bumped(counters: dict, bumped: Bumped, tokens: int, accepted: int) -> None:
    """An instance's counters for the ``tokens`` a landing gave ``bumped`` (``accepted`` of its
    drafts), as a decode step or a prefill's completion counts its own."""
    counters["generated_tokens"] += tokens
    if bumped.decode:
        counters["decode_tokens"] += tokens
        counters["decode_seq_steps"] += 1
        if bumped.drafts:
            counters["spec_drafts"] += 1
            counters["spec_draft_tokens"] += bumped.drafts
            counters["spec_accepted_tokens"] += accepted


class Holds:
    """Which requests a pipelined instance's batches in flight hold, and the preempted ones among
    them that admission passes over until those batches have landed (vLLM 0.33's
    ``num_stale_output_tokens``, see the module docstring). Shared by both engines."""

    __slots__ = ("flying", "held")

    def __init__(self):
        self.flying: dict = {}  # request -> batches in flight holding a decode or a chunk of it
        self.held: dict = {}    # preempted requests waiting for those batches, in preemption order

    def __len__(self) -> int:
        return len(self.held)

    def launched(self, seqs) -> None:
        flying = self.flying
        for seq in seqs:
            flying[seq] = flying.get(seq, 0) + 1

    def landed(self, seqs) -> None:
        flying = self.flying
        for seq in seqs:
            left = flying[seq] - 1
            if left:
                flying[seq] = left
            else:
                del flying[seq]

    def hold(self, seq) -> bool:
        """Hold back ``seq``, just preempted, if a batch in flight holds it; False if none does."""
        if seq not in self.flying:
            return False
        self.held[seq] = None
        return True

    def drop(self, seq) -> bool:
        """``seq`` leaves (aborted, or finished by a landing's token); False if it was not held."""
        if seq not in self.held:
            return False
        del self.held[seq]
        return True

    def release(self, waiting) -> None:
        """Put the held requests no batch in flight holds any more at the front of ``waiting``,
        the one preempted last in front (vLLM prepends each victim as it preempts it)."""
        for seq in [s for s in self.held if s not in self.flying]:
            del self.held[seq]
            waiting.push_front(seq)


def dropped_chunks(chunks) -> list:
    """``(sequence, tokens)`` of the ``chunks`` whose sequences were preempted or aborted since
    the launch: computed in vain, they take their share of the batch's energy (``token_shares``)
    -- a preempted request's, an aborted one's counted apart (``discarded_j``: its row is written)."""
    return [(seq, chunk.tokens) for seq, chunk in chunks if stale(seq, chunk)]


def rewind(chunks) -> list:
    """Before a landing executes its (live) ``chunks``: each sequence counts the tokens before
    its chunk, as a step's execution expects (it adds the chunk). Returns what to give back
    afterwards (:func:`restore`): the tokens of the sequence's later chunks, still in flight."""
    ahead = []
    for seq, chunk in chunks:
        later = seq.num_computed_tokens - chunk.start - chunk.tokens
        seq.num_computed_tokens = chunk.start
        if later:
            ahead.append((seq, later))
    return ahead


def restore(ahead: list) -> None:
    """After the landing: the sequences count their chunks still in flight again."""
    for seq, later in ahead:
        seq.num_computed_tokens += later


class VisibleRunning:
    """The running sequences a scheduler may touch while batches are in flight: those not in
    the pipeline, in admission order. Its length counts every running sequence (an in-flight
    request keeps its slot)."""

    __slots__ = ("_running",)

    def __init__(self, running: dict):
        self._running = running

    def __iter__(self) -> Iterator:
        return (s for s in self._running if s.status != IN_FLIGHT)

    def __reversed__(self) -> Iterator:
        return (s for s in reversed(self._running) if s.status != IN_FLIGHT)

    def __len__(self) -> int:
        return len(self._running)

    def __bool__(self) -> bool:
        return bool(self._running)

    def __contains__(self, seq: object) -> bool:
        return seq in self._running and seq.status != IN_FLIGHT

    def last(self):
        return next(reversed(self), None)

    def holding(self) -> list:
        """Every running sequence, in admission order (none is finished and held here)."""
        return list(self._running)

    def preemptible(self) -> list:
        """Every running sequence, those in flight too, in admission order: whom a preemption
        may pick, as vLLM's ``self.running`` (see the module docstring)."""
        return list(self._running)
