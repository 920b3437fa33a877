"""Target files as the real tools write them (schedlab/targets.py): OpenMetrics exemplars, label
sets with different buckets, byte-order marks and UTF-16, vllm bench serve --append-result,
guidellm's YAML report, inference-perf's server-side summary, runs every request of which failed,
non-streaming runs and vLLM v0.3's ``request_inthroughput``. Every expectation is worked out by
hand from the file written."""

import gzip
import json
import warnings
import math
import re
import sys

import pytest

from schedlab.errors import ConfigError
from schedlab.targets import TargetConfig, TargetWarning, read_summary


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


# --- Prometheus: exemplars and label values ------------------------------------------------------

TTFT = "vllm:time_to_first_token_seconds"


def _ttft_scrape(labels: str = 'model_name="m"', exemplar: str = "") -> str:
    """TTFT of 50 requests: 30 in (20, 40] ms, 15 in (40, 60], 5 in (60, 100]; 2.1 s in all."""
    rows = [f'{TTFT}_bucket{{{labels},le="0.02"}} 0',
            f'{TTFT}_bucket{{{labels},le="0.04"}} 30.0{exemplar}',
            f'{TTFT}_bucket{{{labels},le="0.06"}} 45',
            f'{TTFT}_bucket{{{labels},le="0.1"}} 50',
            f'{TTFT}_bucket{{{labels},le="+Inf"}} 50',
            f"{TTFT}_count{{{labels}}} 50",
            f"{TTFT}_sum{{{labels}}} 2.1"]
    return "# TYPE vllm:time_to_first_token_seconds histogram\n" + "\n".join(rows) + "\n# EOF\n"


#: by hand: mean 2.1 s / 50 = 42 ms; p50: rank 25 in (20, 40] holding 30: 20 + 20 * 25/30; p90: rank
#: 45 in (40, 60] holding 15 (30 below): 40 + 20 * 15/15; p99: rank 49.5 in (60, 100] holding 5: 60 + 40 * 4.5/5
TTFT_VALUES = {"ttft_ms.mean": 42.0, "ttft_ms.p50": 20.0 + 20.0 * 25 / 30, "ttft_ms.p90": 60.0, "ttft_ms.p99": 96.0}


def test_an_openmetrics_exemplar_is_no_part_of_the_sample(tmp_path):
    """The exemplar's labels are not the sample's, and its 0.035 is not the bucket's count."""
    plain = read_summary(_write(tmp_path / "plain.prom", _ttft_scrape()))
    assert plain.values == pytest.approx(TTFT_VALUES)
    exemplar = ' # {trace_id="KOO5S4vxi0o"} 0.035 1.7301234e+09'
    s = read_summary(_write(tmp_path / "ex.prom", _ttft_scrape(exemplar=exemplar)))
    assert s.values == pytest.approx(TTFT_VALUES)
    assert s.histograms["ttft_ms"].counts == (0.0, 30.0, 45.0, 50.0, 50.0)
    # an exemplar without its timestamp, one whose label value holds "}", and a sample's timestamp
    for tail in (' # {trace_id="abc"} 0.035', ' # {span="a}b"} 0.035 1.7e9', " 1730123456789"):
        s = read_summary(_write(tmp_path / "t.prom", _ttft_scrape(exemplar=tail)))
        assert s.values == pytest.approx(TTFT_VALUES), tail


def test_a_label_value_may_hold_a_hash_a_brace_and_escaped_quotes(tmp_path):
    labels = r'model_name="a}b # {x=\"y\"} 7",engine="0"'
    s = read_summary(_write(tmp_path / "l.prom", _ttft_scrape(labels=labels)))
    assert s.values == pytest.approx(TTFT_VALUES)
    s = read_summary(_write(tmp_path / "l.prom", _ttft_scrape(labels=labels, exemplar=' # {t="#}"} 0.9 1')))
    assert s.values == pytest.approx(TTFT_VALUES)
    with pytest.raises(ConfigError, match=r"line 2: not a Prometheus sample"):   # a label value never closed
        read_summary(_write(tmp_path / "bad.prom", _ttft_scrape(labels='model_name="m') + ""))


