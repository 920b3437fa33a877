"""Built-in routers and several-instance runs: hand-computed placements, metrics that add up,
conservation on random workloads, closed loops over two instances, and bad router input."""

from __future__ import annotations

import json
import textwrap
from types import SimpleNamespace
import zlib

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schedlab.catalog import load_catalog
from schedlab.engine.driver import simulate
from schedlab.engine.instance import Instance
from schedlab.engine.recorder import Recorder
from schedlab.errors import ConfigError, SimulationError
from schedlab.model import Request
from schedlab.results import RunResult
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import check_run, compare_runs, examples, requests_lists
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.routers import (ClassRouter, ClassRoutingConfig, HashRouter, LeastKVRouter,
                                      LeastOutstandingRouter, PrefixAffinityConfig, PrefixAffinityRouter,
                                      RoundRobinRouter, prefix_key)
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler, StaticConfig, StaticScheduler

# -- helpers ------------------------------------------------------------------------------------------


def write_experiment(folder, rows: list[dict], toml: str, name: str = "reqs.json"):
    (folder / name).write_text(json.dumps({"requests": rows}))
    path = folder / "exp.toml"
    path.write_text(textwrap.dedent(toml))
    return path


def run_toml(folder, rows: list[dict], toml: str) -> dict:
    """Every run of the experiment, by name."""
    results = run_experiment(load(write_experiment(folder, rows, toml)))
    return {r.name: r for r in results.all_runs()}


def placements(result) -> list[int]:
    """The instance of each request, by request id."""
    assert result.requests["id"].tolist() == list(range(result.requests["id"].size))
    return result.requests["instance"].tolist()


def fake_instances(outstanding: list[int], used: list[int] | None = None, blocks: int = 100) -> list:
    used = used or [0] * len(outstanding)
    def kv(u):
        return SimpleNamespace(num_used_blocks=lambda: u, num_blocks=blocks)

    return [SimpleNamespace(index=i, outstanding=o, kv=kv(u)) for i, (o, u) in enumerate(zip(outstanding, used))]


def req(i: int, **kw) -> Request:
    return Request(i, 0.0, 16, 2, **kw)


# -- the routers alone ----------------------------------------------------------------------------------


def test_every_builtin_router_is_registered():
    names = set(load_catalog(entry_points=False)["router"].names())
    assert {"round_robin", "least_outstanding", "least_kv", "prefix_affinity", "class"} <= names


