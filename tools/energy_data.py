"""The shipped energy measurements (experiments/data/energy), read and put next to the model.

Shared by the power section of ``tools/derive_roofline.py`` (which fits the utilisation
model's two shares on part of them), ``tools/validate_energy.py`` (which reports the model
against all of them) and the tests that keep the README's figures honest.

ML.ENERGY v2 sweeps (vLLM 0.5.4, saturated at its maximum batch): a sweep point is a steady
cycle that yields one token for each request of the average batch -- one decode iteration,
plus the prefills of the requests that replace the finished ones (``avg_bs / output_tokens``
per cycle, each a separate iteration: vLLM 0.5.4 without chunked prefill) -- and lasts what
the measured token throughput says, ``avg_bs / token_tput`` (a point's ``tpot_s`` is up to 40%
shorter at large batches: requests queue and wait out other prefills between their tokens).
The roofline says what each iteration reads and computes; the *measured* cycle time is their
duration (spread in proportion to the roofline's times). So this tests the power model given
the time an engine really took -- vLLM 0.5.4's CPU-bound stretches inside each iteration
included -- not the cost model's timing; with the time measured, energy per output token is
power times it (its error is the power error). Prompts: ShareGPT first turns filtered to at most 800 tokens by
ML.ENERGY's ``filter_dataset.py``, about :data:`PROMPT_TOKENS` with the chat template (the
files do not say; the KV part of the traffic depends on it, the weights' does not).

A6000 pulses (LLMServingSim 2.0's trace, vLLM 0.11.1): the vLLM log's one-second lines give the
decode iterations of each second -- ``generation tokens / running`` of them over the running
requests -- and nvidia-smi the GPU's power over the same second (its clock reads 8 h ahead of
the log's).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from schedlab.capacity import ModelSpec, Presets  # noqa: E402
from schedlab.protocols import Batch  # noqa: E402

DATA = REPO / "experiments" / "data" / "energy"
GPUS = {"A100-SXM4-40GB": "a100-40gb", "H100 80GB HBM3": "h100-80gb"}
PROMPT_TOKENS = 250
LOG_CLOCK_OFFSET_S = 8 * 3600
TRAINING_MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct"


def presets() -> Presets:
    from schedlab.catalog import load_catalog

    return Presets.from_catalog(load_catalog(entry_points=False))


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# --- ML.ENERGY -------------------------------------------------------------------------------------

def model_specs(data: Path = DATA) -> dict[str, ModelSpec]:
    """ModelSpecs from ``models.csv`` (shapes of each model's Hugging Face config.json)."""
    out = {}
    for r in _rows(data / "mlenergy-v2" / "models.csv"):
        L, h, heads, kv, hd, ffn, vocab = (int(r[k]) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim",
                                                               "ffn", "vocab"))
        experts, k = int(r["experts"]), int(r["top_k"])
        tied = r["tied"] == "1"
        mlp = (3 if r["gated"] == "1" else 2) * h * ffn
        attn = 2 * h * heads * hd + 2 * h * kv * hd
        embed = vocab * h * (1 if tied else 2)
        total = L * (attn + (experts * mlp + h * experts if experts else mlp)) + embed
        active = L * (attn + k * mlp + h * experts) + embed if experts else None
        out[r["model"]] = ModelSpec(r["model"], num_layers=L, num_kv_heads=kv, head_dim=hd, num_params=total,
                                    num_attention_heads=heads, hidden_size=h, vocab_size=None if tied else vocab,
                                    num_experts=experts, experts_per_token=k, active_params=active)
    return out


