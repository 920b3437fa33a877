"""The host-memory KV tier against the review of /tmp/review_hostkv (vLLM 0.33, SGLang HiCache).

* Write policy: ``write_through`` (the default of both real systems: vLLM's OffloadingConnector
  behind ``--kv-offloading-size``, SGLang's ``--hicache-write-policy``) copies every full block as
  it is computed, so the host holds copies of GPU blocks and the tiers do not add up;
  ``write_back`` copies at GPU eviction.
* Sizing: vLLM's ``--kv-offloading-size`` is summed over the ranks; SGLang's ``--hicache-size`` is
  GB per rank, ``--hicache-ratio`` 2 by default, and a tier no larger than the GPU pool is refused.
* Window models: a host copy carries its window layers' KV, so a host hit works under vLLM's
  hybrid KV manager (the OffloadingConnector offloads and looks up the window groups too).

Scenarios are the reviewer's s1 and s3 (``/tmp/review_hostkv``): requests A, B, C, D, A a second
apart, each a 64-token (s3: 320-token) shared prefix and one token of its own.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.model import Request
from schedlab.testing import (
    blocks_for_largest, check_run, compare_runs, dyadic_linear_costs, examples, requests_lists, run_engine,
)
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches.host_tier import HostTier
from schedlab_plugins.kv_caches.prefix import PrefixKVCache
from schedlab_plugins.kv_caches.radix import RadixKVCache
from schedlab_plugins.kv_caches.settings import PagedConfig, RadixConfig, build_paged, build_radix
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.schedulers.sglang import SglangConfig, SglangScheduler
from test_differential import continuous_configs
from test_prefix_cache import Seq, admit, req

ENGINES = ("fast", "reference")
G = lambda e: ("g", "s", e)  # noqa: E731
COST = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)


def presets():
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog

    return Presets.from_catalog(load_catalog(entry_points=False))


def abcda(prefix: int):
    """The reviewer's s1/s3 workload: groups A, B, C, D, A, one token each beyond the prefix."""
    return [Request(i, 1000.0 * i, prefix + 1, 1, prefix_group=g, prefix_tokens=prefix)
            for i, g in enumerate("ABCDA")]


def s1_run(kind, policy, engine):
    """6 GPU blocks of 16 tokens, 12 host blocks (s1)."""
    host = HostTier(12, bytes_per_block=2 ** 21, link_gbps=2.097152, latency_us=0.0, write_policy=policy)
    if kind == "paged":
        kv, scheduler = PrefixKVCache(6, 16, host=host), ContinuousScheduler(ContinuousConfig(max_num_seqs=4))
    else:
        kv, scheduler = RadixKVCache(6, 16, host=host), SglangScheduler(SglangConfig())
    return run_engine(abcda(64), scheduler, LinearCostModel(COST), kv, engine=engine), host


# --- finding 1: the write policy ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["paged", "radix"])
@pytest.mark.parametrize("engine", ENGINES)
def test_write_through_tiers_hold_copies_so_the_last_a_misses(kind, engine):
    # write-through: each request's 4 prefix blocks go to the host as they are computed. A, B, C
    # fill the 12 host blocks; D's 4 push A's out (its blocks left the GPU long ago: a 6-block
    # pool holds one request's 5). The second A misses in both tiers and recomputes 65 tokens,
    # copying its blocks again (B's go): 5 x 4 = 20 copies, 8 dropped, no reload.
    result, host = s1_run(kind, "write_through", engine)
    p, c = result.metrics["prefix_cache"], result.counters
    assert (p["hits"], p["host_hits"]) == (0, 0)
    assert (c["host_store_blocks"], c["host_evictions"], c["host_load_blocks"]) == (20, 8, 0)
    ttft = (result.requests["first_token_ms"] - result.requests["arrival_ms"]).tolist()
    assert ttft[4] == pytest.approx(65 * 0.5)


@pytest.mark.parametrize("kind", ["paged", "radix"])
@pytest.mark.parametrize("engine", ENGINES)
def test_write_back_tiers_add_up_so_the_last_a_reloads(kind, engine):
    # write-back (the old behaviour): only evicted blocks are copied, so A, B, C's 12 evicted
    # prefix blocks fill the host and the second A finds its 4 there (64 tokens, 1 computed).
    result, host = s1_run(kind, "write_back", engine)
    p = result.metrics["prefix_cache"]
    assert (p["hits"], p["host_hits"]) == (64, 64)
    # 4 blocks x 2 MiB over 2.097152 GB/s: 4 ms of reload, then one token
    ttft = (result.requests["first_token_ms"] - result.requests["arrival_ms"]).tolist()
    assert ttft[4] == pytest.approx(4.0 + 0.5)


