"""The experiments in experiments/: every file validates, and each experiment's claim holds on a
reduced run (fewer requests via --set overrides, or a small generated trace).

The reduced runs are deterministic (fixed seeds), so each assertion is a fact about one
simulation; the claims asserted are the ones the experiment is about, at sizes where they hold
with a margin.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from schedlab.configs import from_table
from schedlab.experiment import load, run_experiment
from schedlab_plugins.reports.plots import PlotsConfig, plan

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
# Files whose default data lives outside the project: the key to point at a generated file.
OUTSIDE_DATA = {"mooncake_prefix.toml": "workload.path"}


def run(name: str, overrides: list[str]):
    return run_experiment(load(EXPERIMENTS / name, overrides))


def metric(run_result, dotted: str):
    value = run_result.metrics
    for part in dotted.split("."):
        value = value[part]
    return value


def by_point(study, key: str) -> dict:
    return {r.point[key]: r for r in study.runs}


# -- a small Mooncake-format trace ---------------------------------------------------------------------

CONVERSATIONS = 50
TURNS = 4
BLOCK = 512


def conversation_trace() -> list[dict]:
    """50 conversations of 4 turns, each turn's prompt the conversation so far: a shared first block
    (id 0, a system prompt), 3 more full blocks of history per turn, and a unique partial last
    block (300 tokens). Turns come round by round, one request a second, one round a minute."""
    rows = []
    for turn in range(TURNS):
        for c in range(CONVERSATIONS):
            history = [1000 + 100 * c + j for j in range(3 * (turn + 1))]
            tail = 100_000 + TURNS * c + turn
            ids = [0] + history + [tail]
            rows.append({"timestamp": turn * 60_000 + c * 1000, "input_length": BLOCK * (len(ids) - 1) + 300,
                         "output_length": 50 + (7 * c + 13 * turn) % 150, "hash_ids": ids})
    return rows


def ideal_hit_rate(rows: list[dict]) -> float:
    """Token hit rate of an infinite cache: the leading ids already seen as full blocks, per request."""
    seen: set[int] = set()
    hits = queries = 0
    for row in rows:
        ids = row["hash_ids"]
        full = [i for k, i in enumerate(ids) if BLOCK * (k + 1) <= row["input_length"]]
        n = 0
        while n < len(full) and full[n] in seen:
            n += 1
        hits += n * BLOCK
        queries += row["input_length"]
        seen.update(full)
    return hits / queries


@pytest.fixture(scope="module")
def mooncake_trace(tmp_path_factory):
    rows = conversation_trace()
    path = tmp_path_factory.mktemp("mooncake") / "conversations.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path, rows


# -- every file ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.toml")), ids=lambda p: p.name)
def test_every_experiment_file_validates(path, mooncake_trace):
    overrides = [f"{OUTSIDE_DATA[path.name]}={mooncake_trace[0]}"] if path.name in OUTSIDE_DATA else []
    exp = load(path, overrides)
    assert exp.studies and exp.config.description


def test_generated_trace_hit_rate_by_hand():
    rows = conversation_trace()
    # turn 0: only block 0 repeats (49 of 50 requests hit 512 tokens); turn t >= 1: 1 + 3t blocks hit
    queries = sum(r["input_length"] for r in rows)
    hits = 49 * BLOCK + sum(CONVERSATIONS * (1 + 3 * t) * BLOCK for t in range(1, TURNS))
    assert ideal_hit_rate(rows) == pytest.approx(hits / queries)


# -- memory: the preemption cliff, capacity planning, long and short -----------------------------------------


def test_preemption_cliff():
    results = run("preemption_cliff.toml", ["workload.num_requests=120"])
    key = "scheduler.max_num_seqs"
    for study in results.studies:
        points = by_point(study, key)
        assert points[min(points)].metrics["num_preemptions"] == 0, study.name
    vllm = by_point(results.study("vllm"), key)
    smallest, largest = min(vllm), max(vllm)
    assert vllm[largest].metrics["num_preemptions"] > 0
    assert vllm[largest].metrics["preemptions"]["recomputed_tokens"] > 0
    # throughput falls once preemption starts: below the best run without a preemption
    calm = [r.metrics["throughput_tps"] for r in vllm.values() if r.metrics["num_preemptions"] == 0]
    assert vllm[largest].metrics["throughput_tps"] < 0.9 * max(calm)
    assert vllm[largest].metrics["tpot_ms"]["p99"] > vllm[smallest].metrics["tpot_ms"]["p99"]
    # swapping moves blocks instead of recomputing them; reservation never preempts
    swap = by_point(results.study("vllm_v0_swap"), key)[largest].metrics
    assert swap["preemptions"]["swap"] > 0 and swap["preemptions"]["recomputed_tokens"] == 0
    assert all(r.metrics["num_preemptions"] == 0 for r in results.study("trtllm").runs)
    # the figure marks, per policy, the largest max_num_seqs whose whole prefix ran without preemption
    config = from_table(PlotsConfig, load(EXPERIMENTS / "preemption_cliff.toml").report_tables["plots"],
                        where="[reports.plots]")
    figure = {p.filename: p for p in plan(results, config)}["sweep_policies.png"].draw()
    marks = {line.get_gid(): line.get_xdata()[0] for ax in figure.axes[:1] for line in ax.get_lines()
             if (line.get_gid() or "").startswith("mark:")}
    for i, name in enumerate(config.overlays["policies"]):
        points = by_point(results.study(name), key)
        last = None
        for value in sorted(points):
            if points[value].metrics["num_preemptions"] != 0:
                break
            last = value
        assert marks[f"mark:{config.sweep_metrics[0]}:{i}"] == last, name


def test_capacity_planning_capping_output_buys_concurrency():
    results = run("capacity_planning.toml", ["workload.num_requests=800"])
    fits = {name: results.study(name).search for name in ("fit_uncapped", "fit_max_tokens_2048", "fit_max_tokens_1024")}
    assert all(outcome.status == "found" for outcome in fits.values())
    uncapped, cap2048, cap1024 = (fits[n].value for n in ("fit_uncapped", "fit_max_tokens_2048", "fit_max_tokens_1024"))
    assert uncapped <= cap2048 <= cap1024 and uncapped < cap1024
    # the long tail: the simulation fits fewer than the average-length arithmetic (10,005 blocks /
    # 70 blocks at the mean 1,120 tokens = 142) and more than the p99 arithmetic (22)
    assert 22 < uncapped < 142
    for outcome in fits.values():
        chosen = next(p.payload for p in outcome.probes if p.value == outcome.value)
        failing = next(p.payload for p in outcome.probes if p.value == outcome.failing)
        assert chosen.metrics["num_preemptions"] == 0 < failing.metrics["num_preemptions"]
    sweep = results.study("clients")
    few = [r for r in sweep.runs if r.point["workload.clients"] == 16]
    assert len(few) == 3 and all(r.metrics["num_preemptions"] == 0 for r in few)


def test_long_and_short_separation_protects_interactive_tail():
    results = run("long_and_short.toml", ["workload.classes.interactive.num_requests=1500",
                                          "workload.classes.batch.num_requests=20"])
    key = "workload.classes.batch.output_scale"
    mixed, separated = by_point(results.study("mixed"), key), by_point(results.study("separated"), key)
    longest = max(mixed)
    ttft = "per_class.interactive.ttft_ms.p99"
    assert metric(mixed[longest], ttft) > 5 * metric(separated[longest], ttft)
    assert metric(mixed[longest], "per_class.interactive.slo.attainment") < \
        metric(separated[longest], "per_class.interactive.slo.attainment")
    # separated, the interactive instance never sees a long generation: its numbers do not move
    assert len({metric(r, ttft) for r in separated.values()}) == 1
    # mixed, the interactive tail grows with the long generations' length
    assert metric(mixed[longest], ttft) > 5 * metric(mixed[min(mixed)], ttft)
    for r in results.all_runs():
        assert set(r.metrics["per_class"]) == {"batch", "interactive"}
        assert set(np.unique(r.requests["instance"])) == {0, 1}


# -- prefix caching and chunked prefill ------------------------------------------------------------------------


def test_shared_prefix_caching_gain_follows_sharing():
    results = run("shared_prefix.toml", ["workload.num_requests=150"])
    share = {(r.point["workload.shared_fraction"], r.point["kv_cache.prefix_caching"]): r
             for r in results.study("share").runs}
    # unique prompts: no hits, the same TTFT
    assert share[(0.0, True)].metrics["prefix_cache"]["hit_rate"] == 0
    assert metric(share[(0.0, True)], "ttft_ms.p50") == pytest.approx(metric(share[(0.0, False)], "ttft_ms.p50"),
                                                                     rel=0.01)
    # every request shares a 2,000-token system prompt: most tokens hit and TTFT falls many-fold
    assert share[(1.0, True)].metrics["prefix_cache"]["hit_rate"] > 0.8
    assert metric(share[(1.0, True)], "ttft_ms.p50") < metric(share[(1.0, False)], "ttft_ms.p50") / 5
    hits = [share[(f, True)].metrics["prefix_cache"]["hit_rate"] for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert hits == sorted(hits)
    # the gain grows with the prefix length
    length = {(r.point["workload.prefix_tokens"], r.point["kv_cache.prefix_caching"]): r
              for r in results.study("length").runs}
    gain = {n: metric(length[(n, False)], "ttft_ms.p50") / metric(length[(n, True)], "ttft_ms.p50")
            for n in (250, 2000)}
    assert gain[2000] > 2 * gain[250] > 2
    # under load the cache also keeps throughput up where recomputing the prefix saturates
    load_runs = {(r.point["workload.rate"], r.point["kv_cache.prefix_caching"]): r for r in results.study("load").runs}
    top = max(rate for rate, _ in load_runs)
    assert metric(load_runs[(top, True)], "throughput_tps") > 2 * metric(load_runs[(top, False)], "throughput_tps")


def test_mooncake_hit_rate_grows_with_cache_size(mooncake_trace):
    path, rows = mooncake_trace
    results = run("mooncake_prefix.toml", [f"workload.path={path}"])
    sizes = by_point(results.study("cache_size"), "kv_cache.num_blocks")
    rates = [sizes[n].metrics["prefix_cache"]["hit_rate"] for n in sorted(sizes)]
    assert rates == sorted(rates) and rates[0] < rates[-1]
    for r in sizes.values():
        assert r.metrics["finished"] == len(rows) and r.metrics["num_preemptions"] == 0
    # the largest cache keeps everything: the hit rate of an infinite cache, worked out above
    assert rates[-1] == pytest.approx(ideal_hit_rate(rows), abs=1e-12)


def test_chunked_prefill_trades_ttft_for_itl():
    results = run("chunked_prefill.toml", ["workload.classes.chat.num_requests=300",
                                           "workload.classes.docs.num_requests=80"])
    budget = by_point(results.study("chunked"), "scheduler.max_num_batched_tokens")
    off, off_v0 = results.study("off").runs[0], results.study("off_v0").runs[0]
    smallest = budget[min(budget)]
    # chunks stop long prompts from stalling the decodes ...
    assert metric(smallest, "itl_ms.p99") < metric(off, "itl_ms.p99") / 4
    worst = [metric(budget[b], "itl_ms.max") for b in sorted(budget)]
    assert worst == sorted(worst) and worst[-1] < metric(off_v0, "itl_ms.max")
    # ... at the price of more rounds before a document's first token
    assert metric(smallest, "per_class.docs.ttft_ms.p50") > 1.5 * metric(off, "per_class.docs.ttft_ms.p50")
    assert metric(smallest, "ttft_ms.p99") > metric(off, "ttft_ms.p99")
    assert metric(smallest, "prefill_chunks.mean") > metric(off, "prefill_chunks.mean") == 1
    # capping one request's chunk instead keeps the chats' TTFT tail below chunking off
    capped = by_point(results.study("threshold"), "scheduler.long_prefill_token_threshold")
    assert metric(capped[min(capped)], "per_class.chat.ttft_ms.p99") < metric(off, "per_class.chat.ttft_ms.p99")
    assert metric(capped[min(capped)], "itl_ms.p99") < metric(off, "itl_ms.p99")
