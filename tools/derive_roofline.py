"""Derive the roofline cost model's efficiencies, per GPU, from measured per-operator profiles.

    python tools/derive_roofline.py [--table] [--write-subset DIR] [--profiles DIR] [--configs DIR]
                                    [--vidur DIR] [-- COLLECTIVES_ARGS...]
    python tools/derive_roofline.py power      (the power section, at the end of this file)

Two sets of measurements (../shared/calibration, MIT):

* LLMServingSim's bundles, measured inside vLLM 0.19 (``llmservingsim/profiler/perf``): RTX PRO 6000
  Blackwell Server Edition with Llama-3.1-8B, Qwen3-32B, Qwen3-30B-A3B at TP 1 and 2; RTX 4090
  with Llama-3.1-8B at TP 1 -- every operator of a decoder layer, attention included;
* Vidur's linear-layer profiles (``vidur/profiling/compute``): H100, A100 and A40 with six to
  eight models at TP 1, 2, 4, 8 -- the four GEMMs of a layer (QKV, output, gate/up, down) and the
  small operators (norms, rotary embedding, activation, residual add), 1 to 4,096 tokens.

For every GPU it fits, on the dense part of one decoder layer on one rank (its four GEMMs and
the small operators between them -- everything but attention), the roofline's linear part::

    dense_ms(T) = layer_overhead + hypot(weight bytes / (BW * weight_read_efficiency),
                                         2 * params * T / (TFLOPS * mfu * T / (T + gemm_half_tokens)))

BW and TFLOPS are the datasheet's. ``weight_read_efficiency`` and ``layer_overhead`` (the
GEMMs' launch and tail and the small operators at one token, microseconds) come from one token
across all the GPU's series (least squares in relative time: a GEMV of a small layer does not
reach the bandwidth of a large one, a fixed cost does); ``mfu`` and ``gemm_half_tokens`` from
every token count (least squares in log time), so they also carry the small operators' growth
with the tokens (memory-bound, like the GEMMs' compute it grows with T). A layer whose weights
fit in the GPU's L2 cache is left out of the fit (a one-layer profile reads the same weights
again and again: LLMServingSim's Qwen3-30B-A3B attention at TP 1 and 2). A GPU with fewer than
three layer sizes (the RTX 4090: one model) takes the other GPUs' median ``layer_overhead``.

From LLMServingSim's bundles alone, per bundle and per GPU: decode attention (16-256 decodes
over 256-16k of context) as ``attention_layer_us`` per layer (its kernels' launch and the
split-KV reduction: the same whatever the batch), ``decode_attention_us`` per decode and layer,
and the KV read at ``kv_read_efficiency`` of the bandwidth;
``attention_efficiency`` (prefill attention, 2,048-token chunks over 0-8k cached tokens, reaches
this share of the bf16 rate) and the mixed-batch decode penalty: a decode that shares a step
with a prefill chunk costs the attention FLOPs of ``mixed_decode_query_rows`` query rows over
its context plus ``mixed_decode_context_offset`` tokens (the varlen kernel pads its single
query to a tile, and the tile has a fixed cost), fitted over 256-4,096-token contexts; and
``decode_skew_alpha`` / ``mixed_skew_alpha``, the median share of the gap to every decode at the
longest context that a batch of uneven decode contexts takes (the skew shots, ``skew.csv``). Vidur's
public profiles have no attention, so these cannot be checked on H100, A100 or A40; they are
pooled from the two cards that have them (both give 58-68 rows and 240-310 tokens).

From the only MoE bundle (Qwen3-30B-A3B at TP 1, ``moe.csv``: 1-2,048 tokens over 8-128 active
experts), the routed experts relative to the same GPU's dense fit: ``expert_layer_us`` a MoE
layer (routing, sorting the tokens by expert, launches), the experts' weights read at
``expert_read_share`` of the dense read and their GEMMs at ``expert_gemm_share`` of the dense
curve at as many rows per expert (the fused MoE kernel against cuBLAS). GPUs without a MoE
measurement of their own take each setting's median over this fit and ``tools/derive_experts.py``'s.

Output: the per-GPU fits quoted in ``plugins/presets.py`` (``MEASURED_EFFICIENCY``), the
pooled values quoted in ``plugins/cost_models/roofline.py`` (``DERIVATION``, GPUs measured by
nothing), and the parameter counts of the three LLMServingSim model presets. ``--table`` prints,
per GPU, the fitted model against the measured dense part of a layer (the README table);
``--write-subset DIR`` writes the small subset of Vidur's CSVs the tests check the fit on. Then it
runs ``tools/derive_collectives.py`` (the collectives' bus bandwidths from Vidur's NCCL timings,
quoted in ``plugins/cost_models/collectives.py``) with the arguments after ``--``, after
``tools/derive_latent_attention.py`` (latent attention's decode rate, from vLLM's measured MLA
kernels: ``MEASURED_LATENT_DECODE`` and ``LATENT_DECODE_POOLED``) and ``tools/derive_experts.py``
(the routed experts on four more GPUs, from vLLM's measured fused MoE kernel: ``MEASURED_EXPERTS``,
``EXPERTS_POOLED``, and with the profile above the pooled expert settings).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from plugins.cost_models.profile_bundle import ProfileBundle  # noqa: E402
from plugins.cost_models.roofline import QUERY_TILE  # noqa: E402

sys.path.insert(0, str(REPO / "tools"))
import derive_experts  # noqa: E402

CALIBRATION = next((p / "shared" for p in (REPO.parent, REPO.parent.parent) if (p / "shared").is_dir()),
                   REPO.parent / "shared") / "calibration"
SHARED = CALIBRATION / "llmservingsim"
VIDUR = CALIBRATION / "vidur" / "profiling" / "compute"
SUBSET = REPO / "tests" / "data" / "vidur"

#: GPU preset -> (datasheet GB/s, dense bf16 TFLOPS, L2 cache MB), for every profiled GPU.
GPUS = {"rtx-pro-6000-server": (1597, 503.8, 128), "rtx-4090": (1008, 165.2, 72),
        "h100-80gb": (3350, 989, 50), "a100-80gb": (2039, 312, 40), "a40": (696, 149.7, 6)}
#: Vidur's GPU folders and the presets they measured (H100 80 GB SXM, A100 80 GB, A40).
VIDUR_GPUS = {"h100": "h100-80gb", "a100": "a100-80gb", "a40": "a40"}
#: (bundle, HF config, GPU preset)
BUNDLES = (
    ("RTXPRO6000/meta-llama/Llama-3.1-8B/bf16", "meta-llama/Llama-3.1-8B.json", "rtx-pro-6000-server"),
    ("RTXPRO6000/Qwen/Qwen3-32B/bf16", "Qwen/Qwen3-32B.json", "rtx-pro-6000-server"),
    ("RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16", "Qwen/Qwen3-30B-A3B-Instruct-2507.json", "rtx-pro-6000-server"),
    ("RTX4090/meta-llama/Llama-3.1-8B/bf16", "meta-llama/Llama-3.1-8B.json", "rtx-4090"),
)
VIDUR_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
VIDUR_SMALL = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
#: Token counts the fits and the table use (profiled by both sources).
TOKENS = (1, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


@dataclass
class Series:
    """The dense part of one decoder layer on one rank (its GEMMs and the small operators
    between them: everything but attention), measured at several token counts."""

    gpu: str
    name: str
    weight_bytes: float     # bf16 weights of the layer's GEMMs on one rank
    flops_per_token: float  # 2 x those parameters
    tokens: np.ndarray
    dense_ms: np.ndarray


# --- reading ----------------------------------------------------------------------------------


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


def vidur_rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def vidur_series(root: Path) -> list[Series]:
    """Every (GPU, model, TP) of Vidur's ``<gpu>/<org>/<model>/mlp.csv`` files under ``root``
    (times are ms; a row repeated for a token count counts by its median)."""
    out = []
    for folder, gpu in VIDUR_GPUS.items():
        for path in sorted((root / folder).glob("*/*/mlp.csv")):
            rows = vidur_rows(path)
            by: dict[tuple, list] = {}
            for r in rows:
                by.setdefault((int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])), []).append(r)
            r0 = rows[0]
            h, heads, kv = int(r0["n_embd"]), int(r0["n_head"]), int(r0["n_kv_head"])
            ffn, gated = int(r0["n_expanded_embd"]), r0["use_gated_mlp"] == "True"
            hd = h // heads
            params = h * (heads + 2 * kv) * hd + heads * hd * h + h * ffn * (2 if gated else 1) + ffn * h
            for tp in sorted({k[1] for k in by}):
                tokens = [t for t in TOKENS if (t, tp) in by]
                if 1 not in tokens:
                    continue

                def median_ms(t, ops):
                    return statistics.median(sum(float(r[f"time_stats.{o}.median"]) for o in ops
                                                 if f"time_stats.{o}.median" in r) for r in by[(t, tp)])

                out.append(Series(gpu, f"{path.parent.name} tp{tp}", 2 * params / tp, 2 * params / tp,
                                  np.array(tokens, float),
                                  np.array([median_ms(t, VIDUR_GEMMS + VIDUR_SMALL) for t in tokens])))
    return out


def bundle_series(profiles: Path, configs: Path) -> list[Series]:
    """The dense part of a layer of every LLMServingSim bundle and TP degree (``dense.csv``)."""
    out = []
    for bundle_dir, config_file, gpu in BUNDLES:
        s = shapes(json.loads((configs / config_file).read_text()))
        root = profiles / bundle_dir
        for tp in (1, 2):
            if not (root / f"tp{tp}").is_dir():
                continue
            bundle = ProfileBundle(root, tp)
            tokens = [t for t in TOKENS if t <= 2048]
            out.append(Series(gpu, f"{bundle_dir.split('/')[0]} {bundle_dir.split('/')[2]} tp{tp}", 2 * s["layer_linear"] / tp,
                              2 * s["layer_linear"] / tp, np.array(tokens, float),
                              np.array([bundle.dense_layer(t) for t in tokens])))
    return out


# --- the linear-layer fit -----------------------------------------------------------------------


def fitted(series: list[Series], gpu: str) -> list[Series]:
    """The GPU's series the fit uses: those whose weights do not fit in its L2 cache."""
    return [s for s in series if s.gpu == gpu and s.weight_bytes > GPUS[gpu][2] * 1e6]


