"""The communication of a tensor-parallel model per iteration, as vLLM lays it out.

Megatron-style tensor parallelism (Shoeybi et al., 2019), as vLLM's layers run it:

* every decoder layer all-reduces its ``tokens x hidden_size`` activations twice: after the
  attention output projection and after the MLP (or MoE) down projection
  (``RowParallelLinear``; ``FusedMoE`` reduces its output the same way at TP > 1);
* the input embedding is split by vocabulary (``VocabParallelEmbedding``): one more
  all-reduce of ``tokens x hidden_size`` per iteration;
* the LM head is split by vocabulary too, so the logits of the sampled rows are all-gathered
  (``LogitsProcessor._gather_logits``): ``sequences x vocab_size`` of output.

The times come from :mod:`.collectives` (NCCL's algorithms over the machine's links), the
layers' all-reduces from vLLM's own all-reduce where it was measured on the machine
(:mod:`.vllm_all_reduce`; the cost models' ``tp_all_reduce``). They are not linear in the
tokens (a small message is latency, a large one bandwidth), so the cost models memoise them
per token count.

LLMServingSim's trace generator, which the ``profiled`` cost model otherwise follows, has one
all-reduce after ``o_proj`` and one after ``down_proj`` only: one per layer for a MoE model
(none after its expert block without expert parallelism) and none for the embedding or the
logits. vLLM runs the ones above, and so does schedlab.
"""

from __future__ import annotations

from typing import Callable

from schedlab.capacity import ModelSpec
from schedlab.errors import ConfigError

from .collectives import Collectives
from .vllm_all_reduce import measured_all_reduce

ALLREDUCES_PER_LAYER = 2


class TensorParallelComm:
    """Communication time of one iteration of ``model`` split over ``collectives.ranks`` GPUs;
    ``all_reduce`` ("vllm" or "nccl"): the all-reduces as vLLM measures on the machine where it
    was measured (:func:`measured_all_reduce`), else NCCL's model."""

    def __init__(self, model: ModelSpec, collectives: Collectives, all_reduce: str = "nccl"):
        self.ranks = collectives.ranks
        self.collectives = collectives
        measured = measured_all_reduce(collectives.topology, self.ranks) \
            if all_reduce == "vllm" and collectives.nodes == 1 else None
        #: bytes -> ms of one all-reduce of the activations
        self.all_reduce_ms: Callable[[float], float] = measured or collectives.all_reduce_ms
        #: whether :attr:`all_reduce_ms` is vLLM's measured one
        self.measured = measured is not None
        if self.ranks > 1 and model.hidden_size is None:
            raise ConfigError(f"model {model.name!r}: hidden_size is needed for the tensor-parallel all-reduce")
        self._token_bytes = (model.hidden_size or 0) * model.dtype_bytes
        self._logit_bytes = (model.vocab_size or 0) * model.dtype_bytes
        self._layers = model.num_layers

    def layer_ms(self, tokens: int) -> float:
        """One decoder layer's all-reduces at ``tokens`` tokens."""
        if self.ranks == 1 or tokens <= 0:
            return 0.0
        return ALLREDUCES_PER_LAYER * self.all_reduce_ms(tokens * self._token_bytes)

    def once_ms(self, tokens: int) -> float:
        """The embedding's all-reduce, once per iteration."""
        if self.ranks == 1 or tokens <= 0:
            return 0.0
        return self.all_reduce_ms(tokens * self._token_bytes)

    def logits_ms(self, sequences: int) -> float:
        """The all-gather of the sampled rows' logits (0 when the model declares no vocab_size)."""
        if self.ranks == 1 or sequences <= 0 or not self._logit_bytes:
            return 0.0
        return self.collectives.all_gather_ms(sequences * self._logit_bytes)

    def tokens_ms(self, tokens: int) -> float:
        """Everything that depends on the tokens: every layer's all-reduces and the embedding's."""
        return self._layers * self.layer_ms(tokens) + self.once_ms(tokens)
