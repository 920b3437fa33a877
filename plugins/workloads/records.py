"""Read rows of a request file (JSON, JSONL or CSV) and turn their columns into checked arrays.

Every file-based workload (``file``, ``azure``, ``vidur``, ``mooncake``, ``closed_loop`` and the
``empirical`` length distribution) reads through :func:`read_records`, so they all accept the
same formats and report bad input the same way: a :class:`~schedlab.errors.WorkloadError`
naming the file, the line (CSV, JSONL) or record (JSON), and the field.

Fields are named by *our* names (``prompt_tokens``, ...); ``wanted`` maps each to the names it
may have in the file (the first one present is used), which is how a ``columns`` table such
as ``{prompt_tokens = "ContextTokens"}`` takes effect.

JSONL and CSV files are read by pyarrow (:mod:`.arrow_text`) when they are well-formed, else by
the vectorised numpy readers of :mod:`.fast_text`, which hand anything unusual to the row-by-row
Python readers below (these also read JSON files). The fast readers only read files whose
values they get exactly as the Python readers would and give way otherwise, so every file gives
the same rows, values and errors whichever reads it (``read_records(..., reader="numpy")`` or
``reader="python"`` skip the faster ones; the tests compare all three).
A column read by them is a :class:`~.fast_text.RawColumn` (or its subclass
:class:`~.arrow_text.ArrowColumn`), which the conversions below turn into arrays in bulk,
converting in Python only the values that cannot be read exactly at once; the checks (and their
messages) are the same for every reader.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import warnings
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs
import numpy as np

from schedlab.configs import MAX_FLOAT_INT, bound_text, not_regular_file
from schedlab.errors import InputWarning, WorkloadError
from schedlab.json_text import (UTF16_ADVICE, JsonTextError, cut_short_note, documents_before_break, json_documents,
                                looks_utf16, unreadable_json)

from .arrow_text import read_csv_arrow, read_jsonl_arrow
from .fast_text import (
    FLOAT, INT, NONE, STR, AbsentField, RawColumn, csv_columns, read_csv_fast, read_jsonl_fast,
)

FORMATS = ("json", "jsonl", "csv")
READERS = ("arrow", "numpy", "python")
_EXTENSIONS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
_COMPRESSED = (".gz", ".gzip")
INT64_MAX = int(np.iinfo(np.int64).max)
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str | os.PathLike) -> bool:
    """True when the file starts with gzip's magic bytes (1f 8b), whatever its name."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:   # missing, a folder...: the reader that opens it says so
        return False


def file_suffix(path: str | os.PathLike) -> str:
    """The extension that tells the format, lower case: ``.csv`` for ``trace.csv.gz`` too."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in _COMPRESSED:
        suffix = Path(path.stem).suffix.lower()
    return suffix


def read_file_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of ``path``, decompressed when it is gzip; OSError, EOFError (a cut-off gzip
    stream) or zlib.error as the file system or the decompressor raise them (see
    :func:`gzip_problem`)."""
    with open(path, "rb") as raw:
        data = raw.read()
    return gzip.decompress(data) if data[:2] == GZIP_MAGIC else data


#: how a Git LFS pointer file begins (what a clone without ``git lfs`` holds in place of the data)
LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def check_not_lfs_pointer(path: str | os.PathLike) -> None:
    """WorkloadError naming ``path`` when it is a Git LFS pointer (a few lines naming the data's
    hash) rather than the data: the clone's LFS files were never fetched."""
    problem = not_regular_file(path)
    if problem and "NUL" in problem:  # (open() raises a bare ValueError: review s81 badinput, 4)
        raise WorkloadError(f"path {os.fsdecode(path)!r} {problem}")
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(LFS_POINTER))
    except OSError:   # missing, a folder...: the reader that opens it says so
        return
    if head == LFS_POINTER:
        raise WorkloadError(f"{path}: this is a Git LFS pointer, not the data: run git lfs pull in its clone "
                            f"(or download the file itself)")


def open_text(path: str | os.PathLike):
    """``path`` open as UTF-8 text (a leading byte order mark skipped, newlines kept as written for
    the csv module), decompressed on the fly when it is gzip."""
    if is_gzip(path):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def gzip_problem(name: str, exc: BaseException) -> WorkloadError:
    """The WorkloadError for a gzip file that does not decompress: cut off, or damaged."""
    what = "cut off before its end" if isinstance(exc, EOFError) else f"damaged ({exc})"
    return WorkloadError(f"{name}: gzip file {what}; check it with gunzip -t")


