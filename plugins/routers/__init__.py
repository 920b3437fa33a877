"""Built-in routers for several-instance runs (``[cluster] router = {kind = ...}``).

``round_robin`` (the default), ``least_outstanding``, ``least_kv``, ``prefix_affinity`` and
``class``. Every router is deterministic; round robin costs O(1) per request, the others
O(log instances) (see :mod:`schedlab.engine.pool`).
"""

import schedlab

from .affinity import PrefixAffinityConfig, PrefixAffinityRouter, prefix_key
from .balancing import LeastKVRouter, LeastOutstandingRouter, RoundRobinRouter, kv_usage, least_outstanding
from .classes import ClassRouter, ClassRoutingConfig

__all__ = [
    "ClassRouter", "ClassRoutingConfig", "LeastKVRouter", "LeastOutstandingRouter", "PrefixAffinityConfig",
    "PrefixAffinityRouter", "RoundRobinRouter", "kv_usage", "least_outstanding", "prefix_key",
]


@schedlab.hookimpl
def schedlab_register_routers(register):
    register("round_robin", RoundRobinRouter, help="instances in turn (request i -> instance i % N)")
    register("least_outstanding", LeastOutstandingRouter,
             help="fewest requests queued or running (join the shortest queue; ties: lowest index)")
    register("least_kv", LeastKVRouter,
             help="lowest KV-cache usage (ties: fewest outstanding, then lowest index)")
    register("prefix_affinity", PrefixAffinityRouter, config=PrefixAffinityConfig,
             help="same prefix group (or first block hash) -> same instance; others least outstanding")
    register("class", ClassRouter, config=ClassRoutingConfig,
             help="request_class -> its own instances (e.g. interactive vs batch), least outstanding within")
