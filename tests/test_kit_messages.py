"""What the kit says when it finds a bug, and that it finds the audit's (audit_s57 gaps 4 and 9).

``compare_runs`` names the requests that differ, each value under its run's label, and hints at the
plugin members a fast-vs-reference disagreement points to -- while accepting exactly what it
accepted before (checked against the old function, kept here). ``check_cost_model`` walks each
growth one step at a time, so a threshold a single jump lands beyond is still crossed.
``requests_lists(bursts=True)`` reaches the priority inversion that spread arrivals seldom do.
"""

from __future__ import annotations

import math
import re

import attrs
import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from schedlab.model import Request
from schedlab.protocols import Batch
from schedlab.queues import KeyedQueue
from schedlab.testing import (IterationChecker, check_cost_model, check_deterministic, check_run, compare_runs,
                              kit_settings, requests_lists, run_engine)
from schedlab.testing.cost import grown
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel

#: a few examples, no shrinking, the same ones every run
SOME_EXAMPLES = settings(kit_settings, max_examples=100, phases=[Phase.generate], derandomize=True, database=None,
                         report_multiple_bugs=False)
SEQS, BUDGET, CHUNK = 4, 24, 16


class PriorityChunked:
    """Priority first, then arrival; chunked prefill under a token budget; at most ``max_num_seqs``
    running; each request reserves its whole KV at admission (the audit's scheduler, made small)."""

    stable_between_events = True

    def __init__(self, max_num_seqs: int = SEQS, budget: int = BUDGET, chunk: int = CHUNK):
        self.max_num_seqs, self.budget, self.chunk = max_num_seqs, budget, chunk
        self.slots = max_num_seqs

    def new_waiting_queue(self):
        return KeyedQueue(lambda seq: seq.request.priority)

    def room(self, plan) -> bool:
        return len(plan.running) < self.max_num_seqs

    def holds(self, plan, seq) -> bool:
        return False

    def schedule(self, plan) -> None:
        plan.decode_all()
        left = self.budget - plan.num_scheduled_tokens
        for seq in plan.prefilling:
            n = min(left, self.chunk, seq.num_tokens - seq.num_computed_tokens)
            if n <= 0 or not plan.prefill(seq, n):
                break
            left -= n
        while plan.waiting and self.room(plan) and left > 0:
            seq = plan.waiting.peek()
            if self.holds(plan, seq):
                break
            n = min(left, self.chunk, seq.num_tokens - plan.cached_tokens(seq))
            if not plan.admit(seq, n, reserve=True):
                break
            left -= n


class HoldsLongPrompts(PriorityChunked):
    """The audit's s16: holds a prompt longer than a chunk for 20 ms while others run -- with no
    ``wake_at``, yet declaring ``stable_between_events``: the fast engine, trusting it, skips the
    decode steps in between and admits the prompt only when the next event comes."""

    def holds(self, plan, seq) -> bool:
        return bool(plan.running) and seq.num_tokens > self.chunk and plan.now - seq.request.arrival_ms < 20


class HoldsAndWakes(HoldsLongPrompts):
    """The same hold, kept honestly: it asks to be woken when the hold ends."""

    def holds(self, plan, seq) -> bool:
        held = super().holds(plan, seq)
        if held:
            plan.wake_at(seq.request.arrival_ms + 20)
        return held


class UrgentExtraSlot(PriorityChunked):
    """The audit's s03: one slot over ``max_num_seqs`` for a waiting request more important than
    everything running."""

    def room(self, plan) -> bool:
        urgent = bool(plan.running) and plan.waiting.peek().request.priority < min(
            s.request.priority for s in plan.running)
        return len(plan.running) < self.max_num_seqs + urgent


class OffByOneIncrement(LinearCostModel):
    """The audit's c05: ``decode_step_increment`` counts one decode too few."""

    def __init__(self):
        super().__init__(LinearConfig(per_context_token_ms=0.25))

    def decode_step_increment(self, batch):
        inc = super().decode_step_increment(batch)
        return None if inc is None else 0.25 * (batch.num_decode - 1)


SHORT_BESIDE_LONG = [Request(0, 0.0, 8, 10), Request(1, 0.0, 40, 3)]  # 1 is held while 0 decodes
TWO_DECODING = [Request(0, 0.0, 8, 6), Request(1, 0.0, 8, 9)]


