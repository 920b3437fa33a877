"""Derive the roofline's routed-expert settings per GPU from vLLM's measured fused MoE kernels.

    python tools/derive_experts.py [--aiconfigurator DIR] [--table]

The roofline times a MoE layer's routed experts on a GPU as

    expert_layer_us + hypot(experts x (expert bytes / (BW x bandwidth_efficiency x expert_read_share)
                                       + expert_us),
                            pair FLOPs / (peak x dense GEMM curve at the rows per expert x expert_gemm_share))

(``plugins/cost_models/roofline.py``, ``expert_layers_ms``). ``expert_us`` is each expert's fixed
time in the kernel: a narrow expert (tensor parallelism splits each one's intermediate width over
the ranks) does not reach the bandwidth.

The measurements: NVIDIA's aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) times
vLLM's MoE layer alone (``moe_perf``: tokens x hidden x intermediate x experts x top-k x tensor
parallel) on H100, H200, B200 SXM and L40S, with the tokens spread evenly over the experts
(``balanced``: ``min(E, tokens x k)`` experts run). The fit takes vLLM 0.24, whose timings name the
kernel vLLM's own selection picks for each shape (``kernel_source``): Triton's fused MoE on H100,
H200 and L40S, FlashInfer's TRT-LLM kernels on B200. It takes three kinds of experts
(:data:`KERNELS`): 16-bit (bf16), block-scaled FP8 (``fp8_block``: W8A8, 128 x 128 weight blocks,
as DeepSeek's and Qwen's FP8 checkpoints) and 4-bit weights with 16-bit activations (``w4a16``:
gpt-oss's MXFP4 experts in vLLM's gpt-oss MoE path -- Triton's kernels on Hopper, FlashInfer's
TRT-LLM on B200, Marlin on L40S -- the only 4-bit format timed on every GPU), at tensor parallel 1,
2, 4 and 8, powers of two from 1 to 16,384 tokens, and leaves
out the points whose experts' weights fit in 128 MB (the timing loop would read them from the L2
cache: 50 MB on H100 and H200, 96 MB on L40S, 126 MB on B200). Least squares in log time, per GPU
and kernel. The tests ship the points this derivation reads in
``tests/data/aiconfigurator/moe.csv``; ``--aiconfigurator DIR`` (a checkout's
``aic-core/src/aiconfigurator_core/systems/data``, read with pyarrow) writes it again and, with
``--table``, checks the fits on the same GPUs' earlier vLLM versions (held out: Triton's fused MoE
everywhere, B200 included).

A GPU without a measurement takes each setting's median over the measured GPUs (for 16-bit
experts, with LLMServingSim's RTX PRO 6000 Server profile too: ``tools/derive_roofline.py``).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))
import aiconfigurator  # noqa: E402
from plugins.cost_models.roofline import EXPERT_SETTINGS  # noqa: E402

SUBSET = REPO / "tests" / "data" / "aiconfigurator" / "moe.csv"
#: aiconfigurator's system folder -> (schedlab's GPU preset, the vLLM version fitted, held-out versions)
AIC_GPUS = {"h100_sxm": ("h100-80gb", "0.24.0", ("0.14.0", "0.19.0")),
            "h200_sxm": ("h200-141gb", "0.24.0", ("0.14.0", "0.19.0")),
            "b200_sxm": ("b200", "0.24.0", ("0.19.0", "0.22.0")),
            "l40s": ("l40s", "0.24.0", ("0.22.0",))}
#: aiconfigurator's dtype -> the kernel family's name here (``EXPERT_KERNELS`` in the roofline)
KERNELS = {"bfloat16": "bf16", "fp8_block": "fp8", "w4a16_mxfp4": "w4a16"}
#: the w4a16 timings kept: vLLM's gpt-oss MoE path (0.24's names it; earlier, ``vllm_mxfp4_moe``)
W4A16_SOURCES = ("gptoss", "vllm_mxfp4_moe")
#: weight bytes per parameter of each kernel's experts (MXFP4: 4 bits and an 8-bit scale per 32)
BYTES_PER_PARAM = {"bf16": 2.0, "fp8": 1.0, "w4a16": 0.53125}
TENSOR_PARALLEL = (1, 2, 4, 8)
TOKENS = tuple(2 ** i for i in range(15))
L2_BYTES = 128e6
COLUMNS = ("gpu", "kernel", "hidden", "intermediate", "experts", "top_k", "tp", "tokens", "latency_us")
#: what every GPU took before: the fit on LLMServingSim's RTX PRO 6000 Server MoE profile
PROFILED = {"expert_layer_us": 29.9, "expert_us": 0.0, "expert_read_share": 0.988, "expert_gemm_share": 0.81}
#: the settings in the order the fit holds them (the roofline's EXPERT_SETTINGS), its start and bounds
KEYS = EXPERT_SETTINGS
START, LOWER, UPPER = (20.0, 0.2, 1.0, 0.7), (0.0, 0.0, 0.1, 0.05), (200.0, 5.0, 2.0, 2.0)


def read_subset(path: Path = SUBSET) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: (r[k] if k in ("gpu", "kernel") else float(r[k]) if k == "latency_us" else int(r[k]))
                 for k in COLUMNS} for r in csv.DictReader(fh)]


def extract(data: Path, versions: dict[str, str] | None = None) -> list[dict]:
    """The derivation's rows from an aiconfigurator checkout's parquet tables (pyarrow), at each
    GPU's fitted version (or ``versions``: folder -> version)."""
    import pyarrow.parquet as pq

    rows = []
    for folder, (gpu, fitted, _) in AIC_GPUS.items():
        version = (versions or {}).get(folder, fitted)
        for r in pq.read_table(data / folder / "moe" / "vllm" / version / "moe_perf.parquet").to_pylist():
            if (r["moe_dtype"] in KERNELS and r["distribution"] == "balanced"
                    and (KERNELS[r["moe_dtype"]] != "w4a16" or any(k in r["kernel_source"] for k in W4A16_SOURCES))
                    and r["moe_ep_size"] == 1 and r["moe_tp_size"] in TENSOR_PARALLEL
                    and r["inter_size"] % r["moe_tp_size"] == 0 and r["num_tokens"] in TOKENS):
                rows.append({"gpu": gpu, "kernel": KERNELS[r["moe_dtype"]], "hidden": r["hidden_size"],
                             "intermediate": r["inter_size"], "experts": r["num_experts"], "top_k": r["topk"],
                             "tp": r["moe_tp_size"], "tokens": r["num_tokens"],
                             "latency_us": round(r["latency"] * 1e3, 3)})
    return sorted(rows, key=lambda r: tuple(r[k] for k in COLUMNS))


