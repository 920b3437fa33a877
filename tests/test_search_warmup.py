"""A search's warm-up (``[search] warmup``): each probe's statistics leave out its first requests
sent, as guidellm's ``--warmup`` leaves a benchmark's first requests out of its results, so a
closed loop's answer need not be its opening burst; and ``replicas`` in a ``[search]``, which are
the run's.

The metrics are checked on hand-built rows (every number below by hand); the search on the lab's
closed loop against a brute force that runs every client count and leaves the first requests out
with numpy itself; the messages name the file, the table and the key.
"""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from schedlab.errors import ConfigError
from schedlab.results.metric_names import METRICS, check_metric_name
from schedlab.results.metrics import compute_metrics, measured_requests, warmup_count
from schedlab.results.storage import summary_dict
from schedlab.study.caveats import answer_caveats
from schedlab.study.experiment import load, run_experiment
from schedlab.study.search import Probe, SearchOutcome, parse_constraint

DATA = Path(__file__).resolve().parent.parent / "experiments" / "data" / "requests.json"
LAB = DATA.parent.parent / "lab.toml"
TTFT = [parse_constraint("ttft_ms.p99 <= 200")]


# -- the metrics, by hand ------------------------------------------------------------------------------


def _rows(arrival, first, finish, generated, klass=None, sent=None):
    n = len(arrival)
    z = np.zeros(n, dtype=np.int64)
    return {
        "id": np.arange(n), "arrival_ms": np.array(arrival, float), "first_scheduled_ms": np.array(arrival, float),
        "first_token_ms": np.array(first, float), "finish_ms": np.array(finish, float), "waiting_ms": np.zeros(n),
        "instance": z, "prompt_tokens": z + 10, "output_tokens": np.array(generated),
        "max_tokens": np.array(generated), "generated_tokens": np.array(generated), "priority": z, "preemptions": z,
        "recomputed_tokens": z, "prefill_chunks": z + 1, "cached_tokens": z, "swaps": z, "rejected": z.copy(),
        "request_class": np.array(klass or ["default"] * n, dtype=object),
        "client": np.array(["c"] * n, dtype=object),
        **({"sent_ms": np.array(sent, float)} if sent is not None else {}),
    }


COUNTERS = dict.fromkeys(("iterations", "running_seq_ms", "peak_running", "peak_waiting", "kv_block_ms",
                          "kv_peak_blocks", "kv_above_ms", "num_preemptions", "recompute_preemptions",
                          "in_flight_preemptions", "swap_preemptions", "recomputed_tokens", "swap_failures",
                          "swap_out_blocks", "swap_in_blocks", "swap_transfer_ms", "prefix_queries", "prefix_hits",
                          "busy_ms", "prefill_iteration_ms", "decode_only_ms"), 0)
ITL = {"first": np.zeros(0), "inc": np.zeros(0), "count": np.zeros(0, np.int64), "weight": np.zeros(0, np.int64)}

# Six requests. r0 and r1 are sent together at t = 0 and wait (TTFT 100 and 150 ms): the opening
# wave; r2-r5 arrive at 200, 250, 300, 350 ms and wait 20, 20, 30, 40 ms.
#   r0: first token 100, finish 500, 5 tokens (at 100, 200, 300, 400, 500)
#   r1: first token 150, finish 350, 3 tokens (at 150, 250, 350)
#   r2-r4: 3 tokens in 200 ms; r5: 2 tokens in 200 ms
WAVE = dict(arrival=[0, 0, 200, 250, 300, 350], first=[100, 150, 220, 270, 330, 390],
            finish=[500, 350, 420, 470, 530, 590], generated=[5, 3, 3, 3, 3, 2])