def test_round_robin_cycles_whatever_the_load():
    router = RoundRobinRouter()
    busy = fake_instances([9, 0, 5])
    assert [router.route(req(i), busy) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_takes_the_shortest_queue_and_the_lowest_index_on_ties():
    router = LeastOutstandingRouter()
    assert router.route(req(0), fake_instances([3, 1, 2])) == 1
    assert router.route(req(0), fake_instances([2, 1, 1])) == 1
    assert router.route(req(0), fake_instances([0, 0, 0])) == 0


def test_least_kv_compares_usage_fractions_then_outstanding_then_index():
    router = LeastKVRouter()
    assert router.route(req(0), fake_instances([0, 5, 9], used=[50, 10, 20])) == 1       # KV first
    assert router.route(req(0), fake_instances([4, 2, 3], used=[10, 10, 10])) == 1       # then outstanding
    assert router.route(req(0), fake_instances([2, 2, 2], used=[10, 10, 10])) == 0       # then index
    # fractions, not block counts: 30 of 200 blocks (15%) beats 20 of 100 (20%)
    mixed = fake_instances([0, 0], used=[20, 30])
    mixed[1].kv.num_blocks = 200
    assert router.route(req(0), mixed) == 1


def test_prefix_key_uses_the_group_then_the_first_block_hash():
    assert prefix_key(req(0, prefix_group="sys", prefix_tokens=4)) == ("group", "sys")
    assert prefix_key(req(0, block_hashes=(7, 8))) == ("hash", 7)
    assert prefix_key(req(0, prefix_group=7, block_hashes=(7,))) == ("group", 7)
    assert prefix_key(req(0)) is None
    assert prefix_key(req(0, block_hashes=())) is None
    assert prefix_key(req(0, prefix_group=7)) != prefix_key(req(0, block_hashes=(7,)))


def test_prefix_affinity_sticks_to_the_first_choice_and_spills_only_past_the_cap():
    never = PrefixAffinityRouter()
    capped = PrefixAffinityRouter(PrefixAffinityConfig(max_imbalance=2))
    for router in (never, capped):
        assert router.route(req(0, prefix_group="a"), fake_instances([1, 0, 0])) == 1   # first seen: least loaded
        assert router.route(req(1, prefix_group="a"), fake_instances([0, 2, 0])) == 1   # 2 above: within the cap
    assert never.route(req(2, prefix_group="a"), fake_instances([0, 9, 0])) == 1
    assert capped.route(req(2, prefix_group="a"), fake_instances([0, 3, 0])) == 0       # 3 above the least: spill
    assert capped.route(req(3, prefix_group="a"), fake_instances([0, 1, 0])) == 1       # the group kept its home
    assert capped.route(req(4), fake_instances([2, 1, 0])) == 2                         # no prefix: least loaded


def test_prefix_affinity_follows_the_longest_match_of_block_hashes_past_the_threshold():
    # As SGLang's cache-aware router: a match over more than half the prompt's blocks goes where
    # it is held; a shorter one (a system prompt every request shares) to the least loaded.
    router = PrefixAffinityRouter()
    assert router.route(req(0, block_hashes=(0, 1, 2, 3)), fake_instances([1, 1, 0])) == 2    # nothing held
    assert router.route(req(1, block_hashes=(0, 5, 6, 7)), fake_instances([1, 0, 1])) == 1    # 1 of 4: least
    assert router.route(req(2, block_hashes=(0, 1, 2, 3, 4, 9)), fake_instances([0, 0, 1])) == 2   # 4 of 6 on 2
    assert router.route(req(3, block_hashes=(0, 5, 6)), fake_instances([0, 3, 0])) == 1        # 3 of 3 on 1
    assert router.route(req(4, block_hashes=(0, 1, 8, 8)), fake_instances([2, 2, 0])) == 2    # 2 of 4: least
    # (0, 1) is held by 2 now, twice over, and (0, 5) by 1: a 2-of-3 match goes to 2 ...
    assert router.route(req(5, block_hashes=(0, 1, 7)), fake_instances([0, 9, 4])) == 2
    # ... unless it is more than max_imbalance busier than the least loaded, and 0.9 asks for more
    capped = PrefixAffinityRouter(PrefixAffinityConfig(max_imbalance=2))
    strict = PrefixAffinityRouter(PrefixAffinityConfig(match_threshold=0.9))
    for router in (capped, strict):
        assert router.route(req(0, block_hashes=(0, 1, 2)), fake_instances([0, 1])) == 0
    assert capped.route(req(1, block_hashes=(0, 1, 2, 4)), fake_instances([3, 0])) == 1       # 3 above: spill
    assert strict.route(req(1, block_hashes=(0, 1, 2, 4)), fake_instances([0, 1])) == 0       # least anyway
    assert strict.route(req(2, block_hashes=(0, 1, 2, 5)), fake_instances([1, 0])) == 1       # 3 of 4 < 0.9


def test_class_router_uses_each_class_list_and_the_default():
    router = ClassRouter(ClassRoutingConfig(classes={"interactive": [0], "batch": [2, 1]}, default=(1, 2)))
    inst = fake_instances([5, 3, 1, 0])
    assert router.route(req(0, request_class="interactive"), inst) == 0
    assert router.route(req(1, request_class="batch"), inst) == 2
    assert router.route(req(2, request_class="other"), inst) == 2       # default [1, 2]; never 3
    assert router.route(req(3, request_class="batch"), fake_instances([0, 1, 1, 0])) == 1   # tie: lowest index
    everywhere = ClassRouter(ClassRoutingConfig(classes={"batch": [1]}))
    assert everywhere.route(req(4, request_class="chat"), fake_instances([2, 0, 3, 1])) == 1


def test_class_router_names_the_bad_index_and_the_cluster_size_on_first_use():
    router = ClassRouter(ClassRoutingConfig(classes={"interactive": [0], "batch": [1, 3]}))
    with pytest.raises(ConfigError, match=r"classes\.batch lists instance 3, but the cluster has 3 instances"):
        router.route(req(0, request_class="interactive"), fake_instances([0, 0, 0]))
    router = ClassRouter(ClassRoutingConfig(default=(0, 2)))
    with pytest.raises(ConfigError, match=r"default lists instance 2, but the cluster has 2 instances"):
        router.route(req(0), fake_instances([0, 0]))


def test_class_router_given_another_list_than_it_was_checked_against_says_it_needs_a_fixed_cluster():
    """Its lists name instances by number: checked against 3, then given 1 (an autoscaled pool,
    refused when a file is read) it said "the cluster has 1 instances", blaming the lists."""
    router = ClassRouter(ClassRoutingConfig(classes={"interactive": [0], "batch": [1, 2]}))
    router.check_cluster(3)
    assert router.route(req(0, request_class="batch"), fake_instances([0, 1, 0])) == 2
    with pytest.raises(ConfigError, match=r"^\[cluster.router\] kind = 'class': set up for a cluster of 3 instances, "
                                          r"but given 1 to choose from: its lists name instances by number, which "
                                          r"needs a fixed cluster \(not an autoscaled one\)$"):
        router.route(req(1, request_class="batch"), fake_instances([0]))
    with pytest.raises(ConfigError,
                       match=r"^default lists instance 1, but the cluster has 1 instance \(indices 0 to 0\)$"):
        ClassRouter(ClassRoutingConfig(default=(0, 1))).check_cluster(1)
    assert ClassRouter.names_instances and not getattr(LeastOutstandingRouter(), "names_instances", False)


def test_the_hash_router_is_modulo_hashing_so_a_scale_event_moves_most_groups_as_documented():
    """Its docstring and the README say so (they used to call it Envoy's ring hash): from N to
    N + 1 instances a group stays only when its hash is the same modulo both -- about 1/(N + 1)."""
    router = HashRouter()
    groups = [req(i, prefix_group=i) for i in range(1000)]
    for n in (4, 8):
        before = [router.route(r, fake_instances([0] * n)) for r in groups]
        after = [router.route(r, fake_instances([0] * (n + 1))) for r in groups]
        assert before == [zlib.crc32(repr(("group", i)).encode()) % n for i in range(1000)]
        moved = sum(a != b for a, b in zip(before, after)) / 1000
        assert moved == pytest.approx(n / (n + 1), abs=0.05)   # a ring: about 1 / (n + 1)


# -- several instances through TOML ------------------------------------------------------------------------

# Three requests at t=0, then four at t=20 ms. Linear costs (0.05 ms per prompt token, 8 ms per
# decode step), 200 KV blocks of 16 tokens per instance, KV reserved for prompt + output:
#   r0: 160 + 1440 tokens = 100 blocks, still running at t=20
#   r1:  16 +  784 tokens =  50 blocks, still running at t=20
#   r2:  16 +    2 tokens =   2 blocks, prefill 0.8 ms + one 8 ms decode: done at 8.8 ms
#   r3..r6: like r2, arriving at t=20
HAND_ROWS = [
    {"arrival_ms": 0, "prompt_tokens": 160, "output_tokens": 1440},
    {"arrival_ms": 0, "prompt_tokens": 16, "output_tokens": 784},
    {"arrival_ms": 0, "prompt_tokens": 16, "output_tokens": 2},
] + [{"arrival_ms": 20, "prompt_tokens": 16, "output_tokens": 2}] * 4

HAND_TOML = """
    [workload]
    kind = "file"
    path = "reqs.json"
    [kv_cache]
    kind = "paged"
    num_blocks = 200
    [cluster]
    instances = 3
    [[runs]]
    name = "round_robin"
    [[runs]]
    name = "least_outstanding"
    cluster = {router = {kind = "least_outstanding"}}
    [[runs]]
    name = "least_kv"
    cluster = {router = {kind = "least_kv"}}
    """


def test_load_aware_routers_place_requests_as_computed_by_hand(tmp_path):
    runs = run_toml(tmp_path, HAND_ROWS, HAND_TOML)
    assert placements(runs["round_robin"]) == [0, 1, 2, 0, 1, 2, 0]
    # t=0: queues [0,0,0] -> 0, [1,0,0] -> 1, [1,1,0] -> 2. t=20: r2 is done, queues [1,1,0]:
    # r3 -> 2, then [1,1,1] -> 0, [2,1,1] -> 1, [2,2,1] -> 2.
    assert placements(runs["least_outstanding"]) == [0, 1, 2, 2, 0, 1, 2]
    # t=0: no KV held yet, so outstanding decides (as above). t=20: KV usage [0.5, 0.25, 0]; the
    # new arrivals wait without KV, so instance 2 stays the emptiest and takes all four.
    assert placements(runs["least_kv"]) == [0, 1, 2, 2, 2, 2, 2]


def test_prefix_affinity_keeps_groups_together_as_computed_by_hand(tmp_path):
    groups = ["a", "b", "a", "c", None, "b", None, "d"]
    rows = [{"prompt_tokens": 32, "output_tokens": 4, "prefix_group": g, "prefix_tokens": 16 if g else 0}
            for g in groups]
    runs = run_toml(tmp_path, rows, """
        [workload]
        kind = "file"
        path = "reqs.json"
        [cluster]
        instances = 3
        router = {kind = "prefix_affinity"}
        [[runs]]
        name = "sticky"
        [[runs]]
        name = "spill"
        cluster = {router = {max_imbalance = 0}}
        """)
    # all at t=0, so each request adds one to its instance's queue:
    # a -> 0 (new: least loaded), b -> 1, a -> 0, c -> 2, none -> 1, b -> 1, none -> 2, d -> 0
    assert placements(runs["sticky"]) == [0, 1, 0, 2, 1, 1, 2, 0]
    # max_imbalance 0: a -> 0, b -> 1, a: home 0 has 1, instance 2 has 0 -> spill to 2; c -> 0 (tie),
    # none -> 1, b: home 1 has 2, instance 2 has 1 -> spill to 2; none -> 0, d -> 1
    assert placements(runs["spill"]) == [0, 1, 2, 0, 1, 2, 0, 1]


def test_prefix_affinity_keeps_a_mooncake_conversation_together_past_a_shared_system_prompt(tmp_path):
    # every prompt starts with the same block (a system prompt, hash 0, as in Mooncake's
    # conversation trace), then its conversation's history (h, 50 + h) and a new block: a later
    # turn matches 3 of 4 blocks where its conversation went; the shared block alone (1 of 4) is no
    # reason to follow anyone, so the conversations spread (before: all on one instance)
    first_hashes = [1, 2, 1, 3, 2, 1, 3, 4, 4, 1]
    lines = [json.dumps({"timestamp": 5 * i, "input_length": 2048, "output_length": 8,
                         "hash_ids": [0, h, 50 + h, 100 + i]}) for i, h in enumerate(first_hashes)]
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + "\n")
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent("""
        [workload]
        kind = "mooncake"
        path = "trace.jsonl"
        [cluster]
        instances = 3
        router = {kind = "prefix_affinity"}
        """))
    result = run_experiment(load(path)).all_runs()[0]
    where = placements(result)
    homes = {}
    for h, inst in zip(first_hashes, where):
        assert homes.setdefault(h, inst) == inst, f"hash {h} split over instances {homes[h]} and {inst}"
    assert len(set(where)) > 1


