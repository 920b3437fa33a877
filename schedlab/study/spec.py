"""A study as data: one ``[[runs]]`` entry resolved, and the run of each of its points.

:mod:`.experiment` reads files into :class:`StudySpec` objects; :mod:`.runner` and
:mod:`.planner` turn them into runs with :func:`point_spec`. Both import this module and it
imports neither, so reading experiments and running them do not depend on each other.
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs

from ..configs import MAX_REQUESTS, FieldError, bool_field, is_finite_number, str_field, value_text
from ..errors import ConfigError
from ..results.metric_names import check_metric_name
from .overrides import set_dotted
from .search import MAX_PROBES, Constraint, max_search_probes, parse_constraint
from .simulation import RunSpec
from .sweep import point_label

#: The tables of one run; a sweep or search varies keys inside these only.
RUN_TABLES = ("workload", "scheduler", "cost_model", "kv_cache", "cluster", "slo", "speculative", "power", "clock",
              "frontend", "client", "target")


def _check_texts(attribute, value) -> None:
    if not isinstance(value, tuple):
        raise FieldError(attribute.name, f"must be a list of conditions, got {value_text(value)}")
    for element in value:
        if not isinstance(element, str):
            raise FieldError(attribute.name, f"every element must be text (a condition such as "
                                             f"'ttft_ms.p99 <= 200'), got {value_text(element)}")


@attrs.frozen
class SearchConfig:
    key: str = str_field(help="dotted key to search over, e.g. workload.clients")
    low: Any = attrs.field(metadata={"help": "lowest value of the range"})
    high: Any = attrs.field(metadata={"help": "highest value of the range"})
    constraint: str | None = str_field(None, optional=True, help="metric condition, e.g. 'ttft_ms.p99 <= 200'")
    constraints: tuple | None = attrs.field(
        default=None, converter=lambda v: tuple(v) if isinstance(v, list) else v,
        validator=lambda inst, attribute, value: value is None or _check_texts(attribute, value),
        metadata={"help": "several metric conditions, all of which must hold, e.g. "
                          "['ttft_ms.p99 <= 500', 'tpot_ms.p99 <= 50'] (instead of constraint)"})
    maximize: bool = bool_field(True, help="find the largest value that meets the constraint (else the smallest)")
    tolerance: Any = attrs.field(default=None, metadata={"help": "stop width for real-valued keys"})
    warmup: Any = attrs.field(default=0, metadata={
        "help": "requests each probe leaves out of its statistics, the first sent: a count (40) or a share of "
                "the run's requests below 1 (0.1); 0: none (guidellm's warmup)"})
    cooldown: Any = attrs.field(default=0, metadata={
        "help": "requests each probe leaves out of its statistics, the last sent: a count (40) or a share of "
                "the run's requests below 1 (0.1); 0: none (guidellm's cooldown)"})

    def __attrs_post_init__(self):
        for name in ("low", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name}: must be a number, got {value!r}")
            if not is_finite_number(value):  # (an integer of 309+ digits too: no float holds it)
                raise FieldError(name, f"must be a finite number, got {value_text(value)}")
        if self.low > self.high:
            raise ConfigError(f"low ({self.low}) must be <= high ({self.high})")
        self._check_constraints()
        self._check_probes()
        check_warmup(self.warmup)
        check_warmup(self.cooldown, "cooldown")
        if isinstance(self.warmup, float) and isinstance(self.cooldown, float) and self.warmup + self.cooldown >= 1:
            raise FieldError("cooldown", f"with warmup = {self.warmup!r} leaves out every request of a run "
                                         f"(together they must be below 1), got {self.cooldown!r}")

    def _check_constraints(self) -> None:
        """``constraint`` or ``constraints`` (not both, a list of at least one), each parsed and its
        metric name checked now, as ``[plan]`` checks its ``constraints``."""
        if self.constraint is not None and self.constraints is not None:
            raise FieldError("constraints", "give constraint = \"...\" (one) or constraints = [...] (all must hold), "
                                            "not both")
        if self.constraint is None and self.constraints is None:
            raise FieldError("constraint", "name the condition to search for, e.g. constraint = \"ttft_ms.p99 <= 200\" "
                                           "(or constraints = [...], all of which must hold)")
        if self.constraints is not None and not self.constraints:
            raise FieldError("constraints", "name at least one, e.g. ['ttft_ms.p99 <= 200']")
        twice = next((t for i, t in enumerate(self.texts) if t in self.texts[:i]), None)
        if twice is not None:
            raise FieldError("constraints", f"lists {twice!r} twice")
        for text in self.texts:
            try:
                check_metric_name(parse_constraint(text).metric)
            except ConfigError as exc:
                hint = ""
                if self.constraint is not None and re.search(r"\s(and|&&?)\s", text):
                    hint = ("; for several conditions that must all hold, list them: "
                            "constraints = [\"ttft_ms.p99 <= 500\", \"tpot_ms.p99 <= 50\"]")
                raise FieldError(self.field, str(exc) + hint) from None

    @property
    def field(self) -> str:
        """The key the file named its condition with: ``constraint`` or ``constraints``."""
        return "constraint" if self.constraint is not None else "constraints"

    @property
    def texts(self) -> tuple[str, ...]:
        """The conditions as written, one or several."""
        return (self.constraint,) if self.constraint is not None else tuple(self.constraints or ())

    @property
    def constraint_text(self) -> str:
        """The conditions as one text (``a and b``), as messages, ``Study.constraint`` and
        summary.json's ``"constraint"`` say them (the one condition as written)."""
        return " and ".join(self.texts)

    def parsed(self) -> list[Constraint]:
        return [parse_constraint(text) for text in self.texts]

    def _check_probes(self) -> None:
        """The tolerance, and the runs the search may need, as the search will check them --
        but now, when the file is read, not after the other runs."""
        tolerance = self.tolerance
        if self.integer:
            needed = max_search_probes(low=self.low, high=self.high)
        else:
            if tolerance is None:
                written = [v for v in (self.low, self.high) if isinstance(v, float)]
                if all(v.is_integer() for v in written):  # (1.0 in TOML is a real number, though whole)
                    low, high = (f"{int(v)}" if isinstance(v, float) else f"{v}" for v in (self.low, self.high))
                    raise FieldError("tolerance", f"low = {self.low!r}, high = {self.high!r} (written with a "
                                                  "decimal point) make a search over real values, which needs a "
                                                  "tolerance: how close to the boundary to get; for one over whole "
                                                  f"numbers write low = {low}, high = {high}")
                raise FieldError("tolerance", "a search over real values (low or high is not a whole number) "
                                              "needs a tolerance: how close to the boundary to get")
            if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) \
                    or not math.isfinite(tolerance) or tolerance <= 0:
                raise FieldError("tolerance", f"must be a positive number, got {tolerance!r}")
            needed = max_search_probes(low=self.low, high=self.high, integer=False, tolerance=tolerance)
        if needed > MAX_PROBES:
            low, high = (f"{v}" if isinstance(v, int) else f"{v:g}" for v in (self.low, self.high))
            raise ConfigError(f"the search over {self.key} in [{low}, {high}] may need {needed} runs, more than "
                              f"the limit of {MAX_PROBES}; narrow the range"
                              + ("" if self.integer else " or raise the tolerance"))

    @property
    def integer(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int) and self.tolerance is None


