"""schedlab's ``vllm`` preset on a vLLM differential case: ``vllm`` scheduler and ``paged`` cache."""

from __future__ import annotations

from schedlab.diffcheck import schedlab_side
from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Sides

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


def requests(case: Case):
    """schedlab requests with one block hash per KV block (``hash_block_tokens = block_size``)."""
    return schedlab_side.requests(case, case.settings.block_size)


class SchedlabRunner(schedlab_side.SchedlabRunner):
    def tables(self, case, sides=None):
        return tables(case, sides)

    def hash_block_tokens(self, case):
        return case.settings.block_size

    def stages(self, case):
        return case.settings.pipeline_parallel

    def outcome(self, row, chunks):
        w = schedlab_side.whole_ms
        return Outcome(w(row["first_scheduled_ms"]), w(row["first_token_ms"]), w(row["finish_ms"]),
                       int(row["preemptions"]), int(row["cached_tokens"]))
