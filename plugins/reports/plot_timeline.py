"""A run's timeline: running sequences, waiting requests, KV usage and GPU power over time.

Three stacked panels share the time axis (seconds) -- four in a run with ``[power]``, whose
last panel is the GPUs' power of each instance (:func:`schedlab.energy.timeline.power_steps`:
each row's energy over its duration while iterations run, standby and then idle power
between them; its integral is the run's energy). Lines are steps: each timeline sample is
the state during the iteration starting at its time, so it holds until the next sample -- or,
when the engine went idle before it, until the iteration ended: from there the running and
waiting counts are the requests' own (an idle engine drawn idle; colocated runs). The
last sample of an instance is held until that instance's last request finished, so the final
iteration (or bulk decode run) keeps its width. KV usage is the fraction of an instance's
blocks in use; the run's cumulative preemptions are a second (red) axis on the KV panel.

An overloaded run (see :mod:`schedlab.results.stability`) says so in the subtitle, and the waiting
panel shows the fitted trend of its waiting queue over the arrival window as a dashed line
(per instance when the run has several): the growth the verdict is about.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from schedlab.results.stability import admission_times, stability_text, waiting_at

from .plot_common import STABILITY_STYLES, fmt_number, fmt_percent, line_style, metric_value, new_figure, \
    drawn_replica, outside_legend, replica_note, stability_verdict, titles

PREEMPTION_COLOR = "#d62728"
HIGH_WATER = 0.9


def has_timeline(run) -> bool:
    """True when the run recorded timeline samples (``[experiment] timeline = true``)."""
    return run.timeline.get("time_ms", np.empty(0)).size > 0


def _number(value) -> float | None:
    """``value`` as a positive finite number, or None (a results folder's meta may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        return None
    return float(value)


def _blocks_per_instance(run) -> float | None:
    blocks = _number(run.meta.get("num_blocks"))
    instances = _number(run.meta.get("instances")) or 1.0
    return None if blocks is None else blocks / instances


def instance_series(run) -> list[tuple[int, dict[str, np.ndarray]]]:
    """Per instance (in instance order): time (s), running, waiting and KV (fraction, or blocks
    when the run's block count is unknown), with the closing point described in the module doc."""
    t = run.timeline
    per_instance = _blocks_per_instance(run)
    finished = run.requests["rejected"] == 0
    colocated = not np.any(run.requests.get("prefill_instance", np.empty(0)) >= 0)
    out = []
    for inst in np.unique(t["instance"]):
        sel = t["instance"] == inst
        order = np.argsort(t["time_ms"][sel], kind="stable")
        time_ms = t["time_ms"][sel][order]
        cols = {name: t[name][sel][order] for name in ("running", "waiting", "kv_used")}
        mine = finished & (run.requests["instance"] == int(inst))
        if "duration_ms" in t and colocated:
            time_ms, cols = _with_idle_gaps(time_ms, t["duration_ms"][sel][order], cols, run.requests,
                                            run.requests["instance"] == int(inst))
        end = float(run.requests["finish_ms"][mine].max()) if mine.any() else float(time_ms[-1])
        if end > time_ms[-1]:
            time_ms = np.append(time_ms, end)
            cols = {name: np.append(v, v[-1]) for name, v in cols.items()}
        if per_instance:
            cols["kv_used"] = cols["kv_used"] / per_instance
        out.append((int(inst), {"time_s": time_ms / 1e3, **cols}))
    return out


def _with_idle_gaps(time_ms: np.ndarray, duration_ms: np.ndarray, cols: dict, req: dict, mine: np.ndarray):
    """The samples with one more where an iteration ended before the next began (the engine idle):
    running and waiting there from the instance's requests -- scheduled and not yet finished, arrived
    and not yet scheduled -- so an idle engine is drawn idle, not holding its last batch. KV usage
    holds (a prefix cache keeps its blocks)."""
    ends = time_ms + duration_ms
    gap = np.flatnonzero(ends[:-1] < time_ms[1:])
    if not gap.size:
        return time_ms, cols
    at = ends[gap]
    scheduled = mine & (req["first_scheduled_ms"] >= 0)
    running = (np.searchsorted(np.sort(req["first_scheduled_ms"][scheduled]), at, "right")
               - np.searchsorted(np.sort(req["finish_ms"][scheduled]), at, "right"))
    waiting = waiting_at(np.sort(req["arrival_ms"][mine]), np.sort(admission_times(req)[mine]), at)
    added = {"running": running, "waiting": waiting, "kv_used": cols["kv_used"][gap]}
    order = np.argsort(np.concatenate((time_ms, at)), kind="stable")
    return (np.concatenate((time_ms, at))[order],
            {name: np.concatenate((v, added[name])).astype(float)[order] for name, v in cols.items()})


def preemption_steps(run) -> tuple[np.ndarray, np.ndarray]:
    """Times (s) and the cumulative preemption count, at the samples where the count rose
    (plus the first sample), in time order."""
    t = run.timeline
    order = np.argsort(t["time_ms"], kind="stable")
    time_s = t["time_ms"][order] / 1e3
    count = np.maximum.accumulate(t["preemptions"][order])
    rose = np.concatenate(([True], np.diff(count) > 0))
    return time_s[rose], count[rose]


def headline(run) -> str:
    """The run's preemption and KV numbers as one line of text (and a second line with the
    stability verdict when the run is overloaded); a replicated run's replica 1, whose timeline is drawn."""
    run = drawn_replica(run)
    m = run.metrics
    text = (f"preemptions {fmt_number(metric_value(m, 'num_preemptions'))}  ·  "
            f"peak KV {fmt_percent(metric_value(m, 'kv_usage.peak'))}  ·  "
            f"KV > 90% for {fmt_percent(metric_value(m, 'kv_usage.time_above_90'))} of the run  ·  "
            f"finished {fmt_number(metric_value(m, 'finished'))}/{fmt_number(metric_value(m, 'requests'))}")
    if isinstance(m.get("energy"), dict):
        text += (f"  ·  {fmt_number(metric_value(m, 'energy.j_per_token'))} J/token, "
                 f"avg {fmt_number(metric_value(m, 'energy.avg_power_w'))} W")
    if stability_verdict(run):
        text += "\n" + stability_text(m["stability"])
    return text


def trend_lines(run) -> list[tuple[int | None, dict]]:
    """``(instance or None for the whole run, fit)`` for each waiting-queue trend to draw: the
    flagged instances' fits with several instances, else the run's (a replicated run's replica 1's:
    the mean of the replicas' fits fits no drawn queue)."""
    run = drawn_replica(run)
    per_instance = run.metrics.get("per_instance")
    if isinstance(per_instance, dict) and per_instance:
        out = []
        for key, sub in per_instance.items():
            stability = sub.get("stability") if isinstance(sub, dict) else None
            if isinstance(stability, dict) and stability.get("verdict") in STABILITY_STYLES:
                if isinstance(stability.get("fit"), dict):
                    out.append((int(key), stability))
        return out
    stability = run.metrics.get("stability")
    if stability_verdict(run) and isinstance(stability.get("fit"), dict):
        return [(None, stability)]
    return []


def _trend_segment(fit: dict) -> tuple[list[float], list[float]]:
    """The fitted line from the start to the end of the arrival window (s, requests), starting
    where it crosses 0 when it starts below (a queue cannot be negative)."""
    t0, t1 = fit["start_ms"] / 1e3, fit["end_ms"] / 1e3
    w0, w1 = fit["waiting_at_start"], fit["waiting_at_end"]
    if w0 < 0 < w1:
        t0, w0 = t0 + (t1 - t0) * (-w0) / (w1 - w0), 0.0
    return [t0, t1], [w0, w1]


def has_power(run) -> bool:
    """True when the run metered energy and its timeline rows carry all of it: a timeline
    thinned past ``timeline_points`` has lost rows, whose iterations the panel would draw as
    idle (a run drawing 1,325 J drew 685), so it is left out, as the fleet report leaves out
    its kWh per hour."""
    from schedlab.energy.timeline import integral_j, power_steps

    energy_j = run.timeline.get("energy_j")
    energy = run.meta.get("energy")
    if not (isinstance(energy, dict) and isinstance(energy.get("instances"), list) and bool(energy["instances"])
            and energy_j is not None and energy_j.size > 0 and not np.isnan(energy_j).all()):
        return False
    for k, inst in enumerate(energy["instances"]):
        counted = inst.get("busy_j", 0.0) + inst.get("idle_j", 0.0)
        if not math.isclose(integral_j(*power_steps(run, k)), counted, rel_tol=1e-6, abs_tol=1e-6):
            return False
    return True


def _power_panel(ax, run, several: bool) -> None:
    """GPU power of each instance as steps; the run's average as a dotted line."""
    from schedlab.energy.timeline import power_steps

    count = len(run.meta["energy"]["instances"])
    for k in range(count):
        edges, watts = power_steps(run, k)
        (line,) = ax.plot(edges / 1e3, np.append(watts, watts[-1] if watts.size else 0.0), drawstyle="steps-post",
                          linewidth=1.2, label=f"instance {k}" if several else run.name, **line_style(k))
        line.set_gid(f"timeline:power:{k}")
    avg = metric_value(run.metrics, "energy.avg_power_w")
    if avg == avg and avg is not None and count == 1:
        ax.axhline(avg, color="0.4", linewidth=0.8, linestyle=":", zorder=0)
    ax.set_ylabel("GPU power\n(W)")
    ax.set_ylim(bottom=0)


def timeline_figure(run, dpi: int) -> Figure:
    """Running / waiting / KV usage (and GPU power) panels for one run (which must have a timeline)."""
    original, run = run, drawn_replica(run)  # (a replicated run: replica 1 throughout)
    series = instance_series(run)
    several = len(series) > 1
    power = has_power(run)
    fig = new_figure(10.0, 9.6 if power else 7.6, dpi)
    axes = fig.subplots(4 if power else 3, 1, sharex=True)
    ax_run, ax_wait, ax_kv = axes[:3]
    fractions = _blocks_per_instance(run) is not None
    for k, (inst, s) in enumerate(series):
        style = line_style(k)
        label = f"instance {inst}" if several else run.name
        for ax, column in ((ax_run, "running"), (ax_wait, "waiting"), (ax_kv, "kv_used")):
            (line,) = ax.plot(s["time_s"], s[column], drawstyle="steps-post", linewidth=1.2, label=label, **style)
            line.set_gid(f"timeline:{column}:{inst}")
    for k, (inst, stability) in enumerate(trend_lines(run)):
        (trend,) = ax_wait.plot(*_trend_segment(stability["fit"]), linestyle="--", linewidth=1.6,
                                color=STABILITY_STYLES[stability["verdict"]][0], zorder=3,
                                label="trend" + ("" if inst is None else f" (instance {inst})"))
        trend.set_gid(f"trend:{'run' if inst is None else inst}")
    ax_run.set_ylabel("running\n(sequences)")
    ax_wait.set_ylabel("waiting\n(requests)")
    for ax, column in ((ax_run, "running"), (ax_wait, "waiting")):
        top = max(float(s[column].max()) for _, s in series)
        ax.set_ylim(0, max(1.0, top * 1.06))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if fractions:
        ax_kv.set_ylabel("KV usage\n(fraction of blocks)")
        ax_kv.set_ylim(0, 1.05)
        ax_kv.axhline(HIGH_WATER, color="0.5", linewidth=0.8, linestyle="--", zorder=0)
    else:
        ax_kv.set_ylabel("KV in use\n(blocks)")
        ax_kv.set_ylim(bottom=0)
    if power:
        _power_panel(axes[3], run, several)
    axes[-1].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.01)
    times, counts = preemption_steps(run)
    if counts.size and counts[-1] > 0:
        ax_pre = ax_kv.twinx()
        end = max(float(s["time_s"][-1]) for _, s in series)
        x, y = np.append(times, max(end, float(times[-1]))), np.append(counts, counts[-1])
        (line,) = ax_pre.plot(x, y, drawstyle="steps-post", color=PREEMPTION_COLOR, linewidth=1.0,
                              alpha=0.8, label="preemptions (cumulative)")
        line.set_gid("timeline:preemptions")
        ax_pre.set_ylabel("preemptions\n(cumulative)", color=PREEMPTION_COLOR)
        ax_pre.tick_params(axis="y", colors=PREEMPTION_COLOR)
        ax_pre.set_ylim(0, float(counts[-1]) * 1.06)
        ax_pre.yaxis.set_major_locator(MaxNLocator(integer=True))
    if several:
        handles, labels = ax_run.get_legend_handles_labels()
        outside_legend(fig, handles, labels, 8)
    titles(fig, f"timeline: {run.name}{replica_note(original)}", headline(run))
    return fig