def test_a_warm_up_of_two_leaves_the_wave_out_of_the_percentiles_attainment_and_rates():
    req = _rows(**WAVE, klass=["a", "b", "a", "b", "a", "b"])
    meta = {"slo": {"ttft_ms": 35.0}, "num_blocks": 10}
    whole = compute_metrics(req, COUNTERS, ITL, meta)
    m = compute_metrics(req, COUNTERS, ITL, dict(meta, warmup=2))
    # the whole run: TTFTs 100, 150, 20, 20, 30, 40 over 0-590 ms
    assert whole["ttft_ms"]["max"] == 150.0 and "warmup" not in whole
    assert whole["slo"]["attainment"] == 0.5                      # 3 of 6 within 35 ms
    # measured: r2-r5, TTFTs 20, 20, 30, 40 (numpy's p99 at rank 2.97: 30 + 0.97 x 10)
    assert m["ttft_ms"]["max"] == 40.0 and m["ttft_ms"]["p50"] == 25.0
    assert m["ttft_ms"]["p99"] == pytest.approx(39.7)
    assert m["client"]["ttft_ms"]["p99"] == pytest.approx(39.7)  # (no front end: the client's view is the engine's)
    assert m["slo"]["attainment"] == 0.75 and m["slo"]["met"] == 3  # r2, r3, r4 of 4
    # the measured window: r2's arrival (200) to r5's finish (590), 0.39 s, open at its start. In it
    # the engine made r2-r5's 11 tokens, r0's at 300, 400, 500 (its token at 200, the instant the
    # window opens, was made before it: review s81 fleet, finding 1) and r1's at 250, 350: 16; and
    # completed all 6
    assert m["warmup"] == {"requests": 2, "measured": 4, "measured_finished": 4, "measured_window_ms": 390.0}
    assert m["throughput_tps"] == pytest.approx(16 / 0.39)
    assert m["request_throughput_rps"] == pytest.approx(6 / 0.39)
    assert m["slo"]["goodput_rps"] == pytest.approx(3 / 0.39)    # r2, r3, r4 completed in it within 35 ms
    # per class, likewise: a = r0, r2, r4 (3 + 3 + 3 tokens in the window; r2, r4 measured, both met);
    # b = r1, r3, r5 (2 + 3 + 2; r3 met, r5 not)
    a, b = m["per_class"]["a"], m["per_class"]["b"]
    assert (a["ttft_ms"]["max"], b["ttft_ms"]["max"]) == (30.0, 40.0)
    assert a["throughput_tps"] == pytest.approx(9 / 0.39) and b["throughput_tps"] == pytest.approx(7 / 0.39)
    assert (a["slo"]["attainment"], b["slo"]["attainment"]) == (1.0, 0.5)
    # the counts stay the whole run's
    for key in ("requests", "finished", "generated_tokens", "makespan_ms"):
        assert m[key] == whole[key]
    assert (a["requests"], a["finished"], a["generated_tokens"]) == (3, 3, 11)
    # the names a search's constraint or a report may give them
    assert set(m["warmup"]) == set(METRICS["warmup"])
    assert check_metric_name("warmup.measured_finished") == "warmup.measured_finished"


def test_a_warm_up_request_finishing_as_the_window_opens_is_not_in_its_rates():
    """One slot, 10 ms a request, one every 10 ms: the server does exactly 100 requests and tokens
    a second. With a warm-up of 2 the window is r2's arrival (20) to r9's finish (100): r2-r9 in
    it, 8 in 80 ms. r1 finishes at 20, as the window opens: counted, it read 112.5 (review s81
    fleet, finding 1)."""
    n = 10
    req = _rows([10.0 * i for i in range(n)], [10.0 * (i + 1) for i in range(n)],
                [10.0 * (i + 1) for i in range(n)], [1] * n)
    m = compute_metrics(req, COUNTERS, ITL, {"num_blocks": 10, "warmup": 2})
    assert m["warmup"]["measured_window_ms"] == 80.0
    assert m["request_throughput_rps"] == pytest.approx(100.0)
    assert m["throughput_tps"] == pytest.approx(100.0)


