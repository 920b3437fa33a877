"""What a search's answer rests on, said with it: failed requests the constraints do not count, a
warm-up left out, a quantile over too few samples, a closed loop's opening burst, the engine's view
under a front end, and the noise between draws (:func:`answer_caveats`, which :class:`~.drivers.StudySearchDriver`
appends to the search's message)."""

from __future__ import annotations

import math
import re

import numpy as np

from ..results.metrics import client_latencies, completed, measured_requests, request_latencies, warmup_count
from ..results.stability import MIN_REQUESTS, stability_text


#: a run that held at least this share of its requests at once never settled (see answer_caveats)
UNSETTLED_SHARE = 0.5
#: a constraint's metric this close to its threshold (a share of it) at a search's answer, in one
#: draw (no replicas), gets a note that another seed can move the answer (see answer_caveats)
NEAR_SHARE = 0.05
#: requests that leave unfinished, the constraint metrics that count them among the rest, and how
#: the note names them
_FAILED_COUNTS = (
    ("rejected", {"rejected", "finished"}, "were rejected"),
    ("timed_out", {"timed_out", "finished"}, "timed out"),
    ("aborted", {"aborted", "timed_out", "finished"}, "were aborted by the engine"),
)
#: the last part of a metric that counts failed requests as misses (``slo.attainment``, ``slo.goodput_rps``)
_COUNTS_FAILED = frozenset({"attainment", "goodput_rps"})
#: engine-side latencies and what ``vllm bench serve`` reports instead with a front end
_CLIENT_SIDE = {"ttft_ms": "client.ttft_ms", "tpot_ms": "client.tpot_ms", "e2e_ms": "client.e2el_ms"}
_NOUNS = {"ttft_ms": "TTFTs", "tpot_ms": "TPOTs", "e2e_ms": "end-to-end latencies", "e2el_ms": "end-to-end latencies",
          "queue_ms": "queue times", "loop_queue_ms": "queue times", "ntpot_ms": "normalized TPOTs",
          "frontend_ms": "front-end times", "e2el_incl_queue_ms": "end-to-end latencies with the client's wait"}
_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def answer_caveats(outcome, constraints, key: str | None = None) -> str:
    """What to know about the answer's run before trusting it, or '':

    * a run :mod:`schedlab.results.stability` finds overloaded, or cannot clear (:func:`overload_note`);
    * requests it turned away, or whose clients gave up (timed out; aborted by the engine):
      percentiles count finished ones only, so a server that fails more looks faster -- unless a
      constraint counts them (on ``rejected``/``timed_out``/``aborted``/``finished``, or
      ``slo.attainment``, which counts them as misses). Replicated runs' counts are means;
    * a run that held half or more of its requests at once (of 20 or more: fewer cannot show a
      trend, as :mod:`schedlab.results.stability` takes them) (an overload taken into the running
      batch does not queue, so its percentiles measure how long the run was: SGLang admits up to
      2,048 requests);
    * a found boundary whose ``*.pNN`` rests on fewer than 100 / (100 - NN) values at the answer
      or the failing value (:func:`_few_samples_note`);
    * a search with a ``warmup``: what the answer's statistics leave out (:func:`_warmup_note`);
    * a closed loop whose values above the constrained quantile are mostly its opening wave
      (:func:`_burst_note`), with the way out: ``search.warmup``, staggered starts, a longer run;
    * a run with a ``[frontend]`` constrained on the engine's ``ttft_ms``/``tpot_ms``/``e2e_ms``;
    * the noise: with replicas each constraint metric's mean and 95% interval at the answer and the
      failing value (``within noise`` when one holds the threshold); in one draw, a note when the
      answer's metric is within :data:`NEAR_SHARE` of the threshold (:func:`_noise_note`).

    ``key``: the searched key, to name the failing value by (``at workload.clients = 18``)."""
    answer, failing = _probe_run(outcome, outcome.value), _probe_run(outcome, outcome.failing)
    at_failing = f"at {key} = {_fmt_value(outcome.failing)}" if key else f"at {_fmt_value(outcome.failing)}"
    notes = []
    metrics = getattr(answer, "metrics", None)
    if isinstance(metrics, dict):
        notes += [note] if (note := overload_note(metrics, "at the answer")) else []
        notes += _failed_requests_notes(metrics, constraints, answer)
        requests, peak = metrics.get("requests"), metrics.get("peak_running")
        if _count(peak) and _count(requests) and requests >= MIN_REQUESTS and peak >= UNSETTLED_SHARE * requests:
            notes.append(f"at the answer up to {_n(peak)} of {_n(requests)} requests ran at once: the run may be too "
                         "short to show an overload, which the running batch takes in (more requests, or a TPOT "
                         "constraint, would)")
    for note in (_warmup_note(answer), _few_samples_note(outcome, constraints, answer, failing, at_failing),
                 _burst_note(outcome, constraints, answer, failing, at_failing),
                 _frontend_note(outcome, constraints), _noise_note(outcome, constraints, answer, failing, at_failing)):
        if note:
            notes.append(note)
    return "; ".join(notes)


