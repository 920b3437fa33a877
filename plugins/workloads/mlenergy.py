"""Replay an ML.ENERGY benchmark run (``results.json`` of ``mlenergy.llm.benchmark``, v3.0).

The ML.ENERGY benchmark (github.com/ml-energy/benchmark) starts a vLLM server with
``--max-num-seqs`` set to the configuration's batch size (split over vLLM's data-parallel
engines where the model is served that way) and sends every request at once (its
``request_rate`` defaults to infinity), then measures the GPUs' energy over the steady state:
from the moment ``max_num_seqs`` requests have their first token to the moment all but
``max_num_seqs + 1`` have finished (its ``RequestTracker``; ``steady_state_energy``,
``steady_state_energy_per_token``). Its ``results.json`` lists every request in ``results`` --
``input_len``, ``output_len`` (0 for a failed one), ``ttft`` and ``latency`` in seconds from
sending, ``itl``, ``success``, ``error`` -- beside the run's statistics (``mean_ttft_ms`` ... as
``vllm bench serve`` names them) and settings (``max_num_seqs``, ``num_gpus`` ...).

The workload replays the successful requests (failed ones are counted in
``workload.info["failed"]`` and said in a one-line warning; a latency shorter than its TTFT is
an error), all due at 0 in file order, with their prompt and answer lengths and prefix block
ids from their prompts' text; the measured TTFT, TPOT and latency are kept for comparison, from
the client's side, with the GPUs' power over the run (``timeline.power``) and the server's
running and waiting requests (the ``prometheus.json`` beside the file) for the ``compare``
report's figures. Set the scheduler's ``max_num_seqs`` to the run's (the file's
``max_num_seqs``; a warning says when the simulated schedulers' add up to another), and its
``max_num_batched_tokens`` where the file says one (None when the benchmark's
``--max-num-batched-tokens`` was not given: vLLM's default, or its config file's, then). The
same file is a ``[target]``: its latency statistics and its steady state
(``schedlab.targets``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import attrs
import numpy as np

from schedlab.configs import MAX_TOKENS, bound_text, int_field, is_finite_number, path_field
from schedlab.errors import WorkloadError, brief
from schedlab.targets import positive_int, mlenergy_succeeded

from .columns import OpenLoopWorkload, RequestColumns
from .inference_perf import hash_block_tokens_field, prefix_blocks_field, text_block_ids
from .measured import BenchReplayWarning, MeasuredRequests, _bench_document, _bench_seconds
from .records import show_value


@attrs.frozen
class MlenergyConfig:
    path: str = path_field(help="an ML.ENERGY benchmark results.json (mlenergy.llm.benchmark)")
    limit: int | None = int_field(None, min=1, optional=True, help="use only the first N successful requests")
    prefix_blocks: str = prefix_blocks_field()
    hash_block_tokens: int = hash_block_tokens_field()


def load_mlenergy(path, *, limit: int | None = None, prefix_blocks: str = "text",
                  hash_block_tokens: int = 16) -> tuple[RequestColumns, MeasuredRequests, int, dict, int]:
    """``(columns, measured, requests in the file, its settings, failed requests)`` of the
    successful requests of ``path``; the settings are the run's ``max_num_seqs`` and
    ``num_gpus`` (None where the file does not say them). Failed requests (``success`` false)
    are left out with a one-line warning that counts them; a latency shorter than its TTFT is a
    WorkloadError. With ``prefix_blocks = "text"``
    the prompts' text gives prefix block ids (:func:`.inference_perf.text_block_ids`): the
    benchmark sends its questions ``num_request_repeats`` times, and vLLM's prefix cache serves
    the repeats."""
    path = Path(path)
    data = _bench_document(path, None)
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise WorkloadError(f"{path}: not an ML.ENERGY results.json (no 'results' list of requests)")
    rows = data["results"]
    keep, empty, failed, first_error = [], 0, 0, None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise WorkloadError(f"{path}: results[{i}]: expected an object, got {show_value(row)}")
        if not mlenergy_succeeded(row):
            failed += 1
            first_error = row.get("error") if first_error is None and row.get("error") else first_error
            continue
        for key, low in (("input_len", 1), ("output_len", 0)):
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TOKENS:
                raise WorkloadError(f"{path}: results[{i}].{key}: must be a whole number from {low} to "
                                    f"{bound_text(MAX_TOKENS)}, got {show_value(value)}")
        if row["output_len"] == 0:
            empty += 1
            continue
        keep.append(i)
    if failed:   # as vllm_bench says it (measured.py)
        example = f" (e.g. {show_value(first_error)})" if first_error is not None else ""
        warnings.warn(f"{path}: {failed} of the {len(rows)} requests failed{example}: left out of the replay, though "
                      "they loaded the server too", BenchReplayWarning, stacklevel=3)
    if empty:
        warnings.warn(f"{path}: {empty} requests without an error have output_len 0: left out of the replay",
                      BenchReplayWarning, stacklevel=3)
    keep = keep[:limit]
    if not keep:
        raise WorkloadError(f"{path}: no successful requests in 'results'")
    prompt = np.array([rows[i]["input_len"] for i in keep], dtype=np.int64)
    output = np.array([rows[i]["output_len"] for i in keep], dtype=np.int64)
    ttft = _bench_seconds(path, "results[].ttft", [r.get("ttft") for r in rows], keep)
    e2e = _bench_seconds(path, "results[].latency", [r.get("latency") for r in rows], keep)
    short = np.flatnonzero(e2e < ttft - 1e-3)  # (ms: a microsecond of rounding allowed, as vllm_bench)
    if len(short):
        i = keep[short[0]]
        raise WorkloadError(f"{path}: results[{i}].latency ({show_value(rows[i]['latency'])} s) is shorter than "
                            f"results[{i}].ttft ({show_value(rows[i]['ttft'])} s): a request's latency holds its time "
                            "to first token")
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (e2e - ttft) / (output - 1), np.nan)
    power, steady = measured_power(data, path)
    timeline = data.get("timeline")
    start = timeline.get("benchmark_start_time") if isinstance(timeline, dict) else None
    occupancy = measured_occupancy(path.with_name("prometheus.json"), float(start)) if is_finite_number(start) \
        else None
    measured = MeasuredRequests(str(path), np.zeros(len(keep)), ttft, tpot, e2e, output, view="client",
                                power=power, steady_ms=steady, occupancy=occupancy)
    batch, gpus, budget = (positive_int(data.get(key))
                           for key in ("max_num_seqs", "num_gpus", "max_num_batched_tokens"))
    per_row, constant = {}, {}
    if prefix_blocks == "text":
        ids = text_block_ids([_prompt_text(rows[i].get("prompt")) for i in keep], prompt, hash_block_tokens)
        if any(ids):
            per_row["block_hashes"], constant["hash_block_tokens"] = ids, hash_block_tokens
    settings = {"max_num_seqs": batch, "num_gpus": gpus, "max_num_batched_tokens": budget}
    return RequestColumns(prompt, output, per_row, constant), measured, len(rows), settings, failed


def _prompt_text(prompt) -> str | None:
    """A request's prompt as text: the benchmark writes a string, or a list of them (chat turns)."""
    if isinstance(prompt, str):
        return prompt or None
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    return None


