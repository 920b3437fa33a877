"""Named factories, one registry per kind of plugin.

Registration hooks receive a :class:`Registry` and call it::

    @hookimpl
    def schedlab_register_schedulers(register):
        register("fifo", FifoScheduler, config=FifoConfig, help="first come, first served")

A name can be registered once per kind; a second registration raises
:class:`~schedlab.errors.DuplicateNameError` naming both providers. A config class must be an
attrs class with no field named ``kind`` (the key that picks the plugin, so no table could set
it); one that is not frozen, or has fields nothing checks, is registered with a
:class:`PluginConfigWarning`.
"""

from __future__ import annotations

import difflib
import warnings
from typing import Any, Callable, Iterator

import attrs

from .errors import ConfigError, DuplicateNameError, UnknownPluginError


#: Kinds that register a spec (a :class:`schedlab.capacity.ModelSpec`, a ``GpuSpec``), not a factory.
SPEC_KINDS = ("model", "gpu")


class BrokenPluginWarning(UserWarning):
    """An installed plugin (entry point) failed to load or to register and was left out, or
    misuses a hook; or (:class:`PluginConfigWarning`) a plugin's config takes settings unchecked."""


class PluginConfigWarning(BrokenPluginWarning):
    """A plugin's config class takes settings unchecked: it is not frozen, or fields of it have
    neither a field helper of :mod:`schedlab.configs` nor an attrs validator or converter. The
    plugin is registered all the same. (A :class:`BrokenPluginWarning`, so that it is one line
    and is said once, where the command loads its plugins, not again in every worker.)"""


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
        self._warned: set[type] = set()  # config classes warned about (one class may serve several names)
        #: installed plugins of this kind left out while loading (their registration failed): an
        #: unknown name then says so, as the name may have been theirs
        self.left_out: list[str] = []
        #: names two installed plugins both claim (name -> who): refused rather than given to the one
        #: loaded first (which one that is depends on how the packages are found)
        self.ambiguous: dict[str, str] = {}

    def __call__(self, name: str, factory: Callable[..., Any], *, config: type | None = None, help: str = "") -> None:
        self.register(name, factory, config=config, help=help)

    def register(self, name: str, factory: Callable[..., Any], *, config: type | None = None, help: str = "") -> None:
        """Add ``name``; raises :class:`DuplicateNameError` if it is already taken, TypeError for a
        ``config`` that is not an attrs class or has a field named ``kind``, :class:`ConfigError` for
        a ``factory`` that cannot be called (an instance registered instead of its class; presets,
        :data:`SPEC_KINDS`, register specs); warns (:class:`PluginConfigWarning`) about a config
        that is not frozen or has fields nothing checks."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if config is not None and not (isinstance(config, type) and attrs.has(config)):  # (an instance: attrs.has too)
            raise TypeError(f"{self.kind} {name!r}: config must be an attrs class, got {config!r}")
        if config is not None and any(a.name == "kind" for a in attrs.fields(config)):
            raise TypeError(f"{self.kind} {name!r}: config {_class_name(config)} has a field named 'kind', which no "
                            f"table can set: 'kind' is the key that picks the plugin (kind = \"{name}\"); give the "
                            "setting another name")
        if not callable(factory) and self.kind not in SPEC_KINDS:
            plugin = f" (plugin {self._provider})" if self._provider != "?" else ""
            raise ConfigError(f"{self.kind} {name!r}{plugin}: the factory registered is a {type(factory).__name__} "
                              f"object, not callable; register the class or a function that makes one "
                              f"(register({name!r}, {type(factory).__name__}, config=...))")
        if name in self._entries:
            other = self._entries[name].provider
            error = DuplicateNameError(f"{self.kind} {name!r} is registered twice: by {other} and by {self._provider}")
            error.kind, error.name = self.kind, name
            raise error
        doc = help or (factory.__doc__ or "").strip().split("\n")[0]
        self._entries[name] = Entry(self.kind, name, factory, config, doc, self._provider)
        problem = _unchecked_config(config) if config is not None and config not in self._warned else None
        skipped = allocate_past_grow(factory) if self.kind == "kv_cache" else None
        if skipped:
            plugin = f" (plugin {self._provider})" if self._provider != "?" else ""
            warnings.warn(f"{self.kind.replace('_', ' ')} {name!r}{plugin}: {skipped}", PluginConfigWarning,
                          stacklevel=2)
        if problem:
            self._warned.add(config)
            plugin = f" (plugin {self._provider})" if self._provider != "?" else ""
            warnings.warn(f"{self.kind} {name!r}{plugin}: config class {_class_name(config)} {problem}",
                          PluginConfigWarning, stacklevel=2)

    def providing(self, provider: str) -> "Registry":
        """Set who the next registrations come from (the plugin manager does this per plugin)."""
        self._provider = provider
        return self

    def get(self, name: str) -> Entry:
        """The entry for ``name``; an unknown name raises an error listing the known ones."""
        if not isinstance(name, str):  # (a table or a list would not even hash)
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownPluginError(f"a {self.kind} is named by text, got {type(name).__name__} {name!r}; "
                                     f"registered: {known}")
        if name in self.ambiguous:
            raise UnknownPluginError(f"{self.kind} {name!r} is registered by two installed plugins ({self.ambiguous[name]}):"
                                     " uninstall one of them, or list the one you mean in [experiment] plugins")
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            hint = self._close_match(str(name))
            also = f" (did you mean {hint!r}?)" if hint else ""
            left = (f"; left out while loading, so their names are missing too (see the warning): "
                    f"{', '.join(self.left_out)}") if self.left_out else ""
            raise UnknownPluginError(f"unknown {self.kind} {name!r}{also}; registered: {known}{left}") from None

    def _close_match(self, name: str) -> str | None:
        """The registered name closest to ``name`` ignoring case (``EDF`` -> ``edf``), spelt as
        registered; names themselves stay case-sensitive."""
        spellings: dict[str, str] = {}
        for known in self._entries:
            spellings.setdefault(known.lower(), known)
        hint = difflib.get_close_matches(name.lower(), list(spellings), n=1)
        return spellings[hint[0]] if hint else None

    def refuse(self, name: str, who: str) -> None:
        """Make ``name`` unusable: claimed by two installed plugins (``who``), it names neither."""
        self._entries.pop(name, None)
        self.ambiguous[name] = who

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
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_frozen(cls: type) -> bool:
    """True when instances of the attrs class ``cls`` refuse to be changed (``@attrs.frozen``)."""
    try:
        probe = object.__new__(cls)  # (no __init__: no field values needed)
    except Exception:
        return True  # (cannot tell: say nothing)
    try:
        setattr(probe, "_schedlab_frozen_probe", None)
    except attrs.exceptions.FrozenInstanceError:
        return True
    except Exception:  # (a slotted class has no such attribute: settable all the same)
        return False
    return False


def allocate_past_grow(factory) -> str | None:
    """When ``factory``, a KV cache class, overrides ``allocate`` but inherits ``grow`` (or
    ``allocate_decodes``) from a built-in cache: the fast engine takes decode steps' blocks
    through those, so the override is bypassed there (the reference engine calls ``allocate``,
    and the two engines may still agree). None otherwise."""
    if not isinstance(factory, type) or "allocate" not in _own_members(factory):
        return None
    inherited = [name for name in ("grow", "allocate_decodes") if callable(getattr(factory, name, None))
                 and name not in _own_members(factory)
                 and getattr(factory, name).__module__.partition(".")[0] == "schedlab_plugins"]
    if not inherited:
        return None
    return (f"{factory.__qualname__} overrides allocate() but inherits {' and '.join(f'{n}()' for n in inherited)} "
            "from a built-in cache, through which the fast engine takes decode steps' blocks: your allocate() is "
            "not called for them there; override those too, or set grow = allocate_decodes = None")


def _own_members(cls: type) -> set[str]:
    """Names ``cls`` or a class of the plugin's own (not a built-in cache) defines."""
    return {name for klass in cls.__mro__ if klass.__module__.partition(".")[0] not in ("schedlab_plugins", "builtins")
            for name in vars(klass)}


