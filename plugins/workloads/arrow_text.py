"""pyarrow readers for JSONL and CSV request files: the fast path for well-formed files.

pyarrow parses a 2-million-row JSONL file in about 2 s of CPU where the numpy readers of
:mod:`.fast_text` take 7, and it reads list values such as Mooncake's ``hash_ids`` natively.
Its grammar is wider than Python's readers' though (it takes ``Inf``, several objects on one
line, one object over several lines, ``0x10`` as an integer...), and a double column does not
tell ``12`` from ``12.0``. So it reads a file only when it reads exactly what the Python readers
of :mod:`.records` would, and otherwise returns None: the numpy readers, and behind them the
Python readers, read the file and decide what is an error and what it says. It is used when:

* the file is UTF-8 with no carriage return outside a CRLF line end (Python breaks lines there)
  and has at least one row;
* JSONL: every non-empty line starts with ``{`` and ends with ``}`` and pyarrow finds one row per
  such line (then each line is one object: a ``}`` that closes a nested value can only be
  followed by ``,`` ``}`` or ``]``); no object has a key twice (pyarrow refuses those; Python
  keeps the last); no value anywhere is ``NaN`` or infinite (pyarrow also takes ``Inf``, which
  Python refuses); every field we read is an int64, double, bool, string or null column, or
  lists of int64, bool, string or null (text that pyarrow takes for a time, such as
  ``"2023-11-16"``, is read again as text); a field we look up under several names (``request_class``
  or ``class``) appears under only one (else a row's ``null`` under the first name would hide
  the second, which pyarrow cannot tell from an absent key);
* CSV: at least two columns, no NUL, no quote character after the header line, no line longer
  than ``csv.field_size_limit()``, the same number of cells on every row (pyarrow checks).

Values are then the Python readers' exactly: ints are int64 (pyarrow reads a larger integer as
a double), strings are decoded the same, and a double column's whole numbers -- the only values
that may have been written as ints -- are read again with ``json.loads`` (if there are few; else
the file goes to the numpy reader). CSV cells are read as text, and stripped as ``str.strip()``
does (in Python for the few cells with whitespace or non-ASCII bytes at an end).

Columns are :class:`ArrowColumn`: kinds per row as :class:`~.fast_text.RawColumn`, numbers in
numpy arrays, text and lists kept in pyarrow arrays; text converts to numbers with pyarrow's
casts, only for texts of a plain decimal form (which Python's ``int()`` and ``float()`` read to
the same values; pyarrow alone would also read ``0x10`` and ``nan(1)``).
"""

from __future__ import annotations

import csv
import json
from typing import Any, Mapping, Sequence

import numpy as np

from schedlab.errors import WorkloadError

from .fast_text import BOM, FALSE, FLOAT, INT, NONE, OBJ, STR, TRUE, RawColumn, csv_columns

SCAN_BYTES = 4 << 20           # the file is checked this many bytes at a time (bounds temporaries)
ARROW_BLOCK_BYTES = 4 << 20    # pyarrow parses blocks of this size (a line must fit in one)
#: JSONL lines with more ``[`` and ``{`` than this (so perhaps nested this deep) go to the other
#: readers: pyarrow's parser recurses a level at a time in C++ and crashes the process (a
#: segfault, near 10,000 levels), where Python's json stops with a RecursionError (near 1,000)
#: that the readers report. Brackets inside strings count too, which only sends a line to the
#: slower readers, never a deep line to pyarrow.
MAX_NESTING = 512
INT_TEXT = r"^-?[0-9]{1,18}$"                                           # exact in int64, as int()
FLOAT_TEXT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"     # as float(), no nan/inf/_


