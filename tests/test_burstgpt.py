"""BurstGPT's trace (``kind = "burstgpt"``): its CSV as the release writes it -- with and without
the later Session ID / Elapsed time columns --, failed requests (0 response tokens) dropped,
one model or one kind of request kept, arrivals from the first kept. Every file is written here."""

from __future__ import annotations

import numpy as np
import pytest

from schedlab.errors import WorkloadError
from schedlab_plugins.workloads.traces import BurstgptConfig, load_burstgpt, make_burstgpt_workload

V1 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\r
5,ChatGPT,472,18,490,Conversation log\r
45,ChatGPT,1087,0,1087,Conversation log\r
118,GPT-4,417,30,447,API log\r
130.5,ChatGPT,1360,207,1567,API log\r
"""
#: a later release: two more columns, in between
V12 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
12,s1,1.5,GPT-4,100,20,120,Conversation log
14,s1,2.0,ChatGPT,50,0,50,Conversation log
20,s2,0.7,ChatGPT,60,9,69,API log
"""


def write(tmp_path, text, name="BurstGPT_1.csv"):
    path = tmp_path / name
    path.write_bytes(text.encode())
    return str(path)


def test_rows_by_hand_failed_ones_dropped(tmp_path):
    """Rows at 5, 45 (failed: 0 response tokens), 118 and 130.5 s: three requests, at 0, 113 and
    125.5 s after the first; their Log Type is their class."""
    workload = make_burstgpt_workload(BurstgptConfig(path=write(tmp_path, V1)))
    reqs = list(workload.requests(0))
    assert [(r.arrival_ms, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0.0, 472, 18), (113_000.0, 417, 30), (125_500.0, 1360, 207)]
    assert [r.request_class for r in reqs] == ["Conversation log", "API log", "API log"]
    assert workload.info["zero_token_rows"] == 1


def test_a_later_release_is_read_by_its_column_names(tmp_path):
    arrival, columns, n_zero = load_burstgpt(write(tmp_path, V12))
    assert arrival.tolist() == [0.0, 8000.0] and columns.prompt_tokens.tolist() == [100, 60] and n_zero == 1


def test_one_model_or_one_kind_of_request(tmp_path):
    path = write(tmp_path, V1)
    arrival, columns, _ = load_burstgpt(path, model="ChatGPT")
    assert arrival.tolist() == [0.0, 125_500.0] and columns.prompt_tokens.tolist() == [472, 1360]   # 45 s failed
    arrival, columns, _ = load_burstgpt(path, log_type="API log")
    assert arrival.tolist() == [0.0, 12_500.0] and columns.output_tokens.tolist() == [30, 207]
    arrival, columns, _ = load_burstgpt(path, model="ChatGPT", zero_tokens="clamp")
    assert arrival.tolist() == [0.0, 40_000.0, 125_500.0] and columns.output_tokens.tolist() == [18, 1, 207]
    with pytest.raises(WorkloadError, match=r"no row has Model 'GPT-5'; the trace has 'ChatGPT', 'GPT-4'"):
        load_burstgpt(path, model="GPT-5")


def test_the_zero_row_a_filter_leaves_out_is_not_an_error(tmp_path):
    path = write(tmp_path, V1)
    assert np.array_equal(load_burstgpt(path, log_type="API log", zero_tokens="error")[1].output_tokens, [30, 207])
    with pytest.raises(WorkloadError, match=r"line 3: .*Response tokens.*: is 0"):
        load_burstgpt(path, zero_tokens="error")


def test_another_trace_is_named(tmp_path):
    with pytest.raises(WorkloadError, match="Timestamp"):
        load_burstgpt(write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,5\n"))
