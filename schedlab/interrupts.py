"""Ctrl-C, SIGTERM and SIGHUP for the command line: one clean stop, however many signals arrive.

The first SIGINT, SIGTERM or SIGHUP (the terminal closed) raises :class:`KeyboardInterrupt`
(:class:`Terminated` for SIGTERM, :class:`HungUp` for SIGHUP) in the main thread;
:func:`stop_status` gives the command line's word and exit status for each (130, 143, 129:
128 + the signal's number). A signal ignored when the command starts (``nohup`` ignores
SIGHUP, a background job SIGINT) stays ignored. Worker processes ignore SIGHUP (a closed
terminal hangs up the whole process group): the main process stops them.

Python runs a signal handler wherever the main thread happens to be, and code that swallows
exceptions can lose it: numpy's Cython modules, imported lazily on first use, discard an
exception raised while they register themselves. So until the stop is
*seen* -- by the command's error handling or by a results folder cleaning up -- it is raised
again every :data:`RETRY_S` seconds (SIGALRM). Once seen, further signals are ignored, so that
the clean-up and the interpreter's exit run to the end (a second Ctrl-C there used to print a
threading traceback); when the command returns they are set to SIG_IGN, which unlike a
Python handler survives the interpreter's finalization. A signal that arrived just before that
and is only checked after finds SIG_IGN, and CPython reports it through ``sys.unraisablehook``
("Signal 2 ignored due to race condition"): that report is dropped (:func:`drop_signal_races`),
as ignoring the signal is the point.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, wait
from contextlib import contextmanager

#: Seconds between raising an unseen stop again.
RETRY_S = 0.5

_SIGNALS = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be so that it ends a run the same way."""


class HungUp(Terminated):
    """SIGHUP (the terminal closed), raised where Ctrl-C would be: it ends a run as SIGTERM does."""


def stop_status(exc: KeyboardInterrupt) -> tuple[str, int]:
    """How a stop is named (``interrupted``, ``terminated (SIGTERM)``, ``hung up (SIGHUP)``) and
    the exit status it gives (130, 143, 129: 128 + the signal's number, as a shell reports it)."""
    if isinstance(exc, HungUp):
        return "hung up (SIGHUP)", 129
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)", 143
    return "interrupted", 130


class SignalGuard:
    """``with SignalGuard() as guard:`` handle SIGINT, SIGTERM and SIGHUP as the module doc says.

    Outside the main thread (signals cannot be handled there) it does nothing. Signals a
    parent set to SIG_IGN (a background job's SIGINT) stay ignored.
    """

    def __init__(self, ending: bool = True) -> None:
        #: after a stop the process ends (the ``schedlab`` program): further signals stay ignored as it
        #: tears down; False for a caller that goes on (``cli.main(argv)`` from Python, a notebook),
        #: whose handlers come back as they were
        self.ending = ending
        self.first: int | None = None
        self.seen = False
        self.previous: dict = {}
        self.deferring = 0  # inside deferred() blocks: a stop is noted, raised when they end

    def __enter__(self) -> "SignalGuard":
        global _current
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in _SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                self.previous[sig] = signal.signal(sig, self._on_signal)
        if self.previous and hasattr(signal, "setitimer"):
            self.previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_alarm)
        _current = self
        return self

    def _stop(self):
        if self.first == signal.SIGTERM:
            return Terminated()
        if self.first == getattr(signal, "SIGHUP", None):
            return HungUp()
        return KeyboardInterrupt()

    def _on_signal(self, signum, _frame) -> None:
        if self.seen:
            return
        if self.first is None:
            self.first = signum
        if self.deferring:
            return
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        raise self._stop()

    def _on_alarm(self, _signum, _frame) -> None:
        if self.first is None or self.seen:
            return
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        if not self.deferring:
            raise self._stop()

    def acknowledge(self) -> None:
        """The stop has been seen: stop raising it, ignore further signals."""
        if self.first is not None and not self.seen:
            self.seen = True
            if hasattr(signal, "setitimer"):
                signal.setitimer(signal.ITIMER_REAL, 0)

    def __exit__(self, *exc) -> None:
        global _current
        _current = None
        if not self.previous:
            return
        if self.first is not None:
            self.acknowledge()
            drop_signal_races()
        for sig, handler in self.previous.items():
            if self.first is not None and sig in _SIGNALS and self.ending:
                handler = signal.SIG_IGN  # the process is ending
            try:
                signal.signal(sig, handler)
            except OSError:  # "ignored due to race condition": one was pending; dropping it is the point
                pass


