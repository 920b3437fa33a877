"""Staged load, as load generators run it: a list of stages, each a rate held for a duration.

::

    [workload]
    kind = "synthetic"                 # or shared_prefix
    stages = [{rate = 5, duration_s = 60}, {rate = 10, duration_s = 60}]
    arrival = "constant"               # or poisson, gamma: within each stage
    stage_start = "after_drain"        # or "back_to_back"
    stage_gap_s = 0

Stage ``k`` sends ``floor(rate x duration_s)`` requests (inference-perf's count, at least one),
the first at the stage's start and the others one gap apart -- gaps of the arrival process at
the stage's rate, drawn from the run's seed in one stream across stages, so that changing one
stage's rate scales its gaps and leaves the others' draws alone (common random numbers).

* ``back_to_back``: stage ``k + 1`` starts ``duration_s + stage_gap_s`` after stage ``k``
  started, whatever is still running (``vllm bench serve``'s and guidellm's constant-rate
  benchmarks run one rate at a time this way). A random stage's last arrivals may fall past its
  window by chance; the next stage starts on time all the same.
* ``after_drain``: stage ``k + 1`` starts ``stage_gap_s`` after the last request of stage ``k``
  has finished for its client -- its last byte arrived, it was rejected, or its client gave up
  (inference-perf runs its stages so: it waits for the stage's requests, then sleeps
  ``interval``). The workload is then closed-loop: it hears of every finish.

Requests are numbered in arrival order across stages; lengths come from one draw for all of
them, so staging changes when requests come, not what they are.
"""

from __future__ import annotations

import difflib
import math
from typing import Callable, Iterator

import attrs
import numpy as np

from schedlab.configs import (
    MAX_REQUESTS, MAX_TIME_MS, FieldError, float_field, is_finite_number, str_field, table_field, value_text,
)
from schedlab.errors import WorkloadError

from .arrivals import unit_gaps
from .columns import RequestColumns, check_seed, iter_requests

STAGE_STARTS = ("back_to_back", "after_drain")


@attrs.frozen
class Stage:
    """One stage: ``rate`` requests per second for ``duration_s`` seconds."""

    rate: float
    duration_s: float

    @property
    def count(self) -> int:
        return int(math.floor(self.rate * self.duration_s + 1e-9))


def stages_field():
    return attrs.field(default=None, converter=lambda v: tuple(v) if isinstance(v, list) else v,
                       metadata={"help": "load stages, in order: [{rate = 5, duration_s = 60}, ...] (instead of "
                                         "num_requests and rate); each sends floor(rate x duration_s) requests"})


def stage_start_field():
    return str_field(None, choices=STAGE_STARTS, optional=True,
                     help="with stages only: 'back_to_back' (the default: each starts when the previous one's "
                          "duration is over) or 'after_drain' (each starts when the previous one's requests have "
                          "all finished)")


def stage_gap_field():
    return float_field(None, min=0.0, max=MAX_TIME_MS / 1e3, optional=True,  # (the clock's end: refused when read)
                       help="with stages only: seconds between one stage and the next (inference-perf's interval; "
                            "default 0)")


def stage_gap_s(config) -> float:
    """The config's ``stage_gap_s``: 0 when not set."""
    return 0.0 if config.stage_gap_s is None else config.stage_gap_s


