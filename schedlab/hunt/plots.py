"""A hunt's pictures: the search against random sampling, and the counterexample under every policy.

* ``search.png`` -- the objective of every candidate in evaluation order (dots) and the worst
  found so far (steps), for the search and for random sampling of the same bounds; a
  property's threshold as a dashed line;
* ``counterexample.png`` -- one panel per run of the file: each request of the shrunk workload
  as a bar from its arrival to its finish, split into waiting, prefill and decode, so the
  policies can be compared request by request (``@k``: served by instance k);
* ``timeline_<run>.png`` -- each run's running / waiting / KV-usage timeline on the
  counterexample (the ``plots`` report's timeline figure).
"""

from __future__ import annotations

import textwrap

import numpy as np

from .config import Goal

PHASES = (("waiting", "#bbbbbb"), ("prefill", "#ff7f0e"), ("decode", "#1f77b4"))
DPI = 110


def _png(fig) -> bytes:
    """PNG bytes through the plots report's writer, which keeps matplotlib's glyph and layout
    warnings off stderr."""
    from schedlab_plugins.reports.plots import png_bytes
    return png_bytes(fig, DPI)


def running_best(values: np.ndarray, direction: int) -> np.ndarray:
    """The worst-for-the-policy value so far at every evaluation (NaN until one is feasible)."""
    out = np.full(values.shape, np.nan)
    best = np.nan
    for i, v in enumerate(values):
        if not np.isnan(v) and (np.isnan(best) or direction * v > direction * best):
            best = v
        out[i] = best
    return out


def search_figure(curves: dict[str, np.ndarray], goal: Goal) -> bytes:
    """``curves``: label -> each evaluation's value (NaN when infeasible), in evaluation order."""
    from schedlab_plugins.reports.plot_common import line_style, new_figure, titles

    fig = new_figure(8.0, 4.8, DPI)
    ax = fig.subplots()
    for k, (label, values) in enumerate(curves.items()):
        style = line_style(k)
        x = np.arange(1, values.size + 1)
        ax.scatter(x, values, s=6, alpha=0.25, color=style["color"])
        best = running_best(values, goal.direction)
        (line,) = ax.plot(x, best, drawstyle="steps-post", linewidth=1.8, label=f"{label}: worst so far", **style)
        line.set_gid(f"hunt:{label}")
    if goal.property is not None:
        ax.axhline(goal.property.threshold, color="0.3", linestyle="--", linewidth=1.0,
                   label=f"property: {goal.property.text}")
    ax.set_xlabel("workloads evaluated")
    ax.set_ylabel(goal.expression.text if len(goal.expression.text) < 50 else "objective")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    titles(fig, "hunt: the search against random sampling", textwrap.fill(goal.describe(), 80))
    return _png(fig)


#: Requests drawn per run in the counterexample figure: the slowest, when there are more (a
#: 10,000-request counterexample took minutes to draw, its labels one unreadable block).
ROWS = 40


def rows_drawn(requests: dict) -> np.ndarray:
    """Which requests (positions in the columns, in id order) the figure draws: every one, or the
    :data:`ROWS` with the longest arrival-to-finish time (rejected ones first)."""
    n = requests["id"].size
    if n <= ROWS:
        return np.arange(n)
    span = np.where(requests["rejected"] == 0, requests["finish_ms"] - requests["arrival_ms"], np.inf)
    return np.sort(np.argsort(-np.nan_to_num(span, nan=np.inf), kind="stable")[:ROWS])


def counterexample_figure(runs: dict, subtitle: str) -> bytes:
    """Per run, each request (up to :data:`ROWS`: :func:`rows_drawn`) as waiting / prefill /
    decode bars on a shared time axis."""
    from schedlab_plugins.reports.plot_common import new_figure, titles

    names = list(runs)
    count = max(r.requests["id"].size for r in runs.values())
    if count > ROWS:
        subtitle += f" (the {ROWS} slowest of {count} requests each)"
    fig = new_figure(9.0, 1.2 + len(names) * (0.6 + 0.25 * min(count, ROWS)), DPI)
    axes = np.atleast_1d(fig.subplots(len(names), 1, sharex=True))
    for ax, name in zip(axes, names):
        req = runs[name].requests
        rows = rows_drawn(req)
        y = np.arange(rows.size)
        ok = req["rejected"][rows] == 0
        arrival, scheduled = req["arrival_ms"][rows] / 1e3, req["first_scheduled_ms"][rows] / 1e3
        first, finish = req["first_token_ms"][rows] / 1e3, req["finish_ms"][rows] / 1e3
        spans = {"waiting": (arrival, scheduled), "prefill": (scheduled, first), "decode": (first, finish)}
        for phase, color in PHASES:
            start, end = spans[phase]
            bars = ax.barh(y[ok], (end - start)[ok], left=start[ok], color=color, height=0.7,
                           label=phase if ax is axes[0] else None)
            for bar in bars:
                bar.set_gid(f"counterexample:{name}:{phase}")
        for k in np.flatnonzero(~ok):
            ax.text(arrival[k], y[k], " rejected", va="center", fontsize=8, color="#d62728")
        ax.set_yticks(y)
        labels = [f"{i}: {p}+{o}" for i, p, o in zip(req["id"][rows], req["prompt_tokens"][rows],
                                                     req["output_tokens"][rows])]
        if (runs[name].meta.get("instances") or 1) > 1:  # which instance served it
            labels = [f"{text} @{k}" for text, k in zip(labels, req["instance"][rows])]
        ax.set_yticklabels(labels, fontsize=7 if rows.size > 12 else 8)
        ax.invert_yaxis()
        ax.set_ylabel(name)
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1].set_xlabel("time (s)")
    fig.legend(loc="outside lower center", ncol=3, frameon=False)
    titles(fig, "counterexample: each request (prompt+output tokens) under every policy",
           textwrap.fill(subtitle, 90))
    return _png(fig)


def timeline_png(run) -> bytes | None:
    """The run's timeline figure, or None when it recorded none."""
    from schedlab_plugins.reports.plot_timeline import has_timeline, timeline_figure

    return _png(timeline_figure(run, DPI)) if has_timeline(run) else None
