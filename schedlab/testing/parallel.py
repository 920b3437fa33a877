"""Running data-parallel (lockstep) and pipeline-parallel deployments from plugin objects.

:class:`LinearParallelCost` is a cost model with every optional part the parallel layouts ask
for, in exact binary fractions (the ``linear`` model's iteration as one rank's part and as the
layers split over stages, a linear price for the experts and for the stages' sends), so
hand-computed cases and the differential tests between the engines are exact. For power models
it says a lockstep rank's work at linear prices too (``rank_work``, ``experts_work``, and the
busiest GPU's ``busiest_experts_work`` at ``expert_balancedness``), and an
iteration's and a pipeline stage's (``work``, ``stage_work``: equal shares, as the time).
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs

from ..energy.work import Work, joined, phases_of
from ..engine.rank_cost import rank_view
from ..engine.recorder import Recorder
from ..engine.reference import ReferenceEngine
from ..results.records import RunResult
from ..speculative import SpeculativeConfig
from .kit import _energy_meta, _meters, _speculative_meta, in_arrival_order, serve, speculating


@attrs.frozen
class ParallelPrices:
    """The extra prices of :class:`LinearParallelCost` (ms)."""

    expert_base_ms: float = 1.0          # a step's experts, whatever the tokens
    expert_ms_per_token: float = 0.0625  # per token of all ranks together (the busiest GPU's experts)
    dispatch_ms_per_token: float = 0.125  # per token of the largest rank (all-gather and reduce-scatter, padded)
    send_ms_per_token: float = 0.0625    # pipeline: activations of one token from a stage to the next
    send_base_ms: float = 0.25
    hop_send_scale: tuple = ()            # pipeline: each hop's send as a multiple of the above (() : one send)
    # the work of a lockstep step on one GPU (bytes, FLOPs), for power models:
    rank_bytes: float = 2e9                # a rank's own weights, read every step it computes
    bytes_per_token: float = 1e8           # ... and per token of its batch
    bytes_per_context_token: float = 1e7   # the KV its attention reads (decode and prefill context)
    flops_per_token: float = 5e10          # its own layers' FLOPs per token
    expert_bytes_per_token: float = 1e8    # the experts, per token of all ranks, spread over the ranks' GPUs
    expert_flops_per_token: float = 1e10
    # mean / max of the (token, expert) pairs the GPUs compute: the busiest GPU computes 1 / this
    # of the mean GPU's FLOPs and reads its bytes (the clock stretches the experts on it)
    expert_balancedness: float = 1.0


class LinearParallelCost:
    """The ``linear`` cost model (``inner``) with a data-parallel rank's part, the experts of a
    lockstep step and pipeline stages (each stage an equal share of the iteration)."""

    def __init__(self, inner, prices: ParallelPrices = ParallelPrices(), stages: int = 1, moe: bool = True):
        self.inner = inner
        self.prices = prices
        self.stages = stages
        self.moe = moe
        self.config = getattr(inner, "config", None)

    def rank_ms(self, batch) -> float:
        return self.inner.iteration_ms(batch)

    def experts_ms(self, tokens: Sequence[int]) -> float | None:
        if not self.moe:
            return None
        p = self.prices
        return p.expert_base_ms + p.expert_ms_per_token * sum(tokens) + p.dispatch_ms_per_token * max(tokens)

    def iteration_ms(self, batch) -> float:
        ms = self.rank_ms(batch)
        return ms + self.experts_ms((batch.num_batched_tokens,)) if self.moe else ms

    def decode_step_increment(self, batch):
        return self.inner.decode_step_increment(batch)

    def rank_work(self, batch) -> tuple[float, float]:
        """A rank's own part of a step: weights, tokens and context at the prices."""
        tokens = batch.num_batched_tokens
        if not tokens:
            return 0.0, 0.0
        p = self.prices
        context = batch.decode_context_tokens + batch.prefill_context_tokens
        return (p.rank_bytes + p.bytes_per_token * tokens + p.bytes_per_context_token * context,
                p.flops_per_token * tokens)

    def experts_work(self, tokens: Sequence[int]) -> tuple[float, float]:
        """Each GPU's share of the experts of all ranks' tokens."""
        p = self.prices
        share = sum(tokens) / len(tokens)
        return p.expert_bytes_per_token * share, p.expert_flops_per_token * share

    def busiest_experts_work(self, tokens: Sequence[int]) -> tuple[float, float]:
        """The busiest GPU's experts: the mean GPU's bytes, ``1 / expert_balancedness`` of its FLOPs."""
        byt, flops = self.experts_work(tokens)
        b = self.prices.expert_balancedness
        return (byt, flops) if b >= 1.0 else (byt, flops / b)

    def pipeline_ms(self, batch):
        share = self.iteration_ms(batch) / self.stages
        p = self.prices
        send = p.send_base_ms + p.send_ms_per_token * batch.num_batched_tokens
        if p.hop_send_scale:
            return (share,) * self.stages, tuple(send * scale for scale in p.hop_send_scale)
        return (share,) * self.stages, send

    def work(self, batch) -> tuple[float, float]:
        """An iteration's work on one GPU: its own part and (a MoE model) its tokens' experts."""
        own = self.rank_work(batch)
        if not (self.moe and batch.num_batched_tokens):
            return own
        return joined(own, self.experts_work((batch.num_batched_tokens,)))

    def stage_work(self, batch) -> tuple[tuple[float, float], ...]:
        """Each stage's equal share of :meth:`work`, phase by phase (as :meth:`pipeline_ms` splits the time)."""
        work = self.work(batch)
        n = self.stages
        return (Work([(b / n, f / n) for b, f in phases_of(work)], (work[0] / n, work[1] / n)),) * n


