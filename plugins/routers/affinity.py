"""The ``prefix_affinity`` router: requests sharing a prefix go to the instance that has it cached.

A request with a ``prefix_group`` goes where its group went: the first request of a group goes
to the least outstanding instance, and the group stays there ("sticky map").

A request naming its prompt's ``block_hashes`` instead (traces such as Mooncake's) is matched
block by block against the prompts routed before it, as SGLang's router matches a prompt in its
approximate radix tree (``cache_aware`` policy): if the longest match covers more than
``match_threshold`` of its blocks (SGLang's ``cache_threshold``) it goes to the least
outstanding instance holding that match, else to the least outstanding instance; either way its
blocks are then recorded as held there. So a system prompt every request shares does not pull
the whole trace onto one instance, while a conversation's next turn follows its history.
(SGLang sends a match to one of the deepest node's tenants, whichever its tree iterates first,
whatever that worker's load; taking the least loaded holder is schedlab's refinement. SGLang
matches characters, here blocks.)

Before any of that, as SGLang's ``CacheAwarePolicy::select_worker`` does, the load of every
instance is checked (``outstanding``, the router's own in-flight count per worker in SGLang,
``Worker::load``): if the most loaded has more than ``balance_abs_threshold`` requests more
than the least loaded and more than ``balance_rel_threshold`` times as many, every request with
a prefix -- a group's or block hashes -- goes to the least loaded instance (a group keeps its
instance for later; block hashes are recorded where the request went). The defaults are
those an SGLang user gets from the router's launcher (``sglang_router`` ``router_args.py``,
``sgl-model-gateway/bindings/python``, 2025-26, as ``sgl-router`` before it: ``cache_threshold
= 0.3``, ``balance_abs_threshold = 64``, ``balance_rel_threshold = 1.5``; the Rust library's own
``CacheAwareConfig::default`` has 0.5 / 32 / 1.1). ``max_imbalance`` is schedlab's own
extension, not SGLang's: a per-home gap (the request's instance against the least loaded).

**What it forgets.** SGLang's tree is bounded: every ``eviction_interval_secs`` a background
thread cuts each worker ("tenant") whose share of the tree holds more than ``max_tree_size``
characters back to that size, least recently used first (``Tree::evict_tenant_by_size``,
``sgl-model-gateway/src/policies/tree.rs``): it takes the tenant's leaves -- nodes no child of
which the tenant holds -- oldest access first, removes the tenant from each (a node nobody holds
any more is deleted), and a parent left without the tenant's children becomes a leaf in turn;
it stops as soon as the tenant is within the size. Every prompt routed is inserted whole into
the tree of the worker it went to, the path it walks stamped with the time (``Tree::insert``).
Here the same rule runs on the router's records, in tokens and in simulated time:

* an instance's share counts the tokens of the blocks it holds (a block's tokens: the trace's
  ``hash_block_tokens``, fewer for a prompt's last block), of each group's ``prefix_tokens`` at
  its home, and of every prompt's part that nobody shares -- a group request's suffix, a whole
  prompt without a prefix, a request the load guard sent away from its group's home -- each such
  part a leaf of its own that only takes room;
* the bound is ``max_tree_tokens``, SGLang's ``max_tree_size`` of 2**26 characters (its launcher's
  default, and its ``smg`` command line's 67108864) at 4 characters per token -- the ratio
  llm-d's approximate prefix index assumes (``averageCharactersPerToken``) -- so 2**24 =
  16,777,216 tokens per instance;
* the eviction runs at every multiple of ``eviction_interval_s`` from the run's start (SGLang's
  thread sleeps the interval, then evicts, and again), before a request arriving at the same
  time is routed; the clock is the time the router is asked at (never going back): a request's
  arrival, or for a decode pool's router its prompt's handoff (``routing_time``), so evictions due
  in a quiet spell all happen, as one, when the next request arrives -- the same result, as
  nothing changes in between. The interval defaults to the launcher's 60 s (the newest
  ``router_args.py``, ``sgl-model-gateway/bindings/python/src/sglang_router``, where the ``manual``
  policy shares it; 120 s in the earlier launchers, ``sgl-router/py_src`` and
  ``sgl-model-gateway/bindings/python/sglang_router``, and in the Rust command line, ``main.rs``);
  0 never evicts, as SGLang's 0 starts no eviction thread;
* "least recently used" is the order of the last request that recorded an entry on that
  instance: every request routed stamps all it records -- the whole path of its blocks, as
  ``sgl-router``'s ``Tree::insert`` stamps the path it walks, its group's entry when it goes
  home, its own part -- with its place in the arrival order; ties do not arise. (``sgl-router``'s
  ``prefix_match`` also stamps the matched path for the tenant it names, which here is the
  instance the request goes to whenever the match is followed; the gateway's newer tree stamps
  only the node an insertion ends at, with a global counter, and a match's node one time in eight.)

A group forgotten at its home is placed again as a new group (SGLang's tree no longer matches
it, so the request goes to the least loaded worker), and blocks forgotten no longer match.

**Instances are known by their ``index``**, not by their position in the list the router is
given: homes and holders are kept by index and mapped to positions when a request is routed. Under
an autoscaler the serving instances come and go and are renumbered (:mod:`schedlab.engine.scaling`);
an instance no longer in the list is forgotten at once -- its homes and every block it held, as
SGLang's ``remove_tenant`` does when a worker is removed -- so a group whose home left is placed
again, and an instance that comes back (its cache reset when it went off) holds nothing. The
index-to-position map is rebuilt when the router is given a different list (the engines build a
new one whenever the pool changes), so routing stays O(log N) between changes.

Why a sticky map rather than consistent hashing: it models cache-aware routers (SGLang's
router sends a prompt to a worker whose radix tree holds its prefix, and a prefix nobody holds
to the least loaded worker; the vLLM production-stack ``prefixaware`` router picks at random
among the endpoints holding the longest match -- every endpoint when nothing matches -- and
never reads load), it places each new group by the load at that moment instead of by hash luck
(with a handful of groups, hashing can easily put two hot groups on one instance), and it is
deterministic without a stable hash function. Its cost is one map entry per distinct key, up to
``max_tree_tokens`` per instance.
"""

