"""The ``request_log`` report: each run as a vLLM per-request log, the file ``vllm_log`` replays.

``logs/<run>.jsonl`` has one JSON object a line, in request-id order, with the fields and units of
LLMServingSim's bench runner's ``requests.jsonl`` (vLLM's ``RequestStateStats``): ``request_id``,
``input_toks``, ``output_toks``, ``arrival_time`` (the request's arrival), ``queued_ts`` (when the engine
loop took it), ``scheduled_ts``, ``first_token_ts`` and ``last_token_ts``, in seconds of simulated time.
A request that never finished (turned away, aborted, given up on by its client) has its timestamps
``null``, as the runner writes a request it got no metrics for; ``vllm_log`` leaves such lines out.

Why: a run of known settings becomes a calibration target (``[workload] kind = "vllm_log"``), so a fit's
recovery of known constants can be checked before it is trusted on a real run, and one simulator
setting can be fitted to another's output. The log carries no prompt tokens or prefix block ids: a
replay of a run that hit a prefix cache does not share prefixes (the report says so).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import attrs
import numpy as np

from schedlab.configs import int_field
from schedlab.errors import RunWarning
from schedlab.results.file_names import UniqueStems, safe_stem
from schedlab.results.storage import atomic_write

#: The per-request columns a line is made from (a run that lacks one cannot be written).
COLUMNS = ("id", "prompt_tokens", "generated_tokens", "arrival_ms", "taken_ms", "first_scheduled_ms",
           "first_token_ms", "finish_ms", "rejected", "aborted", "timed_out", "cached_tokens")


@attrs.frozen
class RequestLogConfig:
    max_runs: int = int_field(100, min=1, help="most runs written (single runs first, in file order)")


class RequestLogReport:
    """Writes ``logs/<run>.jsonl`` for every run (up to ``max_runs``)."""

    def __init__(self, config: RequestLogConfig | None = None):
        self.config = config or RequestLogConfig()

    def write(self, results, out_dir) -> list[Path]:
        written = []
        stems = UniqueStems()
        cached = []
        for run in results.all_runs()[:self.config.max_runs]:
            stem = stems.take(safe_stem(run.name))
            requests = run.all_requests()
            path = Path(out_dir) / "logs" / f"{stem}.jsonl"
            atomic_write(path, log_text(requests))
            written.append(path)
            if np.any(requests["cached_tokens"] > 0):
                cached.append(run.name)
        if cached:
            warnings.warn(f"request_log: {len(cached)} run(s) hit a prefix cache ({', '.join(cached[:3])}"
                          f"{' ...' if len(cached) > 3 else ''}); their logs carry no prompt tokens or block "
                          "ids, so replaying them as vllm_log shares no prefixes", RunWarning, stacklevel=2)
        return written


def log_text(requests: dict) -> str:
    """The requests as vLLM per-request log lines (see the module docstring)."""
    lines = []
    for i in range(len(requests["id"])):
        done = not (requests["rejected"][i] or requests["aborted"][i] or requests["timed_out"][i]) and math.isfinite(
            requests["finish_ms"][i])
        line = {"request_id": f"sim-{int(requests['id'][i])}", "input_toks": int(requests["prompt_tokens"][i]),
                "output_toks": int(requests["generated_tokens"][i]),
                "arrival_time": _seconds(requests["arrival_ms"][i])}
        for key, column in (("queued_ts", "taken_ms"), ("scheduled_ts", "first_scheduled_ms"),
                            ("first_token_ts", "first_token_ms"), ("last_token_ts", "finish_ms")):
            line[key] = _seconds(requests[column][i]) if done else None
        lines.append(json.dumps(line) + "\n")
    return "".join(lines)


def _seconds(ms: float) -> float | None:
    return float(ms) / 1e3 if math.isfinite(ms) else None
