"""The reference engine: one iteration at a time, every counter explicit, every token stamped.

It exists to be trusted by reading. It shares nothing with the fast engine but the plugins
(schedulers, cost models, KV caches), the :class:`Recorder` and the KV-transfer records of
:mod:`schedlab.engine.transfer`; the differential tests run both on the same inputs and
require the same per-request timestamps and run metrics.

A :class:`ReferenceEngine` is one instance; :mod:`schedlab.engine.reference_cluster` runs
several of them (behind a router, or as prefill and decode pools) in plain time order.
"""

from __future__ import annotations

import math

from ..energy.meter import token_shares
from ..errors import SimulationError, StallError
from ..protocols import Batch
from ..queues import FcfsQueue, RunningView
from .admission import ConcurrencyLimit
from .ahead import (Ahead, AheadRunning, cached_tokens_at_preemption, counts_drafts_ahead, overshoot_slot, plans_ahead,
                    unseen_finish)
from .clock import check_iteration_end, check_iteration_ms
from .plan import (Refusals, admit_count_error, ask_scheduler, capped_slots, capped_verify,
                   check_counts, check_reason, check_wake, host_share, kv_for, limit_hook, model_len_limit, prefix_hits,
                   refusal, refused_slot, rejection_hook, swapped_blocks)
from .load import Release, load
from . import drain, run_limit
from .recorder import Recorder
from .stall import check_kv_counts, stall_message
from .stages import Stagger
from .taking import Untaken


class RefSequence:
    """A request in the reference engine: plain counters and a list of token times."""

    def __init__(self, request, seq_no: int):
        self.request = request
        self.seq_no = seq_no
        self.status = "waiting"
        self.kv_state = None
        self.reserved_tokens = 0
        self.num_preemptions = 0
        self.num_swaps = 0
        self.num_computed_tokens = 0
        self.num_generated = 0
        self.max_computed = 0
        self.token_times: list[float] = []  # end of every iteration that gave it tokens (one or more)
        self.spec_state = None  # speculative decoding's per-request draw state
        self.taken_ms = -1.0  # the first plan at or after its arrival here (engine.taking)
        self.first_scheduled_ms = -1.0
        self.waiting_since = request.arrival_ms
        self.waiting_ms = 0.0
        self.recomputed_tokens = 0
        self.prefill_chunks = 0
        self.cached_tokens_total = 0
        self.mark = -1
        self.transfer = None  # disaggregated serving: its Transfer
        self.energy_j = 0.0  # its shares of the energy of the iterations it took part in ([power])
        self.cache_lag = 0  # asynchronous scheduling: its last KV slot's token was in flight (engine.ahead)
        self.decode_due = 0  # planning ahead on a pipeline: the plan that may decode it next (stages.Stagger)
        self.token_ready_ms = -math.inf  # ... and when its latest token is back from the last stage
        self.draft_k = -1  # drafts per batch size: the drafts its next decode verifies (-1: the plan's k)
        self.server_abort = False  # the scheduler's running time limit: its abort entry is next (engine.run_limit)
        self.overdue = False  # ... which came while it waited
        self.drained = False  # its autoscaled instance's drain timeout aborts it (engine.drain)

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_tokens + self.num_generated

    @property
    def first_token_ms(self) -> float:
        return self.token_times[0] if self.token_times else -1.0

    @property
    def arrival_ms(self) -> float:
        return self.request.arrival_ms


