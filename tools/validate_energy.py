"""The power models against measured power: the README's Energy validation.

    python tools/validate_energy.py [--figure docs/energy_validation.png]

Two measured sets, shipped in experiments/data/energy (tools/energy_data.py):

1. LLMServingSim 2.0's RTX A6000 traces (vLLM 0.11.1, Llama-3.1-8B, TP 1 and 2, three pulses of
   ten ShareGPT requests 60 s apart): schedlab replays the pulses (roofline cost model on the
   ``rtx-a6000`` preset, vLLM V1's scheduler settings; the answers as long as the vLLM log
   says they were, :func:`energy_data.pulse_requests`) with the utilisation power model, and
   the power over time is read the way nvidia-smi reads it -- averaged over the second before
   each sample -- at the trace's sample times, shifted by one offset that best lines the two up
   (the clocks are not shared). Means over each pulse (samples with utilisation > 0) and each
   idle gap, and the energy of the whole trace, against nvidia-smi. The run is also timed with
   the cost model's ``overhead_ms`` set to what the vLLM log's measured step time leaves over
   the roofline's (vLLM ran eagerly: CPU launch overhead), to separate the power model's error
   from the cost model's. LLMServingSim's own fixed-active model, with its fitted coefficients,
   goes through the same replay for comparison.
2. ML.ENERGY v2's batch sweeps (vLLM 0.5.4 at saturation, A100-SXM4-40GB and H100): per point
   the power model's average power per GPU and energy per output token over the point's steady
   cycle, its measured cycle time as the duration (see energy_data), per sweep the mean and the
   largest error. The Llama-3.1-8B sweeps are the fit's training set; every other sweep is held out.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import energy_data as ed  # noqa: E402

from schedlab.energy.timeline import power_steps  # noqa: E402
from schedlab.protocols import Batch  # noqa: E402
from schedlab_plugins.power.utilisation import DERIVATION  # noqa: E402

SENSOR_WINDOW_S = 1.0  # nvidia-smi's power.draw: the average over the last second (Ampere and later)


# --- the A6000 pulses ---------------------------------------------------------------------------

def pulse_experiment(tp: int, requests: Path, overhead_ms: float = 0.0, power: dict | None = None) -> str:
    """The replay of the pulse workload (a CSV of requests) as an experiment file's text."""
    power = power or {"kind": "utilisation"}
    table = ", ".join(f"{k} = {v!r}".replace("'", '"') for k, v in power.items())
    return f"""
[experiment]
name = "a6000_pulse_tp{tp}"
reports = []

[workload]
kind = "file"
path = "{requests}"

[scheduler]
kind = "continuous"
max_num_seqs = 256
max_num_batched_tokens = 2048
chunked_prefill = true

[cost_model]
kind = "roofline"
model = "llama-3.1-8b"
gpu = "rtx-a6000"
tensor_parallel = {tp}
overhead_ms = {overhead_ms}

[kv_cache]
kind = "paged"
model = "llama-3.1-8b"
gpu = "rtx-a6000"
tensor_parallel = {tp}

[power]
{table.replace(", ", chr(10))}
"""


def replay(tp: int, overhead_ms: float = 0.0, power: dict | None = None, tmp: Path | None = None):
    import tempfile

    from schedlab.study.experiment import load, run_experiment

    folder = Path(tmp or tempfile.mkdtemp())
    requests = folder / f"pulse_tp{tp}.csv"
    requests.write_text("arrival_ms,prompt_tokens,output_tokens\n" + "".join(
        f"{r['arrival_ms']},{r['prompt_tokens']},{r['output_tokens']}\n" for r in ed.pulse_requests(tp)))
    path = folder / f"pulse_tp{tp}.toml"
    path.write_text(pulse_experiment(tp, requests, overhead_ms, power))
    return run_experiment(load(path)).all_runs()[0]


def step_overhead_ms(tp: int) -> float:
    """What the vLLM log's measured decode step leaves over the roofline's: the median over its
    decode seconds of ``1 / steps per second - roofline step``."""
    from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel

    p = ed.presets()
    cost = RooflineCostModel(p.model("llama-3.1-8b"), p.gpu("rtx-a6000"),
                             RooflineConfig(model="llama-3.1-8b", gpu="rtx-a6000", tensor_parallel=tp))
    gaps = []
    for s in ed.decode_seconds(tp):
        n = max(1, round(s["running"]))
        gaps.append(1e3 / s["steps_per_s"] - cost.iteration_ms(Batch(num_decode=n, decode_context_tokens=n * 400)))
    return max(0.0, float(np.median(gaps)))


