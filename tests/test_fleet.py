"""A day of a fleet (issue 21): per-arrival work independent of the cluster's size, load indexes,
streamed results, partitioned runs and autoscaling -- each against an independent answer."""

from __future__ import annotations

import math
import textwrap
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.engine import driver as driver_module
from schedlab.engine.pool import LoadIndex, kv_key, outstanding_key
from schedlab.engine.recorder import Recorder
from schedlab.model import Request
from schedlab.results.sketch import RELATIVE_ACCURACY, Summary
from schedlab.results.stream import read_rows
from schedlab.study.executor import make_executor
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import (
    RecordingRouter, compare_runs, dyadic_linear_costs, examples, requests_lists, run_cluster, view_state,
)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.power import UtilisationConfig
from schedlab_plugins.power.utilisation import build_utilisation
from schedlab_plugins.routers import LeastKVRouter, LeastOutstandingRouter, RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.workloads.closed_loop import ClosedLoopConfig, make_closed_loop_workload

ENGINES = ("fast", "reference")
PRESETS = Presets.from_catalog(load_catalog(entry_points=False))


def decoder(blocks: int = 4096, block_size: int = 4):
    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=64, max_num_batched_tokens=512)),
                LinearCostModel(LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=0.5, base_ms=2.0)),
                PagedKVCache(blocks, block_size))
    return make


def poisson(n: int, rate_per_ms: float, seed: int) -> list[float]:
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate_per_ms, n)).tolist()


# -- an arrival touches only the instances whose events come before it ---------------------------------------


def test_the_instances_an_arrival_brings_forward_do_not_grow_with_the_cluster(monkeypatch):
    """Same load per instance on 4 and on 64 instances: the instances touched between arrivals
    are those with an event to do, so touches per request stay the same -- before, every arrival
    advanced every instance (64 touches per request on 64 instances)."""
    touched = []
    act_until = driver_module.Instance.act_until

    def counting(self, t):
        touched.append(self.index)
        return act_until(self, t)

    monkeypatch.setattr(driver_module.Instance, "act_until", counting)
    per_request = {}
    for n in (4, 64):
        touched.clear()
        arrivals = poisson(40 * n, n * 0.004, seed=n)  # 4 requests/s per instance
        requests = [Request(i, t, 64, 40) for i, t in enumerate(arrivals)]
        run_cluster(requests, decoder(), n, LeastOutstandingRouter())
        per_request[n] = len(touched) / len(requests)
    assert per_request[64] < 4.0
    assert per_request[64] < 1.5 * per_request[4]


def test_a_least_loaded_query_is_logarithmic_not_a_scan():
    """The pool's index answers least_outstanding from a heap: with 1,024 views and one changed
    between queries, each query computes a handful of keys, not 1,024."""
    calls = []

    def key(view, pos):
        calls.append(pos)
        return outstanding_key(view, pos)

    key.steady = True
    views = [SimpleNamespace(outstanding=i % 7) for i in range(1024)]
    index = LoadIndex(views, key, range(1024))
    calls.clear()
    for step in range(200):
        pos = index.least()
        assert views[pos].outstanding == min(v.outstanding for v in views)
        views[pos].outstanding += 1
        index.mark(pos)
    assert len(calls) <= 2 * 200


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 5), st.integers(0, 4), st.booleans()),
                min_size=1, max_size=60), st.integers(2, 6))
def test_the_index_agrees_with_a_scan_when_kv_only_grows_between_marks(moves, n):
    """A stateful check of LoadIndex: KV may grow unannounced (a pending decode run), anything
    else is announced by mark(); the answer always equals the scan's."""
    views = [SimpleNamespace(outstanding=0, kv=SimpleNamespace(used=0, num_blocks=16)) for _ in range(n)]
    for v in views:
        v.kv.num_used_blocks = (lambda kv: lambda: kv.used)(v.kv)
    index = LoadIndex(views, kv_key, range(n))
    for pos, outstanding, grow, announce in moves:
        v = views[pos % n]
        if announce:
            v.outstanding = outstanding
            v.kv.used = min(16, max(0, v.kv.used - grow))
            index.mark(pos % n)
        else:
            v.kv.used = min(16, v.kv.used + grow)  # unannounced: only growth
        assert index.least() == min(range(n), key=lambda p: kv_key(views[p], p))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=requests_lists(max_size=16, max_prompt=40, max_output=30), instances=st.integers(2, 4),
       cost=dyadic_linear_costs(), router=st.sampled_from([LeastKVRouter, LeastOutstandingRouter]))
def test_routers_see_the_same_instances_in_both_engines_during_pending_decode_runs(requests, instances, cost,
                                                                                     router):
    """The fast engine keeps decode runs pending and shows their KV in closed form; the reference
    runs every iteration. Everything a router reads must be the same at every arrival."""
    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=64)),
                LinearCostModel(cost), PagedKVCache(256, 4))

    seen = []
    for engine in ENGINES:
        spy = RecordingRouter(router(), view_state)
        run_cluster(requests, make, instances, spy, engine=engine)
        seen.append(spy.seen)
    assert seen[0] == seen[1]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=requests_lists(max_size=14, max_prompt=300, max_output=200, all_at_zero=False),
       instances=st.integers(2, 3), timeout=st.sampled_from([None, 40.0, 150.5, 600.0]), front=st.booleans(),
       router=st.sampled_from([LeastKVRouter, LeastOutstandingRouter]), max_seqs=st.integers(1, 4))
def test_energy_and_aborts_meet_pending_runs_alike_in_both_engines(requests, instances, timeout, front, router,
                                                                    max_seqs):
    """The fast engine's pending decode runs, cut by arrivals and ended at aborts, against the
    reference engine's iterations, with every feature that meets them on: the energy meter
    (exact over the iterations actually run), clients that give up, a front end, a load-aware
    router. Routers see the same at every arrival; results agree; energy is conserved."""
    from schedlab.frontend import ClientConfig, ClientSide, FrontendConfig
    from schedlab.testing import check_energy, compare_runs

    side = ClientSide(FrontendConfig(network_ms=0.5, token_ms=0.25) if front else None,
                      ClientConfig(timeout_ms=timeout) if timeout is not None else None)
    gpu = PRESETS.gpu("a100-40gb")

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=max_seqs, max_num_batched_tokens=256)),
                RooflineCostModel(PRESETS.model("llama-3.1-8b"), gpu, RooflineConfig(model="llama-3.1-8b",
                                                                                       gpu="a100-40gb")),
                PagedKVCache(400, 16))

    def power(cost):
        return build_utilisation(UtilisationConfig(standby_s=0.05), PRESETS, cost)

    runs, seen = [], []
    for engine in ENGINES:
        spy = RecordingRouter(router(), view_state)
        runs.append(run_cluster(requests, make, instances, spy, engine=engine, power=power, client_side=side))
        seen.append(spy.seen)
    assert seen[0] == seen[1]
    compare_runs(*runs, rel=1e-9)
    for run in runs:
        check_energy(run)
    assert runs[0].meta["events"] <= runs[1].meta["events"]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_abort_due_when_a_run_ends_at_an_arrival_is_gone_before_the_router_looks(engine):
    """Instance 0 decodes A (1 ms steps from t = 1) with C queued behind it (one slot); C's
    client gives up at 10.5 ms, so the fast engine's run ends at the first step boundary after
    it, 11 ms, where D arrives. C is aborted at 11, between two iterations, before D is routed:
    the router sees one request on each instance and picks instance 0 (ties to the lowest), not
    instance 1 as it would with C still counted."""
    from schedlab.frontend import ClientConfig, ClientSide

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=1)),
                LinearCostModel(LinearConfig(prefill_ms_per_token=0.25, decode_ms_per_step=1.0)),
                PagedKVCache(400, 4))

    requests = [Request(0, 0.0, 4, 100), Request(1, 0.0, 4, 100), Request(2, 0.5, 4, 4, timeout_ms=10.0),
                Request(3, 11.0, 4, 4)]
    spy = RecordingRouter(LeastOutstandingRouter(), view_state)
    side = ClientSide(client=ClientConfig())  # a client side whose requests carry their own timeouts
    result = run_cluster(requests, make, 2, spy, engine=engine, client_side=side)
    req = {i: (k, f, a) for i, k, f, a in zip(result.requests["id"].tolist(), result.requests["instance"].tolist(),
                                              result.requests["finish_ms"].tolist(), result.requests["aborted"].tolist())}
    assert req[2] == (0, 11.0, 1)
    assert [outstanding for outstanding, *_ in spy.seen[3][1]] == [1, 1]
    assert req[3][0] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_an_abort_that_ends_a_sleep_at_an_arrival_is_gone_before_the_router_looks(engine):
    """A batching window (20 ms, batches of 8) holds A on instance 0, which sleeps until A's
    client gives up at 5 ms; B arrives then. A is aborted at 5 before B is routed: both
    instances are empty and B goes to instance 0."""
    from schedlab.frontend import ClientConfig, ClientSide

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=8, max_wait_ms=20.0, min_batch=8)),
                LinearCostModel(LinearConfig(prefill_ms_per_token=0.25, decode_ms_per_step=1.0)),
                PagedKVCache(400, 4))

    spy = RecordingRouter(LeastOutstandingRouter(), view_state)
    result = run_cluster([Request(0, 0.0, 4, 4, timeout_ms=5.0), Request(1, 5.0, 4, 4)], make, 2, spy,
                         engine=engine, client_side=ClientSide(client=ClientConfig()))
    req = result.requests
    assert req["aborted"].tolist() == [1, 0] and req["finish_ms"][0] == 5.0
    assert [outstanding for outstanding, *_ in spy.seen[1][1]] == [0, 0]
    assert req["instance"].tolist() == [0, 0]


