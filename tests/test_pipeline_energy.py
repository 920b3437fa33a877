"""Energy (``[power]``) and the SM clock (``[clock]``) of pipelined instances
(:mod:`schedlab.energy.pipeline`, :mod:`schedlab.engine.stage_cost`).

Each stage's GPUs are metered on their own: busy while they compute their slice of a batch,
drawing what the power model says of the stage's share of the work, idle otherwise (tail,
standby, idle from the stage's own last slice). Checked here: the cost models' split of an
iteration's work over the stages (by hand on a small model), pipelines metered by hand in both
engines (the power law worked out in the test, with standby between batches and a fixed and a
governed clock), a batch whose requests were all aborted in flight, both engines against each
other with conservation (energy = the integral of power over the timeline) on random workloads,
the TOML path and the refusal of a cost model that cannot split its work by stage.

The hand-computed cases run ``test_pipeline_parallel.py``'s instance (2 stages, each half of
the ``linear`` model's iteration: 0.5 ms per prompt token, 8 ms per decode step; a stage sends
the next 0.25 ms + 0.0625 ms per token) with :class:`ParallelPrices`' work (2e9 bytes a step, 1e8
a token, 1e7 a context token; 5e10 FLOPs a token), each stage half of it, on
``test_data_parallel_energy.py``'s GPU (1,000 GB/s, 100 TFLOPS, 40 W idle, 400 W board; awake
0.2, activity 1). The linear model has no ``kernel_ms``: a slice's kernels run all of it, so a
slice of ``d`` ms reading ``m`` ms of bytes and computing ``c`` ms of FLOPs at the peak rates
takes ``(40 d + 360 min(0.2 d + max(m, c), d)) / 1000`` J.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.capacity import ModelSpec
from schedlab.energy.clock import ClockConfig, ClockedCostModel
from schedlab.energy.timeline import power_steps
from schedlab.engine.stage_cost import ClockedStageCost, StageCost, stage_view
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.parallelism import Parallelism
from schedlab.protocols import Batch
from schedlab.study.experiment import load
from schedlab.testing import (blocks_for_largest, check_energy, check_run, compare_runs, dyadic_linear_costs,
                              examples, fast_run_agreeing_with_reference, requests_lists)
from schedlab.testing.parallel import LinearParallelCost, run_pipelined
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.work import ModelWork
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.power import FixedActiveConfig, FixedActivePowerModel, UtilisationConfig, UtilisationPowerModel
from schedlab_plugins.power.common import find_clock
from schedlab_plugins.power.utilisation import build_utilisation
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from test_clock_parallel import LAW, factors
from test_data_parallel_energy import GPU, PRESETS
from test_pipeline_parallel import BASE, ROUTERS, by_id, client_side, schedulers

ENGINES = ("fast", "reference")


def utilisation(standby_s: float = 0.0, tail_s: float = 0.0):
    """The utilisation model on :data:`GPU` (awake 0.2, activity 1), asking the instance's view
    what a stage did, and finding the clock there as a run does."""
    config = UtilisationConfig(awake=0.2, activity=1.0, standby_s=standby_s, tail_s=tail_s)
    return lambda cost: UtilisationPowerModel(config, GPU, 1, cost.work, clock=find_clock(cost),
                                              kernel=cost.kernel_ms, board_w=400.0, idle_w=40.0)


def slice_j(d: float, bytes_: float, flops: float, r: float = 1.0, phases=None) -> float:
    """A stage's slice of ``d`` ms on :data:`GPU` at clock ``r``, its kernels running all of it:
    ``(40 d + 360 min(a d + work(r) x, d)) / 1000`` with ``a = 0.2 x awake(r)``
    (``test_clock_parallel.factors``: the law's power factors) and ``x = max(m, c)`` of the
    totals, or summed over ``phases`` (``(bytes, flops)`` pairs) where they are bound apart."""
    awake, work = factors(r)
    x = sum(max(b / 1e9, f / 1e11) for b, f in phases) if phases else max(bytes_ / 1e9, flops / 1e11)
    g = 0.2 * awake * d + work * x
    return (40 * d + 360 * min(g, d)) / 1000


def linear(stages: int = 2) -> LinearParallelCost:
    return LinearParallelCost(LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)),
                              stages=stages, moe=False)


def instance(blocks: int = 64, *, budget: int = 256, cost=linear):
    def make():
        scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=budget,
                                                         allocation="grow", chunked_prefill=True))
        return scheduler, cost(), PagedKVCache(blocks, 16)
    return make


# -- the work of a stage ----------------------------------------------------------------------------------

#: 4 layers of 2 KV heads and 4 query heads of 4 dimensions, 2 bytes a weight;
#: a vocabulary of 10 x 4 wide: an untied embedding table (40 parameters, looked up) and an LM
#: head (40, read by the last stage); 1,000 parameters in all.
TINY = ModelSpec(name="tiny", num_layers=4, num_kv_heads=2, head_dim=4, num_params=1000.0, num_attention_heads=4,
                 vocab_size=10, hidden_size=4)


def test_a_stages_work_is_its_layers_share_and_the_last_stage_reads_the_lm_head_by_hand():
    # Two decodes over 10 context tokens and a chunk of 3 prompt tokens after 5 cached: 5 tokens.
    # Weights read: 1000 - 40 (the looked-up table) = 960 parameters x 2 bytes = 1920, of which the
    # LM head's 80; KV (10 + 5) x 128 bytes (K and V x 4 layers x 2 heads x 4 x 2 bytes a token) =
    # 1920. FLOPs: 2 x (1000 - 40 - 40) = 1840 a token x 5, attention 4 x 4 x 4 x 4 = 256 a
    # (query, key) pair: the chunk's 3 x 5 + 3 x 4 / 2 = 21 pairs and the decodes' 10.
    # Stages of 1 and 3 layers: a quarter and three quarters of all but the LM head; the LM head
    # on the last.
    w = ModelWork(TINY)
    batch = Batch(num_decode=2, decode_context_tokens=10, num_prefill=1, prefill_tokens=3, prefill_context_tokens=5)
    flops = 1840 * 5 + 256 * 31
    assert w.work(batch) == (3840.0, flops)
    assert w.stage_work(batch, (1, 3)) == ((940.0, flops / 4), (2820.0 + 80.0, flops * 3 / 4))
    assert w.stage_work(batch, (2, 2)) == ((1880.0, flops / 2), (1960.0, flops / 2))
    assert w.stage_work(Batch(), (2, 2)) == ((0.0, 0.0), (0.0, 0.0))
    with pytest.raises(ValueError, match="at least one layer"):
        w.stage_work(batch, (4, 0))


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("batch", [Batch(num_decode=64, decode_context_tokens=64 * 900),
                                   Batch(num_prefill=2, prefill_tokens=700, prefill_context_tokens=300),
                                   Batch(num_decode=3, decode_context_tokens=40, num_prefill=1, prefill_tokens=50)])
def test_the_rooflines_stages_work_adds_up_to_its_work_split_by_vllms_layers(stages, batch):
    model = PRESETS.model("qwen3-30b-a3b")
    config = RooflineConfig(model="qwen3-30b-a3b", gpu="rtx-pro-6000-server")
    staged = RooflineCostModel(model, PRESETS.gpu("rtx-pro-6000-server"), config,
                               parallelism=Parallelism(pipeline_parallel=stages))
    parts = staged.stage_work(batch)
    whole = staged.work(batch)
    assert sum(p[0] for p in parts) == pytest.approx(whole[0], rel=1e-12)
    assert sum(p[1] for p in parts) == pytest.approx(whole[1], rel=1e-12)
    lm_head = model.vocab_size * model.hidden_size * model.weight_bytes_per_param
    layers = (24, 24) if stages == 2 else (16, 16, 16)  # 48 layers: vLLM's get_pp_indices
    per_layer = (whole[0] - lm_head) / 48
    assert [p[0] for p in parts[:-1]] == pytest.approx([n * per_layer for n in layers[:-1]], rel=1e-12)
    assert parts[-1][0] == pytest.approx(layers[-1] * per_layer + lm_head, rel=1e-12)
    with pytest.raises(ValueError, match="without pipeline parallelism"):
        RooflineCostModel(model, PRESETS.gpu("rtx-pro-6000-server"), config).stage_work(batch)


@pytest.mark.parametrize("batch", [Batch(num_decode=32, decode_context_tokens=32 * 900),
                                   Batch(num_decode=3, decode_context_tokens=40, num_prefill=1, prefill_tokens=512)])
def test_a_stages_kernels_leave_the_host_share_of_the_step_to_the_first_stage(batch):
    """The roofline puts the host's share of a step (1 ms of overhead here, and the launches) on
    the first stage: its GPUs run no kernel then. The stages' kernels add up to the step's."""
    config = RooflineConfig(model="llama-3.1-8b", gpu="h100-80gb", overhead_ms=1.0)
    cost = RooflineCostModel(PRESETS.model("llama-3.1-8b"), PRESETS.gpu("h100-80gb"), config,
                             parallelism=Parallelism(pipeline_parallel=2))
    view = stage_view(cost)
    stage_ms, _ = cost.pipeline_ms(batch)
    host = cost.iteration_ms(batch) - cost.kernel_ms(batch)
    assert host >= 1.0
    kernels = []
    for s in (0, 1):
        view.stage = s
        kernels.append(view.kernel_ms(batch))
    assert kernels == pytest.approx([stage_ms[0] - host, stage_ms[1]], rel=1e-12)
    assert sum(kernels) == pytest.approx(cost.kernel_ms(batch), rel=1e-12)


def test_a_stage_view_tells_the_power_model_its_stage_and_the_batchs_clock():
    view = stage_view(linear())
    assert type(view) is StageCost and find_clock(view) is None
    batch = Batch(num_prefill=1, prefill_tokens=16)
    # half of the prefill's 3.6e9 bytes and 8e11 FLOPs on each stage; its kernels run all of its 4 ms
    assert view.work(batch) == (1.8e9, 4e11) and view.kernel_ms(batch) == 4.0
    view.stage = 1
    assert view.work(batch) == (1.8e9, 4e11)
    clocked = stage_view(ClockedCostModel(linear(), GPU, ClockConfig(mhz=1000.0, **LAW)))
    assert type(clocked) is ClockedStageCost and find_clock(clocked) is clocked
    clocked.ratio = 0.5  # c = 4 ms, m = 1.8: the compute takes 8 at half clock
    assert clocked.kernel_ms(batch) == 8.0 and clocked.clock_ratio(batch) == 0.5 and clocked.fixed == 0.5


# -- hand-computed pipelines -------------------------------------------------------------------------------

# Two prompts of 8 at 0, each for 2 tokens (test_pipeline_parallel: a batch crosses both stages):
#   batch 1, the 16 prompt tokens: 8 ms, 4 a stage; send 1.25 -> stage 0 0-4, stage 1 5.25-9.25.
#     Each stage: 1.8e9 bytes (1.8 ms) and 4e11 FLOPs (4 ms): 0.8 + 4 > 4, at the board limit: 1.6 J.
#   batch 2, 2 decodes over 9 tokens each: 8 ms, 4 a stage; send 0.375 -> 9.25-13.25, 13.625-17.625.
#     Each stage: (2e9 + 2e8 + 1.8e8) / 2 = 1.19e9 bytes, 5e10 FLOPs (0.5 ms): 0.8 + 1.19 = 1.99.
PREFILL, DECODE = slice_j(4, 1.8e9, 4e11), slice_j(4, 1.19e9, 5e10)
TWO = [Request(0, 0.0, 8, 2), Request(1, 0.0, 8, 2)]


def test_the_slices_by_hand():
    assert PREFILL == pytest.approx(1.6, rel=1e-15)
    assert DECODE == pytest.approx((160 + 360 * 1.99) / 1000, rel=1e-15)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_stage_draws_for_its_slices_and_idles_between(engine):
    # No standby: a stage idles at 40 W whenever it has no slice. The rows: [0, 9.25], stage 0
    # idle 4-9.25 and stage 1 0-5.25 (5.25 ms each); [9.25, 17.625], 4.375 ms idle each.
    r = run_pipelined(TWO, instance(), 2, engine=engine, power=utilisation())
    inst = r.meta["energy"]["instances"][0]
    assert inst["busy_j"] == pytest.approx(2 * PREFILL + 2 * DECODE, rel=1e-12)
    assert inst["idle_j"] == pytest.approx(0.04 * (2 * 5.25 + 2 * 4.375), rel=1e-12)
    assert [s["busy_j"] for s in inst["stages"]] == pytest.approx([PREFILL + DECODE] * 2, rel=1e-12)
    assert [s["busy_ms"] for s in inst["stages"]] == [8.0, 8.0]
    assert inst["idle_w"] == 80.0 and inst["busy_ms"] == 17.625  # both stages; the time in flight
    # the rows carry all the stages' energy over them
    rows = [2 * PREFILL + 0.04 * 10.5, 2 * DECODE + 0.04 * 8.75]
    assert r.timeline["energy_j"].tolist() == pytest.approx(rows, rel=1e-12)
    assert inst["peak_w"] == pytest.approx(rows[0] / 9.25 * 1e3, rel=1e-12)
    # each request: half of each batch (8 of 16 prompt tokens, 1 of 2 decodes)
    assert by_id(r, "energy_j") == pytest.approx({0: PREFILL + DECODE, 1: PREFILL + DECODE}, rel=1e-12)
    e = r.metrics["energy"]
    assert e["gpu_j"] == pytest.approx(sum(rows), rel=1e-12)
    assert e["j_per_token"] == pytest.approx(sum(rows) / 4, rel=1e-12)
    assert e["avg_power_w"] == pytest.approx(sum(rows) / 17.625 * 1e3, rel=1e-12)
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_constant_power_model_draws_it_over_each_stages_slices(engine):
    # fixed_active at 300 W while a stage computes, 40 W otherwise: 4 slices of 4 ms, 19.25 ms idle
    def power(cost):
        return FixedActivePowerModel(FixedActiveConfig(), 1, active_w=300.0, standby_w=40.0, idle_w=40.0)

    r = run_pipelined(TWO, instance(), 2, engine=engine, power=power)
    inst = r.meta["energy"]["instances"][0]
    assert inst["busy_j"] == pytest.approx(0.3 * 16, rel=1e-12)
    assert inst["idle_j"] == pytest.approx(0.04 * 19.25, rel=1e-12)
    assert r.timeline["energy_j"].tolist() == pytest.approx([0.3 * 8 + 0.04 * 10.5, 0.3 * 8 + 0.04 * 8.75])
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_stage_stands_by_after_its_own_last_slice(engine):
    # Standby 112 W (40 + 0.2 x 360) for 10 ms after a stage's last slice. TWO as above, then
    # request 2 (prompt 8, 1 token) at 40: 4 ms, 2 a stage, send 0.75 -> 40-42, 42.75-44.75;
    # 1.4e9 bytes, 2e11 FLOPs (2 ms) a stage: 0.4 + 2 > 2, at the limit: 0.8 J each.
    #   row 1 [0, 9.25]: stage 0 stands by 4-9.25 (112 W); stage 1 has not worked yet: idle 0-5.25
    #   row 2 [9.25, 17.625]: each stage stands by 4.375 ms (stage 0 after 13.25, stage 1 after 9.25)
    #   17.625-40, nothing in flight: stage 0 has stood by 4.375 ms already -- 5.625 more, stage 1
    #     10; then idle. Power: 224 W to 23.25, 152 W to 27.625, 80 W to 40.
    #   row 3 [40, 44.75]: stage 0 stands by 42-44.75; stage 1, idle since 27.625, idles to 42.75
    requests = TWO + [Request(2, 40.0, 8, 1)]
    r = run_pipelined(requests, instance(), 2, engine=engine, power=utilisation(standby_s=0.01))
    rows = [2 * PREFILL + 0.112 * 5.25 + 0.04 * 5.25, 2 * DECODE + 0.112 * 8.75, 1.6 + 0.112 * 2.75 + 0.04 * 2.75]
    gap = 0.224 * 5.625 + 0.152 * 4.375 + 0.08 * 12.375
    assert r.timeline["energy_j"].tolist() == pytest.approx(rows, rel=1e-12)
    inst = r.meta["energy"]["instances"][0]
    assert inst["standby_left"] == [[17.625, 5.625, 10.0]]
    assert inst["busy_j"] + inst["idle_j"] == pytest.approx(sum(rows) + gap, rel=1e-12)
    edges, watts = power_steps(r, 0)
    assert edges.tolist() == pytest.approx([0.0, 9.25, 17.625, 23.25, 27.625, 40.0, 44.75])
    assert watts.tolist() == pytest.approx([rows[0] / 9.25e-3, rows[1] / 8.375e-3, 224, 152, 80, rows[2] / 4.75e-3])
    assert by_id(r, "energy_j")[2] == pytest.approx(1.6, rel=1e-12)
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_tails_of_the_stages_add_up_after_the_last_landing(engine):
    # A tail of 5 ms after each stage's last slice, from its power less standby (112 W): after
    # batch 2 stage 0's (4.375 ms old at the landing, 17.625) and stage 1's, as one exponential
    # (the pipeline then idles until request 2 at 40, as above).
    requests = TWO + [Request(2, 40.0, 8, 1)]
    r = run_pipelined(requests, instance(), 2, engine=engine, power=utilisation(standby_s=0.01, tail_s=0.005))
    decode_w = DECODE / 4e-3
    tail = (decode_w - 112) * (math.exp(-4.375 / 5) + 1)
    assert r.meta["energy"]["instances"][0]["tails"] == [[17.625, pytest.approx(tail, rel=1e-12)]]
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fixed_half_clock_stretches_each_stages_compute_by_its_own_work(engine):
    # At 1000 of 2000 MHz (r = 0.5; the law of test_clock_parallel): a prefill slice computes for
    # c = 4 ms and reads m = 1.8: 4 more at half clock -> 8 a stage: 0-8, send, 9.25-17.25. A
    # decode slice (c = 0.5, m = 1.19) stays memory-bound: 4 a stage: 17.25-21.25, 21.625-25.625.
    r = run_pipelined(TWO, instance(cost=lambda: ClockedCostModel(linear(), GPU, ClockConfig(mhz=1000.0, **LAW))),
                      2, engine=engine, power=utilisation())
    assert by_id(r, "first_token_ms") == {0: 17.25, 1: 17.25}
    assert by_id(r, "finish_ms") == {0: 25.625, 1: 25.625}
    prefill, decode = slice_j(8, 1.8e9, 4e11, 0.5), slice_j(4, 1.19e9, 5e10, 0.5)
    assert prefill == pytest.approx((320 + 360 * (0.05625 * 8 + 0.65 * 4)) / 1000, rel=1e-12)  # below the limit now
    inst = r.meta["energy"]["instances"][0]
    assert inst["busy_j"] == pytest.approx(2 * prefill + 2 * decode, rel=1e-12)
    assert inst["idle_j"] == pytest.approx(0.04 * (2 * 9.25 + 2 * 4.375), rel=1e-12)
    assert by_id(r, "energy_j") == pytest.approx({0: prefill + decode, 1: prefill + decode}, rel=1e-12)
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_governor_clocks_each_batch_from_its_trip_through_the_pipeline(engine):
    # Levels 450 MHz apart: r = 0.1, 0.325, 0.55, 0.775, 1; the target 9 ms (headroom 1). The
    # prefill batch runs at the full clock. The decode batch's trip (2 stages and a send of 0.375):
    #   r = 0.1:   each stage 4 + (5 - 1.19): 16.995 > 9
    #   r = 0.325: each stage 4 + (0.5 / 0.325 - 1.19): 9.0719 > 9
    #   r = 0.55:  compute 0.909 < 1.19: 4 a stage, 8.375 <= 9: this clock, the timing unchanged
    clock = ClockConfig(policy="slo", tpot_ms=9.0, headroom=1.0, step_mhz=450.0, **LAW)
    r = run_pipelined(TWO, instance(cost=lambda: ClockedCostModel(linear(), GPU, clock)), 2, engine=engine,
                      power=utilisation())
    assert by_id(r, "finish_ms") == {0: 17.625, 1: 17.625}
    decode = slice_j(4, 1.19e9, 5e10, 0.55)
    assert decode == pytest.approx((160 + 360 * (0.2 * 0.55 * 0.775 ** 2 * 4 + (0.2 + 0.8 * 0.775 ** 2) * 1.19))
                                   / 1000, rel=1e-12)
    inst = r.meta["energy"]["instances"][0]
    assert inst["busy_j"] == pytest.approx(2 * PREFILL + 2 * decode, rel=1e-12)
    check_energy(r)
    # a target of 9.1 lets the decode batch down to 0.325: its stages 4.3485 ms each
    lower = run_pipelined(TWO, instance(cost=lambda: ClockedCostModel(linear(), GPU, ClockConfig(
        policy="slo", tpot_ms=9.1, headroom=1.0, step_mhz=450.0, **LAW))), 2, engine=engine, power=utilisation())
    assert by_id(lower, "finish_ms")[0] == pytest.approx(9.25 + 2 * (0.5 / 0.325 + 4 - 1.19) + 0.375, rel=1e-12)
    check_energy(lower)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_whose_requests_were_all_aborted_in_flight_gets_a_row_of_its_own(engine):
    # test_pipeline_parallel's abort in flight: batch A (r0's prompt of 16, 8 ms) and B (r1's) at
    # 0: A at stage 0 0-4 and 5.25-9.25, B 4-8 and 9.25-13.25. r1 gives up at 5; heard at 9.25. C
    # (r0's decode + r2's prompt of 15: 15.5 ms, 7.75 a stage, send 1.25) 9.25-17, 18.25-26. B lands
    # at 13.25 without r1: its row lasts 0 ms; a row of no token covers 9.25-13.25, its energy for
    # nobody. Constant power: 300 W a slice, 40 W otherwise.
    def power(cost):
        return FixedActivePowerModel(FixedActiveConfig(), 1, active_w=300.0, standby_w=40.0, idle_w=40.0)

    requests = [Request(0, 0.0, 16, 2), Request(1, 0.0, 16, 2, timeout_ms=5.0), Request(2, 1.0, 15, 1)]
    r = run_pipelined(requests, instance(3, budget=16), 2, engine=engine, power=power)
    t = r.timeline
    rows = sorted(zip(t["time_ms"].tolist(), t["duration_ms"].tolist(), t["iterations"].tolist(),
                      t["energy_j"].tolist()))
    # [0, 9.25]: stage 0 busy 8, stage 1 busy 4 (A); [9.25, 13.25]: stage 0 C, stage 1 B;
    # [13.25, 26]: stage 0 C to 17 then idle, stage 1 idle to 18.25, C
    assert rows == [(0.0, 9.25, 1, pytest.approx(0.3 * 12 + 0.04 * 6.5)), (9.25, 0.0, 1, 0.0),
                    (9.25, 4.0, 0, pytest.approx(0.3 * 8)),
                    (13.25, 12.75, 1, pytest.approx(0.3 * (3.75 + 7.75) + 0.04 * (9 + 5)))]
    # A's 2.4 J are r0's; C's 4.65 J go to its 16 tokens, r0's decode and r2's 15 prompt tokens
    assert by_id(r, "energy_j") == pytest.approx({0: 0.3 * 8 + 0.3 * 15.5 / 16,
                                                  1: 0.0, 2: 0.3 * 15.5 * 15 / 16})
    check_energy(r, shared=False)  # (B's 2.4 J belong to no request)
    inst = r.meta["energy"]["instances"][0]
    assert inst["busy_j"] - r.requests["energy_j"].sum() == pytest.approx(0.3 * 8)


# -- both engines, conservation ----------------------------------------------------------------------------

SETTINGS = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same_energy(fast, ref) -> None:
    """Per instance and stage: the same busy and idle energy, and the same energy in its rows."""
    a, b = fast.meta["energy"]["instances"], ref.meta["energy"]["instances"]
    for x, y in zip(a, b):
        for key in ("busy_j", "idle_j", "busy_ms", "peak_w"):
            assert math.isclose(x[key], y[key], rel_tol=1e-9, abs_tol=1e-9), (key, x, y)
        for sx, sy in zip(x["stages"], y["stages"]):
            assert sx == pytest.approx(sy, rel=1e-9, abs=1e-9)
        for key in ("standby_left", "tails"):
            assert np.allclose(x[key], y[key], rtol=1e-9, atol=1e-9) if x[key] else not y[key], (key, x, y)
    for inst in range(len(a)):
        rows = [run.timeline["energy_j"][run.timeline["instance"] == inst].sum() for run in (fast, ref)]
        assert math.isclose(*rows, rel_tol=1e-9, abs_tol=1e-9)


def metered_pipelines_agreeing(requests, make, stages: int, instances: int, router, power, **kw) -> list:
    """Both engines' runs of ``requests`` on pipelined instances with ``power``, checked to agree
    (metrics, energy per instance and stage) and to conserve energy; the runs, fast first."""
    runs = [run_pipelined(requests, make, stages, instances, ROUTERS[router]() if instances > 1 else None,
                          engine=engine, power=power, **kw) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    same_energy(*runs)
    for run in runs:  # (batches that gave no token, or only swapped, give their energy to nobody)
        check_energy(run, shared=not run.counters["swap_out_blocks"] and not run.requests["aborted"].any())
    return runs


@SETTINGS
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=60, all_at_zero=False, priorities=True,
                      prefix_groups=2),
       schedulers(), st.integers(2, 4), st.integers(1, 2), st.sampled_from(sorted(ROUTERS)), dyadic_linear_costs(),
       st.integers(0, 30), st.booleans(), st.sampled_from([0.0, 0.02]), st.sampled_from([0.0, 0.005]),
       st.sampled_from([None, 15.0, 60.0]))
def test_pipelined_energy_agrees_between_engines_and_is_conserved(requests, cfg, stages, instances, router, cost,
                                                                 spare, prefix, standby_s, tail_s, timeout):
    """Random arrivals, preemption (swaps too), prefix caches, clients giving up in flight, idle
    stretches with standby and tails: both engines draw the same energy per instance, stage and
    request, and each run's energy is the integral of the power its timeline redraws."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20,
                                                         host_link_gbps=2 ** 10 / 1e3)
        return ContinuousScheduler(cfg), LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False), kv

    side = client_side(timeout) if timeout is not None else None
    runs = metered_pipelines_agreeing(requests, make, stages, instances, router, utilisation(standby_s, tail_s),
                                      client_side=side)
    check_run(runs[0], requests, max_running=cfg.max_num_seqs * instances, kv_blocks=blocks * instances)


