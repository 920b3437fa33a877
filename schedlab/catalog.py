"""Assemble what a run can use: a fresh pluggy manager and the registries it fills.

Plugins come from three places, all registering through the same hooks: the ``schedlab``
entry-point group of schedlab's own package (the built-in modules of ``schedlab_plugins``,
loaded first), the same group of third-party packages, and modules an experiment lists in
``plugins = [...]``.
There is no module-level plugin manager: every :func:`load_catalog` call makes its own.

A third-party package whose entry point cannot be loaded (it raises on import, or implements
a hook that does not exist or with a misnamed parameter) or whose registration hook fails
(a name a built-in has, a config that is not an attrs class or has a field named ``kind``) is
left out -- none of its names stay -- with a :class:`BrokenPluginWarning` naming the plugin and
its package, so that one broken install does not stop every command. Two packages may use the
same entry-point name. The same failures of a module an experiment lists in ``plugins = [...]``
are errors; such a module is looked for first in the experiment file's folder. A config class
that is not frozen or has fields nothing checks is said once, with a
:class:`~schedlab.registry.PluginConfigWarning` (a BrokenPluginWarning), and its plugin loads.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import re
import sys
import traceback
import types
import weakref
import warnings
from typing import Iterable

import attrs
import pluggy

from . import hookspecs
from .errors import ConfigError, DuplicateNameError, SchedlabError
from .registry import BrokenPluginWarning, PluginConfigWarning, Registry  # (both warnings also imported from here)

#: the distribution whose ``schedlab`` entry points are the built-ins (pyproject.toml's
#: ``[project.entry-points.schedlab]``)
BUILTIN_DISTRIBUTION = "schedlab"

# kind name -> registration hook name
KINDS = {
    "scheduler": "schedlab_register_schedulers",
    "cost_model": "schedlab_register_cost_models",
    "kv_cache": "schedlab_register_kv_caches",
    "workload": "schedlab_register_workloads",
    "router": "schedlab_register_routers",
    "autoscaler": "schedlab_register_autoscalers",
    "report": "schedlab_register_reports",
    "power_model": "schedlab_register_power_models",
    "model": "schedlab_register_models",
    "gpu": "schedlab_register_gpus",
}


@attrs.define
class _Installed:
    """A plugin from the entry-point group: its package ("name version"), its entry point, and
    whether the experiment also lists its module in ``plugins = [...]`` (then its failures are errors)."""

    package: str
    entry: str
    value: str
    listed: bool = False


def _listed_in(source: str | None) -> str:
    """Where a ``plugins`` module was listed, as a message prefix ('' for an installed plugin)."""
    return f"{source}: [experiment] plugins: " if source else ""


#: The modules imported from an experiment's folder (its plugins and the helpers they import),
#: by name -> that folder. Python keeps one module of a name for the whole process, so a second
#: experiment in it -- the Python API, a notebook, a test suite, ``--jobs 1`` after another --
#: whose own folder (or Python's path) holds another module of that name got the first one's,
#: and with it the first experiment's results. Before a folder's import, the modules another
#: folder gave are dropped from ``sys.modules`` (the catalogs built from them keep their own).
#: A record of the process's one module cache, not of any run.
_FROM_FOLDER: dict[str, str] = {}


def _forget_other_folders(folder: str) -> None:
    """Drop from ``sys.modules`` the modules :data:`_FROM_FOLDER` has of another folder than
    ``folder``."""
    for name, origin in list(_FROM_FOLDER.items()):
        if origin != folder:
            del _FROM_FOLDER[name]
            sys.modules.pop(name, None)


def _note_folder_modules(before: set, folder: str) -> None:
    """Record in :data:`_FROM_FOLDER` the modules imported since ``before`` from files in ``folder``."""
    root = os.path.join(os.path.realpath(folder), "")
    for name in set(sys.modules) - before:
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and os.path.realpath(path).startswith(root):
            _FROM_FOLDER[name] = folder


def _import_module(module_name: str, plugin_dir: str | os.PathLike | None, source: str | None):
    """Import a plugin module, looking first in ``plugin_dir`` (the experiment file's folder)."""
    where = _listed_in(source)
    if not isinstance(module_name, str) or not all(part.isidentifier() for part in module_name.split(".")):
        raise ConfigError(f"{where}{module_name!r} is not a module name: dotted Python names, such as "
                          "'my_scheduler' for my_scheduler.py beside the experiment file")
    folder = os.fspath(plugin_dir) if plugin_dir is not None else None
    if folder is not None:  # (an installed plugin's module, or one asked for by name alone, evicts nothing)
        _forget_other_folders(folder)
    before = set(sys.modules)
    if folder is not None:
        sys.path.insert(0, folder)
        importlib.invalidate_caches()  # (the folder's files may be newer than a cached listing of it)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if folder is not None and (module_name == missing or module_name.startswith(missing + ".")):
            raise ConfigError(f"{where}cannot import plugin module {module_name!r}: no module named {missing!r} "
                              f"in {folder} (the experiment file's folder) or on Python's path (sys.path)") from None
        raise ConfigError(f"{where}cannot import plugin module {module_name!r}: {exc}{_raised_at(exc)}") from None
    except ImportError as exc:
        raise ConfigError(f"{where}cannot import plugin module {module_name!r}: {exc}{_raised_at(exc)}") from None
    except Exception as exc:  # the module itself raised while being imported
        raise ConfigError(f"{where}plugin module {module_name!r} failed while importing: "
                          f"{type(exc).__name__}: {exc}{_raised_at(exc)}") from None
    except KeyboardInterrupt:  # Ctrl-C while importing: an interrupt, as anywhere else
        raise
    except BaseException as exc:  # sys.exit() or a BaseException of its own, raised by the module
        raise ConfigError(f"{where}plugin module {module_name!r} failed while importing: {type(exc).__name__}"
                          f"{': ' + str(exc) if str(exc) else ''} (a plugin module must not exit or raise "
                          "while imported)") from None
    finally:
        if folder is not None:
            if sys.path and sys.path[0] == folder:
                del sys.path[0]
            elif folder in sys.path:
                sys.path.remove(folder)
            _note_folder_modules(before, folder)
    if folder is not None:
        _refuse_shadowed(module_name, folder, source)
    return module


def _raised_at(exc: BaseException) -> str:
    """`` (file.py:line)``, where the import raised ``exc``: its innermost frame outside Python's
    import machinery (a plugin's own line, or the helper module it imported); "" if none."""
    frames = [(frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(exc.__traceback__)
              if not frame.f_code.co_filename.startswith("<frozen ")]
    if not frames:
        return ""
    path, line = frames[-1]
    return f" ({os.path.basename(path)}:{line})"


def _refuse_shadowed(module_name: str, folder: str, source: str | None) -> None:
    """A module of the experiment's folder that Python did not import, because a module of the same
    name was imported first (the standard library's ``json``, an installed package, a module the
    user's own code imported): Python keeps the first, so the folder's file would be silently
    ignored. (Another experiment folder's module of the name is dropped first:
    :func:`_forget_other_folders`.)"""
    top = module_name.partition(".")[0]
    local = next((p for p in (os.path.join(folder, f"{top}.py"), os.path.join(folder, top, "__init__.py"))
                  if os.path.isfile(p)), None)
    if local is None:
        return
    origin = getattr(sys.modules.get(top), "__file__", None)
    if origin is not None and (os.path.realpath(origin) == os.path.realpath(local) or _same_bytes(origin, local)):
        return   # (the same file, or a copy of it: a hunt's reproducer folder carries one)
    raise ConfigError(f"{_listed_in(source)}plugin module {module_name!r}: {local} is not the module Python uses "
                      f"for that name: {origin or 'a module built into Python'} was imported first (a "
                      f"standard-library or installed module, or another folder's file of that name); rename "
                      f"{os.path.basename(local)} (and the name in plugins = [...])")


def _same_bytes(a: str, b: str) -> bool:
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    except OSError:
        return False


def _import_plugin(pm: pluggy.PluginManager, module_name: str, *, provider: str,
                   plugin_dir: str | os.PathLike | None = None, source: str | None = None) -> object:
    module = _import_module(module_name, plugin_dir, source)
    if pm.is_registered(module):
        return module
    if pm.has_plugin(provider):  # (an installed plugin's entry point has this name)
        provider = f"{provider} ([experiment] plugins)"
    try:
        pm.register(module, name=provider)
    except pluggy.PluginValidationError as exc:
        _unregister(pm, module)
        raise ConfigError(f"{_listed_in(source)}plugin module {module_name!r}: {_validation_text(exc)}") from None
    if not pm.get_hookcallers(module):  # e.g. plugins = ["os"]: nothing would ever come of it
        pm.unregister(module)
        raise ConfigError(f"{_listed_in(source)}plugin module {module_name!r} implements no schedlab hook (functions "
                          "marked @schedlab.hookimpl, such as schedlab_register_schedulers)")
    return module


def _unregister(pm: pluggy.PluginManager, plugin: object) -> None:
    """Undo a registration, also one pluggy left half done when a hook failed validation."""
    if pm.is_registered(plugin):
        pm.unregister(plugin)


def _required_args(function) -> list[str]:
    """The arguments pluggy passes a hook implementation: those without a default."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.default is p.empty]


def _validation_text(exc: pluggy.PluginValidationError) -> str:
    """What is wrong with a plugin pluggy refused, in one line: for a hook implementation with a
    misnamed parameter, the hook, the wrong name and the names the hook has."""
    plugin = exc.plugin
    problems = []
    for attr in dir(plugin):
        function = getattr(plugin, attr, None)
        opts = getattr(function, f"{hookspecs.NAME}_impl", None)  # (what @schedlab.hookimpl marks)
        if not isinstance(opts, dict):
            continue
        hook_name = opts.get("specname") or attr
        spec = getattr(hookspecs, hook_name, None) if hook_name.startswith(f"{hookspecs.NAME}_") else None
        if not callable(spec):
            continue
        expected = list(inspect.signature(spec).parameters)
        wrong = [name for name in _required_args(function) if name not in expected]
        if wrong:
            names = ", ".join(repr(name) for name in wrong)
            problems.append(f"hook {spec.__name__} has a parameter named {names}, which the hook does not pass; "
                            f"its parameter{'s are' if len(expected) > 1 else ' is'} named "
                            f"{', '.join(repr(name) for name in expected)} "
                            f"(def {spec.__name__}({', '.join(expected)}))")
    return "; ".join(problems) or " ".join(f"{type(exc).__name__}: {exc}".split())


def make_plugin_manager(extra_modules: Iterable[str] = (), *, entry_points: bool = True, builtins: bool = True,
                        plugin_dir: str | os.PathLike | None = None,
                        source: str | None = None) -> pluggy.PluginManager:
    """A new plugin manager with the built-ins, installed plugins and ``extra_modules``.

    :param plugin_dir: where ``extra_modules`` are looked for first (an experiment file's folder).
    :param source: the experiment file that lists ``extra_modules``, for messages.
    :raises ConfigError: an extra module cannot be imported, or a plugin implements a hook
        that does not exist (a misspelt hook name fails here, not silently).
    """
    return _assemble(extra_modules, entry_points=entry_points, builtins=builtins, plugin_dir=plugin_dir,
                     source=source)[0]


def _assemble(extra_modules: Iterable[str], *, entry_points: bool, builtins: bool,
              plugin_dir: str | os.PathLike | None,
              source: str | None) -> tuple[pluggy.PluginManager, dict[str, _Installed], list[str]]:
    """The plugin manager, the installed plugins registered in it, and those left out while loading
    (``plugin 'x' of package y``: an unknown name may have been theirs)."""
    pm = pluggy.PluginManager(hookspecs.NAME)
    pm.add_hookspecs(hookspecs)
    if builtins:
        for entry_point in builtin_entry_points():
            _import_plugin(pm, entry_point.value, provider=f"{entry_point.value} (built-in)")
    unloaded: list[str] = []
    installed = _load_entry_points(pm, unloaded) if entry_points else {}
    for name in extra_modules:
        module = _import_plugin(pm, name, provider=name, plugin_dir=plugin_dir, source=source)
        if pm.get_name(module) in installed:  # installed, and asked for by name: its failures are errors
            installed[pm.get_name(module)].listed = True
    _check_pending(pm, installed, source, unloaded)
    return pm, installed, unloaded


def builtin_entry_points() -> list[importlib.metadata.EntryPoint]:
    """schedlab's own entry points of the ``schedlab`` group: the built-in plugins, found as a
    third-party package's are (a broken one is an error, not a warning).

    :raises SchedlabError: schedlab's package metadata is not there (a source tree put on
        Python's path instead of installed) or names no plugin."""
    try:
        dist = importlib.metadata.distribution(BUILTIN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    ours = [ep for ep in dist.entry_points if ep.group == hookspecs.NAME] if dist is not None else []
    if not ours:
        raise SchedlabError(f"schedlab's built-in plugins are registered through the {hookspecs.NAME!r} entry-point "
                            "group of its installed package, and "
                            + ("no schedlab package is installed" if dist is None else
                               f"the installed schedlab {dist.version} lists none")
                            + f" (schedlab is imported from {os.path.dirname(os.path.dirname(__file__))}): install "
                            "it, `pip install -e .` in a source checkout")
    return ours


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _load_entry_points(pm: pluggy.PluginManager, unloaded: list[str]) -> dict[str, _Installed]:
    """Register every plugin of the ``schedlab`` entry-point group that loads; warn about the
    others (listed in ``unloaded``). Returns registered name -> its :class:`_Installed` for the ones
    registered.

    Two packages may use the same entry-point name: the second is registered as
    ``"<name> (<package>)"``. One package found twice on ``sys.path`` is loaded once."""
    installed: dict[str, _Installed] = {}
    seen: set[tuple[str, str]] = set()
    for dist in importlib.metadata.distributions():
        ours = [ep for ep in dist.entry_points if ep.group == hookspecs.NAME]
        if not ours:  # (most packages: their METADATA is not parsed, which costs ~1 ms each)
            continue
        dist_name = dist.metadata["Name"] or "?"
        if _canonical(dist_name) == BUILTIN_DISTRIBUTION:  # (the built-ins, loaded before)
            continue
        package = f"{dist_name} {dist.version}"
        for ep in ours:
            if (_canonical(dist_name), ep.name) in seen:
                continue
            seen.add((_canonical(dist_name), ep.name))
            if pm.is_blocked(ep.name):
                continue
            name = ep.name if not pm.has_plugin(ep.name) else f"{ep.name} ({package})"
            try:
                plugin = ep.load()
            except Exception as exc:
                _warn_broken(ep.name, package, ep.value, exc)
                unloaded.append(f"plugin {ep.name!r} of package {package}")
                continue
            if pm.is_registered(plugin):  # another entry point names the same module
                other = installed.get(pm.get_name(plugin))
                if other is not None and _canonical(other.package.rsplit(" ", 1)[0]) != _canonical(dist_name):
                    warnings.warn(f"plugin {ep.name!r} of package {package} ({ep.name} = {ep.value}) is the same "
                                  f"module as plugin {other.entry!r} of package {other.package} ({other.entry} = "
                                  f"{other.value}), loaded once, as {other.package}'s (one package's files may have "
                                  "overwritten the other's)", BrokenPluginWarning, stacklevel=2)
                continue
            try:
                pm.register(plugin, name=name)
            except pluggy.PluginValidationError as exc:
                _unregister(pm, plugin)
                _warn_broken(ep.name, package, ep.value, _validation_text(exc))
                unloaded.append(f"plugin {ep.name!r} of package {package}")
                continue
            except ValueError as exc:  # (pluggy refused the name or the object)
                _unregister(pm, plugin)
                _warn_broken(ep.name, package, ep.value, exc)
                unloaded.append(f"plugin {ep.name!r} of package {package}")
                continue
            installed[name] = _Installed(package, ep.name, ep.value)
    return installed


def _warn_broken(name: str, package: str, value: str, exc: BaseException | str,
                 what: str = "failed to load") -> None:
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    warnings.warn(f"plugin {name!r} of package {package} ({name} = {value}) {what} and is left out: "
                  f"{' '.join(text.split())}", BrokenPluginWarning, stacklevel=2)


def _check_pending(pm: pluggy.PluginManager, installed: dict[str, _Installed], source: str | None = None,
                   unloaded: list[str] | None = None) -> None:
    """Fail on a hook implementation that matches no hookspec (a misspelt hook name), named with
    the experiment file that lists the module (``source``); an installed plugin with one is left
    out with a warning instead."""
    while True:
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin)
            info = installed.get(name)
            text = _unknown_hook_text(pm, exc)
            if info is None or info.listed:
                raise ConfigError(_listed_in(source) + (text or f"plugin error: {exc}")) from None
            pm.unregister(exc.plugin)
            del installed[name]
            _warn_broken(info.entry, info.package, info.value, text or exc)
            if unloaded is not None:
                unloaded.append(f"plugin {info.entry!r} of package {info.package}")


def _unknown_hook_text(pm: pluggy.PluginManager, exc: pluggy.PluginValidationError) -> str | None:
    """pluggy's "unknown hook" in one line naming the plugin's module, with the closest hook
    name (``schedlab_register_scheduler``: did you mean ``schedlab_register_schedulers``?), or
    every hook name when none is close; None for another error."""
    valid = sorted(name for name in vars(hookspecs) if hasattr(getattr(hookspecs, name), f"{hookspecs.NAME}_spec"))
    unknown = [name for name, caller in vars(pm.hook).items()
               if not name.startswith("_") and not caller.has_spec()
               and any(impl.plugin is exc.plugin and not impl.optionalhook for impl in caller.get_hookimpls())]
    if not unknown:
        return None
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        parts.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    listed = "" if all("did you mean" in part for part in parts) else f"; hooks: {', '.join(valid)}"
    return (f"{_plugin_label(exc.plugin, quoted=True)} implements unknown hook{'s' if len(parts) > 1 else ''} "
            f"{', '.join(parts)}{listed}")


def _provider_names(pm: pluggy.PluginManager, installed: dict[str, _Installed]) -> dict[int, str]:
    names = {id(plugin): pm.get_name(plugin) or repr(plugin) for plugin in pm.get_plugins()}
    for plugin, dist in pm.list_plugin_distinfo():
        names[id(plugin)] = f"{dist.project_name} {dist.version}"
    for name, info in installed.items():
        plugin = pm.get_plugin(name)
        if plugin is not None:
            names[id(plugin)] = info.package
    return names


def _plugin_label(plugin: object, quoted: bool = False) -> str:
    """A plugin as messages name it: its module, or its class (``quoted``: with "plugin module" before)."""
    if isinstance(plugin, types.ModuleType):
        return f"plugin module {plugin.__name__!r}" if quoted else plugin.__name__
    label = f"{type(plugin).__module__}.{type(plugin).__qualname__}"
    return f"plugin {label}" if quoted else label


RETURNED = ("hooks register by calling registry.register(name, factory, config=...); "
            "the return value is ignored")


def _returned_text(result: object) -> str:
    """``a dict ({'x': <class ...>})``: what a hook returned, shortened."""
    text = " ".join(repr(result).split())
    return f"a {type(result).__name__} ({text if len(text) <= 60 else text[:57] + '...'})"


@attrs.define
class Catalog:
    """Every registered name, by kind, for one run (or one experiment)."""

    registries: dict[str, Registry]
    plugin_manager: pluggy.PluginManager
    #: providers (as :class:`~schedlab.registry.Entry` names them) of the modules an experiment
    #: lists in ``plugins = [...]``, installed plugins aside (``schedlab plugins FILE`` marks them)
    listed: tuple[str, ...] = ()
    #: the entry each plugin object was built from (weakly held: for an error's message, which
    #: then names the registered name the run used, not a base class registered under another)
    built: weakref.WeakKeyDictionary = attrs.field(factory=weakref.WeakKeyDictionary)

    def __getitem__(self, kind: str) -> Registry:
        return self.registries[kind]

    def note_built(self, obj: object, entry) -> None:
        """Remember that ``entry``'s factory made ``obj`` (objects that take no weak reference --
        ``__slots__`` without ``__weakref__`` -- are not remembered: errors then go by class)."""
        try:
            self.built[obj] = entry
        except TypeError:
            pass

    def entry_of(self, obj: object):
        """The entry ``obj`` was built from, if it was noted (:meth:`note_built`), else None."""
        try:
            return self.built.get(obj)
        except TypeError:
            return None

    @property
    def hook(self):
        return self.plugin_manager.hook

    def observes_iterations(self) -> bool:
        """True when some plugin implements the (slow, opt-in) per-iteration hook."""
        return bool(self.plugin_manager.hook.schedlab_iteration.get_hookimpls())


def load_catalog(extra_modules: Iterable[str] = (), *, entry_points: bool = True,
                 plugin_objects: Iterable[object] = (), plugin_dir: str | os.PathLike | None = None,
                 source: str | None = None) -> Catalog:
    """Build a plugin manager, then call every plugin's registration hooks.

    Plugins register one after the other, in the order they were loaded (built-ins first, so a
    built-in keeps its names), each through every hook before the next. Each plugin's
    registrations are attributed to it, so a duplicate name error says which two plugins
    collide. An installed plugin whose registration fails is left out -- none of its names stay
    -- with a :class:`BrokenPluginWarning`; any other plugin's failure is an error.
    ``plugin_objects`` are registered in-process (tests, notebooks); ``plugin_dir`` and
    ``source`` are those of :func:`make_plugin_manager`.
    """
    extra_modules = tuple(extra_modules)
    pm, installed, unloaded = _assemble(extra_modules, entry_points=entry_points, builtins=True,
                                        plugin_dir=plugin_dir, source=source)
    for obj in plugin_objects:
        try:
            pm.register(obj)
        except pluggy.PluginValidationError as exc:
            _unregister(pm, obj)
            raise ConfigError(f"plugin {_plugin_label(obj)}: {_validation_text(exc)}") from None
    _check_pending(pm, {}, source)
    providers = _provider_names(pm, installed)
    registries = {kind: Registry(kind) for kind in KINDS}
    for registry in registries.values():  # (what a plugin that did not load registers is unknown: any kind)
        registry.left_out.extend(unloaded)
    impls: dict[int, list] = {}
    for kind, hook_name in KINDS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            impls.setdefault(id(impl.plugin), []).append((kind, hook_name, impl))
    installed_providers = {info.package for info in installed.values() if not info.listed}
    for name, plugin in pm.list_name_plugin():  # in the order they were registered
        if plugin is None or id(plugin) not in impls:
            continue
        info = installed.get(name)
        left_out = info is not None and not info.listed
        marks = {kind: registry.mark() for kind, registry in registries.items()}
        try:
            _register_plugin(plugin, impls[id(plugin)], registries, providers, info if left_out else None)
        except _RegistrationFailed as failed:
            if not left_out:
                error = failed.error
                if source and isinstance(error, (ConfigError, DuplicateNameError)):  # (named with the file listing it)
                    error = type(error)(_listed_in(source) + str(error))
                raise error from None
            for kind, registry in registries.items():
                registry.undo_since(marks[kind])
            clash = failed.error if isinstance(failed.error, DuplicateNameError) else None
            if clash is not None and clash.name in registries.get(clash.kind, ()):
                owner = registries[clash.kind].get(clash.name).provider
                if owner in installed_providers:  # two installed packages: neither gets it (review s81 plugin, 6)
                    registries[clash.kind].refuse(clash.name, f"{owner} and {info.package}")
            for kind in {kind for kind, _, _ in impls[id(plugin)]}:  # (an unknown name may have been its)
                registries[kind].left_out.append(f"plugin {info.entry!r} of package {info.package}")
            pm.unregister(plugin)
            _warn_broken(info.entry, info.package, info.value, failed.error, f"failed in {failed.hook_name}")
    modules = (sys.modules.get(name) for name in extra_modules)
    listed = tuple(dict.fromkeys(providers[id(m)] for m in modules if m is not None and pm.is_registered(m)
                                 and pm.get_name(m) not in installed and not providers[id(m)].endswith(" (built-in)")))
    return Catalog(registries, pm, listed)


class _RegistrationFailed(Exception):
    def __init__(self, hook_name: str, error: BaseException):
        super().__init__(hook_name, error)
        self.hook_name = hook_name
        self.error = error


def _register_plugin(plugin: object, impls: list, registries: dict[str, Registry], providers: dict[int, str],
                     installed: _Installed | None) -> None:
    """Call one plugin's registration hooks (assembly time only, one by one, so that each
    registration is attributed to the plugin that made it).

    :param installed: the plugin's entry point when a failure leaves it out, else None.
    :raises _RegistrationFailed: with the error to raise or to warn about.
    """
    for kind, hook_name, impl in impls:
        provider = providers.get(id(plugin), impl.plugin_name)
        registry = registries[kind].providing(provider)
        try:
            result = impl.function(**{arg: registry for arg in impl.argnames})
        except SchedlabError as exc:
            raise _RegistrationFailed(hook_name, exc) from None
        except Exception as exc:  # the plugin's own bug: name it rather than show its traceback
            error = ConfigError(f"plugin {provider} failed in {hook_name}: {type(exc).__name__}: {exc}")
            raise _RegistrationFailed(hook_name, exc if installed is not None else error) from None
        if result is None:
            continue
        if installed is None:
            raise _RegistrationFailed(hook_name, ConfigError(
                f"{_plugin_label(plugin, quoted=True)}: {hook_name} returned {_returned_text(result)}; {RETURNED}"))
        warnings.warn(f"plugin {installed.entry!r} of package {installed.package} ({installed.entry} = "
                      f"{installed.value}): {hook_name} of module {_plugin_label(plugin)!r} returned "
                      f"{_returned_text(result)}; {RETURNED}", BrokenPluginWarning, stacklevel=2)
