"""The best run by one metric: the ``best`` setting of the ``table`` and ``plots`` reports.

::

    [reports.table]
    best = "per_class.interactive.slo.goodput_rps"   # a dotted metric name
    best_is = "highest"                              # or "lowest" (for latencies)

Runs without a finite number for the metric (absent, NaN, text) take no part. Runs tied at
exactly the best value are all best, so the choice never depends on the order of the runs.
This module does not import matplotlib: the table report uses it too.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from schedlab.configs import metric_field, str_field
from schedlab.results.metrics import metric_at

BEST_IS = ("highest", "lowest")


def best_field():
    return metric_field(None, optional=True,
                        help="a dotted metric such as 'per_class.interactive.slo.goodput_rps': the run with the best "
                             "value is marked (see best_is)")


def best_is_field():
    return str_field("highest", choices=BEST_IS, help="which value of `best` wins: 'highest' or 'lowest'")


def metric_number(metrics: dict, name: str) -> float | None:
    """The dotted metric ``name`` as a finite float, or None (absent, NaN, infinite, not a number)."""
    node = metric_at(metrics, name)
    if isinstance(node, bool) or not isinstance(node, (int, float, np.integer, np.floating)):
        return None
    value = float(node)
    return value if math.isfinite(value) else None


def best_runs(runs: Sequence, metric: str, best_is: str = "highest") -> tuple[list, float | None]:
    """``(the runs with the best value, that value)``; ``([], None)`` when no run has one."""
    if best_is not in BEST_IS:
        raise ValueError(f"best_is must be one of {BEST_IS}, got {best_is!r}")
    scored = [(run, metric_number(run.metrics, metric)) for run in runs]
    values = [v for _, v in scored if v is not None]
    if not values:
        return [], None
    top = max(values) if best_is == "highest" else min(values)
    return [run for run, v in scored if v == top], top


def best_text(metric: str, best_is: str, winners: Sequence, value: float | None) -> str:
    """One line naming the best run(s): ``best per_class.x.slo.goodput_rps (highest): separated = 3.06``."""
    if not winners:
        return f"best {metric} ({best_is}): no run has a value"
    names = ", ".join(run.name for run in winners)
    return f"best {metric} ({best_is}): {names} = {number_text(value)}"


def number_text(value: float) -> str:
    """A value for one line of text: ``16,950``, ``3.095``, ``0.9939``."""
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.4g}"
