"""Tests of the built-in workloads (schedlab_plugins.workloads).

Small files are written by each test; expected values are worked out by hand in the test.
"""

from __future__ import annotations

import heapq
import json
import zlib

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.configs import from_table, int_field
from schedlab.errors import ConfigError, WorkloadError
from schedlab.model import Request
from schedlab.registry import Registry
from schedlab_plugins import workloads
from schedlab_plugins.workloads.arrivals import JITTER_STREAM, stream_rng

NAMES = ("file", "inline", "synthetic", "shared_prefix", "azure", "vidur", "mooncake", "mix", "closed_loop", "vllm_log",
         "vllm_bench", "inference_perf", "guidellm", "diurnal", "mlenergy", "burstgpt")


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry("workload").providing("test")
    workloads.schedlab_register_workloads(register=reg)
    return reg


def make(registry: Registry, table: dict, base_dir=None):
    """Build a workload from a TOML-like table, as an experiment would."""
    table = dict(table)
    entry = registry.get(table.pop("kind"))
    return entry.factory(from_table(entry.config, table, where="test.toml: [workload]", base_dir=base_dir))


def fixed(n: int) -> dict:
    return {"dist": "fixed", "value": n}


def arrivals(workload, seed: int = 0) -> list[float]:
    return [r.arrival_ms for r in workload.requests(seed)]


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


# --- registration --------------------------------------------------------------------------


def test_every_workload_is_registered_with_a_documented_config(registry):
    assert sorted(e.name for e in registry) == sorted(NAMES)
    for entry in registry:
        assert entry.help
        assert entry.config is not None and attrs.has(entry.config)
        for field in attrs.fields(entry.config):
            assert field.metadata.get("help"), f"{entry.name}.{field.name} has no help text"


def test_help_texts_name_every_arrival_kind(registry):
    """``file`` said "file, Poisson or all-at-once arrivals", ``synthetic`` left out constant, and
    rate's help named poisson and gamma only."""
    for name in ("file", "synthetic"):
        help = registry.get(name).help
        assert all(kind in help for kind in ("Poisson", "gamma", "constant", "all-at-once")), (name, help)
    assert "file's arrival times" in registry.get("file").help
    fields = {f.name: f for f in attrs.fields(registry.get("synthetic").config)}
    assert all(kind in fields["rate"].metadata["help"] for kind in ("'poisson'", "'gamma'", "'constant'"))
    assert "'gamma' only" in fields["cv"].metadata["help"]


def test_open_loop_workloads_declare_it(registry, tmp_path):
    write(tmp_path / "r.json", '[{"prompt_tokens": 1, "output_tokens": 1}]')
    w = make(registry, {"kind": "file", "path": "r.json"}, base_dir=tmp_path)
    assert w.closed_loop is False
    stream = w.requests(0)
    assert iter(stream) is stream  # a generator, not a list


# --- file: formats -------------------------------------------------------------------------


def test_json_list_gives_exact_requests(registry, tmp_path):
    write(tmp_path / "r.json", json.dumps([
        {"prompt_tokens": 10, "output_tokens": 5, "arrival_ms": 0},
        {"prompt_tokens": 20, "output_tokens": 7, "arrival_ms": 12.5},
    ]))
    w = make(registry, {"kind": "file", "path": "r.json"}, base_dir=tmp_path)
    assert list(w.requests(0)) == [
        Request(id=0, arrival_ms=0.0, prompt_tokens=10, output_tokens=5),
        Request(id=1, arrival_ms=12.5, prompt_tokens=20, output_tokens=7),
    ]


def test_json_requests_object_without_arrivals_sends_all_at_zero(registry, tmp_path):
    # the seed lab's requests.json shape
    write(tmp_path / "requests.json", json.dumps({"requests": [
        {"prompt_tokens": 3, "output_tokens": 4}, {"prompt_tokens": 5, "output_tokens": 6}]}))
    w = make(registry, {"kind": "file", "path": str(tmp_path / "requests.json")})
    assert [(r.id, r.arrival_ms, r.prompt_tokens, r.output_tokens) for r in w.requests(1)] == [
        (0, 0.0, 3, 4), (1, 0.0, 5, 6)]


def test_jsonl_with_optional_fields(registry, tmp_path):
    write(tmp_path / "r.jsonl", "\n".join([
        '{"prompt_tokens": 8, "output_tokens": 2, "arrival_ms": 1, "max_tokens": 4, "priority": 2,'
        ' "client": "alice", "class": "chat", "prefix_group": "sys", "prefix_tokens": 6}',
        "",  # blank lines are skipped
        '{"prompt_tokens": 9, "output_tokens": 3, "arrival_ms": 2}',
    ]) + "\n")
    got = list(make(registry, {"kind": "file", "path": "r.jsonl"}, base_dir=tmp_path).requests(0))
    assert got == [
        Request(id=0, arrival_ms=1.0, prompt_tokens=8, output_tokens=2, max_tokens=4, priority=2,
                client="alice", request_class="chat", prefix_group="sys", prefix_tokens=6),
        Request(id=1, arrival_ms=2.0, prompt_tokens=9, output_tokens=3),
    ]


def test_csv_with_column_mapping(registry, tmp_path):
    write(tmp_path / "t.csv", "When,ContextTokens,GeneratedTokens,class\n0,100,10,batch\n250,200,20,chat\n")
    w = make(registry, {"kind": "file", "path": "t.csv", "columns": {
        "prompt_tokens": "ContextTokens", "output_tokens": "GeneratedTokens", "arrival_ms": "When"}},
        base_dir=tmp_path)
    assert list(w.requests(0)) == [
        Request(id=0, arrival_ms=0.0, prompt_tokens=100, output_tokens=10, request_class="batch"),
        Request(id=1, arrival_ms=250.0, prompt_tokens=200, output_tokens=20, request_class="chat"),
    ]


def test_format_setting_overrides_the_extension(registry, tmp_path):
    write(tmp_path / "r.txt", '{"prompt_tokens": 4, "output_tokens": 1}\n')
    w = make(registry, {"kind": "file", "path": "r.txt", "format": "jsonl"}, base_dir=tmp_path)
    assert [r.prompt_tokens for r in w.requests(0)] == [4]
    with pytest.raises(WorkloadError, match="format"):
        make(registry, {"kind": "file", "path": "r.txt"}, base_dir=tmp_path)


def test_unsorted_file_arrivals_are_sorted_and_renumbered(registry, tmp_path):
    write(tmp_path / "r.csv", "arrival_ms,prompt_tokens,output_tokens\n30,1,1\n10,2,2\n30,3,3\n0,4,4\n")
    got = [(r.id, r.arrival_ms, r.prompt_tokens) for r in make(
        registry, {"kind": "file", "path": "r.csv"}, base_dir=tmp_path).requests(0)]
    assert got == [(0, 0.0, 4), (1, 10.0, 2), (2, 30.0, 1), (3, 30.0, 3)]


def test_file_limit_time_scale_and_max_tokens_cap(registry, tmp_path):
    write(tmp_path / "r.csv", "arrival_ms,prompt_tokens,output_tokens,max_tokens\n"
                              "0,1,10,\n100,1,10,3\n200,1,10,50\n300,1,10,\n")
    w = make(registry, {"kind": "file", "path": "r.csv", "limit": 3, "time_scale": 0.5, "max_tokens": 8},
             base_dir=tmp_path)
    assert [(r.arrival_ms, r.max_tokens) for r in w.requests(0)] == [(0.0, 8), (50.0, 3), (100.0, 8)]


def test_file_all_at_once_ignores_file_arrivals(registry, tmp_path):
    write(tmp_path / "r.csv", "arrival_ms,prompt_tokens,output_tokens\n5,1,1\n9,1,1\n")
    w = make(registry, {"kind": "file", "path": "r.csv", "arrival": "all-at-once"}, base_dir=tmp_path)
    assert arrivals(w) == [0.0, 0.0]


