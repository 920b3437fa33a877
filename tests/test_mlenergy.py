"""An ML.ENERGY benchmark results.json (mlenergy.llm.benchmark, v3.0): replayed as a workload, and
compared with as a target -- its latency statistics and its steady-state energy per token and power."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from schedlab.cli import main
from schedlab.errors import WorkloadError
from schedlab.targets import MLENERGY_KIND, TargetWarning, read_summary, steady_state_energy
from schedlab_plugins.workloads.measured import BenchReplayWarning
from schedlab_plugins.workloads.mlenergy import MlenergyConfig, make_mlenergy_workload


def request(input_len, output_len, ttft=0.1, latency=1.0, error=""):
    return {"prompt": "p", "output_text": "o", "reasoning_output_text": "", "input_len": input_len,
            "output_len": output_len, "latency": latency, "ttft": ttft, "itl": [0.01] * max(0, output_len - 1),
            "error": error, "energy": 1.0}


def results(rows, **extra) -> dict:
    """A results.json as the benchmark writes it (its keys; the statistics made up)."""
    return {"duration": 20.0, "completed": len(rows), "steady_state_duration": 8.0, "steady_state_energy": 4000.0,
            "steady_state_energy_per_token": 0.25, "total_input_tokens": 1, "total_output_tokens": 1,
            "request_throughput": 3.0, "output_throughput": 600.0, "total_token_throughput": 900.0,
            "steady_state_measurement": {"time": 8.0, "gpu_energy": {"0": 4000.0}},
            "timeline": {"benchmark_start_time": 0.0, "steady_state_start_time": 2.0, "steady_state_end_time": 10.0},
            "mean_ttft_ms": 120.0, "median_ttft_ms": 110.0, "p99_ttft_ms": 300.0, "mean_itl_ms": 12.0,
            "mean_e2el_ms": 2500.0, "results": rows, **extra}


def test_the_successful_requests_are_replayed_all_at_once_with_their_lengths(tmp_path):
    path = tmp_path / "results.json"
    rows = [request(120, 40, ttft=0.2, latency=1.0), request(300, 0, error="timeout"), request(80, 1),
            request(64, 0)]
    path.write_text(json.dumps(results(rows)))
    with pytest.warns(BenchReplayWarning, match="1 requests without an error have output_len 0"):
        workload = make_mlenergy_workload(MlenergyConfig(path=str(path)))
    replayed = list(workload.requests(0))
    assert [(r.arrival_ms, r.prompt_tokens, r.output_tokens) for r in replayed] == [(0.0, 120, 40), (0.0, 80, 1)]
    m = workload.measured
    assert list(m.ttft_ms) == pytest.approx([200.0, 100.0]) and list(m.e2e_ms) == pytest.approx([1000.0, 1000.0])
    assert m.tpot_ms[0] == pytest.approx(800.0 / 39) and np.isnan(m.tpot_ms[1]) and m.view == "client"
    assert workload.info["requests_in_file"] == 4


@pytest.mark.parametrize("row, message", [
    ({"input_len": 0, "output_len": 5}, r"results\[0\]\.input_len: must be a whole number from 1"),
    ({"input_len": 5, "output_len": "7"}, r"results\[0\]\.output_len: must be a whole number from 0"),
    ({"input_len": 5, "output_len": 5, "ttft": -1.0}, r"results\[\]\.ttft\[0\]: must be a number of seconds >= 0"),
])
def test_a_bad_request_row_is_named(tmp_path, row, message):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results([{**request(5, 5), **row}])))
    with pytest.raises(WorkloadError, match=message):
        make_mlenergy_workload(MlenergyConfig(path=str(path)))


def test_a_file_without_requests_is_named(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"completed": 0}))
    with pytest.raises(WorkloadError, match="not an ML.ENERGY results.json"):
        make_mlenergy_workload(MlenergyConfig(path=str(path)))


def test_as_a_target_it_gives_the_latencies_and_the_steady_states_energy(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results([request(10, 10)])))
    summary = read_summary(path)
    assert summary.kind == MLENERGY_KIND and summary.view == "client"
    assert summary.values["energy.steady_j_per_token"] == 0.25
    assert summary.values["energy.steady_power_w"] == 500.0   # 4,000 J over 8 s, all GPUs
    assert summary.values["ttft_ms.mean"] == 120.0 and summary.values["ttft_ms.p50"] == 110.0


def _run(requests, timeline, slots, busy_j):
    """A stand-in for a run's result: its requests, timeline and energy record."""
    req = {"rejected": np.zeros(len(requests)), "first_token_ms": np.array([r[0] for r in requests], dtype=float),
           "finish_ms": np.array([r[1] for r in requests], dtype=float),
           "generated_tokens": np.array([r[2] for r in requests])}
    t = {k: np.array(v, dtype=float) for k, v in timeline.items()}
    return types.SimpleNamespace(all_requests=lambda: req, timeline=t,
                                 meta={"slots": slots, "instances": 1, "energy": {"instances": [{"busy_j": busy_j}]}})


