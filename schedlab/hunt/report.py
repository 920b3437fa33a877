"""A hunt's outcome as files and lines: the summary, the reproducers, the pictures."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from .config import Goal
from .evaluate import Score
from .expression import split_name
from .hunt import RANDOM, SEARCH, SHRINKING, Hunt, HuntOutcome, random_samples
from .output import copy_plugins, replay_document, requests_jsonl, summary_json, toml_document, write_text
from .plots import counterexample_figure, search_figure, timeline_png


def _columns(goal: Goal, runs: tuple[str, ...]) -> list[str]:
    columns = ["finished"]
    for name in goal.names:
        run, metric = split_name(name, runs)
        if run and metric not in columns:
            columns.append(metric)
    return columns


def _value(score: Score | None) -> float | None:
    return None if score is None or math.isnan(score.value) else score.value


def stop_reason(hunt: Hunt, outcome: HuntOutcome) -> str | None:
    """Why the search evaluated fewer workloads than its budget, or None when it did not."""
    cfg, goal, search = hunt.config, outcome.goal, outcome.search
    if len(search) >= cfg.budget:
        return None
    stopped = f"search stopped at {len(search)} of {cfg.budget}"
    if outcome.interrupted == SEARCH:
        return f"{stopped}: interrupted"
    if cfg.stop_on_counterexample and any(t.score.feasible and goal.found(t.score.value) for t in search):
        return f"{stopped}: the property is falsified (stop_on_counterexample)"
    return f"{stopped} (time_limit_s = {cfg.time_limit_s:g})"


def _of(count: int, total: int) -> str:
    """``"all 8"`` or ``"3 of 8"``: how many of a hunt's workloads something happened on."""
    return f"all {count}" if count == total else f"{count} of {total}"


def undefined_line(outcome: HuntOutcome) -> str | None:
    """How many workloads (of both searches) left the goal's expression without a value, and the
    commonest reason; None when every one had a value or a failed run."""
    trials = outcome.search + outcome.random
    reasons = Counter(t.score.undefined for t in trials if t.score.undefined)
    if not reasons:
        return None
    share = _of(sum(reasons.values()), len(trials))
    what = "objective" if outcome.goal.property is None else "property's expression"
    return f"the {what} was undefined on {share} workloads ({reasons.most_common(1)[0][0]})"


def rejected_line(hunt: Hunt, outcome: HuntOutcome) -> str | None:
    """On how many workloads (of both searches) a run rejected requests, the commonest reason, and
    how they counted; None when no run rejected any."""
    trials = outcome.search + outcome.random
    hit = [t for t in trials if t.score.rejected]
    if not hit:
        return None
    reasons = Counter(t.score.rejection for t in hit if t.score.rejection)
    share = _of(len(hit), len(trials))
    why = f" ({reasons.most_common(1)[0][0]})" if reasons else ""
    counted = ("counted as feasible (allow_rejected = true): their metrics leave the rejected requests out"
               if hunt.config.allow_rejected else
               "counted as infeasible ([hunt] allow_rejected = true counts them)")
    return f"runs rejected requests on {share} workloads{why}; {counted}"


def error_line(outcome: HuntOutcome) -> str | None:
    """On how many workloads a run failed (stalled, an impossible request), and the commonest error."""
    trials = outcome.search + outcome.random
    errors = Counter(t.score.error for t in trials if t.score.error)
    if not errors:
        return None
    share = _of(sum(errors.values()), len(trials))
    return f"a run failed on {share} workloads ({errors.most_common(1)[0][0]}); the first is failure.toml"


def interrupted_line(hunt: Hunt, outcome: HuntOutcome) -> str | None:
    """What an interrupted hunt left: where it stopped and what its files are."""
    where = outcome.interrupted
    if where is None:
        return None
    if where == RANDOM:
        samples = random_samples(hunt.config, len(outcome.search))
        where = f"random sampling ({len(outcome.random)} of {samples} workloads)"
    elif where == SEARCH:
        where = f"the search ({len(outcome.search)} of {hunt.config.budget} workloads)"
    elif where == SHRINKING:
        where = f"shrinking ({outcome.shrink_evaluations} evaluations)"
    else:
        where = "the final replay"
    if outcome.shrunk is not None:
        kept = "counterexample.* is the workload shrunk so far, worst.* the worst before shrinking"
    elif written_worst(outcome):
        kept = "worst.* is the worst workload so far, unshrunk"
    else:
        kept = "no workload to write"
    return f"interrupted during {where}: {kept}"


