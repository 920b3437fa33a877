"""The vectorised JSONL and CSV readers give exactly what the Python readers give: the same
rows, values and conversions, or the same error message -- on files the tests make."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.errors import WorkloadError
from schedlab_plugins.workloads.fast_text import RawColumn, parse_floats, parse_ints
from schedlab_plugins.workloads.records import read_records
from schedlab_plugins.workloads.request_file import FILE_FIELDS, REQUIRED_FIELDS

WANTED = {**FILE_FIELDS, "hash_ids": ("hash_ids",)}
KEYS = [name for names in WANTED.values() for name in names] + ["other", "Prompt_tokens", "é"]


def read_both(path, required=REQUIRED_FIELDS, limit=None):
    """``(fast, python)``: each either Records or the WorkloadError message."""
    out = []
    for vectorised in (True, False):
        try:
            out.append(read_records(path, WANTED, required=required, limit=limit, vectorised=vectorised))
        except WorkloadError as exc:
            out.append(str(exc))
    return out


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
    fast, python = read_both(path, required, limit)
    if isinstance(python, str) or isinstance(fast, str):
        assert fast == python
        return None
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
    return fast


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
    assert_same(path, limit=limit)
    assert_same(path, required=(), limit=limit)


def test_jsonl_typical_file_is_read_by_numpy(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [{"arrival_ms": 12.5 * i, "prompt_tokens": 10 + i, "output_tokens": 5, "client": f"u{i % 3}",
             "class": "chat", "priority": -1, "max_tokens": None} for i in range(50)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    records = assert_same(path)
    column = records.values["prompt_tokens"]
    assert isinstance(column, RawColumn) and not column.objs   # no row left to json.loads
    assert records.ints("prompt_tokens").tolist() == [10 + i for i in range(50)]
    assert records.floats("arrival_ms").tolist() == [12.5 * i for i in range(50)]
    assert records.sources["request_class"] == "class"
    assert records.texts("client")[:4] == ["u0", "u1", "u2", "u0"]


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
    assert_same(path, limit=limit)
    assert_same(path, required=(), limit=limit)


def test_csv_number_too_big_for_a_float_is_refused_by_every_reader(tmp_path):
    """``1e400`` reads as inf: not a finite number, as the Python reader says (the numpy reader
    once returned inf)."""
    path = tmp_path / "r.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_ms\n1,2,5\n1,2,1e400\n")
    fast = assert_same(path)
    assert outcome(lambda: fast.floats("arrival_ms")) == (
        "error", "WorkloadError", f"{path}: line 3: arrival_ms: must be a number >= 0, got '1e400'")


def test_csv_typical_file_is_read_by_numpy(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("When,ContextTokens,GeneratedTokens\n" + "".join(f"{i * 0.5},{100 + i},{7 + i}\n" for i in range(30)))
    wanted = {"arrival_ms": ("When",), "prompt_tokens": ("ContextTokens",), "output_tokens": ("GeneratedTokens",)}
    fast = read_records(path, wanted, required=("prompt_tokens", "output_tokens"))
    assert isinstance(fast.values["prompt_tokens"], RawColumn)
    assert fast.ints("prompt_tokens").tolist() == list(range(100, 130))
    assert fast.floats("arrival_ms").tolist() == [i * 0.5 for i in range(30)]
    assert list(fast.positions) == list(range(2, 32))


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


@pytest.mark.parametrize("text,value", [("12", 12), ("-7", -7), ("+5", 5), ("007", 7)])
def test_parse_ints_by_hand(text, value):
    buf = np.frombuffer(text.encode(), dtype=np.uint8)
    values, ok = parse_ints(buf, np.array([0]), np.array([len(text)]))
    assert ok.tolist() == [True] and values.tolist() == [value]