def write_subset(rows: list[dict], path: Path = SUBSET) -> None:
    aiconfigurator.write_subset(rows, path, COLUMNS)


def rates(gpu: str, kernel: str) -> dict:
    """What the roofline reads experts and multiplies at on ``gpu`` (its resolved dense
    efficiencies, per ms) for the ``kernel`` family's weights: the rates the shares scale."""
    from schedlab.capacity import ModelSpec, Presets
    from schedlab.catalog import load_catalog
    from plugins.cost_models.roofline import RooflineConfig, RooflineCostModel

    fp8 = {"weight_dtype_bytes": 1.0, "fp8_activations": True} if kernel == "fp8" else \
        {"expert_dtype_bytes": BYTES_PER_PARAM[kernel]} if kernel == "w4a16" else {}
    model = ModelSpec("one-moe-layer", num_layers=1, num_kv_heads=1, head_dim=128, num_params=8 * 3 * 4096 ** 2,
                      active_params=2 * 3 * 4096 ** 2, num_experts=8, experts_per_token=2, hidden_size=4096, **fp8)
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    cost = RooflineCostModel(model, presets.gpu(gpu), RooflineConfig(model=model.name, gpu=gpu))
    return {"read_per_ms": cost._weight_bytes_per_ms, "peak_per_ms": cost._expert_peak_per_ms,
            "mfu": cost.settings.mfu, "half": cost.settings.gemm_half_tokens,
            "bytes_per_param": model.expert_bytes_per_param}


