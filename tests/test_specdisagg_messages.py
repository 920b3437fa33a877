"""Errors a user of speculation and disaggregated pools meets, named by the table they wrote (from a
review): a mistake in the run's own tables is not blamed on a pool table the file lacks, an
unknown drafter is [speculative.draft]'s, an absurd link is refused by key, and pools whose KV
caches store K and V in different dtypes are refused, as vLLM's NIXL handshake refuses them."""

from __future__ import annotations

import pytest

from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment

BASE = """
[experiment]
name = "d"
reports = []
[workload]
kind = "inline"
requests = [{prompt_tokens = 400, output_tokens = 8, arrival_ms = 0.0}]
[scheduler]
kind = "vllm"
max_num_seqs = 8
[cost_model]
kind = "roofline"
model = "llama-3-8b"
gpu = "h100-80gb"
[kv_cache]
kind = "paged"
model = "llama-3-8b"
gpu = "h100-80gb"
"""
DISAGGREGATED = '[cluster]\nmode = "disaggregated"\n'


def _error(tmp_path, text: str) -> str:
    path = tmp_path / "d.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        run_experiment(load(path))
    return str(err.value).replace(str(path), "d.toml")


def _runs(tmp_path, text: str):
    path = tmp_path / "ok.toml"
    path.write_text(text)
    return run_experiment(load(path)).all_runs()[0]


@pytest.mark.parametrize("old, new, message", [
    ('kind = "paged"', 'kind = "pagedd"', "d.toml: [kv_cache]: unknown kv_cache 'pagedd'"),
    ('kind = "vllm"', 'kind = "vlm"', "d.toml: [scheduler]: unknown scheduler 'vlm'"),
    ("max_num_seqs = 8", "max_num_seqs = 0", "d.toml: [scheduler]: max_num_seqs: must be >= 1, got 0"),
])
def test_a_mistake_in_the_runs_own_table_is_named_there_when_pools_use_it(tmp_path, old, new, message):
    """It said [cluster.prefill.kv_cache], a table the file does not have."""
    assert _error(tmp_path, BASE.replace(old, new) + DISAGGREGATED).startswith(message)


def test_a_mistake_in_a_pools_own_table_is_named_there(tmp_path):
    text = BASE + DISAGGREGATED + "[cluster.decode]\nscheduler = {max_num_seqs = 0}\n"
    assert _error(tmp_path, text).startswith("d.toml: [cluster.decode.scheduler]: max_num_seqs: must be >= 1")


def test_an_unknown_drafter_is_named_in_speculative_draft_not_kv_cache(tmp_path):
    """The KV cache takes the drafter's model to hold its weights (draft_memory): the unknown name
    was reported as [kv_cache]'s, whose model is right."""
    text = BASE + ('[speculative]\nmethod = "eagle"\nnum_speculative_tokens = 3\nacceptance_rate = 0.7\n'
                   'draft = {kind = "roofline", model = "llama-99b", gpu = "h100-80gb"}\n')
    assert _error(tmp_path, text).startswith("d.toml: [speculative.draft]: unknown model 'llama-99b'")


@pytest.mark.parametrize("line, message", [
    ("latency_us = 1e15", "[cluster.link]: latency_us: must be <= 100000000.0, got 1000000000000000.0"),
    ("bandwidth_gbps = 1e-12", "[cluster.link]: bandwidth_gbps: must be >= 0.001, got 1e-12"),
])
def test_an_absurd_link_is_refused_by_its_key(tmp_path, line, message):
    """A transfer 31 years long ran into the clock's limit, blamed on the cost model."""
    assert message in _error(tmp_path, BASE + DISAGGREGATED + f"[cluster.link]\n{line}\n")


def test_pools_with_different_kv_dtypes_are_refused_and_the_same_in_other_words_run(tmp_path):
    fp8 = BASE + DISAGGREGATED + '[cluster.decode]\nkv_cache = {kv_cache_dtype = "fp8"}\n'
    assert _error(tmp_path, fp8).startswith(
        "d.toml: [cluster.decode] kv_cache: kv_cache_dtype = 'fp8' (1 byte an element), but [cluster.prefill] keeps "
        "its KV as 'auto' (2): vLLM's NIXL connector refuses to move KV between caches of different dtypes")
    # the model's own 16 bits, named: the same cache
    same = BASE + DISAGGREGATED + '[cluster.decode]\nkv_cache = {kv_cache_dtype = "bfloat16"}\n'
    assert _runs(tmp_path, same).metrics["finished"] == 1
