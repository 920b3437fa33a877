"""schedlab against ML.ENERGY Leaderboard v3.0 points it was not built from: vLLM 0.11.1 on H100
and B200, reasoning requests (GPQA) at saturation -- the README's Energy validation, "unseen".

    python tools/validate_mlenergy_v3.py [--markdown]

The points are read from two figures of the ML.ENERGY blog post "Reading the ML.ENERGY
Leaderboard v3.0" (github.com/ml-energy/blog, 2026-01-13; the figures' SVGs at commits 45a5990
and 553502b, ``assets/ml-energy-leaderboard-v3.0/section2-5-multi-gpu-light.svg`` and
``section2-5-235b-tradeoff-light.svg``): each labelled point's median ITL and energy per output
token, recovered from the SVG's path coordinates through its axis ticks (exact to 1e-6). They
are quoted here as measurements with their source; nothing in schedlab was fitted to them.

Each point is a vLLM server with ``max_num_seqs`` = the batch, every request sent at once
(GPQA Diamond, ``max_output_tokens`` 32,768; 8,192 batched tokens; asynchronous scheduling),
measured over its steady state. Two checks per point:

* **out of the box** -- schedlab simulates it (roofline, vLLM V1's scheduler, the utilisation
  power model, datasheet numbers): the mean step while at least 0.9 of the most requests ran,
  against the median ITL, and the steady state's energy per output token measured as ML.ENERGY
  measures it, against theirs;
* **power given the measured time** -- the power model alone on a decode step of the batch
  lasting the measured median ITL (as the v2 sweeps are checked), against the power the point
  implies: energy per token x batch / ITL / GPUs (every slot decoding; so only where the batch
  fits the KV cache -- up to 64 here, where the figure's H100 x 1 series stops).

A third figure of the post (``section2-1-batch-size-light.svg``) gives average power itself, as a
share of each B200's 1,000 W, with energy per token as a share of each series' largest:
DeepSeek R1 (GPQA, 8 B200s) and Qwen 3 Coder 30B A3B (fill-in-the-middle, one B200), checked
out of the box (:func:`power_rows`).

The requests are not published per point: prompts and answers are drawn lognormal (sigma 0.7)
with GPQA's means in the post -- 634 prompt tokens, 6,988 output tokens (reasoning, over the
post's models) -- so the long-batch points, where the KV cache binds, depend on that guess; as
many as the point sent (:func:`requests_sent`).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import attrs
import numpy as np

PROMPT_MEAN, OUTPUT_MEAN, OUTPUT_CAP, SIGMA = 634, 6988, 32768, 0.7
FP8_235B = "qwen3-235b-a22b-fp8"

#: (model preset, GPU preset, GPUs, max_num_seqs, median ITL ms, J per output token): the
#: labelled points of the post's GPT OSS 120B figure (B200, H100) and Qwen 3 235B A22B Thinking
#: FP8 figure, up to a batch of 512
POINTS = (
    ("gpt-oss-120b", "b200", 1, 16, 6.901834, 0.3310382),
    ("gpt-oss-120b", "b200", 1, 64, 13.95139, 0.1806217),
    ("gpt-oss-120b", "b200", 1, 512, 30.29424, 0.0552737),
    ("gpt-oss-120b", "b200", 2, 16, 5.632217, 0.431418),
    ("gpt-oss-120b", "b200", 2, 64, 8.798983, 0.20635),
    ("gpt-oss-120b", "b200", 2, 512, 24.37837, 0.0816021),
    ("gpt-oss-120b", "h100-80gb", 1, 16, 13.22633, 0.5118759),
    ("gpt-oss-120b", "h100-80gb", 1, 32, 17.96224, 0.3759125),
    ("gpt-oss-120b", "h100-80gb", 1, 64, 24.15147, 0.2675711),
    ("gpt-oss-120b", "h100-80gb", 2, 16, 9.206451, 0.5779633),
    ("gpt-oss-120b", "h100-80gb", 2, 32, 12.07512, 0.4168421),
    ("gpt-oss-120b", "h100-80gb", 2, 64, 16.03758, 0.2979924),
    ("gpt-oss-120b", "h100-80gb", 2, 256, 30.52055, 0.1505766),
    ("gpt-oss-120b", "h100-80gb", 2, 512, 48.84158, 0.114744),
    (FP8_235B, "b200", 2, 16, 41.16085, 4.69185),
    (FP8_235B, "b200", 2, 64, 50.62175, 1.49701),
    (FP8_235B, "b200", 4, 16, 27.29773, 5.224895),
    (FP8_235B, "b200", 4, 64, 32.73993, 1.673516),
    (FP8_235B, "b200", 4, 256, 52.09325, 0.645536),
    (FP8_235B, "b200", 4, 512, 82.01269, 0.4177149),
    (FP8_235B, "h100-80gb", 4, 16, 38.23172, 4.996622),
    (FP8_235B, "h100-80gb", 4, 32, 43.30783, 2.891527),
    (FP8_235B, "h100-80gb", 8, 16, 27.76678, 6.436207),
    (FP8_235B, "h100-80gb", 8, 64, 39.52789, 2.310805),
    (FP8_235B, "h100-80gb", 8, 128, 45.91883, 1.384629),
)
#: the largest batch whose every slot decodes in the measured run (the power check's premise)
FULL_BATCH = 64
#: ML.ENERGY's stability rule: a run whose mean batch is below this share of max_num_seqs is unstable
UNSTABLE = 0.85

#: The post's batch-size figure (``section2-1-batch-size-light.svg``, commit eff5bae): average power
#: as a share of the GPUs' 1,000 W each, and energy per token as a share of the series' largest,
#: against ``max_num_seqs`` -- DeepSeek R1 on GPQA on 8 B200s, Qwen 3 Coder 30B A3B on
#: Sourcegraph's fill-in-the-middle requests on one: (model preset, GPUs, workload, batch, power
#: % of TDP, energy per token % of the series' max)
POWER_POINTS = (
    ("deepseek-v3", 8, "gpqa", 16, 61.39138, 100.0), ("deepseek-v3", 8, "gpqa", 32, 67.47642, 74.77515),
    ("deepseek-v3", 8, "gpqa", 64, 76.95177, 54.1788), ("deepseek-v3", 8, "gpqa", 128, 89.07701, 33.36437),
    ("qwen3-30b-a3b", 1, "fim", 16, 77.30598, 100.0), ("qwen3-30b-a3b", 1, "fim", 32, 80.37394, 72.10504),
    ("qwen3-30b-a3b", 1, "fim", 64, 85.4654, 47.36797), ("qwen3-30b-a3b", 1, "fim", 128, 84.05233, 33.51377),
    ("qwen3-30b-a3b", 1, "fim", 256, 90.00864, 24.61469), ("qwen3-30b-a3b", 1, "fim", 512, 89.74704, 20.24596),
    ("qwen3-30b-a3b", 1, "fim", 1024, 96.49798, 18.36888),
)
#: (prompt mean, answer mean, answer cap) of each workload: GPQA's means in the post; the
#: fill-in-the-middle requests' are not published -- a guess (code context before and after the
#: hole, a short completion; the benchmark caps answers at 1,024 tokens)
WORKLOADS = {"gpqa": (PROMPT_MEAN, OUTPUT_MEAN, OUTPUT_CAP), "fim": (1500, 150, 1024)}
#: How many requests each point sent: the task's unique requests (``configs/vllm/<task>/benchmark.yaml``
#: of github.com/ml-energy/benchmark: GPQA Diamond's 198, 1,024 fill-in-the-middle ones) times the
#: sweep's ``num_request_repeats`` at that ``max_num_seqs`` (``configs/vllm/<task>/<model>/<GPU>/sweeps.yaml``,
#: last changed 2025-11-22..26, before the v3.0 runs; 1 where a batch is not listed). The steady
#: state ends when all but ``max_num_seqs + 1`` of them are done, so the count shapes it.
UNIQUE_REQUESTS = {"gpqa": 198, "fim": 1024}
REPEATS = {
    ("gpt-oss-120b", "h100-80gb"): {192: 2, 256: 2, 384: 3, 512: 4, 768: 5, 1024: 6, 1536: 9},
    ("gpt-oss-120b", "b200"): {128: 2, 256: 3, 512: 4, 1024: 7, 2048: 12, 3072: 18, 4096: 24},
    (FP8_235B, "b200"): {256: 2, 384: 3, 512: 4, 1024: 6},
    (FP8_235B, "h100-80gb"): {192: 2, 256: 2},
    ("deepseek-v3", "b200"): {256: 2},
    ("qwen3-30b-a3b", "b200"): {64: 2, 128: 2, 256: 4, 512: 4, 1024: 6, 1536: 6},
}


def requests_sent(model: str, gpu: str, batch: int, workload: str = "gpqa") -> int:
    """The requests ML.ENERGY sent at this point (:data:`REPEATS`)."""
    return UNIQUE_REQUESTS[workload] * REPEATS.get((model, gpu), {}).get(batch, 1)


def presets():
    """The built-in presets, with Qwen3-235B-A22B's FP8 checkpoint (block-wise FP8 weights and
    activations, Qwen/Qwen3-235B-A22B-Thinking-2507-FP8) beside its bf16 preset."""
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog

    plain = Presets.from_catalog(load_catalog(entry_points=False))
    fp8 = attrs.evolve(plain.model("qwen3-235b-a22b"), name=FP8_235B, weight_dtype_bytes=1.0, fp8_activations=True)
    return Presets.from_catalog(load_catalog(entry_points=False), custom={FP8_235B: fp8})


def _lognormal(mean: float, high: int) -> str:
    return f'{{dist = "lognormal", median = {mean / math.exp(SIGMA ** 2 / 2):.1f}, sigma = {SIGMA}, high = {high}}}'


def experiment(model: str, gpu: str, tp: int, batch: int, workload: str = "gpqa") -> str:
    """The point as an experiment file: every request at once, max_num_seqs = the batch."""
    prompt, output, cap = WORKLOADS[workload]
    custom = ""
    if model == FP8_235B:
        spec = presets().model(FP8_235B)
        keys = {k: v for k, v in attrs.asdict(spec).items() if v is not None and k != "name"}
        custom = f"[models.{FP8_235B}]\n" + "".join(
            f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v).replace(chr(39), chr(34))}\n"
            for k, v in keys.items())
    return f"""{custom}