from __future__ import annotations

import heapq
import itertools
import math
import zlib
from collections import deque
from typing import Any, Sequence

import attrs

from schedlab.configs import float_field, int_field, str_field
from schedlab.engine.pool import routing_time

from .balancing import least_by, least_outstanding

#: SGLang's ``max_tree_size`` (launcher and command line: 2**26 characters) at 4 characters per token.
SGLANG_MAX_TREE_TOKENS = 2**26 // 4


@attrs.frozen
class PrefixAffinityConfig:
    max_imbalance: int | None = int_field(
        None, min=0, optional=True,
        help="schedlab's extension, not SGLang's: send a request to the least loaded instance when the instance "
             "its prefix would go to has more than this many outstanding requests above it (default: off)")
    match_threshold: float = float_field(
        0.3, min=0.0, max=1.0,
        help="requests naming block hashes: follow the longest cached match only if it covers more than this "
             "share of the prompt's blocks, else go to the least loaded instance (SGLang router's cache_threshold; "
             "0.3 its launcher's default)")
    balance_abs_threshold: int | None = int_field(
        64, min=0, optional=True,
        help="SGLang's load guard: when the most loaded instance has more than this many outstanding requests "
             "above the least loaded (and balance_rel_threshold holds), a request with a prefix goes to the least "
             "loaded (default 64, the SGLang router's; none: no guard)")
    balance_rel_threshold: float = float_field(
        1.5, min=0.0,
        help="SGLang's load guard: ... and more than this many times as many (default 1.5, the SGLang router's)")
    max_tree_tokens: int = int_field(
        SGLANG_MAX_TREE_TOKENS, min=0,
        help="tokens of prompts the router remembers per instance (its blocks, its groups' prefixes, the "
             "prompts' own parts) before the periodic eviction forgets the least recently used: SGLang's "
             "max_tree_size, counted in characters (2**26 in its launcher), at 4 characters per token: "
             "2**24 = 16,777,216")
    eviction_interval_s: float = float_field(
        60.0, min=0.0,
        help="seconds of simulated time between evictions, from the run's start (SGLang's eviction_interval_secs: "
             "60 in the sglang_router launcher, 120 in older ones; 0: never evict)")