# -- streamed results ---------------------------------------------------------------------------------------

FLEET = """
[experiment]
name = "fleet"
reports = []
timeline = true

[workload]
kind = "synthetic"
num_requests = 3000
arrival = "poisson"
rate = 30
prompt = {dist = "lognormal", median = 200, sigma = 0.8, low = 8, high = 2000}
output = {dist = "lognormal", median = 60, sigma = 0.8, low = 1, high = 400}
client = "c"

[scheduler]
kind = "vllm"

[kv_cache]
kind = "paged"
num_blocks = 4000

[cost_model]
kind = "linear"

[cluster]
instances = 4
router = {kind = "least_outstanding"}

[slo]
ttft_ms = 400
tpot_ms = 40
"""


def fleet_run(tmp_path, *overrides, text=FLEET, executor=None):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return run_experiment(load(path, list(overrides)), executor=executor).all_runs()[0]


def test_a_streamed_run_has_every_row_on_disk_and_metrics_within_the_sketch_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    exact = fleet_run(tmp_path)
    streamed = fleet_run(tmp_path, "experiment.exact_requests=500")
    assert exact.rows_file is None and streamed.rows_file is not None
    rows = read_rows(streamed.rows_file)
    order = np.argsort(rows["id"])
    for name in ("id", "instance", "arrival_ms", "taken_ms", "first_token_ms", "finish_ms", "generated_tokens"):
        np.testing.assert_array_equal(rows[name][order], exact.requests[name])
    a, b = exact.metrics, streamed.metrics
    for name in ("requests", "finished", "generated_tokens", "makespan_ms", "busy_share", "avg_queue", "slo",
                 "gpu_hours", "iterations"):
        assert a[name] == pytest.approx(b[name], rel=1e-9), name
    for name in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms", "loop_queue_ms", "itl_ms"):
        assert a[name]["mean"] == pytest.approx(b[name]["mean"], rel=1e-9)
        assert a[name]["max"] == b[name]["max"]
        for p in ("p50", "p90", "p99"):
            # the sketch's bound on the nearest sample, plus numpy's interpolation between two
            # neighbours (and the ITL runs' pieces): a little over 1%
            assert b[name][p] == pytest.approx(a[name][p], rel=2.5 * RELATIVE_ACCURACY), (name, p)
    for k in range(4):
        assert a["per_instance"][str(k)]["requests"] == b["per_instance"][str(k)]["requests"]
        assert a["per_instance"][str(k)]["slo"]["met"] == b["per_instance"][str(k)]["slo"]["met"]
    assert streamed.meta["requests_sampled"] == 3000  # fewer rows than the sample: all of them
    assert b["stability"]["verdict"] == a["stability"]["verdict"]


def test_a_results_folder_takes_a_streamed_runs_rows_out_of_the_spool(tmp_path, monkeypatch):
    """A run's streamed rows can be gigabytes: saving the results moves the spool file into the
    folder's requests/ (nothing left behind in the spool) and the run then reads it there; a
    second folder gets a copy."""
    from schedlab.results.storage import save

    spool = tmp_path / "spool"
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(spool))
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    results = run_experiment(load(path, ["experiment.exact_requests=500"]))
    run = results.all_runs()[0]
    before = read_rows(run.rows_file)
    assert [p.name for p in spool.iterdir()] == [run.rows_file.split("/")[-1]]
    first = save(results, tmp_path / "out")
    assert list(spool.iterdir()) == []
    saved = tmp_path / "out" / "requests" / f"{run.name}.parquet"
    assert saved in first and run.rows_file == str(saved)
    np.testing.assert_array_equal(read_rows(saved)["id"], before["id"])
    save(results, tmp_path / "again")
    assert saved.is_file() and (tmp_path / "again" / "requests" / f"{run.name}.parquet").is_file()


CLIENT_AND_POWER = """
[power]
kind = "fixed_active"
gpu = "a100-40gb"

[frontend]

[client]
timeout_ms = 1500
"""


