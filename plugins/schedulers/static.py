"""Static batching (FasterTransformer style, engines.md §6).

When nothing is running, admit up to ``batch_size`` waiting requests in arrival order and
prefill them together; then decode until every one of them has finished. A finished
request's slot stays empty until the whole batch is done -- the waste continuous batching
removes. KV is reserved at admission, so there is never a preemption: ``prompt + max_tokens``
for a request with ``max_tokens``; for one without, the rest of ``max_model_len``
(``default_max_tokens = "auto"``), as a static engine sizes its buffers for the longest request
it may have to serve. ``max_model_len`` is the run's model's context length reduced to what the
KV cache holds (``"auto"`` with ``model_context``, as the ``orca`` and ``trtllm`` presets size
it) unless given; a prompt that leaves no room within it is rejected and a longer ``max_tokens``
cut to the rest. With no model named and no ``max_model_len``, a request without ``max_tokens``
reserves its own true output -- an oracle no engine has, kept for runs that name no model.
Sarathi-Serve's FasterTransformer baseline reserves all of ``max_model_len`` for every request,
even one with ``max_tokens`` (``ceil(max_model_len / block_size)`` blocks):
``reserve_max_model_len = true``.

With a batching window (``max_wait_ms``, see :mod:`.window`) an idle server waits for a full
batch, or for the window to expire, before it starts one (dynamic batching, seed 004).
"""

from __future__ import annotations

import attrs

from schedlab.configs import bool_field, int_field, str_field
from schedlab.kv_window import sequence_blocks

from .continuous import (DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS_HELP, RESERVE_MAX_MODEL_LEN_HELP,
                         check_reservation_settings, cut_to_max_model_len, max_model_len_field, reserved_tokens,
                         reserves_max_model_len, served_max_model_len)
from .presets import reservation_run_defaults
from .window import (BatchingWindow, check_window_settings, interactive_class_field, interactive_wait_ms_field,
                     max_wait_ms_field, min_batch_field)


@attrs.frozen
class StaticConfig:
    batch_size: int = int_field(16, min=1, help="requests per batch")
    max_wait_ms: float = max_wait_ms_field()
    min_batch: int = min_batch_field()
    interactive_class: str = interactive_class_field()
    interactive_wait_ms: float = interactive_wait_ms_field()
    max_model_len: int | str = max_model_len_field()
    model_context: int = int_field(
        0, min=0, help="the model's context length, what max_model_len = \"auto\" is capped at (0 = none; by "
                       "default the run's model's)")
    default_max_tokens: str = str_field("auto", choices=DEFAULT_MAX_TOKENS,
                                        help=DEFAULT_MAX_TOKENS_HELP + " (static: 'auto')")
    reserve_max_model_len: bool = bool_field(False, help=RESERVE_MAX_MODEL_LEN_HELP)

    def __attrs_post_init__(self):
        check_window_settings(self)
        check_reservation_settings(self)

    @staticmethod
    def run_defaults(gpu, model, table: dict, tensor_parallel: int = 1) -> dict:
        """``max_model_len = "auto"`` and ``model_context`` the run's model's context length,
        where ``table`` leaves them out (None: no model named; ``gpu`` plays no part):
        :func:`.presets.reservation_run_defaults`."""
        return reservation_run_defaults(model, table)


class StaticScheduler:
    """Run a batch to completion before starting the next."""

    stable_between_events = True

    def __init__(self, config: StaticConfig | None = None):
        self.config = config or StaticConfig()
        self.slots = self.config.batch_size
        self._window = BatchingWindow.from_config(self.config)
        #: a request without max_tokens reserves the rest of max_model_len (read at the first use)
        self._deduces = reserves_max_model_len(self.config)
        self._longest = None
        if self.config.max_model_len:  # (the protocol's optional member; absent: nothing to cut)
            self.limit_request = self._limit_request

    def max_model_len_for(self, kv) -> int:
        """The longest sequence served with ``kv`` (0: no limit; ``"auto"``: what the cache holds,
        at most ``model_context`` -- with a model's window layers, holding every token of a prompt
        prefilled whole, as static batching prefills it, so a reservation of that length fits)."""
        return served_max_model_len(self.config, kv, kv.num_blocks * kv.block_size)

    def _max_model_len(self, kv=None) -> int:
        """``max_model_len`` as served on ``kv`` (0: none); without ``kv`` the one last read (or,
        before any, ``max_model_len`` itself, ``model_context`` with ``"auto"``)."""
        if kv is not None and self._longest is None:
            self._longest = self.max_model_len_for(kv)
        if self._longest is not None:
            return self._longest
        c = self.config
        return c.model_context if c.max_model_len == "auto" else c.max_model_len

    def _reserved(self, request, kv=None) -> int:
        if self._deduces:
            return reserved_tokens(self.config, request, self._max_model_len(kv))
        return request.prompt_tokens + request.max_output_tokens

    def _limit_request(self, request, kv=None):
        """``request`` as served: ``max_tokens`` cut to ``max_model_len - prompt`` when longer."""
        return cut_to_max_model_len(request, self.config.max_model_len if kv is None else self._max_model_len(kv))

    def rejection_reason(self, request, kv) -> str | None:
        longest = self._max_model_len(kv)
        if longest and request.prompt_tokens >= longest:
            return (f"prompt of {request.prompt_tokens} tokens leaves no room for an output token within "
                    f"max_model_len ({longest})")
        tokens = self._reserved(request, kv)
        # (with window layers, the prompt's blocks in them too: prefilled in one step, and reserved)
        need = sequence_blocks(kv, tokens, request.prompt_tokens, request.prompt_tokens, reserve=True)
        if need > kv.num_blocks:
            return (f"needs {need} KV blocks (prompt {request.prompt_tokens} + max_tokens "
                    f"{tokens - request.prompt_tokens}) but the cache has {kv.num_blocks}")
        return None

    def kv_reservation(self, request, kv=None) -> int:
        """KV tokens held from admission: ``prompt + max_tokens`` (without max_tokens, the rest of
        ``max_model_len`` as served on ``kv`` when there is one), as ``admit(reserve=True)`` takes."""
        return self._reserved(request, kv)

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
            reserve = self._reserved(seq.request, plan.kv) if self._deduces else 0
            if not plan.admit(seq, n, reserve=True, reserve_tokens=reserve):
                return
