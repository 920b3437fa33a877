"""Generated workloads: ``synthetic`` (lengths from distributions) and ``shared_prefix``
(requests that share system prompts).

::

    [workload]
    kind = "synthetic"
    num_requests = 1000
    prompt = {dist = "lognormal", median = 600, sigma = 0.8, high = 4096}
    output = {dist = "uniform", low = 50, high = 400}
    arrival = "poisson"
    rate = 10

Everything is drawn with numpy from the run's seed, on separate streams for arrivals, prompt
and output lengths (see :mod:`.arrivals`): the same seed at a different rate gives the same
lengths and the same arrival pattern, scaled. Instead of ``num_requests`` and ``rate``, both
take ``stages`` of a rate and a duration, back to back or each after the previous drains
(:mod:`.stages`), and ``max_concurrency`` caps the requests in flight as a load generator's
client does (:mod:`.capped`).
"""

from __future__ import annotations

import math
from typing import Callable

import attrs
import numpy as np

from schedlab.configs import MAX_REQUESTS, MAX_TOKENS, FieldError, float_field, int_field, str_field, table_field

from .arrivals import (
    GROUP_STREAM,
    OUTPUT_STREAM,
    PROMPT_STREAM,
    SHARING_STREAM,
    arrival_field,
    arrivals_ms,
    check_arrival_settings,
    check_cv,
    cv_field,
    gap_cv,
    rate_field,
    stream_rng,
)
from .capped import CappedWorkload
from .columns import OpenLoopWorkload, RequestColumns
from .distributions import parse_distribution, scale_lengths
from .stages import (
    DrainedStages, back_to_back_ms, check_stage_settings, stage_columns, stage_gap_field, stage_gap_s,
    stage_offsets_ms, stage_start_field, stages_field,
)


def num_requests_field():
    return int_field(None, min=1, max=MAX_REQUESTS, optional=True, help="how many requests to generate (or stages)")


def distribution_field(what: str):
    return table_field(help=f"{what} length distribution: {{dist = \"fixed\", value = N}}, "
                            "{dist = \"uniform\", low = , high = }, "
                            "{dist = \"lognormal\", median = , sigma = , low = , high = } or "
                            "{dist = \"empirical\", path = , column = } (a file's column, drawn independently of "
                            "the other length: kind = \"file\" keeps a file's prompt-output pairs)")


def output_scale_field():
    # at most MAX_TOKENS: beyond, every output (>= 1 token) would be longer than a request may be,
    # and lengths x 1e300 would overflow the int64 columns
    return float_field(1.0, min=0, max=MAX_TOKENS, min_exclusive=True,
                       help="multiply every output length by this (rounded, at least 1); max_tokens is not scaled")


def max_concurrency_field():
    return int_field(None, min=1, max=MAX_REQUESTS, optional=True,
                     help="at most N requests in flight: each is sent when it is due and a slot is free, first due "
                          "first served (vllm bench serve --max-concurrency; inference-perf's num_workers x "
                          "worker_max_concurrency)")


def max_tokens_field():
    return int_field(None, min=1, max=MAX_TOKENS, optional=True, help="max_tokens (the client's length limit) for every request")


def request_class_field():
    return str_field("default", help="request_class of every request (per-class metrics)")


def client_field():
    return str_field("default", help="client of every request")


def priority_field():
    return int_field(0, help="priority of every request (lower = more important)")


def _shared_fields(config) -> dict:
    fields = {"priority": config.priority, "client": config.client, "request_class": config.request_class}
    if config.max_tokens is not None:
        fields["max_tokens"] = config.max_tokens
    return fields


