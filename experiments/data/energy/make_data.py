"""Copy the small parts of the shared energy measurements that the energy validation needs.

    python experiments/data/energy/make_data.py [/path/to/shared/calibration/energy]
    python experiments/data/energy/make_data.py --v3 /path/to/ml-energy/leaderboard/.git

Sources (licences and commits beside each copy):

* ``mlenergy-v2/sweeps.csv`` -- ML.ENERGY Leaderboard v2 (github.com/ml-energy/benchmark,
  ``data/llm_text_generation/``, Apache-2.0): one row per JSON file (task, GPU, model,
  ``bs<max batch>+tp<N>+pp<M>``) with its measured numbers, renamed: ``energy_per_request_j``
  (``Energy/req (J)``, all GPUs), ``tpot_s``, ``token_tput``, ``output_tokens``, ``avg_bs``,
  ``max_bs``. ``models.csv`` beside it (written by hand, not copied) gives each model's shape
  from its Hugging Face ``config.json``.
* ``llmservingsim-power/`` -- LLMServingSim 2.0's power validation (github.com/casys-kaist/
  LLMServingSim, branch ispass26-artifact, MIT): the nvidia-smi logs of the RTX A6000 as CSV
  (``t_s`` from the first sample, utilisation %, power W; the TP-2 log has GPU 0 only), the vLLM
  server's periodic log lines as CSV (``clock_s``, seconds of the day on the vLLM log's clock,
  which reads 8 h behind nvidia-smi's: another time zone), and the power coefficients
  LLMServingSim used (``power_config_tp*.json``). ``requests.csv`` (written by hand, not
  copied) is the pulse workload the run replayed: LLMServingSim's
  ``dataset/sharegpt_pulse_req10_n3_delay60.jsonl`` (commit 9e3f0ece), its ``input_toks``,
  ``output_toks`` and ``arrival_time_ns`` without the token ids.
* ``mlenergy-v3/dense.csv`` -- ML.ENERGY Leaderboard v3.0's dense-model points
  (github.com/ml-energy/leaderboard at the commit in ``COMMIT``, ``public/data/models/*.json``;
  that repository has no licence file at that commit, see ``NOTICE``): ``python
  experiments/data/energy/make_data.py --v3 <leaderboard git dir>`` reads each JSON file whose
  ``architecture`` is ``Dense Transformer`` and whose task is text (``lm-arena-chat``, ``gpqa``: not
  the image and video chats) through ``git show <commit>:<path>`` and writes one row
  per entry of its ``configurations`` (every GPU there: H100 and B200), the fields copied as they
  are (``V3_FIELDS``), ``power_w_per_gpu`` = ``avg_power_watts / num_gpus`` added, and
  ``running_output_tokens`` (:func:`running_output`, from the configuration's output-length
  histogram: the mean output a running request has so far, for its KV context).
"""

import csv
import json
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SWEEP_FIELDS = {"Energy/req (J)": "energy_per_request_j", "Avg TPOT (s)": "tpot_s", "Token tput (tok/s)": "token_tput",
                "Avg Output Tokens": "output_tokens", "Avg BS (reqs)": "avg_bs", "Max BS (reqs)": "max_bs"}
LOG_LINE = re.compile(r"(\d\d):(\d\d):(\d\d) \[loggers.py:\d+\] Engine 000: Avg prompt throughput: ([\d.]+) tokens/s, "
                      r"Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs")


V3_COMMIT = "0cd52dab897c5d91a45f4d413038f3b8b4251b0f"
V3_FIELDS = ("max_num_seqs", "avg_batch_size", "avg_power_watts", "median_itl_ms", "p90_itl_ms",
             "energy_per_token_joules", "output_throughput_tokens_per_sec", "avg_output_len")


def running_output(histogram: dict) -> float:
    """The mean output a running request has generated, in steady state: a request is running
    in proportion to its length ``L``, and has then generated ``L / 2`` on average, so
    ``E[L^2] / (2 E[L])`` over the point's output-length histogram (bin midpoints)."""
    edges, counts = histogram["bins"], histogram["counts"]
    mids = [(a + b) / 2 for a, b in zip(edges, edges[1:])]
    first = sum(n * m for n, m in zip(counts, mids))
    return sum(n * m * m for n, m in zip(counts, mids)) / (2 * first) if first else 0.0


