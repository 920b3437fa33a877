"""The ``schedlab`` command: run, validate, plot, plugins, capacity, calibrate.

Every user error (bad TOML, unknown plugin, impossible config, stalled run) ends as one
message on stderr and exit status 2 -- never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .capacity import add_capacity_arguments, capacity_command
from .catalog import KINDS, load_catalog
from .configs import field_help, from_table
from .errors import SchedlabError
from .simulation import build_component


def _reports(exp, names, skip=()):
    ctx = exp.context
    out = []
    for name in names:
        if name in skip:
            continue
        table = {"kind": name, **exp.report_tables.get(name, {})}
        out.append((name, build_component(ctx, "report", table, f"{ctx.source}: [reports.{name}]")))
    return out


def cmd_run(args) -> int:
    from .experiment import load, run_experiment

    exp = load(args.file, args.set)
    names = list(exp.config.reports)
    for extra in args.report or ():
        if extra not in names:
            names.append(extra)
    reports = _reports(exp, names, skip=("plots",) if args.no_plots else ())
    runs = sum(len(s.sweep) if s.sweep is not None else 1 for s in exp.studies)
    searches = sum(1 for s in exp.studies if s.search is not None)
    what = f"{runs} run(s)" + (f" and {searches} search(es)" if searches else "")
    print(f"schedlab: {exp.name}: {what}", file=sys.stderr)
    results = run_experiment(exp)
    out = Path(args.out) if args.out else Path("results") / exp.name
    written = []
    for _name, report in reports:
        written += report.write(results, out)
    print(f"schedlab: {len(written)} files written to {out}", file=sys.stderr)
    return 0


def cmd_validate(args) -> int:
    from .experiment import load

    exp = load(args.file, args.set)
    runs = sum(len(s.sweep) if s.sweep is not None else 1 for s in exp.studies)
    print(f"{args.file}: OK ({len(exp.studies)} run entries, {runs} points, reports: {', '.join(exp.config.reports)})")
    return 0


def cmd_plot(args) -> int:
    from .results_io import load as load_results

    results = load_results(args.dir)
    catalog = load_catalog()
    entry = catalog["report"].get("plots")
    table = results.settings.get("reports", {}).get("plots", {})
    report = entry.factory(from_table(entry.config, table, where=f"{args.dir}/summary.json: [reports.plots]"))
    written = report.write(results, Path(args.dir))
    print(f"schedlab: {len(written)} plots written to {args.dir}", file=sys.stderr)
    return 0


def cmd_plugins(args) -> int:
    catalog = load_catalog()
    for kind in KINDS:
        registry = catalog[kind]
        print(f"{kind}s:")
        for entry in registry:
            print(f"  {entry.name:<22} {entry.help}  [{entry.provider}]")
            if args.verbose and entry.config is not None:
                for name, default, text in field_help(entry.config):
                    print(f"      {name} = {default!r}  {text}")
    return 0


def cmd_capacity(args) -> int:
    print(capacity_command(args, load_catalog()))
    return 0


def cmd_calibrate(args) -> int:
    from .calibrate import command

    return command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="schedlab", description="Simulate LLM serving schedulers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run an experiment file and write results")
    p.add_argument("file")
    p.add_argument("--out", help="results folder (default: results/<experiment name>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key in every run, e.g. workload.path=other.json (TOML value syntax)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots report")
    p.add_argument("--report", action="append", metavar="NAME", help="add a report plugin (e.g. lab)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("validate", help="check an experiment file without running it")
    p.add_argument("file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("plot", help="redraw the plots of a results folder")
    p.add_argument("dir")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("plugins", help="list registered plugins and who provides them")
    p.add_argument("-v", "--verbose", action="store_true", help="also list each plugin's settings")
    p.set_defaults(func=cmd_plugins)
    p = sub.add_parser("capacity", help="how many sequences fit: KV cache sizing from model and GPU")
    add_capacity_arguments(p)
    p.set_defaults(func=cmd_capacity)
    from .calibrate import add_arguments as add_calibrate_arguments

    p = sub.add_parser("calibrate", help="fit a cost model's settings to a measured run (vllm_log / vllm_bench)")
    add_calibrate_arguments(p)
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SchedlabError as exc:
        print(f"schedlab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("schedlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
