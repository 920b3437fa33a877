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


def check_clients_gave_up(run: RunResult, timeout_ms: float, total: int) -> None:
    """A run of ``total`` requests whose clients give up ``timeout_ms`` after sending them, through
    the API server: some were dropped and every one finished or timed out; each dropped request
    left the engine no sooner than its client gave up, short of its answer."""
    m = run.metrics
    assert 0 < m["aborted"] <= m["timed_out"] < total and m["finished"] + m["timed_out"] == total, m
    assert m["client"]["frontend_ms"]["p50"] > 0  # requests went through the API server
    req = run.requests
    dropped = req["aborted"] == 1
    assert (req["finish_ms"][dropped] >= req["sent_ms"][dropped] + timeout_ms).all()
    assert (req["generated_tokens"][dropped] < req["output_tokens"][dropped]).all()