def fit_linear(series: list[Series], gpu: str, fixed_ms: float | None = None) -> dict:
    """The roofline's linear part for one GPU (see the module docstring): the weight read and
    the fixed time from one token (least squares in relative time), the GEMM curve from every
    token count (least squares in log time), each holding the other's numbers, in turn until
    they settle. With ``fixed_ms`` the fixed time is held (a GPU with too few layer sizes to
    tell it from the bandwidth)."""
    from scipy.optimize import least_squares

    gbps, tflops, _ = GPUS[gpu]
    bw, peak = gbps * 1e6, tflops * 1e9  # bytes and FLOP per ms
    used = fitted(series, gpu)
    w, fixed, mfu, half = 0.9, (fixed_ms if fixed_ms is not None else 0.01), 0.7, 32.0
    for _ in range(8):
        def one_token(x):
            c = x[1] if fixed_ms is None else fixed_ms
            return np.array([linear_ms(s, x[0], c, mfu, half, bw, peak, tokens=[1])[0] / s.dense_ms[0] - 1.0
                             for s in used])

        w, fixed = least_squares(one_token, [w, fixed], bounds=([0.1, 0.0], [1.5, 1.0])).x
        fixed = fixed if fixed_ms is None else fixed_ms

        def curve(x):
            return np.concatenate([np.log(linear_ms(s, w, fixed, x[0], x[1], bw, peak) / s.dense_ms) for s in used])

        fit = least_squares(curve, [mfu, half], bounds=([0.1, 0.0], [1.0, 4096.0]))
        mfu, half = fit.x
    points = sum(len(s.tokens) for s in used)
    return {"weight_read_efficiency": round(float(w), 3), "layer_overhead_us": round(float(fixed) * 1e3, 1),
            "mfu": round(float(mfu), 2), "gemm_half_tokens": round(float(half)),
            "rms_log_error": round(math.sqrt(float(np.sum(fit.fun ** 2)) / points), 3),
            "series": len(used), "left_out_in_l2": len([s for s in series if s.gpu == gpu]) - len(used),
            "fixed_from": "this GPU" if fixed_ms is None else "the other GPUs' median"}


