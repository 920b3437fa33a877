"""A conformance kit: run a scheduler, cost model or KV cache and check the engine's rules.

For plugin authors as much as for schedlab's own tests::

    from hypothesis import given
    from schedlab.testing import check_run, kit_settings, requests_lists, run_engine

    @kit_settings
    @given(requests_lists())
    def test_my_scheduler_conserves_requests(requests):
        result = run_engine(requests, MyScheduler(), kv_blocks=64)
        check_run(result, requests, max_running=8)

:func:`check_run` asserts what every correct run satisfies (conservation of requests and
tokens, capacity limits, causality); :class:`IterationChecker` asserts per-iteration limits
(token budget, running count, KV capacity and accounting, the cache's own invariants) and is
attached with ``run_engine(..., check=...)``; :class:`AccountedKV` wraps a KV cache and checks
every call the engines make (``blocks_needed`` is what ``allocate`` takes, the pool adds up).
:class:`RecordingScheduler` keeps every plan of a scheduler it wraps, for
:func:`check_victims_least_important` and :func:`check_admissions_follow_priority` (vLLM's
priority rules, from the priorities the requests were sent with).
:func:`check_deterministic` runs the same requests twice with fresh plugins and asserts the runs
are identical (a plugin that keeps state across instances, or draws unseeded, fails it).
For cost models: :func:`check_cost_model` on shapes from :func:`batches` (a positive, finite
time, the same when asked again, and more work never cheaper). For power models: :func:`check_power_model` (the closed form over a decode run against its
iterations, never below idle power) and :func:`check_energy` (a metered run's energy is the
integral of its power over the timeline, and all of it reaches the requests); run with
``run_engine(..., power=lambda cost: MyPowerModel(...))``.
:data:`kit_settings` are the Hypothesis settings these tests need: no per-example deadline.
"""

import os

from hypothesis import HealthCheck, Phase, settings

from .compare import compare_runs
from .cost import batches, check_cost_model
from .energy import check_energy, check_power_model
from .experiments import check_clients_gave_up, fast_run_agreeing_with_reference
from .kit import (IterationChecker, RecordingRouter, blocks_for_largest, check_deterministic, check_run,
                  run_cluster, run_disaggregated, run_engine, small_closed_loop, view_state)
from .kv import AccountedKV
from .priority import (PlanRecord, Queued, RecordingScheduler, check_admissions_follow_priority,
                       check_victims_least_important)
from .strategies import dyadic_linear_costs, requests_lists


#: Hypothesis settings for conformance tests: a simulation's wall time depends on the machine and
#: its load, so a per-example deadline (Hypothesis' default: 200 ms) fails tests on a busy CI
#: machine for reasons unrelated to the plugin; and no explain phase, which traces the simulator line
#: by line after a failure (minutes on Python 3.11 before the shrunk example is shown, for a list of
#: lines only failing examples ran). Apply as a decorator; derive others from it with
#: ``settings(kit_settings, max_examples=500)``.
kit_settings = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                        phases=[phase for phase in Phase if phase is not Phase.explain])


def examples(n: int) -> int:
    """``n`` hypothesis examples, times ``$SCHEDLAB_EXAMPLES_SCALE`` (default 1) for long campaigns."""
    return max(1, int(n * float(os.environ.get("SCHEDLAB_EXAMPLES_SCALE", "1"))))


__all__ = ["AccountedKV", "batches", "blocks_for_largest", "check_admissions_follow_priority", "check_clients_gave_up",
           "check_cost_model", "check_deterministic", "check_energy", "check_power_model", "check_run",
           "check_victims_least_important", "compare_runs", "dyadic_linear_costs", "examples",
           "fast_run_agreeing_with_reference", "IterationChecker", "kit_settings", "PlanRecord", "Queued",
           "RecordingRouter", "RecordingScheduler", "requests_lists", "run_cluster", "run_disaggregated", "run_engine",
           "small_closed_loop", "view_state"]
