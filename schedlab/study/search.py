"""SLO-first search: the largest (or smallest) setting at which a constraint still holds.

A constraint such as ``ttft_ms.p99 <= 200`` is checked against a run's metrics. :func:`search`
then finds, for one numeric key (clients, request rate, ...), the boundary where the
constraint stops holding, with a number of runs logarithmic in the size of the range.
It assumes monotonicity: for ``maximize=True`` the constraint holds at small values and fails
from some boundary up (``maximize=False`` is the mirror image).

Algorithm (the same for both directions; "favourable end" is ``low`` when maximizing and
``high`` when minimizing, and offsets are measured from it towards the other end):

1. probe the favourable end; if the constraint fails there, it fails everywhere;
2. exponential bracketing: probe offsets of 1, 3, 7, 15, ... units (the step doubles each
   time; a unit is 1 for integer keys and ``tolerance`` for float keys), the last offset
   clipped to the far end; stop at the first failure. If even the far end passes, the range
   limited the search;
3. bisection between the last passing and the first failing value, until they are adjacent
   integers (integer keys) or at most ``tolerance`` apart (float keys).

For an integer range of ``N = high - low`` this takes at most ``max(1, 2 * ceil(log2(N + 1)))``
probes; :func:`max_search_probes` gives the exact worst case for any range.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any, Callable, Iterator, NamedTuple

import attrs

from ..errors import ConfigError
from ..results.metrics import metric_at

OPERATORS = ("<=", "<", ">=", ">")
#: the most probes a search may need (:func:`max_search_probes`); a ``[search]`` needing more is refused
MAX_PROBES = 64
_COMPARE = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
}
#: operator -> its comparison, for other parsers of conditions (``schedlab hunt``'s properties)
COMPARE = _COMPARE
_CONSTRAINT = re.compile(
    r"\s*(?P<metric>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*)\s*(?P<op><=|>=|<|>)\s*(?P<threshold>\S+)\s*"
)

#: what a metric lookup finds where no metric is (a metric may be None: an empty sample)
_ABSENT = object()


@attrs.frozen
class Constraint:
    """``metric op threshold``, where ``metric`` is a dotted path into a run's metrics dict.

    A metric that is NaN or None (e.g. no request finished) never satisfies a constraint.
    """

    metric: str
    op: str = attrs.field(validator=attrs.validators.in_(OPERATORS))
    threshold: float = attrs.field(converter=float)

    def __str__(self) -> str:
        t = self.threshold
        number = str(int(t)) if t.is_integer() and abs(t) < 1e15 else repr(t)
        return f"{self.metric} {self.op} {number}"

    def value(self, metrics: Mapping) -> float:
        """The metric's value in ``metrics`` as a float (NaN for a missing measurement, None).

        :raises ConfigError: the path does not exist (listing the top-level metric names and,
            if the path got part way, the names at the level where it stopped), or leads to
            something other than a number.
        """
        parts = self.metric.split(".")
        node: Any = metric_at(metrics, self.metric, _ABSENT) if isinstance(metrics, Mapping) else _ABSENT
        if node is _ABSENT:   # (the first way through, for the message)
            node = metrics
            for i, part in enumerate(parts):
                if not isinstance(node, Mapping) or part not in node:
                    raise ConfigError(self._missing(metrics, parts[:i], node))
                node = node[part]
        if node is None:
            return math.nan
        if isinstance(node, Mapping):
            inner = ", ".join(sorted(map(str, node)))
            raise ConfigError(f"constraint {str(self)!r}: {self.metric!r} is a group of metrics; "
                              f"name one of them: {inner}")
        if isinstance(node, bool) or not isinstance(node, numbers.Real):
            raise ConfigError(f"constraint {str(self)!r}: {self.metric!r} is {node!r}, not a number")
        return float(node)

    def holds(self, metrics: Mapping) -> bool:
        """True when the metric satisfies the constraint; NaN never does. A value within a relative
        1e-9 of the threshold is taken as equal to it (a p99 TTFT of 10.000000000000028 ms, the
        target by construction, meets ``<= 10``; not ``< 10``: review s81 fleet, finding 2)."""
        value = self.value(metrics)
        if math.isnan(value):
            return False
        if math.isclose(value, self.threshold, rel_tol=1e-9, abs_tol=1e-12):
            return self.op in ("<=", ">=")
        return _COMPARE[self.op](value, self.threshold)

    def _missing(self, metrics: Mapping, reached: list[str], node: Any) -> str:
        names = ", ".join(sorted(map(str, metrics))) if isinstance(metrics, Mapping) else "(none)"
        message = f"constraint {str(self)!r}: no metric {self.metric!r}; metrics: {names or '(none)'}"
        if reached:
            here = ".".join(reached)
            if isinstance(node, Mapping):
                message += f"; {here} has: {', '.join(sorted(map(str, node))) or '(nothing)'}"
            else:
                message += f"; {here} is a single value, not a group"
        return message


def parse_constraint(text: str) -> Constraint:
    """Parse ``"metric op number"``, e.g. ``"ttft_ms.p99 <= 200"`` (operators <=, <, >=, >).

    :raises ConfigError: the text is not of that form or the threshold is not a number.
    """
    match = _CONSTRAINT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(
            f"bad constraint {text!r}: expected METRIC OP NUMBER, e.g. 'ttft_ms.p99 <= 200' "
            f"(operators: {', '.join(OPERATORS)})"
        )
    raw = match["threshold"]
    try:
        threshold = float(raw)
    except ValueError:
        threshold = math.nan
    if math.isnan(threshold):
        raise ConfigError(f"bad constraint {text!r}: the threshold {raw!r} is not a number")
    metric, op = match["metric"], match["op"]
    if metric.rsplit(".", 1)[-1] in SHARES and (op in (">=", ">") and threshold > 1 or op in ("<=", "<") and
                                                threshold < 0):
        meant = f"; did you mean {threshold / 100:g}?" if 10 <= threshold <= 100 else ""
        raise ConfigError(f"bad constraint {text!r}: {metric} is a share from 0 to 1, so it never holds{meant}")
    return Constraint(metric, op, threshold)


#: Metrics that are shares from 0 to 1 (the last part of their names): a constraint past 1 never
#: holds (``slo.attainment >= 99`` was searched to its end, then "raise max_instances").
SHARES = frozenset({"attainment", "hit_rate", "gpu_hit_rate", "host_hit_rate"})


class Probe(NamedTuple):
    """One evaluated value: the value, whether the constraint held, and what evaluate returned."""

    value: int | float
    holds: bool
    payload: Any


@attrs.frozen
class SearchOutcome:
    """The result of :func:`search`.

    :ivar status: ``"found"``; ``"fails-everywhere"`` (fails even at the favourable end;
        ``value`` is None); or ``"holds-everywhere"`` (holds at the far end of the range,
        which is then ``value``: the range, not the constraint, limited the search).
    :ivar value: the best value at which the constraint holds, or None.
    :ivar payload: what ``evaluate`` returned with ``value`` (None when ``value`` is None).
    :ivar failing: the probed failing value closest to ``value`` (None if nothing failed).
    :ivar probes: every probe in the order made.
    :ivar message: one plain sentence for users.
    """

    status: str
    value: int | float | None
    payload: Any
    failing: int | float | None
    probes: tuple[Probe, ...] = attrs.field(converter=tuple)
    message: str


def _check_range(low, high, integer: bool, tolerance, max_probes) -> tuple[Any, Any, Any]:
    def is_number(x):
        return isinstance(x, numbers.Real) and not isinstance(x, bool)

    if integer:
        if not (isinstance(low, numbers.Integral) and isinstance(high, numbers.Integral)) or \
                isinstance(low, bool) or isinstance(high, bool):
            raise ConfigError(f"search: low and high must be whole numbers for an integer key, got {low!r}, {high!r}")
        if tolerance is not None:
            raise ConfigError("search: tolerance is only for float keys (integer searches find the exact boundary)")
        low, high, unit = int(low), int(high), 1
    else:
        if not (is_number(low) and is_number(high) and math.isfinite(low) and math.isfinite(high)):
            raise ConfigError(f"search: low and high must be finite numbers, got {low!r}, {high!r}")
        if tolerance is None:
            raise ConfigError("search: a float key needs a tolerance (how close to the boundary to get)")
        if not (is_number(tolerance) and math.isfinite(tolerance) and tolerance > 0):
            raise ConfigError(f"search: tolerance must be a positive number, got {tolerance!r}")
        low, high, unit = float(low), float(high), float(tolerance)
    if low > high:
        raise ConfigError(f"search: low ({low}) must not be above high ({high})")
    if isinstance(max_probes, bool) or not isinstance(max_probes, int) or max_probes < 1:
        raise ConfigError(f"search: max_probes must be a whole number >= 1, got {max_probes!r}")
    return low, high, unit


def _bracket_offsets(unit, span) -> Iterator:
    """Offsets 1, 3, 7, 15, ... units from the favourable end; the last is clipped to ``span``."""
    offset, step = 0 * unit, unit
    while offset < span:
        offset = min(offset + step, span)
        step = step * 2
        yield offset


def _bisections(gap, unit, integer: bool) -> int:
    """Worst-case bisection probes to shrink ``gap`` to ``unit`` (one extra for float rounding)."""
    if integer:
        return max(0, (gap - 1).bit_length())  # ceil(log2(gap)) halvings of ceil(gap / 2)
    count = 0
    while gap > unit:
        gap, count = gap / 2, count + 1
    return count + 1


def max_search_probes(*, low, high, integer: bool = True, tolerance=None) -> int:
    """The most probes :func:`search` can make on this range (a progress bar's total)."""
    low, high, unit = _check_range(low, high, integer, tolerance, 1)
    worst, previous = 1, 0 * unit
    for count, offset in enumerate(_bracket_offsets(unit, high - low), start=1):
        # a failure at this bracketing probe leaves (previous, offset) to bisect
        worst = max(worst, 1 + count + _bisections(offset - previous, unit, integer))
        previous = offset
    return worst


def _fmt(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:.6g}"


def _fmt_pair(a, b) -> tuple[str, str]:
    """Format two numbers with just enough digits to tell them apart."""
    if isinstance(a, int) and isinstance(b, int):
        return str(a), str(b)
    for digits in range(6, 18):
        sa, sb = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if sa != sb:
            return sa, sb
    return repr(a), repr(b)


def search(
    evaluate: Callable[[Any], tuple[bool, Any]],
    *,
    low,
    high,
    maximize: bool = True,
    integer: bool = True,
    tolerance=None,
    max_probes: int = MAX_PROBES,
    key: str = "value",
    constraint_text: str = "the constraint",
    progress: Callable[[Probe], None] | None = None,
) -> SearchOutcome:
    """Find the largest (``maximize``) or smallest value in ``[low, high]`` where a constraint holds.

    Assumes monotonicity (see the module docstring for the algorithm). On a non-monotone
    metric it still ends within :func:`max_search_probes` probes, at some passing value next
    to a failing one.

    :param evaluate: ``evaluate(value) -> (holds, payload)``, called at most once per value
        (an int for integer keys, a float otherwise); ``payload`` is kept for the caller.
    :param integer: True for whole-number keys; the answer then passes and answer + 1 fails
        (answer - 1 when minimizing) unless the range ends there.
    :param tolerance: float keys only (required): stop when the passing and failing values
        are at most this far apart.
    :param max_probes: refuse (before probing) a range whose worst case needs more probes.
    :param key: the key's name, for the message.
    :param constraint_text: the constraint as written, for the message.
    :param progress: called with each :class:`Probe` right after it is made.
    :raises ConfigError: bad range, tolerance or max_probes.
    """
    low, high, unit = _check_range(low, high, integer, tolerance, max_probes)
    needed = max_search_probes(low=low, high=high, integer=integer, tolerance=tolerance)
    if needed > max_probes:
        raise ConfigError(
            f"search over {key} in [{_fmt(low)}, {_fmt(high)}] may need {needed} runs, more than "
            f"max_probes = {max_probes}; narrow the range, raise the tolerance or raise max_probes"
        )
    start, end = (low, high) if maximize else (high, low)
    # Float keys: probe round numbers (0.95, not 0.9500000000000001), finer than the tolerance.
    digits = None if integer else max(0, 2 - math.floor(math.log10(unit)))
    probes: list[Probe] = []
    seen: dict[Any, Probe] = {}

    def probe(value) -> bool:
        if value not in seen:
            holds, payload = evaluate(value)
            seen[value] = made = Probe(value, bool(holds), payload)
            probes.append(made)
            if progress is not None:
                progress(made)
        return seen[value].holds

    def outcome(status, value, failing, message) -> SearchOutcome:
        payload = seen[value].payload if value is not None else None
        return SearchOutcome(status, value, payload, failing, probes, message)

    if not probe(start):
        return outcome("fails-everywhere", None, start,
                       f"{constraint_text} fails even at {key} = {_fmt(start)}")

    passing, failing = start, None
    span = high - low
    for offset in _bracket_offsets(unit, span):
        if offset >= span:
            value = end
        else:  # clipped: float rounding must not step past the end
            value = min(start + offset, end) if maximize else max(start - offset, end)
        if digits is not None and value != end:  # a round number, but never past the end
            value = min(round(value, digits), end) if maximize else max(round(value, digits), end)
        if probe(value):
            passing = value
        else:
            failing = value
            break
    if failing is None:
        if maximize:
            message = (f"{constraint_text} holds up to the top of the range ({key} = {_fmt(end)}); "
                       f"raise high to search further")
        else:
            message = (f"{constraint_text} holds down to the bottom of the range ({key} = {_fmt(end)}); "
                       f"lower low to search further")
        return outcome("holds-everywhere", end, None, message)

    # a float bracket of 4.3 to 4.4 is 0.10000000000000053 wide: within a tolerance of 0.1
    width = unit if integer else unit * (1 + 1e-9)
    while abs(failing - passing) > width and len(probes) < max_probes:
        middle = (passing + failing) // 2 if integer else round((passing + failing) / 2, digits)
        if middle == passing or middle == failing:  # float resolution reached
            break
        if probe(middle):
            passing = middle
        else:
            failing = middle
    best, worse = _fmt_pair(passing, failing)
    word = "largest" if maximize else "smallest"
    return outcome("found", passing, failing,
                   f"{word} {key} with {constraint_text}: {best} ({worse} fails)")