def test_the_steady_state_by_hand():
    # B = 2, N = 6 requests: first tokens at 10, 20, ... 60 ms, done at 50, 60, ... 100 -> the
    # window runs from the 2nd first token (20) to the moment N - B - 1 = 3 have finished (70).
    # Tokens in it: the first tokens at 20 ... 60 (5), and each request's later tokens spread
    # evenly from its first to its last: r0 (10 -> 50, 4 over 40 ms, 30 of them inside: 3),
    # r1 (20 -> 60: 4), r2 (30 -> 70, 2 over 40 ms: 2), r3 (40 -> 80, 1 over 40 ms, 30 inside:
    # 0.75), r4 (20 inside: 0.5), r5 (10 inside: 0.25): 15.5 tokens in 50 ms, 310 a second.
    # Energy: the row 0-15 ms is before it, 15-35 (40 J) has 15 of its 20 ms inside (30 J),
    # 35-55 (60 J) all, 55-85 (90 J) 15 of 30 (45 J): 135 J over 50 ms -> 2,700 W, 135 / 15.5 J
    # a token. Running: 2 over 15 ms, 1 over 20, 2 over 15 -> 1.6.
    requests = [(10, 50, 5), (20, 60, 5), (30, 70, 3), (40, 80, 2), (50, 90, 2), (60, 100, 2)]
    timeline = {"time_ms": [0, 15, 35, 55], "duration_ms": [15, 20, 20, 30], "energy_j": [30, 40, 60, 90],
                "running": [2, 2, 1, 2], "iterations": [1, 1, 1, 1]}
    steady = steady_state_energy(_run(requests, timeline, 2, 220.0))
    assert steady["steady_power_w"] == pytest.approx(2700.0)
    assert steady["steady_j_per_token"] == pytest.approx(135.0 / 15.5)
    assert steady["steady_tokens_per_s"] == pytest.approx(310.0)
    assert steady["steady_batch"] == pytest.approx(1.6)
    # the file's B, not the scheduler's: B = 3 runs from the 3rd first token (30) to the 2nd
    # request done (60): first tokens at 30 ... 60 (4) and 2 + 3 + 1.5 + 0.5 + 0.25 + 0 later
    # ones: 11.25 in 30 ms
    assert steady_state_energy(_run(requests, timeline, 2, 220.0), 3)["steady_tokens_per_s"] == pytest.approx(375.0)
    # instances: each one's mean running over the time it stepped, summed (2, and (20 + 30) / 35)
    two = steady_state_energy(_run(requests, {**timeline, "instance": [0, 0, 1, 1]}, 2, 220.0))
    assert two["steady_batch"] == pytest.approx(2.0 + 50.0 / 35.0)
    # no steady state when N - B - 1 < 1; a thinned timeline (its rows miss energy the run had)
    # says nothing of energy, and a run without [power] nothing either -- its pace and batch hold
    assert np.isnan(steady_state_energy(_run(requests[:3], timeline, 2, 220.0))["steady_tokens_per_s"])
    thinned = steady_state_energy(_run(requests, timeline, 2, 440.0))
    assert np.isnan(thinned["steady_j_per_token"]) and thinned["steady_tokens_per_s"] == pytest.approx(310.0)
    unmetered = _run(requests, {k: v for k, v in timeline.items() if k != "energy_j"}, 2, 0.0)
    unmetered.meta.pop("energy")
    bare = steady_state_energy(unmetered)
    assert np.isnan(bare["steady_power_w"]) and bare["steady_batch"] == pytest.approx(1.6)


