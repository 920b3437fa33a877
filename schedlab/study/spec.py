"""A study as data: one ``[[runs]]`` entry resolved, and the run of each of its points.

:mod:`.experiment` reads files into :class:`StudySpec` objects; :mod:`.runner` and
:mod:`.planner` turn them into runs with :func:`point_spec`. Both import this module and it
imports neither, so reading experiments and running them do not depend on each other.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..configs import FieldError, bool_field, str_field
from ..errors import ConfigError
from ..results.metric_names import check_metric_name
from .overrides import set_dotted
from .search import parse_constraint
from .simulation import RunSpec
from .sweep import point_label

#: The tables of one run; a sweep or search varies keys inside these only.
RUN_TABLES = ("workload", "scheduler", "cost_model", "kv_cache", "cluster", "slo", "speculative", "power", "clock",
              "frontend", "client", "target")


@attrs.frozen
class SearchConfig:
    key: str = str_field(help="dotted key to search over, e.g. workload.clients")
    low: Any = attrs.field(metadata={"help": "lowest value of the range"})
    high: Any = attrs.field(metadata={"help": "highest value of the range"})
    constraint: str = str_field(help="metric condition, e.g. 'ttft_ms.p99 <= 200'")
    maximize: bool = bool_field(True, help="find the largest value that meets the constraint (else the smallest)")
    tolerance: Any = attrs.field(default=None, metadata={"help": "stop width for real-valued keys"})

    def __attrs_post_init__(self):
        for name in ("low", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name}: must be a number, got {value!r}")
        if self.low > self.high:
            raise ConfigError(f"low ({self.low}) must be <= high ({self.high})")
        try:
            check_metric_name(parse_constraint(self.constraint).metric)
        except ConfigError as exc:
            raise FieldError("constraint", str(exc)) from None

    @property
    def integer(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int) and self.tolerance is None


@attrs.frozen
class StudySpec:
    """One ``[[runs]]`` entry resolved: its tables and what to do with them."""

    name: str
    base: RunSpec
    sweep: list[dict[str, Any]] | None = None
    search: SearchConfig | None = None
    replicas: int = 1
    plan: Any = None  # schedlab.study.planner.PlanConfig


def point_spec(study: StudySpec, point: dict[str, Any]) -> RunSpec:
    """The run of one point of a study: the base tables with the point's dotted keys set."""
    tables = study.base.tables
    for key, value in point.items():
        if key.split(".")[0] not in RUN_TABLES:
            raise ConfigError(f"{study.name}: cannot vary {key!r}; keys start with one of {', '.join(RUN_TABLES)}")
        tables = set_dotted(tables, key, value)
    label = point_label(point)
    return RunSpec(f"{study.name}[{label}]" if label else study.name, tables, study.base.seed,
                   study.base.engine, point)
