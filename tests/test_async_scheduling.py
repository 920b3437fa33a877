"""Asynchronous scheduling (``[scheduler] async_scheduling``, the ``vllm`` preset's default,
:mod:`schedlab.engine.ahead`): each batch planned while the one before it runs, as vLLM's
``AsyncScheduler`` does.

Hand-computed cases at 1 ms per iteration (the vLLM harness's timing, so the same cases are
checked against vLLM itself in ``tests/test_vllm_diff.py``), the fast engine against the
reference engine on random workloads under memory pressure with prefix caching, and the
layouts it is refused with.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.diffcheck.case import Case, DiffRequest, Sides
from schedlab.configs import FieldError
from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment
from schedlab.study.simulation import assemble
from schedlab.testing import check_run, compare_runs, dyadic_linear_costs, examples, requests_lists, run_engine
from schedlab.vllm_diff.case import DiffSettings, Outcome
from schedlab.vllm_diff.schedlab_side import SchedlabRunner, tables
from schedlab.model import Request
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PrefixKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.schedulers.presets import VllmConfig

ASYNC = Sides({"async_scheduling": True}, {})


def case(settings: dict, *requests: tuple) -> Case:
    """requests as (id, arrival, prompt, output[, priority[, max_tokens[, abort_at]]])."""
    return Case(DiffSettings(**settings), [DiffRequest(id=r[0], arrival=r[1], prompt_tokens=r[2], output_tokens=r[3],
                                                       priority=r[4] if len(r) > 4 else 0,
                                                       max_tokens=r[5] if len(r) > 5 else None,
                                                       abort_at=r[6] if len(r) > 6 else None) for r in requests])


#: (case, outcomes synchronously, outcomes asynchronously): request id -> (scheduled, first token,
#: finish, preemptions, cached tokens), at 1 ms per iteration.
CASES = {
    # Budget 2. Batch 1 [0, 1]: 0's prompt. Planned at 0 too, batch 2 [1, 2]: 0's second (last)
    # token. 1 arrives at 1: synchronously it joins the plan made at 1 (batch 2, beside 0's decode)
    # and has its one token at 2; asynchronously batch 2 was planned at 0, so 1 is in the plan made
    # at 1 (batch 2's start) for batch 3 [2, 3]: its token at 3.
    "an-arrival-waits-a-batch-more": (
        case(dict(block_size=2, num_blocks=2, max_num_seqs=2, max_num_batched_tokens=2),
             (0, 0, 1, 2), (1, 1, 1, 1)),
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(1, 2, 2, 0, 0)},
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(1, 3, 3, 0, 0)}),
    # Two slots. Batch 1 [0, 1]: the prompts of 0 and 1; 2 waits for a slot. Batch 2 [1, 2]: their
    # decodes, 0's last token. Synchronously 0's slot is free at 2 and 2 is admitted then (token at
    # 3). Asynchronously the plan made at 1 (batch 2's start, for batch 3 [2, 3]) still has 0 in its
    # slot -- its last token is in flight -- and schedules only 1's decode; 2 is admitted in the plan
    # made at 2 (batch 3's start) for batch 4 [3, 4]: its token at 4. 1 decodes in every batch.
    "a-finished-request-holds-its-slot-one-plan-longer": (
        case(dict(block_size=2, num_blocks=20, max_num_seqs=2, max_num_batched_tokens=4),
             (0, 0, 1, 2), (1, 0, 1, 6), (2, 0, 1, 1)),
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(0, 1, 6, 0, 0), 2: Outcome(2, 3, 3, 0, 0)},
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(0, 1, 6, 0, 0), 2: Outcome(2, 4, 4, 0, 0)}),
    # Nothing to plan ahead: the plan made at 1 (batch 2's start) is empty -- 0's last token is in
    # flight and 1 arrives at 2 --, so the next plan is made when batch 2 is back, at 2, and sees 1:
    # its token at 3, as synchronously.
    "an-empty-plan-ahead-plans-again-at-the-end": (
        case(dict(block_size=2, num_blocks=4, max_num_seqs=2, max_num_batched_tokens=2),
             (0, 0, 1, 2), (1, 2, 1, 1)),
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(2, 3, 3, 0, 0)},
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(2, 3, 3, 0, 0)}),
    # Priority, blocks of 2, 4 blocks, prefix caching (found by vllm_diff, seed 9068 shrunk, and
    # made small). 0 (priority 1) decodes; 1 (priority 0) is admitted at 1. Asynchronously the plan
    # made at 3 for batch 5 walks running = [0, 1]: 0's position 4 takes the last free block --
    # vLLM then caches 0's tokens known (4: its prompt and 3 landed tokens), blocks 0-1 and 2-3 --,
    # 1's position 2 finds none, and the victim max(priority, arrival) is 0, already scheduled:
    # it leaves with both blocks cached and finds 4 tokens when readmitted. (Preempted before its
    # own slot, as an all-at-once decode of the running requests had it, 0 left the block its
    # in-flight token completed uncached: 2 tokens.) The times are vLLM 0.33's.
    "a-priority-victim-scheduled-before-the-decode-that-does-not-fit": (
        case(dict(block_size=2, num_blocks=4, max_num_seqs=2, max_num_batched_tokens=8, prefix_caching=True,
                  policy="priority"),
             (0, 0, 1, 6, 1), (1, 1, 1, 4, 0)),
        {0: Outcome(0, 1, 7, 1, 4), 1: Outcome(1, 2, 5, 0, 0)},
        {0: Outcome(0, 1, 8, 1, 4), 1: Outcome(1, 3, 6, 0, 0)}),
    # Budget 4. 0 (prompt 1) stops at an EOS, its 2nd token, before its max_tokens of 5. Batch 1
    # [0, 1]: 0's prompt; batch 2 [1, 2], planned at 0: 0's decode, which brings the EOS. 1 (prompt
    # 4) arrives at 1: synchronously it joins 0's decode in the plan made at 1 with a chunk of 3 and
    # has its token at 3 (2 ms, its last token at 3). Asynchronously the plan made at 1 for batch 3
    # cannot know 0 stops: it decodes 0 once more (its token thrown away), leaving 3 tokens of the
    # budget for 1's prompt: a chunk of 3 in batch 3 [2, 3], the last one in batch 4 -- its token at
    # 4 (at 3 if 0 had stopped at its max_tokens).
    "a-request-at-an-eos-is-decoded-once-more": (
        case(dict(block_size=4, num_blocks=20, max_num_seqs=2, max_num_batched_tokens=4),
             (0, 0, 1, 2, 0, 5), (1, 1, 4, 1)),
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(1, 3, 3, 0, 0)},
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(1, 4, 4, 0, 0)}),
    # Blocks of 2, 3 blocks. Batch 1 [0, 1]: the prompts of 0 (1 token, 1 block) and 1 (3 tokens, 2
    # blocks); batch 2 [1, 2]: both decode, 0's 2nd token an EOS. Synchronously 0's block is free at
    # 2 and 1 decodes on (its 3rd token at 3). Asynchronously the plan made at 1 decodes 0 once
    # more: its 3rd slot needs a block, none is free, and the FCFS victim is 1 (the last admitted),
    # whose token in flight it keeps; batch 3 [2, 3] is 0's decode alone. At 2, 0's blocks are
    # freed and the plan for batch 4 [3, 4] recomputes 1's 5 tokens: its last token at 4.
    "a-decode-once-more-may-preempt-for-its-slot": (
        case(dict(block_size=2, num_blocks=3, max_num_seqs=2, max_num_batched_tokens=8),
             (0, 0, 1, 2, 0, 5), (1, 0, 3, 3)),
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(0, 1, 3, 0, 0)},
        {0: Outcome(0, 1, 2, 0, 0), 1: Outcome(0, 1, 4, 1, 0)}),
    # One slot. 0 (3 tokens) has its first at 1; its client's abort reaches the engine at 1.5,
    # while batch 2 [1, 2] computes its 2nd token, which is never sent: 0 leaves at 2 with one.
    # Synchronously 1 is admitted in the plan made at 2 (its token at 3). Asynchronously the plan
    # made at 1 for batch 3 [2, 3] came before the abort: it decodes 0 once more, for nothing, and
    # 1 is admitted in the plan made at 2 for batch 4 [3, 4]: its token at 4.
    "an-aborted-request-is-computed-once-more-by-the-plan-made-ahead": (
        case(dict(block_size=4, num_blocks=20, max_num_seqs=1, max_num_batched_tokens=2),
             (0, 0, 1, 3, 0, None, 1.5), (1, 0, 1, 1)),
        {0: Outcome(0, 1, None, 0, 0), 1: Outcome(2, 3, 3, 0, 0)},
        {0: Outcome(0, 1, None, 0, 0), 1: Outcome(2, 4, 4, 0, 0)}),
    # Budget 3, three slots. Batch 1 [0, 1]: the prompts of 0 and 1; batch 2 [1, 2]: their
    # decodes, 0's 2nd and last token -- dropped: 0's client gives up at 1.5. 2 (prompt 2) arrives
    # at 1. Asynchronously the plan made at 1 for batch 3 [2, 3] skips 0 as it skips any request
    # whose token in flight is its last, so 2's whole prompt fits beside 1's decode (its token at
    # 3; decoding 0 once more would have left it a chunk of 1); 0 then leaves at 2, aborted.
    # Synchronously 2 has a chunk in batch 2 and the rest in batch 3: its token at 3 too.
    "a-request-whose-dropped-token-was-its-last-is-skipped-ahead": (
        case(dict(block_size=4, num_blocks=20, max_num_seqs=3, max_num_batched_tokens=3),
             (0, 0, 1, 2, 0, None, 1.5), (1, 0, 1, 3), (2, 1, 2, 1)),
        {0: Outcome(0, 1, None, 0, 0), 1: Outcome(0, 1, 3, 0, 0), 2: Outcome(1, 3, 3, 0, 0)},
        {0: Outcome(0, 1, None, 0, 0), 1: Outcome(0, 1, 3, 0, 0), 2: Outcome(1, 3, 3, 0, 0)}),
}


@pytest.mark.parametrize("engine", ("fast", "reference"))
@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_computed_cases(engine, name):
    c, synchronous, asynchronous = CASES[name]
    assert SchedlabRunner(engine).run(c) == (synchronous, None)
    assert SchedlabRunner(engine).run(c, ASYNC) == (asynchronous, None)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_between_events_plans_made_ahead_run_in_bulk(asynchronous):
    # A (prompt 16, 100 tokens) alone: its prefill (8 ms at 0.5 ms a token, first token at 8),
    # then 99 decodes of 8 ms each, its last token at 8 + 99 x 8 = 800. Planned ahead the decodes
    # are planned as synchronously, so the fast engine runs them in one go either way: 2 events.
    # B (prompt 16, 2 tokens) arrives at 404, during the decode that starts at 400: the run is
    # cut there; synchronously B's prefill joins the plan at 408 (its token at 408 + 8 + 8 = 424),
    # planned ahead B waits for the plan after (made at 408, for the step from 416: 416 + 16 =
    # 432). Either way both engines agree, iteration for iteration, in fewer events.
    cfg = ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow",
                           async_scheduling=asynchronous)
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0))
    alone = run_engine([Request(0, 0.0, 16, 100)], ContinuousScheduler(cfg), cost)
    assert alone.requests["finish_ms"].tolist() == [800.0]
    assert alone.meta["events"] == 2 and alone.counters["iterations"] == 100
    both = [Request(0, 0.0, 16, 100), Request(1, 404.0, 16, 2)]
    fast, ref = (run_engine(both, ContinuousScheduler(cfg), cost, engine=engine) for engine in ("fast", "reference"))
    compare_runs(fast, ref, rel=1e-12)
    assert fast.requests["first_token_ms"].tolist() == [8.0, 432.0 if asynchronous else 424.0]
    assert fast.meta["events"] < fast.counters["iterations"] / 10


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_request_whose_client_gives_up_leaves_at_the_next_batch_boundary(engine, asynchronous):
    # As above, A decoding alone in 8 ms steps from 8 on; B arrives at 404 and its client gives
    # up 6 ms later, at 410. Synchronously B's prefill ran 408-424 beside A's decode (16 ms),
    # and the abort came while it ran: B is dropped at 424, that step's output -- its first
    # token -- never sent (vLLM's EngineCore.step). Planned ahead, B waited for the plan made at
    # 408, and the abort reached the engine at the boundary 416, after that plan was made: B is
    # dropped at 416 with nothing, but the plan still holds it, so its prefill runs 416-432 beside
    # A's decode for nothing -- A's 53rd token comes at 432, its 100th at 432 + 47 x 8 = 808,
    # either way.
    cfg = ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow",
                           async_scheduling=asynchronous)
    cost = LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0))
    requests = [Request(0, 0.0, 16, 100), Request(1, 404.0, 16, 2, timeout_ms=6.0)]
    r = run_engine(requests, ContinuousScheduler(cfg), cost, engine=engine)
    assert r.requests["aborted"].tolist() == [0, 1]
    assert r.requests["finish_ms"].tolist() == [808.0, 416.0 if asynchronous else 424.0]
    assert r.counters["prefill_tokens"] == 32  # (B's 16 computed for nothing)
    assert r.requests["generated_tokens"].tolist() == [100, 0]
    assert r.requests["first_token_ms"].tolist()[1] < 0  # (none)


SETTINGS = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(requests_lists(min_size=2, max_size=10, max_prompt=40, max_output=40, priorities=True, prefix_groups=2,
                      all_at_zero=False),
       st.integers(1, 4), st.integers(1, 6), st.integers(0, 10), st.booleans(), st.sampled_from(["fcfs", "priority"]),
       dyadic_linear_costs())
def test_fast_engine_matches_reference_under_memory_pressure(requests, max_seqs, block_size, spare, chunked, policy,
                                                             cost):
    """A prefix cache just big enough for the largest request: preemptions are common, of
    requests whose last token is in flight too, and of decodes whose block is not cached yet."""
    need = max(-(-(r.prompt_tokens + r.max_output_tokens) // block_size) for r in requests)
    cfg = ContinuousConfig(max_num_seqs=max_seqs, max_num_batched_tokens=64, allocation="grow",
                           chunked_prefill=chunked, policy=policy, async_scheduling=True)
    kvs = {}

    def run(engine):
        kvs[engine] = PrefixKVCache(need + spare, block_size)
        return run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(cost), kvs[engine], engine=engine)

    fast, ref = run("fast"), run("reference")
    compare_runs(fast, ref, rel=1e-12)
    assert kvs["fast"].lru_keys() == kvs["reference"].lru_keys()
    check_run(fast, requests, max_running=max_seqs, kv_blocks=need + spare)
    assert fast.metrics["rejected"] == 0
    # a request at an EOS is decoded once more at most once (none if preempted while its slot was held)
    assert fast.counters["discarded_tokens"] <= sum(r.stops_at_eos for r in requests)


@settings(max_examples=examples(60), deadline=None)
@given(requests_lists(min_size=1, max_size=8, max_prompt=30, max_output=20, all_at_zero=False), st.booleans())
def test_with_room_every_request_at_an_eos_is_decoded_once_more(requests, asynchronous):
    """With ample blocks and slots nothing is preempted: planning ahead, each request that stops
    at an EOS is decoded exactly once more (its token thrown away); synchronously none is."""
    cfg = ContinuousConfig(max_num_seqs=16, max_num_batched_tokens=512, allocation="grow", chunked_prefill=True,
                           async_scheduling=asynchronous)
    for engine in ("fast", "reference"):
        result = run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(), PrefixKVCache(400, 4),
                            engine=engine)
        assert result.counters["num_preemptions"] == 0
        expected = sum(r.stops_at_eos for r in requests) if asynchronous else 0
        assert result.counters["discarded_tokens"] == expected, engine
        assert result.counters["generated_tokens"] == sum(r.target_tokens for r in requests)


def test_settings_it_cannot_be_combined_with():
    with pytest.raises(ConfigError, match="async_scheduling needs preemption = 'recompute'"):
        ContinuousConfig(allocation="grow", preemption="swap", async_scheduling=True)
    with pytest.raises(ConfigError, match="async_scheduling cannot be combined with a batching window"):
        ContinuousConfig(max_wait_ms=5.0, async_scheduling=True)
    with pytest.raises(FieldError, match='async_scheduling: must be true, false or "auto", got \'yes\''):
        ContinuousConfig(async_scheduling="yes")


def test_the_vllm_preset_plans_ahead_where_it_is_modelled():
    """``"auto"``, the preset's default (vLLM's since 0.13), is on unless the scheduler swaps or
    holds a batching window; ``continuous`` stays synchronous unless asked."""
    assert ContinuousScheduler(VllmConfig()).plans_ahead
    assert not ContinuousScheduler(VllmConfig(preemption="swap")).plans_ahead
    assert not ContinuousScheduler(VllmConfig(max_wait_ms=5.0)).plans_ahead
    assert not ContinuousScheduler(VllmConfig(async_scheduling=False)).plans_ahead
    assert not ContinuousScheduler(ContinuousConfig()).plans_ahead
    assert ContinuousScheduler(ContinuousConfig(async_scheduling="auto")).plans_ahead
    # by default the preset runs "an-arrival-waits-a-batch-more" (above) planned ahead: 1's token at 3, not 2
    result = run_engine([Request(0, 0.0, 1, 2), Request(1, 1.0, 1, 1)],
                        ContinuousScheduler(VllmConfig(max_num_seqs=2, max_num_batched_tokens=2)),
                        LinearCostModel(LinearConfig(prefill_ms_per_token=0.0, decode_ms_per_step=0.0, base_ms=1.0)))
    assert result.requests["first_token_ms"].tolist() == [1.0, 3.0]


def test_the_harness_plans_ahead_as_its_vllm_side_does():
    c = CASES["an-arrival-waits-a-batch-more"][0]
    assert tables(c)["scheduler"]["async_scheduling"] is False  # vLLM's Scheduler, the harness's default
    assert tables(c, Sides({}, {"async_scheduling": True}))["scheduler"]["async_scheduling"] is True
    assert tables(c, ASYNC)["scheduler"]["async_scheduling"] is True


BASE = """
    [experiment]
    name = "x"
    [workload]
    kind = "synthetic"
    num_requests = 20
    rate = 20
    prompt = {dist = "fixed", value = 100}
    output = {dist = "fixed", value = 20}
    [scheduler]
    kind = "vllm"
    async_scheduling = true
    [cost_model]
    kind = "roofline"
    model = "qwen3-30b-a3b"
    gpu = "h100-80gb"
    [kv_cache]
    kind = "paged"
    model = "qwen3-30b-a3b"
    gpu = "h100-80gb"
