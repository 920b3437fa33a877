"""Dotted keys, ``--set`` parsing and the ``[[runs]]`` merge rule."""

from __future__ import annotations

import copy
import datetime

import pytest
import tomli
from hypothesis import given, strategies as st

from schedlab.errors import ConfigError
from schedlab.study.overrides import (get_dotted, merge_tables, parse_assignment, run_key_part, set_dotted, split_key,
                                      split_run_key)

# --- parse_assignment ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("workload.rate=5", ("workload.rate", 5)),
        ("workload.rate=0.5", ("workload.rate", 0.5)),
        ("workload.rate=-2", ("workload.rate", -2)),
        ("workload.rate=1e3", ("workload.rate", 1000.0)),
        ("workload.rate=1_000", ("workload.rate", 1000)),
        ('scheduler.policy="fcfs"', ("scheduler.policy", "fcfs")),
        ("scheduler.policy='fcfs'", ("scheduler.policy", "fcfs")),
        ("scheduler.preempt=true", ("scheduler.preempt", True)),
        ("scheduler.preempt=false", ("scheduler.preempt", False)),
        ("workload.sizes=[1, 2]", ("workload.sizes", [1, 2])),
        ("workload.mix={a = 1}", ("workload.mix", {"a": 1})),
        ("workload.mix={a = 1, b = [true]}", ("workload.mix", {"a": 1, "b": [True]})),
        ("name=x", ("name", "x")),
        ("  workload.rate  =  7  ", ("workload.rate", 7)),
        ('title="a=b"', ("title", "a=b")),  # only the first "=" splits
        ('title=""', ("title", "")),
        ("kv-cache.block_size=16", ("kv-cache.block_size", 16)),
        ("start=1979-05-27", ("start", datetime.date(1979, 5, 27))),
        ("workload.rate=5 # a comment", ("workload.rate", 5)),
    ],
)
def test_toml_values(text, expected):
    assert parse_assignment(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("workload.path=other.json", ("workload.path", "other.json")),
        ("workload.path=../data/trace.csv", ("workload.path", "../data/trace.csv")),
        ("scheduler.kind=fcfs", ("scheduler.kind", "fcfs")),
        ("scheduler.kind=sarathi-serve", ("scheduler.kind", "sarathi-serve")),
        ("label=hello world", ("label", "hello world")),
        ("flag=True", ("flag", "True")),  # not TOML's true: text, which a bool field rejects
        ("version=1.2.3", ("version", "1.2.3")),
    ],
)
def test_bare_words_are_text(text, expected):
    assert parse_assignment(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "workload.rate",  # no "="
        "=5",  # no key
        "workload..rate=5",  # empty part
        ".rate=5",
        "workload.rate.=5",
        "work load.rate=5",  # space inside a key part
        "workload.rate=",  # no value
        "workload.sizes=[1, 2",  # unclosed list
        "workload.mix={a = 1",  # unclosed table
        'title="unterminated',  # unclosed string
        "title='unterminated",
        "workload.rate=.5",  # number-like but not TOML
        "workload.rate=5.",
        "workload.rate=007",
        "workload.rate=5\nother=6",  # smuggled second line
    ],
)
def test_bad_assignments_raise_config_error_quoting_the_text(text):
    with pytest.raises(ConfigError) as info:
        parse_assignment(text)
    assert repr(text) in str(info.value)


def test_a_value_nested_past_tomls_limit_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"^--set 'workload.rate=\[{186}\.\.\.': arrays or inline tables nested "
                                          r"too deeply$"):
        parse_assignment("workload.rate=" + "[" * 1000 + "]" * 1000)


def test_an_integer_past_pythons_digit_limit_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"Exceeds the limit \(4300 digits\) for integer string conversion"):
        parse_assignment("workload.rate=1" + "0" * 5000)


def test_where_names_the_source():
    with pytest.raises(ConfigError, match=r"^runs\[2\] 'oops': "):
        parse_assignment("oops", where="runs[2]")


def test_quoting_rescues_number_like_text():
    assert parse_assignment('code="007"') == ("code", "007")


_values = st.recursive(
    st.integers(-10**6, 10**6)
    | st.booleans()
    | st.text(alphabet="abcxyz_-. /", max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False, width=64),
    lambda children: st.lists(children, max_size=3),
    max_leaves=6,
)


