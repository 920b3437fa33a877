"""The ``mix`` workload: several request classes, each its own workload, merged by arrival time.

::

    [workload]
    kind = "mix"

    [workload.classes.interactive]
    kind = "synthetic"
    num_requests = 500
    prompt = {dist = "fixed", value = 256}
    output = {dist = "fixed", value = 64}
    rate = 5
    priority = 0                    # override for this class's requests

    [workload.classes.batch]
    kind = "azure"
    path = "traces/azure_code.csv"
    priority = 1

Each sub-table is an ordinary workload table plus optional ``request_class`` (default: the
sub-table's name), ``client`` and ``priority``, which are set on every request of the class.

Design. The mix builds its classes through the workload registry, so any open-loop workload
works inside it -- built-in or from a plugin. The registration hook hands the registry to the
factory (``make_mix_workload(config, lookup=...)``); the config itself holds the raw
sub-tables. Sub-tables of built-in kinds are fully checked when the config is made (their
config classes are imported here); other kinds are checked when the workload is built, once
every plugin has registered. Without a registry the built-in kinds alone are available.
Closed-loop workloads cannot be mixed (their requests depend on completions).

Merging. Requests are ordered by arrival time, ties broken by class name and then by the
id within the class; ids are then renumbered 0..N-1. Each class gets its own seed,
``seed + zlib.crc32(name)``, so adding a class does not change the others' draws. A
``prefix_group`` becomes ``(class name, group)``, and each of a request's ``block_hashes``
``(class name, id)``: two classes that happen to use the same group number or hash id -- every
Mooncake trace numbers its ids from 0, and so do the ids made from a measured run's prompts --
do not share a prefix (nor a prefix-affinity router's key). Requests of one class share as they
did alone.
"""

from __future__ import annotations

import heapq
import zlib
from typing import Any, Callable, Iterator

import attrs

from schedlab.configs import FieldError, from_table, table_field
from schedlab.errors import ConfigError, WorkloadError
from schedlab.model import Request

from .columns import check_seed
from .request_file import FileConfig, make_file_workload
from .synthetic import SharedPrefixConfig, SyntheticConfig, make_shared_prefix_workload, make_synthetic_workload
from .traces import (
    AzureConfig,
    MooncakeConfig,
    VidurConfig,
    make_azure_workload,
    make_mooncake_workload,
    make_vidur_workload,
)

CLASS_OVERRIDES = ("request_class", "client", "priority")
CLOSED_LOOP_KINDS = ("closed_loop",)

#: kind -> (factory, config class) -> what a lookup returns.
Lookup = Callable[[str], tuple[Callable[..., Any], type | None]]


