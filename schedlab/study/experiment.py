"""TOML experiments: defaults, runs, sweeps and SLO-first searches.

File layout::

    [experiment]            # name, seed, plugins = [...], reports = [...], engine
    [workload]              # defaults for every run: kind = "..." plus the plugin's keys
    [scheduler] [cost_model] [kv_cache] [cluster] [slo] [speculative]
    [power] [clock]         # energy: a power model (kind = "..."), the GPUs' SM clock
    [frontend] [client]     # the API server's path and the clients' patience
    [target]                # path = a summary of the real run: the run is compared with it
    [models.<name>] [gpus.<name>]   # your own presets
    [sweep]                 # "dotted.key" = [values]  -- a grid, applied to every run
    [search]                # key, low, high, constraint (or constraints), maximize, warmup, cooldown: every run
    [plan]                  # capacity planning: GPUs with prices, a space, constraints
    [[runs]]                # name = "...", then tables that override the defaults,
                            # and optionally its own sweep, search or plan, and replicas
    [reports.<name>]        # settings of a report plugin

A run's table replaces the default table when it names another ``kind`` (a ``[cluster]``
another ``mode``), and merges key by key otherwise. ``--set dotted.key=value`` then applies to every run, and
``--set runs.<run name>.<table>.<key>=value`` to the named ``[[runs]]`` entry only (after the
others). ``--set search.high=64`` (``sweep``, ``plan`` alike; a whole table: ``--set 'sweep={...}'``)
changes every such table of the file, the top-level one and the runs' own, and
``--set runs.<run name>.search.high=64`` the one that run uses; a grid's key is one dotted key
(``--set sweep.workload.rate=[5, 10]``). Relative paths resolve against the experiment file's
folder. Every error names the file, the table and the key; when the value came from ``--set``,
the message quotes it, and for a ``--set`` that sets a key for every run, names the runs whose
table takes it, to set it there alone.
"""

from __future__ import annotations

import ast
import copy
import difflib
import functools
import os
import re
import shlex
from pathlib import Path
from typing import Any, Callable

import attrs
import tomli

from ..capacity import GpuSpec, ModelSpec, Presets
from ..catalog import Catalog, load_catalog
from ..configs import MAX_INT, FieldError, bool_field, from_table, int_field, list_field, not_regular_file, str_field
from ..errors import ConfigError, WorkloadError
from ..hf_config import spec_table
from ..results.records import ExperimentResults, RunResult
from ..results.stream import ROW_FORMATS, RecordSettings
from .executor import InProcessExecutor
from .overrides import (axis_of, check_key, get_dotted, merge_tables, parse_assignment, run_key_part, set_axis,
                        set_dotted, split_run_key)
from .planner import PlanConfig, validate as validate_plan
from .replicas import replica_name
from .runner import run_studies
from .simulation import DEFAULT_TABLES, ENGINES, Context, RunSpec, assemble, component_config
from .spec import RUN_TABLES, SearchConfig, StudySpec, check_slo, point_spec
from .sweep import expand_sweep, point_label

TOP_LEVEL = ("experiment", "workload", "scheduler", "cost_model", "kv_cache", "cluster", "slo", "speculative",
             "power", "clock", "frontend", "client", "target", "models", "gpus", "sweep", "search", "plan", "runs",
             "reports",
             "hunt")  # hunt: schedlab hunt
#: What a run does with its tables: at most one of them, its own or the file's top-level one.
STUDY_TABLES = ("sweep", "search", "plan")
RUN_KEYS = RUN_TABLES + ("name", *STUDY_TABLES, "seed", "engine", "replicas")
DEFAULT_REPORTS = ("table", "json", "plots")
#: The most replicas a run may ask for: each is a whole simulation (95% intervals need a few dozen).
MAX_REPLICAS = 10_000
#: The most simulations (sweep points x replicas, over every run) one experiment file runs.
MAX_SIMULATIONS = 100_000
# A [sweep] grid's points and a [plan]'s candidates: at most sweep.MAX_SWEEP_POINTS (10,000) each, checked
# when the file is read (the constant lives in .sweep, which the planner shares).
MAX_NAME_BYTES = 200  # file systems allow 255; the results folder's temporary sibling adds a suffix


@attrs.frozen
class ExperimentConfig:
    name: str = str_field("", help="experiment name (default: the file name)")
    description: str = str_field("", help="one line shown in reports")
    seed: int = int_field(0, min=0, help="seed for every random draw; same seed, same results")
    plugins: tuple = list_field((), item=str, help="importable modules with extra plugins")
    reports: tuple = list_field(DEFAULT_REPORTS, item=str, help="report plugins to run, in order")
    engine: str = str_field("fast", choices=ENGINES, help="'fast' (bulk decode runs) or 'reference' (step by step)")
    timeline: bool = bool_field(True, help="record running/waiting/KV over time for timeline plots")
    replicas: int = int_field(1, min=1, max=MAX_REPLICAS,
                              help="repeat every run with this many derived seeds: means and 95% intervals")
    exact_requests: int = int_field(RecordSettings().exact_requests, min=0,
                                    help="runs with up to this many requests keep every row and compute exact metrics; "
                                         "larger runs stream rows to a file and take percentiles from DDSketches "
                                         "(1% relative error)")
    request_rows: str = str_field("parquet", choices=ROW_FORMATS,
                                  help="the file format a large run streams its per-request rows to: 'parquet' or "
                                       "'csv'")
    timeline_points: int = int_field(RecordSettings().timeline_points, min=2,
                                     help="most timeline rows a run keeps (beyond: every 2nd, 4th, ... row)")

    def __attrs_post_init__(self):
        twice = [name for i, name in enumerate(self.reports) if name in self.reports[:i]]
        if twice:  # it would write its files twice
            raise FieldError("reports", f"lists {twice[0]!r} twice")

    def record(self) -> RecordSettings:
        return RecordSettings(self.exact_requests, self.request_rows, self.timeline_points)


