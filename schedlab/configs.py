"""Frozen attrs config classes for plugins, and their construction from TOML tables.

A plugin's settings are a ``@attrs.frozen`` class built with the field helpers below. Each
field is checked when the object is made, so a config that exists is a valid one.
:func:`from_table` is the one way TOML reaches a config: it rejects unknown keys and names the
file, the table and the key in every error.

Example::

    @attrs.frozen
    class MyConfig:
        max_num_seqs: int = int_field(256, min=1, help="most sequences running at once")
        policy: str = str_field("fcfs", choices=("fcfs", "priority"), help="queue order")
"""

from __future__ import annotations

import decimal
import difflib
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Iterable

import attrs

from .errors import ConfigError

# -- sane bounds ------------------------------------------------------------------------------
# Sizes far beyond anything real, so that a typo such as 10**30 is refused where it is read,
# with the key named, instead of overflowing an int64 array, allocating terabytes or spinning
# in a loop that cannot finish. Fields and the Request model take their bounds from here.

#: Every whole-number setting lies within +-2**53 unless its field says otherwise: the largest
#: range in which every integer is also an exact float (times and metrics are floats) and
#: which fits numpy's int64 columns.
MAX_INT = 2**53
#: Tokens in one request (prompt, output, max_tokens, a shared prefix) or one iteration's
#: budget: 100 million, ten times the longest context windows of 2025 (10M tokens).
MAX_TOKENS = 10**8
#: Tokens per KV block. Engines use 16-256 (hybrid attention/Mamba models up to ~1k); the
#: fast engine keeps per-block-phase counters and sums them once per decode run, so its
#: cost grows with the block size.
MAX_BLOCK_SIZE = 4096
#: Requests (and clients, prefix groups) one workload may generate: 10 million, ten times the
#: largest benchmark (1M requests take ~46 s and ~0.8 GB; 10M take ~8 GB).
MAX_REQUESTS = 10**7
#: Instances behind one router: the driver advances every instance at every arrival, so a
#: run costs about requests x instances steps, and each instance builds its own plugins.
#: 1,024 instances (thousands of GPUs with tensor parallelism) is a large cluster already.
MAX_INSTANCES = 1024
#: The simulated clock stops at 10**12 ms (about 31.7 years): arrivals must come before it
#: and iterations must end before it. Times are float64 ms; at 10**12 ms their resolution is
#: still 0.1 microseconds, while near 10**16 ms a whole millisecond is lost in rounding.
MAX_TIME_MS = 1e12
#: A memory size in GiB (a GPU's memory, swap space, a host-memory tier, the activation reserve):
#: 2**20 GiB (1 PiB), thousands of times the largest GPU (288 GB) or server (a few TiB), so that
#: its bytes stay exact whole numbers (< 2**53) instead of overflowing to infinity.
MAX_MEMORY_GIB = 2**20
#: GPUs one model is split over by tensor parallelism: one NVL72 rack holds 72; 1,024 (the
#: most instances and data-parallel ranks, too) is far beyond any deployment.
MAX_TENSOR_PARALLEL = 1024
#: The largest whole number a float holds (about 1.8e308); a longer integer (TOML and JSON allow
#: any number of digits) makes ``float()`` raise OverflowError.
MAX_FLOAT_INT = int(sys.float_info.max)