def expert_bytes(rows: list[dict], kernel: str) -> np.ndarray:
    """Weight bytes of one expert's shard on a rank (gate, up and down projections)."""
    return np.array([3 * r["hidden"] * r["intermediate"] / r["tp"] for r in rows]) * BYTES_PER_PARAM[kernel]


def layer_ms(x, rows: list[dict], kernel: str, r: dict) -> np.ndarray:
    """The roofline's MoE layer at settings ``x`` (:data:`KEYS`) for each measured row, its
    experts spread evenly (``min(E, tokens x k)`` of them run)."""
    fixed_us, each_us, read_share, gemm_share = x
    tokens = np.array([row["tokens"] for row in rows], dtype=float)
    k = np.array([row["top_k"] for row in rows], dtype=float)
    run = np.minimum(np.array([row["experts"] for row in rows], dtype=float), tokens * k)
    size = expert_bytes(rows, kernel)
    read = run * (size / (r["read_per_ms"] * read_share) + each_us * 1e-3)
    per_expert = tokens * k / run
    efficiency = r["mfu"] * per_expert / (per_expert + r["half"]) * gemm_share
    flops = 2.0 * tokens * k * size / r["bytes_per_param"]
    return fixed_us * 1e-3 + np.hypot(read, flops / (r["peak_per_ms"] * efficiency))


def past_l2(rows: list[dict], kernel: str) -> list[dict]:
    size = expert_bytes(rows, kernel)
    return [row for row, s in zip(rows, size) if min(row["experts"], row["tokens"] * row["top_k"]) * s > L2_BYTES]


def fit(rows: list[dict], gpu: str, kernel: str, *, per_expert: bool = True) -> dict:
    """The four settings of ``gpu``'s ``kernel`` (least squares in log time), with the points and
    the median and 90th-percentile |error| of the fit and of the settings before it.
    ``per_expert=False``: ``expert_us`` held at 0 (the model before it, refitted)."""
    from scipy.optimize import least_squares
    from plugins.cost_models.roofline import DERIVATION, EXPERTS_POOLED

    used = past_l2([r for r in rows if r["gpu"] == gpu and r["kernel"] == kernel], kernel)
    r, measured = rates(gpu, kernel), np.array([row["latency_us"] for row in used]) * 1e-3
    upper = UPPER if per_expert else (UPPER[0], 1e-9, *UPPER[2:])
    start = START if per_expert else (START[0], 0.0, *START[2:])
    result = least_squares(lambda x: np.log(layer_ms(x, used, kernel, r) / measured), start, bounds=(LOWER, upper))
    after = np.abs(np.exp(result.fun) - 1)
    pooled_settings = EXPERTS_POOLED.get(kernel, DERIVATION)
    pooled = np.abs(layer_ms([pooled_settings[k] for k in KEYS], used, kernel, r) / measured - 1)
    before = np.abs(layer_ms([PROFILED[k] for k in KEYS], used, kernel, r) / measured - 1)
    rounding = (1, 3, 3, 3)
    return {**{k: round(float(v), d) for k, v, d in zip(KEYS, result.x, rounding)}, "points": len(used),
            "median": float(np.median(after)), "p90": float(np.percentile(after, 90)),
            "median_pooled": float(np.median(pooled)), "median_before": float(np.median(before)),
            "p90_before": float(np.percentile(before, 90))}


def errors(settings: dict, rows: list[dict], gpu: str, kernel: str) -> tuple[int, float, float]:
    """``(points, median |error|, 90th percentile)`` of ``settings`` on ``rows``."""
    used = past_l2([r for r in rows if r["gpu"] == gpu and r["kernel"] == kernel], kernel)
    if not used:
        return 0, math.nan, math.nan
    measured = np.array([row["latency_us"] for row in used]) * 1e-3
    e = np.abs(layer_ms([settings[k] for k in KEYS], used, kernel, rates(gpu, kernel)) / measured - 1)
    return len(used), float(np.median(e)), float(np.percentile(e, 90))


