"""Arrival processes for generated workloads, and the seeded random streams they use.

Common random numbers: arrival times are drawn for a rate of 1 request/s and then divided by
the rate, so one seed gives the same draws at every rate (``times(rate=r) == times(rate=1) / r``
exactly). Comparing rates 5, 10, 20, 40 then compares load, not luck. The draws come from
``numpy.random.default_rng(seed)`` itself; lengths and other choices use separate streams
(:func:`stream_rng`), so changing the arrival process never changes the lengths, and the other
way round.

The first request arrives at t = 0 and each later one one gap after the previous one, the
gaps drawn independently (so a Poisson or gamma stream's span wanders from seed to seed).
This is schedlab's own stream, not ``vllm bench serve``'s: its ``get_request`` delays the
first request by a gap too (the benchmark's duration starts before it) and rescales the
summed delays so that the last of n requests goes exactly ``n / rate`` after the start; a
``vllm_bench`` replay redraws its arrivals that way (``measured.redraw_arrivals_ms``).
``constant`` spaces them evenly, one every ``1 / rate`` seconds (the spacing of ``vllm bench
serve --burstiness inf``, guidellm's constant rate).
"""

from __future__ import annotations

import numpy as np

from schedlab.configs import FieldError, float_field, str_field

#: Largest ``cv`` of gamma gaps: beyond it almost every gap is 0 and a rare one is enormous
#: (the burstiest public trace, Azure 2023 code, has cv 14.6).
MAX_CV = 100.0

ARRIVAL_KINDS = ("poisson", "all-at-once", "gamma", "constant")
RATED_KINDS = ("poisson", "gamma", "constant")  # the kinds that need a rate

# Stream numbers for stream_rng (fixed forever: changing one changes every seeded result).
PROMPT_STREAM = 1
OUTPUT_STREAM = 2
SHARING_STREAM = 3
GROUP_STREAM = 4
JITTER_STREAM = 5
STAGE_STREAM = 6


def stream_rng(seed: int, stream: int) -> np.random.Generator:
    """An independent generator for one purpose (``stream``) of a seeded run."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


def unit_rate_arrivals_ms(kind: str, n: int, seed: int, *, cv: float = 1.0) -> np.ndarray:
    """Arrival times in ms for a rate of 1 request/s (``all-at-once``: all zeros).

    ``poisson``: exponential gaps; ``gamma``: gamma gaps with mean 1 s and coefficient of
    variation ``cv`` (cv > 1 is burstier than Poisson, cv = 1 is Poisson-like, cv = 0 is a
    constant gap); ``constant``: gaps of exactly 1 s.
    """
    if n <= 0:
        return np.zeros(0)
    if kind == "all-at-once":
        return np.zeros(n)
    return _cumulative(unit_gaps(kind, n - 1, np.random.default_rng(seed), cv))


def _cumulative(gaps: np.ndarray) -> np.ndarray:
    times = np.empty(gaps.size + 1)
    times[0] = 0.0
    np.cumsum(gaps, out=times[1:])
    return times * 1000.0


def unit_gaps(kind: str, n: int, rng: np.random.Generator, cv: float = 1.0) -> np.ndarray:
    """``n`` gaps in seconds between arrivals at 1 request/s, drawn from ``rng``."""
    if kind == "constant":
        return np.ones(n)
    if kind == "all-at-once":
        return np.zeros(n)
    if kind == "poisson":
        gaps = rng.standard_exponential(n)
    elif kind == "gamma":
        if cv == 0:
            gaps = np.ones(n)
        else:
            shape = 1.0 / (cv * cv)
            gaps = rng.gamma(shape, 1.0 / shape, n)
    else:
        raise ValueError(f"unknown arrival process {kind!r}")
    return gaps


def arrivals_ms(kind: str, n: int, seed: int, *, rate: float | None = None, cv: float = 1.0) -> np.ndarray:
    """``n`` arrival times in ms, non-decreasing, the first at 0 (see the module docstring)."""
    unit = unit_rate_arrivals_ms(kind, n, seed, cv=cv)
    if kind == "all-at-once":
        return unit
    if rate is None or not rate > 0:
        raise ValueError(f"arrival {kind!r} needs a rate > 0, got {rate!r}")
    with np.errstate(over="ignore"):  # a rate of 1e-320: inf, refused as past the clock's end (iter_requests)
        return unit / rate


# --- config fields shared by the generated workloads --------------------------------------


def arrival_field(default: str = "poisson"):
    return str_field(default, choices=ARRIVAL_KINDS,
                     help="arrival process: 'poisson' (needs rate), 'gamma' (bursty; needs rate and cv), "
                          "'constant' (evenly spaced; needs rate) or 'all-at-once' (every request at t=0)")


def rate_field():
    return float_field(None, min=0, min_exclusive=True, optional=True,
                       help="mean arrival rate in requests per second (for arrival = 'poisson', 'gamma' and "
                            "'constant', which need it; refused with any other arrival)")


def cv_field():
    return float_field(None, min=0, max=MAX_CV, optional=True,
                       help="coefficient of variation of the gaps, for arrival = 'gamma' only (default 1: as "
                            "variable as Poisson; > 1 bursty, 0 = evenly spaced)")


def gap_cv(cv: float | None) -> float:
    """The gamma gaps' coefficient of variation of a ``cv`` setting: 1 when not set."""
    return 1.0 if cv is None else cv


def check_arrival_settings(arrival: str, rate: float | None, cv: float | None = None) -> None:
    """Raise FieldError when the arrival process needs a rate and none is set, or when ``rate``
    or ``cv`` is set where it cannot take effect (a rate with ``all-at-once`` or the file's own
    arrivals, a cv with anything but ``gamma``): a sweep over it would give identical runs."""
    if arrival in RATED_KINDS and rate is None:
        raise FieldError("rate", f"required when arrival = {arrival!r}")
    if rate is not None and arrival not in RATED_KINDS:
        why = ("the requests arrive at the file's arrival_ms (all at t = 0 without them)" if arrival == "file"
               else "every request arrives at t = 0")
        raise FieldError("rate", f"does not apply with arrival = {arrival!r}: {why}; set arrival = 'poisson', "
                                 "'gamma' or 'constant' to send the requests at this rate")
    check_cv(arrival, cv)


def check_cv(arrival: str, cv: float | None) -> None:
    """Raise FieldError when ``cv`` is set for an arrival process other than ``gamma``."""
    if cv is not None and arrival != "gamma":
        raise FieldError("cv", f"only applies with arrival = 'gamma' (the variation of its gaps), not {arrival!r}")
