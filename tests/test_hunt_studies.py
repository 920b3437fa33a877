"""The three shipped hunts (experiments/hunt/): each returns a workload worse for the policy
than the best of the random workloads drawn from the same bounds, and its reproducer replays
to the same value with ``schedlab run``'s machinery.

CI compares with 100 random workloads and shrinks with 100 evaluations (about 20 s a file on
two cores); ``python benchmarks/hunt_vs_random.py`` makes the README's comparison with 1,000.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlab.hunt.hunt import hunt_on, load_hunt, replay_value
from schedlab.hunt.report import write_outcome

HUNTS = sorted((Path(__file__).resolve().parent.parent / "experiments" / "hunt").glob("*.toml"))


def test_three_hunts_ship():
    assert [p.name for p in HUNTS] == ["affinity_vs_round_robin.toml", "chunked_ttft.toml",
                                       "priority_starvation.toml"]


@pytest.mark.parametrize("path", HUNTS, ids=lambda p: p.stem)
def test_the_hunt_beats_random_sampling_and_replays(path, tmp_path):
    hunt = load_hunt(path, ["hunt.random=100", "hunt.shrink_budget=100"])
    assert hunt.config.budget == 400, "the default budget"
    outcome = hunt_on(hunt, jobs=2)
    goal = hunt.goal
    random_best = outcome.random_best.score.value
    shrunk = outcome.shrunk_score
    assert shrunk.feasible and len(outcome.random) == 100
    assert goal.direction * shrunk.value > goal.direction * random_best
    assert len(outcome.shrunk.rows) <= len(outcome.worst.candidate.rows)
    write_outcome(hunt, outcome, tmp_path)
    assert replay_value(tmp_path / "counterexample.toml", goal) == shrunk.value
