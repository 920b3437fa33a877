"""A hunt from file to outcome: load it, search, compare with random sampling, shrink, replay.

The workload shrunk and written is the worst over both the search and random sampling (the
search's on a tie): random sampling is the baseline the search is compared with, but a worse
workload it finds is still a counterexample, and the only one when the search found nothing feasible.

:func:`load_hunt` reads a hunt file (an experiment with ``[hunt]``) and checks everything
before anything runs; :func:`run_hunt` does the work on an executor and returns a
:class:`HuntOutcome` (:mod:`.report` writes its files); :func:`replay_value` runs a written
reproducer with ``schedlab run``'s machinery and evaluates the goal on it again.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import attrs

from .. import interrupts
from ..configs import from_table
from ..errors import ConfigError
from ..progress import progress
from ..study.experiment import Experiment, _read_toml, load, run_experiment
from ..study.overrides import parse_assignment, set_dotted
from ..study.runner import context_spec
from ..study.simulation import assemble
from ..study.spec import RUN_TABLES, check_slo
from .config import Goal, HuntConfig, make_goal
from .evaluate import Evaluator, Score, run_spec, setting_run, settings_for
from .expression import namespace, split_name
from .optimize import KNOWN_GOOD, Trial, best_trial, better, evolve, make_optimizer, random_search
from .shrink import ShrinkProgress, shrink_candidate
from .space import Candidate, Space, WorkloadSpace, make_space, workload_stats

#: the placeholder workload a hunt file is loaded with (each candidate brings its own)
PLACEHOLDER = ('workload.kind="inline"', 'workload.requests=[{prompt_tokens = 1, output_tokens = 1}]')
FORBIDDEN = ("workload", "sweep", "search", "plan")


@attrs.define
class Hunt:
    """A loaded hunt file."""

    experiment: Experiment
    config: HuntConfig
    goal: Goal
    space: Space

    @property
    def name(self) -> str:
        return self.experiment.name

    @property
    def runs(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.experiment.studies)


def load_hunt(path: str | os.PathLike, overrides: list[str] = (), *, plugin_objects: tuple = ()) -> Hunt:
    """Read and check a hunt file; ``overrides`` as ``--set`` (``hunt.budget=50`` too)."""
    path = Path(path)
    source = str(path)
    raw = _read_toml(path)
    table = raw.get("hunt")
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: no [hunt] table: a hunt file says what to look for in [hunt] "
                          "(objective or property, [hunt.workload] bounds)")
    entries = raw.get("runs", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{source}: runs must be an array of tables ([[runs]])")  # as load() says
    for key in FORBIDDEN:
        inside = [e.get("name", f"number {i + 1}") for i, e in enumerate(entries)
                  if key in e]
        if key in raw or inside:
            where = f"[{key}]" if key in raw else f"[[runs]] {inside[0]!r}: {key}"
            raise ConfigError(f"{source}: {where}: a hunt file has no {key}; "
                              + ("its workloads come from [hunt.workload]" if key == "workload"
                                 else "each [[runs]] entry is one policy every candidate runs through"))
    rest, hunt_keys = [], []
    for text in overrides:
        key, value = parse_assignment(text)
        if key.startswith("hunt."):
            hunt_keys.append((key, value))
        elif key == "hunt":
            raise ConfigError(f"--set {key}: give a key of the [hunt] table (hunt.budget=50, "
                              "hunt.workload.requests=20)")
        else:
            _check_override(key)
            rest.append(text)
    experiment = load(path, list(rest) + list(PLACEHOLDER), plugin_objects=plugin_objects)

    def merged(keys) -> dict:
        out = table
        for key, value in keys:
            out = set_dotted({"hunt": out}, key, value)["hunt"]
        return out

    try:
        config, goal, space = check_hunt_table(merged(hunt_keys), experiment, source)
    except ConfigError as exc:
        key = _blamed_override(exc, hunt_keys, lambda keys: check_hunt_table(merged(keys), experiment, source))
        if key is None:
            raise
        check_hunt_table(merged(hunt_keys), experiment, f"--set {key}")  # the same error, named after the override
        raise
    return Hunt(experiment, config, goal, space)


def check_hunt_table(table: dict, experiment: Experiment, source: str) -> tuple[HuntConfig, Goal, Space]:
    """The ``[hunt]`` table checked against the experiment's runs; errors name ``source``."""
    where = f"{source}: [hunt]"
    config = from_table(HuntConfig, table, where=where)
    runs = tuple(s.name for s in experiment.studies)
    goal = make_goal(config, runs, where)
    check_settings(config.settings, runs, f"{source}: [hunt.settings]")
    space = make_space(config.workload, config.settings, f"{source}:")
    check_goal_metrics(goal, experiment.studies, space, where)
    check_optimizer(config.optimizer, where, space.dimension, config.batch, config.budget)
    for study in experiment.studies:
        if study.replicas != 1:
            raise ConfigError(f"{source}: [[runs]] {study.name!r}: replicas: a hunt compares one run per policy")
        for end in (0, 1):  # both ends of every setting's range build
            settings = {key: bounds[end] for key, bounds in space.settings.items()}
            probe = Candidate(({"prompt_tokens": 1, "output_tokens": 1, "arrival_ms": 0.0},), settings)
            assemble(run_spec(study, probe, runs), experiment.context, f"{source}: [hunt.settings]", check_only=True)
    return config, goal, space


