"""``schedlab calibrate``: fit a cost model's free parameters to what a real run measured.

Two kinds of measurement (the *target*):

* the run's own workload keeps a measured run (``vllm_log``, ``vllm_bench`` with
  ``--save-detailed``): the 15 statistics of :mod:`schedlab.results.compare` (TTFT, TPOT,
  latency x mean, median, p90, p95, p99), on some requests of it with ``--part``;
* ``--target FILE``: summary statistics an operator has without a per-request log -- a
  ``vllm bench serve`` result, an inference-perf or guidellm report, a scrape of vLLM's
  Prometheus ``/metrics`` (:mod:`schedlab.targets`); the experiment's workload is simulated
  (it should be the benchmark's: same rate, lengths, request count) and every statistic the
  file holds is compared (``--statistics`` picks some); a run with a ``[target]`` table uses
  its summary when no ``--target`` is given.

With a per-request log, ``--objective requests`` pairs each measured request with its replay
instead: the error is over every request's TTFT, TPOT and latency. Statistics of the whole run
forget which request had which latency, and let settings trade off -- a fixed cost per request
against a cost per prompt token match TTFT's percentiles equally well, and the mean |error| over
15 statistics has kinks (one statistic crossing zero) where a simplex stalls. Pairs keep it: a
TTFT that grows with the prompt is a regression. (Runs fitted together that carry a
``[target]`` are still judged by its statistics.)

Each ``--fit KEY=LOW:HIGH`` names a setting of the run's tables (``cost_model.overhead_ms``,
``cost_model.mfu``) and its bounds; ``--hold KEY=VALUE`` sets one and keeps it out of the fit.
The objective is the mean absolute error over the statistics, in percent. A fit that can be
trusted:

* it starts from the plugin's defaults -- the file's value, else the value the built cost
  model uses (the roofline's measured efficiency of the GPU), else the setting's default --
  and, with ``--starts N``, also from the N - 1 best of a screen of points spread over the
  bounds (a Halton sequence: deterministic; a third of the budget, at most 8 per parameter) --
  a start drawn blindly in the box often lands where the server is overloaded and the error
  is flat; each start runs scipy's bounded Nelder-Mead, restarted from its best point with a
  fresh simplex while that improves and the budget lasts; the best result wins;
* a candidate the engine refuses (a cost of 0 ms at a bound of 0, a setting out of its range)
  scores as a failure instead of aborting the fit;
* it prints the error before fitting and after, warns when a fitted value sits on its bound
  (the optimum may lie beyond it) and when the held-out error -- ``--part``'s other requests,
  ``--predict``'s run -- is worse after the fit than before, and says which parameters the
  data cannot tell apart: the correlations of the fitted values (from the statistics'
  sensitivities, finite differences at the fit) and the parameters whose move across 5% of
  their range hardly changes the error.

It prints a TOML snippet to paste into the ``[cost_model]`` table. ``--predict KEY=VALUE``
runs the fitted model on another workload (e.g. ``workload.start=150``: the other half of a log).
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any

import attrs
import numpy as np

from .errors import ConfigError, SchedlabError
from .results.compare import (
    comparison_rows, format_comparison, measured_statistics, simulated_latencies, statistics,
)
from .study.overrides import get_dotted, parse_assignment, set_dotted

#: The score of a candidate the engine refuses (far above any real mean error in percent).
FAILED = 1e6
#: A fitted value this close to a bound (share of the range) counts as on it.
ON_BOUND = 0.005
#: |correlation| from which two fitted values count as not told apart.
ENTANGLED = 0.9
#: A move of this share of a parameter's range that changes the error by less than
#: :data:`FLAT_POINTS` percentage points: the data hardly constrains the parameter.
PROFILE_STEP, FLAT_POINTS = 0.05, 0.05


@attrs.frozen
class Parameter:
    key: str
    low: float
    high: float


@attrs.frozen
class Fit:
    """The outcome: fitted values, the error at them and at the start, how it was reached, and
    what the fit cannot be trusted on (``warnings``, ``entangled``)."""

    values: dict[str, float]
    mean_abs_error_pct: float
    evaluations: int
    start: dict[str, float]
    start_error_pct: float = math.nan
    held: dict[str, Any] = attrs.field(factory=dict)
    starts: int = 1
    errors: dict[str, float] = attrs.field(factory=dict)
    warnings: tuple[str, ...] = ()
    entangled: tuple[str, ...] = ()
    #: how well the data pins each parameter and pair, flagged or not (printed with the fit)
    sensitivity: tuple[str, ...] = ()
    #: runs fitted together: each one's table at the fit
    run_tables: tuple[str, ...] = ()
    #: what a measured run was judged by (:data:`OBJECTIVES`)
    objective: str = "statistics"


def parse_parameter(text: str) -> Parameter:
    """``cost_model.overhead_ms=0:5`` -> Parameter(key, 0.0, 5.0)."""
    key, sep, bounds = text.partition("=")
    low, colon, high = bounds.partition(":")
    try:
        lo, hi = float(low), float(high)
    except ValueError:
        lo = hi = math.nan
    if not sep or not colon or not key.strip() or not (lo < hi):
        raise ConfigError(f"--fit {text!r}: expected KEY=LOW:HIGH with LOW < HIGH, e.g. cost_model.overhead_ms=0:5 "
                          f"(to hold a setting at a value: --hold KEY=VALUE)")
    return Parameter(key.strip(), lo, hi)


def parse_part(text: str | None, n: int):
    """``"0:150"`` -> the rows 0..149 of the measured run (and the others), or (None, None)."""
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


# --- what a run is judged against ------------------------------------------------------------------


class MeasuredRun:
    """The 15 statistics of the measured run the workload keeps (its ``rows`` only, when given)."""

    timeline = False

    def __init__(self, rows=None):
        self.rows = rows

    def errors(self, result) -> dict[str, float]:
        from .results.compare import vs_measured

        if result.measured is None:
            raise ConfigError("the run's workload keeps no measured run (use a vllm_log or vllm_bench workload, "
                              "or give summary statistics with --target FILE)")
        return vs_measured(result.all_requests(), result.measured, self.rows)["errors_pct"]

    def table(self, title: str, result, rows=None) -> str:
        from .results.compare import select_requests

        rows = self.rows if rows is None else rows
        requests = result.all_requests()
        if rows is None:
            sim, truth = simulated_latencies(requests, result.measured), measured_statistics(result.measured)
        else:
            chosen, lat = select_requests(requests, result.measured, rows)
            sim, truth = simulated_latencies(chosen, result.measured), statistics(lat)
            title += f" (requests {rows[0]}..{rows[-1]} of the log)" if len(rows) and rows[-1] - rows[0] + 1 == len(rows) \
                else f" ({len(rows)} requests)"
        return format_comparison(title, comparison_rows(statistics(sim), truth))


class PairedRequests(MeasuredRun):
    """Every measured request against its own replay: the TTFT, TPOT and latency of each (its
    ``rows`` only, when given) -- ``--objective requests``. A statistic forgets which request
    had which latency; the pairing keeps it, so what grows with the prompt or with the batch is
    fitted as a regression is, and the mean |error| has no kinks where one of 15 statistics
    crosses zero. Tables still show the 15 statistics."""

    def errors(self, result) -> dict[str, float]:
        from .results.compare import paired_errors

        if result.measured is None:
            raise ConfigError("--objective requests pairs the requests of a measured run: use a vllm_log or "
                              "vllm_bench workload")
        return paired_errors(result.all_requests(), result.measured, self.rows)


#: What a measured run is judged by: its 15 statistics, or each request paired with its replay.
OBJECTIVES = {"statistics": MeasuredRun, "requests": PairedRequests}


class SummaryTarget:
    """The statistics of a :class:`~schedlab.targets.Summary` (a report or a scrape)."""

    def __init__(self, summary):
        self.summary = summary
        self.timeline = any(name.startswith("iteration_tokens") for name in summary.values)

    def errors(self, result) -> dict[str, float]:
        from .targets import errors_pct

        return errors_pct(self.summary, result)

    def table(self, title: str, result, rows=None) -> str:
        from .targets import simulated

        sim = simulated(self.summary, result)
        lines = [f"{title} -- {self.summary.kind}: {self.summary.source}",
                 f"{'statistic':<28}{'measured':>12}{'simulated':>12}{'error':>9}", "-" * 61]
        errs = []
        for name, value in self.summary.values.items():
            err = 100.0 * (sim[name] - value) / value if value else math.nan
            errs.append(abs(err))
            lines.append(f"{name:<28}{value:>12.4g}{sim[name]:>12.4g}{err:>+8.1f}%")
        lines += ["-" * 61, f"{'mean |error|':<52}{float(np.mean(errs)):>8.2f}%"]
        return "\n".join(lines) + "\n"


def mean_abs(errors: dict[str, float]) -> float:
    values = [abs(e) for e in errors.values()]
    value = float(np.mean(values)) if values else math.nan
    return value if math.isfinite(value) else FAILED


# --- the fit ------------------------------------------------------------------------------------------


def _study(exp, run_name):
    studies = [s for s in exp.studies if run_name is None or s.name == run_name]
    if not studies:
        raise ConfigError(f"no run named {run_name!r}; the experiment has: {', '.join(s.name for s in exp.studies)}")
    if len(studies) > 1:
        raise ConfigError(f"the experiment has several runs; choose one with --run, or several "
                          f"(--run 'NAME*' or --run A,B) to fit them together ({', '.join(s.name for s in studies)})")
    return studies[0]


def _studies(exp, run_names: list[str]) -> list:
    """The runs ``run_names`` name, in file order: exact names or shell patterns (``vllm-*``);
    every name must match a run."""
    chosen = []
    for name in run_names:
        matched = [s for s in exp.studies if fnmatch.fnmatchcase(s.name, name)]
        if not matched:
            raise ConfigError(f"no run named {name!r}; the experiment has: {', '.join(s.name for s in exp.studies)}")
        chosen += [s for s in matched if s not in chosen]
    return [s for s in exp.studies if s in chosen]


def default_value(exp, tables: dict, key: str) -> float | None:
    """What the run uses for ``key`` when the file does not set it: the built component's
    setting (a cost model's ``settings``, e.g. the roofline's measured efficiencies, or its
    ``config``), a ``[frontend]`` or ``[client]`` setting's default, else None."""
    from .configs import from_table
    from .frontend import ClientConfig, FrontendConfig
    from .study.simulation import build_component

    section, _, name = key.partition(".")
    plain = {"frontend": FrontendConfig, "client": ClientConfig}  # tables that are one config, not a plugin
    if section not in ("cost_model", "scheduler", "kv_cache", *plain) or "." in name or section not in tables:
        return None
    where = f"{exp.context.source}: [{section}]"
    try:
        if section in plain:
            holders = (from_table(plain[section], tables[section], where=where),)
        else:
            component = build_component(exp.context, section, tables[section], where)
            holders = (getattr(component, "settings", None), getattr(component, "config", None))
    except SchedlabError:
        return None
    for holder in holders:
        value = getattr(holder, name, None) if holder is not None else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def calibrate(exp, parameters: list[Parameter], *, run_name: str | list[str] | None = None, max_evaluations: int = 60,
              tolerance: float = 1e-3, rows=None, target=None, hold: dict[str, Any] | None = None,
              starts: int = 1, diagnose: bool = True, objective: str = "statistics") -> tuple[Fit, Any, Any]:
    """Fit ``parameters`` on one run of a loaded experiment, or on several together.

    :param run_name: the run to fit; or a list of runs (names or shell patterns, ``vllm-*``) to
        fit together -- the stages of a sweep, the configurations of one server: the objective
        is then the mean |error| over all their statistics, each run judged against its own
        ``[target]`` or measured run (statistic names prefixed ``"<run>: "``).
    :param rows: fit on the statistics of the measured run's ``rows`` only (the whole run is
        simulated, so they still wait behind and share the GPU with the others).
    :param target: a :class:`~schedlab.targets.Summary` to fit to instead of the measured run.
    :param hold: settings held at a value (``{"cost_model.mfu": 0.6}``).
    :param starts: Nelder-Mead runs: from the defaults, then from the best of a screen of points
        spread over the bounds.
    :param diagnose: compute the correlations and error profile at the fit (``2 x`` parameters
        more simulations).
    :param objective: how a measured run (not a ``[target]``) judges a candidate:
        ``"statistics"``, its 15 statistics; ``"requests"``, each request against its replay
        (:class:`PairedRequests`).
    :returns: ``(fit, spec at the fit, result at the fit)``; with a list of runs, a list of
        specs and a list of results, one per run.
    :raises ConfigError: no such run, a key that is not a number, nothing to compare with, or a
        start the engine refuses.
    """
    from .study.simulation import RunSpec, _tables_with_defaults

    if not parameters:
        raise ConfigError("nothing to fit: give at least one --fit KEY=LOW:HIGH")
    joint = isinstance(run_name, (list, tuple))
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    if objective == "requests" and target is not None:
        raise ConfigError("--objective requests pairs the requests of a measured run's log; --target holds summary "
                          "statistics only")
    if joint and (rows is not None or target is not None):
        raise ConfigError("runs fitted together are each judged against their own [target] or measured run; "
                          "--target and --part pick within one run")
    members = []  # (the run's spec, its tables, its judge)
    for study in (_studies(exp, list(run_name)) if joint else [_study(exp, run_name)]):
        tables = _tables_with_defaults(study.base.tables)
        for key, value in (hold or {}).items():
            tables = set_dotted(tables, key, value)
        if target is not None:
            judge = SummaryTarget(target)
        elif joint and "target" in study.base.tables:
            judge = SummaryTarget(run_target(exp, study, None))
        else:
            judge = OBJECTIVES[objective](rows)
        members.append((study.base, tables, judge))
    tables = members[0][1]  # the start: the first run's values
    start = []
    for p in parameters:
        value = get_dotted(tables, p.key, None)
        if value is None:
            value = default_value(exp, tables, p.key)
        if value is None:
            value = (p.low + p.high) / 2.0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"--fit {p.key}: the run's value is not a number ({value!r})")
        start.append(min(max(float(value), p.low), p.high))
    cache: dict[tuple, tuple[float, Any, dict]] = {}

    def specs_at(x) -> list[RunSpec]:
        out = []
        for base, t, _ in members:
            for p, v in zip(parameters, x):
                t = set_dotted(t, p.key, float(v))
            out.append(RunSpec(base.name, t, base.seed, base.engine))
        return out

    judges = [judge for _, _, judge in members]

    def evaluate(x, *, strict: bool = False):
        key = tuple(round(float(v), 12) for v in x)
        if key not in cache:
            cache[key] = score_all(exp, specs_at(key), judges, strict=strict, prefix=joint)
        return cache[key]

    start_error = evaluate(start, strict=True)[0]  # fail fast: bad key, nothing to compare with
    lows, highs = np.array([p.low for p in parameters]), np.array([p.high for p in parameters])
    points = [np.array(start)]
    if starts > 1:
        screen = _spread(lows, highs, max(starts - 1, min(8 * len(parameters), max_evaluations // 3)))
        screened = sorted(screen, key=lambda x: evaluate(x)[0])  # stable: ties keep the sequence's order
        points += screened[:starts - 1]
    budget = max((max_evaluations - len(cache)) // len(points), 4 * len(parameters) + 4)
    for point in points:
        restarted_nelder_mead(lambda x: evaluate(x)[0], point, lows, highs, budget, tolerance)
    best = min(cache, key=lambda k: cache[k][0])
    error, results, errors = cache[best]
    specs = specs_at(best)
    values = {p.key: v for p, v in zip(parameters, best)}
    warnings = [_bound_warning(p, values[p.key]) for p in parameters]
    entangled: list[str] = []
    sensitivity: list[str] = []
    if diagnose and error < FAILED:
        entangled, sensitivity = _identifiability(parameters, np.array(best), lows, highs, errors, evaluate)
    run_tables = tuple(judge.table(f"{spec.name} at the fit: simulated vs measured", result)
                       for spec, judge, result in zip(specs, judges, results)) if joint and results else ()
    fit = Fit(values, error, len(cache), {p.key: v for p, v in zip(parameters, start)}, start_error,
              dict(hold or {}), len(points), errors, tuple(w for w in warnings if w), tuple(entangled),
              tuple(sensitivity), run_tables, objective)
    if joint:
        return fit, specs, results
    return fit, specs[0], results[0] if results else None


def restarted_nelder_mead(f, point, lows: np.ndarray, highs: np.ndarray, budget: int, tolerance: float = 1e-3,
                          *, restarts: bool = True):
    """Minimise ``f`` from ``point`` in the box with scipy's bounded Nelder-Mead, in at most
    ``budget`` calls; returns ``(x, f(x))`` of the last descent's best.

    The first simplex is a quarter of each range wide: the error surface is piecewise smooth
    (iterations are discrete), so small steps see only its plateaus. A simplex collapses on the
    kinks a mean |error| has (one statistic crossing zero) and stops short in a valley:
    restarted from its best point with a fresh simplex, it walks on, until a restart improves
    on its start by less than 1e-3 or the budget is spent (``restarts=False``: one descent)."""
    from scipy.optimize import minimize

    span = 0.25 * (highs - lows)
    calls = 0

    def counted(x):
        nonlocal calls
        calls += 1
        return f(x)

    point = np.asarray(point, dtype=float)
    value = f(point)  # the start's value: not counted against the budget (the caller has scored it)
    while calls < budget:
        simplex = [point] + [point + np.where(np.arange(len(point)) == i, np.where(point + span <= highs, span, -span),
                                              0.0) for i in range(len(point))]
        result = minimize(counted, point, method="Nelder-Mead", bounds=list(zip(lows, highs)),
                          options={"initial_simplex": simplex, "maxfev": max(budget - calls, 1), "xatol": tolerance,
                                   "fatol": 1e-3})
        if not restarts or not result.fun < value - 1e-3:
            point, value = (np.clip(result.x, lows, highs), float(result.fun)) if result.fun < value else (point, value)
            break
        point, value = np.clip(result.x, lows, highs), float(result.fun)
    return point, value


def score_all(exp, specs, judges, *, strict: bool = False, prefix: bool = False) -> tuple[float, Any, dict]:
    """:func:`score` over runs fitted together: ``(mean |error| over all their statistics,
    results, errors)``; a run that fails fails the candidate."""
    results, errors = [], {}
    for spec, judge in zip(specs, judges):
        error, result, errs = score(exp, spec, judge, strict=strict)
        if error >= FAILED:
            return FAILED, None, {}
        results.append(result)
        errors.update({(f"{spec.name}: {k}" if prefix else k): v for k, v in errs.items()})
    return mean_abs(errors), results, errors


def score(exp, spec, judge, *, strict: bool = False) -> tuple[float, Any, dict[str, float]]:
    """``(mean |error|, result, errors)`` of one candidate; a candidate the engine or a
    plugin refuses (an iteration of 0 ms at a bound of 0, a setting out of its range) scores
    :data:`FAILED` -- unless ``strict``, then the error is raised."""
    from .study.simulation import run

    try:
        result = run(spec, exp.context, timeline=judge.timeline)
        errors = judge.errors(result)
    except SchedlabError:
        if strict:
            raise
        return FAILED, None, {}
    return mean_abs(errors), result, errors


def _spread(lows: np.ndarray, highs: np.ndarray, n: int):
    """``n`` points spread over the box (an unscrambled Halton sequence, skipping its corner)."""
    if n <= 0:
        return []
    from scipy.stats import qmc

    unit = qmc.Halton(d=len(lows), scramble=False).random(n + 1)[1:]
    return list(lows + unit * (highs - lows))


def _bound_warning(p: Parameter, value: float) -> str:
    room = ON_BOUND * (p.high - p.low)
    if value <= p.low + room:
        side, bound = "lower", p.low
    elif value >= p.high - room:
        side, bound = "upper", p.high
    else:
        return ""
    return (f"{p.key} = {value:.4g} sits on its {side} bound ({bound:g}): the best value may lie beyond it; "
            f"widen the bounds, or hold it (--hold {p.key}=VALUE) if it cannot")


def _identifiability(parameters, best: np.ndarray, lows, highs, errors: dict,
                     evaluate) -> tuple[list[str], list[str]]:
    """Which parameters the statistics cannot tell apart, at the fit: the correlation of the
    fitted values (``(J^T J)^-1`` of the statistics' sensitivities, central differences over
    2% of each range) and a 1-D profile of the error (a move over 5% of the range). Returns the
    flagged findings and a line per parameter and pair with the numbers, flagged or not."""
    names = list(errors)
    span = highs - lows
    columns, profile = [], []
    for i in range(len(best)):
        h = 0.02 * span[i]
        up, down = best.copy(), best.copy()
        up[i], down[i] = min(best[i] + h, highs[i]), max(best[i] - h, lows[i])
        e_up, _, r_up = evaluate(up)
        e_down, _, r_down = evaluate(down)
        if e_up >= FAILED or e_down >= FAILED or up[i] == down[i]:
            columns.append(np.zeros(len(names)))
        else:
            # sensitivity per share of the range: comparable across parameters
            columns.append(np.array([(r_up[n] - r_down[n]) / ((up[i] - down[i]) / span[i]) for n in names]))
        step = PROFILE_STEP * span[i]
        moved = [evaluate(np.where(np.arange(len(best)) == i, np.clip(best + s, lows, highs), best))[0]
                 for s in (-step, step)]
        profile.append(max(moved) - evaluate(best)[0])
    out = []
    summary = [f"{p.key}: {profile[i]:+.3f} points of mean error for a move over {PROFILE_STEP:.0%} of its range"
               for i, p in enumerate(parameters)]
    for i, p in enumerate(parameters):
        if profile[i] < FLAT_POINTS:
            out.append(f"{p.key}: moving it over {PROFILE_STEP:.0%} of its range changes the mean error by "
                       f"{profile[i]:.3f} points -- the statistics hardly constrain it")
    jac = np.array(columns).T  # statistics x parameters
    if len(parameters) > 1 and np.isfinite(jac).all():
        information = jac.T @ jac
        # a hair of ridge keeps it invertible when two columns are exactly proportional (the
        # correlation then comes out -1 for a pure trade-off, as it should, not pinv's +1)
        ridge = 1e-9 * max(float(np.trace(information)) / len(parameters), 1e-300)
        covariance = np.linalg.inv(information + ridge * np.eye(len(parameters)))
        scale = np.sqrt(np.clip(np.diag(covariance), 1e-300, None))
        corr = covariance / np.outer(scale, scale)
        for i in range(len(parameters)):
            for j in range(i + 1, len(parameters)):
                summary.append(f"{parameters[i].key} and {parameters[j].key}: correlation {corr[i, j]:+.2f}")
                if abs(corr[i, j]) >= ENTANGLED and profile[i] >= FLAT_POINTS and profile[j] >= FLAT_POINTS:
                    out.append(f"{parameters[i].key} and {parameters[j].key}: correlation {corr[i, j]:+.2f} -- the "
                               f"statistics fix a combination of them, not each; hold one (--hold) or add a "
                               f"measurement that separates them")
    return out, summary


# --- output --------------------------------------------------------------------------------------------


def snippet(spec, parameters: list[Parameter], held: dict[str, Any] | None = None) -> str:
    """The fitted tables as TOML to paste (each table the fit touched, in full)."""
    from .study.overrides import split_key

    lines = []
    keys = [p.key for p in parameters] + list(held or {})
    for table in dict.fromkeys(split_key(k)[0] for k in keys):
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


def report(fit: Fit, spec, result, parameters: list[Parameter], rows=None, others=None, target=None,
           held_out: tuple[float, float] | None = None, held_out_label: str = "") -> str:
    """What ``schedlab calibrate`` prints."""
    joint = isinstance(spec, list)
    judge = SummaryTarget(target) if target is not None else OBJECTIVES[fit.objective](rows)
    values = "latencies of single requests" if fit.objective == "requests" else "statistics"
    if joint:
        what = f"{len(fit.errors)} {values} of {len(spec)} runs fitted together"
    elif target is not None:
        what = f"{len(fit.errors)} statistics of {target.source}"
    else:
        what = f"the {len(fit.errors)} {values} of the measured run" + (" (the fitted requests)" if rows is not None
                                                                       else "")
        if fit.objective == "requests":
            what += ", each request against its replay"
    lines = [f"before the fit (the file's values and the plugins' defaults): mean |error| "
             f"{_pct(fit.start_error_pct)} over {what}", "", "fit (start -> fitted, bounds):"]
    for p in parameters:
        flag = "  (on its bound)" if any(w.startswith(p.key + " =") for w in fit.warnings) else ""
        lines.append(f"  {p.key:<32} {fit.start[p.key]:>10.4g} -> {fit.values[p.key]:<10.4g} "
                     f"[{p.low:g}, {p.high:g}]{flag}")
    for key, value in fit.held.items():
        lines.append(f"  {key:<32} held at {value!r}")
    lines.append(f"  {fit.evaluations} simulations from {fit.starts} start{'s' if fit.starts > 1 else ''}; "
                 f"mean |error| {_pct(fit.start_error_pct)} -> {_pct(fit.mean_abs_error_pct)}")
    if held_out is not None:
        lines.append(f"  {held_out_label}: mean |error| {_pct(held_out[0])} -> {_pct(held_out[1])}")
    lines.append("")
    if joint:
        lines += list(fit.run_tables)
    elif result is not None:
        lines.append(judge.table(f"{spec.name} at the fit: simulated vs measured", result))
        if others is not None and len(others):
            lines.append(judge.table(f"the other {len(others)} requests (not fitted on): simulated vs measured",
                                     result, others))
    warnings = list(fit.warnings)
    if held_out is not None and held_out[1] > held_out[0]:
        warnings.append(f"{held_out_label}: mean |error| {_pct(held_out[0])} before the fit, {_pct(held_out[1])} "
                        f"after -- the fit does not carry over; fewer parameters, or fit on more of the data")
    if warnings:
        lines.append("warnings:")
        lines += [f"  ! {w}" for w in warnings]
        lines.append("")
    if fit.sensitivity:
        lines.append(f"how well the {values} pin the fit (the error's rise; the fitted values' correlation):")
        lines += [f"  {e}" for e in fit.sensitivity]
        lines.append("")
    if fit.entangled:
        lines.append("what the data cannot tell apart:")
        lines += [f"  - {e}" for e in fit.entangled]
        lines.append("")
    lines.append("# paste into the experiment:" + (f" (the tables of {spec[0].name}; the fitted keys are the same "
                                                    "in every run)" if joint else ""))
    lines.append(snippet(spec[0] if joint else spec, parameters, fit.held))
    return "\n".join(lines)


def _pct(value: float) -> str:
    return "failed" if value >= FAILED else f"{value:.2f}%"


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


def _held_out_error(exp, tables: dict, base, rows, objective: str = "statistics") -> float:
    """The mean |error| of the measured run's ``rows`` in a run with ``tables``, judged as the
    fit was."""
    from .study.simulation import RunSpec, run

    result = run(RunSpec(base.name, tables, base.seed, base.engine), exp.context, timeline=False)
    return mean_abs(OBJECTIVES[objective](rows).errors(result))


# --- CLI ------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("file", help="experiment file whose run replays a measured run, or simulates the "
                                     "benchmark --target describes")
    parser.add_argument("--fit", action="append", required=True, metavar="KEY=LOW:HIGH",
                        help="a setting to fit and its bounds, e.g. cost_model.overhead_ms=0:5 (repeatable)")
    parser.add_argument("--hold", action="append", default=[], metavar="KEY=VALUE",
                        help="hold a setting at a value, out of the fit (repeatable)")
    parser.add_argument("--target", metavar="FILE",
                        help="fit to summary statistics: a vllm bench serve result, an inference-perf or guidellm "
                             "report, or a scrape of vLLM's /metrics")
    parser.add_argument("--target-baseline", metavar="FILE",
                        help="a /metrics scrape taken before the run: subtracted from --target's")
    parser.add_argument("--target-index", type=int, default=0, metavar="N",
                        help="which benchmark of a guidellm report with several (default 0)")
    parser.add_argument("--statistics", metavar="NAMES",
                        help="comma-separated statistics of --target to fit (default: all it holds), e.g. "
                             "ttft_ms.mean,itl_ms.p50,e2e_ms.p99")
    parser.add_argument("--run", help="the run to fit (when the file has several); several to fit together, each "
                                      "against its own [target] or measured run: A,B or a pattern such as 'vllm-*'")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key before fitting (TOML value syntax)")
    parser.add_argument("--predict", action="append", default=[], metavar="KEY=VALUE",
                        help="after the fit, run it with these overrides (e.g. workload.start=150) and compare")
    parser.add_argument("--part", metavar="FIRST:END",
                        help="fit on the statistics of these requests of the log only (the whole run is simulated); "
                             "the table of the other requests then shows the prediction")
    parser.add_argument("--objective", choices=tuple(OBJECTIVES), default="statistics",
                        help="what a measured run's log is fitted on: its 15 statistics (default), or each "
                             "request's TTFT, TPOT and latency against its own replay ('requests': pins what grows "
                             "with the prompt or the batch where statistics trade settings off)")
    parser.add_argument("--starts", type=int, default=3, help="Nelder-Mead starts: the defaults, then points "
                                                              "spread over the bounds (default 3)")
    parser.add_argument("--max-evaluations", type=int, default=60, help="simulations at most (default 60)")


def command(args) -> int:
    from .study.experiment import load
    from .targets import read_summary

    exp = load(args.file, args.set)
    parameters = [parse_parameter(text) for text in args.fit]
    hold = dict(parse_assignment(text, where="--hold") for text in args.hold)
    both = sorted(set(hold) & {p.key for p in parameters})
    if both:
        raise ConfigError(f"--hold {both[0]}: also given to --fit; a setting is fitted or held, not both")
    if args.starts < 1:
        raise ConfigError(f"--starts {args.starts}: must be at least 1")
    target = None
    if args.target is not None:
        if args.part is not None:
            raise ConfigError("--part picks requests of a measured run's log; --target holds summary statistics only")
        target = read_summary(args.target, baseline=args.target_baseline, index=args.target_index)
        target = target.select([s.strip() for s in args.statistics.split(",") if s.strip()] if args.statistics
                               else None)
    rows = others = None
    run_name = _run_names(args.run)
    if isinstance(run_name, list):
        if args.predict or args.statistics:
            raise ConfigError("--predict and --statistics take one run; runs fitted together use each one's "
                              "[target] as it is (run the experiment with the fitted values to predict)")
        fit, specs, results = calibrate(exp, parameters, run_name=run_name, max_evaluations=args.max_evaluations,
                                        rows=None, target=target, hold=hold, starts=args.starts,
                                        objective=args.objective)
        print(report(fit, specs, results, parameters))
        return 0
    study = _study(exp, args.run)
    if target is None and args.part is None and args.objective == "statistics" and "target" in study.base.tables:
        target = run_target(exp, study, args.statistics)
    if args.part is not None:
        rows, others = parse_part(args.part, _measured_count(exp, study))
    fit, spec, result = calibrate(exp, parameters, run_name=args.run, max_evaluations=args.max_evaluations,
                                  rows=rows, target=target, hold=hold, starts=args.starts, objective=args.objective)
    if target is not None and target.requests is not None and result is not None:
        simulated_requests = int((result.all_requests()["rejected"] == 0).sum())
        if simulated_requests != target.requests:
            print(f"note: {target.source} counts {target.requests} requests, the simulated run finished "
                  f"{simulated_requests}: is the experiment's workload the benchmark's?\n")
    held_out, label = None, ""
    if others is not None and len(others):
        from .study.simulation import _tables_with_defaults

        tables = _tables_with_defaults(study.base.tables)
        for key, value in {**hold, **fit.start}.items():
            tables = set_dotted(tables, key, value)
        held_out = tuple(_held_out_error(exp, t, study.base, others, args.objective) for t in (tables, spec.tables))
        label = f"the other {len(others)} requests (not fitted on)"
    print(report(fit, spec, result, parameters, rows, others, target, held_out, label))
    if args.predict:
        other = predict(exp, spec, args.predict)
        before = predict(exp, attrs.evolve(spec, tables=_start_tables(spec.tables, fit)), args.predict)
        title = f"prediction with the fit ({', '.join(args.predict)})"
        if other.measured is None and "vs_target" in other.metrics:  # the predicted run's own [target]
            from .results.compare import format_target

            print(format_target(title, other.meta.get("target", {}), other.metrics["vs_target"]))
            pair = tuple(r.metrics["vs_target"]["mean_abs_error_pct"] for r in (before, other))
        else:
            rows_p = comparison_rows(statistics(simulated_latencies(other.all_requests(), other.measured)),
                                     measured_statistics(other.measured))
            print(format_comparison(f"{title}: simulated vs measured", rows_p))
            pair = (float(np.mean([abs(r[3]) for r in comparison_rows(
                        statistics(simulated_latencies(before.all_requests(), before.measured)),
                        measured_statistics(before.measured))])),
                    float(np.mean([abs(r[3]) for r in rows_p])))
        if pair[1] > pair[0]:
            print(f"warning: the prediction ({', '.join(args.predict)}): mean |error| {pair[0]:.2f}% before the "
                  f"fit, {pair[1]:.2f}% after -- the fit does not carry over")
    return 0


def _run_names(text: str | None) -> str | list[str] | None:
    """``--run``: one name, or several to fit together (comma-separated, or shell patterns)."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(names) == 1 and not any(c in names[0] for c in "*?["):
        return names[0]
    return names


def run_target(exp, study, statistics: str | None):
    """The summary the run's ``[target]`` table names (``--statistics`` picks among its own)."""
    from .configs import FieldError, from_table
    from .targets import TargetConfig

    where = f"{exp.context.source}: run {study.name!r} [target]"
    config = from_table(TargetConfig, study.base.tables["target"], where=where, base_dir=exp.context.base_dir)
    try:
        target = config.read()
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return target.select([s.strip() for s in statistics.split(",") if s.strip()]) if statistics else target


def _start_tables(tables: dict, fit: Fit) -> dict:
    """``tables`` with the fitted settings back at their start values."""
    for key, value in fit.start.items():
        tables = set_dotted(tables, key, value)
    return tables
