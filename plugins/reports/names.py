"""File names made from study and run names (plots, traces): safe on every file system."""

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
