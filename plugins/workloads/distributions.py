"""Token-length distributions for generated workloads, written as small TOML tables.

::

    prompt = {dist = "fixed", value = 512}
    prompt = {dist = "uniform", low = 100, high = 900}            # whole numbers, both ends included
    prompt = {dist = "lognormal", median = 600, sigma = 0.8, low = 1, high = 8192}   # clipped; low <= median <= high
    output = {dist = "empirical", path = "sharegpt_stats.csv", column = "num_decode_tokens"}

``empirical`` samples uniformly from the values of one column of a CSV, JSON or JSONL file,
such as the Vidur/etalon ``*_stats_*.csv`` files (columns ``num_prefill_tokens``,
``num_decode_tokens``). A relative ``path`` is taken from the experiment file's folder, as every
path of an experiment (``schedlab.configs.from_table`` resolves it).

Each distribution is drawn on its own stream (:mod:`.arrivals`): with ``prompt`` and ``output``
both ``empirical`` over one file, a request's prompt and its output come from *different* rows,
drawn independently. The file's pairing is lost -- in Vidur's arXiv summarization statistics
(``arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv``) a long prompt has a short
answer (correlation -0.46) and every row has prompt + output <= 4,096 (the files were filtered
to Llama-2's context), where 20,000 independent draws have correlation -0.01 and 5.7% of them
pass 4,096 (up to 7,873). To keep each row's pair, read the file as requests instead, rows in
file order at drawn arrival times::

    [workload]
    kind = "file"
    path = "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
    columns = {prompt_tokens = "num_prefill_tokens", output_tokens = "num_decode_tokens"}
    arrival = "poisson"
    rate = 10

:func:`parse_distribution` checks a table (a config calls it when it is built) and
:meth:`Distribution.sampler` prepares sampling (reading the file of an empirical one).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import attrs
import numpy as np

from schedlab.configs import MAX_TOKENS, FieldError, bound_text, is_finite_number, value_text
from schedlab.errors import WorkloadError

from .records import read_records

DIST_KINDS = ("fixed", "uniform", "lognormal", "empirical")
#: Largest lognormal ``sigma``: at 10 the p99 is 10**10 times the median already.
MAX_SIGMA = 10.0


class Sampler(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths (int64, each >= 1)."""
        ...


@attrs.frozen
class Fixed:
    """Every request has ``value`` tokens."""

    value: int

    def sampler(self) -> Sampler:
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


@attrs.frozen
class Uniform:
    """Whole numbers from ``low`` to ``high``, both included, equally likely."""

    low: int
    high: int

    def sampler(self) -> Sampler:
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)


@attrs.frozen
class LogNormal:
    """``median * exp(sigma * N(0, 1))``, rounded to whole numbers and clipped to [low, high]
    (``high`` defaults to :data:`~schedlab.configs.MAX_TOKENS`)."""

    median: float
    sigma: float
    low: int = 1
    high: int | None = None

    def sampler(self) -> Sampler:
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        with np.errstate(over="ignore"):  # a far tail overflows to inf, then is clipped
            values = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        high = MAX_TOKENS if self.high is None else self.high
        return np.clip(values, self.low, high).astype(np.int64)


@attrs.frozen
class Empirical:
    """Uniform draws from the values of ``column`` in the file at ``path``, independent of any
    other distribution's draws (even one over another column of the same file: see the module doc)."""

    path: str
    column: str

    def sampler(self) -> Sampler:
        records = read_records(self.path, {self.column: (self.column,)}, required=(self.column,))
        values = records.ints(self.column, min=1, max=MAX_TOKENS)
        if len(values) == 0:
            raise WorkloadError(f"{self.path}: no rows to sample {self.column!r} from")
        return _EmpiricalSampler(values)


@attrs.frozen(eq=False)
class _EmpiricalSampler:
    values: np.ndarray

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.values[rng.integers(0, len(self.values), size=n)]


Distribution = Fixed | Uniform | LogNormal | Empirical

