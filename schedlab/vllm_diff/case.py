"""vLLM's side of a differential case: the settings both engines get and what is compared.

The case itself, its requests and the reproducer text are shared with the SGLang harness
(:mod:`schedlab.diffcheck.case`).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedlab.configs import bool_field, int_field, str_field
from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Engine, blocks_for
from schedlab.diffcheck.shrink import smaller


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

    def problems(self, requests) -> list[str]:
        """Each request must fit the cache alone (``prompt + max_tokens - 1`` tokens: the last
        sampled token is never computed; vLLM makes sure its longest request does at start-up),
        or schedlab rejects it and vLLM 0.33 would preempt it forever; the budget must cover
        ``max_num_seqs`` (both engines refuse otherwise)."""
        out = []
        if self.max_num_batched_tokens < self.max_num_seqs:
            out.append("max_num_batched_tokens < max_num_seqs")
        for r in requests:
            need = blocks_for(r.prompt_tokens + r.limit - 1, self.block_size)
            if need > self.num_blocks:
                out.append(f"request {r.id} needs {need} blocks alone, the cache has {self.num_blocks}")
        return out

    def simpler(self):
        """Simpler settings for the shrinker: no threshold, no prefix caching, FCFS, then fewer
        sequences, a smaller budget and fewer blocks."""
        if self.long_prefill_token_threshold:
            yield {"long_prefill_token_threshold": 0}
        if self.prefix_caching:
            yield {"prefix_caching": False}
        if self.policy != "fcfs":
            yield {"policy": "fcfs"}
        yield from smaller(self, (("max_num_seqs", 1), ("max_num_batched_tokens", 1), ("num_blocks", 1),
                                  ("long_prefill_token_threshold", 1), ("pipeline_parallel", 1)))


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