def test_the_inter_token_latencies_are_ml_energys_own(tmp_path):
    """The benchmark appends a 0 for the first token and for each token that came in the chunk
    before it; the leaderboard spreads a gap over the zeros after it, and so does the target."""
    rows = [{**request(10, 5), "itl": [0, 0.02, 0.01, 0, 0.04]},    # gaps: 20; 10, 0 -> 5, 5; 40
            {**request(10, 4), "itl": [0, 0, 0.03, 0, 0]},          # 30, 0, 0 -> 10 x 3
            {**request(10, 4), "itl": [0, 9.0, 9.0, 9.0], "success": False, "error": "boom"}]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results(rows, median_itl_ms=0.0, p90_itl_ms=1.0)))
    values = read_summary(path).values
    gaps = [20.0, 5.0, 5.0, 40.0, 10.0, 10.0, 10.0]
    assert values["itl_ms.mean"] == pytest.approx(np.mean(gaps))
    assert values["itl_ms.p50"] == pytest.approx(10.0)
    assert values["itl_ms.p90"] == pytest.approx(np.percentile(gaps, 90))


def test_a_failed_request_is_told_by_its_success_flag(tmp_path):
    path = tmp_path / "results.json"
    rows = [request(120, 40), {**request(300, 20), "success": False}, {**request(80, 3), "success": True}]
    path.write_text(json.dumps(results(rows)))
    workload = make_mlenergy_workload(MlenergyConfig(path=str(path)))
    assert [(r.prompt_tokens, r.output_tokens) for r in workload.requests(0)] == [(120, 40), (80, 3)]


def test_the_steady_states_pace_and_batch_are_targets(tmp_path):
    """Output tokens per second over the steady state (its energy over its energy per token, over
    its time), and the batch the prometheus.json beside it measured; a bad one is said."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results([request(10, 10)], max_num_seqs=16)))
    summary = read_summary(path)
    assert summary.values["energy.steady_tokens_per_s"] == pytest.approx(4000.0 / 0.25 / 8.0)
    assert "energy.steady_batch" not in summary.values and summary.batch == 16
    (tmp_path / "prometheus.json").write_text(json.dumps({"steady_state_stats": {"vllm:num_requests_running": 14.5}}))
    summary = read_summary(path)
    assert summary.values["energy.steady_batch"] == 14.5
    assert [name for name in summary.values if name.startswith("energy.")] == [
        "energy.steady_batch", "energy.steady_j_per_token", "energy.steady_power_w", "energy.steady_tokens_per_s"]
    (tmp_path / "prometheus.json").write_text('{"steady_state_stats": {}}')
    with pytest.warns(TargetWarning, match="prometheus.json holds no steady_state_stats.vllm:num_requests_running"):
        assert "energy.steady_batch" not in read_summary(path).values


TOML = """
[experiment]
name = "mle"
reports = ["json"]

[workload]
kind = "mlenergy"
path = "results.json"

[scheduler]
kind = "continuous"
max_num_seqs = 8

[cost_model]
kind = "linear"
prefill_ms_per_token = 0.05
decode_ms_per_step = 10.0

