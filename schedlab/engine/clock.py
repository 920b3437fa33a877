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
    starting at ``start`` would end past the clock, or would take time yet end when it starts (a
    positive ``1e-300`` ms is below the clock's resolution: its requests would finish the instant
    they are scheduled); ``what`` (the batch) is named in the message."""
    end = start + duration
    if not end <= MAX_TIME_MS:
        raise SimulationError(
            f"the simulated clock would pass {MAX_TIME_MS:g} ms (about 31.7 years): an iteration of {what} "
            f"starting at t={start:.6g} ms takes {duration:.3g} ms; check the cost model's settings")
    if end == start and duration > 0.0:
        raise SimulationError(
            f"cost model returned {duration:.3g} ms for {what}, which does not advance the simulated clock at "
            f"t={start:.6g} ms (below its resolution there); iterations must take a time the clock can count")


def check_iteration_ms(duration: float, batch, method: str | None = None) -> float:
    """``duration``, the cost model's time for ``batch``, if it is a positive and finite number (as a
    Python float when it is another real type: numpy's float32, a Fraction); else
    :class:`SimulationError` naming the batch (both engines: a plugin's zero, negative, NaN or
    infinite time would stall the clock or break causality far from its cause, and its text,
    None or tuple fail in schedlab's arithmetic). ``method``: the cost model's method that gave
    it when not ``iteration_ms`` (``rank_ms``: a data-parallel rank's part), for the message."""
    if isinstance(duration, (float, int)) and duration.__class__ is not bool:  # (numpy's float64 is a float)
        if 0.0 < duration < math.inf:
            return duration
    elif not _real(duration):
        raise SimulationError(
            f"{_who(method)} returned {duration!r} ({type(duration).__name__}) ms for {batch}; iterations must take "
            "a positive, finite time (a number)")
    elif 0.0 < duration < math.inf:  # (another real number: numpy's float32, a Fraction)
        return float(duration)  # (a float32 would drag the clock down to its precision: review s81 plugin, 1)
    raise SimulationError(
        f"{_who(method)} returned {duration!r} ms for {batch}; iterations must take a positive, finite time")


def check_part_ms(duration, batch, method: str) -> float:
    """``duration`` if it is a finite number >= 0 (a part of a step that may take no time: the
    activations' send, the routed experts' layers on no token), a Python float when it is another
    real type; else :class:`SimulationError`."""
    if _real(duration) and 0.0 <= duration < math.inf:
        return duration if isinstance(duration, (float, int)) else float(duration)
    raise SimulationError(f"{_who(method)} returned {duration!r} ({type(duration).__name__}) ms for {batch}; "
                          "it must be a finite number >= 0")


def check_pipeline_ms(result, batch) -> tuple[tuple, float | tuple]:
    """``pipeline_ms(batch)``'s ``(stage_ms, send_ms)`` if it has that shape: a sequence of
    finite stage times >= 0, not all 0, and a finite send time >= 0 -- one for every hop, or a
    sequence of one per hop (``stages - 1``: hop ``k`` from stage ``k`` to ``k + 1``); else
    :class:`SimulationError` naming the batch."""
    try:
        stage_ms, send_ms = result
        stages = tuple(stage_ms)
    except (TypeError, ValueError):
        raise SimulationError(f"cost model's pipeline_ms returned {result!r} for {batch}; it must return "
                              "(stage_ms, send_ms): the stages' times and the activations' send, ms") from None
    for ms in stages:
        check_part_ms(ms, batch, "pipeline_ms (a stage's time)")
    if not any(stages):
        raise SimulationError(f"cost model's pipeline_ms returned stage times {stages!r} for {batch}; "
                              "a batch that computes must take time on some stage")
    if isinstance(send_ms, (tuple, list)):
        if len(send_ms) != len(stages) - 1:
            raise SimulationError(f"cost model's pipeline_ms returned {len(send_ms)} send times for {len(stages)} "
                                  f"stages ({batch}); give one per hop ({len(stages) - 1}) or one number for all")
        return stages, tuple(check_part_ms(ms, batch, "pipeline_ms (a hop's send)") for ms in send_ms)
    return stages, check_part_ms(send_ms, batch, "pipeline_ms (the send)")


def hops_ms(send_ms, stages: int) -> float:
    """The sends of one batch's trip through ``stages`` stages (``send_ms`` as
    :func:`check_pipeline_ms` returns it: one time for every hop, or each hop's)."""
    if isinstance(send_ms, tuple):
        return sum(send_ms)
    return (stages - 1) * send_ms


def check_step_increment(inc, batch):
    """``decode_step_increment(batch)``'s answer if it has a form the fast engine reads: None
    (no promise), a number (< 0 is taken as no promise: a rounding below 0 is harmless), or
    ``(increment, steps)`` with ``steps`` a whole number >= 1; else :class:`SimulationError`
    (text, NaN or infinity would otherwise fail far from the plugin, or be ignored)."""
    if inc is None:
        return None
    if type(inc) is tuple:
        if len(inc) == 2 and _real(inc[0]) and math.isfinite(inc[0]) and isinstance(inc[1], numbers.Integral) \
                and not isinstance(inc[1], bool) and inc[1] >= 1:
            return float(inc[0]), int(inc[1])
    elif _real(inc) and math.isfinite(inc):
        return float(inc)
    raise SimulationError(
        f"cost model's decode_step_increment returned {inc!r} for {batch}; it must return None, a finite number "
        "(ms each further identical decode step adds) or (that number, steps >= 1 it holds for)")


def _who(method: str | None) -> str:
    return "cost model" if method is None else f"cost model's {method}"


def _real(value) -> bool:
    """A real number (an int, a float, a numpy float...), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
