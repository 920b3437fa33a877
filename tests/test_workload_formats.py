"""Workload files as the real tools write them (the input-format audit): ``vllm bench serve``
ramp-ups, ``--burstiness inf``, capped runs without ``queue_times``, ``--append-result`` files and
byte order marks; Azure 2024 timestamps with a time zone; gzip-compressed traces; the Azure 2025
multimodal trace's extra column; inference-perf v0.5.0's per-request records. Every file is
written by the test, and every expected number is worked out by hand in its docstring or comment.
"""

from __future__ import annotations

import gzip
import json
import warnings

import numpy as np
import pytest

from schedlab.errors import ConfigError, InputWarning, WorkloadError
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins import workloads
from schedlab_plugins.workloads.inference_perf import load_inference_perf
from schedlab_plugins.workloads.measured import (
    BenchReplayWarning, VllmBenchConfig, load_vllm_bench, load_vllm_log, make_vllm_bench_workload,
)
from schedlab_plugins.workloads.records import read_records
from schedlab_plugins.workloads.request_file import FileConfig, make_file_workload
from schedlab_plugins.workloads.traces import load_azure, load_mooncake
from test_workloads import make, registry  # noqa: F401 -- (registry: a fixture)


def bench(n, *, prompts=None, starts=None, queue_times=None, errors=None, **settings):
    """A ``vllm bench serve --save-result --save-detailed`` result of ``n`` requests (3 output
    tokens, TTFT 1 ms, two 8 ms gaps), with ``settings`` (request_rate, burstiness, ...)."""
    result = {"date": "20260101-000000", "backend": "openai", "model_id": "m", "num_prompts": n,
              "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None,
              "input_lens": prompts or [10] * n, "output_lens": [3] * n, "ttfts": [0.001] * n,
              "itls": [[0.008, 0.008]] * n, "latencies": [0.017] * n, "errors": errors or [""] * n}
    if errors:
        result["output_lens"] = [0 if e else 3 for e in errors]
    if starts is not None:
        result["start_times"] = starts
    if queue_times is not None:
        result["queue_times"] = queue_times
    result.update(settings)
    return result


def write_json(path, obj, *, bom=False, compress=False):
    data = (b"\xef\xbb\xbf" if bom else b"") + json.dumps(obj).encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def arrivals(workload, seed=0):
    return [r.arrival_ms for r in workload.requests(seed)]


# -- 1. ramp-up without start_times -------------------------------------------------------------------------


