"""Capacity planning: the cheapest deployment that meets the SLO, over many dimensions.

Vidur-Search's question -- which GPU, how many, with which engine settings, for this workload
at this load -- answered by searching instead of enumerating::

    [plan]
    constraints = ["slo.attainment >= 0.99"]     # what every deployment must meet (all of them)
    gpus = {a100-40gb = 1.29, h100-sxm = 2.99}   # GPU preset -> price per GPU-hour
    tensor_parallel = [1, 2]                     # GPUs per instance
    max_instances = 16                           # instances (replicas of the engine) to consider
    energy_price_per_kwh = 0.12                  # with [power]: kWh and energy cost per hour too
    [plan.space]                                 # any other dimension, as a grid
    "scheduler.max_num_seqs" = [64, 256]
    "scheduler.max_num_batched_tokens" = [2048, 8192]

Each *candidate* (a GPU, a tensor-parallel degree and a point of the space) sets the GPU and
the degree in the run's cost model and KV cache (``gpu_keys``, ``tensor_parallel_keys``), after
the point's values, so a whole table in the space (``"cost_model" = [{...}]``) gets them too. The
space may not name a key the plan sets or searches itself (``cluster.instances`` and those
keys), nor list a value twice, nor may ``tensor_parallel`` or ``gpus`` repeat one: either would
simulate a deployment twice. At most :data:`~schedlab.study.sweep.MAX_SWEEP_POINTS` candidates. A
deployment is a candidate with a number of instances; it costs instances x its GPUs (tensor
parallel x pipeline stages x data-parallel ranks: ``[cluster] pipeline_parallel`` and
``data_parallel``) x the GPU's price per hour. Adding instances
never hurts an SLO, so for each candidate a 1-D search (:mod:`schedlab.study.search`) finds the
fewest instances that meet the constraints, in log(max_instances) runs instead of max_instances.
The search starts at max_instances. A constraint that more instances make worse (``energy.j_per_token``
or a utilisation at a fixed load) can fail there and hold with fewer, so in a plan with a constraint
not known to improve with instances (:func:`monotone_in_instances`: a latency bounded from above, SLO
attainment or goodput from below), a candidate that fails at max_instances is run at min_instances
too: when the constraints hold there, that is its answer (its fewest instances, so its cheapest) and
the message says they are not monotone in instances; when nothing holds, the message advises raising
max_instances only when the best value was reached there. The counts between are not searched:
constraints that hold only between the two ends (an SLO and an energy bound together) can still be
missed. An answer at min_instances > 1 says that fewer were not tried.

A candidate is *infeasible* -- skipped with the reason, without a run -- when its model does not fit
its GPUs (the KV cache's sizing error), when it fails to assemble with its GPU or degree while the same
point of the space assembles with another, or when the engine would refuse to start it (the
scheduler's ``start_up_problem``: vLLM's ``max_model_len`` beyond the KV pool). A point of the space
that assembles with none of the plan's GPUs and degrees, for another reason than memory (a negative
``workload.rate``), is an error of the file, named with the point: counted as infeasible, a typo would
silently drop its candidates. A GPU of ``gpus`` that is no preset (nor a ``[gpus.<name>]`` table) is
refused when the file is read.

Pruning by cost, in waves so that the runs made never depend on timing: candidates are
searched in groups of equal price per instance, cheapest group first, all members of a group
at once. The cheapest answer C found so far caps the next groups -- a candidate costing u per
instance is searched only up to C / u instances, and not at all when even ``min_instances``
costs more than C. The cheapest deployment found is therefore the cheapest of the whole grid
(when the constraints are monotone in instances), ties going to the higher attainment, then
to the earlier candidate.

Every deployment simulated is a point of the cost vs. attainment plot; the Pareto frontier
(no other point is both cheaper and better) is drawn and listed.
"""

from __future__ import annotations

import math
import sys
import warnings

import attrs

from ..configs import (MAX_INSTANCES, MAX_TENSOR_PARALLEL, FieldError, bound_text, float_field, int_field, list_field,
                       str_field, table_field)
from ..errors import ConfigError, InputWarning
from ..results.metric_names import check_metric_name
from ..results.metrics import LATENCY_NAMES, metric_at
from ..results.records import RunResult, Study
from .drivers import SearchDriver
from .overrides import set_dotted, split_key
from .caveats import overload_note
from .search import max_search_probes, parse_constraint
from .spec import PLAN_METRICS, RUN_TABLES, check_slo, needs_slo
from .simulation import Assembled, RunSpec, assemble
from .sweep import expand_grid, grid_axes, grid_size, point_label

INSTANCES_KEY = "cluster.instances"
#: metrics where less is better besides times (``*_ms``): not a frontier's quality (``[plan] attainment``)
LOWER_BETTER = frozenset({"rejected", "timed_out", "aborted", "num_preemptions", "requeues", "j_per_token",
                          "j_per_request", "gpu_hours"})
COST_METRIC = "cost_per_hour"  # added to the metrics of every deployment a plan simulates
KWH_METRIC = "kwh_per_hour"    # and, in a run with [power], its facility energy per hour of serving
ENERGY_COST_METRIC = "energy_cost_per_hour"
#: the GPUs' price of a million output tokens at the simulated load (cost_per_hour over the tokens
#: an hour generates at throughput_tps): what the deployment charges a token where it is planned
COST_MTOK_METRIC = "cost_per_mtok"


