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
only). The one-token passes see the sequences' contexts after this step, growing by one a pass
(as their mean: a drafter that asks for the longest and shortest context gets the mean for both).

**Drafts per batch size** (``k_by_batch_size``) cut the passes less than ``k`` suggests, in vLLM
0.33: a step whose ``k`` is 0 still runs the drafter's first pass over its tokens, which keeps the
drafter's KV cache in step with the target's, and samples nothing (``llm_base_proposer.py``,
"No draft tokens requested (e.g. Dynamic SD decided K=0)", and the V2 model runner's
``TargetDependentARSpeculator.propose`` alike; no ``proposer_ms`` then); and a draft model under
the V2 model runner, vLLM's default on GPUs, drafts ``num_speculative_tokens`` whatever the
step's ``k`` (``StandaloneARSpeculator.propose`` runs every pass; the runner drops the drafts past
``k``), so only EAGLE's passes follow ``k``. n-gram proposes nothing at ``k`` = 0.

**What power models and the clock see.** The drafter's passes are GPU work inside the step:
``kernel_ms`` is the target's kernels plus the passes' (``proposer_ms`` is the host's), and
``work`` the target's ``(bytes, flops)`` and each pass's, joined phase by phase -- where the target's and the
drafter's cost models say them (the roofline; a drafter that says no ``work`` leaves
``unsaid_work``, and the utilisation power model and ``[clock]`` refuse it by name; a target
that says none, as ``profiled``, gets the utilisation model's roofline of its model, the
drafter's passes added by ``work_with``). The passes
run one after the other, each with its own bound resource, so ``work_parts`` says them apart:
the clock stretches each on its own split (:mod:`schedlab.energy.clock`), and ``work`` keeps
them as phases (:func:`schedlab.energy.work.joined`), so the utilisation power model takes each
pass's bound apart too: a verifying step's GEMMs turn compute-bound while the passes and the
attention stay memory-bound (``tools/drafter_energy.py``; README: Energy). The drafter's work
per GPU is its cost model's: give it the tensor-parallel degree it runs at.

**Data-parallel ranks stepping together** (:mod:`schedlab.engine.lockstep`). Each rank drafts
for its own sequences on its own GPUs, so the drafter's passes and ``proposer_ms`` join the
rank's own part of the step (``rank_ms``), as they join a colocated iteration, and so do their
work and kernels (``rank_work``, ``rank_kernel_ms``, ``rank_work_parts``); the experts are the
target's. A rank with nothing scheduled runs the dummy batch, and with it the drafter's dummy
run: ``num_speculative_tokens`` passes over its one token, proposing nothing (vLLM
``EagleProposer.dummy_run``; no ``proposer_ms``, nothing for n-gram), its work and kernels the
dummy's too. The drafter's own collectives (an MTP head's experts) are not modelled: its passes
are the rank's alone.

**Pipeline stages** (:mod:`schedlab.engine.pipeline`). vLLM 0.33 puts the whole drafter on the
last pipeline stage, which holds the target's final hidden states and LM head
(``gpu_model_runner.py``: the drafter is built only where ``get_pp_group().is_last_rank``), so
``pipeline_ms`` is the target's stage times with the drafter's passes and ``proposer_ms`` added
to the last stage's. Their work is the last stage's too: ``stage_work`` is the target's split with
every pass's ``(bytes, flops)`` added to the last stage's share, ``stage_work_parts`` the same
pass by pass (the last stage's target slice, then the drafter's passes: the clock stretches each
on its own split, :meth:`~schedlab.energy.clock.ClockedCostModel.pipeline_at`), and
``stage_kernel_ms`` the stages' kernels -- the target's, the host's share of the step off the
first stage, and the passes' on the last (``proposer_ms`` is the host's, on the last stage's
time) -- so the power model charges the drafter to the last stage's GPUs
(:class:`~schedlab.engine.stage_cost.StageCost`).
"""

from __future__ import annotations

from .energy.work import joined
from .engine.clock import check_iteration_ms, check_pipeline_ms
from .engine.rank_cost import DUMMY
from .engine.stage_cost import stage_kernels
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
        # a pipelined instance's stage times, where the target has them (see the module docstring)
        self.pipeline_ms = self._pipeline_ms if _has(target, "pipeline_ms") else None
        self._dummy_ms: float | None = None
        self._pass_ms = getattr(drafter, "kernel_ms", None) or getattr(drafter, "iteration_ms", None)
        drafter_work = getattr(drafter, "work", None) if drafter is not None else _NO_WORK
        #: why the step's work cannot be said (the drafter's cost model says none), or None
        self.unsaid_work = None if callable(drafter_work) else (
            f"the drafter's cost model {type(drafter).__name__} does not say the bytes and FLOPs of its passes "
            "(work); use one that does (roofline)")
        self._drafter_work = drafter_work if self.unsaid_work is None else None
        # what is said only where the target (and the drafter) can say it: None otherwise, so
        # power models, the clock and the layout's checks see what is missing
        self.kernel_ms = self._kernel_ms if _has(target, "kernel_ms") else None
        self.work = self.work_with(target.work) if _has(target, "work") and not self.unsaid_work else None
        self.work_parts = self._work_parts if self.work is not None else None
        # a lockstep rank's parts, where the target has them
        self.rank_ms = self._rank_ms if _has(target, "rank_ms") else None
        self.rank_kernel_ms = self._rank_kernel_ms if _has(target, "rank_kernel_ms") else None
        said = _has(target, "rank_work") and not self.unsaid_work
        self.rank_work = self._rank_work if said else None
        self.rank_work_parts = self._rank_work_parts if said else None
        for name in ("experts_ms", "experts_work", "busiest_experts_work"):  # the experts are the target's
            setattr(self, name, getattr(target, name, None))
        # a pipelined instance's stages, the drafter's passes on the last one, where the target has them
        said = _has(target, "stage_work") and not self.unsaid_work
        self.stage_work = self._stage_work if said else None
        self.stage_work_parts = self._stage_work_parts if said else None
        self.stage_kernel_ms = self._stage_kernel_ms if self.kernel_ms is not None and self.pipeline_ms else None

    # --- the drafter's passes ----------------------------------------------------------------------
    def _k(self, seqs: int) -> int:
        k = self._k_memo.get(seqs)
        if k is None:
            k = self._k_memo[seqs] = self.config.k_for(seqs)
        return k

    def passes(self, batch: Batch) -> list[Batch]:
        """The drafter's passes in a step of shape ``batch`` (none without a drafter or drafts):
        one over the step's tokens, then ``k - 1`` of one token a sequence. A lockstep rank's
        :data:`~schedlab.engine.rank_cost.DUMMY` gets the dummy run's ``k`` passes over it."""
        if self.drafter is None:
            return []
        if batch is DUMMY:
            return [DUMMY] * self.config.num_speculative_tokens
        seqs = batch.num_decode + batch.num_prefill
        if not seqs or self.config.method == "ngram":
            return []
        # a draft model drafts num_speculative_tokens whatever the step's k; EAGLE k (at 0 its
        # first pass alone): see the module docstring
        k = self.config.num_speculative_tokens if self.config.method == "draft_model" else max(self._k(seqs), 1)
        out = [batch]
        context = batch.decode_context_tokens + batch.prefill_context_tokens + batch.prefill_tokens
        for i in range(1, k):
            ctx = context + i * seqs
            mean = -(-ctx // seqs)
            out.append(Batch(num_decode=seqs, decode_context_tokens=ctx, decode_context_max=mean,
                             decode_context_min=mean))
        return out

    def draft_ms(self, batch: Batch) -> float:
        """The drafter's time in a step of shape ``batch``: its passes and ``proposer_ms``."""
        seqs = batch.num_decode + batch.num_prefill
        if not seqs:
            return 0.0
        samples = self.config.method == "draft_model" or self._k(seqs)  # (drafts sampled: proposer_ms)
        return (self.config.proposer_ms if samples else 0.0) + self._passes_ms(batch)

    def _passes_ms(self, batch: Batch) -> float:
        """The drafter's passes on the GPU: its kernels only, where its cost model can say (the
        passes run inside the target's step, which carries the host's work)."""
        time = self._pass_ms
        return sum(time(p) for p in self.passes(batch)) if self.drafter is not None else 0.0

    def dummy_draft_ms(self) -> float:
        """The drafter's dummy run beside a lockstep rank's dummy batch: ``k`` passes over its
        one token, nothing proposed (see the module docstring)."""
        if self._dummy_ms is None:
            self._dummy_ms = self._passes_ms(DUMMY)
        return self._dummy_ms

    # --- CostModel protocol, and what power models and the clock ask --------------------------------
    def iteration_ms(self, batch: Batch) -> float:
        return check_iteration_ms(self.target.iteration_ms(batch), batch) + self.draft_ms(batch)

    def _kernel_ms(self, batch: Batch) -> float:
        """The GPU's kernels in the step: the target's and the drafter's passes (``proposer_ms``
        is the host's)."""
        return self.target.kernel_ms(batch) + self._passes_ms(batch)

    def work_with(self, target_work):
        """``work(batch)`` with ``target_work`` saying the target's part: ``(bytes, flops)`` one GPU
        reads and computes in the step, the target's pass and the drafter's joined phase by phase
        (see the module docstring)."""
        return lambda batch: self._with_passes(target_work(batch), batch)

    def _with_passes(self, work: tuple[float, float], batch: Batch) -> tuple[float, float]:
        """``work`` and the drafter's passes' in a step of shape ``batch`` (their phases after
        the target's, :func:`schedlab.energy.work.joined`)."""
        return joined(work, *(self._drafter_work(p) for p in self.passes(batch)))

    def _work_parts(self, batch: Batch) -> list[tuple[float, float]]:
        """The step's work pass by pass, in the order they run (the clock stretches each alone)."""
        return self._apart(self.target.work(batch), batch)

    def _apart(self, work: tuple[float, float], batch: Batch) -> list[tuple[float, float]]:
        """``work`` and the drafter's passes' in a step of shape ``batch``, pass by pass."""
        return [work] + [self._drafter_work(p) for p in self.passes(batch)]

    # --- a lockstep rank's own part (schedlab.engine.lockstep) ---------------------------------------
    def _rank_ms(self, batch: Batch) -> float:
        """A lockstep rank's own part of a step: the target's, and the rank's drafting."""
        if batch is DUMMY:
            return check_iteration_ms(self.target.rank_ms(DUMMY), DUMMY, "rank_ms") + self.dummy_draft_ms()
        return check_iteration_ms(self.target.rank_ms(batch), batch, "rank_ms") + self.draft_ms(batch)

    def _rank_kernel_ms(self, batch: Batch) -> float:
        return self.target.rank_kernel_ms(batch) + self._passes_ms(batch)

    def _rank_work(self, batch: Batch) -> tuple[float, float]:
        """A lockstep rank's own work in a step: the target's part and its drafter's passes."""
        return self._with_passes(self.target.rank_work(batch), batch)

    def _rank_work_parts(self, batch: Batch) -> list[tuple[float, float]]:
        return self._apart(self.target.rank_work(batch), batch)

    # --- a pipelined instance's stages (schedlab.engine.pipeline) ------------------------------------
    def _pipeline_ms(self, batch: Batch) -> tuple[tuple, float]:
        """``(stage_ms, send_ms)`` of a pipelined batch: the target's, the drafting on the last stage."""
        stage_ms, send_ms = check_pipeline_ms(self.target.pipeline_ms(batch), batch)
        return (*stage_ms[:-1], stage_ms[-1] + self.draft_ms(batch)), send_ms

    def _stage_work(self, batch: Batch) -> tuple[tuple[float, float], ...]:
        """``(bytes, flops)`` one GPU of each stage reads and computes in a pipelined batch: the
        target's split, the drafter's passes joined to the last stage's (as :meth:`work_with`
        joins them to a colocated step's)."""
        work = self.target.stage_work(batch)
        return (*work[:-1], self._with_passes(work[-1], batch))

    def _stage_work_parts(self, batch: Batch) -> tuple[list[tuple[float, float]], ...]:
        """Each stage's work pass by pass, in the order they run: the target's slice alone, and on
        the last stage the drafter's passes after it (the clock stretches each alone)."""
        work = self.target.stage_work(batch)
        return (*([w] for w in work[:-1]), self._apart(work[-1], batch))

    def _stage_kernel_ms(self, batch: Batch) -> tuple[float, ...]:
        """Each stage's GPU kernels in a pipelined batch at the highest clock: the target's (the
        host's share of the step off the first stage) and the drafter's passes on the last;
        ``proposer_ms``, on the last stage's time, is the host's."""
        kernels = stage_kernels(self.target, batch)
        return (*kernels[:-1], kernels[-1] + self._passes_ms(batch))


_NO_WORK = lambda batch: (0.0, 0.0)  # noqa: E731  (n-gram: no drafter, no GPU work)


def _has(model, name: str) -> bool:
    return callable(getattr(model, name, None))
