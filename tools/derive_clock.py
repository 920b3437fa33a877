"""Derive the clock law's default voltage floor (``schedlab.energy.clock.DEFAULT_VOLTAGE_FLOOR``)
from a measurement, at its default knee (``DEFAULT_KNEE``, Voltana's 1,005 of 1,410 MHz: see there).

    python tools/derive_clock.py

The law (``schedlab/energy/clock.py``): below the knee ``k`` (a share of the highest clock) memory
traffic takes ``k / r`` of its time and the core voltage stays at ``voltage_floor``; above it
memory time does not change and the voltage rises linearly to 1. So a memory-bound decode step's
energy falls as the clock comes down to the knee and rises below it (its time grows as ``1 / r``
while the awake share falls only as ``r`` and idle power not at all): energy against the clock
is U-shaped with its bottom at the knee, where it saves ``1 - E(k) / E(1)``, a saving set by the
floor (``v^2`` scales the awake share and ``core_share`` of the work's energy).

The measurement: Ma, Afzal, Eitzinger and Wellein, "The Illusion of Power Capping in LLM Decode"
(arXiv 2605.11999v1, abstract): on an H200, SM clock locking recovers "up to 32% of decode
energy at minimal throughput loss" (four attention architectures; decode at 137-300 W). Read as
the bottom of the U -- the most a locked clock saves on decode, at no loss of speed -- it puts the
floor where the law saves 32% at the knee: ``E(k) / E(1) = 0.68``, solved by bisection for
Llama-3.1-8B decode steps (the GQA architecture the paper names; batches 8-128, 1,000 tokens of
context each) on the ``h200-141gb`` preset, the roofline cost model and the utilisation power
model with their defaults; the default is the median batch's. The paper's own models, batches and
clocks are not in its abstract, the only part read. The floor moves with the power model's
defaults (``awake``, ``activity``: how much of a step's energy the clock can touch): rerun this
when they change.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

#: Ma et al.'s largest decode-energy saving from locking the SM clock (H200)
MEASURED_SAVING = 0.32
GPU, MODEL, CONTEXT = "h200-141gb", "llama-3.1-8b", 1000
BATCHES = (8, 16, 32, 64, 128)


def ratio(inner, gpu, power, batch, r: float, knee: float, floor: float) -> float:
    """A decode step's energy at clock ``r`` over its energy at the highest clock, with the knee
    at ``knee`` and the voltage floor ``floor``."""
    from schedlab.energy.clock import ClockConfig, ClockedCostModel
    from schedlab_plugins.power.utilisation import UtilisationConfig, build_utilisation

    f_max = gpu.max_clock_mhz
    clocked = ClockedCostModel(inner, gpu, ClockConfig(mhz=max(r * f_max, gpu.min_clock_mhz),
                                                       knee_mhz=knee * f_max, voltage_floor=floor))
    at = build_utilisation(UtilisationConfig(), power, clocked)
    full = build_utilisation(UtilisationConfig(), power, inner)
    return at.iteration_j(batch, clocked.iteration_ms(batch)) / full.iteration_j(batch, inner.iteration_ms(batch))


def derive() -> dict:
    import energy_data as ed
    from schedlab.energy import clock as law
    from schedlab.protocols import Batch
    from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel

    presets = ed.presets()
    gpu, spec = presets.gpu(GPU), presets.model(MODEL)
    inner = RooflineCostModel(spec, gpu, RooflineConfig(model=MODEL, gpu=GPU))
    knee = law.DEFAULT_KNEE
    r_min = gpu.min_clock_mhz / gpu.max_clock_mhz
    floors, curves = {}, {}
    for n in BATCHES:
        batch = Batch(num_decode=n, decode_context_tokens=n * CONTEXT)
        lo, hi = 0.1, 1.0  # the saving at the knee shrinks as the floor rises
        for _ in range(50):
            mid = (lo + hi) / 2
            if ratio(inner, gpu, presets, batch, knee, knee, mid) > 1.0 - MEASURED_SAVING:
                hi = mid
            else:
                lo = mid
        floors[n] = (lo + hi) / 2
    floor = round(sorted(floors.values())[len(floors) // 2], 3)  # the median batch's
    for n in BATCHES:
        batch = Batch(num_decode=n, decode_context_tokens=n * CONTEXT)
        curves[n] = {r: ratio(inner, gpu, presets, batch, r, knee, floor)
                     for r in (1.0, 0.9, 0.8, knee, 0.6, 0.5, 0.4, 0.3, 0.2, r_min)}
    return {"knee": knee, "floors": floors, "floor": floor, "curves": curves}


def main() -> int:
    out = derive()
    print(f"voltage floor at which the law saves {MEASURED_SAVING:.0%} of a decode step's energy at the knee "
          f"({out['knee']:.3f} of the highest clock), {MODEL} on {GPU}, context {CONTEXT}:")
    for n, f in out["floors"].items():
        print(f"  batch {n:4}: {f:.3f}")
    print(f"DEFAULT_VOLTAGE_FLOOR = {out['floor']}  (the median batch's)")
    print("energy / energy at the highest clock with that floor (r: share of the highest clock):")
    for n, curve in out["curves"].items():
        print(f"  batch {n:4}: " + "  ".join(f"{r:.3f}: {e:.3f}" for r, e in curve.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