CLOCKS = st.one_of(st.sampled_from([200.0, 500.0, 1000.0, 2000.0]).map(lambda mhz: {"mhz": mhz}),
                   st.sampled_from([6.0, 12.0, 20.0, 40.0]).map(lambda t: {"policy": "slo", "tpot_ms": t,
                                                                           "step_mhz": 300.0}))


@SETTINGS
@given(requests_lists(min_size=1, max_size=14, max_prompt=60, max_output=60, all_at_zero=False),
       schedulers(), st.integers(2, 3), st.integers(1, 2), dyadic_linear_costs(), st.integers(0, 30), CLOCKS,
       st.sampled_from([0.0, 0.02]))
def test_clocked_pipelines_agree_between_engines_and_conserve_energy(requests, cfg, stages, instances, cost, spare,
                                                                     clock, standby_s):
    """Fixed clocks and the governor (a clock per batch): both engines launch the same batches at
    the same clocks, draw the same energy, and conserve it."""
    blocks = blocks_for_largest(requests, 4) + spare

    def make():
        kv = PagedKVCache(blocks, 4, swap_blocks=16, bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)
        inner = LinearParallelCost(LinearCostModel(cost), stages=stages, moe=False)
        return ContinuousScheduler(cfg), ClockedCostModel(inner, GPU, ClockConfig(**{**LAW, **clock})), kv

    metered_pipelines_agreeing(requests, make, stages, instances, "round_robin", utilisation(standby_s, 0.005))


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=10, max_prompt=400, max_output=200, all_at_zero=False), schedulers(),
       st.integers(2, 3), st.integers(0, 20),
       st.sampled_from([None, {"mhz": 900.0}, {"policy": "slo", "tpot_ms": 30.0}]))
