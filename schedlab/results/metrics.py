"""Run metrics from per-request arrays and counters, computed once with numpy.

Names and meanings follow vLLM (engines.md §3): TTFT from arrival to first token; TPOT per
request = (finish - first token) / (tokens - 1); ITL one sample per token after the first --
with speculative decoding one per step that gives a request tokens, however many (vLLM's
``inter_token_latency`` and ``vllm bench serve`` see one arrival per step); queue time from
arrival to first scheduling, and ``loop_queue_ms`` from the engine's loop taking the request
(``taken_ms``, :mod:`schedlab.engine.taking`) to its first scheduling, as vLLM's and SGLang's
queue-time histograms count it. Percentiles use numpy's default (linear)
interpolation; ITL percentiles come from run-length-encoded samples with the same rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import attrs
import numpy as np

from ..energy.metrics import class_energy, energy_metrics, energy_shares, energy_totals
from ..model import Request
from .stability import run_stability

PERCENTILES = (50, 90, 95, 99)


def metric_at(metrics: dict, name: str, missing: Any = None) -> Any:
    """The value at a dotted metric name (``ttft_ms.p99``, ``per_class.chat.slo.goodput_rps``),
    or ``missing`` when the path does not exist. Reports use it to address nested metrics. A
    key with dots of its own -- a class or client named ``gpt-4.1`` -- is found too
    (``per_class.gpt-4.1.ttft_ms.p99``): where a part is not a key, it is joined to the next."""
    return _walk(metrics, name.split("."), 0, missing)


def _walk(node: Any, parts: list, i: int, missing: Any) -> Any:
    if i == len(parts):
        return node
    if not isinstance(node, Mapping):
        return missing
    for j in range(i + 1, len(parts) + 1):
        key = parts[i] if j == i + 1 else ".".join(parts[i:j])
        if key in node:
            found = _walk(node[key], parts, j, _MISSING)
            if found is not _MISSING:
                return found
    return missing


_MISSING = object()


def summarize(values: np.ndarray) -> dict[str, float]:
    """mean, p50, p90, p95, p99 and max of a sample (NaNs for an empty one)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        nan = float("nan")
        return {"mean": nan, **{f"p{p}": nan for p in PERCENTILES}, "max": nan}
    out = {"mean": float(values.mean())}
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES)):
        out[f"p{p}"] = float(v)
    out["max"] = float(values.max())
    return out


# -- inter-token latency from runs ---------------------------------------------------------------


def counts_at_most(first, inc, count, weight, values: np.ndarray) -> np.ndarray:
    """For each of ``values``, how many samples are <= it (runs: first + j*inc, j < count)."""
    v = values[None, :]
    f, d, c = first[:, None], inc[:, None], count[:, None]
    safe = np.where(d > 0, d, 1.0)
    # clipped while still floats: a bound of +inf (a histogram's last bucket), or one so far past a
    # run that the quotient leaves int64, must count the whole run, not wrap round to nothing
    with np.errstate(over="ignore", invalid="ignore"):
        j = np.where(d > 0, np.floor((v - f) / safe) + 1, np.where(f <= v, c, 0))
    j = np.clip(j, 0, c).astype(np.int64)
    # settle rounding at the edges on the exact values first + j*inc
    j = np.where((j > 0) & (f + (j - 1) * d > v), j - 1, j)
    j = np.where((j < c) & (f + j * d <= v) & (d > 0), j + 1, j)
    return (j * weight[:, None]).sum(axis=0)


def _order_statistics(first, inc, count, weight, ks: np.ndarray) -> np.ndarray:
    """The k-th smallest samples (0-based), for every k in ``ks``: :func:`_order_statistic`."""
    last = first + (count - 1) * inc
    return np.array([_order_statistic(first, inc, count, weight, last, int(k)) for k in ks])


def _order_statistic(first, inc, count, weight, last, k: int) -> float:
    """The k-th smallest sample (0-based), by bisection on the value, then a snap to the largest
    sample at or below the bracket's top.

    The bracket ``(lo, hi]`` shrinks by half each step, and so do the runs that matter: a run
    wholly at or below ``lo`` counts in full at every later midpoint (``base``), one wholly above
    ``hi`` never counts, so only the runs straddling the bracket are counted again -- the work is
    a few passes over the runs, not one per bisection step."""
    lo, hi = float(first.min()), float(last.max())
    if counts_at_most(first, inc, count, weight, np.array([lo]))[0] > k:
        return lo
    f, d, c, w, z = first, inc, count, weight, last
    base, base_max = 0, -np.inf
    for _ in range(80):
        below = z <= lo  # wholly counted from now on
        if below.any():
            base += int((c[below] * w[below]).sum())
            base_max = max(base_max, float(z[below].max()))
        keep = ~below & (f <= hi)
        f, d, c, w, z = f[keep], d[keep], c[keep], w[keep], z[keep]
        mid = lo + (hi - lo) / 2
        if not lo < mid < hi:
            break
        if base + int(counts_at_most(f, d, c, w, np.array([mid]))[0]) > k:
            hi = mid
        else:
            lo = mid
    # the largest sample at or below hi: a counted run's last one, or one of a straddling run
    if not f.size:
        return base_max
    safe = np.where(d > 0, d, 1.0)
    j = np.where(d > 0, np.floor((hi - f) / safe), 0).astype(np.int64)
    j = np.clip(j, 0, c - 1)
    j = np.where((f + j * d > hi) & (j > 0), j - 1, j)
    j = np.where((j + 1 < c) & (f + (j + 1) * d <= hi) & (d > 0), j + 1, j)
    vals = f + j * d
    vals = vals[vals <= hi]
    return max(base_max, float(vals.max())) if vals.size else base_max


def run_quantiles(first, inc, count, weight, percentiles=PERCENTILES) -> dict[str, float]:
    """Summary of samples given as runs; equals :func:`summarize` of the expanded samples
    (with other ``percentiles``, numpy's linear percentiles at those)."""
    first = np.asarray(first, dtype=float)
    inc = np.asarray(inc, dtype=float)
    count = np.asarray(count, dtype=np.int64)
    weight = np.asarray(weight, dtype=np.int64)
    total = int((count * weight).sum())
    if total == 0:
        return {"mean": float("nan"), **{f"p{p:g}": float("nan") for p in percentiles}, "max": float("nan")}
    out = {"mean": float((weight * (count * first + inc * (count * (count - 1) / 2))).sum() / total)}
    hs = [(total - 1) * p / 100.0 for p in percentiles]
    ks = sorted({k for h in hs for k in (math.floor(h), min(math.floor(h) + 1, total - 1))})
    if not inc.any():
        order = np.argsort(first, kind="stable")
        cum = np.cumsum((count * weight)[order])
        stats = first[order][np.searchsorted(cum, np.asarray(ks) + 1)]
    else:
        stats = _order_statistics(first, inc, count, weight, np.asarray(ks, dtype=np.int64))
    stat = dict(zip(ks, stats.tolist()))
    for p, h in zip(percentiles, hs):
        lo_k = math.floor(h)
        lo_v = stat[lo_k]
        hi_v = stat[min(lo_k + 1, total - 1)] if h > lo_k else lo_v
        out[f"p{p:g}"] = lo_v + (h - lo_k) * (hi_v - lo_v)
    out["max"] = float((first + (count - 1) * inc).max())
    return out