def most_outstanding_key(view, position: int) -> tuple:
    """The most requests queued or in service first (a pool's index answers the most loaded)."""
    return (-view.outstanding, position)


most_outstanding_key.steady = True  # no KV in it (see schedlab.engine.pool)


def prefix_key(request) -> Any:
    """The request's prefix identity: ``("group", prefix_group)``, ``("hash", first block hash)``
    or None when it declares no shared prefix. (Tagged, so group 7 and hash 7 differ.)"""
    if request.prefix_group is not None:
        return ("group", request.prefix_group)
    if request.block_hashes:
        return ("hash", request.block_hashes[0])
    return None


class _Node:
    """A block of the approximate tree: its children by block hash, the instances holding it
    (index -> the stamp of the last request that recorded it there) and its tokens."""

    __slots__ = ("children", "held", "tokens", "parent", "key")

    def __init__(self, parent, key, tokens: int):
        self.children: dict = {}
        self.held: dict = {}
        self.tokens = tokens
        self.parent = parent
        self.key = key


class PrefixAffinityRouter:
    """Same prefix, same instance; requests without a prefix go to the least outstanding one.

    SGLang's global load guard (``balance_abs_threshold``, ``balance_rel_threshold``) sends a
    request with a prefix to the least loaded instance while the instances are imbalanced; the
    group keeps its instance. With ``max_imbalance`` set (schedlab's extension), a request whose
    instance is more than that many outstanding requests busier than the least loaded instance
    goes there instead; the group keeps its instance too. What it remembers is bounded and kept by
    instance index (see the module docstring).
    """

    def __init__(self, config: PrefixAffinityConfig | None = None):
        self.config = config or PrefixAffinityConfig()
        self._home: dict[Any, list] = {}  # prefix group -> [its instance (index), stamp, prefix tokens]
        self._root = _Node(None, None, 0)  # the approximate tree of block hashes
        self._tails: dict[int, deque] = {}  # instance index -> [stamp, tokens] of prompts' own parts, oldest first
        self._size: dict[int, int] = {}    # instance index -> tokens it holds in all of the above
        self._stamp = 0                    # requests routed: the order of use
        self._now = -math.inf              # the clock: the latest routing time
        interval = self.config.eviction_interval_s * 1000.0
        self._interval = interval if interval > 0 else math.inf
        self._next_eviction = self._interval
        self._pool: Sequence | None = None  # the list the positions below were read from
        self._positions: dict[int, int] = {}  # instance index -> its position in that list

    def route(self, request, instances: Sequence) -> int:
        now = routing_time(request, instances)
        if now > self._now:
            self._now = now
        if self._now >= self._next_eviction:
            self._evict()
            self._next_eviction = (math.floor(self._now / self._interval) + 1) * self._interval
        positions = self._members(instances)
        self._stamp += 1
        least = least_outstanding(instances)
        if request.prefix_group is None:
            if not request.block_hashes:
                self._tail(instances[least].index, request.prompt_tokens)
                return least
            return self._by_blocks(request, instances, positions, least, self._imbalanced(instances, least))
        key = ("group", request.prefix_group)
        home = self._home.get(key)
        pos = None if home is None else positions.get(home[0])
        if pos is None:  # a new group, or one forgotten
            if home is not None and home[0] in self._size:  # (its home is gone from a list changed in place)
                self._size[home[0]] -= home[2]
            choice = pos = least
            home = self._home[key] = [instances[least].index, 0, 0]
        elif self._imbalanced(instances, least):
            choice = least
        else:
            choice = self._spilled(pos, least, instances)
        if choice == pos:  # its prefix used at its home; the rest of the prompt is its own
            self._add(home[0], request.prefix_tokens - home[2])
            home[1], home[2] = self._stamp, request.prefix_tokens
            self._tail(home[0], request.prompt_tokens - request.prefix_tokens)
        else:
            self._tail(instances[choice].index, request.prompt_tokens)
        return choice

    def _imbalanced(self, instances: Sequence, least: int) -> bool:
        """SGLang's guard: the most and least loaded instances differ by more than
        ``balance_abs_threshold`` requests and by more than ``balance_rel_threshold`` times."""
        gap = self.config.balance_abs_threshold
        if gap is None:
            return False
        low = instances[least].outstanding
        high = instances[least_by(instances, most_outstanding_key)].outstanding
        return high - low > gap and high > low * self.config.balance_rel_threshold

    def _spilled(self, home: int, least: int, instances: Sequence) -> int:
        """``home``, or ``least`` if ``home`` is more than ``max_imbalance`` busier."""
        cap = self.config.max_imbalance
        if cap is not None and instances[home].outstanding - instances[least].outstanding > cap:
            return least
        return home

    def _by_blocks(self, request, instances: Sequence, positions: dict, least: int, imbalanced: bool) -> int:
        """The instance for a prompt of ``block_hashes`` (the module docstring), its blocks then
        recorded as held there."""
        hashes = request.block_hashes
        node, depth, holders, matched = self._root, 0, (), 0
        if not imbalanced:
            for h in hashes:
                node = node.children.get(h)
                if node is None:
                    break
                depth += 1
                here = [positions[i] for i in node.held if i in positions]
                if here:
                    holders, matched = here, depth
        if holders and matched / len(hashes) > self.config.match_threshold:
            choice = self._spilled(least_outstanding(instances, sorted(holders)), least, instances)
        else:
            choice = least
        index, stamp, size = instances[choice].index, self._stamp, self._size
        block, left = request.hash_block_tokens, request.prompt_tokens
        size.setdefault(index, 0)
        node = self._root
        for h in hashes:
            child = node.children.get(h)
            if child is None:
                child = node.children[h] = _Node(node, h, max(1, min(block, left)))
            node = child
            if index not in node.held:
                size[index] += node.tokens
            node.held[index] = stamp
            left -= block
        self._tail(index, left)
        return choice

    # -- what it remembers: sizes, eviction, instances that left ----------------------------------------

    def _add(self, index: int, tokens: int) -> None:
        self._size[index] = self._size.get(index, 0) + tokens

    def _tail(self, index: int, tokens: int) -> None:
        """A prompt's part nobody shares, recorded on ``index``: it only takes room."""
        self._add(index, max(0, tokens))
        if tokens > 0:
            self._tails.setdefault(index, deque()).append((self._stamp, tokens))

    def _members(self, instances: Sequence) -> dict:
        """{instance index: position} of ``instances``; instances that left the list since the
        last one are forgotten (SGLang's ``remove_tenant``)."""
        if instances is not self._pool:
            positions = {view.index: pos for pos, view in enumerate(instances)}
            for index in [i for i in self._size if i not in positions]:
                self._forget(index)
            self._pool, self._positions = instances, positions
        return self._positions

    def _forget(self, index: int) -> None:
        """Everything ``index`` held: its homes, its blocks (a block nobody holds any more is
        deleted), its prompts' own parts."""
        del self._size[index]
        self._tails.pop(index, None)
        for key in [k for k, home in self._home.items() if home[0] == index]:
            del self._home[key]
        stack = [self._root]
        while stack:  # only where it holds: whoever holds a block holds the blocks before it
            node = stack.pop()
            for h, child in list(node.children.items()):
                if child.held.pop(index, None) is not None:
                    if child.held:
                        stack.append(child)
                    else:
                        del node.children[h]

    def _evict(self) -> None:
        """SGLang's ``evict_tenant_by_size``: every instance holding more than ``max_tree_tokens``
        forgets its least recently used leaves -- blocks none of whose children it holds, its
        groups, its prompts' own parts -- until it holds no more than that."""
        cap, size = self.config.max_tree_tokens, self._size
        over = {i for i, held in size.items() if held > cap}
        if not over:
            return
        order = itertools.count()  # (heap ties are impossible by stamp and kind; this keeps nodes uncompared)
        heap = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            for child in node.children.values():
                mine = over.intersection(child.held)
                if mine:
                    stack.append(child)
                    for i in mine:
                        if not any(i in grand.held for grand in child.children.values()):
                            heap.append((child.held[i], 1, next(order), i, child))
        for key, (i, stamp, _) in self._home.items():
            if i in over:
                heap.append((stamp, 1, next(order), i, key))
        for i in over:
            if self._tails.get(i):
                heap.append((self._tails[i][0][0], 0, next(order), i, None))
        heapq.heapify(heap)
        while heap:
            _, _, _, i, what = heapq.heappop(heap)
            if size[i] <= cap:
                continue
            if what is None:  # its oldest prompt's own part (a request's part goes before its prefix)
                tails = self._tails[i]
                size[i] -= tails.popleft()[1]
                if tails:
                    heapq.heappush(heap, (tails[0][0], 0, next(order), i, None))
            elif isinstance(what, _Node):
                del what.held[i]
                size[i] -= what.tokens
                parent = what.parent
                if not what.held and not what.children:
                    del parent.children[what.key]
                if parent is not self._root and i in parent.held and \
                        not any(i in child.held for child in parent.children.values()):
                    heapq.heappush(heap, (parent.held[i], 1, next(order), i, parent))
            else:  # a group's prefix at its home
                size[i] -= self._home.pop(what)[2]


