"""The names of a run's metrics, so that a misspelt one is refused when a file is loaded.

:func:`schedlab.results.metrics.compute_metrics` returns a nested dict; reports and searches name its
values by dotted paths (``ttft_ms.p99``, ``per_class.interactive.slo.goodput_rps``).
:data:`METRICS` is the shape of that dict: a leaf is ``None``, a group a dict, and ``"*"``
stands for keys that depend on the run (request classes, instance numbers, clients, rejection
reasons). Groups marked "optional" below exist only in some runs (``slo`` with an ``[slo]``
table, ``per_class`` with several classes or one a workload names, ``per_instance`` with several instances,
``per_client`` and ``fairness`` with several clients, ``speculative`` with a ``[speculative]``
table, ``vs_measured`` when a measured run is replayed, ``pools`` and ``transfer`` in a
disaggregated cluster, ``warmup`` in a search's runs with a ``warmup`` or a ``cooldown``, and
``cooldown`` with a ``cooldown``); a name that fits the shape but is
absent from a run shows as ``-``. A test keeps this shape and ``compute_metrics`` in step.
"""

from __future__ import annotations

import difflib
import re

from ..errors import ConfigError
from .metrics import ABORT_PLACES, LATENCY_NAMES, PERCENTILES

_SUMMARY = dict.fromkeys(("mean", *(f"p{p}" for p in PERCENTILES), "max"))
_LATENCIES = {name: _SUMMARY for name in LATENCY_NAMES}
_SLO = dict.fromkeys(("attainment", "goodput_rps", "met"))
_SUBSET = {**dict.fromkeys(("requests", "finished", "generated_tokens", "throughput_tps")), **_LATENCIES,
           "slo": _SLO}
_ENERGY_CLASS = dict.fromkeys(("j", "j_per_request", "j_per_token"))
_ENERGY = {**dict.fromkeys(("gpu_j", "busy_j", "idle_j", "host_j", "facility_j", "kwh", "gpu_kwh", "pue",
                            "j_per_token", "j_per_request", "facility_j_per_token", "attributed_j", "avg_power_w",
                            "peak_power_w", "window_ms")),
           "request_j": _SUMMARY,
           "per_instance": {"*": dict.fromkeys(("gpu_j", "avg_power_w", "peak_power_w", "busy_share"))}}
_STABILITY = {**dict.fromkeys(("verdict", "reason", "requests", "arrival_rps", "capacity_rps", "load",
                               "saturated_share", "waiting_slope_per_min", "growth_share", "growth", "noise",
                               "in_system_slope_per_min", "window_ms", "from_sample")),
              "fit": dict.fromkeys(("start_ms", "end_ms", "waiting_at_start", "waiting_at_end"))}  # or null

#: an autoscaler's decisions (schedlab.results.metrics._fleet)
FLEET = ("gpu_hours", "mean_gpus", "peak_serving", "min_serving", "scale_ups", "scale_downs")
_CLIENT = {name: _SUMMARY for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "ntpot_ms", "frontend_ms", "queue_ms",
                                      "e2el_incl_queue_ms")}

