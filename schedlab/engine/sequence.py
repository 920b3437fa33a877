"""Engine-side state of one request, with counters that advance without being touched.

While a sequence decodes, its counters are *anchored* to the instance's decode clock (the
number of decode iterations the instance has run): ``computed = anchor + clock.steps``. A
run of k identical decode iterations then moves every decoding sequence forward by adding
k to one integer, which is what lets the fast engine's cost follow events, not tokens.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..model import Request

WAITING = "waiting"
PREFILLING = "prefilling"
DECODING = "decoding"
SWAPPED = "swapped"
FINISHED = "finished"
REJECTED = "rejected"
ABORTED = "aborted"    # its client gave up (schedlab.frontend): the engine dropped it
PARKED = "parked"  # engine-internal: a decoding sequence left out of one iteration's decode set


class DecodeClock:
    """Counts the decode iterations of one instance (shared by its sequences)."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = 0


class Sequence:
    """A request inside the fast engine. Plugins read it through the ``SequenceState`` protocol."""

    __slots__ = (
        "request", "seq_no", "status", "kv_state", "reserved_tokens", "num_preemptions",
        "_computed", "_generated", "_clock", "anchor", "gen_anchor", "finish_step",
        "target", "prompt", "max_computed", "taken_ms", "first_scheduled_ms", "first_token_ms",
        "last_token_ms", "waiting_since", "waiting_ms", "recomputed_tokens", "prefill_chunks",
        "cached_tokens_total", "plan_mark", "hit_memo", "num_swaps", "spec_state", "transfer",
        "energy_j", "energy_anchor", "cache_lag", "dec_tick", "lag_tick", "decode_due",
        "token_ready_ms", "draft_k", "run_no", "server_abort", "overdue", "drained",
    )

    def __init__(self, request: "Request", seq_no: int, clock: DecodeClock):
        self.request = request
        self.seq_no = seq_no
        self.status = WAITING
        self.kv_state: Any = None
        self.reserved_tokens = 0
        self.num_preemptions = 0
        self._computed = 0
        self._generated = 0
        self._clock = clock
        self.anchor = 0          # computed = anchor + clock.steps while decoding
        self.gen_anchor = 0      # generated = gen_anchor + clock.steps while decoding
        self.finish_step = 0     # clock.steps after the iteration that yields the last token
        self.target = request.target_tokens
        self.prompt = request.prompt_tokens
        self.max_computed = 0    # high-water mark of computed tokens (recompute accounting)
        self.taken_ms = -1.0     # the first plan at or after its arrival here (engine.taking)
        self.first_scheduled_ms = -1.0
        self.first_token_ms = -1.0
        self.last_token_ms = -1.0
        self.waiting_since = request.arrival_ms
        self.waiting_ms = 0.0
        self.recomputed_tokens = 0
        self.prefill_chunks = 0
        self.cached_tokens_total = 0
        self.plan_mark = -1      # serial of the last plan that scheduled this sequence
        self.hit_memo = (-1, 0)  # (plan serial, cached tokens) for Plan.cached_tokens
        self.num_swaps = 0
        self.spec_state = None   # speculative decoding's per-request draw state (see Speculation)
        self.transfer = None     # disaggregated serving: its :class:`~schedlab.engine.transfer.Transfer`
        self.cache_lag = 0       # asynchronous scheduling: its last KV slot's token was in flight (engine.ahead)
        self.dec_tick = 0        # ... when it last started decoding, and when cache_lag was written (ahead.Marks)
        self.lag_tick = 0
        self.decode_due = 0      # planning ahead on a pipeline: the plan that may decode it next (stages.Stagger)
        self.token_ready_ms = -math.inf  # ... and when its latest token is back from the last stage
        self.server_abort = False  # the scheduler's running time limit: its abort entry is next (engine.run_limit)
        self.overdue = False       # ... which came while it waited
        self.drained = False       # its autoscaled instance's drain timeout aborts it (engine.drain)
        self.draft_k = -1        # drafts per batch size: the drafts its next decode verifies (-1: the plan's k)
        self.run_no = 0          # its place in the running list (Instance.enter_running): finishing order
        self.energy_j = 0.0      # its shares of the energy of the iterations it took part in ([power])
        self.energy_anchor = 0.0  # the meter's per-decoder total when it last started decoding

    # -- the SequenceState protocol ------------------------------------------------------
    @property
    def num_computed_tokens(self) -> int:
        if self.status == DECODING:
            return self.anchor + self._clock.steps
        return self._computed

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        """Set the computed tokens of a sequence that is not decoding (a pipeline's prompt
        chunks, :func:`schedlab.engine.stages.launch_chunks`)."""
        if self.status == DECODING:
            raise AssertionError(f"request {self.request.id}: a decoding sequence's computed tokens follow the clock")
        self._computed = value

    @property
    def num_generated(self) -> int:
        if self.status == DECODING:
            return self.gen_anchor + self._clock.steps
        return self._generated

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.num_generated

    @property
    def arrival_ms(self) -> float:
        return self.request.arrival_ms

    # -- moves between decoding and explicit counters ----------------------------------------
    def start_decoding(self) -> None:
        """Anchor the counters to the clock (call with ``_computed``/``_generated`` current)."""
        steps = self._clock.steps
        self.anchor = self._computed - steps
        self.gen_anchor = self._generated - steps
        self.finish_step = self.target - self.gen_anchor
        self.status = DECODING

    def stop_decoding(self, status: str) -> None:
        """Freeze the anchored counters into explicit ones and leave the decoding state."""
        steps = self._clock.steps
        self._computed = self.anchor + steps
        self._generated = self.gen_anchor + steps
        self.status = status

    def __repr__(self) -> str:
        return (f"Sequence(id={self.request.id}, {self.status}, computed={self.num_computed_tokens}, "
                f"generated={self.num_generated}/{self.target})")
