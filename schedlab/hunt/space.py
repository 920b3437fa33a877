"""The search space of a hunt: workload bounds (and settings' ranges) as a unit cube.

A candidate is a point ``x`` of ``[0, 1]^D``; :meth:`Space.decode` turns it into requests and
settings. Random sampling draws ``x`` uniformly, so a random candidate is an ordinary random
workload of the bounds -- gamma-distributed gaps at a rate and burstiness drawn from their
ranges, log-uniform lengths, a uniform class mix -- and the optimiser moves the same
coordinates one by one::

    [hunt.workload]
    requests = [2, 40]             # how many requests (uniform over the whole numbers)
    rate = [0.5, 8.0]              # mean arrivals per second (log-uniform)
    cv = [0.0, 4.0]                # gaps' coefficient of variation: 0 even, 1 Poisson, > 1 bursty
    prompt = [16, 4096]            # prompt tokens after any shared prefix (log-uniform)
    output = [1, 512]              # output tokens (log-uniform)
    [hunt.workload.classes.batch]  # optional: classes, each with its own lengths and priority/client
    prompt = [1000, 8000]
    priority = 1
    [hunt.workload.prefix]         # optional: shared prefixes (system prompts)
    groups = 4                     # how many
    tokens = [256, 2048]           # each group's prefix length (log-uniform)
    share = [0.0, 1.0]             # share of requests that use one

Coordinates: ``[requests, rate, cv, share?, group lengths..., settings...]`` followed by, for
each of the most requests allowed, ``[gap, prompt, output, class?, group?]``: request ``i``'s
gap to the previous one is the gamma quantile of its coordinate (the first arrives at 0),
its lengths the log-uniform quantiles of theirs. Only the first ``requests`` are used.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from ..configs import MAX_INT, MAX_TOKENS, FieldError, from_table, int_field, str_field, table_field
from ..errors import ConfigError
from .config import number_range, range_field

MAX_HUNT_REQUESTS = 10_000   # a candidate runs several times per evaluation: keep it a small workload
MAX_CV = 100.0
#: How far (ms) a workload's gaps may be from ones the space draws: float rounding only (arrival
#: times are sums of gaps), so evenly spaced arrivals at 2 per second stay 500 ms apart, not 499
ARRIVAL_SLACK_MS = 1e-6


@attrs.frozen
class ClassSpace:
    prompt: tuple | None = range_field(None, integer=True, low=1, high=MAX_TOKENS,
                                       help="prompt tokens [low, high] (default: the workload's)")
    output: tuple | None = range_field(None, integer=True, low=1, high=MAX_TOKENS,
                                       help="output tokens [low, high] (default: the workload's)")
    priority: int = int_field(0, help="priority of the class's requests (lower = more important)")
    client: str = str_field("", help="client of the class's requests (default: the class's name)")


@attrs.frozen
class PrefixSpace:
    tokens: tuple = range_field(integer=True, low=1, high=MAX_TOKENS, help="a group's prefix length [low, high]")
    groups: int = int_field(1, min=1, max=1000, help="how many shared prefixes there are")
    share: tuple = range_field((0.0, 1.0), integer=False, low=0.0, high=1.0,
                               help="share of requests using a group's prefix [low, high]: the chance that each "
                                    "one does (with share 1 every request does)")


@attrs.frozen
class WorkloadSpace:
    requests: tuple = range_field(integer=True, low=1, high=MAX_HUNT_REQUESTS, help="number of requests [low, high]")
    rate: tuple = range_field((1.0, 1.0), integer=False, low=0.0, low_exclusive=True, high=1e6,
                              help="mean arrival rate, requests per second [low, high]")
    cv: tuple = range_field((1.0, 1.0), integer=False, low=0.0, high=MAX_CV,
                            help="coefficient of variation of the gaps [low, high] (0 even, 1 Poisson, > 1 bursts)")
    prompt: tuple | None = range_field(None, integer=True, low=1, high=MAX_TOKENS, help="prompt tokens [low, high]")
    output: tuple | None = range_field(None, integer=True, low=1, high=MAX_TOKENS, help="output tokens [low, high]")
    classes: dict = table_field(attrs.Factory(dict), help="class name -> {prompt, output, priority, client}")
    prefix: dict | None = table_field(None, help="{groups = N, tokens = [low, high], share = [low, high]}")


@attrs.frozen
class RequestClass:
    name: str
    prompt: tuple
    output: tuple
    priority: int
    client: str


@attrs.frozen
class Candidate:
    """A decoded point: the requests (rows as a request file has them) and the settings."""

    rows: tuple[dict, ...]
    settings: dict[str, Any]


def _log_quantile(u: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo))) if hi > lo else np.full(np.shape(u), float(lo))


def _int_log_quantile(u: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Whole numbers in [lo, hi], log-uniform (each whole number gets the mass of [k - 0.5, k + 0.5])."""
    if hi <= lo:
        return np.full(np.shape(u), lo, dtype=np.int64)
    values = np.round(_log_quantile(u, lo - 0.5 if lo > 1 else 0.5, hi + 0.5))
    return np.clip(values, lo, hi).astype(np.int64)


