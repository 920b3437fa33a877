"""Hypothesis strategies for request lists.

Arrival times, like the default costs, are multiples of 1/8 ms: exact in binary floating
point, so the fast and reference engines compute bit-identical clocks and the differential
tests can demand equality, ties included.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ..model import Request


@st.composite
def requests_lists(draw, *, min_size: int = 1, max_size: int = 12, max_prompt: int = 64, max_output: int = 40, min_output: int = 1,
                   max_arrival_ms: float = 200.0, all_at_zero: bool | None = None, max_tokens: bool = True,
                   priorities: bool = False, prefix_groups: int = 0):
    """Lists of requests with ids 0..n-1 in arrival order.

    :param all_at_zero: True: every request arrives at 0; False: spread arrivals; None: either.
    :param max_tokens: sometimes cap outputs with a ``max_tokens`` limit.
    :param priorities: draw priorities 0..2 (lower = more important).
    :param prefix_groups: if > 0, requests may share a system prompt from that many groups.
    """
    n = draw(st.integers(min_size, max_size))
    zero = draw(st.booleans()) if all_at_zero is None else all_at_zero
    if zero:
        arrivals = [0.0] * n
    else:
        ticks = max(1, int(max_arrival_ms * 8))
        arrivals = sorted(draw(st.lists(st.integers(0, ticks), min_size=n, max_size=n)))
        arrivals = [t / 8 for t in arrivals]
    out = []
    for i, arrival in enumerate(arrivals):
        prompt = draw(st.integers(1, max_prompt))
        output = draw(st.integers(min_output, max_output))
        cap = draw(st.none() | st.integers(min_output, max_output)) if max_tokens else None
        priority = draw(st.integers(0, 2)) if priorities else 0
        group, prefix = None, 0
        if prefix_groups and draw(st.booleans()):
            group = draw(st.integers(0, prefix_groups - 1))
            prefix = min(prompt, draw(st.integers(1, max_prompt)))
        out.append(Request(i, arrival, prompt, output, max_tokens=cap, priority=priority,
                           prefix_group=group, prefix_tokens=prefix))
    return out


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
