"""Derive the roofline cost model's default efficiencies from measured per-operator profiles.

    python tools/derive_roofline.py [PROFILES_DIR] [CONFIGS_DIR]
    python tools/derive_roofline.py power      (the power section, at the end of this file)

Defaults: ../shared/calibration/llmservingsim/profiler/perf and .../configs/model (the
LLMServingSim bundles measured inside vLLM 0.19: RTX PRO 6000 Blackwell Server Edition with
Llama-3.1-8B, Qwen3-32B, Qwen3-30B-A3B at TP 1 and 2; RTX 4090 with Llama-3.1-8B at TP 1).
It prints the parameter counts of the three model presets (from the Hugging Face configs)
and, per bundle and pooled over all of them:

* weight_read_efficiency -- one decoder layer's linear layers at 1 token read their weights
  at this share of the datasheet bandwidth;
* gemm_efficiency, gemm_half_tokens -- the dense ops at T tokens reach
  ``gemm_efficiency * T / (T + gemm_half_tokens)`` of the datasheet bf16 rate once compute
  bound (least squares in log time over T = 1..2048, with the weight-read time as the floor);
* kv_read_efficiency -- decode attention (128 decodes x 1k-16k context) reads the KV at this
  share of the bandwidth;
* attention_efficiency -- prefill attention (2048-token chunks over 0-16k context) reaches
  this share of the bf16 rate;
* mixed_decode_query_rows -- a decode in an iteration with a prefill chunk costs the attention
  FLOPs of this many query rows over its context (the varlen kernel pads its single query to a
  tile), not just the read of its KV;
* layer_overhead_us -- the small per-layer kernels the roofline does not count (norms,
  rotary embedding, activation) at one token.

Its output is quoted in plugins/cost_models/roofline.py (DERIVATION). It then runs
tools/derive_collectives.py (the collectives' bus bandwidths from Vidur's NCCL timings, quoted
in plugins/cost_models/collectives.py); further arguments go to it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from plugins.cost_models.profile_bundle import ProfileBundle  # noqa: E402

SHARED = next((p / "shared" for p in (REPO.parent, REPO.parent.parent) if (p / "shared").is_dir()),
              REPO.parent / "shared") / "calibration" / "llmservingsim"
#: (bundle, preset model name, HF config, GPU: datasheet GB/s, bf16 TFLOPS)
BUNDLES = (
    ("RTXPRO6000/meta-llama/Llama-3.1-8B/bf16", "meta-llama/Llama-3.1-8B.json", 1597, 503.8),
    ("RTXPRO6000/Qwen/Qwen3-32B/bf16", "Qwen/Qwen3-32B.json", 1597, 503.8),
    ("RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16", "Qwen/Qwen3-30B-A3B-Instruct-2507.json", 1597, 503.8),
    ("RTX4090/meta-llama/Llama-3.1-8B/bf16", "meta-llama/Llama-3.1-8B.json", 1008, 165.2),
)
LINEAR = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def shapes(config: dict) -> dict:
    """Parameter counts from a Hugging Face config (untied embeddings, RMSNorm weights)."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    norms = 2 * h + (2 * hd if config.get("model_type", "").startswith("qwen3") else 0)
    experts, k = config.get("num_experts", 0), config.get("num_experts_per_tok", 0)
    if experts:
        expert = 3 * h * config["moe_intermediate_size"]
        router = h * experts
        per_layer, active_layer = attn + norms + router + experts * expert, attn + norms + router + k * expert
        dense_linear = attn  # the experts (and router) are in moe.csv
    else:
        expert = 0
        per_layer = active_layer = attn + norms + 3 * h * config["intermediate_size"]
        dense_linear = attn + 3 * h * config["intermediate_size"]
    embed = 2 * vocab * h + h  # embedding, lm_head, final norm
    return {"layers": layers, "hidden": h, "vocab": vocab, "num_params": layers * per_layer + embed,
            "active_params": layers * active_layer + embed, "layer_linear": dense_linear, "expert": expert,
            "heads": heads, "kv_heads": kv, "head_dim": hd, "experts": experts, "k": k}


def moe_per_rank(bundle, s: dict, tp: int):
    """One MoE layer's time on one rank at T tokens (ms): the profiled cost model's rule
    (experts split over the TP ranks, no expert parallelism)."""
    from plugins.cost_models.collectives import TOPOLOGIES
    from plugins.cost_models.profiled import ProfiledConfig, ProfiledCostModel
    from schedlab.capacity import ModelSpec

    spec = ModelSpec("derive", hf_id=bundle.meta["model"], num_layers=s["layers"], num_kv_heads=s["kv_heads"],
                     head_dim=s["head_dim"], num_params=s["num_params"], hidden_size=s["hidden"], num_experts=s["experts"],
                     experts_per_token=s["k"], active_params=s["active_params"])
    cost = ProfiledCostModel(bundle, spec, ProfiledConfig(profile=str(bundle.root), model="derive", tensor_parallel=tp),
                             topology=TOPOLOGIES["pcie-gen5-host"])  # the link does not enter moe_ms
    return cost.moe_ms