def both_engines(requests, scheduler, cost_model=None):
    return (run_engine(requests, scheduler(), cost_model() if cost_model else None),
            run_engine(requests, scheduler(), cost_model() if cost_model else None, engine="reference"))


def message(a, b, **kw) -> str:
    with pytest.raises(AssertionError) as info:
        compare_runs(a, b, **kw)
    return str(info.value)


# -- compare_runs: request ids, labels, hints ------------------------------------------------------------

def test_a_hold_without_wake_at_names_the_request_both_runs_and_stable_between_events():
    fast, ref = both_engines(SHORT_BESIDE_LONG, HoldsLongPrompts)
    f, r = fast.requests["first_scheduled_ms"][1], ref.requests["first_scheduled_ms"][1]
    assert f != r  # (the bug shows: the fast engine admits request 1 late)
    text = message(fast, ref, labels=("fast", "reference"))
    assert text.startswith("first_scheduled_ms differs for 1 of 2 requests (fast vs reference):\n")
    assert f"\n  request 1: fast {float(f)!r}, reference {float(r)!r}\n" in text
    assert "request 0:" not in text.split("also differ")[0]  # (request 0 agrees)
    assert re.search(r"also differ: first_token_ms \(1 request\), finish_ms \(\d requests?\)", text)
    assert "stable_between_events" in text and "wake_at" in text and "decode_step_increment" in text
    assert "keeps state across instances" in text


def test_the_same_hold_with_wake_at_agrees():
    compare_runs(*both_engines(SHORT_BESIDE_LONG, HoldsAndWakes), labels=("fast", "reference"))


def test_a_wrong_decode_step_increment_names_the_requests_and_the_member():
    fast, ref = both_engines(TWO_DECODING, PriorityChunked, OffByOneIncrement)
    text = message(fast, ref, labels=("fast", "reference"))
    assert text.startswith("first_token_ms differs") or text.startswith("finish_ms differs")
    col = text.split(" ", 1)[0]
    rows = np.flatnonzero(fast.requests[col] != ref.requests[col]).tolist()
    for i in rows:
        assert f"request {i}: fast {float(fast.requests[col][i])!r}, reference {float(ref.requests[col][i])!r}" in text
    assert "decode_step_increment" in text and "iteration_ms" in text


def test_at_most_five_requests_are_listed():
    requests = [Request(i, 0.0, 8, 4 + i) for i in range(8)]
    fast = run_engine(requests, PriorityChunked(8))
    other = attrs.evolve(fast, requests={**fast.requests, "finish_ms": fast.requests["finish_ms"] + 1.0})
    text = message(fast, other, labels=("x", "y"))
    assert text.startswith("finish_ms differs for 8 of 8 requests (x vs y):")
    assert [int(m) for m in re.findall(r"\n  request (\d+): x ", text)] == [0, 1, 2, 3, 4]
    assert "\n  ... and 3 more\n" in text


def test_the_default_labels_are_a_and_b():
    run = run_engine(TWO_DECODING, PriorityChunked())
    other = attrs.evolve(run, requests={**run.requests, "generated_tokens": run.requests["generated_tokens"] + 1})
    assert "\n  request 0: a 6, b 7\n" in message(run, other)


def test_runs_of_the_two_engines_are_labelled_by_engine_unless_told():
    fast, ref = both_engines(SHORT_BESIDE_LONG, HoldsLongPrompts)
    assert message(fast, ref).startswith("first_scheduled_ms differs for 1 of 2 requests (fast vs reference):\n")
    assert message(ref, fast).startswith("first_scheduled_ms differs for 1 of 2 requests (reference vs fast):\n")
    assert "(x vs y)" in message(fast, ref, labels=("x", "y"))


def test_text_columns_name_the_request_too():
    run = run_engine(TWO_DECODING, PriorityChunked())
    classes = run.requests["request_class"].copy()
    classes[1] = "batch"
    other = attrs.evolve(run, requests={**run.requests, "request_class": classes})
    assert "request_class differs for 1 of 2 requests (a vs b):\n  request 1: a 'default', b 'batch'" in message(
        run, other)


