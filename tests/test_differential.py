"""The fast engine against the step-by-step reference engine.

Both run the same plugins on the same requests; per-request timestamps, counters and run
metrics must agree. Costs and arrival times are dyadic (multiples of 1/64 ms), so both
engines' clocks are exact and even ties between arrivals and iteration boundaries resolve
the same way -- the comparison is strict.
"""

from __future__ import annotations

from pathlib import Path

import attrs

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.testing import check_run, compare_runs, dyadic_linear_costs, examples, requests_lists, run_engine
from schedlab.hf_config import spec_from_path
from schedlab.model import Request
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, StaticConfig, StaticScheduler

#: real config.json files (DeepSeek-V3.2: sparse latent attention)
CONFIGS = Path(__file__).parent / "data" / "hf_configs"
SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


linear_costs = dyadic_linear_costs


@st.composite
def continuous_configs(draw):
    max_seqs = draw(st.integers(1, 6))
    allocation = draw(st.sampled_from(["reserve", "grow"]))
    preemption = draw(st.sampled_from(["recompute", "swap"])) if allocation == "grow" else "recompute"
    return ContinuousConfig(
        max_num_seqs=max_seqs,
        max_num_batched_tokens=draw(st.integers(max(max_seqs, 8), 160)),
        chunked_prefill=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5, 17])),
        allocation=allocation,
        preemption=preemption,
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1])),
        prefill_first=draw(st.booleans()),
        running_order=draw(st.sampled_from(["admission", "decodes_first"])),
        reserve_full_prompt=draw(st.booleans()),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        priority_preemption=draw(st.booleans()),
        async_scheduling=preemption == "recompute" and draw(st.booleans()),
        max_model_len=draw(st.sampled_from([0, 0, 0, 0, 48])),
    )


@st.composite
def setups(draw):
    requests = draw(requests_lists(max_size=10, priorities=True))
    if draw(st.booleans()):
        make = lambda: StaticScheduler(StaticConfig(batch_size=draw_batch))  # noqa: E731
        draw_batch = draw(st.integers(1, 5))
    else:
        cfg = draw(continuous_configs())
        make = lambda: ContinuousScheduler(cfg)  # noqa: E731
    cost = draw(linear_costs())
    block_size = draw(st.integers(1, 8))
    num_blocks = draw(st.integers(4, 60))
    swap = draw(st.sampled_from([0, 8, 64]))
    return requests, make, cost, block_size, num_blocks, swap


