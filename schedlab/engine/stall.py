"""What a stalled instance says, in both engines: where it stands, and the likeliest cause.

A stall is work left that nothing moves: a scheduler that plans nothing with requests waiting,
or one whose running requests wait for KV blocks that only a preemption would free. The message
names the instance, the time, the scheduler and the queues, and -- when the running requests'
next decode step does not fit in the free blocks -- says so, since a scheduler that does not
reserve a request's whole answer at admission must preempt when ``decode_all()`` returns False.

A KV cache that hands out more blocks than it has (its ``allocate()`` says yes past its
capacity) is caught where it happens, after each plan (:func:`check_kv_counts`), and a stall
with fewer than no blocks free says the cache may be the cause rather than the scheduler.
"""

from __future__ import annotations

import numbers

from ..errors import SimulationError, brief
from .sequence import ABORTED, FINISHED, REJECTED, WAITING
from .transfer import held_hint


def check_kv_counts(kv) -> None:
    """Raise :class:`SimulationError` blaming ``kv`` when it reports fewer than no free blocks, more
    used than it has, or used and free counts that do not add up to its blocks (``used + deferred +
    free - lent == num_blocks``, the KVCache protocol). Both engines call it once per plan, after
    the scheduler's allocations: left alone, such a cache ends in a stall that seems the
    scheduler's (it did not preempt), or draws a timeline of its wrong counts."""
    free = kv.num_free_blocks()
    used = kv.num_used_blocks()
    for name, value in (("num_free_blocks", free), ("num_used_blocks", used)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # (text failed on the comparison)
            raise SimulationError(f"KV cache {type(kv).__name__}'s {name}() returned {brief(value)} (a "
                                  f"{type(value).__name__}); it returns a whole number of blocks")
    if free < 0:
        raise SimulationError(f"KV cache {type(kv).__name__} reports {free} free blocks of {kv.num_blocks}: its "
                              "allocate() took more than it has")
    if used > kv.num_blocks:
        raise SimulationError(f"KV cache {type(kv).__name__} reports {used} used blocks of {kv.num_blocks}: its "
                              "allocate() took more than it has")
    if used + free == kv.num_blocks:  # (most caches, at once: a missing attribute's getattr costs a raise)
        return
    deferred, lent = getattr(kv, "deferred_blocks", 0), getattr(kv, "lent_blocks", 0)
    if used + deferred + free - lent != kv.num_blocks:  # (a used count stuck at 0 drew an empty timeline)
        parts = f"{used} used + {free} free" + (f" + {deferred} deferred" if deferred else "") + \
            (f" - {lent} lent" if lent else "")
        raise SimulationError(f"KV cache {type(kv).__name__} reports {parts} blocks, not the {kv.num_blocks} it has: "
                              "its used and free counts are not kept together (the KVCache protocol)")


def check_kv_released(instances) -> None:
    """Raise :class:`SimulationError` blaming an instance's KV cache that still reports blocks in use
    once every request has left the run (both engines call it once, at the end): its ``free()``
    leaked blocks, or (fewer than none) freed some twice -- the run's numbers would be wrong with
    exit 0. The conformance kit's ``check_run`` asks the same of a run (``num_used_blocks() ==
    0``: a prefix cache's cached blocks are free, not used)."""
    for inst in instances:
        kv = getattr(inst, "kv", None)
        used = kv.num_used_blocks() if kv is not None else 0
        if used:
            why = ("its free() released more than allocate() took (blocks freed twice?)" if used < 0
                   else "its free() did not release every block allocate() took (a leak)")
            raise SimulationError(f"KV cache {type(kv).__name__} reports {used} used blocks of {kv.num_blocks} once "
                                  f"every request has left the run: {why}; or the scheduler wrote a sequence's "
                                  "read-only fields (num_computed_tokens, reserved_tokens, ...), which the plan's "
                                  "actions keep")


def _whole_answer_hint(waiting, kv) -> str:
    """Nothing runs and a request waits: the first waiting request whose prompt + max_tokens
    exceeds the whole cache -- served a token at a time it fits (the engines' own rejection check
    counts one token less), but a scheduler that reserves the whole answer never admits it."""
    block_size = kv.block_size
    for seq in waiting:
        request = seq.request
        tokens = request.prompt_tokens + request.max_output_tokens
        need = -(-tokens // block_size)
        if need > kv.num_blocks:
            return (f"; request {request.id} needs {need} KV blocks for its prompt + max_tokens ({tokens} tokens), "
                    f"the cache has {kv.num_blocks}: a scheduler that reserves the whole answer never admits it -- "
                    "give it a rejection_reason(request, kv) that turns such a request away")
    return ""


def _held_back_hint(waiting, kv, free: int) -> str:
    """A cache with every block free and requests waiting that fit it: most likely the scheduler
    holds them back until a time it never named, so the engine never asks it again."""
    live = [s for s in waiting if getattr(s, "status", WAITING) not in (FINISHED, REJECTED, ABORTED)]
    if free != kv.num_blocks or not live:  # (a queue keeping what left the run is said below)
        return ""
    ids = [str(s.request.id) for s in live[:5] if hasattr(s, "request")]
    more = ", ..." if len(live) > 5 else ""
    return (f"; the cache is empty and request{'s' if len(live) != 1 else ''} {', '.join(ids)}{more} wait: a "
            "scheduler that holds requests back until some time must say when (plan.wake_at(time_ms) or "
            "plan.wake_after(decode_steps)), or the engine, with nothing else to happen, never asks it again")


def stall_message(engine, why: str) -> str:
    """The message for ``engine`` (an instance of either engine) stalled because of ``why``."""
    if not hasattr(engine, "scheduler"):  # (the reference engine behind its pipeline: ReferencePipeline.e)
        engine = engine.e
    kv, scheduler = engine.kv, engine.scheduler
    running = list(engine.running)
    free = kv.num_free_blocks()
    text = (f"instance {engine.index} stalled at t={engine.now:.3f} ms ({why}): scheduler {type(scheduler).__name__}, "
            f"{len(engine.waiting)} waiting, {len(running)} running, {len(engine.swapped)} swapped, "
            f"{free}/{kv.num_blocks} KV blocks free")
    decoding = [s for s in running if s.status == "decoding"]
    # a disaggregated prefill instance's blocks of prompts handed on, not yet pulled (not a leak)
    stage = getattr(engine, "stage", None) or getattr(engine, "role", None)
    held = getattr(stage, "held", 0) if hasattr(stage, "held_transfers") else 0
    need = sum(kv.blocks_needed(s, 1) for s in decoding)
    if free < 0:
        text += (f"; KV cache {type(kv).__name__} reports fewer than no free blocks: its allocate() may have taken "
                 "more than it has")
    elif not running and not engine.swapped and kv.num_used_blocks() > 0 and held:
        text += held_hint(kv.num_used_blocks(), held, stage.held_transfers(engine.index))
    elif not running and not engine.swapped and kv.num_used_blocks() > 0:
        text += (f"; KV cache {type(kv).__name__} reports {kv.num_used_blocks()} used blocks with no request running "
                 "or swapped out: its free() may not release every block allocate() took (a leak)")
    elif decoding and need > free:
        text += (f"; the {len(decoding)} decoding requests' next step needs {need} new KV blocks, {free} free: a "
                 "scheduler whose admissions do not reserve the whole answer must preempt (plan.preempt) when "
                 "decode_all() returns False")
    elif not running and not engine.swapped and len(engine.waiting):
        text += _whole_answer_hint(engine.waiting, kv) or _held_back_hint(engine.waiting, kv, free)
    left = sum(1 for s in engine.waiting if getattr(s, "status", WAITING) in (FINISHED, REJECTED, ABORTED))
    if left:  # (a queue whose remove() does nothing: the requests it shows are long done)
        text += (f"; {left} of the {len(engine.waiting)} in the waiting queue have left the run (finished, rejected "
                 "or aborted): the scheduler's waiting queue does not drop what its remove() is given")
    hint = getattr(scheduler, "stall_hint", None)  # (the scheduler's own word on why, if it has one)
    return text + (f"; {hint}" if hint else "")