# --- synthetic -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SyntheticConfig:
    num_requests: int | None = num_requests_field()
    prompt: dict = distribution_field("prompt")
    output: dict = distribution_field("output")
    output_scale: float = output_scale_field()
    arrival: str = arrival_field()
    rate: float | None = rate_field()
    cv: float | None = cv_field()
    max_tokens: int | None = max_tokens_field()
    request_class: str = request_class_field()
    client: str = client_field()
    priority: int = priority_field()
    stages: tuple | None = stages_field()
    stage_start: str | None = stage_start_field()
    stage_gap_s: float | None = stage_gap_field()
    max_concurrency: int | None = max_concurrency_field()

    def __attrs_post_init__(self) -> None:
        parse_distribution(self.prompt, field="prompt")
        parse_distribution(self.output, field="output")
        if check_stage_settings(self) is None:
            check_arrival_settings(self.arrival, self.rate, self.cv)
        else:
            check_cv(self.arrival, self.cv)


def staged(config, name: str, columns_of: Callable[[int, int], RequestColumns]):
    """The workload of a generated config: ``num_requests`` at ``rate``, or its ``stages``
    (:mod:`.stages`), under its ``max_concurrency`` cap if any (:mod:`.capped`).
    ``columns_of(seed, n)`` draws every request but the arrival times."""
    workload = _uncapped(config, name, columns_of)
    return workload if config.max_concurrency is None else CappedWorkload(workload, config.max_concurrency)


def _uncapped(config, name: str, columns_of: Callable[[int, int], RequestColumns]):
    stages = check_stage_settings(config)
    if stages is None:
        n = config.num_requests

        def build(seed: int):
            return arrivals_ms(config.arrival, n, seed, rate=config.rate, cv=gap_cv(config.cv)), columns_of(seed, n)

        return OpenLoopWorkload(build, name=name, num_requests=n)
    n = sum(stage.count for stage in stages)

    def parts(seed: int):
        # each stage from its own stream (stage_seed): no stage's draws depend on another's settings
        offsets = stage_offsets_ms(config.arrival, stages, seed, gap_cv(config.cv))
        return offsets, stage_columns(columns_of, stages, seed)

    if config.stage_start == "after_drain":
        return DrainedStages(parts, gap_s=stage_gap_s(config), name=name, num_requests=n)

    def build_back_to_back(seed: int):
        offsets, columns = parts(seed)
        return back_to_back_ms(offsets, stages, stage_gap_s(config)), columns

    return OpenLoopWorkload(build_back_to_back, name=name, num_requests=n)


def make_synthetic_workload(config: SyntheticConfig):
    prompt = parse_distribution(config.prompt, field="prompt").sampler()
    output = parse_distribution(config.output, field="output").sampler()
    constant = _shared_fields(config)

    def columns_of(seed: int, n: int) -> RequestColumns:
        return RequestColumns(*draw_lengths(prompt, output, config.output_scale, seed, n), {}, constant)

    return staged(config, "synthetic", columns_of)


