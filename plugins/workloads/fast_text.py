"""Vectorised readers for JSONL and CSV request files: numpy over the file's bytes.

The Python readers in :mod:`.records` parse row by row (``json.loads``, ``csv.reader``) and
keep a dict or a list of cells per row: a 2-million-row JSONL file took 12 s of CPU and 1.6 GB.
These readers find the structure of every line at once with numpy array operations and keep
each field as a :class:`RawColumn` -- a kind code and a byte span into the file per row --
which :class:`~.records.Records` converts to numbers with numpy.

The pyarrow readers of :mod:`.arrow_text` read well-formed files before these (faster), and
give way to them on anything else. These read a conservative grammar and leave everything else
to the Python readers, so results and error messages stay exactly theirs:

* JSONL: a line is read here when it is a flat object ``{"key": value, ...}`` whose values are
  numbers without an exponent, ``true``/``false``/``null`` or strings without escapes or
  control characters, with no key we look for given twice. Any other line (nested values such as Mooncake's
  ``hash_ids`` lists, escapes, bad JSON) goes through ``json.loads`` on its own, in file
  order, so the first bad line still raises the same error.
* CSV: the file is read here when it has no quote character after its header line, no NUL, no
  carriage return outside a CRLF line end and no line longer than ``csv.field_size_limit()``;
  otherwise ``csv.reader`` reads all of it.

Both give way to the Python readers for a file that is not valid UTF-8 (their message names
the byte) or has a carriage return outside a CRLF line end (a line break to Python).
"""

from __future__ import annotations

import csv
import json
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from schedlab.errors import WorkloadError
from schedlab.json_text import unreadable_json
from schedlab.results.storage import repeated_column

# kinds of a raw value
NONE, INT, FLOAT, STR, TRUE, FALSE, OBJ = range(7)

CHUNK_BYTES = 8 << 20          # lines are tokenised this many bytes at a time (bounds temporaries)
MAX_TOKEN = 24                 # longer number tokens go to json.loads (big ints, long decimals)
BOM = b"\xef\xbb\xbf"
_STRIPPED = (9, 10, 11, 12, 13, 28, 29, 30, 31, 32)   # bytes str.strip() removes (ASCII)


class AbsentField(WorkloadError):
    """A required field that no row of a file has under any name looked up (a CSV without the
    column): the file names it otherwise, or is another kind of file."""


