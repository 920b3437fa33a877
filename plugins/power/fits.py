"""Shipped tables for the ``table`` power model: measured power per GPU against batch size.

What ``tools/derive_roofline.py`` (power section) printed from ML.ENERGY Leaderboard v2
(github.com/ml-energy/benchmark, 2024, Apache-2.0; vLLM 0.5.4 serving ShareGPT chat at its
maximum batch): per sweep point, the average power of one GPU (energy per request x requests
per second / GPUs) against the average batch. They include vLLM 0.5.4's CPU-bound stretches
inside each iteration, as measured.
"""

FITS: dict[str, dict] = {
    "mlenergy-a100-40gb-llama-3.1-8b": {
        "gpu": "a100-40gb", "by": "sequences",
        "points": [[31.9, 198.3], [63.9, 201.9], [127.8, 188.0], [191.6, 192.3], [255.4, 189.3], [319.2, 195.2]],
        "source": "ML.ENERGY v2, Llama-3.1-8B-Instruct on A100-SXM4-40GB, vLLM 0.5.4, chat"},
    "mlenergy-h100-80gb-llama-3.1-8b": {
        "gpu": "h100-80gb", "by": "sequences",
        "points": [[63.9, 305.3], [127.8, 281.2], [191.6, 294.0], [255.4, 276.0], [319.2, 274.2], [509.8, 245.7],
                   [761.7, 251.3], [975.7, 243.6]],
        "source": "ML.ENERGY v2, Llama-3.1-8B-Instruct on H100 80GB HBM3, vLLM 0.5.4, chat"},
}
