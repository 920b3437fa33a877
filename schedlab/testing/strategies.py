"""Hypothesis strategies for request lists.

Arrival times, like the default costs, are multiples of 1/8 ms: exact in binary floating
point, so the fast and reference engines compute bit-identical clocks and the differential
tests can demand equality, ties included.

Each request is drawn whole -- its arrival tick with its lengths, limit, priority and prefix, as
one span -- and the list is then put in arrival order, so a failing list shrinks one request at a
time: Hypothesis lowers the count and deletes the span after it. (Drawn as a sorted column of
arrivals and then the rest, a request could only go by three edits at once, and failures stopped
at 5-22 requests where 1-2 suffice.) The lists that can be drawn are as before -- n independent
ticks put in order, each request's fields independent -- though a given seed draws other ones.
"""

from __future__ import annotations

from functools import lru_cache

import attrs
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ..model import Request


@st.composite
def requests_lists(draw, *, min_size: int = 1, max_size: int = 12, max_prompt: int = 64, max_output: int = 40,
                   min_output: int = 1, max_arrival_ms: float = 200.0, all_at_zero: bool | None = None,
                   max_tokens: bool = True, priorities: bool = False, prefix_groups: int = 0, bursts: bool = False):
    """Lists of requests with ids 0..n-1 in arrival order.

    :param all_at_zero: True: every request arrives at 0; False: spread arrivals; None: either.
    :param max_tokens: sometimes cap outputs with a ``max_tokens`` limit.
    :param priorities: draw priorities 0..2 (lower = more important).
    :param prefix_groups: if > 0, requests may share a system prompt from that many groups.
    :param bursts: draw bursts instead of spread arrivals: each burst is some requests arriving
        at one instant, then one more request later -- from a tick later up to ``max_arrival_ms``,
        so that it also lands once the burst has taken the slots. With ``priorities`` the burst's
        requests are less important (1..2) and the late one more important than all of them: a
        priority inversion, where a scheduler that makes room for the important request (an extra
        slot, a preemption) must still keep its limits. Spread arrivals seldom reach it: the
        audit's "one slot over ``max_num_seqs`` for an urgent request" was found at 100 examples on
        3 seeds of 20, with bursts on 20 of 20. Sizes stay within ``min_size``..``max_size`` (larger
        ones more often than without bursts); not with ``all_at_zero=True``.
    """
    if bursts:
        if all_at_zero:
            raise ValueError("requests_lists: bursts put the late request after its burst; not with all_at_zero=True")
        return _in_bursts(draw, min_size, max_size, max_arrival_ms, priorities,
                          lambda low, high: _request(max_prompt, max_output, min_output, max_tokens, low, high,
                                                     prefix_groups))
    zero = draw(st.booleans()) if all_at_zero is None else all_at_zero
    n = draw(_ints(min_size, max_size))
    ticks = 0 if zero else max(1, int(max_arrival_ms * 8))
    row = _row(ticks, _request(max_prompt, max_output, min_output, max_tokens, 0, 2 if priorities else 0,
                               prefix_groups))
    return _numbered([draw(row) for _ in range(n)])


def _in_bursts(draw, min_size: int, max_size: int, max_arrival_ms: float, priorities: bool, request) -> list:
    """``requests_lists(bursts=True)``: bursts while there is room, at least until ``min_size``, then
    each further one if a coin says so. A burst draws its instant, its crowd (at most the room left
    less its late request), its late request's delay, then its requests, one span each: Hypothesis
    drops a request by lowering the crowd and deleting the span after it."""
    if not 1 <= max(min_size, 1) <= max_size:
        raise InvalidArgument(f"requests_lists(bursts=True) needs 1 <= max_size and min_size <= max_size, got "
                              f"min_size={min_size}, max_size={max_size}")
    ticks = max(2, int(max_arrival_ms * 8))
    rows: list = []
    while len(rows) < max_size and (len(rows) < max(min_size, 1) or draw(st.booleans())):
        instant = draw(_ints(0, ticks - 1))
        crowd = draw(_ints(0, max_size - len(rows) - 1))
        late = instant + draw(_ints(1, ticks - instant))
        low = [(instant, draw(request(1, 2) if priorities else request(0, 0))) for _ in range(crowd)]
        least = min((r.priority for _, r in low), default=3)
        rows += low + [(late, draw(request(0, least - 1) if priorities else request(0, 0)))]
    return _numbered(rows)


@lru_cache(maxsize=None)
def _ints(low: int, high: int):
    """``st.integers(low, high)`` (``st.just`` for one value), made once per range, not per draw."""
    return st.just(low) if high == low else st.integers(low, high)


@lru_cache(maxsize=None)
def _row(ticks: int, request):
    """A request's arrival tick with its fields, as one span."""
    return st.tuples(_ints(0, ticks), request)


@lru_cache(maxsize=None)
def _request(max_prompt: int, max_output: int, min_output: int, max_tokens: bool, low: int, high: int,
             prefix_groups: int):
    """One request's fields but its id and arrival (id -1, arrival 0), priority from ``low`` to ``high``."""
    caps = st.none() | _ints(min_output, max_output)

    @st.composite
    def request(draw):
        prompt = draw(_ints(1, max_prompt))
        output = draw(_ints(min_output, max_output))
        cap = draw(caps) if max_tokens else None
        priority = draw(_ints(low, high))
        group, prefix = None, 0
        if prefix_groups and draw(st.booleans()):
            group = draw(_ints(0, prefix_groups - 1))
            prefix = min(prompt, draw(_ints(1, max_prompt)))
        return Request(-1, 0.0, prompt, output, max_tokens=cap, priority=priority, prefix_group=group,
                       prefix_tokens=prefix)

    return request()


def _numbered(rows: list) -> list:
    """``(tick, request)`` rows in arrival order (ties in the order drawn), numbered 0..n-1."""
    rows = sorted(rows, key=lambda row: row[0])
    return [attrs.evolve(r, id=i, arrival_ms=tick / 8) for i, (tick, r) in enumerate(rows)]


@st.composite
def dyadic_linear_costs(draw):
    """Settings of the ``linear`` cost model whose iteration times are exact binary fractions,
    so that the fast and reference engines' clocks agree to the bit."""
    from schedlab_plugins.cost_models import LinearConfig

    return LinearConfig(
        prefill_ms_per_token=draw(st.sampled_from([0.0625, 0.125, 0.5])),
        decode_ms_per_step=draw(st.sampled_from([4.0, 8.0])),
        per_seq_ms=draw(st.sampled_from([0.0, 0.25])),
        per_context_token_ms=draw(st.sampled_from([0.0, 2.0 ** -6])),
    )