def sweep_points(data: Path = DATA) -> list[dict]:
    """Every ML.ENERGY point we can model (a known model, no pipeline parallelism), with its
    measured power per GPU and energy per output token."""
    specs = model_specs(data)
    out = []
    for r in _rows(data / "mlenergy-v2" / "sweeps.csv"):
        if r["model"] not in specs or int(r["pp"]) != 1 or r["gpu"] not in GPUS:
            continue
        tp = int(r["tp"])
        energy, tput, tokens = float(r["energy_per_request_j"]), float(r["token_tput"]), float(r["output_tokens"])
        out.append({"task": r["task"], "gpu": GPUS[r["gpu"]], "model": r["model"], "tp": tp,
                    "max_bs": int(r["max_bs"]), "avg_bs": float(r["avg_bs"]), "output_tokens": tokens,
                    "tpot_ms": float(r["tpot_s"]) * 1e3, "cycle_ms": float(r["avg_bs"]) / tput * 1e3,
                    "spec": specs[r["model"]],
                    "power_w": energy * tput / tokens / tp, "j_per_token": energy / tokens,
                    "sweep": f"{r['task']} {r['gpu']} {r['model'].split('/')[1]} tp{tp}"})
    return out


def cycle(point: dict, cost) -> list[tuple[Batch, float, float]]:
    """One steady cycle of a sweep point: ``(batch, duration ms, how many)`` per iteration kind."""
    n = max(1, round(point["avg_bs"]))
    decode = Batch(num_decode=n, decode_context_tokens=round(n * (PROMPT_TOKENS + point["output_tokens"] / 2)))
    prefill = Batch(num_prefill=1, prefill_tokens=PROMPT_TOKENS)
    refills = point["avg_bs"] / point["output_tokens"]
    t_decode, t_prefill = cost.iteration_ms(decode), cost.iteration_ms(prefill)
    scale = point["cycle_ms"] / (t_decode + refills * t_prefill)  # the measured cycle, spread over its iterations
    return [(decode, t_decode * scale, 1.0), (prefill, t_prefill * scale, refills)]


def predict_point(point: dict, make_power, presets_: Presets) -> tuple[float, float]:
    """``(power per GPU W, J per output token)`` the power model ``make_power(cost)`` gives a
    sweep point's steady cycle."""
    from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel

    spec, gpu = point["spec"], presets_.gpu(point["gpu"])
    cost = RooflineCostModel(spec, gpu, RooflineConfig(model=spec.name, gpu=gpu.name, tensor_parallel=point["tp"]))
    power = make_power(cost)
    energy = sum(count * power.iteration_j(batch, d) for batch, d, count in cycle(point, cost))
    return energy / point["cycle_ms"] * 1e3 / point["tp"], energy / point["avg_bs"]


# --- the A6000 pulses -------------------------------------------------------------------------------

def trace(tp: int, data: Path = DATA) -> dict[str, list[float]]:
    """nvidia-smi's log of the run: ``t_s`` from its first sample, ``clock_s``, util %, power W."""
    rows = _rows(data / "llmservingsim-power" / f"gpu_power_tp{tp}.csv")
    return {k: [float(r[k]) for r in rows] for k in ("t_s", "clock_s", "util_pct", "power_w")}


def pulse_ends(tp: int, data: Path = DATA, before_s: float = 4.0, after_s: float = 10.0) -> list[dict]:
    """How the GPU's power falls at the end of each pulse, as nvidia-smi read it: per pulse,
    its fresh readings (``t_s`` from the first sample showing no utilisation, ``power_w``) from
    ``before_s`` before to ``after_s`` after -- fresh: the value changed since the sample before;
    nvidia-smi repeats a reading until the next one (about one a second) -- with the pulse's
    power just before (``busy_w``: the mean 4 to 0.5 s before) and the standby plateau after
    (``plateau_w``: the mean 6 to 14 s after)."""
    smi = trace(tp, data)
    t, util, power = smi["t_s"], smi["util_pct"], smi["power_w"]
    out = []
    for i in range(1, len(t)):
        if not (util[i - 1] > 0 and util[i] == 0):
            continue
        window = [j for j in range(1, len(t)) if -before_s <= t[j] - t[i] <= after_s and power[j] != power[j - 1]]

        def mean(lo, hi):
            values = [w for s, w in zip(t, power) if lo <= s - t[i] <= hi]
            return sum(values) / len(values)

        out.append({"t_s": [t[j] - t[i] for j in window], "power_w": [power[j] for j in window],
                    "busy_w": mean(-4.0, -0.5), "plateau_w": mean(6.0, 14.0)})
    return out


