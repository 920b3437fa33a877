"""Does the hunt beat random sampling? The three shipped hunts against 1,000 random workloads each.

    python benchmarks/hunt_vs_random.py [--random 1000] [--jobs N] [FILE ...]

For each hunt file (default: experiments/hunt/*.toml) this runs ``schedlab hunt`` with its
default budget and ``hunt.random`` random workloads drawn from the same bounds, then replays
the shrunk counterexample with ``schedlab run``'s machinery. It prints one row per file: the
worst value random sampling found, the search's worst, the shrunk counterexample's value and
size, the replayed value, and whether the counterexample beats random sampling's best.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shipped = sorted(str(p) for p in (ROOT / "experiments" / "hunt").glob("*.toml"))
    parser.add_argument("files", nargs="*", default=shipped)
    parser.add_argument("--random", type=int, default=1000, help="random workloads per file")
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("SCHEDLAB_NO_PROGRESS", "1")
    from schedlab.hunt.hunt import hunt_on, load_hunt, replay_value
    from schedlab.hunt.report import write_outcome

    print(f"{'file':<32} {'random best':>12} {'search':>10} {'shrunk':>10} {'requests':>8} {'replayed':>10} "
          f"{'beats':>6} {'wall s':>7}")
    ok = True
    for path in args.files:
        started = time.perf_counter()
        hunt = load_hunt(path, [f"hunt.random={args.random}"])
        outcome = hunt_on(hunt, jobs=args.jobs)
        goal = hunt.goal
        random_best = outcome.random_best.score.value
        with tempfile.TemporaryDirectory() as tmp:
            write_outcome(hunt, outcome, Path(tmp))
            replayed = replay_value(Path(tmp) / "counterexample.toml", goal)
        value = outcome.shrunk_score.value
        beats = goal.direction * value > goal.direction * random_best and replayed == value
        ok &= beats
        searched = outcome.search_best.score.value if outcome.search_best is not None else float("nan")
        print(f"{Path(path).name:<32} {random_best:>12.4g} {searched:>10.4g} {value:>10.4g} "
              f"{len(outcome.shrunk.rows):>8} {replayed:>10.4g} {'yes' if beats else 'NO':>6} "
              f"{time.perf_counter() - started:>7.0f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
