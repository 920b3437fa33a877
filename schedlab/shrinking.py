"""Greedy delta debugging: shrink a failing input while a predicate still holds.

Shared by the differential harnesses against vLLM and SGLang (:mod:`schedlab.diffcheck.shrink`) and
``schedlab hunt`` (:mod:`schedlab.hunt.shrink`). The caller describes its input's simplifications as *passes*:
functions ``state -> iterator of candidates`` (a candidate of None is skipped: it could not be
built). :func:`greedy_shrink` tries the passes in order and takes the first candidate that
is still interesting, then starts again from the first pass, until no pass finds one or the
evaluation budget is spent (Zeller and Hildebrandt's ddmin, generalised as Hypothesis's
shrinker does: the cheap, big steps -- dropping inputs -- come first).

Candidates may be evaluated several at a time (``width``: the next ``width`` candidates of a
pass at once, e.g. on worker processes). The one taken is still the first interesting one
in pass order, and only evaluations up to it are charged to the budget, so the result does
not depend on ``width``.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")


class Budget:
    """Counts predicate evaluations; :meth:`left` is False once ``limit`` is spent."""

    def __init__(self, interesting: Callable[[T], bool], limit: int):
        self._interesting = interesting
        self.limit = limit
        self.used = 0

    def left(self) -> bool:
        return self.used < self.limit

    def __call__(self, candidate) -> bool:
        self.used += 1
        return self._interesting(candidate)


def removals(items: Sequence[T]) -> Iterator[list[T]]:
    """``items`` without a chunk: halves first, then quarters, ... then single items (ddmin's
    complements); never the empty list."""
    items = list(items)
    n = len(items)
    size = n // 2
    while size >= 1:
        for start in range(0, n, size):
            rest = items[:start] + items[start + size:]
            if rest:
                yield rest
        size //= 2


def lower_values(value: int, low: int) -> list[int]:
    """Smaller whole numbers to try instead of ``value``, most aggressive first: ``low``, then
    ``value`` less a half, a quarter, ... of the distance to ``low``, down to ``value - 1``.
    Taking the first that still works and asking again reaches the smallest working value in
    O(log^2) tries when working values form a range up from some threshold."""
    out: list[int] = []
    if value <= low:
        return out
    out.append(low)
    step = (value - low) // 2
    while step >= 1:
        target = value - step
        if target not in out:
            out.append(target)
        step //= 2
    if value - 1 not in out:
        out.append(value - 1)
    return out


def greedy_shrink(start: T, interesting: Callable[[T], bool], passes: Iterable[Callable[[T], Iterator[T | None]]],
                  *, max_evaluations: int, width: int = 1,
                  interesting_many: Callable[[list[T]], list[bool]] | None = None) -> tuple[T, int]:
    """The smallest state reached from ``start`` (which must be interesting) and the evaluations spent.

    :param passes: simplifications, tried in order; each maps a state to candidate states.
    :param width: evaluate up to this many candidates of a pass at once (``interesting_many``).
    :param interesting_many: evaluates a list of candidates at once (default: one by one).
    """
    passes = list(passes)
    check = Budget(interesting, max_evaluations)
    many = interesting_many or (lambda batch: [interesting(c) for c in batch])
    current = start
    changed = True
    while changed and check.left():
        changed = False
        for make in passes:
            found = _first_interesting(make(current), check, many, max(1, width))
            if found is not None:
                current, changed = found, True
                break
            if not check.left():
                break
    return current, check.used


def _first_interesting(candidates: Iterator, check: Budget, many, width: int):
    batch: list = []
    for candidate in candidates:
        if candidate is None:
            continue
        batch.append(candidate)
        if len(batch) >= min(width, check.limit - check.used):
            found = _take(batch, check, many)
            if found is not None or not check.left():
                return found
            batch = []
    return _take(batch, check, many) if batch and check.left() else None


def _take(batch: list, check: Budget, many):
    """The first interesting candidate of ``batch`` (charging evaluations up to it), or None."""
    if len(batch) == 1:
        return batch[0] if check(batch[0]) else None
    verdicts = many(batch)
    for candidate, verdict in zip(batch, verdicts):
        check.used += 1
        if verdict:
            return candidate
    return None
