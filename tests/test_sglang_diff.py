"""The SGLang differential harness (schedlab.sglang_diff, tools/sglang_diff.py).

Most tests run everywhere: the workload generator, the cases' fairness checks, the schedlab side
on the minimal reproducers of every difference the harness found, each with SGLang 0.5.23's
outcome worked out by hand, and the command line's errors. The tests marked ``sglang`` step
SGLang's own scheduler and are skipped when it is not installed (README "Checked against
SGLang"). The parts shared with the vLLM harness (comparison, shrinking, tokens) are tested in
tests/test_vllm_diff.py.
"""

from __future__ import annotations

import importlib.util

import attrs
import pytest

from schedlab.diffcheck.case import Case, DiffRequest, Sides
from schedlab.diffcheck.compare import Comparison, Differ
from schedlab.errors import ConfigError
from schedlab.sglang_diff.case import ENGINE, Outcome, SglangSettings, case_from_json
from schedlab.sglang_diff.cli import main
from schedlab.sglang_diff.schedlab_side import SchedlabRunner
from schedlab.sglang_diff.workloads import GROUPS, generate

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


# -- workloads ----------------------------------------------------------------------------------
@pytest.mark.parametrize("group", GROUPS)
def test_cases_are_deterministic_fair_and_in_arrival_order(group):
    # (lpm 12000 was one request of 59 + 3 tokens in a pool of 64, which SGLang would refuse, before
    # pools were sized for SGLang's input limit: pool - 6)
    for seed in [*range(40), 12000]:
        case = generate(group, seed)
        assert case == generate(group, seed)
        assert case.problems() == []
        assert [r.id for r in case.in_arrival_order()] == list(range(len(case.requests)))


def test_each_group_turns_on_its_feature():
    def cases(group):
        return [generate(group, seed) for seed in range(60)]

    def need(r):
        return r.prompt_tokens + r.limit + 2

    def ample(case):
        return case.settings.max_total_tokens >= sum(need(r) for r in case.requests)

    def shares(case):
        return any(r.prefix_len for r in case.requests)

    for group, policies in (("lpm", {"lpm"}), ("dfs_weight", {"dfs-weight"}), ("fcfs", {"fcfs", "lof"})):
        got = cases(group)
        assert {c.settings.schedule_policy for c in got} == policies
        assert all(ample(c) and not c.settings.chunked_prefill_size for c in got)
        assert sum(shares(c) for c in got) >= 40
    for group in ("eviction", "retract"):
        got = cases(group)
        largest = [max(need(r) for r in c.requests) for c in got]
        assert all(max(l, 16) <= c.settings.max_total_tokens <= 2 * max(l, 16) for c, l in zip(got, largest))
        assert any(not ample(c) for c in got)
    assert sum(shares(c) for c in cases("eviction")) >= 40
    assert not any(shares(c) for c in cases("retract"))
    chunked = cases("chunked")
    assert any(c.settings.chunked_prefill_size for c in chunked) and any(not c.settings.chunked_prefill_size
                                                                         for c in chunked)
    assert all(c.settings.max_prefill_tokens <= 200 for c in chunked)
    reserve = cases("reserve")
    assert all(c.settings.schedule_policy == "fcfs" for c in reserve)
    limits = [r for c in reserve for r in c.requests]
    assert any(r.max_tokens is None for r in limits) and any(r.max_tokens and r.max_tokens > r.output_tokens
                                                             for r in limits)
    aborts = [r for c in cases("abort") for r in c.requests]
    assert 0.3 < sum(r.abort_at is not None for r in aborts) / len(aborts) < 0.5
    assert all(r.abort_at is None for g in GROUPS if not g.endswith("abort") and g != "running_timeout"
               for c in cases(g) for r in c.requests)
    ranked_aborts = cases("priority_abort")
    assert all(c.settings.enable_priority_scheduling for c in ranked_aborts)
    assert {c.settings.overlap_schedule for c in ranked_aborts} == {True, False}
    assert 0.3 < sum(r.abort_at is not None for c in ranked_aborts for r in c.requests) / sum(
        len(c.requests) for c in ranked_aborts) < 0.5
    assert not any(c.settings.overlap_schedule for c in cases("abort"))
    assert [attrs.evolve(c, settings=attrs.evolve(c.settings, overlap_schedule=False), group="abort")
            for c in cases("overlap_abort")] == cases("abort")
    every = cases("all")
    assert {c.settings.schedule_policy for c in every} == {"fcfs", "lpm", "dfs-weight", "lof"}
    ranked = cases("priority")
    assert all(c.settings.enable_priority_scheduling for c in ranked)
    assert not any(c.settings.enable_priority_scheduling for g in GROUPS
                   if not g.endswith("priority") and g not in ("priority_abort", "queue_limit", "waiting_timeout",
                                                               "running_timeout", "queue_limit_abort")
                   for c in cases(g))
    assert {len({r.priority for r in c.requests}) > 1 for c in ranked} == {True, False}
    assert {c.settings.schedule_low_priority_values_first for c in ranked} == {True, False}
    assert {c.settings.disable_priority_preemption for c in ranked} == {True, False}
    assert {c.settings.priority_scheduling_preemption_threshold for c in ranked} == {0, 1, 2, 10}
    assert [attrs.evolve(c, settings=attrs.evolve(c.settings, overlap_schedule=False), group="priority")
            for c in cases("overlap_priority")] == ranked
    assert {c.settings.schedule_policy for c in cases("hrrn")} == {"hrrn"}
    assert not any(c.settings.schedule_policy == "hrrn" for g in GROUPS if g != "hrrn" for c in cases(g))
    shortest = cases("spf")
    assert {c.settings.schedule_policy for c in shortest} == {"shortest-prefill-first"}
    assert {bool(c.settings.chunked_prefill_size) for c in shortest} == {True, False}
    assert {c.settings.overlap_schedule for c in shortest} == {True, False}
    assert not any(c.settings.schedule_policy == "shortest-prefill-first" for g in GROUPS if g != "spf"
                   for c in cases(g))
    assert {c.settings.overlap_schedule for c in cases("hrrn")} == {True, False}
    limited = cases("queue_limit")
    assert {c.settings.max_queued_requests for c in limited} == {1, 2, 3}
    assert not any(c.settings.max_queued_requests for g in GROUPS
                   if g not in ("queue_limit", "waiting_timeout", "running_timeout", "queue_limit_abort")
                   for c in cases(g))
    assert {c.settings.enable_priority_scheduling for c in limited} == {True, False}
    assert {c.settings.overlap_schedule for c in limited} == {True, False}
    limited_aborts = cases("queue_limit_abort")
    assert [attrs.evolve(c, requests=[attrs.evolve(r, abort_at=None) for r in c.requests], group="queue_limit")
            for c in limited_aborts] == limited
    assert 0.3 < sum(r.abort_at is not None for c in limited_aborts for r in c.requests) / sum(
        len(c.requests) for c in limited_aborts) < 0.5
    timed = cases("waiting_timeout")
    assert all(1 <= c.settings.waiting_timeout_ms <= 15 for c in timed)
    assert {bool(c.settings.max_queued_requests) for c in timed} == {True, False}
    assert not any(c.settings.waiting_timeout_ms for g in GROUPS if not g.endswith("_timeout") for c in cases(g))
    running = cases("running_timeout")
    assert all(1 <= c.settings.running_timeout_ms <= 40 for c in running)
    assert {bool(c.settings.waiting_timeout_ms) for c in running} == {True, False}
    assert {bool(c.settings.max_queued_requests) for c in running} == {True, False}
    assert {any(r.abort_at is not None for r in c.requests) for c in running} == {True, False}
    assert {c.settings.overlap_schedule for c in running} == {True, False}
    assert not any(c.settings.running_timeout_ms for g in GROUPS if g != "running_timeout" for c in cases(g))
    paged_groups = ("paged", "paged_retract", "paged_chunked", "no_radix", "overlap_paged")
    assert not any(c.settings.page_size != 1 or c.settings.disable_radix_cache or not c.settings.max_running_requests
                   for g in GROUPS if g not in paged_groups for c in cases(g))
    for group in paged_groups:
        got = cases(group)
        assert all(c.settings.max_total_tokens % c.settings.page_size == 0
                   and c.settings.chunked_prefill_size % c.settings.page_size == 0 for c in got)
        assert {c.settings.overlap_schedule for c in got} == {group == "overlap_paged"}
    assert {c.settings.page_size for c in cases("paged")} == {2, 4, 8, 16}
    assert {c.settings.page_size for c in cases("no_radix")} == {1, 2, 4, 8, 16}
    assert {c.settings.disable_radix_cache for c in cases("overlap_paged")} == {True, False}
    assert all(c.settings.disable_radix_cache == (g == "no_radix") for g in paged_groups[:4] for c in cases(g))
    assert sum(shares(c) for c in cases("paged")) >= 40
    assert {c.settings.max_running_requests == 0 for g in ("paged", "no_radix") for c in cases(g)} == {True, False}
    assert not any(c.settings.max_running_requests == 0 for g in ("paged_retract", "paged_chunked")
                   for c in cases(g))
    assert all(r.max_tokens == r.output_tokens or r.max_tokens and r.max_tokens > r.output_tokens
               for c in cases("paged_retract") for r in c.requests)
    assert {bool(c.settings.chunked_prefill_size) for c in cases("paged_chunked")} == {True, False}
    assert {c.settings.enable_mixed_chunk for c in cases("paged_chunked")} == {True, False}
    mixes = [r for c in cases("no_radix") for r in c.requests]  # (EOS-ignoring and EOS-stopping requests)
    assert 0.3 < sum(r.ignore_eos for r in mixes) / len(mixes) < 0.7
    assert any(r.max_tokens and r.max_tokens > r.output_tokens for r in mixes)
    with pytest.raises(ValueError, match="unknown feature group 'nope'"):
        generate("nope", 0)