def draw_lengths(prompt, output, output_scale: float, seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of ``n`` requests, each from its own stream of ``seed``."""
    prompts = prompt.sample(stream_rng(seed, PROMPT_STREAM), n)
    return prompts, scale_lengths(output.sample(stream_rng(seed, OUTPUT_STREAM), n), output_scale)


# --- shared_prefix -------------------------------------------------------------------------

POPULARITY = ("uniform", "zipf")


@attrs.frozen(kw_only=True)
class SharedPrefixConfig:
    """Requests with system prompts: ``round(shared_fraction * num_requests)`` of them (chosen
    at random) use the prefix of one of ``num_groups`` groups; the rest declare no sharing.
    With ``stages``, each stage is drawn on its own (:mod:`.stages`): ``round(shared_fraction *
    its count)`` of its requests share, each picking among the same groups.
    Every request's prompt is ``prefix_tokens + suffix``, so the sharing is the only difference
    between a shared and an unshared request."""

    num_requests: int | None = num_requests_field()
    num_groups: int = int_field(min=1, max=MAX_REQUESTS, help="how many different shared prefixes (system prompts) there are")
    prefix_tokens: int = int_field(min=1, max=MAX_TOKENS, help="length of each shared prefix in tokens")
    suffix: dict = distribution_field("unique suffix (the prompt after the prefix)")
    output: dict = distribution_field("output")
    shared_fraction: float = float_field(1.0, min=0, max=1,
                                         help="share of requests that use a group's prefix; the rest share nothing")
    popularity: str = str_field("uniform", choices=POPULARITY,
                                help="how shared requests pick their group: 'uniform' or 'zipf' (group g has "
                                     "weight 1 / (g + 1) ** zipf_s)")
    zipf_s: float | None = float_field(None, min=0, optional=True,
                                       help="Zipf exponent for popularity = 'zipf' only (default 1; 0 = uniform)")
    output_scale: float = output_scale_field()
    arrival: str = arrival_field()
    rate: float | None = rate_field()
    cv: float | None = cv_field()
    max_tokens: int | None = max_tokens_field()
    request_class: str = request_class_field()
    client: str = client_field()
    priority: int = priority_field()
    stages: tuple | None = stages_field()
    stage_start: str | None = stage_start_field()
    stage_gap_s: float | None = stage_gap_field()
    max_concurrency: int | None = max_concurrency_field()

    def __attrs_post_init__(self) -> None:
        parse_distribution(self.suffix, field="suffix")
        parse_distribution(self.output, field="output")
        if self.zipf_s is not None and self.popularity != "zipf":
            raise FieldError("zipf_s", f"only applies with popularity = 'zipf', not {self.popularity!r} (every group "
                                       "is equally likely): set popularity = 'zipf' to weigh group g by "
                                       "1 / (g + 1) ** zipf_s")
        if check_stage_settings(self) is None:
            check_arrival_settings(self.arrival, self.rate, self.cv)
        else:
            check_cv(self.arrival, self.cv)


def num_shared(num_requests: int, shared_fraction: float) -> int:
    """How many requests share a prefix: ``shared_fraction * num_requests`` rounded half up."""
    return min(num_requests, int(math.floor(shared_fraction * num_requests + 0.5)))


#: ``zipf_s`` when not set.
DEFAULT_ZIPF_S = 1.0


def group_weights(num_groups: int, popularity: str, zipf_s: float | None = None) -> np.ndarray:
    """Probability of each group (sums to 1); ``zipf_s`` None is :data:`DEFAULT_ZIPF_S`."""
    if zipf_s is None:
        zipf_s = DEFAULT_ZIPF_S
    if popularity == "uniform":
        weights = np.ones(num_groups)
    elif popularity == "zipf":
        with np.errstate(over="ignore"):  # a huge s: g ** s is inf, its weight 0, all on group 0 (the limit)
            weights = 1.0 / np.arange(1, num_groups + 1, dtype=np.float64) ** zipf_s
    else:
        raise FieldError("popularity", f"unknown popularity {popularity!r}")
    return weights / weights.sum()


def make_shared_prefix_workload(config: SharedPrefixConfig):
    suffix = parse_distribution(config.suffix, field="suffix").sampler()
    output = parse_distribution(config.output, field="output").sampler()
    cdf = np.cumsum(group_weights(config.num_groups, config.popularity, config.zipf_s))
    constant = _shared_fields(config)

    def columns_of(seed: int, n: int) -> RequestColumns:
        k = num_shared(n, config.shared_fraction)
        suffixes = suffix.sample(stream_rng(seed, PROMPT_STREAM), n)
        outputs = scale_lengths(output.sample(stream_rng(seed, OUTPUT_STREAM), n), config.output_scale)
        # A prefix of one permutation: raising shared_fraction only adds shared requests.
        shared = np.zeros(n, dtype=bool)
        shared[stream_rng(seed, SHARING_STREAM).permutation(n)[:k]] = True
        # One uniform draw per request, mapped through the popularity CDF (same draws for any s).
        groups = np.searchsorted(cdf, stream_rng(seed, GROUP_STREAM).random(n), side="right")
        groups = np.minimum(groups, config.num_groups - 1).tolist()
        flags = shared.tolist()
        per_row = {
            "prefix_group": [g if s else None for g, s in zip(groups, flags)],
            "prefix_tokens": [config.prefix_tokens if s else 0 for s in flags],
        }
        return RequestColumns(suffixes + config.prefix_tokens, outputs, per_row, constant)

    return staged(config, "shared_prefix", columns_of)
