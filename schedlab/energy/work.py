"""An iteration's work on one GPU as the kernels that do it run: ``(bytes, flops)`` with its phases.

A cost model's ``work(batch)`` says what one GPU reads and computes in an iteration. Power
models turn it into a utilisation: the time the work takes at the GPU's peak rates over the
iteration's duration. An iteration is not one kernel, though: its dense GEMMs, its routed
experts and its attention run one after another, each bound by its own resource -- a mixed
step's prompt GEMMs by compute while its decodes' attention reads the KV cache. Their time at
the peak rates is the sum of each one's ``max(bytes / bandwidth, flops / peak)``, not the
``max`` of the totals, which counts a step that does both as doing only the larger (up to half
its busy time lost). So a :class:`Work` is the ``(bytes, flops)`` pair -- it unpacks and
compares as one -- that also keeps its ``phases``; a plain pair is one phase.

Layers that add work (a data-parallel rank's own part and its experts, a drafter's passes
beside the target's) join the phases with :func:`joined`.
"""

from __future__ import annotations

from typing import Iterable, Sequence


class Work(tuple):
    """``(bytes, flops)``, with ``phases``: the ``(bytes, flops)`` of each kernel group in the
    order they run (their sums are the pair, unless it is given)."""

    phases: tuple[tuple[float, float], ...]

    def __new__(cls, phases: Iterable[Sequence[float]], total: Sequence[float] | None = None) -> "Work":
        parts = tuple((float(b), float(f)) for b, f in phases)
        if total is None:
            total = (sum(b for b, _ in parts), sum(f for _, f in parts))
        self = super().__new__(cls, (float(total[0]), float(total[1])))
        self.phases = parts
        return self

    def __getnewargs__(self) -> tuple:
        """What pickle and copy rebuild it from: the phases and the pair."""
        return self.phases, tuple(self)

    def __repr__(self) -> str:
        return f"Work({tuple(self)!r}, phases={self.phases!r})"


def phases_of(work: Sequence[float]) -> tuple[tuple[float, float], ...]:
    """The phases of ``work``: its own, or the pair as one phase."""
    parts = getattr(work, "phases", None)
    return parts if parts is not None else ((float(work[0]), float(work[1])),)


def joined(*works: Sequence[float]) -> Work:
    """The work of kernels that run one after another: the pairs summed, the phases in order."""
    parts = tuple(p for w in works for p in phases_of(w))
    total = (sum(w[0] for w in works), sum(w[1] for w in works))
    return Work(parts, total)


def peak_ms(work: Sequence[float], bytes_per_ms: float, flops_per_ms: float) -> float:
    """How long ``work`` takes at the peak rates: each phase bound by its slower side, summed."""
    total = 0.0
    for b, f in phases_of(work):
        m, c = b / bytes_per_ms, f / flops_per_ms
        total += m if m > c else c
    return total
