"""Built-in cost models: ``linear`` (seed 001), ``roofline`` (from model and GPU presets) and
``profiled`` (from measured per-operator profiles)."""

import schedlab

from .linear import LinearConfig, LinearCostModel
from .profiled import ProfiledConfig, ProfiledCostModel, build_profiled
from .roofline import RooflineConfig, RooflineCostModel, build_roofline


@schedlab.hookimpl
def schedlab_register_cost_models(register):
    register("linear", lambda config, presets=None: LinearCostModel(config), config=LinearConfig,
             help="prefill ms per token + decode ms per step (seed 001's model)")
    register("roofline", build_roofline, config=RooflineConfig,
             help="memory-bound decode + compute-bound prefill from model and GPU presets (additive roofline)")
    register("profiled", build_profiled, config=ProfiledConfig,
             help="iteration time composed from a measured per-operator profile bundle (LLMServingSim layout)")