def written_worst(outcome: HuntOutcome) -> bool:
    """Whether the worst workload is one to write: feasible and, with a property, falsifying it."""
    worst, goal = outcome.worst, outcome.goal
    return worst is not None and (goal.property is None or goal.found(worst.score.value))


def constraint_lines(outcome: HuntOutcome, allow_rejected: bool = False) -> list[str]:
    """When no workload was feasible: per constraint, on how many workloads it failed and the
    range of its values (a hunt that met none said only "none feasible", after its whole budget).
    Workloads with rejected requests are left out unless ``allow_rejected`` (:func:`rejected_line`
    counts them)."""
    trials = [t for t in outcome.search + outcome.random
              if t.score.error is None and (allow_rejected or not t.score.rejected)]
    if not outcome.goal.constraints or not trials or any(t.score.feasible for t in trials):
        return []
    lines = []
    for constraint in outcome.goal.constraints:
        values = [constraint.expression.value(lambda name, t=t: t.score.values[name]) for t in trials]
        broken = sum(1 for v in values if constraint.violation(v) > 0)
        finite = [v for v in values if math.isfinite(v)]
        seen = f"values {min(finite):.4g} to {max(finite):.4g}" if finite else "no value"
        lines.append(f"  {constraint.text}: failed on {broken} of {len(trials)} workloads ({seen})")
    return ["no workload met the constraints:"] + lines


def source_line(outcome: HuntOutcome) -> str | None:
    """Which of the search and random sampling found the worst workload (the one shrunk), with
    both values; None when neither found a feasible one or random sampling did not run."""
    worst = outcome.worst
    if worst is None or not outcome.random:
        return None
    other, rival = (outcome.search_best, "the search") if outcome.worst_from == RANDOM \
        else (outcome.random_best, "random sampling")
    against = f"; {rival} found none feasible" if other is None else f" vs {rival}'s {other.score.value:.4g}"
    source = "the search" if outcome.worst_from == SEARCH else outcome.worst_from
    return f"the worst came from {source} ({worst.score.value:.4g}{against})"


def summary(hunt: Hunt, outcome: HuntOutcome) -> dict[str, Any]:
    goal = outcome.goal
    worst, search_best, random_best = outcome.worst, outcome.search_best, outcome.random_best
    return {
        "goal": goal.describe(),
        "objective": goal.expression.text,
        "property": goal.property.text if goal.property else None,
        "constraints": [c.text for c in goal.constraints],
        "seed": hunt.experiment.config.seed,
        "interrupted": outcome.interrupted,
        "allow_rejected": hunt.config.allow_rejected,
        "search": {"evaluations": len(outcome.search),
                   "worst": _value(search_best.score if search_best else None),
                   "feasible": sum(t.score.feasible for t in outcome.search),
                   "errors": sum(t.score.error is not None for t in outcome.search),
                   "undefined": sum(t.score.undefined is not None for t in outcome.search),
                   "rejected": sum(bool(t.score.rejected) for t in outcome.search),
                   "stopped": stop_reason(hunt, outcome),
                   "values": [t.score.value if t.score.feasible else None for t in outcome.search]},
        "random": {"evaluations": len(outcome.random),
                   "worst": _value(random_best.score if random_best else None),
                   "feasible": sum(t.score.feasible for t in outcome.random),
                   "undefined": sum(t.score.undefined is not None for t in outcome.random),
                   "errors": sum(t.score.error is not None for t in outcome.random),
                   "rejected": sum(bool(t.score.rejected) for t in outcome.random),
                   "values": [t.score.value if t.score.feasible else None for t in outcome.random]},
        "failure": None if outcome.first_failure is None else {
            "error": outcome.first_failure.score.error, "requests": len(outcome.first_failure.candidate.rows),
            "settings": outcome.first_failure.candidate.settings},
        "found": bool(worst and goal.property is not None and goal.found(worst.score.value)),
        "worst": None if worst is None else {"from": outcome.worst_from, "value": _value(worst.score),
                                             "requests": len(worst.candidate.rows),
                                             "settings": worst.candidate.settings, "values": worst.score.values,
                                             "rejected": _rejected(hunt, worst.score)},
        "shrunk": None if outcome.shrunk is None else {
            "requests": len(outcome.shrunk.rows), "value": _value(outcome.shrunk_score),
            "settings": outcome.shrunk.settings, "values": outcome.shrunk_score.values,
            "rejected": _rejected(hunt, outcome.shrunk_score),
            "evaluations": outcome.shrink_evaluations},
    }


