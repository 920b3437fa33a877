"""Waiting-queue orders shared by schedulers, and the read-only view of running sequences."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Callable, Iterator


class FcfsQueue:
    """First come, first served; preempted sequences go back to the front (vLLM)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: deque = deque()

    def push(self, seq) -> None:
        self._items.append(seq)

    def push_front(self, seq) -> None:
        self._items.appendleft(seq)

    def peek(self):
        return self._items[0] if self._items else None

    def remove(self, seq) -> None:
        items = self._items
        if items and items[0] is seq:
            items.popleft()
        else:
            items.remove(seq)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator:
        return iter(self._items)


class KeyedQueue:
    """Served in increasing ``key(seq)`` order (ties by arrival order); a min-heap with lazy removal.

    ``push_front`` is the same as ``push``: the key alone decides the order (vLLM's priority
    queue does the same with preempted requests).
    """

    __slots__ = ("_heap", "_key", "_live", "_pushes")

    def __init__(self, key: Callable[[Any], Any]):
        self._heap: list = []
        self._key = key
        self._live: dict[int, int] = {}  # seq_no -> push number of its live heap entry
        self._pushes = 0

    def push(self, seq) -> None:
        self._pushes += 1
        self._live[seq.seq_no] = self._pushes
        heapq.heappush(self._heap, (self._key(seq), seq.seq_no, self._pushes, seq))

    push_front = push

    def _clean(self) -> None:
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][1]) != heap[0][2]:
            heapq.heappop(heap)

    def peek(self):
        self._clean()
        return self._heap[0][3] if self._heap else None

    def remove(self, seq) -> None:
        del self._live[seq.seq_no]
        self._clean()

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __iter__(self) -> Iterator:
        live = self._live
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]) if live.get(e[1]) == e[2])


class RunningView:
    """Running sequences in admission order; read-only for schedulers."""

    __slots__ = ("_running",)

    def __init__(self, running: dict):
        self._running = running

    def __iter__(self) -> Iterator:
        return iter(self._running)

    def __reversed__(self) -> Iterator:
        return reversed(self._running)

    def __len__(self) -> int:
        return len(self._running)

    def __bool__(self) -> bool:
        return bool(self._running)

    def __contains__(self, seq: object) -> bool:
        return seq in self._running

    def last(self):
        """The most recently admitted running sequence (vLLM's FCFS preemption victim)."""
        return next(reversed(self._running)) if self._running else None

    def holding(self) -> list:
        """Every sequence holding a running slot, in admission order: all of them here; under
        asynchronous scheduling also those finished by the batch in progress, which keep their
        slots and blocks until the plan is made (:class:`schedlab.engine.ahead.AheadRunning`)."""
        return list(self._running)

    def preemptible(self) -> list:
        """The running sequences a preemption may pick, in admission order: all of them here;
        a pipelined instance's view adds those in a batch in flight, which iterating skips
        (:class:`schedlab.engine.stages.VisibleRunning`)."""
        return list(self._running)
