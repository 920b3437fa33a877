"""The summary table: one row per run, printed and saved as ``summary.txt``.

``columns`` are dotted metric names (``per_class.interactive.ttft_ms.p99`` reaches into the
nested metrics). With ``best = "<metric>"`` the run(s) with the best value of that metric
(``best_is = "highest"`` or ``"lowest"``) get a ``*`` after their name, and a line under the
table names them (see :mod:`.best`).

Overloaded runs are marked too (see :mod:`schedlab.results.stability`): ``!`` after the name of a run
whose waiting queue grows (its percentiles depend on how long it ran), ``?`` where it grew but
the run was too short to be sure; a line under the table gives each one's numbers.

Runs with replicas show each metric as ``mean ±h``, h the half-width of its 95% confidence
interval. Single runs with replicas are then compared with a ``baseline`` run (default: the
first of them) by paired differences over their common-random-number replicas, for the
metrics in ``differences`` (default: ``best`` if set, else p99 TTFT and throughput); a
difference whose interval contains 0 is marked *within noise*, and so is a best run whose
lead over the runner-up is.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs

from schedlab.configs import FieldError, metric_list_field, str_field
from schedlab.results.metrics import metric_at
from schedlab.results.stability import stability_text
from schedlab.results.storage import atomic_write
from schedlab.study.replicas import paired, paired_difference

from .best import best_field, best_is_field, best_runs, best_text

DEFAULT_COLUMNS = (
    "finished", "ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "tpot_ms.p99", "e2e_ms.p99",
    "throughput_tps", "slot_utilisation", "iterations", "num_preemptions",
)
#: Added to the default columns when a run metered energy ([power]).
ENERGY_COLUMNS = ("energy.j_per_token", "energy.j_per_request", "energy.avg_power_w", "energy.kwh")


@attrs.frozen
class TableConfig:
    columns: tuple = metric_list_field(DEFAULT_COLUMNS, help="metrics to show, as dotted names")
    best: str | None = best_field()
    best_is: str = best_is_field()
    baseline: str | None = str_field(None, optional=True,
                                     help="run that replicated single runs are compared with (default: the first)")
    differences: tuple = metric_list_field((), help="metrics of the paired differences (default: best, "
                                                    "else ttft_ms.p99 and throughput_tps)")

    def check_studies(self, studies) -> None:
        """Called when the experiment file is read: ``baseline`` names a replicated single run, and
        a column of ``slo.*`` (``energy.*``) metrics has a run with ``[slo]`` targets (a ``[power]``
        table), else every row showed -."""
        from schedlab.study.spec import check_some_run_has

        studies = list(studies)
        for field, metrics in (("columns", self.columns), ("best", (self.best,)), ("differences", self.differences)):
            for metric in metrics:
                check_some_run_has(metric, studies, field)
        if self.baseline is None:
            return
        replicated = [s.name for s in studies if s.kind == "run" and s.replicas > 1]
        if self.baseline not in replicated:
            raise FieldError("baseline", f"no replicated single run named {self.baseline!r} (the paired differences "
                                         "compare [[runs]] entries with replicas > 1 and no sweep, search or plan); "
                                         f"they are: {', '.join(replicated) or 'none'}")


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


def _count(value) -> str:
    """A count in the footer: a whole number as one, a replica mean (a fraction) as :func:`_fmt` has it."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return _fmt(value)


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


#: a half-width below this share of the interval's ends is floating-point noise of replicas that
#: agree (a replayed file draws nothing at random: ±8e-17 said nothing), not shown
SAME_SHARE = 1e-9

#: the columns of money (a plan's, per hour): to the cent, as prices are written
MONEY_COLUMNS = ("cost_per_hour", "energy_cost_per_hour", "cost_per_mtok")


def _cell(run, column: str) -> str:
    value = metric_at(run.metrics, column)
    money = column.rsplit(".", 1)[-1] in MONEY_COLUMNS and isinstance(value, float) and math.isfinite(value)
    text = f"{value:,.2f}" if money else _fmt(value)
    pair = run.intervals.get(column) if run.intervals else None
    if pair and all(isinstance(v, float) and math.isfinite(v) for v in pair) and pair[1] > pair[0] \
            and (pair[1] - pair[0]) / 2 > SAME_SHARE * max(abs(pair[0]), abs(pair[1])):
        text += f" ±{_fmt((pair[1] - pair[0]) / 2)}"
    return text


def _signed(value: float) -> str:
    return ("+" if value > 0 else "") + _fmt(value)


