"""Shrink the worst workload a hunt found to a small reproducer (delta debugging).

Passes, tried in order with :func:`schedlab.shrinking.greedy_shrink` (after every success it
starts again from the first):

1. drop requests -- halves, quarters, ... single requests -- down to the space's fewest;
2. merge two requests that arrive one after the other into one (their lengths added up);
3. drop a request's shared prefix, move it to the first class;
4. round arrival times -- all of them, then one by one -- to whole seconds, tenths,
   hundredths, milliseconds, and start the first at 0; evenly spaced ones to a rounder common gap;
5. lower each prompt, output and arrival towards the least its class allows.

A candidate is kept when every constraint still holds and the property still fails (or the
objective stays within ``tolerance`` of the best found). Only candidates the space could have
drawn are tried (:meth:`~.space.Space.contains`, checked on every candidate of every pass: how
many requests, their lengths and classes, prefixes and ``share``, arrivals a rate and cv of the
ranges could give), so the reproducer is a workload of the same bounds.
"""

from __future__ import annotations

import math
from typing import Iterator

import attrs

from ..shrinking import greedy_shrink, lower_values, removals
from .config import Goal
from .evaluate import Evaluator, Score
from .space import Candidate, Space

ROUNDINGS_MS = (1000.0, 100.0, 10.0, 1.0)


def keeps(goal: Goal, best: float, tolerance: float) -> callable:
    """Score -> True when a shrunk candidate still shows what the best one showed."""
    def check(score: Score) -> bool:
        if not score.feasible:
            return False
        if goal.property is not None:
            return goal.found(score.value)
        return goal.direction * score.value >= goal.direction * best - tolerance * abs(best)
    return check


