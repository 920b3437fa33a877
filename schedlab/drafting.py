"""The cost of a speculative step: the target's verify pass plus the drafter's passes.

:class:`DraftingCostModel` wraps the run's cost model. The target sees the verify pass in the
:class:`~schedlab.protocols.Batch` itself (``spec_tokens`` draft tokens verified beside the
decodes' own tokens); the drafter runs after it, as vLLM 0.33's proposers do
(``vllm/v1/spec_decode/llm_base_proposer.py``: one forward pass over the step's tokens, then
``k - 1`` passes of one token for every request in the batch) and proposes the ``k`` drafts
the next step verifies -- ``k`` for this step's batch size. So::

    iteration_ms = target(batch)
                 + drafter(batch)                                       (first draft pass)
                 + sum over i = 1 .. k-1 of drafter(i-th one-token pass over the batch's sequences)
                 + proposer_ms

The drafter's passes are timed by its cost model's ``kernel_ms`` where it has one (the
built-in ``roofline`` and ``profiled``: the GPU's kernels, without a step's host work, which the
target's step already carries), else by its ``iteration_ms``;
with no drafter cost for ``method = "ngram"`` (prompt lookup on the CPU: ``proposer_ms``
only), and nothing at all when ``k`` is 0 (no drafts proposed). The one-token passes see the
sequences' contexts after this step, growing by one a pass (as their mean: a drafter that asks
for the longest and shortest context gets the mean for both).
"""

from __future__ import annotations

from .protocols import Batch
from .speculative import SpeculativeConfig


class DraftingCostModel:
    """A target cost model plus drafting (see the module docstring)."""

    def __init__(self, target, drafter, config: SpeculativeConfig):
        self.target = target
        self.drafter = drafter
        self.config = config
        self.needs_context_range = bool(getattr(target, "needs_context_range", False))
        self.request_cost = getattr(target, "request_cost", None)
        self._k_memo: dict[int, int] = {}

    def draft_ms(self, batch: Batch) -> float:
        """The drafter's time in a step of shape ``batch``."""
        seqs = batch.num_decode + batch.num_prefill
        if not seqs:
            return 0.0
        k = self._k_memo.get(seqs)
        if k is None:
            k = self._k_memo[seqs] = self.config.k_for(seqs)
        if not k:
            return 0.0
        ms = self.config.proposer_ms
        drafter = self.drafter
        if drafter is None:
            return ms
        # The passes run inside the target's step: the drafter's kernels only, where it can say.
        time = getattr(drafter, "kernel_ms", drafter.iteration_ms)
        ms += time(batch)
        context = batch.decode_context_tokens + batch.prefill_context_tokens + batch.prefill_tokens
        for i in range(1, k):
            ctx = context + i * seqs
            mean = -(-ctx // seqs)
            ms += time(Batch(num_decode=seqs, decode_context_tokens=ctx, decode_context_max=mean,
                             decode_context_min=mean))
        return ms

    def iteration_ms(self, batch: Batch) -> float:
        return self.target.iteration_ms(batch) + self.draft_ms(batch)
