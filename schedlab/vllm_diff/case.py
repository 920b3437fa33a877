"""One differential case: shared settings, requests, and what each engine made of them.

Time is counted in iterations of exactly 1 ms on both engines, so every timestamp is a whole
number of ms. ``first_scheduled_ms`` is the start of the first iteration a request is in;
``first_token_ms`` and ``finish_ms`` are the *ends* of the iterations that produced its first
and last token (schedlab's ``requests.csv`` conventions). ``cached_tokens`` adds up the
prefix-cache hit of every admission (first one and each resumption after a preemption).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import attrs

from schedlab.configs import bool_field, int_field, str_field

FIELDS = ("first_scheduled_ms", "first_token_ms", "finish_ms", "preemptions", "cached_tokens")
SHORT = {"first_scheduled_ms": "scheduled", "first_token_ms": "first_token", "finish_ms": "finish",
         "preemptions": "preemptions", "cached_tokens": "cached"}

# Room for the token ids of :mod:`.tokens` and for vLLM's ``max_model_len``.
MAX_MODEL_LEN = 8192
MAX_REQUESTS = 1000
MAX_GROUPS = 100


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@attrs.frozen
class DiffSettings:
    """The settings both engines get (vLLM ``SchedulerConfig``/``CacheConfig`` and schedlab's
    ``vllm`` scheduler and ``paged`` KV cache).

    ``num_blocks`` is the number of *usable* blocks: vLLM 0.33's ``BlockPool.__init__`` takes
    one block of its pool as the ``null_block`` (``vllm/v1/core/block_pool.py``), so vLLM is
    given ``num_blocks + 1``.
    """

    block_size: int = int_field(16, min=1)
    num_blocks: int = int_field(1024, min=1)
    max_num_seqs: int = int_field(8, min=1)
    max_num_batched_tokens: int = int_field(64, min=1)
    long_prefill_token_threshold: int = int_field(0, min=0, max=MAX_MODEL_LEN)
    prefix_caching: bool = bool_field(False)
    policy: str = str_field("fcfs", choices=("fcfs", "priority"))


@attrs.frozen
class DiffRequest:
    """A request: arrives at the start of iteration ``arrival`` (ms) and generates exactly
    ``output_tokens`` tokens (``max_tokens`` = ``output_tokens``, EOS ignored). Its first
    ``prefix_len`` prompt tokens are the shared prompt of ``group``; the rest are its own."""

    id: int = int_field(min=0, max=MAX_REQUESTS - 1)
    arrival: int = int_field(min=0)
    prompt_tokens: int = int_field(min=1)
    output_tokens: int = int_field(min=1)
    priority: int = int_field(0)
    group: int | None = int_field(None, min=0, max=MAX_GROUPS - 1, optional=True)
    prefix_len: int = int_field(0, min=0)

    def __attrs_post_init__(self):
        if self.prefix_len > self.prompt_tokens:
            raise ValueError(f"request {self.id}: prefix_len {self.prefix_len} > prompt_tokens {self.prompt_tokens}")
        if self.prefix_len and self.group is None:
            raise ValueError(f"request {self.id}: prefix_len {self.prefix_len} needs a group")
        if self.prompt_tokens + self.output_tokens > MAX_MODEL_LEN:
            raise ValueError(f"request {self.id}: prompt + output exceeds {MAX_MODEL_LEN} tokens")


@attrs.frozen
class Case:
    """Settings plus requests; ``group`` and ``seed`` say where it came from (for reports)."""

    settings: DiffSettings
    requests: tuple = attrs.field(converter=tuple)
    group: str = ""
    seed: int | None = None

    def in_arrival_order(self) -> list[DiffRequest]:
        """The requests by (arrival, id): the order both engines receive them."""
        return sorted(self.requests, key=lambda r: (r.arrival, r.id))

    def problems(self) -> list[str]:
        """Why this case cannot be compared fairly (empty when it can).

        Each request must fit the cache alone (``prompt + output - 1`` tokens: the last
        sampled token is never computed), or schedlab rejects it and vLLM 0.33 would
        preempt it forever; ids must be unique; the budget must cover ``max_num_seqs``
        (both engines refuse otherwise)."""
        s = self.settings
        out = []
        if s.max_num_batched_tokens < s.max_num_seqs:
            out.append("max_num_batched_tokens < max_num_seqs")
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            out.append("duplicate request ids")
        for r in self.requests:
            need = blocks_for(r.prompt_tokens + r.output_tokens - 1, s.block_size)
            if need > s.num_blocks:
                out.append(f"request {r.id} needs {need} blocks alone, the cache has {s.num_blocks}")
        if not self.requests:
            out.append("no requests")
        return out

    def to_dict(self) -> dict:
        return {"group": self.group, "seed": self.seed, "settings": attrs.asdict(self.settings),
                "requests": [attrs.asdict(r) for r in self.requests]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Case":
        return cls(settings=DiffSettings(**data["settings"]),
                   requests=[DiffRequest(**r) for r in data["requests"]],
                   group=data.get("group", ""), seed=data.get("seed"))

    @classmethod
    def from_json(cls, text: str) -> "Case":
        return cls.from_dict(json.loads(text))


@attrs.frozen
class Outcome:
    """What one engine did with one request (``None``: it never got there)."""

    first_scheduled_ms: int | None
    first_token_ms: int | None
    finish_ms: int | None
    preemptions: int
    cached_tokens: int


@attrs.frozen
class Sides:
    """Settings given to one engine only, on top of :class:`DiffSettings`: schedlab scheduler
    keys (``--set scheduler.KEY=VALUE``) and vLLM ``SchedulerConfig`` fields
    (``--vllm-set KEY=VALUE``), e.g. ``reserve_full_prompt`` / ``scheduler_reserve_full_isl``."""

    schedlab_scheduler: tuple = attrs.field(default=(), converter=lambda d: tuple(sorted(dict(d).items())))
    vllm_scheduler: tuple = attrs.field(default=(), converter=lambda d: tuple(sorted(dict(d).items())))

    def describe(self) -> str:
        parts = []
        if self.schedlab_scheduler:
            parts.append("schedlab " + " ".join(f"scheduler.{k}={_value(v)}" for k, v in self.schedlab_scheduler))
        if self.vllm_scheduler:
            parts.append("vLLM " + " ".join(f"{k}={_value(v)}" for k, v in self.vllm_scheduler))
        return "; ".join(parts)


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def differing_fields(a: Mapping[int, Outcome], b: Mapping[int, Outcome]) -> dict[int, tuple[str, ...]]:
    """Per request id, the :data:`FIELDS` on which two engines' outcomes differ (only ids
    that differ somewhere; an id missing on one side differs on every field)."""
    out = {}
    for rid in sorted(set(a) | set(b)):
        x, y = a.get(rid), b.get(rid)
        if x is None or y is None:
            out[rid] = FIELDS
            continue
        diff = tuple(f for f in FIELDS if getattr(x, f) != getattr(y, f))
        if diff:
            out[rid] = diff
    return out


def _cell(o: Outcome | None, field: str) -> str:
    if o is None:
        return "?"
    v = getattr(o, field)
    return "-" if v is None else str(v)


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in rows]


def describe(case: Case, vllm: Mapping[int, Outcome], schedlab: Mapping[int, Outcome],
             sides: Sides | None = None, *, notes: str = "") -> str:
    """A self-contained reproducer: settings, requests, both engines' results per request
    (``vllm/schedlab``, differing cells marked ``*``) and the command that replays it."""
    s = case.settings
    where = f"{case.group} seed {case.seed}" if case.group else "case"
    lines = [f"{where}: {len(case.requests)} request(s){' -- ' + notes if notes else ''}"]
    lines.append("  settings: " + " ".join(f"{k}={_value(v)}" for k, v in attrs.asdict(s).items()))
    if sides is not None and (sides.schedlab_scheduler or sides.vllm_scheduler):
        lines.append("  only one side: " + sides.describe())
    rows = [["id", "arrival", "prompt", "output", "priority", "shared prefix"]]
    for r in case.in_arrival_order():
        prefix = f"group {r.group}: first {r.prefix_len}" if r.prefix_len else "-"
        rows.append([str(r.id), str(r.arrival), str(r.prompt_tokens), str(r.output_tokens), str(r.priority), prefix])
    lines += _table(rows)
    diff = differing_fields(vllm, schedlab)
    lines.append("  outcomes as vllm/schedlab, * where they differ (ms; preemptions; cached tokens):")
    rows = [["id"] + [SHORT[f] for f in FIELDS]]
    for r in case.in_arrival_order():
        cells = [str(r.id)]
        for f in FIELDS:
            mark = "*" if f in diff.get(r.id, ()) else ""
            cells.append(f"{_cell(vllm.get(r.id), f)}/{_cell(schedlab.get(r.id), f)}{mark}")
        rows.append(cells)
    lines += _table(rows)
    replay = f"  replay: python tools/vllm_diff.py --replay '{case.to_json()}'"
    if sides is not None:
        replay += "".join(f" --set scheduler.{k}={_value(v)}" for k, v in sides.schedlab_scheduler)
        replay += "".join(f" --vllm-set {k}={_value(v)}" for k, v in sides.vllm_scheduler)
    lines.append(replay)
    return "\n".join(lines)
