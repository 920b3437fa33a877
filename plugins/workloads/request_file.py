"""The ``file`` workload: requests listed in a JSON, JSONL or CSV file.

Each row is one request with ``prompt_tokens`` and ``output_tokens`` and optionally
``arrival_ms``, ``max_tokens``, ``priority``, ``client``, ``request_class`` (or ``class``),
``prefix_group`` and ``prefix_tokens`` (given together: a row with one but not the other is
refused, naming its line, as it would share nothing). A ``columns`` table renames them for files that use
other names::

    [workload]
    kind = "file"
    path = "requests.json"              # or .jsonl / .csv; `format` overrides the extension
    columns = {prompt_tokens = "ContextTokens", output_tokens = "GeneratedTokens"}
    arrival = "poisson"                 # "file" (default) | "all-at-once" | "poisson" | "gamma" | "constant"
    rate = 10                           # poisson, gamma and constant only (cv: gamma only)

With ``arrival = "file"`` the file's ``arrival_ms`` are used as they are (times ``time_scale``,
which is refused with any other arrival, as a ``rate`` with ``"file"`` is);
a file without ``arrival_ms`` sends everything at t = 0. Rows whose arrivals are out of order
are sorted (stably) and numbered in arrival order. A ``rate`` with ``"file"`` or
``"all-at-once"``, or a ``cv`` with another arrival than ``"gamma"``, cannot take effect and is
refused (a sweep over it would give identical runs). Arrival times past the simulated clock's
end (1e12 ms) are refused where the file is read, naming the line.

The rows hold token counts. A ShareGPT-style JSON file (records with a ``conversations`` list of
``{"from", "value"}`` turns, as vLLM's ``ShareGPTDataset`` reads) holds the conversations' text,
and schedlab does not tokenize: such a file is refused saying so (:data:`SHAREGPT_HINT`). Its
lengths come tokenized in a length-statistics CSV such as Etalon's
``etalon_sharegpt_8k_filtered_stats_llama2_tokenizer.csv`` (ShareGPT through Llama-2's tokenizer;
in ``../shared/traces`` when that folder is beside the checkout): read as requests with ``columns = {prompt_tokens = "num_prefill_tokens",
output_tokens = "num_decode_tokens"}`` (each row's pair kept), or drawn with ``dist =
"empirical"`` (:mod:`.distributions`).
"""

from __future__ import annotations

import re
import zlib
from typing import Mapping

import attrs
import numpy as np

from schedlab.configs import (
    MAX_TIME_MS, MAX_TOKENS, FieldError, float_field, int_field, path_field, str_field, table_field,
)
from schedlab.errors import WorkloadError

from .arrivals import arrivals_ms, check_arrival_settings, cv_field, gap_cv, rate_field
from .columns import CLOCK_END, OpenLoopWorkload, RequestColumns, check_replayed_arrivals, per_row_or_none, scaled
from .fast_text import AbsentField
from .records import FORMATS, Records, open_text, read_records, records_from_rows

#: Fields a request file may have, with the names looked up when ``columns`` does not say.
FILE_FIELDS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("prompt_tokens",),
    "output_tokens": ("output_tokens",),
    "arrival_ms": ("arrival_ms",),
    "max_tokens": ("max_tokens",),
    "priority": ("priority",),
    "client": ("client",),
    "request_class": ("request_class", "class"),
    "prefix_group": ("prefix_group",),
    "prefix_tokens": ("prefix_tokens",),
}
REQUIRED_FIELDS = ("prompt_tokens", "output_tokens")
FILE_ARRIVALS = ("file", "all-at-once", "poisson", "gamma", "constant")


def check_columns(columns: Mapping | None) -> None:
    """Raise FieldError unless ``columns`` maps known field names to file column names."""
    if columns is None:
        return
    for ours, theirs in columns.items():
        if ours not in FILE_FIELDS:
            raise FieldError("columns", f"unknown field {ours!r}; valid fields: {', '.join(FILE_FIELDS)}")
        if not isinstance(theirs, str) or not theirs:
            raise FieldError("columns", f"{ours}: the file's column name must be non-empty text, got {theirs!r}")


def _wanted(columns: Mapping[str, str] | None) -> dict[str, tuple[str, ...]]:
    return {field: ((columns[field],) if columns and field in columns else names)
            for field, names in FILE_FIELDS.items()}


#: What a ShareGPT-style file is told: it holds text, and where its token counts are.
SHAREGPT_HINT = ("; it looks like ShareGPT-style JSON (a conversations list of turns), which holds the "
                 "conversations' text, not token counts, and schedlab does not tokenize: tokenize it into "
                 "prompt_tokens and output_tokens first, or use a length-statistics CSV of ShareGPT such as Etalon's "
                 "etalon_sharegpt_8k_filtered_stats_llama2_tokenizer.csv (Llama-2 tokenizer; in ../shared/traces "
                 'when that folder is beside the checkout), with columns = {prompt_tokens = "num_prefill_tokens", output_tokens = '
                 '"num_decode_tokens"}, or as dist = "empirical" lengths of a synthetic workload')


