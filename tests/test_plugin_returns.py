"""A plugin's answer the engines read is checked where they read it, on both engines alike: one
line naming the plugin, never a traceback (a forgotten ``return``) or a silently wrong result.

Each plugin is a small module of its own, loaded through ``[experiment] plugins = [...]`` and run
through the command line (``schedlab.cli.main``), as an author meets it: a scheduler's
``limit_request`` (a Request as served: ``max_tokens`` may go down, nothing else may change), a
workload's ``requests(seed)`` and a closed loop's ``on_finish`` (lists of new Requests, arriving
no earlier than the finish that released them, with ids of their own), a router's index (any
integer-like value but a bool) and a cost model's time too small to move the clock.
"""

from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

from schedlab.cli import main

from plugin_packages import one_line

ENGINES = ("fast", "reference")

HEADER = """
import attrs
import numpy as np
import schedlab
from schedlab import Request
from schedlab_plugins.schedulers.continuous import ContinuousConfig, ContinuousScheduler
"""

EXPERIMENT = """
[experiment]
name = "returns"
plugins = ["{module}"]
reports = ["json"]
engine = "{engine}"

{workload}
{tables}"""

SYNTHETIC = """
[workload]
kind = "synthetic"
num_requests = 5
prompt = {dist = "fixed", value = 100}
output = {dist = "fixed", value = 5}
arrival = "poisson"
rate = 10
"""

_numbers = itertools.count()


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``plugin(code, tables, engine, workload=SYNTHETIC)``: write ``code`` as a plugin module of its own
    and an experiment using it, run it; returns (exit status, the experiment's path)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = []

    def make(code: str, tables: str = "", engine: str = "fast", workload: str = SYNTHETIC):
        module = f"returns_plugin_{next(_numbers)}"
        modules.append(module)
        (tmp_path / f"{module}.py").write_text(HEADER + textwrap.dedent(code))
        path = tmp_path / f"{module}.toml"
        path.write_text(EXPERIMENT.format(module=module, engine=engine, workload=textwrap.dedent(workload),
                                          tables=textwrap.dedent(tables)))
        return main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]), path

    yield make
    for module in modules:
        sys.modules.pop(module, None)


# -- a scheduler's limit_request -----------------------------------------------------------------

LIMITER = """
class Limiter(ContinuousScheduler):
    def limit_request(self, request, kv):
        return {answer}

@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("limiter", Limiter, config=ContinuousConfig)
"""

DISAGGREGATED = """
[kv_cache]
kind = "paged"
bytes_per_block = 2097152

[cluster]
mode = "disaggregated"
"""

LAYOUTS = {
    "colocated": '[scheduler]\nkind = "limiter"\n',
    "disaggregated": '[scheduler]\nkind = "limiter"\n' + DISAGGREGATED,
}

NOT_A_REQUEST = "; it returns the request as served: the Request it got, or a copy with a lower max_tokens"


@pytest.mark.parametrize("answer, shown", [("None", "None (NoneType)"), ("{'id': request.id}", "{'id': 0} (dict)")])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("engine", ENGINES)
def test_limit_request_that_returns_no_request(plugin, capsys, answer, shown, layout, engine):
    """A forgotten ``return request`` used to end in an AttributeError traceback (exit 1)."""
    code, path = plugin(LIMITER.format(answer=answer), LAYOUTS[layout], engine)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'returns': {limiter(path)} limit_request returned {shown} for request 0" + NOT_A_REQUEST)


def limiter(path) -> str:
    """How a run names the limiter plugin of experiment ``path`` (its module: the file's stem)."""
    return f"scheduler 'limiter' (plugin {path.stem})'s"


KEPT = "; it may lower max_tokens and set a priority, nothing else (attrs.evolve(request, max_tokens=...) keeps the rest)"


@pytest.mark.parametrize("answer, message", [
    ("attrs.evolve(request, arrival_ms=request.arrival_ms + 1000.0)",
     "changed request 0's arrival_ms from 0.0 to 1000.0" + KEPT),
    ("attrs.evolve(request, prompt_tokens=request.prompt_tokens + 10)",
     "changed request 0's prompt_tokens from 100 to 110" + KEPT),
    ("attrs.evolve(request, output_tokens=request.output_tokens + 10)",
     "changed request 0's output_tokens from 5 to 15" + KEPT),
    ("attrs.evolve(request, id=request.id + 1000)", "changed request 0's id from 0 to 1000" + KEPT),
    ("Request(request.id, request.arrival_ms, request.prompt_tokens, request.output_tokens, max_tokens=3, "
     "request_class='chat')", "changed request 0's request_class from 'default' to 'chat'" + KEPT),
    ("attrs.evolve(request, max_tokens=request.max_output_tokens + 100)",
     "raised request 0's max_tokens from 5 to 105; it may lower max_tokens, never raise it"),
])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("engine", ENGINES)
def test_limit_request_that_changes_what_it_may_not(plugin, capsys, answer, message, layout, engine):
    """Each ran to the end with exit 0 (the kit's check_run calls them violations). A disaggregated
    prefill instance limits the copy vLLM's P/D proxy sends it: one token of answer, max_tokens 1."""
    if layout == "disaggregated":
        message = message.replace("output_tokens from 5 to 15", "output_tokens from 1 to 11").replace(
            "max_tokens from 5 to 105", "max_tokens from 1 to 101")
    code, path = plugin(LIMITER.format(answer=answer), LAYOUTS[layout], engine)
    assert one_line(code, capsys.readouterr().err) == f"{path}: run 'returns': {limiter(path)} limit_request {message}"


