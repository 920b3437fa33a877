"""Energy (schedlab.energy, the power-model plugins): hand-computed cases, the closed forms
against iteration-by-iteration sums, both engines against each other, and conservation --
a run's energy is the integral of its power over the timeline, and its iterations' energy is
shared out to the requests without loss."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.capacity import GpuSpec, Presets
from schedlab.catalog import load_catalog
from schedlab.energy.clock import ClockConfig, ClockedCostModel, clock_power_factor
from schedlab.energy.idle import idle_j, idle_steps, tail_j
from schedlab.energy.meter import run_j_by_iterations
from schedlab.energy.timeline import integral_j, power_steps
from schedlab.energy.work import Work, joined, peak_ms
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.protocols import Batch
from schedlab.testing import (check_energy, check_power_model, compare_runs, examples, requests_lists, run_cluster,
                              run_disaggregated, run_engine)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel, RooflineConfig, RooflineCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.power import (FixedActiveConfig, FixedActivePowerModel, TableConfig, UtilisationConfig,
                                    UtilisationPowerModel)
from schedlab_plugins.power.common import find_clock
from schedlab_plugins.power.table import build_table
from schedlab_plugins.power.utilisation import build_utilisation
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

ENGINES = ("fast", "reference")
SETTINGS = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRESETS = Presets.from_catalog(load_catalog(entry_points=False))


def fixed_active(active=300.0, standby=90.0, idle=30.0, standby_s=0.010, tp=1, tail_s=0.0):
    config = FixedActiveConfig(active_w=active, standby_w=standby, idle_w=idle, standby_s=standby_s, tail_s=tail_s)
    return lambda cost: FixedActivePowerModel(config, tp, active_w=active, standby_w=standby, idle_w=idle)


def roofline(model="llama-3.1-8b", gpu="a100-40gb", tp=1):
    return RooflineCostModel(PRESETS.model(model), PRESETS.gpu(gpu),
                             RooflineConfig(model=model, gpu=gpu, tensor_parallel=tp))


def utilisation(**settings):
    return lambda cost: build_utilisation(UtilisationConfig(**settings), PRESETS, cost)


# --- idle stretches -----------------------------------------------------------------------------


def test_idle_stretch_by_hand():
    # standby 90 W for 10 ms after the last iteration, then 30 W
    assert idle_j(30, 90, 10, 0.0, 4) == pytest.approx(90 * 4e-3)           # inside the standby
    assert idle_j(30, 90, 10, 0.0, 25) == pytest.approx(90 * 10e-3 + 30 * 15e-3)
    assert idle_j(30, 90, 10, 6.0, 10) == pytest.approx(90 * 4e-3 + 30 * 6e-3)  # 6 ms already spent
    assert idle_j(30, 90, 10, math.inf, 25) == pytest.approx(30 * 25e-3)    # never worked: idle throughout
    assert idle_j(30, 90, 10, 0.0, 0.0) == 0.0


def test_tail_by_hand():
    # 200 W above standby fading with a 4 ms time constant: over its first 4 ms it gives
    # 200 x 4 x (1 - 1/e) W ms, over the next 4 ms 1/e of that, in all 200 x 4 = 800 W ms.
    first = 200 * 4 * (1 - math.exp(-1)) * 1e-3
    assert tail_j(200, 4, 0.0, 4) == pytest.approx(first)
    assert tail_j(200, 4, 4.0, 4) == pytest.approx(first * math.exp(-1))
    assert tail_j(200, 4, 0.0, 1e6) == pytest.approx(0.8)
    assert tail_j(200, 4, math.inf, 10) == 0.0 and tail_j(200, 0.0, 0.0, 10) == 0.0
    # on top of standby (90 W for 10 ms) and idle (30 W): 25 ms after an iteration
    expected = (90 * 10 + 30 * 15) * 1e-3 + 0.8 * -math.expm1(-25 / 4)
    assert idle_j(30, 90, 10, 0.0, 25, 200, 4) == pytest.approx(expected)
    # the steps that redraw it: cut where standby ends and through the tail, exact in the mean
    steps = idle_steps(30, 90, 10, 25, 200, 4)
    assert sum(length for length, _ in steps) == pytest.approx(25)
    assert sum(length * w for length, w in steps) * 1e-3 == pytest.approx(expected, rel=1e-12)
    assert steps[0] == (1.0, pytest.approx(90 + 200 * 4 * -math.expm1(-0.25)))  # the first quarter time constant
    assert all(a[1] >= b[1] for a, b in zip(steps, steps[1:]))                    # power only falls
    assert idle_steps(30, 90, 10, 25) == [(10, 90), (15, 30)]                      # no tail: standby, idle


# --- a whole run by hand ------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_energy_per_request_and_token_counts_completed_requests_only(engine):
    """The run above, each request 2.5 ms later at the engine (the network) and 5 ms later at its
    client; request 1's client gives up 15 ms after sending it (at 45), before its last token
    reaches it (47.5): the engine finished it, its client did not. Energy -- 6 J busy, 1.2 J
    between, and the 2.5 ms before the first arrival idle at 30 W, 0.075 J: 7.275 J over 0..42.5 ms,
    from 0 as the GPU-hours (energy review s79: the window started at the first arrival) -- for one
    completed request of 3 tokens: 7.275 J per request, 2.425 J per token (audit s57: halved, as if
    both had completed). Each request's own 3 J share counts for its class; a class with nothing
    completed has no J per request."""
    from schedlab.frontend import ClientConfig, ClientSide, FrontendConfig

    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0))
    side = ClientSide(FrontendConfig(network_ms=2.5, request_ms=0.0, tokenize_ms_per_token=0.0, token_ms=2.5),
                      ClientConfig(classes={"late": {"timeout_ms": 15.0}}))
    requests = [Request(0, 0.0, 4, 3, request_class="chat"), Request(1, 30.0, 4, 3, request_class="late")]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig()), cost, engine=engine, power=fixed_active(),
                   client_side=side)
    assert r.requests["finish_ms"].tolist() == [12.5, 42.5] and r.requests["timed_out"].tolist() == [0, 1]
    e = r.metrics["energy"]
    assert e["gpu_j"] == pytest.approx(7.275) and e["attributed_j"] == pytest.approx(6.0)
    assert e["j_per_request"] == pytest.approx(7.275)
    assert e["j_per_token"] == pytest.approx(2.425)
    assert r.meta["energy"]["window_ms"] == [0.0, 42.5]
    assert e["request_j"]["mean"] == pytest.approx(3.0) and e["request_j"]["max"] == pytest.approx(3.0)
    chat, late = (r.metrics["per_class"][k]["energy"] for k in ("chat", "late"))
    assert chat == pytest.approx({"j": 3.0, "j_per_request": 3.0, "j_per_token": 1.0})
    assert late["j"] == pytest.approx(3.0) and math.isnan(late["j_per_request"]) and math.isnan(late["j_per_token"])


@pytest.mark.parametrize("engine", ENGINES)
def test_fixed_active_run_by_hand(engine):
    # Linear costs: 0.5 ms per prompt token, 4 ms per decode step. Each request: prompt 4,
    # output 3 -> prefill 2 ms (first token), then 2 decode steps of 4 ms: 10 ms busy.
    # Request 0 arrives at 0 and finishes at 10; request 1 at 30, finishes at 40.
    # Busy: 20 ms at 300 W = 6 J. The gap 10..30: 10 ms standby at 90 W + 10 ms idle at 30 W
    # = 0.9 + 0.3 J. Window 0..40 ms: 7.2 J in all; 6 tokens -> 1.2 J per token.
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0))
    requests = [Request(0, 0.0, 4, 3), Request(1, 30.0, 4, 3)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig()), cost, engine=engine, power=fixed_active())
    e = r.metrics["energy"]
    assert e["busy_j"] == pytest.approx(6.0)
    assert e["idle_j"] == pytest.approx(1.2)
    assert e["gpu_j"] == pytest.approx(7.2)
    assert e["j_per_token"] == pytest.approx(1.2)
    assert e["j_per_request"] == pytest.approx(3.6)
    assert e["avg_power_w"] == pytest.approx(7.2 / 0.040)
    assert e["peak_power_w"] == pytest.approx(300.0)
    assert r.requests["energy_j"].tolist() == pytest.approx([3.0, 3.0])  # each its own 10 ms of iterations
    assert e["kwh"] == pytest.approx(7.2 / 3.6e6)
    check_energy(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_tail_after_iterations_by_hand(engine):
    # As above (busy 0..10 and 30..40 at 300 W, standby 90 W for 10 ms, idle 30 W), now with the
    # power falling from 300 W to standby with a 5 ms time constant: the gap 10..30 adds
    # 210 W x 5 ms x (1 - e^-4); the window ends with the last iteration, so nothing after it.
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0))
    requests = [Request(0, 0.0, 4, 3), Request(1, 30.0, 4, 3)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig()), cost, engine=engine,
                   power=fixed_active(tail_s=0.005))
    tail = 210 * 5 * -math.expm1(-20 / 5) * 1e-3
    assert r.metrics["energy"]["idle_j"] == pytest.approx(1.2 + tail)
    assert r.metrics["energy"]["busy_j"] == pytest.approx(6.0)
    inst = r.meta["energy"]["instances"][0]
    assert inst["tails"] == [[10.0, pytest.approx(210.0)], [40.0, pytest.approx(210.0)]]
    check_energy(r)
    # the redrawn power: 300 W until 10 ms, then falling from 90 + 210 x ... towards 90 W
    edges, watts = power_steps(r, 0)
    after = (edges[:-1] >= 10.0) & (edges[:-1] < 20.0)
    assert watts[after].max() < 300.0 and watts[after].min() > 90.0 and (np.diff(watts[after]) < 0).all()


def test_the_tail_after_a_bulk_run_starts_from_its_last_iteration():
    """A long decode run (the fast engine takes it at once) and then a gap: the tail starts
    from the power of the run's last iteration, as the reference engine's does."""
    requests = [Request(0, 0.0, 500, 1500), Request(1, 40_000.0, 100, 5)]
    runs = [run_engine(requests, ContinuousScheduler(ContinuousConfig()), roofline(), engine=engine,
                       power=utilisation()) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    model = utilisation()(roofline())
    last = Batch(num_decode=1, decode_context_tokens=500 + 1499)  # the 1,499th decode step: prompt + 1,499 tokens
    d = roofline().iteration_ms(last)
    tail = model.iteration_j(last, d) / d * 1e3 - model.standby_w
    for run in runs:
        first_gap = run.meta["energy"]["instances"][0]["tails"][0]
        assert first_gap[1] == pytest.approx(tail, rel=1e-9)
        check_energy(run)
    assert runs[0].meta["energy"]["instances"][0]["idle_j"] == pytest.approx(
        runs[1].meta["energy"]["instances"][0]["idle_j"], rel=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_shares_follow_tokens_by_hand(engine):
    # Request 0 (prompt 4, output 5) starts alone: prefill 0..2 ms (first token), decode 2..6.
    # Request 1 (prompt 8, output 2) arrives at 5; at t=6 it is admitted beside request 0's
    # decode: one iteration of 1 decode + 8 prompt tokens = 4 + 4 = 8 ms (6..14) at 300 W =
    # 2.4 J over 9 tokens: request 0 gets 2.4/9, request 1 gets 8 x 2.4/9. Then both decode
    # 14..18 (1.2 J, half each; request 1 is done) and request 0 alone 18..22.
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0))
    requests = [Request(0, 0.0, 4, 5), Request(1, 5.0, 8, 2)]
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig()), cost, engine=engine, power=fixed_active())
    finish = dict(zip(r.requests["id"].tolist(), r.requests["finish_ms"].tolist()))
    assert finish == {0: 22.0, 1: 18.0}
    got = dict(zip(r.requests["id"].tolist(), r.requests["energy_j"].tolist()))
    assert got[0] == pytest.approx(0.6 + 1.2 + 2.4 / 9 + 0.6 + 1.2)
    assert got[1] == pytest.approx(2.4 * 8 / 9 + 0.6)
    check_energy(r)


# --- the utilisation model by hand ----------------------------------------------------------------

GPU = GpuSpec("test-gpu", memory_gib=80, hbm_bandwidth_gbps=1000, bf16_tflops=100, host_link_gbps=32,
              board_w=400, idle_w=40, max_clock_mhz=2000, min_clock_mhz=200)


def _model(work, tp=1, clock=None, kernel=None, **settings):
    config = UtilisationConfig(awake=0.2, activity=1.0, **settings)
    return UtilisationPowerModel(config, GPU, tp, work, clock=clock, board_w=400.0, idle_w=40.0, kernel=kernel)


def test_utilisation_power_by_hand():
    # 1000 GB/s = 1e9 bytes per ms, 100 TFLOPS = 1e11 flops per ms.
    # 5e9 bytes and 1e10 flops in 10 ms: memory 5 ms (u = 0.5) bounds, compute 0.1 ms.
    # power = 40 + 360 x (0.2 + 1.0 x 0.5) = 292 W -> 2.92 J; two GPUs: 5.84 J
    batch = Batch(num_decode=4, decode_context_tokens=400)
    assert _model(lambda b: (5e9, 1e10)).iteration_j(batch, 10.0) == pytest.approx(2.92)
    assert _model(lambda b: (5e9, 1e10), tp=2).iteration_j(batch, 10.0) == pytest.approx(5.84)
    # compute-bound: 8e11 flops = 8 ms of 10 (u = 0.8) -> 40 + 360 x 1.0 = 400 W (the board limit)
    assert _model(lambda b: (1e9, 8e11)).iteration_j(batch, 10.0) == pytest.approx(4.0)
    # more than the limit is cut to it: u = 1.5 -> 400 W
    assert _model(lambda b: (1.5e10, 0.0)).iteration_j(batch, 10.0) == pytest.approx(4.0)
    m = _model(lambda b: (0.0, 0.0), standby_s=5.0)
    assert (m.idle_w, m.standby_w, m.standby_ms) == (40.0, pytest.approx(40 + 360 * 0.2), 5000.0)


def test_the_hosts_part_of_a_step_by_hand():
    # A 10 ms step whose kernels take 5 ms; 8e11 flops = 8 ms at the peak rate. Without the
    # split: 40 + 360 x min(1, 0.2 + 0.8) = 400 W -> 4 J. With it the kernels' 5 ms reach the
    # limit and the host's 5 ms draw the awake share: 40 x 10 + 360 x (5 + 0.2 x 5) = 2,560 W ms.
    batch = Batch(num_prefill=1, prefill_tokens=2000)
    compute = lambda b: (1e9, 8e11)  # noqa: E731
    assert _model(compute).iteration_j(batch, 10.0) == pytest.approx(4.0)
    assert _model(compute, kernel=lambda b: 5.0).iteration_j(batch, 10.0) == pytest.approx(2.56)
    # below the limit the split changes nothing: 5e9 bytes (5 ms) in kernels of 8 ms ->
    # 40 + 360 x (0.2 + 0.5) = 292 W either way
    memory = lambda b: (5e9, 1e10)  # noqa: E731
    assert _model(memory, kernel=lambda b: 8.0).iteration_j(batch, 10.0) == pytest.approx(2.92)
    # kernels said to outlast the step are held to it
    assert _model(compute, kernel=lambda b: 50.0).iteration_j(batch, 10.0) == pytest.approx(4.0)


def test_a_step_bound_by_compute_in_one_phase_and_memory_in_another_by_hand():
    # A 10 ms mixed step: its prompt GEMMs 2e9 bytes and 4e11 FLOPs (c = 4 ms bounds), its decodes'
    # attention 3e9 bytes and 1e9 FLOPs (m = 3 ms bounds): 7 ms of work at peak, u = 0.7 ->
    # 40 + 360 x (0.2 + 0.7) = 364 W -> 3.64 J. The totals alone (5e9 bytes, 4.01e11 FLOPs) would
    # say max(5, 4.01) = 5 ms -> 292 W.
    batch = Batch(num_prefill=1, prefill_tokens=512, num_decode=8, decode_context_tokens=8000)
    mixed = Work(((2e9, 4e11), (3e9, 1e9)))
    assert tuple(mixed) == (5e9, 4.01e11)
    assert _model(lambda b: mixed).iteration_j(batch, 10.0) == pytest.approx(3.64)
    assert _model(lambda b: tuple(mixed)).iteration_j(batch, 10.0) == pytest.approx(2.92)
    # joined work keeps each part's phases; a plain pair is one phase
    both = joined(mixed, (1e9, 0.0))
    assert tuple(both) == (6e9, 4.01e11) and both.phases == ((2e9, 4e11), (3e9, 1e9), (1e9, 0.0))
    assert peak_ms(both, 1e9, 1e11) == pytest.approx(8.0)
    # it survives pickling and copying (work crosses processes with a plugin's objects)
    for again in (pickle.loads(pickle.dumps(both)), copy.deepcopy(both)):
        assert tuple(again) == tuple(both) and again.phases == both.phases


@SETTINGS
@given(st.integers(1, 3_000), st.floats(0.5, 20.0), st.floats(-0.01, 0.05), st.floats(0.0, 4e11),
       st.floats(1e7, 5e9), st.floats(1e4, 1e6), st.floats(0.0, 2.0), st.booleans())
def test_phases_keep_the_closed_form(k, d0, inc, gemm_flops, kv_base, bytes_per_token, cross, kernels):
    """Each phase's bound may change sides at its own step of a bulk run -- here attention's KV
    read gives way to its FLOPs at step ``cross x k`` as the contexts grow, beside a constant GEMM
    phase --: the closed form over the pieces still equals the sum, and says the highest power."""
    inc = max(inc, -d0 / (2 * k))
    at = 400 + 4 * cross * k  # the context where attention's two bounds meet
    flops_per_token = (kv_base + bytes_per_token * at) / 1e9 * 1e11 / at

    def work(b):
        ctx = b.decode_context_tokens
        return Work(((1e9, gemm_flops), (kv_base + bytes_per_token * ctx, flops_per_token * ctx)))

    kernel = (lambda b: 0.6 * d0 + 0.001 * (b.decode_context_tokens - 400)) if kernels else None
    check_power_model(_model(work, kernel=kernel), Batch(num_decode=4, decode_context_tokens=400), k, d0, inc)


@SETTINGS
@given(st.integers(1, 3_000), st.floats(0.5, 20.0), st.floats(-0.01, 0.05), st.floats(0.1, 20.0),
       st.floats(0.0, 0.02), st.floats(1e6, 5e7))
def test_the_split_keeps_the_closed_form(k, d0, inc, k0, dk, bytes_per_token):
    """Over a bulk run the kernels' time, the step and the work grow at their own rates: the
    cap and which side of each ``min`` and ``max`` holds change within the run, and the closed
    form still equals the sum (and says the highest power)."""
    inc = max(inc, -d0 / (2 * k))  # the step stays positive
    work = lambda b: (1e9 + bytes_per_token * b.decode_context_tokens, 3e10 * b.num_decode)  # noqa: E731
    kernel = lambda b: k0 + dk * (b.decode_context_tokens - 4 * 100) / 4  # noqa: E731
    check_power_model(_model(work, kernel=kernel), Batch(num_decode=4, decode_context_tokens=400), k, d0, inc)


@SETTINGS
@given(st.integers(1, 64), st.integers(0, 40_000), st.integers(1, 3_000), st.floats(0.5, 50.0),
       st.floats(0.0, 0.2), st.sampled_from(["l4", "a100-40gb", "h100-80gb", "rtx-a6000"]),
       st.sampled_from([None, 210.0, 900.0]))
def test_built_in_power_models_keep_the_contract(n, context, k, d0, inc, gpu, mhz):
    """Every built-in's closed form over a bulk run against iteration-by-iteration sums (the
    utilisation model's across the bounds changing sides and the board limit: big contexts on
    small GPUs), never below idle power. The table model reads no clock: it is built against
    the cost model without one."""
    plain = cost = roofline(gpu=gpu)
    if mhz is not None:
        cost = ClockedCostModel(cost, PRESETS.gpu(gpu), ClockConfig(mhz=mhz))
    batch = Batch(num_decode=n, decode_context_tokens=context + n)
    for model in (build_utilisation(UtilisationConfig(), PRESETS, cost),
                  build_table(TableConfig(fit="mlenergy-a100-40gb-llama-3.1-8b"), PRESETS, plain),
                  fixed_active(standby_s=18.0)(cost)):
        check_power_model(model, batch, k, d0, inc)


def test_the_kit_checks_every_iteration_against_idle_power():
    """check_power_model asserts that no iteration of the run draws less than idle power -- every
    one, not only the first and the last (a model dipping below idle in the middle of a run passed)."""

    class Dips:
        idle_w, standby_w, standby_ms = 100.0, 150.0, 1000.0

        def iteration_j(self, batch, duration_ms):  # 300 W, but 50 W at an odd context
            return (50.0 if batch.decode_context_tokens % 2 else 300.0) * duration_ms * 1e-3

    batch = Batch(num_decode=1, decode_context_tokens=100)  # contexts 100, 101, 102: 300, 50, 300 W
    with pytest.raises(AssertionError, match=r"iteration 1 of the run: 0\.5 J over 10\.0 ms is below idle power"):
        check_power_model(Dips(), batch, 3, 10.0, 0.0)
    check_power_model(Dips(), batch, 1, 10.0, 0.0)  # (its first iteration alone keeps the contract)

    class SinksAfter(Dips):
        def iteration_j(self, batch, duration_ms):
            return 300.0 * duration_ms * 1e-3

        def standby_after(self, batch):  # below idle after an odd context
            return 60.0 if batch.decode_context_tokens % 2 else 150.0

    with pytest.raises(AssertionError, match=r"after iteration 1 of the run: standby 60\.0 W is below idle power"):
        check_power_model(SinksAfter(), batch, 3, 10.0, 0.0)


def test_table_model_interpolates_and_holds_at_the_ends():
    model = build_table(TableConfig(points=[[1, 100], [5, 300]], idle_w=20, standby_w=60), PRESETS, None, 2)
    assert model.watts(0) == 100 and model.watts(9) == 300 and model.watts(3) == pytest.approx(200)
    assert model.iteration_j(Batch(num_decode=3), 10.0) == pytest.approx(2 * 200 * 10e-3)
    batch = Batch(num_decode=3, decode_context_tokens=30)
    assert model.run_j(batch, 7, 2.0, 0.25) == pytest.approx(run_j_by_iterations(model, batch, 7, 2.0, 0.25))


# --- both engines, conservation ---------------------------------------------------------------------


@SETTINGS
@given(requests_lists(max_size=10, max_prompt=400, max_output=300, all_at_zero=False), st.integers(1, 8),
       st.booleans(), st.integers(40, 400), st.sampled_from(["l4", "a100-40gb"]))
def test_engines_agree_on_energy_and_conserve_it(requests, max_seqs, chunked, num_blocks, gpu):
    """Bulk decode runs (closed form) against one iteration at a time: the same energy, per
    request and per run, and both equal to the integral of power over the timeline."""
    cfg = ContinuousConfig(max_num_seqs=max_seqs, max_num_batched_tokens=256, chunked_prefill=chunked,
                           allocation="grow")
    runs = [run_engine(requests, ContinuousScheduler(cfg), roofline(gpu=gpu),
                       PagedKVCache(num_blocks, 16, swap_blocks=32), engine=engine, power=utilisation(standby_s=0.05))
            for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    for run in runs:
        check_energy(run)
    assert runs[0].meta["events"] <= runs[1].meta["events"]


def test_energy_is_exact_over_a_long_bulk_run():
    """One request decoding 2,000 tokens: the fast engine does it in a handful of events."""
    requests = [Request(0, 0.0, 500, 2000)]
    runs = [run_engine(requests, ContinuousScheduler(ContinuousConfig()), roofline(), engine=engine,
                       power=utilisation()) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    assert runs[0].meta["events"] < 50 and runs[1].meta["events"] == 2000
    for run in runs:
        check_energy(run)


def test_energy_is_exact_when_arrivals_cut_a_pending_bulk_run():
    """Requests arriving during a long decode run cut the fast engine's pending run at the
    iteration in progress: the meter integrates only the iterations applied, then the rest."""
    requests = [Request(0, 0.0, 500, 2000)] + [Request(i, 3000.0 * i + 0.37, 100, 50) for i in range(1, 4)]
    runs = [run_engine(requests, ContinuousScheduler(ContinuousConfig()), roofline(), engine=engine,
                       power=utilisation()) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    assert runs[0].meta["events"] < 200 < runs[1].meta["events"]
    for run in runs:
        check_energy(run)


@pytest.mark.parametrize("engine", ENGINES)
def test_cluster_and_disaggregated_runs_conserve_energy(engine):
    from schedlab_plugins.routers import RoundRobinRouter

    requests = [Request(i, 40.0 * i, 50 + 30 * i, 20 + 7 * i) for i in range(8)]
    make = lambda: (ContinuousScheduler(ContinuousConfig()), roofline(), PagedKVCache(400, 16))  # noqa: E731
    cluster = run_cluster(requests, make, 2, RoundRobinRouter(), engine=engine, power=utilisation())
    check_energy(cluster)
    assert set(cluster.metrics["energy"]["per_instance"]) == {"0", "1"}
    pd = run_disaggregated(requests, make, make, engine=engine, power=utilisation())
    check_energy(pd)


def test_no_power_table_no_energy():
    r = run_engine([Request(0, 0.0, 4, 3)], ContinuousScheduler(ContinuousConfig()))
    assert "energy" not in r.metrics and "energy" not in r.meta
    assert np.isnan(r.timeline["energy_j"]).all() and r.requests["energy_j"].tolist() == [0.0]


# --- the clock --------------------------------------------------------------------------------------


def test_clock_law_by_hand():
    # compute 1e11 flops at 100 TFLOPS x 0.5 efficiency = 2 ms; memory 1e9 bytes at 1000 GB/s x 0.5 = 2 ms
    class Work:
        def iteration_ms(self, batch):
            return 5.0

        def work(self, batch):
            return (1e9, 1e11) if batch.prefill_tokens else (4e9, 1e10)

    # (the law above its knee: the knee at the lowest clock, the floor the old default's)
    cfg = ClockConfig(mhz=1000.0, compute_efficiency=0.5, bandwidth_efficiency=0.5, knee_mhz=200.0,
                      voltage_floor=0.65)
    clocked = ClockedCostModel(Work(), GPU, cfg)
    # at half clock the compute takes 4 ms: max(4, 2) - max(2, 2) = 2 ms more
    assert clocked.iteration_ms(Batch(num_prefill=1, prefill_tokens=100)) == pytest.approx(7.0)
    # memory-bound (8 ms of memory, 0.2 ms of compute -> 0.4): no slower
    assert clocked.iteration_ms(Batch(num_decode=4, decode_context_tokens=40)) == pytest.approx(5.0)
    # power factors: voltage 0.65 at 200 MHz, 1 at 2000 -> at 1000 MHz 0.65 + 0.35 x 800/1800;
    # the awake power r v^2, the work's 30% off the core rail plus 70% x v^2
    v = 0.65 + 0.35 * 800 / 1800
    assert clock_power_factor(0.5, 0.1, 0.65, 0.7) == pytest.approx((0.5 * v * v, 0.3 + 0.7 * v * v))
    assert clock_power_factor(1.0, 0.1, 0.65, 0.7) == (1.0, 1.0)


class KneeWork:
    """An iteration as long as its work at the highest clock on :data:`GPU` at half the peak
    rates: a decode memory-bound (4e9 bytes: 8 ms; 1e10 FLOPs: 0.2 ms), a prompt compute-bound
    (1e11 FLOPs: 2 ms; 1e9 bytes: 2 ms)."""

    def iteration_ms(self, batch):
        return 2.0 if batch.prefill_tokens else 8.0

    def work(self, batch):
        return (1e9, 1e11) if batch.prefill_tokens else (4e9, 1e10)


DECODE, PROMPT = Batch(num_decode=4, decode_context_tokens=40), Batch(num_prefill=1, prefill_tokens=100)


def _kneed(mhz, **clock):
    """:class:`KneeWork` locked at ``mhz`` on :data:`GPU` (200-2,000 MHz), the knee at 1,000 MHz."""
    return ClockedCostModel(KneeWork(), GPU, ClockConfig(mhz=mhz, compute_efficiency=0.5, bandwidth_efficiency=0.5,
                                                         knee_mhz=1000.0, voltage_floor=0.65, **clock))


def test_memory_bound_work_slows_below_the_knee_by_hand():
    """Above the knee (r = 0.5) memory traffic takes as long at any clock; below it ``knee / r``
    of that (the L2 and crossbar run on the SM clock), so a memory-bound step stretches by
    exactly ``r_knee / r``; compute as ``1 / r`` throughout."""
    assert _kneed(2000.0).iteration_ms(DECODE) == 8.0
    assert _kneed(1500.0).iteration_ms(DECODE) == pytest.approx(8.0)  # above the knee: no slower
    assert _kneed(1000.0).iteration_ms(DECODE) == pytest.approx(8.0)  # at it
    assert _kneed(800.0).iteration_ms(DECODE) == pytest.approx(8.0 * 0.5 / 0.4)  # 10 ms
    assert _kneed(500.0).iteration_ms(DECODE) == pytest.approx(8.0 * 0.5 / 0.25)  # 16 ms
    assert _kneed(200.0).iteration_ms(DECODE) == pytest.approx(8.0 * 0.5 / 0.1)  # 40 ms
    # the prompt: compute 2 / r against memory 2 x 0.5 / r below the knee -- the compute bounds
    assert _kneed(500.0).iteration_ms(PROMPT) == pytest.approx(2.0 + 8.0 - 2.0)
    # at the knee the voltage is at its floor and stays there below it
    assert _kneed(500.0).r_min == _kneed(2000.0).knee == 0.5
    assert clock_power_factor(0.25, 0.5, 0.65, 0.7) == pytest.approx((0.25 * 0.65 ** 2, 0.3 + 0.7 * 0.65 ** 2))
    v = 0.65 + 0.35 * 0.25 / 0.5  # at r = 0.75: linear from the knee
    assert clock_power_factor(0.75, 0.5, 0.65, 0.7) == pytest.approx((0.75 * v * v, 0.3 + 0.7 * v * v))
    # a knee at (or above) the highest clock: every lower clock at the floor, as a knee just below it
    # gives -- not the top clock's voltage (it jumped from 0.65 to 1 between knees of 0.999 and 1)
    for knee in (0.999, 1.0, 1.2):
        assert clock_power_factor(0.5, knee, 0.65, 0.7) == pytest.approx((0.5 * 0.65 ** 2, 0.3 + 0.7 * 0.65 ** 2))
    assert clock_power_factor(1.0, 1.0, 0.65, 0.7) == (1.0, 1.0)


def test_a_memory_bound_steps_energy_is_lowest_at_the_knee_by_hand():
    """Energy against the clock for a memory-bound decode is U-shaped, its bottom at the knee
    (as Voltana measured on an A100): above it the voltage falls at no cost in time; below it the
    step lasts ``knee / r`` longer while the awake share falls only as ``r`` and idle not at all.

    Utilisation model on :data:`GPU` (idle 40 W, board 400, awake 0.2, activity 1): the decode's
    4e9 bytes are x = 4 ms at the peak rate; E = (40 d + 360 (0.2 r v^2 d + (0.3 + 0.7 v^2) x)) / 1000.
    Full clock: d 8, v 1 -> 2.336 J. r 0.75: v 0.825 -> (320 + 360 (0.81675 + 3.10575)) / 1000 =
    1.7321 J. The knee, r 0.5: v 0.65 -> (320 + 360 (0.338 + 2.383)) / 1000 = 1.29956 J. r 0.25:
    d 16 -> (640 + 360 (0.338 + 2.383)) / 1000 = 1.61956 J."""
    by_hand = {2000.0: 2.336, 1500.0: 1.7321, 1000.0: 1.29956, 500.0: 1.61956}
    got = {}
    for mhz in (2000.0, 1500.0, 1000.0, 500.0, 800.0, 1200.0, 300.0):
        clock = _kneed(mhz)
        got[mhz] = _model(clock.work, clock=clock).iteration_j(DECODE, clock.iteration_ms(DECODE))
    for mhz, joules in by_hand.items():
        assert got[mhz] == pytest.approx(joules, rel=1e-12), mhz
    assert min(got, key=got.get) == 1000.0  # the bottom of the U, with clocks on both sides costing more
    assert got[300.0] > got[500.0] > got[800.0] > got[1000.0] < got[1200.0] < got[1500.0] < got[2000.0]


def test_the_governor_never_goes_below_min_mhz():
    """The governor's levels start at ``min_mhz`` (default: the knee, below which no iteration
    takes less energy), however much room the target leaves."""
    def governed(**clock):
        return ClockedCostModel(KneeWork(), GPU, ClockConfig(policy="slo", tpot_ms=1000.0, compute_efficiency=0.5,
                                                             bandwidth_efficiency=0.5, knee_mhz=1000.0, **clock))

    knee, floor = governed(), governed(min_mhz=1300.0)
    assert knee.levels[0] == 0.5 and knee.clock_ratio(DECODE) == 0.5  # (the lowest clock: 200 MHz)
    assert knee.iteration_ms(DECODE) == pytest.approx(8.0)  # so no slower
    assert floor.levels[0] == 0.65 and floor.clock_ratio(DECODE) == 0.65
    assert min(floor.levels) * 2000.0 >= 1300.0
    assert governed(min_mhz=200.0).clock_ratio(DECODE) == 0.1  # below the knee only when asked
    with pytest.raises(ConfigError, match="min_mhz: 100 is outside"):
        governed(min_mhz=100.0)
    # the governor's settings under a fixed clock would do nothing: refused, named
    for key, value in (("min_mhz", 1300.0), ("tpot_ms", 40.0)):
        with pytest.raises(ConfigError, match=f"{key}: a setting of the 'slo' policy"):
            ClockedCostModel(KneeWork(), GPU, ClockConfig(policy="fixed", **{key: value}))


def test_the_default_law_saves_what_ma_et_al_measured_on_an_h200_at_its_knee():
    """The default voltage floor is fitted (``tools/derive_clock.py``) so that at the default
    knee a Llama-3.1-8B decode step on the H200 preset takes 32% less energy than at the highest
    clock -- the most Ma et al. measured clock locking to save on decode -- and at no loss of
    speed; lower clocks take more (the U). Rerun the tool when the power model's defaults change."""
    from schedlab.energy.clock import DEFAULT_KNEE, DEFAULT_VOLTAGE_FLOOR

    gpu = PRESETS.gpu("h200-141gb")
    batch = Batch(num_decode=32, decode_context_tokens=32_000)
    inner = roofline(gpu="h200-141gb")
    full = build_utilisation(UtilisationConfig(), PRESETS, inner)
    e1 = full.iteration_j(batch, inner.iteration_ms(batch))
    ratios = {}
    for mhz in (DEFAULT_KNEE * gpu.max_clock_mhz, 1200.0, 1700.0):
        clock = ClockedCostModel(inner, gpu, ClockConfig(mhz=mhz))
        assert clock.config.voltage_floor == DEFAULT_VOLTAGE_FLOOR
        ratios[mhz] = build_utilisation(UtilisationConfig(), PRESETS, clock).iteration_j(
            batch, clock.iteration_ms(batch)) / e1
        if mhz > 1400.0:
            assert clock.iteration_ms(batch) == inner.iteration_ms(batch)
    assert ratios[DEFAULT_KNEE * gpu.max_clock_mhz] == pytest.approx(0.68, abs=0.002)
    assert ratios[1200.0] > ratios[DEFAULT_KNEE * gpu.max_clock_mhz] < ratios[1700.0]


