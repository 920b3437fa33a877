"""The ``compare`` report: simulated runs side by side with the real run they replay, or with
the summary of a real run they stand for (a run's ``[target]`` table, :mod:`schedlab.targets`).

For every run whose workload replays a measured run (``vllm_log``, ``vllm_bench``) it prints
and writes to ``compare.txt`` the 15-statistic table (measured, simulated, error; see
:mod:`schedlab.results.compare`) -- a server log against the simulated engine, a load
generator's file against the simulated client, and the server's own per-request times in that
file, when it has them, against the simulated engine --, and draws into ``plots/``:

* ``measured_cdf.png`` -- CDFs of TTFT, TPOT and latency: the measured run and every
  simulated run over it;
* ``measured_timeline.png`` -- running and waiting requests over time, measured (from the
  log's queued / scheduled / last-token times, or the server's own gauges where they were
  scraped: an ML.ENERGY run's ``prometheus.json``) and simulated (each run's whole cluster at
  the same times, by the same definition on its request rows, :func:`simulated_occupancy`); not
  drawn for a client's file without them, which records no scheduled times;
* ``measured_power.png`` -- the GPUs' power over time (all of them), where the file records it
  (an ML.ENERGY benchmark's ``timeline.power``) and the simulated runs have a ``[power]`` table:
  measured, and each run's (:func:`schedlab.energy.timeline.power_steps`, summed over its
  instances), with each one's steady state shaded (:func:`schedlab.targets.steady_state_energy`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import attrs
import numpy as np

from schedlab.configs import int_field
from schedlab.results.compare import (
    comparison_rows, format_comparison, format_target, measured_statistics, server_comparison, simulated_latencies,
    statistics,
)
from schedlab.results.metrics import completed
from schedlab.results.storage import atomic_write


@attrs.frozen
class CompareConfig:
    dpi: int = int_field(110, min=30, help="resolution of the figures")


def measured_occupancy(measured, times: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(running, waiting) requests of a measured run at ``times`` (ms), or None without
    scheduled times: waiting from arrival to first scheduled, running from then to the last token."""
    if measured.scheduled_ms is None:
        return None
    arrival, scheduled, finish = measured.arrival_ms, measured.scheduled_ms, measured.finish_ms
    t = times[:, None]
    waiting = ((arrival <= t) & (t < scheduled)).sum(axis=1)
    running = ((scheduled <= t) & (t < finish)).sum(axis=1)
    return running, waiting


def simulated_occupancy(run, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(running, waiting) requests of a simulated run at ``times`` (ms), summed over its instances,
    by :func:`measured_occupancy`'s definition on the run's own rows: waiting from arrival to first
    scheduled (to the abort for a request never scheduled), running from then to its finish; a
    rejected request is in neither. An idle engine counts 0, and an exact replay gives the measured
    counts."""
    req = run.all_requests()
    kept = req["rejected"] == 0
    arrival, scheduled, finish = req["arrival_ms"][kept], req["first_scheduled_ms"][kept], req["finish_ms"][kept]
    scheduled = np.where(scheduled < 0, finish, scheduled)
    return measured_occupancy(SimpleNamespace(arrival_ms=arrival, scheduled_ms=scheduled, finish_ms=finish), times)


def server_table(name: str, server: dict) -> str:
    """The server's own per-request times (a client's file) against the simulated engine's."""
    lines = [f"{name}: the server's own times vs the simulated engine's (TTFT from the first scheduling, "
             "queue time from the engine loop taking it)",
             f"{'statistic':<18}{'measured':>12}{'error':>9}", "-" * 39]
    for key, value in server["measured"].items():
        lines.append(f"{key:<18}{value:>12.1f}{server['errors_pct'][key]:>+8.1f}%")
    return "\n".join(lines) + "\n"


