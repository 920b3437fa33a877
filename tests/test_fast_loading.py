"""The fast JSONL and CSV readers -- pyarrow for well-formed files, numpy for the rest -- give
exactly what the Python readers give: the same rows, values and conversions, or the same error
message -- on files the tests make (each reader giving way to the next where it must)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from schedlab.errors import WorkloadError
from schedlab_plugins.workloads.arrow_text import FLOAT_TEXT, INT_TEXT, ArrowColumn, _cast_texts, max_reread
from schedlab_plugins.workloads.fast_text import RawColumn, parse_floats, parse_ints
from schedlab_plugins.workloads.records import read_records
from schedlab_plugins.workloads.request_file import FILE_FIELDS, REQUIRED_FIELDS

WANTED = {**FILE_FIELDS, "hash_ids": ("hash_ids",)}
KEYS = [name for names in WANTED.values() for name in names] + ["other", "Prompt_tokens", "é"]


def read_all(path, required=REQUIRED_FIELDS, limit=None):
    """reader -> Records or the WorkloadError message, for the three readers."""
    out = {}
    for reader in ("arrow", "numpy", "python"):
        try:
            out[reader] = read_records(path, WANTED, required=required, limit=limit, reader=reader)
        except WorkloadError as exc:
            out[reader] = str(exc)
    return out


def read_both(path, required=REQUIRED_FIELDS, limit=None):
    """``(fast, python)``: what the default reader (pyarrow, giving way to numpy) and the Python
    reader give, each either Records or the WorkloadError message."""
    out = read_all(path, required, limit)
    return out["arrow"], out["python"]


def outcome(call):
    try:
        value = call()
    except (WorkloadError, OverflowError) as exc:  # huge numbers overflow both the same way
        return ("error", type(exc).__name__, str(exc))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.kind, value.tolist())
    return ("value", value)


def typed(values):
    return [(type(v).__name__, v) for v in values]


def assert_same(path, required=REQUIRED_FIELDS, limit=None):
    """Every reader gives what the Python reader gives; returns reader -> Records (or message)."""
    out = read_all(path, required, limit)
    for reader in ("arrow", "numpy"):
        assert_equal(out[reader], out["python"])
    return out


def read_by(out) -> str:
    """Which reader read the file by default (for hypothesis' statistics)."""
    by = "error" if isinstance(out["arrow"], str) else out["arrow"].reader
    event(f"read by {by}")
    return by


def assert_equal(fast, python):
    if isinstance(python, str) or isinstance(fast, str):
        assert fast == python
        return
    assert list(fast.positions) == list(python.positions)
    assert fast.sources == python.sources and set(fast.values) == set(python.values)
    for field in python.values:
        assert typed(fast.values[field]) == typed(python.values[field]), field
        for method, kwargs in (("ints", {"min": 0}), ("ints", {"min": 1}), ("floats", {"min": 0.0}),
                               ("optional_ints", {"min": -(2**62)}), ("texts", {}), ("keys", {})):
            got = outcome(lambda: getattr(fast, method)(field, **kwargs))
            want = outcome(lambda: getattr(python, method)(field, **kwargs))
            if got[0] == want[0] == "value" and isinstance(want[1], list):
                assert typed(got[1]) == typed(want[1]), (field, method)
            else:
                assert got == want, (field, method)
        assert fast.has(field) == python.has(field)
        if field == "hash_ids":
            assert outcome(lambda: fast.int_lists(field)) == outcome(lambda: python.int_lists(field))


# -- JSONL ----------------------------------------------------------------------------------------------

numbers = st.one_of(
    st.integers(-10**6, 10**6), st.integers(-(10**25), 10**25),
    st.floats(allow_nan=False, allow_infinity=False), st.floats(0, 1e6).map(lambda x: round(x, 3)),
)
texts = st.one_of(st.sampled_from(["chat", "batch", "12", "1.5", " 7 ", "", "a\"b", "tab\there", "é", "1e3", "١٢"]),
                  st.text(max_size=8))
values = st.one_of(numbers, texts, st.booleans(), st.none(), st.lists(st.integers(0, 99), max_size=3))
raw_tokens = st.sampled_from(["01", "1.", ".5", "+1", "1e5", "-0", "1E-2", "NaN", "Infinity", "tru", "nul", "1 2",
                              "12.50", "-0.0", "0.1e1", "99999999999999999999"])


@st.composite
def jsonl_lines(draw):
    kind = draw(st.sampled_from(["object", "object", "object", "raw", "blank", "junk"]))
    if kind == "blank":
        return draw(st.sampled_from(["", "   ", "\t", " \t ", "\x0b", "\u3000"]))
    if kind == "junk":
        return draw(st.sampled_from(["[1, 2]", "42", "\"text\"", "{", "{\"a\": 1,}", "{\"a\" 1}", "{}", "null",
                                     "{\"prompt_tokens\": 5}{}", "\ufeff{\"a\": 1}", "{\"x\": {\"y\": 1}}"]))
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=6))
    sep, colon = draw(st.sampled_from([(", ", ": "), (",", ":"), (" , ", " :  "), (",\t", ":")]))
    parts = []
    for key in keys:
        if kind == "raw" and draw(st.booleans()):
            value = draw(raw_tokens)
        else:
            value = json.dumps(draw(values), ensure_ascii=draw(st.booleans()))
        parts.append(json.dumps(key) + colon + value)
    return "{" + sep.join(parts) + "}"


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(jsonl_lines(), max_size=12), st.sampled_from(["\n", "\r\n"]), st.booleans(), st.booleans(),
       st.sampled_from([None, 1, 3]))
