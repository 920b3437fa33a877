"""Compare the two engines on a case, and the agreement table per feature group."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import attrs

from .case import FIELDS, SHORT, Case, Outcome, Sides, describe, differing_fields


class Runner(Protocol):
    def run(self, case: Case, sides: Sides | None = None) -> tuple[dict[int, Outcome], str | None]: ...


@attrs.frozen
class Comparison:
    """Both engines' outcomes on one case (and the error text of a run that failed)."""

    case: Case
    vllm: Mapping[int, Outcome]
    schedlab: Mapping[int, Outcome]
    vllm_error: str | None = None
    schedlab_error: str | None = None

    @property
    def diff(self) -> dict[int, tuple[str, ...]]:
        return differing_fields(self.vllm, self.schedlab)

    @property
    def fields(self) -> frozenset:
        """The fields that differ for at least one request, plus ``error`` when only one
        engine failed."""
        out = {f for fs in self.diff.values() for f in fs}
        if (self.vllm_error is None) != (self.schedlab_error is None):
            out.add("error")
        return frozenset(out)

    @property
    def agrees(self) -> bool:
        return not self.fields

    def describe(self, sides: Sides | None = None) -> str:
        notes = "; ".join(e for e in (self.vllm_error, self.schedlab_error) if e)
        return describe(self.case, self.vllm, self.schedlab, sides, notes=notes)


class Differ:
    """Runs cases on both engines with the same one-sided settings."""

    def __init__(self, vllm: Runner, schedlab: Runner, sides: Sides | None = None):
        self.vllm = vllm
        self.schedlab = schedlab
        self.sides = sides or Sides()
        self.runs = 0

    def compare(self, case: Case) -> Comparison:
        self.runs += 1
        v, v_err = self.vllm.run(case, self.sides)
        s, s_err = self.schedlab.run(case, self.sides)
        return Comparison(case, v, s, v_err, s_err)


def agreement_table(by_group: Mapping[str, Sequence[Comparison]]) -> str:
    """One row per feature group: cases, identical cases and their share, and in how many
    cases each field differs for at least one request."""
    header = ["group", "cases", "identical", "share"] + [SHORT[f] for f in FIELDS] + ["error"]
    rows = [header]
    for group, comparisons in by_group.items():
        n = len(comparisons)
        same = sum(c.agrees for c in comparisons)
        counts = [sum(f in c.fields for c in comparisons) for f in FIELDS + ("error",)]
        rows.append([group, str(n), str(same), f"{same / n:.0%}" if n else "-"] + [str(x) for x in counts])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