def test_a_streamed_run_keeps_the_clients_view_and_the_energy(tmp_path, monkeypatch):
    """Streamed rows carry main's columns (sent_ms, client times, aborted, timed_out, energy_j);
    counts and sums are exact, percentiles within the sketch's error -- including the energy
    window, which starts at the first arrival even when that row went to disk long before."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    text = FLEET + CLIENT_AND_POWER
    exact = fleet_run(tmp_path, "workload.rate=60", text=text)
    streamed = fleet_run(tmp_path, "workload.rate=60", "experiment.exact_requests=500", text=text)
    rows = read_rows(streamed.rows_file)
    order = np.argsort(rows["id"])
    for name in ("sent_ms", "client_first_ms", "client_done_ms", "aborted", "timed_out", "energy_j"):
        np.testing.assert_array_equal(rows[name][order], exact.requests[name])
    a, b = exact.metrics, streamed.metrics
    assert a["timed_out"] > 100 and a["aborted"] > 100  # the case is worth checking
    for name in ("requests", "finished", "rejected", "timed_out", "aborted", "slo", "makespan_ms"):
        assert a[name] == b[name], name
    served = exact.requests["rejected"] == 0  # the makespan ends with the last request finished or dropped
    assert a["makespan_ms"] == exact.requests["finish_ms"][served].max() - exact.requests["arrival_ms"].min()
    assert a["busy_share"] <= 1.0
    for name in ("gpu_j", "busy_j", "idle_j", "attributed_j", "j_per_token", "j_per_request", "window_ms"):
        assert b["energy"][name] == pytest.approx(a["energy"][name], rel=1e-12), name
    for group, names in (("client", ("ttft_ms", "tpot_ms", "e2el_ms", "ntpot_ms", "frontend_ms")),
                         ("energy", ("request_j",))):
        for name in names:
            x, y = a[group][name], b[group][name]
            assert y["mean"] == pytest.approx(x["mean"], rel=1e-9) and y["max"] == x["max"], (group, name)
            for p in ("p50", "p90", "p99"):
                assert y[p] == pytest.approx(x[p], rel=2.5 * RELATIVE_ACCURACY), (group, name, p)


def metric_names(metrics: dict, prefix: str = "") -> set:
    names = set()
    for key, value in metrics.items():
        names |= metric_names(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
    return names


def test_a_streamed_run_of_two_classes_has_the_exact_runs_metric_names_and_class_energy(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    workload = FLEET[FLEET.index("[workload]"):FLEET.index("[scheduler]")]
    chat = workload.replace("[workload]", "[workload.classes.chat]").replace('client = "c"', "")
    text = (FLEET.replace(workload, '[workload]\nkind = "mix"\n\n' + chat + chat.replace("chat", "docs")
                          .replace("rate = 30", "rate = 10").replace("median = 60", "median = 200"))
            + CLIENT_AND_POWER)
    exact = fleet_run(tmp_path, text=text)
    streamed = fleet_run(tmp_path, "experiment.exact_requests=500", text=text)
    assert metric_names(streamed.metrics) == metric_names(exact.metrics) | {"stability.from_sample"}
    for klass in ("chat", "docs"):
        a, b = exact.metrics["per_class"][klass], streamed.metrics["per_class"][klass]
        assert a["energy"] == pytest.approx(b["energy"], rel=1e-9) and a["finished"] == b["finished"]


def test_without_a_client_side_a_streamed_run_gives_the_engines_view_as_the_clients(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    exact = fleet_run(tmp_path)
    streamed = fleet_run(tmp_path, "experiment.exact_requests=500")
    a, b = exact.metrics["client"], streamed.metrics["client"]
    assert b["frontend_ms"]["max"] == 0.0 and b["ttft_ms"] == streamed.metrics["ttft_ms"]
    for name in ("ttft_ms", "tpot_ms", "e2el_ms", "ntpot_ms"):
        assert b[name]["mean"] == pytest.approx(a[name]["mean"], rel=1e-9)
        assert b[name]["p99"] == pytest.approx(a[name]["p99"], rel=2.5 * RELATIVE_ACCURACY)
    assert "energy" not in streamed.metrics


def test_streamed_rows_may_be_csv(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    run = fleet_run(tmp_path, "experiment.exact_requests=100", "experiment.request_rows=csv")
    assert run.rows_file.endswith(".csv")
    assert sorted(read_rows(run.rows_file)["id"].tolist()) == list(range(3000))


def test_the_recorder_keeps_no_rows_past_the_limit():
    class Sink:
        rows = 0

        def write(self, chunk, reasons):
            Sink.rows += chunk["id"].size

        def add_itl(self, *runs):
            pass

        def close(self):
            pass

    rec = Recorder(sink=Sink(), exact_requests=10)
    seq = SimpleNamespace(request=Request(0, 0.0, 5, 5), transfer=None, taken_ms=0.0, first_scheduled_ms=0.0,
                          first_token_ms=1.0, waiting_ms=0.0, num_generated=5, num_preemptions=0, recomputed_tokens=0,
                          prefill_chunks=1, cached_tokens_total=0, num_swaps=0, energy_j=0.0)
    for _ in range(100_000):
        rec.request_done(seq, 0, 2.0)
        assert len(rec._rows) <= 1 << 15 and not rec._chunks or not rec.streaming
    rec.finish()
    assert rec.streaming and Sink.rows == 100_000 and not rec._chunks and not rec._rows


def test_the_timeline_keeps_a_bounded_evenly_thinned_sample():
    rec = Recorder(timeline_points=100)
    batch = SimpleNamespace(num_decode=1, num_prefill=0, prefill_tokens=0)
    for i in range(10_000):
        rec.sample(float(i), 0, 1, 0, 0, 1.0, 1, batch)
    kept = np.frombuffer(rec.timeline["time_ms"], dtype=np.float64)
    assert 50 <= kept.size <= 100
    stride = kept[1] - kept[0]
    assert stride in (128.0, 256.0) and np.all(np.diff(kept) == stride) and kept[0] == 0.0


def test_a_summary_of_runs_equals_the_summary_of_the_values():
    rng = np.random.default_rng(3)
    first, inc = rng.uniform(5, 50, 300), rng.uniform(0, 0.05, 300)
    count, weight = rng.integers(1, 200, 300), rng.integers(1, 5, 300)
    values = np.concatenate([np.repeat(f + d * np.arange(c), w) for f, d, c, w in zip(first, inc, count, weight)])
    runs, plain = Summary(), Summary()
    runs.add_runs(first, inc, count, weight)
    plain.add(values)
    assert runs.count == plain.count == values.size
    assert runs.total == pytest.approx(values.sum(), rel=1e-12) and runs.max == pytest.approx(values.max())
    for p in (50, 90, 99):
        assert runs.result()[f"p{p}"] == pytest.approx(np.percentile(values, p), rel=1.5 * RELATIVE_ACCURACY)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1e6)), min_size=1, max_size=60))
def test_a_summary_s_percentiles_are_numpy_s_within_the_sketch_s_accuracy(values):
    """Every percentile within 1% of numpy's linear one, small groups too: numpy interpolates
    between two order statistics, each within 1% from the sketch (before: the sketch's lower
    one alone, so the p99 of 264 and 2,733 ms read 262.5; audit s57)."""
    summary = Summary()
    summary.add(np.array(values))
    got = summary.result()
    for p in (50, 90, 95, 99):
        assert got[f"p{p}"] == pytest.approx(np.percentile(values, p), rel=RELATIVE_ACCURACY * (1 + 1e-9), abs=1e-12)
    assert got["max"] == max(values)


def test_the_p99_of_two_values_is_near_the_larger():
    summary = Summary()
    summary.add(np.array([264.0, 2733.3]))
    assert summary.result()["p99"] == pytest.approx(264.0 + 0.99 * (2733.3 - 264.0), rel=RELATIVE_ACCURACY)


# -- partitioned runs ---------------------------------------------------------------------------------------


def in_parts(tmp_path, parts: int, *overrides):
    """The run split into ``parts`` tasks on two worker processes."""
    executor = make_executor(jobs=2)
    try:
        return fleet_run(tmp_path, *overrides, f"cluster.partitions={parts}", executor=executor)
    finally:
        executor.close()


@pytest.mark.parametrize("router", ['{kind = "round_robin"}', '{kind = "hash", by = "id"}'])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_partitioned_run_has_the_rows_of_one_process(tmp_path, router, engine):
    base = ("workload.num_requests=600", f"cluster.router={router}", f"experiment.engine={engine}")
    whole = fleet_run(tmp_path, *base)
    split = in_parts(tmp_path, 3, *base)
    assert split.meta["partitions"] == 3
    for name, column in whole.requests.items():
        np.testing.assert_array_equal(split.requests[name], column, err_msg=name)
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "slo", "kv_usage"):
        for key, value in whole.metrics[name].items():
            assert split.metrics[name][key] == pytest.approx(value, rel=1e-9), (name, key)
    assert split.metrics["busy_share"] == pytest.approx(whole.metrics["busy_share"], rel=1e-12)


def test_a_load_aware_router_cannot_be_partitioned(tmp_path):
    from schedlab.errors import ConfigError

    with pytest.raises(ConfigError, match="partitions.*LeastOutstandingRouter chooses by load"):
        fleet_run(tmp_path, "workload.num_requests=50", "cluster.partitions=2")


HPA = '{kind = "target_utilization", metric = "outstanding", min_instances = 1, target = 2}'


@pytest.mark.parametrize("overrides, extra, message", [
    # (partitions with [power]: tests/test_partition_energy.py)
    (["cluster.partitions=2"], "\n[frontend]\n", r"partitions: not with \[frontend\]"),
    ([f"cluster.autoscaler={HPA}", "cluster.partitions=2"], "",
     r"\[cluster.autoscaler\]: autoscaling needs an open-loop workload and partitions = 1"),
    ([f"cluster.autoscaler={HPA}", 'cluster.mode="disaggregated"'], "",
     r"scales each pool on its own: give \[cluster.prefill\]"),
    # (pipelined instances scale: tests/test_pipeline_scaling.py; data-parallel deployments:
    # tests/test_data_parallel_deployments.py)
])
def test_combinations_not_modelled_are_refused_by_name(tmp_path, overrides, extra, message):
    """Features that meet in a run but are not modelled together say so, naming the table."""
    from schedlab.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        fleet_run(tmp_path, "workload.num_requests=50", 'cluster.router={kind = "round_robin"}', *overrides,
                  text=FLEET + extra)


CLASSES_SCALED = ('cluster.router={kind = "class", classes = {default = [0, 1]}}',
                  f"cluster.autoscaler={HPA}")


@pytest.mark.parametrize("overrides, message", [
    # a load-aware router split into parts (before: refused only when the run started, its message
    # prefixed twice: "fleet.toml: run 'fleet': fleet.toml: run 'fleet' [cluster] partitions: ...")
    (["cluster.partitions=2"], "fleet.toml: [cluster] partitions: router LeastOutstandingRouter chooses by load"),
    # the class router names instances by number; an autoscaler renumbers the serving ones (before:
    # accepted, then the run failed at the first request after a scale-down: "the cluster has 1 instances")
    (CLASSES_SCALED, "fleet.toml: [cluster.autoscaler]: not with [cluster.router] kind = 'class': its settings "
                     "name instances by number, and an autoscaler changes which instances serve"),
    # (a bad index: the table named once, not "[cluster.router]: [cluster.router] kind = 'class': ...")
    (['cluster.router={kind = "class", classes = {default = [5]}}'],
     "fleet.toml: [cluster.router]: classes.default lists instance 5, but the cluster has 4 instances "
     "(indices 0 to 3)"),
])
def test_validate_refuses_what_run_refuses_naming_the_file_once(tmp_path, capsys, overrides, message):
    from schedlab.cli import main

    path = _write(tmp_path, FLEET)
    sets = [word for setting in ["workload.num_requests=50", *overrides] for word in ("--set", setting)]
    for command in (["validate", str(path)], ["run", str(path), "--out", str(tmp_path / "out"), "--jobs", "1"]):
        assert main([*command, *sets]) == 2, command
        err = capsys.readouterr().err
        assert message in err and err.count("fleet.toml") == 1, (command, err)


def test_an_slo_guard_without_slo_targets_is_warned_about(tmp_path):
    """min_attainment judges the window's attainment, NaN without [slo]: the guard would never act."""
    from schedlab.errors import InputWarning

    no_slo = FLEET.split("[slo]")[0]
    guard = '{kind = "queue_length", min_attainment = 0.99}'
    with pytest.warns(InputWarning, match=r"fleet.toml: \[cluster.autoscaler\]: min_attainment = 0.99 needs \[slo\] "
                                          r"targets, which the run has not"):
        load(_write(tmp_path, no_slo), [f"cluster.autoscaler={guard}"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load(_write(tmp_path, FLEET), [f"cluster.autoscaler={guard}"])             # with [slo]: nothing said
        load(_write(tmp_path, no_slo), ['cluster.autoscaler={kind = "queue_length"}'])  # no guard: nothing said


def test_the_autoscalers_slo_check_is_the_clients_view():
    """The autoscaler's window judges a request as the run's SLO metrics do: TTFT from when the
    client sent it to its first byte, TPOT between its first and last byte; a request its client
    gave up on misses, whatever the engine did."""
    from schedlab.results.metrics import request_met

    met = request_met({"ttft_ms": 100.0, "tpot_ms": 10.0})
    seq = SimpleNamespace(request=Request(0, 50.0, 8, 5, sent_ms=10.0), num_generated=5)
    assert met(seq, (110.0, 150.0, False))          # TTFT 100 (from 10), TPOT (150 - 110) / 4 = 10
    assert not met(seq, (110.5, 150.0, False))      # TTFT 100.5
    assert not met(seq, (100.0, 141.0, False))      # TPOT 10.25
    assert not met(seq, (20.0, 30.0, True))         # timed out


# -- autoscaling -------------------------------------------------------------------------------------------

POLICIES = {
    "queue": '{kind = "queue_length", min_instances = %d, target_per_instance = %g, cold_start_s = %g, '
             'interval_s = %g, stabilization_s = %g, min_attainment = 0.9}',
    "hpa": '{kind = "target_utilization", metric = "outstanding", min_instances = %d, target = %g, '
           'cold_start_s = %g, interval_s = %g, stabilization_s = %g}',
}


def scaled(tmp_path, policy, low, target, cold, interval, stabilize, n, rate, engine="fast", seed=0, text=FLEET,
           limit=""):
    table = POLICIES[policy] % (low, target, cold, interval, stabilize)
    table = table[:-1] + limit + "}"  # limit: more keys (", scale_up_pods = 1, ...")
    return fleet_run(tmp_path, f"workload.num_requests={n}", f"workload.rate={rate}", "cluster.instances=5",
                     f"cluster.autoscaler={table}", f"experiment.engine={engine}", f"experiment.seed={seed}",
                     "workload.arrival=gamma", "workload.cv=3", text=text)


def serving_over_time(run):
    """(time, serving + warming, serving) after every decision, from the controller's history."""
    return [(t, s + w, s) for t, s, w, _d, _desired in run.meta["scaling"]["history"]]


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(sorted(POLICIES)), low=st.integers(1, 3), target=st.sampled_from([1, 2, 4, 8]),
       cold=st.sampled_from([0.0, 0.5, 5.0]), interval=st.sampled_from([0.25, 1.0, 3.0]),
       stabilize=st.sampled_from([0.0, 2.0]), rate=st.sampled_from([5, 20, 60]), seed=st.integers(0, 3))
def test_autoscaling_keeps_the_minimum_serves_only_warm_instances_and_loses_no_request(
        tmp_path, policy, low, target, cold, interval, stabilize, rate, seed):
    run = scaled(tmp_path, policy, low, target, cold, interval, stabilize, 300, rate, seed=seed)
    scaling = run.meta["scaling"]
    for _t, paid, serving in serving_over_time(run):
        assert serving >= low and paid <= 5
    # every request was served by an instance that was on, warm, at its arrival, and finished
    # before that instance went off
    req = run.requests
    assert run.metrics["finished"] == 300 and run.metrics["rejected"] == 0
    intervals = scaling["intervals"]
    for inst, arrival, finish in zip(req["instance"].tolist(), req["arrival_ms"].tolist(), req["finish_ms"].tolist()):
        home = [(on, off) for i, on, off in intervals if i == inst and on <= arrival <= off]
        assert home, (inst, arrival)
        on, off = home[0]
        assert on == 0.0 or arrival >= on + cold * 1e3
        assert finish <= off
    assert run.metrics["gpu_hours"] == pytest.approx(sum(off - on for _, on, off in intervals) / 3.6e6)


TIGHT = ", scale_up_pods = 1, scale_up_percent = 0, scale_up_period_s = 3"  # HPA's rate limit, binding on 5


@pytest.mark.parametrize("limit", ["", TIGHT])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_both_engines_scale_alike(tmp_path, policy, limit):
    fast, ref = (scaled(tmp_path, policy, 1, 2, 2.0, 1.0, 2.0, 400, 3, engine=e, limit=limit) for e in ENGINES)
    assert fast.meta["scaling"]["history"] == ref.meta["scaling"]["history"]
    np.testing.assert_allclose(np.array(fast.meta["scaling"]["intervals"]), np.array(ref.meta["scaling"]["intervals"]),
                               rtol=1e-12)
    for name in ("instance", "first_token_ms", "finish_ms"):
        np.testing.assert_allclose(fast.requests[name], ref.requests[name], rtol=1e-12)
    assert fast.metrics["fleet"]["scale_ups"] > 5 and fast.metrics["fleet"]["scale_downs"] > 5  # bursts come and go
    if limit:  # a scale-up to at most 1 more than after the tick 3 s before; unlimited, the same load goes past it
        def too_fast(run):
            paid = {t: s + w for t, s, w, _d, _desired in run.meta["scaling"]["history"]}
            return [t for t, n in paid.items() if n > paid.get(t - 1e3, n) and n > paid.get(t - 3e3, paid[0.0]) + 1]

        assert too_fast(fast) == []
        assert too_fast(scaled(tmp_path, policy, 1, 2, 2.0, 1.0, 2.0, 400, 3, limit=', scale_up_limit = "none"'))


def test_the_vllm_dp_router_follows_an_autoscaled_pool_in_both_engines(tmp_path):
    """vLLM's DP load balancer keeps a load snapshot for stats_interval_ms; an autoscaler that
    drains an instance within it used to leave the snapshot longer than the pool, and the router
    answered a position that was gone (the run failed, blaming the router). The snapshot is read
    again when the pool changes: the run ends, every request served by an instance serving at
    its arrival, and both engines agree."""
    runs = [fleet_run(tmp_path, "workload.num_requests=400", "workload.rate=20", "workload.arrival=gamma",
                      "workload.cv=3", "experiment.seed=2",
                      'cluster.router={kind = "vllm_dp", stats_interval_ms = 3000}',
                      'cluster.autoscaler={kind = "queue_length", target_per_instance = 2, interval_s = 0.5, '
                      'cold_start_s = 0.5, stabilization_s = 0}', f"experiment.engine={engine}") for engine in ENGINES]
    fast, ref = runs
    assert fast.metrics["finished"] == 400 and fast.metrics["fleet"]["scale_downs"] > 5
    assert fast.meta["scaling"]["history"] == ref.meta["scaling"]["history"]
    for name in ("instance", "first_token_ms", "finish_ms"):
        np.testing.assert_allclose(fast.requests[name], ref.requests[name], rtol=1e-12)
    intervals = fast.meta["scaling"]["intervals"]
    for inst, arrival in zip(fast.requests["instance"].tolist(), fast.requests["arrival_ms"].tolist()):
        assert any(i == inst and on <= arrival <= off for i, on, off in intervals)


def test_an_autoscaled_fleet_meters_only_the_instances_it_pays_for(tmp_path):
    """Energy of an autoscaled fleet: each instance draws nothing outside its paid intervals
    (the meters' off stretches are their complement), the power redrawn from the timeline
    integrates to the meters' count, both engines agree, and the fleet draws less than the same
    five instances kept on (min_instances = 5)."""
    power = CLIENT_AND_POWER.split("[frontend]")[0]
    fast, ref = (scaled(tmp_path, "hpa", 1, 2, 2.0, 1.0, 2.0, 400, 3, engine=e, text=FLEET + power) for e in ENGINES)
    for name in ("gpu_j", "busy_j", "idle_j", "kwh"):
        assert fast.metrics["energy"][name] == pytest.approx(ref.metrics["energy"][name], rel=1e-9), name
    start, end = fast.meta["energy"]["window_ms"]
    assert start == 0.0
    for i, inst in enumerate(fast.meta["energy"]["instances"]):
        paid = sorted((on, off) for k, on, off in fast.meta["scaling"]["intervals"] if k == i)
        edges = [start] + [t for interval in paid for t in interval] + [end]
        unpaid = [[a, b] for a, b in zip(edges[::2], edges[1::2]) if b > a]
        off = [[a, b] for a, b in inst.get("off", []) if b > a]
        np.testing.assert_allclose(np.array(off).reshape(-1, 2), np.array(unpaid).reshape(-1, 2), rtol=1e-12)
    from schedlab.testing import check_energy

    check_energy(fast)
    check_energy(ref)
    always_on = scaled(tmp_path, "hpa", 5, 2, 2.0, 1.0, 2.0, 400, 3, text=FLEET + power)
    assert fast.metrics["gpu_hours"] < always_on.metrics["gpu_hours"]
    assert fast.metrics["energy"]["kwh"] < always_on.metrics["energy"]["kwh"]


def turned_away_text() -> str:
    """Twenty requests, one every 100 ms from 0; the odd ones' prompts (1,000 tokens) do not fit
    the 20 x 16-token KV cache and are turned away on arrival, the even ones (10 tokens, 5 out)
    finish within 40 ms, far inside the SLO. The queue signal never asks for an instance (target
    1,000); only the SLO guard can."""
    rows = ", ".join(f"{{arrival_ms = {100 * i}, prompt_tokens = {1000 if i % 2 else 10}, output_tokens = 5}}"
                     for i in range(20))
    return f"""
[experiment]
name = "turned-away"
reports = []
[workload]
kind = "inline"
requests = [{rows}]
[kv_cache]
num_blocks = 20
block_size = 16
[cost_model]
kind = "linear"
[cluster]
instances = 2
autoscaler = {{kind = "queue_length", target_per_instance = 1000, min_attainment = 0.9, interval_s = 1,
              window_s = 10, cold_start_s = 0, stabilization_s = 0}}
[slo]
ttft_ms = 1000
tpot_ms = 100
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_the_autoscalers_slo_window_counts_a_rejected_request_as_missed(tmp_path, engine):
    """As the run's slo.attainment (every request: rejected ones meet nothing). The tick at 1 s
    sees the arrivals at 0-900 ms: 5 finished within the SLO and 5 turned away, attainment 0.5
    below 0.9, so it asks for serving + 1 = 2 (before: the rejected ones were left out, the window
    read 5 of 5 met and the fleet stayed at 1). The ticks end with the last arrival, at 1.9 s."""
    run = fleet_run(tmp_path, f"experiment.engine={engine}", text=turned_away_text())
    assert run.metrics["rejected"] == 10 and run.metrics["slo"]["attainment"] == 0.5
    assert run.meta["scaling"]["history"] == [[0.0, 1, 0, 0, 1], [1000.0, 2, 0, 0, 2]]
    assert run.metrics["fleet"]["scale_ups"] == 1


def test_queue_length_by_hand():
    """ceil(outstanding / target), one more while attainment is low, down only after the window."""
    from schedlab.engine.scaling import Signals
    from schedlab_plugins.autoscalers import QueueLength, QueueLengthConfig

    # (the recommendation alone: these ticks are not one run's, so HPA's normalisation, which
    # keeps a scale-down at most at the current count, is off; tests/test_autoscaler_review.py has it)
    policy = QueueLength(QueueLengthConfig(target_per_instance=4, min_attainment=0.9, stabilization_s=10,
                                           scale_up_limit="none"))

    def signals(t_s, outstanding, finished=10, met=10, serving=2):
        return Signals(t_s * 1e3, serving, 0, 0, 1, 8, 0, 0, outstanding, 0.0, 60e3, 0, finished, met,
                       met / finished if finished else math.nan)

    assert policy.decide(signals(0, 9)) == 3           # ceil(9 / 4)
    assert policy.decide(signals(5, 1)) == 3           # down held: 3 was recommended 5 s ago
    assert policy.decide(signals(11, 1)) == 1          # the window has passed
    assert policy.decide(signals(12, 1, met=5)) == 3   # attainment 0.5: serving + 1


def hpa_signals(serving, warming, outstanding, t_s=0.0):
    from schedlab.engine.scaling import Signals

    return Signals(t_s * 1e3, serving, warming, 0, 1, 64, 0, 0, outstanding, 0.0, 60e3, 0, 0, 0, math.nan)


def test_target_utilization_counts_warming_instances_as_hpa_counts_unready_pods_by_hand():
    """HPA's calcPlainMetricReplicas, outstanding requests per serving instance against 4 (10%
    tolerance), no stabilisation."""
    from schedlab_plugins.autoscalers import TargetUtilization, TargetUtilizationConfig

    # (the recommendation alone, without the scale-up rate limit: tests/test_autoscaler_review.py has it)
    policy = TargetUtilization(TargetUtilizationConfig(metric="outstanding", target=4, stabilization_s=0,
                                                       scale_up_limit="none"))
    # the review's tick: 1 serving at 20 (ratio 5) and 6 warming asked for ceil(1 x 5) = 5,
    # cancelling 2 warming instances; counted as using nothing the 6 make the ratio
    # 20 / 7 / 4 = 0.71, a reversal, so HPA keeps the 7
    assert policy.decide(hpa_signals(1, 6, 20)) == 7
    # ratio 1.3 over 10 serving, 2 warming: 13 / 12 = 1.08 over all, within the tolerance: 12
    # (before: ceil(10 x 1.3) = 13)
    assert policy.decide(hpa_signals(10, 2, 52)) == 12
    # ratio 5 over 2 serving, 1 warming: 10 / 3 = 3.3 over all, still up: ceil(2 x 5) = 10
    assert policy.decide(hpa_signals(2, 1, 40)) == 10
    # ratio 0.5 (down): the warming ones are left out, as HPA leaves unready pods out: ceil(4 x 0.5)
    assert policy.decide(hpa_signals(4, 2, 8)) == 2
    # no warming instance: ceil(serving x ratio), nothing within the tolerance
    assert policy.decide(hpa_signals(4, 0, 24)) == 6
    assert policy.decide(hpa_signals(4, 0, 17)) == 4


@settings(max_examples=examples(200), deadline=None)
@given(serving=st.integers(1, 16), warming=st.integers(0, 16), outstanding=st.integers(0, 400),
       target=st.sampled_from([0.5, 1.0, 3.0, 4.0, 12.0]), tolerance=st.sampled_from([0.0, 0.1, 0.5]))
def test_target_utilization_never_scales_down_while_the_serving_instances_are_above_target(
        serving, warming, outstanding, target, tolerance):
    from schedlab_plugins.autoscalers import TargetUtilization, TargetUtilizationConfig

    policy = TargetUtilization(TargetUtilizationConfig(metric="outstanding", target=target, tolerance=tolerance,
                                                       stabilization_s=0))
    desired = policy.decide(hpa_signals(serving, warming, outstanding))
    if outstanding / serving > target:  # (a cancelled warming instance loses its paid cold start)
        assert desired >= serving + warming


def test_a_fleet_run_has_gpu_hours_and_hours(tmp_path):
    run = fleet_run(tmp_path, "workload.num_requests=400", "workload.rate=0.05")  # ~2.2 hours
    m = run.metrics
    assert m["gpu_hours"] == pytest.approx(4 * run.requests["finish_ms"].max() / 3.6e6)
    hours = m["hourly"]
    assert sum(h["requests"] for h in hours.values()) == 400
    assert sum(h["gpu_hours"] for h in hours.values()) == pytest.approx(m["gpu_hours"])
    first_hour = run.requests["arrival_ms"] < 3.6e6
    assert hours["0"]["requests"] == int(first_hour.sum())


# -- a day of traffic ----------------------------------------------------------------------------------------


def test_a_diurnal_day_has_each_hours_rate():
    """Hourly counts of the non-homogeneous Poisson day against each hour's expected count: every
    hour within 5 standard deviations, and the quietest hour a quarter of the busiest (amplitude 0.6)."""
    from schedlab_plugins.workloads.diurnal import DiurnalConfig, diurnal_arrivals_ms, hourly_weights

    config = DiurnalConfig(mean_rate=2.0, prompt={"dist": "fixed", "value": 10},
                           output={"dist": "fixed", "value": 10})
    arrivals = diurnal_arrivals_ms(config, seed=5)
    assert np.all(np.diff(arrivals) >= 0) and arrivals[-1] < 24 * 3.6e6
    counts = np.bincount((arrivals // 3.6e6).astype(int), minlength=24)
    expected = hourly_weights(config) * 2.0 * 3600
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected))
    assert expected.min() / expected.max() == pytest.approx(0.25, rel=0.02)
    assert int(np.argmax(expected)) in (13, 14)


def test_a_part_of_a_day_has_its_hours_rates_and_count():
    """mean_rate is a whole day's mean: the two hours up to a peak at 1 am run at 1.6x it (hour 1,
    the peak) and 1 + 0.6 cos(pi / 12) = 1.58x (hour 0: the cosine at each hour's start, over the
    day's mean of 1), and the workload's expected count says so (the progress bar and the limits
    read it)."""
    from schedlab_plugins.workloads.diurnal import DiurnalConfig, make_diurnal_workload

    config = DiurnalConfig(mean_rate=5.0, hours=2, peak_hour=1.0, prompt={"dist": "fixed", "value": 4},
                           output={"dist": "fixed", "value": 4})
    weights = [1 + 0.6 * np.cos(np.pi / 12), 1.6]
    workload = make_diurnal_workload(config)
    assert workload.num_requests == round(3600 * 5.0 * sum(weights))
    drawn = sum(1 for _ in workload.requests(3))
    assert abs(drawn - workload.num_requests) <= 5 * np.sqrt(workload.num_requests)


def test_a_diurnal_profile_is_followed_and_checked():
    from schedlab.configs import FieldError
    from schedlab_plugins.workloads.diurnal import DiurnalConfig, diurnal_arrivals_ms

    profile = [0.0] * 12 + [1.0] * 12
    config = DiurnalConfig(mean_rate=1.0, hours=24, profile=profile, prompt={"dist": "fixed", "value": 4},
                           output={"dist": "fixed", "value": 4})
    arrivals = diurnal_arrivals_ms(config, seed=1)
    assert arrivals.min() >= 12 * 3.6e6  # nothing in the hours of weight 0
    with pytest.raises(FieldError, match="profile"):
        DiurnalConfig(mean_rate=1.0, profile=[1.0] * 23, prompt={"dist": "fixed", "value": 4},
                      output={"dist": "fixed", "value": 4})
    # the cosine's settings beside a profile did nothing, without a word (review s81 badinput, 7)
    for key, value in (("amplitude", 0.05), ("peak_hour", 3.0)):
        with pytest.raises(FieldError, match=rf"^{key}: shapes the cosine day, which profile replaces"):
            DiurnalConfig(mean_rate=1.0, profile=profile, prompt={"dist": "fixed", "value": 4},
                          output={"dist": "fixed", "value": 4}, **{key: value})


def test_the_fleet_report_writes_its_table_and_plot(tmp_path):
    from schedlab_plugins.reports.fleet import FleetConfig, FleetReport

    results = run_experiment(load(_write(tmp_path, FLEET), ["workload.num_requests=300", "workload.rate=0.03"]))
    written = FleetReport(FleetConfig(gpu_hour_usd=2.0)).write(results, tmp_path / "out")
    assert [p.name for p in written] == ["fleet.txt", "fleet.png"]
    run = results.all_runs()[0]
    line = (tmp_path / "out" / "fleet.txt").read_text().splitlines()[1]
    assert f"{run.metrics['gpu_hours'] * 2.0:,.2f}" in line.split()


def test_the_fleet_report_says_why_it_writes_nothing_for_runs_under_two_hours(tmp_path):
    import io

    from schedlab_plugins.reports.fleet import FleetReport

    results = run_experiment(load(_write(tmp_path, FLEET), ["workload.num_requests=60"]))
    stream = io.StringIO()
    assert FleetReport(stream=stream).write(results, tmp_path / "out") == []
    makespan = results.all_runs()[0].metrics["makespan_ms"]
    assert makespan < 60e3  # (said in seconds)
    assert stream.getvalue() == (f"schedlab: fleet report: no run lasts 2 hours or more (the longest makespan, "
                                 f"first arrival to last finish: {makespan / 1e3:.0f} s), the least that has per-hour "
                                 "figures; fleet.txt and plots/fleet.png not written\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ms, shown", [(7_197_398.0, "1 h 59 min 57 s"), (7_199_999.9, "1 h 59 min 59 s"),
                                       (3_600_000.0, "1 h 0 min 0 s"), (5_400_500.0, "1 h 30 min 0 s")])
def test_a_run_just_short_of_two_hours_is_not_said_to_last_two(ms, shown):
    """A 2-hour day whose last request ends 2.6 s before 2:00 read "(the longest: 2.0 h)" beside
    "no run lasts 2 hours": past an hour the length is cut to the second, never rounded up."""
    from schedlab_plugins.reports.fleet import nothing_written

    results = SimpleNamespace(all_runs=lambda: [SimpleNamespace(metrics={"makespan_ms": ms})])
    assert nothing_written(results) == (
        f"schedlab: fleet report: no run lasts 2 hours or more (the longest makespan, first arrival to last finish: "
        f"{shown}), the least that has per-hour figures; fleet.txt and plots/fleet.png not written")


def test_the_fleet_table_of_runs_without_slo_shows_no_attainment():
    """Without [slo] a run has no attainment (NaN hours, no slo metrics): '-' as ups/downs shows,
    not 'nan%'."""
    from schedlab.results import RunResult
    from schedlab_plugins.reports.fleet import fleet_table

    hourly = {"0": {"requests": 10, "slo_attainment": math.nan, "gpu_hours": 2.0}}
    metrics = {"requests": 1234, "gpu_hours": 2.5, "hourly": hourly}
    runs = [RunResult("fixed", {}, {}, {}, {}, {}, {}, {}, metrics, {})]
    assert fleet_table(runs, 2.0) == (
        "run                         requests  GPU-hours    cost $  SLO attained  worst hour  ups/downs\n"
        "fixed                          1,234        2.5      5.00             -           -          -\n")


def test_the_fleet_table_without_power_is_as_before():
    """No run metered energy: fleet.txt byte for byte as before the energy columns, kwh_usd or not."""
    from schedlab.results import RunResult
    from schedlab_plugins.reports.fleet import fleet_table

    hourly = {"0": {"requests": 10, "slo_attainment": 0.9, "gpu_hours": 2.0},
              "1": {"requests": 0, "slo_attainment": math.nan, "gpu_hours": 0.5}}
    fixed = {"requests": 1234, "gpu_hours": 2.5, "slo": {"attainment": 0.95}, "hourly": hourly}
    scaled_run = dict(fixed, fleet={"scale_ups": 3, "scale_downs": 2})
    runs = [RunResult(name, {}, {}, {}, {}, {}, {}, {}, m, {}) for name, m in (("fixed", fixed), ("auto", scaled_run))]
    expected = ("run                         requests  GPU-hours    cost $  SLO attained  worst hour  ups/downs\n"
                "fixed                          1,234        2.5      5.00        95.00%      90.00%          -\n"
                "auto                           1,234        2.5      5.00        95.00%      90.00%        3/2\n")
    assert fleet_table(runs, 2.0) == expected
    assert fleet_table(runs, 2.0, 0.12) == expected


POWER_AND_HOSTS = """
[power]
kind = "utilisation"
gpu = "a100-40gb"
model = "llama-3.1-8b"
host_idle_w = %g
host_busy_w = 80
pue = 1.3
"""
HPA = ('cluster.autoscaler={kind = "target_utilization", metric = "outstanding", min_instances = 1, target = 1, '
       'interval_s = 30, cold_start_s = 60, stabilization_s = 120}')


def test_the_fleet_report_adds_the_energy_of_a_metered_run(tmp_path):
    """With [power]: fleet.txt's kWh is the run's energy.kwh -- by hand, its meters' GPU and host
    energy x PUE -- its energy $ that at kwh_usd; the hours' kWh add up to it, and the plot has them."""
    from schedlab.energy.metrics import J_PER_KWH, instance_energy
    from schedlab_plugins.reports.fleet import FleetConfig, FleetReport, hourly_kwh

    results = run_experiment(load(_write(tmp_path, FLEET + POWER_AND_HOSTS % 150),
                                  ["workload.num_requests=300", "workload.rate=0.03"]))
    written = FleetReport(FleetConfig(gpu_hour_usd=2.0, kwh_usd=0.12)).write(results, tmp_path / "out")
    assert [p.name for p in written] == ["fleet.txt", "fleet.png"]
    run = results.all_runs()[0]
    record = run.meta["energy"]
    start, end = record["window_ms"]
    by_hand = sum(sum(instance_energy(inst, end - start).values()) for inst in record["instances"]) * 1.3
    kwh = run.metrics["energy"]["kwh"]
    assert kwh == pytest.approx(by_hand / J_PER_KWH, rel=1e-12) and kwh > 0
    lines = (tmp_path / "out" / "fleet.txt").read_text().splitlines()
    assert lines[0].split()[-3:] == ["kWh", "energy", "$"]
    assert lines[1].split()[-2:] == [f"{kwh:,.2f}", f"{kwh * 0.12:,.2f}"]
    assert lines[3].startswith("kWh: facility energy over the run's energy window, GPUs and hosts x PUE 1.3")
    assert lines[4] == "energy $: kWh at $0.12/kWh, not in cost $ (GPU-hours at their price)"
    assert len(lines) == 5  # no note of a run without kWh per hour
    hours = hourly_kwh(run)
    assert len(hours) == len(run.metrics["hourly"]) >= 3
    assert sum(hours) == pytest.approx(by_hand / J_PER_KWH, rel=1e-9)


def test_an_autoscaled_fleets_hours_meter_its_hosts_only_while_paid_for(tmp_path):
    """The hours of an autoscaled fleet against its paid GPU-hours: raising the hosts' idle power
    by 150 W adds 150 W x PUE x each hour's GPU-hours (one GPU per instance) to that hour's kWh,
    nothing while an instance is off; the saved and read-back run gives the same hours."""
    from schedlab.results.storage import load as load_saved
    from schedlab.results.storage import save
    from schedlab_plugins.reports.fleet import hourly_kwh

    base = [HPA, "workload.arrival=gamma", "workload.cv=3", "workload.rate=0.05", "workload.num_requests=500"]
    results = [run_experiment(load(_write(tmp_path, FLEET + POWER_AND_HOSTS % w), base)) for w in (150, 0)]
    hosts, bare = (r.all_runs()[0] for r in results)
    assert hosts.metrics["fleet"]["scale_ups"] > 0
    paid = [h["gpu_hours"] for h in hosts.metrics["hourly"].values()]
    added = np.array(hourly_kwh(hosts)) - np.array(hourly_kwh(bare))
    np.testing.assert_allclose(added, np.array(paid) * 150 * 1.3 / 1e3, rtol=1e-9)
    save(results[0], tmp_path / "saved")
    assert hourly_kwh(load_saved(tmp_path / "saved").all_runs()[0]) == hourly_kwh(hosts)


@pytest.mark.parametrize("setting", ["experiment.timeline=false", "experiment.timeline_points=50"])
def test_no_kwh_per_hour_without_the_whole_timeline(tmp_path, setting):
    """A run without a timeline, or one thinned past timeline_points (rows lost): its kWh still in
    fleet.txt, no kWh per hour, and a footnote says why."""
    from schedlab_plugins.reports.fleet import fleet_table, hourly_kwh

    results = run_experiment(load(_write(tmp_path, FLEET + POWER_AND_HOSTS % 150),
                                  ["workload.num_requests=300", "workload.rate=0.03", setting]))
    run = results.all_runs()[0]
    assert hourly_kwh(run) is None
    lines = fleet_table([run], 2.0).splitlines()
    assert lines[0].split()[-1] == "kWh" and lines[1].split()[-1] == f"{run.metrics['energy']['kwh']:,.2f}"
    assert lines[-1] == ("no kWh per hour in plots/fleet.png for fleet: it needs the run's whole timeline "
                         "(timeline = true, timeline_points above its rows)")


def test_a_run_of_replicas_is_not_told_to_set_the_timeline_it_has(tmp_path):
    """Replicas: the kWh is their mean, the timeline the first one's, so no kWh per hour -- and the
    footnote said to set timeline = true, which was set."""
    from schedlab_plugins.reports.fleet import fleet_table, hourly_kwh

    results = run_experiment(load(_write(tmp_path, FLEET + POWER_AND_HOSTS % 150),
                                  ["workload.num_requests=300", "workload.rate=0.03", "experiment.replicas=2"]))
    run = results.all_runs()[0]
    assert len(run.replicas) == 2 and hourly_kwh(run) is None
    assert fleet_table([run], 2.0).splitlines()[-1] == (
        "no kWh per hour in plots/fleet.png for fleet: a run of replicas keeps one replica's timeline, and its kWh is "
        "their mean")


def test_the_fleet_report_of_replicas_whose_last_hours_differ_counts_a_missing_hour_as_empty(tmp_path):
    """Three hours of experiments/fleet_day.toml, two replicas: only the second has a draining
    hour (a request finishing after 3:00). The merged hour 3 has the mean of 0 and its requests
    and GPU-hours (before: null, and the fleet report failed on it)."""
    from pathlib import Path

    from schedlab_plugins.reports.fleet import FleetReport

    day = Path(__file__).resolve().parents[1] / "experiments" / "fleet_day.toml"
    # (0.45/s: at 0.5 neither replica drains past 3:00 since the cosine day is taken at each hour's start)
    results = run_experiment(load(day, ["workload.hours=3", "workload.mean_rate=0.45", "cluster.instances=3",
                                        "experiment.replicas=2"]))
    for run in results.all_runs():
        first, second = (r.metrics["hourly"] for r in run.replicas)
        assert sorted(first) == ["0", "1", "2"] and sorted(second) == ["0", "1", "2", "3"]
        hour = run.metrics["hourly"]["3"]
        assert hour["requests"] == second["3"]["requests"] / 2
        assert hour["gpu_hours"] == pytest.approx(second["3"]["gpu_hours"] / 2, rel=1e-12)
        assert run.metrics["hourly"]["2"]["gpu_hours"] == pytest.approx(
            (first["2"]["gpu_hours"] + second["2"]["gpu_hours"]) / 2, rel=1e-12)
    written = FleetReport().write(results, tmp_path / "out")
    assert [p.name for p in written] == ["fleet.txt", "fleet.png"]


def test_the_fleet_benchmarks_header_shows_every_part_and_the_model_it_runs(monkeypatch, capsys):
    """benchmarks/fleet.py's usage lists each part its command line takes (disaggregated was
    missing) and names the model benchmarks/fleet.toml runs (it said Llama-3-8B)."""
    import importlib.util
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("fleet_benchmark", root / "benchmarks" / "fleet.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr("sys.argv", ["fleet.py", "nonsense"])
    with pytest.raises(SystemExit):
        bench.main()
    parts = re.search(r"choose from (.*)$", capsys.readouterr().err.strip()).group(1).split(", ")
    assert parts == ["cpu", "memory", "big", "closed", "disaggregated"]
    usage = [line.split("#")[0].split() for line in bench.__doc__.splitlines() if "python benchmarks/fleet.py" in line]
    assert all(any(part in words for words in usage) for part in parts), usage
    model = tomllib.loads((root / "benchmarks" / "fleet.toml").read_text())["cost_model"]["model"]
    assert model == "llama-3.1-8b" and "Llama-3.1-8B on an A100-80GB" in bench.__doc__
    assert "Llama-3-8B" not in bench.__doc__


def _write(tmp_path, text):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def test_streamed_parts_merge_into_the_rows_and_sketches_of_one_process(tmp_path, monkeypatch):
    """Parts past exact_requests: their row files join into one with every row of the whole run,
    and their sketches merge exactly (bucket counts add): the same percentiles as one process."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    base = ("workload.num_requests=1500", 'cluster.router={kind = "round_robin"}', "experiment.exact_requests=200")
    whole = fleet_run(tmp_path, *base)
    split = in_parts(tmp_path, 2, *base)
    a, b = read_rows(whole.rows_file), read_rows(split.rows_file)
    oa, ob = np.argsort(a["id"]), np.argsort(b["id"])
    for name in ("id", "instance", "first_token_ms", "finish_ms"):
        np.testing.assert_array_equal(a[name][oa], b[name][ob], err_msg=name)
    for name in ("ttft_ms", "tpot_ms", "e2e_ms", "slo"):
        for key, value in whole.metrics[name].items():
            assert split.metrics[name][key] == pytest.approx(value, rel=1e-9), (name, key)


# -- closed loops on the event heap ------------------------------------------------------------------


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost=dyadic_linear_costs(), clients=st.integers(1, 12), think=st.sampled_from([0.0, 2.5, 7.25]),
       instances=st.integers(2, 5), router=st.sampled_from(["rr", "lo"]), max_seqs=st.integers(1, 4),
       seed=st.integers(0, 5))
def test_both_engines_agree_on_a_closed_loop_over_several_instances(cost, clients, think, instances, router,
                                                                     max_seqs, seed):
    """A closed loop's requests are released as the iterations that finish their predecessors
    are planned, in the order they start; the fast engine keeps decode runs pending between
    those and must agree with the reference engine's iteration-by-iteration loop."""
    config = ClosedLoopConfig(clients=clients, num_requests=30, think_ms=think,
                              prompt={"dist": "uniform", "low": 1, "high": 60},
                              output={"dist": "uniform", "low": 1, "high": 120})

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=max_seqs)), LinearCostModel(cost),
                PagedKVCache(200, 4))

    runs = []
    for engine in ("fast", "reference"):
        workload = make_closed_loop_workload(config)
        router_object = RoundRobinRouter() if router == "rr" else LeastOutstandingRouter()
        runs.append(run_cluster(workload.requests(seed), make, instances, router_object, engine=engine,
                                workload=workload))
    compare_runs(*runs, rel=1e-12)
    assert runs[0].requests["id"].size == 30


