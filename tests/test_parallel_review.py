"""Pipelines and data-parallel ranks, from a review of them: SGLang on a pipeline with clients that
give up (a fast-engine KeyError, and ITL samples that differed from the reference engine's), SGLang
retracting on a pipeline (a reference-engine TypeError), TGI's answer segments on a pipeline
(refused when built, not mid-run), and each stage's KV pool sized from its own weights, as vLLM
sizes it."""

from __future__ import annotations

import math

import pytest

from schedlab.capacity import DEFAULT_ACTIVATION_RESERVE_GIB, GIB, Presets, size_kv_cache
from schedlab.catalog import load_catalog
from schedlab.errors import ConfigError
from schedlab.parallelism import Parallelism
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import fast_run_agreeing_with_reference

SGLANG_PIPELINE = """
[experiment]
name = "review"
[workload]
kind = "synthetic"
num_requests = {n}
rate = {rate}
prompt = {{dist = "uniform", low = 5, high = {prompt}}}
output = {{dist = "uniform", low = 1, high = {output}}}
[scheduler]
kind = "sglang"
[kv_cache]
kind = "{cache}"
model = "{model}"
gpu = "rtx-pro-6000-server"
{blocks}
[cost_model]
kind = "roofline"
model = "{model}"
gpu = "rtx-pro-6000-server"
[cluster]
pipeline_parallel = {stages}
{client}
"""


def _write(tmp_path, **fields):
    values = dict(n=30, rate=50, prompt=200, output=60, cache="paged", model="qwen3-32b", blocks="", stages=2,
                  client="")
    values.update(fields)
    path = tmp_path / "pp.toml"
    path.write_text(SGLANG_PIPELINE.format(**values))
    return path


@pytest.mark.parametrize("fields", [
    # the fast engine raised KeyError: a landing put its decoders back under their own last token, and
    # an abort then looked them up under a later landing's time (the reviewer's first case)
    dict(n=28, prompt=1500, cache="radix", client="[frontend]\n[client]\ntimeout_ms = 2000"),
    # the same misfiling took the abort out of the wrong ITL group: itl_ms.mean 63.74 against 63.04
    dict(stages=3, client="[frontend]\n[client]\ntimeout_ms = 300"),
])
def test_sglang_on_a_pipeline_with_clients_that_give_up_agrees_between_engines(tmp_path, fields):
    run = fast_run_agreeing_with_reference(_write(tmp_path, **fields))
    assert run.metrics["timed_out"] > 0  # (the case is the one with aborts)


def test_sglang_retracting_on_a_pipeline_runs_on_the_reference_engine(tmp_path):
    """80 blocks for 15 requests on 3 stages: SGLang retracts (preempt with discard_in_flight,
    False on a pipeline), which the reference engine's pipeline plan refused as an unknown keyword."""
    path = _write(tmp_path, n=15, rate=10, model="qwen3-30b-a3b", blocks="num_blocks = 80", stages=3, output=200)
    run = fast_run_agreeing_with_reference(path)
    assert run.metrics["num_preemptions"] >= 1 and run.metrics["finished"] == 15


def test_tgi_answer_segments_on_a_pipeline_are_refused_when_the_run_is_built(tmp_path):
    """TGI requeues an answer at every ``generation_segment`` (1,024 tokens), which a pipeline's
    batch in flight does not model: the run stopped mid-way at the first long answer; now it is
    refused by name before it starts, and ``generation_segment = 0`` runs."""
    text = _write(tmp_path).read_text().replace('kind = "sglang"', 'kind = "tgi"')
    path = tmp_path / "tgi.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        run_experiment(load(path))
    assert str(err.value) == (
        f"{path}: [scheduler]: generation_segment = 1024: an answer longer than that is requeued, which is not "
        "modelled with [cluster] pipeline_parallel = 2; set generation_segment = 0 (whole answers) or run without "
        "pipeline_parallel (TGI's launcher has no pipeline parallelism)")
    path.write_text(text.replace('kind = "tgi"', 'kind = "tgi"\ngeneration_segment = 0'))
    assert run_experiment(load(path)).all_runs()[0].metrics["finished"] == 30


def test_each_stage_is_sized_from_its_own_weights_and_the_smallest_sets_the_blocks():
    """Llama-3.1-8B on an RTX 4090 in 4 stages of 8 layers: the first stage holds the input
    embedding and the last the LM head (128,256 x 4,096 each, bf16), the middle ones neither, so
    the two ends have the fewest blocks -- vLLM gives every rank the smallest rank's count. Sized
    from the average stage's weights the pool was 3.1% larger."""
    presets = Presets.from_catalog(load_catalog(entry_points=False))
    model, gpu = presets.model("llama-3.1-8b"), presets.gpu("rtx-4090")
    sizing = size_kv_cache(model, gpu, parallelism=Parallelism(pipeline_parallel=4))
    table = 128_256 * 4_096 * 2                                   # one table, bf16
    body = model.num_params * 2 - 2 * table                       # the 32 layers (and norms)
    usable = math.floor(gpu.memory_bytes * 0.9)
    reserve = math.ceil(DEFAULT_ACTIVATION_RESERVE_GIB * GIB)
    per_block = 2 * 8 * 8 * 128 * 2 * 16                          # K and V, 8 layers, 8 heads x 128, bf16, 16 tokens
    ends = (usable - math.ceil(body / 4 + table) - reserve) // per_block
    middle = (usable - math.ceil(body / 4) - reserve) // per_block
    assert middle > ends and sizing.num_blocks == ends
    assert sizing.bytes_per_block == per_block and sizing.weight_bytes == math.ceil(body / 4 + table)
    even = (usable - math.ceil(model.weight_bytes(1) / 4) - reserve) // per_block   # the average stage (before)
    assert even / ends == pytest.approx(1.031, abs=0.001)
    # two stages: one table each, as before
    two = size_kv_cache(model, gpu, parallelism=Parallelism(pipeline_parallel=2))
    assert two.num_blocks == (usable - math.ceil(body / 2 + table) - reserve) // (2 * per_block)
