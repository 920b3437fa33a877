"""The module names of the flat layout, still importable: ``schedlab.metrics`` is ``schedlab.results.metrics``.

Issue 18 moved what runs studies into :mod:`schedlab.study` and what turns runs into results
into :mod:`schedlab.results`. Plugins and notebooks written before import the old dotted names,
so :data:`MOVED` maps each old name to its new home and :class:`AliasFinder` (put on
``sys.meta_path`` by ``import schedlab``) answers for exactly those names with the module of the
new path: ``import schedlab.metrics`` and ``from schedlab.results_io import save`` give the very
same module objects as ``schedlab.results.metrics`` and ``schedlab.results.storage``. One module
under two names, so classes, ``isinstance`` checks, monkeypatching and pickles agree. Nothing is
imported until an old name is, and nothing warns: these are compatibility aliases.

``schedlab.results`` needs no entry: it is now the package, which re-exports
``ExperimentResults``, ``RunResult`` and ``Study`` as the old module did.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

#: old dotted name -> where the module lives now
MOVED = {
    "schedlab.experiment": "schedlab.study.experiment",
    "schedlab.overrides": "schedlab.study.overrides",
    "schedlab.search": "schedlab.study.search",
    "schedlab.simulation": "schedlab.study.simulation",
    "schedlab.sweep": "schedlab.study.sweep",
    "schedlab.compare": "schedlab.results.compare",
    "schedlab.index_page": "schedlab.results.index_page",
    "schedlab.metric_names": "schedlab.results.metric_names",
    "schedlab.metrics": "schedlab.results.metrics",
    "schedlab.results_folder": "schedlab.results.folder",
    "schedlab.results_io": "schedlab.results.storage",
    "schedlab.stability": "schedlab.results.stability",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name by importing the new one and handing back that module unchanged."""

    def __init__(self, target: str):
        self.target = target
        self.target_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.target_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system has just set ``__spec__`` to the alias's spec (it keeps the
        # module's own ``__name__``, ``__loader__`` and ``__file__``); give the module its
        # own back, so ``importlib.reload`` and tools that read ``__spec__`` see the new path.
        module.__spec__ = self.target_spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the names in :data:`MOVED` (and only those)."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put one :class:`AliasFinder` first on ``sys.meta_path`` (again: no change)."""
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
