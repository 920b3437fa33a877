"""Where tasks run: this process, local worker processes, or (``ray_backend``) a Ray cluster.

Every executor has the same two methods and one number, so the study runner never knows
which one it drives::

    executor.workers          # how many tasks run at once (sets the search's probe width)
    executor.submit(task)     # -> concurrent.futures.Future of RunResult | TaskFailure
    executor.close()          # stop workers it started; pending tasks are cancelled
    executor.close(now=True)  # ... and running ones stopped too (an interrupt: see closing)

Results never depend on the executor: a task carries its seed and tables, and the runner
assembles results in file order, not in completion order. Nor do errors: an exception a
plugin raises in a task (a bug in it, not a schedlab error) comes back from every executor as
the same one-line :class:`~schedlab.errors.PluginError` naming the run, the plugin and its
line (:func:`run_task`), never as a worker's traceback.

Local worker processes start as tasks arrive (never more than were submitted, nor more than
``workers``), and ``--jobs`` asks for at most :data:`JOBS_PER_CPU` per CPU: more is clamped,
with one line on stderr (``-j 100000: using 8 worker processes (4 per CPU)``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Protocol

from .. import interrupts
from ..errors import PLUGIN_RAISES, ConfigError, plugin_error
from ..results.stream import SPOOL, SPOOL_OWNER_ENV, SPOOL_PREFIX
from .simulation import Context
from .tasks import RunTask, TaskFailure, execute

BACKENDS = ("local", "ray")
#: Local worker processes ``--jobs`` may start per CPU: more only wait for a CPU (and each
#: holds its own memory), so a larger ``--jobs`` (a typo, ``-j 100000``) is clamped to this.
JOBS_PER_CPU = 4


class Executor(Protocol):
    workers: int
    description: str

    def submit(self, task: RunTask) -> Future: ...

    def close(self, now: bool = False) -> None: ...


@contextmanager
def closing(executor: Executor) -> Iterator[Executor]:
    """Close ``executor`` when the block ends. On Ctrl-C or SIGTERM the stop is acknowledged
    first (:mod:`schedlab.interrupts`: no second interrupt cuts the clean-up short -- one used
    to leave a worker pool's semaphores behind, which Python's resource tracker reported at
    exit) and running tasks are stopped too, not waited for (a signal sent to this process
    alone does not reach its workers)."""
    try:
        yield executor
    except KeyboardInterrupt:
        interrupts.acknowledge()
        executor.close(now=True)
        raise
    except BaseException:
        executor.close()
        raise
    executor.close()


def default_jobs() -> int:
    """The machine's cores (as many as this process may use)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_task(task: RunTask, context: Context | None = None, observer: Callable | None = None):
    """:func:`~schedlab.study.tasks.execute`, with an exception a plugin raised returned as a
    :class:`~schedlab.study.tasks.TaskFailure` holding a :class:`~schedlab.errors.PluginError` (worked
    out here, where the traceback is: a worker's does not travel). Any other exception (a bug
    in schedlab itself) is raised as it is."""
    built: list = []
    try:
        return execute(task, context, observer, built)
    except PLUGIN_RAISES as exc:  # (a plugin's sys.exit() is its error, not ours)
        try:
            catalog = (context if context is not None else built[0] if built else task.context.build()).catalog
        except Exception:  # (it built a moment ago; if not now, there is nothing to go by)
            raise exc from None
        error = plugin_error(exc, catalog, f"{task.context.source}: run {task.spec.name!r}")
        if error is None:
            raise
        return TaskFailure(error)


class InProcessExecutor:
    """Runs each task when submitted, in this process, with the experiment's own catalog
    (so plugins registered in-process and the per-iteration observer hook work)."""

    workers = 1
    description = "in this process"

    def __init__(self, context: Context | None = None, observer: Callable | None = None):
        self.context = context
        self.observer = observer

    def submit(self, task: RunTask) -> Future:
        future: Future = Future()
        future.set_result(run_task(task, self.context, self.observer))
        return future

    def close(self, now: bool = False) -> None:
        pass


def _process_context():
    """Fresh processes forked from a server that has imported schedlab (fast to start, and
    inheriting nothing of this process but ``sys.path``); plain spawn where there is no fork."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["schedlab.study.tasks"])
        _start_forkserver()
        return context
    return multiprocessing.get_context("spawn")


def _start_forkserver() -> None:
    """Start the fork server in Python's safe-path mode (``PYTHONSAFEPATH``). Python 3.11 starts it
    with ``python -c``, which puts the working directory first on its import path: a folder named
    ``schedlab`` there (a clone's parent directory, say) was imported instead of schedlab."""
    saved = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        with _sighup_ignored():
            multiprocessing.forkserver.ensure_running()  # (and the resource tracker, which it starts first)
    finally:
        if saved is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = saved


@contextmanager
def _sighup_ignored():
    """SIGHUP ignored while the block starts helper processes, which keep that (the fork server,
    the resource tracker). A closed terminal hangs up the whole process group: a resource tracker
    killed by it was relaunched and printed a traceback per semaphore as the run stopped. The
    helpers end with the main process anyway. (A SIGHUP during these few milliseconds is lost.)"""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous if previous is not None else signal.SIG_DFL)


