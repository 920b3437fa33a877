"""An iteration split over pipeline stages, as vLLM lays them out.

vLLM with ``--pipeline-parallel-size P`` gives each stage a contiguous run of decoder layers
(``vllm.distributed.utils.get_pp_indices``: ``layers // P`` each, the remainder one more on the
stages before the last), the input embedding to the first stage and the final norm, LM head
and sampler to the last. Between consecutive stages it sends the layer's output, hidden
states and residual (``IntermediateTensors``: ``2 x tokens x hidden_size x dtype`` bytes;
with tensor parallelism each rank sends its ``1 / tp`` share and the next stage all-gathers
it, not modelled), point to point (:meth:`.collectives.Collectives.send_recv_ms`).

A cost model splits its iteration time into what runs once before the first layer, what
runs once after the last, and the layers' share, which is the same for every layer of a
batch (:func:`split_stages`).
"""

from __future__ import annotations

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
        # Two neighbouring stages share a node unless the pipeline needs more GPUs than one holds.
        per_node = 2 if stages * tensor_parallel <= topology.gpus_per_node else 1
        self.collectives = Collectives(topology, 2, per_node)
        self._bytes_per_token = 2 * model.hidden_size * model.dtype_bytes / tensor_parallel
        self._memo: dict[int, float] = {}

    def send_ms(self, tokens: int) -> float:
        """Sending ``tokens`` tokens' activations from one stage to the next."""
        ms = self._memo.get(tokens)
        if ms is None:
            ms = self.collectives.send_recv_ms(tokens * self._bytes_per_token)
            if len(self._memo) < 1 << 16:
                self._memo[tokens] = ms
        return ms
