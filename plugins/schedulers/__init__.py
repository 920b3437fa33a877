"""Built-in schedulers: ``static``, ``continuous`` and its engine presets (``vllm``, ``vllm-v0``, ``orca``, ``trtllm``)."""

import schedlab

from .continuous import ContinuousConfig, ContinuousScheduler
from .presets import register_presets
from .static import StaticConfig, StaticScheduler


@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("static", StaticScheduler, config=StaticConfig,
             help="static batching: run a batch to completion before the next (FasterTransformer)")
    register("continuous", ContinuousScheduler, config=ContinuousConfig,
             help="iteration-level batching with vLLM's admission, budget and preemption rules")
    register_presets(register)
