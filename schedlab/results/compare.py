"""Simulated against measured: the statistics a real run is judged by, and their errors.

A workload that replays a measured run (``vllm_log``, ``vllm_bench``) keeps what the run
measured (``workload.measured``: per-request TTFT, TPOT, latency). Each simulated run of such
a workload is compared on 15 statistics -- TTFT, TPOT and latency x mean, median, p90, p95,
p99 (numpy's linear percentiles, as ``vllm bench serve`` and LLMServingSim's validation
report them) -- and gets ``metrics["vs_measured"]``::

    {"mean_abs_error_pct": 2.1, "errors_pct": {"ttft_ms.mean": -4.0, ...},
     "measured": {"ttft_ms.mean": 7097.2, ...}}

Errors are ``(simulated - measured) / measured`` in percent; the mean absolute error is the
mean of their absolute values.

Like is compared with like: a server log's latencies (from the request's arrival at the engine)
with the simulated engine's, a load generator's (from sending the request to the first and
last byte) with the simulated client's (:func:`simulated_latencies`). When a client's file also
has the server's own per-request TTFT and queue time, they are compared with the simulated
engine's under ``vs_measured["server"]`` (not part of the mean error), as vLLM defines them
(``PerRequestMetrics``): its TTFT runs from the request's first scheduling to its first token
(the simulated ``prefill_ms``), its queue time from ``queued_ts`` -- when the engine core's loop
took the request, between two steps -- to that scheduling (the simulated ``loop_queue_ms``).

Calibration may instead pair each measured request with its own replay (:func:`paired_errors`):
a statistic of the whole run forgets which request had which latency, a pairing keeps it -- a
TTFT that grows with the prompt is then a regression, not a match of two distributions.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import client_latencies, completed, request_latencies

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "Latency"))
STATISTICS = (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p95", "p95"), ("p99", "p99"))
#: The 15 compared statistics as dotted metric names: ``ttft_ms.mean``, ..., ``e2e_ms.p99``.
STATISTIC_NAMES = tuple(f"{m}.{s}" for m, _ in LATENCIES for s, _ in STATISTICS)


def statistics(latencies: dict[str, np.ndarray]) -> dict[str, float]:
    """The 15 statistics of per-request latency arrays (``ttft_ms``, ``tpot_ms``, ``e2e_ms``)."""
    out = {}
    for metric, _ in LATENCIES:
        values = np.asarray(latencies[metric], dtype=float)
        values = values[np.isfinite(values)]
        for stat, _ in STATISTICS:
            if values.size == 0:
                out[f"{metric}.{stat}"] = float("nan")
            elif stat == "mean":
                out[f"{metric}.{stat}"] = float(values.mean())
            else:
                out[f"{metric}.{stat}"] = float(np.percentile(values, float(stat[1:])))
    return out


def measured_statistics(measured) -> dict[str, float]:
    """The 15 statistics of a :class:`~schedlab_plugins.workloads.measured.MeasuredRequests`."""
    return statistics({"ttft_ms": measured.ttft_ms, "tpot_ms": measured.tpot_ms, "e2e_ms": measured.e2e_ms})


def pct_error(simulated: float, measured: float) -> float:
    """``(simulated - measured) / measured`` in percent; NaN where ``measured`` is 0, which has no
    error in percent (a log's coarse timestamps can make every TTFT 0: it stopped the run with a
    ZeroDivisionError)."""
    return 100.0 * (simulated - measured) / measured if measured != 0 else math.nan


def errors_pct(simulated: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """:func:`pct_error` per statistic."""
    return {name: pct_error(simulated[name], measured[name]) for name in STATISTIC_NAMES}


def mean_abs_error(errors: dict[str, float]) -> float:
    """The mean |error| over the statistics that have one (a run that did not stream has no TTFT)."""
    finite = [abs(e) for e in errors.values() if math.isfinite(e)]
    return float(np.mean(finite)) if finite else float("nan")


def simulated_latencies(requests: dict[str, np.ndarray], measured) -> dict[str, np.ndarray]:
    """The simulated run's latencies in the measured run's view (``ttft_ms``, ``tpot_ms``,
    ``e2e_ms`` per completed request): the client's for a load generator's file, else the engine's."""
    if getattr(measured, "view", "engine") == "client":
        lat = client_latencies(requests)
        return {"ttft_ms": lat["ttft_ms"], "tpot_ms": lat["tpot_ms"], "e2e_ms": lat["e2el_ms"]}
    return request_latencies(requests)


