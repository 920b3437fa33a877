"""Running plugins directly (without TOML) and checking what every correct run satisfies."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs
import numpy as np

from ..drafting import DraftingCostModel
from ..energy.meter import EnergyMeter, close_meters
from ..engine.driver import simulate
from ..engine.instance import Instance
from ..engine.recorder import Recorder
from ..engine.reference import ReferenceEngine
from ..engine.reference_cluster import ReferenceCluster
from ..errors import ConfigError
from ..results.records import RunResult
from ..speculative import Speculation, SpeculativeConfig
from .compare import same_requests_agree


class IterationChecker:
    """An observer asserting per-iteration limits (attach with ``run_engine(check=...)``).

    It sees every iteration, so the fast engine runs step by step while it is attached.

    With speculative decoding it also checks every step's verify pass: a decode verifies at
    most ``k`` drafts (the batch's ``spec_tokens`` <= ``k x num_decode``), yields at least one
    token and at most ``1 +`` its accepted drafts (accepted <= verified), drafts count against
    the token budget, and after the step the KV cache holds exactly the blocks the running
    sequences' counters and reservations call for (a decode keeps the slots its step took, as
    vLLM keeps a request's blocks). A cache that shares prefix blocks holds at most that, and at
    least the blocks no two sequences can share: those past each request's shared prefix
    (:attr:`~schedlab.model.Request.shared_prefix_tokens`), plus the most shared blocks any one
    sequence holds. After every iteration it calls the cache's ``check_invariants()``, when the
    cache has one, on its live state (``invariants=False``: not).

    Besides the limits it always checks for preemption loops: a request must not be preempted
    twice while the KV cache is unchanged -- the same blocks in use and the same requests
    running when it was last preempted, no other request preempted since -- and it has
    generated nothing since. Preempting it again then cannot free anything new; it only burns
    the accelerator (a scheduler whose prefilling request can only ever preempt itself
    readmits and preempts it until something else finishes). Requests preempted in the same
    iteration count as one victim: the same group preempted again so -- none of it further on,
    nobody else preempted since -- is a loop too, as is a return to any earlier such state (a
    loop that readmits its victims in a different order each time). A request that produced a token
    between its preemptions made progress; one preempted again after others were (the cache
    full both times, as under vLLM's rules when blocks are this scarce) saw a changed cache.
    ``loops=False`` turns that check off: it is a heuristic, and vLLM's own rules can trip it --
    with a drafter's lookahead slots, a decode that needs a block preempts a request recomputing
    in chunks, again and again, while the decode progresses; with ``reserve_full_prompt = false``
    a request admitted on its first chunk finds no blocks for its next one and preempts itself
    until a running request finishes (others decoding meanwhile: a KV review's case).
    """

    def __init__(self, *, max_running: int | None = None, token_budget: int | None = None,
                 kv_blocks: int | None = None, loops: bool = True, invariants: bool = True):
        self.max_running = max_running
        self.invariants = invariants
        self.token_budget = token_budget
        self.kv_blocks = kv_blocks
        self.loops = loops
        self.iterations = 0
        self._preempted_at: dict = {}  # (instance, request id) -> cache states at its preemptions since it moved on
        self._preemptions: dict = {}   # instance -> preemptions so far; (instance, request id) -> its own

    def __call__(self, instance: int, record) -> None:
        self.iterations += 1
        if record.preempted and self.loops:
            generated = record.preempted_generated or (None,) * len(record.preempted)
            count = self._preemptions
            count[instance] = count.get(instance, 0) + len(record.preempted)
            for rid in record.preempted:
                count[(instance, rid)] = count.get((instance, rid), 0) + 1
            # requests preempted together count as one victim: a group preempted again, the cache
            # as it was, none of it further on and nobody else preempted since, loops as one would
            group = tuple(sorted(set(record.preempted)))
            others = count[instance] - sum(count[(instance, rid)] for rid in group)
            for rid, tokens in zip(record.preempted, generated):
                state = (record.kv_used_blocks, record.running_ids, tokens, group, others)
                # every state since the victim last moved on (a token, another victim): a loop may
                # pass through several (victims readmitted in another order each time)
                seen = self._preempted_at.get((instance, rid))
                if seen is not None and state in seen:
                    together = f" (with requests {[g for g in group if g != rid]})" if len(group) > 1 else ""
                    raise AssertionError(
                        f"request {rid} preempted twice{together} with the KV cache unchanged ({record.kv_used_blocks} "
                        f"blocks in use, running {list(record.running_ids)}): a preemption loop at "
                        f"t={record.start_ms} ms")
                if seen is None or next(iter(seen))[2:] != state[2:]:
                    seen = self._preempted_at[(instance, rid)] = set()
                seen.add(state)
        b = record.batch
        if self.max_running is not None:
            assert record.running <= self.max_running, (
                f"{record.running} running > max_running {self.max_running} at t={record.start_ms} ms (capacity; "
                f"running: requests {list(record.running_ids)})")
        if self.token_budget is not None:
            assert b.num_batched_tokens <= self.token_budget, (
                f"an iteration at t={record.start_ms} ms scheduled {b.num_batched_tokens} tokens > token budget "
                f"{self.token_budget}")
        if self.kv_blocks is not None:
            assert 0 <= record.kv_used_blocks <= self.kv_blocks, (
                f"{record.kv_used_blocks} KV blocks in use, the cache has {self.kv_blocks} (t={record.start_ms} ms)")
        assert record.duration_ms > 0, (
            f"an iteration at t={record.start_ms} ms took {record.duration_ms!r} ms: the cost model must return a "
            "positive, finite time")
        if record.kv_used_after >= 0:
            if record.kv_shares_blocks:
                assert record.kv_used_after <= record.kv_held_after, (
                    f"{record.kv_used_after} KV blocks in use after the iteration, the sequences hold "
                    f"{record.kv_held_after} (KV accounting, t={record.start_ms} ms)")
                assert record.kv_used_after >= record.kv_least_after, (
                    f"{record.kv_used_after} KV blocks in use after the iteration, but the sequences hold "
                    f"{record.kv_held_after}, of which at least {record.kv_least_after} no two can share (blocks "
                    "past a request's shared prefix, and the most shared blocks any one holds): the cache counts "
                    f"too few (KV accounting, t={record.start_ms} ms)")
            else:
                assert record.kv_used_after == record.kv_held_after, (
                    f"{record.kv_used_after} KV blocks in use after the iteration, the sequences hold "
                    f"{record.kv_held_after} (KV accounting, t={record.start_ms} ms)")
        assert b.spec_tokens <= record.spec_k * b.num_decode, (
            f"{b.spec_tokens} draft tokens verified by {b.num_decode} decodes, at most {record.spec_k} each")
        assert 0 <= record.accepted_tokens <= b.spec_tokens, f"{record.accepted_tokens} of {b.spec_tokens} drafts accepted"
        producing = b.num_decode - record.discarded_decodes  # (an overshoot's token is thrown away)
        assert producing <= record.decode_tokens <= producing + record.accepted_tokens, (
            f"{producing} decodes produced {record.decode_tokens} tokens with {record.accepted_tokens} drafts accepted")
        if self.invariants:
            check_invariants = getattr(record.kv, "check_invariants", None)
            if check_invariants is not None:  # the cache's own rules, on its live state
                check_invariants()


def in_arrival_order(requests) -> list:
    """``requests`` as a list, if their arrival times never go back; else ValueError naming the
    first two out of order. The engines take requests in arrival order (a workload's are checked
    as they stream, :func:`schedlab.model.checked_requests`); a hand-made list out of order would
    make the two engines disagree rather than fail."""
    requests = list(requests)
    for before, after in zip(requests, requests[1:]):
        if after.arrival_ms < before.arrival_ms:
            raise ValueError(f"request {after.id} arrives at {after.arrival_ms:g} ms, after request {before.id} at "
                             f"{before.arrival_ms:g} ms: give the engines requests in arrival order "
                             "(sorted(requests, key=lambda r: r.arrival_ms))")
    return requests


def _first_requests_given(requests: Sequence, workload) -> None:
    """A closed loop's first requests come in ``requests``; ``workload`` only releases the rest (an
    empty list simulated nothing, and check_run passed it: review s81 plugin, finding 8)."""
    if workload is not None and getattr(workload, "closed_loop", False) and hasattr(requests, "__len__") \
            and not len(requests):
        raise ValueError("a closed-loop workload's first requests go in requests: run them as "
                         "run_engine(workload.requests(seed), ..., workload=workload); the workload releases the rest")


def run_engine(requests: Sequence, scheduler, cost_model=None, kv=None, *, kv_blocks: int = 4096,
               block_size: int = 16, engine: str = "fast", check: IterationChecker | None = None,
               workload=None, name: str = "test", speculative: SpeculativeConfig | None = None,
               draft_cost=None, seed: int = 0, power: Callable | None = None, client_side=None,
               clock: Callable | None = None) -> RunResult:
    """Simulate ``requests`` on one instance built from plugin objects; return the RunResult.

    Defaults: the linear cost model (seed 001's costs) and a paged KV cache of ``kv_blocks``.
    ``speculative`` turns on speculative decoding (``draft_cost``: the drafter's cost model,
    for methods that have one; ``seed`` keys the acceptance draws). ``power(cost_model)`` makes
    the instance's power model: the run then meters energy (``metrics["energy"]``). ``client_side``
    (a :class:`~schedlab.frontend.ClientSide`): the requests' times are when clients send them.
    ``clock(cost_model)``: the instance's cost model at a clock, around the drafting (``[clock]``).
    """
    _first_requests_given(requests, workload)
    scheduler, cost_model, kv = _with_defaults((scheduler, cost_model, kv), kv_blocks, block_size)
    parts, speculation = speculating([(scheduler, cost_model, kv)], speculative, draft_cost, seed, clock)
    cost_model = parts[0][1]
    rec = Recorder(output_delay_ms=client_side.output_delay_ms if client_side is not None else 0.0)
    meters = _meters(power, [cost_model])
    if engine == "reference":
        if check is not None:
            raise ValueError("the reference engine takes no observer")
        sim = ReferenceEngine(scheduler, cost_model, kv, rec, speculation=speculation, meter=meters[0])
        ReferenceCluster([sim], client_side=client_side).run(in_arrival_order(requests), workload=workload)
    else:
        sim = Instance(0, scheduler, cost_model, kv, rec, observer=check, speculation=speculation, meter=meters[0])
        simulate(in_arrival_order(requests), [sim], workload=workload, client_side=client_side)
    meta = {"slots": getattr(scheduler, "slots", None), "num_blocks": kv.num_blocks, "instances": 1,
            "bytes_per_block": getattr(kv, "bytes_per_block", 0), "events": sim.events,
            **_speculative_meta(speculative), **_energy_meta(meters, rec)}
    _check_reasons(rec)
    result = RunResult.from_recorder(name, rec, settings={}, meta=meta,
                                     request_cost=getattr(cost_model, "request_cost", None))
    result.meta["kv"], result.meta["engine"] = kv, engine
    return result


def _refuse_kv_problem(scheduler, kv) -> None:
    """ConfigError where the scheduler says its settings can never work with ``kv``
    (``kv_problem``), as a run assembled from TOML says it: without it the kit's runs stalled
    (SGLang's chunk smaller than a page)."""
    ask = getattr(scheduler, "kv_problem", None)
    problem = ask(kv) if callable(ask) else None
    if problem:
        raise ConfigError(f"{type(scheduler).__name__}: {problem}")


def _with_defaults(part, kv_blocks: int = 4096, block_size: int = 16) -> tuple:
    """One instance's ``(scheduler, cost model, KV cache)``, a None cost model or KV cache
    replaced by the defaults: the linear cost model, a paged cache of ``kv_blocks`` blocks of
    ``block_size`` tokens (a new one for each instance)."""
    from schedlab_plugins.cost_models import LinearCostModel
    from schedlab_plugins.kv_caches import PagedKVCache

    try:
        scheduler, cost_model, kv = part
    except (TypeError, ValueError):
        raise TypeError(f"make() must return (scheduler, cost model, KV cache), got {part!r}") from None
    kv = kv if kv is not None else PagedKVCache(kv_blocks, block_size)
    _refuse_kv_problem(scheduler, kv)
    return scheduler, cost_model if cost_model is not None else LinearCostModel(), kv


def speculating(parts: list, speculative: SpeculativeConfig | None, draft_cost=None, seed: int = 0,
                clock: Callable | None = None) -> tuple:
    """``(parts, speculation)``: instances' ``(scheduler, cost model, KV cache)`` with the drafter's
    passes added to each cost model (``draft_cost``: the drafter's cost model, for methods that
    have one), and the run's :class:`~schedlab.speculative.Speculation` (its acceptance draws keyed
    by ``seed``); the parts as they are and None without ``speculative``. ``clock(cost)`` puts
    each cost model at a clock around the drafting, as a run assembles it."""
    if speculative is not None:
        parts = [(s, DraftingCostModel(c, draft_cost, speculative), k) for s, c, k in parts]
    if clock is not None:
        parts = [(s, clock(c), k) for s, c, k in parts]
    return parts, (Speculation(speculative, seed) if speculative is not None else None)


def run_cluster(requests: Sequence, make: Callable[[], tuple], instances: int, router=None, *,
                engine: str = "fast", workload=None, name: str = "test",
                power: Callable | None = None, client_side=None, autoscaler=None, limits=None,
                speculative: SpeculativeConfig | None = None, draft_cost=None, seed: int = 0,
                kv_blocks: int = 4096, block_size: int = 16) -> RunResult:
    """Simulate ``requests`` on ``instances`` colocated instances behind ``router``.

    ``make`` makes one instance's ``(scheduler, cost model, KV cache)`` each time it is called;
    a None cost model or KV cache gets :func:`run_engine`'s defaults (the linear model, a paged
    cache of ``kv_blocks`` blocks of ``block_size`` tokens);
    ``router`` is a router object (required for more than one instance). The result's
    ``meta["kvs"]`` holds every instance's KV cache, for checks of the blocks left at the end.
    ``power(cost_model)`` makes an instance's power model (the run then meters energy).
    ``autoscaler`` (a policy object) with ``limits`` (a
    :class:`~schedlab.engine.scaling.ScalingLimits`) scales the instances
    (``meta["scaling"]``; energy from 0, where the paid intervals start).
    ``speculative``, ``draft_cost`` and ``seed``: speculative decoding, as in :func:`run_engine`.
    """
    _first_requests_given(requests, workload)
    from ..engine.load import RoutingClock
    from ..engine.scaling import ScalingController

    rec = Recorder(output_delay_ms=client_side.output_delay_ms if client_side is not None else 0.0)
    parts, spec = speculating([_with_defaults(make(), kv_blocks, block_size) for _ in range(instances)],
                              speculative, draft_cost, seed)
    meters = _meters(power, [c for _, c, _ in parts])
    if engine == "reference":
        engines = [ReferenceEngine(s, c, k, rec, index=i, meter=m, speculation=spec)
                   for i, ((s, c, k), m) in enumerate(zip(parts, meters))]
    else:
        engines = [Instance(i, s, c, k, rec, meter=m, speculation=spec)
                   for i, ((s, c, k), m) in enumerate(zip(parts, meters))]
    scaling = (ScalingController(autoscaler, limits, engines, RoutingClock(), meters=meters)
               if autoscaler is not None else None)
    scaled = serve(requests, engines, router, rec, ReferenceCluster, engine=engine, workload=workload,
                   client_side=client_side, scaling=scaling)
    slots = [getattr(s, "slots", None) for s, _, _ in parts]
    meta = {"slots": None if None in slots else sum(slots), "num_blocks": sum(e.kv.num_blocks for e in engines),
            "instances": instances, "events": sum(e.events for e in engines), **scaled,
            **_speculative_meta(speculative), **_energy_meta(meters, rec, 0.0 if scaling is not None else None)}
    _check_reasons(rec)
    result = RunResult.from_recorder(name, rec, settings={}, meta=meta,
                                     request_cost=getattr(parts[0][1], "request_cost", None))
    result.meta["kvs"], result.meta["engine"] = [e.kv for e in engines], engine
    return result


def serve(requests: Sequence, engines: list, router, rec: Recorder, reference_cluster, *, engine: str, workload,
          client_side, scaling) -> dict:
    """Serve ``requests`` on ``engines`` (either engine's instances, or stand-ins such as
    pipelined ones) behind ``router``: the reference engine's through ``reference_cluster`` (a
    :class:`~schedlab.engine.reference_cluster.ReferenceCluster` class), the fast engine's through
    its driver, autoscaled by ``scaling`` (None: a fixed cluster). The autoscaler's summary for
    the run's meta (``{}`` without one)."""
    if scaling is not None:
        rec.listener = scaling.finished
    if engine == "reference":
        reference_cluster(engines, router, client_side=client_side, scaling=scaling).run(in_arrival_order(requests),
                                                                                       workload=workload)
    else:
        simulate(in_arrival_order(requests), engines, router=router, workload=workload, client_side=client_side,
                 scaling=scaling)
    return {"scaling": scaling.finish()} if scaling is not None else {}


def run_disaggregated(requests: Sequence, prefill: Callable[[], tuple], decode: Callable[[], tuple], *,
                      prefill_instances: int = 1, decode_instances: int = 1, prefill_router=None,
                      decode_router=None, bandwidth_gbps: float = 25.0, latency_ms: float = 0.01,
                      engine: str = "fast", workload=None, name: str = "test",
                      power: Callable | None = None, client_side=None, kv_lease_ms: float | None = None,
                      autoscalers: dict | None = None, limits: dict | None = None,
                      slo: dict | None = None, first_token: str = "decode",
                      prefill_hears_disconnect: bool = True) -> RunResult:
    """Simulate ``requests`` on a disaggregated cluster built from plugin objects.

    ``prefill`` and ``decode`` make one instance's ``(scheduler, cost model, KV cache)`` each
    time they are called (None: :func:`run_engine`'s default cost model or KV cache). The
    result's ``meta["kvs"]`` holds every instance's KV cache (prefill pool first), for checks of
    the blocks left at the end. ``power(cost_model)``
    makes an instance's power model (the run then meters energy). ``client_side`` (front end,
    timeouts) and ``kv_lease_ms`` (how long a prefill instance keeps an abandoned prompt's KV)
    as in :mod:`schedlab.frontend` and :mod:`schedlab.engine.transfer`. ``autoscalers`` (pool
    name -> policy object) with ``limits`` (pool name -> :class:`~schedlab.engine.scaling.ScalingLimits`)
    scale those pools (``meta["scaling"]``, judged against ``slo``; energy from 0). ``first_token``:
    the pool that samples the client's first token (``[cluster] first_token``, :mod:`schedlab.engine.transfer`);
    ``prefill_hears_disconnect``: whether the proxy passes a client's disconnect on to the prefill pool
    (``[cluster] prefill_hears_disconnect``, rule 4 there).
    """
    _first_requests_given(requests, workload)
    from ..engine.disagg import DisaggregatedCluster
    from ..engine.driver import simulate_disaggregated
    from ..engine.pool_scaling import pool_scaling
    from ..engine.reference_cluster import DisaggregatedReference
    from ..results.metrics import request_met
    from ..study.simulation import pool_summary

    rec = Recorder(output_delay_ms=client_side.output_delay_ms if client_side is not None else 0.0)
    parts = [_with_defaults(make()) for make in [prefill] * prefill_instances + [decode] * decode_instances]
    meters = _meters(power, [c for _, c, _ in parts])
    if engine == "reference":
        engines = [ReferenceEngine(s, c, k, rec, index=i, meter=m)
                   for i, ((s, c, k), m) in enumerate(zip(parts, meters))]
    else:
        engines = [Instance(i, s, c, k, rec, meter=m) for i, ((s, c, k), m) in enumerate(zip(parts, meters))]
    p, d = engines[:prefill_instances], engines[prefill_instances:]
    link = dict(prefill_router=prefill_router, decode_router=decode_router, bandwidth_gbps=bandwidth_gbps,
                latency_ms=latency_ms, first_token=first_token, prefill_hears_disconnect=prefill_hears_disconnect)
    if kv_lease_ms is not None:
        link["kv_lease_ms"] = kv_lease_ms
    scaling = None
    if autoscalers:
        scaling = pool_scaling(p, d, autoscalers, limits, meters={"prefill": meters[:prefill_instances],
                                                                 "decode": meters[prefill_instances:]},
                               judge=(lambda **targets: request_met(slo, **targets)) if slo is not None else None,
                               output_delay_ms=rec.output_delay_ms)
        rec.listener = scaling.finished
        link["scaling"] = scaling
    if engine == "reference":
        DisaggregatedReference(p, d, client_side=client_side, **link).run(in_arrival_order(requests),
                                                                           workload=workload)
    else:
        simulate_disaggregated(in_arrival_order(requests), DisaggregatedCluster(p, d, **link), workload=workload,
                               client_side=client_side)
    scaled = {"scaling": scaling.finish()} if scaling is not None else {}
    meta = {"slots": None, "num_blocks": sum(e.kv.num_blocks for e in engines), "instances": len(engines),
            "bytes_per_block": getattr(engines[0].kv, "bytes_per_block", 0), "events": sum(e.events for e in engines),
            "pools": pool_summary({"prefill": p, "decode": d}), **scaled,
            **_energy_meta(meters, rec, 0.0 if scaling is not None else None)}
    _check_reasons(rec)
    result = RunResult.from_recorder(name, rec, settings={}, meta=meta,
                                     request_cost=getattr(parts[0][1], "request_cost", None))
    result.meta["kvs"], result.meta["engine"] = [e.kv for e in engines], engine
    return result


def _check_reasons(rec: Recorder) -> None:
    """Every rejection has a reason, as text (``Plan.reject(seq, reason)``, ``rejection_reason``):
    checked before the results are built, whose metrics group rejections by their text."""
    for rid, reason in rec.rejections.items():
        assert isinstance(reason, str) and reason, (
            f"request {rid} rejected with reason {reason!r}: a rejection needs its reason as text "
            "(Plan.reject(seq, reason), Scheduler.rejection_reason)")


def _meters(power: Callable | None, costs: list) -> list:
    """One energy meter per instance (power models from ``power(cost_model)``), or Nones."""
    if power is None:
        return [None] * len(costs)
    return [EnergyMeter(power(cost)) for cost in costs]


def _speculative_meta(speculative: SpeculativeConfig | None) -> dict:
    """The run's speculative settings, for its metrics (``metrics["speculative"]`` with them)."""
    return {"speculative": attrs.asdict(speculative) if speculative is not None else {}}


def _energy_meta(meters: list, rec: Recorder, start: float | None = None) -> dict:
    if meters[0] is None:
        return {}
    return {"energy": close_meters(meters, 0.0 if start is None else start)}


def blocks_for_largest(requests: Sequence, block_size: int) -> int:
    """KV blocks the largest request needs alone (prompt + every output token it may make): a
    cache of this many blocks, plus a few, keeps every request servable and forces preemption
    under a scheduler that grows its KV (one that reserves prompt + max_tokens at admission
    never preempts)."""
    return max(-(-(r.prompt_tokens + r.max_output_tokens) // block_size) for r in requests)


def small_closed_loop(clients: int, num_requests: int, *, think_ms: float = 2.0):
    """A maker of fresh closed-loop workloads (one per engine: a workload keeps its run's
    state): ``clients`` clients, ``num_requests`` in all, prompts of 1-60 and outputs of 1-25
    tokens, ``think_ms`` between a response and the next request."""
    from schedlab_plugins.workloads.closed_loop import ClosedLoopConfig, make_closed_loop_workload

    config = ClosedLoopConfig(clients=clients, num_requests=num_requests, think_ms=think_ms,
                              prompt={"dist": "uniform", "low": 1, "high": 60},
                              output={"dist": "uniform", "low": 1, "high": 25})
    return lambda: make_closed_loop_workload(config)


def view_state(view) -> tuple:
    """What a router can read of an instance: ``(outstanding, running, waiting, KV blocks in use,
    in an iteration)``."""
    return view.outstanding, view.running, view.waiting, view.kv.num_used_blocks(), view.in_iteration


class RecordingRouter:
    """Wraps a router and keeps, for every request it places, ``(request id, [look(view) for
    each instance])``: what the router saw (default: the outstanding counts), to compare
    between engines or with what the run says the instances held at that time."""

    def __init__(self, inner, look: Callable = lambda view: view.outstanding):
        self.inner = inner
        self.look = look
        self.seen: list = []

    def route(self, request, instances):
        self.seen.append((request.id, [self.look(view) for view in instances]))
        return self.inner.route(request, instances)


def check_run(result: RunResult, requests: Sequence, *, max_running: int | None = None,
              kv_blocks: int | None = None, token_budget: int | None = None, rejections: str = "unserved") -> None:
    """Assert conservation, capacity and causality for a finished run.

    * every request appears exactly once: finished with exactly ``target_tokens`` tokens (or
      its ``max_tokens`` as served, if a scheduler's ``limit_request`` lowered it),
      rejected with a reason, or aborted (its client gave up) with fewer; rejected only as
      ``rejections`` allows: ``"unserved"`` (the default) before it was ever scheduled (on arrival,
      or from the queue: a request that can never fit), ``"none"`` never, ``"any"`` even after
      some service (a scheduler that drops a preempted request must say so); served as it was
      sent -- ``limit_request`` may lower ``max_tokens``, never change the prompt or the answer
      (both engines refuse such an answer on arrival too: :func:`schedlab.engine.plan.check_limited`);
    * the running count and KV blocks never exceeded their limits (peaks); no iteration
      scheduled more than ``token_budget`` tokens (decodes and prompt tokens, from the timeline:
      the reference engine's too, which takes no :class:`IterationChecker`; a speculative
      decode's drafts are counted by the checker only);
    * every iteration that computes anything took a positive, finite time (the cost model's);
    * arrival <= taken (the engine's loop took it: :mod:`schedlab.engine.taking`) <= first
      scheduled <= first token <= finish, and the first token comes no earlier than the end of
      an iteration that started after arrival;
    * the KV cache is empty at the end, its swap space too, and its own invariants hold (its ``check_invariants()``,
      called when the cache has one: runs do not need it, so a cache without it is checked
      from the outside only; this end-of-run call sees an empty cache, :class:`IterationChecker`
      calls it after every iteration); busy and KV shares of the run are at most 1;
    * tokens add up: decode steps yield at least one token each and, with speculative
      decoding, at most one more per accepted draft (accepted <= verified drafts).
    """
    if rejections not in ("unserved", "none", "any"):
        raise ValueError(f"rejections must be 'unserved', 'none' or 'any', not {rejections!r}")
    _check_timeline(result, token_budget)
    req = result.requests
    ids = req["id"]
    if sorted(ids.tolist()) != sorted(r.id for r in requests):
        sent, got = [r.id for r in requests], ids.tolist()
        lost = sorted(set(sent) - set(got))
        extra = sorted({i for i in got if got.count(i) > 1} | (set(got) - set(sent)))
        raise AssertionError(f"requests lost or duplicated (conservation): lost {lost[:10]}, duplicated or "
                             f"unknown {extra[:10]}")
    by_id = {r.id: r for r in requests}
    for i, rid in enumerate(ids.tolist()):
        r = by_id[rid]
        for field in ("prompt_tokens", "output_tokens"):
            served = int(req[field][i])
            assert served == getattr(r, field), (
                f"request {rid} served with {field} {served}, sent with {getattr(r, field)}: a plugin "
                "(limit_request) may lower max_tokens, never change the prompt or the answer (conservation)")
        if req["rejected"][i]:
            assert result.rejections.get(rid), f"request {rid} rejected without a reason"
            assert rejections != "none", f"request {rid} rejected ({result.rejections[rid]}): rejections='none'"
            assert rejections == "any" or req["first_scheduled_ms"][i] < 0, (
                f"request {rid} rejected ({result.rejections[rid]}) after it was scheduled at "
                f"{req['first_scheduled_ms'][i]} ms, with {req['generated_tokens'][i]} of {r.target_tokens} tokens and "
                f"{req['preemptions'][i]} preemptions: a scheduler turns away only requests it never served "
                "(check_run(rejections='any') allows dropping one it served)")
            if req["finish_ms"][i] >= 0:  # turned away from the queue (Plan.reject), not on arrival
                assert req["finish_ms"][i] >= req["arrival_ms"][i], f"request {rid} turned away before it arrived"
                assert req["generated_tokens"][i] < r.target_tokens, f"request {rid} turned away after its last token"
            else:
                assert req["generated_tokens"][i] == 0, f"request {rid} rejected on arrival with tokens"
            continue
        assert req["sent_ms"][i] == r.arrival_ms, (
            f"request {rid} was sent at {req['sent_ms'][i]}, not {r.arrival_ms}: its arrival time changed (causality)")
        if req["aborted"][i]:
            assert req["timed_out"][i], f"request {rid} aborted although its client did not give up"
            assert req["generated_tokens"][i] < r.target_tokens, f"request {rid} aborted after its last token"
            assert req["finish_ms"][i] >= req["client_done_ms"][i], f"request {rid} aborted before its client left"
            continue
        # a scheduler may serve a request with a lower max_tokens (limit_request: max_model_len)
        served_max = int(req["max_tokens"][i])
        assert served_max <= r.max_output_tokens, f"request {rid} served with max_tokens {served_max} > its own"
        expected = min(r.target_tokens, served_max)
        assert req["generated_tokens"][i] == expected, (
            f"request {rid} generated {req['generated_tokens'][i]} tokens, expected {expected}")
        a, s, f, e = (req["arrival_ms"][i], req["first_scheduled_ms"][i], req["first_token_ms"][i],
                      req["finish_ms"][i])
        assert a >= r.arrival_ms, f"request {rid} arrived at {a}, before it was sent at {r.arrival_ms} (causality)"
        assert a <= s < f <= e, f"request {rid}: causality broken (arrival {a}, scheduled {s}, first {f}, finish {e})"
        if "taken_ms" in req:
            taken = req["taken_ms"][i]
            assert a <= taken <= s, f"request {rid}: taken at {taken}, not between its arrival {a} and scheduling {s}"
    c = result.counters
    if max_running is not None:
        assert c["peak_running"] <= max_running, (f"peak running {c['peak_running']} > max_running {max_running} "
                                                  "(capacity)")
    if kv_blocks is not None:
        assert c["kv_peak_blocks"] <= kv_blocks, f"peak KV blocks {c['kv_peak_blocks']} > {kv_blocks}"
    # finished, aborted or turned away from the queue: the tokens they got were generated
    assert c["generated_tokens"] == int(req["generated_tokens"].sum()), (
        f"{c['generated_tokens']} tokens generated, the requests got {int(req['generated_tokens'].sum())}")
    assert c["spec_accepted_tokens"] <= c["spec_draft_tokens"], "more drafts accepted than verified"
    assert c["decode_seq_steps"] <= c["decode_tokens"] <= c["decode_seq_steps"] + c["spec_accepted_tokens"], (
        f"{c['decode_tokens']} decode tokens from {c['decode_seq_steps']} sequence steps and "
        f"{c['spec_accepted_tokens']} accepted drafts")
    m = result.metrics
    if m.get("makespan_ms", 0) > 0:  # shares of the run's span: the GPUs cannot be busier than all of it
        assert m["busy_share"] <= 1 + 1e-9, f"busy share {m['busy_share']} > 1"
        assert m["kv_usage"]["time_above_90"] <= 1 + 1e-9, f"KV above 90% for {m['kv_usage']['time_above_90']} of the run"
        assert not m["kv_usage"]["mean"] > 1 + 1e-9, f"KV usage mean {m['kv_usage']['mean']} > 1"
        for name, pool in (m.get("pools") or {}).items():
            assert pool["busy_share"] <= 1 + 1e-9, f"{name} pool busy share {pool['busy_share']} > 1"
            assert pool["kv_usage_mean"] <= 1 + 1e-9, f"{name} pool KV usage mean {pool['kv_usage_mean']} > 1"
    if m.get("kv_usage") and m["kv_usage"]["peak"] == m["kv_usage"]["peak"]:
        assert m["kv_usage"]["peak"] <= 1 + 1e-9, f"KV peak {m['kv_usage']['peak']} > 1"
    for kv in result.meta.get("kvs") or [result.meta.get("kv")]:
        if kv is not None:
            used = kv.num_used_blocks()
            assert used == 0, f"{used} KV blocks still held after the run" + (
                " (a negative count: blocks freed more often than taken)" if used < 0 else " (a leak)")
            swap = getattr(kv, "swap_used", 0)   # (a cache with swap space gives every copy back too)
            assert not swap, (f"{swap} swap blocks still held after the run (swap space not given back by "
                              "swap_in or free_swapped: a leak)")
            check_invariants = getattr(kv, "check_invariants", None)
            if check_invariants is not None:  # (optional: runs do not need it)
                check_invariants()


def _check_timeline(result: RunResult, token_budget: int | None) -> None:
    """Every timeline row that computes something lasted a positive, finite time; with
    ``token_budget``, none scheduled more tokens (decodes + prompt tokens) per iteration."""
    t = result.timeline
    if not t.get("time_ms", np.empty(0)).size:
        return
    computing = (t["decodes"] + t["prefills"] > 0) & (t["iterations"] > 0)
    bad = computing & ~(np.isfinite(t["duration_ms"]) & (t["duration_ms"] > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(
            f"an iteration at t={t['time_ms'][i]} ms ({int(t['decodes'][i])} decodes, {int(t['prefill_tokens'][i])} "
            f"prompt tokens) took {float(t['duration_ms'][i])!r} ms: the cost model must return a positive, "
            "finite time")
    if token_budget is not None:
        tokens = t["decodes"] + t["prefill_tokens"]
        over = computing & (tokens > token_budget)
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise AssertionError(
                f"an iteration at t={t['time_ms'][i]} ms scheduled {int(tokens[i])} tokens ({int(t['decodes'][i])} "
                f"decodes + {int(t['prefill_tokens'][i])} prompt tokens) > token budget {token_budget}")


def check_deterministic(make_scheduler: Callable[[], Any], requests: Sequence, *, runs: int = 2,
                        make_kv: Callable[[], Any] | None = None, make_cost_model: Callable[[], Any] | None = None,
                        **kwargs) -> RunResult:
    """Run ``requests`` ``runs`` times, each with fresh plugins (``make_scheduler()``, and
    ``make_kv()`` / ``make_cost_model()`` when given, else :func:`run_engine`'s defaults), and
    assert that every run equals the first exactly (:func:`compare_runs`, ``rel=0``): a plugin
    that keeps state across instances -- a class attribute or module global it mutates, an
    unseeded random generator, the order of a set of objects -- gives the same input different
    results. ``kwargs`` go to :func:`run_engine` (``engine``, ``kv_blocks``, ``speculative``,
    ``seed``...; not ``check``, an observer keeps state of its own). Returns the first run."""
    if "check" in kwargs or "kv" in kwargs or "cost_model" in kwargs:
        raise ValueError("check_deterministic makes fresh plugins: give make_kv / make_cost_model, no check")

    def once() -> RunResult:
        return run_engine(requests, make_scheduler(), make_cost_model() if make_cost_model is not None else None,
                          make_kv() if make_kv is not None else None, **kwargs)

    first = once()
    for n in range(2, runs + 1):
        again = once()
        try:
            same_requests_agree(first, again, rel=0.0, labels=("run 1", f"run {n}"), hint="")
        except AssertionError as e:
            raise AssertionError(f"not deterministic: run {n} of the same requests with fresh plugins differs from "
                                 f"run 1 (a plugin keeps state across instances or draws unseeded): {e}") from None
    return first
