"""Assemble one run from resolved TOML tables and simulate it.

pluggy's part ends here: the catalog turns each table's ``kind`` into a plugin object, and
the engine then calls those objects directly in its loop.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import re
import sys
import time
import warnings
from typing import Any, Callable

import attrs

from ..capacity import KV_CACHE_DTYPES, Presets
from ..catalog import Catalog
from ..configs import (MAX_INSTANCES, FieldError, bool_field, bound_text, float_field, from_table, int_field, str_field,
                       table_field)
from ..drafting import DraftingCostModel
from ..energy.meter import EnergyMeter, close_meters, close_part
from ..energy.pipeline import PipelineMeter
from ..engine.ahead import plans_ahead
from ..engine.disagg import DisaggregatedCluster
from ..engine.driver import simulate, simulate_disaggregated
from ..engine.instance import Instance
from ..engine.load import RoutingClock
from ..engine.plan import model_len_limit
from ..engine.lockstep import DataParallelCluster, deployments_summary, simulate_data_parallel
from ..engine.pipeline import PipelinedInstance
from ..engine.pool_scaling import pool_scaling
from ..engine.rank_cost import clocked, rank_view
from ..engine.recorder import Recorder
from ..engine.reference import ReferenceEngine
from ..engine.reference_cluster import DisaggregatedReference, ReferenceCluster
from ..engine.reference_lockstep import ReferenceDataParallel, ReferenceDeployments
from ..engine.reference_pipeline import ReferencePipeline, ReferencePipelineCluster
from ..engine.stage_cost import stage_view
from ..engine.scaling import ScalingController, ScalingLimits, deployment_scaling, pipeline_scaling
from ..engine.transfer import FIRST_TOKEN, KV_LEASE_MS, kv_bytes_per_token
from ..errors import (ConfigError, InputWarning, SchedlabError, SimulationError, UnknownPluginError, WorkloadError,
                      brief, entry_label, raised_by_plugin)
from ..frontend import ClientConfig, ClientSide, FrontendConfig
from ..model import Request, checked_requests
from ..registry import PluginConfigWarning, allocate_past_grow
from ..targets import TargetConfig, compare_with_real_run, incomparable_left_out
from ..parallelism import SINGLE, LayoutError, Parallelism
from ..results.metrics import engine_end_ms, request_met, warmup_count
from ..results.records import RunResult
from ..results.stream import RecordSettings, RowSink
from ..speculative import Speculation, SpeculativeConfig, budget_problem
from .overrides import merge_tables

COMPONENTS = ("workload", "scheduler", "cost_model", "kv_cache")
DEFAULT_TABLES: dict[str, dict] = {
    "scheduler": {"kind": "continuous"},
    "cost_model": {"kind": "linear"},
    "kv_cache": {"kind": "paged"},
}
ENGINES = ("fast", "reference")


CLUSTER_MODES = ("colocated", "disaggregated")
POOLS = ("prefill", "decode")


def optional_bool_field(*, help: str):
    """A true/false setting that may be left unset (None)."""
    def check(_inst, attribute, value):
        if value is not None and not isinstance(value, bool):
            raise FieldError(attribute.name, f"must be true or false, got {value!r}")
    return attrs.field(default=None, validator=check, metadata={"help": help})


@attrs.frozen
class ClusterConfig:
    mode: str = str_field("colocated", choices=CLUSTER_MODES,
                          help="'colocated': every instance prefills and decodes; 'disaggregated': a prefill pool "
                               "hands prompts' KV to a decode pool ([cluster.prefill], [cluster.decode], [cluster.link])")
    instances: int = int_field(1, min=1, max=MAX_INSTANCES,
                               help="identical instances behind the router (colocated); with data_parallel, "
                                    "identical deployments of data_parallel ranks each")
    router: dict = table_field(attrs.Factory(lambda: {"kind": "round_robin"}),
                               help="the router table (kind = ...), used when instances > 1; disaggregated: the "
                                    "default router of both pools; one data-parallel deployment: picks the rank "
                                    "(default: the scheduler's engine's, vllm_dp or SGLang's round_robin), "
                                    "several: the deployment")
    prefill: dict | None = table_field(None, help="disaggregated: the prefill pool (instances, router, and scheduler, "
                                                  "cost_model, kv_cache tables overriding the run's)")
    decode: dict | None = table_field(None, help="disaggregated: the decode pool (same keys as prefill)")
    link: dict | None = table_field(None, help="disaggregated: the KV link from a prefill to a decode instance "
                                               "(bandwidth_gbps, latency_us)")
    first_token: str | None = str_field(
        None, choices=FIRST_TOKEN, optional=True,
        help="disaggregated: the pool that samples the client's first token -- 'decode' (the default, vLLM's P/D "
             "proxy: the prefill instance's token is discarded, the decode instance recomputes the last prompt token "
             "and samples it; one-token answers go to the decode pool too) or 'prefill' (DistServe: the decode "
             "instance continues from the second token; one-token answers finish on the prefill instance)")
    prefill_hears_disconnect: bool | None = optional_bool_field(
        help="disaggregated: the P/D proxy passes a client's disconnect on to the prefill instance (true, the "
             "default: it aborts the prompt, its KV freed at once) or not (false: the prompt runs to its end, the "
             "proxy drops it and its KV waits out [cluster.link] kv_lease_ms)")
    # Data, expert and pipeline parallelism (schedlab.parallelism): handed to the plugins'
    # factories, so the KV cache and the cost model follow the same layout.
    data_parallel: int = int_field(1, min=1, max=MAX_INSTANCES,
                                   help="data-parallel ranks, each with its own scheduler and KV cache (vLLM "
                                        "--data-parallel-size, SGLang --dp with --enable-dp-attention); a MoE "
                                        "model's step together")
    rank_router: dict | None = table_field(
        None, help="data_parallel: the router that picks the rank within a deployment (default: vllm_dp, vLLM's DP "
                   "load balancer; the sglang scheduler's round_robin, SGLang's --load-balance-method auto); each "
                   "deployment has its own")
    expert_parallel: bool = bool_field(False, help="data_parallel > 1: whole experts spread over the ranks' GPUs "
                                                   "(vLLM --enable-expert-parallel), else every expert sharded")
    expert_balancedness: float = float_field(
        1.0, min=0.0, max=1.0, min_exclusive=True,
        help="mean over max of the tokens the experts' GPUs receive (vLLM EPLB's balancedness; 1 = even)")
    dp_sync_interval: int | None = int_field(
        None, min=1, max=1024, optional=True,
        help="data_parallel, a MoE model's ranks: once no rank has work they step on (dummy batches) until the "
             "wave's next check, every this many steps (vLLM --dp-sync-interval; default the scheduler's engine's: "
             "vLLM 0.33's 16, SGLang's 1 (every step); vLLM 0.28 and older: 32 with dp_sync_first_step = false)")
    dp_sync_first_step: bool = bool_field(
        True, help="data_parallel: the ranks also check at a wave's first step (vLLM 0.33; false before)")
    pipeline_parallel: int = int_field(1, min=1, max=64,
                                       help="pipeline stages of each instance (vLLM --pipeline-parallel-size), one "
                                            "batch in flight per stage")
    autoscaler: dict | None = table_field(None, help="an autoscaling policy (kind = 'target_utilization' or "
                                                     "'queue_length', min_instances, max_instances, cold_start_s, "
                                                     "drain_timeout_s, ...): instances is then the most that can serve "
                                                     "(data_parallel: whole deployments; disaggregated: each pool's "
                                                     "own, in [cluster.prefill] and [cluster.decode])")
    partitions: int = int_field(1, min=1, max=MAX_INSTANCES,
                                help="simulate the instances as this many independent tasks (workers or Ray) and "
                                     "merge them: exact for routers that ignore load (round_robin, hash, class with "
                                     "one instance per class) and open-loop workloads")

    def __attrs_post_init__(self):
        self.parallelism  # noqa: B018 -- checks the layout's settings together
        if self.rank_router is not None and self.data_parallel == 1:
            raise FieldError("rank_router", "picks a data-parallel rank: set data_parallel > 1")
        if self.data_parallel == 1 and (self.dp_sync_interval is not None or not self.dp_sync_first_step):
            raise FieldError("dp_sync_interval" if self.dp_sync_interval is not None else "dp_sync_first_step",
                             "paces data-parallel ranks stepping together: set data_parallel > 1")
        if self.mode == "colocated":
            for name in ("prefill", "decode", "link"):
                if getattr(self, name) is not None:
                    raise FieldError(name, "only a cluster with mode = 'disaggregated' has pools and links")
            for name in ("first_token", "prefill_hears_disconnect"):
                if getattr(self, name) is not None:
                    raise FieldError(name, "only a cluster with mode = 'disaggregated' hands its requests from a "
                                           "prefill pool to a decode pool")
        elif self.parallelism != SINGLE:
            raise FieldError("data_parallel" if self.data_parallel > 1 else "pipeline_parallel",
                             "a disaggregated cluster with data or pipeline parallelism is not modelled")
        # (other layouts are refused with partitions when the run is assembled: _check_partitions)
        if self.mode == "colocated" and self.parallelism == SINGLE and self.instances == 1 < self.partitions:
            raise FieldError("partitions", f"{self.partitions} parts of a single instance: it has nothing to split "
                                           "(partitions splits a cluster's instances into runs of their own)")
        if self.mode == "colocated" and self.parallelism == SINGLE and 1 < self.instances < self.partitions:
            raise FieldError("partitions", f"{self.partitions} is more than instances ({self.instances}): part p "
                                           "simulates the instances i with i % partitions = p, so a part would have "
                                           "none; set partitions to at most instances")

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(self.data_parallel, self.expert_parallel, self.expert_balancedness, self.pipeline_parallel)


@attrs.frozen
class PoolConfig:
    """One pool of a disaggregated cluster: its size, router and plugin tables."""

    instances: int = int_field(1, min=1, max=MAX_INSTANCES, help="instances in the pool")
    router: dict | None = table_field(None, help="router within the pool (default: [cluster] router)")
    scheduler: dict = table_field(attrs.Factory(dict),
                                  help="overrides the run's [scheduler] key by key (another kind replaces it)")
    cost_model: dict = table_field(attrs.Factory(dict), help="overrides the run's [cost_model] likewise")
    kv_cache: dict = table_field(attrs.Factory(dict), help="overrides the run's [kv_cache] likewise")
    power: dict = table_field(attrs.Factory(dict), help="overrides the run's [power] likewise")
    clock: dict = table_field(attrs.Factory(dict), help="the pool's SM clock: overrides the run's [clock] likewise, "
                                                          "or clocks this pool alone (e.g. the decode pool lower)")
    autoscaler: dict | None = table_field(None, help="scales this pool on its own signals (the keys of [cluster] "
                                                     "autoscaler): instances is then the most that can serve; "
                                                     "without it the pool is fixed")


@attrs.frozen
class LinkConfig:
    """The link a prompt's KV crosses from a prefill instance to a decode instance."""

    bandwidth_gbps: float = float_field(25.0, min=1e-3, allow_inf=True,
                                        help="GB/s of each prefill-decode pair of instances, per GPU, one direction "
                                             "(25: a 200 Gb/s RDMA NIC per GPU; at least 0.001, 1 MB/s; inf: "
                                             "instant); pairs do not share it")
    latency_us: float = float_field(10.0, min=0.0, max=1e8,
                                    help="fixed time of one transfer, us (at most 1e8: 100 s)")
    kv_lease_ms: float = float_field(KV_LEASE_MS, min=0.0,
                                     help="how long a prefill instance keeps the KV of a prompt the proxy dropped "
                                          "when its client gave up and no decode instance heard of it, ms (vLLM "
                                          "NixlConnector's kv_lease_duration: 30 s; [cluster] "
                                          "prefill_hears_disconnect = false)")


@attrs.frozen
class SloConfig:
    """Per-request targets: a request meets the SLO when its TTFT and its TPOT are both within
    them (``slo.goodput_rps`` counts such requests per second, as ``vllm bench serve --goodput``;
    DistServe's goodput, the highest rate at which 90% meet them, is the ``goodput`` report's)."""

    # (a target of 0 no request meets: a plan or search on it could only fail, advising more instances)
    ttft_ms: float = float_field(math.inf, min=0.0, min_exclusive=True, allow_inf=True,
                                 help="TTFT target of every request, ms (> 0; inf: none)")
    tpot_ms: float = float_field(math.inf, min=0.0, min_exclusive=True, allow_inf=True,
                                 help="TPOT target of every request, ms (> 0; inf: none)")
    classes: dict = table_field(attrs.Factory(dict),
                                help="targets per request class: {interactive = {ttft_ms = 300, tpot_ms = 100}}")

    def __attrs_post_init__(self):
        if math.isinf(self.ttft_ms) and math.isinf(self.tpot_ms) and not self.classes:  # (attainment 1 everywhere)
            raise FieldError("ttft_ms", "the table names no target (ttft_ms, tpot_ms or classes), so every request "
                                        "would meet it and a search on its attainment hold everywhere; give one")
        for name, table in self.classes.items():
            if not isinstance(table, dict):
                raise FieldError("classes", f"{name} must be a table like {{ttft_ms = 300}}, got {table!r}")
            for key, value in table.items():
                if key not in ("ttft_ms", "tpot_ms"):
                    raise FieldError("classes", f"{name}: unknown key {key!r}; valid keys: ttft_ms, tpot_ms")
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:  # (NaN too)
                    raise FieldError("classes", f"{name}.{key} must be a number > 0 (inf: none), got {value!r}")
                if isinstance(value, int) and value > sys.float_info.max:
                    raise FieldError("classes", f"{name}.{key} must be a finite number (at most "
                                                f"{sys.float_info.max:.3g}; inf: none), got {bound_text(value)}")


