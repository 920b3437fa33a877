"""Parallel studies: a 32-point sweep with --jobs 1, --jobs 2 and on a local Ray instance.

    python benchmarks/parallel.py            # best of 3 each, taking turns; prints a Markdown table
    python benchmarks/parallel.py --repeat 1 --no-ray

Each measurement is a fresh ``schedlab run benchmarks/sweep32.toml`` process writing its
results (the ``json`` report: summary.json, summary.csv, requests.csv, ...). Reported: the
whole command's wall time, the study's (simulations, from timings.json), the speed-up over
--jobs 1, and whether summary.json is byte-identical to the --jobs 1 one. The Ray run starts a
local Ray instance with this machine's CPUs inside the command, and that start is part of its
command time. The machine's load average is printed before and after: other processes on a
shared machine slow the parallel runs more than the serial one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SWEEP = HERE / "sweep32.toml"


def schedlab_run(args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "schedlab.cli", "run", str(SWEEP), "--out", str(out), *args]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SCHEDLAB_NO_PROGRESS": "1"})
    command_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{done.stderr}")
    timings = json.loads((out / "timings.json").read_text())["execution"]
    return {"command_s": command_s, "study_s": timings["wall_s"], "executor": timings["executor"],
            "summary": (out / "summary.json").read_bytes()}


def interleaved(settings: list[tuple[str, list[str]]], repeat: int, folder: Path) -> dict[str, dict]:
    """Each setting ``repeat`` times, taking turns (so a busy spell on a shared machine hits
    every setting alike); the fastest command of each counts."""
    runs: dict[str, list] = {name: [] for name, _ in settings}
    for i in range(repeat):
        for name, args in settings:
            runs[name].append(schedlab_run(args, folder / f"{name}-{i}".replace(" ", "")))
    for name, rs in runs.items():
        assert len({r["summary"] for r in rs}) == 1, f"{name}: summary.json differs between repeats"
    return {name: min(rs, key=lambda r: r["command_s"]) for name, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each setting (the best counts)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray run")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    rows = []
    settings = [("--jobs 1", ["--jobs", "1"]), ("--jobs 2", ["--jobs", "2"])]
    if not args.no_ray:
        settings.append(("--backend ray", ["--backend", "ray"]))
    with tempfile.TemporaryDirectory() as tmp:
        best = interleaved(settings, args.repeat, Path(tmp))
        one = best["--jobs 1"]
        for name, r in best.items():
            rows.append((name, r["executor"], f"{r['command_s']:.1f} s", f"{r['study_s']:.1f} s",
                         f"{one['command_s'] / r['command_s']:.2f}x", f"{one['study_s'] / r['study_s']:.2f}x",
                         "yes" if r["summary"] == one["summary"] else "NO"))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    header = ("setting", "where", "command", "simulations", "speed-up (command)", "speed-up (simulations)",
              "summary.json identical to --jobs 1")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