def test_the_warm_up_is_the_first_requests_sent_by_count_or_share():
    # sent at 5, 0, 0, 3 ms: the first two sent are r1 and r2 (tied at 0: by id), then r3, then r0
    req = _rows([5, 0, 0, 3], [6, 1, 1, 4], [7, 2, 2, 5], [1, 1, 1, 1], sent=[5, 0, 0, 3])
    assert list(measured_requests(req, 2)) == [True, False, False, True]
    assert list(measured_requests(req, 3)) == [True, False, False, False]
    assert list(measured_requests(req, 0.5)) == [True, False, False, True]   # half of 4
    assert list(measured_requests(req, 0.7)) == [True, False, False, True]   # 2.8: rounded down
    # a share as written: 0.29 of 100 is 29 (0.29 * 100 is 28.999999999999996 in floats)
    assert warmup_count(0.29, 100) == 29 and warmup_count(0.1, 400) == 40 and warmup_count(500, 400) == 400
    # a rejected request has no send time (-1): its arrival orders it
    req["sent_ms"] = np.array([5.0, -1.0, 0.0, 3.0])
    req["arrival_ms"] = np.array([5.0, 4.0, 0.0, 3.0])
    assert list(measured_requests(req, 2)) == [True, True, False, False]


# -- the search: the lab's closed loop, against a brute force --------------------------------------------

CLOSED = f"""
[experiment]
name = "closed"
reports = []
[workload]
kind = "closed_loop"
path = "{DATA}"
clients = 1
num_requests = 400
[cost_model]
kind = "linear"
prefill_ms_per_token = 0.05
decode_ms_per_step = 8.0
[scheduler]
kind = "continuous"
max_num_seqs = 32
max_num_batched_tokens = 2048
"""


def _brute_force(tmp_path, left_out: int, clients: range) -> list[bool]:
    """For every client count, whether p99 TTFT <= 200 ms once the first ``left_out`` requests
    sent are left out -- each run plain (no warm-up), the requests left out and the percentile
    taken here with numpy."""
    path = tmp_path / "sweep.toml"
    path.write_text(CLOSED + f'[sweep]\n"workload.clients" = {list(clients)}\n')
    holds = []
    for run in run_experiment(load(path)).all_runs():
        req = run.requests
        order = np.lexsort((req["id"], req["sent_ms"]))
        kept = np.sort(order[left_out:])
        ttft = (req["first_token_ms"] - req["arrival_ms"])[kept]
        holds.append(bool(np.percentile(ttft, 99) <= 200.0))
    return holds


def test_with_a_warm_up_of_forty_the_lab_answers_32_clients_not_17(tmp_path):
    """The lab's search: 17 clients (18 fail), set by the opening wave. Leaving out each probe's
    first 40 requests sent (all of the wave up to 40 clients), the brute force holds up to 32
    clients and fails from 33 to 40; the search finds that boundary, by count or by share."""
    holds = _brute_force(tmp_path, 40, range(1, 41))
    boundary = holds.index(False)  # the first client count (less one) that fails
    assert holds == [True] * boundary + [False] * (40 - boundary) and boundary == 32
    path = tmp_path / "closed.toml"
    search = '[search]\nkey = "workload.clients"\nlow = 1\nhigh = 256\nconstraint = "ttft_ms.p99 <= 200"\n'
    path.write_text(CLOSED + search)
    plain = run_experiment(load(path)).studies[0].search
    assert (plain.value, plain.failing) == (17, 18)
    for warmup in ("40", "0.1"):
        outcome = run_experiment(load(path, [f"search.warmup={warmup}"])).studies[0].search
        assert (outcome.value, outcome.failing) == (boundary, boundary + 1)
        answer = outcome.payload
        assert answer.meta["warmup"] == (40 if warmup == "40" else 0.1)
        assert answer.metrics["warmup"]["requests"] == 40 and answer.metrics["requests"] == 400
        assert ("at the answer the percentiles and slo.attainment leave out the first 40 of 400 requests sent "
                f"(search.warmup = {warmup})") in outcome.message
        assert "opening wave" not in outcome.message