def _int_uniform(u: float, lo: int, hi: int) -> int:
    return int(min(hi, lo + math.floor(u * (hi - lo + 1))))


def gamma_gaps_s(u: np.ndarray, rate: float, cv: float) -> np.ndarray:
    """Gaps (s) at the quantiles ``u`` of gamma gaps with mean ``1 / rate`` and coefficient of
    variation ``cv`` (the ``gamma`` arrival process of the workloads; cv 0: every gap equal)."""
    if cv < 1e-6:  # closer to even than float64 can tell a gamma from a constant (and cv**2 underflows)
        return np.full(np.shape(u), 1.0 / rate)
    from scipy.stats import gamma

    shape = 1.0 / (cv * cv)
    return gamma.ppf(np.clip(u, 1e-9, 1 - 1e-9), shape, scale=1.0 / (shape * rate))


class Space:
    """The coordinates of a hunt (see the module docstring) and how they become a candidate."""

    def __init__(self, workload: WorkloadSpace, settings: dict[str, tuple], where: str):
        self.workload = workload
        self.settings = settings
        self.classes = self._classes(workload, where)
        self.prefix = (from_table(PrefixSpace, workload.prefix, where=f"{where} [hunt.workload.prefix]")
                       if workload.prefix is not None else None)
        self.max_requests = workload.requests[1]
        self.per_request = 3 + (len(self.classes) > 1) + (self.prefix is not None)
        self.globals = 3 + (self.prefix.groups + 1 if self.prefix is not None else 0) + len(settings)
        self.dimension = self.globals + self.per_request * self.max_requests
        self._quantiles: tuple[float, float] | None = None

    @staticmethod
    def _classes(workload: WorkloadSpace, where: str) -> list[RequestClass]:
        tables = workload.classes or {"default": {}}
        out = []
        for name in sorted(tables):
            table = tables[name]
            if not isinstance(table, dict):
                raise ConfigError(f"{where} [hunt.workload.classes.{name}]: must be a table, got {table!r}")
            cls = from_table(ClassSpace, table, where=f"{where} [hunt.workload.classes.{name}]")
            prompt, output = cls.prompt or workload.prompt, cls.output or workload.output
            for key, value in (("prompt", prompt), ("output", output)):
                if value is None:
                    raise ConfigError(f"{where} [hunt.workload]: {key}: give a range [low, high] here or in every "
                                      f"class ([hunt.workload.classes.{name}] has none)")
            client = cls.client or (name if workload.classes else "default")
            out.append(RequestClass(name, tuple(int(v) for v in prompt), tuple(int(v) for v in output),
                                    cls.priority, client))
        return out

    def decode(self, x) -> Candidate:
        """The candidate at ``x`` (a point of the unit cube; values outside are clipped)."""
        x = np.clip(np.asarray(x, dtype=float), 0.0, 1.0)
        w = self.workload
        n = _int_uniform(x[0], *w.requests)
        rate = float(_log_quantile(x[1], *w.rate))
        cv = float(w.cv[0] + x[2] * (w.cv[1] - w.cv[0]))
        at = 3
        share, group_tokens = 0.0, []
        if self.prefix is not None:
            share = self.prefix.share[0] + x[at] * (self.prefix.share[1] - self.prefix.share[0])
            group_tokens = _int_log_quantile(x[at + 1: at + 1 + self.prefix.groups], *self.prefix.tokens).tolist()
            at += 1 + self.prefix.groups
        settings = {}
        for key, (lo, hi) in self.settings.items():
            settings[key] = _int_uniform(x[at], lo, hi) if isinstance(lo, int) else float(lo + x[at] * (hi - lo))
            at += 1
        genes = x[self.globals:].reshape(self.max_requests, self.per_request)[:n]
        gaps = gamma_gaps_s(genes[1:, 0], rate, cv) * 1000.0
        arrivals = np.concatenate(([0.0], np.cumsum(gaps))) if n > 1 else np.zeros(1)
        classes = (np.minimum((genes[:, 3] * len(self.classes)).astype(int), len(self.classes) - 1)
                   if len(self.classes) > 1 else np.zeros(n, dtype=int))
        rows = []
        for i in range(n):
            klass = self.classes[classes[i]]
            row = {"arrival_ms": float(arrivals[i]),
                   "prompt_tokens": int(_int_log_quantile(genes[i, 1], *klass.prompt)),
                   "output_tokens": int(_int_log_quantile(genes[i, 2], *klass.output))}
            self._label(row, klass)
            if self.prefix is not None:
                u = genes[i, -1]
                if share > 0 and (u < share or share >= 1.0):  # (share 1: every request, u = 1 too)
                    group = min(int(u / share * self.prefix.groups), self.prefix.groups - 1)
                    row["prefix_group"] = group
                    row["prefix_tokens"] = int(group_tokens[group])
                    row["prompt_tokens"] += int(group_tokens[group])
                else:
                    row["prefix_group"], row["prefix_tokens"] = None, 0
            rows.append(row)
        return Candidate(tuple(rows), settings)

    def _label(self, row: dict, klass: RequestClass) -> None:
        if self.workload.classes:
            row["request_class"] = klass.name
            row["client"] = klass.client
        if any(c.priority for c in self.classes):
            row["priority"] = klass.priority

    def class_of(self, row: dict) -> RequestClass:
        name = row.get("request_class", "default")
        return next(c for c in self.classes if c.name == name)

    def contains(self, candidate: Candidate) -> bool:
        """Whether :meth:`decode` could have made ``candidate`` (see :meth:`outside`)."""
        return self.outside(candidate) is None

    def outside(self, candidate: Candidate) -> str | None:
        """Why no point of the cube decodes to ``candidate``, or None when one does (gaps between
        arrivals to within :data:`ARRIVAL_SLACK_MS`). The shrinker keeps to the space with it:

        * requests: how many, each one's class, its lengths within the class's ranges (the
          prompt counted after its shared prefix), its client and priority the class's;
        * prefixes: a group of the space, its tokens within ``tokens`` and the same for every
          request of the group; ``share`` is the chance that a request uses one, so any number of
          requests may -- except all of them when its low end is 1, and none when its high end is 0;
        * arrivals: some rate and cv of the ranges could have drawn the gaps -- every gap between
          the gamma quantiles (at :func:`gamma_gaps_s`'s clipped ends) of one rate, so with ``cv =
          [0, 0]`` the arrivals stay evenly spaced at a rate of ``rate``; gaps of any length when
          the cv may reach 1 or more (then only the longest gap bounds the rate);
        * settings: each within its range.
        """
        rows = candidate.rows
        w = self.workload
        if not w.requests[0] <= len(rows) <= w.requests[1]:
            return f"{len(rows)} requests, not within [{w.requests[0]}, {w.requests[1]}]"
        for key, value in candidate.settings.items():
            bounds = self.settings.get(key)
            if bounds is None or not bounds[0] <= value <= bounds[1]:
                return f"setting {key} = {value!r} outside {bounds}"
        names = {c.name: c for c in self.classes}
        groups: dict[int, int] = {}
        for i, row in enumerate(rows):
            klass = names.get(row.get("request_class", "default"))
            if klass is None:
                return f"request {i}: no class {row.get('request_class')!r}"
            labelled = dict(row)
            self._label(labelled, klass)
            if labelled != row:
                return f"request {i}: client or priority not its class's"
            group, extra = row.get("prefix_group"), row.get("prefix_tokens", 0)
            if group is not None:
                if self.prefix is None or not 0 <= group < self.prefix.groups:
                    return f"request {i}: no prefix group {group!r}"
                if not self.prefix.tokens[0] <= extra <= self.prefix.tokens[1] or groups.get(group, extra) != extra:
                    return f"request {i}: prefix group {group} of {extra} tokens"
                groups[group] = extra
            elif extra:
                return f"request {i}: {extra} prefix tokens without a prefix group"
            if not klass.prompt[0] <= row["prompt_tokens"] - extra <= klass.prompt[1]:
                return f"request {i}: prompt of {row['prompt_tokens'] - extra} tokens outside {klass.prompt}"
            if not klass.output[0] <= row["output_tokens"] <= klass.output[1]:
                return f"request {i}: output of {row['output_tokens']} tokens outside {klass.output}"
        if self.prefix is not None:
            shared = sum(r.get("prefix_group") is not None for r in rows)
            if self.prefix.share[0] >= 1.0 and shared < len(rows):
                return f"{len(rows) - shared} requests without a shared prefix (share = 1)"
            if self.prefix.share[1] <= 0.0 and shared:
                return f"{shared} requests with a shared prefix (share = 0)"
        return self._arrivals_outside([r["arrival_ms"] for r in rows])

    def _arrivals_outside(self, arrivals) -> str | None:
        arrivals = np.sort(np.asarray(arrivals, dtype=float))
        if not np.all(np.isfinite(arrivals)) or (arrivals.size and arrivals[0] < 0):
            return "an arrival time that is negative or not a number"
        if arrivals.size < 2:
            return None
        gaps = np.diff(arrivals)
        shortest, longest = float(gaps.min()), float(gaps.max())
        low, high = self._gap_quantiles_ms  # at rate 1, the cv range's widest
        slack = ARRIVAL_SLACK_MS
        fastest = low / (shortest + slack)                       # the least rate that gives the shortest gap
        slowest = high / (longest - slack) if longest > slack else math.inf  # the most that gives the longest
        rate = self.workload.rate
        if max(fastest, rate[0]) <= min(slowest, rate[1]) * (1 + 1e-9):
            return None
        return (f"gaps of {shortest:.6g} to {longest:.6g} ms: no rate in [{rate[0]:g}, {rate[1]:g}] per second "
                f"with cv in [{self.workload.cv[0]:g}, {self.workload.cv[1]:g}] draws both")

    @property
    def _gap_quantiles_ms(self) -> tuple[float, float]:
        """The shortest and longest gap (ms) decoding draws at rate 1, over the cv range: the
        gamma quantiles at the ends of the cube, widest at the largest cv."""
        if self._quantiles is None:
            low, high = gamma_gaps_s(np.array([0.0, 1.0]), 1.0, self.workload.cv[1]) * 1000.0
            self._quantiles = (float(low), float(high))
        return self._quantiles


