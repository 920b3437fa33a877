"""vLLM's side of a differential case: the settings both engines get and what is compared.

The case itself, its requests and the reproducer text are shared with the SGLang harness
(:mod:`schedlab.diffcheck.case`).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedlab.configs import bool_field, float_field, int_field, str_field
from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Engine, blocks_for
from schedlab.diffcheck.shrink import smaller
from schedlab.kv_window import SlidingWindow


@attrs.frozen
class DiffSettings:
    """The settings both engines get (vLLM ``SchedulerConfig``/``CacheConfig`` and schedlab's
    ``vllm`` scheduler and ``paged`` KV cache).

    ``num_blocks`` is the number of *usable* blocks: vLLM 0.33's ``BlockPool.__init__`` takes
    one block of its pool as the ``null_block`` (``vllm/v1/core/block_pool.py``), so vLLM is
    given ``num_blocks + 1``.
    """

    block_size: int = int_field(16, min=1)
    num_blocks: int = int_field(1024, min=1)
    max_num_seqs: int = int_field(8, min=1)
    max_num_batched_tokens: int = int_field(64, min=1)
    long_prefill_token_threshold: int = int_field(0, min=0, max=MAX_MODEL_LEN)
    prefix_caching: bool = bool_field(False)
    policy: str = str_field("fcfs", choices=("fcfs", "priority"))
    pipeline_parallel: int = int_field(1, min=1, max=4)  # vLLM's batch queue of that many batches in flight
    #: speculative decoding (0: off): drafts per decode, who drafts, and the rate schedlab's
    #: acceptance draws use on both sides (:class:`schedlab.speculative.Speculation`, seed 0)
    num_speculative_tokens: int = int_field(0, min=0, max=8)
    spec_method: str = str_field("ngram", choices=("ngram", "draft_model", "eagle"))
    acceptance_rate: float = float_field(0.7, min=0.0, max=1.0)
    #: drafts per batch size (0: off): batches of ``dynamic_from`` requests or more draft
    #: ``dynamic_k`` (vLLM ``num_speculative_tokens_per_batch_size``, schedlab ``k_by_batch_size``)
    dynamic_from: int = int_field(0, min=0)
    dynamic_k: int = int_field(0, min=0)
    #: a model whose sliding-window layers keep only their last ``window_tokens`` tokens, in
    #: ``window_groups`` KV cache groups of their own beside the full-attention one, all sharing the
    #: pool (vLLM's hybrid KV cache manager, SlidingWindowSpec; schedlab's
    #: :class:`~schedlab.kv_window.SlidingWindow`); 0 and 0: no window
    window_tokens: int = int_field(0, min=0, max=MAX_MODEL_LEN)
    window_groups: int = int_field(0, min=0, max=4)
    #: the longest sequence served (vLLM ``max_model_len``): speculation's drafts and KV slots stay
    #: within it (group ``spec_limit``; the others serve requests far below it)
    max_model_len: int = int_field(MAX_MODEL_LEN, min=2, max=MAX_MODEL_LEN)

    @property
    def window(self) -> SlidingWindow | None:
        """The window layers' share of the pool (None: every layer keeps every token)."""
        if not self.window_groups or not self.window_tokens:
            return None
        return SlidingWindow(self.window_groups, self.window_tokens, self.block_size)

    @property
    def in_flight_tokens(self) -> int:
        """vLLM's ``max_in_flight_tokens`` at most: a budget per concurrent batch -- one per stage and
        one planned ahead (``VllmConfig.max_concurrent_batches`` with asynchronous scheduling, which
        a run may turn on on one side: ``--vllm-set async_scheduling=true``)."""
        return self.max_num_batched_tokens * (self.pipeline_parallel + 1)

    def request_blocks(self, r) -> int:
        """The most blocks request ``r`` holds alone: one per ``block_size`` of its last computed
        token (``prompt + max_tokens - 1``, with speculation plus the slots of a last step's drafts
        and lookahead) and, with a window, what its window groups hold at most -- all their blocks,
        or vLLM's per-request cap (``SlidingWindowSpec.max_admission_blocks_per_request``: the
        window and the tokens in flight, :attr:`in_flight_tokens`, plus a block;
        ``remove_skipped_blocks`` keeps a request's window below it), whichever is fewer. (Planning
        ahead, vLLM frees a window's blocks only once their tokens are processed: a request that
        does not fit alone so is preempted by its own next chunk, for ever.)"""
        tokens = min(r.prompt_tokens + r.limit - 1 + self.spec_slack, self.max_model_len)
        need = blocks_for(tokens, self.block_size)
        window = self.window
        if window is not None:
            most = window.admission_cap(self.in_flight_tokens, MAX_MODEL_LEN) // window.groups
            need += window.groups * min(blocks_for(tokens, self.block_size), most)
        return need

    @property
    def k_by_batch_size(self) -> tuple:
        """``[[first, last, k], ...]`` of the drafts per batch size (empty: off)."""
        if not self.dynamic_from:
            return ()
        return ((1, self.dynamic_from - 1, self.num_speculative_tokens),
                (self.dynamic_from, self.dynamic_from, self.dynamic_k))

    @property
    def spec_slack(self) -> int:
        """KV slots a last step's drafts and the drafter's lookahead may take past the output
        (schedlab's ``Speculation.slack``)."""
        k = self.num_speculative_tokens
        return k + (0 if self.spec_method == "ngram" else k)

    def problems(self, requests) -> list[str]:
        """Each request must fit the cache alone (``prompt + max_tokens - 1`` tokens: the last
        sampled token is never computed; vLLM makes sure its longest request does at start-up;
        with speculation plus the slots of a last step's drafts and lookahead),
        or schedlab rejects it and vLLM 0.33 would preempt it forever; the budget must cover
        ``max_num_seqs`` (both engines refuse otherwise)."""
        out = []
        if self.max_num_batched_tokens < self.max_num_seqs:
            out.append("max_num_batched_tokens < max_num_seqs")
        lookahead = self.spec_slack - self.num_speculative_tokens
        if self.num_speculative_tokens and self.max_num_batched_tokens <= lookahead:
            out.append("max_num_batched_tokens <= the drafter's lookahead slots (vLLM refuses)")
        if self.long_prefill_token_threshold > self.max_model_len:
            out.append("long_prefill_token_threshold > max_model_len (vLLM refuses)")
        if 0 < self.long_prefill_token_threshold <= self.num_speculative_tokens:
            # vLLM 0.33 pads a resumed request's decode to 1 + k tokens, then cuts it to the
            # threshold and fails its own assertion (Scheduler.schedule: pad_spec_decode)
            out.append("long_prefill_token_threshold <= num_speculative_tokens (vLLM 0.33 asserts)")
        if self.dynamic_from and not (self.num_speculative_tokens and self.dynamic_from >= 2
                                      and self.dynamic_k <= self.num_speculative_tokens):
            out.append("drafts per batch size need speculation, dynamic_from >= 2 and dynamic_k <= k")
        if bool(self.window_tokens) != bool(self.window_groups):
            out.append("a window needs both window_tokens and window_groups")
        for r in requests:
            if r.prompt_tokens + r.limit > self.max_model_len:
                out.append(f"request {r.id}: prompt + max_tokens exceeds max_model_len {self.max_model_len}")
            # (with speculation: as schedlab's admission counts a last step's drafts and lookahead)
            need = self.request_blocks(r)
            if need > self.num_blocks:
                out.append(f"request {r.id} needs {need} blocks alone, the cache has {self.num_blocks}")
        return out

    def simpler(self):
        """Simpler settings for the shrinker: no threshold, no prefix caching, FCFS, no window, then
        fewer sequences, a smaller budget, fewer blocks, fewer window groups and a smaller window (of
        2 tokens at least: vLLM 0.33 caches no block of a 1-token window, see :mod:`.workloads`)."""
        if self.long_prefill_token_threshold:
            yield {"long_prefill_token_threshold": 0}
        if self.prefix_caching:
            yield {"prefix_caching": False}
        if self.policy != "fcfs":
            yield {"policy": "fcfs"}
        if self.dynamic_from:
            yield {"dynamic_from": 0, "dynamic_k": 0}
        if self.max_model_len != MAX_MODEL_LEN:
            yield {"max_model_len": MAX_MODEL_LEN}
        if self.num_speculative_tokens and self.spec_method != "ngram":
            yield {"spec_method": "ngram"}
        if self.window_groups:
            yield {"window_tokens": 0, "window_groups": 0}
        yield from smaller(self, (("max_num_seqs", 1), ("max_num_batched_tokens", 1), ("num_blocks", 1),
                                  ("long_prefill_token_threshold", 1), ("pipeline_parallel", 1),
                                  ("num_speculative_tokens", 1), ("window_groups", 1), ("window_tokens", 2)))


@attrs.frozen
class Outcome:
    """What one engine did with one request (``None``: it never got there)."""

    FIELDS: ClassVar[tuple] = ("first_scheduled_ms", "first_token_ms", "finish_ms", "preemptions", "cached_tokens")
    SHORT: ClassVar[dict] = {"first_scheduled_ms": "scheduled", "first_token_ms": "first_token", "finish_ms": "finish",
                             "preemptions": "preemptions", "cached_tokens": "cached"}

    first_scheduled_ms: int | None
    first_token_ms: int | None
    finish_ms: int | None
    preemptions: int
    cached_tokens: int


ENGINE = Engine(key="vllm", label="vLLM", tool="tools/vllm_diff.py", flag="--vllm-set", outcome=Outcome,
                settings=DiffSettings)


def case_from_json(text: str) -> Case:
    return Case.from_json(text, DiffSettings)