def test_prometheus_3s_quoted_names_are_read_as_the_plain_ones(tmp_path):
    """Prometheus 3's text format with UTF-8 names quotes the name inside the braces (label names
    may be quoted too): ``{"vllm:...bucket", le="0.04"} 30``. It was refused as not a sample."""
    quoted = re.sub(r"^(vllm:\w+)\{", r'{"\1", ', _ttft_scrape(), flags=re.M).replace('model_name=', '"model_name"=')
    assert '{"vllm:time_to_first_token_seconds_bucket", "model_name"="m",le="0.02"} 0' in quoted
    s = read_summary(_write(tmp_path / "q.prom", quoted))
    assert s.kind == "vLLM /metrics" and s.values == pytest.approx(TTFT_VALUES)
    bare = "\n".join(line for line in quoted.splitlines() if not line.startswith("#"))   # no # TYPE line to go by
    assert read_summary(_write(tmp_path / "bare.prom", bare)).values == pytest.approx(TTFT_VALUES)
    with pytest.raises(ConfigError, match=r"line 2: not a Prometheus sample"):   # a quoted name never closed
        read_summary(_write(tmp_path / "bad.prom", quoted.replace('_bucket", "model', '_bucket "model', 1)))


# --- Prometheus: label sets with different buckets ------------------------------------------------

E2E = "vllm:e2e_request_latency_seconds"


def _series(instance: str, buckets: dict[str, float], total: float) -> list[str]:
    rows = [f'{E2E}_bucket{{instance="{instance}",le="{le}"}} {count}' for le, count in buckets.items()]
    return rows + [f'{E2E}_count{{instance="{instance}"}} {buckets["+Inf"]}',
                   f'{E2E}_sum{{instance="{instance}"}} {total}']


def test_label_sets_with_different_buckets_are_summed_where_each_count_is_known(tmp_path):
    """Pod a (older vLLM) has no 20 s and 40 s buckets, but nothing above 10 s (60 at 10 s and at
    +Inf): its count at 20 and 40 is 60. Summed: 10 s: 40 at 0.04, 70 at 0.1, 90 at 10, 100 at 20,
    110 at 40 and +Inf."""
    scrape = _series("a", {"0.04": 30, "0.1": 50, "10.0": 60, "+Inf": 60}, 3.0) + \
        _series("b", {"0.04": 10, "0.1": 20, "10.0": 30, "20.0": 40, "40.0": 50, "+Inf": 50}, 600.0)
    s = read_summary(_write(tmp_path / "fed.prom", "\n".join(scrape) + "\n"))
    hist = s.histograms["e2e_ms"]
    assert hist.bounds == (40.0, 100.0, 10000.0, 20000.0, 40000.0, math.inf)
    assert hist.counts == (40.0, 70.0, 90.0, 100.0, 110.0, 110.0)
    # mean 603 s / 110; p50: rank 55 in (40, 100] ms holding 30 (40 below): 40 + 60 * 15/30 = 70;
    # p90: rank 99 in (10, 20] s holding 10 (90 below): 10000 + 10000 * 9/10; p99: rank 108.9 in (20, 40] s
    assert s.values == pytest.approx({"e2e_ms.mean": 603e3 / 110, "e2e_ms.p50": 70.0, "e2e_ms.p90": 19000.0,
                                      "e2e_ms.p99": 20000.0 + 20000.0 * 8.9 / 10})
    assert s.requests == 110


