"""A batching window: hold new requests back for a moment so that a larger batch forms.

Dynamic batching (seed 004): a runtime that waits for more requests builds larger, more
efficient batches, but the first request pays the wait even on an idle accelerator. The
window opens -- waiting requests may be admitted -- as soon as any of these holds:

* enough requests wait: ``min_batch`` (0 = as many as there are free slots);
* the oldest waiting request has waited ``max_wait_ms``;
* adaptive, when ``interactive_wait_ms`` is set: while a request of class
  ``interactive_class`` waits, the window is ``interactive_wait_ms`` long instead (0 =
  interactive requests go at once, taking the background requests waiting with them);
* a preempted request is waiting (it resumes without delay).

While the window is closed the scheduler admits nothing and calls ``plan.wake_at`` with the
time it opens, so the engine calls the scheduler again then even if nothing else happens.
Whether it is open depends only on the waiting requests, the free slots and the clock, so a
scheduler using it stays ``stable_between_events``.

``static`` and ``continuous`` take the same four settings; ``max_wait_ms = 0`` (the
default) means no window at all.
"""

from __future__ import annotations

import math

from schedlab.configs import float_field, int_field, str_field
from schedlab.errors import ConfigError


def max_wait_ms_field():
    return float_field(0.0, min=0.0,
                       help="batching window: hold new requests up to this long so a batch forms (0 = no window)")


def min_batch_field():
    return int_field(0, min=0,
                     help="batching window: open it once this many requests wait (0 = enough to fill the free slots)")


def interactive_class_field():
    return str_field("interactive", help="batching window: the request class that shortens it")


def interactive_wait_ms_field():
    return float_field(None, min=0.0, optional=True,
                       help="adaptive batching window: its length while a request of interactive_class waits "
                            "(unset = the same window for every class)")


def check_window_settings(config) -> None:
    """The interactive window is a shorter one; a longer one is a mistake worth reporting."""
    if config.interactive_wait_ms is not None and config.interactive_wait_ms > config.max_wait_ms:
        raise ConfigError(f"interactive_wait_ms ({config.interactive_wait_ms}) must not exceed max_wait_ms "
                          f"({config.max_wait_ms}): the interactive window shortens the batching window")


class BatchingWindow:
    """Decides, at each scheduling step, whether new requests are still held back."""

    def __init__(self, max_wait_ms: float, min_batch: int = 0, interactive_class: str = "interactive",
                 interactive_wait_ms: float | None = None):
        self.max_wait_ms = max_wait_ms
        self.min_batch = min_batch
        self.interactive_class = interactive_class
        self.interactive_wait_ms = interactive_wait_ms

    @classmethod
    def from_config(cls, config) -> "BatchingWindow | None":
        """The window a scheduler config asks for, or None (``max_wait_ms = 0``: no window)."""
        if not config.max_wait_ms:
            return None
        return cls(config.max_wait_ms, config.min_batch, config.interactive_class, config.interactive_wait_ms)

    def hold(self, plan, free_slots: int) -> bool:
        """True if the waiting requests must wait longer; then ``plan.wake_at`` is set to when
        the window opens. ``free_slots``: how many requests could be admitted now."""
        waiting = plan.waiting
        count = len(waiting)
        if not count or free_slots <= 0:
            return False
        enough = min(self.min_batch, free_slots) if self.min_batch else free_slots
        if count >= enough:
            return False
        oldest = math.inf
        interactive = False
        for seq in waiting:
            if seq.num_preemptions:
                return False
            request = seq.request
            if request.arrival_ms < oldest:
                oldest = request.arrival_ms
            if self.interactive_wait_ms is not None and request.request_class == self.interactive_class:
                interactive = True
        opens = oldest + (self.interactive_wait_ms if interactive else self.max_wait_ms)
        if plan.now >= opens:
            return False
        plan.wake_at(opens)
        return True
