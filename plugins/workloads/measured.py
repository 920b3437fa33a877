"""Replay measured runs: vLLM per-request logs and ``vllm bench serve --save-result`` files.

* ``vllm_log`` -- one JSON object per line with ``input_toks``, ``output_toks`` and vLLM's
  per-request timestamps ``queued_ts``, ``scheduled_ts``, ``first_token_ts``,
  ``last_token_ts`` (seconds on the engine's clock, as vLLM's ``RequestStateStats`` keeps
  them; LLMServingSim's ``bench`` writes them so). Requests arrive when the engine received
  them, and the measured TTFT and latency count from there (:func:`engine_arrivals`): vLLM
  stamps ``queued_ts`` when its engine loop takes the request from its input queue, between two
  steps, so a request that reached the engine during a step waited for that step's end before
  it -- a wait the simulated engine has of its own (an arrival during a step is planned at the
  next one). Replayed at ``queued_ts``, a request would arrive up to a step late and wait that
  step again. A log with vLLM's ``arrival_time`` (the client's stamp, wall clock) gives each
  request's receipt as ``arrival_time`` + the log's smallest ``queued_ts - arrival_time`` (the
  two clocks' offset and the fastest hand-off); ``arrivals = "queued_ts"`` keeps vLLM's own
  queued-to-first-token view. Prompts' token ids -- an ``input_tok_ids`` field in the log or, line by line, in
  a ``prompts`` file (LLMServingSim's workload JSONL) -- become prefix block ids
  (:func:`prefix_block_ids`), so prefix caching sees the sharing the real run saw; a log may
  also carry those ids already (``block_hashes``). A line whose timestamps are all null (the
  bench runner's record of a request that came back with no metrics: it failed) is left out,
  with a warning that counts them.
* ``vllm_bench`` -- the JSON ``vllm bench serve --save-result --save-detailed`` writes
  (:func:`load_vllm_bench`). Its client is replayed as it ran: each request due when it was
  sent less its wait for a ``--max-concurrency`` slot, sent when a slot is free
  (:mod:`.capped`), or at the recorded send times when there was no cap. Files without
  ``start_times`` get arrivals drawn again as vLLM's ``get_request`` draws them
  (:func:`redraw_arrivals_ms`: a gap before every request, the first included, gamma with shape
  ``burstiness`` at the mean rate, evenly spaced for ``--burstiness inf``, the sums rescaled so
  that the last request goes ``n / request_rate`` after the benchmark's start; all at t = 0 for
  an infinite rate; with ``--ramp-up-strategy`` each gap at the rate vLLM ramps to for that
  request, not rescaled) from the run's seed, in ms from the benchmark's start, sent under the
  file's ``--max-concurrency`` cap when it has one.
  A capped file without ``queue_times`` (older clients) does not say when each request became
  due, as vLLM takes ``start_time`` after the wait for a slot: at an infinite rate all were due
  at once, so all are due at 0 in file order and the cap paces them; at a finite rate the
  arrivals are drawn again, with a warning. A file ``--append-result`` wrote several results
  into gives its last (``index`` picks another). Its latencies are the client's, and so is the
  comparison; the server's own per-request TTFT and queue time, when it sent them, are compared
  with the simulated engine's. A run that did not stream (no request of several tokens has an
  inter-token latency) has no TTFT of its own: its TTFT and TPOT are left out, with a warning.
  Failed requests (a non-empty ``errors`` entry) are left out with a one-line warning that counts
  them, and counted in ``workload.info["failed"]``.

Both read UTF-8 files with or without a byte order mark, gzip-compressed or not, and keep the
measured latencies (:class:`MeasuredRequests`, ``workload.measured``) so a run can be compared
with the real one (:mod:`schedlab.results.compare`).
"""

from __future__ import annotations

import gzip
import hashlib
import math
import warnings
import zlib
from pathlib import Path

import attrs
import numpy as np

from schedlab.configs import MAX_TIME_MS, MAX_TOKENS, bound_text, int_field, is_finite_number, path_field, str_field
from schedlab.errors import InputWarning, WorkloadError
from schedlab.targets import bench_first_gap_s

from .arrivals import unit_gaps
from .capped import CappedRequests, CappedWorkload
from .columns import OpenLoopWorkload, RequestColumns
from .records import check_regular_file, gzip_problem, jsonl_objects, open_text, read_json_documents, show_value


@attrs.frozen(eq=False)
class MeasuredRequests:
    """What a real run measured, one entry per request (ms; NaN where not measured).

    TTFT is first token - arrival, TPOT ``(last token - first token) / (output - 1)`` (NaN for
    one-token outputs, as in schedlab's metrics), latency last token - arrival. ``view`` says
    whose times they are: ``"engine"`` (a server log: from the request's arrival at the engine)
    or ``"client"`` (a load generator: from sending the request to its first and last byte);
    simulated runs are compared in the same view (:mod:`schedlab.results.compare`).
    ``arrival_ms`` orders the requests as the replay numbers them.
    """

    source: str
    arrival_ms: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    output_tokens: np.ndarray
    scheduled_ms: np.ndarray | None = None  # first scheduled (vLLM's scheduled_ts), if logged
    view: str = "engine"
    server_ttft_ms: np.ndarray | None = None   # a client's file: the server's own TTFT per request, if sent
    server_queue_ms: np.ndarray | None = None  # ... and its queue time (vLLM's per-request metrics)
    #: the GPUs' power over the run where the file records it (an ML.ENERGY benchmark's): ms from
    #: the requests' start, and W summed over the GPUs; and the run's steady state, (start, end) ms
    power: tuple[np.ndarray, np.ndarray] | None = None
    steady_ms: tuple[float, float] | None = None
    #: the server's own running and waiting requests over time, where the file (or one beside it)
    #: records them -- an ML.ENERGY run's /metrics scrapes: ``(ms, running, waiting)``
    occupancy: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    #: a ``vllm bench serve`` replay: when the benchmark started on the replay's clock (ms; where its
    #: duration starts, one first gap before its first send: :func:`schedlab.targets.bench_first_gap_s`),
    #: so a ``[target]`` takes the simulated run's duration as vLLM takes it; None where not known
    bench_start_ms: float | None = None
    #: a vllm_log: where its arrivals came from, ``"arrival_time"`` (the receipt at the engine) or
    #: ``"queued_ts"`` (when the engine loop took each request) (:func:`engine_arrivals`)
    arrivals_from: str | None = None

    @property
    def first_token_ms(self) -> np.ndarray:
        return self.arrival_ms + self.ttft_ms

    @property
    def finish_ms(self) -> np.ndarray:
        return self.arrival_ms + self.e2e_ms