def test_a_scrape_of_several_models_is_summed_with_a_warning(tmp_path):
    """A gateway's or a federation's scrape holds several servers' histograms (model_name llama
    and qwen): summed as before, but said -- one server serves one model, and one distribution of
    two models' requests is neither's. One model's pods (instance a, b) are summed silently."""
    two = _ttft_scrape('model_name="llama"').replace("# EOF\n", "") + _ttft_scrape('model_name="qwen"')
    with pytest.warns(TargetWarning, match=r"two\.prom: its histograms hold 2 models \(model_name llama, qwen\), "
                                           r"summed as one server's requests"):
        s = read_summary(_write(tmp_path / "two.prom", two))
    assert s.histograms["ttft_ms"].counts[-1] == 100
    pods = _ttft_scrape('model_name="m",instance="a"').replace("# EOF\n", "") + \
        _ttft_scrape('model_name="m",instance="b"')
    with warnings.catch_warnings():
        warnings.simplefilter("error", TargetWarning)
        assert read_summary(_write(tmp_path / "pods.prom", pods)).histograms["ttft_ms"].counts[-1] == 100


def test_a_baseline_of_another_servers_series_is_refused(tmp_path):
    """Before and after are differenced as sums over their series: a baseline scraped from another
    server (model_name mistral against llama, the same counts) took this one's every request off
    and said "none ... has an observation since the baseline". The same server's is read."""
    after = _write(tmp_path / "after.prom", _ttft_scrape('model_name="llama"'))
    with pytest.raises(ConfigError) as info:
        read_summary(after, baseline=_write(tmp_path / "other.prom", _ttft_scrape('model_name="mistral"')))
    assert str(info.value) == (f"--target-baseline {tmp_path / 'other.prom'}: {TTFT}: the baseline's series {{model_name=mistral}} is "
                               "not in the target's scrape (its series: {model_name=llama}): scrape the same server "
                               "before and after")
    empty = _ttft_scrape('model_name="llama"').replace(" 30.0\n", " 0\n").replace(" 45\n", " 0\n")
    empty = empty.replace(" 50\n", " 0\n").replace(" 2.1\n", " 0\n")
    s = read_summary(after, baseline=_write(tmp_path / "before.prom", empty))
    assert s.values == pytest.approx(TTFT_VALUES)


def test_a_bound_some_label_set_cannot_count_is_left_out_and_no_baseline_is_named(tmp_path):
    """Pod a has 3 observations between 10 s and +Inf: its count at 20 s is unknown, so 20 s is
    left out; 10 s (5 + 2) and +Inf (8 + 4) stay. p50: rank 6 in (0, 10] s holding 7."""
    scrape = _series("a", {"10.0": 5, "+Inf": 8}, 100.0) + _series("b", {"10.0": 2, "20.0": 4, "+Inf": 4}, 50.0)
    s = read_summary(_write(tmp_path / "fed.prom", "\n".join(scrape) + "\n"))
    assert s.histograms["e2e_ms"].bounds == (10000.0, math.inf)
    assert s.histograms["e2e_ms"].counts == (7.0, 12.0)
    assert s.values["e2e_ms.p50"] == pytest.approx(10000.0 * 6 / 7)
    assert s.values["e2e_ms.mean"] == pytest.approx(150e3 / 12)
    # with a baseline that kept 20 s (pod a had nothing above 10 s then): the bounds both hold, 10 s and +Inf
    before = _series("a", {"10.0": 1, "+Inf": 1}, 2.0) + _series("b", {"10.0": 1, "20.0": 1, "+Inf": 1}, 3.0)
    s = read_summary(tmp_path / "fed.prom", baseline=_write(tmp_path / "before.prom", "\n".join(before) + "\n"))
    assert s.histograms["e2e_ms"].bounds == (10000.0, math.inf)
    assert s.histograms["e2e_ms"].counts == (5.0, 10.0)
    assert s.values["e2e_ms.mean"] == pytest.approx(145e3 / 10)


# --- text encodings -------------------------------------------------------------------------------

BENCH = {"completed": 50, "failed": 0, "request_throughput": 4.0, "output_throughput": 128.0,
         "mean_ttft_ms": 45.1, "median_ttft_ms": 40.2, "p99_ttft_ms": 90.3, "mean_e2el_ms": 400.0}
