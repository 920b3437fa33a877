"""vLLM's data-parallel load balancer: the rank with the fewest requests, waiting ones counting 4x.

vLLM's front end picks the engine core of each request itself when it serves
``--data-parallel-size N`` (``DPLBAsyncMPClient.get_core_engine_for_request``,
``vllm/v1/engine/core_client.py``, as of vLLM 0.19): for each rank, in order from the
client's start index (0 for a single API server), the score ``4 x waiting + running`` from the
last load snapshot; the lowest score wins, ties to the first scanned. The snapshot is the
engines' own counts (each publishes its waiting and running requests after every step), which
the DP coordinator (``vllm/v1/engine/coordinator.py``) forwards to the front end at most every
100 ms; between snapshots the front end adds each request it sends to its rank's waiting count
(``current_counts[eng_index][0] += client_count``), so a burst is spread before the next
snapshot arrives.

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

from schedlab.configs import float_field

WAITING_WEIGHT = 4  # vLLM: score = waiting * 4 + running


@attrs.frozen
class DataParallelRouterConfig:
    stats_interval_ms: float = float_field(100.0, min=0.0, help="how old the load snapshot may get before a new one "
                                                                "is read (vLLM's DP coordinator publishes at most "
                                                                "every 100 ms)")


class DataParallelRouter:
    """vLLM's internal data-parallel load balancer (see the module docstring)."""

    def __init__(self, config: DataParallelRouterConfig | None = None):
        self.config = config if config is not None else DataParallelRouterConfig()
        self._taken_at = -float("inf")
        self._members: list[int] = []       # the instances (their index) the snapshot was read from, in order
        self._counts: list[list[int]] = []  # [waiting, running] per rank, as the front end knows them

    def route(self, request, instances: Sequence) -> int:
        now = request.arrival_ms
        members = [view.index for view in instances]
        if members != self._members or now >= self._taken_at + self.config.stats_interval_ms:
            self._counts = [[view.waiting, view.running] for view in instances]
            self._members = members
            self._taken_at = now
        best, best_score = 0, None
        for i, (waiting, running) in enumerate(self._counts):
            score = WAITING_WEIGHT * waiting + running
            if best_score is None or score < best_score:
                best, best_score = i, score
        self._counts[best][0] += 1
        return best
