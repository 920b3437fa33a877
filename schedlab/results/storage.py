"""Saving results to a folder and reading them back (``schedlab plot DIR`` redraws from these).

Files (each written to a temporary name and renamed, so an interrupted write never leaves a
half file behind and an earlier complete file is only replaced by a complete one; ``schedlab
run`` moreover writes the whole folder aside and swaps it in, see
:mod:`schedlab.results.folder`):

* ``summary.json`` -- experiment, studies, per-run metrics, meta, search and plan outcomes,
  and for replicated runs each metric's 95% interval and every replica's metrics; it holds no
  wall-clock time, so the same experiment gives the same bytes on any executor;
* ``summary.csv`` -- one row per run, metrics flattened (``ttft_ms.p99``) plus swept keys;
* ``requests.csv`` -- one row per request per run with its timestamps and latencies;
* ``timeline.csv`` -- running, waiting and KV blocks over time, per run and instance (and the
  GPUs' energy of each row, in a run with ``[power]``);
* ``requests/<run>.parquet`` (or ``.csv``) -- every request of a run too large to keep in memory
  (past ``[experiment] exact_requests``), written as it ran; ``requests.csv`` has its sample;
* ``config.json`` -- the resolved tables of every run;
* ``timings.json`` -- how long each simulation took and where the experiment ran.

Replicated runs write one row per replica (``name#1``, ``name#2``, ...) in ``requests.csv``
and ``timeline.csv``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

import attrs
import numpy as np

from ..configs import not_regular_file
from ..engine.recorder import TIMELINE
from ..errors import SchedlabError
from .folder import remove_abandoned, staging_prefix, usual_mode
from .metrics import completed, request_latencies
from .records import ExperimentResults, RunResult, Study
from .file_names import UniqueStems, safe_stem
from .stream import SPOOL_PREFIX

REQUEST_COLUMNS = (
    "run", "id", "instance", "request_class", "client", "priority", "arrival_ms", "taken_ms", "first_scheduled_ms",
    "first_token_ms", "finish_ms", "ttft_ms", "tpot_ms", "e2e_ms", "queue_ms", "waiting_ms", "prompt_tokens",
    "output_tokens", "max_tokens", "generated_tokens", "preemptions", "recomputed_tokens", "prefill_chunks",
    "cached_tokens", "swaps", "rejected", "prefill_instance", "kv_bytes", "kv_ready_ms", "kv_pulled_ms",
    "kv_landed_ms", "decode_joined_ms", "energy_j", "sent_ms", "client_first_ms", "client_done_ms", "client_ttft_ms",
    "client_e2el_ms", "aborted", "timed_out", "due_ms", "client_queue_ms", "reason",
)
TIMELINE_COLUMNS = ("run",) + TIMELINE


def atomic_write(path: str | os.PathLike, text: str | bytes) -> None:
    """Write ``path`` completely or not at all (temporary file + rename), with the permissions
    ``open`` would give a new file (``0o666`` less the umask; ``mkstemp`` alone gives ``0o600``).
    The temporary file is ``.<name>.<pid>.<random>.tmp``: one that a process killed mid-write
    left is removed by the next write to ``path``."""
    path = Path(path)
    data = text.encode() if isinstance(text, str) else text
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=staging_prefix(path.name), suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), usual_mode())
            fh.write(data)
        os.replace(tmp, path)
        remove_abandoned(path.parent, [path.name], ".tmp", files=True)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and _names_no_or_a_temporary_file(exc, path):
            exc.filename, exc.filename2 = str(path), None  # a full disk names no file: say which
        raise


def _names_no_or_a_temporary_file(exc: OSError, path: Path) -> bool:
    name = exc.filename
    if name is None:
        return True
    name = os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else ""
    # (mkstemp names the temporary file absolutely: a relative ``path`` named it, not the file)
    return os.path.dirname(os.path.abspath(name)) == os.path.abspath(path.parent) and \
        os.path.basename(name).startswith(f".{path.name}.")


def jsonable(value: Any) -> Any:
    """Numbers, NaN/inf (as null), numpy scalars and attrs objects made JSON-safe."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if attrs.has(type(value)):
        return jsonable(attrs.asdict(value, recurse=False))
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, RunResult):
        return value.name
    return str(value)