def _looks_like_sharegpt(path) -> bool:
    """Whether a file's first record (in its first 64 KiB) has a ``conversations`` list: ShareGPT's layout."""
    try:
        with open_text(path) as handle:
            head = handle.read(1 << 16)
    except (OSError, UnicodeDecodeError, EOFError, zlib.error):
        return False
    return re.search(r'"conversations"\s*:\s*\[', head) is not None


def read_request_file(path, *, format: str | None = None, columns: Mapping[str, str] | None = None,
                      limit: int | None = None) -> Records:
    """The rows of a request file, with ``columns`` renaming our fields to the file's. A required
    field the file has under no name looked up says how to name the file's own (``columns``), or,
    for a ShareGPT-style file, that it holds text (:data:`SHAREGPT_HINT`)."""
    hint = ('; a file that names it otherwise takes columns = {prompt_tokens = "<its column>", '
            'output_tokens = "<its column>"} in [workload]')
    try:
        records = read_records(path, _wanted(columns), format=format, required=REQUIRED_FIELDS, limit=limit)
    except AbsentField as exc:
        raise WorkloadError(f"{exc}{SHAREGPT_HINT if _looks_like_sharegpt(path) else hint}") from None
    if len(records) == 0:
        raise WorkloadError(f"{path}: no requests in the file")
    return records


def request_columns(records: Records) -> RequestColumns:
    """Checked columns of every Request field the file has (arrival times excluded)."""
    prompt = records.ints("prompt_tokens", min=1, max=MAX_TOKENS)
    output = records.ints("output_tokens", min=1, max=MAX_TOKENS)
    per_row: dict[str, list] = {}
    optional = {
        "max_tokens": records.optional_ints("max_tokens", min=1, max=MAX_TOKENS),
        "priority": records.optional_ints("priority", min=-(2**62)),
        "client": records.texts("client"),
        "request_class": records.texts("request_class"),
        "prefix_group": records.keys("prefix_group"),
        "prefix_tokens": records.optional_ints("prefix_tokens", min=0, max=MAX_TOKENS),
    }
    for field, values in optional.items():
        values = per_row_or_none(values, field)
        if values is not None:
            per_row[field] = values
    if "prefix_tokens" in per_row:
        too_long = np.flatnonzero(np.asarray(per_row["prefix_tokens"]) > prompt)
        if too_long.size:
            row = int(too_long[0])
            raise WorkloadError(
                f"{records.where(row)}: {records.label('prefix_tokens')}: must be <= prompt_tokens "
                f"({prompt[row]}), got {per_row['prefix_tokens'][row]}"
            )
    _check_prefix_pairs(records, optional["prefix_group"], optional["prefix_tokens"])
    return RequestColumns(prompt, output, per_row)


def _check_prefix_pairs(records: Records, groups: list | None, tokens: list | None) -> None:
    """WorkloadError naming the first row with a ``prefix_group`` but no ``prefix_tokens``, or
    ``prefix_tokens`` > 0 but no ``prefix_group``: either alone shares nothing (a row with
    prefix_tokens = 0 and no group, as a run's unshared requests are written, is fine)."""
    n = len(records)
    groups = [None] * n if groups is None else groups
    tokens = [None] * n if tokens is None else tokens
    for row, (group, count) in enumerate(zip(groups, tokens)):
        if group is not None and count is None:
            raise WorkloadError(
                f"{records.where(row)}: {records.label('prefix_group')} {group!r} without "
                f"{records.label('prefix_tokens')}: the group shares its first prefix_tokens tokens, so give how "
                "many (or leave out prefix_group)")
        if group is None and count:
            raise WorkloadError(
                f"{records.where(row)}: {records.label('prefix_tokens')} {count} without "
                f"{records.label('prefix_group')}: the tokens are shared with the requests of the same group, so "
                "name it (or leave out prefix_tokens)")


def file_arrivals_ms(records: Records) -> np.ndarray | None:
    """The file's ``arrival_ms`` column, or None when no row has one (a row lacking it when
    others have it is an error); each from 0 to the simulated clock's end (1e12 ms)."""
    if not records.has("arrival_ms"):
        return None
    try:
        return records.floats("arrival_ms", min=0.0, max=MAX_TIME_MS, why=f"ms: {CLOCK_END}")
    except WorkloadError as exc:
        if str(exc).endswith("missing arrival_ms"):  # (some rows have one: all or none)
            raise WorkloadError(f"{exc} (other requests have one: give every request arrival_ms, or none for all "
                                "at t = 0)") from None
        raise