#: Most points of the GPUs' summed power: their samples (every 0.1 s) resampled onto one grid.
POWER_POINTS = 4000


def measured_power(data: dict, path) -> tuple[tuple[np.ndarray, np.ndarray] | None, tuple[float, float] | None]:
    """The GPUs' power over the run, from ``timeline.power`` (Zeus's ``PowerMonitor``: per power
    domain -- ``device_instant`` preferred, else ``device_average`` -- each GPU's ``[unix s, W]``
    samples; a bare ``{gpu: samples}`` too), as ``(ms from benchmark_start_time, W summed over
    the GPUs)`` on one grid (each GPU interpolated); and the steady state's ``(start, end)`` in
    ms from the same start. None for what the file lacks; a timeline that is there but not of
    that form is said in a warning and left out (the requests still replay)."""
    timeline = data.get("timeline")
    if not isinstance(timeline, dict) or not is_finite_number(timeline.get("benchmark_start_time")):
        return None, None
    start = float(timeline["benchmark_start_time"])
    ends = [timeline.get(k) for k in ("steady_state_start_time", "steady_state_end_time")]
    steady = ((ends[0] - start) * 1e3, (ends[1] - start) * 1e3) if all(map(is_finite_number, ends)) else None
    power = timeline.get("power")
    if power is None:
        return None, steady
    series = power
    if isinstance(power, dict):
        for domain in ("device_instant", "device_average"):
            if isinstance(power.get(domain), dict) and power[domain]:
                series = power[domain]
                break
    try:
        gpus = [np.asarray(samples, dtype=float).reshape(-1, 2) for samples in series.values()]
    except (AttributeError, TypeError, ValueError):
        gpus = []
    gpus = [g[np.all(np.isfinite(g), axis=1)] for g in gpus]
    if not gpus or any(g.shape[0] < 2 for g in gpus):
        warnings.warn(f"{path}: timeline.power holds no GPU's power samples ([time, watts] pairs, two or more "
                      f"per GPU): the measured power is left out", BenchReplayWarning, stacklevel=4)
        return None, steady
    gpus = [g[np.argsort(g[:, 0], kind="stable")] for g in gpus]
    low, high = min(g[0, 0] for g in gpus), max(g[-1, 0] for g in gpus)
    grid = np.linspace(low, high, int(min(POWER_POINTS, max(2, (high - low) / 0.05 + 1))))
    watts = np.sum([np.interp(grid, g[:, 0], g[:, 1]) for g in gpus], axis=0)
    return ((grid - start) * 1e3, watts), steady


