"""A hunt's counterexample as harness cases: is the behaviour ``schedlab hunt`` found vLLM's?

``schedlab hunt --out DIR`` writes the workload it found (``counterexample.jsonl``) and an
experiment that replays it (``counterexample.toml``), timed by the hunt's cost model. The
harness times every iteration at 1 ms, so the workload cannot be handed over as it is. Instead
(:func:`counterexample_cases`):

1. the experiment is replayed on the reference engine, which records every iteration;
2. for each run that uses the ``vllm`` scheduler, and each of its instances, a request's arrival
   becomes the number of that instance's iterations that started before it arrived -- in the
   harness's 1-ms world it then arrives at the start of the iteration that first saw it, so the
   scheduler meets the same arrivals between the same steps;
3. the settings are the ones the run resolved (its scheduler's, its KV pool's blocks).

The harness then runs vLLM's scheduler and schedlab's side by side on each case. If they agree,
the counterexample's step sequence is vLLM's own. :func:`step_outcomes` gives the replay's
per-request steps, so the cli can also check the mapping: the harness's schedlab side must
match the replay itself. (The milliseconds are the cost model's, and a router's choices are
schedlab's; neither is checked here.)
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import numpy as np

from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, DiffRequest, Sides
from schedlab.errors import ConfigError

from .case import DiffSettings

#: The ``vllm`` preset's settings a case cannot carry: a run that changes them is not compared.
FIXED = {"preemption": "recompute", "watermark": 0.0, "prefill_first": False, "running_order": "admission",
         "reserve_full_prompt": True, "priority_preemption": False, "max_wait_ms": 0.0, "min_batch": 0,
         "chunk_unit": 1, "decodes_wait_for_budget": False, "allocation": "grow"}


@attrs.frozen
class HuntCase:
    """One run's instance of a counterexample as a harness case, with the sides its run needs
    (chunked prefill off, asynchronous scheduling), and what the replay made of it, in steps."""

    label: str
    case: Case
    sides: Sides
    replay: dict  # request id -> (first scheduled step, first token step, finish step, preemptions)


def counterexample_cases(folder) -> tuple[list[HuntCase], list[str]]:
    """The cases of a hunt's output folder, and why runs were left out (one line each)."""
    from schedlab.study.experiment import load, run_experiment

    folder = Path(folder)
    path = folder / "counterexample.toml"
    if not path.is_file():
        raise ConfigError(f"--hunt {folder}: no counterexample.toml (the folder `schedlab hunt --out` writes)")
    rows = [json.loads(line) for line in (folder / "counterexample.jsonl").read_text().splitlines() if line.strip()]
    exp = load(path, ["experiment.timeline=true"])
    # every iteration a row of its own: the reference engine's timeline (the fast one's runs of steps)
    exp.studies = [attrs.evolve(s, base=attrs.evolve(s.base, engine="reference")) for s in exp.studies]
    results = run_experiment(exp)
    cases, skipped = [], []
    for study in results.studies:
        for run in study.runs:
            why = _not_comparable(run)
            if why:
                skipped.append(f"{run.name}: {why}")
                continue
            for instance in range(int(run.meta.get("instances") or 1)):
                try:
                    cases.append(_case(run, instance, rows))
                except ValueError as exc:
                    skipped.append(f"{run.name} instance {instance}: {exc}")
    return cases, skipped


def _not_comparable(run) -> str | None:
    """Why ``run`` cannot be a case, or None."""
    if run.settings.get("scheduler", {}).get("kind") != "vllm":
        return "not the vllm scheduler"
    s = run.meta["scheduler"]
    changed = [f"{k} = {s.get(k)!r}" for k, v in FIXED.items() if s.get(k, v) != v]
    if s.get("policy") not in ("fcfs", "priority"):
        changed.append(f"policy = {s.get('policy')!r}")
    if run.meta.get("speculative") or "pools" in run.meta and run.meta["pools"]:
        changed.append("speculative decoding or disaggregated pools")
    return f"settings the harness does not carry ({', '.join(changed)})" if changed else None


def _case(run, instance: int, rows: list[dict]) -> HuntCase:
    s, kv = run.meta["scheduler"], run.meta["kv_cache"]
    timeline = run.timeline
    mine = np.asarray(timeline["instance"]) == instance
    if np.any(np.asarray(timeline["iterations"])[mine] != 1):
        raise ValueError("its timeline has runs of steps, not one row per iteration")
    starts = np.sort(np.asarray(timeline["time_ms"])[mine])
    req = run.requests
    here = np.flatnonzero(np.asarray(req["instance"]) == instance)
    requests, replay = [], {}
    for i in here:
        rid = int(req["id"][i])
        row = rows[rid]
        group = row.get("prefix_group")
        requests.append(DiffRequest(
            id=rid, arrival=int(np.searchsorted(starts, float(req["arrival_ms"][i]) - 1e-9)),
            prompt_tokens=int(row["prompt_tokens"]), output_tokens=int(row["output_tokens"]),
            priority=int(row.get("priority", 0)), group=group,
            prefix_len=int(row.get("prefix_tokens", 0)) if group is not None else 0))
        replay[rid] = _steps(starts, req, i)
    settings = DiffSettings(
        block_size=int(kv["block_size"]), num_blocks=int(kv["num_blocks"]), max_num_seqs=int(s["max_num_seqs"]),
        max_num_batched_tokens=int(s["max_num_batched_tokens"]),
        long_prefill_token_threshold=int(s["long_prefill_token_threshold"]),
        prefix_caching=bool(kv.get("prefix_caching")), policy=s["policy"],
        max_model_len=min(int(run.meta.get("max_model_len") or MAX_MODEL_LEN), MAX_MODEL_LEN))
    schedlab, engine = {}, {}
    if not s["chunked_prefill"]:
        schedlab["chunked_prefill"], engine["enable_chunked_prefill"] = False, False
    if s["async_scheduling"] is True:
        schedlab["async_scheduling"], engine["async_scheduling"] = True, True
    label = f"{run.name}" + (f" instance {instance}" if int(run.meta.get("instances") or 1) > 1 else "")
    return HuntCase(label, Case(settings=settings, requests=sorted(requests, key=lambda r: r.id), group=label),
                    Sides(schedlab, engine), replay)


def _steps(starts: np.ndarray, req: dict, i: int) -> tuple:
    """Request ``i``'s (first scheduled, first token, finish, preemptions) in its instance's steps,
    as the harness's 1-ms clock has them: the steps started before a time -- the first scheduled
    step's index at its start, the step a token came out of plus one at its end."""
    def steps_before(ms: float):
        return int(np.searchsorted(starts, ms - 1e-9)) if ms >= 0 else None

    return (steps_before(float(req["first_scheduled_ms"][i])), steps_before(float(req["first_token_ms"][i])),
            steps_before(float(req["finish_ms"][i])), int(req["preemptions"][i]))