[experiment]
name = "mlenergy_v3"
reports = []

[workload]
kind = "synthetic"
num_requests = {requests_sent(model, gpu, batch, workload)}
rate = 1e6
prompt = {_lognormal(prompt, 16000)}
output = {_lognormal(output, cap)}

[scheduler]
kind = "continuous"
max_num_seqs = {batch}
max_num_batched_tokens = 8192
chunked_prefill = true

[cost_model]
kind = "roofline"
model = "{model}"
gpu = "{gpu}"
tensor_parallel = {tp}

[kv_cache]
kind = "paged"
model = "{model}"
gpu = "{gpu}"
tensor_parallel = {tp}

[power]
kind = "utilisation"
"""


def simulate(model: str, gpu: str, tp: int, batch: int, folder: Path, workload: str = "gpqa") -> dict:
    """The simulated steady state, as ML.ENERGY measures it (:func:`schedlab.targets.steady_state_energy`:
    from ``batch`` first tokens to all but ``batch + 1`` requests done): energy per output token (J) and power per GPU
    (W); and over the iterations while at least 0.9 of the most requests ran, the mean step (ms)
    and the mean running requests."""
    from schedlab.study.experiment import load, run_experiment
    from schedlab.targets import steady_state_energy

    path = folder / f"{model}_{gpu}_tp{tp}_b{batch}_{workload}.toml"
    path.write_text(experiment(model, gpu, tp, batch, workload))
    result = run_experiment(load(path)).all_runs()[0]
    t = result.timeline
    k, running = t["iterations"], t["running"]
    full = (running >= 0.9 * running.max()) & (k > 0)
    steady = steady_state_energy(result, batch)
    return {"step_ms": float(t["duration_ms"][full].sum()) / float(k[full].sum()),
            "j_per_token": steady["steady_j_per_token"], "power_w": steady["steady_power_w"] / tp,
            "running": float(np.average(running[full], weights=t["duration_ms"][full])),
            "steady_batch": steady["steady_batch"]}


def power_given_time(model: str, gpu: str, tp: int, batch: int, itl_ms: float, kind: str = "utilisation") -> float:
    """The power model's (``kind``: ``utilisation`` or ``additive``, defaults) power per GPU over a
    decode step of ``batch`` requests at the mean context (prompt + half the answer) lasting the
    measured median ITL."""
    from schedlab.protocols import Batch
    from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel
    from schedlab_plugins.power.additive import AdditiveConfig, build_additive
    from schedlab_plugins.power.utilisation import UtilisationConfig, build_utilisation

    p = presets()
    cost = RooflineCostModel(p.model(model), p.gpu(gpu), RooflineConfig(model=model, gpu=gpu, tensor_parallel=tp))
    power = (build_additive(AdditiveConfig(), p, cost) if kind == "additive"
             else build_utilisation(UtilisationConfig(), p, cost))
    step = Batch(num_decode=batch, decode_context_tokens=batch * (PROMPT_MEAN + OUTPUT_MEAN // 2))
    return power.iteration_j(step, itl_ms) / itl_ms * 1e3 / tp


def rows() -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, gpu, tp, batch, itl, jpt in POINTS:
            sim = simulate(model, gpu, tp, batch, Path(tmp))
            row = {"model": model, "gpu": gpu, "tp": tp, "batch": batch, "itl_ms": itl, "j_per_token": jpt,
                   "sim": sim, "step_error": sim["step_ms"] / itl - 1, "jpt_error": sim["j_per_token"] / jpt - 1}
            if batch <= FULL_BATCH:
                measured = jpt * batch / (itl / 1e3) / tp
                given = power_given_time(model, gpu, tp, batch, itl)
                row.update(power_w=measured, given_w=given, given_error=given / measured - 1)
            out.append(row)
    return out


def power_rows() -> list[dict]:
    """The batch-size figure's points out of the box: power per GPU against the measured, and
    energy per token as a share of the series' largest (the figure gives no absolute one)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, tp, workload, batch, power_pct, energy_pct in POWER_POINTS:
            sim = simulate(model, "b200", tp, batch, Path(tmp), workload)
            out.append({"model": model, "tp": tp, "workload": workload, "batch": batch, "power_w": power_pct * 10.0,
                        "energy_pct": energy_pct, "sim": sim, "power_error": sim["power_w"] / (power_pct * 10.0) - 1})
    for model in {r["model"] for r in out}:
        series = [r for r in out if r["model"] == model]
        top = max(r["sim"]["j_per_token"] for r in series)
        for r in series:
            r["sim_energy_pct"] = 100.0 * r["sim"]["j_per_token"] / top
    return out


