"""A partitioned run with ``[power]`` (schedlab.study.partition, schedlab.energy.meter.join_parts):
each part meters its instances up to its own end and the merge carries them on to the whole run's.
Against the same run in one process -- every request's energy, every instance's energy and power,
the totals -- by hand where one part ends long before the other, and conservation (energy = the
integral of the power redrawn over the merged timeline), also once saved and loaded back."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from schedlab.energy.timeline import integral_j, power_steps
from schedlab.results.metric_names import check_metric_name
from schedlab.results.sketch import RELATIVE_ACCURACY
from schedlab.results.storage import load as load_saved
from schedlab.results.storage import save
from schedlab.study.executor import make_executor
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import check_energy
from test_fleet import FLEET

ENGINES = ("fast", "reference")
ROUTERS = ('{kind = "round_robin"}', '{kind = "hash", by = "id"}')
# a tail and a standby short enough that idle stretches reach idle power; host power and a PUE
POWERS = {
    "utilisation": '{kind = "utilisation", gpu = "a100-40gb", model = "llama-3.1-8b", standby_s = 0.05, '
                   'tail_s = 0.02, host_idle_w = 100, host_busy_w = 40, pue = 1.3}',
    "fixed": '{kind = "fixed_active", active_w = 300, standby_w = 90, idle_w = 30, standby_s = 0.03, '
             'host_idle_w = 50}',
}
SUM_REL = 1e-12  # sums of the same terms added in another order

# Two classes from a bursty and a sparse source on 5 instances (parts of 2 and 3 uneven): some
# instances idle long after their last iteration, while the others still work. The fleet's
# scheduler, cache, costs and SLO (tests/test_fleet.py).
MIXED = """
[experiment]
name = "parts"
reports = []
timeline = true

[workload]
kind = "mix"

[workload.classes.chat]
kind = "synthetic"
num_requests = 160
arrival = "gamma"
cv = 3
rate = 40
prompt = {dist = "lognormal", median = 200, sigma = 0.8, low = 8, high = 2000}
output = {dist = "lognormal", median = 40, sigma = 0.8, low = 1, high = 300}

[workload.classes.batch]
kind = "synthetic"
num_requests = 20
rate = 2
prompt = {dist = "uniform", low = 500, high = 1500}
output = {dist = "uniform", low = 50, high = 400}

""" + FLEET[FLEET.index("[scheduler]"):]
FIVE = "cluster.instances=5"


def experiment(tmp_path, *overrides, text=MIXED, executor=None):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return run_experiment(load(path, list(overrides)), executor=executor)


def assert_same_energy(split, whole, rel=SUM_REL):
    """The merged run's energy record and metrics are the single process's."""
    a, b = whole.meta["energy"], split.meta["energy"]
    assert b["window_ms"] == a["window_ms"]
    assert len(b["instances"]) == len(a["instances"])
    for k, (x, y) in enumerate(zip(a["instances"], b["instances"])):
        assert set(y) == set(x), k
        assert y["tails"] == x["tails"], k  # where each idle stretch's tail starts, and from how high
        assert y.get("standby_at") == x.get("standby_at"), k  # a governed clock's standby, where it starts
        for key, value in x.items():
            if key not in ("tails", "standby_at"):
                assert y[key] == pytest.approx(value, rel=rel, abs=1e-12), (k, key)
    e, f = whole.metrics["energy"], split.metrics["energy"]
    for key, value in e.items():
        if key == "per_instance":
            for k, row in value.items():
                for name, v in row.items():
                    assert f[key][k][name] == pytest.approx(v, rel=rel), (k, name)
        elif key == "request_j":
            for name, v in value.items():
                assert f[key][name] == pytest.approx(v, rel=rel), name
        else:
            assert f[key] == pytest.approx(value, rel=rel), key
    for name, group in whole.metrics.get("per_class", {}).items():
        for key, value in group["energy"].items():
            assert split.metrics["per_class"][name]["energy"][key] == pytest.approx(value, rel=rel), (name, key)


@pytest.mark.parametrize("power", sorted(POWERS))
@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("parts", [2, 3])
def test_a_partitioned_run_draws_the_energy_of_one_process(tmp_path, parts, engine, router, power):
    base = (FIVE, f"cluster.router={router}", f"power={POWERS[power]}", f"experiment.engine={engine}")
    whole = experiment(tmp_path, *base).all_runs()[0]
    split = experiment(tmp_path, *base, f"cluster.partitions={parts}").all_runs()[0]
    assert split.meta["partitions"] == parts
    np.testing.assert_array_equal(split.requests["instance"], whole.requests["instance"])
    np.testing.assert_array_equal(split.requests["energy_j"], whole.requests["energy_j"])
    # the case is worth checking: the instances' last iterations end apart, and some idle past standby
    ends = last_ends(whole)
    assert max(ends) - min(ends) > whole.meta["energy"]["instances"][0]["standby_ms"]
    assert len(whole.metrics["per_class"]) == 2
    assert_same_energy(split, whole)
    check_energy(split)  # each instance's energy is the integral of its power over the merged timeline


def last_ends(run) -> list[float]:
    """Where each instance's last timeline row ends."""
    t = run.timeline
    return [float((t["time_ms"] + t["duration_ms"])[t["instance"] == k].max()) for k in range(run.meta["instances"])]