def detect_format(path: str | os.PathLike, format: str | None = None) -> str:
    """The file format: ``format`` if given, else from the extension (.json, .jsonl/.ndjson, .csv;
    a further .gz is skipped)."""
    if format is not None:
        if format not in FORMATS:
            raise WorkloadError(f"{path}: unknown format {format!r}; use one of {', '.join(FORMATS)}")
        return format
    suffix = file_suffix(path)
    try:
        return _EXTENSIONS[suffix]
    except KeyError:
        raise WorkloadError(
            f"{path}: cannot tell the format from the extension {suffix or '(none)'!r}; "
            f"set format = one of {', '.join(map(repr, FORMATS))}"
        ) from None


def _number_text(value) -> str:
    """A bound or a value in an error: whole numbers as :func:`bound_text` writes them, others in
    six digits (1e+12, 9.22337e+18)."""
    return bound_text(value) if isinstance(value, int) else f"{value:.6g}"


@attrs.frozen(eq=False)
class Records:
    """The rows of one file, column by column, with where each row came from.

    :ivar path: the file, as named in error messages.
    :ivar unit: ``"line"`` (CSV, JSONL: physical line numbers) or ``"record"`` (JSON: 1-based
        position in the list of requests).
    :ivar positions: the line or record number of each row (a list, or an int array).
    :ivar values: our field name -> one raw value per row (``None`` where the row lacks it): a
        list, or a :class:`~.fast_text.RawColumn` that indexes like one. Only fields found in
        the file are present.
    :ivar sources: our field name -> the name it has in the file.
    :ivar reader: which reader read the file: ``"arrow"``, ``"numpy"`` or ``"python"``.
    """

    path: str
    unit: str
    positions: Sequence[int]
    values: dict[str, Sequence]
    sources: dict[str, str]
    reader: str = "python"

    def __len__(self) -> int:
        return len(self.positions)

    def where(self, row: int) -> str:
        """``"<file>: line 7"`` for messages about row ``row`` (0-based)."""
        return f"{self.path}: {self.unit} {self.positions[row]}"

    def has(self, field: str) -> bool:
        """True when the file has ``field`` in at least one row."""
        column = self.values.get(field)
        if isinstance(column, RawColumn):
            return not bool(column.none_mask().all())
        return column is not None and any(v is not None for v in column)

    def label(self, field: str) -> str:
        """How to name ``field`` in a message: ``prompt_tokens (column 'ContextTokens')``."""
        source = self.sources.get(field, field)
        return field if source == field else f"{field} (column {source!r})"

    def select(self, keep: np.ndarray) -> "Records":
        """Only the rows where the boolean mask ``keep`` is true."""
        index = np.flatnonzero(keep).tolist()
        return Records(
            self.path,
            self.unit,
            [self.positions[i] for i in index],
            {name: [col[i] for i in index] for name, col in self.values.items()},
            dict(self.sources),
            self.reader,
        )

    def _column(self, field: str, required: bool) -> Sequence | None:
        column = self.values.get(field)
        if column is None:
            if required:
                raise WorkloadError(f"{self.path}: no {self.label(field)} in the file")
            return None
        return column

    def ints(self, field: str, *, min: int = 1, max: int | None = None, required: bool = True) -> np.ndarray | None:
        """``field`` as int64; every row must hold a whole number >= ``min`` (and <= ``max``).

        Integral floats (``12.0``, as pandas writes them) are accepted; ``1.5``, ``true``,
        text and missing values are not. Returns None for an absent optional field.
        """
        column = self._column(field, required)
        if column is None:
            return None
        if isinstance(column, RawColumn):
            return self._at_most(field, self._raw_ints(field, column, min, allow_none=False, most=max)[0], max)
        out = np.empty(len(column), dtype=np.int64)
        for row, value in enumerate(column):
            if value is None:
                raise WorkloadError(f"{self.where(row)}: missing {self.label(field)}")
            out[row] = self._whole(row, field, value, min, max)
        return self._at_most(field, out, max)

    def _at_most(self, field: str, values, most, why: str = ""):
        """``values`` (an array, or a list with None for rows without one), or an error naming the
        first row above ``most`` (None: no bound; ``why``: the bound's reason, added to the
        message): bounds that keep a typo from running for ever are refused where the file is
        read, naming its line."""
        if most is None:
            return values
        array = np.asarray([-math.inf if v is None else v for v in values] if isinstance(values, list) else values,
                           dtype=np.float64)
        over = np.flatnonzero(array > most)
        if over.size:
            row = int(over[0])
            value = values[row]
            value = value.item() if isinstance(value, np.generic) else value
            raise WorkloadError(f"{self.where(row)}: {self.label(field)}: must be <= {_number_text(most)}"
                                f"{f' ({why})' if why else ''}, got {_number_text(value)}")
        return values

    def _whole(self, row: int, field: str, value, min: int, most: int | None = None) -> int:
        """``value`` as a whole number >= ``min``, or an error naming the row and field (and the
        field's bound ``most`` for one past int64: not the int64 range, which was named instead)."""
        number = _as_int(value)
        if number is None or number < min:
            raise WorkloadError(
                f"{self.where(row)}: {self.label(field)}: must be a whole number >= {min}, got {show_value(value)}")
        if number > INT64_MAX:  # 10**30, 1e30 or "1e30": beyond the int64 columns every reader keeps
            if most is not None:
                raise WorkloadError(f"{self.where(row)}: {self.label(field)}: must be <= {_number_text(most)}, "
                                    f"got {show_value(value)}")
            raise WorkloadError(
                f"{self.where(row)}: {self.label(field)}: must be a whole number from {min} to {INT64_MAX:,}, "
                f"got {show_value(value)}")
        return number

    def optional_ints(self, field: str, *, min: int = 1, max: int | None = None) -> list | None:
        """``field`` as a list of ints with ``None`` where a row lacks it; None if no row has it."""
        values = self._optional_ints(field, min, max)
        return None if values is None else self._at_most(field, values, max)

    def _optional_ints(self, field: str, min: int, most: int | None = None) -> list | None:
        """:meth:`optional_ints` before its bound."""
        if not self.has(field):
            return None
        column = self.values[field]
        if isinstance(column, RawColumn):
            values, others = self._raw_ints(field, column, min, allow_none=True, most=most)
            out = values.tolist()
            for row in np.flatnonzero(column.none_mask()).tolist():
                out[row] = None
            for row, number in others.items():
                out[row] = number
            return out
        out: list = []
        for row, value in enumerate(self.values[field]):
            out.append(None if value is None else self._whole(row, field, value, min, most))
        return out

    def floats(self, field: str, *, min: float = 0.0, max: float | None = None, required: bool = True,
               why: str = "") -> np.ndarray | None:
        """``field`` as float64; every row must hold a finite number >= ``min`` (and <= ``max``,
        ``why`` saying why in the message)."""
        values = self._floats(field, min, required)
        return None if values is None else self._at_most(field, values, max, why)

    def _floats(self, field: str, min: float, required: bool) -> np.ndarray | None:
        column = self._column(field, required)
        if column is None:
            return None
        if isinstance(column, RawColumn):
            return self._raw_floats(field, column, min)
        out = np.empty(len(column), dtype=np.float64)
        for row, value in enumerate(column):
            if value is None:
                raise WorkloadError(f"{self.where(row)}: missing {self.label(field)}")
            number = _as_float(value)
            if number is None or not number >= min:
                raise WorkloadError(
                    f"{self.where(row)}: {self.label(field)}: must be a number >= {min:g}, got {show_value(value)}"
                )
            out[row] = number
        return out

    def texts(self, field: str) -> list | None:
        """``field`` as text (numbers are written out), ``None`` where a row lacks it."""
        if not self.has(field):
            return None
        column = self.values[field]
        rows = None
        if isinstance(column, RawColumn):  # strings at once; the other rows as below
            strings = np.flatnonzero(column.kind == STR)
            if strings.size == len(column):
                return column.str_values(strings)
            texts = np.full(len(column), None, dtype=object)
            texts[strings] = column.str_values(strings)
            out = texts.tolist()
            rows = np.flatnonzero((column.kind != STR) & (column.kind != NONE)).tolist()
        else:
            out = list(column)
        for row in rows if rows is not None else range(len(column)):
            value = column[row]
            if value is None or isinstance(value, str):
                out[row] = value
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[row] = str(value)
            else:
                raise WorkloadError(f"{self.where(row)}: {self.label(field)}: must be text, got {show_value(value)}")
        return out

    def keys(self, field: str) -> list | None:
        """``field`` as a group key (text or whole number), ``None`` where a row lacks it."""
        if not self.has(field):
            return None
        column = self.values[field]
        if isinstance(column, RawColumn) and bool(np.all((column.kind == STR) | (column.kind == NONE))):
            return self.texts(field)
        out: list = []
        for row, value in enumerate(column):
            if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
                out.append(value)
            else:
                raise WorkloadError(
                    f"{self.where(row)}: {self.label(field)}: must be text or a whole number, got {show_value(value)}"
                )
        return out

    def _raw_ints(self, field: str, column: RawColumn, min: int, *, allow_none: bool,
                  most: int | None = None) -> tuple[np.ndarray, dict]:
        """:meth:`ints` of a RawColumn: ``(array, {row: int})`` -- numbers numpy reads exactly at
        once, the rest (as Python ints, which may not fit the array) and the first bad row's
        message as in the loop above. ``None`` rows read as 0 with allow_none."""
        kind = column.kind
        out = np.zeros(len(column), dtype=np.int64)
        fast = np.flatnonzero((kind == INT) | (kind == STR))
        values, ok = column.int_values(fast)
        out[fast[ok]] = values[ok]
        done = np.zeros(len(column), dtype=bool)
        done[fast[ok]] = True
        floats = np.flatnonzero(kind == FLOAT)
        fvalues, fok = column.float_values(floats)
        whole = fok & (fvalues == np.round(fvalues)) & (np.abs(fvalues) < 2.0**53)
        out[floats[whole]] = fvalues[whole].astype(np.int64)
        done[floats[whole]] = True
        none = column.none_mask()
        bad = done & (out < min)
        if not allow_none:
            bad |= none
        stop = int(np.argmax(bad)) if bad.any() else len(column)
        others: dict[int, int] = {}
        for row in np.flatnonzero(~done & ~none).tolist():  # what numpy could not read, in order
            if row > stop:
                break
            number = _as_int(column[row])
            if number is None or number < min or number > INT64_MAX:
                bad[row] = True
                break
            if allow_none:
                others[row] = number
            else:
                out[row] = number
        rows = np.flatnonzero(bad)
        if rows.size:
            row = int(rows[0])
            if none[row]:
                raise WorkloadError(f"{self.where(row)}: missing {self.label(field)}")
            self._whole(row, field, column[row], min, most)  # raises with the row's value
        return out, others

    def _raw_floats(self, field: str, column: RawColumn, min: float) -> np.ndarray:
        """:meth:`floats` of a RawColumn, as :meth:`_raw_ints`."""
        kind = column.kind
        out = np.zeros(len(column), dtype=np.float64)
        done = np.zeros(len(column), dtype=bool)
        ints = np.flatnonzero(kind == INT)
        ivalues, iok = column.int_values(ints)
        small = iok & (np.abs(ivalues) <= 2**53)
        out[ints[small]] = ivalues[small].astype(np.float64)
        done[ints[small]] = True
        rest = np.flatnonzero((kind == FLOAT) | (kind == STR))
        fvalues, fok = column.float_values(rest)
        fok &= np.isfinite(fvalues)   # "1e400" reads as inf: Python says it is not a finite number
        out[rest[fok]] = fvalues[fok]
        done[rest[fok]] = True
        none = column.none_mask()
        bad = none | (done & ~(out >= min))
        stop = int(np.argmax(bad)) if bad.any() else len(column)
        for row in np.flatnonzero(~done & ~none).tolist():  # what numpy could not read, in order
            if row > stop:
                break
            number = _as_float(column[row])
            if number is None or not number >= min:
                bad[row] = True
                break
            out[row] = number
        rows = np.flatnonzero(bad)
        if rows.size:
            row = int(rows[0])
            if none[row]:
                raise WorkloadError(f"{self.where(row)}: missing {self.label(field)}")
            value = column[row]
            raise WorkloadError(
                f"{self.where(row)}: {self.label(field)}: must be a number >= {min:g}, got {show_value(value)}")
        return out

    def int_lists(self, field: str, *, required: bool = True) -> list[tuple] | None:
        """``field`` as tuples of whole numbers (JSON lists such as Mooncake's ``hash_ids``)."""
        column = self._column(field, required)
        if column is None:
            return None
        if isinstance(column, RawColumn):
            tuples = column.int_tuples()
            if tuples is not None:
                return tuples
        out: list[tuple] = []
        for row, value in enumerate(column):
            if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                raise WorkloadError(
                    f"{self.where(row)}: {self.label(field)}: must be a list of whole numbers, got {show_value(value)}"
                )
            out.append(tuple(value))
        return out


