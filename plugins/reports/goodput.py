"""The ``goodput`` report: DistServe's goodput per GPU, from sweeps over the request rate.

DistServe (OSDI'24) calls *goodput* the highest request rate a system serves while at least a
target share of requests (90%) meets both its TTFT and its TPOT SLO, and compares systems by
goodput per GPU. Every sweep of the experiment over ``rate_key`` is one system (with a grid,
each combination of the other keys is one); its runs give the SLO attainment (``[slo]``
targets, ``slo.attainment``) at each swept rate. The goodput is where attainment crosses
``attainment``: the largest rate of the leading run of rates that meet it, moved towards the
next rate by linear interpolation of attainment. When every swept rate meets the target the
goodput is at least the highest one (marked ``>=``); when the lowest already fails, below it
(``<``, counted as 0). Per GPU divides by the run's ``gpus`` metric (instances x tensor
parallel ranks, both pools of a disaggregated cluster). Attainment is taken as the clients see
requests (:mod:`schedlab.frontend`): a rejected request, or one whose client gave up
(``[client] timeout_ms``), meets no SLO but counts among all requests.

Writes ``goodput.txt`` (also printed) and ``plots/goodput.png``: attainment against the rate
per GPU, one line per system with the target dotted, the goodput per GPU as bars, and each of
``metrics`` (say ``tpot_ms.p90``) against the rate per GPU -- one row per entry of ``panels``
(``{chat = ["chat colocated", "chat 1P1D"]}``: sweeps drawn together; by default one row with
every sweep).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs

from schedlab.configs import FieldError, float_field, metric_field, metric_list_field, str_field, table_field
from schedlab.errors import ConfigError
from schedlab.results.metrics import metric_at
from schedlab.results.storage import atomic_write
from schedlab.study.spec import check_slo
from schedlab.study.sweep import point_label


@attrs.frozen
class GoodputConfig:
    rate_key: str = str_field("workload.rate", help="the swept key that holds the request rate (requests/s)")
    attainment: float = float_field(0.9, min=0.0, max=1.0, min_exclusive=True,
                                    help="share of requests that must meet both SLOs (DistServe: 0.9)")
    metric: str = metric_field("slo.attainment", help="the attainment metric (needs [slo] targets)")
    metrics: tuple = metric_list_field((), help="more metrics drawn against the rate per GPU, e.g. tpot_ms.p90")
    panels: dict = table_field(attrs.Factory(dict),
                               help="row name -> sweep names drawn together (default: one row with every sweep)")

    def __attrs_post_init__(self):
        for name, studies in self.panels.items():
            if not isinstance(studies, (list, tuple)) or not studies or not all(isinstance(n, str) for n in studies):
                raise FieldError("panels", f"{name}: must be a non-empty list of sweep names, got {studies!r}")

    def check_studies(self, studies) -> None:
        """Called when the experiment file is read: some sweep varies ``rate_key``, ``panels``
        name such sweeps, and the metrics needing ``[slo]`` targets have them."""
        sweeps = [s for s in studies if s.kind == "sweep" and self.rate_key in s.keys]
        if not sweeps:
            swept = sorted({key for s in studies if s.kind == "sweep" for key in s.keys})
            raise FieldError("rate_key", f"no sweep over {self.rate_key!r}, so no goodput to find; swept keys: "
                                         f"{', '.join(swept) or 'none'}")
        check_panels(self, [s.name for s in sweeps])
        check_slo(self.metric, sweeps, "metric")
        for metric in self.metrics:
            check_slo(metric, sweeps, "metrics")


@attrs.frozen
class System:
    """One system's curve and goodput."""

    label: str
    study: str
    gpus: int
    rates: tuple          # swept rates, ascending
    attainment: tuple     # attainment at each
    goodput: float        # requests/s
    bound: str            # "" exact crossing, ">=" every rate met the target, "<" none did
    runs: tuple = ()      # the runs, by rate
    attainment_target: float = 0.9

    @property
    def per_gpu(self) -> float:
        return self.goodput / self.gpus if self.gpus else math.nan

    def shown(self, per_gpu: bool = False) -> str:
        """The goodput as the table prints it: ``">=40.00"`` when every swept rate met the target,
        ``"<4.00"`` (below the lowest swept rate) when none did."""
        scale = self.gpus if per_gpu and self.gpus else 1
        if self.bound == "<":
            return f"<{self.rates[0] / scale:.2f}" if self.rates else "<"
        return f"{self.bound}{self.goodput / scale:.2f}"

    def between(self) -> str:
        """The two swept rates the target was crossed between (the interpolation's bracket; its
        width is the goodput's resolution), or what bounds it when it was not crossed."""
        rates = self.rates
        if self.bound == "<":
            return f"below {rates[0]:g}" if rates else ""
        if self.bound == ">=":
            return f"{rates[-1]:g} or more"
        i = next((k for k in range(1, len(rates)) if not self.attainment[k] >= self.attainment_target), None)
        return f"{rates[i - 1]:g}-{rates[i]:g}" if i is not None else ""