def test_maliakel_et_al_s_rtx_pro_6000_has_no_knee_above_its_lowest_clock():
    """The RTX PRO 6000's clocks and law come from Maliakel et al.'s measurement of that card:
    2,842 MHz highest, 180 lowest, decode no slower at 180 MHz (no knee above it)."""
    gpu = PRESETS.gpu("rtx-pro-6000")
    assert (gpu.max_clock_mhz, gpu.min_clock_mhz) == (2842, 180)
    inner = roofline(gpu="rtx-pro-6000")
    clock = ClockedCostModel(inner, gpu, ClockConfig(mhz=180.0))
    batch = Batch(num_decode=8, decode_context_tokens=8_000)
    assert clock.iteration_ms(batch) == inner.iteration_ms(batch)
    assert clock.config.voltage_floor == 0.65


def test_the_clock_laws_efficiency_defaults_say_where_they_come_from():
    """[clock]'s compute and bandwidth efficiencies are its own fixed defaults: the help says so
    and quotes the roofline's own figures, which are not the clock's (it claimed 0.77 was the
    roofline's mfu, 0.69 by default and 0.61 on the H100)."""
    import attrs

    from schedlab_plugins.cost_models.roofline import DERIVATION
    from schedlab_plugins.presets import MEASURED_EFFICIENCY

    fields = attrs.fields_dict(ClockConfig)
    compute, memory = (fields[name] for name in ("compute_efficiency", "bandwidth_efficiency"))
    assert (compute.default, memory.default) == (0.77, 0.91)
    h100 = MEASURED_EFFICIENCY["h100-80gb"][0]
    for help_text in (compute.metadata["help"], memory.metadata["help"]):
        assert "a fixed default, not read from the cost model" in help_text
    assert f"mfu: {DERIVATION['mfu']:g}, {h100['mfu']:g} on the H100 preset" in compute.metadata["help"]
    assert DERIVATION["mfu"] != compute.default != h100["mfu"]
    assert f"kv_read_efficiency is {DERIVATION['kv_read_efficiency']:g}" in memory.metadata["help"]
    assert f"bandwidth_efficiency {DERIVATION['bandwidth_efficiency']:g} by default" in memory.metadata["help"]
    assert h100["bandwidth_efficiency"] == DERIVATION["bandwidth_efficiency"]


