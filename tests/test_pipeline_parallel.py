"""Pipeline parallelism (issue 19.3): the stages' clock by hand, batches in flight as vLLM's
batch queue keeps them, the fast engine against the reference engine, the rules every run
keeps, the cost models' stage split and the TOML layout.

Hand-computed cases use :class:`LinearParallelCost` over 2 stages: each stage takes half the
``linear`` model's iteration (0.5 ms per prompt token, 8 ms per decode step) and a stage sends
the next 0.25 ms + 0.0625 ms per token.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.engine.stages import StageClock
from schedlab.model import Request
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import (
    RecordingRouter, blocks_for_largest, check_run, compare_runs, dyadic_linear_costs, examples,
    fast_run_agreeing_with_reference, requests_lists, small_closed_loop,
)
from schedlab.testing.parallel import LinearParallelCost, run_pipelined
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.routers import LeastKVRouter, LeastOutstandingRouter, RoundRobinRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

ENGINES = ("fast", "reference")


def instance(blocks: int = 64, *, stages: int = 2, max_num_seqs: int = 4, budget: int = 256):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                                         allocation="grow", chunked_prefill=True))
        cost = LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                                  stages=stages, moe=False)
        return scheduler, cost, PagedKVCache(blocks, 16)
    return make


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


# -- the stages' clock ----------------------------------------------------------------------------------------


def test_a_stage_takes_one_batch_at_a_time_in_launch_order():
    clock = StageClock(3)
    # batch 1 at 0: stage 0 0-2, send 1, stage 1 3-5, send, stage 2 6-8
    assert clock.launch(0.0, (2.0, 2.0, 2.0), 1.0) == 8.0
    # batch 2 at 0: stage 0 free at 2 -> 2-3; stage 1 (ready at 4) is busy until 5 -> 5-6; stage 2 until 8 -> 8-9
    assert clock.launch(0.0, (1.0, 1.0, 1.0), 1.0) == 9.0
    # batch 3 at 20, everything free: 20 + 3 stages + 2 sends
    assert clock.launch(20.0, (1.0, 1.0, 1.0), 0.5) == 24.0


# -- hand-computed runs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_crosses_both_stages_and_its_requests_wait_for_it(engine):
    # Two prompts of 8 at 0 in one batch: 16 tokens, 8 ms of iteration, 4 per stage; send 0.25 +
    # 0.0625 x 16 = 1.25 -> lands at 4 + 1.25 + 4 = 9.25 (first tokens). Nothing else can be
    # scheduled meanwhile (both requests are in flight). Their decodes: 8 ms -> 4 per stage,
    # send 0.375 -> 9.25 + 8.375 = 17.625.
    r = run_pipelined([Request(0, 0.0, 8, 2), Request(1, 0.0, 8, 2)], instance(), 2, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 9.25, 1: 9.25}
    assert by_id(r, "finish_ms") == {0: 17.625, 1: 17.625}
    assert r.counters["iterations"] == 2 and r.counters["busy_ms"] == 17.625


@pytest.mark.parametrize("engine", ENGINES)
def test_a_second_batch_fills_the_pipeline_behind_the_first(engine):
    # A token budget of 16 splits a burst: batch A (r0's 16-token prompt, 8 ms: 4 a stage, send
    # 1.25) launches at 0: stage 0 0-4, stage 1 5.25-9.25. Batch B (r1's prompt) launches at 0
    # too, right behind it: stage 0 4-8, stage 1 9.25-13.25. A lands at 9.25 and r0's decode
    # (8 ms: 4 a stage, send 0.3125) goes in: stage 0 9.25-13.25, stage 1 13.5625-17.5625. B lands
    # at 13.25, r1's decode: stage 0 13.25-17.25, stage 1 (busy until 17.5625) 17.5625-21.5625.
    requests = [Request(0, 0.0, 16, 2), Request(1, 0.0, 16, 2)]
    r = run_pipelined(requests, instance(budget=16), 2, engine=engine)
    assert by_id(r, "first_token_ms") == {0: 9.25, 1: 13.25}
    assert by_id(r, "finish_ms") == {0: 17.5625, 1: 21.5625}
    # the instance was busy from 0 to 21.5625, each moment counted once
    assert r.counters["busy_ms"] == 21.5625 and r.counters["iterations"] == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_an_arrival_waits_for_the_next_landing(engine):
    # r0's prompt (8 tokens, 4 ms: 2 a stage, send 0.75) lands at 4.75; r1 arrives at 1, while the
    # engine waits on r0's batch, and goes in with r0's decode at 4.75: 8 + 4 = 12 ms, 6 a stage,
    # send 0.25 + 0.0625 x 9 -> 4.75 + 6 + 0.8125 + 6 = 17.5625.
    r = run_pipelined([Request(0, 0.0, 8, 2), Request(1, 1.0, 8, 2)], instance(), 2, engine=engine)
    assert by_id(r, "first_scheduled_ms")[1] == 4.75
    assert by_id(r, "first_token_ms")[1] == 17.5625 == by_id(r, "finish_ms")[0]


# -- the engines agree; the rules of every run --------------------------------------------------------------


@st.composite
def schedulers(draw):
    max_seqs = draw(st.integers(1, 5))
    allocation = draw(st.sampled_from(["reserve", "grow"]))
    preemption = draw(st.sampled_from(["recompute", "swap"])) if allocation == "grow" else "recompute"
    return ContinuousConfig(max_num_seqs=max_seqs, allocation=allocation, preemption=preemption,
                            max_num_batched_tokens=draw(st.integers(max(max_seqs, 8), 64)),
                            chunked_prefill=draw(st.booleans()),
                            running_order=draw(st.sampled_from(["admission", "decodes_first"])),
                            policy=draw(st.sampled_from(["fcfs", "priority"])))


ROUTERS = {"round_robin": RoundRobinRouter, "least_outstanding": LeastOutstandingRouter, "least_kv": LeastKVRouter}


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=60, all_at_zero=False, priorities=True,
                      prefix_groups=2),
       schedulers(), st.integers(2, 4), st.integers(1, 2), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(),
       st.integers(0, 30), st.integers(1, 8), st.booleans())
def test_pipelined_instances_agree_between_engines_and_keep_the_rules(requests, cfg, stages, instances, router, cost,
                                                                      spare, block_size, prefix):
    need = blocks_for_largest(requests, block_size)
    blocks = need + spare

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, block_size, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), kv

    runs = [run_pipelined(requests, make, stages, instances, ROUTERS[router]() if instances > 1 else None,
                          engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * instances, kv_blocks=blocks * instances)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=60, all_at_zero=False),
       st.integers(2, 3), st.integers(1, 2), dyadic_linear_costs(), st.integers(0, 2), st.sampled_from([0.0, 0.5]),
       st.sampled_from([0.0, 1.5, 6.0]))
def test_pipelines_behind_an_api_server_agree_between_engines(requests, stages, instances, cost, workers, network,
                                                              request_ms):
    """Requests reach the pipelined instances through the API server (0-2 handlers, a network
    hop, handling time): both engines alike, every request served once."""
    from schedlab.frontend import ClientSide, FrontendConfig

    side = ClientSide(FrontendConfig(network_ms=network, request_ms=request_ms, tokenize_ms_per_token=0.0625,
                                     token_ms=0.25, workers=workers))
    blocks = blocks_for_largest(requests, 4) + 8

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=3, max_num_batched_tokens=64)),
                LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), PagedKVCache(blocks, 4))

    runs = [run_pipelined(requests, make, stages, instances, RoundRobinRouter() if instances > 1 else None,
                          engine=engine, client_side=side) for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    check_run(runs[0], requests)
    req = runs[0].requests
    assert (req["arrival_ms"] >= req["sent_ms"] + network).all()  # each request crossed the front end


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(5, 24), st.integers(2, 3), st.integers(0, 5))
def test_closed_loops_over_pipelined_instances_agree_and_conserve(clients, num_requests, stages, seed):
    make_workload = small_closed_loop(clients, num_requests)
    runs = []
    for engine in ENGINES:
        workload = make_workload()
        runs.append(run_pipelined(workload.requests(seed), instance(48, stages=stages), stages, 2,
                                  RoundRobinRouter(), engine=engine, workload=workload))
    compare_runs(*runs, rel=1e-12)
    assert runs[0].requests["id"].size == num_requests and runs[0].requests["rejected"].sum() == 0


# -- the cost models' stages ---------------------------------------------------------------------------------


def _presets():
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog

    return Presets.from_catalog(load_catalog(entry_points=False))


def test_vllms_layer_split_gives_the_remainder_to_the_stages_before_the_last():
    from schedlab.parallelism import stage_layers

    assert stage_layers(48, 2) == (24, 24)
    assert stage_layers(30, 4) == (7, 8, 8, 7)   # vLLM get_pp_indices: 7 each, 2 more on the two before the last
    assert stage_layers(5, 3) == (2, 2, 1)   # a remainder of stages - 1 reaches the first stage too


@pytest.mark.parametrize("stages", [2, 3])
def test_a_roofline_iteration_splits_into_stages_that_add_up(stages):
    from schedlab.parallelism import Parallelism, stage_layers
    from schedlab.protocols import Batch
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES, Collectives

    presets = _presets()
    config = RooflineConfig(model="llama-3.1-8b", gpu="rtx-pro-6000-server", overhead_ms=1.0)
    cost = RooflineCostModel(presets.model("llama-3.1-8b"), presets.gpu("rtx-pro-6000-server"), config,
                             parallelism=Parallelism(pipeline_parallel=stages))
    batch = Batch(num_decode=32, decode_context_tokens=32 * 900, num_prefill=1, prefill_tokens=512)
    times, send = cost.pipeline_ms(batch)
    assert sum(times) == pytest.approx(cost.iteration_ms(batch), rel=1e-12)
    layers = stage_layers(32, stages)
    host = cost.iteration_ms(batch) - cost.kernel_ms(batch)  # the host's share of the step, overhead_ms in it
    assert host >= 1.0
    per_layer = cost.kernel_ms(batch) / 32
    assert times[0] == pytest.approx(host + layers[0] * per_layer)   # the host's work before the first stage
    assert times[-1] == pytest.approx(layers[-1] * per_layer)
    # hidden states and residual: 2 x 544 tokens x 4096 x 2 bytes, one hop over the GPU's usual machine
    assert send == pytest.approx(Collectives(TOPOLOGIES["pcie-gen5-host"], 2).send_recv_ms(2 * 544 * 4096 * 2))


def test_kv_sizing_of_a_stage_holds_its_layers():
    from schedlab.capacity import size_kv_cache
    from schedlab.parallelism import Parallelism

    presets = _presets()
    model, gpu = presets.model("qwen3-32b"), presets.gpu("rtx-pro-6000-server")
    alone = size_kv_cache(model, gpu)
    staged = size_kv_cache(model, gpu, parallelism=Parallelism(pipeline_parallel=2))
    assert staged.bytes_per_block * 2 == alone.bytes_per_block      # 32 of the 64 layers' KV
    assert staged.weight_bytes == pytest.approx(alone.weight_bytes / 2, abs=1)
    assert staged.pipeline_parallel == 2
    assert staged.num_blocks > 2 * alone.num_blocks  # half the KV per token and half the weights


# -- TOML -----------------------------------------------------------------------------------------------------


BASE = """
    [experiment]
    name = "pp"
    [workload]
    kind = "synthetic"
    num_requests = 40
    rate = 20
    prompt = {dist = "uniform", low = 20, high = 3000}
    output = {dist = "uniform", low = 2, high = 60}
    [scheduler]
    kind = "vllm"
    max_num_seqs = 32
    max_num_batched_tokens = 1024
    [kv_cache]
    kind = "paged"
    model = "qwen3-32b"
    gpu = "rtx-pro-6000-server"
    [cost_model]
    kind = "roofline"
    model = "qwen3-32b"
    gpu = "rtx-pro-6000-server"
