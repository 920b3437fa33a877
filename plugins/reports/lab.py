"""The ``lab`` report: seed 001's six artifacts, in exactly the seed's formats.

* ``static.txt``  -- ``total_steps=<n> throughput_tps=<x> slot_util=<0..1>``
* ``compare.txt`` -- ``static_tps=<x> continuous_tps=<x> speedup=<x>``
* ``maxseqs.txt`` -- ``max_num_seqs=<n> peak_running=<n>``
* ``queue.csv``   -- ``rps,avg_queue,p99_wait_ms``, one row per swept arrival rate
* ``cost.txt``    -- ``total_prefill_ms=<x> total_decode_ms=<x> decode_share=<0..1>``
* ``tune.txt``    -- ``target_ttft_ms=<x> max_concurrency=<n> throughput_at_target=<x>`` (a search
  with several constraints: the target is its TTFT constraint's threshold, see :func:`tune_target`)

Each artifact names the study it is read from (settings below); an artifact whose study is
missing is skipped with a note, so the report also serves partial labs. A name given other than
its default must name a study, and every name that does must name the right kind of study:
checked when the experiment file is read (:meth:`LabConfig.check_studies`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs

from schedlab.configs import FieldError, str_field
from schedlab.errors import ConfigError
from schedlab.results.storage import atomic_write, constraint_list
from schedlab.study.search import parse_constraint


@attrs.frozen
class LabConfig:
    static: str = str_field("static", help="study with the static-batching run (steps 1-2)")
    continuous: str = str_field("continuous", help="study with the continuous-batching run (steps 3-5)")
    queue: str = str_field("queue", help="sweep over workload.rate (step 6)")
    cost: str = str_field("continuous", help="run whose requests the cost split uses (step 7)")
    tune: str = str_field("tune", help="search for the largest concurrency meeting the TTFT target (step 8)")
    rate_key: str = str_field("workload.rate", help="the swept key that holds requests per second")

    def check_studies(self, studies) -> None:
        """Called when the experiment file is read: each name given other than its default names a
        study, and each name that names one names a study of the kind its artifact reads."""
        single = ("a single run", "single runs ([[runs]] with no sweep, search or plan)", lambda s: s.kind == "run")
        kinds = {
            "static": single, "continuous": single, "cost": single,
            "queue": (f"a sweep over {self.rate_key!r}", f"sweeps over {self.rate_key!r}",
                      lambda s: s.kind == "sweep" and self.rate_key in s.keys),
            "tune": ("a search", "searches", lambda s: s.kind == "search"),
        }
        by_name = {s.name: s for s in studies}
        for field, (what, plural, fits) in kinds.items():
            name = getattr(self, field)
            if name not in by_name:
                if name == attrs.fields_dict(LabConfig)[field].default:
                    continue  # a default name: its artifact is skipped (a partial lab)
                raise FieldError(field, f"no study named {name!r}; the studies are: {', '.join(by_name) or 'none'}")
            if not fits(by_name[name]):
                them = [s.name for s in studies if fits(s)]
                study = by_name[name]
                over = f" over {', '.join(map(repr, study.keys))}" if study.keys else ""
                raise FieldError(field, f"study {name!r} is a {study.kind}{over}, not {what}; "
                                        f"{plural}: {', '.join(them) or 'none'}")


def _num(x: float) -> str:
    """Numbers as the seed writes them: integers bare, others with up to 4 decimals."""
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def tune_target(constraint: str) -> float:
    """``target_ttft_ms`` of tune.txt: the threshold of the tune search's constraint. Of several
    (``constraints = [...]``), the first on a TTFT metric (``ttft_ms.*``, as the seed's target is),
    else the first one."""
    parsed = [parse_constraint(text) for text in constraint_list(constraint)]
    ttft = [c for c in parsed if c.metric.split(".")[0] == "ttft_ms"]
    return (ttft or parsed)[0].threshold


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _run(results, name: str):
    study = results.study(name)
    if len(study.runs) != 1:
        raise ConfigError(f"lab report: study {name!r} must be a single run, it has {len(study.runs)}")
    return study.runs[0]


class LabReport:
    """Writes the seed lab's artifacts from the studies named in its settings."""

    def __init__(self, config: LabConfig | None = None):
        self.config = config or LabConfig()

    def artifacts(self, results) -> dict[str, str]:
        """File name -> contents, for every artifact whose studies exist."""
        c = self.config
        names = {s.name for s in results.studies}
        out: dict[str, str] = {}
        if c.static in names:
            m = _run(results, c.static).metrics
            out["static.txt"] = (f"total_steps={m['iterations']} throughput_tps={_num(m['throughput_tps'])} "
                                 f"slot_util={_num(m['slot_utilisation'])}\n")
        if c.static in names and c.continuous in names:
            s_tps = _run(results, c.static).metrics["throughput_tps"]
            c_tps = _run(results, c.continuous).metrics["throughput_tps"]
            out["compare.txt"] = (f"static_tps={_num(s_tps)} continuous_tps={_num(c_tps)} "
                                  f"speedup={_num(c_tps / s_tps)}\n")
        if c.continuous in names:
            run = _run(results, c.continuous)
            seqs = run.settings.get("scheduler", {}).get("max_num_seqs", run.meta.get("slots"))
            out["maxseqs.txt"] = f"max_num_seqs={seqs} peak_running={run.metrics['peak_running']}\n"
        if c.queue in names:
            rows = ["rps,avg_queue,p99_wait_ms"]
            for run in results.study(c.queue).runs:
                m = run.metrics
                rows.append(f"{_num(run.point[c.rate_key])},{_num(m['avg_queue'])},{_num(m['queue_ms']['p99'])}")
            out["queue.csv"] = "\n".join(rows) + "\n"
        if c.cost in names:
            cost = _run(results, c.cost).metrics["cost"]
            if "total_prefill_ms" in cost:
                out["cost.txt"] = (f"total_prefill_ms={_num(cost['total_prefill_ms'])} "
                                   f"total_decode_ms={_num(cost['total_decode_ms'])} "
                                   f"decode_share={_num(cost['decode_share'])}\n")
        if c.tune in names:
            study = results.study(c.tune)
            if study.search is not None:
                target = tune_target(study.constraint)
                found = study.search.value
                if found is None:
                    out["tune.txt"] = f"target_ttft_ms={_num(target)} max_concurrency=0 throughput_at_target=0\n"
                else:
                    tps = study.search.payload.metrics["throughput_tps"]
                    out["tune.txt"] = (f"target_ttft_ms={_num(target)} max_concurrency={_num(found)} "
                                       f"throughput_at_target={_num(tps)}\n")
        return out

    def tune_bound(self, results) -> str:
        """A line for stderr when tune.txt's ``max_concurrency`` is no found boundary (its format,
        the seed's, has no place to say so), else '': the search held at the top of its range
        (the value is a lower bound) or failed even at its bottom (0 means "none")."""
        c = self.config
        if c.tune not in {s.name for s in results.studies}:
            return ""
        study = results.study(c.tune)
        outcome = study.search
        if outcome is None or outcome.status == "found":
            return ""
        key = study.keys[0] if study.keys else "the searched key"
        if outcome.status == "holds-everywhere":
            return (f"schedlab: lab report: tune.txt's max_concurrency={_num(outcome.value)} is a lower bound: "
                    f"{study.constraint} holds up to the top of the search's range ({key} = {_num(outcome.value)}); "
                    f"raise high to find the boundary")
        at = f" ({key} = {_num(outcome.failing)})" if outcome.failing is not None else ""
        return (f"schedlab: lab report: tune.txt's max_concurrency=0 means none: {study.constraint} fails even at "
                f"the bottom of the search's range{at}")

    def seed_misses(self, artifacts: dict[str, str]) -> list[str]:
        """Lines for stderr naming each of seed 001's conditions the artifacts miss (another request
        set may: even answers leave static batching few idle slots), else none. The artifacts are
        written all the same -- they are what the run measured."""
        def values(name: str) -> dict[str, float]:
            text = artifacts.get(name, "")
            return {k: float(v) for k, v in (part.split("=", 1) for part in text.split()) if _is_number(v)}

        misses = []
        static, compare, seqs = values("static.txt"), values("compare.txt"), values("maxseqs.txt")
        if "slot_util" in static and not static["slot_util"] < 0.7:
            misses.append(f"static.txt's slot_util={_num(static['slot_util'])} (the seed expects < 0.7)")
        if "speedup" in compare and not compare["speedup"] >= 1.8:
            misses.append(f"compare.txt's speedup={_num(compare['speedup'])} (the seed expects >= 1.8)")
        if "peak_running" in seqs and "max_num_seqs" in seqs and not seqs["peak_running"] <= seqs["max_num_seqs"]:
            misses.append(f"maxseqs.txt's peak_running={_num(seqs['peak_running'])} (the seed expects <= "
                          f"max_num_seqs={_num(seqs['max_num_seqs'])})")
        if "queue.csv" in artifacts:
            p99 = [float(row.split(",")[2]) for row in artifacts["queue.csv"].splitlines()[1:]]
            if any(b <= a for a, b in zip(p99, p99[1:])):
                misses.append("queue.csv's p99_wait_ms does not rise with rps (the seed expects it to)")
        return [f"schedlab: lab report: {miss}" for miss in misses]

    def write(self, results, out_dir) -> list[Path]:
        written = []
        artifacts = self.artifacts(results)
        for line in self.seed_misses(artifacts):
            print(line, file=sys.stderr)
        for name, text in artifacts.items():
            path = Path(out_dir) / name
            atomic_write(path, text)
            written.append(path)
        bound = self.tune_bound(results) if "tune.txt" in artifacts else ""
        if bound:
            print(bound, file=sys.stderr)
        missing = {"static.txt", "compare.txt", "maxseqs.txt", "queue.csv", "cost.txt", "tune.txt"} - set(artifacts)
        if missing:
            print(f"schedlab: lab report: no study for {', '.join(sorted(missing))}", file=sys.stderr)
        return written
