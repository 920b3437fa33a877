"""The README's plugin example runs as written, and its first lines are the two commands."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from schedlab.experiment import load, run_experiment

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_opens_with_the_two_commands():
    first = blocks("bash")[0].strip().split("\n")
    assert first == ["pip install -e . && schedlab run experiments/lab.toml --out results/lab",
                     "pip install -e '.[test]' && python -m pytest"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert first[1] in ci


def test_plugin_example_runs_from_toml(tmp_path, monkeypatch):
    code = next(b for b in blocks("python") if "shortest_prompt.py" in b)
    assert len(code.strip().split("\n")) <= 32
    toml = next(b for b in blocks("toml") if 'plugins = ["shortest_prompt"]' in b)
    (tmp_path / "shortest_prompt.py").write_text(code)
    (tmp_path / "data").mkdir()
    lengths = [(300, 5), (20, 5), (100, 5), (10, 5), (50, 5)]
    (tmp_path / "data" / "requests.json").write_text(
        '{"requests": [' + ", ".join(f'{{"prompt_tokens": {p}, "output_tokens": {o}}}' for p, o in lengths) + "]}")
    (tmp_path / "exp.toml").write_text(toml.replace("max_num_seqs = 16", "max_num_seqs = 1"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        run = run_experiment(load(tmp_path / "exp.toml")).all_runs()[0]
    finally:
        sys.modules.pop("shortest_prompt", None)
    assert run.metrics["finished"] == 5
    # one slot: requests are served strictly in order of prompt length
    order = np.argsort(run.requests["first_scheduled_ms"], kind="stable")
    assert [lengths[i][0] for i in order] == [10, 20, 50, 100, 300]


def test_conformance_kit_example_runs_against_the_plugin_example(tmp_path, monkeypatch):
    plugin = next(b for b in blocks("python") if "shortest_prompt.py" in b)
    kit = next(b for b in blocks("python") if "test_shortest_prompt_keeps_the_rules" in b)
    (tmp_path / "shortest_prompt.py").write_text(plugin)
    (tmp_path / "kit_example.py").write_text(
        "from shortest_prompt import ShortestPromptConfig, ShortestPromptFirst\n" + kit)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import kit_example

        kit_example.test_shortest_prompt_keeps_the_rules()   # hypothesis runs its examples
    finally:
        sys.modules.pop("shortest_prompt", None)
        sys.modules.pop("kit_example", None)
