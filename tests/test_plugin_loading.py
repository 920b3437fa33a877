"""Loading plugins: installed packages (entry points) whose registration fails, two packages
with one entry-point name, hooks with a misnamed parameter or a return value, a ``plugins``
module beside the experiment file, case in did-you-mean.

Installed packages are faked as a ``*.dist-info`` folder (``METADATA`` and ``entry_points.txt``)
in a folder put on ``sys.path``, where ``importlib.metadata`` finds them -- nothing is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from schedlab.catalog import BrokenPluginWarning, load_catalog
from schedlab.cli import main
from schedlab.errors import ConfigError, DuplicateNameError, UnknownPluginError
from schedlab.registry import Registry
from schedlab.study.experiment import load

import plugin_packages
from plugin_packages import REQUESTS, make_dist, modules  # noqa: F401 (modules: a fixture)

HEADER = """
import attrs
import schedlab
from schedlab_plugins.schedulers import StaticScheduler, StaticConfig
"""


def write_module(folder: Path, name: str, body: str, modules: list[str]) -> None:
    plugin_packages.write_module(folder, name, HEADER + textwrap.dedent(body), modules)


def installed_catalog(folder: Path, monkeypatch, *dists: tuple[str, str, dict]):
    """The catalog (and its warnings) with ``dists`` -- ``(package, version, entry points)`` -- faked
    as installed in ``folder`` (its modules written there already), put on ``sys.path``."""
    for package, version, entry_points in dists:
        make_dist(folder, package, version, entry_points)
    monkeypatch.syspath_prepend(str(folder))
    return catalog_and_warnings()


def catalog_and_warnings(*args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        catalog = load_catalog(*args, **kwargs)
    return catalog, [str(w.message) for w in caught if issubclass(w.category, BrokenPluginWarning)]


# -- 1. an installed plugin whose registration fails is left out --------------------------------------


CLASH = """
@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("vllmclash-extra", StaticScheduler, config=StaticConfig)   # made before the clash: undone
    register("vllm", StaticScheduler, config=StaticConfig)

@schedlab.hookimpl
def schedlab_run_started(run_name, settings):
    raise AssertionError("a plugin left out is not called")
"""

NOT_ATTRS = """
@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("notattrs-sched", StaticScheduler, config=StaticConfig)   # another kind's: undone too

@schedlab.hookimpl
def schedlab_register_reports(register):
    register("notattrs-report", object, config=dict)   # not an attrs class: TypeError
