"""How one deployment spreads a model over GPUs beyond tensor parallelism.

``[cluster]`` declares it (:class:`schedlab.study.simulation.ClusterConfig`); the run hands a
:class:`Parallelism` to every plugin factory that takes a ``parallelism`` argument (as it hands
``presets``), so the KV cache sizes its pool and the cost model times its steps for the same
layout without the user repeating it in every table:

* **data parallelism with expert parallelism** (vLLM ``--data-parallel-size N
  --enable-expert-parallel``; SGLang ``--enable-dp-attention --ep-size``): ``data_parallel``
  ranks, each with its own scheduler, KV cache and requests behind a router; attention and
  the dense layers are replicated on every rank, the routed experts split over all ``N x tp``
  GPUs (``expert_parallel = true``) or, as vLLM does without the flag, every expert sharded
  over them. The ranks step together (:mod:`schedlab.engine.lockstep`).
* **pipeline parallelism** (vLLM ``--pipeline-parallel-size P``): the decoder layers split
  over ``pipeline_parallel`` stages, one batch in flight per stage
  (:mod:`schedlab.engine.pipeline`).

Tensor parallelism stays a setting of the cost model and the KV cache, as before.
"""

from __future__ import annotations

import attrs

from .configs import FieldError, bool_field, float_field, int_field
from .errors import ConfigError


@attrs.frozen
class Parallelism:
    """A deployment's data, expert and pipeline parallelism (tensor parallelism aside)."""

    data_parallel: int = int_field(1, min=1, max=1024, help="data-parallel ranks stepping together (MoE models)")
    expert_parallel: bool = bool_field(False, help="whole experts spread over the data-parallel x tensor-parallel "
                                                   "GPUs (vLLM --enable-expert-parallel); false: every expert sharded "
                                                   "over them")
    expert_balancedness: float = float_field(
        1.0, min=0.0, max=1.0, min_exclusive=True,
        help="mean over max of the tokens the expert-parallel ranks receive (vLLM's EPLB 'balancedness' log; "
             "1 = the router spreads them evenly)")
    pipeline_parallel: int = int_field(1, min=1, max=64, help="pipeline stages the decoder layers are split over")

    def __attrs_post_init__(self):
        if self.data_parallel > 1 and self.pipeline_parallel > 1:
            raise FieldError("pipeline_parallel", "data_parallel and pipeline_parallel together are not modelled; "
                                                  "use one of them")
        if self.expert_parallel and self.data_parallel == 1:
            raise FieldError("expert_parallel", "spreads experts over data-parallel ranks: set data_parallel > 1 "
                                                "(experts over tensor-parallel ranks: the cost model's "
                                                "expert_parallel)")
        if self.expert_balancedness != 1.0 and self.data_parallel == 1:
            raise FieldError("expert_balancedness", "applies to data-parallel ranks: set data_parallel > 1")
        if self.expert_balancedness != 1.0 and not self.expert_parallel:
            raise FieldError("expert_balancedness", "applies to experts spread over the ranks (expert_parallel = "
                                                    "true); sharded, every GPU takes its share of every expert")

    @property
    def lockstep(self) -> bool:
        """Data-parallel ranks that step together."""
        return self.data_parallel > 1

    @property
    def pipelined(self) -> bool:
        return self.pipeline_parallel > 1


#: No parallelism beyond tensor parallelism.
SINGLE = Parallelism()


class LayoutError(ConfigError):
    """A ``[cluster]`` layout the model cannot take, found while a component is built from it:
    said of ``[cluster]``, where the layout is written, not of the component's table."""


def stage_layers(num_layers: int, stages: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, vLLM's split (``vllm.distributed.utils.get_pp_indices``):
    ``num_layers // stages`` each, the remainder one more on the stages just before the last."""
    if stages > num_layers:
        raise LayoutError(f"pipeline_parallel = {stages} exceeds the model's {num_layers} layers (a stage holds "
                          f"at least one)")
    parts = [num_layers // stages] * stages
    for i in range(2, num_layers % stages + 2):
        parts[-i] += 1
    return tuple(parts)