def _run(requests, make, cost, block_size, num_blocks, swap, engine):
    kv = PagedKVCache(num_blocks, block_size, swap_blocks=swap, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
    return run_engine(requests, make(), LinearCostModel(cost), kv, engine=engine)


@SETTINGS
@given(setups())
def test_fast_engine_matches_reference(setup):
    fast = _run(*setup, engine="fast")
    ref = _run(*setup, engine="reference")
    compare_runs(fast, ref, rel=1e-12)
    check_run(fast, setup[0], kv_blocks=setup[4])


@SETTINGS
@given(requests_lists(max_size=8, max_output=300, all_at_zero=False), st.integers(1, 8), linear_costs())
def test_long_decode_runs_match_reference(requests, max_seqs, cost):
    """Long outputs make long bulk runs, with KV growth inside them."""
    make = lambda: ContinuousScheduler(ContinuousConfig(max_num_seqs=max_seqs, allocation="grow"))  # noqa: E731
    fast = _run(requests, make, cost, 4, 200, 0, "fast")
    ref = _run(requests, make, cost, 4, 200, 0, "reference")
    compare_runs(fast, ref, rel=1e-12)


@SETTINGS
@given(requests_lists(min_size=2, max_size=10, max_prompt=24, max_output=60, priorities=True),
       st.integers(2, 6), st.sampled_from(["recompute", "swap"]), st.integers(1, 4), st.integers(0, 12),
       st.sampled_from([0, 6, 40]), st.booleans(), st.sampled_from(["fcfs", "priority"]), linear_costs())
def test_memory_pressure_runs_match_reference(requests, max_seqs, preemption, block_size, spare, swap,
                                              chunked, policy, cost):
    """A cache just big enough for the largest request: preemptions and swaps are common."""
    need = max(-(-(r.prompt_tokens + r.max_output_tokens - 1) // block_size) for r in requests)
    cfg = ContinuousConfig(max_num_seqs=max_seqs, max_num_batched_tokens=64, allocation="grow",
                           preemption=preemption, chunked_prefill=chunked, policy=policy)
    make = lambda: ContinuousScheduler(cfg)  # noqa: E731
    fast = _run(requests, make, cost, block_size, need + spare, swap, "fast")
    ref = _run(requests, make, cost, block_size, need + spare, swap, "reference")
    compare_runs(fast, ref, rel=1e-12)
    check_run(fast, requests, max_running=max_seqs, kv_blocks=need + spare)
    assert fast.metrics["rejected"] == 0


@SETTINGS
@given(requests_lists(min_size=2, max_size=10, max_prompt=40, max_output=30, prefix_groups=3),
       continuous_configs(), st.integers(1, 6), st.integers(0, 30), linear_costs())
def test_prefix_caching_runs_match_reference(requests, cfg, block_size, spare, cost):
    """Shared system prompts, a cache small enough to evict: both engines must free and reuse
    blocks in the same order, so they hit the same prefixes."""
    from schedlab_plugins.kv_caches import PrefixKVCache

    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // block_size) for r in requests)
    kvs = {}

    def run(engine):
        kvs[engine] = PrefixKVCache(need + spare, block_size, swap_blocks=16, bytes_per_block=2 ** 20,
                                    host_link_gbps=2 ** 10 / 1e3)
        return run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(cost), kvs[engine], engine=engine)

    fast, ref = run("fast"), run("reference")
    compare_runs(fast, ref, rel=1e-12)
    assert kvs["fast"].lru_keys() == kvs["reference"].lru_keys()
    assert kvs["fast"].evictions == kvs["reference"].evictions
    check_run(fast, requests, kv_blocks=need + spare)


@st.composite
def step_settings(draw):
    """The host's share of a step (plugins/cost_models/step_overhead.py): synchronous or not,
    with or without CUDA graphs, and a host that is sometimes longer than the GPU's step, so
    decode runs start flat on it and turn to grow with the context part way."""
    return {"async_scheduling": draw(st.booleans()), "cuda_graphs": draw(st.booleans()),
            "cuda_graph_max_tokens": draw(st.sampled_from([4, 512])), "cuda_graph_prefill": draw(st.booleans()),
            "host_step_us": draw(st.sampled_from([0.0, 400.0, 12_000.0, 40_000.0])),
            "host_per_seq_us": draw(st.sampled_from([0.0, 20.0, 900.0])),
            "eager_layer_us": draw(st.sampled_from([0.0, 262.0, 900.0]))}


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(max_size=10, max_prompt=400, max_output=300, all_at_zero=False), continuous_configs(),
       st.integers(20, 400), st.sampled_from(["l4", "a100-80gb", "h100-80gb"]), st.sampled_from([1, 2, 4]),
       step_settings(), st.sampled_from(["llama-3-8b", "deepseek-v3", "deepseek-v3.2"]),
       st.sampled_from(["auto", "fp8"]))
def test_roofline_cost_runs_match_reference(requests, cfg, num_blocks, gpu, tp, step, model_name, kv_cache_dtype):
    """The roofline model's decode steps grow with context (memory-bound KV reads): bulk runs
    sum that growth in closed form. Its costs are not dyadic, so the engines agree to rounding.
    At TP > 1 the collectives (the GPU's usual machine) add the all-reduces, nonlinear in the
    tokens, and the logits' all-gather per sequence. Where the host's work or the launches are
    longer than the GPU's step, a decode run is flat until the GPU's growth overtakes them. The
    H100 runs FlashAttention 3 (decodes beside a prefill timed as decode-only), the others 2.
    Uneven decode contexts add alpha of the gap to the longest: the fast engine reads the
    longest context from its heaps, the reference engine from every sequence, and along a bulk
    run the gap stays the same. DeepSeek-V3's latent attention decodes absorbed: with 32-128 heads
    on a GPU its FLOPs, not its KV read, set each decode's growth with the context; DeepSeek-V3.2's
    sparse attention adds a constant per decode and grows by its indexer's keys alone. An FP8 KV
    cache halves each decode's growth with its context."""
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel

    presets = Presets.from_catalog(load_catalog(entry_points=False))
    model = spec_from_path(str(CONFIGS / "deepseek-v3.2.json"), "test") if model_name == "deepseek-v3.2" \
        else presets.model(model_name)
    if model.vocab_size is None:
        model = attrs.evolve(model, vocab_size=128256)  # so the logits are gathered at TP > 1
    cost = RooflineCostModel(model, presets.gpu(gpu), RooflineConfig(model=model_name, gpu=gpu, tensor_parallel=tp,
                                                                     kv_cache_dtype=kv_cache_dtype, **step))
    runs = [run_engine(requests, ContinuousScheduler(cfg), cost, PagedKVCache(num_blocks, 16, swap_blocks=32),
                       engine=engine) for engine in ("fast", "reference")]
    compare_runs(*runs, rel=1e-9)


#: The shipped bundles: Llama-3.1-8B at TP 1, and Qwen3-32B at TP 2 with its all-reduces
#: and logits all-gather timed by the collectives over PCIe without peer-to-peer.
SHIPPED_PROFILES = [("meta-llama/Llama-3.1-8B", "llama-3.1-8b", 1), ("Qwen/Qwen3-32B", "qwen3-32b", 2)]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(max_size=8, max_prompt=6_000, max_output=400, all_at_zero=False), st.integers(1, 8),
       st.sampled_from([512, 2048]), st.booleans(), st.integers(40, 3_000), st.sampled_from(SHIPPED_PROFILES),
       step_settings())
