"""Token-fair scheduling: the Virtual Token Counter (VTC) of Sheng et al., "Fairness in
Serving Large Language Models" (OSDI'24; arXiv 2401.00588, Algorithm 2) as its code runs it.
Where the paper and the code differ, schedlab follows the code: ``VTCReqQueue`` in
``slora/server/router/vtc_req_queue.py`` and the router loop ``slora/server/router/manager.py``
of ``S-LoRA/S-LoRA`` at c1ddf488 (2024-01-04; the queue last changed in 18895fa8). The paper's
artifact ``Ying1123/VTC-artifact`` at 15d4aa16 (2024-04-25, "Clean up for artifact eval") has the
same queue file and the same loop. The differences, and what ``vtc`` does:

* Counters. Every client has a counter of the service it has received: ``input_price`` per
  prompt token, charged when a request is admitted (``generate_new_batch``), plus
  ``output_price`` per *decode step* of each of its running requests (``update_counter``,
  called by ``_decode_batch`` only; defaults 1 and 2, the paper's). The prefill that makes a
  request's first output token charges nothing, so a request of P prompt and N output tokens
  costs ``input_price * P + output_price * (N - 1)``. The paper's cost function counts every
  output token (``w_p * n_p + w_q * n_q``); the run's ``per_client`` ``service`` metric is that
  cost, the counters are the code's. A token made by the recompute of a preempted sequence is
  charged (it is not the request's first; the code never preempts). The artifact's later
  revision (192c2e20, 2024-06, for its length-prediction variants) also calls
  ``update_counter`` from ``_handle_finish_req``, charging every request of a batch once more
  whenever one of them finishes; that is not modelled.
* Order. Admission takes the oldest waiting request of the backlogged client (one with a
  request waiting) whose counter is smallest; on equal counters, of the client seen first
  (the code's ``min(active_served, key=active_served.get)`` over a copy of ``served``, a dict
  whose keys are inserted when a client's first request arrives, so ``min`` returns the
  earliest-arrived client among the tied). If that request does not fit -- slots, token
  budget, KV cache -- nothing else is admitted in that iteration (the code's ``break``:
  letting a smaller request of another client pass would void the fairness bound).
* Lift. A client whose queue goes from empty to non-empty has its counter lifted to the
  smallest counter of the other backlogged clients, if that is higher (paper and code), so
  idle time earns no credit against them. When no other client is backlogged, the paper's
  Algorithm 2 lifts it to the counter of the client that last left the queue; the code's
  ``append`` leaves it as it is (a new client starts at 0). ``lift_when_queue_empty`` chooses:
  ``"none"`` (the default, the code) or ``"last_left"`` (the paper). With ``"none"`` a client
  that returns to an empty queue keeps the credit of its idle time against clients that come
  back after it. Two clients backlogged together keep counters within a bounded distance of
  each other, and so the service they receive (see ``tests/test_policies.py``).

Everything else -- budget, ``max_num_seqs``, KV allocation, preemption (the newest running
sequence, as vLLM's FCFS), the batching window -- is the ``continuous`` scheduler's, which
differs from the code in two ways that are not modelled:

* KV admission. The code admits a request only if its estimate of the peak KV use of the
  running requests and the new ones, each run to its ``max_output_len``, stays below
  ``max_total_tokens`` less the LoRA adapters' memory (``_can_add_new_req``: entries (tokens
  held, output tokens left), a new request's ``(prompt + 1, max_output_len - 1)``, sorted by
  tokens left descending; the peak is ``max_k (left_k * k + held_1 + ... + held_k)``), and
  while at most ``running_max_req_size`` requests run. Requests that end at different times
  share memory there; ``allocation = "reserve"`` (the default) holds ``prompt + max_tokens``
  for every request at once (their sum), ``"grow"`` allocates blocks as tokens are computed
  and may preempt, which the code never does.
* Batching. The code's router (``_step``) runs prefill-only batches: a new batch forms when
  nothing runs, and otherwise is tried only after ``max_wait_tokens = 10`` decode steps since
  the last one formed (then at every step until one forms; that step decodes nothing), its
  prompts capped by ``batch_max_tokens``; the new requests then join the running batch.
  schedlab admits in every iteration within one token budget shared with the decodes (vLLM's
  rules; ``prefill_first`` skips the decodes of an iteration that admits).

A preempted request goes back to the front of its client's queue; it is not charged again
for its prompt when it is readmitted, and its client's counter is not lifted.

Exact and fast. The fast engine runs many decode iterations without asking the scheduler,
so output tokens are charged lazily: a counter is ``settled`` (lifts, input charges and the
output of finished sequences, added by ``on_finish``) plus ``output_price`` times the
tokens the client's unfinished sequences have generated beyond their first, read from them
whenever a counter is needed. Between events those counters move, so the smallest one can
change: if the client first in line is blocked while another client's head would fit, the
ranking may turn within a decode run and admit it. Only then does the scheduler ask to be
called at the next iteration (``plan.wake_at(now)``); otherwise the decision cannot change
before the next event (resources only shrink during a decode run), and the run is advanced
in one step.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

import attrs

from schedlab.configs import float_field, str_field
from schedlab.errors import ConfigError

from .continuous import ContinuousConfig, ContinuousScheduler


def charged_outputs(seq) -> int:
    """The output tokens of ``seq`` its client is charged for: every one but the first, which its
    prefill made (VTC's code charges decode steps only)."""
    return max(seq.num_generated - 1, 0)


class ServiceLedger:
    """Each client's virtual token counter."""

    def __init__(self, input_price: float = 1.0, output_price: float = 2.0):
        self.input_price = input_price
        self.output_price = output_price
        self._settled: dict[str, float] = {}
        self._serving: dict[str, dict] = {}  # client -> its admitted, unfinished sequences (in admission order)

    def counter(self, client: str) -> float:
        """The client's counter now: settled service plus its unfinished sequences' output so far
        (each one's tokens beyond its first)."""
        serving = self._serving.get(client)
        generated = sum(charged_outputs(s) for s in serving) if serving else 0
        return self._settled.get(client, 0.0) + self.output_price * generated

    def decoding(self, client: str) -> int:
        """The client's sequences that each add one output token per decode iteration."""
        serving = self._serving.get(client)
        return sum(1 for s in serving if s.status == "decoding") if serving else 0

    def admitted(self, seq) -> None:
        """Charge the prompt at the first admission (a preempted sequence's return is free)."""
        client = seq.request.client
        serving = self._serving.setdefault(client, {})
        if seq not in serving:
            serving[seq] = None
            self._settled[client] = self._settled.get(client, 0.0) + self.input_price * seq.request.prompt_tokens

    def finished(self, seq) -> None:
        """Settle a finished sequence's output (its tokens beyond the first). A sequence that
        joined from a disaggregated prefill pool was never admitted here; its output is charged
        all the same."""
        client = seq.request.client
        self._serving.get(client, {}).pop(seq, None)
        self._settled[client] = self._settled.get(client, 0.0) + self.output_price * charged_outputs(seq)

    def clients(self) -> list[str]:
        """Every client that has been charged or lifted."""
        return sorted(set(self._settled) | set(self._serving))

    def lift(self, client: str, floor: float) -> None:
        """Raise the client's counter to ``floor`` if it is below."""
        gap = floor - self.counter(client)
        if gap > 0:
            self._settled[client] = self._settled.get(client, 0.0) + gap


class ClientQueues:
    """The waiting queue: FIFO per client; :meth:`peek` is the oldest request of the
    backlogged client with the smallest counter (ties: the client seen first, as VTC's code).

    The engine calls ``push`` on arrival (lifting an idle client's counter), ``push_front``
    for a preempted sequence and ``remove`` on admission (charging the prompt)."""

    def __init__(self, ledger: ServiceLedger, lift_last_left: bool = False):
        self._ledger = ledger
        self._lift_last_left = lift_last_left
        self._backlog: dict[str, deque] = {}  # only clients with waiting requests
        self._seen: dict[str, int] = {}  # every client queued so far -> its rank, first arrival first
        self._size = 0
        self._last_left: str | None = None

    def _rank(self, client: str) -> int:
        rank = self._seen.get(client)
        if rank is None:
            rank = self._seen[client] = len(self._seen)
        return rank

    def push(self, seq) -> None:
        client = seq.request.client
        self._rank(client)
        queue = self._backlog.get(client)
        if queue is None:
            self._lift(client)
            queue = self._backlog[client] = deque()
        queue.append(seq)
        self._size += 1

    def push_front(self, seq) -> None:
        client = seq.request.client
        self._rank(client)  # (a sequence from a disaggregated prefill pool was never pushed)
        queue = self._backlog.get(client)
        if queue is None:
            queue = self._backlog[client] = deque()
        queue.appendleft(seq)
        self._size += 1

    def _lift(self, client: str) -> None:
        ledger = self._ledger
        if self._backlog:
            ledger.lift(client, min(ledger.counter(c) for c in self._backlog))
        elif self._lift_last_left and self._last_left is not None and self._last_left != client:
            ledger.lift(client, ledger.counter(self._last_left))

    @property
    def num_backlogged(self) -> int:
        """Clients with a waiting request."""
        return len(self._backlog)

    def heads(self) -> Iterator[tuple[str, object]]:
        """(client, its oldest waiting sequence) for every backlogged client."""
        for client, queue in self._backlog.items():
            yield client, queue[0]

    def peek(self):
        counter = self._ledger.counter
        seen = self._seen
        best = best_key = None
        for client, queue in self._backlog.items():
            key = (counter(client), seen[client])
            if best_key is None or key < best_key:
                best, best_key = queue[0], key
        return best

    def remove(self, seq) -> None:
        client = seq.request.client
        queue = self._backlog[client]
        if queue[0] is seq:
            queue.popleft()
        else:
            queue.remove(seq)
        self._size -= 1
        if not queue:
            del self._backlog[client]
            self._last_left = client

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return bool(self._size)

    def __iter__(self) -> Iterator:
        """Clients by their counter now (ties: the client seen first), each client's requests oldest first."""
        counter = self._ledger.counter
        seen = self._seen
        order = sorted(self._backlog.items(), key=lambda item: (counter(item[0]), seen[item[0]]))
        return (seq for _, queue in order for seq in queue)


@attrs.frozen
class VtcConfig(ContinuousConfig):
    policy: str = str_field("fcfs", choices=("fcfs",),
                            help="order within a client (VTC chooses the client by its counter)")
    input_price: float = float_field(1.0, min=0.0, help="counter charge per prompt token, at admission (VTC: 1)")
    output_price: float = float_field(
        2.0, min=0.0, help="counter charge per output token but a request's first, i.e. per decode step (VTC: 2)")
    lift_when_queue_empty: str = str_field(
        "none", choices=("none", "last_left"),
        help="a client arriving when no other waits keeps its counter (VTC's code, vtc_req_queue.py) or is lifted "
             "to the counter of the last client to leave the queue (the paper's Algorithm 2)")

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        if self.priority_preemption:
            raise ConfigError("priority_preemption needs policy = 'priority'; VTC orders clients by their counters")
        if not self.input_price and not self.output_price:
            raise ConfigError("input_price and output_price are both 0: every counter would stay 0")


class VtcScheduler(ContinuousScheduler):
    """Continuous batching that admits from the least-served backlogged client (VTC)."""

    def __init__(self, config: VtcConfig | None = None):
        super().__init__(config or VtcConfig())
        self.ledger = ServiceLedger(self.config.input_price, self.config.output_price)
        self._queue: ClientQueues | None = None

    def new_waiting_queue(self) -> ClientQueues:
        self.ledger = ServiceLedger(self.config.input_price, self.config.output_price)
        self._queue = ClientQueues(self.ledger, self.config.lift_when_queue_empty == "last_left")
        return self._queue

    def _admitted(self, seq) -> None:
        # the prompt is charged when the request is admitted, not whenever it leaves the queue: one
        # its client gave up on, or turned away, got no service (VTC's generate_new_batch skips
        # aborted requests uncharged)
        self.ledger.admitted(seq)

    def on_finish(self, seq, now: float) -> None:
        self.ledger.finished(seq)

    def counters(self) -> dict[str, float]:
        """Every client's counter now (for inspection)."""
        return {client: self.ledger.counter(client) for client in self.ledger.clients()}

    def schedule(self, plan) -> None:
        super().schedule(plan)
        decoding = plan.num_decoding
        if (self._queue and decoding and plan.num_scheduled_tokens == decoding and not plan.preempted
                and not plan.has_swapped and self._ranking_may_turn(plan)):
            plan.wake_at(plan.now)  # a decode-only plan: ask again after one iteration

    def _ranking_may_turn(self, plan) -> bool:
        """Could decoding alone, before the next event, make another backlogged client's head
        the first in line while it fits? Resources only shrink during a decode run, so a head
        that does not fit now will not fit before the next event either."""
        c = self.config
        queue = self._queue
        if queue.num_backlogged < 2 or len(plan.running) >= c.max_num_seqs or not self._window_open(plan):
            return False
        budget = c.max_num_batched_tokens - (0 if c.prefill_first else plan.num_decoding)
        if budget <= 0:
            return False
        ledger = self.ledger
        first = queue.peek().request.client
        rate = ledger.decoding(first)
        for client, head in queue.heads():
            # a counter growing at least as fast as the first one's never falls below it
            if client != first and ledger.decoding(client) < rate and self.could_admit(plan, head, budget):
                return True
        return False
