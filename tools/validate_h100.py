"""schedlab against real H100 runs it has never seen: the README's H100 table.

    schedlab run experiments/h100_inference_perf.toml --out results/h100_inference_perf
    python tools/validate_h100.py results/h100_inference_perf

Reads the run's ``summary.json`` (every stage's ``vs_target``: the client's mean TTFT and
end-to-end latency, measured and simulated) and prints, per server configuration and stage,
the error of the mean E2E, of the mean TTFT and of the inter-token latency as issue 20 defines
it, ``(E2E - TTFT) / (output - 1)`` from the means (every request has exactly 64 output tokens:
``max_tokens = 64`` with ``ignore_eos``; the report's own TPOT and ITL are not usable, see
experiments/data/inference_perf_h100/README.md), then the median of each over the 21 stages.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

OUTPUT_TOKENS = 64  # experiments/data/inference_perf_h100/config.yaml: output_len, ignore_eos


def rows(results: Path) -> list[tuple[str, float, float, float]]:
    """(run, E2E error %, TTFT error %, ITL error %) per stage run."""
    summary = json.loads((results / "summary.json").read_text())
    out = []
    for study in summary["studies"]:
        for run in study["runs"]:
            vs = run["metrics"].get("vs_target")
            if vs is None:
                continue
            m, s = vs["measured"], vs["simulated"]
            itl_m = (m["e2e_ms.mean"] - m["ttft_ms.mean"]) / (OUTPUT_TOKENS - 1)
            itl_s = (s["e2e_ms.mean"] - s["ttft_ms.mean"]) / (OUTPUT_TOKENS - 1)
            out.append((run["name"], vs["errors_pct"]["e2e_ms.mean"], vs["errors_pct"]["ttft_ms.mean"],
                        100.0 * (itl_s - itl_m) / itl_m))
    if not out:
        sys.exit(f"{results}/summary.json: no run with a [target] (run experiments/h100_inference_perf.toml)")
    return out


def main(results: Path) -> None:
    table = rows(results)
    print("| stage run | E2E mean | TTFT mean | ITL |")
    print("|---|---:|---:|---:|")
    for name, e2e, ttft, itl in table:
        print(f"| {name} | {e2e:+.1f}% | {ttft:+.1f}% | {itl:+.1f}% |")
    errors = np.abs(np.array([r[1:] for r in table]))
    med = np.median(errors, axis=0)
    print(f"| **median \\|error\\| over {len(table)} stages** | {med[0]:.1f}% | {med[1]:.1f}% | {med[2]:.1f}% |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