class RefPlan:
    """The Plan protocol, implemented the obvious way."""

    def __init__(self, engine: "ReferenceEngine", serial: int):
        self._e = engine
        self.serial = serial
        self.now = engine.now
        self._cache = engine.kv
        self.kv = engine.plan_kv  # (kv_for: the cache, or a view of it to a third-party scheduler)
        self.waiting = engine.waiting
        self.decodes_all = False
        self.decoded: list = []
        self.skipped_decode = False
        self.prefills: list = []
        self.admitted: list = []
        self.preempted: list = []
        self.swapped_in: list = []
        self.transfer_ms = 0.0
        self.refusals = Refusals()
        self.wake = None
        self.num_scheduled_tokens = 0
        spec = engine.spec
        self.spec_k = engine.spec_k if spec is not None else 0  # drafts a decode verifies (but see drafts_for)
        self.per_request = spec is not None and spec.per_request
        self.lookahead = spec.lookahead if spec is not None else 0
        self.longest = engine.longest  # speculation's KV slots stay within max_model_len (0: no limit)
        self.draft_input_slots = spec.draft_input_slots if spec is not None else 0
        self.admission_padding = spec.admission_padding if spec is not None else 0
        self.drafts: dict = {}  # decode -> (drafts it verifies, KV slots it took)
        self.padded: dict = {}  # admissions' placeholder drafts (admit(padding=...))
        self.dropped: list = []  # a pipeline's (sequence, tokens) chunks of prompts preempted since the launch
        self.overshoots: list = []  # finished sequences decoded once more, their token discarded (overshoot)
        self.overshoot_drafts: dict = {}  # ... and the drafts those verify (speculation)

    @property
    def running(self):
        e = self._e
        return RunningView(e.running) if e.ahead is None else AheadRunning(e.running, e.ahead.held)

    @property
    def prefilling(self):
        return [s for s in self._e.running if s.status == "prefilling"]

    @property
    def swapped(self):
        return list(self._e.swapped)

    @property
    def has_prefilling(self):
        return bool(self.prefilling)

    @property
    def has_swapped(self):
        return bool(self._e.swapped)

    @property
    def num_decoding(self):
        return sum(1 for s in self._e.running if s.status == "decoding")

    @property
    def spec_tokens(self) -> int:
        return self._e.spec.k_max if self.per_request else self.spec_k

    def drafts_for(self, seq) -> int:
        """Drafts per batch size: the k proposed after the batch that last scheduled ``seq``."""
        return seq.draft_k if self.per_request and seq.draft_k >= 0 else self.spec_k

    @property
    def num_held(self) -> int:
        holds = self._e.holds
        return len(holds) if holds is not None else 0

    @property
    def decode_steps(self):
        return self._e.decode_steps

    @property
    def num_scheduled_seqs(self):
        return len(self.decoders()) + len(self.prefills) + len(self.overshoots)

    def is_scheduled(self, seq) -> bool:
        return seq.mark == self.serial or (self.decodes_all and seq.status == "decoding")

    @property
    def made_ahead(self) -> bool:
        ahead = self._e.ahead
        return ahead is not None and ahead.planning

    def token_in_flight(self, seq) -> bool:
        ahead = self._e.ahead
        # (a ghost's token, its abort read as the batch in progress started, is not counted: engine.ahead)
        return ahead is not None and ahead.planning and ((seq in ahead.fresh and seq not in ahead.ghosts)
                                                         or seq in ahead.held)

    def unseen_finish(self, seq) -> bool:
        ahead = self._e.ahead
        return ahead is not None and ahead.planning and unseen_finish(ahead, seq)

    def overshoot(self, seq, num_tokens: int | None = None) -> bool:
        if seq in self.overshoots:
            return True
        k = self.drafts_for(seq)
        n = 1 if num_tokens is None else num_tokens
        if not 1 <= n <= 1 + k:
            raise SimulationError(f"overshoot(): request {seq.request.id} may verify 1 to {1 + k} tokens, asked {n}")
        if not overshoot_slot(self._cache, self._e.ahead, seq, n, self.lookahead, self.longest):
            return False
        self.overshoots.append(seq)
        self.num_scheduled_tokens += n
        if n > 1:
            self.overshoot_drafts[seq] = n - 1
        return True

    def phantom(self, seq) -> int:
        """Positions of ``seq`` this plan, made ahead, counts as computed that the batch in
        progress did not compute (:attr:`schedlab.engine.ahead.Ahead.phantom`)."""
        ahead = self._e.ahead
        return ahead.phantom.get(seq, 0) if ahead is not None and ahead.planning else 0

    def decode_all(self) -> bool:
        if self.decodes_all:
            return True
        if self.skipped_decode:
            raise SimulationError("decode_all() after skip_decode()")
        decoding = [s for s in self._e.running if s.status == "decoding" and s not in self.decoded]
        spec = self._e.spec is not None
        # (speculation: each decode's tokens and slots within max_model_len, capped_verify, capped_slots)
        verify = {s: max(1, capped_verify(1 + self.drafts_for(s), s, self.longest, self.phantom(s))) if spec else 1
                  for s in decoding}
        slots = {s: capped_slots(verify[s] + self.lookahead + self.phantom(s), s, self.longest,
                                 verify[s] + self.phantom(s)) if spec else 1 + self.phantom(s) for s in decoding}
        if sum(self._cache.blocks_needed(s, slots[s]) for s in decoding) > self._cache.num_free_blocks():
            return False
        for s in decoding:
            if not self._cache.allocate(s, slots[s]):
                raise refused_slot(self._cache)
            self.drafts[s] = (verify[s] - 1, slots[s])
            self.num_scheduled_tokens += verify[s]
        self.decodes_all = True
        self.decoded = []
        return True

    def decode(self, seq, num_tokens: int | None = None) -> bool:
        if seq.status != "decoding" or self.skipped_decode or self.is_scheduled(seq):
            raise SimulationError(f"decode(): request {seq.request.id} cannot decode now")
        k = self.drafts_for(seq)
        if num_tokens is not None and num_tokens.__class__ is not int:  # (an int passes at once: a hot path)
            check_counts("decode", seq, num_tokens=num_tokens)
        n = 1 + k if num_tokens is None else num_tokens
        if not 1 <= n <= 1 + k:
            raise SimulationError(f"decode(): request {seq.request.id} may verify 1 to {1 + k} tokens, asked {n}")
        if self._e.spec is not None:
            slots = capped_slots(n + self.lookahead + self.phantom(seq), seq, self.longest, n + self.phantom(seq))
        else:
            slots = 1 + self.phantom(seq)
        allocated = self._cache.allocate(seq, slots)
        if not allocated:
            return refusal(self._cache, allocated)
        seq.mark = self.serial
        self.decoded.append(seq)
        self.drafts[seq] = (n - 1, slots)
        self.num_scheduled_tokens += n
        return True

    def decoders(self) -> list:
        """The sequences that decode in this iteration."""
        if self.decodes_all:
            return [s for s in self._e.running if s.status == "decoding"]
        return [s for s in self._e.running if s in self.decoded]

    def skip_decode(self) -> None:
        if self.decodes_all or self.decoded:
            raise SimulationError("skip_decode() after decode_all()")
        self.skipped_decode = True

    def cached_tokens(self, seq) -> int:
        hit_of = self._e.prefix_hit
        return hit_of(seq) if hit_of is not None else 0

    def admit(self, seq, num_tokens: int, *, reserve: bool = False, reserve_tokens: int = 0,
              padding: int = 0) -> bool:
        if seq.status != "waiting":
            raise SimulationError(f"admit(): request {seq.request.id} is {seq.status}")
        if not num_tokens.__class__ is reserve_tokens.__class__ is padding.__class__ is int:
            check_counts("admit", seq, num_tokens=num_tokens, reserve_tokens=reserve_tokens, padding=padding)
        hit = self.cached_tokens(seq)
        if not 1 <= num_tokens <= seq.num_tokens - hit:
            raise admit_count_error(seq, num_tokens, hit)
        if padding and not (0 < padding <= self.admission_padding and num_tokens == seq.num_tokens - hit):
            raise SimulationError(f"admit(): request {seq.request.id}: bad padding {padding}")
        most = seq.request.prompt_tokens + seq.request.max_output_tokens
        if reserve_tokens:
            least = min(most - 1, seq.num_tokens + self._e.answer_segment - 1) if self._e.answer_segment else most - 1
            if reserve_tokens < least:
                raise SimulationError(f"admit(): request {seq.request.id} may compute {least} tokens, "
                                      f"scheduler reserved {reserve_tokens}")
        elif reserve:
            reserve_tokens = most
        spec = self._e.spec
        if spec is not None:
            if reserve_tokens:
                reserve_tokens += spec.slack_for(seq.request)
            # a drafter writing KV past the step's tokens takes its lookahead slots with a
            # prompt chunk too (vLLM allocate_slots(..., num_lookahead_tokens)); they stay reserved
            if padding or spec.lookahead:  # (placeholder drafts take slots as drafts do)
                reserve_tokens = max(reserve_tokens, hit + num_tokens + padding + spec.lookahead)
            if self.longest and reserve_tokens > self.longest:  # (no slot past max_model_len)
                reserve_tokens = max(self.longest, hit + num_tokens + padding)
        host = getattr(self._cache, "host", None)
        loaded = host.loaded if host is not None else 0
        allocated = self._cache.allocate(seq, num_tokens, cached_tokens=hit, reserve_tokens=reserve_tokens)
        if not allocated:
            return refusal(self._cache, allocated) or self.refusals.refuse(seq)
        if seq.mark == self.serial:
            raise SimulationError(f"request {seq.request.id} admitted twice in one iteration")
        if host is not None and host.loaded > loaded:  # blocks reloaded from host memory
            blocks = host.loaded - loaded
            ms = blocks * host.bytes_per_block / (host.link_gbps * 1e9) * 1e3 + host.latency_us / 1e3
            share = host_share(blocks, hit, self._cache.block_size)  # (the tier's share of the hit)
            self._e.counters["prefix_preempted_host_hits" if seq.num_preemptions else "host_hits"] += share
            self._e.counters["host_load_blocks"] += blocks
            self._e.counters["host_load_ms"] += ms
            self.transfer_ms += ms
        seq.mark = self.serial
        e = self._e
        self.waiting.remove(seq)
        if e.running_timeout_ms:
            at = run_limit.deadline(seq, e.now, e.running_timeout_ms, e.hangup_ms)
            if at is not None:
                e.aborts.append([at, seq.seq_no, seq])
        if seq.first_scheduled_ms < 0:
            seq.first_scheduled_ms = e.now
        seq.waiting_ms += e.now - seq.waiting_since
        seq.status = "prefilling"
        seq.num_computed_tokens = hit
        seq.reserved_tokens = reserve_tokens
        seq.cached_tokens_total += hit
        e.running[seq] = None
        if getattr(self._cache, "prefix_caching", False):
            if seq.num_preemptions:  # re-admitted after a preemption: its own blocks found again
                e.counters["prefix_preempted_queries"] += seq.num_tokens
                e.counters["prefix_preempted_hits"] += hit
            else:
                e.counters["prefix_queries"] += seq.num_tokens
                e.counters["prefix_hits"] += hit
        self.admitted.append(seq)
        self.prefills.append((seq, num_tokens))
        self.num_scheduled_tokens += num_tokens + padding
        if padding:
            self.padded[seq] = padding
            # vLLM counts them as drafts verified, all rejected (scheduled_spec_decode_tokens of -1s)
            e.counters["spec_drafts"] += 1
            e.counters["spec_draft_tokens"] += padding
            e.counters["spec_padded_drafts"] += 1
            e.counters["spec_padded_tokens"] += padding
        return True

    def prefill(self, seq, num_tokens: int) -> bool:
        if seq.status != "prefilling" or seq.mark == self.serial:
            raise SimulationError(f"prefill(): request {seq.request.id} cannot prefill now")
        if num_tokens.__class__ is not int:
            check_counts("prefill", seq, num_tokens=num_tokens)
        if not 1 <= num_tokens <= seq.num_tokens - seq.num_computed_tokens:
            raise SimulationError(f"prefill(): bad token count {num_tokens} for request {seq.request.id}")
        lookahead = self.lookahead  # (see admit)
        slots = seq.num_computed_tokens + capped_slots(num_tokens + lookahead, seq, self.longest, num_tokens)
        allocated = self._cache.allocate(seq, num_tokens, reserve_tokens=slots if lookahead else 0)
        if not allocated:
            return refusal(self._cache, allocated)
        if lookahead:
            seq.reserved_tokens = max(seq.reserved_tokens, slots)
        seq.mark = self.serial
        self.prefills.append((seq, num_tokens))
        self.num_scheduled_tokens += num_tokens
        return True

    def _withdraw(self, seq, what) -> int:
        """Take ``seq``'s work out of this iteration; the tokens it had KV allocated for."""
        if seq in self.drafts:  # a decode
            if seq in self.swapped_in:
                raise SimulationError(f"{what}(): request {seq.request.id} joined this iteration")
            drafts, slots = self.drafts.pop(seq)
            self.num_scheduled_tokens -= 1 + drafts
            if seq in self.decoded:
                self.decoded.remove(seq)
            seq.mark = -1
            return slots
        if seq.mark != self.serial:
            return 0
        if seq in self.admitted or seq in self.swapped_in:
            raise SimulationError(f"{what}(): request {seq.request.id} joined this iteration")
        seq.mark = -1
        n = next(n for s, n in self.prefills if s is seq)
        self.prefills = [(s, m) for s, m in self.prefills if s is not seq]
        self.num_scheduled_tokens -= n
        return n

    def preempt(self, seq, *, discard_in_flight: bool = False) -> None:
        e = self._e
        if (discard_in_flight and self.token_in_flight(seq) and seq in e.ahead.held and seq not in e.ahead.ghosts
                and seq not in e.ahead.doomed and seq not in self.overshoots and not e.closed_loop):
            # SGLang's overlap scheduler: finished in flight without its knowing, its last token
            # is computed again (Instance.unfinish_held)
            del e.ahead.held[seq]
            seq.status = "decoding"
            self._requeue(seq, 0)
            seq.num_generated -= 1
            if not seq.num_generated:
                seq.token_times.clear()
            e.counters["discarded_tokens"] += 1
            e.counters["generated_tokens"] -= 1
            return
        if (discard_in_flight and self.token_in_flight(seq) and seq in e.ahead.doomed and e.to_finish is not None
                and seq not in self.overshoots):
            # SGLang's overlap scheduler: its abort came while the batch in flight gives it its last
            # token; its to_finish survives the retraction (Instance.requeue_doomed)
            del e.ahead.held[seq]
            e.ahead.doomed.discard(seq)
            seq.status = "decoding"
            self._requeue(seq, 0)
            seq.num_generated -= 1  # (the token in flight: never sent, never counted)
            if not seq.num_generated:
                seq.token_times.clear()
            e.to_finish.add(seq)
            return
        if discard_in_flight and self.token_in_flight(seq) and seq not in e.ahead.held and seq not in e.ahead.ghosts:
            self.preempt(seq)
            seq.num_generated -= 1  # (its gap stays a sample: Plan.preempt)
            if not seq.num_generated:
                seq.token_times.clear()
            e.counters["discarded_tokens"] += 1
            e.counters["generated_tokens"] -= 1  # (output tokens; the work stays in decode_tokens)
            return
        if e.ahead is not None and seq in e.ahead.held:
            # asynchronous scheduling: finished by the last iteration, its slot still held, and
            # vLLM's running list still has it; its blocks go now (its row is written with them),
            # and its decode once more if this plan gave it one
            if seq in self.overshoots:
                self.overshoots.remove(seq)
                self.num_scheduled_tokens -= 1 + self.overshoot_drafts.pop(seq, 0)
            del e.ahead.held[seq]
            del e.running[seq]
            self._cache.free(seq)
            seq.num_preemptions += 1
            e.counters["num_preemptions"] += 1
            e.counters["recompute_preemptions"] += 1
            if seq in e.ahead.doomed:  # (its last token dropped: its client's abort comes after this plan)
                e.ahead.doomed.discard(seq)
                seq.num_generated -= 1
                e._record_aborted(seq, e.ahead.end)
            else:
                e.record_finished(seq, e.ahead.end)
            self.preempted.append(seq)
            return
        if seq.status not in ("prefilling", "decoding"):
            raise SimulationError(f"preempt(): request {seq.request.id} is {seq.status}")
        self._requeue(seq, self._withdraw(seq, "preempt"))

    def reject(self, seq, reason: str) -> None:
        if seq.status != "waiting" or seq not in self.waiting:
            raise SimulationError(f"reject(): request {seq.request.id} is {seq.status}, not in the waiting queue")
        self._e.reject_waiting(seq, check_reason(seq, reason))

    def requeue(self, seq) -> None:
        e = self._e
        if e.ahead is not None or e.holds is not None:
            raise SimulationError("requeue() is not modelled with asynchronous scheduling or pipeline parallelism")
        if seq.status not in ("prefilling", "decoding"):
            raise SimulationError(f"requeue(): request {seq.request.id} is {seq.status}")
        self._requeue(seq, self._withdraw(seq, "requeue"), to_back=True)

    def _requeue(self, seq, pending: int, *, to_back: bool = False) -> None:
        """Free running ``seq``'s blocks (and the ``pending`` slots taken for it since they were
        last counted) and put it at the front of the waiting queue -- or, on a pipelined
        instance, hold it back while a batch in flight holds it (:mod:`schedlab.engine.stages`);
        ``to_back``: a requeue (``Plan.requeue``), at the back and not counted as a preemption."""
        e = self._e
        del e.running[seq]
        # it holds the slots allocated this iteration, but vLLM has cached only the tokens it knew:
        # a decode's input token, not its drafts' slots; planning ahead (engine.ahead) not one
        # still being computed when it last got a slot: this one, if the iteration gave it one,
        # else the one before
        held = seq.num_computed_tokens + pending
        scheduled_decode = seq.status in ("decoding", "in_flight") and pending > 0  # (in flight: its decode's slots)
        lookahead = getattr(self._cache, "hash_lookahead", 0)
        if e.stagger is not None and seq.status == "in_flight" and seq in e.holds.flying:  # (its token in flight)
            seq.num_computed_tokens = Stagger.cached(seq, seq.num_computed_tokens, lookahead)
        elif e.ahead is None:
            seq.num_computed_tokens = cached_tokens_at_preemption(seq.num_computed_tokens, pending, scheduled_decode,
                                                                  False, 0, tokens=seq.num_tokens,
                                                                  hash_lookahead=lookahead)
        else:
            seq.num_computed_tokens = cached_tokens_at_preemption(
                seq.num_computed_tokens, pending, scheduled_decode, seq in e.ahead.fresh, seq.cache_lag,
                e.ahead.kept.get(seq, 0), tokens=seq.num_tokens, hash_lookahead=lookahead)
        seq.reserved_tokens = max(seq.reserved_tokens, held)
        self._cache.free(seq, preempted=True)
        seq.status = "waiting"
        seq.num_computed_tokens = 0
        seq.reserved_tokens = 0
        seq.waiting_since = e.now
        if to_back:
            e.counters["requeues"] += 1
            self.waiting.push(seq)
        else:
            seq.num_preemptions += 1
            e.counters["num_preemptions"] += 1
            e.counters["recompute_preemptions"] += 1
            if e.holds is None or not e.holds.hold(seq):
                self.waiting.push_front(seq)
        self.preempted.append(seq)

    def swap_out(self, seq) -> bool:
        if seq.status != "decoding":
            raise SimulationError(f"swap_out(): request {seq.request.id} is {seq.status}")
        if seq in self.swapped_in:
            raise SimulationError(f"swap_out(): request {seq.request.id} joined this iteration")
        e = self._e
        swap_out = getattr(self._cache, "swap_out", None)
        pending = self.drafts[seq][1] if seq in self.drafts else 0
        seq.num_computed_tokens += pending  # its slots of this iteration go along (swap-in needs them again)
        ms = swap_out(seq) if swap_out is not None else None
        moved = swapped_blocks(self._cache, seq, seq.num_computed_tokens) if ms is not None else 0
        seq.num_computed_tokens -= pending
        if ms is None:
            e.counters["swap_failures"] += 1
            return False
        self._withdraw(seq, "swap_out")
        del e.running[seq]
        e.swapped.append(seq)
        seq.status = "swapped"
        seq.num_preemptions += 1
        seq.num_swaps += 1
        e.counters["num_preemptions"] += 1
        e.counters["swap_preemptions"] += 1
        e.counters["swap_out_blocks"] += moved
        e.counters["swap_transfer_ms"] += ms
        self.transfer_ms += ms
        self.preempted.append(seq)
        return True

    def swap_in(self, seq) -> bool:
        if seq.status != "swapped":
            raise SimulationError(f"swap_in(): request {seq.request.id} is {seq.status}")
        if not self.decodes_all and not self.decode_all():
            return False
        moved = swapped_blocks(self._cache, seq, seq.num_computed_tokens)  # (what swap_out moved)
        ms = self._cache.swap_in(seq)
        if ms is None:
            return False
        e = self._e
        e.swapped.remove(seq)
        e.running[seq] = None
        seq.status = "decoding"
        seq.mark = self.serial
        e.counters["swap_in_blocks"] += moved
        e.counters["swap_transfer_ms"] += ms
        self.transfer_ms += ms
        self.swapped_in.append(seq)
        self.drafts[seq] = (0, 1)  # swap-in gave it one slot: no drafts this time
        self.num_scheduled_tokens += 1
        return True

    def wake_at(self, time_ms: float) -> None:
        check_wake(time_ms)
        if self.wake is None or time_ms < self.wake:
            self.wake = time_ms

    def wake_after(self, decode_steps: int) -> None:
        """Nothing to do: this engine asks the scheduler at every iteration."""
        if decode_steps < 0:
            raise SimulationError(f"wake_after({decode_steps}): give a number of decode steps >= 0")