# --- file: bad input -----------------------------------------------------------------------


def test_missing_file(registry, tmp_path):
    with pytest.raises(WorkloadError, match=r"nope\.json: file not found"):
        make(registry, {"kind": "file", "path": "nope.json"}, base_dir=tmp_path)


def test_missing_column_names_file_and_column(registry, tmp_path):
    write(tmp_path / "t.csv", "prompt_tokens,GeneratedTokens\n1,2\n")
    with pytest.raises(WorkloadError, match=r"t\.csv: no column 'output_tokens'"):
        make(registry, {"kind": "file", "path": "t.csv"}, base_dir=tmp_path)
    with pytest.raises(WorkloadError, match=r"t\.csv: no column 'Generated'.*GeneratedTokens"):
        make(registry, {"kind": "file", "path": "t.csv", "columns": {"output_tokens": "Generated"}},
             base_dir=tmp_path)


@pytest.mark.parametrize("name, text, unit", [
    ("t.csv", "In,Out\n1,2\n", None),
    ("t.jsonl", '{"In": 1, "Out": 2}\n{"In": 3, "Out": 4}\n', "line"),
    ("t.json", '[{"In": 1, "Out": 2}]', "record"),
])
def test_a_file_without_our_field_names_says_how_to_map_its_own(registry, tmp_path, name, text, unit):
    """A file naming its fields otherwise said "line 1: missing prompt_tokens" (JSON) or listed its
    header (CSV), with no word of the ``columns`` setting that reads it."""
    write(tmp_path / name, text)
    with pytest.raises(WorkloadError) as info:
        make(registry, {"kind": "file", "path": name}, base_dir=tmp_path)
    said = str(info.value)
    assert said.endswith('; a file that names it otherwise takes columns = {prompt_tokens = "<its column>", '
                         'output_tokens = "<its column>"} in [workload]')
    assert (f"no {unit} has prompt_tokens;" if unit else "no column 'prompt_tokens' (for prompt_tokens)") in said
    got = make(registry, {"kind": "file", "path": name, "columns": {"prompt_tokens": "In", "output_tokens": "Out"}},
               base_dir=tmp_path)
    assert [(r.prompt_tokens, r.output_tokens) for r in got.requests(0)][0] == (1, 2)


SHAREGPT = [{"id": "QWJhYvA_0", "conversations": [{"from": "human", "value": "Summarize the main ideas of it"},
                                                  {"from": "gpt", "value": "Here are the main ideas ..."}]},
            {"id": "i6IyJda_0", "conversations": [{"from": "human", "value": "How to tell?"},
                                                  {"from": "gpt", "value": "1. Homogeneity ..."}]}]


@pytest.mark.parametrize("name, text", [
    ("sharegpt.json", json.dumps(SHAREGPT, indent=2)),                       # ShareGPT_V3_unfiltered_cleaned_split
    ("sharegpt.jsonl", "".join(json.dumps(r) + "\n" for r in SHAREGPT)),     # one conversation a line
], ids=["json", "jsonl"])
def test_a_sharegpt_file_is_told_it_holds_text_and_where_its_lengths_are(registry, tmp_path, name, text):
    """ShareGPT's records (``conversations`` of ``{from, value}`` turns, as vLLM's ShareGPTDataset
    reads) hold text: the error said only to map columns, which no column of it can be."""
    write(tmp_path / name, text)
    with pytest.raises(WorkloadError) as info:
        make(registry, {"kind": "file", "path": name}, base_dir=tmp_path)
    said = str(info.value)
    assert f"{name}: no {'record' if name.endswith('.json') else 'line'} has prompt_tokens; it looks like " \
           "ShareGPT-style JSON (a conversations list of turns), which holds the conversations' text, not token " \
           "counts, and schedlab does not tokenize" in said
    assert "etalon_sharegpt_8k_filtered_stats_llama2_tokenizer.csv" in said and 'dist = "empirical"' in said
    assert 'columns = {prompt_tokens = "num_prefill_tokens", output_tokens = "num_decode_tokens"}' in said
    assert "a file that names it otherwise" not in said


def test_the_sharegpt_length_statistics_read_as_requests(registry, tmp_path):
    """The route the ShareGPT error points to: a stats CSV in etalon's layout, its pairs kept."""
    write(tmp_path / "stats.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                                  "74,918,992,0.08\n290,905,1195,0.32\n")
    got = make(registry, {"kind": "file", "path": "stats.csv", "arrival": "all-at-once",
                          "columns": {"prompt_tokens": "num_prefill_tokens", "output_tokens": "num_decode_tokens"}},
               base_dir=tmp_path)
    assert [(r.prompt_tokens, r.output_tokens) for r in got.requests(0)] == [(74, 918), (290, 905)]


@pytest.mark.parametrize("bad", ["1.5", "0", "-3", "many", ""])
def test_bad_token_count_names_file_line_and_field(registry, tmp_path, bad):
    write(tmp_path / "t.csv", f"prompt_tokens,output_tokens\n5,5\n7,{bad}\n")
    with pytest.raises(WorkloadError, match=r"t\.csv: line 3: .*output_tokens") as info:
        make(registry, {"kind": "file", "path": "t.csv"}, base_dir=tmp_path)
    assert "Traceback" not in str(info.value)


def test_bad_token_count_in_mapped_column_names_both_names(registry, tmp_path):
    write(tmp_path / "t.csv", "In,Out\n5,5\n7,2.5\n")
    with pytest.raises(WorkloadError, match=r"t\.csv: line 3: output_tokens \(column 'Out'\).*2\.5"):
        make(registry, {"kind": "file", "path": "t.csv",
                        "columns": {"prompt_tokens": "In", "output_tokens": "Out"}}, base_dir=tmp_path)


def test_integral_floats_are_whole_numbers(registry, tmp_path):
    write(tmp_path / "t.csv", "prompt_tokens,output_tokens\n5.0,7\n")
    assert [r.prompt_tokens for r in make(registry, {"kind": "file", "path": "t.csv"},
                                          base_dir=tmp_path).requests(0)] == [5]


def test_bad_json_line_in_jsonl(registry, tmp_path):
    write(tmp_path / "r.jsonl", '{"prompt_tokens": 1, "output_tokens": 1}\n\n{"prompt_tokens": 1,\n')
    with pytest.raises(WorkloadError, match=r"r\.jsonl: line 3: bad JSON"):
        make(registry, {"kind": "file", "path": "r.jsonl"}, base_dir=tmp_path)


def test_bad_json_file_names_line(registry, tmp_path):
    write(tmp_path / "r.json", '[\n{"prompt_tokens": 1, "output_tokens": 1},\n{oops}\n]')
    with pytest.raises(WorkloadError, match=r"r\.json: line 3: bad JSON"):
        make(registry, {"kind": "file", "path": "r.json"}, base_dir=tmp_path)


def test_json_record_missing_a_key_or_bad_value(registry, tmp_path):
    write(tmp_path / "r.json", '[{"prompt_tokens": 1, "output_tokens": 1}, {"prompt_tokens": 2}]')
    with pytest.raises(WorkloadError, match=r"r\.json: record 2: missing output_tokens"):
        make(registry, {"kind": "file", "path": "r.json"}, base_dir=tmp_path)
    write(tmp_path / "s.json", '[{"prompt_tokens": true, "output_tokens": 1}]')
    with pytest.raises(WorkloadError, match=r"s\.json: record 1: prompt_tokens"):
        make(registry, {"kind": "file", "path": "s.json"}, base_dir=tmp_path)


def test_other_bad_rows(registry, tmp_path):
    write(tmp_path / "a.csv", "prompt_tokens,output_tokens,prefix_tokens\n4,1,2\n4,1,5\n")
    with pytest.raises(WorkloadError, match=r"a\.csv: line 3: prefix_tokens: must be <= prompt_tokens"):
        make(registry, {"kind": "file", "path": "a.csv"}, base_dir=tmp_path)
    write(tmp_path / "b.csv", "prompt_tokens,output_tokens,arrival_ms\n4,1,2\n4,1,\n")
    with pytest.raises(WorkloadError, match=r"b\.csv: line 3: missing arrival_ms"):
        make(registry, {"kind": "file", "path": "b.csv"}, base_dir=tmp_path)
    write(tmp_path / "c.csv", "prompt_tokens,output_tokens\n4,1\n4,1,9\n")
    with pytest.raises(WorkloadError, match=r"c\.csv: line 3: expected 2 cells"):
        make(registry, {"kind": "file", "path": "c.csv"}, base_dir=tmp_path)
    write(tmp_path / "d.csv", "prompt_tokens,output_tokens\n")
    with pytest.raises(WorkloadError, match=r"d\.csv: no requests"):
        make(registry, {"kind": "file", "path": "d.csv"}, base_dir=tmp_path)


def test_file_config_errors(registry):
    with pytest.raises(ConfigError, match=r"rate: required when arrival = 'poisson'"):
        make(registry, {"kind": "file", "path": "x.json", "arrival": "poisson"})
    with pytest.raises(ConfigError, match=r"columns: unknown field 'prompt'"):
        make(registry, {"kind": "file", "path": "x.json", "columns": {"prompt": "In"}})


SYNTHETIC = {"kind": "synthetic", "num_requests": 2, "prompt": {"dist": "fixed", "value": 1},
             "output": {"dist": "fixed", "value": 1}}
SHARED_PREFIX = {"kind": "shared_prefix", "num_requests": 2, "num_groups": 1, "prefix_tokens": 4,
                 "suffix": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}}