def parse_stages(value, field: str = "stages") -> tuple[Stage, ...]:
    """The stages of a ``stages`` setting, checked (FieldError names the stage and key)."""
    if not isinstance(value, tuple) or not value:
        raise FieldError(field, f"must be a non-empty list of {{rate = ..., duration_s = ...}} tables, got {value!r}")
    stages = []
    for k, table in enumerate(value, 1):
        if not isinstance(table, dict):
            raise FieldError(field, f"stage {k} must be a table like {{rate = 5, duration_s = 60}}, got {table!r}")
        for key in table:
            if key not in ("rate", "duration_s"):
                close = difflib.get_close_matches(str(key), ["duration_s", "rate"], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise FieldError(field, f"stage {k}: unknown key {key!r}{hint}; valid keys: duration_s, rate")
        for key in ("rate", "duration_s"):
            number = table.get(key)
            if number is None:
                raise FieldError(field, f"stage {k}: missing {key!r}")
            if not is_finite_number(number) or not number > 0:
                raise FieldError(field, f"stage {k}: {key} must be a number > 0, got {value_text(number)}")
        stage = Stage(float(table["rate"]), float(table["duration_s"]))
        if stage.rate * stage.duration_s > MAX_REQUESTS:  # before count: 1e300 x 1e300 is inf, no whole number
            raise FieldError(field, f"stage {k}: rate x duration_s = {stage.rate * stage.duration_s:g} requests, "
                                    f"more than {MAX_REQUESTS}")
        if stage.count < 1:
            raise FieldError(field, f"stage {k}: rate x duration_s = {stage.rate * stage.duration_s:g} sends no "
                                    "request; give at least one")
        stages.append(stage)
    if sum(s.count for s in stages) > MAX_REQUESTS:
        raise FieldError(field, f"the stages send {sum(s.count for s in stages)} requests, more than {MAX_REQUESTS}")
    return tuple(stages)


def check_stage_settings(config) -> tuple[Stage, ...] | None:
    """The workload config's stages (None without), checked against its other settings."""
    if config.stages is None:
        if config.num_requests is None:
            raise FieldError("num_requests", "required (or give stages)")
        for key in ("stage_start", "stage_gap_s"):   # (silently ignored once: a sweep over them changed nothing)
            if getattr(config, key) is not None:
                raise FieldError(key, "only applies with stages (stages = [{rate = ..., duration_s = ...}, ...])")
        return None
    stages = parse_stages(config.stages)
    if config.num_requests is not None:
        raise FieldError("num_requests", "give either num_requests or stages (they count the requests themselves)")
    if config.rate is not None:
        raise FieldError("rate", "give either rate or stages (each stage has its own)")
    return stages


def stage_offsets_ms(kind: str, stages: tuple[Stage, ...], seed: int, cv: float = 1.0) -> list[np.ndarray]:
    """Per stage, its arrivals in ms after the stage's start: the first at 0, then gaps of the
    arrival process at the stage's rate (one random stream for all stages, see the module doc)."""
    rng = np.random.default_rng(seed)
    out = []
    for stage in stages:
        times = np.zeros(stage.count)
        np.cumsum(unit_gaps(kind, stage.count - 1, rng, cv), out=times[1:])
        with np.errstate(over="ignore"):  # inf beyond the float range: refused as past the clock's end
            out.append(times * 1000.0 / stage.rate)
    return out


def back_to_back_ms(offsets: list[np.ndarray], stages: tuple[Stage, ...], gap_s: float) -> np.ndarray:
    """Every arrival of stages run back to back (stage ``k`` starts when ``k - 1``'s window and gap are over)."""
    starts = np.concatenate(([0.0], np.cumsum([(s.duration_s + gap_s) * 1000.0 for s in stages])))[:-1]
    return np.concatenate([start + part for start, part in zip(starts, offsets)])


class DrainedStages:
    """Stages that each start when the previous one's requests have all finished (closed loop)."""

    closed_loop = True

    def __init__(self, build: Callable[[int], tuple[list[np.ndarray], RequestColumns]], *, gap_s: float, name: str,
                 num_requests: int):
        self._build = build
        self._gap_ms = gap_s * 1000.0
        self.name = name
        self.num_requests = num_requests
        self.info: dict = {}
        self._run = None

    def requests(self, seed: int) -> Iterator:
        offsets, columns = self._build(check_seed(seed))
        self._run = _DrainRun(offsets, columns)
        return self._run.stage(0, 0.0)

    def on_finish(self, request, now_ms: float) -> list:
        """The next stage's requests once this one's last request has finished, else []."""
        run = self._run
        if run is None:
            raise WorkloadError(f"{self.name}: on_finish called before requests(seed) started a run")
        return run.finished(request, now_ms, self._gap_ms)

    def __repr__(self) -> str:
        return f"<{self.name} workload: {self.num_requests} requests in stages, each after the previous drains>"


class _DrainRun:
    """One run: which stage is on and how many of its requests are unfinished."""

    def __init__(self, offsets: list[np.ndarray], columns: RequestColumns):
        self.offsets = offsets
        self.columns = columns
        self.firsts = np.concatenate(([0], np.cumsum([len(o) for o in offsets]))).tolist()
        self.current = 0
        self.left = 0

    def stage(self, k: int, start_ms: float) -> Iterator:
        first, end = self.firsts[k], self.firsts[k + 1]
        self.current, self.left = k, end - first
        rows = np.arange(first, end)
        return iter_requests(start_ms + self.offsets[k], self.columns.select(rows), first_id=first)

    def finished(self, request, now_ms: float, gap_ms: float) -> list:
        if not self.firsts[self.current] <= request.id < self.firsts[self.current + 1]:
            raise WorkloadError(f"request {request.id} is not a request of the stage in progress")
        self.left -= 1
        if self.left or self.current + 1 == len(self.offsets):
            return []
        return list(self.stage(self.current + 1, now_ms + gap_ms))