def _rejected(hunt: Hunt, score: Score) -> dict[str, int]:
    """Run -> how many requests it rejected, every run named (0: none)."""
    return {run: score.rejected.get(run, 0) for run in hunt.runs}


def write_reproducer(hunt: Hunt, outcome: HuntOutcome, folder: Path, label: str, candidate, score: Score,
                     note: str = "") -> list[Path]:
    """``<label>.jsonl`` and ``<label>.toml`` (the experiment replaying it), the header saying its
    value, how many requests each run rejected, and ``note``."""
    goal = outcome.goal
    found_by = "" if outcome.worst_from == SEARCH else f" (from {outcome.worst_from}, not the search)"
    rejected = ", ".join(f"{run} {n}" for run, n in _rejected(hunt, score).items())
    shown = f"a run failed with {len(candidate.rows)} requests: {score.error}" if score.error is not None else \
        f"value {score.value:.6g} with {len(candidate.rows)} requests{found_by}"
    header = (f"{label} of `schedlab hunt {hunt.experiment.path}` (seed {hunt.experiment.config.seed}): "
              f"{goal.describe()}\n{shown}\n"
              f"requests rejected: {rejected}\n" + (f"{note}\n" if note else "") +
              f"replay it with\n  schedlab run {label}.toml")
    doc = replay_document(hunt.experiment, candidate, f"{label}.jsonl", name=f"{hunt.name}_{label}",
                          columns=_columns(goal, hunt.runs), folder=folder)
    return [write_text(folder, f"{label}.jsonl", requests_jsonl(candidate)),
            write_text(folder, f"{label}.toml", toml_document(doc, header))]


def write_partial(hunt: Hunt, outcome: HuntOutcome, folder: Path) -> list[Path]:
    """The files of an interrupted hunt: ``hunt.json`` (``interrupted`` saying where, the
    evaluations so far), ``summary.txt``, the worst workload so far (unshrunk) and, when
    shrinking had taken a step, the workload shrunk so far as the counterexample; no pictures."""
    written = [write_text(folder, "hunt.json", summary_json(summary(hunt, outcome)))]
    if written_worst(outcome):
        written += write_reproducer(hunt, outcome, folder, "worst", outcome.worst.candidate, outcome.worst.score,
                                    "(the hunt was interrupted: the worst workload so far, not shrunk)")
        if outcome.shrunk is not None:
            written += write_reproducer(hunt, outcome, folder, "counterexample", outcome.shrunk,
                                        outcome.shrunk_score,
                                        "(the hunt was interrupted while shrinking: the workload shrunk so far)")
        written += copy_plugins(hunt.experiment, folder)
    written += write_failure(hunt, outcome, folder)
    written.append(write_text(folder, "summary.txt", "\n".join(summary_lines(hunt, outcome)) + "\n"))
    return written


def write_failure(hunt: Hunt, outcome: HuntOutcome, folder: Path) -> list[Path]:
    """``failure.jsonl`` and ``failure.toml``: the first workload on which a run failed (a plugin
    that raised, a stalled scheduler, settings that do not build), so that it can be replayed."""
    failure = outcome.first_failure
    if failure is None:
        return []
    written = write_reproducer(hunt, outcome, folder, "failure", failure.candidate, failure.score,
                               "(the first workload of the hunt on which a run failed)")
    return written + copy_plugins(hunt.experiment, folder)


