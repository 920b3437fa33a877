"""The KV block pool step for step: vLLM's ``BlockPool`` against schedlab's cache.

Per-request outcomes (:class:`.case.Outcome`) show a block miscounted only once it changes when a
request runs. With ``--kv-steps`` (on by default for cases with a window, ``window_tokens``) the
harness also writes down, after every ``schedule()`` that schedules tokens, on both sides:

* the time of the step (ms);
* the blocks in use -- vLLM: ``num_blocks`` less ``BlockPool.get_num_free_blocks()`` (its null
  block apart; cached blocks nobody references count as free on both sides); schedlab: the
  cache's ``num_used_blocks()`` after the plan (:class:`.schedlab_side.KvSteps`);
* the window blocks each request holds -- vLLM: the blocks but null ones in the request's block
  tables of the ``SlidingWindowManager`` groups (``req_to_blocks``: ``remove_skipped_blocks``
  nulls those that fell out of the window); schedlab: ``window_blocks(seq)``.

vLLM's side is taken after ``schedule()`` and before ``update_from_output()`` (which frees the
blocks of the requests that finish), schedlab's after the scheduler's plan, before the engine
runs it. The pools are compared on schedlab's ``reference`` engine whatever ``--engine`` says: the
fast engine runs decodes in bulk, a window's too, planning no iteration of such a run (its
outcomes are still compared on the engine asked for). The first step where they differ is the vLLM side's error text
(:func:`first_difference`), so it shows in the agreement table's ``error`` column and the
shrinker keeps it.
"""

from __future__ import annotations

from itertools import zip_longest

#: when to compare the pools: cases with a window, every case, or never
MODES = ("window", "all", "off")


def applies(mode: str, case) -> bool:
    """Whether ``mode`` compares the pools of ``case``."""
    return mode == "all" or (mode == "window" and case.settings.window is not None)


def _pool(step) -> str:
    _, used, window = step
    held = ", ".join(f"r{rid} {n}" for rid, n in window.items())
    return f"{used} in use" + (f" (window blocks: {held})" if held else "")


def _at(t) -> str:
    return f"{float(t):g} ms"


def first_difference(theirs: list, ours: list, label: str = "vLLM") -> str | None:
    """The first step where two lists of ``(time, blocks in use, {request: window blocks})``
    differ, as text (None: the same throughout)."""
    for k, (a, b) in enumerate(zip_longest(theirs, ours)):
        if a is None or b is None:
            more, n = (label, len(theirs)) if b is None else ("schedlab", len(ours))
            extra = a if b is None else b
            return (f"KV steps: {more} schedules tokens in {n} steps, the other side in {min(len(theirs), len(ours))}"
                    f" (step {k + 1} at {_at(extra[0])}: {_pool(extra)})")
        if (float(a[0]), a[1], a[2]) != (float(b[0]), b[1], b[2]):
            when = _at(a[0]) if float(a[0]) == float(b[0]) else f"{_at(a[0])} / {_at(b[0])}"
            return f"KV blocks after step {k + 1} ({when}): {label} {_pool(a)}; schedlab {_pool(b)}"
    return None
