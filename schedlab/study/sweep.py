"""Sweep grids: the ``[sweep]`` table turned into the list of points to run.

``[sweep]`` maps dotted keys to lists of values::

    [sweep]
    "workload.rate" = [5, 10, 20, 40]
    "scheduler.max_num_seqs" = [16, 32]

Several keys form a grid: every combination, in the order the keys are written, the last
key varying fastest (5/16, 5/32, 10/16, ...). Unquoted dotted keys (``workload.rate = [...]``)
are read as nested tables by TOML; they are accepted too and flattened back into dotted
keys, but TOML groups keys that share a first part, which can change the order.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

from ..errors import ConfigError
from .overrides import split_key

#: The most points an experiment file's ``[sweep]`` grid (and a ``[plan]``'s candidates: GPUs x
#: degrees x space points) may have. Each point is a whole simulation (each candidate a search of
#: several); the studies shipped have under a hundred, and a table of 10,000 rows is more than
#: anyone reads, so a list written too long (a 200 x 200 grid: 40,000 runs) is refused when the
#: file is read instead of started.
MAX_SWEEP_POINTS = 10_000


def grid_size(lengths: list[int], where: str, *, limit: int = MAX_SWEEP_POINTS, noun: str = "points",
              labels: list[str] | None = None, why: str = "each point is a whole simulation") -> int:
    """The product of ``lengths``, computed before anything is made.

    :param labels: a word after each factor in the message (``2 gpus x 3 tensor_parallel``).
    :raises ConfigError: the product is above ``limit``, e.g. ``lab.toml: [sweep]: 200 x 200 =
        40,000 points; at most 10,000 (each point is a whole simulation)``.
    """
    size = math.prod(lengths)
    if size > limit:
        labels = labels or [""] * len(lengths)
        factors = [f"{n:,} {label}".rstrip() for n, label in zip(lengths, labels)]
        shape = f"{' x '.join(factors)} = " if len(factors) > 1 else ""
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}{shape}{size:,} {noun}; at most {limit:,} ({why})")
    return size


def grid_axes(sweep_table: dict, where: str, *, numbers_by_value: bool = False) -> list[tuple[str, list]]:
    """The grid's ``(dotted key, values)`` axes in order, checked as :func:`expand_grid` says,
    without making a single point."""
    if not isinstance(sweep_table, dict):
        raise ConfigError(f"{where}: must be a table mapping dotted keys to lists, got {sweep_table!r}")
    axes: list[tuple[str, list]] = []
    _collect(sweep_table, (), where, axes)
    if numbers_by_value:
        for key, values in axes:
            _check_numbers(key, values, where)
    return axes


def _points(axes: list[tuple[str, list]]) -> list[dict[str, Any]]:
    keys = [key for key, _ in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(values for _, values in axes))]


def expand_sweep(sweep_table: dict, where: str) -> list[dict[str, Any]]:
    """An experiment file's ``[sweep]``: :func:`expand_grid` with numbers compared by value."""
    return expand_grid(sweep_table, where, numbers_by_value=True)


def expand_grid(sweep_table: dict, where: str, *, max_points: int = MAX_SWEEP_POINTS,
                numbers_by_value: bool = False) -> list[dict[str, Any]]:
    """Every point of the grid, each a ``{dotted key: value}`` dict, last key fastest.

    An empty table gives one empty point (a single run with nothing changed).

    :param where: how to name the table in messages, e.g. ``"lab.toml: [sweep]"``.
    :param max_points: refuse grids larger than this (each point is a whole simulation).
    :param numbers_by_value: compare numbers by value, so ``1`` and ``1.0`` are a value listed
        twice (a run's settings read both alike); else equal values of different types differ.
    :raises ConfigError: naming ``where`` and the key, for a key that is not text or not a
        valid dotted key, a value that is not a non-empty list, a value listed twice, a key
        given twice, or a grid with more than ``max_points`` points.
    """
    axes = grid_axes(sweep_table, where, numbers_by_value=numbers_by_value)
    grid_size([len(values) for _, values in axes], where, limit=max_points)  # before a point is made
    return _points(axes)


def _collect(table: dict, prefix: tuple[str, ...], where: str, axes: list[tuple[str, list]]) -> None:
    for name, values in table.items():
        if not isinstance(name, str):
            raise ConfigError(f"{where}: keys must be text, got {name!r}")
        key = ".".join((*prefix, name))
        split_key(key, where=where)
        if isinstance(values, dict):
            if not values:
                raise ConfigError(f"{where}: {key!r} must be a list of values, got an empty table")
            _collect(values, (*prefix, name), where, axes)
            continue
        if not isinstance(values, (list, tuple)) or not values:
            raise ConfigError(f"{where}: {key!r} must be a non-empty list of values, got {values!r}")
        for i, value in enumerate(values):
            if any(type(value) is type(seen) and value == seen for seen in values[:i]):
                raise ConfigError(f"{where}: {key!r} lists {value!r} twice")
        if any(key == seen for seen, _ in axes):
            raise ConfigError(f"{where}: {key!r} is given twice")
        axes.append((key, list(values)))


def _check_numbers(key: str, values: list, where: str) -> None:
    """Refuse two numbers of equal value (``1`` and ``1.0``): the same point would run twice."""
    seen: dict = {}
    for value in values:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value in seen:  # 1 and 1.0 are one dict key
                raise ConfigError(f"{where}: {key!r} lists {seen[value]!r} and {value!r}, the same number")
            seen[value] = value


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}={_format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def point_label(point: dict[str, Any]) -> str:
    """A short name for a point, e.g. ``rate=5,max_num_seqs=16``.

    Each key is shortened to its last dotted part unless another key of the point shares that
    last part; those keep their full dotted key. Text values appear unquoted, booleans as
    ``true``/``false``. An empty point gives ``""``.
    """
    last = {key: key.rsplit(".", 1)[-1] for key in point}
    counts = Counter(last.values())
    names = {key: last[key] if counts[last[key]] == 1 else key for key in point}
    return ",".join(f"{names[key]}={_format_value(value)}" for key, value in point.items())
