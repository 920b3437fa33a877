"""The package layout (issue 18): no import cycle between schedlab modules, the old flat
module names still import as the very same modules, and every package is installed."""

from __future__ import annotations

import ast
import importlib
import io
import pickle
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import schedlab
from schedlab.aliases import MOVED

SCHEDLAB = Path(schedlab.__file__).resolve().parent
ROOT = SCHEDLAB.parent


# -- the import graph -------------------------------------------------------------------------

def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``package_dir``."""
    modules = {}
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_time_imports(tree: ast.Module):
    """The import statements that run when the module is imported: everything outside
    function bodies and ``if TYPE_CHECKING:`` blocks (class bodies and try/if blocks count)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports at import time.

    ``from a.b import c`` depends on ``a.b.c`` when that is a module, else on ``a.b``; either
    way also on the packages above the target that are not above the importer (importing
    ``a.b.c`` runs ``a/b/__init__.py`` first; a package the importer lives in is already
    being imported)."""
    modules = module_files(package_dir)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in import_time_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                parts = own_package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        edges = set()
        for target in targets:
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                prefix = ".".join(parts[:depth])
                above_importer = name == prefix or name.startswith(prefix + ".")
                if prefix in modules and not (above_importer and prefix != target):
                    edges.add(prefix)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None if it is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_schedlab_imports_form_no_cycle():
    graph = import_graph(SCHEDLAB)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # the two floors depend on the contracts, never the other way round
    top = {m for m in graph if m.count(".") == 1 and not m.startswith(("schedlab.study", "schedlab.results"))}
    contracts = {"schedlab.model", "schedlab.protocols", "schedlab.hookspecs", "schedlab.registry",
                 "schedlab.catalog", "schedlab.configs", "schedlab.errors"}
    assert contracts <= top
    for module in contracts:
        assert not {t for t in graph[module] if t.startswith(("schedlab.study", "schedlab.results"))}, module


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_the_cycle_check_finds_a_cycle_and_ignores_lazy_and_type_only_imports(tmp_path):
    pkg = _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n"
                        "def f():\n    from .. import a\n",
        "pkg/c.py": "class C:\n    from . import d\n",
        "pkg/d.py": "try:\n    from .c import C\nexcept ImportError:\n    pass\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.sub.b"] == set()              # lazy and TYPE_CHECKING imports do not count
    assert find_cycle(graph) == ["pkg.c", "pkg.d", "pkg.c"]   # class bodies and try blocks do


def test_a_package_init_that_imports_back_is_a_cycle(tmp_path):
    pkg = _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/user.py": "from .floor.leaf import x\n",
        "pkg/floor/__init__.py": "from ..user import y\n",
        "pkg/floor/leaf.py": "from ..errors import E\n",
        "pkg/errors.py": "",
    })
    graph = import_graph(pkg)
    assert graph["pkg.user"] == {"pkg.floor", "pkg.floor.leaf"}
    assert graph["pkg.floor.leaf"] == {"pkg.errors"}   # its own packages are not dependencies
    assert find_cycle(graph) == ["pkg.floor", "pkg.user", "pkg.floor"]


# -- the old names -----------------------------------------------------------------------------

OLD_NAMES = ["schedlab.experiment", "schedlab.results_io", "schedlab.metrics", "schedlab.simulation",
             "schedlab.search", "schedlab.sweep", "schedlab.overrides", "schedlab.compare",
             "schedlab.stability", "schedlab.metric_names", "schedlab.results_folder", "schedlab.index_page"]


def test_the_table_covers_every_old_name_and_leaves_no_file_at_the_top():
    assert sorted(MOVED) == sorted(OLD_NAMES)
    for old, new in MOVED.items():
        assert not (SCHEDLAB / f"{old.split('.')[-1]}.py").exists(), old
        assert new.startswith(("schedlab.study.", "schedlab.results.")), new
        assert (ROOT / (new.replace(".", "/") + ".py")).is_file(), new
    assert not (SCHEDLAB / "results.py").exists() and (SCHEDLAB / "results" / "__init__.py").is_file()


@pytest.mark.parametrize("old", OLD_NAMES)
def test_an_old_name_imports_as_the_new_module(old):
    new_module = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new_module
    assert sys.modules[old] is new_module
    namespace: dict = {}
    exec(f"import {old} as via_import", namespace)
    assert namespace["via_import"] is new_module
    # the module keeps its own identity under both names
    assert new_module.__name__ == MOVED[old] and new_module.__spec__.name == MOVED[old]


@pytest.mark.parametrize("statement, new, names", [
    ("from schedlab.results_io import save, load, atomic_write", "schedlab.results.storage",
     ["save", "load", "atomic_write"]),
    ("from schedlab.experiment import load, run_experiment, point_spec, StudySpec", "schedlab.study.spec",
     ["point_spec", "StudySpec"]),
    ("from schedlab.experiment import load, run_experiment", "schedlab.study.experiment", ["load", "run_experiment"]),
    ("from schedlab.metrics import compute_metrics, metric_at", "schedlab.results.metrics",
     ["compute_metrics", "metric_at"]),
    ("from schedlab.simulation import RunSpec, Context, run", "schedlab.study.simulation",
     ["RunSpec", "Context", "run"]),
    ("from schedlab.search import parse_constraint, search", "schedlab.study.search", ["parse_constraint", "search"]),
    ("from schedlab.sweep import expand_grid", "schedlab.study.sweep", ["expand_grid"]),
    ("from schedlab.overrides import set_dotted", "schedlab.study.overrides", ["set_dotted"]),
    ("from schedlab.stability import queue_stability", "schedlab.results.stability", ["queue_stability"]),
    ("from schedlab.compare import vs_measured", "schedlab.results.compare", ["vs_measured"]),
    ("from schedlab.metric_names import check_metric_name", "schedlab.results.metric_names", ["check_metric_name"]),
    ("from schedlab.results_folder import StagedFolder", "schedlab.results.folder", ["StagedFolder"]),
    ("from schedlab.index_page import render, write", "schedlab.results.index_page", ["render", "write"]),
    ("from schedlab.results import ExperimentResults, RunResult, Study", "schedlab.results.records",
     ["ExperimentResults", "RunResult", "Study"]),
])
def test_from_an_old_name_import_names(statement, new, names):
    namespace: dict = {}
    exec(statement, namespace)
    module = importlib.import_module(new)
    for name in names:
        assert namespace[name] is getattr(module, name), name


def test_importing_schedlab_imports_no_moved_module_and_old_names_do_not_warn():
    code = ("import sys, schedlab\n"
            "print(sorted(m for m in sys.modules if m.startswith('schedlab')))\n"
            f"for old in {OLD_NAMES!r}:\n"
            "    __import__(old)\n"
            "from schedlab.results_io import save\n")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded = eval(done.stdout)
    assert "schedlab.aliases" in loaded
    assert not [m for m in loaded if m.startswith(("schedlab.study", "schedlab.results"))], loaded


@pytest.mark.parametrize("old, new, name", [
    ("schedlab.simulation", "schedlab.study.simulation", "RunSpec"),
    ("schedlab.experiment", "schedlab.study.spec", "StudySpec"),
    ("schedlab.results", "schedlab.results.records", "RunResult"),
    ("schedlab.results", "schedlab.results.records", "ExperimentResults"),
])
def test_a_pickle_naming_the_old_module_loads_the_class_at_its_new_path(old, new, name):
    cls = getattr(importlib.import_module(new), name)
    data = pickle.dumps(cls, protocol=0)
    assert f"c{new}\n{name}\n".encode() in data
    assert pickle.loads(data.replace(new.encode(), old.encode(), 1)) is cls
    assert pickle.Unpickler(io.BytesIO()).find_class(old, name) is cls


def test_pyproject_lists_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {m for m, path in module_files(SCHEDLAB).items() if path.name == "__init__.py"}
    assert on_disk <= set(config["packages"])
    assert "schedlab.results" in on_disk and "schedlab.study" in on_disk
