"""A sweep's metrics against its swept key: one panel per metric.

The x axis is the sweep's first key. With more keys (a grid), each combination of the other
keys' values gets its own line, labelled like ``max_num_seqs=16``. Numeric values are placed
by value (on a log axis when they span a factor of 10 or grow by ratio, like 5, 10, 20, 40;
with a tick at each value when there are at most 12); other values (text, lists) are placed
in order as categories. Metrics that no
run of the sweep has are left out; a metric's y axis is logarithmic when its positive values
span a factor of 30 or more.

Two options of the ``plots`` report add to these figures:

* ``mark_last_zero = "num_preemptions"`` draws, for every line, a dotted vertical line (in the
  line's colour, on every panel) at the last value of the leading run of swept values where
  that metric is 0 -- the largest value up to which it is still 0 (nothing is drawn when it is
  not 0 at the first value). With ``num_preemptions`` this is the largest ``max_num_seqs``
  (or load) that runs without preemption. The subtitle lists the marked values.
* ``overlays = {name = ["a", "b", "c"]}`` draws several runs in one figure
  (:func:`overlay_figure`): each sweep's lines, labelled with the run name, against their
  common first key, and each single run as a dashed horizontal reference line.

Points whose run is overloaded (``stability.verdict``, see :mod:`schedlab.results.stability`) get a
ring on every panel: red where the waiting queue grows, orange where it grew but the run was
too short to tell. The subtitle names them: their percentiles depend on how long they ran.

Runs with replicas (``replicas = K``) draw their means, each line with a shaded band for its
95% confidence intervals (gid ``interval:<metric>:<line>``; a reference line gets a band too).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator

from schedlab.study.sweep import point_label

from .plot_common import STABILITY_STYLES, line_style, metric_label, metric_unit, metric_value, new_figure, note, \
    outside_legend, prefers_log_axis, setting_label, stability_verdict, tick_text, titles, use_log_scale, \
    wide_positive_range

#: the least width (inches) of a sweep figure: one panel alone is too narrow for its subtitle
MIN_FIGURE_WIDTH = 6.4

MAX_VALUE_TICKS = 12
INTEGER_UNITS = ("count", "requests", "sequences", "tokens")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def present_metrics(runs, names) -> list[str]:
    """The names (in the given order) that at least one run has."""
    return [name for name in names if any(metric_value(run.metrics, name) is not None for run in runs)]


def sweep_series(study, metric: str,
                 order: list | None = None) -> tuple[list, list[tuple[str, np.ndarray, np.ndarray]]]:
    """The x values in first-seen order and, per line, its label, x positions and metric values.

    x positions are the values themselves for a numeric key, else their index in the order
    (``order``, when given, fixes that order: several sweeps drawn in one figure share it).
    """
    xs, lines = _series(study, order, lambda run: _nan_if_none(metric_value(run.metrics, metric)))
    return xs, lines


def interval_series(study, metric: str, order: list | None = None) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """Per line of :func:`sweep_series`: its label, x positions and the 95% interval's low and
    high ends (NaN where a run has no interval, i.e. no replicas)."""
    _, lows = _series(study, order, lambda run: _interval_end(run, metric, 0))
    _, highs = _series(study, order, lambda run: _interval_end(run, metric, 1))
    return [(label, x, lo, hi) for (label, x, lo), (_, _, hi) in zip(lows, highs)]


def _interval_end(run, metric: str, end: int) -> float:
    pair = (getattr(run, "intervals", None) or {}).get(metric)
    return _nan_if_none(pair[end]) if pair else math.nan


def _series(study, order, value):
    key, others = study.keys[0], study.keys[1:]
    xs = list(order) if order is not None else _first_seen(study.runs, key)
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
        y = np.array([value(run) for run in runs], dtype=float)
        by_x = np.argsort(x, kind="stable")
        lines.append((label, x[by_x], y[by_x]))
    return xs, lines


def sweep_verdicts(study, metric: str, order: list | None = None) -> list[list]:
    """Per line of :func:`sweep_series`, the stability verdict to mark at each point (None: none)."""
    key, others = study.keys[0], study.keys[1:]
    xs = list(order) if order is not None else _first_seen(study.runs, key)
    numeric = all(_is_number(v) for v in xs)
    groups: dict[str, list] = {}
    for run in study.runs:
        groups.setdefault(point_label({k: run.point.get(k) for k in others}), []).append(run)
    out = []
    for runs in groups.values():
        if numeric:
            x = np.array([float(run.point.get(key)) for run in runs])
        else:
            x = np.array([float(next(i for i, v in enumerate(xs) if _same(v, run.point.get(key)))) for run in runs])
        out.append([stability_verdict(runs[i]) for i in np.argsort(x, kind="stable")])
    return out


def _first_seen(runs, key) -> list:
    xs: list = []
    for run in runs:
        if not any(_same(run.point.get(key), seen) for seen in xs):
            xs.append(run.point.get(key))
    return xs


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def _nan_if_none(value):
    return math.nan if value is None else value


def last_zero(x: np.ndarray, y: np.ndarray) -> float | None:
    """The last x of the leading run of zeros in ``y`` (x ascending); None if ``y[0]`` is not 0."""
    last = None
    for xv, yv in zip(x, y):
        if yv != 0:  # NaN too
            break
        last = float(xv)
    return last


def sweep_figure(study, metrics, dpi: int, mark_last_zero: str | None = None) -> Figure | None:
    """One panel per metric of ``metrics`` present in the study; None if none is (or no key)."""
    if not study.keys or not study.runs:
        return None
    shape = " x ".join(f"{k} ({n})" for k, n in zip(study.keys, _value_counts(study)))
    return _figure(f"sweep: {study.name}", f"{len(study.runs)} runs over {shape}", study.keys[0],
                   [(None, study)], [], metrics, dpi, mark_last_zero)


def overlay_figure(name: str, studies, metrics, dpi: int, mark_last_zero: str | None = None) -> Figure | None:
    """Several runs in one figure: sweeps (sharing their first key) as lines, single runs as
    horizontal reference lines. None if there is no sweep with runs, or no metric to draw.

    :raises ValueError: the sweeps have different first keys.
    """
    sweeps = [s for s in studies if s.kind == "sweep" and s.keys and s.runs]
    refs = [s for s in studies if s.kind == "run" and s.runs]
    if not sweeps:
        return None
    key = sweeps[0].keys[0]
    for s in sweeps[1:]:
        if s.keys[0] != key:
            raise ValueError(f"overlays.{name}: sweep {s.name!r} varies {s.keys[0]!r}, "
                             f"not {key!r} like {sweeps[0].name!r}")
    parts = [f"{s.name} ({len(s.runs)} runs)" for s in sweeps] + [f"{s.name} (reference)" for s in refs]
    return _figure(f"sweeps: {name}", ", ".join(parts), key, [(s.name, s) for s in sweeps], refs,
                   metrics, dpi, mark_last_zero)


def _line_label(prefix: str | None, label: str, key: str) -> str:
    if prefix is None:
        return label or key
    return f"{prefix}: {label}" if label else prefix


def _figure(title: str, subtitle: str, key: str, sweeps, refs, metrics, dpi: int,
            mark_last_zero: str | None) -> Figure | None:
    every_run = [run for _, s in sweeps for run in s.runs] + [run for s in refs for run in s.runs]
    names = present_metrics(every_run, metrics)
    if not names:
        return None
    xs: list = []
    for _, s in sweeps:
        for v in _first_seen(s.runs, key):
            if not any(_same(v, seen) for seen in xs):
                xs.append(v)
    marks = _marks(sweeps, key, xs, mark_last_zero)
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig = new_figure(max(4.4 * ncols, MIN_FIGURE_WIDTH), 3.3 * nrows + 0.9, dpi)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    handles = {}
    for ax, metric in zip(axes, names):
        values = []
        i = 0
        for prefix, study in sweeps:
            _, lines = sweep_series(study, metric, xs)
            bands = interval_series(study, metric, xs)
            for (label, x, y), verdicts, (_, _, lo, hi) in zip(lines, sweep_verdicts(study, metric, xs), bands):
                text = _line_label(prefix, label, key)
                (line,) = ax.plot(x, y, marker="o", markersize=4.5, linewidth=1.5, label=text, **line_style(i))
                line.set_gid(f"sweep:{metric}:{i}")
                handles.setdefault(text, line)
                values.append(y)
                if np.isfinite(lo).any():
                    band = ax.fill_between(x, lo, hi, color=line_style(i)["color"], alpha=0.2, linewidth=0)
                    band.set_gid(f"interval:{metric}:{i}")
                    values += [lo, hi]
                for verdict, (color, legend) in STABILITY_STYLES.items():
                    at = np.array([v == verdict for v in verdicts], dtype=bool)
                    if at.any():
                        (ring,) = ax.plot(x[at], y[at], linestyle="none", marker="o", markersize=11,
                                          markerfacecolor="none", markeredgecolor=color, markeredgewidth=1.8,
                                          label=legend, zorder=4)
                        ring.set_gid(f"{verdict}:{metric}:{i}")
                        handles.setdefault(legend, ring)
                if i in marks:
                    mark = ax.axvline(marks[i][1], linestyle=":", linewidth=1.6, color=line_style(i)["color"])
                    mark.set_gid(f"mark:{metric}:{i}")
                i += 1
        for study in refs:
            value = _nan_if_none(metric_value(study.runs[0].metrics, metric))
            if math.isfinite(value):
                ref = ax.axhline(value, linestyle="--", linewidth=1.3, label=study.name,
                                 color=line_style(i)["color"])
                ref.set_gid(f"ref:{metric}:{study.name}")
                lo, hi = _interval_end(study.runs[0], metric, 0), _interval_end(study.runs[0], metric, 1)
                if math.isfinite(lo) and math.isfinite(hi):
                    band = ax.axhspan(lo, hi, color=line_style(i)["color"], alpha=0.15, linewidth=0)
                    band.set_gid(f"interval:{metric}:{study.name}")
                    values.append(np.array([lo, hi]))
                handles.setdefault(study.name, ref)
                values.append(np.array([value]))
            i += 1
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
    short = key.rsplit(".", 1)[-1]
    if marks:
        proxy = Line2D([], [], linestyle=":", linewidth=1.6, color="0.3",
                       label=f"last {short} with {mark_last_zero} = 0")
        handles[proxy.get_label()] = proxy
        listed = ", ".join(_position_text(x, xs) + (f" ({label})" if label != key else "")
                           for label, x in marks.values())
        subtitle += f"\n{mark_last_zero} = 0 up to {short} = {listed}"
    flagged = _flagged_text(sweeps)
    if flagged:
        subtitle += "\n" + flagged
    if len(handles) > 1 or marks:
        outside_legend(fig, list(handles.values()), list(handles), 6)  # (as many columns as fit)
    titles(fig, title, subtitle)
    return fig


MAX_FLAGGED_NAMES = 6


def _flagged_text(sweeps) -> str:
    """``unstable (waiting grows): rate=20, rate=40; too short to tell: rate=10`` for the subtitle."""
    parts = []
    for verdict, (_, legend) in STABILITY_STYLES.items():
        names = [_point_text(prefix, study, run) for prefix, study in sweeps for run in study.runs
                 if stability_verdict(run) == verdict]
        if names:
            shown = ", ".join(names[:MAX_FLAGGED_NAMES])
            more = len(names) - MAX_FLAGGED_NAMES
            parts.append(f"{legend}: {shown}" + (f" and {more} more" if more > 0 else ""))
    return "; ".join(parts)


def _point_text(prefix: str | None, study, run) -> str:
    label = point_label(run.point)
    return f"{prefix}: {label}" if prefix else label


def _marks(sweeps, key: str, xs: list, metric: str | None) -> dict[int, tuple[str, float]]:
    """Line index -> (its label, the x position to mark) for ``mark_last_zero``."""
    if metric is None:
        return {}
    marks = {}
    i = 0
    for prefix, study in sweeps:
        _, lines = sweep_series(study, metric, xs)
        for label, x, y in lines:
            at = last_zero(x, y)
            if at is not None:
                marks[i] = (_line_label(prefix, label, key), at)
            i += 1
    return marks


def _position_text(position: float, xs: list) -> str:
    """A marked x position as text: the value itself, or for text values the one at that index."""
    if all(_is_number(v) for v in xs):
        return tick_text(position)
    return _value_text(xs[int(position)])


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
    ax.set_xlabel(setting_label(key))
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