def test_case_round_trips_through_json_and_names_unfair_requests():
    case = generate("all", 3)
    assert case_from_json(case.to_json()) == case
    s = SglangSettings(max_total_tokens=40)
    unfair = Case(s, [DiffRequest(id=0, arrival=0, prompt_tokens=30, output_tokens=9),
                      DiffRequest(id=1, arrival=0, prompt_tokens=34, output_tokens=1),
                      DiffRequest(id=2, arrival=0, prompt_tokens=33, output_tokens=1, max_tokens=5)])
    # 34 >= 40 - 6: SGLang refuses the prompt (as schedlab does, but only served requests are
    # compared); request 0's max_new_tokens is cut to 8 and request 2's to 5 on both sides: fair
    assert unfair.problems() == ["request 1: prompt of 34 reaches max_total_tokens - 6"]
    with pytest.raises(ValueError, match="max_tokens 3 < output_tokens 4"):
        DiffRequest(id=0, arrival=0, prompt_tokens=5, output_tokens=4, max_tokens=3)


def test_paged_settings_round_trip_and_stay_whole_pages():
    case = generate("no_radix", 5)
    assert case_from_json(case.to_json()) == case
    for group in ("paged", "paged_chunked", "no_radix", "overlap_paged"):
        case = next(generate(group, seed) for seed in range(100) if generate(group, seed).settings.page_size > 1)
        assert case_from_json(case.to_json()) == case
    # a replay line written before the page size and the radix cache's switch: page size 1, the tree on
    old = case_from_json('{"settings": {"max_total_tokens": 64, "max_running_requests": 2}, '
                         '"requests": [{"id": 0, "arrival": 0, "prompt_tokens": 5, "output_tokens": 3}]}')
    assert (old.settings.page_size, old.settings.disable_radix_cache) == (1, False)
    with pytest.raises(ValueError, match="not a whole number of pages of 4"):
        SglangSettings(max_total_tokens=66, page_size=4)
    with pytest.raises(ValueError, match="chunked_prefill_size 6 is not a whole number of pages of 4"):
        SglangSettings(max_total_tokens=64, chunked_prefill_size=6, page_size=4)
    # 16-token pages, 48 tokens: a prompt of 20 takes 32, and a page and a token more leave 48 - 49 < 1
    s = SglangSettings(max_total_tokens=48, page_size=16)
    assert Case(s, [DiffRequest(id=0, arrival=0, prompt_tokens=20, output_tokens=1)]).problems() == [
        "request 0: the pool leaves its answer no room after the prompt's pages"]
    assert Case(s, [DiffRequest(id=0, arrival=0, prompt_tokens=16, output_tokens=1)]).problems() == []
    # without the radix cache a request ignoring EOS must leave a token more: 64 - 16 - 16 - 1 = 31
    s = SglangSettings(max_total_tokens=64, page_size=16, disable_radix_cache=True)
    assert Case(s, [DiffRequest(id=0, arrival=0, prompt_tokens=10, output_tokens=31)]).problems() == [
        "request 0: ignores EOS and asks for all the pool holds (31 tokens), which SGLang never admits without "
        "its radix cache"]
    assert Case(s, [DiffRequest(id=0, arrival=0, prompt_tokens=10, output_tokens=30)]).problems() == []
    assert Case(s, [DiffRequest(id=0, arrival=0, prompt_tokens=10, output_tokens=31, max_tokens=31)]).problems() == []
    # the shrinker offers only settings that stay whole pages
    s = SglangSettings(max_total_tokens=208, chunked_prefill_size=48, page_size=16)
    changes = list(s.simpler())
    assert {"page_size": 8} in changes and {"page_size": 1} in changes and {"page_size": 2} in changes
    for change in changes:
        changed = attrs.evolve(s, **change)
        assert changed.max_total_tokens % changed.page_size == 0
        assert changed.chunked_prefill_size % changed.page_size == 0


def test_schedlab_side_builds_sglangs_cache_for_the_page_size_and_the_radix_switch():
    from schedlab.sglang_diff.schedlab_side import tables
    base = dict(max_total_tokens=96, max_running_requests=0, page_size=16)
    case = Case(SglangSettings(**base), [DiffRequest(id=0, arrival=0, prompt_tokens=5, output_tokens=3)])
    t = tables(case)
    assert t["kv_cache"] == {"kind": "radix", "num_blocks": 6, "block_size": 16}
    assert t["scheduler"]["max_running_requests"] == 0  # (SGLang's own from the pool, on both sides)
    scheduler, _, kv = SchedlabRunner().build(case)
    assert type(kv).__name__ == "RadixKVCache" and (kv.num_blocks, kv.block_size) == (6, 16)
    assert kv.prefix_caching and scheduler.config.max_running_requests == 0
    case = attrs.evolve(case, settings=SglangSettings(**base, disable_radix_cache=True))
    assert tables(case)["kv_cache"] == {"kind": "paged", "num_blocks": 6, "block_size": 16, "prefix_caching": False}
    scheduler, _, kv = SchedlabRunner().build(case)
    assert type(kv).__name__ == "PagedKVCache" and (kv.num_blocks, kv.block_size) == (6, 16)
    assert not kv.prefix_caching
    assert scheduler.config.ignore_eos == "no_max_tokens"  # (the harness's requests without max_tokens ignore EOS)
    outcomes, error = SchedlabRunner().run(case)
    assert error is None and outcomes[0] == _o(0, 1, 3, 0, 0, 5)


def test_schedlab_tables_name_the_sglang_preset_on_one_token_blocks():
    from schedlab.sglang_diff.schedlab_side import tables
    case = generate("chunked", 2)
    t = tables(case, Sides({"ignore_eos": "none"}))
    s = case.settings
    assert t["scheduler"] == {"kind": "sglang", "max_running_requests": s.max_running_requests,
                              "max_prefill_tokens": s.max_prefill_tokens,
                              "chunked_prefill_size": s.chunked_prefill_size,
                              "schedule_policy": s.schedule_policy,
                              "schedule_conservativeness": s.schedule_conservativeness,
                              "enable_mixed_chunk": s.enable_mixed_chunk, "context_length": 8192,  # SGLang's side
                              "overlap_schedule": False, "ignore_eos": "none",
                              "enable_priority_scheduling": False, "schedule_low_priority_values_first": False,
                              "priority_scheduling_preemption_threshold": 10, "disable_priority_preemption": False,
                              "retraction_policy": "length", "max_queued_requests": 0, "waiting_timeout_ms": 0.0,
                              "running_timeout_ms": 0.0}
    assert tables(generate("queue_limit", 0))["scheduler"]["max_queued_requests"] == \
        generate("queue_limit", 0).settings.max_queued_requests > 0
    case = generate("priority", 0)
    s = case.settings
    t = tables(case)["scheduler"]
    assert s.enable_priority_scheduling and t["enable_priority_scheduling"]
    assert [t[k] for k in ("schedule_low_priority_values_first", "priority_scheduling_preemption_threshold",
                           "disable_priority_preemption", "retraction_policy")] == [
        s.schedule_low_priority_values_first, s.priority_scheduling_preemption_threshold,
        s.disable_priority_preemption, s.retraction_policy]
    assert tables(case)["kv_cache"] == {"kind": "radix", "num_blocks": s.max_total_tokens, "block_size": 1}


# -- the differences found, as minimal reproducers with SGLang's outcome worked out by hand ------
def _case(settings: dict, *requests: tuple, priorities: dict | None = None) -> Case:
    """requests as (id, arrival, prompt, output, group, prefix_len, max_tokens[, abort_at]);
    ``priorities``: id -> priority (else 0)."""
    priorities = priorities or {}
    return Case(SglangSettings(**settings),
                [DiffRequest(id=r[0], arrival=r[1], prompt_tokens=r[2], output_tokens=r[3], group=r[4], prefix_len=r[5],
                             max_tokens=r[6], abort_at=r[7] if len(r) > 7 else None, priority=priorities.get(r[0], 0))
                 for r in requests])


def _o(scheduled, first, finish, retractions, cached, *chunks):
    return Outcome(scheduled, first, finish, retractions, cached, chunks)