def _toml(value) -> str:
    """A hand-written TOML rendering (not the code under test) for the round-trip property."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value + '"'
    return "[" + ", ".join(_toml(v) for v in value) + "]"


@given(_values)
def test_quoted_toml_values_round_trip(value):
    assert parse_assignment("a.b=" + _toml(value)) == ("a.b", value)


# --- split_key / get_dotted / set_dotted -----------------------------------------------------


def test_split_key():
    assert split_key("scheduler.max_num_seqs") == ("scheduler", "max_num_seqs")
    assert split_key("name") == ("name",)
    with pytest.raises(ConfigError, match="bad key 'a..b'"):
        split_key("a..b")
    with pytest.raises(ConfigError, match="keys must be text"):
        split_key(3)


TABLES = {
    "workload": {"kind": "poisson", "rate": 5.0, "mix": {"short": 0.7}},
    "scheduler": {"kind": "vllm", "max_num_seqs": 64},
    "seed": 1,
}


def test_get_dotted():
    assert get_dotted(TABLES, "workload.rate") == 5.0
    assert get_dotted(TABLES, "workload.mix.short") == 0.7
    assert get_dotted(TABLES, "scheduler") == {"kind": "vllm", "max_num_seqs": 64}
    assert get_dotted(TABLES, "seed") == 1


def test_get_dotted_missing_key_lists_what_exists():
    with pytest.raises(ConfigError) as info:
        get_dotted(TABLES, "workload.rat")
    message = str(info.value)
    assert "'workload.rat'" in message
    assert "kind, mix, rate" in message


def test_get_dotted_default_and_non_table():
    assert get_dotted(TABLES, "workload.burst", None) is None
    assert get_dotted(TABLES, "router.kind", "none") == "none"
    with pytest.raises(ConfigError, match=r"'seed' is 1, not a table"):
        get_dotted(TABLES, "seed.value")


def test_set_dotted_does_not_mutate_input():
    before = copy.deepcopy(TABLES)
    result = set_dotted(TABLES, "workload.mix.short", 0.5)
    assert TABLES == before
    assert result["workload"]["mix"] == {"short": 0.5}
    assert result["scheduler"] == {"kind": "vllm", "max_num_seqs": 64}
    # nothing shared: changing the result leaves the input alone
    result["scheduler"]["max_num_seqs"] = 1
    assert TABLES["scheduler"]["max_num_seqs"] == 64


def test_set_dotted_creates_intermediate_tables():
    result = set_dotted({}, "router.policy.name", "round_robin")
    assert result == {"router": {"policy": {"name": "round_robin"}}}
    assert set_dotted({"a": 1}, "b", 2) == {"a": 1, "b": 2}


def test_set_dotted_replaces_a_whole_table():
    assert set_dotted({"a": {"x": 1}}, "a", 3) == {"a": 3}


def test_set_dotted_through_a_non_table_names_the_key():
    with pytest.raises(ConfigError) as info:
        set_dotted(TABLES, "workload.rate.mean", 3)
    message = str(info.value)
    assert "'workload.rate.mean'" in message
    assert "'workload.rate' is 5.0, not a table" in message


@given(
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4).map(".".join),
    st.integers(),
)
def test_set_then_get_returns_the_value(key, value):
    tables = {"a": {"b": {"z": 0}}, "c": {}}
    before = copy.deepcopy(tables)
    try:
        result = set_dotted(tables, key, value)
    except ConfigError:
        return  # a prefix of the key is a non-table value, checked elsewhere
    assert get_dotted(result, key) == value
    assert tables == before


# --- merge_tables -------------------------------------------------------------------------


BASE = {
    "workload": {"kind": "poisson", "rate": 5.0, "seed": 1},
    "scheduler": {"kind": "vllm", "max_num_seqs": 64, "limits": {"tokens": 8192, "seqs": 256}},
    "cost_model": {"kind": "roofline"},
}


def test_same_kind_merges_recursively():
    override = {"scheduler": {"kind": "vllm", "limits": {"tokens": 4096}}}
    merged = merge_tables(BASE, override)
    assert merged["scheduler"] == {"kind": "vllm", "max_num_seqs": 64, "limits": {"tokens": 4096, "seqs": 256}}
    assert merged["workload"] == BASE["workload"]
    assert merged["cost_model"] == {"kind": "roofline"}


def test_no_kind_in_override_merges():
    merged = merge_tables(BASE, {"workload": {"rate": 20.0}})
    assert merged["workload"] == {"kind": "poisson", "rate": 20.0, "seed": 1}


def test_different_kind_replaces_the_table():
    override = {"workload": {"kind": "trace", "path": "t.jsonl"}}
    merged = merge_tables(BASE, override)
    assert merged["workload"] == {"kind": "trace", "path": "t.jsonl"}
    assert merged["scheduler"] == BASE["scheduler"]


def test_different_kind_in_a_nested_table_replaces_it():
    base = {"router": {"kind": "round_robin", "instance": {"kind": "vllm", "max_num_seqs": 8}}}
    override = {"router": {"instance": {"kind": "sarathi", "chunk": 512}}}
    merged = merge_tables(base, override)
    assert merged == {"router": {"kind": "round_robin", "instance": {"kind": "sarathi", "chunk": 512}}}


def test_a_cluster_of_another_mode_replaces_the_table():
    """A colocated run of a disaggregated default kept its [cluster.prefill] and [cluster.link]:
    refused, with no way to write the run but to move the default's cluster into every other run.
    ``mode`` replaces [cluster] as ``kind`` replaces a plugin's table; the same mode merges."""
    base = {"cluster": {"mode": "disaggregated", "prefill": {"instances": 2}, "link": {"bandwidth_gbps": 25}}}
    merged = merge_tables(base, {"cluster": {"mode": "colocated", "instances": 2}})
    assert merged["cluster"] == {"mode": "colocated", "instances": 2}
    same = merge_tables(base, {"cluster": {"mode": "disaggregated", "decode": {"instances": 3}}})
    assert same["cluster"] == {**base["cluster"], "decode": {"instances": 3}}
    # below the top a mode is a plugin's own setting and merges as any key
    nested = merge_tables({"scheduler": {"x": {"mode": "a", "k": 1}}}, {"scheduler": {"x": {"mode": "b"}}})
    assert nested == {"scheduler": {"x": {"mode": "b", "k": 1}}}