def test_a_linear_ramp_with_even_gaps_by_hand(tmp_path):
    """--ramp-up-strategy linear 1 -> 5 rps over 5 requests: progress i / 4, rates 1, 2, 3, 4, 5;
    with --burstiness inf each gap is 1 / rate of the request it leads to, the first's too (vLLM's
    get_request delays every request): 1000, 500, 333.3, 250, 200 ms, so the requests arrive at
    1000, 1500, 1833.3, 2083.3, 2283.3 ms from the benchmark's start (a ramp is not rescaled).
    Request 1 failed: it is left out but keeps its gap, so the others arrive at 1000, 1833.3,
    2083.3, 2283.3 (not all at 0, as request_rate "inf" alone would say)."""
    path = write_json(tmp_path / "ramp.json", bench(5, prompts=[10, 11, 12, 13, 14], errors=["", "boom", "", "", ""],
                                                    burstiness=float("inf"), ramp_up_strategy="linear",
                                                    ramp_up_start_rps=1, ramp_up_end_rps=5))
    with pytest.warns(BenchReplayWarning, match="no start_times"), \
            pytest.warns(BenchReplayWarning, match="1 of the 5 requests failed"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    got = list(workload.requests(3))
    assert [r.prompt_tokens for r in got] == [10, 12, 13, 14]
    assert [r.arrival_ms for r in got] == pytest.approx([1000.0, 1500 + 1000 / 3, 1500 + 1000 / 3 + 250,
                                                         1500 + 1000 / 3 + 450], rel=1e-12)
    assert workload.info["replay"] == "redraw" and workload.info["ramp_up"] == ["linear", 1.0, 5.0]


def test_an_exponential_ramp_with_even_gaps_by_hand(tmp_path):
    """exponential 1 -> 16 rps over 5 requests: 1 * 16 ** (i / 4) = 1, 2, 4, 8, 16 rps; gaps
    1, 1/2, 1/4, 1/8, 1/16 s (the first request's too): arrivals 1000, 1500, 1750, 1875, 1937.5
    ms (exact in binary)."""
    path = write_json(tmp_path / "ramp.json", bench(5, burstiness=float("inf"), ramp_up_strategy="exponential",
                                                    ramp_up_start_rps=1, ramp_up_end_rps=16))
    with pytest.warns(BenchReplayWarning, match="no start_times"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert arrivals(workload) == [1000.0, 1500.0, 1750.0, 1875.0, 1937.5]


def test_a_poisson_ramp_draws_vllm_s_gamma_gaps_from_the_seed(tmp_path):
    """burstiness 0.5 and a linear ramp 2 -> 8 rps over 4 requests (rates 2, 4, 6, 8): vLLM
    draws each gap, the first request's too, as gamma(shape = 0.5, scale = 1 / (rate * 0.5));
    written out here with the seed's generator, the arrivals are their running sum (a ramp is
    not rescaled). The same seed gives the same arrivals, another seed others."""
    path = write_json(tmp_path / "ramp.json", bench(4, burstiness=0.5, ramp_up_strategy="linear",
                                                    ramp_up_start_rps=2, ramp_up_end_rps=8))
    with pytest.warns(BenchReplayWarning, match="no start_times"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    rng = np.random.default_rng(11)
    gaps = [rng.gamma(0.5, 1.0 / (rate * 0.5)) for rate in (2.0, 4.0, 6.0, 8.0)]
    expected = [1000 * sum(gaps[:i + 1]) for i in range(4)]
    assert arrivals(workload, 11) == pytest.approx(expected, rel=1e-12)
    assert arrivals(workload, 11) == arrivals(workload, 11) and arrivals(workload, 12) != arrivals(workload, 11)


def test_start_times_win_over_the_ramp(tmp_path):
    path = write_json(tmp_path / "ramp.json", bench(3, starts=[7.0, 7.25, 7.75], ramp_up_strategy="linear",
                                                    ramp_up_start_rps=1, ramp_up_end_rps=10))
    workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert arrivals(workload) == [0.0, 250.0, 750.0] and workload.info["replay"] == "client"


@pytest.mark.parametrize("change, message", [
    ({"ramp_up_strategy": "cubic"}, r"ramp_up_strategy: must be \"linear\", \"exponential\" or null, got 'cubic'"),
    ({"ramp_up_end_rps": None}, r"ramp_up_end_rps: must be a number > 0 with ramp_up_strategy = 'linear', got None"),
    ({"ramp_up_start_rps": 0}, r"ramp_up_start_rps: must be a number > 0"),
])
def test_a_bad_ramp_is_refused_naming_the_field(tmp_path, change, message):
    result = bench(2, ramp_up_strategy="linear", ramp_up_start_rps=1, ramp_up_end_rps=4)
    result.update(change)
    with pytest.raises(WorkloadError, match=message):
        load_vllm_bench(write_json(tmp_path / "bad.json", result))


# -- 2. --burstiness inf ------------------------------------------------------------------------------------


def test_burstiness_inf_with_start_times_replays_them(tmp_path):
    """json.dump writes float('inf') as Infinity; with start_times it is not needed."""
    path = write_json(tmp_path / "b.json", bench(3, starts=[5.0, 5.25, 5.5], request_rate=4.0,
                                                 burstiness=float("inf")))
    assert "Infinity" in path.read_text()
    workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert arrivals(workload) == [0.0, 250.0, 500.0]
    assert workload.info["burstiness"] == float("inf")


def test_burstiness_inf_without_start_times_spaces_arrivals_evenly(tmp_path):
    """--request-rate 4 --burstiness inf: one request every 250 ms, the first 250 ms after the
    benchmark's start (vLLM delays it too), the last at n / rate = 1 s, whatever the seed."""
    path = write_json(tmp_path / "b.json", bench(4, request_rate=4.0, burstiness=float("inf")))
    with pytest.warns(BenchReplayWarning, match="no start_times"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert arrivals(workload, 1) == arrivals(workload, 2) == [250.0, 500.0, 750.0, 1000.0]


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "inf", True])
def test_a_burstiness_that_is_not_a_positive_number_is_still_refused(tmp_path, value):
    path = write_json(tmp_path / "b.json", bench(2, burstiness=value))
    with pytest.raises(WorkloadError, match=r"burstiness: must be a number > 0 \(or Infinity\)"):
        load_vllm_bench(path)


# -- 3. --max-concurrency without queue_times ----------------------------------------------------------------


def run_capped(tmp_path, path, extra=""):
    exp = tmp_path / "exp.toml"
    exp.write_text(f'[workload]\nkind = "vllm_bench"\npath = "{path}"\n{extra}'
                   '[scheduler]\nkind = "continuous"\nmax_num_seqs = 16\n')
    return run_experiment(load(exp)).all_runs()[0]


def test_an_infinite_rate_under_a_cap_is_all_due_at_once(tmp_path):
    """--request-rate inf --max-concurrency 2, a client that wrote no queue_times: its
    start_times (0, 0, 0.5, 0.5, 1.0, 1.0 s apart) are when a slot freed on the real server,
    not when each request was due. All are due at 0 in file order and the cap paces them on the
    simulated server: two 10-token prefills at 0.05 ms a token end at 1.0 ms, two 8 ms decodes
    at 17.0, when the next pair goes: sends at 0, 0, 17, 17, 34, 34 (not 0, 0, 500, 500, ...)."""
    starts = [40.0, 40.0, 40.5, 40.5, 41.0, 41.0]
    path = write_json(tmp_path / "cap.json", bench(6, starts=starts, max_concurrency=2))
    bench_run = load_vllm_bench(path)
    assert bench_run.due_ms.tolist() == [0.0] * 6 and bench_run.sent_ms.tolist() == [0, 0, 500, 500, 1000, 1000]
    run = run_capped(tmp_path, path)
    assert run.requests["sent_ms"].tolist() == [0.0, 0.0, 17.0, 17.0, 34.0, 34.0]


def test_an_infinite_rate_under_a_cap_sends_in_file_order(tmp_path):
    """Requests due together are sent in the file's order (vLLM creates their tasks so and the
    semaphore wakes them first come first served), whatever order start_times give them."""
    path = write_json(tmp_path / "cap.json", bench(3, prompts=[10, 20, 30], starts=[9.0, 8.0, 8.5],
                                                   request_rate=float("inf"), max_concurrency=1))
    workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert [(r.arrival_ms, r.prompt_tokens) for r in workload.requests(0)] == [(0.0, 10)]   # one slot
    assert workload.info["replay"] == "client"


def test_a_finite_rate_under_a_cap_without_queue_times_is_drawn_again_with_a_warning(tmp_path):
    """--request-rate 4 --burstiness inf --max-concurrency 2 and no queue_times: the due times
    are drawn again (one every 250 ms, the first 250 ms after the start) and the cap holds; a
    warning says so. The two first due (at 250 and 500 ms) go out first."""
    path = write_json(tmp_path / "cap.json", bench(4, starts=[3.0, 3.1, 3.9, 4.0], request_rate=4.0,
                                                   burstiness=float("inf"), max_concurrency=2))
    with pytest.warns(BenchReplayWarning, match=r"cap\.json: max_concurrency 2 at a finite request rate and no "
                                                r"queue_times: .* drawn again from the request_rate"):
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert workload.info["replay"] == "redraw"
    assert arrivals(workload) == [250.0, 500.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # asked for: no warning
        open_loop = make_vllm_bench_workload(VllmBenchConfig(path=str(path), replay="send_times"))
    assert arrivals(open_loop) == pytest.approx([0.0, 100.0, 900.0, 1000.0])


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_warning_is_one_line_once_per_command(tmp_path, capsys, jobs):
    """Said where the experiment loads, on one line; not again by each of the two runs (in this
    process or in workers)."""
    from schedlab.cli import main

    write_json(tmp_path / "cap.json", bench(4, starts=[3.0, 3.1, 3.9, 4.0], request_rate=4.0, max_concurrency=2))
    exp = tmp_path / "cap.toml"
    exp.write_text('[experiment]\nname = "cap"\nreports = ["json"]\n[workload]\nkind = "vllm_bench"\n'
                   'path = "cap.json"\n[[runs]]\nname = "a"\n[[runs]]\nname = "b"\n')
    assert main(["run", str(exp), "--out", str(tmp_path / "out"), "-j", jobs]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("schedlab: warning")]
    assert len(said) == 1 and said[0].startswith(f"schedlab: warning: {tmp_path / 'cap.json'}: max_concurrency 2 "
                                                 "at a finite request rate and no queue_times: "), said


def test_queue_times_still_give_the_due_times(tmp_path):
    """With queue_times (newer clients) a request was due at start_time - queue_time: 5.0 - 0,
    5.3 - 0.3, 5.6 - 0.35 -> 0, 0, 250 ms; no warning at a finite rate."""
    path = write_json(tmp_path / "cap.json", bench(3, starts=[5.0, 5.3, 5.6], queue_times=[0.0, 0.3, 0.35],
                                                   request_rate=4.0, max_concurrency=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        workload = make_vllm_bench_workload(VllmBenchConfig(path=str(path)))
    assert load_vllm_bench(path).due_ms.tolist() == pytest.approx([0.0, 0.0, 250.0])
    assert workload.info["replay"] == "client"


# -- 4. several results in one file (--append-result) --------------------------------------------------------


def appended(tmp_path):
    """Two results one after the other, as --append-result writes them (a newline between)."""
    first = bench(2, prompts=[10, 11], starts=[1.0, 1.5])
    second = bench(3, prompts=[20, 21, 22], starts=[9.0, 9.25, 9.5])
    path = tmp_path / "append.json"
    path.write_text(json.dumps(first) + "\n" + json.dumps(second))
    return path


def test_the_last_result_of_an_appended_file_is_read_by_default(tmp_path, registry):
    path = appended(tmp_path)
    workload = make(registry, {"kind": "vllm_bench", "path": str(path)})
    assert [(r.arrival_ms, r.prompt_tokens) for r in workload.requests(0)] == [(0.0, 20), (250.0, 21), (500.0, 22)]
    first = make(registry, {"kind": "vllm_bench", "path": str(path), "index": 0})
    assert [(r.arrival_ms, r.prompt_tokens) for r in first.requests(0)] == [(0.0, 10), (500.0, 11)]


def test_an_index_past_the_results_says_how_many_there_are(tmp_path, registry):
    with pytest.raises(WorkloadError, match=r"append\.json: index 2: the file holds 2 results \(0 to 1\)"):
        make(registry, {"kind": "vllm_bench", "path": str(appended(tmp_path)), "index": 2})
    one = write_json(tmp_path / "one.json", bench(1, starts=[1.0]))
    with pytest.raises(WorkloadError, match=r"one\.json: index 1: the file holds 1 result \(0 to 0\)"):
        load_vllm_bench(one, index=1)
    with pytest.raises(ConfigError, match=r"index"):
        make(registry, {"kind": "vllm_bench", "path": str(one), "index": -1})


def test_bad_json_after_the_first_result_names_the_document(tmp_path):
    path = tmp_path / "append.json"
    path.write_text(json.dumps(bench(1, starts=[1.0])) + "\n{oops")
    with pytest.raises(WorkloadError, match=r"append\.json: not JSON \(document 2: Expecting .*: line 2 column 2\)"):
        load_vllm_bench(path)


def test_the_whole_results_before_one_cut_short_are_read_when_index_picks_one(tmp_path):
    path = appended(tmp_path)
    path.write_text(path.read_text() + "\n" + json.dumps(bench(1, starts=[1.0]))[:30])   # a third, cut short
    with pytest.warns(InputWarning, match=r"append\.json: document 3 is not JSON \(.*: a run cut short\?\); "
                                          r"reading document index 1, one of the 2 before it"):
        assert load_vllm_bench(path, index=1).columns.prompt_tokens.tolist() == [20, 21, 22]
    with pytest.warns(InputWarning, match="reading document index 0"):
        assert load_vllm_bench(path, index=0).columns.prompt_tokens.tolist() == [10, 11]
    for index in (None, 2):
        with pytest.raises(WorkloadError, match=r"not JSON \(document 3: .*\); the 2 document\(s\) before it are "
                                                r"whole: index 0..1 reads one$"):
            load_vllm_bench(path, index=index)


# -- 5. byte order marks --------------------------------------------------------------------------------------


def test_json_files_with_a_byte_order_mark(tmp_path):
    path = write_json(tmp_path / "bom.json", bench(2, starts=[1.0, 1.5]), bom=True)
    assert load_vllm_bench(path).sent_ms.tolist() == [0.0, 500.0]
    ip = write_json(tmp_path / "ip.json", [ip_record(10.0, 10.5, {"input_tokens": 7, "output_tokens": 2})], bom=True)
    assert load_inference_perf(ip, prefix_blocks="none")[1].prompt_tokens.tolist() == [7]


def test_jsonl_and_csv_files_with_a_byte_order_mark_by_every_reader(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + json.dumps({"input_toks": 4, "output_toks": 2, "queued_ts": 1.0,
                                                  "first_token_ts": 1.5, "last_token_ts": 2.0}).encode() + b"\n")
    assert load_vllm_log(log)[1].prompt_tokens.tolist() == [4]
    csv = tmp_path / "r.csv"
    csv.write_bytes(b"\xef\xbb\xbfprompt_tokens,output_tokens\r\n5,6\r\n7,8\r\n")
    for reader in ("arrow", "numpy", "python"):
        records = read_records(csv, {"prompt_tokens": ("prompt_tokens",)}, required=("prompt_tokens",), reader=reader)
        assert records.ints("prompt_tokens").tolist() == [5, 7], reader


# -- 6. Azure 2024 timestamps with a time zone ----------------------------------------------------------------


def test_azure_2024_time_zones_become_utc(tmp_path):
    """Four stamps, each at a whole second plus 0.009930 s in UTC:
    00:00:00.009930+00:00 -> 0; 02:00:01.009930+02:00 = 00:00:01.009930 UTC -> 1000 ms;
    2024-05-09 19:30:00.509930-04:30 = 2024-05-10 00:00:00.509930 UTC -> 500 ms;
    00:00:02.009930Z -> 2000 ms. Ordered by UTC: prompts 1, 3, 2, 4."""
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2024-05-10 00:00:00.009930+00:00,1,5\n2024-05-10 02:00:01.009930+02:00,2,5\n"
                    "2024-05-09 19:30:00.509930-04:30,3,5\n2024-05-10T00:00:02.009930Z,4,5\n")
    arrival, columns, _ = load_azure(path)
    assert arrival.tolist() == [0.0, 1000.0, 500.0, 2000.0]
    workload = workloads.traces.make_azure_workload(workloads.traces.AzureConfig(path=str(path)))
    assert [(r.arrival_ms, r.prompt_tokens) for r in workload.requests(0)] == [(0.0, 1), (500.0, 3), (1000.0, 2),
                                                                                (2000.0, 4)]


def test_azure_time_zones_keep_the_nanosecond(tmp_path):
    """The 2023 form and the 2024 form of the same instants give the same arrivals to the
    nanosecond: 1 ns after the first is 1e-6 ms, 319.410001 ms as in the 2023 test."""
    old = tmp_path / "2023.csv"
    old.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,1\n"
                   "2023-11-16 18:15:46.680590001,1,1\n2023-11-16 18:15:47.000000001,1,1\n")
    new = tmp_path / "2024.csv"
    new.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 19:15:46.6805900+01:00,1,1\n"
                   "2023-11-16 18:15:46.680590001+00:00,1,1\n2023-11-16 18:15:47.000000001Z,1,1\n")
    assert load_azure(old)[0].tolist() == load_azure(new)[0].tolist() == [0.0, 1e-6, 319.410001]


@pytest.mark.parametrize("stamp", ["2024-05-10 00:00:00+24:00", "2024-05-10 00:00:00+0000", "2024-05-10+00:00",
                                   "2024-05-10 00:00:00 +00:00", "1700000000Z"])
def test_a_malformed_time_zone_is_refused_naming_the_line(tmp_path, stamp):
    path = tmp_path / "az.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,1,1\n{stamp},2,2\n")
    with pytest.raises(WorkloadError, match=r"az\.csv: line 3: timestamp \(column 'TIMESTAMP'\): not a date and "
                                            r"time like .*time zone Z, \+hh:mm or -hh:mm if any"):
        load_azure(path)


def test_stamps_with_and_without_a_time_zone_in_one_file_are_refused(tmp_path):
    """The second stamp, without a zone, was read as UTC: 2 hours after the first (00:00+02:00 is
    22:00 UTC the day before), with no word. A file that mixes them is two traces joined."""
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+02:00,10,5\n"
                    "2024-05-10 00:00:00,10,5\n")
    with pytest.raises(WorkloadError) as info:
        load_azure(path)
    assert str(info.value) == (f"{path}: line 3: timestamp (column 'TIMESTAMP'): '2024-05-10 00:00:00' has no time "
                               "zone, but line 2's '2024-05-10 00:00:00+02:00' has one: a file that mixes them is "
                               "likely two traces joined (a stamp without one would be read as UTC); give every "
                               "stamp its zone (+00:00 for UTC) or none")
    # every stamp with its zone: the 2 hours are gone
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+02:00,10,5\n"
                    "2024-05-09 22:00:00Z,10,5\n")
    assert load_azure(path)[0].tolist() == [0.0, 0.0]