def linear_ms(s: Series, w: float, fixed_ms: float, mfu: float, half: float, bw: float, peak: float,
              tokens=None) -> np.ndarray:
    """The fitted model's time of series ``s`` (ms) at its token counts (or ``tokens``)."""
    t = s.tokens if tokens is None else np.asarray(tokens, float)
    return fixed_ms + np.hypot(s.weight_bytes / (bw * w), s.flops_per_token * t / (peak * mfu * t / (t + half)))


def model_vs_measured(series: list[Series], fits: dict, pooled: dict) -> dict:
    """Per GPU: the fitted model's error against every measured point (the README table), and
    the median error of the pooled defaults on the same points (``"pooled"``)."""
    out = {}
    for gpu, fit in fits.items():
        gbps, tflops, _ = GPUS[gpu]
        errors = {"1": [], "16-256": [], "512-4096": [], "pooled": []}
        for s in fitted(series, gpu):
            model = linear_ms(s, fit["weight_read_efficiency"], fit["layer_overhead_us"] * 1e-3, fit["mfu"],
                              fit["gemm_half_tokens"], gbps * 1e6, tflops * 1e9)
            for t, m, g in zip(s.tokens, model, s.dense_ms):
                band = "1" if t == 1 else "16-256" if 16 <= t <= 256 else "512-4096" if t >= 512 else None
                if band:
                    errors[band].append(100.0 * (m / g - 1.0))
            base = linear_ms(s, pooled["weight_read_efficiency"], pooled["layer_overhead_us"] * 1e-3, pooled["mfu"],
                             pooled["gemm_half_tokens"], gbps * 1e6, tflops * 1e9)
            errors["pooled"].extend(100.0 * (base / s.dense_ms - 1.0))
        out[gpu] = {band: (round(float(np.median(np.abs(e))), 1), round(float(np.max(np.abs(e))), 1), len(e))
                    for band, e in errors.items() if e}
    return out


# --- attention (LLMServingSim's bundles) ------------------------------------------------------


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