def test_jsonl_fast_reader_equals_the_python_reader(tmp_path, lines, newline, bom, final_newline, limit):
    text = newline.join(lines) + (newline if final_newline else "")
    path = tmp_path / "r.jsonl"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    read_by(assert_same(path, limit=limit))
    assert_same(path, required=(), limit=limit)


def test_jsonl_typical_file_is_read_by_numpy(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [{"arrival_ms": 12.5 * i, "prompt_tokens": 10 + i, "output_tokens": 5, "client": f"u{i % 3}",
             "class": "chat", "priority": -1, "max_tokens": None} for i in range(50)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    records = assert_same(path)["numpy"]
    column = records.values["prompt_tokens"]
    assert isinstance(column, RawColumn) and not column.objs   # no row left to json.loads
    assert records.ints("prompt_tokens").tolist() == [10 + i for i in range(50)]
    assert records.floats("arrival_ms").tolist() == [12.5 * i for i in range(50)]
    assert records.sources["request_class"] == "class"
    assert records.texts("client")[:4] == ["u0", "u1", "u2", "u0"]


# -- JSONL files pyarrow reads: typed columns, with the subtle cases it must give way on ------------------

COLUMN_TYPES = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "small int": st.integers(0, 10**4),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "rounded float": st.floats(0, 1e6).map(lambda x: round(x, 3)),
    "whole float": st.integers(-(10**6), 10**6).map(float),
    "int or float": st.one_of(st.integers(-100, 100), st.floats(-1e3, 1e3).map(lambda x: round(x, 1))),
    "big int": st.integers(2**63, 10**30),
    "text": texts,
    "date text": st.one_of(st.dates().map(str), st.datetimes().map(str), st.datetimes().map(lambda d: d.isoformat())),
    "bool": st.booleans(),
    "none": st.none(),
    "int list": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
}
#: values that pyarrow reads differently from json.loads (or not at all), as raw JSON text
ODD_VALUES = ["NaN", "Infinity", "-Infinity", "1e5", "1E-2", "-0", "-0.0", "0.1e1", "1e400", "2e-400",
              "99999999999999999999", "[1.5]", "[99999999999999999999]", "[[1]]", '{"y": 1}', '"\\ud800"',
              '"12"', "true", "[]", "[null]", '["a"]']


@st.composite
def arrow_jsonl_files(draw):
    """``(text, clean)``: JSONL with one type per key; ``clean`` when nothing in it should make
    pyarrow give way (then it must read the file)."""
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=5, unique=True))
    types = {key: draw(st.sampled_from(sorted(COLUMN_TYPES))) for key in keys}
    clean = not ("class" in keys and "request_class" in keys)
    odd = draw(st.sampled_from([None, None, "value", "duplicate", "layout"]))
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 9)) == 0:
            lines.append("")
            continue
        parts = []
        for key in keys:
            presence = draw(st.sampled_from(["value", "value", "value", "null", "absent"]))
            if presence == "absent":
                continue
            value = None if presence == "null" else draw(COLUMN_TYPES[types[key]])
            parts.append(json.dumps(key) + ": " + json.dumps(value, ensure_ascii=draw(st.booleans())))
        lines.append("{" + ", ".join(parts) + "}")
    rows = [i for i, line in enumerate(lines) if line]
    if odd == "value" and rows:
        i = draw(st.sampled_from(rows))
        lines[i] = lines[i][:-1] + (", " if lines[i] != "{}" else "") + json.dumps(draw(st.sampled_from(keys))) + \
            ": " + draw(st.sampled_from(ODD_VALUES)) + "}"
        clean = False   # the key may now be there twice, or hold what its type does not
    elif odd == "duplicate" and rows:
        i = draw(st.sampled_from(rows))
        key = json.dumps(draw(st.sampled_from(keys)))
        lines[i] = lines[i][:-1] + (", " if lines[i] != "{}" else "") + f"{key}: 1, {key}: 2}}"
        clean = False
    elif odd == "layout" and rows:
        i = draw(st.sampled_from(rows))
        lines[i] = draw(st.sampled_from([" " + lines[i], lines[i] + " ", lines[i] + lines[i], lines[i] + "\r",
                                         lines[i].replace(", ", ",\n", 1), "  ", "\t", lines[i] + "\x0b"]))
        clean = False
    return lines, clean


