"""The CPU time of a run's simulation alone, for the benchmark scripts' child processes.

On a machine shared with other jobs the CPU time of the simulation is what its wall time would
be on an idle one. :func:`time_simulations` wraps every entry point the study layer calls into
the engines (``schedlab/study/simulation.py``) so that each call adds its CPU time to the list
it returns:

* the fast engine's drivers: colocated and pipelined instances (``simulate``), disaggregated
  pools (``simulate_disaggregated``), data-parallel ranks (``simulate_data_parallel``);
* the reference engine's clusters (``ReferenceCluster.run``, patched on the class, which the
  disaggregated and pipelined reference clusters inherit) and data-parallel ranks
  (``ReferenceDataParallel.run``).

None of them calls another, so no time is counted twice.
"""

from __future__ import annotations

import functools
import time


def time_simulations() -> list[float]:
    """Wrap the engines' entry points; returns the list each call appends its CPU seconds to."""
    import schedlab.study.simulation as simulation

    cpu: list[float] = []
    entry_points = ((simulation, "simulate"), (simulation, "simulate_disaggregated"),
                    (simulation, "simulate_data_parallel"), (simulation.ReferenceCluster, "run"),
                    (simulation.ReferenceDataParallel, "run"))
    for owner, name in entry_points:
        setattr(owner, name, _timed(getattr(owner, name), cpu))
    return cpu


def _timed(fn, cpu: list[float]):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        started = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            cpu.append(time.process_time() - started)
    return run