def test_a_length_distribution_of_another_dist_replaces_the_table():
    """A run switching its prompts from lognormal to uniform kept the default's median and
    sigma, and was refused for keys it never wrote; the same dist merges."""
    base = {"workload": {"kind": "synthetic", "prompt": {"dist": "lognormal", "median": 300, "sigma": 0.5}}}
    merged = merge_tables(base, {"workload": {"prompt": {"dist": "uniform", "low": 100, "high": 900}}})
    assert merged["workload"] == {"kind": "synthetic", "prompt": {"dist": "uniform", "low": 100, "high": 900}}
    same = merge_tables(base, {"workload": {"prompt": {"dist": "lognormal", "sigma": 1.0}}})
    assert same["workload"]["prompt"] == {"dist": "lognormal", "median": 300, "sigma": 1.0}


def test_a_key_a_run_inherited_and_cannot_remove_is_said_to_be_inherited(tmp_path):
    from schedlab.study.experiment import load

    path = tmp_path / "runs.toml"
    path.write_text('[workload]\nkind = "synthetic"\nnum_requests = 5\nrate = 1\n'
                    'prompt = {dist = "lognormal", median = 300, sigma = 0.5}\noutput = {dist = "fixed", value = 5}\n'
                    '[[runs]]\nname = "uniform"\nworkload = {prompt = {dist = "uniform", low = 100, high = 900}}\n'
                    '[[runs]]\nname = "staged"\nworkload = {stages = [{rate = 1, duration_s = 5}]}\n')
    with pytest.raises(ConfigError, match=r"\[\[runs\]\] 'staged' \[workload\]: num_requests: give either .*"
                                          r"\(num_requests comes from the file's \[workload\] defaults: a \[\[runs\]\] "
                                          r"entry merges over them and cannot remove a key"):
        load(path)
    # a key the run wrote itself is its own mistake: no such note
    path.write_text(path.read_text().replace("{stages = [{rate = 1, duration_s = 5}]}",
                                             "{num_requests = -1}"))
    with pytest.raises(ConfigError, match="num_requests") as err:
        load(path)
    assert "defaults" not in str(err.value)


def test_base_without_kind_merges_into_override_kind():
    base = {"scheduler": {"max_num_seqs": 64}}
    merged = merge_tables(base, {"scheduler": {"kind": "sarathi", "chunk": 512}})
    assert merged == {"scheduler": {"max_num_seqs": 64, "kind": "sarathi", "chunk": 512}}


def test_new_tables_and_values_are_added():
    merged = merge_tables(BASE, {"router": {"kind": "least_loaded"}, "name": "run-a"})
    assert merged["router"] == {"kind": "least_loaded"}
    assert merged["name"] == "run-a"


def test_merge_does_not_mutate_and_shares_nothing():
    base = copy.deepcopy(BASE)
    override = {"scheduler": {"limits": {"tokens": 1}}, "report": {"kind": "csv", "cols": [1, 2]}}
    override_before = copy.deepcopy(override)
    merged = merge_tables(base, override)
    assert base == BASE and override == override_before
    merged["scheduler"]["limits"]["seqs"] = 0
    merged["report"]["cols"].append(3)
    merged["workload"]["rate"] = 0.0
    assert base == BASE and override == override_before


def test_table_replaced_by_value_is_an_error():
    with pytest.raises(ConfigError, match=r"^lab.toml: runs\[1\]: 'scheduler' is a table"):
        merge_tables(BASE, {"scheduler": "vllm"}, where="lab.toml: runs[1]")
    with pytest.raises(ConfigError, match=r"'scheduler.max_num_seqs' is the value 64"):
        merge_tables(BASE, {"scheduler": {"max_num_seqs": {"a": 1}}})


# --- run names in --set runs.NAME... -----------------------------------------------------------------------


@given(st.text(min_size=1, max_size=30))
def test_a_run_name_written_as_a_key_part_reads_back(name):
    """Any name, written by run_key_part, is the run split_run_key finds (and TOML reads it back)."""
    part = run_key_part(name)
    assert tomli.loads(f"{part} = 1") == {name: 1}
    assert split_run_key(f"runs.{part}.scheduler.max_num_seqs", [name, name + ".x"]) == (name, "scheduler.max_num_seqs")