def decode_seconds(tp: int, data: Path = DATA) -> list[dict]:
    """The vLLM log's decode-only seconds inside a pulse (no prompt tokens in it or the one
    before, requests running at both ends) with nvidia-smi's mean power over that second."""
    log = _rows(data / "llmservingsim-power" / f"vllm_log_tp{tp}.csv")
    smi = trace(tp, data)
    out = []
    for prev, row in zip(log, log[1:]):
        if int(row["clock_s"]) - int(prev["clock_s"]) != 1 or float(row["prompt_tput"]) or float(prev["prompt_tput"]):
            continue
        running = (int(prev["running"]) + int(row["running"])) / 2
        if int(row["running"]) < 1 or float(row["generation_tput"]) <= 0:
            continue
        lo = int(row["clock_s"]) + LOG_CLOCK_OFFSET_S
        watts = [w for c, w in zip(smi["clock_s"], smi["power_w"]) if lo <= c < lo + 1]
        if watts:
            out.append({"running": running, "steps_per_s": float(row["generation_tput"]) / running,
                        "power_w": sum(watts) / len(watts)})
    return out


def predict_second(second: dict, make_power, tp: int, presets_: Presets) -> float:
    """Power of one GPU over a decode second: its iterations back to back (nvidia-smi shows the
    GPU busy), each of the running requests at a mid-pulse context."""
    from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel

    spec, gpu = presets_.model("llama-3.1-8b"), presets_.gpu("rtx-a6000")
    cost = RooflineCostModel(spec, gpu, RooflineConfig(model=spec.name, gpu=gpu.name, tensor_parallel=tp))
    n = max(1, round(second["running"]))
    batch = Batch(num_decode=n, decode_context_tokens=n * 400)
    d = 1e3 / second["steps_per_s"]
    return second["steps_per_s"] * make_power(cost).iteration_j(batch, d) / tp


def pulse_requests(tp: int, data: Path = DATA) -> list[dict]:
    """The pulse workload as the traced run served it: the dataset's arrivals and prompts, with
    output lengths read off the vLLM log. vLLM sampled its own answers (the log counts 3,285
    tokens in TP 1's first pulse, the dataset 2,819), so the dataset's lengths would time the
    pulses wrong. A request that left during a logged second has generated the decode steps
    before that second and half of that second's (``generation tokens / running`` steps a
    second); the lengths so found go to the pulse's requests in the order of the dataset's
    lengths (the log does not say which request left)."""
    log = _rows(data / "llmservingsim-power" / f"vllm_log_tp{tp}.csv")
    requests = _rows(data / "llmservingsim-power" / "requests.csv")
    size = {}
    for r in requests:
        size[r["arrival_ms"]] = size.get(r["arrival_ms"], 0) + 1
    sizes = list(size.values())
    pulses: list[list[int]] = []
    running = 0
    steps = 0.0
    for row in log:
        now, generated = int(row["running"]), float(row["generation_tput"])
        if running == 0 and now == 0:
            continue
        if running == 0:  # a pulse starts
            pulses.append([])
            steps, running, first = 0.0, now, generated / now
        mean = (running + now) / 2 if 0 < now < running else max(running, now)  # arrivals: all decode
        step_count = generated / mean if mean else 0.0
        for _ in range(max(0, running - now)):
            pulses[-1].append(1 + round(steps + step_count / 2))
        steps += step_count
        running = now
        if running == 0:  # requests that came and went within the pulse's first second
            missing = sizes[len(pulses) - 1] - len(pulses[-1])
            pulses[-1] += [1 + round(first / 2)] * missing
    out = []
    for arrival in sorted({r["arrival_ms"] for r in requests}, key=float):
        mine = [r for r in requests if r["arrival_ms"] == arrival]
        lengths = sorted(pulses.pop(0)) if pulses else []
        if len(lengths) != len(mine):
            raise ValueError(f"TP {tp}: {len(lengths)} requests leave the pulse at {arrival} ms in the log, "
                             f"the dataset sends {len(mine)}")
        ranked = sorted(range(len(mine)), key=lambda i: int(mine[i]["output_tokens"]))
        for i, length in zip(ranked, lengths):
            mine[i] = {**mine[i], "output_tokens": length}
        out += [{"arrival_ms": float(r["arrival_ms"]), "prompt_tokens": int(r["prompt_tokens"]),
                 "output_tokens": int(r["output_tokens"])} for r in mine]
    return out