def test_roofline_pipelines_agree_between_engines_and_conserve_energy(requests, cfg, stages, spare, clock):
    """The roofline's stages (Llama-3.1-8B on H100s: its host share on the first stage, kernels
    apart) through the utilisation model as a run builds it against the instance's StageCost."""
    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // 16) for r in requests)
    gpu = PRESETS.gpu("h100-80gb")

    def make():
        cost = RooflineCostModel(PRESETS.model("llama-3.1-8b"), gpu, RooflineConfig(model="llama-3.1-8b",
                                                                                     gpu="h100-80gb"),
                                 parallelism=Parallelism(pipeline_parallel=stages))
        if clock is not None:
            cost = ClockedCostModel(cost, gpu, ClockConfig(**clock))
        return ContinuousScheduler(cfg), cost, PagedKVCache(need + spare, 16, swap_blocks=64,
                                                             bytes_per_block=2 ** 20, host_link_gbps=2 ** 10 / 1e3)

    def power(cost):
        return build_utilisation(UtilisationConfig(standby_s=0.05), PRESETS, cost)

    metered_pipelines_agreeing(requests, make, stages, 1, "round_robin", power)


# -- TOML ---------------------------------------------------------------------------------------------------

PROFILE = "experiments/data/llmservingsim/profiles/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def _write(tmp_path, extra: str, name: str = "exp.toml", *, profiled: bool = False, gpu: str = "h100-80gb"):
    """test_pipeline_parallel's experiment (Qwen3-32B, roofline) on ``gpu``, keeping a timeline,
    with ``extra``; ``profiled``: Qwen3-30B-A3B on the shipped RTX PRO 6000 profiles."""
    from pathlib import Path

    text = textwrap.dedent(BASE).replace('name = "pp"', 'name = "pp"\ntimeline = true')
    if profiled:
        profile = Path(__file__).resolve().parents[1] / PROFILE
        text = text.replace("qwen3-32b", "qwen3-30b-a3b").replace('kind = "roofline"',
                                                                  f'kind = "profiled"\nprofile = "{profile}"')
    else:
        text = text.replace("rtx-pro-6000-server", gpu)
    path = tmp_path / name
    path.write_text(text + textwrap.dedent(extra))
    return path


