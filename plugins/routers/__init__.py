"""Built-in routers for several-instance runs (``[cluster] router = {kind = ...}``).

``round_robin`` (the default), ``least_outstanding``, ``least_kv``, ``weighted`` (llm-d's default
scorer mix), ``prefix_affinity``, ``hash``, ``class`` and ``vllm_dp`` (vLLM's data-parallel load
balancer, the default of data-parallel ranks). Every router is deterministic; round robin costs
O(1) per request, ``weighted`` and ``vllm_dp`` scan the instances, the others O(log instances)
(see :mod:`schedlab.engine.pool`).
"""

import schedlab

from .affinity import HashConfig, HashRouter, PrefixAffinityConfig, PrefixAffinityRouter, prefix_key, stable_hash
from .balancing import LeastKVRouter, LeastOutstandingRouter, RoundRobinRouter, kv_usage, least_outstanding
from .classes import ClassRouter, ClassRoutingConfig
from .data_parallel import DataParallelRouter, DataParallelRouterConfig
from .weighted import WeightedConfig, WeightedRouter

__all__ = [
    "ClassRouter", "ClassRoutingConfig", "DataParallelRouter", "DataParallelRouterConfig", "HashConfig", "HashRouter",
    "LeastKVRouter", "LeastOutstandingRouter", "PrefixAffinityConfig", "PrefixAffinityRouter", "RoundRobinRouter",
    "WeightedConfig", "WeightedRouter", "kv_usage", "least_outstanding", "prefix_key", "stable_hash",
]


@schedlab.hookimpl
def schedlab_register_routers(register):
    register("round_robin", RoundRobinRouter, help="instances in turn (request i -> instance i % N)")
    register("least_outstanding", LeastOutstandingRouter,
             help="fewest requests queued or running (join the shortest queue; ties: lowest index)")
    register("least_kv", LeastKVRouter,
             help="lowest KV-cache usage (ties: fewest outstanding, then lowest index); one of llm-d's scorers")
    register("weighted", WeightedRouter, config=WeightedConfig,
             help="llm-d's default endpoint picker: highest 2 x queue + 2 x (1 - KV usage) + 3 x prefix-cache score "
                  "(its prefix index an LRU of each instance's KV block count, as llm-d's)")
    register("prefix_affinity", PrefixAffinityRouter, config=PrefixAffinityConfig,
             help="same prefix group -> same instance; block hashes -> the instance holding their longest match "
                  "(over match_threshold, 0.3); others, and all while SGLang's load guard sees imbalance (64 "
                  "requests and 1.5x), least outstanding; instances known by index, up to 2**24 tokens each "
                  "remembered (SGLang's tree eviction, every 60 s)")
    register("hash", HashRouter, config=HashConfig,
             help="hash of the prefix (or id) modulo the instances, whatever the load (splits into partitions)")
    register("class", ClassRouter, config=ClassRoutingConfig,
             help="request_class -> its own instances (e.g. interactive vs batch), least outstanding within")
    register("vllm_dp", DataParallelRouter, config=DataParallelRouterConfig,
             help="vLLM's data-parallel load balancer (rule 'v0.33', the default: lowest max(in-flight, waiting + "
                  "running) + a KV penalty on waiting, rotating ties; 'v0.19': lowest 4 x waiting + running)")
