"""The conformance kit's priority checks (:mod:`schedlab.testing.priority`), tested so that each test can fail.

* :class:`RecordingScheduler` is transparent. A scheduler has exactly the optional members
  with it that it has without it, and a wrapped run equals the plain one in both engines,
  engine errors included.
* Hand-computed plans of the built-in ``continuous`` scheduler under ``policy = "priority"``.
* That scheduler passes both checks under Hypothesis, with caches tight enough to force
  preemption.
* The priority bugs of audit s57 are caught (gap 3: s08, s09, s10, s17). Each bug is in a
  subclass of a small correct scheduler written here, and a hand-made request list triggers
  it. The correct scheduler passes the same lists.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.errors import SimulationError, StallError
from schedlab.model import Request
from schedlab.queues import KeyedQueue
from schedlab.testing import (IterationChecker, blocks_for_largest, check_run, compare_runs, examples, kit_settings,
                              requests_lists, run_engine)
from schedlab.testing.priority import (PlanRecord, Queued, RecordingScheduler, check_admissions_follow_priority,
                                       check_victims_least_important)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.kv_caches.prefix import PrefixKVCache
from schedlab_plugins.schedulers import (ContinuousConfig, ContinuousScheduler, SglangConfig, SglangScheduler,
                                         StaticConfig, StaticScheduler, TgiConfig, TgiScheduler, VtcConfig,
                                         VtcScheduler)

ENGINES = ("fast", "reference")
COST = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0)  # (dyadic: exact times)


# -- a small priority scheduler, as a plugin author would write one, and its bugs --------------------------------


class Small:
    """Priority first, then arrival (vLLM's priority policy); whole prompts within a token
    budget; at most ``seqs`` running; KV grown as computed. A decode step that finds no block
    preempts the least important running request, and a plan that preempted admits nothing.
    A waiting request is admitted only if its whole prompt's blocks are free, and admission
    stops at the first one that does not fit."""

    stable_between_events = True

    def __init__(self, seqs: int = 2, budget: int = 256):
        self.seqs = self.slots = seqs
        self.budget = budget

    def new_waiting_queue(self):
        return KeyedQueue(self.queue_key)

    @staticmethod
    def queue_key(seq):
        return seq.request.priority  # (ties: arrival order)

    @staticmethod
    def victim_key(seq):
        return (seq.request.priority, seq.seq_no)

    def next_to_admit(self, plan):
        return plan.waiting.peek()

    def schedule(self, plan):
        while not plan.decode_all():
            plan.preempt(max(plan.running, key=self.victim_key))
        if plan.preempted:
            return
        left = self.budget - plan.num_scheduled_tokens
        while len(plan.running) < self.seqs:
            seq = self.next_to_admit(plan)
            if seq is None:
                return
            n = seq.num_tokens
            if n > left or plan.kv.blocks_needed(seq, n) > plan.kv.num_free_blocks() or not plan.admit(seq, n):
                return
            left -= n


class PreemptedJumpQueue(Small):
    """s08: a preempted request goes to the head of the queue, whatever its priority."""

    @staticmethod
    def queue_key(seq):
        return -1 if seq.num_preemptions else seq.request.priority


class VictimIgnoresPriority(Small):
    """s09: the victim is the latest arrival, whatever its priority."""

    @staticmethod
    def victim_key(seq):
        return seq.seq_no


class LongPromptsWaitForIdle(Small):
    """s10: prompts longer than 16 tokens are admitted only when nothing runs."""

    def next_to_admit(self, plan):
        return next((s for s in plan.waiting if s.num_tokens <= 16 or not plan.running), None)


class LimitRequestRebuilds(Small):
    """s17: caps the context at 32 tokens by rebuilding the request, which drops its priority
    (and its prefix group, client, class...)."""

    def limit_request(self, request, kv):
        cap = 32 - request.prompt_tokens
        if cap < 1 or request.max_output_tokens <= cap:
            return request
        return Request(request.id, request.arrival_ms, request.prompt_tokens, request.output_tokens, max_tokens=cap)


class LimitRequestEvolves(LimitRequestRebuilds):
    """The same cap, done right: ``attrs.evolve`` keeps every other field."""

    def limit_request(self, request, kv):
        cap = 32 - request.prompt_tokens
        if cap < 1 or request.max_output_tokens <= cap:
            return request
        return attrs.evolve(request, max_tokens=cap)


def recorded(requests, scheduler, engine: str = "fast", **kwargs) -> RecordingScheduler:
    """``scheduler`` wrapped, after a run of ``requests`` with :data:`COST`."""
    recorder = RecordingScheduler(scheduler)
    run_engine(requests, recorder, LinearCostModel(COST), engine=engine, **kwargs)
    return recorder


def acting(recorder) -> list[PlanRecord]:
    """The records of plans that admitted or preempted someone (both engines make these)."""
    return [r for r in recorder.records if r.admitted or r.preempted]


# -- the recorder is transparent ----------------------------------------------------------------------------------

#: the Scheduler protocol's optional members, and what else the engines and the run assembly read
MEMBERS = ("stable_between_events", "new_waiting_queue", "rejection_reason", "kv_problem", "start_up_problem",
           "limit_request", "on_finish", "slots", "kv_reservation", "max_in_flight", "answer_segment",
           "pull_headroom", "plans_ahead", "overshoots", "reads_held", "aborts_run_once_more", "stall_hint",
           "counts_drafts_ahead", "staggers_decodes", "running_timeout_ms", "running_timeout_reason",
           "setting_notes", "max_model_len_for", "config")


class Bare:
    """A scheduler with no optional member at all."""

    def schedule(self, plan):
        plan.decode_all()


SCHEDULERS = {
    "bare": Bare,
    "small": Small,
    "limits": LimitRequestEvolves,
    "continuous": ContinuousScheduler,
    "continuous-ahead": lambda: ContinuousScheduler(ContinuousConfig(async_scheduling=True, max_model_len=48,
                                                                     policy="priority")),
    "tgi": TgiScheduler,
    "sglang": SglangScheduler,
    "vtc": VtcScheduler,
    "static": StaticScheduler,
}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_the_wrapper_has_exactly_the_members_of_the_scheduler_it_wraps(name):
    inner = SCHEDULERS[name]()
    wrapped = RecordingScheduler(inner)
    assert isinstance(wrapped, RecordingScheduler) and wrapped.inner is inner
    assert type(wrapped).__name__ == type(inner).__name__  # (the engines' messages name the plugin)
    for member in MEMBERS:
        assert hasattr(wrapped, member) == hasattr(inner, member), member
        if hasattr(inner, member):
            assert getattr(wrapped, member) == getattr(inner, member), member
        else:
            assert getattr(wrapped, member, "absent") == "absent", member
            with pytest.raises(AttributeError):
                getattr(wrapped, member)


def test_the_wrapper_reads_and_sets_through_to_the_scheduler():
    inner = ContinuousScheduler()
    wrapped = RecordingScheduler(inner)
    inner.stall_hint = "why"  # (set by each plan: read when the engine asks, not when wrapped)
    assert wrapped.stall_hint == "why"
    wrapped.stall_hint = None
    assert inner.stall_hint is None
    wrapped.extra = 1
    assert inner.extra == 1 and wrapped.extra == 1
    del wrapped.extra
    assert not hasattr(inner, "extra") and not hasattr(wrapped, "extra")
    assert RecordingScheduler(Bare()).records == []


class HoldsEverything(Small):
    stall_hint = "it holds every request back"

    def next_to_admit(self, plan):
        return None


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("make, request_, error, says", [
    (LimitRequestRebuilds, Request(0, 0.0, 4, 40, prefix_group=1, prefix_tokens=4), SimulationError,
     "scheduler LimitRequestRebuilds's limit_request changed request 0's prefix_group"),
    (HoldsEverything, Request(0, 0.0, 4, 4), StallError, "scheduler HoldsEverything,"),
])
def test_engine_errors_read_the_same_with_the_wrapper(make, request_, error, says, engine):
    with pytest.raises(error) as plain:
        run_engine([request_], make(), engine=engine)
    with pytest.raises(error) as wrapped:
        run_engine([request_], RecordingScheduler(make()), engine=engine)
    assert says in str(plain.value)
    assert str(wrapped.value) == str(plain.value)
    if make is HoldsEverything:
        assert "it holds every request back" in str(wrapped.value)  # (its stall_hint, read through the wrapper)


@st.composite
def schedulers(draw):
    """``(make, swap space?)``: a maker of built-in schedulers of many settings (``Small`` too)."""
    kind = draw(st.sampled_from(["continuous", "continuous", "tgi", "sglang", "vtc", "static", "small"]))
    if kind == "continuous":
        swap = draw(st.booleans())
        policy = draw(st.sampled_from(["fcfs", "priority", "priority", "sjf", "lof"]))
        window = draw(st.sampled_from([0.0, 0.0, 3.0]))
        config = ContinuousConfig(
            max_num_seqs=draw(st.integers(1, 4)), max_num_batched_tokens=draw(st.sampled_from([16, 64, 128])),
            chunked_prefill=draw(st.booleans()), preemption="swap" if swap else "recompute", policy=policy,
            allocation="grow" if swap else draw(st.sampled_from(["grow", "reserve"])),
            priority_preemption=policy == "priority" and draw(st.booleans()), prefill_first=draw(st.booleans()),
            max_wait_ms=window, async_scheduling=False if swap or window else draw(st.booleans()),
            max_model_len=draw(st.sampled_from([0, 0, 48])))
        return (lambda: ContinuousScheduler(config)), swap
    if kind == "tgi":
        config = TgiConfig(prefill_chunking=draw(st.booleans()), generation_segment=draw(st.sampled_from([0, 8])),
                           max_concurrent_requests=draw(st.sampled_from([3, 128])))
        return (lambda: TgiScheduler(config)), False
    if kind == "sglang":
        config = SglangConfig(max_running_requests=draw(st.integers(1, 4)),
                              chunked_prefill_size=draw(st.sampled_from([0, 16])),
                              overlap_schedule=draw(st.booleans()), enable_priority_scheduling=draw(st.booleans()))
        return (lambda: SglangScheduler(config)), False
    if kind == "vtc":
        config = VtcConfig(max_num_seqs=draw(st.integers(1, 4)), allocation="grow")
        return (lambda: VtcScheduler(config)), False
    if kind == "static":
        config = StaticConfig(batch_size=draw(st.integers(1, 4)))
        return (lambda: StaticScheduler(config)), False
    seqs = draw(st.integers(1, 4))
    return (lambda: Small(seqs)), False


@settings(kit_settings, max_examples=examples(200))
@given(requests_lists(priorities=True), schedulers(), st.integers(0, 4))
def test_a_wrapped_run_is_the_plain_run_in_both_engines(requests, scheduler, spare):
    """Both engines, run by run (``compare_runs`` exactly); and the two engines' records show
    the same admissions and preemptions (the fast engine skips only plans it knows: decode-only)."""
    make, swap = scheduler
    blocks = blocks_for_largest(requests, 4) + spare + 1  # (tight: preemptions)

    def kv():
        return PagedKVCache(blocks, 4, swap_blocks=blocks if swap else 0)

    acts = []
    for engine in ENGINES:
        plain = run_engine(requests, make(), kv=kv(), engine=engine)
        recorder = RecordingScheduler(make())
        wrapped = run_engine(requests, recorder, kv=kv(), engine=engine)
        compare_runs(plain, wrapped, rel=0.0)
        assert wrapped.meta["slots"] == plain.meta["slots"]
        assert recorder.records or plain.metrics["rejected"] == len(requests)
        acts.append(acting(recorder))
    # the same plans; their times to float rounding (a bulk run's k-th step is start + k x inc in
    # the fast engine, k additions in the reference engine)
    assert [attrs.evolve(r, now=0.0) for r in acts[0]] == [attrs.evolve(r, now=0.0) for r in acts[1]]
    assert [r.now for r in acts[0]] == pytest.approx([r.now for r in acts[1]], rel=1e-12, abs=1e-9)


# -- hand-computed plans of the built-in priority policy ----------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_priority_admissions_by_hand(engine):
    # One slot; prompts of 2 tokens take 1 ms, a decode step 4 ms. Request 0 (priority 2) runs from 0
    # and finishes at 1 + 2 x 4 = 9. Requests 1 (priority 2) and 2 (priority 0) arrive at 0.5: at 9
    # request 2 goes first (done at 1 + 4 later, 14), then request 1.
    requests = [Request(0, 0.0, 2, 3, priority=2), Request(1, 0.5, 2, 2, priority=2), Request(2, 0.5, 2, 2, priority=0)]
    recorder = recorded(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1, policy="priority")), engine)
    assert acting(recorder) == [
        PlanRecord(0.0, (Queued(0, 2, 0.0),), (), (0,), (), (), (0,)),
        PlanRecord(9.0, (Queued(2, 0, 0.5), Queued(1, 2, 0.5)), (), (2,), (), (1,), (2,)),
        PlanRecord(14.0, (Queued(1, 2, 0.5),), (), (1,), (), (), (1,)),
    ]
    check_admissions_follow_priority(recorder, requests, strict=True)
    check_victims_least_important(recorder, requests)
    # FCFS starts request 1 at 9, while request 2 waits
    fcfs = recorded(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), engine)
    with pytest.raises(AssertionError, match=r"t=9 ms: request 1 \(priority 2\) was admitted while more important "
                                             r"request\(s\) 2 \(priority 0\)"):
        check_admissions_follow_priority(fcfs, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_priority_victim_by_hand(engine):
    # Blocks of 4 tokens, 4 of them. Request 0 (priority 2) is prefilled from 0 to 2 (4 tokens,
    # 1 block); request 1 (priority 0, arrived at 1) joins at 2 beside 0's decode (to 8). Each
    # then holds 2 blocks until its 9th token: at 20 both need a third, and the victim is request
    # 0 -- the least important, though the first admitted (FCFS would take request 1, the latest).
    # Request 1's 8th token comes at 36; request 0 is admitted again then.
    requests = [Request(0, 0.0, 4, 8, priority=2), Request(1, 1.0, 4, 8, priority=0)]
    config = ContinuousConfig(policy="priority", allocation="grow")
    recorder = recorded(requests, ContinuousScheduler(config), engine, kv=PagedKVCache(4, 4))
    assert acting(recorder) == [
        PlanRecord(0.0, (Queued(0, 2, 0.0),), (), (0,), (), (), (0,)),
        PlanRecord(2.0, (Queued(1, 0, 1.0),), (0,), (1,), (), (), (0, 1)),
        PlanRecord(20.0, (), (0, 1), (), (0,), (0,), (1,)),
        PlanRecord(36.0, (Queued(0, 2, 0.0),), (), (0,), (), (), (0,)),
    ]
    check_victims_least_important(recorder, requests)
    check_admissions_follow_priority(recorder, requests, strict=True)
    fcfs = recorded(requests, ContinuousScheduler(attrs.evolve(config, policy="fcfs")), engine, kv=PagedKVCache(4, 4))
    with pytest.raises(AssertionError, match=r"t=20 ms: request 1 \(priority 0\) was preempted while less important "
                                             r"request\(s\) 0 \(priority 2\) kept running"):
        check_victims_least_important(fcfs, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_finished_request_freed_ahead_is_no_victim(engine):
    # Planning ahead, with priority preemption (default costs, 1-token blocks, 13 of them): at
    # 104.1, request 1 (priority 1) has finished in the batch in flight and still holds its slot
    # and blocks. Request 4 (priority 0) needs them: the plan preempts request 1, which only frees
    # them, admits 4, then 0 (priority 2) in what is left.
    requests = [Request(0, 0.0, 1, 1, priority=2), Request(1, 0.0, 11, 1, priority=1),
                Request(2, 0.0, 1, 2, max_tokens=3, priority=0), Request(3, 0.0, 1, 11, max_tokens=12, priority=0),
                Request(4, 96.125, 1, 1, priority=0)]
    config = ContinuousConfig(max_num_seqs=2, policy="priority", priority_preemption=True, async_scheduling=True,
                              reserve_full_prompt=False)
    recorder = RecordingScheduler(ContinuousScheduler(config))
    result = run_engine(requests, recorder, kv=PagedKVCache(13, 1), engine=engine)
    last = acting(recorder)[-1]
    assert (last.running, last.preempted, last.finished, last.admitted) == ((), (1,), (1,), (4, 0))
    assert result.requests["preemptions"].tolist()[1] == 1 and result.requests["generated_tokens"].tolist()[1] == 1
    check_victims_least_important(recorder, requests)
    check_admissions_follow_priority(recorder, requests, strict=True)
    bare = [attrs.evolve(r, finished=()) for r in recorder.records]  # (as if it had been running)
    with pytest.raises(AssertionError, match=r"request 1 \(priority 1\) was preempted while less important "
                                             r"request\(s\) 0 \(priority 2\)"):
        check_victims_least_important(bare, requests)


@pytest.mark.parametrize("engine", ENGINES)
def test_swapping_priority_preemption_needs_newcomers_false(engine):
    # Built-in behaviour the default check flags: with swap preemption and priority preemption,
    # continuous swaps in before it admits, and a plan cannot take back a sequence it swapped in.
    # Default costs, 1-token blocks, 7 of them, 2 slots: at 0.15 request 2 (priority 0) swaps out
    # request 0 (priority 2). At 8.2 request 0 comes back in; then request 3 (priority 0) needs a
    # slot and the only victim left is request 1 (priority 1), running since before the plan.
    requests = [Request(0, 0.0, 1, 2, priority=2), Request(1, 0.0, 2, 3, priority=1),
                Request(2, 0.125, 1, 1, priority=0), Request(3, 0.25, 1, 1, priority=0)]
    config = ContinuousConfig(max_num_seqs=2, policy="priority", priority_preemption=True, allocation="grow",
                              preemption="swap", reserve_full_prompt=False)
    recorder = RecordingScheduler(ContinuousScheduler(config))
    run_engine(requests, recorder, kv=PagedKVCache(7, 1, swap_blocks=7), engine=engine)
    assert [(r.running, r.preempted, r.admitted, r.running_after) for r in acting(recorder)][1:] == [
        ((1, 0), (0,), (2,), (1, 2)), ((1,), (1,), (3,), (0, 3))]
    with pytest.raises(AssertionError, match=r"t=8.2 ms: request 1 \(priority 1\) was preempted while less important "
                                             r"request\(s\) 0 \(priority 2\) kept running"):
        check_victims_least_important(recorder, requests)
    check_victims_least_important(recorder, requests, newcomers=False)
    check_admissions_follow_priority(recorder, requests, strict=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_victim_swapped_out_for_priority_comes_back_before_anyone_newer(engine):
    # continuous's rule 2 (swapped sequences come back before anything new is admitted), within
    # the plan that swaps: 1-token blocks, 13 of them, 3 slots, budget 8. At 0.4 request 2
    # (priority 2) is swapped out for the decodes; at 8.4 request 3 (priority 0) needs a slot and
    # request 0 (priority 1) is swapped out for it. Request 2 waits -- it was admitted in that
    # plan too, ahead of the victim, before the fix
    requests = [Request(0, 0.0, 1, 3, priority=1), Request(1, 0.0, 4, 3, priority=0),
                Request(2, 0.0, 7, 1, priority=2), Request(3, 0.125, 5, 6, priority=0)]
    config = ContinuousConfig(max_num_seqs=3, max_num_batched_tokens=8, chunked_prefill=True, allocation="grow",
                              preemption="swap", policy="priority", priority_preemption=True, reserve_full_prompt=False)
    recorder = RecordingScheduler(ContinuousScheduler(config))
    run_engine(requests, recorder, kv=PagedKVCache(13, 1, swap_blocks=13), engine=engine)
    assert [(r.now, r.admitted, r.preempted) for r in acting(recorder)] == [
        (0.0, (1, 0, 2), ()), (0.4, (), (2,)), (8.4, (3,), (0,)), (56.65, (2,), ())]


def test_the_checks_on_hand_made_records():
    requests = [Request(i, 0.0, 4, 4, priority=p) for i, p in enumerate([0, 1, 2, 1])]
    q = {r.id: Queued(r.id, r.priority, r.arrival_ms) for r in requests}
    # a victim admitted again in the same plan, then a less important one: nobody lost out
    again = PlanRecord(5.0, (q[2],), (0, 1), (1, 2), (1,), (), (0, 1, 2))
    check_victims_least_important([again], requests)
    # a newcomer less important than the victim
    newcomer = PlanRecord(5.0, (q[2],), (0, 1), (2,), (1,), (1,), (0, 2))
    with pytest.raises(AssertionError, match=r"request 1 \(priority 1\) was preempted while less important "
                                             r"request\(s\) 2 \(priority 2\)"):
        check_victims_least_important([newcomer], requests)
    check_victims_least_important([newcomer], requests, newcomers=False)
    # the head did not fit: nothing admitted, nothing wrong; one rejected: it holds nobody back
    check_admissions_follow_priority([PlanRecord(1.0, (q[0], q[2]), (), (), (), (0, 2), ())], requests)
    check_admissions_follow_priority([PlanRecord(1.0, (q[0], q[2]), (), (2,), (), (), (2,))], requests)
    # same priority, the later one first: only strict minds
    past = [PlanRecord(1.0, (q[1], q[3]), (), (3,), (), (1,), (3,))]
    check_admissions_follow_priority(past, requests)
    with pytest.raises(AssertionError, match=r"request 3 \(priority 1\) was admitted past request\(s\) 1 "
                                             r"\(priority 1\)"):
        check_admissions_follow_priority(past, requests, strict=True)
    # the scheduler saw another priority than the one sent: said so
    seen = [PlanRecord(1.0, (Queued(2, 0, 0.0), q[1]), (), (2,), (), (1,), (2,))]
    with pytest.raises(AssertionError, match=r"request 2 \(priority 2; the scheduler saw 0\).*limit_request"):
        check_admissions_follow_priority(seen, requests)
    with pytest.raises(ValueError, match=r"requests \[9\]"):
        check_admissions_follow_priority([PlanRecord(1.0, (Queued(9, 0, 0.0),), (), (9,), (), (), (9,))], requests)


# -- the built-in priority policy passes --------------------------------------------------------------------------


@st.composite
def priority_configs(draw):
    """``continuous`` under ``policy = "priority"``, in most of its settings."""
    seqs = draw(st.integers(1, 5))
    chunked = draw(st.booleans())
    swap = draw(st.integers(0, 3)) == 0
    ahead = not swap and draw(st.booleans())  # (vLLM V1's asynchronous scheduling: no swapping, no window)
    return ContinuousConfig(
        max_num_seqs=seqs, max_num_batched_tokens=draw(st.integers(max(seqs, 8), 120)) if chunked else 128,
        chunked_prefill=chunked, long_prefill_token_threshold=draw(st.sampled_from([0, 0, 7])) if chunked else 0,
        allocation="grow" if swap else draw(st.sampled_from(["grow", "grow", "reserve"])),
        preemption="swap" if swap else "recompute", watermark=draw(st.sampled_from([0.0, 0.1])),
        prefill_first=draw(st.booleans()), running_order=draw(st.sampled_from(["admission", "decodes_first"])),
        reserve_full_prompt=draw(st.booleans()), policy="priority", priority_preemption=draw(st.booleans()),
        max_wait_ms=0.0 if ahead else draw(st.sampled_from([0.0, 0.0, 2.0])), async_scheduling=ahead)


@settings(kit_settings, max_examples=examples(400))
@given(requests_lists(priorities=True, min_size=2, prefix_groups=2), priority_configs(), st.booleans(),
       st.integers(0, 3), st.sampled_from([1, 2, 4]), st.sampled_from(ENGINES))
def test_the_builtin_priority_policy_passes(requests, config, prefix, spare, block_size, engine):
    """A victim is the least important request running (vLLM: ``max(running, key=(priority,
    arrival))``), and admissions follow the queue's (priority, arrival) order (strict), under
    caches just larger than the largest request. One exception: swap preemption with priority
    preemption (see :func:`test_swapping_priority_preemption_needs_newcomers_false`)."""
    blocks = blocks_for_largest(requests, block_size) + spare + 1
    blocks += int(blocks * config.watermark * 2) + 1
    kv = (PrefixKVCache if prefix else PagedKVCache)(blocks, block_size,
                                                     swap_blocks=blocks if config.preemption == "swap" else 0)
    recorder = RecordingScheduler(ContinuousScheduler(config))
    result = run_engine(requests, recorder, kv=kv, engine=engine)
    check_run(result, requests, max_running=config.max_num_seqs, kv_blocks=blocks)
    check_victims_least_important(recorder, requests,
                                  newcomers=not (config.preemption == "swap" and config.priority_preemption))
    check_admissions_follow_priority(recorder, requests, strict=True)


# -- the audit's priority bugs are caught ---------------------------------------------------------------------------


@settings(kit_settings, max_examples=examples(150))
@given(requests_lists(priorities=True), st.integers(1, 4), st.integers(0, 3), st.sampled_from(ENGINES))
def test_the_small_scheduler_passes(requests, seqs, spare, engine):
    blocks = blocks_for_largest(requests, 4) + spare
    recorder = RecordingScheduler(Small(seqs))
    result = run_engine(requests, recorder, kv=PagedKVCache(blocks, 4), engine=engine,
                        check=IterationChecker(max_running=seqs, kv_blocks=blocks) if engine == "fast" else None)
    check_run(result, requests, max_running=seqs, kv_blocks=blocks)
    check_victims_least_important(recorder, requests)
    check_admissions_follow_priority(recorder, requests, strict=True)


BUGS = {
    # s08: blocks of 4 tokens, 2 of them. Requests 0 (priority 0) and 1 (priority 1) take one block each at 0;
    # at 2.5 request 1 needs a second one and is preempted. Request 2 (priority 0) has been waiting since
    # 0.125; at 6.5 request 0 has finished: request 2 goes first (one block), and request 1 (now 5 tokens, two
    # blocks) waits. Put at the head, request 1 takes both blocks and request 2 waits.
    "s08": (PreemptedJumpQueue, Small, [Request(0, 0.0, 1, 2, priority=0), Request(1, 0.0, 4, 2, priority=1),
                                        Request(2, 0.125, 1, 1, priority=0)], 2, check_admissions_follow_priority,
            r"t=6.5 ms: request 1 \(priority 1\) was admitted while more important request\(s\) 2 \(priority 0\)"),
    # s09: at 2.5 request 1 (priority 0, the latest arrival) needs a second block of the two: the victim
    # must be request 0 (priority 1)
    "s09": (VictimIgnoresPriority, Small, [Request(0, 0.0, 1, 2, priority=1), Request(1, 0.0, 4, 2, priority=0)], 2,
            check_victims_least_important,
            r"t=2.5 ms: request 1 \(priority 0\) was preempted while less important request\(s\) 0 \(priority 1\)"),
    # s10: request 0 (priority 2) runs from 0; at 2 a slot is free and request 1 (priority 0, 32 prompt
    # tokens) heads the queue, before request 2 (priority 1, 4 tokens)
    "s10": (LongPromptsWaitForIdle, Small, [Request(0, 0.0, 4, 20, priority=2), Request(1, 1.0, 32, 2, priority=0),
                                            Request(2, 1.0, 4, 2, priority=1)], 64, check_admissions_follow_priority,
            r"t=2 ms: request 2 \(priority 1\) was admitted while more important request\(s\) 1 \(priority 0\)"),
    # s17: one slot; requests 1 and 2 are longer than 32 tokens, so the cap rebuilds them, and both have
    # priority 0 in the engine: request 1 goes first at 9
    "s17": (LimitRequestRebuilds, LimitRequestEvolves,
            [Request(0, 0.0, 2, 3, priority=2), Request(1, 0.5, 2, 40, priority=2), Request(2, 0.5, 2, 40, priority=0)],
            64, check_admissions_follow_priority,
            r"t=9 ms: request 1 \(priority 2; the scheduler saw 0\) was admitted while more important request\(s\) "
            r"2 \(priority 0\), waiting.*limit_request rebuild"),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("bug", BUGS)
def test_the_priority_bugs_are_caught(bug, engine):
    buggy, correct, requests, blocks, check, says = BUGS[bug]
    seqs = 1 if bug == "s17" else 2
    for make in (correct, buggy):
        recorder = recorded(requests, make(seqs), engine, kv=PagedKVCache(blocks, 4))
        if make is correct:
            check_victims_least_important(recorder, requests)
            check_admissions_follow_priority(recorder, requests, strict=True)
    with pytest.raises(AssertionError, match=says):
        check(recorder, requests)
