"""The search: an evolutionary optimiser over the unit cube of a :class:`~.space.Space`, and
random sampling beside it.

The optimiser comes from Nevergrad (Meta's gradient-free optimisation library; ``pip install
'schedlab[hunt]'``), by name: ``[hunt] optimizer``, default ``PortfolioDiscreteOnePlusOne``.
That is a (1 + 1) evolution strategy whose mutation resamples a few coordinates at a time,
with the mutation rate drawn from a portfolio (Dang and Lehre's fast GA). Why it, measured on
the three shipped hunts with a budget of 400 workloads (``benchmarks/hunt_vs_random.py``):
a workload's badness lives in a few requests -- which arrive together, which is long --
so changing one or two requests' coordinates at a time climbs, where CMA-ES (the ``CMA``
optimiser, which we tried first) moves all ~150 coordinates at once and did no better than the
best of 1,000 random workloads on any of them. The search starts from the best of a uniform
first ``warm_start`` candidates (as random sampling draws them; a twentieth of the budget by
default) -- starting at the cube's centre, every request would share one class. A short warm
start leaves the climb most of the budget: with a quarter (100 of 400) the priority hunt's climb
stalled below the best of 1,000 random workloads (0.31 s against 0.76 s), with a twentieth it
passes it (1.06 s); the other two hunts end where they did.

Candidates are asked ``width`` at a time (``[hunt] batch``, whatever the number of workers) and
told back in order, so a search is deterministic for a seed whatever runs the simulations.
"""

from __future__ import annotations

import contextlib
import gc
import io
import math
import sys
import time
import warnings

import attrs
import numpy as np

from ..errors import ConfigError
from .config import Goal
from .evaluate import Evaluator, Score
from .space import Candidate, Space


@attrs.frozen
class Trial:
    """One evaluated candidate: its number in the search, its point, requests and score."""

    index: int
    x: tuple
    candidate: Candidate
    score: Score


def better(a: Trial, b: Trial | None, goal: Goal) -> bool:
    """True when ``a`` shows the policy worse than ``b`` (a feasible candidate beats an infeasible one)."""
    if b is None:
        return True
    if a.score.feasible != b.score.feasible:
        return a.score.feasible
    if not a.score.feasible:
        return False
    return goal.direction * a.score.value > goal.direction * b.score.value


def best_trial(trials: list[Trial], goal: Goal) -> Trial | None:
    """The first of the worst-for-the-policy feasible trials, or None when none is feasible."""
    best = None
    for trial in trials:
        if better(trial, best, goal):
            best = trial
    return best if best is not None and best.score.feasible else None


class _Run:
    """Book-keeping shared by both searches: budget, trials, progress."""

    def __init__(self, space: Space, evaluator: Evaluator, goal: Goal, budget: int, bar, time_limit_s: float,
                 trials: list[Trial] | None = None):
        self.space, self.evaluator, self.goal = space, evaluator, goal
        self.budget = budget
        self.bar = bar
        self.deadline = time.monotonic() + time_limit_s if time_limit_s > 0 else math.inf
        self.trials: list[Trial] = [] if trials is None else trials  # (the caller's: it keeps them if interrupted)
        self.best: Trial | None = None

    @property
    def left(self) -> int:
        return 0 if time.monotonic() > self.deadline else self.budget - len(self.trials)

    def evaluate(self, points: list[np.ndarray]) -> list[Trial]:
        points = points[:max(0, self.left)]
        candidates = [self.space.decode(x) for x in points]
        scores = [score for score, _ in self.evaluator.evaluate(candidates)]
        made = []
        for x, candidate, score in zip(points, candidates, scores):
            trial = Trial(len(self.trials), tuple(float(v) for v in x), candidate, score)
            self.trials.append(trial)
            made.append(trial)
            if better(trial, self.best, self.goal):
                self.best = trial
        self.bar.update(len(made))
        if self.best is not None and self.best.score.feasible:
            self.bar.set_postfix_str(f"worst {self.best.score.value:.4g}")
        return made

    def found(self, trials: list[Trial]) -> bool:
        return any(t.score.feasible and self.goal.found(t.score.value) for t in trials)


