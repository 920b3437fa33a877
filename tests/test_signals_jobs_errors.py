"""Four robustness gaps: staging folders a killed run left, SIGHUP, an unbounded ``--jobs``, and
a plugin's exception printed as a worker's traceback."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from schedlab.cli import main
from study_case import LONG_RUN as LONG

SMALL = """
[experiment]
name = "small"
reports = ["json"]

[workload]
kind = "synthetic"
num_requests = 20
rate = 5.0
prompt = {dist = "fixed", value = 10}
output = {dist = "fixed", value = 4}
"""



def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def dead_pid() -> int:
    """The pid of a process that has ended (and been collected)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def experiment(tmp_path: Path, text: str = SMALL, name: str = "small.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- 1. what a killed run left beside its results folder ------------------------------------------------------


def test_a_run_removes_the_staging_folders_killed_runs_left_and_nothing_else(tmp_path, capsys):
    """After SIGKILL or a power cut, ``.out.<pid>.<random>.tmp`` stayed beside ``out`` for ever."""
    dead, parent = dead_pid(), tmp_path / "parent"
    parent.mkdir()
    out = parent / "out"
    gone = [f".out.{dead}.abcd1234.tmp", f".out.{dead}.k3j_x9a2.old"]
    kept = [f".out.{os.getpid()}.live1234.tmp",  # its owner is alive (here: this process)
            f".out.{os.getppid()}.live5678.tmp",
            ".out.oldstyle.tmp",                  # no pid (an older schedlab): left alone
            f".other.{dead}.abcd1234.tmp",        # another results folder's
            f".out.{dead}.abcd1234.tmpx", f".out.{dead}.abc.tmp", f".out.x{dead}.abcd1234.tmp",
            f".out.{dead}.filefile.tmp",          # a file, not a folder
            f".out.{dead}.linklink.tmp"]          # a symbolic link (to a folder that must survive)
    for name in gone + kept[:-2]:
        (parent / name / "previous").mkdir(parents=True)
        (parent / name / "previous" / "summary.json").write_text("{}")
    (parent / kept[-2]).write_text("not a folder")
    target = tmp_path / "elsewhere"
    (target / "keep").mkdir(parents=True)
    (parent / kept[-1]).symlink_to(target, target_is_directory=True)
    assert main(["run", str(experiment(tmp_path)), "--no-plots", "--out", str(out)]) == 0
    assert (out / "summary.json").is_file()
    assert hidden(parent) == sorted(kept)
    assert (target / "keep").is_dir()


def test_a_run_killed_outright_leaves_a_folder_the_next_run_removes(tmp_path):
    """The whole story: SIGKILL a run (its staging folder stays), run again into the same folder."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "schedlab", "run", str(experiment(tmp_path, LONG, "long.toml")),
                             "--out", str(out), "-j", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr.readline() == "schedlab: long: 1 run(s)\n"  # the staging folder is made by now
        proc.kill()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    left = hidden(tmp_path)
    assert len(left) == 1 and left[0].startswith(f".out.{proc.pid}.") and left[0].endswith(".tmp"), left
    assert main(["run", str(experiment(tmp_path)), "--no-plots", "--out", str(out)]) == 0
    assert hidden(tmp_path) == []


def test_plot_removes_its_own_leftovers_and_a_run_still_replaces_the_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(experiment(tmp_path)), "--no-plots", "--out", str(out)]) == 0
    dead_one, live_one = f".schedlab-files.{dead_pid()}.abcd1234.tmp", f".schedlab-files.{os.getpid()}.live1234.tmp"
    for name in (dead_one, live_one):
        (out / name / "plots").mkdir(parents=True)
        (out / name / "plots" / "half.png").write_bytes(b"\x89PNG")
    assert main(["plot", str(out)]) == 0
    assert not (out / dead_one).exists() and (out / live_one / "plots" / "half.png").is_file()
    # a live one in the folder does not make it "a folder with files schedlab did not write"
    assert main(["run", str(experiment(tmp_path)), "--no-plots", "--out", str(out)]) == 0
    assert not (out / live_one).exists()


def test_a_file_write_removes_the_half_files_killed_writers_left_and_nothing_else(tmp_path):
    """``atomic_write`` (a calibration's or a plan's output written outside a results folder) names
    its temporary file with its pid; the next write to the same path removes a dead writer's."""
    from schedlab.results.storage import atomic_write

    dead, target = dead_pid(), tmp_path / "fit.toml"
    gone = [f".fit.toml.{dead}.abcd1234.tmp"]
    kept = [f".fit.toml.{os.getpid()}.live1234.tmp",   # a live writer's (here: this process)
            f".fit.toml.{dead}.dirdir12.tmp",          # a folder: not a half file
            f".other.toml.{dead}.abcd1234.tmp",        # another file's
            ".fit.toml.abcd1234.tmp"]                  # no pid (an older schedlab): left alone
    for name in gone + kept:
        (tmp_path / name).write_text("half") if "dirdir" not in name else (tmp_path / name).mkdir()
    atomic_write(target, "whole")
    assert target.read_text() == "whole"
    assert hidden(tmp_path) == sorted(kept)


def test_a_failed_write_under_a_relative_path_names_the_file_not_its_temporary_one(tmp_path, monkeypatch):
    """mkstemp names the temporary file absolutely, so under a relative folder the error named the
    hidden temporary file that was gone already."""
    from schedlab.results.storage import atomic_write

    monkeypatch.chdir(tmp_path)
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "index.html").mkdir()  # (the rename onto a folder fails)
    with pytest.raises(OSError) as info:
        atomic_write(Path("res") / "index.html", "x")
    assert info.value.filename == str(Path("res") / "index.html")
    assert hidden(tmp_path / "res") == []