def run_data_parallel(requests: Sequence, make: Callable[[], tuple], ranks: int, router=None, *,
                      engine: str = "fast", workload=None, name: str = "test", client_side=None,
                      power: Callable | None = None, speculative: SpeculativeConfig | None = None, draft_cost=None,
                      seed: int = 0, clock: Callable | None = None, sync: tuple = (1, False)) -> RunResult:
    """Simulate ``requests`` on ``ranks`` data-parallel ranks stepping together.

    ``make`` makes one rank's ``(scheduler, cost model, KV cache)``; the cost model needs
    ``rank_ms`` and ``experts_ms`` (e.g. :class:`LinearParallelCost`). ``meta["kvs"]`` holds every
    rank's KV cache and ``meta["data_parallel"]`` what the lockstep did. ``client_side``: the
    front end and timeouts (:mod:`schedlab.frontend`). ``power(cost)`` makes a rank's power
    model from what the rank sees of its cost model (its :class:`RankCost`; the cost model then
    needs ``rank_work`` and ``experts_work`` for models that ask for work); the run then meters
    energy (``meta["energy"]``). ``speculative``, ``draft_cost`` and ``seed``: every rank drafts
    and verifies its own sequences (as in :func:`~schedlab.testing.run_engine`); ``clock(cost)``
    puts each rank's cost model at a clock around its drafting. ``sync``: ``(dp_sync_interval,
    check a wave's first step)``, when the ranks check that none has work (default: every step).
    """
    from ..engine.instance import Instance
    from ..engine.lockstep import DataParallelCluster, simulate_data_parallel
    from ..engine.reference_lockstep import ReferenceDataParallel

    rec = Recorder(output_delay_ms=client_side.output_delay_ms if client_side is not None else 0.0)
    parts, spec = speculating([make() for _ in range(ranks)], speculative, draft_cost, seed, clock)
    views = [rank_view(c) for _, c, _ in parts]
    meters = _meters(power, views)
    if engine == "reference":
        engines = [ReferenceEngine(s, views[i], k, rec, index=i, meter=meters[i], speculation=spec)
                   for i, (s, _, k) in enumerate(parts)]
        cluster = ReferenceDataParallel(engines, router, client_side=client_side, sync=sync)
        cluster.run(in_arrival_order(requests), workload=workload)
    else:
        engines = [Instance(i, s, views[i], k, rec, meter=meters[i], speculation=spec)
                   for i, (s, _, k) in enumerate(parts)]
        cluster = DataParallelCluster(engines, router, sync=sync)
        simulate_data_parallel(in_arrival_order(requests), cluster, workload=workload, client_side=client_side)
    meta = {"slots": None, "num_blocks": sum(e.kv.num_blocks for e in engines), "instances": ranks,
            "events": sum(e.events for e in engines),
            "data_parallel": {"ranks": ranks, "steps": cluster.steps, "dummy_rank_steps": cluster.dummy_steps,
                              "experts_ms": cluster.experts_ms},
            **_speculative_meta(speculative), **_energy_meta(meters, rec)}
    result = RunResult.from_recorder(name, rec, settings={}, meta=meta)
    result.meta["kvs"], result.meta["engine"] = [e.kv for e in engines], engine
    return result


