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
matches characters, here blocks; its tree evicts least recently used entries and forgets a
removed worker, this one never forgets.)

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

Why a sticky map rather than consistent hashing: it models cache-aware routers (SGLang's
router sends a prompt to a worker whose radix tree holds its prefix, and a prefix nobody holds
to the least loaded worker; the vLLM production-stack ``prefixaware`` router picks at random
among the endpoints holding the longest match -- every endpoint when nothing matches -- and
never reads load), it places each new group by the load at that moment instead of by hash luck
(with a handful of groups, hashing can easily put two hot groups on one instance), and it is
deterministic without a stable hash function. Its cost is one map entry per distinct key. It
remembers positions in the list of instances it is given: under an autoscaler a group whose
instance has left the pool is placed again, and one whose position was renumbered follows the
position (:mod:`schedlab.engine.scaling`).
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import attrs

from schedlab.configs import float_field, int_field, str_field

from .balancing import least_by, least_outstanding


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


class PrefixAffinityRouter:
    """Same prefix, same instance; requests without a prefix go to the least outstanding one.

    SGLang's global load guard (``balance_abs_threshold``, ``balance_rel_threshold``) sends a
    request with a prefix to the least loaded instance while the instances are imbalanced; the
    group keeps its instance. With ``max_imbalance`` set (schedlab's extension), a request whose
    instance is more than that many outstanding requests busier than the least loaded instance
    goes there instead; the group keeps its instance too.
    """

    def __init__(self, config: PrefixAffinityConfig | None = None):
        self.config = config or PrefixAffinityConfig()
        self._home: dict[Any, int] = {}  # prefix group -> its instance
        self._tree: list = [{}, {}]       # block hash -> node; a node: [children, instances holding it]

    def route(self, request, instances: Sequence) -> int:
        least = least_outstanding(instances)
        if request.prefix_group is None:
            if not request.block_hashes:
                return least
            return self._by_blocks(request.block_hashes, instances, least, self._imbalanced(instances, least))
        key = ("group", request.prefix_group)
        home = self._home.get(key)
        if home is None or home >= len(instances):  # new, or its instance left an autoscaled pool
            self._home[key] = least
            return least
        if self._imbalanced(instances, least):
            return least
        return self._spilled(home, least, instances)

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

    def _by_blocks(self, hashes, instances: Sequence, least: int, imbalanced: bool) -> int:
        """The instance for a prompt of ``hashes`` (the module docstring), its blocks then
        recorded as held there."""
        node, depth, holders, matched = self._tree, 0, (), 0
        if not imbalanced:
            for h in hashes:
                node = node[0].get(h)
                if node is None:
                    break
                depth += 1
                here = [i for i in node[1] if i < len(instances)]  # (an autoscaled pool may have shrunk)
                if here:
                    holders, matched = here, depth
        if holders and matched / len(hashes) > self.config.match_threshold:
            choice = self._spilled(least_outstanding(instances, sorted(holders)), least, instances)
        else:
            choice = least
        node = self._tree
        for h in hashes:
            node = node[0].setdefault(h, [{}, {}])
            node[1][choice] = None
        return choice


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