def flatten(metrics: dict, prefix: str = "") -> dict[str, Any]:
    """``{"ttft_ms": {"p99": 1}}`` -> ``{"ttft_ms.p99": 1}`` (per-class/instance tables left out)."""
    out = {}
    for key, value in metrics.items():
        if key in ("per_class", "per_instance", "per_client", "rejection_reasons"):
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _search_json(outcome) -> dict | None:
    if outcome is None:
        return None
    return {
        "status": outcome.status,
        "value": jsonable(outcome.value),
        "failing": jsonable(outcome.failing),
        "message": outcome.message,
        "run": outcome.payload.name if outcome.payload is not None else None,
        "probes": [{"value": jsonable(p.value), "holds": bool(p.holds), "run": p.payload.name} for p in outcome.probes],
    }


NOT_IN_SUMMARY = ("rejections", "wall_ms", "cpu_ms")


def _run_json(r: RunResult) -> dict:
    out = {"name": r.name, "point": jsonable(r.point), "metrics": jsonable(r.metrics),
           "meta": jsonable({k: v for k, v in r.meta.items() if k not in NOT_IN_SUMMARY}),
           "counters": jsonable(r.counters)}
    if r.replicas:
        out["intervals"] = jsonable(r.intervals)
        out["replicas"] = [{"name": x.name, "seed": x.meta.get("seed"), "metrics": jsonable(x.metrics),
                            "counters": jsonable(x.counters)} for x in r.replicas]
    return out


def _plan_json(plan) -> dict | None:
    return None if plan is None else jsonable(plan.to_json())


#: How a search's several constraints join into its one ``constraint`` text (as a plan's do).
CONSTRAINT_JOIN = " and "


def constraint_list(text: str) -> list[str]:
    """A study's ``constraint`` text as its conditions: ``"a <= 1 and b <= 2"`` -> ``["a <= 1", "b <= 2"]``
    (a condition is METRIC OP NUMBER, so " and " joins, never appears inside one); ``""`` -> ``[]``."""
    return [part.strip() for part in text.split(CONSTRAINT_JOIN)] if text.strip() else []


def _several_constraints(study) -> bool:
    """A search with several constraints: its summary lists them (``"constraints"``) beside the
    joined text; one constraint's summary stays as it was."""
    return study.kind == "search" and len(constraint_list(study.constraint)) > 1


def summary_dict(results: ExperimentResults) -> dict:
    return {
        "experiment": results.name,
        "source": results.source,
        "reports": jsonable(results.settings.get("reports", {})),
        "studies": [
            {
                "name": s.name, "kind": s.kind, "keys": list(s.keys), "constraint": s.constraint,
                **({"constraints": constraint_list(s.constraint)} if _several_constraints(s) else {}),
                "search": _search_json(s.search),
                **({"plan": _plan_json(s.plan)} if s.plan is not None else {}),
                "runs": [_run_json(r) for r in s.runs],
            }
            for s in results.studies
        ],
    }