@attrs.define
class Experiment:
    """A loaded, validated experiment file."""

    path: Path
    config: ExperimentConfig
    studies: list[StudySpec]
    report_tables: dict[str, dict]
    context: Context
    raw: dict[str, Any]
    plugin_objects: tuple = ()                         # registered in-process (tests)
    custom_presets: dict[str, Any] = attrs.Factory(dict)  # [models.*] / [gpus.*]
    portable: bool = True                              # tasks can rebuild the catalog elsewhere

    @property
    def name(self) -> str:
        return self.config.name or self.path.stem


def _read_toml(path: Path) -> dict:
    """The file's tables; a UTF-8 byte-order mark at its start (some Windows editors write one)
    is skipped. Every failure is a ConfigError naming the file."""
    problem = not_regular_file(path)  # a FIFO would block, /dev/zero would fill the memory
    if problem and not os.path.isdir(path):  # (a folder: said below, with what to give instead)
        raise ConfigError(f"{path}: {problem}")
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
        return tomli.loads(text.removeprefix("\ufeff"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such experiment file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder; give the experiment's .toml file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (TOML must be UTF-8; byte {exc.start} is not)") from None
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomli refuses arrays and inline tables nested too deeply this way
        raise ConfigError(f"{path}: not valid TOML: arrays or inline tables nested too deeply") from None
    except ValueError as exc:  # Python refuses integers of more than 4,300 digits this way
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def check_experiment_name(name: str, where: str) -> str:
    """``name`` if it can name a results folder: one path component (``results/<name>``)."""
    bad = (not name or name in (".", "..") or any(c in name for c in "/\\\0")
           or len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES)
    if bad:
        raise ConfigError(f"{where}: name {name!r} must be one folder name (results go to results/<name>): "
                          f"no '/' or '\\', not '.' or '..', at most {MAX_NAME_BYTES} bytes")
    return name


def _study_kind(o: "_Override") -> str | None:
    """``sweep``, ``search`` or ``plan`` for a ``--set`` of that table (key inside a run's tables), else None."""
    kind = o.key.split(".")[0]
    return kind if kind in STUDY_TABLES else None


def _set_study(table: Any, o: "_Override", whose: str) -> dict:
    """A run's (or the file's) ``[sweep]``, ``[search]`` or ``[plan]`` with one ``--set`` applied: a
    whole table (``--set 'sweep={...}'``) replaces it; a key sets it inside (a grid's axis,
    ``sweep.workload.rate`` or ``plan.space.<key>``, as one quoted key). ``whose``: ``the file``
    or ``run 'name'``, for a key set in a table that is not there."""
    kind = _study_kind(o)
    if o.key == kind:
        if not isinstance(o.value, dict):
            raise ConfigError(f"{o.shown()}: [{kind}] must be a table, e.g. --set '{kind}={{...}}'")
        return copy.deepcopy(o.value)
    if table is None:
        whole = kind if o.run is None else f"runs.{run_key_part(o.run)}.{kind}"
        raise ConfigError(f"{o.shown()}: {whose} has no [{kind}] table to set {o.key[len(kind) + 1:]!r} in; "
                          f"give a whole one: --set '{whole}={{...}}'")
    if not isinstance(table, dict):
        raise ConfigError(f"{o.shown()}: [{kind}] is {table!r}, not a table")
    try:
        axis = axis_of(o.key)
        if axis is None:
            key = o.key[len(kind) + 1:]
            other = {"constraint": "constraints", "constraints": "constraint"}.get(key) if kind == "search" else None
            if other is not None:  # the search's condition(s), whichever way the table gave them
                table = {k: v for k, v in table.items() if k != other}
            return set_dotted(table, key, o.value)
        if axis[0] == "sweep":
            return set_axis(table, axis[1], o.value)
        return {**copy.deepcopy(table), "space": set_axis(table.get("space", {}), axis[1], o.value)}
    except ConfigError as exc:
        raise ConfigError(f"{o.shown()}: {exc}") from None


def _study_tables(raw: dict, entries: list, sets: list["_Override"], source: str) -> tuple[dict, list[dict]]:
    """The file's ``[sweep]``, ``[search]`` and ``[plan]`` tables after the ``--set`` that name them
    for every run: ``(top level: kind -> table or None, [each [[runs]] entry's own: kind -> table or None])``.
    A ``--set`` changes every table of its kind -- the top-level one and each run's own (which wins over the top
    level, as in the file); when the file has none, a whole table becomes the top-level one."""
    top = {kind: raw.get(kind) for kind in STUDY_TABLES}
    own = [{kind: entry.get(kind) for kind in STUDY_TABLES} for entry in entries]
    for o in sets:
        kind = _study_kind(o)
        holders = [tables for tables in (top, *own) if tables[kind] is not None] or [top]
        for tables in holders:
            try:
                tables[kind] = _set_study(tables[kind], o, "the file (top level or any [[runs]] entry)")
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from None
    return top, own


def _blame_study(exc: ConfigError, *, where: str, tables: dict, file_tables: dict, applied: list["_Override"],
                 several_runs: bool) -> ConfigError:
    """``exc`` about a run's ``[sweep]``, ``[search]`` or ``[plan]`` (``tables``: kind -> table, ``--set``
    included; ``file_tables``: as the file has them) naming the ``--set`` of ``applied`` that gave the
    key its value (:func:`_blame_set`); else, when one of them changed a table the message names (or
    the run's choice of one), listing them; unchanged when none did."""
    blamed = _blame_set(exc, where, tables, applied, file_tables=file_tables, several_runs=several_runs)
    if blamed is not exc or not applied:
        return blamed
    message = str(exc)
    kinds = {kind for kind in STUDY_TABLES if f"[{kind}" in message}
    if "one of sweep, search or plan" in message:
        kinds = set(STUDY_TABLES)
    touching = [o for o in applied if _study_kind(o) in kinds]
    if not message.startswith(where.rstrip(":")) or not touching:
        return exc
    return type(exc)(f"{message} (with {', '.join(o.shown() for o in touching)})")


#: what :func:`_validate` adds to a run's error at a point of its sweep or search
_POINT_SAID = re.compile(r" \(at the (?:sweep|search)'s point [^()]*\)$")


def _blame_varied(exc: ConfigError, where: str, study: StudySpec, applied: list["_Override"]) -> ConfigError:
    """``exc`` about a run's table, for a key its sweep or search varies (:func:`_blame_set` leaves
    those alone) when a ``--set`` gave the sweep or search: names those ``--set``."""
    at = _AT_TABLE.match(str(exc), len(f"{where} [")) if str(exc).startswith(f"{where} [") else None
    field = _FIELD.match(str(exc), at.end()) if at else None
    if field is None:
        return exc
    key = f"{at[1]}.{field[1]}"
    if not any(_within(key, k) or _within(k, key) for k in study.keys):
        return exc
    touching = [o for o in applied if _study_kind(o) in ("sweep", "search")]
    if not touching:
        return exc
    message = _POINT_SAID.sub("", str(exc))  # (the --set that gave the values says more than the point)
    return type(exc)(f"{message} (the {study.kind}'s values, with {', '.join(o.shown() for o in touching)})")


def _blame_inherited(exc: ConfigError, where: str, defaults: dict, entry: dict, varied: tuple = ()) -> ConfigError:
    """``exc`` about a key of a ``[[runs]]`` entry's table that the entry did not write but took from
    the file's top-level defaults: says where it is (a table the run took whole) or that an entry
    merges over the defaults and cannot remove a key (a table the run wrote into)."""
    message = str(exc)
    at = _AT_TABLE.match(message, len(f"{where} [")) if message.startswith(f"{where} [") else None
    if at is None:
        return exc
    if unknown := _UNKNOWN_KEY.match(message, at.end()):
        key = ast.literal_eval(unknown[1])
    elif field := _FIELD.match(message, at.end()):
        key = field[1]
    else:
        return exc
    parts = [*at[1].split("."), key]
    if _lookup(defaults, parts) is _NONE or _lookup(entry, parts) is not _NONE:
        return exc
    dotted = ".".join(parts)
    if any(_within(dotted, k) or _within(k, dotted) for k in varied):  # (the run's sweep or search set it)
        return exc
    if not isinstance(_lookup(entry, parts[:-1]), dict):  # the run took the table whole: the fix is up there
        return type(exc)(f"{message} (in the file's top-level [{at[1]}], which this run takes)")
    return type(exc)(f"{message} ({key} comes from the file's [{at[1]}] defaults: a [[runs]] entry merges over "
                     "them and cannot remove a key -- move it into the runs that use it)")


def _check_keys(table: dict, allowed: tuple, where: str) -> None:
    for key in table:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), list(allowed), n=1)
            also = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"{where.rstrip(':')}: unknown key {key!r}{also}; valid keys: {', '.join(allowed)}")


