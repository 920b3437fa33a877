"""Replay an inference-perf run from its per-request report, ``per_request_lifecycle_metrics.json``.

inference-perf (github.com/kubernetes-sigs/inference-perf) writes it with
``report.request_lifecycle.per_request: true``: a JSON list, one record per request, with
``start_time`` and ``end_time`` (the client's ``time.perf_counter()`` seconds when it sent the
request and when it had the whole answer), ``request`` (the JSON payload it sent), ``info`` and
``error`` (None unless the request failed). ``info`` holds the token counts and the streamed
tokens' arrival times, named differently across versions; the first found is used:

* prompt tokens: ``info.input_tokens``, ``info.request_metrics.text.input_tokens``, the
  server's ``usage.prompt_tokens`` (in ``info.response_metrics.server_usage`` or
  ``info.response_info.server_usage``);
* output tokens: the server's count ``info.response_metrics.server_usage.completion_tokens``
  (``info.response_info.server_usage.completion_tokens`` in v0.5),
  ``info.response_metrics.output_tokens``, ``info.response_info.output_tokens`` (v0.5: ``info``
  is ``{input_tokens, response_info: {output_tokens, output_token_times, chunk_times,
  server_usage}}``), ``info.output_tokens`` (up to v0.4);
* token times: ``info.response_metrics.output_token_times``,
  ``info.response_info.output_token_times``, ``info.output_token_times``.

Requests are sent at their recorded ``start_time`` (ms after the first), open loop, with a
one-line warning: the report keeps neither the run's load type nor when each request was due
(``RequestLifecycleMetric.scheduled_time`` is not written), so a concurrency the client held --
``load.type: concurrent``, or every one of its ``num_workers x worker_max_concurrency`` slots
busy -- cannot be replayed from it: a slower simulated server would get more requests in flight
than the real one had, a faster one fewer. A run of ``load.type: concurrent`` (one stage) is
replayed as it ran with ``concurrency`` set to its ``concurrency_level`` (its config.yaml): a
closed loop of that many requests in flight, each sent when a slot frees, in the recorded order
(:mod:`.capped`; inference-perf enqueues the stage's requests within its first second, here all
are due at its start). Failed requests are left out, counted (``workload.info["failed"]``) and
said in a one-line warning; so are requests that succeeded with 0 output tokens (an empty answer).
A request's token times must lie in order between its ``start_time`` and ``end_time`` (1 us of
rounding allowed), or the load stops with an error naming the request.
The measured latencies are the client's (``view = "client"``, compared with the simulated
client, :mod:`schedlab.results.compare`): TTFT from sending to the first token's arrival,
latency to ``end_time``, TPOT ``(last token - first token) / (output - 1)`` (NaN without token
times, e.g. a run that did not stream).

The payload's ``max_tokens`` (or ``max_completion_tokens``) becomes the request's ``max_tokens``
when it is at least the output. Prompt sharing: the report keeps the prompts as text, not token
ids, so prefix blocks are taken on the text (``prefix_blocks = "text"``, the default): a block
of ``hash_block_tokens`` tokens is that many times the run's mean characters per token, and two
prompts share block ``j`` when their first ``j + 1`` such blocks of text are equal -- the shared
system prompts of a run are found, their exact token boundaries are not.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import attrs
import numpy as np

from schedlab.configs import MAX_TOKENS, bound_text, int_field, is_finite_number, path_field, str_field
from schedlab.errors import WorkloadError

from .capped import CappedRequests, CappedWorkload
from .columns import OpenLoopWorkload, RequestColumns
from .measured import BenchReplayWarning, MeasuredRequests
from .records import read_json_file, show_value

PREFIX_BLOCKS = ("text", "none")


def prefix_blocks_field():
    return str_field("text", choices=PREFIX_BLOCKS,
                     help="'text': prefix block ids from the prompts' text (blocks of hash_block_tokens x the run's "
                          "mean characters per token); 'none': no sharing")


def hash_block_tokens_field():
    return int_field(16, min=1, help="tokens per prefix block id (vLLM's block size)")


@attrs.frozen
class InferencePerfConfig:
    path: str = path_field(help="inference-perf's per_request_lifecycle_metrics.json")
    limit: int | None = int_field(None, min=1, optional=True, help="use only the first N successful requests")
    prefix_blocks: str = prefix_blocks_field()
    hash_block_tokens: int = hash_block_tokens_field()
    concurrency: int | None = int_field(None, min=1, optional=True,
                                        help="a load.type: concurrent run's concurrency_level (its config.yaml; the "
                                             "report does not say): replayed as a closed loop of that many requests "
                                             "in flight; unset: at the recorded send times, open loop, with a warning")


def _get(record: dict, *keys):
    """``record[k1][k2]...``, or None where any level is missing."""
    value = record
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _first(record: dict, *paths):
    for path in paths:
        value = _get(record, *path)
        if value is not None:
            return value
    return None


def whole_tokens(where: str, key: str, value) -> int:
    """A token count from 1 to MAX_TOKENS, or WorkloadError naming ``where`` and ``key``."""
    if not is_finite_number(value) or value != int(value) or not 1 <= value <= MAX_TOKENS:
        raise WorkloadError(f"{where}: {key}: must be a whole number from 1 to {bound_text(MAX_TOKENS)}, got "
                            f"{show_value(value)}")
    return int(value)


def seconds(where: str, key: str, value) -> float:
    """A time in seconds >= 0, or WorkloadError naming ``where`` and ``key``."""
    if not is_finite_number(value) or value < 0:
        raise WorkloadError(f"{where}: {key}: must be a number of seconds >= 0, got {show_value(value)}")
    return float(value)


#: seconds of rounding allowed between a request's send, token and end times
TIME_TOLERANCE_S = 1e-6


def _check_token_times(where: str, start: float, end: float, times: list[float]) -> None:
    """``start_time <= output_token_times[0] <= ... <= output_token_times[-1] <= end_time``
    (within :data:`TIME_TOLERANCE_S`), or WorkloadError naming ``where``: a token before the
    send gives a negative TTFT, tokens out of order a negative TPOT, a token after the end a
    TPOT longer than the latency."""
    if not times:
        return
    if times[0] < start - TIME_TOLERANCE_S:
        raise WorkloadError(f"{where}: output_token_times[0] {times[0]} is before start_time {start} (a token "
                            "cannot arrive before the request was sent)")
    for k in range(1, len(times)):
        if times[k] < times[k - 1] - TIME_TOLERANCE_S:
            raise WorkloadError(f"{where}: output_token_times out of order: [{k}] {times[k]} is before "
                                f"[{k - 1}] {times[k - 1]}")
    if times[-1] > end + TIME_TOLERANCE_S:
        raise WorkloadError(f"{where}: output_token_times[{len(times) - 1}] {times[-1]} is after end_time {end} (the "
                            "request ends with its last token)")


def _payload(record: dict) -> dict:
    raw = record.get("request")
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):   # not JSON, nested too deeply or a 4,300-digit number
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def prompt_text(payload: dict) -> str | None:
    """The prompt a payload sent: ``prompt`` (completions) or the ``messages``' text (chat)."""
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # content parts: keep the text ones
                parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        return "\n".join(parts)
    return None


