"""Dotted keys into an experiment's tables, ``--set`` assignments, and ``[[runs]]`` merging.

An experiment is a dict of top-level tables (``workload``, ``scheduler``, ...). A dotted key
such as ``scheduler.max_num_seqs`` names one value inside them. Every function here returns
new dicts and leaves its inputs alone, so one set of defaults can feed many runs.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import tomli

from ..errors import ConfigError

#: One part of a dotted key: a TOML bare key (a run that ``--set runs.<name>...`` can name too).
BARE_PART = re.compile(r"[A-Za-z0-9_-]+")
_STRUCTURED_START = ('"', "'", "[", "{")
_MISSING = object()


def split_key(key: str, *, where: str = "") -> tuple[str, ...]:
    """The parts of a dotted key; each must be a TOML bare key (letters, digits, ``_``, ``-``).

    :raises ConfigError: the key is not text, or a part is empty or has other characters.
    """
    prefix = f"{where}: " if where else ""
    if not isinstance(key, str):
        raise ConfigError(f"{prefix}keys must be text, got {key!r}")
    parts = tuple(key.split("."))
    for part in parts:
        if not BARE_PART.fullmatch(part):
            raise ConfigError(
                f"{prefix}bad key {key!r}: each part of a dotted key must be letters, digits, "
                f"'_' or '-' (e.g. scheduler.max_num_seqs)"
            )
    return parts


def run_key_part(name: str) -> str:
    """``name`` as the NAME of ``--set runs.NAME.table.key``: bare when it can be, else a TOML
    basic string (``runs."long run".scheduler.max_num_seqs``)."""
    if BARE_PART.fullmatch(name):
        return name
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else "\\" + c if c in '"\\' else c
                      for c in name)
    return f'"{escaped}"'


_QUOTED_PART = re.compile(r"""("(?:[^"\\]|\\.)*"|'[^']*')(\.|$)""")


def split_run_key(key: str, names) -> tuple[str, str]:
    """``runs.NAME.rest`` -> ``(NAME, rest)``. NAME is a TOML quoted string (``runs."a b".x``),
    else the longest of ``names`` (the runs' names) that the key continues with a dot, else its
    next dot-separated part (which names no run: the caller says so).

    :raises ConfigError: a quoted NAME that is not a valid TOML string, or no ``.rest`` after it.
    """
    after = key[len("runs."):]
    if after[:1] in ("'", '"'):
        match = _QUOTED_PART.match(after)
        try:
            name = tomli.loads(f"v = {match[1]}")["v"] if match else None
        except tomli.TOMLDecodeError:
            name = None
        if name is None or not match[2]:
            raise ConfigError(f"--set {key}: write runs.\"run name\".<table>.<key> (the name a TOML string)")
        return name, after[match.end():]
    for name in sorted(names, key=len, reverse=True):
        if after.startswith(name + "."):
            return name, after[len(name) + 1:]
    name, _, rest = after.partition(".")
    return name, rest


#: The tables whose keys are themselves dotted keys (a grid's axes): ``--set sweep.workload.rate=[5, 10]``
#: (or ``sweep."workload.rate"=[5, 10]``) sets the axis ``"workload.rate"``, never a nested table.
AXIS_TABLES = ("sweep", "plan.space")


def axis_of(key: str) -> tuple[str, str] | None:
    """``sweep.workload.rate`` -> ``("sweep", "workload.rate")``, ``plan.space.x.y`` ->
    ``("plan.space", "x.y")``; None for a key that names no axis of a grid."""
    for table in AXIS_TABLES:
        if key.startswith(table + ".") and len(key) > len(table) + 1:
            return table, key[len(table) + 1:]
    return None