def _main_is_gone(main_pid: int, parent_pid: int) -> bool:
    """True once the process that started the pool has died (or the fork server it used has:
    this process was handed to another parent)."""
    if os.getppid() != parent_pid:
        return True
    try:
        os.kill(main_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # (a pid taken over by another user's process)
        return True
    return _is_zombie(main_pid)


def _is_zombie(pid: int) -> bool:
    """True for a process that has died but is not yet collected by its parent (Linux's /proc;
    elsewhere False). ``os.kill(pid, 0)`` still succeeds on one, and a parent that reads the dead
    main's output to its end before collecting it waits on the pipes the workers hold open."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def own_spooled_rows(future: Future) -> None:
    """A task's result arrived in this process: the row file it streamed to the spool (a large
    run's) is this process's now, removed at exit unless a results folder takes it
    (:class:`~schedlab.results.stream.SpoolFiles`)."""
    if future.cancelled() or future.exception() is not None:
        return
    rows_file = getattr(future.result(), "rows_file", None)
    if rows_file and os.path.basename(rows_file).startswith(SPOOL_PREFIX):
        SPOOL.own(rows_file)


def start_worker(main_pid: int) -> None:
    """A worker's initializer: ignore SIGHUP -- a closed terminal hangs up the whole process
    group, and the main process stops its workers itself (:func:`closing`), or they end on their
    own once it is gone (:func:`watch_main`) -- then watch the main process."""
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    interrupts.watch_worker_interrupts()  # (a plugin's own KeyboardInterrupt is then its error)
    os.environ[SPOOL_OWNER_ENV] = str(main_pid)  # the rows a task streams are the main process's to keep or drop
    watch_main(main_pid)


def watch_main(main_pid: int, poll_s: float = 1.0) -> None:
    """A worker's initializer: end this worker once ``main_pid`` is gone. A main process killed
    outright (SIGKILL, the out-of-memory killer, ``subprocess.run``'s timeout) cannot stop its
    workers, and a worker busy with a long simulation would otherwise run on, orphaned."""
    parent_pid = os.getppid()

    def watch():
        while not _main_is_gone(main_pid, parent_pid):
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="schedlab-watch-main", daemon=True).start()


class ProcessExecutor:
    """Up to ``jobs`` worker processes on this machine; a task behaves in them exactly as it
    would anywhere else (it rebuilds its catalog, its seed is its own). Each worker ends itself
    if this process dies without stopping it (:func:`watch_main`).

    A worker starts when a task is submitted and none is idle (the pool's fork-server or spawn
    start), so no more start than tasks are submitted: :attr:`started` counts them.
    """

    def __init__(self, jobs: int):
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ConfigError(f"--jobs must be a whole number >= 1, got {jobs!r}")
        self.workers = jobs
        self.started = 0
        context = _process_context()
        self._forked = context.get_start_method() == "forkserver"
        self._pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=start_worker, initargs=(os.getpid(),))

    @property
    def description(self) -> str:
        """``"N local processes"``: the workers started (``jobs`` before any task)."""
        return f"{self.started or self.workers} local processes"

    def submit(self, task: RunTask) -> Future:
        """Submit ``task``, starting a worker if none is idle. A stop waits meanwhile
        (:func:`~schedlab.interrupts.deferred`): one in the middle of a start left a worker the
        pool did not know of, so not stopped, which printed a traceback once the pool had gone.
        (Only with the fork server: without a :class:`~schedlab.interrupts.SignalGuard` the
        signals are blocked, which a worker spawned from this process would inherit.)"""
        with interrupts.deferred() if self._forked else nullcontext():
            future = self._pool.submit(run_task, task)
        future.add_done_callback(own_spooled_rows)
        self.started = max(self.started, len(getattr(self._pool, "_processes", None) or ()))  # (no public count)
        return future

    def close(self, now: bool = False) -> None:
        """Cancel pending tasks and stop the workers: once their running tasks end, or (``now``)
        at once.

        ``now`` cannot leave the pool's manager thread blocked, which Python joins at exit (it
        used to hang there for ever, every stop signal ignored): a worker stopped partway through
        sending a result (one larger than a pipe's buffer goes in pieces) leaves that thread
        reading the rest, and only EOF ends the read. So this process's own copy of the result
        pipe's write end is closed first; once the workers are gone no copy is left and the read
        ends (the thread marks the pool broken and returns). Should it still be blocked after
        :data:`MANAGER_JOIN_S` (some other process holding a copy), the interpreter's exit is told
        not to wait for it (:func:`_exit_without`)."""
        if not now:
            self._pool.shutdown(wait=True, cancel_futures=True)
            return
        pool = self._pool
        workers = list((getattr(pool, "_processes", None) or {}).values())  # (no public handle)
        manager = getattr(pool, "_executor_manager_thread", None)  # (shutdown forgets both)
        results = getattr(pool, "_result_queue", None)
        calls = getattr(pool, "_call_queue", None)
        _close_end(results, "_writer")  # (only the workers write results; none starts after the shutdown)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in workers:
            process.terminate()
        for process in workers:
            process.join(1)
            if process.is_alive():  # (a worker that ignores SIGTERM)
                process.kill()
                process.join(1)
        if manager is not None and manager is not threading.current_thread():
            manager.join(MANAGER_JOIN_S)
            if manager.is_alive():
                _exit_without(manager)
                _close_end(calls, "_reader")  # (a task half sent then ends in EPIPE)


#: Seconds :meth:`ProcessExecutor.close` waits for the pool's manager thread after stopping the workers.
MANAGER_JOIN_S = 5.0


def _close_end(queue, end: str) -> None:
    """Close this process's copy of one end of a pool's ``queue`` (``"_writer"``: the result queue's,
    so a half-sent result ends in EOF once the workers are gone; ``"_reader"``: the call queue's,
    whose feeder thread Python joins at exit -- with no reader left, a write it is blocked in fails
    and it ends)."""
    connection = getattr(queue, end, None)
    if connection is None:
        return
    try:
        connection.close()
    except OSError:
        pass


def _exit_without(thread: threading.Thread) -> None:
    """Let the interpreter exit without joining ``thread`` (a pool's manager thread still blocked):
    ``concurrent.futures`` joins it at exit, and so does ``threading`` (it is not a daemon). Both
    through private names (Python 3.11, 3.12); where they differ nothing changes."""
    from concurrent.futures import process as futures_process

    wakeups = getattr(futures_process, "_threads_wakeups", None)
    try:
        if wakeups is not None:
            wakeups.pop(thread, None)
        lock = getattr(thread, "_tstate_lock", None)
        locks = getattr(threading, "_shutdown_locks", None)
        guard = getattr(threading, "_shutdown_locks_lock", None)
        if lock is not None and locks is not None and guard is not None:
            with guard:
                locks.discard(lock)
    except Exception:  # (private names: never fail a stop over them)
        pass


def check_options(backend: str = "local", jobs: int | None = None, address: str | None = None) -> None:
    """Refuse ``--backend``, ``--jobs`` and ``--address`` values no executor takes -- before the
    command reads its files or makes its results folder (:func:`make_executor` asks again)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"--jobs must be a whole number >= 1, got {jobs!r}")
    if address is not None and backend != "ray":
        raise ConfigError("--address is for --backend ray")


def make_executor(backend: str = "local", jobs: int | None = None, address: str | None = None) -> Executor:
    """The executor for the CLI's ``--backend``, ``--jobs`` and ``--address``.

    ``local`` with one job runs in this process, with more in up to ``jobs`` worker processes:
    at most :data:`JOBS_PER_CPU` per CPU (a larger ``jobs`` is clamped, saying so on stderr);
    ``ray`` connects to ``address`` (or starts a local Ray instance) and runs ``jobs`` tasks at
    once (default: the cluster's CPUs; not clamped: the cluster may have more than this machine).
    """
    check_options(backend, jobs, address)
    if backend == "ray":
        from .ray_backend import RayExecutor

        return RayExecutor(address=address, jobs=jobs)
    jobs = default_jobs() if jobs is None else clamped_jobs(jobs)
    if jobs > 1 and (script := unguarded_main_script()) is not None:
        print(f"schedlab: {script} starts schedlab without `if __name__ == \"__main__\":`, and worker processes "
              "run the main script again as they start (each would start schedlab itself): running in this "
              "process; put the call under that guard to run in parallel", file=sys.stderr)
        jobs = 1
    return InProcessExecutor() if jobs == 1 else ProcessExecutor(jobs)


#: ``if __name__ == "__main__":`` in a script's text
_MAIN_GUARD = re.compile(r"""__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__""")


def unguarded_main_script() -> str | None:
    """The main script, when it has no ``if __name__ == "__main__":`` guard, else None (none, an
    interactive session, a notebook, ``python -c``). Worker processes started by the fork server (or
    spawned) import the main script again before they run anything: an unguarded call that starts
    schedlab there tried to start workers of its own, failed, and the pool waited for ever (a
    determinism review's driver script)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(name, str) and name.rpartition(".")[2] == "__main__":  # (python -m pkg: multiprocessing's workers
        return None                                                       # never import a package's __main__)
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            text = file.read()
    except OSError:
        return None
    return None if _MAIN_GUARD.search(text) else path


def clamped_jobs(jobs: int) -> int:
    """``jobs``, or :data:`JOBS_PER_CPU` per CPU when it asks for more (said once on stderr)."""
    cpus = default_jobs()
    most = JOBS_PER_CPU * cpus
    if jobs <= most:
        return jobs
    print(f"schedlab: -j {jobs}: using {most} worker processes ({JOBS_PER_CPU} per CPU)", file=sys.stderr)
    return most
