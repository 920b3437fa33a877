"""The ``schedlab`` command (also ``python -m schedlab``): run, hunt, validate, plot, plugins, capacity,
calibrate.

Every user error (bad TOML, unknown plugin, impossible config, stalled run, unusable
``--out``) ends as one message on stderr and exit status 2 -- never a traceback. So does an
exception a plugin raises (a bug in it: a scheduler's ``schedule``, a report's ``write``, a
hook), with any ``--jobs``: one line names the run, the plugin, the exception and the plugin's
line (:class:`~schedlab.errors.PluginError`)::

    schedlab: error: exp.toml: run 'fifo[rate=5]': scheduler 'boomer' (plugin myplugin) raised
    ValueError: boom (myplugin.py:7 in Boom.schedule; SCHEDLAB_TRACEBACK=1 prints the traceback)

and with ``SCHEDLAB_TRACEBACK=1`` in the environment the plugin's traceback (a worker's too)
comes first. An exception raised in schedlab's own code alone is a bug in schedlab and keeps
its traceback. Ctrl-C, SIGTERM and SIGHUP (the terminal closed) end a run the same way, with
one message (exit 130, 143 and 129); further signals while it cleans up are ignored
(:mod:`schedlab.interrupts`), and a message to a terminal or pipe that has gone is dropped
rather than changing the exit status. ``run`` writes its results folder whole
(:mod:`schedlab.results.folder`).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from . import __version__
from .capacity import add_capacity_arguments, capacity_command
from .catalog import KINDS, BrokenPluginWarning, load_catalog
from .configs import field_help, from_table, toml_text
from .errors import (PLUGIN_RAISES, TRACEBACK_ENV, ConfigError, InputWarning, PluginError, SchedlabError, brief,
                     plugin_error)
from .interrupts import SignalGuard, acknowledge, by_signal, stop_status
from .results import index_page
from .results.folder import MANIFEST, StagedFiles, StagedFolder, record_entries
from .study.experiment import check_report_studies
from .study.simulation import build_component, component_config


def _reports(exp, names, skip=(), added=()):
    ctx = exp.context
    out = []
    for name in names:
        if name in skip:
            continue
        table = {"kind": name, **exp.report_tables.get(name, {})}
        # (a report only --report asked for has no table in the file to name)
        where = f"--report {name}" if name in added and name not in exp.report_tables \
            else f"{ctx.source}: [reports.{name}]"
        # (a report added with --report was not in the file's list that load() checked: its run names now)
        check_report_studies(component_config(ctx, "report", table, where)[1], exp.studies, where)
        out.append((name, build_component(ctx, "report", table, where)))
    return out


def cmd_run(args) -> int:
    from .hunt.output import input_files
    from .study.experiment import load, run_experiment
    from .study.executor import check_options, closing, make_executor

    check_options(args.backend, args.jobs, args.address)
    out_option(args.out)
    if _is_hunt_file(args.file):
        raise SchedlabError(f"{args.file}: a hunt file ([hunt]): run it with schedlab hunt {args.file}")
    if args.no_plots and "plots" in (args.report or ()):
        raise SchedlabError("--no-plots and --report plots: one skips the plots the other asks for; give one")
    exp = load(args.file, args.set)
    names = list(exp.config.reports)
    added = [extra for extra in dict.fromkeys(args.report or ()) if extra not in names]
    names += added
    reports = _reports(exp, names, skip=("plots",) if args.no_plots else (), added=added)
    runs = sum(len(s.sweep) if s.sweep is not None else 1 for s in exp.studies if s.search is None and s.plan is None)
    searches = sum(1 for s in exp.studies if s.search is not None)
    plans = sum(1 for s in exp.studies if s.plan is not None)
    what = (f"{runs} run(s)" + (f" and {searches} search(es)" if searches else "")
            + (f" and {plans} plan(s)" if plans else ""))
    replicated = max(s.replicas for s in exp.studies)
    if replicated > 1:
        what += f", up to {replicated} replicas each"
    out = Path(args.out) if args.out is not None else Path("results") / exp.name
    # (a report's or a hook's exception: one line; the staging folder says first if it was a full disk)
    with _plugin_errors(exp.context.catalog, exp.context.source), \
            StagedFolder(out, reads=input_files(exp)) as stage:  # checks --out before anything runs
        print(f"schedlab: {exp.name}: {what}", file=sys.stderr)
        with closing(make_executor(args.backend, args.jobs, args.address)) as executor:
            results = run_experiment(exp, executor=executor)
        done = results.execution
        print(f"schedlab: {done['simulations']} simulations in {done['wall_s']:.1f} s, {done['executor']}",
              file=sys.stderr)
        # A report plugin's own failure (a bug of its, or an answer that is not its files) keeps the
        # results and the other reports; schedlab's errors (a full disk) leave the previous folder as it was.
        # The reports after a failing one still run: json after a failing report was skipped, and
        # a folder of index.html alone replaced complete results.
        written, failed = [], None
        for name, report in reports:
            try:
                answer = report.write(results, stage.path)
            except OSError:
                raise  # (the staging folder says what a full or read-only disk did)
            except PLUGIN_RAISES as exc:
                error = plugin_error(exc, exp.context.catalog, exp.context.source)
                if error is None:
                    raise
                failed = failed or error
                continue
            try:
                written += _written(name, report, answer, stage.path, written)
            except SchedlabError as exc:
                failed = failed or exc
                written = [path for path in written if path.exists()]  # (what it removed is not asked of the next)
        table = _table_text(exp.context.catalog, results, exp.report_tables.get("table", {}), f"{exp.path}")
        written.append(index_page.write(stage.path, results, table_text=table, experiment_settings=exp.raw,
                                        run_settings={r.name: r.settings for r in results.all_runs()}))
        stage.commit()
    if failed is not None:
        count = f"{len(written)} file" + ("s" if len(written) != 1 else "")
        raise type(failed)(f"{failed}; the {count} the other reports wrote are in {out}",
                           *([failed.details] if isinstance(failed, PluginError) else []))
    print(f"schedlab: {len(written)} files written to {out}", file=sys.stderr)
    return 0


def out_option(out: str | None) -> None:
    """Refuse an empty ``--out`` (an unset shell variable: it wrote to, and replaced, the default
    folder ``results/<name>``)."""
    if out is not None and not out.strip():
        raise SchedlabError("--out: names no folder (an empty path); leave --out out for results/<experiment name>")


def _written(name: str, report, answer, folder: Path, before: list) -> list:
    """``answer``, what report ``name``'s ``write()`` returned, as absolute paths, if it is the list
    (or tuple) of the files it wrote, the Report protocol's answer: paths in ``folder`` that are
    there, while the files the reports ``before`` it wrote (absolute) still are. Else
    :class:`SchedlabError` naming the report (the count of files written was a report's word)."""
    who = f"report {name!r} ({type(report).__name__})"
    if not isinstance(answer, (list, tuple)):
        raise SchedlabError(f"{who}: write() returned {brief(answer)} ({type(answer).__name__}); it must return the "
                            "list of files it wrote ([] for none)")
    root = folder.resolve()
    paths = []
    for item in answer:
        if not isinstance(item, (str, os.PathLike)):
            raise SchedlabError(f"{who}: write() returned {brief(item)} ({type(item).__name__}) among its files; it "
                                "must return the list of files it wrote, as paths")
        # (relative to the working directory, as Python reads it -- out_dir is relative with a relative --out --
        # or else to out_dir)
        path = next((p for p in (Path(item).resolve(), (folder / item).resolve()) if p.is_relative_to(root)), None)
        if path is None:
            raise SchedlabError(f"{who}: write() returned {item}, outside the results folder; a report writes into "
                                "the out_dir it is given")
        if not path.exists():
            raise SchedlabError(f"{who}: write() returned {_shown(path, root)}, which is not there; it must return "
                                "the files it wrote")
        paths.append(path)
    gone = [path for path in before if not path.exists()]
    if gone:
        raise SchedlabError(f"{who}: {len(gone)} of the files the reports before it wrote are gone after it ran "
                            f"({_shown(gone[0], root)}, ...); a report writes files of its own")
    return paths


def _shown(path: Path, root: Path) -> str:
    """A path in the staging folder as its name within the results folder."""
    return str(path.relative_to(root))


@contextmanager
def _plugin_errors(catalog, where: str):
    """Turn an exception a plugin of ``catalog`` raises in the block (a report, a hook) into a
    :class:`~schedlab.errors.PluginError`; anything else passes as it is."""
    try:
        yield
    except PLUGIN_RAISES as exc:
        error = plugin_error(exc, catalog, where)
        if error is None:
            raise
        raise error from None


def _table_text(catalog, results, table: dict, source: str) -> str:
    """The summary table as the ``table`` report draws it (for index.html)."""
    entry = catalog["report"].get("table")
    report = entry.factory(from_table(entry.config, table, where=f"{source}: [reports.table]"))
    return report.text(results)


def _is_hunt_file(path: str) -> bool:
    from .study.experiment import _read_toml

    return "hunt" in _read_toml(Path(path))


def cmd_validate(args) -> int:
    from .study.experiment import load

    if _is_hunt_file(args.file):
        from .hunt.hunt import load_hunt

        hunt = load_hunt(args.file, args.set)
        print(f"{args.file}: OK (hunt: {hunt.goal.describe()}; {len(hunt.runs)} runs per workload, "
              f"{hunt.space.dimension} coordinates)")
        return 0
    exp = load(args.file, args.set)
    runs = sum(len(s.sweep) if s.sweep is not None else 1 for s in exp.studies)
    print(f"{args.file}: OK ({len(exp.studies)} run entries, {runs} points, reports: {', '.join(exp.config.reports)})")
    return 0


def cmd_plot(args) -> int:
    from .results.storage import load as load_results

    results = load_results(args.dir)
    catalog = load_catalog()
    entry = catalog["report"].get("plots")
    reports = results.settings.get("reports")
    reports = reports if isinstance(reports, dict) else {}
    where = f"{args.dir}/summary.json"
    table = reports.get("plots", {})
    config = from_table(entry.config, table if isinstance(table, dict) else {}, where=f"{where}: [reports.plots]")
    check = getattr(config, "check_studies", None)
    if check is not None:  # (its overlays name the saved studies; said of the file, as when it was read)
        try:
            check(results.studies)
        except ConfigError as exc:
            raise ConfigError(f"{where}: [reports.plots] {exc}") from None
    report = entry.factory(config)
    table = reports.get("table", {})
    text = _table_text(catalog, results, table if isinstance(table, dict) else {}, where)
    out = Path(args.dir)
    settings = index_page.saved_experiment_settings(out)  # (the page keeps the file's tables: redrawn, not lost)
    with StagedFiles(out) as stage:  # a full disk leaves the folder as it was
        report.write(results, stage.path)
        # The manifest lists the new files before any is moved in (a name listed before its file is
        # there is harmless): a failure or a stop between the two left plots/ unlisted, and the next
        # run refused the folder as holding files schedlab did not write.
        try:
            record_entries(out, [*stage.files(), "index.html"])
        except OSError as exc:
            raise SchedlabError(f"{out}: cannot update its {MANIFEST}: {exc.strerror or exc}; nothing in the "
                                "folder was changed") from None
        written = stage.commit()
    try:
        index_page.write(out, results, table_text=text, experiment_settings=settings,
                         run_settings=_saved_run_settings(out))
    except OSError as exc:
        if (out / "index.html").is_dir():  # (plot again would fail alike)
            raise SchedlabError(f"{out / 'index.html'}: is a folder, so the page cannot be written there (the plots "
                                "are written; move that folder away and run schedlab plot again)") from None
        raise SchedlabError(f"{exc.filename or out}: cannot write it: {exc.strerror or exc} (the plots are "
                            "written; run schedlab plot again to rewrite index.html)") from None
    print(f"schedlab: {len(written)} plots and index.html written to {args.dir}", file=sys.stderr)
    return 0


def _saved_run_settings(out: Path) -> dict:
    """config.json of a results folder (each run's resolved tables), or {} when absent or unreadable."""
    import json

    try:
        data = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cmd_plugins(args) -> int:
    """List every registered name; with an experiment file, also the plugin modules its
    ``[experiment] plugins`` lists, loaded as the experiment loads them (its folder first)."""
    listed: dict[str, str] = {}
    if args.file is None:
        catalog = load_catalog()
    else:
        from .errors import ConfigError
        from .study.experiment import ExperimentConfig, _read_toml

        path = Path(args.file)
        table = _read_toml(path).get("experiment", {})
        if not isinstance(table, dict):
            shape = "an array ([[...]] or [...])" if isinstance(table, list) else repr(table)
            raise ConfigError(f"{path}: experiment must be one table ([experiment]), got {shape}")
        config = from_table(ExperimentConfig, table, where=f"{path}: [experiment]")
        catalog = load_catalog(config.plugins, plugin_dir=path.parent.resolve(), source=str(path))
        suffix = " ([experiment] plugins)"  # (the catalog's name for one an installed plugin's name shadows)
        listed = {p: f"{p.removesuffix(suffix)} ({path}: [experiment] plugins)" for p in catalog.listed}
    for kind in KINDS:
        registry = catalog[kind]
        print(f"{kind}s:")
        for entry in registry:
            print(f"  {entry.name:<22} {entry.help}  [{listed.get(entry.provider, entry.provider)}]")
            if args.verbose and entry.config is not None:
                for name, default, text in field_help(entry.config):
                    shown = default if isinstance(default, str) and default.startswith("(") else toml_text(default)
                    print(f"      {name} = {shown}  {text}")
    return 0


def cmd_capacity(args) -> int:
    print(capacity_command(args, load_catalog()))
    return 0


def cmd_calibrate(args) -> int:
    from .calibrate import command

    return command(args)


def cmd_hunt(args) -> int:
    from .hunt.command import command

    return command(args)


class _Parser(argparse.ArgumentParser):
    """argparse, with a misused option or argument ending in one ``schedlab: error:`` line (exit
    status 2) like every other error, pointing at ``--help`` instead of printing the usage."""

    def error(self, message: str):
        where = "" if self.prog == "schedlab" else f"{self.prog}: "   # (not "schedlab: error: schedlab: ...")
        self.exit(2, f"schedlab: error: {where}{message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="schedlab", description="Simulate LLM serving schedulers.")
    parser.add_argument("--version", action="version", version=f"schedlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run an experiment file and write results")
    p.add_argument("file")
    p.add_argument("--out", help="results folder (default: results/<experiment name>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key in every run, e.g. workload.path=other.json (TOML value syntax); "
                        "runs.NAME.table.key=value overrides it in run NAME only")
    p.add_argument("--no-plots", action="store_true", help="skip the plots report")
    p.add_argument("--report", action="append", metavar="NAME", help="add a report plugin (e.g. lab)")
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="simulations at once (default: the machine's cores; with Ray, the cluster's CPUs)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="where simulations run: local processes, or a Ray cluster (pip install 'schedlab[ray]')")
    p.add_argument("--address", help="with --backend ray: the cluster to join (e.g. auto); default: start a local one")
    p.set_defaults(func=cmd_run)
    from .hunt.command import add_arguments as add_hunt_arguments

    p = sub.add_parser("hunt", help="search for the workload that breaks a policy; shrink it to a reproducer")
    add_hunt_arguments(p)
    p.set_defaults(func=cmd_hunt)
    p = sub.add_parser("validate", help="check an experiment file without running it")
    p.add_argument("file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("plot", help="redraw the plots of a results folder")
    p.add_argument("dir")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("plugins", help="list registered plugins and who provides them")
    p.add_argument("-v", "--verbose", action="store_true", help="also list each plugin's settings")
    p.add_argument("file", nargs="?", help="an experiment file: also list the plugin modules its [experiment] "
                                           "plugins names (looked for first in the file's folder)")
    p.set_defaults(func=cmd_plugins)
    p = sub.add_parser("capacity", help="how many sequences fit: KV cache sizing from model and GPU")
    add_capacity_arguments(p)
    p.set_defaults(func=cmd_capacity)
    from .calibrate import add_arguments as add_calibrate_arguments

    p = sub.add_parser("calibrate", help="fit a cost model's settings to a measured run or to summary statistics "
                                         "([target]: vLLM, SGLang, TGI, guidellm, inference-perf, genai-perf)")
    add_calibrate_arguments(p)
    p.set_defaults(func=cmd_calibrate)
    return parser


def _one_line_warnings() -> Callable:
    """A ``warnings.showwarning`` for one command: schedlab's own warnings (a plugin left out, an
    input's assumption) as one ``schedlab: warning:`` line, each said once; others as Python says them."""
    said: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if not issubclass(category, (BrokenPluginWarning, InputWarning)):
            print(warnings.formatwarning(message, category, filename, lineno, line).rstrip(), file=sys.stderr)
            return
        text = "schedlab: warning: " + " ".join(str(message).split())
        if text not in said:
            said.add(text)
            print(text, file=sys.stderr)

    return show


def _say(text: str) -> None:
    """Print ``text`` on stderr. When stderr has gone (the terminal closed: SIGHUP; a closed
    pipe), drop it, and what stdout and stderr still buffer, so that flushing them at exit does
    not fail and turn the exit status into Python's 120."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        _drop_output()


def _drop_output() -> None:
    devnull = None
    for name in ("stdout", "stderr"):
        try:
            getattr(sys, name).flush()
        except (OSError, ValueError, AttributeError):
            devnull = devnull or open(os.devnull, "w", encoding="utf-8")
            setattr(sys, name, devnull)


def _closed_streams() -> list[str]:
    """``stdout`` and ``stderr`` that were closed when the command started (``>&-``: Python then
    sets them to None): each becomes /dev/null, on its own file descriptor, so that writing to it
    neither raises a traceback nor lands in a file the command opens later on that descriptor."""
    closed = []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        setattr(sys, name, open(fd, "w", encoding="utf-8", closefd=False))
        closed.append(name)
    return closed


class _StdoutGuard:
    """``sys.stdout`` while a command runs: a write that fails for want of room (a full disk,
    ``> /dev/full``) is remembered and what follows dropped, not raised -- a run still commits its
    results folder -- and :func:`main` says so at the end. So is a closed pipe (the reader went
    away: ``schedlab run ... | head``), which ends the command quietly with status 141 once its
    files are written (it used to throw the run's results away)."""

    def __init__(self, stream):
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._failed(exc)
        return len(text)

    def flush(self) -> None:
        if self.error is None:
            try:
                self._stream.flush()
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.error = exc
        try:  # what the stream still buffers would fail again when it is flushed at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _stdout_gone(exc: BrokenPipeError) -> bool:
    """True when ``exc`` is stdout's reader gone (a closed pipe), not a worker's pipe; stdout
    then points at /dev/null, so that the interpreter's flush at exit does not fail again."""
    innermost = traceback.extract_tb(exc.__traceback__)[-1].filename if exc.__traceback__ else ""
    if any(part in innermost for part in ("multiprocessing", "concurrent", "socket")):
        return False
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return True


def _show_traceback() -> bool:
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def _error(exc: SchedlabError) -> int:
    if isinstance(exc, PluginError) and exc.details and _show_traceback():
        _say(exc.details.rstrip())
    _say(f"schedlab: error: {exc}")
    return 2


def _plugin_error_of(exc: BaseException, args) -> PluginError | None:
    """``exc`` as a :class:`~schedlab.errors.PluginError` when a plugin raised it outside a run's
    own plugins' reach (loading or checking a file, a hunt, ``plot``): judged with the plugins
    the command's file lists (``[experiment] plugins``) and the installed ones."""
    from .study.experiment import _read_toml

    file = getattr(args, "file", None)
    plugins: tuple = ()
    try:
        table = _read_toml(Path(file)).get("experiment", {}) if isinstance(file, str) else {}
        listed = table.get("plugins", []) if isinstance(table, dict) else []
        plugins = tuple(p for p in listed if isinstance(p, str)) if isinstance(listed, list) else ()
    except Exception:  # (not a TOML file: the installed plugins only)
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (said once already, when the command loaded them)
            catalog = load_catalog(plugins)
    except Exception:
        return None
    return plugin_error(exc, catalog, file if isinstance(file, str) else None)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0, 2 for a user error or a plugin's exception,
    130/143/129 when interrupted, terminated or hung up).

    In the main thread SIGINT, SIGTERM and SIGHUP end the command cleanly (see
    :mod:`schedlab.interrupts`); after one of them the program (``argv`` None: the ``schedlab``
    command, ``python -m schedlab``) ignores them all, as the process is ending, while a call from
    Python with ``argv`` gets its own handlers back (a notebook's Ctrl-C keeps working).
    """
    args = build_parser().parse_args(argv)
    closed = _closed_streams()
    stdout = sys.stdout
    sys.stdout = guard = _StdoutGuard(stdout)
    if "stdout" in closed:
        guard.error = OSError(errno.EBADF, "it is closed")
    try:
        status = _main(args, ending=argv is None)
    finally:
        sys.stdout = stdout
    if isinstance(guard.error, BrokenPipeError):
        return status or 141  # the reader went away (`schedlab run ... | head`): quietly, as SIGPIPE ends a command
    if guard.error is not None:
        reason = guard.error.strerror or type(guard.error).__name__
        _say(f"schedlab: error: could not write to the standard output ({reason}); what went to files is "
             f"written" if args.func in (cmd_run, cmd_hunt) else
             f"schedlab: error: could not write to the standard output ({reason})")
        return status or 2
    return status


def _main(args, ending: bool = True) -> int:
    """:func:`main` with its arguments parsed (``ending``: :class:`SignalGuard`'s)."""
    with SignalGuard(ending):
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _one_line_warnings()
                return args.func(args)
        except SchedlabError as exc:
            return _error(exc)
        except MemoryError:
            _say("schedlab: error: out of memory; make the experiment smaller (fewer requests, points or instances)")
            return 2
        except BrokenPipeError as exc:
            if not _stdout_gone(exc):
                raise  # (another pipe: a worker's)
            return 141  # the reader went away (`schedlab plugins | head -1`): quietly, as SIGPIPE ends a command
        except KeyboardInterrupt as exc:
            error = None if by_signal() else _plugin_error_of(exc, args)  # (a plugin's own raise KeyboardInterrupt)
            if error is not None:
                return _error(error)
            acknowledge()
            what, status = stop_status(exc)
            written = getattr(exc, "results_written", None)  # (the stop came just after the folder was in place)
            if written is not None:
                _say(f"schedlab: {what}, after the results were written to {written}")
            else:
                _say(f"schedlab: {what}; no results were written (a previous results folder is left as it was)"
                     if args.func in (cmd_run, cmd_hunt) else f"schedlab: {what}")
            return status
        except (Exception, SystemExit, GeneratorExit) as exc:  # (a plugin's sys.exit(): its error, never exit 0)
            error = _plugin_error_of(exc, args)
            if error is None:
                raise  # a bug in schedlab itself: its traceback is wanted
            return _error(error)


if __name__ == "__main__":
    sys.exit(main())