def energy_per_hour(metrics: dict, price_per_kwh: float | None) -> dict:
    """``{kwh_per_hour, energy_cost_per_hour}`` of serving at the simulated load -- the facility's
    average power over the run's window (PUE included) and its price -- or {} for a run without
    ``[power]``. Without a price (None) only the kWh: unpriced energy is not free energy."""
    energy = metrics.get("energy")
    if not isinstance(energy, dict) or not energy.get("window_ms"):
        return {}
    kw = energy["facility_j"] / energy["window_ms"]  # J per ms = kW
    return {KWH_METRIC: kw} if price_per_kwh is None else {KWH_METRIC: kw, ENERGY_COST_METRIC: kw * price_per_kwh}


def cost_per_mtok(cost_per_hour: float, throughput_tps) -> float:
    """Dollars a million output tokens cost at ``throughput_tps`` (NaN without throughput)."""
    if not isinstance(throughput_tps, (int, float)) or not math.isfinite(throughput_tps) or throughput_tps <= 0:
        return math.nan
    return cost_per_hour / (throughput_tps * 3600 / 1e6)


def _check_prices(_inst, attribute, value):
    if not isinstance(value, dict) or not value:
        raise FieldError(attribute.name, "must be a table of GPU presets and prices per GPU-hour, "
                                         "e.g. {a100-40gb = 1.29}")
    for name, price in value.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 < price < math.inf \
                or price > sys.float_info.max:  # (an integer too long for a float)
            raise FieldError(attribute.name, f"{name}: the price per GPU-hour must be a finite number > 0, got "
                                             f"{bound_text(price) if isinstance(price, int) else repr(price)}")


@attrs.frozen
class PlanConfig:
    constraints: tuple = list_field(item=str, help="metric conditions every deployment must meet, "
                                                   "e.g. ['slo.attainment >= 0.99', 'ttft_ms.p99 <= 2000']")
    gpus: dict = attrs.field(validator=_check_prices, metadata={"help": "GPU preset -> price per GPU-hour",
                                                                 "table": True})
    tensor_parallel: tuple = list_field((1,), item=int, help="tensor-parallel degrees (GPUs per instance) to try")
    min_instances: int = int_field(1, min=1, help="fewest instances to consider")
    max_instances: int = int_field(8, min=1, max=MAX_INSTANCES,  # a cluster's bound: searches start here
                                   help="most instances to consider")
    space: dict = table_field(attrs.Factory(dict), help="other dimensions: dotted key -> list of values (a grid)")
    gpu_keys: tuple = list_field(("cost_model.gpu", "kv_cache.gpu"), item=str,
                                 help="where the GPU preset name goes in each run's tables")
    tensor_parallel_keys: tuple = list_field(("cost_model.tensor_parallel", "kv_cache.tensor_parallel"), item=str,
                                             help="where the tensor-parallel degree goes")
    attainment: str = str_field("slo.attainment", help="the frontier's quality metric (higher is better)")
    energy_price_per_kwh: float | None = float_field(None, min=0.0, optional=True,
                                                     help="price of a kWh at the facility's meter: with a [power] "
                                                          "table each deployment reports its kWh per hour (PUE "
                                                          "included) and, when priced, their cost beside the GPUs'")

    def __attrs_post_init__(self):
        if not self.constraints:
            raise FieldError("constraints", "name at least one, e.g. ['slo.attainment >= 0.99']")
        for name, metrics in (("constraints", [parse_constraint(t).metric for t in self.constraints]),
                              ("attainment", [self.attainment])):
            for metric in metrics:
                try:
                    check_metric_name(metric)
                except ConfigError as exc:
                    raise FieldError(name, str(exc)) from None
        lower_is_better = [part for part in self.attainment.split(".") if part.endswith("_ms") or part in LOWER_BETTER]
        if lower_is_better:  # (the frontier keeps the highest: a latency's would be the worst deployments)
            what = "a time" if lower_is_better[0].endswith("_ms") else "a count of failures or a cost"
            raise FieldError("attainment", f"the frontier's metric is one where higher is better, and "
                                           f"{self.attainment!r} is {what}, lower is better; constrain it instead "
                                           "(e.g. 'ttft_ms.p99 <= 2000') and keep attainment a share or rate, such "
                                           "as slo.attainment or throughput_tps")
        if any(tp < 1 for tp in self.tensor_parallel) or not self.tensor_parallel:
            raise FieldError("tensor_parallel", f"must be whole numbers >= 1, got {list(self.tensor_parallel)}")
        if any(tp > MAX_TENSOR_PARALLEL for tp in self.tensor_parallel):
            raise FieldError("tensor_parallel", f"must be <= {MAX_TENSOR_PARALLEL}, got "
                                                f"{', '.join(bound_text(tp) for tp in self.tensor_parallel)}")
        if self.min_instances > self.max_instances:
            raise FieldError("min_instances", f"{self.min_instances} is above max_instances = {self.max_instances}")
        for key in self.gpu_keys + self.tensor_parallel_keys:
            split_key(key, where="plan")
        for name in ("tensor_parallel", "gpu_keys", "tensor_parallel_keys"):  # a degree twice: its deployments twice
            values = getattr(self, name)
            twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
            if twice is not None:
                raise FieldError(name, f"lists {twice!r} twice")
        both = next((key for key in self.tensor_parallel_keys if key in self.gpu_keys), None)
        if both is not None:
            raise FieldError("tensor_parallel_keys", f"{both!r} is in gpu_keys too; a key holds the GPU or the degree")
        space = grid_axes(self.space or {}, "space", numbers_by_value=True)  # 64 and 64.0: one value twice
        for key, values in space:
            _check_space_key(self, key, values)
        grid_size([len(self.gpus), len(self.tensor_parallel), *(len(values) for _, values in space)], "",
                  noun="candidates", labels=["gpus", "tensor_parallel"] + [""] * len(space),
                  why="each candidate is a search over instances")

    @property
    def constraint_text(self) -> str:
        return " and ".join(self.constraints)


