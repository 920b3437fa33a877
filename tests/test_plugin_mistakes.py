"""A third-party plugin author's common mistakes end in one clear line, never a traceback.

Each plugin below is a tiny module of its own, loaded through ``[experiment] plugins = [...]``
and run through the command line (``schedlab.cli.main``), as an author meets it. The mistakes
fail inside schedlab's code, not the plugin's (which :func:`schedlab.errors.plugin_error`
already names): a factory called without the config it needs, an object missing a method of
its protocol (``validate`` used to say OK), a cost model's time that is not a number, a
rejection reason that is not text, a ``schedule()`` that returns what it should have put in the
plan. Errors at run time are checked on both engines.
"""

from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

from schedlab.cli import main
from schedlab.protocols import Batch

from plugin_packages import one_line

HEADER = """
import attrs
import schedlab
from schedlab.configs import int_field
from schedlab_plugins.schedulers.continuous import ContinuousConfig, ContinuousScheduler
"""

EXPERIMENT = """
[experiment]
name = "mistake"
plugins = ["{module}"]
reports = ["json"]
engine = "{engine}"

[workload]
kind = "synthetic"
num_requests = 5
prompt = {{dist = "fixed", value = 100}}
output = {{dist = "fixed", value = 5}}
arrival = "poisson"
rate = 10
{tables}"""

_numbers = itertools.count()


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``plugin(code, tables, command, engine)``: write ``code`` as a plugin module of its own and an
    experiment using it with ``tables``, run ``command`` on it; returns (exit status, stderr, the
    experiment's path)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = []

    def make(code: str, tables: str, command: str, engine: str = "fast"):
        module = f"mistaken_plugin_{next(_numbers)}"
        modules.append(module)
        (tmp_path / f"{module}.py").write_text(HEADER + textwrap.dedent(code))
        path = tmp_path / f"{module}.toml"
        path.write_text(EXPERIMENT.format(module=module, engine=engine, tables=textwrap.dedent(tables)))
        args = [command, str(path)] + (["--out", str(tmp_path / "out"), "--no-plots"] if command == "run" else [])
        return main(args), path

    yield make
    for module in modules:
        sys.modules.pop(module, None)


# -- a. a factory registered without the config it takes ---------------------------------------

NEEDS_CONFIG = """
@attrs.frozen
class SchedConfig:
    n: int = int_field(1, help="n")

class Sched:
    def __init__(self, config):
        self.config = config

    def schedule(self, plan):
        plan.decode_all()

@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("needs-config", Sched)   # forgot config=SchedConfig
"""


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_factory_registered_without_its_config(plugin, capsys, command):
    code, path = plugin(NEEDS_CONFIG, '[scheduler]\nkind = "needs-config"\n', command)
    module = path.stem
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: [scheduler]: scheduler 'needs-config' (plugin {module}): schedlab calls its factory as Sched() "
        "(registered without config=, it gets no config), which fails: missing a required argument: 'config'; "
        "a factory that takes settings is registered with their attrs class: "
        "register(name, factory, config=YourConfig)")


def test_a_factory_registered_with_a_config_it_does_not_take(plugin, capsys):
    code, path = plugin("""
        @attrs.frozen
        class Settings:
            n: int = int_field(1, help="n")

        class Sched:
            def __init__(self):
                pass

            def schedule(self, plan):
                plan.decode_all()

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("takes-none", Sched, config=Settings)
        """, '[scheduler]\nkind = "takes-none"\n', "validate")
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: [scheduler]: scheduler 'takes-none' (plugin {path.stem}): schedlab calls its factory as "
        "Sched(config) (registered with config=Settings, it gets an instance of it first), which fails: too many "
        "positional arguments; take the config as its first argument (def __init__(self, config)), or register it "
        "without config=")


# -- b, c, e. an object without a method of its protocol -----------------------------------------