# -- 7. gzip-compressed traces ---------------------------------------------------------------------------------

AZURE_2023 = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
              "2023-11-16 18:17:04.0319600,3180,8\n")
MOONCAKE = ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
            '{"timestamp": 3000, "input_length": 700, "output_length": 6, "hash_ids": [0, 2]}\n')


def test_gzip_traces_read_as_their_text(tmp_path):
    """04.03196 - 03.97996 = 52 ms; Mooncake's timestamps are ms already."""
    az = tmp_path / "az.csv.gz"
    az.write_bytes(gzip.compress(AZURE_2023.encode()))
    arrival, columns, _ = load_azure(az)
    assert arrival.tolist() == [0.0, 52.0] and columns.prompt_tokens.tolist() == [4808, 3180]
    mc = tmp_path / "mc.jsonl.gz"
    mc.write_bytes(gzip.compress(MOONCAKE.encode()))
    arrival, columns, _ = load_mooncake(mc)
    assert arrival.tolist() == [0.0, 3000.0] and columns.per_row["block_hashes"] == [(0, 1), (0, 2)]
    as_list = tmp_path / "mc.json.gz"     # a JSON list: the format from the name under .gz
    as_list.write_bytes(gzip.compress(json.dumps([json.loads(line) for line in MOONCAKE.splitlines()]).encode()))
    assert load_mooncake(as_list)[0].tolist() == [0.0, 3000.0]


