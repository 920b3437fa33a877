"""The ``weighted`` router: llm-d's default endpoint-picker profile, a weighted sum of scorers.

llm-d's inference scheduler (the Gateway API Inference Extension's endpoint picker, EPP;
``llm-d-inference-scheduler``, ``config/charts/epplib/templates/_config.yaml``, mirror at
``520af47``, 2026-05) scores every endpoint with three scorers, each in [0, 1], adds them with
their weights and picks the highest sum (``max-score-picker``):

* ``queue-scorer`` (weight 2, ``scorer/queuedepth``): ``(max - q) / (max - min)`` of the
  endpoints' waiting queue sizes ``q`` (vLLM's ``num_requests_waiting``), 1 for every endpoint
  when they are all equal;
* ``kv-cache-utilization-scorer`` (weight 2, ``scorer/kvcacheutilization``): ``1 - usage``, the
  KV-cache usage gauge (vLLM's ``kv_cache_usage_perc``);
* ``prefix-cache-scorer`` (weight 3, ``scorer/prefix`` fed by ``dataproducer/approximateprefix``):
  the share of the prompt's blocks the endpoint holds, as the picker's own approximate index
  knows it -- the prompt cut into blocks of the engine's block size (``autoTune``) and at most
  256 of them (``maxPrefixBlocksToMatch``), matched from the first block on for as long as some
  endpoint holds it, each endpoint counting the blocks it holds; the blocks of each request are
  recorded on the endpoint it went to.

Here a request's prompt is known by its ``prefix_group`` (an endpoint that served the group
holds its ``prefix_tokens``, whole blocks of them) or its ``block_hashes`` (matched at the
trace's block size, ``hash_block_tokens``); a request with neither scores 0 everywhere. The
gauges are read at the arrival (llm-d scrapes them every 50 ms); the index never forgets (llm-d's
is an LRU of the engine's block count per endpoint, and drops endpoints that left); ties go to
the lowest position (llm-d shuffles them). Each decision scans the instances, O(N).
"""

from __future__ import annotations

from typing import Sequence

import attrs

from schedlab.configs import FieldError, float_field, int_field


@attrs.frozen
class WeightedConfig:
    queue: float = float_field(2.0, min=0.0, help="weight of the queue scorer ((max - waiting) / (max - min); "
                                                 "llm-d's default 2)")
    kv: float = float_field(2.0, min=0.0, help="weight of the KV-cache utilisation scorer (1 - usage; llm-d's default 2)")
    prefix: float = float_field(3.0, min=0.0, help="weight of the prefix-cache scorer (share of the prompt's blocks "
                                                  "held; llm-d's default 3)")
    max_prefix_blocks: int = int_field(256, min=1, help="engine blocks of the prompt's start the prefix scorer "
                                                        "matches (llm-d's maxPrefixBlocksToMatch, 256)")

    def __attrs_post_init__(self) -> None:
        if self.queue == self.kv == self.prefix == 0:
            raise FieldError("queue", "the weights queue, kv and prefix are all 0: give at least one a weight > 0")


class WeightedRouter:
    """llm-d's default scorer mix (see the module docstring)."""

    def __init__(self, config: WeightedConfig | None = None):
        self.config = config or WeightedConfig()
        self._served: dict = {}        # prefix group -> instances (their index) that served it
        self._tree: list = [{}, set()]  # block hash -> node; a node: [children, instances (index) holding it]

    def route(self, request, instances: Sequence) -> int:
        c = self.config
        waiting = [view.waiting for view in instances]
        low, high = min(waiting), max(waiting)
        held, hashes = self._prefix(request, instances)
        best, best_score = 0, None
        for pos, view in enumerate(instances):
            queue = 1.0 if high == low else (high - waiting[pos]) / (high - low)
            kv = min(1.0, max(0.0, 1.0 - view.kv.usage))
            score = c.queue * queue + c.kv * kv + c.prefix * held.get(view.index, 0.0)
            if best_score is None or score > best_score:
                best, best_score = pos, score
        self._record(request, hashes, instances[best].index)
        return best

    def _prefix(self, request, instances: Sequence) -> tuple[dict, tuple]:
        """({instance index: prefix score}, the block hashes matched and to record)."""
        if not instances or (request.prefix_group is None and not request.block_hashes):
            return {}, ()
        block = instances[0].kv.block_size
        limit = self.config.max_prefix_blocks * block  # tokens of the prompt's start that are matched
        if request.prefix_group is not None:
            total = min(-(-request.prompt_tokens // block), self.config.max_prefix_blocks)
            share = min(min(request.prefix_tokens, limit) // block, total) / total if total else 0.0
            return {i: share for i in self._served.get(request.prefix_group, ())}, ()
        hashes = request.block_hashes[:-(-limit // request.hash_block_tokens)]
        counts: dict = {}
        node = self._tree
        for h in hashes:
            node = node[0].get(h)
            if node is None or not node[1]:
                break
            for i in node[1]:
                counts[i] = counts.get(i, 0) + 1
        return {i: n / len(hashes) for i, n in counts.items()}, hashes

    def _record(self, request, hashes: tuple, index: int) -> None:
        if request.prefix_group is not None:
            self._served.setdefault(request.prefix_group, set()).add(index)
            return
        node = self._tree
        for h in hashes:
            node = node[0].setdefault(h, [{}, set()])
            node[1].add(index)
