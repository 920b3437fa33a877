"""Metrics: run-length ITL percentiles equal numpy's on the expanded samples; SLO and goodput."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.results.metrics import PERCENTILES, compute_metrics, run_quantiles, summarize

runs = st.lists(
    st.tuples(st.floats(0.5, 100.0, allow_nan=False), st.sampled_from([0.0, 0.0, 0.25, 0.013, 1.7]),
              st.integers(1, 40), st.integers(1, 5)),
    min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(runs)
def test_run_quantiles_equal_numpy_on_the_expanded_samples(data):
    first, inc, count, weight = (np.array(x) for x in zip(*data))
    samples = np.concatenate([np.repeat(f + d * np.arange(c), w) for f, d, c, w in data])
    got = run_quantiles(first, inc, count, weight)
    want = summarize(samples)
    for key in ["mean", "max"] + [f"p{p}" for p in PERCENTILES]:
        assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-9), key


def test_run_quantiles_count_each_run_a_few_times_not_once_per_bisection_step(monkeypatch):
    """The bisection for an order statistic takes up to 80 steps; the runs wholly below or above
    its bracket are set aside as it shrinks, so the runs counted over all steps stay a few
    passes over the runs per statistic (every run at every step would be 80)."""
    from schedlab.results import metrics

    rng = np.random.default_rng(2)
    n = 20_000
    first, inc = rng.uniform(5, 60, n), rng.uniform(0, 0.05, n)
    count, weight = rng.integers(1, 200, n), np.ones(n, dtype=np.int64)
    counted = []
    real = metrics.counts_at_most
    monkeypatch.setattr(metrics, "counts_at_most",
                        lambda f, d, c, w, v: counted.append(f.size * np.size(v)) or real(f, d, c, w, v))
    got = run_quantiles(first, inc, count, weight, (50, 99))
    statistics = 4  # the two samples around each percentile
    assert sum(counted) < 8 * n * statistics
    samples = np.concatenate([f + d * np.arange(c) for f, d, c in zip(first, inc, count)])
    assert got["p50"] == pytest.approx(np.percentile(samples, 50), rel=1e-12)
    assert got["p99"] == pytest.approx(np.percentile(samples, 99), rel=1e-12)


def test_run_quantiles_by_hand():
    # samples: 8 x 2 (one run of weight 2), then 10, 11, 12 (a run with increment 1)
    got = run_quantiles([8.0, 10.0], [0.0, 1.0], [1, 3], [2, 1])
    assert got["p50"] == 10.0          # sorted 8, 8, 10, 11, 12: the middle one
    assert got["max"] == 12.0
    assert got["mean"] == pytest.approx(49 / 5)
    assert got["p90"] == pytest.approx(11.6)   # numpy linear: 11 + 0.6 * (12 - 11)


def _requests(arrival, first, finish, generated, klass, rejected=None):
    n = len(arrival)
    z = np.zeros(n, dtype=np.int64)
    return {
        "id": np.arange(n), "arrival_ms": np.array(arrival, float), "first_scheduled_ms": np.array(arrival, float),
        "first_token_ms": np.array(first, float), "finish_ms": np.array(finish, float), "waiting_ms": np.zeros(n),
        "instance": z, "prompt_tokens": z + 10, "output_tokens": np.array(generated), "max_tokens": np.array(generated),
        "generated_tokens": np.array(generated), "priority": z, "preemptions": z, "recomputed_tokens": z,
        "prefill_chunks": z + 1, "cached_tokens": z, "swaps": z,
        "rejected": np.array(rejected if rejected is not None else [0] * n),
        "request_class": np.array(klass, dtype=object), "client": np.array(["c"] * n, dtype=object),
    }


def test_slo_attainment_goodput_and_per_class_sums():
    # Four requests over 1 s. TTFT targets: interactive 100 ms, batch 1000 ms; TPOT 50 ms for all.
    # r0 interactive: ttft 50, tpot (450-50)/8 = 50      -> meets both
    # r1 interactive: ttft 150                             -> misses TTFT
    # r2 batch: ttft 500, tpot (1000-500)/5 = 100          -> misses TPOT
    # r3 batch: ttft 600, tpot (900-600)/10 = 30           -> meets both
    req = _requests([0, 0, 0, 0], [50, 150, 500, 600], [450, 400, 1000, 900], [9, 6, 6, 11],
                    ["interactive", "interactive", "batch", "batch"])
    counters = {k: 0 for k in ("iterations", "running_seq_ms", "peak_running", "peak_waiting", "kv_block_ms",
                               "kv_peak_blocks", "kv_above_ms", "num_preemptions", "recompute_preemptions",
                               "in_flight_preemptions", "swap_preemptions", "recomputed_tokens", "swap_failures", "swap_out_blocks",
                               "swap_in_blocks", "swap_transfer_ms", "prefix_queries", "prefix_hits", "busy_ms",
                               "prefill_iteration_ms", "decode_only_ms")}
    itl = {"first": np.zeros(0), "inc": np.zeros(0), "count": np.zeros(0, np.int64), "weight": np.zeros(0, np.int64)}
    slo = {"ttft_ms": 1000.0, "tpot_ms": 50.0, "classes": {"interactive": {"ttft_ms": 100.0}}}
    m = compute_metrics(req, counters, itl, {"slo": slo, "num_blocks": 10})
    assert m["slo"] == {"attainment": 0.5, "goodput_rps": 2.0, "met": 2}
    per = m["per_class"]
    assert per["interactive"]["slo"]["met"] == 1 and per["batch"]["slo"]["met"] == 1
    assert per["interactive"]["requests"] + per["batch"]["requests"] == m["requests"]
    assert per["interactive"]["generated_tokens"] + per["batch"]["generated_tokens"] == m["generated_tokens"]
    assert per["interactive"]["throughput_tps"] + per["batch"]["throughput_tps"] == pytest.approx(m["throughput_tps"])


@pytest.mark.parametrize("classes, expected", [(("default", "default"), None),
                                               (("chat", "chat"), ["chat"]),
                                               (("chat", "batch"), ["batch", "chat"])])
def test_per_class_metrics_for_several_classes_or_one_the_workload_named(tmp_path, classes, expected):
    """A run of one named class (a baseline of interactive requests alone) had no per_class metrics,
    so its column in a table beside the mixed runs was empty."""
    from schedlab.study.experiment import load, run_experiment

    requests = ", ".join(f'{{prompt_tokens = 10, output_tokens = 3, arrival_ms = {i}.0, request_class = "{c}"}}'
                         for i, c in enumerate(classes))
    path = tmp_path / "one.toml"
    path.write_text(f'[experiment]\nname = "one"\n[workload]\nkind = "inline"\nrequests = [{requests}]\n')
    metrics = run_experiment(load(path)).all_runs()[0].metrics
    assert (sorted(metrics["per_class"]) if "per_class" in metrics else None) == expected
    if expected:
        assert sum(metrics["per_class"][c]["finished"] for c in expected) == metrics["finished"] == 2


@settings(max_examples=300, deadline=None)
@given(runs, st.lists(st.one_of(st.floats(-10.0, 200.0, allow_nan=False),
                                st.sampled_from([np.inf, -np.inf, 1e300, -1e300, 1e19])), min_size=1, max_size=6))
def test_counts_at_most_equal_the_expanded_samples_at_any_bound(data, bounds):
    """How many ITLs lie at or below each bound, as a /metrics histogram's buckets count them --
    including its last bound, +Inf, which must count every sample (it once wrapped to 0 in int64)."""
    from schedlab.results.metrics import counts_at_most

    first, inc, count, weight = (np.array(x) for x in zip(*data))
    samples = np.concatenate([np.repeat(f + d * np.arange(c), w) for f, d, c, w in data])
    got = counts_at_most(first, inc, count, weight, np.array(bounds, float))
    assert list(got) == [int((samples <= b).sum()) for b in bounds]


def test_counts_at_most_by_hand_with_an_infinite_last_bucket():
    # 100 ITLs rising from 10 ms by 0.5 (10 .. 59.5) and 50 of 12 ms: 150 in all
    got = counts_at_most_of([10.0, 12.0], [0.5, 0.0], [100, 50], [1, 1], [20.0, 100.0, np.inf])
    assert list(got) == [21 + 50, 150, 150]   # 10, 10.5, .., 20 (21 of them) and the 50 at 12


def counts_at_most_of(first, inc, count, weight, bounds):
    from schedlab.results.metrics import counts_at_most

    return counts_at_most(*(np.array(x) for x in (first, inc, count, weight)), np.array(bounds, float))


def test_slot_utilisation_counts_the_tokens_of_requests_whose_clients_left():
    """Metrics review s79: slot utilisation is tokens produced / (iterations x slots), but counted only completed
    requests' tokens -- a run whose clients time out read as idle slots (0.19 where its slots made 0.63). Two
    requests in two slots; the client of the second gives up at 15 ms, after it got some tokens."""
    from schedlab.frontend import ClientConfig, ClientSide, FrontendConfig
    from schedlab.model import Request
    from schedlab.testing import run_engine
    from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
    from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

    side = ClientSide(FrontendConfig(network_ms=0.0, request_ms=0.0, tokenize_ms_per_token=0.0, token_ms=0.0),
                      ClientConfig(classes={"late": {"timeout_ms": 15.0}}))
    requests = [Request(0, 0.0, 4, 3, request_class="chat"), Request(1, 0.0, 4, 10, request_class="late")]
    for engine in ("fast", "reference"):
        r = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=2)),
                       LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0)),
                       engine=engine, client_side=side)
        made = r.requests["generated_tokens"].tolist()
        assert r.requests["timed_out"].tolist() == [0, 1] and made[0] == 3 and made[1] >= 3
        assert r.metrics["generated_tokens"] == 3  # throughput counts the completed request's tokens only
        iterations = r.metrics["iterations"]
        assert r.metrics["slot_utilisation"] == pytest.approx(sum(made) / (iterations * 2))


def test_the_cost_split_charges_the_tokens_each_request_made():
    """Metrics review s79: the seed lab's cost split charged each request's output_tokens x the decode cost, though
    a max_tokens of 3 ended a 10-token answer at 3: 160 ms of decode for two requests that made 13 tokens (104)."""
    from schedlab.model import Request
    from schedlab.testing import run_engine
    from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
    from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

    requests = [Request(0, 0.0, 4, 10, max_tokens=3), Request(1, 0.0, 4, 10)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=2)),
                   LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)))
    assert r.requests["generated_tokens"].tolist() == [3, 10]
    assert r.metrics["cost"]["total_decode_ms"] == pytest.approx(13 * 8.0)
    assert r.metrics["cost"]["total_prefill_ms"] == pytest.approx(8 * 0.5)


def test_a_pool_autoscalers_busy_share_is_of_the_instances_it_had_on():
    """Metrics review s79 (left alone from the run-level fix): a pool of at most 4 instances with one on, busy
    throughout, read a busy share of 0.25. By hand: 100 ms on of 400 possible; busy 100 ms over that."""
    from schedlab.results.metrics import _pool_metrics, on_share

    meta = {"scaling": {"pools": {"decode": {"intervals": [(0, 0.0, 100.0)]}}},
            "pools": {"decode": {"instances": 4}, "prefill": {"instances": 2}}}
    assert on_share(meta, 0.0, 100.0, "decode") == pytest.approx(0.25)
    assert on_share(meta, 0.0, 100.0, "prefill") == 1.0          # a pool of fixed size beside it
    # the run: every pool's instances, the fixed pool's 2 on throughout: (100 + 2 x 100) ms of 6 x 100
    assert on_share(meta, 0.0, 100.0) == pytest.approx((100.0 + 2 * 100.0) / (6 * 100.0))
    pool = {"instances": 4, "gpus": 4, "iterations": 10, "busy_ms": 100.0, "kv_block_ms": 50.0, "num_blocks": 4,
            "kv_peak_share": 0.5}
    shares = _pool_metrics(pool, 100.0, 100.0, on_share(meta, 0.0, 100.0, "decode"), 0.25)
    assert shares["busy_share"] == pytest.approx(1.0)
    assert shares["kv_usage_mean"] == pytest.approx(50 / (4 * 100 * 0.25))


def test_a_run_whose_every_request_was_turned_away_serves_0_per_second(tmp_path):
    """Metrics review s79: every prompt beyond max_model_len, so rejected on arrival: no span at all, and the rates
    were null where nothing was served (vllm bench serve says 0)."""
    from schedlab.study.experiment import load, run_experiment

    (tmp_path / "e.toml").write_text(
        '[workload]\nkind = "synthetic"\nnum_requests = 3\nrate = 1.0\nprompt = {dist = "fixed", value = 900}\n'
        'output = {dist = "fixed", value = 5}\nrequest_class = "chat"\n[cost_model]\nkind = "linear"\n[slo]\n'
        'ttft_ms = 20\n[scheduler]\nkind = "continuous"\nmax_model_len = 500\n')
    (run,) = run_experiment(load(tmp_path / "e.toml")).all_runs()
    m = run.metrics
    assert m["rejected"] == 3 and m["makespan_ms"] == 0.0
    assert (m["throughput_tps"], m["request_throughput_rps"], m["slo"]["goodput_rps"]) == (0.0, 0.0, 0.0)
    assert m["slo"]["attainment"] == 0.0
    # a class's too (it read null beside the run's 0: review s80 client)
    assert m["per_class"]["chat"]["throughput_tps"] == 0.0 and m["per_class"]["chat"]["slo"]["goodput_rps"] == 0.0


def test_a_latency_exactly_at_its_target_meets_it_whatever_the_clocks_rounding(tmp_path):
    """A request every 1000/99 ms (not a binary fraction), each one 10 ms prefill on an idle server:
    every TTFT is 10 ms by construction, but first_token_ms - arrival_ms reads 10.000000000000028
    at some; against ttft_ms = 10 attainment was 0.987, and a search or plan constraint 'p99 <= 10'
    failed (review s81 fleet, finding 2). A constraint's '<' stays strict."""
    from schedlab.study.experiment import load, run_experiment
    from schedlab.study.search import parse_constraint

    path = tmp_path / "exact.toml"
    path.write_text(
        '[experiment]\nname = "exact"\nreports = []\n'
        '[workload]\nkind = "synthetic"\nnum_requests = 300\nprompt = {dist = "fixed", value = 100}\n'
        'output = {dist = "fixed", value = 1}\narrival = "constant"\nrate = 99.0\n'
        '[cost_model]\nkind = "linear"\nprefill_ms_per_token = 0.1\n'
        '[scheduler]\nkind = "continuous"\nmax_num_seqs = 1\n[slo]\nttft_ms = 10\n')
    run = run_experiment(load(path)).all_runs()[0]
    ttft = run.requests["first_token_ms"] - run.requests["arrival_ms"]
    assert (ttft != 10.0).any() and np.allclose(ttft, 10.0, rtol=0, atol=1e-9)  # (the rounding is there)
    assert run.metrics["slo"]["attainment"] == 1.0 and run.metrics["slo"]["met"] == 300
    assert parse_constraint("ttft_ms.p99 <= 10").holds(run.metrics)
    assert not parse_constraint("ttft_ms.p99 < 10").holds(run.metrics)
    assert not parse_constraint("ttft_ms.p99 <= 9.99999").holds(run.metrics)
    assert parse_constraint("ttft_ms.p99 >= 10").holds(run.metrics)


