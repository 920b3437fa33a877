"""schedlab's speed benchmarks (issue: cost proportional to events, not tokens).

    python benchmarks/run.py            # all ten, prints a Markdown table
    python benchmarks/run.py azure scaling tokens reference
    python benchmarks/run.py --quick    # 10k/100k instead of up to 1M requests

1. azure      -- the Azure 2023 conversation trace through vLLM-style batching (azure.toml):
                 simulation wall time (best of 3) and the whole `schedlab run` command.
2. scaling    -- 10k, 100k, 1M synthetic requests near saturation (scaling.toml): wall time,
                 peak memory (max RSS of a fresh process), microseconds per request.
3. tokens     -- the same 100k requests with outputs x1 and x10, at a load both sustain
                 (0.9 requests/s): wall-time ratio.
4. reference  -- fast vs step-by-step reference engine on benchmark 1: speed ratio.
5. profiled   -- benchmark 1 with the profiled cost model (the shipped RTX PRO 6000 /
                 Llama-3.1-8B bundle) instead of the roofline: simulation time ratio (target <= 2x),
                 and against the roofline of that GPU and model (same simulated load).
6. speculative -- the first 3,000 requests of benchmark 1 with speculative decoding (k = 3
                 drafts from a 1B draft model, acceptance 0.7): fast engine with and without
                 speculation, and the reference engine with it. Speculative steps draw each
                 sequence's tokens, so the fast engine runs them one at a time: this is the price.
                 Then the same planning each batch ahead (async_scheduling = true), both engines.
7. energy     -- benchmark 1 with a [power] table (the utilisation model) against without:
                 the meter is called once per event (bulk runs in closed form), so the events
                 stay the same and the cost is a few model calls per event.
8. parallel   -- Qwen3-30B-A3B as data-parallel ranks with expert parallelism (bulk decode runs
                 only while one rank stays the slowest), as two such deployments behind a load
                 balancer, and as a 2-stage pipeline (batch by batch), in the fast and the
                 reference engine (moe_layouts.toml).
9. async      -- benchmark 1 with vLLM's asynchronous scheduling (each batch planned while the
                 one before it runs): bulk runs start only at plans that left no arrival over
                 and at which no finished request held a slot while others waited, so this is
                 its price against the synchronous run, and the reference engine beside it.
10. sglang    -- benchmark 1 under SGLang's scheduler and radix cache (16-token pages), with its
                 overlap scheduler (the default) and without: the engines ask it at every plan
                 made beside a finished request (it may decode one once more), and the
                 reference engine beside it.

The Azure trace is looked for in ``--traces DIR``, else ``$SCHEDLAB_TRACES``, else
``../shared/traces`` next to the repository (a git worktree elsewhere needs one of the first
two); when it is in none of them a synthetic stand-in of the same size and shape is used, and
the table says which.

Each measurement runs in a fresh Python process. Timings are wall clock on whatever machine
runs this, with the simulation's CPU time beside them (the steadier figure on a shared machine);
they are reported, never asserted (tests assert event counts instead).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE_NAME = "azure2023_AzureLLMInferenceTrace_conv.csv"
DEFAULT_TRACES = HERE.parent.parent / "shared" / "traces"


def trace_dirs(option: str | None) -> list[tuple[Path, str]]:
    """Where to look for the trace, in order, each with how it was given."""
    dirs = []
    if option:
        dirs.append((Path(option), "--traces"))
    if os.environ.get("SCHEDLAB_TRACES"):
        dirs.append((Path(os.environ["SCHEDLAB_TRACES"]), "$SCHEDLAB_TRACES"))
    dirs.append((DEFAULT_TRACES, "../shared/traces"))
    return dirs


def synthetic_azure_trace(path: Path, n: int = 19366, seed: int = 0) -> None:
    """A stand-in with the conversation trace's size and shape (used when it is absent):
    ~1 hour, bursty arrivals, lognormal prompt and output lengths near the trace's."""
    import numpy as np

    rng = np.random.default_rng(seed)
    gaps = rng.gamma(0.5, 2 * 3600.0 / n, n - 1)  # cv ~1.4, one hour on average
    t = np.concatenate([[0.0], np.cumsum(gaps)])
    prompts = np.clip(rng.lognormal(np.log(1020), 1.0, n), 2, 16000).astype(int)
    outputs = np.clip(rng.lognormal(np.log(130), 1.1, n), 7, 2000).astype(int)
    base = np.datetime64("2023-11-16T18:15:46")
    with open(path, "w") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for ts, p, o in zip(t, prompts, outputs):
            stamp = str(base + np.timedelta64(int(ts * 1e7), "100ns")).replace("T", " ")
            fh.write(f"{stamp},{p},{o}\n")


