"""Where a variant stops beating a baseline as load grows: the ``crossover`` report.

::

    [reports.crossover]
    baseline = "plain"              # a sweep over the load key
    load = "workload.clients"       # the load key, swept by the baseline and by each compared sweep
    metric = "tpot_ms.mean"         # compared at every load
    better = "lower"                # or "higher"
    ratios = ["throughput_tps"]     # more metrics whose ratio to the baseline the table shows

Every other sweep over the load key (or those named in ``studies``) is compared with the
baseline point by point: its lines are the combinations of its other swept keys (e.g. one per
acceptance rate). For each line, ``ratio(load) = metric / baseline metric`` at the same load,
and the *crossover* is the load where the ratio reaches 1 after starting on the better side:
interpolated linearly in ``log(load)`` between the two swept loads around it (loads are
usually swept by factors). A line better at every load has its crossover above the largest
load (``> L``), one never better below the smallest (``< L``), one equal at every load has
none; one with no load where both it and the baseline have the metric has no data (side
``none`` in the CSV).

Writes ``crossover.txt`` (printed too) and ``crossover.csv``, and ``plots/crossover.png``: for
each compared sweep, its ratios against load (top) and its crossover against its first
other key (bottom), open triangles marking crossovers beyond the swept range.
"""

from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path

import attrs

from schedlab.configs import int_field, list_field, metric_field, metric_list_field, str_field
from schedlab.errors import ConfigError
from schedlab.results.storage import atomic_write
from schedlab.study.spec import check_slo
from schedlab.study.sweep import point_label

from .best import metric_number

#: crossover.png's least width (inches): one study's panel alone is too narrow for its subtitle
MIN_FIGURE_WIDTH = 7.0


@attrs.frozen
class CrossoverConfig:
    baseline: str = str_field(help="the sweep (a [[runs]] name) every other sweep is compared with")
    load: str = str_field("workload.clients", help="the load key, swept by the baseline and every compared sweep")
    metric: str = metric_field("tpot_ms.mean", help="the metric compared at each load, as a dotted name")
    better: str = str_field("lower", choices=("lower", "higher"), help="which values of the metric are better")
    studies: tuple = list_field((), item=str, help="sweeps to compare (empty: every other sweep over the load key)")
    ratios: tuple = metric_list_field(("throughput_tps",),
                                      help="more metrics whose ratio to the baseline the table shows at the lowest "
                                           "and highest load")
    dpi: int = int_field(110, min=50, max=400, help="resolution of plots/crossover.png")

    def check_studies(self, studies) -> None:
        """The baseline and ``studies`` against the experiment's runs, and that the metrics
        needing ``[slo]`` targets have them (called when the experiment file is read)."""
        base, chosen = compared_sweeps(studies, self)
        for name in ("metric", "ratios"):
            for metric in (self.metric,) if name == "metric" else self.ratios:
                check_slo(metric, [base, *chosen], name)


@attrs.frozen
class Line:
    """One compared line: a sweep's runs at one combination of its other keys."""

    study: str
    setting: dict                   # the other keys' values
    loads: tuple[float, ...]        # loads where both it and the baseline have the metric
    ratios: tuple[float, ...]       # metric / baseline metric there
    crossover: float | None         # the load where the ratio reaches 1 (None: beyond the range)
    side: str                       # "inside", "above" (better everywhere), "below" (never better),
                                    # "tie" (equal at every load: neither ever better) or "none" (no
                                    # load where both have the metric: no data)
    extra: dict                     # ratio name -> (at the lowest load, at the highest load)

    @property
    def label(self) -> str:
        return point_label(self.setting) or self.study


def crossover_load(loads, ratios, better: str) -> tuple[float | None, str]:
    """Where ``ratios`` (against ``loads``, increasing) leave the better side: ``(load, "inside")``
    interpolated in log(load), or ``(None, "above")`` / ``(None, "below")``. Loads where the two
    tie before either wins are passed over (SLO attainment is 1 for both at a light load): a line
    that ties, then wins, then loses crosses where it loses; one that ties at every load is
    ``(None, "tie")`` (it never was worse either); with no load where both have the metric (all
    its requests rejected, say) there is nothing to compare: ``(None, "none")``."""
    if not len(ratios):
        return None, "none"
    first = next((i for i, r in enumerate(ratios) if r != 1.0), len(ratios))
    if ratios and first == len(ratios):
        return None, "tie"
    loads, ratios = loads[first:], ratios[first:]
    wins = [(r < 1.0) if better == "lower" else (r > 1.0) for r in ratios]
    if not wins or not wins[0]:
        return None, "below"
    for i in range(1, len(loads)):
        if not wins[i]:
            r0, r1 = ratios[i - 1], ratios[i]
            frac = (1.0 - r0) / (r1 - r0) if r1 != r0 else 1.0
            lo, hi = math.log(loads[i - 1]), math.log(loads[i])
            return math.exp(lo + frac * (hi - lo)), "inside"
    return None, "above"


