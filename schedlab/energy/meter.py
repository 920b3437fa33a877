"""One instance's energy over a run: its iterations by the power model, idle stretches between.

The engines call :meth:`EnergyMeter.iteration` for every iteration they run one at a time and
:meth:`EnergyMeter.run` for a bulk run of identical decode iterations (the fast engine); both
first add the idle stretch since the previous iteration ended (:mod:`.idle`: the last
iteration's power relaxing, standby, then idle). After the run :func:`close_meters` adds the
stretches before the first and after the last iteration, so an instance's energy covers the
run's whole window -- from 0, as its GPU-hours, to the end of the last iteration anywhere --
whether it worked or not. An autoscaled instance (:mod:`schedlab.engine.scaling`) is switched
off and on: while off it draws nothing; switched on, it idles until its first iteration, as
before a run's first.

Standby follows the clock the GPU was left at: a power model whose standby depends on the last
iteration (the ``utilisation`` model under the SLO governor, whose clock -- set per iteration,
as through NVML -- stays where the last iteration put it) says so through its optional
``standby_after(batch)``, asked at every iteration; the meter records each idle stretch's level
where it is not the model's ``standby_w`` (``standby_at``, for :mod:`.timeline`'s redraw).

A partitioned run's part (:mod:`schedlab.study.partition`) knows neither the run's first
arrival nor its end: :func:`close_part` closes its meters over the part's own window and keeps
what :func:`join_parts` needs to idle each instance on over the merged run's window.

Per-request energy: an iteration's energy is shared out over the tokens it computes, every
token alike -- a decode's own token and the drafts it verifies, each prompt token of a prefill
chunk. Both engines give each request its shares (the fast engine through
:attr:`EnergyMeter.per_decoder`, a running total per decoding sequence read at its events, as
its token counters are); the idle stretches belong to no request, nor do the dummy steps of a
data-parallel rank with nothing to compute while the others work (:meth:`EnergyMeter.dummy`:
busy energy, counted apart as ``dummy_j``), nor the shares of decodes whose token is thrown
away (``Plan.overshoot``: a plan made ahead decoding a request at an EOS once more, after its
row is written), counted apart as ``discarded_j``.
"""

from __future__ import annotations

import math
import numbers

from ..errors import SimulationError
from ..protocols import Batch
from .idle import idle_j
from .metrics import run_pue

INF = math.inf
#: A power model's numbers that are not per iteration: (attribute, default when optional, least value).
POWER_ATTRIBUTES = (("idle_w", None, 0.0), ("standby_w", None, 0.0), ("standby_ms", None, 0.0),
                    ("tail_ms", 0.0, 0.0), ("host_idle_w", 0.0, 0.0), ("host_busy_w", 0.0, 0.0), ("pue", 1.0, 1.0))


def check_power_model(model) -> None:
    """Raise :class:`SimulationError` when one of ``model``'s settings the meters read
    (:data:`POWER_ATTRIBUTES`) is not a finite number at least its least value: text would be
    silently converted or fail far from the plugin, a negative power integrate to negative joules."""
    for name, default, least in POWER_ATTRIBUTES:
        value = getattr(model, name, default)
        if not (_real(value) and least <= value < INF):
            raise SimulationError(f"power model {type(model).__name__}'s {name} is {value!r} "
                                  f"({type(value).__name__}); it must be a finite number >= {least:g}")


def checked_j(energy, model, method: str, batch, unit: str = "J"):
    """``energy``, what ``model``'s ``method`` said of ``batch``, if it is a finite number >= 0;
    else :class:`SimulationError` naming both (as a cost model's times are checked): text or
    None would fail far from the plugin, and a negative or NaN energy pass into the results."""
    if energy.__class__ is float and 0.0 <= energy < INF:  # (the usual answer, checked quickly)
        return energy
    if _real(energy) and 0.0 <= energy < INF:
        return energy
    raise SimulationError(f"power model {type(model).__name__}'s {method} returned {energy!r} "
                          f"({type(energy).__name__}) {unit} for {batch}; it must be a finite number >= 0")