def check_key(key: str, *, where: str = "") -> str:
    """``key`` checked as :func:`split_key` does, with the axis of a grid (:func:`axis_of`)
    allowed in quotes as TOML writes it (``sweep."workload.rate"``); returns the key with the
    quotes taken off (``sweep.workload.rate``).

    :raises ConfigError: as :func:`split_key`, or a quoted axis that is not one TOML string.
    """
    found = axis_of(key) if isinstance(key, str) else None
    if found is None:
        split_key(key, where=where)
        return key
    table, axis = found
    if axis[:1] in ('"', "'"):
        try:
            unquoted = tomli.loads(f"v = {axis}")["v"]
        except tomli.TOMLDecodeError:
            unquoted = None
        if not isinstance(unquoted, str):
            prefix = f"{where}: " if where else ""
            raise ConfigError(f"{prefix}bad key {key!r}: write {table}.\"dotted.key\" (one TOML string) or "
                              f"{table}.dotted.key")
        axis = unquoted
    split_key(f"{table}.{axis}", where=where)
    return f"{table}.{axis}"


def set_axis(grid: Any, axis: str, value: Any) -> dict:
    """A copy of a grid's table (``[sweep]``, ``[plan.space]``) with the values of ``axis`` set:
    where the table has it (as a quoted key, or nested the way TOML reads an unquoted one), else
    as a new quoted key at the end, so the axis is never given twice.

    :raises ConfigError: the grid is not a table.
    """
    if not isinstance(grid, dict):
        raise ConfigError(f"cannot set the values of {axis!r}: the grid is {grid!r}, not a table")
    result = copy.deepcopy(grid)
    if axis not in result:  # TOML reads an unquoted dotted key as nested tables: set it there if it is
        node, parts = result, axis.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                break
            node = node[part]
        else:
            if parts[-1] in node:
                node[parts[-1]] = value
                return result
    result[axis] = value
    return result


