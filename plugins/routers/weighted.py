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
  256 of them (``maxPrefixBlocksToMatch``), a prompt shorter than one block not at all, matched
  from the first block on for as long as some endpoint holds it, each endpoint counting the
  blocks it holds; the blocks of each request are recorded on the endpoint it went to.

Here a request's prompt is known by its ``prefix_group`` (its first ``prefix_tokens`` are the
group's, whole blocks of them shared, the rest its own) or its ``block_hashes`` (matched at the
trace's block size, ``hash_block_tokens``, each trace block counting the whole engine blocks that
end in it); a request with neither shares no block, and its blocks are recorded all the same. Only
whole engine blocks count, the score's share too (a prompt's last partial block is not hashed).
The gauges are read at the arrival (llm-d scrapes them every
50 ms); ties go to the lowest position (llm-d shuffles them). Each decision scans the
instances, O(N), plus O(blocks of the prompt).

**What the index forgets** (``approximateprefix/indexer.go``): llm-d keeps, per endpoint, an LRU
cache of the block hashes recorded there (``hashicorp/golang-lru``), with room for as many blocks
as the engine has (``autoTune``: vLLM's ``num_gpu_blocks``, from its ``cache_config_info``
metric; 31,250 -- ``defaultLRUCapacityPerServer`` -- when the metric is missing or ``autoTune``
is off; the ``lruCapacityPerServer`` setting is not read at ``520af47``); recording a request
adds its blocks in prompt order, each one becoming the most recent, and when the cache is full
the least recent block is dropped and that endpoint no longer counts as holding it. A prompt's
first block is thus the least recent of its blocks and the first to go: once it goes, the
prompt's prefix matches nothing there, whatever else is still recorded. Here the same, in the
engine's blocks: ``lru_blocks`` (default: each instance's ``kv.num_blocks``); a trace block of
``hash_block_tokens`` counts as that many tokens of engine blocks (llm-d would hold one entry per
engine block of it, the first dropped first: a trace block dropped in part no longer matches),
and a prompt's own blocks -- all of a prompt without a prefix, those after a group's prefix --,
which nothing will match, as one entry of that many blocks that only takes room (dropped block
by block, as llm-d drops them one by one). As in llm-d, a request's blocks go into the LRU before
the endpoint is marked as holding them, so a block dropped while its own request was recorded
(only when a prompt has more blocks than the LRU has room) is still counted as held. An
instance no longer among those the router is given is forgotten, as llm-d removes an endpoint
that left (its check runs every 2 minutes; here at the next request).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import attrs

from schedlab.configs import FieldError, float_field, int_field

_GROUP = "group"   # keys of a prefix group's blocks: (_GROUP, group, block number)
_OWN = "own"       # key of a prompt's own blocks: (_OWN, n), n counting the requests recorded


@attrs.frozen
class WeightedConfig:
    queue: float = float_field(2.0, min=0.0, help="weight of the queue scorer ((max - waiting) / (max - min); "
                                                 "llm-d's default 2)")
    kv: float = float_field(2.0, min=0.0, help="weight of the KV-cache utilisation scorer (1 - usage; llm-d's default 2)")
    prefix: float = float_field(3.0, min=0.0, help="weight of the prefix-cache scorer (share of the prompt's blocks "
                                                  "held; llm-d's default 3)")
    max_prefix_blocks: int = int_field(256, min=1, help="engine blocks of the prompt's start the prefix scorer "
                                                        "matches (llm-d's maxPrefixBlocksToMatch, 256)")
    lru_blocks: int | None = int_field(
        None, min=1, optional=True,
        help="engine blocks the prefix index remembers per instance, the least recently recorded forgotten first "
             "(llm-d's per-endpoint LRU); default: the instance's KV block count, as llm-d's autoTune reads vLLM's "
             "num_gpu_blocks (31,250 without it)")

    def __attrs_post_init__(self) -> None:
        if self.queue == self.kv == self.prefix == 0:
            raise FieldError("queue", "the weights queue, kv and prefix are all 0: give at least one a weight > 0")