def test_gzip_is_told_by_its_bytes_not_its_name(tmp_path):
    hidden = tmp_path / "az.csv"
    hidden.write_bytes(gzip.compress(("\ufeff" + AZURE_2023).encode()))   # with a byte order mark inside
    assert load_azure(hidden)[0].tolist() == [0.0, 52.0]


def test_every_reader_reads_a_gzip_request_file_alike(tmp_path):
    path = tmp_path / "r.csv.gz"
    path.write_bytes(gzip.compress(b"prompt_tokens,output_tokens,arrival_ms\n5,6,0\n7,8,12.5\n"))
    for reader in ("arrow", "numpy", "python"):
        records = read_records(path, {"arrival_ms": ("arrival_ms",)}, reader=reader)
        assert records.floats("arrival_ms").tolist() == [0.0, 12.5], reader
    workload = make_file_workload(FileConfig(path=str(path)))
    assert [(r.arrival_ms, r.prompt_tokens) for r in workload.requests(0)] == [(0.0, 5), (12.5, 7)]


def test_gzip_json_and_jsonl_of_the_measured_readers(tmp_path):
    path = write_json(tmp_path / "bench.json.gz", bench(2, starts=[1.0, 1.25]), compress=True)
    assert load_vllm_bench(path).sent_ms.tolist() == [0.0, 250.0]
    log = tmp_path / "log.jsonl.gz"
    log.write_bytes(gzip.compress(json.dumps({"input_toks": 4, "output_toks": 2, "queued_ts": 1.0,
                                              "first_token_ts": 1.5, "last_token_ts": 2.0}).encode()))
    assert load_vllm_log(log)[2].ttft_ms.tolist() == [500.0]
    ip = write_json(tmp_path / "ip.json.gz", [ip_record(10.0, 10.5, {"input_tokens": 7, "output_tokens": 2})],
                    compress=True)
    assert load_inference_perf(ip, prefix_blocks="none")[1].output_tokens.tolist() == [2]