def test_counters_metrics_and_rejections_are_labelled():
    run = run_engine(TWO_DECODING, PriorityChunked())
    busy = run.counters["busy_ms"]
    text = message(run, attrs.evolve(run, counters={**run.counters, "busy_ms": busy + 1.0}), labels=("fast", "ref"))
    assert text.startswith(f"counters.busy_ms differs: fast {busy!r}, ref {busy + 1.0!r}\n")
    assert "stable_between_events" in text
    metrics = {**run.metrics, "finished": run.metrics["finished"] + 1}
    assert message(run, attrs.evolve(run, metrics=metrics), labels=("fast", "ref")).startswith(
        f"metrics.finished differs: fast {run.metrics['finished']!r}, ref {run.metrics['finished'] + 1!r}")
    text = message(run, attrs.evolve(run, metrics={**run.metrics, "extra": 1}), labels=("fast", "ref"))
    assert text == "metrics: keys differ: only in fast: [], only in ref: ['extra']"
    text = message(run, attrs.evolve(run, rejections={1: "too long"}), labels=("fast", "ref"))
    assert text.startswith("rejections differ for 1 requests (fast vs ref):\n"
                           "  request 1: fast not rejected, ref rejected ('too long')\n")


def test_timeline_mismatches_are_labelled():
    run = run_engine(TWO_DECODING, PriorityChunked())
    t = dict(run.timeline)
    t["duration_ms"] = t["duration_ms"] * 2
    text = message(run, attrs.evolve(run, timeline=t), labels=("fast", "ref"))
    assert re.match(r"timeline\.0\.busy_ms differs: fast [\d.]+, ref [\d.]+\n", text)
    t = dict(run.timeline)
    t["time_ms"] = t["time_ms"] + 0.5
    text = message(run, attrs.evolve(run, timeline=t), labels=("fast", "ref"))
    assert re.match(r"timeline rows of instance 0 start apart: \d+ of (fast|ref)'s \d+ rows start at no iteration "
                    r"of (fast|ref)'s", text)


def test_different_request_counts_are_named():
    run = run_engine(TWO_DECODING, PriorityChunked())
    one = run_engine(TWO_DECODING[:1], PriorityChunked())
    assert message(run, one) == "a has 2 requests, b has 1 (only in a: requests [1]; only in b: requests [])"


def test_check_deterministic_message_keeps_its_rule():
    """The message names the rule, the differing request and the runs, without the engines' hint."""
    class SharedCount(PriorityChunked):
        served = [0]  # bug: shared by every instance

        def holds(self, plan, seq) -> bool:
            self.served[0] += 1
            return bool(plan.running) and self.served[0] % 3 == 0

    with pytest.raises(AssertionError, match=r"not deterministic: .*\n  request \d+: run 1 [\d.]+, run 2 ") as e:
        check_deterministic(SharedCount, [Request(i, 0.0, 8, 3) for i in range(4)])
    assert "hint:" not in str(e.value)  # (the engines' hint does not apply to one engine's two runs)


# -- compare_runs accepts exactly what it accepted before -------------------------------------------------

def old_compare_runs(a, b, *, rel=1e-9):
    """compare_runs before the messages changed (verbatim but for its helpers' messages)."""
    from schedlab.testing.compare import _timeline_totals

    for col, x in a.requests.items():
        y = b.requests[col]
        if x.dtype == object:
            assert x.tolist() == y.tolist(), col
        elif x.dtype.kind == "f":
            assert np.allclose(x, y, rtol=rel, atol=1e-9, equal_nan=True)
        else:
            assert np.array_equal(x, y)
    assert a.rejections == b.rejections

    def close(x, y):
        if isinstance(x, dict):
            assert set(x) == set(y)
            for k in x:
                close(x[k], y[k])
        elif isinstance(x, float) or isinstance(y, float):
            if math.isnan(x) or math.isnan(y):
                assert math.isnan(x) and math.isnan(y)
            else:
                assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-9)
        else:
            assert x == y

    close(a.counters, b.counters)
    close(a.metrics, b.metrics)
    if a.timeline.get("time_ms", np.empty(0)).size and b.timeline.get("time_ms", np.empty(0)).size:
        close(_timeline_totals(a), _timeline_totals(b))
        coarse, fine = sorted((a, b), key=lambda r: r.timeline["time_ms"].size)
        for inst in np.unique(fine.timeline["instance"]).tolist():
            starts = fine.timeline["time_ms"][fine.timeline["instance"] == inst]
            mine = coarse.timeline["time_ms"][coarse.timeline["instance"] == inst]
            right = np.clip(np.searchsorted(starts, mine), 0, starts.size - 1)
            left = np.clip(right - 1, 0, starts.size - 1)
            nearest = np.where(np.abs(starts[left] - mine) < np.abs(starts[right] - mine), starts[left], starts[right])
            assert np.allclose(mine, nearest, rtol=rel, atol=1e-9)


