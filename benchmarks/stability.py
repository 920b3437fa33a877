"""How often the saturation check flags simulated M/M/1 queues, by load and run length.

    python benchmarks/stability.py              # 200 seeds per cell (about a minute)
    python benchmarks/stability.py --seeds 50

Each cell simulates FCFS single-server queues with Poisson arrivals (rate 1) and exponential
service times (mean = load), or gamma gaps with cv 3 for bursty arrivals, through the
Lindley recursion, and reports the share of seeds whose verdict is ``unstable`` (and, in
brackets, ``inconclusive``). The figures in :mod:`schedlab.results.stability` and the README come from
this script.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from schedlab.results.stability import queue_stability

LOADS = (0.8, 0.9, 0.95, 1.05, 1.2, 1.5)
SIZES = (100, 300, 1000, 3000)


def fcfs_queue(n: int, load: float, seed: int, cv: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(arrival, start, finish)`` of one M/M/1 (or G/M/1 with gamma gaps of ``cv``) run, in ms."""
    rng = np.random.default_rng(seed)
    shape = 1.0 / (cv * cv)
    gaps = rng.standard_exponential(n) if cv == 1.0 else rng.gamma(shape, 1.0 / shape, n)
    arrival = np.cumsum(gaps) - gaps[0]
    service = rng.exponential(load, n)
    start, finish = np.empty(n), np.empty(n)
    free = 0.0
    for i, (a, s) in enumerate(zip(arrival.tolist(), service.tolist())):
        free = start[i] = max(a, free)
        free = finish[i] = free + s
    return arrival * 1000.0, start * 1000.0, finish * 1000.0


def flagged(n: int, load: float, seeds: int, cv: float = 1.0) -> tuple[float, float]:
    verdicts = [queue_stability(*fcfs_queue(n, load, seed, cv))["verdict"] for seed in range(seeds)]
    return verdicts.count("unstable") / seeds, verdicts.count("inconclusive") / seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args(argv)
    for cv, title in ((1.0, "Poisson arrivals"), (3.0, "gamma gaps, cv 3")):
        print(f"\n{title}: share of runs flagged unstable (inconclusive), {args.seeds} seeds\n")
        print("| load | " + " | ".join(f"{n:,} arrivals" for n in SIZES) + " |")
        print("|---|" + "---|" * len(SIZES))
        for load in LOADS:
            cells = [flagged(n, load, args.seeds, cv) for n in SIZES]
            print(f"| {load} | " + " | ".join(f"{u:.0%} ({i:.0%})" for u, i in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
