"""What the derivations from NVIDIA's aiconfigurator timings share (github.com/ai-dynamo/aiconfigurator,
Apache-2.0): writing the subset of its tables that a derivation reads, shipped in
``tests/data/aiconfigurator/`` so that the derivation and its tests run without a checkout."""

from __future__ import annotations

import csv
from pathlib import Path


def write_subset(rows: list[dict], path: Path, columns: tuple[str, ...]) -> None:
    """``rows`` as a CSV of ``columns`` at ``path`` (its folder made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