def test_a_closed_loop_costs_about_the_same_events_per_request_on_many_instances():
    """Instances of a closed loop no longer advance in lockstep: a decode run is cut only by a
    request routed to its own instance, so events per request do not grow with the instances
    (the lockstep cut every instance's runs at every other's iterations: 7.7x the events per
    request of one instance from 4 instances on). From two instances on, a run's last iteration
    is planned on its own (see ``Instance.step``): about a third more events than one instance."""
    def events_per_request(instances: int) -> float:
        config = ClosedLoopConfig(clients=8 * instances, num_requests=400 * instances, think_ms=50.0,
                                  prompt={"dist": "uniform", "low": 50, "high": 500},
                                  output={"dist": "uniform", "low": 20, "high": 300})
        workload = make_closed_loop_workload(config)

        def make():
            return (ContinuousScheduler(ContinuousConfig(max_num_seqs=16)),
                    LinearCostModel(LinearConfig(decode_ms_per_step=8.0, prefill_ms_per_token=0.05)),
                    PagedKVCache(4000, 16))

        run = run_cluster(workload.requests(1), make, instances, RoundRobinRouter(), workload=workload)
        assert run.metrics["finished"] == 400 * instances
        return run.meta["events"] / (400 * instances)

    one, two, many = events_per_request(1), events_per_request(2), events_per_request(16)
    assert many <= 1.05 * two and two <= 1.5 * one, (one, two, many)


