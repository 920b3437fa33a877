"""One serving instance in the fast engine: a scheduler, a KV cache and a cost model on a clock.

The loop asks the scheduler for a plan at every *event* and executes it. When the plan only
decodes and the plugins allow it (see :mod:`schedlab.protocols`), the iterations that would
follow it unchanged -- until the next arrival, finish, wake-up time or KV shortage -- are
executed as one run, in closed form (:mod:`schedlab.engine.bulk`). Per-sequence Python work
happens only at events: admission, prefill chunks, preemption, swaps and finishing.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any, Callable

import attrs

from ..energy.meter import token_shares
from ..errors import SimulationError, StallError
from ..kv_window import sequence_blocks
from ..protocols import Batch
from ..queues import FcfsQueue, RunningView
from . import bulk, drain, run_limit
from .ahead import Ahead, AheadRunning, Marks, cached_tokens_at_preemption, counts_drafts_ahead, plans_ahead
from .clock import check_iteration_end, check_iteration_ms, check_step_increment
from .stall import check_kv_counts, stall_message
from .load import Release, load
from .plan import (FastPlan, ask_scheduler, host_share, kv_for, limit_hook, model_len_limit,
                   prefix_hits, refused_slot, rejection_hook, swapped_blocks)
from .admission import ConcurrencyLimit
from .recorder import Recorder
from .sequence import (
    ABORTED, DECODING, FINISHED, PARKED, PREFILLING, REJECTED, SWAPPED, WAITING, DecodeClock, Sequence,
)
from .stages import IN_FLIGHT, Holds, Stagger
from .taking import Untaken

INF = math.inf


def _run_no(seq) -> int:
    return seq.run_no


@attrs.frozen
class IterationRecord:
    """What an observer sees after each iteration (opt-in, see ``schedlab_iteration``)."""

    start_ms: float
    duration_ms: float
    batch: Batch
    running: int
    waiting: int
    kv_used_blocks: int
    preempted: tuple = ()     # ids of the requests preempted while planning this iteration
    running_ids: tuple = ()   # ids of the running requests, in admission order
    decode_tokens: int = 0    # tokens the decodes produced (with speculation: 1 + accepted drafts each)
    spec_k: int = 0           # speculation: the most drafts a decode could verify in this iteration
    accepted_tokens: int = 0  # speculation: drafts accepted (of batch.spec_tokens verified)
    kv_used_after: int = -1   # KV blocks in use after the iteration (finished requests' freed)
    kv_held_after: int = -1   # what the running sequences' counters say they hold, summed
    kv_shares_blocks: bool = False  # a prefix cache: sequences may share blocks, so least <= used <= held
    kv_least_after: int = -1  # a prefix cache: the fewest blocks the running sequences can share (own_blocks)
    preempted_generated: tuple = ()  # tokens each preempted request had generated (same order as preempted)
    discarded_decodes: int = 0  # decodes in the batch whose token is thrown away (Plan.overshoot)
    kv: Any = attrs.field(default=None, eq=False, repr=False)  # the KV cache itself, for its check_invariants()


class PreparedRun:
    """A planned iteration, or run of ``k`` identical decode iterations, not yet applied.

    The driver of an open-loop cluster keeps a decode run *pending* instead of applying it at
    once (see :meth:`Instance.step`): it ends at ``end`` unless an arrival routed to the instance
    cuts it short, and meanwhile routers read it in closed form (:meth:`grown_at`).
    """

    __slots__ = ("plan", "parked", "n_dec", "steps", "batch", "d0", "inc", "growth", "k", "start", "end")

    def __init__(self, plan, parked, n_dec, steps, batch, d0, inc, growth, k, start):
        self.plan, self.parked, self.n_dec, self.steps, self.batch = plan, parked, n_dec, steps, batch
        self.d0, self.inc, self.growth, self.k, self.start = d0, inc, growth, k, start
        self.end = start + bulk.run_ms(k, d0, inc)

    def started_before(self, t: float) -> int:
        """Iterations of the run that start before ``t`` (> start): the ones an arrival at ``t``
        cannot join; at least 1, at most ``k``."""
        n = bulk.steps_before(self.start, t, self.d0, self.inc)
        return n if n < self.k else self.k

    def busy_at(self, t: float) -> bool:
        """An iteration of the run is in progress at ``t`` (not between two of them)."""
        return t > self.start and self.start + bulk.run_ms(self.started_before(t), self.d0, self.inc) > t

    def grown_at(self, t: float) -> int:
        """Blocks the run has taken by time ``t`` beyond those of its first iteration: the
        KV of the iteration in progress at ``t`` (one that starts at ``t`` has not begun)."""
        if self.growth is None or t <= self.start:
            return 0
        return self.growth.blocks(self.started_before(t) - 1)


def default_rejection_reason(request, kv) -> str | None:
    """A request that cannot fit in the whole cache even alone can never finish."""
    tokens = request.prompt_tokens + request.max_output_tokens - 1
    need = sequence_blocks(kv, tokens)
    if need > kv.num_blocks:
        return (f"needs {need} KV blocks (prompt {request.prompt_tokens} + max_tokens "
                f"{request.max_output_tokens}) but the cache has {kv.num_blocks}")
    return None


def free_swapped(kv, seq) -> None:
    """Drop a swapped-out sequence's copy in swap space (its client gave up); both engines."""
    drop = getattr(kv, "free_swapped", None)
    if drop is None:
        raise SimulationError(f"request {seq.request.id} was aborted while swapped out, but the KV cache "
                              f"{type(kv).__name__} has no free_swapped(seq) to drop its copy in swap space")
    drop(seq)