def file_part(name: str) -> str:
    """A run's name as part of a file name: a character a file name cannot hold (``/``) as ``_``."""
    return re.sub(r"[^\w.-]", "_", name)


def write_outcome(hunt: Hunt, outcome: HuntOutcome, folder: Path) -> list[Path]:
    """The files of a hunt (see the README): requests and reproducers, summary, pictures."""
    goal = outcome.goal
    written = []
    info = summary(hunt, outcome)
    written.append(write_text(folder, "hunt.json", summary_json(info)))

    def values(which: str) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in info[which]["values"]], dtype=float)

    curves = {f"search ({hunt.config.optimizer})": values("search")}
    if outcome.random:
        curves["random sampling"] = values("random")
    written.append(write_text(folder, "search.png", search_figure(curves, goal)))
    if outcome.shrunk is not None:
        for label, candidate, score in (("worst", outcome.worst.candidate, outcome.worst.score),
                                        ("counterexample", outcome.shrunk, outcome.shrunk_score)):
            written += write_reproducer(hunt, outcome, folder, label, candidate, score)
        written += copy_plugins(hunt.experiment, folder)  # the reproducers import them from their folder
        subtitle = f"{goal.expression.text} = {outcome.shrunk_score.value:.4g} ({len(outcome.shrunk.rows)} requests)"
        written.append(write_text(folder, "counterexample.png", counterexample_figure(outcome.shrunk_runs, subtitle)))
        for name, run in outcome.shrunk_runs.items():
            png = timeline_png(run)
            if png is not None:
                written.append(write_text(folder, f"timeline_{file_part(name)}.png", png))
    written += write_failure(hunt, outcome, folder)
    written.append(write_text(folder, "summary.txt", "\n".join(summary_lines(hunt, outcome)) + "\n"))
    return written


def property_line(outcome: HuntOutcome) -> str:
    """Whether the property was falsified -- or held, on how many workloads: only those feasible
    test it, and with none feasible it was not tested at all."""
    worst, goal = outcome.worst, outcome.goal
    if worst is not None and goal.found(worst.score.value):
        return "property falsified"
    trials = outcome.search + outcome.random
    tested = sum(t.score.feasible for t in trials)
    if tested == 0:
        return "property not tested: no workload was feasible"
    return f"property held on every feasible workload ({_of(tested, len(trials))})"


def summary_lines(hunt: Hunt, outcome: HuntOutcome, out: str | None = None) -> list[str]:
    goal = outcome.goal
    lines = [f"hunt {hunt.name}: {goal.describe()}"]
    interrupted = interrupted_line(hunt, outcome)
    if interrupted:
        lines.append(interrupted)
    if goal.constraints:
        lines.append("constraints: " + "; ".join(c.text for c in goal.constraints))
    search_best, random_best = outcome.search_best, outcome.random_best

    def shown(trial):
        return "none feasible" if trial is None else f"{trial.score.value:.4g} ({len(trial.candidate.rows)} requests)"

    lines.append(f"search: {len(outcome.search)} workloads, worst {shown(search_best)}")
    stopped = stop_reason(hunt, outcome)
    if stopped:
        lines.append(stopped)
    if outcome.random:
        lines.append(f"random sampling: {len(outcome.random)} workloads, worst {shown(random_best)}")
    source = source_line(outcome)
    if source:
        lines.append(source)
    for line in (undefined_line(outcome), rejected_line(hunt, outcome), error_line(outcome)):
        if line:
            lines.append(line)
    lines += constraint_lines(outcome, hunt.config.allow_rejected)
    if goal.property is not None:
        lines.append(property_line(outcome))
    if outcome.shrunk is not None:
        lines.append(f"shrunk: {len(outcome.shrunk.rows)} requests, value {outcome.shrunk_score.value:.4g} "
                     f"({outcome.shrink_evaluations} evaluations)")
        budget = hunt.config.shrink_budget
        if 0 < budget <= outcome.shrink_evaluations:
            lines.append(f"shrink budget of {budget} used up: a larger one may shrink it further")
        if out is not None:
            lines.append(f"replay: schedlab run {Path(out) / 'counterexample.toml'}")
    return lines
