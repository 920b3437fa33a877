"""What a router sees of an instance: its load as it is at the moment of the arrival being routed.

Both engines run an iteration as one step -- planned at its start, its finishes applied at once
-- but an arrival that comes while an iteration is in progress must not see that iteration's
finishes: at that moment the requests are still being served and still hold their KV blocks.
So each instance records, for the iteration it ran last, what its end gives back
(:class:`Release`), and the router reads an :class:`InstanceView` that adds it back while the
routing time (:class:`RoutingClock`) is before that end. An iteration that ends exactly at the
arrival's time has ended; one that starts then has not begun (the arrival may still join it).

The fast engine may also hold a run of identical decode iterations *pending*: planned, its
length known, but applied only when something reaches the instance (an arrival routed to it
cuts the run at the first iteration boundary at or after the arrival). While it is pending the
view reads the run in closed form: its requests are all still in service, and the KV blocks
held are those of the iteration in progress (KV grows step by step during a run).

This is the whole contract between routers and instances (see
:class:`schedlab.protocols.Router`): every read is O(1), and none of it lets a router see the
future. :mod:`schedlab.engine.pool` keeps the views ordered by load, so that choosing the
least loaded of N instances costs O(log N).
"""

from __future__ import annotations

import math
import operator

from ..errors import SimulationError

INF = math.inf


def route_index(router, request, answer, count: int) -> int:
    """``answer``, what ``router.route`` returned for ``request`` among ``count`` instances, as an
    index, if it is a whole number from 0 to ``count - 1`` -- an int or anything integer-like
    (``operator.index``: numpy's ``np.argmin`` gives an ``np.int64``), never a bool; else
    :class:`SimulationError`. Both engines read a router's answer through it, so they agree."""
    try:
        index = -1 if isinstance(answer, bool) else operator.index(answer)
    except TypeError:
        index = -1
    if not 0 <= index < count:
        raise SimulationError(f"router {type(router).__name__} returned {answer!r} for request {request.id}; "
                              f"expected an instance index from 0 to {count - 1}")
    return index


class Release:
    """What the iteration an instance ran last gives back at its end (``at``): finished or
    handed-over requests, running slots and KV blocks (the blocks that finishing requests free)."""

    __slots__ = ("at", "requests", "running", "blocks")

    def __init__(self) -> None:
        self.at = -INF
        self.requests = self.running = self.blocks = 0

    def record(self, at: float, before: tuple, after: tuple) -> None:
        """``before``/``after``: ``load(instance)`` just before and after the iteration's end."""
        self.at = at
        self.requests = before[0] - after[0]
        self.running = before[1] - after[1]
        self.blocks = before[2] - after[2]

    def add(self, at: float, before: tuple, after: tuple) -> None:
        """More given back at ``at`` (a pipeline's landing finishing requests its batch brought a
        token after their preemption): added to what the iteration ending then gave back."""
        if at != self.at:
            self.record(at, before, after)
            return
        self.requests += before[0] - after[0]
        self.running += before[1] - after[1]
        self.blocks += before[2] - after[2]


def serving(instance) -> int:
    """The running requests routers count on either engine's instance: not those finished whose
    slots are held for the plan made ahead (:mod:`schedlab.engine.ahead`; released at the same
    instant, once that plan is made) -- a router sees a request gone at its last token --, nor
    those whose abort has come, which that plan applies after it (``Ahead.note_leaving``)."""
    ahead = getattr(instance, "ahead", None)  # (a pipelined instance plans no batch ahead)
    return len(instance.running) - (len(ahead.held) + ahead.leaving_running if ahead is not None else 0)


def load(instance) -> tuple[int, int, int]:
    """(outstanding requests, running requests, KV blocks in use) of either engine's instance."""
    return instance.outstanding, serving(instance), instance.kv.num_used_blocks()


class RoutingClock:
    """The time of the arrival being routed, shared by the views of one pool of instances."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = -INF


class InstanceView:
    """One instance as a router may see it, at the routing clock's time.

    ``index`` (the instance's number in the run; the router answers with a position in the list it
    was given, which differs for a disaggregated cluster's decode pool), ``outstanding`` (requests queued, swapped out or in
    service; on a decode instance also those whose KV it awaits), ``waiting``, ``running``,
    ``in_iteration`` (an iteration is in progress) and ``kv`` (:class:`KVGauge`).
    """

    __slots__ = ("_inst", "_clock", "index", "kv")

    def __init__(self, instance, clock: RoutingClock):
        self._inst = instance
        self._clock = clock
        self.index = instance.index
        self.kv = KVGauge(self)

    @property
    def in_iteration(self) -> bool:
        inst = self._inst
        if inst.pending is not None:
            return inst.pending.busy_at(self._clock.now)
        return self._clock.now < inst.release.at

    @property
    def outstanding(self) -> int:
        inst = self._inst
        n = inst.outstanding
        return n + inst.release.requests if self._clock.now < inst.release.at else n

    @property
    def waiting(self) -> int:
        return len(self._inst.waiting)

    @property
    def running(self) -> int:
        inst = self._inst
        n = serving(inst)
        return n + inst.release.running if self._clock.now < inst.release.at else n

    def _blocks_held(self) -> int:
        """Blocks held beyond the instance's own count: those an iteration in progress frees at
        its end, or those a pending decode run has grown by at the routing time."""
        inst = self._inst
        if inst.pending is not None:
            return inst.pending.grown_at(self._clock.now)
        return inst.release.blocks if self._clock.now < inst.release.at else 0

    def __repr__(self) -> str:
        return (f"InstanceView(index={self.index}, outstanding={self.outstanding}, waiting={self.waiting}, "
                f"running={self.running}, kv_used={self.kv.num_used_blocks()}/{self.kv.num_blocks})")


class KVGauge:
    """An instance's KV cache as the router sees it: ``num_used_blocks()`` (held by requests),
    ``num_free_blocks()``, ``num_blocks``, ``block_size`` and ``usage`` (used / total, vLLM's
    ``kv_cache_usage_perc``) as of the routing time. Anything else (a prefix-aware router asking
    what is cached) is the cache's own answer: an iteration in progress changes only which blocks
    are held, not what is cached."""

    __slots__ = ("_view",)

    def __init__(self, view: InstanceView):
        self._view = view

    @property
    def num_blocks(self) -> int:
        return self._view._inst.kv.num_blocks

    @property
    def block_size(self) -> int:
        return self._view._inst.kv.block_size

    def num_used_blocks(self) -> int:
        return self._view._inst.kv.num_used_blocks() + self._view._blocks_held()

    def num_free_blocks(self) -> int:
        return self._view._inst.kv.num_free_blocks() - self._view._blocks_held()

    @property
    def usage(self) -> float:
        return self.num_used_blocks() / self.num_blocks

    def __getattr__(self, name: str):
        return getattr(self._view._inst.kv, name)


def views_of(instances, clock: RoutingClock, *, tracked: bool = False):
    """Views of a pool, in the pool's order (the router's answer is a position in it), as a
    :class:`~schedlab.engine.pool.ViewPool`; ``tracked``: the driver tells the pool of every
    change (see there), so it keeps load indexes instead of scanning."""
    from .pool import ViewPool

    return ViewPool([InstanceView(inst, clock) for inst in instances], clock, tracked=tracked)
