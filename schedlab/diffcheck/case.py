"""One differential case: settings, requests, and what each engine made of them.

Time is counted in iterations of exactly 1 ms on both engines, so every timestamp is a whole
number of ms. ``first_scheduled_ms`` is the start of the first iteration a request is in;
``first_token_ms`` and ``finish_ms`` are the *ends* of the iterations that produced its first
and last token (schedlab's ``requests.csv`` conventions). ``cached_tokens`` adds up the
prefix-cache hit of every admission (first one and each resumption after a preemption).

The settings are the harness's own frozen attrs class (vLLM's or SGLang's); a case asks them
what makes it unfair to compare (:meth:`problems`) and how to make them simpler (``simpler``,
for the shrinker). An outcome class names the fields it compares in ``FIELDS`` and their short
column titles in ``SHORT``.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import attrs

from schedlab.configs import float_field, int_field

# Room for the token ids of :mod:`.tokens` and for an engine's model length.
MAX_MODEL_LEN = 8192
MAX_REQUESTS = 1000
MAX_GROUPS = 100


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@attrs.frozen
class DiffRequest:
    """A request: arrives at the start of iteration ``arrival`` (ms) and generates exactly
    ``output_tokens`` tokens. ``max_tokens`` is the client's limit: ``None`` means
    ``output_tokens`` with EOS ignored (the engine is asked for exactly that many); a larger
    value means the model stops at an EOS after ``output_tokens`` tokens, which the engine cannot
    know in advance. Its first ``prefix_len`` prompt tokens are the shared prompt of ``group``;
    the rest are its own."""

    id: int = int_field(min=0, max=MAX_REQUESTS - 1)
    arrival: int = int_field(min=0)
    prompt_tokens: int = int_field(min=1)
    output_tokens: int = int_field(min=1)
    priority: int = int_field(0)
    group: int | None = int_field(None, min=0, max=MAX_GROUPS - 1, optional=True)
    prefix_len: int = int_field(0, min=0)
    max_tokens: int | None = int_field(None, min=1, optional=True)
    #: when the client's abort reaches the engine (ms, a half: never at an iteration's edge), or None
    abort_at: float | None = float_field(None, min=0.0, optional=True)

    def __attrs_post_init__(self):
        if self.prefix_len > self.prompt_tokens:
            raise ValueError(f"request {self.id}: prefix_len {self.prefix_len} > prompt_tokens {self.prompt_tokens}")
        if self.prefix_len and self.group is None:
            raise ValueError(f"request {self.id}: prefix_len {self.prefix_len} needs a group")
        if self.max_tokens is not None and self.max_tokens < self.output_tokens:
            raise ValueError(f"request {self.id}: max_tokens {self.max_tokens} < output_tokens {self.output_tokens}")
        if self.prompt_tokens + self.limit > MAX_MODEL_LEN:
            raise ValueError(f"request {self.id}: prompt + max_tokens exceeds {MAX_MODEL_LEN} tokens")
        if self.abort_at is not None and (self.abort_at <= self.arrival or self.abort_at % 1 != 0.5):
            raise ValueError(f"request {self.id}: abort_at {self.abort_at} must be a half ms after its arrival "
                             f"({self.arrival})")

    @property
    def limit(self) -> int:
        """The output length the engine is told (``max_tokens``, else the output)."""
        return self.output_tokens if self.max_tokens is None else self.max_tokens

    @property
    def ignore_eos(self) -> bool:
        return self.max_tokens is None


def _plain(value):
    return str(value).lower() if isinstance(value, bool) else str(value)


@attrs.frozen
class Case:
    """Settings plus requests; ``group`` and ``seed`` say where it came from (for reports)."""

    settings: Any
    requests: tuple = attrs.field(converter=tuple)
    group: str = ""
    seed: int | None = None

    def in_arrival_order(self) -> list[DiffRequest]:
        """The requests by (arrival, id): the order both engines receive them."""
        return sorted(self.requests, key=lambda r: (r.arrival, r.id))

    def problems(self) -> list[str]:
        """Why this case cannot be compared fairly (empty when it can): the settings' own
        reasons (``settings.problems(requests)``), duplicate ids, no requests."""
        out = list(self.settings.problems(self.requests))
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            out.append("duplicate request ids")
        if not self.requests:
            out.append("no requests")
        return out

    def to_dict(self) -> dict:
        requests = []
        for r in self.requests:
            d = attrs.asdict(r)
            for key in ("max_tokens", "abort_at"):
                if d[key] is None:
                    del d[key]  # the replay lines of cases without them stay as they were
            requests.append(d)
        return {"group": self.group, "seed": self.seed, "settings": attrs.asdict(self.settings),
                "requests": requests}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], settings_type) -> "Case":
        return cls(settings=settings_type(**data["settings"]),
                   requests=[DiffRequest(**r) for r in data["requests"]],
                   group=data.get("group", ""), seed=data.get("seed"))

    @classmethod
    def from_json(cls, text: str, settings_type) -> "Case":
        return cls.from_dict(json.loads(text), settings_type)


@attrs.frozen
class Sides:
    """Settings given to one engine only, on top of the case's: schedlab scheduler keys
    (``--set scheduler.KEY=VALUE``) and the engine's own (``--ENGINE-set KEY=VALUE``)."""

    schedlab_scheduler: tuple = attrs.field(default=(), converter=lambda d: tuple(sorted(dict(d).items())))
    engine: tuple = attrs.field(default=(), converter=lambda d: tuple(sorted(dict(d).items())))

    def describe(self, engine: str) -> str:
        parts = []
        if self.schedlab_scheduler:
            parts.append("schedlab " + " ".join(f"scheduler.{k}={_plain(v)}" for k, v in self.schedlab_scheduler))
        if self.engine:
            parts.append(f"{engine} " + " ".join(f"{k}={_plain(v)}" for k, v in self.engine))
        return "; ".join(parts)

    def replay_flags(self, engine_flag: str) -> str:
        return ("".join(f" --set scheduler.{k}={_plain(v)}" for k, v in self.schedlab_scheduler)
                + "".join(f" {engine_flag} {k}={_plain(v)}" for k, v in self.engine))