def sensor(run, gpus: int, times_s: np.ndarray) -> np.ndarray:
    """The run's power per GPU as nvidia-smi would read it at ``times_s`` (run time): the mean
    over the preceding second, the GPUs idle before the run and idling after it."""
    inst = run.meta["energy"]["instances"][0]
    edges, watts = power_steps(run, 0, until=float(times_s.max()) * 1e3 + inst["standby_ms"] + 1e3)
    edges = np.concatenate(([-1e12], edges, [1e13]))
    watts = np.concatenate(([inst["idle_w"]], watts, [inst["idle_w"]])) / gpus
    cumulative = np.concatenate(([0.0], np.cumsum(np.diff(edges) * watts)))

    def energy_until(t_ms):
        i = np.clip(np.searchsorted(edges, t_ms, side="right") - 1, 0, watts.size - 1)
        return cumulative[i] + (t_ms - edges[i]) * watts[i]

    t = times_s * 1e3
    return (energy_until(t) - energy_until(t - SENSOR_WINDOW_S * 1e3)) / (SENSOR_WINDOW_S * 1e3)


def align(run, gpus: int, trace: dict) -> float:
    """The offset (s) from the trace's time to the run's that best lines the power up."""
    t, measured = np.asarray(trace["t_s"]), np.asarray(trace["power_w"])
    best = None
    for shift in np.arange(-40.0, 40.0, 0.02):
        err = float(np.sum((sensor(run, gpus, t + shift) - measured) ** 2))
        if best is None or err < best[0]:
            best = (err, shift)
    return float(best[1])


def windows(trace: dict) -> list[tuple[str, int, int]]:
    """``(label, first, last sample)``: each pulse (utilisation > 0) and the stretches around them."""
    busy = np.asarray(trace["util_pct"]) > 0
    out = []
    edges = np.flatnonzero(np.diff(busy.astype(int))) + 1
    bounds = [0, *edges.tolist(), busy.size]
    pulse = 0
    for a, b in zip(bounds, bounds[1:]):
        if busy[a]:
            pulse += 1
            out.append((f"pulse {pulse}", a, b - 1))
        else:
            out.append(("before" if a == 0 else f"after pulse {pulse}", a, b - 1))
    return out


def pulse_report(tp: int, run, trace: dict) -> dict:
    gpus = tp
    shift = align(run, gpus, trace)
    t = np.asarray(trace["t_s"])
    measured = np.asarray(trace["power_w"])
    model = sensor(run, gpus, t + shift)
    rows = []
    for label, a, b in windows(trace):
        m, p = float(measured[a:b + 1].mean()), float(model[a:b + 1].mean())
        rows.append({"window": label, "seconds": t[b] - t[a], "measured_w": m, "model_w": p, "error": p / m - 1})
    dt = np.diff(t)
    total_m = float(np.sum(measured[1:] * dt))  # each sample stands for the interval before it
    total_p = float(np.sum(model[1:] * dt))
    return {"shift_s": shift, "windows": rows, "measured_j": total_m, "model_j": total_p,
            "energy_error": total_p / total_m - 1, "model": model, "t": t, "measured": measured}


LLMSERVINGSIM_A6000 = {"kind": "fixed_active", "active_w": 300.0, "standby_w": 89.0, "idle_w": 33.0,
                       "standby_s": 18.0}  # its power_config_tp*.json


def pulses(tmp: Path | None = None, kind: str = "utilisation") -> dict:
    out = {}
    for tp in (1, 2):
        trace = ed.trace(tp)
        overhead = step_overhead_ms(tp)
        out[tp] = {"overhead_ms": overhead,
                   "default": pulse_report(tp, replay(tp, power={"kind": kind}, tmp=tmp), trace),
                   "timed": pulse_report(tp, replay(tp, overhead, {"kind": kind}, tmp=tmp), trace),
                   "llmservingsim": pulse_report(tp, replay(tp, overhead, LLMSERVINGSIM_A6000, tmp=tmp), trace)}
    return out