def max_reread(rows: int) -> int:
    """How many rows of a double column may be read again with json.loads before the file is
    better read by the numpy reader (which tells ``12`` from ``12.0`` itself)."""
    return max(1000, rows // 50)


def _pyarrow():
    """The pyarrow modules, or None when pyarrow is not installed (then the numpy readers read)."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.csv
        import pyarrow.json
    except ImportError:  # pragma: no cover - pyarrow is a dependency; this keeps a broken install working
        return None
    return pyarrow


# -- checking the file's lines -------------------------------------------------------------------


class _Lines:
    """What a pass over the file found: the rows' line numbers and byte offsets, where the rows
    start and end (the bytes pyarrow reads), and for CSV the header line."""

    def __init__(self):
        self.numbers: list[np.ndarray] = []
        self.starts: list[np.ndarray] = []
        self.rows = 0
        self.begin: int | None = None     # offset of the first byte pyarrow reads
        self.end = 0                      # offset after the last row's line
        self.header: str | None = None    # CSV: the header line, as text


def scan_lines(path, fmt: str, limit: int | None) -> _Lines | None:
    """Check the whole file for what the pyarrow readers need (see the module doc) and find the
    non-empty lines: the rows (at most ``limit``), after the header line for CSV. None when the
    file is for the other readers."""
    found = _Lines()
    line_base = 0        # lines before the chunk
    base = 0             # offset of the chunk in the file
    field_limit = csv.field_size_limit()
    with open(path, "rb") as fh:
        carry = b""
        while True:
            block = fh.read(SCAN_BYTES)
            chunk = carry + block if carry else block
            if block:
                cut = chunk.rfind(b"\n") + 1
                if cut == 0:          # no line end yet: read on
                    carry = chunk
                    continue
                chunk, carry = chunk[:cut], chunk[cut:]
            else:
                carry = b""
            if not chunk:
                break
            lines = _scan_chunk(found, chunk, base, line_base, fmt, limit, field_limit)
            if lines is None:
                return None
            line_base += lines
            base += len(chunk)
            if not block:
                break
    if found.rows == 0 or (fmt == "csv" and found.header is None):
        return None
    found.numbers = np.concatenate(found.numbers)
    found.starts = np.concatenate(found.starts)
    return found


def _scan_chunk(found: _Lines, chunk: bytes, base: int, line_base: int, fmt: str, limit: int | None,
                field_limit: int) -> int | None:
    """Check one piece of whole lines and note its rows in ``found``; the number of line ends in
    it, or None when the file is for the other readers."""
    buf = np.frombuffer(chunk, dtype=np.uint8)
    skip = 3 if base == 0 and chunk.startswith(BOM) else 0
    if found.begin is None and fmt == "jsonl":
        found.begin = skip
    if b"\r" in chunk:
        cr = np.flatnonzero(buf == 13)
        if cr[-1] + 1 >= buf.size or not bool(np.all(buf[cr + 1] == 10)):
            return None                    # a bare carriage return: a line break to Python
    if fmt == "csv" and b"\0" in chunk:
        return None
    if not chunk.isascii():
        try:
            chunk.decode("utf-8")         # chunks end at a line end, never inside a character
        except UnicodeDecodeError:
            return None
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate(([skip], nl + 1))
    line_end = np.append(nl, buf.size)
    if starts[-1] == buf.size:             # nothing after the last line end
        starts, line_end = starts[:-1], line_end[:-1]
    ends = line_end - ((line_end > starts) & (buf[np.maximum(line_end - 1, 0)] == 13))
    rows = np.flatnonzero(ends > starts)
    if fmt == "csv":
        if found.header is None:
            if not rows.size:
                return nl.size
            h = int(rows[0])
            found.header = chunk[int(starts[h]):int(line_end[h]) + 1].decode("utf-8")
            found.begin = base + int(line_end[h]) + 1
            if found.header.count('"') % 2 or len(found.header) > field_limit:
                return None
            after = int(line_end[h]) + 1
            rows = rows[1:]
        else:
            after = 0
        if chunk.find(b'"', after) >= 0:
            return None                    # quoted cells: csv.reader reads them
        if rows.size and int((ends[rows] - starts[rows]).max()) > field_limit:
            return None
    if limit is not None:
        rows = rows[:max(limit - found.rows, 0)]
    if not rows.size:
        return nl.size
    if fmt == "jsonl" and not (bool(np.all(buf[starts[rows]] == 123)) and bool(np.all(buf[ends[rows] - 1] == 125))):
        return None
    if fmt == "jsonl" and int((ends[rows] - starts[rows]).max()) > MAX_NESTING and _maybe_too_deep(buf, nl):
        return None
    found.numbers.append(rows + line_base + 1)
    found.starts.append(starts[rows] + base)
    found.rows += rows.size
    found.end = base + int(line_end[rows[-1]]) + 1
    return nl.size


def _maybe_too_deep(buf: np.ndarray, nl: np.ndarray) -> bool:
    """True when a line of ``buf`` (line ends at ``nl``) holds more than :data:`MAX_NESTING`
    opening brackets: it may nest deeper than pyarrow parses safely."""
    opens = np.flatnonzero((buf | 32) == 123)   # "[" (91) or "{" (123): they differ in bit 5 only
    if opens.size <= MAX_NESTING:
        return False
    per_line = np.bincount(np.searchsorted(nl, opens))
    return int(per_line.max()) > MAX_NESTING


def _source(pa, path, lines: _Lines):
    """What pyarrow reads: the file from the first row's line (or the CSV's first data line) to
    the end, or only up to the last row's line when ``limit`` stops before the end."""
    stream = pa.OSFile(str(path))
    size = stream.size()
    stream.seek(lines.begin)
    if min(lines.end, size) >= size:
        return stream
    data = stream.read(lines.end - lines.begin)
    stream.close()
    return pa.BufferReader(data)