class CompareReport:
    """Tables and figures of simulated against measured (see the module docstring)."""

    def __init__(self, config: CompareConfig | None = None, stream=None):
        self.config = config or CompareConfig()
        self.stream = stream

    def write(self, results, out_dir) -> list[Path]:
        all_runs = results.all_runs()
        runs = [r for r in all_runs if getattr(r, "measured", None) is not None]
        targeted = [r for r in all_runs if "vs_target" in r.metrics]
        if not runs and not targeted:  # (said, as the fleet report says it: asked for by name, it wrote nothing)
            print("schedlab: compare report: no run replays a measured run (a vllm_log or vllm_bench workload) or has "
                  "a [target]; compare.txt not written", file=sys.stderr)
            return []
        out = Path(out_dir)
        texts = [format_target(r.name, r.meta.get("target", {}), r.metrics["vs_target"]) for r in targeted]
        for run in runs:
            view = getattr(run.measured, "view", "engine")
            rows = comparison_rows(statistics(simulated_latencies(run.requests, run.measured)),
                                   measured_statistics(run.measured))
            since = {"arrival_time": ", from its receipt of each", "queued_ts": ", from when its loop took each"}.get(
                getattr(run.measured, "arrivals_from", None), "")
            title = (f"{run.name}: simulated vs measured ({Path(run.measured.source).name}, as the {view} sees "
                     f"requests{since})")
            done, replayed = _completed_of(run)
            if done < replayed:   # (the measured side holds every request: the simulated statistics fewer)
                title += (f"\n(simulated: {done:,} of the {replayed:,} replayed requests completed -- the others "
                          "were turned away or given up on, and its statistics are over those; the measured ones "
                          "are over every request)")
            if view == "client" and "frontend" not in (run.settings or {}):  # (the API server's time is left out)
                title += ("\n(a client's file against a run without [frontend]: the simulated client is the engine, "
                          "without the API server's and the network's time -- add [frontend])")
            texts.append(format_comparison(title, rows))
            server = server_comparison(run.requests, run.measured)
            if server is not None:
                texts.append(server_table(run.name, server))
        text = "\n".join(texts)
        (self.stream or sys.stdout).write(text)
        path = out / "compare.txt"
        atomic_write(path, text)
        written = [path]
        if not runs:  # summaries only: nothing per request to draw
            return written
        from .plots import png_bytes

        # One set of figures per measured file, each run drawn against its own: the first file's
        # as measured_cdf.png..., another's as measured_cdf_<file>.png (every run was drawn against
        # the first file's measurements, and the timeline left out when that one had none).
        for suffix, group in _by_source(runs):
            for figure, name in ((self._cdfs(group), "measured_cdf"), (self._timeline(group), "measured_timeline"),
                                 (self._power(group), "measured_power")):
                if figure is not None:
                    target = out / "plots" / f"{name}{suffix}.png"
                    atomic_write(target, png_bytes(figure, self.config.dpi))
                    written.append(target)
        return written

    def _cdfs(self, runs):
        from .plot_cdf import PANELS, cdf_points
        from .plot_common import line_style, new_figure, use_log_scale

        fig = new_figure(13.0, 4.4, self.config.dpi)
        axes = fig.subplots(1, len(PANELS), sharey=True)
        measured = runs[0].measured
        truth = {"ttft_ms": measured.ttft_ms, "tpot_ms": measured.tpot_ms, "e2e_ms": measured.e2e_ms}
        for ax, (metric, description) in zip(axes, PANELS):
            x, y = cdf_points(truth[metric])
            ax.step(x, y, where="post", color="black", linewidth=2.2, label="measured")
            for i, run in enumerate(runs):
                x, y = cdf_points(simulated_latencies(run.requests, run.measured)[metric])
                ax.step(x, y, where="post", label=run.name, **line_style(i))
            ax.set_title(description)
            ax.set_xlabel("ms")
            ax.grid(alpha=0.3)
            use_log_scale(ax, "x", truth[metric])
        axes[0].set_ylabel("fraction of requests")
        axes[0].legend(loc="lower right", fontsize=8)
        fig.suptitle(f"simulated vs measured latency CDFs ({Path(measured.source).name})")
        return fig

    def _timeline(self, runs):
        from .plot_common import line_style, new_figure

        measured = runs[0].measured
        finish = measured.finish_ms[np.isfinite(measured.finish_ms)]
        scraped = getattr(measured, "occupancy", None)   # the server's own gauges, scraped
        if scraped is not None:
            times, occupancy = scraped[0], scraped[1:]
        elif measured.scheduled_ms is None or not finish.size:
            return None  # nothing measured to draw (a client's file): the runs' own timelines are in timeline.png
        else:
            times = np.linspace(0.0, float(finish.max()), 600)
            occupancy = measured_occupancy(measured, times)
        # each run's whole cluster at the same times, by the measured side's definition
        simulated = [(run, simulated_occupancy(run, times)) for run in runs]
        fig = new_figure(12.0, 4.4, self.config.dpi)
        axes = fig.subplots(1, 2, sharex=True)
        for ax, (column, title) in zip(axes, (("running", "running requests"), ("waiting", "waiting requests"))):
            ax.plot(times / 1e3, occupancy[0 if column == "running" else 1], color="black", linewidth=2.0,
                    label="measured")
            for i, (run, counts) in enumerate(simulated):
                (line,) = ax.plot(times / 1e3, counts[0 if column == "running" else 1], label=run.name,
                                  **line_style(i))
                line.set_gid(f"measured_timeline:{column}:{i}")
            ax.set_title(title)
            ax.set_xlabel("time (s)")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(f"simulated vs measured: running and waiting over time ({Path(measured.source).name})")
        return fig

    def _power(self, runs):
        measured = runs[0].measured
        metered = [run for run in runs if run.meta.get("energy") and len(run.timeline.get("time_ms", ()))]
        if getattr(measured, "power", None) is None or not metered:
            return None
        from schedlab.targets import steady_state_energy

        from .plot_common import line_style, new_figure

        times, watts = measured.power
        fig = new_figure(12.0, 4.4, self.config.dpi)
        ax = fig.subplots(1, 1)
        ax.plot(times / 1e3, watts, color="black", linewidth=1.6, label="measured")
        if measured.steady_ms is not None:
            ax.axvspan(measured.steady_ms[0] / 1e3, measured.steady_ms[1] / 1e3, color="black", alpha=0.08,
                       label="measured steady state")
        for i, run in enumerate(metered):
            style = line_style(i)
            grid = np.linspace(*run.meta["energy"]["window_ms"], 2000)
            ax.plot(grid / 1e3, simulated_power(run, grid), label=run.name, **style)
            window = steady_state_energy(run, (run.meta.get("target") or {}).get("batch"))
            if np.isfinite(window["steady_start_ms"]):
                for edge in ("steady_start_ms", "steady_end_ms"):
                    ax.axvline(window[edge] / 1e3, color=style.get("color"), linestyle=":", linewidth=1.0)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("GPU power, all GPUs (W)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.suptitle("simulated vs measured GPU power (dotted: each run's steady state)")
        return fig


def _completed_of(run) -> tuple[int, int]:
    """``(completed, replayed)``: the run's requests that completed for their clients, of all it had."""
    requests = run.all_requests()
    return int(np.count_nonzero(completed(requests))), int(requests["id"].size)


def _by_source(runs) -> list[tuple[str, list]]:
    """``runs`` grouped by the measured file each replays, in order: ``("", runs of the first)``,
    then ``("_<file name>", runs of another)`` (a number added where two files share a name)."""
    groups: dict[str, list] = {}
    for run in runs:
        groups.setdefault(str(run.measured.source), []).append(run)
    out, used = [], set()
    for k, (source, group) in enumerate(groups.items()):
        tag = "" if k == 0 else "_" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(source).stem)[:60] or "measured")
        if tag in used:
            tag += f"_{k}"
        used.add(tag)
        out.append((tag, group))
    return out


def simulated_power(run, times: np.ndarray) -> np.ndarray:
    """The GPUs' power of ``run`` (all its instances) at ``times`` (ms): its power steps
    (:func:`schedlab.energy.timeline.power_steps`) read where each time falls; 0 outside them."""
    from schedlab.energy.timeline import power_steps

    total = np.zeros(times.size)
    for k in range(len(run.meta["energy"]["instances"])):
        edges, watts = power_steps(run, k)
        at = np.searchsorted(edges, times, side="right") - 1
        inside = (at >= 0) & (at < len(watts))
        total[inside] += np.asarray(watts, dtype=float)[at[inside]]
    return total
