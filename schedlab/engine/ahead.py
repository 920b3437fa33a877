"""Asynchronous scheduling (vLLM's default since 0.13): each batch is planned while the one
before it runs. Both engines follow these rules when the scheduler says ``plans_ahead``
(the ``continuous`` family's ``async_scheduling``: on by default in the ``vllm`` preset, where
it is modelled).

vLLM 0.33 runs its ``AsyncScheduler`` behind a batch queue of two (``VllmConfig.
max_concurrent_batches``; ``EngineCore.step_with_batch_queue``): when batch ``k - 1`` is back,
it processes its output and batch ``k`` starts on the GPU; the engine core then reads the
requests that arrived, schedules batch ``k + 1`` at once -- every request of batch ``k`` again,
with a placeholder for the token batch ``k`` is computing (``num_output_placeholders``), except a
request whose last token that is -- and blocks until batch ``k`` is back. So the plan of batch
``k + 1`` is made when batch ``k`` starts, on the state batch ``k`` will leave, and here:

* **when**: the plan of the batch that follows batch ``k`` is made at ``k``'s start: its
  ``now`` is that time (admission and queueing times count to it, as vLLM's ``scheduled``
  timestamps do), the engine making it once ``k`` has ended, on the state ``k`` left (its
  tokens are counted: a placeholder's KV slot is the same slot);
* **arrivals** after ``k``'s start are not in that plan: they wait for the next;
* **finished requests** -- those whose last token batch ``k`` computed -- still hold their
  ``max_num_seqs`` slot and their KV blocks in that plan (vLLM frees them when ``k``'s output
  is processed, after it has scheduled ``k + 1``); the scheduler does not see them
  (:class:`AheadRunning`) except as a preemption's victim -- vLLM's running list holds them, so
  FCFS may pick one: its blocks go at once and it counts a preemption --, and they are freed
  once the plan is made (their rows are written then, with their finish time);
* **a request at an EOS** -- one whose last token, in flight, stops it before its ``max_tokens``
  (``Request.stops_at_eos``) -- is scheduled once more: vLLM skips only a request whose token in
  flight is its ``max_tokens``-th, so this one takes its decode's token of the budget and KV slot
  in that plan, in its place in the running list (a preemption for its slot as for any decode),
  and the token is thrown away (``Plan.overshoot``; the ``continuous`` scheduler's walk);
* **an empty plan**: vLLM blocks on batch ``k``, then schedules again when it is back -- with
  the arrivals and the freed requests -- and that batch starts at once; here an empty plan made
  at ``k``'s start is followed at ``k``'s end by a plan at that time. A plan made with nothing
  running before it (an idle engine woken by an arrival) is made at its own time;
* **cached blocks** (prefix caching): vLLM caches a block once its tokens are known
  (``num_tokens_to_cache = min(computed + new, request.num_tokens)``), and a placeholder is not
  known. So a decode whose input token the batch in progress is computing leaves the block that
  token completes uncached until the request is scheduled again: a request preempted meanwhile
  frees it uncached (:func:`cached_tokens_at_preemption`).
* **a client's abort** reaches vLLM's engine core between steps and after a batch is back,
  before its output; so one that comes while batch ``k`` runs comes after the plan made at
  ``k``'s start. Here aborts are applied when that plan is made: those due by its time before
  it, the rest (due by ``k``'s end) after it. The batch's token for such a request is dropped
  (``Instance._in_step_aborts``, as synchronously), but the plan sees the request as vLLM's
  does -- its token a placeholder: decoding, or held like a finished request if that token was
  its last (``Ahead.doom``) -- and may schedule its decode (an overshoot then: its token thrown
  away) or its prompt's next chunk (computed for nothing), admit it, or preempt it; then the
  request leaves, its blocks freed as at a preemption (vLLM cached only the tokens it knew).
  SGLang's overlap loop (a scheduler with ``aborts_run_once_more``) reads aborts at its loop top,
  when the batch in progress has just started: the same rule for those that came by that
  batch's start; a running request not in that batch is marked (``to_finish``) and the next
  batch that computes it ends it the same way; a queued request or a chunked prefill leaves
  before the plan (``Instance._loop_top_aborts``).

**SGLang's overlap scheduler** plans by the same clock (the ``sglang`` scheduler's
``overlap_schedule``) and reads more of the batch in flight: which requests it gives a token
(``Plan.token_in_flight``: SGLang counts them a token short), the finished requests still in its
running batch (``RunningView.holding``), a decode once more of one finished at an EOS
(``Plan.overshoot``, the token thrown away), and a retracted request's token in flight dropped
(``Plan.preempt(discard_in_flight=True)``). For these the fast engine asks the scheduler at
every plan made beside finished requests holding their slots (vLLM's rules: beside one at an
EOS), or while the cache has blocks to release at the scheduler's next pass (the radix cache's
duplicates), and runs no bulk run from such a plan.

**Data-parallel ranks stepping together** (a MoE model's DP + EP, :mod:`schedlab.engine.lockstep`)
each plan ahead by these rules, with one difference at an empty plan made ahead: vLLM's DP
engine core (``DPEngineCoreProc.run_busy_loop``), having launched nothing, blocks on the batch
in flight and then runs a dummy pass -- the next step, beside the other ranks' batches -- before
it schedules again, at that step's end. So such a rank runs a dummy batch in the next step and
plans the one after at its own time; when every rank's plan is empty and one was made ahead,
the ranks run a dummy step if work is left (a deferred arrival), and pause otherwise. A client's
abort reaches a rank as it reaches one engine core (each DP engine core runs its own loop): after
the plan made at the batch's start, the batch's token dropped.

**Speculative decoding** (every drafter: vLLM 0.33's V2 model runner, its default on GPUs, plans
ahead with each; a scheduler with ``counts_drafts_ahead``, as the ``continuous`` family has). vLLM's ``AsyncScheduler`` counts every token batch ``k`` may
yield as computed when it plans ``k + 1``: a decode's ``1 + d`` scheduled tokens become
placeholders (``num_output_placeholders``) and its next drafts placeholders too
(``_update_after_schedule``); the drafts ``k`` rejects roll back only when it is back. So in the
plan made at ``k``'s start:

* a decoder of ``k`` is scheduled for ``1 + k'`` tokens as synchronously, but its KV slots run
  from the position it would have if every draft of ``k`` were accepted: the drafts ``k``
  rejected (:attr:`Ahead.phantom`; a padded admission's placeholders, a dropped token's drafts)
  take slots too, kept with its blocks as a decode's are;
* a request ``k`` finished is skipped only if its first token in flight was its
  ``max_tokens``-th; one whose accepted drafts took it to its last token is scheduled once more,
  ``1 + k'`` tokens of the budget and their slots past that position, all thrown away
  (:func:`unseen_finish`, ``Plan.overshoot(seq, num_tokens)``);
* a request preempted there has the tokens of ``k`` cached as a placeholder's are, its
  accepted drafts (:attr:`Ahead.kept`) no more known than its own token.

On a pipeline, planning ahead follows vLLM's V2 model runner there (its default on GPUs): a
batch queue one deeper and each request's decodes staggered by the stages
(:mod:`schedlab.engine.stages`), not these rules. Asynchronous scheduling is refused with
disaggregation, SGLang's overlap scheduler with speculation or on a pipeline, drafts per batch
size on a pipeline, swapping and a batching window.

**Bulk runs** (the fast engine's runs of identical decode iterations). Between events, plans
made ahead are the plans made synchronously: nothing arrives, nothing finishes, nobody holds a
slot. So a run may start at a plan that left no arrival for the next plan and at which no
finished request held a slot while requests waited (``settled``); it ends, as synchronously,
at the iteration that yields a request's last token, before the next arrival and where KV
blocks run short. After it the next plan is made when its last iteration started, and every
decoder's block lags a plan (its input token was in flight).

**Routers** see a finished request gone at its last token, although it holds its slot until
the plan made ahead (:func:`schedlab.engine.load.serving`): that plan is made at the same instant.

Checked against vLLM 0.33's own ``AsyncScheduler``: ``tools/vllm_diff.py --vllm-set
async_scheduling=true`` (the preset follows the vLLM side's setting; its ``spec`` group too).
"""

