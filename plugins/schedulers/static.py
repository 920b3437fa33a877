"""Static batching (FasterTransformer style, engines.md §6).

When nothing is running, admit up to ``batch_size`` waiting requests in arrival order and
prefill them together; then decode until every one of them has finished. A finished
request's slot stays empty until the whole batch is done -- the waste continuous batching
removes. KV for ``prompt + max_tokens`` is reserved at admission, as a static engine sizes
its buffers for the longest possible request, so there is never a preemption.

With a batching window (``max_wait_ms``, see :mod:`.window`) an idle server waits for a full
batch, or for the window to expire, before it starts one (dynamic batching, seed 004).
"""

from __future__ import annotations

import attrs

from schedlab.configs import int_field
from schedlab.kv_window import sequence_blocks

from .window import (BatchingWindow, check_window_settings, interactive_class_field, interactive_wait_ms_field,
                     max_wait_ms_field, min_batch_field)


@attrs.frozen
class StaticConfig:
    batch_size: int = int_field(16, min=1, help="requests per batch")
    max_wait_ms: float = max_wait_ms_field()
    min_batch: int = min_batch_field()
    interactive_class: str = interactive_class_field()
    interactive_wait_ms: float = interactive_wait_ms_field()

    def __attrs_post_init__(self):
        check_window_settings(self)


class StaticScheduler:
    """Run a batch to completion before starting the next."""

    stable_between_events = True

    def __init__(self, config: StaticConfig | None = None):
        self.config = config or StaticConfig()
        self.slots = self.config.batch_size
        self._window = BatchingWindow.from_config(self.config)

    def rejection_reason(self, request, kv) -> str | None:
        # (with window layers, the prompt's blocks in them too: prefilled in one step, and reserved)
        need = sequence_blocks(kv, request.prompt_tokens + request.max_output_tokens, request.prompt_tokens,
                               request.prompt_tokens, reserve=True)
        if need > kv.num_blocks:
            return (f"needs {need} KV blocks (prompt {request.prompt_tokens} + max_tokens "
                    f"{request.max_output_tokens}) but the cache has {kv.num_blocks}")
        return None

    def kv_reservation(self, request) -> int:
        """KV tokens held from admission: ``prompt + max_tokens``, as ``admit(reserve=True)`` takes."""
        return request.prompt_tokens + request.max_output_tokens

    def schedule(self, plan) -> None:
        if plan.running:
            plan.decode_all()  # reserved blocks: decodes always fit
            return
        if self._window is not None and self._window.hold(plan, self.config.batch_size):
            return
        while len(plan.running) < self.config.batch_size:
            seq = plan.waiting.peek()
            if seq is None:
                return
            n = seq.num_tokens - plan.cached_tokens(seq)
            if not plan.admit(seq, n, reserve=True):
                return