class WeightedRouter:
    """llm-d's default scorer mix (see the module docstring)."""

    def __init__(self, config: WeightedConfig | None = None):
        self.config = config or WeightedConfig()
        self._holders: dict = {}  # block key -> {instance index: None} (llm-d's hashToPods)
        self._lru: dict = {}      # instance index -> OrderedDict block key -> engine blocks, least recent first
        self._held: dict = {}     # instance index -> engine blocks in its LRU
        self._room: dict = {}     # instance index -> its LRU's room, fixed when it is made (as llm-d's)
        self._members: list = []  # the instances (their index) of the last list routed over
        self._own = 0             # prompts recorded: names each one's own blocks

    def route(self, request, instances: Sequence) -> int:
        c = self.config
        members = [view.index for view in instances]
        if members != self._members:
            serving = set(members)
            for index in [i for i in self._lru if i not in serving]:
                self._forget(index)
            self._members = members
        waiting = [view.waiting for view in instances]
        low, high = min(waiting), max(waiting)
        held, blocks, own = self._prefix(request, instances)
        best, best_score = 0, None
        for pos, view in enumerate(instances):
            queue = 1.0 if high == low else (high - waiting[pos]) / (high - low)
            kv = min(1.0, max(0.0, 1.0 - view.kv.usage))
            score = c.queue * queue + c.kv * kv + c.prefix * held.get(view.index, 0.0)
            if best_score is None or score > best_score:
                best, best_score = pos, score
        if blocks or own:
            self._record(instances[best], blocks, own)
        return best

    def _prefix(self, request, instances: Sequence) -> tuple[dict, list, int]:
        """({instance index: prefix score}, [(block key, engine blocks)] to record, engine blocks of
        the prompt's own to record)."""
        if not instances:
            return {}, [], 0
        block = instances[0].kv.block_size
        # llm-d hashes the prompt's whole engine blocks only ("if the last block is smaller than
        # cacheBlockSize, it will be ignored"), at most max_prefix_blocks of them, and scores the
        # share of them an endpoint holds
        total = min(request.prompt_tokens // block, self.config.max_prefix_blocks)
        if not total:  # a prompt shorter than one block: nothing hashed
            return {}, [], 0
        if request.prefix_group is not None:
            shared = min(request.prefix_tokens // block, total)
            blocks = [((_GROUP, request.prefix_group, i), 1) for i in range(shared)]
            own = total - shared
        elif request.block_hashes:
            # a trace block of hash_block_tokens stands for the engine's whole blocks that end in
            # it (counted in engine blocks, as llm-d's index holds them: a trace block of 512 tokens
            # is 32 blocks of 16); one that ends no whole engine block adds nothing
            size, end = request.hash_block_tokens, total * block
            blocks, done = [], 0
            for j, h in enumerate(request.block_hashes):
                if j * size >= end:
                    break
                upto = min((j + 1) * size, end) // block
                if upto > done:
                    blocks.append((h, upto - done))
                    done = upto
            own = total - done  # (a prompt longer than its trace blocks: the rest is its own)
        else:
            return {}, [], total
        counts: dict = {}
        for key, size in blocks:
            holders = self._holders.get(key)
            if not holders:
                break
            for i in holders:
                counts[i] = counts.get(i, 0) + size
        return {i: n / total for i, n in counts.items()}, blocks, own

    def _record(self, view, blocks: list, own: int) -> None:
        """llm-d's ``indexer.Add``: the blocks go into the instance's LRU in prompt order (the least
        recent dropped whenever it is over its room), then the instance holds every one of them."""
        index = view.index
        lru = self._lru.get(index)
        if lru is None:
            lru = self._lru[index] = OrderedDict()
            self._held[index] = 0
            self._room[index] = self.config.lru_blocks or view.kv.num_blocks
        for key, size in blocks:
            before = lru.get(key)
            if before is None:
                lru[key] = size
                self._held[index] += size
            else:  # the most recent again, whole again if part of it was dropped
                lru.move_to_end(key)
                lru[key] = size
                self._held[index] += size - before
            self._shrink(index, lru)
        if own:
            self._own += 1
            lru[(_OWN, self._own)] = own
            self._held[index] += own
            self._shrink(index, lru)
        for key, size in blocks:  # (not those dropped, or cut, while their own prompt was recorded)
            if lru.get(key) == size:
                self._holders.setdefault(key, {})[index] = None

    def _shrink(self, index: int, lru: OrderedDict) -> None:
        """Drop the least recent blocks of ``index`` until it is within its room; a block partly
        dropped is no longer held there (its first part is gone), the rest of it stays in line."""
        over = self._held[index] - self._room[index]
        while over > 0:
            key, size = next(iter(lru.items()))
            self._unhold(key, index)  # (a prompt's own blocks have no holders)
            if size > over:
                lru[key] = size - over
                self._held[index] -= over
                return
            del lru[key]
            self._held[index] -= size
            over -= size

    def _unhold(self, key, index: int) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.pop(index, None)
            if not holders:
                del self._holders[key]

    def _forget(self, index: int) -> None:
        """llm-d's ``RemovePod``: the instance left; it holds nothing any more."""
        for key in self._lru.pop(index):
            self._unhold(key, index)
        del self._held[index], self._room[index]
