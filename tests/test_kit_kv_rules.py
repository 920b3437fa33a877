"""Rules the kit and the engines hold KV caches and schedulers to, each against a plugin that
breaks it (audit s57's mutants): a prefix cache that counts too few blocks, one whose own
invariants break only while sequences hold blocks, one that finds a first hit past the prefix its
request declares, and a scheduler that drops a request it had served."""

from __future__ import annotations

import pytest

from schedlab.errors import SimulationError
from schedlab.model import Request
from schedlab.testing import IterationChecker, check_run, run_engine
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

ENGINES = ("fast", "reference")


class CountsOneTooFew(PrefixKVCache):
    """A prefix cache one block short in what it reports in use (audit k11: a ceiling rounded down)."""

    def num_used_blocks(self) -> int:
        return max(0, super().num_used_blocks() - 1)

    def num_free_blocks(self) -> int:  # (and one more free: the counts add up, as the engines check)
        return super().num_free_blocks() + (super().num_used_blocks() > 0)


def test_a_prefix_cache_counting_too_few_blocks_is_caught_per_iteration():
    # one request, 20 prompt tokens, nothing shared: after its prefill it holds ceil(20 / 16) = 2
    # blocks that no other sequence could share; the cache says 1
    requests = [Request(0, 0.0, 20, 3)]
    run_engine(requests, ContinuousScheduler(), kv=PrefixKVCache(8, 16), check=IterationChecker())  # (the real one)
    with pytest.raises(AssertionError, match="1 KV blocks in use after the iteration, but the sequences hold 2, of "
                                             "which at least 2 no two can share"):
        run_engine(requests, ContinuousScheduler(), kv=CountsOneTooFew(8, 16), check=IterationChecker())


def test_shared_prefix_blocks_count_once_in_the_lower_bound():
    # two requests of one group share their first 32 tokens (2 blocks of 16): together they hold
    # 2 x 3 blocks by their counters, 4 distinct -- 2 shared, 1 own each; the checker accepts that
    requests = [Request(0, 0.0, 40, 4, prefix_group=0, prefix_tokens=32),
                Request(1, 0.0, 40, 4, prefix_group=0, prefix_tokens=32)]
    seen = []
    check = IterationChecker()

    def observe(instance, record):
        seen.append((record.kv_used_after, record.kv_held_after, record.kv_least_after))
        check(instance, record)

    result = run_engine(requests, ContinuousScheduler(), kv=PrefixKVCache(16, 16), check=observe)
    check_run(result, requests)
    assert (4, 6, 4) in seen  # 3 + 3 blocks held, 2 + 1 + 1 own, the 2 shared counted once


class BrokenWhileBusy(PrefixKVCache):
    """A cache whose own invariants fail while more than 2 blocks are in use and hold again once
    it is empty (audit k10: ref counts out of step with block lists until everything is freed)."""

    def check_invariants(self) -> None:
        super().check_invariants()
        assert self.num_used_blocks() <= 2, "reference counts differ from the sequences' block lists"


def test_the_caches_invariants_are_checked_after_every_iteration_not_only_on_the_empty_cache():
    requests = [Request(0, 0.0, 40, 3), Request(1, 0.0, 40, 3)]
    result = run_engine(requests, ContinuousScheduler(), kv=BrokenWhileBusy(16, 16))
    check_run(result, requests)  # at the end the cache is empty: its invariants hold
    with pytest.raises(AssertionError, match="reference counts differ"):
        run_engine(requests, ContinuousScheduler(), kv=BrokenWhileBusy(16, 16), check=IterationChecker())
    run_engine(requests, ContinuousScheduler(), kv=BrokenWhileBusy(16, 16), check=IterationChecker(invariants=False))


class SharesThePartialBlock(PrefixKVCache):
    """A prefix cache that also reuses the block holding the end of the system prompt, whose later
    tokens differ between requests (audit k06)."""

    def cached_tokens(self, seq) -> int:
        hit = super().cached_tokens(seq)
        return hit + self.block_size if hit and hit + self.block_size < seq.num_tokens else hit