def _custom_presets(raw: dict, source: str, base_dir: str) -> dict:
    """``[models.<name>]`` and ``[gpus.<name>]``: a model's keys, or its ``config.json``
    (``config = "..."``, :mod:`schedlab.hf_config`) with keys beside it winning."""
    custom: dict[str, Any] = {}
    for table_name, cls in (("models", ModelSpec), ("gpus", GpuSpec)):
        tables = raw.get(table_name, {})
        if not isinstance(tables, dict):
            raise ConfigError(f"{source}: [{table_name}] must be a table of tables")
        for name, table in tables.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{source}: [{table_name}.{name}] must be a table")
            where = f"{source}: [{table_name}.{name}]"
            if cls is ModelSpec:
                table = spec_table(table, base_dir, where)
            custom[name] = from_table(cls, {"name": name, **table}, where=where)
    return custom


def load(path: str | os.PathLike, overrides: list[str] = (), *, catalog: Catalog | None = None,
         plugin_objects: tuple = ()) -> Experiment:
    """Read, override and validate an experiment; build every run's plugins once to check them.

    :param overrides: ``dotted.key=value`` strings (the CLI's ``--set``).
    :param catalog: use this catalog instead of loading one (tests).
    """
    path = Path(path)
    source = str(path)
    raw = _read_toml(path)
    _check_keys(raw, TOP_LEVEL, source)
    assignments = [_Override(text, *parse_assignment(text)) for text in overrides]
    exp_table = raw.get("experiment", {})
    if not isinstance(exp_table, dict):
        raise ConfigError(f"{source}: experiment must be one table ([experiment]), got {_shape(exp_table)}")
    exp_set = [o for o in assignments if o.key.startswith("experiment.")]
    for o in exp_set:
        exp_table = _apply({"experiment": exp_table}, o, f"{source}:")["experiment"]
    try:
        config = from_table(ExperimentConfig, exp_table, where=f"{source}: [experiment]")
    except ConfigError as exc:
        raise _blame_set(exc, f"{source}:", {"experiment": exp_table}, exp_set) from None
    check_experiment_name(config.name or path.stem, f"{source}: [experiment]")
    portable = catalog is None
    if catalog is None:
        catalog = load_catalog(config.plugins, plugin_objects=plugin_objects, plugin_dir=path.parent.resolve(),
                               source=source)
    custom = _custom_presets(raw, source, str(path.parent.resolve()))
    presets = Presets.from_catalog(catalog, custom)
    ctx = Context(catalog, presets, str(path.parent.resolve()), source)

    _check_tables(raw, f"{source}:")
    defaults = {k: raw[k] for k in RUN_TABLES if k in raw}
    entries = raw.get("runs", [{}])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{source}: runs must be an array of tables ([[runs]])")
    if not entries:
        entries = [{}]
    for i, entry in enumerate(entries):  # (before a name is looked up: a list or table is no key)
        if "name" in entry and not (isinstance(entry["name"], str) and entry["name"]):
            raise ConfigError(f"{source}: [[runs]] number {i + 1}: name must be non-empty text, "
                              f"got {entry['name']!r}")
    studies = []
    names: set[str] = set()
    counts: dict[str, int] = {}  # simulations per run, so far, and their total
    total = 0
    targeted = _run_assignments(assignments, entries, source)
    # runs.<name>.replicas=3 (seed, engine): the entry's own keys, set on a copy of it
    entries = [_with_settings(e, targeted.get(e.get("name"), [])) for e in entries]
    targeted = {name: [o for o in sets if o.key not in RUN_SETTINGS] for name, sets in targeted.items()}
    every_run = [o for o in assignments if not o.key.startswith(("experiment.", "runs.", "reports."))]
    for o in every_run:
        if o.key.split(".")[0] not in RUN_TABLES + STUDY_TABLES:
            raise ConfigError(f"--set {o.key}: the first part must be one of {', '.join(RUN_TABLES + STUDY_TABLES)}, "
                              "experiment, reports.<report> or runs.<run name>")
    # --set sweep/search/plan...: the file's tables of that name (top level and runs' own), before the runs read them
    study_every = [o for o in every_run if _study_kind(o)]
    every_run = [o for o in every_run if not _study_kind(o)]
    study_targeted = {name: [o for o in sets if _study_kind(o)] for name, sets in targeted.items()}
    targeted = {name: [o for o in sets if not _study_kind(o)] for name, sets in targeted.items()}
    top_studies, own_studies = _study_tables(raw, entries, study_every, source)
    for i, entry in enumerate(entries):
        if entry.get("name"):
            name = entry["name"]
        elif len(entries) == 1:
            name = config.name or path.stem
        else:
            name = f"run{i + 1}"
        where = f"{source}: [[runs]] {name!r}" if raw.get("runs") else f"{source}:"
        _check_keys(entry, RUN_KEYS, where)
        _check_tables(entry, where)
        if name in names:
            raise ConfigError(f"{where.rstrip(':')}: two runs are named {name!r}")
        names.add(name)
        file_tables = _entry_tables(defaults, entry, where)
        applied = every_run + targeted.get(name, [])  # --set runs.<name>.key=value: this run only, last
        tables = file_tables
        for o in applied:
            tables = _apply(tables, o, where)
            _check_tables(tables, f"--set {o.key}: {where}")
        seed = entry.get("seed", config.seed)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_INT:
            raise ConfigError(f"{where.rstrip(':')}: seed must be a whole number from 0 to 2**53, got {seed!r}")
        engine = entry.get("engine", config.engine)
        base = RunSpec(name, tables, seed=seed, engine=engine)
        replicas = entry.get("replicas", config.replicas)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
            raise ConfigError(f"{where.rstrip(':')}: replicas must be a whole number from 1 to {MAX_REPLICAS:,}, "
                              f"got {replicas!r}")
        file_studies = {kind: entry.get(kind, raw.get(kind)) for kind in STUDY_TABLES}
        studies_of_run = {kind: own_studies[i][kind] if own_studies[i][kind] is not None else top_studies[kind]
                          for kind in STUDY_TABLES}
        study_applied = [o for o in study_every if studies_of_run[_study_kind(o)] is not None]
        for o in study_targeted.get(name, []):  # --set runs.<name>.search...: this run's table, last
            try:
                studies_of_run[_study_kind(o)] = _set_study(studies_of_run[_study_kind(o)], o, "this run")
            except ConfigError as exc:
                raise ConfigError(f"{where.rstrip(':')}: {exc}") from None
            study_applied.append(o)
        blame_study = functools.partial(_blame_study, where=where, tables=studies_of_run, file_tables=file_studies,
                                        applied=study_applied, several_runs=len(entries) > 1)
        sweep_table, search_table, plan_table = (studies_of_run[kind] for kind in STUDY_TABLES)
        try:
            if sum(t is not None for t in (sweep_table, search_table, plan_table)) > 1:
                raise ConfigError(f"{where.rstrip(':')}: a run can have one of sweep, search or plan, not several")
            # at most MAX_SWEEP_POINTS points, counted before they are made
            sweep = expand_sweep(sweep_table, f"{where} [sweep]") if sweep_table is not None else None
            if isinstance(search_table, dict) and "replicas" in search_table:
                raise ConfigError(_search_replicas(f"{where} [search]", search_table["replicas"],
                                                   bool(raw.get("runs"))))
            search_cfg = (from_table(SearchConfig, search_table, where=f"{where} [search]")
                          if search_table is not None else None)
            plan_cfg = None
            if plan_table is not None:
                plan_cfg = from_table(PlanConfig, plan_table, where=f"{where} [plan]")
        except ConfigError as exc:
            raise blame_study(exc) from None
        study = StudySpec(name, base, sweep, search_cfg, replicas, plan_cfg)
        counts[name] = (len(sweep) if sweep else 1) * replicas
        total += counts[name]
        if total > MAX_SIMULATIONS:  # (before this run's points are built)
            raise _too_many(counts, source)
        try:
            _validate(study, ctx, where)
        except (ConfigError, WorkloadError) as exc:   # (a workload's file named by a --set, too)
            others = functools.partial(_runs_taking, ctx, defaults, entries, name, every_run, targeted)
            blamed = _blame_set(exc, where, tables, applied, file_tables=file_tables, varied=study.keys,
                                several_runs=len(entries) > 1, others=others)
            if blamed is exc:
                blamed = _blame_varied(exc, where, study, study_applied)
            if blamed is exc and raw.get("runs"):
                blamed = _blame_inherited(exc, where, defaults, entry, study.keys)
            raise blamed from None
        try:
            if search_cfg is not None:
                for constraint in search_cfg.parsed():
                    check_slo(constraint.metric, [study], f"{where} [search]: {search_cfg.field}")
        except ConfigError as exc:
            raise blame_study(exc) from None
        studies.append(study)

    _check_run_names(studies, source)
    report_tables = raw.get("reports", {})
    if not isinstance(report_tables, dict):
        raise ConfigError(f"{source}: [reports] must be a table of report settings")
    for o in (o for o in assignments if o.key.startswith("reports.")):  # --set reports.table.columns=[...]
        report_tables = _apply({"reports": report_tables}, o, f"{source}:")["reports"]
    for name in dict.fromkeys(list(config.reports) + list(report_tables)):
        # unknown report names and bad settings (a misspelt metric) fail now, not after the runs
        table = report_tables.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [reports.{name}] must be a table of settings, got {_shape(table)}")
        # (a name only in [experiment] reports is that list's: a misspelt one there has no table of its own)
        place = f"[reports.{name}]" if name in report_tables else "[experiment] reports"
        _, report_config = component_config(ctx, "report", {**table, "kind": name}, f"{source}: {place}")
        check_report_studies(report_config, studies, f"{source}: [reports.{name}]")
    return Experiment(path, config, studies, report_tables, ctx, raw, tuple(plugin_objects), custom, portable)


