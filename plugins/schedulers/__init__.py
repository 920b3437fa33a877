"""Built-in schedulers: ``static``, ``continuous`` and its engine presets (``vllm``, ``vllm-v0``, ``orca``,
``sarathi``, ``trtllm``), ``tgi`` (text-generation-inference's router), ``vtc`` (token-fair continuous batching) and
``sglang`` (SGLang's prefill-first scheduler with retraction). ``continuous`` also orders by priority, predicted length (``sjf``) or
SGLang's ``lof``, and both ``static`` and ``continuous`` take a batching window (``max_wait_ms``)."""

import schedlab

from .continuous import ContinuousConfig, ContinuousScheduler
from .orders import LengthPredictor
from .presets import register_presets
from .sglang import SglangConfig, SglangScheduler
from .static import StaticConfig, StaticScheduler
from .tgi import TgiConfig, TgiScheduler
from .vtc import VtcConfig, VtcScheduler
from .window import BatchingWindow


@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("static", StaticScheduler, config=StaticConfig,
             help="static batching: run a batch to completion before the next (FasterTransformer)")
    register("continuous", ContinuousScheduler, config=ContinuousConfig,
             help="iteration-level batching with vLLM's admission, budget and preemption rules")
    register_presets(register)
    register("tgi", TgiScheduler, config=TgiConfig,
             help="text-generation-inference: KV reserved at admission, prefill passes gated by waiting_served_ratio "
                  "and max_waiting_tokens, or v3's chunked prefill")
    register("vtc", VtcScheduler, config=VtcConfig,
             help="token-fair continuous batching: admit from the least-served client (VTC, OSDI'24)")
    register("sglang", SglangScheduler, config=SglangConfig,
             help="SGLang: prefill-first, new_token_ratio admission, retraction of the least-advanced request, "
                  "chunked prefill, fcfs / lpm / lof")