PIPELINE = """
    [power]
    kind = "utilisation"
    [slo]
    tpot_ms = 80
    [cluster]
    pipeline_parallel = 2
    instances = 2
"""


@pytest.mark.parametrize("profiled", [False, True])
def test_pipelined_instances_with_power_in_toml_run_in_both_engines(tmp_path, profiled):
    """The roofline's (Qwen3-32B) and the profiled model's (Qwen3-30B-A3B) pipelines, metered
    through the run's assembly: energy per token and per instance, every stage's."""
    fast = fast_run_agreeing_with_reference(_write(tmp_path, PIPELINE, profiled=profiled))
    e = fast.metrics["energy"]
    tokens = int(fast.requests["generated_tokens"].sum())
    assert e["gpu_j"] > 0 and e["j_per_token"] == pytest.approx(e["gpu_j"] / tokens)
    assert set(e["per_instance"]) == {"0", "1"}
    for inst in fast.meta["energy"]["instances"]:
        assert len(inst["stages"]) == 2 and all(s["busy_j"] > 0 for s in inst["stages"])
        assert inst["busy_j"] == pytest.approx(sum(s["busy_j"] for s in inst["stages"]))
    check_energy(fast)


def test_saved_pipelined_results_redraw_the_same_power(tmp_path):
    """The stages' standby left and tails at each idle stretch go into the saved record: a run
    read back redraws the same power, and its energy is still that power's integral."""
    from schedlab.energy.timeline import integral_j
    from schedlab.results.storage import load as load_saved
    from schedlab.results.storage import save
    from schedlab.study.experiment import run_experiment
    from schedlab_plugins.reports.plot_timeline import has_power, timeline_figure

    results = run_experiment(load(_write(tmp_path, PIPELINE)))
    save(results, tmp_path / "out")
    saved, fresh = load_saved(tmp_path / "out").all_runs()[0], results.all_runs()[0]
    assert any(inst["standby_left"] for inst in saved.meta["energy"]["instances"])
    for k in (0, 1):
        assert integral_j(*power_steps(saved, k)) == pytest.approx(integral_j(*power_steps(fresh, k)), rel=1e-9)
    check_energy(saved)
    assert has_power(saved)
    fig = timeline_figure(saved, 60)
    assert len([line for ax in fig.axes for line in ax.get_lines()
                if (line.get_gid() or "").startswith("timeline:power")]) == 2