@settings(max_examples=500, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrow_jsonl_files(), st.sampled_from(["\n", "\r\n"]), st.booleans(), st.booleans(),
       st.sampled_from([None, 1, 3]))
def test_jsonl_arrow_reader_equals_the_python_reader(tmp_path, file, newline, bom, final_newline, limit):
    lines, clean = file
    path = tmp_path / "r.jsonl"
    text = newline.join(lines) + (newline if final_newline else "")
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    out = assert_same(path, required=(), limit=limit)
    by = read_by(out)
    if clean and any(lines):   # a file pyarrow reads exactly must not go to the slower readers
        assert by == "arrow"
    read_by(assert_same(path, limit=limit))


def test_jsonl_typical_file_is_read_by_arrow(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [{"arrival_ms": 12.5 * i, "prompt_tokens": 10 + i, "output_tokens": 5, "client": f"u{i % 3}",
             "class": "chat", "priority": -1, "max_tokens": None, "hash_ids": list(range(i % 4)),
             "prefix_group": f"2023-11-{i % 28 + 1:02d}"} for i in range(50)]   # pyarrow takes those for dates
    rows[3]["arrival_ms"] = 40          # an int in a float column: json.loads says int
    rows[5]["arrival_ms"] = 60.0        # a whole float: json.loads says float
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    records = assert_same(path)["arrow"]
    assert records.reader == "arrow"
    assert all(isinstance(records.values[f], ArrowColumn) for f in ("prompt_tokens", "arrival_ms", "hash_ids"))
    arrivals = list(records.values["arrival_ms"])
    assert arrivals[:6] == [0.0, 12.5, 25.0, 40, 50.0, 60.0]
    assert [type(v) for v in arrivals[:6]] == [float, float, float, int, float, float]
    assert records.floats("arrival_ms")[3] == 40.0
    assert records.ints("prompt_tokens").tolist() == [10 + i for i in range(50)]
    assert records.int_lists("hash_ids")[:5] == [(), (0,), (0, 1), (0, 1, 2), ()]
    assert records.sources["request_class"] == "class"
    assert records.texts("client")[:4] == ["u0", "u1", "u2", "u0"]
    assert records.keys("prefix_group")[:2] == ["2023-11-01", "2023-11-02"]
    assert list(records.positions[:3]) == [1, 2, 3]


@pytest.mark.parametrize("why,text", [
    ("NaN, which pyarrow reads as Inf too", '{"prompt_tokens": 1, "output_tokens": 2, "x": NaN}\n'),
    ("a key twice", '{"prompt_tokens": 1, "output_tokens": 2, "prompt_tokens": 3}\n'),
    ("two objects on a line", '{"prompt_tokens": 1, "output_tokens": 2}{"prompt_tokens": 3, "output_tokens": 4}\n'),
    ("an object over two lines", '{"prompt_tokens": 1,\n"output_tokens": 2}\n'),
    ("a bare carriage return", '{"prompt_tokens": 1, "output_tokens": 2}\r{"prompt_tokens": 3, "output_tokens": 4}\n'),
    ("class and request_class", '{"prompt_tokens": 1, "output_tokens": 2, "request_class": null, "class": "a"}\n'),
    ("an int beyond int64 in a list", '{"prompt_tokens": 1, "output_tokens": 2, "hash_ids": [99999999999999999999]}\n'),
    ("a leading space", ' {"prompt_tokens": 1, "output_tokens": 2}\n'),
])
def test_jsonl_arrow_gives_way(tmp_path, why, text):
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt_tokens": 5, "output_tokens": 6, "hash_ids": [1]}\n' + text)
    out = assert_same(path)
    assert isinstance(out["arrow"], str) or out["arrow"].reader != "arrow", why


def test_jsonl_many_whole_floats_go_to_numpy(tmp_path):
    """A double column whose values are mostly whole numbers: reading each again with json.loads
    would cost more than the numpy reader."""
    n = max_reread(0) + 10
    path = tmp_path / "r.jsonl"
    path.write_text("".join(f'{{"prompt_tokens": 1, "output_tokens": 2, "arrival_ms": {i}.0}}\n' for i in range(n))
                    + '{"prompt_tokens": 1, "output_tokens": 2, "arrival_ms": 0.5}\n')
    out = assert_same(path)
    assert out["arrow"].reader == "numpy"
    assert out["arrow"].floats("arrival_ms")[-2:].tolist() == [n - 1, 0.5]


def test_jsonl_errors_are_the_python_readers(tmp_path):
    cases = {
        "bad line": '{"prompt_tokens": 1, "output_tokens": 2}\n{"prompt_tokens": 1, oops}\n',
        "not an object": '{"prompt_tokens": 1, "output_tokens": 2}\n[1, 2]\n',
        "missing": '{"prompt_tokens": 1, "output_tokens": 2}\n{"prompt_tokens": 3}\n',
        "bad value": '{"prompt_tokens": 1, "output_tokens": 2}\n{"prompt_tokens": 2.5, "output_tokens": 2}\n',
        "not utf-8": '{"prompt_tokens": 1, "output_tokens": 2}\n',
    }
    for name, text in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.jsonl"
        data = text.encode() + (b'{"client": "\xff"}\n' if name == "not utf-8" else b"")
        path.write_bytes(data)
        fast, python = read_both(path)
        if isinstance(python, str):
            assert fast == python, name
        else:
            for method in ("ints",):
                assert outcome(lambda: fast.ints("prompt_tokens")) == outcome(lambda: python.ints("prompt_tokens"))
    fast, _ = read_both(tmp_path / "bad_line.jsonl")
    assert fast.startswith(f"{tmp_path / 'bad_line.jsonl'}: line 2: bad JSON: ")


# -- CSV ------------------------------------------------------------------------------------------------

cells = st.one_of(st.integers(-5, 10**6).map(str), st.floats(0, 1e5, allow_nan=False).map(repr),
                  st.sampled_from(["", " ", " 12 ", "1_000", "+5", "1e3", "12.0", "nan", "inf", "chat", "\u00a0 7",
                                   "7\u00a0", "\u3000", "x y", "é", "0x10", "-0", ".5", "5.", "1e400"]))


@st.composite
def csv_files(draw):
    header = draw(st.lists(st.sampled_from(["prompt_tokens", "output_tokens", "arrival_ms", "client", "class",
                                            " priority ", "other"]), min_size=1, max_size=5, unique=True))
    rows = []
    for _ in range(draw(st.integers(0, 8))):
        shape = draw(st.sampled_from(["row", "row", "row", "blank", "short", "spaces"]))
        if shape == "blank":
            rows.append("")
        elif shape == "spaces":
            rows.append(draw(st.sampled_from([" ", "\t", "\u00a0"])))
        else:
            n = len(header) - (1 if shape == "short" else 0)
            rows.append(",".join(draw(cells) for _ in range(n)))
    quoted = draw(st.sampled_from([None, None, None, "header", "cell"]))
    head = ",".join(f'"{h}"' if quoted == "header" else h for h in header)
    if quoted == "cell" and rows:
        rows[0] = '"1,2"' + rows[0]
    leading = draw(st.sampled_from(["", "", "\n", "\r\n"]))
    return leading + head, rows


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(csv_files(), st.sampled_from(["\n", "\r\n"]), st.booleans(), st.sampled_from([None, 1, 3]))
def test_csv_fast_reader_equals_the_python_reader(tmp_path, csv_file, newline, bom, limit):
    head, rows = csv_file
    path = tmp_path / "r.csv"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + newline.join([head] + rows).encode("utf-8") + newline.encode())
    read_by(assert_same(path, limit=limit))
    assert_same(path, required=(), limit=limit)