def held_blocks(seqs, kv) -> int:
    """Blocks the sequences hold by their counters: ``max(ceil(reserved / B), ceil(computed / B))`` each,
    plus what their window layers hold (a cache's ``window_blocks``, :mod:`schedlab.kv_window`)."""
    total = 0
    block_size = kv.block_size
    for s in seqs:
        c, r = s.num_computed_tokens, s.reserved_tokens
        total += -(-(c if c > r else r) // block_size)
    if getattr(kv, "window", None) is not None:
        total += sum(kv.window_blocks(s) for s in seqs)
    return total


def own_blocks(seqs, kv) -> int:
    """The fewest distinct blocks the sequences can hold in a cache that shares prefix blocks:
    a block may be shared only if it ends within its request's shared prefix
    (:attr:`~schedlab.model.Request.shared_prefix_tokens`), so every later block is the
    sequence's own; the shared ones are at least the most any one sequence holds (its blocks are
    distinct). Window layers' blocks are their sequence's own (:func:`held_blocks`)."""
    own = most_shared = 0
    block_size = kv.block_size
    for s in seqs:
        c, r = s.num_computed_tokens, s.reserved_tokens
        held = -(-(c if c > r else r) // block_size)
        shared = min(held, s.request.shared_prefix_tokens // block_size)
        own += held - shared
        if shared > most_shared:
            most_shared = shared
    if getattr(kv, "window", None) is not None:
        own += sum(kv.window_blocks(s) for s in seqs)
    return own + most_shared


class Instance:
    """A simulated server. ``step()`` does its next event (:meth:`next_event`); ``arrive(request)``
    hands it a request.

    ``speculation`` (a :class:`~schedlab.speculative.Speculation`) turns on speculative
    decoding: every decode step then verifies drafts, and runs one iteration at a time.
    """

    def __init__(self, index: int, scheduler, cost_model, kv, recorder: Recorder, *,
                 observer: Callable | None = None, stall_limit: int = 100_000,
                 track_finished: bool = False, speculation=None, meter=None):
        self.index = index
        self.scheduler = scheduler
        self.answer_segment = getattr(scheduler, "answer_segment", 0) or 0  # (Scheduler protocol)
        self.cost = cost_model
        self.kv = kv
        self.plan_kv = kv_for(scheduler, kv)  # what its plans show the scheduler
        self.rec = recorder
        cap = getattr(scheduler, "max_in_flight", None)  # (Scheduler protocol: TGI's max_concurrent_requests)
        self.concurrency = ConcurrencyLimit(cap) if cap else None
        if cap:
            recorder.limits[index] = self.concurrency
        self.counters = recorder.counters
        self.observer = observer
        self.stall_limit = stall_limit
        self.track_finished = track_finished
        #: a closed loop over several instances or with clients that may give up (set by the
        #: driver): see :meth:`step`
        self.plan_finishes_alone = False
        self.now = 0.0
        self.clock = DecodeClock()
        make_queue = getattr(scheduler, "new_waiting_queue", None)
        self.waiting = make_queue() if make_queue is not None else FcfsQueue()
        self.untaken = Untaken()  # arrivals no plan has taken yet (their taken_ms: engine.taking)
        self.running: dict = {}
        self.running_view = RunningView(self.running)
        self.prefilling: dict = {}
        self.swapped: deque = deque()
        self.n_decoding = 0
        self.cross_at = [0] * kv.block_size  # growing decoders needing a block at counters = index mod B
        self.n_growing = 0
        self.ctx_offset = 0          # decode context tokens = ctx_offset + n_decoding * clock.steps
        self.finish_heap: list = []
        self.itl_groups: dict[float, int] = {}  # last-token time -> decoding sequences
        self.itl_merge = -INF        # end of the last decode iteration
        self.off_cycle: dict = {}    # decoders left out of the last decode iteration -> their ITL group
        window = getattr(kv, "window", None)
        grows = callable(getattr(kv, "grow", None))
        self.kv_grows = grows and window is None  # decodes' blocks taken by counting (cross_at)
        # a cache with sliding-window layers that grows in bulk: decoders also free window blocks
        # once a period after their window starts to slide (SlidingGrowth; free_at, sliding)
        self.window = window if grows else None
        self.free_at = [0] * kv.block_size  # sliding decoders freeing window blocks at counters = index mod B
        self.sliding: dict = {}              # ... those decoders -> their index
        self.slide_heap: list = []           # (decode counter of its window's first free, seq_no, decoder)
        # decoders whose window count the pattern does not follow yet (their last allocation was no
        # decode: a prompt's last chunk, a swap-in, a pull); a decode step allocates them itself
        self.window_fresh: dict = {}  # (in the order they came: deterministic)
        self.spec = speculation
        self.spec_k = speculation.k_max if speculation is not None else 0  # drafts per decode in the next step
        #: speculation: the longest sequence (max_model_len), which drafts and their KV slots stay
        #: within (plan.capped_verify, capped_slots; 0: no limit)
        self.longest = model_len_limit(scheduler, kv) if speculation is not None else 0
        if speculation is not None:
            speculation.configure_cache(kv, scheduler)
        # Speculation: decoders keep the slots of their last step (see _verify), so block
        # growth is not periodic and cross_at is not kept.
        self.track_growth = speculation is None
        # Asynchronous scheduling (schedlab.engine.ahead): each plan is made while the batch
        # before it runs; bulk runs only from settled plans.
        self.ahead = Ahead() if plans_ahead(scheduler) else None
        #: planning ahead, the drafts in flight count as computed (engine.ahead, Ahead.phantom)
        self.drafts_ahead = counts_drafts_ahead(scheduler, speculation)
        self.marks = None  # which decoders' input tokens are in flight at a plan, kept lazily
        if self.ahead is not None:
            self.running_view = AheadRunning(self.running, self.ahead.held)
            self.marks = Marks()
        # Speculative steps draw each sequence's tokens: no two are alike, so no bulk runs.
        self.bulk_ok = ((self.kv_grows or self.window is not None)
                        and bool(getattr(scheduler, "stable_between_events", False))
                        and callable(getattr(cost_model, "decode_step_increment", None)) and observer is None
                        and speculation is None)
        self.count_prefix = bool(getattr(kv, "prefix_caching", False))  # counted hits, shared blocks
        self.prefix_hit = prefix_hits(kv)  # a sequence's hit, checked; None: never asked (always 0)
        self._room_before_eviction = getattr(kv, "blocks_before_eviction", None)
        self.host_tier = getattr(kv, "host", None)  # a host-memory tier under the prefix cache
        if self.host_tier is not None:
            self.host_tier.attach(self.counters)
        # Longest and shortest decode context, for cost models that ask (lazy-deletion heaps
        # of anchors: a sequence's context is anchor + 1 + clock.steps while it decodes).
        self.track_range = bool(getattr(cost_model, "needs_context_range", False))
        self.anchor_high: list = []
        self.anchor_low: list = []
        self._rejection_reason = rejection_hook(scheduler, default_rejection_reason)  # (its answers checked)
        self.limit_request = limit_hook(scheduler)  # the request as served (max_model_len), checked
        self._on_finish = getattr(scheduler, "on_finish", None)
        #: the scheduler may decode a finished request holding its slot once more (Plan.overshoot):
        #: it is asked at every plan made beside one -- or, if it reads no other (not
        #: ``reads_held``), beside one that stopped at an EOS
        self.asks_beside_held = bool(getattr(scheduler, "overshoots", False))
        self.reads_held = self.asks_beside_held and bool(getattr(scheduler, "reads_held", True))
        self.finished: list = []     # (request, time) since the driver last collected
        self.serial = 0
        self.ended = 0  # requests finished or aborted here (a pipeline's next plan tells its workers)
        self.run_count = 0  # sequences that entered the running list so far (Sequence.run_no)
        self.ask_at_step = None  # the decode step by which the scheduler asked to be asked again (Plan.wake_after)
        self.events = 0              # executed plans: one iteration, or one bulk run of them
        self.since_progress = 0
        self.kv_need_high = math.floor(recorder.kv_high_water * kv.num_blocks) + 1
        self.busy_ms = 0.0           # this instance's share of the counters (per-pool metrics)
        self.kv_block_ms = 0.0
        self.iterations = 0
        self.kv_peak = 0
        # Disaggregated serving (schedlab.engine.disagg): the prefill or decode part of the
        # flow, with timed events of its own (transfers landing, blocks released); None
        # for a colocated instance.
        self.stage = None
        self.asleep = False          # planned nothing; plans again at next_plan_time() or when woken
        self.empty_plans = 0         # plans in a row that scheduled nothing, nothing arriving or aborted
        #                              between them: a stall past 1,000 (a scheduler that wakes itself for ever)
        self.sleep_wake = INF
        self.release = Release()     # what the last iteration gives back at its end (routers' view)
        self.meter = meter           # a schedlab.energy.EnergyMeter with [power]; None costs nothing
        # Clients that give up (schedlab.frontend): (when the engine hears of it, seq_no, sequence);
        # their disconnect takes hangup_ms to get here. Entries of finished sequences are dropped lazily.
        self.aborts: list = []
        self.hangup_ms = 0.0
        #: an abort that reaches the engine during an iteration takes effect at its end, before its
        #: output (vLLM's EngineCore.step): the iteration computes the request for nothing (not on
        #: a pipeline, which has its own rule, nor on a prefill instance: _drops_output)
        self.aborts_drop_output = True
        #: a running request whose abort is read at a plan runs once more, its output dropped,
        #: then leaves (SGLang's ``to_finish``; the scheduler's ``aborts_run_once_more``): those
        #: waiting for that iteration (None: the rule is off)
        self.to_finish: set | None = set() if getattr(scheduler, "aborts_run_once_more", False) else None
        if self.to_finish is not None:
            self.aborts_drop_output = False
        #: the scheduler's limit on a request's time since it was first scheduled: aborted then as
        #: if its client gave up, counted as rejected (0: none; :mod:`schedlab.engine.run_limit`)
        self.running_timeout_ms = getattr(scheduler, "running_timeout_ms", 0.0) or 0.0
        self.running_timeout_reason = getattr(scheduler, "running_timeout_reason", run_limit.DEFAULT_REASON)
        #: blocks that aborts heard at a pipeline's landing, before its output, freed: held until
        #: then, they count in the landing's KV usage (:mod:`schedlab.engine.pipeline`)
        self.held_to_landing = 0
        # A pipelined instance (schedlab.engine.pipeline): its decodes in a batch in flight ->
        # the tokens that batch computes for them (their KV slots are taken, not yet counted).
        self.in_flight: dict | None = None
        self.holds: Holds | None = None  # pipelined: requests batches in flight hold (engine.stages)
        self.stagger = None  # pipelined and planning ahead: stages.Stagger
        self.pending: PreparedRun | None = None  # a decode run planned, not yet applied (see step)
        #: autoscaled and draining with a drain timeout (:mod:`schedlab.engine.drain`): at its first
        #: plan at or after this time it aborts every request it holds (inf: none)
        self.drain_at = INF
        self.drain_aborted = 0  # requests a drain timeout aborted here

    # -- arrivals ---------------------------------------------------------------------------
    def arrive(self, request, seq_no: int) -> Sequence | None:
        """Queue ``request`` (which has arrived by now), or reject it if it can never be served,
        or abort it if its client has already given up."""
        self.empty_plans = 0  # (a stall is empty plans with nothing new: not the wake-ups arrivals cause)
        if self.limit_request is not None:
            request = self.limit_request(request, self.kv)
        seq = Sequence(request, seq_no, self.clock)
        reason = self.concurrency.refusal(request.arrival_ms) if self.concurrency is not None else None
        reason = reason or self._rejection_reason(request, self.kv)
        if not reason and self.spec is not None:
            reason = self.spec.rejection_reason(self._rejection_reason, request, self.kv, self.longest)
        if reason:
            seq.status = REJECTED
            self.rec.reject(seq, self.index, reason)
            if self.track_finished:
                self.finished.append((request, request.arrival_ms))
            return None
        if self.concurrency is not None:
            self.concurrency.accept()
        if request.timeout_ms is not None:
            abort_at = request.sent_at + request.timeout_ms + self.hangup_ms
            if abort_at <= request.arrival_ms:  # the client left before the request got here
                seq.status = ABORTED
                self.rec.request_done(seq, self.index, request.arrival_ms, aborted=True)
                return None
            heapq.heappush(self.aborts, (abort_at, seq_no, seq))
        self.untaken.add(seq)
        if self.ahead is not None and self.ahead.defers(request.arrival_ms, self.now):
            self.ahead.deferred.append(seq)  # the batch that follows the one in progress is planned
            return seq
        self._queue(seq)
        return seq

    def _queue(self, seq: Sequence) -> None:
        self.waiting.push(seq)
        if len(self.waiting) > self.counters["peak_waiting"]:
            self.counters["peak_waiting"] = len(self.waiting)

    def next_abort(self) -> float:
        """When the engine next aborts a request whose client gave up (inf: none pending). Entries
        of requests that are done go; not those of a request finished by the batch in flight and
        still held, which SGLang's plan may yet preempt and send back to the queue (:meth:`unfinish_held`)."""
        aborts, ahead = self.aborts, self.ahead
        while aborts and aborts[0][2].status in (FINISHED, ABORTED) and (
                ahead is None or aborts[0][2] not in ahead.held):
            heapq.heappop(aborts)
        return aborts[0][0] if aborts else INF

    def settle(self, t: float) -> None:
        """Before requests arriving at ``t`` are routed: between iterations at ``t``, abort what
        is due by then, so that routers see the aborted requests gone at their abort (as they see
        an iteration's finished requests gone at its end)."""
        if self._aborts_at_plan_time() and self.ahead.made_ahead(t):
            # the plan made ahead at t applies them (before it or after it): routers see the
            # requests that leave then gone meanwhile
            loop_top = self._loop_top_aborts()
            aborts, due = self.aborts, []
            last = self.ahead.start if loop_top else t
            while aborts and aborts[0][0] <= last:
                due.append(heapq.heappop(aborts))
            for entry in due:
                heapq.heappush(aborts, entry)
            self.ahead.note_leaving(due, loop_top)
            return
        if self.aborts and self.pending is None and self.next_abort() <= t:
            if self.asleep and self.sleep_wake <= t:  # event by event: its sleep ends now (see step)
                self.wake(t)
            if self.now == t:
                self._abort_due()

    def drain_by(self, t: float) -> None:
        """Autoscaled, draining: abort every request held at the first plan at or after ``t`` (a
        drain timeout, :mod:`schedlab.engine.drain`; inf: none, a timer cancelled). A pending run
        is cut to the iterations that start before ``t``, as a plan knowing ``t`` would have made
        it (the driver then reads this instance's next event again)."""
        self.drain_at = t
        run = self.pending
        if run is not None and t < run.end:
            k = run.started_before(t) if t > run.start else 1
            if k < run.k:
                run.k = k
                run.end = run.start + bulk.run_ms(k, run.d0, run.inc)

    def drain_kill(self) -> None:
        """The drain timeout has come (at this plan, ``now``): every request held is aborted as if
        its client's abort reached the engine now (:mod:`schedlab.engine.drain`)."""
        self.drain_at = INF
        now = self.now
        for seq in drain.victims(self, now):
            heapq.heappush(self.aborts, (now, drain.ORDER + seq.seq_no, seq))

    def _abort_due(self, plan: FastPlan | None = None, *, strictly: bool = False, upto: float | None = None) -> None:
        """Abort, at this plan, every request whose client's disconnect has arrived by now
        (vLLM: the engine core reads the aborts from its input queue between steps, frees the
        requests' KV blocks and slots). A request in a pipeline's batch in flight is freed too;
        the batch drops its output when it lands (:mod:`schedlab.engine.pipeline`). ``plan``:
        made ahead just before, for the batch starting now; a decode it gave an aborted request
        is computed for nothing (``overshoots``; its prefill chunk too, :meth:`_apply`).
        ``strictly``: only those that came before now (a pipeline's landing now comes first);
        ``upto``: those that came by then (SGLang's overlap loop read them then, see
        :meth:`_plan_ahead`)."""
        aborts, now = self.aborts, self.now
        last = now if upto is None else upto
        while aborts and (aborts[0][0] < last if strictly else aborts[0][0] <= last):
            self._abort_one(heapq.heappop(aborts)[2], plan)

    def _abort_one(self, seq: Sequence, plan: FastPlan | None = None) -> None:
        """Abort ``seq`` now, wherever it is (:meth:`_abort_due`)."""
        now = self.now
        status = seq.status
        if status == WAITING:
            if self.running_timeout_ms and not seq.drained and run_limit.waits_on(seq):
                return  # (the scheduler's limit, not its client: aborted once it is admitted again)
            if self.ahead is not None and seq in self.ahead.deferred:  # (not seen by a plan yet)
                self.ahead.deferred.remove(seq)
            elif self.holds is None or not self.holds.drop(seq):
                self.waiting.remove(seq)
            seq.waiting_ms += now - seq.waiting_since
        elif status == SWAPPED:
            self.swapped.remove(seq)
            free_swapped(self.kv, seq)
        elif status == DECODING and self.to_finish is not None and plan is None:
            if self.ahead is None or seq not in self.ahead.ghosts:  # (a ghost leaves after the plan)
                self.to_finish.add(seq)  # (it leaves after its next iteration: _apply)
            return
        elif status == DECODING or status == PREFILLING:
            pending = 0  # the slots the plan made ahead took for it
            if plan is not None and plan.is_scheduled(seq):
                if status == DECODING:
                    drafts, pending = plan.drafts_of(seq) if self.spec is not None else (0, 1)
                    if plan.spec_override:
                        plan.spec_override.pop(seq, None)
                    plan.overshoots = (*plan.overshoots, seq)
                    if drafts:
                        plan.add_overshoot_drafts(seq, drafts)
                else:
                    pending = next(n for s, n in plan.prefills if s is seq)
            if status == DECODING:
                self._remove_decoder(seq, ABORTED)
            # (SGLang drops an aborted chunked prefill's blocks uncached: KVCache.discard)
            self._drop_aborted(seq, now, pending, status == DECODING,
                               discard=status == PREFILLING and self.to_finish is not None)
            return
        elif status == IN_FLIGHT:  # in a pipeline's batch in flight: its output will be dropped
            del self.running[seq]
            # a decode's slots in the batch go too, as at a preemption (a prompt's chunks
            # count as computed from their launch, schedlab.engine.stages.launch_chunks)
            pending = self.in_flight.pop(seq, 0)
            if seq._computed + pending > seq.reserved_tokens:
                seq.reserved_tokens = seq._computed + pending
            # (vLLM cached the tokens it knew: a decode's input token, not its drafts' slots)
            if self.stagger is not None and seq in self.holds.flying:
                seq._computed = Stagger.cached(seq, seq._computed, getattr(self.kv, "hash_lookahead", 0))
            else:
                seq._computed = cached_tokens_at_preemption(seq._computed, pending, pending > 0, False, 0,
                                                            tokens=seq.prompt + seq._generated,
                                                            hash_lookahead=getattr(self.kv, "hash_lookahead", 0))
            self.kv.free(seq)
        elif self.stage is not None and self.stage.abort(self, seq, now):
            seq.status = ABORTED  # its KV was on its way here: the scheduler never held it
            self.rec.request_done(seq, self.index, now, aborted=True)
            return
        else:  # finished meanwhile
            return
        self._record_aborted(seq, now)

    def reject_waiting(self, seq: Sequence, reason: str) -> None:
        """Turn the waiting ``seq`` away at this plan (``Plan.reject``): out of the queue, its row
        written as rejected, its client told."""
        now = self.now
        self.waiting.remove(seq)
        seq.waiting_ms += now - seq.waiting_since
        seq.status = REJECTED
        if seq.request.timeout_ms is not None or seq.server_abort:  # (its aborts will find it gone)
            self.aborts = [a for a in self.aborts if a[2] is not seq]
            heapq.heapify(self.aborts)
        self.rec.reject(seq, self.index, reason, at=now)
        if self.track_finished:
            self.finished.append((seq.request, now))

    def _drop_aborted(self, seq: Sequence, t: float, pending: int = 0, decoding: bool = False, *,
                      discard: bool = False) -> None:
        """``seq``, running (a decoder already out of the decode set; ``decoding``: it was one),
        aborted at ``t``: its slot and blocks freed -- with the ``pending`` slots a plan made
        ahead took for it; ``discard``: uncached, ``KVCache.discard`` --, its row written."""
        if seq in self.prefilling:
            del self.prefilling[seq]
        del self.running[seq]
        release = getattr(self.kv, "discard", None) if discard else None
        if release is not None:
            held = seq._computed + pending
            if held > seq.reserved_tokens:
                seq.reserved_tokens = held
            release(seq)
        elif self.ahead is None:
            self.kv.free(seq)
        else:  # as at a preemption: vLLM has cached only the tokens it knew (engine.ahead)
            computed = seq._computed
            held = computed + pending
            seq._computed = cached_tokens_at_preemption(computed, pending, decoding and pending > 0,
                                                        self.marks.is_fresh(seq, decoding), seq.cache_lag,
                                                        self.ahead.kept.get(seq, 0), tokens=seq.prompt + seq._generated,
                                                        hash_lookahead=getattr(self.kv, "hash_lookahead", 0))
            if held > seq.reserved_tokens:
                seq.reserved_tokens = held
            self.kv.free(seq)
            seq._computed = computed  # (a plan made ahead may still compute it, for nothing)
        self._record_aborted(seq, t)

    def _record_aborted(self, seq: Sequence, t: float) -> None:
        """``seq`` aborted at ``t`` (out of the queues, its KV freed): its row and the callbacks."""
        seq.status = ABORTED
        self.ended += 1
        self.empty_plans = 0
        if seq.transfer is not None:  # a prefill instance's: its row shows the client's request
            seq.request = seq.transfer.request
        if seq.server_abort and not seq.drained:  # the scheduler's running time limit: turned away, its client answered
            self.rec.reject(seq, self.index, self.running_timeout_reason, at=t)
            if self.track_finished:
                self.finished.append((seq.request, t))
        else:
            if seq.drained:  # (a drain timeout's: engine.drain)
                self.drain_aborted += 1
            self.rec.request_done(seq, self.index, t, aborted=True)
        if self._on_finish is not None:
            self._on_finish(seq, t)

    @property
    def outstanding(self) -> int:
        """Requests queued or in service (routers read this); on a decode instance also those
        whose KV it is waiting for, pulling or has received."""
        n = len(self.waiting) + len(self.running) + len(self.swapped)
        if self.holds is not None:
            n += len(self.holds)
        if self.ahead is not None:  # arrivals not planned yet in; finished requests holding slots out
            n += len(self.ahead.deferred) - len(self.ahead.held) - self.ahead.leaving
        return n if self.stage is None else n + self.stage.outstanding

    def has_work(self) -> bool:
        return (bool(self.running or self.waiting or self.swapped) or (self.stage is not None and self.stage.has_work())
                # (or blocks a planned-ahead pass computed twice, freed at the next plan: RadixKVCache)
                or (self.ahead is not None and bool(self.ahead.deferred or getattr(self.kv, "releasing_blocks", 0))))

    # -- decode-set bookkeeping ---------------------------------------------------------------
    def enter_running(self, seq: Sequence) -> None:
        """``seq`` joins the running list, at its end (admitted, resumed, swapped in, landed)."""
        self.run_count += 1
        seq.run_no = self.run_count
        self.running[seq] = None

    def _add_decoder(self, seq: Sequence) -> None:
        seq.start_decoding()
        if self.marks is not None:
            self.marks.entered(seq)
        self.n_decoding += 1
        self.ctx_offset += seq.anchor + 1
        if self.window is not None:
            self.window_fresh[seq] = None
        if not seq.reserved_tokens and self.track_growth:
            self.cross_at[-seq.anchor % len(self.cross_at)] += 1
            self.n_growing += 1
            if self.window is not None:
                self._will_slide(seq)
        heap = self.finish_heap
        heapq.heappush(heap, (seq.finish_step, seq.seq_no, seq))
        if len(heap) > 2 * self.n_decoding + 64:
            self._compact_finishes()
        if self.track_range:
            heapq.heappush(self.anchor_high, (-seq.anchor, seq.seq_no, seq))
            heapq.heappush(self.anchor_low, (seq.anchor, seq.seq_no, seq))
            if len(self.anchor_low) > 2 * self.n_decoding + 64:
                self._compact_ranges()
        key = seq.last_token_ms
        self.itl_groups[key] = self.itl_groups.get(key, 0) + 1
        if self.meter is not None:
            seq.energy_anchor = self.meter.per_decoder

    def _shift_decoder(self, seq: Sequence, status: str | None = None) -> None:
        """Move ``seq`` into the decode set (``status`` None) or out of it for a plan only --
        a pipeline planning ahead shows a plan the requests whose decode is due and hides those
        whose decode is not (:mod:`schedlab.engine.stages`): what the plan and the batch's
        timing read (the counters, ``n_decoding``, the context sum, the blocks' growth), not
        the finish heap, ITL groups or energy shares, which no plan reads and the move undoes."""
        if status is None:
            seq.start_decoding()
            sign = 1
        else:
            seq.stop_decoding(status)
            sign = -1
        self.n_decoding += sign
        self.ctx_offset += sign * (seq.anchor + 1)
        if not seq.reserved_tokens and self.track_growth:
            self.cross_at[-seq.anchor % len(self.cross_at)] += sign
            self.n_growing += sign
            if self.window is not None:
                if sign > 0:
                    self._will_slide(seq)
                elif seq in self.sliding:
                    self.free_at[self.sliding.pop(seq)] -= 1
        if self.window is not None and sign > 0:
            self.window_fresh[seq] = None

    def _remove_decoder(self, seq: Sequence, status: str) -> None:
        anchor = seq.anchor
        if self.marks is not None:
            self.marks.left(seq)
        seq.stop_decoding(status)
        if self.meter is not None:
            seq.energy_j += self.meter.per_decoder - seq.energy_anchor
        if seq._computed > seq.max_computed:
            seq.max_computed = seq._computed
        self.n_decoding -= 1
        self.ctx_offset -= anchor + 1
        if not seq.reserved_tokens and self.track_growth:
            self.cross_at[-anchor % len(self.cross_at)] -= 1
            self.n_growing -= 1
            if seq in self.sliding:
                self.free_at[self.sliding.pop(seq)] -= 1
        if self.window_fresh:
            self.window_fresh.pop(seq, None)
        key = self.off_cycle.pop(seq, None) if self.off_cycle else None
        if key is None:  # every decoder in the last decode iteration is in its group
            key = seq.last_token_ms if seq.last_token_ms > self.itl_merge else self.itl_merge
        left = self.itl_groups[key] - 1
        if left:
            self.itl_groups[key] = left
        else:
            del self.itl_groups[key]
        seq.last_token_ms = key

    # -- sliding windows in bulk runs ------------------------------------------------------------
    def _will_slide(self, seq: Sequence) -> None:
        """Note when decoder ``seq``'s window first frees a block: at the decode counter where it
        computes token ``W - 1 + B`` (:meth:`schedlab.kv_window.SlidingWindow.held`)."""
        slide = self.window.tokens - 1 + self.kv.block_size - seq.anchor
        heap = self.slide_heap
        heapq.heappush(heap, (slide, seq.seq_no, seq))
        if len(heap) > 2 * self.n_decoding + 64:
            self.slide_heap = [e for e in heap if self._waits_to_slide(e)]
            heapq.heapify(self.slide_heap)

    def _waits_to_slide(self, entry) -> bool:
        seq = entry[2]
        return (seq.status == DECODING and seq not in self.sliding and not seq.reserved_tokens
                and entry[0] == self.window.tokens - 1 + self.kv.block_size - seq.anchor)

    def _next_slide(self, ahead: int = 1) -> int | None:
        """The decode counter at which the next decoder's window first frees a block (None: no
        decoder's will), the decoders whose windows slide from ``ahead`` iterations on (the next
        one: a run's; 0: this one) counted in ``free_at``."""
        heap, limit = self.slide_heap, self.clock.steps + ahead
        while heap:
            entry = heap[0]
            if not self._waits_to_slide(entry):
                heapq.heappop(heap)
            elif entry[0] <= limit:
                heapq.heappop(heap)
                seq = entry[2]
                index = (self.window.tokens - 1 - seq.anchor) % len(self.free_at)
                self.sliding[seq] = index
                self.free_at[index] += 1
            else:
                return entry[0]
        return None

    def window_decode_step(self) -> bool:
        """One decode step of every decoder on a windowed cache, all or none: the decoders that
        follow the pattern by their counters (:class:`bulk.SlidingGrowth`: those crossing a block
        take theirs before the windows freeing one give theirs back), those that do not yet
        (:attr:`window_fresh`) one by one; the blocks they take must be free."""
        self._next_slide(0)
        window, kv = self.window, self.kv
        bs = len(self.cross_at)
        r = self.clock.steps % bs
        cross, free = self.cross_at[r], self.free_at[r]
        fresh = self.window_fresh
        need = 0
        if fresh:
            sliding = self.sliding
            for seq in fresh:  # (their own blocks, not the pattern's)
                if not seq.reserved_tokens:
                    cross -= -seq.anchor % bs == r
                    free -= sliding.get(seq) == r
                need += kv.blocks_needed(seq, 1)
        g = window.groups
        if (window.tokens - 1) % window.block_size == 0:  # (each frees where it crosses: one block net)
            taken, freed = (1 + g) * cross - g * free, 0
        else:
            taken, freed = (1 + g) * cross, g * free
        if taken + need > kv.num_free_blocks():
            return False
        if taken or freed:
            kv.grow(taken, freed)
        if fresh:
            for seq in fresh:
                if not kv.allocate(seq, 1):
                    raise refused_slot(kv)
            fresh.clear()
        return True

    def decode_growth(self):
        """The blocks a run of decode iterations from here needs (:class:`bulk.Growth`, or
        :class:`bulk.SlidingGrowth` with a window), or None if no decoder grows."""
        if not self.n_growing:
            return None
        if self.window is None:
            return bulk.Growth(self.cross_at, self.n_growing, self.clock.steps)
        self._next_slide()
        window = self.window
        return bulk.SlidingGrowth(self.cross_at, self.n_growing, self.free_at, len(self.sliding), window.groups,
                                  self.clock.steps, (window.tokens - 1) % window.block_size == 0)

    def spec_near_limit(self, slots: int, phantom: dict, longest: int) -> bool:
        """Some decoder's ``slots`` slots (``phantom`` more) would reach ``longest`` tokens: its
        drafts or slots may be capped (:func:`.plan.capped_verify`, a decode's input within
        ``longest - 1``), so it takes its own."""
        for seq in self.running:
            if seq.status == DECODING and seq.num_computed_tokens + slots + phantom.get(seq, 0) >= longest:
                return True
        return False

    def spec_blocks_needed(self, slots: int, phantom: dict | None = None) -> int:
        """New blocks for every decoder to take ``slots`` slots past its computed tokens
        (speculation), by the block-pool contract: a sequence holds ``max(ceil(reserved / B),
        ceil(computed / B))`` blocks, its reservation covering the slots its last step took.
        ``phantom``: more slots for some (:attr:`schedlab.engine.ahead.Ahead.phantom`)."""
        bs = self.kv.block_size
        total = 0
        for seq in self.running:
            if seq.status == DECODING:
                c, r = seq.num_computed_tokens, seq.reserved_tokens
                n = slots + phantom.get(seq, 0) if phantom else slots
                if c + n > r:
                    total += -(-(c + n) // bs) + ((c if c > r else r) // -bs)
        return total

    def _compact_finishes(self) -> None:
        """Keep one entry of the finish heap per decoding sequence. Deletion is lazy there too, and
        a pipeline moves its requests in and out of the decode set at every batch (planning ahead
        twice), each time with a new entry: without this the heap would fill with stale ones."""
        live = {e[2]: e for e in self.finish_heap if e[2].status == DECODING and e[2].finish_step == e[0]}
        self.finish_heap = list(live.values())
        heapq.heapify(self.finish_heap)

    def _compact_ranges(self) -> None:
        """Drop the range heaps' stale entries. Deletion is lazy: a finished sequence's entry
        leaves a heap only once it reaches the top, which in the shortest-context heap (newer
        sequences have smaller anchors) an old one never does -- without this the heaps would
        grow with every request served."""
        self.anchor_high = [e for e in self.anchor_high if e[2].status == DECODING and e[2].anchor == -e[0]]
        self.anchor_low = [e for e in self.anchor_low if e[2].status == DECODING and e[2].anchor == e[0]]
        heapq.heapify(self.anchor_high)
        heapq.heapify(self.anchor_low)

    def _context_range(self, steps: int) -> tuple[int, int]:
        """(longest, shortest) decode context at decode counter ``steps``."""
        high, low = self.anchor_high, self.anchor_low
        while not (high[0][2].status == DECODING and high[0][2].anchor == -high[0][0]):
            heapq.heappop(high)
        while not (low[0][2].status == DECODING and low[0][2].anchor == low[0][0]):
            heapq.heappop(low)
        return 1 + steps - high[0][0], 1 + steps + low[0][0]

    def allocate_each_decode(self) -> bool:
        """Decode slots one sequence at a time, for KV caches without bulk ``grow`` (or with a
        window, while some decoder does not follow the pattern: :meth:`window_decode_step`)."""
        kv = self.kv
        if self.window is not None and self.track_growth:
            return self.window_decode_step()
        decoding = [s for s in self.running if s.status == DECODING]
        together = getattr(kv, "allocate_decodes", None)  # (all or none, each planned once: the built-in caches)
        if together is not None:
            if together(decoding):
                self.window_fresh.clear()
                return True
            return False
        if sum(kv.blocks_needed(s, 1) for s in decoding) > kv.num_free_blocks():
            return False
        for s in decoding:
            if not kv.allocate(s, 1):
                raise refused_slot(kv)
        self.window_fresh.clear()
        return True

    # -- plan callbacks -------------------------------------------------------------------------
    def on_admit(self, seq: Sequence, hit: int, reserve_tokens: int) -> None:
        now = self.now
        if self.running_timeout_ms:
            at = run_limit.deadline(seq, now, self.running_timeout_ms, self.hangup_ms)
            if at is not None:
                heapq.heappush(self.aborts, (at, seq.seq_no, seq))
        if seq.first_scheduled_ms < 0:
            seq.first_scheduled_ms = now
        seq.waiting_ms += now - seq.waiting_since
        self.waiting.remove(seq)
        seq.status = PREFILLING
        seq._computed = hit
        seq.reserved_tokens = reserve_tokens
        seq.cached_tokens_total += hit
        self.enter_running(seq)
        self.prefilling[seq] = None
        if self.count_prefix:
            c = self.counters
            if seq.num_preemptions:  # a preempted request's re-admission: kept out of queries/hits
                c["prefix_preempted_queries"] += seq.num_tokens
                c["prefix_preempted_hits"] += hit
            else:
                c["prefix_queries"] += seq.num_tokens
                c["prefix_hits"] += hit

    def host_load(self, blocks: int, seq: Sequence | None = None, hit: int = 0) -> float:
        """Account for an admission of ``seq`` (its prefix hit ``hit`` tokens) that loads ``blocks``
        from the host tier; the reload time (ms), which lengthens the iteration (LMCache's
        synchronous retrieval). The host tier's share of the hit: :func:`host_share`."""
        ms = self.host_tier.load_ms(blocks)
        c = self.counters
        share = host_share(blocks, hit, self.kv.block_size) if seq is not None else blocks * self.kv.block_size
        c["prefix_preempted_host_hits" if seq is not None and seq.num_preemptions else "host_hits"] += share
        c["host_load_blocks"] += blocks
        c["host_load_ms"] += ms
        return ms

    def preempt_recompute(self, seq: Sequence, pending: int = 0, *, to_back: bool = False) -> None:
        """Free ``seq``'s blocks and queue it again. ``pending``: tokens this iteration had
        allocated KV for (its work is withdrawn), released with the rest. A sequence in a
        pipeline's batch in flight releases the slots that batch took for its decode
        (:mod:`schedlab.engine.stages`: its batch brings it its token when it lands).
        ``to_back``: not a preemption but a requeue (``Plan.requeue``): counted as one, and
        queued at the back."""
        status = seq.status
        if status == DECODING:
            self._remove_decoder(seq, WAITING)
        elif status == FINISHED:  # held: the batch in progress finished it (unfinish_held)
            seq.status = WAITING
        elif status == IN_FLIGHT:
            pending = self.in_flight.pop(seq, 0)  # (a decode's slots in its batch in flight)
            seq.status = WAITING
            if seq in self.holds.flying:  # (else planning ahead passed it over: its decode was not due)
                self.counters["in_flight_preemptions"] += 1
        else:
            del self.prefilling[seq]
            seq.status = WAITING
        del self.running[seq]
        scheduled_decode = status in (DECODING, IN_FLIGHT) and pending > 0
        # held: up to the slots allocated this iteration; cached: the tokens vLLM knew -- a decode's
        # input token, not its drafts' slots, and planning ahead not a token in flight (engine.ahead)
        held = seq._computed + pending
        lookahead, tokens = getattr(self.kv, "hash_lookahead", 0), seq.prompt + seq._generated
        if self.stagger is not None and status == IN_FLIGHT and seq in self.holds.flying:
            seq._computed = Stagger.cached(seq, seq._computed, lookahead)  # (planning ahead on a pipeline, in flight)
        elif self.ahead is None:
            seq._computed = cached_tokens_at_preemption(seq._computed, pending, scheduled_decode, False, 0,
                                                        tokens=tokens, hash_lookahead=lookahead)
        else:
            seq._computed = cached_tokens_at_preemption(seq._computed, pending, scheduled_decode,
                                                        self.marks.is_fresh(seq, status == DECODING),
                                                        seq.cache_lag, self.ahead.kept.get(seq, 0),
                                                        tokens=tokens, hash_lookahead=lookahead)
        if held > seq.reserved_tokens:
            seq.reserved_tokens = held
        self.kv.free(seq, preempted=True)
        seq._computed = 0
        seq.reserved_tokens = 0
        seq.waiting_since = self.now
        c = self.counters
        if to_back:
            c["requeues"] += 1
            self.waiting.push(seq)
            return
        seq.num_preemptions += 1
        c["num_preemptions"] += 1
        c["recompute_preemptions"] += 1
        if self.holds is None or not self.holds.hold(seq):  # (held: a batch in flight holds it)
            self.waiting.push_front(seq)

    def swap_out(self, seq: Sequence, pending: int = 0) -> float | None:
        """Copy a decoding ``seq`` to swap space (with the ``pending`` slot this iteration
        allocated for it, which swap-in needs again anyway); None if it does not fit."""
        swap_out = getattr(self.kv, "swap_out", None)
        seq.anchor += pending
        ms = swap_out(seq) if swap_out is not None else None
        seq.anchor -= pending
        c = self.counters
        if ms is None:
            c["swap_failures"] += 1
            return None
        blocks = swapped_blocks(self.kv, seq, seq.num_computed_tokens + pending)
        self._remove_decoder(seq, SWAPPED)
        del self.running[seq]
        self.swapped.append(seq)
        seq.num_preemptions += 1
        seq.num_swaps += 1
        c["num_preemptions"] += 1
        c["swap_preemptions"] += 1
        c["swap_out_blocks"] += blocks
        c["swap_transfer_ms"] += ms
        return ms

    def swap_in(self, seq: Sequence) -> float | None:
        blocks = swapped_blocks(self.kv, seq, seq.num_computed_tokens)  # (what swap_out moved)
        ms = self.kv.swap_in(seq)
        if ms is None:
            return None
        self.swapped.remove(seq)
        self.enter_running(seq)
        self._add_decoder(seq)
        self.off_cycle[seq] = seq.last_token_ms  # (its ITL group until it decodes: its own last token)
        c = self.counters
        c["swap_in_blocks"] += blocks
        c["swap_transfer_ms"] += ms
        return ms

    # -- the loop ---------------------------------------------------------------------------------
    def _plan_ahead(self) -> FastPlan:
        """Asynchronous scheduling (:mod:`schedlab.engine.ahead`): the plan of the batch that
        starts now, made when the last batch started, with the arrivals until then; then the
        requests that batch finished give their slots and blocks back."""
        ahead = self.ahead
        end = self.now
        t = ahead.plan_time(end)
        for seq in ahead.arrived_by(t):
            self._queue(seq)
        at_plan_time = self._aborts_at_plan_time()
        loop_top = at_plan_time and self._loop_top_aborts()
        if at_plan_time and self.aborts and self.next_abort() <= t:
            # the aborts that reached vLLM's engine core (SGLang's loop) before it made this plan
            # (their rows now, as routers see them; SGLang's running requests only marked, to_finish)
            self._abort_due(upto=t)
        self.now = t
        ahead.planning = t < end
        if not ahead.planning and (ahead.phantom or ahead.kept):  # (the batch's output is seen: nothing is in flight)
            ahead.phantom, ahead.kept = {}, {}
        try:
            plan = self._plan()
        finally:
            self.now = end
            ahead.planning = False
        self.marks.planned(plan)  # whose slot this plan took for a token still being computed
        # those that came while the last batch ran: after the plan, which holds them (SGLang:
        # those that the last batch's result ended, Ahead.ghosts; the others wait for the next)
        late = bool(ahead.ghosts) if loop_top else at_plan_time and self.aborts and self.next_abort() <= end
        # the next plan sees the arrivals left over, and a finished or aborted request's slot and
        # blocks freed for a waiting one: it may differ, so no bulk run from here
        # (nor while the cache has blocks to release at the scheduler's next pass)
        ahead.settled = (not ahead.deferred and not (ahead.held and self.waiting) and not late
                         and not getattr(self.kv, "releasing_blocks", 0))
        overshot = plan.overshoots if getattr(self.kv, "caches_overshoot", False) else ()
        for seq, doomed in ahead.take_held():
            del self.running[seq]
            if seq in overshot:  # (its decode once more writes its last token's KV: the cache keeps it)
                seq._computed += plan.overshoot_tokens(seq)
            self.kv.free(seq)
            if doomed:
                seq._generated -= 1  # (the token in flight it was held with: never sent)
                self._record_aborted(seq, ahead.end)
            else:
                self.rec.request_done(seq, self.index, ahead.end)
        if loop_top:
            for seq in sorted(ahead.ghosts, key=_run_no):  # (in the running list's order, both engines)
                if seq.status == WAITING:  # preempted by the plan: SGLang keeps its to_finish for its next run
                    self.to_finish.add(seq)
                else:
                    self._abort_one(seq, plan)
        elif late:
            self._abort_due(plan)
        ahead.ghosts.clear()
        ahead.leaving = ahead.leaving_running = 0
        return plan

    def _aborts_at_plan_time(self) -> bool:
        """Whether aborts reach the scheduler when vLLM's engine core would make the plan --
        planning ahead, at the batch in progress's start, so that the plan still holds a request
        whose abort comes while that batch runs (:mod:`schedlab.engine.ahead`) -- rather than
        all of them before the plan (elsewhere the same)."""
        return self.ahead is not None and (self._drops_output() or self._loop_top_aborts())

    def _loop_top_aborts(self) -> bool:
        """SGLang's overlap loop (``aborts_run_once_more``, planning ahead): it reads aborts when
        the batch in flight has just started, before it plans the next; that batch's result is
        the one that ends a running request (its token dropped), and the plan still holds it
        (:mod:`schedlab.engine.ahead`)."""
        return self.ahead is not None and self.to_finish is not None

    def discard_token(self, seq: Sequence) -> None:
        """Drop the last token of ``seq`` (just preempted), which the client never got: it will
        be computed again (``Plan.preempt(discard_in_flight=True)``)."""
        seq._generated -= 1
        if seq._generated == 0:
            seq.first_token_ms = seq.last_token_ms = -1.0
        self.counters["discarded_tokens"] += 1
        self.counters["generated_tokens"] -= 1  # (output tokens; the work stays in decode_tokens)

    def preempt_held(self, seq: Sequence) -> None:
        """Preempt ``seq``, finished by the last iteration, in the plan made ahead: vLLM's running
        list still holds it (:mod:`schedlab.engine.ahead`); its blocks go now, its last token has
        come all the same."""
        ahead = self.ahead
        del ahead.held[seq]
        del self.running[seq]
        self.kv.free(seq)
        seq.num_preemptions += 1
        c = self.counters
        c["num_preemptions"] += 1
        c["recompute_preemptions"] += 1
        if seq in ahead.doomed:  # (its last token dropped: its client's abort comes after this plan)
            ahead.doomed.discard(seq)
            seq._generated -= 1
            self._record_aborted(seq, ahead.end)
        else:
            self.rec.request_done(seq, self.index, ahead.end)

    def unfinish_held(self, seq: Sequence) -> None:
        """Preempt ``seq``, which the batch in progress finishes, in the plan made ahead, as
        SGLang's overlap scheduler does not know yet (``Plan.preempt(discard_in_flight=True)``):
        that batch's result is skipped for it, so its last token is dropped and it waits to
        compute it again -- its blocks freed as a retracted request's. Not in a closed loop,
        whose client has been told of the finish (:attr:`track_finished`): see :meth:`preempt_held`."""
        del self.ahead.held[seq]
        self.preempt_recompute(seq)
        self.discard_token(seq)

    def requeue_doomed(self, seq: Sequence) -> None:
        """Preempt ``seq``, whose client's abort came while the batch in progress gives it its last
        token (:meth:`Ahead.doom`), in the plan made ahead, as SGLang's overlap scheduler does
        (``Plan.preempt(discard_in_flight=True)``): that batch's result is skipped for it, and its
        abort (``to_finish``) survives the retraction -- it waits, is admitted again and leaves
        after that run, its blocks freed meanwhile as a retracted request's."""
        ahead = self.ahead
        del ahead.held[seq]
        ahead.doomed.discard(seq)
        self.preempt_recompute(seq)
        seq._generated -= 1  # (the token in flight it was held with: never sent, never counted)
        if seq._generated == 0:
            seq.first_token_ms = seq.last_token_ms = -1.0
        self.to_finish.add(seq)

    def _asks_beside(self, held) -> bool:
        """Whether the scheduler decides a plan made beside the finished requests ``held``
        (holding their slots): it may decode one once more."""
        if self.reads_held:
            return True
        kept = self.ahead.kept
        return self.asks_beside_held and any(seq.request.stops_at_eos or seq in kept for seq in held)

    def _plan(self) -> FastPlan:
        """Ask the scheduler for the next iteration's plan, at ``now`` (which takes the requests
        that arrived by then: :mod:`schedlab.engine.taking`)."""
        self.untaken.take(self.now)
        self.serial += 1
        plan = FastPlan(self, self.serial)
        due = self.ask_at_step
        steps = self.clock.steps
        # (a plan made ahead beside finished requests holding their slots is the scheduler's if it
        # may decode one once more, Plan.overshoot; so is one while the cache has blocks to
        # release when the scheduler opens its next pass, RadixKVCache.begin_pass)
        if ((due is None or steps < due) and self.bulk_ok and self.n_decoding
                and not (self.waiting or self.prefilling or self.swapped)
                and not (self.ahead is not None and ((self.ahead.held and self._asks_beside(self.ahead.held))
                                                     or getattr(self.kv, "releasing_blocks", 0)))
                and plan.decode_all()):
            if due is not None:  # nothing to decide but decoding (see stable_between_events) until then
                plan.wake_steps = due - steps
            check_kv_counts(self.kv)
            return plan
        ask_scheduler(self.scheduler, plan)
        check_kv_counts(self.kv)
        self.ask_at_step = None if plan.wake_steps is None else steps + plan.wake_steps
        return plan

    # -- event by event (open-loop colocated clusters, schedlab.engine.driver.simulate) --------------
    def next_event(self) -> tuple[float, int]:
        """When this instance next acts on its own, and how: ``(end, 0)`` -- its pending decode
        run ends (applied once the routing clock reaches the end: an arrival at that very time
        sees it ended); ``(t, 1)`` -- it plans at ``t``, which the driver lets happen only before
        the next arrival (an arrival at ``t`` may still join that plan); ``(inf, 1)``: it waits
        for an arrival."""
        if self.pending is not None:
            return self.pending.end, 0
        if self.asleep:  # a disaggregated instance's stage may wake it first (next_plan_time)
            wake = self.sleep_wake if self.stage is None else self.next_plan_time()
            return (wake if wake < self.drain_at else max(self.drain_at, self.now)), 1
        return (self.now, 1) if self.has_work() else (INF, 1)

    def step(self) -> None:
        """Do what :meth:`next_event` announced: apply the pending run whole; or plan at ``now``
        (at the sleep's end, if asleep; after aborting what is due) and run that iteration, keep
        a run of decode iterations pending (:class:`PreparedRun`; an arrival routed here cuts it,
        see :meth:`catch_up`; it ends at the next abort), or sleep after an empty plan until its
        wake-up time, its next abort or an arrival. An instance of a disaggregated cluster runs
        its stage at the boundary (:mod:`schedlab.engine.disagg`: hand-overs, pulls, landings,
        released blocks), and its runs end where a transfer lands or blocks come back."""
        run = self.pending
        if run is not None:
            self.pending = None
            self._apply(run, run.k)
            return
        stage = self.stage
        if self.asleep:
            wake = self.sleep_wake if stage is None else self.next_plan_time()
            self.wake(wake if wake < self.drain_at else self.drain_at)
        if self.drain_at <= self.now:  # its drain timeout has come: it aborts what it holds (engine.drain)
            self.drain_kill()
        drain_at = self.drain_at
        abort_at = self.next_abort() if self.aborts else INF
        if abort_at <= self.now and not self._aborts_at_plan_time():  # (else the plan does: _plan_ahead)
            self._abort_due()
            abort_at = self.next_abort()
        while True:
            # an abort, like an arrival, ends a run of iterations; a drain timeout at the first
            # iteration's end at or after it
            limit = abort_at if abort_at < drain_at else drain_at
            if stage is not None:  # disaggregated: the flow's part at this boundary (engine.disagg)
                stage.before_plan(self)
            plan = self._plan() if self.ahead is None else self._plan_ahead()
            if abort_at <= self.now:  # (planning ahead: the plan applied those due)
                abort_at = self.next_abort()
                limit = abort_at if abort_at < drain_at else drain_at
            if stage is not None:
                stage.after_plan(self, plan)
                nxt = stage.next_time()  # a run stops where a transfer lands or blocks come back
                if nxt < limit:
                    limit = nxt
            if not plan.is_empty():
                break
            if self.ahead is not None and self.ahead.replans(self.now):
                continue  # planned ahead, nothing: plan again now, as the last batch is back
            if not self.has_work():
                return
            # (counted across sleeps, as the reference engine counts them: a scheduler that asks
            # to be woken a ms later, again and again, plans nothing for ever)
            self.empty_plans += 1
            if self.empty_plans > 1000:
                raise StallError(self._stall_message("the scheduler keeps planning empty iterations"))
            wake = plan.wake if plan.wake is not None else INF
            if abort_at < wake:  # an abort wakes it (as an arrival would)
                wake = abort_at
            if not plan.preempted and (wake if wake < limit else limit) > self.now:
                self.asleep = True  # inf: only an arrival wakes it (a stall when none is left)
                self.sleep_wake = wake  # (or its drain timeout: next_event)
                return
        self.empty_plans = 0
        self.events += 1
        run = self._prepare(plan, limit)
        if run.k > 1 and self.plan_finishes_alone:
            # A closed loop releases a finished request's successor when the iteration that
            # finishes it is planned, as the reference engine does (iterations in the order
            # they start; alone, an instance's own finishes keep their order anyway): a run's
            # last iteration, where its finishes are, is planned on its own.
            run.k -= 1
            run.end = run.start + bulk.run_ms(run.k, run.d0, run.inc)
            self.pending = run
        elif run.k > 1:
            self.pending = run
        else:
            self._apply(run, 1)

    def act_until(self, t: float) -> tuple[float, int]:
        """Step while the next event comes before an arrival at ``t`` (a pending run ending at
        ``t`` too: the arrival sees it ended); returns the next event then. Instances do not
        meet between arrivals, so each can go its own way this far."""
        while True:
            when, kind = event = self.next_event()
            if when > t or (when == t and kind == 1):
                return event
            self.step()

    def catch_up(self, t: float) -> None:
        """A request routed here arrives at ``t``: apply the iterations of the pending run that
        start before ``t`` (the arrival joins the next plan, at the end of the one in progress),
        or, idle or asleep, move the clock to ``t``."""
        run = self.pending
        if run is not None:
            self.pending = None
            self._apply(run, run.started_before(t))
        else:
            self.wake(t)

    # -- sleeping (disaggregated clusters) ------------------------------------------------------------
    def next_plan_time(self) -> float:
        """When this instance plans next: now, or, asleep after an empty plan, at its wake-up
        time or its stage's next timed event, whichever is first (inf: only when woken)."""
        if not self.asleep:
            return self.now
        t = self.sleep_wake
        if self.stage is not None:
            nxt = self.stage.next_time()
            if nxt < t:
                t = nxt
        return t if t > self.now else self.now

    def wake(self, t: float) -> None:
        """Plan again at ``t`` (>= the last plan): an event for this instance, or its sleep ended."""
        if t > self.now:
            self._hold_blocks(t)
            self.now = t
        self.asleep = False

    def _hold_blocks(self, until: float) -> None:
        """Count blocks held while no iteration runs (a prefill instance keeping finished
        prompts' KV for the decode pool) in the KV-usage integrals."""
        used = self.kv.num_used_blocks() + self.held_to_landing
        if used:
            ms = until - self.now
            self.counters["kv_block_ms"] += used * ms
            self.kv_block_ms += used * ms
            if used >= self.kv_need_high:
                self.counters["kv_above_ms"] += ms
            if until > self.counters["kv_held_until_ms"]:
                self.counters["kv_held_until_ms"] = until

    def _park_idle_decoders(self, plan: FastPlan) -> list:
        """Take the decoding sequences the plan leaves out of the decode set for one iteration
        (vLLM: the budget ran out before their turn); :meth:`_execute` puts them back."""
        serial = plan.serial
        parked = [s for s in self.running if s.status == DECODING and s.plan_mark != serial]
        for seq in parked:
            self._remove_decoder(seq, PARKED)
        return parked

    def _execute(self, plan: FastPlan, until: float) -> None:
        run = self._prepare(plan, until)
        self._apply(run, run.k)

    def batch_of(self, plan: FastPlan, n_dec: int) -> Batch:
        """The batch of ``plan``'s prefills and of every decoder's step (``n_dec`` of them, or 0:
        none), with the drafts each verifies; changes nothing (data-parallel ranks are timed
        from it before they execute, :func:`schedlab.engine.lockstep.rank_batch`)."""
        steps = self.clock.steps
        prefill_tokens = 0
        prefill_context = 0
        for seq, n in plan.prefills:
            prefill_tokens += n
            prefill_context += seq._computed
        if plan.padded:  # (query rows computed for nothing: Plan.admit)
            prefill_tokens += sum(plan.padded.values())
        drafts = 0
        if n_dec and self.spec is not None:
            drafts = n_dec * plan.spec_k
            if plan.spec_override:
                for d, _slots in plan.spec_override.values():
                    drafts += d - plan.spec_k
        batch = Batch(n_dec, self.ctx_offset + n_dec * steps + drafts if n_dec else 0,
                      len(plan.prefills), prefill_tokens, prefill_context, spec_tokens=drafts)
        if n_dec and self.track_range:
            if drafts:  # drafts differ between sequences (cut by the budget, swap-ins): look at each
                contexts = [s.num_computed_tokens + 1 + plan.drafts_of(s)[0]
                            for s in self.running if s.status == DECODING]
                batch.decode_context_max, batch.decode_context_min = max(contexts), min(contexts)
            else:
                batch.decode_context_max, batch.decode_context_min = self._context_range(steps)
        if plan.overshoots:  # decodes whose token is discarded (Plan.overshoot)
            self._add_overshoots(batch, plan, n_dec)
        return batch

    def _add_overshoots(self, batch: Batch, plan: FastPlan, n_dec: int) -> None:
        """Add the decodes of ``plan``'s overshoots, with the drafts they verify, to ``batch``."""
        extra = [s.num_computed_tokens + plan.overshoot_tokens(s) for s in plan.overshoots]
        if plan.overshoot_drafts:
            batch.spec_tokens += sum(plan.overshoot_drafts.values())
        batch.num_decode += len(extra)
        batch.decode_context_tokens += sum(extra)
        if self.track_range:
            high, low = (batch.decode_context_max, batch.decode_context_min) if n_dec else (max(extra), min(extra))
            batch.decode_context_max, batch.decode_context_min = max(high, *extra), min(low, *extra)

    def _prepare(self, plan: FastPlan, until: float) -> "PreparedRun":
        """The plan's batch, cost and how many identical iterations to run from here (iterations
        starting before ``until``); nothing is applied yet but parking the decoders it leaves out."""
        steps = self.clock.steps
        # (a plan with overshoots but no decode -- the budget went to their drafts -- advances the
        # decode clock all the same: the decoders it leaves out are parked)
        parked = self._park_idle_decoders(plan) if plan.partial_decode or (
            plan.overshoots and not plan.decodes_all and self.n_decoding) else ()
        n_dec = self.n_decoding if plan.decodes_all or plan.decoded else 0
        batch = self.batch_of(plan, n_dec)
        if batch.num_decode or plan.prefills:
            d0 = check_iteration_ms(self.cost.iteration_ms(batch), batch)
        else:  # only swap transfers this iteration
            d0 = 0.0
        k = 1
        inc = 0.0
        growth = None
        # (a decode instance's request holding its last prompt token's block decodes its first token in a run of
        # its own: engine.disagg)
        if self.bulk_ok and n_dec and plan.is_decode_only() and (self.ahead is None or self.ahead.settled) and not (
                self.stage is not None and self.stage.alone):
            inc = check_step_increment(self.cost.decode_step_increment(batch), batch)
            valid = None
            if type(inc) is tuple:  # piecewise linear: the increment holds for `valid` steps
                inc, valid = inc
            if inc is None or not inc >= 0.0:
                inc = 0.0
            else:
                growth = self.decode_growth()
                k = self._run_length(plan, d0, inc, until, growth)
                if valid is not None and valid < k:
                    k = max(valid, 1)
                if k > 1 and self.aborts and self._drops_output():
                    k = self._ending_before(self.next_abort(), k, d0, inc)
                if self.to_finish:  # one of them computed for the last time: that iteration alone
                    k = 1
        return PreparedRun(plan, parked, n_dec, steps, batch, d0, inc, growth, k, self.now)

    def _drops_output(self) -> bool:
        """Whether an abort during an iteration drops the iteration's output for the request."""
        return (self.aborts_drop_output and self.in_flight is None
                and (self.stage is None or self.stage.drops_output_in_step))

    def _ending_before(self, abort_at: float, k: int, d0: float, inc: float) -> int:
        """At most ``k`` iterations from now, none of them but a lone first one still running at
        ``abort_at`` (its output is dropped for the aborted request: see :meth:`_in_step_aborts`)."""
        now = self.now
        if now + bulk.run_ms(k, d0, inc) <= abort_at:
            return k
        j = bulk.steps_before(now, abort_at, d0, inc)  # the j-th iteration holds abort_at, or ends at it
        if now + bulk.run_ms(j, d0, inc) > abort_at:
            j -= 1
        return max(1, min(j, k))

    def _in_step_aborts(self, plan: FastPlan, start: float, end: float, *, by_start: bool = False) -> list:
        """The requests this iteration computes whose client's abort reaches the engine while it
        runs, strictly between ``start`` and ``end``: vLLM aborts them after the step, before its
        output (``EngineCore.step``'s ``_process_aborts_queue``). One at ``end`` itself comes, as
        an arrival then would, after the output; it and the others stay for :meth:`_abort_due`.
        Planning ahead, only those it would give a token (the plan made ahead holds the rest as
        they are), and their aborts stay for that plan (:meth:`_plan_ahead`). ``by_start``: those
        whose abort came by ``start`` instead (SGLang's overlap loop read it then)."""
        aborts, hit, rest = self.aborts, [], []
        serial, ahead = plan.serial, self.ahead
        completing = {seq for seq, n in plan.prefills if seq._computed + n == seq.prompt + seq._generated} \
            if ahead is not None else None
        while aborts and (aborts[0][0] <= start if by_start else aborts[0][0] < end):
            entry = heapq.heappop(aborts)
            seq = entry[2]
            is_hit = (by_start or entry[0] > start) and ((seq.status == DECODING and plan.is_scheduled(seq)) or (
                seq.status == PREFILLING and seq.plan_mark == serial and (completing is None or seq in completing)))
            if is_hit and (seq in hit or (self.to_finish is not None and seq in self.to_finish)):
                is_hit = False  # (aborted already: its client and the scheduler's time limit, engine.run_limit)
            if is_hit:
                hit.append(seq)
            if ahead is not None or not is_hit:
                rest.append(entry)
        for entry in rest:
            heapq.heappush(aborts, entry)
        return hit

    def _finishing(self, plan: FastPlan) -> list:
        """The requests waiting to run once more after their abort (:attr:`to_finish`) that this
        iteration computes -- a decode, or a prompt's last chunk (SGLang ends them when it
        processes a result that holds them) -- in admission order; taken from the set."""
        to_finish = self.to_finish
        completing = {seq for seq, n in plan.prefills if seq in to_finish and seq._computed + n == seq.prompt + seq._generated}
        out = [seq for seq in self.running if seq in completing or (
            seq in to_finish and seq.status == DECODING and plan.is_scheduled(seq))]
        to_finish.difference_update(out)
        return out

    def _ghost_ahead(self, seq: Sequence) -> None:
        """Planning ahead: ``seq``, whose token this iteration dropped (its abort came while it
        ran), stays for the plan made ahead as vLLM's does (computed, a placeholder for the
        token): decoding, or held like a finished request if that token was its last. Its abort
        comes after that plan (:meth:`_plan_ahead`)."""
        if seq in self.prefilling:
            del self.prefilling[seq]
        if seq._generated + 1 >= seq.target:
            seq.status = FINISHED
            seq._generated += 1  # (as the plan sees it: the token in flight counts; never sent)
            self.ahead.doom(seq)
        else:
            self._add_decoder(seq)
            self.off_cycle[seq] = seq.last_token_ms  # (no token this iteration: out of its ITL group)
            self.ahead.ghosts.add(seq)

    def _apply(self, run: "PreparedRun", k: int) -> None:
        """Run the first ``k`` iterations of a prepared run (``k`` <= its length; fewer when an
        arrival cuts a pending run short)."""
        kv = self.kv
        counters = self.counters
        plan, parked, n_dec, steps, batch = run.plan, run.parked, run.n_dec, run.steps, run.batch
        d0, inc, growth = run.d0, run.inc, run.growth
        prefills = plan.prefills
        # drafts per batch size: the requests this step samples for, finishing ones too (a plan made
        # ahead may decode one once more), get the drafts proposed after it (a pipeline's: at its launch)
        sampled = self._sampled(plan) if self.spec is not None and self.spec.per_request and self.in_flight is None \
            else None
        start = self.now
        # what each victim had generated when it was preempted (one readmitted by the same plan
        # gains a token from this iteration: read after it, a loop check saw no progress)
        preempted_generated = tuple(s.num_generated for s in plan.preempted) if self.observer is not None else ()
        total = d0 + plan.transfer_ms if k == 1 else bulk.run_ms(k, d0, inc)
        check_iteration_end(start, total, batch)
        end = start + total
        used0 = kv.num_used_blocks() + self.held_to_landing
        meter = self.meter
        energy = row_j = math.nan
        if meter is not None:
            energy = meter.iteration(start, batch, total) if k == 1 else meter.run(start, batch, k, d0, inc, total)
            row_j = meter.row_j(energy)
            dropped = plan.dropped
            per_decoder, per_token = token_shares(energy, batch, sum(n for _, n in dropped) if dropped else 0)
            meter.per_decoder += per_decoder
            if plan.overshoots:  # (a decode's share each, as every decoder's)
                meter.discarded_j += per_decoder * len(plan.overshoots)
            padded = plan.padded
            for seq, n in prefills:
                if padded:  # (its placeholder drafts are its own work)
                    n += padded.get(seq, 0)
                if seq.status == ABORTED:  # (aborted after a plan made ahead: its row is written)
                    meter.discarded_j += per_token * n
                else:
                    seq.energy_j += per_token * n
            for seq, n in dropped:  # a pipeline's work for requests preempted or aborted since its launch
                if seq.status == ABORTED:  # (its row is written)
                    meter.discarded_j += per_token * n
                else:
                    seq.energy_j += per_token * n
        n_running = len(self.running)
        running_ids = tuple(s.request.id for s in self.running) if self.observer is not None else ()

        # time integrals of the iteration(s)
        counters["iterations"] += k
        counters["busy_ms"] += total
        if end > counters["busy_until_ms"]:
            counters["busy_until_ms"] = end
        self.busy_ms += total
        self.iterations += k
        counters["running_seq_ms"] += n_running * total
        if n_running > counters["peak_running"]:
            counters["peak_running"] = n_running
        if prefills:
            counters["prefill_iteration_ms"] += total
        else:
            counters["decode_only_ms"] += total
        timeline = self.rec.keep_timeline
        split = k > 1 and growth is not None  # the last iteration, at the run's KV peak, gets a row of its own
        if timeline:
            head = bulk.run_ms(k - 1, d0, inc) if split else total
            head_j = meter.energy_of_run(batch, k - 1, d0, inc) if split and meter is not None else row_j
            self.rec.sample(start, self.index, n_running, len(self.waiting), used0, head, k - 1 if split else k, batch,
                            head_j)
        if not split:
            block_ms = used0 * total
            if used0 >= self.kv_need_high:
                counters["kv_above_ms"] += total
            peak = used0
        else:
            grown = growth.blocks(k - 1)
            if self.window is not None:  # (window blocks freed too: the run's peak may come before its end)
                taken = growth.taken(k - 1)
                if taken or grown:
                    kv.grow(taken, taken - grown)
                peak = used0 + growth.peak(k - 1)
            else:
                if grown:
                    kv.grow(grown)
                peak = used0 + grown
            block_ms = growth.block_time(k, d0, inc, used0)
            if peak >= self.kv_need_high:
                counters["kv_above_ms"] += growth.time_at_or_above(self.kv_need_high - used0, k, d0, inc)
            if timeline:
                self.rec.sample(start + head, self.index, n_running, len(self.waiting), used0 + grown, total - head, 1,
                                batch, energy - head_j)
        counters["kv_block_ms"] += block_ms
        self.kv_block_ms += block_ms
        if peak > self.kv_peak:
            self.kv_peak = peak
        if peak > counters["kv_peak_blocks"]:
            counters["kv_peak_blocks"] = peak

        before = load(self)  # as routers see the instance until ``end``
        progress = False
        decoded_before = counters["decode_tokens"]
        accepted = 0
        spec_done = ()
        # aborted while this iteration runs: computed for nothing (its output dropped)
        ghosts = ()
        if k == 1 and self.aborts:
            if self._drops_output():
                ghosts = self._in_step_aborts(plan, start, end)
            elif self._loop_top_aborts():  # read when this iteration started: its result ends them
                ghosts = self._in_step_aborts(plan, start, end, by_start=True)
        finishing = self._finishing(plan) if self.to_finish else ()  # (aborted: their last iteration)
        # planning ahead with drafts: what the next plan counts as computed that this one was not
        phantom = {} if self.drafts_ahead else None
        kept = {} if phantom is not None else None
        ghost_decoders = 0
        for seq in (*ghosts, *finishing) if finishing else ghosts:  # (their KV is written: the cache frees it)
            if seq.status == DECODING:
                if phantom is not None and seq in ghosts:  # (its drafts: rejected as the plan sees them)
                    phantom[seq] = plan.drafts_of(seq)[0]
                self._remove_decoder(seq, ABORTED)  # (before its token: it gets none)
                if self.spec is not None:  # (the slots its drafts and lookahead took: freed with it)
                    taken = seq._computed + plan.drafts_of(seq)[1]
                    if taken > seq.reserved_tokens:
                        seq.reserved_tokens = taken
                seq._computed += 1
                ghost_decoders += 1
            else:
                seq.status = ABORTED
        # decodes: one token each per iteration (and accepted drafts, see _verify)
        if n_dec:
            first_end = start + (d0 + plan.transfer_ms if k == 1 else d0)
            rec_itl = self.rec.itl
            for t, count in self.itl_groups.items():
                if t >= 0.0:  # (-1: a decode instance's requests before their first token, engine.disagg)
                    rec_itl(first_end - t, count)
            if k > 1:
                self.rec.itl_run(d0 + inc, inc, k - 1, n_dec)
            self.itl_groups = {end: n_dec - ghost_decoders} if n_dec > ghost_decoders else {}
            self.itl_merge = end
            if self.off_cycle:
                self.off_cycle = {}  # they decoded: back in step
            self.clock.steps = steps + k
            counters["decode_tokens"] += k * n_dec
            counters["generated_tokens"] += k * n_dec - ghost_decoders
            counters["decode_seq_steps"] += k * n_dec
            progress = True
            if self.spec is not None:
                accepted, spec_done = self._verify(plan, phantom, kept)
            if self.stage is not None and self.stage.fresh:  # (their first token: engine.disagg)
                self.stage.first_tokens(self, first_end)
        if plan.overshoots:  # decoded once more, their tokens thrown away
            if not n_dec:
                self.clock.steps = steps + k
            counters["discarded_tokens"] += len(plan.overshoots)

        # prefill work; a completed prefill yields a token
        ending = []  # prompts whose token was their last, then decoders (finished below, in running order)
        for seq, n in prefills:
            if seq.status == ABORTED:  # (a ghost: its chunk computed for nothing, no token)
                seq._computed += n
                counters["prefill_tokens"] += n
                continue
            c = seq._computed
            if c < seq.max_computed:
                redo = min(c + n, seq.max_computed) - c
                seq.recomputed_tokens += redo
                counters["recomputed_tokens"] += redo
            c += n
            seq._computed = c
            if c > seq.max_computed:
                seq.max_computed = c
                progress = True
            seq.prefill_chunks += 1
            counters["prefill_tokens"] += n
            if c == seq.prompt + seq._generated:
                del self.prefilling[seq]
                seq._generated += 1
                counters["generated_tokens"] += 1
                progress = True
                self.token_at(seq, end)
                if seq._generated >= seq.target:
                    ending.append(seq)
                else:
                    self._add_decoder(seq)

        # decoders that produced their last token
        ending += spec_done
        heap = self.finish_heap
        now_steps = self.clock.steps
        while heap and heap[0][0] <= now_steps:
            step, _, seq = heapq.heappop(heap)
            if seq.status == DECODING and seq.finish_step == step:
                ending.append(seq)
        if len(ending) > 1:  # in their order in the running list, as vLLM frees them (its output's order)
            ending = sorted(dict.fromkeys(ending), key=_run_no)
        for seq in ending:
            self._finish(seq, end)
        for seq in ghosts:  # gone at the iteration's end, as if aborted at the next plan
            if self.ahead is None:
                self._drop_aborted(seq, end)
            else:
                self._ghost_ahead(seq)
        for seq in finishing:
            if self.ahead is None:
                self._drop_aborted(seq, end)
            else:
                self._ghost_ahead(seq)
        if self.ahead is not None:  # the sequences decoding now got a token from it (engine.ahead)
            self.marks.batch_ended(n_dec > 0)
            if phantom is not None:
                if plan.padded:  # (their placeholder drafts, all rejected)
                    phantom.update((seq, n) for seq, n in plan.padded.items() if seq.status != ABORTED)
                self.ahead.phantom, self.ahead.kept = phantom, kept
        for seq in parked:
            self._add_decoder(seq)
            self.off_cycle[seq] = seq.last_token_ms
        self.release.record(end, before, load(self))

        self.now = end
        if self.ahead is not None:  # (the next plan is made when this run's last iteration started)
            self.ahead.ran(start + bulk.run_ms(k - 1, d0, inc) if k > 1 else start, end)
            if k > 1:  # each decoder's input token of the last iteration was in flight at its plan
                self.marks.bulk_ended()
        if progress:
            self.since_progress = 0
        else:
            self.since_progress += k
            if self.since_progress > self.stall_limit:
                raise StallError(self._stall_message(f"{self.since_progress} iterations without a new token"))
        if self.spec is not None and batch.num_seqs:
            self.spec_k = self.spec.k_for(batch.num_seqs)  # the drafts proposed after this step
            if sampled:
                self.spec.propose(sampled, batch.num_seqs)
        if self.observer is not None:
            self.observer(self.index, IterationRecord(
                start, total, batch, n_running, len(self.waiting), used0,
                tuple(s.request.id for s in plan.preempted), running_ids,
                decode_tokens=counters["decode_tokens"] - decoded_before, spec_k=plan.spec_tokens,
                accepted_tokens=accepted, kv_used_after=kv.num_used_blocks() - getattr(kv, "releasing_blocks", 0),
                kv_held_after=held_blocks(self.running, kv), kv_shares_blocks=self.count_prefix,
                kv_least_after=own_blocks(self.running, kv) if self.count_prefix else -1,
                preempted_generated=preempted_generated,
                discarded_decodes=len(plan.overshoots), kv=kv))

    def _verify(self, plan: FastPlan, phantom: dict | None = None, kept: dict | None = None) -> tuple[int, list]:
        """Speculative decoding, after a decode step gave every decoder its one token: each
        decoder also keeps its accepted drafts (at most what it still has to generate). The
        slots the step took for the rest and for the lookahead stay with it, as vLLM keeps a
        request's blocks (its next step reuses them): its reservation grows to cover them.
        Returns the drafts accepted and the decoders that are done (their finish steps moved,
        so the finish heap, which only bulk runs need, is not asked). ``phantom`` (planning
        ahead): gets each decoder's drafts it did not keep, which the next plan, made before
        this step's output is seen, counts as computed, and ``kept`` those it kept
        (:mod:`schedlab.engine.ahead`)."""
        spec = self.spec
        by_position = spec.by_position
        steps = self.clock.steps
        counters = self.counters
        k, default_slots, override = plan.spec_k, plan.spec_slots, plan.spec_override
        track_range = self.track_range
        segment = self.answer_segment
        drafted = drafts_total = accepted_total = extra_total = 0
        done = []
        for seq in self.running:
            if seq.status != DECODING:
                continue
            drafts, slots = k, default_slots
            if override is not None:
                got = override.get(seq)
                if got is not None:
                    drafts, slots = got
            anchor = seq.anchor
            taken = anchor + steps - 1 + slots  # computed before the step + its slots
            if taken > seq.reserved_tokens:
                seq.reserved_tokens = taken
            generated = seq.gen_anchor + steps  # this step's first token included
            if drafts:
                if by_position:  # (Speculation.accepted: drawn draft by draft)
                    m = spec.accepted(seq, generated - 1, drafts)
                else:
                    bits = seq.spec_state
                    if bits is None:
                        bits = seq.spec_state = spec.predictable(seq.request)
                    x = bits >> (generated - 1)
                    m = (~x & (x + 1)).bit_length() - 1  # the accepted drafts: predictable positions in a row
                if generated == 1:  # its first token: a decode instance's first step verifies placeholders
                    m = 0
                elif m > drafts:
                    m = drafts
                drafted += 1
                drafts_total += drafts
                accepted_total += m
                extra = seq.target - generated
                if m < extra:
                    extra = m
                if segment:  # not past the answer segment's end (TGI drops the accepted tokens after it)
                    left = segment - generated % segment if generated % segment else 0
                    if left < extra:
                        extra = left
                if extra:  # run ahead of the decode clock: re-anchor (the finish heap is not asked)
                    seq.anchor = anchor + extra
                    seq.gen_anchor += extra
                    seq.finish_step -= extra
                    if track_range:
                        heapq.heappush(self.anchor_high, (-anchor - extra, seq.seq_no, seq))
                        heapq.heappush(self.anchor_low, (anchor + extra, seq.seq_no, seq))
                    extra_total += extra
                    generated += extra
                if phantom is not None:
                    if drafts > extra:
                        phantom[seq] = drafts - extra
                    if extra:
                        kept[seq] = extra
            if generated >= seq.target:
                done.append(seq)
        self.ctx_offset += extra_total
        counters["spec_drafts"] += drafted
        counters["spec_draft_tokens"] += drafts_total
        counters["spec_accepted_tokens"] += accepted_total
        counters["decode_tokens"] += extra_total
        counters["generated_tokens"] += extra_total
        return accepted_total, done

    def _sampled(self, plan: FastPlan) -> list:
        """Before ``plan`` executes (its idle decoders parked): the sequences it decodes, and those
        whose prompt it completes."""
        decoders = [s for s in self.running if s.status == DECODING] if plan.decodes_all else list(plan.decoded)
        return decoders + [s for s, n in plan.prefills if s._computed + n == s.prompt + s._generated]

    def _run_length(self, plan: FastPlan, d0: float, inc: float, until: float, growth) -> int:
        """How many identical decode iterations to run from here (at least 1)."""
        heap = self.finish_heap
        while not (heap[0][2].status == DECODING and heap[0][2].finish_step == heap[0][0]):
            heapq.heappop(heap)
        k = heap[0][0] - self.clock.steps  # through the iteration that yields the first last-token
        if plan.wake_steps is not None and plan.wake_steps < k:
            k = plan.wake_steps
        limit = until if plan.wake is None or until < plan.wake else plan.wake
        if limit <= self.now:
            return 1
        if limit < INF:
            k = min(k, bulk.steps_before(self.now, limit, d0, inc))
        if growth is not None:
            k = min(k, growth.iterations_within(self.kv.num_free_blocks()) + 1)
            if self.waiting and self._room_before_eviction is not None:
                # evicting a cached block may let a waiting request in (its hit no longer
                # needs reviving): the scheduler must see the cache from there on
                k = min(k, growth.taken_within(self._room_before_eviction()) + 1)
            if self.window is not None:
                slide = self._next_slide()  # (a window that starts to slide changes the pattern)
                if slide is not None:
                    k = min(k, slide - self.clock.steps)
                if self.waiting or self.swapped or self.prefilling or getattr(self.stage, "pull_queue", None):
                    # freed window blocks may make room for what the scheduler (or a decode instance's
                    # pull) could not take in: it must see the pool once it holds fewer blocks than at this plan
                    dip = growth.first_below(0)
                    if dip is not None:
                        k = min(k, dip)
        return max(k, 1)

    def token_at(self, seq: Sequence, t: float) -> None:
        """A token of ``seq`` (not decoding) comes at ``t``: its first, or one more inter-token gap."""
        if seq.first_token_ms < 0:
            seq.first_token_ms = t
        else:
            self.rec.itl(t - seq.last_token_ms)
        seq.last_token_ms = t

    def finish_held(self, seq: Sequence, t: float) -> None:
        """Finish ``seq``, held back since its preemption in flight, at ``t``: the landing of its
        batch brought its last token (:mod:`schedlab.engine.stages`); it holds no KV."""
        self.holds.drop(seq)
        seq.waiting_ms += t - seq.waiting_since
        seq.status = FINISHED
        self._done(seq, t)

    def _finish(self, seq: Sequence, t: float) -> None:
        if seq.status == DECODING:
            self._remove_decoder(seq, FINISHED)
        else:
            seq.status = FINISHED
        if self.ahead is not None:  # its slot and blocks until the next plan is made (engine.ahead)
            self.ahead.held[seq] = None
            self._finished(seq, t)  # its row once released: that plan may still preempt it
            return
        del self.running[seq]
        if self.stage is not None and self.stage.hand_off(self, seq, t):
            # on to a decode instance; its KV stays here until that instance has pulled it (the
            # scheduler hears of the finish then, when the blocks come back)
            return
        self.kv.free(seq)
        self._done(seq, t)

    def _done(self, seq: Sequence, t: float) -> None:
        """``seq`` finished at ``t``: its row, the scheduler's and the clients' callbacks."""
        self.rec.request_done(seq, self.index, t)
        self._finished(seq, t)

    def _finished(self, seq: Sequence, t: float) -> None:
        """The scheduler's and the clients' callbacks of ``seq``'s finish at ``t``."""
        self.ended += 1
        if self._on_finish is not None:
            self._on_finish(seq, t)
        if self.track_finished:
            self.finished.append((seq.request, t))

    def take_finished(self) -> list:
        done, self.finished = self.finished, []
        return done

    def _stall_message(self, why: str) -> str:
        return stall_message(self, why)
