"""Errors a user can cause and fix. The CLI prints them as one message, without a traceback."""

from __future__ import annotations

import os
import traceback
import types

from . import interrupts


class SchedlabError(Exception):
    """Base class: something the user can fix (bad input, unknown name, impossible config)."""


class ConfigError(SchedlabError):
    """An experiment file, a ``--set`` override or a plugin config is wrong."""


class UnknownPluginError(ConfigError):
    """A ``kind`` names nothing registered; the message lists what is."""


class DuplicateNameError(SchedlabError):
    """Two plugins registered the same name for the same kind (``kind``, ``name``: which, when known)."""

    kind: str | None = None
    name: str | None = None


class WorkloadError(SchedlabError):
    """A request file or trace cannot be read or has bad values."""


class InputWarning(UserWarning):
    """An input file read with something assumed or left out, and why (a target's statistics a
    non-streaming run cannot have, a replay that cannot be the client's). Said on one line, once
    per command, where the experiment is loaded (:mod:`schedlab.cli`); runs do not repeat it."""


class RunWarning(InputWarning):
    """What a plugin or the engine warned of while a run ran -- in a worker process or in this
    one alike: :func:`schedlab.study.tasks.execute` keeps it in the run's ``meta["warnings"]``
    and the study runner says it again here, once per message (a worker's stderr is not the
    command's, and results never depend on where runs ran)."""


class SimulationError(SchedlabError):
    """The simulation cannot go on: a plugin broke a rule, or no progress is possible."""


class StallError(SimulationError):
    """Work is left but nothing can make progress (a scheduler that never admits, a storm)."""


class PluginError(SchedlabError):
    """A plugin raised an exception of its own -- a bug in the plugin, not a schedlab error.

    The message names the plugin, the exception and the plugin's line (see
    :func:`plugin_error`); :attr:`details` holds the whole traceback, which the command line
    prints when ``SCHEDLAB_TRACEBACK=1`` (:data:`TRACEBACK_ENV`). It pickles with its details
    (a worker process sends it back to the parent).
    """

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


#: The environment variable that makes the command line print a plugin's traceback too.
TRACEBACK_ENV = "SCHEDLAB_TRACEBACK"


