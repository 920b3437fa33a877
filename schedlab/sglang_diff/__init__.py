"""Differential harness: SGLang's own ``Scheduler`` stepped beside schedlab's ``sglang`` preset.

Every module here follows SGLang 0.5.23 (``pip install 'schedlab[sglang]'``, or the README's
CPU install): ``python/sglang/srt/managers/scheduler.py`` (``get_next_batch_to_run``,
``get_new_batch_prefill``, ``update_running_batch``), ``schedule_policy.py``
(``SchedulePolicy``, ``PrefillAdder``), ``schedule_batch.py`` (``retract_decode``),
``mem_cache/prefill_budget.py`` and ``mem_cache/unified_radix_cache.py``. Nothing but
:mod:`.sglang_side` (and the import stubs of :mod:`.stubs`) imports SGLang, so the workloads and
the schedlab side run (and are tested) without it. Cases, comparison, shrinking and the command
line are shared with the vLLM harness (:mod:`schedlab.diffcheck`).

* :mod:`.case` -- the settings both engines get and the per-request outcome compared;
* :mod:`.workloads` -- random cases per feature group (lpm, dfs_weight, fcfs, eviction,
  chunked, retract, reserve, all, ..., and at pages of 2-16 tokens or without the radix cache:
  paged, paged_retract, paged_chunked, no_radix, overlap_paged);
* :mod:`.schedlab_side` / :mod:`.sglang_side` -- run one case on each engine;
* :mod:`.cli` -- ``python tools/sglang_diff.py``.
"""