def _governed(gpu="a100-40gb", tpot_ms=12.0):
    return ClockedCostModel(roofline(gpu=gpu), PRESETS.gpu(gpu), ClockConfig(policy="slo", tpot_ms=tpot_ms))


@SETTINGS
@given(requests_lists(max_size=10, max_prompt=300, max_output=300, all_at_zero=False), st.integers(1, 16),
       st.sampled_from([11.0, 14.0, 25.0]))
def test_clock_governor_engines_agree(requests, max_seqs, tpot_ms):
    """The governor picks a clock per iteration from its shape: a bulk run ends where the pick
    would change, so both engines run every iteration at the same clock."""
    cfg = ContinuousConfig(max_num_seqs=max_seqs, allocation="grow")
    runs = [run_engine(requests, ContinuousScheduler(cfg), _governed(tpot_ms=tpot_ms), PagedKVCache(600, 16),
                       engine=engine, power=utilisation()) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    for run in runs:
        check_energy(run)


@SETTINGS
@given(requests_lists(max_size=10, max_prompt=300, max_output=300, all_at_zero=False), st.integers(1, 16),
       st.sampled_from([{"mhz": 420.0}, {"mhz": 810.0}, {"policy": "slo", "tpot_ms": 25.0, "min_mhz": 210.0},
                        {"policy": "slo", "tpot_ms": 14.0, "min_mhz": 615.0}]))
def test_clocks_below_the_knee_engines_agree(requests, max_seqs, clock):
    """Below the knee (the A100's 1,005 MHz) memory-bound decodes stretch too: a bulk run's
    steps stay linear while neither side of the law's ``max`` changes (the memory side ``m x
    knee / r``), and a governor let below the knee (``min_mhz``) picks its levels alike: both
    engines run every iteration alike, at a locked clock and under the governor."""
    cfg = ContinuousConfig(max_num_seqs=max_seqs, allocation="grow")
    cost = ClockedCostModel(roofline(), PRESETS.gpu("a100-40gb"), ClockConfig(**clock))
    assert cost.knee == pytest.approx(1005.0 / 1410.0)
    runs = [run_engine(requests, ContinuousScheduler(cfg), cost, PagedKVCache(600, 16), engine=engine,
                       power=utilisation()) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    for run in runs:
        check_energy(run)


def test_clock_governor_keeps_decoding_iterations_within_the_target():
    from schedlab.engine.driver import simulate
    from schedlab.engine.instance import Instance
    from schedlab.engine.recorder import Recorder

    tpot = 20.0  # decode steps of this model on an A100-40GB take about 14.2 ms at the full clock: room to slow
    cost = _governed(tpot_ms=tpot)
    seen = []
    inst = Instance(0, ContinuousScheduler(ContinuousConfig()), cost, PagedKVCache(2000, 16), Recorder(),
                    observer=lambda i, rec: seen.append((rec.batch, rec.duration_ms)))
    simulate([Request(i, 30.0 * i, 200, 150) for i in range(12)], [inst])
    lowered = [(b, d) for b, d in seen if cost.clock_ratio(b) < 1.0]
    assert lowered, "the governor never lowered the clock"
    assert all(d <= 0.9 * tpot + 1e-9 for _, d in lowered)
    assert all(cost.clock_ratio(b) == 1.0 for b, _ in seen if b.prefill_tokens)  # prompt tokens: full clock


def test_lower_clock_saves_energy_on_decode():
    """A memory-bound decode at a lower clock down to the knee (the A100's 1,005 MHz): hardly
    slower, less energy; below the knee (810 MHz) slower, and more energy than at the knee."""
    requests = [Request(i, 0.0, 100, 300) for i in range(4)]
    full, knee, low = (run_engine(requests, ContinuousScheduler(ContinuousConfig()), cost, power=utilisation())
                       for cost in (roofline(), *(ClockedCostModel(roofline(), PRESETS.gpu("a100-40gb"),
                                                                   ClockConfig(mhz=mhz)) for mhz in (1005.0, 810.0))))
    assert knee.metrics["makespan_ms"] <= full.metrics["makespan_ms"] * 1.02
    assert knee.metrics["energy"]["gpu_j"] < full.metrics["energy"]["gpu_j"] * 0.95
    assert low.metrics["makespan_ms"] > knee.metrics["makespan_ms"] * 1.1
    assert knee.metrics["energy"]["gpu_j"] < low.metrics["energy"]["gpu_j"]


#: the clock law without a knee on :data:`GPU` (at its lowest clock) and the floor the law had
#: before it had one: for tests of what the clock does to standby, runs and engines
NO_KNEE = dict(knee_mhz=200.0, voltage_floor=0.65)


class FiveMs:
    """Every iteration 5 ms (a decode run's steps alike); a prompt's work compute-bound (1 ms of
    compute, 1 of memory on :data:`GPU` at full efficiency), a decode's memory-bound (0.1 ms of
    compute, 4 of memory): at the lowest clock, r = 0.1, a prompt would take 9 ms longer, a decode
    no longer."""

    def iteration_ms(self, batch):
        return 5.0

    def decode_step_increment(self, batch):
        return 0.0

    def work(self, batch):
        return (1e9, 1e11) if batch.prefill_tokens else (4e9, 1e10)


@pytest.mark.parametrize("engine", ENGINES)
def test_governed_standby_is_the_last_iterations_clocks_by_hand(engine):
    """The SLO governor sets the clock per iteration and nothing sets it back: after an iteration
    the GPU stands by at that iteration's clock, as at a locked one. Levels 200 MHz + 105 MHz
    steps up to 2,000 (r_min = 0.1); target 0.9 x 10 ms: a prompt runs at the full clock, the
    decodes (5 ms, memory-bound) at the lowest. Standby 100 ms, no tail; idle 40 W, board 400 W,
    awake 0.2: standby is 40 + 360 x 0.2 = 112 W at the full clock and 40 + 360 x 0.2 x 0.1 x
    0.65^2 = 43.042 W at the lowest (awake share r v^2, voltage 0.65 there).

    r0 (4 + 3 tokens) at 0: its prompt 0-5, decodes 5-15; r1 likewise at 1,000-1,015; r2 and r3
    (one token each) at 2,000-2,005 and 3,000-3,005, each a prompt alone. The idle stretches: after
    r0's and r1's last decodes 985 ms each, 100 at 43.042 W and 885 at 40 W (39.7042 J each); after
    r2's prompt 995 ms, 100 at 112 W and 895 at 40 W (47.0 J). (At the full clock's standby
    throughout: 46.6 + 46.6 + 47.0 J.)"""
    clock = ClockedCostModel(FiveMs(), GPU, ClockConfig(policy="slo", tpot_ms=10.0, step_mhz=105.0,
                                                        compute_efficiency=1.0, bandwidth_efficiency=1.0,
                                                        **NO_KNEE))
    requests = [Request(0, 0.0, 4, 3), Request(1, 1000.0, 4, 3), Request(2, 2000.0, 4, 1), Request(3, 3000.0, 4, 1)]
    power = lambda cost: _model(cost.work, clock=find_clock(cost), standby_s=0.1, tail_s=0.0)  # noqa: E731
    r = run_engine(requests, ContinuousScheduler(ContinuousConfig()), clock, PagedKVCache(64, 4), engine=engine,
                   power=power)
    assert r.requests["finish_ms"].tolist() == [15.0, 1015.0, 2005.0, 3005.0]
    inst = r.meta["energy"]["instances"][0]
    assert inst["standby_w"] == pytest.approx(112.0)  # (the full clock's: what a fresh GPU would keep)
    low = 40.0 + 360.0 * 0.2 * 0.1 * 0.65 ** 2
    assert low == pytest.approx(43.042)
    assert inst["standby_at"] == [[15.0, pytest.approx(low)], [1015.0, pytest.approx(low)]]
    assert inst["idle_j"] == pytest.approx(2 * (100 * low + 885 * 40.0) * 1e-3 + (100 * 112.0 + 895 * 40.0) * 1e-3)
    assert inst["idle_j"] == pytest.approx(39.7042 * 2 + 47.0)
    check_energy(r)
    edges, watts = power_steps(r, 0)
    assert watts[(edges[:-1] >= 15.0) & (edges[1:] <= 115.0)].tolist() == pytest.approx([low])
    model = power(clock)  # (the kit checks the standby it says after each iteration of a run)
    assert model.standby_after(Batch(num_decode=1, decode_context_tokens=4)) == pytest.approx(low)
    check_power_model(model, Batch(num_decode=1, decode_context_tokens=4), 3, 5.0, 0.0)


def test_governed_standby_engines_agree_with_bulk_runs_and_tails():
    """The same with a tail and longer runs of decodes: the fast engine's bulk runs (one call for
    the run, the standby after its last step) and the reference engine's steps draw alike."""
    clock = ClockedCostModel(FiveMs(), GPU, ClockConfig(policy="slo", tpot_ms=10.0, compute_efficiency=1.0,
                                                        bandwidth_efficiency=1.0, **NO_KNEE))
    requests = [Request(i, 700.0 * i, 4 + i, 40 - 3 * i) for i in range(6)]
    power = lambda cost: _model(cost.work, clock=find_clock(cost), standby_s=0.2, tail_s=0.03)  # noqa: E731
    runs = [run_engine(requests, ContinuousScheduler(ContinuousConfig()), clock, PagedKVCache(64, 4), engine=engine,
                       power=power) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    assert runs[0].meta["events"] < runs[1].meta["events"]  # (the fast engine ran the decodes in bulk)
    for run in runs:
        check_energy(run)
        # after each request's decodes (the last one's at the window's end, as a tail's start is kept)
        assert [t for t, _ in run.meta["energy"]["instances"][0]["standby_at"]] == run.requests["finish_ms"].tolist()


@pytest.mark.parametrize("power, clock, said", [
    ('kind = "table"\nfit = "mlenergy-a100-40gb-llama-3.1-8b"', "mhz = 1005", '[clock] mhz = 1005 with [power] kind = '
     '"table": the table power model does not read the SM clock (its power follows the batch\'s size only)'),
    ('kind = "fixed_active"', 'policy = "slo"\ntpot_ms = 50', '[clock] policy = "slo" with [power] kind = '
     '"fixed_active": the fixed_active power model does not read the SM clock (it draws active_w in every '
     'iteration)'),
    ('kind = "utilisation"', "mhz = 1005", None),     # it applies the clock's power law
    ('kind = "table"\nfit = "mlenergy-a100-40gb-llama-3.1-8b"', "mhz = 1410", None),  # the A100's highest clock
])
def test_a_clock_the_power_model_does_not_read_is_said(tmp_path, power, clock, said):
    """[clock] below the highest with a power model that ignores the clock (table, fixed_active):
    a lower clock only lengthens iterations and adds energy there, so the file is taken with a
    warning naming [clock] and [power] kind (as a drafter the clock cannot split is named)."""
    import warnings

    from schedlab.errors import InputWarning
    from schedlab.study.experiment import load

    path = tmp_path / "clocked.toml"
    path.write_text(EXPERIMENT.split("[power]")[0] + f"[power]\n{power}\n\n[clock]\n{clock}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(path)
    said_now = [str(w.message) for w in caught if issubclass(w.category, InputWarning) and "[clock]" in str(w.message)]
    if said is None:
        assert said_now == []
    else:
        assert said_now and all(m.startswith(f"{path}: [power]: {said}") for m in said_now)
        assert 'use [power] kind = "utilisation"' in said_now[0]


# --- experiments: tables, errors, reports, the planner ----------------------------------------------

EXPERIMENT = """
[experiment]
name = "energy"

[workload]
kind = "mix"

[workload.classes.chat]
kind = "synthetic"
num_requests = 40
rate = 4.0
prompt = {dist = "uniform", low = 100, high = 600}
output = {dist = "uniform", low = 20, high = 200}

[workload.classes.batch]
kind = "synthetic"
num_requests = 10
rate = 1.0
prompt = {dist = "fixed", value = 2000}
output = {dist = "fixed", value = 400}

[cost_model]
kind = "roofline"
model = "llama-3.1-8b"
gpu = "a100-40gb"

[kv_cache]
kind = "paged"
model = "llama-3.1-8b"
gpu = "a100-40gb"

[power]
kind = "utilisation"
host_idle_w = 200
pue = 1.25
"""


@pytest.fixture(scope="module")
def energy_run(tmp_path_factory):
    from schedlab.study.experiment import load, run_experiment

    path = tmp_path_factory.mktemp("energy") / "energy.toml"
    path.write_text(EXPERIMENT)
    return run_experiment(load(path))


def test_energy_metrics_of_an_experiment(energy_run):
    run = energy_run.all_runs()[0]
    e = run.metrics["energy"]
    window_s = e["window_ms"] / 1e3
    assert e["host_j"] == pytest.approx(200 * window_s)                       # 200 W all along
    assert e["facility_j"] == pytest.approx((e["gpu_j"] + e["host_j"]) * 1.25)
    assert e["kwh"] == pytest.approx(e["facility_j"] / 3.6e6)
    assert e["gpu_j"] == pytest.approx(e["busy_j"] + e["idle_j"])
    board, idle = 400.0, 0.12 * 400.0                                          # a100-40gb: datasheet, estimate
    assert idle * window_s <= e["gpu_j"] <= board * window_s
    assert e["peak_power_w"] <= board + 1e-9
    classes = run.metrics["per_class"]
    assert sum(c["energy"]["j"] for c in classes.values()) == pytest.approx(e["attributed_j"])
    assert e["attributed_j"] == pytest.approx(e["busy_j"])
    check_energy(run)


def test_energy_in_the_table_and_the_timeline_plot(energy_run):
    from schedlab_plugins.reports.plot_timeline import has_power, timeline_figure
    from schedlab_plugins.reports.table import TableReport

    text = TableReport().text(energy_run)
    assert "energy.j_per_token" in text and "PUE 1.25" in text
    assert "J/token by class (their iterations' shares, idle left out): batch" in text
    run = energy_run.all_runs()[0]
    assert has_power(run)
    fig = timeline_figure(run, 60)
    lines = [line for ax in fig.axes for line in ax.get_lines() if (line.get_gid() or "").startswith("timeline:power")]
    assert len(lines) == 1
    edges, watts = power_steps(run, 0)
    assert lines[0].get_ydata()[:-1].tolist() == pytest.approx(watts.tolist())


def test_a_thinned_timeline_draws_no_power_panel(tmp_path):
    """Review energy82: past ``timeline_points`` the timeline keeps every 2nd, 4th... row, and the
    panel drew the dropped iterations as idle stretches (685 J for a run that drew 1,325); it is
    left out there, as the fleet report leaves out its kWh per hour."""
    from schedlab.study.experiment import load, run_experiment
    from schedlab_plugins.reports.plot_timeline import has_power, timeline_figure

    path = tmp_path / "energy.toml"
    path.write_text(EXPERIMENT.replace("[experiment]\n", "[experiment]\ntimeline_points = 20\n", 1))
    run = run_experiment(load(path)).all_runs()[0]
    assert run.meta["energy"]["instances"] and len(run.timeline["time_ms"]) <= 20
    assert run.metrics["iterations"] > 40   # (rows were dropped)
    assert not has_power(run)
    fig = timeline_figure(run, 60)
    assert not [line for ax in fig.axes for line in ax.get_lines() if (line.get_gid() or "").startswith("timeline:power")]


def test_saved_results_redraw_the_same_power(energy_run, tmp_path):
    from schedlab.results.storage import load as load_saved
    from schedlab.results.storage import save

    save(energy_run, tmp_path)
    saved = load_saved(tmp_path).all_runs()[0]
    fresh = energy_run.all_runs()[0]
    assert saved.metrics["energy"]["gpu_j"] == pytest.approx(fresh.metrics["energy"]["gpu_j"])
    assert integral_j(*power_steps(saved, 0)) == pytest.approx(integral_j(*power_steps(fresh, 0)), rel=1e-9)
    assert saved.requests["energy_j"].tolist() == pytest.approx(fresh.requests["energy_j"].tolist())


@pytest.mark.parametrize("table, message", [
    ('[power]\nkind = "utilisation"\nawake = 2', "[power]: awake: must be <= 1"),
    ('[power]\nkind = "utilisaton"', "unknown power_model 'utilisaton' (did you mean 'utilisation'?)"),
    ('[power]\nkind = "utilisation"\nwatts = 3', "[power]: unknown key 'watts'"),
    ('[power]\nkind = "table"', "give either points"),
    ('[power]\nkind = "table"\npoints = [[5, 100], [1, 200]]', "x must increase"),
    ('[power]\nkind = "utilisation"\n[clock]\nmhz = 5000', "[clock]: mhz: 5000 is outside a100-40gb's clocks"),
    ('[power]\nkind = "utilisation"\n[clock]\npolicy = "slo"', "needs a TPOT target"),
    # energy review s79: clamped to the highest clock without a word, where mhz and min_mhz are refused
    ('[power]\nkind = "utilisation"\n[clock]\nmhz = 1000\nknee_mhz = 99999',
     "[clock]: knee_mhz: 99999 is above a100-40gb's highest clock (1410 MHz)"),
])
def test_bad_power_tables_name_the_file_table_and_key(tmp_path, table, message):
    from schedlab.errors import ConfigError
    from schedlab.study.experiment import load

    path = tmp_path / "bad.toml"
    path.write_text(EXPERIMENT.split("[power]")[0] + table + "\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert "bad.toml" in str(info.value) and message in str(info.value)
    assert "[clock]: [clock]" not in str(info.value)  # (the table named once)


def test_plan_reports_kwh_and_energy_cost(tmp_path):
    from study_case import PLAN

    from schedlab.study.experiment import load, run_experiment

    path = tmp_path / "plan.toml"
    path.write_text(PLAN.replace("[plan]", '[power]\nkind = "utilisation"\npue = 1.5\n\n[plan]\n'
                                            "energy_price_per_kwh = 0.2"))
    study = run_experiment(load(path)).studies[0]
    plan = study.plan
    runs = {run.name: run for run in study.runs}
    for d in plan.deployments:
        e = runs[d["run"]].metrics["energy"]
        kw = e["facility_j"] / e["window_ms"]       # J per ms = kW, PUE included
        assert d["kwh_per_hour"] == pytest.approx(kw)
        assert d["energy_cost_per_hour"] == pytest.approx(0.2 * kw)
        assert d["gpu_hours_per_hour"] == d["instances"] * runs[d["run"]].point["tensor_parallel"]
    assert "energy (" in plan.message and "kWh/h" in plan.message


def test_energy_clock_experiment_saves_energy_within_the_slo():
    """experiments/energy_clock.toml, shortened: the governor takes less energy than the full
    clock at every load and meets the SLO as often. (Over the file's 1,200 requests it does not
    at 28/s: its slower decode steps let the queue build there, as the README says; 200
    requests end before it does.)"""
    from pathlib import Path

    from schedlab.study.experiment import load, run_experiment

    path = Path(__file__).resolve().parent.parent / "experiments" / "energy_clock.toml"
    runs = {r.name: r for r in run_experiment(load(path, ["workload.num_requests=200"])).all_runs()}
    for rate in (2, 10, 28):
        full, governed = runs[f"full_clock[rate={rate}]"], runs[f"slo_governor[rate={rate}]"]
        assert governed.metrics["energy"]["gpu_j"] < 0.8 * full.metrics["energy"]["gpu_j"]
        assert governed.metrics["slo"]["attainment"] >= full.metrics["slo"]["attainment"] - 1e-9


def test_a_pool_of_its_own_clock(tmp_path):
    """[cluster.decode] clock = {...}: the decode pool runs at its clock, the prefill pool at
    the highest; both engines agree and the energy is conserved."""
    from schedlab.study.experiment import load, run_experiment

    text = EXPERIMENT.replace("[power]", """[cluster]
mode = "disaggregated"
prefill = {instances = 1}
decode = {instances = 1, clock = {mhz = 810}}

[power]""").replace('[kv_cache]\nkind = "paged"', '[kv_cache]\nkind = "paged"\nbytes_per_block = 2097152')
    runs = {}
    for engine in ENGINES:
        path = tmp_path / f"{engine}.toml"
        path.write_text(text.replace('name = "energy"', f'name = "energy"\nengine = "{engine}"'))
        runs[engine] = run_experiment(load(path)).all_runs()[0]
    compare_runs(runs["fast"], runs["reference"], rel=1e-9)
    for run in runs.values():
        check_energy(run)
        prefill, decode = run.meta["energy"]["instances"]
        assert decode["standby_w"] < prefill["standby_w"]   # the decode pool idles at its lower clock


def test_each_instance_keeps_its_own_pue_by_hand():
    """Facility energy is each instance's GPUs and host times its own PUE, summed (a disaggregated
    cluster's pools may each set theirs). Over 10 s: instance 0 draws 3,000 + 1,000 J on its GPUs
    and 100 W x 10 s = 1,000 J on its host, at PUE 1.2: 6,000 J; instance 1 5,000 + 500 J and
    50 W x 10 s + 20 W x 8 s busy = 660 J, at PUE 2: 12,320 J. In all 18,320 J for 11,160 J of IT
    energy: the run's PUE is 18,320 / 11,160."""
    from schedlab.energy.metrics import energy_totals

    def instance(busy_j, idle_j, busy_ms, host_idle_w, host_busy_w, pue):
        return {"busy_j": busy_j, "idle_j": idle_j, "busy_ms": busy_ms, "peak_w": 300.0, "host_idle_w": host_idle_w,
                "host_busy_w": host_busy_w, "pue": pue}

    record = {"window_ms": [0.0, 10_000.0], "pue": 1.2,
              "instances": [instance(3000.0, 1000.0, 5000.0, 100.0, 0.0, 1.2), instance(5000.0, 500.0, 8000.0, 50.0,
                                                                                         20.0, 2.0)]}
    e = energy_totals(record, 1000, 10, {}, 8000.0)
    assert e["gpu_j"] == 9500.0 and e["host_j"] == pytest.approx(1660.0)
    assert e["facility_j"] == pytest.approx(18_320.0)
    assert e["pue"] == pytest.approx(18_320.0 / 11_160.0)
    assert e["kwh"] == pytest.approx(18_320.0 / 3.6e6)
    assert e["facility_j_per_token"] == pytest.approx(18.32)
    for inst in record["instances"]:  # a record saved before instances kept their PUE: the run's, for all
        del inst["pue"]
    e = energy_totals(record, 1000, 10, {}, 8000.0)
    assert e["facility_j"] == pytest.approx(11_160.0 * 1.2) and e["pue"] == 1.2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pools_own_pue_and_host_count_for_its_instances_only(tmp_path, engine):
    """[cluster.decode] power = {pue = 2, host_idle_w = 500} over the run's pue 1.25 and host
    200 W: the prefill instance's facility energy is its GPUs' and host's x 1.25, the decode
    instance's x 2 (the run's PUE was taken from the first instance for both); each host at its
    own power. Each pool's power model is described (``models``), of another kind too."""
    from schedlab.study.experiment import load, run_experiment

    cluster = """[cluster]
mode = "disaggregated"
prefill = {instances = 1}
decode = {instances = 1, power = {POWER}}

[power]"""
    text = EXPERIMENT.replace('[kv_cache]\nkind = "paged"', '[kv_cache]\nkind = "paged"\nbytes_per_block = 2097152')
    text = text.replace('name = "energy"', f'name = "energy"\nengine = "{engine}"')
    path = tmp_path / "pools.toml"
    path.write_text(text.replace("[power]", cluster.replace("POWER", "pue = 2.0, host_idle_w = 500")))
    run = run_experiment(load(path)).all_runs()[0]
    check_energy(run)
    record, e = run.meta["energy"], run.metrics["energy"]
    window_s = e["window_ms"] / 1e3
    prefill, decode = record["instances"]
    assert (prefill["pue"], decode["pue"]) == (1.25, 2.0)
    assert (prefill["host_idle_w"], decode["host_idle_w"]) == (200.0, 500.0)
    gpu = [e["per_instance"][k]["gpu_j"] for k in ("0", "1")]
    assert e["host_j"] == pytest.approx(700 * window_s)
    facility = (gpu[0] + 200 * window_s) * 1.25 + (gpu[1] + 500 * window_s) * 2.0
    assert e["facility_j"] == pytest.approx(facility)
    assert e["kwh"] == pytest.approx(facility / 3.6e6)
    assert e["pue"] == pytest.approx(facility / (e["gpu_j"] + e["host_j"]))
    assert record["pue"] == pytest.approx(e["pue"])
    # each pool's power model described, its instances named (the record's "model" is the first's)
    assert [(m["instances"], m["model"]["pue"], m["model"]["host_idle_w"]) for m in record["models"]] == [
        ([0], 1.25, 200.0), ([1], 2.0, 500.0)]
    path.write_text(text.replace("[power]", cluster.replace("POWER", 'kind = "fixed_active"')))
    run = run_experiment(load(path)).all_runs()[0]
    record = run.meta["energy"]
    assert [(m["instances"], m["model"]["kind"]) for m in record["models"]] == [([0], "utilisation"),
                                                                                ([1], "fixed_active")]
    assert record["model"]["kind"] == "utilisation"


# --- an autoscaled cluster --------------------------------------------------------------------------------


class Scripted:
    """An autoscaling policy that asks for what its script says at each tick (by time)."""

    def __init__(self, script: dict):
        self.script = script

    def decide(self, signals) -> int:
        return self.script[signals.now_ms]


class Newest:
    """Routes to the last instance of the serving pool."""

    def route(self, request, instances):
        return len(instances) - 1


@pytest.mark.parametrize("engine", ENGINES)
def test_an_instance_that_is_off_draws_nothing_by_hand(engine):
    # Two instances, one serving at first; ticks every second ask for 2, 2, 1, 1, 1; a cold start
    # takes 500 ms. Fixed-active power: 300 W in iterations, 90 W for 10 ms after, 30 W idle.
    # Each request (prompt 4, output 3) takes 10 ms: r0 at 0 on instance 0, r1 at 2000 on
    # instance 1 (on since the tick at 1000, serving from 1500), r2 at 5000 on instance 0.
    # Instance 1 drains at the tick at 3000 and is off from then (its last iteration ended at 2010).
    # Instance 0: 2 x 3 J + 10 ms x 90 W + 4,980 ms x 30 W (10 -> 5000) = 156.3 J, off at 5010.
    # Instance 1: off 0-1000, idle 1000-2000 (30 J), 3 J, 10 ms x 90 W + 980 ms x 30 W, off from 3000.
    from schedlab.engine.scaling import ScalingLimits

    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0))
    limits = ScalingLimits(min_instances=1, max_instances=2, initial=1, interval_ms=1000.0, cold_start_ms=500.0,
                           window_ms=1000.0)
    policy = Scripted({1000.0: 2, 2000.0: 2, 3000.0: 1, 4000.0: 1, 5000.0: 1})
    requests = [Request(0, 0.0, 4, 3), Request(1, 2000.0, 4, 3), Request(2, 5000.0, 4, 3)]
    r = run_cluster(requests, lambda: (ContinuousScheduler(ContinuousConfig()), cost, PagedKVCache(64, 4)), 2,
                    Newest(), engine=engine, power=fixed_active(), autoscaler=policy, limits=limits)
    assert r.requests["instance"].tolist() == [0, 1, 0]
    assert sorted(r.meta["scaling"]["intervals"]) == [[0, 0.0, 5010.0], [1, 1000.0, 3000.0]]
    inst = r.meta["energy"]["instances"]
    assert r.meta["energy"]["window_ms"] == [0.0, 5010.0]
    assert inst[0]["busy_j"] + inst[0]["idle_j"] == pytest.approx(6.0 + 0.9 + 4980 * 30e-3)
    assert inst[1]["busy_j"] + inst[1]["idle_j"] == pytest.approx(30.0 + 3.0 + 0.9 + 980 * 30e-3)
    assert inst[1]["off"] == [[0.0, 1000.0], [3000.0, 5010.0]]
    assert inst[1]["on_ms"] == 2000.0
    assert r.metrics["energy"]["gpu_j"] == pytest.approx(156.3 + 63.3)
    check_energy(r)
    edges, watts = power_steps(r, 1)
    off = (edges[:-1] >= 3000.0) | (edges[1:] <= 1000.0)
    assert (watts[off] == 0.0).all() and (watts[~off] > 0).all()


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(min_size=1, max_size=16, max_prompt=200, max_output=120, all_at_zero=False),
       st.integers(2, 4), st.integers(1, 2), st.sampled_from([1.0, 2.0]), st.sampled_from([0.0, 40.0, 250.0]),
       st.sampled_from([20.0, 100.0]), st.sampled_from([0.0, 0.02]))
def test_autoscaled_clusters_agree_on_energy_and_conserve_it(requests, instances, initial, target, cold, interval,
                                                             tail_s):
    """Instances switched off and on by a queue-length policy: both engines count the same
    energy, each instance's equals the integral of its power (0 W while off) over the window."""
    from schedlab.engine.scaling import ScalingLimits
    from schedlab_plugins.autoscalers import QueueLength, QueueLengthConfig
    from schedlab_plugins.routers import LeastOutstandingRouter

    limits = ScalingLimits(min_instances=1, max_instances=instances, initial=min(initial, instances),
                           interval_ms=interval, cold_start_ms=cold, window_ms=4 * interval)
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.125, decode_ms_per_step=4.0))

    def make():
        return ContinuousScheduler(ContinuousConfig(max_num_seqs=2)), cost, PagedKVCache(128, 4)

    runs = [run_cluster(requests, make, instances, LeastOutstandingRouter(), engine=engine,
                        power=fixed_active(tail_s=tail_s), autoscaler=QueueLength(QueueLengthConfig(
                            target_per_instance=target, stabilization_s=0.0)), limits=limits) for engine in ENGINES]
    compare_runs(*runs, rel=1e-9)
    assert runs[0].meta["scaling"]["intervals"] == runs[1].meta["scaling"]["intervals"]
    for run in runs:
        check_energy(run)


