"""The host-memory KV tier under the prefix caches (vLLM CPU offloading, SGLang HiCache).

Hand-computed cases first (``gK`` is the key of a shared-prefix block whose last token is K, B
the block size); then a stateful test against a shadow model of both tiers (the shadow of
``test_prefix_cache`` with a host list added), conservation of blocks across the tiers for
both caches, the engines' reload timings by hand, and the fast engine against the reference
engine with the tier on.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from schedlab.configs import FieldError
from schedlab.errors import ConfigError
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
from schedlab_plugins.schedulers.sglang import SglangScheduler
from test_differential import continuous_configs
from test_prefix_cache import OPS, Driver, Seq, Shadow, SwappingMachine, admit, make_request, req, spec_key
from test_sglang import rejections_for, sglang_configs, whole_pages

G = lambda e: ("g", "s", e)  # noqa: E731
ENGINES = ("fast", "reference")


# --- the tier on its own ------------------------------------------------------------------------


def test_the_tier_is_an_lru_of_keys_that_copies_a_key_once():
    host = HostTier(2)
    host.store(G(3), 0)
    host.store(G(7), 1)
    host.store(G(3), 0)                 # held already: not copied again, keeps its place
    assert host.lru_keys() == [G(3), G(7)] and host.stored == 2
    host.store(G(11), 2)                # full: the least recently used goes
    assert host.lru_keys() == [G(7), G(11)] and host.evicted == 1
    assert host.index_of(G(3)) is None and host.index_of(G(11)) == 2
    host.load([G(7)])                   # a load makes it the most recently used
    assert host.lru_keys() == [G(11), G(7)] and host.loaded == 1
    host.check_invariants()
    empty = HostTier(0)
    empty.store(G(3), 0)
    assert empty.lru_keys() == [] and empty.stored == 0


def test_reload_time_is_bytes_over_the_link_plus_the_latency():
    # Llama-3-8B, 16-token blocks: 2 MiB each; an A100's PCIe 4 link, 32 GB/s; 10 us per reload.
    host = HostTier(100, bytes_per_block=2 * 2 ** 20, link_gbps=32.0, latency_us=10.0)
    # 5 x 2,097,152 B / 32e9 B/s = 0.32768 ms, + 0.01 ms
    assert host.load_ms(5) == pytest.approx(0.33768, rel=1e-12)
    assert host.load_ms(0) == 0.0


# --- the tier under vLLM's block pool: hand-computed ---------------------------------------------------


def shared(rid, prompt, output=4):
    """A request whose first 8 tokens are the system prompt ``s`` (blocks g3 and g7 at B = 4)."""
    return Seq(req(rid, prompt, output, prefix_group="s", prefix_tokens=8))


def test_gpu_evictions_go_to_the_host_and_a_gpu_miss_reloads_from_there():
    # B=4, 4 GPU blocks, 8 host blocks.
    host = HostTier(8)
    cache = PrefixKVCache(4, 4, host=host)
    a = shared(0, 9)
    admit(cache, a)
    cache.free(a)
    # A's blocks g3, g7 stay cached; its partial block went to the head of the free queue
    assert cache.free_queue_layout() == [2, G(7), G(3)]
    b = Seq(req(1, 16))                       # 4 unique blocks: everything is evicted, g7 first
    admit(cache, b)
    assert cache.cached_keys() == set()
    assert host.lru_keys() == [G(7), G(3)] and host.stored == 2
    cache.free(b)
    c = shared(2, 10)
    # both system-prompt blocks are found, on the host; 2 tokens are computed
    assert cache.cached_tokens(c) == 8
    assert cache.blocks_needed(c, 2, cached_tokens=8) == 3      # 2 loaded + 1 computed, all fresh
    assert admit(cache, c) == 8
    assert host.loaded == 2
    # loaded in order (g7 now the most recent), then the 3 fresh blocks evicted b's own full blocks from
    # the GPU, last first (b kept their keys when it left, as vLLM hashes them): written back to the host
    R = lambda j: ("r", 1, j)  # noqa: E731
    assert host.lru_keys() == [G(3), G(7), R(3), R(2), R(1)] and host.stored == 5
    assert {k: cache.ref_count(k) for k in cache.cached_keys()} == {G(3): 1, G(7): 1, R(0): 0}
    assert cache.num_free_blocks() == 1
    cache.check_invariants()
    # once on the GPU again, a hit is a GPU hit: nothing more is loaded (the fresh block evicts b's first)
    d = shared(3, 12)
    assert admit(cache, d) == 8 and host.loaded == 2
    assert host.lru_keys() == [G(3), G(7), R(3), R(2), R(1), R(0)]
    cache.check_invariants()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_finished_requests_own_blocks_fill_the_tier_as_vllms_connector_stores_them(engine):
    """KV review s79: vLLM's OffloadingConnector stores every full block a request computes, its own prompt
    tail and output too, so a request of unique content pushes a shared prefix out of a small tier; the
    paged tier copied only blocks with a shared identity, and served a hit vLLM would have lost."""
    host = HostTier(2, bytes_per_block=2 * 2 ** 20, link_gbps=4.194304, latency_us=10.0,
                    write_policy="write_through")
    kv = PrefixKVCache(3, 4, host=host, bytes_per_block=2 * 2 ** 20, host_link_gbps=4.194304)
    requests = [
        Request(0, 0.0, 8, 1, prefix_group="A", prefix_tokens=8),    # 2 shared blocks, copied as computed
        Request(1, 10.0, 12, 1),                                     # 3 blocks of its own: the GPU's 3
        Request(2, 20.0, 9, 1, prefix_group="A", prefix_tokens=8),   # the shared prefix again
    ]
    scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=1, allocation="grow"))
    result = run_engine(requests, scheduler, LinearCostModel(COST), kv, engine=engine)
    assert result.metrics["rejected"] == 0
    # request 1's 3 blocks go to the 2-block tier as it leaves, pushing A's 2 out: request 2 finds nothing
    # in either tier, computes its 9 tokens, and copies A's 2 blocks again
    assert result.requests["first_token_ms"][2] - 20.0 == pytest.approx(9 * 0.5)
    assert result.metrics["prefix_cache"]["host_hits"] == 0
    assert result.counters["host_store_blocks"] == 2 + 3 + 2
    assert host.lru_keys() == [("g", "A", 3), ("g", "A", 7)]


def test_a_hit_continues_on_the_host_after_a_gpu_miss_block_by_block():
    # B=4, 3 GPU blocks, host 4. g3 is on the GPU, g7 only on the host: the hit is both.
    host = HostTier(4)
    cache = PrefixKVCache(3, 4, host=host)
    a = shared(0, 9)
    admit(cache, a)
    cache.free(a)                              # queue: [1 anonymous, g7, g3]
    b = Seq(req(1, 8))                         # 2 blocks: the anonymous one, then g7 (to the host)
    admit(cache, b)
    assert cache.cached_keys() == {G(3)} and host.lru_keys() == [G(7)]
    cache.free(b)
    c = shared(2, 10)
    assert cache.cached_tokens(c) == 8
    # g3 is referenced again (it was free: it leaves the free pool), g7 is loaded into a fresh
    # block, and 2 tokens are computed in a third fresh block: 1 + 2 blocks leave the pool
    assert cache.blocks_needed(c, 2, cached_tokens=8) == 3
    admit(cache, c)
    assert host.loaded == 1
    assert {k: cache.ref_count(k) for k in cache.cached_keys()} == {G(3): 1, G(7): 1}
    cache.check_invariants()


def test_the_hit_leaves_a_token_to_compute_across_tiers():
    host = HostTier(4)
    cache = PrefixKVCache(2, 4, host=host)
    a = shared(0, 9)
    a.request = req(0, 8, prefix_group="s", prefix_tokens=8)
    admit(cache, a)                            # 8 tokens: g3 and g7, both full
    cache.free(a)
    filler = Seq(req(1, 8))
    admit(cache, filler)                       # both evicted to the host
    assert host.lru_keys() == [G(7), G(3)]
    cache.free(filler)
    again = Seq(req(2, 8, prefix_group="s", prefix_tokens=8))
    # vLLM 0.33: the GPU finds nothing; the connector looks up 8 // 4 = 2 blocks from there and
    # loads both, and the scheduler computes the last token again once the load is in
    # (num_computed_tokens = 8 - 1), where the GPU alone would stop at (8 - 1) // 4 = 1 block
    assert cache.cached_tokens(again) == 7
    assert cache.blocks_needed(again, 1, cached_tokens=7) == 2   # both loaded into fresh blocks
    admit(cache, again)
    assert host.loaded == 2
    assert again.num_computed_tokens == 8
    assert {k: cache.ref_count(k) for k in cache.cached_keys()} == {G(3): 1, G(7): 1}
    cache.check_invariants()


def test_a_whole_prompt_on_the_gpu_loads_its_last_block_from_a_write_through_host():
    # B=4, 4 GPU blocks. A (8 tokens, both blocks a shared prefix) leaves g3 and g7 cached on the
    # GPU, copied to the host as computed. B, the same 8 tokens: the GPU's lookup stops at
    # (8 - 1) // 4 = 1 block (g3, referenced); the connector's starts there and finds g7 on the
    # host, loaded into a fresh block beside the GPU's own copy (vLLM allocates it afresh)
    host = HostTier(4, write_policy="write_through")
    cache = PrefixKVCache(4, 4, host=host)
    a = Seq(req(0, 8, prefix_group="s", prefix_tokens=8))
    admit(cache, a)
    cache.free(a)
    assert cache.cached_keys() == {G(3), G(7)} and sorted(host.lru_keys()) == sorted([G(3), G(7)])
    b = Seq(req(1, 8, prefix_group="s", prefix_tokens=8))
    assert cache.cached_tokens(b) == 7
    assert cache.blocks_needed(b, 1, cached_tokens=7) == 2      # g3 revived + one fresh for g7
    admit(cache, b)
    assert host.loaded == 1
    cache.check_invariants()


def test_a_whole_prompt_on_the_gpu_alone_recomputes_its_last_block():
    # the same, write-back: nothing reached the host, the GPU's hit stops a block short
    host = HostTier(4)
    cache = PrefixKVCache(4, 4, host=host)
    a = Seq(req(0, 8, prefix_group="s", prefix_tokens=8))
    admit(cache, a)
    cache.free(a)
    assert host.lru_keys() == []
    b = Seq(req(1, 8, prefix_group="s", prefix_tokens=8))
    assert cache.cached_tokens(b) == 4
    admit(cache, b)
    assert host.loaded == 0 and b.num_computed_tokens == 8


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("first_token", ["decode", "prefill"])
def test_a_decode_instance_pulls_a_whole_block_prompts_last_block_and_loads_nothing(engine, first_token):
    # A decode instance with a write-through host tier; two requests with the same 32-token prompt
    # (2 blocks of 16, 1 MiB a token). R0 (at 0) is prefilled in 16 ms and pulls 32 MiB: 2 ms + 0.5,
    # lands 18.5; its blocks are copied to the host as they are identified. R1 (at 200, prefilled by
    # 216) finds its first block on the GPU and pulls the second, 16 MiB: 1 ms + 0.5, lands 217.5. The
    # host holds that block too, but a decode instance computes none of the prompt: the pull brings it
    # (it was loaded as well, the later of the two landing it: 220.125; review s80 diff).
    from test_disaggregated import MIB, by_id, pool, run

    def decode_kv(num_blocks, block_size, bytes_per_block):
        host = HostTier(64, bytes_per_block=bytes_per_block, link_gbps=2 ** 22 / 1e6, latency_us=125.0,
                        write_policy="write_through")
        return PrefixKVCache(num_blocks, block_size, bytes_per_block=bytes_per_block, host=host)

    requests = [Request(i, t, 32, 3, prefix_group="s", prefix_tokens=32) for i, t in ((0, 0.0), (1, 200.0))]
    r = run(requests, pool(16), pool(16, kv=decode_kv), engine, first_token=first_token)
    assert by_id(r, "kv_landed_ms") == {0: 18.5, 1: 217.5}
    assert {i: b / MIB for i, b in by_id(r, "kv_bytes").items()} == {0: 32.0, 1: 16.0}
    assert r.counters["host_load_blocks"] == 0


# --- the tier under SGLang's radix tree: hand-computed ----------------------------------------------


def test_radix_evicted_nodes_go_to_the_host_tail_first_and_come_back_on_a_match():
    # B=4, 4 GPU blocks, host 6. A's 2 system-prompt blocks form one node, evicted whole.
    host = HostTier(6)
    cache = RadixKVCache(4, 4, host=host, load_back_threshold=0)  # (the tier's order, not HiCache's 10 tokens)
    a = shared(0, 9)
    admit(cache, a)
    cache.free(a)              # finished: its full blocks (g3, g7) stay in the tree, unlocked
    assert cache.cached_keys() == {G(3), G(7)}
    b = Seq(req(1, 16))        # needs all 4 blocks: 2 free, then the node (g3, g7) is evicted
    admit(cache, b)
    assert cache.cached_keys() == {("r", 1, 0), ("r", 1, 1), ("r", 1, 2), ("r", 1, 3)}
    assert host.lru_keys() == [G(7), G(3)]     # the node's last block first: its head lives longer
    cache.free(b)              # b's 4 blocks now a tree node, unlocked
    c = shared(2, 10)
    assert cache.cached_tokens(c) == 8
    assert admit(cache, c) == 8 and host.loaded == 2
    # the loaded blocks are a new node locked by c; b's node was evicted for the 3 fresh blocks,
    # to the host as well, after the loads had made g3, g7 the most recent
    assert {path: (keys, lock) for path, (keys, lock, _) in cache.layout().items()} == {(G(3), G(7)): ((G(3), G(7)), 1)}
    assert host.lru_keys() == [G(3), G(7), ("r", 1, 3), ("r", 1, 2), ("r", 1, 1), ("r", 1, 0)]
    cache.check_invariants()


# --- settings ---------------------------------------------------------------------------------------


def test_host_memory_is_sized_from_the_models_bytes_per_block():
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog

    presets = Presets.from_catalog(load_catalog(entry_points=False))
    kv = build_paged(PagedConfig(model="llama-3-8b", gpu="h100-80gb", block_size=512, prefix_caching=True,
                                 host_memory_gib=64), presets)
    # Llama-3-8B: 128 KiB per token, 64 MiB per 512-token block: 64 GiB hold 1,024 blocks; the
    # H100's host link is 64 GB/s: a block reloads in 67,108,864 / 64e9 s = 1.048576 ms
    assert kv.host.capacity == 1024
    assert kv.host.load_ms(1) == pytest.approx(1.048576 + 0.010, rel=1e-12)
    radix = build_radix(RadixConfig(num_blocks=6, block_size=4, host_blocks=7, host_link_latency_us=0.0,
                                    bytes_per_block=0))
    assert radix.host.capacity == 7 and radix.host.load_ms(3) == 0.0   # bytes_per_block = 0: free reloads, asked for
    # without a block's bytes, a tier in blocks (or SGLang's ratio of the pool) would reload for free, silently
    for table in ({"host_blocks": 7}, {"hierarchical_cache": True}):
        with pytest.raises(FieldError, match=r"(host_blocks|hierarchical_cache): moves blocks over the host link, "
                                             r"timed by their size: set bytes_per_block"):
            build_radix(RadixConfig(num_blocks=6, block_size=4, **table))
    with pytest.raises(FieldError, match=r"swap_blocks: moves blocks over the host link"):
        build_paged(PagedConfig(num_blocks=6, block_size=4, swap_blocks=4))
    assert build_paged(PagedConfig(num_blocks=6, block_size=4, swap_blocks=4, bytes_per_block=1024)).swap_blocks == 4
    assert build_paged(PagedConfig(prefix_caching=True)).host is None


@pytest.mark.parametrize("table, message", [
    ({"prefix_caching": True, "host_memory_gib": 4, "host_blocks": 8},
     "host_blocks: give host_memory_gib or host_blocks"),
    ({"prefix_caching": True, "host_memory_gib": 4}, "host_memory_gib: needs bytes_per_block, or model and gpu"),
    ({"host_blocks": 8}, "host_blocks: a host-memory tier keeps prefix-cache blocks: needs prefix_caching = true"),
    ({"prefix_caching": True, "host_blocks": -1}, "host_blocks: must be >= 0"),
])
def test_bad_host_settings_are_one_line_errors(table, message):
    from schedlab.configs import from_table

    with pytest.raises(ConfigError) as err:
        from_table(PagedConfig, table, where="x.toml: [kv_cache]")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kv, message", [
    ('kind = "paged"\nprefix_caching = true\nhost_memory_gib = 1\n',
     "host_memory_gib: counts blocks of bytes_per_block bytes, and bytes_per_block = 0: give host_blocks instead"),
    ('kind = "radix"\nhost_memory_gb = 1\n',
     "host_memory_gb: counts blocks of bytes_per_block bytes, and bytes_per_block = 0: give host_blocks instead"),
    ('kind = "paged"\nswap_space_gib = 1\n',
     "swap_space_gib: counts blocks of bytes_per_block bytes, and bytes_per_block = 0: give swap_blocks instead")])
def test_a_size_in_bytes_with_blocks_of_0_bytes_is_an_error_not_a_division_by_zero(validated, kv, message):
    """KV review s79: bytes_per_block = 0 (copies that take no time) beside model and gpu and a host tier in
    GiB / GB raised ZeroDivisionError; swap space had a FieldError."""
    code, err, _ = validated('[workload]\nkind = "synthetic"\nnum_requests = 3\nrate = 1.0\n'
                             'prompt = {dist = "fixed", value = 10}\noutput = {dist = "fixed", value = 3}\n'
                             '[kv_cache]\nmodel = "llama-3-8b"\ngpu = "a100-40gb"\nbytes_per_block = 0\n' + kv)
    assert code == 2
    assert err.strip().endswith(f"[kv_cache]: {message} (or bytes_per_block > 0)"), err
    assert "\n" not in err.strip()


def test_a_host_tier_smaller_than_a_block_is_an_error_from_the_cli(validated):
    code, err, _ = validated('[workload]\nkind = "synthetic"\nnum_requests = 3\nrate = 1.0\n'
                             'prompt = {dist = "fixed", value = 10}\noutput = {dist = "fixed", value = 3}\n'
                             '[kv_cache]\nkind = "paged"\nmodel = "llama-3-8b"\ngpu = "a100-40gb"\n'
                             'prefix_caching = true\nhost_memory_gib = 0.001\n')
    assert code == 2
    err = err.strip()
    assert err.endswith("[kv_cache]: host_memory_gib: 0.001 GiB holds no block of 2097152 bytes")
    assert "\n" not in err


# --- both tiers against a shadow model ------------------------------------------------------------------


class HostShadow(Shadow):
    """:class:`test_prefix_cache.Shadow` with a host list: a GPU eviction of an identified block
    appends its key (unless present; the head drops out when full), an admission's hit walks the
    GPU table from block 0, then the host list from where that ends (vLLM's connector after the
    GPU lookup), and loads move keys to the end."""

    def __init__(self, num_blocks, bs, swap_blocks, host_blocks):
        super().__init__(num_blocks, bs, swap_blocks)
        self.host_blocks = host_blocks
        self.host = []            # keys, least recently used first
        self.host_index = {}      # key -> block index it was stored at
        self.index_of_key = {}    # key -> block index (own keys carry theirs; a key names one position)
        self.stores = self.drops = self.loads = 0
        self.gpu_evicted = []     # every identified key the GPU evicted, in order

    def release(self, name, seq, preempted=False):
        # beside a host tier a request's own full blocks keep their ("r", id, j) keys when it leaves,
        # as when it is preempted: vLLM's connector stores every full block (KV review s79)
        super().release(name, seq, preempted=True)

    def _host_find(self, request, j):
        k = spec_key(request, j, self.bs)
        index = self.host_index.get(k)
        if index is None and k[0] != "r":
            k = ("r", request.id, j)
            index = self.host_index.get(k)
        return k if index == j else None

    def hit_entries(self, seq, limit):
        """The GPU's hit (at most ``num_tokens - 1`` tokens: whole blocks), then the host's."""
        found = []
        for j in range(min(limit, (seq.num_tokens - 1) // self.bs)):
            b = self._find(seq.request, j)
            if b is None:
                break
            found.append(("gpu", b))
        for j in range(len(found), limit):
            k = self._host_find(seq.request, j)
            if k is None:
                break
            found.append(("host", k))
        return found

    def cached_tokens(self, seq):
        # get_num_new_matched_tokens looks up num_tokens // block_size blocks; a hit of them all
        # computes the last token again (the scheduler's num_computed_tokens -= 1; with one-token
        # blocks schedlab loads no block for the token it computes again, below)
        found = len(self.hit_entries(seq, seq.num_tokens // self.bs)) * self.bs
        return seq.num_tokens - 1 if found == seq.num_tokens else found

    def _pop(self):
        b = self.free[0]
        k = self.key[b]
        b = super()._pop()
        if k is not None:
            self.gpu_evicted.append(k)
            j = k[2] if k[0] == "r" else self.index_of_key[k]
            if k not in self.host_index and self.host_blocks:
                if len(self.host) == self.host_blocks:
                    del self.host_index[self.host.pop(0)]
                    self.drops += 1
                self.host.append(k)
                self.host_index[k] = j
                self.stores += 1
        return b

    def _plan(self, name, seq, n, cached, reserve):
        owned = self.owned.get(name, [])
        whole = cached == seq.num_tokens - 1 and not seq.num_tokens % self.bs and self.bs > 1
        hits = self.hit_entries(seq, seq.num_tokens // self.bs if whole else cached // self.bs) if cached and not owned else []
        total = math.ceil(max(seq.num_computed_tokens + cached + n, reserve, seq.reserved_tokens) / self.bs)
        gpu = [b for kind, b in hits if kind == "gpu"]
        fresh = total - len(owned) - len(gpu)
        return hits, fresh, fresh + sum(1 for b in gpu if self.ref[b] == 0)

    def allocate(self, name, seq, n, cached=0, reserve=0):
        hits, fresh, need = self._plan(name, seq, n, cached, reserve)
        if need > len(self.free):
            return False
        owned = self.owned.setdefault(name, [])
        self.ident.setdefault(name, 0)
        self.sealed.setdefault(name, False)
        for kind, b in hits:
            if kind == "gpu":
                if self.ref[b] == 0:
                    self.free.remove(b)
                self.ref[b] += 1
        loaded = [k for kind, k in hits if kind == "host"]
        for k in loaded:
            self.host.remove(k)
            self.host.append(k)
        self.loads += len(loaded)
        taken = [self._pop() for _ in range(fresh)]
        for j, (kind, x) in enumerate(hits):      # hits come only when nothing is owned yet
            if kind == "host":                    # loaded into a fresh block, which takes its key
                b = taken.pop(0)
                self._cache(b, x)
                self.index_of_key[x] = j
                self.ref[b] = 1
                x = b
            owned.append(x)
        for b in taken:
            self.ref[b] = 1
            owned.append(b)
        self.ident[name] += len(hits)
        if not self.sealed[name]:
            full = (seq.num_computed_tokens + cached + n) // self.bs
            j = self.ident[name]
            while j < full:
                k = spec_key(seq.request, j, self.bs)
                if k[0] == "r":
                    self.sealed[name] = True
                    break
                self._cache(owned[j], k)           # duplicates too (vLLM keeps them)
                self.index_of_key[k] = j
                j += 1
            self.ident[name] = j
        return True


class HostTierMachine(SwappingMachine):
    """vLLM's block pool with a host tier against the shadow, under engine-like admissions,
    chunks, decodes, finishes, recompute preemptions and swaps."""

    @initialize(num_blocks=st.integers(2, 6), bs=st.integers(1, 4), swap=st.integers(0, 4),
                host_blocks=st.integers(0, 8), bulk=st.booleans())
    def setup(self, num_blocks, bs, swap, host_blocks, bulk):
        self.host = HostTier(host_blocks)
        self.cache = PrefixKVCache(num_blocks, bs, swap_blocks=swap, host=self.host)
        self.shadow = HostShadow(num_blocks, bs, swap, host_blocks)
        self.driver = Driver(self.cache, bulk=bulk, shadow=self.shadow)
        self.next_id = 0

    @rule(prompt=st.integers(1, 14), family=st.integers(0, 2))
    def serve(self, prompt, family):
        """A request of conversation ``family`` (4 shared ids of 2 tokens) arrives, is admitted
        whole and leaves at once: the churn that sends blocks to the host and asks for them again."""
        d = self.driver
        prompt = max(1, min(prompt, (self.cache.num_blocks - 1) * self.cache.block_size))  # it can fit
        name = d.add(make_request(self.next_id, {"prompt_tokens": prompt, "output_tokens": 3,
                                                 "hash_ids": (2, family, 4)}))
        self.next_id += 1
        seq = d.seqs[name]
        hit = self.cache.cached_tokens(seq)
        d.admit(d._named("waiting").index(name), max(1, seq.num_tokens - hit - 1), False)
        if name in d.seqs and seq.status != "waiting":
            d.finish(sorted(d._named("prefilling") + d._named("decoding")).index(name))

    @invariant()
    def gpu_agrees_with_shadow(self):
        c, s = self.cache, self.shadow
        c.check_invariants()
        assert c.num_free_blocks() == len(s.free)
        assert c.cached_keys() == set(s.table)
        assert c.free_queue_layout() == s.layout()
        assert {k: c.ref_count(k) for k in c.cached_keys()} == s.refs()

    @invariant()
    def host_agrees_with_shadow(self):
        h, s = self.host, self.shadow
        assert h.lru_keys() == s.host
        assert (h.stored, h.evicted, h.loaded) == (s.stores, s.drops, s.loads)

    @invariant()
    def blocks_are_conserved_across_tiers(self):
        # every copy the host received is held or was dropped for room, and it never holds more
        # than its size; every identified block the GPU evicted is on the GPU again, in the host,
        # or was dropped by the host (or never fitted: a host of size 0)
        h, s, c = self.host, self.shadow, self.cache
        assert h.stored == len(h) + h.evicted and len(h) <= h.capacity
        held = set(c.cached_keys()) | set(h.lru_keys())
        lost = [k for k in s.gpu_evicted if k not in held]
        assert len(set(lost)) <= h.evicted or not h.capacity

    @invariant()
    def hits_leave_a_token_to_compute(self):
        for seq in self.driver.seqs.values():
            if seq.status == "waiting":
                hit, tokens, bs = self.cache.cached_tokens(seq), seq.num_tokens, self.cache.block_size
                # whole blocks, or a whole input of them but its last token (its last block loaded)
                assert hit <= tokens - 1 and (hit % bs == 0 or (hit == tokens - 1 and tokens % bs == 0))


HostTierMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestHostTierMachine = HostTierMachine.TestCase


# --- no block is lost with a host tier that holds everything: both caches -------------------------


KINDS = {"paged": lambda n, bs, host: PrefixKVCache(n, bs, host=host),
         "radix": lambda n, bs, host: RadixKVCache(n, bs, host=host, load_back_threshold=0)}
SERVE = st.tuples(st.just("serve"), st.integers(1, 14), st.integers(0, 2))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(KINDS)), num_blocks=st.integers(2, 8), bs=st.integers(1, 4),
       ops=st.lists(st.one_of(OPS.filter(lambda op: op[0] not in ("swap_out", "swap_in")), SERVE), max_size=50))
def test_with_room_for_everything_no_cached_block_is_ever_lost(kind, num_blocks, bs, ops):
    """Every block that ever had a key in the GPU cache is, at every step, on the GPU or in the
    host tier; and a lookup then finds the longest prefix of keys held in either tier (the hit of
    an unbounded cache)."""
    host = HostTier(10_000)
    cache = KINDS[kind](num_blocks, bs, host)
    driver = Driver(cache, bulk=True)
    ever: set = set()
    rid = 0
    for op in ops:
        if op[0] == "new":
            driver.add(make_request(rid, op[1]))
            rid += 1
        elif op[0] == "serve":
            prompt = max(1, min(op[1], (num_blocks - 1) * bs))
            name = driver.add(make_request(rid, {"prompt_tokens": prompt, "output_tokens": 2,
                                                 "hash_ids": (2, op[2], 4)}))
            rid += 1
            seq = driver.seqs[name]
            driver.admit(driver._named("waiting").index(name), seq.num_tokens - cache.cached_tokens(seq) - 1, False)
        else:
            driver.apply(op)
        cache.check_invariants()
        gpu, held = cache.cached_keys(), set(host.lru_keys())
        ever |= gpu
        assert ever <= gpu | held, f"lost {ever - gpu - held}"
        assert host.evicted == 0 and host.stored == len(host)
        for seq in driver.seqs.values():
            if seq.status == "waiting":
                limit = (seq.num_tokens - 1) // bs
                n = 0
                while n < limit and spec_key(seq.request, n, bs) in gpu | held:
                    n += 1
                if kind == "radix" or not any(k[0] == "r" and k[1] == seq.request.id for k in gpu | held):
                    assert cache.cached_tokens(seq) == n * bs


# --- the engines: reload time by hand ------------------------------------------------------------------------

# Linear costs: 0.5 ms per prompt token, 4 ms per decode step. B = 4, 4 GPU blocks; 2 MiB blocks
# over a 4.194304 GB/s link reload in 2,097,152 / 4.194304e9 s = 0.5 ms each, plus 10 us per reload.
COST = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=4.0)


def host_run(engine, kind="paged", host_blocks=8):
    host = HostTier(host_blocks, bytes_per_block=2 * 2 ** 20, link_gbps=4.194304, latency_us=10.0)
    kv = (PrefixKVCache(4, 4, host=host, bytes_per_block=2 * 2 ** 20, host_link_gbps=4.194304) if kind == "paged"
          else RadixKVCache(4, 4, host=host, bytes_per_block=2 * 2 ** 20, load_back_threshold=0))
    requests = [
        Request(0, 0.0, 9, 1, prefix_group="s", prefix_tokens=8),    # computes g3, g7
        Request(1, 10.0, 15, 1),                                     # takes all 4 blocks: g7, g3 -> host
        Request(2, 20.0, 10, 1, prefix_group="s", prefix_tokens=8),  # hits g3, g7 on the host
        Request(3, 30.0, 12, 1, prefix_group="s", prefix_tokens=8),  # hits them on the GPU
    ]
    return run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), LinearCostModel(COST), kv,
                      engine=engine), host


@pytest.mark.parametrize("kind", ["paged", "radix"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_host_hit_costs_its_reload_in_the_admitting_iteration(engine, kind):
    result, host = host_run(engine, kind)
    ttft = dict(zip(result.requests["id"].tolist(), (result.requests["first_token_ms"]
                                                     - result.requests["arrival_ms"]).tolist()))
    assert ttft[0] == pytest.approx(9 * 0.5)                      # 4.5 ms: the whole prompt
    assert ttft[1] == pytest.approx(15 * 0.5)                     # 7.5 ms
    assert ttft[2] == pytest.approx(2 * 0.5 + 2 * 0.5 + 0.010)    # 2 tokens + 2 blocks reloaded: 2.01 ms
    assert ttft[3] == pytest.approx(4 * 0.5)                      # 4 tokens, the prefix on the GPU: 2 ms
    # both caches keep request 1's 3 full blocks when it finishes (SGLang's tree inserts them; vLLM's pool
    # hashes them, and its connector stores every full block) and write them back to the host as the GPU
    # evicts them for requests 2 and 3 (vLLM's pool kept no key for them before the KV review of s79)
    stored = [("r", 1, 2), ("r", 1, 1), ("r", 1, 0)]
    assert host.lru_keys() == [("g", "s", 3), ("g", "s", 7)] + stored
    c = result.counters
    assert (c["host_hits"], c["host_load_blocks"], c["host_store_blocks"]) == (8, 2, 2 + len(stored))
    assert c["host_load_ms"] == pytest.approx(1.010)
    p = result.metrics["prefix_cache"]
    assert (p["queries"], p["hits"], p["gpu_hits"], p["host_hits"]) == (9 + 15 + 10 + 12, 16, 8, 8)
    assert p["host_hit_rate"] == pytest.approx(8 / 46) and p["gpu_hit_rate"] == pytest.approx(8 / 46)
    assert p["host_loaded_bytes"] == 2 * 2 * 2 ** 20
    assert p["host_stored_bytes"] == (2 + len(stored)) * 2 * 2 ** 20


def test_without_the_tier_the_same_request_recomputes_its_prefix():
    kv = PrefixKVCache(4, 4)
    requests = [Request(0, 0.0, 9, 1, prefix_group="s", prefix_tokens=8), Request(1, 10.0, 15, 1),
                Request(2, 20.0, 10, 1, prefix_group="s", prefix_tokens=8)]
    result = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), LinearCostModel(COST), kv)
    assert result.requests["first_token_ms"][2] - 20.0 == pytest.approx(10 * 0.5)
    assert result.metrics["prefix_cache"]["host_hits"] == 0


# --- the fast engine against the reference engine, tier on ------------------------------------------------


SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(requests_lists(min_size=2, max_size=12, max_prompt=40, max_output=20, prefix_groups=3), continuous_configs(),
       st.integers(1, 6), st.integers(0, 12), st.integers(0, 24), st.sampled_from(sorted(KINDS)),
       dyadic_linear_costs())
def test_fast_engine_matches_reference_with_a_host_tier(requests, cfg, block_size, spare, host_blocks, kind, cost):
    """GPU caches just big enough for the largest request, so that blocks go to the host and
    come back; reload times are dyadic (0.25 ms a block, 0.125 ms per reload), so the clocks
    agree to the bit."""
    need = blocks_for_largest(requests, block_size)
    runs, hosts = {}, {}
    for engine in ENGINES:
        hosts[engine] = host = HostTier(host_blocks, bytes_per_block=2 ** 20, link_gbps=2 ** 22 / 1e6, latency_us=125.0)
        kv = KINDS[kind](need + spare, block_size, host)
        kv.bytes_per_block = 2 ** 20
        runs[engine] = run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(cost), kv, engine=engine)
    compare_runs(runs["fast"], runs["reference"], rel=1e-12)
    assert hosts["fast"].lru_keys() == hosts["reference"].lru_keys()
    check_run(runs["fast"], requests, kv_blocks=need + spare)
    c = runs["fast"].counters
    # (a preempted request's reloads count apart: vLLM's and SGLang's hit rates leave its re-admission out)
    # each block loaded brings its tokens, but for a whole-block prompt whose last block came from the
    # host, whose last token is computed again: one token fewer for each (none with one-token blocks)
    lost = c["host_load_blocks"] * block_size - c["host_hits"] - c["prefix_preempted_host_hits"]
    assert 0 <= lost <= c["host_load_blocks"] and (block_size > 1 or lost == 0)
    assert c["host_hits"] <= c["prefix_hits"]
    assert c["host_store_blocks"] == len(hosts["fast"]) + c["host_evictions"]


@SETTINGS
@given(requests_lists(min_size=2, max_size=12, max_prompt=40, max_output=20, prefix_groups=3), sglang_configs(),
       st.integers(1, 6), st.integers(0, 8), st.integers(0, 24), st.sampled_from(sorted(KINDS)),
       dyadic_linear_costs())
def test_sglang_fast_engine_matches_reference_with_a_host_tier(requests, cfg, block_size, spare, host_blocks, kind,
                                                               cost):
    """SGLang's scheduler (retraction, lpm order, mixed chunks) on either cache with a host tier."""
    cfg = whole_pages(cfg, block_size)
    blocks = max(-(-(r.prompt_tokens + r.max_output_tokens + 1) // block_size) for r in requests) + spare
    runs, hosts = {}, {}
    for engine in ENGINES:
        hosts[engine] = host = HostTier(host_blocks, bytes_per_block=2 ** 20, link_gbps=2 ** 22 / 1e6, latency_us=125.0)
        runs[engine] = run_engine(requests, SglangScheduler(cfg), LinearCostModel(cost),
                                  KINDS[kind](blocks, block_size, host), engine=engine)
    compare_runs(runs["fast"], runs["reference"], rel=1e-12)
    assert hosts["fast"].lru_keys() == hosts["reference"].lru_keys()
    check_run(runs["fast"], requests, kv_blocks=blocks, rejections=rejections_for(cfg))