# --- ML.ENERGY sweeps ---------------------------------------------------------------------------

def sweeps(kind: str = "utilisation") -> dict[str, list[dict]]:
    """Per sweep, its points with the model's power and energy per token beside the measured.

    ``fitting_awake``: the awake share that would make the model match the point, its
    activity kept -- ``awake + (measured - model) / (board - idle)``, exact while no iteration
    of the cycle reaches the board limit (none does: vLLM 0.5.4's cycles are mostly host time).
    It tells an error in the level a waiting GPU draws from one in the work's energy."""
    from schedlab_plugins.power.common import board_and_idle
    from schedlab_plugins.power.fixed_active import FixedActiveConfig, build_fixed_active
    from schedlab_plugins.power.utilisation import UtilisationConfig, build_utilisation

    presets = ed.presets()
    config = UtilisationConfig()
    utilisation = lambda cost: build_utilisation(config, presets, cost)  # noqa: E731
    if kind == "additive":  # (its fitting_awake below is then only indicative: the shares differ)
        from schedlab_plugins.power.additive import AdditiveConfig, build_additive

        utilisation = lambda cost: build_additive(AdditiveConfig(), presets, cost)  # noqa: E731
    fixed = lambda cost: build_fixed_active(FixedActiveConfig(), presets, cost)  # noqa: E731
    out = defaultdict(list)
    for p in ed.sweep_points():
        power, jpt = ed.predict_point(p, utilisation, presets)
        fixed_power, _ = ed.predict_point(p, fixed, presets)
        board, idle, _ = board_and_idle(presets.gpu(p["gpu"]), None, None, "utilisation")
        out[p["sweep"]].append({**p, "model_w": power, "model_jpt": jpt, "fixed_w": fixed_power,
                                "power_error": power / p["power_w"] - 1, "jpt_error": jpt / p["j_per_token"] - 1,
                                "fitting_awake": config.awake + (p["power_w"] - power) / (board - idle),
                                "training": p["model"] == ed.TRAINING_MODEL})
    return dict(out)


def sweep_summary(points: list[dict]) -> dict:
    pe = np.array([p["power_error"] for p in points])
    return {"points": len(points), "power_mean": float(np.mean(np.abs(pe))), "power_max": float(np.max(np.abs(pe))),
            "fixed_mean": float(np.mean([abs(p["fixed_w"] / p["power_w"] - 1) for p in points])),
            "fitting_awake": float(np.median([p["fitting_awake"] for p in points])),
            "training": points[0]["training"]}


