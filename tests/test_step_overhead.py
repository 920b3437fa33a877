"""The host's share of a step (plugins/cost_models/step_overhead.py), by hand, and as both
cost models compose it with their GPU time."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.configs import from_table
from schedlab.errors import ConfigError
from schedlab.protocols import Batch
from schedlab_plugins.cost_models.roofline import RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.step_overhead import DEFAULTS, GPU_ONLY, StepTiming

PRESETS = Presets.from_catalog(load_catalog(entry_points=False))


@attrs.frozen
class Settings:
    async_scheduling: bool = True
    cuda_graphs: bool = True
    cuda_graph_max_tokens: int = 512
    cuda_graph_prefill: bool = True
    host_step_us: float = 400.0
    host_per_seq_us: float = 20.0
    tp_step_us: float = 150.0
    eager_layer_us: float = 262.0
    async_gap_us: float = 160.0
    overhead_ms: float = 0.0


def test_settings_mirror_the_defaults():
    assert {a.name: a.default for a in attrs.fields(Settings) if a.name != "overhead_ms"} == \
        {name: default for name, (default, _) in DEFAULTS.items()}


def test_synchronous_steps_add_the_host_work_to_the_gpu():
    timing = StepTiming(Settings(async_scheduling=False), layers=32)
    # 400 us + 4 sequences x 20 us = 0.48 ms before a 10 ms GPU step
    assert timing.step_ms(10.0, tokens=4, sequences=4) == pytest.approx(10.48, rel=1e-12)
    timing = StepTiming(Settings(async_scheduling=False, overhead_ms=0.25), layers=32)
    assert timing.step_ms(10.0, tokens=4, sequences=4) == pytest.approx(10.73, rel=1e-12)


def test_asynchronous_steps_hide_the_host_behind_a_longer_gpu_step():
    timing = StepTiming(Settings(), layers=32)
    # the GPU is the longer: its time plus the 160 us gap
    assert timing.step_ms(10.0, tokens=4, sequences=4) == pytest.approx(10.16, rel=1e-12)
    # 256 sequences: the host takes 0.4 + 5.12 = 5.52 ms, longer than a 3 ms GPU step
    assert timing.step_ms(3.0, tokens=256, sequences=256) == pytest.approx(5.52, rel=1e-12)


def test_eager_launches_bound_a_short_gpu_step():
    """Without a CUDA graph each of 32 layers takes 262 us to launch: 8.384 ms, longer than a
    5.1 ms GPU step (Llama-3.1-8B on an H100: 8.4 ms eager, 5.1 ms graphed)."""
    eager = StepTiming(Settings(cuda_graphs=False, async_scheduling=False), layers=32)
    assert eager.launch_ms(1) == pytest.approx(32 * 0.262, rel=1e-12)
    # synchronous: the host's 0.42 ms, then the longer of the GPU and the launches
    assert eager.step_ms(5.1, tokens=1, sequences=1) == pytest.approx(0.42 + 8.384, rel=1e-12)
    graphed = StepTiming(Settings(async_scheduling=False), layers=32)
    assert graphed.step_ms(5.1, tokens=1, sequences=1) == pytest.approx(0.42 + 5.1, rel=1e-12)
    # asynchronous: launches and host work share the interpreter; the GPU waits for them
    eager_async = StepTiming(Settings(cuda_graphs=False), layers=32)
    assert eager_async.step_ms(5.1, tokens=1, sequences=1) == pytest.approx(8.384 + 0.42, rel=1e-12)
    assert eager_async.step_ms(30.0, tokens=1, sequences=1) == pytest.approx(30.16, rel=1e-12)


def test_batches_beyond_the_captured_graphs_are_launched_kernel_by_kernel():
    timing = StepTiming(Settings(cuda_graph_max_tokens=512), layers=10)
    assert timing.launch_ms(512) == 0.0
    assert timing.launch_ms(513) == pytest.approx(2.62, rel=1e-12)


def test_tensor_parallel_adds_the_broadcast_to_the_host_work():
    one = StepTiming(Settings(async_scheduling=False), layers=32, tensor_parallel=1)
    two = StepTiming(Settings(async_scheduling=False), layers=32, tensor_parallel=2)
    assert two.step_ms(10.0, 8, 8) - one.step_ms(10.0, 8, 8) == pytest.approx(0.15, rel=1e-9)


def test_gpu_only_settings_leave_the_gpu_time():
    timing = StepTiming(Settings(**GPU_ONLY), layers=32, tensor_parallel=4)
    for gpu in (0.01, 3.0, 250.0):
        assert timing.step_ms(gpu, tokens=2048, sequences=100) == gpu


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 50.0), st.floats(0.0, 2.0), st.integers(1, 5000), st.integers(1, 600), st.booleans(),
       st.booleans(), st.floats(0.0, 30_000.0), st.floats(0.0, 2000.0))
def test_decode_increment_predicts_every_step_of_a_run(gpu0, inc, steps, n, asynchronous, graphs, host_us,
                                                       eager_us):
    """A decode run whose GPU time grows linearly: the increment holds for the steps it says,
    whether the run starts flat on the host's work or the launches, or grows from the start."""
    timing = StepTiming(Settings(async_scheduling=asynchronous, cuda_graphs=graphs, host_step_us=host_us,
                                 eager_layer_us=eager_us, cuda_graph_max_tokens=64), layers=16)
    first = timing.step_ms(gpu0, n, n)
    increment, held = timing.decode_increment(gpu0, inc, math.inf, n, n)
    assert held >= 1
    for j in {1, min(steps, held - 1), held - 1}:
        if 1 <= j < held:
            assert timing.step_ms(gpu0 + j * inc, n, n) == pytest.approx(first + j * increment, rel=1e-9, abs=1e-12)
    if held < math.inf:
        assert increment == 0.0
        assert timing.step_ms(gpu0 + held * inc, n, n) >= first