# Outcomes per request: admission step, first token, finish (ms, 1 ms per step), retractions,
# cached tokens, prompt tokens of each prefill step. Pages are one token.
REPRODUCERS = {
    # 1. A pass's prefills join the tree after the forward. Both arrive at 0 and share 9 tokens: 6 needs
    # 13 + 4 + 1 page = 18 < 54; 7 needs 33 + 1 + 1 = 35 < 54 - (13 + 1 + 4) = 36, and 33 < 47 - 13 prompt
    # budget: both run at step 0, and 7 finds none of 6's tokens (computes all 33). 7's one token at 1; 6
    # decodes steps 1-3 and finishes at 4. (schedlab admitted 7 against 6's blocks: 9 cached, 24 computed.)
    "1-prefills-visible-after-the-pass": (
        _case(dict(max_total_tokens=54, max_running_requests=2, max_prefill_tokens=47),
              (6, 0, 13, 4, 0, 9, None), (7, 0, 33, 1, 0, 22, None)),
        {6: _o(0, 1, 4, 0, 0, 13), 7: _o(0, 1, 1, 0, 0, 33)}),
    # 2. With chunking on, max_prefill_tokens only ends a pass once spent. Chunks of 8, prompt budget 3:
    # 0 (42 tokens) runs 8-token chunks at 2-6, each spends the budget, so 1 (arrived at 3) waits. At 7
    # the last 2 tokens leave 1 of the budget and 6 of the chunk: 1 needs 10 + 8 + 1 < 87 - 40 - (2 + 1
    # + 3) and is cut at 6 tokens, its last 4 at 8 (prefill first: 0 waits). Both decode from 9: 0's 3
    # tokens at 8, 10, 11; 1's 8 tokens at 9 .. 16. (schedlab stopped at 10 > 1 prompt tokens left.)
    "2-prompt-budget-with-chunks": (
        _case(dict(max_total_tokens=87, max_running_requests=2, chunked_prefill_size=8, max_prefill_tokens=3),
              (0, 2, 42, 3, None, 0, None), (1, 3, 10, 8, None, 0, None)),
        {0: _o(2, 8, 11, 0, 0, 8, 8, 8, 8, 8, 2), 1: _o(7, 9, 16, 0, 0, 6, 4)}),
    # 3. Requests that ignore EOS count at ratio 1.0, and admission needs a page more. At 5, 0 holds 18 + 1
    # tokens of 141 and has 13 tokens to go: 122 - 13 x 1.0 = 109 <= 109 + 3 + 1 for request 1: refused,
    # the batch full until 0 finishes at 18. (At ratio 0.7 and without the page, 112 < 112.9: admitted.)
    "3-ignore-eos-at-ratio-one": (
        _case(dict(max_total_tokens=141, max_running_requests=2, max_prefill_tokens=1),
              (0, 3, 18, 15, None, 0, None), (1, 5, 109, 3, None, 0, None)),
        {0: _o(3, 4, 18, 0, 0, 18), 1: _o(18, 19, 21, 0, 0, 109)}),
    # 4. An admission reserves its whole max_new_tokens, and a batch formed while nothing ran becomes the
    # running batch, clearing its "full" mark. At 0, 0 (110 + 98 + 1 page) goes in and 1 needs 69 + 19 + 1
    # = 89 >= 267 - 209: full. At 1 the mark is gone: 0 stops at an EOS SGLang cannot foresee, so its 97
    # tokens to go count at 0.7: 157 - 67.9 = 89.1 > 89: 1 is admitted. 0 waits through that prefill:
    # its 24 tokens at 1, 3 .. 25; 1's 19 at 2 .. 20. (schedlab kept the mark and admitted 1 at 24.)
    "4-whole-reservation-and-fresh-running-batch": (
        _case(dict(max_total_tokens=267, max_running_requests=2, max_prefill_tokens=111),
              (0, 0, 110, 24, None, 0, 98), (1, 0, 69, 19, None, 0, None)),
        {0: _o(0, 1, 25, 0, 0, 110), 1: _o(1, 2, 20, 0, 0, 69)}),
    # 5. A pass's lookups split and touch the tree before its batch evicts. 1 (60 tokens, 58 of group 1)
    # runs alone: 2 (59 + 6 + 1 = 66) finds 102 - 77 = 25 left. At 16, 1 has put 60 + 15 tokens into the
    # tree (one node, then its answer). 2 is admitted (66 < 102), then 6 is looked at -- its 5 tokens
    # of group 1 split the node at 5 and become its most recent part -- and refused (76 + 19 + 1 > 102 -
    # 66). Only then does the batch evict 59 - 27 = 32 tokens: the answer (15), then the prompt's tail
    # (55): the 5 tokens survive, and at 22 (2 done) 6 finds them. (Evicting at admission, schedlab
    # took the whole 60-token node before the split.)
    "5-eviction-after-the-lookups": (
        _case(dict(max_total_tokens=102, max_running_requests=2, max_prefill_tokens=60),
              (1, 0, 60, 16, 1, 58, None), (2, 0, 59, 6, 0, 59, None), (6, 0, 81, 19, 1, 5, None)),
        {1: _o(0, 1, 16, 0, 0, 60), 2: _o(16, 17, 22, 0, 0, 59), 6: _o(22, 23, 41, 0, 5, 76)}),
    # 6. A cached block that a prefill computes again stays evictable through its pass (dfs-weight).
    # 0 (102 + 20 + 1 = 123 < 160) runs 1-21; 1 (57 + 24 + 1 >= 37 left) waits, the batch full. At 21
    # the tree holds 0's 121 tokens (39 free). The deepest match goes first: 2's 65 shared tokens (1's 43
    # end higher up). 2 hits 64 (the last token is always computed: a duplicate of the tree's), needs
    # 1 + 54 + 1 = 56 < 39 + 121 - 64 locked; then 1 hits 43 and needs 14 + 24 + 1 = 39 < 39 + 57 - 56 =
    # 40, its 14 tokens within the 15 of prompt budget left: both run at 21. (Locking the duplicated
    # block at once, schedlab had one token less and admitted 1 a step later.)
    "6-duplicate-evictable-in-its-pass": (
        _case(dict(max_total_tokens=160, max_running_requests=2, max_prefill_tokens=16, schedule_policy="dfs-weight"),
              (0, 1, 102, 20, 2, 96, None), (1, 1, 57, 11, 2, 43, 24), (2, 5, 65, 27, 2, 65, 54)),
        {0: _o(1, 2, 21, 0, 0, 102), 1: _o(21, 22, 32, 0, 43, 14), 2: _o(21, 22, 48, 0, 64, 1)}),
    # 7. A mixed batch (--enable-mixed-chunk) becomes the running batch, clearing its "full" mark. Chunks
    # of 6 less the decodes riding along, prompt budget 4 less them. 0 (109 tokens) runs 18 chunks of 6
    # and its last token at 18 beside 1's first 5; 0 decodes from 19 in every step, 1 runs chunks of 5 to
    # 29 and its last 2 at 30. There the adder reserves 1's 21 answer tokens: 2 needs 5 + 14 + 1 = 20 >= 20
    # left: no token, the batch full. At 31 the running batch is the mixed batch of 30, mark unset; with
    # 2 decodes the chunk is 4: 2 (20 < 21 left) is cut at 4, its last token at 32, its 14 tokens at 33 ..
    # 46; 0's 15 at 19 .. 33, 1's 21 at 31 .. 51. (schedlab kept the mark until 0 finished, at 33.)
    "7-mixed-batch-becomes-the-running-batch": (
        _case(dict(max_total_tokens=228, max_running_requests=3, chunked_prefill_size=6, max_prefill_tokens=4,
                   enable_mixed_chunk=True),
              (0, 0, 109, 15, None, 0, None), (1, 0, 62, 21, None, 0, None), (2, 0, 5, 14, None, 0, None)),
        {0: _o(0, 19, 33, 0, 0, *[6] * 18, 1), 1: _o(18, 31, 51, 0, 0, *[5] * 12, 2),
         2: _o(31, 33, 46, 0, 0, 4, 1)}),
    # 8. The context cuts max_new_tokens to context - 2 - prompt (max_req_len = context - 1, and one
    # token kept). Context 8,192: 0 (8,100 tokens, 92 asked) may make 90. Chunks of 8,192: 0 whole and
    # 92 of 1 at 0, 1's last 8 at 1 (prefill first), so 0's 90 tokens come at 1 and 3 .. 91; 1's 20 at
    # 2 .. 21. (schedlab made 92, to 93, before it modelled the context.)
    "8-context-cuts-max-new-tokens": (
        _case(dict(max_total_tokens=9000, max_running_requests=2, chunked_prefill_size=8192,
                   max_prefill_tokens=16384),
              (0, 0, 8100, 92, None, 0, None), (1, 0, 100, 20, None, 0, None)),
        {0: _o(0, 1, 91, 0, 0, 8100), 1: _o(0, 2, 21, 0, 0, 92, 8)}),
    # 9. The pool cuts max_new_tokens too: to what an empty pool of 60 holds after the prompt, a page and
    # a token (max_new_tokens_for_memory): 0 (20 tokens, 50 asked) makes 38, at 1 .. 38. Ignoring EOS, its
    # tokens to go count in full: at 3, 60 - 23 held - 35 to go = 2 < 10 + 5 + 1 for 1, which waits for
    # 0 to finish: admitted at 38, its 5 tokens at 39 .. 43. (schedlab rejected 0 before it modelled the cut.)
    "9-pool-cuts-max-new-tokens": (
        _case(dict(max_total_tokens=60, max_running_requests=2, max_prefill_tokens=64),
              (0, 0, 20, 50, None, 0, None), (1, 3, 10, 5, None, 0, None)),
        {0: _o(0, 1, 38, 0, 0, 20), 1: _o(38, 39, 43, 0, 0, 10)}),
    # Overlap scheduling (SGLang's default): the plan of a batch is made when the batch before it
    # starts, and a request's "scheduled" time is its plan's.
    # 10. An arrival waits a batch more. 0's prompt runs at [0, 1]; the plan of [1, 2], made at 0,
    # decodes 0 (its prompt's token still in flight). 1 arrives at 1: the plan made then, for [2, 3],
    # prefills it (0 waits): its one token at 3, not 2. 0's tokens at 1, 2 and 4.
    "10-overlap-arrival-waits-a-batch": (
        _case(dict(max_total_tokens=64, max_running_requests=2, overlap_schedule=True),
              (0, 0, 4, 3, None, 0, None), (1, 1, 4, 1, None, 0, None)),
        {0: _o(0, 1, 4, 0, 0, 4), 1: _o(1, 3, 3, 0, 0, 4)}),
    # 11. A request finishing in the batch in flight holds its KV, and the "full" mark it clears
    # comes a plan later. 40 tokens: 0 (10 + 2 + 1 page) and 1 (2 + 8 + 1) go in at 0; 2 needs 20 + 2
    # + 1 = 23 >= 40 - 24: full. The plan of [1, 2] (made at 0) decodes 0 and 1: 0's last token. The
    # plan of [2, 3] (made at 1) still has 0 in the running batch, its 11 tokens held: no prefill
    # (full), and the decode leaves 0 out -- and clears the mark. The plan of [3, 4] (made at 2, 0
    # freed): 2 needs 23 < 36 free - 6 to go for 1 (its third token in flight): admitted, its tokens
    # at 4 and 5 (synchronously: 3 and 4). 1 waits that prefill out: its 8th token at 9.
    "11-overlap-finishing-request-holds-its-kv": (
        _case(dict(max_total_tokens=40, max_running_requests=3, overlap_schedule=True),
              (0, 0, 10, 2, None, 0, None), (1, 0, 2, 8, None, 0, None), (2, 0, 20, 2, None, 0, None)),
        {0: _o(0, 1, 2, 0, 0, 10), 1: _o(0, 1, 9, 0, 0, 2), 2: _o(2, 4, 5, 0, 0, 20)}),
    # 12. A prompt in flight is not in the tree yet. Both share 8 tokens; one prompt per pass (prompt
    # budget 1). 0's prompt runs at [0, 1]; the plan of [1, 2], made at 0, admits 1, which finds
    # none of 0's tokens and computes all 8. (Synchronously 1 is admitted at 1 and hits 7.) 0 decodes
    # after 1's prefill: its 4 tokens at 1, 3, 4, 5.
    "12-overlap-prompt-in-flight-not-in-the-tree": (
        _case(dict(max_total_tokens=64, max_running_requests=2, max_prefill_tokens=1, overlap_schedule=True),
              (0, 0, 8, 4, 0, 8, None), (1, 0, 8, 1, 0, 8, None)),
        {0: _o(0, 1, 5, 0, 0, 8), 1: _o(0, 2, 2, 0, 0, 8)}),
    # 13. A retracted request's token in flight is thrown away (overlap skips its queued result).
    # 55 tokens, conservativeness 0.1 (new-token ratio 0.07); both stop at their max_tokens. 0's
    # prompt runs at [0, 1] and the plan of [1, 2], made at 0, decodes it. 1 arrives at 1: 8 + 13 + 1
    # page < 31 free - 17 x 0.07 (0's tokens to go, its second in flight): admitted for [2, 3]. From
    # [3, 4] both decode, 2 slots a step: the plan made at 12 leaves 1 slot free, and the one made at
    # 13 (for [14, 15]) needs 2. In SGLang's view 0 has 12 tokens and 1 has 11 (their next ones in
    # flight): 1 goes, and its 12th token, computed by [13, 14], with it. 0 finishes alone at 19
    # (the plan made at 18 has no room for 1: 19 + 2 + 1 >= 14 free); 1 prefills its prompt and 11
    # tokens (19) at [19, 20], giving its 12th token again, and is done at 21. (Keeping the token,
    # it would prefill 20 and be done at 20.)
    "13-overlap-retraction-drops-the-token-in-flight": (
        _case(dict(max_total_tokens=55, max_running_requests=2, schedule_conservativeness=0.1, overlap_schedule=True),
              (0, 0, 23, 18, None, 0, 18), (1, 1, 8, 13, None, 0, 13)),
        {0: _o(0, 1, 19, 0, 0, 23), 1: _o(1, 3, 21, 1, 0, 8, 19)}),
    # 14. At an EOS SGLang cannot foresee, the finished request is decoded once more. One request
    # slot. 0 stops at an EOS after 1 token (max_tokens 2): the plan of [1, 2], made at 0, decodes it
    # again (the token thrown away), so its slot is free only for the plan made at 1: 1 runs at
    # [2, 3] and 2 -- whose plan is made at 2, while 1 (finishing by length) is in flight -- at [3, 4].
    # (Without the extra decode: 1 at [1, 2], 2 at [2, 3].)
    "14-overlap-eos-decodes-once-more": (
        _case(dict(max_total_tokens=16, max_running_requests=1, max_prefill_tokens=1, overlap_schedule=True),
              (0, 0, 1, 1, None, 0, 2), (1, 0, 1, 1, None, 0, None), (2, 0, 1, 1, None, 0, None)),
        {0: _o(0, 1, 1, 0, 0, 1), 1: _o(1, 3, 3, 0, 0, 1), 2: _o(3, 4, 4, 0, 0, 1)}),
    # 15. A running request whose client gives up runs once more (Scheduler.abort_request sets its
    # ``to_finish``). One slot. 0's prompt runs at [0, 1]: its first token at 1, the result
    # processed before the loop reads the abort (sent at 0.5). The decode at [1, 2] computes 0
    # once more, its token dropped, and 0 leaves at 2 (aborted: no finish); 1 runs at [2, 3].
    # (vLLM's engine core drops the prompt step's token instead: 0 gets none, 1 its at 2.)
    "15-an-aborted-running-request-runs-once-more": (
        _case(dict(max_total_tokens=16, max_running_requests=1, max_prefill_tokens=1),
              (0, 0, 1, 2, None, 0, None, 0.5), (1, 0, 1, 1, None, 0, None)),
        {0: _o(0, 1, None, 0, 0, 1), 1: _o(2, 3, 3, 0, 0, 1)}),
    # 16. Aborting a queued request leaves the running batch as it was. A pool of 64: 0 (10 + 10)
    # runs from 0, its last token at 10. 1 (40 + 20 tokens, arrived at 1) does not fit beside it:
    # the failed admission marks the running batch full (``batch_is_full``), which only a change
    # of the running batch clears. 1's client gives up at 2.5: SGLang pops it from the queue at 3,
    # but 2 (arrived at 3) is admitted only when 0 finishes, at 10. (Counting the abort as a
    # finish admitted 2 at 3.)
    "16-an-abort-of-a-queued-request-does-not-clear-a-full-batch": (
        _case(dict(max_total_tokens=64, max_running_requests=2),
              (0, 0, 10, 10, None, 0, None), (1, 1, 40, 20, None, 0, None, 2.5), (2, 3, 1, 1, None, 0, None)),
        {0: _o(0, 1, 10, 0, 0, 10), 1: _o(None, None, None, 0, 0), 2: _o(10, 11, 11, 0, 0, 1)}),
    # 17. Overlap scheduling reads an abort when the batch in flight has just started. One slot. 0's
    # prompt runs at [0, 1]; the plan made at 0 for [1, 2] decodes it. At 1 (its first token
    # processed) the loop reads the abort sent at 0.5 and plans [2, 3] -- 0 still running, so
    # decoded again -- before it processes [1, 2], whose result ends 0 (its token dropped). 1 is
    # admitted in the plan made at 2, for [3, 4]: its token at 4. [2, 3] computed 0 for nothing.
    "17-overlap-an-abort-is-read-when-the-batch-in-flight-starts": (
        _case(dict(max_total_tokens=16, max_running_requests=1, max_prefill_tokens=1, overlap_schedule=True),
              (0, 0, 1, 5, None, 0, None, 0.5), (1, 0, 1, 1, None, 0, None)),
        {0: _o(0, 1, None, 0, 0, 1), 1: _o(2, 4, 4, 0, 0, 1)}),
    # 18. An aborted chunked prefill's chunk never reaches the tree. Chunks of one token: 1's first
    # (its prompt's first token, shared with 4) runs at [2, 3]; the abort sent at 2.5 is read at 3,
    # and the plan then drops the chunked request (``process_pending_chunked_abort``) before it
    # would put the chunk in the tree (``stash_chunked_request``): ``release_kv_cache`` without a
    # checkpoint. 4 (arriving at 10) finds nothing: five chunks, its token at 15 (at 14 with the
    # chunk cached).
    "18-an-aborted-chunk-is-not-cached": (
        _case(dict(max_total_tokens=43, max_running_requests=1, chunked_prefill_size=1, max_prefill_tokens=1),
              (1, 2, 2, 1, 0, 1, None, 2.5), (4, 10, 5, 1, 0, 5, None)),
        {1: _o(2, None, None, 0, 0, 1), 4: _o(10, 15, 15, 0, 0, 1, 1, 1, 1, 1)}),
    # 19. A prefix computed twice in one pass, once by a chunk, is in the tree from the next plan.
    # Chunks of 3 tokens; all share the group's first token. The pass at [0, 1] computes 0's prompt
    # (2 tokens) and 1's first chunk (1 token: the shared one): 0's copy joins the tree when its
    # result is processed, 1's chunk when the next plan stashes it (``stash_chunked_request``). That
    # plan, made at 0 for [1, 2], computes 1's last token and admits 2, which finds the shared token
    # there (1 cached) and computes its other 2: its tokens at 2 and 3. (schedlab saw only 0's copy,
    # in flight: 2 computed all 3 tokens, in two chunks.)
    "19-overlap-a-chunks-copy-of-a-shared-prefix-is-cached-first": (
        _case(dict(max_total_tokens=64, max_running_requests=3, chunked_prefill_size=3, max_prefill_tokens=64,
                   overlap_schedule=True),
              (0, 0, 2, 1, 0, 2, None), (1, 0, 2, 1, 0, 2, None), (2, 0, 3, 2, 0, 1, None)),
        {0: _o(0, 1, 1, 0, 0, 2), 1: _o(0, 2, 2, 0, 0, 1, 1), 2: _o(0, 2, 3, 0, 1, 2)}),
    # 20. ``dfs-weight`` breaks a tie between siblings in the order SGLang put them in its tree. Two
    # slots, chunks of 2 tokens. The pass at [0, 1] computes 0's prompt (group 0's first token) and
    # 1's first chunk (group 1's first token). The plan made at 0 stashes 1's chunk in the tree and
    # computes 1's last 2 tokens; only then does 0's result put 0's token in the tree. The plan
    # made at 1 has one slot beside 1: 2 (group 1) and 3 (group 0) each weigh 1 on a child of the
    # root, and the child inserted first, 1's, goes first: 2 runs at [2, 3], 3 at [3, 4], each
    # with its first token cached. (schedlab ordered the children as it allocated them, 0's first:
    # 3 ran before 2.)
    "20-dfs-weight-ties-go-to-the-sibling-inserted-first": (
        _case(dict(max_total_tokens=64, max_running_requests=2, chunked_prefill_size=2, max_prefill_tokens=2,
                   schedule_policy="dfs-weight", overlap_schedule=True),
              (0, 0, 1, 1, 0, 1, None), (1, 0, 3, 1, 1, 3, None), (2, 0, 2, 1, 1, 2, None), (3, 0, 2, 1, 0, 2, None)),
        {0: _o(0, 1, 1, 0, 0, 1), 1: _o(0, 2, 2, 0, 0, 1, 2), 2: _o(1, 3, 3, 0, 1, 1), 3: _o(2, 4, 4, 0, 1, 1)}),
    # 21. A chunk's copy of a block already in the tree is freed when the next plan stashes the
    # chunk. A pool of 16, chunks of 2 tokens, all of 0's and 2's prompts shared. 0 runs [0, 1] and
    # [1, 2] (its last token). The plan made at 1 admits 2 beside it: 0's last token is not in the
    # tree yet, so 2 finds 2 cached tokens and computes the next 2 -- one of them 0's last -- in a
    # chunk. 0's result then puts that token in the tree, and the plan made at 2 stashes 2's chunk:
    # its copy is freed, 12 tokens free. 2's last chunk takes 1 + 1 page + 1 to generate: 9 left,
    # and 1 (1 + 6 + 1 page = 8 < 9) is admitted beside it, its token at 4. (schedlab freed the
    # copy a pass later: 8 < 8 failed and 1 waited a step.)
    "21-overlap-a-chunks-copy-of-a-cached-block-is-freed-at-its-stash": (
        _case(dict(max_total_tokens=16, max_running_requests=4, chunked_prefill_size=2, max_prefill_tokens=64,
                   schedule_policy="fcfs", overlap_schedule=True),
              (0, 0, 3, 1, 0, 3, None), (2, 1, 5, 1, 0, 5, None), (1, 2, 1, 6, None, 0, None)),
        {0: _o(0, 2, 2, 0, 0, 2, 1), 2: _o(1, 4, 4, 0, 2, 2, 1), 1: _o(2, 4, 9, 0, 0, 1)}),
    # 22. Priority scheduling: a more important arrival preempts. One slot, higher values first,
    # threshold 0. 0 (4 + 10 tokens, priority 0) has its tokens at 1 and 2 when 1 (priority 3)
    # arrives: no slot, 3 - 0 > 0, and 0's 8 tokens to come cover 1's admission, so 0 is
    # preempted and 1 runs: tokens at 3-5. 0 comes back at 5 with its prompt cached (4), computes
    # its 2 tokens again, and generates the other 8 at 6-13.
    "22-priority-a-more-important-arrival-preempts": (
        _case(dict(max_total_tokens=64, max_running_requests=1, enable_priority_scheduling=True,
                   priority_scheduling_preemption_threshold=0),
              (0, 0, 4, 10, None, 0, None), (1, 2, 3, 3, None, 0, None), priorities={1: 3}),
        {0: _o(0, 1, 13, 1, 4, 4, 2), 1: _o(2, 3, 5, 0, 0, 3)}),
    # 23. Priority scheduling sorts the queue: lower values first here, preemption off. One slot,
    # three requests at 0 with priorities 1, 3, 2: 0 at [0, 2], 2 at [2, 4], 1 at [4, 6].
    "23-priority-orders-the-queue": (
        _case(dict(max_total_tokens=64, max_running_requests=1, enable_priority_scheduling=True,
                   schedule_low_priority_values_first=True, disable_priority_preemption=True),
              (0, 0, 2, 2, None, 0, None), (1, 0, 2, 2, None, 0, None), (2, 0, 2, 2, None, 0, None),
              priorities={0: 1, 1: 3, 2: 2}),
        {0: _o(0, 1, 2, 0, 0, 2), 1: _o(4, 5, 6, 0, 0, 2), 2: _o(2, 3, 4, 0, 0, 2)}),
    # 24. A preemption can be for nothing. Two slots, a pool of 50, threshold 0. 1 (1 + 10, priority
    # 0) and 0 (1 + 30, priority 3) run from 0. 2 (15 + 10, priority 3) arrives at 2: no slot.
    # ``preempt_to_schedule`` counts 2's prompt as SGLang last saw it -- never, so 0 tokens -- and
    # its 10 answer tokens against the 8 the budget has left: 2 short, which 1's 8 tokens to come
    # cover. 1 is preempted, but 2 then needs 15 + 10 + 1 page = 26 of the 19 left: it does not
    # fit, and waits at the head of the queue, 1 behind it, until 0 finishes at 30. Both run
    # from 30: 2's tokens at 31-40, 1's two tokens again (its prompt cached) and eight more at 31-38.
    "24-priority-a-preemption-for-an-arrival-that-does-not-fit": (
        _case(dict(max_total_tokens=50, max_running_requests=2, enable_priority_scheduling=True,
                   priority_scheduling_preemption_threshold=0),
              (1, 0, 1, 10, None, 0, None), (0, 0, 1, 30, None, 0, None), (2, 2, 15, 10, None, 0, None),
              priorities={0: 3, 2: 3}),
        {0: _o(0, 1, 30, 0, 0, 1), 1: _o(0, 1, 38, 1, 1, 1, 2), 2: _o(30, 31, 40, 0, 0, 15)}),
    # 25. ``hrrn`` ages requests by the tokens of every batch launched, and a decode batch counts
    # what its batch object last counted as a prefill. One slot. 0's prompt (1 token) runs at
    # [0, 1]: the counter is 1. 1 (2 tokens) and 2 (1 token) arrive at 1 and enter the queue at 1.
    # 0's decode at [1, 2] runs the batch formed as that 1-token prefill: the counter is 2. At 2, 1
    # has waited 1 token for its 2 (0.5), 2 one for its 1 (1.0): 2 runs at [2, 3], 1 at [3, 4].
    # (Counting prompt tokens only, both had waited 0 and the tie went to 1.)
    "25-hrrn-ages-by-every-batch-launched": (
        _case(dict(max_total_tokens=16, max_running_requests=1, max_prefill_tokens=1, schedule_policy="hrrn"),
              (0, 0, 1, 2, None, 0, None), (1, 1, 2, 1, None, 0, None), (2, 1, 1, 1, None, 0, None)),
        {0: _o(0, 1, 2, 0, 0, 1), 1: _o(3, 4, 4, 0, 0, 2), 2: _o(2, 3, 3, 0, 0, 1)}),
    # 26. Overlap scheduling: the tree's copy of a block a prompt in flight computes again stays
    # evictable until that prompt's result is processed. A pool of 115, two slots, a prompt budget
    # of 1, answers ignoring EOS. 0 (65 + 10) runs from 0; 2 (the same 65-token prompt, 28 tokens)
    # needs 65 + 28 + 1 page = 94 against 115 - 76 and waits. 0 finishes at 10, its 74 tokens in the
    # tree. The plan at 10 admits 2: 64 cached, its 65th token computed again (the budget of 1 is
    # spent: 3, arrived at 10, waits). The plan made while that prompt runs: 64 tokens locked by 2,
    # 10 evictable -- the 65th among them: SGLang locks it when 2's result is processed --, 40 free;
    # 40 + 10 - 28 (2's answer) = 22, and 3 (1 + 19 + 1 page = 21) is admitted: its token at 12.
    # (schedlab had locked the 65th already: 21 < 21 failed, and 3 waited for 2 to finish.)
    "26-overlap-a-recomputed-block-stays-evictable-while-its-prompt-is-in-flight": (
        _case(dict(max_total_tokens=115, max_running_requests=2, max_prefill_tokens=1, overlap_schedule=True),
              (0, 0, 65, 10, 0, 65, None), (2, 0, 65, 28, 0, 65, None), (3, 10, 1, 19, 0, 1, None)),
        {0: _o(0, 1, 10, 0, 0, 65), 2: _o(10, 11, 39, 0, 64, 1), 3: _o(10, 12, 30, 0, 0, 1)}),
    # 27. --max-queued-requests 1, one slot, higher priorities first, no preemption. At 0 SGLang
    # reads 0 (priority 0) and 1 (0) before it schedules: 0 is queued, 1 finds the queue full and is
    # not more important than 0: turned away. 0 runs [0, 2]. At 1 it reads 2 (5), queued, then 3 (9):
    # more important than 2, which is turned away instead. 3 runs [2, 4].
    "27-queue-limit-turns-away-arrivals-or-the-least-important-queued": (
        _case(dict(max_total_tokens=64, max_running_requests=1, enable_priority_scheduling=True,
                   disable_priority_preemption=True, max_queued_requests=1),
              (0, 0, 2, 2, None, 0, None), (1, 0, 2, 2, None, 0, None), (2, 1, 2, 2, None, 0, None),
              (3, 1, 2, 2, None, 0, None), priorities={2: 5, 3: 9}),
        {0: _o(0, 1, 2, 0, 0, 2), 1: _o(None, None, None, 0, 0), 2: _o(None, None, None, 0, 0),
         3: _o(2, 3, 4, 0, 0, 2)}),
    # 28. A retracted request re-enters the queue and meets the limit too. 30 tokens, conservativeness
    # 0 (running requests' future tokens count 0), --max-queued-requests 1. 0 (5 + 12) runs from 0; 1
    # (5 + 12) arrives at 1 and prefills [1, 2] (0 waits); 2 (5 + 20) arrives at 2 and needs 26 >= 20
    # free: the batch is full. 0 and 1 decode from 2, two tokens a step: at 12 the pool is spent, each
    # has 11 tokens, and the tie goes to the later: 1 is retracted and finds 2 queued -- turned away,
    # with its 11 tokens. 0's last at 13; 2 runs from 13, its 20th token at 33.
    "28-queue-limit-turns-away-a-retracted-request": (
        _case(dict(max_total_tokens=30, max_running_requests=2, schedule_conservativeness=0.0, max_queued_requests=1),
              (0, 0, 5, 12, None, 0, 12), (1, 1, 5, 12, None, 0, 12), (2, 2, 5, 20, None, 0, 20)),
        {0: _o(0, 1, 13, 0, 0, 5), 1: _o(1, 2, None, 1, 0, 5), 2: _o(13, 14, 33, 0, 0, 5)}),
    # 29. SGLANG_REQ_WAITING_TIMEOUT of 2 ms, one slot. 0 (1 + 4 tokens) runs [0, 4]. 1, read at 0
    # with it, waits: the poll at the top of the loop at 2 finds it queued 2 ms -- aborted. 2 arrives
    # at 3, is queued then, and runs when 0 is done, at 4 (1 ms queued).
    "29-waiting-timeout-aborts-a-request-queued-too-long": (
        _case(dict(max_total_tokens=64, max_running_requests=1, waiting_timeout_ms=2),
              (0, 0, 1, 4, None, 0, None), (1, 0, 1, 1, None, 0, None), (2, 3, 1, 1, None, 0, None)),
        {0: _o(0, 1, 4, 0, 0, 1), 1: _o(None, None, None, 0, 0), 2: _o(4, 5, 5, 0, 0, 1)}),
    # 30. Overlap scheduling: priority preemption of a request whose last token is in flight. Two
    # slots, one prompt per pass, higher priorities first, threshold 0. 3 (1 + 3 tokens) runs from
    # 2 (tokens at 3, 4, 6); 4 (1 + 2) is admitted by the plan made at 3, its prompt at [4, 5]; the
    # plan made at 4 decodes both at [5, 6], which gives each its last token. 7 (priority 2)
    # arrives at 5: the plan made then finds both slots taken -- SGLang does not know yet that the
    # batch in flight ends them -- and preempts the latest queued, 4: that batch's result is
    # skipped for it, so 4 comes back with 1 token (its prompt cached), and computes its 2nd again
    # at [7, 8]. 7 runs at [6, 7]. (schedlab kept 4's finish at 6.)
    "30-overlap-priority-preemption-of-a-request-finishing-in-flight": (
        _case(dict(max_total_tokens=26, max_running_requests=2, max_prefill_tokens=1, overlap_schedule=True,
                   enable_priority_scheduling=True, priority_scheduling_preemption_threshold=0),
              (3, 2, 1, 3, None, 0, None), (4, 3, 1, 2, None, 0, None), (7, 5, 1, 1, None, 0, None),
              priorities={7: 2}),
        {3: _o(2, 3, 6, 0, 0, 1), 4: _o(3, 5, 8, 1, 1, 1, 1), 7: _o(5, 7, 7, 0, 0, 1)}),
    # 31. Overlap scheduling: a retraction may take a request finished at an EOS SGLang has not
    # seen yet. 16 tokens, one prompt per pass, conservativeness 0 (no room kept for answers);
    # both stop at an EOS at their 8th token (max_tokens 9). 0's prompt runs at [0, 1], 1's at
    # [1, 2]; both decode from [2, 3], two slots a step, and [8, 9] gives both their 8th token,
    # the EOS. The plan made at 8 finds no room for the next decode: 7 tokens each in SGLang's
    # view, the tie goes to the later, 1, retracted -- its EOS dropped with the batch's result.
    # 0 finishes at 9; 1 prefills its prompt and 7 tokens at [10, 11] and gets its EOS again at
    # 11. (schedlab never retracted a request at an unseen EOS: 1 finished at 9.)
    "31-overlap-retraction-of-a-request-at-an-eos-not-seen-yet": (
        _case(dict(max_total_tokens=16, max_running_requests=2, max_prefill_tokens=1, schedule_conservativeness=0.0,
                   overlap_schedule=True),
              (0, 0, 1, 8, None, 0, 9), (1, 0, 1, 8, None, 0, 9)),
        {0: _o(0, 1, 9, 0, 0, 1), 1: _o(0, 2, 11, 1, 0, 1, 8)}),
    # 32. Overlap scheduling: a request decoded once more after an EOS SGLang could not foresee
    # goes into the tree with the KV that decode writes for its EOS position. 2 (40 + 57, EOS at
    # 57) finishes at 67 and leaves 97 tokens in the tree, not 96: with 4 (40 + 56) and 3 (1 + 45)
    # then decoding in a pool of 143, the evictions that follow take that one token more -- and so
    # the 2-token node of 1's prompt (preempted at 12, by 4, with its last token in flight), which
    # it prefills again at 114 (cached 0). (schedlab kept 96 tokens, then 1's prompt: cached 2.)
    # Found on fresh seed 49182 (shrunk); the outcomes are SGLang's.
    "32-overlap-an-overshoot-leaves-its-eos-position-in-the-tree": (
        _case(dict(max_total_tokens=143, max_running_requests=2, max_prefill_tokens=1, schedule_conservativeness=0.3,
                   overlap_schedule=True, enable_priority_scheduling=True, schedule_low_priority_values_first=True,
                   priority_scheduling_preemption_threshold=0),
              (0, 0, 1, 1, None, 0, None), (1, 7, 2, 5, None, 0, None), (2, 9, 40, 57, None, 0, 58),
              (3, 10, 1, 45, None, 0, 45), (4, 12, 40, 56, None, 0, 64), priorities={1: 2, 3: 2, 4: 1}),
        {0: _o(0, 1, 1, 0, 0, 1), 1: _o(7, 8, 116, 1, 0, 2, 6), 2: _o(9, 11, 67, 0, 0, 40),
         3: _o(68, 70, 114, 0, 0, 1), 4: _o(67, 69, 126, 0, 0, 40)}),
    # 33. SGLANG_REQ_RUNNING_TIMEOUT of 3 ms, one slot. 0 (1 + 6 tokens) is first scheduled at 0:
    # prompt [0, 1], decodes [1, 2], [2, 3]; the poll at the top of the loop at 3 finds it in the
    # batch 3 ms after it entered: aborted as a client's abort is -- it runs once more, [3, 4], that
    # token dropped, and never finishes. 1 (arrived at 1) gets the slot at 4.
    "33-running-timeout-aborts-a-request-at-the-poll-after-its-time": (
        _case(dict(max_total_tokens=64, max_running_requests=1, running_timeout_ms=3),
              (0, 0, 1, 6, None, 0, None), (1, 1, 1, 1, None, 0, None)),
        {0: _o(0, 1, None, 0, 0, 1), 1: _o(4, 5, 5, 0, 0, 1)}),
    # 34. A running timeout of 13 ms and a retraction (28's pool and timeline): 1 (5 + 13 tokens,
    # first scheduled at 1) is retracted at 12 with 11 tokens; 0 finishes at 13, its time not
    # up at the poll. 2 is admitted at 13 (1 needs 16 + 1 more than is left) and aborted at the
    # poll at 26 (13 ms after it entered), once more [26, 27]. 1's time came at 14 while it waited:
    # SGLang polls only the batches in flight, so it stays -- readmitted at 27, it recomputes its
    # 16 tokens [27, 28], and the poll at 28 aborts it (once more [28, 29]).
    "34-running-timeout-of-a-retracted-request-comes-after-its-readmission": (
        _case(dict(max_total_tokens=30, max_running_requests=2, schedule_conservativeness=0.0, running_timeout_ms=13),
              (0, 0, 5, 12, None, 0, 12), (1, 1, 5, 13, None, 0, 13), (2, 2, 5, 20, None, 0, 20)),
        {0: _o(0, 1, 13, 0, 0, 5), 1: _o(1, 2, None, 1, 0, 5, 16), 2: _o(13, 14, None, 0, 0, 5)}),
    # 35. hrrn under overlap scheduling: the running batch a prefill batch joins. 0 (7 tokens) forms
    # the running batch at 9 (its count: 7); 2 joins it. The plan made at 34 admits 5 (43 tokens)
    # while the batch in flight gives 0 its last token: at the next pass 0 is still in the running
    # batch when 5's batch is merged into it (filtered out after), so the running batch -- and the
    # count every decode step adds to the aging counter -- stays 0's: 7 a step, not 43. At 58 the
    # counter is 373: 3 (112 tokens, queued at 99) has waited (373 - 99) / 112 = 2.4464, 6 (92,
    # queued at 148) (373 - 148) / 92 = 2.4457 -- 3 goes first. Found on fresh seed 50038
    # (shrunk); the outcomes are SGLang's. (schedlab took 5's batch for the running batch: 6 at 58.)
    "35-overlap-hrrn-a-prefill-joins-a-running-batch-whose-last-request-is-finishing": (
        _case(dict(max_total_tokens=119, max_running_requests=2, max_prefill_tokens=1, schedule_policy="hrrn",
                   overlap_schedule=True),
              (0, 9, 7, 25, None, 0, None), (2, 22, 1, 11, None, 0, None), (3, 23, 112, 11, None, 0, None),
              (5, 26, 43, 23, None, 0, None), (6, 30, 92, 12, None, 0, None)),
        {0: _o(9, 10, 35, 0, 0, 7), 2: _o(22, 24, 34, 0, 0, 1), 3: _o(58, 59, 63, 0, 0, 112),
         5: _o(34, 36, 58, 0, 0, 43), 6: _o(63, 64, 75, 0, 0, 92)}),
    # 36. Overlap scheduling, priorities (lower first, threshold 0), one slot: a preempted request
    # keeps its client's abort. 0 (priority 1, 1 + 10 tokens) has tokens at 1-4; its client gives
    # up at 3.5. The loop top at 4 reads the abort (0 marked to_finish) and 1 (priority 0), whose
    # plan preempts 0 -- the token the batch in flight computes for it dropped. SGLang's to_finish
    # survives the retraction: 0 waits, is admitted again at 7 (its 1 + 4 tokens, 1 cached) and
    # ends, aborted, with that prefill's result. 1 runs [5, 8]. (schedlab dropped 0 at 4.)
    "36-overlap-a-request-preempted-after-its-abort-runs-once-more-later": (
        _case(dict(max_total_tokens=64, max_running_requests=1, overlap_schedule=True, enable_priority_scheduling=True,
                   schedule_low_priority_values_first=True, priority_scheduling_preemption_threshold=0),
              (0, 0, 1, 10, None, 0, None, 3.5), (1, 4, 1, 3, None, 0, None), priorities={0: 1, 1: 0}),
        {0: _o(0, 1, None, 1, 1, 1, 4), 1: _o(4, 6, 8, 0, 0, 1)}),
    # 37. 36 with 0 answering 5 tokens: the batch in flight at 4 gives it its last token, which
    # SGLang has not seen when 1's plan preempts it -- the same: it waits with its abort, runs its
    # prefill again at [8, 9] and ends then. (schedlab ended it at 4, its last token dropped.)
    "37-overlap-a-request-preempted-after-its-abort-with-its-last-token-in-flight": (
        _case(dict(max_total_tokens=64, max_running_requests=1, overlap_schedule=True, enable_priority_scheduling=True,
                   schedule_low_priority_values_first=True, priority_scheduling_preemption_threshold=0),
              (0, 0, 1, 5, None, 0, None, 3.5), (1, 4, 1, 3, None, 0, None), priorities={0: 1, 1: 0}),
        {0: _o(0, 1, None, 1, 1, 1, 4), 1: _o(4, 6, 8, 0, 0, 1)}),
    # 38. Overlap scheduling, a running timeout of 19 ms, three slots, priorities (lower first,
    # threshold 0). 0 (priority 3, 1 + 7 tokens, first scheduled at 3: its time is up at 22) is
    # preempted at 11 by 4 (priority 2) with its last token in flight -- un-finished, it computes
    # that token again later. Its time comes while it waits; readmitted at 27 (1's time ended it at
    # 26, once more to 27), its prefill [28, 29] would give it its last token, but the poll at 28
    # aborts it. 1, 2 and 4 run out their time too. Found on seed 477 (shrunk); the outcomes are
    # SGLang's. (The fast engine had dropped 0's deadline while it was finished in flight, so
    # after the un-finish it ran to its end at 29; the reference engine kept it.)
    "38-overlap-an-unfinished-request-keeps-its-deadline": (
        _case(dict(max_total_tokens=103, max_running_requests=3, max_prefill_tokens=1, overlap_schedule=True,
                   enable_priority_scheduling=True, schedule_low_priority_values_first=True,
                   priority_scheduling_preemption_threshold=0, running_timeout_ms=19),
              (0, 3, 1, 7, None, 0, None), (1, 7, 1, 26, None, 0, 26), (2, 9, 3, 28, None, 0, 28),
              (4, 11, 5, 53, None, 0, 53), priorities={0: 3, 1: 0, 2: 1, 4: 2}),
        {0: _o(3, 4, None, 1, 1, 1, 6), 1: _o(7, 9, None, 0, 0, 1), 2: _o(9, 11, None, 0, 0, 3),
         4: _o(11, 13, None, 0, 0, 5)}),
    # 39. shortest-prefill-first: a chunked prompt leaves room for shorter waiting prefills. Chunks
    # of 2, a prompt budget of 1, one slot. 5 (20 tokens) prefills 2 a pass from 0; 6 (1 token)
    # arrives at 9, when 5 has 2 to go: 6's 1 token is shorter and fits the chunk budget beside a
    # page, so 5's chunk is cut to 2 - 1 = 1 -- at 9 and again at 10 (6 still waits: one slot),
    # its token at 11. 6 runs then. (Without the cap 5 ended at 10.) Found on seed 19 with the cap
    # left out; the outcomes are SGLang's.
    "39-shortest-prefill-first-a-chunk-leaves-room-for-shorter-prefills": (
        _case(dict(max_total_tokens=27, max_running_requests=1, chunked_prefill_size=2, max_prefill_tokens=1,
                   schedule_policy="shortest-prefill-first"),
              (5, 0, 20, 1, None, 0, None), (6, 9, 1, 1, None, 0, 48)),
        {5: _o(0, 11, 11, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1), 6: _o(11, 12, 12, 0, 0, 1)}),
    # 40. Overlap scheduling: a request whose running time is up at the loop top that starts the
    # batch computing its token does not count that token (it is dropped, SGLang never appends it
    # to its output before the abort ends it). At 57 3's time is up (first scheduled at 25, 32 ms):
    # SGLang counts its 30 tokens for admission's offset, not 31, and the 0.9 token of room that
    # leaves lets 5 (retracted at 53, its 7 + 26 tokens to recompute) in at 57 -- aborted in turn at
    # 58, its time (26 + 32) having come while it waited -- so 1 starts at 58. Found on fresh seed
    # 53016 (shrunk); the outcomes are SGLang's. (schedlab counted the dropped token: 5 and 1 a
    # pass later.)
    "40-overlap-a-request-aborted-at-the-loop-top-does-not-count-its-token-in-flight": (
        _case(dict(max_total_tokens=107, max_running_requests=3, chunked_prefill_size=9, max_prefill_tokens=1,
                   schedule_policy="lof", schedule_conservativeness=0.1, overlap_schedule=True,
                   enable_priority_scheduling=True, priority_scheduling_preemption_threshold=1,
                   retraction_policy="priority", running_timeout_ms=32),
              (0, 1, 28, 11, None, 0, 28), (1, 3, 28, 49, None, 0, 49), (2, 6, 35, 14, None, 0, 14),
              (3, 7, 2, 41, None, 0, 41), (5, 10, 7, 57, None, 0, 57), (6, 19, 18, 60, None, 0, 60),
              priorities={0: 2, 1: 0, 2: 2, 3: 2, 5: 0, 6: 3}),
        {0: _o(1, 5, 19, 0, 0, 9, 9, 9, 1), 1: _o(58, 63, None, 0, 0, 9, 9, 9, 1), 2: _o(6, 11, 24, 0, 0, 9, 9, 9, 8),
         3: _o(25, 27, None, 0, 0, 2), 5: _o(26, 28, None, 1, 0, 7, 9), 6: _o(24, 26, None, 0, 0, 9, 9)}),
    # 41. A decode that does not fit evicts the tree's shortfall before it retracts. 46 tokens, two
    # slots, one request a pass: 0 (1 token, group 1) ends at its prefill, its token cached; 1 (2 +
    # 22) and 2 (3 + 22, ignoring EOS) fill the rest by 23 (their 5 prompt tokens and 40 decode
    # tokens), each with 21 tokens. There both need one, none is free and 1 is evictable: SGLang's
    # check_decode_mem evicts it (evict_to_free_tokens: the shortfall, as far as it is evictable)
    # and still retracts 2 (ties: the longer prompt), whose 20 decode tokens freed leave 21 >= 20
    # free -- no more eviction. 3 (4 tokens, group 1: 0's first) is admitted at 24 when 1 ends and
    # finds nothing; 2 comes back at 25 (3 cached + 21). Found on fresh seed 72099 (all; and hrrn
    # 72007); the outcomes are SGLang's. (schedlab evicted only after the retraction, which needed
    # none: 3 found 0's token, 1 cached.)
    "41-a-decode-that-does-not-fit-evicts-before-it-retracts": (
        _case(dict(max_total_tokens=46, max_running_requests=2, max_prefill_tokens=1),
              (0, 0, 1, 1, 1, 1, None), (1, 0, 2, 22, None, 0, 22), (2, 0, 3, 22, None, 0, None),
              (3, 0, 4, 2, 1, 4, None)),
        {0: _o(0, 1, 1, 0, 0, 1), 1: _o(1, 2, 24, 0, 0, 2), 2: _o(2, 3, 26, 1, 3, 3, 21),
         3: _o(24, 25, 27, 0, 0, 4)}),
    # 42. Overlap scheduling, priorities (lower first, threshold 0), dfs-weight, two slots, a prompt
    # budget of 6: a request preempted while its prefill is in flight frees its copy of a prompt
    # another prefill computes too. The plan at 0 admits 0 (priority 2, 3 tokens of group 2); the
    # next plan, while 0's prefill runs, admits 4 (priority 1, 5 tokens, 0's 3 first: not in the
    # tree yet, so computed again), and 7 (priority 0) preempts 0 -- whose pages SGLang frees at
    # once (release_kv_cache, nothing of it in the tree) -- but 7's 4 tokens exceed the 1 left of
    # the budget. At 1, 4's prompt is in flight, not in the tree: 7 runs, 0 finds nothing. 4's
    # prompt reaches the tree at the end of 1; 0 comes back at 4 with 2 of it cached. Found on
    # fresh seed 73088 (shrunk); the outcomes are SGLang's. (schedlab kept 0's blocks in the tree
    # as 4's copy, visible from 1: 0 came back there, beside 7, and preempted 4 in turn.)
    "42-overlap-a-prefill-preempted-in-flight-frees-its-copy-of-a-shared-prompt": (
        _case(dict(max_total_tokens=40, max_running_requests=2, max_prefill_tokens=6, schedule_policy="dfs-weight",
                   overlap_schedule=True, enable_priority_scheduling=True, schedule_low_priority_values_first=True,
                   priority_scheduling_preemption_threshold=0),
              (0, 0, 3, 8, 2, 3, 8), (4, 0, 5, 2, 2, 5, 2), (7, 0, 4, 6, None, 0, 6), priorities={0: 2, 4: 1, 7: 0}),
        {0: _o(0, 6, 13, 1, 2, 3, 1), 4: _o(0, 2, 4, 0, 0, 5), 7: _o(1, 3, 9, 0, 0, 4)}),
    # 43. --disable-radix-cache (schedlab: the paged cache without prefix caching): a request ignoring
    # EOS is admitted by its known length (add_one_req_ignore_eos), which charges its prompt's pages
    # and a page more (``paged_input``). Pages of 2 tokens, 202 tokens; both ignore EOS. At 4, 0 (38 +
    # 24) holds 41 tokens in 21 pages: 160 free. 1 (115 + 20): 116 + 2 = 118 fits; by tokens left, 1
    # (20 left, holding 115) then 0 (20, holding 42): 160 - 118 - 2 x 20 = 2 is not above a token per
    # request: refused, the batch full until 0 ends at 24. Found on no_radix seed 79 (shrunk); the
    # outcomes are SGLang's. (schedlab charged no page: 4 > 2, and 1 ran from 4.)
    "43-no-radix-a-request-ignoring-eos-is-charged-a-page-more": (
        _case(dict(max_total_tokens=202, max_running_requests=0, max_prefill_tokens=1, page_size=2,
                   disable_radix_cache=True),
              (0, 0, 38, 24, None, 0, None), (1, 4, 115, 20, None, 0, None)),
        {0: _o(0, 1, 24, 0, 0, 38), 1: _o(24, 25, 44, 0, 0, 115)}),
    # 44. Pages of 4 tokens, 16 tokens of KV: a prefill batch evicts until its prompt tokens and a page
    # per request are free (alloc_paged_token_slots_extend estimates its pages before it allocates).
    # 0 (group 0's 8 tokens, 1 token) leaves its 2 pages in the tree at 1. 1 (8 tokens of its own) at
    # 2 takes 2 pages, and 2 are free -- but SGLang evicts until 8 + 4 = 12 tokens are: 0's pages go,
    # and 2 (group 0's 8) at 4 finds nothing. (Evicting what the prefill took, schedlab kept 0's
    # pages: 2 found a page, 4 tokens -- a match stops a token short, at whole pages.)
    "44-paged-a-prefill-evicts-a-page-per-request-more": (
        _case(dict(max_total_tokens=16, max_running_requests=1, page_size=4),
              (0, 0, 8, 1, 0, 8, None), (1, 2, 8, 1, None, 0, None), (2, 4, 8, 1, 0, 8, None)),
        {0: _o(0, 1, 1, 0, 0, 8), 1: _o(2, 3, 3, 0, 0, 8), 2: _o(4, 5, 5, 0, 0, 8)}),
    # 45. Pages of 4 tokens, 28 tokens of KV, two slots, one prompt a pass: a decode batch evicts until
    # a page per request is free (alloc_paged_token_slots_decode). 0 (group 0's 8 tokens, 1 token)
    # leaves its 2 pages in the tree at 1; 1 (4 + 8) takes a page at 1, 2 (6 + 5) two at 2: 2 free.
    # The decode at 3 takes one (1's 5th KV slot starts a page, 2's 7th does not): 1 free. At 4
    # neither starts a page, but 1 free page is fewer than the 2 requests: SGLang evicts 0's pages,
    # and 3 (group 0's 8) at 12 finds nothing. (schedlab evicted only what a step took: 3 found 4.)
    "45-paged-a-decode-evicts-until-a-page-per-request-is-free": (
        _case(dict(max_total_tokens=28, max_running_requests=2, max_prefill_tokens=1, page_size=4),
              (0, 0, 8, 1, 0, 8, None), (1, 1, 4, 8, None, 0, None), (2, 2, 6, 5, None, 0, None),
              (3, 12, 8, 1, 0, 8, None)),
        {0: _o(0, 1, 1, 0, 0, 8), 1: _o(1, 2, 10, 0, 0, 4), 2: _o(2, 3, 7, 0, 0, 6), 3: _o(12, 13, 13, 0, 0, 8)}),
    # 46. 45's rule where it was found. Pages of 4 tokens, 204 tokens, two slots, one prompt a pass.
    # 2 (65 tokens, group 0's first 35, + 20) leaves 84 tokens in the tree at 33; 3 (group 0's 18 +
    # 22) finds 16 at 33 (the node splits at page 4) and 4 (77, group 0's first 16, + 14) 16 at 37.
    # At 42 nothing is free and the decode needs a page: 2's answer (pages 16-20, least recently
    # used) goes either way. At 50 one page is free, 3 and 4 decode and only one starts a page:
    # SGLang evicts on to two free pages -- 2's prompt pages 4-15 -- so 5 (group 0's 38 + 20) finds
    # 16 tokens at 51, not 32. Found on paged seed 148 (shrunk); the outcomes are SGLang's.
    "46-paged-a-decode-evicts-a-shared-prompt-it-does-not-need": (
        _case(dict(max_total_tokens=204, max_running_requests=2, max_prefill_tokens=1, page_size=4),
              (1, 10, 16, 25, None, 0, None), (2, 13, 65, 20, 0, 35, None), (3, 15, 18, 22, 0, 18, None),
              (4, 19, 77, 14, 0, 16, None), (5, 36, 38, 20, 0, 38, None)),
        {1: _o(10, 11, 37, 0, 0, 16), 2: _o(13, 14, 33, 0, 0, 65), 3: _o(33, 34, 57, 0, 16, 2),
         4: _o(37, 38, 51, 0, 16, 61), 5: _o(51, 52, 71, 0, 16, 22)}),
    # 47. --enable-mixed-chunk under overlap scheduling, pages of 2 tokens, 120 tokens: a mixed step's
    # budget charges each running request a token (``num_mixed_decode_tokens``), not the page its
    # decode may take. Chunks of 4, a prompt budget of 2; both ignore EOS. 0 (48 tokens) runs 12
    # chunks from 0; the plan at 11, made while its last one runs, has it in the running batch: its
    # decode joins, the chunk budget is 3 and the offsets start at 1. 0 holds 24 pages: 72 tokens
    # free, less 1, less its 12 tokens to go = 59 > 26 + 30 + 2: 1 is admitted, cut to 2 tokens (whole
    # pages), and goes on in chunks of 3 (add_chunked_req does not cut to pages) beside 0's decodes.
    # Found on paged_chunked seed 51 with overlap (shrunk); the outcomes are SGLang's. (schedlab
    # counted 0's new page whole: 70 - 12 = 58, not above 58, and 1 waited until 0 ended at 23.)
    "47-overlap-mixed-a-running-request-costs-a-token-not-its-new-page": (
        _case(dict(max_total_tokens=120, max_running_requests=2, chunked_prefill_size=4, max_prefill_tokens=2,
                   enable_mixed_chunk=True, overlap_schedule=True, page_size=2),
              (0, 0, 48, 12, None, 0, None), (1, 0, 26, 30, None, 0, None)),
        {0: _o(0, 12, 23, 0, 0, *[4] * 12), 1: _o(11, 21, 50, 0, 0, 2, 3, 3, 3, 3, 3, 3, 3, 3)}),
    # 48. lpm ranks by the whole prompt's match less its last token (num_matched_prefix_tokens), not
    # cut to pages. Pages of 2 tokens, 16 tokens, one prompt a pass. 0 (group 1's 2 tokens, 1) leaves
    # its page in the tree at 1. At 3, 1 (1 token of its own) and 2 (group 1's 2) wait: 2's whole
    # prompt matches that page, 2 - 1 = 1 token, 1 matches none: 2 goes first -- and finds nothing,
    # as an admission's match stops a token short, at whole pages -- and 1 at 4. Found on paged seed
    # 4043 (shrunk); the outcomes are SGLang's. (schedlab ranked both by the admission's hit, 0:
    # 1 first, by arrival.)
    "48-paged-lpm-ranks-by-the-whole-match-less-a-token": (
        _case(dict(max_total_tokens=16, max_running_requests=0, max_prefill_tokens=1, schedule_policy="lpm",
                   page_size=2),
              (0, 0, 2, 1, 1, 2, None), (1, 3, 1, 1, None, 0, None), (2, 3, 2, 1, 1, 2, None)),
        {0: _o(0, 1, 1, 0, 0, 2), 1: _o(4, 5, 5, 0, 0, 1), 2: _o(3, 4, 4, 0, 0, 2)}),
}


