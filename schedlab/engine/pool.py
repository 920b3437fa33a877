"""A pool's views, kept ordered by load: the least loaded of N instances in O(log N).

A router is handed a :class:`ViewPool` -- a list of :class:`~schedlab.engine.load.InstanceView`,
so a router that scans it still works -- which can also answer "the least of these by this
key" from an index instead of a scan (:meth:`ViewPool.least_by`). The index is a heap of each
instance's key as last computed, with lazy deletion; it is exact because of what the driver
promises and how the views change:

* the driver calls :meth:`ViewPool.changed` after anything it does to an instance (an arrival,
  an iteration or a run of them applied, a plan, a wake-up): those are the only moments its
  counts change;
* between them a view changes only with the routing time: an iteration in progress ends
  (its finishes and freed blocks show from its end on: the pool keeps those ends in a heap of
  its own and recomputes the key when one passes), or a pending decode run's KV grows (it
  only grows).

So a key that does not decrease as the KV in use grows (``(outstanding, index)``, ``(KV usage,
outstanding, index)``, ...) is never above its stored value unless the instance was marked:
the heap's top, recomputed, is the minimum if its key did not change, and otherwise goes back
with its new key and the next top is tried. Each query costs O(log N) plus one such retry per
instance whose KV grew since it last came up.

A pool the driver does not track (``tracked=False``: disaggregated clusters, whose pools wait on
each other in lockstep) answers by scanning, O(N).
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Sequence

#: Heap entries beyond this multiple of the members (plus a constant) trigger a rebuild.
COMPACT_FACTOR = 4


def outstanding_key(view, position: int) -> tuple:
    """Fewest requests queued or in service; ties to the lowest position."""
    return (view.outstanding, position)


#: A key that does not change between the changes the pool is told of (no KV in it): the
#: index's top needs no second look.
outstanding_key.steady = True


def kv_key(view, position: int) -> tuple:
    """Lowest KV usage; ties to the fewest outstanding, then the lowest position."""
    kv = view.kv
    return (kv.num_used_blocks() / kv.num_blocks, view.outstanding, position)


class LoadIndex:
    """Some of a pool's views (``members``: positions), ordered by ``key(view, position)``."""

    __slots__ = ("views", "key", "steady", "members", "heap", "current", "dirty")

    def __init__(self, views: Sequence, key: Callable, members: Sequence[int]):
        self.views = views
        self.key = key
        self.steady = getattr(key, "steady", False)
        self.members = frozenset(members)
        self.current = {pos: key(views[pos], pos) for pos in members}
        self.heap = [(k, pos) for pos, k in self.current.items()]
        heapq.heapify(self.heap)
        self.dirty: set = set()

    def mark(self, pos: int) -> None:
        if pos in self.members:
            self.dirty.add(pos)

    def mark_all(self) -> None:
        self.dirty.update(self.members)

    def least(self) -> int:
        views, key, current, heap = self.views, self.key, self.current, self.heap
        if self.dirty:
            for pos in self.dirty:
                k = key(views[pos], pos)
                if k != current[pos]:
                    current[pos] = k
                    heapq.heappush(heap, (k, pos))
            self.dirty.clear()
            if len(heap) > COMPACT_FACTOR * len(current) + 64:
                heap[:] = [(k, pos) for pos, k in current.items()]
                heapq.heapify(heap)
        while True:
            k, pos = heap[0]
            if current[pos] != k:  # an older key of an instance that has moved since
                heapq.heappop(heap)
                continue
            if self.steady:
                return pos
            now = key(views[pos], pos)
            if now == k:
                return pos
            current[pos] = now  # its KV grew since: back with the new key, try the next top
            heapq.heapreplace(heap, (now, pos))


def routing_time(request, instances) -> float:
    """When a router is asked about ``request``: the pool's routing time (:attr:`ViewPool.now`),
    or the request's arrival for a plain list of views (a router driven by hand, as in tests).
    A router keeping its own clock reads this, not ``request.arrival_ms``: a decode pool's
    router is asked at the handoff, a whole prefill after the arrival."""
    now = getattr(instances, "now", None)
    return request.arrival_ms if now is None or now == -math.inf else now


class ViewPool(list):
    """The views of one pool of instances, in the pool's order, with load indexes.

    :param clock: the routing clock the views read.
    :param tracked: the driver calls :meth:`changed` after every change to an instance.
    """

    def __init__(self, views: list, clock, *, tracked: bool = False):
        super().__init__(views)
        self.clock = clock
        self.tracked = tracked
        self._indexes: dict = {}
        self._ends: list = []  # (end of an iteration in progress, position)
        self._end_of = [None] * len(views)  # the end last put in _ends, per position
        self._releases = [view._inst.release for view in views]

    @property
    def now(self) -> float:
        """The time the router is asked at: a request's arrival for a colocated or prefill pool,
        its prompt's handoff (the KV ready to move) for a decode pool."""
        return self.clock.now

    def changed(self, pos: int) -> None:
        """Instance ``pos`` changed (O(1) per index); its iteration in progress, if any, is
        remembered so that the key is recomputed once it has ended."""
        if not self._indexes:  # untracked, or no router has asked for an order yet (see least_by)
            return
        for index in self._indexes.values():
            if pos in index.members:
                index.dirty.add(pos)
        self._remember_end(pos)

    def _remember_end(self, pos: int) -> None:
        release = self._releases[pos]
        at = release.at
        if at > self.clock.now and at != self._end_of[pos] and (release.requests or release.running or
                                                                release.blocks):  # else its end changes nothing
            self._end_of[pos] = at
            heapq.heappush(self._ends, (at, pos))

    def least_by(self, key: Callable, members: Sequence[int] | None = None) -> int:
        """The position of the least view by ``key(view, position)`` among ``members``
        (positions, default all). O(log N) on a tracked pool (the key must not decrease as an
        instance's KV in use grows, see the module docstring), a scan otherwise."""
        if not self.tracked:
            candidates = range(len(self)) if members is None else members
            return min(candidates, key=lambda pos: key(self[pos], pos))
        ends = self._ends
        if ends and ends[0][0] <= self.clock.now:
            while ends and ends[0][0] <= self.clock.now:
                pos = heapq.heappop(ends)[1]
                for index in self._indexes.values():
                    index.mark(pos)
        name = (key, members if members is None or type(members) is tuple else tuple(members))
        index = self._indexes.get(name)
        if index is None:
            if not self._indexes:  # the first order asked for: the iterations in progress until now,
                for pos in range(len(self)):  # e.g. in a pool an autoscaler made anew mid-run
                    self._remember_end(pos)
            index = self._indexes[name] = LoadIndex(self, key, range(len(self)) if members is None else members)
        return index.least()