def _search_replicas(where: str, value: Any, runs: bool) -> str:
    """The error for ``replicas`` in a ``[search]``: replicas are the run's (``[[runs]]`` entry) or
    every run's (``[experiment]``), and a search's probes take them: each probe runs that many
    seeds and the search tests their mean."""
    n = value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_REPLICAS else "N"
    place = (f"replicas = {n} in the [[runs]] entry, beside its search, or in [experiment] for every run"
             if runs else f"replicas = {n} in [experiment]")
    return (f"{where}: unknown key 'replicas'; replicas are the run's, not the search's: {place} (--set "
            f"experiment.replicas={n}); each probe then runs {n} seeds and the search tests their mean; valid keys: "
            f"{', '.join(sorted(f.name for f in attrs.fields(SearchConfig)))}")


def _too_many(counts: dict[str, int], source: str) -> ConfigError:
    """The error for runs (``counts``: each one's sweep points, or 1, times its replicas; a search or
    plan counts one per replica, the least it runs) that add up to more than
    :data:`MAX_SIMULATIONS`: each limit alone allows far more, and such a file would run for days."""
    largest = sorted(counts.items(), key=lambda item: -item[1])[:3]
    shown = ", ".join(f"{name!r} {n:,}" for name, n in largest)
    return ConfigError(f"{source}: its runs add up to more than {MAX_SIMULATIONS:,} simulations, the most one "
                       f"file runs (sweep points x replicas; the largest: {shown}): fewer points or replicas, "
                       "or split it into several files")