def test_fixed_active_below_idle_is_refused():
    """Found by fuzzing: active_w below idle_w was taken as given (a busy GPU drawing less than an
    idle one). The default active power, the board limit, is above any preset's idle power."""
    from schedlab.errors import ConfigError
    from schedlab_plugins.power.fixed_active import build_fixed_active

    with pytest.raises(ConfigError, match=r"active_w \(20 W\) is below idle_w \(50 W\)"):
        build_fixed_active(FixedActiveConfig(active_w=20.0, idle_w=50.0))
    with pytest.raises(ConfigError, match=r"active_w \(20 W\) is below idle_w \(.* W\)"):
        build_fixed_active(FixedActiveConfig(active_w=20.0, gpu="h100-80gb"), PRESETS)
    model = build_fixed_active(FixedActiveConfig(gpu="h100-80gb"), PRESETS)
    assert model.active_w > model.idle_w


def test_power_a_gpu_cannot_draw_is_refused_and_power_past_the_board_warned_of():
    """Energy review s79: a table of 10-20 W beside an idle 84 W, a standby of 10 W or 5 kW, and 2,000 W on a 700 W
    board ran without a word (fixed_active already refused active below idle)."""
    from schedlab.errors import InputWarning
    from schedlab_plugins.power.fixed_active import build_fixed_active

    h100 = RooflineCostModel(PRESETS.model("llama-3.1-8b"), PRESETS.gpu("h100-80gb"),
                             RooflineConfig(model="llama-3.1-8b", gpu="h100-80gb"))
    idle = build_table(TableConfig(points=[[1, 200]]), PRESETS, h100).idle_w
    with pytest.raises(ConfigError, match=rf"points: a busy GPU draws 10 W at 1, below its idle power {idle:g} W"):
        build_table(TableConfig(points=[[1, 10], [64, 20]]), PRESETS, h100)
    with pytest.raises(ConfigError, match=r"points: a busy GPU draws 300 W at 1, below its idle power 900 W"):
        build_table(TableConfig(points=[[1, 300]], idle_w=900, standby_w=950), PRESETS, h100)
    with pytest.raises(ConfigError, match=r"standby_w \(50 W\) is below the idle power \(60 W\)"):
        build_table(TableConfig(points=[[1, 300]], idle_w=60, standby_w=50), PRESETS, h100)
    with pytest.warns(InputWarning, match=r"points: 2000 W at 1 is past the GPU's board limit of 700 W"):
        build_table(TableConfig(points=[[1, 2000]]), PRESETS, h100)
    # review energy82: the derived standby (idle + the awake share of the headroom: 198 W on an H100)
    # is capped at the table's busiest point, as fixed_active caps it at active_w
    awake = build_table(TableConfig(points=[[1, 300]]), PRESETS, h100).standby_w
    assert awake > 180.0
    assert build_table(TableConfig(points=[[1, 120], [64, 180]]), PRESETS, h100).standby_w == 180.0
    assert build_table(TableConfig(points=[[1, 120], [64, 180]], standby_w=150), PRESETS, h100).standby_w == 150.0
    for standby in (10.0, 5000.0):
        with pytest.raises(ConfigError, match=rf"standby_w \({standby:g} W\) must lie between idle \({idle:g} W\) "
                                              r"and active \(700 W\)"):
            build_fixed_active(FixedActiveConfig(standby_w=standby), PRESETS, h100)