def test_the_opening_wave_note_names_the_warm_up_as_a_way_out(tmp_path):
    """Without a warm-up the note offers one as big as the wave; with one too small for it (18 of
    the 23 clients at 23), it asks for more."""
    lab = run_experiment(load(LAB, ["experiment.reports=[]"])).study("tune").search.message
    assert ("leave the warm-up out of the statistics (search.warmup = 18 or more: each run's first requests sent, "
            "a count or a share such as 0.1), spread the clients' starts (workload.stagger_ms)") in lab
    small = run_experiment(load(LAB, ["experiment.reports=[]", "runs.tune.search.warmup=18"])).study("tune").search
    assert (small.value, small.failing) == (22, 23)
    assert ("at workload.clients = 23 all 5 TTFTs at or above the p99 are the opening wave's (23 clients sending at "
            "once at t = 0 ms)") in small.message
    assert "raise search.warmup (= 18: the first 18 requests sent) to 23 or more" in small.message


def _values_run(ttft, sent, warmup):
    n = len(ttft)
    sent = np.asarray(sent, float)
    first = sent + np.asarray(ttft, float)
    zeros = np.zeros(n, dtype=np.int64)
    req = {"id": np.arange(n), "rejected": zeros, "timed_out": zeros, "aborted": zeros, "arrival_ms": sent,
           "sent_ms": sent, "first_scheduled_ms": sent, "first_token_ms": first, "finish_ms": first + 90.0,
           "generated_tokens": np.full(n, 10)}
    metrics = {"requests": n, "finished": n, "rejected": 0, "timed_out": 0, "aborted": 0, "peak_running": 1,
               "ttft_ms": {"p99": 1.0}}
    return SimpleNamespace(metrics=metrics, requests=req, rows_file=None, meta={"warmup": warmup},
                           settings={"workload": {"kind": "closed_loop"}}, replicas=[], intervals={})


def test_the_notes_read_the_measured_values_only():
    """Hand-built: 40 requests, the 4 sent at t = 0 waiting 150 ms, the rest 20 ms. With a warm-up
    of 4 the tail is no wave's; the p99 of 60 values (of 70, 10 left out) rests on the two largest."""
    sent = np.concatenate([np.zeros(4), 10.0 * np.arange(1, 37)])
    ttft = np.concatenate([np.full(4, 150.0), np.full(36, 20.0)])
    outcome = lambda run: SearchOutcome("found", 17, run, 18, [Probe(17, True, run), Probe(18, False, run)], "m")  # noqa: E731
    assert "opening wave" in answer_caveats(outcome(_values_run(ttft, sent, 0)), TTFT)
    assert "opening wave" not in answer_caveats(outcome(_values_run(ttft, sent, 4)), TTFT)
    assert "opening wave" in answer_caveats(outcome(_values_run(ttft, sent, 3)), TTFT)  # one of the wave is left
    few = _values_run(np.arange(70.0), 10.0 * np.arange(70), 10)
    assert "the p99 of 60 TTFTs: the largest two" in answer_caveats(outcome(few), TTFT)


# -- replicas, partitions, and the default ------------------------------------------------------------------

SMALL = """
[experiment]
name = "small"
reports = []
{experiment}
[workload]
kind = "synthetic"
num_requests = 60
rate = 20.0
prompt = {{dist = "uniform", low = 100, high = 2000}}
output = {{dist = "fixed", value = 20}}
[cost_model]
kind = "linear"
prefill_ms_per_token = 0.05
decode_ms_per_step = 8.0
[scheduler]
kind = "continuous"
{cluster}
[search]
key = "workload.rate"
low = 1.0
high = 200.0
tolerance = 1.0
constraint = "ttft_ms.p99 <= 150"
{warmup}
"""


def _small(tmp_path, *, experiment="", cluster="", warmup="", overrides=()):
    path = tmp_path / "small.toml"
    path.write_text(SMALL.format(experiment=experiment, cluster=cluster, warmup=warmup))
    return run_experiment(load(path, list(overrides))).studies[0]


