"""SGLang's waiting queue and its orders (``--schedule-policy``): ``fcfs``, ``lpm``, ``lof``.

Follows SGLang v0.4.6.post5, ``python/sglang/srt/managers/schedule_policy.py``
(``SchedulePolicy.calc_priority``). The waiting queue is a plain list that each prefill pass
re-sorts in place, with Python's stable sort, so ties keep the order of the previous pass;
arrivals and retracted requests are appended at the back (``waiting_queue.append`` /
``extend``, unlike vLLM, which puts preempted requests in front).

* ``fcfs`` -- no sorting: arrival order, retracted requests at the back.
* ``lof`` -- longest output first: sorted by ``-max_new_tokens`` (here ``max_tokens``).
* ``lpm`` -- longest prefix match first: sorted by the prefix-cache hit, longest first. With
  *in-batch prefix caching*: a request whose cache hit is at most 32 tokens is matched against
  the prompts of the waiting requests before it (a temporary radix tree of them); if at least
  32 of its tokens match one of those, it is *deprioritized* (sorted last), so that one request
  computes the shared prefix and the others can hit it later. With more than 128 waiting
  requests the sort is skipped (SGLang turns ``lpm`` into ``fcfs`` to save the matching),
  and without a prefix cache ``lpm`` is ``fcfs``.

The hit comes from the KV cache (``plan.cached_tokens``: the ``radix`` cache or the ``paged``
cache with prefix caching), so it is counted in whole blocks; the in-queue match uses the
same block keys (:func:`~schedlab_plugins.kv_caches.prefix.block_key`), so "32 tokens"
means ``ceil(32 / block_size)`` blocks.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from schedlab.queues import FcfsQueue
from schedlab_plugins.kv_caches.prefix import block_key

#: ``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`` and ``..._DEPRIORITIZE_THRESHOLD`` (tokens).
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32
#: above this many waiting requests ``lpm`` does not sort (``_determine_active_policy``).
LPM_MAX_QUEUE = 128


class SglangQueue(FcfsQueue):
    """SGLang's waiting list: append at the back, re-sorted stably by :meth:`reorder`."""

    __slots__ = ()

    def push_front(self, seq) -> None:
        """A retracted request: SGLang re-queues it at the back (``_extend_requests_to_queue``)."""
        self._items.append(seq)

    def reorder(self, key: Callable) -> None:
        """Sort by ``key``, ties in the current order (Python's ``list.sort`` is stable)."""
        self._items = deque(sorted(self._items, key=key))


def _longest_output(seq) -> int:
    return -seq.request.max_output_tokens


def calc_priority(policy: str, plan) -> None:
    """Re-sort ``plan.waiting`` for one prefill pass (``SchedulePolicy.calc_priority``)."""
    waiting = plan.waiting
    if policy == "lof":
        waiting.reorder(_longest_output)
    elif policy == "lpm":
        if not getattr(plan.kv, "prefix_caching", False) or len(waiting) > LPM_MAX_QUEUE:
            return
        keys = _longest_prefix_keys(plan)
        waiting.reorder(lambda seq: keys[seq.seq_no])


def _longest_prefix_keys(plan) -> dict:
    """``seq_no -> sort key`` for ``lpm``: minus the cache hit, or +inf when deprioritized
    (``_compute_prefix_matches`` and ``_sort_by_longest_prefix``)."""
    bs = plan.kv.block_size
    depth = -(-IN_BATCH_DEPRIORITIZE_TOKENS // bs)  # blocks a match must reach to count
    seen: set = set()                               # the first ``depth`` keys of waiting prompts
    keys = {}
    for seq in plan.waiting:
        hit = plan.cached_tokens(seq)
        keys[seq.seq_no] = -hit
        if hit > IN_BATCH_CHECK_TOKENS:
            continue
        # SGLang matches ``fill_ids[:-1]``; only its full blocks have keys here
        if (seq.num_tokens - 1) // bs < depth:
            continue  # too short to match ``depth`` blocks of anything
        head = tuple(block_key(seq.request, j, bs) for j in range(depth))
        if head in seen:
            keys[seq.seq_no] = float("inf")
        else:
            seen.add(head)
    return keys
