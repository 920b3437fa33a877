"""vLLM's data-parallel load balancer, by the rule of the vLLM version modelled (``rule``).

vLLM's front end picks the engine core of each request itself when it serves
``--data-parallel-size N`` (``DPLBAsyncMPClient.get_core_engine_for_request``,
``vllm/v1/engine/core_client.py``), from the last load snapshot of the ranks. The snapshot is
the engines' own counts (each publishes them after every step), which the DP coordinator
(``vllm/v1/engine/coordinator.py``) forwards to the front end at most every 100 ms; between
snapshots the front end adds each request it sends to its rank's waiting count
(``current_counts[eng_index][0] += client_count``, ``client_count`` = 1 for the single API
server modelled here), so a burst is spread before the next snapshot arrives. Two rules:

* ``rule = "v0.33"`` (the default; vLLM 0.33.0, which schedlab's scheduler presets follow):
  the engines publish ``[waiting, running, kv_cache_usage]``; a rank's score is
  ``max(in_flight, waiting + running)``, plus ``waiting x 6 x max(0, kv_cache_usage - 0.5)``
  when it has requests waiting -- a queue on a rank whose KV cache is more than half used
  weighs more, up to 3 x waiting more at full usage --, where ``in_flight`` is the front end's exact count of the
  requests it sent to the rank and has not seen finish (here the rank's ``outstanding``, read
  at the arrival: it is not part of the snapshot); the scan starts one rank further after
  every decision, so ties rotate (vllm-project/vllm#47420, opened 2026-07-02, and the in-flight
  floor and KV penalty of #49204, opened 2026-07-20; both in vLLM 0.28.0's
  ``core_client.py``, read from its wheel).
* ``rule = "v0.19"`` (vLLM 0.19 up to before those PRs): the score ``4 x waiting + running``,
  the scan always from rank 0, so ties go to the lowest rank; KV usage is not read.

A dense model's ranks in vLLM 0.19-0.2x: since vllm-project/vllm#30739 (merged 2025-12-16)
they are plain ``EngineCoreProc`` engines, which did not publish their counts until #49204
added the call to ``EngineCoreProc.run_busy_loop`` (vllm-project/vllm#48808 reports the
resulting imbalance). The front end then knew only its own ``+1`` per request sent, wiped by
the coordinator's unchanged zero counts (re-sent every 5 s when nothing changes): load-blind
round robin that restarts at rank 0 every few seconds. ``rule = "v0.19"`` reads live counts,
so it is more load-aware than that; to model such a deployment use ``round_robin`` (a
cluster of dense ``data_parallel = N`` ranks is ``instances = N`` behind ``router``).

Here the snapshot is taken from the ranks as they are at the first arrival ``stats_interval_ms``
or more after the last one (the coordinator's publication times are not simulated);
``stats_interval_ms = 0`` reads the ranks at every arrival. The snapshot belongs to the
instances it was read from (their ``index``), not to positions in the list: when the list
changes -- an autoscaler adds an instance to the pool or drains one out of it, renumbering the
positions -- a new snapshot is read at once, as vLLM's front end rebuilds its per-engine counts
when its set of engines changes (elastic scaling), so a count never goes to the wrong instance,
a new instance is seen from its first request and no answer names an instance that has left.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from schedlab.configs import float_field, str_field
from schedlab.engine.pool import routing_time

WAITING_WEIGHT = 4  # vLLM 0.19: score = waiting * 4 + running
KV_PENALTY = 6.0    # vLLM 0.33: score += waiting * 6 * max(0, kv_cache_usage - 0.5)
KV_FREE = 0.5
RULES = ("v0.19", "v0.33")


@attrs.frozen
class DataParallelRouterConfig:
    stats_interval_ms: float = float_field(100.0, min=0.0, help="how old the load snapshot may get before a new one "
                                                                "is read (vLLM's DP coordinator publishes at most "
                                                                "every 100 ms)")
    rule: str = str_field("v0.33", choices=RULES,
                          help="the vLLM version's rule: 'v0.33' (max(in-flight, waiting + running), waiting "
                               "penalised above 50% KV usage, rotating scan start) or 'v0.19' "
                               "(4 x waiting + running, ties to the lowest rank)")


class DataParallelRouter:
    """vLLM's internal data-parallel load balancer (see the module docstring)."""

    def __init__(self, config: DataParallelRouterConfig | None = None):
        self.config = config if config is not None else DataParallelRouterConfig()
        self._new = self.config.rule == "v0.33"
        self._taken_at = -float("inf")
        self._members: list[int] = []  # the instances (their index) the snapshot was read from, in order
        self._counts: list[list] = []  # [waiting, running(, kv usage)] per rank, as the front end knows them
        self._start = 0                # v0.33: where the next scan starts

    def route(self, request, instances: Sequence) -> int:
        now = routing_time(request, instances)
        members = [view.index for view in instances]
        if members != self._members or now >= self._taken_at + self.config.stats_interval_ms:
            if self._new:
                self._counts = [[view.waiting, view.running, view.kv.usage] for view in instances]
            else:
                self._counts = [[view.waiting, view.running] for view in instances]
            self._members = members
            self._taken_at = now
        if self._new:
            best = self._v033(instances)
        else:
            best, best_score = 0, None
            for i, (waiting, running) in enumerate(self._counts):
                score = WAITING_WEIGHT * waiting + running
                if best_score is None or score < best_score:
                    best, best_score = i, score
        self._counts[best][0] += 1
        return best

    def _v033(self, instances: Sequence) -> int:
        n = len(instances)
        start = self._start % n
        best, best_score = start, None
        for i in range(n):
            idx = (start + i) % n
            waiting, running, usage = self._counts[idx]
            score = max(instances[idx].outstanding, waiting + running)
            if waiting:
                score += waiting * KV_PENALTY * max(0.0, usage - KV_FREE)
            if best_score is None or score < best_score:
                best, best_score = idx, score
        self._start = (start + 1) % n
        return best
