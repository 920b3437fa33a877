"""What the prefix-aware routers remember (reviews/router_memory_FIXES.md): ``prefix_affinity`` keeps
homes and holders by instance index, not position, and forgets an instance that left the pool;
its approximate tree is cut back, least recently used first, every ``eviction_interval_s`` of
simulated time once an instance holds more than ``max_tree_tokens`` (SGLang's
``evict_tenant_by_size``); ``weighted`` keeps llm-d's per-instance LRU of blocks, as many as the
instance's KV cache has. Hand-computed placements, and an autoscaled pool in both engines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from schedlab.engine.scaling import ScalingLimits
from schedlab.model import Request
from schedlab.testing import RecordingRouter, compare_runs
from schedlab.testing.kit import run_cluster
from schedlab_plugins.routers import PrefixAffinityConfig, PrefixAffinityRouter, WeightedConfig, WeightedRouter
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler


def req(i: int, t: float = 0.0, prompt: int = 16, **kw) -> Request:
    return Request(i, t, prompt, 2, **kw)


def pool(*members) -> list:
    """Views of a pool: (instance index, outstanding) in the pool's order."""
    return [SimpleNamespace(index=i, outstanding=o) for i, o in members]


def loads(*outstanding) -> list:
    return pool(*enumerate(outstanding))


def affinity(**kw) -> PrefixAffinityRouter:
    return PrefixAffinityRouter(PrefixAffinityConfig(**kw))


# -- prefix_affinity: instances by index ------------------------------------------------------------------


def test_the_defaults_are_sglangs_tree_size_in_tokens_and_its_launchers_eviction_interval():
    c = PrefixAffinityConfig()
    assert c.max_tree_tokens == 2**26 // 4 == 16_777_216  # 2**26 characters at 4 characters per token
    assert c.eviction_interval_s == 60.0


def test_a_group_follows_its_instance_when_the_pool_is_renumbered():
    router = affinity()
    assert router.route(req(0, prefix_group="a"), loads(5, 5, 0)) == 2           # a -> instance 2
    assert router.route(req(1, prefix_group="b"), loads(0, 3, 3)) == 0           # b -> instance 0
    # instance 0 left, instance 3 joined: instance 2 is now at position 1. Before: a's home was
    # "position 2" -- instance 3 -- and b's "position 0" -- instance 1, which never served it
    members = pool((1, 0), (2, 4), (3, 0))
    assert router.route(req(2, prefix_group="a"), members) == 1
    # b's instance left the pool: b is placed again, on the least loaded (position 0, instance 1)
    assert router.route(req(3, prefix_group="b"), pool((1, 2), (2, 4), (3, 3))) == 0
    # ... and stays there when instance 0 comes back in front of it
    assert router.route(req(4, prefix_group="b"), pool((0, 0), (1, 2), (2, 4), (3, 3))) == 1


def test_blocks_held_by_an_instance_follow_it_and_are_forgotten_when_it_leaves():
    router = affinity()
    assert router.route(req(0, prompt=20, block_hashes=(1, 2), hash_block_tokens=10), loads(3, 3, 0)) == 2
    # instance 1 drained out: instance 2 at position 1 holds (1, 2): 2 of 3 blocks -> there
    assert router.route(req(1, prompt=30, block_hashes=(1, 2, 3), hash_block_tokens=10), pool((0, 0), (2, 1))) == 1
    # instance 2 leaves too, then comes back (its cache reset when it went off): it holds nothing,
    # so the prompt goes to the least loaded, instance 0 (before: to 2, or to position 1 at once)
    assert router.route(req(2, prompt=20, block_hashes=(8, 9), hash_block_tokens=10), pool((0, 0))) == 0
    assert router.route(req(3, prompt=30, block_hashes=(1, 2, 3), hash_block_tokens=10), pool((0, 1), (2, 0))) == 1
    assert router.route(req(4, prompt=30, block_hashes=(1, 2, 3), hash_block_tokens=10), pool((0, 0), (2, 1))) == 1


