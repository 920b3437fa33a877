"""A results folder written whole: into a hidden sibling first, then swapped into place.

``schedlab run --out DIR`` writes every report into ``.DIR.<pid>.<random>.tmp`` beside ``DIR``
and, once all of them are written, renames it to ``DIR``; a previous ``DIR`` is renamed aside
(into ``.DIR.<pid>.<random>.old``) first and deleted after. A run that fails, is interrupted
(Ctrl-C, SIGTERM, SIGHUP) or is killed leaves ``DIR`` as it was -- never new summary files next
to the previous run's ``requests.csv`` -- and, only after SIGKILL or a power cut, a hidden
``.DIR.<pid>.*.tmp`` folder. Signals wait while the two renames run, so an interrupt cannot
fall between them.

Such leftovers are removed by the next run into the same ``DIR`` (:func:`remove_abandoned`):
a staging folder for ``DIR`` (exactly ``.DIR.<pid>.<random>.tmp``) whose owner ``<pid>`` no
longer exists goes when the run starts, an ``.old`` one once the run has put its results in
place (it can hold the only copy of the previous results, after a power cut between the two
renames, and that copy is what the run replaces). A folder whose ``<pid>`` is alive is kept,
even when that process is not schedlab (a reused pid: it goes once that process has ended),
as is anything not a folder or named otherwise. Names without a pid, from earlier schedlab
versions, are left alone: nothing tells whether their run is still going (delete them by
hand). The process id is only meaningful on one machine: two machines writing the same
``DIR`` on a shared file system at the same time may remove each other's staging folder,
which ends that run with "cannot write" -- one of the two results would have replaced the
other anyway. :class:`StagedFiles` does the same with its ``.schedlab-files.<pid>.*.tmp``
folders inside a results folder (``schedlab plot``). A single file's temporary copy left inside
a results folder (``.index.html.<random>.tmp``) goes with the folder when a run replaces it.

A full disk or a read-only file system while writing ends in one message naming the file (see
:meth:`StagedFolder.__exit__`). A ``DIR`` that is a symbolic link is written through: the
folder it points to is replaced (staged beside it, so the rename stays on its file system).

Because ``DIR`` is replaced as a whole, an existing ``DIR`` must be empty or a results folder
that holds nothing schedlab did not write: every results folder gets a manifest
(:data:`MANIFEST`, listing its top-level files and folders and every file under them), and a
folder with files the manifest does not list (notes, a source tree, a figure saved into
``plots/``) is refused rather than emptied, as is a mistyped ``--out ~``. (A manifest of an
older schedlab lists the top-level names only: the files inside its folders are not checked.)
``DIR`` is checked when the run starts and again just before it is replaced: files added to it
while the run ran keep it as it is, and the results go beside it into ``DIR.new-<pid>`` (the
command says so, naming both, and exits with status 2). A folder written before manifests
existed counts as a results folder when its ``index.html`` carries schedlab's generator tag or
its ``summary.json`` (or a hunt's ``hunt.json``) is one schedlab wrote. ``DIR`` must not hold
a file the run reads either (the experiment file, a request file): replacing the folder would
delete it. Folders and files get
the usual permissions (``0o777`` and ``0o666`` less the umask), as ``mkdir`` and ``open`` would give.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable

from .. import interrupts
from ..errors import ConfigError
from .owners import owner_gone

INDEX = "index.html"
GENERATOR_TAG = '<meta name="generator" content="schedlab">'
#: The hidden file listing what schedlab wrote in a results folder: its top-level names
#: (``entries``) and every file by relative path (``files``; not in an older schedlab's).
MANIFEST = ".schedlab-results"
#: Files a desktop's file browser leaves in any folder it shows: replacing them loses nothing.
BROWSER_LITTER = (".DS_Store", "Thumbs.db", "desktop.ini")
#: A temporary file or folder of an interrupted write into ``<name>`` (``.<name>.<random>.tmp``).
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp")
#: The same with its owner's process id (``.<name>.<pid>.<random>.tmp``, as this module names them).
_OWNED = re.compile(r"\.(?P<name>.+)\.(?P<pid>[1-9][0-9]{0,9})\.(?P<random>[a-z0-9_]{8})(?P<suffix>\.tmp|\.old)")
#: Bytes a staging name adds to its target's: ``.``, ``.<pid>`` (a pid has at most 7 digits on
#: Linux), ``.<random>`` (8 characters) and ``.tmp``, with room to spare.
STAGING_EXTRA = 24
#: The ``<name>`` of :class:`StagedFiles`' temporary folder.
STAGED_FILES = "schedlab-files"
#: Errors that mean the disk cannot take the results (rather than a bug elsewhere).
WRITE_ERRNOS = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG", "EIO")
                         if hasattr(errno, name))
#: How many files a refusal names.
SHOWN = 3


def current_umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def usual_mode(kind: str = "file") -> int:
    """``0o666`` (files) or ``0o777`` (folders) less the umask: what ``open``/``mkdir`` give."""
    return (0o777 if kind == "folder" else 0o666) & ~current_umask()


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def target_of(out: str | os.PathLike) -> Path:
    """The folder ``--out out`` writes: ``out`` itself, or where it points when it is a symbolic link."""
    out = Path(out)
    try:
        return Path(os.path.realpath(out)) if out.is_symlink() else out
    except OSError:  # e.g. a name too long: no link there (check_destination says what is wrong)
        return out


# -- the manifest --------------------------------------------------------------------------------------


def write_manifest(folder: Path) -> None:
    """List ``folder``'s top-level entries and every file under it in its :data:`MANIFEST` (a
    folder being staged: no one else writes it)."""
    names = sorted(n for n in os.listdir(folder) if n != MANIFEST)
    files = _files_under(folder, names)
    with open(folder / MANIFEST, "w", encoding="utf-8") as fh:
        fh.write(_manifest_text(names, files))


def _files_under(folder: Path, names: Iterable[str]) -> list[str]:
    """The files (anything not a folder, a symbolic link included) among ``names`` in ``folder``
    and under those of them that are folders, as relative paths with ``/``."""
    found = []
    for name in sorted(names):
        path = folder / name
        if _is_folder(path):
            for entry in sorted(os.listdir(path)):
                found += _files_under(folder, [f"{name}/{entry}"])
        else:
            found.append(name)
    return found


def _is_folder(path: Path) -> bool:
    """A folder itself, not a symbolic link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _manifest_text(names: Iterable[str], files: Iterable[str] | None) -> str:
    data = {"written_by": "schedlab", "entries": sorted(names)}
    if files is not None:
        data["files"] = sorted(files)
    data["note"] = "what schedlab wrote here; schedlab replaces this folder only while it holds nothing else"
    return json.dumps(data, indent=1) + "\n"