def test_a_cut_off_gzip_file_is_said_so(tmp_path):
    data = gzip.compress((AZURE_2023 * 50).encode())
    path = tmp_path / "az.csv.gz"
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(WorkloadError, match=r"az\.csv\.gz: gzip file cut off before its end; check it with gunzip -t"):
        load_azure(path)
    bench_path = tmp_path / "b.json.gz"
    bench_path.write_bytes(gzip.compress(json.dumps(bench(30, starts=[1.0] * 30)).encode())[:40])
    with pytest.raises(WorkloadError, match=r"b\.json\.gz: gzip file cut off"):
        load_vllm_bench(bench_path)


# -- 8. the Azure 2025 multimodal trace ------------------------------------------------------------------------


def test_azure_2025_num_images_is_left_out(tmp_path):
    path = tmp_path / "mm.csv"
    path.write_text("TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n2024-10-15 18:17:03.979960,0,4808,10\n"
                    "2024-10-15 18:17:04.031960,3,3180,8\n")
    arrival, columns, _ = load_azure(path)
    assert arrival.tolist() == [0.0, 52.0]
    assert columns.prompt_tokens.tolist() == [4808, 3180] and columns.output_tokens.tolist() == [10, 8]
    assert "NumImages" in workloads.traces.__doc__


# -- 9. inference-perf v0.5.0 ---------------------------------------------------------------------------------