def run_deployments(requests: Sequence, make: Callable[[], tuple], deployments: int, ranks: int, router=None,
                    rank_router: Callable | None = None, *, engine: str = "fast", workload=None, name: str = "test",
                    client_side=None, power: Callable | None = None, autoscaler=None, limits=None,
                    sync: tuple = (1, False)) -> RunResult:
    """Simulate ``requests`` on ``deployments`` data-parallel deployments of ``ranks`` ranks each,
    a deployment's ranks stepping together, behind ``router`` (which picks the deployment);
    ``rank_router()`` makes each deployment's own router (which picks the rank).

    ``make`` makes one rank's ``(scheduler, cost model, KV cache)``, as for
    :func:`run_data_parallel`; rank ``r`` of deployment ``d`` is instance ``d * ranks + r``.
    ``meta["data_parallel"]`` says what the deployments did
    (:func:`~schedlab.engine.lockstep.deployments_summary`), ``meta["kvs"]`` holds every rank's KV
    cache. ``power(cost)`` meters every rank (``meta["energy"]``). ``autoscaler`` (a policy object)
    with ``limits`` (a :class:`~schedlab.engine.scaling.ScalingLimits`) scales whole deployments
    (``meta["scaling"]``, each deployment ``ranks`` GPUs; energy from 0). ``sync``: as for
    :func:`run_data_parallel`, each deployment's.
    """
    from ..engine.instance import Instance
    from ..engine.load import RoutingClock
    from ..engine.lockstep import DataParallelCluster, deployments_summary
    from ..engine.reference_lockstep import ReferenceDataParallel, ReferenceDeployments
    from ..engine.scaling import deployment_scaling

    rec = Recorder(output_delay_ms=client_side.output_delay_ms if client_side is not None else 0.0)
    parts = [make() for _ in range(deployments * ranks)]
    views = [rank_view(c) for _, c, _ in parts]
    meters = _meters(power, views)
    if engine == "reference":
        engines = [ReferenceEngine(s, views[i], k, rec, index=i, meter=meters[i]) for i, (s, _, k) in enumerate(parts)]
        wrapper = ReferenceDataParallel
    else:
        engines = [Instance(i, s, views[i], k, rec, meter=meters[i]) for i, (s, _, k) in enumerate(parts)]
        wrapper = DataParallelCluster
    groups = [range(d * ranks, (d + 1) * ranks) for d in range(deployments)]
    deps = [wrapper([engines[i] for i in group], rank_router() if rank_router is not None else None, index=d,
                    sync=sync) for d, group in enumerate(groups)]
    scaling = None
    if autoscaler is not None:
        scaling = deployment_scaling(autoscaler, limits, deps, RoutingClock(), gpus_per_instance=[ranks] * deployments,
                                     meters=[[meters[i] for i in group] for group in groups])
    scaled = serve(requests, deps, router, rec, ReferenceDeployments, engine=engine, workload=workload,
                   client_side=client_side, scaling=scaling)
    meta = {"slots": None, "num_blocks": sum(e.kv.num_blocks for e in engines), "instances": len(engines),
            "gpus": len(engines), "events": sum(e.events for e in engines), "data_parallel": deployments_summary(deps),
            **scaled, **_energy_meta(meters, rec, 0.0 if scaling is not None else None)}
    result = RunResult.from_recorder(name, rec, settings={}, meta=meta)
    result.meta["kvs"], result.meta["engine"] = [e.kv for e in engines], engine
    return result