from __future__ import annotations

from typing import Iterator

from ..errors import ConfigError, SimulationError
from ..queues import RunningView
from .run_limit import stays_queued


def plans_ahead(scheduler) -> bool:
    """True if ``scheduler`` plans each batch while the one before it runs."""
    return bool(getattr(scheduler, "plans_ahead", False))


def counts_drafts_ahead(scheduler, speculation) -> bool:
    """True if, with ``speculation``, ``scheduler`` plans ahead as vLLM's ``AsyncScheduler``
    does, counting the drafts of the batch in flight as computed (its ``counts_drafts_ahead``):
    the engines then keep :attr:`Ahead.phantom` and :attr:`Ahead.kept`."""
    return speculation is not None and plans_ahead(scheduler) and bool(getattr(scheduler, "counts_drafts_ahead", False))


def refuse_planning_ahead(schedulers, what: str) -> None:
    """ConfigError if one of ``schedulers`` plans ahead where it is not modelled (``what``):
    a run's assembly turns ``"auto"`` off there; an engine built directly must be told."""
    for scheduler in schedulers:
        if plans_ahead(scheduler):
            raise ConfigError(f"{type(scheduler).__name__} plans batches ahead (async_scheduling / overlap_schedule), "
                              f"which is not modelled with {what}: set it to false")