def _blamed_override(error: ConfigError, keys: list, check) -> str | None:
    """The first ``--set hunt.*`` override (of ``keys``, (key, value) pairs) without which the
    ``[hunt]`` table passes ``check`` or fails differently: the one ``error`` is about; None
    when the file's own table is at fault."""
    for i, (key, _) in enumerate(keys):
        try:
            check(keys[:i] + keys[i + 1:])
        except ConfigError as other:
            if str(other) == str(error):
                continue
        return key
    return None


def _check_override(key: str) -> None:
    """Refuse ``--set workload.*`` (or ``runs.<run>.workload.*``): each candidate brings its
    workload, so the hunt's bounds in ``[hunt.workload]`` are what to change."""
    parts = key.split(".")
    inside = parts[1:] if parts[0] == "workload" else parts[3:] if parts[0] == "runs" and parts[2:3] == ["workload"] \
        else None
    if inside is None:
        return
    fields = [a.name for a in attrs.fields(WorkloadSpace)]
    close = difflib.get_close_matches(inside[0], fields, n=1) if inside else []
    if close and close[0] in ("classes", "prefix"):
        hint = f"give [hunt.workload.{close[0]}] in the file"
    elif close:
        hint = f"set its range with --set hunt.workload.{close[0]}=[low, high]"
    else:
        hint = f"set its bounds with --set hunt.workload.<key>=[low, high], a key among {', '.join(fields)}"
    raise ConfigError(f"--set {key}: a hunt makes every candidate's workload from [hunt.workload]; {hint}")


def check_settings(settings: dict, runs: tuple[str, ...], where: str) -> None:
    """Every ``[hunt.settings]`` key is ``table.key`` or ``runs.<a run>.table.key``, the table a
    run's (not ``workload``: each candidate brings its own); ConfigError naming ``where`` and the key."""
    tables = [t for t in RUN_TABLES if t != "workload"]
    for key in settings:
        rest = key
        if key.startswith("runs."):
            run = setting_run(key, runs)
            if run is None:
                raise ConfigError(f"{where}: {key}: no such run; runs: {', '.join(runs)} "
                                  "(write runs.<run>.<table>.<key>)")
            rest = key[len(f"runs.{run}."):]
        table = rest.split(".")[0]
        if table == "workload":
            raise ConfigError(f"{where}: {key}: a hunt makes every candidate's workload from [hunt.workload]; "
                              "give workload ranges there")
        if table not in tables or "." not in rest:
            raise ConfigError(f"{where}: {key}: write <table>.<key> or runs.<run>.<table>.<key>, the table one of "
                              f"{', '.join(tables)} (e.g. scheduler.max_num_seqs)")


def check_goal_metrics(goal: Goal, studies, space: Space, where: str) -> None:
    """The goal's metrics that only some runs have: ``slo.*`` needs the run's ``[slo]`` targets,
    ``per_class.<class>`` a class of ``[hunt.workload.classes]`` (and several of them)."""
    by_name = {s.name: s for s in studies}
    parts = [("property" if goal.property is not None else "objective", goal.expression)]
    parts += [("constraints", c.expression) for c in goal.constraints]
    classes = [c.name for c in space.classes] if len(space.classes) > 1 else []
    for what, expression in parts:
        for name in expression.names:
            run, metric = split_name(name, tuple(by_name))
            if not run:
                continue
            if not any(key.split(".")[0] == "slo" for key, _ in settings_for(run, space.settings, tuple(by_name))):
                check_slo(metric, [by_name[run]], f"{where} {what}: {name}")
            group, _, rest = metric.partition(".")
            if group == "per_class" and not any(rest.startswith(c + ".") for c in classes):  # (a name may hold dots)
                known = (f"classes: {', '.join(classes)}" if classes else
                         "per_class needs several classes in [hunt.workload.classes]")
                raise ConfigError(f"{where} {what}: {name}: no request class {rest.split('.')[0]!r}; {known}")