MISSING = {
    "a scheduler without schedule": ("""
        class Sched:
            def plan(self, plan):          # misnamed
                plan.decode_all()

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("no-schedule", Sched)
        """, '[scheduler]\nkind = "no-schedule"\n',
        "[scheduler]: scheduler 'no-schedule' (plugin {module}): the object its factory made has no schedule() "
        "(the Scheduler protocol: schedlab/protocols.py)"),
    "a cost model without iteration_ms": ("""
        class Cost:
            def iteration_time(self, batch):   # misnamed
                return 8.0

        @schedlab.hookimpl
        def schedlab_register_cost_models(register):
            register("no-iteration-ms", Cost)
        """, '[cost_model]\nkind = "no-iteration-ms"\n',
        "[cost_model]: cost model 'no-iteration-ms' (plugin {module}): the object its factory made has no "
        "iteration_ms() (the CostModel protocol: schedlab/protocols.py)"),
    "a KV cache without free and blocks_needed": ("""
        class Cache:
            block_size = 16
            num_blocks = 1000

            def __init__(self):
                self.used = 0

            def num_free_blocks(self):
                return self.num_blocks - self.used

            def num_used_blocks(self):
                return self.used

            def cached_tokens(self, seq):
                return 0

            def allocate(self, seq, num_new_tokens, *, cached_tokens=0, reserve_tokens=0):
                return True

            release = None   # (free, misnamed and not even a method)

        @schedlab.hookimpl
        def schedlab_register_kv_caches(register):
            register("half-a-cache", Cache)
        """, '[kv_cache]\nkind = "half-a-cache"\n',
        "[kv_cache]: kv cache 'half-a-cache' (plugin {module}): the object its factory made has no "
        "blocks_needed(), free() (the KVCache protocol: schedlab/protocols.py)"),
    "a waiting queue that is a list": ("""
        class Sched(ContinuousScheduler):
            def new_waiting_queue(self):
                return []

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("list-queue", Sched, config=ContinuousConfig)
        """, '[scheduler]\nkind = "list-queue"\n',
        "[scheduler]: scheduler 'list-queue' (plugin {module}): the queue its new_waiting_queue() made (a list) "
        "has no push(), push_front(), peek() (the WaitingQueue protocol: schedlab/protocols.py; schedlab.queues "
        "has FcfsQueue and KeyedQueue)"),
}


@pytest.mark.parametrize("case", MISSING)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_object_missing_a_method_of_its_protocol(plugin, capsys, case, command):
    """``validate`` used to say OK, and ``run`` end in an AttributeError deep in the engine."""
    code_text, tables, message = MISSING[case]
    code, path = plugin(code_text, tables, command)
    assert one_line(code, capsys.readouterr().err) == f"{path}: " + message.format(module=path.stem)


# -- d. a cost model's time that is not a number -------------------------------------------------

FIRST_BATCH = Batch(num_prefill=1, prefill_tokens=100)  # the first iteration: one prompt of 100 tokens


@pytest.mark.parametrize("value, shown", [('"8.0"', "'8.0' (str)"), ("None", "None (NoneType)"),
                                          ("(8.0, 1)", "(8.0, 1) (tuple)"), ("True", "True (bool)")])
@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_cost_model_time_that_is_not_a_number(plugin, capsys, value, shown, engine):
    code, path = plugin(f"""
        class Cost:
            def iteration_ms(self, batch):
                return {value}

        @schedlab.hookimpl
        def schedlab_register_cost_models(register):
            register("wrong-type", Cost)
        """, '[cost_model]\nkind = "wrong-type"\n', "run", engine)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'mistake': cost model 'wrong-type' (plugin {path.stem}) returned {shown} ms for {FIRST_BATCH}; "
        "iterations must take a "
        "positive, finite time (a number)")


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_cost_model_may_return_ints_and_numpy_floats(plugin, capsys, engine):
    code, _ = plugin("""
        import numpy as np

        class Cost:
            def iteration_ms(self, batch):
                return np.float32(8.0) if batch.num_prefill else 8   # (a numpy float, an int)

        @schedlab.hookimpl
        def schedlab_register_cost_models(register):
            register("numbers", Cost)
        """, '[cost_model]\nkind = "numbers"\n', "run", engine)
    assert code == 0, capsys.readouterr().err


# -- e. what the engine's wrappers and the parallel layouts ask a cost model ---------------------

