"""Run a case through a schedlab scheduler preset, built from tables as a TOML file would build
it, on the ``linear`` cost model at exactly 1 ms per iteration.

A harness subclasses :class:`SchedlabRunner` with the tables of its case (:meth:`tables`) and
the outcome it compares (:meth:`outcome`).
"""

from __future__ import annotations

import math

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.engine.driver import simulate
from schedlab.engine.instance import Instance
from schedlab.engine.pipeline import PipelinedInstance
from schedlab.engine.recorder import Recorder
from schedlab.engine.reference import ReferenceEngine
from schedlab.engine.reference_pipeline import ReferencePipeline, ReferencePipelineCluster
from schedlab.engine.stage_cost import stage_view
from schedlab.errors import SchedlabError
from schedlab.model import Request
from schedlab.results import RunResult
from schedlab.study.simulation import Context, build_component

from .case import Case, Sides
from .tokens import block_hashes, prompt_token_ids

# base_ms = 1 and nothing else: every iteration that computes anything lasts 1 ms, whatever
# its batch (iteration_ms = base + prefill x 0 + decode x 0).
ONE_MS_PER_ITERATION = {"kind": "linear", "prefill_ms_per_token": 0.0, "decode_ms_per_step": 0.0,
                        "per_seq_ms": 0.0, "per_context_token_ms": 0.0, "base_ms": 1.0}


def requests(case: Case, hash_block_tokens: int) -> list[Request]:
    """schedlab requests in arrival order, with the block hashes of their prompt tokens, one
    per ``hash_block_tokens`` tokens."""
    b = hash_block_tokens
    return [Request(id=r.id, arrival_ms=float(r.arrival), prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
                    max_tokens=r.max_tokens, priority=r.priority,
                    timeout_ms=None if r.abort_at is None else r.abort_at - r.arrival,  # (no front end: no hang-up time)
                    block_hashes=block_hashes(prompt_token_ids(r), b), hash_block_tokens=b)
            for r in case.in_arrival_order()]


class ChunkLog:
    """Wraps a scheduler and writes down, per request id, the prompt tokens every iteration's
    plan gives it (``plan.prefills``: first chunks, later chunks and recomputations alike).
    Everything else is the wrapped scheduler's."""

    def __init__(self, scheduler):
        self._scheduler = scheduler
        self.chunks: dict[int, list[int]] = {}

    def __getattr__(self, name):
        return getattr(self._scheduler, name)

    def schedule(self, plan):
        returned = self._scheduler.schedule(plan)
        for seq, n in plan.prefills:
            self.chunks.setdefault(seq.request.id, []).append(n)
        return returned  # (not None: the engine's error, as without the log)


class OneMsStages:
    """A pipelined instance's clock for the harness: every batch that computes anything takes
    1 ms on each of ``stages`` stages, and sending its activations on takes none (so a batch
    lands ``stages`` ms after its launch when the stages are free, and one launched behind it
    1 ms later)."""

    def __init__(self, stages: int):
        self.stages = stages

    def iteration_ms(self, batch) -> float:
        return float(self.stages)

    def decode_step_increment(self, batch) -> float:
        return 0.0

    def pipeline_ms(self, batch) -> tuple[tuple[float, ...], float]:
        return (1.0,) * self.stages, 0.0


def simulate_one(reqs: list[Request], scheduler, cost, kv, engine: str = "fast", stages: int = 1,
                 speculation=None) -> RunResult:
    """One instance, as :func:`schedlab.testing.run_engine` runs it (that package needs
    hypothesis, which the harness does not); with ``stages`` > 1 a pipelined one, its batches
    timed by :class:`OneMsStages` (``cost`` unused), as :func:`schedlab.testing.run_pipelined`
    runs it; ``speculation``: speculative decoding's :class:`~schedlab.speculative.Speculation`
    (the drafts cost nothing: a step, or a stage, still lasts 1 ms)."""
    rec = Recorder()
    if speculation is not None and stages == 1:
        if engine == "reference":
            ReferenceEngine(scheduler, cost, kv, rec, speculation=speculation).run(reqs)
        else:
            simulate(reqs, [Instance(0, scheduler, cost, kv, rec, speculation=speculation)])
        return RunResult.from_recorder("diffcheck", rec, settings={}, meta={"num_blocks": kv.num_blocks})
    if stages > 1:
        view = stage_view(OneMsStages(stages))
        if engine == "reference":
            ReferencePipelineCluster([ReferencePipeline(ReferenceEngine(scheduler, view, kv, rec, speculation=speculation),
                                                        stages)]).run(reqs)
        else:
            simulate(reqs, [PipelinedInstance(Instance(0, scheduler, view, kv, rec, speculation=speculation), stages)])
    elif engine == "reference":
        ReferenceEngine(scheduler, cost, kv, rec).run(reqs)
    else:
        simulate(reqs, [Instance(0, scheduler, cost, kv, rec)])
    return RunResult.from_recorder("diffcheck", rec, settings={}, meta={"num_blocks": kv.num_blocks})


