"""The fast engine's :class:`~schedlab.protocols.Plan`: a scheduler fills in one iteration.

Actions take effect immediately (blocks are taken or freed when called), as in vLLM, so the
scheduler's later decisions in the same call see them. The instance then executes the plan.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import operator
from typing import TYPE_CHECKING

import attrs

from ..errors import SimulationError, brief
from ..model import Request
from ..queues import RunningView
from .ahead import overshoot_slot, unseen_finish
from .sequence import DECODING, PREFILLING, SWAPPED, WAITING
from .stages import IN_FLIGHT

if TYPE_CHECKING:
    from .instance import Instance


def check_counts(what: str, seq, **counts) -> None:
    """Refuse a token count a scheduler gave a Plan call that is not a whole number (50.0 or 68.5
    tokens crashed the fast engine, ran on the reference engine; ``True`` was one token)."""
    for name, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise SimulationError(f"{what}(): request {seq.request.id}: {name} must be a whole number (an int), the "
                                  f"scheduler gave {brief(value)} (a {type(value).__name__})")


def check_wake(time_ms) -> None:
    """Refuse a ``wake_at`` time that is not a number, or NaN (it compared false with every time)."""
    if isinstance(time_ms, bool) or not isinstance(time_ms, numbers.Real) or math.isnan(time_ms):
        raise SimulationError(f"wake_at({brief(time_ms)}): give a time in ms (a number; inf for never)")


def check_reason(seq, reason) -> str:
    """``reason`` if it is text (``Plan.reject``'s reason goes in the results and to the client):
    a plugin's ``None`` failed far away, in the results code."""
    if not isinstance(reason, str) or not reason:
        raise SimulationError(f"reject(): request {seq.request.id} needs a reason (text), got {reason!r}")
    return reason


class Refusals:
    """Counts a plan's refused admissions of one request in a row: a scheduler that retries
    ``admit`` on a request the KV cache cannot take, never stopping at ``False``
    (``while plan.waiting: plan.admit(plan.waiting.peek(), ...)``), would hang the run inside its
    own loop. Past :data:`LIMIT` refusals of the same request in one plan (preempting others
    between tries takes at most one per running request) it is an error instead."""

    LIMIT = 100_000
    __slots__ = ("seq", "count")

    def __init__(self):
        self.seq = None
        self.count = 0

    def refuse(self, seq) -> bool:
        """Note that ``seq``'s admission was refused; False (admit's answer), or the error."""
        if seq is self.seq:
            self.count += 1
            if self.count > self.LIMIT:
                raise SimulationError(
                    f"admit(): request {seq.request.id} refused {self.count:,} times in a row in one plan (the KV "
                    "cache cannot take it now): a scheduler stops admitting when admit() returns False")
        else:
            self.seq, self.count = seq, 1
        return False


def check_rejection(request, reason, scheduler=None):
    """``reason``, what a scheduler's ``rejection_reason`` said of ``request``: text rejects it, None
    (or another empty answer) accepts it. Anything else -- a ``True`` -- failed far away, in the
    results code, once the whole run was over (named by the scheduler's class: a run names the plugin)."""
    if reason and not isinstance(reason, str):
        who = f"scheduler {type(scheduler).__name__}: " if scheduler is not None else ""
        raise SimulationError(f"{who}rejection_reason() returned {brief(reason)} for request {request.id}: "
                              "a reason is text (or None to accept)")
    return reason


def refused_slot(kv) -> SimulationError:
    """The error of a KV cache whose ``allocate`` refused a decode slot its ``blocks_needed`` and
    ``num_free_blocks`` said fits: its accounting disagrees with itself (named by class, so a run
    names the plugin)."""
    return SimulationError(f"KV cache {type(kv).__name__} refused a decode slot it had reported free (its "
                           "blocks_needed() and num_free_blocks() said it fits)")


def rejection_hook(scheduler, default):
    """The scheduler's optional ``rejection_reason(request, kv)``, its answers checked by
    :func:`check_rejection` (both engines call it on arrival), or ``default`` when it has none."""
    hook = getattr(scheduler, "rejection_reason", None)
    if hook is None:
        return default

    def reason_of(request, kv):
        return check_rejection(request, hook(request, kv), scheduler)

    reason_of.scheduler = scheduler  # (Speculation.rejection_reason asks how it prefills a prompt)
    return reason_of


def limit_hook(scheduler):
    """The scheduler's optional ``limit_request(request, kv)`` with its answers checked by
    :func:`check_limited` (both engines call it on arrival), or None when it has none."""
    hook = getattr(scheduler, "limit_request", None)
    if hook is None:
        return None

    def limited(request, kv):
        return check_limited(scheduler, request, hook(request, kv))

    return limited


#: What ``limit_request`` may not change of a request: everything but ``max_tokens`` (lowered) and
#: ``priority`` (a policy may rank requests as they arrive) -- its id, when it was sent and arrived,
#: its prompt and answer (the conformance kit's ``check_run`` checks these in a run's results), its
#: client, class, shared prefix, block hashes and timeout (a copy rebuilt from the first few fields
#: dropped the rest silently; audit s57).
KEPT_BY_LIMIT = tuple(f.name for f in attrs.fields(Request) if f.name not in ("max_tokens", "priority"))


def check_limited(scheduler, request, served):
    """``served``, what ``scheduler.limit_request`` returned for ``request``, if it is ``request`` as
    served: a :class:`~schedlab.model.Request` differing at most in a ``max_tokens`` no higher
    (``max_model_len``); else :class:`SimulationError` naming the scheduler. A ``None`` (a
    forgotten ``return``) failed far away; a moved arrival or a new prompt ran to the end with
    exit 0, though the kit calls them violations."""
    if served is request:
        return served
    who = f"scheduler {type(scheduler).__name__}'s limit_request"
    if not isinstance(served, Request):
        raise SimulationError(f"{who} returned {brief(served)} ({type(served).__name__}) for request {request.id}; "
                              "it returns the request as served: the Request it got, or a copy with a lower max_tokens")
    for name in KEPT_BY_LIMIT:
        if getattr(served, name) != getattr(request, name):
            raise SimulationError(
                f"{who} changed request {request.id}'s {name} from {getattr(request, name)!r} to "
                f"{getattr(served, name)!r}; it may lower max_tokens and set a priority, nothing else "
                "(attrs.evolve(request, max_tokens=...) keeps the rest)")
    if served.max_output_tokens > request.max_output_tokens:
        raise SimulationError(
            f"{who} raised request {request.id}'s max_tokens from {request.max_output_tokens} to "
            f"{served.max_output_tokens}; it may lower max_tokens, never raise it")
    return served


# A previously preempted request's re-admission finds its own blocks again: vLLM 0.33 keeps it out of
# ``vllm:prefix_cache_queries/hits`` (``PrefixCacheStats.record(preempted=num_preemptions > 0)``) and
# SGLang out of its ``cache_hit_rate`` (``retracted_stain``: ``reprocessed_log_*``); both engines
# count those admissions in ``prefix_preempted_*`` instead (the host tier's share of their hits too).


def host_share(blocks: int, hit: int, block_size: int) -> int:
    """The tokens of a prefix hit of ``hit`` tokens that ``blocks`` loaded from the host tier
    bring: the hit's blocks found on the GPU count whole, the host tier gets the rest. (Only a
    hit cached when freed, TGI's whole-input hit of ``num_tokens - 1``, ends inside a block it
    references: its recomputed last token is no hit, and is taken off the host tier's share.)"""
    gpu = (-(-hit // block_size) - blocks) * block_size
    return hit - min(hit, max(gpu, 0))


def swapped_blocks(kv, seq, tokens: int) -> int:
    """The blocks ``kv`` moved in swapping ``seq`` out (or, asked before a swap-in, back in): its
    ``swapped_blocks(seq)`` where it has one -- the built-in caches' count of what ``swap_out``
    moved and ``swap_transfer_ms`` was charged for, the step's pending slot and a window model's
    window blocks included -- else the blocks of the ``tokens`` swapped (``kv_state`` is the
    cache's own: the engines do not read it)."""
    count = getattr(kv, "swapped_blocks", None)
    return int(count(seq)) if callable(count) else -(-tokens // kv.block_size)


def prefix_hits(kv):
    """How the engines ask ``kv`` for a waiting sequence's prefix hit: None when the cache declares
    ``prefix_caching = False`` (its hits are always 0: never asked), else a function of the
    sequence giving its ``cached_tokens`` checked by :func:`check_hit` (``prefix_caching = True``,
    or a cache that declares nothing, whose hits must then be 0). Both engines read hits so."""
    declared = getattr(kv, "prefix_caching", None)
    if declared is not None and not declared:
        return None
    declared = declared is not None

    def hit_of(seq) -> int:
        return check_hit(kv, seq, kv.cached_tokens(seq), declared)

    return hit_of


def check_hit(kv, seq, hit, declared: bool = True) -> int:
    """``hit``, what ``kv.cached_tokens(seq)`` answered, if it is a whole number of tokens from 0 to
    ``seq.num_tokens - 1`` (the last token is always computed) -- and 0 from a cache that does not
    declare ``prefix_caching = True`` (``declared``); else :class:`SimulationError` naming the cache.
    A negative hit ran on with the prompt computed twice over, one past the prompt was blamed on the
    scheduler, text failed in a scheduler's arithmetic, and an undeclared cache's hits were used by
    one engine and not the other. A sequence never scheduled before can hit only whole blocks of
    its request's shared prefix (:attr:`~schedlab.model.Request.shared_prefix_tokens`): schedlab's
    requests have no tokens, so nothing else can be another request's (a cache that shared the
    block past a system prompt's end ran on with hits no server would find) -- or of its own
    input, where the cache put that there before the request ran and says so (its optional
    ``input_cached_before_run(seq)``, tokens: TGI's radix allocator caches an allocation dropped
    before its prefill ran, :meth:`~schedlab_plugins.kv_caches.PrefixKVCache.give_back`)."""
    if hit.__class__ is int and 0 <= hit < seq.num_tokens and (declared or not hit) and (
            not hit or seq.first_scheduled_ms >= 0 or hit <= _shared_blocks(kv, seq)
            or hit <= _input_cached_before_run(kv, seq)):
        return hit
    who, rid, most = f"KV cache {type(kv).__name__}'s cached_tokens", seq.request.id, seq.num_tokens - 1
    try:
        whole = -1 if isinstance(hit, bool) else operator.index(hit)
    except TypeError:
        whole = None
    if whole is None or isinstance(hit, bool):
        raise SimulationError(f"{who} returned {brief(hit)} ({type(hit).__name__}) for request {rid}; it answers a "
                              f"whole number of tokens, from 0 to {most} (the sequence's num_tokens - 1)")
    if not 0 <= whole <= most:
        raise SimulationError(f"{who} returned {whole} for request {rid}, which has {most + 1} tokens; a hit is from 0 "
                              "to num_tokens - 1 (the last token is always computed)")
    if whole and not declared:
        raise SimulationError(
            f"{who} returned {whole} for request {rid}, but the cache does not declare prefix_caching = True; a cache "
            "that reuses prefixes sets that attribute (the KVCache protocol: schedlab/protocols.py), for the engines "
            "and schedulers to use its hits")
    own = _input_cached_before_run(kv, seq) if whole and seq.first_scheduled_ms < 0 else 0
    if whole and seq.first_scheduled_ms < 0 and whole > max(_shared_blocks(kv, seq), own):
        also = f", and {own} tokens of its own input cached before it ran" if own else ""
        raise SimulationError(
            f"{who} returned {whole} for request {rid}, never scheduled before, whose shared prefix is "
            f"{seq.request.shared_prefix_tokens} tokens ({_shared_blocks(kv, seq)} in whole blocks of {kv.block_size})"
            f"{also}; a request's first hit is within the prefix it declares (prefix_group and prefix_tokens, "
            "block_hashes): any later block is its own")
    return whole


def _shared_blocks(kv, seq) -> int:
    """Tokens of ``seq``'s shared prefix in whole blocks of ``kv``: the most its first hit may be,
    unless :func:`_input_cached_before_run` says more."""
    block_size = kv.block_size
    return seq.request.shared_prefix_tokens // block_size * block_size


def _input_cached_before_run(kv, seq) -> int:
    """Tokens of ``seq``'s own input ``kv`` says it cached before ``seq`` ever ran (its optional
    ``input_cached_before_run(seq)``; 0 without one, or for an answer that is not a whole number):
    the most its first hit may be past its shared prefix (:func:`check_hit`)."""
    told = getattr(kv, "input_cached_before_run", None)
    if told is None:
        return 0
    own = told(seq)
    return own if own.__class__ is int and own > 0 else 0


def refusal(kv, answer) -> bool:
    """False, when ``answer`` -- what ``kv.allocate`` returned, falsy -- is a refusal; an
    :class:`SimulationError` naming the cache for a ``None`` (a forgotten ``return True``: the
    blocks are taken, yet the engines read a refusal and the run stalled blaming no one). Called
    on the refused path only, so an admission that fits costs nothing more."""
    if answer is None:
        raise SimulationError(f"KV cache {type(kv).__name__}'s allocate returned None; it returns True when it made "
                              "room, False (changing nothing) when the blocks are not free")
    return False


def received_rejection_hook(scheduler, default):
    """:func:`rejection_hook` for a disaggregated decode instance, which receives the prompt's KV
    computed: a scheduler whose ``rejection_reason`` takes ``received`` is told so (the prompt's
    prefill does not count: with sliding-window layers it holds more blocks than decoding does)."""
    hook = getattr(scheduler, "rejection_reason", None)
    if hook is None:
        return default
    try:
        takes = "received" in inspect.signature(hook).parameters
    except (TypeError, ValueError):  # (a callable whose signature cannot be read)
        takes = False
    if not takes:
        reason_of = rejection_hook(scheduler, default)
        if reason_of is not default:  # (no prefill step here: none of its lookahead slots to count)
            reason_of.scheduler = None
        return reason_of

    def reason_of(request, kv):
        return check_rejection(request, hook(request, kv, received=True), scheduler)

    return reason_of


def ask_scheduler(scheduler, plan) -> None:
    """``scheduler.schedule(plan)``, as every engine asks it: its answer must be None
    (:func:`schedule_returned`), and then the plan is closed to it (:func:`close`)."""
    returned = scheduler.schedule(plan)
    if returned is not None:
        raise schedule_returned(returned, scheduler)
    close(plan)


#: The Plan protocol's actions: what a scheduler does to a plan, only within the schedule() call given it.
ACTIONS = ("admit", "prefill", "decode", "decode_all", "skip_decode", "preempt", "requeue", "reject", "swap_out",
           "swap_in", "wake_at", "wake_after", "overshoot")


def close(plan) -> None:
    """Refuse the Plan protocol's actions on ``plan`` from now on: a scheduler that kept the plan of
    an earlier iteration and called ``old_plan.decode_all()`` in a later one was ignored by the
    engine, and the run ended in a stall blamed on empty plans. The plan's class becomes a
    subclass whose actions raise (no cost to the engines' own reading of it)."""
    plan.__class__ = _closed(type(plan))


@functools.cache
def _closed(cls: type) -> type:
    """``cls`` with the Plan protocol's actions refused (one class per plan class)."""
    def refused(name):
        def action(self, *args, **kwargs):
            raise SimulationError(f"the scheduler called {name}() on the plan of an earlier iteration (plan "
                                  f"{self.serial}): a scheduler acts on the plan schedule() is given, within that call")
        return action

    return type(f"Closed{cls.__name__}", (cls,), {
        "__slots__": (), "__doc__": f"A {cls.__name__} whose iteration is planned (:func:`close`).",
        **{name: refused(name) for name in ACTIONS if hasattr(cls, name)}})


#: KVCache methods that change the cache. The engines call them (a Plan action, a request that
#: finishes); a scheduler reads the cache and changes it only through the plan's actions.
KV_CHANGES = ("allocate", "allocate_decodes", "free", "discard", "free_swapped", "swap_out", "swap_in", "grow",
              "reset_prefix_cache")


def kv_for(scheduler, kv):
    """The KV cache as ``scheduler``'s plans show it (``plan.kv``): the cache itself to a built-in
    scheduler, a :class:`SchedulerKV` to any other. A third-party scheduler that called
    ``plan.kv.free(seq)`` on a running request freed its blocks twice (once more when it finished),
    and the run stopped at its end blaming the built-in cache."""
    if (type(scheduler).__module__ or "").partition(".")[0] in ("schedlab", "schedlab_plugins"):
        return kv
    return SchedulerKV(kv)


class SchedulerKV:
    """A KV cache as a third-party scheduler sees it: every read passes through, and
    ``isinstance`` sees the cache's class; calling a method that changes the cache
    (:data:`KV_CHANGES`) raises, naming the Plan action to use instead."""

    __slots__ = ("_kv",)

    def __init__(self, kv):
        object.__setattr__(self, "_kv", kv)

    @property
    def __class__(self):  # (isinstance(plan.kv, PagedKVCache) answers as for the cache)
        return type(self._kv)

    def __getattr__(self, name):
        found = getattr(self._kv, name)
        if name in KV_CHANGES and callable(found):
            return functools.partial(_kv_change_refused, name)
        return found

    def __setattr__(self, name, value):
        setattr(self._kv, name, value)

    def __repr__(self):
        return repr(self._kv)


def _kv_change_refused(name, *args, **kwargs):
    instead = {"free": "plan.preempt(seq) to take a running request's blocks back; the engine frees a request's "
                       "blocks when it finishes",
               "swap_out": "plan.swap_out(seq)", "swap_in": "plan.swap_in(seq)"}.get(
                   name, "plan.admit / plan.prefill / plan.decode, which take the blocks they need")
    raise SimulationError(f"the scheduler called plan.kv.{name}(): a scheduler reads the KV cache and changes it "
                          f"only through the plan's actions -- {instead}")


def admit_count_error(seq, num_tokens: int, hit: int) -> SimulationError:
    """The error for ``admit(seq, num_tokens)`` outside 1 .. the tokens left after the cached
    prefix ``hit`` (both engines): with a hit, why there are fewer and what to ask for."""
    left = seq.num_tokens - hit
    why = (f" ({seq.num_tokens} tokens, {hit} of them a cached prefix: admit seq.num_tokens - "
           "plan.cached_tokens(seq) at most)") if hit and num_tokens > left else ""
    return SimulationError(f"admit(): request {seq.request.id} has {left} tokens to compute{why}, scheduler asked "
                           f"for {num_tokens}")


def schedule_returned(result, scheduler=None) -> SimulationError:
    """The error for a scheduler's ``schedule(plan)`` that returned ``result``, not None (the engines
    test just that after each call): a scheduler fills in the plan it is given; what it returned
    would be dropped, and the run stall with its plans empty."""
    who = f"scheduler {type(scheduler).__name__}: " if scheduler is not None else ""
    return SimulationError(f"{who}schedule() returned {brief(result)} ({type(result).__name__}): a scheduler fills in "
                           "the plan it is given (plan.admit, plan.decode_all, ...) and returns None")


def model_len_limit(scheduler, kv) -> int:
    """The longest sequence ``scheduler`` serves with ``kv`` (0: no limit): its optional
    ``max_model_len_for(kv)`` (``"auto"`` resolved), else its config's ``max_model_len``."""
    resolve = getattr(scheduler, "max_model_len_for", None)
    longest = resolve(kv) if resolve is not None else getattr(getattr(scheduler, "config", None), "max_model_len", 0)
    return longest if isinstance(longest, int) and longest > 0 else 0


def capped_slots(slots: int, seq, longest: int, least: int) -> int:
    """A decode's or chunk's KV ``slots`` past ``seq``'s computed tokens, at most up to
    ``longest`` (0: no limit) but never below ``least``: vLLM's ``allocate_slots`` takes no slot
    past ``max_model_len``, its drafts' and lookahead's included."""
    if longest and seq.num_computed_tokens + slots > longest:
        room = longest - seq.num_computed_tokens
        return room if room > least else least
    return slots


def capped_verify(n: int, seq, longest: int, phantom: int) -> int:
    """The tokens a decode of ``seq`` may verify, ``n`` at most, that keep its input positions
    within ``longest`` (0: no limit), ``phantom`` positions in flight counted as computed: vLLM
    0.33's ``Scheduler.schedule`` (``max_model_len - num_computed_tokens - 1``; with speculation
    only). 0 or less: none (vLLM skips the request in this step)."""
    if longest:
        room = longest - seq.num_computed_tokens - phantom - 1
        if room < n:
            return room
    return n


class FastPlan:
    """One iteration under construction (see the Plan protocol for each method's contract)."""

    __slots__ = (
        "_inst", "_cache", "serial", "now", "kv", "waiting", "decodes_all", "decoded", "prefills", "admitted",
        "_preempted", "swapped_in", "transfer_ms", "wake", "wake_steps", "_tokens", "skipped_decode",
        "spec_k", "spec_slots", "spec_override", "dropped", "overshoots", "draft_input_slots",
        "padded", "admission_padding", "overshoot_drafts", "refusals", "longest",
    )

    def __init__(self, inst: "Instance", serial: int):
        self._inst = inst
        self.serial = serial
        self.now = inst.now
        self._cache = inst.kv
        self.kv = inst.plan_kv     # (kv_for: the cache, or a view of it to a third-party scheduler)
        self.waiting = inst.waiting
        self.decodes_all = False        # every decoding sequence decodes (decode_all)
        self.decoded: list = []         # or only these (decode(seq)); the others are parked
        self.prefills: list = []        # (seq, tokens) in scheduling order
        self.admitted: list = []
        self._preempted: list = []
        self.swapped_in: list = []
        self.transfer_ms = 0.0
        self.wake = None
        self.wake_steps = None
        self._tokens = 0
        self.skipped_decode = False
        self.refusals = Refusals()
        spec = inst.spec
        self.spec_k = inst.spec_k if spec is not None else 0          # drafts each decode verifies
        self.spec_slots = 1 + self.spec_k + spec.lookahead if spec is not None else 1  # KV slots a decode takes
        self.spec_override = None  # {seq: (drafts, slots)} for decodes that differ from that
        self.draft_input_slots = spec.draft_input_slots if spec is not None else 0
        self.admission_padding = spec.admission_padding if spec is not None else 0
        self.longest = inst.longest  # speculation's KV slots stay within max_model_len (0: no limit)
        self.padded = None         # {seq: placeholder drafts} of admissions padded (admit(padding=...))
        self.dropped = ()          # a pipeline's (seq, tokens) chunks of prompts preempted since the launch
        self.overshoots = ()       # finished sequences decoded once more, their token discarded (overshoot)
        self.overshoot_drafts = None  # {seq: drafts} of overshoots verifying drafts (speculation)

    # -- reading the state -----------------------------------------------------------------
    @property
    def running(self) -> RunningView:
        return self._inst.running_view

    @property
    def prefilling(self) -> list:
        return list(self._inst.prefilling)

    @property
    def swapped(self) -> list:
        return list(self._inst.swapped)

    @property
    def has_prefilling(self) -> bool:
        return bool(self._inst.prefilling)

    @property
    def has_swapped(self) -> bool:
        return bool(self._inst.swapped)

    @property
    def num_decoding(self) -> int:
        return self._inst.n_decoding

    @property
    def num_held(self) -> int:
        holds = self._inst.holds
        return len(holds) if holds is not None else 0

    @property
    def num_scheduled_tokens(self) -> int:
        return self._tokens

    @property
    def num_scheduled_seqs(self) -> int:
        decoding = self._inst.n_decoding if self.decodes_all else len(self.decoded)
        return decoding + len(self.prefills) + len(self.overshoots)

    @property
    def preempted(self) -> list:
        return self._preempted

    @property
    def decode_steps(self) -> int:
        """Decode iterations this instance has run (a clock for lazy per-sequence accounting)."""
        return self._inst.clock.steps

    @property
    def spec_tokens(self) -> int:
        spec = self._inst.spec
        return spec.k_max if spec is not None and spec.per_request else self.spec_k

    def drafts_for(self, seq) -> int:
        k = seq.draft_k  # (set with drafts per batch size only)
        return k if k >= 0 else self.spec_k

    def drafts_of(self, seq) -> tuple[int, int]:
        """(draft tokens, KV slots) of a decode in this iteration."""
        override = self.spec_override
        if override is not None:
            got = override.get(seq)
            if got is not None:
                return got
        return self.spec_k, self.spec_slots

    @property
    def made_ahead(self) -> bool:
        ahead = self._inst.ahead
        return ahead is not None and ahead.planning

    def token_in_flight(self, seq) -> bool:
        inst = self._inst
        ahead = inst.ahead
        return ahead is not None and ahead.planning and (
            seq in ahead.held or (inst.marks.got_token(seq, seq.status == DECODING) and seq not in ahead.ghosts))

    def unseen_finish(self, seq) -> bool:
        ahead = self._inst.ahead
        return ahead is not None and ahead.planning and unseen_finish(ahead, seq)

    def overshoot(self, seq, num_tokens: int | None = None) -> bool:
        if seq in self.overshoots:
            return True
        k = self.drafts_for(seq)
        n = 1 if num_tokens is None else num_tokens
        if not 1 <= n <= 1 + k:
            raise SimulationError(f"overshoot(): request {seq.request.id} may verify 1 to {1 + k} tokens in this "
                                  f"iteration, scheduler asked for {n}")
        spec = self._inst.spec
        if not overshoot_slot(self._cache, self._inst.ahead, seq, n, spec.lookahead if spec is not None else 0,
                              self.longest):
            return False
        self.overshoots = (*self.overshoots, seq)
        self._tokens += n
        if n > 1:
            self.add_overshoot_drafts(seq, n - 1)
        return True

    def add_overshoot_drafts(self, seq, drafts: int) -> None:
        """``seq``, an overshoot, verifies ``drafts`` drafts (computed for nothing too)."""
        if self.overshoot_drafts is None:
            self.overshoot_drafts = {}
        self.overshoot_drafts[seq] = drafts

    def overshoot_tokens(self, seq) -> int:
        """The tokens overshoot ``seq`` computes: its own and its drafts."""
        drafts = self.overshoot_drafts
        return 1 + drafts.get(seq, 0) if drafts else 1

    def phantom(self, seq) -> int:
        """Positions of ``seq`` that this plan, made ahead, counts as computed and the batch in
        progress did not compute (:attr:`schedlab.engine.ahead.Ahead.phantom`)."""
        inst = self._inst
        if inst.stagger is not None:  # planning ahead on a pipeline: its tokens in flight
            return inst.in_flight.get(seq, 0)
        ahead = inst.ahead
        if ahead is None or not ahead.planning or not ahead.phantom:
            return 0
        return ahead.phantom.get(seq, 0)

    def is_scheduled(self, seq) -> bool:
        return seq.plan_mark == self.serial or (self.decodes_all and seq.status == DECODING)

    def is_empty(self) -> bool:
        return not self._tokens and not self.swapped_in and self.transfer_ms == 0.0

    def is_decode_only(self) -> bool:
        return (self.decodes_all and not self.prefills and not self.swapped_in and not self._preempted
                and self.transfer_ms == 0.0 and not self.overshoots)

    @property
    def partial_decode(self) -> bool:
        """Some decoding sequences decode this iteration and others do not."""
        return bool(self.decoded) and not self.decodes_all

    # -- actions ------------------------------------------------------------------------------
    def _claim(self, seq, what: str) -> None:
        if seq.plan_mark == self.serial:
            raise SimulationError(f"scheduler {what} request {seq.request.id} twice in one iteration")
        seq.plan_mark = self.serial

    def decode_all(self) -> bool:
        if self.decodes_all:
            return True
        if self.skipped_decode:
            raise SimulationError("scheduler called decode_all() after skip_decode() in the same iteration")
        inst = self._inst
        if (inst.spec is not None and not self.decoded and inst.kv_grows and not inst.spec.per_request
                and not (self.longest and inst.spec_near_limit(self.spec_slots, self._phantoms(), self.longest))):
            # Speculation: the engine works out every decoder's new blocks and takes them at once.
            phantom = self._phantoms()
            need = inst.spec_blocks_needed(self.spec_slots, phantom) if inst.n_decoding else 0
            if need:
                if need > self._cache.num_free_blocks():
                    return False
                self._cache.grow(need)
            for seq, extra in phantom.items():
                self._override(seq, self.spec_k, self.spec_slots + extra)
            self.decodes_all = True
            self._tokens += inst.n_decoding * (1 + self.spec_k)
            return True
        if self.decoded or inst.spec is not None or inst.stagger is not None:
            # Some already decode one by one (or a cache without grow, or tokens in flight):
            # allocate for the rest, all or nothing.
            rest = [s for s in inst.running if s.status == DECODING and s.plan_mark != self.serial]
            slots, k = self.spec_slots, self.spec_k
            phantom = self._phantoms()
            # (drafts per batch size: a decode's own drafts take their slots, more or fewer than k)
            own = {s: self.drafts_for(s) for s in rest} if inst.spec is not None and inst.spec.per_request else None
            extras = {s: phantom.get(s, 0) + (own[s] - k if own else 0) for s in rest}
            longest = self.longest
            if longest:  # (drafts and slots near max_model_len: capped_verify, capped_slots)
                lookahead = slots - 1 - k
                for s in rest:
                    drafts = own[s] if own else k
                    n = max(1, capped_verify(1 + drafts, s, longest, phantom.get(s, 0)))
                    took = capped_slots(n + lookahead + phantom.get(s, 0), s, longest, n + phantom.get(s, 0))
                    extras[s] = took - slots
                    if own is None:
                        own = dict.fromkeys(rest, k)
                    own[s] = n - 1
            if sum(self._cache.blocks_needed(s, slots + extras[s]) for s in rest) > self._cache.num_free_blocks():
                return False
            for s in rest:
                extra = extras[s]
                if not self._cache.allocate(s, slots + extra):
                    raise refused_slot(self._cache)
                drafts = own[s] if own else k
                if extra or drafts != k:
                    self._override(s, drafts, slots + extra)
            self.decoded = []
            self.decodes_all = True
            self._tokens += sum(own.values()) + len(rest) if own else len(rest) * (1 + k)
            return True
        if inst.n_decoding:
            if inst.kv_grows:
                need = inst.cross_at[inst.clock.steps % len(inst.cross_at)]
                if need:
                    if need > self._cache.num_free_blocks():
                        return False
                    self._cache.grow(need)
            elif not inst.allocate_each_decode():
                return False
        self.decodes_all = True
        self._tokens += inst.n_decoding
        return True

    def decode(self, seq, num_tokens: int | None = None) -> bool:
        if seq.status != DECODING:
            raise SimulationError(f"decode(): request {seq.request.id} is {seq.status}, not decoding")
        if self.skipped_decode:
            raise SimulationError("scheduler called decode() after skip_decode() in the same iteration")
        if self.is_scheduled(seq):
            raise SimulationError(f"decode(): request {seq.request.id} is already in this iteration")
        k = self.drafts_for(seq)
        if num_tokens is not None and num_tokens.__class__ is not int:  # (an int passes at once: a hot path)
            check_counts("decode", seq, num_tokens=num_tokens)
        if num_tokens is None:
            num_tokens = 1 + k
        elif not 1 <= num_tokens <= 1 + k:
            raise SimulationError(f"decode(): request {seq.request.id} may verify 1 to {1 + k} tokens in this "
                                  f"iteration, scheduler asked for {num_tokens}")
        extra = self.phantom(seq)
        slots = self.spec_slots - self.spec_k - 1 + num_tokens + extra
        if self.longest:
            slots = capped_slots(slots, seq, self.longest, num_tokens + extra)
        allocated = self._cache.allocate(seq, slots)
        if not allocated:
            return refusal(self._cache, allocated)
        seq.plan_mark = self.serial
        self.decoded.append(seq)
        self._tokens += num_tokens
        if num_tokens != 1 + self.spec_k or slots != self.spec_slots:
            self._override(seq, num_tokens - 1, slots)
        return True

    def _phantoms(self) -> dict:
        """:meth:`phantom` of every decoding sequence that has some (planning ahead)."""
        inst = self._inst
        if inst.stagger is not None:  # planning ahead on a pipeline: tokens in flight
            return {s: n for s, n in inst.in_flight.items() if s.status == DECODING}
        ahead = inst.ahead
        if ahead is None or not ahead.planning or not ahead.phantom:
            return {}
        return {s: n for s, n in ahead.phantom.items() if s.status == DECODING}

    def _override(self, seq, drafts: int, slots: int) -> None:
        if self.spec_override is None:
            self.spec_override = {}
        self.spec_override[seq] = (drafts, slots)

    def skip_decode(self) -> None:
        if self.decodes_all or self.decoded:
            raise SimulationError("scheduler called skip_decode() after decode_all() in the same iteration")
        self.skipped_decode = True

    def cached_tokens(self, seq) -> int:
        hit_of = self._inst.prefix_hit
        if hit_of is None:
            return 0
        key = (self.serial, getattr(self._cache, "epoch", 0))  # the cache's contents may change within a plan
        memo_key, hit = seq.hit_memo
        if memo_key != key:
            hit = hit_of(seq)
            seq.hit_memo = (key, hit)
        return hit

    def admit(self, seq, num_tokens: int, *, reserve: bool = False, reserve_tokens: int = 0,
              padding: int = 0) -> bool:
        if seq.status != WAITING:
            raise SimulationError(f"admit(): request {seq.request.id} is {seq.status}, not waiting")
        if not num_tokens.__class__ is reserve_tokens.__class__ is padding.__class__ is int:
            check_counts("admit", seq, num_tokens=num_tokens, reserve_tokens=reserve_tokens, padding=padding)
        hit = self.cached_tokens(seq)
        left = seq.num_tokens - hit
        if not 1 <= num_tokens <= left:
            raise admit_count_error(seq, num_tokens, hit)
        if padding and not (0 < padding <= self.admission_padding and num_tokens == left):
            raise SimulationError(f"admit(): request {seq.request.id}: padding {padding} needs speculation "
                                  f"(at most {self.admission_padding} placeholder drafts) and the whole prompt")
        most = seq.prompt + seq.request.max_output_tokens
        if reserve_tokens:
            segment = self._inst.answer_segment  # (requeued when it has them: Scheduler.answer_segment)
            least = min(most - 1, seq.num_tokens + segment - 1) if segment else most - 1
            if reserve_tokens < least:
                raise SimulationError(f"admit(): request {seq.request.id} may compute {least} tokens, "
                                      f"scheduler reserved {reserve_tokens}")
        elif reserve:
            reserve_tokens = most
        spec = self._inst.spec
        if spec is not None:
            if reserve_tokens:
                reserve_tokens += spec.slack_for(seq.request)  # the last step's drafts and lookahead slots
            slots = hit + num_tokens + padding + spec.lookahead
            if reserve_tokens < slots and (padding or spec.lookahead):
                reserve_tokens = slots  # (see prefill)
            if self.longest and reserve_tokens > self.longest:  # (see capped_slots)
                reserve_tokens = max(self.longest, hit + num_tokens + padding)
        host = self._inst.host_tier
        loaded = host.loaded if host is not None else 0
        allocated = self._cache.allocate(seq, num_tokens, cached_tokens=hit, reserve_tokens=reserve_tokens)
        if not allocated:
            return refusal(self._cache, allocated) or self.refusals.refuse(seq)
        self._claim(seq, "admitted")
        self._inst.on_admit(seq, hit, reserve_tokens)
        if host is not None and host.loaded != loaded:  # part of the hit comes back from host memory
            self.transfer_ms += self._inst.host_load(host.loaded - loaded, seq, hit)
        self.admitted.append(seq)
        self.prefills.append((seq, num_tokens))
        self._tokens += num_tokens + padding
        if padding:
            if self.padded is None:
                self.padded = {}
            self.padded[seq] = padding
            # vLLM counts them as drafts verified, all rejected (scheduled_spec_decode_tokens of -1s)
            counters = self._inst.counters
            counters["spec_drafts"] += 1
            counters["spec_draft_tokens"] += padding
            counters["spec_padded_drafts"] += 1
            counters["spec_padded_tokens"] += padding
        return True

    def prefill(self, seq, num_tokens: int) -> bool:
        if seq.status != PREFILLING:
            raise SimulationError(f"prefill(): request {seq.request.id} is {seq.status}, not prefilling")
        if num_tokens.__class__ is not int:
            check_counts("prefill", seq, num_tokens=num_tokens)
        left = seq.num_tokens - seq.num_computed_tokens
        if not 1 <= num_tokens <= left:
            raise SimulationError(
                f"prefill(): request {seq.request.id} has {left} tokens left, scheduler asked for {num_tokens}")
        if seq.plan_mark == self.serial:
            raise SimulationError(f"prefill(): request {seq.request.id} is already in this iteration")
        spec = self._inst.spec
        if spec is not None and spec.lookahead:
            # a drafter writing KV past the step's tokens takes its lookahead slots with a prompt
            # chunk too (vLLM allocate_slots(..., num_lookahead_tokens)); they stay reserved
            slots = seq.num_computed_tokens + capped_slots(num_tokens + spec.lookahead, seq, self.longest, num_tokens)
            allocated = self._cache.allocate(seq, num_tokens, reserve_tokens=slots)
            if not allocated:
                return refusal(self._cache, allocated)
            if slots > seq.reserved_tokens:
                seq.reserved_tokens = slots
        else:
            allocated = self._cache.allocate(seq, num_tokens)
            if not allocated:
                return refusal(self._cache, allocated)
        seq.plan_mark = self.serial
        self.prefills.append((seq, num_tokens))
        self._tokens += num_tokens
        return True

    def _pending(self, seq, what: str) -> int:
        """Token slots of ``seq`` whose KV this iteration has allocated but not computed yet."""
        if seq.plan_mark != self.serial:
            return self.drafts_of(seq)[1] if self.decodes_all and seq.status == DECODING else 0
        if seq in self.admitted or seq in self.swapped_in:
            raise SimulationError(f"{what}(): request {seq.request.id} joined this iteration")
        if seq.status == DECODING:
            return self.drafts_of(seq)[1]
        return next(n for s, n in self.prefills if s is seq)

    def _unschedule(self, seq, pending: int, decoding: bool) -> None:
        """Take ``seq``'s work out of this iteration (it is being preempted; ``decoding``: it
        was a decode, whatever its status is now)."""
        if not pending:
            return
        if decoding:
            self._tokens -= 1 + self.drafts_of(seq)[0]
            if self.spec_override is not None:
                self.spec_override.pop(seq, None)
        else:
            self._tokens -= pending
        if seq.plan_mark == self.serial:
            seq.plan_mark = -1
            if decoding:
                if seq in self.decoded:  # (decode_all() after decode() empties the list)
                    self.decoded.remove(seq)
            else:
                self.prefills = [(s, n) for s, n in self.prefills if s is not seq]

    def preempt(self, seq, *, discard_in_flight: bool = False) -> None:
        ahead = self._inst.ahead
        if discard_in_flight and self.token_in_flight(seq) and seq not in ahead.ghosts:
            if seq not in ahead.held:
                self.preempt(seq)
                self._inst.discard_token(seq)
                return
            if seq in ahead.doomed and self._inst.to_finish is not None and seq not in self.overshoots:
                self._inst.requeue_doomed(seq)  # (its abort waits for its next run, as SGLang's to_finish)
                self._preempted.append(seq)
                return
            if seq not in ahead.doomed and seq not in self.overshoots and not self._inst.track_finished:
                self._inst.unfinish_held(seq)  # (finished in flight: its last token computed again)
                self._preempted.append(seq)
                return
        if ahead is not None and seq in ahead.held:  # finished, its slot held (engine.ahead)
            if seq in self.overshoots:  # its decode once more goes with it
                self._tokens -= self.overshoot_tokens(seq)
                self.overshoots = tuple(s for s in self.overshoots if s is not seq)
                if self.overshoot_drafts:
                    self.overshoot_drafts.pop(seq, None)
            self._inst.preempt_held(seq)
            self._preempted.append(seq)
            return
        inst = self._inst
        if inst.stagger is not None and seq.status == DECODING and seq in inst.holds.flying:
            # planning ahead on a pipeline: shown to this plan (stages.Stagger), its token still in
            # flight; the slots this plan took for it go with the rest
            pending = self._pending(seq, "preempt")
            self._unschedule(seq, pending, True)
            inst._shift_decoder(seq, IN_FLIGHT)
            if seq._computed + pending > seq.reserved_tokens:
                seq.reserved_tokens = seq._computed + pending
            if pending:
                seq.cache_lag = 0  # (vLLM cached its tokens when it scheduled it)
        if seq.status == IN_FLIGHT and seq in self._inst.running:  # a pipeline's batch holds it (engine.stages)
            self._inst.preempt_recompute(seq)
            self._preempted.append(seq)
            return
        if seq.status not in (PREFILLING, DECODING):
            raise SimulationError(f"preempt(): request {seq.request.id} is {seq.status}, not running")
        pending = self._pending(seq, "preempt")
        self._unschedule(seq, pending, seq.status == DECODING)
        self._inst.preempt_recompute(seq, pending)
        self._preempted.append(seq)

    def requeue(self, seq) -> None:
        if self._inst.ahead is not None or self._inst.holds is not None:
            raise SimulationError("requeue() is not modelled with asynchronous scheduling or pipeline parallelism")
        if seq.status not in (PREFILLING, DECODING):
            raise SimulationError(f"requeue(): request {seq.request.id} is {seq.status}, not running")
        pending = self._pending(seq, "requeue")
        self._unschedule(seq, pending, seq.status == DECODING)
        self._inst.preempt_recompute(seq, pending, to_back=True)
        self._preempted.append(seq)

    def reject(self, seq, reason: str) -> None:
        if seq.status != WAITING or seq not in self.waiting:
            raise SimulationError(f"reject(): request {seq.request.id} is {seq.status}, not in the waiting queue")
        self._inst.reject_waiting(seq, check_reason(seq, reason))

    def swap_out(self, seq) -> bool:
        if seq.status != DECODING:
            raise SimulationError(f"swap_out(): request {seq.request.id} is {seq.status}; only decoding requests swap")
        pending = self._pending(seq, "swap_out")
        ms = self._inst.swap_out(seq, pending)
        if ms is None:
            return False
        self._unschedule(seq, pending, True)
        self.transfer_ms += ms
        self._preempted.append(seq)
        return True

    def swap_in(self, seq) -> bool:
        if seq.status != SWAPPED:
            raise SimulationError(f"swap_in(): request {seq.request.id} is {seq.status}, not swapped")
        if not self.decodes_all and not self.decode_all():
            return False
        ms = self._inst.swap_in(seq)
        if ms is None:
            return False
        seq.plan_mark = self.serial
        self.transfer_ms += ms
        self.swapped_in.append(seq)
        self._tokens += 1
        if self._inst.spec is not None:  # swap-in gave it one slot: it verifies no drafts this time
            self._override(seq, 0, 1)
        return True

    def wake_at(self, time_ms: float) -> None:
        check_wake(time_ms)
        if self.wake is None or time_ms < self.wake:
            self.wake = time_ms

    def wake_after(self, decode_steps: int) -> None:
        if decode_steps < 0:
            raise SimulationError(f"wake_after({decode_steps}): give a number of decode steps >= 0")
        if self.wake_steps is None or decode_steps < self.wake_steps:
            self.wake_steps = decode_steps
