"""KV counters that must mean what the engines they model report (review kv.md findings 3, 4, 8),
each worked out by hand on a small run and checked in both engines:

* prefix-cache queries / hits leave out a previously preempted request's re-admission (its own
  blocks found again), as vLLM 0.33's ``PrefixCacheStats.record(preempted=num_preemptions > 0)``
  and SGLang's ``cache_hit_rate`` (``retracted_stain``) do; those go to ``preemptions.prefix_*``;
* ``swapped_out_blocks`` / ``swapped_in_blocks`` (and the bytes) count the blocks the cache moved
  and ``swap_transfer_ms`` charged: the step's pending slot and a window model's window blocks too;
* with a cache caching when freed (TGI) and a host tier, ``host_hits`` is the host tier's share of
  the hit (a whole-input hit is ``num_tokens - 1``), so ``gpu_hits`` never goes negative.
"""

import pytest

from schedlab.kv_window import SlidingWindow
from schedlab.model import Request
from schedlab.testing import check_run, compare_runs, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixKVCache
from schedlab_plugins.kv_caches.host_tier import HostTier
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.schedulers.presets import VllmConfig
from schedlab_plugins.schedulers.sglang import SglangConfig, SglangScheduler
from schedlab_plugins.schedulers.tgi import TgiConfig, TgiScheduler

MIB = 2 ** 20


def both(requests, make_scheduler, make_kv, cost=None):
    """The run on each engine (results, caches), checked and compared."""
    out = {}
    for engine in ("fast", "reference"):
        kv = make_kv()
        result = run_engine(requests, make_scheduler(), LinearCostModel(cost or LinearConfig()), kv, engine=engine)
        check_run(result, requests)
        out[engine] = (result, kv)
    compare_runs(out["fast"][0], out["reference"][0])
    return out


# -- finding 3: a preempted request's re-admission is not a prefix hit ----------------------------


def test_preempted_readmissions_are_kept_out_of_the_prefix_hit_rate():
    # Six unique 40-token prompts (nothing to share) on 40 blocks of 4: they all start, grow, and the
    # newest are preempted (recompute) and re-admitted, finding their own blocks again. vLLM 0.33
    # counts each request's first admission only: 6 x 40 tokens queried, none hit.
    requests = [Request(i, 0.0, 40, 60) for i in range(6)]
    runs = both(requests, lambda: ContinuousScheduler(VllmConfig(max_num_seqs=6)), lambda: PrefixKVCache(40, 4))
    for result, _ in runs.values():
        pc, pp = result.metrics["prefix_cache"], result.metrics["preemptions"]
        assert result.counters["num_preemptions"] > 0
        assert (pc["queries"], pc["hits"], pc["hit_rate"]) == (240, 0, 0.0)
        assert (pc["gpu_hits"], pc["host_hits"]) == (0, 0)
        # the re-admissions: apart, each querying at least its prompt and finding its own blocks
        assert pp["prefix_queries"] >= 40 * result.counters["recompute_preemptions"]
        assert 0 < pp["prefix_hits"] < pp["prefix_queries"]
        # every admission's cached tokens are in one or the other
        cached = int(result.requests["cached_tokens"].sum())
        assert pc["hits"] + pp["prefix_hits"] == cached


def test_a_shared_prefix_found_by_a_first_admission_still_counts():
    # A (16-token prompt) then B, the same 16 tokens + 4 of its own, after A is done: B's first
    # admission finds A's 4 full blocks -- 16 of its 20 tokens; nothing is preempted.
    a = Request(0, 0.0, 16, 2, prefix_group=1, prefix_tokens=16)
    b = Request(1, 100.0, 20, 2, prefix_group=1, prefix_tokens=16)
    runs = both([a, b], lambda: ContinuousScheduler(VllmConfig()), lambda: PrefixKVCache(64, 4))
    for result, _ in runs.values():
        pc, pp = result.metrics["prefix_cache"], result.metrics["preemptions"]
        assert (pc["queries"], pc["hits"], pp["prefix_queries"], pp["prefix_hits"]) == (36, 16, 0, 0)


def test_sglang_retracted_requests_are_kept_out_too():
    # SGLang's cache_hit_rate subtracts a retracted request's re-prefills (retracted_stain,
    # reprocessed_log_*). test_sglang's retraction timeline on a radix pool of 80 one-token blocks:
    # R1 (prompt 15) is retracted at 118.875 ms with 44 tokens and prefilled again later (SGLang
    # inserts nothing of a retracted request: no hit). First admissions: 8 + 15 + 4 tokens.
    requests = [Request(0, 0.0, 8, 60), Request(1, 2.0, 15, 30), Request(2, 100.0, 4, 20)]
    config = SglangConfig(overlap_schedule=False, new_token_ratio_decay_steps=1, chunked_prefill_size=0,
                          ignore_eos="none")
    runs = both(requests, lambda: SglangScheduler(config), lambda: RadixKVCache(80, 1),
                cost=LinearConfig(prefill_ms_per_token=0.125, decode_ms_per_step=4.0))
    for result, _ in runs.values():
        pc, pp = result.metrics["prefix_cache"], result.metrics["preemptions"]
        assert result.counters["num_preemptions"] == 1
        assert (pc["queries"], pc["hits"]) == (27, 0)
        assert (pp["prefix_queries"], pp["prefix_hits"]) == (44, 0)


