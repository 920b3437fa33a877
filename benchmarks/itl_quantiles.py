"""Inter-token-latency percentiles from runs of ITLs: CPU time against the number of runs.

    python benchmarks/itl_quantiles.py [--runs 600000] [--repeat 3]

A run keeps its inter-token latencies as arithmetic runs (``first + j x inc``, ``count`` of
them, ``weight`` times: a bulk decode run of the fast engine is one), so its percentiles are
order statistics found by bisection on the value (``schedlab.results.metrics.run_quantiles``).
This times p50/p90/p95/p99 over ``--runs`` random runs (chat-like: 5-60 ms, growing by up to
0.05 ms a token, 1-200 tokens each) and prints the best CPU time of ``--repeat`` and how many
runs were counted per run and order statistic (each bisection step counts only the runs that
straddle its bracket).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from schedlab.results import metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=600_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    n = args.runs
    first, inc = rng.uniform(5, 60, n), rng.uniform(0, 0.05, n)
    count, weight = rng.integers(1, 200, n), np.ones(n, dtype=np.int64)
    best = float("inf")
    for _ in range(args.repeat):
        started = time.process_time()
        result = metrics.run_quantiles(first, inc, count, weight)
        best = min(best, time.process_time() - started)
    counted = []
    real = metrics.counts_at_most
    metrics.counts_at_most = lambda f, d, c, w, v: counted.append(f.size * np.size(v)) or real(f, d, c, w, v)
    try:
        metrics.run_quantiles(first, inc, count, weight)
    finally:
        metrics.counts_at_most = real
    statistics = 8  # the two samples around each of the four percentiles
    print(f"{n:,} runs ({int(count.sum()):,} ITLs): {best:.2f} s CPU (best of {args.repeat}); "
          f"{sum(counted) / n / statistics:.1f} runs counted per run and order statistic; "
          f"p50 {result['p50']:.3f} ms, p99 {result['p99']:.3f} ms")


if __name__ == "__main__":
    main()