def read_manifest(folder: Path) -> tuple[set[str], set[str] | None] | None:
    """What ``folder``'s manifest lists: its top-level names, and the relative path (with ``/``)
    of every file under it -- None for a manifest an older schedlab wrote, which lists only the
    top-level names. None as a whole when there is no manifest (or one schedlab did not write)."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(n, str) for n in entries):
        return None
    files = data.get("files")
    if not isinstance(files, list) or not all(isinstance(n, str) for n in files):
        files = None
    return set(entries), (set(files) if files is not None else None)


def manifest_entries(folder: Path) -> set[str] | None:
    """The top-level names ``folder``'s manifest lists, or None when it has none (or one schedlab did not write)."""
    manifest = read_manifest(folder)
    return manifest[0] if manifest is not None else None


def record_entries(folder: str | os.PathLike, paths: Iterable[str | os.PathLike]) -> None:
    """Add ``paths`` (files written into results folder ``folder`` in place, e.g. by ``schedlab
    plot``, relative to it) to its manifest: their top-level names, and the paths themselves to
    its list of files (a manifest of an older schedlab, which lists only top-level names, stays
    so). A folder without a manifest (written by an older schedlab still) is left without."""
    from .storage import atomic_write  # storage imports this module

    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return
    listed, files = manifest
    paths = {Path(p).as_posix() for p in paths}
    names = {p.split("/", 1)[0] for p in paths}
    if names <= listed and (files is None or paths <= files):
        return
    atomic_write(folder / MANIFEST, _manifest_text(listed | names, files | paths if files is not None else None))