def test_the_checks_leave_what_was_accepted_before_alone():
    """Diff review s79: fixed_active with a low active_w (150 W on an H100) was refused for the standby it derives
    from the board itself, and a table with idle_w and standby_w given and a gpu label no preset has failed as an
    unknown GPU: both ran before the power checks of this stop."""
    d = build_fixed_active_config(active_w=150.0)
    assert (d["active_w"], d["standby_w"]) == (150.0, 150.0) and d["idle_w"] < 150.0
    model = build_table(TableConfig(points=[[1, 300]], idle_w=60, standby_w=80, gpu="my-node"), PRESETS)
    assert model.idle_w == 60 and model.standby_w == 80


def build_fixed_active_config(**settings) -> dict:
    from schedlab_plugins.power.fixed_active import build_fixed_active

    return build_fixed_active(FixedActiveConfig(gpu="h100-80gb", **settings), PRESETS).describe()


def test_a_power_table_naming_other_hardware_than_the_cost_model_is_warned_of(recwarn):
    """Energy review s79: [power] gpu = "l4" under an H100 cost model (or an H100 fit), or tensor_parallel = 8 under
    one GPU, metered energy for other hardware than the timing and GPU-hours, without a word."""
    from schedlab.errors import InputWarning

    h100 = RooflineCostModel(PRESETS.model("llama-3.1-8b"), PRESETS.gpu("h100-80gb"),
                             RooflineConfig(model="llama-3.1-8b", gpu="h100-80gb"))
    with pytest.warns(InputWarning, match=r"\[power\] gpu is 'l4', and the cost model times the steps on "
                                          r"'h100-80gb': the energy is metered for another GPU than the timing"):
        build_utilisation(UtilisationConfig(gpu="l4"), PRESETS, h100)
    with pytest.warns(InputWarning, match=r"the fit's GPU \(mlenergy-v3-b200-qwen3-8b\) is 'b200', and the cost "
                                          r"model times the steps on 'h100-80gb'"):
        build_table(TableConfig(fit="mlenergy-v3-b200-qwen3-8b"), PRESETS, h100)
    with pytest.warns(InputWarning, match=r"\[power\] tensor_parallel = 8 meters 8 GPUs an instance, and the cost "
                                          r"model spreads it over 1"):
        assert build_utilisation(UtilisationConfig(tensor_parallel=8), PRESETS, h100).tp == 8
    recwarn.clear()
    # the same GPU by its alias, or the layout's GPUs a rank (not the table's): nothing to say
    build_utilisation(UtilisationConfig(gpu="h100-80gb"), PRESETS, h100)
    assert build_utilisation(UtilisationConfig(), PRESETS, h100, 2).tp == 2
    assert [str(w.message) for w in recwarn if issubclass(w.category, InputWarning)] == []