# --- output -------------------------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def markdown(pulse: dict, sweep: dict, kind: str = "utilisation") -> str:
    lines = [f"A6000 pulses, per GPU (W); model = {kind}, roofline timing with the step overhead the "
             "vLLM log shows (default roofline timing and LLMServingSim's fixed-active model beside):", "",
             "| TP | window | s | nvidia-smi | model | error | default timing | LLMServingSim |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for tp, r in pulse.items():
        for w, d, s in zip(r["timed"]["windows"], r["default"]["windows"], r["llmservingsim"]["windows"]):
            lines.append(f"| {tp} | {w['window']} | {w['seconds']:.0f} | {w['measured_w']:.1f} | {w['model_w']:.1f} "
                         f"| {pct(w['error'])} | {pct(d['error'])} | {pct(s['error'])} |")
        lines.append(f"| {tp} | **energy** | | {r['timed']['measured_j'] / 1e3:.2f} kJ | "
                     f"{r['timed']['model_j'] / 1e3:.2f} kJ | {pct(r['timed']['energy_error'])} | "
                     f"{pct(r['default']['energy_error'])} | {pct(r['llmservingsim']['energy_error'])} |")
    lines += ["", f"(step overhead from the log: TP 1 {pulse[1]['overhead_ms']:.2f} ms, TP 2 "
              f"{pulse[2]['overhead_ms']:.2f} ms)", "",
              "ML.ENERGY v2 sweeps: |error| of average GPU power -- and so of energy per output token, which "
              "is power over the measured token throughput -- mean and largest over each sweep's batch sizes, "
              "points within 10%; the fixed-active model at the board limit beside; the awake share that would "
              "fit the sweep, its activity kept (median over its points; the model's is "
              f"{DERIVATION['awake']}):", "",
              "| sweep | points | mean | max | within 10% | fixed active | fitting awake |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, points in sorted(sweep.items()):
        s = sweep_summary(points)
        mark = " (training)" if s["training"] else ""
        within = sum(abs(p["power_error"]) <= 0.10 for p in points)
        lines.append(f"| {name}{mark} | {s['points']} | {s['power_mean'] * 100:.1f}% | {s['power_max'] * 100:.1f}% | "
                     f"{within} | {s['fixed_mean'] * 100:.0f}% | {s['fitting_awake']:.2f} |")
    held = [sweep_summary(p) for p in sweep.values() if not p[0]["training"]]
    points = [p for ps in sweep.values() for p in ps if not p["training"]]
    mean_10, mean_15 = (sum(s["power_mean"] <= bound for s in held) for bound in (0.10, 0.15))
    lines += ["", f"Held out: {len(held)} sweeps, {len(points)} points. Sweeps with a mean error within 10%: "
              f"{mean_10}, within 15%: {mean_15}; "
              f"with every point within 10%: {sum(s['power_max'] <= 0.10 for s in held)}, within 15%: "
              f"{sum(s['power_max'] <= 0.15 for s in held)}. Points within 10%: "
              f"{sum(abs(p['power_error']) <= 0.10 for p in points)}, within 15%: "
              f"{sum(abs(p['power_error']) <= 0.15 for p in points)}; median |error| "
              f"{np.median([abs(p['power_error']) for p in points]) * 100:.1f}%."]
    return "\n".join(lines)


def figure(pulse: dict, sweep: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7.5), dpi=110, layout="constrained")
    axes = fig.subplots(2, 2)
    for col, tp in enumerate((1, 2)):
        ax = axes[0, col]
        r = pulse[tp]["timed"]
        ax.plot(r["t"], r["measured"], color="black", linewidth=1.0, label="nvidia-smi")
        ax.plot(r["t"], r["model"], color="#1f77b4", linewidth=1.0, label="schedlab (utilisation)")
        ax.plot(r["t"], pulse[tp]["llmservingsim"]["model"], color="#d62728", linewidth=0.8, linestyle="--",
                label="LLMServingSim (fixed active)")
        ax.set_title(f"RTX A6000, Llama-3.1-8B, TP {tp}: power of GPU 0, energy {pct(r['energy_error'])}",
                     fontsize=10)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("W")
        ax.set_ylim(0, 320)
        ax.legend(loc="upper right", fontsize=8)
    for col, gpu in enumerate(("a100-40gb", "h100-80gb")):
        ax = axes[1, col]
        for k, model in enumerate(("Meta-Llama-3.1-8B-Instruct", "Meta-Llama-3.1-70B-Instruct",
                                   "Mistral-Nemo-Instruct-2407", "gemma-2-27b-it")):
            pts = [p for points in sweep.values() for p in points if p["gpu"] == gpu and p["model"].endswith(model)
                   and p["task"] == "chat"]
            if not pts:
                continue
            pts.sort(key=lambda p: p["avg_bs"])
            color = f"C{k}"
            bs = [p["avg_bs"] for p in pts]
            ax.plot(bs, [p["power_w"] for p in pts], "o", color=color, label=f"{model} (tp {pts[0]['tp']})")
            ax.plot(bs, [p["model_w"] for p in pts], "-", color=color)
        board = ed.presets().gpu(gpu).board_w
        ax.axhline(board, color="0.5", linestyle="--", linewidth=0.8, label="board limit")
        ax.set_xscale("log")
        ax.set_ylim(0, board * 1.05)
        ax.set_title(f"ML.ENERGY v2, {gpu}: measured (dots), model (lines)", fontsize=10)
        ax.set_xlabel("average batch (requests)")
        ax.set_ylabel("W per GPU")
        ax.legend(fontsize=7, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--figure", type=Path, default=None, help="write the figure here (PNG)")
    parser.add_argument("--power", choices=("utilisation", "additive"), default="utilisation",
                        help="the power model checked (the tables' 'model' column; default: utilisation)")
    args = parser.parse_args(argv)
    pulse, sweep = pulses(kind=args.power), sweeps(args.power)
    print(markdown(pulse, sweep, args.power))
    if args.figure:
        figure(pulse, sweep, args.figure)
        print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
