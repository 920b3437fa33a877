"""The closed forms of decode runs (schedlab.engine.bulk) at the edges of the clock."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.engine.bulk import MAX_STEPS, run_ms, steps_before
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
