"""A plugin's config class: a field named ``kind`` is refused at ``register()``; a config that is
not frozen, or has fields nothing checks, is said once per command as a one-line warning; and
``schedlab plugins FILE`` lists the plugin modules an experiment file names.

Installed packages are faked as a ``*.dist-info`` folder on ``sys.path``, as in
``test_plugin_loading.py``; nothing is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import attrs
import pytest

from schedlab.catalog import BrokenPluginWarning, PluginConfigWarning, load_catalog
from schedlab.cli import main
from schedlab.configs import float_field, int_field, str_field
from schedlab.errors import ConfigError
from schedlab.registry import Registry
from schedlab.study.experiment import load

import plugin_packages
from plugin_packages import REQUESTS, make_dist, modules  # noqa: F401 (modules: a fixture)

ROOT = Path(__file__).resolve().parent.parent

HEADER = """
import attrs
import schedlab
from schedlab.configs import int_field
from schedlab_plugins.schedulers import StaticScheduler, StaticConfig


def static(config):
    \"\"\"static batches of config.batch_size\"\"\"
    return StaticScheduler(StaticConfig(batch_size=config.batch_size))
"""


KIND_FIELD = """
@attrs.frozen
class KindConfig:
    kind: str = "fifo"
    batch_size: int = int_field(4, min=1)

@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("kindfield-ok", static, config=StaticConfig)   # made before the refused one: undone when left out
    register("kindfield", static, config=KindConfig)
"""

UNCHECKED = """
@attrs.define
class LooseConfig:
    batch_size: int = 4

@attrs.frozen
class PlainConfig:
    batch_size: int = 4
    label: str = "x"
    checked: int = int_field(1, min=1)

@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("loose", static, config=LooseConfig)
    register("loose-again", static, config=LooseConfig)   # the same class: said once
    register("plain", static, config=PlainConfig)
"""

HELPERS = ("use schedlab.configs' field helpers (int_field(..., min=...), float_field(..., min=...), "
           "str_field(..., choices=...), bool_field, ...) or attrs validators")
NOT_FROZEN = ("is not frozen; make it @attrs.frozen (a plugin that changes its config would carry the change "
              "from one run to the next)")


def loose_text(module: str, provider: str) -> str:
    return (f"scheduler 'loose' (plugin {provider}): config class {module}.LooseConfig {NOT_FROZEN}; it also has "
            "a field nothing checks, 'batch_size': it takes any value the TOML gives (\"many\" for a number, -5 for "
            f"a count); {HELPERS}")


def plain_text(module: str, provider: str) -> str:
    return (f"scheduler 'plain' (plugin {provider}): config class {module}.PlainConfig has fields nothing checks, "
            "'batch_size', 'label': they take any value the TOML gives (\"many\" for a number, -5 for a count); "
            f"{HELPERS}")


def write_module(folder: Path, name: str, body: str, modules: list[str]) -> None:
    plugin_packages.write_module(folder, name, HEADER + textwrap.dedent(body), modules)


def write_experiment(folder: Path, plugins: list[str], scheduler: str = "static") -> Path:
    (folder / "reqs.json").write_text(REQUESTS)
    listed = ", ".join(f'"{p}"' for p in plugins)
    path = folder / "exp.toml"
    path.write_text(f'[experiment]\nplugins = [{listed}]\nreports = ["json"]\n[workload]\nkind = "file"\n'
                    f'path = "reqs.json"\n[scheduler]\nkind = "{scheduler}"\n[[runs]]\nname = "a"\n'
                    '[[runs]]\nname = "b"\nscheduler = {batch_size = 1}\n')
    return path


def said(*args, **kwargs) -> tuple[object, list[str]]:
    """The catalog, and every BrokenPluginWarning (config warnings too) loading it said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        catalog = load_catalog(*args, **kwargs)
    return catalog, [str(w.message) for w in caught if issubclass(w.category, BrokenPluginWarning)]


def schedlab_cli(*args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "schedlab", *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=cwd)


# -- 1. a config field named kind ----------------------------------------------------------------------------

KIND_TEXT = ("scheduler 'kindfield': config {module}.KindConfig has a field named 'kind', which no table can set: "
             "'kind' is the key that picks the plugin (kind = \"kindfield\"); give the setting another name")


def test_register_refuses_a_config_with_a_field_named_kind():
    @attrs.frozen
    class KindConfig:
        kind: str = "fifo"

    registry = Registry("scheduler")
    with pytest.raises(TypeError) as caught:
        registry.register("kindfield", object, config=KindConfig)
    assert str(caught.value) == KIND_TEXT.format(module=f"{__name__}.{KindConfig.__qualname__.rsplit('.', 1)[0]}")
    assert "kindfield" not in registry