BENCH_VALUES = {"ttft_ms.mean": 45.1, "ttft_ms.p50": 40.2, "ttft_ms.p99": 90.3, "e2e_ms.mean": 400.0,
                "request_throughput_rps": 4.0, "output_throughput_tps": 128.0}


def test_a_byte_order_mark_and_crlf_are_read(tmp_path):
    text = json.dumps(BENCH, indent=2).replace("\n", "\r\n")
    s = read_summary(_write(tmp_path / "b.json", b"\xef\xbb\xbf" + text.encode()))
    assert s.values == BENCH_VALUES
    s = read_summary(_write(tmp_path / "m.prom", b"\xef\xbb\xbf" + _ttft_scrape().replace("\n", "\r\n").encode()))
    assert s.values == pytest.approx(TTFT_VALUES)


def test_utf16_and_other_non_utf8_text_are_named(tmp_path):
    path = _write(tmp_path / "m.prom", _ttft_scrape().encode("utf-16"))   # a BOM FF FE, as PowerShell 5's >
    assert path.read_bytes()[:2] == b"\xff\xfe"
    with pytest.raises(ConfigError) as info:
        read_summary(path)
    assert str(info.value) == (f"--target {path}: not UTF-8 text (it looks like UTF-16, e.g. from PowerShell's >: "
                               f"save it as UTF-8, e.g. with Out-File -Encoding utf8)")
    path = _write(tmp_path / "b.json", b'{"mean_ttft_ms": 1, "label": "caf\xe9"}')
    with pytest.raises(ConfigError) as info:
        read_summary(path)
    assert str(info.value) == f"--target {path}: not UTF-8 text (byte 0xe9 at offset 33): save it as UTF-8"
    after = _write(tmp_path / "after.prom", _ttft_scrape())
    for name, raw in (("be.prom", b"\xfe\xff" + _ttft_scrape().encode("utf-16-be")),   # a BOM FE FF
                      ("nobom.prom", _ttft_scrape().encode("utf-16-le"))):             # no BOM: NUL every other byte
        with pytest.raises(ConfigError, match=rf"^--target-baseline .*{name}: not UTF-8 text \(it looks like UTF-16"):
            read_summary(after, baseline=_write(tmp_path / name, raw))
    with pytest.raises(ConfigError, match=r"^--target .*b.json.gz: gzip-compressed: decompress it first \(gunzip\)$"):
        read_summary(_write(tmp_path / "b.json.gz", gzip.compress(json.dumps(BENCH).encode())))


def test_a_bench_files_median_and_p50_are_one_statistic(tmp_path):
    """--metric-percentiles 50 writes p50_ttft_ms beside median_ttft_ms, both numpy's median of one
    list: equal, they are read once; unequal (an edited file), the later one silently won."""
    same = read_summary(_write(tmp_path / "same.json", {**BENCH, "p50_ttft_ms": 40.2}))
    assert same.values == BENCH_VALUES
    path = _write(tmp_path / "edited.json", {**BENCH, "p50_ttft_ms": 42.0})
    with pytest.raises(ConfigError) as info:
        read_summary(path)
    assert str(info.value) == (f"--target {path}: median_ttft_ms (40.2) and p50_ttft_ms (42) are the same statistic but "
                               f"disagree: is the file edited, or two runs' joined?")


def test_a_key_given_twice_in_one_object_is_said(tmp_path):
    """json keeps the last value of a key given twice, silently: an edited or joined file."""
    text = json.dumps(BENCH)[:-1] + ', "mean_ttft_ms": 99.0, "p99_ttft_ms": 120.0}'
    with pytest.warns(TargetWarning, match=r"dup.json: mean_ttft_ms, p99_ttft_ms given twice in one object: the "
                                           r"last value is read"):
        assert read_summary(_write(tmp_path / "dup.json", text)).values["ttft_ms.mean"] == 99.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", TargetWarning)
        assert read_summary(_write(tmp_path / "once.json", BENCH)).values == BENCH_VALUES


