"""The drafter's share of a speculative step's work, energy and clock stretch, on the roofline.

    python tools/drafter_energy.py [--target llama-3.1-8b] [--drafter llama-3.2-1b] [--gpu h100-80gb] [-k 3]

For decode-only steps of ``n`` sequences (each verifying ``k`` drafts, 1,000 tokens of context)
it prints, per step: the target's and the drafter's time; the step's energy by the
``utilisation`` power model with the target's work only (what was counted before) and with the
drafter's passes added -- summed into one ``(bytes, FLOPs)`` (what the model is handed) and
pass by pass (each pass's own ``max(memory, compute)``) -- and how much longer the step is at a
half clock when the clock's law stretches the passes together or one by one (what
:class:`~schedlab.energy.clock.ClockedCostModel` does). README: Energy, "The drafter".
"""

from __future__ import annotations

import argparse

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.drafting import DraftingCostModel
from schedlab.energy.clock import ClockConfig, ClockedCostModel
from schedlab.protocols import Batch
from schedlab.speculative import SpeculativeConfig
from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
from schedlab_plugins.power import UtilisationConfig
from schedlab_plugins.power.utilisation import build_utilisation

SIZES = (1, 8, 32, 128, 256)
CONTEXT = 1000


def rows(target: str, drafter: str, gpu: str, k: int) -> list[dict]:
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft={"kind": "roofline"})

    def roofline(name):
        return RooflineCostModel(presets.model(name), presets.gpu(gpu), RooflineConfig(model=name, gpu=gpu))

    cost = DraftingCostModel(roofline(target), roofline(drafter), spec)
    plain = build_utilisation(UtilisationConfig(), presets, cost.target)
    summed = build_utilisation(UtilisationConfig(), presets, cost)
    clock = ClockedCostModel(cost, presets.gpu(gpu), ClockConfig(mhz=presets.gpu(gpu).max_clock_mhz / 2))
    out = []
    for n in SIZES:
        batch = Batch(num_decode=n, decode_context_tokens=n * CONTEXT, spec_tokens=k * n)
        d = cost.iteration_ms(batch)
        parts = [clock.times(*w) for w in cost.work_parts(batch)]
        c, m = clock.times(*cost.work(batch))
        # the utilisation model pass by pass: each pass's activity alone, summed (its own max)
        apart = _apart_j(summed, cost, batch, d)
        out.append({
            "n": n, "target_ms": cost.target.iteration_ms(batch), "drafter_ms": cost.draft_ms(batch), "step_ms": d,
            "target_only_j": plain.iteration_j(batch, d), "summed_j": summed.iteration_j(batch, d), "apart_j": apart,
            "stretch_together_ms": clock.stretch(c, m, 0.5),
            "stretch_apart_ms": sum(clock.stretch(ci, mi, 0.5) for ci, mi in parts)})
    return out


def _apart_j(model, cost: DraftingCostModel, batch: Batch, d: float) -> float:
    """The utilisation model's energy with each pass's ``max(memory, compute)`` taken alone."""
    activity = sum(max(b / model._bytes_per_ms, f / model._flops_per_ms) for b, f in cost.work_parts(batch))
    awake = model.config.awake
    g = awake * d + model.config.activity * activity
    return model._joules(d, g, model._cap(batch, d, awake))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="llama-3.1-8b")
    parser.add_argument("--drafter", default="llama-3.2-1b")
    parser.add_argument("--gpu", default="h100-80gb")
    parser.add_argument("-k", type=int, default=3)
    a = parser.parse_args(argv)
    print(f"{a.target} + {a.drafter} drafter, k = {a.k}, on {a.gpu}; decode steps, {CONTEXT} tokens of context each")
    print(f"{'seqs':>5} {'target':>8} {'drafter':>8} {'J target':>9} {'J summed':>9} {'J apart':>9} "
          f"{'+drafter':>8} {'sum/apart':>9} {'half clock: +ms together':>25} {'apart':>7}")
    for r in rows(a.target, a.drafter, a.gpu, a.k):
        print(f"{r['n']:>5} {r['target_ms']:>6.2f}ms {r['drafter_ms']:>6.2f}ms {r['target_only_j']:>9.3f} "
              f"{r['summed_j']:>9.3f} {r['apart_j']:>9.3f} {r['summed_j'] / r['target_only_j'] - 1:>8.1%} "
              f"{r['summed_j'] / r['apart_j'] - 1:>+9.2%} {r['stretch_together_ms']:>25.3f} "
              f"{r['stretch_apart_ms']:>7.3f}")


if __name__ == "__main__":
    main()