def differing_fields(a: Mapping[int, Any], b: Mapping[int, Any], fields: tuple) -> dict[int, tuple[str, ...]]:
    """Per request id, the ``fields`` on which two engines' outcomes differ (only ids that
    differ somewhere; an id missing on one side differs on every field)."""
    out = {}
    for rid in sorted(set(a) | set(b)):
        x, y = a.get(rid), b.get(rid)
        if x is None or y is None:
            out[rid] = fields
            continue
        diff = tuple(f for f in fields if getattr(x, f) != getattr(y, f))
        if diff:
            out[rid] = diff
    return out


def _cell(o, field: str) -> str:
    if o is None:
        return "?"
    v = getattr(o, field)
    if v is None:
        return "-"
    if isinstance(v, tuple):
        return "+".join(map(str, v)) or "()"
    return str(v)


def table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in rows]


@attrs.frozen
class Engine:
    """How a harness names its engine in reports: ``key`` (``vllm``) heads the outcome column
    pairs, ``label`` (``vLLM``) the one-sided settings, ``tool`` and ``flag`` make the replay
    line; ``outcome`` is the outcome class (its ``FIELDS`` and ``SHORT``)."""

    key: str
    label: str
    tool: str
    flag: str
    outcome: type
    settings: type


def describe(engine: Engine, case: Case, theirs: Mapping[int, Any], ours: Mapping[int, Any],
             sides: Sides | None = None, *, notes: str = "") -> str:
    """A self-contained reproducer: settings, requests, both engines' results per request
    (``ENGINE/schedlab``, differing cells marked ``*``) and the command that replays it."""
    fields, short = engine.outcome.FIELDS, engine.outcome.SHORT
    where = f"{case.group} seed {case.seed}" if case.group else "case"
    lines = [f"{where}: {len(case.requests)} request(s){' -- ' + notes if notes else ''}"]
    lines.append("  settings: " + " ".join(f"{k}={_plain(v)}" for k, v in attrs.asdict(case.settings).items()))
    if sides is not None and (sides.schedlab_scheduler or sides.engine):
        lines.append("  only one side: " + sides.describe(engine.label))
    limits = any(r.max_tokens is not None for r in case.requests)
    aborts = any(r.abort_at is not None for r in case.requests)
    rows = [["id", "arrival", "prompt", "output"] + (["max_tokens"] if limits else []) + (["abort"] if aborts else [])
            + ["priority", "shared prefix"]]
    for r in case.in_arrival_order():
        prefix = f"group {r.group}: first {r.prefix_len}" if r.prefix_len else "-"
        limit = [str(r.max_tokens) if r.max_tokens is not None else "-"] if limits else []
        abort = [str(r.abort_at) if r.abort_at is not None else "-"] if aborts else []
        rows.append([str(r.id), str(r.arrival), str(r.prompt_tokens), str(r.output_tokens)] + limit + abort
                    + [str(r.priority), prefix])
    lines += table(rows)
    diff = differing_fields(theirs, ours, fields)
    lines.append(f"  outcomes as {engine.key}/schedlab, * where they differ:")
    rows = [["id"] + [short[f] for f in fields]]
    for r in case.in_arrival_order():
        cells = [str(r.id)]
        for f in fields:
            mark = "*" if f in diff.get(r.id, ()) else ""
            cells.append(f"{_cell(theirs.get(r.id), f)}/{_cell(ours.get(r.id), f)}{mark}")
        rows.append(cells)
    lines += table(rows)
    replay = f"  replay: python {engine.tool} --replay '{case.to_json()}'"
    if sides is not None:
        replay += sides.replay_flags(engine.flag)
    lines.append(replay)
    return "\n".join(lines)

