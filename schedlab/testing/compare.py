"""Comparing two runs of the same requests: the differential check between engines, and of a run with itself."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..results.records import RunResult


def compare_runs(a: RunResult, b: RunResult, *, rel: float = 1e-9) -> None:
    """Assert two runs agree: per-request timestamps and counts, counters and metrics."""
    for col, x in a.requests.items():
        y = b.requests[col]
        if x.dtype == object:
            assert x.tolist() == y.tolist(), col
        elif x.dtype.kind == "f":
            assert np.allclose(x, y, rtol=rel, atol=1e-9, equal_nan=True), (
                f"{col} differs: {x.tolist()} vs {y.tolist()}")
        else:
            assert np.array_equal(x, y), f"{col} differs: {x.tolist()} vs {y.tolist()}"
    assert a.rejections == b.rejections
    _close(a.counters, b.counters, rel, "counters")
    _close(a.metrics, b.metrics, rel, "metrics")
    if a.timeline.get("time_ms", np.empty(0)).size and b.timeline.get("time_ms", np.empty(0)).size:
        _close(_timeline_totals(a), _timeline_totals(b), rel, "timeline")
        _check_row_starts(a, b, rel)


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


def _check_row_starts(a: RunResult, b: RunResult, rel: float) -> None:
    """The coarser timeline's rows start where the finer one's do (a row starts an iteration)."""
    coarse, fine = sorted((a, b), key=lambda r: r.timeline["time_ms"].size)
    for inst in np.unique(fine.timeline["instance"]).tolist():
        starts = fine.timeline["time_ms"][fine.timeline["instance"] == inst]
        mine = coarse.timeline["time_ms"][coarse.timeline["instance"] == inst]
        right = np.clip(np.searchsorted(starts, mine), 0, starts.size - 1)
        left = np.clip(right - 1, 0, starts.size - 1)
        nearest = np.where(np.abs(starts[left] - mine) < np.abs(starts[right] - mine), starts[left], starts[right])
        assert np.allclose(mine, nearest, rtol=rel, atol=1e-9), f"timeline rows of instance {inst} start apart: {mine.tolist()} vs {starts.tolist()}"


def _close(x: Any, y: Any, rel: float, path: str) -> None:
    if isinstance(x, dict):
        assert set(x) == set(y), f"{path}: keys differ"
        for k in x:
            _close(x[k], y[k], rel, f"{path}.{k}")
    elif isinstance(x, float) or isinstance(y, float):
        if math.isnan(x) or math.isnan(y):
            assert math.isnan(x) and math.isnan(y), f"{path}: {x} vs {y}"
        else:
            assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-9), f"{path}: {x} vs {y}"
    else:
        assert x == y, f"{path}: {x} vs {y}"
