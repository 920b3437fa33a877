"""The rules every cost model keeps, checked on one iteration's shape and its neighbours.

An iteration that computes anything takes a positive, finite time, the same each time it is
asked, and more work never costs less: one more decode (as long as the longest), a longer
context for the decodes, one more draft token, one more prompt token, a longer prefill
context, or one more prompt as long as the others. A "fast kernel" above some size that makes
17 tokens cheaper than 16 breaks the last rule; schedulers that compare costs (a cheaper chunk,
a smaller batch) then pick wrongly.
"""

from __future__ import annotations

import math
import numbers

import attrs
from hypothesis import strategies as st

from ..protocols import Batch

#: The ways :func:`check_cost_model` makes an iteration bigger.
GROWTHS = ("decodes", "decode_context", "spec_tokens", "prefill_tokens", "prefill_context", "prefills")
#: most prompts :func:`batches` puts in one iteration (a scheduler admitting what fits)
MAX_PROMPTS = 4


@st.composite
def batches(draw, *, max_decodes: int = 64, max_context: int = 8192, max_prefill: int = 2048,
            spec: bool = False, context_range: bool = False):
    """Iteration shapes: up to ``max_decodes`` decodes of one context length each (at most
    ``max_context``), prompt chunks of up to ``max_prefill`` tokens in all, from 1 to
    :data:`MAX_PROMPTS` prompts, each after up to ``max_context`` cached tokens, and with ``spec``
    draft tokens; never empty. Half the shapes with decodes have no prompt (the commonest step: a
    decode-only one). ``context_range``: fill the longest and shortest decode context (for a cost
    model with ``needs_context_range``)."""
    n_dec = draw(_sizes(0, max_decodes))
    context = draw(_sizes(1, max_context)) if n_dec else 0
    drafts = draw(_sizes(0, 4 * n_dec)) if spec and n_dec else 0
    decode_only = n_dec > 0 and draw(st.booleans())
    chunk = 0 if decode_only else draw(_sizes(0 if n_dec else 1, max_prefill))
    prompts = draw(st.integers(1, min(MAX_PROMPTS, chunk))) if chunk else 0
    cached = sum(draw(_sizes(0, max_context)) for _ in range(prompts))
    return Batch(num_decode=n_dec, decode_context_tokens=n_dec * context + drafts, num_prefill=prompts,
                 prefill_tokens=chunk, prefill_context_tokens=cached, spec_tokens=drafts,
                 decode_context_max=context if context_range and n_dec else 0,
                 decode_context_min=context if context_range and n_dec else 0)


def _sizes(low: int, high: int):
    """Sizes from ``low`` to ``high``, half of them below 64: thresholds hide among small sizes
    (a kernel that changes at 16 tokens), which a uniform draw up to thousands seldom visits."""
    return st.one_of(st.integers(low, min(high, max(low, 63))), st.integers(low, high))