def check_report_studies(config, studies: list[StudySpec], where: str) -> None:
    """Check a report's settings that name runs or swept keys (a crossover's baseline, an
    overlay's runs) against the file's studies, so that a misspelt one fails now, not after
    every simulation. A report's config class opts in with a method ``check_studies(studies)``
    that raises ConfigError or FieldError; each study has ``name``, ``kind`` ("run", "sweep",
    "search" or "plan"), ``keys`` (swept or searched), ``has_slo()`` and ``has_power()`` (:class:`StudySpec`)."""
    check = getattr(config, "check_studies", None)
    if check is None:
        return
    try:
        check(studies)
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc.name}: {exc.message}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_tables(tables: dict, where: str) -> None:
    """The run tables and study tables among ``tables`` (the file's top level, a ``[[runs]]`` entry,
    or a run's after a ``--set``) are each one table: ``slo = 5``, ``[[slo]]`` or ``--set
    scheduler=abc`` failed far away with a traceback, and ``slo = []`` passed as no table."""
    for key in RUN_TABLES + STUDY_TABLES:
        if key in tables and not isinstance(tables[key], dict):
            raise ConfigError(f"{where} [{key}]: must be a table, got {_shape(tables[key])}")


def _shape(value) -> str:
    if isinstance(value, list):
        return "an array ([[...]] or [...])"
    return f"{value!r}"