class RawColumn(Sequence):
    """One field of every row: ``kind`` and a byte span ``[start, end)`` into the file.

    Indexing gives exactly the value the Python reader would have: ``None``, an int or float
    (a JSON number), a str (a JSON string or a CSV cell), a bool, or -- kind ``OBJ`` -- the
    object ``json.loads`` or the Python strip produced for that row.
    """

    def __init__(self, data: bytes, kind: np.ndarray, start: np.ndarray, end: np.ndarray,
                 objs: dict[int, Any] | None = None):
        self.data = data
        self.kind = kind
        self.start = start
        self.end = end
        self.objs = objs or {}

    def __len__(self) -> int:
        return int(self.kind.size)

    def text(self, row: int) -> bytes:
        return self.data[int(self.start[row]):int(self.end[row])]

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        kind = int(self.kind[row])
        if kind == NONE:
            return None
        if kind == INT:
            return int(self.text(row))
        if kind == FLOAT:
            return float(self.text(row))
        if kind == STR:
            return self.text(row).decode("utf-8")
        if kind == TRUE:
            return True
        if kind == FALSE:
            return False
        return self.objs[int(row)]

    def __iter__(self) -> Iterator:
        return (self[i] for i in range(len(self)))

    def none_mask(self) -> np.ndarray:
        return self.kind == NONE

    # conversions in bulk, which :class:`~.records.Records` checks (a subclass may read its
    # values another way: :class:`~.arrow_text.ArrowColumn`)

    def int_values(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(values, ok)`` for INT and STR ``rows``: the ints read exactly at once (ok), the others
        left to Python."""
        return parse_ints(np.frombuffer(self.data, dtype=np.uint8), self.start[rows], self.end[rows])

    def float_values(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(values, ok)`` for FLOAT and STR ``rows``, as :meth:`int_values`."""
        return parse_floats(np.frombuffer(self.data, dtype=np.uint8), self.start[rows], self.end[rows])

    def str_values(self, rows: np.ndarray) -> list:
        """The STR values at ``rows`` as str objects."""
        return decode_texts(self, rows)

    def int_tuples(self) -> list[tuple] | None:
        """Every row's list of ints as a tuple when all rows are known to hold one; None to have
        the rows checked one by one."""
        return None


# -- numbers from byte spans ------------------------------------------------------------------------


def gather(buf: np.ndarray, start: np.ndarray, end: np.ndarray, width: int) -> np.ndarray:
    """``(n, width)`` bytes of each span, zero beyond its end (spans longer than width cut):
    one pass per column."""
    n = start.size
    out = np.zeros((n, width), dtype=np.uint8)
    if n == 0 or width == 0:
        return out
    length = end - start
    top = buf.size - 1
    for j in range(width):
        out[:, j] = np.where(j < length, buf[np.minimum(start + j, top)], 0)
    return out


def parse_ints(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, ok)`` for spans of the form ``[+-]?[0-9]{1,18}`` (what Python's int() reads
    the same way); ``ok`` is False for any other span."""
    n = start.size
    values = np.zeros(n, dtype=np.int64)
    if n == 0:
        return values, np.zeros(0, dtype=bool)
    first = buf[np.minimum(start, buf.size - 1)]
    sign = (first == 45) | (first == 43)
    s = start + sign
    length = end - s
    ok = (length >= 1) & (length <= 18)
    if not ok.any():
        return values, ok
    width = int(length[ok].max())
    digits = gather(buf, s, np.minimum(end, s + width), width).astype(np.int64) - 48
    cols = np.arange(width)[None, :] < length[:, None]
    ok &= np.all(~cols | ((digits >= 0) & (digits <= 9)), axis=1)
    for j in range(width):
        values = np.where(cols[:, j], values * 10 + np.where(cols[:, j], digits[:, j], 0), values)
    values = np.where((first == 45) & ok, -values, values)
    return np.where(ok, values, 0), ok


_NUMERIC = np.zeros(256, dtype=bool)
_NUMERIC[list(b"0123456789+-.eE")] = True


def parse_floats(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, ok)`` for spans made of ``0-9 + - . e E`` (up to 32 bytes), converted by
    numpy's bytes-to-float cast, which parses like Python's float(); ``ok`` is False for other
    spans, and for all of them if one of those is not a number after all (then the caller
    converts them one by one)."""
    n = start.size
    values = np.zeros(n, dtype=np.float64)
    length = end - start
    ok = (length >= 1) & (length <= 32)
    if not ok.any():
        return values, ok
    width = int(length[ok].max())
    mat = gather(buf, start, end, width)
    inside = np.arange(width)[None, :] < length[:, None]
    ok &= np.all(_NUMERIC[mat] | ~inside, axis=1)
    rows = np.flatnonzero(ok)
    try:
        values[rows] = np.ascontiguousarray(mat[rows]).view(f"S{width}").ravel().astype(np.float64)
    except ValueError:
        ok[:] = False
    return values, ok


_HASH_STEP = np.uint64(0x100000001B3)


def decode_texts(column: RawColumn, rows: np.ndarray, max_width: int = 64) -> list:
    """The STR values at ``rows`` as str objects, equal ones shared (one decode per distinct
    value): distinct values are found by a hash of their bytes, checked byte for byte."""
    if rows.size == 0:
        return []
    start, end = column.start[rows], column.end[rows]
    width = int((end - start).max())
    if width == 0:
        return [""] * rows.size
    if width > max_width:
        return [column.data[s:e].decode("utf-8") for s, e in zip(start.tolist(), end.tolist())]
    buf = np.frombuffer(column.data, dtype=np.uint8)
    mat = gather(buf, start, end, width)
    fixed = np.ascontiguousarray(mat).view(f"S{width}").ravel()
    digest = np.zeros(rows.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width):
            digest = digest * _HASH_STEP + mat[:, j]
        digest = digest * _HASH_STEP + (end - start).astype(np.uint64)
    _, first, inverse = np.unique(digest, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    if not bool(np.all(fixed[first][inverse] == fixed)):   # a hash collision: sort the bytes instead
        uniques, first, inverse = np.unique(fixed, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    table = np.array([column.data[s:e].decode("utf-8") for s, e in zip(start[first].tolist(), end[first].tolist())]
                     + [None], dtype=object)
    return table[inverse].tolist()


# -- JSONL --------------------------------------------------------------------------------------------


# byte classes for JSONL lines
_VALUE, _WS, _STRUCT, _QUOTE, _BACKSLASH, _CONTROL_WS, _CONTROL_OTHER = range(7)
_CLASS = np.full(256, _VALUE, dtype=np.uint8)
_CLASS[:32] = _CONTROL_OTHER                 # json.loads rejects these in strings and outside
_CLASS[[9, 10, 13]] = _CONTROL_WS            # whitespace outside strings, rejected inside
_CLASS[32] = _WS
_CLASS[[123, 125, 91, 93, 44, 58]] = _STRUCT
_CLASS[34] = _QUOTE
_CLASS[92] = _BACKSLASH
_LITERALS = {TRUE: b"true", FALSE: b"false", NONE: b"null"}


class _Field:
    """Where one of our fields is looked up: its candidate names in the file, as bytes."""

    def __init__(self, name: str, candidates: Sequence[str]):
        self.name = name
        self.candidates = list(candidates)
        self.encoded = [c.encode("utf-8") for c in candidates]


def spans_equal(buf: np.ndarray, start: np.ndarray, word: bytes) -> np.ndarray:
    """Which spans starting at ``start`` (each at least len(word) long) hold exactly ``word``:
    one pass per byte over the spans still matching."""
    match = np.ones(start.size, dtype=bool)
    alive = np.arange(start.size)
    for j, byte in enumerate(word):
        same = buf[start[alive] + j] == byte
        match[alive[~same]] = False
        alive = alive[same]
        if not alive.size:
            break
    return match


def _tokenise(c: np.ndarray, starts: np.ndarray, ends: np.ndarray, fields: list[_Field]):
    """Read the lines ``[starts, ends)`` of the chunk ``c`` (offsets into c, ends before the
    line break). Returns ``(status, found)``: per line 0 blank, 1 read here, 2 for json.loads;
    per field and candidate, ``(line, kind, start, end)`` arrays of the values found."""
    n_lines = starts.size
    bounds = np.append(starts, c.size)
    cls = _CLASS[c]
    q = cls == _QUOTE
    q_cs = np.cumsum(q.view(np.uint8), dtype=np.int32)   # quotes up to and including each byte
    before = np.concatenate(([0], q_cs[bounds[1:-1] - 1], [q_cs[-1]]))   # quotes before each line
    n_q = np.diff(before)
    in_str = np.bitwise_xor.accumulate(q.view(np.uint8)).view(bool)     # odd quotes so far
    odd = np.flatnonzero(n_q % 2 == 1)
    if odd.size:  # after a line with an odd number of quotes, parity flips: flip it back per line
        flip = np.zeros(n_lines, dtype=bool)
        flip[odd] = True
        flip = np.logical_xor.accumulate(flip) ^ flip
        in_str ^= np.repeat(flip, np.diff(bounds))
    in_str |= q
    # outside strings: JSON whitespace, structure, value characters; backslashes and control
    # characters (inside strings, or outside if not whitespace) send a line to json.loads
    bad = (cls >= _BACKSLASH) & ((cls != _CONTROL_WS) | in_str)
    outside = ~in_str
    value = (cls == _VALUE) & outside
    v_cs = np.cumsum(value.view(np.uint8), dtype=np.int32)
    S = np.flatnonzero((cls == _STRUCT) & outside)
    Q = np.flatnonzero(q)
    B = np.flatnonzero(bad)
    del cls, q, in_str, bad, outside, value

    def per_line(cs):
        at = np.concatenate(([0], cs[bounds[1:] - 1]))
        return np.diff(at)

    n_v = per_line(v_cs)
    n_bad = np.diff(np.searchsorted(B, bounds))
    n_s = np.diff(np.searchsorted(S, bounds))
    blank = (n_q == 0) & (n_bad == 0) & (n_v == 0) & (n_s == 0)
    slow = (n_q % 2 == 1) | (n_bad > 0)
    chars = c[S]
    line_of = np.repeat(np.arange(n_lines), n_s)
    s0 = np.cumsum(n_s) - n_s
    k = n_s
    # '{' first, '}' last, and ':' ',' alternating between them
    offset = np.arange(S.size) - s0[line_of]
    last = offset == k[line_of] - 1
    expected = np.where(offset == 0, 123, np.where(last, 125, np.where(offset % 2 == 1, 58, 44)))
    wrong = chars != expected
    shape_ok = (np.bincount(line_of[wrong], minlength=n_lines) == 0) & ((k == 2) | ((k % 2 == 1) & (k >= 3)))
    # pairs: each ':' between its '{' or ',' and the next ',' or '}'
    colon = np.flatnonzero((chars == 58) & ~wrong & (offset > 0) & ~last)
    cline = line_of[colon]
    a, pc, b = S[colon - 1], S[colon], S[colon + 1]
    qa, qc, qb = q_cs[a], q_cs[pc], q_cs[b]              # quotes up to each (none is at one)
    va, vc, vb = v_cs[a], v_cs[pc], v_cs[b]
    key_ok = (qc - qa == 2) & (vc == va)
    nq, nv = qb - qc, vb - vc
    is_str = (nq == 2) & (nv == 0)
    top = max(Q.size - 1, 0)
    kq0 = Q[np.minimum(qa, top)] if Q.size else pc    # the key's quotes: the (qa+1)th and (qa+2)th
    kq1 = Q[np.minimum(qa + 1, top)] if Q.size else pc
    # a token value: its first and last value characters, contiguous
    v_first = np.minimum(pc + 1, c.size - 1)
    ws_skip = np.zeros(colon.size, dtype=np.int64)
    for _ in range(4):                                   # ': 12' and ':12' (and a few spaces)
        blankish = (c[np.minimum(v_first + ws_skip, c.size - 1)] == 32) & (v_first + ws_skip < b)
        if not blankish.any():
            break
        ws_skip += blankish
    v_first = v_first + ws_skip
    v_end = v_first + nv
    is_tok = (nq == 0) & (nv >= 1) & (nv <= MAX_TOKEN) & (v_end <= b)
    is_tok &= (v_cs[np.minimum(v_end - 1, c.size - 1)] - v_cs[v_first] + 1 == nv)   # contiguous...
    is_tok &= _CLASS[c[v_first]] == _VALUE                                     # ...from v_first
    pair_ok = key_ok & (is_str | is_tok)
    vstart = np.where(is_str, (Q[np.minimum(qc, top)] + 1) if Q.size else pc, v_first)
    vend = np.where(is_str, Q[np.minimum(qc + 1, top)] if Q.size else pc, v_end)
    kind = np.full(colon.size, STR, dtype=np.uint8)
    tok = np.flatnonzero(is_tok & key_ok)
    if tok.size:
        kind[tok] = _token_kinds(c, vstart[tok], vend[tok])
        pair_ok[tok[kind[tok] == OBJ]] = False
    # every quote and value character of the line belongs to a pair
    pairs_q = np.bincount(cline, weights=pair_ok * (2 + 2 * is_str), minlength=n_lines)
    pairs_v = np.bincount(cline, weights=pair_ok * np.where(is_tok, nv, 0), minlength=n_lines)
    slow |= ~shape_ok | (np.bincount(cline[~pair_ok], minlength=n_lines) > 0) | (pairs_q != n_q) | (pairs_v != n_v)
    # the keys we look for
    klen = kq1 - kq0 - 1
    found = []
    for field in fields:
        per_candidate = []
        for name in field.encoded:
            sel = np.flatnonzero(pair_ok & (klen == len(name)))
            sel = sel[spans_equal(c, kq0[sel] + 1, name)]
            slow |= np.bincount(cline[sel], minlength=n_lines) > 1   # json.loads keeps the last
            per_candidate.append((cline[sel], kind[sel], vstart[sel], vend[sel]))
        found.append(per_candidate)
    return np.where(blank, 0, np.where(slow, 2, 1)), found


def _token_kinds(c: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """INT for ``-?(0|[1-9][0-9]*)``, FLOAT for the same followed by ``.[0-9]+``, TRUE, FALSE,
    NONE for the literals, OBJ for anything else (json.loads reads the line: exponents, NaN...)."""
    length = end - start
    neg = c[start] == 45
    body = length - neg                                   # characters after the sign
    digits = np.zeros(start.size, dtype=np.int64)
    dots = np.zeros(start.size, dtype=np.int64)
    for j in range(int(length.max())):                    # one pass per character position
        within = np.flatnonzero(j < length)
        ch = c[start[within] + j]
        digits[within] += (ch >= 48) & (ch <= 57)
        dots[within] += ch == 46
    first = c[np.minimum(start + neg, c.size - 1)]
    second = c[np.minimum(start + neg + 1, c.size - 1)]
    last = c[end - 1]
    first_digit = (body >= 1) & (first >= 48) & (first <= 57)
    last_digit = (last >= 48) & (last <= 57)
    int_ok = first_digit & (digits == body) & ((first != 48) | (body == 1))
    float_ok = first_digit & last_digit & (dots == 1) & (digits == body - 1) & ((first != 48) | (second == 46))
    kind = np.where(int_ok, INT, np.where(float_ok, FLOAT, OBJ)).astype(np.uint8)
    letters = np.flatnonzero((kind == OBJ) & ((first == 116) | (first == 102) | (first == 110)) & ~neg)
    for lit_kind, word in _LITERALS.items():
        sel = letters[length[letters] == len(word)]
        kind[sel[spans_equal(c, start[sel], word)]] = lit_kind
    return kind


def _line_chunks(data: bytes, buf: np.ndarray, offset: int):
    """Pieces of whole lines, about CHUNK_BYTES each: ``(lo, starts, line_end, ends)`` with the
    lines' starts, their '\n' (or the file's end) and their ends before any CRLF, as absolute
    offsets; None (once) when the file is for the Python reader: a carriage return that is not
    part of a CRLF (a line break to Python), or bytes that are not UTF-8."""
    lo = offset
    size = len(data)
    while lo < size:
        hi = data.find(b"\n", min(lo + CHUNK_BYTES, size - 1))
        hi = size if hi < 0 else hi + 1
        c = buf[lo:hi]
        nl = np.flatnonzero(c == 10) + lo
        starts = np.concatenate(([lo], nl[:-1] + 1)) if nl.size and nl[-1] == hi - 1 else np.concatenate(([lo], nl + 1))
        line_end = np.append(nl, hi)[:starts.size]
        cr = np.flatnonzero(c == 13) + lo
        if cr.size and not (cr[-1] + 1 < size and bool(np.all(buf[cr + 1] == 10))):
            yield None
            return
        if bool((c >= 128).any()):
            try:
                data[lo:hi].decode("utf-8")
            except UnicodeDecodeError:
                yield None
                return
        ends = np.where((line_end > starts) & (buf[np.maximum(line_end - 1, 0)] == 13), line_end - 1, line_end)
        yield lo, starts, line_end, ends
        lo = hi


def read_jsonl_fast(data: bytes, name: str, wanted: Mapping[str, Sequence[str]], required: Sequence[str],
                    limit: int | None):
    """``(positions, values, sources)`` as :func:`.records._from_objects` would give them, or
    None when the file is for the Python reader (see :func:`_line_chunks`)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    offset = 3 if data.startswith(BOM) else 0
    capacity = data.count(b"\n") + 1             # at most this many rows
    if limit is not None:
        capacity = min(capacity, limit)
    fields = [_Field(f, names) for f, names in wanted.items()]
    positions = np.zeros(capacity, dtype=np.int64)
    kinds = [np.zeros(capacity, dtype=np.uint8) for _ in fields]       # NONE
    spans = [np.zeros((2, capacity), dtype=np.int64) for _ in fields]
    objs: list[dict[int, Any]] = [{} for _ in fields]
    first_found: list[tuple[int, int] | None] = [None] * len(fields)   # (row, candidate index)
    n_rows = 0
    line_base = 0                                  # lines before the chunk
    for piece in _line_chunks(data, buf, offset):
        if piece is None:
            return None
        if limit is not None and n_rows >= limit:
            break
        lo, starts, line_end, ends = piece
        chunk = buf[lo:int(line_end[-1]) + 1]
        status, found = _tokenise(chunk, starts - lo, ends - lo, fields)
        # json.loads for the other lines, in order, so the first bad one raises its error
        parsed: dict[int, Any] = {}
        is_row = status == 1
        fast_before = np.cumsum(is_row) - is_row     # rows read here before each line
        for i in np.flatnonzero(status == 2).tolist():
            if limit is not None and n_rows + int(fast_before[i]) + len(parsed) >= limit:
                break
            text = data[int(starts[i]):int(line_end[i]) + 1].decode("utf-8")
            if not text.strip():
                continue
            number = line_base + i + 1
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{name}: line {number}: bad JSON: {exc.msg} (column {exc.colno})") from None
            except (ValueError, RecursionError) as exc:
                raise WorkloadError(f"{name}: line {number}: bad JSON: {unreadable_json(exc)}") from None
            if not isinstance(obj, dict):
                raise WorkloadError(f"{name}: line {number}: expected a JSON object, got {type(obj).__name__}")
            parsed[i] = obj
            is_row[i] = True
        row_lines = np.flatnonzero(is_row)
        if limit is not None:
            row_lines = row_lines[:limit - n_rows]
        m = row_lines.size
        row_of_line = np.full(status.size, -1, dtype=np.int64)
        row_of_line[row_lines] = np.arange(n_rows, n_rows + m)
        positions[n_rows:n_rows + m] = row_lines + line_base + 1
        for f, field in enumerate(fields):
            kind, span = kinds[f], spans[f]
            present = np.full(m, -1, dtype=np.int64)   # which candidate the row has
            # later candidates first, so the first candidate present in a row wins
            for ci in range(len(field.candidates) - 1, -1, -1):
                cl, ck, cs, ce = found[f][ci]
                r = row_of_line[cl]
                keep = (r >= 0) & (status[cl] == 1)
                r = r[keep]
                kind[r] = ck[keep]
                span[0, r] = cs[keep] + lo
                span[1, r] = ce[keep] + lo
                present[r - n_rows] = ci
            for i, obj in parsed.items():
                r = int(row_of_line[i])
                if r < 0:
                    continue
                for ci, candidate in enumerate(field.candidates):
                    if candidate in obj:
                        present[r - n_rows] = ci
                        if obj[candidate] is not None:
                            kind[r] = OBJ
                            objs[f][r] = obj[candidate]
                        break
            if first_found[f] is None:
                hit = np.flatnonzero(present >= 0)
                if hit.size:
                    first_found[f] = (n_rows + int(hit[0]), int(present[hit[0]]))
        n_rows += m
        line_base += status.size
    values: dict[str, RawColumn] = {}
    sources: dict[str, str] = {}
    for f, field in enumerate(fields):
        column = RawColumn(data, kinds[f][:n_rows], spans[f][0, :n_rows], spans[f][1, :n_rows], objs[f])
        if first_found[f] is not None:
            values[field.name] = column
            sources[field.name] = field.candidates[first_found[f][1]]
        else:
            sources[field.name] = field.candidates[0]
            if field.name in required and n_rows:
                values[field.name] = column  # all None: the required check names the first row
    return positions[:n_rows], values, sources


def _plain_line_breaks(buf: np.ndarray) -> bool:
    """True when every carriage return ends a CRLF line break (Python splits lines at a bare CR)."""
    cr = np.flatnonzero(buf == 13)
    return not cr.size or (cr[-1] + 1 < buf.size and bool(np.all(buf[cr + 1] == 10)))


def _valid_utf8(data: bytes, buf: np.ndarray) -> bool:
    """True when the file decodes as UTF-8 (checked in line-aligned pieces, only if not ASCII)."""
    high = np.flatnonzero(buf >= 128)
    if not high.size:
        return True
    step = 16 << 20
    lo = int(high[0])
    lo = data.rfind(b"\n", 0, lo) + 1
    while lo < len(data):
        hi = data.find(b"\n", min(lo + step, len(data)))
        hi = len(data) if hi < 0 else hi + 1
        try:
            data[lo:hi].decode("utf-8")
        except UnicodeDecodeError:
            return False
        lo = hi
    return True


# -- CSV ----------------------------------------------------------------------------------------------


def read_csv_fast(data: bytes, name: str, wanted: Mapping[str, Sequence[str]], required: Sequence[str],
                  limit: int | None):
    """``(positions, values, sources)`` as :func:`.records._read_csv` would give them, or None
    when the file is for ``csv.reader`` (see the module doc). Raises the same errors."""
    buf = np.frombuffer(data, dtype=np.uint8)
    offset = 3 if data.startswith(BOM) else 0
    if not _plain_line_breaks(buf) or not _valid_utf8(data, buf) or (buf == 0).any():
        return None
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate(([offset], nl + 1))
    starts = starts[starts < buf.size] if buf.size > offset else starts[:0]
    line_end = np.append(nl, buf.size)[:starts.size]
    ends = np.where((line_end > starts) & (buf[np.maximum(line_end - 1, 0)] == 13), line_end - 1, line_end)
    nonempty = np.flatnonzero(ends > starts)
    if not nonempty.size:
        raise WorkloadError(f"{name}: empty CSV file (no header line)")
    h = int(nonempty[0])
    header_text = data[int(starts[h]):int(line_end[h]) + 1].decode("utf-8")
    if (b'"' in data[int(line_end[h]):] or header_text.count('"') % 2 or len(header_text) > csv.field_size_limit()):
        return None   # quoted cells (possibly over several lines): csv.reader reads them
    header = [cell.strip() for cell in next(csv.reader([header_text]))]
    return _csv_rows(data, buf, name, wanted, required, limit, header, starts[h + 1:], ends[h + 1:],
                     np.arange(h + 1, starts.size) + 1)


def csv_columns(name: str, header: list[str], wanted: Mapping[str, Sequence[str]],
                required) -> tuple[dict[str, int], dict[str, str]]:
    """Where each wanted field is in a CSV ``header``: the first of its accepted names found
    (column index and name by field). A required field with none of its names is an error
    naming the file, the names looked for and the header, and so is a column to read that the
    header names twice (:func:`schedlab.results.storage.repeated_column`); every reader says it alike."""
    index: dict[str, int] = {}
    sources: dict[str, str] = {}
    for field, names in wanted.items():
        for candidate in names:
            if candidate in header:
                index[field] = header.index(candidate)
                sources[field] = candidate
                break
        else:
            if field in required:
                raise AbsentField(
                    f"{name}: no column {' or '.join(map(repr, names))} (for {field}); "
                    f"the header has {', '.join(map(repr, header))}"
                )
    problem = repeated_column(name, header, sources.values())
    if problem:
        raise WorkloadError(problem)
    return index, sources


def _csv_rows(data, buf, name, wanted, required, limit, header, starts, ends, numbers):
    index, sources = csv_columns(name, header, wanted, required)
    if starts.size and int((ends - starts).max()) > csv.field_size_limit():
        return None   # a cell may be over csv's field size limit: csv.reader says where
    commas = np.flatnonzero(buf == 44)
    c0 = np.searchsorted(commas, starts, "left")
    n_commas = np.searchsorted(commas, ends, "left") - c0
    # blank rows: an empty line, or one cell that str.strip() empties
    blank = ends == starts
    single = (n_commas == 0) & ~blank
    if single.any():
        is_ws = np.zeros(256, dtype=bool)
        is_ws[list(_STRIPPED)] = True
        solid = np.flatnonzero(~is_ws[buf])
        high = np.flatnonzero(buf >= 128)
        nothing = np.searchsorted(solid, ends, "left") == np.searchsorted(solid, starts, "left")
        blank |= single & nothing
        unicode = single & ~nothing & (np.searchsorted(high, ends, "left") > np.searchsorted(high, starts, "left"))
        for i in np.flatnonzero(unicode).tolist():   # Unicode whitespace: as str.strip() sees it
            if not data[int(starts[i]):int(ends[i])].decode("utf-8").strip():
                blank[i] = True
    rows = np.flatnonzero(~blank)
    if limit is not None:
        rows = rows[:limit]
    wrong = rows[n_commas[rows] + 1 != len(header)]
    if wrong.size:
        i = int(wrong[0])
        raise WorkloadError(f"{name}: line {int(numbers[i])}: expected {len(header)} cells (as in the header), "
                            f"got {int(n_commas[i]) + 1}")
    values: dict[str, RawColumn] = {}
    row_c0 = c0[rows]
    ncells = len(header)
    for field, col in index.items():
        if rows.size == 0:
            s = e = np.zeros(0, dtype=np.int64)
        else:
            s = starts[rows] if col == 0 else commas[row_c0 + col - 1] + 1
            e = ends[rows] if col == ncells - 1 else commas[row_c0 + col]
        s, e, objs = _strip(data, buf, s.astype(np.int64), e.astype(np.int64))
        kind = np.where(e > s, STR, NONE).astype(np.uint8)
        for r, value in objs.items():
            kind[r] = OBJ if value else NONE
        values[field] = RawColumn(data, kind, s, e, {r: v for r, v in objs.items() if v})
    return numbers[rows].astype(np.int64), values, sources


def _strip(data, buf, s, e):
    """Cell spans with ASCII whitespace (as str.strip() removes it) cut from both ends; cells
    with other bytes at an end are stripped in Python (Unicode whitespace): row -> str."""
    is_ws = np.zeros(256, dtype=bool)
    is_ws[list(_STRIPPED)] = True
    for _ in range(64):
        move = (e > s) & is_ws[buf[np.minimum(s, buf.size - 1)]]
        if not move.any():
            break
        s = s + move
    for _ in range(64):
        move = (e > s) & is_ws[buf[np.maximum(e - 1, 0)]]
        if not move.any():
            break
        e = e - move
    objs: dict[int, str] = {}
    edge = (e > s) & ((buf[np.minimum(s, buf.size - 1)] >= 128) | (buf[np.maximum(e - 1, 0)] >= 128)
                      | is_ws[buf[np.minimum(s, buf.size - 1)]] | is_ws[buf[np.maximum(e - 1, 0)]])
    for r in np.flatnonzero(edge).tolist():
        objs[r] = data[int(s[r]):int(e[r])].decode("utf-8").strip()
    return s, e, objs