def derive(profiles: Path, configs: Path) -> dict:
    rows = {}
    pooled = {"w": [], "kv": [], "attn": [], "ovh": [], "fit": [], "rows": []}
    for bundle_dir, config_file, gbps, tflops in BUNDLES:
        s = shapes(json.loads((configs / config_file).read_text()))
        root = profiles / bundle_dir
        for tp in (1, 2):
            if not (root / f"tp{tp}").is_dir():
                continue
            b = ProfileBundle(root, tp)
            from plugins.cost_models.profile_bundle import _tables_by_layer, read_csv  # noqa: E402
            path = root / f"tp{tp}" / "dense.csv"
            layers = _tables_by_layer(read_csv(path, ("layer", "tokens", "time_us"), text=("layer",)), "tokens", path)
            linear = lambda T: sum(layers[n](T) for n in LINEAR if n in layers) * 1e-3  # noqa: E731  ms, one layer
            small = lambda T: (b.dense_layer(T) - linear(T))  # noqa: E731
            if s["experts"]:  # one MoE layer on one rank at T tokens, as the profiled cost model reads it
                moe = moe_per_rank(b, s, tp)
                moe_w = s["k"] * s["expert"] * 2 / tp / (moe(1) * gbps * 1e6)
                moe_gemm = 2 * 2048 * s["k"] * s["expert"] / tp / (moe(2048) * tflops * 1e9)
            weight_bytes = 2 * s["layer_linear"] / tp  # active per token, one layer
            bw = gbps * 1e6  # bytes per ms
            peak = tflops * 1e9  # FLOP per ms
            w_eff = weight_bytes / (linear(1) * bw)
            Ts = np.array([1, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048], dtype=float)
            measured = np.array([linear(T) for T in Ts])
            floor = weight_bytes / (bw * w_eff)
            flops = 2 * s["layer_linear"] / tp * Ts
            pooled["fit"].append((Ts, measured, floor, flops / peak))
            # decode attention: n = 128, contexts 1k..16k; KV bytes per layer
            kvb = 2 * max(1, s["kv_heads"] // tp) * s["head_dim"] * 2
            eff_kv = [128 * kd * kvb / (b.attention(0, 0, 128, kd) * bw) for kd in (1024, 2048, 4096, 8192, 16384)]
            # prefill attention: one 2048 chunk over kp cached tokens, causal pairs
            heads = s["heads"] // tp
            eff_attn = [4 * heads * s["head_dim"] * (2048 * kp + 2048 * 2049 / 2) / (b.attention(2048, kp, 0, 0) * peak)
                        for kp in (0, 2048, 4096, 8192)]
            # decodes riding in a prefill iteration: the extra attention time over the prefill
            # alone, as query rows of prefill attention per decode (at that bundle's efficiency)
            eff_a = float(np.mean(eff_attn))
            rows_mixed = [(b.attention(pc, kp, nd, kd) - b.attention(pc, kp, 0, 0)) * peak * eff_a
                          / (4 * heads * s["head_dim"] * nd * kd)
                          for pc in (256, 512, 1024, 2048) for kp in (0, 2048) for nd in (16, 32, 64, 128)
                          for kd in (1024, 2048, 4096)]
            ovh = small(1) * 1e3  # us per layer
            rows[f"{bundle_dir} tp{tp}"] = {
                "weight_read_efficiency": round(w_eff, 3), "kv_read_efficiency": round(float(np.mean(eff_kv)), 3),
                "attention_efficiency": round(float(np.mean(eff_attn)), 3), "layer_overhead_us": round(ovh, 1),
                "mixed_decode_query_rows": round(float(np.median(rows_mixed)), 1),
                "gemm_efficiency_at_2048": round(float(flops[-1] / peak / measured[-1]), 3)}
            if s["experts"]:
                rows[f"{bundle_dir} tp{tp}"].update(moe_ms_1_128_2048_tokens=[round(moe(T), 3) for T in (1, 128, 2048)],
                                                    moe_weight_read_efficiency=round(moe_w, 3),
                                                    moe_gemm_efficiency_at_2048=round(moe_gemm, 3))
            pooled["w"].append(w_eff)
            pooled["kv"].append(float(np.mean(eff_kv)))
            pooled["attn"].append(float(np.mean(eff_attn)))
            pooled["ovh"].append(ovh)
            pooled["rows"].append(float(np.median(rows_mixed)))
    w_eff = float(np.median(pooled["w"]))  # median: small layers that fit in L2 read "faster than DRAM"
    best = None
    for eta in np.arange(0.50, 1.001, 0.01):
        for half in range(0, 513, 8):
            err = 0.0
            for Ts, measured, floor, compute in pooled["fit"]:
                model = np.hypot(floor, compute / (eta * Ts / (Ts + half)))
                err += float(np.sum(np.log(model / measured) ** 2))
            if best is None or err < best[0]:
                best = (err, round(float(eta), 2), half)
    n = sum(len(f[0]) for f in pooled["fit"])
    return {"bundles": rows, "pooled": {
        "weight_read_efficiency": round(w_eff, 2), "kv_read_efficiency": round(float(np.median(pooled["kv"])), 2),
        "attention_efficiency": round(float(np.median(pooled["attn"])), 2),
        "layer_overhead_us": round(float(np.median(pooled["ovh"])), 1),
        "mixed_decode_query_rows": round(float(np.median(pooled["rows"]))),
        "gemm_efficiency": best[1], "gemm_half_tokens": best[2],
        "gemm_fit_rms_log_error": round(math.sqrt(best[0] / n), 3)}}


# === power (schedlab.energy): a section of its own ===================================================
# The utilisation power model's two shares (plugins/power/utilisation.py DERIVATION) and the table
# model's shipped fits (plugins/power/fits.py FITS), from the shipped measurements in
# experiments/data/energy (tools/energy_data.py reads them):
#
#     python tools/derive_roofline.py power
#
# Fitted on the Llama-3.1-8B sweeps of ML.ENERGY v2 (A100-SXM4-40GB and H100, 14 points) and the
# decode seconds of LLMServingSim 2.0's A6000 TP-2 trace; everything else is held out for the
# validation (tools/validate_energy.py). Least squares in relative power error, each point alike.


def derive_power() -> dict:
    from scipy.optimize import least_squares

    import energy_data as ed
    from schedlab_plugins.power.utilisation import UtilisationConfig, build_utilisation

    presets = ed.presets()
    sweeps = [p for p in ed.sweep_points() if p["model"] == ed.TRAINING_MODEL]
    seconds = ed.decode_seconds(2)

    def make(awake, activity):
        return lambda cost: build_utilisation(UtilisationConfig(awake=awake, activity=activity), presets, cost)

    def errors(x):
        power = make(*x)
        out = [ed.predict_point(p, power, presets)[0] / p["power_w"] - 1 for p in sweeps]
        return out + [ed.predict_second(s, power, 2, presets) / s["power_w"] - 1 for s in seconds]

    fit = least_squares(errors, [0.2, 1.0], bounds=([0.0, 0.0], [1.0, 5.0]))
    residual = np.asarray(errors(fit.x))
    fits = {}
    for gpu in sorted({p["gpu"] for p in sweeps}):
        mine = sorted((p["avg_bs"], p["power_w"]) for p in sweeps if p["gpu"] == gpu)
        fits[f"mlenergy-{gpu}-llama-3.1-8b"] = {"gpu": gpu, "by": "sequences",
                                                 "points": [[round(b, 1), round(w, 1)] for b, w in mine]}
    return {"awake": round(float(fit.x[0]), 3), "activity": round(float(fit.x[1]), 3),
            "points": len(residual), "sweep_points": len(sweeps), "a6000_seconds": len(seconds),
            "rms_relative_error": round(float(np.sqrt(np.mean(residual ** 2))), 3), "fits": fits}


def main(argv: list[str]) -> int:
    if argv[:1] == ["power"]:
        sys.path.insert(0, str(REPO / "tools"))
        result = derive_power()
        fits = result.pop("fits")
        print("utilisation power model:", result)
        for name, fit in fits.items():
            print(f"table fit {name}: {fit}")
        return 0
    profiles = Path(argv[0]) if argv else SHARED / "profiler" / "perf"
    configs = Path(argv[1]) if len(argv) > 1 else SHARED / "configs" / "model"
    for name in ("meta-llama/Llama-3.1-8B.json", "Qwen/Qwen3-32B.json", "Qwen/Qwen3-30B-A3B-Instruct-2507.json"):
        s = shapes(json.loads((configs / name).read_text()))
        print(f"{name}: num_params={s['num_params']:,} active_params={s['active_params']:,}")
    result = derive(profiles, configs)
    for name, row in result["bundles"].items():
        print(f"{name}: {row}")
    print("pooled:", result["pooled"])
    # The collectives' bus bandwidths come from a sibling derivation over Vidur's NCCL timings.
    import derive_collectives

    print("\n--- collectives (tools/derive_collectives.py) ---")
    return derive_collectives.main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