# -- columns --------------------------------------------------------------------------------------


class ArrowColumn(RawColumn):
    """One field of every row as pyarrow read it.

    ``kind`` per row as :class:`~.fast_text.RawColumn`; INT and FLOAT values in ``numbers``
    (int64 or float64), STR values and lists in the pyarrow ``array``, OBJ values in ``objs``
    (row -> value) or, for list columns, in ``array``. Indexing gives the Python readers' value.
    """

    def __init__(self, kind: np.ndarray, numbers: np.ndarray | None = None, array=None,
                 objs: dict[int, Any] | None = None):
        self.kind = kind
        self.numbers = numbers
        self.array = array
        self.objs = objs or {}

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        kind = int(self.kind[row])
        if kind == INT:
            return int(self.numbers[row])
        if kind == FLOAT:
            return float(self.numbers[row])
        if kind == STR:
            return self.array[int(row)].as_py()
        if kind == OBJ:
            return self.objs[int(row)] if int(row) in self.objs else self.array[int(row)].as_py()
        return {NONE: None, TRUE: True, FALSE: False}[kind]

    def __iter__(self):
        return iter(self.tolist())

    def tolist(self) -> list:
        """Every row's value, built at once."""
        if self.numbers is not None:
            out = self.numbers.tolist()
        elif self.array is not None:
            out = self.array.to_pylist()
        else:
            out = [None] * len(self)
        for kind, value in ((NONE, None), (TRUE, True), (FALSE, False)):
            for row in np.flatnonzero(self.kind == kind).tolist():
                out[row] = value
        for row, value in self.objs.items():
            out[row] = value
        return out

    def int_values(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values = np.zeros(rows.size, dtype=np.int64)
        ok = np.zeros(rows.size, dtype=bool)
        numeric = self.kind[rows] == INT
        if numeric.any():
            values[numeric] = self.numbers[rows[numeric]]
            ok[numeric] = True
        texts = np.flatnonzero(self.kind[rows] == STR)
        if texts.size:
            values[texts], ok[texts] = _cast_texts(self._strings(rows[texts]), INT_TEXT, "int64")
        return values, ok

    def float_values(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values = np.zeros(rows.size, dtype=np.float64)
        ok = np.zeros(rows.size, dtype=bool)
        numeric = self.kind[rows] == FLOAT
        if numeric.any():
            values[numeric] = self.numbers[rows[numeric]]
            ok[numeric] = True
        texts = np.flatnonzero(self.kind[rows] == STR)
        if texts.size:
            values[texts], ok[texts] = _cast_texts(self._strings(rows[texts]), FLOAT_TEXT, "float64")
        return values, ok

    def str_values(self, rows: np.ndarray) -> list:
        """The STR values at ``rows``, equal ones shared (pyarrow's dictionary encoding)."""
        import pyarrow.compute as pc

        if rows.size == 0:
            return []
        encoded = pc.dictionary_encode(self._strings(rows))
        table = np.array(encoded.dictionary.to_pylist() + [None], dtype=object)
        return table[encoded.indices.to_numpy(zero_copy_only=False)].tolist()

    def int_tuples(self) -> list[tuple] | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        array = self.array
        if array is None or not pa.types.is_list(array.type) or array.null_count:
            return None
        flat = pc.list_flatten(array)
        if flat.null_count or not (pa.types.is_int64(flat.type) or len(flat) == 0):
            return None
        numbers = flat.to_numpy(zero_copy_only=False).tolist()
        offsets = (np.asarray(array.offsets) - array.offsets[0].as_py()).tolist()
        return [tuple(numbers[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]

    def _strings(self, rows: np.ndarray):
        if rows.size == len(self):
            return self.array
        import pyarrow as pa

        return self.array.take(pa.array(rows))


def _cast_texts(strings, pattern: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``(values, ok)``: the texts that match ``pattern`` converted by pyarrow, the others not."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ok = pc.match_substring_regex(strings, pattern).to_numpy(zero_copy_only=False).astype(bool)
    values = np.zeros(len(strings), dtype=dtype)
    if ok.any():
        try:
            values[ok] = pc.cast(strings.filter(pa.array(ok)), dtype).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:  # pyarrow refuses one after all (never seen): Python reads them
            ok[:] = False
    return values, ok


def _no_value_column(n: int) -> ArrowColumn:
    return ArrowColumn(np.full(n, NONE, dtype=np.uint8))


_LIST_ITEMS = ("int64", "null", "bool", "string")


def _json_column(pa, chunked) -> tuple[ArrowColumn, np.ndarray] | None:
    """A JSON column as an ArrowColumn, with the rows to read again with json.loads (whole numbers
    in a double column); None for a type the Python readers' values cannot be had from."""
    t = chunked.type
    valid = chunked.is_valid().to_numpy(zero_copy_only=False).astype(bool)
    no_rows = np.zeros(0, dtype=np.int64)
    if pa.types.is_int64(t) or pa.types.is_float64(t):
        numbers = chunked.fill_null(0).to_numpy().copy()   # ours, not a view of pyarrow's memory
        kind = np.where(valid, INT if pa.types.is_int64(t) else FLOAT, NONE).astype(np.uint8)
        reread = no_rows if pa.types.is_int64(t) else np.flatnonzero(valid & (numbers == np.floor(numbers)))
        return ArrowColumn(kind, numbers=numbers), reread
    if pa.types.is_boolean(t):
        truth = chunked.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
        return ArrowColumn(np.where(valid, np.where(truth, TRUE, FALSE), NONE).astype(np.uint8)), no_rows
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        array = _own(pa, chunked.combine_chunks())
        return ArrowColumn(np.where(valid, STR, NONE).astype(np.uint8), array=array), no_rows
    if pa.types.is_null(t):
        return _no_value_column(len(chunked)), no_rows
    if pa.types.is_list(t) and str(t.value_type) in _LIST_ITEMS:
        array = _own(pa, chunked.combine_chunks())
        return ArrowColumn(np.where(valid, OBJ, NONE).astype(np.uint8), array=array), no_rows
    return None


def _own(pa, array):
    """A copy of ``array`` (strings, or lists of plain values) in memory numpy allocates, so
    that pyarrow's pool holds nothing once the table is dropped and can give it all back."""
    def copy(buffer):
        return None if buffer is None else pa.py_buffer(np.frombuffer(buffer, dtype=np.uint8).copy())

    buffers = [copy(b) for b in array.buffers()]
    if pa.types.is_list(array.type):
        values = array.values
        child = pa.Array.from_buffers(values.type, len(values), buffers[2:], offset=values.offset)
        return pa.Array.from_buffers(array.type, len(array), buffers[:2], offset=array.offset, children=[child])
    return pa.Array.from_buffers(array.type, len(array), buffers, offset=array.offset)


def _all_finite(pa, values, t) -> bool:
    """True when no float anywhere in ``values`` (of type ``t``, nested or not) is NaN or infinite."""
    import pyarrow.compute as pc

    if pa.types.is_floating(t):
        return pc.all(pc.is_finite(values)).as_py() is not False
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _all_finite(pa, pc.list_flatten(values), t.value_type)
    if pa.types.is_struct(t):
        return all(_all_finite(pa, pc.struct_field(values, [i]), t.field(i).type) for i in range(t.num_fields))
    return True


# -- JSONL ----------------------------------------------------------------------------------------


def read_jsonl_arrow(path, name: str, wanted: Mapping[str, Sequence[str]], required: Sequence[str],
                     limit: int | None):
    """``(positions, values, sources)`` as :func:`.records._read_jsonl` would give them, or None
    when the file is for the other readers (see the module doc). Never raises WorkloadError."""
    pa = _pyarrow()
    if pa is None:
        return None
    lines = scan_lines(path, "jsonl", limit)
    if lines is None:
        return None
    try:
        table = _read_json(pa, path, lines)
        candidates = {candidate for names in wanted.values() for candidate in names}
        dates = [f.name for f in table.schema if f.name in candidates
                 and (pa.types.is_timestamp(f.type) or pa.types.is_date(f.type))]
        if dates:   # pyarrow took text such as "2023-11-16" for a time: read it again as text
            table = _read_json(pa, path, lines, texts=dates)
        columns = _json_columns(pa, table, lines.rows, wanted, required)
    except (pa.ArrowException, OSError):  # anything pyarrow refuses, the other readers judge
        return None
    del table
    _release(pa)
    if columns is None:
        return None
    values, sources, reread = columns
    if sum(rows.size for rows in reread.values()) > max_reread(lines.rows):
        return None
    if not _read_again(path, lines, values, sources, reread):
        return None
    return lines.numbers, values, sources


def _json_columns(pa, table, n: int, wanted, required):
    """``(values, sources, rows to read again)`` from pyarrow's table, or None when it does not
    give the Python readers' values."""
    if table.num_rows != n or not all(_all_finite(pa, table.column(i), f.type) for i, f in enumerate(table.schema)):
        return None
    values: dict[str, ArrowColumn] = {}
    sources: dict[str, str] = {}
    reread: dict[str, np.ndarray] = {}
    for field, names in wanted.items():
        present = [candidate for candidate in names if candidate in table.column_names]
        if len(present) > 1 or (present and table.column_names.count(present[0]) > 1):
            return None
        if not present:
            sources[field] = names[0]
            if field in required:
                values[field] = _no_value_column(n)   # the required check names the first row
            continue
        converted = _json_column(pa, table.column(present[0]))
        if converted is None:
            return None
        values[field], reread[field] = converted
        sources[field] = present[0]
    return values, sources, reread


def _release(pa) -> None:
    """Hand the memory pyarrow used for parsing back to the system, so the run that follows
    can have it."""
    pa.default_memory_pool().release_unused()


def _read_json(pa, path, lines: _Lines, texts: Sequence[str] = ()):
    """The rows as a pyarrow table, with the keys ``texts`` read as strings (and the others'
    types inferred)."""
    parse = pa.json.ParseOptions(explicit_schema=pa.schema([(key, pa.string()) for key in texts]),
                                 unexpected_field_behavior="infer") if texts else None
    with _source(pa, path, lines) as source:
        return pa.json.read_json(source, read_options=pa.json.ReadOptions(block_size=ARROW_BLOCK_BYTES),
                                 parse_options=parse)


def _read_again(path, lines: _Lines, values, sources, reread) -> bool:
    """Give the rows in ``reread`` json.loads's value: an int for ``12``, a float for ``12.0``."""
    fields_of: dict[int, list[str]] = {}
    for field, index in reread.items():
        for row in index.tolist():
            fields_of.setdefault(row, []).append(field)
    with open(path, "rb") as fh:
        for row in sorted(fields_of):
            fh.seek(int(lines.starts[row]))
            try:
                obj = json.loads(fh.readline().decode("utf-8"))
            except (ValueError, RecursionError):
                return False
            for field in fields_of[row]:
                value = obj.get(sources[field]) if isinstance(obj, dict) else None
                column = values[field]
                if isinstance(value, float) and value == column.numbers[row]:
                    continue    # a float, as pyarrow read it
                if isinstance(value, bool) or not isinstance(value, int) or not _same(value, column.numbers[row]):
                    return False   # not what pyarrow read: let the other readers read the file
                column.kind[row] = OBJ
                column.objs[row] = value
    return True


def _same(number: int, read: float) -> bool:
    """True when pyarrow's double ``read`` is the int ``number`` rounded."""
    try:
        return float(number) == read
    except OverflowError:
        return False


# -- CSV ------------------------------------------------------------------------------------------


def read_csv_arrow(path, name: str, wanted: Mapping[str, Sequence[str]], required: Sequence[str],
                   limit: int | None):
    """``(positions, values, sources)`` as :func:`.records._read_csv` would give them, or None
    when the file is for the other readers (see the module doc). Never raises WorkloadError."""
    pa = _pyarrow()
    if pa is None:
        return None
    lines = scan_lines(path, "csv", limit)
    if lines is None:
        return None
    header = [cell.strip() for cell in next(csv.reader([lines.header]))]
    if len(header) < 2:
        return None   # a blank-looking line would be a row to pyarrow; the numpy reader skips it
    try:
        index, sources = csv_columns(name, header, wanted, required)
    except WorkloadError:
        return None   # the other readers say which column is missing (or named twice)
    names = [f"c{i}" for i in range(len(header))]
    used = sorted({names[i] for i in index.values()}) or names[:1]   # one column at least: the rows
    try:
        with _source(pa, path, lines) as source:
            table = pa.csv.read_csv(
                source,
                read_options=pa.csv.ReadOptions(column_names=names, block_size=ARROW_BLOCK_BYTES),
                parse_options=pa.csv.ParseOptions(quote_char=False, escape_char=False, newlines_in_values=False,
                                                  ignore_empty_lines=True),
                convert_options=pa.csv.ConvertOptions(include_columns=used,
                                                      column_types={c: pa.string() for c in used},
                                                      null_values=[], strings_can_be_null=False,
                                                      quoted_strings_can_be_null=False))
        rows = table.num_rows
        values = {field: _csv_column(pa, table.column(names[col])) for field, col in index.items()} \
            if rows == lines.rows else None
    except (pa.ArrowException, OSError):  # anything pyarrow refuses, the other readers judge
        return None
    del table
    _release(pa)
    if values is None:
        return None
    return lines.numbers, values, sources


def _csv_column(pa, chunked) -> ArrowColumn:
    """CSV cells as the Python reader keeps them: stripped, None where empty. A cell whose first
    and last bytes are printable ASCII other than space is already stripped; the others are
    stripped in Python (``str.strip()`` also removes Unicode spaces and \\x1c-\\x1f)."""
    array = _own(pa, chunked.combine_chunks())
    if pa.types.is_large_string(array.type):
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)
    else:
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)
    offsets = offsets[array.offset:array.offset + len(array) + 1].astype(np.int64)
    data_buffer = array.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, dtype=np.uint8)
    if data.size == 0:
        data = np.zeros(1, dtype=np.uint8)   # every cell empty
    start, end = offsets[:-1], offsets[1:]
    filled = end > start
    top = max(data.size - 1, 0)
    first = data[np.minimum(start, top)]
    last = data[np.clip(end - 1, 0, top)]
    plain = filled & (first > 32) & (first < 127) & (last > 32) & (last < 127)
    kind = np.where(plain, STR, NONE).astype(np.uint8)
    objs: dict[int, str] = {}
    for row in np.flatnonzero(filled & ~plain).tolist():
        text = array[row].as_py().strip()
        if text:
            kind[row] = OBJ
            objs[row] = text
    return ArrowColumn(kind, array=array, objs=objs)
