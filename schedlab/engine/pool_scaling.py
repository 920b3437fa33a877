"""Autoscaling a disaggregated cluster: one :class:`ScalingController` per pool, either pool fixed.

Production P/D deployments (llm-d, Dynamo, DistServe) scale the prefill and the decode pool
apart: they saturate on different signals. Each pool's controller works as a colocated
cluster's does (:mod:`schedlab.engine.scaling`: ticks, cold starts, draining, paid intervals,
meters), on its own pool's instances -- their views are its signals, its router sees only its
serving instances -- and its own window:

* the prefill pool's arrivals are the requests routed to it; its finishes are its hand-offs (a
  prompt done, its first token out), judged on TTFT alone, and the requests that end there (a
  one-token answer, a client that left: the whole SLO check, as a colocated instance's; a request
  turned away on arrival misses, as in the run's SLO metrics);
* the decode pool's arrivals are the hand-offs routed to it, when the decode router picks an
  instance; its finishes are the requests it ends, judged on TPOT alone (TTFT was the prefill
  side's; a request its client gave up on misses).

A draining prefill instance finishes its prompts, hands them off and stays on until the decode
side has pulled their KV (or an abandoned prompt's lease has run out); a draining decode
instance gets no new hand-offs and decodes what it holds, pulls included. Either, once off, starts
cold when switched on again: its KV cache is reset as a colocated instance's is.

Both engines' drivers run these events before hand-offs and arrivals at the same time. Both
pools' controllers tick while requests are to arrive or something in the cluster is to come (an
instance's event, an iteration not yet ended, a hand-off queued), as a colocated cluster's: a
controller cannot know that no request will come. They stopped with the last arrival (prefill)
and the last hand-off (decode), so a pool that decoded on for minutes after it was never
scaled down (review s80 routers, finding 1).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..frontend import client_times
from .load import RoutingClock
from .scaling import ScalingController

INF = math.inf
POOLS = ("prefill", "decode")


class PoolScaling:
    """The controllers of a disaggregated cluster's pools (None: that pool is fixed).

    ``prefill`` and ``decode``: the pools' engine instances (global indices, prefill first);
    ``controllers``: pool name -> its :class:`ScalingController` (built over that pool's
    instances with ``clock``, untracked; the decode pool's judging its finishes on TPOT);
    ``ttft_met``: the prefill pool's check of a hand-off (None without an [slo]);
    ``output_delay_ms``: the client's first byte after the first token."""

    def __init__(self, prefill: Sequence, decode: Sequence, controllers: dict, clock, *, ttft_met=None,
                 output_delay_ms: float = 0.0, gpus: dict | None = None):
        self.instances = {"prefill": list(prefill), "decode": list(decode)}
        self.prefill = controllers.get("prefill")
        self.decode = controllers.get("decode")
        self.clock = clock
        self.ttft_met = ttft_met
        self.output_delay_ms = output_delay_ms
        self.gpus = gpus or {name: [1] * len(self.instances[name]) for name in POOLS}
        self.last_arrival = 0.0  # (the cluster's end is no earlier: one turned away at once moves no clock)
        self.ticking = True     # (until nothing is left to come: the run's end, or a stall)

    # -- what happened -------------------------------------------------------------------------------
    def arrived(self, t: float) -> None:
        """A request was routed to the prefill pool at ``t``."""
        if t > self.last_arrival:
            self.last_arrival = t
        if self.prefill is not None:
            self.prefill.arrived(t)

    def handed_off(self, tr, t: float) -> None:
        """A prefill instance handed ``tr`` off at ``t``: that pool's finish, met on TTFT."""
        ctl = self.prefill
        if ctl is None:
            return
        met = self.ttft_met
        ok = met is not None and met(tr.prefill_seq, client_times(tr.request, t, t, self.output_delay_ms))
        ctl.window.append((t, 2 if ok else 1))

    def routed_to_decode(self, t: float) -> None:
        """The decode router placed a hand-off at ``t``: that pool's arrival."""
        if self.decode is not None:
            self.decode.arrived(t)

    def finished(self, seq, t: float, rejected: bool, client: tuple) -> None:
        """A request left the run (the recorder's listener): on a decode instance (its sequence
        is the transfer's decode side) or on the prefill side."""
        tr = seq.transfer
        if tr is not None and tr.decode_seq is seq:
            if self.decode is not None:
                self.decode.finished(seq, t, rejected, client)
            return
        if self.prefill is not None:
            self.prefill.finished(seq, t, rejected, client)

    # -- events --------------------------------------------------------------------------------------
    def next_time(self, arriving: bool) -> float:
        """The controllers' next event (INF once nothing was left to come, :meth:`apply`)."""
        if not self.ticking:
            return INF
        t = self.prefill.next_time() if self.prefill is not None else INF
        if self.decode is not None:
            d = self.decode.next_time()
            if d < t:
                t = d
        return t

    def apply(self, t: float, arriving: bool, stirring) -> None:
        """Everything due at ``t``. ``stirring()``: something is yet to happen in the cluster (an
        instance's event, an iteration ending after ``t``, a hand-off queued); with no request to
        arrive and nothing stirring the run is over (or stuck: the driver reports the stall),
        and the ticks stop."""
        if not (arriving or stirring()):
            self.ticking = False
            return
        if self.prefill is not None and self.prefill.next_time() <= t:
            self.prefill.apply(t)
        if self.decode is not None and self.decode.next_time() <= t:
            self.decode.apply(t)

    # -- results -------------------------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        """Close every pool's paid intervals at the cluster's end (its last clock, or its last
        arrival if later: the fast engine's clocks do not move for a request turned away on
        arrival, the reference's do, and the colocated autoscaler counts it) and summarise:
        per pool what a colocated autoscaler reports (intervals with the run's instance indices,
        history, GPU-hours, scale-ups and -downs; a fixed pool on from 0 to the end), and the
        totals, with the history of both pools summed."""
        end = max([inst.now for name in POOLS for inst in self.instances[name]] + [self.last_arrival])
        pools = {}
        for name in POOLS:
            ctl, mine = getattr(self, name), self.instances[name]
            if ctl is not None:
                summary = ctl.finish(end)
                summary["intervals"] = [[mine[i].index, on, off] for i, on, off in summary["intervals"]]
            else:
                n = len(mine)
                summary = {"intervals": [[inst.index, 0.0, end] for inst in mine], "history": [[0.0, n, 0, 0, n]],
                           "serving": [[0.0, n]],
                           "gpu_hours": end * sum(self.gpus[name]) / 3.6e6, "scale_ups": 0, "scale_downs": 0,
                           "end_ms": end, "caches_kept": 0}
            summary["autoscaled"] = ctl is not None
            pools[name] = summary
        return {"intervals": sorted((x for p in pools.values() for x in p["intervals"]), key=lambda x: (x[1], x[0])),
                "history": summed_history([p["history"] for p in pools.values()]),
                "serving": summed_history([p["serving"] for p in pools.values()]),
                "gpu_hours": sum(p["gpu_hours"] for p in pools.values()),
                "scale_ups": sum(p["scale_ups"] for p in pools.values()),
                "scale_downs": sum(p["scale_downs"] for p in pools.values()), "end_ms": end,
                "caches_kept": sum(p["caches_kept"] for p in pools.values()), "pools": pools}


def pool_scaling(prefill: Sequence, decode: Sequence, policies: dict, limits: dict, *, gpus: dict | None = None,
                 meters: dict | None = None, judge=None, output_delay_ms: float = 0.0) -> PoolScaling:
    """The autoscalers of a disaggregated cluster (either engine's instances): ``policies`` and
    ``limits`` (:class:`~schedlab.engine.scaling.ScalingLimits`) by pool name, a pool without a
    policy fixed; ``gpus`` and ``meters``: each pool's instances' GPUs and energy meters;
    ``judge(ttft=..., tpot=...)``: the run's SLO check with either target left out
    (:func:`schedlab.results.metrics.request_met`; None without an [slo])."""
    clock = RoutingClock()
    instances = {"prefill": list(prefill), "decode": list(decode)}
    gpus = gpus or {name: [1] * len(instances[name]) for name in POOLS}
    controllers = {}
    for name in POOLS:
        if policies.get(name) is None:
            continue
        if limits[name].drain_timeout_ms is not None:  # (refused when the file is read: simulation.py)
            raise ValueError(f"a drain timeout is not modelled for a disaggregated cluster's {name} pool")
        mine = instances[name]
        holding = (lambda i, mine=mine: _handed_on(mine[i]) > 0) if name == "prefill" else None
        met = None if judge is None else judge() if name == "prefill" else judge(ttft=False)
        controllers[name] = ScalingController(policies[name], limits[name], mine, clock, slo_met=met,
                                              gpus_per_instance=gpus[name], meters=(meters or {}).get(name),
                                              tracked=False, holding=holding)
    return PoolScaling(prefill, decode, controllers, clock, ttft_met=judge(tpot=False) if judge else None,
                       output_delay_ms=output_delay_ms, gpus=gpus)


def _handed_on(inst) -> int:
    """Prompts a prefill instance (either engine's) handed on whose KV it still holds."""
    part = inst.role if hasattr(inst, "role") else inst.stage
    return part.held


def summed_history(histories: Sequence[Sequence]) -> list[list]:
    """Histories ``(time, serving, warming, draining, desired)`` -- or ``(time, serving)`` -- of
    several pools as one: at each time any of them changed, the sum of each pool's latest entry."""
    times = sorted({h[0] for hist in histories for h in hist})
    width = max((len(h) for hist in histories for h in hist), default=1)
    out, latest, at = [], [None] * len(histories), [0] * len(histories)
    for t in times:
        for k, hist in enumerate(histories):
            while at[k] < len(hist) and hist[at[k]][0] <= t:
                latest[k] = hist[at[k]]
                at[k] += 1
        out.append([t] + [sum(h[j] for h in latest if h is not None) for j in range(1, width)])
    return out
