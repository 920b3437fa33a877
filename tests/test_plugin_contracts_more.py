"""More of a plugin's contract checked where schedlab reads its answers, each broken one ending
in one line that names the plugin, never a traceback or a silently wrong result.

Each plugin is a small module of its own, loaded through ``[experiment] plugins = [...]`` and
run through the command line (``schedlab.cli.main``), on both engines where the run reads it:
a workload's requests (Request objects, ids 0, 1, 2, ..., arrivals in order; checked as they
are streamed), an autoscaler's decision (an int >= 0), a power model's energies and settings
(finite numbers >= 0; a pipelined instance's meter too), a report's ``write()`` answer (the
list of files), a factory registered as an instance, and a KV cache that hands out more
blocks than it has.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from schedlab.cli import main
from schedlab.energy.meter import EnergyMeter
from schedlab.engine.scaling import checked_decision
from schedlab.engine.stall import stall_message
from schedlab.errors import ConfigError, SimulationError, WorkloadError
from schedlab.model import Request, checked_requests
from schedlab.protocols import Batch
from schedlab.registry import Registry
from schedlab.testing.parallel import LinearParallelCost, run_pipelined
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

ENGINES = ("fast", "reference")

HEADER = """
import math
import attrs
import schedlab
from schedlab import Request
"""

EXPERIMENT = """
[experiment]
name = "contract"
plugins = ["{module}"]
reports = [{reports}]
engine = "{engine}"

{workload}
{tables}"""
WORKLOAD_TABLE = """
[workload]
kind = "synthetic"
num_requests = {n}
prompt = {{dist = "fixed", value = {prompt}}}
output = {{dist = "fixed", value = 5}}
arrival = "poisson"
rate = {rate}
"""
#: 8 requests over about 4 s (an autoscaler decides every second)
SYNTHETIC = WORKLOAD_TABLE.format(n=8, prompt=100, rate=2)

_numbers = itertools.count()


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``plugin(code, tables, command="run", engine="fast", reports='"json"', workload=SYNTHETIC)``:
    write ``code`` as a plugin module and an experiment using it with ``workload`` and ``tables``;
    run ``command`` on it; returns (exit status, the experiment's path)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = []

    def make(code: str, tables: str = "", command: str = "run", engine: str = "fast", reports: str = '"json"',
             workload: str = SYNTHETIC):
        module = f"contract_plugin_{next(_numbers)}"
        modules.append(module)
        (tmp_path / f"{module}.py").write_text(HEADER + textwrap.dedent(code))
        path = tmp_path / f"{module}.toml"
        path.write_text(EXPERIMENT.format(module=module, engine=engine, reports=reports, workload=workload,
                                          tables=textwrap.dedent(tables)))
        args = [command, str(path)] + (["--out", str(tmp_path / "out"), "--no-plots"] if command == "run" else [])
        return main(args), path

    yield make
    for module in modules:
        sys.modules.pop(module, None)


def one_line(code: int, err: str) -> str:
    """Exit 2, no traceback, one ``schedlab: error:`` line (returned without its prefix); before it
    at most the command's progress lines."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().split("\n")
    assert lines[-1].startswith("schedlab: error: "), err
    assert all(line.startswith("schedlab: ") and ("run(s)" in line or " simulations in " in line)
               for line in lines[:-1]), err
    return lines[-1][len("schedlab: error: "):]


# -- a workload's requests ------------------------------------------------------------------------------
WORKLOAD = """
class Bad:
    def requests(self, seed):
        yield from {requests}

@schedlab.hookimpl
def schedlab_register_workloads(register):
    register("bad", Bad)
"""


def request(i: int, t: float) -> str:
    return f"Request(id={i}, arrival_ms={t}, prompt_tokens=10, output_tokens=10)"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("requests, message", [
    (f"[{request(0, 2000.0)}, {request(1, 100.0)}]",
     "workload 'bad' yielded request 1 at 100 ms after request 0 at 2000 ms: a workload yields requests in arrival "
     "order"),
    (f"[{request(0, 0.0)}, {request(0, 100.0)}]",
     "workload 'bad' yielded request 0 after request 0 (request 1 was due): a workload yields requests with ids 0, "
     "1, 2, ... in that order"),
    (f"[{request(5, 0.0)}]",
     "workload 'bad' yielded request 5 first (request 0 was due): a workload yields requests with ids 0, 1, 2, ... "
     "in that order"),
    ("[dict(id=0, arrival_ms=0.0, prompt_tokens=10, output_tokens=10)]",
     "workload 'bad' yielded {'id': 0, 'arrival_ms': 0.0, 'prompt_tokens': 10, 'output_tokens': 10} (a dict) as its "
     "request 0; a workload yields schedlab.Request objects"),
    ("[Request(id=0, arrival_ms=0.0, prompt_tokens=50.5, output_tokens=10)]",   # (Request() refused it: who made it?)
     "workload 'bad' made request 0: prompt_tokens must be a whole number (an int), got 50.5 (a float)"),
])
def test_a_workload_breaking_its_protocol_is_refused_by_name(plugin, capsys, engine, requests, message):
    code, path = plugin(WORKLOAD.format(requests=requests), engine=engine, workload='[workload]\nkind = "bad"\n')
    assert one_line(code, capsys.readouterr().err) == f"{path}: run 'contract': {message}"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_workload_that_makes_no_requests_is_named(plugin, capsys, engine):
    """Used to end with exit 0 and an empty table."""
    code, path = plugin(WORKLOAD.format(requests="[]"), '[workload]\nkind = "bad"\n', engine=engine, workload="")
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': workload 'bad' made no requests; a run needs at least one")


def test_requests_are_checked_as_they_are_streamed():
    """The check never materialises the stream: an endless workload is read one request at a time,
    and a bad request is refused only when it is reached."""
    def endless():
        for i in itertools.count():
            yield Request(id=i if i != 3 else 7, arrival_ms=float(i), prompt_tokens=1, output_tokens=1)

    stream = checked_requests(endless(), "workload 'endless'")
    assert [next(stream).id for _ in range(3)] == [0, 1, 2]
    with pytest.raises(WorkloadError, match=r"^workload 'endless' yielded request 7 after request 2 \(request 3"):
        next(stream)


