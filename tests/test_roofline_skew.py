"""The roofline's uneven-context terms (``decode_skew_alpha``, ``mixed_skew_alpha``) and where
they come from: LLMServingSim's skew shots (``skew.csv``, in ``../shared`` only) through
``tools/derive_roofline.py``, cross-checked on the fitted alphas the shipped bundles carry."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import derive_roofline as derive  # noqa: E402

from schedlab_plugins.cost_models.roofline import DERIVATION  # noqa: E402

SHIPPED = REPO / "experiments" / "data" / "llmservingsim" / "profiles"
COLUMNS = ["regime", "n", "nb", "ratio", "skew", "pc", "kp", "kvs", "kv_big", "kv_mean",
           "t_mean_us", "t_max_us", "t_skew_us", "alpha"]


def _write_shots(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for regime, alpha in rows:
            writer.writerow([regime, 4, 1, 0.25, 4.0, 0 if regime == "pure" else 256, 0, 512, 2048, 896,
                             "" if alpha is None else 100.0, "" if alpha is None else 200.0, "", alpha or ""])


def test_the_alphas_are_the_median_shot_of_each_regime(tmp_path):
    bundle_dir = derive.BUNDLES[0][0]
    _write_shots(tmp_path / bundle_dir / "tp1" / "skew.csv",
                 [("pure", 0.01), ("pure", 0.05), ("pure", 0.02), ("mixed", 0.3), ("mixed", 0.1), ("mixed", None)])
    _write_shots(tmp_path / bundle_dir / "tp2" / "skew.csv", [("pure", 0.04), ("mixed", 0.2)])
    rows = derive.skew_alphas(tmp_path)
    assert [(r["decode_skew_alpha"], r["mixed_skew_alpha"]) for r in rows.values()] == [(0.02, 0.2), (0.04, 0.2)]
    # a failed shot (no timings) is skipped, not read as 0
    assert derive.pooled_skew(rows) == {"decode_skew_alpha": 0.03, "mixed_skew_alpha": 0.2}


def test_the_shipped_bundles_fitted_alphas_agree_with_the_defaults():
    """The shipped bundles carry LLMServingSim's alphas fitted per bucket (``skew_fit.csv``,
    with the shots behind each): their shot-weighted medians are the defaults' within 0.02 --
    the skew is the kernel's, not one bundle's."""
    for path in sorted(SHIPPED.glob("*/*/*/bf16/tp*/skew_fit.csv")):
        with open(path, newline="") as fh:
            rows = [(int(r["pc"]), float(r["alpha"]), int(r["n_samples"])) for r in csv.DictReader(fh)]
        for mixed, key in ((False, "decode_skew_alpha"), (True, "mixed_skew_alpha")):
            alphas = np.array([a for pc, a, _ in rows if (pc > 0) == mixed])
            weights = np.array([n for pc, _, n in rows if (pc > 0) == mixed])
            order = np.argsort(alphas)
            cumulative = np.cumsum(weights[order])
            median = alphas[order][np.searchsorted(cumulative, cumulative[-1] / 2)]
            assert median == pytest.approx(DERIVATION[key], abs=0.02), (path, key)


@pytest.mark.skipif(not (derive.SHARED / "profiler" / "perf").is_dir(), reason="needs ../shared/calibration")
def test_the_defaults_are_what_the_derivation_prints():
    rows = derive.skew_alphas(derive.SHARED / "profiler" / "perf")
    assert len(rows) == 7
    assert derive.pooled_skew(rows) == {k: DERIVATION[k] for k in ("decode_skew_alpha", "mixed_skew_alpha")}


def test_the_context_range_heaps_stay_as_small_as_the_decode_set():
    """The longest and shortest decode context come from lazy-deletion heaps; a finished
    sequence whose entry never reaches the top (in the shortest-context heap, every old one)
    is dropped when the heaps outgrow the decode set, so 2,000 requests through 8 slots leave
    a few dozen entries, not thousands."""
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog
    from schedlab.engine.driver import simulate
    from schedlab.engine.instance import Instance
    from schedlab.engine.recorder import Recorder
    from schedlab.model import Request
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
    from schedlab_plugins.kv_caches import PagedKVCache
    from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

    presets = Presets.from_catalog(load_catalog(entry_points=False))
    cost = RooflineCostModel(presets.model("llama-3-8b"), presets.gpu("a100-80gb"),
                             RooflineConfig(model="llama-3-8b", gpu="a100-80gb"))
    requests = [Request(i, 5.0 * i, 20 + 37 * i % 400, 5 + 13 * i % 60) for i in range(2000)]
    inst = Instance(0, ContinuousScheduler(ContinuousConfig(max_num_seqs=8)), cost, PagedKVCache(4096, 16), Recorder())
    assert inst.track_range
    simulate(list(requests), [inst])
    assert inst.rec.recorded == 2000
    assert len(inst.anchor_low) <= 2 * 8 + 64 and len(inst.anchor_high) <= 2 * 8 + 64
