"""The ``[hunt]`` table: what to look for, where, and for how long.

::

    [hunt]
    objective = "runs.chunked.ttft_ms.p99 / runs.off.ttft_ms.p99"   # maximised (minimize = true: minimised)
    # property = "runs.chunked.ttft_ms.p99 / runs.off.ttft_ms.p99 < 2"   # or: a property to falsify
    constraints = ["runs.off.busy_share <= 0.8"]   # honesty: what every candidate must satisfy
    budget = 400                                   # workloads the search evaluates
    [hunt.workload]                                # the search space (schedlab.hunt.space)
    requests = [2, 40]
    [hunt.settings]                                # optional: settings' ranges
    "scheduler.max_num_batched_tokens" = [256, 4096]

The other tables of the file ([scheduler], [cost_model], [[runs]], ...) are an ordinary
experiment's; each ``[[runs]]`` entry is one policy every candidate workload runs through. The
file has no ``[workload]``: the hunt makes one per candidate.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import attrs

from ..configs import (MAX_INT, FieldError, bool_field, bound_text, float_field, int_field, list_field, str_field,
                       table_field)
from ..errors import ConfigError
from .expression import (
    Condition, Expression, check_names, check_not_constant, check_runs_take_part, parse_condition, parse_expression,
)

DEFAULT_BUDGET = 400


@attrs.frozen
class HuntConfig:
    workload: dict = table_field(help="the search space of workloads (requests, rate, cv, prompt, output, "
                                      "classes, prefix)")
    objective: str | None = str_field(None, optional=True,
                                      help="expression to maximise over the runs of one workload, e.g. "
                                           "'runs.a.ttft_ms.p99 / runs.b.ttft_ms.p99'")
    property: str | None = str_field(None, optional=True,
                                     help="a property to falsify instead, e.g. 'runs.a.ttft_ms.p99 / "
                                          "runs.b.ttft_ms.p99 < 2'")
    minimize: bool = bool_field(False, help="minimise the objective instead of maximising it")
    constraints: tuple = list_field((), item=str,
                                    help="conditions every candidate must meet, e.g. 'runs.b.busy_share <= 0.8'")
    budget: int = int_field(DEFAULT_BUDGET, min=1, max=10**6, help="workloads the search evaluates")
    time_limit_s: float = float_field(0.0, min=0.0, help="stop the search, and random sampling, each after this "
                                                         "long, the workers' start-up included (0: no limit; a time "
                                                         "limit makes the result depend on the machine's speed)")
    random: int | None = int_field(None, min=0, max=10**6, optional=True,
                                   help="random workloads evaluated for comparison (default: as many as the search "
                                        "evaluated; 0: none)")
    optimizer: str = str_field("PortfolioDiscreteOnePlusOne",
                               help="Nevergrad optimiser (PortfolioDiscreteOnePlusOne, NGOpt, CMA, TwoPointsDE, ...)")
    batch: int = int_field(8, min=1, max=1024,
                           help="candidates the optimiser proposes at once, evaluated in parallel (fixed, so that "
                                "a seed gives the same hunt on any number of workers)")
    warm_start: int | None = int_field(None, min=1, max=10**6, optional=True,
                                       help="uniform random candidates the search starts from (default: a "
                                            "twentieth of the budget, at least one batch)")
    stop_on_counterexample: bool = bool_field(True, help="with a property: stop at the end of the batch "
                                                         "that falsified it")
    tolerance: float = float_field(0.05, min=0.0, max=1.0,
                                   help="shrinking keeps the objective within this share of the best found")
    shrink_budget: int = int_field(400, min=0, max=10**6, help="evaluations the shrinker may spend")
    allow_rejected: bool = bool_field(False, help="count a workload some of whose requests a run rejected (a prompt "
                                                  "longer than max_model_len, say) as feasible; by default it "
                                                  "is not, as its metrics leave those requests out")
    settings: dict = table_field(attrs.Factory(dict),
                                 help="settings' ranges: \"table.key\" (every run) or \"runs.NAME.table.key\" "
                                      "= [low, high]; two whole numbers draw whole numbers ([0.0, 4]: any)")

    def __attrs_post_init__(self):
        if self.objective is not None and self.property is not None:
            raise FieldError("objective", "give either objective (to maximise) or property (to falsify), not both")
        if self.objective is None and self.property is None:
            raise FieldError("objective", "give an objective (to maximise) or a property (to falsify): the hunt needs "
                                          "one to search by")
        if self.property is not None and self.minimize:
            raise FieldError("minimize", "a property says its own direction; minimize is for an objective")


@attrs.frozen
class Goal:
    """What a hunt looks for, parsed: an expression, the direction that is worse for the policy,
    an optional property threshold and the honesty constraints."""

    expression: Expression
    direction: int                     # +1: larger is worse (maximise), -1: smaller is worse
    property: Condition | None
    constraints: tuple[Condition, ...]

    @property
    def names(self) -> tuple[str, ...]:
        names = list(self.expression.names)
        for c in self.constraints:
            names += c.expression.names
        return tuple(dict.fromkeys(names))

    def found(self, value: float) -> bool:
        """With a property: True when ``value`` falsifies it."""
        return self.property is not None and not math.isnan(value) and not self.property.holds(value)

    def describe(self) -> str:
        if self.property is not None:
            return f"falsify {self.property.text}"
        return f"{'maximise' if self.direction > 0 else 'minimise'} {self.expression.text}"


def make_goal(config: HuntConfig, runs: tuple[str, ...], where: str) -> Goal:
    """The parsed goal, every name checked against the file's runs and the metric names.

    The objective (or property) and every constraint must name something (a constant is the
    same for every workload), and some run's metric must be among them (else no policy takes
    part: ``workload.tokens_per_s`` is a goal only under a constraint on a run)."""
    try:
        if config.property is not None:
            prop = parse_condition(config.property)
            expression, direction = prop.expression, (1 if prop.op in ("<", "<=") else -1)
        else:
            prop, expression = None, parse_expression(config.objective)
            direction = -1 if config.minimize else 1
        constraints = tuple(parse_condition(text) for text in config.constraints)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    what = f"{where} {'property' if prop else 'objective'}"
    check_names(expression, runs, what)
    check_not_constant(expression, runs, what)
    for c in constraints:
        check_names(c.expression, runs, f"{where} constraints")
        check_not_constant(c.expression, runs, f"{where} constraints")
    check_runs_take_part(expression, constraints, runs, what)
    return Goal(expression, direction, prop, constraints)


def number_range(value: Any, name: str, *, integer: bool, low: float, high: float = MAX_INT,
                 low_exclusive: bool = False) -> tuple:
    """``[lo, hi]`` (or one number: both) as a checked tuple; FieldError naming ``name``."""
    pair = value if isinstance(value, (list, tuple)) else [value, value]
    kind = "whole numbers" if integer else "numbers"
    if len(pair) != 2 or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in pair):
        raise FieldError(name, f"must be a number or [low, high] of {kind}, got {value!r}")
    if integer and not all(isinstance(v, int) for v in pair):  # 4.0 too, as int_field refuses it
        raise FieldError(name, f"must be whole numbers, got {value!r}")
    shown = f"[{', '.join(bound_text(v) for v in pair)}]" if isinstance(value, (list, tuple)) else bound_text(value)
    if not integer and not all(abs(v) <= sys.float_info.max for v in pair if isinstance(v, int)):
        raise FieldError(name, f"must be finite numbers (at most {sys.float_info.max:.3g}), got {shown}")
    lo, hi = (int(v) for v in pair) if integer else (float(v) for v in pair)
    if not integer and not (math.isfinite(lo) and math.isfinite(hi)):
        raise FieldError(name, f"must be finite, got {shown}")
    if lo > hi:
        raise FieldError(name, f"low ({bound_text(lo)}) must be <= high ({bound_text(hi)})")
    if lo < low or (low_exclusive and lo == low) or hi > high:
        bound = f"> {low}" if low_exclusive else f">= {low}"
        raise FieldError(name, f"must be {bound} and <= {high:g}, got {shown}")
    return lo, hi


def range_field(default=attrs.NOTHING, *, integer: bool, low: float, high: float = MAX_INT,
                low_exclusive: bool = False, help: str = ""):
    """An attrs field holding ``(lo, hi)``, written in TOML as ``[lo, hi]`` or one number
    (both ends then equal)."""
    def convert(value):
        if isinstance(value, list):
            return tuple(value)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return (value, value)
        return value

    def check(_instance, attribute, value):
        if value is not None:
            number_range(_as_written(value), attribute.name, integer=integer, low=low, high=high,
                         low_exclusive=low_exclusive)

    return attrs.field(default=default, converter=convert, validator=check, metadata={"help": help})


def _as_written(value):
    """A converted range as the TOML had it (messages quote it): ``[lo, hi]``, or one number for both."""
    if not isinstance(value, tuple):
        return value
    if len(value) == 2 and value[0] == value[1] and type(value[0]) is type(value[1]):
        return value[0]
    return list(value)
