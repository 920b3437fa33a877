"""Is a run stable? The trend of its waiting queue, and offered load against measured capacity.

An overloaded server's queue grows without bound, so its latency percentiles measure how long
the run lasted, not the server. Every run's metrics carry a ``stability`` entry computed from
the per-request columns (so it needs no timeline, and covers every instance):

* **The waiting queue** ``W(t)``: requests that have arrived and not yet been scheduled for
  the first time (a request rejected at arrival never waits). It is exact -- a step function
  of the arrival and first-scheduled times -- and, with several instances, summed over them.
* **Its trend**: the Theil-Sen slope (the median of the slopes between every pair of points)
  of ``W`` sampled at 200 evenly spaced times over the *arrival window*, from the first to the
  last arrival; after the last arrival every queue drains. A median of pairwise slopes ignores
  a burst that fills less than about a quarter of the window, which a least-squares slope
  would follow. ``growth_share`` = slope / arrival rate is the share of arrivals that pile up:
  ``1 - 1/rho`` for an M/M/1 queue at load ``rho > 1``, 0 below.
* **Offered load** = arrival rate (``(n - 1) / window``) / **capacity**, the completions per
  second while the server was full -- between two completions throughout which some request
  waited although the scheduler had just refilled what it could (a request that only waits
  for the next iteration to start does not count). ``saturated_share`` is the share of the
  run the server was full. A server that keeps up serves what arrives and shows no capacity
  of its own, so capacity and load are given only for runs whose queue grows (and for
  backlogs that arrive at once: the rate they drain at).

Verdicts:

* ``stable``: the queue does not grow (``growth_share < 0.05``), or it grew while arrivals
  stayed below the measured capacity (load < 1: a transient, not an overload);
* ``unstable``: it grows by at least 5% of the arrivals (for M/M/1, ``rho >= 1.05``) and, over
  the window, by at least ``max(10, 2 sqrt(n))`` requests -- beyond the random walk of a queue
  at exactly its capacity, whose spread over ``n`` arrivals is about ``sqrt(2n)``;
* ``inconclusive``: it grows by 5% of the arrivals but not beyond that noise -- a run too
  short to tell (the lab's 100 requests at 20/s, load 1.27);
* ``n/a``: fewer than 20 requests, or all of them at once (a backlog, with no arrival rate).

With several instances each gets its own verdict (``per_instance.<k>.stability``) and the run
is unstable when the cluster's queue or any instance's is (``unstable_instances``).

Limits. The queue that decides is the one waiting for admission. A continuous-batching server
with room for many sequences (vLLM's 256) can take an overload into its running batch: every
request is admitted at once and each iteration gets slower, so nothing waits until the batch
is full. ``in_system_slope_per_min`` -- the trend of the requests arrived and not finished --
shows that growth, but it does not decide, as it also rises while a run fills its batch (the
lab's 100 requests at 10/s, each running for up to 8 s of a 12 s window). And the load is an
average over the run: a load that rises during the run can stay below capacity on average.

How reliable it is, on simulated M/M/1 queues (``python benchmarks/stability.py``, 200 seeds
per cell; ``tests/test_stability.py`` checks the first claim): with 1,000 arrivals no run at
load 0.8 or 0.9 is flagged unstable and 98% at 1.2 are. Close to capacity a finite run cannot
tell: at 1.05, 40% of 1,000-arrival runs are flagged (12% inconclusive), at 0.95 4%. Short
runs and bursty arrivals blur it: with 100 arrivals, load 0.9 is flagged in 4% of Poisson
runs (22% inconclusive) and 18% of runs with gamma gaps of cv 3, and load 1.2 in 48% -- in
such a run the queue did grow, and its percentiles depend on when the run stopped.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MIN_REQUESTS = 20           # fewer arrivals: undetermined
GRID_POINTS = 200           # samples of the waiting count over the arrival window
MIN_GROWTH_SHARE = 0.05     # the queue must absorb at least this share of the arrivals
MIN_GROWTH = 10.0           # and grow by at least this many requests over the window,
NOISE_SIGMAS = 2.0          # and by this many times sqrt(n) (the drift of a critically loaded queue)
MIN_COMPLETIONS = 10        # completions while requests waited, to measure the capacity
MS_PER_MIN = 60_000.0


def admission_times(req: dict[str, np.ndarray]) -> np.ndarray:
    """When each request left the waiting queue: first scheduled, its arrival if rejected on
    arrival, or when it was aborted or turned away from the queue before it was scheduled."""
    scheduled = req["first_scheduled_ms"]
    finish = req["finish_ms"]
    left = np.where(finish >= 0, finish, req["arrival_ms"])  # (a rejection on arrival has none)
    return np.where(scheduled >= 0, scheduled, left)


def waiting_at(arrival_sorted: np.ndarray, admitted_sorted: np.ndarray, t: np.ndarray, *,
               before: bool = False) -> np.ndarray:
    """The waiting count at times ``t`` (just before them with ``before``), from sorted times."""
    side = "left" if before else "right"
    return np.searchsorted(arrival_sorted, t, side) - np.searchsorted(admitted_sorted, t, side)


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(slope, intercept)``: the median pairwise slope, and the median of ``y - slope x``."""
    i, j = np.triu_indices(x.size, 1)
    slope = float(np.median((y[j] - y[i]) / (x[j] - x[i])))
    return slope, float(np.median(y - slope * x))