def test_fixed_active_defaults_on_the_a6000_are_llmservingsims_fitted_node():
    """LLMServingSim 2.0's A6000 node: idle 33 W, standby 89 W for 18 s, active 300 W (its
    power_config_tp*.json). Standby defaulted to idle, which left its standby level out."""
    from schedlab_plugins.power.fixed_active import build_fixed_active

    d = build_fixed_active(FixedActiveConfig(gpu="rtx-a6000"), PRESETS).describe()
    assert (d["idle_w"], d["standby_w"], d["active_w"], d["standby_s"]) == (33.0, 89.0, 300.0, 18.0)
    # a GPU without a measured standby: idle + the fitted awake share (0.136) of active - idle
    d = build_fixed_active(FixedActiveConfig(gpu="h100-80gb"), PRESETS).describe()
    assert d["standby_w"] == pytest.approx(d["idle_w"] + 0.136 * (d["active_w"] - d["idle_w"]))
    assert build_fixed_active(FixedActiveConfig(gpu="h100-80gb", standby_w=120.0), PRESETS).describe()["standby_w"] == 120
    # a lower active power leaves the standby where the GPU's headroom puts it, not a share of active - idle
    low = build_fixed_active(FixedActiveConfig(gpu="h100-80gb", active_w=350.0), PRESETS).describe()
    assert low["standby_w"] == pytest.approx(d["standby_w"])
    given = build_fixed_active(FixedActiveConfig(gpu="rtx-a6000", active_w=300.0, idle_w=33.0), PRESETS).describe()
    assert given["standby_w"] == 89.0   # (both powers given: the named GPU's measured standby all the same)


