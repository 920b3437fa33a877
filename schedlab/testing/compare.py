"""Comparing two runs of the same requests: the differential check between engines, and of a run with itself.

A mismatch says which run is which (``labels``), names the requests that differ with both values, and
ends with a hint at what such a difference usually means, since the columns alone do not point at
the plugin member to look at.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..results.records import RunResult

#: How many differing requests (or keys, rows) a message lists.
SHOWN = 5

#: What a disagreement usually means, after every mismatch of values.
HINT = """\
hint: between the fast and the reference engine, a difference usually means that a promise the fast engine
  takes on trust does not hold: a scheduler's stable_between_events (its plan changes only at an arrival, a
  finish or a time it gave plan.wake_at / wake_after; holding a request back until some time without wake_at
  breaks it), or a cost model's decode_step_increment (what iteration_ms adds for each further decode-only
  step: compare the two); with the times equal and only energy apart (energy_j, power), a power model's run_j
  (a decode run's energy in closed form: check_power_model compares it with its iterations'). Between two runs
  on the same engine (or if check_deterministic fails too): a plugin keeps state across instances (a class
  attribute, a module global) or draws unseeded random numbers."""


def compare_runs(a: RunResult, b: RunResult, *, rel: float = 1e-9, labels: tuple[str, str] | None = None) -> None:
    """Assert two runs agree: per-request timestamps and counts, counters and metrics (floats within
    ``rel``). ``labels`` name the runs in the message, which lists the first differing requests by
    id with both values; by default the engines the kit's runners ran them on, when those differ
    (``meta["engine"]``: ``("fast", "reference")``), else ``("a", "b")``."""
    if labels is None:
        engines = (a.meta.get("engine"), b.meta.get("engine"))
        labels = engines if None not in engines and engines[0] != engines[1] else ("a", "b")
    same_requests_agree(a, b, rel=rel, labels=labels, hint=HINT)


def same_requests_agree(a: RunResult, b: RunResult, *, rel: float, labels: tuple[str, str], hint: str) -> None:
    """:func:`compare_runs` with the ``hint`` its messages end with ("": none)."""
    la, lb = labels
    if a.requests:
        _check_requests(a.requests, b.requests, rel, la, lb, hint)
    if a.rejections != b.rejections:
        raise AssertionError(_rejections_message(a.rejections, b.rejections, la, lb) + ("\n" + hint if hint else ""))
    _close(a.counters, b.counters, rel, "counters", labels, hint)
    _close(a.metrics, b.metrics, rel, "metrics", labels, hint)
    if a.timeline.get("time_ms", np.empty(0)).size and b.timeline.get("time_ms", np.empty(0)).size:
        _close(_timeline_totals(a), _timeline_totals(b), rel, "timeline", labels, hint)
        _check_row_starts(a, b, rel, labels, hint)


def _differing(x: np.ndarray, y: np.ndarray, rel: float) -> np.ndarray:
    """The rows where two columns of the same length differ, by the rule each kind of column is
    compared with: text and objects exactly, floats within ``rel`` (and 1e-9 absolute, NaN equal to
    NaN), integers exactly."""
    if x.dtype == object:
        xs, ys = x.tolist(), y.tolist()
        return np.array([i for i, (p, q) in enumerate(zip(xs, ys)) if not (p is q or p == q)], dtype=np.int64)
    if x.dtype.kind == "f":
        return np.flatnonzero(~np.isclose(x, y, rtol=rel, atol=1e-9, equal_nan=True))
    return np.flatnonzero(x != y)


def _check_requests(ra: dict, rb: dict, rel: float, la: str, lb: str, hint: str) -> None:
    """Every column of ``ra`` against ``rb``'s, row by row (rows are in request id order); the first
    differing column in detail, the others by name."""
    ids_a, ids_b = ra.get("id"), rb.get("id")
    n_a, n_b = len(next(iter(ra.values()))), len(next(iter(rb.values()), ()))
    if n_a != n_b:
        extra = ""
        if ids_a is not None and ids_b is not None:
            only_a = sorted(set(ids_a.tolist()) - set(ids_b.tolist()))[:SHOWN]
            only_b = sorted(set(ids_b.tolist()) - set(ids_a.tolist()))[:SHOWN]
            extra = f" (only in {la}: requests {only_a}; only in {lb}: requests {only_b})"
        raise AssertionError(f"{la} has {n_a} requests, {lb} has {n_b}{extra}")
    first, others = None, []
    for col, x in ra.items():
        y = rb[col]
        rows = _differing(x, y, rel)
        if not rows.size:
            continue
        if first is None:
            first = (col, x, y, rows)
        else:
            others.append(f"{col} ({rows.size} requests)" if rows.size > 1 else f"{col} (1 request)")
    if first is None:
        return
    col, x, y, rows = first
    lines = [f"{col} differs for {rows.size} of {n_a} requests ({la} vs {lb}):"]
    for i in rows[:SHOWN].tolist():
        lines.append(f"  {_row_name(i, ids_a, ids_b, la, lb)}: {la} {_value(x[i])}, {lb} {_value(y[i])}")
    if rows.size > SHOWN:
        lines.append(f"  ... and {rows.size - SHOWN} more")
    if others:
        lines.append("also differ: " + ", ".join(others))
    if hint:
        lines.append(hint)
    raise AssertionError("\n".join(lines))


def _row_name(i: int, ids_a, ids_b, la: str, lb: str) -> str:
    """``request <id>``, or the row and both ids when the runs disagree on the row's request."""
    if ids_a is None or ids_b is None:
        return f"row {i}"
    p, q = int(ids_a[i]), int(ids_b[i])
    return f"request {p}" if p == q else f"row {i} (request {p} in {la}, {q} in {lb})"