def test_class_routing_puts_each_class_on_its_instances(tmp_path):
    classes = ["interactive", "batch", "batch", "batch", "other", "interactive"]
    rows = [{"prompt_tokens": 20, "output_tokens": 3, "request_class": k} for k in classes]
    runs = run_toml(tmp_path, rows, """
        [workload]
        kind = "file"
        path = "reqs.json"
        [cluster]
        instances = 3
        router = {kind = "class", classes = {interactive = [0], batch = [1, 2]}}
        [[runs]]
        name = "with_default"
        cluster = {router = {default = [2]}}
        [[runs]]
        name = "default_all"
        """)
    # all at t=0: batch alternates 1, 2, 1 by queue length; "other" goes to the default
    assert placements(runs["with_default"]) == [0, 1, 2, 1, 2, 0]
    # default = all instances: queues are [1, 2, 1] when "other" arrives -> 0
    assert placements(runs["default_all"]) == [0, 1, 2, 1, 0, 0]


def test_class_routing_with_an_index_outside_the_cluster_fails_clearly(tmp_path):
    path = write_experiment(tmp_path, [{"prompt_tokens": 4, "output_tokens": 2, "request_class": "batch"}], """
        [workload]
        kind = "file"
        path = "reqs.json"
        [cluster]
        instances = 2
        router = {kind = "class", classes = {batch = [1, 2]}}
        """)
    with pytest.raises(ConfigError, match=r"classes\.batch lists instance 2, but the cluster has 2 instances"):
        run_experiment(load(path))