class WorkloadShrinker:
    """The passes over a :class:`~.space.Candidate` (see the module docstring)."""

    def __init__(self, space: Space):
        self.space = space

    def _with(self, candidate: Candidate, rows) -> Candidate:
        return Candidate(tuple(rows), candidate.settings)

    def _replace(self, candidate: Candidate, i: int, **fields) -> Candidate:
        rows = list(candidate.rows)
        rows[i] = {**rows[i], **fields}
        return self._with(candidate, rows)

    def fewer_requests(self, candidate: Candidate) -> Iterator[Candidate]:
        fewest = self.space.workload.requests[0]
        for rest in removals(candidate.rows):
            if len(rest) >= fewest:
                yield self._with(candidate, rest)

    def merged_requests(self, candidate: Candidate) -> Iterator[Candidate]:
        """Two neighbours (in arrival order) as one request: the first's arrival and class, their
        prompts and outputs added up within the class's ranges -- the load of two in one."""
        if len(candidate.rows) <= self.space.workload.requests[0]:
            return
        order = sorted(range(len(candidate.rows)), key=lambda i: candidate.rows[i]["arrival_ms"])
        for a, b in zip(order, order[1:]):
            first, second = candidate.rows[a], candidate.rows[b]
            klass = self.space.class_of(first)
            extra = first.get("prefix_tokens", 0)
            own = first["prompt_tokens"] - extra + second["prompt_tokens"] - second.get("prefix_tokens", 0)
            merged = {**first, "prompt_tokens": _clip(own, klass.prompt) + extra,
                      "output_tokens": _clip(first["output_tokens"] + second["output_tokens"], klass.output)}
            yield self._with(candidate, [merged if i == a else row for i, row in enumerate(candidate.rows) if i != b])

    def simpler_requests(self, candidate: Candidate) -> Iterator[Candidate]:
        first = self.space.classes[0]
        for i, row in enumerate(candidate.rows):
            if row.get("prefix_group") is not None:
                own = max(row["prompt_tokens"] - row["prefix_tokens"], self.space.class_of(row).prompt[0])
                yield self._replace(candidate, i, prefix_group=None, prefix_tokens=0, prompt_tokens=own)
            if self.space.workload.classes and row["request_class"] != first.name:
                extra = row.get("prefix_tokens", 0)
                fields = {"request_class": first.name, "client": first.client,
                          "prompt_tokens": _clip(row["prompt_tokens"] - extra, first.prompt) + extra,
                          "output_tokens": _clip(row["output_tokens"], first.output)}
                if "priority" in row:
                    fields["priority"] = first.priority
                yield self._replace(candidate, i, **fields)

    def rounder_arrivals(self, candidate: Candidate) -> Iterator[Candidate]:
        start = min(r["arrival_ms"] for r in candidate.rows)
        if start > 0:
            yield self._with(candidate, [{**r, "arrival_ms": r["arrival_ms"] - start} for r in candidate.rows])
        for step in ROUNDINGS_MS:
            rounded = [{**r, "arrival_ms": math.floor(r["arrival_ms"] / step) * step} for r in candidate.rows]
            if rounded != list(candidate.rows):
                yield self._with(candidate, rounded)
        for i, row in enumerate(candidate.rows):
            for step in ROUNDINGS_MS:
                value = math.floor(row["arrival_ms"] / step) * step
                if value != row["arrival_ms"]:
                    yield self._replace(candidate, i, arrival_ms=value)
        yield from self._rounder_even_gaps(candidate)

    def _rounder_even_gaps(self, candidate: Candidate) -> Iterator[Candidate]:
        """Evenly spaced arrivals (as ``cv = 0`` draws them) kept even: their common gap rounded
        down to whole seconds, tenths, ... milliseconds (rounding each arrival would make the
        gaps uneven, outside such a space)."""
        arrivals = sorted(r["arrival_ms"] for r in candidate.rows)
        if len(arrivals) < 3:
            return
        start, gap = arrivals[0], (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
        if gap <= 0 or any(abs(b - a - gap) > 1e-9 * max(1.0, gap) for a, b in zip(arrivals, arrivals[1:])):
            return
        for step in ROUNDINGS_MS:
            rounder = math.floor(gap / step) * step
            if 0 < rounder < gap:
                rows = [{**r, "arrival_ms": start + round((r["arrival_ms"] - start) / gap) * rounder}
                        for r in candidate.rows]
                yield self._with(candidate, rows)

    def smaller_numbers(self, candidate: Candidate) -> Iterator[Candidate]:
        for i, row in enumerate(candidate.rows):
            klass = self.space.class_of(row)
            extra = row.get("prefix_tokens", 0)
            for value in lower_values(row["prompt_tokens"], klass.prompt[0] + extra):
                yield self._replace(candidate, i, prompt_tokens=value)
            for value in lower_values(row["output_tokens"], klass.output[0]):
                yield self._replace(candidate, i, output_tokens=value)
            if float(row["arrival_ms"]).is_integer():
                for value in lower_values(int(row["arrival_ms"]), 0):
                    yield self._replace(candidate, i, arrival_ms=float(value))

    def passes(self):
        """The passes, each yielding only candidates within the space (None in place of the others:
        :func:`~schedlab.shrinking.greedy_shrink` skips them without evaluating them)."""
        def within(make):
            return lambda candidate: (c if self.space.contains(c) else None for c in make(candidate))

        return tuple(within(make) for make in (self.fewer_requests, self.merged_requests, self.simpler_requests,
                                                self.rounder_arrivals, self.smaller_numbers))


@attrs.define
class ShrinkProgress:
    """The shrinker's current candidate as it goes (its score too), and the evaluations spent:
    what an interrupted hunt writes. ``steps``: how many shrinking steps were taken."""

    candidate: Candidate
    score: Score
    evaluations: int = 0
    steps: int = 0


def shrink_candidate(candidate: Candidate, space: Space, evaluator: Evaluator, goal: Goal, *, best: float,
                     tolerance: float, max_evaluations: int, bar,
                     progress: ShrinkProgress | None = None) -> tuple[Candidate, int]:
    """The smallest candidate found that still shows the failure, and the evaluations spent.
    ``progress``, if given, follows the current candidate as shrinking goes (every evaluation
    goes through ``many`` below, and :func:`~schedlab.shrinking.greedy_shrink` takes the first
    interesting candidate of each batch it evaluates)."""
    check = keeps(goal, best, tolerance)

    def many(batch: list[Candidate]) -> list[bool]:
        scores = [score for score, _ in evaluator.evaluate(batch)]
        verdicts = [check(score) for score in scores]
        taken = next((i for i, verdict in enumerate(verdicts) if verdict), None)
        charged = len(batch) if taken is None else taken + 1   # as greedy_shrink charges its budget
        bar.update(charged)
        if progress is not None:
            progress.evaluations += charged
            if taken is not None:
                progress.candidate, progress.score = batch[taken], scores[taken]
                progress.steps += 1
        return verdicts

    shrinker = WorkloadShrinker(space)
    return greedy_shrink(candidate, lambda c: many([c])[0], shrinker.passes(), max_evaluations=max_evaluations,
                         width=evaluator.executor.workers, interesting_many=many)


def _clip(value: int, bounds: tuple) -> int:
    return int(min(max(value, bounds[0]), bounds[1]))
