"""What every built-in power model shares: the host and facility settings, and finding the GPU
and tensor-parallel degree of the instance from the power table or the instance's cost model."""

from __future__ import annotations

import warnings

import attrs

from schedlab.capacity import GpuSpec, Presets
from schedlab.configs import float_field
from schedlab.errors import ConfigError, InputWarning

#: Share of the board limit an idle GPU draws when its preset gives no measured idle power: the
#: A6000's measured 33 of 300 W (11%), rounded up -- an estimate, said so in the results.
IDLE_SHARE_OF_BOARD = 0.12
#: How long NVIDIA's driver keeps a GPU's clocks up after its last kernel: the A6000 of
#: LLMServingSim 2.0's traces holds ~89 W for ~18 s after each pulse (its ``standby_duration``).
STANDBY_S = 18.0
#: The time constant of the tail after the last iteration (:mod:`schedlab.energy.idle`): what
#: ``python tools/derive_roofline.py power`` fitted to the A6000 TP-2 trace's pulse ends.
TAIL_S = 0.61


@attrs.frozen
class PowerSettings:
    """Settings every built-in power model has (the host beside the GPUs, the facility)."""

    host_idle_w: float = float_field(0.0, min=0.0, help="host power per deployment drawn all the time (CPU, DRAM, "
                                                          "NIC, storage at idle), W: an instance's, or a data-parallel "
                                                          "deployment's ranks' together (one host)")
    host_busy_w: float = float_field(0.0, min=0.0, help="more host power per deployment while iterations run "
                                                          "(CPU scheduling, DRAM traffic), W; data-parallel ranks "
                                                          "each add their share while they run")
    pue: float = float_field(1.0, min=1.0, help="power usage effectiveness: facility energy = IT energy x pue")
    standby_s: float = float_field(STANDBY_S, min=0.0, help="seconds the GPU keeps its clocks up (standby power) "
                                                              "after its last iteration before it idles")
    tail_s: float = float_field(TAIL_S, min=0.0, help="time constant (s) of the power's fall from the last "
                                                      "iteration's to standby (0: at once)")


def host_fields(config: PowerSettings, ranks: int = 1) -> dict:
    """The settings every built-in describes alike: host (a deployment's; with ``ranks`` > 1 the
    data-parallel ranks sharing it, :func:`host_ranks`), facility, the tail."""
    return {"host_idle_w": config.host_idle_w, "host_busy_w": config.host_busy_w,
            **({"host_ranks": ranks} if ranks > 1 else {}), "pue": config.pue, "tail_s": config.tail_s}


def _layers(cost_model):
    """The instance's cost model and the ones it wraps (the clock's and speculative decoding's
    wrappers hold theirs as ``inner`` and ``target``)."""
    while cost_model is not None:
        yield cost_model
        cost_model = getattr(cost_model, "inner", None) or getattr(cost_model, "target", None)


def cost_setting(cost_model, name: str):
    """A setting of the instance's cost model (looking through wrappers), or None."""
    for layer in _layers(cost_model):
        value = getattr(getattr(layer, "config", None), name, None)
        if value is not None:
            return value
    return None


def find_member(cost_model, name: str):
    """The first of the instance's cost model layers that has ``name`` (a method), or None."""
    for layer in _layers(cost_model):
        member = getattr(layer, name, None)
        if member is not None:
            return member
    return None


def find_clock(cost_model):
    """The clock wrapper among the instance's cost model layers (it has ``clock_ratio``), or None."""
    for layer in _layers(cost_model):
        if callable(getattr(layer, "clock_ratio", None)):
            return layer
    return None


def host_ranks(cost_model, config: PowerSettings) -> int:
    """How many instances share one host: a data-parallel deployment's ranks (``[cluster]
    data_parallel = D``: one vLLM server, ``--data-parallel-size D``, on one host), each of whose
    power models then carries ``1 / D`` of ``host_idle_w`` and ``host_busy_w`` -- so a deployment
    draws one host's idle power, as a tensor-parallel or pipelined instance does, whether its ranks
    step together (a MoE model's) or are independent instances (a dense model's); else 1. The
    layout is the cost model's (``parallelism``: the roofline's and the profiled model's). A
    lockstep rank whose cost model keeps no layout is refused when the host has power: its share
    is unknown."""
    for layer in _layers(cost_model):
        layout = getattr(layer, "parallelism", None)
        ranks = getattr(layout, "data_parallel", None)
        if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1:
            return ranks
    from schedlab.engine.rank_cost import RankCost

    if isinstance(cost_model, RankCost) and (config.host_idle_w or config.host_busy_w):
        raise ConfigError(f"host_idle_w, host_busy_w: a data-parallel deployment's ranks share one host, but the cost "
                          f"model {type(cost_model.inner).__name__} does not say how many ranks there are (its "
                          "parallelism); the roofline and profiled cost models do")
    return 1


