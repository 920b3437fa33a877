"""What a hunt leaves behind: request files, experiment files that replay them, and a summary.

``<name>.jsonl`` holds the requests, one JSON object per line, in a request file's fields
(``file`` workload). ``<name>.toml`` is the hunt file without ``[hunt]``: the same runs, each
with its tables written out whole (defaults, its own and ``--set`` overrides merged) and the
settings the hunt chose, and ``[workload] kind = "file"`` naming the request file. Relative
paths in those tables (a profile bundle, say) are written as they were, relative to the hunt
file's folder -- so ``schedlab run <name>.toml`` replays the counterexample, and the
table shows the metrics the objective is made of.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

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


def replay_document(experiment, candidate: Candidate, requests_file: str, *, name: str, columns: list[str]) -> dict:
    """An experiment replaying ``candidate``: every run of the hunt with its resolved tables (the
    file's defaults, the run's own and ``--set`` overrides merged) and the candidate's settings,
    its seed and engine, reading the requests from ``requests_file``."""
    config = experiment.config
    head = {"name": name, "seed": config.seed, "timeline": config.timeline}
    if config.plugins:
        head["plugins"] = list(config.plugins)
    doc = {"experiment": head, "workload": {"kind": "file", "path": requests_file}}
    for key in ("models", "gpus"):
        if key in experiment.raw:
            doc[key] = experiment.raw[key]
    runs = []
    for study in experiment.studies:
        tables = {k: v for k, v in study.base.tables.items() if k != "workload"}
        for key, value in settings_for(study.name, candidate.settings):
            tables = set_dotted(tables, key, value)
        runs.append({"name": study.name, "seed": study.base.seed, "engine": study.base.engine, **tables})
    doc["runs"] = runs
    reports = dict(experiment.raw.get("reports", {}))
    reports["table"] = dict(reports.get("table", {}), columns=columns)
    doc["reports"] = reports
    return doc


def summary_json(payload: dict[str, Any]) -> str:
    def clean(value):
        if isinstance(value, float) and value != value:
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(payload), indent=1) + "\n"


def write_text(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
