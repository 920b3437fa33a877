"""schedlab against real H100 runs it has never seen: the README's H100 table and figure.

    schedlab run experiments/h100_inference_perf.toml --out results/h100_inference_perf
    python tools/validate_h100.py results/h100_inference_perf [--fitted DIR] [--figure docs/h100_validation.png]

Reads the run's ``summary.json`` (every stage's ``vs_target``: the client's mean TTFT and
end-to-end latency, measured and simulated) and prints, per server configuration and stage,
the error of the mean E2E, of the mean TTFT and of the inter-token latency as issue 20 defines
it, ``(E2E - TTFT) / (output - 1)`` from the means (every request has exactly 64 output tokens:
``max_tokens = 64`` with ``ignore_eos``; the report's own TPOT and ITL are not usable, see
experiments/data/inference_perf_h100/README.md), then the median of each over the 21 stages.
``--fitted`` adds a second results folder (the same experiment with fitted settings) to the
figure: mean latency and TTFT against the request rate, measured and simulated, per
configuration.

The calibrated checks, made without choosing what to fit on. ``schedlab calibrate`` fits
:data:`FIT` (the front end's constant and the host's work per sequence), the experiment is run
with the fitted values, and the medians over the stages not fitted on are printed:

* ``--fit-config``: on each server configuration's seven stages together (one vLLM
  deployment's benchmark sweep), predicting the other two configurations' 14 stages;
* ``--fit-each``: on each stage's report alone, predicting the other 20.

One row per choice, then the median of each column over the choices.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

OUTPUT_TOKENS = 64  # experiments/data/inference_perf_h100/config.yaml: output_len, ignore_eos
REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments" / "h100_inference_perf.toml"
#: what --fit-each fits on one stage, and the bounds
FIT = (("frontend.network_ms", 0.0, 20.0), ("cost_model.host_per_seq_us", 0.0, 40.0))


def stage_runs(results: Path) -> list[dict]:
    """Every run with a ``[target]``: name, the stage's requested rate, measured and simulated means."""
    summary = json.loads((results / "summary.json").read_text())
    out = []
    for study in summary["studies"]:
        for run in study["runs"]:
            vs = run["metrics"].get("vs_target")
            if vs is None:
                continue
            report = json.loads(Path(run["meta"]["target"]["path"]).read_text())
            out.append({"name": run["name"], "rate": report["load_summary"]["requested_rate"],
                        "measured": vs["measured"], "simulated": vs["simulated"], "errors": vs["errors_pct"]})
    if not out:
        sys.exit(f"{results}/summary.json: no run with a [target] (run experiments/h100_inference_perf.toml)")
    return out


def itl(means: dict) -> float:
    return (means["e2e_ms.mean"] - means["ttft_ms.mean"]) / (OUTPUT_TOKENS - 1)


def rows(results: Path) -> list[tuple[str, float, float, float]]:
    """(run, E2E error %, TTFT error %, ITL error %) per stage run."""
    return [(r["name"], r["errors"]["e2e_ms.mean"], r["errors"]["ttft_ms.mean"],
             100.0 * (itl(r["simulated"]) / itl(r["measured"]) - 1.0)) for r in stage_runs(results)]


def table(results: Path) -> str:
    lines = ["| stage run | E2E mean | TTFT mean | ITL |", "|---|---:|---:|---:|"]
    found = rows(results)
    for name, e2e, ttft, gap in found:
        lines.append(f"| {name} | {e2e:+.1f}% | {ttft:+.1f}% | {gap:+.1f}% |")
    med = medians(found)
    lines.append(f"| **median \\|error\\| over {len(found)} stages** | {med[0]:.1f}% | {med[1]:.1f}% | {med[2]:.1f}% |")
    return "\n".join(lines)


def medians(found: list[tuple[str, float, float, float]], leave_out=frozenset()) -> np.ndarray:
    """Median |error| of E2E, TTFT and ITL over the stage runs (all but those in ``leave_out``)."""
    return np.median(np.abs(np.array([r[1:] for r in found if r[0] not in leave_out])), axis=0)


