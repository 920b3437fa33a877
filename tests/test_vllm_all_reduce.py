"""vLLM's own tensor-parallel all-reduce, measured on NVSwitch machines (aiconfigurator): the
table is the shipped measurement, read between its sizes as stated, and used where -- and only
where -- it was measured."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.testing import examples
from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.collectives import TOPOLOGIES, Collectives, machine
from schedlab_plugins.cost_models.tensor_parallel import TensorParallelComm
from schedlab_plugins.cost_models.vllm_all_reduce import MEASURED_US, MeasuredAllReduce, measured_all_reduce

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import derive_collectives  # noqa: E402

PRESETS = Presets.from_catalog(load_catalog(entry_points=False))
LLAMA_70B = PRESETS.model("llama-3-70b")


def test_the_table_is_the_shipped_measurement():
    assert MEASURED_US == derive_collectives.read_aic_vllm()
    assert set(MEASURED_US) == {"dgx-h100", "dgx-a100", "dgx-b200"}
    assert all(set(by_ranks) == {2, 4, 8} for by_ranks in MEASURED_US.values())


def test_read_between_the_measured_sizes_by_hand():
    """Two points, 8 KB at 4 us and 32 KB at 16 us: 16 KB, halfway in log size, takes 8 us
    (halfway in log time); below 8 KB 4 us; past 32 KB in proportion to the bytes."""
    ar = MeasuredAllReduce(((8192, 4.0), (32768, 16.0)))
    assert ar(8192) == pytest.approx(4e-3) and ar(32768) == pytest.approx(16e-3)
    assert ar(16384) == pytest.approx(8e-3)
    assert ar(100) == pytest.approx(4e-3) and ar(0) == 0.0
    assert ar(65536) == pytest.approx(32e-3)
    # a point slower than the next size up reads as that size's time (the lower envelope)
    dip = MeasuredAllReduce(((8192, 9.0), (16384, 5.0), (32768, 16.0)))
    assert dip(8192) == pytest.approx(5e-3)


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(sorted((m, n) for m in MEASURED_US for n in MEASURED_US[m])),
       st.floats(1.0, 2e9), st.floats(1.0, 2e9))
def test_more_bytes_never_take_less_time(key, a, b):
    ar = MeasuredAllReduce(MEASURED_US[key[0]][key[1]])
    small, large = sorted((a, b))
    assert ar(small) <= ar(large) * (1 + 1e-12)


def test_at_a_decode_steps_sizes_vllm_is_faster_than_ncclss_model_on_h100():
    """8 KB on 2 H100s: 4.4 us measured against 7.9 in NCCL's model; 1 MB on 8: 15 us against 24."""
    for ranks, size, measured in ((2, 8192, 4.38), (8, 1048576, 14.97)):
        vllm = measured_all_reduce(TOPOLOGIES["dgx-h100"], ranks)
        assert vllm(size) == pytest.approx(measured * 1e-3)
        assert Collectives(TOPOLOGIES["dgx-h100"], ranks).all_reduce_ms(size) > 1.5 * vllm(size)


def test_the_tensor_parallel_layers_take_it_by_default_and_nccl_when_asked():
    """Llama-3-70B at TP 4 on H100s: a layer's two all-reduces of 64 tokens x 8,192 x 2 bytes."""
    nbytes = 64 * 8192 * 2
    for setting, expected in (("vllm", measured_all_reduce(TOPOLOGIES["dgx-h100"], 4)(nbytes)),
                              ("nccl", Collectives(TOPOLOGIES["dgx-h100"], 4).all_reduce_ms(nbytes))):
        cost = RooflineCostModel(LLAMA_70B, PRESETS.gpu("h100-80gb"), RooflineConfig(
            model="llama-3-70b", gpu="h100-80gb", tensor_parallel=4, tp_all_reduce=setting))
        assert cost.comm.layer_ms(64) == pytest.approx(2 * expected, rel=1e-12)
        assert cost.comm.measured == (setting == "vllm")
    assert RooflineConfig(model="x", gpu="y").tp_all_reduce == "vllm"


@pytest.mark.parametrize("topology, ranks, why", [
    (machine("dgx-h100", None, link_gbps=100.0), 4, "a calibrated link"),
    (machine({"like": "dgx-h100", "network_gbps": 25}, None), 4, "a machine changed by a table"),
    (TOPOLOGIES["pcie-gen5-p2p"], 2, "a machine not measured"),
    (TOPOLOGIES["nvlink-pairs-h100"], 2, "a machine not measured"),
    (TOPOLOGIES["dgx-h100"], 16, "two nodes"),
])
def test_elsewhere_nccls_model_times_it(topology, ranks, why):
    comm = TensorParallelComm(LLAMA_70B, Collectives(topology, ranks), "vllm")
    assert not comm.measured, why
    assert comm.all_reduce_ms(1e6) == Collectives(topology, ranks).all_reduce_ms(1e6)
    assert math.isfinite(comm.layer_ms(128))