def text_block_ids(texts: list[str | None], prompt_tokens: np.ndarray, block_tokens: int) -> list[tuple | None]:
    """Prefix block ids from prompt text: blocks of ``block_tokens`` x the mean characters per
    token of the prompts that have text, chained as vLLM chains token blocks; at most as many
    full blocks as the prompt's tokens hold. None for a prompt without text."""
    known = [(t, n) for t, n in zip(texts, prompt_tokens.tolist()) if t]
    if not known:
        return [None] * len(texts)
    chars_per_token = sum(len(t) for t, _ in known) / sum(n for _, n in known)
    width = max(1, round(block_tokens * chars_per_token))
    numbering: dict[bytes, int] = {}
    out = []
    for text, tokens in zip(texts, prompt_tokens.tolist()):
        if not text:
            out.append(None)
            continue
        parent = b""
        ids = []
        for j in range(min(tokens // block_tokens, len(text) // width)):
            chunk = text[j * width:(j + 1) * width].encode("utf-8", "surrogatepass")
            parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
            ids.append(numbering.setdefault(parent, len(numbering)))
        out.append(tuple(ids))
    return out


def load_inference_perf(path, *, limit: int | None = None, prefix_blocks: str = "text",
                        hash_block_tokens: int = 16) -> tuple[np.ndarray, RequestColumns, MeasuredRequests, int]:
    """``(send ms, columns, measured, failed)`` of the successful requests of a per-request
    report, in the order they were sent (see the module docstring)."""
    path = Path(path)
    records = read_json_file(path)
    if not isinstance(records, list):
        raise WorkloadError(f"{path}: expected a JSON list of requests (inference-perf's "
                            "per_request_lifecycle_metrics.json)")
    rows, failed, empty, first_error = [], 0, 0, None
    for i, record in enumerate(records):
        where = f"{path}: request {i}"
        if not isinstance(record, dict):
            raise WorkloadError(f"{where}: expected an object, got {record!r}")
        if record.get("error"):
            failed += 1
            first_error = record["error"] if first_error is None else first_error
            continue
        for key in ("start_time", "end_time", "info"):
            if key not in record:
                raise WorkloadError(f"{where}: missing field {key!r}")
        start = seconds(where, "start_time", record["start_time"])
        end = seconds(where, "end_time", record["end_time"])
        if end < start:
            raise WorkloadError(f"{where}: end_time {end} is before start_time {start}")
        info = record["info"]
        prompt = _first(info, ("input_tokens",), ("request_metrics", "text", "input_tokens"),
                        ("response_metrics", "server_usage", "prompt_tokens"),
                        ("response_info", "server_usage", "prompt_tokens"))
        output = _first(info, ("response_metrics", "server_usage", "completion_tokens"),
                        ("response_info", "server_usage", "completion_tokens"),
                        ("response_metrics", "output_tokens"), ("response_info", "output_tokens"), ("output_tokens",))
        if prompt is None or output is None:
            raise WorkloadError(f"{where}: info holds no {'input' if prompt is None else 'output'} token count "
                                "(input_tokens / request_metrics.text.input_tokens; response_metrics.output_tokens "
                                "/ response_info.output_tokens / output_tokens)")
        if is_finite_number(output) and output == 0:   # succeeded with an empty answer: nothing to replay
            empty += 1
            continue
        times = _first(info, ("response_metrics", "output_token_times"), ("response_info", "output_token_times"),
                       ("output_token_times",)) or []
        if not isinstance(times, list):
            raise WorkloadError(f"{where}: output_token_times: must be a list of seconds")
        times = [seconds(where, "output_token_times", t) for t in times]
        _check_token_times(where, start, end, times)
        payload = _payload(record)
        rows.append(ClientRecord(start, end, whole_tokens(where, "input tokens", prompt),
                                 whole_tokens(where, "output tokens", output), times[0] if times else None,
                                 times[-1] if times else None, max_tokens_of(payload), prompt_text(payload)))
    n = len(records)
    if failed:   # as vllm_bench says it (measured.py)
        warnings.warn(f"{path}: {failed} of the {n} requests failed (error, e.g. {show_value(first_error)}): left out "
                      "of the replay, though they loaded the server too", BenchReplayWarning, stacklevel=3)
    if empty:
        warnings.warn(f"{path}: {empty} of the {n - failed} requests without an error have 0 output tokens (the "
                      "answer's text was empty): left out of the replay", BenchReplayWarning, stacklevel=3)
    if not rows:
        raise WorkloadError(f"{path}: no successful requests ({failed} failed"
                            + (f", {empty} with 0 output tokens)" if empty else ")"))
    sent, columns, measured = replay_columns(rows, str(path), limit=limit, prefix_blocks=prefix_blocks,
                                             hash_block_tokens=hash_block_tokens)
    return sent, columns, measured, failed


@attrs.frozen
class ClientRecord:
    """One request as a load generator recorded it (seconds on its clock)."""

    start: float                  # sent
    end: float                    # last byte
    prompt_tokens: int
    output_tokens: int
    first_token: float | None     # the first token's arrival (None: not streamed)
    last_token: float | None
    max_tokens: int | None        # the client's limit, when the payload had one
    prompt: str | None            # the prompt's text, when kept


def max_tokens_of(payload: dict) -> int | None:
    cap = payload.get("max_tokens", payload.get("max_completion_tokens"))
    return cap if isinstance(cap, int) and not isinstance(cap, bool) else None


def replay_columns(rows: list[ClientRecord], source: str, *, limit: int | None = None, prefix_blocks: str = "text",
                   hash_block_tokens: int = 16) -> tuple[np.ndarray, RequestColumns, MeasuredRequests]:
    """Send times (ms after the first), the requests' columns and the client's measured
    latencies of a load generator's records, in the order they were sent (the first ``limit``)."""
    rows = sorted(rows, key=lambda r: r.start)[:limit]
    origin = rows[0].start
    sent = np.array([(r.start - origin) * 1e3 for r in rows])
    e2e = np.array([(r.end - r.start) * 1e3 for r in rows])
    prompt_tokens = np.array([r.prompt_tokens for r in rows], dtype=np.int64)
    output_tokens = np.array([r.output_tokens for r in rows], dtype=np.int64)
    ttft = np.array([(r.first_token - r.start) * 1e3 if r.first_token is not None else np.nan for r in rows])
    with np.errstate(invalid="ignore", divide="ignore"):
        last = np.array([(r.last_token - r.start) * 1e3 if r.last_token is not None else np.nan for r in rows])
        tpot = np.where(output_tokens > 1, (last - ttft) / (output_tokens - 1), np.nan)
    per_row: dict[str, list] = {}
    caps = [r.max_tokens if r.max_tokens is not None and r.max_tokens >= r.output_tokens else None for r in rows]
    if any(c is not None for c in caps):
        per_row["max_tokens"] = caps
    constant = {}
    if prefix_blocks == "text":
        ids = text_block_ids([r.prompt for r in rows], prompt_tokens, hash_block_tokens)
        if any(i for i in ids):
            per_row["block_hashes"] = ids
            constant["hash_block_tokens"] = hash_block_tokens
    columns = RequestColumns(prompt_tokens, output_tokens, per_row, constant)
    return sent, columns, MeasuredRequests(source, sent, ttft, tpot, e2e, output_tokens, view="client")


def make_inference_perf_workload(config: InferencePerfConfig) -> OpenLoopWorkload | CappedWorkload:
    """Replay an inference-perf run's clients at their send times, or as a closed loop of
    ``concurrency`` (see the module docstring)."""
    sent, columns, measured, failed = load_inference_perf(config.path, limit=config.limit,
                                                          prefix_blocks=config.prefix_blocks,
                                                          hash_block_tokens=config.hash_block_tokens)
    workload: OpenLoopWorkload | CappedWorkload
    if config.concurrency is None:
        warnings.warn(f"{config.path}: replayed open loop at the recorded send times: inference-perf's per-request "
                      "report keeps neither the load type nor when each request was due (no scheduled_time), so a "
                      "concurrency its client held (load.type concurrent, or all num_workers x "
                      "worker_max_concurrency slots busy) is not held; for a concurrent run set concurrency = its "
                      "concurrency_level", BenchReplayWarning, stacklevel=2)
        workload = OpenLoopWorkload(lambda seed: (sent, columns), name="inference_perf", num_requests=len(columns))
    else:
        workload = CappedRequests(np.zeros(len(columns)), columns, config.concurrency, name="inference_perf")
    workload.measured = measured
    workload.info.update(failed=failed, concurrency=config.concurrency)
    return workload
