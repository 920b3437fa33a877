"""Settings of the ``plots`` report (kept apart so that registering it does not import matplotlib)."""

from __future__ import annotations

import attrs

from schedlab.configs import FieldError, int_field, metric_field, metric_list_field, table_field
from schedlab.errors import ConfigError

from .best import best_field, best_is_field

DEFAULT_SWEEP_METRICS = ("queue_ms.p99", "ttft_ms.p99", "tpot_ms.p99", "throughput_tps", "avg_queue",
                         "num_preemptions")


def _check_overlays(overlays: dict) -> None:
    for name, studies in overlays.items():
        names_ok = isinstance(studies, (list, tuple)) and all(isinstance(n, str) for n in studies)
        if not names_ok or not studies:
            raise FieldError("overlays", f"{name}: must be a non-empty list of run names, got {studies!r}")
        if len(set(studies)) != len(studies):
            raise FieldError("overlays", f"{name}: names a run twice: {list(studies)!r}")


@attrs.frozen
class PlotsConfig:
    max_timelines: int = int_field(12, min=0, help="most timeline figures (single runs first, then "
                                                   "search boundaries, then sweep points)")
    sweep_metrics: tuple = metric_list_field(
        DEFAULT_SWEEP_METRICS,
        help="metrics plotted against a sweep's key, as dotted names; ones absent from every run (e.g. slo.* "
             "without [slo]) are skipped")
    mark_last_zero: str | None = metric_field(
        None, optional=True,
        help="a metric such as 'num_preemptions': sweep figures get a dotted vertical line per line at the "
             "largest swept value up to which that metric is still 0 (where the trouble starts)")
    overlays: dict = table_field(
        attrs.Factory(dict),
        help="figure name -> run names drawn together in sweep_<name>.png: sweeps sharing their first key "
             "as lines, single runs as dashed horizontal reference lines")
    compare_metrics: tuple = metric_list_field(
        (),
        help="metrics drawn in compare.png as bars, one bar per single run (not sweep or search points); "
             "empty: no such figure")
    best: str | None = best_field()
    best_is: str = best_is_field()
    cdf_max_lines: int = int_field(8, min=1, help="sweeps with at most this many points also get a latency CDF figure")
    dpi: int = int_field(110, min=50, max=400, help="resolution of the PNGs (dots per inch)")

    def __attrs_post_init__(self):
        _check_overlays(self.overlays)

    def check_studies(self, studies) -> None:
        """Called when the experiment file is read: every overlay names runs of the experiment,
        none a search, and its sweeps share their first key (as :func:`.plot_sweep.overlay_figure`
        needs); a bar metric or ``best`` that needs ``[slo]`` or ``[power]`` has a run with it."""
        from schedlab.study.spec import check_some_run_has

        studies = list(studies)
        for metric in self.compare_metrics:
            check_some_run_has(metric, studies, "compare_metrics")
        check_some_run_has(self.best, studies, "best")
        by_name = {s.name: s for s in studies}
        for name, names in self.overlays.items():
            for study_name in names:
                if study_name not in by_name:
                    raise ConfigError(f"overlays.{name}: no study named {study_name!r}; the experiment has: "
                                      f"{', '.join(by_name)}")
                if by_name[study_name].kind == "search":
                    raise ConfigError(f"overlays.{name}: {study_name!r} is a search; overlays draw sweeps and "
                                      "single runs")
            sweeps = [by_name[n] for n in names if by_name[n].kind == "sweep" and by_name[n].keys]
            for s in sweeps[1:]:
                if s.keys[0] != sweeps[0].keys[0]:
                    raise ConfigError(f"overlays.{name}: sweep {s.name!r} varies {s.keys[0]!r}, "
                                      f"not {sweeps[0].keys[0]!r} like {sweeps[0].name!r}")