def _plan_keys(cfg: PlanConfig):
    """``(key, how the plan sets it, what to write instead)`` for every key the plan sets itself."""
    yield (INSTANCES_KEY, "searched by the plan itself (the fewest instances that meet the constraints)",
           "set min_instances and max_instances instead")
    for key in cfg.gpu_keys:
        yield (key, "set by the plan itself (gpu_keys), to each GPU of gpus",
               "list the GPUs in gpus = {name = price per GPU-hour} instead")
    for key in cfg.tensor_parallel_keys:
        yield (key, "set by the plan itself (tensor_parallel_keys), to each degree of tensor_parallel",
               "list the degrees in tensor_parallel = [...] instead")


def _check_space_key(cfg: PlanConfig, key: str, values: list) -> None:
    """Refuse a space key outside the run's tables (it would label candidates and change nothing, as
    a [sweep] refuses it), or whose values the plan would overwrite: each point would run twice."""
    if key.split(".")[0] not in RUN_TABLES:
        raise ConfigError(f"space: cannot vary {key!r}; keys start with one of {', '.join(RUN_TABLES)}")
    for plan_key, how, instead in _plan_keys(cfg):
        if key == plan_key or key.startswith(plan_key + "."):
            inside = "" if key == plan_key else f"inside {plan_key!r}, "
            raise ConfigError(f"space: {key!r} is {inside}{how}; {instead}")
        if not plan_key.startswith(key + "."):
            continue
        rest = plan_key[len(key) + 1:].split(".")  # the space sets a table holding plan_key
        for value in values:
            node = value
            for part in rest:
                if not isinstance(node, dict):
                    raise ConfigError(f"space: {key!r} lists {value!r}, not a table, but the plan sets {plan_key!r} "
                                      f"in it; list tables")
                if part not in node:
                    break
                node = node[part]
            else:
                raise ConfigError(f"space: {key!r} lists a table that sets {plan_key!r}, which is {how}; {instead}")


@attrs.frozen
class Candidate:
    """A GPU, a tensor-parallel degree and a point of the space; instances are searched."""

    index: int
    point: dict
    gpu: str
    tensor_parallel: int
    unit_cost: float       # price per hour of one instance (its gpus_per_instance)
    tables: dict
    gpus_per_instance: int = 1  # tensor parallel x pipeline stages x data-parallel ranks


def candidates(study, where: str) -> list[Candidate]:
    """Every candidate of a plan study, in order: GPUs as written, then degrees, then space points."""
    cfg = study.plan
    space = expand_grid(cfg.space, f"{where} [plan.space]", numbers_by_value=True) if cfg.space else [{}]
    out = []
    for gpu, price in cfg.gpus.items():
        for tp in cfg.tensor_parallel:
            for point in space:
                tables = study.base.tables
                for key, value in point.items():  # first: a whole table in the space gets the GPU and degree too
                    tables = set_dotted(tables, key, value)
                for key in cfg.gpu_keys:
                    tables = set_dotted(tables, key, gpu)
                for key in cfg.tensor_parallel_keys:
                    tables = set_dotted(tables, key, tp)
                gpus = tp * _cluster_factor(tables, "pipeline_parallel") * _cluster_factor(tables, "data_parallel")
                out.append(Candidate(len(out), {"gpu": gpu, "tensor_parallel": tp, **point}, gpu, tp,
                                     float(price) * gpus, tables, gpus))
    return out


