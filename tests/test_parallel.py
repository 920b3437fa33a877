"""--jobs N: worker processes give byte-identical results, one progress bar, user errors intact."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import schedlab
from hypothesis import HealthCheck, given, settings, strategies as st

from schedlab.cli import main
from schedlab.errors import WorkloadError
from schedlab.study import runner
from schedlab.study.executor import InProcessExecutor, ProcessExecutor, make_executor
from schedlab.study.experiment import load, run_experiment
from study_case import saved_bytes, write_experiment


def run_with(path, executor):
    try:
        return run_experiment(load(path), executor=executor)
    finally:
        executor.close()


@settings(max_examples=5, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), jobs=st.integers(2, 3))
def test_worker_processes_write_the_same_bytes_as_one_process(tmp_path_factory, seed, jobs):
    folder = tmp_path_factory.mktemp("seed")
    path = write_experiment(folder, seed)
    serial = run_with(path, InProcessExecutor())
    parallel = run_with(path, ProcessExecutor(jobs))
    assert parallel.execution["workers"] == jobs
    assert saved_bytes(parallel, folder / "parallel") == saved_bytes(serial, folder / "serial")
    # and the seed matters (the comparison is not vacuous)
    summary = json.loads((folder / "serial" / "summary.json").read_text())
    assert summary["studies"][0]["runs"][0]["meta"]["seed"] == seed


def test_one_progress_bar_counts_every_simulation_on_the_path(tmp_path, monkeypatch):
    bars = []

    class Bar:
        def __init__(self, total, desc):
            self.total, self.desc, self.n = total, desc, 0
            bars.append(self)

        def update(self, n=1):
            self.n += n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(runner, "progress", Bar)
    results = run_with(write_experiment(tmp_path, 7), ProcessExecutor(2))
    (bar,) = bars
    studies = {s.name: s for s in results.studies}
    on_path = 1 + 3 + len(studies["tune"].search.probes) + 3  # one, grid, tune's probes, rep's replicas
    assert bar.n == bar.total == on_path
    assert results.execution["simulations"] >= on_path  # plus the search's speculative probes


def test_the_bar_moves_as_each_replica_finishes(tmp_path, monkeypatch):
    """Determinism review s79: a run of 40 replicas showed 0% until the last one finished (the bar counted a
    replicated run when it was whole); now each finished replica moves it, in order, in this process."""
    from schedlab.study.executor import InProcessExecutor

    steps = []

    class Bar:
        def __init__(self, total, desc):
            self.total, self.n = total, 0

        def update(self, n=1):
            self.n += n
            steps.append(self.n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(runner, "progress", Bar)
    (tmp_path / "r.toml").write_text(textwrap.dedent("""
        [experiment]
        replicas = 4
        [workload]
        kind = "synthetic"
        num_requests = 5
        rate = 10.0
        prompt = {dist = "fixed", value = 10}
        output = {dist = "fixed", value = 3}
        [[runs]]
        name = "one"
        [[runs]]
        name = "two"
        [runs.cluster]
        instances = 2
        partitions = 2
    """))
    run_with(tmp_path / "r.toml", InProcessExecutor())
    # one: a step a replica; two: 2 parts a replica, a step when both are in
    assert [n for i, n in enumerate(steps) if i == 0 or n != steps[i - 1]] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_user_error_in_a_worker_arrives_as_itself(tmp_path, monkeypatch):
    (tmp_path / "broken_workload_mod.py").write_text(textwrap.dedent("""
        import schedlab

        class Broken:
            def requests(self, seed):
                raise schedlab.WorkloadError(f"row 3 of the trace is bad (seed {seed})")

        @schedlab.hookimpl
        def schedlab_register_workloads(register):
            register("broken", Broken)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers import the module too
    (tmp_path / "exp.toml").write_text(textwrap.dedent("""
        [experiment]
        plugins = ["broken_workload_mod"]
        seed = 5
        [workload]
        kind = "broken"
        [scheduler]
        kind = "continuous"
        [sweep]
        "scheduler.max_num_seqs" = [1, 2, 3]
    """))
    # which point's error comes first depends on timing; each names its run
    with pytest.raises(WorkloadError, match=r"exp\.toml: run 'exp\[max_num_seqs=\d\]': workload 'broken' \(plugin "
                                            r"broken_workload_mod\): row 3 of the trace is bad \(seed 5\)$"):
        run_with(tmp_path / "exp.toml", ProcessExecutor(2))


def test_plugins_observing_iterations_run_in_this_process(tmp_path):
    seen = []

    class Observer:
        @schedlab.hookimpl
        def schedlab_iteration(self, instance, record):
            seen.append(instance)

    (tmp_path / "exp.toml").write_text('[workload]\nkind = "synthetic"\nnum_requests = 5\nrate = 2.0\n'
                                       'prompt = {dist = "fixed", value = 10}\noutput = {dist = "fixed", value = 4}\n')
    exp = load(tmp_path / "exp.toml", plugin_objects=(Observer(),))
    executor = ProcessExecutor(2)
    try:
        results = run_experiment(exp, executor=executor)
    finally:
        executor.close()
    assert results.execution["executor"] == "in this process"
    assert len(seen) == results.all_runs()[0].metrics["iterations"] > 0