@pytest.mark.parametrize("router, message", [
    ('{kind = "class", classes = {batch = []}}', r"classes\.batch must be a non-empty list"),
    ('{kind = "class", classes = {batch = [1, 1]}}', r"classes\.batch lists instance 1 twice"),
    ('{kind = "class", classes = {batch = [-1]}}', r"whole numbers >= 0, got -1"),
    ('{kind = "class", classes = {batch = 1}}', r"classes\.batch must be a non-empty list"),
    ('{kind = "class", default = [0.5]}', r"default: every element must be"),
    ('{kind = "prefix_affinity", max_imbalance = -1}', r"max_imbalance: must be >= 0"),
    ('{kind = "least_kv", weight = 2}', r"takes no settings"),
    ('{kind = "shortest"}', r"\[cluster\.router\].*shortest"),
])
def test_bad_router_tables_fail_at_load_naming_the_table(tmp_path, router, message):
    path = write_experiment(tmp_path, [{"prompt_tokens": 4, "output_tokens": 2}], f"""
        [workload]
        kind = "file"
        path = "reqs.json"
        [cluster]
        instances = 2
        router = {router}
        """)
    with pytest.raises(ConfigError, match=message) as info:
        load(path)
    assert "exp.toml" in str(info.value)


# A workload with every kind of request: three classes, two prefix groups, staggered arrivals,
# lengths that preempt under "grow" allocation, and one request too large for any instance.
MIXED_ROWS = [
    {"arrival_ms": 3 * i, "prompt_tokens": 20 + (i * 37) % 150, "output_tokens": 2 + (i * 53) % 90,
     "request_class": ("interactive", "batch", "bulk")[i % 3],
     "prefix_group": (None, "sys-a", "sys-b")[(i // 2) % 3], "prefix_tokens": 16 if (i // 2) % 3 else 0}
    for i in range(40)
] + [{"arrival_ms": 200, "prompt_tokens": 900, "output_tokens": 400, "request_class": "batch"}]

MIXED_TOML = """
    [workload]
    kind = "file"
    path = "reqs.json"
    [scheduler]
    kind = "continuous"
    max_num_seqs = 4
    allocation = "grow"
    [kv_cache]
    kind = "paged"
    num_blocks = 30
    prefix_caching = true
    [cluster]
    instances = 3
    [[runs]]
    name = "round_robin"
    [[runs]]
    name = "least_outstanding"
    cluster = {router = {kind = "least_outstanding"}}
    [[runs]]
    name = "least_kv"
    cluster = {router = {kind = "least_kv"}}
    [[runs]]
    name = "prefix_affinity"
    cluster = {router = {kind = "prefix_affinity"}}
    [[runs]]
    name = "class"
    cluster = {router = {kind = "class", classes = {interactive = [0], batch = [1, 2], bulk = [2]}}}
    """


@pytest.fixture(scope="module")
def mixed_runs(tmp_path_factory):
    return run_toml(tmp_path_factory.mktemp("mixed"), MIXED_ROWS, MIXED_TOML)


@pytest.mark.parametrize("name", ["round_robin", "least_outstanding", "least_kv", "prefix_affinity", "class"])
def test_each_request_finishes_once_on_one_instance(mixed_runs, name):
    result = mixed_runs[name]
    req = result.requests
    assert sorted(req["id"].tolist()) == list(range(len(MIXED_ROWS)))   # each request recorded once
    assert set(req["instance"].tolist()) <= {0, 1, 2}
    rejected = req["rejected"] == 1
    assert req["id"][rejected].tolist() == [40]                          # only the oversized one
    targets = np.array([r["output_tokens"] for r in MIXED_ROWS])
    assert np.array_equal(req["generated_tokens"][~rejected], targets[req["id"][~rejected]])
    assert result.metrics["preemptions"]["recompute"] > 0   # the cache is tight: preemptions happen
    if name == "round_robin":
        assert placements(result) == [i % 3 for i in range(len(MIXED_ROWS))]
    if name == "prefix_affinity":
        for group in ("sys-a", "sys-b"):
            ids = [i for i, r in enumerate(MIXED_ROWS) if r.get("prefix_group") == group]
            assert len(set(req["instance"][ids].tolist())) == 1, group
    if name == "class":
        by_class = {k: set(req["instance"][req["request_class"] == k].tolist())
                    for k in ("interactive", "batch", "bulk")}
        assert by_class["interactive"] == {0} and by_class["bulk"] == {2} and by_class["batch"] <= {1, 2}


@pytest.mark.parametrize("name", ["round_robin", "least_outstanding", "least_kv", "prefix_affinity", "class"])
@pytest.mark.parametrize("section", ["per_instance", "per_class"])
def test_per_instance_and_per_class_metrics_add_up_to_the_run(mixed_runs, name, section):
    m = mixed_runs[name].metrics
    parts = m[section]
    expected_keys = {"0", "1", "2"} if section == "per_instance" else {"interactive", "batch", "bulk"}
    assert set(parts) == expected_keys
    for key in ("requests", "finished", "generated_tokens"):
        assert sum(p[key] for p in parts.values()) == m[key], key
    assert m["requests"] == len(MIXED_ROWS) and m["finished"] == len(MIXED_ROWS) - 1
    assert m["generated_tokens"] == sum(r["output_tokens"] for r in MIXED_ROWS[:-1])


def test_instance_column_matches_per_instance_counts(mixed_runs):
    result = mixed_runs["least_outstanding"]
    counts = np.bincount(result.requests["instance"], minlength=3).tolist()
    assert [result.metrics["per_instance"][str(i)]["requests"] for i in range(3)] == counts


def test_several_instance_runs_are_deterministic(tmp_path):
    again = run_toml(tmp_path, MIXED_ROWS, MIXED_TOML)
    first = run_toml(tmp_path, MIXED_ROWS, MIXED_TOML)
    for name in first:
        compare_runs(first[name], again[name], rel=0.0)


# -- random workloads -------------------------------------------------------------------------------------------

CLASSES = ("interactive", "batch", "other")


class SpyRouter:
    """Wraps a router; records what it saw and what it chose."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple] = []

    def route(self, request, instances):
        seen = [(inst.outstanding, inst.kv.num_used_blocks() / inst.kv.num_blocks) for inst in instances]
        index = self.inner.route(request, instances)
        self.calls.append((request, index, seen))
        return index


def first_min(values) -> int:
    best = 0
    for i, v in enumerate(values):
        if v < values[best]:
            best = i
    return best


def check_choice(kind: str, n: int, calls: list, class_lists: dict) -> None:
    """Each routing decision against the router's rule, recomputed from what the router saw."""
    homes: dict = {}
    for position, (request, index, seen) in enumerate(calls):
        outstanding = [o for o, _ in seen]
        if kind == "round_robin":
            assert index == position % n
        elif kind == "least_outstanding":
            assert index == first_min(outstanding)
        elif kind == "least_kv":
            assert index == first_min([(f, o) for o, f in seen])
        elif kind in ("prefix_affinity", "prefix_affinity_capped"):
            key, least = request.prefix_group, first_min(outstanding)
            if key is None:
                assert index == least
            else:
                home = homes.setdefault(key, least)
                spill = kind == "prefix_affinity_capped" and outstanding[home] - outstanding[least] > 1
                assert index == (least if spill else home)
        elif kind == "class":
            allowed = class_lists.get(request.request_class, list(range(n)))
            assert index == allowed[first_min([outstanding[i] for i in allowed])]
        elif kind == "hash":  # crc32 of the key's text, whatever the load
            key = prefix_key(request) or ("id", request.id)
            assert index == zlib.crc32(repr(key).encode()) % n


@st.composite
def cluster_cases(draw):
    requests = draw(requests_lists(max_size=14, prefix_groups=3))
    classes = draw(st.lists(st.sampled_from(CLASSES), min_size=len(requests), max_size=len(requests)))
    requests = [attrs.evolve(r, request_class=k) for r, k in zip(requests, classes)]
    return {
        "requests": requests,
        "instances": draw(st.integers(2, 4)),
        "router": draw(st.sampled_from(["round_robin", "least_outstanding", "least_kv", "prefix_affinity",
                                        "prefix_affinity_capped", "class", "hash"])),
        "max_num_seqs": draw(st.integers(1, 6)),
        "allocation": draw(st.sampled_from(["reserve", "grow"])),
        "kv_blocks": draw(st.integers(3, 16)),
        "prefix_caching": draw(st.booleans()),
    }


def make_router(kind: str, n: int):
    class_lists = {"interactive": [0], "batch": list(range(1, n))}
    if kind == "round_robin":
        return RoundRobinRouter(), class_lists
    if kind == "least_outstanding":
        return LeastOutstandingRouter(), class_lists
    if kind == "least_kv":
        return LeastKVRouter(), class_lists
    if kind == "prefix_affinity":
        return PrefixAffinityRouter(), class_lists
    if kind == "prefix_affinity_capped":
        return PrefixAffinityRouter(PrefixAffinityConfig(max_imbalance=1)), class_lists
    if kind == "hash":
        return HashRouter(), class_lists
    return ClassRouter(ClassRoutingConfig(classes=class_lists)), class_lists


def run_cluster(requests, n: int, router, *, max_num_seqs=4, allocation="grow", kv_blocks=16,
                prefix_caching=False, static=False):
    """Simulate ``requests`` on ``n`` identical instances; return the result and the KV caches."""
    rec = Recorder()
    kvs = [(PrefixKVCache if prefix_caching else PagedKVCache)(kv_blocks, 16) for _ in range(n)]
    if static:
        schedulers = [StaticScheduler(StaticConfig(batch_size=max_num_seqs)) for _ in range(n)]
    else:
        schedulers = [ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs, allocation=allocation))
                      for _ in range(n)]
    cost = LinearCostModel()
    instances = [Instance(i, schedulers[i], cost, kvs[i], rec) for i in range(n)]
    simulate(requests, instances, router=router)
    meta = {"instances": n, "slots": max_num_seqs * n, "num_blocks": kv_blocks * n, "block_size": 16}
    return RunResult.from_recorder("cluster", rec, settings={}, meta=meta,
                                   request_cost=cost.request_cost), kvs


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_cases())
def test_every_router_conserves_requests_on_random_workloads(case):
    n = case["instances"]
    inner, class_lists = make_router(case["router"], n)
    spy = SpyRouter(inner)
    requests = case["requests"]
    result, kvs = run_cluster(requests, n, spy, max_num_seqs=case["max_num_seqs"], allocation=case["allocation"],
                              kv_blocks=case["kv_blocks"], prefix_caching=case["prefix_caching"])
    # routed exactly once each, in arrival order, and recorded on the instance it was sent to
    assert [r.id for r, _, _ in spy.calls] == [r.id for r in requests]
    sent = {r.id: index for r, index, _ in spy.calls}
    req = result.requests
    assert {int(i): int(k) for i, k in zip(req["id"], req["instance"])} == sent
    check_run(result, requests, max_running=case["max_num_seqs"], kv_blocks=case["kv_blocks"])
    for kv in kvs:
        assert kv.num_used_blocks() == 0
        kv.check_invariants()
    check_choice(case["router"], n, spy.calls, class_lists)
    for section in ("per_instance", "per_class"):
        parts = result.metrics.get(section)
        if parts is not None:
            for key in ("requests", "finished", "generated_tokens"):
                assert sum(p[key] for p in parts.values()) == result.metrics[key]
    # instances do not interact in an open loop: replaying each instance's share of the requests
    # on a lone instance gives the same timestamps and counts for every request
    totals = {"iterations": 0, "generated_tokens": 0, "num_preemptions": 0}
    for i in range(n):
        share = [r for r in requests if sent[r.id] == i]
        if not share:
            continue
        alone, _ = run_cluster(share, 1, None, max_num_seqs=case["max_num_seqs"], allocation=case["allocation"],
                               kv_blocks=case["kv_blocks"], prefix_caching=case["prefix_caching"])
        rows = np.isin(req["id"], [r.id for r in share])
        for col, values in alone.requests.items():
            if col != "instance":
                assert values.tolist() == req[col][rows].tolist(), (i, col)
        for key in totals:
            totals[key] += alone.counters[key]
    for key, value in totals.items():
        assert result.counters[key] == value, key