def test_an_endless_workload_stops_at_a_runs_most_requests(monkeypatch):
    """An endless generator, or a closed loop whose finishes always release another request, is
    refused at the run's most requests (10**7; 5 here) instead of running for ever."""
    import schedlab.model as model

    monkeypatch.setattr(model, "MAX_REQUESTS", 5)

    def endless():
        for i in itertools.count():
            yield Request(id=i, arrival_ms=float(i), prompt_tokens=1, output_tokens=1)

    stream = checked_requests(endless(), "workload 'endless'")
    assert [next(stream).id for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(WorkloadError, match=r"^workload 'endless' gave more than 5 requests, a run's most: bound it"):
        next(stream)

    class Loop:
        def on_finish(self, request, now_ms):
            return [Request(id=request.id + 1, arrival_ms=now_ms, prompt_tokens=1, output_tokens=1)]

    follow_ups = model.FollowUps(Loop(), "workload 'loop'")
    for i in range(5):
        follow_ups(Request(id=i, arrival_ms=0.0, prompt_tokens=1, output_tokens=1), 1.0)
    with pytest.raises(WorkloadError, match=r"^workload 'loop' gave more than 5 requests"):
        follow_ups(Request(id=5, arrival_ms=0.0, prompt_tokens=1, output_tokens=1), 1.0)


def scheduler_plugin(name: str, cls: str, methods: str, preamble: str = "") -> str:
    """A plugin module registering ``cls``, a ContinuousScheduler with the class body ``methods``,
    as the scheduler ``name``."""
    return (f"from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler\n{preamble}\n"
            f"class {cls}(ContinuousScheduler):\n{textwrap.indent(textwrap.dedent(methods), '    ')}\n"
            f"@schedlab.hookimpl\ndef schedlab_register_schedulers(register):\n"
            f"    register({name!r}, {cls}, config=ContinuousConfig)\n")


WEIRD = """
class Weird(Exception):
    def __str__(self):
        raise RuntimeError("no text")
"""


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body, raised", [
    ("import sys; sys.exit(0)", "SystemExit: sys.exit(0)"),   # used to end the command with status 0, no results
    ("raise GeneratorExit", "GeneratorExit"),                  # used to print a traceback
    ("raise Weird()", "Weird: (its message could not be shown)"),  # the error handler itself failed
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),  # used to read as Ctrl-C: "interrupted", exit 130
])
def test_a_plugin_that_exits_or_cannot_say_why_is_named(plugin, capsys, engine, body, raised):
    code, path = plugin(scheduler_plugin("quits", "Quits", f"def schedule(self, plan):\n    {body}\n", WEIRD),
                        '[scheduler]\nkind = "quits"\n', engine=engine)
    err = one_line(code, capsys.readouterr().err)
    assert re.fullmatch(rf"{re.escape(str(path))}: run 'contract': scheduler 'quits' \(plugin contract_plugin_\d+\) "
                        rf"raised {re.escape(raised)} \(contract_plugin_\d+\.py:\d+ in Quits\.schedule; .*\)", err), err


@pytest.mark.parametrize("engine", ENGINES)
def test_a_schedlab_error_a_plugin_raises_itself_names_the_plugin(plugin, capsys, engine):
    """Used to read as schedlab's own: "run 'contract': my state is bad", no plugin named."""
    code, path = plugin(scheduler_plugin("strict", "Strict", """
        def schedule(self, plan):
            from schedlab.errors import ConfigError
            raise ConfigError("my state is bad")
        """), '[scheduler]\nkind = "strict"\n', engine=engine)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': scheduler 'strict' (plugin {path.stem}): my state is bad")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body, raised", [("raise MemoryError('plugin says no')", "MemoryError: plugin says no"),
                                          ("raise MemoryError", "MemoryError")])
def test_a_plugins_own_memory_error_names_the_plugin(plugin, capsys, engine, body, raised):
    """Used to read as the run's size alone ("out of memory; make the experiment smaller"), no plugin named."""
    code, path = plugin(scheduler_plugin("greedy", "Greedy", f"def schedule(self, plan):\n    {body}\n"),
                        '[scheduler]\nkind = "greedy"\n', engine=engine)
    err = one_line(code, capsys.readouterr().err)
    assert re.fullmatch(rf"{re.escape(str(path))}: run 'contract': scheduler 'greedy' \(plugin contract_plugin_\d+\) "
                        rf"raised {raised} \(contract_plugin_\d+\.py:\d+ in Greedy\.schedule; .*\); if the "
                        r"experiment is large, make it smaller \(fewer requests, points or instances\)", err), err


def test_a_memory_error_in_the_built_in_plugins_is_the_runs_size(monkeypatch, capsys, tmp_path):
    """Raised in a built-in plugin's frame (or schedlab's), it is not blamed on that plugin."""
    built_in = {"__name__": ContinuousScheduler.__module__}  # (its frame is the built-in module's)
    exec("def schedule(self, plan):\n    raise MemoryError\n", built_in)
    monkeypatch.setattr(ContinuousScheduler, "schedule", built_in["schedule"])
    path = tmp_path / "big.toml"
    path.write_text('[experiment]\nname = "big"\n' + SYNTHETIC)
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--jobs", "1"])
    assert code == 2
    assert capsys.readouterr().err.strip().split("\n")[-1] == (
        "schedlab: error: out of memory; make the experiment smaller (fewer requests, points or instances)")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("call, message", [
    ("plan.admit(seq, seq.num_tokens / 2)", "admit(): request 0: num_tokens must be a whole number (an int), the "
                                            "scheduler gave 50.0 (a float)"),
    ("plan.admit(seq, True)", "admit(): request 0: num_tokens must be a whole number (an int), the scheduler gave "
                              "True (a bool)"),
    ("plan.admit(seq, 100, reserve_tokens=104.5)", "admit(): request 0: reserve_tokens must be a whole number (an "
                                                   "int), the scheduler gave 104.5 (a float)"),
    ("plan.wake_at('3000')", "wake_at('3000'): give a time in ms (a number; inf for never)"),
    ("plan.wake_at(math.nan)", "wake_at(nan): give a time in ms (a number; inf for never)"),
])
def test_a_plan_call_with_a_count_or_time_of_the_wrong_type_is_refused_on_both_engines(plugin, capsys, engine, call,
                                                                                        message):
    """50.0 tokens crashed the fast engine and ran on the reference one; wake_at('3000') failed in
    the engine later, wake_at(nan) ended as a stall blamed on empty iterations."""
    planning = f"def schedule(self, plan):\n    plan.decode_all()\n    for seq in list(plan.waiting):\n        {call}\n"
    code, path = plugin(scheduler_plugin("odd", "Odd", planning), '[scheduler]\nkind = "odd"\n', engine=engine)
    assert one_line(code, capsys.readouterr().err) == f"{path}: run 'contract': {message}"


PIPELINED = ('[cluster]\npipeline_parallel = 2\n'
             '[cost_model]\nkind = "roofline"\nmodel = "llama-3-8b"\ngpu = "a100-80gb"\n'
             '[kv_cache]\nnum_blocks = 16384\n')  # (a pool of its own size: not one sized for the model and GPU)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pipelined", [False, True])