# -- 2. SIGHUP ---------------------------------------------------------------------------------------------------


@pytest.fixture
def restore_signals():
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)
    saved = {sig: signal.getsignal(sig) for sig in sigs}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_sighup_stops_like_sigterm_and_is_ignored_after(restore_signals):
    from schedlab.interrupts import HungUp, SignalGuard, Terminated, stop_status

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a command: it stays ignored
    with SignalGuard():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    with pytest.raises(HungUp) as caught:
        with SignalGuard() as guard:
            assert signal.getsignal(signal.SIGHUP) == guard._on_signal  # (else the signal would end pytest)
            os.kill(os.getpid(), signal.SIGHUP)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.01)
    assert isinstance(caught.value, Terminated)
    assert stop_status(caught.value) == ("hung up (SIGHUP)", 129)
    assert stop_status(Terminated()) == ("terminated (SIGTERM)", 143)
    assert stop_status(KeyboardInterrupt()) == ("interrupted", 130)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # the process is ending


def test_a_stop_inside_a_deferred_block_comes_after_it(restore_signals):
    """Signals held with pthread_sigmask in the main thread still reached the handler when the
    kernel handed them to another thread (a process pool's): a worker's start was cut in two,
    and that worker printed a traceback once the pool had gone."""
    import threading

    from schedlab.interrupts import SignalGuard, Terminated, deferred

    done = []
    with pytest.raises(Terminated):
        with SignalGuard():
            with deferred():
                helper = threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM))
                helper.start()  # the helper thread takes the signal itself
                helper.join()
                for _ in range(100):
                    time.sleep(0.01)  # the handler runs meanwhile, and only notes the stop
                done.append("block")
            done.append("after")
    assert done == ["block"]


def test_a_stop_that_broke_the_deferred_block_is_the_stop(restore_signals):
    """A terminal's Ctrl-C reaches the process pool's fork server too: one killed while it started
    a worker left the submit in the deferred block failing with EOFError, which escaped as a
    traceback (exit 1) instead of the interrupt (review s81 badinput, finding 1). Without a stop the
    block's own error stays its own."""
    import threading

    from schedlab.interrupts import SignalGuard, Terminated, deferred

    with pytest.raises(Terminated) as caught:
        with SignalGuard():
            with deferred():
                helper = threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM))
                helper.start()
                helper.join()
                for _ in range(100):
                    time.sleep(0.01)
                raise EOFError("unexpected EOF")
    assert isinstance(caught.value.__cause__, EOFError)
    with pytest.raises(EOFError):
        with SignalGuard():
            with deferred():
                raise EOFError("unexpected EOF")


