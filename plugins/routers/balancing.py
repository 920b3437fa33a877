"""Load-balancing routers that look only at the instances: round robin, least outstanding, least KV.

Each router reads what a real load balancer can see of a replica -- requests in flight and
the KV-cache usage gauge (vLLM's ``kv_cache_usage_perc``) -- and does one O(instances) pass
per request. Ties always go to the lowest instance index, so runs are deterministic.
A router object holds the state of one run (the simulation builds a fresh one per run).
"""

from __future__ import annotations

from typing import Sequence


def least_outstanding(instances: Sequence, candidates: Sequence[int] | None = None) -> int:
    """Index of the instance with the fewest requests queued or running; ties to the lowest index.

    :param candidates: instance indices to choose from, in ascending order (default: all).
    """
    if candidates is None:
        candidates = range(len(instances))
    best = -1
    best_load = 0
    for i in candidates:
        load = instances[i].outstanding
        if best < 0 or load < best_load:
            best, best_load = i, load
    return best


def kv_usage(instance) -> float:
    """Share of the instance's KV blocks held by requests (cached-but-free blocks excluded)."""
    kv = instance.kv
    return kv.num_used_blocks() / kv.num_blocks


class RoundRobinRouter:
    """Instances in turn: the i-th request (in arrival order) goes to instance ``i % N``.

    The default of Kubernetes Services behind kube-proxy's IPVS mode, NGINX upstreams and the
    vLLM production-stack router (``roundrobin``). Blind to request length and load, so it
    is the baseline the load-aware routers are compared with.
    """

    def __init__(self) -> None:
        self._next = 0

    def route(self, request, instances: Sequence) -> int:
        index = self._next % len(instances)
        self._next = index + 1
        return index


class LeastOutstandingRouter:
    """The instance with the fewest requests queued or running (ties: lowest index).

    Join-the-shortest-queue on in-flight requests: AWS ALB's "least outstanding requests"
    algorithm, Envoy's ``LEAST_REQUEST`` (here with a full scan instead of its two random
    choices, which keeps runs deterministic), and the load fallback of SGLang's router.
    """

    def route(self, request, instances: Sequence) -> int:
        return least_outstanding(instances)


class LeastKVRouter:
    """The instance with the lowest KV-cache usage fraction (ties: fewest outstanding, then
    lowest index).

    Models routers that score replicas by the engine's KV-usage gauge, such as the endpoint
    picker of the Kubernetes Gateway API Inference Extension (llm-d), which reads vLLM's
    ``kv_cache_usage_perc``. Waiting requests hold no KV yet, so a burst arriving at once all
    sees the same usage; the outstanding-count tie-break spreads such a burst.
    """

    def route(self, request, instances: Sequence) -> int:
        best = 0
        best_key = None
        for i, inst in enumerate(instances):
            key = (kv_usage(inst), inst.outstanding)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best
