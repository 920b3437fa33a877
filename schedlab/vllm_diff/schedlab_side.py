"""schedlab's ``vllm`` preset on a vLLM differential case: ``vllm`` scheduler and ``paged`` cache."""

from __future__ import annotations

from schedlab.diffcheck import schedlab_side
from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Sides
from schedlab.speculative import Speculation, SpeculativeConfig

from .case import Outcome


def tables(case: Case, sides: Sides | None = None) -> dict[str, dict]:
    """The scheduler, cost model and KV cache tables of ``case`` (``sides`` adds schedlab-only
    scheduler keys, which win over the shared settings). The preset plans ahead as the vLLM
    side does: synchronously unless ``--vllm-set async_scheduling=true``."""
    s = case.settings
    asynchronous = bool(sides is not None and dict(sides.engine).get("async_scheduling"))
    scheduler = {"kind": "vllm", "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
                 "long_prefill_token_threshold": s.long_prefill_token_threshold, "policy": s.policy,
                 "chunked_prefill": True, "async_scheduling": asynchronous, "max_model_len": MAX_MODEL_LEN}
    if sides is not None:
        scheduler.update(sides.schedlab_scheduler)
    kv = {"kind": "paged", "num_blocks": s.num_blocks, "block_size": s.block_size, "prefix_caching": s.prefix_caching}
    return {"scheduler": scheduler, "cost_model": dict(schedlab_side.ONE_MS_PER_ITERATION), "kv_cache": kv}


#: the seed of the acceptance draws on both sides (:meth:`Speculation.accepted`)
SPEC_SEED = 0


def speculation(case: Case) -> Speculation | None:
    """``[speculative]`` as the case sets it, drafts costing nothing (the step lasts 1 ms)."""
    s = case.settings
    if not s.num_speculative_tokens:
        return None
    free = None if s.spec_method == "ngram" else {"kind": "linear", "base_ms": 0.0}
    config = SpeculativeConfig(method=s.spec_method, num_speculative_tokens=s.num_speculative_tokens,
                               acceptance_rate=s.acceptance_rate, draft=free, k_by_batch_size=s.k_by_batch_size)
    return Speculation(config, SPEC_SEED)


def hash_block_tokens(case: Case) -> int:
    """Prompt tokens per block hash: one hash per KV block, or per token with an EAGLE drafter
    and prefix caching, whose blocks are identified with the token after them."""
    s = case.settings
    return 1 if s.num_speculative_tokens and s.spec_method == "eagle" and s.prefix_caching else s.block_size


def requests(case: Case):
    """schedlab requests with their block hashes (:func:`hash_block_tokens`)."""
    return schedlab_side.requests(case, hash_block_tokens(case))


class SchedlabRunner(schedlab_side.SchedlabRunner):
    def tables(self, case, sides=None):
        return tables(case, sides)

    def hash_block_tokens(self, case):
        return hash_block_tokens(case)

    def stages(self, case):
        return case.settings.pipeline_parallel

    def speculation(self, case):
        return speculation(case)

    def outcome(self, row, chunks):
        w = schedlab_side.whole_ms
        return Outcome(w(row["first_scheduled_ms"]), w(row["first_token_ms"]), w(row["finish_ms"]),
                       int(row["preemptions"]), int(row["cached_tokens"]))
