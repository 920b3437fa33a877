"""Drivers: how one study asks for runs and assembles its results, whatever order they finish in.

A driver hands the runner :class:`PointJob` objects (one point, ``replicas`` tasks), is told
when each completes, and may answer with more jobs (a search's next probes). Results are
stored by position -- sweep point index, search value -- never by arrival. :mod:`.runner`
schedules the jobs; :mod:`.planner`'s plan driver runs one :class:`SearchDriver` per candidate.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from ..results.records import RunResult, Study
from .caveats import answer_caveats
from .partition import merge_parts
from .replicas import combine, replica_name, replica_seed
from .search import Constraint
from .simulation import RunSpec
from .spec import point_spec
from .speculative import SpeculativeSearch

SEARCH_PRIORITY = 0
FIXED_PRIORITY = 1


@attrs.define(eq=False)
class PointJob:
    """One point of a study (a run, a sweep point, a search value), as ``replicas`` tasks."""

    spec: RunSpec
    replicas: int
    owner: Any
    key: Any = None
    priority: int = FIXED_PRIORITY
    results: list = attrs.Factory(list)
    started: bool = False
    cancelled: bool = False

    def __attrs_post_init__(self):
        self.results = [None] * self.tasks

    @property
    def parts(self) -> int:
        """Tasks each replica is split into (``[cluster] partitions``, :mod:`.partition`)."""
        cluster = self.spec.tables.get("cluster")
        parts = cluster.get("partitions", 1) if isinstance(cluster, dict) else 1
        return parts if isinstance(parts, int) and not isinstance(parts, bool) and parts > 1 else 1

    @property
    def tasks(self) -> int:
        return self.replicas * self.parts

    def task_spec(self, index: int) -> RunSpec:
        replica, part = divmod(index, self.parts)
        spec = self.spec
        if self.replicas > 1:
            spec = attrs.evolve(spec, name=replica_name(spec.name, replica), seed=replica_seed(spec.seed, replica))
        if self.parts > 1:
            spec = attrs.evolve(spec, part=(part, self.parts))
        return spec

    def record(self, index: int, result: RunResult) -> bool:
        """Store one task's result; True when the point is complete."""
        self.results[index] = result
        return all(r is not None for r in self.results)

    def replica_results(self) -> list[RunResult]:
        """Each replica's run, its parts merged."""
        parts = self.parts
        if parts == 1:
            return list(self.results)
        return [merge_parts(self.results[i * parts].name, self.results[i * parts:(i + 1) * parts])
                for i in range(self.replicas)]

    def result(self) -> RunResult:
        replicas = self.replica_results()
        if self.replicas == 1:
            return replicas[0]
        return combine(self.spec.name, replicas, self.spec.seed)


class FixedDriver:
    """A single run or a sweep: every point known up front, results by point index."""

    #: every task of its jobs is wanted: the progress bar counts a replica as it finishes (a search's
    #: probes off its path are not, so its bar moves per probe on the path)
    counts_tasks = True

    def __init__(self, name: str, kind: str, specs: list[RunSpec], replicas: int, keys: tuple = ()):
        self.name, self.kind, self.keys = name, kind, keys
        self.jobs = [PointJob(spec, replicas, self, key=i) for i, spec in enumerate(specs)]
        self.total = len(specs) * replicas
        self.completed = 0

    def start(self) -> list[PointJob]:
        return list(self.jobs)

    def job_done(self, job: PointJob) -> list[PointJob]:
        self.completed += job.replicas
        return []

    def refresh(self) -> list[PointJob]:
        return []

    def study(self) -> Study:
        return Study(self.name, self.kind, [job.result() for job in self.jobs], keys=self.keys)