def attention_parameters(profiles: Path, configs: Path) -> dict:
    """Per bundle: KV read efficiency, prefill attention efficiency, mixed-batch query rows
    (and the MoE experts' efficiencies for the MoE bundle)."""
    rows = {}
    for bundle_dir, config_file, gpu in BUNDLES:
        s = shapes(json.loads((configs / config_file).read_text()))
        gbps, tflops, _ = GPUS[gpu]
        bw, peak = gbps * 1e6, tflops * 1e9
        root = profiles / bundle_dir
        for tp in (1, 2):
            if not (root / f"tp{tp}").is_dir():
                continue
            b = ProfileBundle(root, tp)
            kvb = 2 * max(1, s["kv_heads"] // tp) * s["head_dim"] * 2  # KV bytes per token and layer
            kv_eff, decode_us, attention_us = decode_attention(b, kvb, bw)
            heads = s["heads"] // tp
            eff_attn = [4 * heads * s["head_dim"] * (2048 * kp + 2048 * 2049 / 2) / (b.attention(2048, kp, 0, 0) * peak)
                        for kp in (0, 2048, 4096, 8192)]
            # decodes riding in a prefill iteration: the extra attention time over the prefill
            # alone = query rows of prefill attention (at that bundle's efficiency) over the
            # decode's context plus an offset (its tile's fixed cost, in context tokens)
            eff_a = float(np.mean(eff_attn))
            query_rows, offset, empty_ns = mixed_decode_penalty(b, heads * s["head_dim"] * 4 / (peak * eff_a), heads)
            row = {"gpu": gpu, "kv_read_efficiency": round(kv_eff, 3), "decode_attention_us": round(decode_us, 3),
                   "attention_layer_us": round(attention_us, 1),
                   "attention_efficiency": round(eff_a, 3), "mixed_decode_query_rows": round(query_rows, 1),
                   "mixed_decode_context_offset": round(offset), "empty_tile_ns": round(empty_ns, 2)}
            if s["experts"]:
                moe = moe_per_rank(b, s, tp)
                row.update(moe_ms_1_128_2048_tokens=[round(moe(t), 3) for t in (1, 128, 2048)],
                           moe_weight_read_efficiency=round(s["k"] * s["expert"] * 2 / tp / (moe(1) * bw), 3),
                           moe_gemm_efficiency_at_2048=round(2 * 2048 * s["k"] * s["expert"] / tp / (moe(2048) * peak), 3))
            hardware, _, model = bundle_dir.split("/")[:3]
            rows[f"{hardware} {model} tp{tp}"] = row
    return rows


def decode_attention(bundle, kv_bytes: float, bytes_per_ms: float) -> tuple[float, float, float]:
    """``(kv_read_efficiency, us per decode, us per layer)``: one layer's decode attention takes
    ``fixed + decodes x per_decode + KV bytes / (BW x efficiency)`` (least squares in relative
    time over 16-256 decodes, contexts 256-16,384)."""
    x, y = [], []
    for nd in (16, 32, 64, 128, 256):
        for kd in (256, 512, 1024, 2048, 4096, 8192, 16384):
            x.append([nd * kd * kv_bytes / bytes_per_ms, nd, 1.0])
            y.append(bundle.attention(0, 0, nd, kd))
    x, y = np.array(x), np.array(y)
    (read, per_decode, fixed), *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)
    return float(1.0 / read), float(per_decode * 1e3), float(fixed * 1e3)


def mixed_decode_penalty(bundle, ms_per_row_token: float, heads: int) -> tuple[float, float, float]:
    """``(rows, offset, empty_tile_ns)``: decodes in a step with a prefill chunk add ``rows x
    (context + offset)`` row-tokens of attention each, and the thread blocks the varlen kernel
    launches for them and that exit at once: its grid is sized by the longest query, so each
    decode gets ``ceil(chunk / 128) - 1`` empty query tiles per head (least squares in relative
    time over chunks of 256-2,048 tokens after 0 or 2,048 cached ones, 16-128 decodes,
    contexts 256-4,096)."""
    x, y = [], []
    for pc in (256, 512, 1024, 2048):
        for kp in (0, 2048):
            alone = bundle.attention(pc, kp, 0, 0)
            for nd in (16, 32, 64, 128):
                for kd in (256, 512, 1024, 2048, 4096):
                    x.append([nd * kd * ms_per_row_token, nd * ms_per_row_token,
                              nd * (math.ceil(pc / QUERY_TILE) - 1) * heads * 1e-6])
                    y.append(bundle.attention(pc, kp, nd, kd) - alone)
    x, y = np.array(x), np.array(y)
    (rows, rows_offset, empty_ns), *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)
    return float(rows), float(rows_offset / rows), float(empty_ns)


def moe_points(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens, experts, ms)``: the points of a bundle's ``moe.csv`` (times there are us)."""
    with open(path, newline="") as fh:
        rows = [(float(r["tokens"]), float(r["activated_experts"]), float(r["time_us"]) * 1e-3)
                for r in csv.DictReader(fh)]
    return tuple(np.array(column) for column in zip(*rows))


