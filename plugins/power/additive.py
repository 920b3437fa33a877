"""The ``additive`` power model: an energy roofline -- bytes moved and FLOPs each cost energy, and
the costs add even where their times overlap.

Per GPU, during an iteration that lasts ``d`` ms and (by the cost model's ``work``) reads
``bytes`` and computes ``flops``, in energy::

    E = idle x d + min(awake x (board - idle) x d + e_byte x bytes + e_flop x flops,
                       (board - idle) x (k + awake x (d - k)))

-- a static level (the idle power and the awake share of the headroom, paid for the whole step),
plus an energy per byte moved and per FLOP, held to the board limit over the kernels' time ``k``
and the awake share over the host's (as the ``utilisation`` model's cap, ``kernel_ms``). This is
Choi, Bedard, Fowler and Vuduc's energy roofline ("A roofline model of energy", IPDPS 2013:
energy = per-operation cost x operations + per-word cost x words + constant power x time; "time
can be overlapped while energy cannot"), where the ``utilisation`` model prices each phase by the
larger of its two times. A phase that saturates both bandwidth and compute costs both here.

The coefficients per GPU:

* ``e_byte`` -- by the GPU's memory technology (:data:`MEMORY_TECH`, from the datasheets): one
  energy per byte for the HBM parts (HBM2e, HBM3, HBM3e) and one for the GDDR parts (GDDR6,
  GDDR6X, GDDR7), fitted (:data:`DERIVATION`). It is the whole board's extra energy per byte a
  kernel streams -- DRAM core and interface, the L2 and crossbar, the SMs' loads -- not the DRAM's
  pJ/bit alone. A GPU with no known technology needs ``memory_pj_per_byte`` set.
* ``e_flop`` -- ``compute`` x (board - idle) / peak bf16 FLOP/s: datasheet numbers scaled by one
  fitted share (the share of the headroom the tensor cores alone would draw at their peak), so
  each generation's energy per FLOP follows its datasheet's FLOPs per watt.
* ``awake`` -- a fitted share of (board - idle), also the standby level after the last iteration.

:data:`DERIVATION` says what ``python tools/derive_roofline.py power`` fitted, on which training
set; the README's Energy validation reports the held-out points apart.

Energy is exact over a bulk decode run in closed form: every term is linear in the step, so each
piece between the cap's crossings is an arithmetic series (the ``utilisation`` model's
:meth:`~.utilisation.UtilisationPowerModel.run_j`, with the phases' costs added instead of their
larger time). The clock law (``[clock]``) scales the awake share and the bytes' and FLOPs'
energy as it scales the ``utilisation`` model's awake share and activity.
"""

from __future__ import annotations

import attrs

from schedlab.capacity import Presets
from schedlab.configs import float_field
from schedlab.errors import ConfigError

from .common import host_fields
from .utilisation import GpuPowerSettings, UtilisationConfig, UtilisationPowerModel, build_utilisation

#: GPU preset -> memory technology (the datasheets: A100 SXM4 HBM2e; H100 SXM5 HBM3, H100 PCIe
#: HBM2e; H200 and B200 HBM3e; GH200 96 GB HBM3; L4, L40S, A40, A10G and RTX A6000 GDDR6; RTX 4090
#: GDDR6X; RTX PRO 6000 Blackwell GDDR7)
MEMORY_TECH = {
    "a100-40gb": "HBM2e", "a100-80gb": "HBM2e", "h100-80gb": "HBM3", "h100-pcie-80gb": "HBM2e",
    "h200-141gb": "HBM3e", "gh200-96gb": "HBM3", "b200": "HBM3e",
    "l4": "GDDR6", "l40s": "GDDR6", "a40": "GDDR6", "a10g": "GDDR6", "rtx-a6000": "GDDR6", "rtx-4090": "GDDR6X",
    "rtx-pro-6000": "GDDR7", "rtx-pro-6000-server": "GDDR7",
}

#: What ``python tools/derive_roofline.py power`` printed for the additive model (its docstring
#: and the README's Energy validation say the training and held-out sets).
DERIVATION = {"awake": 0.136, "hbm_pj_per_byte": 124.1, "gddr_pj_per_byte": 310.1, "compute": 2.77}


#: GPU preset -> (standby power per GPU measured with the model loaded and clocks up, W; where):
#: only where measured -- elsewhere the awake share is the fitted one, labelled an estimate
MEASURED_STANDBY_W = {
    "rtx-a6000": (89.0, "LLMServingSim 2.0's power_config_tp*.json standby_power (89 W); nvidia-smi's plateau "
                        "after the TP-1 trace's three pulses reads 88.9-91.4 W (experiments/data/energy/"
                        "llmservingsim-power)"),
}