def _real(value) -> bool:
    """A real number (an int, a float, a numpy float...), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def shifted(batch: Batch, j: int) -> Batch:
    """Iteration ``j`` of a bulk decode run that starts with ``batch``: each decode attends to
    ``j`` more tokens (the longest and shortest context too, when filled)."""
    if not j:
        return batch
    ranged = 1 if batch.decode_context_max else 0
    return Batch(batch.num_decode, batch.decode_context_tokens + j * batch.num_decode, batch.num_prefill,
                 batch.prefill_tokens, batch.prefill_context_tokens, batch.decode_context_max + j * ranged,
                 batch.decode_context_min + j * ranged, batch.spec_tokens)


def run_j_by_iterations(model, batch: Batch, k: int, d0: float, inc: float) -> float:
    """A bulk run's energy summed iteration by iteration (for power models without ``run_j``)."""
    return sum(checked_j(model.iteration_j(shifted(batch, j), d0 + j * inc), model, "iteration_j", batch)
               for j in range(k))


class EnergyMeter:
    """Integrates one instance's GPU power over time (see the module docstring).

    :ivar busy_j: energy of the iterations; :ivar idle_j: of the stretches between them;
    :ivar dummy_j: of the iterations among them that were a data-parallel rank's dummy steps;
    :ivar discarded_j: the shares of the decodes among them whose token was thrown away;
    :ivar busy_ms: time in iterations; :ivar peak_w: the highest iteration power (in a bulk
        run, what the model's ``run_j_peak`` says, else the higher of its first and last);
    :ivar per_decoder: the energy shared out so far to each decoding sequence (fast engine);
    :ivar last_w: the power of the last iteration (where the tail after it starts from);
    :ivar after_w: the standby power after the last iteration (the model's ``standby_w``, or what
        its ``standby_after`` said of that iteration);
    :ivar tails: ``[end of an iteration, tail W]`` for each idle stretch with a tail (to redraw
        the power over time, :mod:`.timeline`);
    :ivar standby_at: ``[end of an iteration, standby W]`` for each idle stretch whose standby is
        not ``standby_w`` (likewise).
    """

    __slots__ = ("model", "idle_w", "standby_w", "standby_ms", "tail_ms", "first_start", "last_end", "busy_j",
                 "idle_j", "dummy_j", "discarded_j", "busy_ms", "peak_w", "per_decoder", "last_w", "tails", "_run_j",
                 "_run_j_peak", "closed", "latest", "switched_on", "initial_end", "offs", "after_w", "standby_at",
                 "_standby_after")

    def __init__(self, model):
        check_power_model(model)
        self.model = model
        self.idle_w = float(model.idle_w)
        self.standby_w = float(model.standby_w)
        self.standby_ms = float(model.standby_ms)
        self.tail_ms = float(getattr(model, "tail_ms", 0.0))
        self.last_w = 0.0
        self.after_w = self.standby_w
        self.tails: list[list[float]] = []
        self.standby_at: list[list[float]] = []
        self._standby_after = getattr(model, "standby_after", None)
        self.first_start = INF   # start of the first iteration (of the first time on)
        self.last_end = -INF     # end of the last one (since last switched on)
        self.latest = -INF       # the last iteration's end or switch-off: where the run's window may end
        self.switched_on = None  # switched on then (None: on from the window's start)
        self.initial_end = None  # first switched off then (None: on from the start, or never off)
        self.offs: list[list[float]] = []  # [switched off, switched on again (inf: still off)]
        self.busy_j = 0.0
        self.idle_j = 0.0
        self.dummy_j = 0.0
        self.discarded_j = 0.0
        self.busy_ms = 0.0
        self.peak_w = 0.0
        self.per_decoder = 0.0
        self._run_j = getattr(model, "run_j", None)
        self._run_j_peak = getattr(model, "run_j_peak", None)
        self.closed = False

    def _gap(self, start: float) -> None:
        if self.last_end == -INF:  # the first iteration since on
            if self.switched_on is None:
                self.first_start = start  # (the stretch before it: at close, from the window's start)
            else:  # switched on and idle since
                self.idle_j += idle_j(self.idle_w, self.standby_w, self.standby_ms, INF, start - self.switched_on)
        elif start > self.last_end:
            self._after_last(start - self.last_end)

    # -- an autoscaled instance -----------------------------------------------------------------------
    def switch_off(self, t: float) -> None:
        """The instance is off from ``t``: its idle stretch ends there; it draws nothing until on."""
        if self.closed or is_off(self.offs):
            return
        if self.last_end > -INF:
            self._after_last(max(0.0, t - self.last_end))
        elif self.switched_on is not None:
            self.idle_j += idle_j(self.idle_w, self.standby_w, self.standby_ms, INF, t - self.switched_on)
        if self.switched_on is None and self.initial_end is None:
            self.initial_end = t  # the stretch before it (and any first iteration): at close
        self.offs.append([t, INF])
        self.last_end = -INF
        if t > self.latest:
            self.latest = t

    def switch_on(self, t: float) -> None:
        """The instance is on again from ``t`` (warming: it idles until its first iteration)."""
        if self.closed or not is_off(self.offs):
            return
        self.offs[-1][1] = t
        self.switched_on = t

    def tail_w(self) -> float:
        """How far above standby the power starts after the last iteration (0 without a tail)."""
        return max(0.0, self.last_w - self.after_w) if self.tail_ms > 0.0 else 0.0

    def _after_last(self, duration: float) -> None:
        """The idle stretch of ``duration`` ms right after the last iteration: its tail, standby, idle."""
        tail = self.tail_w()
        if tail > 0.0:
            self.tails.append([self.last_end, tail])
        if self.after_w != self.standby_w:
            self.standby_at.append([self.last_end, self.after_w])
        self.idle_j += idle_j(self.idle_w, self.after_w, self.standby_ms, 0.0, duration, tail, self.tail_ms)

    def _standby_after_last(self, batch: Batch) -> None:
        """Ask the model (if it says it) the standby power after an iteration of ``batch`` just accounted."""
        self.after_w = checked_j(self._standby_after(batch), self.model, "standby_after", batch, "W (standby)")

    def _busy(self, start: float, duration: float, energy: float) -> None:
        self.busy_j += energy
        self.busy_ms += duration
        end = start + duration
        if end > self.last_end:
            self.last_end = end
        if end > self.latest:
            self.latest = end

    def iteration(self, start: float, batch: Batch, duration: float) -> float:
        """Account for one iteration; its energy (J)."""
        self._gap(start)
        model = self.model
        energy = checked_j(model.iteration_j(batch, duration), model, "iteration_j", batch) if duration > 0.0 else 0.0
        if duration > 0.0:
            power = energy / duration * 1e3
            self.last_w = power
            if power > self.peak_w:
                self.peak_w = power
            if self._standby_after is not None:
                self._standby_after_last(batch)
        self._busy(start, duration, energy)
        return energy

    def run(self, start: float, batch: Batch, k: int, d0: float, inc: float, total: float) -> float:
        """Account for a bulk run of ``k`` decode iterations (iteration ``j`` lasts ``d0 + j *
        inc``, ``total`` in all); its energy (J)."""
        self._gap(start)
        model = self.model
        if self._run_j_peak is not None:
            energy, peak = checked_pair(self._run_j_peak(batch, k, d0, inc), model, batch)
        else:
            energy = self.energy_of_run(batch, k, d0, inc)
            peak = max(checked_j(model.iteration_j(shifted(batch, j), d0 + j * inc), model, "iteration_j", batch)
                       / (d0 + j * inc) * 1e3 for j in (0, k - 1))
        if peak > self.peak_w:
            self.peak_w = peak
        last = d0 + (k - 1) * inc
        if self.tail_ms > 0.0 and k > 0 and last > 0.0:
            # the tail after the run starts from its last iteration's power, asked now: what the
            # model sees of the cost model may change by the next iteration (a lockstep rank's step)
            energy_last = checked_j(model.iteration_j(shifted(batch, k - 1), last), model, "iteration_j", batch)
            self.last_w = energy_last / last * 1e3
        if self._standby_after is not None and k > 0 and last > 0.0:
            self._standby_after_last(shifted(batch, k - 1))
        self._busy(start, total, energy)
        return energy

    def dummy(self, start: float, batch: Batch, k: int, d0: float, inc: float, total: float) -> float:
        """Account for ``k`` dummy steps of a data-parallel rank with nothing to compute while the
        others work (iteration ``j`` lasts ``d0 + j * inc``, ``total`` in all; ``batch``: what its
        requests compute, nothing): busy energy that no request shares. Its energy (J)."""
        energy = self.iteration(start, batch, total) if k == 1 else self.run(start, batch, k, d0, inc, total)
        self.dummy_j += energy
        return energy

    def row_j(self, energy: float) -> float:
        """The energy of the timeline row of the iteration just accounted, whose energy is
        ``energy``: that (a pipelined instance's meter says its stages' over the row instead,
        :mod:`.pipeline`)."""
        return energy

    def energy_of_run(self, batch: Batch, k: int, d0: float, inc: float) -> float:
        """Energy of a bulk run, without accounting for it (timeline rows split a run)."""
        if k <= 0:
            return 0.0
        if self._run_j is not None:
            return checked_j(self._run_j(batch, k, d0, inc), self.model, "run_j", batch)
        return run_j_by_iterations(self.model, batch, k, d0, inc)

    def close(self, start: float, end: float) -> None:
        """Add the idle stretches of the window ``[start, end]`` before the first iteration (the
        GPUs fully idle) and after the last one (its tail, standby, then idle)."""
        if self.closed:
            return
        self.closed = True
        w = self.idle_w, self.standby_w, self.standby_ms
        # before the first iteration: idle from the window's start, until then or a switch-off
        first = min(self.first_start, self.initial_end if self.initial_end is not None else INF, end)
        if first > start:
            self.idle_j += idle_j(*w, INF, first - start)
        if is_off(self.offs):  # off at the end: nothing after its switch-off
            return
        if self.last_end > -INF:
            self._after_last(max(0.0, end - self.last_end))  # (its tail recorded even at the window's end)
        elif self.switched_on is not None:  # on again, no iteration since
            self.idle_j += idle_j(*w, INF, max(0.0, end - self.switched_on))

    def record(self, start: float, end: float) -> dict:
        """The instance's part of the run's energy record (after :meth:`close` over ``[start, end]``)."""
        return {
            "busy_j": self.busy_j, "idle_j": self.idle_j, "busy_ms": self.busy_ms, "peak_w": self.peak_w,
            "idle_w": self.idle_w, "standby_w": self.standby_w, "standby_ms": self.standby_ms,
            "tail_ms": self.tail_ms, "tails": self.tails,
            **({"standby_at": self.standby_at} if self.standby_at else {}),
            **({"dummy_j": self.dummy_j} if self.dummy_j else {}),
            **({"discarded_j": self.discarded_j} if self.discarded_j else {}),
            **off_record(self.offs, start, end),
            **host_record(self.model),
        }