def test_write_through_copies_at_computation_and_an_eviction_costs_no_copy():
    # B=4, 4 GPU blocks, host 8. A's system-prompt blocks g3, g7 reach the host when they are
    # computed; B's 4 unique blocks evict them from the GPU without a second copy; C reloads them.
    host = HostTier(8, write_policy="write_through")
    cache = PrefixKVCache(4, 4, host=host)
    a = Seq(req(0, 9, 4, prefix_group="s", prefix_tokens=8))
    admit(cache, a)
    assert host.lru_keys() == [G(3), G(7)] and host.stored == 2     # before any eviction
    cache.free(a)
    b = Seq(req(1, 16))
    admit(cache, b)
    assert cache.cached_keys() == set() and host.stored == 2 and host.lru_keys() == [G(3), G(7)]
    cache.free(b)  # b's own 4 full blocks are copied as it leaves (vLLM's connector stores every full block)
    assert host.stored == 2 + 4 and host.lru_keys() == [G(3), G(7)] + [("r", 1, j) for j in (3, 2, 1, 0)]
    c = Seq(req(2, 10, 4, prefix_group="s", prefix_tokens=8))
    assert admit(cache, c) == 8 and host.loaded == 2 and host.stored == 6
    cache.check_invariants()


def test_radix_write_through_backs_up_a_node_at_insertion():
    host = HostTier(8, write_policy="write_through")
    cache = RadixKVCache(4, 4, host=host)
    a = Seq(req(0, 9, 4, prefix_group="s", prefix_tokens=8))
    admit(cache, a)
    assert set(host.lru_keys()) == {G(3), G(7)} and host.stored == 2
    cache.free(a)
    admit(cache, Seq(req(1, 16)))   # its 4 blocks join the tree, backed up; (g3, g7) is evicted: no new copy
    assert cache.cached_keys() == {("r", 1, j) for j in range(4)}
    assert host.stored == 2 + 4 and host.lru_keys()[:2] == [G(7), G(3)] and host.evicted == 0
    cache.check_invariants()


def test_the_settings_default_to_write_through():
    assert build_paged(PagedConfig(prefix_caching=True, host_blocks=4, bytes_per_block=0)).host.write_policy == "write_through"
    kv = build_radix(RadixConfig(num_blocks=10, block_size=4, host_blocks=11, bytes_per_block=0))
    assert kv.host.write_policy == "write_through"
    kv = build_paged(PagedConfig(prefix_caching=True, host_blocks=4, write_policy="write_back", bytes_per_block=0))
    assert kv.host.write_policy == "write_back"


SETTINGS = settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = {"paged": lambda n, bs, host: PrefixKVCache(n, bs, host=host),
         "radix": lambda n, bs, host: RadixKVCache(n, bs, host=host)}


@SETTINGS
@given(requests_lists(min_size=2, max_size=12, max_prompt=40, max_output=20, prefix_groups=3), continuous_configs(),
       st.integers(1, 6), st.integers(0, 12), st.integers(0, 24), st.sampled_from(sorted(KINDS)),
       dyadic_linear_costs())
def test_fast_engine_matches_reference_with_a_write_through_tier(requests, cfg, block_size, spare, host_blocks,
                                                                 kind, cost):
    need = blocks_for_largest(requests, block_size)
    runs, hosts = {}, {}
    for engine in ENGINES:
        hosts[engine] = host = HostTier(host_blocks, bytes_per_block=2 ** 20, link_gbps=2 ** 22 / 1e6,
                                        latency_us=125.0, write_policy="write_through")
        kv = KINDS[kind](need + spare, block_size, host)
        runs[engine] = run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(cost), kv, engine=engine)
    compare_runs(runs["fast"], runs["reference"], rel=1e-12)
    assert hosts["fast"].lru_keys() == hosts["reference"].lru_keys()
    check_run(runs["fast"], requests, kv_blocks=need + spare)
    c = runs["fast"].counters
    assert c["host_store_blocks"] == len(hosts["fast"]) + c["host_evictions"]


# --- finding 3: sizing --------------------------------------------------------------------------


