"""Progress bars for sweeps and searches: a tqdm bar on a terminal, silence everywhere else.

Output piped to a file or read by a test stays clean. Setting the environment variable
``SCHEDLAB_NO_PROGRESS`` (to anything, even empty) turns bars off on a terminal too.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


class _Silent:
    """Accepts the calls a tqdm bar does and prints nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str = "") -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc) -> None:
        return None


def progress(total: int | None, desc: str):
    """A bar with ``update(n=1)``, ``set_postfix_str(text)``, ``close()`` and ``with`` support.

    :param total: expected number of steps, or None when unknown (the bar then just counts).
    """
    stderr = sys.stderr
    is_terminal = stderr is not None and getattr(stderr, "isatty", lambda: False)()
    if not is_terminal or "SCHEDLAB_NO_PROGRESS" in os.environ:
        return _Silent()
    return tqdm(total=total, desc=desc, file=stderr, dynamic_ncols=True)