def crossing(rates, values, target: float) -> tuple[float, str]:
    """Where ``values`` (at ascending ``rates``) first drop below ``target``, interpolated."""
    if not rates or not values[0] >= target:
        return 0.0, "<"
    for i in range(1, len(rates)):
        if not values[i] >= target:
            r0, r1, a0, a1 = rates[i - 1], rates[i], values[i - 1], values[i]
            if math.isnan(a1) or a0 == a1:
                return float(r0), ""
            return float(r0 + (r1 - r0) * (a0 - target) / (a0 - a1)), ""
    return float(rates[-1]), ">="


def systems(results, config: GoodputConfig) -> list[System]:
    """Every system of the experiment: each sweep over ``rate_key`` (per combination of its other keys)."""
    out = []
    for study in results.studies:
        if study.kind != "sweep" or config.rate_key not in study.keys:
            continue
        groups: dict[str, list] = {}
        for run in study.runs:
            rest = {k: v for k, v in run.point.items() if k != config.rate_key}
            groups.setdefault(point_label(rest), []).append(run)
        for rest, runs in groups.items():
            runs = sorted(runs, key=lambda r: r.point[config.rate_key])
            rates = tuple(float(r.point[config.rate_key]) for r in runs)
            values = tuple(_number(metric_at(r.metrics, config.metric)) for r in runs)
            goodput, bound = crossing(rates, values, config.attainment)
            gpus = int(metric_at(runs[0].metrics, "gpus", 1) or 1)
            label = f"{study.name} [{rest}]" if rest else study.name
            out.append(System(label, study.name, gpus, rates, values, goodput, bound, tuple(runs),
                              config.attainment))
    return out


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def render(found: list[System], config: GoodputConfig) -> str:
    header = ("system", "gpus", "goodput_rps", "per_gpu_rps", "between_rps")
    rows = [(s.label, str(s.gpus), s.shown(), s.shown(per_gpu=True), s.between()) for s in found]
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    lines = [f"goodput: highest rate with >= {config.attainment:.0%} of requests within both SLOs "
             f"({config.metric} over {config.rate_key}), interpolated between the two swept rates around "
             f"the crossing (between_rps)"]
    lines.append("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))))
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    if not found:
        lines.append(f"(no sweep over {config.rate_key})")
    return "\n".join(lines) + "\n"


def panel_rows(found: list[System], config: GoodputConfig) -> list[tuple[str, list[System]]]:
    """The figure's rows: each ``panels`` entry's systems in the order named, or all in one row."""
    if not config.panels:
        return [("", found)]
    by_study: dict[str, list[System]] = {}
    for s in found:
        by_study.setdefault(s.study, []).append(s)
    try:
        check_panels(config, list(by_study))
    except ConfigError as exc:
        raise ConfigError(f"[reports.goodput] {exc}") from None
    return [(name, [s for n in studies for s in by_study[n]]) for name, studies in config.panels.items()]


def check_panels(config: GoodputConfig, sweeps: list[str]) -> None:
    """ConfigError (not naming the table) unless every name in ``panels`` is one of ``sweeps``
    (the names of the sweeps over the rate key)."""
    for name, studies in config.panels.items():
        missing = [n for n in studies if n not in sweeps]
        if missing:
            known = ", ".join(sorted(sweeps)) or "(none)"
            raise ConfigError(f"panels.{name}: {missing[0]!r} is not a sweep over {config.rate_key}; sweeps: {known}")


def figure(found: list[System], config: GoodputConfig, dpi: int = 110):
    from .plot_common import line_style, metric_label, metric_value, new_figure, titles, use_log_scale, \
        wide_positive_range

    rows = panel_rows(found, config)
    columns = 2 + len(config.metrics)
    fig = new_figure(4.6 * columns, 3.6 * len(rows), dpi)
    axes = fig.subplots(len(rows), columns, squeeze=False)
    for (name, systems_), row in zip(rows, axes):
        curves, bars, *others = row
        prefix = f"{name}: " if name else ""
        drawn: dict[str, list] = {}
        for i, s in enumerate(systems_):
            per_gpu = [r / s.gpus for r in s.rates]
            curves.plot(per_gpu, s.attainment, marker="o", markersize=3, label=s.label, **line_style(i))
            for ax, metric in zip(others, config.metrics):
                values = [metric_value(run.metrics, metric) for run in s.runs]
                ax.plot(per_gpu, [math.nan if v is None else v for v in values], marker="o", markersize=3,
                        **line_style(i))
                drawn.setdefault(metric, []).extend(v for v in values if v is not None)
        curves.axhline(config.attainment, color="0.3", linestyle=":", linewidth=1)
        curves.set_xlabel("request rate per GPU (requests/s)")
        curves.set_ylabel("within both SLOs (share)")
        curves.set_title(f"{prefix}SLO attainment", fontsize=10)
        curves.set_ylim(-0.02, 1.02)
        curves.grid(alpha=0.3)
        curves.legend(fontsize=7, loc="lower left")
        y = list(range(len(systems_)))[::-1]
        bars.barh(y, [s.per_gpu for s in systems_], color=[line_style(i)["color"] for i in range(len(systems_))])
        bars.set_yticks(y, [s.label for s in systems_], fontsize=7)
        for yi, s in zip(y, systems_):
            bars.text(s.per_gpu, yi, f" {s.shown(per_gpu=True)}", va="center", fontsize=7)
        bars.set_xlabel("goodput per GPU (requests/s)")
        bars.set_title(f"{prefix}goodput per GPU", fontsize=10)
        bars.grid(axis="x", alpha=0.3)
        for ax, metric in zip(others, config.metrics):
            ax.set_xlabel("request rate per GPU (requests/s)")
            ax.set_ylabel(metric_label(metric))
            ax.set_title(f"{prefix}{metric}", fontsize=10)
            if wide_positive_range(drawn.get(metric, []), ratio=10.0):  # (a decade or more: else linear)
                use_log_scale(ax, "y", drawn[metric])
            ax.grid(alpha=0.3)
    titles(fig, "Goodput per GPU (DistServe)",
           f"highest rate with >= {config.attainment:.0%} of requests within the TTFT and TPOT targets")
    return fig


class GoodputReport:
    """Prints and writes each sweep's goodput per GPU, and draws plots/goodput.png."""

    def __init__(self, config: GoodputConfig | None = None, stream=None):
        self.config = config or GoodputConfig()
        self.stream = stream

    def write(self, results, out_dir) -> list[Path]:
        found = systems(results, self.config)
        text = render(found, self.config)
        (self.stream or sys.stdout).write(text)
        out = Path(out_dir)
        written = [out / "goodput.txt"]
        atomic_write(written[0], text)
        if found:
            from .plots import png_bytes

            fig = figure(found, self.config)
            path = out / "plots" / "goodput.png"
            atomic_write(path, png_bytes(fig, fig.dpi))
            written.append(path)
        return written