TEXT_TIME = """
    class Cost:
        def iteration_ms(self, batch):
            return "8.0"

    @schedlab.hookimpl
    def schedlab_register_cost_models(register):
        register("text-time", Cost)
    """


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("table", [
    '[speculative]\nmethod = "ngram"\nnum_speculative_tokens = 2\nacceptance_rate = 0.5\n',  # the drafting wrapper
])
def test_a_text_time_under_a_wrapper_is_named_not_a_type_error(plugin, capsys, engine, table):
    """The wrapper adds to the plugin's time: that used to end in a TypeError traceback."""
    code, path = plugin(TEXT_TIME, '[cost_model]\nkind = "text-time"\n' + table, "run", engine)
    assert one_line(code, capsys.readouterr().err).startswith(
        f"{path}: run 'mistake': cost model 'text-time' (plugin {path.stem}) returned '8.0' (str) ms for Batch(")


@pytest.mark.parametrize("value, shown", [('"x"', "'x'"), ('float("nan")', "nan"), ('float("inf")', "inf"),
                                          ("(0.5, 0)", "(0.5, 0)"), ("(0.5, 2.5)", "(0.5, 2.5)"),
                                          ("(0.5,)", "(0.5,)")])
def test_a_decode_step_increment_of_the_wrong_form(plugin, capsys, value, shown):
    """The fast engine reads the increment between events; text used to be a TypeError, NaN ignored."""
    code, path = plugin(f"""
        class Cost:
            def iteration_ms(self, batch):
                return 8.0

            def decode_step_increment(self, batch):
                return {value}

        @schedlab.hookimpl
        def schedlab_register_cost_models(register):
            register("odd-increment", Cost)
        """, '[cost_model]\nkind = "odd-increment"\n', "run")
    message = one_line(code, capsys.readouterr().err)
    assert message.startswith(f"{path}: run 'mistake': cost model 'odd-increment' (plugin {path.stem})'s "
                              f"decode_step_increment returned {shown} for Batch(")
    assert message.endswith("it must return None, a finite number (ms each further identical decode step adds) "
                            "or (that number, steps >= 1 it holds for)")


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_negative_increment_is_no_promise(plugin, capsys, engine):
    """A rounding below 0 is harmless: the engine asks about every step, as with None."""
    code, _ = plugin("""
        class Cost:
            def iteration_ms(self, batch):
                return 8.0

            def decode_step_increment(self, batch):
                return -1e-18

        @schedlab.hookimpl
        def schedlab_register_cost_models(register):
            register("negative-increment", Cost)
        """, '[cost_model]\nkind = "negative-increment"\n', "run", engine)
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("value, message", [
    ('"x"', "cost model's pipeline_ms returned 'x' for Batch("),
    ("((4.0, 4.0),)", "cost model's pipeline_ms returned ((4.0, 4.0),) for Batch("),
    ('((4.0, "4"), 0.1)', "cost model's pipeline_ms (a stage's time) returned '4' (str) ms for Batch("),
    ("((0.0, 0.0), 0.1)", "cost model's pipeline_ms returned stage times (0.0, 0.0) for Batch("),
    ("((4.0, 4.0), -1.0)", "cost model's pipeline_ms (the send) returned -1.0 (float) ms for Batch("),
])
def test_a_pipeline_ms_of_the_wrong_form(plugin, capsys, engine, value, message):
    code, path = plugin(f"""
        class Cost:
            def iteration_ms(self, batch):
                return 8.0

            def pipeline_ms(self, batch):
                return {value}

        @schedlab.hookimpl
        def schedlab_register_cost_models(register):
            register("odd-pipeline", Cost)
        """, '[cost_model]\nkind = "odd-pipeline"\n[cluster]\npipeline_parallel = 2\n', "run", engine)
    named = message.replace("cost model", f"cost model 'odd-pipeline' (plugin {path.stem})", 1)
    assert one_line(code, capsys.readouterr().err).startswith(f"{path}: run 'mistake': {named}")


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("rank, experts, message", [
    ('"4"', "1.0", "cost model's rank_ms returned '4' (str) ms for Batch("),
    ("0.0", "1.0", "cost model's rank_ms returned 0.0 ms for Batch("),
    ("4.0", '"1"', "cost model's experts_ms returned '1' (str) ms for tokens ("),
    ("4.0", "-1.0", "cost model's experts_ms returned -1.0 (float) ms for tokens ("),
])
def test_a_data_parallel_rank_time_of_the_wrong_form(plugin, capsys, engine, rank, experts, message):
    code, path = plugin(f"""
        class Cost:
            def iteration_ms(self, batch):
                return 8.0

            def rank_ms(self, batch):
                return {rank}

            def experts_ms(self, tokens):
                return {experts}

        @schedlab.hookimpl
        def schedlab_register_cost_models(register):
            register("odd-ranks", Cost)
        """, '[cost_model]\nkind = "odd-ranks"\n[cluster]\ndata_parallel = 2\n', "run", engine)
    named = message.replace("cost model", f"cost model 'odd-ranks' (plugin {path.stem})", 1)
    assert one_line(code, capsys.readouterr().err).startswith(f"{path}: run 'mistake': {named}")


