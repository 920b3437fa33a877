"""vLLM's own tensor-parallel all-reduce, as measured on NVSwitch machines.

Where GPUs reach each other directly, vLLM does not all-reduce a layer's activations with NCCL:
``tensor_model_parallel_all_reduce`` picks, by buffer size, its custom all-reduce (one-shot,
then two-shot kernels over NVLink, up to 8 MB by default), symmetric memory on Hopper and
Blackwell, or NCCL past them. NVIDIA's aiconfigurator (github.com/ai-dynamo/aiconfigurator,
Apache-2.0) times that call inside vLLM's own graph capture (``collector/network/
collect_all_reduce.py``), as a CUDA-graphed step runs it, on H100, A100 and B200 nodes at 2, 4
and 8 GPUs: :data:`MEASURED_US` (``tools/derive_collectives.py --aiconfigurator`` writes the
subset in ``tests/data/aiconfigurator/vllm_all_reduce.csv``, which the tests compare with it).
At a decode step's sizes it is 1.5-3x faster than NCCL's model of the same machine: 4.3 us
against 7.9 for 8 KB on 2 H100s, 15 us against 24 for 1 MB on 8.

:func:`measured_all_reduce` gives a cost model that time, interpolated (log-log) between the
measured sizes -- a size below the smallest takes the smallest's time, one above the largest
scales with its bytes -- on the preset machine it was measured on, unchanged (a calibrated
``link_gbps`` or ``link_latency_us``, a table, or other rank counts fall back to NCCL's model).
A measured time above a larger size's is read as that larger size's (a few points where vLLM
switches algorithm measure slower than the next size up: the lower envelope).
"""

from __future__ import annotations

import bisect
import math
from typing import Callable

from schedlab.configs import str_field

from .collectives import TOPOLOGIES, Topology

#: machine preset -> ranks -> ((bytes, us), ...): vLLM's graph-captured all-reduce of bf16
#: buffers (aiconfigurator: vLLM 0.24.0 on H100 and B200, 0.14.0 on A100)
MEASURED_US: dict[str, dict[int, tuple[tuple[int, float], ...]]] = {
    "dgx-h100": {
        2: ((4096, 4.3), (8192, 4.38), (16384, 4.49), (32768, 4.44), (65536, 4.52), (131072, 4.75), (262144, 5.18),
             (524288, 6.32), (1048576, 8.34), (2097152, 12.38), (4194304, 20.24), (8388608, 44.96),
             (16777216, 81.42), (33554432, 156.34), (67108864, 306.72), (134217728, 468.76), (268435456, 885.42),
             (536870912, 1706.04), (1073741824, 3219.22)),
        4: ((4096, 4.7), (8192, 4.81), (16384, 4.83), (32768, 4.9), (65536, 5.23), (131072, 5.8), (262144, 7.18),
             (524288, 11.4), (1048576, 12.76), (2097152, 18.6), (4194304, 30.25), (8388608, 53.53),
             (16777216, 98.77), (33554432, 191.23), (67108864, 329.94), (134217728, 618.84), (268435456, 1180.38),
             (536870912, 2305.43), (1073741824, 4535.01)),
        8: ((4096, 5.55), (8192, 5.11), (16384, 5.31), (32768, 5.58), (65536, 6.41), (131072, 7.86),
             (262144, 10.79), (524288, 11.99), (1048576, 14.97), (2097152, 19.39), (4194304, 30.81),
             (8388608, 50.7), (16777216, 92.38), (33554432, 177.75), (67108864, 343.96), (134217728, 577.39),
             (268435456, 1091.02), (536870912, 2117.07), (1073741824, 4009.24)),
    },
    "dgx-a100": {
        2: ((4096, 5.02), (8192, 5.29), (16384, 5.34), (32768, 5.22), (65536, 5.5), (131072, 5.74), (262144, 6.57),
             (524288, 7.99), (1048576, 10.7), (2097152, 15.18), (4194304, 25.24), (8388608, 89.68),
             (16777216, 126.28), (33554432, 222.19), (67108864, 388.47), (134217728, 746.15), (268435456, 1427.57),
             (536870912, 2798.87), (1073741824, 5394.32)),
        4: ((4096, 5.33), (8192, 5.53), (16384, 6), (32768, 6), (65536, 6.57), (131072, 7.78), (262144, 9.91),
             (524288, 14.55), (1048576, 18.34), (2097152, 26.05), (4194304, 41.48), (8388608, 117.96),
             (16777216, 182.5), (33554432, 288.13), (67108864, 540.03), (134217728, 996.34), (268435456, 1920.71),
             (536870912, 3721.13), (1073741824, 7295.39)),
        8: ((4096, 14.85), (8192, 6.32), (16384, 6.54), (32768, 6.91), (65536, 8.43), (131072, 11.35),
             (262144, 17.13), (524288, 18.86), (1048576, 21.71), (2097152, 27.93), (4194304, 45.37),
             (8388608, 129.01), (16777216, 214.19), (33554432, 364.35), (67108864, 594.19), (134217728, 1160.87),
             (268435456, 2170.24), (536870912, 4222.97), (1073741824, 8250.86)),
    },
    "dgx-b200": {
        2: ((4096, 6.97), (8192, 6.99), (16384, 7.1), (32768, 7.01), (65536, 7.08), (131072, 7.4), (262144, 7.66),
             (524288, 9.44), (1048576, 13.12), (2097152, 25.34), (4194304, 33.67), (8388608, 50.55),
             (16777216, 57.43), (33554432, 87.16), (67108864, 155.12), (134217728, 280.42), (268435456, 528.58),
             (536870912, 1004.72), (1073741824, 1899.46)),
        4: ((4096, 7.14), (8192, 7.13), (16384, 7.36), (32768, 7.39), (65536, 7.4), (131072, 8.06), (262144, 8.63),
             (524288, 18.02), (1048576, 18.42), (2097152, 23.76), (4194304, 29.96), (8388608, 43.23),
             (16777216, 68.01), (33554432, 119.02), (67108864, 187.42), (134217728, 352.86), (268435456, 680.64),
             (536870912, 1291.17), (1073741824, 2511.45)),
        8: ((4096, 7.79), (8192, 7.82), (16384, 8.07), (32768, 8.22), (65536, 8.64), (131072, 9.36),
             (262144, 25.8), (524288, 26.15), (1048576, 17.17), (2097152, 20.72), (4194304, 26.31),
             (8388608, 39.24), (16777216, 63.21), (33554432, 111.34), (67108864, 222.78), (134217728, 442.35),
             (268435456, 714.98), (536870912, 1337.38), (1073741824, 2604)),
    },
}