def overload_note(metrics: dict, where: str) -> str:
    """``at the answer the run is unstable: waiting grows ... (arrivals 16.5/s, capacity 13.4/s):
    ...`` for a run :mod:`schedlab.results.stability` finds overloaded (or whose growth it cannot
    rule out), else '': an overloaded server's percentiles say how long the run lasted, so a short run
    can pass a constraint far past capacity (a search's answer, a plan's cheapest deployment)."""
    text = stability_text(metrics.get("stability"))
    verdict = text.split(":", 1)[0]
    if verdict not in ("unstable", "inconclusive"):
        return ""
    its = "its" if verdict == "unstable" else "if it is overloaded, its"
    return (f"{where} the run is {text}: {its} percentiles say how long the run lasted, not what the server "
            "sustains (more requests would show it)")


def _probe_run(outcome, value):
    """The run of the probe at ``value`` (None when there is none)."""
    if value is None:
        return None
    probe = next((p for p in outcome.probes if p.value == value), None)
    run = getattr(probe, "payload", None)
    return run if isinstance(getattr(run, "metrics", None), dict) else None


def _count(value) -> bool:
    """A positive count: a whole number, or a replicated run's mean of them."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _n(value) -> str:
    """A count as the notes write it: ``1,200``; a mean of counts with one decimal (``12.4``)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"


def _g(value: float) -> str:
    """A metric's value in a note: 4 significant digits, whole numbers from 1,000 on."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _replicas(run) -> list:
    """The runs a (possibly replicated) run's statistics come from: its replicas, or itself."""
    return list(getattr(run, "replicas", None) or [run])


def _failed_requests_notes(metrics: dict, constraints, run) -> list[str]:
    """Requests rejected, timed out or aborted at the answer that no constraint counts (aborted
    requests are among the timed-out ones: their clients gave up)."""
    requests = metrics.get("requests")
    named = {c.metric for c in constraints}
    if not _count(requests) or any(c.metric.rsplit(".", 1)[-1] in _COUNTS_FAILED for c in constraints):
        return []
    counts = {key: metrics.get(key) for key, counted_by, _ in _FAILED_COUNTS
              if _count(metrics.get(key)) and not named & counted_by}
    parts = []
    for key, _, verb in _FAILED_COUNTS:
        if key not in counts:
            continue
        if key == "aborted" and "timed_out" in counts:
            parts[-1] = f"{parts[-1]}, {_n(counts[key])} of them aborted by the engine"
        else:
            parts.append(f"{_n(counts[key])} of {_n(requests)} requests {verb}")
    if not parts:
        return []
    if list(counts) == ["rejected"]:
        fix = 'add "rejected <= 0" to count them'
    else:
        keys = [key for key in counts if key != "aborted" or "timed_out" not in counts]
        named_fix = " or ".join(f'"{key} <= 0"' for key in keys)
        fix = f"add {named_fix} to count them, or constrain slo.attainment, which counts them as misses"
    several = len(_replicas(run))
    where = f"at the answer (mean of {several} replicas)" if several > 1 else "at the answer"
    return [f"{where} {' and '.join(parts)} (percentiles count finished ones: {fix})"]


_QUANTILE = re.compile(r"p(\d+)")


def _quantile(metric: str) -> float | None:
    """NN of a ``*.pNN`` metric name (None for other metrics)."""
    match = _QUANTILE.fullmatch(metric.rsplit(".", 1)[-1])
    return float(match[1]) if match and "." in metric else None


def _values(run, metric: str):
    """The per-request values a ``*.pNN`` metric is the quantile of, in one run (not replicated),
    with the row index of each; None when the run keeps no rows for it (a streamed run, ITL, or a
    metric of no per-request latency)."""
    parts = metric.split(".")
    req = getattr(run, "requests", None)
    if getattr(run, "rows_file", None) is not None or not isinstance(req, dict) or "id" not in req or len(parts) < 2:
        return None
    scope, name = parts[:-2], parts[-2]
    rows = np.flatnonzero(_measured(run))  # (a search's warm-up is left out, as the metric leaves it out)
    if len(scope) >= 2 and scope[0] == "per_class" and "request_class" in req:   # (a class name may hold dots)
        rows = rows[req["request_class"][rows].astype(str) == ".".join(scope[1:])]
        scope = []
    sub = {k: v[rows] for k, v in req.items()}
    if scope == ["client"]:
        latencies = client_latencies(sub)
    elif not scope:
        latencies = request_latencies(sub)
    else:
        return None
    if name not in latencies:
        return None
    done = np.flatnonzero(completed(sub))
    if name == "tpot_ms":
        done = done[sub["generated_tokens"][done] > 1]
    return latencies[name], rows[done]


