"""schedlab: simulate how LLM serving engines schedule requests.

Writing a plugin takes one module::

    import schedlab

    class MyScheduler:
        stable_between_events = True   # lets the engine skip identical decode iterations

        def __init__(self, config):
            self.config = config

        def schedule(self, plan):
            plan.decode_all()                       # every running sequence decodes
            seq = plan.waiting.peek()
            if seq is not None and len(plan.running) < 8:
                plan.admit(seq, seq.num_tokens)     # whole prompt in this iteration

    @schedlab.hookimpl
    def schedlab_register_schedulers(register):
        register("mine", MyScheduler, help="admits one request per iteration, up to 8")

Make it known through the ``schedlab`` entry-point group in your package metadata, or list the
module in an experiment's ``[experiment] plugins = ["my_module"]``; then use
``[scheduler] kind = "mine"``. The contracts are in :mod:`schedlab.protocols`, the hooks in
:mod:`schedlab.hookspecs`; :mod:`schedlab.study` runs experiments and :mod:`schedlab.results`
turns runs into metrics and files. The module names of the earlier flat layout
(``schedlab.metrics``, ``schedlab.experiment``, ...) still import (:mod:`schedlab.aliases`).
"""

from . import aliases
from .errors import ConfigError, SchedlabError, SimulationError, StallError, UnknownPluginError, WorkloadError
from .hookspecs import NAME, hookimpl, hookspec
from .model import Request
from .protocols import Batch

__all__ = [
    "NAME",
    "Batch",
    "ConfigError",
    "Request",
    "SchedlabError",
    "SimulationError",
    "StallError",
    "UnknownPluginError",
    "WorkloadError",
    "hookimpl",
    "hookspec",
]
__version__ = "0.1.0"

aliases.install()  # the old flat module names (schedlab.metrics, ...) keep importing
