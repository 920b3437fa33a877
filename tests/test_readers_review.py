"""The readers review (reviews/readers.md): real benchmark files schedlab had never seen, each case
rebuilt here small, in the shape of the real file, with its expectations worked out by hand.

* inference-perf's Prometheus reports of a client before #348 (no ``inter_token_latency`` block):
  their ``time_per_output_token`` is vLLM's per-token histogram -- the ITL, not a TPOT;
* the same reports beside the client's lifecycle report of the stage, when the server counted far
  more requests than the client sent: the window held other traffic, its rates are left out;
* inference-perf lifecycle reports of the client that timed each SSE line as a token: TPOT and
  ITL left out;
* Prometheus quantiles in the ``+Inf`` bucket: left out;
* a scrape with renamed (``sglang_``) histograms, a YAML report beginning with ``#`` comments, a
  Git LFS pointer in place of a trace or a target.
"""

import json
import warnings

import pytest

from schedlab.errors import ConfigError, WorkloadError
from schedlab.targets import TargetConfig, TargetWarning, read_summary
from schedlab_plugins.workloads.records import read_json_file, read_records
from schedlab_plugins.workloads.traces import load_burstgpt


def _write(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def _read(path, **kw):
    """``read_summary(path)`` and the messages of the TargetWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = read_summary(path, **kw)
    return summary, [str(w.message) for w in caught if issubclass(w.category, TargetWarning)]


#: inference-perf's config.yaml as the KubeCon NA 2025 demo wrote it (the keys schedlab reads):
#: a vLLM server, Prometheus scraped every 15 s -- the window runs 15 + 2 = 17 s past the run
CONFIG = "server:\n  type: vllm\nmetrics:\n  type: prometheus\n  prometheus:\n    scrape_interval: 15\n"


def _server_report(count: int = 6400, rate: float = 80.0, itl_block: bool = False) -> dict:
    """An inference-perf ``stage_<k>_prometheus_metrics.json`` of a vLLM server, as inference-perf
    7ff8150 writes it (``itl_block``: as from #348 on, with ``inter_token_latency``)."""
    successes = {"count": count, "rate": rate,
                 "prompt_len": {"mean": 200, "rate": 16000.0}, "output_len": {"mean": 64, "rate": 5120.0},
                 "queue_len": {"mean": 0},
                 "request_latency": {"mean": 1.25, "median": 1.2, "p90": 1.75, "p99": 2.125},
                 "time_to_first_token": {"mean": 0.0375, "median": 0.034, "p90": 0.054, "p99": 0.0715},
                 "time_per_output_token": {"mean": 0.0225, "median": 0.019, "p90": 0.0375, "p99": 0.04875},
                 "kv_cache_usage_percentage": {"mean": 0.0, "median": 0.0, "p90": 0.0, "p99": 0.0},
                 "num_requests_swapped": {"mean": 0}, "num_preemptions_total": {"mean": 0},
                 "prefix_cache_hit_percent": {"mean": 0.0}}
    if itl_block:
        successes["inter_token_latency"] = {"mean": 0.02, "median": 0.018, "p90": 0.03, "p99": 0.045}
    return {"load_summary": {}, "successes": successes, "failures": {}}


def _client_report(count: int, failed: int = 0, send_duration: float | None = 60.0) -> dict:
    """The client's ``stage_<k>_lifecycle_metrics.json`` of the same stage (the keys read here)."""
    load = {"count": count + failed}
    if send_duration is not None:
        load.update(send_duration=send_duration, requested_rate=52.5, achieved_rate=52.5)
    return {"load_summary": load,
            "successes": {"count": count, "latency": {"request_latency": {"mean": 1.28},
                                                      "time_to_first_token": {"mean": 0.05}}},
            "failures": {"count": failed}}


# --- finding 1a: an inference-perf before #348 queried vllm:time_per_output_token_seconds ----------


def test_an_old_inference_perf_prometheus_reports_time_per_output_token_is_read_as_the_itl(tmp_path):
    """Before #348 its vLLM client queried time_per_output_token from vllm:time_per_output_token_seconds,
    observed at every gap between two tokens: the ITL, 22.5 ms mean and 48.75 ms p99 here -- it was
    compared with the simulated per-request TPOT."""
    _write(tmp_path / "results" / "config.yaml", CONFIG)
    path = _write(tmp_path / "results" / "summary_prometheus_metrics.json", _server_report())
    s, said = _read(path)
    assert not any(name.startswith("tpot_ms") for name in s.values)
    assert {k: s.values[k] for k in ("itl_ms.mean", "itl_ms.p50", "itl_ms.p90", "itl_ms.p99")} == \
        pytest.approx({"itl_ms.mean": 22.5, "itl_ms.p50": 19.0, "itl_ms.p90": 37.5, "itl_ms.p99": 48.75})
    assert s.values["ttft_ms.mean"] == pytest.approx(37.5)
    assert s.values["request_throughput_rps"] == 80.0   # no client report beside it: read as before
    (message,) = said
    assert str(path) in message and "no inter_token_latency block" in message and "#348" in message
    assert "vllm:time_per_output_token_seconds" in message and "read as the ITL (itl_ms)" in message
    # from #348 on both blocks are written: time_per_output_token is the request's TPOT, and no note
    path = _write(tmp_path / "new" / "summary_prometheus_metrics.json", _server_report(itl_block=True))
    s, said = _read(path)
    assert s.values["tpot_ms.mean"] == pytest.approx(22.5) and s.values["itl_ms.mean"] == pytest.approx(20.0)
    assert said == []


# --- finding 1b: a Prometheus window that held other traffic -----------------------------------


def test_a_prometheus_report_counting_twice_the_clients_requests_has_its_rates_left_out(tmp_path):
    """KubeCon NA 2025, vllm+eagle stage 3: the server counted 6411 requests at 81.16/s, the client
    sent 3149 at 51.6/s. Here 6400 against 3150 sent in 60 s: 2.03x, over 1.2 x (60 + 17) / 60 =
    1.54x. The rates and the count are left out; the latencies are kept."""
    folder = tmp_path / "results"
    _write(folder / "config.yaml", CONFIG)
    _write(folder / "stage_3_lifecycle_metrics.json", _client_report(3150))
    path = _write(folder / "stage_3_prometheus_metrics.json", _server_report(count=6400, rate=80.0))
    s, said = _read(path)
    assert not set(s.values) & {"request_throughput_rps", "output_throughput_tps", "total_throughput_tps"}
    assert s.requests is None
    assert {"successes.count", "successes.rate", "successes.output_len.rate", "successes.prompt_len.rate"} <= \
        set(s.dropped)
    assert "6400 against 3150" in s.dropped["successes.rate"]
    assert s.values["e2e_ms.mean"] == pytest.approx(1250.0) and s.values["ttft_ms.p99"] == pytest.approx(71.5)
    window = [m for m in said if "other traffic" in m]
    assert len(window) == 1 and len(window[0].splitlines()) == 1
    assert str(path) in window[0] and "6400 finished requests, 2.0x the 3150" in window[0]
    assert "stage_3_lifecycle_metrics.json" in window[0] and "at most 1.54x" in window[0]
    # a [target] says it once (not again as a statistic 'not a finite number')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TargetConfig(path=str(path)).read()
    again = [str(w.message) for w in caught if "other traffic" in str(w.message)]
    assert len(again) == 1 and again[0].startswith(f"path {path}: ") and again[0].endswith(window[0].split(": ", 1)[1])
    assert not any("not a finite number" in str(w.message) for w in caught)


def test_a_prometheus_count_within_what_the_window_can_add_is_kept(tmp_path):
    """1.3x the client's requests over a 60 s stage (under 1.54x: Prometheus' extrapolation of
    increase() to a window 17 s longer than the run adds up to 77/60) and failures counted with the
    client's: read as before. Without a lifecycle report beside it, as before too."""
    folder = tmp_path / "results"
    _write(folder / "config.yaml", CONFIG)
    _write(folder / "stage_1_lifecycle_metrics.json", _client_report(4000, failed=100))
    path = _write(folder / "stage_1_prometheus_metrics.json", _server_report(count=5330, rate=60.0))
    s, said = _read(path)   # 5330 / 4100 = 1.3
    assert s.values["request_throughput_rps"] == 60.0 and s.values["output_throughput_tps"] == 5120.0
    assert s.values["total_throughput_tps"] == 21120.0 and s.requests == 5330
    assert not any("other traffic" in m for m in said)
    # the summary's client report gives no send_duration (inference-perf 7ff8150): the limit is 1.5x
    _write(folder / "summary_lifecycle_metrics.json", _client_report(22042, send_duration=None))
    path = _write(folder / "summary_prometheus_metrics.json", _server_report(count=32000, rate=70.0))
    s, said = _read(path)   # 32000 / 22042 = 1.45: kept
    assert s.values["request_throughput_rps"] == 70.0
    path = _write(folder / "summary_prometheus_metrics.json", _server_report(count=47869, rate=74.7))
    s, said = _read(path)   # the KubeCon eagle summary: 47869 / 22042 = 2.17, over 1.5
    assert "request_throughput_rps" not in s.values
    assert any("2.2x the 22042" in m and "at most 1.50x" in m for m in said)
    # a report under another name has no sibling: read as before
    path = _write(folder / "prom_copy.json", _server_report(count=47869, rate=74.7))
    s, said = _read(path)
    assert s.values["request_throughput_rps"] == 74.7 and s.requests == 47869


# --- finding 2: inference-perf lifecycle reports that timed each SSE line as a token -----------


def _lifecycle(tpot_mean=0.0108, itl_mean=0.0108, itl_median=0.00005, output=63.0) -> dict:
    """A stage's lifecycle report as inference-perf 7ff8150 wrote it (vllm+eagle stage 3, rounded):
    latency 1.28 s, TTFT 0.05 s, output_len 63 tokens."""
    def block(mean, median):
        return {"mean": mean, "min": median / 2, "median": median, "p90": mean * 2, "p99": mean * 3, "max": mean * 4}
    return {"load_summary": {"count": 4, "send_duration": 60.0},
            "successes": {"count": 4,
                          "latency": {"request_latency": block(1.28, 1.28),
                                      "time_to_first_token": block(0.05, 0.05),
                                      "time_per_output_token": block(tpot_mean, tpot_mean),
                                      "inter_token_latency": block(itl_mean, itl_median)},
                          "throughput": {"input_tokens_per_sec": 400.0, "output_tokens_per_sec": 126.0,
                                         "total_tokens_per_sec": 526.0, "requests_per_sec": 2.0},
                          "output_len": {"mean": output, "median": output}},
            "failures": {"count": 0}}


def test_a_lifecycle_report_that_timed_each_sse_line_as_a_token_has_no_tpot_or_itl(tmp_path):
    """By hand: TPOT x (output - 1) = 10.8 ms x 62 = 669.6 ms, 0.54 of latency - TTFT = 1230 ms
    (under 0.7); the ITL median 0.05 ms is 1/216 of its mean 10.8 ms (under 1/10). Both signs:
    the 8 TPOT and ITL statistics (mean, median, p90, p99 each) are left out, the 11 of TTFT, E2E
    and the rates kept, one warning."""
    path = _write(tmp_path / "stage_3_lifecycle_metrics.json", _lifecycle())
    s, said = _read(path)
    assert not any(name.partition(".")[0] in ("tpot_ms", "itl_ms") for name in s.values)
    assert s.values["ttft_ms.mean"] == pytest.approx(50.0) and s.values["e2e_ms.p90"] == pytest.approx(2560.0)
    assert s.values["request_throughput_rps"] == 2.0
    assert "SSE lines" in s.dropped["successes.latency.time_per_output_token.mean"]
    assert "successes.latency.inter_token_latency.median" in s.dropped
    (message,) = said
    assert str(path) in message and "0.54 of request_latency - time_to_first_token (1230 ms" in message
    assert "median 0.05 ms is 1/216 of its mean 10.8 ms" in message
    assert "#410" in message and "blank one" in message
    assert "the 8 TPOT and ITL statistics are left out, the other 11 compared" in message


def test_each_sign_of_sse_line_tokens_alone_is_enough_and_a_fixed_client_shows_neither(tmp_path):
    # the TPOT sign alone (an ITL whose median is not tiny): 669.6 / 1230 = 0.54
    s, said = _read(_write(tmp_path / "a.json", _lifecycle(itl_median=0.009)))
    assert "tpot_ms.mean" not in s.values and "itl_ms.mean" not in s.values and len(said) == 1
    assert "0.54 of" in said[0] and "median" not in said[0].split(":")[1]
    # the ITL sign alone (several tokens a chunk, each chunk two lines: TPOT 19.8 ms x 62 = 1227.6 ms,
    # 1.00 of 1230): median 0.05 ms under a tenth of the mean
    s, said = _read(_write(tmp_path / "b.json", _lifecycle(tpot_mean=0.0198)))
    assert "tpot_ms.mean" not in s.values and len(said) == 1 and "1/216" in said[0]
    # a fixed client (#566): TPOT 19.8 ms, ITL mean 19.8 ms, median 19 ms -- read as before
    s, said = _read(_write(tmp_path / "c.json", _lifecycle(tpot_mean=0.0198, itl_mean=0.0198, itl_median=0.019)))
    assert s.values["tpot_ms.mean"] == pytest.approx(19.8) and s.values["itl_ms.p50"] == pytest.approx(19.0)
    assert said == []
    # ... under speculative decoding: a chunk's tokens share its time, gaps of exactly 0, median 0
    s, said = _read(_write(tmp_path / "d.json", _lifecycle(tpot_mean=0.0198, itl_mean=0.0198, itl_median=0.0)))
    assert s.values["tpot_ms.mean"] == pytest.approx(19.8) and said == []


def test_a_target_comparing_only_ttft_and_e2e_of_such_a_report_says_nothing(tmp_path):
    """experiments/h100_inference_perf.toml compares TTFT and E2E only: nothing to say there. With
    every statistic, one warning (not a second one listing the statistics as 'not a finite number')."""
    path = _write(tmp_path / "stage_0_lifecycle_metrics.json", _lifecycle())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = TargetConfig(path=str(path), statistics=["ttft_ms.mean", "e2e_ms.p90"]).read()
    assert s.values == pytest.approx({"ttft_ms.mean": 50.0, "e2e_ms.p90": 2560.0})
    assert [w for w in caught if issubclass(w.category, TargetWarning)] == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TargetConfig(path=str(path)).read()
    said = [str(w.message) for w in caught if issubclass(w.category, TargetWarning)]
    assert len(said) == 1 and "#410" in said[0]
    with pytest.raises(Exception, match="holds no 'tpot_ms.mean'"), pytest.warns(TargetWarning, match="#410"):
        TargetConfig(path=str(path), statistics=["tpot_ms.mean"]).read()   # (said why first)


# --- finding 3: quantiles in the +Inf bucket --------------------------------------------------


def test_a_quantile_in_the_inf_bucket_is_left_out(tmp_path):
    """TTFT of 4 requests: 1 at or below 10 ms, 3 at or below 50, 1 above (+Inf). p50: rank 2 in (10,
    50] holding 2: 10 + 40 x 1/2 = 30 ms; p90 (rank 3.6) and p99 (3.96) are above the 3 of the last
    finite bucket: histogram_quantile gives 50 whatever the observations -- left out. E2E: 2 of 4 at
    or below 800 ms: p50 rank 2 is the last finite bucket's count, 800 (kept)."""
    scrape = "\n".join([
        "# TYPE sglang:time_to_first_token_seconds histogram",
        'sglang:time_to_first_token_seconds_bucket{le="0.01"} 1',
        'sglang:time_to_first_token_seconds_bucket{le="0.05"} 3',
        'sglang:time_to_first_token_seconds_bucket{le="+Inf"} 4',
        "sglang:time_to_first_token_seconds_sum 2.1", "sglang:time_to_first_token_seconds_count 4",
        'sglang:e2e_request_latency_seconds_bucket{le="0.8"} 2',
        'sglang:e2e_request_latency_seconds_bucket{le="+Inf"} 4',
        "sglang:e2e_request_latency_seconds_sum 10.0", "sglang:e2e_request_latency_seconds_count 4", ""])
    path = _write(tmp_path / "metrics.prom", scrape)
    s, said = _read(path)
    assert s.values == pytest.approx({"ttft_ms.mean": 525.0, "ttft_ms.p50": 30.0,
                                      "e2e_ms.mean": 2500.0, "e2e_ms.p50": 800.0})
    assert set(s.dropped) == {"ttft_ms.p90", "ttft_ms.p99", "e2e_ms.p90", "e2e_ms.p99"}
    assert "+Inf bucket (above its last bound, 50 ms)" in s.dropped["ttft_ms.p90"]
    (message,) = said
    assert str(path) in message and "ttft_ms.p90, ttft_ms.p99, e2e_ms.p90, e2e_ms.p99 fall in" in message


# --- finding 4: formats schedlab does not read, said so -------------------------------------------


def test_a_scrape_of_renamed_histograms_is_refused_saying_so(tmp_path):
    """sgl-router's aggregated /engine_metrics writes sglang_ for sglang: (and a source label)."""
    rows = ['sglang_time_to_first_token_seconds_bucket{source="w1",le="0.1"} 3',
            'sglang_time_to_first_token_seconds_bucket{source="w1",le="+Inf"} 4',
            'sglang_time_to_first_token_seconds_sum{source="w1"} 0.5',
            'sglang_time_to_first_token_seconds_count{source="w1"} 4']
    for text in ("# HELP sglang_time_to_first_token_seconds ttft\n" + "\n".join(rows) + "\n", "\n".join(rows) + "\n"):
        path = _write(tmp_path / "router.prom", text)
        with pytest.raises(ConfigError) as exc:
            read_summary(path)
        message = str(exc.value)
        assert str(path) in message and "sglang_time_to_first_token_seconds" in message
        assert "not sglang:time_to_first_token_seconds" in message and "renamed" in message
    path = _write(tmp_path / "exporter.prom", "vllm_e2e_request_latency_seconds_count 4\n")
    with pytest.raises(ConfigError, match="holds vllm_e2e_request_latency_seconds, not vllm:e2e_request_latency"):
        read_summary(path)


def test_an_openmetrics_scrape_that_escapes_colons_is_read_by_its_type_lines(tmp_path):
    """vLLM 0.33 serves /metrics with prometheus_client 0.26, whose OpenMetrics writer (``Accept:
    application/openmetrics-text``) escapes ':' to '_' in sample names but keeps the ``# TYPE`` line's
    name: read as the engine's histogram (it was refused as an exporter's renamed one). Four TTFTs of
    30, 50, 70 and 200 ms in buckets 40/60/80/250 ms: mean 350/4 = 87.5; p50 at rank 2 is 60; p90 at
    rank 3.6 is 80 + 170 x 0.6 = 182 ms (Prometheus' linear interpolation in the bucket)."""
    buckets = [("0.04", 1), ("0.06", 2), ("0.08", 3), ("0.25", 4), ("+Inf", 4)]
    lines = ["# HELP vllm:time_to_first_token_seconds x", "# TYPE vllm:time_to_first_token_seconds histogram"]
    lines += [f'vllm_time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {c}.0'
              for le, c in buckets]
    lines += ['vllm_time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0',
              'vllm_time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.35', "# EOF"]
    values = read_summary(_write(tmp_path / "om.prom", "\n".join(lines) + "\n")).values
    assert values == pytest.approx({"ttft_ms.mean": 87.5, "ttft_ms.p50": 60.0, "ttft_ms.p90": 182.0,
                                    "ttft_ms.p99": 243.2})


def test_a_yaml_report_beginning_with_comments_is_not_taken_for_a_scrape(tmp_path):
    """llm-d-benchmark's inference_perf_lifecycle.yaml begins with seven # lines: it was refused as
    'line 9: not a Prometheus sample: failures:'."""
    pytest.importorskip("yaml")
    text = ("# Genuine inference-perf lifecycle report (not hand-authored).\n#\n# the shape test's mix\n"
            "benchmark_time_seconds: 2.48\nfailures:\n  count: 0\n  request_latency: null\n"
            "load_summary:\n  count: 3\n  send_duration: 2.0\n"
            "successes:\n  count: 3\n  latency:\n    request_latency:\n      mean: 0.49\n      median: 0.49\n"
            "    time_to_first_token:\n      mean: 0.0333\n  throughput:\n    requests_per_sec: 1.2\n")
    s, _ = _read(_write(tmp_path / "inference_perf_lifecycle.yaml", text))
    assert s.kind == "inference-perf"
    assert s.values == pytest.approx({"ttft_ms.mean": 33.3, "e2e_ms.mean": 490.0, "e2e_ms.p50": 490.0,
                                      "request_throughput_rps": 1.2})
    # a scrape that begins with a comment is still one
    s, _ = _read(_write(tmp_path / "m.prom", "# scraped after the run\n" + "\n".join([
        'vllm:e2e_request_latency_seconds_bucket{le="1"} 2', 'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 2',
        "vllm:e2e_request_latency_seconds_sum 1.0", "vllm:e2e_request_latency_seconds_count 2"]) + "\n"))
    assert s.values["e2e_ms.mean"] == 500.0


LFS = ("version https://git-lfs.github.com/spec/v1\n"
       "oid sha256:4bb3783693d0a435686fbfc885615d2349bd067239079fa4b749f2e679e12122\nsize 52283111\n")


def test_a_git_lfs_pointer_is_named_as_such(tmp_path):
    """BurstGPT_1.csv in a clone without git lfs: 'no column Timestamp; the header has version
    https://git-lfs.github.com/spec/v1'."""
    trace = _write(tmp_path / "BurstGPT_1.csv", LFS)
    with pytest.raises(WorkloadError, match=r"BurstGPT_1.csv: this is a Git LFS pointer, not the data: run git lfs"):
        load_burstgpt(trace)
    with pytest.raises(WorkloadError, match="Git LFS pointer"):
        read_records(trace, {"timestamp": ("TIMESTAMP",)}, required=("timestamp",), reader="python")
    with pytest.raises(WorkloadError, match="report.json: this is a Git LFS pointer"):
        read_json_file(_write(tmp_path / "report.json", LFS))
    with pytest.raises(ConfigError, match=r"bench.json: this is a Git LFS pointer, not the data: run git lfs pull"):
        read_summary(_write(tmp_path / "bench.json", LFS))