def _by_load(study, load_key: str) -> dict:
    return {run.point.get(load_key): run for run in study.runs}


def _not_a_sweep(study, name: str, load: str) -> str | None:
    """Why ``study`` (named ``name``; None: no such run) is not a sweep over ``load``, or None."""
    if study is None:
        return f"there is no run named {name!r}"
    if study.kind != "sweep":
        return f"{name!r} is a {'single run' if study.kind == 'run' else study.kind}"
    return None if load in study.keys else f"{name!r} sweeps {', '.join(study.keys)}"


def compared_sweeps(studies, config: CrossoverConfig) -> tuple:
    """The baseline and the sweeps compared with it, among ``studies`` -- the experiment's
    (:class:`schedlab.study.spec.StudySpec`) or its results' (:class:`schedlab.results.Study`).

    :raises ConfigError: (not naming the table) the baseline is not a sweep over the load key
        alone, or an entry of ``studies`` is not a sweep over it or is the baseline.
    """
    names = {s.name: s for s in studies}
    sweeps = ", ".join(s.name for s in studies if s.kind == "sweep" and config.load in s.keys) or "none"
    base = names.get(config.baseline)
    why = _not_a_sweep(base, config.baseline, config.load)
    if why:
        raise ConfigError(f"baseline {config.baseline!r} must be a sweep over {config.load!r} ({why}); "
                          f"sweeps over it: {sweeps}")
    if base.keys != (config.load,):
        raise ConfigError(f"baseline {config.baseline!r} must sweep only {config.load!r}, "
                          f"it sweeps {', '.join(base.keys)}")
    for name in config.studies:
        why = _not_a_sweep(names.get(name), name, config.load)
        if why:
            raise ConfigError(f"studies: {name!r} is not a sweep over {config.load!r} ({why}); sweeps over it: "
                              f"{sweeps}")
        if name == config.baseline:
            raise ConfigError(f"studies: {name!r} is the baseline; list the sweeps compared with it")
    if config.studies:
        return base, [names[n] for n in config.studies]
    return base, [s for s in studies if s.kind == "sweep" and s is not base and config.load in s.keys]


def compare(results, config: CrossoverConfig) -> list[Line]:
    """Every compared line, in study and first-seen order."""
    try:
        base, chosen = compared_sweeps(results.studies, config)
    except ConfigError as exc:
        raise ConfigError(f"[reports.crossover]: {exc}") from None
    baseline = _by_load(base, config.load)
    lines = []
    for study in chosen:
        others = [k for k in study.keys if k != config.load]
        groups: dict[tuple, list] = {}
        for run in study.runs:
            groups.setdefault(tuple(repr(run.point.get(k)) for k in others), []).append(run)
        for runs in groups.values():
            setting = {k: runs[0].point.get(k) for k in others}
            pairs = []
            for run in runs:
                load = run.point.get(config.load)
                ref = baseline.get(load)
                if ref is None or isinstance(load, bool) or not isinstance(load, (int, float)) or load <= 0:
                    continue
                mine, theirs = metric_number(run.metrics, config.metric), metric_number(ref.metrics, config.metric)
                if mine is None or not theirs:
                    continue
                pairs.append((float(load), mine / theirs, run, ref))
            pairs.sort(key=lambda p: p[0])
            loads = tuple(p[0] for p in pairs)
            ratios = tuple(p[1] for p in pairs)
            crossover, side = crossover_load(loads, ratios, config.better)
            extra = {}
            for name in config.ratios:
                ends = []
                for p in (pairs[0], pairs[-1]) if pairs else ():
                    a, b = metric_number(p[2].metrics, name), metric_number(p[3].metrics, name)
                    ends.append(a / b if a is not None and b else math.nan)
                extra[name] = tuple(ends) if ends else (math.nan, math.nan)
            lines.append(Line(study.name, setting, loads, ratios, crossover, side, extra))
    return lines


def _load_text(line: Line) -> str:
    if line.side == "above":
        return f"> {line.loads[-1]:g}"
    if line.side == "below":
        return f"< {line.loads[0]:g}" if line.loads else "-"
    if line.side == "tie":
        return "none (equal at every load)"
    if line.side == "none":
        return "- (no values to compare)"
    return f"{line.crossover:.3g}"