def test_a_plan_kept_for_a_later_iteration_is_refused(plugin, capsys, engine, pipelined):
    """A scheduler that kept its first plan and decoded on it later was ignored, and the run ended
    in a stall blamed on empty plans (both engines; a pipelined instance's plans too)."""
    code, path = plugin(scheduler_plugin("keeper", "Keeper", """
        def schedule(self, plan):
            if getattr(self, "kept", None) is None:
                self.kept = plan
                return super().schedule(plan)
            self.kept.decode_all()
        """), '[scheduler]\nkind = "keeper"\n' + (PIPELINED if pipelined else ""),
        engine=engine)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': the scheduler called decode_all() on the plan of an earlier iteration (plan 1): a "
        "scheduler acts on the plan schedule() is given, within that call")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("call, instead", [
    ("plan.kv.free(seq)", "plan.preempt(seq) to take a running request's blocks back; the engine frees a request's "
                          "blocks when it finishes"),
    ("plan.kv.allocate(seq, 1)", "plan.admit / plan.prefill / plan.decode, which take the blocks they need"),
])
def test_a_scheduler_that_changes_the_kv_cache_itself_is_named(plugin, capsys, engine, pipelined, call, instead):
    """A scheduler that freed a running request's blocks through plan.kv freed them twice (once more
    when the request finished): the run stopped at its end blaming the built-in cache ('reports -357
    used blocks ... its free() released more than allocate() took')."""
    code, path = plugin(scheduler_plugin("freer", "Freer", f"""
        def schedule(self, plan):
            super().schedule(plan)
            for seq in list(plan.running)[:1]:
                {call}
        """), '[scheduler]\nkind = "freer"\n' + (PIPELINED if pipelined else ""), engine=engine)
    name = call.split("(")[0]
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': the scheduler called {name}(): a scheduler reads the KV cache and changes it only "
        f"through the plan's actions -- {instead}")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_third_party_scheduler_reads_the_kv_cache_as_the_built_in_one_does(plugin, tmp_path, engine):
    """The view a third-party scheduler gets passes every read through: a subclass of the built-in
    scheduler that checks the cache's class and reads its counts ends with the built-in's results."""
    reader = scheduler_plugin("reader", "Reader", """
        def schedule(self, plan):
            from schedlab_plugins.kv_caches import PagedKVCache
            assert isinstance(plan.kv, PagedKVCache) and callable(plan.kv.free)
            assert plan.kv.num_used_blocks() + plan.kv.num_free_blocks() == plan.kv.num_blocks
            super().schedule(plan)
        """)
    results = []
    for kind in ("continuous", "reader"):
        code, _ = plugin(reader, f'[scheduler]\nkind = "{kind}"\n', engine=engine)
        assert code == 0
        found = json.loads((tmp_path / "out" / "summary.json").read_text())
        results.append([run["metrics"] for study in found["studies"] for run in study["runs"]])
    assert results[0] == results[1]
    assert results[0][0]["finished"] == 8


STICKY_QUEUE = """
class Sticky(list):
    push = list.append

    def push_front(self, seq):
        self.insert(0, seq)

    def peek(self):
        return self[0] if self else None

    def remove(self, seq):  # (does nothing)
        pass
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_waiting_queue_that_keeps_what_it_should_drop_is_named_in_the_stall(plugin, capsys, engine):
    """Every request finished, yet the stall said "8 waiting, 0 running" and nothing more."""
    code, path = plugin(scheduler_plugin("sticky", "StickyScheduler", """
        def new_waiting_queue(self):
            return Sticky()

        def schedule(self, plan):
            plan.decode_all()
            for seq in list(plan.waiting):
                if seq.status == "waiting":
                    plan.admit(seq, seq.num_tokens)
        """, STICKY_QUEUE), '[scheduler]\nkind = "sticky"\n', engine=engine)
    assert re.fullmatch(r".* stalled at .*: scheduler StickyScheduler, 8 waiting, 0 running, 0 swapped, (\d+)/\1 KV "
                        r"blocks free; 8 of the 8 in the waiting queue have left the run \(finished, rejected or "
                        r"aborted\): the scheduler's waiting queue does not drop what its remove\(\) is given",
                        one_line(code, capsys.readouterr().err))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_scheduler_that_loses_requests_from_its_waiting_queue_is_caught(plugin, capsys, engine):
    """Removing requests from plan.waiting by hand (not through admit or reject) used to end with
    exit 0 and results holding fewer requests than arrived -- both engines alike."""
    code, path = plugin(scheduler_plugin("loses", "Loses", """
        def schedule(self, plan):
            for seq in list(plan.waiting)[1:]:
                plan.waiting.remove(seq)
            return super().schedule(plan)
        """), '[scheduler]\nkind = "loses"\n', engine=engine)
    err = one_line(code, capsys.readouterr().err)
    found = re.fullmatch(rf"{re.escape(str(path))}: run 'contract': 8 requests arrived but (\d) left the run "
                         r"\(finished, rejected or aborted\): the scheduler \('loses'\) or its waiting queue lost (\d); "
                         r"a scheduler takes requests out of plan.waiting only through the plan .*", err)
    assert found and int(found[1]) + int(found[2]) == 8 and int(found[2]) > 0, err


@pytest.mark.parametrize("kind, attribute, value, want", [
    ("kv", "num_blocks", "'200'", "its num_blocks is '200' (a str); the KVCache protocol wants a whole number from 0 "
                                  "to 2**53"),
    ("kv", "block_size", "16.5", "its block_size is 16.5 (a float); the KVCache protocol wants a whole number from 1 "
                                 "to 2**53"),
    ("kv", "block_size", "-16", "its block_size is -16 (a int); the KVCache protocol wants a whole number from 1 to "
                                "2**53"),
    ("scheduler", "slots", "-4", "its slots is -4 (a int); the Scheduler protocol wants a whole number from 1 to 2**53 "
                                 "or None"),
    ("scheduler", "slots", "10**400", f"its slots is 1{'0' * 56}... (a int); the Scheduler protocol wants a whole "
                                      "number from 1 to 2**53 or None"),
    ("scheduler", "max_in_flight", "0", "its max_in_flight is 0 (a int); the Scheduler protocol wants a whole number "
                                        "from 1 to 2**53 or None"),
    ("scheduler", "plans_ahead", "'no'", "its plans_ahead is 'no' (a str); the Scheduler protocol wants True or False"),
])
def test_a_plugins_numbers_and_flags_are_checked_when_it_is_built(plugin, capsys, kind, attribute, value, want):
    """A text num_blocks or slots failed deep in the engine or in the metrics after the run (and
    slots = 10**400 overflowed a float there); a negative block size or slot count ran on with
    wrong numbers (-41% utilisation); truthy text planned ahead."""
    code, path = plugin(f"""
        from schedlab_plugins.kv_caches import PagedKVCache
        from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

        class Odd{'KV(PagedKVCache)' if kind == 'kv' else 'Scheduler(ContinuousScheduler)'}:
            def __init__(self, *args, **kwargs):
                super().__init__({'200' if kind == 'kv' else '*args, **kwargs'})
                self.{attribute} = {value}

        @schedlab.hookimpl
        def schedlab_register_{'kv_caches' if kind == 'kv' else 'schedulers'}(register):
            register("odd", Odd{'KV' if kind == 'kv' else 'Scheduler'},
                     config={'None' if kind == 'kv' else 'ContinuousConfig'})
        """, f'[{"kv_cache" if kind == "kv" else "scheduler"}]\nkind = "odd"\n')
    err = one_line(code, capsys.readouterr().err)
    table = "kv_cache" if kind == "kv" else "scheduler"
    assert re.fullmatch(rf"{re.escape(str(path))}: \[{table}\]: {'kv cache' if kind == 'kv' else 'scheduler'} 'odd' "
                        rf"\(plugin contract_plugin_\d+\): {re.escape(want)} \(schedlab/protocols.py\)", err), err


@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize("method", ["kv_problem", "start_up_problem"])
def test_a_kv_problem_that_is_not_text_is_named(plugin, capsys, command, method):
    """kv_problem() returning 7 used to end in 'exp.toml: [scheduler]: 7'; start_up_problem()'s went
    into the run's meta unchecked."""
    code, path = plugin(scheduler_plugin("odd", "Odd", f"def {method}(self, kv):\n    return 7\n"),
                        '[scheduler]\nkind = "odd"\n', command)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: [scheduler]: scheduler 'odd' (plugin {path.stem}): its {method}() returned 7 (int); it returns why "
        "the settings cannot work, as text, or None")


