"""SLO constraints and the boundary search."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings, strategies as st

from schedlab.errors import ConfigError
from schedlab.study.experiment import load
from schedlab.study.search import Constraint, Probe, max_search_probes, parse_constraint, search
from study_case import TINY_WORKLOAD

METRICS = {"ttft_ms": {"p50": 80.0, "p99": 200.0}, "throughput_tps": 950.0, "finished": 12}


# --- constraints -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, holds",
    [
        ("ttft_ms.p99 <= 200", True),
        ("ttft_ms.p99 < 200", False),
        ("ttft_ms.p99 >= 200", True),
        ("ttft_ms.p99 > 200", False),
        ("ttft_ms.p99 <= 199.9", False),
        ("ttft_ms.p99 < 200.1", True),
        ("ttft_ms.p99 >= 200.1", False),
        ("ttft_ms.p99 > 199.9", True),
        ("throughput_tps >= 1e3", False),
        ("throughput_tps > 900", True),
        ("finished >= 12", True),
        ("ttft_ms.p99<=200", True),
        ("  ttft_ms.p50   <   80.5  ", True),
        ("ttft_ms.p99 < inf", True),
        ("throughput_tps > -5", True),
    ],
)
def test_constraint_operators(text, holds):
    assert parse_constraint(text).holds(METRICS) is holds


def test_parsed_fields():
    c = parse_constraint("ttft_ms.p99 <= 200")
    assert c == Constraint("ttft_ms.p99", "<=", 200.0)
    assert str(c) == "ttft_ms.p99 <= 200"
    assert str(parse_constraint("throughput_tps >= 1234567")) == "throughput_tps >= 1234567"
    assert str(parse_constraint("e2e_ms.p50 < 0.125")) == "e2e_ms.p50 < 0.125"
    assert str(parse_constraint("x > -inf")) == "x > -inf"
    assert c.value(METRICS) == 200.0
    assert parse_constraint("finished > 3").value(METRICS) == 12.0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ttft_ms.p99",
        "ttft_ms.p99 <=",
        "<= 200",
        "ttft_ms.p99 == 200",
        "ttft_ms.p99 = 200",
        "ttft_ms.p99 =< 200",
        "200 >= ttft_ms.p99",
        "ttft_ms.p99 <= 200 ms",
        "ttft_ms.p99 <= 200ms",
        "ttft_ms.p99 <= abc",
        "ttft_ms.p99 <= nan",
        "ttft_ms..p99 <= 200",
        "ttft ms <= 200",
    ],
)
def test_bad_constraint_text(text):
    with pytest.raises(ConfigError) as info:
        parse_constraint(text)
    assert repr(text) in str(info.value)


def test_missing_metric_lists_available_names():
    with pytest.raises(ConfigError) as info:
        parse_constraint("tpot_ms.p99 <= 50").holds(METRICS)
    message = str(info.value)
    assert "'tpot_ms.p99'" in message
    assert "finished, throughput_tps, ttft_ms" in message


def test_missing_sub_metric_lists_both_levels():
    with pytest.raises(ConfigError) as info:
        parse_constraint("ttft_ms.p98 <= 50").value(METRICS)
    message = str(info.value)
    assert "finished, throughput_tps, ttft_ms" in message
    assert "ttft_ms has: p50, p99" in message


def test_path_through_a_number():
    with pytest.raises(ConfigError, match="throughput_tps is a single value"):
        parse_constraint("throughput_tps.p99 <= 50").value(METRICS)


def test_metric_group_is_not_a_number():
    with pytest.raises(ConfigError, match="name one of them: p50, p99"):
        parse_constraint("ttft_ms <= 50").holds(METRICS)


def test_non_numeric_metric():
    with pytest.raises(ConfigError, match="'name' is 'run-a', not a number"):
        parse_constraint("name <= 50").holds({"name": "run-a"})
    with pytest.raises(ConfigError, match="not a number"):
        parse_constraint("ok <= 1").holds({"ok": True})


@pytest.mark.parametrize("op", ["<=", "<", ">=", ">"])
@pytest.mark.parametrize("bad", [math.nan, None, np.float64("nan")])
def test_nan_never_satisfies(op, bad):
    c = parse_constraint(f"x.y {op} 0")
    assert c.holds({"x": {"y": bad}}) is False


def test_numpy_numbers():
    assert parse_constraint("a <= 3").holds({"a": np.float64(2.5)}) is True
    assert parse_constraint("a > 3").holds({"a": np.int64(4)}) is True


@given(st.floats(allow_nan=True), st.floats(allow_nan=False))
def test_lt_and_ge_are_complements(x, threshold):
    below = Constraint("m", "<", threshold).holds({"m": x})
    at_or_above = Constraint("m", ">=", threshold).holds({"m": x})
    if math.isnan(x):
        assert not below and not at_or_above
    else:
        assert below != at_or_above


# --- search: exact small cases ---------------------------------------------------------------


def _below(boundary):
    """A monotone 'metric': holds up to and including ``boundary``; payload = 10 * value."""
    return lambda v: (v <= boundary, v * 10)


def test_found_exact_probe_sequence():
    # low=1: offsets 0, 1, 3, 7, 15, 31 -> 1, 2, 4, 8, 16 pass, 32 fails;
    # bisect (16, 32): 24 pass, 28 fail, 26 pass, 27 pass -> 27 passes, 28 fails.
    out = search(_below(27), low=1, high=256, key="clients", constraint_text="ttft_ms.p99 <= 200")
    assert [p.value for p in out.probes] == [1, 2, 4, 8, 16, 32, 24, 28, 26, 27]
    assert [p.holds for p in out.probes] == [True] * 5 + [False, True, False, True, True]
    assert out.status == "found"
    assert (out.value, out.payload, out.failing) == (27, 270, 28)
    assert out.message == "largest clients with ttft_ms.p99 <= 200: 27 (28 fails)"


def test_minimize_exact_probe_sequence():
    # high=256: offsets 0, 1, 3, 7, 15, 31, 63, 127 -> 256 ... 129 pass; offset 255 = 1 fails;
    # bisect (129, 1): 65 pass, 33 fail, 49 pass, 41 pass, 37 fail, 39 fail, 40 pass.
    out = search(lambda v: (v >= 40, None), low=1, high=256, maximize=False, key="gpus",
                 constraint_text="cost <= 3")
    assert [p.value for p in out.probes] == [256, 255, 253, 249, 241, 225, 193, 129, 1, 65, 33, 49, 41, 37, 39, 40]
    assert (out.status, out.value, out.failing) == ("found", 40, 39)
    assert out.message == "smallest gpus with cost <= 3: 40 (39 fails)"


def test_boundary_at_low():
    out = search(_below(1), low=1, high=256)
    assert [p.value for p in out.probes] == [1, 2]
    assert (out.status, out.value, out.failing) == ("found", 1, 2)


def test_fails_everywhere():
    out = search(_below(0), low=1, high=256, key="clients", constraint_text="ttft_ms.p99 <= 200")
    assert out.status == "fails-everywhere"
    assert (out.value, out.payload, out.failing) == (None, None, 1)
    assert out.probes == (Probe(1, False, 10),)
    assert out.message == "ttft_ms.p99 <= 200 fails even at clients = 1"


def test_fails_everywhere_minimize_probes_the_top():
    out = search(lambda v: (False, None), low=1, high=256, maximize=False, key="gpus", constraint_text="c")
    assert out.status == "fails-everywhere"
    assert [p.value for p in out.probes] == [256]
    assert out.message == "c fails even at gpus = 256"


def test_holds_everywhere():
    out = search(_below(10**9), low=1, high=256, key="clients", constraint_text="ttft_ms.p99 <= 200")
    assert out.status == "holds-everywhere"
    assert (out.value, out.payload, out.failing) == (256, 2560, None)
    assert [p.value for p in out.probes] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert out.message == (
        "ttft_ms.p99 <= 200 holds up to the top of the range (clients = 256); raise high to search further"
    )


def test_holds_everywhere_minimize():
    out = search(lambda v: (True, None), low=1, high=8, maximize=False, key="gpus", constraint_text="c")
    assert (out.status, out.value) == ("holds-everywhere", 1)
    assert [p.value for p in out.probes] == [8, 7, 5, 1]
    assert out.message == "c holds down to the bottom of the range (gpus = 1); lower low to search further"


def test_single_value_range():
    assert search(_below(5), low=5, high=5).status == "holds-everywhere"
    assert search(_below(4), low=5, high=5).status == "fails-everywhere"
    assert len(search(_below(5), low=5, high=5).probes) == 1


def test_progress_called_after_each_probe():
    seen = []
    out = search(_below(27), low=1, high=256, progress=seen.append)
    assert tuple(seen) == out.probes
    assert all(isinstance(p, Probe) for p in seen)


def test_float_exact_small_case():
    # tolerance 0.25 from 0: offsets 0.25, 0.75, 1.75, 3.75 -> 3.75 fails (boundary 2.0);
    # bisect (1.75, 3.75): 2.75 fail, 2.25 fail, 2.0 pass -> gap 0.25: done.
    out = search(_below(2.0), low=0.0, high=10.0, integer=False, tolerance=0.25, key="rate",
                 constraint_text="ttft_ms.p99 <= 200")
    assert [p.value for p in out.probes] == [0.0, 0.25, 0.75, 1.75, 3.75, 2.75, 2.25, 2.0]
    assert (out.status, out.value, out.failing) == ("found", 2.0, 2.25)
    assert out.message == "largest rate with ttft_ms.p99 <= 200: 2 (2.25 fails)"
    assert all(isinstance(p.value, float) for p in out.probes)


def test_float_message_shows_enough_digits():
    out = search(_below(1.2345678), low=1.0, high=2.0, integer=False, tolerance=1e-7, key="rate",
                 constraint_text="c", max_probes=200)
    best, fails = out.message.split(": ")[1].removesuffix(" fails)").split(" (")
    assert best != fails
    assert float(best) <= 1.2345678 < float(fails)


# --- search: argument errors -----------------------------------------------------------------


def _never_called(value):
    raise AssertionError("evaluate must not be called")


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"low": 1.5, "high": 10}, "whole numbers"),
        ({"low": True, "high": 10}, "whole numbers"),
        ({"low": 10, "high": 1}, "must not be above"),
        ({"low": 1, "high": 10, "tolerance": 1}, "only for float keys"),
        ({"low": 0.0, "high": 1.0, "integer": False}, "needs a tolerance"),
        ({"low": 0.0, "high": 1.0, "integer": False, "tolerance": 0.0}, "positive"),
        ({"low": 0.0, "high": 1.0, "integer": False, "tolerance": math.nan}, "positive"),
        ({"low": 0.0, "high": math.inf, "integer": False, "tolerance": 0.1}, "finite"),
        ({"low": 1, "high": 10, "max_probes": 0}, "max_probes"),
        ({"low": 1, "high": 2**40}, "may need 80 runs, more than max_probes = 64"),
        ({"low": 1, "high": 256, "max_probes": 15}, "may need 16 runs"),
    ],
)
def test_bad_arguments_fail_before_probing(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        search(_never_called, **kwargs)


def test_max_search_probes_small_ranges():
    # hand-counted worst cases: N=0 -> 1; N=1 -> 2 (low, high); N=2 -> offsets 1, 2: a failure
    # at 2 after 1 passed leaves gap 1 -> 3 probes; also the formula max(1, 2*ceil(log2(N+1))).
    assert max_search_probes(low=0, high=0) == 1
    assert max_search_probes(low=0, high=1) == 2
    assert max_search_probes(low=0, high=2) == 3
    assert max_search_probes(low=1, high=256) == 16


# --- search: properties ----------------------------------------------------------------------

# Probe bound for an integer range of N = high - low (with J = ceil(log2(N + 1))):
#  * bracketing probes offsets 0, 1, 3, ..., 2^j - 1 (the last clipped to N); offset 2^J - 1 >= N,
#    so at most J + 1 bracketing probes, which is also the whole holds-everywhere case;
#  * if the probe at offset 2^j - 1 (j >= 1) fails, the last pass is at 2^(j-1) - 1, so the
#    gap is <= 2^(j-1), and bisection needs ceil(log2(gap)) <= j - 1 probes;
#  * total <= (j + 1) + (j - 1) = 2j <= 2J; with N = 0 there is one probe.
# Hence probes <= max(1, 2 * ceil(log2(N + 1))). N.bit_length() equals ceil(log2(N + 1)).


def _integer_bound(span: int) -> int:
    return max(1, 2 * math.ceil(math.log2(span + 1)))


def _check_probes(out, low, high):
    values = [p.value for p in out.probes]
    assert len(values) == len(set(values)), "a value was probed twice"
    assert all(low <= v <= high for v in values)


ranges = st.tuples(st.integers(-1000, 1000), st.integers(0, 10**6))


@given(ranges, st.data())
def test_integer_maximize_finds_exact_boundary(low_span, data):
    low, span = low_span
    high = low + span
    boundary = data.draw(st.integers(low - 1, high), label="boundary")
    calls = []

    def evaluate(v):
        calls.append(v)
        assert isinstance(v, int)
        return v <= boundary, -v

    out = search(evaluate, low=low, high=high)
    _check_probes(out, low, high)
    assert calls == [p.value for p in out.probes]
    assert len(out.probes) <= _integer_bound(span)
    assert len(out.probes) <= max_search_probes(low=low, high=high) <= _integer_bound(span)
    if boundary < low:
        assert (out.status, out.value, out.failing) == ("fails-everywhere", None, low)
    elif boundary == high:
        assert (out.status, out.value, out.payload) == ("holds-everywhere", high, -high)
    else:
        assert (out.status, out.value, out.failing, out.payload) == ("found", boundary, boundary + 1, -boundary)


@given(ranges, st.data())
def test_integer_minimize_finds_exact_boundary(low_span, data):
    low, span = low_span
    high = low + span
    boundary = data.draw(st.integers(low, high + 1), label="boundary")  # holds for v >= boundary
    out = search(lambda v: (v >= boundary, None), low=low, high=high, maximize=False)
    _check_probes(out, low, high)
    assert len(out.probes) <= _integer_bound(span)
    if boundary > high:
        assert (out.status, out.failing) == ("fails-everywhere", high)
        assert [p.value for p in out.probes] == [high]
    elif boundary == low:
        assert (out.status, out.value) == ("holds-everywhere", low)
    else:
        assert (out.status, out.value, out.failing) == ("found", boundary, boundary - 1)


@given(st.integers(0, 2**62), st.integers(0, 2**62), st.data())
def test_integer_huge_ranges(a, b, data):
    low, high = min(a, b), max(a, b)
    boundary = data.draw(st.integers(low, high))
    out = search(_below(boundary), low=low, high=high, max_probes=200)
    _check_probes(out, low, high)
    assert len(out.probes) <= _integer_bound(high - low)
    assert out.value == boundary


@given(
    st.floats(-1e3, 1e3),
    st.floats(0.0, 1e4),
    st.floats(1e-3, 10.0),
    st.floats(0.0, 1.0),
    st.booleans(),
)
@settings(max_examples=200)
# the first bracketing probe, 2.708984375 - 1.89453125 = 0.814453125, rounds to 0.81: below low
@example(0.8125, 1.896484375, 1.89453125, 0.0, False)
@example(-2.708984375, 1.896484375, 1.89453125, 1.0, True)  # its mirror: -0.81 above high
def test_float_result_within_tolerance(low, span, tolerance, where, maximize):
    high = low + span
    boundary = low + where * span
    assume(low <= boundary <= high)
    # maximize: holds for v <= boundary; minimize: holds for v >= boundary
    if maximize:
        out = search(lambda v: (v <= boundary, None), low=low, high=high, integer=False,
                     tolerance=tolerance, max_probes=1000)
    else:
        out = search(lambda v: (v >= boundary, None), low=low, high=high, integer=False,
                     tolerance=tolerance, maximize=False, max_probes=1000)
    _check_probes(out, low, high)
    assert len(out.probes) <= max_search_probes(low=low, high=high, integer=False, tolerance=tolerance)
    assert out.status in ("found", "holds-everywhere")
    assert dict((p.value, p.holds) for p in out.probes)[out.value] is True
    # within the tolerance up to rounding: 0.501 - 0.5 = 0.0010000000000000009 is a bracket of 0.001
    assert abs(out.value - boundary) <= tolerance * (1 + 1e-9)
    if out.status == "found":
        assert abs(out.failing - out.value) <= tolerance * (1 + 1e-9)
        assert (out.failing > boundary) if maximize else (out.failing < boundary)


@given(st.integers(0, 300), st.sets(st.integers(0, 300)), st.booleans())
def test_non_monotone_metric_still_ends_consistently(span, passing, maximize):
    # No monotonicity: the search must still stop within its bound, never repeat a value, and
    # report a passing value next to a failing one.
    out = search(lambda v: (v in passing, None), low=0, high=span, maximize=maximize)
    _check_probes(out, 0, span)
    assert len(out.probes) <= max_search_probes(low=0, high=span)
    if out.status == "found":
        assert out.value in passing and out.failing not in passing
        assert abs(out.value - out.failing) == 1
    elif out.status == "fails-everywhere":
        assert out.failing == (0 if maximize else span) and out.failing not in passing
    else:
        assert out.value == (span if maximize else 0) and out.value in passing



# --- [search] tables and their neighbours, checked when the experiment file is read ---------------

PLAIN_FILE = """\
[experiment]
name = "s"
reports = ["table"]
""" + TINY_WORKLOAD
SEARCH = """\
[search]
key = "workload.rate"
constraint = "ttft_ms.p99 <= 200"
"""


def _write(tmp_path, text: str, name: str = "s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("bounds, message", [
    ("low = 1.0\nhigh = 8.0\ntolerance = 0\n", "[search]: tolerance: must be a positive number, got 0"),
    ("low = 1.0\nhigh = 8.0\ntolerance = -0.5\n", "[search]: tolerance: must be a positive number, got -0.5"),
    ("low = 1.0\nhigh = 8.0\n", "[search]: tolerance: low = 1.0, high = 8.0 (written with a decimal point) make "
                                "a search over real values, which needs a tolerance"),
    ("low = 1.0\nhigh = inf\ntolerance = 0.5\n", "[search]: high: must be a finite number, got inf"),
    # an integer range of N = 2**40 - 1 needs 2 * ceil(log2(N + 1)) = 80 probes (module docstring)
    ("low = 1\nhigh = 1099511627776\n", "[search]: the search over workload.rate in [1, 1099511627776] "
                                         "may need 80 runs, more than the limit of 64; narrow the range"),
])
def test_a_search_the_runs_would_refuse_is_refused_when_the_file_is_read(tmp_path, bounds, message):
    path = _write(tmp_path, PLAIN_FILE + SEARCH + bounds)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: {message}")
    assert "max_probes" not in str(info.value)  # not a setting of the file


def test_a_tiny_tolerance_is_refused_with_what_to_change(tmp_path):
    path = _write(tmp_path, PLAIN_FILE + SEARCH + "low = 1.0\nhigh = 1000.0\ntolerance = 1e-300\n")
    with pytest.raises(ConfigError, match=r": \[search\]: the search over workload.rate in \[1, 1000\] may need "
                                          r"\d+ runs, more than the limit of 64; narrow the range or raise the "
                                          r"tolerance$"):
        load(path)
    path = _write(tmp_path, PLAIN_FILE + SEARCH + "low = 1.0\nhigh = 1000.0\ntolerance = 0.5\n")
    assert load(path).studies[0].search.tolerance == 0.5


@pytest.mark.parametrize("bounds, said", [
    ("low = 1.0\nhigh = 32.0\n", r"tolerance: low = 1.0, high = 32.0 \(written with a decimal point\) make a search "
                                 r"over real values, which needs a tolerance: how close to the boundary to get; for "
                                 r"one over whole numbers write low = 1, high = 32$"),
    ("low = 1\nhigh = 32.5\n", r"tolerance: a search over real values \(low or high is not a whole number\) needs a "
                               r"tolerance: how close to the boundary to get$")])
def test_a_whole_number_written_with_a_decimal_point_gets_the_way_to_an_integer_search(tmp_path, bounds, said):
    """Capacity review s79: low = 1.0 said 'low or high is not a whole number' and sent the user to add a
    tolerance, which a whole-number key then refused."""
    path = _write(tmp_path, PLAIN_FILE + SEARCH + bounds)
    with pytest.raises(ConfigError, match=r": \[search\]: " + said):
        load(path)


def test_an_slo_constraint_needs_slo_targets_when_the_file_is_read(tmp_path):
    text = PLAIN_FILE + SEARCH.replace('"ttft_ms.p99 <= 200"', '"slo.attainment >= 0.9"') + "low = 1\nhigh = 8\n"
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value) == (f"{path}: [search]: constraint: 'slo.attainment' needs [slo] targets "
                               "(ttft_ms, tpot_ms), and run 's' has none")
    path = _write(tmp_path, text + "[slo]\nttft_ms = 100\n")
    assert load(path).studies[0].search.constraint == "slo.attainment >= 0.9"


def test_a_constraint_may_have_a_negative_threshold():
    c = parse_constraint("throughput_tps > -5")
    assert (c.metric, c.op, c.threshold) == ("throughput_tps", ">", -5.0)
    assert c.holds({"throughput_tps": -4.0}) and not c.holds({"throughput_tps": -6.0})


def test_a_sweep_listing_one_number_twice_is_refused(tmp_path):
    path = _write(tmp_path, PLAIN_FILE + '[sweep]\n"workload.rate" = [1, 2, 1.0]\n')
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value) == f"{path}: [sweep]: 'workload.rate' lists 1 and 1.0, the same number"
    path = _write(tmp_path, PLAIN_FILE + '[sweep]\n"workload.rate" = [1, 2.5]\n')
    assert load(path).studies[0].sweep == [{"workload.rate": 1}, {"workload.rate": 2.5}]


def test_reports_listed_twice_are_refused(tmp_path):
    path = _write(tmp_path, PLAIN_FILE.replace('reports = ["table"]', 'reports = ["table", "json", "table"]'))
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value) == f"{path}: [experiment]: reports: lists 'table' twice"


def test_a_byte_order_mark_is_skipped_and_deep_nesting_is_a_toml_error(tmp_path):
    path = _write(tmp_path, PLAIN_FILE, "bom.toml")
    path.write_bytes(b"\xef\xbb\xbf" + PLAIN_FILE.encode())
    assert load(path).raw == load(_write(tmp_path, PLAIN_FILE)).raw
    path = _write(tmp_path, "a = " + "[" * 500 + "]" * 500 + "\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value) == f"{path}: not valid TOML: arrays or inline tables nested too deeply"
