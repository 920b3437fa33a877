"""Settings of the ``plots`` report (kept apart so that registering it does not import matplotlib)."""

from __future__ import annotations

import attrs

from schedlab.configs import int_field, list_field

DEFAULT_SWEEP_METRICS = ("queue_ms.p99", "ttft_ms.p99", "tpot_ms.p99", "throughput_tps", "avg_queue",
                         "num_preemptions")


@attrs.frozen
class PlotsConfig:
    max_timelines: int = int_field(12, min=0, help="most timeline figures (single runs first, then "
                                                   "search boundaries, then sweep points)")
    sweep_metrics: tuple = list_field(DEFAULT_SWEEP_METRICS, item=str,
                                      help="metrics plotted against a sweep's key, as dotted names; absent ones skipped")
    cdf_max_lines: int = int_field(8, min=1, help="sweeps with at most this many points also get a latency CDF figure")
    dpi: int = int_field(110, min=50, max=400, help="resolution of the PNGs (dots per inch)")