# -- closed loops over two instances --------------------------------------------------------------------------


CLOSED_ROWS = [{"prompt_tokens": 30 + (i * 41) % 200, "output_tokens": 3 + (i * 29) % 70} for i in range(9)]


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv", "class"])
def test_closed_loop_over_two_instances_finishes_conserves_and_repeats(tmp_path, router):
    toml = f"""
        [workload]
        kind = "closed_loop"
        clients = 5
        num_requests = 40
        path = "reqs.json"
        request_class = "interactive"
        [scheduler]
        kind = "continuous"
        max_num_seqs = 3
        allocation = "grow"
        [kv_cache]
        kind = "paged"
        num_blocks = 40
        [cluster]
        instances = 2
        router = {{kind = "{router}"{', classes = {interactive = [1]}, default = [0]' if router == "class" else ""}}}
        """
    first = run_toml(tmp_path, CLOSED_ROWS, toml)
    again = run_toml(tmp_path, CLOSED_ROWS, toml)
    (name,) = first
    result = first[name]
    compare_runs(result, again[name], rel=0.0)
    req = result.requests
    assert req["id"].tolist() == list(range(40))
    assert req["rejected"].sum() == 0
    # request k takes file row k % 9 (rows used in order, cycling)
    assert req["generated_tokens"].tolist() == [CLOSED_ROWS[k % 9]["output_tokens"] for k in range(40)]
    assert result.metrics["generated_tokens"] == sum(CLOSED_ROWS[k % 9]["output_tokens"] for k in range(40))
    # a client's next request arrives exactly when its previous one finished (think time 0)
    for client in set(req["client"].tolist()):
        mine = np.flatnonzero(req["client"] == client)
        mine = mine[np.argsort(req["arrival_ms"][mine], kind="stable")]
        assert np.array_equal(req["arrival_ms"][mine][1:], req["finish_ms"][mine][:-1]), client
    used = set(req["instance"].tolist())
    assert used == ({1} if router == "class" else {0, 1})