def _check_overrides(name: str, table: dict) -> None:
    for key in ("request_class", "client"):
        if key in table and (not isinstance(table[key], str) or not table[key]):
            raise FieldError("classes", f"{name}: {key} must be non-empty text, got {table[key]!r}")
    if "priority" in table:
        value = table["priority"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError("classes", f"{name}: priority must be a whole number, got {value!r}")


def split_class_table(name: str, table: Any) -> tuple[str, dict, dict]:
    """``(kind, workload keys, overrides)`` of one sub-table; FieldError if malformed."""
    if not isinstance(table, dict):
        raise FieldError("classes", f"{name}: must be a workload table, got {table!r}")
    kind = table.get("kind")
    if not isinstance(kind, str) or not kind:
        raise FieldError("classes", f"{name}: needs kind = \"<workload>\" (e.g. \"synthetic\")")
    if kind in CLOSED_LOOP_KINDS:
        raise FieldError("classes", f"{name}: a closed-loop workload ({kind!r}) cannot be part of a mix")
    _check_overrides(name, table)
    keys = {k: v for k, v in table.items() if k != "kind" and k not in CLASS_OVERRIDES}
    overrides = {k: table[k] for k in CLASS_OVERRIDES if k in table}
    return kind, keys, overrides


@attrs.frozen
class MixConfig:
    classes: dict = table_field(help="class name -> workload table (kind = ..., its keys, and optional "
                                     "request_class, client, priority applied to its requests)")

    def __attrs_post_init__(self) -> None:
        if not self.classes:
            raise FieldError("classes", "needs at least one class, e.g. [workload.classes.interactive]")
        for name, table in self.classes.items():
            kind, keys, _ = split_class_table(name, table)
            builtin = BUILTIN_OPEN_LOOP.get(kind)
            if builtin is not None and builtin[1] is not None:
                try:
                    from_table(builtin[1], keys, where=name)
                except ConfigError as exc:
                    raise FieldError("classes", str(exc)) from None


def builtin_lookup(kind: str) -> tuple[Callable[..., Any], type | None]:
    """Factory and config class of a built-in open-loop workload."""
    try:
        return BUILTIN_OPEN_LOOP[kind]
    except KeyError:
        known = ", ".join(sorted(BUILTIN_OPEN_LOOP))
        raise ConfigError(f"unknown workload {kind!r} in a mix; built-in kinds: {known}") from None


def registry_lookup(registry) -> Lookup:
    """A lookup over a workload :class:`~schedlab.registry.Registry` (built-ins and plugins)."""

    def lookup(kind: str):
        entry = registry.get(kind)
        return entry.factory, entry.config

    return lookup


def class_seed(seed: int, name: str) -> int:
    """The seed of class ``name``: ``seed + crc32(name)`` (stable across runs and processes)."""
    return seed + zlib.crc32(name.encode("utf-8"))


def make_mix_workload(config: MixConfig, *, lookup: Lookup = builtin_lookup) -> "MixWorkload":
    parts = []
    for name in sorted(config.classes):
        kind, keys, overrides = split_class_table(name, config.classes[name])
        where = f"[workload.classes.{name}]"
        try:
            factory, config_cls = lookup(kind)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if config_cls is None:
            if keys:
                raise ConfigError(f"{where}: workload {kind!r} takes no settings, got {', '.join(keys)}")
            workload = factory()
        else:
            workload = factory(from_table(config_cls, keys, where=where))
        if getattr(workload, "closed_loop", False):
            raise ConfigError(f"{where}: {_closed_loop_reason(kind, keys)} and cannot be part of a mix")
        overrides.setdefault("request_class", name)
        parts.append(_MixClass(name, workload, overrides))
    return MixWorkload(parts)


def _closed_loop_reason(kind: str, keys: dict) -> str:
    """What makes a class's workload closed-loop: the setting that does, else its kind."""
    settings = []
    if keys.get("max_concurrency") is not None:
        settings.append(f"max_concurrency = {keys['max_concurrency']!r} makes it closed-loop (a request waits for "
                        "one of its slots to free)")
    if keys.get("stage_start") == "after_drain":
        settings.append("stage_start = 'after_drain' makes it closed-loop (a stage waits for the previous one's "
                        "requests to finish)")
    if settings:
        return "; ".join(settings) + " -- leave it out to mix the class open loop"
    return f"{kind!r} is closed-loop here (its requests depend on completions)"


@attrs.frozen
class _MixClass:
    name: str
    workload: Any
    overrides: dict


class MixWorkload:
    """Requests of several open-loop workloads, merged by arrival time (see the module docstring)."""

    closed_loop = False

    def __init__(self, classes: list[_MixClass]):
        self.classes = sorted(classes, key=lambda c: c.name)
        sizes = [getattr(c.workload, "num_requests", None) for c in self.classes]
        self.num_requests = None if None in sizes else sum(sizes)

    def requests(self, seed: int) -> Iterator[Request]:
        seed = check_seed(seed)
        streams = [_keyed(c, c.workload.requests(class_seed(seed, c.name))) for c in self.classes]
        return _renumber(heapq.merge(*streams), {c.name: c.overrides for c in self.classes})

    def __repr__(self) -> str:
        return f"<mix workload: {', '.join(c.name for c in self.classes)}>"


def _keyed(part: _MixClass, requests) -> Iterator[tuple[float, str, int, Request]]:
    last = 0.0
    for request in requests:
        if request.arrival_ms < last:
            raise WorkloadError(f"mix class {part.name!r}: its workload yielded request {request.id} "
                                f"out of arrival order ({request.arrival_ms} after {last})")
        last = request.arrival_ms
        yield request.arrival_ms, part.name, request.id, request


def _renumber(merged, overrides: dict[str, dict]) -> Iterator[Request]:
    for new_id, (_, name, _, request) in enumerate(merged):
        group, hashes = request.prefix_group, request.block_hashes
        yield attrs.evolve(request, id=new_id, **overrides[name],
                           prefix_group=None if group is None else (name, group),
                           block_hashes=None if hashes is None else tuple((name, h) for h in hashes))


BUILTIN_OPEN_LOOP: dict[str, tuple[Callable[..., Any], type | None]] = {
    "file": (make_file_workload, FileConfig),
    "synthetic": (make_synthetic_workload, SyntheticConfig),
    "shared_prefix": (make_shared_prefix_workload, SharedPrefixConfig),
    "azure": (make_azure_workload, AzureConfig),
    "vidur": (make_vidur_workload, VidurConfig),
    "mooncake": (make_mooncake_workload, MooncakeConfig),
    "mix": (make_mix_workload, MixConfig),
}