def test_profiled_cost_runs_match_reference(requests, max_seqs, budget, chunked, num_blocks, shipped, step):
    """The shipped RTX PRO 6000 profiles: decode runs cross their kv_decode grid points and skew
    buckets (contexts to ~6k), chunks land between their profiled chunk sizes, and at TP 2 the
    communication depends on the tokens (latency-bound, then bandwidth-bound); the fast
    engine's piecewise-linear runs must agree with the step-by-step engine."""
    from pathlib import Path

    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES
    from schedlab_plugins.cost_models.profile_bundle import ProfileBundle
    from schedlab_plugins.cost_models.profiled import ProfiledConfig, ProfiledCostModel

    hf_id, preset, tp = shipped
    root = (Path(__file__).resolve().parents[1] / "experiments" / "data" / "llmservingsim" / "profiles"
            / "RTXPRO6000" / hf_id / "bf16")
    bundle = _BUNDLE.get(root) or _BUNDLE.setdefault(root, ProfileBundle(root, tp))
    model = Presets.from_catalog(load_catalog(entry_points=False)).model(preset)
    cfg = ContinuousConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, chunked_prefill=chunked,
                           allocation="grow")
    topology = TOPOLOGIES["pcie-gen5-host"] if tp > 1 else None
    runs = [run_engine(requests, ContinuousScheduler(cfg),
                       ProfiledCostModel(bundle, model, ProfiledConfig(profile=str(root), model=preset,
                                                                       tensor_parallel=tp, **step),
                                         topology=topology),
                       PagedKVCache(num_blocks, 16, swap_blocks=32), engine=engine) for engine in ("fast", "reference")]
    compare_runs(*runs, rel=1e-9)
    assert runs[0].meta["events"] <= runs[1].meta["events"]


_BUNDLE: dict = {}


def test_a_decode_run_ends_before_it_evicts_a_waiting_requests_hit():
    """Found by hypothesis: request 4 waits at t=10.375 because its chunk would also revive the
    3 cached blocks of its prefix; decode growth then evicts them, and from t=14.375 it fits.
    A bulk decode run must end where growth starts evicting while requests wait, or the fast
    engine admits it late (18.375)."""
    from schedlab_plugins.kv_caches.radix import RadixKVCache

    specs = [(13, 3, 1, 3), (1, 1, None, 0), (18, 13, 0, 1), (7, 3, 0, 1), (9, 1, 1, 3), (1, 1, None, 0),
             (1, 1, None, 0)]
    requests = [Request(i, 0.0, p, o, prefix_group=g, prefix_tokens=n) for i, (p, o, g, n) in enumerate(specs)]
    cfg = ContinuousConfig(max_num_seqs=3, max_num_batched_tokens=8, chunked_prefill=True, allocation="grow",
                           reserve_full_prompt=False)
    runs = [run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(LinearConfig(0.0625, 4.0)), RadixKVCache(34, 1),
                       engine=engine) for engine in ("fast", "reference")]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].requests["first_scheduled_ms"][4] == 14.375


@SETTINGS
@given(requests_lists(max_size=14, priorities=True, prefix_groups=2), continuous_configs(), st.integers(2, 3),
       st.sampled_from(["round_robin", "least_outstanding", "least_kv", "prefix_affinity"]), st.integers(6, 60),
       linear_costs())
def test_several_instances_behind_a_router_match_reference(requests, cfg, instances, router, num_blocks, cost):
    """The reference engine runs several instances too, in plain time order, routing each
    arrival when it comes: the fast engine's per-arrival advance agrees."""
    from schedlab.engine.driver import simulate
    from schedlab.engine.instance import Instance
    from schedlab.engine.recorder import Recorder
    from schedlab.engine.reference import ReferenceEngine
    from schedlab.engine.reference_cluster import ReferenceCluster
    from schedlab.results import RunResult
    from schedlab_plugins.kv_caches import PrefixKVCache
    from schedlab_plugins.routers import LeastKVRouter, LeastOutstandingRouter, PrefixAffinityRouter, RoundRobinRouter

    routers = {"round_robin": RoundRobinRouter, "least_outstanding": LeastOutstandingRouter,
               "least_kv": LeastKVRouter, "prefix_affinity": PrefixAffinityRouter}
    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // 4) for r in requests)
    results = []
    for engine in ("fast", "reference"):
        rec = Recorder()
        parts = [(ContinuousScheduler(cfg), LinearCostModel(cost), PrefixKVCache(need + num_blocks, 4))
                 for _ in range(instances)]
        if engine == "fast":
            engines = [Instance(i, *p, rec) for i, p in enumerate(parts)]
            simulate(list(requests), engines, router=routers[router]())
        else:
            engines = [ReferenceEngine(*p, rec, index=i) for i, p in enumerate(parts)]
            ReferenceCluster(engines, routers[router]()).run(list(requests))
        meta = {"slots": cfg.max_num_seqs * instances, "num_blocks": (need + num_blocks) * instances,
                "instances": instances}
        results.append(RunResult.from_recorder(engine, rec, settings={}, meta=meta))
    compare_runs(*results, rel=1e-12)
    check_run(results[0], requests)