def power_markdown(points: list[dict]) -> str:
    lines = ["| model | B200s | requests | batch | power/GPU (sim) | J/token, % of the series' largest (sim) |",
             "|---|---:|---|---:|---:|---:|"]
    for r in points:
        lines.append(f"| {r['model']} | {r['tp']} | {r['workload']} | {r['batch']} | {r['power_w']:.0f} W "
                     f"({r['sim']['power_w']:.0f}, {pct(r['power_error'])}) | {r['energy_pct']:.1f} "
                     f"({r['sim_energy_pct']:.1f}) |")
    return "\n".join(lines)


def pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def markdown(points: list[dict]) -> str:
    lines = ["| model | GPUs | batch | median ITL (sim) | J/token (sim) | power/GPU implied | given its ITL |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in points:
        s = r["sim"]
        power = (f"{r['power_w']:.0f} W | {r['given_w']:.0f} W ({pct(r['given_error'])})" if "power_w" in r
                 else "-- | --")
        mark = "*" if not s["steady_batch"] >= UNSTABLE * r["batch"] else ""
        energy = (f"{s['j_per_token']:.3f}, {pct(r['jpt_error'])}" if math.isfinite(s["j_per_token"])
                  else "no steady state")
        lines.append(f"| {r['model']} | {r['gpu']} x {r['tp']} | {r['batch']}{mark} | {r['itl_ms']:.1f} ms "
                     f"({s['step_ms']:.1f}, {pct(r['step_error'])}) | {r['j_per_token']:.3f} ({energy}) | {power} |")
    lines.append("")
    lines.append("\\* below ML.ENERGY's stability bar in the simulation (a mean batch under 0.85 of the "
                 "configured one): the guessed answers overfill its KV cache there -- or, with no steady state, "
                 "all but max_num_seqs + 1 requests are done before max_num_seqs have begun")
    return "\n".join(lines)


# --- the dense-model points of the leaderboard's data (experiments/data/energy/mlenergy-v3) ----------

#: the power models compared on the dense points: [power] settings by name
DENSE_MODELS = {"utilisation": {}, "additive": {}}


def dense_rows() -> list[dict]:
    """Every saturated dense v3 point we can model (``energy_data.v3_points``: H100 and B200,
    Qwen3 8/14/32B, Llama 3.1 8B, Llama 3.1/3.3 70B), with each power model's power per GPU and
    J per output token given the point's measured median ITL (``energy_data.predict_v3``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import energy_data as ed
    from schedlab_plugins.power.additive import AdditiveConfig, build_additive
    from schedlab_plugins.power.utilisation import UtilisationConfig, build_utilisation

    presets_ = ed.presets()
    makers = {"utilisation": lambda cost: build_utilisation(UtilisationConfig(), presets_, cost),
              "additive": lambda cost: build_additive(AdditiveConfig(), presets_, cost)}
    out = []
    for p in ed.v3_points():
        row = dict(p)
        for name, make in makers.items():
            watts, jpt = ed.predict_v3(p, make, presets_)
            row[name] = {"power_w": watts, "j_per_token": jpt, "power_error": watts / p["power_w"] - 1,
                         "jpt_error": jpt / p["j_per_token"] - 1}
        out.append(row)
    return out


def dense_summary(points: list[dict], model: str) -> dict:
    """Mean and largest |error| of power and J/token over ``points``, and the batch sweeps (a
    series: model, task, GPU, TP) whose power is non-decreasing in the batch where the measured is."""
    pe = np.array([abs(p[model]["power_error"]) for p in points])
    je = np.array([abs(p[model]["jpt_error"]) for p in points])
    return {"points": len(points), "power_mean": float(pe.mean()), "power_max": float(pe.max()),
            "jpt_mean": float(je.mean()), "jpt_max": float(je.max()),
            "power_within_10": int((pe <= 0.10).sum()), "jpt_within_15": int((je <= 0.15).sum())}


def dense_markdown(points: list[dict]) -> str:
    lines = ["| series | training | points | measured W/GPU | utilisation: power mean / max |error| | J/token "
             "| additive: power | J/token |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    series: dict[str, list[dict]] = {}
    for p in points:
        series.setdefault(p["label"], []).append(p)
    for label, ps in sorted(series.items(), key=lambda kv: (not kv[1][0]["training"], kv[0])):
        ps.sort(key=lambda p: p["batch"])
        u, a = dense_summary(ps, "utilisation"), dense_summary(ps, "additive")
        lines.append(f"| {label} (batch {ps[0]['batch']:.0f}-{ps[-1]['batch']:.0f}) | "
                     f"{'yes' if ps[0]['training'] else 'held out'} | {len(ps)} | "
                     f"{ps[0]['power_w']:.0f}-{ps[-1]['power_w']:.0f} | "
                     f"{u['power_mean'] * 100:.1f}% / {u['power_max'] * 100:.1f}% | "
                     f"{u['jpt_mean'] * 100:.1f}% / {u['jpt_max'] * 100:.1f}% | "
                     f"{a['power_mean'] * 100:.1f}% / {a['power_max'] * 100:.1f}% | "
                     f"{a['jpt_mean'] * 100:.1f}% / {a['jpt_max'] * 100:.1f}% |")
    lines += ["", "| set | points | model | power: mean / max |error| | within 10% | J/token: mean / max | "
              "within 15% |", "|---|---:|---|---:|---:|---:|---:|"]
    sets = (("training (Qwen3-8B, Qwen3-14B on the H100)", [p for p in points if p["training"]]),
            ("held out: H100", [p for p in points if not p["training"] and p["gpu"] == "h100-80gb"]),
            ("held out: B200", [p for p in points if p["gpu"] == "b200"]),
            ("held out: all", [p for p in points if not p["training"]]))
    for name, ps in sets:
        for model in DENSE_MODELS:
            s = dense_summary(ps, model)
            lines.append(f"| {name} | {s['points']} | {model} | {s['power_mean'] * 100:.1f}% / "
                         f"{s['power_max'] * 100:.1f}% | {s['power_within_10']} | {s['jpt_mean'] * 100:.1f}% / "
                         f"{s['jpt_max'] * 100:.1f}% | {s['jpt_within_15']} |")
    return "\n".join(lines)


def moe_markdown() -> str:
    """The blog post's MoE points up to a batch of 64 (:data:`POINTS`), power given the measured
    ITL under both power models: the additive model was not fitted on MoE or quantised weights."""
    lines = ["| model | GPUs | batch | power/GPU implied | utilisation | additive |", "|---|---|---:|---:|---:|---:|"]
    for model, gpu, tp, batch, itl, jpt in POINTS:
        if batch > FULL_BATCH:
            continue
        measured = jpt * batch / (itl / 1e3) / tp
        cells = []
        for kind in DENSE_MODELS:
            w = power_given_time(model, gpu, tp, batch, itl, kind)
            cells.append(f"{w:.0f} W ({pct(w / measured - 1)})")
        lines.append(f"| {model} | {gpu} x {tp} | {batch} | {measured:.0f} W | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    parser.add_argument("--dense", action="store_true",
                        help="only the dense points' power given their measured ITL (mlenergy-v3/dense.csv), as "
                             "markdown")
    args = parser.parse_args(argv)
    if args.dense:
        print(dense_markdown(dense_rows()))
        print()
        print(moe_markdown())
        return 0
    points = rows()
    if args.markdown:
        print(markdown(points))
        print()
        print(power_markdown(power_rows()))
        return 0
    for r in points:
        s = r["sim"]
        given = f"  power given ITL {r['given_w']:4.0f} W vs {r['power_w']:4.0f} ({pct(r['given_error'])})" \
            if "power_w" in r else ""
        print(f"{r['model']:20} {r['gpu']:10} x{r['tp']} b={r['batch']:4}  step {s['step_ms']:6.1f} vs "
              f"{r['itl_ms']:6.1f} ms ({pct(r['step_error'])})  J/token {s['j_per_token']:.3f} vs "
              f"{r['j_per_token']:.3f} ({pct(r['jpt_error'])})  running {s['running']:5.0f}{given}")
    for r in power_rows():
        print(f"{r['model']:20} b200 x{r['tp']} {r['workload']:4} b={r['batch']:4}  power/GPU {r['sim']['power_w']:4.0f} "
              f"vs {r['power_w']:4.0f} W ({pct(r['power_error'])})  J/token % of max {r['sim_energy_pct']:5.1f} vs "
              f"{r['energy_pct']:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
