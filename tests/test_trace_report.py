"""The ``trace`` report: Chrome / Perfetto trace-event files, checked against the Trace Event
Format (JSON object form) by a validator written here from the format's description, and on a
hand-computed run."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.cli import main
from schedlab.model import Request
from schedlab.testing import dyadic_linear_costs, examples, requests_lists, run_disaggregated, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.reports.trace import trace_events
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

PHASES = {"X", "b", "e", "C", "i", "M"}


def validate(doc: dict) -> None:
    """The Trace Event Format's rules for the phases the report uses: every event has a phase,
    a name and a process; timed events a finite, non-negative ``ts`` in microseconds; complete
    events a non-negative ``dur`` and, on one thread, no partial overlap; async begin/end events
    pair up by (process, category, id) and nest; counters carry numeric series; metadata names
    processes and threads."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    json.dumps(doc)  # serialisable as it stands
    open_spans: dict[tuple, list] = {}
    slices: dict[tuple, list] = {}
    for ev in doc["traceEvents"]:
        assert ev["ph"] in PHASES, ev
        assert isinstance(ev["name"], str) and ev["name"], ev
        assert isinstance(ev["pid"], int), ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index"), ev
            assert isinstance(ev["args"], dict) and ev["args"], ev
            continue
        assert isinstance(ev["ts"], (int, float)) and math.isfinite(ev["ts"]) and ev["ts"] >= 0, ev
        if ev["ph"] == "X":
            assert isinstance(ev["tid"], int) and ev["dur"] >= 0, ev
            slices.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ev["ph"] in "be":
            key = (ev["pid"], ev["cat"], ev["id"])
            stack = open_spans.setdefault(key, [])
            if ev["ph"] == "b":
                stack.append((ev["name"], ev["ts"]))
            else:
                assert stack, f"end without a begin: {ev}"
                name, ts = stack.pop()
                assert name == ev["name"] and ev["ts"] >= ts, (name, ts, ev)
        elif ev["ph"] == "C":
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values()), ev
        elif ev["ph"] == "i":
            assert ev["s"] in ("g", "p", "t"), ev
    assert all(not stack for stack in open_spans.values()), "async spans left open"
    for spans in slices.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-6, "complete events on one thread overlap"


def by_phase(doc: dict, ph: str) -> list[dict]:
    return [ev for ev in doc["traceEvents"] if ev["ph"] == ph]


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_hand_computed_run(engine):
    """0.5 ms per prompt token, 8 ms per decode step. Both 8-token prompts prefill together (16
    tokens, 0-8 ms); request 1 wants one token and finishes then; request 0 decodes twice
    (8-16, 16-24 ms) -- one slice ``decode x2`` in the fast engine, two in the reference."""
    requests = [Request(0, 0.0, 8, 3), Request(1, 0.0, 8, 1)]
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0))
    run = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=2)), cost, engine=engine)
    doc = trace_events(run)
    validate(doc)
    slices = [(ev["name"], ev["ts"], ev["dur"], ev["args"]["decodes"], ev["args"]["prefill_tokens"])
              for ev in by_phase(doc, "X")]
    decodes = [("decode x2", 8000.0, 16000.0, 1, 0)] if engine == "fast" else [
        ("decode", 8000.0, 8000.0, 1, 0), ("decode", 16000.0, 8000.0, 1, 0)]
    assert slices == [("prefill", 0.0, 8000.0, 0, 16)] + decodes
    spans = [(ev["name"], ev["id"], ev["ts"]) for ev in by_phase(doc, "b")]
    assert spans == [("request 0", "r0", 0.0), ("prefill", "r0", 0.0), ("decode", "r0", 8000.0),
                     ("request 1", "r1", 0.0), ("prefill", "r1", 0.0)]  # empty queued / decode spans left out
    ends = {(ev["id"], ev["name"]): ev["ts"] for ev in by_phase(doc, "e")}
    assert ends[("r0", "request 0")] == ends[("r0", "decode")] == 24000.0 and ends[("r1", "request 1")] == 8000.0
    kv = [ev["args"]["used"] for ev in by_phase(doc, "C") if ev["name"] == "KV blocks"]
    assert kv[0] == 2  # 8 + 3 and 8 + 1 tokens reserved in 16-token blocks: one block each
    assert {ev["name"] for ev in by_phase(doc, "M")} == {"process_name", "process_sort_index", "thread_name"}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=requests_lists(max_size=10), cost=dyadic_linear_costs(), seqs=st.integers(1, 4),
       engine=st.sampled_from(["fast", "reference"]), disaggregated=st.booleans())
def test_every_trace_is_well_formed_and_accounts_for_the_run(requests, cost, seqs, engine, disaggregated):
    """Valid trace events; the iteration slices add up to the run's busy time and iterations; a
    request span per served request (two in a disaggregated cluster when it moved), an instant
    event per rejection."""
    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // 16) for r in requests)

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=seqs, allocation="grow")), LinearCostModel(cost),
                PagedKVCache(need + 2, 16))

    if disaggregated:
        run = run_disaggregated(requests, make, make, engine=engine)
    else:
        run = run_engine(requests, *make(), engine=engine)
    doc = trace_events(run)
    validate(doc)
    slices = by_phase(doc, "X")
    assert sum(ev["dur"] for ev in slices) == pytest.approx(run.counters["busy_ms"] * 1000.0)
    assert sum(ev["args"]["iterations"] for ev in slices) == run.counters["iterations"]
    outer = [ev for ev in by_phase(doc, "b") if ev["name"].startswith("request ")]
    req = run.requests
    served = int((req["rejected"] == 0).sum())
    moved = int(((req["prefill_instance"] >= 0) & (req["prefill_instance"] != req["instance"])).sum())
    assert len(outer) == served + moved
    assert len(by_phase(doc, "i")) == int(req["rejected"].sum())


def test_the_report_writes_a_trace_per_run(tmp_path, capsys):
    path = tmp_path / "exp.toml"
    path.write_text('[experiment]\nname = "t"\nreports = ["trace"]\n[workload]\nkind = "synthetic"\n'
                    'num_requests = 30\nprompt = {dist = "fixed", value = 64}\noutput = {dist = "fixed", value = 8}\n'
                    'rate = 20\n[cluster]\ninstances = 2\nrouter = {kind = "least_outstanding"}\n'
                    '[[runs]]\nname = "a/b"\n[[runs]]\nname = "c"\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    files = sorted(p.name for p in (tmp_path / "out" / "traces").iterdir())
    assert files == ["a_b.json", "c.json"]
    doc = json.loads((tmp_path / "out" / "traces" / "c.json").read_text())
    validate(doc)
    names = {ev["args"]["name"] for ev in by_phase(doc, "M") if ev["name"] == "process_name"}
    assert names == {"instance 0", "instance 1"}