def _csv_text(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def _fmt(x) -> Any:
    if isinstance(x, float):
        return "" if math.isnan(x) else repr(x)
    return x


def _point_cell(value) -> Any:
    """A swept value in summary.csv: a table or list as the JSON summary.json holds (not a Python repr)."""
    return json.dumps(jsonable(value)) if isinstance(value, (dict, list, tuple)) else _fmt(value)


def request_rows(run: RunResult):
    r = run.requests
    n = r["id"].size
    ok = completed(r)  # latencies of requests that completed for their clients; NaN for the others
    ttft = np.where(ok, r["first_token_ms"] - r["arrival_ms"], np.nan)
    e2e = np.where(ok, r["finish_ms"] - r["arrival_ms"], np.nan)
    queue = np.where(ok, r["first_scheduled_ms"] - r["arrival_ms"], np.nan)
    many = ok & (r["generated_tokens"] > 1)
    tpot = np.where(many, (r["finish_ms"] - r["first_token_ms"]) / np.maximum(r["generated_tokens"] - 1, 1), np.nan)
    client_ttft = np.where(ok, r["client_first_ms"] - r["sent_ms"], np.nan)
    client_e2el = np.where(ok, r["client_done_ms"] - r["sent_ms"], np.nan)
    taken = r["taken_ms"] if "taken_ms" in r else np.full(n, np.nan)  # (results saved before it was recorded)
    due = r["due_ms"] if "due_ms" in r else r["sent_ms"]   # (results saved before it was recorded)
    client_queue = r["sent_ms"] - due   # (a capped client's wait for a slot)
    cols = [r["id"], r["instance"], r["request_class"], r["client"], r["priority"], r["arrival_ms"], taken,
            r["first_scheduled_ms"], r["first_token_ms"], r["finish_ms"], ttft, tpot, e2e, queue, r["waiting_ms"],
            r["prompt_tokens"], r["output_tokens"], r["max_tokens"], r["generated_tokens"], r["preemptions"],
            r["recomputed_tokens"], r["prefill_chunks"], r["cached_tokens"], r["swaps"], r["rejected"],
            r["prefill_instance"], r["kv_bytes"], r["kv_ready_ms"], r["kv_pulled_ms"], r["kv_landed_ms"],
            r["decode_joined_ms"],
            r["energy_j"], r["sent_ms"], r["client_first_ms"], r["client_done_ms"], client_ttft, client_e2el,
            r["aborted"], r["timed_out"], due, client_queue]
    lists = [c.tolist() for c in cols]
    for i in range(n):
        row = [run.name] + [_fmt(c[i]) for c in lists]
        row.append(run.rejections.get(lists[0][i], ""))
        yield row


def save(results: ExperimentResults, out_dir: str | os.PathLike) -> list[Path]:
    """Write the result files; returns their paths."""
    out = Path(out_dir)
    runs = results.simulated_runs()
    written = []
    path = out / "summary.json"
    atomic_write(path, json.dumps(summary_dict(results), indent=1))
    written.append(path)
    flat = [(s, r, flatten(r.metrics)) for s in results.studies for r in s.runs]
    keys: list[str] = []
    point_keys: list[str] = []
    for _, r, f in flat:
        keys += [k for k in f if k not in keys]
        point_keys += [k for k in r.point if k not in point_keys]
    rows = [[s.name, r.name] + [_point_cell(r.point.get(k, "")) for k in point_keys]
            + [_fmt(f.get(k, "")) for k in keys] for s, r, f in flat]
    path = out / "summary.csv"
    atomic_write(path, _csv_text(["study", "run"] + point_keys + keys, rows))
    written.append(path)
    path = out / "requests.csv"
    atomic_write(path, _csv_text(REQUEST_COLUMNS, (row for r in runs for row in request_rows(r))))
    written.append(path)
    path = out / "timeline.csv"
    atomic_write(path, _csv_text(TIMELINE_COLUMNS, (
        [r.name] + [_fmt(float(r.timeline[c][i])) for c in TIMELINE_COLUMNS[1:]]
        for r in runs for i in range(r.timeline.get("time_ms", np.empty(0)).size))))
    written.append(path)
    written += save_streamed_rows(runs, out)
    path = out / "config.json"
    atomic_write(path, json.dumps(jsonable({r.name: r.settings for r in results.all_runs()}), indent=1))
    written.append(path)
    path = out / "timings.json"
    atomic_write(path, json.dumps(jsonable({"execution": results.execution,
                                            "wall_ms": {r.name: r.meta.get("wall_ms") for r in runs},
                                            "cpu_ms": {r.name: r.meta.get("cpu_ms") for r in runs}}), indent=1))
    written.append(path)
    return written


def rows_file_name(run_name: str, suffix: str, stems: UniqueStems | None = None) -> str:
    """The file, in a results folder's ``requests/``, of a streamed run's every request: the run's
    name made safe and short (:mod:`.file_names`), unique among ``stems`` given so far."""
    stem = safe_stem(run_name)
    return (stems.take(stem) if stems is not None else stem) + suffix


def save_streamed_rows(runs: list[RunResult], out: Path) -> list[Path]:
    """Put each streamed run's file of rows (see :mod:`schedlab.results.stream`) into
    ``requests/``; ``requests.csv`` holds only its sample. A file still in the spool (a run's
    rows can be gigabytes) is moved, not copied, and the run points at its new place; one
    already in a results folder is copied. Either gets the usual permissions (0666 less the umask)."""
    written = []
    stems = UniqueStems()
    for run in runs:
        if run.rows_file and os.path.exists(run.rows_file):
            source = Path(run.rows_file)
            path = out / "requests" / rows_file_name(run.name, source.suffix, stems)
            if source.resolve() == path.resolve():
                written.append(path)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            if source.name.startswith(SPOOL_PREFIX):
                shutil.move(source, tmp)  # a rename within one file system
                run.rows_file = str(path)
            else:
                shutil.copyfile(source, tmp)
            os.chmod(tmp, usual_mode())  # as every result file (a spool file is made 0600)
            os.replace(tmp, path)
            written.append(path)
    return written


# -- reading back -------------------------------------------------------------------------------------


def repeated_column(path, header: Sequence[str], names: Iterable[str] | None = None) -> str | None:
    """The message for a column of ``header`` named twice, or None: the first name among
    ``names`` (default: any) found a second time. Which of the two to read would be a guess, so
    every CSV reader refuses such a file with this message (results folders, request files,
    profile bundles)."""
    wanted = None if names is None else set(names)
    seen: dict[str, int] = {}
    for i, column in enumerate(header):
        if wanted is not None and column not in wanted:
            continue
        if column in seen:
            return (f"{path}: the header names column {column!r} twice (columns {seen[column] + 1} and {i + 1}): "
                    f"which one to read is ambiguous; rename or remove one")
        seen[column] = i
    return None


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    problem = not_regular_file(path)  # a FIFO would block, a device never end (as summary.json's)
    if problem:
        raise SchedlabError(f"{path}: {problem}")
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise SchedlabError(f"{path}: empty, not even its header row; is the folder complete?")
        problem = repeated_column(path, header)
        if problem:
            raise SchedlabError(problem)
        return header, list(reader)


def _columns(path: Path, header: list[str], needed: tuple[str, ...]) -> dict[str, int]:
    """Each column's position by its name; a column :func:`load` needs that the header lacks is
    named (an edited file), rather than read as the wrong one."""
    index = {name: i for i, name in enumerate(header)}
    missing = [name for name in needed if name not in index]
    if missing:
        raise SchedlabError(f"{path}: no column {', '.join(map(repr, missing))} in its header; was it edited? "
                            "(run the experiment again to rewrite it)")
    return index


def _num(text: str, kind) -> Any:
    if text == "":
        return float("nan") if kind is float else 0
    return kind(text)


#: The layout of summary.json that :func:`load` relies on: required key -> type, per level.
SUMMARY_LAYOUT = {
    "summary": {"experiment": str, "studies": list},
    "study": {"name": str, "kind": str, "runs": list},
    "run": {"name": str, "metrics": dict},
    "replica": {"name": str, "metrics": dict},
    "search": {"status": str, "message": str, "probes": list},
    "probe": {"holds": bool},
}


#: Keys :func:`load` reads when present: key -> type, per level (a run's ``"meta": null`` is refused).
SUMMARY_OPTIONAL = {
    "study": {"constraints": list},
    "run": {"point": dict, "meta": dict, "counters": dict, "intervals": dict, "replicas": list},
    "replica": {"counters": dict},
}
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "true or false", type(None): "null",
               int: "a number", float: "a number"}