def difference_lines(results, best: str | None, best_is: str, baseline: str | None, metrics) -> list[str]:
    """Paired differences of replicated single runs against the baseline (see the module doc)."""
    singles = [run for study in results.studies if study.kind == "run" for run in study.runs if run.replicas]
    if len(singles) < 2:
        return []
    base = next((run for run in singles if run.name == baseline), None) if baseline else singles[0]
    if base is None:
        return [f"paired differences: no replicated single run named {baseline!r}"]
    metrics = list(metrics) or ([best] if best else ["ttft_ms.p99", "throughput_tps"])
    lines = [f"paired differences vs {base.name} ({len(base.replicas)} replicas each, common random numbers, "
             f"mean [95% CI]):"]
    width = max(len(run.name) for run in singles)
    for run in singles:
        if run is base:
            continue
        if not paired(base, run):
            lines.append(f"  {run.name.ljust(width)}  not paired (other seeds or replica count)")
            continue
        parts = []
        for metric in metrics:
            d = paired_difference(base, run, metric)
            if d is None or not math.isfinite(d.mean):
                parts.append(f"{metric} -")
                continue
            text = f"{metric} {_signed(d.mean)} [{_signed(d.low)}, {_signed(d.high)}]"
            parts.append(text + (" within noise" if d.within_noise else ""))
        lines.append(f"  {run.name.ljust(width)}  " + "   ".join(parts))
    return lines


def _best_noise(runs, winners, best: str, best_is: str) -> str:
    """'; within noise of X (...)' when the best run's lead over the runner-up is within noise."""
    if len(winners) != 1 or not winners[0].replicas:
        return ""
    rest = [run for run in runs if run is not winners[0] and paired(winners[0], run)]
    runner_up, _ = best_runs(rest, best, best_is) if rest else ([], None)
    if not runner_up:
        return ""
    d = paired_difference(runner_up[0], winners[0], best)
    if d is None or not d.within_noise:
        return ""
    return (f"; within noise of {runner_up[0].name} (paired difference {_signed(d.mean)} "
            f"[{_signed(d.low)}, {_signed(d.high)}])")


def _layout_text(layout) -> str:
    """``, pp 2: a stage's`` or ``, dp 2 + ep: a rank's``: whose pool a KV line sizes, beyond
    tensor parallelism (a stage holds its layers' KV, a rank its own requests')."""
    if not isinstance(layout, dict):
        return ""
    if layout.get("pipeline_parallel", 1) > 1:
        return f", pp {layout['pipeline_parallel']}: a stage's"
    if layout.get("data_parallel", 1) > 1:
        return f", dp {layout['data_parallel']}{' + ep' if layout.get('expert_parallel') else ''}: a rank's"
    return ""