class FieldError(ValueError):
    """A field value is wrong; carries the field name so messages can point at the key."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def is_finite_number(value: Any) -> bool:
    """True for an int or a float (not a bool) that a float64 holds finitely: not NaN, not
    infinite, and not an integer of more than 308 digits (Python's ints hold those; ``float()``
    and ``math.isfinite()`` raise OverflowError on them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_FLOAT_INT
    return math.isfinite(value)


def not_regular_file(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as an input file -- ``"is a FIFO (named pipe), not a regular
    file"`` -- or None for a regular file and for a path that is not there (the open that follows
    says so). Input files are read whole, some more than once: a FIFO would block until a writer
    comes, a device such as /dev/zero never ends, and a folder cannot be read."""
    if "\0" in os.fsdecode(path):  # (open() would raise a bare ValueError: review s81 badinput, 3)
        return "holds a NUL byte (\\0), which no file name can"
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing or unreadable: open() says which
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    kind = next((text for test, text in kinds if test(mode)), "a special file")
    return f"is {kind}, not a regular file"


def _number_validator(kind: type, lo, hi, lo_exclusive: bool, optional: bool, allow_inf: bool = False):
    def check(_inst, attribute, value):
        if value is None and optional:
            return
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise FieldError(attribute.name, f"must be a whole number, got {_describe(value)}")
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FieldError(attribute.name, f"must be a number, got {_describe(value)}")
            if isinstance(value, float) and math.isnan(value):
                raise FieldError(attribute.name, "must be a number, got NaN")
            if isinstance(value, float) and math.isinf(value) and not allow_inf:
                raise FieldError(attribute.name, f"must be a finite number, got {value}")
        if lo is not None:
            if lo_exclusive and not value > lo:
                raise FieldError(attribute.name, f"must be > {bound_text(lo)}, got {bound_text(value)}")
            if not lo_exclusive and value < lo:
                raise FieldError(attribute.name, f"must be >= {bound_text(lo)}, got {bound_text(value)}")
        if hi is not None and value > hi:
            raise FieldError(attribute.name, f"must be <= {bound_text(hi)}, got {bound_text(value)}")
        if kind is float and isinstance(value, int):  # left an int by _to_float: too long for a float
            raise FieldError(attribute.name, f"must be a finite number (at most {sys.float_info.max:.3g}), "
                                             f"got {bound_text(value)}")

    return check


def bound_text(value) -> str:
    """Large whole numbers as powers of ten or two where exact (10**8, 2**53), others as written
    (beyond 10**15 in three digits: 1.23e+20, also for ints too long for a float)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**6:
        for base in (10, 2):
            power = round(math.log(abs(value), base))
            if base**power == abs(value):
                return f"{'-' if value < 0 else ''}{base}**{power}"
        if abs(value) <= 10**15:
            return str(value)
        return f"{value:.3g}" if abs(value) <= MAX_FLOAT_INT else f"{decimal.Decimal(value):.3g}"
    return str(value)


def value_text(value: Any) -> str:
    """``repr(value)`` for a message; an int too long for a float as :func:`bound_text` writes it
    (``10**400``, ``1.23e+400``) rather than in all its digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_FLOAT_INT:
        return bound_text(value)
    return repr(value)


def _to_float(value):
    """TOML integers as floats; one too long for a float (309+ digits) stays an int, which the
    validator refuses with the key named (``float()`` would raise OverflowError)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_FLOAT_INT:
        return float(value)
    return value


def int_field(default=attrs.NOTHING, *, min=None, max=None, optional=False, help: str = ""):
    """A whole-number setting, bounded by ``min``/``max`` (inclusive; +-:data:`MAX_INT` when not given)."""
    return attrs.field(
        default=default,
        validator=_number_validator(int, -MAX_INT if min is None else min, MAX_INT if max is None else max,
                                    False, optional),
        metadata={"help": help},
    )


def float_field(default=attrs.NOTHING, *, min=None, max=None, min_exclusive=False, optional=False,
                allow_inf: bool = False, help: str = ""):
    """A real-number setting; TOML integers are accepted and turned into floats.

    Infinity (TOML ``inf``) is refused unless ``allow_inf`` (e.g. an SLO target meaning "none").
    """
    return attrs.field(
        default=default,
        converter=_to_float,
        validator=_number_validator(float, min, max, min_exclusive, optional, allow_inf),
        metadata={"help": help},
    )


def bool_field(default=attrs.NOTHING, *, help: str = ""):
    """A true/false setting (TOML ``true``/``false`` only, not 0/1)."""

    def check(_inst, attribute, value):
        if not isinstance(value, bool):
            raise FieldError(attribute.name, f"must be true or false, got {_describe(value)}")

    return attrs.field(default=default, validator=check, metadata={"help": help})


def str_field(default=attrs.NOTHING, *, choices: Iterable[str] | None = None, optional=False, help: str = ""):
    """A text setting, optionally restricted to ``choices``."""
    allowed = tuple(choices) if choices is not None else None

    def check(_inst, attribute, value):
        if value is None and optional:
            return
        if not isinstance(value, str):
            raise FieldError(attribute.name, f"must be text, got {_describe(value)}")
        if allowed is not None and value not in allowed:
            raise FieldError(attribute.name, f"must be one of {', '.join(map(repr, allowed))}; got {value!r}")

    metadata = {"help": help, "choices": allowed} if allowed is not None else {"help": help}
    return attrs.field(default=default, validator=check, metadata=metadata)


def _check_metric(attribute, value) -> None:
    from .results.metric_names import check_metric_name  # not at import: metric_names imports metrics (numpy)

    try:
        check_metric_name(value)
    except ConfigError as exc:
        raise FieldError(attribute.name, str(exc)) from None


def metric_field(default=attrs.NOTHING, *, optional=False, help: str = ""):
    """A dotted metric name such as ``ttft_ms.p99``, checked against the metrics a run has
    (:data:`schedlab.results.metric_names.METRICS`), so a misspelt one fails when the file is loaded."""

    def check(_inst, attribute, value):
        if value is None and optional:
            return
        _check_metric(attribute, value)

    return attrs.field(default=default, validator=check, metadata={"help": help})


def metric_list_field(default=attrs.NOTHING, *, help: str = ""):
    """A list of dotted metric names (see :func:`metric_field`), stored as a tuple."""

    def check(_inst, attribute, value):
        if not isinstance(value, tuple):
            raise FieldError(attribute.name, f"must be a list of metric names, got {_describe(value)}")
        for name in value:
            _check_metric(attribute, name)

    return attrs.field(default=default, converter=lambda v: tuple(v) if isinstance(v, list) else v,
                       validator=check, metadata={"help": help})


def path_field(default=attrs.NOTHING, *, optional=False, help: str = ""):
    """A file path; relative paths are resolved against the experiment file's folder."""

    def check(_inst, attribute, value):
        if value is None and optional:
            return
        if not isinstance(value, (str, os.PathLike)):
            raise FieldError(attribute.name, f"must be a path, got {_describe(value)}")
        if not str(value).strip():
            raise FieldError(attribute.name, "must be a path, got an empty string"
                                             + ("; leave the key out for none" if optional else ""))

    return attrs.field(default=default, validator=check, metadata={"help": help, "path": True})


def list_field(default=attrs.NOTHING, *, item: type | tuple = object, help: str = ""):
    """A list setting (stored as a tuple so the config stays immutable)."""

    def convert(value):
        return tuple(value) if isinstance(value, list) else value

    def check(_inst, attribute, value):
        if not isinstance(value, tuple):
            raise FieldError(attribute.name, f"must be a list, got {_describe(value)}")
        for element in value:
            if not isinstance(element, item) or isinstance(element, bool) and item in (int, float):
                raise FieldError(attribute.name, f"every element must be {item}, got {_describe(element)}")

    return attrs.field(default=default, converter=convert, validator=check, metadata={"help": help})


def table_field(default=attrs.NOTHING, *, help: str = ""):
    """A nested table kept as a plain mapping (validated by whoever uses it)."""

    def check(_inst, attribute, value):
        if value is not None and not isinstance(value, dict):
            raise FieldError(attribute.name, f"must be a table, got {_describe(value)}")

    return attrs.field(default=default, validator=check, metadata={"help": help, "table": True})


def _resolve_nested_paths(value, base_dir):
    """In nested tables, ``path`` keys hold file paths: resolve them like top-level path fields."""
    if isinstance(value, dict):
        return {k: (str(Path(base_dir, os.path.expanduser(v))) if k == "path" and isinstance(v, str) and v.strip()
                    else _resolve_nested_paths(v, base_dir)) for k, v in value.items()}
    return value


def field_help(cls) -> list[tuple[str, Any, str]]:
    """``(name, default, help)`` for every field of a config class, for ``schedlab plugins``.

    A default made by a factory (``attrs.Factory(dict)``) is shown as the value it makes; a text
    setting's choices open its help (``one of "fcfs", "priority": ...``)."""
    rows = []
    for a in attrs.fields(cls):
        default = a.default
        if default is attrs.NOTHING:
            default = "(required)"
        elif isinstance(default, attrs.Factory) and not default.takes_self:
            default = default.factory()
        text = a.metadata.get("help", "")
        choices = a.metadata.get("choices")
        if choices:
            text = f"one of {', '.join(toml_text(c) for c in choices)}: {text}" if text else \
                f"one of {', '.join(toml_text(c) for c in choices)}"
        rows.append((a.name, default, text))
    return rows


def toml_text(value: Any) -> str:
    """A value as it would be written in a TOML file (``"fcfs"``, ``true``, ``[1, 2]``,
    ``{kind = "round_robin"}``, ``inf``); ``None`` (not set) as ``(unset)``."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_text(v)}" for k, v in value.items()) + "}"
    return repr(value)


#: A serving engine's flag (as a TOML key) that schedlab keeps in another table, and where: named
#: instead of a did-you-mean when the key is not the table's (``--mem-fraction-static`` is not a
#: scheduler setting here, nor anything like ``retraction_policy``).
ELSEWHERE = {
    "mem_fraction_static": "[kv_cache] num_blocks, from the max_total_num_tokens SGLang logs at start-up (its "
                           "--mem-fraction-static is a share of the memory free before loading, about 0.83 by "
                           "default on an H100; [kv_cache] gpu_memory_utilization, the nearest setting, is "
                           "vLLM's share of the whole memory with a fixed reserve)",
    "gpu_memory_utilization": "[kv_cache] gpu_memory_utilization",
    "page_size": "[kv_cache] block_size, as SGLang's --page-size",
    "block_size": "[kv_cache] block_size",
    "enable_prefix_caching": "[kv_cache] prefix_caching = true (kind = \"paged\"), or SGLang's kind = \"radix\"",
    "prefix_caching": "[kv_cache] prefix_caching = true (kind = \"paged\"), or SGLang's kind = \"radix\"",
    "num_gpu_blocks_override": "[kv_cache] num_blocks",
    "max_total_tokens": "[kv_cache] num_blocks x block_size, the pool in tokens as SGLang's --max-total-tokens",
    "swap_space": "[kv_cache] swap_space_gib",
    "tensor_parallel_size": "tensor_parallel, in [cost_model] and [kv_cache] alike",
    "tp_size": "tensor_parallel, in [cost_model] and [kv_cache] alike",
    "tensor_parallel": "tensor_parallel, in [cost_model] and [kv_cache] alike",
    "data_parallel_size": "[cluster] data_parallel",
    "dp_size": "[cluster] data_parallel with SGLang's --enable-dp-attention; without it SGLang's --dp N is N "
               "independent replicas: [cluster] instances = N with router = {kind = \"round_robin\"}",
    "enable_dp_attention": "[cluster] data_parallel, whose ranks step together as SGLang's DP attention does; "
                           "with the sglang scheduler each rank then runs with SGLang's changes (chunked_prefill_size "
                           "and a max_running_requests set divided by data_parallel, schedule_conservativeness x 0.3) "
                           "and the ranks are picked round robin, as SGLang's are",
    "pipeline_parallel_size": "[cluster] pipeline_parallel",
    "enable_expert_parallel": "[cluster] expert_parallel",
    "speculative_config": "[speculative]",
    "num_speculative_tokens": "[speculative]",
}


def from_table(cls, table: dict, *, where: str, base_dir: str | os.PathLike | None = None):
    """Build ``cls`` from a TOML table, with errors that name where the table came from.

    :param cls: a frozen attrs config class.
    :param table: the table's keys and values (without ``kind``).
    :param where: how to name the table in messages, e.g. ``"lab.toml: [scheduler]"``.
    :param base_dir: folder that relative path fields are resolved against.
    :raises ConfigError: for an unknown key, a missing required key or a bad value.
    """
    fields = {a.name: a for a in attrs.fields(cls)}
    for key in table:
        if key not in fields:
            hint = difflib.get_close_matches(key, list(fields), n=1)
            also = f" (did you mean {hint[0]!r}?)" if hint else ""
            if key == "tensor_parallel" and re.search(r"(cost_model|kv_cache)\]", where):
                also = (" (this kind has none: a cost model of GPUs -- roofline, profiled -- and a KV cache "
                        "sized from a model and GPU take it)")
            elif key in ELSEWHERE:
                also = f" (set it as {ELSEWHERE[key]})"
            valid = ", ".join(sorted(fields)) or "none"
            raise ConfigError(f"{where}: unknown key {key!r}{also}; valid keys: {valid}")
    missing = [n for n, a in fields.items() if a.default is attrs.NOTHING and n not in table]
    if missing:
        raise ConfigError(f"{where}: missing required key {missing[0]!r}")
    values = dict(table)
    if base_dir is not None:
        for name, a in fields.items():
            value = values.get(name)
            if a.metadata.get("path") and name not in values and isinstance(a.default, str):
                value = a.default   # a plugin's default file, like one written in the table: beside the experiment
            if a.metadata.get("path") and isinstance(value, str) and value.strip():
                values[name] = str(Path(base_dir, os.path.expanduser(value)))
            elif a.metadata.get("table") and isinstance(value, dict):
                values[name] = _resolve_nested_paths(value, base_dir)
    try:
        return cls(**values)
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc.name}: {exc.message}") from None
    except ConfigError as exc:  # a check across settings (the config's __attrs_post_init__)
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