def _warmup(run):
    """The run's warm-up (a search's ``warmup``: a count or a share), or 0."""
    meta = getattr(run, "meta", None)
    return meta.get("warmup") or 0 if isinstance(meta, dict) else 0


def _cooldown(run):
    """The run's cool-down (a search's ``cooldown``), or 0."""
    meta = getattr(run, "meta", None)
    return meta.get("cooldown") or 0 if isinstance(meta, dict) else 0


def _measured(run) -> np.ndarray:
    """Which of a run's rows its statistics count: all but its warm-up's and cool-down's."""
    return measured_requests(run.requests, _warmup(run), _cooldown(run))


def _set_by(n: int, q: float) -> int:
    """How many of the largest of ``n`` values numpy's linear ``q``-th percentile rests on."""
    return n - math.floor((n - 1) * q / 100)


def _word(k: int) -> str:
    return _WORDS[k] if k < len(_WORDS) else f"{k:,}"


def _few_samples_note(outcome, constraints, answer, failing, at_failing: str) -> str:
    """A found boundary whose quantile, at the answer or at the failing value, is over fewer than
    ``100 / (100 - NN)`` values (a p99 of 50: the two largest decide it); runs of fewer than
    :data:`MIN_REQUESTS` requests are left alone."""
    if outcome.status != "found":
        return ""
    notes = []
    for c in dict((c.metric, c) for c in constraints).values():
        q = _quantile(c.metric)
        if q is None or q >= 100:
            continue
        need = 100 / (100 - q)
        found = []
        for run, where in ((answer, "at the answer"), (failing, at_failing)):
            if run is None or not _count(run.metrics.get("requests")) or run.metrics["requests"] < MIN_REQUESTS:
                continue
            sizes = [v[0].size for v in map(lambda r: _values(r, c.metric), _replicas(run)) if v is not None]
            if not sizes or min(sizes) == 0 or min(sizes) >= need:
                continue
            n = min(sizes)
            noun = _NOUNS.get(c.metric.split(".")[-2], "values")
            each = " (in a replica)" if len(sizes) > 1 else ""
            said = f"the p{q:g} of {n:,} {noun}{each}: the largest {_word(_set_by(n, q))}"
            if found and found[-1][1] == said:
                found[-1] = (f"{found[-1][0]} and {where}", said)
            else:
                found.append((where, said))
        if found:
            found = [f"{where} {said}" for where, said in found]
            notes.append(f"{c.metric} rests on few values ({'; '.join(found)}); a p{q:g} needs {need:,.0f} or more: "
                         "run more requests")
    return "; ".join(notes)


def _warmup_note(answer) -> str:
    """A search with a warm-up or a cool-down: what its answer's statistics leave out (a mean over
    replicas)."""
    metrics = getattr(answer, "metrics", None)
    warmup = metrics.get("warmup") if isinstance(metrics, dict) else None
    cooldown = metrics.get("cooldown") if isinstance(metrics, dict) else None
    first = warmup.get("requests") if isinstance(warmup, dict) else None
    last = cooldown.get("requests") if isinstance(cooldown, dict) else None
    if not _count(first) and not _count(last):
        return ""
    measured = warmup.get("measured", 0) if isinstance(warmup, dict) else 0
    parts = [f"the first {_n(first)}" if _count(first) else "", f"the last {_n(last)}" if _count(last) else ""]
    settings = [f"search.warmup = {_warmup(answer)!r}" if _count(first) else "",
                f"search.cooldown = {_cooldown(answer)!r}" if _count(last) else ""]
    total = (first or 0) + (last or 0) + measured
    return (f"at the answer the percentiles and slo.attainment leave out {' and '.join(filter(None, parts))} of "
            f"{_n(total)} requests sent ({', '.join(filter(None, settings))}), and the throughputs are over the "
            f"window the other {_n(measured)} ran in (vllm bench serve counts every request)")


def _fmt_value(value) -> str:
    """A searched value as a note names it (``18``, ``4.5``)."""
    return str(value) if isinstance(value, int) or value is None else f"{value:g}"