NOT_FROM_FILE = ("does not apply with arrival = 'file': the requests arrive at the file's arrival_ms (all at t = 0 "
                 "without them); set arrival = 'poisson', 'gamma' or 'constant' to send the requests at this rate")
NOT_AT_ONCE = ("does not apply with arrival = 'all-at-once': every request arrives at t = 0; set arrival = "
               "'poisson', 'gamma' or 'constant' to send the requests at this rate")
ONLY_WITH_STAGES = "only applies with stages (stages = [{rate = ..., duration_s = ...}, ...])"


@pytest.mark.parametrize("table, key, message", [
    ({"kind": "file", "rate": 10}, "rate", NOT_FROM_FILE),   # the default arrival = "file": a rate sweep was flat
    ({"kind": "file", "arrival": "all-at-once", "rate": 10}, "rate", NOT_AT_ONCE),
    ({"kind": "file", "arrival": "poisson", "rate": 10, "cv": 3}, "cv",
     "only applies with arrival = 'gamma' (the variation of its gaps), not 'poisson'"),
    ({"kind": "file", "cv": 0.5}, "cv", "only applies with arrival = 'gamma' (the variation of its gaps), not 'file'"),
    ({**SYNTHETIC, "arrival": "all-at-once", "rate": 5}, "rate", NOT_AT_ONCE),
    ({**SYNTHETIC, "arrival": "constant", "rate": 5, "cv": 2}, "cv",
     "only applies with arrival = 'gamma' (the variation of its gaps), not 'constant'"),
    ({**SYNTHETIC, "rate": 5, "stage_start": "after_drain"}, "stage_start", ONLY_WITH_STAGES),
    ({**SYNTHETIC, "rate": 5, "stage_gap_s": 5}, "stage_gap_s", ONLY_WITH_STAGES),
    ({**SHARED_PREFIX, "arrival": "all-at-once", "rate": 5}, "rate", NOT_AT_ONCE),
    ({**SHARED_PREFIX, "rate": 5, "stage_gap_s": 0}, "stage_gap_s", ONLY_WITH_STAGES),
    ({**{k: v for k, v in SYNTHETIC.items() if k != "num_requests"}, "stages": [{"rate": 1, "duration_s": 2}],
      "cv": 2}, "cv", "only applies with arrival = 'gamma' (the variation of its gaps), not 'poisson'"),
])
def test_settings_that_cannot_take_effect_are_refused_by_name(registry, tmp_path, table, key, message):
    """They were accepted and ignored: a sweep over them gave identical runs."""
    write(tmp_path / "r.csv", "prompt_tokens,output_tokens,arrival_ms\n1,1,0\n")
    table = {"path": "r.csv", **table} if table["kind"] == "file" else table
    with pytest.raises(ConfigError) as info:
        make(registry, table, base_dir=tmp_path)
    assert str(info.value) == f"test.toml: [workload]: {key}: {message}"


def test_the_settings_still_apply_where_they_take_effect(registry, tmp_path):
    """cv unset is 1 (gamma gaps as variable as Poisson); stage settings with stages; a rate with
    drawn arrivals over a file."""
    write(tmp_path / "r.csv", "prompt_tokens,output_tokens,arrival_ms\n1,1,0\n2,1,5\n")
    unset = arrivals(make(registry, {**SYNTHETIC, "arrival": "gamma", "rate": 5}), 3)
    assert unset == arrivals(make(registry, {**SYNTHETIC, "arrival": "gamma", "rate": 5, "cv": 1.0}), 3)
    staged = {**{k: v for k, v in SYNTHETIC.items() if k != "num_requests"}, "arrival": "constant",
              "stages": [{"rate": 1, "duration_s": 2}, {"rate": 2, "duration_s": 1}]}
    # stage 1 sends 2 (0, 1000 ms), stage 2 2 more, 500 ms apart, from 2 s + the 3 s gap
    assert arrivals(make(registry, {**staged, "stage_start": "back_to_back", "stage_gap_s": 3})) == [
        0.0, 1000.0, 5000.0, 5500.0]
    assert arrivals(make(registry, {"kind": "file", "path": "r.csv", "arrival": "constant", "rate": 4},
                         base_dir=tmp_path)) == [0.0, 250.0]


@pytest.mark.parametrize("name, text, table, message", [
    ("r.csv", "prompt_tokens,output_tokens,arrival_ms\n10,5,0\n10,5,1e30\n", {"kind": "file"},
     "r.csv: line 3: arrival_ms: must be <= 1e+12 (ms: the simulated clock's end, about 31.7 years), got 1e+30"),
    ("i.csv", "prompt_tokens,output_tokens,arrival_ms\n10,5,0\n10,5,1e12\n", {"kind": "file", "time_scale": 2},
     "i.csv: with time_scale = 2 the last request arrives at 2e+12 ms, past the simulated clock's end (1e+12 ms, "
     "about 31.7 years)"),
    ("v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1e10,10,5\n", {"kind": "vidur"},
     "v.csv: line 3: arrived_at: must be <= 1e+09 (s: the simulated clock's end, about 31.7 years), got 1e+10"),
    ("w.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1e8,10,5\n", {"kind": "vidur",
                                                                                      "time_scale": 20},
     "w.csv: with time_scale = 20 the last request may arrive at 2e+12 ms, past the simulated clock's end (1e+12 "
     "ms, about 31.7 years)"),
    ("m.jsonl", '{"timestamp": 2e12, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n', {"kind": "mooncake"},
     "m.jsonl: line 1: timestamp: must be <= 1e+12 (ms: the simulated clock's end, about 31.7 years), got 2e+12"),
    # (2.4e11 + 3000) x 5 = 1.200000015e12 ms: the jitter counts, in trace time, before the scale
    ("n.jsonl", '{"timestamp": 2.4e11, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n',
     {"kind": "mooncake", "jitter_ms": 3000, "time_scale": 5},
     "n.jsonl: with time_scale = 5 and jitter_ms = 3000 the last request may arrive at 1.2e+12 ms, past the "
     "simulated clock's end (1e+12 ms, about 31.7 years)"),
    # 1970-01-01 to 2004-01-01: 34 x 365 + 8 leap days (1972 ... 2000) = 12,418 days = 1.0729152e12 ms
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1970-01-01 00:00:00,1,1\n2004-01-01 00:00:00,1,1\n",
     {"kind": "azure"},
     "az.csv: line 3: timestamp (column 'TIMESTAMP'): 1.073e+12 ms after the earliest request (line 2), past the "
     "simulated clock's end (1e+12 ms, about 31.7 years)"),
])
def test_arrivals_past_the_clocks_end_are_refused_where_the_file_is_read(registry, tmp_path, name, text, table,
                                                                          message):
    """They passed validate and failed the run, naming neither the file nor the line ("check rate and
    time_scale", neither of them set)."""
    write(tmp_path / name, text)
    with pytest.raises(WorkloadError) as info:
        make(registry, {"path": name, **table}, base_dir=tmp_path)
    assert str(info.value) == f"{tmp_path}/{message}"
    # exactly at the clock's end is within it (an iteration there still passes it: the engine says so)
    if table == {"kind": "file"}:
        write(tmp_path / name, text.replace("1e30", "1e12"))
        assert arrivals(make(registry, {"path": name, **table}, base_dir=tmp_path)) == [0.0, 1e12]


