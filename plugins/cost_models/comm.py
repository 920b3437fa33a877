"""Tensor-parallel communication time: the all-reduce after each row-parallel linear layer.

Megatron-style tensor parallelism (Shoeybi et al., 2019; vLLM's ``RowParallelLinear``)
all-reduces the layer output, ``tokens x hidden_size`` activations, twice per decoder layer
(after the attention output projection and after the MLP down projection). A ring all-reduce
moves ``2 (tp - 1) / tp`` times the buffer over each GPU's link (Patarasuk and Yuan, 2009),
plus a fixed cost per collective (kernel launch and synchronisation; NCCL's small-message
latency)::

    allreduce_ms = latency_us / 1e3 + 2 (tp - 1) / tp * bytes / link_bandwidth
"""

from __future__ import annotations

ALLREDUCES_PER_LAYER = 2


def allreduce_ms(num_bytes: float, tensor_parallel: int, link_gbps: float, latency_us: float) -> float:
    """Time of one ring all-reduce of ``num_bytes`` over ``tensor_parallel`` GPUs, in ms."""
    if tensor_parallel <= 1:
        return 0.0
    share = 2.0 * (tensor_parallel - 1) / tensor_parallel
    return latency_us * 1e-3 + share * num_bytes / (link_gbps * 1e6)


def layer_comm(tensor_parallel: int, hidden_size: int, dtype_bytes: int, link_gbps: float,
               latency_us: float) -> tuple[float, float]:
    """``(fixed_ms, ms_per_token)`` of one decoder layer's all-reduces: linear in the tokens."""
    if tensor_parallel <= 1:
        return 0.0, 0.0
    share = 2.0 * (tensor_parallel - 1) / tensor_parallel
    per_token = share * hidden_size * dtype_bytes / (link_gbps * 1e6)
    return ALLREDUCES_PER_LAYER * latency_us * 1e-3, ALLREDUCES_PER_LAYER * per_token