def _unchecked_config(config: type) -> str | None:
    """What makes ``config`` take settings unchecked, as the end of a sentence, or None: not
    frozen, or fields a table sets with neither a validator nor a converter (a plain
    ``max_num_seqs: int = 16`` takes ``"many"``, or ``-5``, from the TOML) in a class with no
    ``__attrs_post_init__`` (where a config may check its fields together)."""
    problems = []
    if not _is_frozen(config):
        problems.append("is not frozen; make it @attrs.frozen (a plugin that changes its config would carry the "
                        "change from one run to the next)")
    unchecked = [a.name for a in attrs.fields(config) if a.init and a.validator is None and a.converter is None]
    if unchecked and getattr(config, "__attrs_post_init__", None) is not None:
        unchecked = []  # it checks its settings after they are set (and raises FieldError or ValueError)
    if unchecked:
        names = ", ".join(repr(n) for n in unchecked)
        some = f"fields nothing checks, {names}: they take" if len(unchecked) > 1 else \
            f"a field nothing checks, {names}: it takes"
        problems.append(f"{'it also ' if problems else ''}has {some} any value the TOML gives (\"many\" for a "
                        "number, -5 for a count); use schedlab.configs' field helpers (int_field(..., min=...), "
                        "float_field(..., min=...), str_field(..., choices=...), bool_field, ...) or attrs validators")
    return "; ".join(problems) or None