def test_the_command_line_runs_with_jobs_and_says_where(tmp_path, capsys):
    path = write_experiment(tmp_path, 3)
    assert main(["run", str(path), "--out", str(tmp_path / "j2"), "--jobs", "2", "--no-plots"]) == 0
    assert "2 local processes" in capsys.readouterr().err
    assert main(["run", str(path), "--out", str(tmp_path / "j1"), "--jobs", "1", "--no-plots"]) == 0
    assert "in this process" in capsys.readouterr().err
    for name in ("summary.json", "requests.csv"):
        assert (tmp_path / "j1" / name).read_bytes() == (tmp_path / "j2" / name).read_bytes()
    timings = json.loads((tmp_path / "j2" / "timings.json").read_text())
    assert timings["execution"]["workers"] == 2 and {"one", "rep#1", "rep#3"} <= set(timings["wall_ms"])


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], "--jobs must be a whole number >= 1, got 0"),
    (["--address", "auto"], "--address is for --backend ray"),
])
def test_bad_execution_options_are_one_line_errors(tmp_path, capsys, argv, message):
    path = write_experiment(tmp_path, 1)
    assert main(["run", str(path), "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"schedlab: error: {message}"


def test_default_jobs_are_the_machine_cores(monkeypatch):
    monkeypatch.setattr("schedlab.study.executor.default_jobs", lambda: 1)
    assert isinstance(make_executor(), InProcessExecutor)
    monkeypatch.setattr("schedlab.study.executor.default_jobs", lambda: 3)
    executor = make_executor()
    try:
        assert isinstance(executor, ProcessExecutor) and executor.workers == 3
    finally:
        executor.close()


@pytest.mark.parametrize("shadow", ["empty", "partial"])
def test_workers_ignore_a_folder_named_schedlab_in_the_working_directory(tmp_path, shadow):
    """Run from a clone's parent directory, the workers imported ./schedlab instead of schedlab
    (Python 3.11 starts the fork server with ``python -c``, the working directory first on its path)."""
    import subprocess
    import sys

    fake = tmp_path / "schedlab"
    fake.mkdir()
    if shadow == "partial":
        (fake / "__init__.py").write_text("")
        (fake / "results.py").write_text("x = 1\n")
    experiment = write_experiment(tmp_path, 7)
    # as the console script runs: the script's folder, not the working directory, first on the path
    launcher = "import sys; sys.path.pop(0); from schedlab.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", launcher, "run", str(experiment), "--jobs", "2",
                           "--out", str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["studies"]


class _Recorded:
    """An executor, to be closed."""

    workers, description = 1, "recorded"

    def close(self, now: bool = False) -> None:
        raise AssertionError("replaced by the test")


@pytest.mark.parametrize("raised, closed", [(None, [False]), (ValueError, [False]), (KeyboardInterrupt, [True])])
def test_an_executor_is_closed_once_and_at_once_on_an_interrupt(monkeypatch, raised, closed):
    """An interrupt stops running tasks too (a signal to this process alone does not reach
    its workers); the stop is acknowledged first, so no second one cuts the clean-up short."""
    from schedlab import interrupts
    from schedlab.study.executor import closing

    ex = _Recorded()
    order = []
    monkeypatch.setattr(interrupts, "acknowledge", lambda: order.append("acknowledged"))
    monkeypatch.setattr(ex, "close", lambda now=False: order.append(("closed", now)))
    with pytest.raises(raised) if raised is not None else contextlib.nullcontext():
        with closing(ex):
            if raised is not None:
                raise raised()
    assert order == (["acknowledged"] if raised is KeyboardInterrupt else []) + [("closed", closed[0])]


def test_an_interrupted_pool_stops_its_running_workers_at_once():
    """close(now=True) does not wait for a running task: its worker is terminated."""
    import time

    ex = ProcessExecutor(1)
    future = ex._pool.submit(time.sleep, 60)
    while not future.running():
        time.sleep(0.01)
    workers = list(ex._pool._processes.values())
    ex.close(now=True)
    assert workers and all(not w.is_alive() for w in workers)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_workers_end_when_the_main_process_is_killed_outright(tmp_path):
    """SIGKILL gives the main process no chance to stop its pool: each worker watches for it and
    ends itself, rather than finishing (here: sleeping through) its task as an orphan."""
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        from schedlab.study.executor import ProcessExecutor
        if __name__ == "__main__":
            executor = ProcessExecutor(1)
            worker = executor._pool.submit(os.getpid).result()
            executor._pool.submit(time.sleep, 120)
            time.sleep(0.5)
            print(worker, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """))
    out = tmp_path / "out.txt"
    with open(out, "w") as fh:  # (a file, not a pipe: the fork server keeps the main's stdout open)
        main = subprocess.Popen([sys.executable, str(script)], stdout=fh, stderr=subprocess.DEVNULL)
        for _ in range(1200):  # the main prints its worker's pid, then kills itself
            if _gone(main.pid):
                break
            time.sleep(0.1)
        worker = int(out.read_text().split()[0])
        # the main is a zombie until collected (os.kill(pid, 0) still finds it): the worker must
        # not wait for that, as a parent reading the main's output to its end never collects it
        for _ in range(200):  # the watcher polls every second; allow for a loaded machine
            if _gone(worker):
                break
            time.sleep(0.1)
        assert _gone(worker)
        assert main.wait(timeout=120) == -signal.SIGKILL
