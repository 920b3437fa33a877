"""The energy of an idle stretch: standby power for a while after the last iteration, then idle.

NVIDIA's driver keeps a GPU's clocks up for some seconds after its last kernel (the A6000 of
the shared traces holds ~89 W for ~18 s before it drops to 33 W); a power model gives the
three numbers (``standby_w``, ``standby_ms``, ``idle_w``) and this one function integrates
them, for the meter and for redrawing power over time from saved results alike.

Units: W and ms in, J out (1 W for 1 ms is 1e-3 J).
"""

from __future__ import annotations

import math


def idle_j(idle_w: float, standby_w: float, standby_ms: float, since_ms: float, duration_ms: float) -> float:
    """Energy of ``duration_ms`` of idleness that starts ``since_ms`` after the last iteration
    ended (``inf``: the GPU has not worked yet, so it is fully idle)."""
    if duration_ms <= 0.0:
        return 0.0
    standby = 0.0
    if since_ms < standby_ms:
        standby = min(standby_ms - since_ms, duration_ms)
    return (idle_w * duration_ms + (standby_w - idle_w) * standby) * 1e-3


def idle_power_w(idle_w: float, standby_w: float, standby_ms: float, since_ms: float) -> float:
    """The power ``since_ms`` after the last iteration ended (``inf``: never worked)."""
    return standby_w if since_ms < standby_ms and not math.isinf(since_ms) else idle_w