BASE = run_engine([Request(i, 2.0 * i, 8 + 5 * i, 3 + i) for i in range(5)], PriorityChunked(2))


def _verdict(compare, a, b, rel) -> bool:
    try:
        compare(a, b, rel=rel)
    except AssertionError:
        return False
    return True


def _floats(values: dict) -> list:
    return sorted(k for k, v in values.items() if isinstance(v, float) and math.isfinite(v) and v)


@settings(kit_settings, max_examples=300, database=None)
@given(st.sampled_from(["requests", "counters", "metrics", "timeline"]), st.integers(0, 10_000),
       st.sampled_from([0.0, 1e-12, 1e-9, 1e-6]), st.sampled_from([0.0, 0.5, 2.0, 100.0]),
       st.sampled_from([0.0, 0.5, 2.0]), st.booleans())
def test_what_is_equal_is_unchanged(where, pick, rel, times_rel, times_atol, nan):
    """One value of a run moved by ``times_rel`` x ``rel`` of itself plus ``times_atol`` x 1e-9
    (just within or beyond either tolerance), or made NaN: the new compare_runs passes exactly
    when the old one did."""
    def moved(v: float) -> float:
        return math.nan if nan else v * (1 + times_rel * rel) + times_atol * 1e-9

    if where == "requests":
        cols = sorted(c for c, v in BASE.requests.items() if v.dtype.kind == "f" and (v > 0).any())
        col = cols[pick % len(cols)]
        x = BASE.requests[col].copy()
        i = np.flatnonzero(x > 0)[pick % int((x > 0).sum())]
        x[i] = moved(float(x[i]))
        other = attrs.evolve(BASE, requests={**BASE.requests, col: x})
    elif where in ("counters", "metrics"):
        values = getattr(BASE, where)
        key = _floats(values)[pick % len(_floats(values))]
        other = attrs.evolve(BASE, **{where: {**values, key: moved(values[key])}})
    else:
        t = dict(BASE.timeline)
        col = ("time_ms", "duration_ms")[pick % 2]
        t[col] = t[col].copy()
        i = pick % t[col].size
        t[col][i] = moved(float(t[col][i])) if t[col][i] else t[col][i]
        other = attrs.evolve(BASE, timeline=t)
    assert _verdict(compare_runs, BASE, other, rel) == _verdict(old_compare_runs, BASE, other, rel)


def test_equal_runs_pass_and_the_tolerance_still_works():
    again = run_engine([Request(i, 2.0 * i, 8 + 5 * i, 3 + i) for i in range(5)], PriorityChunked(2))
    compare_runs(BASE, again, rel=0.0)
    nudged = attrs.evolve(BASE, requests={**BASE.requests, "finish_ms": BASE.requests["finish_ms"] * (1 + 1e-10)})
    compare_runs(BASE, nudged)  # within the default rel=1e-9
    with pytest.raises(AssertionError, match=r"finish_ms differs for 5 of 5 requests"):
        compare_runs(BASE, nudged, rel=1e-12)


# -- check_cost_model walks the growth ------------------------------------------------------------------

class KernelAt16(LinearCostModel):
    """A 'fast kernel' above 16 prompt tokens halves their cost: 17 cost less than 16."""

    def iteration_ms(self, batch):
        t = super().iteration_ms(batch)
        return t - 0.5 * self.config.prefill_ms_per_token * batch.prefill_tokens if batch.prefill_tokens > 16 else t


def test_the_walk_catches_a_threshold_a_single_jump_lands_beyond():
    """10 -> 40 prompt tokens costs more (40 tokens at half price beat 10 at full), so one jump
    sees nothing; stepping crosses 16 -> 17."""
    model = KernelAt16(LinearConfig())
    batch = Batch(num_prefill=1, prefill_tokens=10)
    assert model.iteration_ms(grown(batch, "prefill_tokens", 30)) > model.iteration_ms(batch)  # (the jump)
    crossed = (r"KernelAt16: Batch\(.*prefill_tokens=17.*\) \(7 more of prefill_tokens\) takes 0\.425\d* ms, less than "
               r"0\.8\d* ms for Batch\(.*prefill_tokens=16.*\) \(6 more\), growing from Batch\(.*prefill_tokens=10.*"
               r"more work must never cost less")
    with pytest.raises(AssertionError, match=crossed):
        check_cost_model(model, batch, more=30)
    check_cost_model(model, batch, more=6)  # (up to 16 tokens: nothing crossed)


