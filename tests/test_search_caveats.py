"""What a search's answer says about itself (review slo_search F1-F7): requests that timed out or
were aborted, a quantile over too few values, an answer set by a closed loop's opening wave, the
engine's TTFT constrained where a front end stands before it, the noise of one draw or of
replicas, tune.txt's bounds, and a float search stopping at its tolerance.

Most cases are hand-built runs handed to :func:`answer_caveats` (so each count is known), and a
few are small simulations checking the runs really carry what the caveats read.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from schedlab.cli import main
from schedlab.study.caveats import answer_caveats
from schedlab.study.experiment import load, run_experiment
from schedlab.study.search import Probe, SearchOutcome, parse_constraint, search
from schedlab_plugins.reports.lab import LabReport

LAB = Path(__file__).resolve().parent.parent / "experiments" / "lab.toml"


def linear_toml(name: str, reports: str = "[]", *, requests: int = 1, prompt: int = 10, output: int = 3,
                prefill_ms: float = 1.0, rest: str = "") -> str:
    """An experiment of ``requests`` synthetic requests sent at once to the continuous scheduler on
    the linear cost model (``prefill_ms`` a prompt token, 8 ms a decode step), then ``rest`` (more
    scheduler keys first, then further tables)."""
    return f"""
[experiment]
name = "{name}"
reports = {reports}
[workload]
kind = "synthetic"
num_requests = {requests}
prompt = {{dist = "fixed", value = {prompt}}}
output = {{dist = "fixed", value = {output}}}
arrival = "all-at-once"
[cost_model]
kind = "linear"
prefill_ms_per_token = {prefill_ms}
decode_ms_per_step = 8.0
[scheduler]
kind = "continuous"
{rest}"""


def _requests(ttft, *, sent=None, generated=10, timed_out=None):
    """Rows of requests that arrive at ``sent`` (default 0, 10, 20, ...) and have the TTFTs given."""
    ttft = np.asarray(ttft, dtype=float)
    n = ttft.size
    sent = np.arange(n) * 10.0 if sent is None else np.asarray(sent, dtype=float)
    first = sent + ttft
    zeros = np.zeros(n, dtype=np.int64)
    return {"id": np.arange(n), "rejected": zeros.copy(),
            "timed_out": zeros.copy() if timed_out is None else np.asarray(timed_out, dtype=np.int64),
            "aborted": zeros.copy(), "arrival_ms": sent, "sent_ms": sent, "first_scheduled_ms": sent,
            "first_token_ms": first, "finish_ms": first + 90.0, "generated_tokens": np.full(n, generated),
            "client_first_ms": first, "client_done_ms": first + 90.0}


def _run(metrics, requests=None, *, settings=None, replicas=(), intervals=None):
    return SimpleNamespace(metrics=metrics, requests=requests if requests is not None else {}, rows_file=None,
                           settings=settings or {}, replicas=list(replicas), intervals=intervals or {})


def _metrics(requests: dict, **extra):
    """The counts and TTFT p99 of hand-built rows (as the run's metrics would have them)."""
    ok = (requests["rejected"] == 0) & (requests["timed_out"] == 0)
    ttft = (requests["first_token_ms"] - requests["arrival_ms"])[ok]
    out = {"requests": int(requests["id"].size), "finished": int(ok.sum()), "rejected": 0, "timed_out": 0,
           "aborted": 0, "peak_running": 1,
           "ttft_ms": {"p99": float(np.percentile(ttft, 99)) if ttft.size else float("nan")}}
    out.update(extra)
    return out


def _found(answer, failing, *, value=17, fails=18):
    return SearchOutcome("found", value, answer, fails, [Probe(value, True, answer), Probe(fails, False, failing)],
                         "largest workload.clients with ttft_ms.p99 <= 200: 17 (18 fails)")


TTFT = [parse_constraint("ttft_ms.p99 <= 200")]


# -- F3: requests whose clients gave up ------------------------------------------------------------


def test_timed_out_and_aborted_requests_at_the_answer_are_named_with_their_counts():
    """The review's 20 s timeout: 828 of 1,200 requests timed out (all aborted by the engine); it
    said nothing, as only ``rejected`` was checked."""
    metrics = {"requests": 1200, "finished": 372, "rejected": 0, "timed_out": 828, "aborted": 828, "peak_running": 1,
               "ttft_ms": {"p99": 50.0}}
    outcome = _found(_run(metrics), None)
    text = answer_caveats(outcome, TTFT)
    assert text == ('at the answer 828 of 1,200 requests timed out, 828 of them aborted by the engine (percentiles '
                    'count finished ones: add "timed_out <= 0" to count them, or constrain slo.attainment, which '
                    'counts them as misses)')
    # rejected ones too, each named with its count
    both = answer_caveats(_found(_run(dict(metrics, rejected=5)), None), TTFT)
    assert both.startswith("at the answer 5 of 1,200 requests were rejected and 828 of 1,200 requests timed out, "
                           "828 of them aborted by the engine")
    assert '"rejected <= 0" or "timed_out <= 0"' in both
    # a constraint that counts them: nothing to add
    metrics["slo"] = {"attainment": 0.31}
    for counted in ("timed_out <= 0", "finished >= 1200", "slo.attainment >= 0.3"):
        assert "timed out" not in answer_caveats(outcome, TTFT + [parse_constraint(counted)])


def test_replicated_counts_are_means_and_are_checked_too():
    """A replicated run's counts are means (floats): they were skipped (``_count`` wanted ints)."""
    metrics = {"requests": 40, "finished": 27.5, "rejected": 12.5, "timed_out": 0, "aborted": 0, "peak_running": 30.5,
               "ttft_ms": {"p99": 50.0}}
    replicas = [_run({}), _run({})]
    text = answer_caveats(_found(_run(metrics, replicas=replicas), None), TTFT)
    assert "at the answer (mean of 2 replicas) 12.5 of 40 requests were rejected" in text
    assert "at the answer up to 30.5 of 40 requests ran at once" in text


UNSTABLE = {"verdict": "unstable", "reason": "waiting grows 180 requests/min", "arrival_rps": 16.5,
            "capacity_rps": 13.4}


@pytest.mark.parametrize("stability, said", [
    (UNSTABLE, "at the answer the run is unstable: waiting grows 180 requests/min (arrivals 16.5/s, capacity "
               "13.4/s): its percentiles say how long the run lasted, not what the server sustains (more requests "
               "would show it)"),
    (dict(UNSTABLE, verdict="inconclusive", reason="too short to tell"),
     "at the answer the run is inconclusive: too short to tell (arrivals 16.5/s, capacity 13.4/s): if it is "
     "overloaded, its percentiles say how long the run lasted, not what the server sustains (more requests would "
     "show it)"),
    ({"verdict": "stable", "reason": "waiting flat"}, "")])
def test_an_answer_whose_run_is_overloaded_says_so(stability, said):
    """Capacity review s79 (high): 150 requests a probe certified 17.75 req/s where the run's own stability line
    put capacity at 13.4/s -- the answer's caveats never read the verdict the table marks with '!'."""
    outcome = _found(_run({"requests": 150, "finished": 150, "rejected": 0, "timed_out": 0, "aborted": 0,
                           "peak_running": 16, "ttft_ms": {"p99": 150.0}, "stability": stability}), None)
    assert answer_caveats(outcome, TTFT) == said


def test_a_real_run_with_a_client_timeout_says_how_many_timed_out(tmp_path):
    """40 requests at once, each needing 200 prompt tokens and 30 decode steps of >= 8 ms on the
    linear cost model, 4 at a time: the later ones wait past the client's 300 ms and give up."""
    path = tmp_path / "t.toml"
    path.write_text(linear_toml("t", requests=40, prompt=200, output=30, prefill_ms=0.05, rest=textwrap.dedent("""
        max_num_seqs = 4
        [client]
        timeout_ms = 300
        [search]
        key = "cost_model.base_ms"
        low = 0
        high = 4
        constraint = "ttft_ms.p99 <= 1e9"
        """)))
    study = run_experiment(load(path)).studies[0]
    m = study.search.payload.metrics
    assert m["timed_out"] > 0 and m["rejected"] == 0
    assert f"at the answer {m['timed_out']} of 40 requests timed out" in study.search.message


# -- F4: a quantile over too few values ------------------------------------------------------------


def test_a_p99_of_fifty_values_is_said_to_rest_on_the_largest_two():
    """numpy's p99 of 50 values sits at rank 49 x 0.99 = 48.51: between the two largest."""
    rows = _requests(np.arange(50.0))
    failing = _requests(np.arange(49.0) + 1)
    outcome = _found(_run(_metrics(rows), rows), _run(_metrics(failing), failing))
    assert ("ttft_ms.p99 rests on few values (at the answer the p99 of 50 TTFTs: the largest two; at "
            "workload.clients = 18 the p99 of 49 TTFTs: the largest two); a p99 needs 100 or more") in \
        answer_caveats(outcome, TTFT, key="workload.clients")
    assert "at 18 the p99 of 49 TTFTs" in answer_caveats(outcome, TTFT)  # without the key: the value alone


def test_the_sample_counts_finished_requests_only():
    """1,200 requests of which 2 finished (the review's 3 s timeout): a p99 of 2 TTFTs."""
    rows = _requests(np.full(1200, 50.0), timed_out=[0, 0] + [1] * 1198)
    metrics = _metrics(rows, timed_out=1198, aborted=1198)
    text = answer_caveats(_found(_run(metrics, rows), None), TTFT)
    assert "at the answer the p99 of 2 TTFTs: the largest two" in text


@pytest.mark.parametrize("n, constraint, said", [
    (99, "ttft_ms.p99 <= 200", "the p99 of 99 TTFTs: the largest two"),
    (100, "ttft_ms.p99 <= 200", None),               # 100 / (100 - 99) = 100 values: enough
    (19, "ttft_ms.p95 <= 200", "the p95 of 19 TTFTs: the largest two"),    # rank 18 x 0.95 = 17.1
    (20, "ttft_ms.p95 <= 200", None),
    (25, "tpot_ms.p99 <= 200", "the p99 of 25 TPOTs: the largest two"),
    (25, "ttft_ms.max <= 200", None),                # no quantile
])
def test_the_needed_sample_is_one_over_one_minus_q(n, constraint, said):
    total = max(n, 20)  # (runs of fewer than 20 requests are left alone: 19 finished of 20 here)
    rows = _requests(np.arange(float(total)), timed_out=[0] * n + [1] * (total - n))
    metrics = _metrics(rows, tpot_ms={"p99": 1.0}, ttft_ms={"p99": 1.0, "p95": 1.0, "max": 1.0})
    text = answer_caveats(_found(_run(metrics, rows), None), [parse_constraint(constraint)])
    if said is None:
        assert "rests on few values" not in text
    else:
        assert said in text


def test_the_lab_on_fifty_requests_says_its_p99_is_the_largest_two():
    """The review's run: num_requests = 50 gave 17 (18 fails) and nothing else; tune.txt is as it was."""
    results = run_experiment(load(LAB, ["runs.tune.workload.num_requests=50"]))
    study = results.study("tune")
    assert (study.search.value, study.search.failing) == (17, 18)
    assert "at the answer and at workload.clients = 18 the p99 of 50 TTFTs: the largest two" in study.search.message
    assert LabReport().artifacts(results)["tune.txt"] == \
        "target_ttft_ms=200 max_concurrency=17 throughput_at_target=1327.1992\n"


# -- F1: the opening wave of a closed loop ---------------------------------------------------------

CLOSED = {"workload": {"kind": "closed_loop", "clients": 4, "num_requests": 40}}


def _wave(first_ttft: float):
    """40 requests of 4 clients: the 4 sent together at t = 0 wait ``first_ttft`` ms for their
    first token, the 36 sent later (10, 20, ... ms) 20 ms each."""
    sent = np.concatenate([np.zeros(4), 10.0 * np.arange(1, 37)])
    return _requests(np.concatenate([np.full(4, first_ttft), np.full(36, 20.0)]), sent=sent)


def test_an_answer_set_by_the_opening_wave_says_so():
    """The p99 of 40 values (rank 38.61) lies among the 4 equal largest: the wave's 150 ms."""
    rows = _wave(150.0)
    run = _run(_metrics(rows), rows, settings=CLOSED)
    text = answer_caveats(_found(run, run), TTFT, key="workload.clients")
    assert ("at workload.clients = 18 all 4 TTFTs at or above the p99 are the opening wave's (4 clients sending at "
            "once at t = 0 ms): the answer is set by the start-up burst (as vllm bench serve --max-concurrency "
            "measures it), not by steady serving") in text
    assert "workload.stagger_ms" in text


def test_a_wave_at_the_answer_only_is_said_of_the_answers_quantile():
    """4,000 requests in the lab: 33 clients fail in steady serving (more than max_num_seqs), while
    the answer's own p99 is still its opening wave's -- not what set the answer, but what its p99 is."""
    answer, failing = _wave(150.0), _wave(5.0)
    text = answer_caveats(_found(_run(_metrics(answer), answer, settings=CLOSED),
                                 _run(_metrics(failing), failing, settings=CLOSED)), TTFT)
    assert ("at the answer all 4 TTFTs at or above the p99 are the opening wave's (4 clients sending at once at "
            "t = 0 ms): the answer's ttft_ms.p99 is set by the start-up burst") in text


@pytest.mark.parametrize("settings, first", [
    (CLOSED, 5.0),                                     # the wave is fast: the tail is elsewhere
    ({"workload": dict(CLOSED["workload"], stagger_ms=200)}, 150.0),   # starts spread
    ({"workload": {"kind": "synthetic", "rate": 5}}, 150.0),           # no closed loop
])
def test_no_burst_note_when_the_tail_is_not_the_wave(settings, first):
    rows = _wave(first)
    run = _run(_metrics(rows), rows, settings=settings)
    assert "opening wave" not in answer_caveats(_found(run, run), TTFT)


def test_the_lab_answer_is_the_opening_burst_and_staggered_starts_are_not(tmp_path):
    """The lab's failing probe (18 clients): its largest TTFTs are all of requests 0-17, sent at
    t = 0 (the review found the same at 17). With stagger_ms = 200 the note goes."""
    results = run_experiment(load(LAB))
    study = results.study("tune")
    failing = next(p.payload for p in study.search.probes if p.value == study.search.failing)
    req = failing.requests
    ttft = req["first_token_ms"] - req["arrival_ms"]
    top = req["id"][ttft >= np.percentile(ttft, 99)]
    assert (study.search.value, study.search.failing) == (17, 18) and top.max() < 18
    assert f"at workload.clients = 18 all {top.size} TTFTs at or above the p99 are the opening wave's (18 clients" \
        in study.search.message
    staggered = run_experiment(load(LAB, ["runs.tune.workload.stagger_ms=200"])).study("tune")
    assert "opening wave" not in staggered.search.message


# -- F5: the engine's TTFT behind a front end ------------------------------------------------------


def test_a_front_end_run_constrained_on_the_engines_ttft_points_to_the_clients():
    rows = _requests(np.full(10, 10.0))
    run = _run(_metrics(rows), rows, settings={"frontend": {}})
    text = answer_caveats(_found(run, run), TTFT + [parse_constraint("e2e_ms.p90 <= 900")])
    assert ("the run has a [frontend] and ttft_ms, e2e_ms are the engine's (from the request's arrival at its "
            "queue); vllm bench serve reports the client's, client.ttft_ms, client.e2el_ms") in text
    assert "[frontend]" not in answer_caveats(_found(run, run), [parse_constraint("client.ttft_ms.p99 <= 200")])
    plain = _run(_metrics(rows), rows)
    assert "[frontend]" not in answer_caveats(_found(plain, plain), TTFT)


def test_a_real_front_end_run_carries_its_table(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text(linear_toml("f", rest=textwrap.dedent("""
        [frontend]
        [search]
        key = "cost_model.base_ms"
        low = 0
        high = 60
        constraint = "ttft_ms.p99 <= 40"
        """)))
    message = run_experiment(load(path)).studies[0].search.message
    assert "the run has a [frontend] and ttft_ms is the engine's" in message and "client.ttft_ms" in message


# -- F2: noise ---------------------------------------------------------------------------------------


def test_replicas_give_the_interval_at_the_answer_and_the_failing_value():
    """The review's seed 0 with 5 replicas: 498.4 [428, 568] at 4.9, 508.7 [437, 580] at 5."""
    answer = _run({"requests": 1200, "ttft_ms": {"p99": 498.4}}, replicas=[_run({})] * 5,
                  intervals={"ttft_ms.p99": [428.3, 568.4]})
    failing = _run({"requests": 1200, "ttft_ms": {"p99": 508.7}}, replicas=[_run({})] * 5,
                   intervals={"ttft_ms.p99": [437.5, 579.8]})
    outcome = _found(answer, failing, value=4.9, fails=5.0)
    text = answer_caveats(outcome, [parse_constraint("ttft_ms.p99 <= 500")], key="workload.rate")
    assert text == ("ttft_ms.p99 over 5 replicas, mean [95% interval]: 498.4 [428.3, 568.4] at the answer, "
                    "508.7 [437.5, 579.8] at workload.rate = 5: within noise (an interval holds 500)")
    # intervals clear of the threshold: the figures, without "within noise"
    answer.intervals["ttft_ms.p99"] = [450.0, 480.0]
    failing.intervals["ttft_ms.p99"] = [520.0, 540.0]
    text = answer_caveats(outcome, [parse_constraint("ttft_ms.p99 <= 500")])
    assert "450 [450, 480]" not in text and "[450, 480] at the answer" in text and "within noise" not in text


def test_replicated_search_runs_report_their_intervals(tmp_path):
    """A real replicated search: the message quotes the combined runs' own intervals."""
    path = tmp_path / "r.toml"
    path.write_text(textwrap.dedent("""
        [experiment]
        name = "r"
        reports = []
        replicas = 3
        [workload]
        kind = "synthetic"
        num_requests = 60
        rate = 20.0
        prompt = {dist = "uniform", low = 100, high = 2000}
        output = {dist = "fixed", value = 20}
        [cost_model]
        kind = "linear"
        prefill_ms_per_token = 0.05
        decode_ms_per_step = 8.0
        [scheduler]
        kind = "continuous"
        [search]
        key = "workload.rate"
        low = 1.0
        high = 200.0
        tolerance = 1.0
        constraint = "ttft_ms.p99 <= 150"
        """))
    study = run_experiment(load(path)).studies[0]
    outcome = study.search
    assert outcome.status == "found"
    answer = outcome.payload
    low, high = answer.intervals["ttft_ms.p99"]
    assert "ttft_ms.p99 over 3 replicas, mean [95% interval]: " in outcome.message
    assert f"[{low:.4g}, {high:.4g}] at the answer" in outcome.message


@pytest.mark.parametrize("p99, said", [(198.9, True), (190.0, True), (189.9, False)])
def test_one_draw_close_to_the_target_says_replicas_give_its_spread(p99, said):
    """Within 5% of 200 (190 to 210) at the answer: one draw could have landed either side."""
    answer = _run({"requests": 400, "ttft_ms": {"p99": p99}})
    text = answer_caveats(_found(answer, None), TTFT)
    assert ("one draw: at the answer ttft_ms.p99 = " in text) is said
    if said:
        assert "replicas = 3" in text and "vLLM's sweep runs 3 per point" in text


def test_one_draw_notes_leave_toy_runs_alone():
    """A run of a few requests (hand-computed tests: one request of fixed lengths) is no draw."""
    answer = _run({"requests": 1, "ttft_ms": {"p99": 199.0}})
    assert answer_caveats(_found(answer, None), TTFT) == ""


# -- F6: tune.txt's bounds -------------------------------------------------------------------------

TUNE = linear_toml("tl", '["lab"]', rest="""[[runs]]
name = "tune"
search = { key = "cost_model.base_ms", low = 1, high = 8, constraint = "CONSTRAINT" }
""")


@pytest.mark.parametrize("constraint, tune, said", [
    # TTFT = 10 + b ms: holds at b = 8, the top of the range
    ("ttft_ms.p99 <= 100", "target_ttft_ms=100 max_concurrency=8 throughput_at_target=",
     "schedlab: lab report: tune.txt's max_concurrency=8 is a lower bound: ttft_ms.p99 <= 100 holds up to the top "
     "of the search's range (cost_model.base_ms = 8); raise high to find the boundary"),
    # fails at b = 1 already (TTFT 11)
    ("ttft_ms.p99 <= 5", "target_ttft_ms=5 max_concurrency=0 throughput_at_target=0\n",
     "schedlab: lab report: tune.txt's max_concurrency=0 means none: ttft_ms.p99 <= 5 fails even at the bottom of "
     "the search's range (cost_model.base_ms = 1)"),
    ("ttft_ms.p99 <= 15", "target_ttft_ms=15 max_concurrency=5 throughput_at_target=", None),  # found: 5
])
def test_the_lab_report_says_when_tune_txt_holds_a_bound(tmp_path, capsys, constraint, tune, said):
    path = tmp_path / "lab.toml"
    path.write_text(TUNE.replace("CONSTRAINT", constraint))
    main(["run", str(path), "--out", str(tmp_path / "out"), "--jobs", "1"])
    assert (tmp_path / "out" / "tune.txt").read_text().startswith(tune)
    lines = [line for line in capsys.readouterr().err.splitlines() if "tune.txt's" in line]
    assert lines == ([said] if said else [])


# -- F7: a float search stops at its tolerance -----------------------------------------------------


def test_a_float_search_stops_at_a_bracket_as_wide_as_its_tolerance():
    """4.4 - 4.3 = 0.10000000000000053 > 0.1: it bisected once more, to 4.35 (seeds 2, 6, 7)."""
    outcome = search(lambda v: (v <= 4.37, None), low=1.0, high=20.0, integer=False, tolerance=0.1,
                     key="workload.rate", constraint_text="c")
    assert [p.value for p in outcome.probes] == [1.0, 1.1, 1.3, 1.7, 2.5, 4.1, 7.3, 5.7, 4.9, 4.5, 4.3, 4.4]
    assert (outcome.value, outcome.failing) == (4.3, 4.4)
    assert outcome.message == "largest workload.rate with c: 4.3 (4.4 fails)"
