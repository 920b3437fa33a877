"""Replay one benchmark of a guidellm report (``guidellm benchmark --outputs json``).

guidellm (github.com/vllm-project/guidellm) writes ``benchmarks``, one per load level of its
profile (synchronous, throughput, constant rates of a sweep ...), each with ``requests``:
``successful``, ``errored`` and ``incomplete`` lists of per-request statistics. Two layouts:

* guidellm 0.2-0.3: ``prompt_tokens``, ``output_tokens``, ``start_time``, ``end_time``,
  ``first_token_time``, ``last_token_time`` and the ``prompt`` text;
* guidellm 0.4 and later: ``prompt_tokens``, ``output_tokens``, ``request_start_time``,
  ``request_end_time``, ``info.timings.first_token_iteration`` and ``last_token_iteration``,
  and ``request_args`` (the request's body -- its ``prompt`` or ``messages`` and
  ``max_tokens`` or ``max_completion_tokens`` -- as Python's repr of a dict up to 0.5, as JSON
  text from 0.6).

How the benchmark's successful requests are sent depends on its strategy
(``strategy.type_``, in ``args`` up to 0.3 and ``config`` from 0.4):

* ``synchronous`` and ``concurrent``: a closed loop holding the recorded concurrency, 1 or the
  strategy's ``streams``, as guidellm ran it. Its streams send their next request as soon as
  the previous one ends (up to 0.3 every request's target time is "now", ``max(start,
  time.time())``; from 0.4 a stream's last completion), so every request is due at the
  benchmark's start and the slots alone pace them (:mod:`.capped`: a request is sent when it is
  due and a slot is free, first due first served, in the order guidellm sent them) -- a slower
  simulated server sends later, a faster one sooner, never more than ``streams`` in flight. With
  ``rampup_duration`` (0.4 on) the first ``streams`` requests are due ``rampup_duration x k /
  streams`` after the start, as guidellm staggers them, and the later ones no earlier than the
  last of those (guidellm may send one sooner, when a stream's first request ends within the
  ramp).
* ``throughput``: every request is due at the benchmark's start, at most the strategy's
  ``max_concurrency`` in flight (guidellm 0.8.1's ``ThroughputStrategy.next_request_time``
  returns the start time, and its ``WorkerGroup`` caps what is in flight at the strategy's
  ``requests_limit``, ``max_concurrency``, or else at ``settings.max_concurrency``, 10240 --
  :data:`THROUGHPUT_DEFAULT_CAP`; guidellm 0.5's default was 512). It is replayed as guidellm ran
  it, a closed loop of that many slots (:mod:`.capped`): a slower simulated server sends later, a
  faster one sooner. With ``rampup_duration``, guidellm's ``k``-th request (counted from 1) is due
  ``rampup_duration x min(k, cap) / cap`` after the start.
* ``constant`` and ``poisson``: open loop, each request at its recorded start time (ms after
  the first): their send times do not wait for the server. With the strategy's
  ``max_concurrency`` (guidellm 0.8.1's async strategies take one), the recorded start times are
  the due times and at most ``max_concurrency`` are in flight, as guidellm capped them (a request
  the real server's cap held back stays due when it was sent: the report keeps no other time).

Errored and incomplete requests are left out and counted (``workload.info``). guidellm can keep
only a random sample of each status's requests in the file (``--sample-requests``,
``--output-sampling`` before 0.4); a replay of a sample is not the run (the missing requests
loaded the server too), so a benchmark whose list is shorter than its request count --
``metrics.request_totals`` from 0.4, ``request_totals`` at the benchmark's top in 0.2-0.3 (or
their ``run_stats.requests_made``, which counts warmup and cooldown requests too, when the
benchmark had none) -- or, without a count, one whose ``request_samples`` (0.2-0.3) says it was
sampled, is refused unless ``allow_sample = true``. The measured latencies are the client's,
kept for comparison as with :mod:`.inference_perf` (whose :func:`~.inference_perf.replay_columns`
builds the replay, prefix blocks from the prompts' text included).
"""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import attrs
import numpy as np

from schedlab.configs import bool_field, int_field, is_finite_number, path_field
from schedlab.errors import WorkloadError

