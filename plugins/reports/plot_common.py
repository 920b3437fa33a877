"""Shared pieces of the plots: headless figures, metric lookup, units, axis scales, number text.

Figures are plain :class:`matplotlib.figure.Figure` objects drawn on an Agg canvas: no pyplot,
so no global figure state and no display is ever needed. Style is set per artist, never
through ``rcParams``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from schedlab.results.metrics import metric_at

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
LINESTYLES = ("-", "--", ":", "-.")
TITLE_SIZE = 12


def new_figure(width: float, height: float, dpi: int) -> Figure:
    """A figure with constrained layout on its own Agg canvas."""
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def line_style(i: int) -> dict[str, Any]:
    """Colour and dash for the i-th line: ten colours, then the colours again dashed, and so on."""
    return {"color": COLORS[i % len(COLORS)], "linestyle": LINESTYLES[(i // len(COLORS)) % len(LINESTYLES)]}


_ABSENT = object()


def metric_value(metrics: dict, name: str) -> float | None:
    """A dotted metric (``ttft_ms.p99``) as a float; None when absent, NaN when not a number."""
    node = metric_at(metrics, name, _ABSENT)
    if node is _ABSENT:
        return None
    if node is None or isinstance(node, bool) or not isinstance(node, (int, float, np.integer, np.floating)):
        return math.nan
    return float(node)


_FRACTIONS = ("utilisation", "utilization", "usage", "hit_rate", "attainment", "share", "time_above")
_COUNTS = {"avg_queue": "requests waiting", "avg_running": "sequences running", "peak_running": "sequences",
           "peak_waiting": "requests", "requests": "requests", "finished": "requests", "rejected": "requests",
           "met": "requests", "num_preemptions": "count", "iterations": "count", "generated_tokens": "tokens",
           "recomputed_tokens": "tokens", "queries": "tokens", "hits": "tokens"}


def metric_unit(name: str) -> str:
    """The unit of a dotted metric name, from the naming conventions of schedlab.results.metrics ('' if unknown)."""
    parts = name.split(".")
    for part in reversed(parts):
        if part.endswith("_ms"):
            return "ms"
        if part.endswith("_tps"):
            return "tokens/s"
        if part.endswith("_rps"):
            return "requests/s"
        if part.endswith("_bytes"):
            return "bytes"
        for suffix, unit in _ENERGY_UNITS:
            if part.endswith(suffix):
                return unit
        if any(word in part for word in _FRACTIONS):
            return "fraction"
    if parts[0] == "kv_usage":
        return "fraction"
    return _COUNTS.get(parts[-1], _COUNTS.get(parts[0], ""))


#: Energy metrics (schedlab.energy): suffix -> unit, ``j_per_token`` before ``_j``.
_ENERGY_UNITS = (("j_per_token", "J/token"), ("j_per_request", "J/request"), ("_j", "J"), ("_w", "W"),
                 ("kwh", "kWh"), ("kwh_per_hour", "kWh/h"))
_UNIT_SUFFIXES = ("_ms", "_tps", "_rps", "_bytes", "_j", "_w")
_READABLE = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "e2e latency", "queue": "queue time",
             "kv_usage": "KV usage", "slo": "SLO", "j_per_token": "per output token", "j_per_request": "per request",
             "avg_power": "average power", "peak_power": "peak power", "gpu": "GPU"}


def metric_label(name: str) -> str:
    """An axis label: the metric in words with its unit said once (``ttft_ms.p99`` ->
    ``TTFT p99 (ms)``, ``throughput_tps`` -> ``throughput (tokens/s)``); panel titles keep the
    dotted name, which is what settings use."""
    words = []
    for part in name.split("."):
        for suffix in _UNIT_SUFFIXES:
            if part.endswith(suffix) and len(part) > len(suffix):
                part = part[: -len(suffix)]
                break
        words.append(_READABLE.get(part, part))
    unit = metric_unit(name)
    text = " ".join(words)
    return f"{text} ({unit})" if unit else text


#: Units of settings that sweeps and searches vary, by the key's last part.
_SETTING_UNITS = {"rate": "requests/s", "max_num_seqs": "sequences",
                  "batch_size": "sequences", "num_blocks": "blocks", "block_size": "tokens per block",
                  "num_requests": "requests", "swap_blocks": "blocks", "min_batch": "requests"}


def setting_unit(key: str) -> str:
    """The unit of a dotted setting (``workload.rate`` -> requests/s), or '' when it has none."""
    last = key.rsplit(".", 1)[-1]
    if last in _SETTING_UNITS:
        return _SETTING_UNITS[last]
    for suffix, unit in (("_ms", "ms"), ("_gib", "GiB"), ("_gbps", "GB/s"), ("tokens", "tokens"),
                         ("_token_threshold", "tokens")):
        if last.endswith(suffix):
            return unit
    return ""


def setting_label(key: str) -> str:
    """``workload.rate (requests/s)``: an axis label for a swept or searched setting."""
    unit = setting_unit(key)
    return f"{key} ({unit})" if unit else key


def fmt_number(value: float | None) -> str:
    """Short text for a number in titles ('-' for missing or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if float(value).is_integer() and abs(value) < 1e9:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def fmt_percent(value: float | None) -> str:
    """A fraction as a percentage ('-' for missing or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.0f}%"


def wide_positive_range(values, ratio: float = 10.0) -> bool:
    """True when every value is finite and > 0 and max/min >= ratio: a log axis reads better."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size < 2 or (arr <= 0).any():
        return False
    return float(arr.max()) / float(arr.min()) >= ratio


def use_log_scale(ax, which: str, values) -> None:
    """Put the ``which`` ("x" or "y") axis of ``ax`` on a log scale with plain-number ticks.

    Ticks at 1, 2, 5 x 10^k for up to two decades of ``values``, 1 and 3 x 10^k up to three and
    a half (at 1, 2, 5 over three decades a narrow panel's labels ran together: "5001000 2000"),
    at powers of ten beyond.
    """
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr) & (arr > 0)]
    decades = math.log10(arr.max() / arr.min()) if arr.size else 0.0
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    subs = (1.0, 2.0, 5.0) if decades <= 2 else (1.0, 3.0) if decades <= 3.5 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(tick_text))
    axis.set_minor_formatter(NullFormatter())