def expert_layer_ms(x, tokens, experts, s: dict, dense: dict, bw: float, peak: float) -> np.ndarray:
    """The roofline's MoE layer at ``(expert_layer_us, expert_read_share, expert_gemm_share)``:
    a fixed time, then the experts' weights read and their (token, expert) pairs computed,
    relative to the GPU's dense fit (``dense``: its weight read and GEMM curve)."""
    fixed_us, read_share, gemm_share = x
    rows = tokens * s["k"] / experts
    read = experts * s["expert"] * 2 / (bw * dense["weight_read_efficiency"] * read_share)
    gemm = dense["mfu"] * rows / (rows + dense["gemm_half_tokens"]) * gemm_share
    return fixed_us * 1e-3 + np.hypot(read, 2 * s["expert"] * s["k"] * tokens / (peak * gemm))


def fit_experts(moe_csv: Path, s: dict, gpu: str, dense: dict) -> dict:
    """The experts' settings from a MoE bundle's ``moe.csv`` (``s``: its model's :func:`shapes`;
    ``dense``: the GPU's linear fit, which the shares are relative to): least squares in log
    time over the points whose active experts' weights do not fit in the L2 cache (a one-layer
    profile of 8 experts, 75 MB, reads them from L2 again and again)."""
    from scipy.optimize import least_squares

    gbps, tflops, l2_mb = GPUS[gpu]
    tokens, experts, ms = moe_points(moe_csv)
    used = experts * s["expert"] * 2 > l2_mb * 1e6

    def residuals(x):
        return np.log(expert_layer_ms(x, tokens[used], experts[used], s, dense, gbps * 1e6, tflops * 1e9) / ms[used])

    fit = least_squares(residuals, [20.0, 1.0, 0.7], bounds=([0.0, 0.1, 0.05], [200.0, 1.5, 1.5]))
    no_fixed = least_squares(lambda x: residuals([0.0, *x]), [1.0, 0.7], bounds=([0.1, 0.05], [1.5, 1.5]))
    # one expert size (Qwen3-30B-A3B's at TP 1): a time per expert is not told from the read
    return {"gpu": gpu, "expert_layer_us": round(float(fit.x[0]), 1), "expert_us": 0.0,
            "expert_read_share": round(float(fit.x[1]), 3),
            "expert_gemm_share": round(float(fit.x[2]), 2), "points": int(used.sum()),
            "rms_log_error": round(math.sqrt(float(np.mean(fit.fun ** 2))), 3),
            "rms_log_error_without_fixed_time": round(math.sqrt(float(np.mean(no_fixed.fun ** 2))), 3)}


def skew_alphas(root: Path) -> dict:
    """Uneven decode contexts, per bundle (``skew.csv``: decode batches whose ``nb`` longest
    contexts are ``skew`` times the others', timed as they are (``t_skew``), with every context
    at the mean (``t_mean``) and every one at the longest (``t_max``)): the median share of the
    gap from the mean to the longest that the batch takes, ``alpha = (t_skew - t_mean) /
    (t_max - t_mean)``, of decode-only batches and of decodes beside a prefill chunk
    (FlashAttention 2's varlen kernel, which has no split-KV for them: the longest context's
    tiles finish last)."""
    out = {}
    for bundle_dir, _, gpu in BUNDLES:
        for tp in (1, 2):
            path = root / bundle_dir / f"tp{tp}" / "skew.csv"
            if not path.is_file():
                continue
            alphas: dict[str, list] = {"pure": [], "mixed": []}
            with open(path, newline="") as fh:
                for row in csv.DictReader(fh):
                    try:
                        alphas[row["regime"]].append(float(row["alpha"]))
                    except (KeyError, ValueError):  # a shot that failed has no timings
                        continue
            out[f"{bundle_dir.split('/')[0]} {bundle_dir.split('/')[2]} tp{tp}"] = {
                "gpu": gpu, "decode_skew_alpha": float(np.median(alphas["pure"])),
                "mixed_skew_alpha": float(np.median(alphas["mixed"]))}
    return out


def pooled_skew(rows: dict) -> dict:
    return {k: round(float(np.median([r[k] for r in rows.values()])), 3)
            for k in ("decode_skew_alpha", "mixed_skew_alpha")}


def pooled_attention(rows: dict, gpu: str | None = None) -> dict:
    chosen = [r for r in rows.values() if gpu is None or r["gpu"] == gpu]
    return {"kv_read_efficiency": round(float(np.median([r["kv_read_efficiency"] for r in chosen])), 2),
            "decode_attention_us": round(float(np.median([r["decode_attention_us"] for r in chosen])), 2),
            "attention_layer_us": round(float(np.median([r["attention_layer_us"] for r in chosen])), 1),
            "attention_efficiency": round(float(np.median([r["attention_efficiency"] for r in chosen])), 2),
            "mixed_decode_query_rows": round(float(np.median([r["mixed_decode_query_rows"] for r in chosen]))),
            "mixed_decode_context_offset": round(float(np.median([r["mixed_decode_context_offset"] for r in chosen])),
                                                 -1),
            "empty_tile_ns": round(float(np.median([r["empty_tile_ns"] for r in chosen])), 1)}


