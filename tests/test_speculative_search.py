"""Searches with several probes at once stop with the sequential search's answer, probe for probe."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from schedlab.errors import ConfigError
from schedlab.study.search import search
from schedlab.study.speculative import SpeculativeSearch


def run_speculative(predicate, width, order_seed=0, **args):
    """Evaluate what the search wants, recording outcomes in a shuffled order, one at a time
    (results of a round arrive while others are still running); returns (outcome, evaluated)."""
    spec = SpeculativeSearch(width, **args)
    shuffle = random.Random(order_seed)
    running: list = []
    evaluated: list = []
    rounds = 0
    while not spec.done:
        for value in spec.wanted():
            if value not in running and value not in evaluated:
                running.append(value)
        assert running, "the search wants nothing but is not done"
        rounds += 1
        value = running.pop(shuffle.randrange(len(running)))
        evaluated.append(value)
        spec.record(value, predicate(value), ("payload", value))
        running = [v for v in running if v in spec.wanted() or shuffle.random() < 0.5]  # some finish anyway
    return spec.outcome, evaluated


def sequential(predicate, **args):
    return search(lambda v: (predicate(v), ("payload", v)), **args)


@settings(max_examples=150)
@given(low=st.integers(-50, 50), span=st.integers(0, 400), where=st.floats(0, 1), maximize=st.booleans(),
       width=st.integers(1, 8), order_seed=st.integers(0, 1000))
def test_integer_monotone_same_answer_and_path(low, span, where, maximize, width, order_seed):
    high = low + span
    boundary = low - 1 + round(where * (span + 2))  # from "fails everywhere" to "holds everywhere"
    predicate = (lambda v: v <= boundary) if maximize else (lambda v: v >= boundary)
    args = dict(low=low, high=high, maximize=maximize)
    expected = sequential(predicate, **args)
    got, evaluated = run_speculative(predicate, width, order_seed, **args)
    assert got == expected  # status, value, failing, payload, message and every probe in order
    assert set(p.value for p in expected.probes) <= set(evaluated)


@settings(max_examples=100)
@given(low=st.floats(-100, 100), span=st.floats(0.5, 1000), where=st.floats(0, 1),
       tolerance=st.sampled_from([0.01, 0.1, 0.5, 2.0]), maximize=st.booleans(), width=st.integers(2, 7),
       order_seed=st.integers(0, 1000))
def test_float_monotone_same_answer(low, span, where, tolerance, maximize, width, order_seed):
    high = low + span
    boundary = low + where * span
    predicate = (lambda v: v <= boundary) if maximize else (lambda v: v >= boundary)
    args = dict(low=low, high=high, maximize=maximize, integer=False, tolerance=tolerance)
    try:
        expected = sequential(predicate, **args)
    except ConfigError:  # range too fine for max_probes: the speculative search refuses it too
        with pytest.raises(ConfigError):
            SpeculativeSearch(width, **args)
        return
    got, _ = run_speculative(predicate, width, order_seed, **args)
    assert got == expected


@settings(max_examples=80)
@given(span=st.integers(1, 200), passing=st.sets(st.integers(0, 200)), maximize=st.booleans(),
       width=st.integers(1, 6), order_seed=st.integers(0, 100))
def test_non_monotone_constraint_still_the_same_answer(span, passing, maximize, width, order_seed):
    predicate = lambda v: v in passing  # noqa: E731
    args = dict(low=0, high=span, maximize=maximize)
    assert run_speculative(predicate, width, order_seed, **args)[0] == sequential(predicate, **args)


def test_width_three_bisects_in_quarters():
    """Bisection phase: the next probe and both of its successors, so each round of three
    probes cuts the bracket in four."""
    spec = SpeculativeSearch(3, low=0, high=100)
    for value in (0, 1, 3, 7, 15, 31, 63):  # bracketing: all pass
        spec.record(value, True)
    spec.record(100, False)
    assert spec.wanted() == [81, 90, 72]  # (63 + 100) // 2, then the midpoint above it (if 81 passes), below
    spec.record(81, False)
    spec.record(72, True)
    spec.record(90, False)
    assert spec.wanted()[0] == 76  # between 72 (passes) and 81 (fails)


def test_width_one_asks_exactly_what_the_sequential_search_asks():
    asked = []
    spec = SpeculativeSearch(1, low=1, high=64)
    while not spec.done:
        (value,) = spec.wanted()
        asked.append(value)
        spec.record(value, value <= 17)
    assert asked == [p.value for p in sequential(lambda v: v <= 17, low=1, high=64).probes]


def test_fewer_rounds_with_more_width():
    def rounds(width):
        spec = SpeculativeSearch(width, low=1, high=1000)
        count = 0
        while not spec.done:
            count += 1
            for value in spec.wanted():
                spec.record(value, value <= 637)
        return count

    assert rounds(1) == len(sequential(lambda v: v <= 637, low=1, high=1000).probes) == 20
    assert rounds(3) < rounds(1) * 0.6
    assert rounds(7) < rounds(3)