def _saturation(arrival: np.ndarray, admitted: np.ndarray, finish: np.ndarray) -> tuple[float | None, float]:
    """``(capacity_rps, saturated_share)``: completions per second while the server was full,
    and the share of the run (first arrival to last finish) it was full.

    "Full" is a gap between two consecutive completions throughout which some request waited:
    the queue was not empty right after the first completion -- when the scheduler had
    refilled what it could -- nor at any moment until the next. A request that merely waits for
    the next iteration to start does not count: the queue was empty when that iteration was
    planned. The capacity is None with fewer than ``MIN_COMPLETIONS`` such completions.
    """
    if finish.size < 2:
        return None, 0.0
    times = np.concatenate((arrival, admitted))
    steps = np.concatenate((np.ones(arrival.size, dtype=np.int64), -np.ones(admitted.size, dtype=np.int64)))
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(steps[order])
    last = np.r_[times[1:] != times[:-1], True]      # the level after all events at each time
    times, level = times[last], level[last]
    empty = times[level == 0]
    f = np.sort(finish)
    a, b = f[:-1], f[1:]
    after = np.searchsorted(times, a, "right") - 1    # the last event at or before a
    queued = (after >= 0) & (level[np.maximum(after, 0)] > 0)
    emptied = np.searchsorted(empty, b, "left") > np.searchsorted(empty, a, "right")
    full = queued & ~emptied   # gaps of length 0 (several finishing together) count as completions
    full_ms = float((b - a)[full].sum())
    run_ms = float(f[-1]) - float(arrival.min())
    share = full_ms / run_ms if run_ms > 0 else 0.0
    if int(full.sum()) < MIN_COMPLETIONS or full_ms <= 0:
        return None, share
    return float(full.sum()) / full_ms * 1e3, share


def queue_stability(arrival_ms: np.ndarray, admitted_ms: np.ndarray, finish_ms: np.ndarray,
                    departed_ms: np.ndarray | None = None, scale: float = 1.0) -> dict[str, Any]:
    """The verdict and its numbers for one queue (see the module doc).

    :param arrival_ms: every request's arrival.
    :param admitted_ms: when each left the waiting queue (see :func:`admission_times`).
    :param finish_ms: finish times of the finished requests.
    :param departed_ms: when each left the system (finished, or rejected at arrival), for the
        informative ``in_system_slope_per_min``; None to leave it out.
    :param scale: requests each row stands for (a streamed run's uniform sample: the run's requests
        over the sample's): the counts and rates are reported at the run's scale; the verdict is the
        sample's, whose growth and noise both scale alike (a sample's count is the noisier).
    """
    out = _queue_stability(arrival_ms, admitted_ms, finish_ms, departed_ms)
    if scale == 1.0:
        return out
    return _scaled(out, scale)


