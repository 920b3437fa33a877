"""The closed forms of decode runs (schedlab.engine.bulk) at the edges of the clock."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.engine.bulk import MAX_STEPS, SlidingGrowth, run_ms, steps_before
from schedlab.testing import examples

times = st.floats(0.0, 1e12)
durations = st.one_of(st.floats(1e-300, 1e-6), st.floats(1e-6, 1e3), st.floats(1e3, 1e12))
increments = st.one_of(st.just(0.0), st.floats(0.0, 1e-3), st.floats(0.0, 100.0))


@settings(max_examples=examples(300))
@given(times, times, durations, increments)
def test_steps_before_is_the_first_iteration_reaching_the_bound(now, later, d0, inc):
    """The smallest k with now + run_ms(k) >= until (at most MAX_STEPS), wherever on the clock
    and however short the iterations: 1e-300 ms iterations once overflowed (a traceback)."""
    until = max(now, later) + (abs(now - later) or 1.0)
    k = steps_before(now, until, d0, inc)
    assert 1 <= k <= MAX_STEPS
    if k < MAX_STEPS:
        assert now + run_ms(k, d0, inc) >= until
    if k > 1:
        assert now + run_ms(k - 1, d0, inc) < until


def test_steps_before_settles_on_exact_float_sums():
    # At 2**62 floats are 1024 apart: now + k rounds to the nearest multiple (ties to even), so
    # the first k reaching now + 4096 is 3584 (3.5 spacings round up), not the estimate 4096.
    now = 2.0**62
    assert steps_before(now, now + 4096, 1.0, 0.0) == 3584
    assert now + 3584 == now + 4096 and now + 3583 < now + 4096
    # 8 ms steps towards the end of the clock: exactly 125,000 start before it
    assert steps_before(1e12 - 1e6, 1e12, 8.0, 0.0) == 125_000


def test_steps_before_ends_where_it_used_to_spin():
    """At t = 1e33 ms (time_scale = 1e30) one float step is 1.4e17 ms: 8 ms steps never move the
    sum, and settling one step at a time did not end. Such a run is longer than MAX_STEPS."""
    now = 1e33
    assert steps_before(now, math.nextafter(now, math.inf), 8.0, 0.0) == MAX_STEPS
    assert steps_before(0.0, 1e12, 1e-300, 0.0) == MAX_STEPS


# -- Growth with a pattern that also falls (sliding-window layers) ---------------------------------------------


@st.composite
def patterns(draw):
    """Decoders by the residue where they cross a block and, some of them, where their window frees one."""
    bs = draw(st.sampled_from([1, 2, 4, 8, 16]))
    cross = draw(st.lists(st.integers(0, 5), min_size=bs, max_size=bs).filter(any))
    frees = draw(st.lists(st.integers(0, 5), min_size=bs, max_size=bs))
    n_sliding = min(sum(frees), sum(cross))
    while sum(frees) > n_sliding:  # (no more sliding decoders than growing ones)
        i = max(range(bs), key=frees.__getitem__)
        frees[i] -= 1
    return cross, frees, draw(st.integers(1, 3)), draw(st.integers(0, 100))


def _brute(cross, frees, groups, start, k, coincide):
    """C(0..k-1) step by step: iteration j at counter start + j takes 1 + g blocks per decoder crossing there and
    gives back g per sliding decoder freeing there; and each iteration's high point: the blocks before it plus
    what the decoders that take blocks take (each of those gives its own back first: a decoder frees where it
    crosses when ``coincide``, else never there)."""
    bs, used, out, taken, high = len(cross), 0, [0], [0], [0]
    for j in range(1, k):
        r = (start + j) % bs
        takers = (1 + groups) * cross[r] - (groups * frees[r] if coincide else 0)
        high.append(used + takers)
        taken.append(taken[-1] + takers)  # (a decoder freeing where it crosses takes one block net)
        used += (1 + groups) * cross[r] - groups * frees[r]
        out.append(used)
    return out, taken, high


@given(patterns(), st.integers(1, 80), st.integers(0, 60), st.floats(0.5, 4.0), st.sampled_from([0.0, 0.25]),
       st.booleans())
def test_sliding_growth_matches_iteration_by_iteration(pattern, k, budget, d0, inc, coincide):
    cross, frees, groups, start = pattern
    if coincide:  # (each sliding decoder frees where it crosses)
        frees = [min(f, c) for f, c in zip(frees, cross)]
    g = SlidingGrowth(cross, sum(cross), frees, sum(frees), groups, start, coincide)
    used, taken, high = _brute(cross, frees, groups, start, k + 2 * (budget + 1) * len(cross), coincide)
    for j in range(k):
        assert g.blocks(j) == used[j] and g.taken(j) == taken[j] and g.peak(j) == max(used[:j + 1])
    lasting = g.iterations_within(budget)  # the free blocks last through iteration `lasting`, not one more
    assert max(high[:lasting + 1]) <= budget < high[lasting + 1]
    took = g.taken_within(budget)
    assert taken[took] <= budget < taken[took + 1]
    durations = [d0 + j * inc for j in range(k)]
    for threshold in {-2, 0, 1, 3, max(used[:k]) or 1, max(used[:k]) + 1}:
        expected = sum(d for d, u in zip(durations, used) if u >= threshold)
        assert math.isclose(g.time_at_or_above(threshold, k, d0, inc), expected, rel_tol=1e-9, abs_tol=1e-9)
    below = g.first_below(0)
    dips = [j for j in range(1, len(used)) if used[j] < 0]
    assert below == (dips[0] if dips else None) or (below is not None and below >= len(used) and not dips)
    block_ms = sum((7 + u) * d for u, d in zip(used, durations))
    assert math.isclose(g.block_time(k, d0, inc, 7), block_ms, rel_tol=1e-9)


def test_sliding_growth_by_hand():
    # blocks of 4; one decoder crossing at residue 0, its window (one group) freeing at residue 2; the run starts at
    # counter 3, so iterations 1, 2, 3, ... are at residues 0, 1, 2, 3, 0, ...: +2, 0, -1, 0, +2, 0, -1, ...
    g = SlidingGrowth([1, 0, 0, 0], 1, [0, 0, 1, 0], 1, 1, 3, False)
    assert [g.blocks(j) for j in range(9)] == [0, 2, 2, 1, 1, 3, 3, 2, 2]
    assert [g.peak(j) for j in range(9)] == [0, 2, 2, 2, 2, 3, 3, 3, 3]
    assert [g.taken(j) for j in range(9)] == [0, 2, 2, 2, 2, 4, 4, 4, 4]
    assert g.iterations_within(2) == 4 and g.iterations_within(1) == 0 and g.iterations_within(3) == 8
    # 1 ms each: C >= 2 at iterations 1, 2, 5, 6, 7, 8 of 0..8
    assert g.time_at_or_above(2, 9, 1.0, 0.0) == 6.0
    assert g.first_below(0) is None and g.first_below(2) == 3  # (C(3) = 1)
    # a second decoder crossing at residue 2 (where the first one's window frees): iteration 3 takes 2 blocks with
    # 2 in use before the first decoder gives its one back -- 4 at once, though 3 after it
    g = SlidingGrowth([1, 0, 1, 0], 2, [0, 0, 1, 0], 1, 1, 3, False)
    assert [g.blocks(j) for j in range(5)] == [0, 2, 2, 3, 3]
    assert g.iterations_within(3) == 2 and g.iterations_within(4) == 4
