"""Plugin registration: hooks, the registry, throwaway plugins, documentation of every hook."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pathlib
import sys
import textwrap
import tomllib

import attrs
import pluggy
import pytest

import schedlab
from schedlab import catalog as catalog_module
from schedlab import hookspecs
from schedlab.catalog import KINDS, load_catalog, make_plugin_manager
from schedlab.configs import int_field
from schedlab.errors import ConfigError, DuplicateNameError, SchedlabError, UnknownPluginError
from schedlab.registry import Registry
from schedlab.study.experiment import load, run_experiment


def test_every_hook_is_documented():
    """Each hookspec has a summary and a :param: line per argument (datasette's rule)."""
    specs = [(name, fn) for name, fn in vars(hookspecs).items()
             if name.startswith("schedlab_") and callable(fn)]
    assert len(specs) >= 11
    for name, fn in specs:
        doc = inspect.getdoc(fn) or ""
        assert doc.split("\n")[0].strip(), f"{name} has no summary line"
        for param in inspect.signature(fn).parameters:
            assert f":param {param}:" in doc, f"{name} does not document {param}"


def test_one_name_for_project_group_and_prefix():
    assert schedlab.NAME == "schedlab"
    assert all(name.startswith("schedlab_") for name in KINDS.values())


def test_builtins_register_through_the_same_hooks():
    catalog = load_catalog(entry_points=False)
    for kind in ("scheduler", "cost_model", "kv_cache", "workload", "report"):
        assert len(catalog[kind]) > 0, kind
    entry = catalog["scheduler"].get("continuous")
    assert "(built-in)" in entry.provider and entry.provider.startswith("schedlab_plugins.schedulers")
    registered = {catalog.plugin_manager.get_name(p) for p in catalog.plugin_manager.get_plugins()}
    assert registered == {f"{module} (built-in)" for module in PYPROJECT_BUILTINS.values()}


#: pyproject.toml's ``[project.entry-points.schedlab]``: the built-ins, published as a third-party
#: package publishes its plugins
PYPROJECT_BUILTINS = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())[
    "project"]["entry-points"]["schedlab"]


def test_every_plugins_module_with_a_hook_is_an_entry_point_of_schedlabs_package():
    hooked = set()
    for path in sorted((pathlib.Path(__file__).parents[1] / "plugins").glob("*")):
        name = path.stem if path.suffix == ".py" else path.name
        if name.startswith("_") or not (path.suffix == ".py" or (path / "__init__.py").is_file()):
            continue
        module = importlib.import_module(f"schedlab_plugins.{name}")
        if any(callable(getattr(module, hook, None)) for hook in KINDS.values()):
            hooked.add(module.__name__)
    assert hooked == set(PYPROJECT_BUILTINS.values())
    # what the installed package's metadata says is what pyproject.toml says (a stale install would not)
    assert {ep.name: ep.value for ep in catalog_module.builtin_entry_points()} == PYPROJECT_BUILTINS


