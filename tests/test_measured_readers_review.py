"""The measured-run readers' review (findings 3, 4 and 5): inference_perf refuses token times
outside ``start_time .. end_time`` or out of order, leaves out an empty answer and says so, and
says when failed requests are left out; mlenergy refuses a latency shorter than its TTFT and
counts and says its failed requests. Every file is written by the test."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from schedlab.errors import WorkloadError
from schedlab_plugins.workloads.inference_perf import (
    InferencePerfConfig, load_inference_perf, make_inference_perf_workload,
)
from schedlab_plugins.workloads.measured import BenchReplayWarning
from schedlab_plugins.workloads.mlenergy import MlenergyConfig, make_mlenergy_workload


# -- inference_perf --------------------------------------------------------------------------------------------


def ip(start, end, times, out=4, error=None):
    return {"start_time": start, "end_time": end, "request": json.dumps({"prompt": "hello " * 10, "max_tokens": 8}),
            "error": error, "info": {"input_tokens": 20, "output_tokens": out, "output_token_times": times}}


GOOD = ip(10.1, 10.6, [10.2, 10.3, 10.4, 10.5])


def write(tmp_path, content, name="report.json"):
    path = tmp_path / name
    path.write_text(json.dumps(content))
    return path


@pytest.mark.parametrize("times, message", [
    ([9.0, 10.2, 10.3, 10.4], r"request 1: output_token_times\[0\] 9.0 is before start_time 10.0"),    # TTFT -1000 ms
    ([10.1, 10.2, 10.3, 12.0], r"request 1: output_token_times\[3\] 12.0 is after end_time 10.5"),     # TPOT > latency
    ([10.4, 10.2, 10.3, 10.1], r"request 1: output_token_times out of order: \[1\] 10.2 is before \[0\] 10.4"),
    ([10.1, 10.3, 10.2, 10.4], r"request 1: output_token_times out of order: \[2\] 10.2 is before \[1\] 10.3"),
])
def test_inference_perf_token_times_outside_the_request_or_out_of_order_are_refused(tmp_path, times, message):
    """They gave a TTFT of -1000 ms, a TPOT of 633 ms in a 500 ms request, a TPOT of -100 ms;
    the error names the file and the request (index 1: the second record)."""
    path = write(tmp_path, [GOOD, ip(10.0, 10.5, times)])
    with pytest.raises(WorkloadError, match=re.escape(str(path)) + ": " + message):
        load_inference_perf(path, prefix_blocks="none")


def test_inference_perf_token_times_within_a_microsecond_of_the_ends_are_rounding(tmp_path):
    """A first token 0.5 us before the send, a last one 0.5 us after the end and two tokens 0.5 us
    out of order are rounding, not errors; tokens at exactly start and end are kept."""
    rows = [ip(10.0, 10.5, [10.0 - 5e-7, 10.2, 10.2 - 5e-7, 10.5 + 5e-7]), ip(11.0, 11.5, [11.0, 11.1, 11.2, 11.5])]
    _, columns, measured, _ = load_inference_perf(write(tmp_path, rows), prefix_blocks="none")
    assert len(columns) == 2
    assert measured.ttft_ms.tolist() == pytest.approx([-5e-4, 0.0], abs=1e-6)


def test_inference_perf_an_empty_answer_is_left_out_with_vllm_benchs_warning(tmp_path):
    """A request that succeeded with 0 output tokens stopped the whole load ("output tokens:
    must be a whole number from 1 to 10**8, got 0"); now it is left out, as vllm_bench does."""
    path = write(tmp_path, [ip(10.0, 10.5, [10.1, 10.2, 10.3, 10.4]), ip(10.1, 10.6, [], out=0)])
    with pytest.warns(BenchReplayWarning) as caught:
        workload = make_inference_perf_workload(InferencePerfConfig(path=str(path), prefix_blocks="none"))
    said = [str(w.message) for w in caught if "open loop" not in str(w.message)]
    assert said == [f"{path}: 1 of the 2 requests without an error have 0 output tokens (the answer's text was "
                    "empty): left out of the replay"]
    assert [r.output_tokens for r in workload.requests(0)] == [4]
    assert workload.info["failed"] == 0


def test_inference_perf_only_empty_answers_is_no_successful_request(tmp_path):
    path = write(tmp_path, [ip(10.0, 10.5, [], out=0), ip(10.1, 10.6, [], error="boom")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BenchReplayWarning)
        with pytest.raises(WorkloadError, match=r"no successful requests \(1 failed, 1 with 0 output tokens\)"):
            load_inference_perf(path)


def test_inference_perf_failed_requests_left_out_are_said(tmp_path):
    """They were counted in info["failed"] only; now a one-line warning says so too, as
    vllm_bench's does (the first error as an example)."""
    failed = ip(10.1, 10.6, [], out=0, error={"error_type": "Timeout", "error_msg": "x"})
    path = write(tmp_path, [ip(10.0, 10.5, [10.1, 10.2, 10.3, 10.4]), failed, ip(10.2, 10.7, [], error="boom")])
    with pytest.warns(BenchReplayWarning) as caught:
        workload = make_inference_perf_workload(InferencePerfConfig(path=str(path), prefix_blocks="none"))
    said = [str(w.message) for w in caught if "open loop" not in str(w.message)]
    assert said == [f"{path}: 2 of the 3 requests failed (error, e.g. {{'error_type': 'Timeout', 'error_msg': "
                    "'x'}): left out of the replay, though they loaded the server too"]
    assert workload.info["failed"] == 2 and len(workload.measured.e2e_ms) == 1


def test_inference_perf_a_clean_report_gives_no_new_warning(tmp_path):
    path = write(tmp_path, [ip(10.0, 10.5, [10.1, 10.2, 10.3, 10.4]), GOOD])
    with warnings.catch_warnings():
        warnings.simplefilter("error", BenchReplayWarning)
        sent, columns, measured, failed = load_inference_perf(path, prefix_blocks="none")
    assert failed == 0 and sent.tolist() == pytest.approx([0.0, 100.0])
    assert measured.tpot_ms.tolist() == pytest.approx([100.0, 100.0])


# -- mlenergy --------------------------------------------------------------------------------------------------


def mle(ttft, latency, out=5, ok=True, error=""):
    return {"input_len": 20, "output_len": out, "ttft": ttft, "latency": latency, "itl": [0.01] * max(0, out - 1),
            "success": ok, "error": error, "prompt": "hi there"}


def test_mlenergy_a_latency_shorter_than_its_ttft_is_refused(tmp_path):
    """ttft 0.6 s, latency 0.2 s gave a TPOT of -100 ms; vllm_bench refuses it, and so does
    mlenergy now, naming the row."""
    path = write(tmp_path, {"results": [mle(0.1, 0.5), mle(0.6, 0.2)]}, "results.json")
    with pytest.raises(WorkloadError) as info:
        make_mlenergy_workload(MlenergyConfig(path=str(path)))
    assert str(info.value) == (f"{path}: results[1].latency (0.2 s) is shorter than results[1].ttft (0.6 s): a "
                               "request's latency holds its time to first token")


def test_mlenergy_a_latency_equal_to_its_ttft_is_kept(tmp_path):
    """One output token: latency = TTFT (and within a microsecond of it: rounding)."""
    path = write(tmp_path, {"results": [mle(0.5, 0.5, out=1), mle(0.3, 0.3 - 5e-7, out=1)]}, "results.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BenchReplayWarning)
        workload = make_mlenergy_workload(MlenergyConfig(path=str(path)))
    assert workload.measured.e2e_ms.tolist() == pytest.approx([500.0, 300.0], abs=1e-3)


def test_mlenergy_failed_requests_are_counted_and_said(tmp_path):
    """Two Timeouts were dropped silently, with nothing in info["failed"]."""
    rows = [mle(0.1, 0.5), mle(0, 0, out=0, ok=False, error="Timeout"), mle(0, 0, out=0, ok=False, error="Later"),
            mle(0.2, 0.6)]
    path = write(tmp_path, {"results": rows, "max_num_seqs": 4}, "results.json")
    with pytest.warns(BenchReplayWarning) as caught:
        workload = make_mlenergy_workload(MlenergyConfig(path=str(path)))
    assert [str(w.message) for w in caught] == [
        f"{path}: 2 of the 4 requests failed (e.g. 'Timeout'): left out of the replay, though they loaded the "
        "server too"]
    assert workload.info["failed"] == 2 and workload.info["requests_in_file"] == 4
    assert len(list(workload.requests(0))) == 2


def test_mlenergy_a_failure_without_an_error_text_is_said_without_an_example(tmp_path):
    path = write(tmp_path, {"results": [mle(0.1, 0.5), mle(0, 0, out=0, ok=False)]}, "results.json")
    with pytest.warns(BenchReplayWarning, match=r"1 of the 2 requests failed: left out"):
        workload = make_mlenergy_workload(MlenergyConfig(path=str(path)))
    assert workload.info["failed"] == 1


def test_mlenergy_no_failure_counts_zero_and_says_nothing(tmp_path):
    path = write(tmp_path, {"results": [mle(0.1, 0.5)]}, "results.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BenchReplayWarning)
        workload = make_mlenergy_workload(MlenergyConfig(path=str(path)))
    assert workload.info["failed"] == 0
