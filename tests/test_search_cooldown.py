"""A search's cool-down (``[search] cooldown``): each probe's statistics leave out its last
requests sent, as guidellm's ``--cooldown`` leaves a benchmark's drain out of its results -- the
tail where arrivals have stopped and the last requests are served on an emptying engine. Same
form as the warm-up (tests/test_search_warmup.py), beside it or alone."""

import pytest

from schedlab.errors import ConfigError
from schedlab.results.metric_names import METRICS, check_metric_name
from schedlab.results.metrics import compute_metrics, measured_requests
from test_search_warmup import COUNTERS, ITL, WAVE, _rows, _small


def test_measured_requests_leave_out_the_last_sent_by_count_or_share():
    # sent at 5, 0, 0, 3 ms: order r1, r2 (tied at 0: by id), r3, r0
    req = _rows([5, 0, 0, 3], [6, 1, 1, 4], [7, 2, 2, 5], [1, 1, 1, 1], sent=[5, 0, 0, 3])
    assert list(measured_requests(req, 0, 1)) == [False, True, True, True]
    assert list(measured_requests(req, 0, 0.5)) == [False, True, True, False]   # half of 4: r3, r0
    assert list(measured_requests(req, 1, 1)) == [False, False, True, True]     # r1 first, r0 last
    assert list(measured_requests(req, 0, 0)) == [True] * 4


def test_a_warm_up_of_two_and_a_cool_down_of_one_on_the_hand_worked_run():
    """WAVE (tests/test_search_warmup.py): r0, r1 sent at 0; r2-r5 at 200, 250, 300, 350 ms.
    warmup = 2 leaves out r0, r1; cooldown = 1 leaves out r5 (sent last). Measured: r2, r3, r4,
    TTFTs 20, 20, 30 ms. Window: r2's arrival (200) to r4's finish (530), 0.33 s, open at its start.
    Tokens made in it: r2-r4's 9; r0's at 300, 400, 500 (3: its token at 200 came as the window
    opened); r1's at 250, 350 (2); r5's at 390 (1, its second at 590 is after): 15. Completed in it:
    r0-r4 (5), of which r2, r3, r4 within 35 ms (3)."""
    req = _rows(**WAVE, klass=["a", "b", "a", "b", "a", "b"])
    meta = {"slo": {"ttft_ms": 35.0}, "num_blocks": 10}
    m = compute_metrics(req, COUNTERS, ITL, dict(meta, warmup=2, cooldown=1))
    assert m["ttft_ms"]["max"] == 30.0 and m["ttft_ms"]["p50"] == 20.0
    assert m["slo"]["attainment"] == 1.0 and m["slo"]["met"] == 3
    assert m["warmup"] == {"requests": 2, "measured": 3, "measured_finished": 3, "measured_window_ms": 330.0}
    assert m["cooldown"] == {"requests": 1}
    assert m["throughput_tps"] == pytest.approx(15 / 0.33)
    assert m["request_throughput_rps"] == pytest.approx(5 / 0.33)
    assert m["slo"]["goodput_rps"] == pytest.approx(3 / 0.33)
    assert m["requests"] == 6 and m["finished"] == 6  # counts stay the whole run's
    # per class: b = r1, r3, r5; measured only r3 (TTFT 20)
    assert m["per_class"]["b"]["ttft_ms"]["max"] == 20.0 and m["per_class"]["b"]["requests"] == 3
    # a cool-down alone: r0-r4 measured (TTFTs 100, 150, 20, 20, 30), window 0 to 530 ms
    alone = compute_metrics(req, COUNTERS, ITL, dict(meta, cooldown=1))
    assert alone["ttft_ms"]["max"] == 150.0 and alone["slo"]["attainment"] == pytest.approx(3 / 5)
    assert alone["warmup"] == {"requests": 0, "measured": 5, "measured_finished": 5, "measured_window_ms": 530.0}
    assert alone["cooldown"] == {"requests": 1}
    assert set(m["cooldown"]) == set(METRICS["cooldown"]) and check_metric_name("cooldown.requests")


@pytest.mark.parametrize("line, message", [
    ("cooldown = 1.5", "cooldown: must be a whole number of requests from 0 to 10,000,000 (cooldown = 40) or a share "
                       "of each run's requests below 1 (cooldown = 0.1), got 1.5"),
    ("cooldown = -1", "cooldown: must be a whole number of requests"),
    ("cooldown = \"10\"", "cooldown: must be a whole number of requests"),
    ("warmup = 0.6\ncooldown = 0.5", "cooldown: with warmup = 0.6 leaves out every request of a run (together they "
                                     "must be below 1), got 0.5"),
])
def test_a_cool_down_that_cannot_be_is_refused_naming_the_key(tmp_path, line, message):
    with pytest.raises(ConfigError) as err:
        _small(tmp_path, warmup=line)
    assert str(err.value).startswith(f"{tmp_path / 'small.toml'}: [search]") and message in str(err.value)


def test_a_search_with_a_cool_down_measures_all_but_the_last_and_says_so(tmp_path):
    """60 requests: cooldown = 0.25 leaves out the last 15 sent in every probe, and the answer's
    note says so beside the warm-up."""
    study = _small(tmp_path, warmup="warmup = 10\ncooldown = 0.25")
    answer = study.search.payload
    assert answer.meta["cooldown"] == 0.25 and answer.meta["warmup"] == 10
    assert answer.metrics["cooldown"] == {"requests": 15} and answer.metrics["warmup"]["measured"] == 35
    assert ("leave out the first 10 and the last 15 of 60 requests sent (search.warmup = 10, search.cooldown = "
            "0.25)") in study.search.message
    plain = _small(tmp_path, warmup="warmup = 10").search.payload
    assert "cooldown" not in plain.metrics and "cooldown" not in plain.meta


def test_a_warm_up_and_cool_down_that_leave_out_every_request_are_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        _small(tmp_path, warmup="warmup = 30\ncooldown = 30")
    assert str(err.value) == (f"{tmp_path / 'small.toml'}: run 'small[rate=1.0]': [search] warmup = 30 and cooldown "
                              "= 30 leaves out all 60 of the run's requests, so none is measured: a smaller warmup or "
                              "cooldown (a share below 1, such as 0.1), or more requests")
    assert _small(tmp_path, warmup="warmup = 30\ncooldown = 29").search.payload.metrics["warmup"]["measured"] == 1