@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize("method, shown", [
    ("def schedule(self): pass", "its schedule() cannot be called as schedule(plan)"),
    ("def on_finish(self, seq): pass", "its on_finish(seq) cannot be called as on_finish(seq, now_ms)"),
    ("def new_waiting_queue(self, x): return None", "its new_waiting_queue(x) cannot be called as new_waiting_queue()"),
])
def test_a_method_that_cannot_take_the_engines_arguments_is_named(plugin, capsys, command, method, shown):
    """The TypeError was raised at schedlab's call site, before any plugin frame: a raw traceback,
    and validate said OK (or, for new_waiting_queue, crashed itself)."""
    code, path = plugin(scheduler_plugin("odd", "Odd", method), '[scheduler]\nkind = "odd"\n', command)
    err = one_line(code, capsys.readouterr().err)
    assert re.fullmatch(rf"{re.escape(str(path))}: \[scheduler\]: scheduler 'odd' \(plugin contract_plugin_\d+\): "
                        rf"{re.escape(shown)}, as schedlab calls it \(the Scheduler protocol: schedlab/protocols.py\)",
                        err), err


def test_an_iteration_observer_on_the_reference_engine_is_refused(plugin, capsys):
    """The reference engine never called schedlab_iteration: an observer that counts, or checks,
    passed there with exit 0 having seen nothing."""
    code, path = plugin("""
        @schedlab.hookimpl
        def schedlab_iteration(instance, record):
            raise AssertionError("an observed iteration")
        """, engine="reference")
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': the reference engine does not call the per-iteration hook (schedlab_iteration) a "
        'plugin implements, or an observer; observe the fast engine (engine = "fast")')


@pytest.mark.parametrize("engine", ENGINES)
def test_a_kv_caches_block_counts_of_the_wrong_type_are_named(plugin, capsys, engine):
    """A text count failed on a comparison inside the engine with a traceback."""
    code, path = plugin("""
        from schedlab_plugins.kv_caches import PagedKVCache

        class TextKV(PagedKVCache):
            def __init__(self):
                super().__init__(200)

            def num_used_blocks(self):
                return str(super().num_used_blocks())

        @schedlab.hookimpl
        def schedlab_register_kv_caches(register):
            register("text", TextKV)
        """, '[kv_cache]\nkind = "text"\n', engine=engine)
    err = one_line(code, capsys.readouterr().err)
    assert re.fullmatch(rf"{re.escape(str(path))}: run 'contract': kv cache 'text' \(plugin contract_plugin_\d+\)'s "
                        r"num_used_blocks\(\) returned "
                        r"'\d+' \(a str\); it returns a whole number of blocks", err), err


def test_a_config_registered_as_an_instance_is_refused():
    registry = Registry("scheduler")
    with pytest.raises(TypeError, match=r"^scheduler 'x': config must be an attrs class, got ContinuousConfig\("):
        registry.register("x", ContinuousScheduler, config=ContinuousConfig())


def test_a_worker_process_that_dies_under_a_plugin_is_one_line(tmp_path, capsys):
    """os._exit() in a plugin, in a worker process: a BrokenProcessPool traceback before."""
    (tmp_path / "dying_plugin_xyz.py").write_text(HEADER + scheduler_plugin("dies", "Dies", """
        def schedule(self, plan):
            import os
            os._exit(0)
        """))
    path = tmp_path / "dying.toml"
    path.write_text(EXPERIMENT.format(module="dying_plugin_xyz", engine="fast", reports='"json"', workload=SYNTHETIC,
                                      tables='[scheduler]\nkind = "dies"\n'))
    try:
        code = main(["run", str(path), "--jobs", "2", "--out", str(tmp_path / "out"), "--no-plots"])
    finally:
        sys.modules.pop("dying_plugin_xyz", None)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': the worker process running it died (a plugin called os._exit() or crashed Python); "
        "--jobs 1 runs it in this process")
    assert not (tmp_path / "out").exists()


def test_a_plugins_own_keyboard_interrupt_in_a_worker_process_is_its_error(tmp_path, capsys):
    """No signal came, so it is the plugin's (a worker notes a SIGINT it gets: a real Ctrl-C stays
    an interrupt, tests/test_interrupts.py)."""
    (tmp_path / "stopping_plugin_xyz.py").write_text(HEADER + scheduler_plugin("stops", "Stops", """
        def schedule(self, plan):
            raise KeyboardInterrupt
        """))
    path = tmp_path / "stopping.toml"
    tables = '[scheduler]\nkind = "stops"\n[[runs]]\nname = "a"\n[[runs]]\nname = "b"\n'
    path.write_text(EXPERIMENT.format(module="stopping_plugin_xyz", engine="fast", reports='"json"', workload=SYNTHETIC,
                                      tables=tables))
    try:
        code = main(["run", str(path), "--jobs", "2", "--out", str(tmp_path / "out"), "--no-plots"])
    finally:
        sys.modules.pop("stopping_plugin_xyz", None)
    err = one_line(code, capsys.readouterr().err)
    assert re.fullmatch(rf"{re.escape(str(path))}: run '[ab]': scheduler 'stops' \(plugin stopping_plugin_xyz\) raised "
                        r"KeyboardInterrupt \(stopping_plugin_xyz\.py:\d+ in Stops\.schedule; .*\)", err), err
    assert not (tmp_path / "out").exists()


