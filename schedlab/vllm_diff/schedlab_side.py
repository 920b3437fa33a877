"""Run a case through schedlab's ``vllm`` scheduler preset, built from tables as a TOML file
would build it, on the ``linear`` cost model at exactly 1 ms per iteration."""

from __future__ import annotations

import math

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.engine.driver import simulate
from schedlab.engine.instance import Instance
from schedlab.engine.recorder import Recorder
from schedlab.engine.reference import ReferenceEngine
from schedlab.errors import SchedlabError
from schedlab.model import Request
from schedlab.results import RunResult
from schedlab.study.simulation import Context, build_component

from .case import Case, Outcome, Sides
from .tokens import block_hashes, prompt_token_ids

# base_ms = 1 and nothing else: every iteration that computes anything lasts 1 ms, whatever
# its batch (iteration_ms = base + prefill x 0 + decode x 0).
ONE_MS_PER_ITERATION = {"kind": "linear", "prefill_ms_per_token": 0.0, "decode_ms_per_step": 0.0,
                        "per_seq_ms": 0.0, "per_context_token_ms": 0.0, "base_ms": 1.0}


def tables(case: Case, sides: Sides | None = None) -> dict[str, dict]:
    """The scheduler, cost model and KV cache tables of ``case`` (``sides`` adds schedlab-only
    scheduler keys, which win over the shared settings)."""
    s = case.settings
    scheduler = {"kind": "vllm", "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
                 "long_prefill_token_threshold": s.long_prefill_token_threshold, "policy": s.policy,
                 "chunked_prefill": True}
    if sides is not None:
        scheduler.update(sides.schedlab_scheduler)
    kv = {"kind": "paged", "num_blocks": s.num_blocks, "block_size": s.block_size, "prefix_caching": s.prefix_caching}
    return {"scheduler": scheduler, "cost_model": dict(ONE_MS_PER_ITERATION), "kv_cache": kv}


def requests(case: Case) -> list[Request]:
    """schedlab requests in arrival order, with the block hashes of their prompt tokens
    (``hash_block_tokens = block_size``)."""
    b = case.settings.block_size
    return [Request(id=r.id, arrival_ms=float(r.arrival), prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
                    max_tokens=r.output_tokens, priority=r.priority,
                    block_hashes=block_hashes(prompt_token_ids(r), b), hash_block_tokens=b)
            for r in case.in_arrival_order()]


def simulate_one(reqs: list[Request], scheduler, cost, kv, engine: str = "fast") -> RunResult:
    """One instance, as :func:`schedlab.testing.run_engine` runs it (that package needs
    hypothesis, which the harness does not)."""
    rec = Recorder()
    if engine == "reference":
        ReferenceEngine(scheduler, cost, kv, rec).run(reqs)
    else:
        simulate(reqs, [Instance(0, scheduler, cost, kv, rec)])
    return RunResult.from_recorder("vllm_diff", rec, settings={}, meta={"num_blocks": kv.num_blocks})


def _int(x) -> int | None:
    x = float(x)
    return None if math.isnan(x) else int(x)


class SchedlabRunner:
    """Builds plugins through the registry (so ``--set scheduler.KEY`` meets the same checks as
    in a TOML file) and runs cases on the fast or the reference engine."""

    def __init__(self, engine: str = "fast"):
        catalog = load_catalog()
        self.ctx = Context(catalog, Presets(catalog["model"], catalog["gpu"]), ".", "vllm_diff")
        self.engine = engine

    def build(self, case: Case, sides: Sides | None = None):
        """(scheduler, cost model, KV cache) for ``case``; raises ConfigError on a bad key."""
        t = tables(case, sides)
        return tuple(build_component(self.ctx, kind, t[kind], f"vllm_diff [{kind}]")
                     for kind in ("scheduler", "cost_model", "kv_cache"))

    def run(self, case: Case, sides: Sides | None = None) -> tuple[dict[int, Outcome], str | None]:
        """Per-request outcomes, and the error text if the run failed (then every outcome is
        empty)."""
        scheduler, cost, kv = self.build(case, sides)
        try:
            result = simulate_one(requests(case), scheduler, cost, kv, self.engine)
        except SchedlabError as exc:
            return {r.id: Outcome(None, None, None, 0, 0) for r in case.requests}, f"schedlab: {exc}"
        c = result.counters
        if c["busy_ms"] != c["iterations"]:
            raise AssertionError(f"iterations must cost 1 ms each: {c['iterations']} iterations, {c['busy_ms']} ms")
        q = result.requests
        out = {}
        for i, rid in enumerate(q["id"].tolist()):
            out[rid] = Outcome(_int(q["first_scheduled_ms"][i]), _int(q["first_token_ms"][i]), _int(q["finish_ms"][i]),
                               int(q["preemptions"][i]), int(q["cached_tokens"][i]))
        rejected = [rid for i, rid in enumerate(q["id"].tolist()) if q["rejected"][i]]
        return out, (f"schedlab rejected {rejected}" if rejected else None)