@pytest.mark.parametrize("engine", ("fast", "reference"))
@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_schedlab_matches_sglang_on_each_reproducer(engine, name):
    case, expected = REPRODUCERS[name]
    assert case.problems() == []
    assert SchedlabRunner(engine).run(case) == (expected, None)


def test_schedlab_side_counts_whole_steps_of_one_ms():
    # 40 tokens: 0 (prompt 10, 20 tokens) needs 10 + 20 + 1 page = 31 < 40; 1 (prompt 12, 5 tokens) then
    # needs 18 >= 40 - 31: it waits until 0's 20th token at 20 ms, and finishes 5 steps later
    case = _case(dict(max_total_tokens=40, max_running_requests=2),
                 (0, 0, 10, 20, None, 0, None), (1, 0, 12, 5, None, 0, None))
    outcomes, error = SchedlabRunner().run(case)
    assert error is None
    assert outcomes[0] == _o(0, 1, 20, 0, 0, 10)
    assert outcomes[1] == _o(20, 21, 25, 0, 0, 12)


def test_schedlab_side_rejects_unknown_one_sided_settings():
    with pytest.raises(ConfigError, match="unknown key 'no_such_setting'"):
        SchedlabRunner().build(generate("lpm", 0), Sides({"no_such_setting": 1}))