def test_negative_seed_is_rejected(registry):
    w = make(registry, {"kind": "synthetic", "num_requests": 2, "prompt": fixed(1), "output": fixed(1),
                        "arrival": "all-at-once"})
    with pytest.raises(WorkloadError, match="seed"):
        w.requests(-1)


# --- azure, vidur, mooncake ----------------------------------------------------------------


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:18:00.0000000,7,1
2023-11-17 00:00:00.5000000,12,3
"""


def test_azure_timestamps_become_ms_after_the_first(registry, tmp_path):
    write(tmp_path / "az.csv", AZURE)
    got = list(make(registry, {"kind": "azure", "path": "az.csv"}, base_dir=tmp_path).requests(0))
    # 04.03196 - 03.97996 = 0.052 s; 18:18:00 - 18:17:03.97996 = 56.02004 s;
    # 24:00:00.5 - 18:17:03.97996 = 5 h 42 min 56.52004 s = 20576.52004 s
    assert got == [
        Request(id=0, arrival_ms=0.0, prompt_tokens=4808, output_tokens=10),
        Request(id=1, arrival_ms=52.0, prompt_tokens=3180, output_tokens=8),
        Request(id=2, arrival_ms=56020.04, prompt_tokens=7, output_tokens=1),
        Request(id=3, arrival_ms=20576520.04, prompt_tokens=12, output_tokens=3),
    ]


def test_azure_limit_time_scale_max_tokens(registry, tmp_path):
    write(tmp_path / "az.csv", AZURE)
    w = make(registry, {"kind": "azure", "path": "az.csv", "limit": 2, "time_scale": 2, "max_tokens": 9},
             base_dir=tmp_path)
    assert [(r.arrival_ms, r.max_tokens) for r in w.requests(0)] == [(0.0, 9), (104.0, 9)]


def test_azure_zero_tokens_policies(registry, tmp_path):
    write(tmp_path / "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                               "2023-11-16 18:00:00,5,0\n2023-11-16 18:00:01,6,2\n2023-11-16 18:00:02,0,0\n")
    clamp = make(registry, {"kind": "azure", "path": "az.csv"}, base_dir=tmp_path)
    assert [(r.prompt_tokens, r.output_tokens) for r in clamp.requests(0)] == [(5, 1), (6, 2), (1, 1)]
    assert clamp.info["zero_token_rows"] == 2
    drop = make(registry, {"kind": "azure", "path": "az.csv", "zero_tokens": "drop"}, base_dir=tmp_path)
    assert [(r.id, r.arrival_ms, r.prompt_tokens) for r in drop.requests(0)] == [(0, 0.0, 6)]
    with pytest.raises(WorkloadError, match=r"az\.csv: line 2: output_tokens \(column 'GeneratedTokens'\): is 0"):
        make(registry, {"kind": "azure", "path": "az.csv", "zero_tokens": "error"}, base_dir=tmp_path)


def test_azure_bad_timestamp_and_missing_column(registry, tmp_path):
    write(tmp_path / "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,5,1\nyesterday,6,2\n")
    with pytest.raises(WorkloadError, match=r"az\.csv: line 3: timestamp \(column 'TIMESTAMP'\).*yesterday"):
        make(registry, {"kind": "azure", "path": "az.csv"}, base_dir=tmp_path)
    write(tmp_path / "b.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,5\n")
    with pytest.raises(WorkloadError, match=r"b\.csv: no column 'GeneratedTokens'"):
        make(registry, {"kind": "azure", "path": "b.csv"}, base_dir=tmp_path)


def test_vidur_seconds_become_ms(registry, tmp_path):
    write(tmp_path / "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,4808,10\n0.25,3180,8\n1.5,7,1\n")
    got = list(make(registry, {"kind": "vidur", "path": "v.csv"}, base_dir=tmp_path).requests(3))
    assert got == [
        Request(id=0, arrival_ms=0.0, prompt_tokens=4808, output_tokens=10),
        Request(id=1, arrival_ms=250.0, prompt_tokens=3180, output_tokens=8),
        Request(id=2, arrival_ms=1500.0, prompt_tokens=7, output_tokens=1),
    ]


MOONCAKE = "\n".join([
    '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}',
    '{"timestamp": 0, "input_length": 1030, "output_length": 6, "hash_ids": [0, 2, 3]}',
    '{"timestamp": 3000, "input_length": 10, "output_length": 7, "hash_ids": [4]}',
]) + "\n"


def test_mooncake_hash_ids_land_in_block_hashes(registry, tmp_path):
    write(tmp_path / "m.jsonl", MOONCAKE)
    got = list(make(registry, {"kind": "mooncake", "path": "m.jsonl"}, base_dir=tmp_path).requests(0))
    assert got == [
        Request(id=0, arrival_ms=0.0, prompt_tokens=1000, output_tokens=5, block_hashes=(0, 1)),
        Request(id=1, arrival_ms=0.0, prompt_tokens=1030, output_tokens=6, block_hashes=(0, 2, 3)),
        Request(id=2, arrival_ms=3000.0, prompt_tokens=10, output_tokens=7, block_hashes=(4,)),
    ]
    small = make(registry, {"kind": "mooncake", "path": "m.jsonl", "hash_block_tokens": 500, "limit": 1},
                 base_dir=tmp_path)
    assert [r.hash_block_tokens for r in small.requests(0)] == [500]


def test_mooncake_rejects_more_hash_ids_than_blocks(registry, tmp_path):
    write(tmp_path / "m.jsonl", MOONCAKE)
    # with 600-token blocks, 1000 tokens make 2 blocks (2 ids: fine) but 1030 make 2 and line 2 lists 3
    with pytest.raises(WorkloadError, match=r"m\.jsonl: line 2: hash_ids: 3 hash ids for 1030"):
        make(registry, {"kind": "mooncake", "path": "m.jsonl", "hash_block_tokens": 600}, base_dir=tmp_path)
    write(tmp_path / "n.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n')
    with pytest.raises(WorkloadError, match=r"n\.jsonl: line 1: hash_ids: must be a list"):
        make(registry, {"kind": "mooncake", "path": "n.jsonl"}, base_dir=tmp_path)


def test_mooncake_jitter_keeps_order_and_stays_in_window(registry, tmp_path):
    lines = [json.dumps({"timestamp": 3000 * (i // 10), "input_length": 600 + i, "output_length": 1,
                         "hash_ids": [i, 1000 + i]}) for i in range(50)]
    write(tmp_path / "m.jsonl", "\n".join(lines))
    w = make(registry, {"kind": "mooncake", "path": "m.jsonl", "jitter_ms": 3000}, base_dir=tmp_path)
    got = list(w.requests(7))
    assert [r.id for r in got] == list(range(50))
    times = [r.arrival_ms for r in got]
    assert times == sorted(times)
    for r in got:
        i = r.prompt_tokens - 600  # the row it came from
        t = 3000 * (i // 10)
        assert t <= r.arrival_ms < t + 3000
        assert r.block_hashes == (i, 1000 + i)
    assert len(set(times)) == 50  # actually spread
    assert list(w.requests(7)) == got
    assert [r.arrival_ms for r in w.requests(8)] != times


def test_mooncake_jitter_stays_below_t_plus_jitter_despite_rounding(registry, tmp_path):
    t = 2.0**39  # < the clock's end (1e12 ms); float spacing is 2**-13 here, so with a jitter of one
    jitter = 2.0**-13  # spacing t + u with u >= half of it would round up to t + jitter
    write(tmp_path / "m.jsonl", "".join(json.dumps({"timestamp": int(t), "input_length": 5, "output_length": 1,
                                                    "hash_ids": [i]}) + "\n" for i in range(20)))
    w = make(registry, {"kind": "mooncake", "path": "m.jsonl", "jitter_ms": jitter}, base_dir=tmp_path)
    assert all(t <= r.arrival_ms < t + jitter for r in w.requests(0))


def test_mooncake_jitter_is_in_trace_time_before_time_scale(registry, tmp_path):
    """The jitter spreads a request over its timestamp's quantum of *trace* time, then the trace is
    stretched: at time_scale 4 a 3-s quantum is 12 s of the run and the jitter fills all of it.
    (It was added after the scaling: every request in the first 3 s of each 12-s window, at 4
    times the mean rate, the rest of the window empty.)"""
    lines = [json.dumps({"timestamp": 3000 * (i // 10), "input_length": 600 + i, "output_length": 1,
                         "hash_ids": [i, 1000 + i]}) for i in range(50)]
    write(tmp_path / "m.jsonl", "\n".join(lines))
    w = make(registry, {"kind": "mooncake", "path": "m.jsonl", "jitter_ms": 3000, "time_scale": 4},
             base_dir=tmp_path)
    stamps = np.array([3000.0 * (i // 10) for i in range(50)])
    offsets = stream_rng(7, JITTER_STREAM).uniform(0.0, 3000.0, 50)   # the documented stream, in row order
    expected = (stamps + offsets) * 4.0
    got = list(w.requests(7))
    assert [r.arrival_ms for r in got] == sorted(expected.tolist())
    assert {r.prompt_tokens - 600: r.arrival_ms for r in got} == dict(enumerate(expected.tolist()))
    phase = np.array([r.arrival_ms for r in got]) - 4.0 * stamps[[r.prompt_tokens - 600 for r in got]]
    assert phase.min() >= 0 and phase.max() < 12000.0
    assert (phase >= 3000.0).sum() == (offsets >= 750.0).sum() > 30   # past the old 3-s window: ~3/4 of them


# --- arrivals: common random numbers -------------------------------------------------------


def synthetic(registry, n=200, **extra):
    table = {"kind": "synthetic", "num_requests": n, "prompt": {"dist": "uniform", "low": 1, "high": 500},
             "output": {"dist": "uniform", "low": 1, "high": 300}, "rate": 5}
    table.update(extra)
    return make(registry, table)


@pytest.mark.parametrize("arrival", ["poisson", "gamma"])
def test_common_random_numbers_across_rates(registry, arrival):
    extra = {"arrival": arrival, "cv": 3.0} if arrival == "gamma" else {}
    at5 = list(synthetic(registry, rate=5, **extra).requests(11))
    at10 = list(synthetic(registry, rate=10, **extra).requests(11))
    at1 = list(synthetic(registry, rate=1, **extra).requests(11))
    at3 = list(synthetic(registry, rate=3, **extra).requests(11))
    assert [r.arrival_ms for r in at10] == [r.arrival_ms / 2 for r in at5]  # exactly
    assert [r.arrival_ms for r in at3] == [r.arrival_ms / 3 for r in at1]
    # lengths do not depend on the rate
    assert [(r.prompt_tokens, r.output_tokens) for r in at10] == [(r.prompt_tokens, r.output_tokens) for r in at5]


def test_poisson_arrivals_are_the_seeds_unit_exponentials(registry):
    # the documented construction: unit-rate exponential gaps from default_rng(seed), / rate
    gaps = np.random.default_rng(4).standard_exponential(9)
    expected = np.concatenate([[0.0], np.cumsum(gaps)]) * 1000.0 / 8
    got = arrivals(synthetic(registry, n=10, rate=8), seed=4)
    assert got == pytest.approx(expected.tolist(), rel=1e-12)


def test_file_poisson_uses_common_random_numbers(registry, tmp_path):
    write(tmp_path / "r.jsonl", "".join('{"prompt_tokens": %d, "output_tokens": 1}\n' % (i + 1) for i in range(30)))
    slow = make(registry, {"kind": "file", "path": "r.jsonl", "arrival": "poisson", "rate": 20}, base_dir=tmp_path)
    fast = make(registry, {"kind": "file", "path": "r.jsonl", "arrival": "poisson", "rate": 40}, base_dir=tmp_path)
    assert arrivals(fast, 5) == [t / 2 for t in arrivals(slow, 5)]
    assert [r.prompt_tokens for r in fast.requests(5)] == list(range(1, 31))  # file order kept


def test_same_seed_same_requests_different_seed_different(registry):
    w = synthetic(registry)
    assert list(w.requests(3)) == list(w.requests(3))
    assert list(synthetic(registry).requests(3)) == list(w.requests(3))
    assert arrivals(w, 3) != arrivals(w, 4)
    assert [r.prompt_tokens for r in w.requests(3)] != [r.prompt_tokens for r in w.requests(4)]


@pytest.mark.parametrize("arrival,cv", [("poisson", 1.0), ("gamma", 1.0), ("gamma", 4.0), ("gamma", 0.0)])
def test_mean_gap_and_cv(registry, arrival, cv):
    rate = 25.0
    gamma = {"cv": cv} if arrival == "gamma" else {}   # (a cv with another arrival is refused: it does nothing)
    times = np.array(arrivals(synthetic(registry, n=20000, rate=rate, arrival=arrival, **gamma), seed=1))
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert gaps.mean() == pytest.approx(1000.0 / rate, rel=0.05 if cv <= 1 else 0.15)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.05 if cv <= 1 else 0.6)


def test_all_at_once(registry):
    assert arrivals(synthetic(registry, n=5, arrival="all-at-once", rate=None)) == [0.0] * 5


# --- synthetic and distributions -----------------------------------------------------------


def test_synthetic_fixed_lengths_fields_and_output_scale(registry):
    w = make(registry, {"kind": "synthetic", "num_requests": 3, "prompt": fixed(100), "output": fixed(7),
                        "output_scale": 1.5, "arrival": "all-at-once", "max_tokens": 9,
                        "request_class": "batch", "client": "bob", "priority": 2})
    assert list(w.requests(0)) == [
        Request(id=i, arrival_ms=0.0, prompt_tokens=100, output_tokens=10, max_tokens=9, priority=2,
                client="bob", request_class="batch") for i in range(3)]  # 7 * 1.5 = 10.5 -> 10 (round half even)


def test_output_scale_doubles_outputs_and_keeps_the_rest(registry):
    base = list(synthetic(registry, n=100).requests(2))
    doubled = list(synthetic(registry, n=100, output_scale=2.0).requests(2))
    assert [r.output_tokens * 2 for r in base] == [r.output_tokens for r in doubled]
    assert [(r.arrival_ms, r.prompt_tokens) for r in base] == [(r.arrival_ms, r.prompt_tokens) for r in doubled]


def test_uniform_and_lognormal_bounds(registry):
    w = synthetic(registry, n=3000, prompt={"dist": "uniform", "low": 3, "high": 6},
                  output={"dist": "lognormal", "median": 100, "sigma": 1.0, "low": 20, "high": 300})
    got = list(w.requests(0))
    prompts = [r.prompt_tokens for r in got]
    outputs = np.array([r.output_tokens for r in got])
    assert set(prompts) == {3, 4, 5, 6}
    assert outputs.min() == 20 and outputs.max() == 300  # clipped at both ends (P(x<20) ~ 5%)
    assert np.median(outputs) == pytest.approx(100, rel=0.1)


def test_empirical_samples_values_from_a_column(registry, tmp_path):
    write(tmp_path / "stats.csv", "num_prefill_tokens,num_decode_tokens\n11,2\n22,3\n33,4\n")
    w = make(registry, {"kind": "synthetic", "num_requests": 300, "arrival": "all-at-once",
                        "prompt": {"dist": "empirical", "path": str(tmp_path / "stats.csv"),
                                   "column": "num_prefill_tokens"}, "output": fixed(1)})
    assert {r.prompt_tokens for r in w.requests(0)} == {11, 22, 33}
    with pytest.raises(WorkloadError, match=r"stats\.csv: no column 'nope'"):
        make(registry, {"kind": "synthetic", "num_requests": 1, "arrival": "all-at-once", "output": fixed(1),
                        "prompt": {"dist": "empirical", "path": str(tmp_path / "stats.csv"), "column": "nope"}})


@pytest.mark.parametrize("table,message", [
    ({"dist": "normal", "mean": 3}, r"prompt: dist must be one of"),
    ({"kind": "lognormal", "median": 3, "sigma": 1}, r"prompt: missing key 'dist' \(the table has kind = 'lognormal': "
                                                     r"the key is dist\)"),
    ({"median": 3, "sigma": 1}, r"prompt: missing key 'dist'; dist must be one of"),
    ({"dist": "uniform", "low": 5}, r"prompt: dist = 'uniform' needs 'high'"),
    ({"dist": "uniform", "low": 5, "high": 4}, r"prompt: low \(5\) must be <= high \(4\)"),
    ({"dist": "fixed", "value": 0}, r"prompt: value must be a whole number >= 1"),
    ({"dist": "fixed", "value": 3, "sigma": 1}, r"prompt: unknown key 'sigma'"),
    ({"dist": "lognormal", "median": -1, "sigma": 1}, r"prompt: median must be a number > 0"),
    (512, r"prompt: must be a table"),
])
def test_bad_distribution_tables(registry, table, message):
    with pytest.raises(ConfigError, match=r"test\.toml: \[workload\]: " + message):
        make(registry, {"kind": "synthetic", "num_requests": 1, "prompt": table, "output": fixed(1), "rate": 1})


def test_synthetic_needs_a_rate_for_poisson(registry):
    with pytest.raises(ConfigError, match="rate: required"):
        make(registry, {"kind": "synthetic", "num_requests": 1, "prompt": fixed(1), "output": fixed(1)})


# --- shared_prefix -------------------------------------------------------------------------


def shared(registry, **extra):
    table = {"kind": "shared_prefix", "num_requests": 200, "num_groups": 4, "prefix_tokens": 64,
             "suffix": fixed(10), "output": fixed(5), "shared_fraction": 0.3, "arrival": "all-at-once"}
    table.update(extra)
    return make(registry, table)


def test_shared_prefix_counts_and_fields(registry):
    got = list(shared(registry).requests(9))
    with_prefix = [r for r in got if r.prefix_group is not None]
    assert len(with_prefix) == 60  # 0.3 * 200 exactly
    for r in got:
        assert r.prompt_tokens == 74  # 64 + 10 for every request
        if r.prefix_group is None:
            assert r.prefix_tokens == 0
        else:
            assert r.prefix_tokens == 64 and r.prefix_group in {0, 1, 2, 3}
    assert len({r.prefix_group for r in with_prefix}) == 4  # 60 draws over 4 groups


@pytest.mark.parametrize("fraction,count", [(0.0, 0), (1.0, 7), (0.5, 4), (0.2, 1)])  # 3.5 -> 4, 1.4 -> 1
def test_shared_prefix_rounding(registry, fraction, count):
    got = list(shared(registry, num_requests=7, shared_fraction=fraction).requests(0))
    assert sum(r.prefix_group is not None for r in got) == count


def test_raising_the_shared_fraction_only_adds_shared_requests(registry):
    low = [r.prefix_group for r in shared(registry, shared_fraction=0.2).requests(5)]
    high = [r.prefix_group for r in shared(registry, shared_fraction=0.6).requests(5)]
    assert all(h == g for g, h in zip(low, high) if g is not None)
    assert sum(g is not None for g in high) == 120


def test_zipf_popularity_favours_low_groups(registry):
    got = list(shared(registry, num_requests=4000, shared_fraction=1.0, num_groups=10,
                      popularity="zipf", zipf_s=1.2).requests(1))
    counts = np.bincount([r.prefix_group for r in got], minlength=10)
    weights = 1 / np.arange(1, 11) ** 1.2
    expected = 4000 * weights / weights.sum()
    assert counts == pytest.approx(expected, rel=0.2, abs=15)


def test_suffix_distribution_adds_to_the_prefix(registry):
    got = list(shared(registry, suffix={"dist": "uniform", "low": 1, "high": 3}).requests(0))
    assert {r.prompt_tokens for r in got} == {65, 66, 67}


# --- mix -----------------------------------------------------------------------------------


def csv_rows(rows):
    return "arrival_ms,prompt_tokens,output_tokens\n" + "".join(f"{t},{p},{o}\n" for t, p, o in rows)


def test_mix_merges_by_arrival_then_class_name(registry, tmp_path):
    write(tmp_path / "a.csv", csv_rows([(0, 1, 1), (10, 2, 1), (30, 3, 1)]))
    write(tmp_path / "b.csv", csv_rows([(5, 101, 1), (10, 102, 1), (10, 103, 1)]))
    w = make(registry, {"kind": "mix", "classes": {
        "beta": {"kind": "file", "path": str(tmp_path / "b.csv"), "priority": 1, "client": "svc"},
        "alpha": {"kind": "file", "path": str(tmp_path / "a.csv"), "request_class": "chat"},
    }})
    got = list(w.requests(0))
    assert [(r.id, r.arrival_ms, r.prompt_tokens, r.request_class, r.priority, r.client) for r in got] == [
        (0, 0.0, 1, "chat", 0, "default"),
        (1, 5.0, 101, "beta", 1, "svc"),
        (2, 10.0, 2, "chat", 0, "default"),  # tie at 10: alpha before beta
        (3, 10.0, 102, "beta", 1, "svc"),
        (4, 10.0, 103, "beta", 1, "svc"),
        (5, 30.0, 3, "chat", 0, "default"),
    ]


def test_mix_classes_get_their_own_seed(registry):
    sub = {"kind": "synthetic", "num_requests": 20, "prompt": {"dist": "uniform", "low": 1, "high": 99},
           "output": fixed(3), "rate": 2}
    w = make(registry, {"kind": "mix", "classes": {"a": dict(sub), "b": {**sub, "rate": 4}}})
    got = list(w.requests(100))
    assert [r.id for r in got] == list(range(40))
    alone_a = [(r.arrival_ms, r.prompt_tokens) for r in make(registry, sub).requests(100 + zlib.crc32(b"a"))]
    alone_b = [(r.arrival_ms, r.prompt_tokens)
               for r in make(registry, {**sub, "rate": 4}).requests(100 + zlib.crc32(b"b"))]
    assert [(r.arrival_ms, r.prompt_tokens) for r in got if r.request_class == "a"] == alone_a
    assert [(r.arrival_ms, r.prompt_tokens) for r in got if r.request_class == "b"] == alone_b
    assert alone_a != alone_b
    assert list(w.requests(100)) == got


def test_mix_keeps_prefix_groups_of_classes_apart(registry):
    sp = {"kind": "shared_prefix", "num_requests": 5, "num_groups": 1, "prefix_tokens": 8,
          "suffix": fixed(2), "output": fixed(1), "arrival": "all-at-once"}
    got = list(make(registry, {"kind": "mix", "classes": {"x": dict(sp), "y": dict(sp)}}).requests(0))
    assert {r.prefix_group for r in got} == {("x", 0), ("y", 0)}


class _Seq:
    """What a prefix cache reads of an engine's sequence."""

    def __init__(self, request):
        self.request = request
        self.num_computed_tokens = self.num_generated = self.reserved_tokens = 0
        self.kv_state = None
        self.status = "waiting"

    @property
    def num_tokens(self):
        return self.request.prompt_tokens


