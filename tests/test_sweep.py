"""Sweep grids and point labels."""

from __future__ import annotations

import pytest
import tomli
from hypothesis import given, strategies as st

from schedlab.errors import ConfigError
from schedlab.study.sweep import expand_grid, point_label

WHERE = "lab.toml: [sweep]"


def test_two_keys_form_a_grid_last_key_fastest():
    sweep = {"workload.rate": [5, 10, 20, 40], "scheduler.max_num_seqs": [16, 32]}
    assert expand_grid(sweep, WHERE) == [
        {"workload.rate": 5, "scheduler.max_num_seqs": 16},
        {"workload.rate": 5, "scheduler.max_num_seqs": 32},
        {"workload.rate": 10, "scheduler.max_num_seqs": 16},
        {"workload.rate": 10, "scheduler.max_num_seqs": 32},
        {"workload.rate": 20, "scheduler.max_num_seqs": 16},
        {"workload.rate": 20, "scheduler.max_num_seqs": 32},
        {"workload.rate": 40, "scheduler.max_num_seqs": 16},
        {"workload.rate": 40, "scheduler.max_num_seqs": 32},
    ]


def test_key_order_is_the_written_order():
    sweep = {"b": [1, 2], "a": ["x", "y"]}
    points = expand_grid(sweep, WHERE)
    assert [list(p) for p in points] == [["b", "a"]] * 4
    assert [(p["b"], p["a"]) for p in points] == [(1, "x"), (1, "y"), (2, "x"), (2, "y")]


def test_three_keys():
    points = expand_grid({"a": [1, 2], "b": [True], "c": ["p", "q"]}, WHERE)
    assert [(p["a"], p["b"], p["c"]) for p in points] == [
        (1, True, "p"), (1, True, "q"), (2, True, "p"), (2, True, "q"),
    ]


def test_single_key_and_empty_table():
    assert expand_grid({"workload.rate": [1.5]}, WHERE) == [{"workload.rate": 1.5}]
    assert expand_grid({}, WHERE) == [{}]


def test_values_may_be_lists_or_tables():
    points = expand_grid({"workload.sizes": [[1, 2], [3]], "workload.mix": [{"a": 1}]}, WHERE)
    assert points == [
        {"workload.sizes": [1, 2], "workload.mix": {"a": 1}},
        {"workload.sizes": [3], "workload.mix": {"a": 1}},
    ]


def test_quoted_and_unquoted_toml_keys():
    table = tomli.loads('[sweep]\n"workload.rate" = [5, 10]\nscheduler.max_num_seqs = [16, 32]\n')["sweep"]
    points = expand_grid(table, WHERE)
    assert points[:2] == [
        {"workload.rate": 5, "scheduler.max_num_seqs": 16},
        {"workload.rate": 5, "scheduler.max_num_seqs": 32},
    ]
    assert len(points) == 4


@pytest.mark.parametrize(
    "table, key_text",
    [
        ({"workload.rate": 5}, "'workload.rate'"),  # not a list
        ({"workload.rate": []}, "'workload.rate'"),  # empty list
        ({"workload.rate": "5, 10"}, "'workload.rate'"),
        ({"workload": {"rate": 5}}, "'workload.rate'"),  # unquoted dotted key, bad value
        ({"workload": {}}, "'workload'"),
        ({3: [1, 2]}, "3"),  # key that is not text
        ({"workload..rate": [1]}, "'workload..rate'"),
        ({"workload.rate": [5, 10, 5]}, "'workload.rate' lists 5 twice"),
        ({"workload.rate": [1], "workload": {"rate": [2]}}, "'workload.rate' is given twice"),
    ],
)
def test_errors_name_where_and_key(table, key_text):
    with pytest.raises(ConfigError) as info:
        expand_grid(table, WHERE)
    message = str(info.value)
    assert message.startswith(WHERE + ": ")
    assert key_text in message


def test_equal_values_of_different_types_are_distinct():
    assert len(expand_grid({"x": [1, 1.0, True]}, WHERE)) == 3


def test_not_a_table():
    with pytest.raises(ConfigError, match=r"^lab.toml: \[sweep\]: must be a table"):
        expand_grid([1, 2], WHERE)


def test_grid_too_large():
    sweep = {f"k{i}": list(range(10)) for i in range(6)}
    with pytest.raises(ConfigError, match=r"10 x 10 x 10 x 10 x 10 x 10 = 1,000,000 points; at most 10,000"):
        expand_grid(sweep, WHERE)
    with pytest.raises(ConfigError, match="2 x 3 = 6 points; at most 5"):
        expand_grid({"a": [1, 2], "b": [1, 2, 3]}, WHERE, max_points=5)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_grid_size_and_coverage(sizes):
    sweep = {f"k{i}": list(range(n)) for i, n in enumerate(sizes)}
    points = expand_grid(sweep, WHERE)
    expected_count = 1
    for n in sizes:
        expected_count *= n
    assert len(points) == expected_count
    as_tuples = [tuple(p[f"k{i}"] for i in range(len(sizes))) for p in points]
    # every combination exactly once, in lexicographic order (= last key fastest)
    assert len(set(as_tuples)) == expected_count
    assert as_tuples == sorted(as_tuples)


# --- labels ----------------------------------------------------------------------------------


def test_label_uses_last_component():
    assert point_label({"workload.rate": 5, "scheduler.max_num_seqs": 16}) == "rate=5,max_num_seqs=16"


def test_label_uses_full_key_when_last_components_clash():
    point = {"workload.rate": 5, "router.rate": 2.5, "scheduler.max_num_seqs": 16}
    assert point_label(point) == "workload.rate=5,router.rate=2.5,max_num_seqs=16"
    assert point_label({"rate": 1, "workload.rate": 2}) == "rate=1,workload.rate=2"


def test_label_value_formats():
    point = {"a.path": "other.json", "b.on": True, "c.off": False, "d.x": 0.1, "e.l": [1, 2], "f.t": {"k": 1}}
    assert point_label(point) == "path=other.json,on=true,off=false,x=0.1,l=[1,2],t={k=1}"


def test_label_of_empty_point():
    assert point_label({}) == ""


def test_labels_of_a_grid_are_distinct():
    points = expand_grid({"workload.rate": [5, 10], "router.rate": [5, 10], "seed": [1, 2]}, WHERE)
    labels = [point_label(p) for p in points]
    assert len(set(labels)) == len(points) == 8
    assert labels[0] == "workload.rate=5,router.rate=5,seed=1"
