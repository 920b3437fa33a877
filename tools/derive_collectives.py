"""Derive the collectives' bus bandwidths from measured NCCL timings, and check the model.

    python tools/derive_collectives.py [NETWORK_DIR] [--table] [--write-subset DIR]

Data: Vidur's NCCL timings (../shared/calibration/vidur/profiling/network, MIT; or the subset
shipped in tests/data/nccl/), and NVIDIA aiconfigurator's on a B200 node (:data:`AIC_NCCL`,
Apache-2.0: CUDA-event times, whose small messages are NCCL's own latency, fitted as the
``dgx-b200`` preset's ``base_us`` and ``hop_us`` before its bus bandwidths): all-reduce and send/recv against message size (2 KB - 64 MB,
512 MB on one box), worker count and GPUs per node, on DGX H100 and DGX A100 (NVSwitch; 2 nodes
over the network for the A100) and on 4-GPU boxes with NVLink-bridged pairs (``*_pairwise_nvlink``).
Each row is the median, min and max over 3 repeats of rank 0's NCCL kernel time (kineto).

Small messages measure a floor, not NCCL: the kernel of rank 0 starts and then waits for its
peer, launched from Python up to tens of microseconds apart, so the medians scatter between the
collective's own few microseconds and that skew (7 to 45 us at the same size on DGX H100). The
**measured latency floor** of a series is the longest time measured (any repeat) at 64 KB or
less. A measured point (the median of its repeats) is *explained* by the model when

* the model is within 15% of it, or
* the model's time is below the floor and the point is within 15% of the floor: the
  measurement is the floor (at any size: the floor reaches past 64 KB, up to the size where
  the collective's own time rises above it).

For every series this prints the bus bandwidth (GB/s) that, with NCCL's latency constants, fits
its points above 1.5 x the floor (least squares in log time): quoted in
``plugins/cost_models/collectives.py`` as ``DERIVATION``. On a machine whose preset picks its
protocols as NCCL's tuner does (``nccl_bus_gbps``: the DGX A100), it first fits what those
protocols really do there -- LL128's share of the bus and Simple's latency beyond NCCL's
constants (:func:`fit_protocols`, quoted as ``NCCL_PROTOCOLS_FIT``) -- and the bus bandwidths with them.
It also prints what NCCL's tuner rates a DGX H100's ring and NVLS all-reduce at, from NCCL's own
constants (``H100_NVLS``: from that many GPUs the all-reduce measured is NVLS's, and the preset's
other collectives take the ring's bus bandwidth; nothing here is fitted). With ``--table`` it prints, for every
series, the presets' error against the measured points (the README table) and how many points
the presets explain; ``--write-subset`` writes the small CSV subset the tests recompute it from.
``tools/derive_roofline.py`` calls :func:`main` after its own derivation.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from plugins.cost_models.collectives import (  # noqa: E402
    NCCL_NVLINK_GBPS, NCCL_NVLS_EFFICIENCY, TOPOLOGIES, Collectives, Topology, nccl_nvls_all_reduce_gbps,
    nccl_nvls_ranks, nccl_ring_gbps)

SHARED = next((p / "shared" for p in (REPO.parent, REPO.parent.parent) if (p / "shared").is_dir()),
              REPO.parent / "shared")
NETWORK = SHARED / "calibration" / "vidur" / "profiling" / "network"
SUBSET = REPO / "tests" / "data" / "nccl"
SMALL_BYTES = 64 * 1024
TOLERANCE = 0.15
#: Vidur's folders and the preset that models each (the A40 box is left out: its "NVLink pair"
#: measures 4 GB/s between its two GPUs, so which link it used is unknown).
PRESET_OF = {"h100_dgx": "dgx-h100", "a100_dgx": "dgx-a100", "h100_pairwise_nvlink": "nvlink-pairs-h100",
             "a100_pairwise_nvlink": "nvlink-pairs-a100", "b200_dgx": "dgx-b200"}
#: NVIDIA aiconfigurator's NCCL timings on a B200 node (github.com/ai-dynamo/aiconfigurator,
#: Apache-2.0; ``systems/data/b200_sxm/comm/nccl/2.29.2/nccl_perf.parquet``, all-reduce of fp16
#: buffers on 2, 4 and 8 GPUs, each a CUDA-event time without Vidur's launch skew): the subset
#: shipped, and the folder name its series take here.
AIC_NCCL = REPO / "tests" / "data" / "aiconfigurator" / "nccl_b200.csv"
AIC_FOLDER = "b200_dgx"


def read_series(root: Path) -> dict[tuple, np.ndarray]:
    """``(topology, collective, ranks, gpus per node) -> rows of (bytes, min, median, max)`` in us."""
    series: dict[tuple, list] = {}
    for path in sorted(root.glob("*/*.csv")):
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                coll = row["collective"]
                key = (path.parent.name, coll, int(row["num_workers"]), int(row["devices_per_node"]))
                stats = [float(row[f"time_stats.{coll}.{s}"]) * 1e3 for s in ("min", "median", "max")]
                series.setdefault(key, []).append((float(row["size"]), *stats))
    return {key: np.array(sorted(rows)) for key, rows in series.items()}


def extract_aic_nccl(data: Path) -> None:
    """Write :data:`AIC_NCCL` from an aiconfigurator checkout's ``systems/data`` folder (pyarrow):
    its B200 all-reduces of fp16 buffers (``message_size`` counts elements: 2 bytes each)."""
    import pyarrow.parquet as pq

    rows = [r for r in pq.read_table(data / "b200_sxm" / "comm" / "nccl" / "2.29.2" / "nccl_perf.parquet").to_pylist()
            if r["op_name"] == "all_reduce" and r["nccl_dtype"] == "half"]
    AIC_NCCL.parent.mkdir(parents=True, exist_ok=True)
    with open(AIC_NCCL, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["collective", "num_gpus", "bytes", "latency_us"])
        for r in sorted(rows, key=lambda r: (r["num_gpus"], r["message_size"])):
            w.writerow(["all_reduce", r["num_gpus"], 2 * r["message_size"], f"{r['latency'] * 1e3:.3f}"])


#: vLLM's own tensor-parallel all-reduce, timed by aiconfigurator inside vLLM's graph capture
#: (``tensor_model_parallel_all_reduce``: custom all-reduce, symmetric memory or NCCL, as vLLM
#: picks by size): aiconfigurator's system, vLLM version and the topology preset it ran on
AIC_VLLM = REPO / "tests" / "data" / "aiconfigurator" / "vllm_all_reduce.csv"
VLLM_MACHINES = (("h100_sxm", "0.24.0", "dgx-h100"), ("a100_sxm", "0.14.0", "dgx-a100"),
                 ("b200_sxm", "0.24.0", "dgx-b200"))
VLLM_SIZES = (4096, 2 ** 30)  # bytes: one token of a 2,048-wide model to 1 GB


def extract_aic_vllm(data: Path) -> None:
    """Write :data:`AIC_VLLM` from an aiconfigurator checkout: the graph-captured timings (bf16
    buffers: ``message_size`` elements of 2 bytes) of :data:`VLLM_MACHINES`."""
    import pyarrow.parquet as pq

    with open(AIC_VLLM, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["machine", "vllm", "num_gpus", "bytes", "latency_us"])
        for folder, version, preset in VLLM_MACHINES:
            table = pq.read_table(data / folder / "comm" / "vllm" / version / "custom_allreduce_perf.parquet")
            rows = [r for r in table.to_pylist() if r["backend"] == "vllm_graph"
                    and VLLM_SIZES[0] <= 2 * r["message_size"] <= VLLM_SIZES[1]]
            for r in sorted(rows, key=lambda r: (r["num_gpus"], r["message_size"])):
                w.writerow([preset, version, r["num_gpus"], 2 * r["message_size"], f"{r['latency'] * 1e3:.2f}"])


def read_aic_vllm(path: Path = AIC_VLLM) -> dict[str, dict[int, tuple]]:
    """``machine -> ranks -> ((bytes, us), ...)``: :data:`AIC_VLLM` as ``MEASURED_US`` holds it."""
    table: dict[str, dict[int, list]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            table.setdefault(row["machine"], {}).setdefault(int(row["num_gpus"]), []).append(
                (int(row["bytes"]), float(row["latency_us"])))
    return {m: {n: tuple(sorted(points)) for n, points in by.items()} for m, by in table.items()}


#: aiconfigurator's nccl-tests timings on H100 and A100 nodes (nccl-tests' byte counts, fp16):
#: a check of the presets fitted to Vidur's timings on measurements they were not fitted to
AIC_HELD_OUT = REPO / "tests" / "data" / "aiconfigurator" / "nccl_held_out.csv"
HELD_OUT_MACHINES = (("h100_sxm", "2.29.2", "dgx-h100"), ("a100_sxm", "2.27.3", "dgx-a100"))
#: aiconfigurator's collective names -> :class:`Collectives`' methods
HELD_OUT_COLLECTIVES = {"all_reduce": "all_reduce_ms", "all_gather": "all_gather_ms",
                        "reduce_scatter": "reduce_scatter_ms", "alltoall": "all_to_all_ms"}


def extract_aic_held_out(data: Path) -> None:
    """Write :data:`AIC_HELD_OUT` from an aiconfigurator checkout (pyarrow)."""
    import pyarrow.parquet as pq

    with open(AIC_HELD_OUT, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["machine", "nccl", "collective", "num_gpus", "bytes", "latency_us"])
        for folder, version, preset in HELD_OUT_MACHINES:
            rows = [r for r in pq.read_table(data / folder / "comm" / "nccl" / version / "nccl_perf.parquet")
                    .to_pylist() if r["nccl_dtype"] == "half"]
            for r in sorted(rows, key=lambda r: (r["op_name"], r["num_gpus"], r["message_size"])):
                w.writerow([preset, version, r["op_name"], r["num_gpus"], 2 * r["message_size"],
                            f"{r['latency'] * 1e3:.3f}"])


def held_out_check(path: Path = AIC_HELD_OUT) -> list[dict]:
    """Per machine, collective and rank count: the preset against the held-out timings above
    64 KB (points, within 15%, median and worst error) and the largest time at 64 KB or less,
    model and measured (no launch skew here: NCCL's own latency)."""
    series: dict[tuple, list] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            key = (row["machine"], row["collective"], int(row["num_gpus"]))
            series.setdefault(key, []).append((float(row["bytes"]), float(row["latency_us"])))
    out = []
    for (preset, coll, ranks), points in sorted(series.items()):
        rows = np.array(sorted(points))
        time = getattr(Collectives(TOPOLOGIES[preset], ranks), HELD_OUT_COLLECTIVES[coll])
        model = np.array([time(b) * 1e3 for b in rows[:, 0]])
        err, big = model / rows[:, 1] - 1.0, rows[:, 0] > SMALL_BYTES
        out.append({"machine": preset, "collective": coll, "ranks": ranks, "points": int(big.sum()),
                    "within": int((np.abs(err[big]) <= TOLERANCE).sum()),
                    "median_pct": float(100 * np.median(np.abs(err[big]))),
                    "worst_pct": (float(100 * err[big].min()), float(100 * err[big].max())),
                    "small_us": (float(model[~big].max()), float(rows[~big, 1].max()))})
    return out


def held_out_markdown(rows: list[dict]) -> str:
    lines = ["| machine | collective | GPUs | points > 64 KB | within 15% | median / worst error "
             "| <= 64 KB: model / measured |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['machine']}` | {r['collective']} | {r['ranks']} | {r['points']} | {r['within']} | "
                     f"{r['median_pct']:.1f}% / {r['worst_pct'][0]:+.0f}..{r['worst_pct'][1]:+.0f}% | "
                     f"{r['small_us'][0]:.0f} / {r['small_us'][1]:.0f} us |")
    return "\n".join(lines)


def read_aic_series(path: Path = AIC_NCCL) -> dict[tuple, np.ndarray]:
    """aiconfigurator's series as :func:`read_series` gives Vidur's: one timing per point (its
    min, median and max alike), under :data:`AIC_FOLDER`."""
    series: dict[tuple, list] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            n, us = int(row["num_gpus"]), float(row["latency_us"])
            series.setdefault((AIC_FOLDER, row["collective"], n, n), []).append((float(row["bytes"]), us, us, us))
    return {key: np.array(sorted(rows)) for key, rows in series.items()}


def fit_latency(series: dict[tuple, np.ndarray], folder: str = AIC_FOLDER) -> dict:
    """``base_us`` and ``hop_us`` of a machine whose small all-reduces are NCCL's own time (no
    launch skew): the median time at 64 KB or less of each rank count ``n`` taken as ``base +
    2 (n - 1) x hop`` (a ring's steps; least squares)."""
    points = [(n, float(np.median(rows[rows[:, 0] <= SMALL_BYTES, 2])))
              for (f, coll, n, _), rows in series.items() if f == folder and coll == "all_reduce"]
    a = np.array([[1.0, 2.0 * (n - 1)] for n, _ in points])
    (base, hop), *_ = np.linalg.lstsq(a, np.array([us for _, us in points]), rcond=None)
    return {"base_us": round(float(base), 1), "hop_us": round(float(hop), 2)}


def model_us(topology: Topology, collective: str, ranks: int, per_node: int, sizes) -> np.ndarray:
    coll = Collectives(topology, ranks, per_node)
    time = coll.all_reduce_ms if collective == "all_reduce" else coll.send_recv_ms
    return np.array([time(s) for s in sizes]) * 1e3


def series_topology(key: tuple, bus_gbps: float, protocols: dict | None = None) -> Topology:
    """One link at ``bus_gbps`` for the series ``key`` (its preset's links and protocols,
    bandwidth -- and ``protocols``' ``ll128_share``, ``simple_extra_us`` and
    ``simple_extra_hop_us``, if given -- replaced)."""
    folder, _, ranks, per_node = key
    preset = TOPOLOGIES[PRESET_OF[folder]]
    nodes = ranks // per_node
    if nodes > 1:
        return Topology("fit", link=preset.link, bus_gbps=1e6, gpus_per_node=per_node, network_gbps=bus_gbps)
    link = preset.cross_island_link if per_node > preset.island_size else preset.link
    nccl = {} if per_node > preset.island_size else {
        "nccl_bus_gbps": preset.nccl_bus_gbps, "nccl_ll_max_gbps": preset.nccl_ll_max_gbps,
        "ll128_share": preset.ll128_share, "simple_extra_us": preset.simple_extra_us,
        "simple_extra_hop_us": preset.simple_extra_hop_us, **(protocols or {})}
    return Topology("fit", link=link, bus_gbps=bus_gbps, gpus_per_node=per_node, base_us=preset.base_us,
                    hop_us=preset.hop_us, **nccl)


def floor_us(rows: np.ndarray) -> float:
    """The measured latency floor: the longest time measured at 64 KB or less."""
    return float(rows[rows[:, 0] <= SMALL_BYTES, 3].max())


def explained(rows: np.ndarray, model: np.ndarray) -> np.ndarray:
    """Which points the model explains (see the module docstring)."""
    floor = floor_us(rows)
    median = rows[:, 2]
    close = np.abs(model / median - 1.0) <= TOLERANCE
    in_floor = (model <= floor) & (median <= (1.0 + TOLERANCE) * floor)
    return close | in_floor


def fit_bus_gbps(key: tuple, rows: np.ndarray) -> float:
    """The bus bandwidth that fits the points above 1.5 x the floor (log least squares)."""
    fit = rows[rows[:, 2] > 1.5 * floor_us(rows)]
    if len(fit) < 5:
        return float("nan")
    best = None
    for gbps in np.exp(np.linspace(math.log(1.0), math.log(1000.0), 700)):
        model = model_us(series_topology(key, gbps), key[1], key[2], key[3], fit[:, 0])
        err = float(np.sum(np.log(model / fit[:, 2]) ** 2))
        if best is None or err < best[0]:
            best = (err, gbps)
    return round(best[1])


def fit_protocols(series: dict[tuple, np.ndarray], folder: str) -> dict:
    """What the protocols NCCL's tuner picks really do on a machine whose preset picks them so
    (``nccl_bus_gbps``): LL128's share of the bus bandwidth and Simple's latency beyond NCCL's
    constants (a fixed cost and a cost per ring step, the shape of NCCL's own latency model),
    fitted together (Nelder-Mead; rounded to 0.01, 0.1 us and 0.01 us) to its in-node all-reduce
    series, each at its own best bus bandwidth (bounded search in log bandwidth), on their points
    above 1.5 x the floor (sum of squared log errors)."""
    from scipy.optimize import minimize, minimize_scalar

    keys = [k for k in sorted(series) if k[0] == folder and k[1] == "all_reduce" and k[2] == k[3]]
    fits = [(k, series[k][series[k][:, 2] > 1.5 * floor_us(series[k])]) for k in keys]

    def error(x) -> float:
        fit = {"ll128_share": float(np.clip(x[0], 0.05, 1.0)), "simple_extra_us": float(max(x[1], 0.0)),
               "simple_extra_hop_us": float(max(x[2], 0.0))}
        total = 0.0
        for key, rows in fits:
            def err(log_gbps: float) -> float:
                topo = series_topology(key, math.exp(log_gbps), fit)
                return float(np.sum(np.log(model_us(topo, *key[1:], rows[:, 0]) / rows[:, 2]) ** 2))
            total += minimize_scalar(err, bounds=(math.log(10.0), math.log(1000.0)), method="bounded",
                                     options={"xatol": 1e-4}).fun
        return total

    best = minimize(error, x0=[0.92, 0.0, 0.0], method="Nelder-Mead",
                    options={"initial_simplex": [[0.92, 0.0, 0.0], [0.7, 0.0, 0.0], [0.92, 20.0, 0.0],
                                                 [0.92, 0.0, 2.0]], "xatol": 0.002, "fatol": 1e-4})
    return {"ll128_share": round(float(best.x[0]), 2), "simple_extra_us": round(float(max(best.x[1], 0.0)), 1),
            "simple_extra_hop_us": round(float(max(best.x[2], 0.0)), 2)}


def preset_errors(key: tuple, rows: np.ndarray) -> dict:
    """The preset's model against one series: errors above the floor, points explained."""
    model = model_us(TOPOLOGIES[PRESET_OF[key[0]]], key[1], key[2], key[3], rows[:, 0])
    ok = explained(rows, model)
    floor = floor_us(rows)
    above = rows[:, 2] > (1.0 + TOLERANCE) * floor
    err = model / rows[:, 2] - 1.0
    big = rows[:, 0] > SMALL_BYTES
    return {"points": int(len(rows)), "explained": int(ok.sum()), "floor_us": round(floor, 1),
            "model_small_us": round(float(model[rows[:, 0] <= SMALL_BYTES].max()), 1),
            "worst_above_floor_pct": (round(float(100 * err[above & big].min()), 1),
                                      round(float(100 * err[above & big].max()), 1)) if (above & big).any() else None,
            "median_abs_above_floor_pct": round(float(100 * np.median(np.abs(err[above & big]))), 1)
            if (above & big).any() else None}


def write_subset(series: dict, out: Path, per_series: int = 48) -> None:
    """Every small-message row (they set the floor) and ``per_series`` log-spaced larger ones."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "vidur_nccl_subset.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["topology", "collective", "num_workers", "devices_per_node", "size", "min_us", "median_us",
                    "max_us"])
        for key, rows in sorted(series.items()):
            if key[0] not in PRESET_OF or key[0] == AIC_FOLDER:
                continue
            small = rows[rows[:, 0] <= SMALL_BYTES]
            large = rows[rows[:, 0] > SMALL_BYTES]
            pick = np.unique(np.searchsorted(large[:, 0], np.geomspace(large[0, 0], large[-1, 0], per_series)))
            for r in np.vstack([small, large[np.minimum(pick, len(large) - 1)]]):
                w.writerow([*key, int(r[0]), *(f"{v:.3f}" for v in r[1:])])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="derive_collectives.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("network", nargs="?", type=Path, default=NETWORK, help="Vidur's profiling/network folder")
    parser.add_argument("--table", action="store_true", help="the presets against every measured series")
    parser.add_argument("--write-subset", type=Path, metavar="DIR", help="write the tests' CSV subset there")
    parser.add_argument("--aiconfigurator", type=Path, metavar="DIR",
                        help="aiconfigurator's systems/data folder: write its B200 subset again from it")
    args = parser.parse_args(argv)
    if args.aiconfigurator:
        extract_aic_nccl(args.aiconfigurator)
        extract_aic_vllm(args.aiconfigurator)
        extract_aic_held_out(args.aiconfigurator)
        print(f"wrote {AIC_NCCL.relative_to(REPO)}, {AIC_VLLM.relative_to(REPO)} and "
              f"{AIC_HELD_OUT.relative_to(REPO)}")
    series = {**read_series(args.network), **read_aic_series()}
    print(f"B200 latency fitted to aiconfigurator's small all-reduces (B200_LATENCY): {fit_latency(series)}")
    h100 = 18 * NCCL_NVLINK_GBPS["hopper"]
    nvls = {n: round(nccl_nvls_all_reduce_gbps(n, h100, NCCL_NVLS_EFFICIENCY["hopper"]), 1) for n in range(2, 9)}
    print(f"NCCL's tuner on a DGX H100 (18 x {NCCL_NVLINK_GBPS['hopper']} GB/s): ring {nccl_ring_gbps(h100):g} GB/s, "
          f"NVLS all-reduce by GPUs {nvls}: NVLS from {nccl_nvls_ranks(h100, NCCL_NVLS_EFFICIENCY['hopper'])} GPUs "
          f"(H100_NVLS)")
    for folder, preset in PRESET_OF.items():
        if TOPOLOGIES[preset].nccl_bus_gbps is not None and any(k[0] == folder for k in series):
            print(f"Protocols where NCCL's tuner picks them, {folder} (NCCL_PROTOCOLS_FIT): "
                  f"{fit_protocols(series, folder)}")
    print("Bus bandwidth fitted per series (GB/s; NCCL's latency constants, the B200's fitted):")
    for key, rows in sorted(series.items()):
        if key[0] in PRESET_OF:
            print(f"  {key}: {fit_bus_gbps(key, rows)}")
    if args.table:
        print("\n| machine (Vidur folder) | collective | GPUs per node x nodes | points | explained | floor "
              "| model <= 64 KB | median / worst error above the floor |")
        print("|---|---|---|---|---|---|---|---|")
        for key, rows in sorted(series.items()):
            if key[0] not in PRESET_OF:
                continue
            e = preset_errors(key, rows)
            worst = e["worst_above_floor_pct"]
            spread = f"{e['median_abs_above_floor_pct']:.1f}% / {worst[0]:+.1f}..{worst[1]:+.1f}%" if worst else "-"
            print(f"| `{PRESET_OF[key[0]]}` ({key[0]}) | {key[1]} | {key[3]} x {key[2] // key[3]} | {e['points']} "
                  f"| {e['explained']} | {e['floor_us']:.0f} us | {e['model_small_us']:.0f} us | {spread} |")
        print("\nHeld out: the presets against aiconfigurator's nccl-tests timings on H100 and A100 nodes:\n")
        print(held_out_markdown(held_out_check()))
    if args.write_subset:
        write_subset(series, args.write_subset)
        print(f"\nwrote {args.write_subset / 'vidur_nccl_subset.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
