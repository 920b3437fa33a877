"""An SLO search: every probe's value of the searched key against the constraint's metric.

Passing probes are green dots, failing ones red crosses; a thin grey line joins the probes in
key order to show the trend. The constraint's threshold is a dashed horizontal line and the
value the search chose a vertical line with a star on its probe. A probe whose metric has no
value (NaN, e.g. nothing finished) is drawn as a red triangle at the bottom edge. Probes whose
run is missing from saved results are skipped. The outcome sentence is the subtitle.

A search with several constraints (``constraints = [...]``) gets one panel per constraint, one
above the other on the same key axis, each with its metric and threshold: a probe is a red
cross in the panels of the constraints it fails, a green dot where every constraint holds, and
a hollow green circle where this panel's constraint holds but another fails. Gids carry the
panel's index: ``search:passes:0``, ``threshold:1``, ``chosen:probe:0``, ...
"""

from __future__ import annotations

import math
import numbers
import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from schedlab.errors import ConfigError
from schedlab.results.storage import constraint_list
from schedlab.study.search import COMPARE, parse_constraint

from .plot_common import metric_label, new_figure, setting_label, titles, use_log_scale, wide_positive_range

PASS_COLOR = "#2ca02c"
FAIL_COLOR = "#d62728"
CHOSEN_COLOR = "#1f77b4"


def probe_points(study, constraint=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Key values, metric values (NaN when missing) and pass flags (the probe's: every constraint
    held) of the probes that have a run, in probe order; the metric is ``constraint``'s (default:
    the study's one constraint)."""
    constraint = parse_constraint(study.constraint) if constraint is None else constraint
    xs, ys, ok = [], [], []
    for probe in study.search.probes:
        if probe.payload is None:
            continue
        try:
            value = constraint.value(probe.payload.metrics)
        except ConfigError:
            value = math.nan
        xs.append(float(probe.value))
        ys.append(value)
        ok.append(bool(probe.holds))
    return np.array(xs, dtype=float), np.array(ys, dtype=float), np.array(ok, dtype=bool)


def search_figure(study, dpi: int) -> Figure | None:
    """The probes of a search study; None when the study has no search outcome."""
    outcome = study.search
    if outcome is None or not study.constraint:
        return None
    texts = constraint_list(study.constraint)
    if len(texts) > 1:
        return _panels_figure(study, [parse_constraint(text) for text in texts], dpi)
    constraint = parse_constraint(study.constraint)
    key = study.keys[0] if study.keys else "value"
    x, y, ok = probe_points(study)
    fig = new_figure(8.5, 5.4, dpi)
    ax = fig.subplots()
    finite = np.isfinite(y)
    order = np.argsort(x, kind="stable")
    trend = order[finite[order]]
    if trend.size > 1:
        (line,) = ax.plot(x[trend], y[trend], color="0.7", linewidth=1.0, zorder=1)
        line.set_gid("search:trend")
    groups = ((ok & finite, "o", PASS_COLOR, "passes"), (~ok & finite, "X", FAIL_COLOR, "fails"))
    for sel, marker, color, word in groups:
        if sel.any():
            (line,) = ax.plot(x[sel], y[sel], linestyle="none", marker=marker, markersize=8, color=color,
                              label=f"{word} {constraint}", zorder=3)
            line.set_gid(f"search:{word}")
    if (~finite).any():
        (line,) = ax.plot(x[~finite], np.zeros(int((~finite).sum())), linestyle="none", marker="v", markersize=8,
                          color=FAIL_COLOR, label="fails: no value", transform=ax.get_xaxis_transform(),
                          clip_on=False, zorder=3)
        line.set_gid("search:no-value")
    threshold = ax.axhline(constraint.threshold, color="0.25", linestyle="--", linewidth=1.2,
                           label=f"threshold {constraint.metric} = {constraint.threshold:g}", zorder=2)
    threshold.set_gid("threshold")
    if outcome.value is not None:
        chosen = ax.axvline(float(outcome.value), color=CHOSEN_COLOR, linewidth=1.4, alpha=0.8,
                            label=f"chosen {key} = {outcome.value:g}", zorder=2)
        chosen.set_gid("chosen")
        at = np.flatnonzero((x == float(outcome.value)) & finite)
        if at.size:
            (star,) = ax.plot(x[at[:1]], y[at[:1]], linestyle="none", marker="*", markersize=17,
                              markerfacecolor="none", markeredgecolor=CHOSEN_COLOR, markeredgewidth=1.5, zorder=4)
            star.set_gid("chosen:probe")
    if wide_positive_range(x, ratio=10.0):
        use_log_scale(ax, "x", x)
    elif all(isinstance(p.value, numbers.Integral) for p in outcome.probes):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ys = np.append(y[finite], constraint.threshold)
    if wide_positive_range(ys, ratio=30.0):
        use_log_scale(ax, "y", ys)
    ax.set_xlabel(setting_label(key))
    ax.set_ylabel(metric_label(constraint.metric))
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 3), frameon=False)
    subtitle = "\n".join(textwrap.wrap(f"{outcome.message}  ({len(x)} runs)", 90))
    titles(fig, f"search: {study.name}", subtitle)
    return fig


