"""A pipelined instance's energy: each stage's GPUs metered on their own, the timeline's rows
carrying all of them.

A pipelined instance (:mod:`schedlab.engine.pipeline`) has ``P`` stages, each a group of ``tp``
GPUs holding a run of the model's layers. A stage is **busy** while it computes its slice of a
batch -- from when the batch's activations have reached it and it is done with the batch before,
for the stage's time (:class:`schedlab.engine.stages.StageClock`) -- and **idle** otherwise,
while the activations are sent on too; its idle stretches follow the idle law
(:mod:`.idle`: the last slice's power relaxing, standby, idle) from its own last slice. During a
slice the stage draws what the power model says of the stage's share of the batch: the model is
built against the instance's :class:`~schedlab.engine.stage_cost.StageCost`, which this meter
points at the stage (and at the batch's clock) before it asks (the cost model's
``stage_work``: the stage's layers' share of the work).

**Requests.** A batch's slices are metered when it launches (its stage times are known then);
its energy -- its slices' -- is shared out to its tokens when it lands, as a colocated
iteration's is (:func:`.meter.token_shares`): the prompt chunks of requests preempted while it
was in flight (their prompts start over, :mod:`schedlab.engine.stages`) keep their shares, as
recomputed tokens do, and the tokens of requests aborted while it was in flight take theirs
counted apart, ``discarded_j`` (their rows are written; a batch that lost every request gave its
energy to nobody, and the shares fell short of ``busy_j``); a batch of swaps only gives its energy
to nobody. Planning ahead, a
decode of a request a batch before it finished takes a decode's share, counted apart as
``discarded_j`` (its token thrown away, as a colocated overshoot's, :mod:`.meter`).

**The timeline.** The instance's rows are its landings, each over the time since the previous
landing (or its launch, if later), so together they cover every moment a batch is in flight; with
``[power]`` a landing that gives no token, whose row lasts 0 ms, is followed by a row of no token
over the batch's time in flight (:meth:`PipelineMeter.hole`). A row carries the energy of all the
stages over it, busy and idle, so the power the timeline redraws over a row is the instance's
mean power over it, exactly. Between rows no batch is in flight and every stage idles, each from
its own last slice: at the start of such a stretch the meter records each stage's standby left
(``standby_left``) and the stages' tails summed into one (``tails``: exponentials of one time
constant add up) -- and, under the SLO governor, each stage's standby level, that of the clock
its last slice ran at (``standby_at``, :mod:`.meter`) -- and :func:`.timeline.power_steps`
redraws the stretch exactly.

**Autoscaled** (:func:`schedlab.engine.scaling.pipeline_scaling`), an instance is switched off
with nothing in flight -- its stages' idle stretches end there -- and draws nothing until
switched on, when every stage idles as before its first batch (the record's ``off``, as a
colocated instance's, :mod:`.meter`).

**The record** (``meta["energy"]["instances"][i]``) is a colocated instance's, over all stages:
``busy_j`` the slices', ``idle_j`` the rest, ``idle_w`` and ``standby_w`` all stages' together,
``busy_ms`` the time with a batch in flight (the host's busy time), ``peak_w`` the highest mean
power of a row; and ``stages``, each stage's busy and idle energy and busy time.
"""

from __future__ import annotations

import math
from collections import deque

from .idle import idle_j
from .meter import check_power_model, checked_j, host_record, is_off, off_record

INF = math.inf


