"""The energy of an idle stretch: the last iteration's power relaxing, standby, then idle.

After its last kernel a GPU does not drop at once to what it draws idle. Measured power
(nvidia-smi on the RTX A6000 of LLMServingSim 2.0's traces) shows two things:

* a **tail**: from the last iteration's power it relaxes to the standby level within a couple
  of seconds -- the readings a second and two seconds after a pulse are still 7 and 4 W above
  the plateau that follows. Modelled as an exponential with time constant ``tail_ms``, fitted
  to the traces by ``tools/derive_roofline.py`` (power section). Burtscher, Zecena and Zong
  ("Measuring GPU Power with the K20 Built-in Sensor", GPGPU 2014) saw the same on a K20:
  kernels "consume energy after they have stopped executing";
* **standby**: NVIDIA's driver keeps the clocks up for some seconds after the last kernel (the
  A6000 holds ~84-91 W for ~18 s before it drops to 33 W); a power model gives the level
  ``standby_w`` (or, where it depends on the clock the last iteration left the GPU at, its
  ``standby_after(batch)`` of that iteration: :mod:`.meter`), how long, ``standby_ms``, and
  ``idle_w`` after.

So ``s`` ms after the last iteration ended, with ``tail_w = max(0, last power - standby_w)``::

    power(s) = (standby_w if s < standby_ms else idle_w) + tail_w x exp(-s / tail_ms)

This module integrates that in closed form (the meter, for every idle stretch in both engines)
and cuts it into steps of exact mean power (to redraw power over time from saved results).

Units: W and ms in, J out (1 W for 1 ms is 1e-3 J).
"""

from __future__ import annotations

import math

#: Where :func:`idle_steps` cuts a tail, in time constants after its start (beyond the last
#: cut the rest of the tail -- under 0.03% of it -- goes into the next step's mean).
TAIL_CUTS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def tail_j(tail_w: float, tail_ms: float, since_ms: float, duration_ms: float) -> float:
    """Energy of the tail ``tail_w x exp(-s / tail_ms)`` over ``s`` in ``[since_ms, since_ms +
    duration_ms]``."""
    if tail_w <= 0.0 or tail_ms <= 0.0 or duration_ms <= 0.0 or math.isinf(since_ms):
        return 0.0
    return -tail_w * tail_ms * math.exp(-since_ms / tail_ms) * math.expm1(-duration_ms / tail_ms) * 1e-3


def idle_j(idle_w: float, standby_w: float, standby_ms: float, since_ms: float, duration_ms: float,
           tail_w: float = 0.0, tail_ms: float = 0.0) -> float:
    """Energy of ``duration_ms`` of idleness that starts ``since_ms`` after the last iteration
    ended (``inf``: the GPU has not worked yet, so it is fully idle)."""
    if duration_ms <= 0.0:
        return 0.0
    standby = 0.0
    if since_ms < standby_ms:
        standby = min(standby_ms - since_ms, duration_ms)
    return (idle_w * duration_ms + (standby_w - idle_w) * standby) * 1e-3 \
        + tail_j(tail_w, tail_ms, since_ms, duration_ms)


def idle_steps(idle_w: float, standby_w: float, standby_ms: float, duration_ms: float, tail_w: float = 0.0,
               tail_ms: float = 0.0, standby_left=None, standby_levels=None) -> list[tuple[float, float]]:
    """``[(length ms, mean W), ...]``: ``duration_ms`` of idleness right after an iteration as
    steps whose mean powers are exact (their energies add up to :func:`idle_j`'s): cut where
    standby ends and, through the tail, at :data:`TAIL_CUTS` time constants.

    ``standby_left``: the standby each of the instance's GPU groups has left at the stretch's
    start (a pipelined instance's stages, each idle since its own last slice; they share
    ``standby_w - idle_w`` alike); default: one group, ``standby_ms``. ``standby_levels``: each
    group's own standby power instead (W; its share of ``idle_w`` is ``idle_w / groups``), where
    they differ (a governed clock left at each stage's last slice's level)."""
    if duration_ms <= 0.0:
        return []
    left = (standby_ms,) if standby_left is None else standby_left
    groups = len(left)
    cuts = {duration_ms}
    cuts.update(x for x in left if 0.0 < x < duration_ms)
    if tail_w > 0.0 and tail_ms > 0.0:
        cuts.update(x * tail_ms for x in TAIL_CUTS if x * tail_ms < duration_ms)
    steps, start = [], 0.0
    for end in sorted(cuts):
        length = end - start
        if standby_levels is None:
            standing = sum(1 for x in left if start < x)
            base = standby_w if standing == groups else idle_w + (standby_w - idle_w) * standing / groups
        else:
            base = idle_w + sum(w - idle_w / groups for x, w in zip(left, standby_levels) if start < x)
        steps.append((length, base + tail_j(tail_w, tail_ms, start, length) / length * 1e3))
        start = end
    return steps