#: the settings a cost model's ``tp_all_reduce`` takes
ALL_REDUCE_KINDS = ("vllm", "nccl")


def tp_all_reduce_field():
    """A cost model's ``tp_all_reduce`` setting (the ``roofline`` and ``profiled`` models)."""
    return str_field("vllm", choices=ALL_REDUCE_KINDS,
                     help="tensor parallelism's all-reduces: 'vllm' times them as vLLM's own all-reduce measured "
                          "on the machine (dgx-h100, dgx-a100, dgx-b200 at 2, 4 or 8 GPUs: custom all-reduce, "
                          "symmetric memory or NCCL, as vLLM picks by size), NCCL's model elsewhere; 'nccl' "
                          "always NCCL's model (vLLM with --disable-custom-all-reduce)")


class MeasuredAllReduce:
    """All-reduce time in ms from one machine's and rank count's measured points."""

    def __init__(self, points: tuple[tuple[int, float], ...]):
        sizes = [float(b) for b, _ in points]
        times = [us for _, us in points]
        for i in range(len(times) - 2, -1, -1):  # the lower envelope from the largest size down
            times[i] = min(times[i], times[i + 1])
        self._log_sizes = [math.log(b) for b in sizes]
        self._log_times = [math.log(us) for us in times]
        self._largest = (sizes[-1], times[-1])

    def __call__(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        x, xs, ys = math.log(nbytes), self._log_sizes, self._log_times
        if x >= xs[-1]:
            return self._largest[1] * nbytes / self._largest[0] * 1e-3
        i = bisect.bisect_right(xs, x)
        if i == 0:
            return math.exp(ys[0]) * 1e-3
        share = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return math.exp(ys[i - 1] + share * (ys[i] - ys[i - 1])) * 1e-3


def measured_all_reduce(topology: Topology, ranks: int) -> Callable[[float], float] | None:
    """vLLM's measured all-reduce (ms from bytes) for ``ranks`` GPUs of ``topology``, or None
    when it was not measured there: a preset other than :data:`MEASURED_US`'s machines, one
    changed by a calibration or a table, or a rank count not measured."""
    table = MEASURED_US.get(topology.name)
    if table is None or topology != TOPOLOGIES[topology.name] or ranks not in table:
        return None
    return MeasuredAllReduce(table[ranks])