def summary_problem(data: Any) -> str | None:
    """What keeps ``data`` from being a summary.json :func:`load` can read, or None."""
    def problem(node, level: str, where: str) -> str | None:
        if not isinstance(node, dict):
            return f"{where} is {type(node).__name__}, not an object"
        for key, kind in SUMMARY_LAYOUT[level].items():
            if not isinstance(node.get(key), kind):
                return f"{where} has no {key!r} ({kind.__name__})"
        for key, kind in SUMMARY_OPTIONAL.get(level, {}).items():
            if key in node and not isinstance(node[key], kind):
                return f"{where}.{key} is {_JSON_KINDS.get(type(node[key]), type(node[key]).__name__)}, " \
                       f"not {_JSON_KINDS[kind]}"
        if level == "run":
            for k, replica in enumerate(node.get("replicas", ())):
                found = problem(replica, "replica", f"{where}.replicas[{k}]")
                if found:
                    return found
        return None

    found = problem(data, "summary", "the file")
    for i, study in enumerate(data["studies"] if found is None else ()):
        found = found or problem(study, "study", f"studies[{i}]")
        if found:
            break
        for j, run in enumerate(study["runs"]):
            found = found or problem(run, "run", f"studies[{i}].runs[{j}]")
        if study.get("plan") is not None and not isinstance(study["plan"], dict) and not found:
            found = f"studies[{i}].plan is {_JSON_KINDS.get(type(study['plan']), type(study['plan']).__name__)}, " \
                    "not an object"
        keys = study.get("keys", [])
        if not found and not (isinstance(keys, list) and all(isinstance(key, str) for key in keys)):
            found = f"studies[{i}].keys is not a list of setting names (text)"
        if study.get("search") is not None and not found:
            found = problem(study["search"], "search", f"studies[{i}].search") or \
                _values_problem(study["search"], ("value", "failing"), f"studies[{i}].search")
            for k, probe in enumerate(study["search"]["probes"] if not found else ()):
                found = found or problem(probe, "probe", f"studies[{i}].search.probes[{k}]") or \
                    _values_problem(probe, ("value",), f"studies[{i}].search.probes[{k}]", run=True)
        if found:
            break
    return found