class Script:
    """An autoscaler that wants ``plan[t]`` instances at the tick at ``t`` (else what it has)."""

    def __init__(self, plan: dict):
        self.plan = plan

    def decide(self, signals) -> int:
        return self.plan.get(signals.now_ms, signals.serving + signals.warming)


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("prefix", ["group", "hashes"])
def test_an_autoscaled_pool_that_renumbers_keeps_a_prefix_on_its_instance_in_both_engines(engine, prefix):
    """Three instances, ticks every second, no cold start. At 1 s the policy wants 1: instances 2
    (serving a 4,000-token answer) and 1 (idle) drain; at 2 s instance 1 is off and 2 is taken back:
    the pool is [0, 2]; at 3 s instance 1 warms and serves at once: [0, 1, 2], instance 2 now at
    position 2. The prefix first seen at 2.5 s goes to instance 2 (position 1, the least loaded); at
    3.5 s it follows instance 2, not position 1 -- instance 1, idle, the least loaded then."""
    shared = ({"prefix_group": "d", "prefix_tokens": 16} if prefix == "group" else
              {"block_hashes": (7, 8), "hash_block_tokens": 16})
    requests = [Request(0, 0.0, 32, 4, prefix_group="a", prefix_tokens=16),
                Request(1, 0.0, 32, 4, prefix_group="b", prefix_tokens=16),
                Request(2, 0.0, 32, 4000, prefix_group="c", prefix_tokens=16),   # keeps instance 2 draining
                Request(3, 1500.0, 32, 4000, prefix_group="c", prefix_tokens=16),  # c's instance left: on 0
                Request(4, 1500.0, 32, 4000),
                Request(5, 2500.0, 32, 4, **shared),
                Request(6, 3500.0, 32, 4, **shared)]
    limits = ScalingLimits(min_instances=1, max_instances=3, initial=3, interval_ms=1000.0, cold_start_ms=0.0,
                           window_ms=1000.0)

    def run(engine):
        spy = RecordingRouter(PrefixAffinityRouter(), lambda view: (view.index, view.outstanding))
        result = run_cluster(requests, lambda: (ContinuousScheduler(ContinuousConfig(max_num_seqs=8)), None, None),
                             3, spy, engine=engine, autoscaler=Script({1000.0: 1, 2000.0: 2, 3000.0: 3}),
                             limits=limits)
        return result, spy.seen

    result, seen = run(engine)
    assert [h[:4] for h in result.meta["scaling"]["history"][:4]] == [
        [0.0, 3, 0, 0], [1000.0, 1, 0, 2], [2000.0, 2, 0, 0], [3000.0, 3, 0, 0]]
    assert seen[5] == (5, [(0, 2), (2, 1)]) and seen[6] == (6, [(0, 2), (1, 0), (2, 1)])
    assert result.requests["instance"].tolist() == [0, 1, 2, 0, 0, 2, 2]
    other, _ = run("reference" if engine == "fast" else "fast")
    compare_runs(result, other, rel=1e-12)


# -- prefix_affinity: the tree's eviction -----------------------------------------------------------------


def mooncake(i: int, t: float, hashes: tuple) -> Request:
    return req(i, t, prompt=10 * len(hashes), block_hashes=hashes, hash_block_tokens=10)


def history(router) -> PrefixAffinityRouter:
    """Instance 0 records (1, 2) at 0 ms, (5, 6) at 200 ms, (1, 2, 7) at 300 ms -- 50 tokens --,
    instance 1 (3, 4) at 100 ms -- 20 tokens."""
    assert router.route(mooncake(0, 0.0, (1, 2)), loads(0, 1)) == 0
    assert router.route(mooncake(1, 100.0, (3, 4)), loads(1, 0)) == 1
    assert router.route(mooncake(2, 200.0, (5, 6)), loads(0, 1)) == 0
    assert router.route(mooncake(3, 300.0, (1, 2, 7)), loads(1, 0)) == 0   # (1, 2) held by 0: 2 of 3
    return router


def test_the_least_recently_used_blocks_go_at_the_first_eviction_after_the_tree_outgrows_its_size():
    """max_tree_tokens = 30 and an eviction every second: at 1,000 ms instance 0 holds 50 tokens.
    Its leaves, oldest first: 6 (used at 200 ms), then 5 (a leaf once 6 is gone, also 200 ms) --
    30 tokens left, so 7 and (1, 2), inserted first but used again at 300 ms, stay. Instance 1,
    within the size, keeps (3, 4)."""
    small = {"max_tree_tokens": 30, "eviction_interval_s": 1.0}
    # at 999.9 ms no eviction has run: (5, 6) still matches on instance 0, the busier one
    assert history(affinity(**small)).route(mooncake(4, 999.9, (5, 6)), loads(1, 0)) == 0
    # at 1,000 ms (the eviction runs before the request at its time) it matches nothing: the least loaded
    assert history(affinity(**small)).route(mooncake(4, 1000.0, (5, 6)), loads(1, 0)) == 1
    router = history(affinity(**small))
    assert router.route(mooncake(4, 1500.0, (1, 2, 7)), loads(1, 0)) == 0
    assert router.route(mooncake(5, 1500.0, (3, 4)), loads(0, 1)) == 1
    # the same history without a bound, or with evictions off, forgets nothing
    for kw in ({}, {"max_tree_tokens": 30, "eviction_interval_s": 0.0}):
        assert history(affinity(**kw)).route(mooncake(4, 1000.0, (5, 6)), loads(1, 0)) == 0