def test_the_gpu_own_limit_bounds_the_run():
    timing = StepTiming(Settings(), layers=16)
    assert timing.decode_increment(50.0, 0.5, 7, 4, 4) == (0.5, 7)
    # flat on a 20 ms host for 38 steps (gpu 1 + 0.16 gap + j * 0.5 <= 20 while j < 37.7), capped at 7
    slow_host = StepTiming(Settings(host_step_us=20_000.0, host_per_seq_us=0.0), layers=16)
    assert slow_host.decode_increment(1.0, 0.5, math.inf, 4, 4) == (0.0, 38)
    assert slow_host.decode_increment(1.0, 0.5, 7, 4, 4) == (0.0, 7)


def test_roofline_steps_compose_with_the_gpu_time_by_hand():
    """Llama-3-8B on an A100: a decode step of 4 sequences is the GPU's time plus the 160 us
    gap (the host's 0.48 ms hides behind it); synchronous, the host's time adds."""
    model, gpu = PRESETS.model("llama-3-8b"), PRESETS.gpu("a100-80gb")
    bare = RooflineCostModel(model, gpu, RooflineConfig(model=model.name, gpu=gpu.name, **GPU_ONLY))
    batch = Batch(num_decode=4, decode_context_tokens=4096)
    gpu_ms = bare.iteration_ms(batch)
    default = RooflineCostModel(model, gpu, RooflineConfig(model=model.name, gpu=gpu.name))
    assert default.iteration_ms(batch) == pytest.approx(gpu_ms + 0.16, rel=1e-12)
    sync = RooflineCostModel(model, gpu, RooflineConfig(model=model.name, gpu=gpu.name, async_scheduling=False))
    assert sync.iteration_ms(batch) == pytest.approx(gpu_ms + 0.48, rel=1e-12)


def test_roofline_request_cost_sums_the_steps_it_times():
    """request_cost's closed form over a request's decode steps (flat on a slow host first,
    then growing) equals the sum of iteration_ms over them."""
    model, gpu = PRESETS.model("llama-3-8b"), PRESETS.gpu("h100-80gb")
    cost = RooflineCostModel(model, gpu, RooflineConfig(model=model.name, gpu=gpu.name, host_step_us=6_500.0))
    for prompt, output in ((10, 3), (2000, 400), (100_000, 50), (50, 20_000)):
        prefill, decode = cost.request_cost(prompt, output)
        assert prefill == pytest.approx(cost.iteration_ms(Batch(num_prefill=1, prefill_tokens=prompt)), rel=1e-12)
        total = sum(cost.iteration_ms(Batch(num_decode=1, decode_context_tokens=prompt + j)) for j in range(1, output))
        assert decode == pytest.approx(total, rel=1e-9)


def test_a_bad_step_setting_names_the_key():
    with pytest.raises(ConfigError, match="cuda_graphs"):
        from_table(RooflineConfig, {"model": "llama-3-8b", "gpu": "a100-80gb", "cuda_graphs": "yes"},
                   where="x.toml: [cost_model]")
    with pytest.raises(ConfigError, match="host_step_us"):
        from_table(RooflineConfig, {"model": "llama-3-8b", "gpu": "a100-80gb", "host_step_us": -1},
                   where="x.toml: [cost_model]")
