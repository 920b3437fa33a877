"""Copy the small parts of the shared energy measurements that the energy validation needs.

    python experiments/data/energy/make_data.py [/path/to/shared/calibration/energy]

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
    shared = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO.parent.parent / "shared" / "calibration" / "energy"
    sweeps(shared / "mlenergy-v2")
    power_traces(shared / "llmservingsim-power")