class PipelineMeter:
    """Integrates a pipelined instance's GPU power, stage by stage (see the module docstring).

    :param model: the power model of one stage's GPUs, built against ``view``;
    :param view: the instance's :class:`~schedlab.engine.stage_cost.StageCost`;
    :param stages: the pipeline's stages.
    """

    def __init__(self, model, view, stages: int):
        check_power_model(model)
        self.model = model
        self.view = view
        self.stages = stages
        self.stage_idle_w = float(model.idle_w)
        self.stage_standby_w = float(model.standby_w)
        self.standby_ms = float(model.standby_ms)
        self.tail_ms = float(getattr(model, "tail_ms", 0.0))
        self.idle_w = stages * self.stage_idle_w
        self.standby_w = stages * self.stage_standby_w
        self.slices = [deque() for _ in range(stages)]  # per stage: [start, end, W, standby W after] not yet passed
        self.last_end = [-INF] * stages  # per stage: the end and power of its last slice passed
        self.last_w = [0.0] * stages
        self.last_sb = [self.stage_standby_w] * stages  # ... and the standby after it
        self._standby_after = getattr(model, "standby_after", None)
        self.busy_j = [0.0] * stages
        self.idle_j = [0.0] * stages
        self.busy_ms = [0.0] * stages
        self.flights: deque = deque()  # (energy, completion) of the batches in flight
        self.cursor = -INF     # every stage's energy is counted (into rows or idle stretches) up to here
        self.first_start = INF
        self.latest = -INF
        self.in_flight_ms = 0.0
        self.peak_w = 0.0
        self.tails: list[list[float]] = []
        self.standby_left: list[list[float]] = []
        self.standby_at: list[list[float]] = []
        self.per_decoder = 0.0  # the energy shared out so far to each decoding sequence (fast engine)
        self.discarded_j = 0.0  # planning ahead: the shares of decodes whose token was thrown away
        self._row = 0.0
        #: what the timeline's rows carry in all (each landing's row, each hole's): their sum when
        #: none was thinned away (``targets.steady_state_energy`` checks it)
        self.rows_j = 0.0
        self._hole = None
        self.closed = False
        self.offs: list[list[float]] = []  # autoscaled: [switched off, switched on again (inf: still off)]
        self.initial_end = None  # switched off then before any batch, on from the window's start

    # -- the engines' calls ------------------------------------------------------------------------
    def launch(self, starts, stage_ms, batch, ratio: float) -> None:
        """A batch enters the pipeline: stage ``s`` computes its slice from ``starts[s]`` for
        ``stage_ms[s]`` ms, at clock ``ratio``."""
        view, model, after = self.view, self.model, self._standby_after
        view.ratio = ratio
        energy = 0.0
        for s, (start, d) in enumerate(zip(starts, stage_ms)):
            if d > 0.0:
                view.stage = s
                e = checked_j(model.iteration_j(batch, d), model, "iteration_j", batch)
                sb = self.stage_standby_w if after is None else checked_j(after(batch), model, "standby_after",
                                                                          batch, "W (standby)")
                self.slices[s].append((start, start + d, e / d * 1e3, sb))
                self.busy_j[s] += e
                self.busy_ms[s] += d
                energy += e
        self.flights.append((energy, starts[-1] + stage_ms[-1]))

    def iteration(self, start: float, batch, duration: float) -> float:
        """The oldest batch lands, its row starting at ``start`` and lasting ``duration`` ms (0: it
        gave no token): its energy, to share out to its tokens."""
        energy, completion = self.flights.popleft()
        self._row, self._hole = 0.0, None
        if duration > 0.0:
            self._row = self._advance(start, completion)
        elif completion > start:
            self._hole = (start, completion)
        return energy

    def row_j(self, energy: float) -> float:
        """The energy of the landing's row: all stages' over it (0 for a row of 0 ms)."""
        self.rows_j += self._row
        return self._row

    def hole(self) -> tuple[float, float, float] | None:
        """``(start, duration, energy)`` of the time in flight of a batch that just landed with no
        token (its row lasted 0 ms), for a row of its own; None after any other landing."""
        if self._hole is None:
            return None
        start, end = self._hole
        self._hole = None
        energy = self._advance(start, end)
        self.rows_j += energy
        return start, end - start, energy

    # -- an autoscaled instance (nothing in flight when it goes off) ---------------------------------
    def switch_off(self, t: float) -> None:
        """The instance is off from ``t``: each stage's idle stretch since its last slice ends
        there (recorded for the redraw as any stretch is); it draws nothing until switched on."""
        if self.closed or is_off(self.offs):
            return
        if self.cursor == -INF:  # no batch yet, on from the window's start: that stretch is counted at close
            self.initial_end = t
        elif t > self.cursor:
            self._idle_stretch(t)
        self.offs.append([t, INF])
        self.last_end = [-INF] * self.stages
        self.last_w = [0.0] * self.stages
        self.last_sb = [self.stage_standby_w] * self.stages
        if t > self.latest:
            self.latest = t

    def switch_on(self, t: float) -> None:
        """The instance is on again from ``t`` (warming): every stage idles, as before its first
        batch, until its first slice."""
        if self.closed or not is_off(self.offs):
            return
        self.offs[-1][1] = t
        self.cursor = t

    # -- integrating -----------------------------------------------------------------------------
    def _advance(self, start: float, end: float) -> float:
        """Count every stage's energy up to ``end`` -- a row from ``start``, after an idle stretch
        when ``start`` is later than the cursor -- and return the row's."""
        if self.cursor == -INF:
            self.first_start = self.cursor = start  # (before it: idle, counted at close)
        elif start > self.cursor:
            self._idle_stretch(start)
        energy = self._integrate(end)
        self.in_flight_ms += end - start
        self.latest = end
        if end > start and energy / (end - start) * 1e3 > self.peak_w:
            self.peak_w = energy / (end - start) * 1e3
        return energy

    def _idle_stretch(self, end: float) -> None:
        """No batch in flight from the cursor to ``end``: record what the timeline needs to redraw
        the stretch (each stage's standby left, the stages' tails as one) and count it."""
        t, left, tail = self.cursor, [], 0.0
        for s in range(self.stages):
            since = t - self.last_end[s]
            left.append(self.standby_ms - since if since < self.standby_ms else 0.0)
            w = self.last_w[s] - self.last_sb[s]
            if self.tail_ms > 0.0 and w > 0.0 and since < INF:
                tail += w * math.exp(-since / self.tail_ms)
        if any(left):
            self.standby_left.append([t, *left])
            if any(x > 0.0 and sb != self.stage_standby_w for x, sb in zip(left, self.last_sb)):
                self.standby_at.append([t, *self.last_sb])
        if tail > 0.0:
            self.tails.append([t, tail])
        self._integrate(end)

    def _integrate(self, end: float) -> float:
        """Every stage's energy from the cursor to ``end`` (its slices, passed on, and its idle
        stretches between them); the cursor moves there."""
        total = 0.0
        a = self.cursor
        for s in range(self.stages):
            queue, t = self.slices[s], a
            while queue and queue[0][0] < end:
                start, stop, w, sb = queue[0]
                if start > t:
                    total += self._idle(s, t, start)
                    t = start
                if stop <= end:
                    total += w * (stop - t) * 1e-3
                    queue.popleft()
                    self.last_end[s], self.last_w[s], self.last_sb[s] = stop, w, sb
                    t = stop
                else:  # it goes on past ``end``
                    total += w * (end - t) * 1e-3
                    t = end
                    break
            if t < end:
                total += self._idle(s, t, end)
        self.cursor = end
        return total

    def _idle(self, s: int, start: float, end: float) -> float:
        """Stage ``s`` idle from ``start`` to ``end`` (its last slice's tail, standby, idle)."""
        since = start - self.last_end[s]
        tail = self.last_w[s] - self.last_sb[s] if self.tail_ms > 0.0 else 0.0
        e = idle_j(self.stage_idle_w, self.last_sb[s], self.standby_ms, since, end - start, tail, self.tail_ms)
        self.idle_j[s] += e
        return e

    # -- the run's end ---------------------------------------------------------------------------
    def close(self, start: float, end: float) -> None:
        """Add the idle stretches of the window ``[start, end]`` before the first batch (every
        stage fully idle) and after the last landing."""
        if self.closed:
            return
        self.closed = True
        first = min(self.first_start, self.initial_end if self.initial_end is not None else INF, end)
        if first > start:
            for s in range(self.stages):
                self.idle_j[s] += idle_j(self.stage_idle_w, self.stage_standby_w, self.standby_ms, INF, first - start)
        if is_off(self.offs):  # off at the end: nothing after its switch-off
            return
        if self.cursor > -INF and end > self.cursor:
            self._idle_stretch(end)

    def record(self, start: float, end: float) -> dict:
        """The instance's part of the run's energy record (see the module docstring)."""
        return {
            "busy_j": sum(self.busy_j), "idle_j": sum(self.idle_j), "busy_ms": self.in_flight_ms,
            "peak_w": self.peak_w, "idle_w": self.idle_w, "standby_w": self.standby_w, "standby_ms": self.standby_ms,
            "tail_ms": self.tail_ms, "tails": self.tails, "standby_left": self.standby_left, "rows_j": self.rows_j,
            **({"standby_at": self.standby_at} if self.standby_at else {}),
            "stages": [{"busy_j": b, "idle_j": i, "busy_ms": ms}
                       for b, i, ms in zip(self.busy_j, self.idle_j, self.busy_ms)],
            **({"discarded_j": self.discarded_j} if self.discarded_j else {}),
            **off_record(self.offs, start, end),
            **host_record(self.model),
        }
