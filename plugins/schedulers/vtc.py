"""Token-fair scheduling: the Virtual Token Counter (VTC) of Sheng et al., "Fairness in
Serving Large Language Models" (OSDI'24, Algorithm 2; artifact ``Ying1123/VTC-artifact``,
``slora/server/router/vtc_req_queue.py``).

Every client has a counter of the service it has received: ``input_price`` per prompt
token, charged when a request is admitted, plus ``output_price`` per generated token
(defaults 1 and 2, the paper's). Admission takes the oldest waiting request of the
backlogged client (one with a request waiting) whose counter is smallest; if that request
does not fit -- slots, token budget, KV cache -- nothing else is admitted in that iteration
(the paper's ``break``: letting a smaller request of another client pass would void the
fairness bound). A client that becomes backlogged has its counter lifted to the smallest
counter of the other backlogged clients or, when none is backlogged, to the counter of the
client that last left the queue (``lift_when_queue_empty = "last_left"``, the paper's
Algorithm 2 as read here; the artifact's queue lifts only when another client is
backlogged: ``"none"``), so idle time earns no credit. Then two continuously backlogged clients' counters stay within a bounded distance
of each other, and so does the service they receive (see ``tests/test_policies.py``).

Everything else -- budget, ``max_num_seqs``, KV allocation, preemption (the newest running
sequence, as vLLM's FCFS), the batching window -- is the ``continuous`` scheduler's. A
preempted request goes back to the front of its client's queue; it is not charged again
when it is readmitted, and its client's counter is not lifted.

Exact and fast. The fast engine runs many decode iterations without asking the scheduler,
so output tokens are charged lazily: a counter is ``settled`` (lifts, input charges and the
output of finished sequences, added by ``on_finish``) plus ``output_price`` times the
tokens the client's unfinished sequences have generated so far, read from them whenever a
counter is needed. Between events those counters move, so the smallest one can change: if
the client first in line is blocked while another client's head would fit, the ranking may
turn within a decode run and admit it. Only then does the scheduler ask to be called at the
next iteration (``plan.wake_at(now)``); otherwise the decision cannot change before the next
event (resources only shrink during a decode run), and the run is advanced in one step.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

import attrs

from schedlab.configs import float_field, str_field
from schedlab.errors import ConfigError

from .continuous import ContinuousConfig, ContinuousScheduler


class ServiceLedger:
    """Each client's virtual token counter."""

    def __init__(self, input_price: float = 1.0, output_price: float = 2.0):
        self.input_price = input_price
        self.output_price = output_price
        self._settled: dict[str, float] = {}
        self._serving: dict[str, dict] = {}  # client -> its admitted, unfinished sequences (in admission order)

    def counter(self, client: str) -> float:
        """The client's counter now: settled service plus its unfinished sequences' output so far."""
        serving = self._serving.get(client)
        generated = sum(s.num_generated for s in serving) if serving else 0
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
        """Settle a finished sequence's output. A sequence that joined from a disaggregated
        prefill pool was never admitted here; its output is charged all the same."""
        client = seq.request.client
        self._serving.get(client, {}).pop(seq, None)
        self._settled[client] = self._settled.get(client, 0.0) + self.output_price * seq.num_generated

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
    backlogged client with the smallest counter (ties: the older head request).

    The engine calls ``push`` on arrival (lifting an idle client's counter), ``push_front``
    for a preempted sequence and ``remove`` on admission (charging the prompt)."""

    def __init__(self, ledger: ServiceLedger, lift_last_left: bool = True):
        self._ledger = ledger
        self._lift_last_left = lift_last_left
        self._backlog: dict[str, deque] = {}  # only clients with waiting requests
        self._size = 0
        self._last_left: str | None = None

    def push(self, seq) -> None:
        client = seq.request.client
        queue = self._backlog.get(client)
        if queue is None:
            self._lift(client)
            queue = self._backlog[client] = deque()
        queue.append(seq)
        self._size += 1

    def push_front(self, seq) -> None:
        client = seq.request.client
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
        best = best_key = None
        for client, queue in self._backlog.items():
            key = (counter(client), queue[0].seq_no)
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
        self._ledger.admitted(seq)
        if not queue:
            del self._backlog[client]
            self._last_left = client

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return bool(self._size)

    def __iter__(self) -> Iterator:
        """Clients by their counter now, each client's requests oldest first."""
        counter = self._ledger.counter
        order = sorted(self._backlog.items(), key=lambda item: (counter(item[0]), item[1][0].seq_no))
        return (seq for _, queue in order for seq in queue)


@attrs.frozen
class VtcConfig(ContinuousConfig):
    policy: str = str_field("fcfs", choices=("fcfs",),
                            help="order within a client (VTC chooses the client by its counter)")
    input_price: float = float_field(1.0, min=0.0, help="counter charge per prompt token, at admission (VTC: 1)")
    output_price: float = float_field(2.0, min=0.0, help="counter charge per generated token (VTC: 2)")
    lift_when_queue_empty: str = str_field(
        "last_left", choices=("last_left", "none"),
        help="a client arriving when no other waits is lifted to the counter of the last client to leave the "
             "queue (the paper's Algorithm 2), or not at all (the artifact's vtc_req_queue.py)")

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
