"""Named factories, one registry per kind of plugin.

Registration hooks receive a :class:`Registry` and call it::

    @hookimpl
    def schedlab_register_schedulers(register):
        register("fifo", FifoScheduler, config=FifoConfig, help="first come, first served")

A name can be registered once per kind; a second registration raises
:class:`~schedlab.errors.DuplicateNameError` naming both providers.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterator

import attrs

from .errors import DuplicateNameError, UnknownPluginError


@attrs.frozen
class Entry:
    """A registered name: what builds it, what configures it, and who provided it.

    :ivar factory: called as ``factory(config)`` (or ``factory()`` when ``config`` is None).
    :ivar config: frozen attrs class validating the table's keys, or None for no settings.
    """

    kind: str
    name: str
    factory: Callable[..., Any]
    config: type | None
    help: str
    provider: str


class Registry:
    """Names of one kind (``scheduler``, ``cost_model``, ...) mapped to their factories."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._provider = "?"

    def __call__(self, name: str, factory: Callable[..., Any], *, config: type | None = None, help: str = "") -> None:
        self.register(name, factory, config=config, help=help)

    def register(self, name: str, factory: Callable[..., Any], *, config: type | None = None, help: str = "") -> None:
        """Add ``name``; raises :class:`DuplicateNameError` if it is already taken."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if config is not None and not attrs.has(config):
            raise TypeError(f"{self.kind} {name!r}: config must be an attrs class, got {config!r}")
        if name in self._entries:
            other = self._entries[name].provider
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: by {other} and by {self._provider}"
            )
        doc = help or (factory.__doc__ or "").strip().split("\n")[0]
        self._entries[name] = Entry(self.kind, name, factory, config, doc, self._provider)

    def providing(self, provider: str) -> "Registry":
        """Set who the next registrations come from (the plugin manager does this per plugin)."""
        self._provider = provider
        return self

    def get(self, name: str) -> Entry:
        """The entry for ``name``; an unknown name raises an error listing the known ones."""
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            hint = self._close_match(str(name))
            also = f" (did you mean {hint!r}?)" if hint else ""
            raise UnknownPluginError(f"unknown {self.kind} {name!r}{also}; registered: {known}") from None

    def _close_match(self, name: str) -> str | None:
        """The registered name closest to ``name`` ignoring case (``EDF`` -> ``edf``), spelt as
        registered; names themselves stay case-sensitive."""
        spellings: dict[str, str] = {}
        for known in self._entries:
            spellings.setdefault(known.lower(), known)
        hint = difflib.get_close_matches(name.lower(), list(spellings), n=1)
        return spellings[hint[0]] if hint else None

    def mark(self) -> int:
        """A point to :meth:`undo_since`: how many names are registered now."""
        return len(self._entries)

    def undo_since(self, mark: int) -> list[str]:
        """Forget the names registered after ``mark`` (a plugin left out after it registered
        some); returns them."""
        names = list(self._entries)[mark:]
        for name in names:
            del self._entries[name]
        return names

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)