# --- several JSON documents: vllm bench serve --append-result -------------------------------------


def test_a_file_of_appended_runs_reads_the_last_or_the_one_index_names(tmp_path):
    first, second = {**BENCH, "mean_ttft_ms": 45.1}, {**BENCH, "mean_ttft_ms": 99.0}
    path = _write(tmp_path / "b.json", json.dumps(first) + "\n" + json.dumps(second) + "\n")   # serve.py's "\n" + json
    s = read_summary(path)
    assert s.values["ttft_ms.mean"] == 99.0 and s.source == f"{path} (document 1 of 2)"
    assert read_summary(path, index=0).values["ttft_ms.mean"] == 45.1
    assert TargetConfig(path=str(path), index=0).read().values["ttft_ms.mean"] == 45.1
    assert TargetConfig(path=str(path)).read().values["ttft_ms.mean"] == 99.0
    with pytest.raises(ConfigError) as info:
        read_summary(path, index=2)
    assert str(info.value) == (f"--target-index 2: {path} holds 2 JSON documents (runs appended to one file, as by "
                               f"vllm bench serve --append-result): 0..1")
    with pytest.raises(ConfigError, match=r"^index 5: .* holds 2 JSON documents"):
        TargetConfig(path=str(path), index=5).read()
    # one document: index is refused, as before, for anything but a guidellm report
    with pytest.raises(ConfigError, match=r"--target-index 0: only a guidellm report holds several benchmarks"):
        read_summary(_write(tmp_path / "one.json", first), index=0)
    with pytest.raises(ConfigError) as info:
        read_summary(_write(tmp_path / "bad.json", json.dumps(first) + "\n{oops"))
    assert str(info.value) == (f"--target {tmp_path / 'bad.json'}: not JSON (document 2: Expecting "
                               f"property name enclosed in double quotes: line 2 column 2); the 1 document(s) "
                               f"before it are whole: --target-index 0..0 reads one")
    # a file cut short says where it stops (it ended at "at")
    with pytest.raises(ConfigError) as info:
        read_summary(_write(tmp_path / "cut.json", '{"model_id": "lla'))
    assert str(info.value).endswith(": neither JSON (Unterminated string starting at: line 1 column 14) nor a "
                                    "Prometheus scrape")


def test_the_whole_runs_before_one_cut_short_are_read_when_index_picks_one(tmp_path):
    """A run killed while --append-result wrote its result leaves the runs before it readable."""
    runs = [{**BENCH, "mean_ttft_ms": 45.1}, {**BENCH, "mean_ttft_ms": 99.0}]
    cut = json.dumps({**BENCH, "mean_ttft_ms": 7.0})[:40]
    path = _write(tmp_path / "b.json", "\n".join(json.dumps(run) for run in runs) + "\n" + cut)
    for index, ttft in ((0, 45.1), (1, 99.0)):
        with pytest.warns(TargetWarning, match=rf"b.json: document 3 is not JSON \(Unterminated string .*: a run "
                                               rf"cut short\?\); reading document index {index}, one of the 2 before"):
            assert read_summary(path, index=index).values["ttft_ms.mean"] == ttft
    for index in (None, 2):   # the last (the default) and the broken one itself are not there to read
        with pytest.raises(ConfigError, match=r"not JSON \(document 3: .*\); the 2 document\(s\) before it are "
                                              r"whole: --target-index 0..1 reads one$"):
            read_summary(path, index=index)


@pytest.mark.parametrize("text, reason", [("[" * 100_000 + "]" * 100_000, "lists or objects nested too deeply to read"),
                                          ('{"mean_ttft_ms": 1' + "0" * 5000 + "}",
                                           "a number too long to read (more than 4300 digits)")])
def test_json_that_python_cannot_read_is_one_line_not_a_traceback(tmp_path, text, reason):
    """json raises RecursionError or ValueError for these, not a JSONDecodeError: a traceback before."""
    with pytest.raises(ConfigError) as info:
        read_summary(_write(tmp_path / "odd.json", text))
    assert str(info.value) == f"--target {tmp_path / 'odd.json'}: neither JSON ({reason}) nor a Prometheus scrape"