def checked_pair(answer, model, batch) -> tuple[float, float]:
    """``run_j_peak``'s answer, ``(energy J, peak W)``, each checked as :func:`checked_j` does."""
    if type(answer) is not tuple or len(answer) != 2:
        raise SimulationError(f"power model {type(model).__name__}'s run_j_peak returned {answer!r} for {batch}; it "
                              "must return (energy in J, peak power in W)")
    return (checked_j(answer[0], model, "run_j_peak", batch),
            checked_j(answer[1], model, "run_j_peak", batch, "W (peak)"))


def is_off(offs: list) -> bool:
    """An autoscaled instance's meter (its ``[off, on]`` stretches) is off now."""
    return bool(offs) and offs[-1][1] == INF


def off_record(offs: list, start: float, end: float) -> dict:
    """An autoscaled instance's part of the energy record: its ``[off, on]`` stretches within the
    window ``[start, end]`` and its time on (``on_ms``, its host's); nothing for one never off."""
    if not offs:
        return {}
    off_ms = sum(max(0.0, min(b, end) - max(a, start)) for a, b in offs)
    return {"off": [[a, min(b, end)] for a, b in offs], "on_ms": end - start - off_ms}


def host_record(model) -> dict:
    """The host beside an instance's GPUs and the facility around them, as its power model says
    (for the energy record): each instance keeps its own PUE, since a disaggregated cluster's pools
    may each override it (``[cluster.decode] power = {pue = ...}``)."""
    return {"host_idle_w": float(getattr(model, "host_idle_w", 0.0)),
            "host_busy_w": float(getattr(model, "host_busy_w", 0.0)),
            "pue": float(getattr(model, "pue", 1.0))}