def prefix_block_ids(token_lists, block_tokens: int = 16) -> list[tuple[int, ...]]:
    """Prefix block ids of prompts, as vLLM's prefix cache identifies blocks.

    Each full block of ``block_tokens`` tokens is named by a hash of its tokens chained with
    its parent's hash (vLLM ``hash_block_tokens``), so two prompts get the same id for block
    ``j`` exactly when their first ``(j + 1) * block_tokens`` tokens are equal. The hashes are
    then numbered 0, 1, 2, ... in order of first appearance (small ids, stable across Python
    versions). A trailing partial block gets no id (vLLM caches only full blocks).
    """
    numbering: dict[bytes, int] = {}
    out = []
    for tokens in token_lists:
        parent = b""
        ids = []
        for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
            block = np.asarray(tokens[start:start + block_tokens], dtype="<i8").tobytes()
            parent = hashlib.blake2b(parent + block, digest_size=16).digest()
            ids.append(numbering.setdefault(parent, len(numbering)))
        out.append(tuple(ids))
    return out


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """The objects of a JSONL file (UTF-8, a byte order mark skipped, gzip decompressed)."""
    check_regular_file(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: file not found")
    try:
        with open_text(path) as fh:
            rows = list(jsonl_objects(fh, str(path)))
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise gzip_problem(str(path), exc) from None
    if not rows:
        raise WorkloadError(f"{path}: no requests in the file")
    return rows


#: What a vllm_log line holds (said when one lacks a field): LLMServingSim's bench runner's layout.
LOG_FIELDS = ("input_toks, output_toks and the timestamps queued_ts, first_token_ts, last_token_ts (seconds; "
              "scheduled_ts optional)")


def _number(path, line, row, key, *, whole=False, minimum=None, maximum=None):
    if key not in row:
        raise WorkloadError(f"{path}: line {line}: missing field {key!r} (a vllm_log line has {LOG_FIELDS})")
    value = row[key]
    if not is_finite_number(value):
        raise WorkloadError(f"{path}: line {line}: {key}: must be a number, got {show_value(value)}")
    if whole and value != int(value):
        raise WorkloadError(f"{path}: line {line}: {key}: must be a whole number, got {value!r}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{path}: line {line}: {key}: must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise WorkloadError(f"{path}: line {line}: {key}: must be at most {bound_text(maximum)}, got {value!r}")
    return int(value) if whole else float(value)


def _token_ids(path, line, row, key="input_tok_ids"):
    ids = row.get(key)
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise WorkloadError(f"{path}: line {line}: {key}: must be a list of whole numbers")
    return ids


TIMESTAMPS = ("queued_ts", "first_token_ts", "last_token_ts")
#: Where a vllm_log's arrivals come from (:func:`engine_arrivals`).
ARRIVALS = ("auto", "arrival_time", "queued_ts")
#: A request taken more than this after its receipt is not a step's wait: said (the stamps may not match).
RECEIPT_WAIT_WARN_S = 10.0


@attrs.frozen
class VllmLogConfig:
    path: str = path_field(help="vLLM per-request log (JSONL: input_toks, output_toks, queued_ts, "
                                "first_token_ts, last_token_ts)")
    prompts: str | None = path_field(None, optional=True,
                                     help="JSONL with each request's input_tok_ids, line by line in the log's "
                                          "order (e.g. the workload file the run replayed)")
    hash_block_tokens: int = int_field(16, min=1, help="tokens per prefix block id (vLLM's block size)")
    start: int = int_field(0, min=0, help="skip the first N requests of the log (arrivals then count from "
                                          "the first one kept; the part is replayed alone, lighter than it "
                                          "ran: to score part of a run, replay it whole with calibrate --part)")
    limit: int | None = int_field(None, min=1, optional=True, help="use only N requests (after start)")
    arrivals: str = str_field("auto", choices=ARRIVALS,
                              help="when requests reached the engine: 'arrival_time' (vLLM's arrival_time, on the "
                                   "engine's clock by the log's smallest queued_ts - arrival_time), 'queued_ts' "
                                   "(when the engine loop took them, between steps: up to a step late), 'auto' "
                                   "(arrival_time when every line has it)")


def engine_arrivals(path, queued: np.ndarray, sent: np.ndarray, mode: str, lines) -> tuple[np.ndarray, str]:
    """Each request's receipt at the engine on the engine's clock (seconds), and what it came from.

    vLLM records ``queued_ts`` in ``Scheduler.add_request``, which its engine loop calls from
    ``EngineCore._process_input_queue`` between steps (vLLM 0.19-0.33); ``arrival_time`` is
    stamped by the client side (``InputProcessor``, ``time.time()``) before the request is sent
    to the engine process. Their difference is the clocks' offset plus the hand-off plus the wait
    for the loop; its smallest value over the log is taken as offset plus the fastest hand-off, so
    ``arrival_time`` + that minimum is the receipt, never after ``queued_ts``."""
    have = np.isfinite(sent)
    if mode == "auto" and have.any() and not have.all():   # (one line without it moves every request)
        line = lines[int(np.flatnonzero(~have)[0])]
        warnings.warn(f"{path}: {int((~have).sum())} of the {len(have)} lines have no arrival_time (the first: line "
                      f"{line}), so every request arrives at its queued_ts (when the engine loop took it, up to a "
                      "step late); arrivals = 'queued_ts' says so, or give every line its arrival_time",
                      InputWarning, stacklevel=3)
    if mode == "queued_ts" or (mode == "auto" and not have.all()):
        return queued, "queued_ts"
    if not have.all():
        line = lines[int(np.flatnonzero(~have)[0])]
        raise WorkloadError(f"{path}: line {line}: arrival_time: missing or not a number (arrivals = "
                            "'arrival_time' needs it on every line; 'queued_ts' replays from when the engine took "
                            "each request)")
    gap = queued - sent
    receipt = sent + gap.min()
    _check_span(path, receipt.min(), [receipt, queued])   # (an absurd stamp is said as such, not as a wait)
    wait = queued - receipt
    if wait.max() > RECEIPT_WAIT_WARN_S:
        warnings.warn(f"{path}: a request's queued_ts is {wait.max():.3g} s after its arrival_time (the log's "
                      f"smallest gap taken as the clocks' offset; {np.median(wait) * 1e3:.3g} ms the median): "
                      "vLLM's engine loop takes a request at the end of a step -- are arrival_time and queued_ts "
                      "the same requests' stamps? arrivals = 'queued_ts' replays from queued_ts instead",
                      InputWarning, stacklevel=3)
    return receipt, "arrival_time"


def load_vllm_log(path, *, prompts=None, hash_block_tokens: int = 16, start: int = 0, limit: int | None = None,
                  arrivals: str = "auto"):
    """``(arrival_ms, columns, measured)`` of a vLLM per-request log (see the module docstring).
    Prefix block ids are computed over the whole log, so a part shares ids with the rest."""
    path = Path(path)
    rows = _read_jsonl(path)
    keep = slice(start, None if limit is None else start + limit)
    n = len(rows)
    failed = np.zeros(n, dtype=bool)  # no timestamps at all: the runner got no metrics back
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    stamps = {key: np.empty(n) for key in TIMESTAMPS}
    scheduled = np.empty(n)
    sent = np.full(n, np.nan)  # vLLM's arrival_time, where the line has it
    token_lists: list = []
    given_ids: list = []
    seen: dict = {}  # request_id -> line: vLLM logs each request once; twice is a doubled file
    for i, (line, row) in enumerate(rows):
        rid = row.get("request_id")
        if isinstance(rid, (str, int)) and not isinstance(rid, bool):
            if rid in seen:
                raise WorkloadError(f"{path}: line {line}: request_id {str(rid)[:80]!r} is already on line "
                                    f"{seen[rid]} (a log lists each request once: is the file doubled?)")
            seen[rid] = line
        if all(row.get(key, 0) is None for key in TIMESTAMPS):
            failed[i] = True
            prompt[i] = output[i] = 0
            token_lists.append(None)
            given_ids.append(None)
            continue
        prompt[i] = _number(path, line, row, "input_toks", whole=True, minimum=1, maximum=MAX_TOKENS)
        output[i] = _number(path, line, row, "output_toks", whole=True, minimum=1, maximum=MAX_TOKENS)
        for key in TIMESTAMPS:
            stamps[key][i] = _number(path, line, row, key)
        scheduled[i] = _number(path, line, row, "scheduled_ts") if "scheduled_ts" in row else np.nan
        if row.get("arrival_time") is not None:
            sent[i] = _number(path, line, row, "arrival_time")
        if not stamps["queued_ts"][i] <= stamps["first_token_ts"][i] <= stamps["last_token_ts"][i]:
            raise WorkloadError(f"{path}: line {line}: timestamps out of order "
                                f"(need queued_ts <= first_token_ts <= last_token_ts)")
        if "scheduled_ts" in row and not stamps["queued_ts"][i] <= scheduled[i] <= stamps["first_token_ts"][i]:
            raise WorkloadError(f"{path}: line {line}: scheduled_ts out of order (need queued_ts <= scheduled_ts <= "
                                f"first_token_ts: a request is scheduled after it is queued, before its first token)")
        ids = _token_ids(path, line, row)
        if ids is not None and len(ids) != prompt[i]:
            raise WorkloadError(f"{path}: line {line}: {len(ids)} input_tok_ids for input_toks = {prompt[i]} "
                                "(a prompt's token ids are its tokens, one each)")
        token_lists.append(ids)
        hashes = row.get("block_hashes")
        if hashes is not None and (not isinstance(hashes, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes)):
            raise WorkloadError(f"{path}: line {line}: block_hashes: must be a list of whole numbers")
        if hashes is not None and len(hashes) > -(-prompt[i] // hash_block_tokens):
            raise WorkloadError(f"{path}: line {line}: block_hashes: {len(hashes)} ids for input_toks = {prompt[i]}, "
                                f"more than ceil({prompt[i]} / hash_block_tokens = {hash_block_tokens}) blocks (is "
                                "hash_block_tokens right?)")
        given_ids.append(tuple(hashes) if hashes is not None else None)
    if prompts is not None:
        prompt_rows = _read_jsonl(Path(prompts))[:n]
        if len(prompt_rows) < n:
            raise WorkloadError(f"{prompts}: {len(prompt_rows)} prompts for the {n} requests of {path}")
        token_lists = []
        for i, (line, row) in enumerate(prompt_rows[:n]):
            if failed[i]:
                token_lists.append(None)
                continue
            ids = _token_ids(prompts, line, row)
            if ids is None:
                raise WorkloadError(f"{prompts}: line {line}: missing field 'input_tok_ids'")
            if len(ids) != prompt[i]:
                raise WorkloadError(f"{prompts}: line {line}: {len(ids)} input_tok_ids but line {rows[i][0]} "
                                    f"of {path} has input_toks = {prompt[i]} (is it the same run, in order?)")
            token_lists.append(ids)
    if failed.any():
        lines = [rows[i][0] for i in np.flatnonzero(failed)]
        warnings.warn(f"{path}: {len(lines)} of the {n} requests have no timestamps (null: the run recorded no "
                      f"metrics for them), left out: line{'s' if len(lines) > 1 else ''} "
                      f"{', '.join(map(str, lines[:5]))}{' ...' if len(lines) > 5 else ''}", InputWarning, stacklevel=2)
        ok = ~failed
        prompt, output, scheduled, sent = prompt[ok], output[ok], scheduled[ok], sent[ok]
        stamps = {key: value[ok] for key, value in stamps.items()}
        token_lists = [t for t, bad in zip(token_lists, failed) if not bad]
        given_ids = [h for h, bad in zip(given_ids, failed) if not bad]
    if not len(prompt):
        raise WorkloadError(f"{path}: no request of the log has timestamps (every one failed): nothing to replay")
    if start >= len(prompt):
        raise WorkloadError(f"{path}: start = {start} skips all {len(prompt)} requests"
                            + (" with timestamps" if failed.any() else ""))
    per_row: dict = {}
    lines = [line for (line, _), bad in zip(rows, failed) if not bad]
    receipt, arrivals_from = engine_arrivals(path, stamps["queued_ts"], sent, arrivals, lines)  # (the whole log's offset)
    warn_cut_from_load(path, receipt, stamps["last_token_ts"], np.arange(len(receipt))[keep], "start and limit keep")
    receipt = receipt[keep]
    prompt, output, token_lists, given_ids = prompt[keep], output[keep], token_lists, given_ids[keep]
    scheduled = scheduled[keep]
    stamps = {key: value[keep] for key, value in stamps.items()}
    if any(t is not None for t in token_lists):
        ids = prefix_block_ids([t or [] for t in token_lists], hash_block_tokens)
        per_row["block_hashes"] = [h if t is not None else None for h, t in zip(ids, token_lists)][keep]
    elif any(h is not None for h in given_ids):
        per_row["block_hashes"] = given_ids
    constant = {"hash_block_tokens": hash_block_tokens} if per_row else {}
    _check_span(path, receipt.min(), [receipt, *stamps.values(), scheduled[np.isfinite(scheduled)]])
    arrival = (receipt - receipt.min()) * 1e3
    first, last = stamps["first_token_ts"], stamps["last_token_ts"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (last - first) * 1e3 / (output - 1), np.nan)
    if np.isfinite(tpot).any() and np.nanmedian(tpot) > 1e3:  # (a second a token: no server is that slow)
        warnings.warn(f"{path}: its median time per output token is {np.nanmedian(tpot) / 1e3:.4g} s: vllm_log "
                      "timestamps are seconds -- are these milliseconds?", InputWarning, stacklevel=2)
    measured = MeasuredRequests(str(path), arrival, (first - receipt) * 1e3, tpot, (last - receipt) * 1e3, output,
                                (scheduled - receipt.min()) * 1e3 if np.isfinite(scheduled).all() else None,
                                arrivals_from=arrivals_from)
    return arrival, RequestColumns(prompt, output, per_row, constant), measured


def warn_cut_from_load(path, begin: np.ndarray, end: np.ndarray, kept: np.ndarray, what: str) -> None:
    """A warning when requests kept from a measured run (``kept``: indices into every request's
    ``begin`` and ``end``, seconds) ran while requests left out were in the server: the part is
    replayed alone, lighter than it ran, and its measured latencies -- taken under the whole run's
    load -- are not its replay's to match (the compare report, a calibration's error)."""
    out = np.ones(len(begin), dtype=bool)
    out[kept] = False
    if not out.any() or not len(kept):
        return
    starts, ends = np.sort(begin[out]), np.sort(end[out])
    b, e = begin[kept], end[kept]
    # left-out requests begun before a kept one ends, less those ended before it began: overlapping it
    overlapping = int(np.count_nonzero(np.searchsorted(starts, e, "left") - np.searchsorted(ends, b, "right") > 0))
    if overlapping:
        warnings.warn(f"{path}: {what} {len(kept)} of its {len(begin)} requests, and {overlapping} of those ran while "
                      "requests left out were in the server: the part is replayed alone, lighter than it ran, so its "
                      "measured latencies (taken under the whole run's load) are not the replay's to match; to score "
                      "part of a run, replay it whole (schedlab calibrate --part)", InputWarning, stacklevel=3)


def _check_span(path, start: float, columns: list) -> None:
    """WorkloadError when a timestamp lies further from the earliest arrival (the replay's time 0)
    than the simulated clock reaches (1e12 ms); in ms such a span could overflow (1e308 s) with a
    numpy warning."""
    with np.errstate(over="ignore", invalid="ignore"):
        span = max(float(np.max(np.abs(column - start))) for column in columns if column.size)
    if not span * 1e3 <= MAX_TIME_MS:
        raise WorkloadError(f"{path}: the timestamps span {span:g} s from the earliest arrival, more than the simulated "
                            f"clock's {MAX_TIME_MS:g} ms (about 31.7 years)")


def make_vllm_log_workload(config: VllmLogConfig) -> OpenLoopWorkload:
    arrival, columns, measured = load_vllm_log(config.path, prompts=config.prompts,
                                               hash_block_tokens=config.hash_block_tokens, start=config.start,
                                               limit=config.limit, arrivals=config.arrivals)
    workload = OpenLoopWorkload(lambda seed: (arrival, columns), name="vllm_log", num_requests=len(columns))
    workload.measured = measured
    return workload


# --- vllm bench serve --save-result -----------------------------------------------------------

REPLAYS = ("client", "send_times", "redraw")
RAMP_UP_STRATEGIES = ("linear", "exponential")


class BenchReplayWarning(InputWarning):
    """A ``vllm bench serve`` file replayed otherwise than as the client ran, and why."""


@attrs.frozen
class VllmBenchConfig:
    path: str = path_field(help="the JSON `vllm bench serve --save-result --save-detailed` wrote")
    limit: int | None = int_field(None, min=1, optional=True, help="use only the first N requests")
    replay: str = str_field("client", choices=REPLAYS,
                            help="'client': as the client ran (each request due at its recorded send time less "
                                 "its wait for a slot, at most max_concurrency in flight); 'send_times': at the "
                                 "recorded send times, open loop; 'redraw': arrivals drawn again from request_rate "
                                 "(or the ramp-up) and burstiness, under max_concurrency (files without start_times)")
    index: int | None = int_field(None, min=0, optional=True,
                                  help="which result of a file holding several (--append-result writes one after "
                                       "another): 0 for the first; the last when not set")


@attrs.frozen(eq=False)
class BenchRun:
    """What a ``vllm bench serve`` result file says about the requests that succeeded (file order)."""

    rate: float
    burstiness: float            # inf: evenly spaced arrivals (--burstiness inf)
    max_concurrency: int | None
    columns: RequestColumns
    measured: MeasuredRequests
    sent_ms: np.ndarray | None   # recorded send times (start_times), ms from the first request due
    due_ms: np.ndarray | None    # when each was due: sent less its wait for a slot (queue_times)
    ramp: tuple[str, float, float] | None = None  # (--ramp-up-strategy, start rps, end rps)
    rows: np.ndarray | None = None   # each kept request's index in the file's lists (the ramp's request_index)
    total: int = 0                   # requests in the file, failed ones included (the ramp's total_requests)
    due_known: bool = True       # False: capped at a finite rate and no queue_times (due times not recorded)
    failed: int = 0                  # requests with an error (non-empty ``errors``): left out of the replay


def _check_seconds(path, data, ttft: np.ndarray) -> None:
    """Warn when the per-request ``ttfts`` (``ttft``: read as seconds, in ms) and the file's own
    ``mean_ttft_ms`` differ a hundredfold or more: ttfts written in milliseconds replayed with
    every error -99.9%."""
    mean = data.get("mean_ttft_ms")
    if not (is_finite_number(mean) and mean > 0 and len(ttft)):
        return
    ratio = float(np.mean(ttft)) / mean  # (ttft: the ttfts read as seconds, in ms)
    if not 0.01 < ratio < 100:
        warnings.warn(f"{path}: its ttfts average {float(np.mean(ttft)) / 1e3:.4g} s, its mean_ttft_ms says {mean:.4g} ms: "
                      "ttfts, itls and latencies are seconds (vllm bench serve's layout) -- are these milliseconds?",
                      InputWarning, stacklevel=3)


def _bench_list(path, data, key, n=None, *, required=True):
    """The per-request list ``key`` of a bench file: at the top level, or in SGLang's ``details``
    (:func:`_bench_details`)."""
    details = _bench_details(data)
    value = data.get(key) if data.get(key) is not None else details.get(key)
    if value is None and not required:
        return None
    if value is None:
        flag = "sglang.bench_serving --output-details" if _sglang_result(data) else "--save-detailed"
        raise WorkloadError(f"{path}: missing list {key!r} (save the result with {flag})")
    if not isinstance(value, list):
        raise WorkloadError(f"{path}: {key}: must be a list, got {show_value(value)} ({type(value).__name__})")
    if n is not None and len(value) != n:
        raise WorkloadError(f"{path}: {key} has {len(value)} entries but input_lens has {n}")
    return value


def _bench_seconds(path, key, values, keep, *, allow_none=False) -> np.ndarray:
    """``values[i]`` for the kept rows, seconds -> ms; NaN for None where allowed."""
    out = np.empty(len(keep))
    for j, i in enumerate(keep):
        value = values[i]
        if value is None and allow_none:
            out[j] = np.nan
        elif not is_finite_number(value) or value < 0:
            raise WorkloadError(f"{path}: {key}[{i}]: must be a number of seconds >= 0, got {show_value(value)}")
        else:
            out[j] = float(value) * 1e3
    return out


def _bench_document(path: Path, index: int | None):
    """The result ``index`` of the file (the last when None): ``--append-result`` writes each
    run's result after the ones already in the file."""
    documents = read_json_documents(path, index)
    if index is None:
        return documents[-1]
    if index >= len(documents):
        raise WorkloadError(f"{path}: index {index}: the file holds {len(documents)} result"
                            f"{'s' if len(documents) > 1 else ''} (0 to {len(documents) - 1})")
    return documents[index]


def _bench_ramp(path, data) -> tuple[str, float, float] | None:
    """``(strategy, start rps, end rps)`` of a ramp-up run (``--ramp-up-strategy``), else None."""
    strategy = data.get("ramp_up_strategy")
    if strategy is None:
        return None
    if strategy not in RAMP_UP_STRATEGIES:
        raise WorkloadError(f"{path}: ramp_up_strategy: must be \"linear\", \"exponential\" or null, "
                            f"got {show_value(strategy)}")
    ends = []
    for key in ("ramp_up_start_rps", "ramp_up_end_rps"):
        value = data.get(key)
        if not is_finite_number(value) or not value > 0:
            raise WorkloadError(f"{path}: {key}: must be a number > 0 with ramp_up_strategy = {strategy!r}, "
                                f"got {show_value(value)}")
        ends.append(float(value))
    return strategy, ends[0], ends[1]


def ramp_rates(ramp: tuple[str, float, float], total: int) -> np.ndarray:
    """Each request's rate in a ramp-up run of ``total`` requests, as vLLM's
    ``_get_current_request_rate``: at progress ``p = i / max(total - 1, 1)``, ``start + (end -
    start) * p`` (linear) or ``start * (end / start) ** p`` (exponential)."""
    strategy, start, end = ramp
    progress = np.arange(total) / max(total - 1, 1)
    if strategy == "linear":
        return start + (end - start) * progress
    return start * (end / start) ** progress


def _bench_tokens(path, key: str, i: int, value, minimum: int = 1) -> None:
    """A token count of a ``vllm bench serve`` file: a whole number from ``minimum`` to MAX_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_TOKENS:
        raise WorkloadError(f"{path}: {key}[{i}]: must be a whole number from {minimum} to {bound_text(MAX_TOKENS)}, "
                            f"got {show_value(value)}")


def load_vllm_bench(path, *, limit: int | None = None, index: int | None = None) -> BenchRun:
    """The successful requests of a ``vllm bench serve --save-result --save-detailed`` file
    (vLLM's ``vllm/benchmarks/serve.py``; lists aligned with ``input_lens``, times in seconds):
    ``output_lens``, ``ttfts`` and ``itls`` measured at the client from sending the request,
    ``latencies`` (its end-to-end latency), ``start_times`` (``time.perf_counter()`` when it was
    sent), ``queue_times`` (its wait for a ``--max-concurrency`` slot), ``errors``, and when the
    server reported them, ``server_ttfts`` and ``server_queue_times`` (None where it did not).
    SGLang's ``bench_serving --output-details`` writes the first four and ``errors`` at the top
    level (older versions) or under ``details`` (:func:`_bench_details`).

    A file with several results (``--append-result``) gives the one at ``index`` (the last when
    None). Without ``queue_times`` a capped run's due times are not recorded (vLLM takes
    ``start_time`` after the wait for a slot): at an infinite rate every request was due at once,
    so all are due at 0 in file order; at a finite rate ``due_known`` is False."""
    path = Path(path)
    data = _bench_document(path, index)
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: expected a JSON object")
    inputs = _bench_list(path, data, "input_lens")
    n = len(inputs)
    outputs = _bench_list(path, data, "output_lens", n)
    ttfts = _bench_list(path, data, "ttfts", n)
    itls = _bench_list(path, data, "itls", n)
    errors = _bench_list(path, data, "errors", n, required=False) or [""] * n
    succeeded = [i for i in range(n) if not errors[i]]
    failed = n - len(succeeded)
    said = data.get("failed")
    if isinstance(said, int) and not isinstance(said, bool) and said > failed:
        # vLLM writes a non-200 response's reason, "" when it has none (endpoint_request_func): such a
        # failure has no output and no first token; the file's own count says how many there were
        silent = {i for i in succeeded if outputs[i] == 0 and not ttfts[i]}
        silent = set(sorted(silent)[:said - failed])
        succeeded = [i for i in succeeded if i not in silent]
        failed += len(silent)
    if failed:
        first = next((errors[i] for i in range(n) if errors[i]), None)
        example = f"errors, e.g. {show_value(first)}" if first is not None else f"no error text; the file counts " \
                                                                                 f"failed = {said}"
        warnings.warn(f"{path}: {failed} of the {n} requests failed ({example}): left out of "
                      "the replay, though they loaded the server too", BenchReplayWarning, stacklevel=3)
    for i in succeeded:  # a failed request's lengths are 0 (vLLM's RequestFuncOutput), whatever it holds
        _bench_tokens(path, "output_lens", i, outputs[i], minimum=0)
    empty = sum(outputs[i] == 0 for i in succeeded)
    if empty:
        warnings.warn(f"{path}: {empty} of the {len(succeeded)} requests without an error have output_lens 0 (the "
                      f"answer's text was empty): left out of the replay", BenchReplayWarning, stacklevel=3)
    keep = [i for i in succeeded if outputs[i] >= 1][:limit]
    if not keep:
        raise WorkloadError(f"{path}: no successful requests")
    rate = data.get("request_rate", "inf")
    if rate == "trace":   # SGLang's --use-trace-timestamps: sent at the dataset's own times
        if data.get("start_times") is None:
            raise WorkloadError(f"{path}: request_rate is \"trace\": the run sent its requests at its dataset's "
                                "timestamps (SGLang bench_serving --use-trace-timestamps), which the file does not "
                                "record; replay the trace itself as the workload, or compare with this run as a "
                                "[target]")
        rate = math.nan   # sent as start_times say; nothing to draw arrivals from
    try:
        rate = float(rate)
    except (TypeError, ValueError, OverflowError):
        raise WorkloadError(f"{path}: request_rate: must be a number or \"inf\", got {show_value(rate)}") from None
    if not (rate > 0 or math.isnan(rate) and data.get("request_rate") == "trace"):
        raise WorkloadError(f"{path}: request_rate: must be > 0 or \"inf\", got {show_value(data['request_rate'])}")
    burstiness = data.get("burstiness", 1.0)
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) or not burstiness > 0:
        raise WorkloadError(f"{path}: burstiness: must be a number > 0 (or Infinity), got {show_value(burstiness)}")
    ramp = _bench_ramp(path, data)
    cap = data.get("max_concurrency")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise WorkloadError(f"{path}: max_concurrency: must be a whole number >= 1 or null, got {cap!r}")
    for i in keep:
        _bench_tokens(path, "input_lens", i, inputs[i])
    for i in keep:
        if not isinstance(itls[i], list):
            raise WorkloadError(f"{path}: itls[{i}]: must be a list of seconds, got {itls[i]!r}")
    prompt = np.array([inputs[i] for i in keep], dtype=np.int64)
    output = np.array([outputs[i] for i in keep], dtype=np.int64)
    ttft = _bench_seconds(path, "ttfts", ttfts, keep)
    _check_seconds(path, data, ttft)
    latencies = _bench_list(path, data, "latencies", n, required=False)
    if latencies is not None:
        e2e = _bench_seconds(path, "latencies", latencies, keep)
        short = np.flatnonzero(e2e < ttft - 1e-6)  # (a microsecond of rounding allowed)
        if len(short):
            i = keep[short[0]]
            raise WorkloadError(f"{path}: latencies[{i}] ({show_value(latencies[i])} s) is shorter than ttfts[{i}] "
                                f"({show_value(ttfts[i])} s): a request's latency holds its time to first token")
    else:
        e2e = ttft + np.array([sum(_bench_seconds(path, f"itls[{i}]", itls[i], range(len(itls[i])))) for i in keep])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (e2e - ttft) / (output - 1), np.nan)
    many = [i for i, n_out in zip(keep, output) if n_out > 1]
    if many and not any(itls[i] for i in many):  # SGLang --disable-stream: its "TTFT" is the latency
        warnings.warn(f"{path}: no request of several tokens has an inter-token latency, as in a run that did not "
                      "stream (--disable-stream: its TTFT is each request's whole latency): its TTFT and TPOT are "
                      "left out of the comparison, its latency compared", BenchReplayWarning, stacklevel=3)
        ttft, tpot = np.full(len(keep), np.nan), np.full(len(keep), np.nan)
    sent = due = bench_start = None
    due_known = True
    starts = _bench_list(path, data, "start_times", n, required=False)
    if starts is not None:
        sent = _bench_seconds(path, "start_times", starts, keep)  # perf_counter seconds: any origin >= 0
        queue_times = _bench_list(path, data, "queue_times", n, required=False)
        if queue_times is not None:
            due = sent - _bench_seconds(path, "queue_times", queue_times, keep)
        elif cap is not None and math.isinf(rate) and ramp is None:
            due = np.full(len(keep), sent.min())   # all due at once; the cap paced the sends
        else:
            due = sent.copy()   # right without a cap; with one, when each became due is not recorded
            due_known = cap is None
        origin = due.min()
        sent, due = sent - origin, due - origin
        gap = bench_first_gap_s(data)
        firsts = [float(s) for s in starts if is_finite_number(s)]   # (a failed request was sent too)
        if gap is not None and firsts:
            bench_start = min(firsts) * 1e3 - gap * 1e3 - origin
    if limit is not None and starts is not None and latencies is not None:   # (a cut run: was the part loaded?)
        usable = [i for i in succeeded if outputs[i] >= 1 and is_finite_number(starts[i])
                  and is_finite_number(latencies[i])]
        if len(usable) > len(keep):
            begin = np.array([float(starts[i]) for i in usable])
            end = begin + np.array([float(latencies[i]) for i in usable])
            position = {i: j for j, i in enumerate(usable)}
            warn_cut_from_load(path, begin, end, np.array([position[i] for i in keep if i in position]),
                               "limit keeps")
    server = {}
    for key in ("server_ttfts", "server_queue_times"):
        values = _bench_list(path, data, key, n, required=False)
        server[key] = _bench_seconds(path, key, values, keep, allow_none=True) if values is not None else None
    measured = MeasuredRequests(str(path), due if due is not None else np.full(len(keep), np.nan), ttft, tpot, e2e,
                                output, view="client", server_ttft_ms=server["server_ttfts"],
                                server_queue_ms=server["server_queue_times"], bench_start_ms=bench_start)
    return BenchRun(rate, float(burstiness), cap, RequestColumns(prompt, output), measured, sent, due, ramp,
                    np.array(keep, dtype=np.int64), n, due_known, failed)


def _is_sglang_bench(path, index) -> bool:
    """Whether a bench file is SGLang's ``bench_serving`` output (:func:`_sglang_result`)."""
    data = _bench_document(Path(path), index)
    return isinstance(data, dict) and _sglang_result(data)


def _sglang_result(data: dict) -> bool:
    """Whether a bench result is SGLang's ``bench_serving`` (``--output-details``: vLLM's
    per-request lists, :func:`_bench_details`, but its E2E named ``*_e2e_latency_ms`` where vLLM
    writes ``*_e2el_ms``)."""
    return any(f"{stat}_e2e_latency_ms" in data for stat in ("mean", "median"))


def _bench_details(data: dict) -> dict:
    """The per-request lists SGLang's ``bench_serving --output-details`` keeps under ``details``
    (``python/sglang/benchmark/metrics.py``, ``save_results``: ``input_lens``, ``output_lens``,
    ``ttfts``, ``itls``, ``errors``); older versions merged them into the result itself, as vLLM
    writes them. ``{}`` for a file without that dict."""
    details = data.get("details")
    return details if isinstance(details, dict) else {}


def redraw_arrivals_ms(bench: BenchRun, seed: int) -> np.ndarray:
    """Arrivals of ``bench``'s requests drawn again as ``vllm bench serve``'s ``get_request`` draws
    them, in ms from the benchmark's start (where its duration starts): a delay for every request of
    the file, the first included and failed ones too (they keep their gaps) -- gamma of shape
    ``burstiness`` at the request's rate, ``1 / rate`` for burstiness inf, 0 for an infinite rate
    --, summed, and without a ramp-up rescaled so that the file's last request goes exactly
    ``n / request_rate`` after the start, as vLLM rescales them. In a ramp-up run each delay is
    drawn at the rate vLLM gives the request at its index in the file (:func:`ramp_rates`), and
    nothing is rescaled. The same seed gives the same arrivals."""
    total, rows = bench.total, bench.rows
    if bench.ramp is None:
        if math.isinf(bench.rate):
            return np.zeros(len(bench.columns))
        rates = np.full(total, bench.rate)
    else:
        rates = ramp_rates(bench.ramp, total)
    cv = 1.0 / math.sqrt(bench.burstiness)   # 0 for burstiness inf: constant gaps
    # unit gaps / rate = gamma(shape, 1 / (rate * shape)), vLLM's draw
    delays = np.cumsum(unit_gaps("gamma", total, np.random.default_rng(seed), cv) / rates)
    if bench.ramp is None and delays[-1] != 0:
        delays = delays * ((total / bench.rate) / delays[-1])
    return delays[rows] * 1000.0


def make_vllm_bench_workload(config: VllmBenchConfig):
    """Replay the client of a ``vllm bench serve`` run (see :class:`VllmBenchConfig`); its
    measurements are the client's, so the comparison takes the simulated client's view."""
    bench = load_vllm_bench(config.path, limit=config.limit, index=config.index)
    columns, n = bench.columns, len(bench.columns)
    replay = config.replay if bench.sent_ms is not None else "redraw"
    if replay == "redraw" and math.isnan(bench.rate):
        raise WorkloadError(f"{config.path}: replay = \"redraw\" draws arrivals from request_rate, but this run sent "
                            "its requests at its trace's timestamps (request_rate \"trace\"): replay its start_times "
                            "(replay = \"client\" or \"send_times\")")
    if bench.sent_ms is None and (bench.ramp is not None or not math.isinf(bench.rate)):
        whose = "SGLang's bench_serving" if _is_sglang_bench(config.path, config.index) else "this vLLM"
        warnings.warn(f"{config.path}: no start_times ({whose} records no send times), so arrivals are drawn "
                      f"again from the {'ramp-up' if bench.ramp else 'request_rate'} and burstiness with the seed, "
                      "not replayed: the measured and simulated requests meet the server at different times",
                      BenchReplayWarning, stacklevel=2)
    if replay == "client" and not bench.due_known:
        warnings.warn(f"{config.path}: max_concurrency {bench.max_concurrency} at a finite request rate and no "
                      f"queue_times: when each request became due is not recorded (start_times are taken after the "
                      f"wait for a slot), so arrivals are drawn again from the "
                      f"{'ramp-up' if bench.ramp else 'request_rate'} and burstiness with the seed, under the cap "
                      f"(replay = \"send_times\" replays the recorded send times, open loop)",
                      BenchReplayWarning, stacklevel=2)
        replay = "redraw"
    if replay == "redraw":
        workload = OpenLoopWorkload(lambda seed: (redraw_arrivals_ms(bench, seed), columns), name="vllm_bench",
                                    num_requests=n)
        if bench.max_concurrency is not None:  # the client's cap holds whatever the arrivals
            workload = CappedWorkload(workload, bench.max_concurrency)
        measured = attrs.evolve(bench.measured, bench_start_ms=0.0)  # (drawn from the benchmark's start)
    elif replay == "send_times" or bench.max_concurrency is None:
        workload = OpenLoopWorkload(lambda seed: (bench.sent_ms, columns), name="vllm_bench", num_requests=n)
        measured = attrs.evolve(bench.measured, arrival_ms=bench.sent_ms)  # simulated ids follow it
    else:
        workload = CappedRequests(bench.due_ms, columns, bench.max_concurrency, name="vllm_bench")
        measured = bench.measured
    workload.measured = measured
    workload.info.update(request_rate="trace" if math.isnan(bench.rate) else bench.rate, burstiness=bench.burstiness,
                         max_concurrency=bench.max_concurrency,
                         replay=replay, ramp_up=list(bench.ramp) if bench.ramp else None, failed=bench.failed)
    return workload