# dist -> (required keys, optional keys)
_KEYS = {
    "fixed": (("value",), ()),
    "uniform": (("low", "high"), ()),
    "lognormal": (("median", "sigma"), ("low", "high")),
    "empirical": (("path", "column"), ()),
}


def parse_distribution(table: Any, *, field: str) -> Distribution:
    """The distribution a TOML table describes.

    :param field: the config key holding the table, for messages (``prompt``, ``output``, ...).
    :raises FieldError: naming ``field``: not a table, unknown ``dist``, unknown or missing key,
        a bad value.
    """
    if not isinstance(table, dict):
        raise FieldError(field, f"must be a table such as {{dist = \"fixed\", value = 128}}, got {table!r}")
    kind = table.get("dist")
    if kind is None:
        hint = (f" (the table has kind = {table['kind']!r}: the key is dist)" if "kind" in table
                else "")
        raise FieldError(field, f"missing key 'dist'{hint}; dist must be one of "
                                f"{', '.join(map(repr, DIST_KINDS))}, e.g. {{dist = \"fixed\", value = 128}}")
    if kind not in DIST_KINDS:
        raise FieldError(field, f"dist must be one of {', '.join(map(repr, DIST_KINDS))}; got {kind!r}")
    needed, optional = _KEYS[kind]
    for key in table:
        if key != "dist" and key not in needed + optional:
            valid = ", ".join(("dist",) + needed + optional)
            raise FieldError(field, f"unknown key {key!r} for dist = {kind!r}; valid keys: {valid}")
    for key in needed:
        if key not in table:
            raise FieldError(field, f"dist = {kind!r} needs {key!r}")

    def whole(key: str, minimum: int = 1) -> int:
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_TOKENS:
            raise FieldError(field, f"{key} must be a whole number >= {minimum} and <= {bound_text(MAX_TOKENS)}, got {value!r}")
        return value

    def real(key: str, minimum: float, exclusive: bool, maximum: float = math.inf) -> float:
        value = table[key]
        if not is_finite_number(value) or (value <= minimum if exclusive else value < minimum) or value > maximum:
            bound = f"> {minimum:g}" if exclusive else f">= {minimum:g}"
            if maximum < math.inf:
                bound += f" and <= {maximum:g}"
            raise FieldError(field, f"{key} must be a number {bound}, got {value_text(value)}")
        return float(value)

    def text(key: str) -> str:
        value = table[key]
        if not isinstance(value, str) or not value:
            raise FieldError(field, f"{key} must be non-empty text, got {value!r}")
        return value

    if kind == "fixed":
        return Fixed(whole("value"))
    if kind == "uniform":
        low, high = whole("low"), whole("high")
        if low > high:
            raise FieldError(field, f"low ({low}) must be <= high ({high})")
        return Uniform(low, high)
    if kind == "lognormal":
        low = whole("low") if "low" in table else 1
        high = whole("high") if "high" in table else None
        if high is not None and low > high:
            raise FieldError(field, f"low ({low}) must be <= high ({high})")
        median = real("median", 0.0, True, MAX_TOKENS)
        top = MAX_TOKENS if high is None else high
        if not low <= median <= top:   # (clipped, every draw past the median would be the bound: no longer it)
            ends = f"[low, high] = [{low}, {top}]" if high is not None else f"[low, ...] = [{low}, ...]"
            raise FieldError(field, f"median ({median:g}) must lie within {ends}: the lengths are clipped to that "
                                    f"range, so their median would be {low if median < low else top}, not {median:g}")
        return LogNormal(median, real("sigma", 0.0, False, MAX_SIGMA), low, high)
    return Empirical(text("path"), text("column"))


def scale_lengths(lengths: np.ndarray, scale: float) -> np.ndarray:
    """``lengths * scale`` rounded to whole numbers, at least 1 (``output_scale``)."""
    if scale == 1.0:
        return lengths
    return np.maximum(np.rint(lengths * scale), 1).astype(np.int64)