def token_shares(energy: float, batch: Batch, dropped: int = 0) -> tuple[float, float]:
    """``(per decoding sequence, per prefill token)`` of an iteration's energy: every token it
    computes takes the same share, a decode's drafts counting with it. ``dropped``: prompt
    tokens a pipeline's batch computed for requests preempted since its launch (not in
    ``batch``; they take a prefill token's share each, :mod:`schedlab.energy.pipeline`)."""
    tokens = batch.num_decode + batch.spec_tokens + batch.prefill_tokens + dropped
    if not tokens:
        return 0.0, 0.0
    per_token = energy / tokens
    per_decoder = per_token * (batch.num_decode + batch.spec_tokens) / batch.num_decode if batch.num_decode else 0.0
    return per_decoder, per_token


def close_meters(meters: list, start: float, until: float = -INF) -> dict:
    """Close every instance's meter (an :class:`EnergyMeter`, or a pipelined instance's
    :class:`.pipeline.PipelineMeter`) over the run's window -- from ``start`` (0, where the run's
    GPU-hours start; a part's first arrival) to the end of the last iteration of any instance, or
    ``until`` if later (the end of the engine's work its GPU-hours pay to: a request dropped after
    the last iteration, a KV lease on an abandoned prompt) -- and return the run's energy record
    (``meta["energy"]``): the window, the power model (the first instance's; with pools of
    other settings, each one and its instances under ``models``), the run's PUE
    (:func:`.metrics.run_pue`) and, per instance, its GPUs' energy, its host and its own PUE."""
    end = max([m.latest for m in meters if m.latest > -INF] + [start, until])
    for m in meters:
        m.close(start, end)
    described = [_described(m.model) for m in meters]
    instances = [m.record(start, end) for m in meters]
    record = {
        "window_ms": [start, end],
        "model": described[0],
        "pue": run_pue(instances, end - start),
        "instances": instances,
    }
    kinds = []  # [description, its instances] of each distinct power model (a pool may override [power])
    for i, d in enumerate(described):
        same = next((k for k in kinds if k[0] == d), None)
        if same is None:
            kinds.append([d, [i]])
        else:
            same[1].append(i)
    if len(kinds) > 1:
        record["models"] = [{"instances": ids, "model": d} for d, ids in kinds]
    return record


