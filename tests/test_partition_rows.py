"""Partitioned runs whose parts keep their rows differently (schedlab.study.partition): some parts
past ``exact_requests`` stream their rows, the others keep theirs in memory. The merged run must be
the run in one process: every metric (SLO met counts, per instance, cost totals, energy shares),
its sample and its file of every row, in Parquet or CSV; and a part with no request at all adds
nothing but loses nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from schedlab.results.stream import read_rows
from schedlab.study.experiment import load, run_experiment
from test_fleet import FLEET

# Hashed by id over 5 instances, 600 requests: 111, 135, 117, 122 and 115 a part with 5 parts, so
# with exact_requests = 120 parts 1 and 3 stream and parts 0, 2 and 4 (the first too) keep theirs.
# Round robin over 5 instances in 3 parts: 240, 240 and 120 requests (the last part keeps its rows).
HASHED = ('cluster.router={kind = "hash", by = "id"}', "cluster.partitions=5", "experiment.exact_requests=120")
ROBIN = ('cluster.router={kind = "round_robin"}', "cluster.partitions=3", "experiment.exact_requests=200")
BASE = ("workload.num_requests=600", "cluster.instances=5", "slo.ttft_ms=40")  # about 3 in 4 meet it
POWER = '\n[power]\nkind = "fixed_active"\nactive_w = 300\nidle_w = 30\n'
CLIENT = "\n[client]\ntimeout_ms = 2000\n"  # 26 of the 600 requests time out


def fleet_run(tmp_path, *overrides, text=FLEET):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return run_experiment(load(path, list(BASE) + list(overrides))).all_runs()[0]


def differences(a, b, path="") -> list[str]:
    """The metric names where ``b`` is not ``a`` (numbers: within 1e-9, sums added in another order)."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return [f"{path}: keys {sorted(a)} vs {sorted(b) if isinstance(b, dict) else b!r}"]
        return [d for key in a for d in differences(a[key], b[key], f"{path}.{key}")]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        same = a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        return [] if same else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.mark.parametrize("client", ["", CLIENT], ids=["engine", "client"])
@pytest.mark.parametrize("parts", [HASHED, ROBIN], ids=["first-part-exact", "last-part-exact"])
def test_parts_streamed_and_kept_merge_to_the_run_in_one_process(tmp_path, monkeypatch, parts, client):
    """The kept parts' rows count as a streamed part's: SLO met (run, per instance), cost totals,
    energy shares, the client's view and the sample -- every metric that of the same run streamed
    in one process (merged sketches are one sketch), and its SLO counts those of the exact run."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    text = FLEET + POWER + client
    split = fleet_run(tmp_path, *parts, text=text)
    assert split.rows_file is not None
    streamed = fleet_run(tmp_path, *parts[:1], parts[2], text=text)  # one process, streamed
    exact = fleet_run(tmp_path, *parts[:1], text=text)
    assert streamed.rows_file is not None and exact.rows_file is None
    assert differences(streamed.metrics, split.metrics) == []
    assert split.meta["requests_sampled"] == streamed.meta["requests_sampled"] == 600
    a, b = exact.metrics, split.metrics
    assert b["slo"]["met"] == a["slo"]["met"] < 600
    assert b["slo"]["attainment"] == a["slo"]["attainment"]
    for k in range(5):
        assert b["per_instance"][str(k)]["slo"]["met"] == a["per_instance"][str(k)]["slo"]["met"], k
    for key in ("total_prefill_ms", "total_decode_ms", "decode_share"):
        assert b["cost"][key] == pytest.approx(a["cost"][key], rel=1e-12), key
    assert b["energy"]["attributed_j"] == pytest.approx(a["energy"]["attributed_j"], rel=1e-12)


@pytest.mark.parametrize("rows", ["parquet", "csv"])
def test_the_row_file_holds_every_part_when_the_first_part_kept_its_rows(tmp_path, monkeypatch, rows):
    """The first part stays below exact_requests: the file is still the streamed parts' format
    (a CSV was read as Parquet: a traceback), with every request's row once."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    split = fleet_run(tmp_path, *HASHED, f'experiment.request_rows="{rows}"')
    whole = fleet_run(tmp_path, HASHED[0])
    assert split.rows_file.endswith("." + rows)
    got = read_rows(split.rows_file)
    order = np.argsort(got["id"], kind="stable")
    for name in ("id", "instance", "arrival_ms", "first_token_ms", "finish_ms", "generated_tokens", "rejected"):
        np.testing.assert_array_equal(got[name][order], whole.requests[name], err_msg=name)


@pytest.mark.parametrize("stream", [False, True])
def test_a_part_with_no_request_keeps_the_cost_totals(tmp_path, monkeypatch, stream):
    """Two requests round robin over 3 instances in 3 parts: the last part has none, so no cost
    totals of its own; the run's are still the other parts' sums (they were dropped)."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    small = ("workload.num_requests=2", "cluster.instances=3", 'cluster.router={kind = "round_robin"}')
    limit = ("experiment.exact_requests=0",) if stream else ()
    whole = fleet_run(tmp_path, *small, *limit)
    split = fleet_run(tmp_path, *small, *limit, "cluster.partitions=3")
    assert (split.rows_file is not None) == stream
    assert split.metrics["finished"] == 2 and split.metrics["per_instance"]["2"]["requests"] == 0
    for key in ("total_prefill_ms", "total_decode_ms", "decode_share"):
        assert split.metrics["cost"][key] == pytest.approx(whole.metrics["cost"][key], rel=1e-12), key