# -- the run ------------------------------------------------------------------------------------------


def _reason_kind(reason: str) -> str:
    return re.sub(r"\d+", "#", reason)


def completed(req: dict[str, np.ndarray]) -> np.ndarray:
    """Requests that completed for their clients: neither rejected nor abandoned (timed out).
    Latencies are taken over these, as ``vllm bench serve`` takes them over successful requests."""
    ok = req["rejected"] == 0
    timed_out = req.get("timed_out")
    return ok if timed_out is None else ok & (timed_out == 0)


#: the latency summaries of a run, a class and an instance (:func:`request_latencies`' names)
LATENCY_NAMES = ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms", "loop_queue_ms")


def request_latencies(req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per completed request, as the engine sees it (from its arrival at the engine's queue):
    ttft, tpot, e2e, queue, prefill and decode time (ms); and ``loop_queue_ms``, from the engine's
    loop taking it (``taken_ms``; NaN in results saved without it) to its first scheduling."""
    ok = completed(req)
    arrival = req["arrival_ms"][ok]
    first = req["first_token_ms"][ok]
    finish = req["finish_ms"][ok]
    generated = req["generated_tokens"][ok]
    many = generated > 1
    tpot = (finish[many] - first[many]) / (generated[many] - 1)
    return {
        "ttft_ms": first - arrival,
        "tpot_ms": tpot,
        "e2e_ms": finish - arrival,
        "queue_ms": req["first_scheduled_ms"][ok] - arrival,
        "loop_queue_ms": req["first_scheduled_ms"][ok] - req["taken_ms"][ok] if "taken_ms" in req
        else np.full(int(ok.sum()), np.nan),
        "prefill_ms": first - req["first_scheduled_ms"][ok],
        "decode_ms": finish - first,
    }


def request_counts(req: dict[str, np.ndarray]) -> dict[str, int]:
    """Requests in all, completed for their clients (``finished``), rejected, timed out (their
    clients gave up) and aborted (the engine dropped them)."""
    return {"requests": int(req["id"].size), "finished": int(completed(req).sum()),
            "rejected": int((req["rejected"] != 0).sum()),
            "timed_out": int(req["timed_out"].sum()) if "timed_out" in req else 0,
            "aborted": int(req["aborted"].sum()) if "aborted" in req else 0}


def warmup_count(warmup, n: int) -> int:
    """How many of a run's ``n`` requests a warm-up leaves out: ``warmup`` requests (a whole
    number), or that share of ``n`` rounded down (a number below 1), as guidellm's
    ``int(percent * requests)`` -- but of the share as written, in exact arithmetic: 0.29 of 100 is
    29, where ``int(0.29 * 100)`` is 28 (0.29 is 0.28999... in binary); at most ``n``."""
    if isinstance(warmup, int):
        return max(0, min(int(warmup), n))
    return max(0, min(math.floor(Fraction(repr(float(warmup))) * n), n))


def measured_requests(req: dict[str, np.ndarray], warmup, cooldown=0) -> np.ndarray:
    """Which rows a run's statistics count after a warm-up of ``warmup`` and a cool-down of
    ``cooldown`` (each :func:`warmup_count`): all but the first and the last requests its clients
    sent -- in order of sending (``sent_ms``; a rejected request's arrival, as it has no send
    time), ties by request id -- so a closed loop's opening wave, all sent at once, is the first
    to go, and the requests sent while the load drains at the end (guidellm's cool-down) the last."""
    n = int(req["id"].size)
    keep = np.ones(n, dtype=bool)
    first, last = warmup_count(warmup, n), warmup_count(cooldown, n)
    if first or last:
        arrival = np.asarray(req["arrival_ms"], dtype=float)
        sent = np.asarray(req["sent_ms"], dtype=float) if "sent_ms" in req else arrival
        sent = np.where(sent >= 0, sent, arrival)
        order = np.lexsort((req["id"], sent))
        keep[order[:first]] = False
        keep[order[n - last:]] = False
    return keep


def _measured_window(req: dict[str, np.ndarray], measured: np.ndarray) -> tuple[float, float]:
    """The measured window of a run with a warm-up or a cool-down: from the first measured request's arrival at
    the engine to the last one leaving it (the makespan of those requests alone), ms."""
    left = left_the_engine(req) & measured
    if not left.any():
        return 0.0, 0.0
    return float(req["arrival_ms"][measured].min()), float(req["finish_ms"][left].max())


def _in_window(req: dict[str, np.ndarray], window: tuple[float, float]) -> tuple[int, np.ndarray]:
    """What the engine did for ``req``'s completed requests within ``window``, open at its start
    and closed at its end (``(start, end]``: what finishes at the instant the window opens -- in a
    closed loop, the request whose finish sends the first measured one -- was done before it;
    review s81 fleet, finding 1): the output tokens it generated then (every token of a request
    wholly inside; of one that straddles an end -- a warm-up request still running when the window
    opens, or finishing after it closes -- those that fall inside, its tokens taken as evenly
    spaced from its first to its finish, as the rows keep no token's time), and which requests it
    completed then."""
    start, end = window
    ok = completed(req)
    first, finish = req["first_token_ms"][ok], req["finish_ms"][ok]
    generated = req["generated_tokens"][ok].astype(np.int64)
    inside = (first > start) & (finish <= end)
    straddles = ~inside & (finish > start) & (first <= end)
    tokens = int(generated[inside].sum())
    if straddles.any():
        f, g = first[straddles], generated[straddles]
        step = np.where(g > 1, (finish[straddles] - f) / np.maximum(g - 1, 1), 0.0)
        safe = np.where(step > 0, step, 1.0)
        lo = np.where(step > 0, np.floor((start - f) / safe) + 1, np.where(f > start, 0, g))
        hi = np.where(step > 0, np.floor((end - f) / safe), np.where(f <= end, g - 1, -1))
        tokens += int(np.maximum(np.minimum(hi, g - 1) - np.maximum(lo, 0) + 1, 0).sum())
    done = np.zeros(req["id"].size, dtype=bool)
    done[np.flatnonzero(ok)[(finish > start) & (finish <= end)]] = True
    return tokens, done


def _window_rates(req: dict[str, np.ndarray], window: tuple[float, float]) -> tuple[float, float]:
    """``throughput_tps`` and ``request_throughput_rps`` of a run with a warm-up: the output tokens
    generated and the requests completed in the measured window, per second of it (the warm-up's
    requests' part in it too: the server's rates while the measured requests ran)."""
    seconds = (window[1] - window[0]) / 1e3
    if seconds <= 0:
        return float("nan"), float("nan")
    tokens, done = _in_window(req, window)
    return tokens / seconds, int(done.sum()) / seconds


def _measured_slo(req: dict[str, np.ndarray], measured: np.ndarray, slo: dict,
                  window: tuple[float, float]) -> dict[str, float]:
    """``slo`` of a run with a warm-up: ``attainment`` and ``met`` over the measured requests;
    ``goodput_rps``, as the other rates, the requests completed in the measured window that met
    their targets, per second of it."""
    ok = completed(req)
    met = np.zeros(req["id"].size, dtype=bool)
    met[ok] = slo_met(req, ok, slo)
    n = int(measured.sum())
    seconds = (window[1] - window[0]) / 1e3
    good = int((met & _in_window(req, window)[1]).sum())
    return {"attainment": float((met & measured).sum() / n) if n else float("nan"),
            "goodput_rps": float(good / seconds) if seconds > 0 else float("nan"),
            "met": int((met & measured).sum())}


def client_latencies(req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per completed request, as its client sees it (:mod:`schedlab.frontend`), from sending it:
    ``ttft_ms`` (to the first byte), ``tpot_ms``, ``e2el_ms`` (to the last byte) -- ``vllm bench
    serve``'s TTFT, TPOT and E2EL --, ``ntpot_ms`` (E2EL per output token, inference-perf's
    normalized time per output token), ``frontend_ms`` (sent -> the engine's queue: the
    network and the API server), ``queue_ms`` (due -> sent: a capped client's wait for a slot,
    ``vllm bench serve``'s ``client_queue_time``) and ``e2el_incl_queue_ms`` (due -> the last byte,
    its ``e2el_including_client_queue``). Without a front end they are the engine's latencies."""
    ok = completed(req)
    sent = req["sent_ms"][ok] if "sent_ms" in req else req["arrival_ms"][ok]
    due = req["due_ms"][ok] if "due_ms" in req else sent
    first = req["client_first_ms"][ok] if "client_first_ms" in req else req["first_token_ms"][ok]
    done = req["client_done_ms"][ok] if "client_done_ms" in req else req["finish_ms"][ok]
    generated = req["generated_tokens"][ok]
    many = generated > 1
    return {
        "ttft_ms": first - sent,
        "tpot_ms": (done[many] - first[many]) / (generated[many] - 1),
        "e2el_ms": done - sent,
        "ntpot_ms": (done - sent) / generated,
        "frontend_ms": req["arrival_ms"][ok] - sent,
        "queue_ms": sent - due,
        "e2el_incl_queue_ms": done - due,
    }


def compute_metrics(req: dict[str, np.ndarray], counters: dict[str, float], itl: dict[str, np.ndarray],
                    meta: dict[str, Any], request_cost=None) -> dict[str, Any]:
    """Every run metric, as a JSON-ready nested dict.

    :param req: per-request columns (see :mod:`schedlab.engine.recorder`).
    :param counters: the run's counters.
    :param itl: ITL runs: arrays ``first``, ``inc``, ``count``, ``weight``.
    :param meta: ``slots`` (fixed batch slots or None) and ``num_blocks``, both summed over the
        ``instances`` (default 1), ``slo`` (optional
        ``{"ttft_ms": x, "tpot_ms": y}`` and per-class tables).
    :param request_cost: the cost model's ``request_cost(prompt, output)``, for seed 001's
        per-request cost decomposition (optional).

    ``meta["warmup"]`` and ``meta["cooldown"]`` (a search's ``warmup`` and ``cooldown``, absent
    without them): the first and the last requests sent (:func:`measured_requests`) are left out
    of the latency summaries (the client's too, but not ITL, which is kept per run) and of
    ``slo.attainment`` and ``slo.met``; the rates (``throughput_tps``, ``request_throughput_rps``,
    ``slo.goodput_rps``) are over the measured window, of what the engine did in it
    (:func:`_window_rates`) -- at the top level, per class and per instance; ``warmup`` says how
    many were left out at the start and measured, and the window, ``cooldown`` how many at the
    end. Counts (``requests``, ``finished``, ``generated_tokens``, ...) and everything else stay
    the whole run's.
    """
    ok = completed(req)
    n_all = int(req["id"].size)
    n_ok = int(ok.sum())
    transient = meta.get("warmup") or 0, meta.get("cooldown") or 0
    measured = measured_requests(req, *transient) if any(transient) else None
    stats = req if measured is None else {k: v[measured] for k, v in req.items()}  # what the percentiles count
    lat = request_latencies(stats)
    generated = int(req["generated_tokens"][ok].sum())
    start = float(req["arrival_ms"].min()) if n_all else 0.0
    left = left_the_engine(req)
    makespan = float(req["finish_ms"][left].max()) - start if left.any() else 0.0
    seconds = makespan / 1e3
    m = _run_metrics(request_counts(req), generated, makespan, float(req["waiting_ms"].sum()), counters, meta, start)
    window = None
    if measured is not None:  # rates over the measured window
        window = _measured_window(req, measured)
        m["throughput_tps"], m["request_throughput_rps"] = _window_rates(req, window)
        m["warmup"] = {"requests": warmup_count(transient[0], n_all), "measured": int(measured.sum()),
                       "measured_finished": int(completed(stats).sum()), "measured_window_ms": window[1] - window[0]}
        if transient[1]:
            m["cooldown"] = {"requests": warmup_count(transient[1], n_all)}
    for name in LATENCY_NAMES:
        m[name] = summarize(lat[name])
    m["itl_ms"] = run_quantiles(itl["first"], itl["inc"], itl["count"], itl["weight"])
    # the client's view: its inter-token latencies are the engine's (every token is delayed alike)
    m["client"] = {name: summarize(values) for name, values in client_latencies(stats).items()}
    m["client"]["itl_ms"] = m["itl_ms"]
    _engine_metrics(m, counters, meta, makespan, kv_window(counters, start, makespan), start)
    chunks = req["prefill_chunks"][ok]
    m["prefill_chunks"] = {"mean": float(chunks.mean()) if n_ok else float("nan"),
                           "max": int(chunks.max()) if n_ok else 0}
    totals = None
    if request_cost is not None and n_ok:
        # (the tokens each made: a max_tokens below the answer's length cuts its decode cost too)
        pre, dec = request_cost(req["prompt_tokens"][ok].astype(float), req["generated_tokens"][ok].astype(float))
        totals = float(np.sum(pre)), float(np.sum(dec))
    m["cost"] = _cost_metrics(counters, totals)
    reasons: dict[str, int] = {}
    for reason in meta.get("rejections", {}).values():
        kind = _reason_kind(reason)
        reasons[kind] = reasons.get(kind, 0) + 1
    m["rejection_reasons"] = reasons
    instances = meta.get("instances") or 1
    if meta.get("pools"):
        m["transfer"] = _transfer_metrics(req, ok)
        _pool_queues(m)
    slo = meta.get("slo") or {}
    if slo:
        m["slo"] = _slo_metrics(req, ok, slo, seconds) if measured is None else _measured_slo(req, measured, slo,
                                                                                               window)
    energy = meta.get("energy")
    if energy:  # a run with [power] (schedlab.energy)
        m["energy"] = energy_metrics(req, energy, summarize, ok)
    classes = np.unique(req["request_class"]) if n_all else []
    if _named_classes([str(k) for k in classes]):
        m["per_class"] = {str(k): _subset_metrics(req, req["request_class"] == k, slo, seconds, classes=True,
                                                  measured=measured, window=window)
                          for k in classes}
        if energy:
            for k in classes:
                m["per_class"][str(k)]["energy"] = class_energy(req, req["request_class"] == k, ok)
    end = engine_end_ms(counters, float(req["finish_ms"][left].max()) if left.any() else 0.0)
    hours = arrival_hours(req["arrival_ms"])
    met = np.zeros(n_all, dtype=bool)
    if slo:
        met[ok] = slo_met(req, ok, slo)
    _fleet_metrics(m, meta, end, np.bincount(hours), np.bincount(hours, weights=met), bool(slo))
    m["stability"], per_instance_stability = run_stability(req, instances)
    if instances > 1:  # every instance, also one that served nothing
        m["per_instance"] = {str(k): _subset_metrics(req, req["instance"] == k, slo, seconds, measured=measured,
                                                     window=window)
                             for k in range(instances)}
        for k, part in enumerate(per_instance_stability):
            m["per_instance"][str(k)]["stability"] = part
    if n_all and len(np.unique(req["client"])) > 1:
        m["per_client"] = client_service(req)
        _fairness(m)
    return m


def left_the_engine(req: dict[str, np.ndarray]) -> np.ndarray:
    """The requests the makespan runs to the last of: those the engine finished or dropped, and
    those it turned away after they had queued or run (a rejection on arrival has no finish)."""
    return (req["rejected"] == 0) | (req["finish_ms"] >= 0)


def _run_metrics(counts: dict[str, int], generated: int, makespan: float, waiting_ms: float,
                 c: dict[str, float], meta: dict[str, Any], start: float) -> dict[str, Any]:
    """The run's counts, rates and occupancy (shared by exact and streamed runs); ``counts``:
    requests, finished (completed for their clients), rejected, timed_out and aborted."""
    seconds = makespan / 1e3
    slots = meta.get("slots")  # of the whole cluster, like num_blocks
    instances = meta.get("instances") or 1
    iterations = int(c["iterations"])
    n_ok = counts["finished"]
    return {
        "requests": counts["requests"],
        "finished": n_ok,
        "rejected": counts["rejected"],
        # the client gave up (schedlab.frontend): failed for vllm bench serve; aborted: the engine
        # dropped them (the rest had finished in the engine when their last byte came too late)
        "timed_out": counts["timed_out"],
        "aborted": counts["aborted"],
        "makespan_ms": makespan,
        # (none made, none completed: 0 per second whatever the span, as vllm bench serve says it -- a
        # run whose every request was turned away on arrival has no span at all)
        "throughput_tps": generated / seconds if seconds > 0 else (0.0 if not generated else float("nan")),
        "request_throughput_rps": n_ok / seconds if seconds > 0 else (0.0 if not n_ok else float("nan")),
        "generated_tokens": generated,
        "iterations": iterations,
        # iterations are summed over instances, and each instance's iteration offers its own slots; the
        # tokens are every one the engine produced (a request whose client gave up made some too: its
        # slots worked), not only completed requests' as throughput counts them
        "slot_utilisation": (c.get("generated_tokens", generated) / (iterations * slots / instances)
                             if slots and iterations else float("nan")),
        "peak_running": int(c["peak_running"]),
        "avg_running": c["running_seq_ms"] / makespan if makespan > 0 else float("nan"),
        "avg_queue": waiting_ms / makespan if makespan > 0 else float("nan"),
        "peak_waiting": int(c["peak_waiting"]),
        # share of the makespan the accelerator(s) spent in iterations (or of the span until the last
        # iteration ended, if later: SGLang's discarded decode after the last finish, Plan.overshoot)
        "busy_share": (c["busy_ms"] / (_busy_window(c, makespan, start) * instances
                                       * on_share(meta, start, start + _busy_window(c, makespan, start)))
                       if makespan > 0 else float("nan")),
    }


def on_share(meta: dict[str, Any], start: float, end: float, pool: str | None = None) -> float:
    """The share of the instances' time from ``start`` to ``end`` they were on: 1 for a fixed
    cluster; an autoscaled one's instance-time switched on over its most instances' (busy and KV
    shares are of the instances there were, not of the most there could have been: one busy instance
    of an autoscaler's 4 read 0.25). ``pool``: of a disaggregated cluster's pool alone."""
    scaling = meta.get("scaling")
    if not scaling or end <= start:
        return 1.0
    if pool is not None:
        scaled = (scaling.get("pools") or {}).get(pool)
        if scaled is None:  # (a pool of fixed size beside an autoscaled one)
            return 1.0
        spans = [(on, off) for _, on, off in scaled["intervals"]]
        units = int((meta.get("pools") or {}).get(pool, {}).get("instances") or 1)
    elif "pools" in scaling:  # every pool's instances, those of a pool of fixed size on throughout
        sizes = {name: int((meta.get("pools") or {}).get(name, {}).get("instances") or 1)
                 for name in (meta.get("pools") or scaling["pools"])}
        shares = [(on_share(meta, start, end, name), n) for name, n in sizes.items()]
        return sum(share * n for share, n in shares) / sum(n for _, n in shares)
    else:
        spans = [(on, off) for _, on, off in scaling["intervals"]]
        units = (meta.get("data_parallel") or {}).get("deployments") or meta.get("instances") or 1
    on_ms = sum(max(0.0, min(off, end) - max(on, start)) for on, off in spans)
    return on_ms / (units * (end - start)) if on_ms > 0 else 1.0


def _busy_window(c: dict[str, float], makespan: float, start: float) -> float:
    """The span busy shares are taken over: the makespan, or longer when an iteration ended after
    the last request did (SGLang's discarded decode of a request at an EOS, ``Plan.overshoot``)."""
    busy = c.get("busy_until_ms", 0.0) - start
    return busy if busy > makespan else makespan


def engine_end_ms(c: dict[str, float], last_left_ms: float) -> float:
    """When the engine's work ended (the time GPUs are paid to): the last request it finished or
    dropped (``last_left_ms``: abandoned requests are worked on too), or a later iteration's end
    or KV release (:func:`_busy_window`, :func:`kv_window`)."""
    return max(last_left_ms, c.get("busy_until_ms", 0.0), c.get("kv_held_until_ms", 0.0))


def kv_window(counters: dict[str, float], start: float, makespan: float) -> float:
    """The span the KV shares are taken over: the makespan, or longer when blocks were still held
    after the last request was done (a prefill instance's lease on abandoned prompts)."""
    held = counters.get("kv_held_until_ms", 0.0) - start
    return held if makespan > 0 and held > makespan else makespan


def _engine_metrics(m: dict[str, Any], c: dict[str, float], meta: dict[str, Any], makespan: float,
                    window: float, start: float = 0.0) -> None:
    """KV usage, preemptions, prefix cache, speculation, GPUs and pools: counters and meta only
    (KV shares over ``window`` from ``start``, of the instances on, busy shares over the makespan)."""
    blocks = meta.get("num_blocks") or 0
    instances = meta.get("instances") or 1
    per_instance_blocks = blocks / instances
    on = on_share(meta, start, start + window)
    m["kv_usage"] = {  # mean over all blocks; peak of the fullest instance; time share averaged over instances
        "mean": c["kv_block_ms"] / (blocks * window * on) if blocks and window > 0 else float("nan"),
        "peak": c["kv_peak_blocks"] / per_instance_blocks if blocks else float("nan"),
        "time_above_90": c["kv_above_ms"] / (window * instances * on) if window > 0 else float("nan"),
    }
    m["num_preemptions"] = int(c["num_preemptions"])
    m["requeues"] = int(c.get("requeues", 0))
    m["preemptions"] = {
        "recompute": int(c["recompute_preemptions"]),
        "in_flight": int(c["in_flight_preemptions"]),
        "swap": int(c["swap_preemptions"]),
        "recomputed_tokens": int(c["recomputed_tokens"]),
        "discarded_tokens": int(c.get("discarded_tokens", 0)),
        "swap_failures": int(c["swap_failures"]),
        "swapped_out_blocks": int(c["swap_out_blocks"]),
        "swapped_in_blocks": int(c["swap_in_blocks"]),
        "swapped_out_bytes": int(c["swap_out_blocks"]) * int(meta.get("bytes_per_block") or 0),
        "swapped_in_bytes": int(c["swap_in_blocks"]) * int(meta.get("bytes_per_block") or 0),
        "swap_transfer_ms": float(c["swap_transfer_ms"]),
        # the prefix-cache lookups of previously preempted requests' re-admissions (their own blocks
        # found again), kept out of prefix_cache as vLLM's PrefixCacheStats and SGLang's cache_hit_rate
        # keep them out
        "prefix_queries": int(c.get("prefix_preempted_queries", 0)),
        "prefix_hits": int(c.get("prefix_preempted_hits", 0)),
        "prefix_host_hits": int(c.get("prefix_preempted_host_hits", 0)),
    }
    host = {name: c.get(name, 0) for name in ("host_hits", "host_load_blocks", "host_load_ms", "host_store_blocks",
                                               "host_evictions")}  # zero without a host tier
    queries, hits, host_hits = int(c["prefix_queries"]), int(c["prefix_hits"]), int(host["host_hits"])
    bytes_per_block = int(meta.get("bytes_per_block") or 0)

    def rate(n):
        return n / queries if queries else float("nan")

    m["prefix_cache"] = {  # hits per tier: the GPU's, and the host-memory tier's (reloaded)
        "queries": queries, "hits": hits, "hit_rate": rate(hits),
        "gpu_hits": hits - host_hits, "gpu_hit_rate": rate(hits - host_hits),
        "host_hits": host_hits, "host_hit_rate": rate(host_hits),
        "host_loaded_blocks": int(host["host_load_blocks"]),
        "host_loaded_bytes": int(host["host_load_blocks"]) * bytes_per_block,
        "host_load_ms": float(host["host_load_ms"]),
        "host_stored_blocks": int(host["host_store_blocks"]),
        "host_stored_bytes": int(host["host_store_blocks"]) * bytes_per_block,
        "host_evicted_blocks": int(host["host_evictions"]),
    }
    if meta.get("speculative"):
        m["speculative"] = speculative_metrics(c)
    m["gpus"] = int(meta.get("gpus") or instances)
    if meta.get("pools"):
        m["pools"] = {name: _pool_metrics(pool, makespan, window, on_share(meta, start, start + makespan, name),
                                          on_share(meta, start, start + window, name))
                      for name, pool in meta["pools"].items()}
        # pools differ in size: the fullest instance's share is its own pool's, not the mean size's
        m["kv_usage"]["peak"] = max(float(pool["kv_peak_share"]) for pool in meta["pools"].values())


def _cost_metrics(c: dict[str, float], totals: tuple[float, float] | None) -> dict[str, float]:
    """Where the busy time went, and (``totals``: the cost model's prefill and decode ms summed
    over the finished requests) seed 001's per-request cost decomposition."""
    busy = c["busy_ms"]
    cost = {"prefill_time_share": c["prefill_iteration_ms"] / busy if busy else float("nan"),
            "decode_time_share": c["decode_only_ms"] / busy if busy else float("nan")}
    if totals is not None:
        total_pre, total_dec = totals
        cost.update(total_prefill_ms=total_pre, total_decode_ms=total_dec,
                    decode_share=total_dec / (total_pre + total_dec) if total_pre + total_dec else float("nan"))
    return cost


def _pool_queues(m: dict[str, Any]) -> None:
    """A disaggregated run's queueing per pool: admission to prefill, and the decode side's."""
    m["pools"]["prefill"]["queue_ms"] = m["queue_ms"]
    m["pools"]["decode"]["queue_ms"] = m["transfer"].pop("decode_queue_ms")


def _fairness(m: dict[str, Any]) -> None:
    m["fairness"] = {"clients": len(m["per_client"]),
                     "jain_service": jain_index([v["service"] for v in m["per_client"].values()]),
                     "jain_service_rate": jain_index([v["service_rate"] for v in m["per_client"].values()])}


def compute_streamed_metrics(stats, counters: dict[str, float], itl, meta: dict[str, Any]) -> dict[str, Any]:
    """The metrics of a run whose rows were streamed (:class:`schedlab.results.stream.StreamedRequests`):
    the same names as :func:`compute_metrics`, percentiles from its sketches (``itl``: a
    :class:`~schedlab.results.sketch.Summary` of the inter-token latencies), the saturation
    check on its sample of rows."""
    run = stats.run
    n_all, n_ok = run.requests, run.finished
    makespan = stats.last_served - stats.first_arrival if stats.last_served > -math.inf else 0.0
    seconds = makespan / 1e3
    m = _run_metrics(stats.counts(), run.generated, makespan, stats.waiting_ms, counters, meta, stats.first_arrival)
    for name, summary in run.latency.items():
        m[name] = summary.result()
    m["itl_ms"] = itl.result()
    m["client"] = stats.client_view()
    m["client"]["itl_ms"] = m["itl_ms"]
    _engine_metrics(m, counters, meta, makespan, kv_window(counters, stats.first_arrival, makespan),
                    stats.first_arrival)
    m["prefill_chunks"] = {"mean": stats.chunks_sum / n_ok if n_ok else float("nan"), "max": stats.chunks_max}
    m["cost"] = _cost_metrics(counters, tuple(stats.cost) if stats.costed and n_ok else None)
    m["rejection_reasons"] = dict(stats.reasons)
    if meta.get("pools"):
        m["transfer"] = {"transfers": stats.transfers, "bytes": stats.transfer_bytes,
                         **{name: s.result() for name, s in stats.transfer.items()},
                         "aborted": dict(stats.aborted_places)}
        _pool_queues(m)
    slo = meta.get("slo") or {}

    def group_metrics(group, with_slo: bool) -> dict[str, Any]:
        out = {"requests": group.requests, "finished": group.finished, "generated_tokens": group.generated,
               # (none made: 0, as an exact run's group says it; it was NaN here: review s81 diffuzz)
               "throughput_tps": group.generated / seconds if seconds > 0 else (0.0 if not group.generated
                                                                                 else float("nan"))}
        for name, summary in group.latency.items():
            out[name] = summary.result()
        if with_slo:
            out["slo"] = _attainment(group.met, group.requests, seconds)
        return out

    if slo:
        m["slo"] = _attainment(run.met, n_all, seconds)
    energy = meta.get("energy")
    if energy:  # a run with [power] (schedlab.energy)
        m["energy"] = energy_totals(energy, stats.energy.generated, stats.energy.finished, stats.energy.shares.result(),
                                    stats.energy.j)
    if _named_classes([str(k) for k in stats.classes]):
        m["per_class"] = {str(k): group_metrics(g, bool(slo)) for k, g in sorted(stats.classes.items())}
        if energy:
            for k, g in sorted(stats.classes.items()):
                m["per_class"][str(k)]["energy"] = energy_shares(g.energy_j, g.finished, g.generated)
    instances = meta.get("instances") or 1
    _fleet_metrics(m, meta, engine_end_ms(counters, stats.last_served if stats.last_served > -math.inf else 0.0),
                   stats.hour_requests, stats.hour_met, bool(slo))
    sample = stats.sample_columns()
    rows = int(sample["id"].size)  # (each sampled row stands for requests / rows of the run's)
    m["stability"], per_instance_stability = run_stability(sample, instances,
                                                           stats.counts()["requests"] / rows if rows else 1.0)
    m["stability"]["from_sample"] = int(sample["id"].size)
    if instances > 1:
        from .stream import Group

        m["per_instance"] = {str(k): group_metrics(stats.instances.get(k, Group()), bool(slo))
                             for k in range(instances)}
        for k, part in enumerate(per_instance_stability):
            m["per_instance"][str(k)]["stability"] = part
    if len(stats.clients) > 1:
        m["per_client"] = {client: _service(*entry) for client, entry in sorted(stats.clients.items())}
        _fairness(m)
    return m


def speculative_metrics(c: dict[str, float]) -> dict[str, float]:
    """Speculative decoding, named as vLLM reports it (``spec_decode/metrics.py``):
    ``acceptance_rate`` = accepted / verified draft tokens; ``mean_acceptance_length`` = 1 +
    accepted drafts per sequence step that verified drafts (the target's own token included);
    ``tokens_per_step`` = decode tokens per sequence decode step, steps without drafts too."""
    drafts, draft_tokens, accepted = int(c["spec_drafts"]), int(c["spec_draft_tokens"]), int(c["spec_accepted_tokens"])
    steps = int(c["decode_seq_steps"])
    nan = float("nan")
    return {
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "drafts": drafts,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else nan,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else nan,
        "tokens_per_step": c["decode_tokens"] / steps if steps else nan,
        "decode_steps": steps,
    }


# -- disaggregated prefill and decode (DistServe, vLLM P/D) ---------------------------------------------


def _pool_metrics(pool: dict, makespan: float, window: float, on: float = 1.0,
                  kv_on: float = 1.0) -> dict[str, Any]:
    """One pool's size and load: the share of the makespan its instances were busy, and its KV usage
    (``on``, ``kv_on``: the share of its instances' time they were on, over each span)."""
    n = pool["instances"]
    return {
        "instances": n,
        "gpus": pool["gpus"],
        "iterations": int(pool["iterations"]),
        "busy_share": pool["busy_ms"] / (makespan * n * on) if makespan > 0 else float("nan"),
        "kv_usage_mean": (pool["kv_block_ms"] / (pool["num_blocks"] * window * kv_on)
                          if window > 0 else float("nan")),
        "kv_usage_peak": float(pool["kv_peak_share"]),
    }


#: Where a disaggregated cluster's requests were when their clients gave up
#: (:mod:`schedlab.engine.transfer`, rule 4), the keys of ``transfer.aborted``.
ABORT_PLACES = ("prefilling", "prompt_done", "waiting_for_blocks", "pulling", "waiting_for_slot", "decoding")


def aborted_places(req: dict[str, np.ndarray]) -> dict[str, int]:
    """How many aborted requests were in each of :data:`ABORT_PLACES`, read from their rows: on
    the prefill side (the row's instance is its prefill instance) before or after its prompt was
    done (``kv_ready_ms``); on the decode side not yet pulled, pulling (its KV landed after the
    abort), landed without a running slot, or decoding."""
    aborted = req["aborted"] == 1
    prefill_side = aborted & (req["instance"] == req["prefill_instance"])
    decode_side = aborted & ~prefill_side
    pulled, joined = req["kv_pulled_ms"] >= 0, req["decode_joined_ms"] >= 0
    pulling = decode_side & pulled & ~joined & (req["kv_landed_ms"] > req["finish_ms"])
    done = req["kv_ready_ms"] >= 0
    places = (prefill_side & ~done, prefill_side & done,
              decode_side & ~pulled, pulling, decode_side & pulled & ~joined & ~pulling, decode_side & joined)
    return {name: int(mask.sum()) for name, mask in zip(ABORT_PLACES, places)}


def _transfer_metrics(req: dict[str, np.ndarray], ok: np.ndarray) -> dict[str, Any]:
    """KV transfers of the finished requests that moved to a decode instance: how many, bytes,
    the wait for decode capacity (handed over by the prefill instance -- its prompt done -- to
    blocks allocated), the transfer itself (blocks allocated to KV landed, link queueing
    included), the wait for a running slot (landed to joined), and the decode stage's whole
    queueing (handed over to joined)."""
    moved = ok & (req["kv_pulled_ms"] >= 0)
    first, pulled = req["kv_ready_ms"][moved], req["kv_pulled_ms"][moved]
    landed, joined = req["kv_landed_ms"][moved], req["decode_joined_ms"][moved]
    return {
        "transfers": int(moved.sum()),
        "bytes": int(req["kv_bytes"][moved].sum()),
        "kv_wait_ms": summarize(pulled - first),
        "transfer_ms": summarize(landed - pulled),
        "join_wait_ms": summarize(joined - landed),
        "decode_queue_ms": summarize(joined - first),
        "aborted": aborted_places(req),
    }


# -- token-fair service (VTC's cost: Sheng et al., "Fairness in Serving LLMs", OSDI'24) ------------

SERVICE_INPUT_PRICE = 1.0   # per prompt token
SERVICE_OUTPUT_PRICE = 2.0  # per generated token


def jain_index(values) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when every x is equal, 1/n when
    one has everything (NaN for no values or all zero)."""
    x = np.asarray(values, dtype=float)
    squares = float((x * x).sum())
    return float(x.sum()) ** 2 / (x.size * squares) if x.size and squares > 0 else float("nan")


def client_service(req: dict[str, np.ndarray], input_price: float = SERVICE_INPUT_PRICE,
                   output_price: float = SERVICE_OUTPUT_PRICE) -> dict[str, dict[str, Any]]:
    """Per client, the service its finished requests received, ``input_price * prompt +
    output_price * generated`` tokens, and its rate: service per second from the client's
    first arrival to its last finish (0 if none finished). When every request finishes the
    totals do not depend on the scheduler; the rate shows who was served sooner (compare
    clients that stay backlogged)."""
    out: dict[str, dict[str, Any]] = {}
    ok = completed(req)
    for client in np.unique(req["client"]):
        mine = req["client"] == client
        done = mine & ok
        out[str(client)] = _service(
            int(mine.sum()), int(done.sum()), int(req["prompt_tokens"][done].sum()),
            int(req["generated_tokens"][done].sum()), float(req["arrival_ms"][mine].min()),
            float(req["finish_ms"][done].max()) if done.any() else -math.inf, input_price, output_price)
    return out


def _service(requests: int, finished: int, prompt: int, generated: int, first_arrival: float, last_finish: float,
             input_price: float = SERVICE_INPUT_PRICE, output_price: float = SERVICE_OUTPUT_PRICE) -> dict[str, Any]:
    """One client's service and its rate (see :func:`client_service`)."""
    service = input_price * prompt + output_price * generated
    span_ms = last_finish - first_arrival if finished else 0.0
    return {"requests": requests, "finished": finished, "prompt_tokens": prompt, "generated_tokens": generated,
            "service": service, "service_rate": service / (span_ms / 1e3) if span_ms > 0 else 0.0}


def _targets(slo: dict, klass: str | None) -> tuple[float, float]:
    table = slo.get("classes", {}).get(klass, {}) if klass is not None else {}
    return (float(table.get("ttft_ms", slo.get("ttft_ms", math.inf))),
            float(table.get("tpot_ms", slo.get("tpot_ms", math.inf))))


HOUR_MS = 3.6e6
#: Runs at least this long get per-hour figures (``hourly``).
HOURLY_FROM_MS = 2 * HOUR_MS


def arrival_hours(arrival_ms: np.ndarray) -> np.ndarray:
    """The hour of the run (0, 1, ...) each request arrived in."""
    return (np.asarray(arrival_ms, dtype=np.float64) // HOUR_MS).astype(np.int64)


def paid_intervals(meta: dict[str, Any], end_ms: float) -> list[tuple[float, float, int]]:
    """(on, off, GPUs) of every instance: an autoscaled cluster's intervals (a disaggregated
    cluster's per pool, whose instances may differ in GPUs), or the whole cluster from 0 to the
    end of the engine's work (:func:`engine_end_ms`)."""
    scaling = meta.get("scaling")
    if scaling and "pools" in scaling:
        return [(on, off, _gpus_each(meta["pools"][name])) for name, pool in scaling["pools"].items()
                for _, on, off in pool["intervals"]]
    if scaling:
        return [(on, off, _gpus_each(meta)) for _, on, off in scaling["intervals"]]
    return [(0.0, end_ms, meta.get("gpus") or meta.get("instances") or 1)]


def _gpus_each(meta: dict[str, Any]) -> float:
    """GPUs of one instance of a uniform cluster or pool (of one deployment of data-parallel
    ranks, which scales whole)."""
    units = (meta.get("data_parallel") or {}).get("deployments") or meta.get("instances") or 1
    return (meta.get("gpus") or meta.get("instances") or 1) / units


def _fleet(scaling: dict[str, Any], gpu_hours: float, end_ms: float) -> dict[str, Any]:
    """An autoscaler's decisions: GPU-hours, mean GPUs, the most and fewest instances serving at
    once (at every change: a tick's decisions and warm-ups between ticks, which a tick's count
    missed), scale-ups and -downs; with a drain timeout, the requests it aborted (``drain_aborted``)."""
    serving = [h[1] for h in scaling.get("serving") or scaling["history"]]
    fleet = {"gpu_hours": gpu_hours, "mean_gpus": gpu_hours * HOUR_MS / end_ms if end_ms else 0.0,
             "peak_serving": max(serving), "min_serving": min(serving),
             "scale_ups": scaling["scale_ups"], "scale_downs": scaling["scale_downs"]}
    if "drain_aborted" in scaling:  # (schedlab.engine.drain)
        fleet["drain_aborted"] = scaling["drain_aborted"]
    return fleet


def _fleet_metrics(m: dict[str, Any], meta: dict[str, Any], end_ms: float, hour_requests, hour_met,
                   with_slo: bool) -> None:
    """GPU-hours paid (``gpu_hours``); with an autoscaler, its decisions (``fleet``); for runs of
    two hours or more, requests, SLO attainment, GPU-hours and mean instances per hour of
    arrival (``hourly``)."""
    intervals = paid_intervals(meta, end_ms)
    m["gpu_hours"] = sum((off - on) * g for on, off, g in intervals) / HOUR_MS
    scaling = meta.get("scaling")
    if scaling:
        m["fleet"] = _fleet(scaling, m["gpu_hours"], end_ms)
    if scaling and "pools" in scaling:  # a disaggregated cluster: each pool's too (the totals above)
        m["fleet"]["pools"] = {
            name: _fleet(pool, sum(off - on for _, on, off in pool["intervals"]) * _gpus_each(meta["pools"][name])
                         / HOUR_MS, end_ms)
            for name, pool in scaling["pools"].items()}
    hour_requests = np.asarray(hour_requests, dtype=np.float64)
    hour_met = np.asarray(hour_met, dtype=np.float64)
    if end_ms < HOURLY_FROM_MS and (hour_requests.size - 1) * HOUR_MS < HOURLY_FROM_MS:
        return
    hourly = {}
    for h in range(max(int(math.ceil(end_ms / HOUR_MS)), hour_requests.size)):  # (a late arrival turned away too)
        lo, hi = h * HOUR_MS, (h + 1) * HOUR_MS
        paid = sum(max(0.0, min(off, hi) - max(on, lo)) * g for on, off, g in intervals) / HOUR_MS
        n = int(hour_requests[h]) if h < hour_requests.size else 0
        met = int(hour_met[h]) if h < hour_met.size else 0
        hourly[str(h)] = {"requests": n, "slo_attainment": met / n if n and with_slo else float("nan"),
                          "gpu_hours": paid}
    m["hourly"] = hourly


#: How far past its target a latency may be and still meet it, ms: a latency is a difference of
#: absolute times, rounded to their precision (1.5e-8 ms a day into a run), so a TTFT that is the
#: target by construction can read 10.000000000000028 against 10 (review s81 fleet, finding 2)
LATENCY_SLACK_MS = 1e-6


def request_met(slo: dict, *, ttft: bool = True, tpot: bool = True):
    """One request's SLO check, as :func:`slo_met` decides it for a whole run: a function of a
    sequence (either engine's) that left the engine and its client's view ``(first byte, done,
    timed out)`` (:func:`schedlab.frontend.client_times`; the autoscaler's window). A request its
    client gave up on meets nothing. ``ttft=False`` or ``tpot=False`` leaves that target out (a
    disaggregated cluster's pools are judged on their own part: :mod:`schedlab.engine.pool_scaling`)."""
    def met(seq, client: tuple[float, float, bool]) -> bool:
        first, done, timed_out = client
        if timed_out:
            return False
        ttft_target, tpot_target = _targets(slo, seq.request.request_class)
        if ttft and first - seq.request.sent_at > ttft_target + LATENCY_SLACK_MS:
            return False
        generated = seq.num_generated
        return not tpot or generated <= 1 or (done - first) / (generated - 1) <= tpot_target + LATENCY_SLACK_MS
    return met


def _slo_metrics(req, ok, slo: dict, seconds: float) -> dict[str, float]:
    """SLO attainment and ``goodput_rps``, requests per second meeting both their TTFT and TPOT
    targets as the client sees them (the engine's own without a front end), per second of the
    run's makespan, as its other rates. ``vllm bench serve --goodput``'s ``request_goodput``
    counts the same requests over its own duration, from one gap before the first send to the
    last response: a ``[target]`` compares it so (:func:`schedlab.targets._goodput`). DistServe's
    goodput is another number: the highest rate at which 90% of requests meet both, the
    ``goodput`` report's (:mod:`schedlab_plugins.reports.goodput`).
    Requests rejected or abandoned meet nothing: attainment counts them among all requests."""
    return _attainment(int(slo_met(req, ok, slo).sum()), int(req["id"].size), seconds)


def _attainment(met: int, n: int, seconds: float) -> dict[str, float]:
    return {"attainment": float(met / n) if n else float("nan"),
            "goodput_rps": float(met / seconds) if seconds > 0 else (0.0 if not met else float("nan")),
            "met": met}


def slo_met(req, ok, slo: dict) -> np.ndarray:
    """Per completed request (``ok``, :func:`completed`): whether it met its class's TTFT and
    TPOT targets as its client saw them (within :data:`LATENCY_SLACK_MS`)."""
    classes = req["request_class"][ok]
    generated = req["generated_tokens"][ok]
    client = client_latencies(req)
    ttft = client["ttft_ms"]
    tpot = np.zeros(ttft.size)
    tpot[generated > 1] = client["tpot_ms"]
    met = np.zeros(ttft.size, dtype=bool)
    for k in np.unique(classes):
        t_ttft, t_tpot = _targets(slo, str(k))
        sel = classes == k
        met[sel] = (ttft[sel] <= t_ttft + LATENCY_SLACK_MS) & (tpot[sel] <= t_tpot + LATENCY_SLACK_MS)
    return met


def _subset_metrics(req, sel, slo, run_seconds: float, classes: bool = False, *, measured=None,
                    window: tuple[float, float] | None = None) -> dict[str, Any]:
    """A class's or an instance's requests (``sel``); with a warm-up (``measured``: the rows the
    percentiles count), its latencies and ``slo.attainment`` over its measured requests, its
    throughput and goodput over the run's measured ``window`` (:func:`_window_rates`), its counts
    over all of them."""
    sub = {k: v[sel] for k, v in req.items()}
    ok = completed(sub)
    generated = int(sub["generated_tokens"][ok].sum())
    out: dict[str, Any] = {
        "requests": int(sel.sum()),
        "finished": int(ok.sum()),
        "generated_tokens": generated,
        # (none made: 0 per second whatever the span, as the run's own throughput_tps says it)
        "throughput_tps": generated / run_seconds if run_seconds > 0 else (0.0 if not generated else float("nan")),
    }
    stats = sub
    if measured is not None:
        stats = {k: v[measured[sel]] for k, v in sub.items()}
        out["throughput_tps"] = _window_rates(sub, window)[0]
    lat = request_latencies(stats)
    for name in LATENCY_NAMES:
        out[name] = summarize(lat[name])
    if slo:
        out["slo"] = _slo_metrics(sub, ok, slo, run_seconds) if measured is None else \
            _measured_slo(sub, measured[sel], slo, window)
    return out


#: the class of a request whose workload names none
DEFAULT_CLASS = attrs.fields(Request).request_class.default


def _named_classes(classes: list[str]) -> bool:
    """Whether a run gets ``per_class`` metrics: several request classes, or one a workload named
    (a baseline run of one class then sits in the same table columns as the mixed runs)."""
    return len(classes) > 1 or (len(classes) == 1 and classes[0] != DEFAULT_CLASS)