"""


def test_a_pipelined_deployment_in_toml_runs_in_both_engines_and_counts_its_gpus(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + textwrap.dedent("""
        [cluster]
        pipeline_parallel = 2
        instances = 2
    """))
    fast = fast_run_agreeing_with_reference(path)
    assert fast.metrics["gpus"] == 4
    assert fast.meta["kv_cache"]["pipeline_parallel"] == 2
    check_run(fast, _requests(path))


def test_a_pipelined_deployment_behind_the_api_server_in_toml(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + textwrap.dedent("""
        [cluster]
        pipeline_parallel = 2
        [frontend]
        workers = 1
    """))
    m = fast_run_agreeing_with_reference(path).metrics
    assert m["client"]["frontend_ms"]["p50"] > 0 and m["client"]["ttft_ms"]["p50"] > m["ttft_ms"]["p50"]


def _requests(path):
    from schedlab.study.simulation import assemble

    exp = load(path)
    spec = exp.studies[0].base
    return list(assemble(spec, exp.context, "x").workload.requests(spec.seed))


def test_a_cost_model_without_stages_is_refused_by_name(tmp_path):
    from schedlab.errors import ConfigError

    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + "[cluster]\npipeline_parallel = 2\n[[runs]]\nname = 'x'\n"
                    "cost_model = {kind = 'linear'}\n")
    with pytest.raises(ConfigError, match=r"\[cost_model\]: LinearCostModel does not time pipeline stages"):
        run_experiment(load(path))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=2, max_size=14, max_prompt=48, max_output=12), st.integers(2, 3), st.integers(1, 3),
       dyadic_linear_costs())
def test_the_router_sees_each_pipelined_instance_as_it_is_at_the_arrival(requests, stages, max_num_seqs, cost):
    """The outstanding count a router reads is the number of requests routed to that instance
    earlier that finish after the arrival: a batch in the pipeline still holds its requests."""
    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=32)),
                LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), PagedKVCache(64, 4))

    for engine in ENGINES:
        spy = RecordingRouter(LeastOutstandingRouter())
        result = run_pipelined(requests, make, stages, 2, spy, engine=engine)
        place, finish = by_id(result, "instance"), by_id(result, "finish_ms")
        routed: list[int] = []
        for rid, seen in spy.seen:
            t = requests[rid].arrival_ms
            assert seen == [sum(1 for j in routed if place[j] == i and finish[j] > t) for i in range(2)], (engine, rid)
            routed.append(rid)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=3_000, max_output=200, all_at_zero=False),
       st.integers(2, 3), st.sampled_from([512, 2048]))
def test_profiled_pipelines_match_the_reference(requests, stages, budget):
    """The shipped MoE bundle split over stages, the activations sent over PCIe through host memory."""
    from pathlib import Path

    from schedlab.parallelism import Parallelism
    from schedlab_plugins.cost_models.collectives import TOPOLOGIES
    from schedlab_plugins.cost_models.profile_bundle import ProfileBundle
    from schedlab_plugins.cost_models.profiled import ProfiledConfig, ProfiledCostModel

    root = Path(__file__).resolve().parents[1].joinpath("experiments", "data", "llmservingsim", "profiles",
                                                        "RTXPRO6000", "Qwen", "Qwen3-30B-A3B-Instruct-2507", "bf16")
    bundle = _BUNDLE.get(root) or _BUNDLE.setdefault(root, ProfileBundle(root, 1))
    model = _presets().model("qwen3-30b-a3b")

    def make():
        cost = ProfiledCostModel(bundle, model, ProfiledConfig(profile=str(root), model="qwen3-30b-a3b"),
                                 topology=TOPOLOGIES["pcie-gen5-host"],
                                 parallelism=Parallelism(pipeline_parallel=stages))
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=8, max_num_batched_tokens=budget,
                                                         chunked_prefill=True, allocation="grow"))
        return scheduler, cost, PagedKVCache(2_000, 16)

    runs = [run_pipelined(requests, make, stages, engine=engine) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)


_BUNDLE: dict = {}


@pytest.mark.parametrize("table", ["[client]\ntimeout_ms = 1000\n", "[power]\nkind = \"utilisation\"\n"])
def test_timeouts_and_energy_are_refused_with_pipelines(tmp_path, capsys, table):
    """Not simulated with pipeline parallelism yet: a named error, not a silent run."""
    from schedlab.cli import main

    path = tmp_path / "exp.toml"
    path.write_text('[experiment]\nname = "p"\n[workload]\nkind = "synthetic"\nnum_requests = 4\n'
                    'prompt = {dist = "fixed", value = 64}\noutput = {dist = "fixed", value = 8}\nrate = 10\n'
                    '[cost_model]\nkind = "roofline"\nmodel = "llama-3-8b"\ngpu = "a100-80gb"\n'
                    '[kv_cache]\nkind = "paged"\nmodel = "llama-3-8b"\ngpu = "a100-80gb"\n'
                    '[cluster]\npipeline_parallel = 2\n' + table)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    name = table.split("]")[0] + "]"
    assert f"{name}:" in err and "parallel" in err and "yet" in err, err


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_with_its_own_timeout_is_refused_by_a_pipeline(engine):
    """A run's [client] is refused with pipelines; a request carrying its own timeout_ms
    (the library's Request) gets a clear error, not an abort the pipeline does not model."""
    from schedlab.errors import SimulationError

    def make():
        return (ContinuousScheduler(ContinuousConfig(max_num_seqs=2)),
                LinearParallelCost(LinearCostModel(), stages=2, moe=False), PagedKVCache(64, 4))

    with pytest.raises(SimulationError, match="request 1 has a client timeout.*pipeline parallelism"):
        run_pipelined([Request(0, 0.0, 4, 4), Request(1, 1.0, 4, 4, timeout_ms=5.0)], make, 2, engine=engine)
