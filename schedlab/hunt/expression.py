"""Objectives and properties of a hunt: a small expression language over run metrics.

::

    runs.mine.ttft_ms.p99 / runs.fcfs.ttft_ms.p99           # an objective (maximised)
    runs.mine.ttft_ms.p99 / runs.fcfs.ttft_ms.p99 < 2.0     # a property (falsified)
    max(runs.prio.per_class.batch.ttft_ms.max, 1) / 1000
    runs.vllm.num_preemptions / workload.requests

Grammar (no Python is evaluated; the text is parsed into a tree of numbers, names and the
four operations)::

    condition := expr OP ["-"] NUMBER            OP: <=, <, >=, > (as a [search] constraint)
    expr      := term (("+" | "-") term)*
    term      := unary (("*" | "/") unary)*
    unary     := "-" unary | atom
    atom      := NUMBER | NAME | FUNC "(" expr ("," expr)* ")" | "(" expr ")"
    FUNC      := min | max | abs

A NAME is ``runs.<run>.<metric>`` -- a run of the file and a dotted metric name, checked as
reports and searches check them (:func:`schedlab.results.metric_names.check_metric_name`) --
or ``workload.<statistic>`` of the candidate workload itself (:data:`WORKLOAD_STATS`). Names
follow metric names, which may hold ``-``: write a subtraction with spaces (``a - b``).
A metric a run lacks (``per_class`` of a workload with one class), a division by zero or a
NaN makes the whole value NaN, which never counts as found. Parentheses, minus signs and
function calls nest at most :data:`MAX_DEPTH` levels deep; sums and products may be of any length.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping

import attrs

from ..errors import ConfigError
from ..results.metric_names import check_metric_name
from ..study.search import COMPARE, OPERATORS

#: ``workload.<name>``: statistics of a candidate workload (see :func:`schedlab.hunt.space.workload_stats`).
WORKLOAD_STATS = ("requests", "duration_s", "rate_rps", "max_gap_s", "prompt_tokens.mean", "prompt_tokens.max",
                  "prompt_tokens.total", "output_tokens.mean", "output_tokens.max", "output_tokens.total",
                  "tokens_per_s")
FUNCTIONS: dict[str, Callable[..., float]] = {"min": min, "max": max, "abs": abs}
#: the deepest nesting of parentheses, minus signs and function calls (the parser and evaluator recurse)
MAX_DEPTH = 50

_TOKEN = re.compile(r"""\s*(?:
    (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)
  | (?P<op><=|>=|<|>|[-+*/(),])
)""", re.VERBOSE)


def _quoted(text: str, limit: int = 80) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters (an expression may be long)."""
    return repr(text) if len(text) <= limit else repr(text[:limit - 3] + "...")


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ConfigError(f"expression {_quoted(text)}: cannot read {text[pos:].strip()[:20]!r} "
                              f"(numbers, metric names, + - * /, min max abs, parentheses)")
        kind = match.lastgroup
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


