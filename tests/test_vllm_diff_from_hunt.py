"""A hunt's counterexample as vLLM-harness cases (``tools/vllm_diff.py --hunt DIR``): the arrivals
put between the same steps as in the hunt's replay, so that the harness's 1-ms schedlab side makes
exactly the replay's schedule -- checked here without vLLM; with it, the harness then compares
vLLM's scheduler on the same cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.vllm_diff.from_hunt import counterexample_cases
from schedlab.vllm_diff.schedlab_side import SchedlabRunner

STUDIES = Path(__file__).resolve().parents[1] / "experiments" / "hunt"


@pytest.mark.parametrize("study, labels", [
    ("priority_starvation.toml", {"priority", "fcfs"}),
    ("chunked_ttft.toml", {"chunked", "off"}),
    ("affinity_vs_round_robin.toml", {"affinity instance 0", "affinity instance 1", "round_robin instance 0",
                                      "round_robin instance 1"}),
])
def test_the_harness_side_replays_the_hunts_schedule_step_by_step(tmp_path, study, labels):
    out = tmp_path / "hunt"
    assert main(["hunt", str(STUDIES / study), "--out", str(out), "--jobs", "1",
                 "--set", "hunt.budget=24", "--set", "hunt.random=24", "--set", "hunt.shrink_budget=16"]) == 0
    cases, skipped = counterexample_cases(out)
    assert {c.label for c in cases} == labels and not skipped
    ours = SchedlabRunner("fast")
    for hc in cases:
        outcomes, error = ours.run(hc.case, hc.sides)
        assert error is None
        steps = {rid: (o.first_scheduled_ms, o.first_token_ms, o.finish_ms, o.preemptions)
                 for rid, o in outcomes.items()}
        assert steps == hc.replay, hc.label
        # every request arrives at the step that first saw it, in the order it arrived
        arrivals = [r.arrival for r in sorted(hc.case.requests, key=lambda r: r.id)]
        assert all(a <= hc.replay[r.id][0] for a, r in zip(arrivals, sorted(hc.case.requests, key=lambda r: r.id)))


def test_a_folder_without_a_counterexample_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"--hunt .*: no counterexample.toml"):
        counterexample_cases(tmp_path)