def test_a_quiet_spell_runs_the_evictions_due_when_the_next_request_arrives():
    router = history(affinity(max_tree_tokens=30, eviction_interval_s=1.0))
    assert router.route(mooncake(4, 7300.0, (5, 6)), loads(1, 0)) == 1   # due at 1 s, ... 7 s: run at 7.3 s


def test_groups_and_every_prompts_own_tokens_take_room_and_the_least_recently_used_go_first():
    """max_tree_tokens = 100. Instance 0: group a (50 prefix tokens + 10 of its own) at 0 ms, group
    b (50 + 10) at 10 ms, group a again (+ 10) at 20 ms: 130 tokens. At 1,000 ms the least recent
    go until it holds 100 or less: a's first request's own 10 (0 ms), b's own 10 (10 ms), then
    b's prefix (10 ms): 60 left; a (20 ms) stays."""
    def routed(t_probe: float, group: str):
        router = affinity(max_tree_tokens=100, eviction_interval_s=1.0)
        assert router.route(req(0, 0.0, prompt=60, prefix_group="a", prefix_tokens=50), loads(0, 1)) == 0
        assert router.route(req(1, 10.0, prompt=60, prefix_group="b", prefix_tokens=50), loads(0, 1)) == 0
        assert router.route(req(2, 20.0, prompt=60, prefix_group="a", prefix_tokens=50), loads(5, 0)) == 0
        return router.route(req(3, t_probe, prompt=60, prefix_group=group, prefix_tokens=50), loads(1, 0))

    assert routed(999.0, "b") == 0      # still at home
    assert routed(1000.0, "b") == 1     # forgotten: placed again, on the least loaded
    assert routed(1000.0, "a") == 0
    # a prompt without a prefix counts too: 60 + 40 + 20 tokens; over 100 the first prompt goes (60
    # left); over 30 also the second's own 20 (at 40, still over), then a's prefix
    router = affinity(max_tree_tokens=100, eviction_interval_s=1.0)
    assert router.route(req(0, 0.0, prompt=60), loads(0, 1)) == 0
    assert router.route(req(1, 10.0, prompt=60, prefix_group="a", prefix_tokens=40), loads(0, 1)) == 0
    assert router.route(req(2, 1000.0, prompt=60, prefix_group="a", prefix_tokens=40), loads(1, 0)) == 0
    router = affinity(max_tree_tokens=30, eviction_interval_s=1.0)
    assert router.route(req(0, 0.0, prompt=60), loads(0, 1)) == 0
    assert router.route(req(1, 10.0, prompt=60, prefix_group="a", prefix_tokens=40), loads(0, 1)) == 0
    assert router.route(req(2, 1000.0, prompt=60, prefix_group="a", prefix_tokens=40), loads(1, 0)) == 1


@pytest.mark.parametrize("bad, name", [({"max_tree_tokens": -1}, "max_tree_tokens"),
                                       ({"eviction_interval_s": -1.0}, "eviction_interval_s")])
def test_bad_memory_settings_fail_naming_the_setting(bad, name):
    with pytest.raises(ValueError, match=name) as info:
        PrefixAffinityConfig(**bad)
    assert "\n" not in str(info.value)


# -- weighted: llm-d's LRU per instance -------------------------------------------------------------------


def views(*states, blocks: int = 1000, indexes=None) -> list:
    """Views with these (waiting, KV usage), 16-token blocks, ``blocks`` of them each."""
    indexes = range(len(states)) if indexes is None else indexes
    return [SimpleNamespace(index=i, waiting=w, kv=SimpleNamespace(usage=u, block_size=16, num_blocks=blocks))
            for i, (w, u) in zip(indexes, states)]


def weighted(**kw) -> WeightedRouter:
    return WeightedRouter(WeightedConfig(**kw))


def group_history(router, blocks: int) -> WeightedRouter:
    """Instance 0's LRU, least recent first, in 16-token blocks: group g's 2 blocks + 2 of its own
    (4); g again (g's blocks the most recent, then 2 more of its own: the first 2 dropped at a room
    of 4); a 16-token prompt of its own (1 block: g's first block dropped at a room of 4)."""
    g = {"prompt": 64, "prefix_group": "g", "prefix_tokens": 32}
    assert router.route(req(0, **g), views((0, 0.0), (0, 0.0), blocks=blocks)) == 0
    # 0 holds 2 of g's 4 blocks: 2 + 2 x 0.9 + 3 x 0.5 = 5.3 against 2 + 2 = 4.0
    assert router.route(req(1, **g), views((0, 0.1), (0, 0.0), blocks=blocks)) == 0
    assert router.route(req(2), views((0, 0.0), (1, 0.0), blocks=blocks)) == 0   # queue 1 + 1 vs 0 + 1
    return router


