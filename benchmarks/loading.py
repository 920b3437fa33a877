"""Loading request files: the pyarrow, numpy and row-by-row Python readers.

    python benchmarks/loading.py                 # 200k and 2M rows, JSONL and CSV (a few minutes)
    python benchmarks/loading.py --rows 200000   # one size
    python benchmarks/loading.py --readers arrow --repeat 3   # one reader, best of 3
    python benchmarks/loading.py --run 200000    # also a whole `schedlab run` of that many rows
    python benchmarks/loading.py --rows --run 500000 --run-reader numpy   # only a run, numpy reader

Writes request files like a user's (arrival_ms, prompt_tokens, output_tokens, request_class,
client; 120 bytes a row as JSONL) to a temporary folder, then loads each in a fresh process
through the ``file`` workload (read, check, convert: what happens before a run starts) with
each reader (``read_records(reader=...)``: each gives way to the next on what it does not read
exactly; the table says which one read the file) and reports wall time, CPU time (pyarrow's
threads included) and peak memory (max RSS). ``--run N`` also simulates the N-row
JSONL file (Poisson arrivals the server sustains) and reports the whole command's time and
peak memory. Timings are wall clock on whatever machine runs this, never asserted.
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

import numpy as np

HERE = Path(__file__).resolve().parent


def write_requests(path: Path, n: int, seed: int = 0) -> None:
    """``n`` requests as JSONL or CSV (by the extension), written in blocks."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(100.0, n)) - 100.0
    prompt = np.clip(rng.lognormal(np.log(600), 0.8, n), 1, 8000).astype(int)
    output = np.clip(rng.lognormal(np.log(150), 0.9, n), 1, 2000).astype(int)
    klass = np.where(rng.random(n) < 0.7, "chat", "batch")
    client = rng.integers(0, 500, n)
    csv = path.suffix == ".csv"
    with open(path, "w") as fh:
        if csv:
            fh.write("arrival_ms,prompt_tokens,output_tokens,request_class,client\n")
        for lo in range(0, n, 100_000):
            rows = zip(np.maximum(arrival[lo:lo + 100_000], 0).tolist(), prompt[lo:lo + 100_000].tolist(),
                       output[lo:lo + 100_000].tolist(), klass[lo:lo + 100_000].tolist(), client[lo:lo + 100_000].tolist())
            if csv:
                fh.write("".join(f"{a:.3f},{p},{o},{k},user-{c}\n" for a, p, o, k, c in rows))
            else:
                fh.write("".join(f'{{"arrival_ms": {a:.3f}, "prompt_tokens": {p}, "output_tokens": {o}, '
                                 f'"request_class": "{k}", "client": "user-{c}"}}\n' for a, p, o, k, c in rows))


def child_load(path: str, reader: str) -> dict:
    import schedlab_plugins.workloads.request_file as request_file
    from schedlab_plugins.workloads import records

    used = []
    original = records.read_records

    def read_records(*args, **kwargs):
        read = original(*args, **{**kwargs, "reader": reader})
        used.append(read.reader)
        return read

    request_file.read_records = read_records
    started, cpu = time.perf_counter(), time.process_time()
    workload = request_file.make_file_workload(request_file.FileConfig(path=path))
    return {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu,
            "requests": workload.num_requests, "read_by": used[0],
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child_import() -> dict:
    """What importing pyarrow's modules costs a process that has schedlab's workloads loaded."""
    import schedlab_plugins.workloads.records  # noqa: F401

    def rss_mb() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before, started = rss_mb(), time.perf_counter()
    import pyarrow.compute  # noqa: F401
    import pyarrow.csv  # noqa: F401
    import pyarrow.json  # noqa: F401
    return {"wall_s": time.perf_counter() - started, "rss_mb": rss_mb() - before}


def measure(path: Path, reader: str, repeat: int = 1) -> dict:
    """The best of ``repeat`` loads (least wall time), each in a fresh process."""
    runs = []
    for _ in range(repeat):
        cmd = [sys.executable, __file__, "--child", str(path), reader]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().split("\n")[-1]))
    return min(runs, key=lambda r: r["wall_s"])


RUN_TOML = """
[experiment]
name = "loading"
reports = []
timeline = false

[workload]
kind = "file"
path = "{path}"
time_scale = 2.0

[scheduler]
kind = "continuous"
max_num_seqs = 256

[cost_model]
kind = "linear"
decode_ms_per_step = 8.0

[kv_cache]
kind = "paged"
num_blocks = 200000
"""


def run_command(path: Path, folder: Path, reader: str = "arrow") -> dict:
    """``schedlab run`` of the file, its request file read by ``reader`` (as the first to try)."""
    toml = folder / "run.toml"
    toml.write_text(RUN_TOML.format(path=path))
    started = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, __file__, "--cli", reader, "run", str(toml),
                          "--no-plots", "--out", str(folder / "out")], capture_output=True, text=True,
                         env={**os.environ, "SCHEDLAB_NO_PROGRESS": "1"})
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return {"wall_s": time.perf_counter() - started, "maxrss_mb": int(out.stderr.strip().split("\n")[-1]) / 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[200_000, 2_000_000])
    parser.add_argument("--readers", nargs="*", default=["arrow", "numpy", "python"],
                        choices=["arrow", "numpy", "python"], help="readers to measure (default: all three)")
    parser.add_argument("--repeat", type=int, default=1, help="loads per file and reader; the best is shown")
    parser.add_argument("--run", type=int, default=None, help="also simulate a JSONL file of this many rows")
    parser.add_argument("--run-reader", default="arrow", choices=["arrow", "numpy", "python"],
                        help="the reader the --run command starts with (default arrow, as schedlab does)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    if argv is None and sys.argv[1:2] == ["--cli"]:   # schedlab's CLI with another default reader
        from schedlab.cli import main as cli_main
        from schedlab_plugins.workloads import records

        records.read_records.__kwdefaults__["reader"] = sys.argv[2]
        return cli_main(sys.argv[3:])
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child_import() if args.child[0] == "import" else child_load(args.child[0], args.child[1])))
        return 0
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    out = subprocess.run([sys.executable, __file__, "--child", "import", "-"], capture_output=True, text=True, check=True)
    cost = json.loads(out.stdout)
    print(f"importing pyarrow: {cost['wall_s']:.2f} s, {cost['rss_mb']:.0f} MB")
    print("| file | reader | read by | load wall | load CPU | peak RSS |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for n in args.rows:
            for ext in ("jsonl", "csv"):
                path = folder / f"requests_{n}.{ext}"
                write_requests(path, n)
                size = path.stat().st_size / 2**20
                for reader in args.readers:
                    r = measure(path, reader, args.repeat)
                    print(f"| {n:,} rows {ext.upper()} ({size:.0f} MB) | {reader} | {r['read_by']} "
                          f"| {r['wall_s']:.1f} s | {r['cpu_s']:.1f} s | {r['maxrss_mb']:.0f} MB |", flush=True)
                path.unlink()
        if args.run:
            path = folder / f"run_{args.run}.jsonl"
            write_requests(path, args.run)
            r = run_command(path, folder, args.run_reader)
            print(f"\n`schedlab run` of {args.run:,} JSONL rows ({args.run_reader} reader): {r['wall_s']:.1f} s, "
                  f"peak RSS {r['maxrss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
