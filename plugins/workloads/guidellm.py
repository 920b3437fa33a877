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

The benchmark's successful requests are sent at their recorded start times (ms after the
first), open loop: the recorded times already hold guidellm's own pacing and concurrency.
Errored and incomplete requests are left out and counted (``workload.info``). guidellm keeps
only ``--sample-requests`` requests of each status in the file by default; a replay of a sample
is not the run (the missing requests loaded the server too), so a benchmark whose list is
shorter than its request count is refused unless ``allow_sample = true``. The measured
latencies are the client's, kept for comparison as with :mod:`.inference_perf` (whose
:func:`~.inference_perf.replay_columns` builds the replay, prefix blocks from the prompts'
text included).
"""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import attrs

from schedlab.configs import bool_field, int_field, is_finite_number, path_field
from schedlab.errors import WorkloadError

from .columns import OpenLoopWorkload
from .measured import BenchReplayWarning
from .inference_perf import (
    ClientRecord, hash_block_tokens_field, max_tokens_of, prefix_blocks_field, prompt_text, replay_columns, seconds,
    whole_tokens,
)
from .records import read_json_file


@attrs.frozen
class GuidellmConfig:
    path: str = path_field(help="a guidellm JSON report (guidellm benchmark --outputs json)")
    index: int = int_field(0, min=0, help="which benchmark of the report (one per load level of its profile)")
    allow_sample: bool = bool_field(False, help="replay a benchmark whose report keeps only a sample of its requests "
                                                "(guidellm --sample-requests); the missing ones do not load the server")
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


def _record(where: str, entry: dict, unreadable: list) -> ClientRecord:
    """One request of the report (``unreadable`` gets ``where`` when its ``request_args`` cannot
    be read)."""
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
    body = _body(entry)
    if body is None:
        unreadable.append(where)
        body = {}
    text = entry.get("prompt") if isinstance(entry.get("prompt"), str) else prompt_text(body)
    return ClientRecord(start, end, whole_tokens(where, "prompt_tokens", prompt),
                        whole_tokens(where, "output_tokens", output),
                        seconds(where, "first token time", first) if first is not None else None,
                        seconds(where, "last token time", last) if last is not None else None,
                        max_tokens_of(body), text)


def _total(benchmark: dict, status: str) -> int | None:
    """How many requests of ``status`` the benchmark ran (the report's counts), if it says."""
    value = _number(benchmark, ("metrics", "request_totals", status), ("run_stats", "completed" if status ==
                                                                          "successful" else status))
    return int(value) if is_finite_number(value) else None


def make_guidellm_workload(config: GuidellmConfig) -> OpenLoopWorkload:
    """Replay one benchmark of a guidellm report at its requests' start times (see the module docstring)."""
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
    rows = [_record(f"{where}: requests.successful[{i}]", e, unreadable) for i, e in enumerate(successful)]
    if unreadable:
        warnings.warn(f"{unreadable[0]}: request_args is neither JSON (guidellm 0.6 on) nor a Python dict's repr "
                      f"(0.4-0.5), nor are those of {len(unreadable) - 1} other requests: their prompts and max_tokens "
                      "are unknown", BenchReplayWarning, stacklevel=2)
    total = _total(benchmark, "successful")
    if total is not None and total > len(rows) and not config.allow_sample:
        raise WorkloadError(f"{where} keeps {len(rows)} of its {total} successful requests (guidellm "
                            "--sample-requests): a replay would leave out the others, which loaded the server "
                            "too; rerun guidellm keeping every request, or set allow_sample = true")
    if not rows:
        raise WorkloadError(f"{where}: no successful requests")
    sent, columns, measured = replay_columns(rows, f"{path}[{config.index}]", limit=config.limit,
                                             prefix_blocks=config.prefix_blocks,
                                             hash_block_tokens=config.hash_block_tokens)
    workload = OpenLoopWorkload(lambda seed: (sent, columns), name="guidellm", num_requests=len(columns))
    workload.measured = measured
    others = {status: requests.get(status) for status in ("errored", "incomplete")}
    workload.info.update({status: len(v) if isinstance(v, list) else 0 for status, v in others.items()},
                         strategy=_number(benchmark, ("config", "strategy", "type_"), ("args", "strategy", "type_")),
                         sampled=total is not None and total > len(rows))
    return workload
