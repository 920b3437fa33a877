"""The ``schedlab`` command's entry point: signals while the command loads end it in one line.

Importing :mod:`schedlab.cli` takes a second or more on a loaded machine (numpy, matplotlib,
the plugins), before :func:`schedlab.cli.main` puts its signal handling in place; a Ctrl-C then
printed a Python traceback, and SIGTERM or SIGHUP ended the process without a word. Nothing is
written yet, so each ends here with the line and exit status a later stop gives.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Load the command line with SIGINT, SIGTERM and SIGHUP raising here, then run it."""
    from .interrupts import SignalGuard, stop_status

    try:
        with SignalGuard():
            from .cli import main as command
    except KeyboardInterrupt as exc:
        what, status = stop_status(exc)
        print(f"schedlab: {what} while starting; nothing was written", file=sys.stderr)
        return status
    return command()
