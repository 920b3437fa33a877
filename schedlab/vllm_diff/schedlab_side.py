"""schedlab's ``vllm`` preset on a vLLM differential case: ``vllm`` scheduler and ``paged`` cache.

A case with a window (``window_tokens``, ``window_groups``) gets the ``paged`` cache schedlab builds
for such a model, :class:`~schedlab_plugins.kv_caches.paged.PagedKVCache` (or its prefix-caching
subclass) with a :class:`~schedlab.kv_window.SlidingWindow`: the ``[kv_cache]`` table sizes a window
only from a model preset, so the harness builds the cache itself. With ``record_steps`` the runner
also writes down the pool after each iteration's plan (:class:`KvSteps`), to compare with vLLM's
block pool step for step (:mod:`.kv_steps`).
"""

from __future__ import annotations

from schedlab.diffcheck import schedlab_side
from schedlab.diffcheck.case import Case, Sides
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
                 "chunked_prefill": True, "async_scheduling": asynchronous, "max_model_len": s.max_model_len}
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


def retention_of(prefix_retention: str) -> int | None:
    """The prefix cache's ``retention`` for the harness's ``--prefix-retention`` (vLLM's
    ``prefix_cache_retention_interval``): ``default`` 0, ``dense`` None, or a number of tokens."""
    if prefix_retention == "default":
        return 0
    return None if prefix_retention == "dense" else int(prefix_retention)


def kv_cache(case: Case, prefix_retention: str = "default"):
    """The windowed KV cache of ``case`` (its settings' ``window`` must be set)."""
    from schedlab_plugins.kv_caches.paged import PagedKVCache
    from schedlab_plugins.kv_caches.prefix import PrefixKVCache

    s = case.settings
    if s.prefix_caching:
        kv = PrefixKVCache(s.num_blocks, s.block_size, window=s.window, retention=retention_of(prefix_retention))
    else:
        kv = PagedKVCache(s.num_blocks, s.block_size, window=s.window)
    kv.sizing = None  # (as build_paged leaves a cache not sized from presets)
    return kv


class KvSteps:
    """Wraps a scheduler and writes down, after each plan that schedules tokens, the plan's time,
    the blocks in use and the window blocks each request holds (``{id: blocks}``, holders only):
    what vLLM's pool holds after ``schedule()`` (:mod:`.kv_steps`). Everything else is the wrapped
    scheduler's."""

    def __init__(self, scheduler):
        self._scheduler = scheduler
        self.steps: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self._scheduler, name)

    def schedule(self, plan):
        returned = self._scheduler.schedule(plan)
        if plan.num_scheduled_tokens:
            kv = plan.kv
            held = getattr(kv, "window_blocks", None)
            seqs = list(plan.running) + [s for s in plan.admitted if s not in plan.running]
            window = {s.request.id: held(s) for s in seqs} if held is not None else {}
            self.steps.append((plan.now, kv.num_used_blocks(), {rid: n for rid, n in sorted(window.items()) if n}))
        return returned


class SchedlabRunner(schedlab_side.SchedlabRunner):
    #: wrap the scheduler in :class:`KvSteps` (its steps in :attr:`steps` after a run)
    record_steps = False
    #: which window blocks the prefix cache keeps, as the vLLM side's ``--prefix-retention``
    retention = "default"

    def __init__(self, engine: str = "fast"):
        super().__init__(engine)
        self._log: KvSteps | None = None

    def tables(self, case, sides=None):
        return tables(case, sides)

    def build(self, case, sides=None):
        scheduler, cost, kv = super().build(case, sides)
        if case.settings.window is not None:
            kv = kv_cache(case, self.retention)
        if self.record_steps:
            scheduler = self._log = KvSteps(scheduler)
        return scheduler, cost, kv

    @property
    def steps(self) -> list[tuple]:
        """What :class:`KvSteps` wrote down in the last run (with ``record_steps``)."""
        return self._log.steps if self._log is not None else []

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