#: a ``[[runs]]`` entry's own settings, which ``--set runs.<name>.<key>=value`` may set too
RUN_SETTINGS = ("replicas", "seed", "engine")


def _with_settings(entry: dict, overrides: list) -> dict:
    """``entry`` with the ``--set runs.<name>.replicas`` (seed, engine) aimed at it."""
    own = {o.key: o.value for o in overrides if o.key in RUN_SETTINGS}
    return {**entry, **own} if own else entry


def _run_assignments(assignments: list[_Override], entries: list, source: str) -> dict[str, list[_Override]]:
    """``--set runs.<name>.<table>.key=value``: run name -> its overrides, keyed inside the run."""
    names = [e.get("name") for e in entries if isinstance(e.get("name"), str)]
    targeted: dict[str, list] = {}
    for o in assignments:
        key = o.key
        if not key.startswith("runs."):
            continue
        name, rest = split_run_key(key, names)
        parts = rest.split(".")
        whole = len(parts) == 1 and isinstance(o.value, dict)  # runs.<name>.<table>={...}: the whole table
        if rest in RUN_SETTINGS:   # runs.<name>.replicas=3: the entry's own key (its seed, engine, replicas)
            if name not in names:
                known = ", ".join(map(run_key_part, names)) or "(no [[runs]] has a name)"
                raise ConfigError(f"--set {key}: no run named {name!r} in {source}; runs: {known}")
            targeted.setdefault(name, []).append(attrs.evolve(o, key=rest, run=name))
            continue
        if not ((len(parts) >= 2 or whole) and parts[0] in RUN_TABLES or parts[0] in STUDY_TABLES):
            raise ConfigError(f"--set {key}: write runs.<run name>.<table>.<key> (or runs.<run name>.<table>="
                              f"{{...}}), with the table one of {', '.join(RUN_TABLES)} (e.g. "
                              "runs.tune.scheduler.max_num_seqs=8; a name with "
                              'spaces or dots in quotes: runs."my run".scheduler.max_num_seqs=8), or '
                              f"runs.<run name>.<{' or '.join(STUDY_TABLES)}>[.<key>], or runs.<run name>."
                              f"<{' or '.join(RUN_SETTINGS)}>")
        if name not in names:
            known = ", ".join(map(run_key_part, names)) or "(no [[runs]] has a name)"
            raise ConfigError(f"--set {key}: no run named {name!r} in {source}; runs: {known}")
        rest = check_key(rest, where=f"--set {key}")
        targeted.setdefault(name, []).append(attrs.evolve(o, key=rest, run=name))
    return targeted


@attrs.frozen
class _Override:
    """One ``--set``: its text as given, its dotted key (inside the run's tables once it names a
    run), its value, and the run it names (None: every run)."""

    text: str
    key: str
    value: Any
    run: str | None = None

    def shown(self, text: str | None = None) -> str:
        """``--set TEXT`` as a shell takes it, a long text cut short."""
        text = self.text if text is None else text
        if len(text) > _SHOWN_CHARS:
            text = text[:_SHOWN_CHARS] + "..."
        return f"--set {shlex.quote(text)}"

    def for_run(self, name: str) -> str:
        """The ``--set`` that sets the same key to the same value in run ``name`` only."""
        key_text, _, value_text = self.text.partition("=")
        return self.shown(f"runs.{run_key_part(name)}.{key_text.strip()}={value_text.strip()}")


_SHOWN_CHARS = 80
_NONE = object()
#: The run tables that name a plugin (kind = "..."), and the registry their kind is in.
_PLUGIN_TABLES = {"workload": "workload", "scheduler": "scheduler", "cost_model": "cost_model",
                  "kv_cache": "kv_cache", "power": "power_model"}
_AT_TABLE = re.compile(r"([A-Za-z0-9_.-]+)\]: ")
_QUOTED = r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
_DID_YOU_MEAN = r"(?: \(did you mean [^)]*\))?"
_UNKNOWN_KEY = re.compile(rf"unknown key {_QUOTED}{_DID_YOU_MEAN}")
_UNKNOWN_KIND = re.compile(rf"unknown ([a-z_]+) {_QUOTED}{_DID_YOU_MEAN}")
_FIELD = re.compile(r"([A-Za-z0-9_-]+): ")
_MISSING_KIND = "missing 'kind'"


def _apply(tables: dict, override: _Override, where: str) -> dict:
    table, dot, _ = override.key.partition(".")
    if dot and table not in tables and table in DEFAULT_TABLES:
        # a key of a table the file leaves to its default: set it in the default table, kind and all
        tables = {**tables, table: dict(DEFAULT_TABLES[table])}
    try:
        return set_dotted(tables, override.key, override.value)
    except ConfigError as exc:  # through a value that is not a table
        raise ConfigError(f"{where.rstrip(':')}: {override.shown()}: {exc}") from None


def _entry_tables(defaults: dict, entry: dict, where: str) -> dict:
    """A ``[[runs]]`` entry's tables merged over the defaults (before ``--set``)."""
    tables = dict(defaults)
    for key in RUN_TABLES:
        if key in entry:
            tables[key] = merge_tables({key: tables.get(key, {})}, {key: entry[key]}, where=where)[key]
    return tables


def _lookup(tables: dict, parts: list[str]) -> Any:
    node: Any = tables
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return _NONE
        node = node[part]
    return node


