"""A run's energy metrics, from its meters' record (``meta["energy"]``) and its requests.

* ``gpu_j`` -- what the GPUs drew over the run's window (0, as its GPU-hours, to the end of the
  engine's work: the last iteration, or a later request dropped or KV lease), iterations
  (``busy_j``) and idle stretches (``idle_j``) alike; ``host_j`` the
  hosts beside them; ``facility_j``, the sum over the instances of ``(GPUs + host) x`` their
  ``pue`` (a disaggregated cluster's pools may each have their own), also as ``kwh``; ``pue`` the
  instances' PUE when they share one, else the run's effective one, ``facility_j / (gpu_j + host_j)``;
* ``j_per_token`` and ``j_per_request`` -- GPU energy per output token of the completed requests
  and per completed request over the whole run's window, ramp-up, drain and idle stretches
  included (ML.ENERGY reports the steady state's instead: ``energy.steady_j_per_token`` in a
  comparison with its run, :func:`schedlab.targets.steady_state_energy`),
  ``facility_j_per_token`` the same from the facility's meter. Work for requests that did not
  complete -- abandoned by their clients, turned away after they ran -- is energy spent for no
  output: it counts in the numerator, not the denominator, as goodput counts it;
* ``request_j`` -- the distribution of each completed request's own share: every token an
  iteration computes takes the same part of its energy (idle stretches belong to no request);
  ``attributed_j`` every request's shares, the uncompleted ones' too;
* ``avg_power_w`` and ``peak_power_w`` -- GPU power of the whole run (all instances): the
  average over its window, and the sum of the instances' peaks -- what they could draw at once,
  the figure to provision for (their peaks need not coincide); per instance too;
* per request class (``per_class.<class>.energy``): its requests' shares (``j``), per completed
  request and per their output token. These count the iterations' energy only (the requests'
  shares): idle stretches, data-parallel dummy steps and discarded decodes belong to no request or
  class. So the classes' ``j_per_token`` are not a breakdown of the run's ``j_per_token``, which
  counts the GPUs' whole energy, idle included: their token-weighted mean is ``attributed_j /
  generated tokens``, below ``gpu_j / generated tokens`` by the share of idle energy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

J_PER_KWH = 3.6e6


def instance_energy(inst: dict, window_ms: float) -> dict[str, float]:
    """One instance's GPU and host energy (J) over a window of ``window_ms``."""
    gpu = inst["busy_j"] + inst["idle_j"]
    on_ms = inst.get("on_ms", window_ms)  # an autoscaled instance's host is off with it
    host = (inst["host_idle_w"] * on_ms + inst["host_busy_w"] * inst["busy_ms"]) * 1e-3
    return {"gpu_j": gpu, "host_j": host}


def facility_j(inst: dict, window_ms: float, pue: float = 1.0) -> float:
    """One instance's facility energy (J): its GPUs' and host's at its own PUE (``pue``: the
    run's, for a record saved before each instance kept its own)."""
    parts = instance_energy(inst, window_ms)
    return (parts["gpu_j"] + parts["host_j"]) * inst.get("pue", pue)


def run_pue(instances: list[dict], window_ms: float, pue: float = 1.0) -> float:
    """The run's PUE: the instances' when they share one, else the facility's energy over the IT
    energy (GPUs and hosts), each instance's at its own PUE (``pue``: the default for records
    that keep none per instance, and the answer for a run that drew nothing)."""
    pues = {inst.get("pue", pue) for inst in instances}
    if len(pues) <= 1:
        return float(pues.pop()) if pues else float(pue)
    it = facility = 0.0
    for inst in instances:
        parts = instance_energy(inst, window_ms)
        it += parts["gpu_j"] + parts["host_j"]
        facility += facility_j(inst, window_ms, pue)
    return facility / it if it > 0.0 else float(pue)


def energy_metrics(req: dict[str, np.ndarray], energy: dict[str, Any], summarize, ok: np.ndarray) -> dict[str, Any]:
    """The ``energy`` metrics group (see the module docstring); ``summarize`` makes the
    mean/percentile summary of the per-request shares, ``ok`` marks the completed requests
    (:func:`schedlab.results.metrics.completed`)."""
    shares = req["energy_j"] if "energy_j" in req else np.zeros(req["id"].size)
    return energy_totals(energy, int(req["generated_tokens"][ok].sum()), int(ok.sum()), summarize(shares[ok]),
                         float(shares.sum()))


def energy_totals(energy: dict[str, Any], generated: int, finished: int, request_j: dict[str, float],
                  attributed_j: float) -> dict[str, Any]:
    """The ``energy`` group from the meters' record and the requests' figures: the completed
    requests' output tokens and count, the summary of their shares, and every request's shares
    summed (what a streamed run keeps, :mod:`schedlab.results.stream`)."""
    start, end = energy["window_ms"]
    window = end - start
    seconds = window / 1e3
    nan = float("nan")
    per_instance, gpu, host, facility, busy, idle = {}, 0.0, 0.0, 0.0, 0.0, 0.0
    default_pue = energy.get("pue", 1.0)  # (a record whose instances keep no PUE of their own)
    for k, inst in enumerate(energy["instances"]):
        parts = instance_energy(inst, window)
        gpu += parts["gpu_j"]
        host += parts["host_j"]
        facility += (parts["gpu_j"] + parts["host_j"]) * inst.get("pue", default_pue)
        busy += inst["busy_j"]
        idle += inst["idle_j"]
        per_instance[str(k)] = {
            "gpu_j": parts["gpu_j"],
            "avg_power_w": parts["gpu_j"] / seconds if seconds > 0 else nan,
            "peak_power_w": inst["peak_w"],
            "busy_share": inst["busy_ms"] / window if window > 0 else nan,
        }
    pue = run_pue(energy["instances"], window, default_pue)
    return {
        "gpu_j": gpu, "busy_j": busy, "idle_j": idle, "host_j": host, "facility_j": facility,
        "kwh": facility / J_PER_KWH, "gpu_kwh": gpu / J_PER_KWH, "pue": pue,
        "j_per_token": gpu / generated if generated else nan,
        "j_per_request": gpu / finished if finished else nan,
        "facility_j_per_token": facility / generated if generated else nan,
        "request_j": request_j,
        "attributed_j": attributed_j,
        "avg_power_w": gpu / seconds if seconds > 0 else nan,
        "peak_power_w": sum(i["peak_w"] for i in energy["instances"]) if energy["instances"] else nan,
        "window_ms": window,
        "per_instance": per_instance,
    }


def class_energy(req: dict[str, np.ndarray], sel: np.ndarray, ok: np.ndarray) -> dict[str, float]:
    """One class's (``sel``) shares: in all, per completed (``ok``) request and per their output token."""
    ok = sel & ok
    return energy_shares(float(req["energy_j"][sel].sum()), int(ok.sum()), int(req["generated_tokens"][ok].sum()))


def energy_shares(total: float, n: int, tokens: int) -> dict[str, float]:
    """``total`` J shared by ``n`` requests' ``tokens`` output tokens: in all, per request and per token."""
    nan = float("nan")
    return {"j": total, "j_per_request": total / n if n else nan, "j_per_token": total / tokens if tokens else nan}
