"""Copy the real H100 runs experiments/h100_inference_perf.toml checks schedlab against.

    python experiments/data/inference_perf_h100/make_data.py /path/to/inference-perf

Source: inference-perf (github.com/kubernetes-sigs/inference-perf, Apache-2.0, see LICENSE
and COMMIT here), ``demos/kubecon-na-2025/``: the runs behind the KubeCon NA 2025 talk
"Benchmarking GenAI Foundation Model Inference Optimizations on Kubernetes". vLLM 0.11.0
serving Llama-3.1-8B-Instruct on one NVIDIA H100 80GB (GKE ``nvidia-h100-80gb``), loaded by
inference-perf with a shared-prefix workload (10 system prompts of 128 tokens x 10 users, a
64-token question each, 64 output tokens with ``ignore_eos``) at seven constant rates of 60 s,
each stage after the previous one drained; latencies measured at the client. For each server
configuration in :data:`VARIANTS` this copies ``manifests.yaml`` (the server's arguments) and
the per-stage reports ``stage_<k>_lifecycle_metrics.json`` unchanged, and the load
generator's ``config.yaml`` once. The source may be a checkout or a bare mirror (read with
``git show COMMIT:path``).
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMIT = (HERE / "COMMIT").read_text().split()[0]
DEMO = "demos/kubecon-na-2025"
#: folder here -> folder in the demo; the server configurations schedlab models (the demo's
#: others -- EAGLE speculation, bitsandbytes quantization, the V0 engine of vLLM 0.9 -- are left out)
VARIANTS = {"vllm": "vllm", "batch_size": "vllm+batch_size",
            "chunking_and_prefix_caching": "vllm+chunking_and_prefix_caching"}
STAGES = 7


def show(source: Path, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(source), "show", f"{COMMIT}:{path}"], check=True,
                          capture_output=True).stdout


def main(source: Path) -> None:
    (HERE / "LICENSE").write_bytes(show(source, "LICENSE"))
    (HERE / "config.yaml").write_bytes(show(source, f"{DEMO}/config.yaml"))
    for here, there in VARIANTS.items():
        out = HERE / here
        out.mkdir(exist_ok=True)
        (out / "manifests.yaml").write_bytes(show(source, f"{DEMO}/{there}/manifests.yaml"))
        for k in range(STAGES):
            name = f"stage_{k}_lifecycle_metrics.json"
            (out / name).write_bytes(show(source, f"{DEMO}/{there}/results/{name}"))
    print(f"copied {len(VARIANTS)} x {STAGES} stage reports from {source} at {COMMIT}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
