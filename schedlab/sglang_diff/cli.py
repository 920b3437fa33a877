"""``python tools/sglang_diff.py``: SGLang 0.5.23's scheduler against schedlab's ``sglang`` preset."""

from __future__ import annotations

from schedlab.diffcheck import cli

from .case import ENGINE
from .workloads import GROUPS, generate

DESCRIPTION = """\
Step SGLang's own Scheduler (SGLang 0.5.23, CPU, no model; its overlap loop in the `overlap`
groups, synchronously elsewhere) and schedlab's `sglang` scheduler over a `radix` cache (a
`paged` one without prefix caching for --disable-radix-cache) side by side on random
workloads, one feature group at a time, with every iteration lasting 1 ms on both. Per
request, compare the admission, the first token, the finish, the retractions, the prefix-cache
hits and the prompt tokens of every prefill step; print the share of identical cases per group
and a shrunk reproducer of each differing case shown. Needs SGLang: see the README section
"Checked against SGLang" for a CPU install."""


def _add_arguments(p) -> None:
    p.add_argument("--allow-other-sglang", action="store_true", help="run against an SGLang other than 0.5.23")


def _sglang(args):
    from .sglang_side import SglangRunner
    return SglangRunner(allow_other_version=args.allow_other_sglang)


def _schedlab(engine: str):
    from .schedlab_side import SchedlabRunner
    return SchedlabRunner(engine)


HARNESS = cli.Harness(engine=ENGINE, prog="sglang_diff", description=DESCRIPTION, groups=GROUPS, generate=generate,
                      theirs=_sglang, ours=_schedlab, install='install it as the README section "Checked against '
                                                                  'SGLang" shows', refuser="SGLang's ServerArgs",
                      add_arguments=_add_arguments)


def main(argv: list[str] | None = None) -> int:
    return cli.main(HARNESS, argv)