# -- a large run compared with the real run it stands for -----------------------------------------------------

#: A `vllm bench serve` summary and a /metrics scrape of a real run of FLEET's 3,000 requests
#: (values made up: the test compares the simulated side of the comparison, exact against streamed).
BENCH = {"completed": 3000, "mean_ttft_ms": 50.0, "p90_ttft_ms": 120.0, "p99_ttft_ms": 300.0,
         "mean_itl_ms": 20.0, "p99_itl_ms": 40.0, "median_e2el_ms": 1000.0, "mean_e2el_ms": 1500.0}
ITL_BOUNDS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16)
SCRAPE = "".join(f'vllm:inter_token_latency_seconds_bucket{{le="{b}"}} {100 * (k + 1)}\n'
                 for k, b in enumerate(ITL_BOUNDS)) + \
    'vllm:inter_token_latency_seconds_bucket{le="+Inf"} 700\nvllm:inter_token_latency_seconds_sum 14\n' \
    'vllm:inter_token_latency_seconds_count 700\n'


def with_targets(tmp_path) -> str:
    import json

    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    (tmp_path / "metrics.txt").write_text(SCRAPE)
    return FLEET + '\n[target]\npath = "bench.json"\n'


@pytest.mark.parametrize("target", ["bench.json", "metrics.txt"])
def test_a_streamed_run_is_compared_with_its_target_over_every_request(tmp_path, monkeypatch, target):
    """Past exact_requests a run keeps a sample of its rows; its [target] is still compared over
    every request (read back from its file): TTFT and latency statistics as the exact run's, the
    inter-token latencies -- a sketch then -- within its accuracy, through the scrape's buckets too."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    text = with_targets(tmp_path)
    exact = fleet_run(tmp_path, f'target.path="{target}"', text=text)
    streamed = fleet_run(tmp_path, f'target.path="{target}"', "experiment.exact_requests=500", text=text)
    assert exact.rows_file is None and streamed.rows_file is not None
    a, b = exact.metrics["vs_target"]["simulated"], streamed.metrics["vs_target"]["simulated"]
    assert set(a) == set(b) and a
    for name, value in a.items():
        if name.startswith("itl_ms.") and name != "itl_ms.mean":
            assert b[name] == pytest.approx(value, rel=2.5 * RELATIVE_ACCURACY), name
        else:
            assert b[name] == pytest.approx(value, rel=1e-9), name
    assert streamed.meta["target"] == exact.meta["target"]


def test_a_partitioned_run_is_compared_once_whole_and_keeps_every_row(tmp_path, monkeypatch):
    """Parts of different sizes: one streams its rows, the others keep theirs in memory. The
    merged run's file holds every row, and its [target] is compared over the whole run, as
    the run in one process is."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    text = with_targets(tmp_path).replace("instances = 4", "instances = 5")
    base = ("workload.num_requests=1000", 'cluster.router={kind = "round_robin"}')
    whole = fleet_run(tmp_path, *base, text=text)
    executor = make_executor(jobs=2)
    try:
        split = fleet_run(tmp_path, *base, "cluster.partitions=3", "experiment.exact_requests=300", text=text,
                          executor=executor)
    finally:
        executor.close()
    assert split.rows_file is not None
    rows = read_rows(split.rows_file)
    np.testing.assert_array_equal(np.sort(rows["id"]), whole.requests["id"])
    a, b = whole.metrics["vs_target"], split.metrics["vs_target"]
    for name, value in a["simulated"].items():
        tolerance = 2.5 * RELATIVE_ACCURACY if name.startswith("itl_ms.") and name != "itl_ms.mean" else 1e-9
        assert b["simulated"][name] == pytest.approx(value, rel=tolerance), name


