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

from ..results.metrics import metric_at
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


#: Tables whose keys are data, not names: an hour, a rejection reason, a request class, a
#: client, an instance. A replica lacks a key there when nothing of that entry happened in it
#: (no request arrived in the hour and no GPU was paid for, no request was turned away for the
#: reason, the class or client sent none): the entry is *absent* in that replica.
KEYED_TABLES = frozenset({"hourly", "rejection_reasons", "per_class", "per_client", "per_instance"})
#: Tables whose every entry is a count (reason -> requests turned away for it).
COUNT_TABLES = frozenset({"rejection_reasons"})
#: Leaves that add up over an entry's requests or time -- counts, totals, and rates of them over
#: the whole run -- and so are 0 in a replica where the entry is absent.
ADDITIVE = frozenset({"requests", "finished", "rejected", "timed_out", "aborted", "generated_tokens", "prompt_tokens",
                      "gpu_hours", "met", "goodput_rps", "throughput_tps", "service", "service_rate", "j"})


class _Absent:
    """An entry of a keyed table a replica lacks (see :data:`KEYED_TABLES`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


def _combine_metrics(samples: list, prefix: str, intervals: dict[str, list[float]], *, keyed: bool = False,
                     counts: bool = False):
    """Mean of every numeric leaf over the replicas (kept as is when all agree); each leaf's 95%
    interval in ``intervals``, by dotted name. The replicas' keys are merged, and a key some
    replicas lack is read by what its absence means:

    * an entry of a keyed table (:data:`KEYED_TABLES`: hours, rejection reasons, classes,
      clients, instances) that a replica lacks did not occur in it: its counts and totals
      (:data:`ADDITIVE` -- requests, GPU-hours, tokens, met, throughputs -- and every entry of a
      table of counts, :data:`COUNT_TABLES`) are 0 there, so a draining hour only some replicas
      have averages its requests and GPU-hours over every replica; its statistics (percentiles,
      means, maxima, attainment) describe requests it had none of, so that replica has no value
      and is left out of their mean and interval, as a NaN is;
    * any other key a replica lacks (a table it did not compute: ``hourly`` of a run under two
      hours) has no value there, and is left out likewise.

    ``keyed``: ``samples`` are a keyed table's; ``counts``: a table of counts' (its entries, or
    ``ABSENT``, or None)."""
    present = [s for s in samples if s is not None and s is not ABSENT]
    if any(isinstance(s, dict) for s in present):
        keys = list(dict.fromkeys(k for s in present if isinstance(s, dict) for k in s))
        missing = ABSENT if keyed else None
        out = {}
        for k in keys:
            column = [s.get(k, missing) if isinstance(s, dict) else ABSENT if s is ABSENT else None for s in samples]
            out[k] = _combine_metrics(column, f"{prefix}{k}.", intervals, keyed=k in KEYED_TABLES,
                                      counts=counts or k in COUNT_TABLES)
        return out
    name = prefix[:-1]
    zero = counts or name.rsplit(".", 1)[-1] in ADDITIVE
    values = [(0 if zero else None) if v is ABSENT else v for v in samples]
    first = next((v for v in values if v is not None), None)
    if first is None or not all(v is None or _is_number(v) for v in values):
        return first
    interval = mean_interval(values)
    intervals[name] = [interval.low, interval.high]
    if all(v == first for v in values):
        return first
    return interval.mean


def combine(name: str, replicas: list[RunResult], seed: int) -> RunResult:
    """One run from its replicas: mean metrics, intervals, the replicas kept for paired
    comparisons and per-request files; per-request arrays and timeline of the first replica
    (what CDF and timeline plots draw)."""
    first = replicas[0]
    intervals: dict[str, list[float]] = {}
    metrics = _combine_metrics([r.metrics for r in replicas], "", intervals)
    if isinstance(metrics.get("stability"), dict):
        metrics["stability"] = combined_stability([r.metrics.get("stability") for r in replicas],
                                                  metrics["stability"])
    meta = dict(first.meta, seed=seed, replicas=len(replicas), replica_seeds=[r.meta.get("seed") for r in replicas],
                wall_ms=sum(r.meta.get("wall_ms", 0.0) for r in replicas))
    return RunResult(name, first.settings, first.requests, first.counters, first.itl, first.timeline,
                     first.rejections, meta, metrics, dict(first.point), measured=first.measured, intervals=intervals,
                     replicas=list(replicas))


def combined_stability(verdicts: list, mean: dict) -> dict:
    """A replicated run's stability: ``mean`` (the replicas' numbers averaged) with a verdict of
    them all -- ``unstable`` when any replica is (a load some draws overload is not safe),
    else ``inconclusive`` when any is, else the replicas' common verdict -- and a reason saying
    how many replicas had it, quoting the first such replica's own."""
    given = [v for v in verdicts if isinstance(v, dict) and "verdict" in v]
    if not given:
        return mean
    names = [v["verdict"] for v in given]
    verdict = next((name for name in ("unstable", "inconclusive") if name in names), names[0])
    witness = given[names.index(verdict)]
    count = names.count(verdict)
    said = f"all {len(given)} replicas" if count == len(given) else f"{count} of {len(given)} replicas"
    reason = witness.get("reason", "")
    return {**mean, "verdict": verdict,
            "reason": f"{said} {verdict}" + (f"; replica {names.index(verdict) + 1}: {reason}" if reason else "")}


def metric_number(metrics: dict, name: str) -> float:
    """A dotted metric as a float (NaN when absent or not a number)."""
    node: Any = metric_at(metrics, name, math.nan) if isinstance(metrics, dict) else math.nan
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