def test_a_stopiteration_in_a_workloads_generator_names_the_workload(plugin, capsys):
    """Python turns it into a RuntimeError raised where schedlab reads the generator; the plugin's
    frame is in the exception that led to it."""
    code, path = plugin("""
        class Stops:
            def requests(self, seed):
                yield Request(id=0, arrival_ms=0.0, prompt_tokens=5, output_tokens=2)
                raise StopIteration

        @schedlab.hookimpl
        def schedlab_register_workloads(register):
            register("stops", Stops)
        """, workload='[workload]\nkind = "stops"\n')
    err = one_line(code, capsys.readouterr().err)
    assert re.match(rf"{re.escape(str(path))}: run 'contract': workload 'stops' \(plugin contract_plugin_\d+\) raised "
                    r"RuntimeError: generator raised StopIteration \(contract_plugin_\d+\.py:\d+ in Stops\.requests;",
                    err), err


@pytest.mark.parametrize("field, value, message", [
    ("prompt_tokens", 50.5, "prompt_tokens must be a whole number (an int), got 50.5 (a float)"),
    ("prompt_tokens", 50.0, "prompt_tokens must be a whole number (an int), got 50.0 (a float)"),
    ("max_tokens", 10.5, "max_tokens must be a whole number (an int), got 10.5 (a float)"),
    ("output_tokens", True, "output_tokens must be a whole number (an int), got True (a bool)"),
    ("priority", "high", "priority must be a whole number (an int), got 'high' (a str)"),
    ("priority", math.nan, "priority must be a whole number (an int), got nan (a float)"),
    ("client", None, "client must be text, got None (a NoneType)"),
    ("request_class", 3, "request_class must be text, got 3 (a int)"),
    ("prefix_group", [1], "prefix_group must be hashable (a str, an int or a tuple of them), got [1]"),
    ("block_hashes", [1, 2], "block_hashes must be a tuple of hash ids, got [1, 2] (a list)"),
    ("block_hashes", ([1], [2]), "block_hashes must be hashable (a str, an int or a tuple of them), got ([1], [2])"),
])
def test_a_requests_fields_are_checked_for_their_type_not_only_their_range(field, value, message):
    """Float token counts crashed the fast engine and ran on the reference one; a text priority, a
    None client or a list for a prefix group failed far from the workload that made them."""
    with pytest.raises(WorkloadError, match=r"^request 0: " + re.escape(message) + "$"):
        Request(**{"id": 0, "arrival_ms": 0.0, "prompt_tokens": 100, "output_tokens": 5, field: value})
    assert Request(id=0, arrival_ms=0.0, prompt_tokens=np.int64(100), output_tokens=np.int32(5)).prompt_tokens == 100


def test_equal_arrival_times_are_in_order():
    requests = [Request(id=i, arrival_ms=5.0, prompt_tokens=1, output_tokens=1) for i in range(3)]
    assert list(checked_requests(iter(requests), "workload 'x'")) == requests


# -- an autoscaler's decision -------------------------------------------------------------------------------
AUTOSCALER = """
from schedlab_plugins.autoscalers import ScalingConfig

class Bad:
    def __init__(self, config):
        self.config = config

    def decide(self, signals):
        return {answer}

@schedlab.hookimpl
def schedlab_register_autoscalers(register):
    register("bad", Bad, config=ScalingConfig)
"""
CLUSTER = ('[cluster]\ninstances = 3\nrouter = {kind = "least_outstanding"}\n'
           'autoscaler = {kind = "bad", interval_s = 1, cold_start_s = 1}\n')


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("answer, shown", [('"2"', "'2' (str)"), ("1.5", "1.5 (float)"), ("None", "None (NoneType)"),
                                           ("math.nan", "nan (float)"), ("True", "True (bool)"), ("-1", "-1 (int)")])
def test_an_autoscaler_answer_that_is_not_a_count_is_refused(plugin, capsys, engine, answer, shown):
    code, path = plugin(AUTOSCALER.format(answer=answer), CLUSTER, "run", engine)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': autoscaler 'bad' (plugin {path.stem}) returned {shown} from decide() at t=1000 ms; "
        "expected a whole "
        "number of instances >= 0 (an int)")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_autoscaler_count_beyond_the_limits_is_still_clamped(plugin, capsys, engine):
    code, _ = plugin(AUTOSCALER.format(answer="100"), CLUSTER, "run", engine)
    assert code == 0, capsys.readouterr().err


def test_numpy_integers_are_counts():
    assert checked_decision(object(), np.int64(2), 0.0) == 2
    assert type(checked_decision(object(), np.int64(2), 0.0)) is int


# -- a power model's answers ------------------------------------------------------------------------------
POWER = """
class Bad:
    idle_w, standby_w, standby_ms = {settings}

    def iteration_j(self, batch, duration_ms):
        return {energy}

@schedlab.hookimpl
def schedlab_register_power_models(register):
    register("bad", Bad)
"""
FIRST_BATCH = Batch(num_prefill=1, prefill_tokens=100)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("energy, shown", [('"3"', "'3' (str)"), ("-0.3 * duration_ms", None),
                                           ("math.nan", "nan (float)"), ("None", "None (NoneType)")])
def test_a_power_models_energy_that_is_not_a_number_at_least_0_is_refused(plugin, capsys, engine, energy, shown):
    code, path = plugin(POWER.format(settings="50.0, 100.0, 1000.0", energy=energy), '[power]\nkind = "bad"\n',
                        "run", engine)
    err = one_line(code, capsys.readouterr().err)
    assert err.startswith(f"{path}: run 'contract': power model 'bad' (plugin {path.stem})'s iteration_j returned "), err
    assert err.endswith(f" J for {FIRST_BATCH}; it must be a finite number >= 0"), err
    if shown is not None:
        assert f"returned {shown} J" in err


@pytest.mark.parametrize("settings, message", [('"50", 100.0, 1000.0', "idle_w is '50' (str)"),
                                               ("50.0, -1.0, 1000.0", "standby_w is -1.0 (float)"),
                                               ("50.0, 100.0, math.inf", "standby_ms is inf (float)")])
def test_a_power_models_settings_are_checked(plugin, capsys, settings, message):
    code, path = plugin(POWER.format(settings=settings, energy="0.3 * duration_ms"), '[power]\nkind = "bad"\n')
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': power model 'bad' (plugin {path.stem})'s {message}; it must be a finite number >= 0")


class Power:
    """A power model of 300 W whose closed forms answer ``run_j`` and ``run_j_peak``."""
    idle_w, standby_w, standby_ms = 50.0, 100.0, 1000.0
    pue = 1.0

    def __init__(self, run_j=None, run_j_peak=None, iteration=None):
        self._run_j, self._peak, self._iteration = run_j, run_j_peak, iteration
        if run_j is not None:
            self.run_j = lambda batch, k, d0, inc: self._run_j
        if run_j_peak is not None:
            self.run_j_peak = lambda batch, k, d0, inc: self._peak

    def iteration_j(self, batch, duration_ms):
        return 0.3 * duration_ms if self._iteration is None else self._iteration