def _sighup_default() -> None:
    """(In the child: SIGHUP as a terminal session has it, even when these tests run under nohup.)"""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _run_and_signal(tmp_path: Path, jobs: str, group: bool, close_stderr: bool = False):
    out = tmp_path / "results"
    assert main(["run", str(experiment(tmp_path)), "--no-plots", "--out", str(out)]) == 0
    before = snapshot(out)
    proc = subprocess.Popen([sys.executable, "-m", "schedlab", "run", str(experiment(tmp_path, LONG, "long.toml")),
                             "--out", str(out), "-j", jobs], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=group, preexec_fn=_sighup_default)
    try:
        first = proc.stderr.readline()
        assert first == "schedlab: long: 1 run(s)\n", first
        time.sleep(1.0)  # (the workers have started)
        if close_stderr:  # the terminal has gone: writing to it fails
            proc.stderr.close()
        if group:  # as a closing terminal does: the whole process group, workers too
            os.killpg(proc.pid, signal.SIGHUP)
        else:
            proc.send_signal(signal.SIGHUP)
        err = first + ("" if close_stderr else proc.stderr.read())
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, snapshot(out) == before, hidden(tmp_path)


@pytest.mark.parametrize("jobs, group", [("1", False), ("2", True)])
def test_a_hung_up_run_says_so_in_one_line_and_leaves_the_folder(tmp_path, capsys, jobs, group):
    """Before: SIGHUP (closing the terminal) ended a run like SIGKILL: no word, a staging folder
    left behind; with the whole group hung up, the pool's resource tracker printed tracebacks."""
    status, err, untouched, left = _run_and_signal(tmp_path, jobs, group)
    assert status == 129, err
    assert err.splitlines() == ["schedlab: long: 1 run(s)",
                                "schedlab: hung up (SIGHUP); no results were written (a previous results folder "
                                "is left as it was)"], err
    assert untouched and left == []


def test_a_hung_up_run_whose_terminal_has_gone_still_ends_cleanly(tmp_path, capsys):
    """Its one message cannot be written any more: that must not turn exit 129 into a traceback."""
    status, _err, untouched, left = _run_and_signal(tmp_path, "1", False, close_stderr=True)
    assert status == 129
    assert untouched and left == []


# -- 3. --jobs ----------------------------------------------------------------------------------------------------


SWEEP = SMALL + '\n[sweep]\n"workload.rate" = [1, 2, 3, 4, 5, 6]\n'


@pytest.fixture
def pools(monkeypatch):
    """Every ProcessExecutor the command line makes."""
    from schedlab.study import executor as executor_module

    made = []

    class Recorded(executor_module.ProcessExecutor):
        def __init__(self, jobs):
            super().__init__(jobs)
            made.append(self)

    monkeypatch.setattr(executor_module, "ProcessExecutor", Recorded)
    return made


def test_jobs_beyond_four_per_cpu_are_clamped_and_said_once(tmp_path, capsys, monkeypatch, pools):
    """``-j 100000`` on a 60-point sweep started 60 processes on 2 cores."""
    monkeypatch.setattr("schedlab.study.executor.default_jobs", lambda: 1)
    out = tmp_path / "out"
    assert main(["run", str(experiment(tmp_path, SWEEP)), "--no-plots", "--out", str(out), "-j", "100000"]) == 0
    err = capsys.readouterr().err
    assert err.count("schedlab: -j 100000: using 4 worker processes (4 per CPU)\n") == 1, err
    (pool,) = pools
    assert pool.workers == 4 and 1 <= pool.started <= 4
    assert f"{pool.started} local processes" in err


def test_jobs_within_the_bound_are_kept(monkeypatch, capsys):
    from schedlab.study.executor import ProcessExecutor, make_executor

    monkeypatch.setattr("schedlab.study.executor.default_jobs", lambda: 2)
    executor = make_executor("local", 8)
    try:
        assert isinstance(executor, ProcessExecutor) and executor.workers == 8
    finally:
        executor.close()
    assert capsys.readouterr().err == ""


def test_no_more_workers_start_than_tasks(tmp_path):
    from schedlab.study.executor import ProcessExecutor, closing
    from schedlab.study.experiment import load, run_experiment

    exp = load(experiment(tmp_path, SMALL + '\n[sweep]\n"workload.rate" = [1, 2, 3]\n'))
    with closing(ProcessExecutor(8)) as executor:
        results = run_experiment(exp, executor=executor)
        processes = len(executor._pool._processes)
    assert processes <= 3 and executor.started == processes
    assert results.execution["executor"] == f"{processes} local processes"


# -- 4. a plugin's own exception -----------------------------------------------------------------------------------


PLUGIN = '''
import schedlab
from schedlab_plugins.schedulers import StaticConfig, StaticScheduler


class Boom(StaticScheduler):
    def schedule(self, plan):
        raise ValueError("boom")


class Report:
    def write(self, results, out_dir):
        return {}["missing"]


@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("boomer", Boom, config=StaticConfig)


@schedlab.hookimpl
def schedlab_register_reports(register):
    register("broken_report", Report)
'''