class SearchDriver:
    """A boundary search evaluated ``width`` values at a time, answering like the sequential one.

    :param point_spec: value -> the RunSpec of that probe.
    :param holds: a probe's metrics -> whether the constraint holds.
    """

    def __init__(self, name: str, point_spec: Callable[[Any], RunSpec], holds: Callable[[dict], bool],
                 replicas: int, width: int, **search_args):
        self.name = name
        self.point_spec = point_spec
        self.holds = holds
        self.replicas = replicas
        self.search = SpeculativeSearch(max(1, width // replicas), **search_args)
        self.jobs: dict[Any, PointJob] = {}
        self.results: dict[Any, RunResult] = {}

    @property
    def done(self) -> bool:
        return self.search.done

    @property
    def total(self) -> int:
        probes = len(self.search.outcome.probes) if self.done else self.search.max_probes
        return probes * self.replicas

    @property
    def completed(self) -> int:
        """Simulations on the sequential path so far (what the progress bar counts)."""
        return len(self.search.path) * self.replicas

    def start(self) -> list[PointJob]:
        return self.refresh()

    def refresh(self) -> list[PointJob]:
        """New jobs for the values the search wants now; queued jobs it no longer wants are
        cancelled (running ones finish, and count if the path comes back to them)."""
        frontier = self.search.wanted()
        for value, job in list(self.jobs.items()):
            if value not in self.results and not job.started and value not in frontier:
                job.cancelled = True
                del self.jobs[value]
        new = []
        for value in frontier:
            if value not in self.jobs:
                job = PointJob(self.point_spec(value), self.replicas, self, key=value, priority=SEARCH_PRIORITY)
                self.jobs[value] = job
                new.append(job)
        return new

    def job_done(self, job: PointJob) -> list[PointJob]:
        result = job.result()
        self.results[job.key] = result
        self.search.record(job.key, self.holds(result.metrics), result)
        return self.refresh()

    @property
    def wasted(self) -> int:
        """Probes evaluated off the sequential path."""
        path = {p.value for p in self.search.outcome.probes} if self.done else set(self.search.path)
        return sum(1 for v in self.results if v not in path)

    def runs(self) -> list[RunResult]:
        """The runs of the sequential path, in probe order (speculative ones left out)."""
        return [probe.payload for probe in self.search.outcome.probes]


class StudySearchDriver(SearchDriver):
    """A ``[search]`` study: a probe passes when every one of its constraints holds."""

    def __init__(self, exp, spec, width: int):
        cfg = spec.search
        self.constraints = cfg.parsed()
        self.spec = spec
        super().__init__(spec.name, lambda value: point_spec(spec, {cfg.key: value}), self._holds,
                         spec.replicas, width,
                         low=cfg.low, high=cfg.high, maximize=cfg.maximize, integer=cfg.integer,
                         tolerance=cfg.tolerance, key=cfg.key, constraint_text=cfg.constraint_text)

    def _holds(self, metrics: dict) -> bool:
        # every one evaluated (not all()'s short cut): a metric a run lacks is an error whichever fails first
        return all([c.holds(metrics) for c in self.constraints])

    def study(self) -> Study:
        cfg = self.spec.search
        outcome = self.search.outcome
        if len(self.constraints) > 1 or outcome.status == "fails-everywhere":  # (its value: by how much)
            outcome = attrs.evolve(outcome, message=failed_message(outcome, self.constraints))
        caveats = answer_caveats(outcome, self.constraints, key=cfg.key)
        if caveats:
            outcome = attrs.evolve(outcome, message=f"{outcome.message}; {caveats}")
        return Study(self.name, "search", self.runs(), keys=(cfg.key,), search=outcome,
                     constraint=cfg.constraint_text)


def failing_constraints(constraints, metrics: dict) -> list[tuple[Constraint, float]]:
    """The constraints that do not hold on ``metrics``, in order, each with the metric's value
    (NaN when it has none)."""
    return [(c, c.value(metrics)) for c in constraints if not c.holds(metrics)]


def failed_text(failed: list[tuple[Constraint, float]]) -> str:
    """``tpot_ms.p99 = 51.2`` (several joined by ``, ``; a metric without a value: ``has no value``)."""
    return ", ".join(f"{c.metric} has no value" if math.isnan(value) else f"{c.metric} = {value:g}"
                     for c, value in failed)


def failed_message(outcome, constraints) -> str:
    """The search's sentence, saying which constraints fail at its failing value: ``largest
    workload.rate with A and B: 6.25 (6.5 fails: tpot_ms.p99 = 51.2)``, ``A and B fails even at
    workload.rate = 1: ttft_ms.p99 = 812``; unchanged when nothing failed (holds everywhere)."""
    message = outcome.message
    probe = next((p for p in outcome.probes if p.value == outcome.failing), None)
    if outcome.failing is None or probe is None or probe.payload is None:
        return message
    failed = failing_constraints(constraints, probe.payload.metrics)
    if not failed:
        return message
    if outcome.status == "found" and message.endswith(" fails)"):
        return f"{message[:-1]}: {failed_text(failed)})"
    return f"{message}: {failed_text(failed)}"
