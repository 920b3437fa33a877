"""``python tools/sglang_diff.py``: SGLang 0.5.23's scheduler against schedlab's ``sglang`` preset."""

from __future__ import annotations

from schedlab.diffcheck import cli
from schedlab.errors import ConfigError

from .case import ENGINE
from .workloads import GROUPS, generate

DESCRIPTION = """\
Step SGLang's own Scheduler (SGLang 0.5.23, CPU, no model, overlap scheduling off) and
schedlab's `sglang` scheduler over a `radix` cache side by side on random workloads, one
feature group at a time, with every iteration lasting 1 ms on both. Per request, compare the
admission, the first token, the finish, the retractions, the prefix-cache hits and the prompt
tokens of every prefill step; print the share of identical cases per group and a shrunk
reproducer of each differing case shown. Needs SGLang: see the README section "Checked against
SGLang" for a CPU install."""

INSTALL = "install it as the README section \"Checked against SGLang\" shows"


def _add_arguments(p) -> None:
    p.add_argument("--allow-other-sglang", action="store_true", help="run against an SGLang other than 0.5.23")


def _runners(args):
    from .schedlab_side import SchedlabRunner
    try:
        from .sglang_side import SglangRunner, SglangVersionError
        sglang = SglangRunner(allow_other_version=args.allow_other_sglang)
    except ImportError as exc:
        raise ConfigError(f"cannot import SGLang ({exc}); {INSTALL}") from None
    except SglangVersionError as exc:
        raise ConfigError(str(exc)) from None
    return sglang, SchedlabRunner(args.engine)


def _check_sides(differ, case) -> None:
    """Fail early (exit 2) on a one-sided setting either engine refuses."""
    differ.ours.build(case, differ.sides)
    try:
        differ.theirs.server_args(case, differ.sides)
    except (TypeError, ValueError) as exc:
        given = " ".join(f"{k}={v}" for k, v in differ.sides.engine) or "(nothing)"
        detail = " ".join(str(exc).split())
        raise ConfigError(f"--sglang-set {given}: SGLang's ServerArgs refuses it: {detail[:300]}") from None


HARNESS = cli.Harness(engine=ENGINE, prog="sglang_diff", description=DESCRIPTION, groups=GROUPS, generate=generate,
                      runners=_runners, check_sides=_check_sides, add_arguments=_add_arguments)


def main(argv: list[str] | None = None) -> int:
    return cli.main(HARNESS, argv)