def _within(key: str, outer: str) -> bool:
    """Whether dotted ``key`` is ``outer`` or inside it."""
    return key == outer or key.startswith(outer + ".")


def _runs_taking(ctx: Context, defaults: dict, entries: list, this: str, every_run: list[_Override],
                 targeted: dict, table: str) -> list[str]:
    """The other runs that ``--set runs.<name>...`` can name whose ``table``, ``--set`` included,
    is a valid config of its kind (for advice: a run with another problem is left out)."""
    registry = _PLUGIN_TABLES.get(table)
    taking = []
    for entry in entries if registry else ():
        name = entry.get("name")
        if not isinstance(name, str) or name == this:
            continue
        try:
            tables = _entry_tables(defaults, entry, "")
            for o in every_run + targeted.get(name, []):
                tables = set_dotted(tables, o.key, o.value)
            component_config(ctx, registry, {**DEFAULT_TABLES, **tables}.get(table, {}), "")
        except Exception:  # noqa: BLE001 -- whatever that run's config says, it does not take it
            continue
        taking.append(name)
    return taking


def _blame_set(exc: ConfigError, where: str, tables: dict, applied: list[_Override], *,
               file_tables: dict | None = None, varied: tuple = (), several_runs: bool = False,
               others: Callable[[str], list[str]] | None = None) -> ConfigError:
    """``exc`` -- ``{where} [table]: unknown key 'k'...``, ``... [table]: k: ...``, ``... unknown
    <kind> 'name'`` or ``... missing 'kind'`` -- saying which of ``applied`` (the run's ``--set``
    overrides, in the order applied) gave that key its value; unchanged when none did (the value
    is the file's, or a swept one, or the message names no table and key).

    :param tables: the run's tables, ``--set`` included; ``file_tables``: before ``--set``.
    :param others: the other runs whose table (by name) takes the value, for advice to set it in
        those alone when an override for every run fails in this one.
    """
    message = str(exc)
    head = f"{where} ["
    at = _AT_TABLE.match(message, len(head)) if applied and message.startswith(head) else None
    if at is None:
        return exc
    path, body = at[1], message[at.end():]
    file_tables = {} if file_tables is None else file_tables
    if body.startswith(_MISSING_KIND):
        made = next((o for o in reversed(applied) if _within(o.key, path)), None)
        if made is None or _lookup(file_tables, path.split(".")) is not _NONE:
            return exc
        default = DEFAULT_TABLES.get(path, {}).get("kind")
        example = f", e.g. --set {path}.kind={default}" if default else ""
        note = f" (this run's [{path}] comes only from {made.shown()}, so it has no kind: name one{example})"
        return type(exc)(message[: at.end()] + _MISSING_KIND + note + body[len(_MISSING_KIND):])
    mode, end = "value", len(body)
    if match := _UNKNOWN_KEY.match(body):
        mode, end, key = "unknown", match.end(), ast.literal_eval(match[1])
    elif (match := _UNKNOWN_KIND.match(body)) and match[1] == _PLUGIN_TABLES.get(path.split(".")[-1], path):
        mode, end, key = "kind", match.end(), "kind"
    elif match := _FIELD.match(body):
        key = match[1]
    elif (key := _path_set_by(body, path, applied)) is not None:
        mode = "file"   # (a file that is not there is missing for every run: no advice to set it for some)
    else:
        return exc
    parts = path.split(".")
    candidates = [[*parts, key]]
    if parts[0] == "cluster" and len(parts) > 2 and parts[2] in RUN_TABLES and _lookup(tables, candidates[0]) is _NONE:
        candidates.append([*parts[2:], key])  # a pool's table merges the run's: [cluster.prefill.scheduler]
    for candidate in map(".".join, candidates):
        if any(_within(candidate, k) or _within(k, candidate) for k in varied):
            return exc  # a sweep or search sets it last
        override = next((o for o in reversed(applied) if _within(candidate, o.key)), None)
        inside = next((o for o in reversed(applied) if _within(o.key, candidate)), None)
        if override is None and inside is not None and _lookup(file_tables, candidate.split(".")) is _NONE:
            override = inside  # the --set made the key, through a table inside it
        if override is not None or inside is not None:
            break
    else:
        return exc
    if override is None:  # the value is the file's, with part of it set by --set
        return type(exc)(f"{message} (as changed by {inside.shown()})") if mode == "value" else exc
    advice = ""
    every = override.run is None and several_runs
    taking = others(candidate.split(".")[0]) if every and others is not None and mode not in ("kind", "file") else []
    if len(taking) == 1:
        advice = f"; to set it for run {taking[0]!r} only: {override.for_run(taking[0])}"
    elif taking:
        shown = ", ".join(map(run_key_part, taking[:5])) + (", ..." if len(taking) > 5 else "")
        advice = (f"; to set it only for the runs whose {candidate.split('.')[0]} takes it (NAME: {shown}): "
                  f"{override.for_run('NAME')} for each")
    note = f"from {override.shown()}"
    if mode == "unknown" or taking:
        kind = _lookup({**DEFAULT_TABLES, **tables}, [*parts, "kind"])
        if kind is _NONE and len(candidates) > 1:
            kind = _lookup({**DEFAULT_TABLES, **tables}, [*parts[2:], "kind"])
        if kind is _NONE and len(parts) == 1:  # a table that names no kind is of the default kind
            kind = DEFAULT_TABLES.get(parts[0], {}).get("kind", _NONE)
        note += ", which sets it for every run" if every else ""
        note += f"; this run's {path} is {kind!r}" if isinstance(kind, str) else ""
    return type(exc)(f"{message[: at.end()]}{body[:end]} ({note}){body[end:]}{advice}")


