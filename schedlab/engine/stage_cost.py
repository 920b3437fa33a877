"""What a pipelined instance sees of its cost model: the batch's time as the pipeline set it
(:class:`~schedlab.engine.rank_cost.RankCost`) and, for power models, what one stage's GPUs did.

A pipelined instance's power model is built against its :class:`StageCost`. The instance's
meter (:class:`schedlab.energy.pipeline.PipelineMeter`) points the view at a stage (``stage``)
-- and, with ``[clock]``, at the batch's clock (``ratio``) -- before it asks the power model for
that stage's slice of a batch, so the model reads that stage's share:

* ``work(batch)``: the cost model's ``stage_work(batch)[stage]``, the ``(bytes, flops)`` one GPU
  of the stage reads and computes (its layers' share; the LM head on the last stage);
* ``kernel_ms(batch)``: the stage's GPU kernels -- its time in the cost model's ``pipeline_ms``,
  without the host's share of the step, which the first stage carries (the iteration's time
  less the cost model's ``kernel_ms``; all of the stage's time for a cost model without
  ``kernel_ms``; with speculative decoding the wrapper's ``stage_kernel_ms``, the drafter's
  passes on the last stage and ``proposer_ms`` off it) -- and, at a clock, stretched by the clock
  law on the stage's own work, pass by pass, as the stage's time was
  (:meth:`schedlab.energy.clock.ClockedCostModel.pipeline_at`). A slice's other time (the
  host's share, swaps before the first stage, ``proposer_ms``) the GPUs are awake with no kernel.
"""

from __future__ import annotations

from ..protocols import Batch
from .clock import check_iteration_ms, check_pipeline_ms
from .rank_cost import ClockView, RankCost, clocked


def stage_kernels(cost, batch: Batch) -> tuple[float, ...]:
    """Each stage's GPU kernels for ``batch`` at the highest clock (see the module docstring):
    the cost model's own ``stage_kernel_ms`` where it says them (speculative decoding's wrapper,
    whose drafter's passes are the last stage's kernels and ``proposer_ms`` its host's)."""
    own = getattr(cost, "stage_kernel_ms", None)
    if own is not None:
        return own(batch)
    stage_ms, _ = check_pipeline_ms(cost.pipeline_ms(batch), batch)
    kernel = getattr(cost, "kernel_ms", None)
    if kernel is None:
        return tuple(stage_ms)
    host = check_iteration_ms(cost.iteration_ms(batch), batch) - kernel(batch)
    return (stage_ms[0] - host if host > 0.0 else stage_ms[0], *stage_ms[1:])


class StageCost(RankCost):
    """A pipelined instance's view of its cost model (see the module docstring).

    :ivar stage: the stage whose slice the meter is asking about.
    """

    __slots__ = ("stage", "_memo")

    def __init__(self, inner):
        super().__init__(inner)
        self.stage = 0
        self._memo: tuple = (None, (), ())  # the last batch asked about, its stages' work and kernels

    def _base(self):
        """The cost model at the highest clock."""
        return self.inner

    def _stages(self, batch: Batch) -> tuple[tuple, tuple]:
        """Every stage's work and kernels for ``batch`` (asked once for the stages' slices)."""
        memo = self._memo
        if memo[0] is not batch:
            work = self.inner.stage_work(batch)
            kernels = stage_kernels(self._base(), batch) if batch.num_batched_tokens else (0.0,) * len(work)
            memo = self._memo = (batch, work, kernels)
        return memo[1], memo[2]

    def work(self, batch: Batch) -> tuple[float, float]:
        """``(bytes, flops)`` one GPU of the stage reads and computes in its slice of ``batch``."""
        return self._stages(batch)[0][self.stage]

    def kernel_ms(self, batch: Batch) -> float:
        """The stage's GPU kernels in its slice of ``batch``."""
        return self._stages(batch)[1][self.stage]


class ClockedStageCost(ClockView, StageCost):
    """A pipelined instance's view when its cost model is clocked: power models find the clock
    here (:class:`~schedlab.engine.rank_cost.ClockView`: the batch's, which the pipeline chose
    when it launched the batch) and the stage's kernels are stretched as its time was."""

    __slots__ = ("_splits",)

    def __init__(self, inner):
        super().__init__(inner)
        self._splits: tuple = (None, ())  # the last batch asked about at a clock, its stages' splits

    def _base(self):
        return self.inner.inner

    def kernel_ms(self, batch: Batch) -> float:
        k = StageCost.kernel_ms(self, batch)
        if self.ratio >= 1.0 or not k:
            return k
        if self._splits[0] is not batch:  # each pass of the stage stretched on its own split
            self._splits = (batch, self.inner.stage_splits(batch))
        return k + self.inner.stretch_all(self._splits[1][self.stage], self.ratio)


def stage_view(cost) -> StageCost:
    """What a pipelined instance sees of ``cost``: a :class:`ClockedStageCost` for a clocked cost
    model, else a :class:`StageCost`."""
    return ClockedStageCost(cost) if clocked(cost) else StageCost(cost)
