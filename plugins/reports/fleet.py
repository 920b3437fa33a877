"""The ``fleet`` report: a day of a fleet, hour by hour -- GPUs paid for, cost and SLO attainment.

For every run that has per-hour figures (runs of two hours or more: ``hourly`` in the metrics)
it writes ``fleet.txt`` (one line per run, totals: requests, GPU-hours, cost at ``gpu_hour_usd``,
SLO attainment, that of its worst hour, and for an autoscaled run its scale-ups and -downs) and
``plots/fleet.png``: the arrival rate, the GPUs paid for and the SLO attainment of each hour, one
line per run, so a fixed fleet and an autoscaled one read side by side (the hours' figures
themselves: ``hourly`` in summary.json). Without such a run it writes nothing and says so on
stderr.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs

from schedlab.configs import float_field, int_field
from schedlab.results.metrics import HOURLY_FROM_MS
from schedlab.results.storage import atomic_write


@attrs.frozen
class FleetConfig:
    gpu_hour_usd: float = float_field(1.29, min=0.0, help="price of a GPU-hour (an illustrative on-demand A100 "
                                                          "price, as in experiments/capacity_plan.toml)")
    dpi: int = int_field(110, min=20, help="resolution of plots/fleet.png")


def fleet_runs(results) -> list:
    return [run for run in results.all_runs() if run.metrics.get("hourly")]


def _duration(ms: float) -> str:
    """``45 s``, ``1.0 min``, ``1.5 h``."""
    if not ms < 60e3:
        return f"{ms / 60e3:.1f} min" if ms < 3.6e6 else f"{ms / 3.6e6:.1f} h"
    return f"{ms / 1e3:.0f} s"


def nothing_written(results) -> str:
    """Why no run has per-hour figures: one line for stderr."""
    lengths = [run.metrics.get("makespan_ms") for run in results.all_runs()]
    lengths = [ms for ms in lengths if isinstance(ms, (int, float)) and math.isfinite(ms)]
    longest = f" (the longest: {_duration(max(lengths))})" if lengths else ""
    return (f"schedlab: fleet report: no run lasts {HOURLY_FROM_MS / 3.6e6:g} hours or more{longest}, the least "
            "that has per-hour figures; fleet.txt and plots/fleet.png not written")


def fleet_table(runs: list, price: float) -> str:
    lines = [f"{'run':<24} {'requests':>11} {'GPU-hours':>10} {'cost $':>9} {'SLO attained':>13} "
             f"{'worst hour':>11} {'ups/downs':>10}"]
    for run in runs:
        m = run.metrics
        hours = [h["slo_attainment"] for h in m["hourly"].values() if h["requests"]]
        worst = min(hours) if hours and not any(math.isnan(x) for x in hours) else math.nan
        fleet = m.get("fleet")
        moves = f"{fleet['scale_ups']}/{fleet['scale_downs']}" if fleet else "-"
        attained = m.get("slo", {}).get("attainment", math.nan)
        lines.append(f"{run.name:<24} {m['requests']:>11,} {m['gpu_hours']:>10.1f} {m['gpu_hours'] * price:>9.0f} "
                     f"{attained:>13.2%} {worst:>11.2%} {moves:>10}")
    return "\n".join(lines) + "\n"


def fleet_figure(runs: list, dpi: int):
    from matplotlib.ticker import PercentFormatter

    from .plot_common import line_style, new_figure  # matplotlib: only when drawing

    fig = new_figure(8.0, 7.5, dpi)
    rate_ax, gpu_ax, slo_ax = fig.subplots(3, 1, sharex=True)
    lowest = 1.0
    for i, run in enumerate(runs):
        hourly = run.metrics["hourly"]
        hours = sorted(int(h) for h in hourly)
        x = hours + [hours[-1] + 1]  # steps over each hour, the last one drawn to its end

        def steps(values):
            return values + values[-1:]

        style = dict(line_style(i), drawstyle="steps-post")
        rate_ax.plot(x, steps([hourly[str(h)]["requests"] / 3600 for h in hours]), label=run.name, **style)
        gpu_ax.plot(x, steps([hourly[str(h)]["gpu_hours"] for h in hours]), label=run.name, **style)
        attained = [hourly[str(h)]["slo_attainment"] for h in hours]
        slo_ax.plot(x, steps(attained), label=run.name, **style)
        lowest = min([lowest] + [a for a in attained if not math.isnan(a)])
    rate_ax.set_ylabel("arrivals / s")
    gpu_ax.set_ylabel("GPUs paid for\n(GPU-hours per hour)")
    slo_ax.set_ylabel("SLO attainment")
    slo_ax.set_xlabel("hour (by arrival; the last hour: draining)")
    slo_ax.set_ylim(min(0.9, lowest - 0.01), 1.005)
    slo_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    gpu_ax.set_ylim(bottom=0)
    rate_ax.set_ylim(bottom=0)
    rate_ax.legend(loc="upper left", fontsize=8)
    for ax in (rate_ax, gpu_ax, slo_ax):
        ax.grid(alpha=0.3)
    rate_ax.set_title("A day of a fleet: load, GPUs paid for and SLO attainment per hour")
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
        table = out / "fleet.txt"
        atomic_write(table, fleet_table(runs, self.config.gpu_hour_usd))
        plot = out / FOLDER / "fleet.png"
        atomic_write(plot, png_bytes(fleet_figure(runs, self.config.dpi), self.config.dpi))
        return [table, plot]
