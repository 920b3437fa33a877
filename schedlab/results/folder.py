"""A results folder written whole: into a hidden sibling first, then swapped into place.

``schedlab run --out DIR`` writes every report into ``.DIR.<random>.tmp`` beside ``DIR`` and,
once all of them are written, renames it to ``DIR``; a previous ``DIR`` is renamed aside
first and deleted after. A run that fails, is interrupted (Ctrl-C, SIGTERM) or is killed
leaves ``DIR`` as it was -- never new summary files next to the previous run's
``requests.csv`` -- and, only after SIGKILL or a power cut, a hidden ``.DIR.*.tmp`` folder.
Signals wait while the two renames run, so an interrupt cannot fall between them.

Because ``DIR`` is replaced as a whole, an existing ``DIR`` must be empty or a results folder
(it has an ``index.html`` written by schedlab, a ``summary.json`` or a ``summary.txt``): a
mistyped ``--out ~`` is refused rather than emptied. Folders and files get the usual
permissions (``0o777`` and ``0o666`` less the umask), as ``mkdir`` and ``open`` would give.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from .. import interrupts
from ..errors import ConfigError

#: What marks a folder as one schedlab may replace (besides being empty).
RESULT_MARKERS = ("summary.json", "summary.txt")
INDEX = "index.html"
GENERATOR_TAG = '<meta name="generator" content="schedlab">'


def current_umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def usual_mode(kind: str = "file") -> int:
    """``0o666`` (files) or ``0o777`` (folders) less the umask: what ``open``/``mkdir`` give."""
    return (0o777 if kind == "folder" else 0o666) & ~current_umask()


def is_results_folder(path: Path) -> bool:
    """True for an empty folder or one a schedlab run wrote (see the module doc)."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return False
    if not names or names & set(RESULT_MARKERS):
        return True
    if INDEX in names:
        try:
            with open(path / INDEX, encoding="utf-8", errors="replace") as fh:
                return GENERATOR_TAG in fh.read(4096)
        except OSError:
            return False
    return False


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_destination(out: Path) -> None:
    """Refuse an ``--out`` that cannot become a results folder, before anything runs.

    :raises ConfigError: ``out`` is a file (or a device such as ``/dev/null``) or lies under one,
        is a folder that is not a results folder, or has a name too long for its file system.
    """
    name_max = 255
    existing = next((p for p in out.parents if _exists(p)), Path("."))
    if not existing.is_dir():
        raise ConfigError(f"--out {out}: {existing} is a file, not a folder")
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        pass
    too_long = [p.name for p in (out, *out.parents) if len(os.fsencode(p.name)) > name_max]
    if len(os.fsencode(out.name)) > name_max - 16:  # room for the hidden sibling's prefix and suffix
        too_long.insert(0, out.name)
    if too_long:
        raise ConfigError(f"--out {out}: the name {too_long[0][:40]}... is too long for the file system "
                          f"({len(os.fsencode(too_long[0]))} bytes; results folder names at most {name_max - 16})")
    if _exists(out):
        if not out.is_dir():
            raise ConfigError(f"--out {out}: exists and is not a folder; results are a folder of files")
        if not is_results_folder(out):
            raise ConfigError(f"--out {out}: is a folder with other files in it (no summary.json or schedlab "
                              "index.html); a run replaces its results folder whole, so name a new or empty folder")


def _exists(path: Path) -> bool:
    try:
        return path.exists() or path.is_symlink()
    except OSError:  # e.g. a name too long: it cannot exist
        return False


class StagedFolder:
    """``with StagedFolder(out) as stage:`` write into ``stage.path``, then ``stage.commit()``.

    Leaving the block without ``commit`` (an error, an interrupt) deletes the staging folder.
    """

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self.path: Path | None = None
        self.committed = False

    def __enter__(self) -> "StagedFolder":
        out = self.out
        check_destination(out)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
            os.chmod(self.path, usual_mode("folder"))
        except OSError as exc:
            raise ConfigError(f"--out {out}: cannot create the results folder there: {_why(exc)}") from None
        return self

    def commit(self) -> Path:
        """Put the staged folder in place of ``out`` (renaming any previous one aside first)."""
        out, staged = self.out, self.path
        with _signals_deferred():
            try:
                if out.is_dir() and os.listdir(out):
                    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
                    os.rename(out, old / "previous")
                    os.rename(staged, out)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.replace(staged, out)  # replaces an empty folder too
            except OSError as exc:
                raise ConfigError(f"--out {out}: cannot put the results in place: {_why(exc)}") from None
            self.committed = True
        return out

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            interrupts.acknowledge()  # seen: do not raise it again while cleaning up
        if not self.committed and self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)


@contextmanager
def _signals_deferred():
    """Hold SIGINT and SIGTERM until the block ends (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    wanted = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