def test_csv_number_too_big_for_a_float_is_refused_by_every_reader(tmp_path):
    """``1e400`` reads as inf: not a finite number, as the Python reader says (the numpy reader
    once returned inf)."""
    path = tmp_path / "r.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_ms\n1,2,5\n1,2,1e400\n")
    out = assert_same(path)
    assert outcome(lambda: out["numpy"].floats("arrival_ms")) == (
        "error", "WorkloadError", f"{path}: line 3: arrival_ms: must be a number >= 0, got '1e400'")


@pytest.mark.parametrize("column", ["client", "class", "prefix_group"])
def test_an_unterminated_quote_is_refused_by_every_reader_naming_its_line(tmp_path, column):
    """A stray opening quote in the last column (``"bob``, hand-edited) took every later line into
    that one cell, silently: 1,000 rows gave 3 requests. Row 3 is line 4; the file ends on line 7."""
    path = tmp_path / "r.csv"
    path.write_text(f"prompt_tokens,output_tokens,{column}\n10,5,a\n11,5,b\n12,5,\"bob\n13,5,c\n14,5,d\n15,5,e\n")
    out = assert_same(path)
    assert out["python"] == (f"{path}: line 4: unterminated quoted field: a cell of this row opens a quote that "
                             "nothing closes up to the end of the file (line 7)")
    # a second stray quote further down closes the cell: only the rows between were lost, as one cell
    path.write_text(f'prompt_tokens,output_tokens,{column}\n10,5,a\n11,5,"b\n12,5,c\n13,5,d"\n14,5,e\n')
    assert assert_same(path)["python"] == (f"{path}: line 3: {column}: a quoted cell runs over lines 3 to 5; no "
                                           "value read from a request file holds a line break (a stray quote opens "
                                           "it and another closes it?)")
    # and text after a closing quote (csv.reader would have glued it on: "b"x -> bx)
    path.write_text(f'prompt_tokens,output_tokens,{column}\n10,5,a\n11,5,"b"x\n')
    assert assert_same(path)["python"] == f"{path}: line 3: bad CSV: ',' expected after '\"'"


