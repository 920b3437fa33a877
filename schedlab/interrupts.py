"""Ctrl-C and SIGTERM for the command line: one clean stop, however many signals arrive.

The first SIGINT or SIGTERM raises :class:`KeyboardInterrupt` (:class:`Terminated` for
SIGTERM) in the main thread. Python runs a signal handler wherever the main thread happens to
be, and code that swallows exceptions can lose it: numpy's Cython modules, imported lazily on
first use, discard an exception raised while they register themselves. So until the stop is
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

#: Seconds between raising an unseen stop again.
RETRY_S = 0.5

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be so that it ends a run the same way."""


class SignalGuard:
    """``with SignalGuard() as guard:`` handle SIGINT and SIGTERM as the module doc says.

    Outside the main thread (signals cannot be handled there) it does nothing. Signals a
    parent set to SIG_IGN (a background job's SIGINT) stay ignored.
    """

    def __init__(self) -> None:
        self.first: int | None = None
        self.seen = False
        self.previous: dict = {}

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
        return Terminated() if self.first == signal.SIGTERM else KeyboardInterrupt()

    def _on_signal(self, signum, _frame) -> None:
        if self.seen:
            return
        if self.first is None:
            self.first = signum
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        raise self._stop()

    def _on_alarm(self, _signum, _frame) -> None:
        if self.first is None or self.seen:
            return
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
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
            if self.first is not None and sig in _SIGNALS:
                handler = signal.SIG_IGN  # the process is ending
            try:
                signal.signal(sig, handler)
            except OSError:  # "ignored due to race condition": one was pending; dropping it is the point
                pass


_current: SignalGuard | None = None


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


def acknowledge() -> None:
    """Say that an interrupt has been seen (a no-op when none is being handled)."""
    if _current is not None:
        _current.acknowledge()