def _burst_note(outcome, constraints, answer, failing, at_failing: str) -> str:
    """A closed loop whose clients all send at once (no ``stagger_ms``), where most values at or
    above a constrained quantile are the opening wave's: at the failing value, the answer measures
    the start-up burst, as ``vllm bench serve --max-concurrency`` does, not steady serving; else at
    the answer, the answer's quantile does (while the failing value failed for another reason)."""
    for run, where, whose in ((failing, at_failing, "the answer"), (answer, "at the answer", "the answer's {metric}")):
        workload = getattr(run, "settings", {}).get("workload") if run is not None else None
        if not isinstance(workload, dict) or workload.get("kind") != "closed_loop" or workload.get("stagger_ms"):
            continue
        for c in constraints:
            q = _quantile(c.metric)
            found = _values(run, c.metric) if q is not None else None
            if found is None or found[0].size == 0:
                continue
            values, rows = found
            req = run.requests
            sent = req["sent_ms"] if "sent_ms" in req else req["arrival_ms"]
            wave = sent == sent.min()
            size = int(wave.sum())
            if size < 2 or size == sent.size:
                continue
            top = values >= np.percentile(values, q)
            in_wave = int(wave[rows[top]].sum())
            above = int(top.sum())
            if in_wave * 2 > above:
                noun = _NOUNS.get(c.metric.split(".")[-2], "values")
                which = f"all {above}" if in_wave == above else f"{in_wave} of the {above}"
                warmup = _warmup(run)
                left_out = warmup_count(warmup, sent.size) if warmup else 0
                leave = (f"raise search.warmup (= {warmup!r}: the first {left_out} requests sent) to {size} or more"
                         if warmup else f"leave the warm-up out of the statistics (search.warmup = {size} or more: "
                                        "each run's first requests sent, a count or a share such as 0.1)")
                return (f"{where} {which} {noun} at or above the p{q:g} are the opening wave's ({size} clients "
                        f"sending at once at t = {_g(float(sent.min()))} ms): {whose.format(metric=c.metric)} is set "
                        "by the start-up burst (as vllm bench serve --max-concurrency measures it), not by steady "
                        f"serving; {leave}, spread the clients' starts (workload.stagger_ms) or run longer to see "
                        "the steady state")
    return ""


def _frontend_note(outcome, constraints) -> str:
    """A run with a ``[frontend]`` constrained on the engine's latencies, not the client's."""
    run = next((p.payload for p in outcome.probes if getattr(p.payload, "settings", None) is not None), None)
    if run is None or "frontend" not in run.settings:
        return ""
    named = list(dict.fromkeys(c.metric.split(".")[0] for c in constraints if c.metric.split(".")[0] in _CLIENT_SIDE))
    if not named:
        return ""
    instead = ", ".join(_CLIENT_SIDE[name] for name in named)
    return (f"the run has a [frontend] and {', '.join(named)} {'is' if len(named) == 1 else 'are'} the engine's "
            f"(from the request's arrival at its queue); vllm bench serve reports the client's, {instead} "
            "(from sending it): constrain that to match it")


def _noise_note(outcome, constraints, answer, failing, at_failing: str) -> str:
    """With replicas: each constraint metric's mean and 95% interval at the answer and the failing
    value, ``within noise`` when an interval holds the threshold. In one draw (a found boundary):
    a note when the answer's metric is within :data:`NEAR_SHARE` of the threshold -- not of a
    threshold of 0, which only 0 is within (``num_preemptions <= 0`` met is 0): no nearness there."""
    runs = [(run, where) for run, where in ((answer, "at the answer"), (failing, at_failing)) if run is not None]
    if not runs:
        return ""
    replicas = len(_replicas(runs[0][0]))
    if replicas > 1:
        notes = []
        for c in dict((c.metric, c) for c in constraints).values():
            parts, noisy = [], False
            for run, where in runs:
                mean, bounds = c.value(run.metrics), run.intervals.get(c.metric)
                if bounds is None or math.isnan(mean):
                    continue
                low, high = bounds
                if math.isfinite(low) and math.isfinite(high):
                    parts.append(f"{_g(mean)} [{_g(low)}, {_g(high)}] {where}")
                    noisy = noisy or low <= c.threshold <= high
            if parts:
                threshold = str(c).split(" ", 2)[-1]
                tail = f": within noise (an interval holds {threshold})" if noisy else ""
                notes.append(f"{c.metric} over {replicas} replicas, mean [95% interval]: {', '.join(parts)}{tail}")
        return "; ".join(notes)
    requests = answer.metrics.get("requests") if answer is not None else None
    if outcome.status != "found" or not _count(requests) or requests < MIN_REQUESTS:
        return ""  # (a toy run of a few requests, often of fixed lengths, is not a draw of anything)
    near = []
    for c in dict((c.metric, c) for c in constraints).values():
        value = c.value(answer.metrics)
        if c.threshold != 0 and math.isfinite(value) and abs(value - c.threshold) <= NEAR_SHARE * abs(c.threshold):
            near.append(f"{c.metric} = {_g(value)}, within {NEAR_SHARE:.0%} of its target ({str(c).split(' ', 1)[1]})")
    if not near:
        return ""
    return (f"one draw: at the answer {' and '.join(near)}, so another seed can move the answer; replicas = 3 (in "
            "[experiment] or the run; vLLM's sweep runs 3 per point) gives its spread")
