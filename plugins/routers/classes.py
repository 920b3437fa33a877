"""The ``class`` router: each request class served by its own instances.

Separating interactive requests from long batch-like generation is the surest way to
protect interactive tail latency (seed 000): a long generation holding KV and batch slots
slows every short request sharing its instance. Production stacks do this with per-class
pools behind one gateway (e.g. routing on a header or model name to separate deployments).

::

    [cluster]
    instances = 3
    router = {kind = "class", classes = {interactive = [0], batch = [1, 2]}}

Within its list a request goes to the least outstanding instance (ties: lowest index);
classes not listed go to ``default`` (all instances when empty). Indices are checked
against the cluster size when the run is assembled (``check_cluster``), or else when the
router is first used. The lists name instances by number, so the router needs a fixed cluster:
with an autoscaler, whose serving instances change (a draining one leaves the router's list,
which is renumbered), the run is refused when its file is read (``names_instances``).
"""

from __future__ import annotations

from typing import Sequence

import attrs

from schedlab.configs import FieldError, list_field, table_field
from schedlab.errors import ConfigError

from .balancing import least_outstanding

WHERE = "[cluster.router] kind = 'class'"


def _check_indices(name: str, label: str, indices) -> None:
    if not isinstance(indices, (list, tuple)) or not indices:
        raise FieldError(name, f"{label} must be a non-empty list of instance indices, got {indices!r}")
    seen = set()
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise FieldError(name, f"{label}: instance indices are whole numbers >= 0, got {i!r}")
        if i in seen:
            raise FieldError(name, f"{label} lists instance {i} twice")
        seen.add(i)


@attrs.frozen
class ClassRoutingConfig:
    classes: dict = table_field(attrs.Factory(dict),
                                help="request_class -> instance indices, e.g. {interactive = [0], batch = [1, 2]}")
    default: tuple = list_field((), item=int,
                                help="instances for classes not in `classes` (empty: all instances)")

    def __attrs_post_init__(self) -> None:
        for klass, indices in self.classes.items():
            _check_indices("classes", f"classes.{klass}", indices)
        if self.default:
            _check_indices("default", "default", self.default)


class ClassRouter:
    """Route by ``request.request_class`` to that class's instances, least outstanding first."""

    #: its settings name instances by number: not with an autoscaler (see the module docstring)
    names_instances = True

    def __init__(self, config: ClassRoutingConfig | None = None):
        self.config = config or ClassRoutingConfig()
        self._targets = {k: tuple(sorted(v)) for k, v in self.config.classes.items()}
        self._default = tuple(sorted(self.config.default)) or None
        self._checked_size: int | None = None

    #: what its indices number, for messages: a cluster's instances, or (set by the builder of a
    #: ``rank_router``) each data-parallel deployment's ranks
    members = ("instance", "the cluster has")

    def check_cluster(self, size: int) -> None:
        """Fail early when a listed instance index is not in a cluster of ``size`` (the message
        says neither the file nor the table: whoever calls this names them)."""
        unit, whose = self.members
        lists = [(f"classes.{k}", v) for k, v in self._targets.items()]
        if self._default is not None:
            lists.append(("default", self._default))
        for label, indices in lists:
            bad = [i for i in indices if i >= size]
            if bad:
                raise ConfigError(f"{label} lists {unit} {bad[0]}, but {whose} {_count(size, unit)} "
                                  f"(indices 0 to {size - 1})")
        self._checked_size = size

    def partitionable(self) -> bool:
        """Every class (and the default) has one instance: the choice ignores load."""
        return self._default is not None and all(len(v) == 1 for v in [*self._targets.values(), self._default])

    def __getattr__(self, name: str):
        if name == "partition" and self.partitionable():
            return self._only_instance
        raise AttributeError(name)

    def _only_instance(self, request, order: int, n: int) -> int:
        return self._targets.get(request.request_class, self._default)[0]

    def route(self, request, instances: Sequence) -> int:
        if self._checked_size != len(instances):
            if self._checked_size is not None:  # the list changed under it: an autoscaled pool
                raise ConfigError(f"{WHERE}: set up for a cluster of {_count(self._checked_size, 'instance')}, but given "
                                  f"{len(instances)} to choose from: its lists name instances by number, which "
                                  "needs a fixed cluster (not an autoscaled one)")
            try:
                self.check_cluster(len(instances))
            except ConfigError as exc:
                raise ConfigError(f"{WHERE}: {exc}") from None
        candidates = self._targets.get(request.request_class, self._default)
        return least_outstanding(instances, candidates)


def _count(n: int, unit: str) -> str:
    return f"1 {unit}" if n == 1 else f"{n} {unit}s"
