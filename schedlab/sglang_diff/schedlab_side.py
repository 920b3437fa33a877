"""schedlab's ``sglang`` preset on an SGLang differential case: the ``sglang`` scheduler over a
``radix`` cache of blocks of the case's page size (SGLang's default: one token), or with
``disable_radix_cache`` (``--disable-radix-cache``) a ``paged`` cache of as many blocks without
prefix caching."""

from __future__ import annotations

from schedlab.diffcheck import schedlab_side
from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Sides

from .case import Outcome


def tables(case: Case, sides: Sides | None = None) -> dict[str, dict]:
    """The scheduler, cost model and KV cache tables of ``case`` (``sides`` adds schedlab-only
    scheduler keys, which win over the shared settings)."""
    s = case.settings
    scheduler = {"kind": "sglang", "max_running_requests": s.max_running_requests,
                 "max_prefill_tokens": s.max_prefill_tokens, "chunked_prefill_size": s.chunked_prefill_size,
                 "schedule_policy": s.schedule_policy, "schedule_conservativeness": s.schedule_conservativeness,
                 "enable_mixed_chunk": s.enable_mixed_chunk, "overlap_schedule": s.overlap_schedule,
                 "context_length": MAX_MODEL_LEN, "enable_priority_scheduling": s.enable_priority_scheduling,
                 "schedule_low_priority_values_first": s.schedule_low_priority_values_first,
                 "priority_scheduling_preemption_threshold": s.priority_scheduling_preemption_threshold,
                 "disable_priority_preemption": s.disable_priority_preemption,
                 "retraction_policy": s.retraction_policy, "max_queued_requests": s.max_queued_requests,
                 "waiting_timeout_ms": float(s.waiting_timeout_ms), "running_timeout_ms": float(s.running_timeout_ms)}
    if sides is not None:
        scheduler.update(sides.schedlab_scheduler)
    page = s.page_size
    kv = {"kind": "radix", "num_blocks": s.max_total_tokens // page, "block_size": page}
    if s.disable_radix_cache:
        kv = {"kind": "paged", "num_blocks": s.max_total_tokens // page, "block_size": page, "prefix_caching": False}
    return {"scheduler": scheduler, "cost_model": dict(schedlab_side.ONE_MS_PER_ITERATION), "kv_cache": kv}


class SchedlabRunner(schedlab_side.SchedlabRunner):
    def tables(self, case, sides=None):
        return tables(case, sides)

    def hash_block_tokens(self, case):
        return 1

    def outcome(self, row, chunks):
        w = schedlab_side.whole_ms
        return Outcome(w(row["first_scheduled_ms"]), w(row["first_token_ms"]), w(row["finish_ms"]),
                       int(row["preemptions"]), int(row["cached_tokens"]), chunks)