def overshoot_slot(kv, ahead, seq, tokens: int = 1, lookahead: int = 0, longest: int = 0) -> bool:
    """``Plan.overshoot``'s slots: check that ``seq`` is a finished sequence holding its slot in
    a plan made ahead, and hold KV slots for its ``tokens`` more (its own and the drafts it
    verifies) and the drafter's ``lookahead``, past the positions vLLM thinks it has computed
    (:attr:`Ahead.phantom` included), none past ``longest`` (``max_model_len``, 0: no limit);
    released with its blocks after the plan. False if they do not fit."""
    if ahead is None or not ahead.planning or seq not in ahead.held:
        raise SimulationError(f"overshoot(): request {seq.request.id} is not a finished request holding its slot "
                              "in a plan made ahead")
    slots = seq.num_computed_tokens + ahead.phantom.get(seq, 0) + tokens + lookahead
    if longest and slots > longest:
        slots = max(longest, seq.num_computed_tokens + ahead.phantom.get(seq, 0) + tokens)
    if not kv.allocate(seq, 0, reserve_tokens=slots):
        return False
    if slots > seq.reserved_tokens:
        seq.reserved_tokens = slots
    return True


def unseen_finish(ahead, seq) -> bool:
    """``Plan.unseen_finish``: ``seq``, finished by the batch in progress and holding its slot,
    is one vLLM schedules once more -- it skips only a request whose first token in flight is
    its ``max_tokens``-th, so not one that stopped at an EOS or that accepted drafts took to its
    last token (:attr:`Ahead.kept`)."""
    return seq in ahead.held and (seq.request.stops_at_eos or seq in ahead.kept)


def cached_tokens_at_preemption(computed: int, pending: int, scheduled_decode: bool, fresh: bool,
                                lag: int, kept: int = 0, *, tokens: int = 0, hash_lookahead: int = 0) -> int:
    """The tokens of a request preempted in a plan made ahead whose blocks vLLM has cached:
    its ``computed`` tokens and the ``pending`` slots this plan gave it, less the token a
    placeholder stood for at its last allocation -- this plan's, if it scheduled its decode
    (its input token ``fresh`` from the batch in progress), else the one before (``lag``).
    With speculative decoding a decode's slots hold drafts, never cached (vLLM caches the tokens
    it knows), and the drafts the batch in progress accepted (``kept``, :attr:`Ahead.kept`) are
    not known yet either. With ``hash_lookahead`` (EAGLE's block hashes cover the token after
    the block) no more than the request's ``tokens`` -- those it has, the batch in progress's
    for a ``fresh`` one not known yet -- less the lookahead. Synchronously: ``fresh`` and
    ``lag`` 0."""
    if scheduled_decode:
        cached = computed + 1 - (1 + kept if fresh else 0)
    else:
        cached = computed + pending - lag - kept
    if hash_lookahead:
        known = tokens - (1 + kept if fresh else 0)
        if known - hash_lookahead < cached:
            cached = known - hash_lookahead
    return cached


class AheadRunning(RunningView):
    """The running sequences a scheduler may touch: not those finished whose slots are still
    held (:mod:`schedlab.engine.ahead`). Its length counts them (they keep their slots)."""

    __slots__ = ("_held",)

    def __init__(self, running: dict, held: dict):
        super().__init__(running)
        self._held = held

    def __iter__(self) -> Iterator:
        held = self._held
        return (s for s in self._running if s not in held)

    def __reversed__(self) -> Iterator:
        held = self._held
        return (s for s in reversed(self._running) if s not in held)

    def __contains__(self, seq: object) -> bool:
        return seq in self._running and seq not in self._held

    def last(self):
        return next(reversed(self), None)

    def holding(self) -> list:
        """Every running sequence, finished ones holding their slots too, in admission order
        (SGLang's running batch while the result that finishes them is queued)."""
        return list(self._running)

    def preemptible(self) -> list:
        """Every running sequence, finished ones holding their slots too: vLLM's running list,
        whose last request may be one whose last token is in flight."""
        return list(self._running)


