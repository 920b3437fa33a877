"""Shrink a differing case to a minimal reproducer (greedy delta debugging).

Given a case and a predicate (``interesting(case)``: the engines still differ in the same
way), repeat until nothing changes or the evaluation budget is spent:

1. drop requests -- halves, then quarters, ... then single requests (ddmin's complements);
2. simplify the settings -- what ``settings.simpler()`` offers, most aggressive first (vLLM's:
   no threshold, no prefix caching, FCFS, then fewer sequences, a smaller budget, fewer blocks);
3. shrink each request's numbers towards their minimum -- prompt, output, shared prefix,
   arrival, priority, then ``max_tokens`` (none: EOS ignored, then down to the output) --
   trying the minimum, then steps down of half, a quarter, ... one
   (:func:`schedlab.shrinking.lower_values`; the loop itself is :func:`schedlab.shrinking.greedy_shrink`);
4. renumber the requests 0, 1, ... in arrival order and start the first arrival at 0.

Only valid candidates (:meth:`Case.problems` empty) are tried, so a reproducer never
depends on a request that cannot fit the cache alone. The result is 1-minimal with respect
to these steps: removing any request or lowering any number by one no longer reproduces.
"""

from __future__ import annotations

from typing import Callable, Iterator

import attrs

from ..shrinking import greedy_shrink, lower_values, removals
from .case import Case, DiffRequest

NUMBERS = (("prompt_tokens", 1), ("output_tokens", 1), ("prefix_len", 0), ("arrival", 0), ("priority", 0))


def smaller(settings, bounds) -> Iterator[dict]:
    """Changes that lower one numeric setting each: ``bounds`` are ``(name, lowest)`` pairs; a
    setting at 0 stays off (0 means "off" where it is allowed)."""
    for name, low in bounds:
        value = getattr(settings, name)
        if value:
            for target in lower_values(value, low):
                yield {name: target}


def _valid(make: Callable[[], Case]) -> Case | None:
    try:
        case = make()
    except ValueError:
        return None
    return None if case.problems() else case


def _with_requests(case: Case, requests) -> Case:
    return attrs.evolve(case, requests=tuple(requests))


def _removals(case: Case) -> Iterator[Case | None]:
    for rest in removals(case.requests):
        candidate = _with_requests(case, rest)
        yield None if candidate.problems() else candidate


def _setting_candidates(case: Case) -> Iterator[Case]:
    s = case.settings
    for change in s.simpler():
        yield attrs.evolve(case, settings=attrs.evolve(s, **change))


def _request_changes(r: DiffRequest) -> Iterator[dict]:
    for name, low in NUMBERS:
        for target in lower_values(getattr(r, name), low):
            change = {name: target}
            if name == "prompt_tokens" and r.prefix_len > target:
                change["prefix_len"] = target
            if change.get("prefix_len", r.prefix_len) == 0:
                change["group"] = None
            yield change
    if r.max_tokens is not None:  # EOS ignored, then a tighter limit
        yield {"max_tokens": None}
        for target in lower_values(r.max_tokens, r.output_tokens):
            yield {"max_tokens": target}
    if r.abort_at is not None:  # no abort, then an earlier one (half a ms into an iteration)
        yield {"abort_at": None}
        for target in lower_values(int(r.abort_at - r.arrival - 0.5), 0):
            yield {"abort_at": r.arrival + target + 0.5}
    if r.group:  # group 0 reads simplest
        yield {"group": 0}


def _number_candidates(case: Case) -> Iterator[tuple[int, dict]]:
    """(index of a request, the change of its fields to try)."""
    for i, r in enumerate(case.requests):
        for change in _request_changes(r):
            yield i, change


def _renumbered(case: Case) -> Case:
    ordered = case.in_arrival_order()
    start = ordered[0].arrival
    return _with_requests(case, [attrs.evolve(r, id=i, arrival=r.arrival - start,
                                              abort_at=None if r.abort_at is None else r.abort_at - start)
                                 for i, r in enumerate(ordered)])


def _settings_pass(case: Case) -> Iterator[Case | None]:
    for candidate in _setting_candidates(case):
        yield _valid(lambda candidate=candidate: candidate)


def _numbers_pass(case: Case) -> Iterator[Case | None]:
    for i, change in _number_candidates(case):
        def make(i=i, change=change):
            reqs = list(case.requests)
            reqs[i] = attrs.evolve(reqs[i], **change)
            return _with_requests(case, reqs)

        yield _valid(make)


def shrink(case: Case, interesting: Callable[[Case], bool], *, max_evaluations: int = 400) -> Case:
    """The smallest case found that is still ``interesting`` (``case`` itself must be)."""
    current, used = greedy_shrink(case, interesting, (_removals, _settings_pass, _numbers_pass),
                                  max_evaluations=max_evaluations)
    if used < max_evaluations:
        renumbered = _valid(lambda: _renumbered(current))
        if renumbered is not None and renumbered != current and interesting(renumbered):
            current = renumbered
    return current
