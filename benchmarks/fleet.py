"""Fleet-scale benchmarks (issue 21): CPU per request against cluster size, memory against requests.

    python benchmarks/fleet.py                 # 1 vs 64 instances (200,000 requests), 100k vs 400k requests
    python benchmarks/fleet.py cpu memory      # either part
    python benchmarks/fleet.py --repeat 3 cpu  # best of 3
    python benchmarks/fleet.py big             # 10 million requests over 256 instances (about an hour)
    python benchmarks/fleet.py closed          # a closed loop on 1, 2, 16 and 64 instances
    python benchmarks/fleet.py disaggregated   # prefill and decode pools of 1, 4, 16 and 32 instances each
    python benchmarks/fleet.py --requests 50000 cpu   # a quicker look

Every open-loop measurement runs ``benchmarks/fleet.toml`` (vLLM preset, Llama-3.1-8B on an A100-80GB,
``least_outstanding``, 4 requests/s per instance, one process: ``--jobs 1``) in a fresh Python
process and reports its CPU time (``time.process_time``: on a machine shared with other jobs it
is steadier than wall time), the simulation's share of it, events per request and peak RSS.

1. cpu    -- the same per-instance load on 1 and on 64 instances: CPU per request (target: 64
             instances within 1.3x of one).
2. memory -- 100,000 and 400,000 requests on 64 instances, side by side: peak RSS (target: at
             most 1.15x). Both are past the exact-metrics limit, so rows stream to a Parquet file.
3. big    -- 10,000,000 requests over 256 instances: time and peak memory (reported, no target).
4. closed -- ``benchmarks/fleet_closed.toml``: a closed loop of 16 clients per instance (1 s of
             thinking), 20,000 requests on 1, 2, 16 and 64 instances: CPU and events per request.
5. disaggregated -- ``benchmarks/fleet_disaggregated.toml``: prefill and decode pools of 1, 4, 16
             and 32 instances each, 6 requests/s per prefill instance, 8,000 requests: CPU and
             events per request (the instances column counts both pools).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RATE_PER_INSTANCE = 4.0


def child(requests: int, instances: int, kind: int = 0) -> dict:
    """One measurement; ``kind`` 0: the open-loop fleet, 1: the closed loop, 2: disaggregated
    pools of ``instances`` each."""
    from schedlab.study.experiment import load, run_experiment
    from sim_timing import time_simulations

    sim_cpu = time_simulations()
    if kind == 1:
        exp = load(HERE / "fleet_closed.toml", [f"workload.num_requests={requests}", f"cluster.instances={instances}",
                                                f"workload.clients={16 * instances}"])
    elif kind == 2:
        exp = load(HERE / "fleet_disaggregated.toml", [
            f"workload.num_requests={requests}", f"cluster.prefill={{instances = {instances}}}",
            f"cluster.decode={{instances = {instances}}}", f"workload.rate={6.0 * instances}"])
    else:
        exp = load(HERE / "fleet.toml", [f"workload.num_requests={requests}", f"cluster.instances={instances}",
                                         f"workload.rate={RATE_PER_INSTANCE * instances}"])
    started = time.process_time()
    wall = time.perf_counter()
    run = run_experiment(exp).all_runs()[0]
    cpu = time.process_time() - started
    if run.rows_file:
        os.unlink(run.rows_file)
    return {"requests": requests, "instances": instances * (2 if kind == 2 else 1), "cpu_s": cpu, "sim_cpu_s": sum(sim_cpu),
            "wall_s": time.perf_counter() - wall, "events": run.meta["events"],
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "p99_ttft_ms": run.metrics["ttft_ms"]["p99"], "busy_share": run.metrics["busy_share"]}


def measure(requests: int, instances: int, kind: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--child", str(requests), str(instances), str(kind)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SCHEDLAB_NO_PROGRESS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout.strip().split("\n")[-1])


def row(m: dict) -> str:
    n = m["requests"]
    return (f"| {n:,} | {m['instances']} | {m['cpu_s'] * 1e6 / n:.0f} us | {m['sim_cpu_s'] * 1e6 / n:.0f} us | "
            f"{m['events'] / n:.2f} | {m['maxrss_mb']:.0f} MB | {m['cpu_s']:.1f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", help="cpu, memory, big, closed, disaggregated (default: cpu memory)")
    parser.add_argument("--requests", type=int, default=200_000, help="requests of the cpu part")
    parser.add_argument("--repeat", type=int, default=1, help="best of this many (cpu part)")
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    args.parts = args.parts or ["cpu", "memory"]
    unknown = set(args.parts) - {"cpu", "memory", "big", "closed", "disaggregated"}
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from cpu, memory, big, closed, "
                     "disaggregated")
    print("| requests | instances | CPU / request | of which simulation | events / request | peak RSS | CPU |")
    print("|---|---|---|---|---|---|---|")
    if "cpu" in args.parts:
        one = min((measure(args.requests, 1) for _ in range(args.repeat)), key=lambda m: m["cpu_s"])
        print(row(one), flush=True)
        many = min((measure(args.requests, 64) for _ in range(args.repeat)), key=lambda m: m["cpu_s"])
        print(row(many), flush=True)
        print(f"\nCPU per request, 64 instances / 1: {many['cpu_s'] / one['cpu_s']:.2f}x "
              f"(simulation alone {many['sim_cpu_s'] / one['sim_cpu_s']:.2f}x)\n", flush=True)
    if "memory" in args.parts:
        small, large = measure(100_000, 64), measure(400_000, 64)
        print(row(small))
        print(row(large))
        print(f"\npeak RSS, 400,000 / 100,000 requests: {large['maxrss_mb'] / small['maxrss_mb']:.2f}x\n", flush=True)
    if "big" in args.parts:
        print(row(measure(10_000_000, 256)))
    if "closed" in args.parts:
        for instances in (1, 2, 16, 64):
            print(row(measure(20_000, instances, kind=1)), flush=True)
    if "disaggregated" in args.parts:
        for instances in (1, 4, 16, 32):
            print(row(measure(8_000, instances, kind=2)), flush=True)


if __name__ == "__main__":
    main()
