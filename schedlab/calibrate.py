"""``schedlab calibrate``: fit a cost model's free parameters to what a real run measured.

Two kinds of measurement (the *target*):

* the run's own workload keeps a measured run (``vllm_log``, ``vllm_bench`` with
  ``--save-detailed``): the 15 statistics of :mod:`schedlab.results.compare` (TTFT, TPOT,
  latency x mean, median, p90, p95, p99), on some requests of it with ``--part``;
* ``--target FILE``: summary statistics an operator has without a per-request log -- a
  ``vllm bench serve`` or SGLang ``bench_serving`` result, an inference-perf, guidellm,
  genai-perf or AIPerf report, a scrape of vLLM's, SGLang's or TGI's Prometheus ``/metrics``
  (:mod:`schedlab.targets`); the experiment's workload is simulated
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

Each ``--fit KEY=LOW:HIGH`` names a real-number setting of the run's tables
(``cost_model.overhead_ms``, ``cost_model.mfu``; a whole-number or true/false one is swept or
held, not fitted) and its finite bounds; ``--hold KEY=VALUE`` sets one and keeps it out of the fit.
The objective is the mean absolute error over the statistics, in percent. A fit that can be
trusted:

* it starts from the plugin's defaults -- the file's value, else the value the built cost
  model uses (the roofline's measured efficiency of the GPU), else the setting's default --
  and, with ``--starts N``, also from the N - 1 best of a screen of points spread over the
  bounds (a Halton sequence: deterministic; a third of the budget, at most 8 per parameter) --
  a start drawn blindly in the box often lands where the server is overloaded and the error
  is flat; each start runs scipy's bounded Nelder-Mead, restarted from its best point with a
  fresh simplex while that improves and the budget lasts; the best result wins. The budget
  (``--max-evaluations``) caps every simulation of the fit: the start, the screen, the
  diagnosis below (4 per parameter, set aside first when there is room) and the descents,
  each start in turn taking an equal share of what is left;
* a candidate the engine refuses (a cost of 0 ms at a bound of 0, a setting out of its range)
  scores as a failure instead of aborting the fit;
* it prints the error before fitting and after, warns when a fitted value sits on its bound
  (the optimum may lie beyond it) and when the held-out error -- ``--part``'s other requests,
  ``--predict``'s run -- is worse after the fit than before, and says which parameters the
  data cannot tell apart: the correlations of the fitted values (from the statistics'
  sensitivities, finite differences at the fit) and the parameters whose move across 5% of
  their range hardly changes the error.

It prints a TOML snippet to paste into the experiment. ``--predict KEY=VALUE`` runs the fitted
model on another workload (e.g. ``workload.path=other_run.jsonl``: another measured run of the same
deployment; to score part of one run, fit on the rest with ``--part``, which replays it whole).
"""

from __future__ import annotations

import fnmatch
import math
import re
import warnings
from typing import Any

import attrs
import numpy as np

from .errors import ConfigError, InputWarning, SchedlabError
from .results.compare import (
    comparison_rows, format_comparison, mean_abs_error, measured_statistics, simulated_latencies, statistics,
)
from .study.overrides import get_dotted, parse_assignment, set_dotted

#: The score of a candidate the engine refuses (far above any real mean error in percent).
FAILED = 1e6
#: A fitted value this close to a bound (share of the range) counts as on it.
ON_BOUND = 0.005
#: |correlation| from which two fitted values count as not told apart.
ENTANGLED = 0.9
#: ``--part`` values that start with a minus sign (``-5:10``): read as a value, not an option.
NEGATIVE_PART = r"^-\d*:-?\d*$"
#: A move of this share of a parameter's range that changes the error by less than
#: :data:`FLAT_POINTS` percentage points: the data hardly constrains the parameter.
PROFILE_STEP, FLAT_POINTS = 0.05, 0.05
#: Candidates are rounded to this many decimals (the cache of simulations is keyed by them), so
#: a range must be at least :data:`MIN_RANGE` wide: narrower, its candidates collapse into one.
DECIMALS = 12
MIN_RANGE = 1e-6
#: The simulations that check how well the data pins the fit: this many per fitted setting.
DIAGNOSIS_PER_PARAMETER = 4


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
    #: statistics of a target left out of the objective, and why (a measured 0)
    left_out: tuple[str, ...] = ()
    #: the file's values that lay outside their ``--fit`` bounds (the fit started at the bound),
    #: as ``{key: value}``, and the error at the file's values themselves (NaN when the fit
    #: starts at them: no value outside its bounds, nothing held, no table made)
    outside: dict[str, float] = attrs.field(factory=dict)
    file_error_pct: float = math.nan
    #: the tables a ``--fit`` key made, which the file has not (``frontend``: a front end the
    #: file's run does not simulate)
    created: tuple[str, ...] = ()
    #: each fitted run's ``[[runs]]`` entry's own tables among those the fit touched (``{run:
    #: ("cost_model",)}``): the file's top-level table cannot change what such an entry sets
    own_tables: dict[str, tuple[str, ...]] = attrs.field(factory=dict)

    @property
    def before_error_pct(self) -> float:
        """The error of the file as written: what the fit is judged against (at the start when
        the start is the file's values)."""
        return self.start_error_pct if math.isnan(self.file_error_pct) else self.file_error_pct


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
    if not all(math.isfinite(v) for v in (2 * lo, 2 * hi, hi - lo)):  # scipy reflects points at a bound: 2 x it
        raise ConfigError(f"--fit {text!r}: the bounds must be finite numbers, well inside a float's range (the fit "
                          f"spreads its starts over the range and reflects its steps at the bounds)")
    if hi - lo < MIN_RANGE:
        raise ConfigError(f"--fit {text!r}: the bounds must be at least {MIN_RANGE:g} apart: the fit rounds its "
                          f"candidates to {DECIMALS} decimals, so a narrower range collapses into one value")
    return Parameter(key.strip(), lo, hi)


def parse_part(text: str | None, n: int | None):
    """``"0:150"`` -> the rows 0..149 of the measured run (and the others), or (None, None).

    With ``n`` None (the log's length not yet known) only the form is checked: FIRST:END, whole
    numbers, neither negative (they count from the log's start; none counts from its end)."""
    if text is None:
        return None, None
    a, colon, b = text.partition(":")
    bounds = f"0 <= FIRST < END <= {n}" if n is not None else "0 <= FIRST < END"
    try:
        lo, hi = int(a or 0), (int(b) if b else n)
    except ValueError:
        colon = ""
    else:
        if colon and (lo < 0 or (hi is not None and hi < 0)):
            raise ConfigError(f"--part {text!r}: {'FIRST' if lo < 0 else 'END'} must be >= 0: the log's requests "
                              f"count from its start (0 is the first), not from its end (expected FIRST:END with "
                              f"{bounds})")
    if not colon or (n is not None and not 0 <= lo < hi <= n):
        raise ConfigError(f"--part {text!r}: expected FIRST:END with {bounds} (requests of the log)")
    if n is None:
        return None, None
    rows = np.arange(lo, hi)
    return rows, np.setdiff1d(np.arange(n), rows)


