"""File names made from study and run names (plots, traces, logs, streamed rows): safe on every
file system, never two alike.

Run names are free text (``fast run``, ``a[x=1]``, ``fcfs#1``); a file name keeps letters,
digits, ``.``, ``_`` and ``-``, is cut to :data:`MAX_STEM` characters with a hash of the whole name,
and a stem already given (ignoring case: macOS and Windows file systems) gets ``-2``, ``-3``, ...
"""

from __future__ import annotations

import hashlib
import re

MAX_STEM = 80


def safe_stem(name: str) -> str:
    """A file-name-safe form of a study or run name: runs of other characters become one ``_``;
    a long name is cut and keeps a hash of the whole, so different names stay different."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    stem = re.sub(r"[._-]*_[._-]*", "_", stem).strip("._-") or "run"
    if len(stem) > MAX_STEM:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        stem = f"{stem[:MAX_STEM - 9].rstrip('._-')}-{digest}"
    return stem


class UniqueStems:
    """Hands out stems no two alike, ignoring case: ``take("fast run")`` -> ``fast_run``, then
    ``take("fast_run")`` -> ``fast_run-2`` (two runs' files never overwrite each other)."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def take(self, stem: str) -> str:
        """``stem`` itself, or ``stem-N`` for the first N from 2 not given yet."""
        unique, n = stem, 1
        while unique.lower() in self._used:
            n += 1
            unique = f"{stem}-{n}"
        self._used.add(unique.lower())
        return unique
