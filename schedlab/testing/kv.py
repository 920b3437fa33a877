"""A KV cache's block accounting, checked at every call the engines make: :class:`AccountedKV`.

Both engines plan with ``blocks_needed`` and compare it with ``num_free_blocks()``. A cache whose
``blocks_needed`` over-reports refuses and preempts for nothing; one that under-reports fails only
when the pool is full ("refused a decode slot it had reported free"); a free count that drifts
from the used count stalls runs with a misleading message. :class:`~schedlab.testing.IterationChecker`
sees the pool only between iterations. This wrapper sees every call.
"""

from __future__ import annotations

from types import MethodType

#: Passed through unchecked: the counters the checks read.
_COUNTERS = frozenset({"num_used_blocks", "num_free_blocks", "check_invariants"})
#: Queries must leave the pool as it was. The wrapper asks ``blocks_needed`` before every
#: ``allocate``, so a query that changed the pool would change the run.
_QUERIES = frozenset({"blocks_needed", "cached_tokens"})

_classes: dict = {}


def _no_terms(kv) -> tuple[int, int]:
    return 0, 0


def _public_terms(kv) -> tuple[int, int]:
    return kv.deferred_blocks, getattr(kv, "lent_blocks", 0)


def _terms_of(kv):
    """How to read ``(deferred, lent)`` blocks off ``kv``."""
    return _public_terms if hasattr(kv, "deferred_blocks") else _no_terms


def _arg(value) -> str:
    request = getattr(value, "request", None)
    if request is not None and hasattr(request, "id"):
        return f"<request {request.id}>"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_arg(v) for v in value) + "]"
    return repr(value)


def _call(name: str, args, kwargs) -> str:
    return f"{name}({', '.join([_arg(a) for a in args] + [f'{k}={v!r}' for k, v in kwargs.items()])})"


def _seq(seq) -> str:
    return (f"request {seq.request.id} ({seq.status}, {seq.num_computed_tokens} of {seq.num_tokens} tokens "
            f"computed, {seq.reserved_tokens} reserved)")


