"""Fixes from the review of the workload generators (reviews/workloads.md, session s77)."""

from __future__ import annotations

import numpy as np
import pytest

from schedlab_plugins.workloads.stages import parse_stages, stage_offsets_ms
from schedlab_plugins.workloads.synthetic import (
    SharedPrefixConfig, SyntheticConfig, make_shared_prefix_workload, make_synthetic_workload,
)

FIXED = {"dist": "fixed", "value": 8}
UNIFORM = {"dist": "uniform", "low": 1, "high": 1000}


# -- M3: each stage draws its gaps and lengths from its own stream ---------------------------------


def _stage_view(requests, start_ms):
    """(offset from start_ms, prompt, output) of the requests at or after start_ms."""
    return [(r.arrival_ms - start_ms, r.prompt_tokens, r.output_tokens) for r in requests if r.arrival_ms >= start_ms]


@pytest.mark.parametrize("arrival", ["poisson", "gamma"])
def test_changing_a_non_final_stage_rate_leaves_later_stages_alone(arrival):
    """Stage 1 at 1/s then 2/s for 10 s (10 then 20 requests): stage 2 (2/s for 5 s, from 110 s
    with a 100 s gap) keeps the same offsets and lengths."""
    cv = {"cv": 2.0} if arrival == "gamma" else {}

    def run(first_rate, seed):
        w = make_synthetic_workload(SyntheticConfig(
            prompt=UNIFORM, output={"dist": "uniform", "low": 1, "high": 50}, arrival=arrival, stage_gap_s=100,
            stages=[{"rate": first_rate, "duration_s": 10}, {"rate": 2, "duration_s": 5}], **cv))
        return list(w.requests(seed))

    for seed in (1, 7):
        slow, fast = run(1, seed), run(2, seed)
        assert len(slow) == 20 and len(fast) == 30
        a, b = _stage_view(slow, 110_000.0), _stage_view(fast, 110_000.0)
        assert len(a) == len(b) == 10
        assert a == b


def test_changing_a_non_final_stage_duration_leaves_the_others_offsets():
    def offsets(duration):
        stages = parse_stages(({"rate": 3, "duration_s": 2}, {"rate": 4, "duration_s": duration},
                               {"rate": 2, "duration_s": 5}))
        return stage_offsets_ms("poisson", stages, 3)

    base, other = offsets(5), offsets(9)
    assert len(base[1]) == 20 and len(other[1]) == 36
    assert np.array_equal(base[0], other[0]) and np.array_equal(base[2], other[2])
    # the stage whose duration changed keeps its first draws
    assert np.array_equal(base[1], other[1][:20])


def test_changing_the_first_stage_rate_leaves_later_drained_stages_alone():
    """after_drain: the second stage's requests (handed out when the first drains) are the same."""
    def second_stage(first_rate):
        w = make_synthetic_workload(SyntheticConfig(
            prompt=UNIFORM, output=FIXED, arrival="poisson", stage_start="after_drain",
            stages=[{"rate": first_rate, "duration_s": 4}, {"rate": 3, "duration_s": 2}]))
        first = list(w.requests(5))
        later = []
        for r in first:
            later += w.on_finish(r, 10_000.0)
        return [(r.arrival_ms, r.prompt_tokens) for r in later], len(first)

    (a, n_a), (b, n_b) = second_stage(1), second_stage(5)
    assert (n_a, n_b) == (4, 20)
    assert len(a) == 6 and a == b


def test_staged_shared_prefix_later_stage_sharing_is_unchanged():
    def run(first_rate):
        config = SharedPrefixConfig(num_groups=4, prefix_tokens=50, suffix=UNIFORM, output=FIXED,
                                    shared_fraction=0.5, popularity="zipf", arrival="constant",
                                    stages=[{"rate": first_rate, "duration_s": 2}, {"rate": 5, "duration_s": 2}])
        return [(r.arrival_ms, r.prompt_tokens, r.prefix_group, r.prefix_tokens)
                for r in make_shared_prefix_workload(config).requests(2) if r.arrival_ms >= 2000.0]

    a, b = run(3), run(8)
    assert len(a) == 10 and a == b
    assert sum(p for *_, p in a) == 5 * 50   # round(0.5 x 10) of the stage share