def whole_ms(x) -> int | None:
    """A time as whole ms; None for none (nan, or -1: an aborted request never scheduled or
    never given a token)."""
    x = float(x)
    return None if math.isnan(x) or x < 0 else int(x)


class SchedlabRunner:
    """Builds plugins through the registry (so ``--set scheduler.KEY`` meets the same checks as
    in a TOML file) and runs cases on the fast or the reference engine."""

    def __init__(self, engine: str = "fast"):
        catalog = load_catalog()
        self.ctx = Context(catalog, Presets(catalog["model"], catalog["gpu"]), ".", "diffcheck")
        self.engine = engine

    def tables(self, case: Case, sides: Sides | None = None) -> dict[str, dict]:
        """The scheduler, cost model and KV cache tables of ``case``."""
        raise NotImplementedError

    def hash_block_tokens(self, case: Case) -> int:
        raise NotImplementedError

    def outcome(self, row: dict, chunks: tuple):
        """The compared outcome of one request from its ``requests.csv`` row and its chunks."""
        raise NotImplementedError

    def stages(self, case: Case) -> int:
        """Pipeline stages of ``case``'s instance (1: none)."""
        return 1

    def speculation(self, case: Case):
        """Speculative decoding's :class:`~schedlab.speculative.Speculation` for ``case`` (None: off)."""
        return None

    def build(self, case: Case, sides: Sides | None = None):
        """(scheduler, cost model, KV cache) for ``case``; raises ConfigError on a bad key."""
        t = self.tables(case, sides)
        return tuple(build_component(self.ctx, kind, t[kind], f"diffcheck [{kind}]")
                     for kind in ("scheduler", "cost_model", "kv_cache"))

    def run(self, case: Case, sides: Sides | None = None):
        """Per-request outcomes, and the error text if the run failed (then every outcome is
        empty)."""
        scheduler, cost, kv = self.build(case, sides)
        log = ChunkLog(scheduler)
        stages = self.stages(case)
        try:
            result = simulate_one(requests(case, self.hash_block_tokens(case)), log, cost, kv, self.engine, stages,
                                  speculation=self.speculation(case))
        except SchedlabError as exc:
            empty = {"first_scheduled_ms": math.nan, "first_token_ms": math.nan, "finish_ms": math.nan,
                     "preemptions": 0, "cached_tokens": 0}
            return {r.id: self.outcome(empty, ()) for r in case.requests}, f"schedlab: {exc}"
        c = result.counters
        if stages == 1 and c["busy_ms"] != c["iterations"]:
            raise AssertionError(f"iterations must cost 1 ms each: {c['iterations']} iterations, {c['busy_ms']} ms")
        q = result.requests
        ids = q["id"].tolist()
        out = {}
        for i, rid in enumerate(ids):
            row = {name: q[name][i] for name in ("first_scheduled_ms", "first_token_ms", "finish_ms",
                                                  "preemptions", "cached_tokens")}
            if q["aborted"][i] or (q["rejected"][i] and q["finish_ms"][i] >= 0):
                row["finish_ms"] = math.nan  # (its client gave up, or the queue turned it away: it never finished)
            out[rid] = self.outcome(row, tuple(log.chunks.get(rid, ())))
        rejected = [rid for i, rid in enumerate(ids) if q["rejected"][i] and q["finish_ms"][i] < 0]
        return out, (f"schedlab rejected {rejected}" if rejected else None)