class AccountedKV:
    """A KV cache that asserts its own block accounting at every call.

    Pass ``AccountedKV(MyKV(...))`` as ``kv=`` to :func:`~schedlab.testing.run_engine`, or return it
    from ``make`` for :func:`~schedlab.testing.run_cluster`. It behaves as the cache it wraps: its
    class takes the cache's class name (the engines' messages name the cache), attribute reads and
    writes go to the cache, and an optional member exists exactly when the cache has it. The checks:

    * **blocks_needed is what allocate takes** (the KVCache protocol). A successful
      ``allocate(seq, n, **kw)`` raises ``num_used_blocks()`` by exactly what ``blocks_needed(seq,
      n, **kw)`` answered just before. ``allocate_decodes(seqs)`` raises it by the sum of the
      ``(seq, 1)`` answers, and ``grow(n, freed=0)`` by ``n - freed``. On a cache with a
      ``window``, an allocation may give window blocks back: the count may then fall, by at most
      the sequence's ``window_blocks``, where ``blocks_needed`` says 0.
    * **allocate succeeds exactly when blocks_needed fits** in ``num_free_blocks()``. A refusal
      changes neither count.
    * **The pool adds up.** ``num_used_blocks() + num_free_blocks() == num_blocks`` holds when the
      cache is wrapped and after every call. Free blocks include evictable cached ones; swap space
      and a host tier are outside the pool.
    * **Queries change nothing.** ``blocks_needed`` and ``cached_tokens`` leave both counts alone.

    Some caches defer work to the end of a scheduling pass, such as ``RadixKVCache`` under SGLang's
    scheduler. Such a cache has two more terms:

    * ``deferred_blocks``: blocks the pass took beyond the unused ones. Their eviction waits for
      ``end_pass``, so they are neither used nor free until then.
    * ``lent_blocks``: blocks in use that are still counted free until the pass inserts its KV.

    For such a cache the checks read ``used + deferred`` as what allocations take, compare
    ``blocks_needed`` with ``free - lent``, and require ``used + deferred + free - lent ==
    num_blocks`` (the KVCache protocol's optional members, 0 when absent).
    """

    def __new__(cls, inner):
        kind = type(inner)
        sub = _classes.get(kind)
        if sub is None:
            sub = _classes[kind] = type(kind.__name__, (cls,), {"__module__": __name__, "__qualname__": kind.__name__})
        return object.__new__(sub)

    def __init__(self, inner):
        d = self.__dict__
        d["_kv_inner"] = inner
        d["_kv_terms"] = _terms_of(inner)
        d["_kv_window"] = getattr(inner, "window", None) is not None
        self._check_pool("the cache was wrapped")

    def __repr__(self) -> str:
        return f"AccountedKV({self._kv_inner!r})"

    def __getattr__(self, name: str):
        if name == "_kv_inner":  # (half built: no recursion)
            raise AttributeError(name)
        value = getattr(self._kv_inner, name)
        if type(value) is not MethodType or name.startswith("_") or name in _COUNTERS:
            return value
        checked = _CHECKED.get(name)
        if checked is not None:
            return lambda *args, **kwargs: checked(self, value, *args, **kwargs)
        query = name in _QUERIES

        def call(*args, **kwargs):
            before = self._counts() if query else None
            out = value(*args, **kwargs)
            if query and self._counts() != before:
                raise AssertionError(f"KV accounting (a query changes nothing): {_call(name, args, kwargs)} changed "
                                     f"(used, free) from {before} to {self._counts()}")
            self._check_pool(_call(name, args, kwargs))
            return out
        return call

    def __setattr__(self, name: str, value) -> None:
        setattr(self._kv_inner, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._kv_inner, name)

    # -- the checks ----------------------------------------------------------------------------
    def _counts(self) -> tuple[int, int]:
        kv = self._kv_inner
        return kv.num_used_blocks(), kv.num_free_blocks()

    def _taken(self) -> int:
        """Blocks out of the free pool: those in use, and any a pass took whose eviction waits."""
        kv = self._kv_inner
        return kv.num_used_blocks() + self._kv_terms(kv)[0]

    def _room(self, free: int) -> int:
        """What an allocation can take when ``num_free_blocks()`` is ``free``: less lent blocks."""
        return free - self._kv_terms(self._kv_inner)[1]

    def _check_pool(self, after: str) -> None:
        kv = self._kv_inner
        used, free = kv.num_used_blocks(), kv.num_free_blocks()
        deferred, lent = self._kv_terms(kv)
        total = used + deferred + free - lent
        if total != kv.num_blocks:
            terms = f" + {deferred} deferred - {lent} lent" if deferred or lent else ""
            raise AssertionError(
                f"KV accounting (num_used_blocks + num_free_blocks == num_blocks): after {after}, {used} used + "
                f"{free} free{terms} = {total} blocks, but the cache has {kv.num_blocks}")

    def _check_refusal(self, call: str, before: tuple) -> None:
        after = self._counts()
        if after != before:
            raise AssertionError(f"KV accounting (a refused allocation takes nothing): {call} returned False but "
                                 f"changed (used, free) from {before} to {after}")

    def _check_fits(self, call: str, ok, need: int, room: int, who: str = "") -> None:
        if bool(ok) != (need <= room):
            raise AssertionError(
                f"KV accounting (allocate succeeds exactly when blocks_needed fits the free blocks): {call}{who} "
                f"returned {ok!r} with blocks_needed {need} and {room} free blocks" + (
                    "; the engines treat a refusal of what blocks_needed said fits as an error" if not ok else ""))

    def _checked_allocate(self, allocate, seq, num_new_tokens, **kwargs):
        kv = self._kv_inner
        need = kv.blocks_needed(seq, num_new_tokens, **kwargs)
        window = kv.window_blocks(seq) if self._kv_window else 0
        before, taken0 = self._counts(), self._taken()
        room = self._room(before[1])
        ok = allocate(seq, num_new_tokens, **kwargs)
        call = _call("allocate", (seq, num_new_tokens), kwargs)
        if ok:
            taken = self._taken() - taken0
            if taken != need and not (self._kv_window and need == 0 and -window <= taken < 0):
                what = ("over-reports: the engines refuse and preempt for nothing" if need > taken else
                        "under-reports: the engines, planning with it, count on blocks that are not free")
                raise AssertionError(
                    f"KV accounting (blocks_needed is what allocate takes): {call} for {_seq(seq)} took {taken} "
                    f"blocks (used {before[0]} -> {kv.num_used_blocks()}), but blocks_needed with the same "
                    f"arguments said {need} just before; blocks_needed {what}")
        else:
            self._check_refusal(call, before)
        self._check_fits(call, ok, need, room, f" for {_seq(seq)}")
        self._check_pool(call)
        return ok

    def _checked_allocate_decodes(self, allocate_decodes, seqs, *args, **kwargs):
        kv = self._kv_inner
        seqs = list(seqs)
        needs = [kv.blocks_needed(s, 1) for s in seqs]
        need = sum(needs)
        back = sum(kv.window_blocks(s) for s, n in zip(seqs, needs) if not n) if self._kv_window else 0
        before, taken0 = self._counts(), self._taken()
        room = self._room(before[1])
        ok = allocate_decodes(seqs, *args, **kwargs)
        call = _call("allocate_decodes", (seqs,) + args, kwargs)
        if ok:
            taken = self._taken() - taken0
            if not need - back <= taken <= need:
                raise AssertionError(
                    f"KV accounting (blocks_needed is what allocate takes): {call} took {taken} blocks (used "
                    f"{before[0]} -> {kv.num_used_blocks()}), but blocks_needed(seq, 1) said {needs} (sum {need}) "
                    "just before")
        else:
            self._check_refusal(call, before)
        self._check_fits(call, ok, need, room)
        self._check_pool(call)
        return ok

    def _checked_grow(self, grow, num_blocks, *args, **kwargs):
        freed = args[0] if args else kwargs.get("freed", 0)
        before, taken0 = self._counts(), self._taken()
        out = grow(num_blocks, *args, **kwargs)
        call = _call("grow", (num_blocks,) + args, kwargs)
        taken = self._taken() - taken0
        if taken != num_blocks - freed:
            raise AssertionError(f"KV accounting (grow(n, freed) takes n - freed blocks): {call} took {taken} "
                                 f"(used {before[0]} -> {self._kv_inner.num_used_blocks()})")
        self._check_pool(call)
        return out


#: Calls with rules of their own. Every other public method gets the pool check after it.
_CHECKED = {"allocate": AccountedKV._checked_allocate, "allocate_decodes": AccountedKV._checked_allocate_decodes,
            "grow": AccountedKV._checked_grow}