[kv_cache]
kind = "paged"
num_blocks = 4096
block_size = 16
%s
[target]
path = "results.json"
"""


def test_a_replay_against_its_own_file_compares_the_steady_states_energy(tmp_path, capsys):
    """With the fixed-active power model a busy GPU draws its active power throughout, so the
    steady state's power is exactly that; without [power] the energy statistics are left out."""
    rng = np.random.default_rng(3)
    rows = [request(int(p), int(o)) for p, o in zip(rng.integers(50, 200, 64), rng.integers(20, 120, 64))]
    (tmp_path / "results.json").write_text(json.dumps(results(rows)))
    power = '[power]\nkind = "fixed_active"\nactive_w = 400.0\nstandby_w = 100.0\nidle_w = 50.0\ngpu = "h100-80gb"\n'
    (tmp_path / "exp.toml").write_text(TOML % power)
    assert main(["run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    run = json.loads((tmp_path / "out" / "summary.json").read_text())["studies"][0]["runs"][0]
    sim = run["metrics"]["vs_target"]["simulated"]
    assert sim["energy.steady_power_w"] == pytest.approx(400.0, rel=1e-9)
    assert 0 < sim["energy.steady_j_per_token"] < 400.0 * 10e-3   # 400 W x 10 ms steps over >= 1 token each
    assert run["meta"]["target"]["kind"] == MLENERGY_KIND
    (tmp_path / "exp.toml").write_text(TOML % "")
    assert main(["run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out2")]) == 0
    assert "need a [power] table to compare: left out" in capsys.readouterr().err
    run = json.loads((tmp_path / "out2" / "summary.json").read_text())["studies"][0]["runs"][0]
    measured = run["metrics"]["vs_target"]["measured"]
    assert "energy.steady_j_per_token" not in measured and "energy.steady_power_w" not in measured
    assert measured["energy.steady_tokens_per_s"] == pytest.approx(2000.0)   # its pace needs no [power]


def test_the_energy_statistics_are_names_a_fit_may_choose():
    from schedlab.errors import ConfigError
    from schedlab.targets import check_statistic_names

    check_statistic_names(["energy.steady_j_per_token", "energy.steady_power_w", "ttft_ms.mean"], "--statistics")
    with pytest.raises(ConfigError, match="'energy.steady_joules' is not a statistic"):
        check_statistic_names(["energy.steady_joules"], "--statistics")


def test_calibrate_leaves_the_energy_out_of_a_run_without_power(tmp_path, capsys):
    """--target results.json against a run without [power]: the energy statistics are left out with
    a warning (the fit had stopped at 'the simulation has no value to compare')."""
    rows = [request(100, 50) for _ in range(40)]
    (tmp_path / "results.json").write_text(json.dumps(results(rows)))
    (tmp_path / "exp.toml").write_text((TOML % "").replace('[target]\npath = "results.json"\n', ""))
    code = main(["calibrate", str(tmp_path / "exp.toml"), "--target", str(tmp_path / "results.json"),
                 "--fit", "cost_model.decode_ms_per_step=5:20", "--max-evaluations", "6", "--starts", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "--target: results.json's energy.steady_j_per_token and energy.steady_power_w need a [power] table" \
           in captured.err.replace(str(tmp_path) + "/", "")
    assert "energy.steady_j_per_token" not in captured.out and "energy.steady_power_w" not in captured.out


@pytest.mark.parametrize("file_batch, cluster, said", [
    (16, "", "the measured run ran max_num_seqs = 16, the simulated one 8: set [scheduler] max_num_seqs = 16 to "
             "replay it"),
    (8, "", None),
    (16, "[cluster]\ninstances = 2\n", None),   # each instance its share, as vLLM's data-parallel engines
    (32, "[cluster]\ninstances = 2\n", "the measured run ran max_num_seqs = 32, the simulated one 16 (2 x 8): set "
                                       "[scheduler] max_num_seqs = 16 to replay it (32 over its 2 instances)"),
    (15, "[cluster]\ninstances = 2\n", "the simulated one 16 (2 x 8): 15 does not split evenly over its 2 instances"),
])
def test_a_scheduler_cap_other_than_the_runs_is_said(tmp_path, capsys, file_batch, cluster, said):
    rows = [request(100, 20) for _ in range(40)]
    (tmp_path / "results.json").write_text(json.dumps(results(rows, max_num_seqs=file_batch)))
    (tmp_path / "exp.toml").write_text(TOML % cluster)
    assert main(["validate", str(tmp_path / "exp.toml")]) == 0
    err = capsys.readouterr().err
    if said is None:
        assert "max_num_seqs" not in err, err
    else:
        assert said in err and err.count("the measured run ran") == 1 and "[workload]: the measured" in err, err


@pytest.mark.parametrize("file_budget, said", [
    (2048, "the measured run ran max_num_batched_tokens = 2048 (each engine), the simulated one 8192: set "
           "[scheduler] max_num_batched_tokens = 2048 to replay it"),
    (8192, None),
    (None, None),   # the benchmark passed no --max-num-batched-tokens: nothing to compare
])
def test_a_token_budget_other_than_the_runs_is_said(tmp_path, capsys, file_budget, said):
    rows = [request(100, 20) for _ in range(40)]
    (tmp_path / "results.json").write_text(json.dumps(results(rows, max_num_seqs=8,
                                                              max_num_batched_tokens=file_budget)))
    (tmp_path / "exp.toml").write_text(TOML % "")   # the continuous scheduler's default budget: 8,192
    assert main(["validate", str(tmp_path / "exp.toml")]) == 0
    err = capsys.readouterr().err
    if said is None:
        assert "max_num_batched_tokens" not in err, err
    else:
        assert said in err and err.count("the measured run ran max_num_batched_tokens") == 1, err


def test_a_target_alone_says_its_cap_too(tmp_path, capsys):
    """Another workload (the same requests from a file) compared with the ML.ENERGY run: the
    [target] table says the cap, once."""
    rows = [request(100, 20) for _ in range(40)]
    (tmp_path / "results.json").write_text(json.dumps(results(rows, max_num_seqs=16)))
    (tmp_path / "requests.json").write_text(json.dumps([{"prompt_tokens": 100, "output_tokens": 20}] * 40))
    toml = (TOML % "").replace('kind = "mlenergy"\npath = "results.json"',
                               'kind = "file"\npath = "requests.json"\narrival = "all-at-once"')
    (tmp_path / "exp.toml").write_text(toml)
    assert main(["validate", str(tmp_path / "exp.toml")]) == 0
    err = capsys.readouterr().err
    assert err.count("the measured run ran max_num_seqs = 16, the simulated one 8") == 1
    assert "[target]: the measured run ran" in err, err


def test_the_measured_power_is_summed_over_the_gpus_by_hand(tmp_path):
    """Zeus's timeline: per power domain (instant preferred), each GPU's [unix s, W] samples;
    summed on one grid, in ms from the benchmark's start, with its steady state."""
    from schedlab_plugins.workloads.mlenergy import measured_power

    power = {"device_instant": {"0": [[100.0, 200.0], [101.0, 300.0]], "1": [[100.5, 100.0], [101.0, 100.0]]},
             "device_average": {"0": [[100.0, 999.0], [101.0, 999.0]]}}
    timeline = {"benchmark_start_time": 100.0, "steady_state_start_time": 100.25, "steady_state_end_time": 100.75,
                "power": power}
    (times, watts), steady = measured_power({"timeline": timeline}, "f")
    assert steady == pytest.approx((250.0, 750.0))
    assert times.size == 21 and times[0] == 0.0 and times[-1] == pytest.approx(1000.0)
    # GPU 1 holds its first reading before its first sample; GPU 0 rises linearly
    assert watts[0] == pytest.approx(300.0) and watts[10] == pytest.approx(350.0) and watts[-1] == pytest.approx(400.0)
    bare = measured_power({"timeline": {**timeline, "power": power["device_instant"]}}, "f")[0]
    assert np.allclose(bare[1], watts)
    with pytest.warns(BenchReplayWarning, match="timeline.power holds no GPU's power samples"):
        assert measured_power({"timeline": {**timeline, "power": {"0": [[1.0, 2.0]]}}}, "f") == (None, (250.0, 750.0))
    assert measured_power({"timeline": {"power": power}}, "f") == (None, None)   # no start: no clock to read it by


def test_the_compare_report_draws_the_power_measured_and_simulated(tmp_path):
    """A replay with [power] of a file with a power timeline: measured_power.png, and the
    simulated power read off the run's steps -- the fixed-active model's 400 W while it steps."""
    from schedlab.study.experiment import load, run_experiment
    from schedlab_plugins.reports.measured import simulated_power

    rng = np.random.default_rng(5)
    rows = [request(int(p), int(o)) for p, o in zip(rng.integers(50, 200, 48), rng.integers(20, 120, 48))]
    timeline = {"benchmark_start_time": 0.0, "steady_state_start_time": 1.0, "steady_state_end_time": 5.0,
                "power": {"device_instant": {"0": [[t / 10, 300.0 + t] for t in range(80)]}}}
    (tmp_path / "results.json").write_text(json.dumps(results(rows, timeline=timeline)))
    power = '[power]\nkind = "fixed_active"\nactive_w = 400.0\nstandby_w = 100.0\nidle_w = 50.0\ngpu = "h100-80gb"\n'
    (tmp_path / "exp.toml").write_text((TOML % power).replace('reports = ["json"]', 'reports = ["json", "compare"]'))
    assert main(["run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "plots" / "measured_power.png").stat().st_size > 0
    run = run_experiment(load(tmp_path / "exp.toml")).all_runs()[0]
    t = run.timeline
    middle = t["time_ms"][len(t["time_ms"]) // 2] + t["duration_ms"][len(t["time_ms"]) // 2] / 2
    assert simulated_power(run, np.array([middle, -1.0])) == pytest.approx([400.0, 0.0])


SCRAPE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {r0}
vllm:num_requests_running{{engine="1",model_name="m"}} {r1}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {w}
vllm:num_requests_waiting_by_reason{{engine="0",reason="capacity"}} 99.0
"""


def test_the_servers_running_and_waiting_are_read_from_its_scrapes(tmp_path):
    """prometheus.json's timeline of /metrics scrapes: each one's gauges summed over the engines,
    in ms from the benchmark's start; drawn in measured_timeline.png by the compare report."""
    rows = [request(100, 20) for _ in range(40)]
    timeline = {"benchmark_start_time": 50.0, "steady_state_start_time": 51.0, "steady_state_end_time": 52.0}
    (tmp_path / "results.json").write_text(json.dumps(results(rows, timeline=timeline)))
    scrapes = [{"timestamp": 52.0, "metrics": SCRAPE.format(r0=3.0, r1=4.0, w=1.0)},
               {"timestamp": 51.0, "metrics": SCRAPE.format(r0=8.0, r1=8.0, w=24.0)}]
    (tmp_path / "prometheus.json").write_text(json.dumps({"steady_state_stats": {"vllm:num_requests_running": 12.0},
                                                          "timeline": scrapes}))
    measured = make_mlenergy_workload(MlenergyConfig(path=str(tmp_path / "results.json"))).measured
    times, running, waiting = measured.occupancy
    assert times.tolist() == [1000.0, 2000.0] and running.tolist() == [16.0, 7.0] and waiting.tolist() == [24.0, 1.0]
    (tmp_path / "exp.toml").write_text((TOML % "").replace('reports = ["json"]', 'reports = ["json", "compare"]'))
    assert main(["run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "plots" / "measured_timeline.png").stat().st_size > 0
    (tmp_path / "prometheus.json").write_text('{"timeline": [{"timestamp": "soon"}]}')
    with pytest.warns(BenchReplayWarning, match="its timeline holds no /metrics scrapes"):
        assert make_mlenergy_workload(MlenergyConfig(path=str(tmp_path / "results.json"))).measured.occupancy is None


def test_a_repeated_question_shares_its_prefix_blocks(tmp_path):
    """The benchmark sends its questions num_request_repeats times: the same prompt text gives the
    same block ids (vLLM's prefix cache serves the repeat), another text others; 'none' gives none."""
    question, other = "What is the boiling point of water at the top of Everest? " * 8, "Explain entropy. " * 28
    rows = [{**request(120, 10), "prompt": question}, {**request(120, 10), "prompt": other},
            {**request(120, 10), "prompt": question}, {**request(120, 10), "prompt": ["system", "user turn"]}]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results(rows)))
    reqs = list(make_mlenergy_workload(MlenergyConfig(path=str(path))).requests(0))
    blocks = [r.block_hashes for r in reqs]
    assert blocks[0] == blocks[2] and len(blocks[0]) >= 4 and not set(blocks[0]) & set(blocks[1])
    assert blocks[3] is not None and reqs[0].hash_block_tokens == 16
    plain = list(make_mlenergy_workload(MlenergyConfig(path=str(path), prefix_blocks="none")).requests(0))
    assert all(r.block_hashes is None for r in plain)


def test_a_run_on_other_gpus_is_said(tmp_path, capsys):
    """The file's num_gpus against the simulated layout (instances x ranks x tensor_parallel): its
    energy is all its GPUs', so a TP-1 replay of a 2-GPU run compares half the GPUs."""
    rows = [request(100, 20) for _ in range(40)]
    (tmp_path / "results.json").write_text(json.dumps(results(rows, max_num_seqs=8, num_gpus=2)))
    (tmp_path / "exp.toml").write_text(TOML % "")
    assert main(["validate", str(tmp_path / "exp.toml")]) == 0
    err = capsys.readouterr().err
    assert err.count("the measured run served on 2 GPUs, the simulated one on 1") == 1, err
    (tmp_path / "exp.toml").write_text(TOML % "[cluster]\ninstances = 2\n")
    (tmp_path / "results.json").write_text(json.dumps(results(rows, max_num_seqs=16, num_gpus=2)))
    assert main(["validate", str(tmp_path / "exp.toml")]) == 0
    assert "the measured run" not in capsys.readouterr().err
