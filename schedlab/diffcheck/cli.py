"""The command line shared by ``tools/vllm_diff.py`` and ``tools/sglang_diff.py``.

A harness describes itself with a :class:`Harness`: its engine, feature groups and case
generator, how to build the two runners and which extra options it has; :func:`main` does the
rest -- seeds per group, the agreement table, shrunk reproducers, ``--replay`` and ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import attrs

from schedlab.errors import ConfigError, SchedlabError
from schedlab.progress import progress
from schedlab.study.overrides import parse_assignment

from .case import Case, Engine, Sides
from .compare import Comparison, Differ, agreement_table
from .shrink import shrink


class VersionError(RuntimeError):
    """The engine installed is not the version a harness follows."""


@attrs.frozen
class Harness:
    """What :func:`main` needs to know about one engine.

    :param theirs: ``theirs(args)`` imports the engine and returns its runner, which has a
        ``version`` and ``validate(case, sides)`` (raises TypeError or ValueError on a setting
        the engine refuses); raises ImportError or :class:`VersionError`.
    :param ours: ``ours(engine)``: the schedlab runner on the ``fast`` or ``reference`` engine.
    :param install: how to install the engine (said when it cannot be imported).
    :param refuser: what refuses a bad one-sided setting (``vLLM's SchedulerConfig``).
    :param add_arguments: adds the harness's own options to the parser.
    :param sides: ``sides(args, schedlab, engine)`` completes the one-sided settings from them.
    """

    engine: Engine
    prog: str
    description: str
    groups: tuple
    generate: Callable
    theirs: Callable
    ours: Callable
    install: str
    refuser: str
    add_arguments: Callable = lambda parser: None
    sides: Callable = lambda args, schedlab, engine: None
    default_seeds: str = "50"


def runners(h: Harness, args):
    """The engine's runner and schedlab's for ``args`` (schedlab's set up as the engine's asks)."""
    try:
        theirs = h.theirs(args)
    except ImportError as exc:
        raise ConfigError(f"cannot import {h.engine.label} ({exc}); {h.install}") from None
    except VersionError as exc:
        raise ConfigError(str(exc)) from None
    ours = h.ours(args.engine)
    configure = getattr(theirs, "configure_ours", None)  # (settings of theirs schedlab's side follows)
    if configure is not None:
        configure(ours)
    return theirs, ours


def _check_sides(h: Harness, differ: Differ, case: Case) -> None:
    """Fail early (exit 2) on a one-sided setting either engine refuses."""
    differ.ours.build(case, differ.sides)
    try:
        differ.theirs.validate(case, differ.sides)
    except (TypeError, ValueError) as exc:
        given = " ".join(f"{k}={v}" for k, v in differ.sides.engine) or "(nothing)"
        detail = " ".join(str(exc).split())
        raise ConfigError(f"{h.engine.flag} {given}: {h.refuser} refuses it: {detail[:300]}") from None


def build_parser(h: Harness) -> argparse.ArgumentParser:
    e = h.engine
    p = argparse.ArgumentParser(prog=h.prog, description=h.description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", default=",".join(h.groups),
                   help=f"comma-separated feature groups (default: all of {', '.join(h.groups)})")
    p.add_argument("--seeds", default=h.default_seeds, metavar="N|A:B",
                   help=f"seeds per group: 0..N-1, or A..B-1 (default {h.default_seeds})")
    p.add_argument("--shrink", type=int, default=2, metavar="N",
                   help="shrink and print up to N differing cases per group (default 2; 0: none)")
    p.add_argument("--max-evaluations", type=int, default=300, metavar="N",
                   help="most case runs one shrink may spend (default 300)")
    p.add_argument("--set", action="append", default=[], metavar="scheduler.KEY=VALUE", dest="schedlab_set",
                   help="a schedlab scheduler setting on top of the shared ones (TOML value syntax)")
    p.add_argument(e.flag, action="append", default=[], metavar="KEY=VALUE", dest="engine_set",
                   help=f"a {e.label} setting on one side only")
    p.add_argument("--engine", choices=("fast", "reference"), default="fast", help="schedlab engine (default fast)")
    p.add_argument("--replay", metavar="JSON", help="run one case given as JSON (the 'replay' line of a reproducer)")
    p.add_argument("--json", metavar="FILE", help="also write every comparison (cases and outcomes) to FILE")
    h.add_arguments(p)
    return p


def _seeds(text: str) -> range:
    try:
        if ":" in text:
            a, b = text.split(":")
            return range(int(a), int(b))
        return range(int(text))
    except ValueError:
        raise ConfigError(f"--seeds: expected N or A:B, got {text!r}") from None


def _groups(text: str, known: tuple) -> list[str]:
    groups = [g.strip() for g in text.split(",") if g.strip()]
    unknown = [g for g in groups if g not in known]
    if unknown or not groups:
        raise ConfigError(f"--groups: unknown group {', '.join(unknown) or '(none)'}; groups: {', '.join(known)}")
    return groups


def _sides(h: Harness, args) -> Sides:
    schedlab, engine = {}, {}
    for text in args.schedlab_set:
        key, value = parse_assignment(text, where="--set")
        table, _, name = key.partition(".")
        if table != "scheduler" or not name or "." in name:
            raise ConfigError(f"--set {text!r}: only scheduler.KEY is passed to schedlab (the shared settings "
                              "come from the case)")
        schedlab[name] = value
    for text in args.engine_set:
        key, value = parse_assignment(text, where=h.engine.flag)
        engine[key] = value
    h.sides(args, schedlab, engine)
    return Sides(schedlab, engine)


def _refusal(differ: Differ, case: Case) -> str | None:
    """Why either side refuses ``case`` with the one-sided settings (None: both take it, or there
    are none): a later seed or a shrink candidate may be one (a ``max_model_len`` below a one-sided
    ``long_prefill_token_threshold``), which stopped the whole table with a traceback."""
    if not (differ.sides.schedlab_scheduler or differ.sides.engine):
        return None
    try:
        differ.ours.build(case, differ.sides)
        differ.theirs.validate(case, differ.sides)
    except (SchedlabError, TypeError, ValueError) as exc:
        return " ".join(str(exc).split())[:200]
    return None


def _shrunk(differ: Differ, comparison: Comparison, max_evaluations: int) -> Comparison:
    wanted = comparison.fields

    def same_difference(case: Case) -> bool:
        return _refusal(differ, case) is None and wanted <= differ.compare(case).fields

    return differ.compare(shrink(comparison.case, same_difference, max_evaluations=max_evaluations))


def main(h: Harness, argv: list[str] | None = None) -> int:
    args = build_parser(h).parse_args(argv)
    try:
        return _main(h, args)
    except SchedlabError as exc:
        print(f"{h.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{h.prog}: interrupted", file=sys.stderr)
        return 130


def _main(h: Harness, args) -> int:
    sides = _sides(h, args)
    groups = _groups(args.groups, h.groups)
    seeds = _seeds(args.seeds)
    replay = None
    if args.replay is not None:
        try:
            replay = Case.from_json(args.replay, h.engine.settings)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"--replay: not a case ({exc})") from None
    theirs, ours = runners(h, args)
    differ = Differ(h.engine, theirs, ours, sides)
    print(f"{h.engine.label} {theirs.version} vs schedlab ({args.engine} engine), 1 ms per iteration"
          + (f"; {sides.describe(h.engine.label)}" if sides.schedlab_scheduler or sides.engine else ""))
    if replay is not None:
        _check_sides(h, differ, replay)
        comparison = differ.compare(replay)
        print(comparison.describe(sides))
        if not comparison.agrees and args.shrink:
            print("shrunk:")
            print(_shrunk(differ, comparison, args.max_evaluations).describe(sides))
        return 0 if comparison.agrees else 1
    for group in groups:  # a group's own settings may be what the engine refuses with the sides
        _check_sides(h, differ, h.generate(group, seeds.start))
    by_group: dict[str, list[Comparison]] = {}
    skipped: dict[str, list[str]] = {}  # group -> why each case a one-sided setting makes a side refuse
    with progress(len(groups) * len(seeds), "cases") as bar:
        for group in groups:
            by_group[group] = []
            for seed in seeds:
                case = h.generate(group, seed)
                why = _refusal(differ, case)
                if why is None:
                    by_group[group].append(differ.compare(case))
                else:
                    skipped.setdefault(group, []).append(f"seed {seed}: {why}")
                bar.update()
    print(agreement_table(h.engine, by_group))
    for group, reasons in skipped.items():
        print(f"{group}: {len(reasons)} case(s) skipped, refused with the one-sided settings (the first: "
              f"{reasons[0]})")
    if args.json:
        write_json(h.engine, args.json, by_group)
    shown = set()
    for group, comparisons in by_group.items():
        differing = [c for c in comparisons if not c.agrees]
        for c in differing[:max(args.shrink, 0)]:
            small = _shrunk(differ, c, args.max_evaluations)
            key = (small.fields, json.dumps(small.case.to_dict()["requests"]), repr(small.case.settings))
            if key in shown:
                continue
            shown.add(key)
            print()
            print(f"[{group} seed {c.case.seed}: {len(c.case.requests)} requests, differs in "
                  f"{', '.join(sorted(c.fields))}; shrunk]")
            print(small.describe(sides))
    return 0 if all(c.agrees for cs in by_group.values() for c in cs) else 1


def write_json(engine: Engine, path: str, by_group) -> None:
    """Every comparison as plain JSON a notebook can read: group -> list of comparisons."""
    data = {group: [{"case": c.case.to_dict(), "agrees": c.agrees, "fields": sorted(c.fields),
                     engine.key: {rid: attrs.asdict(o) for rid, o in c.theirs.items()},
                     "schedlab": {rid: attrs.asdict(o) for rid, o in c.ours.items()},
                     "errors": [c.their_error, c.our_error]} for c in cs]
            for group, cs in by_group.items()}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