def test_staged_workloads_stay_deterministic():
    config = SyntheticConfig(prompt=UNIFORM, output=UNIFORM, arrival="gamma", cv=3.0,
                             stages=[{"rate": 3, "duration_s": 4}, {"rate": 7, "duration_s": 3}])
    runs = [[(r.id, r.arrival_ms, r.prompt_tokens, r.output_tokens) for r in make_synthetic_workload(config).requests(9)]
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 33
    other = [(r.id, r.arrival_ms, r.prompt_tokens, r.output_tokens) for r in make_synthetic_workload(config).requests(10)]
    assert other != runs[0]


# -- M2: guidellm throughput (and capped constant / poisson) keep their cap ---------------------------


def _guidellm_report(tmp_path, strategy, n=4, gap_s=0.25):
    import json

    rows = [{"request_start_time": 100 + i * gap_s, "request_end_time": 100.2 + i * gap_s,
             "info": {"timings": {"first_token_iteration": 100.1 + i * gap_s, "last_token_iteration": 100.2 + i * gap_s}},
             "prompt_tokens": 10 + i, "output_tokens": 3} for i in range(n)]
    table = {"config": {"strategy": strategy}, "metrics": {"request_totals": {"successful": n}},
             "requests": {"successful": rows, "errored": [], "incomplete": []}}
    path = tmp_path / "gl.json"
    path.write_text(json.dumps({"benchmarks": [table]}))
    from schedlab_plugins.workloads.guidellm import GuidellmConfig, make_guidellm_workload
    return make_guidellm_workload(GuidellmConfig(path=str(path)))


def _sent(requests):
    return [(r.id, r.arrival_ms, r.prompt_tokens) for r in requests]


def test_a_capped_throughput_benchmark_is_a_closed_loop_of_its_cap(tmp_path):
    """throughput@2, 4 requests recorded 250 ms apart: all due at the start, two sent at 0; a slot
    freed at 25 ms sends the third then, one freed at 30 the fourth."""
    w = _guidellm_report(tmp_path, {"type_": "throughput", "max_concurrency": 2})
    assert w.closed_loop and w.info["concurrency"] == 2 and w.info["strategy"] == "throughput"
    first = list(w.requests(0))
    assert _sent(first) == [(0, 0.0, 10), (1, 0.0, 11)]
    assert _sent(w.on_finish(first[0], 25.0)) == [(2, 25.0, 12)]
    assert _sent(w.on_finish(first[1], 30.0)) == [(3, 30.0, 13)]
    assert w.measured.arrival_ms.tolist() == pytest.approx([0.0, 250.0, 500.0, 750.0])  # as recorded


def test_an_uncapped_throughput_benchmark_sends_everything_at_once_under_guidellms_default_cap(tmp_path):
    w = _guidellm_report(tmp_path, {"type_": "throughput"}, n=3)
    assert w.closed_loop and w.cap == 10240 and w.info["concurrency"] == 10240
    assert _sent(w.requests(0)) == [(0, 0.0, 10), (1, 0.0, 11), (2, 0.0, 12)]


def test_a_throughput_ramp_up_spreads_the_first_cap_requests(tmp_path):
    """throughput@4 with rampup_duration 1 s (guidellm 0.8.1: the k-th request, from 1, at
    1 s x min(k, 4) / 4): due at 250, 500, 750, 1000, 1000, 1000 ms. A slot freed at 100 ms sends
    the fifth when it is due (1000)."""
    w = _guidellm_report(tmp_path, {"type_": "throughput", "max_concurrency": 4, "rampup_duration": 1.0}, n=6)
    first = list(w.requests(0))
    assert [r.arrival_ms for r in first] == [250.0, 500.0, 750.0, 1000.0]
    assert _sent(w.on_finish(first[0], 100.0)) == [(4, 1000.0, 14)]


@pytest.mark.parametrize("kind", ["constant", "poisson"])
def test_a_rate_strategy_with_max_concurrency_keeps_its_cap(tmp_path, kind):
    """constant@4/s capped at 2: requests due at their recorded starts 0, 250, 500, 750 ms, at
    most two in flight; the third (due 500) waits for the slot freed at 600."""
    w = _guidellm_report(tmp_path, {"type_": kind, "rate": 4.0, "max_concurrency": 2})
    assert w.closed_loop and w.info["concurrency"] == 2
    first = list(w.requests(0))
    assert _sent(first) == [(0, 0.0, 10), (1, 250.0, 11)]
    assert _sent(w.on_finish(first[0], 600.0)) == [(2, 600.0, 12)]
    assert _sent(w.on_finish(first[1], 610.0)) == [(3, 750.0, 13)]


@pytest.mark.parametrize("cap", [0, "2", 1.5, True])
def test_a_bad_max_concurrency_is_named(tmp_path, cap):
    from schedlab.errors import WorkloadError

    with pytest.raises(WorkloadError, match=r"benchmark 0: strategy throughput: max_concurrency must be a whole "
                                            r"number >= 1 or null, got"):
        _guidellm_report(tmp_path, {"type_": "throughput", "max_concurrency": cap})


# -- L2: prefix_group and prefix_tokens go together in a request file ------------------------------------


def _file_workload(path, **settings):
    from schedlab_plugins.workloads.request_file import FileConfig, make_file_workload
    return make_file_workload(FileConfig(path=str(path), **settings))


def test_a_prefix_group_without_prefix_tokens_is_refused_naming_the_line(tmp_path):
    from schedlab.errors import WorkloadError

    path = tmp_path / "r.csv"
    path.write_text("prompt_tokens,output_tokens,prefix_group,prefix_tokens\n100,5,a,50\n100,5,a,\n")
    with pytest.raises(WorkloadError, match=r"r\.csv: line 3: prefix_group 'a' without prefix_tokens"):
        _file_workload(path)
    path.write_text("prompt_tokens,output_tokens,prefix_group\n100,5,a\n100,5,a\n")
    with pytest.raises(WorkloadError, match=r"r\.csv: line 2: prefix_group 'a' without prefix_tokens"):
        _file_workload(path)


def test_prefix_tokens_without_a_prefix_group_is_refused_naming_the_line(tmp_path):
    from schedlab.errors import WorkloadError

    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt_tokens": 100, "output_tokens": 5}\n'
                    '{"prompt_tokens": 100, "output_tokens": 5, "prefix_tokens": 0}\n'
                    '{"prompt_tokens": 100, "output_tokens": 5, "Sys": 64}\n')
    with pytest.raises(WorkloadError, match=r"r\.jsonl: line 3: prefix_tokens \(column 'Sys'\) 64 without "
                                            r"prefix_group"):
        _file_workload(path, columns={"prefix_tokens": "Sys"})