def test_vllm_offloading_size_is_summed_over_the_tensor_parallel_ranks():
    # Llama-3.1-8B, H100, 16-token blocks: 2 MiB a block on one rank, 1 MiB on each of two.
    # 64 GiB is the whole instance's: 32,768 blocks either way (vLLM: size / world size a rank).
    p = presets()
    one = build_paged(PagedConfig(model="llama-3.1-8b", gpu="h100-80gb", prefix_caching=True, host_memory_gib=64), p)
    two = build_paged(PagedConfig(model="llama-3.1-8b", gpu="h100-80gb", prefix_caching=True, host_memory_gib=64,
                                  tensor_parallel=2), p)
    assert one.host.capacity == 32768 and two.host.capacity == 32768
    assert two.host.bytes_per_block * 2 == one.host.bytes_per_block


def test_sglang_hicache_size_is_gb_per_rank_and_the_ratio_sizes_it_otherwise():
    # 64 MiB blocks: 64 GB (10**9 bytes) hold 953 of them, not the 1,024 of 64 GiB
    kv = build_radix(RadixConfig(num_blocks=100, block_size=512, bytes_per_block=2 ** 26, host_memory_gb=64))
    assert kv.host.capacity == 953
    # no size: hicache_ratio (2.0) x the GPU pool
    assert build_radix(RadixConfig(num_blocks=10, block_size=4, hierarchical_cache=True,
                                   bytes_per_block=0)).host.capacity == 20
    assert build_radix(RadixConfig(num_blocks=10, block_size=4, hierarchical_cache=True,
                                   hicache_ratio=2.55, bytes_per_block=0)).host.capacity == 25
    assert build_radix(RadixConfig(num_blocks=10, block_size=4)).host is None


def _kv_text(table):
    return ('[workload]\nkind = "synthetic"\nnum_requests = 3\nrate = 1.0\n'
            'prompt = {dist = "fixed", value = 10}\noutput = {dist = "fixed", value = 3}\n'
            f'[kv_cache]\nkind = "radix"\nnum_blocks = 10\nblock_size = 4\nbytes_per_block = 4096\n{table}\n')


@pytest.mark.parametrize("table, message", [
    ("host_blocks = 10", "[kv_cache]: host_blocks: a host tier of 10 blocks is not larger than the GPU pool's 10"),
    ("hierarchical_cache = true\nhicache_ratio = 1.0",
     "[kv_cache]: hicache_ratio: a host tier of 10 blocks is not larger than the GPU pool's 10"),
    ("host_memory_gib = 64", "[kv_cache]: host_memory_gib: SGLang sizes HiCache per rank in GB"),
])
def test_a_radix_host_tier_no_larger_than_the_gpu_pool_is_refused(validated, table, message):
    code, err, _ = validated(_kv_text(table))
    assert code == 2 and message in err and "\n" not in err.strip()


# --- finding 2: window models -------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("host_blocks", [112, 111])
def test_a_window_model_hits_its_prefix_in_the_host_tier(engine, host_blocks):
    # s3: gpt-oss-20b (128-token window layers, one window group) on an H100 with vLLM's hybrid KV
    # manager, 70 GPU blocks. Each request's 20 prefix blocks go to the host as computed, with the
    # window KV of the 8 before its replay boundary (20 - ceil(127 / 16) .. 19): a page of the window
    # group each, 28 pages a request (review kvtier82: they took none). 4 x 28 = 112 fit, so the
    # second A finds its whole 320-token prefix on the host and reloads 20 + 8 pages; in 111 the
    # last copy evicts A's first block, and A finds nothing.
    kv = build_paged(PagedConfig(model="gpt-oss-20b", gpu="h100-80gb", num_blocks=70, block_size=16,
                                 prefix_caching=True, host_blocks=host_blocks), presets())
    assert kv.sizing.window.groups == 1
    scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=1024))
    result = run_engine(abcda(320), scheduler, LinearCostModel(COST), kv, engine=engine)
    p = result.metrics["prefix_cache"]
    if host_blocks == 112:
        assert (p["hits"], p["gpu_hits"], p["host_hits"]) == (320, 0, 320)
        assert (p["host_loaded_blocks"], p["host_stored_blocks"], p["host_evicted_blocks"]) == (28, 112, 0)
    else:
        assert p["hits"] == 0 and p["host_stored_blocks"] == 5 * 28
        assert p["host_evicted_blocks"] == 5 * 28 - 111
    kv.check_invariants()