_current: SignalGuard | None = None

#: In a worker process (:func:`watch_worker_interrupts`): whether SIGINT has come; None elsewhere.
_worker_signalled: bool | None = None


def by_signal() -> bool:
    """Whether a :class:`KeyboardInterrupt` raised now is a signal's (Ctrl-C, SIGTERM, SIGHUP) and
    not a plugin's own ``raise KeyboardInterrupt``: what the :class:`SignalGuard` in place saw, or
    in a worker process what :func:`watch_worker_interrupts` saw. True where neither watches (a
    library caller's own process): an interrupt is then taken as one, as before."""
    if _current is not None:
        return _current.first is not None
    if _worker_signalled is not None:
        return _worker_signalled
    return True


def watch_worker_interrupts() -> None:
    """A worker's initializer: note SIGINT when it comes (a Ctrl-C reaches the whole process group),
    then raise :class:`KeyboardInterrupt` as Python's own handler does (:func:`by_signal`)."""
    global _worker_signalled
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        _worker_signalled = False
        return

    def on_sigint(_signum, _frame):
        global _worker_signalled
        _worker_signalled = True
        raise KeyboardInterrupt

    _worker_signalled = False
    signal.signal(signal.SIGINT, on_sigint)


def is_signal_race(exc: BaseException | None) -> bool:
    """CPython's report of a signal that came while its handler was being set to SIG_IGN."""
    return isinstance(exc, OSError) and str(exc).startswith("Signal ") and str(exc).endswith(
        "ignored due to race condition")


def drop_signal_races() -> None:
    """From now on, drop CPython's "ignored due to race condition" reports (the process is
    ending and ignores the signals on purpose); every other unraisable error is reported as
    before."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_signal_races", False):
        return

    def hook(args) -> None:
        if not is_signal_race(args.exc_value):
            previous(args)

    hook.drops_signal_races = True
    sys.unraisablehook = hook


def wait_first(futures) -> set:
    """The futures of ``futures`` done, once one is (``concurrent.futures.wait`` with
    ``FIRST_COMPLETED``), waking every :data:`RETRY_S`: the kernel may hand a Ctrl-C to another
    thread (a process pool's manager thread, in ``poll``), and Python runs the handler in the main
    thread only once that thread runs again -- which a lock wait without a timeout never does."""
    while True:
        done, _ = wait(futures, timeout=RETRY_S, return_when=FIRST_COMPLETED)
        if done:
            return done


def result_of(future):
    """``future.result()``, waking every :data:`RETRY_S` (see :func:`wait_first`)."""
    wait_first([future])
    return future.result()


@contextmanager
def deferred():
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends: a stop comes before or after it,
    never inside (main thread only; elsewhere a no-op).

    Under a :class:`SignalGuard` its handler notes a stop that comes meanwhile and raises it as
    the block ends. (Blocking the signals in the main thread is not enough: the kernel may hand
    one to another thread -- a process pool's -- and Python then runs the handler in the main
    thread all the same.) Without a guard the signals are blocked (``pthread_sigmask``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    guard = _current
    if guard is None or not guard.previous:
        if not hasattr(signal, "pthread_sigmask"):
            yield
            return
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return
    guard.deferring += 1
    broken = None
    try:
        yield
    except Exception as exc:  # (what the stop's signal did to the block -- a process pool's fork server
        broken = exc          # killed by a group's Ctrl-C, its pipe at EOF: the stop is what to say)
    finally:
        guard.deferring -= 1
    if not guard.deferring and guard.first is not None and not guard.seen:
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        raise guard._stop() from broken
    if broken is not None:
        raise broken


def acknowledge() -> None:
    """Say that an interrupt has been seen (a no-op when none is being handled)."""
    if _current is not None:
        _current.acknowledge()