@attrs.frozen
class Expression:
    """A parsed expression: :meth:`value` evaluates it over a namespace of names -> numbers."""

    text: str
    tree: Any
    names: tuple[str, ...]

    def value(self, lookup: Callable[[str], Any]) -> float:
        """The value with each name's number from ``lookup(name)`` (None or a non-number is NaN)."""
        try:
            result = _evaluate(self.tree, lookup)
        except (OverflowError, ZeroDivisionError):
            return math.nan
        return float(result)

    def why_undefined(self, lookup: Callable[[str], Any]) -> str:
        """Why :meth:`value` is NaN with ``lookup`` (the first cause met), for a summary to say so."""
        why: list[str] = []
        try:
            _evaluate(self.tree, lookup, why)
        except (OverflowError, ZeroDivisionError):
            return f"overflow in {self.text!r}"
        return f"{why[0] if why else 'no number'} in {self.text!r}"


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def _evaluate(node, lookup, why: list[str] | None = None) -> float:
    """The value of ``node``; with ``why``, the first cause of a NaN is appended to it."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "name":
        value = _number(lookup(node[1]))
        if why is not None and math.isnan(value) and not why:
            why.append(f"no value for {node[1]}")
        return value
    if kind == "neg":
        return -_evaluate(node[1], lookup, why)
    if kind == "call":
        args = [_evaluate(arg, lookup, why) for arg in node[2]]
        return math.nan if any(math.isnan(a) for a in args) else float(FUNCTIONS[node[1]](*args))
    value = _evaluate(node[1], lookup, why)  # a chain: first (op operand)*, left to right
    for op, operand in node[2]:
        right = _evaluate(operand, lookup, why)
        result = _apply(op, value, right)
        if why is not None and math.isnan(result) and not why:  # NaN from numbers: x / 0, inf - inf
            why.append("division by zero" if op == "/" and right == 0 else "an infinite value")
        value = result
    return value


def _apply(op: str, left: float, right: float) -> float:
    if op == "/":
        return math.nan if right == 0 else left / right
    return {"+": left + right, "-": left - right, "*": left * right}[op]


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0
        self.names: list[str] = []
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise self.error("ends too early")
        self.pos += 1
        return token

    def error(self, what: str) -> ConfigError:
        return ConfigError(f"expression {_quoted(self.text)}: {what}")

    def enter(self) -> None:
        """One level deeper (parentheses, a minus sign, a call); refused beyond :data:`MAX_DEPTH`."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nested more than {MAX_DEPTH} levels deep (parentheses, minus signs, function calls)")

    def expect(self, op: str) -> None:
        token = self.take()
        if token != ("op", op):
            raise self.error(f"expected {op!r}, got {token[1]!r}")

    def expr(self):
        return self.chain(self.term, ("+", "-"))

    def term(self):
        return self.chain(self.unary, ("*", "/"))

    def chain(self, operand, ops: tuple[str, ...]):
        """``operand (op operand)*`` as one flat node, so a long sum is no deeper than one term."""
        first, rest = operand(), []
        while self.peek() in [("op", op) for op in ops]:
            rest.append((self.take()[1], operand()))
        return ("chain", first, tuple(rest)) if rest else first

    def unary(self):
        if self.peek() != ("op", "-"):
            return self.atom()
        self.take()
        self.enter()
        node = ("neg", self.unary())
        self.depth -= 1
        return node

    def atom(self):
        kind, text = self.take()
        if kind == "number":
            return ("num", float(text))
        if kind == "name":
            if self.peek() == ("op", "("):
                if text not in FUNCTIONS:
                    raise self.error(f"unknown function {text!r}; functions: {', '.join(FUNCTIONS)}")
                self.take()
                self.enter()
                args = [self.expr()]
                while self.peek() == ("op", ","):
                    self.take()
                    args.append(self.expr())
                self.expect(")")
                self.depth -= 1
                if text == "abs" and len(args) != 1:
                    raise self.error("abs takes one argument")
                if text in ("min", "max") and len(args) < 2:
                    raise self.error(f"{text} takes two or more arguments")
                return ("call", text, tuple(args))
            self.names.append(text)
            return ("name", text)
        if (kind, text) == ("op", "("):
            self.enter()
            node = self.expr()
            self.expect(")")
            self.depth -= 1
            return node
        raise self.error(f"unexpected {text!r}")