def test_mix_keeps_block_hashes_of_classes_apart(registry, tmp_path):
    """Two Mooncake traces both number their hash ids from 0: unrelated prompts. Mixed, the agent
    class's request hit 1,536 tokens of the chat class's KV (3 full 512-token blocks of ids 0-3,
    the 2,048th token always computed). Within a class, the ids share as they did alone."""
    from schedlab_plugins.kv_caches.prefix import PrefixKVCache

    row = '{"timestamp": %d, "input_length": 2048, "output_length": 4, "hash_ids": [0, 1, 2, 3]}\n'
    write(tmp_path / "a.jsonl", row % 0 + row % 2000)
    write(tmp_path / "b.jsonl", row % 1000)
    mix = {"kind": "mix", "classes": {"chat": {"kind": "mooncake", "path": str(tmp_path / "a.jsonl")},
                                      "agent": {"kind": "mooncake", "path": str(tmp_path / "b.jsonl")}}}
    chat, agent, chat_again = list(make(registry, mix).requests(0))
    assert (chat.request_class, agent.request_class, chat_again.request_class) == ("chat", "agent", "chat")
    assert chat.block_hashes == chat_again.block_hashes == (("chat", 0), ("chat", 1), ("chat", 2), ("chat", 3))
    assert agent.block_hashes == (("agent", 0), ("agent", 1), ("agent", 2), ("agent", 3))
    assert list(make(registry, mix).requests(0)) == [chat, agent, chat_again]   # deterministic
    cache = PrefixKVCache(16, 512)
    hits = []
    for request in (chat, agent, chat_again):
        seq = _Seq(request)
        hits.append(cache.cached_tokens(seq))
        assert cache.allocate(seq, 2048 - hits[-1], cached_tokens=hits[-1])
    assert hits == [0, 0, 1536]