from .capped import CappedRequests, CappedWorkload
from .columns import OpenLoopWorkload
from .measured import BenchReplayWarning
from .inference_perf import (
    TIME_TOLERANCE_S, ClientRecord, hash_block_tokens_field, max_tokens_of, prefix_blocks_field, prompt_text,
    replay_columns, seconds, whole_tokens,
)
from .records import read_json_file


@attrs.frozen
class GuidellmConfig:
    path: str = path_field(help="a guidellm JSON report (guidellm benchmark --outputs json)")
    index: int = int_field(0, min=0, help="which benchmark of the report (one per load level of its profile)")
    allow_sample: bool = bool_field(False, help="replay a benchmark whose report keeps only a sample of its requests "
                                                "(guidellm --sample-requests, --output-sampling before 0.4); the "
                                                "missing ones do not load the server")
    limit: int | None = int_field(None, min=1, optional=True, help="use only the first N successful requests")
    prefix_blocks: str = prefix_blocks_field()
    hash_block_tokens: int = hash_block_tokens_field()


def _number(entry: dict, *paths):
    for path in paths:
        value = entry
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            return value
    return None


def _body(entry: dict) -> dict | None:
    """The request body of a 0.4+ entry (``request_args``: JSON text from 0.6, Python's repr of a
    dict before), {} for an entry without one, None for a string that is neither."""
    args = entry.get("request_args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            try:
                args = ast.literal_eval(args)
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):  # not a literal, {[1]: 2}
                return None
    if not isinstance(args, dict):
        return {}
    body = args.get("body", args)
    return body if isinstance(body, dict) else {}


def _record(where: str, entry: dict, unreadable: list) -> ClientRecord | None:
    """One request of the report (``unreadable`` gets ``where`` when its ``request_args`` cannot
    be read), or None for an empty answer (0 output tokens: nothing to replay, as the other
    client readers leave it out). Its token times must lie in order between its start and end:
    a first token before the send gave a negative TTFT, a last token before the first a
    negative TPOT (review s80 workloads, finding 1)."""
    if not isinstance(entry, dict):
        raise WorkloadError(f"{where}: expected an object, got {entry!r}")
    start = _number(entry, ("request_start_time",), ("start_time",), ("info", "timings", "request_start"))
    end = _number(entry, ("request_end_time",), ("end_time",), ("info", "timings", "request_end"))
    if start is None or end is None:
        raise WorkloadError(f"{where}: no start or end time (request_start_time / start_time, request_end_time / "
                            "end_time)")
    start, end = seconds(where, "start time", start), seconds(where, "end time", end)
    if end < start:
        raise WorkloadError(f"{where}: its end {end} is before its start {start}")
    first = _number(entry, ("first_token_time",), ("info", "timings", "first_token_iteration"))
    last = _number(entry, ("last_token_time",), ("info", "timings", "last_token_iteration"))
    prompt = _number(entry, ("prompt_tokens",), ("input_metrics", "text_tokens"))
    output = _number(entry, ("output_tokens",), ("output_metrics", "text_tokens"))
    if prompt is None or output is None:
        raise WorkloadError(f"{where}: no {'prompt' if prompt is None else 'output'}_tokens")
    if is_finite_number(output) and output == 0:  # succeeded with an empty answer
        return None
    first = seconds(where, "first token time", first) if first is not None else None
    last = seconds(where, "last token time", last) if last is not None else None
    _check_token_times(where, start, end, first, last)
    body = _body(entry)
    if body is None:
        unreadable.append(where)
        body = {}
    text = entry.get("prompt") if isinstance(entry.get("prompt"), str) else prompt_text(body)
    return ClientRecord(start, end, whole_tokens(where, "prompt_tokens", prompt),
                        whole_tokens(where, "output_tokens", output), first, last, max_tokens_of(body), text)


