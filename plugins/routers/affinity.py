"""The ``prefix_affinity`` router: requests sharing a prefix go to the instance that has it cached.

A request with a ``prefix_group`` goes where its group went: the first request of a group goes
to the least outstanding instance, and the group stays there ("sticky map").

A request naming its prompt's ``block_hashes`` instead (traces such as Mooncake's) is matched
block by block against the prompts routed before it, as SGLang's router matches a prompt in its
approximate radix tree (``cache_aware`` policy): if the longest match covers more than
``match_threshold`` of its blocks (SGLang's ``cache_threshold``, 0.5) it goes to the least
outstanding instance holding that match, else to the least outstanding instance; either way its
blocks are then recorded as held there. So a system prompt every request shares does not pull
the whole trace onto one instance, while a conversation's next turn follows its history.

Why a sticky map rather than consistent hashing: it models cache-aware routers (SGLang's
router sends a prompt to the worker whose radix tree holds its prefix, and a prefix nobody
holds to the least loaded worker; the vLLM production-stack ``prefixaware`` router does the
same), it places each new group by the load at that moment instead of by hash luck (with a
handful of groups, hashing can easily put two hot groups on one instance), and it is
deterministic without a stable hash function. Its cost is one map entry per distinct key,
and it does not model instances joining or leaving -- the cluster here is fixed.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import attrs

from schedlab.configs import float_field, int_field, str_field

from .balancing import least_outstanding


@attrs.frozen
class PrefixAffinityConfig:
    max_imbalance: int | None = int_field(
        None, min=0, optional=True,
        help="spill a request to the least loaded instance when its group's instance has more than this "
             "many outstanding requests above it (default: never spill)")
    match_threshold: float = float_field(
        0.5, min=0.0, max=1.0,
        help="requests naming block hashes: follow the longest cached match only if it covers more than this "
             "share of the prompt's blocks, else go to the least loaded instance (SGLang router's cache_threshold)")


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

    With ``max_imbalance`` set, a request whose group's instance is more than that many
    outstanding requests busier than the least loaded instance spills there instead (SGLang's
    router switches from cache affinity to shortest queue when load is imbalanced the same
    way). A spill sends that one request elsewhere; the group keeps its instance.
    """

    def __init__(self, config: PrefixAffinityConfig | None = None):
        self.config = config or PrefixAffinityConfig()
        self._home: dict[Any, int] = {}  # prefix group -> its instance
        self._tree: list = [{}, {}]       # block hash -> node; a node: [children, instances holding it]

    def route(self, request, instances: Sequence) -> int:
        least = least_outstanding(instances)
        if request.prefix_group is None:
            return self._by_blocks(request.block_hashes, instances, least) if request.block_hashes else least
        key = ("group", request.prefix_group)
        home = self._home.get(key)
        if home is None or home >= len(instances):  # new, or its instance left an autoscaled pool
            self._home[key] = least
            return least
        return self._spilled(home, least, instances)

    def _spilled(self, home: int, least: int, instances: Sequence) -> int:
        """``home``, or ``least`` if ``home`` is more than ``max_imbalance`` busier."""
        cap = self.config.max_imbalance
        if cap is not None and instances[home].outstanding - instances[least].outstanding > cap:
            return least
        return home

    def _by_blocks(self, hashes, instances: Sequence, least: int) -> int:
        """The instance for a prompt of ``hashes`` (the module docstring), its blocks then
        recorded as held there."""
        node, depth, holders, matched = self._tree, 0, (), 0
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