class Ahead:
    """One instance's state under asynchronous scheduling: when the last batch started and
    ended, the arrivals its plan may not see yet, and the finished requests still holding
    their slots (in finishing order)."""

    __slots__ = ("start", "end", "deferred", "held", "doomed", "ghosts", "fresh", "settled", "planning",
                 "leaving", "leaving_running", "phantom", "kept")

    def __init__(self):
        self.start = -1.0    # the last batch's start and end (-1: none yet)
        self.end = -1.0
        self.planning = False  # the plan being made is made ahead (the batch in progress runs)
        self.deferred: list = []  # sequences that arrived after the last batch started
        self.held: dict = {}      # finished sequences -> None, freed after the next plan
        # held sequences whose last token a client's abort dropped (Instance._in_step_aborts):
        # released as aborted, not finished
        self.doomed: set = set()
        # running sequences whose token of the last batch that abort dropped (the plan made ahead
        # sees a placeholder for it): a retraction has no token of theirs to discard
        self.ghosts: set = set()
        # between a batch's end and the plan made ahead then, the requests (and the running ones
        # among them) whose abort has come: routers see them gone (see :meth:`note_leaving`)
        self.leaving = self.leaving_running = 0
        self.fresh: set = set()   # sequences the last batch gave a token (vLLM: a placeholder)
        # speculative decoding: positions the plan made ahead counts as computed that the last
        # batch did not compute -- its rejected drafts (and a padded admission's placeholders, a
        # dropped token's drafts), which vLLM learns of only when that batch is back
        self.phantom: dict = {}
        # ... and the drafts it accepted (given beside its own token) for those that kept some: the
        # blocks those complete are not cached yet (cached_tokens_at_preemption), and a finished one
        # is one vLLM does not know is finished (unseen_finish)
        self.kept: dict = {}
        # the last plan left no arrival for the next one, and no finished request held a slot a
        # waiting one could take: the plans after it stay alike until an event (bulk runs may start)
        self.settled = False

    def plan_time(self, now: float) -> float:
        """When the plan made at ``now`` is made in vLLM: the last batch's start if it just
        ended, else ``now``."""
        return self.start if now == self.end else now

    def defers(self, arrival_ms: float, now: float) -> bool:
        """True if a request arriving at ``arrival_ms`` misses the plan made next, at ``now``."""
        return now == self.end and arrival_ms > self.start

    def ran(self, start: float, end: float) -> None:
        """A batch ran from ``start`` to ``end``."""
        self.start, self.end = start, end

    def made_ahead(self, now: float) -> bool:
        """True if the plan made at ``now`` is made ahead: at the last batch's start, which has
        just ended."""
        return now == self.end and self.start < now

    def replans(self, now: float) -> bool:
        """After an empty plan made at ``now``: True if it was made ahead (at the last batch's
        start), so the engine plans again at ``now``, the batch's end, as vLLM does once that
        batch is back; that plan sees every arrival so far. (Data-parallel ranks stepping
        together run a dummy step instead: :mod:`schedlab.engine.lockstep`.)"""
        if self.made_ahead(now):
            self.start = now
            return True
        return False

    def arrived_by(self, t: float) -> list:
        """The deferred arrivals a plan made at ``t`` sees (taken from the deferred ones)."""
        deferred = self.deferred
        n = 0
        while n < len(deferred) and deferred[n].request.arrival_ms <= t:
            n += 1
        seen, self.deferred = deferred[:n], deferred[n:]
        return seen

    def note_leaving(self, due, loop_top: bool = False) -> None:
        """Before routing at the end of a batch, when the next plan is made ahead and applies
        the aborts only after it: ``due``, the abort entries ``(at, _, seq)`` that have come by
        then, whose requests routers see gone as the rows say (they leave at that instant).
        ``loop_top`` (SGLang's overlap loop): ``due`` came by the batch's start; of those, a
        running request stays (marked to finish) unless the batch ended it (:attr:`ghosts`),
        and the ghosts leave."""
        total = running = 0
        ghosts = self.ghosts
        for seq in dict.fromkeys(seq for _, _, seq in due):  # (a request may have two: engine.run_limit)
            status = seq.status
            if status != "finished" and status != "aborted" and not (
                    loop_top and (status == "decoding" or seq in ghosts)) and not stays_queued(seq, status):
                total += 1
                if status == "decoding" or status == "prefilling":
                    running += 1
        if loop_top:
            n = sum(1 for seq in ghosts if seq.status == "decoding" or seq.status == "prefilling")
            total += n
            running += n
        self.leaving, self.leaving_running = total, running

    def take_held(self) -> list:
        """The held sequences, in finishing order, each with whether it ends aborted (doomed)."""
        doomed = self.doomed
        out = [(seq, seq in doomed) for seq in self.held]
        self.held.clear()
        doomed.clear()
        return out

    def doom(self, seq) -> None:
        """``seq``, whose client's abort came while the batch that would have given it its last
        token ran, holds its slot through the plan made ahead like a finished one (vLLM skips a
        request whose token in flight is its last, or decodes one at an EOS once more), and is
        then released as aborted."""
        self.held[seq] = None
        self.doomed.add(seq)


