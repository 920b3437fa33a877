"""The hooks a schedlab plugin can implement.

One name, ``schedlab``, is the pluggy project name, the entry-point group and the hook prefix.
A plugin is a module (or object) with functions marked ``@schedlab.hookimpl``; it is loaded
from the ``schedlab`` entry-point group, from an experiment's ``plugins = [...]`` list, or is
one of the built-ins in ``schedlab_plugins`` (which register through these same hooks).

Hooks are called with keyword arguments, so an implementation may accept fewer arguments
than the spec. A function marked ``@schedlab.hookimpl`` whose name is no hook here (a misspelt
``schedlab_register_scheduler``) is refused, naming its module and the closest hook name (an
installed package's plugin is left out with a warning saying so).
Registration hooks run once per plugin manager, while a run is assembled; only the opt-in
observer hook ``schedlab_iteration`` is ever called from the engine's loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .registry import Registry

NAME = "schedlab"
hookspec = pluggy.HookspecMarker(NAME)
hookimpl = pluggy.HookimplMarker(NAME)


# --- registration: called once while the plugin manager assembles a catalog -------------


@hookspec
def schedlab_register_schedulers(register: "Registry") -> None:
    """Register scheduler factories (objects following :class:`schedlab.protocols.Scheduler`).

    :param register: call ``register(name, factory, config=ConfigClass, help="...")``;
        ``factory(config)`` must return a new scheduler. A duplicate name raises.
    """


@hookspec
def schedlab_register_cost_models(register: "Registry") -> None:
    """Register cost models (objects following :class:`schedlab.protocols.CostModel`).

    :param register: call ``register(name, factory, config=ConfigClass, help="...")``;
        ``factory(config)`` must return a new cost model; a factory with a ``presets``
        parameter also receives the model and GPU presets, one with a ``parallelism``
        parameter the run's data/pipeline layout (:class:`schedlab.parallelism.Parallelism`,
        to time it: ``rank_ms``, ``experts_ms``, ``pipeline_ms``). A duplicate name raises.
    """


@hookspec
def schedlab_register_kv_caches(register: "Registry") -> None:
    """Register KV caches (objects following :class:`schedlab.protocols.KVCache`).

    :param register: call ``register(name, factory, config=ConfigClass, help="...")``;
        ``factory(config)`` must return a new cache; a factory with a ``presets`` parameter
        also receives the model and GPU presets, so a cache can size itself from them, and
        one with a ``parallelism`` parameter the run's data/pipeline layout (what one rank
        or stage holds).
        A duplicate name raises.

    ``num_blocks`` is the usable capacity: the engines reject, stall and preempt against it, so
    blocks held back (a reserve) are modelled by lowering it. ``check_invariants()`` is optional
    for runs; the conformance kit's ``check_run`` calls it when the cache has one.
    """


@hookspec
def schedlab_register_workloads(register: "Registry") -> None:
    """Register workload sources (objects following :class:`schedlab.protocols.Workload`).

    :param register: call ``register(name, factory, config=ConfigClass, help="...")``;
        ``factory(config)`` must return a new workload. A duplicate name raises.
    """


@hookspec
def schedlab_register_routers(register: "Registry") -> None:
    """Register routers that spread requests over several instances
    (objects following :class:`schedlab.protocols.Router`).

    A router sees each instance only through a view (:class:`schedlab.engine.load.InstanceView`)
    as it is at the arrival's time -- ``outstanding``, ``waiting``, ``running``, ``in_iteration``
    and the KV gauge ``kv`` (``num_used_blocks()``, ``num_free_blocks()``, ``num_blocks``,
    ``usage``) -- each read O(1); it never sees what an iteration in progress will finish. That is
    all the state it may read, with what it keeps itself. The views come in a pool
    (:class:`schedlab.engine.pool.ViewPool`, a list) whose ``least_by(key, members)`` gives the
    least loaded instance in O(log N) and whose ``now`` is the routing time (a decode pool's
    router is asked at the handoff, after the prefill; ``routing_time(request, instances)``); a router should cost O(1) or O(log N) per request -- a
    scan of all N views makes a large cluster's every arrival O(N).

    :param register: call ``register(name, factory, config=ConfigClass, help="...")``;
        ``factory(config)`` must return a new router. A duplicate name raises.
    """


@hookspec
def schedlab_register_autoscalers(register: "Registry") -> None:
    """Register autoscaling policies (objects following :class:`schedlab.protocols.Autoscaler`),
    chosen by ``[cluster] autoscaler = {kind = ...}``.

    A policy is asked at every decision time how many instances should serve, from the
    :class:`schedlab.engine.scaling.Signals` of that moment (queue lengths, KV usage, SLO
    attainment over a window); the engine keeps the answer within the config's
    ``min_instances``/``max_instances``, warms new instances for ``cold_start_s`` before they
    serve and drains the ones it removes.

    :param register: call ``register(name, factory, config=ConfigClass, help="...")``;
        ``factory(config)`` must return a new policy. The config must have the keys of
        ``schedlab_plugins.autoscalers.ScalingConfig`` (subclass it). A duplicate name raises.
    """


@hookspec
def schedlab_register_reports(register: "Registry") -> None:
    """Register report writers (objects following :class:`schedlab.protocols.Report`).

    :param register: call ``register(name, factory, config=ConfigClass, help="...")``;
        ``factory(config)`` must return an object whose ``write(results, out_dir)`` writes
        files for a finished experiment. A duplicate name raises. A config class with a method
        ``check_studies(studies)`` has settings that name runs, swept keys or metrics checked
        when the experiment file is read (it raises ConfigError or FieldError; each study has
        ``name``, ``kind``, ``keys``, ``has_slo()`` and ``has_power()``:
        :func:`schedlab.study.experiment.check_report_studies`).
    """


@hookspec
def schedlab_register_power_models(register: "Registry") -> None:
    """Register power models (objects following :class:`schedlab.protocols.PowerModel`): the
    power an instance's GPUs draw in each iteration and between iterations (``[power]``).

    :param register: call ``register(name, factory, config=ConfigClass, help="...")``;
        ``factory(config)`` must return a new power model for one instance. A factory with a
        ``presets`` parameter also receives the model and GPU presets, one with a
        ``cost_model`` parameter the instance's cost model (whose ``work`` tells the bytes
        and FLOPs of an iteration), one with ``tensor_parallel`` the GPUs of the instance.
        A duplicate name raises. ``[power]`` keys such as ``host_idle_w``, ``host_busy_w`` and
        ``pue`` are the built-ins' (``schedlab_plugins.power.common.PowerSettings``): a config
        takes them by declaring them (subclass it), and the model has them as attributes.
    """


@hookspec
def schedlab_register_models(register: "Registry") -> None:
    """Register model presets used to size KV caches and cost models.

    :param register: call ``register(name, spec)`` with a :class:`schedlab.capacity.ModelSpec`.
        A duplicate name raises.
    """


@hookspec
def schedlab_register_gpus(register: "Registry") -> None:
    """Register accelerator presets (memory, bandwidths, compute).

    :param register: call ``register(name, spec)`` with a :class:`schedlab.capacity.GpuSpec`.
        A duplicate name raises.
    """


# --- observation: coarse points of a run ---------------------------------------------------


@hookspec
def schedlab_run_started(run_name: str, settings: dict[str, Any]) -> None:
    """Called before a run is simulated.

    Always in the process that runs ``schedlab``, also when simulations run in worker
    processes or on Ray (``--jobs``, ``--backend``): then when the simulation is handed out,
    and ``schedlab_run_finished`` when its result comes back. Every simulation is announced:
    each replica (``name#2``) and a parallel search's speculative probes too.

    :param run_name: the run's name in the experiment (sweep points carry their values).
    :param settings: the run's resolved tables (``workload``, ``scheduler``, ...).
    """


@hookspec
def schedlab_run_finished(run_name: str, result: Any) -> None:
    """Called after a run finished, with its :class:`schedlab.results.RunResult`.

    The hook observes: a run whose result it changed (a metric, a request's row) ends in an error
    naming the hook's plugin, as the reports and tables would otherwise show the changed values.

    :param run_name: the run's name.
    :param result: per-request arrays and run metrics.
    """


@hookspec
def schedlab_iteration(instance: int, record: Any) -> None:
    """Called after every engine iteration -- opt-in and slow.

    Implementing this hook makes the engine run one iteration at a time (no bulk decode
    runs) so that every iteration can be observed. Leave it unimplemented for speed. The fast
    engine calls it; a run on the reference engine with it is refused (it would go unobserved).

    :param instance: index of the instance that ran the iteration.
    :param record: a :class:`schedlab.engine.IterationRecord` (start, duration, batch shape).
    """