def warn_clock_unread(cost_model, kind: str, reads: str) -> None:
    """Say (an :class:`InputWarning`) when the instance runs under a ``[clock]`` that can take it
    below the highest clock and its power model, ``kind``, does not read the clock: the clock then
    only stretches the compute-bound iterations, whose energy -- power by batch size or a fixed
    active power, times their time -- rises where the clock law says it falls (only ``utilisation``
    applies the law's power factors). As a drafter whose work the clock cannot split is named, the
    setting that does nothing is named: ``[clock]``'s and ``[power] kind``'s. A ``[clock]`` at the
    highest clock changes nothing: no word. ``reads``: what the model's power follows instead."""
    clock = find_clock(cost_model)
    if clock is None:
        return
    fixed = getattr(clock, "fixed", None)
    if fixed is not None and fixed >= 1.0:
        return
    mhz = getattr(getattr(clock, "config", None), "mhz", None)
    setting = 'policy = "slo"' if fixed is None else f"mhz = {mhz:g}" if mhz is not None else "a locked clock"
    warnings.warn(f"[clock] {setting} with [power] kind = \"{kind}\": the {kind} power model does not read the SM "
                  f"clock ({reads}), so a lower clock only makes the compute-bound iterations longer and their energy "
                  "higher, where the clock law says it falls; use [power] kind = \"utilisation\", which applies the "
                  "clock's power factors", InputWarning, stacklevel=3)


def resolve_gpu(name: str | None, cost_model, presets: Presets | None, kind: str,
                what: str = "[power] gpu") -> GpuSpec:
    """The GPU preset the power table names, else the one the instance's cost model uses; an
    :class:`InputWarning` when both name one and they differ (``what`` names the table's: energy
    metered for another GPU than the one the steps are timed on is neither's)."""
    timed = cost_setting(cost_model, "gpu")
    name = name or timed
    if name is None:
        raise ConfigError(f"the {kind} power model needs the GPU: set gpu = \"...\" in [power] (the cost model "
                          "names none)")
    if presets is None:
        raise ConfigError(f"the {kind} power model needs the GPU presets to look up {name!r}")
    gpu = presets.gpu(name)
    if timed is not None and name != timed and presets.gpu(timed).name != gpu.name:
        advice = ("a fit holds what one GPU drew: take one of the cost model's GPU, or give points"
                  if what.startswith("the fit") else "leave gpu out of [power] to take the cost model's")
        warnings.warn(f"{what} is {gpu.name!r}, and the cost model times the steps on {presets.gpu(timed).name!r}: "
                      f"the energy is metered for another GPU than the timing ({advice})", InputWarning, stacklevel=2)
    return gpu


def resolve_tp(table_value: int | None, cost_model, layout_value: int | None = None) -> int:
    """GPUs of the instance: the power table's tensor_parallel, else the layout's (the assembly's
    for a rank or a stage), else the cost model's, else 1; an :class:`InputWarning` when the table's
    and the cost model's differ (GPU-hours count the cost model's)."""
    timed = cost_setting(cost_model, "tensor_parallel")
    if table_value is not None:
        if timed is not None and int(timed) != table_value:
            warnings.warn(f"[power] tensor_parallel = {table_value} meters {table_value} GPUs an instance, and the "
                          f"cost model spreads it over {int(timed)} (GPU-hours count those): leave tensor_parallel "
                          "out of [power] to take the cost model's", InputWarning, stacklevel=2)
        return table_value
    if layout_value is not None:
        return layout_value
    return int(timed or 1)


def board_and_idle(gpu: GpuSpec, board_w: float | None, idle_w: float | None, kind: str) -> tuple[float, float, str]:
    """``(board W, idle W, where idle came from)`` of one GPU: the table's numbers, else the preset's."""
    board = board_w if board_w is not None else gpu.board_w
    if board is None:
        raise ConfigError(f"the {kind} power model needs the board power limit of GPU {gpu.name!r}: its preset has "
                          "none; set board_w in [power]")
    if idle_w is not None:
        idle, source = idle_w, "power table"
    elif gpu.idle_w is not None:
        idle, source = gpu.idle_w, "GPU preset"
    else:
        idle, source = IDLE_SHARE_OF_BOARD * board, f"estimate: {IDLE_SHARE_OF_BOARD:.0%} of board_w"
    if not idle < board:
        raise ConfigError(f"GPU {gpu.name!r}: idle power {idle:g} W must be below the board limit {board:g} W")
    return float(board), float(idle), source
