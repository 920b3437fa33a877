"""Copy the parts of the shared calibration data that experiments/vllm_validation.toml needs.

    python experiments/data/llmservingsim/make_data.py [/path/to/shared/calibration/llmservingsim]

Source: LLMServingSim (github.com/casys-kaist/LLMServingSim, MIT licence, see LICENSE and
COMMIT here), as laid out in ../shared/calibration/llmservingsim:

* ``profiles/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/`` -- the per-operator profile bundle of
  the run's GPU and model at TP 1 (meta.yaml, dense, per_sequence, attention, skew_fit; the raw
  skew shots are left out: the fit is what a simulator reads);
* ``vllm-rtxpro6000-llama-3.1-8b.jsonl`` -- the real vLLM 0.19 run's per-request log
  (bench/examples/RTXPRO6000/Llama-3.1-8B/vllm/requests.jsonl) with one field added,
  ``block_hashes``: the prefix block ids of each prompt's token ids, hashed in 16-token blocks
  from workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl (line i of the workload is request
  bench-i), so the 2.5 MB of token ids need not be copied;
* ``meta.json`` and ``summary.txt`` of that run (engine settings; LLMServingSim's own
  validation).
"""

import json
import shutil
import sys
from pathlib import Path

from schedlab_plugins.workloads.measured import prefix_block_ids

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def main(source: Path) -> None:
    shutil.copy(source / "LICENSE", HERE / "LICENSE")
    shutil.copy(source / "COMMIT", HERE / "COMMIT")
    bundle = Path("profiler/perf/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16")
    out = HERE / "profiles" / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16"
    (out / "tp1").mkdir(parents=True, exist_ok=True)
    shutil.copy(source / bundle / "meta.yaml", out / "meta.yaml")
    for name in ("dense.csv", "per_sequence.csv", "attention.csv", "skew_fit.csv"):
        shutil.copy(source / bundle / "tp1" / name, out / "tp1" / name)
    run = source / "bench/examples/RTXPRO6000/Llama-3.1-8B"
    shutil.copy(run / "vllm/meta.json", HERE / "vllm-rtxpro6000-llama-3.1-8b.meta.json")
    shutil.copy(run / "validation/summary.txt", HERE / "vllm-rtxpro6000-llama-3.1-8b.llmservingsim-summary.txt")
    log = [json.loads(line) for line in open(run / "vllm/requests.jsonl")]
    prompts = [json.loads(line) for line in open(source / "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl")]
    for i, row in enumerate(log):
        assert row["request_id"] == f"bench-{i}" and prompts[i]["input_toks"] == row["input_toks"]
    ids = prefix_block_ids([p["input_tok_ids"] for p in prompts[:len(log)]], 16)
    with open(HERE / "vllm-rtxpro6000-llama-3.1-8b.jsonl", "w") as fh:
        for row, hashes in zip(log, ids):
            fh.write(json.dumps({**row, "block_hashes": list(hashes)}, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO.parent.parent / "shared" / "calibration" / "llmservingsim")
