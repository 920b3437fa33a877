"""What a run warns of while it runs reaches the command once, whichever process ran it: a
worker's warnings used to go to its own stderr and be lost (the profiled model's note that a
batch went past its profile was never seen with ``--jobs`` above 1)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from schedlab.cli import main

BUNDLE = Path(__file__).resolve().parents[1] / "experiments/data/llmservingsim/profiles/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16"

#: two runs whose 3,000-token prompts, four at once in an 8,192-token budget, go past the
#: bundle's 2,048 profiled tokens
EXPERIMENT = f"""
    [experiment]
    name = "past_the_profile"
    reports = ["json"]
    timeline = false
    [workload]
    kind = "synthetic"
    num_requests = 4
    arrival = "all-at-once"
    prompt = {{dist = "fixed", value = 3000}}
    output = {{dist = "fixed", value = 2}}
    [scheduler]
    kind = "vllm"
    max_num_batched_tokens = 8192
    [cost_model]
    kind = "profiled"
    profile = "{BUNDLE}"
    model = "llama-3.1-8b"
    gpu = "rtx-pro-6000"
    [kv_cache]
    model = "llama-3.1-8b"
    gpu = "rtx-pro-6000"
    [[runs]]
    name = "a"
    [[runs]]
    name = "b"
    scheduler = {{max_num_seqs = 3}}
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_warning_raised_in_a_run_is_said_once_by_the_command(tmp_path, capsys, jobs):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(EXPERIMENT))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "-j", jobs]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "ProfileRangeWarning" in line]
    assert len(said) == 1, err  # once for both runs, and not also in Python's own format
    assert said[0].startswith("schedlab: warning: ProfileRangeWarning: ") and "more than 2,048 tokens" in said[0]
    summary = json.loads((out / "summary.json").read_text())
    runs = [run for study in summary["studies"] for run in study["runs"]]
    assert [run["name"] for run in runs] == ["a", "b"]
    for run in runs:  # each run keeps what it warned of with its results
        assert any("more than 2,048 tokens" in text for text in run["meta"]["warnings"]), run["meta"].get("warnings")