def test_mix_config_errors_name_the_class(registry):
    with pytest.raises(ConfigError, match=r"\[workload\]: classes: fast: unknown key 'rat'"):
        make(registry, {"kind": "mix", "classes": {"fast": {
            "kind": "synthetic", "num_requests": 1, "prompt": fixed(1), "output": fixed(1), "rat": 3}}})
    with pytest.raises(ConfigError, match=r"classes: loop: a closed-loop workload"):
        make(registry, {"kind": "mix", "classes": {"loop": {"kind": "closed_loop", "clients": 1}}})
    with pytest.raises(ConfigError, match=r"classes: c: needs kind"):
        make(registry, {"kind": "mix", "classes": {"c": {"num_requests": 1}}})
    with pytest.raises(ConfigError, match=r"\[workload.classes.c\]: unknown workload 'nosuch'"):
        make(registry, {"kind": "mix", "classes": {"c": {"kind": "nosuch"}}})


def test_mix_builds_plugin_workloads_through_the_registry():
    reg = Registry("workload").providing("built-in")
    workloads.schedlab_register_workloads(register=reg)

    @attrs.frozen
    class TickConfig:
        n: int = int_field(2, min=1)

    class Tick:
        closed_loop = False

        def __init__(self, config):
            self.n = config.n

        def requests(self, seed):
            return (Request(id=i, arrival_ms=7.0 * i, prompt_tokens=1, output_tokens=1) for i in range(self.n))

    reg.providing("tick plugin")("tick", Tick, config=TickConfig)
    got = list(make(reg, {"kind": "mix", "classes": {"t": {"kind": "tick", "n": 3}, "u": {
        "kind": "synthetic", "num_requests": 1, "prompt": fixed(1), "output": fixed(1), "arrival": "all-at-once"}}}
    ).requests(0))
    assert [(r.id, r.arrival_ms, r.request_class) for r in got] == [(0, 0.0, "t"), (1, 0.0, "u"), (2, 7.0, "t"),
                                                                   (3, 14.0, "t")]


