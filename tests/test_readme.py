"""The README's plugin example runs as written, and its first lines are the two commands."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from schedlab.study.experiment import load, run_experiment

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
    assert len(code.strip().split("\n")) <= 36
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


def test_plugin_example_admits_after_the_cached_prefix(tmp_path, monkeypatch):
    """The example once admitted ``seq.num_tokens``: with prefix caching the engine stopped the
    run, since only the tokens after the cached prefix are computed."""
    import pytest

    from schedlab.errors import SimulationError
    from schedlab.model import Request
    from schedlab.testing import check_run, run_engine
    from schedlab_plugins.kv_caches import PrefixKVCache

    code = next(b for b in blocks("python") if "shortest_prompt.py" in b)
    (tmp_path / "shortest_prompt.py").write_text(code)
    (tmp_path / "old_shortest_prompt.py").write_text(
        code.replace("seq.num_tokens - plan.cached_tokens(seq)", "seq.num_tokens"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import old_shortest_prompt
        import shortest_prompt
    finally:
        sys.modules.pop("shortest_prompt", None)
        sys.modules.pop("old_shortest_prompt", None)
    # a shared 64-token system prompt: later requests find its 4 blocks cached
    requests = [Request(id=i, arrival_ms=100.0 * i, prompt_tokens=80 + i, output_tokens=5, prefix_group=0,
                        prefix_tokens=64) for i in range(6)]
    scheduler = shortest_prompt.ShortestPromptFirst(shortest_prompt.ShortestPromptConfig(max_num_seqs=4))
    result = run_engine(requests, scheduler, kv=PrefixKVCache(64, 16))
    check_run(result, requests, max_running=4, kv_blocks=64)
    assert result.metrics["prefix_cache"]["hits"] == 5 * 64
    old = old_shortest_prompt.ShortestPromptFirst(old_shortest_prompt.ShortestPromptConfig(max_num_seqs=4))
    with pytest.raises(SimulationError, match="admit"):
        run_engine(requests, old, kv=PrefixKVCache(64, 16))


def test_a_reserving_plugin_without_rejection_reason_stalls_on_a_request_one_token_too_long(tmp_path, monkeypatch):
    """What the README says about rejection_reason: the engine's default check counts
    prompt + max_tokens - 1 tokens; the example reserves prompt + max_tokens, so it turns away
    what never fits itself -- without that method it would wait for ever."""
    import pytest

    from schedlab.errors import StallError
    from schedlab.model import Request
    from schedlab.testing import run_engine

    (tmp_path / "shortest_prompt.py").write_text(next(b for b in blocks("python") if "shortest_prompt.py" in b))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import shortest_prompt
    finally:
        sys.modules.pop("shortest_prompt", None)
    too_long = [Request(id=0, arrival_ms=0.0, prompt_tokens=60, output_tokens=5)]  # 65 tokens; the cache holds 64
    config = shortest_prompt.ShortestPromptConfig(max_num_seqs=4)
    result = run_engine(too_long, shortest_prompt.ShortestPromptFirst(config), kv_blocks=4, block_size=16)
    assert result.metrics["rejected"] == 1 and result.rejections == {0: "needs 5 KV blocks"}

    class Waiting(shortest_prompt.ShortestPromptFirst):
        rejection_reason = None  # (the engine's own check: prompt + max_tokens - 1 tokens fit)

    with pytest.raises(StallError, match=r"stalled .*; request 0 needs 5 KV blocks for its prompt \+ max_tokens \(65 "
                                         r"tokens\), the cache has 4: a scheduler that reserves the whole answer never "
                                         r"admits it -- give it a rejection_reason"):
        run_engine(too_long, Waiting(config), kv_blocks=4, block_size=16)


def test_slot_utilisation_needs_the_schedulers_slots(tmp_path, monkeypatch):
    from schedlab.model import Request
    from schedlab.testing import run_engine
    from schedlab_plugins.reports.table import _fmt

    (tmp_path / "shortest_prompt.py").write_text(next(b for b in blocks("python") if "shortest_prompt.py" in b))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import shortest_prompt
    finally:
        sys.modules.pop("shortest_prompt", None)
    requests = [Request(id=i, arrival_ms=0.0, prompt_tokens=10, output_tokens=4) for i in range(2)]
    with_slots = shortest_prompt.ShortestPromptFirst(shortest_prompt.ShortestPromptConfig(max_num_seqs=4))
    # 8 tokens in 4 iterations (the first carries both prefills) of 4 slots
    assert run_engine(requests, with_slots).metrics["slot_utilisation"] == 8 / (4 * 4)
    without = shortest_prompt.ShortestPromptFirst(shortest_prompt.ShortestPromptConfig(max_num_seqs=4))
    del without.slots
    assert _fmt(run_engine(requests, without).metrics["slot_utilisation"]) == "-"


def test_the_ml_energy_replay_example_runs(tmp_path):
    """The README's ML.ENERGY example against a small results.json with a power timeline and a
    prometheus.json beside it: every energy statistic compared, both figures drawn."""
    import json

    from schedlab.cli import main

    toml = next(b for b in blocks("toml") if 'kind = "mlenergy"' in b)
    rows = [{"prompt": f"question {i % 5} " * 40, "input_len": 200, "output_len": 60 + 7 * (i % 9), "ttft": 0.2,
             "latency": 2.0, "itl": [0.0] + [0.02] * 10, "success": True, "error": ""} for i in range(300)]
    data = {"max_num_seqs": 64, "completed": 300, "steady_state_duration": 20.0, "steady_state_energy": 24000.0,
            "steady_state_energy_per_token": 0.1, "mean_ttft_ms": 200.0, "mean_itl_ms": 20.0,
            "timeline": {"benchmark_start_time": 0.0, "steady_state_start_time": 2.0, "steady_state_end_time": 22.0,
                         "power": {"device_instant": {g: [[t / 10, 600.0] for t in range(300)] for g in "01"}}},
            "results": rows}
    (tmp_path / "results.json").write_text(json.dumps(data))
    scrape = "vllm:num_requests_running 64\nvllm:num_requests_waiting 100\n"
    (tmp_path / "prometheus.json").write_text(json.dumps({"steady_state_stats": {"vllm:num_requests_running": 63.0},
                                                          "timeline": [{"timestamp": 5.0, "metrics": scrape}]}))
    (tmp_path / "exp.toml").write_text(toml)
    assert main(["run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out")]) == 0
    run = json.loads((tmp_path / "out" / "summary.json").read_text())["studies"][0]["runs"][0]
    simulated = run["metrics"]["vs_target"]["simulated"]
    for name in ("energy.steady_j_per_token", "energy.steady_power_w", "energy.steady_tokens_per_s",
                 "energy.steady_batch"):
        assert np.isfinite(simulated[name]) and simulated[name] > 0, name
    assert simulated["energy.steady_batch"] <= 64
    assert (tmp_path / "out" / "plots" / "measured_power.png").is_file()
    assert (tmp_path / "out" / "plots" / "measured_timeline.png").is_file()
