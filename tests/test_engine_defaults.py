"""What the engine presets turn on when a run does not say: settings that depend on the run's
GPU, as the engines pick them, and the ``vllm`` preset's prefix caching.

The ``vllm`` preset's batch, as vLLM's API server sizes it (``EngineArgs.get_batch_defaults``,
vLLM 0.33): 2,048 tokens / 256 sequences, 8,192 / 1,024 on a GPU of 70 GiB or more that is no
A100, 16,384 / 1,024 from 160 GiB; a defaulted ``max_num_seqs`` never exceeds the token budget.
The ``sglang`` scheduler's ``chunked_prefill_size``, as SGLang 0.5.23 sizes it by the device's
memory. vLLM V1 caches prefixes unless ``--no-enable-prefix-caching``: the ``vllm`` preset turns
``prefix_caching`` on in a ``paged`` cache that leaves it out. A table's own values win."""

from __future__ import annotations

import textwrap

import pytest

from schedlab.capacity import GpuSpec
from schedlab.study.experiment import load, run_experiment
from schedlab.study.simulation import assemble
from schedlab_plugins.schedulers.presets import VllmConfig
from schedlab_plugins.schedulers.sglang import SglangConfig

RUN = """
    [workload]
    kind = "synthetic"
    num_requests = 6
    rate = 5
    prompt = {{dist = "fixed", value = 100}}
    output = {{dist = "fixed", value = 10}}
    [scheduler]
    kind = "{kind}"
    {scheduler}
    [cost_model]
    kind = "roofline"
    model = "{model}"
    gpu = "{gpu}"
    [kv_cache]
    kind = "paged"
    model = "{model}"
    gpu = "{gpu}"
    {kv_cache}
"""


def run_text(gpu: str, scheduler: str = "", kind: str = "vllm", model: str = "llama-3-8b", kv_cache: str = "") -> str:
    """A six-request run of ``kind`` on ``model`` and ``gpu`` (``scheduler``, ``kv_cache``: more keys
    of those tables, one per line)."""
    return textwrap.dedent(RUN.format(kind=kind, model=model, gpu=gpu, scheduler=scheduler, kv_cache=kv_cache))


def gpu(name: str, memory_gib: float) -> GpuSpec:
    return GpuSpec(name, memory_gib=memory_gib, hbm_bandwidth_gbps=1000, bf16_tflops=100, host_link_gbps=32)


@pytest.mark.parametrize("spec, budget, seqs", [
    (gpu("h100-80gb", 80), 8192, 1024),
    (gpu("a100-80gb", 80), 2048, 256),     # vLLM keeps A100s on the small budget (PR #17885)
    (gpu("my-A100-variant", 96), 2048, 256),
    (gpu("l40s", 48), 2048, 256),
    (gpu("x", 69.9), 2048, 256),
    (gpu("x", 70), 8192, 1024),
    (gpu("b200", 180), 16384, 1024),
    (gpu("x", 160), 16384, 1024),
])
def test_the_tiers(spec, budget, seqs):
    assert VllmConfig.run_defaults(spec, None, {}) == {"max_num_batched_tokens": budget, "max_num_seqs": seqs}


def test_given_values_win_and_a_defaulted_cap_stays_within_the_budget():
    h100 = gpu("h100-80gb", 80)
    assert VllmConfig.run_defaults(h100, None, {"max_num_batched_tokens": 4096, "max_num_seqs": 64}) == {}
    assert VllmConfig.run_defaults(h100, None, {"max_num_seqs": 64}) == {"max_num_batched_tokens": 8192}
    # vLLM: max_num_seqs = min(default, max_num_batched_tokens) when it was not given
    assert VllmConfig.run_defaults(h100, None, {"max_num_batched_tokens": 512}) == {"max_num_seqs": 512}
    assert VllmConfig.run_defaults(gpu("l4", 24), None, {"max_num_batched_tokens": 128}) == {"max_num_seqs": 128}
    # a wrong value is left for the field to report
    assert VllmConfig.run_defaults(h100, None, {"max_num_batched_tokens": "many"}) == {}


def _scheduler_config(tmp_path, gpu_name: str, scheduler: str = ""):
    path = tmp_path / "exp.toml"
    path.write_text(run_text(gpu_name, scheduler))
    exp = load(path)
    return exp, assemble(exp.studies[0].base, exp.context, "x").instances[0][0].config


@pytest.mark.parametrize("gpu_name, budget, seqs", [("h100-80gb", 8192, 1024), ("a100-80gb", 2048, 256),
                                                    ("b200", 16384, 1024), ("rtx-pro-6000-server", 8192, 1024)])
def test_a_run_takes_the_defaults_of_its_gpu(tmp_path, gpu_name, budget, seqs):
    exp, config = _scheduler_config(tmp_path, gpu_name)
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (budget, seqs)
    assert run_experiment(exp).all_runs()[0].meta["slots"] == seqs


def test_a_runs_own_settings_win(tmp_path):
    _, config = _scheduler_config(tmp_path, "h100-80gb", "max_num_seqs = 48\nmax_num_batched_tokens = 1024")
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (1024, 48)
    _, config = _scheduler_config(tmp_path, "h100-80gb", "max_num_batched_tokens = 512")
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (512, 512)


def test_other_schedulers_keep_their_defaults(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(run_text("h100-80gb", kind="continuous"))
    exp = load(path)
    config = assemble(exp.studies[0].base, exp.context, "x").instances[0][0].config
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (8192, 256)  # continuous's own defaults


@pytest.mark.parametrize("memory, size", [(16, 2048), (19.9, 2048), (20, 4096), (24, 4096), (40, 4096), (59.9, 4096),
                                          (60, 8192), (80, 8192), (141, 8192), (159.9, 8192), (160, 16384),
                                          (180, 16384)])
def test_sglang_sizes_its_chunks_by_the_gpus_memory(memory, size):
    assert SglangConfig.run_defaults(gpu("x", memory), None, {}) == {"chunked_prefill_size": size}
    assert SglangConfig.run_defaults(gpu("x", memory), None, {"chunked_prefill_size": 0}) == {}


def test_an_sglang_run_on_an_a100_40gb_chunks_by_4096(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(run_text("a100-40gb", kind="sglang"))
    exp = load(path)
    assert assemble(exp.studies[0].base, exp.context, "x").instances[0][0].config.chunked_prefill_size == 4096


def _kv(tmp_path, scheduler_kind: str, kv_extra: str = ""):
    path = tmp_path / "exp.toml"
    path.write_text(run_text("a100-80gb", kind=scheduler_kind, kv_cache=kv_extra))
    exp = load(path)
    return assemble(exp.studies[0].base, exp.context, "x").instances[0][2]


def test_the_vllm_preset_caches_prefixes_unless_told_not_to(tmp_path):
    kv = _kv(tmp_path, "vllm")
    assert kv.prefix_caching
    kv = _kv(tmp_path, "vllm", "prefix_caching = false")
    assert not kv.prefix_caching
    for other in ("continuous", "vllm-v0", "orca"):  # vLLM V0 and the rest: off, as before
        kv = _kv(tmp_path, other)
        assert not kv.prefix_caching, other
    # a host tier needs the prefix cache: with the vllm preset it needs no more than the tier
    kv = _kv(tmp_path, "vllm", "host_blocks = 64")
    assert kv.prefix_caching and kv.host is not None
