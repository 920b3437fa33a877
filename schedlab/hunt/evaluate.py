"""Evaluate candidate workloads: every run of the file on the same requests, then the goal.

A candidate's runs become ordinary tasks (:class:`~schedlab.study.tasks.RunTask`) with an
``inline`` workload holding its requests, so they run wherever the executor runs them --
this process, ``--jobs`` worker processes or a Ray cluster -- and come back in the order
they were submitted: a batch's scores never depend on the executor.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import attrs

from ..errors import ConfigError, PluginError, SimulationError, WorkloadError
from ..interrupts import result_of
from ..results.records import RunResult
from ..study.overrides import set_dotted
from ..study.simulation import RunSpec
from ..study.tasks import ContextSpec, RunTask, TaskFailure, say_run_warnings
from .config import Goal
from .expression import namespace
from .space import Candidate, workload_stats

#: Fitness (lower is better for the optimiser) of a candidate breaking a constraint: above any
#: feasible one's, growing with how far it is from the constraints, and below 5e20, where
#: Nevergrad clips losses (so that the optimiser still tells two infeasible candidates apart).
INFEASIBLE = 1e18


@attrs.frozen
class Score:
    """What one candidate showed.

    :ivar value: the goal's expression (NaN when a metric is missing or a run failed).
    :ivar feasible: every constraint holds and the value is a number.
    :ivar violation: how far the constraints are from holding (0 when feasible).
    :ivar values: every name of the goal and constraints -> its number.
    :ivar error: a run's error message (a stalled run, an impossible request), or None.
    :ivar undefined: why the goal's expression has no value though every run finished (a
        division by zero, a missing metric), or None: the summary says so rather than "none feasible".
    :ivar rejected: run -> how many of the workload's requests it rejected (e.g. a prompt longer
        than ``max_model_len``), runs that rejected none left out. Such a workload is infeasible
        unless ``[hunt] allow_rejected``: its metrics leave those requests out.
    :ivar rejection: the commonest reason the runs gave for rejecting (digits as ``#``), or None.
    """

    value: float
    feasible: bool
    violation: float
    values: dict[str, float]
    error: str | None = None
    undefined: str | None = None
    rejected: dict = attrs.field(factory=dict)
    rejection: str | None = None

    def fitness(self, direction: int) -> float:
        """The number the optimiser minimises: ``-direction * value`` when feasible."""
        if self.feasible:
            return -direction * self.value
        if math.isinf(self.violation):
            return 3 * INFEASIBLE
        return INFEASIBLE * (1.0 + self.violation / (1.0 + self.violation))


def setting_run(key: str, runs) -> str | None:
    """The run a ``runs.<run>.table.key`` setting is for -- the longest of ``runs`` that its key
    starts with, so that with runs ``a`` and ``a.b`` the key ``runs.a.b.scheduler.x`` is ``a.b``'s
    -- or None (a key for every run, or for none of them)."""
    if not key.startswith("runs."):
        return None
    return next((r for r in sorted(runs, key=len, reverse=True) if key.startswith(f"runs.{r}.")), None)


def settings_for(run: str, settings: dict[str, Any], runs) -> list[tuple[str, Any]]:
    """The dotted keys and values of ``settings`` that apply to ``run`` (one of ``runs``):
    ``table.key`` applies to every run, ``runs.<run>.table.key`` to that one only."""
    out = []
    for key, value in settings.items():
        if key.startswith("runs."):
            if setting_run(key, runs) == run:
                out.append((key[len(f"runs.{run}."):], value))
        else:
            out.append((key, value))
    return out


def run_spec(study, candidate: Candidate, runs) -> RunSpec:
    """The run of ``study`` (a ``[[runs]]`` entry, one of those named ``runs``) on
    ``candidate``'s requests and settings."""
    tables = study.base.tables
    for key, value in settings_for(study.name, candidate.settings, runs):
        tables = set_dotted(tables, key, value)
    tables = dict(tables, workload={"kind": "inline", "requests": [dict(r) for r in candidate.rows]})
    return RunSpec(study.name, tables, study.base.seed, study.base.engine)


class Evaluator:
    """Runs candidates through every study of a hunt file and scores them against the goal."""

    def __init__(self, studies, context: ContextSpec, goal: Goal, executor, *, allow_rejected: bool = False):
        self.studies = list(studies)
        self.runs = tuple(s.name for s in self.studies)
        self.context = context
        self.goal = goal
        self.executor = executor
        self.allow_rejected = allow_rejected
        self.evaluations = 0

    def evaluate(self, candidates: list[Candidate], *, timeline: bool = False,
                 keep: bool = False) -> list[tuple[Score, dict[str, RunResult] | None]]:
        """Score every candidate (all their runs in flight at once); with ``keep``, also their runs."""
        futures = [[self.executor.submit(RunTask(run_spec(study, c, self.runs), self.context, timeline))
                    for study in self.studies]
                   for c in candidates]
        out = []
        for candidate, mine in zip(candidates, futures):
            results = [result_of(f) for f in mine]
            for result in results:
                say_run_warnings(result)
            self.evaluations += 1
            out.append((self.score(candidate, results), dict(zip(self.runs, results)) if keep else None))
        return out

    def score(self, candidate: Candidate, results: list) -> Score:
        failed = [r for r in results if isinstance(r, TaskFailure)]
        for failure in failed:
            if not run_failure(failure.error, candidate):
                raise failure.error  # a bad table is the file's fault, not the workload's
        metrics = {name: r.metrics for name, r in zip(self.runs, results) if isinstance(r, RunResult)}
        lookup = namespace(metrics, workload_stats(candidate.rows), self.runs)
        values = {name: _as_float(lookup(name)) for name in self.goal.names}

        def value_of(expression):
            return expression.value(lambda name: values[name])

        value = value_of(self.goal.expression)
        violation = sum(c.violation(value_of(c.expression)) for c in self.goal.constraints)
        error = failure_text(failed[0].error, candidate) if failed else None
        undefined = None
        if error is not None:
            value, violation = math.nan, math.inf
        elif math.isnan(value):
            undefined = self.goal.expression.why_undefined(lambda name: values[name])
        rejected, reasons = {}, Counter()
        for name, m in metrics.items():
            count = m.get("rejected", 0)
            if isinstance(count, (int, float)) and count > 0:
                rejected[name] = int(count)
                reasons.update(m.get("rejection_reasons") or {})
        if rejected and not self.allow_rejected:  # infeasible, the more so the more were rejected
            share = sum(rejected.values()) / (len(self.runs) * max(1, len(candidate.rows)))
            violation += share
        feasible = violation == 0 and not math.isnan(value)
        rejection = reasons.most_common(1)[0][0] if reasons else None
        return Score(value, feasible, violation if not math.isnan(value) else math.inf, values, error, undefined,
                     rejected, rejection)


def run_failure(error: BaseException, candidate: Candidate) -> bool:
    """Whether ``error`` is the candidate's -- a run that stalled, an impossible request, a plugin
    that raised on these requests, settings of ``[hunt.settings]`` that do not build together
    (each range's ends were checked on loading, not every mix) -- rather than the file's."""
    if isinstance(error, (SimulationError, WorkloadError, PluginError)):
        return True
    return isinstance(error, ConfigError) and bool(candidate.settings)


def failure_text(error: BaseException, candidate: Candidate) -> str:
    """What a failed run says, a settings mix that does not build named as such."""
    if isinstance(error, ConfigError):
        mix = ", ".join(f"{key} = {value!r}" for key, value in candidate.settings.items())
        return f"the settings {mix} do not build together: {error}"
    return str(error)


def _as_float(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