def test_prefix_pairs_and_unshared_rows_are_read(tmp_path):
    """A group with its tokens, and an unshared row written as a run writes it (no group, 0 tokens)."""
    path = tmp_path / "r.csv"
    path.write_text("prompt_tokens,output_tokens,prefix_group,prefix_tokens\n100,5,a,50\n100,5,,0\n90,5,a,50\n")
    reqs = list(_file_workload(path).requests(0))
    assert [(r.prefix_group, r.prefix_tokens) for r in reqs] == [("a", 50), (None, 0), ("a", 50)]


def test_an_inline_request_with_a_group_but_no_tokens_is_refused():
    from schedlab.errors import WorkloadError
    from schedlab_plugins.workloads.request_file import InlineConfig, make_inline_workload

    with pytest.raises(WorkloadError, match=r"requests: record 2: prefix_group 'g' without prefix_tokens"):
        make_inline_workload(InlineConfig(requests=[{"prompt_tokens": 10, "output_tokens": 2},
                                                    {"prompt_tokens": 10, "output_tokens": 2, "prefix_group": "g"}]))


# -- L3: stages with all-at-once arrivals ------------------------------------------------------------------


@pytest.mark.parametrize("config", [SyntheticConfig, SharedPrefixConfig])
def test_stages_with_all_at_once_arrivals_are_refused(config):
    from schedlab.configs import FieldError

    extra = {"num_groups": 2, "prefix_tokens": 4, "suffix": FIXED} if config is SharedPrefixConfig else {"prompt": FIXED}
    with pytest.raises(FieldError, match=r"stages: do not apply with arrival = 'all-at-once': every request of a "
                                         r"stage would arrive at the stage's start"):
        config(output=FIXED, arrival="all-at-once", stages=[{"rate": 2, "duration_s": 3}, {"rate": 1, "duration_s": 2}],
               **extra)


# -- L4: settings that cannot take effect -------------------------------------------------------------------


@pytest.mark.parametrize("arrival, rate, why", [
    ("all-at-once", None, "every request arrives at t = 0"),
    ("constant", 10, r"the arrivals are drawn at the rate \(time_scale = 2 would halve it: set rate instead\)"),
    ("poisson", 10, "the arrivals are drawn at the rate"),
])
def test_time_scale_with_arrivals_not_from_the_file_is_refused(tmp_path, arrival, rate, why):
    from schedlab.configs import FieldError
    from schedlab_plugins.workloads.request_file import FileConfig

    with pytest.raises(FieldError, match=rf"time_scale: only applies with arrival = 'file' .*not '{arrival}': {why}"):
        FileConfig(path=str(tmp_path / "r.csv"), arrival=arrival, rate=rate, time_scale=2.0)