@attrs.frozen
class RunSpec:
    """A fully resolved run: its name, tables, seed and engine."""

    name: str
    tables: dict[str, Any]
    seed: int = 0
    engine: str = "fast"
    point: dict[str, Any] = attrs.field(factory=dict)
    #: (part, parts) of a partitioned run (see :mod:`schedlab.study.partition`); () for the whole run
    part: tuple = ()
    #: the requests its statistics leave out, the first sent: a count, or a share of its requests
    #: below 1 (a search's ``warmup``, :func:`schedlab.results.metrics.measured_requests`); 0: none
    warmup: Any = 0
    #: the same of the last requests sent (a search's ``cooldown``); 0: none
    cooldown: Any = 0


@attrs.define
class Context:
    """What building a run needs besides its tables: plugins, presets, where the file is."""

    catalog: Catalog
    presets: Presets
    base_dir: str
    source: str  # file name, for messages


def _call_factory(factory: Callable, config, presets: Presets, *, entry=None, **extra):
    """``factory(config)``, with the presets and any of ``extra`` its signature names (the run's
    ``parallelism`` layout, a power model's ``cost_model`` and ``tensor_parallel``). A factory
    whose signature cannot take that raises :class:`ConfigError` naming ``entry`` (its registry
    entry) and the fix, before it is called."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    params = signature.parameters if signature is not None else {}
    args = [] if config is None else [config]
    offered = {"presets": presets, **extra}
    kwargs = {name: value for name, value in offered.items() if name in params}
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ConfigError(_unbound(entry, factory, signature, config, kwargs, list(offered), exc)) from None
    return factory(*args, **kwargs)


def _unbound(entry, factory: Callable, signature, config, kwargs: dict, offered: list, exc: TypeError) -> str:
    """Why ``factory`` cannot take what schedlab passes it, and the fix (see :func:`_call_factory`)."""
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None) or repr(factory)
    call = f"{name}({', '.join((['config'] if config is not None else []) + [f'{k}=...' for k in kwargs])})"
    first = next(iter(signature.parameters), None)
    if config is None:
        given = "registered without config=, it gets no config"
    else:
        given = f"registered with config={entry.config.__name__ if entry is not None else '...'}, it gets an " \
                "instance of it first"
    if config is None and str(exc) == f"missing a required argument: {first!r}":
        fix = ("a factory that takes settings is registered with their attrs class: "
               "register(name, factory, config=YourConfig)")
    elif config is not None and str(exc) == "too many positional arguments":
        fix = "take the config as its first argument (def __init__(self, config)), or register it without config="
    else:
        fix = (f"schedlab passes the config (registered with config=) and, to parameters of those names only, "
               f"{', '.join(offered)}: give any other parameter a default")
    who = f"{entry_label(entry)}: " if entry is not None else ""
    return f"{who}schedlab calls its factory as {call} ({given}), which fails: {exc}; {fix}"


#: What the engines (and the rest of schedlab) always use of each kind of plugin -- the protocols
#: of schedlab/protocols.py less their optional members: methods (with ``()``) and attributes.
#: ``KVCache.check_invariants`` is only for tests (schedlab.testing), so not required here.
REQUIRED = {
    "scheduler": ("Scheduler", ("schedule()",)),
    "cost_model": ("CostModel", ("iteration_ms()",)),
    "kv_cache": ("KVCache", ("block_size", "num_blocks", "num_free_blocks()", "num_used_blocks()",
                             "cached_tokens()", "blocks_needed()", "allocate()", "free()")),
    "workload": ("Workload", ("requests()",)),
    "router": ("Router", ("route()",)),
    "power_model": ("PowerModel", ("idle_w", "standby_w", "standby_ms", "iteration_j()")),
    "autoscaler": ("Autoscaler", ("decide()",)),
    "report": ("Report", ("write()",)),
}
#: What the engines and schedulers use of a scheduler's ``new_waiting_queue()`` (the
#: WaitingQueue protocol; ``bool(queue)`` falls back on ``__len__``).
WAITING_QUEUE = ("push()", "push_front()", "peek()", "remove()", "__len__()", "__iter__()")


def _lacks(obj, members) -> list[str]:
    """The ``members`` (methods with ``()``, attributes without) ``obj`` does not have; special
    methods are looked up on its class, as Python does."""
    missing = []
    for member in members:
        if not member.endswith("()"):
            if not hasattr(obj, member):
                missing.append(member)
            continue
        name = member[:-2]
        found = getattr(type(obj), name, None) if name.startswith("__") else getattr(obj, name, None)
        if not callable(found):
            missing.append(member)
    return missing


#: Attributes the engines read as numbers or flags, by kind: ``name: (least, optional)`` -- a whole
#: number >= least (None: a bool), or None where optional. Unchecked, a text ``num_blocks`` or a
#: negative ``block_size`` failed deep in the engine or ran on with wrong numbers. No number may pass
#: :data:`MOST_COUNTED` (``slots = 10**400`` overflowed a float in the metrics after the whole run).
ATTRIBUTES = {
    "kv_cache": {"block_size": (1, False), "num_blocks": (0, False)},
    "scheduler": {"slots": (1, True), "max_in_flight": (1, True), "plans_ahead": (None, True),
                  "stable_between_events": (None, True)},
}
#: The largest count a plugin attribute may hold: 2**53, the largest whole number a float holds exactly.
MOST_COUNTED = 2 ** 53


#: How the engines call each kind's methods: ``name: (positional arguments, keyword arguments)``;
#: a plugin method that cannot take them (``def schedule(self)``) failed with a traceback raised
#: at schedlab's call site, before any plugin frame, so no plugin was named.
CALLS = {
    "scheduler": {"schedule": ("plan",), "on_finish": ("seq", "now_ms"), "rejection_reason": ("request", "kv"),
                  "kv_reservation": ("request",), "new_waiting_queue": ()},
    "cost_model": {"iteration_ms": ("batch",)},
    "kv_cache": {"num_free_blocks": (), "num_used_blocks": (), "cached_tokens": ("seq",),
                 "blocks_needed": ("seq", "num_new_tokens", "cached_tokens=", "reserve_tokens="),
                 "allocate": ("seq", "num_new_tokens", "cached_tokens=", "reserve_tokens="),
                 "free": ("seq", "preempted=")},
    "workload": {"requests": ("seed",), "on_finish": ("request", "now_ms")},
    "router": {"route": ("request", "instances")},
    "power_model": {"iteration_j": ("batch", "duration_ms")},
    "autoscaler": {"decide": ("signals",)},
    "report": {"write": ("results", "out_dir")},
}


def _check_calls(entry, obj, protocol: str) -> None:
    """Refuse a method of ``obj`` that cannot take the arguments the engines give it (:data:`CALLS`)."""
    for name, params in CALLS.get(entry.kind, {}).items():
        method = getattr(obj, name, None)
        if not callable(method):
            continue
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):  # (a builtin or a C method: nothing to go by)
            continue
        positional = [p for p in params if not p.endswith("=")]
        keywords = {p[:-1]: None for p in params if p.endswith("=")}
        try:
            signature.bind(*([None] * len(positional)), **keywords)
        except TypeError:
            shown = ", ".join(positional + [f"{k}=..." for k in keywords])
            raise ConfigError(f"{entry_label(entry)}: its {name}{signature} cannot be called as {name}({shown}), as "
                              f"schedlab calls it (the {protocol} protocol: schedlab/protocols.py)") from None


def _check_blocks_needed(entry, kv) -> None:
    """Refuse a third-party KV cache whose ``blocks_needed`` does not answer a whole number of blocks
    for a fresh 16-token request: its None failed inside the built-in scheduler that added it up,
    which was blamed. (A pure question; built-in caches are not asked.)"""
    from ..engine.sequence import DecodeClock, Sequence

    probe = Sequence(Request(id=0, arrival_ms=0.0, prompt_tokens=16, output_tokens=1), 0, DecodeClock())
    answer = kv.blocks_needed(probe, 16)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Integral) or answer < 0:
        raise ConfigError(f"{entry_label(entry)}: its blocks_needed() returned {brief(answer)} (a "
                          f"{type(answer).__name__}) for a fresh 16-token request; the KVCache protocol wants a whole "
                          "number of blocks >= 0 (schedlab/protocols.py)")


def check_protocol(entry, obj) -> None:
    """Raise :class:`ConfigError` when ``obj``, what ``entry``'s factory made, lacks a member its
    kind's protocol requires (:data:`REQUIRED`), or, for a scheduler, when the queue its
    ``new_waiting_queue()`` makes lacks one (:data:`WAITING_QUEUE`): the run would otherwise end in
    an AttributeError deep in the engine. Called once per object built, never while a run runs."""
    protocol, members = REQUIRED.get(entry.kind, (None, ()))
    missing = _lacks(obj, members)
    if missing:
        raise ConfigError(f"{entry_label(entry)}: the object its factory made has no {', '.join(missing)} "
                          f"(the {protocol} protocol: schedlab/protocols.py)")
    _check_calls(entry, obj, protocol)
    for name, (least, optional) in ATTRIBUTES.get(entry.kind, {}).items():
        value = getattr(obj, name, None)
        if value is None and (optional or not hasattr(obj, name)):
            continue
        wrong = (not isinstance(value, bool)) if least is None else \
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or not least <= value <= MOST_COUNTED
        if wrong:
            want = "True or False" if least is None else \
                f"a whole number from {least} to 2**53" + (" or None" if optional else "")
            raise ConfigError(f"{entry_label(entry)}: its {name} is {brief(value)} (a {type(value).__name__}); the "
                              f"{protocol} protocol wants {want} (schedlab/protocols.py)")
    if entry.kind == "kv_cache" and not entry.provider.endswith(" (built-in)"):
        _check_blocks_needed(entry, obj)
    if entry.kind != "scheduler":
        return
    make_queue = getattr(obj, "new_waiting_queue", None)
    if make_queue is None:
        return
    if not callable(make_queue):
        raise ConfigError(f"{entry_label(entry)}: new_waiting_queue is a {type(make_queue).__name__}, not a method "
                          "returning the waiting queue (the Scheduler protocol: schedlab/protocols.py)")
    queue = make_queue()  # (a throwaway: each engine asks for its own)
    missing = _lacks(queue, WAITING_QUEUE)
    if missing:
        raise ConfigError(f"{entry_label(entry)}: the queue its new_waiting_queue() made (a {type(queue).__name__}) has "
                          f"no {', '.join(missing)} (the WaitingQueue protocol: schedlab/protocols.py; "
                          "schedlab.queues has FcfsQueue and KeyedQueue)")


def component_config(ctx: Context, kind: str, table: dict, where: str):
    """The registry entry a ``{kind = "...", ...}`` table names and its checked config (None for a
    plugin without settings), with errors naming ``where``; builds no plugin object."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table, got {table!r}")
    table = dict(table)
    name = table.pop("kind", None)
    registry = ctx.catalog[kind]
    if name is None:
        raise ConfigError(f"{where}: missing 'kind'; registered {kind}s: {', '.join(registry.names())}")
    try:
        entry = registry.get(name)
    except UnknownPluginError as exc:
        raise UnknownPluginError(f"{where}: {exc}") from None
    if entry.config is not None:
        config = from_table(entry.config, table, where=where, base_dir=ctx.base_dir)
    elif table:
        raise ConfigError(f"{where}: {kind} {name!r} takes no settings, got {', '.join(table)}")
    else:
        config = None
    return entry, config


#: the table a ``where`` ends with (`` [scheduler]``): a layout error names ``[cluster]`` instead
_TABLE_AT_END = re.compile(r" \[[^\]]*\]$")


def _warn_allocate_past_grow(entry, kv, source: str) -> None:
    """A KV cache a factory function built whose class overrides ``allocate`` but inherits a
    built-in cache's ``grow``: the fast engine would bypass the override (registering the class
    itself warns at once, :func:`schedlab.registry.allocate_past_grow`; a factory, as the built-in
    ``paged`` is registered, is only known by what it builds). Said of the file, not the run: once."""
    skipped = allocate_past_grow(type(kv))
    if skipped:
        warnings.warn(f"{source}: {entry_label(entry)}: {skipped}", PluginConfigWarning, stacklevel=4)


def build_component(ctx: Context, kind: str, table: dict, where: str, parallelism: Parallelism = SINGLE, **extra):
    """Turn ``{kind = "...", ...}`` into a plugin object, with errors naming ``where``; the run's
    ``parallelism`` layout and ``extra`` go to factories that name them (a power model's
    ``cost_model`` and ``tensor_parallel``)."""
    entry, config = component_config(ctx, kind, table, where)
    try:
        obj = _call_factory(entry.factory, config, ctx.presets, entry=entry, parallelism=parallelism, **extra)
        ctx.catalog.note_built(obj, entry)
        check_protocol(entry, obj)
        if kind == "kv_cache" and not isinstance(entry.factory, type):  # (a class was checked when registered)
            _warn_allocate_past_grow(entry, obj, ctx.source)
    except LayoutError as exc:  # the [cluster] layout, found by the component
        raise ConfigError(f"{_TABLE_AT_END.sub('', where)} [cluster]: {exc}") from None
    except (ConfigError, UnknownPluginError, WorkloadError) as exc:  # (a data file: its table and the experiment too)
        raise type(exc)(f"{where}: {exc}") from None
    except FieldError as exc:  # a factory's check across settings (e.g. swap space needs a block size)
        raise ConfigError(f"{where}: {exc.name}: {exc.message}") from None
    return obj