# --- review kvtier82: a window copy's pages --------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("groups, pages", [(1, 7 + 4 * 1), (3, 7 + 4 * 3)])
def test_a_host_reload_moves_the_window_pages_its_copies_carry(engine, groups, pages):
    # 4-token blocks of 1 MiB over a link of one block a ms, a 16-token window in ``groups`` groups: a
    # hit needs the window blocks of its last ceil(15 / 4) = 4 positions. A computes a 40-token
    # prefix (written through), B pushes it off the GPU, the second A finds 36 tokens: 7 blocks
    # on the host (2 still on the GPU), the last 4 with their window KV -- 7 + 4 x groups pages, a ms
    # each. (The window pages were loaded free: 7 ms whatever the groups.)
    from schedlab.kv_window import SlidingWindow

    def request(i, t, hashes):
        return Request(i, float(t), 40, 1, block_hashes=tuple(hashes), hash_block_tokens=4)

    requests = [request(0, 0, range(100, 110)), request(1, 100, range(200, 210)), request(2, 200, range(100, 110))]
    host = HostTier(64, bytes_per_block=2 ** 20, link_gbps=2 ** 20 / 1e6, write_policy="write_through")
    kv = PrefixKVCache(10 + 10 * groups + 2, 4, window=SlidingWindow(groups, 16, 4), host=host, bytes_per_block=2 ** 20)
    result = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1, allocation="grow")),
                        LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0)), kv,
                        engine=engine)
    assert list(result.requests["cached_tokens"]) == [0, 0, 36]
    assert result.counters["host_load_blocks"] == pages
    assert result.counters["host_load_ms"] == pytest.approx(pages)
    host.check_invariants()


def test_a_window_copy_takes_its_pages_of_the_tier():
    # 5 pages: a plain block (1), a window copy of 2 groups (3) -> 4 held; a third key (1) fits,
    # a window copy more (3) evicts the two oldest (1 + 3 pages); a held key gaining its window
    # pages evicts others, never itself.
    host = HostTier(5)
    host.store("a", 0)
    host.store("b", 1, window=2)
    host.store("c", 2)
    assert (host.used, host.lru_keys(), host.evicted) == (5, ["a", "b", "c"], 0)
    host.store("d", 3, window=2)
    assert (host.used, host.lru_keys(), host.evicted) == (4, ["c", "d"], 4)
    host.store("c", 2, window=2)    # c is the oldest: room for its 2 pages would evict c itself
    assert (host.used, host.has_window("c"), host.lru_keys(), host.evicted) == (4, False, ["c", "d"], 4)
    host.store("e", 4)
    host.store("e", 4, window=2)    # e gains 2 pages: c (1) and d (3) go
    assert (host.used, host.has_window("e"), host.lru_keys(), host.evicted) == (3, True, ["e"], 8)
    host.load(["e"])
    assert host.loaded == 3
    assert host.stored == host.used + host.evicted == 11
    host.check_invariants()
    tiny = HostTier(2)
    tiny.store("w", 0, window=2)     # a tier too small for the copy keeps the block alone
    assert (tiny.used, tiny.has_window("w")) == (1, False)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shared, cached, ttft", [(8, 0, 9 * 0.5), (9, 0, 10 * 0.5), (10, 10, 0.5 + 10.0),
                                                  (12, 12, 0.5 + 12.0)])
def test_hicache_computes_a_host_hit_under_ten_tokens_again(engine, shared, cached, ttft):
    # Review kvtier82: SGLang's HiRadixCache.load_back skips a load of fewer than load_back_threshold
    # = 10 tokens (the request computes them). One-token pages (SGLang's default page_size), 0.5 ms a
    # prompt token, a host link of a page a ms: request 1 pushes the shared prefix off the 38-token
    # pool, request 2 finds it on the host only -- 8 or 9 tokens are computed again, 10 or more loaded.
    requests = [Request(0, 0.0, shared + 1, 1, prefix_group="s", prefix_tokens=shared), Request(1, 100.0, 31, 1),
                Request(2, 200.0, shared + 1, 1, prefix_group="s", prefix_tokens=shared)]
    host = HostTier(200, bytes_per_block=2 ** 20, link_gbps=2 ** 20 / 1e6, write_policy="write_through")
    result = run_engine(requests, SglangScheduler(SglangConfig(max_running_requests=1)),
                        LinearCostModel(LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0)),
                        RadixKVCache(38, 1, host=host, bytes_per_block=2 ** 20), engine=engine)
    assert list(result.requests["cached_tokens"]) == [0, 0, cached]
    assert result.metrics["prefix_cache"]["host_hits"] == cached == result.counters["host_load_blocks"]
    assert float(result.requests["first_token_ms"][2] - result.requests["arrival_ms"][2]) == pytest.approx(ttft)