def run_pipelined(requests: Sequence, make: Callable[[], tuple], stages: int, instances: int = 1, router=None, *,
                  engine: str = "fast", workload=None, name: str = "test", client_side=None,
                  power: Callable | None = None, autoscaler=None, limits=None,
                  speculative: SpeculativeConfig | None = None, draft_cost=None, seed: int = 0,
                  clock: Callable | None = None) -> RunResult:
    """Simulate ``requests`` on ``instances`` instances of ``stages`` pipeline stages each.

    ``make`` makes one instance's ``(scheduler, cost model, KV cache)``; the cost model needs
    ``pipeline_ms`` (e.g. :class:`LinearParallelCost` with ``stages``). ``meta["kvs"]`` holds
    every instance's KV cache. ``client_side``: the API server in front and the clients'
    timeouts (:mod:`schedlab.frontend`). ``power(cost)`` makes one stage's power model from
    what the instance sees of its cost model (its :class:`~schedlab.engine.stage_cost.StageCost`;
    the cost model then needs ``stage_work`` for models that ask for work); the run then meters
    every stage (``meta["energy"]``, :mod:`schedlab.energy.pipeline`). ``autoscaler`` (a policy
    object) with ``limits`` (a :class:`~schedlab.engine.scaling.ScalingLimits`) scales the
    instances (``meta["scaling"]``, each instance ``stages`` GPUs; energy from 0). ``speculative``,
    ``draft_cost`` and ``seed``: each instance drafts on its last stage and verifies through all
    (as in :func:`~schedlab.testing.run_engine`); ``clock(cost)`` puts each instance's cost model
    at a clock around its drafting.
    """
    from ..energy.pipeline import PipelineMeter
    from ..engine.instance import Instance
    from ..engine.load import RoutingClock
    from ..engine.pipeline import PipelinedInstance
    from ..engine.reference_pipeline import ReferencePipeline, ReferencePipelineCluster
    from ..engine.scaling import pipeline_scaling
    from ..engine.stage_cost import stage_view

    rec = Recorder(output_delay_ms=client_side.output_delay_ms if client_side is not None else 0.0)
    parts, spec = speculating([make() for _ in range(instances)], speculative, draft_cost, seed, clock)
    views = [stage_view(c) for _, c, _ in parts]
    meters = [PipelineMeter(power(view), view, stages) if power is not None else None for view in views]
    if engine == "reference":
        engines = [ReferencePipeline(ReferenceEngine(s, views[i], k, rec, index=i, meter=meters[i], speculation=spec),
                                     stages)
                   for i, (s, _, k) in enumerate(parts)]
    else:
        engines = [PipelinedInstance(Instance(i, s, views[i], k, rec, meter=meters[i], speculation=spec), stages)
                   for i, (s, _, k) in enumerate(parts)]
    scaling = (pipeline_scaling(autoscaler, limits, engines, RoutingClock(), meters=meters,
                                gpus_per_instance=[stages] * instances) if autoscaler is not None else None)
    scaled = serve(requests, engines, router, rec, ReferencePipelineCluster, engine=engine, workload=workload,
                   client_side=client_side, scaling=scaling)
    meta = {"slots": None, "num_blocks": sum(e.kv.num_blocks for e in engines), "instances": instances,
            "gpus": stages * instances, "events": sum(e.events for e in engines), **scaled,
            **_speculative_meta(speculative), **_energy_meta(meters, rec, 0.0 if scaling is not None else None)}
    result = RunResult.from_recorder(name, rec, settings={}, meta=meta)
    result.meta["kvs"], result.meta["engine"] = [e.kv for e in engines], engine
    return result