def parse_expression(text: str) -> Expression:
    """Parse an objective such as ``runs.a.ttft_ms.p99 / runs.b.ttft_ms.p99`` (names not yet checked)."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"an expression must be non-empty text, got {text!r}")
    parser = _Parser(text)
    tree = parser.expr()
    if parser.peek() is not None:
        raise parser.error(f"unexpected {parser.peek()[1]!r}")
    return Expression(text.strip(), tree, tuple(dict.fromkeys(parser.names)))


@attrs.frozen
class Condition:
    """``expression OP threshold``: a property a hunt falsifies, or a constraint that keeps it honest."""

    expression: Expression
    op: str = attrs.field(validator=attrs.validators.in_(OPERATORS))
    threshold: float = attrs.field(converter=float)

    @property
    def text(self) -> str:
        shown = f"{self.threshold:g}"   # short, but never a rounded number: the one enforced
        return f"{self.expression.text} {self.op} {shown if float(shown) == self.threshold else repr(self.threshold)}"

    def holds(self, value: float) -> bool:
        """True when ``value`` (the expression's) satisfies the condition; NaN never does."""
        return not math.isnan(value) and COMPARE[self.op](value, self.threshold)

    def violation(self, value: float) -> float:
        """How far ``value`` is from satisfying the condition (0 when it holds, inf for NaN)."""
        if math.isnan(value):
            return math.inf
        return 0.0 if self.holds(value) else abs(value - self.threshold) + 1e-12


def parse_condition(text: str) -> Condition:
    """Parse ``EXPRESSION OP NUMBER`` (OP one of <=, <, >=, >; the number may have a minus sign)."""
    if not isinstance(text, str):
        raise ConfigError(f"a condition must be text such as 'runs.a.ttft_ms.p99 < 2000', got {text!r}")
    tokens = _tokens(text)
    at = [i for i, (kind, op) in enumerate(tokens) if kind == "op" and op in OPERATORS]
    right = tokens[at[0] + 1:] if len(at) == 1 else []
    sign = 1.0
    if right[:1] == [("op", "-")]:
        sign, right = -1.0, right[1:]
    if len(right) != 1 or right[0][0] != "number":
        raise ConfigError(f"condition {_quoted(text)}: expected EXPRESSION OP NUMBER, e.g. "
                          f"'runs.mine.ttft_ms.p99 / runs.fcfs.ttft_ms.p99 < 2' (operators: {', '.join(OPERATORS)})")
    op = tokens[at[0]][1]
    return Condition(parse_expression(text[:text.rindex(op)]), op, sign * float(right[0][1]))


def check_names(expression: Expression, runs: tuple[str, ...], where: str) -> None:
    """Raise ConfigError naming ``where`` unless every name is ``runs.<a run>.<metric>`` or
    ``workload.<statistic>``."""
    for name in expression.names:
        try:
            split_name(name, runs)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def run_metrics(expression: Expression) -> tuple[str, ...]:
    """The names of ``expression`` that are a run's metric (``runs.<run>.<metric>``), not a
    statistic of the workload."""
    return tuple(name for name in expression.names if not name.startswith("workload."))


def check_runs_take_part(goal: Expression, constraints, runs: tuple[str, ...], where: str) -> None:
    """Raise ConfigError naming ``where`` when neither the ``goal`` expression nor any of the
    ``constraints`` (Conditions) names a run's metric: no policy would take part in the hunt."""
    if not run_metrics(goal) and not any(run_metrics(c.expression) for c in constraints):
        raise ConfigError(f"{where}: {_quoted(goal.text)} names no run's metric, and no constraint does: the runs' "
                          f"policies would play no part in the hunt; name runs.<run>.<metric> (runs: "
                          f"{', '.join(runs)}) in it or in a constraint")


def check_not_constant(expression: Expression, runs: tuple[str, ...], where: str) -> None:
    """Raise ConfigError naming ``where`` when ``expression`` names nothing at all: a constant,
    the same for every workload (``objective = "5"``) -- or divides by a constant 0, undefined for
    every workload (found by fuzzing: the whole budget ran before the hunt said so)."""
    if not expression.names:
        example = f"runs.{runs[0]}.ttft_ms.p99" if runs else "runs.<run>.ttft_ms.p99"
        raise ConfigError(f"{where}: {_quoted(expression.text)} names no metric: it is a constant, the same for every "
                          f"workload; name runs.<run>.<metric> (runs: {', '.join(runs)}) or workload.<statistic>, "
                          f"e.g. {example!r}")
    if _divides_by_constant_zero(expression.tree):
        raise ConfigError(f"{where}: {_quoted(expression.text)} divides by a constant 0: it has no value for any "
                          "workload")


def _divides_by_constant_zero(node) -> bool:
    """Whether ``node`` holds ``x / c`` with ``c`` an expression of numbers alone equal to 0."""
    kind = node[0]
    if kind in ("num", "name"):
        return False
    if kind == "neg":
        return _divides_by_constant_zero(node[1])
    if kind == "call":
        return any(_divides_by_constant_zero(arg) for arg in node[2])
    if _divides_by_constant_zero(node[1]):
        return True
    for op, operand in node[2]:
        if _divides_by_constant_zero(operand):
            return True
        if op == "/" and not _names_in(operand) and _evaluate(operand, lambda name: math.nan) == 0:
            return True
    return False


def _names_in(node) -> bool:
    kind = node[0]
    if kind == "name":
        return True
    if kind == "num":
        return False
    if kind == "neg":
        return _names_in(node[1])
    if kind == "call":
        return any(_names_in(arg) for arg in node[2])
    return _names_in(node[1]) or any(_names_in(operand) for _, operand in node[2])


def split_name(name: str, runs: tuple[str, ...]) -> tuple[str, str]:
    """``("runs", run, metric)`` as ``(run, metric)``, or ``("", statistic)`` for ``workload.*``."""
    if name.startswith("workload."):
        stat = name[len("workload."):]
        if stat not in WORKLOAD_STATS:
            raise ConfigError(f"unknown {name!r}; workload statistics: "
                              f"{', '.join('workload.' + s for s in WORKLOAD_STATS)}")
        return "", stat
    if name.startswith("runs."):
        for run in sorted(runs, key=len, reverse=True):  # run names may hold dots
            if name.startswith(f"runs.{run}."):
                return run, check_metric_name(name[len(f"runs.{run}."):])
        raise ConfigError(f"{name!r}: no such run; runs: {', '.join(runs)} (write runs.<run>.<metric>)")
    raise ConfigError(f"unknown name {name!r}: write runs.<run>.<metric> (runs: {', '.join(runs)}) or "
                      f"workload.<statistic>")


def namespace(metrics: Mapping[str, dict], stats: Mapping[str, float], runs: tuple[str, ...]) -> Callable[[str], Any]:
    """A lookup of names over each run's metrics and the workload's statistics."""
    from ..results.metrics import metric_at

    def lookup(name: str):
        run, rest = split_name(name, runs)
        return stats.get(rest) if not run else metric_at(metrics.get(run, {}), rest)

    return lookup
