"""Shipped tables for the ``table`` power model: measured power per GPU against batch size.

What ``tools/derive_roofline.py`` (power section) printed from ML.ENERGY Leaderboard v2
(github.com/ml-energy/benchmark, 2024, Apache-2.0; vLLM 0.5.4 serving ShareGPT chat at its
maximum batch): per sweep point, the average power of one GPU (energy per request x requests
per second / GPUs) against the average batch. They include vLLM 0.5.4's CPU-bound stretches
inside each iteration, as measured: ``cycle_ms`` is each point's measured cycle (``avg_bs /
token throughput``), and the ``table`` model warns when a cost model's decode step at the
table's first batch is under half of it (a faster engine's steps priced at a CPU-bound
engine's power: the H100 fit's 305 W at its first point, a batch of 64, is 41% under v3's 514 W
for Qwen3-8B chat there).

The ``mlenergy-v3-*`` fits: ML.ENERGY Leaderboard v3.0 (vLLM 0.11, github.com/ml-energy/leaderboard
at 0cd52dab; experiments/data/energy/mlenergy-v3/dense.csv), Qwen3-8B on LM Arena chat, one GPU,
the saturated points (mean batch at least 0.95 of ``max_num_seqs``): ``avg_power_watts``
against ``avg_batch_size``.
"""

FITS: dict[str, dict] = {
    "mlenergy-a100-40gb-llama-3.1-8b": {
        "gpu": "a100-40gb", "by": "sequences",
        "points": [[31.9, 198.3], [63.9, 201.9], [127.8, 188.0], [191.6, 192.3], [255.4, 189.3], [319.2, 195.2]],
        "cycle_ms": [34.0, 51.3, 84.2, 119.9, 147.1, 172.5],
        "source": "ML.ENERGY v2, Llama-3.1-8B-Instruct on A100-SXM4-40GB, vLLM 0.5.4, chat"},
    "mlenergy-h100-80gb-llama-3.1-8b": {
        "gpu": "h100-80gb", "by": "sequences",
        "points": [[63.9, 305.3], [127.8, 281.2], [191.6, 294.0], [255.4, 276.0], [319.2, 274.2], [509.8, 245.7],
                   [761.7, 251.3], [975.7, 243.6]],
        "cycle_ms": [35.8, 59.4, 77.4, 111.6, 136.3, 252.1, 349.9, 448.1],
        "source": "ML.ENERGY v2, Llama-3.1-8B-Instruct on H100 80GB HBM3, vLLM 0.5.4, chat"},
    "mlenergy-v3-h100-80gb-qwen3-8b": {
        "gpu": "h100-80gb", "by": "sequences",
        "points": [[8.0, 427.0], [16.0, 451.3], [31.9, 478.1], [63.9, 514.4], [95.8, 543.8], [127.8, 573.0],
                   [191.7, 600.2], [255.5, 632.8], [383.0, 621.7]],
        "source": "ML.ENERGY v3.0, Qwen3-8B on H100 SXM, vLLM 0.11, LM Arena chat"},
    "mlenergy-v3-b200-qwen3-8b": {
        "gpu": "b200", "by": "sequences",
        "points": [[7.9, 646.3], [15.9, 532.4], [31.9, 494.1], [63.8, 543.0], [127.7, 747.9], [255.4, 830.6],
                   [511.0, 752.2], [1022.4, 722.9]],
        "source": "ML.ENERGY v3.0, Qwen3-8B on B200, vLLM 0.11, LM Arena chat"},
}