def test_the_weighted_index_forgets_the_least_recently_recorded_block_first_and_the_prefix_with_it():
    """With room for 4 blocks (instance 0's KV cache, llm-d's autoTune), the prompt of its own
    drops g's first block -- the least recent, as llm-d records a prompt's blocks in order -- and
    with it the whole match (g's second block is still recorded, but matching starts at the first):
    g's next request scores 0 on instance 0, 3.8 against 4.0. With room for 5 nothing is dropped."""
    g = {"prompt": 64, "prefix_group": "g", "prefix_tokens": 32}
    assert group_history(weighted(), blocks=4).route(req(3, **g), views((0, 0.1), (0, 0.0), blocks=4)) == 1
    assert group_history(weighted(), blocks=5).route(req(3, **g), views((0, 0.1), (0, 0.0), blocks=5)) == 0
    # the room is the setting when given, whatever the cache (llm-d without autoTune: 31,250)
    assert group_history(weighted(lru_blocks=4), blocks=1000).route(req(3, **g), views((0, 0.1), (0, 0.0))) == 1
    assert group_history(weighted(lru_blocks=5), blocks=4).route(req(3, **g), views((0, 0.1), (0, 0.0))) == 0
    assert WeightedConfig().lru_blocks is None


def test_a_trace_block_counts_as_its_tokens_in_engine_blocks_and_is_lost_when_part_of_it_goes():
    """Two 32-token trace blocks are 2 + 2 engine blocks: a room of 4 is full; a 1-block prompt of
    the instance's own drops half of the first, which no longer matches."""
    def probe(room: int) -> int:
        router = weighted(lru_blocks=room)
        trace = {"prompt": 64, "block_hashes": (1, 2), "hash_block_tokens": 32}
        assert router.route(req(0, **trace), views((0, 0.0), (0, 0.0))) == 0
        assert router.route(req(1), views((0, 0.0), (1, 0.0))) == 0
        return router.route(req(2, **trace), views((0, 0.1), (0, 0.0)))   # held: 3.8 + 3 x 1 vs 4.0

    assert probe(4) == 1
    assert probe(5) == 0


def test_the_weighted_index_forgets_an_instance_that_left():
    g = {"prompt": 64, "prefix_group": "g", "prefix_tokens": 64}
    router = weighted()
    assert router.route(req(0, **g), views((0, 0.5), (0, 0.0))) == 1            # the freer KV
    assert router.route(req(1), views((0, 0.0), indexes=[0])) == 0               # instance 1 left
    # it is back, holding nothing: 4.0 vs 3.6 (before: 3.6 + 3 x 1 = 6.6 for instance 1)
    assert router.route(req(2, **g), views((0, 0.0), (0, 0.2))) == 0


def test_a_prompt_shorter_than_one_block_is_not_recorded():
    """llm-d hashes no block of a prompt shorter than one: with room for 2 blocks, g's block and its
    own; a 15-token prompt takes no room, a 16-token one drops g's block."""
    def probe(prompt: int) -> int:
        router = weighted(lru_blocks=2)
        g = {"prompt": 32, "prefix_group": "g", "prefix_tokens": 16}
        assert router.route(req(0, **g), views((0, 0.0), (0, 0.0))) == 0
        assert router.route(req(1, prompt=prompt), views((0, 0.0), (1, 0.0))) == 0
        return router.route(req(2, **g), views((0, 0.1), (0, 0.0)))   # held: 3.8 + 3 x 1/2 vs 4.0

    assert probe(15) == 0
    assert probe(16) == 1


def test_blocks_a_prompt_drops_while_it_is_recorded_are_not_held():
    """Room for 2 blocks, a group prompt of 4 (16 tokens each): recording it in order drops its
    first two, so instance 0 holds only the last two -- and matching starts at the first: g's next
    request finds nothing there and goes by load (the freer KV, instance 1). The dropped blocks
    stayed listed as held (and were never forgotten with the instance, whose LRU no longer had
    them): it went back to instance 0 on a match of 2 blocks."""
    g = {"prompt": 64, "prefix_group": "g", "prefix_tokens": 64}
    router = weighted(lru_blocks=2)
    assert router.route(req(0, **g), views((0, 0.0), (0, 0.5))) == 0
    assert router.route(req(1, **g), views((0, 0.2), (0, 0.1))) == 1
    router = weighted(lru_blocks=2)
    assert router.route(req(0, **g), views((0, 0.0), (0, 0.5))) == 0
    assert router.route(req(1), views((0, 0.0), indexes=[1])) == 0               # instance 0 left
    assert router.route(req(2, **g), views((0, 0.2), (0, 0.1))) == 1             # back, holding nothing
