"""Differential harness: vLLM's own V1 ``Scheduler`` stepped beside schedlab's ``vllm`` preset.

Every module here follows vLLM 0.33.0 (``pip install 'schedlab[vllm]'``): the scheduler loop
of ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, ``update_from_output``), the
block pool of ``vllm/v1/core/block_pool.py`` and the KV cache manager of
``vllm/v1/core/kv_cache_manager.py``. Nothing but :mod:`.vllm_side` imports vLLM, so the
workloads, the comparison and the shrinker run (and are tested) without it. What does not
depend on vLLM -- cases, token ids, comparison, shrinking, the command line -- is shared with
the SGLang harness in :mod:`schedlab.diffcheck`.

* :mod:`.case` -- the settings both engines get and the per-request outcome compared;
* :mod:`.workloads` -- random cases per feature group (budget, threshold, tight_kv, prefix,
  priority, all, ...; and window, window_prefix, window_all, window_long: a model with
  sliding-window layers, vLLM's hybrid KV cache manager against schedlab's ``SlidingWindow``);
* :mod:`.schedlab_side` / :mod:`.vllm_side` -- run one case on each engine;
* :mod:`.kv_steps` -- the block pools of both compared after every step (``--kv-steps``);
* :mod:`.cli` -- ``python tools/vllm_diff.py``.
"""
