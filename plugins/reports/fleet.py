"""The ``fleet`` report: a day of a fleet, hour by hour -- GPUs paid for, cost and SLO attainment.

For every run that has per-hour figures (runs of two hours or more: ``hourly`` in the metrics)
it writes ``fleet.txt`` (one line per run, totals: requests, GPU-hours, cost at ``gpu_hour_usd``,
SLO attainment, that of its worst hour, and for an autoscaled run its scale-ups and -downs) and
``plots/fleet.png``: the arrival rate, the GPUs paid for and the SLO attainment of each hour, one
line per run, so a fixed fleet and an autoscaled one read side by side (the hours' figures
themselves: ``hourly`` in summary.json). Without such a run it writes nothing and says so on
stderr.

A run that metered energy (``[power]``) adds its facility energy to ``fleet.txt`` (``kWh``: the
run's ``energy.kwh``, GPUs and hosts x PUE over its energy window) and, with ``kwh_usd`` set, its
cost (``energy $``); without one the file is as before. Each hour's kWh (by the clock, as the
GPU-hours) is redrawn from the run's timeline (:func:`hourly_kwh`) and plotted in a panel of its
own: that needs the whole timeline (``timeline = true`` and no more rows than ``timeline_points``),
checked by the hours adding up to the run's energy; a footnote of fleet.txt names the runs without.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs
import numpy as np

from schedlab.configs import float_field, int_field
from schedlab.energy.metrics import J_PER_KWH
from schedlab.results.metrics import HOUR_MS, HOURLY_FROM_MS
from schedlab.results.storage import atomic_write


@attrs.frozen
class FleetConfig:
    gpu_hour_usd: float = float_field(1.29, min=0.0, help="price of a GPU-hour (an illustrative on-demand A100 "
                                                          "price, as in experiments/capacity_plan.toml)")
    kwh_usd: float | None = float_field(None, min=0.0, optional=True,
                                       help="price of a kWh of facility energy: an energy cost column in fleet.txt "
                                            "for runs with [power] (unset: none)")
    dpi: int = int_field(110, min=20, help="resolution of plots/fleet.png")


def fleet_runs(results) -> list:
    return [run for run in results.all_runs() if run.metrics.get("hourly")]


def _duration(ms: float) -> str:
    """``45 s``, ``1.0 min``; an hour or more ``1 h 59 min 57 s``, cut to the second (not rounded: a
    run just short of the 2 hours that give per-hour figures must not read as 2.0 h)."""
    if not ms < 60e3:
        if ms < 3.6e6:
            return f"{ms / 60e3:.1f} min"
        seconds = int(ms // 1e3)
        return f"{seconds // 3600} h {seconds // 60 % 60} min {seconds % 60} s"
    return f"{ms / 1e3:.0f} s"


def nothing_written(results) -> str:
    """Why no run has per-hour figures: one line for stderr."""
    lengths = [run.metrics.get("makespan_ms") for run in results.all_runs()]
    lengths = [ms for ms in lengths if isinstance(ms, (int, float)) and math.isfinite(ms)]
    longest = f" (the longest makespan, first arrival to last finish: {_duration(max(lengths))})" if lengths else ""
    return (f"schedlab: fleet report: no run lasts {HOURLY_FROM_MS / 3.6e6:g} hours or more{longest}, the least "
            "that has per-hour figures; fleet.txt and plots/fleet.png not written")


def metered(run) -> bool:
    """The run metered energy (``[power]``): its metrics have ``energy.kwh``."""
    energy = run.metrics.get("energy")
    return isinstance(energy, dict) and isinstance(energy.get("kwh"), (int, float))


def hourly_kwh(run) -> list[float] | None:
    """Facility kWh -- GPUs and hosts x PUE -- of each hour of ``hourly`` (by the clock, as its
    GPU-hours; the last hour runs on to the energy window's end), redrawn from the timeline:
    each instance's GPU power (:func:`schedlab.energy.timeline.power_steps`), its host's idle power
    while on and busy power over the timeline's rows. None without ``[power]`` or a timeline, or
    when the hours do not add up to the run's ``energy.facility_j`` (a timeline thinned past
    ``timeline_points`` has lost rows)."""
    from schedlab.energy.timeline import power_steps

    energy, t = run.meta.get("energy"), run.timeline
    if not metered(run) or not isinstance(energy, dict) or not energy.get("instances") or "energy_j" not in t \
            or not t["energy_j"].size:
        return None
    start, end = energy["window_ms"]
    bounds = np.arange(len(run.metrics["hourly"]) + 1) * HOUR_MS
    bounds[-1] = max(bounds[-1], end)
    facility = np.zeros(bounds.size - 1)
    for k, inst in enumerate(energy["instances"]):
        edges, watts = power_steps(run, k)
        drawn = np.concatenate(([0.0], np.cumsum(np.diff(edges) * watts) * 1e-3))  # J drawn by each edge
        gpu_j = np.diff(np.interp(bounds, edges, drawn))
        mine = t["instance"] == k
        starts, durations = t["time_ms"][mine], t["duration_ms"][mine]
        busy = np.array([np.clip(b - starts, 0.0, durations).sum() for b in bounds])  # ms busy before each bound
        clipped = np.clip(bounds, start, end)
        off = np.array([sum(max(0.0, min(b, off_end, end) - max(a, start)) for a, off_end in inst.get("off", []))
                        for b in clipped])
        on = clipped - start - off  # ms on before each bound
        host_j = (inst.get("host_idle_w", 0.0) * np.diff(on) + inst.get("host_busy_w", 0.0) * np.diff(busy)) * 1e-3
        facility += (gpu_j + host_j) * inst.get("pue", energy.get("pue", 1.0))  # (each pool's own PUE)
    if not math.isclose(float(facility.sum()), run.metrics["energy"]["facility_j"], rel_tol=1e-6, abs_tol=1e-6):
        return None
    return (facility / J_PER_KWH).tolist()


def fleet_table(runs: list, price: float, kwh_usd: float | None = None, per_hour: list | None = None) -> str:
    """fleet.txt: a line per run; with a run that metered energy, its kWh (and cost at ``kwh_usd``)
    and footnotes. ``per_hour``: each run's :func:`hourly_kwh` (default: computed here)."""
    energy = any(metered(run) for run in runs)
    priced = energy and kwh_usd is not None
    lines = [f"{'run':<24} {'requests':>11} {'GPU-hours':>10} {'cost $':>9} {'SLO attained':>13} "
             f"{'worst hour':>11} {'ups/downs':>10}" + (f" {'kWh':>10}" if energy else "")
             + (f" {'energy $':>9}" if priced else "")]
    for run in runs:
        m = run.metrics
        hours = [h["slo_attainment"] for h in m["hourly"].values() if h["requests"]]
        worst = min(hours) if hours and not any(math.isnan(x) for x in hours) else math.nan
        fleet = m.get("fleet")
        moves = f"{fleet['scale_ups']}/{fleet['scale_downs']}" if fleet else "-"
        attained = m.get("slo", {}).get("attainment", math.nan)
        line = (f"{run.name:<24} {m['requests']:>11,} {m['gpu_hours']:>10.1f} {m['gpu_hours'] * price:>9,.2f} "
                f"{_share(attained):>13} {_share(worst):>11} {moves:>10}")
        if energy:
            kwh = m["energy"]["kwh"] if metered(run) else None
            line += f" {kwh:>10,.2f}" if kwh is not None else f" {'-':>10}"
            if priced:
                line += f" {kwh * kwh_usd:>9,.2f}" if kwh is not None else f" {'-':>9}"
        lines.append(line)
    if energy:
        lines += [""] + energy_notes(runs, kwh_usd if priced else None,
                                     per_hour if per_hour is not None else [hourly_kwh(run) for run in runs])
    return "\n".join(lines) + "\n"


