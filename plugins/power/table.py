"""The ``table`` power model: power per GPU looked up in a measured table.

``points = [[x, watts], ...]`` with ``x`` the iteration's sequences (``by = "sequences"``) or
batched tokens (``by = "tokens"``), interpolated linearly between points and held at the
ends; an iteration's energy is that power times its duration. Idle stretches: ``standby_w`` for
``standby_s``, then ``idle_w``. A table holds what one engine, model and GPU drew -- measure
your own (average GPU power over a steady batch), or use a shipped fit (``fit = "..."``,
:data:`schedlab_plugins.power.fits.FITS`, derived from ML.ENERGY's measurements by
``tools/derive_roofline.py``). A table holds power at the clock it was measured at: it does not
read the SM clock, and with a ``[clock]`` below the highest a warning says so
(:func:`.common.warn_clock_unread`).
"""

from __future__ import annotations

import warnings
from bisect import bisect_right

import attrs

from schedlab.capacity import Presets
from schedlab.configs import MAX_TENSOR_PARALLEL, FieldError, float_field, int_field, str_field
from schedlab.engine.bulk import run_ms
from schedlab.errors import ConfigError, InputWarning, UnknownPluginError
from schedlab.protocols import Batch

from .common import PowerSettings, board_and_idle, host_fields, host_ranks, resolve_gpu, resolve_tp, warn_clock_unread
from .fits import FITS
from .utilisation import DERIVATION

BY = ("sequences", "tokens")


def _check_points(_inst, attribute, value):
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or not value:
        raise FieldError(attribute.name, "must be a list of [x, watts] pairs, e.g. [[1, 120], [64, 250]]")
    last = None
    for point in value:
        if (not isinstance(point, (list, tuple)) or len(point) != 2
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in point)):
            raise FieldError(attribute.name, f"each point must be [x, watts], got {point!r}")
        if point[0] < 0 or point[1] < 0:
            raise FieldError(attribute.name, f"x and watts must be >= 0, got {list(point)}")
        if last is not None and not point[0] > last:
            raise FieldError(attribute.name, f"x must increase from point to point, got {point[0]} after {last}")
        last = point[0]


@attrs.frozen
class TableConfig(PowerSettings):
    """Settings of the ``table`` power model."""

    points: tuple | None = attrs.field(default=None, converter=lambda v: None if v is None else tuple(map(tuple, v)),
                                       validator=_check_points,
                                       metadata={"help": "[[x, watts per GPU], ...]: measured power against x"})
    fit: str | None = str_field(None, optional=True, help=f"a shipped table instead of points: {', '.join(FITS)}")
    by: str | None = str_field(None, optional=True, choices=BY,
                               help="what x counts: the iteration's sequences or its batched tokens "
                                    "(default: sequences, or the fit's)")
    gpu: str | None = str_field(None, optional=True, help="GPU preset, for idle power (default: the cost model's)")
    tensor_parallel: int | None = int_field(None, min=1, max=MAX_TENSOR_PARALLEL, optional=True,
                                            help="GPUs per instance (default: the cost model's)")
    idle_w: float | None = float_field(None, min=0.0, optional=True,
                                       help="idle power per GPU, W (default: the preset's)")
    standby_w: float | None = float_field(
        None, min=0.0, optional=True,
        help="standby power per GPU, W (default: the utilisation model's awake share, at most the busiest point)")

    def __attrs_post_init__(self):
        if (self.points is None) == (self.fit is None):
            raise FieldError("points", "give either points = [[x, watts], ...] or fit = \"...\" (one of them)")
        if self.fit is not None and self.fit not in FITS:
            raise FieldError("fit", f"unknown fit {self.fit!r}; shipped fits: {', '.join(FITS)}")


class TablePowerModel:
    """Power per GPU interpolated in a table of ``x`` (see the module docstring)."""

    def __init__(self, config: TableConfig, tensor_parallel: int, points, by: str, *, idle_w: float,
                 standby_w: float, source: str = "", host_ranks: int = 1):
        self.config = config
        self.tp = tensor_parallel
        self.by = by
        self.xs = [float(x) for x, _ in points]
        self.ws = [float(w) for _, w in points]
        self.source = source
        self.idle_w = tensor_parallel * idle_w
        self.standby_w = tensor_parallel * standby_w
        self.standby_ms = config.standby_s * 1e3
        self.tail_ms = config.tail_s * 1e3
        self.host_ranks = host_ranks  # data-parallel ranks sharing the host: each draws its share
        self.host_idle_w, self.host_busy_w = config.host_idle_w / host_ranks, config.host_busy_w / host_ranks
        self.pue = config.pue

    def watts(self, x: float) -> float:
        """Power per GPU at ``x`` (linear between points, held beyond the ends)."""
        xs, ws = self.xs, self.ws
        if x <= xs[0]:
            return ws[0]
        if x >= xs[-1]:
            return ws[-1]
        i = bisect_right(xs, x)
        x0, x1, w0, w1 = xs[i - 1], xs[i], ws[i - 1], ws[i]
        return w0 + (w1 - w0) * (x - x0) / (x1 - x0)

    def _x(self, batch: Batch) -> float:
        return batch.num_seqs if self.by == "sequences" else batch.num_batched_tokens

    def iteration_j(self, batch: Batch, duration_ms: float) -> float:
        return self.tp * self.watts(self._x(batch)) * duration_ms * 1e-3

    def run_j(self, batch: Batch, k: int, d0: float, inc: float) -> float:
        return self.tp * self.watts(self._x(batch)) * run_ms(k, d0, inc) * 1e-3  # x does not change in a run

    def describe(self) -> dict:
        return {"kind": "table", "by": self.by, "points": [list(p) for p in zip(self.xs, self.ws)],
                "source": self.source, "tensor_parallel": self.tp, "idle_w": self.idle_w / self.tp,
                "standby_w": self.standby_w / self.tp, "standby_s": self.config.standby_s,
                **host_fields(self.config, self.host_ranks)}