"""


@pytest.fixture
def failing_install(tmp_path, monkeypatch, modules):
    """Two installed packages whose registration hooks raise: one registers the scheduler name
    ``vllm`` a built-in has, one a config that is not an attrs class; a third is fine."""
    site = tmp_path / "site"
    site.mkdir()
    write_module(site, "vllmclash_mod", CLASH, modules)
    write_module(site, "notattrs_mod", NOT_ATTRS, modules)
    write_module(site, "fine_mod", """
        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("fine-sched", StaticScheduler, config=StaticConfig)
        """, modules)
    make_dist(site, "schedlab-vllmclash", "0.0.1", {"vllmclash": "vllmclash_mod"})
    make_dist(site, "schedlab-notattrs", "0.2", {"notattrs": "notattrs_mod"})
    make_dist(site, "schedlab-fine", "1.0", {"fine": "fine_mod"})
    monkeypatch.syspath_prepend(str(site))
    return site


def test_an_installed_plugin_whose_registration_fails_is_left_out_whole(failing_install, tmp_path):
    catalog, said = catalog_and_warnings()
    schedulers = catalog["scheduler"]
    assert schedulers.get("vllm").provider == "schedlab_plugins.schedulers (built-in)"  # a built-in wins
    assert "vllmclash-extra" not in schedulers and "notattrs-sched" not in schedulers
    assert "notattrs-report" not in catalog["report"]
    assert schedulers.get("fine-sched").provider == "schedlab-fine 1.0"
    assert len(said) == 2, said
    assert any(w.startswith("plugin 'vllmclash' of package schedlab-vllmclash 0.0.1 (vllmclash = vllmclash_mod) "
                            "failed in schedlab_register_schedulers and is left out: DuplicateNameError: "
                            "scheduler 'vllm' is registered twice: by schedlab_plugins.schedulers (built-in) "
                            "and by schedlab-vllmclash 0.0.1") for w in said), said
    assert any(w.startswith("plugin 'notattrs' of package schedlab-notattrs 0.2 (notattrs = notattrs_mod) "
                            "failed in schedlab_register_reports and is left out: TypeError: report "
                            "'notattrs-report': config must be an attrs class") for w in said), said
    # a name it would have made is unknown, and the error says which plugins were left out (a review:
    # the name of a plugin left out for another name's clash was missing without a word)
    with pytest.raises(UnknownPluginError) as err:
        schedulers.get("vllmclash-later")
    assert str(err.value).endswith("; left out while loading, so their names are missing too (see the warning): "
                                   "plugin 'vllmclash' of package schedlab-vllmclash 0.0.1, plugin 'notattrs' of "
                                   "package schedlab-notattrs 0.2")
    assert catalog["report"].left_out == ["plugin 'notattrs' of package schedlab-notattrs 0.2"]
    assert catalog["cost_model"].left_out == []
    # left out of the plugin manager too: its other hooks are never called
    assert not any(getattr(p, "__name__", "") == "vllmclash_mod" for p in catalog.plugin_manager.get_plugins())
    catalog.hook.schedlab_run_started(run_name="x", settings={})
    # and a run goes on
    (tmp_path / "reqs.json").write_text(REQUESTS)
    (tmp_path / "exp.toml").write_text('[workload]\nkind = "file"\npath = "reqs.json"\n'
                                       '[scheduler]\nkind = "fine-sched"\n')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BrokenPluginWarning)
        from schedlab.study.experiment import run_experiment

        assert run_experiment(load(tmp_path / "exp.toml")).all_runs()[0].metrics["finished"] == 2


def test_a_name_an_installed_plugin_that_failed_to_load_may_have_had_says_so(tmp_path, monkeypatch, modules):
    """An entry point whose module is not there (the README's own warned-about mistake, a
    forgotten ``py-modules``): its names are unknown, of whatever kind, and the error said nothing
    of it (review s81 plugin, finding 5)."""
    site = tmp_path / "site"
    site.mkdir()
    catalog, said = installed_catalog(site, monkeypatch, ("shortest-prompt", "0.1",
                                                          {"shortest": "shortest_prompt_missing_xyz"}))
    assert len(said) == 1 and "failed to load and is left out: ModuleNotFoundError" in said[0], said
    for kind in ("scheduler", "cost_model", "kv_cache"):
        with pytest.raises(UnknownPluginError) as err:
            catalog[kind].get("shortest-prompt")
        assert str(err.value).endswith("; left out while loading, so their names are missing too (see the "
                                       "warning): plugin 'shortest' of package shortest-prompt 0.1"), err.value


def test_a_name_two_installed_packages_claim_names_neither(tmp_path, monkeypatch, modules):
    """Which of two installed packages registers first depends on how their metadata is found:
    the second was left out and the first ran under the name, whichever it was (review s81
    plugin, finding 6). The name is refused now, naming both; the first's other names stay."""
    site = tmp_path / "site"
    site.mkdir()
    write_module(site, "first_claim_mod", """
        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("first-only", StaticScheduler, config=StaticConfig)
            register("claimed", StaticScheduler, config=StaticConfig)
        """, modules)
    write_module(site, "second_claim_mod", """
        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("claimed", StaticScheduler, config=StaticConfig)
        """, modules)
    catalog, said = installed_catalog(site, monkeypatch, ("claim-one", "1.0", {"one": "first_claim_mod"}),
                                      ("claim-two", "2.0", {"two": "second_claim_mod"}))
    schedulers = catalog["scheduler"]
    assert len(said) == 1 and "DuplicateNameError: scheduler 'claimed' is registered twice" in said[0], said
    assert "claimed" not in schedulers
    with pytest.raises(UnknownPluginError) as err:
        schedulers.get("claimed")
    text = str(err.value)
    assert text.startswith("scheduler 'claimed' is registered by two installed plugins (") and \
        "claim-one 1.0" in text and "claim-two 2.0" in text and text.endswith("uninstall one of them, or list the "
                                                                             "one you mean in [experiment] plugins")
    # the one left out (said in the warning) loses all its names; the other keeps its others
    assert ("first-only" in schedulers) == said[0].startswith("plugin 'two' of package claim-two 2.0"), said


