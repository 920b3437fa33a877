"""Derive how fast latent attention (MLA) decodes, per GPU, from vLLM's measured MLA decode kernels.

    python tools/derive_latent_attention.py [--aiconfigurator DIR]

vLLM decodes DeepSeek's multi-head latent attention *absorbed*: each query head is multiplied by
the whole 576-element latent of every context token (its 512 values and 64-wide RoPE key) and the
attention weights by its 512 values, ``2 x heads x (2 x 576 - 64)`` FLOPs per (query, key) pair,
against a read of 1,152 bytes a token (bf16). With 128 heads on a GPU (tensor parallel 1, or
data-parallel attention) that is about 240 FLOPs a byte, near an H100's ridge; with 16 (tensor
parallel 8) a memory-bound read. The roofline times a decode's attention per context token as
the longer of its KV read and its FLOPs at ``latent_decode_efficiency`` of the GPU's bf16 peak.

The measurements: NVIDIA's aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0)
times vLLM 0.14's MLA decode kernel alone (``generation_mla_perf``: one layer, batch x context
x heads) on H100 and H200 SXM (``vllm_flash_attn_mla``), A100 SXM and L40S (``vllm_triton_mla``).
The tests ship the points this derivation reads (bf16 KV, 1, 16 and 128 heads, at least 2**22
context tokens in a step: 4.8 GB a layer, far past any L2 cache) in
``tests/data/aiconfigurator/generation_mla.csv``; ``--aiconfigurator DIR`` (a checkout's
``aic-core/src/aiconfigurator_core/systems/data``, read with pyarrow) writes that file again.

The efficiency: at 128 heads, on the points whose time exceeds the 1-head time (the same KV
read) by more than 10% -- where the FLOPs bind -- the median of FLOPs / (time x bf16 peak).
FlashAttention's MLA kernel on Hopper reaches 0.62-0.71 of the peak; Triton's MLA kernel,
vLLM's on Ampere and Ada, 0.06-0.10. GPUs without a measurement take the median of their
kernel's family (``default_latent_decode_efficiency`` in ``plugins/cost_models/roofline.py``):
compute capability 9.x and 10.x run FlashMLA-class kernels (FlashMLA, CUTLASS MLA), the rest
Triton's.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))
import aiconfigurator  # noqa: E402
from plugins.presets import GPUS  # noqa: E402

SUBSET = REPO / "tests" / "data" / "aiconfigurator" / "generation_mla.csv"
#: aiconfigurator's system folder -> schedlab's GPU preset
AIC_GPUS = {"h100_sxm": "h100-80gb", "h200_sxm": "h200-141gb", "a100_sxm": "a100-80gb", "l40s": "l40s"}
VERSION = "0.14.0"
LATENT, ROPE = 576, 64
HEADS = (1, 16, 128)
MIN_TOKENS = 2 ** 22
COMPUTE_BOUND = 1.1  # 128 heads take this much longer than 1 head: the FLOPs bind
COLUMNS = ("gpu", "kernel_source", "num_heads", "batch_size", "context", "latency_ms")
#: the GPUs whose kernel is FlashMLA-class (the rest run Triton's): compute capability 9.x, 10.x
FLASH_CLASS = ("h100-80gb", "h200-141gb")


def flops_per_pair(heads: int) -> int:
    """An absorbed MLA decode's FLOPs per (query, key) pair and layer."""
    return 2 * heads * (2 * LATENT - ROPE)


def read_subset(path: Path = SUBSET) -> list[dict]:
    with open(path, newline="") as fh:
        return [{"gpu": r["gpu"], "kernel_source": r["kernel_source"], "num_heads": int(r["num_heads"]),
                 "batch_size": int(r["batch_size"]), "context": int(r["context"]),
                 "latency_ms": float(r["latency_ms"])} for r in csv.DictReader(fh)]


def extract(data: Path) -> list[dict]:
    """The subset's rows from an aiconfigurator checkout's parquet tables (pyarrow)."""
    import pyarrow.parquet as pq

    rows = []
    for folder, gpu in AIC_GPUS.items():
        table = pq.read_table(data / folder / "mla" / "vllm" / VERSION / "generation_mla_perf.parquet").to_pylist()
        for r in table:
            context = r["isl"] + r["step"]
            if (r["kv_cache_dtype"] == "bfloat16" and r["num_heads"] in HEADS
                    and r["batch_size"] * context >= MIN_TOKENS):
                rows.append({"gpu": gpu, "kernel_source": r["kernel_source"], "num_heads": r["num_heads"],
                             "batch_size": r["batch_size"], "context": context, "latency_ms": r["latency"]})
    return sorted(rows, key=lambda r: (r["gpu"], r["num_heads"], r["batch_size"], r["context"]))


def write_subset(rows: list[dict], path: Path = SUBSET) -> None:
    aiconfigurator.write_subset(rows, path, COLUMNS)