def build_table(config: TableConfig, presets: Presets | None = None, cost_model=None,
                tensor_parallel: int | None = None) -> TablePowerModel:
    tp = resolve_tp(config.tensor_parallel, cost_model, tensor_parallel)
    if config.fit is not None:
        fit = FITS[config.fit]
        points, by, source, gpu_name = fit["points"], config.by or fit["by"], fit["source"], config.gpu or fit["gpu"]
    else:
        points, by, source, gpu_name = config.points, config.by or "sequences", "power table", config.gpu
    what = f"the fit's GPU ({config.fit})" if config.fit is not None and config.gpu is None else "[power] gpu"
    board = None
    if config.idle_w is not None and config.standby_w is not None:
        idle, standby = config.idle_w, config.standby_w
        if gpu_name is not None and presets is not None:  # (checked against the cost model's all the same; a
            try:                                          # name no preset has is a label here, as before)
                board = resolve_gpu(gpu_name, cost_model, presets, "table", what).board_w
            except (ConfigError, UnknownPluginError):
                board = None
    else:
        try:
            gpu = resolve_gpu(gpu_name, cost_model, presets, "table", what)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or set idle_w and standby_w)") from None
        board, idle, _ = board_and_idle(gpu, None, config.idle_w, "table")
        # (derived from the board's headroom: no more than the table's busiest point, as fixed_active
        # caps it at active_w -- review energy82: 198 W of standby beside a table of 120-180 W)
        standby = (config.standby_w if config.standby_w is not None
                   else min(idle + DERIVATION["awake"] * (board - idle), max(p[1] for p in points)))
    _check_watts(points, idle, standby, board)
    warn_clock_unread(cost_model, "table", "its power follows the batch's size only")
    if config.fit is not None and "cycle_ms" in FITS[config.fit]:
        _warn_slower_engine(config.fit, cost_model)
    return TablePowerModel(config, tp, points, by, idle_w=idle, standby_w=standby, source=source,
                           host_ranks=host_ranks(cost_model, config))


def _check_watts(points, idle: float, standby: float, board: float | None) -> None:
    """Refuse a busy GPU drawing less than an idle one, or a standby below idle (per GPU, as the
    points are); warn of a point past the GPU's board limit (energy review s79: taken as given, a
    table of 10-20 W beside an idle 84 W, or 2,000 W on a 700 W board, ran without a word)."""
    low = min(points, key=lambda p: p[1])
    if low[1] < idle:
        raise ConfigError(f"points: a busy GPU draws {low[1]:g} W at {low[0]:g}, below its idle power {idle:g} W (W "
                          "per GPU): a GPU draws more running kernels than idle; check the points, or set idle_w")
    if standby < idle:
        raise ConfigError(f"standby_w ({standby:g} W) is below the idle power ({idle:g} W): a GPU that has just "
                          "worked draws at least what an idle one does")
    high = max(points, key=lambda p: p[1])
    if board is not None and high[1] > board:
        warnings.warn(f"points: {high[1]:g} W at {high[0]:g} is past the GPU's board limit of {board:g} W "
                      "(points are W per GPU)", InputWarning, stacklevel=3)


def _warn_slower_engine(name: str, cost_model) -> None:
    """Say (an :class:`InputWarning`) when a shipped fit measured on a CPU-bound engine (its
    points' ``cycle_ms``, :mod:`.fits`) prices a cost model whose decode step at the fit's first
    batch takes under half that cycle: the fit's power is a mostly waiting GPU's, the steps are
    a busy one's, so energy per token comes out low."""
    import warnings

    from schedlab.errors import InputWarning

    iteration_ms = getattr(cost_model, "iteration_ms", None)
    if iteration_ms is None:
        return
    fit = FITS[name]
    n = max(1, round(fit["points"][0][0]))
    step = iteration_ms(Batch(num_decode=n, decode_context_tokens=n * 500))
    cycle = fit["cycle_ms"][0]
    if step < 0.5 * cycle:
        warnings.warn(f"[power] fit = \"{name}\" was measured on vLLM 0.5.4, CPU-bound (a {cycle:g} ms cycle at a "
                      f"batch of {n}), and this cost model's decode step there takes {step:.1f} ms: its power is a "
                      "mostly waiting GPU's, so energy per token comes out low (the H100 fit's 305 W at its first "
                      "point, a batch of 64, is 41% under ML.ENERGY v3's 514 W for Qwen3-8B chat there); the "
                      "mlenergy-v3-* fits were measured on vLLM 0.11", InputWarning, stacklevel=3)