def render(results, columns=DEFAULT_COLUMNS, best: str | None = None, best_is: str = "highest",
           baseline: str | None = None, differences=()) -> str:
    """The table, the best run by ``best`` if asked, and, for searches, what they found."""
    header = ["run"] + list(columns)
    runs = _listed_runs(results)
    winners, top = best_runs(runs, best, best_is) if best else ([], None)
    marked = {id(run) for run in winners}
    rows = [[run.name + (BEST_MARK if id(run) in marked else "") + stability_mark(run)]
            + [_cell(run, c) for c in columns] for run in runs]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = [f"{results.name}"]
    lines.append("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))))
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    if best:
        lines.append(("* " if winners else "") + best_text(best, best_is, winners, top)
                     + (_best_noise(runs, winners, best, best_is) if winners else ""))
    replicated = [run for run in runs if run.replicas]
    if replicated:
        counts = sorted({len(run.replicas) for run in replicated})
        lines.append(f"±: half-width of the 95% confidence interval over {'/'.join(map(str, counts))} replicas "
                     f"(seeds derived from each run's seed)")
    lines += stability_lines(runs)
    lines += difference_lines(results, best, best_is, baseline, differences)
    seen = set()
    for run, kv, pool in _kv_caches(results):
        if "model" in kv:  # (one line per distinct cache: runs sharing num_blocks may size them otherwise)
            line = (f"KV cache{pool}: {kv['model']}"
                    + (f" and drafter {kv['draft_model']}" if kv.get("draft_model") else "")
                    + f" on {kv['gpu']} (tp {kv['tensor_parallel']}"
                    f"{_layout_text(run.meta.get('parallelism'))}): "
                    f"{kv['bytes_per_token'] / 1024:g} KiB/token, {kv['bytes_per_block'] / 2**20:g} MiB/block, "
                    f"{kv['num_blocks']:,} blocks = {kv['tokens']:,} tokens"
                    + (f" (num_blocks set; model and gpu give {kv['derived_blocks']:,})"
                       if kv.get("derived_blocks", kv["num_blocks"]) != kv["num_blocks"] else "")
                    + (f"; window layers keep {kv['window_tokens']:,} tokens in {kv['window_groups']} more "
                       "group(s)" if kv.get("window_tokens") else "")
                    + (f"; SGLang's window layers: a pool of {kv['swa_full_tokens_ratio']:g} tokens per "
                       "full-attention one" if kv.get("swa_full_tokens_ratio") else "")
                    + _start_up_note(run.meta.get("start_up_problem", "")))
            if line not in seen:
                seen.add(line)
                lines.append(line)
    lines += energy_lines(runs)
    for study in results.studies:
        if study.search is not None:
            lines.append(f"search {study.name}: {study.search.message}")
        if study.plan is not None:
            plan = study.plan
            lines.append(f"plan {study.name}: {plan.message}")
            lines.append(f"plan {study.name}: {plan.counts_text()}; cost vs {plan.attainment} frontier: "
                         f"{', '.join(plan.frontier) or '-'}")
        # (a replicated run's counts are its means over its replicas: the sums are formatted as
        # numbers and say so)
        counts = sorted({len(r.replicas) for r in study.runs if r.replicas})
        means = (f"; replicated runs count their means over {'/'.join(map(str, counts))} replicas"
                 if counts else "")
        rejected = sum(r.metrics.get("rejected", 0) for r in study.runs)
        if rejected:
            lines.append(f"{study.name}: {_count(rejected)} requests rejected (reasons in requests.csv{means})")
        timed_out = sum(r.metrics.get("timed_out", 0) for r in study.runs)
        # (of those, the requests an autoscaler's drain timeout aborted: schedlab.engine.drain)
        drained = sum((r.metrics.get("fleet") or {}).get("drain_aborted", 0) for r in study.runs)
        if timed_out and drained:
            aborted = sum(r.metrics.get("aborted", 0) for r in study.runs)
            lines.append(f"{study.name}: {_count(timed_out)} requests failed for their clients ({_count(drained)} "
                         f"aborted by the autoscaler's drain timeout, fleet.drain_aborted; "
                         f"{_count(timed_out - drained)} timed out, their clients gave up; {_count(aborted)} aborted "
                         f"in the engine in all; in requests.csv{means})")
        elif timed_out:
            aborted = sum(r.metrics.get("aborted", 0) for r in study.runs)
            lines.append(f"{study.name}: {_count(timed_out)} requests timed out (their clients gave up; "
                         f"{_count(aborted)} of them aborted in the engine; in requests.csv{means})")
    return "\n".join(lines) + "\n"


def energy_lines(runs) -> list[str]:
    """Per run that metered energy: its GPU energy split, peak power and, by class, the
    requests' own shares per output token."""
    lines = []
    for run in runs:
        e = run.metrics.get("energy")
        if not isinstance(e, dict):
            continue
        text = (f"energy {run.name}: GPUs {_fmt(e['gpu_j'])} J ({_fmt(e['busy_j'])} in iterations, "
                f"{_fmt(e['idle_j'])} idle), peak {_fmt(e['peak_power_w'])} W")
        if e.get("host_j") or e.get("pue", 1.0) != 1.0:
            text += f", host {_fmt(e['host_j'])} J, facility {_fmt(e['facility_j'])} J (PUE {e['pue']:g})"
        classes = run.metrics.get("per_class") or {}
        shares = [f"{name} {_fmt(sub['energy']['j_per_token'])}" for name, sub in classes.items()
                  if isinstance(sub, dict) and isinstance(sub.get("energy"), dict)]
        if shares:
            text += "; J/token by class (their iterations' shares, idle left out): " + ", ".join(shares)
        lines.append(text)
    return lines


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
        """The table as printed (index.html shows it too); the default columns gain the energy
        ones when some run metered energy."""
        columns = self.config.columns
        if columns == DEFAULT_COLUMNS and any("energy" in run.metrics for run in results.all_runs()):
            columns = columns + ENERGY_COLUMNS
        return render(results, columns, self.config.best, self.config.best_is, self.config.baseline,
                      self.config.differences)

    def write(self, results, out_dir) -> list[Path]:
        text = self.text(results)
        (self.stream or sys.stdout).write(text)
        path = Path(out_dir) / "summary.txt"
        atomic_write(path, text)
        return [path]


def _kv_caches(results):
    """``(run, kv_cache meta, label)`` of every run's cache -- of each pool's in a disaggregated run,
    labelled `` (decode pool)`` (the decode pool's own model, GPU and tensor parallelism were left
    out of the lines)."""
    for run in results.all_runs():
        pools = run.meta.get("pools")
        caches = [(pool.get("kv_cache"), f" ({name} pool)") for name, pool in pools.items()
                  if isinstance(pool, dict)] if isinstance(pools, dict) else []
        caches = [(kv, label) for kv, label in caches if isinstance(kv, dict)]
        if len(caches) > 1 and all(kv == caches[0][0] for kv, _ in caches):
            caches = [(caches[0][0], " (each pool)")]
        yield from ((run, kv, label) for kv, label in caches or [(run.meta.get("kv_cache") or {}, "")])


def _start_up_note(problem: str) -> str:
    """Why the engine would refuse to start with this cache (the run's ``start_up_problem``, from
    the scheduler: vLLM checks that one sequence of ``max_model_len`` fits in the pool)."""
    return f"; {problem}" if problem else ""