#: the server's own per-request times (measured field, name, simulated engine's latency): vLLM 0.33's
#: ``server_ttfts`` are first scheduled -> first token (``entrypoints/generate/base/serving.py``), not
#: arrival -> first token as its ``/metrics`` TTFT histogram (the simulated ``ttft_ms``) is; its
#: ``server_queue_times`` run from ``queued_ts``, when the engine loop took the request between two steps,
#: to its first scheduling (the simulated ``loop_queue_ms``, :mod:`schedlab.engine.taking`)
SERVER_FIELDS = (("server_ttft_ms", "ttft_ms", "prefill_ms"), ("server_queue_ms", "loop_queue_ms", "loop_queue_ms"))


def server_comparison(requests: dict[str, np.ndarray], measured) -> dict[str, Any] | None:
    """The server's own per-request TTFT and queue time (a client's file) against the simulated
    engine's: ``{"errors_pct": {"ttft_ms.mean": ...}, "measured": {...}}``, or None without them."""
    engine = request_latencies(requests)
    out: dict[str, dict[str, float]] = {"errors_pct": {}, "measured": {}}
    for field, name, simulated_name in SERVER_FIELDS:
        values = getattr(measured, field, None)
        if values is None or not np.isfinite(values).any():
            continue
        for stat, _ in STATISTICS:
            truth = _statistic(values[np.isfinite(values)], stat)
            simulated = _statistic(engine[simulated_name], stat)
            key = f"{name}.{stat}"
            out["measured"][key] = truth
            out["errors_pct"][key] = 100.0 * (simulated - truth) / truth if truth else float("nan")
    return out if out["measured"] else None


def _statistic(values: np.ndarray, stat: str) -> float:
    if values.size == 0:
        return float("nan")
    return float(values.mean()) if stat == "mean" else float(np.percentile(values, float(stat[1:])))


#: The error, in percent, of each latency of a measured request the simulated run did not
#: complete (rejected, aborted) in a paired comparison: as far off as a latency twice the truth.
LOST_PCT = 100.0


def file_order(measured) -> np.ndarray:
    """``order[i]`` is the measured run's row that simulated request ``i`` replays: simulated
    ids follow arrival order (stable), the file may not."""
    n = len(measured.arrival_ms)
    return np.argsort(measured.arrival_ms, kind="stable") if np.isfinite(measured.arrival_ms).all() else np.arange(n)


def paired_latencies(requests: dict[str, np.ndarray], measured) -> dict[str, np.ndarray]:
    """The simulated ``ttft_ms``, ``tpot_ms`` and ``e2e_ms`` of every measured request, aligned
    with the measured run's rows, in its view (:func:`simulated_latencies`); NaN where the
    simulated request did not complete (and TPOT of a one-token output)."""
    n = len(measured.ttft_ms)
    client = getattr(measured, "view", "engine") == "client"
    ok = completed(requests)
    ids = requests["id"][ok].astype(np.int64)
    inside = ids < n
    rows = file_order(measured)[ids[inside]]

    def column(client_name: str, engine_name: str) -> np.ndarray:
        name = client_name if client and client_name in requests else engine_name
        return requests[name][ok][inside]

    start, first, done = column("sent_ms", "arrival_ms"), column("client_first_ms", "first_token_ms"), \
        column("client_done_ms", "finish_ms")
    generated = requests["generated_tokens"][ok][inside]
    out = {metric: np.full(n, np.nan) for metric, _ in LATENCIES}
    out["ttft_ms"][rows] = first - start
    out["e2e_ms"][rows] = done - start
    many = generated > 1
    out["tpot_ms"][rows[many]] = (done[many] - first[many]) / (generated[many] - 1)
    return out


def paired_errors(requests: dict[str, np.ndarray], measured, rows: np.ndarray | None = None) -> dict[str, float]:
    """Each measured request's TTFT, TPOT and latency against its own replay's, in percent:
    ``{"ttft_ms[17]": -2.5, ...}`` over the measured run's ``rows`` (all by default) where it
    measured them; a request the simulation did not complete counts :data:`LOST_PCT` each."""
    simulated = paired_latencies(requests, measured)
    truth = {"ttft_ms": measured.ttft_ms, "tpot_ms": measured.tpot_ms, "e2e_ms": measured.e2e_ms}
    picked = np.arange(len(measured.ttft_ms)) if rows is None else np.sort(np.asarray(rows))
    out: dict[str, float] = {}
    for metric, _ in LATENCIES:
        real, sim = truth[metric][picked], simulated[metric][picked]
        valid = np.isfinite(real) & (real > 0)
        with np.errstate(invalid="ignore"):
            error = np.where(np.isfinite(sim), 100.0 * (sim - real) / np.where(valid, real, 1.0), LOST_PCT)
        out.update({f"{metric}[{row}]": float(e) for row, e in zip(picked[valid], error[valid])})
    return out