def test_a_class_that_made_nothing_has_zero_throughput_streamed_too(tmp_path, monkeypatch):
    """Every request is turned away (the prompts exceed the cache): the run has no span, and each
    class's throughput is 0 tokens/s -- an exact run said so, a streamed one (past exact_requests)
    said NaN (review s81 diffuzz, side note)."""
    from schedlab.study.experiment import load, run_experiment

    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    path = tmp_path / "mix.toml"
    path.write_text(
        '[experiment]\nname = "mix"\nreports = []\n'
        '[workload]\nkind = "mix"\n'
        'classes.small = {kind = "synthetic", num_requests = 10, rate = 50.0, prompt = {dist = "fixed", value = 2000}, '
        'output = {dist = "fixed", value = 4}, request_class = "small"}\n'
        'classes.huge = {kind = "synthetic", num_requests = 10, rate = 50.0, prompt = {dist = "fixed", value = 5000}, '
        'output = {dist = "fixed", value = 4}, request_class = "huge"}\n'
        '[kv_cache]\nkind = "paged"\nnum_blocks = 64\nblock_size = 16\n')
    exact = run_experiment(load(path)).all_runs()[0]
    streamed = run_experiment(load(path, ["experiment.exact_requests=3"])).all_runs()[0]
    assert streamed.rows_file is not None
    for run in (exact, streamed):
        assert run.metrics["rejected"] == 20
        assert run.metrics["per_class"]["huge"]["throughput_tps"] == 0.0
        assert run.metrics["per_class"]["small"]["throughput_tps"] == 0.0
