"""Assemble what a run can use: a fresh pluggy manager and the registries it fills.

Plugins come from three places, all loaded the same way and registering through the same
hooks: the built-in modules of ``schedlab_plugins``, the ``schedlab`` entry-point group
(third-party packages), and modules an experiment lists in ``plugins = [...]``.
There is no module-level plugin manager: every :func:`load_catalog` call makes its own.

A third-party package whose entry point cannot be loaded (it raises on import, or implements
a hook that does not exist) is left out with a :class:`BrokenPluginWarning` naming the plugin
and its package, so that one broken install does not stop every command.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from typing import Iterable

import attrs
import pluggy

from . import hookspecs
from .errors import ConfigError, SchedlabError
from .registry import Registry

BUILTIN_PLUGINS = (
    "schedlab_plugins.schedulers",
    "schedlab_plugins.cost_models",
    "schedlab_plugins.kv_caches",
    "schedlab_plugins.workloads",
    "schedlab_plugins.routers",
    "schedlab_plugins.autoscalers",
    "schedlab_plugins.reports",
    "schedlab_plugins.presets",
    "schedlab_plugins.power",
)

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


class BrokenPluginWarning(UserWarning):
    """An installed plugin (entry point) failed to load and was left out."""


def _import_plugin(pm: pluggy.PluginManager, module_name: str, *, provider: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import plugin module {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself raised while being imported
        raise ConfigError(f"plugin module {module_name!r} failed while importing: "
                          f"{type(exc).__name__}: {exc}") from None
    if pm.is_registered(module):
        return
    pm.register(module, name=provider)
    if not pm.get_hookcallers(module):  # e.g. plugins = ["os"]: nothing would ever come of it
        pm.unregister(module)
        raise ConfigError(f"plugin module {module_name!r} implements no schedlab hook (functions marked "
                          "@schedlab.hookimpl, such as schedlab_register_schedulers)")


def make_plugin_manager(extra_modules: Iterable[str] = (), *, entry_points: bool = True,
                        builtins: bool = True) -> pluggy.PluginManager:
    """A new plugin manager with the built-ins, installed plugins and ``extra_modules``.

    :raises ConfigError: an extra module cannot be imported, or a plugin implements a hook
        that does not exist (a misspelt hook name fails here, not silently).
    """
    pm = pluggy.PluginManager(hookspecs.NAME)
    pm.add_hookspecs(hookspecs)
    if builtins:
        for name in BUILTIN_PLUGINS:
            _import_plugin(pm, name, provider=f"{name} (built-in)")
    installed = _load_entry_points(pm) if entry_points else {}
    for name in extra_modules:
        _import_plugin(pm, name, provider=name)
    _check_pending(pm, installed)
    return pm


def _load_entry_points(pm: pluggy.PluginManager) -> dict[str, str]:
    """Register every plugin of the ``schedlab`` entry-point group that loads; warn about the
    others. Returns entry-point name -> "package version" for the ones registered."""
    installed = {}
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != hookspecs.NAME or pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
                continue
            package = f"{dist.metadata['Name']} {dist.version}"
            try:
                pm.load_setuptools_entrypoints(hookspecs.NAME, name=ep.name)
            except Exception as exc:
                _warn_broken(ep.name, package, ep.value, exc)
                continue
            installed[ep.name] = package
    return installed


def _warn_broken(name: str, package: str, value: str, exc: BaseException) -> None:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    warnings.warn(f"plugin {name!r} of package {package} ({name} = {value}) failed to load and is left out: "
                  f"{text}", BrokenPluginWarning, stacklevel=2)


def _check_pending(pm: pluggy.PluginManager, installed: dict[str, str]) -> None:
    """Fail on a hook implementation that matches no hookspec (a misspelt hook name); an
    installed plugin with one is left out with a warning instead."""
    while True:
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin)
            if name not in installed:
                raise ConfigError(f"plugin error: {exc}") from None
            pm.unregister(exc.plugin)
            _warn_broken(name, installed.pop(name), getattr(exc.plugin, "__name__", repr(exc.plugin)), exc)


def _provider_names(pm: pluggy.PluginManager) -> dict[int, str]:
    names = {id(plugin): pm.get_name(plugin) or repr(plugin) for plugin in pm.get_plugins()}
    for plugin, dist in pm.list_plugin_distinfo():
        names[id(plugin)] = f"{dist.project_name} {dist.version}"
    return names


@attrs.define
class Catalog:
    """Every registered name, by kind, for one run (or one experiment)."""

    registries: dict[str, Registry]
    plugin_manager: pluggy.PluginManager

    def __getitem__(self, kind: str) -> Registry:
        return self.registries[kind]

    @property
    def hook(self):
        return self.plugin_manager.hook

    def observes_iterations(self) -> bool:
        """True when some plugin implements the (slow, opt-in) per-iteration hook."""
        return bool(self.plugin_manager.hook.schedlab_iteration.get_hookimpls())


def load_catalog(extra_modules: Iterable[str] = (), *, entry_points: bool = True,
                 plugin_objects: Iterable[object] = ()) -> Catalog:
    """Build a plugin manager, then call every registration hook once per plugin.

    Each plugin's registrations are attributed to it, so a duplicate name error says which
    two plugins collide. ``plugin_objects`` are registered in-process (tests, notebooks).
    """
    pm = make_plugin_manager(extra_modules, entry_points=entry_points)
    for obj in plugin_objects:
        pm.register(obj)
    _check_pending(pm, {})
    providers = _provider_names(pm)
    registries = {kind: Registry(kind) for kind in KINDS}
    for kind, hook_name in KINDS.items():
        registry = registries[kind]
        caller = getattr(pm.hook, hook_name)
        # Call implementations one by one (assembly time only) so each registration is
        # attributed to the plugin that made it.
        for impl in reversed(caller.get_hookimpls()):
            provider = providers.get(id(impl.plugin), impl.plugin_name)
            registry.providing(provider)
            try:
                impl.function(**{name: registry for name in impl.argnames})
            except SchedlabError:
                raise
            except Exception as exc:  # the plugin's own bug: name it rather than show its traceback
                raise ConfigError(f"plugin {provider} failed in {hook_name}: {type(exc).__name__}: {exc}") from None
    return Catalog(registries, pm)
