"""The end of the simulated clock, shared by both engines.

Times are float64 milliseconds. An iteration that would end after
:data:`~schedlab.configs.MAX_TIME_MS` (10**12 ms, about 31.7 years) is refused: past it the
clock loses sub-microsecond resolution, and at absurd costs (``decode_ms_per_step = 1e306``)
sums overflow to infinity and finished requests could no longer be told apart from lost ones.
"""

from __future__ import annotations

import math
import numbers

from ..configs import MAX_TIME_MS
from ..errors import SimulationError


def check_iteration_end(start: float, duration: float, what) -> None:
    """Raise :class:`SimulationError` when an iteration (or run of them) of ``duration`` ms
    starting at ``start`` would end past the clock; ``what`` (the batch) is named in the message."""
    if not start + duration <= MAX_TIME_MS:
        raise SimulationError(
            f"the simulated clock would pass {MAX_TIME_MS:g} ms (about 31.7 years): an iteration of {what} "
            f"starting at t={start:.6g} ms takes {duration:.3g} ms; check the cost model's settings")


def check_iteration_ms(duration: float, batch) -> float:
    """``duration``, the cost model's time for ``batch``, if it is a positive and finite number; else
    :class:`SimulationError` naming the batch (both engines: a plugin's zero, negative, NaN or
    infinite time would stall the clock or break causality far from its cause, and its text,
    None or tuple fail in schedlab's arithmetic)."""
    if isinstance(duration, (float, int)) and duration.__class__ is not bool:  # (numpy's float64 is a float)
        if 0.0 < duration < math.inf:
            return duration
    elif not _real(duration):
        raise SimulationError(
            f"cost model returned {duration!r} ({type(duration).__name__}) ms for {batch}; iterations must take a "
            "positive, finite time (a number)")
    elif 0.0 < duration < math.inf:  # (another real number: numpy's float32, a Fraction)
        return duration
    raise SimulationError(
        f"cost model returned {duration!r} ms for {batch}; iterations must take a positive, finite time")


def _real(value) -> bool:
    """A real number (an int, a float, a numpy float...), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
