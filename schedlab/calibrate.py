"""``schedlab calibrate``: fit a cost model's free parameters to a measured run.

The experiment's run must replay a measured run (a ``vllm_log`` or ``vllm_bench`` workload,
which keeps what the real run measured). Each ``--fit KEY=LOW:HIGH`` names a setting of the
run's tables (``cost_model.overhead_ms``, ``cost_model.mfu``, ``cost_model.decode_ms_per_step``)
and its bounds. The fit simulates the run at candidate values and minimises the mean absolute
error over the 15 statistics of :mod:`schedlab.results.compare` with scipy's bounded Nelder-Mead,
starting from the values in the file (or the middle of the bounds); it is deterministic.

It prints the fitted values, the error per statistic at the fit, and a TOML snippet to paste
into the ``[cost_model]`` table. ``--part FIRST:END`` fits on the statistics of those requests
of the log only -- the whole run is still simulated, so they queue behind and share the GPU
with the rest, as they did -- and prints the other requests' table as the prediction. ``--predict KEY=VALUE`` (repeatable) then runs the fitted
model on another workload (e.g. ``workload.start=150``: the other half of the log) and prints
that table too: fitting on one part and checking on another is how to tell a fit from an
overfit.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from .errors import ConfigError
from .results.compare import (
    comparison_rows, format_comparison, measured_statistics, simulated_latencies, statistics,
)
from .study.overrides import get_dotted, parse_assignment, set_dotted


@attrs.frozen
class Parameter:
    key: str
    low: float
    high: float


@attrs.frozen
class Fit:
    """The outcome: fitted values, the error at them, and how many runs it took."""

    values: dict[str, float]
    mean_abs_error_pct: float
    evaluations: int
    start: dict[str, float]


def parse_parameter(text: str) -> Parameter:
    """``cost_model.overhead_ms=0:5`` -> Parameter(key, 0.0, 5.0)."""
    key, sep, bounds = text.partition("=")
    low, colon, high = bounds.partition(":")
    try:
        lo, hi = float(low), float(high)
    except ValueError:
        lo = hi = math.nan
    if not sep or not colon or not key.strip() or not (lo < hi):
        raise ConfigError(f"--fit {text!r}: expected KEY=LOW:HIGH with LOW < HIGH, e.g. cost_model.overhead_ms=0:5")
    return Parameter(key.strip(), lo, hi)


def _mean_abs_error(result, rows=None) -> float:
    summary = result.metrics.get("vs_measured")
    if summary is None:
        raise ConfigError("the run's workload keeps no measured run (use a vllm_log or vllm_bench workload)")
    if rows is not None:
        from .results.compare import vs_measured

        summary = vs_measured(result.requests, result.measured, rows)
    value = summary["mean_abs_error_pct"]
    return value if math.isfinite(value) else 1e9


def parse_part(text: str | None, n: int):
    """``"0:150"`` -> the rows 0..149 of the measured run (and the others), or (None, None)."""
    import numpy as np

    if text is None:
        return None, None
    a, colon, b = text.partition(":")
    try:
        lo, hi = int(a or 0), int(b or n)
    except ValueError:
        lo = hi = -1
    if not colon or not 0 <= lo < hi <= n:
        raise ConfigError(f"--part {text!r}: expected FIRST:END with 0 <= FIRST < END <= {n} (requests of the log)")
    rows = np.arange(lo, hi)
    return rows, np.setdiff1d(np.arange(n), rows)


def calibrate(exp, parameters: list[Parameter], *, run_name: str | None = None, max_evaluations: int = 60,
              tolerance: float = 1e-3, rows=None) -> tuple[Fit, Any, Any]:
    """Fit ``parameters`` on one run of a loaded experiment (on the statistics of the measured
    run's ``rows`` only, when given: the whole run is simulated, so they still wait behind
    and share the GPU with the others).

    :returns: ``(fit, spec at the fit, result at the fit)``.
    :raises ConfigError: no such run, a key that is not a number, or no measured run.
    """
    from scipy.optimize import minimize  # fitting only; scipy is a dependency for this

    from .study.simulation import RunSpec, run

    studies = [s for s in exp.studies if run_name is None or s.name == run_name]
    if not studies:
        raise ConfigError(f"no run named {run_name!r}; the experiment has: {', '.join(s.name for s in exp.studies)}")
    if len(studies) > 1:
        raise ConfigError(f"the experiment has several runs; choose one with --run "
                          f"({', '.join(s.name for s in studies)})")
    from .study.simulation import _tables_with_defaults

    base = studies[0].base
    base = RunSpec(base.name, _tables_with_defaults(base.tables), base.seed, base.engine)
    start = []
    for p in parameters:
        value = get_dotted(base.tables, p.key, None)
        if value is None:
            value = (p.low + p.high) / 2.0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"--fit {p.key}: the run's value is not a number ({value!r})")
        start.append(min(max(float(value), p.low), p.high))
    cache: dict[tuple, tuple[float, Any]] = {}

    def spec_at(x) -> RunSpec:
        tables = base.tables
        for p, v in zip(parameters, x):
            tables = set_dotted(tables, p.key, float(v))
        return RunSpec(base.name, tables, base.seed, base.engine)

    def objective(x) -> float:
        key = tuple(round(float(v), 12) for v in x)
        if key not in cache:
            result = run(spec_at(x), exp.context, timeline=False)
            cache[key] = (_mean_abs_error(result, rows), result)
        return cache[key][0]

    objective(start)  # fail fast (bad key, no measured run) before scipy starts
    span = [p.high - p.low for p in parameters]
    # A first simplex a quarter of each range wide: the error surface is piecewise smooth
    # (iterations are discrete), so small steps see only its plateaus.
    simplex = [start] + [[v + (0.25 * span[i] if j == i else 0.0) * (1 if v + 0.25 * span[i] <= parameters[i].high
                                                                          else -1)
                          for j, v in enumerate(start)] for i in range(len(start))]
    outcome = minimize(objective, start, method="Nelder-Mead",
                       bounds=[(p.low, p.high) for p in parameters],
                       options={"initial_simplex": simplex, "maxfev": max_evaluations, "xatol": tolerance,
                                "fatol": 1e-3})
    best = min(cache, key=lambda k: cache[k][0])
    error, result = cache[best]
    fit = Fit({p.key: v for p, v in zip(parameters, best)}, error, len(cache),
              {p.key: v for p, v in zip(parameters, start)})
    del outcome
    return fit, spec_at(best), result


def snippet(spec, parameters: list[Parameter]) -> str:
    """The fitted tables as TOML to paste (each table the fit touched, in full)."""
    from .study.overrides import split_key

    lines = []
    for table in dict.fromkeys(split_key(p.key)[0] for p in parameters):
        lines.append(f"[{table}]")
        for key, value in spec.tables[table].items():
            if isinstance(value, dict):
                continue
            lines.append(f"{key} = {_toml(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}" if "e" not in f"{value:.6g}" else repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def report(fit: Fit, spec, result, parameters: list[Parameter], rows=None, others=None) -> str:
    """What ``schedlab calibrate`` prints."""
    lines = ["fit (start -> fitted, bounds):"]
    for p in parameters:
        lines.append(f"  {p.key:<32} {fit.start[p.key]:>10.4g} -> {fit.values[p.key]:<10.4g} [{p.low:g}, {p.high:g}]")
    lines.append(f"  {fit.evaluations} simulations; mean |error| {fit.mean_abs_error_pct:.2f}%")
    lines.append("")
    lines.append(_table(f"{spec.name} at the fit: simulated vs measured", result, rows))
    if others is not None and len(others):
        lines.append(_table(f"the other {len(others)} requests (not fitted on): simulated vs measured", result, others))
    lines.append("# paste into the experiment:")
    lines.append(snippet(spec, parameters))
    return "\n".join(lines)


def _table(title: str, result, rows=None) -> str:
    from .results.compare import select_requests

    if rows is None:
        sim, truth = simulated_latencies(result.requests, result.measured), measured_statistics(result.measured)
    else:
        chosen, lat = select_requests(result.requests, result.measured, rows)
        sim, truth = simulated_latencies(chosen, result.measured), statistics(lat)
        title += f" (requests {rows[0]}..{rows[-1]} of the log)" if len(rows) and rows[-1] - rows[0] + 1 == len(rows) \
            else f" ({len(rows)} requests)"
    return format_comparison(title, comparison_rows(statistics(sim), truth))


def predict(exp, spec, overrides: list[str]):
    """Run the fitted ``spec`` with ``overrides`` (``workload.start=150``) and return its result."""
    from .study.simulation import RunSpec, run

    tables = spec.tables
    for text in overrides:
        key, value = parse_assignment(text, where="--predict")
        tables = set_dotted(tables, key, value)
    return run(RunSpec(spec.name + " (predict)", tables, spec.seed, spec.engine), exp.context, timeline=False)


def _measured_count(exp, study) -> int:
    """How many requests the study's measured run has (its workload is built to count them)."""
    from .study.simulation import _tables_with_defaults, build_component

    table = _tables_with_defaults(study.base.tables)["workload"]
    workload = build_component(exp.context, "workload", table, f"{exp.context.source}: [workload]")
    measured = getattr(workload, "measured", None)
    if measured is None:
        raise ConfigError("the run's workload keeps no measured run (use a vllm_log or vllm_bench workload)")
    return len(measured.ttft_ms)