def _panels_figure(study, constraints: list, dpi: int) -> Figure:
    """One panel per constraint, sharing the key axis (see the module docstring)."""
    outcome = study.search
    key = study.keys[0] if study.keys else "value"
    fig = new_figure(8.5, 1.9 + 2.6 * len(constraints), dpi)
    axes = fig.subplots(len(constraints), 1, sharex=True, squeeze=False)[:, 0]
    shown: dict[str, object] = {}  # legend label -> handle, first panel's first
    x = np.zeros(0)
    for i, (ax, constraint) in enumerate(zip(axes, constraints)):
        x, y, ok = probe_points(study, constraint)
        held = np.array([_holds(constraint, v) for v in y], dtype=bool)
        finite = np.isfinite(y)
        order = np.argsort(x, kind="stable")
        trend = order[finite[order]]
        if trend.size > 1:
            (line,) = ax.plot(x[trend], y[trend], color="0.7", linewidth=1.0, zorder=1)
            line.set_gid(f"search:trend:{i}")
        groups = ((ok & finite, "o", PASS_COLOR, PASS_COLOR, "passes", "every constraint holds"),
                  (~ok & held & finite, "o", "none", PASS_COLOR, "holds-here", "holds here, another fails"),
                  (~held & finite, "X", FAIL_COLOR, FAIL_COLOR, "fails", "fails this panel's constraint"))
        for sel, marker, face, edge, word, label in groups:
            if sel.any():
                (line,) = ax.plot(x[sel], y[sel], linestyle="none", marker=marker, markersize=8,
                                  markerfacecolor=face, markeredgecolor=edge, markeredgewidth=1.5,
                                  color=edge, label=label, zorder=3)
                line.set_gid(f"search:{word}:{i}")
        if (~finite).any():
            (line,) = ax.plot(x[~finite], np.zeros(int((~finite).sum())), linestyle="none", marker="v",
                              markersize=8, color=FAIL_COLOR, label="fails: no value",
                              transform=ax.get_xaxis_transform(), clip_on=False, zorder=3)
            line.set_gid(f"search:no-value:{i}")
        threshold = ax.axhline(constraint.threshold, color="0.25", linestyle="--", linewidth=1.2,
                               label="threshold", zorder=2)
        threshold.set_gid(f"threshold:{i}")
        if outcome.value is not None:
            chosen = ax.axvline(float(outcome.value), color=CHOSEN_COLOR, linewidth=1.4, alpha=0.8,
                                label=f"chosen {key} = {outcome.value:g}", zorder=2)
            chosen.set_gid(f"chosen:{i}")
            at = np.flatnonzero((x == float(outcome.value)) & finite)
            if at.size:
                (star,) = ax.plot(x[at[:1]], y[at[:1]], linestyle="none", marker="*", markersize=17,
                                  markerfacecolor="none", markeredgecolor=CHOSEN_COLOR, markeredgewidth=1.5,
                                  zorder=4)
                star.set_gid(f"chosen:probe:{i}")
        ys = np.append(y[finite], constraint.threshold)
        if wide_positive_range(ys, ratio=30.0):
            use_log_scale(ax, "y", ys)
        ax.set_ylabel(metric_label(constraint.metric))
        ax.set_title(str(constraint), fontsize="medium", loc="left")
        ax.grid(True, alpha=0.3)
        for handle, label in zip(*ax.get_legend_handles_labels()):
            shown.setdefault(label, handle)
    last = axes[-1]
    if wide_positive_range(x, ratio=10.0):
        use_log_scale(last, "x", x)
    elif all(isinstance(p.value, numbers.Integral) for p in outcome.probes):
        last.xaxis.set_major_locator(MaxNLocator(integer=True))
    last.set_xlabel(setting_label(key))
    fig.legend(list(shown.values()), list(shown), loc="outside lower center", ncol=min(len(shown), 3),
               frameon=False)
    subtitle = "\n".join(textwrap.wrap(f"{outcome.message}  ({len(x)} runs)", 90))
    titles(fig, f"search: {study.name}", subtitle)
    return fig


def _holds(constraint, value: float) -> bool:
    """Whether ``constraint`` holds for the metric value ``value`` (NaN never does)."""
    return not math.isnan(value) and COMPARE[constraint.op](value, constraint.threshold)
