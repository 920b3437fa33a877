"""Latency CDFs: TTFT, TPOT and end-to-end latency, one panel each, one line per run.

Each line is the empirical CDF of a run's finished requests (rejected ones have no latency).
A panel's x axis is logarithmic when its values span more than a factor of 20 (queueing
spreads TTFT and e2e over decades; TPOT usually sits in a narrow band).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from schedlab.results.storage import latencies

from .plot_common import drawn_replica, line_style, metric_label, new_figure, note, outside_legend, replica_note, \
    stability_suffix, titles, use_log_scale, wide_positive_range

PANELS = (("ttft_ms", "time to first token"), ("tpot_ms", "time per output token"), ("e2e_ms", "end-to-end latency"))
MAX_CDF_POINTS = 4000  # more requests than this: the CDF is drawn through this many evenly spaced ranks


def cdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step-CDF vertices of the finite values: ``(min, 0)``, then each sorted value with its
    cumulative fraction (i/n for the i-th smallest). Empty input gives empty arrays."""
    values = np.asarray(values, dtype=float)
    x = np.sort(values[np.isfinite(values)])
    n = x.size
    if n == 0:
        return np.empty(0), np.empty(0)
    y = np.arange(1, n + 1, dtype=float) / n
    if n > MAX_CDF_POINTS:
        keep = np.unique(np.linspace(0, n - 1, MAX_CDF_POINTS).round().astype(np.int64))
        x, y = x[keep], y[keep]
    return np.concatenate(([x[0]], x)), np.concatenate(([0.0], y))


def latency_cdf_figure(runs, title: str, dpi: int, labels: list[str] | None = None) -> Figure:
    """Three panels (TTFT, TPOT, e2e; ms) with one CDF line per run.

    :param runs: :class:`schedlab.results.RunResult` objects, fresh or loaded.
    :param labels: legend text per run (default: the run names).
    """
    labels = [_with_counts(label, run) for label, run in zip(labels or [run.name for run in runs], runs)]
    fig = new_figure(13.0, 4.4, dpi)
    axes = fig.subplots(1, len(PANELS), sharey=True)
    samples = [latencies(run) for run in runs]
    handles = {}
    for ax, (metric, description) in zip(axes, PANELS):
        drawn = []
        for i, (label, lat) in enumerate(zip(labels, samples)):
            x, y = cdf_points(lat[metric])
            if x.size == 0:
                continue
            (line,) = ax.plot(x, y, drawstyle="steps-post", linewidth=1.6, label=label, **line_style(i))
            line.set_gid(f"cdf:{metric}:{i}")
            handles.setdefault(label, line)
            drawn.append(x)
        ax.set_title(description, fontsize=11)
        ax.set_xlabel(metric_label(metric))
        ax.grid(True, which="major", alpha=0.3)
        if not drawn:
            note(ax, "no finished requests" if metric != "tpot_ms" else "no request with 2+ tokens")
            continue
        pooled = np.concatenate(drawn)
        if wide_positive_range(pooled, ratio=20.0):
            use_log_scale(ax, "x", pooled)
        for level in (0.5, 0.9, 0.99):
            ax.axhline(level, color="0.6", linewidth=0.7, linestyle=":", zorder=0)
    axes[0].set_ylabel("fraction of finished requests")
    axes[0].set_ylim(0, 1.02)
    axes[0].set_yticks([0, 0.25, 0.5, 0.75, 0.9, 0.99])
    if handles:
        outside_legend(fig, list(handles.values()), list(handles), 6)
    empty = [label for label, lat in zip(labels, samples) if lat["e2e_ms"].size == 0]
    titles(fig, title, f"no finished requests: {', '.join(empty)}" if empty else "")
    return fig


def _with_counts(label: str, run) -> str:
    """``name (4/100 finished)`` when some requests were rejected, else the name; `` (unstable)``
    after an overloaded run's name; a replicated run is ``name (replica 1 of N)`` with replica 1's
    counts and verdict, as its curves are replica 1's."""
    label += replica_note(run)
    run = drawn_replica(run)  # (a replicated run draws replica 1's requests: its counts)
    finished, total = run.metrics.get("finished"), run.metrics.get("requests")
    label += stability_suffix(run)
    if isinstance(finished, int) and isinstance(total, int) and finished < total:
        return f"{label} ({finished}/{total} finished)"
    return label
