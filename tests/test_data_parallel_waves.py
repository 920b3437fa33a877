"""Data-parallel ranks keep stepping after the last request until their next check that no rank
has work, as vLLM's DP engine cores do (``DPEngineCoreProc._has_global_unfinished_reqs``: vLLM
0.33 checks at a wave's first step and every ``dp_sync_interval`` = 16th; 0.28 and older every
32nd only), running dummy batches; SGLang's ranks check every step. Hand-computed waves, both
engines, a differential over random workloads, and the TOML setting.

Costs as tests/test_data_parallel.py: a rank's part 0.5 ms per prompt token, 8 ms a decode step
or a dummy batch; experts 1 ms + 0.0625 ms per token of all ranks + 0.125 ms per token of the
largest rank."""

from __future__ import annotations

import textwrap

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import blocks_for_largest, check_run, compare_runs, dyadic_linear_costs, examples, requests_lists
from schedlab.testing.parallel import LinearParallelCost, run_data_parallel, run_deployments
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import ContinuousScheduler
from test_data_parallel import ENGINES, ROUTERS, by_id, client_side, fresh_router, rank, schedulers
from test_data_parallel_deployments import OUTER, fixed_power

TWO = [Request(0, 0.0, 16, 2), Request(1, 100.0, 16, 2)]


@pytest.mark.parametrize("engine", ENGINES)
def test_vllm_033s_ranks_step_to_the_sixteenth_step_after_the_last_request(engine):
    """r0 (16-token prompt, 2 tokens): step 1 prefills (8 ms beside a dummy's 8, experts of
    (16, 1) tokens 4.0625: 12.0625), step 2 decodes (8 + experts of (1, 1) 1.25: 21.3125). No rank
    has work then, but step 2 is no check: dummy steps of 9.25 ms follow. r1 arrives at 100,
    during step 11 (95.3125-104.5625), so step 12 prefills it: first token 116.625, finished by
    step 13 at 125.875. Steps 14-16 are dummy; the check after step 16 pauses the ranks. Dummy
    rank-steps: 1 + 1 (steps 1, 2), 2 x 9 (3-11), 1 + 1 (12, 13), 2 x 3 (14-16) = 28."""
    r = run_data_parallel(TWO, rank(), 2, fresh_router(), engine=engine, sync=(16, True))
    assert by_id(r, "first_token_ms") == {0: 12.0625, 1: 116.625}
    assert by_id(r, "finish_ms") == {0: 21.3125, 1: 125.875}
    assert r.meta["data_parallel"]["steps"] == 16 and r.meta["data_parallel"]["dummy_rank_steps"] == 28
    assert r.meta["data_parallel"]["experts_ms"] == pytest.approx(4.0625 * 2 + 1.25 * 14)


@pytest.mark.parametrize("engine", ENGINES)
def test_older_vllms_ranks_step_to_the_thirty_second(engine):
    """The same, checking every 32nd step only: r1 is served in steps 12-13 as above and the
    ranks run dummy steps 14-32 after it (19 x 2 dummy rank-steps more than its own 2)."""
    r = run_data_parallel(TWO, rank(), 2, fresh_router(), engine=engine, sync=(32, False))
    assert by_id(r, "first_token_ms") == {0: 12.0625, 1: 116.625}
    assert r.meta["data_parallel"]["steps"] == 32 and r.meta["data_parallel"]["dummy_rank_steps"] == 22 + 2 * 19


@pytest.mark.parametrize("engine", ENGINES)
def test_a_check_at_the_first_step_pauses_a_one_step_wave(engine):
    """A 1-token answer finishes in its wave's first step: vLLM 0.33 checks there and pauses at
    once (12.0625); checking every 16th only, 15 dummy steps of 9.25 ms follow."""
    one = [Request(0, 0.0, 16, 1)]
    first = run_data_parallel(one, rank(), 2, fresh_router(), engine=engine, sync=(16, True))
    late = run_data_parallel(one, rank(), 2, fresh_router(), engine=engine, sync=(16, False))
    assert first.meta["data_parallel"]["steps"] == 1 and late.meta["data_parallel"]["steps"] == 16
    assert by_id(first, "finish_ms") == by_id(late, "finish_ms") == {0: 12.0625}


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=12, max_prompt=60, max_output=60, all_at_zero=False, prefix_groups=2),
       schedulers(), st.integers(2, 3), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 40),
       st.booleans(), st.booleans(), st.sampled_from([(2, False), (3, True), (16, True), (32, False)]))