def _path_set_by(body: str, table: str, applied: list[_Override]) -> str | None:
    """The key (inside ``table``) of the ``--set`` whose text value is the file a message about
    that table starts with (``.../missing.json: file not found`` names the file, not its key)."""
    named = body.split(": ", 1)[0]
    for o in reversed(applied):
        if _within(o.key, table) and o.key != table and isinstance(o.value, str) and o.value and \
                named.endswith(o.value.lstrip("./")):
            return o.key[len(table) + 1:]
    return None


def _validate(study: StudySpec, ctx: Context, where: str) -> None:
    """Build the plugins of the base run and of every sweep point (search: both range ends;
    plan: see :func:`schedlab.study.planner.validate`)."""
    if study.plan is not None:
        validate_plan(study, ctx, where)
        return
    if study.sweep is not None:
        points = study.sweep
    elif study.search is not None:  # as the search probes them: real numbers unless it is over whole ones
        search = study.search
        ends = (search.low, search.high) if search.integer else (float(search.low), float(search.high))
        points = [{search.key: end} for end in ends]
    else:
        points = [{}]
    for point in points:
        try:
            spec = point_spec(study, point)
        except ConfigError as exc:  # a key outside the run tables: name the file, the run and its table
            raise ConfigError(f"{where} [{'sweep' if study.sweep is not None else 'search'}]: "
                              f"{exc}") from None
        try:
            assemble(spec, ctx, where, check_only=True)
        except ConfigError as exc:
            search = study.search
            if search is None or search.integer or not isinstance(search.low, int) or "whole number" not in str(exc):
                said = any(word in str(exc) for word in ("--set", "point", "sweep", "search's values"))
                if point and not said and _point_sets(exc, where, point):  # say which point set the value
                    setting = ", ".join(f"{key} = {value!r}" for key, value in point.items())
                    raise ConfigError(f"{exc} (at the {'sweep' if study.sweep is not None else 'search'}'s "
                                    f"point {setting})") from None
                raise
            raise ConfigError(f"{where} [search]: tolerance: {search.key} takes whole numbers, and a tolerance "
                              f"makes the search probe real ones ({float(search.low)}, ...); drop it: a search "
                              "over whole numbers finds the exact boundary") from None


def _point_sets(exc: ConfigError, where: str, point: dict) -> bool:
    """Whether the key ``exc`` is about is one ``point`` sets, or inside or around one (True when the
    message names no key): an error in a table the sweep does not touch is not the point's."""
    at = _AT_TABLE.match(str(exc), len(f"{where} [")) if str(exc).startswith(f"{where} [") else None
    field = _FIELD.match(str(exc), at.end()) if at else None
    if field is None:
        return True
    key = f"{at[1]}.{field[1]}"
    return any(_within(key, k) or _within(k, key) for k in point)


def _check_run_names(studies: list[StudySpec], source: str) -> None:
    """Refuse two runs of one name among those the file's studies make: sweep points
    (``name[rate=5]``), replicas (``name#2``) and a search's probes (``name[rate=...]``) beside
    ``[[runs]]`` names -- results are kept by run name (config.json, requests.csv)."""
    made: dict[str, str] = {}
    probes: list[tuple[str, str]] = []
    for study in studies:
        if study.search is not None:
            probes.append((f"{study.name}[{point_label({study.search.key: 0}).split('=')[0]}=", study.name))
        names = ([point_spec(study, point).name for point in study.sweep] if study.sweep is not None
                 else [study.name])
        if study.replicas > 1:
            names += [replica_name(name, k) for name in names for k in range(study.replicas)]
        for name in names:
            if name in made and made[name] != study.name:
                raise ConfigError(f"{source}: two runs would be named {name!r}: {_whose(name, made[name])} and "
                                  f"{_whose(name, study.name)}; results are kept by run name: rename one entry")
            made[name] = study.name
    for prefix, owner in probes:
        clash = next((name for name, study in made.items() if name.startswith(prefix) and study != owner), None)
        if clash is not None:
            raise ConfigError(f"{source}: {_whose(clash, made[clash])} is named as the probes of [[runs]] {owner!r}'s "
                              f"search are ({prefix}...]); results are kept by run name: rename one entry")


def _whose(name: str, study: str) -> str:
    return f"[[runs]] {study!r}" if name == study else f"a sweep point or replica of [[runs]] {study!r}"


def run_experiment(exp: Experiment, *, observer: Callable | None = None,
                   on_run: Callable[[RunResult], None] | None = None, executor=None) -> ExperimentResults:
    """Simulate every study; results in file order, identical whatever ``executor`` runs them.

    :param executor: where tasks run (:mod:`schedlab.study.executor`); default: this process.
        Runs that need this process -- an ``observer``, a plugin implementing the per-iteration
        hook, or a catalog passed to :func:`load` -- run here whatever it is.
    """
    hook = exp.context.catalog.hook
    if observer is None and exp.context.catalog.observes_iterations():
        def observer(instance, record):  # opt-in and slow: the engine then runs step by step
            hook.schedlab_iteration(instance=instance, record=record)
    if executor is None or observer is not None or not exp.portable:
        executor = InProcessExecutor(exp.context, observer)
    return run_studies(exp, executor, on_run=on_run)


def dotted_value(tables: dict, key: str):
    """A value of a run's resolved tables by dotted key (for reports)."""
    return get_dotted(tables, key)