class ReferenceEngine:
    """One instance, simulated iteration by iteration.

    :meth:`step` plans at ``now`` and runs that iteration, or -- when the scheduler plans
    nothing -- goes to sleep until its wake-up time (``sleep_until``); a driver wakes it
    earlier when something happens to it (an arrival). ``role`` is the instance's part in a
    disaggregated cluster (see :mod:`schedlab.engine.reference_cluster`), None otherwise.
    """

    def __init__(self, scheduler, cost_model, kv, recorder: Recorder, *, index: int = 0,
                 stall_limit: int = 100_000, speculation=None, meter=None):
        from .instance import default_rejection_reason

        self.spec = speculation
        self.spec_k = speculation.k_max if speculation is not None else 0
        # speculation: the longest sequence (max_model_len) drafts and their slots stay within (0: none)
        self.longest = model_len_limit(scheduler, kv) if speculation is not None else 0
        if speculation is not None:
            speculation.configure_cache(kv, scheduler)
        self.scheduler = scheduler
        self.answer_segment = getattr(scheduler, "answer_segment", 0) or 0  # (Scheduler protocol)
        self.cost = cost_model
        self.kv = kv
        self.plan_kv = kv_for(scheduler, kv)  # what its plans show the scheduler
        self.rec = recorder
        self.index = index
        cap = getattr(scheduler, "max_in_flight", None)  # (Scheduler protocol: TGI's max_concurrent_requests)
        self.concurrency = ConcurrencyLimit(cap) if cap else None
        if cap:
            recorder.limits[index] = self.concurrency
        self.counters = recorder.counters
        self.stall_limit = stall_limit
        self.now = 0.0
        self.decode_steps = 0
        make_queue = getattr(scheduler, "new_waiting_queue", None)
        self.waiting = make_queue() if make_queue is not None else FcfsQueue()
        self.untaken = Untaken()  # arrivals no plan has taken yet (their taken_ms: engine.taking)
        self.running: dict = {}
        self.swapped: list = []
        self.events = 0  # every iteration is an event here
        self.role = None
        self.on_request_done = None  # called with (request, time) when a request leaves the run
        self.closed_loop = False  # ... which a closed loop's client hears of (it sends its next request)
        self.sleep_until: float | None = None  # asleep (empty plan): its wake-up time (inf: none)
        self.reason_of = rejection_hook(scheduler, default_rejection_reason)  # (its answers checked)
        self.limit_request = limit_hook(scheduler)  # the request as served (max_model_len), checked
        self.prefix_hit = prefix_hits(kv)  # a sequence's hit, checked; None: never asked (always 0)
        self.serial = 0
        self.ended = 0  # requests finished or aborted here (a pipeline's next plan tells its workers)
        self.empty_plans = 0
        self.no_progress = 0
        self.busy_ms = 0.0
        self.kv_block_ms = 0.0
        self.iterations = 0
        self.kv_peak = 0
        self.release = Release()  # what the last iteration gives back at its end (routers' view)
        self.meter = meter  # a schedlab.energy.EnergyMeter with [power]
        self.aborts: list = []    # [time the engine hears its client gave up, seq_no, sequence]
        self.hangup_ms = 0.0      # how long a client's disconnect takes to get here
        self.in_flight: dict | None = None  # pipelined: a decode in a batch in flight -> its KV slots there
        self.stagger = None  # pipelined and planning ahead: stages.Stagger
        self.aborts_drop_output = True  # an abort during an iteration drops its output (Instance's)
        # a running request whose abort is read at a plan runs once more (Instance.to_finish)
        self.to_finish: set | None = set() if getattr(scheduler, "aborts_run_once_more", False) else None
        if self.to_finish is not None:
            self.aborts_drop_output = False
        # the scheduler's limit on a request's time since it was first scheduled (engine.run_limit)
        self.running_timeout_ms = getattr(scheduler, "running_timeout_ms", 0.0) or 0.0
        self.running_timeout_reason = getattr(scheduler, "running_timeout_reason", run_limit.DEFAULT_REASON)
        self.held_to_landing = 0  # blocks aborts heard at a pipeline's landing freed (Instance's)
        self.holds = None  # pipelined: requests batches in flight hold (schedlab.engine.stages.Holds)
        self.pending = None  # never: runs are the fast engine's (see schedlab.engine.load)
        #: autoscaled and draining with a drain timeout (:mod:`schedlab.engine.drain`): at its first
        #: plan at or after this time it aborts every request it holds (inf: none)
        self.drain_at = math.inf
        self.drain_aborted = 0  # requests a drain timeout aborted here
        self.ahead = Ahead() if plans_ahead(scheduler) else None  # asynchronous scheduling (engine.ahead)
        #: planning ahead, the drafts in flight count as computed (engine.ahead, Ahead.phantom)
        self.drafts_ahead = counts_drafts_ahead(scheduler, speculation)
        host = getattr(kv, "host", None)
        if host is not None:
            host.attach(self.counters)

    def run(self, requests, workload=None) -> None:
        """Serve ``requests`` on this instance alone."""
        from .reference_cluster import ReferenceCluster

        ReferenceCluster([self]).run(requests, workload=workload)

    # -- state ------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return (bool(self.waiting or self.running or self.swapped) or (self.role is not None and self.role.has_work())
                # (or blocks a planned-ahead pass computed twice, freed at the next plan: RadixKVCache)
                or (self.ahead is not None and bool(self.ahead.deferred or getattr(self.kv, "releasing_blocks", 0))))

    @property
    def outstanding(self) -> int:
        """Requests queued or in service (routers read this)."""
        n = len(self.waiting) + len(self.running) + len(self.swapped)
        if self.holds is not None:
            n += len(self.holds)
        if self.ahead is not None:  # arrivals not planned yet in; finished requests holding slots out
            n += len(self.ahead.deferred) - len(self.ahead.held) - self.ahead.leaving
        return n + (self.role.outstanding if self.role is not None else 0)

    def next_plan_time(self) -> float:
        """When this instance plans next: now, or when its sleep ends -- its wake-up time, its
        role's next timed event or its next abort, whichever is first (inf: only when woken)."""
        if self.sleep_until is None:
            return self.now
        t = self.sleep_until
        if self.role is not None:
            t = min(t, self.role.next_time())
        pending = [at for at, _, seq in self.aborts if seq.status not in ("finished", "aborted")]
        t = min([t, self.drain_at] + pending)
        return max(t, self.now)

    def wake(self, t: float) -> None:
        """Something happened to this instance at ``t`` (>= the time of its last plan)."""
        if t > self.now:
            used = self.kv.num_used_blocks() + self.held_to_landing  # blocks held meanwhile count in KV usage
            self.counters["kv_block_ms"] += used * (t - self.now)
            self.kv_block_ms += used * (t - self.now)
            if used > self.rec.kv_high_water * self.kv.num_blocks:
                self.counters["kv_above_ms"] += t - self.now
            if used:
                self.counters["kv_held_until_ms"] = max(self.counters["kv_held_until_ms"], t)
            self.now = t
        self.sleep_until = None

    def arrive(self, request, seq_no: int, reason: str | None = None) -> RefSequence | None:
        """Queue an arrived ``request``, or reject it (with ``reason``, or when it can never fit)."""
        self.empty_plans = 0  # (a stall is empty plans with nothing new: not the wake-ups arrivals cause)
        if self.limit_request is not None:
            request = self.limit_request(request, self.kv)
        seq = RefSequence(request, seq_no)
        if not reason and self.concurrency is not None:
            reason = self.concurrency.refusal(request.arrival_ms)
        reason = reason or self.reason_of(request, self.kv)
        if not reason and self.spec is not None:
            reason = self.spec.rejection_reason(self.reason_of, request, self.kv, self.longest)
        if reason:
            seq.status = "rejected"
            self.rec.reject(seq, self.index, reason)
            if self.on_request_done is not None:
                self.on_request_done(request, request.arrival_ms)
            return None
        if self.concurrency is not None:
            self.concurrency.accept()
        if request.timeout_ms is not None:  # its client gives up then; the engine hears of it hangup_ms later
            abort_at = request.sent_at + request.timeout_ms + self.hangup_ms
            if abort_at <= request.arrival_ms:
                seq.status = "aborted"
                self.rec.request_done(seq, self.index, request.arrival_ms, aborted=True)
                return None
            self.aborts.append([abort_at, seq_no, seq])
        self.untaken.add(seq)
        ahead = self.ahead
        if ahead is not None and self.now == ahead.end and request.arrival_ms > ahead.start:
            ahead.deferred.append(seq)  # it arrived after the batch in progress was planned
            return seq
        self.waiting.push(seq)
        self.counters["peak_waiting"] = max(self.counters["peak_waiting"], len(self.waiting))
        return seq

    def drain_by(self, t: float) -> None:
        """Autoscaled, draining: abort every request held at the first plan at or after ``t`` (a
        drain timeout, :mod:`schedlab.engine.drain`; inf: none, a timer cancelled)."""
        self.drain_at = t

    def drain_kill(self) -> None:
        """The drain timeout has come (at this plan, ``now``): every request held is aborted as if
        its client's abort reached the engine now (:mod:`schedlab.engine.drain`)."""
        self.drain_at = math.inf
        now = self.now
        for seq in drain.victims(self, now):
            self.aborts.append([now, drain.ORDER + seq.seq_no, seq])

    # -- one iteration ----------------------------------------------------------------------------
    def step(self) -> None:
        """Abort what is due, then plan at ``now``; run the iteration, or sleep if the plan is empty.
        (vLLM's engine core reads aborts before it schedules: a request that lands or whose
        blocks come back meets a batch its aborted neighbours have left. Planning ahead, the plan
        does it: :meth:`_plan`.) A drain timeout that has come aborts everything first
        (:mod:`schedlab.engine.drain`)."""
        if self.drain_at <= self.now:
            self.drain_kill()
        if not self._aborts_at_plan_time():
            self.abort_due()
        if self.role is not None:
            self.role.before_plan(self)
        plan = self._plan()
        if self.role is not None:
            self.role.after_plan(self, plan)
        ahead = self.ahead
        if ahead is not None and not plan.num_scheduled_tokens and ahead.made_ahead(self.now):
            # planned when the last batch started, nothing: plan again now that it is back
            ahead.start = self.now
            plan = self._plan()
        if not plan.num_scheduled_tokens and not plan.swapped_in and plan.transfer_ms == 0.0:
            self.empty_plans += 1
            if self.empty_plans > 1000:
                raise StallError("reference engine: " + stall_message(self, "the scheduler keeps planning empty "
                                                                        "iterations"))
            wake = plan.wake if plan.wake is not None else math.inf
            target = min(wake, self.role.next_time()) if self.role is not None else wake
            if not plan.preempted and target > self.now:
                self.sleep_until = wake  # the driver wakes it then, or at an event of its own
            return
        self.empty_plans = 0
        self.events += 1
        self._execute(plan)

    def _plan(self) -> RefPlan:
        """The scheduler's plan for the iteration starting now. With asynchronous scheduling
        (:mod:`schedlab.engine.ahead`) it is made when the last iteration started, if one just
        ended: with the arrivals until then, the requests that iteration finished still holding
        their slots and blocks, which they give back once the plan is made. The plan takes the
        requests that arrived by the time it is made (:mod:`schedlab.engine.taking`)."""
        self.serial += 1
        ahead = self.ahead
        if ahead is None:
            self.untaken.take(self.now)
            plan = RefPlan(self, self.serial)
            ask_scheduler(self.scheduler, plan)
            check_kv_counts(self.kv)
            return plan
        end = self.now
        t = ahead.start if end == ahead.end else end
        while ahead.deferred and ahead.deferred[0].request.arrival_ms <= t:
            self.waiting.push(ahead.deferred.pop(0))
            self.counters["peak_waiting"] = max(self.counters["peak_waiting"], len(self.waiting))
        at_plan_time = self._aborts_at_plan_time()
        loop_top = at_plan_time and self._loop_top_aborts()
        if at_plan_time:  # the aborts that reached vLLM's engine core (SGLang's loop) before this plan
            self.abort_due(upto=t)  # (rows now, as routers see them; SGLang's running requests only marked)
        self.now = t
        self.untaken.take(t)
        ahead.planning = t < end
        if not ahead.planning and (ahead.phantom or ahead.kept):  # (the batch's output is seen: nothing is in flight)
            ahead.phantom, ahead.kept = {}, {}
        plan = RefPlan(self, self.serial)
        ask_scheduler(self.scheduler, plan)
        check_kv_counts(self.kv)
        self.now = end
        ahead.planning = False
        for s in plan.decoders():  # its slot's token is in flight if the last iteration computes it
            s.cache_lag = 1 if s in ahead.fresh else 0
        for s, _ in plan.prefills:
            s.cache_lag = 0
        overshot = plan.overshoots if getattr(self.kv, "caches_overshoot", False) else ()
        for s, doomed in ahead.take_held():
            del self.running[s]
            if s in overshot:  # (its decode once more writes its last token's KV: the cache keeps it)
                s.num_computed_tokens += 1 + plan.overshoot_drafts.get(s, 0)
            self.kv.free(s)
            if doomed:
                s.num_generated -= 1  # (the token in flight it was held with: never sent)
                self._record_aborted(s, ahead.end)
            else:
                self.record_finished(s, ahead.end)
        if loop_top:  # those the last batch's result ended (SGLang): after the plan, which holds them
            # (one the plan preempted keeps its to_finish for its next run, as SGLang's request does)
            self.to_finish.update(s for s in ahead.ghosts if s.status == "waiting")
            for s in [s for s in self.running if s in ahead.ghosts]:  # (the running list's order)
                self._abort_one(s, plan)
        elif at_plan_time:  # those that came while the last batch ran: after the plan, which holds them
            self.abort_due(plan)
        ahead.ghosts.clear()
        ahead.leaving = ahead.leaving_running = 0
        return plan

    def _aborts_at_plan_time(self) -> bool:
        """Whether aborts reach the scheduler when vLLM's engine core would make the plan --
        planning ahead, at the batch in progress's start, so that the plan still holds a request
        whose abort comes while that batch runs (:mod:`schedlab.engine.ahead`) -- rather than
        all of them before the plan (elsewhere the same)."""
        return (self.ahead is not None and (self.aborts_drop_output or self._loop_top_aborts()) and self.role is None
                and self.in_flight is None)

    def _loop_top_aborts(self) -> bool:
        """SGLang's overlap loop reads aborts when the batch in flight has just started (the
        fast engine's ``_loop_top_aborts``)."""
        return self.ahead is not None and self.to_finish is not None

    def settle(self, t: float) -> None:
        """Before requests arriving at ``t`` are routed: an instance between iterations aborts
        what is due by ``t`` (routers see aborted requests gone at their abort)."""
        if self._aborts_at_plan_time() and self.ahead.made_ahead(t):
            # the plan made ahead at t applies them (before it or after it): routers see the
            # requests that leave then gone meanwhile
            loop_top = self._loop_top_aborts()
            last = self.ahead.start if loop_top else t
            self.ahead.note_leaving([a for a in self.aborts if a[0] <= last], loop_top)
            return
        if self.now <= t and any(at <= t and seq.status not in ("finished", "aborted") for at, _, seq in self.aborts):
            self.wake(t)
            self.abort_due()

    def abort_due(self, plan: RefPlan | None = None, *, strictly: bool = False, upto: float | None = None) -> None:
        """Drop every request whose client's disconnect has reached the engine by now, in the
        order the disconnects arrived (ties: arrival order): its KV blocks and slot are freed,
        also while it is in a pipeline's batch in flight (:mod:`schedlab.engine.stages`).
        ``plan``: made ahead just before, for the batch starting now; a decode it gave an
        aborted request is computed for nothing (``overshoots``; its prefill chunk too).
        ``strictly``: only those that came before now (a pipeline's landing now comes first);
        ``upto``: those that came by then (SGLang's overlap loop read them then: :meth:`_plan`)."""
        last = self.now if upto is None else upto
        due = sorted((a for a in self.aborts if a[0] < last or (a[0] == last and not strictly)),
                     key=lambda a: (a[0], a[1]))
        for entry in due:
            self.aborts.remove(entry)
            self._abort_one(entry[2], plan)

    def _abort_one(self, seq, plan: RefPlan | None = None) -> None:
        """Abort ``seq`` now, wherever it is (:meth:`abort_due`)."""
        if seq.status == "waiting":
            if self.running_timeout_ms and not seq.drained and run_limit.waits_on(seq):
                return  # (the scheduler's limit, not its client: aborted once it is admitted again)
            if self.ahead is not None and seq in self.ahead.deferred:  # (not seen by a plan yet)
                self.ahead.deferred.remove(seq)
            elif self.holds is None or not self.holds.drop(seq):
                self.waiting.remove(seq)
            seq.waiting_ms += self.now - seq.waiting_since
        elif seq.status == "swapped":
            if not hasattr(self.kv, "free_swapped"):
                raise SimulationError(f"reference engine: request {seq.request.id} aborted while swapped out; "
                                      f"{type(self.kv).__name__} has no free_swapped(seq)")
            self.swapped.remove(seq)
            self.kv.free_swapped(seq)
        elif seq.status == "decoding" and self.to_finish is not None and plan is None:
            if self.ahead is None or seq not in self.ahead.ghosts:  # (a ghost leaves after the plan)
                self.to_finish.add(seq)  # (it leaves after its next iteration: _execute)
            return
        elif seq.status in ("prefilling", "decoding"):
            pending = 0  # the slots the plan made ahead took for it
            if plan is not None and plan.is_scheduled(seq):
                if seq.status == "decoding":
                    plan.overshoots.append(seq)
                    drafts, pending = plan.drafts.pop(seq) if seq in plan.drafts else (0, 1)
                    if drafts:
                        plan.overshoot_drafts[seq] = drafts
                else:
                    pending = next(n for s, n in plan.prefills if s is seq)
            # (SGLang drops an aborted chunked prefill's blocks uncached: KVCache.discard)
            self._drop_aborted(seq, self.now, pending,
                               discard=seq.status == "prefilling" and self.to_finish is not None)
            return
        elif seq.status == "in_flight":  # its batch is in the pipeline and will land without it
            del self.running[seq]
            pending = self.in_flight.pop(seq, 0)  # a decode's slots in that batch go too
            seq.reserved_tokens = max(seq.reserved_tokens, seq.num_computed_tokens + pending)
            # (vLLM cached the tokens it knew: a decode's input token, not its drafts' slots)
            if self.stagger is not None and seq in self.holds.flying:
                seq.num_computed_tokens = Stagger.cached(seq, seq.num_computed_tokens,
                                                         getattr(self.kv, "hash_lookahead", 0))
            else:
                seq.num_computed_tokens = cached_tokens_at_preemption(
                    seq.num_computed_tokens, pending, pending > 0, False, 0, tokens=seq.num_tokens,
                    hash_lookahead=getattr(self.kv, "hash_lookahead", 0))
            self.kv.free(seq)
        elif self.role is not None and self.role.abort(self, seq):
            seq.status = "aborted"  # its KV was on its way here; the scheduler never held it
            self.rec.request_done(seq, self.index, self.now, aborted=True)
            return
        else:  # finished before its client gave up
            return
        self._record_aborted(seq, self.now)

    def _in_step_aborts(self, decoders: list, plan: RefPlan, end: float) -> list:
        """The requests this iteration computes whose client's abort reaches the engine while it
        runs, strictly between ``now`` and ``end``: vLLM aborts them after the step, before its
        output (the fast engine's ``_in_step_aborts``); on a decode instance too, not pipelined (a
        pipeline's rule: :mod:`schedlab.engine.stages`) nor on a prefill instance (a prompt's last
        step: its hand-off). Planning ahead, only those it would give a token (the plan made
        ahead holds the rest as they are); their aborts stay for the plan (:meth:`_plan`)."""
        if not (self.aborts and (self.role is None or self.role.drops_output_in_step) and self.in_flight is None):
            return []
        loop_top = self._loop_top_aborts()  # (SGLang's overlap loop: those read when it started)
        if not (self.aborts_drop_output or loop_top):
            return []
        if self.ahead is None:
            computed = set(decoders) | {s for s, _ in plan.prefills}
        else:
            computed = set(decoders) | {s for s, n in plan.prefills if s.num_computed_tokens + n == s.num_tokens}
        if self.to_finish:  # (aborted already: its client and the scheduler's time limit, engine.run_limit)
            computed -= self.to_finish
        # (not one aborted already, after the plan made ahead: a second entry of a request -- its
        # client's and a drain timeout's, engine.drain -- finds it gone, as the fast engine's does)
        hit = sorted((a for a in self.aborts if (a[0] <= self.now if loop_top else self.now < a[0] < end)
                      and a[2] in computed and a[2].status != "aborted"), key=lambda a: (a[0], a[1]))
        if self.ahead is None:
            for entry in hit:
                self.aborts.remove(entry)
        # (once each: its client's abort and the scheduler's time limit may both have come, engine.run_limit)
        return list(dict.fromkeys(a[2] for a in hit))

    def _drop_aborted(self, seq, t: float, pending: int = 0, *, discard: bool = False) -> None:
        """``seq``, running, aborted at ``t``: its slot and blocks freed -- with the ``pending``
        slots a plan made ahead took for it; ``discard``: uncached, ``KVCache.discard`` --, its
        row written."""
        del self.running[seq]
        release = getattr(self.kv, "discard", None) if discard else None
        if release is not None:
            seq.reserved_tokens = max(seq.reserved_tokens, seq.num_computed_tokens + pending)
            release(seq)
        elif self.ahead is None:
            self.kv.free(seq)
        else:  # as at a preemption (RefPlan._requeue): vLLM has cached only the tokens it knew
            computed = seq.num_computed_tokens
            decoding = seq.status == "decoding"
            seq.num_computed_tokens = cached_tokens_at_preemption(computed, pending, decoding and pending > 0,
                                                                  seq in self.ahead.fresh, seq.cache_lag,
                                                                  self.ahead.kept.get(seq, 0), tokens=seq.num_tokens,
                                                                  hash_lookahead=getattr(self.kv, "hash_lookahead", 0))
            seq.reserved_tokens = max(seq.reserved_tokens, computed + pending)
            self.kv.free(seq)
            seq.num_computed_tokens = computed  # (a plan made ahead may still compute it, for nothing)
        self._record_aborted(seq, t)

    def reject_waiting(self, seq, reason: str) -> None:
        """Turn the waiting ``seq`` away now (``Plan.reject``): its row, with the gaps between the
        tokens it got, and its client's callback."""
        self.waiting.remove(seq)
        seq.waiting_ms += self.now - seq.waiting_since
        seq.status = "rejected"
        if seq.request.timeout_ms is not None or seq.server_abort:  # (its aborts will find it gone)
            self.aborts = [a for a in self.aborts if a[2] is not seq]
        for a, b in zip(seq.token_times, seq.token_times[1:]):
            self.rec.itl(b - a)
        self.rec.reject(seq, self.index, reason, at=self.now)
        if self.on_request_done is not None:
            self.on_request_done(seq.request, self.now)

    def _record_aborted(self, seq, t: float) -> None:
        """``seq`` aborted at ``t`` (out of the queues, its KV freed): its row and the callbacks."""
        seq.status = "aborted"
        self.ended += 1
        self.empty_plans = 0
        if seq.transfer is not None:  # a prefill instance's: its row shows the client's request
            seq.request = seq.transfer.request
        for a, b in zip(seq.token_times, seq.token_times[1:]):
            self.rec.itl(b - a)
        if seq.server_abort and not seq.drained:  # the scheduler's running time limit: turned away, its client answered
            self.rec.reject(seq, self.index, self.running_timeout_reason, at=t)
        else:
            if seq.drained:  # (a drain timeout's: engine.drain)
                self.drain_aborted += 1
            self.rec.request_done(seq, self.index, t, aborted=True)
        on_finish = getattr(self.scheduler, "on_finish", None)
        if on_finish is not None:
            on_finish(seq, t)
        if seq.server_abort and self.on_request_done is not None:
            self.on_request_done(seq.request, t)

    def plan_batch(self, plan: RefPlan) -> tuple[Batch, list, list]:
        """The shape of the iteration ``plan`` describes, its decoders and their drafts."""
        decoders = plan.decoders()
        drafts = [plan.drafts[s][0] if self.spec is not None else 0 for s in decoders]
        contexts = [s.num_computed_tokens + 1 + d for s, d in zip(decoders, drafts)]
        overshoot_drafts = [plan.overshoot_drafts.get(s, 0) for s in plan.overshoots]
        # (decodes whose token is discarded)
        contexts += [s.num_computed_tokens + 1 + d for s, d in zip(plan.overshoots, overshoot_drafts)]
        batch = Batch(
            num_decode=len(contexts),
            decode_context_tokens=sum(contexts),
            num_prefill=len(plan.prefills),
            prefill_tokens=sum(n for _, n in plan.prefills) + sum(plan.padded.values()),  # (padding: Plan.admit)
            prefill_context_tokens=sum(s.num_computed_tokens for s, _ in plan.prefills),
            spec_tokens=sum(drafts) + sum(overshoot_drafts),
        )
        if contexts and getattr(self.cost, "needs_context_range", False):
            batch.decode_context_max, batch.decode_context_min = max(contexts), min(contexts)
        return batch, decoders, drafts

    def finish_done(self, s, t: float) -> None:
        """Finished ``s`` (its blocks free) at ``t``: its inter-token latencies and row, the
        scheduler's and the clients' callbacks."""
        self.record_finished(s, t)
        self.finish_callbacks(s, t)

    def record_finished(self, s, t: float) -> None:
        """The inter-token latencies and row of ``s``, finished at ``t``."""
        for a, b in zip(s.token_times, s.token_times[1:]):
            self.rec.itl(b - a)
        self.rec.request_done(s, self.index, t)

    def finish_callbacks(self, s, t: float) -> None:
        """The scheduler's and the clients' callbacks of the finish of ``s`` at ``t``."""
        self.ended += 1
        on_finish = getattr(self.scheduler, "on_finish", None)
        if on_finish is not None:
            on_finish(s, t)
        if self.on_request_done is not None:
            self.on_request_done(s.request, t)

    def _execute(self, plan: RefPlan) -> None:
        counters = self.counters
        high_water = self.rec.kv_high_water * self.kv.num_blocks
        batch, decoders, drafts = self.plan_batch(plan)
        # drafts per batch size: the requests this step samples for, finishing ones too (a plan made
        # ahead may decode one once more), get the drafts proposed after it (a pipeline's: at its launch)
        sampled = ([*decoders, *(s for s, n in plan.prefills if s.num_computed_tokens + n == s.num_tokens)]
                   if self.spec is not None and self.spec.per_request and self.in_flight is None else None)
        computes = batch.num_decode or plan.prefills
        duration = check_iteration_ms(self.cost.iteration_ms(batch), batch) if computes else 0.0
        duration += plan.transfer_ms
        check_iteration_end(self.now, duration, batch)
        end = self.now + duration
        used = self.kv.num_used_blocks() + self.held_to_landing
        counters["iterations"] += 1
        counters["busy_ms"] += duration
        counters["busy_until_ms"] = max(counters["busy_until_ms"], end)
        self.busy_ms += duration
        self.iterations += 1
        counters["running_seq_ms"] += len(self.running) * duration
        counters["peak_running"] = max(counters["peak_running"], len(self.running))
        counters["prefill_iteration_ms" if plan.prefills else "decode_only_ms"] += duration
        counters["kv_block_ms"] += used * duration
        self.kv_block_ms += used * duration
        if used > high_water:
            counters["kv_above_ms"] += duration
        counters["kv_peak_blocks"] = max(counters["kv_peak_blocks"], used)
        self.kv_peak = max(self.kv_peak, used)
        energy = row_j = math.nan
        if self.meter is not None:  # every token of the iteration takes the same share of its energy
            energy = self.meter.iteration(self.now, batch, duration)
            row_j = self.meter.row_j(energy)
            per_decoder, per_token = token_shares(energy, batch, sum(n for _, n in plan.dropped))
            for s in decoders:
                s.energy_j += per_decoder
            if plan.overshoots:  # (their rows are written already: no request shares them)
                self.meter.discarded_j += per_decoder * len(plan.overshoots)
            padded = plan.padded
            for i, (s, n) in enumerate(plan.prefills + plan.dropped):  # dropped: preempted or aborted since
                if padded and i < len(plan.prefills):  # (an admission's placeholder drafts are its own work)
                    n += padded.get(s, 0)
                if s.status == "aborted":  # (aborted after a plan made ahead: its row is written)
                    self.meter.discarded_j += per_token * n
                else:
                    s.energy_j += per_token * n
        self.rec.sample(self.now, self.index, len(self.running), len(self.waiting), used, duration, 1, batch, row_j)

        progress = False
        decoded_out = []  # finishing decoders and prompts: they finish in their order in the running
        done = []         # list, as vLLM frees them in its output's order (the fast engine's too)
        ghosts = self._in_step_aborts(decoders, plan, end)
        finishing = []  # waiting to run once more after their abort (to_finish): this is it
        if self.to_finish:
            computed = set(decoders) | {s for s, n in plan.prefills if s.num_computed_tokens + n == s.num_tokens}
            finishing = [s for s in self.running if s in self.to_finish and s in computed]
            self.to_finish.difference_update(finishing)
            ghosts = ghosts + finishing
        # planning ahead with drafts: what the next plan, made before this step's output is seen,
        # counts as computed that this step did not compute (engine.ahead)
        phantom = {} if self.drafts_ahead else None
        kept = {} if phantom is not None else None
        for s, d in zip(decoders, drafts):
            if s in ghosts:  # aborted while this step runs: computed (its KV written), its output dropped
                if phantom is not None and d:
                    phantom[s] = d
                if self.spec is not None:  # (the slots its drafts and lookahead took: freed with it)
                    s.reserved_tokens = max(s.reserved_tokens, s.num_computed_tokens + plan.drafts[s][1])
                s.num_computed_tokens += 1
                counters["decode_tokens"] += 1
                counters["decode_seq_steps"] += 1
                continue
            # Speculation: the drafts accepted up to the first rejected one, plus the target's
            # own token, but no more than the request still has to generate -- nor, answered a
            # segment at a time (TGI's generation_segment), past the segment's end: TGI keeps the
            # tokens up to its stopping criterion and drops the rest (flash_causal_lm.generate_token).
            # A decode that samples its request's first token (a decode instance's,
            # engine.transfer) verifies placeholders.
            first = not s.num_generated
            accepted = self.spec.accepted(s, s.num_generated, d) if d and not first else 0
            tokens = min(1 + accepted, s.request.target_tokens - s.num_generated)
            if self.answer_segment:
                tokens = min(tokens, self.answer_segment - s.num_generated % self.answer_segment)
            if d:
                counters["spec_drafts"] += 1
                counters["spec_draft_tokens"] += d
                counters["spec_accepted_tokens"] += accepted
            s.num_computed_tokens += tokens
            s.max_computed = max(s.max_computed, s.num_computed_tokens)
            s.num_generated += tokens
            s.token_times.append(end)  # one ITL sample per step, however many tokens it gave
            counters["decode_tokens"] += tokens
            counters["generated_tokens"] += tokens
            counters["decode_seq_steps"] += 1
            progress = True
            if self.spec is not None:  # the step's slots stay with the request (vLLM keeps its blocks)
                s.reserved_tokens = max(s.reserved_tokens, s.num_computed_tokens - tokens + plan.drafts[s][1])
            if phantom is not None:
                if d > tokens - 1:
                    phantom[s] = d - (tokens - 1)
                if tokens > 1:
                    kept[s] = tokens - 1
            if first and self.role is not None:  # (its last prompt token's reservation: DecodeRole.first_token)
                self.role.first_token(self, s)
            if s.num_generated >= s.request.target_tokens:
                decoded_out.append(s)
        if decoders or plan.overshoots:
            self.decode_steps += 1
        counters["discarded_tokens"] += len(plan.overshoots)
        for s, n in plan.prefills:
            if s in ghosts or s.status == "aborted":  # (aborted after a plan made ahead: computed for nothing)
                s.num_computed_tokens += n
                counters["prefill_tokens"] += n
                if s in ghosts and self.ahead is not None and s.num_computed_tokens == s.num_tokens:
                    s.status = "decoding"  # (planned ahead, its first decode: see below)
                continue
            before = s.num_computed_tokens
            redo = max(0, min(before + n, s.max_computed) - before)
            s.recomputed_tokens += redo
            counters["recomputed_tokens"] += redo
            s.num_computed_tokens += n
            if s.num_computed_tokens > s.max_computed:
                s.max_computed = s.num_computed_tokens
                progress = True
            s.prefill_chunks += 1
            counters["prefill_tokens"] += n
            if s.num_computed_tokens == s.num_tokens:
                s.num_generated += 1
                s.token_times.append(end)
                counters["generated_tokens"] += 1
                progress = True
                if s.num_generated >= s.request.target_tokens:
                    done.append(s)
                else:
                    s.status = "decoding"
        before = load(self)  # as routers see the instance until ``end``
        if len(done) + len(decoded_out) > 1:
            position = {s: i for i, s in enumerate(self.running)}
            done = sorted(done + decoded_out, key=position.__getitem__)
        else:
            done = done + decoded_out
        for s in done:
            s.status = "finished"
            if self.ahead is not None:  # its slot and blocks until the next plan is made (engine.ahead)
                self.ahead.held[s] = None
                self.finish_callbacks(s, end)  # its row once released: that plan may still preempt it
                continue
            del self.running[s]
            if self.role is not None and self.role.hand_off(self, s, end):
                continue  # on to the decode pool; its KV (and its finish) stays until pulled
            self.kv.free(s)
            self.finish_done(s, end)
        for s in ghosts:
            if self.ahead is None:
                self._drop_aborted(s, end)
            elif s.num_generated + 1 >= s.request.target_tokens:
                s.status = "finished"  # the token dropped was its last: held like a finished one
                s.num_generated += 1  # (as the plan sees it: the token in flight counts; never sent)
                self.ahead.doom(s)
            else:  # decoding, its token dropped; the plan made ahead schedules it all the same
                self.ahead.ghosts.add(s)
        if phantom is not None:
            phantom.update((s, n) for s, n in plan.padded.items() if s.status != "aborted")  # (all rejected)
            self.ahead.phantom, self.ahead.kept = phantom, kept
        self.release.record(end, before, load(self))
        if self.spec is not None and batch.num_seqs:
            self.spec_k = self.spec.k_for(batch.num_seqs)  # the drafts proposed after this step
            if sampled:
                self.spec.propose(sampled, batch.num_seqs)
        if self.ahead is not None:
            self.ahead.start, self.ahead.end = self.now, end
            self.ahead.fresh = {s for s in decoders if s.status == "decoding"} | {
                s for s, _ in plan.prefills if s.status == "decoding"}
        self.now = end
        self.no_progress = 0 if progress else self.no_progress + 1
        if self.no_progress > self.stall_limit:
            raise StallError("reference engine: " + stall_message(self, f"{self.no_progress} iterations without a "
                                                                    "new token"))