def test_waves_agree_between_engines_and_keep_the_rules(requests, cfg, ranks, router, cost, spare, prefix, ahead,
                                                        sync):
    """Random arrivals (some during a wave's tail), caches barely big enough, ranks planning
    ahead or not: both engines step the same waves and agree on every timestamp and counter."""
    if ahead and cfg.preemption == "recompute":
        cfg = attrs.evolve(cfg, async_scheduling=True)
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)), kv

    runs = [run_data_parallel(requests, make, ranks, ROUTERS[router](), engine=engine, sync=sync)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].meta["data_parallel"] == runs[1].meta["data_parallel"]
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * ranks, kv_blocks=blocks * ranks)
    # a wave ends only at a check: the steps run (if any: all may be turned away) reach the first
    steps = runs[0].meta["data_parallel"]["steps"]
    assert steps == 0 or steps >= (1 if sync[1] else sync[0])


MOE = """
    [experiment]
    name = "waves"
    [workload]
    kind = "synthetic"
    num_requests = 6
    arrival = "constant"
    rate = 2.0
    prompt = {dist = "fixed", value = 64}
    output = {dist = "fixed", value = 4}
    [scheduler]
    kind = "vllm"
    [kv_cache]
    kind = "paged"
    model = "qwen3-30b-a3b"
    gpu = "rtx-pro-6000-server"
    [cost_model]
    kind = "roofline"
    model = "qwen3-30b-a3b"
    gpu = "rtx-pro-6000-server"
    [cluster]
    data_parallel = 2
    expert_parallel = true
"""


def write(tmp_path, text: str):
    path = tmp_path / "waves.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _steps(tmp_path, extra: str = "", scheduler: str = "vllm") -> int:
    path = write(tmp_path, textwrap.dedent(MOE).replace('kind = "vllm"', f'kind = "{scheduler}"') + extra)
    return run_experiment(load(path)).all_runs()[0].meta["data_parallel"]["steps"]


def test_the_toml_default_is_the_engines_and_the_setting_names_its_key(tmp_path):
    """Six light-load requests (4 tokens each, 0.5 s apart): each is a wave of its own. vLLM's
    default (16, first step checked) runs 16 steps a wave, vLLM 0.28's 32, SGLang's every step
    (4 a request); data_parallel = 1 with the setting is refused by name."""
    assert _steps(tmp_path) == 6 * 16
    assert _steps(tmp_path, "dp_sync_interval = 32\ndp_sync_first_step = false\n") == 6 * 32
    assert _steps(tmp_path, "dp_sync_interval = 1\n") == 6 * 4
    assert _steps(tmp_path, scheduler="sglang") == 6 * 4
    with pytest.raises(ConfigError) as err:
        _steps(tmp_path, "dp_sync_interval = 0\n")
    assert "[cluster]: dp_sync_interval: must be" in str(err.value)
    path = write(tmp_path, textwrap.dedent(MOE).replace("data_parallel = 2\nexpert_parallel = true", "data_parallel = 1")
                 + "dp_sync_interval = 16\n")
    with pytest.raises(ConfigError) as err:
        run_experiment(load(path))
    assert str(err.value).endswith("[cluster]: dp_sync_interval: paces data-parallel ranks stepping together: set "
                                   "data_parallel > 1")


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=14, max_prompt=48, max_output=40, all_at_zero=False),
       schedulers(), st.integers(2, 3), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(), st.integers(0, 30),
       st.sampled_from([None, 20.0, 90.0]), st.sampled_from([(2, False), (3, True), (16, True), (32, False)]),
       st.booleans())
def test_deployments_waves_agree_with_clients_giving_up_and_metered(requests, cfg, deployments, inner, cost, spare,
                                                                    timeout, sync, metered):
    """Several deployments, each its own waves (a tail steps while another deployment serves),
    clients that may give up through an API server, every rank metered: both engines alike; a
    deployment's energy covers its tails' dummy steps."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        return (ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost)),
                PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3))

    side = client_side(timeout + 0.5, 0.5, 0) if timeout is not None else None
    runs = [run_deployments(requests, make, deployments, 2, OUTER["least_outstanding"](), ROUTERS[inner],
                            engine=engine, client_side=side, sync=sync, power=fixed_power if metered else None)
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-12)
    assert runs[0].meta["data_parallel"] == runs[1].meta["data_parallel"]
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * 2 * deployments, kv_blocks=blocks * 2 * deployments)
    for each in runs[0].meta["data_parallel"]["per_deployment"]:
        assert each["steps"] == 0 or each["steps"] >= (1 if sync[1] else sync[0])