def test_an_autoscaler_deciding_faster_than_every_tenth_of_a_second_is_refused_when_read(tmp_path):
    """interval_s = 1e-9 asked for a decision every nanosecond: the run crawled for minutes. A
    tenth of a second is well below any real controller's period (HPA 15 s) and is refused below."""
    from schedlab.errors import ConfigError

    table = '{kind = "queue_length", target_per_instance = 3, interval_s = %s}'
    with pytest.raises(ConfigError, match=r"interval_s: must be >= 0\.1"):
        load_fleet(tmp_path, "cluster.instances=2", "cluster.autoscaler=" + table % "0.05")
    assert load_fleet(tmp_path, "cluster.instances=2", "cluster.autoscaler=" + table % "0.1")


def load_fleet(tmp_path, *overrides):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    return load(path, list(overrides))


# -- an instant KV link ------------------------------------------------------------------------------------

INSTANT_LINK = """
[experiment]
name = "instant"
reports = []

[workload]
kind = "synthetic"
num_requests = 40
rate = 20
prompt = {dist = "uniform", low = 20, high = 400}
output = {dist = "uniform", low = 2, high = 30}

[scheduler]
kind = "continuous"

[kv_cache]
kind = "paged"
num_blocks = 2000

[cost_model]
kind = "linear"

[cluster]
mode = "disaggregated"
prefill = {instances = 1}
decode = {instances = 2}
link = {bandwidth_gbps = inf, latency_us = 0}
router = {kind = "round_robin"}
"""


