"""Built-in power models: ``utilisation`` (power follows the memory or compute utilisation of
each iteration), ``additive`` (an energy roofline: energy per byte and per FLOP, added), ``table`` (measured power against batch size) and ``fixed_active``
(LLMServingSim 2.0's fixed active power, for comparison)."""

import schedlab

from .additive import AdditiveConfig, AdditivePowerModel, build_additive
from .fixed_active import FixedActiveConfig, FixedActivePowerModel, build_fixed_active
from .table import TableConfig, TablePowerModel, build_table
from .utilisation import UtilisationConfig, UtilisationPowerModel, build_utilisation


@schedlab.hookimpl
def schedlab_register_power_models(register):
    register("utilisation", build_utilisation, config=UtilisationConfig,
             help="idle + (board - idle) x min(1, awake + activity x utilisation of the bound resources, "
                  "phase by phase)")
    register("additive", build_additive, config=AdditiveConfig,
             help="energy roofline: idle + awake share + energy per byte moved + energy per FLOP, added, "
                  "capped at the board limit")
    register("table", build_table, config=TableConfig,
             help="power per GPU interpolated in a measured table against batch size")
    register("fixed_active", build_fixed_active, config=FixedActiveConfig,
             help="LLMServingSim 2.0's: a fixed active power while busy, standby after, then idle")


__all__ = ["AdditiveConfig", "AdditivePowerModel", "FixedActiveConfig", "FixedActivePowerModel", "TableConfig", "TablePowerModel", "UtilisationConfig",
           "UtilisationPowerModel"]