def _cluster_factor(tables: dict, key: str) -> int:
    """``[cluster] key`` (pipeline stages, data-parallel ranks): the GPUs of an instance it
    multiplies; 1 when unset (or not a whole number: the run's own check names it)."""
    value = (tables.get("cluster") or {}).get(key, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def deployment_spec(study, candidate: Candidate, instances: int) -> RunSpec:
    tables = set_dotted(candidate.tables, INSTANCES_KEY, instances)
    point = {**candidate.point, INSTANCES_KEY: instances}
    return RunSpec(f"{study.name}[{point_label(point)}]", tables, study.base.seed, study.base.engine, point)


#: metrics that more instances never make worse at a fixed load -- the search's premise -- by the first
#: part of their names (after ``per_class.<name>.``): lower latencies and queue times, higher SLO attainment
#: and goodput (``slo``)
LOWER_WITH_INSTANCES = frozenset(LATENCY_NAMES) | {"itl_ms", "client"}
HIGHER_WITH_INSTANCES = frozenset({"slo"})


def monotone_in_instances(constraint) -> bool:
    """Whether more instances never break ``constraint`` once it holds: ``ttft_ms.p99 <= 500`` or
    ``slo.attainment >= 0.99``, not ``energy.j_per_token <= 1.5`` (more instances idle more at the same
    load), a utilisation, or a latency bounded from below. A plan with one that is not runs a
    candidate failing at max_instances at min_instances too (:class:`PlanDriver`)."""
    parts = constraint.metric.split(".")
    first = parts[2] if parts[0] == "per_class" and len(parts) > 2 else parts[0]
    if constraint.op in ("<", "<="):
        return first in LOWER_WITH_INSTANCES
    return first in HIGHER_WITH_INSTANCES


#: how the KV cache's sizing says a model does not fit a GPU (:func:`schedlab.capacity.kv_sizing`)
DOES_NOT_FIT = " does not fit on "


def feasibility(study, ctx, where: str) -> list[tuple[Candidate, str]]:
    """Each candidate and why it cannot run ("" when it can): the plugins are built once. A
    deployment the engine would refuse to start cannot run either (:func:`start_up_problem`).

    :raises ConfigError: a point of the space that no GPU and degree can assemble, other than for
        memory (:func:`_check_space_points`): a mistake of the file, not a deployment that cannot run.
    """
    out, errors = [], {}
    for candidate in candidates(study, where):
        try:
            built = assemble(deployment_spec(study, candidate, study.plan.min_instances), ctx, where)
            problem = start_up_problem(built)
            out.append((candidate, f"{where} {problem}" if problem else ""))
        except ConfigError as exc:
            out.append((candidate, str(exc)))
            errors[candidate.index] = exc
    _check_space_points(study.plan, [c for c, _ in out], errors)
    return out


def _check_space_points(cfg: PlanConfig, every: list[Candidate], errors: dict) -> None:
    """Raise the error of a point of the space that assembles with none of the plan's GPUs and
    degrees, when one of its errors is not the model not fitting (a negative ``workload.rate``): it
    depends on no deployment, and counted as infeasible it would silently drop the point's candidates.
    (Candidates run through the space fastest, so ``index % points`` is a candidate's point.)"""
    if not cfg.space:
        return  # (one point: when nothing assembles, :func:`validate` raises the first error)
    points = len(every) // (len(cfg.gpus) * len(cfg.tensor_parallel))
    for point in range(points):
        failed = [errors.get(c.index) for c in every if c.index % points == point]
        if not all(failed):
            continue
        exc = next((e for e in failed if DOES_NOT_FIT not in str(e)), None)
        if exc is None:
            continue  # the model fits no GPU of the plan at this point: infeasible
        values = {k: v for k, v in every[point].point.items() if k not in ("gpu", "tensor_parallel")}
        setting = ", ".join(f"{key} = {value!r}" for key, value in values.items())
        raise ConfigError(f"{exc} (at the plan's space point {setting}, with every GPU and degree)") from None


def start_up_problem(built: Assembled) -> str | None:
    """``[scheduler]: why...`` when a scheduler of the assembled run says its engine would refuse
    to start with its KV cache (the optional ``start_up_problem(kv)``: vLLM's start-up check that
    one ``max_model_len`` sequence fits the pool), else None. Known from the sizing alone: no run."""
    groups = [(f"cluster.{pool.name}.", pool.instances) for pool in built.pools] if built.pools else \
        [("", built.instances)]
    for label, instances in groups:
        if not instances:
            continue
        scheduler, _, kv = instances[0]  # every instance of a pool has the same tables
        check = getattr(scheduler, "start_up_problem", None)
        problem = check(kv) if callable(check) else None
        if problem:
            return f"[{label}scheduler]: {problem}"
    return None


def check_gpu_names(cfg: PlanConfig, presets, where: str) -> None:
    """Refuse a name in ``gpus`` that is no GPU preset (nor a ``[gpus.<name>]`` table): its
    candidates could never run; and two names for one preset (``l4`` and ``L4``): each
    deployment would run twice."""
    named: list[tuple[object, str]] = []
    for name in cfg.gpus:
        try:
            spec = presets.gpu(name)
        except ConfigError as exc:  # "unknown gpu 'h100' (did you mean 'h100-80gb'?); known: ..."
            raise ConfigError(f"{where} [plan]: gpus: {exc}") from None
        first = next((other for known, other in named if known is spec), None)
        if first is not None:
            raise ConfigError(f"{where} [plan]: gpus: {first!r} and {name!r} name the same GPU preset; "
                              f"list each GPU once")
        named.append((spec, name))


def _warn_attainment_without_slo(study, where: str) -> None:
    """Say when the frontier's metric (``slo.attainment`` unless set) needs ``[slo]`` targets that
    the runs do not have: the plan still finds the cheapest deployment, but every point of its
    cost-vs-attainment frontier and plot would be NaN."""
    cfg = study.plan
    if not needs_slo(cfg.attainment) or study.has_slo() or any(k.split(".")[0] == "slo" for k in cfg.space):
        return
    warnings.warn(f"{where} [plan]: attainment {cfg.attainment!r} needs [slo] targets, which the run has not: the "
                  "plan finds the cheapest deployment, but its cost vs attainment frontier is empty; add [slo] "
                  "(e.g. ttft_ms = 500, tpot_ms = 50) or set attainment to a metric the run has (higher is better)",
                  InputWarning, stacklevel=3)


def _warn_energy_price_without_power(study, where: str) -> None:
    """Say when ``energy_price_per_kwh`` is set but no run meters energy (no ``[power]`` table, in
    the run or the space): the price would be silently ignored."""
    cfg = study.plan
    if cfg.energy_price_per_kwh is None or "power" in study.base.tables \
            or any(k.split(".")[0] == "power" for k in cfg.space):
        return
    warnings.warn(f"{where} [plan]: energy_price_per_kwh is set but the runs have no [power] table: no energy is "
                  "metered, so no energy cost is reported; add [power] kind = \"utilisation\"",
                  InputWarning, stacklevel=3)


def _check_autoscaled_plan(cfg: PlanConfig, autoscaler: dict, where: str) -> None:
    """A plan over an autoscaled cluster sets each deployment's instances -- the most the
    autoscaler may run -- to a count from ``[plan] min_instances`` up, so the autoscaler's own
    limits must fit the fewest; its messages name ``[plan] min_instances``, the source of the
    count (the run's checks would name only the count)."""
    fewest = cfg.min_instances
    if fewest < 2:
        raise ConfigError(f"{where} [plan]: min_instances: {fewest}: the run's [cluster] autoscaler "
                          f"needs at least 2 instances to scale between; set [plan] min_instances >= 2")
    for key in ("min_instances", "initial"):
        value = autoscaler.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > fewest:
            raise ConfigError(f"{where} [cluster.autoscaler]: {key} ({value}) is above [plan] min_instances "
                              f"({fewest}), the most instances the plan's smallest deployments may serve; set [plan] "
                              f"min_instances >= {value}, or a lower {key}")
    most = autoscaler.get("max_instances")
    if most is not None and not most == fewest == cfg.max_instances:
        raise ConfigError(f"{where} [cluster.autoscaler]: max_instances ({most}): the plan sets the most instances "
                          f"that may serve, each deployment's count from [plan] min_instances ({fewest}) to "
                          f"max_instances ({cfg.max_instances}); leave max_instances out")


#: workload keys that set the load a plan serves, not how it is served
DEMAND_KEYS = ("workload.rate", "workload.clients", "workload.max_concurrency", "workload.stages")


def _warn_demand_in_space(study, where: str) -> None:
    """Say when ``[plan.space]`` varies the load (``workload.rate``): the plan then picks the
    cheapest deployment across loads, which answers no load's question -- plan each load in a
    ``[[runs]]`` entry of its own."""
    varied = [key for key in study.plan.space if key in DEMAND_KEYS or key == "workload"]
    if varied:
        warnings.warn(f"{where} [plan.space]: {', '.join(varied)} varies the load, so the cheapest deployment is "
                      "taken across loads (a deployment serving less looks cheaper); plan each load in a [[runs]] "
                      "entry of its own", InputWarning, stacklevel=3)


def validate(study, ctx, where: str) -> None:
    """At load time: every GPU a preset and none named twice, and at least one candidate must
    assemble and start (else its error is the file's error)."""
    check_gpu_names(study.plan, ctx.presets, where)
    cluster = study.base.tables.get("cluster")
    if isinstance(cluster, dict) and isinstance(cluster.get("autoscaler"), dict):
        _check_autoscaled_plan(study.plan, cluster["autoscaler"], where)
    for text in study.plan.constraints:  # a metric no run has would fail every deployment
        metric = parse_constraint(text).metric
        if metric.split(".")[0] in PLAN_METRICS:
            raise ConfigError(f"{where} [plan]: constraints: {metric!r} is the plan's own price of a deployment, "
                              "computed once the constraints have chosen it, so it cannot be one of them (the plan "
                              "picks the cheapest deployment that meets them)")
        check_slo(metric, [study], f"{where} [plan]: constraints")   # (a space may set the targets)
    _warn_attainment_without_slo(study, where)
    _warn_energy_price_without_power(study, where)
    _warn_demand_in_space(study, where)
    checked = feasibility(study, ctx, where)
    if all(reason for _, reason in checked):
        raise ConfigError(checked[0][1])


@attrs.frozen
class PlanOutcome:
    """What a plan found; plain data (run names, not runs), as saved in summary.json.

    :ivar candidates: per candidate: point, unit_cost, status (``found``, ``too-expensive``
        -- no instance count within the cost cap meets the constraints --, ``fails`` -- not
        even max_instances do, nor min_instances when run too (:meth:`PlanDriver._due_checks`) --,
        or ``infeasible``), instances, cost, reason (for ``found``: what limits the answer, or
        ""), run.
    :ivar cheapest: the cheapest candidate's entry (None when nothing meets the constraints).
    :ivar deployments: every simulated deployment: run, gpu, instances, cost, gpu_hours_per_hour,
        attainment, meets; with ``[power]`` also kwh_per_hour and, with ``energy_price_per_kwh``,
        energy_cost_per_hour.
    :ivar frontier: run names of the Pareto frontier, by cost.
    :ivar target: the attainment a constraint asks for (None when none is on that metric).
    """

    constraint: str
    attainment: str
    target: float | None
    candidates: tuple
    cheapest: dict | None
    deployments: tuple
    frontier: tuple
    grid_size: int
    message: str

    def shown_runs(self) -> set[str]:
        """The runs a summary table lists: each candidate's answer and the frontier."""
        return {c["run"] for c in self.candidates if c.get("run")} | set(self.frontier)

    def counts_text(self) -> str:
        """``24 candidates: 6 found, 14 too expensive, 4 fail``."""
        counts: dict[str, int] = {}
        for c in self.candidates:
            counts[c["status"]] = counts.get(c["status"], 0) + 1
        parts = [f"{counts[s]} {s.replace('-', ' ')}" for s in ("found", "too-expensive", "fails", "infeasible")
                 if counts.get(s)]
        return f"{len(self.candidates)} candidates: " + ", ".join(parts)

    def to_json(self) -> dict:
        return attrs.asdict(self, recurse=False)

    @classmethod
    def from_json(cls, data: dict) -> "PlanOutcome":
        fields = {f.name for f in attrs.fields(cls)}
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in fields})


