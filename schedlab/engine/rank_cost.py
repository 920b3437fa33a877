"""What an instance sees of its cost model when something else times its iterations.

The ranks of a data-parallel MoE deployment step together (:mod:`schedlab.engine.lockstep`,
:mod:`schedlab.engine.reference_lockstep`): a step lasts as long as the slowest rank's own part
plus the routed experts of every rank's tokens, so no rank can time its iteration alone. A
pipelined instance (:mod:`schedlab.engine.pipeline`, :mod:`schedlab.engine.reference_pipeline`)
executes a batch when it lands, over the time since the previous landing. Each such engine
instance gets a :class:`RankCost` in place of its cost model; the cluster (or the pipeline)
sets the time here before the instance executes. Both engines use it; it holds values, no logic.
"""

from __future__ import annotations

from ..errors import SimulationError
from ..protocols import Batch

#: A rank with nothing scheduled runs a dummy batch so that the others' collectives complete
#: (vLLM ``execute_dummy_batch``: one token, attention skipped).
DUMMY = Batch(num_decode=1, decode_context_tokens=1)


class RankCost:
    """The step time the cluster set, for the rank's next iteration (or run of them)."""

    __slots__ = ("inner", "needs_context_range", "step_ms", "run", "tokens")

    def __init__(self, inner):
        self.inner = inner  # the rank's own cost model (rank_ms, decode_step_increment, experts_ms)
        self.needs_context_range = bool(getattr(inner, "needs_context_range", False))
        self.step_ms = 0.0
        self.run = None     # (increment, steps) of a run of decode steps, or None: one step
        self.tokens = -1    # the tokens of the batch the step was timed for

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