def fit_and_predict(groups: list[tuple[str, list[str]]], max_evaluations: int = 60) -> str:
    """For each ``(label, runs)``: fit :data:`FIT` on those runs together (or the one run),
    run the experiment with the fitted values, and give the medians over the other stages."""
    import tempfile

    from schedlab.calibrate import Parameter, calibrate
    from schedlab.results.storage import save
    from schedlab.study.experiment import load, run_experiment

    parameters = [Parameter(key, low, high) for key, low, high in FIT]
    lines = ["| fitted on | " + " | ".join(key.split(".")[1] for key, _, _ in FIT)
             + " | E2E | TTFT | ITL (medians over the stages not fitted on) |", "|---|" + "---:|" * (len(FIT) + 3)]
    table_rows = []
    for label, runs in groups:
        fit, _, _ = calibrate(load(EXPERIMENT), parameters, run_name=runs if len(runs) > 1 else runs[0],
                              target=None if len(runs) > 1 else _target_of(runs[0]),
                              max_evaluations=max_evaluations, starts=3, diagnose=False)
        overrides = [f"{key}={fit.values[key]!r}" for key, _, _ in FIT]
        with tempfile.TemporaryDirectory() as out:
            save(run_experiment(load(EXPERIMENT, overrides)), Path(out))
            med = medians(rows(Path(out)), leave_out=set(runs))
        table_rows.append(med)
        values = " | ".join(f"{fit.values[key]:.2f}" for key, _, _ in FIT)
        lines.append(f"| {label} | {values} | {med[0]:.1f}% | {med[1]:.1f}% | {med[2]:.1f}% |")
        print(lines[-1], file=sys.stderr)
    over = np.median(np.array(table_rows), axis=0)
    lines.append(f"| **median over the {len(groups)} choices** |" + " |" * len(FIT)
                 + f" {over[0]:.1f}% | {over[1]:.1f}% | {over[2]:.1f}% |")
    return "\n".join(lines)


def _target_of(name: str):
    from schedlab.calibrate import run_target
    from schedlab.study.experiment import load

    exp = load(EXPERIMENT)
    return run_target(exp, next(s for s in exp.studies if s.name == name), None)


def stage_names() -> list[str]:
    from schedlab.study.experiment import load

    return [s.name for s in load(EXPERIMENT).studies]


def figure(results: Path, fitted: Path | None, path: Path) -> None:
    from matplotlib.figure import Figure

    sets = [("schedlab, defaults", stage_runs(results), "C0")]
    if fitted is not None:
        sets.append(("schedlab, fitted (--fitted)", stage_runs(fitted), "C2"))
    variants = list(dict.fromkeys(r["name"].rsplit("-", 1)[0] for r in sets[0][1]))
    fig = Figure(figsize=(13, 7), dpi=110, layout="constrained")
    axes = fig.subplots(2, len(variants), sharey="row")
    for col, variant in enumerate(variants):
        for row, (stat, label) in enumerate((("e2e_ms.mean", "mean latency (ms)"), ("ttft_ms.mean", "mean TTFT (ms)"))):
            ax = axes[row, col]
            for k, (name, runs, color) in enumerate(sets):
                mine = sorted((r for r in runs if r["name"].rsplit("-", 1)[0] == variant), key=lambda r: r["rate"])
                rates = [r["rate"] for r in mine]
                if k == 0:
                    ax.plot(rates, [r["measured"][stat] for r in mine], "o-", color="black", label="measured")
                ax.plot(rates, [r["simulated"][stat] for r in mine], "s--", color=color, label=name)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(variant, fontsize=10)
            else:
                ax.set_xlabel("request rate (requests/s)")
            if col == 0:
                ax.set_ylabel(label)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("vLLM 0.11 on an H100 (inference-perf, KubeCon NA 2025): measured at the client vs simulated")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, nargs="?", default=None,
                        help="the results folder of experiments/h100_inference_perf.toml")
    parser.add_argument("--fit-config", action="store_true",
                        help="fit on each configuration's stages together, predict the other two (about 5 minutes)")
    parser.add_argument("--fit-each", action="store_true",
                        help="fit on each stage alone and predict the other 20 (about 7 minutes)")
    parser.add_argument("--fitted", type=Path, default=None, help="a second results folder, run with fitted settings")
    parser.add_argument("--figure", type=Path, default=None, help="write the figure here (PNG)")
    args = parser.parse_args(argv)
    if args.fit_config or args.fit_each:
        names = stage_names()
        configs = list(dict.fromkeys(n.rsplit("-", 1)[0] for n in names))
        groups = ([(f"{c} (7 stages)", [n for n in names if n.rsplit("-", 1)[0] == c]) for c in configs]
                  if args.fit_config else [(n, [n]) for n in names])
        print(fit_and_predict(groups))
        return 0
    if args.results is None:
        parser.error("give the results folder (or --fit-each)")
    print(table(args.results))
    if args.fitted is not None:
        print()
        print(table(args.fitted))
    if args.figure is not None:
        figure(args.results, args.fitted, args.figure)
        print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
