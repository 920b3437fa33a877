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
    [search]                # key, low, high, constraint, maximize -- applied to every run
    [plan]                  # capacity planning: GPUs with prices, a space, constraints
    [[runs]]                # name = "...", then tables that override the defaults,
                            # and optionally its own sweep, search or plan, and replicas
    [reports.<name>]        # settings of a report plugin

A run's table replaces the default table when it names another ``kind``, and merges key by
key otherwise. ``--set dotted.key=value`` then applies to every run. Relative paths resolve
against the experiment file's folder. Every error names the file, the table and the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import attrs
import tomli

from ..capacity import GpuSpec, ModelSpec, Presets
from ..catalog import Catalog, load_catalog
from ..configs import MAX_INT, FieldError, bool_field, from_table, int_field, list_field, not_regular_file, str_field
from ..errors import ConfigError
from ..hf_config import spec_table
from ..results.records import ExperimentResults, RunResult
from ..results.stream import ROW_FORMATS, RecordSettings
from .executor import InProcessExecutor
from .overrides import get_dotted, merge_tables, parse_assignment, set_dotted
from .planner import PlanConfig, validate as validate_plan
from .runner import run_studies
from .simulation import ENGINES, Context, RunSpec, assemble, component_config
from .search import parse_constraint
from .spec import RUN_TABLES, SearchConfig, StudySpec, check_slo, point_spec
from .sweep import expand_sweep

TOP_LEVEL = ("experiment", "workload", "scheduler", "cost_model", "kv_cache", "cluster", "slo", "speculative",
             "power", "clock", "frontend", "client", "target", "models", "gpus", "sweep", "search", "plan", "runs",
             "reports",
             "hunt")  # hunt: schedlab hunt
RUN_KEYS = RUN_TABLES + ("name", "sweep", "search", "plan", "seed", "engine", "replicas")
DEFAULT_REPORTS = ("table", "json", "plots")
#: The most replicas a run may ask for: each is a whole simulation (95% intervals need a few dozen).
MAX_REPLICAS = 10_000
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


def _check_keys(table: dict, allowed: tuple, where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where.rstrip(':')}: unknown key {key!r}; valid keys: {', '.join(allowed)}")


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
    assignments = [parse_assignment(text) for text in overrides]
    exp_table = raw.get("experiment", {})
    if not isinstance(exp_table, dict):
        raise ConfigError(f"{source}: experiment must be one table ([experiment]), got {_shape(exp_table)}")
    for key, value in assignments:
        if key.startswith("experiment."):
            exp_table = set_dotted({"experiment": exp_table}, key, value)["experiment"]
    config = from_table(ExperimentConfig, exp_table, where=f"{source}: [experiment]")
    check_experiment_name(config.name or path.stem, f"{source}: [experiment]")
    portable = catalog is None
    if catalog is None:
        catalog = load_catalog(config.plugins, plugin_objects=plugin_objects, plugin_dir=path.parent.resolve(),
                               source=source)
    custom = _custom_presets(raw, source, str(path.parent.resolve()))
    presets = Presets.from_catalog(catalog, custom)
    ctx = Context(catalog, presets, str(path.parent.resolve()), source)

    defaults = {k: raw[k] for k in RUN_TABLES if k in raw}
    entries = raw.get("runs", [{}])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{source}: runs must be an array of tables ([[runs]])")
    if not entries:
        entries = [{}]
    studies = []
    names: set[str] = set()
    targeted = _run_assignments(assignments, entries, source)
    for i, entry in enumerate(entries):
        if "name" in entry and not (isinstance(entry["name"], str) and entry["name"]):
            raise ConfigError(f"{source}: [[runs]] number {i + 1}: name must be non-empty text, "
                              f"got {entry['name']!r}")
        if entry.get("name"):
            name = entry["name"]
        elif len(entries) == 1:
            name = config.name or path.stem
        else:
            name = f"run{i + 1}"
        where = f"{source}: [[runs]] {name!r}" if raw.get("runs") else f"{source}:"
        _check_keys(entry, RUN_KEYS, where)
        if name in names:
            raise ConfigError(f"{where.rstrip(':')}: two runs are named {name!r}")
        names.add(name)
        tables = dict(defaults)
        for key in RUN_TABLES:
            if key in entry:
                tables[key] = merge_tables({key: tables.get(key, {})}, {key: entry[key]}, where=where)[key]
        for key, value in assignments:
            if not key.startswith(("experiment.", "runs.")):
                if key.split(".")[0] not in RUN_TABLES:
                    raise ConfigError(f"--set {key}: the first part must be one of {', '.join(RUN_TABLES)}, "
                                      "experiment or runs.<run name>")
                tables = set_dotted(tables, key, value)
        for key, value in targeted.get(name, ()):  # --set runs.<name>.key=value: this run only
            tables = set_dotted(tables, key, value)
        seed = entry.get("seed", config.seed)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_INT:
            raise ConfigError(f"{where.rstrip(':')}: seed must be a whole number from 0 to 2**53, got {seed!r}")
        engine = entry.get("engine", config.engine)
        base = RunSpec(name, tables, seed=seed, engine=engine)
        replicas = entry.get("replicas", config.replicas)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
            raise ConfigError(f"{where.rstrip(':')}: replicas must be a whole number from 1 to {MAX_REPLICAS:,}, "
                              f"got {replicas!r}")
        sweep_table = entry.get("sweep", raw.get("sweep"))
        search_table = entry.get("search", raw.get("search"))
        plan_table = entry.get("plan", raw.get("plan"))
        if sum(t is not None for t in (sweep_table, search_table, plan_table)) > 1:
            raise ConfigError(f"{where.rstrip(':')}: a run can have one of sweep, search or plan, not several")
        # at most MAX_SWEEP_POINTS points, counted before they are made
        sweep = expand_sweep(sweep_table, f"{where} [sweep]") if sweep_table is not None else None
        search_cfg = (from_table(SearchConfig, search_table, where=f"{where} [search]")
                      if search_table is not None else None)
        plan_cfg = None
        if plan_table is not None:
            plan_cfg = from_table(PlanConfig, plan_table, where=f"{where} [plan]")
        study = StudySpec(name, base, sweep, search_cfg, replicas, plan_cfg)
        _validate(study, ctx, where)
        if search_cfg is not None:
            check_slo(parse_constraint(search_cfg.constraint).metric, [study],
                      f"{where} [search]: constraint")
        studies.append(study)

    report_tables = raw.get("reports", {})
    if not isinstance(report_tables, dict):
        raise ConfigError(f"{source}: [reports] must be a table of report settings")
    for name in dict.fromkeys(list(config.reports) + list(report_tables)):
        # unknown report names and bad settings (a misspelt metric) fail now, not after the runs
        table = report_tables.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [reports.{name}] must be a table of settings, got {_shape(table)}")
        _, report_config = component_config(ctx, "report", {**table, "kind": name}, f"{source}: [reports.{name}]")
        check_report_studies(report_config, studies, f"{source}: [reports.{name}]")
    return Experiment(path, config, studies, report_tables, ctx, raw, tuple(plugin_objects), custom, portable)