def random_search(space: Space, evaluator: Evaluator, goal: Goal, *, budget: int, seed: int, width: int,
                  bar, time_limit_s: float = 0.0, trials: list[Trial] | None = None) -> list[Trial]:
    """``budget`` uniform candidates of the space, ``width`` at a time (the baseline a search must beat);
    appended to ``trials`` if given, as each batch is scored (an interrupted caller keeps them)."""
    rng = np.random.default_rng([seed, 1])
    run = _Run(space, evaluator, goal, budget, bar, time_limit_s, trials)
    while run.left > 0:
        run.evaluate([rng.random(space.dimension) for _ in range(min(width, run.left))])
    return run.trials


def evolve(space: Space, evaluator: Evaluator, goal: Goal, *, budget: int, seed: int, width: int, bar,
           optimizer: str = "PortfolioDiscreteOnePlusOne", warm_start: int | None = None, time_limit_s: float = 0.0,
           stop_on_counterexample: bool = True, trials: list[Trial] | None = None) -> list[Trial]:
    """The hunt's search (see the module docstring): uniform warm start, then the optimiser;
    ``trials`` as :func:`random_search` has it."""
    ng = nevergrad()
    run = _Run(space, evaluator, goal, budget, bar, time_limit_s, trials)
    rng = np.random.default_rng([seed, 2])
    warm = max(width, budget // 20) if warm_start is None else warm_start  # at least one full batch
    while run.left > 0 and len(run.trials) < warm:
        made = run.evaluate([rng.random(space.dimension) for _ in range(min(width, warm - len(run.trials)))])
        if stop_on_counterexample and run.found(made):
            return run.trials
    if run.left <= 0:
        return run.trials
    start = min(run.trials, key=lambda t: t.score.fitness(goal.direction))
    parametrization = ng.p.Array(init=np.array(start.x), lower=0.0, upper=1.0)
    parametrization.random_state = np.random.RandomState(seed % 2**32)
    search = make_optimizer(ng, optimizer, parametrization, run.left, width)
    while run.left > 0:
        asked = [search.ask() for _ in range(min(width, run.left))]
        made = run.evaluate([np.clip(c.value, 0.0, 1.0) for c in asked])
        for candidate, trial in zip(asked, made):
            search.tell(candidate, trial.score.fitness(goal.direction))
        if stop_on_counterexample and run.found(made):
            break
    return run.trials


def nevergrad():
    """The nevergrad module, or a ConfigError saying how to install it."""
    try:
        import nevergrad as ng
    except ImportError:
        raise ConfigError("schedlab hunt needs Nevergrad: pip install 'schedlab[hunt]'") from None
    return ng


def make_optimizer(ng, name: str, parametrization, budget: int, width: int):
    """Nevergrad's optimiser ``name`` (a ConfigError listing some when it has none by that name)."""
    registry = ng.optimizers.registry
    if name not in registry:
        raise ConfigError(f"[hunt] optimizer: Nevergrad has no optimiser {name!r}; e.g. "
                          f"{', '.join(KNOWN_GOOD)} (ng.optimizers.registry lists them all)")
    unraisable = sys.unraisablehook   # (an optimiser that failed to build complains again when collected)
    sys.unraisablehook = lambda _: None
    try:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # (some print as they fail)
                warnings.simplefilter("ignore")  # e.g. "does not support num_workers > 1" from those that cope
                return registry[name](parametrization=parametrization, budget=budget, num_workers=width)
        except Exception as exc:   # e.g. scipy's NelderMead, BFGS: "does not support parallelization"
            failure = f"{type(exc).__name__}: {exc}"
        gc.collect()   # the half-built optimiser goes while its complaint is silenced
    finally:
        sys.unraisablehook = unraisable
    hint = ("set [hunt] batch = 1 (it asks one workload at a time) or pick another, e.g. "
            if "parallel" in failure else "pick another, e.g. ")
    raise ConfigError(f"[hunt] optimizer: Nevergrad's {name!r} cannot run this search ({failure}); "
                      f"{hint}{', '.join(KNOWN_GOOD)}")


KNOWN_GOOD = ("PortfolioDiscreteOnePlusOne", "DiscreteOnePlusOne", "NGOpt", "CMA", "TwoPointsDE")