def show_value(value: Any) -> str:
    """``repr(value)`` for a message, cut at 60 characters (a 400-digit number, a long text)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _as_int(value: Any) -> int | None:
    """The whole number ``value`` stands for, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
    """The finite number ``value`` stands for, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, int) and abs(value) > MAX_FLOAT_INT:
        return None   # 309 digits or more: float() would raise OverflowError
    if isinstance(value, (int, float)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def read_records(
    path: str | os.PathLike,
    wanted: Mapping[str, Sequence[str]],
    *,
    format: str | None = None,
    required: Sequence[str] = (),
    limit: int | None = None,
    reader: str = "arrow",
) -> Records:
    """Read a request file.

    :param path: a JSON file (a list of objects, or ``{"requests": [...]}``), a JSONL file (one
        object per line; blank lines are skipped) or a CSV file with a header line.
    :param wanted: our field name -> the names it may have in the file, first match wins.
    :param format: ``"json"``, ``"jsonl"`` or ``"csv"``; None to go by the extension.
    :param required: fields every row must have (in a CSV: the column must exist).
    :param limit: read only the first ``limit`` rows.
    :param reader: the fastest reader to try for JSONL and CSV: ``"arrow"`` (pyarrow, for
        well-formed files), then ``"numpy"`` (:mod:`.fast_text`), then ``"python"`` (row by row);
        each gives way to the next on what it does not read exactly, and all give the same rows,
        values and errors.
    :raises WorkloadError: missing or unreadable file, bad JSON (with its line), a missing
        column or key (with the row), a CSV column to read that the header names twice, a CSV
        row with the wrong number of cells, a CSV quote that no quote closes (strict CSV: the
        line where its row starts) or text after a closing quote.
    """
    check_regular_file(path)
    check_not_lfs_pointer(path)
    kind = detect_format(path, format)
    name = str(path)
    if reader not in READERS:
        raise ValueError(f"read_records: reader must be one of {READERS}, got {reader!r}")
    compressed = is_gzip(path)
    try:
        if reader == "arrow" and kind in ("jsonl", "csv") and not compressed:  # (it reads the file on disk)
            read = (read_jsonl_arrow if kind == "jsonl" else read_csv_arrow)(path, name, wanted, required, limit)
            if read is not None:
                records = Records(name, "line", *read, reader="arrow")
                _check_required(records, required, in_header=kind == "csv")
                return records
        if reader in ("arrow", "numpy") and kind in ("jsonl", "csv"):
            data = read_file_bytes(path)
            read = (read_jsonl_fast if kind == "jsonl" else read_csv_fast)(data, name, wanted, required, limit)
            if read is not None:
                records = Records(name, "line", *read, reader="numpy")
                _check_required(records, required, in_header=kind == "csv")
                return records
            del data
        with open_text(path) as handle:
            if kind == "csv":
                return _read_csv(handle, name, wanted, required, limit)
            if kind == "jsonl":
                return _read_jsonl(handle, name, wanted, required, limit)
            return _read_json(handle, name, wanted, required, limit)
    except FileNotFoundError:
        raise WorkloadError(f"{name}: file not found") from None
    except IsADirectoryError:
        raise WorkloadError(f"{name}: is a folder, not a file") from None
    except UnicodeDecodeError as exc:
        inside = " (after gzip decompression)" if compressed else ""
        raise WorkloadError(f"{name}: not UTF-8 text{inside} ({exc.reason} at byte {exc.start})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise gzip_problem(name, exc) from None
    except OSError as exc:
        raise WorkloadError(f"{name}: cannot read: {exc.strerror or exc}") from None


def _csv_error(name: str, reader, start: int, exc: csv.Error, what: str = "bad CSV") -> WorkloadError:
    """The WorkloadError for ``exc``, raised while ``reader`` read the row that starts on line
    ``start``. A quote that opens a cell and is never closed takes every line after it into that
    cell (``csv.reader`` accepts that unless strict): it is named by the line where its row starts."""
    if str(exc) == "unexpected end of data":
        return WorkloadError(f"{name}: line {start}: unterminated quoted field: a cell of this row opens a quote that "
                             f"nothing closes up to the end of the file (line {reader.line_num})")
    return WorkloadError(f"{name}: line {reader.line_num}: {what}: {exc}")


def _read_csv(handle, name, wanted, required, limit) -> Records:
    # strict: an unterminated quote is an error, not a cell holding the rest of the file
    reader = csv.reader(handle, strict=True)
    start = 1   # the line the next row starts on
    try:
        header = next(reader, None)
        while header is not None and not header:
            start = reader.line_num + 1
            header = next(reader, None)
    except csv.Error as exc:
        raise _csv_error(name, reader, start, exc, "bad CSV header") from None
    if header is None:
        raise WorkloadError(f"{name}: empty CSV file (no header line)")
    header = [cell.strip() for cell in header]
    index, sources = csv_columns(name, header, wanted, required)
    values: dict[str, list] = {field: [] for field in index}
    positions: list[int] = []
    start = reader.line_num + 1
    try:
        for cells in reader:
            first, start = start, reader.line_num + 1   # the lines this row starts on, and the next one
            if limit is not None and len(positions) >= limit:
                break
            if not cells or (len(cells) == 1 and not cells[0].strip()):
                continue
            if len(cells) != len(header):
                raise WorkloadError(
                    f"{name}: line {reader.line_num}: expected {len(header)} cells (as in the header), got {len(cells)}"
                )
            positions.append(reader.line_num)
            for field, col in index.items():
                cell = cells[col].strip()
                if "\n" in cell or "\r" in cell:   # two stray quotes: the rows between them read as one cell
                    raise WorkloadError(f"{name}: line {first}: {header[col]}: a quoted cell runs over lines {first} "
                                        f"to {reader.line_num}; no value read from a request file holds a line "
                                        "break (a stray quote opens it and another closes it?)")
                values[field].append(cell if cell != "" else None)
    except csv.Error as exc:
        raise _csv_error(name, reader, start, exc) from None
    records = Records(name, "line", positions, values, sources)
    _check_required(records, required, in_header=True)
    return records


def check_regular_file(path: str | os.PathLike) -> None:
    """WorkloadError naming ``path`` when it is a FIFO, a device or a folder rather than a file
    (see :func:`schedlab.configs.not_regular_file`): reading one would block or never end."""
    problem = not_regular_file(path)
    if problem:
        raise WorkloadError(f"{path}: {problem}")


def read_json_text(path: Path) -> str:
    """The text of a JSON file: UTF-8, a leading byte order mark skipped, decompressed when it is
    gzip; WorkloadError naming the file when it is missing, not a regular file, not UTF-8 (UTF-16
    named as such) or empty."""
    check_regular_file(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: file not found")
    check_not_lfs_pointer(path)
    try:
        raw = read_file_bytes(path)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise gzip_problem(str(path), exc) from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if looks_utf16(raw):
        raise WorkloadError(f"{path}: {UTF16_ADVICE}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise WorkloadError(f"{path}: the file is empty")
    return text


def read_json_file(path: Path) -> Any:
    """The JSON document in ``path`` (see :func:`read_json_text`); WorkloadError naming the file
    when it cannot be read or is not JSON."""
    text = read_json_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: not JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:
        raise WorkloadError(f"{path}: not JSON ({unreadable_json(exc)})") from None


def read_json_documents(path: Path, index: int | None = None) -> list:
    """Every JSON document in ``path``, in order: one, or several one after another (separated by
    whitespace or not at all) as ``vllm bench serve --append-result`` writes them. When a later
    document is broken (a run killed while writing its result), the whole ones before it when
    ``index`` (0-based) picks one of them, with a warning."""
    try:
        return json_documents(read_json_text(path))
    except JsonTextError as exc:
        whole = documents_before_break(exc, index)
        if whole is not None:
            warnings.warn(f"{path}: {cut_short_note(exc, index)}", InputWarning, stacklevel=3)
            return whole
        before = (f"; the {exc.document - 1} document(s) before it are whole: index 0..{exc.document - 2} reads one"
                  if exc.document > 1 else "")
        raise WorkloadError(f"{path}: not JSON ({exc.detail}){before}") from None


def jsonl_objects(handle, name: str, limit: int | None = None):
    """``(line number, object)`` for each non-empty line of a JSONL file (at most ``limit``);
    a line that is not a JSON object is an error naming the file and the line."""
    count = 0
    for number, line in enumerate(handle, start=1):
        if limit is not None and count >= limit:
            return
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{name}: line {number}: bad JSON: {exc.msg} (column {exc.colno})") from None
        except (ValueError, RecursionError) as exc:
            raise WorkloadError(f"{name}: line {number}: bad JSON: {unreadable_json(exc)}") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{name}: line {number}: expected a JSON object, got {type(obj).__name__}")
        count += 1
        yield number, obj


def _read_jsonl(handle, name, wanted, required, limit) -> Records:
    rows: list[dict] = []
    positions: list[int] = []
    for number, obj in jsonl_objects(handle, name, limit):
        rows.append(obj)
        positions.append(number)
    return _from_objects(name, "line", rows, positions, wanted, required)


def _read_json(handle, name, wanted, required, limit) -> Records:
    try:
        data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{name}: line {exc.lineno}: bad JSON: {exc.msg} (column {exc.colno})") from None
    except UnicodeDecodeError as exc:  # (a ValueError too: not a number too long)
        raise WorkloadError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise WorkloadError(f"{name}: bad JSON: {unreadable_json(exc)}") from None
    if isinstance(data, dict):
        if "requests" not in data:
            raise WorkloadError(f"{name}: expected a list of requests or an object with a \"requests\" list")
        data = data["requests"]
    if not isinstance(data, list):
        raise WorkloadError(f"{name}: the requests must be a JSON list, got {type(data).__name__}")
    if limit is not None:
        data = data[:limit]
    for number, obj in enumerate(data, start=1):
        if not isinstance(obj, dict):
            raise WorkloadError(f"{name}: record {number}: expected a JSON object, got {type(obj).__name__}")
    return _from_objects(name, "record", data, list(range(1, len(data) + 1)), wanted, required)


def records_from_rows(name: str, rows: Sequence[Mapping], wanted: dict[str, tuple[str, ...]],
                      required: Sequence[str] = ()) -> Records:
    """Records of rows already in memory (tables of a TOML file), numbered ``record 1, 2, ...``
    in messages, checked like a JSON file's."""
    for number, obj in enumerate(rows, start=1):
        if not isinstance(obj, Mapping):
            raise WorkloadError(f"{name}: record {number}: expected a table, got {type(obj).__name__}")
    return _from_objects(name, "record", list(rows), list(range(1, len(rows) + 1)), wanted, required)


