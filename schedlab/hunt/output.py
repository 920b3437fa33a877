"""What a hunt leaves behind: request files, experiment files that replay them, and a summary.

``<name>.jsonl`` holds the requests, one JSON object per line, in a request file's fields
(``file`` workload). ``<name>.toml`` is the hunt file without ``[hunt]``: the same runs, each
with its tables written out whole (defaults, its own and ``--set`` overrides merged) and the
settings the hunt chose, and ``[workload] kind = "file"`` naming the request file. Relative
paths in those tables (a profile bundle, a request file: every path setting of a registered
plugin) are rewritten relative to the output folder, so ``schedlab run <name>.toml`` replays the
counterexample from there, and the table shows the metrics the objective is made of. Plugin
modules are named by module, not path, and looked up in the experiment file's folder first:
those the hunt file's folder held are copied beside the reproducers.
"""

from __future__ import annotations

import importlib.machinery
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs

from ..configs import toml_text
from ..study.overrides import set_dotted
from .evaluate import settings_for
from .space import Candidate

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
SECTION_TABLES = ("reports", "models", "gpus")  # tables of tables: one [a.b] section each


def requests_jsonl(candidate: Candidate) -> str:
    """The candidate's requests as JSONL (floats written exactly: ``repr`` round-trips)."""
    return "".join(json.dumps(row, sort_keys=False) + "\n" for row in candidate.rows)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_text(key)


def toml_document(doc: dict, header: str = "") -> str:
    """A TOML file for ``doc``: top-level tables as sections, ``runs`` as ``[[runs]]``, values inline."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for name, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for entry in value:
                lines += ["", f"[[{_key(name)}]]"] + [f"{_key(k)} = {toml_text(v)}" for k, v in entry.items()]
        elif isinstance(value, dict) and name in SECTION_TABLES:
            for sub, table in value.items():
                lines += ["", f"[{_key(name)}.{_key(sub)}]"] + [f"{_key(k)} = {toml_text(v)}" for k, v in table.items()]
        elif isinstance(value, dict):
            lines += ["", f"[{_key(name)}]"] + [f"{_key(k)} = {toml_text(v)}" for k, v in value.items()]
        else:
            lines.insert(len(header.splitlines()), f"{_key(name)} = {toml_text(value)}")
    return "\n".join(lines).lstrip("\n") + "\n"


def path_keys(catalog) -> set[str]:
    """The keys that hold file paths in plugin tables: every registered plugin's path settings,
    and ``path`` in nested tables (as :func:`schedlab.configs.from_table` resolves them)."""
    keys = {"path"}
    for registry in catalog.registries.values():
        for plugin in registry.names():
            config = registry.get(plugin).config
            if config is not None:
                keys.update(a.name for a in attrs.fields(config) if a.metadata.get("path"))
    return keys


def input_files(experiment) -> list[Path]:
    """The files ``experiment`` reads: its own file and the value of every path setting (see
    :func:`path_keys`) in its tables, its runs' (``--set`` overrides included) and its sweep
    points, relative ones resolved against the experiment file's folder as the runs resolve them."""
    keys = path_keys(experiment.context.catalog)
    base = experiment.context.base_dir
    found = [Path(experiment.path)]

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if str(key).rsplit(".", 1)[-1] not in keys:
                    walk(item)
                elif isinstance(item, str) and item.strip():
                    found.append(Path(base, os.path.expanduser(item)))
                elif isinstance(item, list):  # a sweep's or a plan space's values ("workload.path" = [...])
                    found.extend(Path(base, os.path.expanduser(v)) for v in item if isinstance(v, str) and v.strip())
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(experiment.raw)
    for study in experiment.studies:
        walk(study.base.tables)
        walk(list(study.sweep or ()))  # points are {dotted key: value}
        walk(getattr(study.plan, "space", None) or {})  # (a plan's space, --set ones too: review s81 badinput, 2)
    return list(dict.fromkeys(found))