# --- review energy82: the energy window is the GPU-hours' -------------------------------------------


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_energy_is_metered_to_the_end_the_gpu_hours_pay_for(tmp_path, engine):
    """Three requests of 4 + 3 tokens at 0; an API server of one handler taking 50 ms each;
    clients give up after 80 ms. Request 0 runs 50-60 ms (its prefill 2 ms, then two decodes of
    4 ms); request 2 is given up at 80 ms and request 1 at 100 ms while waiting for the
    handler. The GPU-hours run to 100 ms; the energy stopped at 60 ms (4.5 J). By hand, at 30 W
    idle, 300 W busy and 90 W standby for 10 ms: idle 0-50 (1.5 J), busy 50-60 (3.0 J), standby
    60-70 (0.9 J), idle 70-100 (0.9 J): 6.3 J."""
    from schedlab.study.experiment import load, run_experiment

    (tmp_path / "reqs.jsonl").write_text('{"arrival_ms": 0, "prompt_tokens": 4, "output_tokens": 3}\n' * 3)
    path = tmp_path / "exp.toml"
    path.write_text(f"""
[experiment]
name = "window"
engine = "{engine}"
reports = []
[workload]
kind = "file"
path = "reqs.jsonl"
[scheduler]
kind = "continuous"
[cost_model]
kind = "linear"
prefill_ms_per_token = 0.5
decode_ms_per_step = 4.0
[power]
kind = "fixed_active"
active_w = 300
standby_w = 90
idle_w = 30
standby_s = 0.01
[frontend]
network_ms = 0.0
request_ms = 50.0
tokenize_ms_per_token = 0.0
token_ms = 0.0
workers = 1
[client]
timeout_ms = 80
""")
    run = next(iter(run_experiment(load(path)).all_runs()))
    assert list(run.requests["finish_ms"]) == [60.0, 100.0, 80.0]
    energy = run.metrics["energy"]
    assert energy["window_ms"] == 100.0 and run.metrics["gpu_hours"] * 3.6e6 == pytest.approx(100.0)
    assert energy["busy_j"] == pytest.approx(3.0) and energy["idle_j"] == pytest.approx(1.5 + 0.9 + 0.9)
    assert energy["gpu_j"] == pytest.approx(6.3)