FIFO = """
[experiment]
name = "fifo"
plugins = ["boom_plugin_xyz"]
reports = ["json"]

[workload]
kind = "synthetic"
num_requests = 5
rate = 2.0
prompt = {dist = "fixed", value = 10}
output = {dist = "fixed", value = 4}

[scheduler]
kind = "boomer"

[sweep]
"workload.rate" = [5, 6]
"""

BOOM = ("scheduler 'boomer' (plugin boom_plugin_xyz) raised ValueError: boom (boom_plugin_xyz.py:8 in Boom.schedule; "
        "SCHEDLAB_TRACEBACK=1 prints the traceback)")


def one_of_the_runs(line: str, exp: Path) -> bool:
    """The message for either point (which fails first depends on timing with -j 2)."""
    return any(line == f"schedlab: error: {exp}: run 'fifo[rate={rate}]': {BOOM}" for rate in (5, 6))


@pytest.fixture
def boom_plugin(tmp_path, monkeypatch):
    (tmp_path / "boom_plugin_xyz.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers import it too
    monkeypatch.delenv("SCHEDLAB_TRACEBACK", raising=False)
    yield tmp_path
    sys.modules.pop("boom_plugin_xyz", None)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_plugins_exception_in_a_run_is_one_line(boom_plugin, capsys, jobs):
    """Before: the worker's whole concurrent.futures traceback (-j 2), or the plugin's (-j 1), exit 1."""
    exp = experiment(boom_plugin, FIFO, "exp.toml")
    out = boom_plugin / "out"
    assert main(["run", str(exp), "--no-plots", "--out", str(out), "-j", jobs]) == 2
    err = capsys.readouterr().err
    assert one_of_the_runs(err.splitlines()[-1], exp), err
    assert "Traceback" not in err and not out.exists() and hidden(boom_plugin) == []


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_traceback_is_there_on_demand(boom_plugin, capsys, monkeypatch, jobs):
    monkeypatch.setenv("SCHEDLAB_TRACEBACK", "1")
    exp = experiment(boom_plugin, FIFO, "exp.toml")
    assert main(["run", str(exp), "--no-plots", "--out", str(boom_plugin / "out"), "-j", jobs]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err and 'raise ValueError("boom")' in err
    assert one_of_the_runs(err.splitlines()[-1], exp), err


def test_a_reports_exception_is_one_line(boom_plugin, capsys):
    exp = experiment(boom_plugin, FIFO.replace('kind = "boomer"', 'kind = "continuous"')
                     .replace('reports = ["json"]', 'reports = ["json", "broken_report"]'), "exp.toml")
    assert main(["run", str(exp), "--no-plots", "--out", str(boom_plugin / "out"), "-j", "1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"schedlab: error: {exp}: report 'broken_report' (plugin boom_plugin_xyz) raised KeyError: 'missing' "
        "(boom_plugin_xyz.py:13 in Report.write; SCHEDLAB_TRACEBACK=1 prints the traceback); the 7 files the other "
        f"reports wrote are in {boom_plugin / 'out'}"), err   # (the json report's 6 and the index: the results are kept)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_errors_schedlab_raises_on_purpose_keep_their_message(tmp_path, capsys, monkeypatch, jobs):
    (tmp_path / "stalling_plugin_xyz.py").write_text(textwrap.dedent('''
        import schedlab
        from schedlab_plugins.schedulers import StaticConfig, StaticScheduler

        class Refuses(StaticScheduler):
            def schedule(self, plan):
                raise schedlab.SimulationError("refuses to schedule")

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("refuses", Refuses, config=StaticConfig)
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    text = FIFO.replace("boom_plugin_xyz", "stalling_plugin_xyz").replace('"boomer"', '"refuses"')
    exp = experiment(tmp_path, text.replace("[sweep]\n\"workload.rate\" = [5, 6]\n", ""), "exp.toml")
    try:
        assert main(["run", str(exp), "--no-plots", "--out", str(tmp_path / "out"), "-j", jobs]) == 2
    finally:
        sys.modules.pop("stalling_plugin_xyz", None)
    assert capsys.readouterr().err.splitlines()[-1] == (  # (the plugin named before its own message)
        f"schedlab: error: {exp}: run 'fifo': scheduler 'refuses' (plugin stalling_plugin_xyz): refuses to schedule")


def test_a_bug_in_schedlab_itself_keeps_its_traceback(tmp_path, monkeypatch):
    """Only a plugin's exception becomes one line: an exception raised in schedlab's code alone is not."""
    from schedlab.study import runner

    def broken(*args, **kwargs):
        raise ZeroDivisionError("schedlab's own bug")

    monkeypatch.setattr(runner, "progress", broken)
    with pytest.raises(ZeroDivisionError, match="schedlab's own bug"):
        main(["run", str(experiment(tmp_path)), "--no-plots", "--out", str(tmp_path / "out"), "-j", "1"])


def test_a_plugin_error_travels_between_processes_with_its_traceback():
    from schedlab.errors import PluginError

    error = pickle.loads(pickle.dumps(PluginError("exp.toml: run 'x': it broke", "Traceback ...")))
    assert str(error) == "exp.toml: run 'x': it broke" and error.details == "Traceback ..."


@pytest.mark.parametrize("guarded", [False, True])
def test_a_driver_script_without_a_main_guard_runs_in_its_own_process_instead_of_hanging(tmp_path, guarded):
    """Determinism review s79: a script calling cli.main([... "--jobs", "2"]) at its top level hung for ever -- each
    worker the fork server started ran the script again, whose call tried to start workers of its own. Without
    the guard it now runs in this process and says why; with it, in worker processes as asked."""
    experiment = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.toml"
    call = f'main(["run", {str(experiment)!r}, "--out", {str(tmp_path / "out")!r}, "--jobs", "2"])'
    body = f'if __name__ == "__main__":\n    {call}\n' if guarded else call + "\n"
    script = tmp_path / "drive.py"
    script.write_text("from schedlab.cli import main\n" + body)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "summary.json").is_file()
    said = f'schedlab: {script} starts schedlab without `if __name__ == "__main__":`'
    assert (said in done.stderr) is not guarded, done.stderr
    assert ("simulations in" in done.stderr and ("in this process" in done.stderr) is not guarded), done.stderr


@pytest.mark.parametrize("sig, said, status", [(signal.SIGINT, "interrupted", 130),
                                               (signal.SIGTERM, "terminated (SIGTERM)", 143)])
def test_a_signal_while_the_command_loads_ends_it_in_one_line(sig, said, status):
    """Determinism review s79: Ctrl-C in the second or so the command takes to import printed a Python traceback,
    and SIGTERM ended it without a word. The signal here comes while schedlab.cli is being imported."""
    code = textwrap.dedent(f"""
        import importlib.abc, os, sys, time
        class SignalOnImport(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "schedlab.cli":
                    os.kill(os.getpid(), {int(sig)})
                    time.sleep(5)
                return None
        sys.meta_path.insert(0, SignalOnImport())
        from schedlab.entry import main
        sys.exit(main())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (status, f"schedlab: {said} while starting; nothing was written\n")


SUBCLASS_PLUGIN = '''
import schedlab
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler


class Mine(ContinuousScheduler):
    def schedule(self, plan):
        raise ValueError("mine")


def build_mine(config):
    return Mine(config)


@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("mine", build_mine, config=ContinuousConfig)
'''


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_subclass_a_factory_function_builds_is_blamed_by_its_own_name(tmp_path, capsys, monkeypatch, jobs):
    """A plugin subclassing a built-in scheduler, registered through a factory function (as the
    README's plugins are): its error named the built-in 'continuous', the first registered class
    of its MRO (review s81 plugin, finding 2). The run's catalog says what built the object."""
    (tmp_path / "sub_plugin_xyz.py").write_text(SUBCLASS_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SCHEDLAB_TRACEBACK", raising=False)
    try:
        exp = experiment(tmp_path, FIFO.replace("boom_plugin_xyz", "sub_plugin_xyz")
                         .replace('kind = "boomer"', 'kind = "mine"'), "exp.toml")
        assert main(["run", str(exp), "--no-plots", "--out", str(tmp_path / "out"), "-j", jobs]) == 2
        last = capsys.readouterr().err.splitlines()[-1]
        assert "scheduler 'mine' (plugin sub_plugin_xyz) raised ValueError: mine (sub_plugin_xyz.py:8 in " \
            "Mine.schedule;" in last, last
    finally:
        sys.modules.pop("sub_plugin_xyz", None)
