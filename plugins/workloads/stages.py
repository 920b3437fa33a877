"""Staged load, as load generators run it: a list of stages, each a rate held for a duration.

::

    [workload]
    kind = "synthetic"                 # or shared_prefix
    stages = [{rate = 5, duration_s = 60}, {rate = 10, duration_s = 60}]
    arrival = "constant"               # or poisson, gamma: within each stage (all-at-once is refused)
    stage_start = "after_drain"        # or "back_to_back"
    stage_gap_s = 0

Stage ``k`` sends ``int(rate x duration_s)`` requests, the float product cut as inference-perf
cuts it (``int(stage.rate * stage.duration)``: a rate of 0.29 for 100 s sends 28), at least one,
the first at the stage's start and the others one gap apart -- gaps of the arrival process at
the stage's rate. Each stage draws its gaps and its requests' lengths from its own random
stream of the run's seed (:func:`stage_seed`; the first stage uses the seed itself, so one stage
is the unstaged workload), so that changing one stage's rate or duration scales its own gaps
and leaves every other stage's arrival offsets and lengths unchanged (common random numbers).

* ``back_to_back``: stage ``k + 1`` starts ``duration_s + stage_gap_s`` after stage ``k``
  started, whatever is still running, so a stage's requests may overlap the next stage's. This
  is schedlab's own schedule, not how the load generators move from one rate to the next:
  ``vllm bench serve`` awaits every request of a run before it returns (``asyncio.gather``), so
  a sequence of its runs drains between rates -- ``after_drain`` with ``stage_gap_s = 0`` is the
  closer match; guidellm stops a benchmark at its ``max_duration`` and cancels the requests still
  in flight (reported ``incomplete``) instead of letting them run into the next rate. A random
  stage's last arrivals may fall past its window by chance; the next stage starts on time all
  the same.
* ``after_drain``: stage ``k + 1`` starts ``stage_gap_s`` after the last request of stage ``k``
  has finished for its client -- its last byte arrived, it was rejected, or its client gave up
  (inference-perf runs its stages so: it waits for the stage's requests, then sleeps
  ``interval``). The workload is then closed-loop: it hears of every finish.

``arrival = "constant"`` spaces a stage's requests evenly, ``1 / rate`` apart from the stage's
start (``vllm bench serve --burstiness inf``, guidellm's constant rate). inference-perf's
``constant`` load is not evenly spaced: its ``ConstantLoadTimer`` draws exponential gaps,
normalised so that they fill the stage's duration, and sends its first request one gap after
the start.

Requests are numbered in arrival order across stages. The same seed gives the same requests.
"""

from __future__ import annotations

import difflib
from typing import Callable, Iterator

import attrs
import numpy as np

from schedlab.configs import (
    MAX_REQUESTS, MAX_TIME_MS, FieldError, float_field, is_finite_number, str_field, value_text,
)
from schedlab.errors import WorkloadError

from .arrivals import RATED_KINDS, STAGE_STREAM, unit_gaps
from .columns import RequestColumns, check_seed, concat_columns, iter_requests

STAGE_STARTS = ("back_to_back", "after_drain")


@attrs.frozen
class Stage:
    """One stage: ``rate`` requests per second for ``duration_s`` seconds."""

    rate: float
    duration_s: float

    @property
    def count(self) -> int:
        return int(self.rate * self.duration_s)  # (inference-perf: int(stage.rate * stage.duration))


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
    if config.arrival not in RATED_KINDS:   # (each stage's rate would only count its requests, sent at once)
        raise FieldError("stages", f"do not apply with arrival = {config.arrival!r}: every request of a stage would "
                                   "arrive at the stage's start, its rate only setting how many; set arrival = "
                                   "'poisson', 'gamma' or 'constant' to send each stage at its rate")
    return stages


def stage_seed(seed: int, k: int) -> int:
    """The seed of stage ``k`` (counted from 0) of a run seeded ``seed``: ``seed`` itself for the
    first stage, else a number drawn from ``SeedSequence(seed, spawn_key=(STAGE_STREAM, k))``.
    A stage's gaps and lengths come from its own seed, so no other stage changes them."""
    if k == 0:
        return seed
    state = np.random.SeedSequence(seed, spawn_key=(STAGE_STREAM, k)).generate_state(2, np.uint32)
    return int(state[0]) << 32 | int(state[1])


def stage_offsets_ms(kind: str, stages: tuple[Stage, ...], seed: int, cv: float = 1.0) -> list[np.ndarray]:
    """Per stage, its arrivals in ms after the stage's start: the first at 0, then gaps of the
    arrival process at the stage's rate (each stage from its own stream, :func:`stage_seed`)."""
    out = []
    for k, stage in enumerate(stages):
        times = np.zeros(stage.count)
        np.cumsum(unit_gaps(kind, stage.count - 1, np.random.default_rng(stage_seed(seed, k)), cv), out=times[1:])
        with np.errstate(over="ignore"):  # inf beyond the float range: refused as past the clock's end
            out.append(times * 1000.0 / stage.rate)
    return out


def stage_columns(columns_of: Callable[[int, int], RequestColumns], stages: tuple[Stage, ...],
                  seed: int) -> RequestColumns:
    """Every stage's requests, stage after stage, each stage's drawn by ``columns_of(its seed,
    its count)`` (:func:`stage_seed`)."""
    return concat_columns([columns_of(stage_seed(seed, k), stage.count) for k, stage in enumerate(stages)])


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
