"""Several JSON documents in one text, and what json raises besides syntax errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from schedlab.json_text import JsonTextError, json_documents

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                      | st.text(), lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(), inner, max_size=3), max_leaves=10)


@given(st.lists(VALUES, min_size=1, max_size=4), st.sampled_from(["\n", " \r\n\t"]))
def test_documents_one_after_another_read_back(values, separator):
    text = separator + separator.join(json.dumps(v) for v in values) + separator
    assert json_documents(text) == values


def test_documents_need_no_separator_where_json_does_not():
    assert json_documents('{"a": 1}{"b": [2]}"c"[]') == [{"a": 1}, {"b": [2]}, "c", []]
    assert json_documents("12") == [12]  # (two numbers run together are one)


@pytest.mark.parametrize("text, document, line, reason, detail", [
    ("", 1, 1, "Expecting value", "Expecting value: line 1 column 1"),
    ('{"a": 1}\n{"b": }', 2, 2, "Expecting value", "document 2: Expecting value: line 2 column 7"),
    ('{"a": "cut sho', 1, 1, "Unterminated string starting at", "Unterminated string starting at: line 1 column 7"),
    ('{"a": 1}' + "[" * 100_000, 2, None, "lists or objects nested too deeply to read",
     "document 2: lists or objects nested too deeply to read"),
    ("1" * 5000, 1, None, "a number too long to read (more than 4300 digits)",
     "a number too long to read (more than 4300 digits)"),
])
def test_text_that_is_not_json_names_the_document(text, document, line, reason, detail):
    with pytest.raises(JsonTextError) as info:
        json_documents(text)
    assert (info.value.document, info.value.line, info.value.reason, info.value.detail) == (document, line, reason,
                                                                                            detail)