def brief(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters with "..." -- for echoing a value from a file
    or a plugin into a one-line error, however long the value is."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


#: What a plugin may raise that counts as its error (:func:`plugin_error`): a ``KeyboardInterrupt``
#: counts only when no signal brought it (:func:`schedlab.interrupts.by_signal`).
PLUGIN_RAISES = (Exception, SystemExit, GeneratorExit, KeyboardInterrupt)


def plugin_error(exc: BaseException, catalog, where: str | None = None) -> PluginError | None:
    """``exc`` as a :class:`PluginError` when a plugin of ``catalog`` raised it, else None.

    A plugin raised it when its traceback passes through a plugin's module: the module of a
    registered factory or config (``schedlab_plugins.*``, a third-party package, a module of
    ``plugins = [...]``) or of a registered plugin object, or another module of the same
    top-level package -- never schedlab's own. The message names the plugin to blame -- the
    innermost plugin frame that is a registered plugin's method, factory or hook (a KV cache a
    built-in scheduler called), else the registered name the outermost plugin frame belongs to
    -- and the line of the innermost plugin frame, where the plugin raised or called what raised;
    ``where`` goes in front.
    A plugin's ``sys.exit()`` (``SystemExit``) and ``GeneratorExit`` count as its exceptions (an
    exit status 0 with no results said nothing); a plugin frame found only in the exceptions that
    led to ``exc`` (its ``__cause__`` or ``__context__``: a ``StopIteration`` a generator raised,
    which Python turns into a ``RuntimeError`` in the frame that read it) counts too.
    A ``MemoryError`` counts when a third-party plugin's frame is the innermost plugin frame (a
    plugin's own ``raise MemoryError("...")``, or its own allocation), with the advice for a run
    too large beside it; in schedlab's or the built-in plugins' frames alone it is the run's size
    (None: the command line says so).
    So does a plugin's own ``raise KeyboardInterrupt``, when no signal came (it read as Ctrl-C).
    Schedlab's own errors, interrupts by a signal and other ``BaseException`` give None, as does an
    exception raised in schedlab's code alone (a bug in schedlab: its traceback is wanted).
    """
    if isinstance(exc, KeyboardInterrupt):
        if interrupts.by_signal():
            return None
    elif not isinstance(exc, (Exception, SystemExit, GeneratorExit)) or isinstance(exc, SchedlabError):
        return None
    try:
        return _plugin_error(exc, catalog, where)
    except MemoryError:  # (out of memory for real: the command line's advice is what is left)
        return None


#: What a :class:`PluginError` for a plugin's ``MemoryError`` adds.
MEMORY_ADVICE = "if the experiment is large, make it smaller (fewer requests, points or instances)"


def _plugin_error(exc: BaseException, catalog, where: str | None) -> PluginError | None:
    try:
        entries = [entry for registry in catalog.registries.values() for entry in registry]
        packages = _plugin_packages(catalog, entries)
    except Exception:  # (not a catalog: nothing to go by)
        return None
    frames = []
    for link in _chain(exc):
        frames = [(frame, line) for frame, line in traceback.walk_tb(link.__traceback__)
                  if _package_of(frame.f_globals.get("__name__")) in packages]
        if frames:
            break
    if not frames:
        return None
    inner, line = frames[-1]
    if isinstance(exc, MemoryError) and _package_of(inner.f_globals.get("__name__")) in _builtin_packages(entries):
        return None
    try:
        text = " ".join(str(exc).split())
    except Exception:  # (an exception whose __str__ raises)
        text = "(its message could not be shown)"
    if isinstance(exc, SystemExit):
        text = f"sys.exit({text})" if text else "sys.exit()"
    what = f"{_culprit([frame for frame, _ in frames], entries, catalog)} raised {type(exc).__name__}" + \
        (f": {text}" if text else "")
    message = f"{what} ({_place(inner, line)}; {TRACEBACK_ENV}=1 prints the traceback)"
    if isinstance(exc, MemoryError):
        message += f"; {MEMORY_ADVICE}"
    error = PluginError(f"{where}: {message}" if where else message, "".join(traceback.format_exception(exc)))
    error.__cause__ = exc  # (in this process: the original, for a debugger or an API caller)
    return error


def raised_by_plugin(exc: SchedlabError, catalog) -> SchedlabError:
    """``exc``, a schedlab error, with the plugin that raised it in front when a third-party
    plugin's own code raised it (its innermost frame is the plugin's: ``raise ConfigError("my state
    is bad")`` at run time read as schedlab's, naming no plugin); else ``exc``. The message is the
    plugin's, meant for its user, so no line is added. Errors schedlab raises where a plugin
    called it (a Plan call it got wrong) say what they are."""
    try:
        entries = [entry for registry in catalog.registries.values() for entry in registry]
        packages = _plugin_packages(catalog, entries) - _builtin_packages(entries)
    except Exception:  # (not a catalog: nothing to go by)
        return exc
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames or _package_of(frames[-1][0].f_globals.get("__name__")) not in packages:
        return exc
    who = _culprit([frame for frame, _ in frames if _package_of(frame.f_globals.get("__name__")) in packages], entries,
                   catalog)
    try:
        return type(exc)(f"{who}: {exc}")
    except TypeError:  # (a plugin's error class with another constructor)
        return exc


def _place(frame, line: int) -> str:
    """Where a frame is, as messages show it: ``mine.py:12 in Mine.schedule``."""
    code = frame.f_code
    return f"{_file_name(code.co_filename)}:{line} in {getattr(code, 'co_qualname', code.co_name)}"


def _chain(exc: BaseException, most: int = 16) -> list[BaseException]:
    """``exc`` and the exceptions that led to it (``__cause__``, else ``__context__``), nearest first."""
    chain = [exc]
    while len(chain) < most:
        link = chain[-1].__cause__ or chain[-1].__context__
        if link is None or link in chain:
            break
        chain.append(link)
    return chain


def _package_of(module: object) -> str | None:
    return module.split(".")[0] if isinstance(module, str) and module else None


def _plugin_packages(catalog, entries) -> set[str]:
    """The top-level packages plugins come from (schedlab's own excluded)."""
    modules = {getattr(obj, "__module__", None) for entry in entries for obj in (entry.factory, entry.config)}
    for plugin in catalog.plugin_manager.get_plugins():
        modules.add(plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__)
    return {_package_of(m) for m in modules} - {None, "schedlab", "builtins", "functools"}


def _builtin_packages(entries) -> set[str]:
    """The top-level packages of the built-in plugins (``schedlab_plugins``)."""
    return {_package_of(getattr(entry.factory, "__module__", None)) for entry in entries
            if entry.provider.endswith(" (built-in)")} - {None}


def _culprit(frames, entries, catalog=None) -> str:
    """Who raised, from the plugin ``frames`` outermost first: the innermost one that is a registered
    plugin's own (a method of an object its factory made, its factory, a hook) -- a built-in
    scheduler calling a third-party KV cache whose ``num_free_blocks()`` returned None is not to
    blame -- else, as before, the registered name the outermost frame belongs to."""
    for frame in reversed(frames):
        who = _own(frame, entries, catalog)
        if who is not None:
            return who
    return _module_owner(frames[0], entries)


def _own(frame, entries, catalog=None) -> str | None:
    """The registered name (or hook) ``frame`` is a method or the factory of, or None: for a
    method, the name the object was built from (``catalog.entry_of``), else the first class of its
    class's MRO registered itself -- a subclass a factory function builds is not, so its base
    class's name would be blamed (review s81 plugin, finding 2) when it is not known what built it."""
    module = frame.f_globals.get("__name__")
    code = frame.f_code
    if code.co_name.startswith("schedlab_"):  # a hook implementation
        return f"plugin {module}'s hook {code.co_name}"
    entry = None
    this = frame.f_locals.get("self")
    if this is not None and catalog is not None and hasattr(catalog, "entry_of"):
        entry = catalog.entry_of(this)
    if this is not None and entry is None:
        for cls in type(this).__mro__:
            entry = next((e for e in entries if e.factory is cls), None)
            if entry is not None:
                break
    if entry is None:
        entry = next((e for e in entries if getattr(e.factory, "__code__", None) is code), None)
    return entry_label(entry) if entry is not None else None


def _module_owner(frame, entries) -> str:
    """The plugin ``frame``, the outermost plugin frame and no registered plugin's own, belongs to: the
    registered name its module holds when it holds one, else the module."""
    module = frame.f_globals.get("__name__")
    same = [e for e in entries if getattr(e.factory, "__module__", None) == module]
    return entry_label(same[0]) if len(same) == 1 else f"plugin {module}"


def entry_label(entry) -> str:
    """A registry entry as messages name it: ``scheduler 'x' (plugin m)``, ``... (built-in plugin m)``."""
    provider, builtin = entry.provider, " (built-in)"
    by = f"built-in plugin {provider[:-len(builtin)]}" if provider.endswith(builtin) else f"plugin {provider}"
    return f"{entry.kind.replace('_', ' ')} {entry.name!r} ({by})"


def _file_name(path: str) -> str:
    """A source file as the message shows it: its name (with its folder's for ``__init__.py``)."""
    head, name = os.path.split(path)
    return f"{os.path.basename(head)}/{name}" if name == "__init__.py" and head else name