# -- by hand: one part ends long before the other ---------------------------------------------------------

# Linear costs, 0.5 ms a prompt token, 4 ms a decode step; one instance a part (round robin).
# Request 0 (prompt 4, output 3) on instance 0: prefill 0..2, decodes to 10. Request 1 (output 8)
# on instance 1 from 5: prefill 5..7, 7 decodes to 35. Request 2, too long for the cache, reaches
# instance 2 at 50 and is rejected: its part has no iteration. The run's window: 0..35.
BY_HAND = """
[experiment]
name = "by_hand"
reports = []
timeline = true

[workload]
kind = "file"
path = "requests.json"

[scheduler]
kind = "continuous"

[kv_cache]
kind = "paged"
num_blocks = 16
block_size = 16

[cost_model]
kind = "linear"
prefill_ms_per_token = 0.5
decode_ms_per_step = 4.0

[cluster]
instances = 3
router = {kind = "round_robin"}
"""
REQUESTS = [{"arrival_ms": 0.0, "prompt_tokens": 4, "output_tokens": 3},
            {"arrival_ms": 5.0, "prompt_tokens": 4, "output_tokens": 8},
            {"arrival_ms": 50.0, "prompt_tokens": 1000, "output_tokens": 3}]


def by_hand(tmp_path, *overrides):
    (tmp_path / "requests.json").write_text(json.dumps(REQUESTS))
    return experiment(tmp_path, *overrides, text=BY_HAND).all_runs()[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_idle_after_an_early_parts_end_is_idle_power_times_the_gap(tmp_path, engine):
    """No standby, no tail: instance 0's part ends at 10, the run at 35 -- instance 0 idles 25 ms
    at 30 W after its part's end; instance 1 idles 5 ms before its part's first arrival; instance
    2, whose part only rejected a request, idles throughout."""
    power = 'power={kind = "fixed_active", active_w = 300, standby_w = 90, idle_w = 30, standby_s = 0}'
    split = by_hand(tmp_path, power, "cluster.partitions=3", f"experiment.engine={engine}")
    assert split.requests["rejected"].tolist() == [0, 0, 1]
    energy = split.meta["energy"]
    assert energy["window_ms"] == [0.0, 35.0]
    busy = [inst["busy_j"] for inst in energy["instances"]]
    idle = [inst["idle_j"] for inst in energy["instances"]]
    assert busy == pytest.approx([300 * 10e-3, 300 * 30e-3, 0.0])
    assert idle == pytest.approx([30 * 25e-3, 30 * 5e-3, 30 * 35e-3])
    per_instance = split.metrics["energy"]["per_instance"]
    assert per_instance["0"]["avg_power_w"] == pytest.approx((3.0 + 0.75) / 0.035)
    assert per_instance["2"]["avg_power_w"] == pytest.approx(30.0)
    assert split.metrics["energy"]["gpu_j"] == pytest.approx(3.0 + 0.75 + 9.0 + 0.15 + 1.05)
    check_energy(split)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_early_parts_end_carries_its_standby_and_tail_on(tmp_path, engine):
    """Standby 90 W for 10 ms and a tail from 300 W with a 5 ms time constant: after its part's end
    at 10, instance 0 draws 10 ms of standby, 15 ms of idle and the whole tail to 35 -- as in one
    process, which the same run without partitions gives."""
    power = ('power={kind = "fixed_active", active_w = 300, standby_w = 90, idle_w = 30, standby_s = 0.010, '
             'tail_s = 0.005}')
    split = by_hand(tmp_path, power, "cluster.partitions=3", f"experiment.engine={engine}")
    whole = by_hand(tmp_path, power, f"experiment.engine={engine}")
    tail = (300 - 90) * 5 * -math.expm1(-25 / 5) * 1e-3
    idle = [inst["idle_j"] for inst in split.meta["energy"]["instances"]]
    assert idle == pytest.approx([90 * 10e-3 + 30 * 15e-3 + tail, 30 * 5e-3, 30 * 35e-3])
    assert split.meta["energy"]["instances"][0]["tails"] == [[10.0, pytest.approx(210.0)]]
    assert_same_energy(split, whole)
    check_energy(split)


# -- saved and loaded back, streamed -----------------------------------------------------------------------


def test_a_partitioned_power_run_saved_loads_back(tmp_path):
    """On two worker processes; saved to summary.json and the CSVs, it loads back with the same
    energy, every metric named as the loaders expect, its power redrawn to the same integral."""
    executor = make_executor(jobs=2)
    try:
        results = experiment(tmp_path, FIVE, 'cluster.router={kind = "round_robin"}', f"power={POWERS['utilisation']}",
                             "cluster.partitions=2", executor=executor)
    finally:
        executor.close()
    fresh = results.all_runs()[0]
    save(results, tmp_path / "out")
    saved = load_saved(tmp_path / "out").all_runs()[0]
    assert "part" not in saved.meta["energy"]  # the parts' bookkeeping does not outlive the merge
    names = [name for name in _leaves(saved.metrics) if name.startswith(("energy.", "per_class."))]
    assert len(names) > 30
    for name in names:
        assert check_metric_name(name) == name
    for key in ("gpu_j", "idle_j", "host_j", "kwh", "avg_power_w", "peak_power_w", "j_per_token"):
        assert saved.metrics["energy"][key] == pytest.approx(fresh.metrics["energy"][key], rel=1e-12), key
    for k in range(5):
        assert integral_j(*power_steps(saved, k)) == pytest.approx(integral_j(*power_steps(fresh, k)), rel=1e-9)
    np.testing.assert_allclose(np.sort(saved.requests["energy_j"]), np.sort(fresh.requests["energy_j"]), rtol=1e-12)
    check_energy(saved)


def _leaves(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_a_streamed_partitioned_power_run_keeps_the_energy(tmp_path, monkeypatch):
    """Parts past exact_requests stream their rows: the energy totals are still the single process's
    and the requests' shares within the sketch's error."""
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    base = (FIVE, 'cluster.router={kind = "round_robin"}', f"power={POWERS['fixed']}",
            "experiment.exact_requests=50")
    whole = experiment(tmp_path, *base).all_runs()[0]
    split = experiment(tmp_path, *base, "cluster.partitions=3").all_runs()[0]
    assert whole.rows_file is not None and split.rows_file is not None
    e, f = whole.metrics["energy"], split.metrics["energy"]
    for key in ("gpu_j", "busy_j", "idle_j", "host_j", "facility_j", "attributed_j", "avg_power_w", "peak_power_w",
                "window_ms", "j_per_token"):
        assert f[key] == pytest.approx(e[key], rel=SUM_REL), key
    assert f["request_j"]["mean"] == pytest.approx(e["request_j"]["mean"], rel=SUM_REL)
    assert f["request_j"]["p99"] == pytest.approx(e["request_j"]["p99"], rel=2.5 * RELATIVE_ACCURACY)
    for k, row in e["per_instance"].items():
        assert f["per_instance"][k] == pytest.approx(row, rel=SUM_REL), k


# -- with a GPU clock ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("clock", ['{mhz = 810}', '{policy = "slo"}'])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_partitioned_clocked_run_is_the_single_process(tmp_path, engine, clock):
    """[clock] is an instance's own (a fixed clock, or the governor's choice from each iteration's
    shape): a part times and meters its instances as one process does."""
    base = (FIVE, 'cluster.router={kind = "round_robin"}', f"power={POWERS['utilisation']}", f"clock={clock}",
            'cost_model={kind = "roofline", gpu = "a100-40gb", model = "llama-3.1-8b"}',
            f"experiment.engine={engine}")
    whole = experiment(tmp_path, *base).all_runs()[0]
    split = experiment(tmp_path, *base, "cluster.partitions=2").all_runs()[0]
    unclocked = experiment(tmp_path, *base[:3], *base[4:]).all_runs()[0]
    # the clock matters here: the GPUs draw another energy
    assert whole.metrics["energy"]["gpu_j"] != pytest.approx(unclocked.metrics["energy"]["gpu_j"], rel=1e-3)
    for column in ("instance", "first_token_ms", "finish_ms", "energy_j"):
        np.testing.assert_array_equal(split.requests[column], whole.requests[column])
    assert_same_energy(split, whole)
    check_energy(split)


# -- more parts than instances ---------------------------------------------------------------------------------


@pytest.mark.parametrize("power", ["", f"power={POWERS['fixed']}"])
def test_more_parts_than_instances_are_refused_when_the_file_is_read(tmp_path, power):
    """A part would have no instance (with [power]: an IndexError from its empty meters): one line
    naming [cluster] partitions and instances, before anything runs; as many parts as instances run."""
    from schedlab.errors import ConfigError

    base = ("cluster.instances=2", 'cluster.router={kind = "round_robin"}') + ((power,) if power else ())
    (tmp_path / "run.toml").write_text(MIXED)
    with pytest.raises(ConfigError, match=r"^\S*run\.toml: \[cluster\]: partitions: 3 is more than instances \(2\): "
                                          r"part p simulates the instances i with i % partitions = p, so a part would "
                                          r"have none; set partitions to at most instances "
                                          r"\(from --set cluster\.partitions=3\)$"):
        load(tmp_path / "run.toml", [*base, "cluster.partitions=3"])
    split = experiment(tmp_path, *base, "cluster.partitions=2").all_runs()[0]
    assert split.meta["partitions"] == 2