def test_an_infinite_link_bandwidth_moves_the_kv_at_once_in_both_engines(tmp_path):
    """[cluster.link] bandwidth_gbps = inf is an instant link (its help says so; a cache without
    bytes per block needs no more): every transfer takes 0 ms, the same in both engines."""
    runs = [fleet_run(tmp_path, f"experiment.engine={engine}", text=INSTANT_LINK) for engine in ENGINES]
    for run in runs:
        q = run.requests
        moved = q["kv_pulled_ms"] >= 0
        assert moved.sum() == 40
        np.testing.assert_array_equal(q["kv_landed_ms"][moved], q["kv_pulled_ms"][moved])
        assert run.metrics["transfer"]["transfer_ms"]["max"] == 0.0
    compare_runs(*runs, rel=1e-9)


GIVE_UP = """
[experiment]
name = "give-up"
reports = []
[workload]
kind = "inline"
requests = [{arrival_ms = 0, prompt_tokens = 10, output_tokens = 200}, {arrival_ms = 1, prompt_tokens = 10, output_tokens = 200},
            {arrival_ms = 2, prompt_tokens = 10, output_tokens = 200}]
[scheduler]
kind = "vllm"
max_num_seqs = 1
async_scheduling = false
[cost_model]
kind = "linear"
[client]
timeout_ms = 1.5 * {one}
[cluster]
instances = 2
"""