def tick_text(value: float, _pos=None) -> str:
    """Compact tick labels: 5, 0.2, 2000, 10k, 1.5M; 16384 stays 16384 (not 16.384k)."""
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e4:
        short = f"{value / 1e3:g}k"
        return short if len(short) <= 5 or not float(value).is_integer() else f"{value:.0f}"
    return f"{value:g}"


def prefers_log_axis(values) -> bool:
    """Positive values that span a factor of 10, or that are spaced evenly by ratio rather
    than by difference (5, 10, 20, 40): a log axis reads better."""
    arr = np.unique(np.asarray([v for v in values if v is not None], dtype=float))
    arr = arr[np.isfinite(arr)]
    if arr.size < 2 or (arr <= 0).any():
        return False
    if arr.max() / arr.min() >= 10:
        return True
    if arr.size < 3 or arr.max() / arr.min() < 3:
        return False
    steps, ratios = np.diff(arr), np.diff(np.log(arr))
    return float(ratios.std() / ratios.mean()) < float(steps.std() / steps.mean())


#: How the plots mark runs by stability verdict (schedlab.results.stability): colour and legend text.
STABILITY_STYLES = {"unstable": ("#d62728", "unstable (waiting grows)"),
                    "inconclusive": ("#ff7f0e", "waiting grows, run too short to tell")}


def drawn_replica(run):
    """What a figure of one run's requests or timeline describes: a replicated run keeps replica 1's
    rows (:func:`schedlab.study.replicas.combine`), so the run with replica 1's own metrics (its
    counts, KV numbers and stability fit, not the means over replicas); any other run itself."""
    if not getattr(run, "replicas", None):
        return run
    import attrs

    return attrs.evolve(run, metrics=run.replicas[0].metrics)