def test_an_unterminated_quote_in_the_header_is_named_by_its_line(tmp_path):
    """A blank line first: the header is line 2, the file's last line 4."""
    path = tmp_path / "r.csv"
    path.write_text('\nprompt_tokens,"output_tokens\n1,2\n3,4\n')
    assert assert_same(path)["python"] == (f"{path}: line 2: unterminated quoted field: a cell of this row opens a "
                                           "quote that nothing closes up to the end of the file (line 4)")


@pytest.mark.parametrize("rows", ["10,\n", "10,\n11,\n"])
def test_an_empty_required_cell_in_every_row_is_named_by_its_line(tmp_path, rows):
    """The column is in the header, its cells all empty: "no line has output_tokens" (with a hint
    to name the column otherwise) where one filled row elsewhere gave "line 2: missing"."""
    path = tmp_path / "r.csv"
    path.write_text("prompt_tokens,output_tokens\n" + rows)
    assert assert_same(path)["python"] == f"{path}: line 2: missing output_tokens"


@pytest.mark.parametrize("reader", ["arrow", "numpy"])
def test_csv_typical_file_is_read_by_the_fast_readers(tmp_path, reader):
    path = tmp_path / "t.csv"
    path.write_text("When,ContextTokens,GeneratedTokens\n" + "".join(f"{i * 0.5},{100 + i},{7 + i}\n" for i in range(30)))
    wanted = {"arrival_ms": ("When",), "prompt_tokens": ("ContextTokens",), "output_tokens": ("GeneratedTokens",)}
    fast = read_records(path, wanted, required=("prompt_tokens", "output_tokens"), reader=reader)
    assert fast.reader == reader
    assert isinstance(fast.values["prompt_tokens"], ArrowColumn if reader == "arrow" else RawColumn)
    rows = np.arange(30)
    assert fast.values["prompt_tokens"].int_values(rows)[1].all()   # converted in bulk, none left to Python
    assert fast.values["arrival_ms"].float_values(rows)[1].all()
    assert fast.ints("prompt_tokens").tolist() == list(range(100, 130))
    assert fast.floats("arrival_ms").tolist() == [i * 0.5 for i in range(30)]
    assert list(fast.positions) == list(range(2, 32))