def test_every_command_still_runs_beside_an_installed_plugin_that_fails_to_register(failing_install, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(failing_install) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    quickstart = Path(__file__).resolve().parent.parent / "experiments" / "quickstart.toml"
    (tmp_path / "reqs.json").write_text(REQUESTS)
    (tmp_path / "two.toml").write_text('[experiment]\nreports = ["json"]\n[workload]\nkind = "file"\n'
                                       'path = "reqs.json"\n[[runs]]\nname = "a"\n[[runs]]\nname = "b"\n')
    for args in (["plugins"], ["validate", str(quickstart)],
                 ["run", str(tmp_path / "two.toml"), "--out", str(tmp_path / "out"), "--jobs", "2"]):
        done = subprocess.run([sys.executable, "-m", "schedlab", *args], capture_output=True, text=True,
                              env=env, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        said = [line for line in done.stderr.splitlines() if line.startswith("schedlab: warning: ")]
        assert len(said) == 2, done.stderr
        assert any("plugin 'vllmclash' of package schedlab-vllmclash 0.0.1" in w and "registered twice" in w
                   for w in said), said
        assert "BrokenPluginWarning" not in done.stderr, done.stderr  # (workers do not say it again)
        if args == ["plugins"]:
            assert "fine-sched" in done.stdout and "vllmclash-extra" not in done.stdout


def test_a_listed_plugin_module_that_clashes_is_still_an_error(tmp_path, modules):
    write_module(tmp_path, "clash_listed", CLASH, modules)
    (tmp_path / "exp.toml").write_text('[experiment]\nplugins = ["clash_listed"]\n'
                                       '[workload]\nkind = "file"\npath = "x.json"\n')
    with pytest.raises(DuplicateNameError, match="scheduler 'vllm' is registered twice: by "
                                                 r"schedlab_plugins.schedulers \(built-in\) and by clash_listed"):
        load(tmp_path / "exp.toml")


def test_an_installed_plugin_also_listed_in_plugins_fails_as_an_error(failing_install, tmp_path):
    (tmp_path / "exp.toml").write_text('[experiment]\nplugins = ["notattrs_mod"]\n'
                                       '[workload]\nkind = "file"\npath = "x.json"\n')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BrokenPluginWarning)
        with pytest.raises(ConfigError, match="plugin schedlab-notattrs 0.2 failed in schedlab_register_reports: "
                                              "TypeError"):
            load(tmp_path / "exp.toml")


# -- 2. two packages, one entry-point name ------------------------------------------------------------


def test_two_packages_with_the_same_entry_point_name_are_both_loaded(tmp_path, monkeypatch, modules):
    for package in ("one", "two"):
        write_module(tmp_path, f"edf_{package}", f"""
            @schedlab.hookimpl
            def schedlab_register_schedulers(register):
                register("edf-{package}", StaticScheduler, config=StaticConfig)
            """, modules)
    catalog, said = installed_catalog(tmp_path, monkeypatch, *((f"edf-{package}", "1.0", {"edf": f"edf_{package}"})
                                                               for package in ("one", "two")))
    assert said == []
    assert catalog["scheduler"].get("edf-one").provider == "edf-one 1.0"
    assert catalog["scheduler"].get("edf-two").provider == "edf-two 1.0"


def test_one_package_found_twice_is_loaded_once_without_a_warning(tmp_path, monkeypatch, modules):
    """The same distribution's metadata twice on sys.path (an old copy, a path listed twice)."""
    write_module(tmp_path, "twice_mod", """
        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("twice", StaticScheduler, config=StaticConfig)
        """, modules)
    for folder in (tmp_path / "a", tmp_path / "b"):
        make_dist(folder, "twice-pkg", "1.0", {"twice": "twice_mod"})
        monkeypatch.syspath_prepend(str(folder))
    monkeypatch.syspath_prepend(str(tmp_path))
    catalog, said = catalog_and_warnings()
    assert said == []
    assert catalog["scheduler"].get("twice").provider == "twice-pkg 1.0"


def test_two_packages_naming_one_module_are_named_in_a_warning(tmp_path, monkeypatch, modules):
    write_module(tmp_path, "shared_mod", """
        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("shared", StaticScheduler, config=StaticConfig)
        """, modules)
    catalog, said = installed_catalog(tmp_path, monkeypatch, ("shared-a", "1.0", {"edf": "shared_mod"}),
                                      ("shared-b", "2.0", {"edf": "shared_mod"}))
    assert "shared" in catalog["scheduler"]
    assert len(said) == 1 and "package shared-a 1.0" in said[0] and "package shared-b 2.0" in said[0], said


# -- 3. a hook with a misnamed parameter --------------------------------------------------------------

MISNAMED = """
@schedlab.hookimpl
def schedlab_register_schedulers(registry):
    registry.register("misnamed", StaticScheduler, config=StaticConfig)
"""
MISNAMED_TEXT = ("hook schedlab_register_schedulers has a parameter named 'registry', which the hook does not pass; "
                 "its parameter is named 'register' (def schedlab_register_schedulers(register))")


def test_a_listed_module_whose_hook_has_a_misnamed_parameter_is_one_clear_error(tmp_path, modules):
    write_module(tmp_path, "misnamed_param", MISNAMED, modules)
    (tmp_path / "exp.toml").write_text('[experiment]\nplugins = ["misnamed_param"]\n'
                                       '[workload]\nkind = "file"\npath = "x.json"\n')
    with pytest.raises(ConfigError) as caught:
        load(tmp_path / "exp.toml")
    assert str(caught.value) == f"{tmp_path / 'exp.toml'}: [experiment] plugins: plugin module 'misnamed_param': " \
                                f"{MISNAMED_TEXT}"


def test_an_installed_plugin_whose_hook_has_a_misnamed_parameter_is_left_out_saying_so(tmp_path, monkeypatch,
                                                                                        modules):
    write_module(tmp_path, "misnamed_inst", MISNAMED, modules)
    catalog, said = installed_catalog(tmp_path, monkeypatch, ("misnamed-pkg", "0.1", {"misnamed": "misnamed_inst"}))
    assert "misnamed" not in catalog["scheduler"]
    assert said == ["plugin 'misnamed' of package misnamed-pkg 0.1 (misnamed = misnamed_inst) failed to load and "
                    f"is left out: {MISNAMED_TEXT}"]


# -- 4. a plugins module beside the experiment file ---------------------------------------------------


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_plugin_module_beside_the_experiment_is_found_from_another_folder(tmp_path, monkeypatch, capsys,
                                                                            modules, jobs):
    folder = tmp_path / "exp"
    folder.mkdir()
    write_module(folder, "edf_copy", """
        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("edf-copy", StaticScheduler, config=StaticConfig)
        """, modules)
    (folder / "reqs.json").write_text(REQUESTS)
    (folder / "exp.toml").write_text(textwrap.dedent("""
        [experiment]
        plugins = ["edf_copy"]
        reports = ["json"]
        [workload]
        kind = "file"
        path = "reqs.json"
        [scheduler]
        kind = "edf-copy"
        [[runs]]
        name = "a"
        [[runs]]
        name = "b"
        scheduler = {batch_size = 1}
        """))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code = main(["run", str(folder / "exp.toml"), "--out", str(tmp_path / "out"), "--jobs", jobs])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (tmp_path / "out" / "summary.json").exists()
    assert str(folder) not in sys.path


def test_a_plugin_module_found_nowhere_names_the_file_and_where_it_looked(tmp_path, monkeypatch, capsys):
    (tmp_path / "exp.toml").write_text('[experiment]\nplugins = ["nowhere_mod_xyz"]\n'
                                       '[workload]\nkind = "file"\npath = "x.json"\n')
    monkeypatch.chdir(tmp_path)
    code = main(["validate", "exp.toml"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == ("schedlab: error: exp.toml: [experiment] plugins: cannot import plugin module "
                           f"'nowhere_mod_xyz': no module named 'nowhere_mod_xyz' in {tmp_path} (the experiment "
                           "file's folder) or on Python's path (sys.path)")


def test_a_missing_dependency_of_a_plugin_module_is_not_blamed_on_the_folder(tmp_path, modules):
    write_module(tmp_path, "needs_dep", "import no_such_dependency_xyz\n", modules)
    (tmp_path / "exp.toml").write_text('[experiment]\nplugins = ["needs_dep"]\n'
                                       '[workload]\nkind = "file"\npath = "x.json"\n')
    with pytest.raises(ConfigError, match=r"exp.toml: \[experiment\] plugins: cannot import plugin module 'needs_dep': "
                                          r"No module named 'no_such_dependency_xyz' \(needs_dep\.py:\d+\)$"):
        load(tmp_path / "exp.toml")


# -- 5. did-you-mean ignores case --------------------------------------------------------------------------


def test_did_you_mean_ignores_case_but_names_do_not():
    reg = Registry("scheduler")
    reg.providing("p")("edf", object)
    reg("Fifo", object)
    with pytest.raises(UnknownPluginError, match=r"unknown scheduler 'EDF' \(did you mean 'edf'\?\)"):
        reg.get("EDF")
    with pytest.raises(UnknownPluginError, match=r"unknown scheduler 'fifo' \(did you mean 'Fifo'\?\)"):
        reg.get("fifo")
    with pytest.raises(UnknownPluginError, match=r"unknown scheduler 'VLLM' \(did you mean 'vllm'\?\)"):
        load_catalog(entry_points=False)["scheduler"].get("VLLM")


# -- 6. a hook that returns what it should have registered -------------------------------------------------

RETURNS = """
@schedlab.hookimpl
def schedlab_register_schedulers(register):
    return {"x": StaticScheduler}
"""
RETURNED = ("hooks register by calling registry.register(name, factory, config=...); the return value is ignored")


def test_a_listed_module_whose_hook_returns_a_value_is_an_error(tmp_path, modules):
    write_module(tmp_path, "returns_dict", RETURNS, modules)
    (tmp_path / "exp.toml").write_text('[experiment]\nplugins = ["returns_dict"]\n'
                                       '[workload]\nkind = "file"\npath = "x.json"\n')
    with pytest.raises(ConfigError) as caught:
        load(tmp_path / "exp.toml")
    text = str(caught.value)
    assert text.startswith(f"{tmp_path / 'exp.toml'}: [experiment] plugins: plugin module 'returns_dict': "
                           "schedlab_register_schedulers returned a dict ({'x': ")
    assert text.endswith(f"); {RETURNED}")


def test_an_installed_plugin_whose_hook_returns_a_value_is_warned_about(tmp_path, monkeypatch, modules):
    write_module(tmp_path, "returns_inst", RETURNS, modules)
    _, said = installed_catalog(tmp_path, monkeypatch, ("returns-pkg", "0.1", {"returns": "returns_inst"}))
    assert len(said) == 1 and said[0].startswith("plugin 'returns' of package returns-pkg 0.1 (returns = "
                                                 "returns_inst): schedlab_register_schedulers of module "
                                                 "'returns_inst' returned a dict ("), said
    assert said[0].endswith(RETURNED)


def test_loading_plugins_reads_the_metadata_of_schedlab_plugins_only(monkeypatch):
    """Every run and every worker task loads a catalog: parsing the METADATA of each of the
    machine's packages (hundreds) made that 60 ms instead of 3. Only a package with an entry
    point in the ``schedlab`` group has its name and version read."""
    import importlib.metadata

    class Untouchable:
        entry_points = [importlib.metadata.EntryPoint("x", "x:y", "console_scripts")]

        @property
        def metadata(self):
            raise AssertionError("the metadata of a package with no schedlab plugin was read")

        version = metadata

    monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter([Untouchable()] * 50))
    catalog = load_catalog(())
    assert "vllm" in catalog.registries["scheduler"]


TWIN = """
@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("twin-{n}", StaticScheduler, config=StaticConfig)
"""


def test_a_folders_module_that_python_did_not_import_is_named_not_ignored(tmp_path, modules):
    """Python keeps the first module of a name: a plugin file named like a standard-library module
    (json.py) was silently replaced by that module ('implements no schedlab hook'). Now it is
    named; another experiment folder's module of the name is dropped first, so each folder gets
    its own (it was refused, and before that silently the first one's)."""
    first, second, copy = tmp_path / "first", tmp_path / "second", tmp_path / "copy"
    for folder in (first, second, copy):
        folder.mkdir()
    write_module(first, "twin_mod", TWIN.format(n=1), modules)
    write_module(second, "twin_mod", TWIN.format(n=2), modules)
    write_module(copy, "twin_mod", TWIN.format(n=1), modules)
    for folder, name in ((first, "twin-1"), (second, "twin-2"), (first, "twin-1"), (copy, "twin-1")):
        names = load_catalog(["twin_mod"], plugin_dir=folder)["scheduler"].names()
        assert name in names and {"twin-1", "twin-2"} - {name} - set(names), (folder, names)
    write_module(first, "json", TWIN.format(n=3), modules[:0])   # (json stays imported: it is the standard library's)
    with pytest.raises(ConfigError, match=r"plugin module 'json': .*json\.py is not the module Python uses for that "
                                          r"name: .*json[/\\]__init__\.py was imported first"):
        load_catalog(["json"], plugin_dir=first)


def test_each_experiment_folder_gets_its_own_packages_helpers_and_path_modules(tmp_path, modules, monkeypatch):
    """Found running experiments one after another in one process (``--jobs 1``, the API, a
    notebook): the second ran the first one's scheduler, when its folder held a package of the
    same name with another submodule, when its plugin imported a helper of the same name as the
    first's, or when it named a module on Python's path that the first's folder also held."""
    a, b, site = tmp_path / "a", tmp_path / "b", tmp_path / "site"
    for folder, n in ((a, 1), (b, 2), (site, 3)):
        (folder / "pack").mkdir(parents=True)
        (folder / "pack" / "__init__.py").write_text("")
        (folder / "pack" / "sched.py").write_text(HEADER + textwrap.dedent(TWIN.format(n=n)))
        (folder / "helper_value.py").write_text(f"N = {n}\n")
        (folder / "uses_helper.py").write_text(HEADER + textwrap.dedent(
            "from helper_value import N\n\n@schedlab.hookimpl\ndef schedlab_register_schedulers(register):\n"
            "    register(f'helped-{N}', StaticScheduler, config=StaticConfig)\n"))
    modules += ["pack", "pack.sched", "helper_value", "uses_helper"]
    for folder, n in ((a, 1), (b, 2), (a, 1)):
        assert f"twin-{n}" in load_catalog(["pack.sched"], plugin_dir=folder)["scheduler"].names()
        assert f"helped-{n}" in load_catalog(["uses_helper"], plugin_dir=folder)["scheduler"].names()
    (b / "pack" / "sched.py").unlink()
    (b / "pack" / "__init__.py").unlink()
    (b / "pack").rmdir()
    monkeypatch.syspath_prepend(str(site))
    load_catalog(["pack.sched"], plugin_dir=a)
    assert "twin-3" in load_catalog(["pack.sched"], plugin_dir=b)["scheduler"].names()  # not a's