def test_a_listed_module_whose_config_has_a_kind_field_is_one_clear_error(tmp_path, modules, capsys):
    write_module(tmp_path, "kindfield_listed", KIND_FIELD, modules)
    exp = write_experiment(tmp_path, ["kindfield_listed"], scheduler="kindfield")
    with pytest.raises(ConfigError) as caught:
        load(exp)
    assert str(caught.value) == (f"{exp}: [experiment] plugins: plugin kindfield_listed failed in "
                                 "schedlab_register_schedulers: TypeError: " + KIND_TEXT.format(module="kindfield_listed"))
    assert main(["validate", str(exp)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"schedlab: error: {exp}: [experiment] plugins: plugin "
                                                   "kindfield_listed failed"), err


def test_an_installed_plugin_whose_config_has_a_kind_field_is_left_out_with_a_warning(tmp_path, monkeypatch,
                                                                                      modules):
    write_module(tmp_path, "kindfield_inst", KIND_FIELD, modules)
    make_dist(tmp_path, "schedlab-kindfield", "0.3", {"kindfield": "kindfield_inst"})
    monkeypatch.syspath_prepend(str(tmp_path))
    catalog, warned = said()
    assert "kindfield" not in catalog["scheduler"] and "kindfield-ok" not in catalog["scheduler"]
    assert warned == ["plugin 'kindfield' of package schedlab-kindfield 0.3 (kindfield = kindfield_inst) failed in "
                      "schedlab_register_schedulers and is left out: TypeError: "
                      + KIND_TEXT.format(module="kindfield_inst")]


# -- 2. configs that are not frozen, or take any value ----------------------------------------------------------


def test_a_config_that_is_not_frozen_or_has_unchecked_fields_is_warned_about_naming_them(tmp_path, modules):
    write_module(tmp_path, "unchecked_listed", UNCHECKED, modules)
    catalog, warned = said(["unchecked_listed"], plugin_dir=tmp_path)
    assert warned == [loose_text("unchecked_listed", "unchecked_listed"),
                      plain_text("unchecked_listed", "unchecked_listed")]
    assert {"loose", "loose-again", "plain"} <= set(catalog["scheduler"].names())  # loaded all the same


def test_a_registry_warns_with_a_plugin_config_warning(recwarn):
    @attrs.define
    class Loose:
        n: int = int_field(1, min=1)

    Registry("report").register("loose", object, config=Loose)
    [warning] = [w for w in recwarn if issubclass(w.category, BrokenPluginWarning)]
    assert warning.category is PluginConfigWarning
    assert str(warning.message) == f"report 'loose': config class {__name__}.{Loose.__qualname__} {NOT_FROZEN}"


def test_checked_frozen_configs_are_not_warned_about(recwarn):
    def positive(_inst, attribute, value):
        if value <= 0:
            raise ValueError(f"{attribute.name} must be > 0")

    @attrs.frozen
    class Checked:
        a: int = int_field(1, min=1)
        b: float = float_field(1.0, min=0.0)
        c: str = str_field("x", choices=("x", "y"))
        d: int = attrs.field(default=2, validator=positive)
        e: int = attrs.field(default=3, converter=int)
        f: int = attrs.field(default=4, init=False)  # (no table sets it)

    registry = Registry("scheduler")
    registry.register("checked", object, config=Checked)
    registry.register("none", object)
    assert [str(w.message) for w in recwarn if issubclass(w.category, BrokenPluginWarning)] == []


def test_a_config_that_checks_its_fields_after_init_is_not_warned_about(recwarn):
    @attrs.frozen
    class CheckedTogether:
        low: int = 1
        high: int = 2

        def __attrs_post_init__(self):
            if not 0 < self.low <= self.high:
                raise ValueError("need 0 < low <= high")

    @attrs.define
    class LooseTogether:  # (not frozen: still said)
        low: int = 1

        def __attrs_post_init__(self):
            pass

    registry = Registry("scheduler")
    registry.register("together", object, config=CheckedTogether)
    registry.register("loose-together", object, config=LooseTogether)
    assert [str(w.message) for w in recwarn if issubclass(w.category, BrokenPluginWarning)] == [
        f"scheduler 'loose-together': config class {__name__}.{LooseTogether.__qualname__} {NOT_FROZEN}"]


def test_no_built_in_plugin_is_warned_about():
    catalog, warned = said(entry_points=False)
    assert warned == []
    assert sum(1 for kind in catalog.registries.values() for entry in kind if entry.config is not None) > 20


def test_an_installed_plugin_with_unchecked_fields_is_warned_about_and_kept(tmp_path, monkeypatch, modules):
    write_module(tmp_path, "unchecked_inst", UNCHECKED, modules)
    make_dist(tmp_path, "schedlab-unchecked", "1.2", {"unchecked": "unchecked_inst"})
    monkeypatch.syspath_prepend(str(tmp_path))
    catalog, warned = said()
    assert warned == [loose_text("unchecked_inst", "schedlab-unchecked 1.2"),
                      plain_text("unchecked_inst", "schedlab-unchecked 1.2")]
    assert catalog["scheduler"].get("plain").provider == "schedlab-unchecked 1.2"


@pytest.mark.parametrize("installed", [False, True], ids=["listed", "installed"])
def test_the_warning_is_one_line_once_per_command_not_once_per_worker(tmp_path, modules, installed):
    folder = tmp_path / "exp"
    folder.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    write_module(site if installed else folder, "unchecked_cmd", UNCHECKED, modules)
    if installed:
        make_dist(site, "schedlab-unchecked", "1.2", {"unchecked": "unchecked_cmd"})
    exp = write_experiment(folder, [] if installed else ["unchecked_cmd"], scheduler="plain")
    provider = "schedlab-unchecked 1.2" if installed else "unchecked_cmd"
    expected = [f"schedlab: warning: {loose_text('unchecked_cmd', provider)}",
                f"schedlab: warning: {plain_text('unchecked_cmd', provider)}"]
    for args in (["validate", str(exp)], ["run", str(exp), "--out", str(tmp_path / "out"), "--jobs", "2"],
                 ["plugins"] if installed else ["plugins", str(exp)]):
        done = schedlab_cli(*args, cwd=tmp_path, pythonpath=site if installed else None)
        assert done.returncode == 0, done.stderr
        assert [line for line in done.stderr.splitlines() if line.startswith("schedlab: warning: ")] == expected
        assert done.stderr.count("config class") == 2 and "Warning" not in done.stderr, done.stderr  # (workers)


# -- 3. schedlab plugins FILE ---------------------------------------------------------------------------------


LISTED = """
@attrs.frozen
class WindowConfig:
    batch_size: int = int_field(8, min=1, help="requests per batch")

@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("listed-window", static, config=WindowConfig)
"""


def test_plugins_with_a_file_lists_the_modules_it_names_marking_their_provider(tmp_path, monkeypatch, capsys,
                                                                             modules):
    folder = tmp_path / "exp"
    folder.mkdir()
    write_module(folder, "listed_window", LISTED, modules)
    exp = write_experiment(folder, ["listed_window"], scheduler="listed-window")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # (the module is found in the file's folder)
    assert main(["plugins", "-v", str(exp)]) == 0
    with_file = capsys.readouterr()
    assert with_file.err == ""
    lines = with_file.out.splitlines()
    row = next(line for line in lines if line.startswith("  listed-window "))
    assert row == (f"  listed-window          static batches of config.batch_size  [listed_window ({exp}: "
                   "[experiment] plugins)]")
    assert lines[lines.index(row) + 1] == "      batch_size = 8  requests per batch"
    assert str(folder) not in sys.path
    assert main(["plugins", "-v"]) == 0
    without = capsys.readouterr().out
    assert "listed-window" not in without
    at = lines.index(row)
    assert lines[:at] + lines[at + 2:] == without.splitlines()  # (the rest as without the file)


def test_plugins_with_a_file_that_lists_nothing_prints_what_plugins_prints(tmp_path, capsys):
    exp = write_experiment(tmp_path, [])
    assert main(["plugins", str(exp)]) == 0
    with_file = capsys.readouterr().out
    assert main(["plugins"]) == 0
    assert with_file == capsys.readouterr().out


@pytest.mark.parametrize("text, message", [
    (None, "{exp}: no such experiment file"),
    ("experiment = 5\n", "{exp}: experiment must be one table ([experiment]), got 5"),
    ('[experiment]\nplugins = "x"\n', "{exp}: [experiment]: plugins: "),
    ('[experiment]\nplugins = ["nowhere_xyz_mod"]\n',
     "{exp}: [experiment] plugins: cannot import plugin module 'nowhere_xyz_mod': no module named "
     "'nowhere_xyz_mod' in {folder} (the experiment file's folder) or on Python's path (sys.path)"),
])
def test_plugins_with_a_bad_file_is_one_line_error(tmp_path, capsys, text, message):
    exp = tmp_path / "exp.toml"
    if text is not None:
        exp.write_text(text)
    assert main(["plugins", "-v", str(exp)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("schedlab: error: " + message.format(exp=exp, folder=tmp_path)), captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_plugins_with_a_file_that_names_a_clashing_module_is_an_error(tmp_path, capsys, modules):
    write_module(tmp_path, "clash_for_plugins", """
        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("static", static, config=StaticConfig)
        """, modules)
    exp = write_experiment(tmp_path, ["clash_for_plugins"])
    assert main(["plugins", str(exp)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {exp}: [experiment] plugins: scheduler 'static' is "
                                       "registered twice: by schedlab_plugins.schedulers (built-in) and by "
                                       "clash_for_plugins\n")


def test_a_path_fields_default_is_read_beside_the_experiment_as_a_written_one_is(tmp_path):
    """A plugin's ``path_field("costs.json")`` default was left relative to the working folder, so
    the run found the file only when started from the experiment's folder."""
    from schedlab.configs import from_table, path_field

    @attrs.frozen
    class Costs:
        path: str = path_field("costs.json", help="the costs")
        other: str | None = path_field(None, optional=True)

    assert from_table(Costs, {}, where="t", base_dir=tmp_path) == Costs(path=str(tmp_path / "costs.json"))
    assert from_table(Costs, {"path": "b.json"}, where="t", base_dir=tmp_path).path == str(tmp_path / "b.json")
    assert from_table(Costs, {}, where="t").path == "costs.json"   # (no experiment file: as given)