def _values_problem(node: dict, keys: tuple, where: str, run: bool = False) -> str | None:
    """A search's (or probe's) ``keys`` that are not a number or null, or (``run``) its ``run`` that
    is no run's name: the plots drew them, and a text value failed there as a plugin's bug."""
    for key in keys:
        value = node.get(key, "absent")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{where}.{key} is {_JSON_KINDS.get(type(value), 'absent')}, not a number or null" \
                if value != "absent" else f"{where} has no {key!r} (a number or null)"
    if run and not isinstance(node.get("run"), str):
        return f"{where}.run is not a run's name (text)"
    return None


def _read_summary(out: Path) -> dict:
    path = out / "summary.json"
    problem = not_regular_file(path)  # a FIFO would block, a device never end
    if problem:
        raise SchedlabError(f"{path}: {problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if (out / "hunt.json").is_file():
            raise SchedlabError(f"{out}: a hunt's results folder (hunt.json): schedlab plot redraws an experiment's "
                                "results; the hunt's figures are in it (run the hunt again to redraw them)") from None
        if (out / "summary.txt").is_file() or (out / "index.html").is_file():  # (reports listed without json)
            raise SchedlabError(f"{out}: no summary.json here: the experiment was run without the json report, "
                                "which writes it; add \"json\" to [experiment] reports (or --report json) and run "
                                "it again") from None
        raise SchedlabError(f"{out}: no summary.json here; run an experiment with --out {out} first") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SchedlabError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        summary = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchedlabError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno}); is it cut short or "
                            "from another program?") from None
    except RecursionError:
        raise SchedlabError(f"{path}: not a schedlab summary.json: lists or objects nested too deeply "
                            "to read") from None
    found = summary_problem(summary)
    if found:
        raise SchedlabError(f"{path}: not a schedlab summary.json: {found}")
    return summary


def load(out_dir: str | os.PathLike) -> ExperimentResults:
    """Read saved results back (metrics, per-request rows and timelines; not ITL runs).

    :raises SchedlabError: a file is missing, cut short or not one schedlab wrote.
    """
    out = Path(out_dir)
    summary = _read_summary(out)
    try:
        return _load(out, summary)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, IndexError, TypeError) as exc:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        where = getattr(exc, "filename", None) or out
        raise SchedlabError(f"{where}: cannot read the saved results ({what}); is the folder complete?") from None


