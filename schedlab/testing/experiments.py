"""An experiment file on both engines: the differential check of a TOML-declared layout."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import SchedlabError
from ..results import RunResult
from .compare import compare_runs

#: The two runs :func:`fast_run_agreeing_with_reference` adds to a copy of an experiment file.
BOTH_ENGINES = '\n[[runs]]\nname = "fast"\n[[runs]]\nname = "reference"\nengine = "reference"\n'


def fast_run_agreeing_with_reference(path, *, rel: float = 1e-9) -> RunResult:
    """Run the experiment file at ``path`` (without runs of its own) on the fast and on the
    reference engine, require them to agree, and return the fast run.

    The file is left unchanged: the two ``[[runs]]`` go into a temporary copy beside it (so
    relative paths and plugin modules resolve as from the file), removed when the runs are done
    or fail; schedlab's errors name ``path``, not the copy."""
    from ..study.experiment import load, run_experiment

    path = Path(path)
    text = path.read_bytes()
    fd, name = tempfile.mkstemp(prefix=".schedlab-kit-", suffix=".toml", dir=path.parent)
    copy = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text + BOTH_ENGINES.encode())
        exp = load(copy)
        exp.path = path  # (the experiment's name and results: the file's)
        runs = {r.name: r for r in run_experiment(exp).all_runs()}
    except SchedlabError as exc:
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (exc.args[0].replace(str(copy), str(path)), *exc.args[1:])
        raise
    finally:
        copy.unlink(missing_ok=True)
    compare_runs(runs["fast"], runs["reference"], rel=rel, labels=("fast", "reference"))
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