# --- the whole derivation -----------------------------------------------------------------------


def derive(profiles: Path, configs: Path, vidur: Path) -> dict:
    series = bundle_series(profiles, configs) + vidur_series(vidur)
    # The fixed time needs several layer sizes on a GPU (three models or TP degrees) to be told
    # from the bandwidth; a GPU with fewer takes the median of the others'.
    separable = [gpu for gpu in GPUS if len({s.weight_bytes for s in fitted(series, gpu)}) >= 3]
    linear = {gpu: fit_linear(series, gpu) for gpu in separable}
    fixed = float(np.median([fit["layer_overhead_us"] for fit in linear.values()])) * 1e-3
    for gpu in GPUS:
        if gpu not in linear and fitted(series, gpu):
            linear[gpu] = fit_linear(series, gpu, fixed_ms=fixed)
    linear = {gpu: linear[gpu] for gpu in GPUS if gpu in linear}
    attention = attention_parameters(profiles, configs)
    per_gpu = {gpu: dict(fit) for gpu, fit in linear.items()}
    for gpu in per_gpu:
        if any(r["gpu"] == gpu for r in attention.values()):
            per_gpu[gpu].update(pooled_attention(attention, gpu))
    keys = ("weight_read_efficiency", "layer_overhead_us", "mfu", "gemm_half_tokens")
    pooled = {k: round(float(np.median([fit[k] for fit in linear.values()])), 3 if k != "gemm_half_tokens" else 0)
              for k in keys}
    pooled.update(pooled_attention(attention))
    skew = skew_alphas(profiles)
    pooled.update(pooled_skew(skew))  # kernel behaviour measured on two cards: every GPU takes it
    # LLMServingSim's Qwen3-30B-A3B at TP 1 is the only MoE profile
    bundle_dir, config_file, gpu = next(b for b in BUNDLES if (profiles / b[0] / "tp1" / "moe.csv").is_file())
    experts = fit_experts(profiles / bundle_dir / "tp1" / "moe.csv",
                          shapes(json.loads((configs / config_file).read_text())), gpu, linear[gpu])
    per_gpu[experts["gpu"]].update({k: experts[k] for k in derive_experts.KEYS})
    # GPUs without a MoE measurement: the median over this profile and vLLM's fused MoE kernel
    # timed on four more GPUs (tools/derive_experts.py)
    pooled.update(derive_experts.derive(derive_experts.read_subset(), profiled=experts)["pooled"]["bf16"])
    return {"series": series, "per_gpu": per_gpu, "attention": attention, "skew": skew, "pooled": pooled,
            "experts": experts,
            "table": model_vs_measured(series, linear, pooled)}


def write_subset(vidur: Path, out: Path) -> None:
    """Llama-2-7B on the three GPUs and Llama-2-70B on H100 (TP 1, 2, 4, 8 each), at the fit's
    token counts: one row per (tokens, TP), with Vidur's columns that the fit reads (each
    operator's median, the model's shape)."""
    picks = [("h100", "meta-llama/Llama-2-7b-hf"), ("h100", "meta-llama/Llama-2-70b-hf"),
             ("a100", "meta-llama/Llama-2-7b-hf"), ("a40", "meta-llama/Llama-2-7b-hf")]
    for folder, model in picks:
        rows = vidur_rows(vidur / folder / model / "mlp.csv")
        seen, kept = set(), []
        for r in rows:
            key = (int(r["num_tokens"]), int(r["num_tensor_parallel_workers"]))
            if key[0] in TOKENS and key not in seen:
                seen.add(key)
                kept.append(r)
        target = out / folder / model / "mlp.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        columns = [c for c in rows[0] if not c.startswith("time_stats.") or c.endswith(".median")]
        with open(target, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(sorted(kept, key=lambda r: (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))))


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
# The tail after the last iteration (schedlab/energy/idle.py, TAIL_S in plugins/power/common.py):
# its time constant from how nvidia-smi read the power fall at the end of the TP-2 trace's three
# pulses (TP 1 held out), each reading the mean over the second before it.


def tail_reading(t_s, end_s: float, busy_w: float, plateau_w: float, tail_s: float):
    """nvidia-smi's reading at ``t_s`` (the mean over the second before) of a GPU at ``busy_w``
    until ``end_s`` whose power then relaxes to ``plateau_w``: ``plateau + (busy - plateau) x
    exp(-s / tail_s)``, in closed form."""
    a, b = np.asarray(t_s) - 1.0, np.asarray(t_s)
    busy = busy_w * np.clip(np.minimum(b, end_s) - a, 0.0, 1.0)
    a, b = np.maximum(a, end_s), np.maximum(b, end_s)
    decay = np.exp(-(a - end_s) / tail_s) - np.exp(-(b - end_s) / tail_s)
    return busy + plateau_w * (b - a) + (busy_w - plateau_w) * tail_s * decay