class Marks:
    """The fast engine's view of which decoders a plan made ahead sees with their input token in
    flight, without touching every running sequence at every step.

    :class:`Ahead` ``fresh`` (the reference engine's) is the set of sequences decoding when the
    last batch ended, and each sequence's ``cache_lag`` is set at every plan. Here one counter
    orders every event -- a sequence starting to decode (``dec_tick``), the end of a batch
    (:attr:`fresh_tick`), a plan, a sequence leaving the decoders -- and a sequence is fresh if
    it is decoding and started before the last batch ended (after the batch before it, if the
    last batch decoded nobody -- a prefill-first step: only the prompts it completed got a
    token). A plan in which every decoder
    decodes, and a bulk run's last iteration, record themselves once (:attr:`all_tick`: whoever
    was decoding then has the lag of that moment); plans that pick their decoders, and prefills,
    write the lag on the sequences they schedule (``lag_tick`` says when); a sequence leaving the
    decoders keeps the lag it had then. Both views agree: the engines' differential tests, and
    ``tests/test_async_scheduling.py`` drives both through random events in the engine's order."""

    __slots__ = ("tick", "fresh_tick", "fresh_from", "all_tick", "all_fresh", "all_from")

    def __init__(self):
        self.tick = 1         # the next event's tick; sequences start at 0 (before everything)
        self.fresh_tick = 0   # the last batch's end
        self.fresh_from = 0   # ... and, if it decoded nobody, the one before (its prompts' tokens only)
        self.all_tick = 0     # the last plan (or bulk run) in which every decoder decoded
        self.all_fresh = 0    # ... and the batch end before it
        self.all_from = 0     # ... and its fresh_from

    def _next(self) -> int:
        t = self.tick
        self.tick = t + 1
        return t

    def entered(self, seq) -> None:
        """``seq`` starts decoding."""
        seq.dec_tick = self._next()

    def is_fresh(self, seq, decoding: bool) -> bool:
        """Whether ``seq`` (``decoding``: its status is, or was until it was just preempted) got
        a token from the last batch: vLLM's placeholder stands for its input token (not after a
        batch that decoded nobody, unless that batch completed its prompt: :meth:`got_token`)."""
        return self.got_token(seq, decoding)

    def got_token(self, seq, decoding: bool) -> bool:
        """Whether the last batch gave ``seq`` (``decoding``) a token: a decode's, or its prompt's
        last chunk's -- a batch that decoded nobody (a prefill step) gave one only to the prompts
        it completed, which started decoding after the batch before it ended."""
        return decoding and self.fresh_from < seq.dec_tick < self.fresh_tick

    def lag(self, seq, decoding: bool) -> int:
        """``seq``'s ``cache_lag``: 1 if its input token was in flight when it was last scheduled."""
        if decoding and seq.dec_tick < self.all_tick and seq.lag_tick < self.all_tick:
            return 1 if self.all_from < seq.dec_tick < self.all_fresh else 0
        return seq.cache_lag

    def left(self, seq) -> None:
        """``seq`` (decoding) leaves the decoders: it keeps the lag it has now."""
        seq.cache_lag = self.lag(seq, True)
        seq.lag_tick = self._next()

    def batch_ended(self, decoded: bool = True) -> None:
        """The batch in progress ended: the sequences decoding now got a token from it (only
        those whose prompt it completed, if it ``decoded`` nobody)."""
        self.fresh_from = 0 if decoded else self.fresh_tick
        self.fresh_tick = self._next()

    def planned(self, plan) -> None:
        """A plan made ahead: its decoders' input tokens are in flight if they are fresh; its
        prefills' are not."""
        t = self._next()
        if plan.decodes_all:
            self.all_tick, self.all_fresh, self.all_from = t, self.fresh_tick, self.fresh_from
        else:
            fresh, since = self.fresh_tick, self.fresh_from
            for seq in plan.decoded:
                seq.cache_lag = 1 if since < seq.dec_tick < fresh else 0
                seq.lag_tick = t
        for seq, _ in plan.prefills:
            seq.cache_lag = 0
            seq.lag_tick = t

    def bulk_ended(self) -> None:
        """A bulk run ended (after :meth:`batch_ended`): every decoder of its last iteration
        was planned with its input token in flight."""
        self.all_tick = self.all_fresh = self.fresh_tick
        self.all_from = self.fresh_from
