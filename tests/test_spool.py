"""A large run's streamed rows never outlive their owner in the spool.

Rows past ``exact_requests`` go to a file in the spool until a results folder takes them. A run
never saved (the Python API, a failed or interrupted command) must not leave that file behind
for good -- each can be gigabytes, and every test-suite run here once left two more in /tmp --
and a run killed outright leaves its files to the next run that streams.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from schedlab.results.stream import SPOOL_PREFIX, SpoolFiles

EXPERIMENT = """
[experiment]
name = "spooled"
reports = []
exact_requests = 100

[workload]
kind = "synthetic"
num_requests = 400
rate = 50
prompt = {dist = "uniform", low = 10, high = 100}
output = {dist = "uniform", low = 1, high = 20}

[scheduler]
kind = "vllm"

[cost_model]
kind = "linear"

[sweep]
"workload.rate" = [40, 50]
"""


def run_api_in_a_process(tmp_path, jobs: int) -> list[str]:
    """Run the experiment through the Python API in a fresh interpreter, never saving it; the
    names in the spool while it runs (after the runs) and once it has exited."""
    (tmp_path / "exp.toml").write_text(EXPERIMENT)
    spool = tmp_path / "spool"
    script = textwrap.dedent(f"""
        import os, sys
        from schedlab.study.executor import make_executor
        from schedlab.study.experiment import load, run_experiment
        executor = make_executor("local", {jobs})
        results = run_experiment(load({str(tmp_path / "exp.toml")!r}), executor=executor)
        executor.close()
        assert all(r.rows_file for r in results.all_runs()), "the runs did not stream"
        print(len(os.listdir({str(spool)!r})))
    """)
    env = dict(os.environ, SCHEDLAB_SPOOL=str(spool))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [int(done.stdout.split()[-1]), sorted(os.listdir(spool))]


@pytest.mark.parametrize("jobs", [1, 2])
def test_rows_of_a_run_never_saved_leave_the_spool_when_their_owner_exits(tmp_path, jobs):
    during, after = run_api_in_a_process(tmp_path, jobs)
    assert during == 2  # one file per run while the results are held ...
    assert after == []  # ... none once the process that held them is gone


def test_files_of_an_owner_that_is_gone_are_removed_by_the_next_run_that_streams(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "gone": f"{SPOOL_PREFIX}{ended.pid}-abcd1234.parquet",
            "alive": f"{SPOOL_PREFIX}{alive.pid}-abcd1234.parquet",
            "older_name": f"{SPOOL_PREFIX}abcd1234.parquet",   # no owner in the name: kept
            "other": "notes.parquet",
        }
        for name in names.values():
            (spool / name).write_bytes(b"rows")
        removed = SpoolFiles.remove_abandoned(spool)
        assert [p.name for p in removed] == [names["gone"]]
        assert sorted(os.listdir(spool)) == sorted(n for k, n in names.items() if k != "gone")
    finally:
        alive.kill()
        alive.wait()


def test_a_saved_run_takes_its_rows_and_the_owner_removes_nothing_else(tmp_path):
    owned = SpoolFiles()
    kept = tmp_path / "kept.parquet"
    moved = tmp_path / "moved.parquet"
    for path in (kept, moved):
        path.write_bytes(b"rows")
        owned.own(path)
    os.replace(moved, tmp_path / "results.parquet")  # a results folder took it
    assert owned.discard() == [str(kept)]
    assert sorted(os.listdir(tmp_path)) == ["results.parquet"]


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_saved_rows_get_the_usual_permissions(tmp_path, monkeypatch, umask):
    """A spool file is made 0600 (mkstemp): once in a results folder its rows are read like the
    folder's other files, 0666 less the umask, whether moved out of the spool or copied."""
    import stat

    from schedlab.results.storage import save
    from schedlab.study.experiment import load, run_experiment

    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    (tmp_path / "exp.toml").write_text(EXPERIMENT)
    old = os.umask(umask)
    try:
        results = run_experiment(load(tmp_path / "exp.toml"))
        save(results, tmp_path / "out")  # moved from the spool
        save(results, tmp_path / "copy")  # copied from the first folder
    finally:
        os.umask(old)
    for folder in ("out", "copy"):
        rows = sorted((tmp_path / folder / "requests").iterdir())
        assert len(rows) == 2
        for path in rows + [tmp_path / folder / "summary.json"]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