def check_warmup(warmup: Any, name: str = "warmup") -> None:
    """A ``[search] warmup`` (or ``cooldown``, the ``name``): a whole number of requests (0 to
    :data:`~schedlab.configs.MAX_REQUESTS`) or a share of a run's requests, from 0 to below 1
    (raises FieldError otherwise)."""
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not is_finite_number(warmup) \
            or warmup < 0 or (isinstance(warmup, int) and warmup > MAX_REQUESTS) \
            or (isinstance(warmup, float) and warmup >= 1):
        if isinstance(warmup, float) and math.isfinite(warmup) and warmup >= 1 and warmup.is_integer() \
                and warmup <= MAX_REQUESTS:
            hint = f" (a count is a whole number: {name} = {int(warmup)})"
        else:
            hint = ""
        raise FieldError(name, f"must be a whole number of requests from 0 to {MAX_REQUESTS:,} ({name} = 40) or "
                               f"a share of each run's requests below 1 ({name} = 0.1), got {value_text(warmup)}"
                               f"{hint}")


@attrs.frozen
class StudySpec:
    """One ``[[runs]]`` entry resolved: its tables and what to do with them."""

    name: str
    base: RunSpec
    sweep: list[dict[str, Any]] | None = None
    search: SearchConfig | None = None
    replicas: int = 1
    plan: Any = None  # schedlab.study.planner.PlanConfig

    @property
    def kind(self) -> str:
        """What it will produce, as :class:`schedlab.results.records.Study` says: "run", "sweep",
        "search" or "plan" (a report checks the runs its settings name against this)."""
        if self.plan is not None:
            return "plan"
        if self.search is not None:
            return "search"
        return "sweep" if self.sweep is not None else "run"

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys a sweep varies (in order) or a search searches; () for a run (and for a
        plan, whose keys are known once it runs)."""
        if self.search is not None:
            return (self.search.key,)
        return tuple(self.sweep[0]) if self.sweep else ()

    def has_slo(self) -> bool:
        """Whether its runs have ``[slo]`` targets (so ``slo.*`` metrics), set or swept."""
        return self._has_table("slo")

    def has_power(self) -> bool:
        """Whether its runs meter energy (a ``[power]`` table, so ``energy.*`` metrics), set or varied."""
        return self._has_table("power")

    def _has_table(self, table: str) -> bool:
        space = self.plan.space if self.plan is not None else ()
        return table in self.base.tables or any(key.split(".")[0] == table for key in (*self.keys, *space))


def needs_slo(metric: str) -> bool:
    """Whether a metric exists only in runs with ``[slo]`` targets: ``slo.*`` and ``per_class.<class>.slo.*``."""
    parts = metric.split(".")   # (a class name may hold dots: the group is the part before the statistic)
    return parts[0] == "slo" or (parts[0] == "per_class" and parts[-2:-1] == ["slo"] and len(parts) > 3)


#: metrics only a run that meters energy has (schedlab.energy; a plan's energy cost and kWh per hour too)
ENERGY_METRICS = ("energy", "energy_cost_per_hour", "kwh_per_hour")


def needs_power(metric: str) -> bool:
    """Whether a metric exists only in runs with a ``[power]`` table: ``energy.*`` and
    ``per_class.<class>.energy.*``, and a plan's ``energy_cost_per_hour`` and ``kwh_per_hour``."""
    parts = metric.split(".")
    return parts[0] in ENERGY_METRICS or (parts[0] == "per_class" and parts[-2:-1] == ["energy"] and len(parts) > 3)


