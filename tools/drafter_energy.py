"""The drafter's share of a speculative step's work, energy and clock stretch, on the roofline.

    python tools/drafter_energy.py [--target llama-3.1-8b] [--drafter llama-3.2-1b] [--gpu h100-80gb] [-k 3]

For decode-only steps of ``n`` sequences (each verifying ``k`` drafts, 1,000 tokens of context)
it prints, per step: the target's and the drafter's time; the step's energy by the
``utilisation`` power model with the target's work only (what was counted before) and with the
drafter's passes added -- phase by phase, as the model is handed them (the target's dense
GEMMs, experts and attention, then each pass's: each its own ``max(memory, compute)``), and
summed into one ``(bytes, FLOPs)`` (the ``max`` of the totals) -- and how much longer the step is at a
half clock when the clock's law stretches the passes together or one by one (what
:class:`~schedlab.energy.clock.ClockedCostModel` does). README: Energy, "The drafter".

With ``--stages P`` (P >= 2) it prints the same steps as batches of a pipelined instance of
``P`` stages, the drafter on the last (vLLM's layout): each stage's time, the first and the last
stage's energy (the last with the target's slice only and with the drafter's passes), and the
last stage's stretch at a half clock, its passes together or one by one.
"""

from __future__ import annotations

import argparse

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.drafting import DraftingCostModel
from schedlab.energy.clock import ClockConfig, ClockedCostModel
from schedlab.engine.stage_cost import stage_view
from schedlab.parallelism import Parallelism
from schedlab.protocols import Batch
from schedlab.speculative import SpeculativeConfig
from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
from schedlab_plugins.power import UtilisationConfig
from schedlab_plugins.power.utilisation import build_utilisation

SIZES = (1, 8, 32, 128, 256)
CONTEXT = 1000


def drafting(target: str, drafter: str, gpu: str, k: int, stages: int = 1) -> tuple[Presets, DraftingCostModel]:
    """The presets and the target's roofline (over ``stages`` pipeline stages) with the drafter's."""
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft={"kind": "roofline"})

    def roofline(name, stages=1):
        return RooflineCostModel(presets.model(name), presets.gpu(gpu), RooflineConfig(model=name, gpu=gpu),
                                 parallelism=Parallelism(pipeline_parallel=stages))

    return presets, DraftingCostModel(roofline(target, stages), roofline(drafter), spec)


def rows(target: str, drafter: str, gpu: str, k: int) -> list[dict]:
    presets, cost = drafting(target, drafter, gpu, k)
    plain = build_utilisation(UtilisationConfig(), presets, cost.target)
    summed = build_utilisation(UtilisationConfig(), presets, cost)
    clock = ClockedCostModel(cost, presets.gpu(gpu), ClockConfig(mhz=presets.gpu(gpu).max_clock_mhz / 2))
    out = []
    for n in SIZES:
        batch = Batch(num_decode=n, decode_context_tokens=n * CONTEXT, spec_tokens=k * n)
        d = cost.iteration_ms(batch)
        parts = [clock.times(*w) for w in cost.work_parts(batch)]
        c, m = clock.times(*cost.work(batch))
        # the step's work summed into one pair: the max of its totals
        pair = _one_pair_j(summed, cost, batch, d)
        out.append({
            "n": n, "target_ms": cost.target.iteration_ms(batch), "drafter_ms": cost.draft_ms(batch), "step_ms": d,
            "target_only_j": plain.iteration_j(batch, d), "model_j": summed.iteration_j(batch, d), "pair_j": pair,
            "stretch_together_ms": clock.stretch(c, m, 0.5),
            "stretch_apart_ms": sum(clock.stretch(ci, mi, 0.5) for ci, mi in parts)})
    return out