def test_reproducer_text_has_chunks_and_the_replay_line():
    case, expected = REPRODUCERS["2-prompt-budget-with-chunks"]
    theirs = dict(expected)
    ours = dict(expected)
    ours[1] = _o(8, 10, 17, 0, 0, 8, 2)
    text = Comparison(ENGINE, case, theirs, ours).describe()
    lines = text.splitlines()
    header = lines.index("  id  scheduled  first_token  finish  retractions  cached  chunks")
    assert lines[header + 2].split() == ["1", "7/8*", "9/10*", "16/17*", "0/0", "0/0", "6+4/8+2*"]
    replay = text.split("--replay '")[1].split("'")[0]
    assert case_from_json(replay) == case
    assert "python tools/sglang_diff.py" in text


# -- command line -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--groups", "lpm,nope"], "--groups: unknown group nope"),
    (["--seeds", "x"], "--seeds: expected N or A:B, got 'x'"),
    (["--set", "kv_cache.num_blocks=3"], "only scheduler.KEY is passed to schedlab"),
    (["--replay", "{\"settings\": {}}"], "--replay: not a case"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.skipif(HAVE_SGLANG, reason="SGLang is installed")
def test_cli_without_sglang_says_how_to_install(capsys):
    assert main(["--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert "cannot import SGLang" in err and "Checked against SGLang" in err


# -- against SGLang itself ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def differ():
    if not HAVE_SGLANG:
        pytest.skip("SGLang is not installed")
    from schedlab.sglang_diff.sglang_side import SglangRunner
    return Differ(ENGINE, SglangRunner(), SchedlabRunner())  # SglangRunner stubs the GPU-only imports first


@pytest.mark.sglang
@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_sglang_runs_each_reproducer_as_computed_by_hand(differ, name):
    case, expected = REPRODUCERS[name]
    assert differ.theirs.run(case) == (expected, None)


SEEDS = range(20)  # seeds every group must agree on


@pytest.mark.sglang
@pytest.mark.parametrize("group", GROUPS)
def test_schedlab_agrees_with_sglang(differ, group):
    differing = [c for c in (differ.compare(generate(group, seed)) for seed in SEEDS) if not c.agrees]
    assert not differing, "\n\n".join(c.describe() for c in differing[:3])