#: metrics a plan adds to each deployment it simulates, after its constraints are checked (schedlab.study.planner)
PLAN_METRICS = ("cost_per_hour", "cost_per_mtok", "kwh_per_hour", "energy_cost_per_hour")


def metric_lacks(metric: str, study) -> str | None:
    """What ``study``'s runs lack for ``metric`` to exist (``[slo] targets (ttft_ms, tpot_ms)``, ``a
    [power] table``, ``a [plan]``), or None when they have it or it needs nothing."""
    if metric.split(".")[0] in PLAN_METRICS and study.kind != "plan":
        return "a [plan] (only a plan prices the deployments it simulates)"
    if needs_slo(metric) and not study.has_slo():
        return "[slo] targets (ttft_ms, tpot_ms)"
    if needs_power(metric) and not study.has_power():
        return "a [power] table (only runs with one meter energy)"
    return None


def check_some_run_has(metric: str | None, studies, field: str) -> None:
    """Raise FieldError(``field``) when ``metric`` needs ``[slo]`` targets or a ``[power]`` table and
    no study of ``studies`` has them: a report's column, bar or best run drawn from it would be
    empty in every run."""
    from ..configs import FieldError

    studies = list(studies)
    lacks = [need for s in studies if metric and (need := metric_lacks(metric, s))]
    if studies and len(lacks) == len(studies):
        raise FieldError(field, f"{metric!r} needs {lacks[0]}, and no run has "
                                f"{'them' if 'targets' in lacks[0] else 'one'}: every run would show -")


def check_slo(metric: str, studies, what: str) -> None:
    """Raise ConfigError when ``metric`` needs ``[slo]`` targets or a ``[power]`` table and a study of
    ``studies`` has none (the metric would be absent from all its runs: a silent ``-`` or NaN)."""
    lacking = [(s.name, need) for s in studies if (need := metric_lacks(metric, s))]
    if lacking:
        names = [name for name, _ in lacking]
        runs = f"run {names[0]!r} has" if len(names) == 1 else f"runs {', '.join(map(repr, names))} have"
        raise ConfigError(f"{what}: {metric!r} needs {lacking[0][1]}, and {runs} none")


def point_spec(study: StudySpec, point: dict[str, Any]) -> RunSpec:
    """The run of one point of a study: the base tables with the point's dotted keys set (a
    search's probe with its ``warmup`` and ``cooldown``)."""
    tables = study.base.tables
    for key, value in point.items():
        if key.split(".")[0] not in RUN_TABLES:
            raise ConfigError(f"cannot vary {key!r}; keys start with one of {', '.join(RUN_TABLES)}")
        tables = set_dotted(tables, key, value)
    label = point_label(point)
    # a search's probes leave its warm-up and cool-down out of their statistics (RunSpec.warmup)
    search = study.search
    return RunSpec(f"{study.name}[{label}]" if label else study.name, tables, study.base.seed,
                   study.base.engine, point, warmup=search.warmup if search is not None else 0,
                   cooldown=search.cooldown if search is not None else 0)
