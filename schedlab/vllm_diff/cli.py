"""``python tools/vllm_diff.py``: vLLM 0.33's V1 scheduler against schedlab's ``vllm`` preset."""

from __future__ import annotations

from schedlab.diffcheck import cli
from schedlab.errors import ConfigError

from .case import ENGINE
from .workloads import GROUPS, generate

DESCRIPTION = """\
Step vLLM's own V1 Scheduler (vLLM 0.33.0, CPU, no model) and schedlab's `vllm` scheduler
preset side by side on random workloads, one feature group at a time, with every iteration
lasting 1 ms on both. Per request, compare the first scheduled iteration, the first token,
the finish, the preemptions and the prefix-cache hits; print the share of identical cases
per group and a shrunk reproducer of each differing case shown. Needs vLLM:
pip install -e '.[vllm]' (see the README section "Checked against vLLM")."""

INSTALL = "install it with pip install -e '.[vllm]'"


def _add_arguments(p) -> None:
    p.add_argument("--reserve-full-prompt", choices=("on", "off"),
                   help="both sides at once: schedlab reserve_full_prompt and vLLM scheduler_reserve_full_isl")
    p.add_argument("--allow-other-vllm", action="store_true", help="run against a vLLM other than 0.33.0")


def _sides(args, schedlab: dict, vllm: dict) -> None:
    if args.reserve_full_prompt is not None:
        on = args.reserve_full_prompt == "on"
        schedlab.setdefault("reserve_full_prompt", on)
        vllm.setdefault("scheduler_reserve_full_isl", on)


def _runners(args):
    from .schedlab_side import SchedlabRunner
    try:
        from .vllm_side import VllmRunner, VllmVersionError
    except ImportError as exc:  # pragma: no cover - only without vLLM
        raise ConfigError(f"cannot import vLLM ({exc}); {INSTALL}") from None
    try:
        vllm = VllmRunner(allow_other_version=args.allow_other_vllm)
    except ImportError as exc:
        raise ConfigError(f"cannot import vLLM ({exc}); {INSTALL}") from None
    except VllmVersionError as exc:
        raise ConfigError(str(exc)) from None
    return vllm, SchedlabRunner(args.engine)


def _check_sides(differ, case) -> None:
    """Fail early (exit 2) on a one-sided setting either engine refuses."""
    differ.ours.build(case, differ.sides)
    try:
        differ.theirs.scheduler(case, differ.sides)
    except (TypeError, ValueError) as exc:
        given = " ".join(f"{k}={v}" for k, v in differ.sides.engine) or "(nothing)"
        detail = " ".join(str(exc).split())
        raise ConfigError(f"--vllm-set {given}: vLLM's SchedulerConfig refuses it: {detail[:300]}") from None


HARNESS = cli.Harness(engine=ENGINE, prog="vllm_diff", description=DESCRIPTION, groups=GROUPS, generate=generate,
                      runners=_runners, check_sides=_check_sides, add_arguments=_add_arguments, sides=_sides)


def main(argv: list[str] | None = None) -> int:
    return cli.main(HARNESS, argv)
