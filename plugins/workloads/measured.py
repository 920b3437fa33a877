"""Replay measured runs: vLLM per-request logs and ``vllm bench serve --save-result`` files.

* ``vllm_log`` -- one JSON object per line with ``input_toks``, ``output_toks`` and vLLM's
  per-request timestamps ``queued_ts``, ``scheduled_ts``, ``first_token_ts``,
  ``last_token_ts`` (seconds on the engine's clock, as vLLM's ``RequestStateStats`` keeps
  them; LLMServingSim's ``bench`` writes them so). Requests arrive at ``queued_ts`` (ms after
  the first). Prompts' token ids -- an ``input_tok_ids`` field in the log or, line by line, in
  a ``prompts`` file (LLMServingSim's workload JSONL) -- become prefix block ids
  (:func:`prefix_block_ids`), so prefix caching sees the sharing the real run saw; a log may
  also carry those ids already (``block_hashes``).
* ``vllm_bench`` -- the JSON ``vllm bench serve --save-result --save-detailed`` writes:
  ``input_lens``, ``output_lens``, ``ttfts`` (s) and ``itls`` (s, per request). The file has no
  arrival times, only ``request_rate`` and ``burstiness``: arrivals are drawn again as vLLM
  draws them (gamma gaps with shape ``burstiness`` at the mean rate; all at t = 0 for an
  infinite rate) from the run's seed.

Both keep the measured latencies (:class:`MeasuredRequests`, ``workload.measured``) so a run
can be compared with the real one (:mod:`schedlab.results.compare`).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import attrs
import numpy as np

from schedlab.configs import int_field, path_field
from schedlab.errors import WorkloadError

from .arrivals import arrivals_ms
from .columns import OpenLoopWorkload, RequestColumns
from .records import jsonl_objects


@attrs.frozen(eq=False)
class MeasuredRequests:
    """What a real run measured, one entry per request (ms; NaN where not measured).

    TTFT is first token - arrival, TPOT ``(last token - first token) / (output - 1)`` (NaN for
    one-token outputs, as in schedlab's metrics), latency last token - arrival.
    """

    source: str
    arrival_ms: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    output_tokens: np.ndarray
    scheduled_ms: np.ndarray | None = None  # first scheduled (vLLM's scheduled_ts), if logged

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
    if not path.is_file():
        raise WorkloadError(f"{path}: file not found")
    with open(path) as fh:
        rows = list(jsonl_objects(fh, str(path)))
    if not rows:
        raise WorkloadError(f"{path}: no requests in the file")
    return rows


def _number(path, line, row, key, *, whole=False, minimum=None):
    if key not in row:
        raise WorkloadError(f"{path}: line {line}: missing field {key!r}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"{path}: line {line}: {key}: must be a number, got {value!r}")
    if whole and value != int(value):
        raise WorkloadError(f"{path}: line {line}: {key}: must be a whole number, got {value!r}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{path}: line {line}: {key}: must be >= {minimum}, got {value!r}")
    return int(value) if whole else float(value)


def _token_ids(path, line, row, key="input_tok_ids"):
    ids = row.get(key)
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise WorkloadError(f"{path}: line {line}: {key}: must be a list of whole numbers")
    return ids


TIMESTAMPS = ("queued_ts", "first_token_ts", "last_token_ts")


@attrs.frozen
class VllmLogConfig:
    path: str = path_field(help="vLLM per-request log (JSONL: input_toks, output_toks, queued_ts, "
                                "first_token_ts, last_token_ts)")
    prompts: str | None = path_field(None, optional=True,
                                     help="JSONL with each request's input_tok_ids, line by line in the log's "
                                          "order (e.g. the workload file the run replayed)")
    hash_block_tokens: int = int_field(16, min=1, help="tokens per prefix block id (vLLM's block size)")
    start: int = int_field(0, min=0, help="skip the first N requests of the log (arrivals then count from "
                                          "the first one kept): fit on one part, predict another")
    limit: int | None = int_field(None, min=1, optional=True, help="use only N requests (after start)")


def load_vllm_log(path, *, prompts=None, hash_block_tokens: int = 16, start: int = 0, limit: int | None = None):
    """``(arrival_ms, columns, measured)`` of a vLLM per-request log (see the module docstring).
    Prefix block ids are computed over the whole log, so a part shares ids with the rest."""
    path = Path(path)
    rows = _read_jsonl(path)
    if start >= len(rows):
        raise WorkloadError(f"{path}: start = {start} skips all {len(rows)} requests")
    keep = slice(start, None if limit is None else start + limit)
    n = len(rows)
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    stamps = {key: np.empty(n) for key in TIMESTAMPS}
    scheduled = np.empty(n)
    token_lists: list = []
    given_ids: list = []
    for i, (line, row) in enumerate(rows):
        prompt[i] = _number(path, line, row, "input_toks", whole=True, minimum=1)
        output[i] = _number(path, line, row, "output_toks", whole=True, minimum=1)
        for key in TIMESTAMPS:
            stamps[key][i] = _number(path, line, row, key)
        scheduled[i] = _number(path, line, row, "scheduled_ts") if "scheduled_ts" in row else np.nan
        if not stamps["queued_ts"][i] <= stamps["first_token_ts"][i] <= stamps["last_token_ts"][i]:
            raise WorkloadError(f"{path}: line {line}: timestamps out of order "
                                f"(need queued_ts <= first_token_ts <= last_token_ts)")
        token_lists.append(_token_ids(path, line, row))
        hashes = row.get("block_hashes")
        if hashes is not None and (not isinstance(hashes, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes)):
            raise WorkloadError(f"{path}: line {line}: block_hashes: must be a list of whole numbers")
        given_ids.append(tuple(hashes) if hashes is not None else None)
    if prompts is not None:
        prompt_rows = _read_jsonl(Path(prompts))[:n]
        if len(prompt_rows) < n:
            raise WorkloadError(f"{prompts}: {len(prompt_rows)} prompts for the {n} requests of {path}")
        token_lists = []
        for i, (line, row) in enumerate(prompt_rows[:n]):
            ids = _token_ids(prompts, line, row)
            if ids is None:
                raise WorkloadError(f"{prompts}: line {line}: missing field 'input_tok_ids'")
            if len(ids) != prompt[i]:
                raise WorkloadError(f"{prompts}: line {line}: {len(ids)} input_tok_ids but line {rows[i][0]} "
                                    f"of {path} has input_toks = {prompt[i]} (is it the same run, in order?)")
            token_lists.append(ids)
    per_row: dict = {}
    prompt, output, token_lists, given_ids = prompt[keep], output[keep], token_lists, given_ids[keep]
    scheduled = scheduled[keep]
    stamps = {key: value[keep] for key, value in stamps.items()}
    if any(t is not None for t in token_lists):
        ids = prefix_block_ids([t or [] for t in token_lists], hash_block_tokens)
        per_row["block_hashes"] = [h if t is not None else None for h, t in zip(ids, token_lists)][keep]
    elif any(h is not None for h in given_ids):
        per_row["block_hashes"] = given_ids
    constant = {"hash_block_tokens": hash_block_tokens} if per_row else {}
    queued = stamps["queued_ts"]
    arrival = (queued - queued.min()) * 1e3
    first, last = stamps["first_token_ts"], stamps["last_token_ts"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (last - first) * 1e3 / (output - 1), np.nan)
    measured = MeasuredRequests(str(path), arrival, (first - queued) * 1e3, tpot, (last - queued) * 1e3, output,
                                (scheduled - queued.min()) * 1e3 if np.isfinite(scheduled).all() else None)
    return arrival, RequestColumns(prompt, output, per_row, constant), measured


def make_vllm_log_workload(config: VllmLogConfig) -> OpenLoopWorkload:
    arrival, columns, measured = load_vllm_log(config.path, prompts=config.prompts,
                                               hash_block_tokens=config.hash_block_tokens, start=config.start,
                                               limit=config.limit)
    workload = OpenLoopWorkload(lambda seed: (arrival, columns), name="vllm_log", num_requests=len(columns))
    workload.measured = measured
    return workload


# --- vllm bench serve --save-result -----------------------------------------------------------


@attrs.frozen
class VllmBenchConfig:
    path: str = path_field(help="the JSON `vllm bench serve --save-result --save-detailed` wrote")
    limit: int | None = int_field(None, min=1, optional=True, help="use only the first N requests")


def _bench_list(path, data, key, n=None):
    value = data.get(key)
    if not isinstance(value, list):
        raise WorkloadError(f"{path}: missing list {key!r} (save the result with --save-detailed)")
    if n is not None and len(value) != n:
        raise WorkloadError(f"{path}: {key} has {len(value)} entries but input_lens has {n}")
    return value


def load_vllm_bench(path, *, limit: int | None = None):
    """``(rate, burstiness, columns, measured)`` of a ``vllm bench serve`` result file."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: expected a JSON object")
    inputs = _bench_list(path, data, "input_lens")
    n = len(inputs)
    outputs = _bench_list(path, data, "output_lens", n)
    ttfts = _bench_list(path, data, "ttfts", n)
    itls = _bench_list(path, data, "itls", n)
    errors = data.get("errors") or [""] * n
    keep = [i for i in range(n) if not errors[i] and outputs[i] and outputs[i] >= 1][:limit]
    if not keep:
        raise WorkloadError(f"{path}: no successful requests")
    rate = data.get("request_rate", "inf")
    try:
        rate = float(rate)
    except (TypeError, ValueError):
        raise WorkloadError(f"{path}: request_rate: must be a number or \"inf\", got {rate!r}") from None
    burstiness = data.get("burstiness", 1.0)
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) or not burstiness > 0:
        raise WorkloadError(f"{path}: burstiness: must be a number > 0, got {burstiness!r}")
    for key, values in (("input_lens", inputs), ("output_lens", outputs)):
        for i in keep:
            if isinstance(values[i], bool) or not isinstance(values[i], int) or values[i] < 1:
                raise WorkloadError(f"{path}: {key}[{i}]: must be a whole number >= 1, got {values[i]!r}")
    prompt = np.array([inputs[i] for i in keep], dtype=np.int64)
    output = np.array([outputs[i] for i in keep], dtype=np.int64)
    ttft = np.array([float(ttfts[i]) * 1e3 for i in keep])
    decode = np.array([float(sum(itls[i])) * 1e3 for i in keep])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, decode / (output - 1), np.nan)
    measured = MeasuredRequests(str(path), np.full(len(keep), np.nan), ttft, tpot, ttft + decode, output)
    return rate, float(burstiness), RequestColumns(prompt, output), measured


def make_vllm_bench_workload(config: VllmBenchConfig) -> OpenLoopWorkload:
    rate, burstiness, columns, measured = load_vllm_bench(config.path, limit=config.limit)
    n = len(columns)

    def build(seed: int):
        if math.isinf(rate):
            return np.zeros(n), columns
        # vllm bench serve: gamma gaps, shape = burstiness, mean 1 / rate (cv = 1 / sqrt(shape)).
        return arrivals_ms("gamma", n, seed, rate=rate, cv=1.0 / math.sqrt(burstiness)), columns

    workload = OpenLoopWorkload(build, name="vllm_bench", num_requests=n)
    workload.measured = measured
    workload.info["request_rate"] = rate
    workload.info["burstiness"] = burstiness
    return workload
