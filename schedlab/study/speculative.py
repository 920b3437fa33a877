"""Searches that probe several values at once and stop with the sequential search's answer.

:func:`schedlab.study.search.search` is a decision tree: each probe's outcome (holds or fails)
decides the next value. With ``width`` workers, :class:`SpeculativeSearch` evaluates the
next ``width`` nodes of that tree breadth first -- the value the sequential search needs
now, then the two values it would need after either outcome, and so on. In the bisection
phase three probes per round thus cut the interval in four (a k-ary search with
k = width + 1 for width = 2**d - 1); in the bracketing phase they look one or two steps
ahead. The answer is read by replaying the sequential search on the known outcomes, so it is
*the same* answer, probe for probe, whatever the width and whatever order results arrive in
(even for a non-monotone constraint). Values that turn out to be off the path were wasted
work, and are left out of the outcome.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .search import SearchOutcome, max_search_probes, search


class _Unknown(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


class SpeculativeSearch:
    """The sequential search, evaluated ``width`` values at a time.

    Call :meth:`wanted` for the values to evaluate next, :meth:`record` each outcome as it
    arrives; :attr:`outcome` is set (a :class:`~schedlab.study.search.SearchOutcome` identical to
    the sequential one) once the path is complete.

    :param width: how many unknown values may be asked for at once (>= 1; 1 is sequential).
    :param search_args: the keyword arguments of :func:`schedlab.study.search.search`, except
        ``evaluate`` and ``progress``.
    :raises ConfigError: bad range (as :func:`~schedlab.study.search.search` would, before probing).
    """

    def __init__(self, width: int = 1, **search_args: Any):
        self.width = max(1, int(width))
        self.args = search_args
        self.known: dict[Any, tuple[bool, Any]] = {}
        self.max_probes = max_search_probes(low=search_args["low"], high=search_args["high"],
                                            integer=search_args.get("integer", True),
                                            tolerance=search_args.get("tolerance"))
        self.outcome: SearchOutcome | None = None
        self.path: list[Any] = []
        self._replay_known()

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def _replay(self, assumed: dict) -> tuple[SearchOutcome | None, Any, list]:
        """Run the sequential search on known and assumed outcomes: (outcome, None, path) when
        it completes, else (None, the first value it needs, the path up to it)."""
        path: list = []

        def evaluate(value):
            if value in self.known:
                path.append(value)
                return self.known[value]
            if value in assumed:
                path.append(value)
                return assumed[value], None
            raise _Unknown(value)

        try:
            return search(evaluate, **self.args), None, path
        except _Unknown as need:
            return None, need.value, path

    def _replay_known(self) -> None:
        outcome, _, path = self._replay({})
        self.path = path
        self.outcome = outcome

    def wanted(self) -> list:
        """The first ``width`` unknown values of the tree, breadth first; the first is always
        the one the sequential search needs now. Values being evaluated are among them until
        their outcome is recorded."""
        if self.done:
            return []
        order: list = []
        queue: deque[dict] = deque([{}])
        expansions = 0
        while queue and len(order) < self.width and expansions < 64 * self.width:
            assumed = queue.popleft()
            expansions += 1
            outcome, value, _ = self._replay(assumed)
            if outcome is not None:
                continue
            if value not in order:
                order.append(value)
            queue.append({**assumed, value: True})
            queue.append({**assumed, value: False})
        return order

    def record(self, value, holds: bool, payload: Any = None) -> None:
        """The outcome at ``value`` (any value asked for; duplicates are ignored)."""
        if value not in self.known:
            self.known[value] = (bool(holds), payload)
            self._replay_known()

    def on_path(self, value) -> bool:
        """True when the sequential search used (or uses next) ``value``."""
        return value in self.path
