"""A run whose [kv_cache] and [cost_model] name different GPUs or models is said (one line, once),
not refused: a newcomer sweeping ``cost_model.gpu`` alone timed L40S steps on an H100-sized cache."""

from __future__ import annotations

import pytest

from schedlab.cli import main

RUN = """
[experiment]
name = "two"
reports = ["json"]
[workload]
kind = "synthetic"
num_requests = 3
rate = 5.0
prompt = {{dist = "fixed", value = 10}}
output = {{dist = "fixed", value = 4}}
[cost_model]
kind = "roofline"
model = "llama-3.1-8b"
gpu = "{cost_gpu}"
[kv_cache]
kind = "paged"
model = "{cache_model}"
gpu = "h100-80gb"
{sweep}
"""


def warnings_of(tmp_path, capsys, *, cost_gpu="h100-80gb", cache_model="llama-3.1-8b", sweep="") -> list[str]:
    path = tmp_path / "two.toml"
    path.write_text(RUN.format(cost_gpu=cost_gpu, cache_model=cache_model, sweep=sweep))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "-j", "2"]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("schedlab: warning")]


def test_the_same_gpu_written_two_ways_is_no_warning(tmp_path, capsys):
    assert warnings_of(tmp_path, capsys, cost_gpu="H100-80GB") == []


def test_a_cache_of_a_measured_block_count_is_not_sized_from_its_gpu(tmp_path, capsys):
    """vllm_validation.toml replays an RTX 4090 run with its measured 2,588 blocks under defaults
    that name another GPU: nothing to say."""
    assert warnings_of(tmp_path, capsys, cost_gpu="l40s", sweep="num_blocks = 500") == []  # (in [kv_cache])


@pytest.mark.parametrize("key, cost_gpu, cache_model, shown", [
    ("gpu", "l40s", "llama-3.1-8b", "gpu = 'h100-80gb' but [cost_model] gpu = 'l40s'"),
    ("model", "h100-80gb", "llama-2-7b", "model = 'llama-2-7b' but [cost_model] model = 'llama-3.1-8b'"),
])
def test_two_gpus_or_models_are_said_once(tmp_path, capsys, key, cost_gpu, cache_model, shown):
    said = warnings_of(tmp_path, capsys, cost_gpu=cost_gpu, cache_model=cache_model,
                       sweep='[sweep]\n"scheduler.max_num_seqs" = [4, 8]')   # two points, two workers: said once
    assert said == [f"schedlab: warning: {tmp_path / 'two.toml'}: [kv_cache] {shown}: the cache is sized for one and "
                    f"the steps are timed on the other; name the same {key} in both (a sweep or --set of one changes "
                    "only that one)"]


def test_a_cache_left_unsized_beside_a_cost_models_model_and_gpu_is_said(tmp_path, capsys):
    """No [kv_cache] model, gpu or num_blocks: the run had the default 16,384 blocks, with no word."""
    path = tmp_path / "two.toml"
    path.write_text(RUN.format(cost_gpu="h100-80gb", cache_model="llama-3.1-8b", sweep="").replace(
        'model = "llama-3.1-8b"\ngpu = "h100-80gb"\n\n', "").replace('[kv_cache]\nkind = "paged"\n', ""))
    assert "[kv_cache]" not in path.read_text()
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().err == (
        f"schedlab: warning: {path}: [kv_cache] names no model and gpu (nor num_blocks): the cache has the default "
        "16384 blocks, not a pool sized for [cost_model]'s llama-3.1-8b on h100-80gb; name them (and "
        "tensor_parallel) in [kv_cache] too\n")


def test_a_run_records_the_scheduler_settings_it_ran_with(tmp_path):
    """[scheduler] kind = "vllm" alone runs with what vLLM picks on an H100 (8,192 tokens, 1,024
    sequences, the model's context): summary.json's meta says so, where config.json keeps the
    table as written."""
    import json

    path = tmp_path / "two.toml"
    path.write_text(RUN.format(cost_gpu="h100-80gb", cache_model="llama-3.1-8b", sweep="")
                    + '[scheduler]\nkind = "vllm"\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    ran = summary["studies"][0]["runs"][0]["meta"]["scheduler"]
    assert (ran["max_num_batched_tokens"], ran["max_num_seqs"], ran["max_model_len"], ran["chunked_prefill"]) == (
        8192, 1024, 131072, True)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["two"]["scheduler"] == {"kind": "vllm"}