DECODE = Batch(num_decode=2, decode_context_tokens=40)


@pytest.mark.parametrize("model, message", [
    (Power(run_j=-1.0), "power model Power's run_j returned -1.0 (float) J"),
    (Power(run_j="1"), "power model Power's run_j returned '1' (str) J"),
    (Power(run_j_peak=3.0), "power model Power's run_j_peak returned 3.0 for"),
    (Power(run_j_peak=(3.0, math.nan)), "power model Power's run_j_peak returned nan (float) W (peak)"),
    (Power(iteration=-1.0), "power model Power's iteration_j returned -1.0 (float) J"),
])
def test_a_bulk_runs_energy_is_checked(model, message):
    """The fast engine's bulk decode runs (and a data-parallel rank's dummy steps) ask the closed
    forms, or ``iteration_j`` iteration by iteration."""
    meter = EnergyMeter(model)
    with pytest.raises(SimulationError, match=r"^" + re.escape(message)):
        meter.run(0.0, DECODE, 4, 10.0, 0.5, 43.0)


def test_a_good_bulk_run_passes():
    assert EnergyMeter(Power()).run(0.0, DECODE, 4, 10.0, 1.0, 46.0) == pytest.approx(0.3 * 46.0)


def pipeline_parts():
    return (ContinuousScheduler(ContinuousConfig(max_num_seqs=8)), LinearParallelCost(LinearCostModel(), stages=2),
            CountingKV(4096))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pipelined_instances_meter_checks_each_stages_energy(engine):
    requests = [Request(id=i, arrival_ms=10.0 * i, prompt_tokens=20, output_tokens=4) for i in range(3)]
    with pytest.raises(SimulationError, match=r"^power model Power's iteration_j returned -1.0 \(float\) J for"):
        run_pipelined(requests, pipeline_parts, 2, engine=engine, power=lambda view: Power(iteration=-1.0))


# -- a report's write() ---------------------------------------------------------------------------------------
def test_a_report_whose_write_returns_none_is_named(plugin, capsys):
    code, _ = plugin("""
        class Quiet:
            def write(self, results, out_dir):
                (out_dir / "quiet.txt").write_text("x")

        @schedlab.hookimpl
        def schedlab_register_reports(register):
            register("quiet", Quiet)
        """, reports='"json", "quiet"')
    assert one_line(code, capsys.readouterr().err).startswith(
        "report 'quiet' (Quiet): write() returned None (NoneType); it must return the list of files it wrote ([] for "
        "none); the ")


@pytest.mark.parametrize("reports", ['"json", "broken"', '"broken", "json"'])
def test_a_failing_report_keeps_the_results_and_the_other_reports(plugin, capsys, tmp_path, reports):
    """The simulation's results are not thrown away with a report that raises: the folder is
    committed with what the other reports wrote (and the index), and the error says where. Listed
    before json, it used to skip json, and a folder of index.html alone replaced complete results."""
    code, _ = plugin("""
        class Broken:
            def write(self, results, out_dir):
                raise RuntimeError("report broke midway")

        @schedlab.hookimpl
        def schedlab_register_reports(register):
            register("broken", Broken)
        """, reports=reports)
    err = one_line(code, capsys.readouterr().err)
    out = tmp_path / "out"
    assert ": report 'broken' (plugin contract_plugin_" in err, err
    assert "raised RuntimeError: report broke midway" in err, err
    files = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))  # (not the folder's marker)
    assert err.endswith(f"; the {len(files)} files the other reports wrote are in {out}"), (err, files)
    assert {"summary.json", "requests.csv", "index.html"} <= set(files)


def test_a_reports_own_keyboard_interrupt_keeps_the_results(plugin, capsys, tmp_path):
    """It read as Ctrl-C, and the results of the whole run were thrown away with it."""
    code, _ = plugin("""
        class Stops:
            def write(self, results, out_dir):
                raise KeyboardInterrupt

        @schedlab.hookimpl
        def schedlab_register_reports(register):
            register("stops", Stops)
        """, reports='"json", "stops"')
    err = one_line(code, capsys.readouterr().err)
    assert re.search(r": report 'stops' \(plugin contract_plugin_\d+\) raised KeyboardInterrupt \(", err), err
    assert (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize("body, message", [
    ("return [1, 2]", "write() returned 1 (int) among its files; it must return the list of files it wrote, as paths"),
    ("return [out_dir / 'never.txt']", "write() returned never.txt, which is not there; it must return the files it "
                                       "wrote"),
    ("(out_dir / 'own.txt').write_text('x')\nreturn ['own.txt', 'missing.txt']",
     "write() returned missing.txt, which is not there; it must return the files it wrote"),
    ("(out_dir.parent / 'escaped.txt').write_text('x')\nreturn [out_dir.parent / 'escaped.txt']",
     "write() returned {parent}/escaped.txt, outside the results folder; a report writes into the out_dir it is given"),
    ("for p in out_dir.iterdir():\n    p.unlink()\nreturn []",
     "{gone} of the files the reports before it wrote are gone after it ran (summary.json, ...); a report writes "
     "files of its own"),
])
def test_a_reports_files_are_checked_not_only_counted(plugin, capsys, tmp_path, body, message):
    """'10 files written' counted a report's [1, 2], a file it never wrote, one outside the folder,
    and the files of the reports before it that it deleted."""
    code, _ = plugin(f"""
        class Odd:
            def write(self, results, out_dir):
                {textwrap.indent(body, " " * 16).lstrip()}

        @schedlab.hookimpl
        def schedlab_register_reports(register):
            register("odd", Odd)
        """, reports='"json", "odd"')
    err = one_line(code, capsys.readouterr().err)
    out = tmp_path / "out"
    left = sorted(p.name for p in out.iterdir() if not p.name.startswith(".") and p.name != "own.txt")
    count = f"{len(left)} file" + ("s" if len(left) != 1 else "")
    gone = re.match(r"report 'odd' \(Odd\): (\d+) of", err)
    assert err == (f"report 'odd' (Odd): {message.format(parent=tmp_path, gone=gone and gone[1])}; the {count} "
                   f"the other reports wrote are in {out}")
    if gone:  # (the json report's files, every one of them; the index is written after)
        assert int(gone[1]) >= 3 and left == ["index.html"]


def test_a_report_may_name_its_files_relative_to_its_folder(plugin, capsys, tmp_path):
    code, _ = plugin("""
        class Relative:
            def write(self, results, out_dir):
                (out_dir / "mine.txt").write_text("x")
                return ["mine.txt"]

        @schedlab.hookimpl
        def schedlab_register_reports(register):
            register("relative", Relative)
        """, reports='"json", "relative"')
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "mine.txt").read_text() == "x"