def _scaled(out: dict[str, Any], scale: float) -> dict[str, Any]:
    """``out`` (of a uniform sample) with its counts and rates at the run's scale, its reason
    rewritten with them (metrics review s79: a 15 req/s run read 'arrivals 7.5/s')."""
    out = dict(out, requests=int(round(out["requests"] * scale)))
    for key in ("arrival_rps", "capacity_rps", "waiting_slope_per_min", "growth", "noise", "in_system_slope_per_min"):
        if out.get(key) is not None:
            out[key] = out[key] * scale
    if out.get("fit"):
        out["fit"] = dict(out["fit"], waiting_at_start=out["fit"]["waiting_at_start"] * scale,
                          waiting_at_end=out["fit"]["waiting_at_end"] * scale)
    verdict, reason = out["verdict"], out["reason"]
    per_min = _per_min(out["waiting_slope_per_min"]) if out.get("waiting_slope_per_min") is not None else None
    if verdict == "unstable" and reason.startswith("waiting grows"):
        out["reason"] = f"waiting grows {per_min} requests/min"
    elif verdict == "inconclusive" and reason.startswith("waiting grows"):
        out["reason"] = (f"waiting grows {per_min} requests/min, but only by {out['growth']:.0f} over the run "
                         f"(noise {out['noise']:.0f}): too short to tell")
    elif verdict == "stable" and reason.startswith("waiting grew"):
        out["reason"] = (f"waiting grew {per_min} requests/min, but arrivals stay below capacity "
                         f"(load {out['load']:.2f})")
    return out


def _queue_stability(arrival_ms: np.ndarray, admitted_ms: np.ndarray, finish_ms: np.ndarray,
                     departed_ms: np.ndarray | None) -> dict[str, Any]:
    """:func:`queue_stability` of every request's row."""
    arrival = np.asarray(arrival_ms, dtype=float)
    admitted = np.asarray(admitted_ms, dtype=float)
    finish = np.asarray(finish_ms, dtype=float)
    n = int(arrival.size)
    out: dict[str, Any] = {"verdict": "n/a", "reason": "", "requests": n, "arrival_rps": None,
                           "capacity_rps": None, "load": None, "saturated_share": None,
                           "waiting_slope_per_min": None, "growth_share": None, "growth": None, "noise": None,
                           "in_system_slope_per_min": None, "window_ms": 0.0, "fit": None}
    if n < MIN_REQUESTS:
        out["reason"] = f"too few requests to tell ({n} < {MIN_REQUESTS})"
        return out
    start, end = float(arrival.min()), float(arrival.max())
    window = end - start
    out["window_ms"] = window
    capacity, out["saturated_share"] = _saturation(arrival, admitted, finish)
    if window <= 0:
        out["capacity_rps"] = capacity  # the rate the backlog drained at
        out["reason"] = f"all {n} requests arrive at once: a backlog to drain, no arrival rate"
        return out
    rate_per_ms = (n - 1) / window
    out["arrival_rps"] = rate_per_ms * 1e3
    grid = start + (np.arange(GRID_POINTS) + 0.5) * (window / GRID_POINTS)
    waiting = waiting_at(np.sort(arrival), np.sort(admitted), grid).astype(float)
    slope, intercept = theil_sen(grid - start, waiting)
    growth = slope * window
    share = slope / rate_per_ms
    if departed_ms is not None:
        in_system = waiting_at(np.sort(arrival), np.sort(np.asarray(departed_ms, dtype=float)), grid).astype(float)
        out["in_system_slope_per_min"] = theil_sen(grid - start, in_system)[0] * MS_PER_MIN
    needed = max(MIN_GROWTH, NOISE_SIGMAS * math.sqrt(n))
    out.update(waiting_slope_per_min=slope * MS_PER_MIN, growth_share=share, growth=growth, noise=needed,
               fit={"start_ms": start, "end_ms": end, "waiting_at_start": intercept,
                    "waiting_at_end": intercept + growth})
    if share < MIN_GROWTH_SHARE:
        # a server that keeps up serves what arrives: its capacity is not observed
        out["verdict"] = "stable"
        out["reason"] = f"waiting does not grow ({share:.1%} of arrivals accumulate)"
        return out
    out["capacity_rps"] = capacity
    load = out["load"] = out["arrival_rps"] / capacity if capacity is not None else None
    per_min = _per_min(out["waiting_slope_per_min"])
    if load is not None and load < 1.0:
        out["verdict"] = "stable"
        out["reason"] = f"waiting grew {per_min} requests/min, but arrivals stay below capacity (load {load:.2f})"
    elif growth >= needed:
        out["verdict"] = "unstable"
        out["reason"] = f"waiting grows {per_min} requests/min"
    else:
        out["verdict"] = "inconclusive"
        out["reason"] = (f"waiting grows {per_min} requests/min, but only by {growth:.0f} over the run "
                         f"(noise {needed:.0f}): too short to tell")
    return out


