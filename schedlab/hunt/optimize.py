"""The search: CMA-ES over the unit cube of a :class:`~.space.Space`, and random sampling beside it.

Why CMA-ES (the ``cma`` package, N. Hansen's reference implementation): a hunt's space has
one coordinate per request field (a hundred or more), its objective is a noisy-looking,
non-smooth function of them, and a budget of a few hundred evaluations is all it gets. CMA-ES
learns which coordinates move the objective together (the covariance) from a population of
~20 candidates per generation, which is also the batch that runs in parallel; it ranks
candidates only (constraint violations can rank below every feasible candidate), and its ask/tell
loop leaves budget, time limit, progress and stopping to us. scipy's differential evolution
would need a population of several times the dimension to work as well; Hypothesis's
``target()`` evaluates one example at a time.

Both searches are deterministic for a seed: the optimiser's random state is seeded, and
scores come back in submission order whatever runs them. The first generation is drawn
uniformly (as random sampling draws), and CMA-ES starts from its best candidate; when it
stalls it restarts from a fresh uniform generation.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import attrs
import numpy as np

from .config import Goal
from .evaluate import Evaluator, Score
from .space import Candidate, Space

SIGMA0 = 0.25  # initial step, a quarter of every coordinate's range


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

    def __init__(self, space: Space, evaluator: Evaluator, goal: Goal, budget: int, bar, time_limit_s: float):
        self.space, self.evaluator, self.goal = space, evaluator, goal
        self.budget = budget
        self.bar = bar
        self.deadline = time.monotonic() + time_limit_s if time_limit_s > 0 else math.inf
        self.trials: list[Trial] = []
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
                  bar, time_limit_s: float = 0.0) -> list[Trial]:
    """``budget`` uniform candidates of the space, ``width`` at a time (the baseline a search must beat)."""
    rng = np.random.default_rng([seed, 1])
    run = _Run(space, evaluator, goal, budget, bar, time_limit_s)
    while run.left > 0:
        run.evaluate([rng.random(space.dimension) for _ in range(min(width, run.left))])
    return run.trials


def cma_search(space: Space, evaluator: Evaluator, goal: Goal, *, budget: int, seed: int, population: int = 0,
               bar, time_limit_s: float = 0.0, stop_on_counterexample: bool = True,
               on_generation: Callable[[list[Trial]], None] | None = None) -> list[Trial]:
    """CMA-ES from the best of a uniform first generation; restarts when it stalls (see the module docstring)."""
    import cma

    run = _Run(space, evaluator, goal, budget, bar, time_limit_s)
    dimension = space.dimension
    popsize = population or 4 + int(3 * math.log(dimension))
    rng = np.random.default_rng([seed, 2])
    restart = 0
    while run.left > 0:
        first = run.evaluate([rng.random(dimension) for _ in range(popsize)])
        if (stop_on_counterexample and run.found(first)) or run.left <= 0:
            break
        start = min(first, key=lambda t: t.score.fitness(goal.direction))
        es = cma.CMAEvolutionStrategy(np.array(start.x), SIGMA0, {
            "bounds": [0.0, 1.0], "popsize": popsize, "seed": seed * 1000 + restart + 1, "verbose": -9,
            "tolfun": 0.0, "tolfunhist": 0.0, "tolflatfitness": 10**9, "tolx": 1e-9})
        restart += 1
        while run.left > 0 and not es.stop():
            asked = es.ask()
            made = run.evaluate([np.clip(np.asarray(x), 0.0, 1.0) for x in asked])
            fitness = [t.score.fitness(goal.direction) for t in made]
            fitness += [2 * 1e150] * (len(asked) - len(made))  # not evaluated: out of budget
            es.tell(asked, fitness)
            if on_generation is not None:
                on_generation(made)
            if stop_on_counterexample and run.found(made):
                return run.trials
        if stop_on_counterexample and run.found(run.trials):
            break
    return run.trials