def _share(value: float) -> str:
    """``95.00%``, or ``-`` where there is none (a run without ``[slo]``: NaN)."""
    return "-" if math.isnan(value) else f"{value:.2%}"


def energy_notes(runs: list, kwh_usd: float | None, per_hour: list) -> list[str]:
    """The footnotes of the energy columns."""
    pues = sorted({run.metrics["energy"].get("pue", 1.0) for run in runs if metered(run)})
    pue = f"PUE {pues[0]:g}" if len(pues) == 1 else "PUE"
    notes = [f"kWh: facility energy over the run's energy window, GPUs and hosts x {pue} (energy.kwh; GPUs alone: "
             "energy.gpu_kwh)"]
    if kwh_usd is not None:
        notes.append(f"energy $: kWh at ${kwh_usd:g}/kWh, not in cost $ (GPU-hours at their price)")
    without = [run for run, hours in zip(runs, per_hour) if metered(run) and hours is None]
    thinned = [run.name for run in without if not run.replicas]
    replicated = [run.name for run in without if run.replicas]
    if thinned:
        notes.append(f"no kWh per hour in plots/fleet.png for {', '.join(thinned)}: it needs the run's whole timeline "
                     "(timeline = true, timeline_points above its rows)")
    if replicated:   # (its kWh is the replicas' mean; the timeline kept is the first replica's)
        notes.append(f"no kWh per hour in plots/fleet.png for {', '.join(replicated)}: a run of replicas keeps one "
                     "replica's timeline, and its kWh is their mean")
    return notes


