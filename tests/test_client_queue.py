"""A capped client's wait for a slot (``vllm bench serve --max-concurrency``'s ``client_queue_time``):
kept per request (``due_ms``), summarised as ``client.queue_ms`` and ``client.e2el_incl_queue_ms``,
written to requests.csv, and counted by the stability verdict -- a backlog at the client is a
backlog, though the server only ever sees the cap."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from schedlab.study.experiment import load, run_experiment

#: Three requests due 1 ms apart, one slot: each is sent when the previous one's last token is back.
HAND = """
[experiment]
name = "hand"
engine = "{engine}"
[workload]
kind = "synthetic"
num_requests = 3
arrival = "constant"
rate = 1000
max_concurrency = 1
prompt = {{ dist = "fixed", value = 100 }}
output = {{ dist = "fixed", value = 3 }}
[scheduler]
kind = "vllm"
max_num_seqs = 8
[cost_model]
kind = "linear"
prefill_ms_per_token = 0.04
decode_ms_per_step = 6.0
"""


def run(tmp_path, text, name="t"):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return run_experiment(load(path)).all_runs()[0]


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_the_wait_for_a_slot_by_hand(tmp_path, engine):
    """Each request: 100 prompt tokens at 0.04 ms (4 ms to the first token), two decode steps of
    6 ms: 16 ms in the server. Due at 0, 1 and 2 ms, sent at 0, 16 and 32: waits 0, 15, 30 ms,
    and latencies including the wait 16, 31, 46 ms."""
    r = run(tmp_path, HAND.format(engine=engine), engine)
    req = r.requests
    np.testing.assert_allclose(req["due_ms"], [0.0, 1.0, 2.0])
    np.testing.assert_allclose(req["sent_ms"], [0.0, 16.0, 32.0])
    np.testing.assert_allclose(req["finish_ms"], [16.0, 32.0, 48.0])
    queue = r.metrics["client"]["queue_ms"]
    assert queue["mean"] == pytest.approx(15.0) and queue["max"] == pytest.approx(30.0)
    assert r.metrics["client"]["e2el_incl_queue_ms"]["mean"] == pytest.approx((16 + 31 + 46) / 3)
    # the client's TTFT counts from sending, as vllm bench serve's does
    assert r.metrics["client"]["ttft_ms"]["max"] == pytest.approx(4.0)


def test_an_uncapped_client_never_waits(tmp_path):
    r = run(tmp_path, HAND.format(engine="fast").replace("max_concurrency = 1\n", ""))
    np.testing.assert_array_equal(r.requests["due_ms"], r.requests["sent_ms"])
    assert r.metrics["client"]["queue_ms"]["max"] == 0.0


OVERLOADED = """
[experiment]
name = "over"
[workload]
kind = "synthetic"
num_requests = 60
arrival = "constant"
rate = 50
{cap}
prompt = {{ dist = "fixed", value = 400 }}
output = {{ dist = "fixed", value = 20 }}
[scheduler]
kind = "vllm"
max_num_seqs = 4
[cost_model]
kind = "linear"
prefill_ms_per_token = 0.04
decode_ms_per_step = 6.0
"""


def test_a_capped_client_falling_behind_is_unstable(tmp_path):
    """60 requests due at 50/s against a server of about 10/s: without a cap the engine's queue
    grows; with a cap of 2 it is the client's that grows, and the run is just as unstable (it
    read 'stable' from the send times, at the server's own pace)."""
    free = run(tmp_path, OVERLOADED.format(cap=""), "free")
    capped = run(tmp_path, OVERLOADED.format(cap="max_concurrency = 2"), "capped")
    assert free.metrics["stability"]["verdict"] == "unstable"
    assert capped.metrics["stability"]["verdict"] == "unstable"
    assert capped.metrics["stability"]["arrival_rps"] == pytest.approx(50.0)
    # the server never sees more than 2, so its own TTFT stays short while the wait grows
    assert capped.metrics["client"]["ttft_ms"]["p99"] < 100 < capped.metrics["client"]["queue_ms"]["p99"]


def test_requests_csv_has_the_wait_and_reads_back(tmp_path, capsys):
    from schedlab.cli import main
    from schedlab.results.storage import load

    path = tmp_path / "hand.toml"
    path.write_text(HAND.format(engine="fast").replace('name = "hand"', 'name = "hand"\nreports = ["json"]'))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "requests.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(row["client_queue_ms"]) for row in rows] == [0.0, 15.0, 30.0]
    assert [float(row["due_ms"]) for row in rows] == [0.0, 1.0, 2.0]
    again = load(tmp_path / "out").all_runs()[0]
    np.testing.assert_allclose(again.requests["due_ms"], [0.0, 1.0, 2.0])


def test_the_clients_backlog_is_the_runs_not_an_instances(tmp_path):
    """Two instances behind a client capped at 4 and falling behind its 60/s: the run is unstable
    (the client's queue grows), but no instance's own queue does -- each read unstable when the
    client's wait was counted as theirs."""
    text = OVERLOADED.format(cap="max_concurrency = 4").replace("num_requests = 60", "num_requests = 200").replace(
        "rate = 50", "rate = 60") + '[cluster]\ninstances = 2\nrouter = { kind = "round_robin" }\n'
    r = run(tmp_path, text, "two")
    assert r.metrics["stability"]["verdict"] == "unstable"
    assert r.metrics["stability"].get("unstable_instances") == []
    assert all(v["stability"]["verdict"] == "stable" for v in r.metrics["per_instance"].values())


def test_a_closed_loop_of_clients_is_judged_by_its_sends(tmp_path):
    """All requests due at once (a closed loop: vllm bench serve --request-rate inf
    --max-concurrency 4) have no arrival rate to judge a backlog by; the run is judged from when
    they were sent, as before (it read n/a)."""
    text = OVERLOADED.format(cap="max_concurrency = 4").replace('arrival = "constant"\nrate = 50\n',
                                                                 'arrival = "all-at-once"\n')
    r = run(tmp_path, text, "closed")
    assert r.metrics["stability"]["verdict"] == "stable"
    assert r.metrics["client"]["queue_ms"]["max"] > 1000   # (the clients' wait is still reported)