def _load(out: Path, summary: dict) -> ExperimentResults:
    floats = ("arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms", "waiting_ms")
    ints = ("id", "instance", "priority", "prompt_tokens", "output_tokens", "max_tokens", "generated_tokens",
            "preemptions", "recomputed_tokens", "prefill_chunks", "cached_tokens", "swaps", "rejected")
    header, rows = _read_csv(out / "requests.csv")
    index = _columns(out / "requests.csv", header, ("run", *floats, *ints, "request_class", "client", "reason"))
    by_run: dict[str, list[list[str]]] = {}
    for row in rows:   # (by the header's names: a spreadsheet may have reordered the columns)
        by_run.setdefault(row[index["run"]], []).append(row)
    t_header, t_rows = _read_csv(out / "timeline.csv") if (out / "timeline.csv").exists() else ([], [])
    t_index = _columns(out / "timeline.csv", t_header, ("run",)) if t_header else {}
    t_by_run: dict[str, list[list[str]]] = {}
    for row in t_rows:
        t_by_run.setdefault(row[t_index["run"]], []).append(row)
    transfer = {"prefill_instance": (int, -1), "kv_bytes": (int, 0), "kv_pulled_ms": (float, -1.0),
                "kv_landed_ms": (float, -1.0), "decode_joined_ms": (float, -1.0),  # absent in older results
                "energy_j": (float, 0.0), "aborted": (int, 0), "timed_out": (int, 0),
                "taken_ms": (float, math.nan)}  # (older results: when the loop took it is not known)
    client_view = {"sent_ms": "arrival_ms", "client_first_ms": "first_token_ms", "client_done_ms": "finish_ms"}

    def saved_run(name: str, metrics: dict, counters: dict, meta: dict, point: dict) -> RunResult:
        try:
            req, rejections = saved_requests(name)
        except (ValueError, IndexError) as exc:
            raise SchedlabError(f"{out / 'requests.csv'}: run {name!r}: a row that does not read ({exc}); is the "
                                "file complete, and one schedlab wrote?") from None
        trows = t_by_run.get(name, [])
        try:
            timeline = {c: np.array([_num(r[t_index[c]], float) for r in trows], dtype=float)
                        for c in TIMELINE_COLUMNS[1:] if c in t_index}  # older folders lack the slice columns
        except (ValueError, IndexError) as exc:
            raise SchedlabError(f"{out / 'timeline.csv'}: run {name!r}: a row that does not read ({exc}); is the "
                                "file complete, and one schedlab wrote?") from None
        return RunResult(name, {}, req, counters, {}, timeline, rejections, meta, _restore_nan(metrics), point)

    read: set = set()  # the runs whose rows summary.json lists

    def saved_requests(name: str) -> tuple[dict, dict]:
        read.add(name)
        rrows = by_run.get(name, [])
        req = {c: np.array([_num(r[index[c]], float) for r in rrows], dtype=float) for c in floats}
        req.update({c: np.array([_num(r[index[c]], int) for r in rrows], dtype=np.int64) for c in ints})
        for c, (kind, missing) in transfer.items():
            values = [_num(r[index[c]], kind) if c in index else missing for r in rrows]
            req[c] = np.array(values, dtype=float if kind is float else np.int64)
        if "kv_ready_ms" not in index:  # older results: handed over with the first token (DistServe's flow)
            done = (req["kv_pulled_ms"] >= 0) | ((req["prefill_instance"] >= 0) & (req["generated_tokens"] > 0))
            req["kv_ready_ms"] = np.where(done, req["first_token_ms"], -1.0)
        for c, engine_column in client_view.items():  # older results: the engine's times (no front end)
            req[c] = (np.array([_num(r[index[c]], float) for r in rrows], dtype=float) if c in index
                      else req[engine_column].copy())
        req["due_ms"] = (np.array([_num(r[index["due_ms"]], float) for r in rrows], dtype=float)
                         if "due_ms" in index else req["sent_ms"].copy())   # (older results: sent when due)
        for c in ("request_class", "client"):
            req[c] = np.array([r[index[c]] for r in rrows], dtype=object)
        rejections = {int(r[index["id"]]): r[index["reason"]] for r in rrows if r[index["reason"]]}
        return req, rejections

    studies = []
    for s in summary["studies"]:
        runs = []
        for rj in s["runs"]:
            meta, point = _restore_nan(rj.get("meta", {})), rj.get("point", {})
            replicas = [saved_run(x["name"], x["metrics"], x.get("counters", {}), dict(meta, seed=x.get("seed")), point)
                        for x in rj.get("replicas", ())]
            run = saved_run(rj["name"], rj["metrics"], rj.get("counters", {}), meta, point)
            if replicas:  # per-request rows and timeline of the first replica, as in a fresh run
                first = replicas[0]
                run = attrs.evolve(run, requests=first.requests, timeline=first.timeline, rejections=first.rejections,
                                   intervals={k: [math.nan if v is None else v for v in pair]
                                              for k, pair in rj.get("intervals", {}).items()},
                                   replicas=replicas)
            runs.append(run)
        outcome = None
        if s.get("search"):
            outcome = _SavedSearch.from_json(s["search"], {r.name: r for r in runs})
        plan = None
        if s.get("plan"):
            from ..study.planner import SavedPlan

            plan = SavedPlan.from_json(s["plan"])
        constraint = s.get("constraint") or CONSTRAINT_JOIN.join(s.get("constraints", ()))
        studies.append(Study(s["name"], s["kind"], runs, tuple(s.get("keys", ())), outcome, constraint, plan))
    unlisted = [name for name in by_run if name not in read]
    if unlisted:  # (a summary.json of no runs drew 0 plots beside 200 rows, and said nothing)
        raise SchedlabError(f"{out / 'requests.csv'}: has rows of run {unlisted[0]!r}"
                            f"{f' (and {len(unlisted) - 1} more)' if len(unlisted) > 1 else ''}, which summary.json "
                            "does not list; are the two files of one run? (run the experiment again to rewrite them)")
    results = ExperimentResults(summary["experiment"], summary.get("source", ""), studies,
                                {"reports": summary.get("reports", {})})
    short = short_run(results)
    if short is not None:
        name, rows, expected = short
        raise SchedlabError(f"{out / 'requests.csv'}: has {rows} rows of run {name!r}, but summary.json counts "
                            f"{expected} requests; is the file cut short? (run the experiment again to rewrite it)")
    return results


