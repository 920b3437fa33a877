"""Closed forms for a run of identical decode iterations.

During a run every decoding sequence gains one token per iteration. A growing sequence
(no reservation) needs a new KV block at decode counter ``D`` exactly when
``(anchor + D) % block_size == 0``, so sequences can be counted by ``anchor % block_size``
("phase"): ``phase_counts[p]`` sequences need a block at every ``D`` with
``(D + p) % block_size == 0``. From that, blocks needed, the block-time integral and the
first step above a usage threshold follow without visiting sequences or iterations.

Iteration ``j`` of a run (``j = 0, 1, ...``) lasts ``d0 + j * inc`` milliseconds.
"""

from __future__ import annotations

import math


def blocks_at(phase_counts: list[int], step: int) -> int:
    """Blocks the growing sequences need for the decode iteration at counter ``step``."""
    return phase_counts[-step % len(phase_counts)]


def crossings(phase_counts: list[int], n_growing: int, start: int, steps: int) -> int:
    """Blocks needed by the decode iterations at counters ``start .. start + steps - 1``."""
    if steps <= 0 or n_growing == 0:
        return 0
    bs = len(phase_counts)
    full, rest = divmod(steps, bs)
    total = full * n_growing
    for j in range(rest):
        total += phase_counts[-(start + full * bs + j) % bs]
    return total


def steps_within(phase_counts: list[int], n_growing: int, start: int, budget: int) -> int | None:
    """The most iterations from counter ``start`` whose new blocks fit in ``budget``.

    None means "any number" (nothing grows).
    """
    if n_growing == 0:
        return None
    bs = len(phase_counts)
    cycles, left = divmod(budget, n_growing)
    steps = cycles * bs
    step = start + steps
    while True:  # fewer than n_growing blocks left: stops within one cycle
        need = phase_counts[-step % bs]
        if need > left:
            return steps
        left -= need
        steps += 1
        step += 1


def run_ms(k: int, d0: float, inc: float) -> float:
    """Total duration of the first ``k`` iterations."""
    return k * d0 + inc * (k * (k - 1) // 2)


def steps_before(now: float, until: float, d0: float, inc: float) -> int:
    """How many iterations start before ``until`` when the first starts at ``now < until``."""
    gap = until - now
    if inc == 0.0:
        k = math.ceil(gap / d0)
    else:  # inc/2 k^2 + (d0 - inc/2) k >= gap
        b = d0 - inc / 2.0
        k = math.ceil((-b + math.sqrt(b * b + 2.0 * inc * gap)) / inc)
    k = max(k, 1)
    # The closed form is an estimate under rounding; settle it on the exact start times.
    while now + run_ms(k, d0, inc) < until:
        k += 1
    while k > 1 and now + run_ms(k - 1, d0, inc) >= until:
        k -= 1
    return k


def block_time(phase_counts: list[int], start: int, k: int, d0: float, inc: float, used0: int) -> float:
    """Integral of blocks in use over a run of ``k`` iterations (block x ms).

    Iteration 0 runs at counter ``start`` with ``used0`` blocks (its own new blocks already
    counted); iteration ``j >= 1`` adds the blocks needed at counter ``start + j``.
    """
    total = used0 * run_ms(k, d0, inc)
    if k <= 1:
        return total
    bs = len(phase_counts)
    half_kk = k * (k - 1) // 2
    for p, count in enumerate(phase_counts):
        if not count:
            continue
        r = (-start - p) % bs or bs          # first j >= 1 with (start + j + p) % bs == 0
        if r > k - 1:
            continue
        m = (k - 1 - r) // bs + 1            # how many such j below k
        s1 = m * r + bs * (m * (m - 1) // 2)
        # sum over j of (remaining duration from iteration j to the end of the run)
        acc = d0 * (k * m - s1)
        if inc:
            s2 = m * r * r + r * bs * m * (m - 1) + bs * bs * ((m - 1) * m * (2 * m - 1) // 6)
            acc += inc * (m * half_kk - (s2 - s1) // 2)
        total += count * acc
    return total


def time_above(phase_counts: list[int], n_growing: int, start: int, k: int, d0: float, inc: float,
               used0: int, need: int) -> float:
    """Time, within the run, during which at least ``need`` blocks are in use."""
    if used0 >= need:
        first = 0
    else:
        before = steps_within(phase_counts, n_growing, start + 1, need - used0 - 1)
        if before is None or before + 1 > k - 1:
            return 0.0
        first = before + 1
    return run_ms(k, d0, inc) - run_ms(first, d0, inc)
