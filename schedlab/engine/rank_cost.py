"""What an instance sees of its cost model when something else times its iterations.

The ranks of a data-parallel MoE deployment step together (:mod:`schedlab.engine.lockstep`,
:mod:`schedlab.engine.reference_lockstep`): a step lasts as long as the slowest rank's own part
plus the routed experts of every rank's tokens, so no rank can time its iteration alone. A
pipelined instance (:mod:`schedlab.engine.pipeline`, :mod:`schedlab.engine.reference_pipeline`)
executes a batch when it lands, over the time since the previous landing. Each such engine
instance gets a :class:`RankCost` in place of its cost model; the cluster (or the pipeline)
sets the time here before the instance executes. Both engines use it.

**Energy of a lockstep rank.** A power model is built against the :class:`RankCost` (the object
the instance sees), so it asks it what a step did on the rank's GPUs: :meth:`RankCost.work`
and :meth:`RankCost.kernel_ms` of the batch the meter is handed. In a step each GPU runs its
rank's own part -- its batch, or the dummy batch when it has nothing to compute -- and its share
of the routed experts of *all* ranks' tokens, so the cluster also sets the step's per-rank
tokens (what the experts were timed for) and whether this rank ran the dummy. The meter of a
rank running the dummy is handed :data:`NOTHING` (no request's token): its work is the dummy's
and the experts'. Over a bulk decode run nothing of the experts changes (the tokens do not),
and the rank's own work grows with its contexts, so the power models' closed forms hold.

**At an SM clock** (``[clock]``, :mod:`schedlab.energy.clock`): the cluster clocks each step
(the cost model's ``lockstep_at``: one clock for every rank) and sets it here; a rank's view is
then a :class:`ClockedRankCost`, which tells its power model the step's clock and times the
rank's kernels at it.

A pipelined instance's view (:mod:`.stage_cost`) extends :class:`RankCost` to say what a batch
did on one stage's GPUs.
"""

from __future__ import annotations

from ..energy.work import joined
from ..errors import SimulationError
from ..protocols import Batch

#: A rank with nothing scheduled runs a dummy batch so that the others' collectives complete
#: (vLLM ``execute_dummy_batch``: one token, attention skipped).
DUMMY = Batch(num_decode=1, decode_context_tokens=1)
#: What the requests of a rank running the dummy batch compute: nothing (the batch its meter
#: and its timeline rows are handed; :meth:`RankCost.work` says the dummy's work for it).
NOTHING = Batch()


class RankCost:
    """The step time the cluster set, for the rank's next iteration (or run of them), and what the
    step did on the rank's GPUs (for power models).

    :ivar step_ms: the rank's iteration time (the step without its own swaps);
    :ivar run: ``(increment, steps)`` of a run of decode steps, or None: one step;
    :ivar tokens: the tokens of the batch the step was timed for;
    :ivar step_tokens: every rank's tokens in the step (a dummy counts 1): what its experts
        were timed for;
    :ivar experts_ms: the step's routed experts (dispatch, the busiest GPU, combine);
    :ivar dummy: this rank runs the dummy batch in the step (set while its meter is handed it);
    :ivar ratio: the step's SM clock as a share of the highest (1.0 without ``[clock]``).
    """

    __slots__ = ("inner", "needs_context_range", "step_ms", "run", "tokens", "step_tokens", "experts_ms", "dummy",
                 "ratio")

    def __init__(self, inner):
        self.inner = inner  # the rank's own cost model (rank_ms, decode_step_increment, experts_ms)
        self.needs_context_range = bool(getattr(inner, "needs_context_range", False))
        self.step_ms = 0.0
        self.run = None
        self.tokens = -1
        self.step_tokens: tuple = ()
        self.experts_ms = 0.0
        self.dummy = False
        self.ratio = 1.0

    def iteration_ms(self, batch: Batch) -> float:
        if batch.num_batched_tokens != self.tokens:
            raise SimulationError(f"a data-parallel rank executes {batch} but its step was timed for "
                                  f"{self.tokens} tokens")
        return self.step_ms

    def decode_step_increment(self, batch: Batch):
        return self.run

    @property
    def config(self):
        return getattr(self.inner, "config", None)

    # --- what power models ask (schedlab.energy) --------------------------------------------------

    def work(self, batch: Batch) -> tuple[float, float]:
        """``(bytes, flops)`` one GPU of the rank reads and computes in the step: its own part
        of ``batch`` (of the dummy batch while it runs one) and its share of the experts of every
        rank's tokens (the cost model's ``rank_work`` and ``experts_work``). A rank that only
        swaps blocks computes nothing in that part of its step."""
        own = self._own(batch)
        if own is None:
            return 0.0, 0.0
        return joined(self.inner.rank_work(own), self.inner.experts_work(self.step_tokens))

    def kernel_ms(self, batch: Batch) -> float:
        """The GPU's kernels in the step: the rank's own part without the host's share (the
        cost model's ``rank_kernel_ms``; all of ``rank_ms`` when it has none) and the experts.
        The rest of the step -- the host's work, waiting for a slower rank -- the GPU is awake
        with no kernel of its own running."""
        own = self._own(batch)
        if own is None:
            return 0.0
        kernels = getattr(self.inner, "rank_kernel_ms", None) or self.inner.rank_ms
        return kernels(own) + self.experts_ms

    def _own(self, batch: Batch) -> Batch | None:
        """The batch the rank's GPUs run for ``batch``: itself, the dummy batch while the rank
        runs one, or None (a part of a step in which the rank only swaps blocks)."""
        if batch.num_batched_tokens:
            return batch
        return DUMMY if self.dummy else None


class ClockView:
    """What power models read of a clock in a view whose cost model is clocked (a
    :class:`~schedlab.energy.clock.ClockedCostModel`): ``clock_ratio``, ``r_min``, ``fixed``, and
    ``config`` (the clock's settings). The clock is the one the cluster or the pipeline chose
    and set (``ratio``), not one the batch alone would get."""

    __slots__ = ()

    def clock_ratio(self, batch: Batch) -> float:
        return self.ratio

    @property
    def r_min(self) -> float:
        return self.inner.r_min

    @property
    def fixed(self) -> float | None:
        return self.inner.fixed


class ClockedRankCost(ClockView, RankCost):
    """A lockstep rank's view when its cost model is clocked: power models find the clock here
    (:class:`ClockView`) and read the step's clock, which the cluster chose for all ranks."""

    __slots__ = ()

    def kernel_ms(self, batch: Batch) -> float:
        """:meth:`RankCost.kernel_ms` at the step's clock: the own part's kernels stretched by
        the law as the step's part was (the experts' time the cluster set is clocked already)."""
        own = self._own(batch)
        if own is None:
            return 0.0
        inner = self.inner
        kernels = inner.rank_kernel_ms or inner.rank_ms
        k = kernels(own)
        if self.ratio < 1.0:
            k += inner.stretch_all(inner.rank_splits(own), self.ratio)
        return k + self.experts_ms


def clocked(cost) -> bool:
    """True for a cost model at an SM clock (a :class:`~schedlab.energy.clock.ClockedCostModel`)."""
    return callable(getattr(cost, "lockstep_at", None))


def rank_view(cost) -> RankCost:
    """What a lockstep rank sees of ``cost``: a :class:`ClockedRankCost` for a clocked cost
    model, else a :class:`RankCost` (a pipelined instance's: :func:`.stage_cost.stage_view`)."""
    return ClockedRankCost(cost) if clocked(cost) else RankCost(cost)
