"""An iteration split over pipeline stages, as vLLM lays them out.

vLLM with ``--pipeline-parallel-size P`` gives each stage a contiguous run of decoder layers
(``vllm.distributed.utils.get_pp_indices``: ``layers // P`` each, the remainder one more on the
stages before the last), the input embedding to the first stage and the final norm, LM head
and sampler to the last. Between consecutive stages it sends the layer's output, hidden
states and residual (``IntermediateTensors``: ``2 x tokens x hidden_size x dtype`` bytes),
point to point (:meth:`.collectives.Collectives.send_recv_ms`). With tensor parallelism each
rank sends only its ``1 / tp`` slice of each tensor to its peer on the next stage, and the next
stage's ranks all-gather the two tensors before they run (vLLM 0.19
``GroupCoordinator.isend_tensor_dict`` / ``irecv_tensor_dict`` with ``all_gather_group =
get_tp_group()``, called from ``gpu_worker.py``; a tensor whose size does not divide by ``tp``
is sent whole). The receiving stage waits for both, so both are in the time from one stage to
the next. Ranks are numbered tensor-parallel first (``pp_rank x tp + tp_rank``), so stage ``k``
holds GPUs ``k x tp`` to ``(k + 1) x tp - 1`` and a pipeline over several nodes crosses between
nodes only where a stage starts a node: that hop's send takes the network, the others stay in
a node (``send_ms`` then gives each hop's time). In a node of islands (NVLink-bridged pairs,
PCIe between them) a hop whose ranks sit in different islands takes the link between islands.

A cost model splits its iteration time into what runs once before the first layer, what
runs once after the last, and the layers' share, which is the same for every layer of a
batch (:func:`split_stages`).
"""

from __future__ import annotations

import attrs

from schedlab.capacity import ModelSpec
from schedlab.errors import ConfigError
from schedlab.parallelism import stage_layers

from .collectives import Collectives, Topology


def split_stages(total_ms: float, first_ms: float, last_ms: float, layers: tuple[int, ...]) -> tuple[float, ...]:
    """Each stage's time: its layers' share of ``total_ms - first_ms - last_ms``, plus
    ``first_ms`` on the first stage and ``last_ms`` on the last."""
    n = sum(layers)
    per_layer = (total_ms - first_ms - last_ms) / n
    times = [count * per_layer for count in layers]
    times[0] += first_ms
    times[-1] += last_ms
    return tuple(times)


def stage_split(sends: "PipelineSends | None") -> "PipelineSends":
    """A cost model's stage layout (its :class:`PipelineSends`), or a ValueError when it was built
    without pipeline parallelism."""
    if sends is None:
        raise ValueError("the cost model was built without pipeline parallelism: it has no stages")
    return sends


class PipelineSends:
    """The activations one stage sends the next, per iteration."""

    def __init__(self, model: ModelSpec, topology: Topology, stages: int, tensor_parallel: int):
        if model.hidden_size is None:
            raise ConfigError(f"model {model.name!r}: hidden_size is needed for the activations sent between "
                              "pipeline stages")
        self.layers = stage_layers(model.num_layers, stages)
        #: the link of the send from stage k to stage k + 1 (:func:`hop_links`)
        self.hop_links = hop_links(stages, tensor_parallel, topology.gpus_per_node, topology.island_size)
        #: whether it leaves a node (any of its rank pairs)
        self.hop_crosses = tuple(link == NODES for link in self.hop_links)
        # a send within an island, between islands of a node, between nodes (built where a hop needs it)
        builders = {ISLAND: lambda: Collectives(topology, 2, 2),
                    ISLANDS: lambda: Collectives(attrs.evolve(topology, island=1), 2, 2),
                    NODES: lambda: Collectives(topology, 2, 1)}
        self._links = {link: builders[link]() for link in sorted(set(self.hop_links))}
        # The receiving stage's tensor-parallel group, which all-gathers the slices.
        self.gather = Collectives(topology, tensor_parallel)
        self.tensor_parallel = tensor_parallel
        self._hidden = model.hidden_size
        self._tensor_bytes_per_token = model.hidden_size * model.dtype_bytes  # one of the two tensors
        self._memo: dict[int, float | tuple[float, ...]] = {}

    def send_ms(self, tokens: int) -> float | tuple[float, ...]:
        """Sending ``tokens`` tokens' activations from one stage to the next: hidden states and
        residual, each as ``1 / tp`` slices then all-gathered by the next stage's ranks (whole when
        ``tokens x hidden_size`` does not divide by ``tp``). One time for every hop, or each hop's
        when some leave a node and others do not (``pipeline_ms``'s send may be either)."""
        ms = self._memo.get(tokens)
        if ms is None:
            by_link = {link: self._one_send(pair, tokens) for link, pair in self._links.items()}
            ms = next(iter(by_link.values())) if len(by_link) == 1 else tuple(by_link[k] for k in self.hop_links)
            if len(self._memo) < 1 << 16:
                self._memo[tokens] = ms
        return ms

    def _one_send(self, link: Collectives, tokens: int) -> float:
        tensor = tokens * self._tensor_bytes_per_token
        tp = self.tensor_parallel
        if tp > 1 and (tokens * self._hidden) % tp == 0:
            return link.send_recv_ms(2 * tensor / tp) + 2 * self.gather.all_gather_ms(tensor)
        return link.send_recv_ms(2 * tensor)


#: The link a send between two GPUs takes: within an island, between islands of a node, between nodes
ISLAND, ISLANDS, NODES = 0, 1, 2


def hop_links(stages: int, tensor_parallel: int, gpus_per_node: int, island: int | None = None) -> tuple[int, ...]:
    """For each hop from stage ``k`` to ``k + 1``, the slowest link a rank's send takes
    (:data:`ISLAND`, :data:`ISLANDS` or :data:`NODES`): rank ``i`` of stage ``k`` is GPU ``k x tp
    + i`` (vLLM numbers ranks tensor-parallel first) and sends to GPU ``(k + 1) x tp + i``; nodes
    hold ``gpus_per_node`` consecutive GPUs, islands ``island`` (default: the node)."""
    tp, island = tensor_parallel, island or gpus_per_node

    def link(a: int, b: int) -> int:
        return NODES if a // gpus_per_node != b // gpus_per_node else ISLANDS if a // island != b // island else ISLAND
    return tuple(max(link(k * tp + i, (k + 1) * tp + i) for i in range(tp)) for k in range(stages - 1))


def hop_crosses(stages: int, tensor_parallel: int, gpus_per_node: int) -> tuple[bool, ...]:
    """For each hop from stage ``k`` to ``k + 1``, whether a rank sends to a GPU of another node."""
    return tuple(link == NODES for link in hop_links(stages, tensor_parallel, gpus_per_node))