def short_run(results: ExperimentResults) -> tuple[str, int, int] | None:
    """``(run, rows, requests)`` of the first run whose rows read back from requests.csv are not
    the requests its summary counts (a file cut short), or None. A run past ``exact_requests``
    keeps only a sample there (``meta["requests_sampled"]``), so it is not checked."""
    for run in results.simulated_runs():
        expected = run.metrics.get("requests")
        if "requests_sampled" in run.meta or isinstance(expected, bool) or not isinstance(expected, int):
            continue
        rows = int(run.requests["id"].size)
        if rows != expected:
            return run.name, rows, expected
    return None


def _restore_nan(value):
    if isinstance(value, dict):
        return {k: _restore_nan(v) for k, v in value.items()}
    if value is None:
        return float("nan")
    return value


@attrs.frozen
class _SavedProbe:
    value: Any
    holds: bool
    payload: Any


@attrs.frozen
class _SavedSearch:
    """A search outcome read back from summary.json (same fields the reports use)."""

    status: str
    value: Any
    failing: Any
    message: str
    probes: tuple
    payload: Any = None

    @classmethod
    def from_json(cls, data: dict, runs: dict[str, RunResult]) -> "_SavedSearch":
        probes = tuple(_SavedProbe(p["value"], p["holds"], runs.get(p["run"])) for p in data["probes"])
        return cls(data["status"], data["value"], data["failing"], data["message"], probes,
                   runs.get(data.get("run")))


def latencies(run: RunResult) -> dict[str, np.ndarray]:
    """Per finished request latencies of a run (saved or fresh)."""
    return request_latencies(run.requests)
