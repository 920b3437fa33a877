"""The ``trace`` report: each run as a Chrome / Perfetto trace-event file, read as GPU traces are.

``traces/<run>.json`` opens in https://ui.perfetto.dev or ``chrome://tracing``:

* one process per instance (``instance N``);
* on its ``iterations`` thread every engine event as a slice: a prefill, a mixed or a decode
  iteration -- a run of identical decode iterations the fast engine ran at once is one slice
  ``decode xK`` -- with its batch (decodes, prefills, prefill tokens) in the slice's arguments;
* each request's spans as nested async slices: ``request <id>`` around ``queued`` (arrival to first
  scheduled), ``prefill`` (to its first token) and ``decode`` (to its finish); in a disaggregated
  cluster the prefill instance holds ``queued`` and ``prefill``, the decode instance ``kv transfer``
  and ``decode``; a rejected request is an instant event with its reason; a request aborted (its
  client gave up) has no span for a step it never reached -- never scheduled, it is ``queued`` until
  the abort; without a first token, in ``prefill`` until the abort -- and an instant ``aborted <id>``;
* counters ``KV blocks`` (in use) and ``requests`` (running, waiting), sampled at every engine event.

Times are microseconds of simulated time. The format is the Trace Event Format's JSON object form
(``traceEvents``; phases ``X`` complete, ``b``/``e`` nestable async, ``C`` counter, ``i`` instant,
``M`` metadata). Requests are spans of their first scheduling, first token and finish: a preempted
request's later waits are inside its ``prefill`` or ``decode`` span.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import numpy as np

from schedlab.configs import bool_field, int_field
from schedlab.results.file_names import UniqueStems, safe_stem
from schedlab.results.storage import atomic_write

ITERATIONS_TID = 1
REQUESTS_CAT = "request"


@attrs.frozen
class TraceConfig:
    max_runs: int = int_field(20, min=1, help="most runs written (single runs first, in file order)")
    requests: bool = bool_field(True, help="each request's queued / prefill / decode spans")
    max_requests: int = int_field(200_000, min=0, help="most requests given spans per run (the first by id)")


class TraceReport:
    """Writes ``traces/<run>.json`` for every run (up to ``max_runs``) that kept a timeline."""

    def __init__(self, config: TraceConfig | None = None):
        self.config = config or TraceConfig()

    def write(self, results, out_dir) -> list[Path]:
        written = []
        runs = [r for r in results.all_runs() if r.timeline.get("time_ms", np.empty(0)).size]
        stems = UniqueStems()
        for run in runs[:self.config.max_runs]:
            stem = stems.take(safe_stem(run.name))
            path = Path(out_dir) / "traces" / f"{stem}.json"
            atomic_write(path, json.dumps(trace_events(run, self.config), separators=(",", ":")))
            written.append(path)
        return written


def trace_events(run, config: TraceConfig | None = None) -> dict:
    """The run as a trace-event document (a dict ready for ``json.dumps``)."""
    config = config or TraceConfig()
    t = run.timeline
    events: list[dict] = []
    instances = sorted(set(int(i) for i in t["instance"].tolist())
                       | set(int(i) for i in run.requests["instance"].tolist()))
    for inst in instances:
        pid = inst + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"instance {inst}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": inst}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": ITERATIONS_TID,
                       "args": {"name": "iterations"}})
    events += _iteration_events(t)
    if config.requests:
        events += _request_events(run.requests, run.rejections, config.max_requests)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run": run.name, "time_unit": "microseconds of simulated time"}}


def _us(ms: float) -> float:
    return float(ms) * 1000.0


def _slice_name(k: int, decodes: int, prefills: int) -> str:
    if prefills and decodes:
        return "prefill + decode"
    if prefills:
        return "prefill"
    if decodes:
        return "decode" if k == 1 else f"decode x{k}"
    return "swap"  # an iteration of swap transfers only


def _iteration_events(t: dict) -> list[dict]:
    """A slice per timeline row and the counters at its start; counters fall to zero running at
    the end of an instance's last row."""
    out = []
    last_end: dict[int, float] = {}
    columns = [t[c].tolist() for c in ("time_ms", "instance", "duration_ms", "iterations", "decodes", "prefills",
                                        "prefill_tokens", "running", "waiting", "kv_used")]
    for start, inst, dur, k, dec, pre, ptok, running, waiting, kv in zip(*columns):
        pid = int(inst) + 1
        k, dec, pre = int(k), int(dec), int(pre)
        ts = _us(start)
        out.append({"ph": "X", "name": _slice_name(k, dec, pre), "cat": "iteration", "pid": pid,
                    "tid": ITERATIONS_TID, "ts": ts, "dur": _us(dur),
                    "args": {"iterations": k, "decodes": dec, "prefills": pre, "prefill_tokens": int(ptok)}})
        out.append({"ph": "C", "name": "KV blocks", "pid": pid, "ts": ts, "args": {"used": int(kv)}})
        out.append({"ph": "C", "name": "requests", "pid": pid, "ts": ts,
                    "args": {"running": int(running), "waiting": int(waiting)}})
        last_end[pid] = max(last_end.get(pid, 0.0), start + dur)
    for pid, end in last_end.items():
        out.append({"ph": "C", "name": "requests", "pid": pid, "ts": _us(end), "args": {"running": 0, "waiting": 0}})
    return out