def _per_min(value: float) -> str:
    """Two significant digits: 30,000 / 690 / 83 / 2.6; 3e+22 past a billion (a rate of 1e300 wrote
    a 300-digit number)."""
    rounded = float(f"{value:.2g}")
    if abs(rounded) >= 1e9:
        return f"{rounded:.2g}"
    return f"{rounded:,.0f}" if abs(rounded) >= 10 else f"{rounded:g}"


def run_stability(req: dict[str, np.ndarray], instances: int = 1,
                  scale: float = 1.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's stability and, with several instances, each instance's (in instance order).

    The run is ``unstable`` when its (summed) queue or any instance's is; ``unstable_instances``
    lists the instances flagged. ``scale``: requests each row stands for (a streamed run's sample).
    """
    # a capped client's backlog is a backlog: the run counts a request as waiting from when it was
    # due -- unless every request was due at once (a closed loop of clients: no arrival rate, its
    # pace the server's), judged from when they were sent as before; an instance's own queue from
    # when the request reached it (the client's wait is no instance's)
    engine = req["arrival_ms"]
    arrival = engine - (req["sent_ms"] - req["due_ms"]) if "due_ms" in req else engine
    if arrival.size and np.ptp(arrival) == 0 and np.ptp(engine) > 0:
        arrival = engine
    admitted = admission_times(req)
    served = req["rejected"] == 0       # left at finish_ms: finished or aborted
    finished = served if "aborted" not in req else served & (req["aborted"] == 0)  # completions
    departed = np.where(served, req["finish_ms"], arrival)
    run = queue_stability(arrival, admitted, req["finish_ms"][finished], departed, scale)
    parts: list[dict[str, Any]] = []
    if instances > 1:
        departed_there = np.where(served, req["finish_ms"], engine)
        for k in range(instances):
            mine = req["instance"] == k
            parts.append(queue_stability(engine[mine], admitted[mine], req["finish_ms"][mine & finished],
                                         departed_there[mine], scale))
        flagged = [k for k, part in enumerate(parts) if part["verdict"] == "unstable"]
        run["unstable_instances"] = flagged
        if flagged and run["verdict"] != "unstable":
            worst = max(flagged, key=lambda k: parts[k]["waiting_slope_per_min"])
            run["verdict"] = "unstable"
            run["reason"] = f"{parts[worst]['reason']} on instance {worst}"
    return run, parts


def stability_text(stability: Any) -> str:
    """The verdict as one phrase: ``unstable: waiting grows 35 requests/min (arrivals 12/s,
    capacity 9.6/s)``; '' for no verdict."""
    if not isinstance(stability, dict) or "verdict" not in stability:
        return ""
    text = f"{stability['verdict']}: {stability.get('reason', '')}"
    if stability["verdict"] in ("unstable", "inconclusive"):
        arrivals, capacity = _finite(stability.get("arrival_rps")), _finite(stability.get("capacity_rps"))
        if arrivals is not None:
            text += f" (arrivals {arrivals:.3g}/s" + (f", capacity {capacity:.3g}/s)" if capacity else ")")
    return text


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def is_unstable(metrics: dict) -> bool:
    """True when a run's metrics say it is overloaded."""
    stability = metrics.get("stability") if isinstance(metrics, dict) else None
    return isinstance(stability, dict) and stability.get("verdict") == "unstable"