METRICS: dict = {
    **dict.fromkeys(("requests", "finished", "rejected", "timed_out", "aborted", "makespan_ms", "throughput_tps", "request_throughput_rps",
                     "generated_tokens", "iterations", "slot_utilisation", "peak_running", "avg_running",
                     "avg_queue", "peak_waiting", "busy_share", "num_preemptions", "requeues")),
    **_LATENCIES,
    "itl_ms": _SUMMARY,
    "client": _CLIENT,                             # as the client sees requests (schedlab.frontend)
    "kv_usage": dict.fromkeys(("mean", "peak", "time_above_90")),
    "preemptions": dict.fromkeys(("recompute", "in_flight", "swap", "recomputed_tokens", "discarded_tokens",
                                  "swap_failures", "swapped_out_blocks",
                                  "swapped_in_blocks", "swapped_out_bytes", "swapped_in_bytes", "swap_transfer_ms",
                                  "prefix_queries", "prefix_hits", "prefix_host_hits")),
    "prefix_cache": dict.fromkeys(("queries", "hits", "hit_rate", "gpu_hits", "gpu_hit_rate", "host_hits",
                                   "host_hit_rate", "host_loaded_blocks", "host_loaded_bytes", "host_load_ms",
                                   "host_stored_blocks", "host_stored_bytes", "host_evicted_blocks")),
    "prefill_chunks": dict.fromkeys(("mean", "max")),
    "cost": dict.fromkeys(("prefill_time_share", "decode_time_share", "total_prefill_ms", "total_decode_ms",
                           "decode_share")),
    "rejection_reasons": {"*": None},
    "slo": _SLO,                                   # optional: with an [slo] table
    "per_class": {"*": {**_SUBSET, "energy": _ENERGY_CLASS}},  # optional: several request classes, or a named one
    "energy": _ENERGY,                             # optional: with a [power] table (schedlab.energy)
    "energy_cost_per_hour": None,                  # optional: a capacity plan with an energy price
    "kwh_per_hour": None,
    "stability": {**_STABILITY, "unstable_instances": None},   # schedlab.results.stability; the list with instances
    "per_instance": {"*": {**_SUBSET, "stability": _STABILITY}},  # optional: with several instances
    "per_client": {"*": dict.fromkeys(("requests", "finished", "prompt_tokens", "generated_tokens", "service",
                                       "service_rate"))},   # optional: with several clients
    "fairness": dict.fromkeys(("clients", "jain_service", "jain_service_rate")),  # optional: several clients
    "speculative": dict.fromkeys(("draft_tokens", "accepted_tokens", "drafts", "acceptance_rate",
                                  "mean_acceptance_length", "tokens_per_step", "decode_steps")),  # optional
    "gpus": None,
    # optional: a disaggregated cluster (schedlab.engine.transfer): each pool's load, the KV transfers
    "pools": {pool: {**dict.fromkeys(("instances", "gpus", "iterations", "busy_share", "kv_usage_mean",
                                      "kv_usage_peak")), "queue_ms": _SUMMARY} for pool in ("prefill", "decode")},
    "transfer": {**dict.fromkeys(("transfers", "bytes")),
                 **{name: _SUMMARY for name in ("kv_wait_ms", "transfer_ms", "join_wait_ms")},
                 "aborted": dict.fromkeys(ABORT_PLACES)},   # where the clients that gave up left their requests
    # optional: a workload replaying a measured run (schedlab.results.compare); the keys of errors_pct
    # and measured are themselves dotted ("ttft_ms.p99"), so only the group can be named there
    "vs_measured": {"mean_abs_error_pct": None, "errors_pct": {"*": None}, "measured": {"*": None},
                    "server": {"errors_pct": {"*": None}, "measured": {"*": None}}},  # a client's file: the server's
    # optional: a run with a [target] summary of the real run (schedlab.targets.vs_target)
    "vs_target": {"mean_abs_error_pct": None, "errors_pct": {"*": None}, "measured": {"*": None},
                  "simulated": {"*": None}},
    # optional: the deployments a capacity plan simulates (schedlab.study.planner), in $ per hour
    "cost_per_hour": None,
    "cost_per_mtok": None,   # (a plan's: dollars a million output tokens at the simulated load)
    "gpu_hours": None,  # GPUs paid for x hours: the whole cluster from 0 to the last finish, or autoscaled
    # optional: an autoscaled cluster (schedlab.engine.scaling)
    # (drain_aborted: with a drain timeout, the requests it aborted, schedlab.engine.drain)
    "fleet": {**dict.fromkeys(FLEET), "drain_aborted": None,
              "pools": {pool: dict.fromkeys(FLEET) for pool in ("prefill", "decode")}},
    # optional: runs of two hours or more, by hour of arrival
    "hourly": {"*": dict.fromkeys(("requests", "slo_attainment", "gpu_hours"))},
    # optional: a search's probe with a warm-up or cool-down ([search] warmup, cooldown): the first requests
    # sent left out, those measured
    "warmup": dict.fromkeys(("requests", "measured", "measured_finished", "measured_window_ms")),
    # optional: one with a cool-down ([search] cooldown): the last requests sent left out
    "cooldown": dict.fromkeys(("requests",)),
}