def check_optimizer(name: str, where: str, dimension: int, batch: int, budget: int) -> None:
    """Nevergrad has an optimiser ``name`` that builds for this search -- ``dimension``
    coordinates, ``batch`` workloads asked at once (scipy's NelderMead or BFGS refuse several) --
    checked now, not after the warm start's simulations; without Nevergrad installed the search
    says how to install it."""
    try:
        import nevergrad
    except ImportError:
        return
    if name not in nevergrad.optimizers.registry:
        raise ConfigError(f"{where}: optimizer: Nevergrad has no optimiser {name!r}; e.g. {', '.join(KNOWN_GOOD)} "
                          "(nevergrad.optimizers.registry lists them all)")
    try:
        make_optimizer(nevergrad, name, nevergrad.p.Array(shape=(max(1, dimension),), lower=0.0, upper=1.0),
                       max(1, budget), batch)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {str(exc).removeprefix('[hunt] ')}") from None


SEARCH, RANDOM = "search", "random sampling"  # where the worst workload came from
SHRINKING, REPLAYING = "shrinking", "replaying"  # with SEARCH and RANDOM: where an interrupt stopped a hunt


@attrs.define
class HuntOutcome:
    """Everything a hunt found: both searches' trials, the worst workload of both (``worst``,
    found by ``worst_from``: :data:`SEARCH` or :data:`RANDOM`), its shrunk form, and the runs of
    both (with timelines) for the pictures."""

    goal: Goal
    search: list[Trial]
    random: list[Trial]
    worst: Trial | None
    worst_from: str | None = None
    shrunk: Candidate | None = None
    shrunk_score: Score | None = None
    shrink_evaluations: int = 0
    worst_runs: dict | None = None
    shrunk_runs: dict | None = None
    interrupted: str | None = None   # where an interrupt stopped the hunt (SEARCH, RANDOM, SHRINKING, REPLAYING)

    @property
    def search_best(self) -> Trial | None:
        """The search's worst-for-the-policy workload (None without a feasible one)."""
        return best_trial(self.search, self.goal)

    @property
    def random_best(self) -> Trial | None:
        """The worst-for-the-policy random workload (None without a feasible one)."""
        return best_trial(self.random, self.goal)

    @property
    def first_failure(self) -> Trial | None:
        """The first workload (the search's, then random sampling's) on which a run failed --
        stalled, raised, or its settings did not build -- or None: written as ``failure.*``."""
        return next((t for t in self.search + self.random if t.score.error is not None), None)


def worst_of_both(search: list[Trial], sampled: list[Trial], goal: Goal) -> tuple[Trial | None, str | None]:
    """The worst feasible workload of the search and of random sampling, and which found it:
    random sampling's only when strictly worse (or the search has none feasible)."""
    found, sampled_best = best_trial(search, goal), best_trial(sampled, goal)
    if sampled_best is not None and better(sampled_best, found, goal):
        return sampled_best, RANDOM
    return found, None if found is None else SEARCH