def render(lines: list[Line], config: CrossoverConfig) -> str:
    lo = lambda line: f"{line.loads[0]:g}" if line.loads else "-"  # noqa: E731
    hi = lambda line: f"{line.loads[-1]:g}" if line.loads else "-"  # noqa: E731
    header = ["study", "setting", f"{config.metric} ratio (low load)", "(high load)", f"crossover {config.load}"]
    for name in config.ratios:
        header += [f"{name} ratio (low load)", "(high load)"]
    rows = []
    for line in lines:
        row = [line.study, line.label,
               f"{line.ratios[0]:.3f} @{lo(line)}" if line.ratios else "-",
               f"{line.ratios[-1]:.3f} @{hi(line)}" if line.ratios else "-",
               _load_text(line)]
        for name in config.ratios:
            a, b = line.extra[name]
            row += [f"{a:.3f}", f"{b:.3f}"]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    out = [f"crossover: where each sweep stops beating {config.baseline!r} on {config.metric} "
           f"({config.better} is better) as {config.load} grows"]
    out.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out) + "\n"


def to_csv(lines: list[Line], config: CrossoverConfig) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["study", "setting", "crossover", "side", "loads", "ratios"]
                    + [f"{n}_ratio_{end}" for n in config.ratios for end in ("low", "high")])
    for line in lines:
        writer.writerow([line.study, line.label, "" if line.crossover is None else f"{line.crossover:.6g}", line.side,
                         " ".join(f"{x:g}" for x in line.loads), " ".join(f"{r:.6g}" for r in line.ratios)]
                        + [f"{v:.6g}" for n in config.ratios for v in line.extra[n]])
    return buf.getvalue()


def figure(lines: list[Line], config: CrossoverConfig, title: str):
    """Ratios against load (top row) and crossovers against each study's first other key (bottom)."""
    from .plot_common import line_style, new_figure, note, tick_text, titles, use_log_scale

    studies = list(dict.fromkeys(line.study for line in lines))
    if not studies:
        return None
    fig = new_figure(max(4.2 * len(studies), MIN_FIGURE_WIDTH), 7.2, config.dpi)
    axes = fig.subplots(2, len(studies), squeeze=False)
    all_loads = sorted({x for line in lines for x in line.loads})
    for col, name in enumerate(studies):
        mine = [line for line in lines if line.study == name]
        top, bottom = axes[0][col], axes[1][col]
        for i, line in enumerate(mine):
            top.plot(line.loads, line.ratios, marker="o", markersize=3, label=line.label, **line_style(i))
        top.axhline(1.0, color="0.3", linewidth=0.8, linestyle=":")
        if all_loads:
            use_log_scale(top, "x", all_loads)
        top.set_xlabel(config.load)
        top.set_ylabel(f"{config.metric} / {config.baseline}")
        top.set_title(name, fontsize=10)
        top.legend(fontsize=7)
        keys = list(mine[0].setting) if mine else []
        if keys:
            key = keys[0]
            xs = [line.setting[key] for line in mine]
            numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
            pos = xs if numeric else list(range(len(xs)))
            lo, hi = (all_loads[0], all_loads[-1]) if all_loads else (1, 1)
            inside = [(p, line.crossover) for p, line in zip(pos, mine) if line.side == "inside"]
            if inside:
                bottom.plot([p for p, _ in inside], [c for _, c in inside], marker="o", color="#1f77b4")
            for p, line in zip(pos, mine):
                if line.side == "above":
                    bottom.plot([p], [hi], marker="^", markerfacecolor="none", color="#1f77b4")
                elif line.side == "below":
                    bottom.plot([p], [lo], marker="v", markerfacecolor="none", color="#1f77b4")
            if not numeric:
                bottom.set_xticks(pos, [str(x) for x in xs], rotation=20, fontsize=8)
            bottom.set_xlabel(key)
            if all_loads:
                bottom.set_ylim(lo / 1.3, hi * 1.3)
                use_log_scale(bottom, "y", all_loads)
            bottom.yaxis.set_major_formatter(lambda v, _pos=None: tick_text(v))
        else:  # nothing else swept: one line, one crossover
            bottom.set_axis_off()
            note(bottom, "\n".join(f"{line.label}: crossover {_load_text(line)}" for line in mine))
        bottom.set_ylabel(f"crossover {config.load}")
        bottom.grid(True, alpha=0.3)
        top.grid(True, alpha=0.3)
    titles(fig, title, f"{config.metric}: {config.better} is better; crossover where the ratio reaches 1")
    return fig


class CrossoverReport:
    """Writes crossover.txt, crossover.csv and plots/crossover.png (see the module doc)."""

    def __init__(self, config: CrossoverConfig, stream=None):
        self.config = config
        self.stream = stream

    def write(self, results, out_dir) -> list[Path]:
        lines = compare(results, self.config)
        text = render(lines, self.config)
        (self.stream or sys.stdout).write(text)
        out = Path(out_dir)
        written = [out / "crossover.txt", out / "crossover.csv"]
        atomic_write(written[0], text)
        atomic_write(written[1], to_csv(lines, self.config))
        fig = figure(lines, self.config, f"crossover: {results.name}")
        if fig is not None:
            from .plots import FOLDER, png_bytes

            path = out / FOLDER / "crossover.png"
            atomic_write(path, png_bytes(fig, self.config.dpi))
            written.append(path)
        return written