arrow_cells = st.one_of(
    cells, st.integers(-(2**63), 2**63 - 1).map(str), st.integers(-(10**25), 10**25).map(str),
    st.floats(allow_nan=False).map(repr), st.floats(allow_nan=False).map(lambda x: f"{x:.17e}"),
    st.from_regex(FLOAT_TEXT, fullmatch=True).filter(lambda t: len(t) < 40),
    st.sampled_from(["1e400", "-1e400", "2e-400", "nan(1)", "007", "+.5", "1.e5", "١٢", "\x1c7", "7\x1f", "\t8",
                     "9 ", "1 000", "Infinity", "-nan", "0x1p3", "1d", "٣.٥", "\u2003", "a\u00a0", "é "]))


@st.composite
def arrow_csv_files(draw):
    """``(header, rows, clean)``: CSV of plain cells; ``clean`` when nothing in it should make
    pyarrow give way."""
    header = draw(st.lists(st.sampled_from(["prompt_tokens", "output_tokens", "arrival_ms", "client", "class",
                                            " priority ", "other", "max_tokens", "prompt_tokens "]),
                           min_size=1, max_size=5, unique=True))
    # "prompt_tokens " is "prompt_tokens" once stripped: a column named twice, which every reader refuses
    clean = len(header) >= 2 and len({h.strip() for h in header}) == len(header)
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 9)) == 0:
            rows.append("")
        else:
            rows.append(",".join(draw(arrow_cells) for _ in header))
    odd = draw(st.sampled_from([None, None, None, "short", "long", "spaces", "quote", "cr"]))
    if odd is not None:
        i = draw(st.integers(0, len(rows) - 1))
        rows[i] = {"short": ",".join(rows[i].split(",")[1:]), "long": rows[i] + ",1", "spaces": " \t",
                   "quote": rows[i] + '"', "cr": rows[i] + "\r"}[odd]
        clean = False
    return ",".join(header), rows, clean and any(rows)


