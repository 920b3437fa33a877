"""``python tools/vllm_diff.py``: vLLM 0.33's V1 scheduler against schedlab's ``vllm`` preset."""

from __future__ import annotations

import sys

from schedlab.diffcheck import cli
from schedlab.errors import ConfigError, SchedlabError

from .case import ENGINE
from .kv_steps import MODES as KV_STEP_MODES
from .workloads import ALL_GROUPS, generate

DESCRIPTION = """\
Step vLLM's own V1 Scheduler (vLLM 0.33.0, CPU, no model) and schedlab's `vllm` scheduler
preset side by side on random workloads, one feature group at a time, with every iteration
lasting 1 ms on both. Per request, compare the first scheduled iteration, the first token,
the finish, the preemptions and the prefix-cache hits; print the share of identical cases
per group and a shrunk reproducer of each differing case shown. Needs vLLM:
pip install -e '.[vllm]' (see the README section "Checked against vLLM").

The window_* groups give the model sliding-window layers (vLLM's hybrid KV cache manager:
a full-attention group and 1-2 sliding-window groups sharing the pool; schedlab's
SlidingWindow); for them the block pools are also compared after every step (--kv-steps),
a difference showing in the error column with the first step where the pools part."""

def _add_arguments(p) -> None:
    p.add_argument("--reserve-full-prompt", choices=("on", "off"),
                   help="both sides at once: schedlab reserve_full_prompt and vLLM scheduler_reserve_full_isl")
    p.add_argument("--allow-other-vllm", action="store_true", help="run against a vLLM other than 0.33.0")
    p.add_argument("--prefix-retention", default="default", metavar="default|dense|TOKENS",
                   help="vLLM's prefix_cache_retention_interval: which blocks of a sliding-window group it caches "
                        "(default: vLLM 0.33's 0, only what a hit at a prompt's replay boundary or a shared-prefix "
                        "junction needs; dense: every full block, as schedlab has it)")
    p.add_argument("--hunt", metavar="DIR",
                   help="compare a `schedlab hunt --out DIR` counterexample instead: each run of it on the vllm "
                        "scheduler, instance by instance, its arrivals put between the same steps as in the "
                        "hunt's replay (schedlab.vllm_diff.from_hunt)")
    p.add_argument("--kv-steps", choices=KV_STEP_MODES, default="window",
                   help="compare the KV block pools after every step (blocks in use, each request's window "
                        "blocks; schedlab's on its reference engine): in the cases with a window (default), in "
                        "all, or off; a difference is an error")


def _sides(args, schedlab: dict, vllm: dict) -> None:
    if args.reserve_full_prompt is not None:
        on = args.reserve_full_prompt == "on"
        schedlab.setdefault("reserve_full_prompt", on)
        vllm.setdefault("scheduler_reserve_full_isl", on)


def _vllm(args):
    from .vllm_side import VllmRunner
    if args.prefix_retention not in ("default", "dense") and not args.prefix_retention.isdigit():
        raise ConfigError(f"--prefix-retention: expected default, dense or a number of tokens, "
                          f"got {args.prefix_retention!r}")
    return VllmRunner(allow_other_version=args.allow_other_vllm, kv_steps=args.kv_steps, engine=args.engine,
                      prefix_retention=args.prefix_retention)


def _schedlab(engine: str):
    from .schedlab_side import SchedlabRunner
    return SchedlabRunner(engine)


HARNESS = cli.Harness(engine=ENGINE, prog="vllm_diff", description=DESCRIPTION, groups=ALL_GROUPS, generate=generate,
                      theirs=_vllm, ours=_schedlab, install="install it with pip install -e '.[vllm]'",
                      refuser="vLLM's SchedulerConfig", add_arguments=_add_arguments, sides=_sides)


def main(argv: list[str] | None = None) -> int:
    args = cli.build_parser(HARNESS).parse_args(argv)
    if args.hunt is None:
        return cli.main(HARNESS, argv)
    try:
        return _hunt(args)
    except SchedlabError as exc:
        print(f"{HARNESS.prog}: error: {exc}", file=sys.stderr)
        return 2


def _hunt(args) -> int:
    """Each case of the counterexample in ``args.hunt`` on both schedulers; 0 when vLLM's agrees
    with schedlab's on every one and the harness's schedlab side replays the hunt's steps."""
    from schedlab.diffcheck.compare import Differ

    from .from_hunt import counterexample_cases

    cases, skipped = counterexample_cases(args.hunt)
    if not cases:
        raise ConfigError(f"--hunt {args.hunt}: no run to compare ({'; '.join(skipped) or 'none'})")
    theirs, ours = cli.runners(HARNESS, args)
    print(f"vLLM {theirs.version} vs schedlab ({args.engine} engine) on {args.hunt}: each run's steps at 1 ms")
    good = True
    for hc in cases:
        comparison = Differ(ENGINE, theirs, ours, hc.sides).compare(hc.case)
        mapped = {rid: (o.first_scheduled_ms, o.first_token_ms, o.finish_ms, o.preemptions)
                  for rid, o in comparison.ours.items()}
        off = sorted(rid for rid, steps in hc.replay.items() if mapped.get(rid) != steps)
        verdict = "vLLM agrees" if comparison.agrees else "vLLM differs"
        print(f"\n[{hc.label}: {len(hc.case.requests)} requests; {verdict}; "
              + ("the replay's steps held" if not off else f"the replay's steps did not hold for requests {off}") + "]")
        if not comparison.agrees:
            print(comparison.describe(hc.sides))
        good = good and comparison.agrees and not off
    for line in skipped:
        print(f"left out: {line}")
    return 0 if good else 1