SavedPlan = PlanOutcome  # read back by schedlab.results.storage.load


def _finite(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value


def pareto(points: list[tuple[float, float, str]]) -> list[str]:
    """Names of the points no other point beats on both cost (lower) and quality (higher),
    by increasing cost; points without a finite quality take no part."""
    ranked = sorted((p for p in points if math.isfinite(p[1])), key=lambda p: (p[0], -p[1]))
    frontier, best = [], -math.inf
    for cost, quality, name in ranked:
        if quality > best:
            frontier.append(name)
            best = quality
    return frontier


def deployment_text(entry: dict) -> str:
    """``2 instances x 1 a100-40gb`` or ``1 instance x 2 a100-40gb (tensor parallel)``: the GPUs of
    an instance (tensor parallel x pipeline stages x data-parallel ranks), and what splits them."""
    n, p = entry["instances"], entry["point"]
    plural = "instance" if n == 1 else "instances"
    tp, gpus = p["tensor_parallel"], entry.get("gpus_per_instance", p["tensor_parallel"])
    return f"{n} {plural} x {gpus} {p['gpu']}" + (" (tensor parallel)" if tp > 1 else "")


def _instances(n: int) -> str:
    return f"{n} instance" if n == 1 else f"{n} instances"


def _money(value: float) -> str:
    return f"${value:,.2f}/h"


class PlanDriver:
    """Drives a plan study for the runner: waves of per-candidate instance searches, and a run at
    min_instances of each candidate whose search fails at max_instances (:meth:`_start_checks`)."""

    def __init__(self, exp, spec, width: int):
        where = f"{exp.context.source}: [[runs]] {spec.name!r}"
        self.exp, self.spec, self.width = exp, spec, width
        self.cfg = spec.plan
        self.constraints = [parse_constraint(text) for text in self.cfg.constraints]
        checked = feasibility(spec, exp.context, where)
        self.feasible = [c for c, reason in checked if not reason]
        self.infeasible = {c.index: reason for c, reason in checked if reason}
        self.all = [c for c, _ in checked]
        self.waves = [[c for c in self.feasible if c.unit_cost == unit]
                      for unit in sorted({c.unit_cost for c in self.feasible})]
        self.searches: dict[int, SearchDriver] = {}
        self.checks: dict[int, SearchDriver] = {}  # the run at min_instances of a candidate failing at max
        self.monotone = all(monotone_in_instances(c) for c in self.constraints)  # (else: checks)
        self.cap: dict[int, int] = {}
        self.budget: dict[int, float] = {}  # the cheapest answer when the candidate's wave started (its cap)
        self.wave = -1
        self.name = spec.name

    def _holds(self, metrics: dict) -> bool:
        return all(c.holds(metrics) for c in self.constraints)

    def _search(self, candidate: Candidate, low: int, high: int, width: int, suffix: str = "") -> SearchDriver:
        return SearchDriver(f"{self.name}/{candidate.index}{suffix}",
                            lambda n: deployment_spec(self.spec, candidate, n),
                            self._holds, self.spec.replicas, width, low=low, high=high,
                            maximize=False, integer=True, key="instances", constraint_text=self.cfg.constraint_text)

    def _drivers(self) -> list[SearchDriver]:
        return [*self.searches.values(), *self.checks.values()]

    def _start_wave(self, wave: int) -> list:
        self.wave = wave
        members = self.waves[wave]
        budget = self._best_cost()
        width = max(1, self.width // max(1, len(members) * self.spec.replicas)) * self.spec.replicas
        jobs = []
        for candidate in members:
            high = self.cfg.max_instances
            if math.isfinite(budget):
                high = min(high, int(math.floor(budget / candidate.unit_cost + 1e-9)))
            self.cap[candidate.index] = high
            self.budget[candidate.index] = budget
            if high < self.cfg.min_instances:
                continue  # even the fewest instances cost more than the cheapest answer so far
            search = self._search(candidate, self.cfg.min_instances, high, width)
            self.searches[candidate.index] = search
            jobs += search.start()
        return jobs

    def _due_checks(self) -> list[int]:
        """Candidates whose search failed at max_instances itself (not at a cost cap), above
        min_instances, and not yet run at min_instances, in a plan with a constraint that is not
        :func:`monotone_in_instances`: one more instances make worse fails there and may hold with
        fewer (the search, assuming the opposite, stopped)."""
        due = []
        for index, search in self.searches.items() if not self.monotone else ():
            outcome = search.search.outcome
            if index not in self.checks and outcome is not None and outcome.status == "fails-everywhere" \
                    and self.cap[index] == self.cfg.max_instances > self.cfg.min_instances:
                due.append(index)
        return due

    def _start_checks(self) -> list:
        """Run each due candidate at min_instances (a search over that one count)."""
        jobs = []
        for index in self._due_checks():
            fewest = self.cfg.min_instances
            self.checks[index] = self._search(self.all[index], fewest, fewest, self.spec.replicas, "/min")
            jobs += self.checks[index].start()
        return jobs

    def _answer(self, index: int):
        """``(instances, run)`` of a candidate's answer -- its search's, else its run at
        min_instances -- or None when neither holds."""
        for driver in (self.searches.get(index), self.checks.get(index)):
            outcome = driver.search.outcome if driver is not None else None
            if outcome is not None and outcome.value is not None:
                return outcome.value, outcome.payload
        return None

    def _best_cost(self) -> float:
        costs = [answer[0] * self.all[index].unit_cost for index in self.searches
                 if (answer := self._answer(index)) is not None]
        return min(costs, default=math.inf)

    @property
    def done(self) -> bool:
        return self.wave == len(self.waves) - 1 and all(d.done for d in self._drivers()) and not self._due_checks()

    def start(self) -> list:
        return self.refresh()

    def refresh(self) -> list:
        jobs = []
        while True:
            jobs += self._start_checks()  # (a wave ends when its candidates' checks end too: they set the cap)
            if self.done or not all(d.done for d in self._drivers()):
                break
            jobs += self._start_wave(self.wave + 1)
        for driver in self._drivers():
            jobs += driver.refresh()
        return jobs

    def job_done(self, job) -> list:  # jobs are owned by the searches
        raise AssertionError("plan jobs belong to their searches")

    @property
    def total(self) -> int:
        started = sum(d.total for d in self._drivers())  # (a search failing at once and its check: 2 runs at most)
        later = [c for wave in self.waves[self.wave + 1:] for c in wave]
        estimate = max_search_probes(low=self.cfg.min_instances, high=self.cfg.max_instances) if later else 0
        return started + len(later) * estimate * self.spec.replicas

    @property
    def completed(self) -> int:
        return sum(d.completed for d in self._drivers())

    def _bests(self, reached: list) -> list[tuple]:
        """``(constraint, best value, candidate, instances)`` for each constraint no simulated
        deployment met on its own (``reached``: metrics, candidate, instances of each; ties to the
        first simulated)."""
        bests = []
        for constraint in self.constraints:
            if any(constraint.holds(metrics) for metrics, _, _ in reached):
                continue
            sign = 1.0 if constraint.op in ("<=", "<") else -1.0  # lower is better, or higher
            values = [(sign * constraint.value(metrics), order, candidate, instances)
                      for order, (metrics, candidate, instances) in enumerate(reached)]
            values = [v for v in values if math.isfinite(v[0])]
            if values:
                value, _, candidate, instances = min(values, key=lambda v: v[:2])
                bests.append((constraint, value * sign, candidate, instances))
        return bests

    @staticmethod
    def _best_text(bests: list[tuple]) -> str:
        """``; best tpot_ms.p99 reached: 18.2 (2 instances x 8 a100-80gb)`` for each of ``bests``."""
        parts = []
        for constraint, value, candidate, instances in bests:
            rest = point_label({k: v for k, v in candidate.point.items() if k not in ("gpu", "tensor_parallel")})
            where = f"{_instances(instances)} x {candidate.gpus_per_instance} {candidate.gpu}"
            shown = f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
            parts.append(f"best {constraint.metric} reached: {shown} ({where}{', ' + rest if rest else ''})")
        return "".join(f"; {part}" for part in parts)

    def _none_met(self, reached: list) -> str:
        """The message when no deployment meets the constraints: the best values reached, and
        "raise max_instances" only when each was reached at max_instances (with fewer, more
        instances made it worse: raising the bound cannot help)."""
        bests = self._bests(reached)
        fewer = [c.metric for c, _, _, instances in bests if instances < self.cfg.max_instances]
        advice = ("raise max_instances or widen the space" if not fewer else
                  f"widen the space; raising max_instances would not help: {' and '.join(fewer)} was best with "
                  f"fewer instances")
        return (f"no deployment meets {self.cfg.constraint_text} within {self.cfg.max_instances} instances "
                f"of any candidate{self._best_text(bests)}; {advice}")

    def _entry(self, candidate: Candidate) -> dict:
        """A candidate's entry of :attr:`PlanOutcome.candidates`: its status, answer and reason."""
        index, fewest, most = candidate.index, self.cfg.min_instances, self.cfg.max_instances
        entry = {"point": candidate.point, "unit_cost": candidate.unit_cost, "instances": None, "cost": None,
                 "run": None, "reason": self.infeasible.get(index, ""),
                 "gpus_per_instance": candidate.gpus_per_instance}
        answer = self._answer(index)
        if index in self.infeasible:
            entry["status"] = "infeasible"
        elif index not in self.searches:
            entry["status"] = "too-expensive"
            entry["reason"] = (f"{_instances(fewest)} cost {_money(fewest * candidate.unit_cost)}, more than "
                               f"{_money(self.budget[index])}, the cheapest found then")
        elif answer is not None:
            instances, run = answer
            entry.update(status="found", instances=instances, cost=instances * candidate.unit_cost, run=run.name,
                         reason=self._found_reason(index, instances))
        elif self.cap[index] < most:
            entry.update(status="too-expensive",
                         reason=f"fails up to {_instances(self.cap[index])}, the most that cost no more than "
                                f"{_money(self.budget[index])}, the cheapest found then")
        else:
            also = f" and at {_instances(fewest)}" if index in self.checks else ""
            entry.update(status="fails", reason=f"fails even at {most} instances{also}")
        return entry

    def _found_reason(self, index: int, instances: int) -> str:
        """What limits a found answer: not monotone (it failed at max_instances and holds at
        min_instances), or min_instances > 1 (fewer were not tried); "" otherwise."""
        fewest = self.cfg.min_instances
        parts = []
        if index in self.checks:
            parts.append(f"fails at {self.cfg.max_instances} instances but holds at {fewest}: not monotone in "
                         f"instances")
        if instances == fewest > self._lowest_min():
            parts.append(self._min_hint())
        return "; ".join(parts)

    def _lowest_min(self) -> int:
        """The lowest min_instances the plan would take: 1, or over an autoscaler 2 and its own
        min_instances and initial (:func:`_check_autoscaled_plan`)."""
        cluster = self.spec.base.tables.get("cluster")
        autoscaler = cluster.get("autoscaler") if isinstance(cluster, dict) else None
        if not isinstance(autoscaler, dict):
            return 1
        return max([2, *(v for v in (autoscaler.get("min_instances"), autoscaler.get("initial"))
                         if isinstance(v, int) and not isinstance(v, bool))])

    def _min_hint(self) -> str:
        """Said of an answer at a min_instances the plan could lower: fewer instances, cheaper,
        were not tried."""
        return f"holds down to min_instances = {self.cfg.min_instances}; lower it to search further"

    def _deployment(self, candidate: Candidate, probe) -> dict:
        """A simulated deployment's entry (:attr:`PlanOutcome.deployments`); its run gets the
        plan's metrics (cost, and with ``[power]`` the kWh and, when priced, their cost per hour)."""
        run = probe.payload
        cost = probe.value * candidate.unit_cost
        run.metrics[COST_METRIC] = cost
        run.metrics[COST_MTOK_METRIC] = per_mtok = cost_per_mtok(cost, run.metrics.get("throughput_tps"))
        hourly = energy_per_hour(run.metrics, self.cfg.energy_price_per_kwh)
        run.metrics.update(hourly)
        return {"run": run.name, "gpu": candidate.gpu, "instances": probe.value, "cost": cost,
                COST_MTOK_METRIC: per_mtok,
                "gpu_hours_per_hour": probe.value * candidate.gpus_per_instance,
                "attainment": _finite(metric_at(run.metrics, self.cfg.attainment)), "meets": probe.holds, **hourly}

    def _found_message(self, cheapest: dict, deployments: list, attainment: dict, grid: int, runs: dict) -> str:
        """``cheapest deployment with ...: ... at $2.58/h, slo.attainment 0.995; 40 of 288 deployments
        simulated``, with whether its run is overloaded (``runs``: name -> run), what limits it
        (min_instances) and whether a constraint was not monotone."""
        p = cheapest["point"]
        rest = point_label({k: v for k, v in p.items() if k not in ("gpu", "tensor_parallel")})
        found = next(d for d in deployments if d["run"] == cheapest["run"])
        energy = ""
        if ENERGY_COST_METRIC in found:
            energy = f" GPUs + {_money(found[ENERGY_COST_METRIC])} energy ({found[KWH_METRIC]:.3g} kWh/h)"
        elif KWH_METRIC in found:  # no price: the kWh only (not "$0.00/h energy")
            energy = f" GPUs + {found[KWH_METRIC]:.3g} kWh/h of energy"
        per_mtok = found[COST_MTOK_METRIC]
        tokens = f"; GPUs ${per_mtok:,.2f} a million output tokens at this load" if math.isfinite(per_mtok) else ""
        message = (f"cheapest deployment with {self.cfg.constraint_text}: {deployment_text(cheapest)}"
                   f"{' (' + rest + ')' if rest else ''} at {_money(cheapest['cost'])}{energy}, "
                   f"{self.cfg.attainment} {attainment[cheapest['run']]:.4g}{tokens}; "
                   f"{len(deployments)} of {grid} deployments simulated")
        if overload := overload_note(runs[cheapest["run"]].metrics, "at the cheapest"):
            message += f"; {overload}"
        fewest = self.cfg.min_instances
        if cheapest["instances"] == fewest > self._lowest_min():
            message += f"; {self._min_hint()}"
        held = [index for index in self.checks if self._answer(index) is not None]
        if held:
            count = f"{len(held)} candidate{'s' if len(held) > 1 else ''}"
            searched = [i for i in self.searches if i not in self.checks and self._answer(i) is not None]
            others = (" (the search assumes more instances never hurt, so other candidates' answers may not be "
                      "their fewest)") if searched else ""
            message += (f"; not monotone in instances: {self.cfg.constraint_text} fails at {self.cfg.max_instances} "
                        f"instances but holds at {fewest} for {count}{others}")
        return message

    def study(self) -> Study:
        runs: list[RunResult] = []
        deployments, entries, reached = [], [], []
        for candidate in self.all:
            for driver in (self.searches.get(candidate.index), self.checks.get(candidate.index)):
                for probe in driver.search.outcome.probes if driver is not None else ():
                    runs.append(probe.payload)
                    deployments.append(self._deployment(candidate, probe))
                    reached.append((probe.payload.metrics, candidate, probe.value))
            entries.append(self._entry(candidate))
        attainment = {d["run"]: d["attainment"] for d in deployments}
        found = [e for e in entries if e["status"] == "found"]
        order = {e["run"]: i for i, e in enumerate(entries)}
        cheapest = min(found, key=lambda e: (e["cost"], -_nan_low(attainment[e["run"]]), order[e["run"]]),
                       default=None)
        frontier = tuple(pareto([(d["cost"], d["attainment"], d["run"]) for d in deployments]))
        grid = len(self.all) * (self.cfg.max_instances - self.cfg.min_instances + 1)
        message = (self._none_met(reached) if cheapest is None else
                   self._found_message(cheapest, deployments, attainment, grid, {run.name: run for run in runs}))
        targets = [c.threshold for c in self.constraints if c.metric == self.cfg.attainment and c.op in (">=", ">")]
        outcome = PlanOutcome(self.cfg.constraint_text, self.cfg.attainment, max(targets, default=None),
                              tuple(entries), cheapest,
                              tuple(deployments), frontier, grid, message)
        space_keys = [k for k in self.all[0].point if k not in ("gpu", "tensor_parallel")]
        keys = ("gpu", "tensor_parallel", *space_keys, INSTANCES_KEY)
        return Study(self.name, "plan", runs, keys=keys, constraint=self.cfg.constraint_text, plan=outcome)


def _nan_low(value: float) -> float:
    return value if math.isfinite(value) else -math.inf
