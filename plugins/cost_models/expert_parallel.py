"""The routed experts of a data-parallel deployment: one step's expert layers across its GPUs.

vLLM with ``--data-parallel-size D`` serves a MoE model on ``D x tp`` GPUs whose ranks step
together: each data-parallel rank runs attention and the dense layers on its own batch (a rank
with nothing to do runs a one-token dummy batch, ``execute_dummy_batch``), and every MoE layer
then works on the tokens of *all* ranks (``FusedMoE``; vLLM's default ``all2all_backend``,
``allgather_reducescatter``, ``AgRsAll2AllManager``):

* **dispatch**: the data-parallel group all-gathers every rank's hidden states and router
  logits (``(hidden_size + num_experts) x dtype`` bytes a token), each rank's piece padded to
  the largest one, as vLLM pads the ranks' token counts to the largest under CUDA graphs
  (``coordinate_batch_across_dp``; without them ``all_gatherv`` of two ranks' pieces still
  takes as long as the larger piece);
* **experts**: with ``--enable-expert-parallel`` each GPU holds ``experts / (D x tp)`` whole
  experts and computes the (token, expert) pairs routed to them; without it every expert is
  sharded over the ``D x tp`` GPUs, each computing ``1 / (D x tp)`` of every pair;
* **combine**: the group reduce-scatters the outputs back to their ranks
  (``tokens x hidden_size x dtype``).

**Padded rows.** When every rank's batch is small enough to replay a captured CUDA graph
(``cuda_graph_max_tokens`` in the cost model, 0 in eager mode), vLLM 0.19 pads every rank to
the largest rank's token count (``dp_utils._synchronize_dp_ranks``: ``should_dp_pad`` when the
ranks' synced CUDA graph mode is not NONE; a rank with nothing to do pads its dummy batch the
same way), and the padded rows go through the router and the experts like real ones: the
experts then compute ``ranks x largest`` tokens' pairs, not the ranks' sum (:meth:`padded`).
One rank past the graph size (a long prompt chunk) turns the padding off for the step. The
ranks' own dense layers at the padded size, and rounding up to the next captured size, are not
modelled.

All three run in every decoder layer and wait for the slowest GPU. Collectives come from
:mod:`.collectives` (each tensor-parallel rank is in its own data-parallel group, so the
groups run side by side); the expert compute from the cost model, as a function of the
(token, expert) pairs and the distinct experts one GPU computes (:class:`ExpertLayers`).

**Load balance.** ``balancedness`` is vLLM's EPLB measure: the mean over the maximum of the
pairs the GPUs receive. At 1 (default) the router spreads tokens evenly over the experts, so
a GPU gets pairs in proportion to the experts it holds (vLLM gives the first ``experts % GPUs``
GPUs one more); a real router is skewed (some experts are popular), and the busiest GPU then
receives ``1 / balancedness`` of that, up to every token's pairs that its experts can take.
The step waits for it.

Dispatch and combine run around the MoE layers only (``moe_layers``: DeepSeek-V3's first three
layers are dense). Not modelled: DeepEP / pplx all-to-all kernels (``all2all_backend``), redundant
experts and EPLB's rebalancing.
"""

from __future__ import annotations

from typing import Callable, Sequence

from schedlab.capacity import ModelSpec
from schedlab.configs import FieldError
from schedlab.errors import ConfigError
from schedlab.parallelism import LayoutError, Parallelism

from .collectives import Collectives, Topology


def busiest_experts_work(cost, tokens: Sequence[int]) -> tuple[float, float]:
    """``cost.experts_work(tokens)`` on the busiest GPU of ``cost.expert_layers`` (the mean GPU's
    for a model without routed experts): the roofline's and the profiled model's
    ``busiest_experts_work``."""
    work = cost.experts_work(tokens)
    layers = cost.expert_layers
    return layers.busiest_work(work, tokens) if layers is not None else work