# --- ML.ENERGY v3 (dense models) -------------------------------------------------------------------
#: model_id -> model preset (Llama 3.1 70B has Llama 3.3 70B's architecture)
V3_MODELS = {"Qwen/Qwen3-8B": "qwen3-8b", "Qwen/Qwen3-14B": "qwen3-14b", "Qwen/Qwen3-32B": "qwen3-32b",
             "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Llama-3.1-70B-Instruct": "llama-3.3-70b",
             "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b"}
V3_GPUS = {"H100": "h100-80gb", "B200": "b200"}
#: mean prompt tokens per task: GPQA's 634 from the v3 blog post (tools/validate_mlenergy_v3.py);
#: LM Arena chat's are not published -- a guess
V3_PROMPT = {"gpqa": 634, "lm-arena-chat": 200}
#: a point is saturated -- every slot decoding -- when its mean batch is at least this share of max_num_seqs
V3_SATURATED = 0.95
#: The training set of the additive power model among the v3 points (tools/derive_roofline.py
#: power); every other point is held out: the other models, every B200 point
V3_TRAINING = {("qwen3-8b", "h100-80gb"), ("qwen3-14b", "h100-80gb")}


def v3_points(data: Path = DATA) -> list[dict]:
    """The saturated dense ML.ENERGY v3 points of a model we have (``mlenergy-v3/dense.csv``):
    power per GPU, J per output token, batch per rank, median ITL, and whether trained on."""
    out = []
    for r in _rows(data / "mlenergy-v3" / "dense.csv"):
        model, gpu = V3_MODELS.get(r["model_id"]), V3_GPUS.get(r["gpu_model"])
        if model is None or gpu is None or float(r["avg_batch_size"]) < V3_SATURATED * int(r["max_num_seqs"]):
            continue
        dp = int(r["dp"])
        out.append({"model": model, "gpu": gpu, "task": r["task"], "tp": int(r["tp"]), "dp": dp,
                    "max_num_seqs": int(r["max_num_seqs"]), "batch": float(r["avg_batch_size"]) / dp,
                    "itl_ms": float(r["median_itl_ms"]), "power_w": float(r["power_w_per_gpu"]),
                    "j_per_token": float(r["energy_per_token_joules"]),
                    "context": V3_PROMPT[r["task"]] + float(r["running_output_tokens"]),
                    "training": (model, gpu) in V3_TRAINING,
                    "label": f"{r['model_id'].split('/')[1]} {r['task']} {r['gpu_model']} tp{r['tp']}"})
    return out


def predict_v3(point: dict, make_power, presets_: Presets) -> tuple[float, float]:
    """``(power per GPU W, J per output token)`` the power model gives a v3 point: a decode step
    of its batch at its running context, lasting the measured median ITL."""
    from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel

    spec, gpu = presets_.model(point["model"]), presets_.gpu(point["gpu"])
    cost = RooflineCostModel(spec, gpu, RooflineConfig(model=spec.name, gpu=gpu.name, tensor_parallel=point["tp"]))
    n = max(1, round(point["batch"]))
    batch = Batch(num_decode=n, decode_context_tokens=round(n * point["context"]))
    joules = make_power(cost).iteration_j(batch, point["itl_ms"])
    return joules / point["itl_ms"] * 1e3 / point["tp"], joules / n
