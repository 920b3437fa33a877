"""Copy the parts of LLMServingSim's data that experiments/vllm_validation.toml needs.

    python experiments/data/llmservingsim/make_data.py [/path/to/LLMServingSim]

Source: LLMServingSim (github.com/casys-kaist/LLMServingSim, MIT licence, see LICENSE and
COMMIT here): a checkout at COMMIT, or ../shared/calibration/llmservingsim, which holds the
first two runs below (the other two are in the repository at the same commit). For each real
run in :data:`RUNS` (Llama-3.1-8B on one RTX PRO 6000 Server; Qwen3-32B at tensor parallel 2 on
two; Llama-3.1-8B on one RTX 4090; Qwen3-30B-A3B on two RTX PRO 6000 Server as data parallel 2
with expert parallelism):

* ``profiles/<hardware>/<org>/<model>/bf16/`` -- the per-operator profile bundle of the run's
  GPU and model at the run's TP degree (meta.yaml, dense, per_sequence, attention, skew_fit;
  the raw skew shots are left out: the fit is what a simulator reads);
* ``vllm-<hardware>-<model>.jsonl`` -- the real vLLM 0.19 run's per-request log
  (bench/examples/<hardware>/<model>/vllm/requests.jsonl) with one field added,
  ``block_hashes``: the prefix block ids of each prompt's token ids, hashed in 16-token blocks
  from workloads/sharegpt-<model>-300-sps10.jsonl (line i of the workload is request bench-i),
  so the 2.5 MB of token ids need not be copied;
* ``meta.json`` and ``summary.txt`` of that run (engine settings; LLMServingSim's own
  validation).

and the bundles in :data:`BUNDLES` (no real run of them here), moe.csv included.

Later runs of the same bench at vLLM 0.28 (:data:`LATER_RUNS`, from a checkout at
:data:`LATER_COMMIT`, the second argument): the same 300 prompts and answer lengths, re-recorded
on the same model of GPU, copied as ``vllm028-<hardware>-<model>.*`` (their prefix block ids
from the same workload files), and replayed with the bundles above, profiled at vLLM 0.19.

    python experiments/data/llmservingsim/make_data.py CHECKOUT LATER_CHECKOUT
"""

import json
import shutil
import sys
from pathlib import Path

from schedlab_plugins.workloads.measured import prefix_block_ids

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

#: (run folder under bench/examples, bundle under profiler/perf, TP degree, file stem, workload stem)
RUNS = (
    ("RTXPRO6000/Llama-3.1-8B", "RTXPRO6000/meta-llama/Llama-3.1-8B/bf16", 1, "rtxpro6000-llama-3.1-8b", "llama-3.1-8b"),
    ("RTXPRO6000/Qwen3-32B", "RTXPRO6000/Qwen/Qwen3-32B/bf16", 2, "rtxpro6000-qwen3-32b", "qwen3-32b"),
    ("RTX4090/Llama-3.1-8B", "RTX4090/meta-llama/Llama-3.1-8B/bf16", 1, "rtx4090-llama-3.1-8b", "llama-3.1-8b"),
    ("RTXPRO6000/Qwen3-30B-A3B-Instruct-2507", "RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16", 1,
     "rtxpro6000-qwen3-30b-a3b-dp2-ep", "qwen3-30b-a3b"),
)
#: Bundles without a real run of their own here (none now: the MoE model's TP-1 profiles, whose
#: expert table, moe.csv, is profiled at TP 1 only, serve its data-parallel run above).
BUNDLES = ()


def copy_bundle(source: Path, bundle: str, tp: int) -> None:
    out = HERE / "profiles" / bundle
    (out / f"tp{tp}").mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "profiler/perf" / bundle / "meta.yaml", out / "meta.yaml")
    for name in ("dense.csv", "per_sequence.csv", "attention.csv", "skew_fit.csv", "moe.csv"):
        path = source / "profiler/perf" / bundle / f"tp{tp}" / name
        if path.is_file() or name != "moe.csv":
            shutil.copy(path, out / f"tp{tp}" / name)


