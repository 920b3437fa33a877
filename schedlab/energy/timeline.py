"""Power over time, redrawn from a run's timeline and its energy record (fresh or saved).

Each timeline row is a stretch of iterations with its duration and its GPUs' energy: busy
power is their quotient. Between rows, and from the window's start to the first row and from
the last row to the window's end, the GPUs idle -- after an iteration its power's tail (the
meter recorded where each starts, ``tails``), standby power for ``standby_ms``, idle power
otherwise (:mod:`.idle`), as steps of exact mean power -- standby at the level the meter
recorded for the stretch where it is not the record's ``standby_w`` (``standby_at``: a
governed clock's, left where the last iteration set it); an autoscaled instance draws nothing
while it is off (``off``) and idles from its switch-on. A pipelined instance's rows carry all
its stages' energy over them, and each stage idles from its own last slice: an idle stretch
starts with the standby each stage has left (``standby_left``, :mod:`.pipeline`). The integral of this step function is
the instance's energy: :func:`integral_j` checks the meters against it (the conservation
property).
"""

from __future__ import annotations

import math

import numpy as np

from .idle import idle_steps

#: How far (ms) a tail's recorded start may lie from the end of the row before its idle
#: stretch: rows of one bulk run split in two end a rounding error away from the run's end.
TAIL_MATCH_MS = 1e-6


def power_steps(run, instance: int, until: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(edges_ms, watts)`` of one instance's GPU power: ``watts[i]`` holds from ``edges[i]``
    to ``edges[i + 1]`` (so ``edges`` is one longer). Needs ``meta["energy"]`` and a timeline.
    ``until``: carry the idleness after the last row on to there (default: the window's end)."""
    energy = run.meta["energy"]
    inst = energy["instances"][instance]
    idle_w, standby_w, standby_ms = inst["idle_w"], inst["standby_w"], inst["standby_ms"]
    tail_ms = inst.get("tail_ms", 0.0)
    tails = _Marks(inst.get("tails", []))
    levels = _Marks(inst.get("standby_at", []))  # standby W (each stage's) where not the record's
    staged = "stages" in inst  # a pipelined instance: each stage's standby left at a stretch's start
    lefts, no_standby = _Marks(inst.get("standby_left", [])), (0.0,) * len(inst.get("stages", ()))
    start, end = energy["window_ms"]
    if until is not None:
        end = until
    t = run.timeline
    mine = t["instance"] == instance
    order = np.argsort(t["time_ms"][mine], kind="stable")
    starts = t["time_ms"][mine][order]
    durations = t["duration_ms"][mine][order]
    joules = t["energy_j"][mine][order]
    offs = [(a, b) for a, b in inst.get("off", [])]
    edges, watts = [start], []
    cursor, since = start, math.inf
    next_off = 0

    def idle_until(stop: float, since: float) -> None:
        nonlocal cursor
        if stop <= cursor:
            return
        if math.isinf(since):  # not worked yet: idle throughout
            edges.append(stop)
            watts.append(idle_w)
            cursor = stop
            return
        tail = tails.at(cursor)
        tail = tail[0] if tail else 0.0
        level = levels.at(cursor)
        left = (lefts.at(cursor) or no_standby) if staged else None
        standby = level[0] if level and not staged else standby_w
        at = cursor
        for length, w in idle_steps(idle_w, standby, standby_ms, stop - cursor, tail, tail_ms, left,
                                    level if staged else None):
            at += length
            edges.append(at)
            watts.append(w)
        edges[-1] = cursor = stop

    def gap_until(stop: float) -> None:
        """Idle until ``stop``, through the instance's off stretches (0 W; idle from a switch-on)."""
        nonlocal cursor, since, next_off
        while next_off < len(offs) and offs[next_off][0] < stop:
            off, on = offs[next_off]
            idle_until(off, since)
            on = min(on, end)
            if on > cursor:
                edges.append(on)
                watts.append(0.0)
                cursor = on
            since = math.inf
            next_off += 1
        idle_until(stop, since)

    for s, d, j in zip(starts.tolist(), durations.tolist(), joules.tolist()):
        gap_until(s)
        if d > 0:
            edges.append(s + d)
            watts.append(j / d * 1e3)
            cursor, since = s + d, 0.0
    gap_until(end)
    return np.asarray(edges), np.asarray(watts)


class _Marks:
    """Entries ``[time, values...]`` a meter recorded at the starts of idle stretches, in time
    order, read as the redraw reaches those starts."""

    def __init__(self, entries: list):
        self.entries = entries
        self.next = 0

    def at(self, t: float) -> list | None:
        """The values of the entry at ``t`` (within :data:`TAIL_MATCH_MS`), or None."""
        entries = self.entries
        while self.next < len(entries) and entries[self.next][0] < t - TAIL_MATCH_MS:
            self.next += 1
        if self.next < len(entries) and abs(entries[self.next][0] - t) <= TAIL_MATCH_MS:
            self.next += 1
            return entries[self.next - 1][1:]
        return None


def integral_j(edges: np.ndarray, watts: np.ndarray) -> float:
    """The energy (J) of a step function of power."""
    return float(np.sum(np.diff(edges) * watts) * 1e-3)