def _check_token_times(where: str, start: float, end: float, first: float | None, last: float | None) -> None:
    """``start <= first token <= last token <= end`` (within :data:`TIME_TOLERANCE_S`), or
    WorkloadError naming ``where``, as the inference-perf reader checks its token times."""
    if first is not None and first < start - TIME_TOLERANCE_S:
        raise WorkloadError(f"{where}: its first token time {first} is before its start {start} (a token cannot "
                            "arrive before the request was sent)")
    if first is not None and last is not None and last < first - TIME_TOLERANCE_S:
        raise WorkloadError(f"{where}: its last token time {last} is before its first token time {first}")
    for name, t in (("first", first), ("last", last)):
        if t is not None and t > end + TIME_TOLERANCE_S:
            raise WorkloadError(f"{where}: its {name} token time {t} is after its end {end} (the request ends with "
                                "its last token)")


def _total(benchmark: dict, status: str) -> int | None:
    """How many requests of ``status`` the benchmark ran (before guidellm sampled its lists), if
    the report says: ``metrics.request_totals`` (0.4 on), ``request_totals`` at the benchmark's
    top (0.2-0.3), else 0.2-0.3's ``run_stats.requests_made`` -- which counts the warmup and
    cooldown requests too, so only when ``args`` had neither."""
    value = _number(benchmark, ("metrics", "request_totals", status), ("request_totals", status))
    if value is None:
        args = benchmark.get("args") if isinstance(benchmark.get("args"), dict) else {}
        transient = ("warmup_number", "warmup_duration", "cooldown_number", "cooldown_duration")
        if not any(args.get(key) for key in transient):
            value = _number(benchmark, ("run_stats", "requests_made", status))
    return int(value) if is_finite_number(value) else None


#: guidellm's strategies that hold a number of requests in flight (replayed as a closed loop).
CLOSED_LOOP_STRATEGIES = ("synchronous", "concurrent")


def _strategy(benchmark: dict) -> dict:
    """The benchmark's scheduling strategy (``config.strategy`` from 0.4, ``args.strategy`` before)."""
    for where in ("config", "args"):
        table = benchmark.get(where)
        strategy = table.get("strategy") if isinstance(table, dict) else None
        if isinstance(strategy, dict):
            return strategy
    return {}


def _streams(where: str, strategy: dict) -> int:
    """How many requests the strategy held in flight: 1 (synchronous), ``streams`` (concurrent)."""
    if strategy.get("type_") == "synchronous":
        return 1
    streams = strategy.get("streams")
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise WorkloadError(f"{where}: strategy concurrent: streams must be a whole number >= 1, got "
                            f"{streams!r} (the number of requests it held in flight)")
    return streams


#: What guidellm 0.8.1 holds in flight when nothing else limits it (``settings.max_concurrency``).
THROUGHPUT_DEFAULT_CAP = 10240

#: guidellm's strategies that send on their own clock, an optional ``max_concurrency`` capping them.
RATE_STRATEGIES = ("constant", "poisson")


def _max_concurrency(where: str, strategy: dict) -> int | None:
    """The strategy's ``max_concurrency`` (None when not set)."""
    cap = strategy.get("max_concurrency")
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise WorkloadError(f"{where}: strategy {strategy.get('type_')}: max_concurrency must be a whole number >= 1 "
                            f"or null, got {cap!r} (the most requests it held in flight)")
    return cap


def throughput_due_ms(n: int, cap: int, rampup_s: float = 0.0) -> np.ndarray:
    """When each of ``n`` requests of a throughput benchmark is due, in the order guidellm sent
    them (ms from its start): all at the start; with a ramp-up, the ``k``-th (from 1) at
    ``rampup x min(k, cap) / cap`` (guidellm 0.8.1's ``ThroughputStrategy.next_request_time``)."""
    if rampup_s <= 0:
        return np.zeros(n)
    return rampup_s * 1e3 * np.minimum(np.arange(1, n + 1), cap) / cap


def closed_loop_due_ms(n: int, streams: int, rampup_s: float = 0.0) -> np.ndarray:
    """When each of ``n`` requests of a synchronous or concurrent benchmark is due, in the order
    guidellm sent them (ms from its start): all at once, the ``streams`` slots pacing them; with a
    ramp-up, request ``k < streams`` at ``rampup x k / streams`` and the later ones with the last."""
    k = np.minimum(np.arange(n), streams - 1)
    return rampup_s * 1e3 * k / streams


