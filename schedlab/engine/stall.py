"""What a stalled instance says, in both engines: where it stands, and the likeliest cause.

A stall is work left that nothing moves: a scheduler that plans nothing with requests waiting,
or one whose running requests wait for KV blocks that only a preemption would free. The message
names the instance, the time, the scheduler and the queues, and -- when the running requests'
next decode step does not fit in the free blocks -- says so, since a scheduler that does not
reserve a request's whole answer at admission must preempt when ``decode_all()`` returns False.
"""

from __future__ import annotations


def stall_message(engine, why: str) -> str:
    """The message for ``engine`` (an instance of either engine) stalled because of ``why``."""
    kv, scheduler = engine.kv, engine.scheduler
    running = list(engine.running)
    free = kv.num_free_blocks()
    text = (f"instance {engine.index} stalled at t={engine.now:.3f} ms ({why}): scheduler {type(scheduler).__name__}, "
            f"{len(engine.waiting)} waiting, {len(running)} running, {len(engine.swapped)} swapped, "
            f"{free}/{kv.num_blocks} KV blocks free")
    decoding = [s for s in running if s.status == "decoding"]
    need = sum(kv.blocks_needed(s, 1) for s in decoding)
    if decoding and need > free:
        text += (f"; the {len(decoding)} decoding requests' next step needs {need} new KV blocks, {free} free: a "
                 "scheduler whose admissions do not reserve the whole answer must preempt (plan.preempt) when "
                 "decode_all() returns False")
    hint = getattr(scheduler, "stall_hint", None)  # (the scheduler's own word on why, if it has one)
    return text + (f"; {hint}" if hint else "")