def test_a_pipelined_runs_steady_state_energy_is_read_from_its_whole_timeline(tmp_path):
    """Review energy82: ``steady_state_energy`` took a pipelined run's rows -- all stages' energy
    over each row, idle stages too -- for a thinned timeline (their sum is not the iterations'
    busy_j) and gave NaN. The meter says what its rows carry (``rows_j``): a number, and over the
    whole run's rows their energy in all."""
    from schedlab.study.experiment import run_experiment
    from schedlab.targets import steady_state_energy

    run = run_experiment(load(_write(tmp_path, PIPELINE))).all_runs()[0]
    instances = run.meta["energy"]["instances"]
    rows_j = sum(inst["rows_j"] for inst in instances)
    assert float(np.sum(run.timeline["energy_j"])) == pytest.approx(rows_j, rel=1e-9)
    assert rows_j > sum(inst["busy_j"] for inst in instances)    # (the idle stage within each row)
    steady = steady_state_energy(run, batch=2)
    assert math.isfinite(steady["steady_j_per_token"]) and steady["steady_power_w"] > 0


@pytest.mark.parametrize("clock", ["mhz = 1000", 'policy = "slo"'])
def test_pipelined_instances_at_a_clock_in_toml_draw_less(tmp_path, clock):
    """A locked clock slows the prompts' compute-bound slices; the governor keeps batches with
    prompt tokens at the full clock and lowers decode batches, whose slices of Qwen3-32B stay
    memory-bound on an H100 even at its lowest clock: the same timing as at the full clock. Both
    draw less than the full clock."""
    clocked_run = fast_run_agreeing_with_reference(_write(tmp_path, PIPELINE + f"[clock]\n{clock}\n"))
    full = fast_run_agreeing_with_reference(_write(tmp_path, PIPELINE, "full.toml"))
    check_energy(clocked_run)
    assert clocked_run.metrics["energy"]["j_per_token"] < full.metrics["energy"]["j_per_token"]
    if clock.startswith("mhz"):
        assert clocked_run.metrics["ttft_ms"]["p50"] > full.metrics["ttft_ms"]["p50"]
    else:
        np.testing.assert_allclose(clocked_run.requests["finish_ms"], full.requests["finish_ms"], rtol=1e-12)