def grown(batch: Batch, growth: str, more: int = 1) -> Batch | None:
    """``batch`` with ``more`` of ``growth`` (one of :data:`GROWTHS`), or None where it does not
    apply (no decode to lengthen, no chunk to give a context)."""
    n, longest = batch.num_decode, batch.decode_context_max
    ranged = longest > 0
    if growth == "decodes":
        each = longest if ranged else (-(-batch.decode_context_tokens // n) if n else 16)
        return attrs.evolve(batch, num_decode=n + more, decode_context_tokens=batch.decode_context_tokens + more * each,
                            decode_context_max=longest,
                            decode_context_min=batch.decode_context_min if ranged and n else 0)
    if growth == "decode_context":
        if not n:
            return None
        return attrs.evolve(batch, decode_context_tokens=batch.decode_context_tokens + more * n,
                            decode_context_max=longest + more if ranged else 0,
                            decode_context_min=batch.decode_context_min + more if ranged else 0)
    if growth == "spec_tokens":
        if not n:
            return None
        return attrs.evolve(batch, spec_tokens=batch.spec_tokens + more,
                            decode_context_tokens=batch.decode_context_tokens + more,
                            decode_context_max=longest + more if ranged else 0)
    if growth == "prefill_tokens":
        return attrs.evolve(batch, prefill_tokens=batch.prefill_tokens + more, num_prefill=max(batch.num_prefill, 1))
    if growth == "prefill_context":
        if not batch.num_prefill:
            return None
        return attrs.evolve(batch, prefill_context_tokens=batch.prefill_context_tokens + more)
    if growth == "prefills":  # ``more`` prompts as long as the others' mean, after as many cached tokens
        p = batch.num_prefill
        each = -(-batch.prefill_tokens // p) if p else 16
        cached = batch.prefill_context_tokens // p if p else 0
        return attrs.evolve(batch, num_prefill=p + more, prefill_tokens=batch.prefill_tokens + more * each,
                            prefill_context_tokens=batch.prefill_context_tokens + more * cached)
    raise ValueError(f"unknown growth {growth!r}; one of {', '.join(GROWTHS)}")


def check_cost_model(model, batch: Batch, *, more: int = 1, rel: float = 1e-9) -> None:
    """Assert the rules (module docstring) for ``model`` at ``batch``: its time there, asked twice,
    and along each of :data:`GROWTHS` one step at a time up to ``more`` -- each shape against the
    one before it, so a threshold anywhere between ``batch`` and ``more`` further is crossed by
    some step (one jump over it can land where the cheaper kernel has made up the difference).
    That is ``1 + more`` calls per growth, at most ``4 + 6 x more`` in all, with a lone decode and a lone
    prompt of the batch, each no dearer than the whole. Use with :func:`batches`::

        @kit_settings
        @given(batches(), st.integers(1, 64))
        def test_my_cost_model_keeps_the_rules(batch, more):
            check_cost_model(MyCostModel(), batch, more=more)
    """
    who = type(model).__name__
    t = _time(model, batch, who)
    again = model.iteration_ms(batch)
    assert again == t, f"cost model {who}: {batch} took {t!r} ms, then {again!r} ms: the same shape must cost the same"
    for part in _parts(batch):  # (a lone decode, a lone prompt: the commonest steps, checked at every shape)
        t_part = _time(model, part, who)
        assert t_part <= t + rel * abs(t), (
            f"cost model {who}: {part}, a part of {batch}, takes {t_part!r} ms, more than {t!r} ms for the whole: "
            "more work must never cost less")
    for growth in GROWTHS:
        prev, t_prev = batch, t
        for k in range(1, more + 1):
            bigger = grown(batch, growth, k)
            if bigger is None:
                break
            t2 = _time(model, bigger, who)
            if k == 1:
                assert t2 >= t - rel * abs(t), (
                    f"cost model {who}: {bigger} (1 more of {growth}) takes {t2!r} ms, less than {t!r} ms for "
                    f"{batch}: more work must never cost less")
            else:
                assert t2 >= t_prev - rel * abs(t_prev), (
                    f"cost model {who}: {bigger} ({k} more of {growth}) takes {t2!r} ms, less than {t_prev!r} ms for "
                    f"{prev} ({k - 1} more), growing from {batch}: more work must never cost less")
            prev, t_prev = bigger, t2
        else:  # (the steps' tolerances add up: the whole growth against the start too)
            assert t_prev >= t - rel * abs(t), (
                f"cost model {who}: {prev} ({more} more of {growth}) takes {t_prev!r} ms, less than {t!r} ms for "
                f"{batch}: more work must never cost less")


def _parts(batch: Batch) -> list[Batch]:
    """The smallest steps inside ``batch``: one of its decodes alone (as long as the longest, without
    drafts) and one of its prompts alone (as long as their mean, after their mean cached tokens)."""
    parts = []
    n, p = batch.num_decode, batch.num_prefill
    if n and (n > 1 or p or batch.spec_tokens):
        longest = batch.decode_context_max or -(-(batch.decode_context_tokens - batch.spec_tokens) // n)
        ranged = batch.decode_context_max > 0
        parts.append(Batch(num_decode=1, decode_context_tokens=longest, decode_context_max=longest if ranged else 0,
                           decode_context_min=longest if ranged else 0))
    if p and (p > 1 or n):
        parts.append(Batch(num_prefill=1, prefill_tokens=batch.prefill_tokens // p,
                           prefill_context_tokens=batch.prefill_context_tokens // p))
    return parts


def _time(model, batch: Batch, who: str) -> float:
    t = model.iteration_ms(batch)
    ok = isinstance(t, numbers.Real) and not isinstance(t, bool) and math.isfinite(t) and t > 0
    assert ok, (f"cost model {who} returned {t!r} ms for {batch}: an iteration that computes anything takes a "
                "positive, finite time")
    return float(t)
