"""Requests kept as columns, and the lazy generator that turns them into Request objects.

Open-loop workloads compute everything with numpy first (lengths, arrival times) and create
:class:`~schedlab.model.Request` objects only as the engine pulls them, so a million-request
workload never holds a million Request objects at once.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import attrs
import numpy as np

from schedlab.configs import MAX_TIME_MS
from schedlab.errors import WorkloadError
from schedlab.model import Request

#: Request fields other than id/arrival/lengths, with their defaults (filled in for missing values).
REQUEST_DEFAULTS: dict[str, Any] = {
    a.name: a.default
    for a in attrs.fields(Request)
    if a.default is not attrs.NOTHING and a.name not in ("id", "arrival_ms", "prompt_tokens", "output_tokens")
}


@attrs.frozen(eq=False)
class RequestColumns:
    """Everything about a set of requests except their arrival times.

    :ivar prompt_tokens: int array, one per request.
    :ivar output_tokens: int array, one per request.
    :ivar per_row: Request field -> list with one value per request (fields that vary).
    :ivar constant: Request field -> the value every request has.
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    per_row: dict[str, list] = attrs.field(factory=dict)
    constant: dict[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if len(self.output_tokens) != n or any(len(v) != n for v in self.per_row.values()):
            raise ValueError("RequestColumns: every column must have one value per request")
        unknown = (set(self.per_row) | set(self.constant)) - set(REQUEST_DEFAULTS)
        if unknown:
            raise ValueError(f"RequestColumns: not Request fields: {sorted(unknown)}")

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def with_constant(self, **fields: Any) -> "RequestColumns":
        """The same requests with ``fields`` set on all of them (replacing per-row values)."""
        per_row = {k: v for k, v in self.per_row.items() if k not in fields}
        return RequestColumns(self.prompt_tokens, self.output_tokens, per_row, {**self.constant, **fields})

    def with_max_tokens_cap(self, cap: int | None) -> "RequestColumns":
        """Every request's ``max_tokens`` becomes ``min(its own, cap)`` (just ``cap`` if it had none)."""
        if cap is None:
            return self
        own = self.per_row.get("max_tokens")
        if own is None:
            own_cap = self.constant.get("max_tokens")
            return self.with_constant(max_tokens=cap if own_cap is None else min(own_cap, cap))
        capped = [cap if v is None else min(v, cap) for v in own]
        return RequestColumns(self.prompt_tokens, self.output_tokens, {**self.per_row, "max_tokens": capped},
                              self.constant)

    def select(self, index: np.ndarray) -> "RequestColumns":
        """The requests at positions ``index`` (an int array), in that order."""
        positions = index.tolist()
        return RequestColumns(
            self.prompt_tokens[index],
            self.output_tokens[index],
            {k: [v[i] for i in positions] for k, v in self.per_row.items()},
            dict(self.constant),
        )


def concat_columns(parts: list[RequestColumns]) -> RequestColumns:
    """The requests of ``parts`` one after the other (each part with the same fields)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if any(set(p.per_row) != set(first.per_row) or p.constant != first.constant for p in parts):
        raise ValueError("concat_columns: every part must have the same per-row fields and constants")
    return RequestColumns(
        np.concatenate([p.prompt_tokens for p in parts]),
        np.concatenate([p.output_tokens for p in parts]),
        {k: [v for p in parts for v in p.per_row[k]] for k in first.per_row},
        dict(first.constant),
    )


def per_row_or_none(values: list | None, field: str) -> list | None:
    """``values`` with missing entries (None) replaced by the Request default of ``field``."""
    if values is None:
        return None
    default = REQUEST_DEFAULTS[field]
    return [default if v is None else v for v in values]


#: Why arrival times are bounded, for messages: "must be <= 1e+12 (ms, the simulated clock's end ...)".
CLOCK_END = "the simulated clock's end, about 31.7 years"


def check_replayed_arrivals(path, arrival_ms: np.ndarray | None, time_scale: float) -> None:
    """WorkloadError naming ``path`` and ``time_scale`` when the file's arrivals (each already within
    the clock, as checked where the file is read) times ``time_scale`` pass the clock's end."""
    if arrival_ms is None or not len(arrival_ms):
        return
    last = float(arrival_ms.max()) * time_scale
    if not last <= MAX_TIME_MS:
        raise WorkloadError(f"{path}: with time_scale = {time_scale:g} the last request arrives at {last:.4g} ms, "
                            f"past the simulated clock's end ({MAX_TIME_MS:g} ms, about 31.7 years)")


