"""The ``fixed_active`` power model: LLMServingSim 2.0's, for comparison.

A GPU draws ``active_w`` while a kernel runs, whatever the batch; ``standby_w`` for
``standby_s`` after its last one; then ``idle_w`` (LLMServingSim 2.0, ``serving/core/power``:
``idle_power``, ``standby_power``, ``active_power``, ``standby_duration`` per NPU; its A6000
node was fitted at 33, 89 and 300 W and 18 s -- ``calibration/energy/llmservingsim-power/config``).
Standby defaults to the level the other models hold an awake GPU at (idle plus the awake share of
the headroom: 89 W on the A6000, where it is measured), not to idle, which would leave
LLMServingSim's standby out.
A fixed active power cannot follow the batch: memory-bound decode at a small batch draws well
below the board limit on most GPUs, large batches near it. LLMServingSim drops from active to
standby power at once, so ``tail_s`` is 0 here unless set. It does not read the SM clock: with
a ``[clock]`` below the highest a warning says so (:func:`.common.warn_clock_unread`).
"""

from __future__ import annotations

import attrs

from schedlab.engine.bulk import run_ms
from schedlab.capacity import Presets
from schedlab.configs import MAX_TENSOR_PARALLEL, float_field, int_field, str_field
from schedlab.errors import ConfigError
from schedlab.protocols import Batch

from .additive import awake_share
from .common import PowerSettings, board_and_idle, host_fields, host_ranks, resolve_gpu, resolve_tp, warn_clock_unread


@attrs.frozen
class FixedActiveConfig(PowerSettings):
    """Settings of the ``fixed_active`` power model (per GPU; defaults from the GPU preset)."""

    gpu: str | None = str_field(None, optional=True, help="GPU preset (default: the cost model's)")
    tensor_parallel: int | None = int_field(None, min=1, max=MAX_TENSOR_PARALLEL, optional=True,
                                            help="GPUs per instance (default: the cost model's)")
    active_w: float | None = float_field(None, min=0.0, optional=True,
                                         help="power while an iteration runs, W (default: the board limit)")
    standby_w: float | None = float_field(None, min=0.0, optional=True,
                                          help="power for standby_s after an iteration, W (default: idle_w + the "
                                               "awake share of the GPU's board limit - idle_w, as the other models' "
                                               "standby: measured where the GPU's is; active_w stands for the board "
                                               "where no GPU preset is named)")
    idle_w: float | None = float_field(None, min=0.0, optional=True, help="idle power, W (default: the GPU preset's)")
    tail_s: float = float_field(0.0, min=0.0, help="time constant (s) of the power's fall from active to standby "
                                                   "(LLMServingSim's: 0, at once)")


class FixedActivePowerModel:
    """A fixed power while busy, standby for a while after, then idle (see the module docstring)."""

    def __init__(self, config: FixedActiveConfig, tensor_parallel: int, *, active_w: float, standby_w: float,
                 idle_w: float, gpu: str = "", host_ranks: int = 1):
        self.config = config
        self.tp = tensor_parallel
        self.gpu = gpu
        self.active_w = active_w
        self.idle_w = tensor_parallel * idle_w
        self.standby_w = tensor_parallel * standby_w
        self.standby_ms = config.standby_s * 1e3
        self.tail_ms = config.tail_s * 1e3
        self.host_ranks = host_ranks  # data-parallel ranks sharing the host: each draws its share
        self.host_idle_w, self.host_busy_w = config.host_idle_w / host_ranks, config.host_busy_w / host_ranks
        self.pue = config.pue
        self._per_ms = tensor_parallel * active_w * 1e-3

    def iteration_j(self, batch: Batch, duration_ms: float) -> float:
        return self._per_ms * duration_ms

    def run_j(self, batch: Batch, k: int, d0: float, inc: float) -> float:
        return self._per_ms * run_ms(k, d0, inc)

    def describe(self) -> dict:
        return {"kind": "fixed_active", "gpu": self.gpu, "tensor_parallel": self.tp, "active_w": self.active_w,
                "standby_w": self.standby_w / self.tp, "idle_w": self.idle_w / self.tp,
                "standby_s": self.config.standby_s, **host_fields(self.config, self.host_ranks)}


def build_fixed_active(config: FixedActiveConfig, presets: Presets | None = None, cost_model=None,
                       tensor_parallel: int | None = None) -> FixedActivePowerModel:
    tp = resolve_tp(config.tensor_parallel, cost_model, tensor_parallel)
    if config.active_w is not None and config.idle_w is not None:
        active, idle, name = config.active_w, config.idle_w, config.gpu or ""
        board = active   # (the board limit, where no GPU preset names it: what a busy GPU draws here)
        if config.standby_w is None and (config.gpu is not None or cost_model is not None):
            try:   # the standby's share is of the preset's headroom, as the other models'
                gpu = resolve_gpu(config.gpu, cost_model, presets, "fixed_active")
                board, name = gpu.board_w or active, gpu.name
            except ConfigError:
                pass
    else:
        gpu = resolve_gpu(config.gpu, cost_model, presets, "fixed_active")
        board, idle, _ = board_and_idle(gpu, None, config.idle_w, "fixed_active")
        active, name = (config.active_w if config.active_w is not None else board), gpu.name
    if config.standby_w is not None:
        standby = config.standby_w
    else:   # LLMServingSim's standby level (89 W on its A6000), the other models' awake share of the headroom
        share, _ = awake_share(None, name, board, idle)
        standby = idle + share * max(0.0, board - idle)
    if active < idle:  # (found by fuzzing: taken as given, a busy GPU drew less than an idle one)
        raise ConfigError(f"active_w ({active:g} W) is below idle_w ({idle:g} W): a GPU draws more running a kernel "
                          "than idle; set active_w to at least idle_w")
    if config.standby_w is None:  # (derived from the board's headroom: no more than what a busy GPU draws here)
        standby = min(standby, active)
    if not idle <= standby <= active:  # (energy review s79: 10 W or 5 kW of standby were taken as given)
        raise ConfigError(f"standby_w ({standby:g} W) must lie between idle ({idle:g} W) and active ({active:g} W): "
                          "a GPU that has just worked draws at least what an idle one does, and no more than a "
                          "busy one")
    warn_clock_unread(cost_model, "fixed_active", "it draws active_w in every iteration")
    return FixedActivePowerModel(config, tp, active_w=active, standby_w=standby, idle_w=idle, gpu=name,
                                 host_ranks=host_ranks(cost_model, config))
