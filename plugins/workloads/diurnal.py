"""The ``diurnal`` workload: a day of traffic whose rate follows the hour of the day.

::

    [workload]
    kind = "diurnal"
    hours = 24
    mean_rate = 40            # requests/s averaged over the day
    peak_hour = 14            # busiest hour (cosine shape), or give your own:
    # profile = [0.3, 0.25, ...]   # one weight per hour (scaled so their mean is mean_rate)
    prompt = {dist = "lognormal", median = 512, sigma = 1.0, high = 8192}
    output = {dist = "lognormal", median = 128, sigma = 1.0, high = 2048}

Arrivals are a non-homogeneous Poisson process: the rate is constant within each hour, at
``mean_rate x weight`` of that hour (the weights average 1 over a day, so a run of 2 hours from
midnight sees the night's rates, and one of 2 hours with ``peak_hour = 1`` the peak's), and arrivals are drawn by time-rescaling -- unit-rate Poisson
points mapped through the inverse of the cumulative rate, which is exact for a piecewise
constant rate. Without ``profile`` the weights are a cosine over the day taken at each hour's
start ``h``, ``1 + amplitude x cos(2 pi (h - peak_hour) / 24)``: hour ``peak_hour`` (a whole
one) is the single busiest, and with the default amplitude 0.6 the quietest hour, 12 hours
later, gets a quarter of its rate. That is a stand-in with the usual shape of user-facing
traffic (quiet at night, busiest in the afternoon), not a measured trace: put a real service's
hourly counts in ``profile`` to follow it. Lengths are drawn as in ``synthetic``.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from schedlab.configs import MAX_REQUESTS, FieldError, float_field, int_field, list_field, table_field

from .columns import OpenLoopWorkload, RequestColumns
from .distributions import parse_distribution
from .synthetic import (
    _shared_fields,
    client_field,
    draw_lengths,
    max_tokens_field,
    output_scale_field,
    priority_field,
    request_class_field,
)

HOUR_MS = 3.6e6


@attrs.frozen
class DiurnalConfig:
    mean_rate: float = float_field(min=0.0, min_exclusive=True,
                                   help="requests per second averaged over a whole day; a run of other than whole "
                                        "days has its hours' rates, from midnight")
    prompt: dict = table_field(help="prompt length distribution (as in synthetic)")
    output: dict = table_field(help="output length distribution (as in synthetic)")
    hours: int = int_field(24, min=1, max=24 * 366, help="how long the run's arrivals last, in hours")
    peak_hour: float = float_field(14.0, min=0.0, max=24.0, help="the busiest hour of the cosine day (0-23; "
                                                                            "24 is 0)")
    amplitude: float = float_field(0.6, min=0.0, max=1.0, help="the cosine's swing: quietest / busiest hour = "
                                                               "(1 - amplitude) / (1 + amplitude)")
    profile: tuple = list_field((), item=(int, float),
                                help="weights of the hours of a day, one per hour (24), instead of the cosine; "
                                     "scaled to a mean of 1")
    output_scale: float = output_scale_field()
    max_tokens: int | None = max_tokens_field()
    request_class: str = request_class_field()
    client: str = client_field()
    priority: int = priority_field()

    def __attrs_post_init__(self) -> None:
        parse_distribution(self.prompt, field="prompt")
        parse_distribution(self.output, field="output")
        if self.profile and (len(self.profile) != 24 or min(self.profile) < 0 or not sum(self.profile) > 0):
            raise FieldError("profile", f"give 24 weights >= 0, not all 0 (one per hour), got {len(self.profile)}")
        if self.profile:  # (the cosine's settings did nothing beside a profile: review s81 badinput, 7)
            for name in ("amplitude", "peak_hour"):
                if getattr(self, name) != getattr(attrs.fields(DiurnalConfig), name).default:
                    raise FieldError(name, "shapes the cosine day, which profile replaces: give one or the other")
        if self.mean_rate * self.hours * 3600 > MAX_REQUESTS:
            raise FieldError("mean_rate", f"{self.mean_rate} requests/s for {self.hours} hours is more than "
                                          f"{MAX_REQUESTS:,} requests")


def hourly_weights(config: DiurnalConfig) -> np.ndarray:
    """The rate of each hour of the run relative to ``mean_rate`` (mean 1 over a day)."""
    if config.profile:
        day = np.asarray(config.profile, dtype=np.float64)
    else:
        h = np.arange(24)   # each hour's start: hour peak_hour alone at the top (at h + 0.5, two hours tied)
        day = 1.0 + config.amplitude * np.cos(2.0 * math.pi * (h - config.peak_hour) / 24.0)
    day = day / day.mean()
    return np.resize(day, config.hours)


def diurnal_arrivals_ms(config: DiurnalConfig, seed: int) -> np.ndarray:
    """Arrival times (ms) of the non-homogeneous Poisson process, by time-rescaling."""
    rates = hourly_weights(config) * config.mean_rate / 1e3         # requests per ms, per hour
    grid = np.arange(config.hours + 1) * HOUR_MS
    cumulative = np.concatenate([[0.0], np.cumsum(rates * HOUR_MS)])  # expected arrivals by each hour's end
    total = cumulative[-1]
    rng = np.random.default_rng(seed)
    draw = int(total + 10.0 * math.sqrt(total) + 100)
    points = np.cumsum(rng.standard_exponential(draw))
    while points[-1] < total:  # (never in practice: ten standard deviations)
        points = np.concatenate([points, points[-1] + np.cumsum(rng.standard_exponential(draw))])
    points = points[points < total]
    return np.interp(points, cumulative, grid)


def make_diurnal_workload(config: DiurnalConfig) -> OpenLoopWorkload:
    prompt = parse_distribution(config.prompt, field="prompt").sampler()
    output = parse_distribution(config.output, field="output").sampler()
    constant = _shared_fields(config)

    def build(seed: int):
        arrival = diurnal_arrivals_ms(config, seed)
        return arrival, RequestColumns(*draw_lengths(prompt, output, config.output_scale, seed, arrival.size), {},
                                       constant)

    expected = float(hourly_weights(config).sum()) * config.mean_rate * 3600  # the run's hours, not whole days
    return OpenLoopWorkload(build, name="diurnal", num_requests=round(expected))