def test_gpus_are_paid_until_the_engine_drops_the_last_abandoned_request(tmp_path, monkeypatch):
    """Two fixed instances, one request at a time each, 0.05 ms per prompt token and 8 ms per
    decode step, synchronous: requests 0 and 1 (arrivals 0 and 1 ms) run alone and finish at
    0.5 + 199 x 8 = 1,592.5 and 1,593.5 ms. Request 2 (arrival 2) waits behind request 0, gets its
    first token at 1,593.0 and its client gives up 1.5 x 1,592.5 ms after sending it, at 2,390.75,
    during the step that ends at 1,593 + 100 x 8 = 2,393.0, where the engine drops it. The two
    GPUs are paid from 0 to 2,393 ms (audit s57: to the last *completed* request, 1,593.5),
    streamed or not."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    text = GIVE_UP.replace("1.5 * {one}", repr(1.5 * 1592.5))
    for run in (fleet_run(tmp_path, text=text), fleet_run(tmp_path, "experiment.exact_requests=1", text=text)):
        assert run.metrics["finished"] == 2 and run.metrics["timed_out"] == 1
        assert run.metrics["gpu_hours"] == pytest.approx(2 * 2393.0 / 3.6e6)
    rows = fleet_run(tmp_path, text=text).requests
    np.testing.assert_allclose(rows["finish_ms"], [1592.5, 1593.5, 2393.0])


def test_every_arrival_has_its_hour_one_turned_away_after_the_last_finish_too(tmp_path):
    """Requests at 0 and 2.2 h are served; one at 3.5 h is too long for the KV cache and turned
    away on arrival, after the engine's last work. The hours run to the arrival's: 4 hours, 3
    requests (before: 3 hours, and the late one in none)."""
    hour = 3.6e6
    path = tmp_path / "late.toml"
    path.write_text(f"""
[experiment]
reports = []
[workload]
kind = "inline"
requests = [{{arrival_ms = 0, prompt_tokens = 10, output_tokens = 5}},
            {{arrival_ms = {2.2 * hour}, prompt_tokens = 10, output_tokens = 5}},
            {{arrival_ms = {3.5 * hour}, prompt_tokens = 1000, output_tokens = 5}}]
[kv_cache]
num_blocks = 20
block_size = 16
[cost_model]
kind = "linear"
""")
    m = run_experiment(load(path)).all_runs()[0].metrics
    assert m["rejected"] == 1 and m["finished"] == 2
    assert sorted(m["hourly"], key=int) == ["0", "1", "2", "3"]
    assert [m["hourly"][h]["requests"] for h in "0123"] == [1, 0, 1, 1]


LATE_START = """
[experiment]
name = "late"
[workload]
kind = "inline"
requests = [{prompt_tokens = 100, output_tokens = 10, arrival_ms = 600000.0},
            {prompt_tokens = 100, output_tokens = 10, arrival_ms = 602000.0}]
[cost_model]
kind = "linear"
[cluster]
instances = 2
router = {kind = "least_outstanding"}
[power]
kind = "fixed_active"
active_w = 300.0
idle_w = 30.0
standby_w = 30.0
[[runs]]
name = "fixed"
[[runs]]
name = "autoscaled"
cluster.autoscaler = {kind = "target_utilization", metric = "outstanding", target = 1000, min_instances = 2,
                      interval_s = 30, cold_start_s = 60, stabilization_s = 120}
[[runs]]
name = "partitioned"
cluster.partitions = 2
cluster.router = {kind = "round_robin"}
"""


def test_energy_covers_the_time_gpu_hours_pay_for_with_or_without_an_autoscaler(tmp_path):
    """Energy review s79: with the first request at 600 s, a fixed cluster's energy counted from the first arrival
    and its GPU-hours from 0, while an autoscaled one (that never scales) counted both from 0: 4x the kWh for
    the same hardware and GPU-hours. Both now run from 0: 2 GPUs idle at 30 W, busy at 300 W."""
    (tmp_path / "late.toml").write_text(LATE_START)
    runs = {r.name: r for r in run_experiment(load(tmp_path / "late.toml")).all_runs()}
    fixed = runs["fixed"]
    end = fixed.meta["energy"]["window_ms"][1]
    busy_ms = float(np.sum(fixed.timeline["duration_ms"]))
    assert fixed.meta["energy"]["window_ms"] == [0.0, end]
    assert fixed.metrics["energy"]["gpu_j"] == pytest.approx((2 * end * 30.0 + busy_ms * (300.0 - 30.0)) / 1e3)
    assert fixed.metrics["gpu_hours"] == pytest.approx(2 * end / 3.6e6)
    for name in ("autoscaled", "partitioned"):
        assert runs[name].meta["energy"]["window_ms"] == [0.0, end]
        for key in ("gpu_j", "kwh"):
            assert runs[name].metrics["energy"][key] == pytest.approx(fixed.metrics["energy"][key], rel=1e-9)
        assert runs[name].metrics["gpu_hours"] == pytest.approx(fixed.metrics["gpu_hours"], rel=1e-9)


def test_busy_and_kv_shares_of_an_autoscaled_fleet_are_of_the_instances_that_were_on(tmp_path):
    """Metrics review s79: one instance serving throughout under an autoscaler allowed 4 read a busy share of 0.25
    (and a quarter of its KV usage): the shares were divided by the most instances, not those switched on. It
    now reads as the same single instance without an autoscaler."""
    (tmp_path / "a.toml").write_text(textwrap.dedent("""
        [experiment]
        name = "a"
        timeline = false
        [workload]
        kind = "synthetic"
        num_requests = 300
        rate = 20
        prompt = {dist = "uniform", low = 20, high = 800}
        output = {dist = "uniform", low = 1, high = 200}
        [cost_model]
        kind = "linear"
        [scheduler]
        kind = "continuous"
        max_num_seqs = 16
        [[runs]]
        name = "fixed"
        [[runs]]
        name = "autoscaled"
        cluster = {instances = 4, autoscaler = {kind = "queue_length", min_instances = 1, initial = 1,
                   target_per_instance = 100000}}
    """))
    runs = {r.name: r.metrics for r in run_experiment(load(tmp_path / "a.toml")).all_runs()}
    fixed, auto = runs["fixed"], runs["autoscaled"]
    assert auto["fleet"]["peak_serving"] == 1 and fixed["busy_share"] > 0.9
    assert auto["busy_share"] == pytest.approx(fixed["busy_share"], rel=1e-9)
    assert auto["kv_usage"]["mean"] == pytest.approx(fixed["kv_usage"]["mean"], rel=1e-9)
    assert auto["kv_usage"]["time_above_90"] == pytest.approx(fixed["kv_usage"]["time_above_90"], rel=1e-9)