def ip_record(start, end, info, payload=None):
    return {"start_time": start, "end_time": end, "request": json.dumps(payload or {"prompt": "p"}),
            "response": None, "info": info, "error": None}


def test_inference_perf_v0_5_response_info(tmp_path):
    """v0.5.0 (inference_perf/apis/base.py): info = {input_tokens, response_info: {output_tokens,
    output_token_times, chunk_times, server_usage}}. Sent at 100.0, tokens at 100.1, 100.2,
    100.4, done at 100.5: TTFT 100 ms, TPOT (400 - 100) / 2 = 150 ms, latency 500 ms. The
    server's completion_tokens (3) wins over the client's count (4), as in later versions; a
    unary response (no token times) has no TTFT."""
    streamed = ip_record(100.0, 100.5, {
        "input_tokens": 20, "extra_info": {}, "lora_adapter": None,
        "response_info": {"response_chunks": ["{}"] * 3, "chunk_times": [100.1, 100.2, 100.4], "output_tokens": 4,
                          "output_token_times": [100.1, 100.2, 100.4],
                          "server_usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}}})
    unary = ip_record(100.25, 100.75, {"input_tokens": 9, "response_info": {"output_tokens": 2}})
    sent, columns, measured, failed = load_inference_perf(write_json(tmp_path / "ip.json", [streamed, unary]),
                                                          prefix_blocks="none")
    assert failed == 0 and sent.tolist() == [0.0, 250.0]
    assert columns.prompt_tokens.tolist() == [20, 9] and columns.output_tokens.tolist() == [3, 2]
    assert measured.ttft_ms[0] == pytest.approx(100.0) and np.isnan(measured.ttft_ms[1])
    assert measured.tpot_ms[0] == pytest.approx(150.0)
    assert measured.e2e_ms.tolist() == pytest.approx([500.0, 500.0])


def test_inference_perf_older_and_newer_layouts_still_read(tmp_path):
    """v0.4 (counts at info's top) and v0.6 (request_metrics / response_metrics): 5 and 3 output
    tokens, first tokens 100 and 50 ms after sending."""
    old = ip_record(1.0, 1.8, {"input_tokens": 12, "output_tokens": 5, "output_token_times": [1.1, 1.2, 1.7]})
    new = ip_record(1.5, 2.0, {"request_metrics": {"text": {"input_tokens": 30}},
                               "response_metrics": {"output_tokens": 3, "output_token_times": [1.55, 1.6, 1.95]}})
    _, columns, measured, _ = load_inference_perf(write_json(tmp_path / "ip.json", [old, new]), prefix_blocks="none")
    assert columns.prompt_tokens.tolist() == [12, 30] and columns.output_tokens.tolist() == [5, 3]
    assert measured.ttft_ms.tolist() == pytest.approx([100.0, 50.0])


def test_a_json_file_cut_short_says_where_it_stops(tmp_path):
    """A report copied while its tool was still writing: json's message ends in "at", and its
    position is what says the file stops there (it was left out: "not JSON (Unterminated string
    starting at)")."""
    path = tmp_path / "cut.json"
    path.write_text('[{"request": "hel')
    with pytest.raises(WorkloadError) as info:
        load_inference_perf(path)
    assert str(info.value) == f"{path}: not JSON (Unterminated string starting at: line 1 column 14)"


@pytest.mark.parametrize("content, said", [
    ('[{"request": 1}]'.encode("utf-16"), "not UTF-8 text (it looks like UTF-16, e.g. from PowerShell's >: save "
                                          "it as UTF-8, e.g. with Out-File -Encoding utf8)"),
    (b" \n\n", "the file is empty"),
])
def test_a_utf16_or_empty_report_is_named_as_the_target_reader_names_it(tmp_path, content, said):
    """The workload readers said "invalid start byte at byte 0" and "not JSON (Expecting value)"
    where [target] names UTF-16 (what PowerShell's > writes) and an empty file."""
    path = tmp_path / "report.json"
    path.write_bytes(content)
    with pytest.raises(WorkloadError) as info:
        load_inference_perf(path)
    assert str(info.value) == f"{path}: {said}"