@attrs.frozen
class FileConfig:
    path: str = path_field(help="request file: .json (a list, or {\"requests\": [...]}), .jsonl or .csv")
    format: str | None = str_field(None, choices=FORMATS, optional=True,
                                   help="file format when the extension does not tell: json, jsonl or csv")
    columns: dict | None = table_field(None, help="our field name -> the file's column name, e.g. "
                                                  "{prompt_tokens = \"ContextTokens\"}")
    arrival: str = str_field("file", choices=FILE_ARRIVALS,
                             help="'file' (the file's arrival_ms, or all at t=0 without them), "
                                  "'all-at-once', 'poisson', 'gamma' or 'constant' (these three need rate)")
    rate: float | None = rate_field()
    cv: float | None = cv_field()
    max_tokens: int | None = int_field(None, min=1, max=MAX_TOKENS, optional=True,
                                       help="cap on every request's max_tokens (the client's length limit)")
    limit: int | None = int_field(None, min=1, optional=True, help="use only the first N requests of the file")
    time_scale: float | None = float_field(None, min=0, min_exclusive=True, optional=True,
                                           help="with arrival = 'file' only: multiply every arrival time of the file "
                                                "(and so every gap) by this (default 1)")

    def __attrs_post_init__(self) -> None:
        check_columns(self.columns)
        check_arrival_settings(self.arrival, self.rate, self.cv)
        if self.time_scale is not None and self.arrival != "file":   # (refused as a rate with all-at-once is)
            why = ("every request arrives at t = 0" if self.arrival == "all-at-once" else
                   "the arrivals are drawn at the rate (time_scale = 2 would halve it: set rate instead)")
            raise FieldError("time_scale", f"only applies with arrival = 'file' (it stretches the file's arrival_ms), "
                                           f"not {self.arrival!r}: {why}")


def make_file_workload(config: FileConfig) -> OpenLoopWorkload:
    """Read the file now (so errors show before the run) and serve its requests."""
    records = read_request_file(config.path, format=config.format, columns=config.columns, limit=config.limit)
    columns = request_columns(records).with_max_tokens_cap(config.max_tokens)
    from_file = file_arrivals_ms(records)
    time_scale = 1.0 if config.time_scale is None else config.time_scale
    if config.arrival == "file":
        check_replayed_arrivals(config.path, from_file, time_scale)
    n = len(columns)

    def build(seed: int):
        if config.arrival == "file":
            arrival = from_file if from_file is not None else np.zeros(n)
        else:
            arrival = arrivals_ms(config.arrival, n, seed, rate=config.rate, cv=gap_cv(config.cv))
        if time_scale != 1.0:
            arrival = scaled(arrival, time_scale)
        return arrival, columns

    return OpenLoopWorkload(build, name="file", num_requests=n)


# --- inline -------------------------------------------------------------------------------


@attrs.frozen
class InlineConfig:
    """Requests written in the experiment itself, one table each, with a request file's fields
    (``schedlab hunt`` evaluates its candidate workloads this way: they travel with the run to
    worker processes and Ray nodes, where no file of the parent's exists)."""

    requests: tuple = attrs.field(converter=lambda v: tuple(v) if isinstance(v, list) else v,
                                  metadata={"help": "the requests: [{prompt_tokens = 100, output_tokens = 20, "
                                                    "arrival_ms = 0.0}, ...] with a request file's fields "
                                                    "(arrival_ms in every one, or in none: all at t = 0)"})

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.requests, tuple) or not self.requests:
            raise FieldError("requests", "needs at least one request table, e.g. [{prompt_tokens = 100, "
                                         "output_tokens = 20}]")
        for number, row in enumerate(self.requests, start=1):
            if not isinstance(row, dict):
                raise FieldError("requests", f"request {number} must be a table, got {row!r}")
            unknown = sorted(set(row) - {name for names in FILE_FIELDS.values() for name in names})
            if unknown:
                raise FieldError("requests", f"request {number}: unknown field {unknown[0]!r}; valid fields: "
                                             f"{', '.join(FILE_FIELDS)}")


def make_inline_workload(config: InlineConfig) -> OpenLoopWorkload:
    """The listed requests, at their ``arrival_ms`` (every request has one, or none: all at t = 0)."""
    records = records_from_rows("requests", config.requests, _wanted(None), REQUIRED_FIELDS)
    columns = request_columns(records)
    from_rows = file_arrivals_ms(records)
    n = len(columns)
    arrival = from_rows if from_rows is not None else np.zeros(n)
    return OpenLoopWorkload(lambda seed: (arrival, columns), name="inline", num_requests=n)