@settings(max_examples=500, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrow_csv_files(), st.sampled_from(["\n", "\r\n"]), st.booleans(), st.sampled_from([None, 1, 3]))
def test_csv_arrow_reader_equals_the_python_reader(tmp_path, csv_file, newline, bom, limit):
    head, rows, clean = csv_file
    path = tmp_path / "r.csv"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + newline.join([head] + rows).encode("utf-8") + newline.encode())
    out = assert_same(path, required=(), limit=limit)
    if clean:   # a file pyarrow reads exactly must not go to the slower readers
        assert read_by(out) == "arrow"
    read_by(assert_same(path, limit=limit))


# -- the number parsers -----------------------------------------------------------------------------------


@settings(max_examples=300)
@given(st.lists(st.one_of(st.integers(-(10**20), 10**20).map(str), st.from_regex(r"[+-]?[0-9_.eE ]{1,12}", fullmatch=True),
                          st.floats(allow_nan=False).map(repr)), min_size=1, max_size=20))
def test_number_parsers_agree_with_python(texts):
    data = " ".join(texts).encode()
    starts, pos = [], 0
    for t in texts:
        starts.append(pos)
        pos += len(t.encode()) + 1
    start = np.array(starts)
    end = start + np.array([len(t.encode()) for t in texts])
    buf = np.frombuffer(data, dtype=np.uint8)
    ints, ok = parse_ints(buf, start, end)
    for t, v, good in zip(texts, ints.tolist(), ok.tolist()):
        if good:
            assert v == int(t)
    floats, ok = parse_floats(buf, start, end)
    for t, v, good in zip(texts, floats.tolist(), ok.tolist()):
        if good:
            assert v == float(t) or (v != v and float(t) != float(t))
    assert parse_ints(buf, start[:0], end[:0])[0].size == 0


@settings(max_examples=300)
@given(st.lists(st.one_of(st.from_regex(FLOAT_TEXT, fullmatch=True), st.from_regex(INT_TEXT, fullmatch=True),
                          st.floats().map(repr), st.integers(-(10**20), 10**20).map(str), st.text(max_size=6),
                          st.sampled_from(["0x10", "nan(1)", "1_000", "+5", " 5", "Infinity", "1e400", "١٢"])),
                min_size=1, max_size=20))
def test_arrow_casts_agree_with_python(texts):
    """pyarrow converts only texts of a plain decimal form, to Python's value (it alone would
    also read ``0x10`` as 16 and ``nan(1)`` as NaN)."""
    import pyarrow as pa

    strings = pa.array(texts, pa.string())
    ints, ok = _cast_texts(strings, INT_TEXT, "int64")
    for t, v, good in zip(texts, ints.tolist(), ok.tolist()):
        if good:
            assert v == int(t)
    floats, ok = _cast_texts(strings, FLOAT_TEXT, "float64")
    for t, v, good in zip(texts, floats.tolist(), ok.tolist()):
        if good:
            assert v == float(t) or (v != v and float(t) != float(t))
        assert good == bool(re.fullmatch(FLOAT_TEXT, t))   # every plain decimal is read
    assert _cast_texts(pa.array(["0x10", "nan(1)"]), INT_TEXT, "int64")[1].tolist() == [False, False]
    assert _cast_texts(pa.array(["0x10", "nan(1)"]), FLOAT_TEXT, "float64")[1].tolist() == [False, False]


@pytest.mark.parametrize("text,value", [("12", 12), ("-7", -7), ("+5", 5), ("007", 7)])
def test_parse_ints_by_hand(text, value):
    buf = np.frombuffer(text.encode(), dtype=np.uint8)
    values, ok = parse_ints(buf, np.array([0]), np.array([len(text)]))
    assert ok.tolist() == [True] and values.tolist() == [value]


# -- the traces, through every reader ---------------------------------------------------------------------


def load_with(monkeypatch, loader, path, reader, **kwargs):
    """``(result or error message, reader that read the file)`` of a trace loader forced to start
    with ``reader``."""
    from schedlab_plugins.workloads import traces

    used = []

    def read_records_with(*args, **kw):
        records = read_records(*args, **{**kw, "reader": reader})
        used.append(records.reader)
        return records

    monkeypatch.setattr(traces, "read_records", read_records_with)
    try:
        arrival, columns, n_zero = loader(path, **kwargs)
    except WorkloadError as exc:
        return str(exc), used
    return (arrival.tolist(), columns.prompt_tokens.tolist(), columns.output_tokens.tolist(),
            {k: list(v) for k, v in columns.per_row.items()}, n_zero), used