def efficiency(rows: list[dict], gpu: str) -> tuple[float, int]:
    """``(latent_decode_efficiency, compute-bound points)`` of ``gpu`` (see the module docstring)."""
    one = {(r["batch_size"], r["context"]): r["latency_ms"] for r in rows if r["gpu"] == gpu and r["num_heads"] == 1}
    peak = next(spec for spec, _ in GPUS if spec.name == gpu).bf16_tflops * 1e9  # FLOPs per ms
    shares = [r["batch_size"] * r["context"] * flops_per_pair(128) / (r["latency_ms"] * peak)
              for r in rows if r["gpu"] == gpu and r["num_heads"] == 128
              and (r["batch_size"], r["context"]) in one
              and r["latency_ms"] > COMPUTE_BOUND * one[(r["batch_size"], r["context"])]]
    if not shares:
        raise ValueError(f"{gpu}: no compute-bound point at 128 heads")
    return round(statistics.median(shares), 3), len(shares)


def derive(rows: list[dict]) -> dict:
    """Per GPU ``(efficiency, points)``, and the pooled value of each kernel family."""
    per_gpu = {gpu: efficiency(rows, gpu) for gpu in AIC_GPUS.values()}
    pooled = {"flash": round(statistics.median(per_gpu[g][0] for g in FLASH_CLASS), 2),
              "triton": round(statistics.median(per_gpu[g][0] for g in per_gpu if g not in FLASH_CLASS), 2)}
    return {"per_gpu": per_gpu, "pooled": pooled}


def model_vs_measured(rows: list[dict]) -> list[tuple]:
    """Per GPU and head count (128: tensor parallel 1; 16: tensor parallel 8): the roofline's
    decode attention of one DeepSeek-V3 layer against each measured point -- ``(gpu, heads,
    points, median |error|, share within 15%, median measured / KV-read-alone)``."""
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog
    from schedlab.protocols import Batch
    from plugins.cost_models.roofline import RooflineConfig, RooflineCostModel

    presets = Presets.from_catalog(load_catalog(entry_points=False))
    model = presets.model("deepseek-v3")

    def layer_ms(cost, batch: int, context: int) -> float:
        full = cost.kernel_ms(Batch(num_decode=batch, decode_context_tokens=batch * context))
        return (full - cost.kernel_ms(Batch(num_decode=batch, decode_context_tokens=0))) / model.num_layers

    table = []
    for gpu in AIC_GPUS.values():
        for heads, tp in ((128, 1), (16, 8)):
            def cost(**settings):
                return RooflineCostModel(model, presets.gpu(gpu), RooflineConfig(
                    model=model.name, gpu=gpu, tensor_parallel=tp, **settings))
            roofline, read_alone = cost(), cost(latent_decode_efficiency=1.0)
            points = [r for r in rows if r["gpu"] == gpu and r["num_heads"] == heads]
            errors = [abs(layer_ms(roofline, r["batch_size"], r["context"]) / r["latency_ms"] - 1) for r in points]
            before = [r["latency_ms"] / layer_ms(read_alone, r["batch_size"], r["context"]) for r in points]
            table.append((gpu, heads, len(points), statistics.median(errors),
                          sum(e < 0.15 for e in errors) / len(errors), statistics.median(before)))
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="derive_latent_attention.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--aiconfigurator", type=Path, metavar="DIR",
                        help="aiconfigurator's systems/data folder: write the shipped subset again from it")
    parser.add_argument("--table", action="store_true", help="the roofline against every measured point (README)")
    args = parser.parse_args(argv)
    if args.aiconfigurator:
        try:
            rows = extract(args.aiconfigurator)
        except FileNotFoundError as exc:
            parser.error(f"--aiconfigurator: no vLLM {VERSION} MLA table at {exc} (give the checkout's "
                         "aic-core/src/aiconfigurator_core/systems/data folder)")
        write_subset(rows)
        print(f"wrote {len(rows)} points to {SUBSET.relative_to(REPO)}")
    result = derive(read_subset())
    print("latent_decode_efficiency per GPU (MEASURED_LATENT_DECODE in plugins/presets.py):")
    for gpu, (eff, points) in result["per_gpu"].items():
        print(f"  {gpu}: {eff} ({points} compute-bound points)")
    print("pooled per kernel family (LATENT_DECODE_POOLED in plugins/cost_models/roofline.py):", result["pooled"])
    if args.table:
        print("\n| GPU (kernel) | efficiency | heads | points | median error | within 15% | measured / KV read alone |")
        print("|---|---|---|---|---|---|---|")
        kernels = {r["gpu"]: r["kernel_source"] for r in read_subset()}
        for gpu, heads, points, median, within, before in model_vs_measured(read_subset()):
            print(f"| `{gpu}` ({kernels[gpu]}) | {result['per_gpu'][gpu][0]} | {heads} | {points} | "
                  f"{median:.1%} | {within:.0%} | {before:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
