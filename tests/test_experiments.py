"""The experiments in experiments/: every file validates, and each experiment's claim holds on a
reduced run (fewer requests via --set overrides, or a small generated trace).

The reduced runs are deterministic (fixed seeds), so each assertion is a fact about one
simulation; the claims asserted are the ones the experiment is about, at sizes where they hold
with a margin.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pytest

from schedlab.configs import from_table
from schedlab.study.experiment import load, run_experiment
from schedlab_plugins.reports.plots import PlotsConfig, plan
from schedlab_plugins.reports.table import TableConfig, render
from schedlab_plugins.workloads.traces import load_azure

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
# Files whose default data lives outside the project: the key to point at a generated file, and
# which generated file (a fixture below).
OUTSIDE_DATA = {"mooncake_prefix.toml": ("workload.path", "mooncake_trace"),
                "mooncake_host_tier.toml": ("workload.path", "mooncake_trace"),
                "router_comparison.toml": ("workload.classes.code.path", "azure_code_trace")}


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
def test_every_experiment_file_validates(path, request):
    overrides = []
    if path.name in OUTSIDE_DATA:
        key, fixture = OUTSIDE_DATA[path.name]
        overrides = [f"{key}={request.getfixturevalue(fixture)[0]}"]
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
        points = by_point(study, study.keys[0])
        assert points[min(points)].metrics["num_preemptions"] == 0, study.name
    vllm = by_point(results.study("vllm"), key)
    smallest, largest = min(vllm), max(vllm)
    assert vllm[largest].metrics["num_preemptions"] > 0
    assert vllm[largest].metrics["preemptions"]["recomputed_tokens"] > 0
    # once preemption starts, recomputation eats the gain of more sequences: the largest setting
    # ends below the best run without a preemption (by 4% at 120 requests, 2% at the experiment's 500)
    calm = [r.metrics["throughput_tps"] for r in vllm.values() if r.metrics["num_preemptions"] == 0]
    assert vllm[largest].metrics["throughput_tps"] < 0.97 * max(calm)
    assert vllm[largest].metrics["tpot_ms"]["p99"] > vllm[smallest].metrics["tpot_ms"]["p99"]
    # swapping moves blocks instead of recomputing them; reservation never preempts
    swap = by_point(results.study("vllm_v0_swap"), key)[largest].metrics
    assert swap["preemptions"]["swap"] > 0 and swap["preemptions"]["recomputed_tokens"] == 0
    assert all(r.metrics["num_preemptions"] == 0 for r in results.study("trtllm").runs)
    # SGLang's admission estimate keeps the running set below the cliff whatever the cap: at the
    # largest cap it preempts (retracts) a tiny fraction of what vLLM V1 does, keeps its own best
    # throughput and stays above vLLM V1's there
    sglang = by_point(results.study("sglang"), "scheduler.max_running_requests")
    top = sglang[max(sglang)].metrics
    assert top["num_preemptions"] * 20 < vllm[largest].metrics["num_preemptions"]
    assert top["throughput_tps"] > 0.95 * max(r.metrics["throughput_tps"] for r in sglang.values())
    assert top["throughput_tps"] > vllm[largest].metrics["throughput_tps"]
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
    # 11 minutes of the file's 25: long enough for the longest generations to fill the KV cache
    results = run("long_and_short.toml", ["workload.classes.interactive.num_requests=2000",
                                          "workload.classes.batch.num_requests=27"])
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
    # (4.4x; 6.2x scheduling synchronously, when a new request did not wait a batch more)
    assert share[(1.0, True)].metrics["prefix_cache"]["hit_rate"] > 0.8
    assert metric(share[(1.0, True)], "ttft_ms.p50") < metric(share[(1.0, False)], "ttft_ms.p50") / 4
    hits = [share[(f, True)].metrics["prefix_cache"]["hit_rate"] for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert hits == sorted(hits)
    # the gain grows with the prefix length
    length = {(r.point["workload.prefix_tokens"], r.point["kv_cache.prefix_caching"]): r
              for r in results.study("length").runs}
    gain = {n: metric(length[(n, False)], "ttft_ms.p50") / metric(length[(n, True)], "ttft_ms.p50")
            for n in (250, 2000)}
    assert gain[2000] > 2 * gain[250] > 2
    # under load the cache also keeps throughput up where recomputing the prefix saturates
    # (1.9x at these 150 requests, 2.3x with the experiment's 600)
    load_runs = {(r.point["workload.rate"], r.point["kv_cache.prefix_caching"]): r for r in results.study("load").runs}
    top = max(rate for rate, _ in load_runs)
    assert metric(load_runs[(top, True)], "throughput_tps") > 1.8 * metric(load_runs[(top, False)], "throughput_tps")
    # and the saturation check marks the uncached top load, never a cached one
    verdict = {key: r.metrics["stability"]["verdict"] for key, r in load_runs.items()}
    assert verdict[(top, False)] == "unstable"
    assert all(verdict[(rate, True)] != "unstable" for rate, _ in load_runs)


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
    # SGLang's radix tree at the same sizes: the same growth, the same limit
    radix = by_point(results.study("radix"), "kv_cache.num_blocks")
    radix_rates = [radix[n].metrics["prefix_cache"]["hit_rate"] for n in sorted(radix)]
    assert radix_rates == sorted(radix_rates)
    assert radix_rates[-1] == pytest.approx(ideal_hit_rate(rows), abs=1e-12)
    assert all(r.metrics["finished"] == len(rows) and r.metrics["num_preemptions"] == 0 for r in radix.values())


def test_mooncake_host_tier_reaches_the_unbounded_hit_rate_and_its_ttft_depends_on_the_link(mooncake_trace):
    path, rows = mooncake_trace
    # the generated trace is small: a GPU cache of 31 blocks (gpu_memory_utilization 0.23) and
    # 1 GiB blocks, so that 64 GiB to 4 TiB of host memory hold 64 to 4,096 blocks around its
    # 651 distinct ones
    results = run("mooncake_host_tier.toml", [f"workload.path={path}", "kv_cache.gpu_memory_utilization=0.23",
                                              "kv_cache.bytes_per_block=1073741824"])
    for r in results.all_runs():
        assert r.metrics["finished"] == len(rows) and r.metrics["num_preemptions"] == 0
        p = r.metrics["prefix_cache"]
        assert p["hits"] == p["gpu_hits"] + p["host_hits"]
        assert p["host_loaded_bytes"] == p["host_loaded_blocks"] * 2 ** 30
    gpu_only = results.study("gpu_only").runs[0].metrics
    assert gpu_only["prefix_cache"]["host_hits"] == 0 and gpu_only["prefix_cache"]["hit_rate"] < 0.2
    host = by_point(results.study("host"), "kv_cache.host_memory_gib")
    rates = [host[n].metrics["prefix_cache"]["hit_rate"] for n in sorted(host)]
    assert rates == sorted(rates) and rates[0] >= gpu_only["prefix_cache"]["hit_rate"]
    # a tier that holds every block evicted: the hit rate of an infinite cache, mostly from the host
    assert rates[-1] == pytest.approx(ideal_hit_rate(rows), abs=1e-12)
    assert host[max(host)].metrics["prefix_cache"]["host_hit_rate"] > 0.4
    radix = by_point(results.study("radix_host"), "kv_cache.host_blocks")
    assert radix[max(radix)].metrics["prefix_cache"]["hit_rate"] == pytest.approx(ideal_hit_rate(rows), abs=1e-12)
    # the same hits behind slower links: every reload stalls its iteration, so TTFT falls with the
    # bandwidth, from worse than no tier at all (2 GB/s) to better than it (256 GB/s)
    link = by_point(results.study("link"), "kv_cache.host_link_gbps")
    ttft = [link[g].metrics["ttft_ms"]["p50"] for g in sorted(link)]
    assert ttft == sorted(ttft, reverse=True) and len(set(ttft)) == len(ttft)
    assert ttft[0] > 2 * gpu_only["ttft_ms"]["p50"] > 2 * ttft[-1]
    loads = [link[g].metrics["prefix_cache"]["host_load_ms"] for g in sorted(link)]
    assert loads == sorted(loads, reverse=True)


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
    # TGI without chunking: a lone chat waits for floor(0.3 x running) others or 20 tokens
    tgi, tgi_ratio0, tgi_chunked = (results.study(n).runs[0] for n in ("tgi", "tgi_ratio0", "tgi_chunked"))
    assert metric(tgi, "per_class.chat.ttft_ms.p50") > 3 * metric(tgi_ratio0, "per_class.chat.ttft_ms.p50")
    assert metric(tgi_ratio0, "per_class.chat.ttft_ms.p50") < 1.2 * metric(off, "per_class.chat.ttft_ms.p50")
    # its documents' prefill passes stall the streams as whole prompts do; v3's chunks do not
    assert metric(tgi, "itl_ms.max") > 0.9 * metric(off, "itl_ms.max")
    assert metric(tgi_chunked, "itl_ms.max") == pytest.approx(metric(budget[4096], "itl_ms.max"), rel=0.05)
    assert metric(tgi_chunked, "itl_ms.max") < 0.6 * metric(off, "itl_ms.max")  # 54% with the profile-derived roofline


def test_tgi_segments_keep_chats_moving_beside_long_answers():
    results = run("tgi_segments.toml", ["workload.classes.chat.num_requests=200",
                                        "workload.classes.reasoning.num_requests=40"])
    seg, whole, seg_busy, whole_busy = (results.study(n).runs[0]
                                        for n in ("segments", "whole", "segments_busy", "whole_busy"))
    # whole answers reserve a reasoning answer's length up front: the chats queue behind them
    assert metric(seg, "per_class.chat.ttft_ms.p50") < metric(whole, "per_class.chat.ttft_ms.p50") / 50
    assert metric(seg_busy, "per_class.chat.ttft_ms.p50") < metric(whole_busy, "per_class.chat.ttft_ms.p50") / 50
    assert metric(seg, "kv_usage.mean") < metric(whole, "kv_usage.mean")
    # the price: every long answer comes back every 1,024 tokens and is prefilled again
    assert metric(seg, "requeues") > 0 == metric(whole, "requeues")
    assert metric(seg, "preemptions.recomputed_tokens") > 0 == metric(whole, "preemptions.recomputed_tokens")
    # and yet the long answers themselves finish no later, the busier load included
    assert metric(seg, "per_class.reasoning.e2e_ms.p50") < metric(whole, "per_class.reasoning.e2e_ms.p50")
    assert metric(seg_busy, "throughput_tps") > metric(whole_busy, "throughput_tps")


def test_sglang_overlap_trades_a_step_of_ttft_for_hidden_host_time():
    results = run("sglang_overlap.toml", ["workload.num_requests=300"])
    runs = {r.name: r for r in results.all_runs()}
    for busy in ("", "_busy"):
        overlap, ahead, sync = (runs[name + busy] for name in ("overlap", "plan_ahead", "sync"))
        assert all(r.metrics["finished"] == 300 for r in (overlap, ahead, sync))
        # planned a batch early, an arrival waits a step more ...
        assert metric(sync, "ttft_ms.p50") < metric(ahead, "ttft_ms.p50")
        assert metric(sync, "ttft_ms.p50") < metric(overlap, "ttft_ms.p50")
        # ... and gains only with the host's time hidden under the GPU step
        assert metric(overlap, "tpot_ms.p50") < metric(sync, "tpot_ms.p50")
        assert metric(ahead, "tpot_ms.p50") >= metric(sync, "tpot_ms.p50")
        # answers stopping at an EOS are decoded once more, planned ahead only
        assert metric(overlap, "preemptions.discarded_tokens") > 200
        assert metric(sync, "preemptions.discarded_tokens") == 0
    assert metric(runs["overlap_busy"], "throughput_tps") > metric(runs["sync_busy"], "throughput_tps")


# -- SGLang's priority scheduling --------------------------------------------------------------------------


def test_sglang_priority_preemption_meets_the_chat_slo_at_the_documents_cost():
    # five of the ten minutes
    results = run("sglang_priority.toml", ["workload.classes.interactive.num_requests=600",
                                           "workload.classes.batch.num_requests=120"])
    runs = {r.name: r for r in results.all_runs()}
    assert all(r.metrics["finished"] == 720 for r in runs.values())
    ttft = {name: metric(r, "per_class.interactive.ttft_ms.p99") for name, r in runs.items()}
    attainment = {name: metric(r, "per_class.interactive.slo.attainment") for name, r in runs.items()}
    # sorting the queue lets chats pass queued documents; preempting running ones frees their slots
    assert ttft["fcfs"] > 4 * ttft["priority_order"] > 4 * ttft["priority_preempt"]
    assert attainment["fcfs"] < attainment["priority_order"] < 0.5 < 0.9 < attainment["priority_preempt"]
    assert metric(runs["priority_preempt"], "num_preemptions") > 100
    assert metric(runs["fcfs"], "num_preemptions") == metric(runs["priority_order"], "num_preemptions") == 0
    # the documents pay: preempted, they compute again what they had generated
    e2e = {name: metric(r, "per_class.batch.e2e_ms.p50") for name, r in runs.items()}
    assert e2e["priority_preempt"] > 1.3 * e2e["fcfs"]


def test_sglang_queue_limit_trades_requests_turned_away_for_the_served_ones_ttft():
    results = run("sglang_queue_limit.toml", [])
    runs = {r.name: r for r in results.all_runs()}
    rejected = {name: r.metrics["rejected"] for name, r in runs.items()}
    ttft = {name: metric(r, "ttft_ms.p99") for name, r in runs.items()}
    # a shorter queue turns more away and keeps the served requests' first tokens sooner (no limit
    # against 64: 1.37x since each stage draws its own requests, 1.79x before)
    assert rejected["no_limit"] == 0 < rejected["queue_64"] < rejected["queue_16"] < rejected["queue_4"]
    assert ttft["no_limit"] > 1.25 * ttft["queue_64"] > 1.5 * ttft["queue_16"] > 1.5 * ttft["queue_4"]
    assert ttft["queue_16"] < 2000 < ttft["queue_64"]
    # the SLO counts a request turned away as missed: a short queue gains, the shortest gives some back
    goodput = {name: metric(r, "slo.goodput_rps") for name, r in runs.items()}
    assert goodput["no_limit"] < goodput["queue_64"] < goodput["queue_16"]
    assert goodput["queue_4"] < goodput["queue_16"]
    # a waiting timeout aborts only after the wait: it gains less than a queue limit turning as many away
    assert rejected["queue_64"] < rejected["timeout_2s"] < rejected["queue_16"]
    assert goodput["no_limit"] < goodput["timeout_2s"] < goodput["queue_16"]
    for name, r in runs.items():
        q = r.requests
        away = q["rejected"] != 0
        assert (q["finish_ms"][away] >= q["arrival_ms"][away]).all()  # turned away from the queue, not on arrival
        expected = {"timeout_2s": "Request waiting timeout reached.",
                    "run_timeout_30s": "Request running timeout reached."}.get(name, "The request queue is full.")
        assert set(r.rejections.values()) <= {expected}, name
    timed_out = runs["timeout_2s"].requests
    waited = timed_out["waiting_ms"][timed_out["rejected"] != 0]
    assert waited.min() >= 2000  # each waited its 2 s (from its arrival; SGLang counts from the pass that reads it)
    # a running timeout frees the burst's long answers' slots: the queue drains sooner, but the work
    # they had done is lost and their clients get an error -- goodput falls below no limit at all
    ran = runs["run_timeout_30s"].requests
    cut = ran["rejected"] != 0
    assert cut.sum() > rejected["queue_4"]
    assert (ran["finish_ms"][cut] - ran["first_scheduled_ms"][cut] >= 30000).all()
    assert (ran["generated_tokens"][cut] > 0).all()
    assert ttft["run_timeout_30s"] < ttft["queue_16"] and goodput["run_timeout_30s"] < goodput["no_limit"]


def test_sglang_shortest_prefill_first_lets_chats_past_long_documents():
    results = run("sglang_shortest_prefill.toml", [])
    runs = {r.name: r for r in results.all_runs()}
    fcfs, spf = runs["fcfs"], runs["shortest_prefill_first"]
    assert fcfs.metrics["finished"] == spf.metrics["finished"] == 1650
    # the chats' tail shrinks several-fold and more of them meet the SLO
    assert metric(spf, "per_class.chat.ttft_ms.p99") * 4 < metric(fcfs, "per_class.chat.ttft_ms.p99")
    assert metric(spf, "per_class.chat.ttft_ms.p50") * 2 < metric(fcfs, "per_class.chat.ttft_ms.p50")
    assert metric(spf, "per_class.chat.slo.attainment") > metric(fcfs, "per_class.chat.slo.attainment") + 0.1
    # the documents pay at the tail, not in the median: the queue drains sooner for everyone
    assert metric(spf, "per_class.document.ttft_ms.p99") > metric(fcfs, "per_class.document.ttft_ms.p99")
    assert metric(spf, "per_class.document.ttft_ms.p50") < metric(fcfs, "per_class.document.ttft_ms.p50")


# -- interactive and background work ---------------------------------------------------------------------


def test_interactive_background_one_gpu_misses_the_chat_slo_separation_meets_it():
    path = EXPERIMENTS / "interactive_background.toml"
    # five of the ten minutes: shorter windows leave the one-GPU runs too close to 90% to tell
    results = run("interactive_background.toml", ["workload.classes.interactive.num_requests=900",
                                                  "workload.classes.batch.num_requests=105"])
    runs = {r.name: r for r in results.all_runs()}
    attainment = {name: metric(r, "per_class.interactive.slo.attainment") for name, r in runs.items()}
    one_gpu = ("fcfs", "priority", "priority_budget512", "vtc")
    assert all(attainment[name] < 0.9 for name in one_gpu), attainment
    assert attainment["2gpu_separated"] >= 0.99
    # every run serves every request and keeps up with the documents: the same background throughput
    assert all(r.metrics["finished"] == 1005 for r in runs.values())
    tps = [metric(r, "per_class.batch.throughput_tps") for r in runs.values()]
    assert max(tps) < 1.02 * min(tps)
    # FCFS queues chats behind document bursts; the priority policy lets them pass ...
    ttft = "per_class.interactive.ttft_ms.p99"
    assert metric(runs["fcfs"], ttft) > 4 * metric(runs["priority"], ttft)
    # ... but the document chunks still share every iteration: a smaller budget protects TPOT
    tpot = "per_class.interactive.tpot_ms.p99"
    assert metric(runs["priority"], tpot) > 1.3 * metric(runs["priority_budget512"], tpot)
    # separated: each GPU serves one class; pooled as one TP-2 instance the documents finish soonest
    separated = runs["2gpu_separated"].requests
    assert set(separated["instance"][separated["request_class"] == "interactive"]) == {0}
    assert set(separated["instance"][separated["request_class"] == "batch"]) == {1}
    e2e = {name: metric(r, "per_class.batch.e2e_ms.p50") for name, r in runs.items()}
    assert min(e2e, key=e2e.get) == "2gpu_tp2_priority"
    # separation meets the chats' SLO best; the table marks the run with the best interactive
    # goodput (chats within the SLO per second of the run: separation over the whole ten minutes,
    # over these five the TP-2 instance, whose documents finish first, ends the run 3 s sooner)
    assert max(attainment, key=attainment.get) == "2gpu_separated"
    goodput = {name: metric(r, "per_class.interactive.slo.goodput_rps") for name, r in runs.items()}
    best = max(goodput, key=goodput.get)
    assert best in ("2gpu_separated", "2gpu_tp2_priority")
    config = from_table(TableConfig, load(path).report_tables["table"], where="[reports.table]")
    text = render(results, config.columns, config.best, config.best_is)
    marked = [line.split()[0] for line in text.splitlines() if len(line.split()) > 1 and line.split()[1] == "*"]
    assert marked == [best]
    assert f"* best per_class.interactive.slo.goodput_rps (highest): {best} = " in text


def test_batching_window_first_request_pays_the_wait_adaptive_spares_chats():
    results = run("batching_window.toml", ["workload.classes.background.num_requests=1200"])
    window = results.study("window")
    rates = sorted({r.point["workload.classes.background.rate"] for r in window.runs})
    for rate in rates:
        points = {r.point["scheduler.max_wait_ms"]: r for r in window.runs
                  if r.point["workload.classes.background.rate"] == rate}
        waits = sorted(points)
        # fuller batches: fewer iterations for the same jobs, at the same delivered throughput
        iterations = [points[w].metrics["iterations"] for w in waits]
        assert iterations == sorted(iterations, reverse=True) and iterations[-1] < 0.7 * iterations[0], rate
        fill = [points[w].metrics["slot_utilisation"] for w in waits]
        assert fill == sorted(fill), rate
        served = [points[w].metrics["request_throughput_rps"] for w in waits]
        assert max(served) < 1.01 * min(served)
        if rate == min(rates):
            # a job arriving at an idle server waits the whole window: at 1 job/s 8 never wait together
            assert [metric(points[w], "queue_ms.p50") for w in waits] == pytest.approx(waits, abs=1e-6)
            ttft = [metric(points[w], "ttft_ms.p50") for w in waits]
            assert ttft[-1] - ttft[0] == pytest.approx(waits[-1], rel=0.05)
    uniform = by_point(results.study("uniform"), "scheduler.max_wait_ms")
    adaptive = by_point(results.study("adaptive"), "scheduler.max_wait_ms")
    for column in ("first_token_ms", "finish_ms"):  # no window: nothing to adapt
        assert np.array_equal(uniform[0].requests[column], adaptive[0].requests[column])
    widest = max(uniform)
    chat = "per_class.interactive.ttft_ms.p50"
    assert metric(uniform[widest], chat) > metric(uniform[0], chat) + 0.8 * widest
    assert metric(adaptive[widest], chat) < metric(adaptive[0], chat) + 0.1 * widest
    assert metric(adaptive[widest], "per_class.interactive.slo.attainment") >= 0.99
    assert metric(uniform[widest], "per_class.interactive.slo.attainment") < 0.5
    # the background jobs still wait and batch under the adaptive window
    background = "per_class.background.ttft_ms.p50"
    assert metric(adaptive[widest], background) > metric(adaptive[0], background) + 0.5 * widest
    assert metric(adaptive[widest], background) == pytest.approx(metric(uniform[widest], background), rel=0.1)
    assert adaptive[widest].metrics["iterations"] < adaptive[0].metrics["iterations"]


# -- routers on a bursty trace ---------------------------------------------------------------------------


def azure_code_rows() -> list[tuple[str, int, int]]:
    """An Azure-2023-format trace with the code trace's shape: a request every 3 s for 6.7 minutes,
    and a burst of 750 requests in 25 s at t = 100 s (more prompt tokens than four A100s can
    prefill in that time); prompts 200-4,199 tokens, answers 5-44 tokens."""
    base = datetime.datetime(2023, 11, 16, 18, 0, 0)
    times = sorted([100.0 + k / 30 for k in range(750)] + [3.0 * k for k in range(134)])
    rows = []
    for i, t in enumerate(times):
        stamp = (base + datetime.timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        rows.append((stamp, 200 + (i * 397) % 4000, 5 + (i * 13) % 40))
    return rows


@pytest.fixture(scope="module")
def azure_code_trace(tmp_path_factory):
    rows = azure_code_rows()
    path = tmp_path_factory.mktemp("azure") / "code.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{s},{p},{o}\n" for s, p, o in rows))
    return path, rows


def test_router_comparison_on_a_generated_bursty_trace(azure_code_trace):
    path, rows = azure_code_trace
    results = run("router_comparison.toml", [f"workload.classes.code.path={path}",
                                             "workload.classes.chat.num_requests=300", "experiment.timeline=false"])
    runs = {r.name: r for r in results.all_runs()}
    for r in runs.values():
        assert r.metrics["finished"] == len(rows) + 300 and set(r.metrics["per_class"]) == {"chat", "code"}
    # round robin: the same count everywhere
    counts = [runs["round_robin"].metrics["per_instance"][str(i)]["requests"] for i in range(4)]
    assert max(counts) - min(counts) <= 1
    # KV usage ignores the waiting queue: a burst piles up behind instances whose running set looks small
    p99 = {name: metric(r, "ttft_ms.p99") for name, r in runs.items()}
    assert max(p99, key=p99.get) == "least_kv" and p99["least_kv"] > 2 * p99["least_outstanding"]
    # affinity keeps a repository's context on one instance: more hits, faster chat answers
    for name in ("prefix_affinity", "prefix_affinity_spill"):
        assert metric(runs[name], "prefix_cache.hit_rate") > metric(runs["round_robin"], "prefix_cache.hit_rate")
        chat50 = "per_class.chat.ttft_ms.p50"
        assert metric(runs[name], chat50) < metric(runs["round_robin"], chat50) / 2
    # class routing: chat alone on instance 3 keeps its tail through the burst; code pays with 3 instances
    req = runs["class"].requests
    assert set(req["instance"][req["request_class"] == "chat"]) == {3}
    assert set(req["instance"][req["request_class"] == "code"]) == {0, 1, 2}
    chat99, code99 = "per_class.chat.ttft_ms.p99", "per_class.code.ttft_ms.p99"
    assert metric(runs["class"], chat99) < metric(runs["least_outstanding"], chat99) / 4  # 4.8x here
    assert metric(runs["class"], code99) > metric(runs["least_outstanding"], code99)
    # the bursts drain wherever the whole cluster takes them; squeezed onto three instances, the
    # completions' queue grows on one of them, which the saturation check flags
    verdict = {name: r.metrics["stability"]["verdict"] for name, r in runs.items()}
    assert {v for name, v in verdict.items() if name != "class"} == {"stable"}
    assert verdict["class"] == "unstable"
    assert set(runs["class"].metrics["stability"]["unstable_instances"]) <= {0, 1, 2}


def test_generated_azure_trace_reads_back_exactly(azure_code_trace):
    path, rows = azure_code_trace
    arrival, columns, n_zero = load_azure(path)
    assert n_zero == 0 and len(arrival) == len(rows) == 884
    assert arrival[0] == 0.0 and arrival[-1] == pytest.approx(399_000.0)
    burst = arrival[(arrival >= 100_000) & (arrival < 125_000)]
    assert len(burst) == 750 + 8  # the burst and the every-3-s requests at 102, 105, ..., 123 s


def test_replicas_paired_differences_see_what_overlapping_intervals_hide():
    results = run("replicas.toml", [])
    fcfs, more, sjf = (results.study(name).runs[0] for name in ("fcfs", "fcfs_17", "sjf"))
    assert len(fcfs.replicas) == len(more.replicas) == 10
    # on their own, the two p99 TTFT intervals overlap ...
    assert more.intervals["ttft_ms.p99"][1] > fcfs.intervals["ttft_ms.p99"][0]
    # ... but replica by replica, 17 slots shorten the tail every time the draws are the same
    from schedlab.study.replicas import paired_difference

    d = paired_difference(fcfs, more, "ttft_ms.p99")
    assert d.high < 0 and not d.within_noise
    assert paired_difference(fcfs, more, "throughput_tps").within_noise
    assert paired_difference(fcfs, sjf, "ttft_ms.p99").low > 0  # SJF's tail is worse


def test_capacity_plan_prunes_and_finds_two_a100s():
    study = run("capacity_plan.toml", ["workload.num_requests=300"]).studies[0]
    plan = study.plan
    status = {(c["point"]["gpu"], c["point"]["tensor_parallel"]): c["status"] for c in plan.candidates}
    # one L4 decode step reads 16 GB of weights at 300 GB/s: over the 80 ms TPOT target with any batch
    assert status[("l4", 1)] == "fails"
    assert plan.cheapest["point"]["gpu"] == "a100-40gb" and plan.cheapest["cost"] == pytest.approx(2.58)
    assert plan.cheapest["instances"] * plan.cheapest["point"]["tensor_parallel"] == 2
    # every H100 candidate costs more than the answer at one instance: pruned without a run
    assert status[("h100-80gb", 1)] == status[("h100-80gb", 2)] == "too-expensive"
    assert not any(d["gpu"] == "h100-80gb" for d in plan.deployments)
    assert len(plan.deployments) < plan.grid_size / 5


# -- speculative decoding ----------------------------------------------------------------------------------


def test_speculative_decoding_pays_at_low_load_and_costs_at_high_load():
    from schedlab_plugins.reports.crossover import CrossoverConfig, compare

    path = EXPERIMENTS / "speculative_decoding.toml"
    results = run("speculative_decoding.toml", ["workload.duration_ms=12000"])
    config = from_table(CrossoverConfig, load(path).report_tables["crossover"], where="crossover")
    lines = {(line.study, line.label): line for line in compare(results, config)}
    plain = by_point(results.study("plain"), "workload.clients")
    for (study, label), line in lines.items():
        one = by_point(results.study(study), "workload.clients")[1] if study == "ngram" else next(
            r for r in results.study(study).runs if r.point["workload.clients"] == 1 and label in r.name)
        # at one client every drafter cuts TPOT: several tokens a step for about the price of one --
        # barely the 3B draft model, whose three passes cost about 1.5 target steps
        bound = 1.0 if label == "model=llama-3.2-3b" else 0.9
        assert metric(one, "tpot_ms.mean") < bound * metric(plain[1], "tpot_ms.mean"), label
    # ... and the cheap, accurate ones stay ahead at 256 clients while the others lose throughput
    assert lines[("alpha", "acceptance_rate=0.9")].side == "above"
    assert lines[("ngram", "ngram")].side == "above"
    for key in [("alpha", "acceptance_rate=0.5"), ("k", "num_speculative_tokens=7"), ("drafter", "model=llama-3.2-1b"),
                ("drafter", "model=llama-3.2-3b")]:
        assert lines[key].side == "inside" and lines[key].ratios[-1] < 0.95, key
    # the crossover moves up with the acceptance rate and down with the drafter's cost
    assert lines[("alpha", "acceptance_rate=0.5")].crossover < lines[("alpha", "acceptance_rate=0.7")].crossover
    drafters = [lines[("drafter", f"model={m}")].crossover for m in ("eagle-llama-3-8b", "llama-3.2-1b", "llama-3.2-3b")]
    assert drafters == sorted(drafters, reverse=True)
    # drafts past k = 3 gain little at low load and cost more at high load
    assert lines[("k", "num_speculative_tokens=7")].crossover < lines[("k", "num_speculative_tokens=3")].crossover


# -- disaggregated prefill and decode (DistServe's question) ---------------------------------------------


def test_disaggregation_wins_where_prefill_interference_breaks_tpot_and_the_ratio_fits():
    from schedlab_plugins.reports.goodput import GoodputConfig, systems

    exp = load(EXPERIMENTS / "disaggregation.toml", ["workload.num_requests=150"])
    keep = ("chat 2 colocated", "chat 1P1D", "summarize 4 colocated", "summarize 1P3D", "summarize 3P1D")
    exp.studies = [s for s in exp.studies if s.name in keep]
    results = run_experiment(exp)
    config = from_table(GoodputConfig, exp.report_tables["goodput"], where="[reports.goodput]")
    per_gpu = {s.label: s.per_gpu for s in systems(results, config)}
    top = {name: max(results.study(name).runs, key=lambda r: r.point["workload.rate"]) for name in keep}
    # disaggregated decode never waits behind a prompt: TPOT stays low at any load ...
    for name in ("chat 1P1D", "summarize 1P3D", "summarize 3P1D"):
        assert all(metric(r, "tpot_ms.p90") < 20 for r in results.study(name).runs), name
    # ... while colocated instances mix prefill chunks into the decodes' iterations
    assert metric(top["chat 2 colocated"], "tpot_ms.p90") > 1.5 * metric(top["chat 1P1D"], "tpot_ms.p90")
    assert metric(top["summarize 4 colocated"], "tpot_ms.p90") > 4 * metric(top["summarize 3P1D"], "tpot_ms.p90")
    # long prompts, short answers: three prefill GPUs per decode GPU serve the most per GPU; one is the worst
    assert per_gpu["summarize 3P1D"] > 1.3 * per_gpu["summarize 4 colocated"] > 1.3 * per_gpu["summarize 1P3D"]
    assert metric(top["summarize 1P3D"], "pools.prefill.busy_share") > 0.9  # the lone prefill GPU saturates
    # chat on two GPUs: colocation wins -- one prefill GPU caps 1P1D first (TTFT), not the decodes
    assert per_gpu["chat 2 colocated"] > 1.2 * per_gpu["chat 1P1D"]
    assert metric(top["chat 1P1D"], "ttft_ms.p90") > 2 * metric(top["chat 2 colocated"], "ttft_ms.p90")
    # every transferred prompt moved 128 KiB per token (Llama-3-8B, bf16) over the link, in whole 16-token blocks
    req = top["summarize 3P1D"].requests
    moved = req["kv_pulled_ms"] >= 0
    assert moved.all() and (req["kv_bytes"] == -(-req["prompt_tokens"] // 16) * 16 * 128 * 1024).all()


def test_client_view_front_end_timeouts_and_api_server_queueing():
    runs = {s.name: s.runs[0] for s in run("client_view.toml", []).studies}
    # through the API server, 8 requests/s never queue: each takes 0.05 + 1 + 0.002 x prompt ms
    req = runs["client"].requests
    assert req["arrival_ms"] - req["sent_ms"] == pytest.approx(1.05 + 0.002 * req["prompt_tokens"])
    # the way out: token_ms (11.0 - 1.1 ms, vLLM PR #54628's gap less the other defaults) + 0.05 of network
    assert req["client_first_ms"] - req["first_token_ms"] == pytest.approx(9.9 + 0.05)
    assert metric(runs["engine"], "client.ttft_ms.p50") == metric(runs["engine"], "ttft_ms.p50")
    # drained: the second stage (from request 240) starts 5 s after the first stage's last byte
    req = runs["drained"].requests
    first_stage = req["id"] < 240
    assert req["sent_ms"][~first_stage].min() == pytest.approx(req["client_done_ms"][first_stage].max() + 5000.0)
    # overload: the queue grows; with 10 s timeouts most clients give up, their requests are aborted
    # after they produced tokens, and every completed request took at most 10 s
    assert runs["overload"].metrics["stability"]["verdict"] == "unstable"
    m, req = runs["timeouts"].metrics, runs["timeouts"].requests
    assert m["timed_out"] > 0.6 * m["requests"] and m["aborted"] > 0.95 * m["timed_out"]
    assert (req["generated_tokens"][req["aborted"] == 1] > 0).all()
    assert metric(runs["timeouts"], "client.e2el_ms.max") <= 10_000.0
    assert metric(runs["timeouts"], "ttft_ms.p50") < metric(runs["overload"], "ttft_ms.p50") / 100
    # one API server: requests queue before the engine, which stays fast; four: the queue moves into the engine
    one, four = runs["one_api_server"], runs["four_api_servers"]
    assert metric(one, "client.frontend_ms.p99") > 1000 and metric(one, "ttft_ms.p50") < 100
    assert metric(four, "client.frontend_ms.p99") < 10 and metric(four, "ttft_ms.p50") > 200
    assert metric(four, "client.ttft_ms.p50") < metric(one, "client.ttft_ms.p50") / 2
# -- multi-GPU layouts: data parallel with expert parallel, pipeline ------------------------------------------


def test_a_data_parallel_moe_pair_decodes_faster_than_two_instances():
    from schedlab.testing import compare_runs

    results = run("multi_gpu.toml", ["workload.limit=120"])
    runs = {r.name: r for r in results.all_runs()}
    assert {name: metric(r, "gpus") for name, r in runs.items()} == {
        "1 GPU": 1, "2 instances": 2, "DP 2 + EP": 2, "DP 2 + EP, synchronous": 2, "DP 2 + EP, skewed": 2,
        "DP 2, experts sharded": 2, "PP 2": 2, "PP 2, synchronous": 2,
        "DP 2 + EP (roofline)": 2, "DP 2 + EP (reference engine)": 2, "4 instances, twice the load": 4,
        "2 x (DP 2 + EP), twice the load": 4}
    compare_runs(runs["DP 2 + EP"], runs["DP 2 + EP (reference engine)"], rel=1e-9)
    # each GPU of the pair reads half the experts: decode steps shorter than one instance's
    assert metric(runs["DP 2 + EP"], "tpot_ms.mean") < 0.9 * metric(runs["2 instances"], "tpot_ms.mean")
    # an uneven router loads one GPU more; the step waits for it
    assert metric(runs["DP 2 + EP, skewed"], "tpot_ms.mean") > metric(runs["DP 2 + EP"], "tpot_ms.mean")
    # the pipeline's stages each hold half the layers: faster decode steps than one GPU
    assert metric(runs["PP 2"], "tpot_ms.mean") < metric(runs["1 GPU"], "tpot_ms.mean")
    # planning ahead (vLLM 0.33's V2 model runner), a decode need not wait for its token to come back
    assert metric(runs["PP 2"], "tpot_ms.mean") < metric(runs["PP 2, synchronous"], "tpot_ms.mean")
    assert runs["PP 2"].meta["plans_ahead"] and not runs["PP 2, synchronous"].meta["plans_ahead"]
    assert runs["DP 2 + EP"].meta["kv_cache"]["expert_gpus"] == 2
    # planning ahead (the preset's default), a request arriving while its rank computes is planned a step later
    assert metric(runs["DP 2 + EP"], "ttft_ms.p50") > metric(runs["DP 2 + EP, synchronous"], "ttft_ms.p50")
    # so do two such deployments against four instances, on the same requests
    fleet = runs["2 x (DP 2 + EP), twice the load"]
    assert fleet.meta["data_parallel"]["deployments"] == 2
    assert sorted(set(fleet.requests["instance"].tolist())) == [0, 1, 2, 3]
    assert metric(fleet, "tpot_ms.mean") < 0.9 * metric(runs["4 instances, twice the load"], "tpot_ms.mean")


# -- a day of a fleet ---------------------------------------------------------------------------------------


def test_fleet_day_autoscaling_pays_less_for_the_same_attainment():
    """Three hours, the middle one five times as busy (2.6, 12.9, 2.6 requests/s: 43,000 requests)
    on 4 instances: the autoscaled fleet pays fewer GPU-hours than the fixed one, most in the
    busiest hour, and meets the SLO about as often (the step up costs it during cold starts)."""
    profile = "[1, 5, 1" + ", 1" * 21 + "]"
    results = run("fleet_day.toml", ["workload.hours=3", f"workload.profile={profile}", "workload.mean_rate=2",
                                     # target 8 scales up too late for this step: 3% of the busiest
                                     # hour's requests miss the SLO during the cold starts
                                     "cluster.instances=4", "runs.autoscaled.cluster.autoscaler.target=6",
                                     "runs.autoscaled.cluster.autoscaler.min_instances=1"])
    fixed, scaled = results.study("fixed").runs[0], results.study("autoscaled").runs[0]
    assert fixed.metrics["requests"] == scaled.metrics["requests"] > 40_000
    assert fixed.metrics["gpu_hours"] == pytest.approx(4 * fixed.metrics["makespan_ms"] / 3.6e6, rel=0.01)
    assert scaled.metrics["gpu_hours"] < 0.8 * fixed.metrics["gpu_hours"]
    hourly = scaled.metrics["hourly"]
    assert hourly["1"]["gpu_hours"] > hourly["0"]["gpu_hours"] and hourly["1"]["gpu_hours"] > hourly["2"]["gpu_hours"]
    assert scaled.metrics["slo"]["attainment"] > fixed.metrics["slo"]["attainment"] - 0.01
    assert scaled.metrics["fleet"]["scale_ups"] > 0 and scaled.metrics["fleet"]["scale_downs"] > 0
