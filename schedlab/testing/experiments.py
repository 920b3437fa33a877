"""An experiment file on both engines: the differential check of a TOML-declared layout."""

from __future__ import annotations

from pathlib import Path

from ..results import RunResult
from .kit import compare_runs

#: The two runs :func:`fast_run_agreeing_with_reference` appends to an experiment file.
BOTH_ENGINES = '\n[[runs]]\nname = "fast"\n[[runs]]\nname = "reference"\nengine = "reference"\n'


def fast_run_agreeing_with_reference(path, *, rel: float = 1e-9) -> RunResult:
    """Run the experiment file at ``path`` (without runs of its own) on the fast and on the
    reference engine -- two ``[[runs]]`` are appended to it -- require them to agree, and
    return the fast run."""
    from ..study.experiment import load, run_experiment

    path = Path(path)
    path.write_text(path.read_text() + BOTH_ENGINES)
    runs = {r.name: r for r in run_experiment(load(path)).all_runs()}
    compare_runs(runs["fast"], runs["reference"], rel=rel)
    return runs["fast"]