def select_requests(requests: dict[str, np.ndarray], measured, rows: np.ndarray):
    """The simulated requests and the measured run restricted to the measured run's ``rows``
    (positions in its file). Simulated ids follow arrival order (stable), the file may not."""
    order = file_order(measured)
    ids = np.flatnonzero(np.isin(order, rows))          # simulated id i is file row order[i]
    keep = np.isin(requests["id"], ids)
    sim = {k: v[keep] for k, v in requests.items()}
    picked = np.sort(rows)
    truth = {"ttft_ms": measured.ttft_ms[picked], "tpot_ms": measured.tpot_ms[picked], "e2e_ms": measured.e2e_ms[picked]}
    return sim, truth


def vs_measured(requests: dict[str, np.ndarray], measured, rows: np.ndarray | None = None) -> dict[str, Any]:
    """The ``vs_measured`` metrics of a run's per-request columns against a measured run
    (only the measured run's ``rows`` when given), in the measured run's view."""
    if rows is not None:
        requests, lat = select_requests(requests, measured, rows)
        truth = statistics(lat)
    else:
        truth = measured_statistics(measured)
    sim = statistics(simulated_latencies(requests, measured))
    errors = errors_pct(sim, truth)
    out = {"mean_abs_error_pct": mean_abs_error(errors), "errors_pct": errors, "measured": truth}
    server = server_comparison(requests, measured) if rows is None else None
    if server is not None:
        out["server"] = server
    return out


def comparison_rows(simulated: dict[str, float], measured: dict[str, float]) -> list[tuple[str, float, float, float]]:
    """``(label, measured, simulated, error %)`` per statistic, in the usual order."""
    rows = []
    for metric, mlabel in LATENCIES:
        for stat, slabel in STATISTICS:
            name = f"{metric}.{stat}"
            m, s = measured[name], simulated[name]
            rows.append((f"{mlabel} {slabel}", m, s, pct_error(s, m)))
    return rows


def format_comparison(title: str, rows, *, mean_abs: float | None = None) -> str:
    """A fixed-width table: statistic, measured, simulated, error (ms; error in %)."""
    lines = [title, f"{'statistic':<16}{'measured':>12}{'simulated':>12}{'error':>9}", "-" * 49]
    shown = [row for row in rows if math.isfinite(row[1])]
    groups = [label.split()[0] for label, *_ in shown]
    for i, (label, m, s, err) in enumerate(shown):
        if i and groups[i] != groups[i - 1]:
            lines.append("")
        lines.append(f"{label:<16}{m:>12.1f}{s:>12.1f}" + (f"{err:>+8.1f}%" if m != 0 else f"{'--':>9}"))
    missing = list(dict.fromkeys(label.split()[0] for label, m, *_ in rows if not math.isfinite(m)))
    if missing:
        lines.append(f"(not measured, left out: {', '.join(missing)})")
    if any(m == 0 for _, m, *_ in shown):
        lines.append("(--: measured 0, no error in percent; left out of the mean)")
    if mean_abs is None:
        mean_abs = mean_abs_error({label: err for label, _, _, err in shown})
    lines.append("-" * 49)
    lines.append(f"{'mean |error|':<40}{mean_abs:>8.2f}%")
    return "\n".join(lines) + "\n"


def format_target(name: str, source: dict, vs: dict) -> str:
    """A run against its ``[target]`` summary: each statistic measured, simulated, error."""
    where = Path(source.get("path", "")).name
    lines = [f"{name}: simulated vs {where} ({source.get('kind', 'summary')}, as the {source.get('view', 'client')} "
             f"sees requests)", f"{'statistic':<26}{'measured':>12}{'simulated':>12}{'error':>9}", "-" * 59]
    for key, value in vs["measured"].items():
        lines.append(f"{key:<26}{value:>12.2f}{vs['simulated'][key]:>12.2f}{vs['errors_pct'][key]:>+8.1f}%")
    lines += ["-" * 59, f"{'mean |error|':<50}{vs['mean_abs_error_pct']:>8.2f}%"]
    left_out = source.get("left_out")
    if left_out:   # a statistic of the file not compared (null, NaN, not comparable): said, not silently missing
        lines.append("left out of the comparison: " + ", ".join(f"{key} ({why})" for key, why in left_out.items()))
    return "\n".join(lines) + "\n"
