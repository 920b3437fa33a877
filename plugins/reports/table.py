"""The summary table: one row per run, printed and saved as ``summary.txt``.

``columns`` are dotted metric names (``per_class.interactive.ttft_ms.p99`` reaches into the
nested metrics). With ``best = "<metric>"`` the run(s) with the best value of that metric
(``best_is = "highest"`` or ``"lowest"``) get a ``*`` after their name, and a line under the
table names them (see :mod:`.best`).

Overloaded runs are marked too (see :mod:`schedlab.stability`): ``!`` after the name of a run
whose waiting queue grows (its percentiles depend on how long it ran), ``?`` where it grew but
the run was too short to be sure; a line under the table gives each one's numbers.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs

from schedlab.configs import metric_list_field
from schedlab.metrics import metric_at
from schedlab.results_io import atomic_write
from schedlab.stability import stability_text

from .best import best_field, best_is_field, best_runs, best_text

DEFAULT_COLUMNS = (
    "finished", "ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "tpot_ms.p99", "e2e_ms.p99",
    "throughput_tps", "slot_utilisation", "iterations", "num_preemptions",
)


@attrs.frozen
class TableConfig:
    columns: tuple = metric_list_field(DEFAULT_COLUMNS, help="metrics to show, as dotted names")
    best: str | None = best_field()
    best_is: str = best_is_field()


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value == 0 or 0.01 <= abs(value) < 1e6:
            return f"{value:.4g}" if abs(value) < 1 else f"{value:,.1f}" if abs(value) < 1e4 else f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


BEST_MARK = " *"
STABILITY_MARKS = {"unstable": " !", "inconclusive": " ?"}


def stability_mark(run) -> str:
    """`` !`` for an unstable run, `` ?`` for an inconclusive one, else nothing."""
    stability = run.metrics.get("stability")
    return STABILITY_MARKS.get(stability.get("verdict"), "") if isinstance(stability, dict) else ""


def stability_lines(runs) -> list[str]:
    """One line per unstable or inconclusive run, with its mark, under the table."""
    return [f"{mark.strip()} {run.name}: {stability_text(run.metrics['stability'])}"
            for run in runs if (mark := stability_mark(run))]


def render(results, columns=DEFAULT_COLUMNS, best: str | None = None, best_is: str = "highest") -> str:
    """The table, the best run by ``best`` if asked, and, for searches, what they found."""
    header = ["run"] + list(columns)
    runs = _listed_runs(results)
    winners, top = best_runs(runs, best, best_is) if best else ([], None)
    marked = {id(run) for run in winners}
    rows = [[run.name + (BEST_MARK if id(run) in marked else "") + stability_mark(run)]
            + [_fmt(metric_at(run.metrics, c)) for c in columns] for run in runs]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = [f"{results.name}"]
    lines.append("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))))
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    if best:
        lines.append(("* " if winners else "") + best_text(best, best_is, winners, top))
    lines += stability_lines(runs)
    seen = set()
    for run in results.all_runs():
        kv = run.meta.get("kv_cache") or {}
        if "model" in kv and (kv["model"], kv["gpu"], kv["num_blocks"]) not in seen:
            seen.add((kv["model"], kv["gpu"], kv["num_blocks"]))
            lines.append(f"KV cache: {kv['model']} on {kv['gpu']} (tp {kv['tensor_parallel']}): "
                         f"{kv['bytes_per_token'] / 1024:g} KiB/token, {kv['bytes_per_block'] / 2**20:g} MiB/block, "
                         f"{kv['num_blocks']:,} blocks = {kv['tokens']:,} tokens")
    for study in results.studies:
        if study.search is not None:
            lines.append(f"search {study.name}: {study.search.message}")
        if study.plan is not None:
            plan = study.plan
            lines.append(f"plan {study.name}: {plan.message}")
            lines.append(f"plan {study.name}: {plan.counts_text()}; cost vs {plan.attainment} frontier: "
                         f"{', '.join(plan.frontier) or '-'}")
        rejected = sum(r.metrics.get("rejected", 0) for r in study.runs)
        if rejected:
            lines.append(f"{study.name}: {rejected} requests rejected (reasons in requests.csv)")
    return "\n".join(lines) + "\n"


def _listed_runs(results) -> list:
    """Every run, except that a plan lists only each candidate's answer and its frontier
    (all its deployments are in summary.csv)."""
    runs = []
    for study in results.studies:
        if study.plan is not None:
            shown = study.plan.shown_runs()
            runs += [run for run in study.runs if run.name in shown]
        else:
            runs += study.runs
    return runs


class TableReport:
    """Prints the summary table and writes it to summary.txt."""

    def __init__(self, config: TableConfig | None = None, stream=None):
        self.config = config or TableConfig()
        self.stream = stream

    def text(self, results) -> str:
        """The table as printed (index.html shows it too)."""
        return render(results, self.config.columns, self.config.best, self.config.best_is)

    def write(self, results, out_dir) -> list[Path]:
        text = self.text(results)
        (self.stream or sys.stdout).write(text)
        path = Path(out_dir) / "summary.txt"
        atomic_write(path, text)
        return [path]