def _tables_with_defaults(tables: dict, ctx: Context | None = None) -> dict:
    """``tables`` with the default ones they leave out, and the default kind in a table that
    names none (``[scheduler] max_num_seqs = 8`` alone, or made by a sweep, ``--set`` or a plan:
    the default scheduler with that setting, as a ``[[runs]]`` table without a kind merges).
    With ``ctx``, a ``[kv_cache]`` that names no kind is of the kind the scheduler's engine uses
    (an optional ``kv_cache_kind`` on its config class: SGLang's radix tree)."""
    out = {k: dict(v) for k, v in DEFAULT_TABLES.items()}
    for key, table in tables.items():
        default = DEFAULT_TABLES.get(key)
        out[key] = {**default, **table} if default and isinstance(table, dict) and "kind" not in table else table
    cache = tables.get("kv_cache")
    if ctx is not None and not (isinstance(cache, dict) and "kind" in cache):
        kind = getattr(_config_class(ctx, "scheduler", out["scheduler"]), "kv_cache_kind", None)
        if kind is not None:
            out["kv_cache"] = {**out["kv_cache"], "kind": kind}
    return out


@attrs.define
class Pool:
    """The instances of one pool of a disaggregated cluster."""

    name: str
    instances: list[tuple[Any, Any, Any]]  # (scheduler, cost model, kv cache) per instance
    router: Any
    autoscaler: Any = None  # the pool's policy (schedlab.protocols.Autoscaler); None: a fixed pool


@attrs.define
class Assembled:
    workload: Any
    instances: list[tuple[Any, Any, Any]]  # (scheduler, cost model, kv cache) per instance (all pools')
    router: Any
    cluster: ClusterConfig
    slo: SloConfig | None
    speculative: SpeculativeConfig | None = None
    pools: list[Pool] | None = None  # disaggregated: prefill, decode
    link: LinkConfig | None = None
    power: list | None = None  # with [power]: each instance's power model (same order as instances)
    # what each instance's engine sees of its cost model, when not the cost model itself: lockstep
    # ranks and pipelined instances are timed by their cluster (a RankCost each; power models are
    # built against it)
    views: list | None = None
    client_side: ClientSide | None = None  # [frontend] and [client]: the way to the engine, timeouts
    parallelism: Parallelism = SINGLE
    lockstep: bool = False  # data-parallel ranks of a MoE model step together (else: independent instances)
    # several such deployments ([cluster] instances): router picks the deployment, each
    # deployment's own router (rank_routers) the rank; its ranks are instances[d * D:(d + 1) * D]
    deployments: int = 1
    rank_routers: list | None = None
    # lockstep ranks: (steps between their checks that no rank has work, check a wave's first step)
    dp_sync: tuple = (1, False)
    autoscaler: Any = None           # a policy (schedlab.protocols.Autoscaler)
    target: Any = None               # [target]: the real run's summary (schedlab.targets.Summary)


def _build_instances(ctx: Context, tables: dict, count: int, where: str, label: str | dict,
                     speculative: SpeculativeConfig | None, power: list | None = None,
                     parallelism: Parallelism = SINGLE, disaggregated: bool = False) -> list[tuple]:
    """``count`` instances' plugins; with a ``[power]`` table each one's power model goes to
    ``power`` (and a ``[clock]`` table puts the instance's cost model at its clock). ``label``:
    the prefix of the tables errors name (``"cluster.decode."``), or one per kind of table -- a
    pool's for the tables it overrides, the run's for the others."""
    def at(kind: str) -> str:
        return f"{where} [{label.get(kind, '') if isinstance(label, dict) else label}{kind}]"

    try:
        tables = {**tables, "scheduler": _with_run_defaults(ctx, tables)}
        if speculative is not None:   # (an optional speculative_defaults(table, method) on the config class)
            pick = getattr(_config_class(ctx, "scheduler", tables["scheduler"]), "speculative_defaults", None)
            if pick is not None:
                tables = {**tables, "scheduler": {**pick(tables["scheduler"], speculative.method),
                                                  **tables["scheduler"]}}
        tables = {**tables, "kv_cache": _with_engine_kv_defaults(ctx, tables)}
        tables = {**tables, "kv_cache": _with_drafter(ctx, tables["kv_cache"], speculative)}
    except ConfigError as exc:  # (a scheduler config's answers: named with the run they were for)
        raise ConfigError(at("scheduler") + f": {exc}") from None
    tables = {**tables, "cost_model": _with_engine_cost_defaults(ctx, tables)}
    key = _ahead_key(_config_class(ctx, "scheduler", tables["scheduler"]))
    if _unmodelled_ahead(speculative, parallelism, disaggregated, key) is not None:
        tables = {**tables, "scheduler": _synchronous_if_auto(ctx, tables["scheduler"])}
    parts = []
    for _ in range(count):
        scheduler, cost, kv = (build_component(ctx, kind, tables[kind], at(kind), parallelism)
                               for kind in ("scheduler", "cost_model", "kv_cache"))
        for method in ("kv_problem", "start_up_problem"):  # (a 7 read as the problem "7")
            ask = getattr(scheduler, method, None)
            answer = ask(kv) if callable(ask) else None
            if answer and not isinstance(answer, str):
                who = entry_label(ctx.catalog["scheduler"].get(tables["scheduler"].get("kind")))
                raise ConfigError(at("scheduler") + f": {who}: its {method}() returned {brief(answer)} "
                                  f"({type(answer).__name__}); it returns why the settings cannot work, as text, or "
                                  "None")
        problem = getattr(scheduler, "kv_problem", None)
        problem = problem and problem(kv)
        if problem:
            raise ConfigError(at("scheduler") + f": {problem}")
        if not parts:  # every instance has the same tables: one says it
            _warn_setting_notes(scheduler, kv, at("scheduler"))
        if speculative is not None:
            _check_budget_for_drafts(scheduler, speculative, at("scheduler"))
            cost = _drafting(ctx, speculative, cost, where, tables.get("cost_model") or {})
        if tables.get("clock") is not None:
            cost = _clocked(ctx, tables, cost, at("clock"))
        if power is not None:
            power.append(_power_model(ctx, tables, cost, kv, at("power")))
        parts.append((scheduler, cost, kv))
    return parts


def _warn_setting_notes(scheduler, kv, where: str) -> None:
    """Say what the scheduler's optional ``setting_notes(kv) -> list[str]`` finds moot in this
    run (SGLang's cache-aware order without a prefix cache, TGI's batching gate with chunking):
    the run is valid, but a setting the user chose changes nothing."""
    notes = getattr(scheduler, "setting_notes", None)
    for note in (notes(kv) if callable(notes) else ()):
        warnings.warn(f"{where}: {note}", InputWarning, stacklevel=4)


def _run_named(tables: dict, key: str) -> str | None:
    """The GPU or model a run names: its ``[kv_cache]`` or ``[cost_model]`` ``gpu`` / ``model``."""
    for kind in ("kv_cache", "cost_model"):
        name = tables.get(kind, {}).get(key)
        if isinstance(name, str):
            return name
    return None


def _with_run_defaults(ctx: Context, tables: dict) -> dict:
    """The run's scheduler table with the settings its kind's config picks for the run's GPU
    and model where the table leaves them out: an optional ``run_defaults(gpu_spec, model_spec,
    table, tensor_parallel=1) -> dict`` on the config class (either spec None when the run names
    none, or one unknown), as the ``vllm`` preset has (vLLM sizes its batch by the device and its
    context by the model) and ``tgi`` (its prefill budget by the shards' FLOPS). An unknown kind,
    GPU or model is left for the components themselves to report."""
    table = tables["scheduler"]
    pick = getattr(_config_class(ctx, "scheduler", table), "run_defaults", None)
    if pick is None:
        return table
    gpu, model = _run_named(tables, "gpu"), _run_named(tables, "model")
    gpu = ctx.presets.gpu(gpu) if gpu in ctx.presets.gpu_names() else None
    model = ctx.presets.model(model) if model in ctx.presets.model_names() else None
    shards = next((t.get("tensor_parallel") for t in (tables.get("cost_model", {}), tables.get("kv_cache", {}))
                   if isinstance(t.get("tensor_parallel"), int) and t.get("tensor_parallel") > 0), 1)
    answer = pick(gpu, model, table, tensor_parallel=shards)
    entry = ctx.catalog["scheduler"].get(table["kind"])
    config = entry.config
    who = f"{entry_label(entry)}: {config.__qualname__}.run_defaults()"
    if answer is None:
        return table
    if not isinstance(answer, dict):  # (a TypeError traceback in the merge below)
        raise ConfigError(f"{who} returned {brief(answer)} ({type(answer).__name__}); it returns a dict of "
                          "[scheduler] keys for the run ({} or None for none)")
    fields = attrs.fields_dict(config) if attrs.has(config) else None
    unknown = [key for key in answer if fields is not None and key not in fields]
    if unknown:  # (read as the file's own key: 'unknown key' named a table the file does not have it in)
        raise ConfigError(f"{who} returned the key {unknown[0]!r}, which its config has not; it has: "
                          f"{', '.join(fields)}")
    return {**answer, **table}


def _config_class(ctx: Context, component: str, table: dict):
    """The config class of ``table``'s kind (None: unknown kind, or none)."""
    registry = ctx.catalog[component]
    if table.get("kind") not in registry:
        return None
    return registry.get(table["kind"]).config


def _with_engine_kv_defaults(ctx: Context, tables: dict) -> dict:
    """The run's ``[kv_cache]`` table with what its scheduler's engine turns on in the cache by
    default (an optional ``kv_cache_defaults`` dict on the scheduler's config class, as the
    ``vllm`` preset's prefix caching), for the keys the table leaves out and its kind has."""
    table = tables["kv_cache"]
    config = _config_class(ctx, "scheduler", tables["scheduler"])
    engine = getattr(config, "kv_cache_defaults", None)
    if engine is not None and not isinstance(engine, dict):  # (an attrs field of that name: a traceback below)
        entry = ctx.catalog["scheduler"].get(tables["scheduler"]["kind"])
        raise ConfigError(f"{entry_label(entry)}: {config.__qualname__}."
                          f"kv_cache_defaults is {type(engine).__name__}, not a dict: declare it a class attribute "
                          "(kv_cache_defaults: ClassVar[dict] = {...}), not a field of the config")
    cache = _config_class(ctx, "kv_cache", table)
    if not engine or cache is None or not attrs.has(cache):
        return table
    fields = attrs.fields_dict(cache)
    return {**{k: v for k, v in engine.items() if k in fields and k not in table}, **table}


def _with_drafter(ctx: Context, table: dict, speculative: SpeculativeConfig | None) -> dict:
    """The run's ``[kv_cache]`` table with the speculative drafter beside the target: its
    ``draft_model``, the model the drafter's cost model names, when the pool is sized from a model
    and a GPU and the table leaves it out (vLLM loads the drafter on the target's GPUs and pages its
    KV layers with the target's; an EAGLE head shares the target's tables, ``draft_shares_tables``;
    ``[speculative] draft_memory = false`` leaves the pool alone)."""
    if (speculative is None or not speculative.draft_memory or speculative.draft is None
            or "draft_model" in table or table.get("model") is None):
        return table
    model = speculative.draft.get("model")
    cache = _config_class(ctx, "kv_cache", table)
    if (not isinstance(model, str) or cache is None or not attrs.has(cache)
            or "draft_model" not in attrs.fields_dict(cache) or not _known_model(ctx, model)):
        return table  # (an unknown drafter: its own table, [speculative.draft], says so when built)
    shares = {"draft_shares_tables": True} if speculative.method == "eagle" and "draft_shares_tables" not in table \
        else {}  # (an EAGLE head uses the target's embedding and LM head: vLLM loads them once)
    return {**table, "draft_model": model, **shares}


def _known_model(ctx: Context, name: str) -> bool:
    """Whether ``name`` is a model preset (or a ``[models.<name>]`` table)."""
    try:
        ctx.presets.model(name)
    except (ConfigError, KeyError):
        return False
    return True


def _with_engine_cost_defaults(ctx: Context, tables: dict) -> dict:
    """The run's ``[cost_model]`` table with what its scheduler's engine implies for the step's
    timing (an optional ``cost_model_defaults(scheduler_table) -> dict`` on the scheduler's config
    class: TGI and SGLang without overlap step synchronously), for the keys the table leaves out
    and its kind has."""
    table = tables["cost_model"]
    pick = getattr(_config_class(ctx, "scheduler", tables["scheduler"]), "cost_model_defaults", None)
    cost = _config_class(ctx, "cost_model", table)
    if pick is None or cost is None or not attrs.has(cost):
        return table
    fields = attrs.fields_dict(cost)
    return {**{k: v for k, v in pick(tables["scheduler"]).items() if k in fields and k not in table}, **table}


def _check_budget_for_drafts(scheduler, speculative: SpeculativeConfig, where: str) -> None:
    """:func:`schedlab.speculative.budget_problem` as a ConfigError naming the table."""
    problem = budget_problem(getattr(scheduler, "config", None), speculative)
    if problem:
        raise ConfigError(f"{where}: {problem}")


def _unmodelled_ahead(speculative, parallelism: Parallelism, disaggregated: bool, key: str | None) -> str | None:
    """What in the run planning batches ahead (:mod:`schedlab.engine.ahead`; ``key``, the
    scheduler's setting that turns it on) is not modelled with, named as the run's table says
    it, or None."""
    if disaggregated:
        return "[cluster] disaggregated pools"
    if parallelism.pipelined and key != "async_scheduling":
        return "[cluster] pipeline_parallel"  # (vLLM's staggered decodes only: schedlab.engine.stages)
    if speculative is not None and key != "async_scheduling":
        return "[speculative]"  # (SGLang's overlap scheduler drafts otherwise: not modelled)
    return None