# --- hypothesis: every open-loop workload --------------------------------------------------


def open_loop_tables(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    write(folder / "rows.csv", csv_rows([(50, 3, 1), (0, 2, 2), (50, 1, 3), (20, 9, 9)]))
    write(folder / "az.csv", AZURE)
    write(folder / "m.jsonl", MOONCAKE)
    write(folder / "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n0.5,6,6\n")
    return folder


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    return open_loop_tables(tmp_path_factory)


ARRIVAL = st.sampled_from([{"arrival": "poisson"}, {"arrival": "all-at-once"}, {"arrival": "gamma", "cv": 2.5},
                           {"arrival": "gamma", "cv": 0.0}])


@st.composite
def open_loop_table(draw, folder):
    n = draw(st.integers(1, 40))
    rate = draw(st.floats(0.1, 1000))
    arrival = draw(ARRIVAL)
    arrival = arrival if arrival["arrival"] == "all-at-once" else dict(arrival, rate=rate)   # (no rate to ignore)
    kind = draw(st.sampled_from(["synthetic", "shared_prefix", "file", "azure", "vidur", "mooncake", "mix"]))
    syn = {"kind": "synthetic", "num_requests": n, "prompt": {"dist": "uniform", "low": 1, "high": 50},
           "output": {"dist": "lognormal", "median": 20, "sigma": 1}, **arrival}
    if kind == "synthetic":
        return syn
    if kind == "shared_prefix":
        return {"kind": "shared_prefix", "num_requests": n, "num_groups": draw(st.integers(1, 5)),
                "prefix_tokens": 16, "suffix": fixed(4), "output": fixed(2),
                "shared_fraction": draw(st.floats(0, 1)), **arrival}
    if kind == "file":
        pick = draw(st.sampled_from([{"arrival": "file"}, arrival]))
        return {"kind": "file", "path": str(folder / "rows.csv"), **pick}
    if kind == "azure":
        return {"kind": "azure", "path": str(folder / "az.csv"), "time_scale": draw(st.floats(0.01, 10))}
    if kind == "vidur":
        return {"kind": "vidur", "path": str(folder / "v.csv")}
    if kind == "mooncake":
        return {"kind": "mooncake", "path": str(folder / "m.jsonl"), "jitter_ms": draw(st.floats(0, 5000))}
    other = {"kind": "file", "path": str(folder / "rows.csv"), **draw(st.sampled_from([{"arrival": "file"},
                                                                                        arrival]))}
    return {"kind": "mix", "classes": {"s": syn, "f": other}}


@settings(max_examples=120, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32))
def test_open_loop_ids_and_order(registry, trace_dir, data, seed):
    table = data.draw(open_loop_table(trace_dir))
    w = make(registry, table)
    got = list(w.requests(seed))
    assert [r.id for r in got] == list(range(len(got)))
    assert len(got) > 0
    times = [r.arrival_ms for r in got]
    assert all(a <= b for a, b in zip(times, times[1:]))
    assert all(isinstance(r, Request) for r in got)
    if w.num_requests is not None:
        assert len(got) == w.num_requests
    assert [attrs.astuple(r) for r in w.requests(seed)] == [attrs.astuple(r) for r in got]


# --- closed loop ---------------------------------------------------------------------------


def loop(registry, **extra):
    table = {"kind": "closed_loop", "clients": 3, "num_requests": 7, "prompt": fixed(10), "output": fixed(4)}
    table.update(extra)
    return make(registry, table)


def test_a_stagger_past_the_clocks_end_is_refused_by_name(registry):
    """Read, then refused at run time as 'arrival times must be at most ...', naming no key."""
    with pytest.raises(ConfigError, match=r"\[workload\]: stagger_ms: must be <= 1000000000000.0, got 1e\+308"):
        loop(registry, stagger_ms=1e308)