def _parse_value(raw: str, where: str) -> Any:
    if raw == "":
        raise ConfigError(f'{where}: no value after "="; write "" for empty text')
    if "\n" in raw or "\r" in raw:
        raise ConfigError(f"{where}: the value must be on one line")
    try:
        return tomli.loads(f"v = {raw}")["v"]
    except RecursionError:
        raise ConfigError(f"{where}: arrays or inline tables nested too deeply") from None
    except tomli.TOMLDecodeError as exc:
        if raw.startswith(_STRUCTURED_START):
            raise ConfigError(f"{where}: {raw!r} is not a valid TOML value ({exc})") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (Python's limit)
        raise ConfigError(f"{where}: {exc}") from None
    try:
        float(raw)
    except ValueError:
        return raw  # a bare word such as other.json or fcfs: plain text
    raise ConfigError(
        f"{where}: {raw!r} looks like a number but is not one in TOML "
        f"(write e.g. 0.5 rather than .5, 5.0 rather than 5.); quote it for text"
    )


def parse_assignment(text: str, *, where: str = "--set") -> tuple[str, Any]:
    """Parse ``dotted.key=value`` into ``(key, value)``.

    The value uses TOML value syntax: ``5``, ``0.5``, ``"text"``, ``true``, ``[1, 2]``,
    ``{a = 1}`` (so TOML dates become dates too). A bare word that is not valid TOML is
    taken as text, so ``workload.path=other.json`` needs no quotes. Input that starts like a
    string, list or table but does not parse, and number-like words TOML rejects (``.5``,
    ``007``), are errors rather than text, so a typo is not silently turned into a string.

    :param where: how to name the source in messages.
    :raises ConfigError: the text has no ``=``, a bad key or a bad value; the message quotes it.
    """
    shown = text if len(text) <= 200 else text[:200] + "..."  # (a whole file pasted in stays readable)
    context = f"{where} {shown!r}"
    key_text, sep, value_text = text.partition("=")
    if not sep:
        raise ConfigError(f"{context}: expected dotted.key=value, e.g. workload.rate=10")
    key = key_text.strip()
    if not key.startswith("runs.") or key == "runs.":  # a run's name is checked against the runs'
        key = check_key(key, where=context)
    return key, _parse_value(value_text.strip(), context)


def get_dotted(tables: dict, key: str, default: Any = _MISSING) -> Any:
    """The value at dotted ``key`` in ``tables``.

    :param default: returned when the key is absent; without it an absent key is an error.
    :raises ConfigError: the key is absent (listing the keys that exist where it stopped), or
        an intermediate part is not a table.
    """
    parts = split_key(key)
    node: Any = tables
    for i, part in enumerate(parts):
        here = ".".join(parts[:i])
        if not isinstance(node, dict):
            raise ConfigError(f"cannot read {key!r}: {here!r} is {node!r}, not a table")
        if part not in node:
            if default is not _MISSING:
                return default
            inside = f" in {here!r}" if here else ""
            known = ", ".join(sorted(map(str, node))) or "(none)"
            raise ConfigError(f"no key {key!r}: {part!r} is not{inside}; keys there: {known}")
        node = node[part]
    return node


def set_dotted(tables: dict, key: str, value: Any) -> dict:
    """A deep copy of ``tables`` with dotted ``key`` set to ``value``.

    Missing intermediate tables are created. The input is not changed and the result shares
    no tables or lists with it (``value`` itself is stored as given).

    :raises ConfigError: an intermediate part exists but is not a table; names the key.
    """
    parts = split_key(key)
    result = copy.deepcopy(tables)
    node = result
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            here = ".".join(parts[: i + 1])
            raise ConfigError(f"cannot set {key!r}: {here!r} is {child!r}, not a table")
        node = child
    node[parts[-1]] = value
    return result


def merge_tables(base: dict, override: dict, *, where: str = "") -> dict:
    """Merge a ``[[runs]]`` entry (``override``) over the top-level defaults (``base``).

    Rule, for every table (top-level ones and nested ones alike):

    * if both sides name a ``kind`` and the kinds differ, the override table REPLACES the
      base table entirely -- settings of one plugin kind mean nothing to another; so does a
      length distribution that names another ``dist`` and a ``[cluster]`` that names another
      ``mode`` (a colocated run of a disaggregated default);
    * otherwise (same kind, or either side names none) the keys merge recursively and the
      override wins for each key. A table without ``kind`` keeps the base's kind; a base
      table without ``kind`` uses the default kind, which the override may name or change,
      and its settings carry over (an unknown key is then reported by the plugin's config).

    Values that are not tables are simply replaced. Neither input is changed; the result
    shares no tables or lists with them.

    :param where: how to name the override in messages, e.g. ``"lab.toml: runs[2]"``.
    :raises ConfigError: a table would be replaced by a non-table value or the reverse.
    """
    return _merge(base, override, where, path=())


#: keys whose new value makes a table a new one, replacing the default's rather than merging
#: with it: a plugin's ``kind`` anywhere; a length distribution's ``dist`` (a lognormal's
#: ``median`` means nothing to a uniform); at the top, ``[cluster]``'s ``mode`` too (a colocated
#: run of a disaggregated default kept its [cluster.prefill] and [cluster.decode])
_REPLACING = {True: ("kind", "dist"), False: ("kind", "mode")}


def _merge(base: dict, override: dict, where: str, path: tuple[str, ...]) -> dict:
    result = copy.deepcopy(base)
    for key, new in override.items():
        old = result.get(key, _MISSING)
        if old is _MISSING:
            result[key] = copy.deepcopy(new)
            continue
        if isinstance(old, dict) != isinstance(new, dict):
            dotted = ".".join((*path, str(key)))
            prefix = f"{where}: " if where else ""
            what_old = "a table" if isinstance(old, dict) else f"the value {old!r}"
            what_new = "a table" if isinstance(new, dict) else f"the value {new!r}"
            raise ConfigError(f"{prefix}{dotted!r} is {what_old} in the defaults; it cannot be {what_new}")
        if not isinstance(new, dict):
            result[key] = copy.deepcopy(new)
        elif any(name in new and name in old and new[name] != old[name] for name in _REPLACING[bool(path)]):
            result[key] = copy.deepcopy(new)
        else:
            result[key] = _merge(old, new, where, (*path, str(key)))
    return result