def _value(v: Any) -> str:
    return repr(v.item() if isinstance(v, np.generic) else v)


def _rejections_message(ra: dict, rb: dict, la: str, lb: str) -> str:
    missing = object()
    ids = set(ra) | set(rb)
    try:
        ids = sorted(ids)
    except TypeError:
        ids = sorted(ids, key=str)
    bad = [i for i in ids if ra.get(i, missing) != rb.get(i, missing)]
    lines = [f"rejections differ for {len(bad)} requests ({la} vs {lb}):"]
    for i in bad[:SHOWN]:
        lines.append(f"  request {i}: {la} {_rejection(ra, i)}, {lb} {_rejection(rb, i)}")
    if len(bad) > SHOWN:
        lines.append(f"  ... and {len(bad) - SHOWN} more")
    return "\n".join(lines)


def _rejection(rejections: dict, i) -> str:
    return f"rejected ({rejections[i]!r})" if i in rejections else "not rejected"


def _timeline_totals(run: RunResult) -> dict:
    """Per instance: iterations, busy time and the work of the timeline's rows, summed (the fast
    engine keeps a run of decode iterations in one or two rows, the reference engine one each)."""
    t = run.timeline
    k = t["iterations"]
    out = {}
    for inst in np.unique(t["instance"]).tolist():
        mine = t["instance"] == inst
        out[int(inst)] = {"iterations": float(k[mine].sum()), "busy_ms": float(t["duration_ms"][mine].sum()),
                          **{c: float((k * t[c])[mine].sum()) for c in ("decodes", "prefills", "prefill_tokens")}}
    return out


def _check_row_starts(a: RunResult, b: RunResult, rel: float, labels: tuple[str, str], hint: str) -> None:
    """The coarser timeline's rows start where the finer one's do (a row starts an iteration)."""
    (coarse, lc), (fine, lf) = sorted(zip((a, b), labels), key=lambda r: r[0].timeline["time_ms"].size)
    for inst in np.unique(fine.timeline["instance"]).tolist():
        starts = fine.timeline["time_ms"][fine.timeline["instance"] == inst]
        mine = coarse.timeline["time_ms"][coarse.timeline["instance"] == inst]
        right = np.clip(np.searchsorted(starts, mine), 0, starts.size - 1)
        left = np.clip(right - 1, 0, starts.size - 1)
        nearest = np.where(np.abs(starts[left] - mine) < np.abs(starts[right] - mine), starts[left], starts[right])
        apart = np.flatnonzero(~np.isclose(mine, nearest, rtol=rel, atol=1e-9))
        assert not apart.size, (
            f"timeline rows of instance {int(inst)} start apart: {apart.size} of {lc}'s {mine.size} rows start at no "
            f"iteration of {lf}'s; first at t = {mine[apart[:SHOWN]].tolist()} ms, {lf}'s nearest at "
            f"{nearest[apart[:SHOWN]].tolist()} ms" + (f"\n{hint}" if hint else ""))


def _close(x: Any, y: Any, rel: float, path: str, labels: tuple[str, str] = ("a", "b"), hint: str = "") -> None:
    la, lb = labels
    end = f"\n{hint}" if hint else ""
    if isinstance(x, dict):
        if set(x) != set(y):
            only_a, only_b = sorted(set(x) - set(y), key=str), sorted(set(y) - set(x), key=str)
            raise AssertionError(f"{path}: keys differ: only in {la}: {only_a[:SHOWN]}, only in {lb}: {only_b[:SHOWN]}")
        for k in x:
            _close(x[k], y[k], rel, f"{path}.{k}", labels, hint)
    elif isinstance(x, float) or isinstance(y, float):
        if math.isnan(x) or math.isnan(y):
            assert math.isnan(x) and math.isnan(y), f"{path} differs: {la} {x!r}, {lb} {y!r}{end}"
        else:
            assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-9), f"{path} differs: {la} {x!r}, {lb} {y!r}{end}"
    else:
        assert x == y, f"{path} differs: {la} {x!r}, {lb} {y!r}{end}"