#: the server's gauges of running and waiting requests in a /metrics scrape (summed over the
#: label sets: one per data-parallel engine)
_GAUGE = r"^{}(?:\{{[^}}]*\}})?[ \t]+([-+0-9.eE]+|NaN)[ \t]*(?:[-0-9]+)?[ \t]*$"


def measured_occupancy(path: Path, start: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The server's running and waiting requests over the run, from the ``prometheus.json`` the
    ML.ENERGY benchmark writes beside its ``results.json``: its ``timeline`` of ``/metrics``
    scrapes (``{"timestamp": unix s, "metrics": text}``, one a second), each read for
    ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` (summed over vLLM's
    data-parallel engines), as ``(ms from start, running, waiting)``. None without the file; one
    whose timeline is not of that form is said in a warning and left out."""
    if not path.is_file():
        return None
    import re

    try:
        snapshots = json.loads(path.read_text(encoding="utf-8-sig"))["timeline"]
        rows = []
        for snap in snapshots:
            text = snap["metrics"]
            counts = [sum(float(v) for v in re.findall(_GAUGE.format(re.escape(name)), text, re.MULTILINE))
                      for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
            rows.append(((float(snap["timestamp"]) - start) * 1e3, *counts))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"{path}: its timeline holds no /metrics scrapes ({type(exc).__name__}: {brief(str(exc))}): the "
                      "server's running and waiting requests over time are left out", BenchReplayWarning, stacklevel=4)
        return None
    if not rows:
        return None
    times, running, waiting = (np.array(column) for column in zip(*sorted(rows)))
    return times, running, waiting


def make_mlenergy_workload(config: MlenergyConfig) -> OpenLoopWorkload:
    """Every successful request of the run, due at 0 (see the module docstring)."""
    columns, measured, total, settings, failed = load_mlenergy(config.path, limit=config.limit,
                                                               prefix_blocks=config.prefix_blocks,
                                                               hash_block_tokens=config.hash_block_tokens)
    n = len(columns)
    workload = OpenLoopWorkload(lambda seed: (np.zeros(n), columns), name="mlenergy", num_requests=n)
    workload.measured = measured
    workload.info.update(requests_in_file=total, failed=failed, **{k: v for k, v in settings.items() if v is not None})
    return workload