def test_closed_loop_initial_requests_one_per_client(registry):
    w = loop(registry, stagger_ms=30)
    assert w.closed_loop is True
    assert list(w.requests(0)) == [
        Request(id=i, arrival_ms=10.0 * i, prompt_tokens=10, output_tokens=4, client=f"client-{i}")
        for i in range(3)]


def test_closed_loop_on_finish_releases_the_same_clients_next_request(registry):
    w = loop(registry, think_ms=5)
    first = list(w.requests(0))
    assert w.on_finish(first[1], 100.0) == [
        Request(id=3, arrival_ms=105.0, prompt_tokens=10, output_tokens=4, client="client-1")]
    (nxt,) = w.on_finish(first[0], 120.0)
    assert (nxt.id, nxt.arrival_ms, nxt.client) == (4, 125.0, "client-0")
    with pytest.raises(WorkloadError, match="request 0 is not an unfinished request"):
        w.on_finish(first[0], 130.0)


def test_a_client_turned_away_at_once_without_a_pause_stops_the_run(registry):
    """Requests ending the moment they arrive (rejected), with think_ms 0, would go round at one
    instant for ever: the INSTANT_RESENDS-th in a row of one client stops the run. One that took
    time, or a pause, starts the count again."""
    from schedlab.errors import StallError
    from schedlab_plugins.workloads.closed_loop import INSTANT_RESENDS

    w = loop(registry, num_requests=None, duration_ms=1000, clients=1)
    (request,) = w.requests(0)
    for _ in range(INSTANT_RESENDS - 2):
        (request,) = w.on_finish(request, request.arrival_ms)
    (request,) = w.on_finish(request, request.arrival_ms + 1.0)  # served: the count starts again
    for _ in range(INSTANT_RESENDS - 1):
        (request,) = w.on_finish(request, request.arrival_ms)
    with pytest.raises(StallError, match=r"client 0's last 10,000 requests were each turned away .* t = 1 ms"):
        w.on_finish(request, request.arrival_ms)
    paused = loop(registry, num_requests=None, duration_ms=1e9, clients=1, think_ms=0.5)
    (request,) = paused.requests(0)
    for _ in range(INSTANT_RESENDS + 5):  # each resend half a millisecond later: the clock moves
        (request,) = paused.on_finish(request, request.arrival_ms)


def test_closed_loop_num_requests_bound_is_exact(registry):
    w = loop(registry)  # 3 clients, 7 requests in total
    r0, r1, r2 = w.requests(0)
    (r3,) = w.on_finish(r0, 10.0)
    (r4,) = w.on_finish(r1, 11.0)
    (r5,) = w.on_finish(r2, 12.0)
    (r6,) = w.on_finish(r3, 13.0)
    assert [r.id for r in (r3, r4, r5, r6)] == [3, 4, 5, 6]
    assert [r.client for r in (r3, r4, r5, r6)] == ["client-0", "client-1", "client-2", "client-0"]
    for req in (r4, r5, r6):
        assert w.on_finish(req, 20.0) == []
    assert [r.id for r in drive(loop(registry), seed=0)] == list(range(7))


def drive(workload, seed, service=lambda r: float(r.output_tokens)):
    """A minimal engine: every request runs alone for `service(r)` ms from its arrival."""
    released = list(workload.requests(seed))
    running = [(r.arrival_ms + service(r), r.id, r) for r in released]
    heapq.heapify(running)
    while running:
        finish, _, req = heapq.heappop(running)
        for nxt in workload.on_finish(req, finish):
            assert nxt.arrival_ms >= finish
            released.append(nxt)
            heapq.heappush(running, (nxt.arrival_ms + service(nxt), nxt.id, nxt))
    return released


def test_closed_loop_fewer_requests_than_clients(registry):
    w = loop(registry, clients=5, num_requests=2)
    assert [r.client for r in w.requests(0)] == ["client-0", "client-1"]
    assert [r.id for r in drive(w, 0)] == [0, 1]


def test_closed_loop_duration_bound(registry):
    # 2 clients, service 4 ms, think 1 ms: client arrivals at 0, 5, 10, ...; duration 10 keeps 10, drops 15
    w = loop(registry, clients=2, num_requests=None, duration_ms=10.0, think_ms=1.0)
    got = drive(w, 0)
    assert sorted((r.client, r.arrival_ms) for r in got) == [
        ("client-0", 0.0), ("client-0", 5.0), ("client-0", 10.0),
        ("client-1", 0.0), ("client-1", 5.0), ("client-1", 10.0)]
    assert [r.id for r in got] == list(range(6))


def test_closed_loop_is_repeatable_and_ids_follow_creation(registry):
    w = loop(registry, clients=4, num_requests=50, prompt={"dist": "uniform", "low": 1, "high": 100},
             output={"dist": "uniform", "low": 1, "high": 30}, think_ms=2.5, stagger_ms=8)
    once = drive(w, seed=5)
    twice = drive(w, seed=5)
    assert once == twice
    assert [r.id for r in once] == list(range(50))
    assert {r.client for r in once} == {f"client-{i}" for i in range(4)}
    assert [r.prompt_tokens for r in drive(w, seed=6)] != [r.prompt_tokens for r in once]


def test_closed_loop_each_clients_requests_follow_its_finishes(registry):
    w = loop(registry, clients=2, num_requests=6, think_ms=3.0)
    got = drive(w, 0)
    by_client: dict[str, list[float]] = {}
    for r in got:
        by_client.setdefault(r.client, []).append(r.arrival_ms)
    # service = 4 ms, think = 3 ms: a client's requests are 7 ms apart
    assert by_client == {"client-0": [0.0, 7.0, 14.0], "client-1": [0.0, 7.0, 14.0]}


def test_closed_loop_from_a_file_cycles_in_order(registry, tmp_path):
    write(tmp_path / "r.jsonl", "".join(json.dumps({"prompt_tokens": p, "output_tokens": 1, "client": "x",
                                                     "class": "c"}) + "\n" for p in (11, 22, 33)))
    w = make(registry, {"kind": "closed_loop", "clients": 2, "num_requests": 7, "path": "r.jsonl",
                        "max_tokens": 5, "priority": 4}, base_dir=tmp_path)
    got = drive(w, 0)
    assert [r.prompt_tokens for r in got] == [11, 22, 33, 11, 22, 33, 11]
    assert {(r.request_class, r.max_tokens, r.priority) for r in got} == {("c", 5, 4)}
    assert {r.client for r in got} == {"client-0", "client-1"}


def test_closed_loop_config_errors(registry, tmp_path):
    with pytest.raises(ConfigError, match="num_requests: set num_requests and/or duration_ms"):
        loop(registry, num_requests=None)
    with pytest.raises(ConfigError, match="prompt: give either path"):
        loop(registry, path="r.jsonl")
    with pytest.raises(ConfigError, match="output: required when there is no path"):
        make(registry, {"kind": "closed_loop", "clients": 1, "num_requests": 1, "prompt": fixed(1)})
    with pytest.raises(WorkloadError, match="before requests"):
        loop(registry).on_finish(Request(id=0, arrival_ms=0, prompt_tokens=1, output_tokens=1), 1.0)


def test_inline_requests_take_arrival_ms_in_every_one_or_none(validated):
    """One request with it and one without said only "missing arrival_ms", the table named twice."""
    code, err, path = validated('[workload]\nkind = "inline"\nrequests = [{prompt_tokens = 5, output_tokens = 5}, '
                                '{prompt_tokens = 5, output_tokens = 5, arrival_ms = 3.0}]\n')
    assert code == 2
    assert err == (f"schedlab: error: {path}: [workload]: requests: record 1: missing arrival_ms (other requests "
                   "have one: give every request arrival_ms, or none for all at t = 0)\n")