def check_report_studies(config, studies: list[StudySpec], where: str) -> None:
    """Check a report's settings that name runs or swept keys (a crossover's baseline, an
    overlay's runs) against the file's studies, so that a misspelt one fails now, not after
    every simulation. A report's config class opts in with a method ``check_studies(studies)``
    that raises ConfigError or FieldError; each study has ``name``, ``kind`` ("run", "sweep",
    "search" or "plan"), ``keys`` (swept or searched) and ``has_slo()`` (:class:`StudySpec`)."""
    check = getattr(config, "check_studies", None)
    if check is None:
        return
    try:
        check(studies)
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc.name}: {exc.message}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _shape(value) -> str:
    if isinstance(value, list):
        return "an array ([[...]] or [...])"
    return f"{value!r}"


def _run_assignments(assignments, entries: list, source: str) -> dict[str, list]:
    """``--set runs.<name>.<table>.key=value``: run name -> [(key inside the run, value)]."""
    names = [e.get("name") for e in entries if isinstance(e.get("name"), str)]
    targeted: dict[str, list] = {}
    for key, value in assignments:
        if not key.startswith("runs."):
            continue
        parts = key.split(".")
        if len(parts) < 4 or parts[2] not in RUN_TABLES:
            raise ConfigError(f"--set {key}: write runs.<run name>.<table>.<key>, with the table one of "
                              f"{', '.join(RUN_TABLES)} (e.g. runs.tune.scheduler.max_num_seqs=8)")
        if parts[1] not in names:
            known = ", ".join(names) or "(no [[runs]] has a name)"
            raise ConfigError(f"--set {key}: no run named {parts[1]!r} in {source}; runs: {known}")
        targeted.setdefault(parts[1], []).append((".".join(parts[2:]), value))
    return targeted


def _validate(study: StudySpec, ctx: Context, where: str) -> None:
    """Build the plugins of the base run and of every sweep point (search: both range ends;
    plan: see :func:`schedlab.study.planner.validate`)."""
    if study.plan is not None:
        validate_plan(study, ctx, where)
        return
    if study.sweep is not None:
        points = study.sweep
    elif study.search is not None:
        points = [{study.search.key: study.search.low}, {study.search.key: study.search.high}]
    else:
        points = [{}]
    for point in points:
        assemble(point_spec(study, point), ctx, where, check_only=True)


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