def test_without_schedlabs_package_metadata_the_error_says_to_install_it(monkeypatch):
    def not_found(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(catalog_module.importlib.metadata, "distribution", not_found)
    with pytest.raises(SchedlabError, match=r"registered through the 'schedlab' entry-point group of its installed "
                                            r"package, and no schedlab package is installed .*pip install -e \."):
        load_catalog(entry_points=False)


def test_fresh_plugin_manager_each_time():
    assert make_plugin_manager(entry_points=False) is not make_plugin_manager(entry_points=False)


def test_registry_rejects_duplicates_and_lists_known_names():
    reg = Registry("scheduler")
    reg.providing("one")("fifo", object)
    with pytest.raises(DuplicateNameError, match="'fifo' is registered twice: by one and by two"):
        reg.providing("two")("fifo", object)
    with pytest.raises(UnknownPluginError, match=r"unknown scheduler 'fifi' \(did you mean 'fifo'\?\); registered: fifo"):
        reg.get("fifi")


def test_duplicate_names_across_plugins_fail_loudly():
    class Clash:
        @schedlab.hookimpl
        def schedlab_register_schedulers(self, register):
            register("static", object)

    with pytest.raises(DuplicateNameError, match="'static' is registered twice"):
        load_catalog(entry_points=False, plugin_objects=[Clash()])


def test_misspelt_hook_fails_loudly():
    class Typo:
        @schedlab.hookimpl
        def schedlab_register_scheduler(self, register):  # missing the final s
            pass

    with pytest.raises(ConfigError, match="schedlab_register_scheduler"):
        load_catalog(entry_points=False, plugin_objects=[Typo()])


@attrs.frozen
class EveryOtherConfig:
    max_num_seqs: int = int_field(4, min=1, help="running cap")


class AdmitOnePerIteration:
    """Throwaway plugin: admits at most one request per iteration."""

    def __init__(self, config):
        self.config = config
        self.slots = config.max_num_seqs

    def schedule(self, plan):
        plan.decode_all()
        seq = plan.waiting.peek()
        if seq is not None and len(plan.running) < self.config.max_num_seqs:
            plan.admit(seq, seq.num_tokens, reserve=True)


class ThrowawayPlugin:
    @schedlab.hookimpl
    def schedlab_register_schedulers(self, register):
        register("one-per-iteration", AdmitOnePerIteration, config=EveryOtherConfig)


def test_throwaway_plugin_runs_from_toml(tmp_path):
    (tmp_path / "reqs.json").write_text('[{"prompt_tokens": 4, "output_tokens": 3},'
                                        ' {"prompt_tokens": 4, "output_tokens": 3}]')
    (tmp_path / "exp.toml").write_text(textwrap.dedent("""
        [workload]
        kind = "file"
        path = "reqs.json"
        [scheduler]
        kind = "one-per-iteration"
        max_num_seqs = 2
        """))
    exp = load(tmp_path / "exp.toml", plugin_objects=(ThrowawayPlugin(),))
    run = run_experiment(exp).all_runs()[0]
    # one admission per iteration: request 0 at t=0 (prefill 0.2 ms), request 1 at 0.2
    assert run.requests["first_scheduled_ms"].tolist() == [0.0, 0.2]
    assert run.metrics["finished"] == 2
    # this scheduler declares nothing, so the engine asked it about every iteration
    assert run.meta["events"] == run.metrics["iterations"]


def test_experiment_lists_plugin_modules(tmp_path, monkeypatch):
    (tmp_path / "my_plugin_mod.py").write_text(textwrap.dedent("""
        import schedlab
        from schedlab_plugins.schedulers import StaticScheduler, StaticConfig

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("static-copy", StaticScheduler, config=StaticConfig)
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "reqs.json").write_text('[{"prompt_tokens": 4, "output_tokens": 3}]')
    (tmp_path / "exp.toml").write_text(textwrap.dedent("""
        [experiment]
        plugins = ["my_plugin_mod"]
        [workload]
        kind = "file"
        path = "reqs.json"
        [scheduler]
        kind = "static-copy"
        batch_size = 2
        """))
    try:
        run = run_experiment(load(tmp_path / "exp.toml")).all_runs()[0]
        assert run.metrics["finished"] == 1
        assert load_catalog(["my_plugin_mod"], entry_points=False)["scheduler"].get("static-copy").provider == "my_plugin_mod"
    finally:
        sys.modules.pop("my_plugin_mod", None)


def test_unimportable_plugin_module_is_a_clear_error(tmp_path):
    (tmp_path / "exp.toml").write_text('[experiment]\nplugins = ["no_such_module_xyz"]\n'
                                       '[workload]\nkind = "file"\npath = "x.json"\n')
    with pytest.raises(ConfigError, match="cannot import plugin module 'no_such_module_xyz'"):
        load(tmp_path / "exp.toml")


def test_a_plugin_module_that_implements_no_hook_is_a_clear_error(tmp_path):
    """plugins = ["os"] imported and registered a module that contributes nothing: a misnamed
    module (or one whose hooks lack @schedlab.hookimpl) would otherwise fail later as 'unknown
    scheduler'."""
    (tmp_path / "exp.toml").write_text('[experiment]\nplugins = ["os"]\n'
                                       '[workload]\nkind = "file"\npath = "x.json"\n')
    with pytest.raises(ConfigError, match=r"plugin module 'os' implements no schedlab hook \(functions marked "
                                          r"@schedlab.hookimpl"):
        load(tmp_path / "exp.toml")


def test_pluggy_is_not_on_the_engine_path():
    """The engine modules never import pluggy: plugins are called directly in the loop."""
    import schedlab.engine.driver as driver
    import schedlab.engine.instance as instance
    import schedlab.engine.plan as plan

    for module in (driver, instance, plan):
        assert "pluggy" not in inspect.getsource(module)
    assert isinstance(make_plugin_manager(entry_points=False), pluggy.PluginManager)


def test_iteration_observer_is_opt_in_and_sees_every_iteration(tmp_path):
    seen = []

    class Observer:
        @schedlab.hookimpl
        def schedlab_iteration(self, instance, record):
            seen.append((instance, record.duration_ms))

        @schedlab.hookimpl
        def schedlab_run_finished(self, run_name, result):
            seen.append(("finished", run_name))

    (tmp_path / "reqs.json").write_text('[{"prompt_tokens": 4, "output_tokens": 30}, {"prompt_tokens": 4, "output_tokens": 9}]')
    (tmp_path / "exp.toml").write_text('[workload]\nkind = "file"\npath = "reqs.json"\n')
    run = run_experiment(load(tmp_path / "exp.toml", plugin_objects=(Observer(),))).all_runs()[0]
    iterations = [s for s in seen if s[0] == 0]
    assert len(iterations) == run.metrics["iterations"] == 30
    assert sum(d for _, d in iterations) == pytest.approx(run.counters["busy_ms"])
    assert seen[-1] == ("finished", "exp")
    plain = run_experiment(load(tmp_path / "exp.toml")).all_runs()[0]
    assert plain.meta["events"] < run.meta["events"] == 30   # without an observer, decode runs are bulk


def test_run_started_sees_the_runs_resolved_tables_as_config_json_holds_them(tmp_path):
    """The hook's settings were the tables as written: no [scheduler] table when the file had
    none, and a [[runs]] scheduler without its kind."""
    started = {}

    class Observer:
        @schedlab.hookimpl
        def schedlab_run_started(self, run_name, settings):
            started[run_name] = settings

    (tmp_path / "reqs.json").write_text('[{"prompt_tokens": 4, "output_tokens": 3}]')
    (tmp_path / "exp.toml").write_text('[workload]\nkind = "file"\npath = "reqs.json"\n'
                                       '[[runs]]\nname = "a"\n[[runs]]\nname = "b"\nscheduler = {max_num_seqs = 3}\n')
    runs = {r.name: r for r in run_experiment(load(tmp_path / "exp.toml", plugin_objects=(Observer(),))).all_runs()}
    assert started == {name: run.settings for name, run in runs.items()}
    assert started["a"]["scheduler"]["kind"] == started["b"]["scheduler"]["kind"] == "continuous"
    assert started["b"]["scheduler"]["max_num_seqs"] == 3 and "kind" in started["a"]["cost_model"]


def test_third_party_plugin_is_discovered_from_the_entry_point_group(tmp_path, monkeypatch):
    """A package publishing `[project.entry-points.schedlab]` is found without being named."""
    (tmp_path / "fancy_sched.py").write_text(textwrap.dedent("""
        import schedlab
        from schedlab_plugins.schedulers import StaticScheduler, StaticConfig

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("fancy", StaticScheduler, config=StaticConfig, help="a third-party scheduler")
        """))
    dist = tmp_path / "fancy_sched-1.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fancy-sched\nVersion: 1.2\n")
    (dist / "entry_points.txt").write_text("[schedlab]\nfancy = fancy_sched\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        catalog = load_catalog()
        entry = catalog["scheduler"].get("fancy")
        assert entry.provider == "fancy-sched 1.2"
        assert load_catalog(entry_points=False)["scheduler"].names().count("fancy") == 0
    finally:
        sys.modules.pop("fancy_sched", None)