def run_hunt(hunt: Hunt, executor) -> HuntOutcome:
    """Search (``budget`` workloads), sample (``random``), shrink the worst of both, replay both with timelines.

    Interrupted (Ctrl-C, SIGTERM), it raises the interrupt with what was found so far as its
    ``hunt_outcome``: the trials evaluated, the worst of them, and when shrinking had begun the
    workload shrunk so far (``interrupted`` says where it stopped)."""
    cfg, goal, space = hunt.config, hunt.goal, hunt.space
    evaluator = Evaluator(hunt.experiment.studies, context_spec(hunt.experiment), goal, executor,
                          allow_rejected=cfg.allow_rejected)
    seed = hunt.experiment.config.seed
    outcome = HuntOutcome(goal, [], [], None)
    phase, shrinking = SEARCH, None
    try:
        with progress(cfg.budget, f"{hunt.name}: search") as bar:
            evolve(space, evaluator, goal, budget=cfg.budget, seed=seed, width=cfg.batch,
                   bar=bar, optimizer=cfg.optimizer, warm_start=cfg.warm_start, time_limit_s=cfg.time_limit_s,
                   stop_on_counterexample=cfg.stop_on_counterexample, trials=outcome.search)
        phase = RANDOM
        samples = random_samples(cfg, len(outcome.search))
        with progress(samples, f"{hunt.name}: random") as bar:
            if samples:
                random_search(space, evaluator, goal, budget=samples, seed=seed, width=cfg.batch, bar=bar,
                              time_limit_s=cfg.time_limit_s, trials=outcome.random)
        worst, worst_from = worst_of_both(outcome.search, outcome.random, goal)
        outcome.worst, outcome.worst_from = worst, worst_from
        if worst is None or (goal.property is not None and not goal.found(worst.score.value)):
            return outcome
        phase, shrinking = SHRINKING, ShrinkProgress(worst.candidate, worst.score)
        with progress(cfg.shrink_budget, f"{hunt.name}: shrink") as bar:
            shrunk, used = shrink_candidate(worst.candidate, space, evaluator, goal, best=worst.score.value,
                                            tolerance=cfg.tolerance, max_evaluations=cfg.shrink_budget, bar=bar,
                                            progress=shrinking)
        phase, shrinking.candidate, shrinking.evaluations = REPLAYING, shrunk, used
        (worst_score, worst_runs), (shrunk_score, shrunk_runs) = evaluator.evaluate([worst.candidate, shrunk],
                                                                                    timeline=True, keep=True)
    except KeyboardInterrupt as exc:
        interrupts.acknowledge()  # seen (a no-op for a plugin's own raise): no second one while this is noted
        outcome.interrupted = phase
        if outcome.worst is None:
            outcome.worst, outcome.worst_from = worst_of_both(outcome.search, outcome.random, goal)
        if shrinking is not None and (shrinking.steps or phase == REPLAYING):
            outcome.shrunk, outcome.shrunk_score = shrinking.candidate, shrinking.score
            outcome.shrink_evaluations = shrinking.evaluations
        exc.hunt_outcome = outcome
        raise
    outcome.shrunk, outcome.shrunk_score, outcome.shrink_evaluations = shrunk, shrunk_score, used
    outcome.worst_runs, outcome.shrunk_runs = worst_runs, shrunk_runs
    return outcome


def random_samples(config: HuntConfig, searched: int) -> int:
    """How many random workloads to draw: ``[hunt] random``, by default as many as the search
    evaluated -- its budget, or fewer where ``time_limit_s`` or a falsified property stopped it --
    so that the two are compared like for like and a stopped search does not go on as sampling."""
    return searched if config.random is None else config.random


def hunt_on(hunt: Hunt, backend: str = "local", jobs: int | None = None, address: str | None = None) -> HuntOutcome:
    """:func:`run_hunt` on the executor of ``--backend``, ``--jobs`` and ``--address``, closed after."""
    from ..study.executor import closing, make_executor

    with closing(make_executor(backend, jobs, address)) as executor:
        return run_hunt(hunt, executor)


def goal_value(goal: Goal, runs: dict, rows) -> float:
    """The goal's expression on finished runs (name -> RunResult) of the workload ``rows``."""
    lookup = namespace({name: r.metrics for name, r in runs.items()}, workload_stats(rows), tuple(runs))
    return goal.expression.value(lookup)


def rows_of(run) -> list[dict]:
    """A finished run's requests as rows (for ``workload.*`` statistics of a replay)."""
    req = run.requests
    return [{"arrival_ms": float(a), "prompt_tokens": int(p), "output_tokens": int(o)}
            for a, p, o in zip(req["arrival_ms"], req["prompt_tokens"], req["output_tokens"])]


def replay_value(path: str | os.PathLike, goal: Goal, *, plugin_objects: tuple = ()) -> float:
    """Run a reproducer file as ``schedlab run`` does and evaluate ``goal`` on its runs."""
    exp = load(path, plugin_objects=plugin_objects)
    results = run_experiment(exp)
    runs = {study.name: study.runs[0] for study in results.studies}
    return goal_value(goal, runs, rows_of(next(iter(runs.values()))))