def copy_run(source: Path, run_name: str, bundle: str, tp: int, stem: str, workload: str) -> None:
    copy_bundle(source, bundle, tp)
    run = source / "bench/examples" / run_name
    if not run.is_dir():
        sys.exit(f"make_data.py: {run}: no such run; give a checkout of LLMServingSim at the commit in COMMIT")
    shutil.copy(run / "vllm/meta.json", HERE / f"vllm-{stem}.meta.json")
    shutil.copy(run / "validation/summary.txt", HERE / f"vllm-{stem}.llmservingsim-summary.txt")
    copy_log(source, run, HERE / f"vllm-{stem}.jsonl", workload)


#: The commit of the vLLM 0.28 re-recordings (after COMMIT's). The TP 2 run's summary.txt there is
#: LLMServingSim's validation of that very log. The shipped copies were read from GitHub's stored
#: versions, where the MoE run's meta.json was found at 0acc21b only (the bench's fixed engine
#: settings: DP 2 + EP, 128 sequences, 2,048 tokens, asynchronous scheduling) and no summary.txt
#: of its log.
LATER_COMMIT = "0d3de681adbd9c515fc378e94e3e625b6e250dad"
#: (run folder under bench/examples, file stem, workload stem)
LATER_RUNS = (
    ("RTXPRO6000/Qwen3-32B", "rtxpro6000-qwen3-32b", "qwen3-32b"),
    ("RTXPRO6000/Qwen3-30B-A3B-Instruct-2507", "rtxpro6000-qwen3-30b-a3b-dp2-ep", "qwen3-30b-a3b"),
)


#: A later run replayed only as a diagnostic (experiments/deepseek_v32_diagnostic.toml): its log as
#: it is (no prefix block ids), its meta.json and summary.txt, and the model's config.json.
DIAGNOSTIC_RUN = ("RTXPRO6000/DeepSeek-V3.2-Exp-16L64E", "rtxpro6000-deepseek-v3.2-exp-16l64e",
                  "configs/model/deepseek-ai/DeepSeek-V3.2-Exp-16L64E.json", "deepseek-v3.2-exp-16l64e.config.json")


def copy_diagnostic_run(source: Path) -> None:
    run_name, stem, config, config_copy = DIAGNOSTIC_RUN
    run = source / "bench/examples" / run_name
    for name, suffix in (("vllm/requests.jsonl", "jsonl"), ("vllm/meta.json", "meta.json"),
                         ("validation/summary.txt", "llmservingsim-summary.txt")):
        shutil.copy(run / name, HERE / f"vllm028-{stem}.{suffix}")
    shutil.copy(source / config, HERE / config_copy)


def copy_log(source: Path, run: Path, out: Path, workload: str) -> None:
    """The run's per-request log with each prompt's prefix block ids added."""
    log = [json.loads(line) for line in open(run / "vllm/requests.jsonl")]
    prompts = [json.loads(line) for line in open(source / f"workloads/sharegpt-{workload}-300-sps10.jsonl")]
    for i, row in enumerate(log):
        assert row["request_id"] == f"bench-{i}" and prompts[i]["input_toks"] == row["input_toks"]
    ids = prefix_block_ids([p["input_tok_ids"] for p in prompts[:len(log)]], 16)
    with open(out, "w") as fh:
        for row, hashes in zip(log, ids):
            fh.write(json.dumps({**row, "block_hashes": list(hashes)}, separators=(",", ":")) + "\n")


def copy_later_run(source: Path, run_name: str, stem: str, workload: str) -> None:
    run = source / "bench/examples" / run_name
    if not run.is_dir():
        sys.exit(f"make_data.py: {run}: no such run; give a checkout of LLMServingSim at {LATER_COMMIT}")
    for name, suffix in (("vllm/meta.json", "meta.json"), ("validation/summary.txt", "llmservingsim-summary.txt")):
        if (run / name).is_file():
            shutil.copy(run / name, HERE / f"vllm028-{stem}.{suffix}")
    copy_log(source, run, HERE / f"vllm028-{stem}.jsonl", workload)


def main(source: Path, later: Path | None = None) -> None:
    shutil.copy(source / "LICENSE", HERE / "LICENSE")
    shutil.copy(source / "COMMIT", HERE / "COMMIT")
    for run in RUNS:
        copy_run(source, *run)
    for bundle in BUNDLES:
        copy_bundle(source, *bundle)
    if later is not None:
        for run in LATER_RUNS:
            copy_later_run(later, *run)
        copy_diagnostic_run(later)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO.parent.parent / "shared" / "calibration" / "llmservingsim",
         Path(sys.argv[2]) if len(sys.argv) > 2 else None)