# --- what a run is judged against ------------------------------------------------------------------


class MeasuredRun:
    """The 15 statistics of the measured run the workload keeps (its ``rows`` only, when given)."""

    timeline = False

    def __init__(self, rows=None, joint_run: str | None = None):
        self.rows = rows
        self.joint_run = joint_run  # the run's name, when it is fitted together with others

    def errors(self, result) -> dict[str, float]:
        from .results.compare import vs_measured

        if result.measured is None and self.joint_run is not None:
            raise ConfigError(f"run {self.joint_run!r}: has no [target] table and its workload keeps no measured run "
                              "(a vllm_log or vllm_bench workload): runs fitted together are each judged against "
                              "their own")
        if result.measured is None:
            raise ConfigError("the run's workload keeps no measured run (use a vllm_log or vllm_bench workload, "
                              "or give summary statistics with --target FILE)")
        vs = vs_measured(result.all_requests(), result.measured, self.rows)
        # (a statistic the run did not measure -- a non-streaming run's TTFT -- is none to fit; nor is a measured 0)
        return {name: error for name, error in vs["errors_pct"].items()
                if math.isfinite(vs["measured"][name]) and vs["measured"][name] != 0}

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
    """The statistics of a :class:`~schedlab.targets.Summary` (a report or a scrape) that can be
    fitted to: a measured 0 (or a quantile a histogram cannot give) has no error in percent, and
    is left out (``left_out``: name -> why, with what the file gave no number for).

    :raises ConfigError: no statistic is left (the message lists what the file held and why
        each is unusable).
    """

    def __init__(self, summary):
        self.left_out = {name: "measured 0: no error in percent" if value == 0 else f"measured {value}"
                         for name, value in summary.values.items() if value == 0 or not math.isfinite(value)}
        if len(self.left_out) == len(summary.values):
            found = [f"{name} is {why}" for name, why in {**summary.dropped, **self.left_out}.items()]
            raise ConfigError(f"{summary.source}: no statistic to fit to: "
                              f"{'; '.join(found) if found else 'it holds none'} (null is read as a statistic the "
                              f"tool had no value for)")
        if self.left_out:
            summary = attrs.evolve(summary, values={n: v for n, v in summary.values.items() if n not in self.left_out})
        self.left_out.update({key: f"{why} in the file" for key, why in summary.dropped.items()})
        self.summary = summary
        self.timeline = any(name.startswith(("iteration_tokens", "energy.")) for name in summary.values)

    def errors(self, result) -> dict[str, float]:
        from .targets import errors_pct

        return errors_pct(self.summary, result)

    def table(self, title: str, result, rows=None) -> str:
        from .targets import percent_error, simulated

        sim = simulated(self.summary, result)
        lines = [f"{title} -- {self.summary.kind}: {self.summary.source}",
                 f"{'statistic':<28}{'measured':>12}{'simulated':>12}{'error':>9}", "-" * 61]
        errs = []
        for name, value in self.summary.values.items():
            err = percent_error(sim[name], value)
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
    if not run_names:
        raise ConfigError(f"--run names no run; the experiment has: {', '.join(s.name for s in exp.studies)}")
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


def _core_config(section: str):
    """The config class of a table the core reads itself (not a plugin's), or None."""
    from .energy.clock import ClockConfig
    from .frontend import ClientConfig, FrontendConfig
    from .speculative import SpeculativeConfig
    from .study.simulation import ClusterConfig, SloConfig

    return {"frontend": FrontendConfig, "client": ClientConfig, "cluster": ClusterConfig, "slo": SloConfig,
            "speculative": SpeculativeConfig, "clock": ClockConfig}.get(section)


#: The tables that name a plugin, and its registry.
PLUGIN_TABLES = {"scheduler": "scheduler", "cost_model": "cost_model", "kv_cache": "kv_cache", "workload": "workload",
                 "power": "power_model"}


def check_settings(exp, tables: dict, parameters: list[Parameter], hold: dict[str, Any]) -> None:
    """Refuse what a fit cannot move: a key outside the run's tables (``experiment.seed`` is
    never applied to a run), a setting fitted twice, and a whole-number or true/false setting
    (a fit moves its settings continuously: ``max_num_seqs`` would be tried at 128.5). A key
    whose declaration cannot be found (an unknown key, a nested table) is left to the run,
    which names it.

    :raises ConfigError: naming the option and key.
    """
    seen: set[str] = set()
    for p in parameters:
        if p.key in seen:
            raise ConfigError(f"--fit {p.key}: given twice; fit each setting once, with one range")
        seen.add(p.key)
        _check_table(p.key, "--fit")
        declared = _declared_type(exp, tables, p.key)
        if declared is None or "float" in declared:
            continue
        if "bool" in declared:
            raise ConfigError(f"--fit {p.key}: a true/false setting; a fit moves its settings continuously -- "
                              f"compare both (a sweep) or hold it (--hold {p.key}=true)")
        if "int" in declared:
            raise ConfigError(f"--fit {p.key}: a whole-number setting; a fit moves its settings continuously -- "
                              f"sweep it ([sweep] or --set) or hold it (--hold {p.key}=VALUE)")
        if declared & {"str", "dict", "list", "tuple"}:
            raise ConfigError(f"--fit {p.key}: not a number setting ({' | '.join(sorted(declared))})")
    for key in hold:
        _check_table(key, "--hold")


def _check_table(key: str, option: str) -> None:
    """``key`` names a setting of a table of the run (not ``experiment.seed``, ``runs.*``, ``[target]``)."""
    from .study.spec import RUN_TABLES

    section, _, name = key.partition(".")
    if section not in RUN_TABLES or section == "target" or not name:
        tables = ", ".join(t for t in RUN_TABLES if t != "target")
        raise ConfigError(f"{option} {key}: not a setting of the run; give a key of one of its tables ({tables}), "
                          f"e.g. cost_model.overhead_ms")


def _declared_type(exp, tables: dict, key: str) -> set[str] | None:
    """The types the setting ``key`` is declared with (``{"float"}``, ``{"int"}`` ...; None
    stripped), or None when its declaration cannot be found."""
    from .errors import UnknownPluginError

    section, _, name = key.partition(".")
    if "." in name:
        return None
    cls = _core_config(section)
    if cls is None:
        table = tables.get(section)
        if section not in PLUGIN_TABLES or not isinstance(table, dict) or "kind" not in table:
            return None
        try:
            cls = exp.context.catalog[PLUGIN_TABLES[section]].get(table["kind"]).config
        except (UnknownPluginError, KeyError, TypeError):
            return None
    field = next((a for a in attrs.fields(cls) if a.name == name), None) if cls and attrs.has(cls) else None
    if field is None or field.type is None:
        return None
    text = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    return {part.strip() for part in text.split("|")} - {"None"}