def workload_stats(rows) -> dict[str, float]:
    """``workload.*`` statistics of a candidate's requests (see :mod:`.expression`)."""
    n = len(rows)
    arrivals = np.array([r["arrival_ms"] for r in rows], dtype=float)
    prompt = np.array([r["prompt_tokens"] for r in rows], dtype=float)
    output = np.array([r["output_tokens"] for r in rows], dtype=float)
    duration = float(arrivals.max() - arrivals.min()) / 1e3 if n else 0.0
    gaps = np.diff(np.sort(arrivals)) / 1e3
    tokens = float(prompt.sum() + output.sum())
    return {
        "requests": float(n),
        "duration_s": duration,
        "rate_rps": (n - 1) / duration if duration > 0 else (math.inf if n > 1 else 0.0),
        "max_gap_s": float(gaps.max()) if gaps.size else 0.0,
        "prompt_tokens.mean": float(prompt.mean()), "prompt_tokens.max": float(prompt.max()),
        "prompt_tokens.total": float(prompt.sum()),
        "output_tokens.mean": float(output.mean()), "output_tokens.max": float(output.max()),
        "output_tokens.total": float(output.sum()),
        "tokens_per_s": tokens / duration if duration > 0 else math.inf,
    }


def make_space(table: dict, settings: dict, where: str) -> Space:
    """The space of ``[hunt.workload]`` and ``[hunt.settings]``, checked, errors naming ``where``."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} [hunt.workload]: must be a table")
    workload = from_table(WorkloadSpace, table, where=f"{where} [hunt.workload]")
    ranges = {}
    for key, value in settings.items():
        try:
            whole = all(isinstance(v, int) for v in (value if isinstance(value, list) else [value]))
            ranges[key] = number_range(value, key, integer=whole, low=-MAX_INT)
        except FieldError as exc:
            raise ConfigError(f"{where} [hunt.settings]: {exc.name}: {exc.message}") from None
    return Space(workload, ranges, where)