def azure_overrides(traces: str | None) -> tuple[list[str], str]:
    """``workload.path`` for benchmark 1: the real trace if found, else a synthetic stand-in."""
    for folder, given in trace_dirs(traces):
        trace = folder / TRACE_NAME
        if trace.is_file():
            return [f"workload.path={trace.resolve()}"], f"Azure 2023 conv trace ({given})"
        if given != "../shared/traces":
            print(f"benchmarks: {given} = {folder}: no {TRACE_NAME} there; looking further", file=sys.stderr)
    path = Path(tempfile.gettempdir()) / "schedlab_synthetic_azure_conv.csv"
    if not path.exists():
        synthetic_azure_trace(path)
    looked = ", ".join(str(folder) for folder, _ in trace_dirs(traces))
    return [f"workload.path={path}"], f"synthetic stand-in for the Azure conv trace ({TRACE_NAME} not in {looked})"


# -- child process: one measurement ------------------------------------------------------------


def child(toml: str, overrides: list[str]) -> dict:
    from schedlab.study.experiment import load, run_experiment
    from sim_timing import time_simulations

    # The CPU time of the simulation alone, every engine's (sim_timing.py): on a machine shared
    # with other jobs it is what the wall time would be on an idle one.
    cpu = time_simulations()
    exp = load(HERE / toml, overrides)
    run = run_experiment(exp).all_runs()[0]
    return {
        "wall_ms": run.meta["wall_ms"],
        "cpu_ms": sum(cpu) * 1e3,
        "events": run.meta["events"],
        "iterations": run.metrics["iterations"],
        "requests": run.metrics["requests"],
        "generated_tokens": run.metrics["generated_tokens"],
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure(toml: str, overrides: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", toml, *overrides]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SCHEDLAB_NO_PROGRESS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout.strip().split("\n")[-1])


# -- the benchmarks --------------------------------------------------------------------------------


def interleaved(named: dict[str, list[str]], times: int = 3) -> dict[str, list[dict]]:
    """Benchmark 1 under each named set of overrides, ``times`` times, interleaved so that a busy
    spell on a shared machine falls on every one of them."""
    runs: dict[str, list] = {name: [] for name in named}
    for _ in range(times):
        for name, overrides in named.items():
            runs[name].append(measure("azure.toml", overrides))
    return runs


def bench_azure(rows: list, azure: tuple[list[str], str]) -> dict:
    overrides, source = azure
    runs = [measure("azure.toml", overrides) for _ in range(3)]
    best = min(runs, key=lambda r: r["wall_ms"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        sets = [a for o in overrides for a in ("--set", o)]
        subprocess.run([sys.executable, "-m", "schedlab.cli", "run", str(HERE / "azure.toml"), "--out", out,
                        "--no-plots", *sets], check=True, capture_output=True)
    command_s = time.perf_counter() - started
    cpu = min(r["cpu_ms"] for r in runs)
    rows.append(("1. Azure conv trace, simulation", f"{best['wall_ms'] / 1e3:.2f} s",
                 f"CPU {cpu / 1e3:.2f} s; {best['requests']:,} requests, {best['iterations']:,} iterations in "
                 f"{best['events']:,} events; {source}"))
    rows.append(("1. Azure conv trace, whole command", f"{command_s:.2f} s",
                 "`schedlab run benchmarks/azure.toml --no-plots`: start-up, trace loading, metrics, table"))
    return best


def bench_scaling(rows: list, sizes) -> None:
    for n in sizes:
        repeats = 3 if n <= 100_000 else 1  # best of 3 where it is cheap: this VM's timings vary ~20%
        runs = [measure("scaling.toml", [f"workload.num_requests={n}"]) for _ in range(repeats)]
        r = min(runs, key=lambda m: m["wall_ms"])
        cpu = min(m["cpu_ms"] for m in runs)
        rows.append((f"2. {n:,} requests", f"{r['wall_ms'] / 1e3:.2f} s",
                     f"CPU {cpu / 1e3:.2f} s; {r['wall_ms'] * 1e3 / n:.1f} us/request, "
                     f"peak RSS {r['maxrss_mb']:.0f} MB, "
                     f"{r['events'] / n:.2f} events/request, {r['iterations']:,} iterations"))


def bench_tokens(rows: list, n: int) -> None:
    # 0.9 requests/s: a load the server sustains with x1 and with x10 outputs. (At the x1
    # saturation rate, x10 outputs overload the KV cache: the run then preempts, and every
    # preemption is a real scheduling event, so events grow with tokens there.)
    load = [f"workload.num_requests={n}", "workload.rate=0.9"]
    one = measure("scaling.toml", load)
    ten = measure("scaling.toml", load + ["workload.output_scale=10"])
    rows.append((f"3. outputs x10 vs x1 ({n:,} requests)", f"{ten['wall_ms'] / one['wall_ms']:.2f}x",
                 f"{one['wall_ms'] / 1e3:.2f} s -> {ten['wall_ms'] / 1e3:.2f} s "
                 f"(CPU {one['cpu_ms'] / 1e3:.2f} s -> {ten['cpu_ms'] / 1e3:.2f} s, "
                 f"{ten['cpu_ms'] / one['cpu_ms']:.2f}x); tokens {one['generated_tokens']:,} -> "
                 f"{ten['generated_tokens']:,}; events {one['events']:,} -> {ten['events']:,}"))


def bench_reference(rows: list, azure: tuple[list[str], str], fast: dict | None) -> None:
    overrides, _ = azure
    if fast is None:
        fast = measure("azure.toml", overrides)
    ref = measure("azure.toml", overrides + ["experiment.engine=reference"])
    rows.append(("4. fast vs reference engine (benchmark 1)", f"{ref['wall_ms'] / fast['wall_ms']:.0f}x",
                 f"reference {ref['wall_ms'] / 1e3:.1f} s, fast {fast['wall_ms'] / 1e3:.2f} s "
                 f"(CPU {ref['cpu_ms'] / 1e3:.1f} s / {fast['cpu_ms'] / 1e3:.2f} s, "
                 f"{ref['cpu_ms'] / fast['cpu_ms']:.0f}x)"))


PROFILED = ["cost_model.kind=profiled", "cost_model.model=llama-3.1-8b",
            "cost_model.profile=../experiments/data/llmservingsim/profiles/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16"]


#: The roofline for the profiled bundle's own GPU and model: the same simulated hardware, so the
#: same load and about as many events; the ratio to it is the cost of the profiled lookups alone.
SAME_GPU_ROOFLINE = ["cost_model.gpu=rtx-pro-6000-server", "cost_model.model=llama-3.1-8b"]


def bench_profiled(rows: list, azure: tuple[list[str], str]) -> None:
    """Best of 3 of each, wall and CPU time taken separately (the three interleaved, so that a
    busy spell on a shared machine does not fall on one model only)."""
    overrides, source = azure
    runs = interleaved({"roofline": overrides, "same": overrides + SAME_GPU_ROOFLINE,
                        "profiled": overrides + PROFILED})
    best = {name: {key: min(r[key] for r in rs) for key in ("wall_ms", "cpu_ms")} | {"events": rs[0]["events"]}
            for name, rs in runs.items()}
    prof, fast, same = best["profiled"], best["roofline"], best["same"]

    def ratio(base: dict) -> str:
        return f"{prof['wall_ms'] / base['wall_ms']:.2f}x wall, {prof['cpu_ms'] / base['cpu_ms']:.2f}x CPU"

    def secs(r: dict) -> str:
        return f"{r['wall_ms'] / 1e3:.2f} s wall / {r['cpu_ms'] / 1e3:.2f} s CPU ({r['events']:,} events)"

    rows.append(("5. profiled vs roofline cost model (benchmark 1)", ratio(fast),
                 f"profiled {secs(prof)}, roofline {secs(fast)}; {source}"))
    rows.append(("5. profiled vs roofline of the same GPU and model", ratio(same),
                 f"roofline for rtx-pro-6000-server / llama-3.1-8b {secs(same)}"))


SPECULATIVE = ['speculative={method = "draft_model", num_speculative_tokens = 3, acceptance_rate = 0.7, '
               'draft = {kind = "roofline", model = "llama-3.2-1b", gpu = "a100-80gb"}}']


def bench_speculative(rows: list, azure: tuple[list[str], str]) -> None:
    overrides, source = azure
    part = overrides + ["workload.limit=3000"]
    plain = min((measure("azure.toml", part) for _ in range(3)), key=lambda r: r["wall_ms"])
    spec = min((measure("azure.toml", part + SPECULATIVE) for _ in range(3)), key=lambda r: r["wall_ms"])
    ref = measure("azure.toml", part + SPECULATIVE + ["experiment.engine=reference"])
    rows.append(("6. speculative decoding (3,000 requests of benchmark 1)",
                 f"{spec['wall_ms'] / plain['wall_ms']:.1f}x plain, {ref['wall_ms'] / spec['wall_ms']:.1f}x faster "
                 "than reference",
                 f"fast {spec['wall_ms'] / 1e3:.2f} s wall / {spec['cpu_ms'] / 1e3:.2f} s CPU ({spec['events']:,} "
                 f"events = iterations), plain {plain['wall_ms'] / 1e3:.2f} s ({plain['iterations']:,} iterations in "
                 f"{plain['events']:,} events), reference {ref['wall_ms'] / 1e3:.2f} s; "
                 f"{spec['wall_ms'] * 1e3 / max(spec['generated_tokens'], 1):.1f} us per generated token; {source}"))
    # the same planning each batch ahead (vLLM's default): drafts in flight counted as computed
    ahead_part = part + SPECULATIVE + ["scheduler.async_scheduling=true"]
    ahead = min((measure("azure.toml", ahead_part) for _ in range(3)), key=lambda r: r["wall_ms"])
    ref_ahead = measure("azure.toml", ahead_part + ["experiment.engine=reference"])
    rows.append(("6b. the same, each batch planned ahead (async_scheduling = true)",
                 f"{ahead['wall_ms'] / spec['wall_ms']:.1f}x synchronous, {ref_ahead['wall_ms'] / ahead['wall_ms']:.1f}x "
                 "faster than reference",
                 f"fast {ahead['wall_ms'] / 1e3:.2f} s wall / {ahead['cpu_ms'] / 1e3:.2f} s CPU ({ahead['events']:,} "
                 f"events), reference {ref_ahead['wall_ms'] / 1e3:.2f} s; {source}"))


def bench_energy(rows: list, azure: tuple[list[str], str]) -> None:
    overrides, source = azure
    runs = interleaved({"off": overrides, "on": overrides + ["power.kind=utilisation"]})
    off, on = (min(rs, key=lambda r: r["wall_ms"]) for rs in (runs["off"], runs["on"]))
    cpu_off, cpu_on = (min(r["cpu_ms"] for r in rs) for rs in (runs["off"], runs["on"]))
    rows.append(("7. energy metered vs not (benchmark 1)", f"{on['wall_ms'] / off['wall_ms']:.2f}x wall, "
                 f"{cpu_on / cpu_off:.2f}x CPU",
                 f"with [power] {on['wall_ms'] / 1e3:.2f} s ({on['events']:,} events), without "
                 f"{off['wall_ms'] / 1e3:.2f} s ({off['events']:,} events); {source}"))
LAYOUTS = {"DP 2 + EP": ["cluster.data_parallel=2", "cluster.expert_parallel=true"],
           # each rank planning ahead, as vLLM's DP engine cores do by default
           "DP 2 + EP, async": ["cluster.data_parallel=2", "cluster.expert_parallel=true",
                                "scheduler.async_scheduling=true"],
           "PP 2": ["cluster.pipeline_parallel=2"],
           # planning ahead, as vLLM 0.33's V2 model runner does: a batch more in flight, decodes staggered
           "PP 2, async": ["cluster.pipeline_parallel=2", "scheduler.async_scheduling=true"],
           # two deployments behind a load balancer, each stepping on its own, at twice the rate
           "2 x (DP 2 + EP)": ["cluster.data_parallel=2", "cluster.expert_parallel=true", "cluster.instances=2",
                               'cluster.router={kind = "least_outstanding"}', "workload.rate=20"]}


def bench_parallel(rows: list) -> None:
    for name, layout in LAYOUTS.items():
        fast = min((measure("moe_layouts.toml", layout) for _ in range(3)), key=lambda r: r["wall_ms"])
        ref = measure("moe_layouts.toml", layout + ["experiment.engine=reference"])
        rows.append((f"8. {name} (Qwen3-30B-A3B, 300 requests)", f"{fast['wall_ms'] / 1e3:.2f} s",
                     f"CPU {fast['cpu_ms'] / 1e3:.2f} s; {fast['iterations']:,} iterations in {fast['events']:,} "
                     f"events; reference engine {ref['wall_ms'] / 1e3:.2f} s, CPU {ref['cpu_ms'] / 1e3:.2f} s "
                     f"({ref['events']:,} events)"))


def two_ways(rows: list, title: str, source: str, named: dict[str, list[str]], reference: list[str]) -> None:
    """Benchmark 1 two ways (``named``: the way measured first, then the way it is compared
    with), interleaved three times each, best CPU time each, and the first way on the reference
    engine (``reference``: its overrides); one row: the ratio of CPU times and each run's work."""
    runs = interleaved(named)
    (first, a), (second, b) = ((name, min(rs, key=lambda r: r["cpu_ms"])) for name, rs in runs.items())
    ref = measure("azure.toml", reference + ["experiment.engine=reference"])

    def work(r: dict) -> str:
        return f"({r['iterations']:,} iterations in {r['events']:,} events)"

    rows.append((title, f"{a['cpu_ms'] / b['cpu_ms']:.1f}x CPU, {ref['cpu_ms'] / a['cpu_ms']:.1f}x faster than "
                 "reference",
                 f"{first} {a['cpu_ms'] / 1e3:.2f} s CPU {work(a)}, {second} {b['cpu_ms'] / 1e3:.2f} s {work(b)}, "
                 f"reference {ref['cpu_ms'] / 1e3:.2f} s; {source}"))


def bench_async(rows: list, azure: tuple[list[str], str]) -> None:
    overrides, source = azure
    ahead = overrides + ["scheduler.async_scheduling=true"]
    two_ways(rows, "9. asynchronous scheduling (benchmark 1)", source, {"async": ahead, "sync": overrides}, ahead)


#: benchmark 1 under SGLang's scheduler and radix cache (16-token pages: SGLang's one-token
#: pages make the tree 16x deeper)
SGLANG = ['scheduler={kind = "sglang", max_running_requests = 256}',
          'kv_cache={kind = "radix", model = "llama-3-8b", gpu = "a100-80gb", block_size = 16}']


def bench_sglang(rows: list, azure: tuple[list[str], str]) -> None:
    overrides, source = azure
    base = overrides + SGLANG
    two_ways(rows, "10. SGLang's scheduler with its overlap scheduler (benchmark 1)", source,
             {"overlap": base, "sync": base + ["scheduler.overlap_schedule=false"]}, base)


#: benchmark 1 with gpt-oss-20b on an H100: its window layers' blocks slide (schedlab.kv_window), so
#: the fast engine steps decodes one by one; without the hybrid manager it runs bulk decode runs
GPT_OSS = ['kv_cache={kind = "paged", model = "gpt-oss-20b", gpu = "h100-80gb"}',
           'cost_model={kind = "roofline", model = "gpt-oss-20b", gpu = "h100-80gb"}']


def bench_window(rows: list, azure: tuple[list[str], str]) -> None:
    overrides, source = azure
    base = overrides + GPT_OSS
    two_ways(rows, "11. sliding-window layers (benchmark 1 on gpt-oss-20b, H100)", source,
             {"window": base, "every layer whole": base + ["kv_cache.disable_hybrid_kv_cache_manager=true"]}, base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("which", nargs="*",
                        default=["azure", "scaling", "tokens", "reference", "profiled", "speculative", "energy",
                                 "parallel", "async", "sglang", "window"])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (10k and 100k requests)")
    parser.add_argument("--traces", metavar="DIR", help="folder holding the Azure trace (default: "
                        "$SCHEDLAB_TRACES, else ../shared/traces next to the repository)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1:])))
        return 0
    azure = azure_overrides(args.traces)
    rows: list = []
    fast = None
    if "azure" in args.which:
        fast = bench_azure(rows, azure)
    if "scaling" in args.which:
        bench_scaling(rows, (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000))
    if "tokens" in args.which:
        bench_tokens(rows, 10_000 if args.quick else 100_000)
    if "reference" in args.which:
        bench_reference(rows, azure, fast)
    if "profiled" in args.which:
        bench_profiled(rows, azure)
    if "speculative" in args.which:
        bench_speculative(rows, azure)
    if "energy" in args.which:
        bench_energy(rows, azure)
    if "parallel" in args.which:
        bench_parallel(rows)
    if "async" in args.which:
        bench_async(rows, azure)
    if "sglang" in args.which:
        bench_sglang(rows, azure)
    if "window" in args.which:
        bench_window(rows, azure)
    print("| benchmark | result | details |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