# --- guidellm's YAML report -----------------------------------------------------------------------

GUIDELLM_YAML = """\
benchmarks:
- metrics:
    time_to_first_token_ms:
      successful:
        mean: 40.0
        median: 38.0
        percentiles: {p90: 52.0}
    request_latency:
      successful: {count: 100, mean: 1.2}
"""


def test_a_yaml_report_is_refused_without_pyyaml(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)   # import yaml raises ImportError
    path = _write(tmp_path / "report.yaml", GUIDELLM_YAML)
    with pytest.raises(ConfigError) as info:
        read_summary(path)
    assert str(info.value) == (f"--target {path}: a YAML file; schedlab reads guidellm's JSON report (PyYAML is not "
                               f"installed): write it with --output-path report.json")
    # recognised by its content too, whatever its name
    with pytest.raises(ConfigError, match=r"a YAML file; schedlab reads guidellm's JSON report"):
        read_summary(_write(tmp_path / "report.txt", GUIDELLM_YAML))


def test_a_yaml_report_is_read_with_pyyaml(tmp_path):
    pytest.importorskip("yaml")
    s = read_summary(_write(tmp_path / "report.yaml", GUIDELLM_YAML))
    assert s.kind == "guidellm" and s.requests == 100
    assert s.values == {"ttft_ms.mean": 40.0, "ttft_ms.p50": 38.0, "ttft_ms.p90": 52.0, "e2e_ms.mean": 1200.0}


# --- inference-perf's summary_prometheus_metrics.json ---------------------------------------------

SERVER = {"benchmark_time_seconds": 0.0, "load_summary": {}, "failures": {},
          "successes": {"count": 3600, "rate": 60.0, "prompt_len": {"mean": 200.0, "rate": 12000.0},
                        "output_len": {"mean": 64.0, "rate": 3840.0},
                        "request_latency": {"mean": 0.9, "median": 0.81, "p90": 1.35, "p99": 1.8},
                        "time_to_first_token": {"mean": 0.03, "median": 0.027, "p90": 0.045, "p99": 0.06},
                        "time_per_output_token": {"mean": 0.0, "median": 0.0, "p90": 0.0, "p99": 0.0},
                        "inter_token_latency": {"mean": 0.012, "median": 0.0108, "p90": 0.018, "p99": 0.024},
                        "request_queue_time": {"mean": 0.001, "median": 0.0009, "p90": 0.0015, "p99": 0.002},
                        "iteration_tokens": {"mean": 60.0, "median": 54.0, "p90": 90.0, "p99": 120.0},
                        "kv_cache_usage_percentage": {"mean": 0.2}, "request_success_count": 3600.0}}


def test_inference_perf_server_metrics_are_the_engines_view(tmp_path):
    """Seconds to ms; time_per_output_token all 0 (the server exposed none) left out; rates:
    requests 60/s, output 3840 tokens/s, total 12000 + 3840."""
    s = read_summary(_write(tmp_path / "summary_prometheus_metrics.json", SERVER))
    assert s.kind == "inference-perf server metrics" and s.view == "engine" and s.requests == 3600
    assert s.values == pytest.approx({
        "ttft_ms.mean": 30.0, "ttft_ms.p50": 27.0, "ttft_ms.p90": 45.0, "ttft_ms.p99": 60.0,
        "itl_ms.mean": 12.0, "itl_ms.p50": 10.8, "itl_ms.p90": 18.0, "itl_ms.p99": 24.0,
        "e2e_ms.mean": 900.0, "e2e_ms.p50": 810.0, "e2e_ms.p90": 1350.0, "e2e_ms.p99": 1800.0,
        "loop_queue_ms.mean": 1.0, "loop_queue_ms.p50": 0.9, "loop_queue_ms.p90": 1.5, "loop_queue_ms.p99": 2.0,
        "iteration_tokens.mean": 60.0, "iteration_tokens.p50": 54.0, "iteration_tokens.p90": 90.0,
        "iteration_tokens.p99": 120.0,
        "request_throughput_rps": 60.0, "output_throughput_tps": 3840.0, "total_throughput_tps": 15840.0})
    assert set(s.dropped) == {f"successes.time_per_output_token.{k}" for k in ("mean", "median", "p90", "p99")}
    # the client's summary_lifecycle_metrics.json stays the client's view
    client = read_summary(_write(tmp_path / "life.json", {"successes": {"count": 5, "latency": {
        "time_to_first_token": {"mean": 0.05}}}}))
    assert client.kind == "inference-perf" and client.view == "client" and client.values == {"ttft_ms.mean": 50.0}
    with pytest.raises(ConfigError, match=r"the server counted no finished request over the run \(successes.count "
                                          r"is 0\)"):
        read_summary(_write(tmp_path / "none.json", {**SERVER, "successes": {**SERVER["successes"], "count": 0}}))