@attrs.frozen
class HashConfig:
    by: str = str_field("prefix", choices=("prefix", "id"),
                        help="'prefix': a request's prefix group or first block hash (requests without one: their "
                             "id); 'id': the request id")


def stable_hash(key: Any) -> int:
    """A hash that is the same in every process and run (Python's ``hash`` of text is salted)."""
    return zlib.crc32(repr(key).encode())


class HashRouter:
    """Requests go to ``stable_hash(key) % N``, the N instances it is given: modulo hashing, not a
    consistent-hash ring. On a fixed cluster the same prefix always goes to the same instance,
    whatever the load, as hash-based load balancers in front of caches place it (Envoy's
    ``RING_HASH`` / ``MAGLEV`` on a header, the vLLM production-stack router's session affinity
    -- those with consistent hashing). Under an autoscaler N is the number of serving instances,
    so a scale event remaps most keys where a ring would move few: from N to N + 1 instances a key
    stays only if its hash is the same modulo both, about 1/(N + 1) of them -- so about 80% of the
    groups move from 4 to 5 instances and 89% from 8 to 9, most between instances that were
    already serving (a ring moves about 1/(N + 1), all to the new one), and their prefixes are
    computed again where they land. It never reads load, so a run with it can be split into
    independent parts (``[cluster] partitions``); the price is imbalance when a few keys are hot."""

    def __init__(self, config: HashConfig | None = None):
        self.config = config or HashConfig()

    def _key(self, request) -> Any:
        key = prefix_key(request) if self.config.by == "prefix" else None
        return ("id", request.id) if key is None else key

    def partition(self, request, order: int, n: int) -> int:
        return stable_hash(self._key(request)) % n

    def route(self, request, instances: Sequence) -> int:
        return self.partition(request, 0, len(instances))
