"""What every power model and every metered run satisfies (the conformance kit's energy part).

* :func:`check_power_model` -- one model on one bulk decode run: its closed form (``run_j``,
  ``run_j_peak``) equals the sum of its iterations and the highest of their powers, no
  iteration of the run draws less than idle power (each one is checked), standby is no less
  than idle (after each iteration too, where the model's ``standby_after`` says it), a tail's
  time constant is not negative;
* :func:`check_energy` -- a finished run with ``[power]``: per instance, the energy the meters
  counted equals the integral of the power drawn from the timeline (conservation), and the
  iterations' energy is all shared out to the requests (but the dummy steps of data-parallel
  ranks with nothing to compute, which belong to no request).
"""

from __future__ import annotations

import math

from ..energy.meter import run_j_by_iterations, shifted
from ..energy.timeline import integral_j, power_steps
from ..protocols import Batch


def check_power_model(model, batch: Batch, k: int, d0: float, inc: float, *, rel: float = 1e-9) -> None:
    """Assert the power model's contract on a decode run of ``k`` iterations from ``batch``
    (iteration ``j`` lasting ``d0 + j * inc`` ms)."""
    assert model.standby_w >= model.idle_w >= 0.0, f"standby {model.standby_w} W below idle {model.idle_w} W"
    assert model.standby_ms >= 0.0
    assert getattr(model, "tail_ms", 0.0) >= 0.0
    standby_after = getattr(model, "standby_after", None)
    energies = []
    for j in range(k):
        d = d0 + j * inc
        energy = model.iteration_j(shifted(batch, j), d)
        assert energy >= model.idle_w * d * 1e-3 * (1 - rel), (
            f"iteration {j} of the run: {energy} J over {d} ms is below idle power ({model.idle_w} W)")
        energies.append(energy)
        if standby_after is not None:
            standby = standby_after(shifted(batch, j))
            assert standby >= model.idle_w * (1 - rel), (
                f"after iteration {j} of the run: standby {standby} W is below idle power ({model.idle_w} W)")
    summed = run_j_by_iterations(model, batch, k, d0, inc)  # (each answer checked: a number, finite, >= 0)
    run_j = getattr(model, "run_j", None)
    if run_j is not None:
        closed = run_j(batch, k, d0, inc)
        assert math.isclose(closed, summed, rel_tol=rel, abs_tol=1e-12), (
            f"run_j gives {closed} J for {k} iterations, their sum is {summed} J")
    run_j_peak = getattr(model, "run_j_peak", None)
    if run_j_peak is not None:
        energy, peak = run_j_peak(batch, k, d0, inc)
        powers = [e / (d0 + j * inc) * 1e3 for j, e in enumerate(energies)]
        assert math.isclose(energy, summed, rel_tol=rel, abs_tol=1e-12)
        assert math.isclose(peak, max(powers), rel_tol=rel, abs_tol=1e-9), (
            f"run_j_peak says {peak} W, the run's iterations reach {max(powers)} W")


def check_energy(result, *, rel: float = 1e-9, shared: bool = True) -> None:
    """Assert conservation over a metered run (``result.meta["energy"]`` and a timeline):
    each instance's counted energy equals the integral of its power over the window, and
    (``shared``: unless iterations computed no token, as swap transfers alone do) the requests'
    shares add up to the iterations' energy, data-parallel ranks' dummy steps (``dummy_j``) and
    decodes whose token was thrown away (``discarded_j``) apart."""
    energy = result.meta["energy"]
    start, end = energy["window_ms"]
    for k, inst in enumerate(energy["instances"]):
        edges, watts = power_steps(result, k)
        counted = inst["busy_j"] + inst["idle_j"]
        drawn = integral_j(edges, watts)
        assert math.isclose(drawn, counted, rel_tol=rel, abs_tol=1e-9), (
            f"instance {k}: the meter counted {counted} J, its power over the timeline integrates to {drawn} J")
        assert edges[0] == start and math.isclose(edges[-1], end, rel_tol=rel, abs_tol=1e-9)
    if shared:
        busy = sum(inst["busy_j"] - inst.get("dummy_j", 0.0) - inst.get("discarded_j", 0.0)
                   for inst in energy["instances"])
        given = float(result.requests["energy_j"].sum())
        assert math.isclose(given, busy, rel_tol=rel, abs_tol=1e-9), (
            f"the requests' shares add up to {given} J, the iterations drew {busy} J (dummy steps and "
            "discarded decodes apart)")