# -- an observer of finished runs --------------------------------------------------------------------------------
@pytest.mark.parametrize("change", ["result.metrics['throughput_tps'] = -1.0",  # (the table showed -1)
                                    "result.requests['first_token_ms'][0] = 0.0",
                                    "result.meta['note'] = 'mine'"])
def test_a_run_finished_hook_that_changes_the_result_is_refused(plugin, capsys, change):
    code, path = plugin(f"""
        @schedlab.hookimpl
        def schedlab_run_finished(run_name, result):
            {change}
        """)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': a schedlab_run_finished hook (plugin {path.stem}) changed the run's result; the hook "
        "observes results -- it may copy what it wants to change")


def test_a_run_finished_hook_that_reads_the_result_is_fine(plugin, capsys, tmp_path):
    code, _ = plugin("""
        SEEN = []

        @schedlab.hookimpl
        def schedlab_run_finished(run_name, result):
            SEEN.append((run_name, len(result.requests["first_token_ms"]), dict(result.metrics)))
            SEEN[-1][2]["throughput_tps"] = -1.0  # (its own copy)
        """)
    assert code == 0, capsys.readouterr().err
    assert '"throughput_tps": -1' not in (tmp_path / "out" / "summary.json").read_text()


# -- a factory registered as an instance -----------------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "validate"])
def test_registering_an_instance_instead_of_a_factory_is_named(plugin, capsys, command):
    code, path = plugin("""
        from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("made", ContinuousScheduler(ContinuousConfig()))
        """, '[scheduler]\nkind = "made"\n', command)
    err = one_line(code, capsys.readouterr().err)
    assert err.startswith(f"{path}: [experiment] plugins: scheduler 'made' (plugin contract_plugin_"), err
    assert err.endswith("): the factory registered is a ContinuousScheduler object, not callable; register the class "
                        "or a function that makes one (register('made', ContinuousScheduler, config=...))"), err


def test_presets_register_specs_not_factories():
    registry = Registry("model")
    registry("spec", SimpleNamespace(name="spec"))
    assert "spec" in registry
    with pytest.raises(ConfigError, match=r"^router 'r' \(plugin m\): the factory registered is a object object, not"):
        Registry("router").providing("m")("r", object())


