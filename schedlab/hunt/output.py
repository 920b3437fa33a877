"""What a hunt leaves behind: request files, experiment files that replay them, and a summary.

``<name>.jsonl`` holds the requests, one JSON object per line, in a request file's fields
(``file`` workload). ``<name>.toml`` is the hunt file without ``[hunt]``: the same runs,
the settings the hunt chose written into each run, and ``[workload] kind = "file"`` naming
the request file -- so ``schedlab run <name>.toml`` replays the counterexample, and the
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


def replay_document(raw: dict, candidate: Candidate, requests_file: str, *, name: str, runs: list[str],
                    columns: list[str]) -> dict:
    """The hunt file's tables with ``[hunt]`` dropped, the candidate's settings written into every
    run they apply to, and a ``file`` workload reading ``requests_file``."""
    doc = {k: v for k, v in raw.items() if k not in ("hunt", "workload")}
    doc["experiment"] = dict(raw.get("experiment", {}), name=name)
    entries = [dict(e) for e in raw.get("runs", [{}])] or [{}]
    for i, (entry, run) in enumerate(zip(entries, runs)):
        entry["name"] = run  # as the hunt named it, whatever the new experiment name
        for key, value in settings_for(run, candidate.settings):
            entry = set_dotted(entry, key, value)
        entries[i] = entry
    doc["runs"] = entries
    workload = {"kind": "file", "path": requests_file}
    doc = {"experiment": doc.pop("experiment"), "workload": workload, **doc}
    reports = dict(doc.get("reports", {}))
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