def _from_objects(name, unit, rows, positions, wanted, required) -> Records:
    values: dict[str, list] = {}
    sources: dict[str, str] = {}
    for field, names in wanted.items():
        column: list = []
        found = None
        for obj in rows:
            value = None
            for candidate in names:
                if candidate in obj:
                    value = obj[candidate]
                    found = found or candidate
                    break
            column.append(value)
        if found is not None:
            values[field] = column
            sources[field] = found
        else:
            sources[field] = names[0]
            if field in required and rows:
                values[field] = column  # all None: _check_required names the first row
    records = Records(name, unit, positions, values, sources)
    _check_required(records, required)
    return records


def _check_required(records: Records, required: Sequence[str], in_header: bool = False) -> None:
    """WorkloadError naming the first row without a value of a ``required`` field; AbsentField
    when no row has one and the file may name the field otherwise -- not a CSV, whose header has
    the column (``in_header``: else the header check said so), so that an empty cell in every row
    (a one-row file's only one) is named by its line like any other."""
    for field in required:
        column = records.values.get(field)
        if column is None:
            continue  # an empty file
        if len(column) and not in_header and not records.has(field):
            raise AbsentField(f"{records.path}: no {records.unit} has {records.label(field)}")
        if isinstance(column, RawColumn):
            missing = np.flatnonzero(column.none_mask())
            if missing.size:
                raise WorkloadError(f"{records.where(int(missing[0]))}: missing {records.label(field)}")
            continue
        for row, value in enumerate(column):
            if value is None:
                raise WorkloadError(f"{records.where(row)}: missing {records.label(field)}")