class Counting(LinearCostModel):
    def __init__(self):
        super().__init__(LinearConfig())
        self.calls = 0

    def iteration_ms(self, batch):
        self.calls += 1
        return super().iteration_ms(batch)


@pytest.mark.parametrize("batch, growths, parts", [
    (Batch(num_prefill=1, prefill_tokens=10), 4, 0),            # no decode to lengthen; a lone prompt is the batch
    (Batch(num_decode=3, decode_context_tokens=30), 5, 1),      # not its context; a lone decode
    (Batch(num_decode=3, decode_context_tokens=30, num_prefill=1, prefill_tokens=5), 6, 2)])
def test_the_walk_costs_one_call_per_step(batch, growths, parts):
    """The price of the walk: twice at the batch, once per part of it (a lone decode, a lone prompt), then
    ``more`` calls per growth that applies (one more prompt always does)."""
    model = Counting()
    check_cost_model(model, batch, more=40)
    assert model.calls == 2 + parts + 40 * growths


# -- requests_lists(bursts=True) --------------------------------------------------------------------------

def inversion(requests, crowd: int = SEQS) -> bool:
    """``crowd`` requests arriving together, then a more important one later."""
    for late in requests:
        at = {}
        for r in requests:
            if r.arrival_ms < late.arrival_ms and r.priority > late.priority:
                at[r.arrival_ms] = at.get(r.arrival_ms, 0) + 1
        if at and max(at.values()) >= crowd:
            return True
    return False


def test_bursts_draw_the_inversion_often():
    """Among the same 100 examples, bursts give the inversion in many lists, spread arrivals seldom."""
    def count(strategy) -> int:
        seen = [0]

        @SOME_EXAMPLES
        @given(strategy)
        def prop(requests):
            seen[0] += inversion(requests)

        prop()
        return seen[0]

    bursts, spread = count(requests_lists(priorities=True, bursts=True)), count(requests_lists(priorities=True))
    assert bursts >= 20 and spread <= bursts // 4, (bursts, spread)


def test_an_inversion_shrinks_to_its_crowd_and_the_late_request():
    found = find(requests_lists(priorities=True, bursts=True), inversion,
                 settings=settings(database=None, max_examples=100, derandomize=True))
    assert len(found) == SEQS + 1
    *crowd, late = found
    assert len({r.arrival_ms for r in crowd}) == 1 and late.arrival_ms > crowd[0].arrival_ms
    assert late.priority < min(r.priority for r in crowd)


@settings(kit_settings, max_examples=200, database=None)
@given(requests_lists(priorities=True, bursts=True, min_size=2, max_size=9, max_arrival_ms=50.0))
def test_bursts_are_request_lists(requests):
    assert 2 <= len(requests) <= 9
    assert [r.id for r in requests] == list(range(len(requests)))
    assert all(a.arrival_ms <= b.arrival_ms <= 50.0 for a, b in zip(requests, requests[1:]))
    assert all(r.arrival_ms * 8 == int(r.arrival_ms * 8) for r in requests)  # (multiples of 1/8 ms)


def test_bursts_refuse_all_at_zero():
    @settings(max_examples=1, database=None)
    @given(requests_lists(bursts=True, all_at_zero=True))
    def prop(requests):
        pass

    with pytest.raises(ValueError, match="all_at_zero"):
        prop()


def test_bursts_find_an_urgent_extra_slot():
    """The audit's s03 at the README's 100 examples (spread arrivals found it on 1 seed of 10)."""
    @SOME_EXAMPLES
    @given(requests_lists(priorities=True, bursts=True))
    def prop(requests):
        check = IterationChecker(max_running=SEQS, token_budget=BUDGET)
        result = run_engine(requests, UrgentExtraSlot(), check=check)
        check_run(result, requests, max_running=SEQS, token_budget=BUDGET)

    with pytest.raises(AssertionError, match=rf"{SEQS + 1} running > max_running {SEQS}"):
        prop()


def test_the_correct_scheduler_passes_bursts():
    @settings(SOME_EXAMPLES, max_examples=50)
    @given(requests_lists(priorities=True, bursts=True))
    def prop(requests):
        check = IterationChecker(max_running=SEQS, token_budget=BUDGET)
        result = run_engine(requests, PriorityChunked(), check=check)
        check_run(result, requests, max_running=SEQS, token_budget=BUDGET)

    prop()