TRACES = {
    "mooncake": ("m.jsonl", "".join(
        f'{{"timestamp": {27000 + 3000 * (i // 3)}, "input_length": {600 * (i % 5)}, "output_length": {i % 7}, '
        f'"hash_ids": {list(range(i, i - (-600 * (i % 5) // 512)))}}}\n' for i in range(40))),
    "azure": ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:{i // 10:02d}:{i % 60:02d}.{i:07d},{i * 37 % 5000},{i % 9}\n" for i in range(40))),
    "vidur": ("v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
        f"{i * 0.137:.6f},{i * 37 % 5000},{i % 9}\n" for i in range(40))),
}


@pytest.mark.parametrize("trace", sorted(TRACES))
@pytest.mark.parametrize("zero_tokens", ["clamp", "drop", "error"])
def test_traces_read_the_same_through_every_reader(tmp_path, monkeypatch, trace, zero_tokens):
    from schedlab_plugins.workloads import traces

    loader = {"mooncake": traces.load_mooncake, "azure": traces.load_azure, "vidur": traces.load_vidur}[trace]
    name, text = TRACES[trace]
    path = tmp_path / name
    path.write_text(text)
    results = {reader: load_with(monkeypatch, loader, path, reader, zero_tokens=zero_tokens, limit=30)
               for reader in ("arrow", "numpy", "python")}
    assert results["arrow"][1] == ["arrow"] and results["python"][1] == ["python"]
    assert results["arrow"][0] == results["numpy"][0] == results["python"][0]
    # rows 0-29 with a 0: mooncake i % 5 == 0 or i % 7 == 0 (10 rows), the CSVs i % 9 == 0 (4 rows)
    if zero_tokens == "error":
        assert f"line {1 if trace == 'mooncake' else 2}: " in results["arrow"][0]
    else:
        kept = 30 if zero_tokens == "clamp" else 30 - (10 if trace == "mooncake" else 4)
        assert len(results["arrow"][0][0]) == kept
    if trace == "mooncake" and zero_tokens == "clamp":
        assert results["arrow"][0][3]["block_hashes"][:3] == [(), (1, 2), (2, 3, 4)]


@pytest.mark.parametrize("value", ["1" + "0" * 30, "1e30", '"1e30"', str(2**63)])
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_whole_number_beyond_int64_is_refused_alike_by_every_reader(tmp_path, value, fmt):
    """It ended in an OverflowError traceback (int64 columns) instead of naming its line."""
    path = tmp_path / f"r.{fmt}"
    if fmt == "jsonl":
        path.write_text('{"prompt_tokens": 10, "output_tokens": 5}\n'
                        f'{{"prompt_tokens": {value}, "output_tokens": 5}}\n')
    else:
        path.write_text(f"prompt_tokens,output_tokens\n10,5\n{value.strip(chr(34))},5\n")
    messages = set()
    for reader, records in read_all(path).items():
        assert not isinstance(records, str), (reader, records)
        with pytest.raises(WorkloadError) as error:
            records.ints("prompt_tokens")
        messages.add(str(error.value))
    line = 2 if fmt == "jsonl" else 3
    assert len(messages) == 1
    assert f"line {line}: prompt_tokens: must be a whole number from 1 to 9,223,372,036,854,775,807" in messages.pop()
    # with the field's own bound, that bound is named (it said the int64 range: review s80 workloads)
    for name in ("ints", "optional_ints"):
        bounded = set()
        for reader, records in read_all(path).items():
            with pytest.raises(WorkloadError) as error:
                getattr(records, name)("prompt_tokens", min=1, max=10**8)
            bounded.add(str(error.value))
        assert len(bounded) == 1
        assert f"line {line}: prompt_tokens: must be <= 10**8, got " in bounded.pop()
