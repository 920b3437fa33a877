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

import difflib
import math
import os
from pathlib import Path
from typing import Any, Iterable

import attrs

from .errors import ConfigError

_NO_LIMIT = None


class FieldError(ValueError):
    """A field value is wrong; carries the field name so messages can point at the key."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _number_validator(kind: type, lo, hi, lo_exclusive: bool, optional: bool):
    def check(_inst, attribute, value):
        if value is None and optional:
            return
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise FieldError(attribute.name, f"must be a whole number, got {_describe(value)}")
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FieldError(attribute.name, f"must be a number, got {_describe(value)}")
            if math.isnan(value):
                raise FieldError(attribute.name, "must be a number, got NaN")
        if lo is not None:
            if lo_exclusive and not value > lo:
                raise FieldError(attribute.name, f"must be > {lo}, got {value}")
            if not lo_exclusive and value < lo:
                raise FieldError(attribute.name, f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise FieldError(attribute.name, f"must be <= {hi}, got {value}")

    return check


def _to_float(value):
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def int_field(default=attrs.NOTHING, *, min=None, max=None, optional=False, help: str = ""):
    """A whole-number setting, optionally bounded (``min``/``max`` inclusive)."""
    return attrs.field(
        default=default,
        validator=_number_validator(int, min, max, False, optional),
        metadata={"help": help},
    )


def float_field(default=attrs.NOTHING, *, min=None, max=None, min_exclusive=False, optional=False, help: str = ""):
    """A real-number setting; TOML integers are accepted and turned into floats."""
    return attrs.field(
        default=default,
        converter=_to_float,
        validator=_number_validator(float, min, max, min_exclusive, optional),
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

    return attrs.field(default=default, validator=check, metadata={"help": help})


def path_field(default=attrs.NOTHING, *, optional=False, help: str = ""):
    """A file path; relative paths are resolved against the experiment file's folder."""

    def check(_inst, attribute, value):
        if value is None and optional:
            return
        if not isinstance(value, (str, os.PathLike)):
            raise FieldError(attribute.name, f"must be a path, got {_describe(value)}")

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
        return {k: (str(Path(base_dir, os.path.expanduser(v))) if k == "path" and isinstance(v, str)
                    else _resolve_nested_paths(v, base_dir)) for k, v in value.items()}
    return value


def field_help(cls) -> list[tuple[str, Any, str]]:
    """``(name, default, help)`` for every field of a config class, for ``schedlab plugins``."""
    rows = []
    for a in attrs.fields(cls):
        default = "(required)" if a.default is attrs.NOTHING else a.default
        rows.append((a.name, default, a.metadata.get("help", "")))
    return rows


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
            valid = ", ".join(sorted(fields)) or "none"
            raise ConfigError(f"{where}: unknown key {key!r}{also}; valid keys: {valid}")
    missing = [n for n, a in fields.items() if a.default is attrs.NOTHING and n not in table]
    if missing:
        raise ConfigError(f"{where}: missing required key {missing[0]!r}")
    values = dict(table)
    if base_dir is not None:
        for name, a in fields.items():
            value = values.get(name)
            if a.metadata.get("path") and isinstance(value, str):
                values[name] = str(Path(base_dir, os.path.expanduser(value)))
            elif a.metadata.get("table") and isinstance(value, dict):
                values[name] = _resolve_nested_paths(value, base_dir)
    try:
        return cls(**values)
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc.name}: {exc.message}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