def replica_note(run) -> str:
    """`` (replica 1 of N)`` after a replicated run's name in a figure drawing replica 1, else ''."""
    count = len(getattr(run, "replicas", None) or ())
    return f" (replica 1 of {count})" if count else ""


def stability_verdict(run) -> str | None:
    """``"unstable"`` or ``"inconclusive"`` when the plots should mark the run, else None."""
    stability = run.metrics.get("stability") if isinstance(run.metrics, dict) else None
    verdict = stability.get("verdict") if isinstance(stability, dict) else None
    return verdict if verdict in STABILITY_STYLES else None


def stability_suffix(run) -> str:
    """`` (unstable)`` / `` (inconclusive)`` for labels of marked runs, else ''."""
    verdict = stability_verdict(run)
    return f" ({verdict})" if verdict else ""


def note(ax, text: str) -> None:
    """Grey centred text in an empty panel (e.g. 'no finished requests')."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.45", fontsize=10)


def titles(fig: Figure, title: str, subtitle: str = "") -> None:
    """Figure title, with an optional second line (headline numbers, a search's outcome), wrapped
    to the figure's width (:func:`wrap_to_width`)."""
    text = title + (f"\n{subtitle}" if subtitle else "")
    fig.suptitle(wrap_to_width(fig, text, TITLE_SIZE), fontsize=TITLE_SIZE)


#: the share of a figure's width that wrapped titles and fitted legends may take
TEXT_WIDTH_SHARE = 0.96


def _text_width(fig: Figure, text: str, fontsize: float) -> float:
    """The drawn width (pixels) of one line of ``text`` at ``fontsize`` on ``fig``."""
    probe = fig.text(0, 0, text, fontsize=fontsize)
    try:
        return probe.get_window_extent(fig.canvas.get_renderer()).width
    finally:
        probe.remove()


def wrap_to_width(fig: Figure, text: str, fontsize: float, share: float = TEXT_WIDTH_SHARE) -> str:
    """``text`` with each of its lines wrapped so that it fits ``share`` of the figure's width when
    drawn at ``fontsize``: at the ends of its list items (after ", " and "; ") where that is enough
    -- a run's setting stays on one line with what names it --, else at spaces (a single word
    longer than the width stays whole)."""
    import re

    room = fig.bbox.width * share

    def fits(piece: str) -> bool:
        return _text_width(fig, piece, fontsize) <= room

    out = []
    for line in text.split("\n"):
        if not line.strip() or fits(line):
            out.append(line)
            continue
        current = ""
        for item in re.split(r"(?<=[,;]) ", line):
            joined = f"{current} {item}" if current else item
            if fits(joined):
                current = joined
                continue
            if current:
                out.append(current)
            if fits(item):
                current = item
                continue
            words, current = item.split(" "), ""  # an item too wide alone: at its spaces
            for word in words:
                joined = f"{current} {word}" if current else word
                if current and not fits(joined):
                    out.append(current)
                    current = word
                else:
                    current = joined
        if current:
            out.append(current)
    return "\n".join(out)


def outside_legend(fig: Figure, handles: list, labels: list, max_ncol: int, share: float = TEXT_WIDTH_SHARE):
    """A legend below the panels (``loc="outside lower center"``) that fits the figure's width: as
    many columns as fit, up to ``max_ncol``; with one column still too wide, long labels wrapped."""
    labels = [str(label) for label in labels]
    room = fig.bbox.width * share
    renderer = fig.canvas.get_renderer()

    def make(texts: list, ncol: int):
        return fig.legend(handles, texts, loc="outside lower center", ncol=ncol, frameon=False)

    for ncol in range(max(1, min(max_ncol, len(labels))), 0, -1):
        legend = make(labels, ncol)
        if legend.get_window_extent(renderer).width <= room or ncol == 1:
            break
        legend.remove()
    if legend.get_window_extent(renderer).width > room:
        fontsize = legend.get_texts()[0].get_fontsize() if legend.get_texts() else TITLE_SIZE
        legend.remove()
        # (room for the text: the figure less the legend's handle and padding)
        wrapped = [wrap_to_width(fig, label, fontsize, share * 0.8) for label in labels]
        legend = make(wrapped, 1)
    return legend