# -- finding 4: swap counters count the blocks moved ----------------------------------------------


def test_a_swapped_victim_scheduled_in_the_step_counts_its_pending_slot():
    # Priority policy: R0 (priority 2) decodes alone in 4 blocks of 4 until R1 (priority 0) arrives;
    # R0, already given this step's slot (its 9th token, opening its 3rd block), is swapped out with
    # it: 3 blocks out, the same 3 back in, 6 blocks charged.
    r0 = Request(0, 0.0, 1, 10, priority=2)
    r1 = Request(1, 17.0, 1, 10, priority=0)
    config = ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=64, allocation="grow", preemption="swap",
                              policy="priority")
    runs = both([r0, r1], lambda: ContinuousScheduler(config),
                lambda: PagedKVCache(4, 4, swap_blocks=10, bytes_per_block=MIB, host_link_gbps=1.0))
    for result, kv in runs.values():
        c, p = result.counters, result.metrics["preemptions"]
        assert c["swap_preemptions"] == 1
        assert (c["swap_out_blocks"], c["swap_in_blocks"]) == (3, 3)
        assert c["swap_transfer_ms"] == pytest.approx(6 * kv.transfer_ms(1))
        assert (p["swapped_out_blocks"], p["swapped_in_blocks"]) == (3, 3)


def test_a_window_model_swaps_its_window_blocks_too():
    # Window layers (SlidingWindow(2, 8, 4): a window of 8 tokens) hold blocks of their own, moved
    # with the full-attention blocks; the counters are what swap_transfer_ms was charged for.
    requests = [Request(i, 0.0, 8, 30) for i in range(4)]
    config = ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=256, allocation="grow", preemption="swap")
    runs = both(requests, lambda: ContinuousScheduler(config),
                lambda: PagedKVCache(30, 4, swap_blocks=200, bytes_per_block=MIB, host_link_gbps=1.0,
                                     window=SlidingWindow(2, 8, 4)))
    for result, kv in runs.values():
        c = result.counters
        swaps = c["swap_preemptions"]
        assert swaps > 0 and c["swap_out_blocks"] == c["swap_in_blocks"]
        charged = c["swap_transfer_ms"] / kv.transfer_ms(1)
        assert c["swap_out_blocks"] + c["swap_in_blocks"] == pytest.approx(charged)
        # each victim decodes past its 8-token prompt: >= 3 full-attention blocks and its window's 2
        assert c["swap_out_blocks"] >= 5 * swaps
        assert result.metrics["preemptions"]["swapped_out_bytes"] == c["swap_out_blocks"] * MIB


# -- finding 8: TGI + host tier: the host tier's share of the hit ----------------------------------


def tgi_host_run(d_prompt: int):
    """A's 8-token input (2 blocks of 4) is cached when freed; B (cached too) and D take the rest of
    12 blocks, evicting A's blocks to a write-through host tier; C asks for A's input again: TGI's
    whole-input hit of 7 tokens (its last token computed again, in its last block)."""
    a = Request(0, 0.0, 8, 2, prefix_group=1, prefix_tokens=8)
    b = Request(1, 50.0, 40, 2, prefix_group=2, prefix_tokens=40)
    d = Request(2, 75.0, d_prompt, 2)
    c = Request(3, 100.0, 8, 2, prefix_group=1, prefix_tokens=8)
    return both([a, b, d, c], lambda: TgiScheduler(TgiConfig()),
                lambda: PrefixKVCache(12, 4, host=HostTier(64, bytes_per_block=MIB, link_gbps=1.0,
                                                           write_policy="write_through"),
                                      bytes_per_block=MIB))


def test_tgi_whole_input_hit_from_the_host_tier():
    # both of A's blocks come back from the host: the hit is 7 tokens, all of them the host tier's
    for result, _ in tgi_host_run(40).values():
        pc = result.metrics["prefix_cache"]
        assert (pc["hits"], pc["host_loaded_blocks"]) == (7, 2)
        assert result.metrics["preemptions"]["prefix_hits"] == 0   # (nothing preempted: all first admissions)
        assert (pc["host_hits"], pc["gpu_hits"]) == (7, 0)


def test_the_host_tiers_share_of_a_hit():
    from schedlab.engine.plan import host_share

    # whole blocks: every loaded block's tokens
    assert host_share(2, 8, 4) == 8 and host_share(1, 8, 4) == 4
    # TGI's whole-input hit of 7 tokens in 2 blocks: the GPU's blocks count whole, the host the rest
    assert host_share(2, 7, 4) == 7 and host_share(1, 7, 4) == 3
    assert host_share(3, 47, 16) == 47 and host_share(1, 47, 16) == 15


def test_a_plugin_cache_without_swapped_blocks_is_counted_by_its_tokens():
    """kv_state is the cache's own: a plugin cache that keeps a token count there (and has no
    swapped_blocks) is counted by the blocks of the tokens swapped, not by that number."""
    from schedlab.engine.plan import swapped_blocks

    class Plain:   # a minimal plugin cache's surface
        block_size = 4

    seq = type("Seq", (), {"kv_state": 48})()
    assert swapped_blocks(Plain(), seq, 45) == 12                       # ceil(45 / 4), not 48
    assert swapped_blocks(PagedKVCache(10, 4), type("Seq", (), {"kv_state": 5})(), 45) == 5   # the built-in's count