@pytest.mark.parametrize("answer", ["attrs.evolve(request, max_tokens=3)", "attrs.evolve(request, priority=1)",
                                    "request"])
@pytest.mark.parametrize("engine", ENGINES)
def test_limit_request_that_lowers_max_tokens_runs(plugin, capsys, answer, engine):
    code, _ = plugin(LIMITER.format(answer=answer), LAYOUTS["colocated"], engine)
    assert code == 0, capsys.readouterr().err


# -- a workload's requests(seed) -----------------------------------------------------------------

NONE_WORKLOAD = """
class Nothing:
    def requests(self, seed):
        self.made = [Request(id=0, arrival_ms=0.0, prompt_tokens=10, output_tokens=2)]   # (forgot to return it)

@schedlab.hookimpl
def schedlab_register_workloads(register):
    register("nothing", Nothing)
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_requests_returning_none(plugin, capsys, engine):
    """``enumerate(None)`` used to fail with a TypeError traceback."""
    code, path = plugin(NONE_WORKLOAD, engine=engine, workload='[workload]\nkind = "nothing"\n')
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'returns': workload 'nothing': requests(seed) returned None (a NoneType); it returns or "
        "yields the run's schedlab.Request objects")


# -- a closed loop's on_finish -------------------------------------------------------------------

CLOSED = """
class Closed:
    closed_loop = True

    def requests(self, seed):
        self.next_id = 2
        return [Request(id=i, arrival_ms=0.0, prompt_tokens=64, output_tokens=4, client=str(i)) for i in range(2)]

    def _new(self, t):
        self.next_id += 1
        return Request(id=self.next_id - 1, arrival_ms=t, prompt_tokens=64, output_tokens=4)

    def on_finish(self, request, now_ms):
        if self.next_id >= 6:
            return []
        return {answer}

@schedlab.hookimpl
def schedlab_register_workloads(register):
    register("closed", Closed)
"""

CLOSED_WORKLOAD = '[workload]\nkind = "closed"\n'

#: a closed loop with and without a client side in between (engine.client and the driver's own queue)
SIDES = {"no client side": "", "client side": "[frontend]\n"}

AS_LIST = "; it returns a list of the requests the finish releases ([] for none)"


@pytest.mark.parametrize("answer, message", [
    ("None", "returned None (a NoneType)" + AS_LIST),
    ("self._new(now_ms)", "returned Request(id=2, "),
    ("{'id': 99}", "returned {'id': 99} (a dict)" + AS_LIST),
    ("[{'id': 99}]", "released {'id': 99} (a dict); it returns a list of schedlab.Request objects"),
    ("[self._new(now_ms / 2)]", "released request 2 at "),
])
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("engine", ENGINES)
def test_on_finish_answers_of_the_wrong_form(plugin, capsys, answer, message, side, engine):
    """None, a lone Request and a dict used to end in tracebacks; a follow-up arriving before the
    finish that released it ran on, its TTFT counted from the past."""
    code, path = plugin(CLOSED.format(answer=answer), SIDES[side], engine, workload=CLOSED_WORKLOAD)
    line = one_line(code, capsys.readouterr().err)
    head = f"{path}: run 'returns': workload Closed's on_finish(request "
    assert line.startswith(head), line
    assert message in line, line
    if "Request(id=2" in message:
        assert line.endswith("(a Request)" + AS_LIST), line
    if "at " in message:
        assert line.endswith("ms, before the finish that released it: a follow-up arrives at now_ms or later"), line


@pytest.mark.parametrize("side", SIDES)
def test_on_finish_messages_agree_between_engines(plugin, capsys, side):
    lines = []
    for engine in ENGINES:
        code, path = plugin(CLOSED.format(answer="[self._new(now_ms / 2)]"), SIDES[side], engine,
                            workload=CLOSED_WORKLOAD)
        lines.append(one_line(code, capsys.readouterr().err).replace(str(path), "FILE"))
    assert lines[0] == lines[1]


@pytest.mark.parametrize("answer, rid", [
    ("[attrs.evolve(request, arrival_ms=now_ms)]", 0),  # the finished request sent again, its id kept
    ("[Request(id=1, arrival_ms=now_ms, prompt_tokens=8, output_tokens=2)]", 1),  # an id the stream gave
])
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("engine", ENGINES)
def test_on_finish_repeating_an_id(plugin, capsys, answer, rid, side, engine):
    """requests.csv used to hold the same id several times, with exit 0."""
    code, path = plugin(CLOSED.format(answer=answer), SIDES[side], engine, workload=CLOSED_WORKLOAD)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'returns': workload Closed gave two requests with id {rid} (on_finish released one of them): "
        "each request of a run has an id of its own")


@pytest.mark.parametrize("answer", ["[self._new(now_ms)]", "(self._new(now_ms + 1.0),)", "iter([])"])
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("engine", ENGINES)
def test_on_finish_of_the_right_form_runs(plugin, capsys, answer, side, engine):
    code, _ = plugin(CLOSED.format(answer=answer), SIDES[side], engine, workload=CLOSED_WORKLOAD)
    assert code == 0, capsys.readouterr().err


# -- a router's index ----------------------------------------------------------------------------

ROUTER = """
class Router:
    def route(self, request, instances):
        return {answer}

