"""Latency summaries in bounded memory: exact count, mean and max, percentiles from a DDSketch.

A run too large to keep every request (see :mod:`schedlab.results.stream`) summarises each
latency with a :class:`Summary`: the count, sum and maximum exactly, and the percentiles from a
DDSketch (Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable quantile sketch with
relative-error guarantees", VLDB 2019; the ``ddsketch`` package, Datadog's own Python
implementation). Why DDSketch: latency percentiles are read as relative figures (a p99 TTFT of
812 ms, not "the 99th +- 0.5% rank"), and DDSketch guarantees every quantile within a relative
error of the value -- 1% here -- whatever the distribution's tail, in a few kilobytes; rank-error
sketches (KLL, t-digest) can put a heavy tail's p99 far off in value. Sketches of the same
accuracy merge exactly (bucket counts add), so partitioned runs and parallel workers combine
their summaries without losing the guarantee.

Inter-token latencies arrive as runs of equally spaced values (see
:mod:`schedlab.engine.recorder`); a run is added as pieces no wider than
:data:`RUN_PIECE` relative to their values, each at its middle value, which adds at most half
that to the error: ITL percentiles are within 1.25%.
"""

from __future__ import annotations

import math

import numpy as np
from ddsketch import DDSketch

#: The sketch's relative accuracy: every order statistic is within 1% of the exact one, so every
#: percentile (interpolated between two of them as numpy does) is too.
RELATIVE_ACCURACY = 0.01
#: Runs of inter-token latencies are added in pieces spanning at most this relative width.
RUN_PIECE = 0.005
PERCENTILES = (50, 90, 95, 99)
#: Values at or below this (ms) are kept as such by the sketch's zero bucket.
TINY = 1e-9


class Summary:
    """Count, sum, max and a DDSketch of non-negative values (latencies in ms)."""

    __slots__ = ("count", "total", "max", "sketch")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.max = -math.inf
        self.sketch = DDSketch(RELATIVE_ACCURACY)

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        if not values.size:
            return
        self.count += int(values.size)
        self.total += float(values.sum())
        self.max = max(self.max, float(values.max()))
        add = self.sketch.add
        for v in np.maximum(values, 0.0).tolist():
            add(v)

    def add_weighted(self, value: float, weight: int) -> None:
        if weight <= 0:
            return
        self.count += weight
        self.total += value * weight
        if value > self.max:
            self.max = value
        self.sketch.add(max(value, 0.0), float(weight))

    def add_runs(self, first: np.ndarray, inc: np.ndarray, count: np.ndarray, weight: np.ndarray) -> None:
        """Add runs ``first + j * inc`` (``j < count``), each value ``weight`` times."""
        first = np.asarray(first, dtype=np.float64)
        inc = np.asarray(inc, dtype=np.float64)
        count = np.asarray(count, dtype=np.int64)
        weight = np.asarray(weight, dtype=np.int64)
        if not first.size:
            return
        n = count * weight
        self.count += int(n.sum())
        self.total += float((weight * (count * first + inc * (count * (count - 1) / 2))).sum())
        self.max = max(self.max, float((first + (count - 1) * inc).max()))
        add = self.sketch.add
        flat = (inc == 0.0) | (count == 1)
        for v, w in zip(first[flat].tolist(), n[flat].tolist()):
            add(max(v, 0.0), float(w))
        for f, d, c, w in zip(first[~flat].tolist(), inc[~flat].tolist(), count[~flat].tolist(),
                              weight[~flat].tolist()):
            self._add_run(f, d, c, w)

    def _add_run(self, first: float, inc: float, count: int, weight: int) -> None:
        """One linear run in pieces of at most RUN_PIECE relative width (their middle values)."""
        j = 0
        while j < count:
            lo = first + j * inc
            width = max(lo, TINY) * RUN_PIECE
            m = min(count - j, max(1, int(width // inc) + 1))
            self.sketch.add(max(lo + (m - 1) * inc / 2.0, 0.0), float(m * weight))
            j += m

    def merge(self, other: "Summary") -> None:
        if not other.count:
            return
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)
        self.sketch.merge(other.sketch)

    def result(self) -> dict[str, float]:
        """mean, p50, p90, p95, p99 and max, like :func:`schedlab.results.metrics.summarize`."""
        nan = float("nan")
        if not self.count:
            return {"mean": nan, **{f"p{p}": nan for p in PERCENTILES}, "max": nan}
        out = {"mean": self.total / self.count}
        for p in PERCENTILES:
            out[f"p{p}"] = self.percentile(p)
        out["max"] = self.max
        return out

    def percentile(self, p: float) -> float:
        """The ``p``-th percentile as numpy's default (linear) method takes it -- between the
        order statistics at ranks floor and ceil of ``p / 100 x (count - 1)`` -- each from the
        sketch (the largest: the exact maximum). The sketch alone answers with the lower one, which
        in a small group can be far off (a p99 of two requests at the smaller; audit s57)."""
        rank = p / 100.0 * (self.count - 1)
        lo = math.floor(rank)
        low = self._order_statistic(lo)
        if rank == lo:
            return low
        return low + (rank - lo) * (self._order_statistic(lo + 1) - low)

    def _order_statistic(self, k: int) -> float:
        """The ``k``-th smallest value (from 0), within the sketch's relative accuracy."""
        if k >= self.count - 1:
            return self.max
        # the rank k + 1/2 falls inside the k-th value's bucket, whatever the rounding
        return min(float(self.sketch.get_quantile_value((k + 0.5) / (self.count - 1))), self.max)
