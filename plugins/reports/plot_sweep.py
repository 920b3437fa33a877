"""A sweep's metrics against its swept key: one panel per metric.

The x axis is the sweep's first key. With more keys (a grid), each combination of the other
keys' values gets its own line, labelled like ``max_num_seqs=16``. Numeric values are placed
by value (on a log axis when they span a factor of 10 or grow by ratio, like 5, 10, 20, 40;
with a tick at each value when there are at most 12); other values (text, lists) are placed
in order as categories. Metrics that no
run of the sweep has are left out; a metric's y axis is logarithmic when its positive values
span a factor of 30 or more.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator

from schedlab.sweep import point_label

from .plot_common import line_style, metric_label, metric_unit, metric_value, new_figure, note, prefers_log_axis, \
    tick_text, titles, use_log_scale, wide_positive_range

MAX_VALUE_TICKS = 12
INTEGER_UNITS = ("count", "requests", "sequences", "tokens")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def present_metrics(runs, names) -> list[str]:
    """The names (in the given order) that at least one run has."""
    return [name for name in names if any(metric_value(run.metrics, name) is not None for run in runs)]


def sweep_series(study, metric: str) -> tuple[list, list[tuple[str, np.ndarray, np.ndarray]]]:
    """The x values in first-seen order and, per line, its label, x positions and metric values.

    x positions are the values themselves for a numeric key, else their index in the order.
    """
    key, others = study.keys[0], study.keys[1:]
    xs = []
    for run in study.runs:
        if not any(_same(run.point.get(key), seen) for seen in xs):
            xs.append(run.point.get(key))
    numeric = all(_is_number(v) for v in xs)
    groups: dict[str, list] = {}
    for run in study.runs:
        label = point_label({k: run.point.get(k) for k in others})
        groups.setdefault(label, []).append(run)
    lines = []
    for label, runs in groups.items():
        if numeric:
            x = np.array([float(run.point.get(key)) for run in runs])
        else:
            x = np.array([float(next(i for i, v in enumerate(xs) if _same(v, run.point.get(key)))) for run in runs])
        y = np.array([_nan_if_none(metric_value(run.metrics, metric)) for run in runs])
        order = np.argsort(x, kind="stable")
        lines.append((label, x[order], y[order]))
    return xs, lines


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def _nan_if_none(value):
    return math.nan if value is None else value


def sweep_figure(study, metrics, dpi: int) -> Figure | None:
    """One panel per metric of ``metrics`` present in the study; None if none is (or no key)."""
    if not study.keys or not study.runs:
        return None
    names = present_metrics(study.runs, metrics)
    if not names:
        return None
    key = study.keys[0]
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig = new_figure(4.4 * ncols, 3.3 * nrows + 0.9, dpi)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    handles = {}
    xs: list = []
    for ax, metric in zip(axes, names):
        xs, lines = sweep_series(study, metric)
        values = []
        for i, (label, x, y) in enumerate(lines):
            (line,) = ax.plot(x, y, marker="o", markersize=4.5, linewidth=1.5, label=label or key, **line_style(i))
            line.set_gid(f"sweep:{metric}:{i}")
            handles.setdefault(label, line)
            values.append(y)
        _x_axis(ax, key, xs)
        ax.set_ylabel(metric_label(metric))
        ax.set_title(metric, fontsize=11)
        ax.grid(True, alpha=0.3)
        pooled = np.concatenate(values) if values else np.empty(0)
        if not np.isfinite(pooled).any():
            note(ax, "no values (NaN)")
        elif wide_positive_range(pooled, ratio=30.0):
            use_log_scale(ax, "y", pooled)
        else:
            _linear_y(ax, pooled[np.isfinite(pooled)], metric_unit(metric) in INTEGER_UNITS)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    if len(handles) > 1:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncol=min(len(handles), 6), frameon=False)
    shape = " x ".join(f"{k} ({n})" for k, n in zip(study.keys, _value_counts(study)))
    titles(fig, f"sweep: {study.name}", f"{len(study.runs)} runs over {shape}")
    return fig


def _linear_y(ax, values: np.ndarray, integer: bool) -> None:
    """Start at 0 for non-negative values; keep a constant count (all 0) readable."""
    lo, hi = float(values.min()), float(values.max())
    if integer and lo == hi:
        ax.set_ylim(lo - 1, hi + 1) if lo > 0 else ax.set_ylim(-0.1, 1.0)
    elif lo >= 0 and hi > 0:
        ax.set_ylim(0, hi * 1.08)
    if integer:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _value_text(value) -> str:
    """A swept value as the run names show it (``true``, ``[1,2]``, text unquoted)."""
    return point_label({"key": value}).split("=", 1)[1]


def _value_counts(study) -> list[int]:
    counts = []
    for k in study.keys:
        seen: list = []
        for run in study.runs:
            if not any(_same(run.point.get(k), s) for s in seen):
                seen.append(run.point.get(k))
        counts.append(len(seen))
    return counts


def _x_axis(ax, key: str, xs: list) -> None:
    ax.set_xlabel(key)
    if all(_is_number(v) for v in xs):
        values = [float(v) for v in xs]
        if prefers_log_axis(values):
            use_log_scale(ax, "x", values)
        if len(values) <= MAX_VALUE_TICKS:
            ax.set_xticks(sorted(values))
            ax.xaxis.set_major_formatter(FuncFormatter(tick_text))
            ax.xaxis.set_minor_locator(NullLocator())
        return
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([_value_text(v) for v in xs],
                       rotation=30 if sum(len(str(v)) for v in xs) > 40 else 0, ha="right" if len(xs) > 4 else "center")
    ax.set_xlim(-0.5, len(xs) - 0.5)