def _synchronous_if_auto(ctx: Context, table: dict) -> dict:
    """A scheduler table whose ``async_scheduling`` is ``"auto"`` (given or its kind's default),
    resolved to false: the run uses something planning ahead is not modelled with, and vLLM
    too schedules synchronously where it does not support planning ahead. A value set to true
    is kept, for :func:`_check_async_scheduling` to refuse by name."""
    config = _config_class(ctx, "scheduler", table)
    key = _ahead_key(config)
    if key is None or table.get(key, "auto") != "auto":
        return table
    return {**table, key: False}


#: the scheduler settings that plan batches ahead: vLLM's and SGLang's names
AHEAD_KEYS = ("async_scheduling", "overlap_schedule")


def _ahead_key(config) -> str | None:
    """Which of :data:`AHEAD_KEYS` a scheduler config class has, if any."""
    if config is None or not attrs.has(config):
        return None
    fields = attrs.fields_dict(config)
    return next((key for key in AHEAD_KEYS if key in fields), None)


def _power_model(ctx: Context, tables: dict, seen, kv, where: str):
    """An instance's power model from ``[power]``, built against ``seen``: the cost model as the
    instance's engine sees it (a lockstep rank's :class:`RankCost`, which says what its GPUs did
    in a step). What its factory says of the settings (an :class:`InputWarning`: a clock it does
    not read) is said again of the file and table."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = build_component(ctx, "power_model", tables["power"], where, cost_model=seen,
                                tensor_parallel=tensor_parallel(seen, kv))
    for w in said:
        if issubclass(w.category, InputWarning):
            warnings.warn(f"{where}: {w.message}", w.category, stacklevel=2)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return model


def _clocked(ctx: Context, tables: dict, cost, where: str):
    """The instance's cost model at the SM clock of ``[clock]`` (:mod:`schedlab.energy.clock`)."""
    from ..energy.clock import ClockConfig, ClockedCostModel

    config = from_table(ClockConfig, tables["clock"], where=where)
    # around speculative decoding's wrapper: one clock for the step, chosen from the target's and
    # the drafter's passes together, each pass stretched on its own work (work_parts)
    name, layer = config.gpu, cost
    while name is None and layer is not None:  # the cost model's GPU, through speculative decoding's wrapper
        name = getattr(getattr(layer, "config", None), "gpu", None)
        layer = getattr(layer, "target", None)
    if name is None:
        raise ConfigError(f"{where}: the clock needs the GPU: set gpu = \"...\" (the cost model names none)")
    slo = tables.get("slo") or {}
    try:
        return ClockedCostModel(cost, ctx.presets.gpu(name), config, tpot_ms=slo.get("tpot_ms"))
    except (ConfigError, UnknownPluginError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def _build_router(ctx: Context, table: dict, count: int, where: str, ranks: bool = False):
    """A router over ``count`` instances -- or, ``ranks``, a deployment's ``count`` data-parallel
    ranks (a router that names them by number says so in its messages, ``members``)."""
    router = build_component(ctx, "router", table, where)
    if ranks and hasattr(router, "members"):
        router.members = ("rank", "each deployment has")
    check = getattr(router, "check_cluster", None)  # optional: routers that name instances
    if check is not None:
        try:
            check(count)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return router


def assemble(spec: RunSpec, ctx: Context, where: str, *, check_only: bool = False) -> Assembled:
    """Build every plugin object of a run (also how ``schedlab validate`` checks a file), and
    read its ``[target]`` summary if it has one.

    :param check_only: build one instance's plugins, not one set per instance: every instance
        has the same tables, so one set shows whether they are valid (loading a file then costs
        the same for 1 or 1,024 instances).
    """
    _warn_two_gpus(spec.tables, ctx, where)
    _warn_unknown_classes(spec.tables, ctx, where)
    assembled = _assemble_plugins(spec, ctx, where, check_only)
    if assembled.cluster.partitions > 1:
        _check_partitions(assembled, where)
    _check_async_scheduling(assembled, where)
    _check_queue_limit(assembled, where)
    _check_answer_segments(assembled, where)
    info = getattr(assembled.workload, "info", {})
    replayed = {key: info.get(key) for key in ("max_num_seqs", "num_gpus", "max_num_batched_tokens")}
    _warn_other_run(assembled, replayed, "[workload]", where)
    if "target" not in spec.tables:
        return assembled
    config = from_table(TargetConfig, spec.tables["target"], where=f"{where} [target]", base_dir=ctx.base_dir)
    try:
        target = config.read()
    except (ConfigError, FieldError) as exc:
        raise ConfigError(f"{where} [target]: {exc}") from None
    target = incomparable_left_out(target, spec.tables, f"{where} [target]")
    compared = {"max_num_seqs": target.batch, "num_gpus": target.gpus}
    _warn_other_run(assembled, {k: v for k, v in compared.items() if v != replayed[k]}, "[target]", where)
    return attrs.evolve(assembled, target=target)


def _warn_other_run(a: Assembled, settings: dict, table: str, where: str) -> None:
    """Say when the measured run ``table`` replays or compares with names its ``max_num_seqs``,
    ``num_gpus`` or ``max_num_batched_tokens`` (an ML.ENERGY benchmark's ``settings``) and the
    simulated run has others: its steady state is ``max_num_seqs`` requests running -- split over
    data-parallel ranks or instances, as the benchmark splits it over vLLM's data-parallel
    engines -- its energy is all its GPUs', and each engine's steps hold at most
    ``max_num_batched_tokens`` (vLLM's per-engine budget)."""
    if a.pools is not None:
        return
    parts = a.instances[0]
    # every instance is built alike (validate builds one): data-parallel ranks per deployment
    count = a.cluster.instances * a.parallelism.data_parallel
    gpus = count * a.parallelism.pipeline_parallel * tensor_parallel(parts[1], parts[2])
    if settings.get("num_gpus") is not None and settings["num_gpus"] != gpus:
        warnings.warn(f"{where} {table}: the measured run served on {settings['num_gpus']} GPUs, the simulated one on "
                      f"{gpus}: set tensor_parallel (and [cluster] data_parallel) to its layout -- its energy and "
                      "power are all its GPUs'", InputWarning, stacklevel=3)
    config = getattr(parts[0], "config", None)
    budget, have = settings.get("max_num_batched_tokens"), getattr(config, "max_num_batched_tokens", None)
    if budget is not None and isinstance(have, int) and not isinstance(have, bool) and have != budget:
        warnings.warn(f"{where} {table}: the measured run ran max_num_batched_tokens = {budget} (each engine), the "
                      f"simulated one {have}: set [scheduler] max_num_batched_tokens = {budget} to replay it",
                      InputWarning, stacklevel=3)
    batch = settings.get("max_num_seqs")
    cap = getattr(config, "max_num_seqs", None)
    if batch is None or a.parallelism.pipelined or not isinstance(cap, int) or isinstance(cap, bool):
        return
    if cap * count != batch:
        each = f" ({count} x {cap})" if count > 1 else ""
        fix = (f"set [scheduler] max_num_seqs = {batch} to replay it" if count == 1 else
               f"set [scheduler] max_num_seqs = {batch // count} to replay it ({batch} over its {count} instances)"
               if batch % count == 0 else f"{batch} does not split evenly over its {count} instances")
        warnings.warn(f"{where} {table}: the measured run ran max_num_seqs = {batch}, the simulated one {cap * count}"
                      f"{each}: {fix}", InputWarning, stacklevel=3)


def _settings_of(plugin) -> dict:
    """The settings ``plugin`` was built with (its frozen attrs ``config``), or {} when it keeps
    none that way."""
    config = getattr(plugin, "config", None)
    if config is None or not attrs.has(type(config)):
        return {}
    return {f.name: getattr(config, f.name) for f in attrs.fields(type(config)) if f.init}


def _warn_two_gpus(tables: dict, ctx: Context, where: str) -> None:
    """Say when ``[kv_cache]`` and ``[cost_model]`` name different GPUs or models: the cache is
    then sized for one and the steps timed on another -- most often a sweep or ``--set`` that
    changed one key and not the other. (Allowed: a what-if can want just that.) A cache given its
    ``num_blocks`` (a measured count) is not sized from its GPU: no word about the GPU then."""
    for key, resolve in (("gpu", ctx.presets.gpu), ("model", ctx.presets.model)):
        named = [tables.get(kind, {}).get(key) for kind in ("kv_cache", "cost_model")]
        if not all(isinstance(name, str) for name in named):
            continue
        if key == "gpu" and tables.get("kv_cache", {}).get("num_blocks") is not None:
            continue  # a measured block count: the cache is not sized from the GPU
        try:
            cache, cost = (resolve(name).name for name in named)
        except (ConfigError, KeyError):
            continue  # an unknown name: the component says so
        if cache != cost:
            warnings.warn(f"{where} [kv_cache] {key} = {named[0]!r} but [cost_model] {key} = {named[1]!r}: the cache "
                          f"is sized for one and the steps are timed on the other; name the same {key} in both (a "
                          f"sweep or --set of one changes only that one)", InputWarning, stacklevel=3)
    _warn_two_tensor_parallels(tables, where)
    _warn_two_kv_dtypes(tables, ctx, where)
    _warn_unsized_cache(tables, ctx, where)


def _warn_unsized_cache(tables: dict, ctx: Context, where: str) -> None:
    """Say when ``[cost_model]`` names a model and a GPU while ``[kv_cache]`` names neither a model
    nor a ``num_blocks`` (or is left out): the cache then has the default 16,384 blocks, nothing
    to do with that model on that GPU."""
    cache, cost = tables.get("kv_cache") or {}, tables.get("cost_model") or {}
    if not (isinstance(cost.get("model"), str) and isinstance(cost.get("gpu"), str)):
        return
    if cache.get("model") is not None or cache.get("num_blocks") is not None:
        return
    config = _config_class(ctx, "kv_cache", {**DEFAULT_TABLES["kv_cache"], **cache})
    fields = attrs.fields_dict(config) if config is not None and attrs.has(config) else {}
    if "model" in fields and "num_blocks" in fields:
        warnings.warn(f"{where} [kv_cache] names no model and gpu (nor num_blocks): the cache has the default "
                      f"{fields['num_blocks'].default or 16384} blocks, not a pool sized for [cost_model]'s "
                      f"{cost['model']} on {cost['gpu']}; name them (and tensor_parallel) in [kv_cache] too",
                      InputWarning, stacklevel=3)


def _warn_two_kv_dtypes(tables: dict, ctx: Context, where: str) -> None:
    """Say when ``[kv_cache]`` and ``[cost_model]`` store the KV in different dtypes (``auto``
    where a table leaves it out): the pool then holds one number of tokens and the decodes read
    another's bytes -- or the cost model has no such setting (its attention is measured)."""
    cache, cost = tables.get("kv_cache", {}), tables.get("cost_model", {})
    dtypes = [t.get("kv_cache_dtype", "auto") for t in (cache, cost)]
    if dtypes[0] == dtypes[1] or not all(isinstance(d, str) for d in dtypes):
        return
    config = _config_class(ctx, "cost_model", cost)
    if config is not None and attrs.has(config) and "kv_cache_dtype" not in attrs.fields_dict(config):
        warnings.warn(f"{where} [kv_cache] kv_cache_dtype = {dtypes[0]!r}, but the {cost.get('kind')!r} cost model "
                      "has no kv_cache_dtype: it times attention as it was measured, with the model's own dtype",
                      InputWarning, stacklevel=4)
        return
    warnings.warn(f"{where} [kv_cache] kv_cache_dtype = {dtypes[0]!r} but [cost_model] kv_cache_dtype = "
                  f"{dtypes[1]!r}: the pool holds one dtype's tokens and the decodes read the other's bytes; "
                  "set the same kv_cache_dtype in both", InputWarning, stacklevel=4)


def _workload_classes(ctx: Context, table: dict) -> set[str] | None:
    """The request classes ``table``'s workload gives its requests, where the table alone says:
    a ``mix``'s classes (each its ``request_class``, else its name), or a workload whose every
    request takes its config's ``request_class``; None where rows of a file may carry their own."""
    if table.get("kind") == "mix":
        subs = table.get("classes")
        if not isinstance(subs, dict) or not all(isinstance(sub, dict) for sub in subs.values()):
            return None
        names = {sub.get("request_class", name) for name, sub in subs.items()}
        return names if all(isinstance(name, str) for name in names) else None
    config = _config_class(ctx, "workload", table)
    if config is None or not attrs.has(config) or "request_class" not in attrs.fields_dict(config):
        return None
    if table.get("path") is not None:
        return None  # a file's rows may name theirs
    value = table.get("request_class", attrs.fields_dict(config)["request_class"].default)
    return {value} if isinstance(value, str) else None


def _warn_unknown_classes(tables: dict, ctx: Context, where: str) -> None:
    """Say when ``[slo] classes``, ``[client] classes`` or a ``class`` router names a request
    class no request of the workload has -- most often a misspelt name, whose targets,
    timeouts or instances then apply to nobody (the router sends its requests to the default
    instances). Only where the workload's classes are known from its table."""
    workload = tables.get("workload")
    known = _workload_classes(ctx, workload) if isinstance(workload, dict) else None
    if not known:
        return
    router = (tables.get("cluster") or {}).get("router")
    places = [("[slo] classes", (tables.get("slo") or {}).get("classes")),
              ("[client] classes", (tables.get("client") or {}).get("classes")),
              ("[cluster] router classes", router.get("classes") if isinstance(router, dict)
               and router.get("kind") == "class" else None)]
    for place, named in places:
        if not isinstance(named, dict):
            continue
        for name in named:
            if name not in known:
                close = difflib.get_close_matches(str(name), sorted(known), n=1)
                warnings.warn(f"{where} {place}: {name!r} is the class of no request of the workload (its classes: "
                              f"{', '.join(sorted(known))})" + (f"; did you mean {close[0]!r}?" if close else ""),
                              InputWarning, stacklevel=4)


def _warn_two_tensor_parallels(tables: dict, where: str) -> None:
    """Say when a ``[kv_cache]`` sized from its model and GPU and a ``[cost_model]`` naming a
    model split it over different ``tensor_parallel`` (1 where a table leaves it out): the pool
    is then one rank's of one layout and the steps another's -- a TP-2 cost model over a TP-1
    pool has half the KV it should."""
    cache, cost = tables.get("kv_cache", {}), tables.get("cost_model", {})
    if not (isinstance(cache.get("model"), str) and isinstance(cost.get("model"), str)):
        return
    if cache.get("num_blocks") is not None:
        return  # a measured block count: the cache is not sized from its layout
    ranks = [t.get("tensor_parallel", 1) for t in (cache, cost)]
    if all(isinstance(r, int) for r in ranks) and ranks[0] != ranks[1]:
        warnings.warn(f"{where} [kv_cache] tensor_parallel = {ranks[0]} but [cost_model] tensor_parallel = "
                      f"{ranks[1]}: the pool is sized for one layout and the steps are timed on the other; set "
                      "the same tensor_parallel in both", InputWarning, stacklevel=4)


def _check_async_scheduling(a: Assembled, where: str) -> None:
    """Asynchronous scheduling (:mod:`schedlab.engine.ahead`) is modelled for colocated
    instances and data-parallel ranks, with vLLM's speculation too: refuse the rest by name."""
    planning = [parts[0] for parts in a.instances if plans_ahead(parts[0])]
    if not planning:
        return
    # (a preset building another scheduler names its own setting: trtllm's overlap_schedule)
    key = getattr(planning[0], "ahead_key", None) or _ahead_key(type(getattr(planning[0], "config", None)))
    what = _unmodelled_ahead(a.speculative, a.parallelism, a.pools is not None, key)
    if what is not None:
        key = key or "async_scheduling"
        raise ConfigError(f"{where} [scheduler]: {key}: not modelled with {what}; "
                          f"set {key} = false (or \"auto\", which turns it off there)")


def _check_queue_limit(a: Assembled, where: str) -> None:
    """A scheduler's queue limit and timeouts (``max_queued_requests``, ``waiting_timeout_ms``,
    ``running_timeout_ms``: SGLang's) are modelled on colocated instances and data-parallel
    ranks: refuse the rest by name."""
    for key in ("max_queued_requests", "waiting_timeout_ms", "running_timeout_ms"):
        if not any(getattr(getattr(parts[0], "config", None), key, 0) for parts in a.instances):
            continue
        if a.pools is not None:
            raise ConfigError(f"{where} [scheduler]: {key}: not modelled with [cluster] disaggregated pools (SGLang "
                              "keeps other queues there)")
        if a.parallelism.pipelined:
            raise ConfigError(f"{where} [scheduler]: {key}: not modelled with [cluster] pipeline_parallel")


def _check_answer_segments(a: Assembled, where: str) -> None:
    """A scheduler that serves answers a segment at a time (TGI's ``generation_segment``,
    ``Scheduler.answer_segment``) requeues each at the segment's end, which is not modelled on a
    pipeline (a batch in flight holds it): refused by name when built, not mid-run."""
    if not a.parallelism.pipelined:
        return
    for parts in a.instances:
        segment = getattr(parts[0], "answer_segment", 0) or 0
        if segment:
            key = "generation_segment" if hasattr(getattr(parts[0], "config", None), "generation_segment") \
                else "answer_segment"
            raise ConfigError(f"{where} [scheduler]: {key} = {segment}: an answer longer than that is requeued, "
                              f"which is not modelled with [cluster] pipeline_parallel = "
                              f"{a.parallelism.pipeline_parallel}; set {key} = 0 (whole answers) or run without "
                              "pipeline_parallel (TGI's launcher has no pipeline parallelism)")


def _warn_slo_in_seconds(slo: SloConfig | None, where: str) -> None:
    """Say when an ``[slo]`` target is under 1 ms: no engine step is that short, so no request
    meets it and attainment is 0 -- most often a target typed in seconds (0.5 for 500 ms)."""
    if slo is None:
        return
    targets = [(key, getattr(slo, key)) for key in ("ttft_ms", "tpot_ms")]
    targets += [(f"classes.{name}.{key}", value) for name, table in slo.classes.items() for key, value in table.items()]
    for key, value in targets:
        if value < 1:
            warnings.warn(f"{where} [slo] {key} = {value!r}: targets are in milliseconds and no request meets one "
                          f"under 1 ms; for {value!r} s write {key.rsplit('.', 1)[-1]} = {value * 1000:g}",
                          InputWarning, stacklevel=4)


def _assemble_plugins(spec: RunSpec, ctx: Context, where: str, check_only: bool) -> Assembled:
    tables = _tables_with_defaults(spec.tables, ctx)
    if "workload" not in tables:
        raise ConfigError(f"{where.rstrip(':')}: no [workload] table; registered workloads: "
                          f"{', '.join(ctx.catalog['workload'].names())}")
    if spec.engine not in ENGINES:
        raise ConfigError(f"{where.rstrip(':')}: engine must be one of {', '.join(ENGINES)}, got {spec.engine!r}")
    cluster_table = tables.get("cluster", {})
    cluster = from_table(ClusterConfig, cluster_table, where=f"{where} [cluster]")
    slo = from_table(SloConfig, tables["slo"], where=f"{where} [slo]") if "slo" in tables else None
    _warn_slo_in_seconds(slo, where)
    speculative = (from_table(SpeculativeConfig, tables["speculative"], where=f"{where} [speculative]",
                              base_dir=ctx.base_dir) if "speculative" in tables else None)
    workload = build_component(ctx, "workload", tables["workload"], f"{where} [workload]")
    client_side = _client_side(tables, where)
    if cluster.autoscaler is not None and cluster.mode == "disaggregated":
        raise ConfigError(f"{where} [cluster.autoscaler]: a disaggregated cluster scales each pool on its own: give "
                          "[cluster.prefill] or [cluster.decode] an autoscaler = {kind = ...} instead")
    if cluster.mode == "disaggregated":
        if "instances" in cluster_table:
            raise ConfigError(f"{where} [cluster]: instances: a disaggregated cluster sizes its pools in "
                              "[cluster.prefill] and [cluster.decode]")
        assembled = _assemble_disaggregated(ctx, tables, cluster, workload, slo, speculative, where, check_only)
        return attrs.evolve(assembled, client_side=client_side)
    parallelism = cluster.parallelism
    if parallelism != SINGLE:
        assembled = _assemble_parallel(ctx, tables, cluster, cluster_table, workload, slo, speculative, where,
                                       check_only, instances_from=_instances_from(spec))
        return attrs.evolve(assembled, client_side=client_side)
    power = [] if "power" in tables else None
    parts = _build_instances(ctx, tables, 1 if check_only else cluster.instances, where, "", speculative, power)
    router = None
    if cluster.instances > 1:
        router = _build_router(ctx, cluster.router, cluster.instances, f"{where} [cluster.router]")
    else:  # no router runs, but its table is checked: a plan or sweep may give the run more instances
        component_config(ctx, "router", cluster.router, f"{where} [cluster.router]")
    return Assembled(workload, parts, router, cluster, slo, speculative, power=power, client_side=client_side,
                     autoscaler=_cluster_autoscaler(ctx, cluster, workload, where, _instances_from(spec), router, slo))


def _instances_from(spec: RunSpec) -> str:
    """What set the run's ``[cluster] instances`` when not its table, for messages: a sweep's or
    search's point; "" for the table's own value. (A capacity plan refuses ``min_instances`` < 2
    with an autoscaler when it is read: :func:`schedlab.study.planner.validate`.)"""
    return "this point's cluster.instances" if "cluster.instances" in spec.point else ""


def _client_side(tables: dict, where: str) -> ClientSide | None:
    """The run's ``[frontend]`` and ``[client]`` tables (None without either): see :mod:`schedlab.frontend`."""
    if "frontend" not in tables and "client" not in tables:
        return None
    frontend = (from_table(FrontendConfig, tables["frontend"], where=f"{where} [frontend]")
                if "frontend" in tables else None)
    client = from_table(ClientConfig, tables["client"], where=f"{where} [client]") if "client" in tables else None
    if client is not None and client.gives_up:
        network = frontend.network_ms if frontend is not None else 0.0
        timeouts = [("timeout_ms", client.timeout_ms)] + [(f"classes.{name}.timeout_ms", t["timeout_ms"])
                                                          for name, t in client.classes.items() if "timeout_ms" in t]
        for key, value in timeouts:
            if not value > network:
                raise ConfigError(f"{where} [client]: {key}: must be longer than the network hop ([frontend] "
                                  f"network_ms = {network:g}), got {value:g}")
    return ClientSide(frontend, client)


def _assemble_parallel(ctx: Context, tables: dict, cluster: ClusterConfig, cluster_table: dict, workload, slo,
                       speculative, where: str, check_only: bool, instances_from: str = "") -> Assembled:
    """Data-parallel ranks (one instance each, stepping together for a MoE model) or pipelined
    instances; the plugins get the layout (:class:`~schedlab.parallelism.Parallelism`)."""
    parallelism = cluster.parallelism
    if parallelism.data_parallel > 1 and speculative is not None and speculative.k_by_batch_size:
        raise ConfigError(f"{where} [speculative]: k_by_batch_size: vLLM 0.33 turns drafts per batch size off with "
                          "data parallelism (ranks picking different k would diverge): leave it out, and every "
                          "rank drafts num_speculative_tokens, as vLLM's do")
    # data_parallel: [cluster] instances counts deployments of data_parallel ranks each
    deployments = cluster.instances if parallelism.lockstep else 1
    count = parallelism.data_parallel * deployments if parallelism.lockstep else cluster.instances
    parts = _build_instances(ctx, tables, 1 if check_only else count, where, "", speculative, parallelism=parallelism)
    cost = parts[0][1]
    lockstep = False
    if parallelism.lockstep:
        rank_ms, experts_ms = getattr(cost, "rank_ms", None), getattr(cost, "experts_ms", None)
        if not (callable(rank_ms) and callable(experts_ms)):
            raise ConfigError(f"{where} [cost_model]: {_cost_name(cost)} does not time data-parallel ranks "
                              "(it needs rank_ms and experts_ms, see schedlab.protocols); the roofline and "
                              "profiled cost models do")
        lockstep = experts_ms((1,) * parallelism.data_parallel) is not None
        if not lockstep and parallelism.expert_parallel:
            raise ConfigError(f"{where} [cluster]: expert_parallel: the model has no routed experts")
        if not lockstep:  # a dense model's ranks are independent instances: deployments are just more of them
            if cluster.rank_router is not None:
                raise ConfigError(f"{where} [cluster]: rank_router: a dense model's data-parallel ranks do not step "
                                  f"together: its {count} ranks are independent instances behind [cluster] router")
            if cluster.autoscaler is not None:
                raise ConfigError(f"{where} [cluster.autoscaler]: autoscaling a dense model's data-parallel ranks "
                                  "(independent instances) is not modelled: leave out data_parallel and scale "
                                  "instances, or use a MoE model, whose deployments scale")
            if cluster.dp_sync_interval is not None or not cluster.dp_sync_first_step:
                key = "dp_sync_interval" if cluster.dp_sync_interval is not None else "dp_sync_first_step"
                raise ConfigError(f"{where} [cluster]: {key}: paces data-parallel ranks stepping together, and a "
                                  f"dense model's {count} ranks are independent instances: leave it out")
        for table in ("clock", "power"):  # the clock times a step's parts, as power models meter them, by their work
            if lockstep and tables.get(table) is not None:
                _check_rank_work(cost, f"{where} [{table}]")
    if parallelism.pipelined:
        if not callable(getattr(cost, "pipeline_ms", None)):
            raise ConfigError(f"{where} [cost_model]: {_cost_name(cost)} does not time pipeline stages (it needs "
                              "pipeline_ms, see schedlab.protocols); the roofline and profiled cost models do")
        for table in ("clock", "power"):  # the clock times a stage's slice, as power models meter it, by its work
            if tables.get(table) is not None:
                _check_stage_work(cost, f"{where} [{table}]")
    # lockstep ranks and pipelined instances are timed by their cluster, not alone
    views = None
    if lockstep:
        views = [rank_view(c) for _, c, _ in parts]
    elif parallelism.pipelined:
        views = [stage_view(c) for _, c, _ in parts]
    power = None
    if "power" in tables:
        power = [_power_model(ctx, tables, views[i] if views is not None else c, kv, f"{where} [power]")
                 for i, (_, c, kv) in enumerate(parts)]
    router = rank_routers = None
    by_engine = _rank_router(ctx, tables, where)  # the default rank router: the scheduler's engine's
    if lockstep and deployments > 1:
        router = _build_router(ctx, cluster.router, deployments, f"{where} [cluster.router]")
        table = cluster.rank_router or by_engine
        rank_routers = [_build_router(ctx, table, parallelism.data_parallel, f"{where} [cluster.rank_router]", ranks=True)
                        for _ in range(1 if check_only else deployments)]
    elif lockstep:  # one deployment: router picks the rank, as rank_router would
        if cluster.rank_router is not None and "router" in cluster_table:
            raise ConfigError(f"{where} [cluster]: rank_router: one deployment's router is the rank's: give router "
                              "or rank_router, not both (or instances > 1, whose router picks the deployment)")
        key = "router" if "router" in cluster_table or cluster.rank_router is None else "rank_router"
        table = getattr(cluster, key) if key in cluster_table else by_engine
        router = _build_router(ctx, table, count, f"{where} [cluster.{key}]")
    elif count > 1:
        table = cluster.router if "router" in cluster_table or not parallelism.lockstep else by_engine
        router = _build_router(ctx, table, count, f"{where} [cluster.router]")
    dp_sync = (1, False)
    if lockstep:
        interval = cluster.dp_sync_interval or _engine_default(ctx, tables, "dp_sync_interval", int, where) \
            or VLLM_DP_SYNC_INTERVAL
        dp_sync = (interval, cluster.dp_sync_first_step)
    return Assembled(workload, parts, router, cluster, slo, speculative, parallelism=parallelism, lockstep=lockstep,
                     power=power, views=views, dp_sync=dp_sync,
                     autoscaler=_cluster_autoscaler(ctx, cluster, workload, where, instances_from, router, slo),
                     deployments=deployments if lockstep else 1, rank_routers=rank_routers)


#: vLLM 0.33's ``dp_sync_interval``: its DP ranks check every 16 steps that none has work
VLLM_DP_SYNC_INTERVAL = 16


def _rank_router(ctx: Context, tables: dict, where: str) -> dict:
    """The router table that picks a data-parallel rank where ``[cluster]`` names none: the one
    the scheduler's engine dispatches with (an optional ``rank_router_kind`` on its config class:
    SGLang's controller, round robin), else vLLM's DP load balancer (``vllm_dp``)."""
    return {"kind": _engine_default(ctx, tables, "rank_router_kind", str, where) or "vllm_dp"}


def _engine_default(ctx: Context, tables: dict, name: str, kind: type, where: str):
    """An optional class attribute ``name`` of the scheduler's config class: a default of its
    engine's for a ``[cluster]`` setting (SGLang's ``rank_router_kind``, ``dp_sync_interval``),
    None without one."""
    config = _config_class(ctx, "scheduler", tables["scheduler"])
    value = getattr(config, name, None)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        # (an attrs field of that name: a member_descriptor)
        entry = ctx.catalog["scheduler"].get(tables["scheduler"]["kind"])
        example, what = ('"round_robin"', "a router's name") if kind is str else ("1", "a whole number")
        raise ConfigError(f"{where} [scheduler]: {entry_label(entry)}: {config.__qualname__}.{name} is "
                          f"{type(value).__name__}, not {what}: "
                          f"declare it a class attribute ({name}: ClassVar[{kind.__name__}] = {example}), not a field "
                          "of the config")
    return value


def _cost_name(cost) -> str:
    """The name of the ``[cost_model]`` kind's class, the clock's and speculative decoding's wrappers
    looked through."""
    if clocked(cost):
        cost = cost.inner
    return type(cost.target if isinstance(cost, DraftingCostModel) else cost).__name__


def _check_rank_work(cost, where: str) -> None:
    """Metering or clocking lockstep ranks needs the cost model to split a step's work as it
    splits its time: a rank's own part and its GPUs' share of every rank's experts (``where``
    names the table that needs it)."""
    if not (callable(getattr(cost, "rank_work", None)) and callable(getattr(cost, "experts_work", None))):
        _refuse_unsaid_work(cost, where, "the work of data-parallel ranks stepping together (it needs rank_work "
                                         "and experts_work")


def _check_stage_work(cost, where: str) -> None:
    """Metering or clocking pipelined instances needs the cost model to split a batch's work
    over the stages as it splits its time, the drafter's passes on the last stage with
    speculative decoding (``where`` names the table that needs it)."""
    if not callable(getattr(cost, "stage_work", None)):
        _refuse_unsaid_work(cost, where, "the work of each pipeline stage (it needs stage_work")


def _refuse_unsaid_work(cost, where: str, what: str) -> None:
    """Raise the ConfigError of a layout whose work ``cost`` does not say: the drafter's, naming
    its cost model, when speculative decoding's drafter is what says none."""
    why = getattr(cost.inner if clocked(cost) else cost, "unsaid_work", None)
    if why:
        raise ConfigError(f"{where}: {why}")
    raise ConfigError(f"{where}: {_cost_name(cost)} does not say {what}, see schedlab.protocols); the roofline and "
                      "profiled cost models do")


def _cluster_autoscaler(ctx: Context, cluster: ClusterConfig, workload, where: str, instances_from: str = "",
                        router=None, slo=None):
    """``[cluster] autoscaler``'s policy, checked against the instances built and the ``router``
    in front of them (None without one; ``instances_from``: what set them, when not the table,
    :func:`_instances_from`); ``slo``: the run's ``[slo]``, None without one."""
    if cluster.autoscaler is None:
        return None
    autoscaler = build_component(ctx, "autoscaler", cluster.autoscaler, f"{where} [cluster.autoscaler]")
    _check_autoscaler(autoscaler, cluster.instances, "[cluster] instances", workload, cluster.partitions,
                      f"{where} [cluster.autoscaler]", instances_from)
    _check_router_scales(router, "[cluster.router]", cluster.router, f"{where} [cluster.autoscaler]")
    _warn_attainment_without_slo(autoscaler, slo, f"{where} [cluster.autoscaler]")
    return autoscaler


def _check_router_scales(router, key: str, table: dict | None, where: str) -> None:
    """Refuse an autoscaler (``where``: its table) behind a router whose settings name instances
    by number (its optional ``names_instances``: the ``class`` router's lists; ``key`` and
    ``table``: the router's table): the router chooses among the serving instances, a list that
    changes and is renumbered as instances come and go, so those numbers would name other
    instances, or none (the run failed mid-way, at the first request after a scale-down)."""
    if router is None or not getattr(router, "names_instances", False):
        return
    kind = table.get("kind") if isinstance(table, dict) else None
    named = f"{key} kind = {kind!r}" if isinstance(kind, str) else f"{key} ({type(router).__name__})"
    raise ConfigError(f"{where}: not with {named}: its settings name instances by number, and an autoscaler "
                      "changes which instances serve (the router chooses among the serving ones, renumbered as "
                      "they come and go); use a router that chooses by load or by request (least_outstanding, "
                      "prefix_affinity, round_robin, ...), or a fixed cluster")


def _warn_attainment_without_slo(policy, slo, where: str) -> None:
    """Say when an autoscaler (``where``: its table) has an SLO guard (``min_attainment``) but the
    run no ``[slo]``: the window's attainment is then NaN and the guard never acts (as the
    planner says of an attainment frontier without targets)."""
    attainment = getattr(getattr(policy, "config", None), "min_attainment", None)
    if attainment is None or slo is not None:
        return
    warnings.warn(f"{where}: min_attainment = {attainment!r} needs [slo] targets, which the run has not: without "
                  "them no request is judged and the guard never adds an instance; add [slo] (e.g. ttft_ms = 500, "
                  "tpot_ms = 50) or leave out min_attainment", InputWarning, stacklevel=5)


def _check_autoscaler(policy, instances: int, key: str, workload, partitions: int, where: str,
                      instances_from: str = "") -> None:
    """An autoscaler's limits against the ``instances`` built (``key``: where they are set, for
    the message; ``instances_from``: what set them instead, a plan or a sweep's point), and what it
    cannot scale."""
    config = getattr(policy, "config", None)
    missing = [k for k in ("min_instances", "max_instances", "initial", "interval_s", "cold_start_s", "window_s")
               if not hasattr(config, k)]
    if missing:
        raise ConfigError(f"{where}: the policy's config lacks {', '.join(missing)} (subclass "
                          "schedlab_plugins.autoscalers.ScalingConfig)")
    most = config.max_instances or instances
    if instances < 2 and instances_from:
        raise ConfigError(f"{where}: autoscaling needs at least 2 instances (the most that can serve), but "
                          f"{instances_from} is {instances}: sweep or search it from 2")
    if instances < 2:
        raise ConfigError(f"{where}: autoscaling needs {key} >= 2 (the most that can serve)")
    source = instances_from or key  # what set the instances built, for the messages
    if most != instances:
        raise ConfigError(f"{where}: max_instances ({most}) must equal {source} ({instances}), the instances built")
    for name in ("min_instances", "initial"):
        value = getattr(config, name) or 0
        if value > most:
            raise ConfigError(f"{where}: {name} ({value}) is above {source} ({most}), the most instances that can "
                              "serve")
    if getattr(workload, "closed_loop", False) or partitions > 1:
        raise ConfigError(f"{where}: autoscaling needs an open-loop workload and partitions = 1")


def scaling_limits(config, instances: int) -> ScalingLimits:
    most = config.max_instances or instances
    drain = getattr(config, "drain_timeout_s", None)  # (a config not subclassing ScalingConfig may lack it)
    return ScalingLimits(config.min_instances, most, config.initial or config.min_instances, config.interval_s * 1e3,
                         config.cold_start_s * 1e3, config.window_s * 1e3,
                         drain_timeout_ms=None if drain is None else drain * 1e3)


def _drafting(ctx: Context, config: SpeculativeConfig, cost, where: str, target: dict) -> DraftingCostModel:
    """The instance's cost model with the drafter's passes added (speculative decoding)."""
    at = f"{where} [speculative.draft]"
    drafter = (build_component(ctx, "cost_model", _drafter_table(ctx, config, target, at), at)
               if config.draft is not None else None)
    if config.method == "draft_model" and drafter is not None:   # (vLLM: a draft model shares the target's vocabulary)
        ours, theirs = (getattr(getattr(c, "model", None), "vocab_size", None) for c in (cost, drafter))
        if ours and theirs and ours != theirs:
            raise ConfigError(f"{at}: the draft model's vocabulary ({theirs:,} tokens) is not the target's "
                              f"({ours:,}): its drafts would be other tokens; vLLM refuses such a pair")
    return DraftingCostModel(cost, drafter, config)


def _gpu_name(ctx: Context, name):
    """A GPU named as the presets know it ("A100-80GB" is "a100-80gb"), or the name as given."""
    try:
        return ctx.presets.gpu(name).name
    except (ConfigError, KeyError, TypeError, AttributeError):
        return name


def _drafter_table(ctx: Context, config: SpeculativeConfig, target: dict, where: str) -> dict:
    """The drafter's cost-model table on the target's GPUs, as vLLM runs it: the target's ``gpu``
    and ``tensor_parallel`` where the table leaves them out (``_verify_and_get_draft_tp``: the
    draft's TP defaults to the target's); another GPU, or a TP neither 1 nor the target's (a draft
    model's: only the target's, ``_raise_if_draft_tp_mismatch``), refused."""
    table = dict(config.draft)
    try:
        entry = ctx.catalog["cost_model"].get(table.get("kind"))
    except UnknownPluginError:
        return table   # (said, with the registered names, when it is built)
    fields = attrs.fields_dict(entry.config) if entry.config is not None and attrs.has(entry.config) else {}
    gpu, tp = target.get("gpu"), target.get("tensor_parallel", 1)
    if gpu is not None and "gpu" in fields:
        if "gpu" not in table:
            table["gpu"] = gpu
        elif _gpu_name(ctx, table["gpu"]) != _gpu_name(ctx, gpu):
            raise ConfigError(f"{where}: gpu = {table['gpu']!r}, but the target runs on {gpu!r}: the drafter runs on "
                              "the target's GPUs (leave gpu out)")
    if isinstance(tp, int) and "tensor_parallel" in fields:
        if "tensor_parallel" not in table:
            table["tensor_parallel"] = tp
        elif table["tensor_parallel"] != tp and (table["tensor_parallel"] != 1 or config.method == "draft_model"):
            allowed = f"{tp}, the target's" if config.method == "draft_model" else f"1 or {tp}, the target's"
            raise ConfigError(f"{where}: tensor_parallel = {table['tensor_parallel']!r}: vLLM runs a "
                              f"{config.method.replace('_', ' ')}'s drafter at {allowed} (leave it out for the "
                              "target's)")
    return table


#: the tables a pool of a disaggregated cluster may override
POOL_TABLES = ("scheduler", "cost_model", "kv_cache", "power", "clock")


def _assemble_disaggregated(ctx: Context, tables: dict, cluster: ClusterConfig, workload, slo, speculative,
                            where: str, check_only: bool = False) -> Assembled:
    """A prefill pool and a decode pool, each with the run's plugin tables overridden by its own
    (with ``check_only``, one instance of each)."""
    pools = []
    power = [] if "power" in tables else None
    models: dict[str, str] = {}  # pool -> the model its cost model times
    kv_models: dict[str, str] = {}  # pool -> the model its KV cache holds
    dtypes: dict[str, tuple] = {}  # pool -> how its KV cache stores K and V: (kv_cache_dtype, bytes)
    for name in POOLS:
        pool_where = f"{where} [cluster.{name}]"
        pool = from_table(PoolConfig, getattr(cluster, name) or {}, where=pool_where)
        pool_tables = dict(tables)
        for kind in POOL_TABLES:
            own = getattr(pool, kind)
            if own:
                if kind == "power" and kind not in tables:  # every instance is metered, or none
                    raise ConfigError(f"{pool_where}: power: the run has no [power] table for the pool to override")
                pool_tables[kind] = merge_tables({kind: tables.get(kind, {})}, {kind: own}, where=pool_where)[kind]
        if pool.cost_model or pool.kv_cache:  # (the run's own tables were warned about already)
            _warn_two_gpus(pool_tables, ctx, pool_where)
        _check_one_model(ctx, models, name, pool_tables.get("cost_model") or {}, pool_where)
        _check_one_model(ctx, kv_models, name, pool_tables.get("kv_cache") or {}, pool_where, "kv_cache")
        _check_one_kv_dtype(ctx, dtypes, name, pool_tables.get("kv_cache") or {}, pool_where)
        labels = {kind: f"cluster.{name}." for kind in POOL_TABLES if getattr(pool, kind)}  # (else the run's table)
        parts = _build_instances(ctx, pool_tables, 1 if check_only else pool.instances, where, labels,
                                 speculative, power, disaggregated=True)
        router = None
        if pool.instances > 1:
            router = _build_router(ctx, pool.router if pool.router is not None else cluster.router,
                                   pool.instances, f"{where} [cluster.{name}.router]")
        autoscaler = None
        if pool.autoscaler is not None:
            autoscaler = build_component(ctx, "autoscaler", pool.autoscaler, f"{where} [cluster.{name}.autoscaler]")
            _check_autoscaler(autoscaler, pool.instances, f"[cluster.{name}] instances", workload, cluster.partitions,
                              f"{where} [cluster.{name}.autoscaler]")
            if getattr(autoscaler.config, "drain_timeout_s", None) is not None:
                raise ConfigError(f"{where} [cluster.{name}.autoscaler]: drain_timeout_s: not modelled for a "
                                  "disaggregated pool (a draining prefill instance holds KV the decode pool has yet "
                                  "to pull); leave it out: a draining instance then finishes what it holds")
            own = pool.router is not None
            _check_router_scales(router, f"[cluster.{name}.router]" if own else "[cluster.router]",
                                 pool.router if own else cluster.router, f"{where} [cluster.{name}.autoscaler]")
            _warn_attainment_without_slo(autoscaler, slo, f"{where} [cluster.{name}.autoscaler]")
        pools.append(Pool(name, parts, router, autoscaler))
    link = from_table(LinkConfig, cluster.link or {}, where=f"{where} [cluster.link]")
    if link.bandwidth_gbps != math.inf:
        for pool in pools:
            kv = pool.instances[0][2]
            if not kv_bytes_per_token(kv)[0]:
                raise ConfigError(
                    f"{where} [cluster.{pool.name}.kv_cache]: the KV link needs the bytes of a block to time "
                    "transfers: size the cache from model and gpu, or set bytes_per_block "
                    "(or give [cluster.link] bandwidth_gbps = inf)")
    return Assembled(workload, [p for pool in pools for p in pool.instances], None, cluster, slo, speculative,
                     pools, link, power)


def _check_one_model(ctx: Context, models: dict, pool: str, cost: dict, where: str, table: str = "cost_model") -> None:
    """Refuse pools whose cost models time different models, or whose KV caches hold different
    ones (``table``): the decode pool continues the prompts the prefill pool computed, with their
    KV (a Llama prefill fed a Qwen decode pool; vLLM's NIXL handshake refuses such a peer)."""
    name = cost.get("model")
    if not isinstance(name, str):
        return
    try:
        models[pool] = ctx.presets.model(name).name
    except (ConfigError, KeyError):
        return  # an unknown name: the cost model says so
    other = next((p for p in models if p != pool), None)
    if other is not None and models[other] != models[pool]:
        raise ConfigError(f"{where} {table}: model = {name!r}, but [cluster.{other}] serves {models[other]!r}: the "
                          f"decode pool continues the prefill pool's prompts with their KV, so both serve one model")


def _check_one_kv_dtype(ctx: Context, dtypes: dict, pool: str, kv: dict, where: str) -> None:
    """Refuse pools whose KV caches store K and V differently (``kv_cache_dtype`` fp8 in one, the
    model's 16 bits in the other): vLLM's NIXL connector puts the cache dtype in the handshake's
    compatibility hash and refuses the transfer (``nixl/metadata.py``)."""
    name = kv.get("kv_cache_dtype", "auto")
    size = KV_CACHE_DTYPES.get(name) if isinstance(name, str) else None
    if name == "auto" and isinstance(kv.get("model"), str) and _known_model(ctx, kv["model"]):
        size = ctx.presets.model(kv["model"]).kv_element_bytes
    if size is None:
        return  # (a bad name: the cache says so; a model not named: nothing to compare)
    dtypes[pool] = (name, size)
    other = next((p for p in dtypes if p != pool), None)
    if other is None:
        return
    (a, a_size), (b, b_size) = dtypes[other], dtypes[pool]
    if a_size != b_size or (a != b and "auto" not in (a, b) and a_size == 1):
        raise ConfigError(f"{where} kv_cache: kv_cache_dtype = {b!r} ({b_size} byte{'s' if b_size > 1 else ''} an "
                          f"element), but [cluster.{other}] keeps its KV as {a!r} ({a_size}): vLLM's NIXL connector "
                          "refuses to move KV between caches of different dtypes; set the same kv_cache_dtype in both "
                          "pools")


def _meters(a: Assembled, seen: list) -> list:
    """Each instance's energy meter (Nones without ``[power]``): a pipelined instance's meters its
    stages apart (:mod:`schedlab.energy.pipeline`)."""
    if a.power is None:
        return [None] * len(a.instances)
    stages = a.parallelism.pipeline_parallel
    if stages > 1:
        return [PipelineMeter(p, view, stages) for p, view in zip(a.power, seen)]
    return [EnergyMeter(p) for p in a.power]


def run(spec: RunSpec, ctx: Context, *, where: str | None = None, observer: Callable | None = None,
        timeline: bool = True, record: RecordSettings | None = None) -> RunResult:
    """Simulate one run and compute its metrics (``record``: how its per-request results are kept)."""
    where = where or f"{ctx.source}: run {spec.name!r}"
    if observer is not None and spec.engine == "reference":  # (it ran unobserved: an observer's checks passed)
        raise ConfigError(f"{where}: the reference engine does not call the per-iteration hook (schedlab_iteration) "
                          "a plugin implements, or an observer; observe the fast engine (engine = \"fast\")")
    a = assemble(spec, ctx, where)
    side = a.client_side
    recorder = make_recorder(record or RecordSettings(), a, timeline)
    speculation = Speculation(a.speculative, spec.seed) if a.speculative is not None else None
    # what each engine sees of its cost model (a RankCost for lockstep ranks, a StageCost for pipelined instances)
    seen = a.views if a.views is not None else [c for _, c, _ in a.instances]
    started = time.perf_counter()
    started_cpu = time.process_time()
    router, indices = a.router, list(range(len(a.instances)))
    try:
        meters = _meters(a, seen)
        kind = spec.tables["workload"].get("kind")
        requests = checked_requests(a.workload.requests(spec.seed), f"workload {kind!r}")
        if spec.part:
            router, indices, requests = _part_of_run(spec, a, requests, where)
        requests = delivered = _Counted(requests)
        lockstep = scaling = None
        if spec.engine == "reference":
            engines = [ReferenceEngine(s, seen[i], k, recorder, index=i, speculation=speculation, meter=meters[i])
                       for i, (s, _, k) in ((i, a.instances[i]) for i in indices)]
        else:
            engines = [Instance(i, s, seen[i], k, recorder, observer=observer, speculation=speculation,
                                meter=meters[i]) for i, (s, _, k) in ((i, a.instances[i]) for i in indices)]
        if a.parallelism.pipelined:
            stages = a.parallelism.pipeline_parallel
            wrapper = ReferencePipeline if spec.engine == "reference" else PipelinedInstance
            pipes = [wrapper(e, stages) for e in engines]
            scaling = _scaling(a, pipes, [meters[i] for i in indices], recorder)
            _serve(spec, a, requests, pipes, a.router, ReferencePipelineCluster, scaling)
        elif a.lockstep and a.deployments > 1:
            size = a.parallelism.data_parallel
            wrapper = ReferenceDataParallel if spec.engine == "reference" else DataParallelCluster
            lockstep = [wrapper(engines[d * size:(d + 1) * size], a.rank_routers[d], index=d, sync=a.dp_sync)
                        for d in range(a.deployments)]
            scaling = _scaling(a, lockstep, [meters[i] for i in indices], recorder)
            _serve(spec, a, requests, lockstep, a.router, ReferenceDeployments, scaling)
        elif a.lockstep:
            if spec.engine == "reference":
                lockstep = ReferenceDataParallel(engines, a.router, client_side=side, sync=a.dp_sync)
                lockstep.run(requests, workload=a.workload)
            else:
                lockstep = DataParallelCluster(engines, a.router, sync=a.dp_sync)
                simulate_data_parallel(requests, lockstep, workload=a.workload, client_side=side)
        elif a.pools is not None:
            split = len(a.pools[0].instances)
            link = dict(bandwidth_gbps=a.link.bandwidth_gbps, latency_ms=a.link.latency_us / 1e3,
                        kv_lease_ms=a.link.kv_lease_ms, first_token=a.cluster.first_token or FIRST_TOKEN[0],
                        prefill_hears_disconnect=a.cluster.prefill_hears_disconnect is not False)
            scaling = _pool_scaling(a, engines[:split], engines[split:], meters)
            if scaling is not None:
                recorder.listener = scaling.finished
            if spec.engine == "reference":
                DisaggregatedReference(engines[:split], engines[split:], prefill_router=a.pools[0].router,
                                       decode_router=a.pools[1].router, client_side=side, scaling=scaling,
                                       **link).run(requests, workload=a.workload)
            else:
                cluster = DisaggregatedCluster(engines[:split], engines[split:], prefill_router=a.pools[0].router,
                                               decode_router=a.pools[1].router, scaling=scaling, **link)
                simulate_disaggregated(requests, cluster, workload=a.workload, client_side=side)
        else:
            scaling = _scaling(a, engines, [meters[i] for i in indices], recorder)
            _serve(spec, a, requests, engines, router, ReferenceCluster, scaling)
    except SchedlabError as exc:  # bad requests, a stall, the clock's end: say which run
        raise _with_where(_plugin_named(raised_by_plugin(exc, ctx.catalog), spec, ctx), where) from None
    wall_ms = (time.perf_counter() - started) * 1e3
    cpu_ms = (time.process_time() - started_cpu) * 1e3
    scheduler, cost, kv = a.instances[0]
    slots = getattr(scheduler, "slots", None)
    mine = [a.instances[i] for i in indices]
    meta = {
        "engine": spec.engine,
        "instances": len(a.instances),
        "gpus": sum(tensor_parallel(c, k) for _, c, k in mine) * a.parallelism.pipeline_parallel,
        "slots": slots * len(mine) if slots and a.pools is None else None,
        "num_blocks": sum(k.num_blocks for _, _, k in mine),
        "block_size": kv.block_size,
        "bytes_per_block": getattr(kv, "bytes_per_block", 0),
        "wall_ms": wall_ms,
        "cpu_ms": cpu_ms,  # the simulation's CPU time: on a shared machine, what an idle one's wall time would be
        "events": sum(e.events for e in engines),
        "seed": spec.seed,
        # whether each batch was planned while the one before it ran ("auto" resolved)
        "plans_ahead": any(plans_ahead(parts[0]) for parts in a.instances),
        "slo": attrs.asdict(a.slo) if a.slo is not None else {},
        "kv_cache": _kv_summary(kv),
        # the scheduler's settings as it ran, its kind's and the GPU's defaults included (a table
        # naming only kind = "vllm" runs with the budget and limits vLLM picks on that GPU)
        "scheduler": _settings_of(scheduler),
        # the longest sequence served (0: no limit); vLLM refuses to start when one does not fit
        "max_model_len": model_len_limit(scheduler, kv),
        # why the real engine would refuse to start with this cache ("": it starts; only schedulers
        # that know, the vllm presets: a max_model_len over the pool, a window's budget included)
        "start_up_problem": _start_up_problem(scheduler, kv),
        "speculative": attrs.asdict(a.speculative) if a.speculative is not None else {},
        "frontend": attrs.asdict(side.frontend) if side is not None and side.frontend is not None else {},
        "client": attrs.asdict(side.client) if side is not None and side.client is not None else {},
    }
    if spec.warmup:  # (a search's: its statistics leave out the first requests sent)
        meta["warmup"] = spec.warmup
    if spec.cooldown:  # (and the last)
        meta["cooldown"] = spec.cooldown
    if a.pools is not None:
        split = len(a.pools[0].instances)
        meta["pools"] = pool_summary({"prefill": engines[:split], "decode": engines[split:]})
        meta["first_token"] = a.cluster.first_token or FIRST_TOKEN[0]  # the pool that samples it
    if scaling is not None:  # (its paid intervals end first: the meters stop there)
        meta["scaling"] = scaling.finish()
    if spec.part and a.power is not None:  # up to the part's own end: merge_parts carries it to the run's
        meta["energy"] = close_part([meters[i] for i in indices], indices, recorder.first_arrival_ms())
    elif a.power is not None:  # from 0, where its paid GPU-hours start (a fixed cluster's and an autoscaled one's),
        # to where they end: the engine's work's end (a lease or a dropped request after the last iteration)
        meta["energy"] = close_meters([meters[i] for i in indices], 0.0,
                                      engine_end_ms(recorder.counters, recorder.last_left_ms))
    if a.parallelism != SINGLE:
        meta["parallelism"] = attrs.asdict(a.parallelism)
    if isinstance(lockstep, list):  # several deployments: what each did, and in all
        meta["data_parallel"] = deployments_summary(lockstep)
    elif lockstep is not None:
        meta["data_parallel"] = {"ranks": len(engines), "steps": lockstep.steps,
                                 "dummy_rank_steps": lockstep.dummy_steps, "experts_ms": lockstep.experts_ms}
    result = RunResult.from_recorder(spec.name, recorder, settings=_tables_with_defaults(spec.tables, ctx), meta=meta,
                                     request_cost=getattr(cost, "request_cost", None), point=spec.point)
    if delivered.count == 0 and not spec.part:  # (a partitioned run's part may get none; the merged run may not)
        raise WorkloadError(f"{where}: workload {spec.tables['workload'].get('kind')!r} made no requests; a run needs "
                            "at least one")
    if spec.warmup or spec.cooldown:
        check_warmup(spec, result, where)
    if not getattr(a.workload, "closed_loop", False):  # (a closed loop's follow-ups come from on_finish)
        _check_conserved(delivered.count, result.metrics.get("requests"), spec, where)
    # A replayed real run, or a summary of one: compared with the whole run (a partitioned run's
    # parts once merged, schedlab.study.partition).
    result.measured = getattr(a.workload, "measured", None)
    result.target = a.target
    if not spec.part:
        compare_with_real_run(result)
    return result


def check_warmup(spec: RunSpec, result: RunResult, where: str) -> None:
    """A run with a warm-up or a cool-down (a search's ``warmup``, ``cooldown``) keeps every row,
    and has requests left to measure once theirs are left out (a part of a partitioned run may
    have fewer: the runner checks the merged run, :func:`schedlab.study.runner.run_studies`)."""
    given = [(name, value) for name, value in (("warmup", spec.warmup), ("cooldown", spec.cooldown)) if value]
    setting = " and ".join(f"{name} = {value!r}" for name, value in given)
    if result.rows_file is not None or result.stream is not None:
        raise ConfigError(f"{where}: [search] {setting} needs every request's row, and this run of "
                          f"{result.metrics['requests']:,} requests streamed them past [experiment] exact_requests: "
                          f"raise exact_requests to {result.metrics['requests']:,} or more, or leave "
                          f"{' and '.join(name for name, _ in given)} out")
    n = int(result.metrics["requests"])
    left_out = warmup_count(spec.warmup, n) + warmup_count(spec.cooldown, n)
    if left_out >= n and not spec.part:
        raise ConfigError(f"{where}: [search] {setting} leaves out all {n:,} of the run's requests, so none is "
                          f"measured: a smaller {' or '.join(name for name, _ in given)} (a share below 1, such as "
                          "0.1), or more requests")


class _Counted:
    """An iterator of a run's requests that counts those the engines took."""

    __slots__ = ("_it", "count")

    def __init__(self, requests):
        self._it, self.count = iter(requests), 0

    def __iter__(self):
        return self

    def __next__(self):
        request = next(self._it)
        self.count += 1
        return request


def _check_conserved(delivered: int, rows, spec: RunSpec, where: str) -> None:
    """Every request the engines took left the run once -- finished, rejected or aborted -- or the
    results would silently hold fewer (a scheduler that removes requests from its waiting queue
    itself, or a queue of its own that drops them, used to end with exit 0)."""
    if isinstance(rows, int) and rows != delivered:
        scheduler = spec.tables.get("scheduler", {}).get("kind")
        raise SimulationError(f"{where}: {delivered} requests arrived but {rows} left the run (finished, rejected or "
                              f"aborted): the scheduler ({scheduler!r}) or its waiting queue lost "
                              f"{delivered - rows}; a scheduler takes requests out of plan.waiting only through the "
                              "plan (admit, reject), and a waiting queue of its own keeps every request pushed until "
                              "it is removed")


def _serve(spec: RunSpec, a: Assembled, requests, units: list, router, reference_cluster, scaling) -> None:
    """Serve ``requests`` on ``units`` -- instances, or what stands in for them (pipelined
    instances, data-parallel deployments) -- behind ``router``: the reference engine's in
    ``reference_cluster`` (a :class:`ReferenceCluster` class), the fast engine's through its
    colocated driver; autoscaled by ``scaling`` (None: a fixed cluster)."""
    side = a.client_side
    if spec.engine == "reference":
        reference_cluster(units, router, client_side=side, scaling=scaling).run(requests, workload=a.workload)
    else:
        simulate(requests, units, router=router, workload=a.workload, client_side=side, scaling=scaling)


def _scaling(a: Assembled, instances: list, meters: list, recorder: Recorder) -> ScalingController | None:
    """The autoscaler of a run's colocated or pipelined instances or data-parallel deployments
    (either engine's), or None without one; each instance is paid for its tensor_parallel x
    pipeline_parallel GPUs, a deployment for its ranks'."""
    if a.autoscaler is None:
        return None
    stages = a.parallelism.pipeline_parallel
    gpus = [tensor_parallel(c, k) * stages for _, c, k in a.instances]
    build = pipeline_scaling if a.parallelism.pipelined else ScalingController
    if a.deployments > 1:  # a deployment's ranks: its GPUs summed, its meters switched together
        size = a.parallelism.data_parallel
        gpus = [sum(gpus[d * size:(d + 1) * size]) for d in range(a.deployments)]
        meters = [meters[d * size:(d + 1) * size] for d in range(a.deployments)]
        build = deployment_scaling
    scaling = build(a.autoscaler, scaling_limits(a.autoscaler.config, len(instances)), instances, RoutingClock(),
                    slo_met=request_met(attrs.asdict(a.slo)) if a.slo else None, gpus_per_instance=gpus,
                    meters=meters)
    recorder.listener = scaling.finished
    return scaling


def _pool_scaling(a: Assembled, prefill: list, decode: list, meters: list):
    """The autoscalers of a disaggregated run's pools (:mod:`schedlab.engine.pool_scaling`), or
    None when both pools are fixed."""
    policies = {pool.name: pool.autoscaler for pool in a.pools}
    if not any(policies.values()):
        return None
    slo = attrs.asdict(a.slo) if a.slo is not None else None
    sizes = {pool.name: len(pool.instances) for pool in a.pools}
    side = a.client_side
    return pool_scaling(
        prefill, decode, policies,
        {name: scaling_limits(policy.config, sizes[name]) for name, policy in policies.items() if policy is not None},
        gpus={pool.name: [tensor_parallel(c, k) for _, c, k in pool.instances] for pool in a.pools},
        meters={"prefill": meters[:len(prefill)], "decode": meters[len(prefill):]},
        judge=(lambda **targets: request_met(slo, **targets)) if slo is not None else None,
        output_delay_ms=side.output_delay_ms if side is not None else 0.0)


def _part_of_run(spec: RunSpec, a: Assembled, requests, where: str):
    """A partitioned run's part: its router, its instances and the requests they serve (what
    cannot be split was refused when the run was assembled, :func:`_check_partitions`)."""
    from .partition import PartRouter, members

    part, parts = spec.part
    indices = members(part, parts, len(a.instances))
    router = PartRouter(a.router, len(a.instances), indices)
    return router, indices, router.requests(requests)


def _check_partitions(a: Assembled, where: str) -> None:
    """``[cluster] partitions`` > 1: refuse, when the run is assembled (so ``schedlab validate``
    does too), what cannot be split into independent parts (see :mod:`schedlab.study.partition`)."""
    from .partition import check_partitionable

    if a.pools is not None or getattr(a.workload, "closed_loop", False):
        raise ConfigError(f"{where} [cluster] partitions: only an open-loop workload on a colocated cluster can be "
                          "split into independent parts")
    if a.router is None:
        raise ConfigError(f"{where} [cluster] partitions: a single instance has nothing to split")
    if a.parallelism != SINGLE:
        raise ConfigError(f"{where} [cluster] partitions: data_parallel and pipeline_parallel layouts are run whole")
    if a.client_side is not None and a.client_side.frontend is not None:
        raise ConfigError(f"{where} [cluster] partitions: not with [frontend]: the API server's queue is shared "
                          "by every request, not split with the instances")
    check_partitionable(a.router, where)


def make_recorder(record: RecordSettings, a: Assembled, timeline: bool) -> Recorder:
    """The run's recorder: rows past ``record.exact_requests`` go to a :class:`RowSink`, which
    counts SLO attainment against the run's targets and the cost model's per-request costs."""
    cost = a.instances[0][1]
    side = a.client_side
    sink = RowSink(record, slo=attrs.asdict(a.slo) if a.slo is not None else None,
                   request_cost=getattr(cost, "request_cost", None), client_side=side is not None,
                   energy=a.power is not None)
    return Recorder(timeline=timeline, output_delay_ms=side.output_delay_ms if side is not None else 0.0, sink=sink,
                    exact_requests=record.exact_requests, timeline_points=record.timeline_points)


def _plugin_named(exc: SchedlabError, spec: RunSpec, ctx: Context) -> SchedlabError:
    """``exc`` with the registered plugin named where the engines' checks of an answer name its
    kind or class alone (``cost model returned nan ms``, ``KV cache MyKV's allocate returned
    None``, ``router Mine returned -1``, ``scheduler Mine: schedule() returned True``): ``cost
    model 'mine' (plugin my_module) returned nan ms``.
    A class is found by its name among the kind's registered factories, else by the kind the
    run's table names."""
    text = str(exc)
    found = re.match(r"(cost model)[ ']|(KV cache|router|autoscaler|power model|scheduler) (\w+)[ ':]", text)
    if found is None:
        return exc
    said = found[1] or found[2]
    kind = said.lower().replace(" ", "_")
    registry = ctx.catalog[kind]
    by_class = [entry for entry in registry if found[3] and getattr(entry.factory, "__name__", None) == found[3]]
    name = by_class[0].name if len(by_class) == 1 else _table_kind(spec.tables, kind)
    try:
        label = entry_label(registry.get(name))
        return type(exc)(label + text[len(said) + (len(found[3]) + 1 if found[3] else 0):])
    except (SchedlabError, TypeError):  # (an unknown name; a plugin's error class with another constructor)
        return exc


def _table_kind(tables: dict, kind: str) -> str | None:
    """The ``kind`` a run's table of plugin ``kind`` names (a router's and an autoscaler's are in
    ``[cluster]``), or None."""
    table = (tables.get("cluster") or {}).get(kind) if kind in ("router", "autoscaler") else \
        tables.get("power" if kind == "power_model" else kind)
    name = table.get("kind") if isinstance(table, dict) else None
    return name if isinstance(name, str) else None


def _with_where(exc: SchedlabError, where: str) -> SchedlabError:
    """The same kind of error with ``where`` in front of its message."""
    try:
        return type(exc)(f"{where}: {exc}")
    except TypeError:  # a plugin's error class with another constructor
        return SimulationError(f"{where}: {exc}")


def tensor_parallel(cost, kv) -> int:
    """GPUs one instance runs on: the larger of its KV cache's and cost model's
    ``tensor_parallel`` (1 if neither says; they differ only in a run warned about)."""
    sizing = getattr(kv, "sizing", None)
    cache = sizing.tensor_parallel if sizing is not None else 1
    return max(cache, getattr(getattr(cost, "config", None), "tensor_parallel", 1) or 1)


def pool_summary(pools: dict[str, list]) -> dict:
    """Per pool (name -> its engine instances, fast or reference): its size and what its
    instances did, for the per-pool metrics."""
    return {name: {
        "instances": len(mine),
        "gpus": sum(tensor_parallel(e.cost, e.kv) for e in mine),
        "num_blocks": sum(e.kv.num_blocks for e in mine),
        "busy_ms": sum(e.busy_ms for e in mine),
        "kv_block_ms": sum(e.kv_block_ms for e in mine),
        "iterations": sum(e.iterations for e in mine),
        "kv_peak_share": max(e.kv_peak / e.kv.num_blocks for e in mine),
        "kv_cache": _kv_summary(mine[0].kv),
    } for name, mine in pools.items()}


def _start_up_problem(scheduler, kv) -> str:
    """The scheduler's optional ``start_up_problem(kv)`` (the planner's too), else ""."""
    problem = getattr(scheduler, "start_up_problem", None)
    return (problem(kv) or "") if callable(problem) else ""


def _kv_summary(kv) -> dict:
    """The KV pool's size and, when it was sized from presets, the derivation."""
    out = {"num_blocks": kv.num_blocks, "block_size": kv.block_size, "tokens": kv.num_blocks * kv.block_size,
           "bytes_per_block": getattr(kv, "bytes_per_block", 0), "swap_blocks": getattr(kv, "swap_blocks", 0),
           "prefix_caching": bool(getattr(kv, "prefix_caching", False))}
    window = getattr(kv, "window", None)
    if window is not None:
        out.update(window_tokens=window.tokens, window_groups=window.groups)
    host = getattr(kv, "host", None)
    if host is not None:
        out.update(host_blocks=host.capacity, host_bytes=host.capacity * host.bytes_per_block,
                   host_link_gbps=host.link_gbps, host_link_latency_us=host.latency_us)
    sizing = getattr(kv, "sizing", None)
    if sizing is not None:
        out.update(model=sizing.model.name, gpu=sizing.gpu.name, tensor_parallel=sizing.tensor_parallel,
                   gpu_memory_utilization=sizing.gpu_memory_utilization, bytes_per_token=sizing.bytes_per_token,
                   weight_bytes=sizing.weight_bytes, reserve_bytes=sizing.reserve_bytes,
                   kv_pool_bytes=sizing.kv_pool_bytes, derived_blocks=sizing.num_blocks)
        if sizing.swa_ratio is not None:  # SGLang's hybrid SWA memory: the window layers' pool beside
            out.update(swa_full_tokens_ratio=sizing.swa_ratio)
        if sizing.expert_gpus != sizing.tensor_parallel or sizing.pipeline_parallel > 1:
            out.update(expert_gpus=sizing.expert_gpus, pipeline_parallel=sizing.pipeline_parallel)
        if sizing.draft is not None:  # speculation's drafter: in weight_bytes and bytes_per_token
            out.update(draft_model=sizing.draft.name)
    return out