def test_time_scale_still_stretches_the_files_arrivals(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("arrival_ms,prompt_tokens,output_tokens\n0,5,1\n100,5,1\n")
    assert [r.arrival_ms for r in _file_workload(path, time_scale=2.0).requests(0)] == [0.0, 200.0]
    assert [r.arrival_ms for r in _file_workload(path).requests(0)] == [0.0, 100.0]
    assert [r.arrival_ms for r in _file_workload(path, arrival="constant", rate=10).requests(0)] == [0.0, 100.0]


def _shared_prefix(**settings):
    return SharedPrefixConfig(num_groups=4, prefix_tokens=16, suffix=FIXED, output=FIXED, num_requests=200,
                              arrival="constant", rate=10, **settings)


def test_zipf_s_with_uniform_popularity_is_refused():
    from schedlab.configs import FieldError

    with pytest.raises(FieldError, match=r"zipf_s: only applies with popularity = 'zipf', not 'uniform'"):
        _shared_prefix(zipf_s=1.5)
    with pytest.raises(FieldError, match=r"zipf_s: only applies with popularity = 'zipf'"):
        _shared_prefix(zipf_s=1.0, popularity="uniform")


def test_zipf_s_unset_is_one():
    def groups(config):
        return [r.prefix_group for r in make_shared_prefix_workload(config).requests(3)]

    assert _shared_prefix().zipf_s is None
    assert groups(_shared_prefix(popularity="zipf")) == groups(_shared_prefix(popularity="zipf", zipf_s=1.0))
    assert groups(_shared_prefix(popularity="zipf")) != groups(_shared_prefix(popularity="zipf", zipf_s=2.0))


@pytest.mark.parametrize("table, message", [
    ({"median": 5000, "sigma": 1, "high": 100},
     r"median \(5000\) must lie within \[low, high\] = \[1, 100\]: .* their median would be 100, not 5000"),
    ({"median": 10, "sigma": 1, "low": 20, "high": 300},
     r"median \(10\) must lie within \[low, high\] = \[20, 300\]: .* their median would be 20, not 10"),
    ({"median": 0.5, "sigma": 1}, r"median \(0.5\) must lie within \[low, ...\] = \[1, ...\]"),
])
def test_a_lognormal_median_outside_its_bounds_is_refused(table, message):
    from schedlab.configs import FieldError
    from schedlab_plugins.workloads.distributions import parse_distribution

    with pytest.raises(FieldError, match=r"prompt: " + message):
        parse_distribution({"dist": "lognormal", **table}, field="prompt")


def test_a_lognormal_median_at_its_bounds_is_read():
    from schedlab_plugins.workloads.distributions import parse_distribution

    for table in ({"median": 100, "sigma": 1, "high": 100}, {"median": 20, "sigma": 1, "low": 20}):
        parse_distribution({"dist": "lognormal", **table}, field="prompt")


# -- L6: the mix names the setting that makes a class closed-loop --------------------------------------


@pytest.mark.parametrize("extra, said", [
    ({"max_concurrency": 4}, r"max_concurrency = 4 makes it closed-loop"),
    ({"stages": [{"rate": 5, "duration_s": 1}], "stage_start": "after_drain"},
     r"stage_start = 'after_drain' makes it closed-loop"),
])
def test_the_mix_names_what_makes_a_class_closed_loop(extra, said):
    from schedlab.errors import ConfigError
    from schedlab_plugins.workloads.mix import MixConfig, make_mix_workload

    table = {"kind": "synthetic", "prompt": FIXED, "output": FIXED, "arrival": "constant", **extra}
    if "stages" not in extra:
        table.update(num_requests=5, rate=5)
    with pytest.raises(ConfigError, match=r"\[workload\.classes\.a\]: " + said + r" .*cannot be part of a mix") as info:
        make_mix_workload(MixConfig(classes={"a": table}))
    assert "'synthetic' is closed-loop" not in str(info.value)


# -- L5: diurnal peak_hour is the single busiest hour ---------------------------------------------------


@pytest.mark.parametrize("peak", [14, 0, 23])
def test_peak_hour_is_the_single_busiest_hour(peak):
    """Weights 1 + 0.6 cos(2 pi (h - peak) / 24) at each hour's start: 1.6 at the peak, 0.4
    twelve hours later (a quarter), 1 + 0.6 cos(pi / 12) either side of the peak."""
    from schedlab_plugins.workloads.diurnal import DiurnalConfig, hourly_weights

    w = hourly_weights(DiurnalConfig(mean_rate=1.0, peak_hour=float(peak), prompt=FIXED, output=FIXED))
    assert int(np.argmax(w)) == peak and np.sum(w == w.max()) == 1
    assert w[peak] == pytest.approx(1.6) and w[(peak + 12) % 24] == pytest.approx(0.4)
    assert w[(peak + 1) % 24] == pytest.approx(1 + 0.6 * np.cos(np.pi / 12)) == w[(peak - 1) % 24]
    assert w.min() / w.max() == pytest.approx(0.25)