class ExpertLayers:
    """One step's routed-expert layers over ``parallelism.data_parallel x tensor_parallel`` GPUs.

    :param compute_ms: the expert layers of every decoder layer on one GPU, given the (token,
        expert) pairs it computes *expressed in tokens* (pairs / experts per token: the
        tokens a single-GPU MoE layer would route to make as many pairs) and the distinct
        experts it reads. The cost model's own measure of its experts.
    :param graph_tokens: the largest rank batch (tokens) that replays a CUDA graph; 0 in eager
        mode (no padded rows).
    """

    def __init__(self, model: ModelSpec, parallelism: Parallelism, tensor_parallel: int, topology: Topology,
                 compute_ms: Callable[[float, float], float], graph_tokens: int = 0):
        if not model.is_moe:
            raise ConfigError(f"model {model.name!r} has no routed experts")
        if model.hidden_size is None:
            raise ConfigError(f"model {model.name!r}: hidden_size is needed for the experts' dispatch and combine")
        d = parallelism.data_parallel
        self.ranks = d
        self.gpus = d * tensor_parallel
        if parallelism.expert_parallel and parallelism.expert_balancedness < 1.0 / self.gpus:
            raise LayoutError(f"expert_balancedness = {parallelism.expert_balancedness:g} is below 1 / "
                              f"{self.gpus} ({1.0 / self.gpus:.3g}), every token's experts on one of the "
                              f"{self.gpus} GPUs: the mean over the most a GPU receives is never less")
        self.expert_parallel = parallelism.expert_parallel
        self.balancedness = parallelism.expert_balancedness
        # vLLM (determine_expert_map) gives the first E % gpus GPUs one expert more: the busiest holds
        # ceil(E / gpus)
        self.local_experts = -(-model.num_experts // self.gpus)
        self.experts = model.num_experts
        self.top_k = model.experts_per_token
        self.layers = model.moe_layer_count   # (dispatch and combine around each MoE layer only)
        self._dispatch_bytes = (model.hidden_size + model.num_experts) * model.dtype_bytes
        self._combine_bytes = model.hidden_size * model.dtype_bytes
        per_node = min(d, max(1, topology.gpus_per_node // tensor_parallel))
        # a data-parallel group holds one GPU of each rank, tensor_parallel apart (vLLM gives rank r
        # GPUs [r tp, (r + 1) tp)): across NVLink pairs at tp >= 2 on nvlink-pairs machines
        self.collectives = Collectives(topology, d, per_node, stride=tensor_parallel)
        self._compute = compute_ms
        self.graph_tokens = graph_tokens
        self._memo: dict[tuple[int, int], float] = {}

    def padded(self, tokens: Sequence[int]) -> tuple:
        """The tokens each rank sends through the experts when the ranks run ``tokens``: every
        rank the largest when all replay CUDA graphs (vLLM's DP padding), else their own."""
        largest = max(tokens)
        if largest <= self.graph_tokens:
            return (largest,) * len(tokens)
        return tuple(tokens)

    def busiest_gpu(self, tokens: float, balancedness: float | None = None) -> tuple[float, float]:
        """``(pairs in tokens, distinct experts)`` the busiest GPU computes when ``tokens``
        tokens are routed in one layer (uniform routing, scaled by the balancedness: the
        layout's, or ``balancedness``)."""
        k, g = self.top_k, self.gpus
        if not self.expert_parallel:
            # Every GPU holds a 1/g shard of every expert: the work of 1/g of the pairs on 1/g
            # of the experts the tokens touch (the tensor-parallel rule of the profiled model).
            touched = self.experts * (1.0 - (1.0 - k / self.experts) ** tokens)
            return tokens / g, touched / g
        local = self.local_experts
        b = self.balancedness if balancedness is None else balancedness
        pairs = min(tokens * k * local / self.experts / b, tokens * min(k, local))
        distinct = local * (1.0 - (1.0 - 1.0 / local) ** pairs) if local > 1 else min(pairs, 1.0)
        return pairs / k, distinct

    def busiest_work(self, work: tuple[float, float], tokens: Sequence[int]) -> tuple[float, float]:
        """The busiest GPU's ``(bytes, flops)`` in a step's experts, from ``work``, the mean GPU's
        (:meth:`~.work.ModelWork.experts_work` of the ranks' ``tokens``): its FLOPs scaled by the
        pairs it computes and its bytes by the distinct experts it reads, each over what it
        would at an even balance (:meth:`busiest_gpu`). So at ``balancedness`` 1, or with every
        expert sharded (no ``expert_parallel``), it is ``work`` itself."""
        if not self.expert_parallel or self.balancedness >= 1.0:
            return work
        total = sum(self.padded(tokens))
        pairs, distinct = self.busiest_gpu(total)
        even_pairs, even_distinct = self.busiest_gpu(total, 1.0)
        byt, flops = work
        return (byt * distinct / even_distinct if even_distinct > 0.0 else byt,
                flops * pairs / even_pairs if even_pairs > 0.0 else flops)

    def step_ms(self, tokens: Sequence[int]) -> float:
        """The expert layers of one step whose data-parallel ranks run ``tokens`` tokens each
        (a rank running a dummy batch: 1), padded rows included (:meth:`padded`)."""
        if len(tokens) != self.ranks:
            raise ValueError(f"expected the tokens of {self.ranks} data-parallel ranks, got {len(tokens)}")
        total, largest = sum(tokens), max(tokens)
        key = (total, largest)
        ms = self._memo.get(key)
        if ms is None:
            c = self.collectives
            padded = self.ranks * largest
            per_layer = (c.all_gather_ms(padded * self._dispatch_bytes)
                         + c.reduce_scatter_ms(padded * self._combine_bytes))
            rows = padded if largest <= self.graph_tokens else total
            ms = self.layers * per_layer + self._compute(*self.busiest_gpu(rows))
            if len(self._memo) < 1 << 16:
                self._memo[key] = ms
        return ms



def check_expert_parallel(config, model: ModelSpec) -> None:
    """Refuse a cost model's ``expert_parallel`` for a model without routed experts: it would do
    nothing, where ``[cluster] expert_parallel`` on that model is refused."""
    if getattr(config, "expert_parallel", False) and not model.is_moe:
        raise FieldError("expert_parallel", f"model {model.name!r} has no routed experts to spread")