def check_metric_name(name: object) -> str:
    """Return ``name`` if it names a number among a run's metrics; else raise.

    :raises ConfigError: the name is not text, does not fit :data:`METRICS` (the message lists
        the names possible where it went wrong) or names a group rather than a number.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a metric name must be dotted text such as 'ttft_ms.p99', got {name!r}")
    parts = name.split(".")
    if _fits(METRICS, parts, 0):
        return name
    node = METRICS   # (the first way through, for the message)
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            raise ConfigError(f"unknown metric {name!r}: {'.'.join(parts[:i])!r} is a number, it has no {part!r}")
        if part in node:
            node = node[part]
        elif "*" in node and part:
            node = node["*"]
        else:
            raise ConfigError(_unknown(name, parts, i, node))
    raise ConfigError(f"{name!r} is a group of metrics, not a number; name one of "
                      f"{', '.join(f'{name}.{key}' for key in _names(node))}")


def _fits(node, parts: list, i: int) -> bool:
    """Whether ``parts[i:]`` names a number under ``node``; a name (``*``: a class, a client)
    may take several parts, as ``gpt-4.1`` in ``per_class.gpt-4.1.ttft_ms.p99`` does."""
    if i == len(parts):
        return not isinstance(node, dict)
    if not isinstance(node, dict):
        return False
    if parts[i] in node and _fits(node[parts[i]], parts, i + 1):
        return True
    if "*" in node and parts[i]:
        return any(_fits(node["*"], parts, j) for j in range(i + 1, len(parts) + 1) if all(parts[i:j]))
    return False


def _names(node: dict) -> list[str]:
    return [("<name>" if key == "*" else key) for key in node]


#: a group's names are listed in full in a message up to this many; past it, the close match and the count
LISTED = 12
#: what a message shows of the top level when nothing there is close to the name given
EXAMPLES = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms", "throughput_tps", "busy_share")


#: a statistic named as ``vllm bench serve`` names it (``p99_ttft_ms``, ``median_e2el_ms``)
_BENCH_STYLE = re.compile(r"(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms")


def _unknown(name: str, parts: list[str], i: int, node: dict) -> str:
    """The message for ``parts[i]``, which ``node`` (the group of ``parts[:i]``) lacks: the close
    match first (``did you mean 'ttft_ms.p99'?``; a group when more parts follow), then the
    group's names -- all of them when there are few, else how many and a few of them."""
    fits = [key for key, value in node.items() if key != "*" and (i == len(parts) - 1 or isinstance(value, dict))]
    close = difflib.get_close_matches(parts[i], fits, n=1)
    alias = _BENCH_STYLE.fullmatch(name)  # vllm bench's spelling: p99_ttft_ms, median_e2el_ms
    if parts[i] == "median" and "p50" in fits:  # (difflib's pick was 'mean': another statistic)
        close = ["p50"]
    elif alias and i == 0:
        stat = "p50" if alias[1] == "median" else alias[1]
        group = {"e2el": "e2e_ms"}.get(alias[2], f"{alias[2]}_ms")
        return f"unknown metric {name!r} (did you mean '{group}.{stat}'?): metrics are <group>.<statistic>"
    hint = f" (did you mean {'.'.join(parts[:i] + close + parts[i + 1:])!r}?)" if close else ""
    where = f"{'.'.join(parts[:i])!r} has" if i else "metrics are"
    names = _names(node)
    if len(names) <= LISTED:
        return f"unknown metric {name!r}{hint}: {where} {', '.join(names)}"
    examples = [key for key in EXAMPLES if key in node] if i == 0 else names[:len(EXAMPLES)]
    count = f"{where} {len(names)} names" if i else f"there are {len(names)} metric names"
    return (f"unknown metric {name!r}{hint}: {count}{'' if close else ', none close to it'}, such as "
            f"{', '.join(examples)} (all of them: METRICS in schedlab/results/metric_names.py)")