def _described(model) -> dict:
    """A power model's settings for the results (its ``describe()``, else its class)."""
    describe = getattr(model, "describe", None)
    return describe() if describe is not None else {"kind": type(model).__name__}


def close_part(meters: list, indices: list[int], first_arrival: float) -> dict:
    """A partitioned run's part's energy record (:mod:`schedlab.study.partition`): its meters
    closed over the part's own window -- from its first arrival (``first_arrival``, inf if it had
    none) to its own last iteration's end -- plus, under ``"part"``, what :func:`join_parts` needs
    to carry each instance on to the whole run's end, which no part knows: the instances' indices
    in the cluster, the part's first arrival (None: none) and each instance's last iteration's
    end (None: it never worked) and the tail its power starts from there."""
    record = close_meters(meters, first_arrival if first_arrival < INF else 0.0)
    record["part"] = {
        "instances": list(indices),
        "first_arrival_ms": first_arrival if first_arrival < INF else None,
        "last_end_ms": [m.last_end if m.last_end > -INF else None for m in meters],
        "tail_w": [m.tail_w() for m in meters],
        "standby_w": [m.after_w for m in meters],
    }
    return record


def join_parts(records: list[dict]) -> dict:
    """The whole run's energy record from its parts' (:func:`close_part`), as :func:`close_meters`
    gives it in one process: the window runs from 0 to the latest end of an iteration, and each
    instance idles on from its part's window to the run's -- fully idle
    before its part's first arrival (no iteration of the part starts before it), and after its
    part's end where its last idle stretch left off (tail, standby, idle), or fully idle if it
    never worked. A part whose instances never worked (no request, or only rejected ones) idles
    over the whole window. Idle energy is additive over a stretch cut in two, so each instance's
    equals one process's up to the order of the floating-point sums."""
    start = 0.0  # (as one process: from 0, where the run's GPU-hours start)
    worked = [any(t is not None for t in r["part"]["last_end_ms"]) for r in records]
    end = max([r["window_ms"][1] for r, w in zip(records, worked) if w] + [start])
    placed = {}
    for record, w in zip(records, worked):
        part = record["part"]
        part_start, part_end = record["window_ms"] if w else (start, start)
        standbys = part.get("standby_w") or [inst["standby_w"] for inst in record["instances"]]
        for index, inst, last_end, tail_w, standby in zip(part["instances"], record["instances"],
                                                          part["last_end_ms"], part["tail_w"], standbys):
            idle = inst["idle_w"], standby, inst["standby_ms"]  # (standby: after its part's last iteration)
            since = INF if last_end is None else part_end - last_end
            before = idle_j(*idle, INF, part_start - start)
            after = idle_j(*idle, since, end - part_end, tail_w, inst["tail_ms"])
            placed[index] = {**inst, "idle_j": inst["idle_j"] + before + after}
    joined = {key: value for key, value in records[0].items() if key != "part"}
    joined["window_ms"] = [start, end]
    joined["instances"] = [placed[i] for i in sorted(placed)]
    joined["pue"] = run_pue(joined["instances"], end - start, joined.get("pue", 1.0))
    return joined
