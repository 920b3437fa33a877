"""One simulation as plain data: built in the parent, executed in any process or on any node.

A :class:`RunTask` carries the resolved run (:class:`~schedlab.study.simulation.RunSpec`: tables,
seed, engine) and a :class:`ContextSpec` -- how to rebuild the plugin catalog and presets
where the task runs (the catalog holds a pluggy manager and cannot travel). Rebuilding costs
a few milliseconds and keeps workers free of state carried from one run to the next.

A worker returns the run's :class:`~schedlab.results.RunResult` (per-request arrays and
metrics, never an engine; what its plugins warned of in ``meta["warnings"]``, which the parent
says again), or a :class:`TaskFailure` holding a user error (bad table, stalled
run), which the parent raises again as itself: one message, no traceback from the worker.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import attrs

from ..capacity import Presets
from ..catalog import BrokenPluginWarning, load_catalog
from ..errors import InputWarning, RunWarning, SchedlabError
from ..registry import PluginConfigWarning
from ..results.records import RunResult
from ..results.stream import RecordSettings
from .simulation import Context, RunSpec, run


@attrs.frozen
class ContextSpec:
    """What rebuilding a :class:`~schedlab.study.simulation.Context` in a worker needs.

    :ivar plugins: modules named in ``[experiment] plugins``, looked for first in ``base_dir``
        (the experiment file's folder), then on ``sys.path`` where tasks run.
    :ivar plugin_objects: plugin objects registered in-process (tests); must pickle.
    :ivar custom_presets: ``[models.*]`` / ``[gpus.*]`` of the experiment, by name.
    """

    plugins: tuple[str, ...]
    plugin_objects: tuple[Any, ...]
    custom_presets: dict[str, Any]
    base_dir: str
    source: str

    def build(self) -> Context:
        with warnings.catch_warnings():  # (an installed plugin left out: said once, where the experiment loaded)
            warnings.simplefilter("ignore", BrokenPluginWarning)
            catalog = load_catalog(self.plugins, plugin_objects=self.plugin_objects, plugin_dir=self.base_dir,
                                   source=self.source)
        presets = Presets.from_catalog(catalog, self.custom_presets)
        return Context(catalog, presets, self.base_dir, self.source)


@attrs.frozen
class RunTask:
    """One simulation: the run, where its plugins come from, and whether to keep a timeline."""

    spec: RunSpec
    context: ContextSpec
    timeline: bool = True
    record: RecordSettings = RecordSettings()


@attrs.frozen
class TaskFailure:
    """A user error raised while running a task, sent back to be raised in the parent."""

    error: SchedlabError


def execute(task: RunTask, context: Context | None = None, observer: Callable | None = None,
            built: list | None = None) -> RunResult | TaskFailure:
    """Simulate ``task``; ``context`` skips the rebuild (in-process runs, which may observe
    iterations through ``observer``); the context the run used is appended to ``built`` (a
    plugin's error is then told by the catalog that built the plugin's objects)."""
    try:
        with warnings.catch_warnings(record=True) as said:
            # every run's own, whatever ran before in this process (the rest as Python's filters say)
            warnings.simplefilter("always", UserWarning)
            warnings.simplefilter("always", RuntimeWarning)
            warnings.simplefilter("ignore", InputWarning)  # (an input's assumption: said where the experiment loaded)
            warnings.simplefilter("ignore", PluginConfigWarning)  # (a plugin's registration or build: said there too)
            ctx = context if context is not None else task.context.build()
            if built is not None:
                built.append(ctx)
            result = run(task.spec, ctx, observer=observer, timeline=task.timeline, record=task.record)
    except SchedlabError as exc:
        return TaskFailure(exc)
    kept = run_warnings(said)
    if kept:
        result.meta["warnings"] = kept
    return result


def run_warnings(said: list) -> list[str]:
    """What a run warned of (``warnings.catch_warnings(record=True)``'s list), each message once,
    in order, as ``"Category: message"``: kept with the run and said again by the main process
    (:class:`~schedlab.errors.RunWarning`)."""
    return list(dict.fromkeys(f"{w.category.__name__}: {' '.join(str(w.message).split())}" for w in said))


def say_run_warnings(outcome) -> None:
    """Say again, in the process that submitted it, what a run warned of (a :class:`RunWarning`
    each: one ``schedlab: warning:`` line per message in a command); nothing for a failure."""
    if isinstance(outcome, RunResult):
        for text in outcome.meta.get("warnings", ()):
            warnings.warn(text, RunWarning, stacklevel=3)
