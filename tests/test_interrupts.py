"""schedlab.interrupts: a stop raised where Ctrl-C would be, again if something swallows it,
and ignored once seen."""

from __future__ import annotations

import os
import signal
import time

import pytest

from schedlab import interrupts
from schedlab.interrupts import SignalGuard, Terminated, acknowledge, by_signal, watch_worker_interrupts


@pytest.fixture
def restore_signals():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def wait_for_signals(seconds: float = 30.0) -> None:
    """Give pending signals (and the retry alarm) the chance to run; a guard, not a timing test."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_swallowed_stop_is_raised_again(restore_signals):
    """numpy's lazily imported Cython modules discard an exception raised during their import:
    a SIGTERM arriving then was lost and the run went on to the end."""
    with pytest.raises(Terminated):
        with SignalGuard():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                wait_for_signals(5.0)
            except KeyboardInterrupt:
                pass  # swallowed, as that import does
            wait_for_signals()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # the process is ending


def test_once_seen_further_signals_are_ignored(restore_signals):
    guard = SignalGuard()
    with pytest.raises(KeyboardInterrupt):
        with guard:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                wait_for_signals(5.0)
            except KeyboardInterrupt:
                acknowledge()  # as the CLI does when it catches it
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
                wait_for_signals(1.5)  # neither the signals nor the retry alarm raise now
                raise
    assert guard.first == signal.SIGINT and guard.seen
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_caller_that_goes_on_gets_its_handlers_back_after_a_stop(restore_signals):
    """Determinism review s79: after one interrupted cli.main([...]) in a notebook or script, SIGINT and
    SIGTERM stayed ignored for the rest of the process (Ctrl-C and kill no longer worked)."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    guard = SignalGuard(ending=False)
    with pytest.raises(KeyboardInterrupt):
        with guard:
            os.kill(os.getpid(), signal.SIGINT)
            wait_for_signals(5.0)
    assert guard.first == signal.SIGINT
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    with pytest.raises(KeyboardInterrupt):  # and a second Ctrl-C is one again
        os.kill(os.getpid(), signal.SIGINT)
        wait_for_signals(5.0)


def test_an_interrupted_cli_call_from_python_restores_the_handlers(restore_signals, tmp_path, capsys):
    """cli.main(argv) from Python is such a caller; the schedlab program (argv None) is not."""
    import threading

    from schedlab.cli import main

    path = tmp_path / "e.toml"
    path.write_text('[workload]\nkind = "synthetic"\nnum_requests = 300000\nrate = 100.0\n'
                    'prompt = {dist = "fixed", value = 10}\noutput = {dist = "fixed", value = 500}\n')
    before = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        assert main(["run", str(path), "--out", str(tmp_path / "out"), "--jobs", "1"]) == 130
    finally:
        timer.cancel()
    assert "interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before


def test_without_a_signal_the_previous_handlers_come_back(restore_signals):
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    with SignalGuard() as guard:
        assert signal.getsignal(signal.SIGTERM) == guard._on_signal
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_after_a_stop_cpythons_signal_race_report_is_dropped_and_nothing_else(restore_signals, monkeypatch):
    """A signal checked just after its handler became SIG_IGN made CPython print "Signal 2
    ignored due to race condition" under the one-line message (a flaky failure of the
    interrupted-run test); other unraisable errors must still be reported."""
    import sys
    import types

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_value))
    with pytest.raises(KeyboardInterrupt):
        with SignalGuard():
            os.kill(os.getpid(), signal.SIGINT)
            wait_for_signals(5.0)
    race = OSError("Signal 2 ignored due to race condition")
    other = OSError("Signal 2 ignored for another reason")
    for exc in (race, other, ValueError("x")):
        sys.unraisablehook(types.SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None,
                                                 err_msg=None, object=None))
    assert [str(e) for e in seen] == ["Signal 2 ignored for another reason", "x"]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.parametrize("how", ["wait_first", "result_of"])
def test_a_stop_another_thread_caught_reaches_a_main_thread_waiting_on_futures(restore_signals, how):
    """The kernel may hand Ctrl-C to any thread; Python runs the handler in the main thread only
    once that thread runs again. A run waiting on its process pool's futures (the pool's manager
    thread in ``poll``) used to wait for the next result -- for ever, on a long run -- before it
    stopped. Here a helper thread takes the signal itself; the future it would complete is set
    only once the test is over, so the stop must come while it is still pending."""
    import threading
    from concurrent.futures import Future

    from schedlab.interrupts import result_of, wait_first

    future, over = Future(), threading.Event()

    def helper():
        time.sleep(0.3)  # (most likely the main thread is waiting by then: the case that hung)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        over.wait(60.0)
        future.set_result(None)

    thread = threading.Thread(target=helper)
    try:
        with pytest.raises(KeyboardInterrupt):
            with SignalGuard():
                thread.start()
                wait_first([future]) if how == "wait_first" else result_of(future)
        assert not future.done()  # interrupted while waiting, not after the result came
    finally:
        over.set()
        thread.join()


def test_a_keyboard_interrupt_is_told_from_a_signal(restore_signals):
    """A plugin's own `raise KeyboardInterrupt` read as Ctrl-C: by_signal() says which it is."""
    guard = SignalGuard()
    with pytest.raises(KeyboardInterrupt):
        with guard:
            assert not by_signal()  # (a raise now is code's)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                wait_for_signals(5.0)
            except KeyboardInterrupt:
                assert by_signal()
                acknowledge()
                raise
    assert by_signal()  # (no guard in place: an interrupt is taken as one)


def test_a_worker_notes_the_sigint_it_gets(restore_signals, monkeypatch):
    monkeypatch.setattr(interrupts, "_worker_signalled", None)
    watch_worker_interrupts()
    assert not by_signal()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        wait_for_signals(5.0)
    assert by_signal()
