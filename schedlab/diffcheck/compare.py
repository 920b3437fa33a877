"""Compare the two engines on a case, and the agreement table per feature group."""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

import attrs

from .case import Case, Engine, Sides, describe, differing_fields


class Runner(Protocol):
    def run(self, case: Case, sides: Sides | None = None) -> tuple[dict[int, Any], str | None]: ...


@attrs.frozen
class Comparison:
    """Both engines' outcomes on one case (``theirs``: the real engine's, ``ours``: schedlab's)
    and the error text of a run that failed."""

    engine: Engine
    case: Case
    theirs: Mapping[int, Any]
    ours: Mapping[int, Any]
    their_error: str | None = None
    our_error: str | None = None

    @property
    def diff(self) -> dict[int, tuple[str, ...]]:
        return differing_fields(self.theirs, self.ours, self.engine.outcome.FIELDS)

    @property
    def fields(self) -> frozenset:
        """The fields that differ for at least one request, plus ``error`` when only one
        engine failed."""
        out = {f for fs in self.diff.values() for f in fs}
        if (self.their_error is None) != (self.our_error is None):
            out.add("error")
        return frozenset(out)

    @property
    def agrees(self) -> bool:
        return not self.fields

    def describe(self, sides: Sides | None = None) -> str:
        notes = "; ".join(e for e in (self.their_error, self.our_error) if e)
        return describe(self.engine, self.case, self.theirs, self.ours, sides, notes=notes)


class Differ:
    """Runs cases on both engines with the same one-sided settings."""

    def __init__(self, engine: Engine, theirs: Runner, ours: Runner, sides: Sides | None = None):
        self.engine = engine
        self.theirs = theirs
        self.ours = ours
        self.sides = sides or Sides()
        self.runs = 0

    def compare(self, case: Case) -> Comparison:
        self.runs += 1
        t, t_err = self.theirs.run(case, self.sides)
        o, o_err = self.ours.run(case, self.sides)
        return Comparison(self.engine, case, t, o, t_err, o_err)


def agreement_table(engine: Engine, by_group: Mapping[str, Sequence[Comparison]]) -> str:
    """One row per feature group: cases, identical cases and their share, and in how many
    cases each field differs for at least one request."""
    fields = engine.outcome.FIELDS
    header = ["group", "cases", "identical", "share"] + [engine.outcome.SHORT[f] for f in fields] + ["error"]
    rows = [header]
    for group, comparisons in by_group.items():
        n = len(comparisons)
        same = sum(c.agrees for c in comparisons)
        counts = [sum(f in c.fields for c in comparisons) for f in fields + ("error",)]
        rows.append([group, str(n), str(same), f"{same / n:.0%}" if n else "-"] + [str(x) for x in counts])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