# -- a KV cache that hands out more blocks than it has --------------------------------------------------------
class CountingKV:
    """A count-only KV cache; ``overcommit``: its allocate() says yes past its capacity."""

    block_size = 16

    def __init__(self, num_blocks: int, overcommit: bool = False):
        self.num_blocks, self.used, self.overcommit = num_blocks, 0, overcommit

    def num_free_blocks(self):
        return self.num_blocks - self.used

    def num_used_blocks(self):
        return self.used

    def cached_tokens(self, seq):
        return 0

    def blocks_needed(self, seq, n, *, cached_tokens=0, reserve_tokens=0):
        want = max(-(-(seq.num_computed_tokens + cached_tokens + n) // 16), -(-reserve_tokens // 16))
        return max(0, want - (seq.kv_state or 0))

    def allocate(self, seq, n, *, cached_tokens=0, reserve_tokens=0):
        need = self.blocks_needed(seq, n, cached_tokens=cached_tokens, reserve_tokens=reserve_tokens)
        if need > self.num_free_blocks() and not self.overcommit:
            return False
        self.used += need
        seq.kv_state = (seq.kv_state or 0) + need
        return True

    def free(self, seq, *, preempted=False):
        self.used -= seq.kv_state or 0
        seq.kv_state = 0


KV_PLUGIN = """
from test_plugin_contracts_more import CountingKV

@schedlab.hookimpl
def schedlab_register_kv_caches(register):
    register("count", lambda: CountingKV(64, overcommit=True))
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_kv_cache_that_takes_more_than_it_has_is_blamed(plugin, capsys, engine):
    code, path = plugin(KV_PLUGIN, '[kv_cache]\nkind = "count"\n', engine=engine,
                        workload=WORKLOAD_TABLE.format(n=20, prompt=400, rate=10000))
    err = one_line(code, capsys.readouterr().err)
    assert err.startswith(f"{path}: run 'contract': kv cache 'count' (plugin {path.stem}) reports -"), err
    assert err.endswith(" free blocks of 64: its allocate() took more than it has"), err


@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize("answer, shown", [("None", "None (a NoneType)"), ("-5", "-5 (a int)"), ("2.0", "2.0 (a float)")])
def test_a_kv_caches_blocks_needed_answer_is_checked_when_it_is_built(plugin, capsys, command, answer, shown):
    """None used to fail inside the built-in scheduler that added it up, which was blamed."""
    code, path = plugin(f"""
        from test_plugin_contracts_more import CountingKV

        class Odd(CountingKV):
            def blocks_needed(self, seq, n, *, cached_tokens=0, reserve_tokens=0):
                return {answer}

        @schedlab.hookimpl
        def schedlab_register_kv_caches(register):
            register("count", lambda: Odd(64))
        """, '[kv_cache]\nkind = "count"\n', command)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: [kv_cache]: kv cache 'count' (plugin {path.stem}): its blocks_needed() returned {shown} for a fresh "
        "16-token request; the KVCache protocol wants a whole number of blocks >= 0 (schedlab/protocols.py)")


class ForgetfulKV(CountingKV):
    """Its used count stays at 0 while its free count falls (the timeline drew an empty cache)."""

    def num_used_blocks(self):
        return 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_kv_cache_whose_used_and_free_do_not_add_up_is_blamed(plugin, capsys, engine):
    code, path = plugin(KV_PLUGIN.replace("CountingKV", "ForgetfulKV").replace(", overcommit=True", ""),
                        '[kv_cache]\nkind = "count"\n', engine=engine)
    err = one_line(code, capsys.readouterr().err)
    used_free = re.fullmatch(rf"{re.escape(str(path))}: run 'contract': kv cache 'count' \(plugin {path.stem}\) reports "
                             r"0 used \+ (\d+) free blocks, not the 64 it has: its used and free counts are not kept "
                             r"together \(the KVCache protocol\)", err)
    assert used_free and int(used_free[1]) < 64, err


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pipelined_instances_kv_cache_is_checked_too(engine):
    requests = [Request(id=i, arrival_ms=0.0, prompt_tokens=400, output_tokens=4) for i in range(8)]

    def parts():
        scheduler, cost, _ = pipeline_parts()
        return scheduler, cost, CountingKV(64, overcommit=True)

    with pytest.raises(SimulationError, match=r"^KV cache CountingKV reports -\d+ free blocks of 64"):
        run_pipelined(requests, parts, 2, engine=engine)


def test_a_stall_with_fewer_than_no_free_blocks_names_the_cache():
    kv = CountingKV(64)
    kv.used = 156
    decoding = SimpleNamespace(status="decoding", num_computed_tokens=100, kv_state=7)
    engine = SimpleNamespace(kv=kv, scheduler=object(), running=[decoding], waiting=[], swapped=[], index=0, now=1.0)
    text = stall_message(engine, "why")
    assert "-92/64 KV blocks free; KV cache CountingKV reports fewer than no free blocks: its allocate() may " \
           "have taken more than it has" in text
    assert "must preempt" not in text


# -- a scheduler config's defaults for the run ----------------------------------------------------------------
DEFAULTS_PLUGIN = """
from typing import ClassVar
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

@attrs.frozen
class Cfg(ContinuousConfig):
{body}

@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("mine", ContinuousScheduler, config=Cfg)
"""


@pytest.mark.parametrize("body, message", [
    # a TypeError traceback in the merge
    ("    @staticmethod\n    def run_defaults(gpu, model, table, tensor_parallel=1):\n        return [('max_num_seqs', 4)]",
     "Cfg.run_defaults() returned [('max_num_seqs', 4)] (list); it returns a dict of [scheduler] keys for the run "
     "({} or None for none)"),
    # read as the file's own key: "[scheduler]: unknown key 'max_num_seq'", in a file without it
    ("    @staticmethod\n    def run_defaults(gpu, model, table, tensor_parallel=1):\n        return {'max_num_seq': 4}",
     "Cfg.run_defaults() returned the key 'max_num_seq', which its config has not; it has: "),
    # an attrs field of that name: AttributeError: 'member_descriptor' object has no attribute 'items'
    ("    kv_cache_defaults: dict = {'block_size': 32}",
     "Cfg.kv_cache_defaults is member_descriptor, not a dict: declare it a class attribute (kv_cache_defaults: "
     "ClassVar[dict] = {...}), not a field of the config"),
])
def test_a_scheduler_configs_defaults_for_the_run_are_checked(plugin, capsys, body, message):
    code, path = plugin(DEFAULTS_PLUGIN.format(body=body), '[scheduler]\nkind = "mine"\n', command="validate")
    err = one_line(code, capsys.readouterr().err)
    assert err.startswith(f"{path}: [scheduler]: scheduler 'mine' (plugin {path.stem}): {message}"), err


def test_run_defaults_may_answer_none_and_kv_cache_defaults_apply(plugin, capsys, tmp_path):
    body = ("    kv_cache_defaults: ClassVar[dict] = {'block_size': 32}\n\n    @staticmethod\n"
            "    def run_defaults(gpu, model, table, tensor_parallel=1):\n        return None")
    code, _ = plugin(DEFAULTS_PLUGIN.format(body=body), '[scheduler]\nkind = "mine"\n')
    assert code == 0, capsys.readouterr().err
    found = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [run["meta"]["block_size"] for study in found["studies"] for run in study["runs"]] == [32]


def test_an_admit_past_the_cached_prefix_says_what_to_ask_for():
    """'has 8 tokens to compute, scheduler asked for 40' left out the 32 cached and the fix."""
    from schedlab.engine.plan import admit_count_error

    seq = SimpleNamespace(num_tokens=40, request=SimpleNamespace(id=1))
    assert str(admit_count_error(seq, 40, 32)) == (
        "admit(): request 1 has 8 tokens to compute (40 tokens, 32 of them a cached prefix: admit seq.num_tokens - "
        "plan.cached_tokens(seq) at most), scheduler asked for 40")
    assert str(admit_count_error(seq, 0, 0)) == "admit(): request 1 has 40 tokens to compute, scheduler asked for 0"


@pytest.mark.parametrize("engine", ENGINES)
def test_both_engines_say_the_same_of_an_admit_of_no_tokens(plugin, capsys, engine):
    """The reference engine said 'bad token count 0', the fast one how many there were."""
    code, path = plugin(scheduler_plugin("zero", "Zero", """
        def schedule(self, plan):
            plan.decode_all()
            if plan.waiting:
                plan.admit(plan.waiting.peek(), 0)
        """), '[scheduler]\nkind = "zero"\n', engine=engine)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'contract': admit(): request 0 has 100 tokens to compute, scheduler asked for 0")


def test_a_cache_that_overrides_allocate_but_inherits_grow_is_warned_about(plugin, capsys):
    """The fast engine takes decode steps' blocks through grow(): a subclass of the built-in
    paged cache whose allocate() counted or capped blocks saw 1 allocation where the reference
    engine saw 14, and compare_runs still passed."""
    code, path = plugin("""
        from schedlab_plugins.kv_caches import PagedKVCache

        class Counting(PagedKVCache):
            def __init__(self):
                super().__init__(200)

            def allocate(self, seq, num_new_tokens, **kw):
                return super().allocate(seq, num_new_tokens, **kw)

        class Whole(Counting):
            grow = allocate_decodes = None

        @schedlab.hookimpl
        def schedlab_register_kv_caches(register):
            register("counting", Counting)
            register("whole", Whole)
        """, '[kv_cache]\nkind = "counting"\n', command="validate")
    err = capsys.readouterr().err
    assert code == 0, err
    warned = [line for line in err.splitlines() if "overrides allocate()" in line]
    assert warned == [f"schedlab: warning: kv cache 'counting' (plugin {path.stem}): Counting overrides allocate() but "
                      "inherits grow() and allocate_decodes() from a built-in cache, through which the fast engine "
                      "takes decode steps' blocks: your allocate() is not called for them there; override those too, "
                      "or set grow = allocate_decodes = None"], err


class ForgetsTheIncrement:
    """300 W while busy, whose run_j forgets that a decode run's steps grow (``inc``)."""
    idle_w, standby_w, standby_ms, pue = 50.0, 100.0, 1000.0, 1.0

    def iteration_j(self, batch, duration_ms):
        return 0.3 * duration_ms

    def run_j(self, batch, k, d0, inc):
        return 0.3 * k * d0


def test_a_power_models_wrong_run_j_is_named_by_the_engines_difference():
    """The fast engine reads a decode run's energy from ``run_j``, the reference engine sums its
    iterations: the times agree and the energy does not -- the hint named the scheduler's and the
    cost model's promises only (review s81 plugin, finding 4)."""
    from schedlab.testing import compare_runs, run_engine
    from schedlab_plugins.cost_models import LinearConfig

    requests = [Request(id=i, arrival_ms=5.0 * i, prompt_tokens=20, output_tokens=30) for i in range(4)]
    cost = LinearConfig(prefill_ms_per_token=0.0625, decode_ms_per_step=8.0, per_context_token_ms=0.015625)
    fast, ref = (run_engine(requests, ContinuousScheduler(), LinearCostModel(cost), engine=engine,
                            power=lambda _cost: ForgetsTheIncrement()) for engine in ENGINES)
    assert fast.requests["finish_ms"].tolist() == ref.requests["finish_ms"].tolist()
    with pytest.raises(AssertionError, match=r"energy_j[\s\S]*power model's run_j"):
        compare_runs(fast, ref)
