"""The ``plots`` report: PNG figures in ``<out>/plots/``, from fresh or saved results.

``schedlab run`` writes them after the runs; ``schedlab plot DIR`` redraws them from the files
of the ``json`` report (:func:`schedlab.results.storage.load`). Both go through :func:`plan`, so
they write the same files with the same data. Figures, in this order:

* ``latency_cdf.png`` -- TTFT/TPOT/e2e CDFs of every single run (study kind "run") together;
* ``compare.png`` -- with ``compare_metrics``, those metrics as bars, one per single run, the
  best run by ``best`` highlighted (see :mod:`.plot_compare`);
* ``latency_cdf_<sweep>.png`` -- the same for each sweep of at most ``cdf_max_lines`` points;
* ``sweep_<sweep>.png`` -- ``sweep_metrics`` against the swept key, for each sweep (with
  ``mark_last_zero``, a marker where that metric stops being 0);
* ``sweep_<name>.png`` -- for each entry of ``overlays``, the sweeps and single runs it names
  drawn together (see :func:`~.plot_sweep.overlay_figure`); a name that is not a run of the
  experiment, or a run that is a search, is an error;
* ``search_<search>.png`` -- each search's probes, threshold and chosen value;
* ``plan_<plan>.png`` -- each capacity plan's deployments, cost against attainment, with the
  Pareto frontier (see :mod:`.plot_plan`);
* ``timeline_<run>.png`` -- running/waiting/KV over time, for at most ``max_timelines`` runs
  with a timeline, chosen in this order: every single run (file order); then each search's
  chosen run and its closest failing run; then sweep points in sweep and point order.

File names keep letters, digits, ``.``, ``_`` and ``-``: every other run of characters
becomes ``_``, together with any dots or dashes next to it, and none is left at either end
(``queue[rate=5]`` -> ``queue_rate_5``, ``path=../a/b.json`` -> ``path_a_b.json``); long names
are cut and given a short hash; a name already used (ignoring case) gets ``-2``, ``-3``, ...
Each PNG is rendered in memory and written atomically.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Callable

import attrs
from matplotlib.figure import Figure

from schedlab.errors import ConfigError
from schedlab.results.file_names import UniqueStems, safe_stem
from schedlab.results.storage import atomic_write

from .plot_config import PlotsConfig
from .plot_cdf import latency_cdf_figure
from .plot_compare import compare_figure
from .plot_plan import plan_figure
from .plot_search import search_figure
from .plot_sweep import overlay_figure, sweep_figure
from .plot_timeline import has_timeline, timeline_figure

FOLDER = "plots"
@attrs.frozen
class PlannedFigure:
    """One PNG to write: its file name (inside plots/) and how to draw it (None: nothing to draw)."""

    filename: str
    draw: Callable[[], Figure | None]


def timeline_runs(results, limit: int) -> list:
    """The runs that get a timeline figure, in drawing order (see the module doc)."""
    chosen: list = []
    seen: set[int] = set()

    def add(run) -> None:
        if run is not None and id(run) not in seen and has_timeline(run):
            seen.add(id(run))
            chosen.append(run)

    for study in results.studies:
        if study.kind == "run":
            for run in study.runs:
                add(run)
    for study in results.studies:
        if study.kind == "search" and study.search is not None:
            for value in (study.search.value, study.search.failing):
                add(_probe_run(study.search, value))
    for study in results.studies:
        if study.kind == "sweep":
            for run in study.runs:
                add(run)
    return chosen[:limit]


def _probe_run(outcome, value):
    if value is None:
        return None
    for probe in outcome.probes:
        if probe.value == value and probe.payload is not None:
            return probe.payload
    return None


def plan(results, config: PlotsConfig | None = None) -> list[PlannedFigure]:
    """Every figure the report writes for ``results``, in order, with unique safe file names."""
    config = config or PlotsConfig()
    dpi = config.dpi
    items: list[tuple[str, Callable[[], Figure | None]]] = []
    singles = [run for study in results.studies if study.kind == "run" for run in study.runs]
    if singles:
        items.append(("latency_cdf", lambda: latency_cdf_figure(singles, f"latency CDFs: {results.name}", dpi)))
    if singles and config.compare_metrics:
        items.append(("compare", _bind(compare_figure, singles, config.compare_metrics, dpi, config.best,
                                       config.best_is, f"runs compared: {results.name}")))
    for study in results.studies:
        if study.kind != "sweep" or not study.runs:
            continue
        if len(study.runs) <= config.cdf_max_lines:
            items.append((f"latency_cdf_{safe_stem(study.name)}", _bind(_sweep_cdf, study, dpi)))
        items.append((f"sweep_{safe_stem(study.name)}",
                      _bind(sweep_figure, study, config.sweep_metrics, dpi, config.mark_last_zero)))
    for name, names in config.overlays.items():
        studies = [_overlay_study(results, name, study_name) for study_name in names]
        items.append((f"sweep_{safe_stem(name)}",
                      _bind(_overlay, name, studies, config.sweep_metrics, dpi, config.mark_last_zero)))
    for study in results.studies:
        if study.kind == "search" and study.search is not None:
            items.append((f"search_{safe_stem(study.name)}", _bind(search_figure, study, dpi)))
    for study in results.studies:
        if study.plan is not None:
            items.append((f"plan_{safe_stem(study.name)}", _bind(plan_figure, study, dpi)))
    for run in timeline_runs(results, config.max_timelines):
        items.append((f"timeline_{safe_stem(run.name)}", _bind(timeline_figure, run, dpi)))
    stems = UniqueStems()  # (case-insensitive file systems too)
    return [PlannedFigure(f"{stems.take(stem)}.png", draw) for stem, draw in items]


def _overlay_study(results, overlay: str, name: str):
    where = f"[reports.plots] overlays.{overlay}"
    try:
        study = results.study(name)
    except KeyError as exc:
        raise ConfigError(f"{where}: {exc.args[0]}") from None
    if study.kind == "search":
        raise ConfigError(f"{where}: {name!r} is a search; overlays draw sweeps and single runs")
    return study


def _overlay(name, studies, metrics, dpi, mark):
    try:
        return overlay_figure(name, studies, metrics, dpi, mark)
    except ValueError as exc:
        raise ConfigError(f"[reports.plots] {exc}") from None


def _bind(fn, *args):
    return lambda: fn(*args)


def _sweep_cdf(study, dpi: int) -> Figure:
    labels = [_point_part(run.name, study.name) for run in study.runs]
    return latency_cdf_figure(study.runs, f"latency CDFs: sweep {study.name}", dpi, labels=labels)


def _point_part(run_name: str, study_name: str) -> str:
    """``queue[rate=5]`` in study ``queue`` -> ``rate=5`` (legend text)."""
    if run_name.startswith(study_name + "[") and run_name.endswith("]"):
        return run_name[len(study_name) + 1:-1]
    return run_name


def png_bytes(fig: Figure, dpi: int) -> bytes:
    """The figure as PNG bytes. A character no font has (a NUL in a run's name) draws as a box,
    and a crowded figure keeps its plain layout: matplotlib's warnings about them would only
    leak to stderr."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font", category=UserWarning)
        warnings.filterwarnings("ignore", message="constrained_layout not applied", category=UserWarning)
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


class PlotsReport:
    """Writes the PNG figures listed in the module doc into ``<out_dir>/plots/``."""

    def __init__(self, config: PlotsConfig | None = None):
        self.config = config or PlotsConfig()

    def write(self, results, out_dir) -> list[Path]:
        folder = Path(out_dir) / FOLDER
        written = []
        for item in plan(results, self.config):
            fig = item.draw()
            if fig is None:
                continue
            path = folder / item.filename
            atomic_write(path, png_bytes(fig, self.config.dpi))
            written.append(path)
        return written