# -- driver and metrics fixes ---------------------------------------------------------------------------------


class FixedRouter:
    def __init__(self, answer):
        self.answer = answer

    def route(self, request, instances):
        return self.answer


@pytest.mark.parametrize("answer", [-1, 2, 1.0, "1", None])
def test_a_router_returning_a_bad_index_is_a_clear_simulation_error(answer):
    requests = [Request(0, 0.0, 8, 2)]
    with pytest.raises(SimulationError, match=r"router FixedRouter returned .* for request 0; "
                                              r"expected an instance index from 0 to 1"):
        run_cluster(requests, 2, FixedRouter(answer))


def test_a_router_may_return_a_numpy_integer():
    result, _ = run_cluster([Request(0, 0.0, 8, 2), Request(1, 0.0, 8, 2)], 2, FixedRouter(np.int64(1)))
    assert result.requests["instance"].tolist() == [1, 1]


def test_slot_utilisation_counts_each_instance_slots_once():
    # Two instances, static batches of 2, four equal requests, round robin: every iteration of
    # each instance runs a full batch, so every slot of every iteration produces a token.
    requests = [Request(i, 0.0, 8, 5) for i in range(4)]
    result, _ = run_cluster(requests, 2, RoundRobinRouter(), max_num_seqs=2, static=True)
    assert result.metrics["iterations"] == 10        # 5 per instance: one prefill, four decodes
    assert result.metrics["generated_tokens"] == 20
    assert result.metrics["slot_utilisation"] == pytest.approx(1.0)


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
@pytest.mark.parametrize("clients", [2, 5])
def test_closed_loop_over_two_instances_is_exact(tmp_path, router, clients):
    """In a closed loop a request released by one instance and
    routed to another is served as if it had been known in advance: replaying each instance's
    requests, with the arrival times the loop gave them, as an open-loop workload on a lone
    instance reproduces every timestamp."""
    toml = f"""
        [workload]
        kind = "closed_loop"
        clients = {clients}
        num_requests = 30
        path = "reqs.json"
        [scheduler]
        kind = "continuous"
        max_num_seqs = 4
        allocation = "grow"
        [kv_cache]
        kind = "paged"
        num_blocks = 16
        [cluster]
        instances = 2
        router = {{kind = "{router}"}}
        """
    (result,) = run_toml(tmp_path, CLOSED_ROWS, toml).values()
    req = result.requests
    for i in (0, 1):
        rows = np.flatnonzero(req["instance"] == i)
        share = [Request(int(req["id"][k]), float(req["arrival_ms"][k]), int(req["prompt_tokens"][k]),
                         int(req["output_tokens"][k])) for k in rows]
        share.sort(key=lambda r: (r.arrival_ms, r.id))
        alone, _ = run_cluster(share, 1, None, max_num_seqs=4, kv_blocks=16)
        order = np.argsort(req["id"][rows])
        for col in ("first_scheduled_ms", "first_token_ms", "finish_ms", "preemptions"):
            assert alone.requests[col].tolist() == req[col][rows][order].tolist(), (i, col)


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv"])
def test_the_reference_engine_serves_several_instances_like_the_fast_one(tmp_path, router):
    """``engine = "reference"`` with ``instances = 2`` runs both instances (plain time order,
    closed loop included) and agrees with the fast engine's lockstep."""
    toml = f"""
        [workload]
        kind = "closed_loop"
        clients = 5
        num_requests = 40
        path = "reqs.json"
        [scheduler]
        kind = "continuous"
        max_num_seqs = 3
        allocation = "grow"
        [kv_cache]
        kind = "paged"
        num_blocks = 24
        [cluster]
        instances = 2
        router = {{kind = "{router}"}}
        [[runs]]
        name = "fast"
        [[runs]]
        name = "reference"
        engine = "reference"
        """
    runs = run_toml(tmp_path, CLOSED_ROWS, toml)
    compare_runs(runs["fast"], runs["reference"], rel=1e-12)
    assert set(runs["reference"].requests["instance"].tolist()) == {0, 1}

