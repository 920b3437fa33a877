"""Single runs side by side: one horizontal bar per run for each metric, the best run highlighted.

``[reports.plots] compare_metrics = ["per_class.interactive.ttft_ms.p99", ...]`` draws
``compare.png``: one panel per metric (dotted names reach into nested metrics), one bar per
single run (study kind "run", in file order, top to bottom), the value written at the end of
each bar. With ``best = "<metric>"`` (and ``best_is``) the best run(s) by that metric -- which
need not be one of the panels -- get a highlighted bar in every panel, "(best)" after their
name, and a line in the subtitle. A run without a value for a metric gets no bar and a "-".
A panel whose positive values span a factor of 30 or more gets a log axis. An overloaded run
(see :mod:`schedlab.results.stability`) gets "(unstable)" or "(inconclusive)" after its name and a
hatched bar outlined in red or orange (dark grey on a best run's orange bar): its latencies depend
on how long it ran.
Runs with replicas draw their mean, with an error bar for the 95% confidence interval (gid
``interval:<metric>:<run name>``).
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from .best import best_runs, best_text
from .plot_common import COLORS, STABILITY_STYLES, fmt_number, metric_unit, metric_value, new_figure, note, \
    stability_suffix, stability_verdict, titles, use_log_scale, wide_positive_range

PLAIN_COLOR = "#8fa9c4"
BEST_COLOR = COLORS[1]
BEST_LABEL = " (best)"


def compare_figure(runs, metrics, dpi: int, best: str | None = None, best_is: str = "highest",
                   title: str = "single runs compared") -> Figure | None:
    """The figure, or None when there is no run or no run has any of ``metrics``.

    Each bar's gid is ``bar:<metric>:<run name>``, each best bar's ``best:<metric>:<run name>``.
    """
    names = [m for m in metrics if any(metric_value(run.metrics, m) is not None for run in runs)]
    if not runs or not names:
        return None
    winners, top = best_runs(runs, best, best_is) if best else ([], None)
    marked = {id(run) for run in winners}
    labels = [run.name + (BEST_LABEL if id(run) in marked else "") + stability_suffix(run) for run in runs]
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    height = max(2.6, 0.32 * len(runs) + 1.3)
    fig = new_figure(max(4.6 * ncols, 7.0), height * nrows + 0.7, dpi)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    y = np.arange(len(runs))
    for ax, metric in zip(axes, names):
        values = np.array([_nan_if_none(metric_value(run.metrics, metric)) for run in runs])
        tops = np.array([max(value, _interval(run, metric)[1]) if _interval(run, metric) else value
                         for run, value in zip(runs, values)])  # where each bar's text goes
        finite = values[np.isfinite(values)]
        log = wide_positive_range(finite, ratio=30.0)
        for i, (run, value) in enumerate(zip(runs, values)):
            is_best = id(run) in marked
            if math.isfinite(value):
                verdict = stability_verdict(run)
                # (on a best bar's fill -- the same orange as "inconclusive" -- the hatch and
                # outline are dark, else they could not be seen)
                edge = ("0.2" if is_best else STABILITY_STYLES[verdict][0]) if verdict \
                    else "0.2" if is_best else "none"
                (bar,) = ax.barh(y[i], value, height=0.7, color=BEST_COLOR if is_best else PLAIN_COLOR,
                                 edgecolor=edge, linewidth=1.2, hatch="//" if verdict else None)
                bar.set_gid(f"{'best' if is_best else 'bar'}:{metric}:{run.name}")
                pair = _interval(run, metric)
                if pair:
                    bars = ax.errorbar(value, y[i], xerr=[[value - pair[0]], [pair[1] - value]], fmt="none",
                                       ecolor="0.15", elinewidth=1.1, capsize=3)
                    bars.lines[2][0].set_gid(f"interval:{metric}:{run.name}")
                ax.annotate(fmt_number(value), (tops[i], y[i]), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=8, fontweight="bold" if is_best else "normal")
            else:  # no bar: a dash at the axis' left edge (x in axes fractions, y in data)
                ax.annotate("-", (0.0, y[i]), xycoords=ax.get_yaxis_transform(), xytext=(3, 0),
                            textcoords="offset points", va="center", fontsize=8)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=9)
        for tick, run in zip(ax.get_yticklabels(), runs):
            if id(run) in marked:
                tick.set_fontweight("bold")
        ax.set_ylim(len(runs) - 0.5, -0.5)  # file order, top to bottom, a row for every run
        ax.set_xlabel(metric_unit(metric))  # the panel title names the metric
        ax.set_title(metric, fontsize=11)
        ax.grid(True, axis="x", alpha=0.3)
        if not finite.size:
            note(ax, "no values (NaN)")
        elif log:
            use_log_scale(ax, "x", finite)
            ax.set_xlim(float(finite.min()) / 2, float(finite.max()) * 4)
        else:
            lo, hi = float(min(finite.min(), 0.0)), float(max(np.nanmax(tops), 0.0))
            ax.set_xlim(lo * 1.25, hi * 1.25 if hi > 0 else 1.0)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    subtitle = f"{len(runs)} runs"
    if best:
        subtitle += "; " + best_text(best, best_is, winners, top)
    titles(fig, title, subtitle)
    return fig


def _interval(run, metric: str) -> tuple[float, float] | None:
    """The run's 95% interval of ``metric`` (replicated runs), or None."""
    pair = (getattr(run, "intervals", None) or {}).get(metric)
    if pair and all(v is not None and math.isfinite(v) for v in pair):
        return float(pair[0]), float(pair[1])
    return None


def _nan_if_none(value):
    return math.nan if value is None else value