def _span(events: list, name: str, pid: int, ident: str, start: float, end: float, args: dict | None = None) -> None:
    begin = {"ph": "b", "name": name, "cat": REQUESTS_CAT, "pid": pid, "tid": 0, "id": ident, "ts": _us(start)}
    if args:
        begin["args"] = args
    events.append(begin)
    events.append({"ph": "e", "name": name, "cat": REQUESTS_CAT, "pid": pid, "tid": 0, "id": ident, "ts": _us(end)})


def _request_events(req: dict, rejections: dict, limit: int) -> list[dict]:
    """Nested async spans per request (see the module doc)."""
    out: list[dict] = []
    order = np.argsort(req["id"], kind="stable")[:limit]
    get = {c: req[c][order].tolist() for c in ("id", "instance", "arrival_ms", "first_scheduled_ms", "first_token_ms",
                                                 "finish_ms", "rejected", "prompt_tokens", "generated_tokens",
                                                 "preemptions", "prefill_instance", "kv_landed_ms",
                                                 "decode_joined_ms", "kv_ready_ms")}
    aborted = req["aborted"][order].tolist() if "aborted" in req else [0] * len(order)
    timed_out = req["timed_out"][order].tolist() if "timed_out" in req else [0] * len(order)
    for i in range(len(order)):
        rid, inst = int(get["id"][i]), int(get["instance"][i])
        arrival, finish = get["arrival_ms"][i], get["finish_ms"][i]
        if get["rejected"][i]:
            out.append({"ph": "i", "s": "p", "name": f"rejected {rid}", "cat": REQUESTS_CAT, "pid": inst + 1,
                        "tid": 0, "ts": _us(arrival), "args": {"reason": rejections.get(rid, "")}})
            continue
        # a -1 (any negative time) is a step the request never reached: one aborted before it was
        # scheduled waits in ``queued`` until the abort, one aborted before its first token is in
        # ``prefill`` until the abort, and neither gets a ``decode`` span
        scheduled = _reached(get["first_scheduled_ms"][i])
        first = _reached(get["first_token_ms"][i])
        args = {"prompt_tokens": int(get["prompt_tokens"][i]), "generated_tokens": int(get["generated_tokens"][i]),
                "preemptions": int(get["preemptions"][i])}
        prefill_inst = int(get["prefill_instance"][i])
        abort_pid = inst + 1
        if prefill_inst >= 0 and prefill_inst != inst:  # disaggregated: two instances share the request
            ident = f"r{rid}p"
            ready = _reached(get["kv_ready_ms"][i])  # (handed over: the prompt done; the first token is
            if ready is None:                        # the decode side's with first_token = "decode")
                ready = first
            prefill_end = finish if ready is None else ready
            _span(out, f"request {rid}", prefill_inst + 1, ident, arrival, prefill_end, args)
            _nested(out, prefill_inst + 1, ident, _stages(arrival, scheduled, prefill_end))
            if ready is None:  # aborted on the prefill side: the decode instance never saw it
                abort_pid = prefill_inst + 1
            else:
                landed, joined = _reached(get["kv_landed_ms"][i]), _reached(get["decode_joined_ms"][i])
                ident = f"r{rid}d"
                _span(out, f"request {rid}", inst + 1, ident, ready, finish, args)
                transfer_end = min(finish, max(ready, landed if landed is not None else finish))
                spans = [("kv transfer", ready, transfer_end)]
                if landed is not None and joined is not None and first is not None:
                    spans.append(("decode", max(ready, joined), finish))
                _nested(out, inst + 1, ident, spans)
        else:
            ident = f"r{rid}"
            _span(out, f"request {rid}", inst + 1, ident, arrival, finish, args)
            spans = _stages(arrival, scheduled, finish if first is None else first)
            if first is not None:
                spans.append(("decode", first, finish))
            _nested(out, inst + 1, ident, spans)
        if aborted[i]:
            out.append({"ph": "i", "s": "p", "name": f"aborted {rid}", "cat": REQUESTS_CAT, "pid": abort_pid,
                        "tid": 0, "ts": _us(finish),
                        "args": {"reason": "client timeout" if timed_out[i] else "aborted by the engine"}})
    return out


def _reached(ms: float) -> float | None:
    """A request's time of a step, or None for a step it never reached (a negative sentinel)."""
    return None if ms < 0 or not math.isfinite(ms) else ms


def _stages(arrival: float, scheduled: float | None, end: float) -> list:
    """``queued`` (arrival to first scheduled) and ``prefill`` (to ``end``); never scheduled:
    ``queued`` to ``end`` alone."""
    if scheduled is None:
        return [("queued", arrival, end)]
    return [("queued", arrival, scheduled), ("prefill", scheduled, end)]


def _nested(events: list, pid: int, ident: str, spans: list) -> None:
    """Child spans of a request's outer span; empty ones (a one-token answer's decode) are left out.
    The outer span's end follows its children, so the end is moved behind them."""
    outer_end = events.pop()
    for name, start, end in spans:
        if end > start and math.isfinite(start) and math.isfinite(end):
            _span(events, name, pid, ident, start, end)
    events.append(outer_end)