@pytest.mark.parametrize("server, left_out", [
    ("tgi", {"tpot_ms", "output_throughput_tps", "total_throughput_tps"}),
    ("sglang", {"tpot_ms"}),
    ("vllm", set()),
])
def test_inference_perf_server_metrics_of_another_server_keep_only_its_statistics(tmp_path, server, left_out):
    """inference-perf's TGI client fills time_per_output_token with TGI's mean time per token
    (prefill included) and prompt_len / output_len rates with requests a second; its SGLang
    client time_per_output_token with a running mean: the config.yaml beside the run's stage
    folders (``server: type:``) says which server it was, and those are left out, named."""
    metrics = {**SERVER, "successes": {**SERVER["successes"],
                                       "time_per_output_token": {"mean": 0.031, "median": 0.03, "p90": 0.05,
                                                                 "p99": 0.06}}}
    stage = tmp_path / "stage"
    stage.mkdir()
    path = _write(stage / "summary_prometheus_metrics.json", metrics)
    (tmp_path / "config.yaml").write_text(f"load:\n  type: constant\nserver:\n  base_url: http://x:8000\n"
                                          f"  type: {server}  # the model server\ntokenizer:\n  type: x\n")
    s = read_summary(path)
    # (vLLM's and SGLang's queue time from when the engine loop took the request; TGI's from its arrival)
    queue = "queue_ms" if server == "tgi" else "loop_queue_ms"
    everything = {"ttft_ms", "itl_ms", "e2e_ms", queue, "iteration_tokens", "tpot_ms", "request_throughput_rps",
                  "output_throughput_tps", "total_throughput_tps"}
    assert {name.partition(".")[0] for name in s.values} == everything - left_out
    if "tpot_ms" in left_out:
        assert "not this statistic on a" in s.dropped["successes.time_per_output_token"]
    else:
        assert s.values["tpot_ms.mean"] == pytest.approx(31.0)
    if server == "tgi":
        assert s.dropped["successes.output_len.rate"] == "requests, not tokens, a second on a tgi server"
    # no config.yaml: inference-perf's default server, vLLM
    (tmp_path / "config.yaml").unlink()
    assert read_summary(path).values["tpot_ms.mean"] == pytest.approx(31.0)


# --- runs that cannot be compared -----------------------------------------------------------------


