"""The KV of sliding-window layers, as vLLM's hybrid KV cache manager keeps it.

A model whose layers mix full attention with sliding-window (or chunked, or linear) attention
-- gpt-oss, Gemma 2 and 3, Llama 4, Qwen3-Next -- keeps every token's K and V only in its
full-attention layers; a window layer needs only the last ``W`` tokens. vLLM 0.33
(``kv_cache_planning._get_kv_cache_groups_uniform_page_size``) splits the layers into *KV cache
groups* of equal size (the smaller layer count, or the larger when they are within 1.5x), one
pool of blocks serving every group: a block is one page of each layer of a group. A sequence
takes one block per ``B`` tokens in the full-attention group, and in each window group one per
``B`` tokens it still attends to: before each step's allocation, vLLM frees the window blocks
that lie wholly before the next token's window (``SlidingWindowManager.get_num_skipped_tokens``:
``processed - W + 1`` tokens; ``remove_skipped_blocks``), then allocates up to the step's end.

So after a step that started with ``start`` processed tokens and ends at ``end``, each window
group holds ``ceil(end / B) - (start - W + 1) // B`` blocks (``ceil(end / B)`` before the window
slides): a long prompt prefilled in one step holds all its blocks for that step, then keeps
about ``W / B + 1``.

:func:`model_window` gives a model's window (None when no layer slides, or when every layer
does -- a single group, counted whole here); the KV caches of :mod:`schedlab_plugins.kv_caches`
take it and hand out the blocks, and the engines ask :func:`sequence_blocks` how many blocks a
request needs at least.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class SlidingWindow:
    """The window layers' share of a block pool: ``groups`` KV cache groups (each as many layers
    as a block holds) keeping the last ``tokens`` tokens of a sequence, in blocks of
    ``block_size`` tokens."""

    groups: int = attrs.field(validator=attrs.validators.ge(1))
    tokens: int = attrs.field(validator=attrs.validators.ge(1))
    block_size: int = attrs.field(validator=attrs.validators.ge(1))

    def held(self, start: int, end: int) -> int:
        """Blocks the window groups hold after a step that started with ``start`` processed
        tokens and has slots up to ``end`` tokens."""
        bs = self.block_size
        skipped = (start - self.tokens + 1) // bs if start >= self.tokens else 0
        blocks = -(-end // bs) - skipped
        return self.groups * blocks if blocks > 0 else 0

    def prefill_peak(self, prompt: int, chunk: int, start: int = 0) -> int:
        """The most blocks the window groups hold while a prompt of ``prompt`` tokens is computed
        from token ``start`` (a prefix-cache hit) in chunks of at most ``chunk`` tokens (all of it
        in one step when ``chunk >= prompt``). Once the window slides, a full chunk's count repeats
        with the chunk start's offset in its block, so the first ``ceil(W / chunk) + B`` chunks and
        the last one are enough to look at."""
        chunk = max(1, min(chunk, prompt - start))
        starts = range(start, prompt, chunk)
        look = -(-self.tokens // chunk) + self.block_size + 1
        if len(starts) > look + 1:
            starts = list(starts[:look]) + [starts[-1]]
        return max(self.held(c, min(c + chunk, prompt)) for c in starts)

    def admission_cap(self, in_flight_tokens: int, max_model_len: int) -> int:
        """The window blocks vLLM budgets for one request when it sizes the pool at start-up and
        auto-fits ``max_model_len`` (``SlidingWindowSpec.max_admission_blocks_per_request``): the
        window plus the tokens in flight (``max_num_batched_tokens`` per concurrent batch), freed
        only once processed, and one block because the window rarely starts on a boundary."""
        tokens = min(self.tokens - 1 + in_flight_tokens, max_model_len)
        return self.groups * (-(-tokens // self.block_size) + 1)

    def fewest(self, tokens: int) -> int:
        """The fewest blocks the window groups hold at once for a sequence of ``tokens`` tokens
        computed one at a time: all of them while it is shorter than the window, else at most
        ``ceil((W - 1) / B) + 1`` (the window rarely starts on a block boundary)."""
        bs = self.block_size
        return self.groups * min(-(-tokens // bs), -(-(self.tokens - 1) // bs) + 1)


def kv_groups(num_layers: int, window_layers: int) -> tuple[int, int, int]:
    """vLLM's KV cache groups for ``window_layers`` window layers among ``num_layers``:
    ``(layers per group, full-attention groups, window groups)``.

    The group size is the smaller layer count, or the larger when the two are within 1.5x
    (padding the smaller kind). schedlab keeps one full-attention group: a model with more
    full-attention layers than that (Mllama's 8 cross-attention layers beside 32) gets one group
    of them and one window group of that size (:func:`model_window` shrinks its window to keep
    the window layers' bytes)."""
    full = num_layers - window_layers
    if not window_layers or not full:
        return num_layers, 1, 0
    size = min(full, window_layers)
    if max(full, window_layers) < 1.5 * size:
        size = max(full, window_layers)
    if full > size:
        size = full
    return size, 1, -(-window_layers // size)


def model_window(model, block_size: int, tensor_parallel: int = 1) -> SlidingWindow | None:
    """The window of ``model`` (a :class:`~schedlab.capacity.ModelSpec`) in blocks of
    ``block_size`` on each of ``tensor_parallel`` ranks, or None when it has no window layers or
    only window layers. A recurrent state's tokens depend on the ranks and the KV dtype
    (``ModelSpec.window_tokens``); a window's do not."""
    layers = model.sliding_window_layers
    if not layers or layers >= model.num_layers or model.sliding_window is None:
        return None
    size, _, groups = kv_groups(model.num_layers, layers)
    tokens = model.window_tokens(tensor_parallel)
    full = model.num_layers - layers
    if layers < full and full >= 1.5 * layers:  # folded into one group of the full layers' size (kv_groups)
        tokens = max(1, -(-tokens * layers // size))
    return SlidingWindow(groups, tokens, block_size)


def sequence_blocks(kv, tokens: int, prompt: int = 0, chunk: int = 0, *, reserve: bool = False) -> int:
    """The fewest blocks of ``kv`` one sequence of ``tokens`` tokens holds at once: one per
    block of tokens, plus its window layers' (a cache's optional ``window``) -- and, given its
    ``prompt`` and the largest prefill ``chunk``, at least what they hold while it is prefilled
    (on top of blocks for every token when it ``reserve``-s them from the start)."""
    bs = kv.block_size
    blocks = -(-tokens // bs)
    window = getattr(kv, "window", None)
    if window is None:
        return blocks
    need = blocks + window.fewest(tokens)
    if prompt and chunk:
        peak = window.prefill_peak(prompt, chunk)
        need = max(need, (blocks if reserve else -(-prompt // bs)) + peak)
    return need


def start_up_blocks(kv, max_model_len: int, in_flight_tokens: int = 0) -> int:
    """The blocks vLLM requires of the pool for one sequence of ``max_model_len`` tokens before
    it starts (``check_enough_kv_cache_memory``; with a window, its admission cap)."""
    blocks = -(-max_model_len // kv.block_size)
    window = getattr(kv, "window", None)
    return blocks + window.admission_cap(in_flight_tokens, max_model_len) if window is not None else blocks


def tokens_fitting(kv, blocks: int, in_flight_tokens: int | None = None) -> int:
    """The longest sequence whose blocks fit in ``blocks`` blocks of ``kv``: by
    :func:`sequence_blocks`, or with ``in_flight_tokens`` by vLLM's start-up budget
    (:func:`start_up_blocks`, what its auto-fit ``max_model_len`` finds)."""
    bs = kv.block_size
    if getattr(kv, "window", None) is None:
        return blocks * bs

    def fits(tokens: int) -> bool:
        need = sequence_blocks(kv, tokens) if in_flight_tokens is None else start_up_blocks(kv, tokens, in_flight_tokens)
        return need <= blocks

    lo, hi = 0, blocks * bs
    if fits(hi):
        return hi
    while hi - lo > 1:  # both counts are non-decreasing in tokens
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
