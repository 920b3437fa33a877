"""Closed forms for a run of identical decode iterations.

During a run every decoding sequence gains one token per iteration. A growing sequence
(no reservation) with ``computed = anchor + D`` at decode counter ``D`` needs a new KV block
in the iteration at counter ``D`` exactly when ``(anchor + D) % block_size == 0``. So the
instance counts growing sequences by the residue of the counters at which they need blocks
(``cross_at[D % block_size]``), and the blocks a run needs follow a pattern that repeats
every ``block_size`` iterations. :class:`Growth` turns that pattern into prefix sums once per
run; blocks needed, how far free blocks last, the block-time integral and the first
iteration above a usage threshold are then O(1) or a bisection over ``block_size`` numbers.

With sliding-window layers (:class:`SlidingGrowth`) a decoder also takes ``g`` window blocks where
it takes a block and, once its window slides, gives ``g`` back once per ``block_size`` iterations:
the pattern still repeats, but it falls as well as rises, so how far free blocks last follows
its running maximum, and the time above a threshold adds up over the periods where it crosses.

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
    ``P`` the prefix sums of one period of the pattern (``B`` = block size, ``n`` = the blocks
    one period needs, > 0; ``P[B] = n``). ``cross_at[r]``: the blocks needed at counters ``r`` mod
    ``B`` -- growing sequences, or with a window a weight that may be negative (then ``M``, the
    running maximum of ``P``, is kept).
    """

    __slots__ = ("n", "bs", "P", "S", "T", "M")

    def __init__(self, cross_at: list[int], n_growing: int, start: int):
        bs = len(cross_at)
        self.n = n_growing
        self.bs = bs
        b = (start + 1) % bs
        P = list(accumulate(cross_at[b:] + cross_at[:b], initial=0))   # P[r] = C(r), r <= bs
        self.P = P
        self.S = list(accumulate(P, initial=0))                        # S[r] = sum of P[:r]
        self.T = list(accumulate(map(mul, range(bs), P), initial=0))   # T[r] = sum of r' * P[r'], r' < r
        self.M = list(accumulate(P, max)) if min(cross_at) < 0 else None  # M[r] = max of P[:r + 1]

    def blocks(self, j: int) -> int:
        """C(j): blocks needed by iterations 1..j."""
        q, r = divmod(j, self.bs)
        return q * self.n + self.P[r]

    def taken(self, j: int) -> int:
        """Blocks taken from the pool by iterations 1..j (C(j) but with a window, whose freed
        blocks it counts apart: :class:`SlidingGrowth`)."""
        return self.blocks(j)

    def peak(self, j: int) -> int:
        """The most of C(0..j)."""
        M = self.M
        if M is None:
            return self.blocks(j)
        q, r = divmod(j, self.bs)
        if not q:
            return M[r]
        return max(q * self.n + M[r], (q - 1) * self.n + M[self.bs - 1])

    def iterations_within(self, budget: int) -> int:
        """The largest j with C(0..j) all <= budget (how many iterations the free blocks last)."""
        M, n, bs = self.M, self.n, self.bs
        if M is None:
            q, left = divmod(budget, n)
            return q * bs + bisect_right(self.P, left) - 1
        # C(qB + r) <= budget for every earlier iteration: q n + M[r] <= budget, and the periods
        # before it, whose highest is (q - 1) n + M[B - 1], too
        q = budget // n
        if q and (q - 1) * n + M[bs - 1] > budget:
            q = (budget - M[bs - 1]) // n + 1 if budget >= M[bs - 1] else 0
        return q * bs + bisect_right(M, budget - q * n, 0, bs) - 1

    def taken_within(self, budget: int) -> int:
        """The largest j with C'(j) <= budget, C' the blocks taken (:meth:`taken`)."""
        return self.iterations_within(budget)

    def first_reaching(self, blocks: int) -> int:
        """The smallest j with C(j) >= blocks (> 0)."""
        q = (blocks - 1) // self.n
        return q * self.bs + bisect_left(self.P, blocks - q * self.n)

    def first_below(self, blocks: int) -> int | None:
        """The smallest j >= 1 with C(j) < ``blocks`` (<= 0), or None (C never falls there)."""
        n, bs, P = self.n, self.bs, self.P
        low = min(P[1:bs], default=0)
        q = 0
        while q * n + low < blocks:
            for r in range(1 if not q else 0, bs):
                if q * n + P[r] < blocks:
                    return q * bs + r
            q += 1
        return None

    def time_at_or_above(self, blocks: int, k: int, d0: float, inc: float) -> float:
        """How long iterations ``0..k-1`` spend with C(j) >= ``blocks``."""
        if self.M is None:
            first = self.first_reaching(blocks) if blocks > 0 else 0
            return run_ms(k, d0, inc) - run_ms(first, d0, inc) if first < k else 0.0
        n, bs, P = self.n, self.bs, self.P
        low, high = min(P[:bs]), max(P[:bs])
        q = max(0, -(-(blocks - high) // n))  # the first period reaching it
        every = max(q, -(-(blocks - low) // n))  # from this period on, every iteration
        total = 0.0
        while q < every and q * bs < k:
            base = q * n
            for r in range(min(bs, k - q * bs)):
                if base + P[r] >= blocks:
                    total += d0 + (q * bs + r) * inc
            q += 1
        if every * bs < k:
            total += run_ms(k, d0, inc) - run_ms(every * bs, d0, inc)
        return total

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


class SlidingGrowth(Growth):
    """:class:`Growth` with sliding-window layers in ``groups`` KV cache groups: a decoder takes
    ``1 + groups`` blocks where it crosses a block (``cross_at``) and, once its window slides,
    gives ``groups`` back once a period (``free_at``: such decoders by the counter's residue,
    ``n_sliding`` of them). :meth:`taken` and :meth:`taken_within` count the blocks taken alone
    (a prefix cache evicts for those: the freed ones go to its free queue's tail).

    An iteration's decodes go together only if the blocks those that take any need are free
    before the others give theirs back (``allocate_decodes``: otherwise the scheduler walks
    them in turn, and a decode may find the pool short before a later one frees): so
    :meth:`iterations_within` counts iteration ``j`` at ``C(j - 1)`` plus what it takes, which is
    ``C(j)`` plus the window blocks it frees -- of decoders that take none in it. A decoder's
    window frees where it crosses a block when ``W - 1`` is a multiple of ``B``
    (``coincide``), and never there otherwise."""

    __slots__ = ("gains", "Y")

    def __init__(self, cross_at: list[int], n_growing: int, free_at: list[int], n_sliding: int, groups: int,
                 start: int, coincide: bool):
        gain = 1 + groups
        super().__init__([gain * c - groups * f for c, f in zip(cross_at, free_at)],
                         gain * n_growing - groups * n_sliding, start)
        # the blocks taken: where a decoder's window frees where it crosses, it takes one block net (a
        # cache frees and takes per decode, vLLM's remove_skipped_blocks then allocate: nothing of the
        # window's goes back to the free queue, nor comes from it)
        self.gains = self if coincide else Growth([gain * c for c in cross_at], gain * n_growing, start)
        bs, P = self.bs, self.P
        # Y[r]: iteration qB + r's high point less q n (r < B), the frees of decoders taking nothing added
        self.Y = P[:bs] if coincide else [P[r] + groups * free_at[(start + r) % bs] for r in range(bs)]

    def taken(self, j: int) -> int:
        gains = self.gains
        return gains.blocks(j) if gains is not self else self.blocks(j)

    def taken_within(self, budget: int) -> int:
        gains = self.gains
        return gains.iterations_within(budget) if gains is not self else self.iterations_within(budget)

    def _highest(self, j: int) -> int:
        """The most blocks any of iterations 1..j needs at once (see the class docstring)."""
        Y, n, bs = self.Y, self.n, self.bs
        q, r = divmod(j, bs)
        if not q:
            return max(Y[1:r + 1])
        last = q * n + max(Y[:r + 1])
        if q > 1:
            before = (q - 1) * n + max(Y)
        else:  # (iteration 0's plan took its own blocks)
            before = max(Y[1:]) if bs > 1 else last
        return last if last > before else before

    def iterations_within(self, budget: int) -> int:
        lo, hi = 0, (budget // self.n + 2) * self.bs  # _highest(hi) > budget: the periods before it alone
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._highest(mid) <= budget:
                lo = mid
            else:
                hi = mid
        return lo