def test_a_run_whose_every_request_failed_is_refused(tmp_path):
    failed = {"load_summary": {"count": 10}, "failures": {"count": 10, "request_latency": {"mean": 0.1}},
              "successes": {"count": 0, "latency": {"request_latency": None, "time_to_first_token": None},
                            "throughput": {"requests_per_sec": 0.0, "output_tokens_per_sec": 0.0}}}
    path = _write(tmp_path / "ip.json", failed)
    with pytest.raises(ConfigError) as info:
        read_summary(path)
    assert str(info.value) == (f"--target {path}: every request of the run failed (successes.count is 0, "
                               f"failures.count is 10): it has no statistic to compare with")
    path = _write(tmp_path / "b.json", {**BENCH, "completed": 0, "failed": 50, "mean_ttft_ms": 0.0})
    with pytest.raises(ConfigError) as info:
        read_summary(path)
    assert str(info.value) == (f"--target {path}: every request of the run failed (completed is 0, failed is 50): it "
                               f"has no statistic to compare with")
    path = _write(tmp_path / "empty.json", {**BENCH, "completed": 0, "failed": 0, "mean_ttft_ms": 0.0})
    with pytest.raises(ConfigError) as info:   # nothing failed: "every request failed" would mislead
        read_summary(path)
    assert str(info.value) == (f"--target {path}: no request of the run completed (completed is 0, failed is 0: an "
                               f"empty run?): it has no statistic to compare with")


def test_a_non_streaming_run_keeps_only_its_latency_and_rates(tmp_path):
    """Every TTFT 0: the client saw the whole response at once; its TPOT is E2E / (tokens - 1)."""
    nonstream = {**BENCH, "mean_ttft_ms": 0.0, "median_ttft_ms": 0.0, "p99_ttft_ms": 0.0, "mean_tpot_ms": 12.5,
                 "mean_itl_ms": 0.0}
    path = _write(tmp_path / "b.json", nonstream)
    with pytest.warns(TargetWarning) as caught:
        s = read_summary(path)
    assert s.values == {"e2e_ms.mean": 400.0, "request_throughput_rps": 4.0, "output_throughput_tps": 128.0}
    assert s.dropped == {k: "of a non-streaming run" for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                                                               "mean_tpot_ms", "mean_itl_ms")}
    assert len(caught) == 1 and str(caught[0].message) == (
        f"--target {path}: every TTFT statistic is 0, as of a non-streaming run: its 5 TTFT, TPOT and ITL statistics "
        f"are left out, the other 3 compared")
    # a TTFT that is not 0 throughout is a streamed run's: kept, 0 and all
    s = read_summary(_write(tmp_path / "s.json", {**nonstream, "median_ttft_ms": 3.0, "p99_ttft_ms": 3.0}))
    assert s.values["ttft_ms.mean"] == 0.0 and s.values["tpot_ms.mean"] == 12.5


def test_vllm_v03s_request_inthroughput_is_the_request_throughput(tmp_path):
    old = {"completed": 50, "mean_ttft_ms": 45.1, "output_throughput": 128.0, "request_inthroughput": 4.0}
    s = read_summary(_write(tmp_path / "v03.json", old))
    assert s.values == {"ttft_ms.mean": 45.1, "request_throughput_rps": 4.0, "output_throughput_tps": 128.0}
    s = read_summary(_write(tmp_path / "both.json", {**old, "request_throughput": 5.0}))
    assert s.values["request_throughput_rps"] == 5.0
    with pytest.raises(ConfigError, match=r"v03.json: request_inthroughput: must be a number, got 'x'"):
        read_summary(_write(tmp_path / "v03.json", {**old, "request_inthroughput": "x"}))


def test_a_per_request_vllm_log_given_as_a_target_says_where_it_goes(tmp_path):
    """It was refused as 'document 19 of 20: not a vllm bench serve result, ...' (its lines read as
    appended runs): it is a workload, which each run is compared with."""
    rows = [{"request_id": f"r{i}", "input_toks": 10, "output_toks": 5, "arrival_time": 1.0 + i,
             "queued_ts": 10.0 + i, "scheduled_ts": 10.0 + i, "first_token_ts": 10.1 + i, "last_token_ts": 10.5 + i}
            for i in range(3)]
    path = _write(tmp_path / "log.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ConfigError) as info:
        read_summary(path)
    assert str(info.value) == (f"--target {path}: a per-request vLLM log (a request a line, with first_token_ts, "
                               "queued_ts, scheduled_ts), not a summary of a run: replay it as the workload "
                               "([workload] kind = \"vllm_log\"), and each run is compared with it")
