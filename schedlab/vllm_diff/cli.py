"""``python tools/vllm_diff.py``: vLLM 0.33's V1 scheduler against schedlab's ``vllm`` preset."""

from __future__ import annotations

import argparse
import json
import sys

from schedlab.errors import ConfigError, SchedlabError
from schedlab.progress import progress
from schedlab.study.overrides import parse_assignment

from .case import Case, Sides
from .compare import Comparison, Differ, agreement_table
from .shrink import shrink
from .workloads import GROUPS, generate

DESCRIPTION = """\
Step vLLM's own V1 Scheduler (vLLM 0.33.0, CPU, no model) and schedlab's `vllm` scheduler
preset side by side on random workloads, one feature group at a time, with every iteration
lasting 1 ms on both. Per request, compare the first scheduled iteration, the first token,
the finish, the preemptions and the prefix-cache hits; print the share of identical cases
per group and a shrunk reproducer of each differing case shown. Needs vLLM:
pip install -e '.[vllm]' (see the README section "Checked against vLLM")."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm_diff", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", default=",".join(GROUPS),
                   help=f"comma-separated feature groups (default: all of {', '.join(GROUPS)})")
    p.add_argument("--seeds", default="50", metavar="N|A:B", help="seeds per group: 0..N-1, or A..B-1 (default 50)")
    p.add_argument("--shrink", type=int, default=2, metavar="N",
                   help="shrink and print up to N differing cases per group (default 2; 0: none)")
    p.add_argument("--max-evaluations", type=int, default=300, metavar="N",
                   help="most case runs one shrink may spend (default 300)")
    p.add_argument("--set", action="append", default=[], metavar="scheduler.KEY=VALUE", dest="schedlab_set",
                   help="a schedlab scheduler setting on top of the shared ones, e.g. "
                        "scheduler.reserve_full_prompt=false (TOML value syntax)")
    p.add_argument("--vllm-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a vLLM SchedulerConfig field, e.g. scheduler_reserve_full_isl=false")
    p.add_argument("--reserve-full-prompt", choices=("on", "off"),
                   help="both sides at once: schedlab reserve_full_prompt and vLLM scheduler_reserve_full_isl")
    p.add_argument("--engine", choices=("fast", "reference"), default="fast", help="schedlab engine (default fast)")
    p.add_argument("--replay", metavar="JSON", help="run one case given as JSON (the 'replay' line of a reproducer)")
    p.add_argument("--json", metavar="FILE", help="also write every comparison (cases and outcomes) to FILE")
    p.add_argument("--allow-other-vllm", action="store_true", help="run against a vLLM other than 0.33.0")
    return p


def _seeds(text: str) -> range:
    try:
        if ":" in text:
            a, b = text.split(":")
            return range(int(a), int(b))
        return range(int(text))
    except ValueError:
        raise ConfigError(f"--seeds: expected N or A:B, got {text!r}") from None


def _groups(text: str) -> list[str]:
    groups = [g.strip() for g in text.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        raise ConfigError(f"--groups: unknown group {', '.join(unknown) or '(none)'}; groups: {', '.join(GROUPS)}")
    return groups


def _sides(args) -> Sides:
    schedlab, vllm = {}, {}
    for text in args.schedlab_set:
        key, value = parse_assignment(text, where="--set")
        table, _, name = key.partition(".")
        if table != "scheduler" or not name or "." in name:
            raise ConfigError(f"--set {text!r}: only scheduler.KEY is passed to schedlab (the shared settings "
                              "come from the case)")
        schedlab[name] = value
    for text in args.vllm_set:
        key, value = parse_assignment(text, where="--vllm-set")
        vllm[key] = value
    if args.reserve_full_prompt is not None:
        on = args.reserve_full_prompt == "on"
        schedlab.setdefault("reserve_full_prompt", on)
        vllm.setdefault("scheduler_reserve_full_isl", on)
    return Sides(schedlab, vllm)


def _runners(args):
    from .schedlab_side import SchedlabRunner
    try:
        from .vllm_side import VllmRunner, VllmVersionError
    except ImportError as exc:  # pragma: no cover - only without vLLM
        raise ConfigError(f"cannot import vLLM ({exc}); install it with pip install -e '.[vllm]'") from None
    try:
        vllm = VllmRunner(allow_other_version=args.allow_other_vllm)
    except ImportError as exc:
        raise ConfigError(f"cannot import vLLM ({exc}); install it with pip install -e '.[vllm]'") from None
    except VllmVersionError as exc:
        raise ConfigError(str(exc)) from None
    return vllm, SchedlabRunner(args.engine)


def _shrunk(differ: Differ, comparison: Comparison, max_evaluations: int) -> Comparison:
    wanted = comparison.fields

    def same_difference(case: Case) -> bool:
        return wanted <= differ.compare(case).fields

    return differ.compare(shrink(comparison.case, same_difference, max_evaluations=max_evaluations))


def _check_sides(differ: Differ, case: Case) -> None:
    """Fail early (exit 2) on a one-sided setting either engine refuses."""
    differ.schedlab.build(case, differ.sides)
    try:
        differ.vllm.scheduler(case, differ.sides)
    except (TypeError, ValueError) as exc:
        given = " ".join(f"{k}={v}" for k, v in differ.sides.vllm_scheduler) or "(nothing)"
        detail = " ".join(str(exc).split())
        raise ConfigError(f"--vllm-set {given}: vLLM's SchedulerConfig refuses it: {detail[:300]}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except SchedlabError as exc:
        print(f"vllm_diff: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vllm_diff: interrupted", file=sys.stderr)
        return 130


def _main(args) -> int:
    sides = _sides(args)
    groups = _groups(args.groups)
    seeds = _seeds(args.seeds)
    replay = None
    if args.replay is not None:
        try:
            replay = Case.from_json(args.replay)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"--replay: not a case ({exc})") from None
    vllm, schedlab = _runners(args)
    differ = Differ(vllm, schedlab, sides)
    print(f"vLLM {vllm.version} Scheduler vs schedlab `vllm` preset ({args.engine} engine), 1 ms per iteration"
          + (f"; {sides.describe()}" if sides.schedlab_scheduler or sides.vllm_scheduler else ""))
    if replay is not None:
        _check_sides(differ, replay)
        comparison = differ.compare(replay)
        print(comparison.describe(sides))
        if not comparison.agrees and args.shrink:
            print("shrunk:")
            print(_shrunk(differ, comparison, args.max_evaluations).describe(sides))
        return 0 if comparison.agrees else 1
    _check_sides(differ, generate(groups[0], seeds.start))
    by_group: dict[str, list[Comparison]] = {}
    with progress(len(groups) * len(seeds), "cases") as bar:
        for group in groups:
            by_group[group] = []
            for seed in seeds:
                by_group[group].append(differ.compare(generate(group, seed)))
                bar.update()
    print(agreement_table(by_group))
    if args.json:
        _write_json(args.json, by_group)
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


def _write_json(path: str, by_group) -> None:
    import attrs
    data = {group: [{"case": c.case.to_dict(), "agrees": c.agrees, "fields": sorted(c.fields),
                     "vllm": {rid: attrs.asdict(o) for rid, o in c.vllm.items()},
                     "schedlab": {rid: attrs.asdict(o) for rid, o in c.schedlab.items()},
                     "errors": [c.vllm_error, c.schedlab_error]} for c in cs]
            for group, cs in by_group.items()}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
