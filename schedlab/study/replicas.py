"""Replicas: one run repeated with derived seeds, its metrics as means with 95% intervals.

``replicas = K`` (in ``[experiment]`` for every run, or in a ``[[runs]]`` entry) simulates a
run K times. Replica ``i`` gets the seed ``replica_seed(seed, i)`` -- numpy's SeedSequence
spawned from the run's seed -- so it does not depend on K (raising K adds replicas), and two
runs with the same seed get the same K seeds: their replicas see the same random draws
(common random numbers), and their difference can be measured replica by replica.

Every numeric metric of the combined run is the mean over replicas, with a 95% confidence
interval from Student's t (``mean +- t(0.975, K-1) * s / sqrt(K)``); a paired difference
between two runs is the same interval over the K per-replica differences, and is *within
noise* when that interval contains 0.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import attrs
import numpy as np

from ..results.records import RunResult

REPLICA_MARK = "#"
# Student's t quantile t(0.975, df) for df = 1..30 (two-sided 95%).
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
_Z975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """t(0.975, df): a table up to 30 degrees of freedom, Cornish-Fisher beyond (error < 1e-5)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def replica_seed(seed: int, index: int) -> int:
    """The seed of replica ``index`` (0-based) of a run seeded ``seed``; independent of K."""
    sequence = np.random.SeedSequence(seed % 2**64, spawn_key=(index,))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def replica_name(name: str, index: int) -> str:
    """``queue[rate=5]`` -> ``queue[rate=5]#2`` for replica index 1."""
    return f"{name}{REPLICA_MARK}{index + 1}"


@attrs.frozen
class Interval:
    """A sample's mean and its 95% confidence interval (NaN bounds with fewer than 2 values)."""

    mean: float
    low: float
    high: float
    count: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def within_noise(self) -> bool:
        """For a difference: the interval contains 0 (or cannot be computed)."""
        return not (math.isfinite(self.low) and math.isfinite(self.high)) or self.contains(0.0)


def mean_interval(values: Sequence[float]) -> Interval:
    """Mean and t interval of the finite values (NaN and None are left out)."""
    sample = np.array([v for v in values if v is not None], dtype=float)
    sample = sample[np.isfinite(sample)]
    n = int(sample.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(sample.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1)
    half = t_quantile_975(n - 1) * float(sample.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _combine_metrics(samples: list, prefix: str, intervals: dict[str, list[float]]):
    """Mean of every numeric leaf (kept as is when all replicas agree); intervals by dotted name."""
    first = samples[0]
    if isinstance(first, dict):
        keys = list(first)
        for other in samples[1:]:
            keys += [k for k in other if k not in keys] if isinstance(other, dict) else []
        return {k: _combine_metrics([s.get(k) if isinstance(s, dict) else None for s in samples],
                                    f"{prefix}{k}.", intervals) for k in keys}
    if not all(v is None or _is_number(v) for v in samples) or all(v is None for v in samples):
        return first
    name = prefix[:-1]
    interval = mean_interval(samples)
    intervals[name] = [interval.low, interval.high]
    if all(v == first for v in samples):
        return first
    return interval.mean


def combine(name: str, replicas: list[RunResult], seed: int) -> RunResult:
    """One run from its replicas: mean metrics, intervals, the replicas kept for paired
    comparisons and per-request files; per-request arrays and timeline of the first replica
    (what CDF and timeline plots draw)."""
    first = replicas[0]
    intervals: dict[str, list[float]] = {}
    metrics = _combine_metrics([r.metrics for r in replicas], "", intervals)
    meta = dict(first.meta, seed=seed, replicas=len(replicas), replica_seeds=[r.meta.get("seed") for r in replicas],
                wall_ms=sum(r.meta.get("wall_ms", 0.0) for r in replicas))
    return RunResult(name, first.settings, first.requests, first.counters, first.itl, first.timeline,
                     first.rejections, meta, metrics, dict(first.point), measured=first.measured, intervals=intervals,
                     replicas=list(replicas))


def metric_number(metrics: dict, name: str) -> float:
    """A dotted metric as a float (NaN when absent or not a number)."""
    node: Any = metrics
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return math.nan
        node = node[part]
    return float(node) if _is_number(node) else math.nan


def paired(a: RunResult, b: RunResult) -> bool:
    """True when ``a`` and ``b`` have replicas drawn from the same seeds (common random numbers)."""
    return bool(a.replicas) and len(a.replicas) == len(b.replicas) and \
        a.meta.get("replica_seeds") == b.meta.get("replica_seeds")


def paired_difference(base: RunResult, other: RunResult, metric: str) -> Interval | None:
    """``other - base`` replica by replica, as a mean and 95% interval; None when not paired."""
    if not paired(base, other):
        return None
    diffs = [metric_number(o.metrics, metric) - metric_number(b.metrics, metric)
             for b, o in zip(base.replicas, other.replicas)]
    return mean_interval(diffs)