def calibrate(exp, parameters: list[Parameter], *, max_evaluations: int = 60, **options) -> tuple[Fit, Any, Any]:
    """Fit ``parameters`` on one run of a loaded experiment, or on several together
    (:func:`_calibrate`'s options), with a progress bar of its simulations on a terminal: a fit
    runs minutes and said nothing until its report."""
    from .progress import progress

    with progress(max_evaluations, "calibrate") as bar:
        return _calibrate(exp, parameters, max_evaluations=max_evaluations, bar=bar, **options)


def _calibrate(exp, parameters: list[Parameter], *, run_name: str | list[str] | None = None, max_evaluations: int = 60,
               tolerance: float = 1e-3, rows=None, target=None, hold: dict[str, Any] | None = None,
               starts: int = 1, diagnose: bool = True, objective: str = "statistics",
               bar=None) -> tuple[Fit, Any, Any]:
    """Fit ``parameters`` on one run of a loaded experiment, or on several together (``bar``: a
    progress bar, :func:`schedlab.progress.progress`, advanced by each simulation).

    :param run_name: the run to fit; or a list of runs (names or shell patterns, ``vllm-*``) to
        fit together -- the stages of a sweep, the configurations of one server: the objective
        is then the mean |error| over all their statistics, each run judged against its own
        ``[target]`` or measured run (statistic names prefixed ``"<run>: "``).
    :param rows: fit on the statistics of the measured run's ``rows`` only (the whole run is
        simulated, so they still wait behind and share the GPU with the others).
    :param target: a :class:`~schedlab.targets.Summary` to fit to instead of the measured run.
    :param hold: settings held at a value (``{"cost_model.mfu": 0.6}``).
    :param max_evaluations: the simulations of the whole fit, at most: the start, the screen
        for the other starts (a third of the budget, at most 8 per parameter, at least one per
        start), the descents (the rest: each start in turn gets an equal share of what is left,
        so what one leaves unspent goes to the next), and the diagnosis (
        :data:`DIAGNOSIS_PER_PARAMETER` per parameter, set aside first; left out, with a
        warning, when the budget has no room for it).
    :param starts: Nelder-Mead runs: from the defaults, then from the best of a screen of points
        spread over the bounds; at most ``max_evaluations``.
    :param diagnose: compute the correlations and error profile at the fit
        (:data:`DIAGNOSIS_PER_PARAMETER` simulations per parameter).
    :param objective: how a measured run (not a ``[target]``) judges a candidate:
        ``"statistics"``, its 15 statistics; ``"requests"``, each request against its replay
        (:class:`PairedRequests`).
    :returns: ``(fit, spec at the fit, result at the fit)``; with a list of runs, a list of
        specs and a list of results, one per run.
    :raises ConfigError: no such run, a key that is not a number setting of the run or given
        twice, a budget of no simulation or fewer than ``starts``, nothing to compare with, or a
        start the engine refuses or that leaves nothing to compare.
    """
    from .study.simulation import RunSpec, _tables_with_defaults

    if not parameters:
        raise ConfigError("nothing to fit: give at least one --fit KEY=LOW:HIGH")
    _check_budget(max_evaluations, starts)
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
    file_tables = []  # each run's tables as the file has them (no --hold, no table a --fit key makes)
    for study in (_studies(exp, list(run_name)) if joint else [_study(exp, run_name)]):
        tables = _tables_with_defaults(study.base.tables)
        file_tables.append(tables)
        for key, value in (hold or {}).items():
            tables = set_dotted(tables, key, value)
        if target is not None:
            judge = SummaryTarget(target)
        elif joint and "target" in study.base.tables:
            if objective == "requests":
                raise ConfigError(f"--objective requests pairs the requests of a measured run's log; run "
                                  f"{study.name!r} is judged by its [target] table's summary statistics")
            judge = SummaryTarget(run_target(exp, study, None))
        elif joint:
            judge = OBJECTIVES[objective](rows, joint_run=study.name)
        else:
            judge = OBJECTIVES[objective](rows)
        members.append((study.base, tables, judge))
    tables = members[0][1]  # the start: the first run's values
    check_settings(exp, tables, parameters, hold or {})
    start, outside = [], {}
    for p in parameters:
        value = get_dotted(tables, p.key, None)
        if value is None:
            value = default_value(exp, tables, p.key)
        if value is None:
            value = (p.low + p.high) / 2.0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"--fit {p.key}: the run's value is not a number ({value!r})")
        start.append(min(max(float(value), p.low), p.high))
        if start[-1] != float(value):  # (the fit starts at the bound; the file's own value is scored apart)
            outside[p.key] = float(value)
    cache: dict[tuple, tuple[float, Any, dict]] = {}

    def specs_at(x) -> list[RunSpec]:
        out = []
        for base, t, _ in members:
            for p, v in zip(parameters, x):
                t = set_dotted(t, p.key, float(v))
            out.append(RunSpec(base.name, t, base.seed, base.engine))
        return out

    _check_start(exp, specs_at(start), hold or {})
    _warn_bounds_out_of_range(exp, parameters, start, specs_at)
    judges = [judge for _, _, judge in members]
    failures: list[str] = []  # what the engine said of each candidate it refused
    diagnosis = DIAGNOSIS_PER_PARAMETER * len(parameters)
    room = diagnose and max_evaluations - diagnosis >= max(starts, len(parameters) + 2)
    cap = [max_evaluations - diagnosis if room else max_evaluations]  # simulations allowed so far

    descent = [None]  # the start whose descent is running (None: the start, the screen, the diagnosis)
    found_in: dict[tuple, int | None] = {}  # each candidate: the descent that scored it
    scored_by: dict[int, list[float]] = {}  # each descent: the errors of its candidates, in turn

    def evaluate(x, *, strict: bool = False):
        key = tuple(round(float(v), DECIMALS) for v in x)
        if key not in cache:
            if len(cache) >= cap[0]:
                raise BudgetSpent
            cache[key] = score_all(exp, specs_at(key), judges, strict=strict, prefix=joint, failures=failures)
            found_in[key] = descent[0]
            if descent[0] is not None:
                scored_by.setdefault(descent[0], []).append(cache[key][0])
            if bar is not None:
                bar.update()
                best = min(error for error, _, _ in cache.values())
                bar.set_postfix_str(f"best mean |error| {_pct(best)}")
        return cache[key]

    start_error, _, start_errors = evaluate(start, strict=True)  # fail fast: bad key, nothing to compare with
    file_error = math.nan
    created = _tables_made(file_tables[0], parameters)
    if outside or hold or created:  # the start is not the file: what the file as written scores (no candidate)
        file_specs = [RunSpec(base.name, t, base.seed, base.engine) for (base, _, _), t in zip(members, file_tables)]
        file_error = score_all(exp, file_specs, judges, prefix=joint)[0]
    nothing = _nothing_to_compare(start_errors, parameters, start,
                                  any(isinstance(j, SummaryTarget) for j in judges)) if start_error >= FAILED else None
    if nothing:
        raise ConfigError(nothing)
    lows, highs = np.array([p.low for p in parameters]), np.array([p.high for p in parameters])
    points = [np.array(start)]
    if starts > 1:
        size = min(max(starts - 1, min(8 * len(parameters), max_evaluations // 3)), cap[0] - 1)
        screened = sorted(_spread(lows, highs, size), key=lambda x: evaluate(x)[0])  # stable: ties keep order
        points += screened[:starts - 1]
    fit_cap = cap[0]
    ran_out = {}  # each descent: whether it spent its share (stopped by the budget, not by converging)
    for i, point in enumerate(points):  # each start an equal share of the simulations left
        share = (fit_cap - len(cache)) // (len(points) - i)
        cap[0] = len(cache) + share
        # calls, not simulations: a descent also revisits points it has scored (its restarts' first vertex)
        calls = 2 * share + 2 * (len(parameters) + 1)
        if share > 0:
            descent[0] = i
            restarted_nelder_mead(lambda x: evaluate(x)[0], point, lows, highs, calls, tolerance)
            ran_out[i] = (share, len(cache) >= cap[0] and _still_descending(scored_by.get(i, []), start_error))
    descent[0] = None
    cap[0] = fit_cap
    best = min(cache, key=lambda k: cache[k][0])
    error, results, errors = cache[best]
    specs = specs_at(best)
    values = {p.key: v for p, v in zip(parameters, best)}
    warnings = [_bound_warning(p, values[p.key]) for p in parameters]
    share, spent = ran_out.get(found_in.get(best), (0, False))
    if spent:  # (the diagnosis's 5% profile steps do not see a descent stopped a few percent short)
        warnings.append(f"the descent that found the fit spent its {share} simulations while still lowering the "
                        f"error: the fitted values may stop short of the best; raise --max-evaluations (e.g. to "
                        f"{2 * max_evaluations})")
    if failures:
        warnings.append(f"{len(failures)} of the {len(cache)} candidates failed in the engine and scored as failed "
                        f"(the first: {failures[0]}); keep the bounds where the run works")
    entangled: list[str] = []
    sensitivity: list[str] = []
    if diagnose and not room:
        warnings.append(f"no check of how well the data pins the fit: --max-evaluations {max_evaluations} leaves "
                        f"no room for its {diagnosis} simulations (give at least "
                        f"{diagnosis + max(starts, len(parameters) + 2)})")
    elif diagnose and error < FAILED:
        cap[0] = max_evaluations
        entangled, sensitivity = _identifiability(parameters, np.array(best), lows, highs, errors, evaluate)
    run_tables = tuple(judge.table(f"{spec.name} at the fit: simulated vs measured", result)
                       for spec, judge, result in zip(specs, judges, results)) if joint and results else ()
    left_out = tuple(f"{judge.summary.source}: {name} ({why})" if joint else f"{name} ({why})"
                     for judge in judges for name, why in getattr(judge, "left_out", {}).items())
    fit = Fit(values, error, len(cache), {p.key: v for p, v in zip(parameters, start)}, start_error,
              dict(hold or {}), len(points), errors, tuple(w for w in warnings if w), tuple(entangled),
              tuple(sensitivity), run_tables, objective, left_out, outside, file_error, created,
              _own_tables(exp, [base.name for base, _, _ in members], parameters, hold or {}))
    if joint:
        return fit, specs, results
    return fit, specs[0], results[0] if results else None


def _own_tables(exp, names: list[str], parameters: list[Parameter], hold: dict) -> dict[str, tuple[str, ...]]:
    """Each run's ``[[runs]]`` entry's own tables among the top-level tables the fitted and held
    keys are in: it overrides (or replaces) the file's top-level one, so a fitted value pasted
    there would not reach the run."""
    from .study.overrides import split_key

    touched = list(dict.fromkeys(split_key(k)[0] for k in [p.key for p in parameters] + list(hold)))
    entries = exp.raw.get("runs") or []
    out = {}
    for i, entry in enumerate(entries):
        name = entry.get("name") or (exp.config.name or exp.path.stem if len(entries) == 1 else f"run{i + 1}")
        own = tuple(t for t in touched if t in entry)
        if name in names and own:
            out[name] = own
    return out


def _still_descending(errors: list[float], start_error: float) -> bool:
    """Whether a descent that spent its simulations was still going down: its last quarter of
    candidates lowered its best error by a tenth of a point of mean |error| and by 2% of what the
    fit gained from ``start_error``, or more (a simplex shrinking on a few tenths of a percent
    spends its share too, but has converged for every purpose)."""
    if len(errors) < 4:
        return True
    cut = len(errors) - len(errors) // 4
    drop = min(errors[:cut]) - min(errors)
    return drop >= max(2 * FLAT_POINTS, 0.02 * (start_error - min(errors)))


def _tables_made(tables: dict, parameters: list[Parameter]) -> tuple[str, ...]:
    """The tables (dotted) that setting each ``--fit`` key makes, because ``tables`` has not
    got them: a ``[frontend]`` the run did not have turns the simulated front end on."""
    made = []
    for p in parameters:
        parts = p.key.split(".")[:-1]
        node = tables
        for depth, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                made.append(".".join(parts[:depth + 1]))
                break
            node = node[part]
    return tuple(dict.fromkeys(made))


class BudgetSpent(Exception):
    """Raised by an objective whose simulations are spent: stops a descent where it is."""


def _warn_bounds_out_of_range(exp, parameters: list[Parameter], start: list[float], specs_at) -> None:
    """Say when a bound of ``--fit`` is a value its setting refuses (``mfu=-1:1``, an ``mfu``
    of -1): every candidate past the setting's own range scores as failed, which the fit cannot
    tell from a bad fit. Checked by building the run at each bound, the others at the start."""
    from .study.simulation import assemble

    for i, p in enumerate(parameters):
        for side, bound in (("lower", p.low), ("upper", p.high)):
            x = list(start)
            x[i] = bound
            spec = specs_at(x)[0]
            try:
                assemble(spec, exp.context, f"{exp.context.source}: run {spec.name!r}", check_only=True)
            except SchedlabError as exc:
                warnings.warn(f"--fit {p.key}={p.low:g}:{p.high:g}: its {side} bound is a value the setting refuses "
                              f"({str(exc).strip()}): candidates there score as failed; keep the range within the "
                              "setting's", InputWarning, stacklevel=3)
                break


def _check_start(exp, specs, hold: dict) -> None:
    """Build each run at the start, before any bound is tried: a run the ``--hold`` values (or the
    file) break is that error, named as the option's (it was blamed on a ``--fit`` bound, under
    an empty file name)."""
    from .study.simulation import assemble

    for spec in specs:
        try:
            assemble(spec, exp.context, f"{exp.context.source}: run {spec.name!r}", check_only=True)
        except SchedlabError as exc:
            if not hold:
                raise
            held = " ".join(f"--hold {key}={value}" for key, value in hold.items())
            raise ConfigError(f"{exc} (with {held})") from None


def _nothing_to_compare(errors: dict[str, float], parameters: list[Parameter], start: list[float],
                        summaries: bool = True) -> str | None:
    """Why the start scores no error: the statistics the simulation has no value for (None when
    each has one: an error of a million percent or more is an error, not nothing)."""
    at = ", ".join(f"{p.key} = {v:g}" for p, v in zip(parameters, start))
    missing = [name for name, value in errors.items() if not math.isfinite(value)]
    if not errors:
        return f"at the start ({at}) there is no statistic to compare"
    if not missing:
        return None
    return (f"at the start ({at}) {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''} "
            f"{'has' if len(missing) == 1 else 'have'} no error to fit: the simulation has no value for "
            f"{'it' if len(missing) == 1 else 'them'} (no request finished, or none with a second token: see the "
            f"run's rejections and its KV cache) or the measured value is too close to 0 for an error in percent"
            + ("; leave them out (--statistics) or check that the workload is the benchmark's" if summaries else
               "; check that the workload is the measured run's"))


def restarted_nelder_mead(f, point, lows: np.ndarray, highs: np.ndarray, budget: int, tolerance: float = 1e-3,
                          *, restarts: bool = True):
    """Minimise ``f`` from ``point`` in the box with scipy's bounded Nelder-Mead, in at most
    ``budget`` calls (or until ``f`` raises :class:`BudgetSpent`: the descent stops where it
    is); returns ``(x, f(x))`` of the best point seen.

    The first simplex is a quarter of each range wide: the error surface is piecewise smooth
    (iterations are discrete), so small steps see only its plateaus. A simplex collapses on the
    kinks a mean |error| has (one statistic crossing zero) and stops short in a valley:
    restarted from its best point with a fresh simplex, it walks on, until a restart improves
    on its start by less than 1e-3 or the budget is spent (``restarts=False``: one descent)."""
    from scipy.optimize import minimize

    span = 0.25 * (highs - lows)
    calls = 0
    point = np.asarray(point, dtype=float)
    value = f(point)  # the start's value: not counted against the budget (the caller has scored it)
    best = [point, value]

    def counted(x):
        nonlocal calls
        calls += 1
        y = f(x)
        if y < best[1]:
            best[:] = [np.clip(np.asarray(x, dtype=float), lows, highs), float(y)]
        return y

    while calls < budget:
        simplex = [point] + [point + np.where(np.arange(len(point)) == i, np.where(point + span <= highs, span, -span),
                                              0.0) for i in range(len(point))]
        try:
            result = minimize(counted, point, method="Nelder-Mead", bounds=list(zip(lows, highs)),
                              options={"initial_simplex": simplex, "maxfev": max(budget - calls, 1),
                                       "xatol": tolerance, "fatol": 1e-3})
        except BudgetSpent:
            break
        if not restarts or not result.fun < value - 1e-3:
            break
        point, value = np.clip(result.x, lows, highs), float(result.fun)
    return best[0], best[1]


def score_all(exp, specs, judges, *, strict: bool = False, prefix: bool = False,
              failures: list | None = None) -> tuple[float, Any, dict]:
    """:func:`score` over runs fitted together: ``(mean |error| over all their statistics,
    results, errors)``; a run that fails fails the candidate (its error goes to ``failures``)."""
    results, errors = [], {}
    for spec, judge in zip(specs, judges):
        error, result, errs = score(exp, spec, judge, strict=strict, failures=failures)
        errors.update({(f"{spec.name}: {k}" if prefix else k): v for k, v in errs.items()})
        if error >= FAILED:
            return FAILED, None, errors  # the errors so far: which statistic has no value
        results.append(result)
    return mean_abs(errors), results, errors


def score(exp, spec, judge, *, strict: bool = False,
          failures: list | None = None) -> tuple[float, Any, dict[str, float]]:
    """``(mean |error|, result, errors)`` of one candidate; a candidate the engine or a
    plugin refuses (an iteration of 0 ms at a bound of 0, a setting out of its range) scores
    :data:`FAILED` -- unless ``strict``, then the error is raised; else its message goes to
    ``failures``."""
    from .study.simulation import run

    try:
        result = run(spec, exp.context, timeline=judge.timeline)
        errors = judge.errors(result)
    except SchedlabError as exc:
        if strict:
            raise
        if failures is not None:
            failures.append(str(exc))
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
        here = evaluate(best)[0]
        # (a move the engine refuses is no rise in the error; a move that lowers it: the fit stopped short)
        profile.append(math.inf if max(moved) >= FAILED else min(moved) - here if min(moved) < here
                       else max(moved) - here)
    out = []
    summary = [f"{p.key}: a move over {PROFILE_STEP:.0%} of its range fails in the engine" if math.isinf(profile[i])
               else f"{p.key}: {profile[i]:+.3f} points of mean error for a move over {PROFILE_STEP:.0%} of its range"
               for i, p in enumerate(parameters)]
    for i, p in enumerate(parameters):
        if profile[i] <= -FLAT_POINTS:
            out.append(f"{p.key}: a move over {PROFILE_STEP:.0%} of its range lowers the mean error by "
                       f"{-profile[i]:.3f} points -- the fit stopped short of the best value; raise "
                       "--max-evaluations (or --starts)")
        elif abs(profile[i]) < FLAT_POINTS:  # (a drop of noise is as flat as a rise of it)
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
                if abs(corr[i, j]) >= ENTANGLED and FLAT_POINTS <= profile[i] < math.inf and \
                        FLAT_POINTS <= profile[j] < math.inf:
                    out.append(f"{parameters[i].key} and {parameters[j].key}: correlation {corr[i, j]:+.2f} -- the "
                               f"statistics fix a combination of them, not each; hold one (--hold) or add a "
                               f"measurement that separates them")
    return out, summary


# --- output --------------------------------------------------------------------------------------------


def snippet(spec, parameters: list[Parameter], held: dict[str, Any] | None = None,
            own: tuple[str, ...] = ()) -> str:
    """The fitted tables as TOML to paste: each top-level table the fit touched, in full -- its
    sub-tables too (``[cluster.decode.cost_model]``), so a nested key's fitted value is there.
    A table in ``own`` -- one the run's ``[[runs]]`` entry has itself, which overrides the file's
    top-level one -- is written as the entry's inline table instead, to replace the entry's."""
    from .study.overrides import split_key

    lines = []
    keys = [p.key for p in parameters] + list(held or {})
    for table in dict.fromkeys(split_key(k)[0] for k in keys):
        if table in own:
            lines += [f"# in the [[runs]] entry of {spec.name!r}, in place of its own {table} (which overrides the "
                      f"top-level [{table}]):", f"{_toml_key(table)} = {_toml(spec.tables[table])}", ""]
        else:
            lines += _table_lines(table, spec.tables[table])
    return "\n".join(lines)


def _table_lines(path: str, table: dict) -> list[str]:
    """``[path]`` with its values, then each sub-table as ``[path.key]`` (a blank line after each)."""
    lines = [f"[{path}]"]
    lines += [f"{_toml_key(key)} = {_toml(value)}" for key, value in table.items() if not isinstance(value, dict)]
    lines.append("")
    for key, value in table.items():
        if isinstance(value, dict):
            lines += _table_lines(f"{path}.{_toml_key(key)}", value)
    return lines


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml(key)


def _toml(value) -> str:
    """A value as TOML writes it (floats to 6 significant digits; lists and inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}" if "e" not in f"{value:.6g}" else repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml(v)}" for k, v in value.items()) + "}"
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
        what = f"{len(fit.errors)} statistic{'s' if len(fit.errors) != 1 else ''} of {target.source}"
    else:
        what = f"the {len(fit.errors)} {values} of the measured run" + (" (the fitted requests)" if rows is not None
                                                                       else "")
        if fit.objective == "requests":
            what += ", each request against its replay"
    before = fit.before_error_pct
    lines = [f"before the fit (the file's values and the plugins' defaults): mean |error| "
             f"{_pct(before)} over {what}", "", "fit (start -> fitted, bounds):"]
    if not math.isnan(fit.file_error_pct):  # the start is not the file as written: say why, and its error
        why = []
        if fit.outside:
            moved = ", ".join(f"{key} = {value:g}" for key, value in fit.outside.items())
            why.append(f"the file's {moved} outside the --fit bounds (the fit starts at the nearest bound)")
        if fit.held:
            why.append("held: " + ", ".join(f"{key} = {value!r}" for key, value in fit.held.items()))
        if fit.created:
            why.append(f"{', '.join(f'[{t}]' for t in fit.created)} made by --fit (the file has none)")
        lines[1:1] = [f"the fit's start differs from the file ({'; '.join(why)}): mean |error| "
                      f"{_pct(fit.start_error_pct)} there"]
    if fit.left_out:
        lines[1:1] = [f"left out of the fit: {', '.join(fit.left_out)}"]
    for p in parameters:
        flag = "  (on its bound)" if any(w.startswith(p.key + " =") for w in fit.warnings) else ""
        lines.append(f"  {p.key:<32} {fit.start[p.key]:>10.4g} -> {fit.values[p.key]:<10.4g} "
                     f"[{p.low:g}, {p.high:g}]{flag}")
    for key, value in fit.held.items():
        lines.append(f"  {key:<32} held at {value!r}")
    lines.append(f"  {fit.evaluations} simulation{'s' if fit.evaluations != 1 else ''} from {fit.starts} "
                 f"start{'s' if fit.starts > 1 else ''}; "
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
    if fit.outside and fit.mean_abs_error_pct >= before:
        warnings.append(f"the fit ({_pct(fit.mean_abs_error_pct)}) is no better than the file's values "
                        f"({_pct(before)}), which lie outside the bounds: keep them, or widen the bounds to take "
                        "them in")
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
    if fit.mean_abs_error_pct >= before:
        lines.append("# nothing to paste: the fit did not improve on the file's values")
        return "\n".join(lines)
    lines.append("# paste into the experiment:" + (f" (the tables of {spec[0].name}; the fitted keys are the same "
                                                    "in every run)" if joint else ""))
    if joint and fit.own_tables:  # one snippet for every run: the runs' own tables would keep their values
        lines.append("# (" + "; ".join(f"run {name!r} sets {', '.join(tables)} in its own [[runs]] entry"
                                       for name, tables in fit.own_tables.items())
                     + ": change the fitted keys there too, or they keep that entry's values)")
    lines.append(snippet(spec[0] if joint else spec, parameters, fit.held,
                         () if joint else fit.own_tables.get(spec.name, ())))
    return "\n".join(lines)


def _pct(value: float) -> str:
    return "failed" if value >= FAILED else f"{value:.2f}%"


def predict(exp, spec, overrides: list[str]):
    """Run the fitted ``spec`` with ``overrides`` (``workload.start=150``) and return its result."""
    from .study.simulation import run

    return run(_predicted(spec, overrides), exp.context, timeline=False)


def _predicted(spec, overrides: list[str]):
    """``spec`` with the ``--predict`` overrides, renamed ``<name> (predict)``."""
    from .study.simulation import RunSpec

    tables = spec.tables
    for text in overrides:
        key, value = parse_assignment(text, where="--predict")
        tables = set_dotted(tables, key, value)
    return RunSpec(spec.name + " (predict)", tables, spec.seed, spec.engine)


def _check_predict(exp, study, hold: dict, overrides: list[str]) -> None:
    """Build the run ``--predict`` asks for (at the file's values) before the fit: an override it
    refuses stopped the command only after every simulation of the fit, named as the file's."""
    from .study.simulation import RunSpec, _tables_with_defaults, assemble

    tables = _tables_with_defaults(study.base.tables)
    for key, value in hold.items():
        tables = set_dotted(tables, key, value)
    spec = _predicted(RunSpec(study.base.name, tables, study.base.seed, study.base.engine), overrides)
    try:
        assemble(spec, exp.context, f"{exp.context.source}: run {spec.name!r}", check_only=True)
    except SchedlabError as exc:
        raise ConfigError(f"{exc} (from --predict {' '.join(overrides)})") from None


def _measured_count(exp, study) -> int:
    """How many requests the study's measured run has (its workload is built to count them)."""
    from .study.simulation import _tables_with_defaults, build_component

    table = _tables_with_defaults(study.base.tables)["workload"]
    workload = build_component(exp.context, "workload", table, f"{exp.context.source}: [workload]")
    measured = getattr(workload, "measured", None)
    if measured is None:
        raise ConfigError("the run's workload keeps no measured run (use a vllm_log or vllm_bench workload)")
    return len(measured.ttft_ms)


#: how far the simulated workload's mean prompt or output may be from a benchmark's before it
#: is noted: a sampled workload's mean wanders a few percent from run to run, another dataset's
#: or another --random-input-len's by more
TOKENS_NOTED = 0.1
#: the same for the rate the requests were sent at: schedlab's own Poisson or gamma stream (a
#: generated workload) of a few hundred requests wanders by more over its span (vLLM's client
#: rescales its send times to n / rate, and so does a redrawn vllm_bench replay: they do not)
RATE_NOTED = 0.25


def workload_mismatches(target, requests: dict) -> list[str]:
    """Where the simulated run's workload is not the one the summary ``target`` measured: its
    count of finished requests, mean prompt and output tokens (> :data:`TOKENS_NOTED` apart) and
    the rate its requests arrived at (> :data:`RATE_NOTED`). A fit to another workload fits the
    cost model to the wrong numbers, so each is said before the fit's report."""
    from .results.metrics import completed

    notes = []
    served = completed(requests)   # as the benchmark counts them: neither turned away nor given up on
    finished = int(served.sum())
    if target.requests is not None and finished != target.requests:
        notes.append(f"{target.source} counts {target.requests} requests, the simulated run finished {finished}")
    if target.tokens is not None and finished:
        for label, column, measured in zip(("prompt", "output"), ("prompt_tokens", "generated_tokens"), target.tokens):
            simulated = float(requests[column][served].mean())
            if abs(simulated - measured) > TOKENS_NOTED * measured:
                notes.append(f"{target.source}'s requests average {measured:.4g} {label} tokens, the simulated "
                             f"ones {simulated:.4g}")
    arrivals = np.sort(requests["arrival_ms"])
    if target.sent_rate is not None and len(arrivals) > 1 and arrivals[-1] > arrivals[0]:
        simulated = (len(arrivals) - 1) / ((arrivals[-1] - arrivals[0]) / 1000.0)
        if abs(simulated - target.sent_rate) > RATE_NOTED * target.sent_rate:
            notes.append(f"{target.source} sent {target.sent_rate:.4g} requests/s, the simulated requests "
                         f"arrived at {simulated:.4g}/s")
    return notes


def model_mismatch(target, spec, ctx) -> str:
    """Where the summary ``target`` names the model it measured (a Hugging Face id) and the run's
    cost model times another preset: "" when they match or either is unknown. A fit to another
    model's statistics fits the cost model to the wrong numbers."""
    if getattr(target, "model", None) is None:
        return ""
    name = (spec.tables.get("cost_model") or {}).get("model")
    if not isinstance(name, str):
        return ""
    try:
        simulated = ctx.presets.model(name)
    except (SchedlabError, KeyError):
        return ""
    try:
        with warnings.catch_warnings():  # (which preset a tuned checkpoint's id resolves to: no news here)
            warnings.simplefilter("ignore", InputWarning)
            measured = ctx.presets.model(target.model).name
    except (SchedlabError, KeyError):  # an id no preset carries: its size, if both say one ("70B" vs "8b")
        sizes = [_SIZE.findall(text.lower()) for text in (target.model, simulated.hf_id or simulated.name)]
        if not all(sizes) or sizes[0][0] == sizes[1][0]:
            return ""
        return f"{target.source} measured {target.model}, the run's cost model times {simulated.name}"
    if simulated.name == measured:
        return ""
    return f"{target.source} measured {target.model} ({measured}), the run's cost model times {simulated.name}"


#: a model's size in a name or Hugging Face id (``Llama-3.1-70B`` -> 70, ``qwen3-30b-a3b`` -> 30)
_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])")


def _held_out_error(exp, tables: dict, base, rows, objective: str = "statistics") -> float:
    """The mean |error| of the measured run's ``rows`` in a run with ``tables``, judged as the
    fit was."""
    from .study.simulation import RunSpec, run

    result = run(RunSpec(base.name, tables, base.seed, base.engine), exp.context, timeline=False)
    return mean_abs(OBJECTIVES[objective](rows).errors(result))


# --- CLI ------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    from .targets import TTFT_STARTS

    parser.add_argument("file", help="experiment file whose run replays a measured run, or simulates the "
                                     "benchmark --target describes")
    parser.add_argument("--fit", action="append", required=True, metavar="KEY=LOW:HIGH",
                        help="a setting to fit and its bounds, e.g. cost_model.overhead_ms=0:5 (repeatable)")
    parser.add_argument("--hold", action="append", default=[], metavar="KEY=VALUE",
                        help="hold a setting at a value, out of the fit (repeatable)")
    parser.add_argument("--target", metavar="FILE",
                        help="fit to summary statistics: a vllm bench serve or SGLang bench_serving result, an "
                             "inference-perf, guidellm, genai-perf or AIPerf report, or a scrape of vLLM's, SGLang's "
                             "or TGI's /metrics")
    parser.add_argument("--target-baseline", metavar="FILE",
                        help="a /metrics scrape taken before the run: subtracted from --target's")
    parser.add_argument("--target-index", type=int, default=None, metavar="N",
                        help="which benchmark of a guidellm report with several (default 0), or which JSON "
                             "document of a file of several, as vllm bench serve --append-result writes (default "
                             "the last)")
    parser.add_argument("--target-vllm-ttft-from", choices=TTFT_STARTS, default=None,
                        help="where the TTFT and E2E histograms of --target start, for vLLM's own (a scrape of its "
                             "/metrics, inference-perf's server metrics of a vLLM server), with a [frontend]: "
                             "'api_server' (vLLM >= 0.17, the default: as the vllm presets model 0.33) or 'engine' "
                             "(vLLM <= 0.16: from the engine's arrival, after tokenizing); [target]'s vllm_ttft_from")
    parser.add_argument("--statistics", metavar="NAMES",
                        help="comma-separated statistics of --target to fit (default: all it holds), e.g. "
                             "ttft_ms.mean,itl_ms.p50,e2e_ms.p99")
    parser.add_argument("--run", help="the run to fit (when the file has several); several to fit together, each "
                                      "against its own [target] or measured run: A,B or a pattern such as 'vllm-*'")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key before fitting (TOML value syntax)")
    parser.add_argument("--predict", action="append", default=[], metavar="KEY=VALUE",
                        help="after the fit, run it with these overrides (e.g. workload.path=other_run.jsonl: another "
                             "measured run of the deployment) and compare")
    parser.add_argument("--part", metavar="FIRST:END",
                        help="fit on the statistics of these requests of the log only (the whole run is simulated); "
                             "the table of the other requests then shows the prediction")
    # argparse takes "-5:10" for an option, so "--part -5:10" failed with "expected one argument" before
    # parse_part could say what is wrong with it: read "-N:M" as a value, as argparse reads "-5" (a private
    # attribute of argparse's, hence the care: without it, the option's message is argparse's)
    numbers = getattr(parser, "_negative_number_matcher", None)
    if isinstance(numbers, re.Pattern):
        parser._negative_number_matcher = re.compile(f"{NEGATIVE_PART}|{numbers.pattern}")
    parser.add_argument("--objective", choices=tuple(OBJECTIVES), default="statistics",
                        help="what a measured run's log is fitted on: its 15 statistics (default), or each "
                             "request's TTFT, TPOT and latency against its own replay ('requests': pins what grows "
                             "with the prompt or the batch where statistics trade settings off)")
    parser.add_argument("--starts", type=int, default=3, help="Nelder-Mead starts: the defaults, then points "
                                                              "spread over the bounds (default 3; at most "
                                                              "--max-evaluations)")
    parser.add_argument("--max-evaluations", type=int, default=60,
                        help="simulations at most, all told (default 60): the start; a screen of points for the other "
                             "starts (a third); 4 per fitted setting to check how well the data pins the fit (set "
                             "aside when there is room); the rest shared equally by the starts' descents")


def command(args) -> int:
    from .study.experiment import load
    from .targets import incomparable_left_out, read_summary, vllm_ttft_from_problem

    parse_part(args.part, None)   # its form, before the file is loaded
    exp = load(args.file, args.set)
    parameters = [parse_parameter(text) for text in args.fit]
    hold = dict(parse_assignment(text, where="--hold") for text in args.hold)
    both = sorted(set(hold) & {p.key for p in parameters})
    if both:
        raise ConfigError(f"--hold {both[0]}: also given to --fit; a setting is fitted or held, not both")
    _check_budget(args.max_evaluations, args.starts)
    names = _statistic_names(args.statistics)
    target = None
    if args.target is not None:
        if args.part is not None:
            raise ConfigError("--part picks requests of a measured run's log; --target holds summary statistics only")
        target = read_summary(args.target, baseline=args.target_baseline, index=args.target_index,
                              statistics=names)
        if args.target_vllm_ttft_from is not None:   # (as [target]'s vllm_ttft_from: TargetConfig.read)
            problem = vllm_ttft_from_problem(target)
            if problem is not None:
                raise ConfigError(f"--target-vllm-ttft-from {args.target_vllm_ttft_from}: {problem}")
            target = attrs.evolve(target, ttft_from=args.target_vllm_ttft_from)
        target = target.select(names)
    else:
        for option, value in (("--target-index", args.target_index), ("--target-baseline", args.target_baseline),
                              ("--target-vllm-ttft-from", args.target_vllm_ttft_from)):
            if value is not None:
                raise ConfigError(f"{option}: applies to the file --target names; give --target (a run's [target] "
                                  f"table has its own index, baseline and vllm_ttft_from keys)")
    rows = others = None
    run_name = _run_names(args.run, exp)
    if isinstance(run_name, list):
        if args.predict or names or args.part is not None:
            raise ConfigError("--predict, --statistics and --part take one run; runs fitted together use each one's "
                              "[target] or measured run as it is (run the experiment with the fitted values to "
                              "predict)")
        fit, specs, results = calibrate(exp, parameters, run_name=run_name, max_evaluations=args.max_evaluations,
                                        rows=None, target=target, hold=hold, starts=args.starts,
                                        objective=args.objective)
        print(report(fit, specs, results, parameters))
        return 0
    study = _study(exp, args.run)
    if target is not None:
        target = incomparable_left_out(target, study.base.tables, "--target")
    if target is None and args.part is None and args.objective == "statistics" and "target" in study.base.tables:
        target = run_target(exp, study, args.statistics)
    if target is None and names:
        raise ConfigError(f"--statistics: picks statistics of a summary (--target, or the run's [target] table); run "
                          f"{study.name!r} is judged against its measured run"
                          + (" (--part picks its requests)" if args.part is None else ""))
    if args.part is not None:
        rows, others = parse_part(args.part, _measured_count(exp, study))
    if args.predict:
        _check_predict(exp, study, hold, args.predict)
    fit, spec, result = calibrate(exp, parameters, run_name=args.run, max_evaluations=args.max_evaluations,
                                  rows=rows, target=target, hold=hold, starts=args.starts, objective=args.objective)
    if target is not None and result is not None:
        for note in workload_mismatches(target, result.all_requests()):
            print(f"note: {note}: is the experiment's workload the benchmark's?\n")
        note = model_mismatch(target, spec[0] if isinstance(spec, list) else spec, exp.context)
        if note:
            print(f"note: {note}: is the experiment's model the benchmark's?\n")
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
            rows_b = comparison_rows(statistics(simulated_latencies(before.all_requests(), before.measured)),
                                     measured_statistics(before.measured))
            pair = tuple(mean_abs_error({r[0]: r[3] for r in rows_}) for rows_ in (rows_b, rows_p))
        if pair[1] > pair[0]:
            print(f"warning: the prediction ({', '.join(args.predict)}): mean |error| {pair[0]:.2f}% before the "
                  f"fit, {pair[1]:.2f}% after -- the fit does not carry over")
    return 0


def _run_names(text: str | None, exp) -> str | list[str] | None:
    """``--run``: one name, or several to fit together (comma-separated, or shell patterns)."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--run {text!r}: names no run; the experiment has: {', '.join(s.name for s in exp.studies)}")
    if len(names) == 1 and not any(c in names[0] for c in "*?["):
        return names[0]
    matched = _studies(exp, names)
    if len(matched) == 1:  # a pattern that picks one run: that run alone (--target, --part and --predict apply)
        return matched[0].name
    return names


def _check_budget(max_evaluations: int, starts: int) -> None:
    """``--max-evaluations`` of at least one simulation, and no more ``--starts`` than it."""
    if max_evaluations < 1:
        raise ConfigError(f"--max-evaluations {max_evaluations}: must be at least 1 (the simulations the fit may run)")
    if not 1 <= starts <= max_evaluations:
        raise ConfigError(f"--starts {starts}: must be from 1 to --max-evaluations ({max_evaluations}): each start "
                          f"takes at least one of the fit's simulations")


def _statistic_names(text: str | None) -> list[str] | None:
    """``--statistics``: the names, checked against the names a summary can hold; None when not given."""
    from .targets import check_statistic_names

    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    check_statistic_names(names, f"--statistics {text!r}")
    return names


def run_target(exp, study, statistics: str | None):
    """The summary the run's ``[target]`` table names (``--statistics`` picks among its own)."""
    from .configs import FieldError, from_table
    from .targets import TargetConfig

    where = f"{exp.context.source}: run {study.name!r} [target]"
    config = from_table(TargetConfig, study.base.tables["target"], where=where, base_dir=exp.context.base_dir)
    try:
        target = config.read()
    except (ConfigError, FieldError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return target.select([s.strip() for s in statistics.split(",") if s.strip()]) if statistics else target


def _start_tables(tables: dict, fit: Fit) -> dict:
    """``tables`` with the fitted settings back at their start values."""
    for key, value in fit.start.items():
        tables = set_dotted(tables, key, value)
    return tables