# -- what may be replaced ------------------------------------------------------------------------------------


def foreign_entries(names: Iterable[str], listed: set[str]) -> list[str]:
    """The entries among ``names`` (a folder's) that neither its manifest (``listed``) lists nor
    schedlab leaves behind (an interrupted write's temporary file)."""
    def ours(name: str) -> bool:
        leftovers = (_LEFTOVER.fullmatch(name), _OWNED.fullmatch(name))
        return (name in listed or name == MANIFEST or name in BROWSER_LITTER
                or any(m is not None and m.group("name") in (*listed, STAGED_FILES) and not name.endswith(".old")
                       for m in leftovers))

    return sorted(n for n in names if not ours(n))


def _written_by_older_schedlab(folder: Path, names: set[str]) -> bool:
    """A folder without a manifest: its index.html carries the generator tag, or its summary.json
    (hunt.json) is one schedlab wrote -- a stray or empty ``summary.json`` does not count."""
    from .storage import summary_problem  # storage imports this module

    if INDEX in names:
        try:
            with open(folder / INDEX, encoding="utf-8", errors="replace") as fh:
                if GENERATOR_TAG in fh.read(4096):
                    return True
        except OSError:
            pass
    summary = _json_file(folder / "summary.json") if "summary.json" in names else None
    if summary is not None and summary_problem(summary) is None:
        return True
    hunt = _json_file(folder / "hunt.json") if "hunt.json" in names else None
    return isinstance(hunt, dict) and isinstance(hunt.get("goal"), str) and isinstance(hunt.get("search"), dict)