def pipeline_rows(target: str, drafter: str, gpu: str, k: int, stages: int) -> list[dict]:
    """:func:`rows`' steps as batches of a pipelined instance, the drafter on the last stage."""
    presets, cost = drafting(target, drafter, gpu, k, stages)
    views = {"plain": stage_view(cost.target), "drafted": stage_view(cost)}
    power = {name: build_utilisation(UtilisationConfig(), presets, view) for name, view in views.items()}
    clock = ClockedCostModel(cost, presets.gpu(gpu), ClockConfig(mhz=presets.gpu(gpu).max_clock_mhz / 2))
    out = []
    for n in SIZES:
        batch = Batch(num_decode=n, decode_context_tokens=n * CONTEXT, spec_tokens=k * n)
        stage_ms, _ = cost.pipeline_ms(batch)
        joules = {}
        for name, view in views.items():
            view.stage = stages - 1
            joules[name] = power[name].iteration_j(batch, stage_ms[-1])
        views["drafted"].stage = 0
        c, m = clock.times(*cost.stage_work(batch)[-1])
        out.append({"n": n, "stage_ms": stage_ms, "first_j": power["drafted"].iteration_j(batch, stage_ms[0]),
                    "last_plain_j": joules["plain"], "last_j": joules["drafted"],
                    "stretch_together_ms": clock.stretch(c, m, 0.5),
                    "stretch_apart_ms": clock.stretch_all(clock.stage_splits(batch)[-1], 0.5)})
    return out


def _one_pair_j(model, cost: DraftingCostModel, batch: Batch, d: float) -> float:
    """The utilisation model's energy with the step's work summed into one ``(bytes, FLOPs)``."""
    byt, flops = cost.work(batch)
    activity = max(byt / model._bytes_per_ms, flops / model._flops_per_ms)
    awake = model.config.awake
    g = awake * d + model.config.activity * activity
    return model._joules(d, g, model._cap(batch, d, awake))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="llama-3.1-8b")
    parser.add_argument("--drafter", default="llama-3.2-1b")
    parser.add_argument("--gpu", default="h100-80gb")
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--stages", type=int, default=1, help="the steps as a pipeline's batches (>= 2 stages)")
    a = parser.parse_args(argv)
    if a.stages > 1:
        print(f"{a.target} over {a.stages} stages + {a.drafter} drafter on the last, k = {a.k}, on {a.gpu}; decode "
              f"batches, {CONTEXT} tokens of context each")
        print(f"{'seqs':>5} {'first':>8} {'last':>8} {'J first':>8} {'J last target':>14} {'J last':>8} "
              f"{'+drafter':>8} {'half clock, last: +ms together':>32} {'apart':>7}")
        for r in pipeline_rows(a.target, a.drafter, a.gpu, a.k, a.stages):
            print(f"{r['n']:>5} {r['stage_ms'][0]:>6.2f}ms {r['stage_ms'][-1]:>6.2f}ms {r['first_j']:>8.3f} "
                  f"{r['last_plain_j']:>14.3f} {r['last_j']:>8.3f} {r['last_j'] / r['last_plain_j'] - 1:>8.1%} "
                  f"{r['stretch_together_ms']:>32.3f} {r['stretch_apart_ms']:>7.3f}")
        return
    print(f"{a.target} + {a.drafter} drafter, k = {a.k}, on {a.gpu}; decode steps, {CONTEXT} tokens of context each")
    print(f"{'seqs':>5} {'target':>8} {'drafter':>8} {'J target':>9} {'J model':>9} {'J 1 pair':>9} "
          f"{'+drafter':>8} {'model/pair':>10} {'half clock: +ms together':>25} {'apart':>7}")
    for r in rows(a.target, a.drafter, a.gpu, a.k):
        print(f"{r['n']:>5} {r['target_ms']:>6.2f}ms {r['drafter_ms']:>6.2f}ms {r['target_only_j']:>9.3f} "
              f"{r['model_j']:>9.3f} {r['pair_j']:>9.3f} {r['model_j'] / r['target_only_j'] - 1:>8.1%} "
              f"{r['model_j'] / r['pair_j'] - 1:>+10.2%} {r['stretch_together_ms']:>25.3f} "
              f"{r['stretch_apart_ms']:>7.3f}")


if __name__ == "__main__":
    main()
