"""Power over time, redrawn from a run's timeline and its energy record (fresh or saved).

Each timeline row is a stretch of iterations with its duration and its GPUs' energy: busy
power is their quotient. Between rows, and from the window's start to the first row and from
the last row to the window's end, the GPUs idle -- standby power for ``standby_ms`` after an
iteration, idle power otherwise (:mod:`.idle`). The integral of this step function is the
instance's energy: :func:`integral_j` checks the meters against it (the conservation property).
"""

from __future__ import annotations

import math

import numpy as np


def power_steps(run, instance: int) -> tuple[np.ndarray, np.ndarray]:
    """``(edges_ms, watts)`` of one instance's GPU power: ``watts[i]`` holds from ``edges[i]``
    to ``edges[i + 1]`` (so ``edges`` is one longer). Needs ``meta["energy"]`` and a timeline."""
    energy = run.meta["energy"]
    inst = energy["instances"][instance]
    idle_w, standby_w, standby_ms = inst["idle_w"], inst["standby_w"], inst["standby_ms"]
    start, end = energy["window_ms"]
    t = run.timeline
    mine = t["instance"] == instance
    order = np.argsort(t["time_ms"][mine], kind="stable")
    starts = t["time_ms"][mine][order]
    durations = t["duration_ms"][mine][order]
    joules = t["energy_j"][mine][order]
    edges, watts = [start], []
    cursor, since = start, math.inf

    def idle_until(stop: float, since: float) -> None:
        nonlocal cursor
        if stop <= cursor:
            return
        if since < standby_ms:
            mid = min(stop, cursor + standby_ms - since)
            edges.append(mid)
            watts.append(standby_w)
            cursor = mid
        if stop > cursor:
            edges.append(stop)
            watts.append(idle_w)
            cursor = stop

    for s, d, j in zip(starts.tolist(), durations.tolist(), joules.tolist()):
        idle_until(s, since)
        if d > 0:
            edges.append(s + d)
            watts.append(j / d * 1e3)
            cursor, since = s + d, 0.0
    idle_until(end, since)
    return np.asarray(edges), np.asarray(watts)


def integral_j(edges: np.ndarray, watts: np.ndarray) -> float:
    """The energy (J) of a step function of power."""
    return float(np.sum(np.diff(edges) * watts) * 1e-3)