# -- f. a rejection reason that is not text ------------------------------------------------------

REJECTS = """
class Sched(ContinuousScheduler):
    def rejection_reason(self, request, kv):
        return {value} if request.id == 2 else None

@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("yes-no", Sched, config=ContinuousConfig)
"""

DISAGGREGATED = """
[kv_cache]
kind = "paged"
bytes_per_block = 2097152

[cluster]
mode = "disaggregated"
"""


CLUSTERS = {
    "colocated": '[scheduler]\nkind = "yes-no"\n',
    "disaggregated": '[scheduler]\nkind = "yes-no"\n' + DISAGGREGATED,
    # the decode pool's scheduler alone: the engines ask it on arrival too, for the request's decode part
    "decode pool": DISAGGREGATED + 'decode = {scheduler = {kind = "yes-no"}}\n',
}


@pytest.mark.parametrize("value", ["True", "1", "['too long']"])
@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_rejection_reason_that_is_not_text(plugin, capsys, value, cluster, engine):
    """The whole run used to go on, then fail in the results code with a TypeError."""
    code, path = plugin(REJECTS.format(value=value), CLUSTERS[cluster], "run", engine)
    assert one_line(code, capsys.readouterr().err) == (  # (named: the message said only "rejection_reason()")
        f"{path}: run 'mistake': scheduler 'yes-no' (plugin {path.stem}): rejection_reason() returned {value} for "
        "request 2: a reason is text (or None to accept)")


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_rejection_reason_of_text_or_none_runs(plugin, capsys, engine):
    code, _ = plugin(REJECTS.format(value='"not today"'), '[scheduler]\nkind = "yes-no"\n', "run", engine)
    assert code == 0, capsys.readouterr().err


# -- g. schedule() returning what it should have put in the plan ---------------------------------

RETURNS = """
class Sched:
    def schedule(self, plan):
        return [seq.request.id for seq in plan.waiting]   # as if a plan were returned: nothing is admitted

class AheadSched(Sched):
    plans_ahead = True   # (each batch planned while the one before it runs: schedlab.engine.ahead)

@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("returns-a-plan", Sched)
    register("returns-a-plan-ahead", AheadSched)
"""

PIPELINED = """
[cluster]
pipeline_parallel = 2

[cost_model]
kind = "roofline"
model = "llama-3-8b"
gpu = "a100-80gb"

[kv_cache]
num_blocks = 16384
"""


SCHEDULING = {
    "colocated": '[scheduler]\nkind = "returns-a-plan"\n',
    "pipelined": '[scheduler]\nkind = "returns-a-plan"\n' + PIPELINED,
    "planning ahead": '[scheduler]\nkind = "returns-a-plan-ahead"\n',
}


@pytest.mark.parametrize("case", SCHEDULING)
@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_schedule_returning_a_value(plugin, capsys, case, engine):
    """It used to be ignored, and the run stalled with its plans empty."""
    code, path = plugin(RETURNS, SCHEDULING[case], "run", engine)
    name = "returns-a-plan-ahead" if case == "planning ahead" else "returns-a-plan"  # (the message said "schedule()")
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'mistake': scheduler {name!r} (plugin {path.stem}): schedule() returned [0] (list): "
        "a scheduler fills in the plan it is given (plan.admit, plan.decode_all, ...) and returns None")