def _json_file(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def foreign_files(folder: Path, names: Iterable[str], files: set[str]) -> list[str]:
    """The files under the folders among ``names`` (top-level names a manifest lists) that its
    list of ``files`` does not hold (nor are browser litter, or a listed file's interrupted write),
    as relative paths. Symbolic links are not followed (replacing the folder removes the link only).
    :raises OSError: a folder cannot be listed."""
    foreign = []
    for name in sorted(names):
        if not _is_folder(folder / name):
            continue
        for entry in sorted(os.listdir(folder / name)):
            path = f"{name}/{entry}"
            if _is_folder(folder / path):
                foreign += foreign_files(folder, [path], files)
            elif not (path in files or entry in BROWSER_LITTER or _leftover_of(entry, name, files)):
                foreign.append(path)
    return foreign


def _leftover_of(entry: str, under: str, files: set[str]) -> bool:
    """``entry`` (in folder ``under``) is an interrupted write's temporary copy of a listed file."""
    return any(m is not None and f"{under}/{m.group('name')}" in files and not entry.endswith(".old")
               for m in (_LEFTOVER.fullmatch(entry), _OWNED.fullmatch(entry)))


def _foreign_content(folder: Path) -> tuple[str, str] | None:
    """What in the existing folder ``folder`` is not schedlab's, or None: ``("files", "a, b and 2
    more")`` (files its manifest does not list), ``("other", "")`` (no manifest, and not a folder an
    older schedlab wrote) or ``("unreadable", reason)``."""
    try:
        names = set(os.listdir(folder))
    except OSError as exc:
        return "unreadable", _why(exc)
    if not names:
        return None
    manifest = read_manifest(folder) if MANIFEST in names else None
    if manifest is not None:
        listed, files = manifest
        foreign = foreign_entries(names, listed)
        if files is not None:  # (an older manifest lists top-level names only: nothing to check under them)
            try:
                foreign += foreign_files(folder, names & listed, files)
            except OSError as exc:
                return "unreadable", _why(exc)
        if not foreign:
            return None
        return "files", ", ".join(foreign[:SHOWN]) + (f" and {len(foreign) - SHOWN} more"
                                                      if len(foreign) > SHOWN else "")
    if _written_by_older_schedlab(folder, names):
        return None
    return "other", ""


def replace_problem(folder: Path) -> str | None:
    """Why the existing folder ``folder`` may not be replaced by a results folder, or None (see the module doc)."""
    found = _foreign_content(folder)
    if found is None:
        return None
    kind, shown = found
    if kind == "unreadable":
        return f"cannot list the folder's files: {shown}"
    if kind == "files":
        return (f"holds files schedlab did not write ({shown}); a run replaces its results folder whole, "
                "so move them or name another folder")
    return (f"is a folder with other files in it (not one schedlab wrote: no {MANIFEST}, nor an index.html or "
            "summary.json of schedlab's); a run replaces its results folder whole, so name a new or empty folder")


def _inside(path: str | os.PathLike, folder: Path) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root


def check_destination(out: str | os.PathLike, reads: Iterable[str | os.PathLike] = ()) -> None:
    """Refuse an ``--out`` that cannot become a results folder, before anything runs.

    :param reads: files the run reads (the experiment file, request files): ``out`` must not hold one.
    :raises ConfigError: ``out`` is a file (or a device such as ``/dev/null``) or lies under one,
        is a folder that may not be replaced (see the module doc) or holds one of ``reads``, or
        has a name too long for its file system.
    """
    out = Path(out)
    target = target_of(out)
    name_max = 255
    existing = next((p for p in target.parents if _exists(p)), Path("."))
    if not existing.is_dir():
        raise ConfigError(f"--out {out}: {existing} is a file, not a folder")
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        pass
    too_long = [p.name for p in (target, *target.parents) if len(os.fsencode(p.name)) > name_max]
    if len(os.fsencode(target.name)) > name_max - STAGING_EXTRA:  # room for the hidden sibling's prefix and suffix
        too_long.insert(0, target.name)
    if too_long:
        raise ConfigError(f"--out {out}: the name {too_long[0][:40]}... is too long for the file system "
                          f"({len(os.fsencode(too_long[0]))} bytes; results folder names at most "
                          f"{name_max - STAGING_EXTRA})")
    if not _exists(target):
        return
    if not target.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder; results are a folder of files")
    read = next((Path(p) for p in reads if _inside(p, target)), None)
    if read is not None:
        raise ConfigError(f"--out {out}: holds {_shown(read)}, which this run reads; a run replaces its results folder "
                          "whole, so name another folder")
    problem = replace_problem(target)
    if problem:
        raise ConfigError(f"--out {out}: {problem}")


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies under it (as a user would type it)."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith(os.pardir) else str(path)


def _exists(path: Path) -> bool:
    try:
        return path.exists() or path.is_symlink()
    except OSError:  # e.g. a name too long: it cannot exist
        return False


def _shown_path(exc: OSError, staged: Path, shown: Path) -> Path | None:
    """Where ``exc`` happened as the user names it (``shown`` for the staging folder ``staged``),
    or None when it names no file under ``staged``."""
    name = exc.filename
    if not isinstance(name, (str, bytes, os.PathLike)):
        return None
    name = os.fsdecode(name)
    if not _inside(name, staged):
        return None
    rel = os.path.relpath(os.path.realpath(name), os.path.realpath(staged))
    return shown if rel == "." else shown / rel


def write_problem(exc: BaseException, staged: Path | None, shown: Path) -> str | None:
    """``"cannot write <file>: <reason>"`` when ``exc`` is a failed write into ``staged`` (a full
    disk, a read-only file system, ...), the file named as it would be under ``shown``; else None."""
    if not isinstance(exc, OSError) or staged is None:
        return None
    where = _shown_path(exc, staged, shown)
    if where is not None:
        return f"cannot write {where}: {_why(exc)}"
    if exc.errno in WRITE_ERRNOS and exc.filename is None:
        return f"cannot write the results: {_why(exc)}"
    return None


# -- staging folders, and those a killed run left ----------------------------------------------------------------


def staging_prefix(name: str) -> str:
    """The start of this process's staging names for ``name``: ``.<name>.<pid>.``."""
    return f".{name}.{os.getpid()}."


def remove_abandoned(parent: str | os.PathLike, names: Iterable[str], suffix: str = ".tmp", *,
                     files: bool = False) -> list[Path]:
    """Delete the staging folders in ``parent`` for any of ``names`` (exactly
    ``.<name>.<pid>.<random><suffix>``) whose owner ``<pid>`` no longer exists: what a killed run
    left (see the module doc). Keeps every folder whose pid is alive, and anything that is not a
    folder (a symbolic link included) or is named otherwise. ``files``: the staging *files* of
    :func:`~schedlab.results.storage.atomic_write` instead (regular files only). Nothing it cannot
    do is an error. Returns what it removed."""
    parent, names = Path(parent), set(names)
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = _OWNED.fullmatch(entry)
        if match is None or match.group("name") not in names or match.group("suffix") != suffix:
            continue
        if not owner_gone(int(match.group("pid"))):
            continue
        path = parent / entry
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if files and stat.S_ISREG(mode):
            try:
                os.unlink(path)
            except OSError:
                continue
        elif files or not stat.S_ISDIR(mode):
            continue
        else:
            shutil.rmtree(path, ignore_errors=True)
        if not _exists(path):
            removed.append(path)
    return removed


class StagedFolder:
    """``with StagedFolder(out) as stage:`` write into ``stage.path``, then ``stage.commit()``.

    Leaving the block without ``commit`` (an error, an interrupt) deletes the staging folder.
    ``reads``: the files the run reads (see :func:`check_destination`).
    """

    def __init__(self, out: str | os.PathLike, reads: Iterable[str | os.PathLike] = ()):
        self.out = Path(out)
        self.reads = tuple(reads)
        self.target = self.out
        self.path: Path | None = None
        self.committed = False

    def __enter__(self) -> "StagedFolder":
        out = self.out
        check_destination(out, self.reads)
        self.target = target = target_of(out)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_abandoned(target.parent, [target.name], ".tmp")
            self.path = Path(tempfile.mkdtemp(prefix=staging_prefix(target.name), suffix=".tmp", dir=target.parent))
            os.chmod(self.path, usual_mode("folder"))
        except OSError as exc:
            raise ConfigError(f"--out {out}: cannot create the results folder there: {_why(exc)}") from None
        return self

    def commit(self) -> Path:
        """Put the staged folder in place of ``out`` (renaming any previous one aside first).

        ``out`` is checked again first (:func:`replace_problem`; files may have been added while the
        run ran). Should it now hold files schedlab did not write, it is left as it is and the
        results go beside it instead, into ``<out>.new-<pid>`` (:attr:`beside`), and
        :class:`~schedlab.errors.ConfigError` names both folders."""
        out, target, staged = self.out, self.target, self.path
        try:
            write_manifest(staged)
        except OSError as exc:
            raise ConfigError(f"--out {out}: cannot write {out / MANIFEST}: {_why(exc)}; no results were written "
                              "(a previous results folder is left as it was)") from None
        with _signals_deferred():
            found = self._changed_meanwhile()
            if found is not None:
                self._put_beside(found)
            try:
                if target.is_dir() and os.listdir(target):
                    old = Path(tempfile.mkdtemp(prefix=staging_prefix(target.name), suffix=".old",
                                                dir=target.parent))
                    os.rename(target, old / "previous")
                    os.rename(staged, target)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.replace(staged, target)  # replaces an empty folder too
            except OSError as exc:
                raise ConfigError(f"--out {out}: cannot put the results in place: {_why(exc)}") from None
            self.committed = True
        remove_abandoned(target.parent, [target.name], ".old")  # previous results a killed run set aside
        return out

    #: Where :meth:`commit` put the results when ``out`` could not be replaced, or None.
    beside: Path | None = None

    def _changed_meanwhile(self) -> str | None:
        """What now keeps ``out`` from being replaced (it was checked when the run started), or None."""
        target = self.target
        if not _exists(target):
            return None
        if not target.is_dir():
            return "it is no longer a folder"
        found = _foreign_content(target)
        if found is None:
            return None
        kind, shown = found
        if kind == "files":
            return f"files schedlab did not write were added to it while the run ran ({shown})"
        if kind == "unreadable":
            return f"its files cannot be listed any more ({shown})"
        return (f"it now holds other files (and no {MANIFEST}, nor an index.html or summary.json of "
                "schedlab's)")

    def _put_beside(self, why: str) -> None:
        """Move the staged results to ``<out>.new-<pid>`` beside ``out``, which stays as it is, and say so."""
        out, target = self.out, self.target
        shown_parent = out.parent if target == out else target.parent
        pid, extra = os.getpid(), 0
        while True:
            name = f"{target.name}.new-{pid}" + (f"-{extra}" if extra else "")
            if not _exists(target.parent / name):
                break
            extra += 1
        beside, shown = target.parent / name, shown_parent / name
        try:
            os.rename(self.path, beside)
        except OSError as exc:
            raise ConfigError(f"--out {out}: {why}, so it was not replaced; the new results could not be put "
                              f"beside it either ({shown}: {_why(exc)}): no results were written (the folder is "
                              "left as it was)") from None
        self.path, self.beside = None, beside  # (nothing staged is left to delete)
        raise ConfigError(f"--out {out}: {why}, so it is left as it was; the new results are in {shown} instead "
                          f"(move the added files out of {out} and the results in, or keep both)")

    def __exit__(self, exc_type, exc, tb) -> None:
        """Delete the staging folder unless committed; a failed write (a full disk) becomes one message."""
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            interrupts.acknowledge()  # seen: do not raise it again while cleaning up
            if self.committed:  # (it came after the results were in place: the command says so)
                exc.results_written = self.out
        problem = write_problem(exc, self.path, self.out) if not self.committed else None
        if not self.committed and self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
        if problem:
            raise ConfigError(f"--out {self.out}: {problem}; no results were written (a previous results folder "
                              "is left as it was)") from None


class StagedFiles:
    """``with StagedFiles(folder) as stage:`` write files into ``stage.path`` (a hidden folder
    inside ``folder``), then ``stage.commit()`` moves each to the same place under ``folder``.

    Used to add files to an existing folder (``schedlab plot``): nothing in ``folder`` changes
    until every file is written, so a full disk leaves no half-written plots folder behind.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path: Path | None = None

    def __enter__(self) -> "StagedFiles":
        try:
            remove_abandoned(self.folder, [STAGED_FILES], ".tmp")
            self.path = Path(tempfile.mkdtemp(prefix=staging_prefix(STAGED_FILES), suffix=".tmp", dir=self.folder))
        except OSError as exc:
            raise ConfigError(f"{self.folder}: cannot write there: {_why(exc)}") from None
        return self

    def files(self) -> list[str]:
        """The files staged so far, relative to ``folder`` (with ``/``): what :meth:`commit` moves."""
        return [p.relative_to(self.path).as_posix() for p in sorted(self.path.rglob("*")) if p.is_file()]

    def commit(self) -> list[Path]:
        """Move the staged files in place (replacing files of the same name); returns their new paths."""
        moved = []
        try:
            for source in sorted(p for p in self.path.rglob("*") if p.is_file()):
                path = self.folder / source.relative_to(self.path)
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, path)
                moved.append(path)
        except OSError as exc:
            raise ConfigError(f"{self.folder}: cannot put the new files in place: {_why(exc)}") from None
        return moved

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            interrupts.acknowledge()
        problem = write_problem(exc, self.path, self.folder)
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
        if problem:
            raise ConfigError(f"{self.folder}: {problem}; nothing in the folder was changed") from None


def _signals_deferred():
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends (:func:`schedlab.interrupts.deferred`)."""
    return interrupts.deferred()