def derive(rows: list[dict], profiled: dict | None = None) -> dict:
    """Per GPU and kernel the fitted settings; pooled, each setting's median over the GPUs (bf16:
    with ``profiled``, LLMServingSim's RTX PRO 6000 Server fit, too)."""
    fits = {kernel: {gpu: fit(rows, gpu, kernel) for gpu, _, _ in AIC_GPUS.values()} for kernel in KERNELS.values()}

    def pooled(kernel: str, extra: list[dict]) -> dict:
        series = list(fits[kernel].values()) + extra
        return {k: round(statistics.median(s[k] for s in series), 1 if k == "expert_layer_us" else 3) for k in KEYS}

    return {"fits": fits, "pooled": {kernel: pooled(kernel, [profiled] if profiled and kernel == "bf16" else [])
                                     for kernel in fits}}


def measured_table(result: dict) -> dict[str, dict]:
    """``MEASURED_EXPERTS`` for plugins/presets.py: per GPU and kind of expert its settings, in
    :data:`KEYS`' order."""
    table: dict[str, dict] = {}
    for kernel, per_gpu in result["fits"].items():
        for gpu, f in per_gpu.items():
            table.setdefault(gpu, {})[kernel] = tuple(f[k] for k in KEYS)
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="derive_experts.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--aiconfigurator", type=Path, metavar="DIR",
                        help="aiconfigurator's systems/data folder: write the shipped subset again from it")
    parser.add_argument("--table", action="store_true",
                        help="the fits' errors, before and after (and, with --aiconfigurator, on other vLLM versions)")
    args = parser.parse_args(argv)
    if args.aiconfigurator:
        try:
            write_subset(extract(args.aiconfigurator))
        except FileNotFoundError as exc:
            parser.error(f"--aiconfigurator: no vLLM MoE table at {exc} (give the checkout's "
                         "aic-core/src/aiconfigurator_core/systems/data folder)")
        print(f"wrote {len(read_subset())} points to {SUBSET.relative_to(REPO)}")
    rows = read_subset()
    result = derive(rows)
    print("MEASURED_EXPERTS in plugins/presets.py:")
    for gpu, settings in measured_table(result).items():
        print(f"  {gpu!r}: {settings},")
    print("EXPERTS_POOLED in plugins/cost_models/roofline.py:",
          {kernel: settings for kernel, settings in result["pooled"].items() if kernel != "bf16"})
    print("bf16, the median over these GPUs (DERIVATION's pools the RTX PRO 6000 Server profile's fit in too: "
          "tools/derive_roofline.py):", result["pooled"]["bf16"])
    if args.table:
        print("\n| GPU | kernel | points | median error | 90th percentile | with the pooled settings: median "
              "| before (the RTX PRO 6000 profile's): median | 90th |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for kernel, per_gpu in result["fits"].items():
            for gpu, f in per_gpu.items():
                print(f"| `{gpu}` | {kernel} | {f['points']} | {f['median']:.1%} | {f['p90']:.1%} | "
                      f"{f['median_pooled']:.1%} | {f['median_before']:.1%} | {f['p90_before']:.1%} |")
    if args.table and args.aiconfigurator:
        print("\nHeld out (the fit above on another vLLM version of the same GPU):\n")
        print("| GPU | vLLM | kernel | points | median error | 90th percentile |")
        print("|---|---|---|---:|---:|---:|")
        table = measured_table(result)
        for folder, (gpu, _, others) in AIC_GPUS.items():
            for version in others:
                try:
                    held = [r for r in extract(args.aiconfigurator, {folder: version}) if r["gpu"] == gpu]
                except FileNotFoundError:
                    continue
                for kernel in KERNELS.values():
                    settings = dict(zip(KEYS, table[gpu][kernel]))
                    points, median, p90 = errors(settings, held, gpu, kernel)
                    if points:
                        print(f"| `{gpu}` | {version} | {kernel} | {points} | {median:.1%} | {p90:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