def local_plugins(experiment) -> list[Path]:
    """The files (a module) or folders (a package) of ``[experiment] plugins`` in the experiment
    file's folder, where they are imported from first: a reproducer elsewhere needs copies."""
    found = []
    for name in experiment.config.plugins:
        spec = importlib.machinery.PathFinder.find_spec(name.split(".")[0], [experiment.context.base_dir])
        if spec is not None and spec.submodule_search_locations:
            found.append(Path(list(spec.submodule_search_locations)[0]))
        elif spec is not None and spec.origin:
            found.append(Path(spec.origin))
    return list(dict.fromkeys(found))


def copy_plugins(experiment, folder: Path) -> list[Path]:
    """Copy :func:`local_plugins` into ``folder`` (beside the reproducers); the copies (none of
    those already there: every reproducer of a hunt shares them)."""
    copies = []
    for source in local_plugins(experiment):
        target = folder / source.name
        if target.exists():
            continue
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
        copies.append(target)
    return copies


_FIND = """import importlib.util, sys
sys.path.insert(0, sys.argv[1])
for name in sys.argv[2:]:
    try:
        found = importlib.util.find_spec(name) is not None
    except Exception:
        found = False
    if not found:
        print(name)
"""


def missing_plugins(folder: Path, modules) -> list[str]:
    """The plugin ``modules`` a replay of a file in ``folder`` could not import, from any working
    folder: checked in a fresh interpreter, as this one has them imported already."""
    if not modules:
        return []
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", _FIND, str(folder), *modules], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
    return done.stdout.split() if done.returncode == 0 else []


def rebase_paths(value: Any, keys: set[str], source: str | os.PathLike, target: str | os.PathLike) -> Any:
    """``value`` with every relative path under one of ``keys`` (written relative to ``source``)
    made relative to ``target`` instead."""
    if isinstance(value, dict):
        return {k: (os.path.relpath(os.path.join(source, os.path.expanduser(v)), target)
                    if k in keys and isinstance(v, str) and v.strip() and not os.path.isabs(os.path.expanduser(v))
                    else rebase_paths(v, keys, source, target)) for k, v in value.items()}
    return value


def replay_document(experiment, candidate: Candidate, requests_file: str, *, name: str, columns: list[str],
                    folder: str | os.PathLike = ".") -> dict:
    """An experiment replaying ``candidate`` from ``folder``: every run of the hunt with its
    resolved tables (the file's defaults, the run's own and ``--set`` overrides merged, paths
    made relative to ``folder``) and the candidate's settings, its seed and engine, reading the
    requests from ``requests_file``."""
    keys = path_keys(experiment.context.catalog)
    source, target = experiment.context.base_dir, os.path.abspath(folder)
    config = experiment.config
    head = {"name": name, "seed": config.seed, "timeline": config.timeline}
    if config.plugins:
        head["plugins"] = list(config.plugins)
    doc = {"experiment": head, "workload": {"kind": "file", "path": requests_file}}
    for key in ("models", "gpus"):   # (a model's config.json path, relative to the hunt file, rebased too)
        if key in experiment.raw:
            doc[key] = rebase_paths(experiment.raw[key], {"config"}, source, target)
    runs = []
    names = [study.name for study in experiment.studies]
    for study in experiment.studies:
        tables = {k: v for k, v in study.base.tables.items() if k != "workload"}
        for key, value in settings_for(study.name, candidate.settings, names):
            tables = set_dotted(tables, key, value)
        tables = rebase_paths(tables, keys, source, target)
        runs.append({"name": study.name, "seed": study.base.seed, "engine": study.base.engine, **tables})
    doc["runs"] = runs
    reports = dict(experiment.raw.get("reports", {}))
    reports["table"] = dict(reports.get("table", {}), columns=columns)
    doc["reports"] = reports
    return doc


def summary_json(payload: dict[str, Any]) -> str:
    """``payload`` as strict JSON: a NaN or an infinity (``workload.rate_rps`` of requests that
    all arrive at once, say) is written as null, as JSON has no such numbers."""
    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(payload), indent=1, allow_nan=False) + "\n"


def write_text(folder: Path, name: str, text: str | bytes) -> Path:
    """Write ``folder/name``; a failed write (a full disk) names the file, as ``write`` itself does not."""
    path = folder / name
    try:
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise
    return path
