"""Energy: what the GPUs of each instance draw over a run, integrated exactly.

A run with a ``[power]`` table gives every instance a power model (a plugin, see
:class:`schedlab.protocols.PowerModel`) and an :class:`EnergyMeter`. The engines hand the meter
each iteration -- and the fast engine each bulk decode run, whose energy the power model sums
in closed form -- and the meter integrates the idle stretches between them (standby power for
a while after the last iteration, then idle power). Without ``[power]`` the engines never
touch any of this.

* :mod:`.idle` -- the energy of an idle stretch (standby, then idle);
* :mod:`.meter` -- :class:`EnergyMeter`, one per instance, and each iteration's energy shared
  out to the requests in it;
* :mod:`.pipeline` -- :class:`PipelineMeter`, a pipelined instance's: each stage's GPUs metered
  on their own, the timeline's rows carrying them all;
* :mod:`.clock` -- the SM clock: how it scales an iteration's time and power, a fixed clock per
  instance and the SLO-driven clock governor;
* :mod:`.metrics` -- joules per token and per request, power per instance, kWh, host and PUE.
"""

from .meter import EnergyMeter, close_meters
from .pipeline import PipelineMeter

__all__ = ["EnergyMeter", "PipelineMeter", "close_meters"]