def test_the_default_leaves_every_result_as_it_was(tmp_path):
    """``warmup = 0`` is no warm-up: the summary is the same to the byte as a search without the
    key, and has no ``warmup`` anywhere."""
    import json

    plain = summary_dict(SimpleNamespace(name="small", source="s", studies=[_small(tmp_path)], settings={}))
    zero = summary_dict(SimpleNamespace(name="small", source="s", studies=[_small(tmp_path, warmup="warmup = 0")],
                                        settings={}))
    assert json.dumps(plain, sort_keys=True) == json.dumps(zero, sort_keys=True)
    assert '"warmup"' not in json.dumps(plain)


def test_replicated_probes_each_leave_their_warm_up_out(tmp_path):
    study = _small(tmp_path, experiment="replicas = 2", warmup="warmup = 10")
    answer = study.search.payload
    assert answer.meta["warmup"] == 10 and len(answer.replicas) == 2
    for replica in answer.replicas:
        assert replica.metrics["warmup"]["requests"] == 10 and replica.meta["warmup"] == 10
    assert answer.metrics["warmup"]["measured"] == 50
    assert "leave out the first 10 of 60 requests sent (search.warmup = 10)" in study.search.message


def test_a_partitioned_probe_leaves_out_the_same_requests_as_a_whole_one(tmp_path):
    cluster = '[cluster]\ninstances = 2\nrouter = {kind = "round_robin"}'
    whole = _small(tmp_path, cluster=cluster, warmup="warmup = 0.25")
    split = _small(tmp_path, cluster=cluster + "\npartitions = 2", warmup="warmup = 0.25")
    assert split.search.payload.meta["partitions"] == 2
    assert (split.search.value, split.search.failing) == (whole.search.value, whole.search.failing)
    a, b = whole.search.payload.metrics, split.search.payload.metrics
    assert b["warmup"] == a["warmup"] and a["warmup"]["requests"] == 15
    for name in ("ttft_ms", "tpot_ms", "slo") if "slo" in a else ("ttft_ms", "tpot_ms"):
        for key, value in a[name].items():
            assert b[name][key] == pytest.approx(value, rel=1e-9), (name, key)
    assert b["throughput_tps"] == pytest.approx(a["throughput_tps"], rel=1e-9)


def test_a_partitioned_probe_whose_warm_up_leaves_out_every_request_is_refused(tmp_path):
    """Each part of a probe may hold fewer requests than the warm-up (it is not checked alone);
    the merged run may not: 60 requests sent, a warm-up of 60 leaves none to measure. (It ran on
    with NaN statistics.)"""
    cluster = '[cluster]\ninstances = 2\nrouter = {kind = "round_robin"}\npartitions = 2'
    with pytest.raises(ConfigError) as err:
        _small(tmp_path, cluster=cluster, warmup="warmup = 60")
    assert str(err.value) == (f"{tmp_path / 'small.toml'}: run 'small[rate=1.0]': [search] warmup = 60 leaves out all "
                              "60 of the run's requests, so none is measured: a smaller warmup (a share below 1, "
                              "such as 0.1), or more requests")
    assert _small(tmp_path, cluster=cluster, warmup="warmup = 59").search.payload.metrics["warmup"]["measured"] == 1


# -- messages ---------------------------------------------------------------------------------------------

TWO_RUNS = CLOSED.replace("num_requests = 400", "num_requests = 20") + textwrap.dedent("""
    [[runs]]
    name = "plain"
    [[runs]]
    name = "tune"
    search = {key = "workload.clients", low = 1, high = 8, constraint = "ttft_ms.p99 <= 200"WARMUP}
    """)


def _load(tmp_path, warmup="", overrides=(), text=TWO_RUNS):
    path = tmp_path / "two.toml"
    path.write_text(text.replace("WARMUP", warmup))
    return load(path, list(overrides))


BAD = "[[runs]] 'tune' [search]: warmup: must be a whole number of requests from 0 to 10,000,000 (warmup = 40) or " \
      "a share of each run's requests below 1 (warmup = 0.1), got "