# --- CLI ------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("file", help="experiment file whose run replays a measured run")
    parser.add_argument("--fit", action="append", required=True, metavar="KEY=LOW:HIGH",
                        help="a setting to fit and its bounds, e.g. cost_model.overhead_ms=0:5 (repeatable)")
    parser.add_argument("--run", help="the run to fit (when the file has several)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key before fitting (TOML value syntax)")
    parser.add_argument("--predict", action="append", default=[], metavar="KEY=VALUE",
                        help="after the fit, run it with these overrides (e.g. workload.start=150) and compare")
    parser.add_argument("--part", metavar="FIRST:END",
                        help="fit on the statistics of these requests of the log only (the whole run is simulated); "
                             "the table of the other requests then shows the prediction")
    parser.add_argument("--max-evaluations", type=int, default=60, help="simulations at most (default 60)")


def command(args) -> int:
    from .study.experiment import load

    exp = load(args.file, args.set)
    parameters = [parse_parameter(text) for text in args.fit]
    rows = others = None
    if args.part is not None:
        studies = [s for s in exp.studies if args.run is None or s.name == args.run]
        workload = exp.context and studies and _measured_count(exp, studies[0])
        rows, others = parse_part(args.part, workload)
    fit, spec, result = calibrate(exp, parameters, run_name=args.run, max_evaluations=args.max_evaluations, rows=rows)
    print(report(fit, spec, result, parameters, rows, others))
    if args.predict:
        other = predict(exp, spec, args.predict)
        rows = comparison_rows(statistics(simulated_latencies(other.requests, other.measured)),
                               measured_statistics(other.measured))
        print(format_comparison(f"prediction with the fit ({', '.join(args.predict)}): simulated vs measured", rows))
    return 0
