"""Results of runs and experiments: arrays for analysis, metrics for reports, files for later.

A :class:`RunResult` holds one run's per-request columns (numpy arrays, ordered by request
id), counters, inter-token-latency runs, timeline and computed metrics. An
:class:`ExperimentResults` groups runs into *studies*: a single run, the points of a sweep,
or the probes of an SLO search.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from ..engine.recorder import REQUEST_FLOAT_COLUMNS, REQUEST_INT_COLUMNS, REQUEST_TEXT_COLUMNS, Recorder
from .metrics import compute_metrics, compute_streamed_metrics


@attrs.define(eq=False)
class RunResult:
    """One simulated run."""

    name: str
    settings: dict[str, Any]
    requests: dict[str, np.ndarray]
    counters: dict[str, float]
    itl: dict[str, np.ndarray]
    timeline: dict[str, np.ndarray]
    rejections: dict[int, str]
    meta: dict[str, Any]
    metrics: dict[str, Any]
    point: dict[str, Any] = attrs.field(factory=dict)
    #: what the replayed real run measured (a workload's ``measured``), or None
    measured: Any = None
    #: the real run's summary it is compared with (``[target]``, :class:`schedlab.targets.Summary`), or None
    target: Any = None
    # With replicas (schedlab.study.replicas): metrics are means over ``replicas``, and
    # ``intervals`` maps dotted metric names to their 95% confidence interval [low, high].
    intervals: dict[str, list[float]] = attrs.field(factory=dict)
    replicas: list["RunResult"] = attrs.field(factory=list)
    #: A run past ``exact_requests`` (see :mod:`schedlab.results.stream`): the file holding every
    #: request's row; ``requests`` is then a sample of them, and ``stream`` what the metrics came from.
    rows_file: str | None = None
    stream: Any = None

    def all_requests(self) -> dict[str, np.ndarray]:
        """Every request's row, ordered by request id: ``requests`` itself, or a streamed run's
        whole file read back (what comparisons with a real run need: the sample is not the run).
        The run's ``reason`` text column is dropped, as ``requests`` has none."""
        if self.rows_file is None:
            return self.requests
        from .stream import read_rows

        rows = read_rows(self.rows_file)
        rows.pop("reason", None)
        order = np.argsort(rows["id"], kind="stable")
        return {k: v[order] for k, v in rows.items()}

    @classmethod
    def from_recorder(cls, name: str, rec: Recorder, *, settings: dict, meta: dict, request_cost=None,
                      point: dict | None = None) -> "RunResult":
        rec.finish()
        if rec.streaming:
            return cls.from_stream(name, rec.sink, rec.counters, {k: np.frombuffer(v, dtype=np.float64)
                                                                   for k, v in rec.timeline.items()},
                                   settings=settings, meta=meta, point=point)
        cols = rec.columns()
        order = np.argsort(cols["id"], kind="stable")
        requests = {}
        for column in REQUEST_FLOAT_COLUMNS + REQUEST_INT_COLUMNS + REQUEST_TEXT_COLUMNS:
            cols[column] = requests[column] = cols[column][order]  # the unsorted column is freed at once
        # the recorder's buffers are read in place (a finished run never appends to them)
        itl = {
            "first": np.frombuffer(rec.itl_first, dtype=np.float64),
            "inc": np.frombuffer(rec.itl_inc, dtype=np.float64),
            "count": np.frombuffer(rec.itl_count, dtype=np.int64),
            "weight": np.frombuffer(rec.itl_weight, dtype=np.int64),
        }
        timeline = {k: np.frombuffer(v, dtype=np.float64) for k, v in rec.timeline.items()}
        meta = dict(meta, rejections=dict(rec.rejections))
        counters = dict(rec.counters)
        metrics = compute_metrics(requests, counters, itl, meta, request_cost)
        return cls(name, settings, requests, counters, itl, timeline, dict(rec.rejections), meta, metrics,
                   dict(point or {}))


    @classmethod
    def from_stream(cls, name: str, sink, counters: dict, timeline: dict, *, settings: dict, meta: dict,
                    point: dict | None = None) -> "RunResult":
        """A streamed run: metrics from the sink's accumulators, its sample as ``requests``."""
        stats = sink.stats
        counters = dict(counters)
        meta = dict(meta, rejections={}, requests_sampled=int(stats.sample["id"].size) if stats.sample else 0)
        metrics = compute_streamed_metrics(stats, counters, sink.itl, meta)
        requests = stats.sample_columns() if stats.sample is not None else {}
        empty = np.empty(0)
        itl = {"first": empty, "inc": empty, "count": empty.astype(np.int64), "weight": empty.astype(np.int64)}
        return cls(name, settings, requests, counters, itl, timeline, dict(stats.sample_reasons), meta, metrics,
                   dict(point or {}), rows_file=str(sink.path) if sink.path is not None else None, stream=sink)


@attrs.define(eq=False)
class Study:
    """What one ``[[runs]]`` entry produced: a run, a sweep's points, or a search's probes."""

    name: str
    kind: str  # "run" | "sweep" | "search"
    runs: list[RunResult]
    keys: tuple[str, ...] = ()          # swept or searched keys
    search: Any = None                  # schedlab.study.search.SearchOutcome for searches
    constraint: str = ""
    plan: Any = None                    # schedlab.study.planner.PlanOutcome for capacity plans


@attrs.define(eq=False)
class ExperimentResults:
    """Everything an experiment produced, in file order."""

    name: str
    source: str
    studies: list[Study]
    settings: dict[str, Any]
    execution: dict[str, Any] = attrs.field(factory=dict)  # where it ran and how long it took

    def study(self, name: str) -> Study:
        for s in self.studies:
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.studies)
        raise KeyError(f"no study named {name!r}; the experiment has: {known}")

    def all_runs(self) -> list[RunResult]:
        return [r for s in self.studies for r in s.runs]

    def simulated_runs(self) -> list[RunResult]:
        """Every simulation: each replica of a replicated run, else the run itself."""
        return [leaf for r in self.all_runs() for leaf in (r.replicas or [r])]
