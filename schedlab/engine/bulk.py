"""Closed forms for a run of identical decode iterations.

During a run every decoding sequence gains one token per iteration. A growing sequence
(no reservation) with ``computed = anchor + D`` at decode counter ``D`` needs a new KV block
in the iteration at counter ``D`` exactly when ``(anchor + D) % block_size == 0``. So the
instance counts growing sequences by the residue of the counters at which they need blocks
(``cross_at[D % block_size]``), and the blocks a run needs follow a pattern that repeats
every ``block_size`` iterations. :class:`Growth` turns that pattern into prefix sums once per
run; blocks needed, how far free blocks last, the block-time integral and the first
iteration above a usage threshold are then O(1) or a bisection over ``block_size`` numbers.

Iteration ``j`` of a run (``j = 0, 1, ...``) lasts ``d0 + j * inc`` milliseconds.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from itertools import accumulate
from operator import mul


def run_ms(k: int, d0: float, inc: float) -> float:
    """Total duration of the first ``k`` iterations."""
    return k * d0 + inc * (k * (k - 1) // 2)


#: Most iterations one run may count: more than any run can have (each yields a token and a
#: request has at most 10**8), and small enough that ``run_ms`` stays exact in its integer part.
MAX_STEPS = 2**53


def steps_before(now: float, until: float, d0: float, inc: float) -> int:
    """How many iterations start before ``until`` when the first starts at ``now < until``
    (at most :data:`MAX_STEPS`): the smallest ``k >= 1`` with ``now + run_ms(k) >= until``."""
    gap = until - now
    try:
        if inc == 0.0:
            k = math.ceil(gap / d0)
        else:  # inc/2 k^2 + (d0 - inc/2) k >= gap
            b = d0 - inc / 2.0
            k = math.ceil((-b + math.sqrt(b * b + 2.0 * inc * gap)) / inc)
    except OverflowError:  # tiny iterations over a long gap: more than MAX_STEPS
        k = MAX_STEPS
    k = min(max(k, 1), MAX_STEPS)

    def reaches(j: int) -> bool:
        return now + run_ms(j, d0, inc) >= until

    # The closed form is an estimate under rounding; settle it on the exact start times. It is
    # off by one at most near t = 0, but far out (t ~ 1e12 ms, microsecond iterations) rounding
    # moves it by many steps, so widen a bracket by doubling and bisect rather than step by one.
    if reaches(k):
        hi, step = k, 1
        lo = hi - step
        while lo >= 1 and reaches(lo):
            hi, step = lo, step * 2
            lo = hi - step
        lo = max(lo, 0)  # reaches(lo) is False, or lo == 0
    else:
        lo, step = k, 1
        hi = min(lo + step, MAX_STEPS)
        while not reaches(hi):
            if hi == MAX_STEPS:
                return MAX_STEPS
            lo, step = hi, step * 2
            hi = min(lo + step, MAX_STEPS)
    while hi - lo > 1:  # invariant: reaches(hi), and lo == 0 or not reaches(lo)
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid
    return hi


class Growth:
    """New blocks needed by iterations ``1, 2, ...`` of a run that starts at decode counter ``start``.

    ``C(j)``, the blocks needed by iterations ``1..j``, is ``(j // B) * n + P[j % B]`` with
    ``P`` the prefix sums of one period of the pattern (``B`` = block size, ``n`` = growing
    sequences, ``P[B] = n``).
    """

    __slots__ = ("n", "bs", "P", "S", "T")

    def __init__(self, cross_at: list[int], n_growing: int, start: int):
        bs = len(cross_at)
        self.n = n_growing
        self.bs = bs
        b = (start + 1) % bs
        P = list(accumulate(cross_at[b:] + cross_at[:b], initial=0))   # P[r] = C(r), r <= bs
        self.P = P
        self.S = list(accumulate(P, initial=0))                        # S[r] = sum of P[:r]
        self.T = list(accumulate(map(mul, range(bs), P), initial=0))   # T[r] = sum of r' * P[r'], r' < r

    def blocks(self, j: int) -> int:
        """C(j): blocks needed by iterations 1..j."""
        q, r = divmod(j, self.bs)
        return q * self.n + self.P[r]

    def iterations_within(self, budget: int) -> int:
        """The largest j with C(j) <= budget (how many iterations the free blocks last)."""
        q, left = divmod(budget, self.n)
        return q * self.bs + bisect_right(self.P, left) - 1

    def first_reaching(self, blocks: int) -> int:
        """The smallest j with C(j) >= blocks (> 0)."""
        q = (blocks - 1) // self.n
        return q * self.bs + bisect_left(self.P, blocks - q * self.n)

    def block_time(self, k: int, d0: float, inc: float, used0: int) -> float:
        """Integral of blocks in use over iterations 0..k-1 (block x ms); iteration 0 has
        ``used0`` blocks, iteration j adds C(j)."""
        bs, n, S, T = self.bs, self.n, self.S, self.T
        Q, R = divmod(k, bs)
        sum_c = n * (bs * (Q * (Q - 1) // 2) + Q * R) + Q * S[bs] + S[R]          # sum of C(j), j < k
        total = used0 * run_ms(k, d0, inc) + d0 * sum_c
        if inc:
            sum_jq = (bs * bs * ((Q - 1) * Q * (2 * Q - 1) // 6) + bs * (bs - 1) // 2 * (Q * (Q - 1) // 2)
                      + Q * (Q * bs * R + R * (R - 1) // 2))                          # sum of j * (j // bs)
            sum_jp = bs * S[bs] * (Q * (Q - 1) // 2) + Q * T[bs] + Q * bs * S[R] + T[R]  # sum of j * P[j % bs]
            total += inc * (n * sum_jq + sum_jp)
        return total