def derive_tail() -> dict:
    """The tail's time constant: least squares over the fresh readings around the TP-2 pulses'
    ends, each pulse's end (within a second of the first sample without utilisation: nvidia-smi
    averages utilisation too) fitted with it."""
    from scipy.optimize import least_squares

    import energy_data as ed

    ends = ed.pulse_ends(2)

    def residuals(x):
        tail_s, offsets = x[0], x[1:]
        return np.concatenate([tail_reading(e["t_s"], off, e["busy_w"], e["plateau_w"], tail_s) - e["power_w"]
                               for e, off in zip(ends, offsets)])

    n = len(ends)
    fit = least_squares(residuals, [1.0] + [0.0] * n, bounds=([0.01] + [-1.5] * n, [10.0] + [1.5] * n))
    return {"tail_s": round(float(fit.x[0]), 2), "pulse_ends": n,
            "rms_w": round(float(np.sqrt(np.mean(fit.fun ** 2))), 1)}


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
        mine = sorted((p["avg_bs"], p["power_w"], p["cycle_ms"]) for p in sweeps if p["gpu"] == gpu)
        fits[f"mlenergy-{gpu}-llama-3.1-8b"] = {"gpu": gpu, "by": "sequences",
                                                 "points": [[round(b, 1), round(w, 1)] for b, w, _ in mine],
                                                 "cycle_ms": [round(c, 1) for _, _, c in mine]}
    # v3: Qwen3-8B, LM Arena chat, one GPU, saturated (energy_data.v3_points), per GPU
    for gpu in ("h100-80gb", "b200"):
        mine = sorted((p["batch"], p["power_w"]) for p in ed.v3_points() if p["model"] == "qwen3-8b"
                      and p["gpu"] == gpu and p["task"] == "lm-arena-chat" and p["tp"] == 1)
        fits[f"mlenergy-v3-{gpu}-qwen3-8b"] = {"gpu": gpu, "by": "sequences",
                                                "points": [[round(b, 1), round(w, 1)] for b, w in mine]}
    return {"awake": round(float(fit.x[0]), 3), "activity": round(float(fit.x[1]), 3),
            "points": len(residual), "sweep_points": len(sweeps), "a6000_seconds": len(seconds),
            "rms_relative_error": round(float(np.sqrt(np.mean(residual ** 2))), 3), "fits": fits}


# The additive power model (plugins/power/additive.py DERIVATION): an energy roofline -- static
# (awake) share + energy per byte by memory family (HBM, GDDR) + energy per FLOP as a share of each
# GPU's datasheet (board - idle) / peak bf16 FLOP/s. Its named TRAINING set (each point alike,
# least squares in relative power error):
#   * the ML.ENERGY v2 Llama-3.1-8B sweeps (A100-SXM4-40GB, H100; 14 points), as derive_power;
#   * the decode seconds of the A6000 TP-2 trace (its awake share is the measured standby, 89 W);
#   * the saturated ML.ENERGY v3 dense points of Qwen3-8B and Qwen3-14B on the H100
#     (energy_data.V3_TRAINING; each a decode step of its batch lasting its median ITL);
# then the GDDR energy per byte alone, refitted on the A6000 TP-2 pulses as schedlab replays them
# (the mean power of each pulse window, validate_energy.replay with the log's step overhead): the
# pulses' prefills and decode under the simulated timing, which the decode seconds do not see.
# HELD OUT (tools/validate_mlenergy_v3.py, tools/validate_energy.py): every other v3 dense point --
# Qwen3-32B, Llama-3.1-8B and the 70B Llamas on the H100, every B200 point -- the A6000 TP-1 trace,
# and the other 47 v2 sweeps.