def last_hour_length(run, hour: int) -> float:
    """How much of hour ``hour`` (the run's last) the run lasted, as a fraction of an hour: up to
    the end of the engine's work (:func:`schedlab.results.metrics.engine_end_ms`: the time GPUs are
    paid to; a replicated run's replica 1, whose rows are kept), or a whole hour when that end is
    not inside it (a late arrival turned away in an hour after the work)."""
    from schedlab.results.metrics import engine_end_ms

    req = run.all_requests()
    left = req["rejected"] == 0
    end = engine_end_ms(run.counters or {}, float(req["finish_ms"][left].max()) if left.any() else 0.0)
    part = (end - hour * HOUR_MS) / HOUR_MS
    return part if 0.0 < part < 1.0 else 1.0


def fleet_figure(runs: list, dpi: int, per_hour: list | None = None):
    """The figure of plots/fleet.png; ``per_hour``: each run's kWh per hour or None (no energy panel
    unless a run has them)."""
    from matplotlib.ticker import PercentFormatter

    from .plot_common import line_style, new_figure  # matplotlib: only when drawing

    per_hour = per_hour if per_hour is not None else [None] * len(runs)
    energy = any(kwh is not None for kwh in per_hour)
    fig = new_figure(8.0, 9.5 if energy else 7.5, dpi)
    if energy:
        rate_ax, gpu_ax, kwh_ax, slo_ax = fig.subplots(4, 1, sharex=True)
    else:
        rate_ax, gpu_ax, slo_ax = fig.subplots(3, 1, sharex=True)
    lowest = 1.0
    for i, (run, kwh) in enumerate(zip(runs, per_hour)):
        hourly = run.metrics["hourly"]
        hours = sorted(int(h) for h in hourly)
        # the hours' lengths (h): each a whole hour but the last, which ends with the engine's work
        # -- its arrivals, GPU-hours and kWh are over that part of an hour, so drawn per hour of it
        lengths = [1.0] * len(hours)
        lengths[-1] = last_hour_length(run, hours[-1])
        x = hours + [hours[-1] + lengths[-1]]  # steps over each hour, the last one drawn to its end

        def steps(values):
            return values + values[-1:]

        style = dict(line_style(i), drawstyle="steps-post")
        rate_ax.plot(x, steps([hourly[str(h)]["requests"] / (3600 * n) for h, n in zip(hours, lengths)]),
                     label=run.name, **style)
        gpu_ax.plot(x, steps([hourly[str(h)]["gpu_hours"] / n for h, n in zip(hours, lengths)]), label=run.name,
                    **style)
        if kwh is not None:
            kwh_ax.plot(x, steps([k / n for k, n in zip(kwh, lengths)]), label=run.name, **style)
        attained = [hourly[str(h)]["slo_attainment"] for h in hours]
        slo_ax.plot(x, steps(attained), label=run.name, **style)
        lowest = min([lowest] + [a for a in attained if not math.isnan(a)])
    rate_ax.set_ylabel("arrivals / s")
    gpu_ax.set_ylabel("GPUs paid for\n(GPU-hours per hour)")
    slo_ax.set_ylabel("SLO attainment")
    slo_ax.set_xlabel("hour (by arrival; the last hour: draining, drawn to the end of the work)")
    slo_ax.set_ylim(min(0.9, lowest - 0.01), 1.005)
    slo_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    gpu_ax.set_ylim(bottom=0)
    rate_ax.set_ylim(bottom=0)
    rate_ax.legend(loc="upper left", fontsize=8)
    axes = (rate_ax, gpu_ax, slo_ax)
    if energy:
        kwh_ax.set_ylabel("energy (kWh per hour,\nGPUs and hosts x PUE)")
        kwh_ax.set_ylim(bottom=0)
        axes += (kwh_ax,)
    for ax in axes:
        ax.grid(alpha=0.3)
    shown = "GPUs paid for, energy" if energy else "GPUs paid for"
    rate_ax.set_title(f"A day of a fleet: load, {shown} and SLO attainment per hour")
    return fig


class FleetReport:
    def __init__(self, config: FleetConfig | None = None, stream=None):
        self.config = config or FleetConfig()
        self.stream = stream  # where a note that nothing was written goes (default: stderr)

    def write(self, results, out_dir) -> list[Path]:
        from .plots import FOLDER, png_bytes

        runs = fleet_runs(results)
        if not runs:
            print(nothing_written(results), file=self.stream or sys.stderr)
            return []
        out = Path(out_dir)
        per_hour = [hourly_kwh(run) for run in runs]
        table = out / "fleet.txt"
        atomic_write(table, fleet_table(runs, self.config.gpu_hour_usd, self.config.kwh_usd, per_hour))
        plot = out / FOLDER / "fleet.png"
        atomic_write(plot, png_bytes(fleet_figure(runs, self.config.dpi, per_hour), self.config.dpi))
        return [table, plot]