@pytest.mark.parametrize("engine", ENGINES)
def test_a_first_hit_past_the_declared_prefix_stops_the_run_naming_the_cache(engine):
    # a 20-token system prompt: one whole block of 16 may be shared; request 1 comes after
    # request 0 has computed it
    requests = [Request(0, 0.0, 40, 2, prefix_group=0, prefix_tokens=20),
                Request(1, 50.0, 40, 2, prefix_group=0, prefix_tokens=20)]
    fine = run_engine(requests, ContinuousScheduler(), kv=PrefixKVCache(16, 16), engine=engine)
    assert fine.requests["cached_tokens"].tolist() == [0, 16]
    with pytest.raises(SimulationError, match=r"KV cache SharesThePartialBlock's cached_tokens returned 32 for request "
                                              r"1, never scheduled before, whose shared prefix is 20 tokens \(16 in "
                                              r"whole blocks of 16\)"):
        run_engine(requests, ContinuousScheduler(), kv=SharesThePartialBlock(16, 16), engine=engine)


class DropsItsVictims(ContinuousScheduler):
    """Turns away a request it preempted, with a reason (audit s06: "preempted twice")."""

    def schedule(self, plan) -> None:
        for seq in [s for s in plan.waiting if s.num_preemptions]:
            plan.reject(seq, "preempted once")
        super().schedule(plan)


# two 16-token prompts in a pool of 3 blocks of 16, KV grown as computed: both are admitted (a
# block each); their first decodes need a block each, one is free, so the later one is preempted
TIGHT = [Request(0, 0.0, 16, 20), Request(1, 0.0, 16, 20)]
GROW = ContinuousConfig(allocation="grow")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_turned_away_after_it_was_served_fails_unless_allowed(engine):
    honest = run_engine(TIGHT, ContinuousScheduler(GROW), kv=PagedKVCache(3, 16), engine=engine)
    assert honest.requests["preemptions"].tolist() == [0, 1]
    check_run(honest, TIGHT, rejections="none")
    dropped = run_engine(TIGHT, DropsItsVictims(GROW), kv=PagedKVCache(3, 16), engine=engine)
    assert dropped.rejections == {1: "preempted once"}
    with pytest.raises(AssertionError, match=r"request 1 rejected \(preempted once\) after it was scheduled at 0.0 ms"):
        check_run(dropped, TIGHT)
    check_run(dropped, TIGHT, rejections="any")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_that_can_never_fit_may_be_turned_away_unless_none_are(engine):
    requests = [Request(0, 0.0, 10, 2), Request(1, 0.0, 200, 2)]  # 200 tokens: 13 blocks of 16, the pool has 4
    result = run_engine(requests, ContinuousScheduler(), kv=PagedKVCache(4, 16), engine=engine)
    assert list(result.rejections) == [1]
    check_run(result, requests)
    with pytest.raises(AssertionError, match=r"request 1 rejected .*rejections='none'"):
        check_run(result, requests, rejections="none")
    with pytest.raises(ValueError, match="rejections must be"):
        check_run(result, requests, rejections="some")


class ForgetsPreemptedFrees(PagedKVCache):
    """A free count the preemption path forgets to raise (audit k04): the blocks a preempted
    sequence held are no longer used, yet never free again."""

    def num_free_blocks(self) -> int:
        return super().num_free_blocks() - self.lost

    lost = 0

    def free(self, seq, *, preempted: bool = False) -> None:
        before = self.num_used_blocks()
        super().free(seq, preempted=preempted)
        if preempted:
            self.lost += before - self.num_used_blocks()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_free_count_out_of_step_is_caught_at_the_plan(engine):
    """It used to surface only as a stall, with a hint (0 used, 0 free of 3, nothing running)."""
    with pytest.raises(SimulationError, match=r"^KV cache ForgetsPreemptedFrees reports \d+ used \+ \d+ free blocks, not "
                                              r"the 3 it has: its used and free counts are not kept together"):
        run_engine(TIGHT, ContinuousScheduler(GROW), kv=ForgetsPreemptedFrees(3, 16), engine=engine)
