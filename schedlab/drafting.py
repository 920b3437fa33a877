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

**Data-parallel ranks stepping together** (:mod:`schedlab.engine.lockstep`). Each rank drafts
for its own sequences on its own GPUs, so the drafter's passes and ``proposer_ms`` join the
rank's own part of the step (``rank_ms``), as they join a colocated iteration; the experts,
and the work power models ask for, are the target's (as a colocated instance's power model
reads the target's). A rank with nothing scheduled runs the dummy batch, and with it the
drafter's dummy run: ``num_speculative_tokens`` passes over its one token, proposing nothing
(vLLM ``EagleProposer.dummy_run``; no ``proposer_ms``, nothing for n-gram). The drafter's own
collectives (an MTP head's experts) are not modelled: its passes are the rank's alone.

**Pipeline stages** (:mod:`schedlab.engine.pipeline`). vLLM 0.33 puts the whole drafter on the
last pipeline stage, which holds the target's final hidden states and LM head
(``gpu_model_runner.py``: the drafter is built only where ``get_pp_group().is_last_rank``), so
``pipeline_ms`` is the target's stage times with the drafter's passes and ``proposer_ms`` added
to the last stage's.
"""

from __future__ import annotations

from .engine.rank_cost import DUMMY
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
        # a lockstep rank's parts, where the target has them (None otherwise, so the layout's
        # checks name what is missing)
        self.rank_ms = self._rank_ms if callable(getattr(target, "rank_ms", None)) else None
        for name in ("experts_ms", "rank_work", "experts_work", "rank_kernel_ms"):
            setattr(self, name, getattr(target, name, None))
        # a pipelined instance's stage times, where the target has them (see the module docstring)
        self.pipeline_ms = self._pipeline_ms if callable(getattr(target, "pipeline_ms", None)) else None
        self._dummy_ms: float | None = None

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
        time = self._pass_ms()
        ms += time(batch)
        context = batch.decode_context_tokens + batch.prefill_context_tokens + batch.prefill_tokens
        for i in range(1, k):
            ctx = context + i * seqs
            mean = -(-ctx // seqs)
            ms += time(Batch(num_decode=seqs, decode_context_tokens=ctx, decode_context_max=mean,
                             decode_context_min=mean))
        return ms

    def _pass_ms(self):
        """How a drafter pass is timed: its kernels only, where its cost model can say (the
        passes run inside the target's step, which carries the host's work)."""
        drafter = self.drafter
        return getattr(drafter, "kernel_ms", drafter.iteration_ms)

    def dummy_draft_ms(self) -> float:
        """The drafter's dummy run beside a lockstep rank's dummy batch: ``k`` passes over its
        one token, nothing proposed (see the module docstring)."""
        if self._dummy_ms is None:
            passes = self.config.num_speculative_tokens if self.drafter is not None else 0
            self._dummy_ms = passes * self._pass_ms()(DUMMY) if passes else 0.0
        return self._dummy_ms

    def _rank_ms(self, batch: Batch) -> float:
        """A lockstep rank's own part of a step: the target's, and the rank's drafting."""
        if batch is DUMMY:
            return self.target.rank_ms(DUMMY) + self.dummy_draft_ms()
        return self.target.rank_ms(batch) + self.draft_ms(batch)

    def _pipeline_ms(self, batch: Batch) -> tuple[tuple, float]:
        """``(stage_ms, send_ms)`` of a pipelined batch: the target's, the drafting on the last stage."""
        stage_ms, send_ms = self.target.pipeline_ms(batch)
        return (*stage_ms[:-1], stage_ms[-1] + self.draft_ms(batch)), send_ms

    def iteration_ms(self, batch: Batch) -> float:
        return self.target.iteration_ms(batch) + self.draft_ms(batch)