def scaled(times: np.ndarray, factor: float) -> np.ndarray:
    """``times * factor`` without numpy's overflow warning: a product beyond the float range is
    inf, which :func:`iter_requests` refuses as past the simulated clock's end."""
    with np.errstate(over="ignore"):
        return times * factor


def iter_requests(arrival_ms: np.ndarray, columns: RequestColumns, *, first_id: int = 0) -> Iterator[Request]:
    """Requests in arrival order with ids ``first_id``, ``first_id + 1``, ...; created one at a time.

    Arrivals that are not sorted are sorted stably (equal times keep their row order), and ids
    follow the sorted order.
    """
    arrival = np.asarray(arrival_ms, dtype=np.float64)
    if arrival.shape != (len(columns),):
        raise ValueError(f"iter_requests: {arrival.shape[0]} arrival times for {len(columns)} requests")
    if np.isnan(arrival).any() or (arrival.size and arrival.min() < 0):
        raise WorkloadError("arrival times must be finite and >= 0")
    if arrival.size and arrival.max() > MAX_TIME_MS:  # also inf: a rate or time_scale beyond the float range
        raise WorkloadError(f"arrival times must be at most {MAX_TIME_MS:g} ms (about 31.7 years), the end of the "
                            f"simulated clock; the last is {arrival.max():.3g} ms (check rate and time_scale)")
    if arrival.size > 1 and np.any(arrival[1:] < arrival[:-1]):
        order = np.argsort(arrival, kind="stable")
        arrival = arrival[order]
        columns = columns.select(order)
    return _generate(arrival, columns, first_id)


#: Rows turned into Python numbers at a time (the arrays stay numpy: 24 bytes a request, not ~100).
_BLOCK = 1 << 16


def _generate(arrival: np.ndarray, columns: RequestColumns, first_id: int = 0) -> Iterator[Request]:
    constant = columns.constant
    names = tuple(columns.per_row)
    varying = [columns.per_row[name] for name in names]
    for lo in range(0, len(arrival), _BLOCK):
        hi = lo + _BLOCK
        ids = range(first_id + lo, first_id + hi)
        times = arrival[lo:hi].tolist()
        prompts = columns.prompt_tokens[lo:hi].tolist()
        outputs = columns.output_tokens[lo:hi].tolist()
        if not names:
            for i, t, p, o in zip(ids, times, prompts, outputs):
                yield Request(id=i, arrival_ms=t, prompt_tokens=p, output_tokens=o, **constant)
            continue
        for i, t, p, o, *rest in zip(ids, times, prompts, outputs, *(v[lo:hi] for v in varying)):
            yield Request(id=i, arrival_ms=t, prompt_tokens=p, output_tokens=o, **constant, **dict(zip(names, rest)))


class OpenLoopWorkload:
    """An open-loop workload: a function ``seed -> (arrival_ms, RequestColumns)`` made lazy.

    ``requests(seed)`` draws the arrays at once (so bad settings fail at the call) and returns
    a generator that creates the Request objects as they are pulled.
    """

    closed_loop = False

    def __init__(self, build: Callable[[int], tuple[np.ndarray, RequestColumns]], *, name: str,
                 num_requests: int | None = None):
        self._build = build
        self.name = name
        #: how many requests ``requests(seed)`` yields (for progress bars); None if unknown.
        self.num_requests = num_requests
        #: facts about the loaded data worth reporting (e.g. ``zero_token_rows`` of a trace).
        self.info: dict[str, Any] = {}

    def requests(self, seed: int) -> Iterator[Request]:
        arrival_ms, columns = self._build(check_seed(seed))
        return iter_requests(arrival_ms, columns)

    def __repr__(self) -> str:
        return f"<{self.name} workload: {self.num_requests} requests>"


def check_seed(seed: Any) -> int:
    """``seed`` if it is a whole number >= 0 (what numpy's generators accept), else WorkloadError."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return int(seed)
    raise WorkloadError(f"the seed must be a whole number >= 0, got {seed!r}")
