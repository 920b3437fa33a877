"""``schedlab hunt FILE``: the command line of a hunt (see :mod:`schedlab.hunt`)."""

from __future__ import annotations

import sys
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("file", help="a hunt file: runs to compare and a [hunt] table")
    p.add_argument("--out", help="folder for the results (default: results/<experiment name>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key, e.g. hunt.budget=100 or runs.NAME.scheduler.max_num_seqs=8")
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="simulations at once (default: the machine's cores; with Ray, the cluster's CPUs)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="where simulations run: local processes, or a Ray cluster (pip install 'schedlab[ray]')")
    p.add_argument("--address", help="with --backend ray: the cluster to join (e.g. auto)")


def command(args) -> int:
    from ..results.folder import StagedFolder
    from .hunt import hunt_on, load_hunt, replay_value
    from .output import input_files, missing_plugins
    from .report import summary_lines, write_outcome

    from ..cli import out_option
    from ..errors import SchedlabError
    from ..interrupts import by_signal
    from ..study.executor import check_options

    check_options(args.backend, args.jobs, args.address)
    out_option(args.out)
    hunt = load_hunt(args.file, args.set)
    out = Path(args.out) if args.out is not None else Path("results") / hunt.name
    with StagedFolder(out, reads=input_files(hunt.experiment)) as stage:  # checks --out before anything runs
        print(f"schedlab: {hunt.name}: {hunt.goal.describe()}; {hunt.space.dimension} coordinates, "
              f"{len(hunt.runs)} runs per workload", file=sys.stderr)
        try:
            outcome = hunt_on(hunt, args.backend, args.jobs, args.address)
        except KeyboardInterrupt as exc:
            partial = getattr(exc, "hunt_outcome", None)
            if partial is None or not by_signal():  # (a plugin's own raise KeyboardInterrupt: its error)
                raise
            return interrupted(hunt, partial, exc, stage, out)
        written = write_outcome(hunt, outcome, stage.path)
        if outcome.shrunk is not None:  # the reproducer must show what the hunt saw
            try:
                replayed = replay_value(stage.path / "counterexample.toml", hunt.goal,
                                        plugin_objects=hunt.experiment.plugin_objects)
            except KeyboardInterrupt as exc:  # (the hunt is done and written: keep it, its replay unchecked)
                if not by_signal():
                    raise
                return checked_no_more(hunt, outcome, exc, stage, out, written)
            except SchedlabError as exc:   # (never lose a finished hunt over its reproducer: say so, keep it)
                print(f"schedlab: warning: {out / 'counterexample.toml'} does not replay: "
                      f"{str(exc).replace(str(stage.path), str(out))}", file=sys.stderr)
                replayed = outcome.shrunk_score.value
            if not replayed == outcome.shrunk_score.value:
                print(f"schedlab: warning: the counterexample replays to {replayed:.6g}, not "
                      f"{outcome.shrunk_score.value:.6g}", file=sys.stderr)
            for name in missing_plugins(stage.path, hunt.experiment.config.plugins):  # (imported here already)
                print(f"schedlab: warning: plugin module {name!r} is neither beside {out / 'counterexample.toml'} "
                      "nor on Python's path: it replays only where Python finds the module", file=sys.stderr)
        stage.commit()
    print("\n".join(summary_lines(hunt, outcome, str(out))))
    print(f"schedlab: {len(written)} files written to {out}", file=sys.stderr)
    return 0


def checked_no_more(hunt, outcome, exc: KeyboardInterrupt, stage, out: Path, written) -> int:
    """Ctrl-C (or SIGTERM, SIGHUP) while the finished hunt's reproducer was being replayed: its
    files are whole, so they are put in place as a finished hunt's (they were thrown away, "no
    results were written": review s80 calhunt), the replay said to be unchecked; the stop's exit
    status."""
    from ..interrupts import acknowledge, stop_status
    from .report import summary_lines

    acknowledge()
    what, status = stop_status(exc)
    stage.commit()
    print("\n".join(summary_lines(hunt, outcome, str(out))))
    print(f"schedlab: {what} while the counterexample was replayed to check it: the finished hunt is written to "
          f"{out} ({len(written)} files; {out / 'counterexample.toml'} not checked)", file=sys.stderr)
    return status


def interrupted(hunt, outcome, exc: KeyboardInterrupt, stage, out: Path) -> int:
    """Ctrl-C (or SIGTERM, SIGHUP) stopped the hunt: keep what it found -- ``hunt.json`` marked
    interrupted, the worst workload so far and any shrunk so far (:func:`~.report.write_partial`),
    staged and put in place as a finished hunt's files are -- say so, and give the stop's exit status.
    Before any workload was evaluated there is nothing to keep: nothing is written."""
    from ..interrupts import acknowledge, stop_status
    from .report import interrupted_line, summary_lines, write_partial

    acknowledge()  # (already, by the executor's clean-up) further signals are ignored while this is written
    what, status = stop_status(exc)
    if not outcome.search and not outcome.random and outcome.first_failure is None:
        # nothing evaluated, nothing to keep: a previous hunt's folder stays (it was replaced by a
        # hunt.json of no evaluations: review s81 badinput, finding 8)
        print(f"schedlab: {what} before any workload was evaluated; no results were written (a previous results "
              "folder is left as it was)", file=sys.stderr)
        return status
    written = write_partial(hunt, outcome, stage.path)
    stage.commit()
    print("\n".join(summary_lines(hunt, outcome)))
    print(f"schedlab: {what}; what was found so far is written to {out} ({len(written)} files: "
          f"{interrupted_line(hunt, outcome)})", file=sys.stderr)
    return status