def mlenergy_v3(git_dir: Path) -> None:
    """``mlenergy-v3/dense.csv`` from the leaderboard's git directory (module docstring)."""
    import subprocess

    def show(path: str) -> str:
        return subprocess.check_output(["git", "--git-dir", str(git_dir), "show", f"{V3_COMMIT}:{path}"], text=True)

    names = subprocess.check_output(["git", "--git-dir", str(git_dir), "ls-tree", "--name-only", V3_COMMIT,
                                     "public/data/models/"], text=True).split()
    rows = []
    for name in sorted(names):
        data = json.loads(show(name))
        if data.get("architecture") != "Dense Transformer" or data["task"] not in ("lm-arena-chat", "gpqa"):
            continue
        for c in data["configurations"]:
            par = c["parallelization"]
            rows.append({"model_id": data["model_id"], "task": data["task"], "precision": data["weight_precision"],
                         "gpu_model": c["gpu_model"], "num_gpus": c["num_gpus"], "tp": par["tensor_parallel"],
                         "dp": par["data_parallel"], **{k: c[k] for k in V3_FIELDS},
                         "power_w_per_gpu": c["avg_power_watts"] / c["num_gpus"],
                         "running_output_tokens": running_output(c["output_length_distribution"])})
    rows.sort(key=lambda r: (r["gpu_model"], r["model_id"], r["task"], r["num_gpus"], r["tp"], r["max_num_seqs"]))
    out = HERE / "mlenergy-v3"
    out.mkdir(exist_ok=True)
    (out / "COMMIT").write_text(V3_COMMIT + "\n")
    with open(out / "dense.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def sweeps(source: Path) -> None:
    out = HERE / "mlenergy-v2"
    out.mkdir(exist_ok=True)
    for name in ("LICENSE", "COMMIT"):
        shutil.copy(source / name, out / name)
    rows = []
    for path in sorted((source / "llm_text_generation").glob("*/*/*/*/*.json")):
        task, gpu, org, model = path.relative_to(source / "llm_text_generation").parts[:4]
        data = json.loads(path.read_text())
        rows.append({"task": task, "gpu": gpu.replace("_", " "), "model": f"{org}/{model}", "config": path.stem,
                     "tp": data["TP"], "pp": data["PP"],
                     **{ours: data[theirs] for theirs, ours in SWEEP_FIELDS.items()}})
    with open(out / "sweeps.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def seconds(text: str) -> float:
    hms, _, frac = text.split(" ")[1].partition(".")
    h, m, s = map(int, hms.split(":"))
    return h * 3600 + m * 60 + s + (float("0." + frac) if frac else 0.0)


def power_traces(source: Path) -> None:
    out = HERE / "llmservingsim-power"
    out.mkdir(exist_ok=True)
    for name in ("LICENSE", "COMMIT"):
        shutil.copy(source / name, out / name)
    for tp in (1, 2):
        shutil.copy(source / "config" / f"power_config_tp{tp}.json", out / f"power_config_tp{tp}.json")
        log = (source / "raw_data" / f"gpu_power_log_tp{tp}.txt").read_text()
        lines = [line.split(", ") for line in log.splitlines()]
        t0 = seconds(lines[0][0])
        with open(out / f"gpu_power_tp{tp}.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["t_s", "clock_s", "gpu", "util_pct", "power_w"])
            for stamp, gpu, util, watts in lines:
                writer.writerow([round(seconds(stamp) - t0, 3), round(seconds(stamp), 3), gpu, util, watts])
        with open(out / f"vllm_log_tp{tp}.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["clock_s", "prompt_tput", "generation_tput", "running", "waiting"])
            for match in LOG_LINE.finditer((source / "raw_data" / f"vllm_pulse_power_tp{tp}.txt").read_text()):
                h, m, s, prompt, gen, running, waiting = match.groups()
                writer.writerow([int(h) * 3600 + int(m) * 60 + int(s), prompt, gen, running, waiting])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--v3"]:
        mlenergy_v3(Path(sys.argv[2]))
        sys.exit(0)
    shared = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO.parent.parent / "shared" / "calibration" / "energy"
    sweeps(shared / "mlenergy-v2")
    power_traces(shared / "llmservingsim-power")