def awake_share(awake: float | None, gpu_name: str, board_w: float, idle_w: float) -> tuple[float, str]:
    """The awake share and where it comes from: set (``awake``), measured (:data:`MEASURED_STANDBY_W`),
    or the fitted share (an estimate)."""
    if awake is not None:
        return awake, "set"
    if gpu_name in MEASURED_STANDBY_W and board_w > idle_w:
        watts, where = MEASURED_STANDBY_W[gpu_name]
        return min(1.0, max(0.0, (watts - idle_w) / (board_w - idle_w))), f"measured: {where}"
    return DERIVATION["awake"], "estimate: the fitted share (tools/derive_roofline.py power)"


def memory_family(gpu_name: str) -> str | None:
    """``"hbm"`` or ``"gddr"`` for a GPU preset (None: unknown)."""
    tech = MEMORY_TECH.get(gpu_name)
    return None if tech is None else ("hbm" if tech.startswith("HBM") else "gddr")


@attrs.frozen
class AdditiveConfig(GpuPowerSettings):
    """Settings of the ``additive`` power model (defaults: GPU presets and :data:`DERIVATION`)."""

    awake: float | None = float_field(None, min=0.0, max=1.0, optional=True,
                                      help="share of (board - idle) an awake GPU draws with no kernel running, also "
                                           "its standby (default: measured per GPU where it was, else the fitted "
                                           "share -- an estimate)")
    memory_pj_per_byte: float | None = float_field(
        None, min=0.0, optional=True,
        help="energy per byte moved, pJ (default: by the GPU's memory technology, HBM or GDDR)")
    compute: float = float_field(DERIVATION["compute"], min=0.0,
                                 help="share of (board - idle) the FLOPs alone draw at the peak bf16 rate "
                                      "(energy per FLOP = compute x (board - idle) / peak)")


class AdditivePowerModel(UtilisationPowerModel):
    """The energy roofline (module docstring): the ``utilisation`` model's machinery -- cap,
    clock, standby, tail, closed-form runs -- with the bytes' and FLOPs' energy added."""

    def __init__(self, config: AdditiveConfig, gpu, tensor_parallel: int, work, *, pj_per_byte: float, **kw):
        self.awake, self.awake_source = awake_share(config.awake, gpu.name, kw["board_w"], kw["idle_w"])
        super().__init__(attrs.evolve(config, awake=self.awake), gpu, tensor_parallel, work, **kw)
        self.pj_per_byte = pj_per_byte
        self.pj_per_flop = config.compute * self._delta / (gpu.bf16_tflops * 1e12) * 1e12 if self._delta > 0 else 0.0
        if self._delta > 0:  # activity-ms per ms of memory (compute) time at peak
            self._additive = (pj_per_byte * 1e-12 * self._bytes_per_ms * 1e3 / self._delta, config.compute)
        else:
            self._additive = (0.0, 0.0)

    def describe(self) -> dict:
        c = self.config
        return {"kind": "additive", "gpu": self.gpu.name, "tensor_parallel": self.tp, "board_w": self._board,
                "idle_w": self._idle, "idle_source": self._idle_source, "awake": self.awake,
                "awake_source": self.awake_source,
                "memory_pj_per_byte": self.pj_per_byte, "compute": c.compute,
                "pj_per_flop": self.pj_per_flop, "standby_s": c.standby_s, **host_fields(c, self.host_ranks)}


def default_pj_per_byte(gpu_name: str) -> float | None:
    family = memory_family(gpu_name)
    return None if family is None else DERIVATION[f"{family}_pj_per_byte"]


def build_additive(config: AdditiveConfig, presets: Presets | None = None, cost_model=None,
                   tensor_parallel: int | None = None) -> AdditivePowerModel:
    """Factory: as ``build_utilisation`` (GPU, degree, work view, board and idle), then the
    additive coefficients."""
    shared = UtilisationConfig(gpu=config.gpu, tensor_parallel=config.tensor_parallel, model=config.model,
                               board_w=config.board_w, idle_w=config.idle_w)
    base = build_utilisation(shared, presets, cost_model, tensor_parallel)
    pj = config.memory_pj_per_byte if config.memory_pj_per_byte is not None else default_pj_per_byte(base.gpu.name)
    if pj is None:
        raise ConfigError(f"the additive power model does not know GPU {base.gpu.name!r}'s memory technology: set "
                          "memory_pj_per_byte in [power]")
    return AdditivePowerModel(config, base.gpu, base.tp, base._work, pj_per_byte=pj, clock=base._clock,
                              kernel=base._kernel, board_w=base._board, idle_w=base._idle,
                              idle_source=base._idle_source, host_ranks=base.host_ranks)
