"""Progress bars: silent unless stderr is a terminal and SCHEDLAB_NO_PROGRESS is unset."""

from __future__ import annotations

import io
import sys

from schedlab.progress import progress


class _FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _use_bar(total=3):
    with progress(total, "runs") as bar:
        for _ in range(total):
            bar.update()
            bar.set_postfix_str("rate=5")
        bar.update(n=2)


def test_silent_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.delenv("SCHEDLAB_NO_PROGRESS", raising=False)
    _use_bar()
    bar = progress(None, "search")
    bar.update()
    bar.close()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_draws_on_a_terminal(monkeypatch):
    monkeypatch.delenv("SCHEDLAB_NO_PROGRESS", raising=False)
    fake = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", fake)
    _use_bar()
    assert "runs" in fake.getvalue()


def test_environment_variable_silences_a_terminal(monkeypatch):
    monkeypatch.setenv("SCHEDLAB_NO_PROGRESS", "")
    fake = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", fake)
    _use_bar()
    assert fake.getvalue() == ""


def test_no_stderr_at_all(monkeypatch):
    monkeypatch.setattr(sys, "stderr", None)
    _use_bar()  # must not raise