def make_guidellm_workload(config: GuidellmConfig) -> OpenLoopWorkload | CappedWorkload:
    """Replay one benchmark of a guidellm report: a closed loop of its streams (synchronous,
    concurrent) or of its cap (throughput), or at its requests' start times, capped by the
    strategy's max_concurrency if it has one (constant, poisson; see the module docstring)."""
    path = Path(config.path)
    data = read_json_file(path)
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list):
        raise WorkloadError(f"{path}: not a guidellm report (no 'benchmarks' list)")
    if not benchmarks:
        raise WorkloadError(f"{path}: the report's 'benchmarks' list is empty (no load level was run)")
    if config.index >= len(benchmarks):
        raise WorkloadError(f"{path}: index {config.index}: the report has {len(benchmarks)} benchmarks "
                            f"(0 to {len(benchmarks) - 1})")
    benchmark = benchmarks[config.index]
    requests = benchmark.get("requests") if isinstance(benchmark, dict) else None
    successful = requests.get("successful") if isinstance(requests, dict) else None
    if not isinstance(successful, list):
        raise WorkloadError(f"{path}: benchmark {config.index} keeps no per-request list (requests.successful)")
    where = f"{path}: benchmark {config.index}"
    unreadable: list[str] = []
    records = [_record(f"{where}: requests.successful[{i}]", e, unreadable) for i, e in enumerate(successful)]
    rows = [r for r in records if r is not None]
    empty = len(records) - len(rows)
    if empty:
        warnings.warn(f"{where}: {empty} of its {len(records)} successful requests have 0 output tokens (the answer "
                      "was empty): left out of the replay", BenchReplayWarning, stacklevel=2)
    if unreadable:
        warnings.warn(f"{unreadable[0]}: request_args is neither JSON (guidellm 0.6 on) nor a Python dict's repr "
                      f"(0.4-0.5), nor are those of {len(unreadable) - 1} other requests: their prompts and max_tokens "
                      "are unknown", BenchReplayWarning, stacklevel=2)
    total = _total(benchmark, "successful")
    sampled = total > len(records) if total is not None else isinstance(benchmark.get("request_samples"), dict)
    if sampled and not config.allow_sample:
        kept = f"{len(records)} of its {total} successful requests" if total is not None else \
            f"a sample of its successful requests ({len(records)}: request_samples is set, the count is not given)"
        raise WorkloadError(f"{where} keeps {kept} (guidellm --sample-requests, --output-sampling before 0.4): a "
                            "replay would leave out the others, which loaded the server too; rerun guidellm keeping "
                            "every request, or set allow_sample = true")
    if not rows:
        raise WorkloadError(f"{where}: no successful requests" + (f" with output tokens ({empty} with 0)" if empty else ""))
    sent, columns, measured = replay_columns(rows, f"{path}[{config.index}]", limit=config.limit,
                                             prefix_blocks=config.prefix_blocks,
                                             hash_block_tokens=config.hash_block_tokens)
    strategy = _strategy(benchmark)
    kind = strategy.get("type_")
    rampup = strategy.get("rampup_duration") if kind in ("concurrent", "throughput") else None
    rampup = float(rampup) if is_finite_number(rampup) and rampup > 0 else 0.0
    workload: OpenLoopWorkload | CappedWorkload
    if kind in CLOSED_LOOP_STRATEGIES:
        streams = _streams(where, strategy)
        workload = CappedRequests(closed_loop_due_ms(len(columns), streams, rampup), columns, streams,
                                  name="guidellm")
    elif kind == "throughput":
        streams = _max_concurrency(where, strategy) or THROUGHPUT_DEFAULT_CAP
        workload = CappedRequests(throughput_due_ms(len(columns), streams, rampup), columns, streams,
                                  name="guidellm")
    else:
        streams = _max_concurrency(where, strategy) if kind in RATE_STRATEGIES else None
        if streams is None:
            workload = OpenLoopWorkload(lambda seed: (sent, columns), name="guidellm", num_requests=len(columns))
        else:
            workload = CappedRequests(sent, columns, streams, name="guidellm")
    workload.measured = measured
    others = {status: requests.get(status) for status in ("errored", "incomplete")}
    workload.info.update({status: len(v) if isinstance(v, list) else 0 for status, v in others.items()},
                         strategy=kind if isinstance(kind, str) else None, concurrency=streams, sampled=sampled)
    return workload