def test_a_cost_model_that_cannot_split_its_work_by_stage_is_refused_by_table(tmp_path, monkeypatch):
    from schedlab_plugins.cost_models import RooflineCostModel as Roofline

    power = _write(tmp_path, PIPELINE)
    clock = _write(tmp_path, PIPELINE.replace('[power]\n    kind = "utilisation"', "") + "[clock]\nmhz = 1000\n",
                   "clock.toml")
    load(power), load(clock)
    monkeypatch.delattr(Roofline, "stage_work")
    with pytest.raises(ConfigError, match=r"exp\.toml.*\[power\]: RooflineCostModel does not say the work of each "
                                          r"pipeline stage \(it needs stage_work"):
        load(power)
    with pytest.raises(ConfigError, match=r"clock\.toml.*\[clock\]: RooflineCostModel does not say the work of "
                                          r"each pipeline stage"):
        load(clock)


PIPELINE_TIMEOUT = """
[experiment]
reports = []
engine = "{engine}"
[workload]
kind = "inline"
requests = [{{prompt_tokens = 100, output_tokens = 200, arrival_ms = 0.0}},
            {{prompt_tokens = 100, output_tokens = 5, arrival_ms = 0.0}}]
[cost_model]
kind = "roofline"
model = "llama-3-8b"
gpu = "a100-80gb"
[scheduler]
kind = "vllm"
async_scheduling = false
[kv_cache]
kind = "paged"
num_blocks = 200
[cluster]
pipeline_parallel = 2
[client]
timeout_ms = 300.0
[power]
kind = "utilisation"
"""


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_batch_in_flight_whose_request_was_aborted_keeps_its_energy_accounted(tmp_path, engine):
    """The client gives up on the long answer at 300 ms, while a batch of it is in the pipeline:
    that batch's slices were drawn (busy_j), and its share went to no request and no bucket -- the
    kit's conservation check failed on every pipelined run with aborts (up to 49% short). Its
    share is now counted apart as discarded work (the request's row is written), as a colocated
    instance's decode of a request aborted after a plan made ahead is."""
    path = tmp_path / f"{engine}.toml"
    path.write_text(PIPELINE_TIMEOUT.format(engine=engine))
    run = load_run(path)
    assert run.requests["aborted"].tolist() == [1, 0]
    check_energy(run)
    assert run.meta["energy"]["instances"][0]["discarded_j"] > 0


def load_run(path):
    from schedlab.study.experiment import run_experiment

    return run_experiment(load(path)).all_runs()[0]


def test_both_engines_account_an_aborted_batch_alike(tmp_path):
    runs = {}
    for engine in ("fast", "reference"):
        path = tmp_path / f"{engine}.toml"
        path.write_text(PIPELINE_TIMEOUT.format(engine=engine))
        runs[engine] = load_run(path)
    compare_runs(runs["fast"], runs["reference"], rel=1e-9)
    assert runs["fast"].meta["energy"]["instances"][0]["discarded_j"] == pytest.approx(
        runs["reference"].meta["energy"]["instances"][0]["discarded_j"], rel=1e-9)