"""


#: an EAGLE head (its cost: a linear model) proposing 2 drafts
EAGLE = "[speculative]\nmethod = 'eagle'\nnum_speculative_tokens = 2\ndraft = {kind = 'linear'}\n"


@pytest.mark.parametrize("extra, what", [
    ("[cluster]\nmode = 'disaggregated'\n", r"\[cluster\] disaggregated pools"),
])
def test_layouts_it_is_refused_with_by_name(tmp_path, extra, what):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + extra)
    with pytest.raises(ConfigError, match=r"\[scheduler\]: async_scheduling: not modelled with " + what):
        load(path)


def test_on_its_own_the_toml_runs_and_plans_each_batch_ahead(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE))
    assert load(path).studies[0].base.tables["scheduler"]["async_scheduling"] is True


def _schedulers(path) -> list:
    exp = load(path)
    return [parts[0] for parts in assemble(exp.studies[0].base, exp.context, "x").instances]


@pytest.mark.parametrize("setting", ["", 'async_scheduling = "auto"\n'])
@pytest.mark.parametrize("extra", [
    "",
    "[cluster]\npipeline_parallel = 2\n",
    "[cluster]\npipeline_parallel = 2\n" + EAGLE,
    "[cluster]\npipeline_parallel = 2\n" + EAGLE + "k_by_batch_size = [[1, 4, 2], [5, 256, 1]]\n",
    "[cluster]\nmode = 'disaggregated'\n",
    "[speculative]\nmethod = 'ngram'\n",
    EAGLE,
    "[cluster]\ndata_parallel = 2\nexpert_parallel = true\n",
    EAGLE + "[cluster]\ndata_parallel = 2\nexpert_parallel = true\n",
])
def test_auto_plans_ahead_unless_the_layout_is_not_modelled_with_it(tmp_path, setting, extra):
    """The preset's ``"auto"`` (left out or written) plans ahead on one instance, on data-parallel
    ranks and on a pipeline, with speculation too (vLLM 0.33's V2 model runner plans ahead with
    every drafter, drafts per batch size included), and schedules synchronously -- instead of
    refusing the run -- with disaggregated pools, where it is not modelled."""
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE).replace("async_scheduling = true\n", setting) + extra)
    schedulers = _schedulers(path)
    modelled = "disaggregated" not in extra
    assert schedulers and all(s.plans_ahead == modelled for s in schedulers)
    run = run_experiment(load(path)).all_runs()[0]
    assert run.metrics["finished"] == 20 and run.meta["plans_ahead"] == modelled


class _Seq:
    """What :class:`schedlab.engine.ahead.Marks` keeps on a sequence."""

    def __init__(self):
        self.dec_tick = self.lag_tick = self.cache_lag = 0
        self.decoding = False
        self.left_since_batch = False
        self.entered_since_batch = False


class _Plan:
    def __init__(self, decodes_all, decoded, prefills):
        self.decodes_all, self.decoded, self.prefills = decodes_all, decoded, [(s, 1) for s in prefills]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["enter", "leave", "batch", "prefill_batch", "plan_all", "plan_some",
                                           "bulk"]),
                          st.lists(st.integers(0, 5), max_size=4)), max_size=60))
def test_the_fast_engines_lazy_marks_agree_with_the_sets_they_replace(events):
    """``Marks`` (the fast engine) against what the reference engine keeps: the sequences the last
    batch gave a token -- its decoders, or, if it decoded nobody, only the prompts it completed
    (which started decoding since the batch before) --, and each scheduled
    sequence's lag written at every plan. Events follow the engine's order: a sequence that
    stopped decoding starts again only after a batch ended (a prefill's end, or a parked decoder
    put back after the batch), and a bulk run ends with its batch."""
    from schedlab.engine.ahead import Marks

    marks, seqs, fresh, lag, got = Marks(), [_Seq() for _ in range(6)], set(), {}, set()
    for kind, picks in events:
        chosen = [seqs[i] for i in dict.fromkeys(picks)]
        if kind == "enter":
            for s in chosen:
                if not s.decoding and not s.left_since_batch:
                    s.decoding = s.entered_since_batch = True
                    marks.entered(s)
        elif kind == "leave":
            for s in chosen:
                if s.decoding:
                    assert marks.lag(s, True) == lag.get(s, 0)
                    marks.left(s)
                    s.decoding, s.left_since_batch = False, True
        elif kind in ("batch", "bulk", "prefill_batch"):
            # the reference engine's ``fresh``: the batch's decoders and the prompts it completed --
            # after a batch that decoded nobody (prefill first), only those
            decoding = {s for s in seqs if s.decoding}
            fresh = got = decoding if kind != "prefill_batch" else {s for s in decoding if s.entered_since_batch}
            marks.batch_ended(kind != "prefill_batch")
            for s in seqs:
                s.left_since_batch = s.entered_since_batch = False
            if kind == "bulk":
                for s in fresh:
                    lag[s] = 1
                marks.bulk_ended()
        elif kind in ("plan_all", "plan_some"):
            decoders = [s for s in seqs if s.decoding] if kind == "plan_all" else [s for s in chosen if s.decoding]
            prefills = [s for s in chosen if not s.decoding]
            for s in decoders:
                lag[s] = 1 if s in fresh else 0
            for s in prefills:
                lag[s] = 0
            marks.planned(_Plan(kind == "plan_all", decoders, prefills))
        for s in seqs:  # what a preemption (and a plan made ahead for SGLang) would read now
            assert marks.got_token(s, s.decoding) == (s.decoding and s in got)
            if s.decoding:
                assert marks.is_fresh(s, True) == (s in fresh)
                assert marks.lag(s, True) == lag.get(s, 0)
            else:
                assert not marks.is_fresh(s, False)
                assert s.cache_lag == lag.get(s, 0)


def test_sglangs_overlap_scheduler_with_speculation_is_refused_or_turned_off(tmp_path):
    """SGLang's overlap scheduler drafts otherwise (not modelled): ``overlap_schedule = true`` with a
    ``[speculative]`` table is refused by name, and its ``"auto"`` schedules synchronously there."""
    sglang = textwrap.dedent(BASE).replace('kind = "vllm"\nasync_scheduling = true\n', 'kind = "sglang"\n')
    path = tmp_path / "exp.toml"
    path.write_text(sglang.replace('kind = "sglang"\n', 'kind = "sglang"\noverlap_schedule = true\n') + EAGLE)
    with pytest.raises(ConfigError, match=r"\[scheduler\]: overlap_schedule: not modelled with \[speculative\]"):
        load(path)
    path.write_text(sglang + EAGLE)
    assert not any(s.plans_ahead for s in _schedulers(path))
    path.write_text(sglang)
    assert all(s.plans_ahead for s in _schedulers(path))