@pytest.mark.parametrize("value, said", [
    ("1.5", "1.5"), ("40.0", "40.0 (a count is a whole number: warmup = 40)"), ("-1", "-1"), ("-0.5", "-0.5"),
    ("true", "True"), ('"10%"', "'10%'"), ("nan", "nan"), ("inf", "inf"), ("10000001", "10000001"),
])
def test_a_bad_warm_up_is_named_with_file_table_and_key(tmp_path, value, said):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f", warmup = {value}")
    assert str(err.value) == f"{tmp_path / 'two.toml'}: {BAD}{said}"
    with pytest.raises(ConfigError) as err:  # the same from --set, which it names
        _load(tmp_path, overrides=[f"runs.tune.search.warmup={value}"])
    assert str(err.value).startswith(f"{tmp_path / 'two.toml'}: {BAD}{said}")
    assert str(err.value).endswith(f"(from --set {shlex.quote(f'runs.tune.search.warmup={value}')})")


def test_good_warm_ups_load(tmp_path):
    for value in ("0", "40", "0.1", "0.0", "0.999"):
        study = _load(tmp_path, f", warmup = {value}").studies[1]
        assert study.search.warmup == (float(value) if "." in value else int(value))


def test_a_warm_up_of_every_request_is_refused_when_it_runs(tmp_path):
    exp = _load(tmp_path, ", warmup = 20")
    with pytest.raises(ConfigError) as err:
        run_experiment(exp)
    assert str(err.value) == (f"{tmp_path / 'two.toml'}: run 'tune[clients=1]': [search] warmup = 20 leaves out all "
                              "20 of the run's requests, so none is measured: a smaller warmup (a share below 1, "
                              "such as 0.1), or more requests")


def test_a_warm_up_needs_every_row(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    exp = _load(tmp_path, ", warmup = 0.1", ["experiment.exact_requests=10"])
    with pytest.raises(ConfigError) as err:
        run_experiment(exp)
    assert str(err.value) == (f"{tmp_path / 'two.toml'}: run 'tune[clients=1]': [search] warmup = 0.1 needs every "
                              "request's row, and this run of 20 requests streamed them past [experiment] "
                              "exact_requests: raise exact_requests to 20 or more, or leave warmup out")


KEYS = "valid keys: constraint, constraints, cooldown, high, key, low, maximize, tolerance, warmup"


def test_replicas_in_a_search_point_to_the_run_and_the_experiment(tmp_path):
    """``replicas`` is a ``[[runs]]`` entry's key (or ``[experiment]``'s): the search's probes
    take the run's; in ``[search]`` it is refused with where it goes."""
    source = tmp_path / "two.toml"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, ", replicas = 3")
    assert str(err.value) == (
        f"{source}: [[runs]] 'tune' [search]: unknown key 'replicas'; replicas are the run's, not the search's: "
        "replicas = 3 in the [[runs]] entry, beside its search, or in [experiment] for every run (--set "
        f"experiment.replicas=3); each probe then runs 3 seeds and the search tests their mean; {KEYS}")
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, overrides=["runs.tune.search.replicas=3"])
    assert str(err.value).startswith(f"{source}: [[runs]] 'tune' [search]: unknown key 'replicas' (from --set "
                                     "runs.tune.search.replicas=3); replicas are the run's")
    # a file of one run, its [search] at the top level: [experiment] it is
    top = CLOSED.replace("num_requests = 400", "num_requests = 20") + \
        '[search]\nkey = "workload.clients"\nlow = 1\nhigh = 8\nconstraint = "ttft_ms.p99 <= 200"\nreplicas = 0\n'
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text=top)
    assert str(err.value) == (
        f"{source}: [search]: unknown key 'replicas'; replicas are the run's, not the search's: replicas = N in "
        "[experiment] (--set experiment.replicas=N); each probe then runs N seeds and the search tests their mean; "
        f"{KEYS}")
    # where they go, they replicate the search's probes
    study = _load(tmp_path, overrides=["experiment.replicas=2"]).studies[1]
    assert study.replicas == 2