@schedlab.hookimpl
def schedlab_register_routers(register):
    register("odd-router", Router)
"""

CLUSTER = '[cluster]\ninstances = 3\nrouter = {kind = "odd-router"}\n'


@pytest.mark.parametrize("answer", ["np.argmin([v.outstanding for v in instances])", "np.int32(2)", "1"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_router_may_return_numpy_integers(plugin, capsys, answer, engine):
    """The reference engine refused ``np.argmin``'s np.int64, which the fast engine took."""
    code, _ = plugin(ROUTER.format(answer=answer), CLUSTER, engine)
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("answer, shown", [("True", "True"), ("np.bool_(False)", "np.False_"), ("1.0", "1.0")])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_router_returning_a_bool_or_float_is_refused(plugin, capsys, answer, shown, engine):
    """The fast engine took ``True`` as instance 1, which the reference refused; the router is named as
    registered (it was its class alone)."""
    code, path = plugin(ROUTER.format(answer=answer), CLUSTER, engine)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'returns': router 'odd-router' (plugin {path.stem}) returned {shown} for request 0; expected an "
        "instance index from 0 to 2")


# -- a cost model's time too small for the clock -------------------------------------------------

TINY = """
class Cost:
    def iteration_ms(self, batch):
        return 1e-300

@schedlab.hookimpl
def schedlab_register_cost_models(register):
    register("tiny", Cost)
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_an_iteration_time_that_does_not_move_the_clock(plugin, capsys, engine):
    """1e-300 ms passed the check (> 0, finite): at t > 0 the clock stood still and requests finished
    the instant they were scheduled (the kit's causality check caught it, ``schedlab run`` did not)."""
    code, path = plugin(TINY, '[cost_model]\nkind = "tiny"\n', engine)
    message = one_line(code, capsys.readouterr().err)
    assert message.startswith(f"{path}: run 'returns': cost model 'tiny' (plugin {path.stem}) returned 1e-300 ms "
                              "for Batch("), message
    assert message.endswith("which does not advance the simulated clock at t=67.9932 ms (below its resolution "
                            "there); iterations must take a time the clock can count"), message


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cost_model_answering_in_float32_keeps_the_clock_in_float64(engine):
    """A cost model may return numpy's float32 (profile tables held as float32 arrays): the engines
    take it as a float. Kept as float32, ``now + duration`` was float32 and the clock fell to its
    precision -- 0.25 ms at an hour (review s81 plugin, finding 1: TPOT 7.25 ms instead of 7.31).
    Steps of 7.3125 ms and prompts at 0.0625 ms a token are exact in both types, so the runs must
    agree exactly; the increment promised for decode runs is read as a float too."""
    import numpy as np

    from schedlab.model import Request
    from schedlab.testing import run_engine
    from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

    class Exact:
        def iteration_ms(self, batch):
            return 7.3125 + 0.0625 * batch.prefill_tokens

        def decode_step_increment(self, batch):
            return 0.0

    class Single(Exact):
        def iteration_ms(self, batch):
            return np.float32(super().iteration_ms(batch))

        def decode_step_increment(self, batch):
            return np.float32(0.0)

    requests = [Request(i, i * 2000.0, 100, 200) for i in range(1800)]  # to 3.6e6 ms
    runs = [run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=8)), cost(), engine=engine)
            for cost in (Exact, Single)]
    assert runs[1].requests["finish_ms"].tolist() == runs[0].requests["finish_ms"].tolist()
    assert runs[0].requests["finish_ms"][-1] == 1799 * 2000.0 + 6.25 + 7.3125 + 199 * 7.3125
    assert runs[1].metrics["tpot_ms"]["p50"] == 7.3125
    assert type(runs[1].metrics["busy_share"]) is float