def derive_additive() -> dict:
    from scipy.optimize import least_squares, minimize_scalar

    import energy_data as ed
    from schedlab_plugins.power import additive as ad

    presets = ed.presets()
    sweeps = [p for p in ed.sweep_points() if p["model"] == ed.TRAINING_MODEL]
    seconds = ed.decode_seconds(2)
    v3 = [p for p in ed.v3_points() if p["training"]]
    saved = dict(ad.DERIVATION)

    def use(awake, hbm, gddr, compute):
        ad.DERIVATION.update(awake=awake, hbm_pj_per_byte=hbm, gddr_pj_per_byte=gddr, compute=compute)
        return lambda cost: ad.build_additive(ad.AdditiveConfig(compute=compute), presets, cost)

    def errors(x):
        power = use(*x)
        return ([ed.predict_point(p, power, presets)[0] / p["power_w"] - 1 for p in sweeps]
                + [ed.predict_second(s, power, 2, presets) / s["power_w"] - 1 for s in seconds]
                + [ed.predict_v3(p, power, presets)[0] / p["power_w"] - 1 for p in v3])

    try:
        fit = least_squares(errors, [0.2, 60.0, 300.0, 0.5], bounds=([0, 0, 0, 0], [1, 2000, 5000, 5]))
        residual = np.asarray(errors(fit.x))
        awake, hbm, gddr, compute = (float(v) for v in fit.x)
        import validate_energy as ve

        trace, overhead = ed.trace(2), ve.step_overhead_ms(2)

        def pulse_error(g):
            use(awake, hbm, g, compute)
            report = ve.pulse_report(2, ve.replay(2, overhead, {"kind": "additive", "compute": compute}), trace)
            return sum(w["error"] ** 2 for w in report["windows"] if w["window"].startswith("pulse"))

        pulse = minimize_scalar(pulse_error, bounds=(0.5 * gddr, 1.5 * gddr), method="bounded",
                                options={"xatol": 1.0})
    finally:
        ad.DERIVATION.clear()
        ad.DERIVATION.update(saved)
    return {"awake": round(awake, 3), "hbm_pj_per_byte": round(hbm, 1), "gddr_pj_per_byte": round(float(pulse.x), 1),
            "compute": round(compute, 2), "gddr_pj_per_byte_before_pulses": round(gddr, 1),
            "points": len(residual), "sweep_points": len(sweeps), "a6000_seconds": len(seconds), "v3_points": len(v3),
            "rms_relative_error": round(float(np.sqrt(np.mean(residual ** 2))), 3)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["power"]:
        sys.path.insert(0, str(REPO / "tools"))
        result = derive_power()
        fits = result.pop("fits")
        print("utilisation power model:", result)
        print("additive power model:", derive_additive())
        print("tail after the last iteration:", derive_tail())
        for name, fit in fits.items():
            print(f"table fit {name}: {fit}")
        return 0
    own, _, collectives_args = (argv[:argv.index("--")], None, argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, None, [])
    parser = argparse.ArgumentParser(prog="derive_roofline.py", description=__doc__.split("\n\n")[0],
                                     epilog="derive_roofline.py power: the power models' fits instead (ML.ENERGY's "
                                            "sweeps and the A6000 traces); arguments after -- go to "
                                            "derive_collectives.py")
    parser.add_argument("--profiles", type=Path, default=SHARED / "profiler" / "perf",
                        help="LLMServingSim's profiler/perf folder")
    parser.add_argument("--configs", type=Path, default=SHARED / "configs" / "model", help="its model configs")
    parser.add_argument("--vidur", type=Path, default=VIDUR, help="Vidur's profiling/compute folder")
    parser.add_argument("--table", action="store_true", help="the fitted model against the measured layers, per GPU")
    parser.add_argument("--write-subset", type=Path, metavar="DIR", help="write the tests' Vidur subset there")
    args = parser.parse_args(own)
    for name in ("meta-llama/Llama-3.1-8B.json", "Qwen/Qwen3-32B.json", "Qwen/Qwen3-30B-A3B-Instruct-2507.json"):
        s = shapes(json.loads((args.configs / name).read_text()))
        print(f"{name}: num_params={s['num_params']:,} active_params={s['active_params']:,}")
    result = derive(args.profiles, args.configs, args.vidur)
    print("\nattention, per LLMServingSim bundle:")
    for name, row in result["attention"].items():
        print(f"  {name}: {row}")
    print("\nuneven decode contexts, per LLMServingSim bundle (median alpha):")
    for name, row in result["skew"].items():
        print(f"  {name}: decode-only {row['decode_skew_alpha']:.3f}, beside a prefill chunk {row['mixed_skew_alpha']:.3f}")
    print("\nMoE experts (the only MoE bundle):", result["experts"])
    print("\nper GPU (MEASURED_EFFICIENCY in plugins/presets.py):")
    for gpu, fit in result["per_gpu"].items():
        print(f"  {gpu}: {fit}")
    print("\npooled (DERIVATION in plugins/cost_models/roofline.py):", result["pooled"])
    if args.table:
        print("\n| GPU | model x TP series | 1 token: median / worst error (points) | 16-256 tokens | 512-4,096 tokens "
              "| all, with the pooled defaults |")
        print("|---|---|---|---|---|---|")
        for gpu, bands in result["table"].items():
            cells = [f"{bands[b][0]:.1f}% / {bands[b][1]:.1f}% ({bands[b][2]})" if b in bands else "-"
                     for b in ("1", "16-256", "512-4096", "pooled")]
            print(f"| `{gpu}` | {result['per_gpu'][gpu]['series']} | " + " | ".join(cells) + " |")
    if args.write_subset:
        write_subset(args.vidur, args.write_subset)
        print(f"\nwrote the Vidur subset under {args.write_subset}")
    print("\n--- routed experts (tools/derive_experts.py) ---")
    derive_experts.main(["--table"] if args.table else [])
    # Latent attention's decode rate comes from a sibling derivation over vLLM's MLA kernel timings.
    import derive_latent_attention

    print("\n--- latent attention's decode (tools/derive_latent_attention.py) ---")
    derive_latent_attention.main(["--table"] if args.table else [])
    # The collectives' bus bandwidths come from a sibling derivation over Vidur's NCCL timings.
    import derive_collectives

    print("\n--- collectives (tools/derive_collectives.py) ---")
    return derive_collectives.main(collectives_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
