"""Studies -> tasks -> results: what to run, in which order, and how results come together.

Each study of an experiment gets a *driver* (:mod:`.drivers`): single runs and sweeps know all
their points at once; a search asks for a few values at a time (:mod:`.speculative`); a
capacity plan drives one search per candidate (:mod:`.planner`). A point with
``replicas = K`` becomes K tasks with derived seeds, combined when the last returns
(:mod:`.replicas`).

The runner keeps at most ``executor.workers`` tasks in flight, searches' probes first (they
are on the critical path), and hands every result to its driver. Drivers store results by
position -- sweep point index, search value -- never by arrival, so the assembled
:class:`~schedlab.results.ExperimentResults` are the same for every executor and job count.
One progress bar counts every simulation of the experiment.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import pickle
import time
import types
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from ..errors import PluginError, SimulationError
from ..interrupts import wait_first
from ..progress import progress
from ..results.records import ExperimentResults, RunResult
from .drivers import FixedDriver, StudySearchDriver
from .executor import Executor
from .planner import PlanDriver
from .simulation import _tables_with_defaults, check_warmup
from .spec import point_spec
from .tasks import ContextSpec, RunTask, TaskFailure, say_run_warnings


def make_driver(exp, spec, width: int):
    if spec.sweep is not None:
        return FixedDriver(spec.name, "sweep", [point_spec(spec, p) for p in spec.sweep], spec.replicas,
                           keys=tuple(spec.sweep[0]) if spec.sweep else ())
    if spec.search is not None:
        return StudySearchDriver(exp, spec, width)
    if getattr(spec, "plan", None) is not None:
        return PlanDriver(exp, spec, width)
    return FixedDriver(spec.name, "run", [spec.base], spec.replicas)


def context_spec(exp) -> ContextSpec:
    ctx = exp.context
    return ContextSpec(tuple(exp.config.plugins), tuple(exp.plugin_objects), dict(exp.custom_presets),
                       ctx.base_dir, ctx.source)


def run_studies(exp, executor: Executor, *, on_run: Callable[[RunResult], None] | None = None) -> ExperimentResults:
    """Run every study of ``exp`` on ``executor``; results in file order."""
    started_at = time.perf_counter()
    hook = exp.context.catalog.hook
    ctx_spec = context_spec(exp)
    drivers = [make_driver(exp, spec, executor.workers) for spec in exp.studies]
    queue: list = []
    order = itertools.count()
    in_flight: dict = {}
    simulations = 0

    def enqueue(jobs):
        for job in jobs:
            for index in range(job.tasks):
                heapq.heappush(queue, (job.priority, next(order), index, job))

    for driver in drivers:
        enqueue(driver.start())
    shown = 0
    # tasks finished of the jobs still waiting for others (a replicated run's replicas, a partitioned run's
    # parts) whose driver counts them as they come: the bar moves per simulation, not per whole run
    partial: dict = {}
    with progress(sum(d.total for d in drivers), exp.name) as bar:
        while True:
            while queue and len(in_flight) < executor.workers:
                _, number, index, job = heapq.heappop(queue)
                if job.cancelled:
                    continue
                task_spec = job.task_spec(index)
                job.started = True
                # the tables as the run resolves them (and as config.json and RunResult.settings hold them)
                hook.schedlab_run_started(run_name=task_spec.name,
                                          settings=_tables_with_defaults(task_spec.tables, exp.context))
                future = executor.submit(RunTask(task_spec, ctx_spec, exp.config.timeline, exp.config.record()))
                in_flight[future] = (number, index, job)
            if not in_flight:
                break
            done = wait_first(list(in_flight))
            for future in sorted(done, key=lambda f: in_flight[f][0]):
                _, index, job = in_flight.pop(future)
                try:
                    outcome = future.result()
                except BrokenProcessPool:  # (a plugin's os._exit(), or a crash of the interpreter)
                    raise SimulationError(f"{exp.context.source}: run {job.task_spec(index).name!r}: the worker "
                                          "process running it died (a plugin called os._exit() or crashed Python); "
                                          "--jobs 1 runs it in this process") from None
                if isinstance(outcome, TaskFailure):
                    raise outcome.error
                simulations += 1
                say_run_warnings(outcome)  # (said here whichever process ran it)
                _announce_finished(hook, outcome, exp.context.source)
                if job.record(index, outcome):
                    partial.pop(job, None)
                    # (a part may measure none: the merged run must)
                    if job.parts > 1 and (job.spec.warmup or job.spec.cooldown):
                        for run in job.replica_results():
                            check_warmup(job.spec, run, f"{exp.context.source}: run {run.name!r}")
                    if on_run is not None:
                        on_run(job.result())
                    enqueue(job.owner.job_done(job))
                elif getattr(job.owner, "counts_tasks", False):
                    partial[job] = partial.get(job, 0) + 1
            for driver in drivers:
                enqueue(driver.refresh())
            bar.total = sum(d.total for d in drivers)
            completed = sum(d.completed for d in drivers) + sum(done // job.parts for job, done in partial.items())
            bar.update(completed - shown)
            shown = completed
    studies = [driver.study() for driver in drivers]
    execution = {"executor": executor.description, "workers": executor.workers, "simulations": simulations,
                 "wall_s": time.perf_counter() - started_at}
    # (the [reports.*] tables the reports ran with, --set included: `schedlab plot` redraws from them)
    settings = {**exp.raw, "reports": exp.report_tables} if exp.report_tables or "reports" in exp.raw else exp.raw
    return ExperimentResults(exp.name, str(exp.path), studies, settings, execution)


def _announce_finished(hook, result: RunResult, source: str) -> None:
    """Call the ``schedlab_run_finished`` hooks with ``result``, and refuse a hook that changed it:
    they observe results (a hook that set a metric to -1 had the table show it)."""
    observers = hook.schedlab_run_finished.get_hookimpls()
    before = _fingerprint(result) if observers else None
    hook.schedlab_run_finished(run_name=result.name, result=result)
    if observers and _fingerprint(result) != before:
        who = [f"plugin {getattr(impl.plugin, '__name__', impl.plugin_name)}" for impl in observers]
        raise PluginError(f"{source}: run {result.name!r}: a schedlab_run_finished hook ({', '.join(who)}) changed the "
                          "run's result; the hook observes results -- it may copy what it wants to change")


def _fingerprint(result: RunResult) -> bytes:
    """A digest of everything ``result`` holds, arrays and all (pickled into the hash, not into memory)."""
    digest = hashlib.blake2b(digest_size=16)
    pickle.Pickler(types.SimpleNamespace(write=digest.update), protocol=pickle.HIGHEST_PROTOCOL).dump(result)
    return digest.digest()
