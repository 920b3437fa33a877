"""Load-balancing routers that look only at the instances: round robin, least outstanding, least KV.

Each router reads what a real load balancer can see of a replica -- requests in flight and
the KV-cache usage gauge (vLLM's ``kv_cache_usage_perc``). Ties always go to the lowest
instance index, so runs are deterministic. Round robin costs O(1) per request; the others ask
the pool for its least loaded instance, O(log N) from the index the engine keeps
(:mod:`schedlab.engine.pool`), or scan a plain list of views. A router object holds the state
of one run (the simulation builds a fresh one per run).
"""

from __future__ import annotations

from typing import Sequence

from schedlab.engine.pool import kv_key, outstanding_key


def least_by(instances: Sequence, key, candidates: Sequence[int] | None = None) -> int:
    """Position of the least instance by ``key(view, position)``: from the pool's index when it
    keeps one, else by a scan (a plain list of views, e.g. in a test)."""
    ask = getattr(instances, "least_by", None)
    if ask is not None:
        return ask(key, candidates)
    positions = range(len(instances)) if candidates is None else candidates
    return min(positions, key=lambda pos: key(instances[pos], pos))


def least_outstanding(instances: Sequence, candidates: Sequence[int] | None = None) -> int:
    """Index of the instance with the fewest requests queued or running; ties to the lowest index.

    :param candidates: instance indices to choose from, in ascending order (default: all).
    """
    return least_by(instances, outstanding_key, candidates)


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

    @staticmethod
    def partition(request, order: int, n: int) -> int:
        """The choice without the router's state: the ``order``-th arrival goes to ``order % n``
        (a partitioned run, :mod:`schedlab.study.partition`)."""
        return order % n


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

    A router scoring replicas by the engine's KV-usage gauge alone (vLLM's
    ``kv_cache_usage_perc``). That is one of the scorers of the endpoint picker of the
    Kubernetes Gateway API Inference Extension (llm-d's ``kv-cache-utilization-scorer``), not
    its default: llm-d's default profile weighs it with a queue scorer and a prefix-cache scorer
    (the ``weighted`` router), and no shipped llm-d profile is KV-only. Waiting requests hold no
    KV yet, so a burst arriving at once all sees the same usage; the outstanding-count tie-break
    spreads such a burst.
    """

    def route(self, request, instances: Sequence) -> int:
        return least_by(instances, kv_key)
