"""Where tasks run: this process, local worker processes, or (``ray_backend``) a Ray cluster.

Every executor has the same two methods and one number, so the study runner never knows
which one it drives::

    executor.workers          # how many tasks run at once (sets the search's probe width)
    executor.submit(task)     # -> concurrent.futures.Future of RunResult | TaskFailure
    executor.close()          # stop workers it started; pending tasks are cancelled
    executor.close(now=True)  # ... and running ones stopped too (an interrupt: see closing)

Results never depend on the executor: a task carries its seed and tables, and the runner
assembles results in file order, not in completion order.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

from .. import interrupts
from ..errors import ConfigError
from .simulation import Context
from .tasks import RunTask, execute

BACKENDS = ("local", "ray")


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
        future.set_result(execute(task, self.context, self.observer))
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
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = saved


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
    """``jobs`` worker processes on this machine; a task behaves in them exactly as it would
    anywhere else (it rebuilds its catalog, its seed is its own). Each worker ends itself if this
    process dies without stopping it (:func:`watch_main`)."""

    def __init__(self, jobs: int):
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ConfigError(f"--jobs must be a whole number >= 1, got {jobs!r}")
        self.workers = jobs
        self.description = f"{jobs} local processes"
        self._pool = ProcessPoolExecutor(jobs, mp_context=_process_context(), initializer=watch_main,
                                         initargs=(os.getpid(),))

    def submit(self, task: RunTask) -> Future:
        return self._pool.submit(execute, task)

    def close(self, now: bool = False) -> None:
        """Cancel pending tasks and stop the workers: once their running tasks end, or (``now``)
        at once."""
        if not now:
            self._pool.shutdown(wait=True, cancel_futures=True)
            return
        workers = list((getattr(self._pool, "_processes", None) or {}).values())  # (no public handle)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in workers:
            process.terminate()
        for process in workers:
            process.join(1)
            if process.is_alive():  # (a worker that ignores SIGTERM)
                process.kill()
                process.join(1)


def make_executor(backend: str = "local", jobs: int | None = None, address: str | None = None) -> Executor:
    """The executor for the CLI's ``--backend``, ``--jobs`` and ``--address``.

    ``local`` with one job runs in this process; ``ray`` connects to ``address`` (or starts a
    local Ray instance) and runs ``jobs`` tasks at once (default: the cluster's CPUs).
    """
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"--jobs must be a whole number >= 1, got {jobs!r}")
    if backend == "ray":
        from .ray_backend import RayExecutor

        return RayExecutor(address=address, jobs=jobs)
    if address is not None:
        raise ConfigError("--address is for --backend ray")
    jobs = default_jobs() if jobs is None else jobs
    return InProcessExecutor() if jobs == 1 else ProcessExecutor(jobs)
