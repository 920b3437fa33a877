"""Sliding-window layers in the KV pool (vLLM 0.33's hybrid KV cache manager, SGLang's hybrid SWA memory).

Every expected number is worked out by hand in the comments from vLLM's rules, never by calling the
code under test:

* groups (``kv_cache_planning._get_kv_cache_groups_uniform_page_size``): a KV cache group has as many
  layers as the smaller kind has, or the larger kind's count when ``max < 1.5 * min``;
* a window group frees, before each step's allocation, the whole blocks that lie before the next
  token's window (``SlidingWindowManager.get_num_skipped_tokens`` = ``c - W + 1`` for ``c`` computed
  tokens, ``remove_skipped_blocks``), then allocates up to the step's end; so after a step from ``c``
  to ``e`` tokens it holds ``ceil(e / B) - floor((c - W + 1) / B)`` blocks (no skip while ``c < W``);
* start-up (``SlidingWindowSpec.max_admission_blocks_per_request``): one request's window blocks are
  budgeted as ``cdiv(min(W - 1 + in_flight, max_model_len), B) + 1``;
* SGLang 0.5.23 (``HybridSWAPoolConfigurator``): a full-attention token costs the full layers' bytes plus
  ``swa_full_tokens_ratio`` (0.8) of the window layers' -- for the architectures it gives hybrid SWA
  memory (gpt-oss, Llama 4); every other model keeps every token in every layer.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.capacity import GIB, ModelSpec, Presets, concurrency, format_capacity, size_kv_cache
from schedlab.catalog import load_catalog
from schedlab.kv_window import SlidingWindow, kv_groups, model_window, sequence_blocks
from schedlab.model import Request
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import IterationChecker, check_run, compare_runs, examples, requests_lists, run_engine
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.cost_models.linear import LinearConfig
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache, RadixConfig, build_radix
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.schedulers.presets import VllmConfig

PRESETS = Presets.from_catalog(load_catalog(entry_points=False))
GPT_OSS = PRESETS.model("gpt-oss-20b")  # 24 layers, every other one a 128-token window; 8 KV heads of 64
CACHES = (PagedKVCache, PrefixKVCache)
ENGINES = ("fast", "reference")
SETTINGS = settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- 1. the window's arithmetic -------------------------------------------------------------------------


def test_held_while_decoding_across_the_window_edge():
    w = SlidingWindow(1, 128, 16)
    # before the window slides nothing is skipped: ceil(e / 16)
    assert w.held(0, 100) == 7        # a 100-token prompt in one step: ceil(100/16)
    assert w.held(0, 1000) == 63      # ceil(1000/16) = 63: a long prompt holds all its blocks for its step
    assert w.held(127, 128) == 8      # c = W - 1: skip 0; ceil(128/16) = 8
    # decodes: the step from c to c + 1 holds ceil((c+1)/16) - floor((c-127)/16)
    assert w.held(128, 129) == 9      # 9 - floor(1/16) = 9 - 0
    assert w.held(142, 143) == 9      # 9 - floor(15/16) = 9
    assert w.held(143, 144) == 8      # 9 - floor(16/16) = 9 - 1
    assert w.held(144, 145) == 9      # 10 - floor(17/16) = 10 - 1
    assert w.held(158, 159) == 9      # 10 - floor(31/16) = 10 - 1
    assert w.held(159, 160) == 8      # 10 - floor(32/16) = 10 - 2
    assert w.held(1000, 1001) == 9    # 63 - floor(873/16) = 63 - 54
    # a chunk after the window slid: 256 -> 512 holds 32 - floor(129/16) = 32 - 8
    assert w.held(256, 512) == 24


def test_held_with_a_window_that_is_no_multiple_of_the_block():
    w = SlidingWindow(1, 100, 16)     # skipped tokens c - 99
    assert w.held(99, 100) == 7       # c < W: ceil(100/16) = 7
    assert w.held(100, 101) == 7      # 7 - floor(1/16)
    assert w.held(114, 115) == 8      # ceil(115/16) - floor(15/16) = 8 - 0
    assert w.held(115, 116) == 7      # ceil(116/16) = 8, floor(16/16) = 1 -> 7
    assert w.held(127, 128) == 7      # 8 - floor(28/16) = 8 - 1
    assert w.held(128, 129) == 8      # 9 - floor(29/16) = 9 - 1: tokens 29..128 span blocks 1..8
    assert w.held(130, 131) == 8      # 9 - floor(31/16) = 9 - 1
    assert w.held(131, 132) == 7      # 9 - floor(32/16) = 9 - 2
    assert w.fewest(10_000) == 8      # ceil(99/16) + 1 = 7 + 1: the most a decoding sequence holds


def test_fewest_and_groups_multiply():
    w = SlidingWindow(1, 128, 16)
    assert w.fewest(50) == 4          # shorter than the window: ceil(50/16)
    assert w.fewest(128) == 8         # ceil(128/16) = 8 < ceil(127/16) + 1 = 9
    assert w.fewest(129) == 9         # min(ceil(129/16) = 9, 9)
    assert w.fewest(1000) == 9        # min(63, 9)
    three = SlidingWindow(3, 128, 16)
    assert three.held(128, 129) == 27 and three.held(143, 144) == 24 and three.held(0, 1000) == 189
    assert three.fewest(1000) == 27 and three.fewest(50) == 12
    assert three.prefill_peak(1000, 256) == 72        # 3 x 24 (below)
    assert three.admission_cap(2048, 131072) == 3 * 137


def test_held_by_an_empty_step():
    w = SlidingWindow(2, 32, 8)
    assert w.held(0, 0) == 0
    # a step whose start is far past the window: ceil(200/8) - floor(169/8) = 25 - 21 = 4 per group
    assert w.held(200, 200) == 2 * 4


def test_prefill_peak_by_chunks():
    w = SlidingWindow(1, 128, 16)
    assert w.prefill_peak(1000, 1000) == 63           # one step: ceil(1000/16)
    assert w.prefill_peak(1000, 5000) == 63           # a chunk larger than the prompt: one step
    # chunks of 256: 0-256: 16; 256-512: 32 - 8 = 24; 512-768: 48 - floor(385/16) = 48 - 24 = 24;
    # 768-1000: 63 - floor(641/16) = 63 - 40 = 23
    assert w.prefill_peak(1000, 256) == 24
    # chunks of 300: 0-300: 19; 300-600: 38 - floor(173/16) = 38 - 10 = 28; 600-900: 57 - 29 = 28; 900-1000: 63 - 48
    assert w.prefill_peak(1000, 300) == 28
    # chunks of 100: from c = 200 on a chunk holds ceil((c+100)/16) - floor((c-127)/16); with c = 127 + 16k + r
    # that is 14 + ceil((3 + r)/16): 16 only for r in {14, 15}, and c = 100j has r = (4j + 1) mod 16, never 14
    # or 15 -> 15 (0-100: 7; 100-200: ceil(200/16) = 13)
    assert w.prefill_peak(1000, 100) == 15
    # chunks of 99: c = 99j with r = 15 holds 14 + ceil(17/16) = 16; 99j - 127 = 15 (mod 16) -> 3j = 14 (mod 16)
    # -> j = 10: the chunk 990-1089 holds ceil(1089/16) - floor(863/16) = 69 - 53 = 16; ending at 1088 it holds
    # 68 - 53 = 15, as every other chunk does
    assert w.prefill_peak(1089, 99) == 16
    assert w.prefill_peak(1088, 99) == 15
    # many chunks (j = 10 and 26 are the r = 15 ones; only the first ones and the last are looked at)
    assert w.prefill_peak(99 * 40, 99) == 16
    assert w.prefill_peak(99 * 400 + 7, 99) == 16


def test_admission_cap():
    w = SlidingWindow(1, 128, 16)
    # cdiv(min(W - 1 + in_flight, max_model_len), B) + 1
    assert w.admission_cap(2048, 131072) == 137       # cdiv(2175, 16) = 136, + 1
    assert w.admission_cap(16384, 131072) == 1033     # cdiv(16511, 16) = 1032, + 1
    assert w.admission_cap(2048, 1000) == 64          # cdiv(1000, 16) = 63, + 1
    assert w.admission_cap(0, 131072) == 9            # cdiv(127, 16) = 8, + 1
    assert SlidingWindow(1, 100, 16).admission_cap(256, 10**6) == 24   # cdiv(355, 16) = 23, + 1


def test_sequence_blocks_adds_the_window_to_the_full_layers():
    kv = PagedKVCache(10, 16, window=SlidingWindow(1, 128, 16))
    assert sequence_blocks(kv, 1009) == 64 + 9                        # ceil(1009/16) + min(64, 9)
    assert sequence_blocks(kv, 1009, 1000, 1000) == 63 + 63           # the prompt in one step
    assert sequence_blocks(kv, 1009, 1000, 100) == 63 + 15            # chunks of 100 (above)
    assert sequence_blocks(kv, 1010, 1000, 1000, reserve=True) == 64 + 63  # reserved blocks from the start
    assert sequence_blocks(PagedKVCache(10, 16), 1009, 1000, 1000) == 64   # no window: ceil(1009/16)


# --- 2. KV cache groups -----------------------------------------------------------------------------------


@pytest.mark.parametrize("layers, window, expected", [
    (24, 12, (12, 1, 1)),      # gpt-oss-20b: 12 and 12
    (36, 18, (18, 1, 1)),      # gpt-oss-120b
    (62, 52, (10, 1, 6)),      # Gemma-3-27B: 10 full, 52 window; 52 >= 1.5 x 10 -> groups of 10; ceil(52/10) = 6
    (24, 14, (14, 1, 1)),      # 14 window + 10 full: 14 < 15 = 1.5 x 10 -> groups of 14 (full padded)
    (25, 15, (10, 1, 2)),      # 15 window + 10 full: 15 is not < 1.5 x 10 -> groups of 10; ceil(15/10) = 2
    (24, 4, (20, 1, 1)),       # 20 full, 4 window: schedlab keeps one full group (vLLM: 5 of 4) and ceil(4/20) = 1
    (48, 36, (12, 1, 3)),      # Llama 4: 12 full, 36 chunked: 36 >= 18 -> groups of 12, 3 window groups
    (24, 24, (24, 1, 0)),      # every layer slides: a single group, counted whole
    (24, 0, (24, 1, 0)),       # none slides
])
def test_kv_groups(layers, window, expected):
    assert kv_groups(layers, window) == expected


def test_model_window_and_pool_layers():
    assert model_window(GPT_OSS, 16) == SlidingWindow(1, 128, 16)
    assert GPT_OSS.pool_layers() == 12 and GPT_OSS.pool_layers(hybrid=False) == 24
    gemma = ModelSpec("gemma-3-27b-like", num_layers=62, num_kv_heads=16, head_dim=128, num_params=27e9,
                      sliding_window=1024, sliding_window_layers=52)
    assert model_window(gemma, 16) == SlidingWindow(6, 1024, 16)
    assert gemma.pool_layers() == 10
    # 2 x 16 heads x 128 x 2 B = 8 KiB per layer and token: 10 layers a block page, 62 without the manager
    assert gemma.pool_bytes_per_token() == 10 * 8192 and gemma.pool_bytes_per_token(hybrid=False) == 62 * 8192
    every = attrs.evolve(gemma, sliding_window_layers=62)
    assert model_window(every, 16) is None and every.pool_layers() == 62
    assert model_window(PRESETS.model("llama-3-8b"), 16) is None
    # Mllama-like: 8 window layers beside 32 full ones; vLLM would make groups of 8 (four of the full layers),
    # schedlab one group of 32 and one window group of 32 layers keeping 6404 x 8 / 32 = 1601 tokens, so that
    # the window layers' bytes stay those of 8 layers x 6404 tokens
    vision = ModelSpec("mllama-like", num_layers=40, num_kv_heads=8, head_dim=128, num_params=11e9,
                       sliding_window=6404, sliding_window_layers=8)
    assert model_window(vision, 16) == SlidingWindow(1, 1601, 16)
    assert vision.pool_layers() == 32
    # 14 window layers beside 10 full ones (within 1.5x): groups of 14, the window kept whole
    near = attrs.evolve(vision, num_layers=24, sliding_window_layers=14, sliding_window=512)
    assert model_window(near, 16) == SlidingWindow(1, 512, 16) and near.pool_layers() == 14


# --- 3. the caches, step by step ------------------------------------------------------------------------------


class Seq:
    """What the caches read of an engine sequence; the test keeps the counters."""

    def __init__(self, rid: int, prompt: int, **kw):
        self.request = Request(id=rid, arrival_ms=0.0, prompt_tokens=prompt, output_tokens=1000, **kw)
        self.num_computed_tokens = 0
        self.num_generated = 0
        self.reserved_tokens = 0
        self.kv_state = None

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_tokens + self.num_generated


def compute(kv, seq, n: int, **kw) -> None:
    """One step of ``n`` tokens: the allocation, then the counters the engine sets (a token once the prompt is in)."""
    before = kv.num_used_blocks()
    need = kv.blocks_needed(seq, n, **kw)
    assert kv.allocate(seq, n, **kw)
    assert need == max(0, kv.num_used_blocks() - before)
    seq.num_computed_tokens += kw.get("cached_tokens", 0) + n
    if seq.num_computed_tokens >= seq.num_tokens:
        seq.num_generated += 1
    kv.check_invariants()


W32 = SlidingWindow(1, 32, 8)   # B = 8: skipped blocks floor((c - 31) / 8)

# (window blocks, blocks in use) after the decode from c, for c = 20 .. 48 -- full blocks ceil((c+1)/8):
#  c = 20..23: window ceil(21..24/8) = 3, full 3                       -> (3, 6)
#  c = 24..31: window 4 (c < 32: nothing skipped), full 4              -> (4, 8)
#  c = 32..38: skipped floor(1..7/8) = 0, ceil(33..39/8) = 5; full 5   -> (5, 10)
#  c = 39:     skipped floor(8/8) = 1, ceil(40/8) = 5 -> 4; full 5     -> (4, 9)
#  c = 40..46: skipped 1, ceil(41..47/8) = 6 -> 5; full 6              -> (5, 11)
#  c = 47:     skipped floor(16/8) = 2, 6 - 2 = 4; full 6              -> (4, 10)
#  c = 48:     skipped floor(17/8) = 2, ceil(49/8) = 7 -> 5; full 7    -> (5, 12)
DECODES = [(3, 6)] * 4 + [(4, 8)] * 8 + [(5, 10)] * 7 + [(4, 9)] + [(5, 11)] * 7 + [(4, 10)] + [(5, 12)]


@pytest.mark.parametrize("cls", CACHES)
def test_a_prompt_then_decodes_across_the_window_edge_then_a_chunked_prefill(cls):
    kv = cls(40, 8, window=W32)
    a = Seq(0, 20)
    compute(kv, a, 20)                      # the prompt in one step: ceil(20/8) = 3 full + 3 window
    assert (kv.window_blocks(a), kv.num_used_blocks()) == (3, 6)
    assert len(DECODES) == 29
    for c, expected in zip(range(20, 49), DECODES):
        assert a.num_computed_tokens == c
        compute(kv, a, 1)
        assert (kv.window_blocks(a), kv.num_used_blocks()) == expected, c
    # a 70-token prompt in chunks of 24, 24, 22 beside it (A holds 12):
    b = Seq(1, 70)
    compute(kv, b, 24)                      # 0-24: window ceil(24/8) = 3, full 3
    assert (kv.window_blocks(b), kv.num_used_blocks()) == (3, 12 + 6)
    compute(kv, b, 24)                      # 24-48: c = 24 < 32, window ceil(48/8) = 6, full 6
    assert (kv.window_blocks(b), kv.num_used_blocks()) == (6, 12 + 12)
    compute(kv, b, 22)                      # 48-70: skipped floor(17/8) = 2, window ceil(70/8) - 2 = 7; full 9
    assert (kv.window_blocks(b), kv.num_used_blocks()) == (7, 12 + 16)
    compute(kv, b, 1)                       # its first decode from 70: skipped floor(39/8) = 4 -> 9 - 4 = 5; full 9
    assert (kv.window_blocks(b), kv.num_used_blocks()) == (5, 12 + 14)
    kv.free(a)                              # everything of A comes back: 7 full + 5 window
    assert kv.window_blocks(a) == 0 and kv.num_used_blocks() == 14
    kv.free(b)
    assert kv.num_used_blocks() == 0 and kv.num_free_blocks() == 40
    kv.check_invariants()


@pytest.mark.parametrize("cls", CACHES)
def test_a_refused_allocation_changes_nothing(cls):
    kv = cls(10, 8, window=W32)
    big = Seq(0, 41)
    assert kv.blocks_needed(big, 41) == 12   # ceil(41/8) = 6 full + 6 window > 10
    layout = kv.free_queue_layout() if cls is PrefixKVCache else None
    assert not kv.allocate(big, 41)
    assert (kv.num_used_blocks(), kv.window_blocks(big), big.kv_state) == (0, 0, None)
    if layout is not None:
        assert kv.free_queue_layout() == layout
    kv.check_invariants()
    seq = Seq(1, 40)
    compute(kv, seq, 40)                     # 5 + 5 = 10: the pool is full
    assert (kv.window_blocks(seq), kv.num_used_blocks()) == (5, 10)
    # its decode from 40: full ceil(41/8) = 6 (+1); window skipped floor(9/8) = 1, 6 - 1 = 5 (+0): needs 1
    assert kv.blocks_needed(seq, 1) == 1
    assert not kv.allocate(seq, 1)
    assert (kv.window_blocks(seq), kv.num_used_blocks(), kv.held(seq)) == (5, 10, 5)
    kv.free(seq)
    assert kv.num_used_blocks() == 0
    kv.check_invariants()


@pytest.mark.parametrize("cls", CACHES)
def test_a_full_pool_still_decodes_when_the_window_frees_a_block(cls):
    kv = cls(12, 8, window=W32)
    seq = Seq(0, 47)
    compute(kv, seq, 47)                     # ceil(47/8) = 6 full + 6 window = 12: the pool is full
    assert kv.num_free_blocks() == 0
    # the decode from 47: full ceil(48/8) = 6 (+0); window skipped floor(16/8) = 2, 6 - 2 = 4: frees 2
    compute(kv, seq, 1)
    assert (kv.window_blocks(seq), kv.num_used_blocks()) == (4, 10)
    # from 48: full ceil(49/8) = 7 (+1); window skipped floor(17/8) = 2, 7 - 2 = 5 (+1)
    compute(kv, seq, 1)
    assert (kv.window_blocks(seq), kv.num_used_blocks()) == (5, 12)
    kv.free(seq)
    assert kv.num_used_blocks() == 0


@pytest.mark.parametrize("cls", CACHES)
def test_a_reserving_sequence_keeps_its_windows_most_from_admission(cls):
    kv = cls(40, 8, window=W32)
    seq = Seq(0, 20)
    # reserve 50 tokens: full ceil(50/8) = 7; window max(held(0, 20) = 3, fewest(50) = min(7, ceil(31/8) + 1 = 5))
    compute(kv, seq, 20, reserve_tokens=50)
    seq.reserved_tokens = 50
    assert (kv.window_blocks(seq), kv.num_used_blocks()) == (5, 12)
    for _ in range(29):                      # decodes from 20 to 48: the window holds at most 5, the full part 7
        assert kv.blocks_needed(seq, 1) == 0
        compute(kv, seq, 1)
        assert (kv.window_blocks(seq), kv.num_used_blocks()) == (5, 12)
    kv.free(seq)
    assert kv.num_used_blocks() == 0


@pytest.mark.parametrize("cls", CACHES)
def test_swap_out_and_in_moves_the_window_blocks_too(cls):
    kv = cls(30, 8, window=W32, swap_blocks=12, bytes_per_block=1000, host_link_gbps=1.0)
    seq = Seq(0, 45)
    compute(kv, seq, 45)                     # 6 full + 6 window
    compute(kv, seq, 1)                      # from 45: window skipped floor(14/8) = 1, 6 - 1 = 5; full 6
    assert (kv.window_blocks(seq), kv.num_used_blocks()) == (5, 11)
    ms = kv.swap_out(seq)                    # 6 + 5 = 11 blocks of 1000 B at 1 GB/s
    assert ms == pytest.approx(11 * 1000 / 1e9 * 1e3)
    assert (kv.num_used_blocks(), kv.swap_used, kv.window_blocks(seq)) == (0, 11, 0)
    kv.check_invariants()
    # another sequence takes 20 of the 30 blocks: 10 free < 11 needed to swap back
    other = Seq(1, 80)
    compute(kv, other, 80)                   # ceil(80/8) = 10 full + 10 window
    assert kv.num_used_blocks() == 20
    assert kv.swap_in(seq) is None
    assert (kv.num_used_blocks(), kv.swap_used, kv.window_blocks(seq)) == (20, 11, 0)
    kv.free(other)
    # back with room for its next token: full ceil(47/8) = 6; window of the step from 46: 6 - floor(15/8) = 5
    assert kv.swap_in(seq) == pytest.approx(11 * 1000 / 1e9 * 1e3)
    assert (kv.num_used_blocks(), kv.swap_used, kv.window_blocks(seq)) == (11, 0, 5)
    compute(kv, seq, 1)                      # that decode takes nothing more
    assert (kv.window_blocks(seq), kv.num_used_blocks()) == (5, 11)
    kv.check_invariants()
    # swap space too small for its 11 blocks: refused, nothing moves
    small = cls(30, 8, window=W32, swap_blocks=10)
    s = Seq(2, 45)
    compute(small, s, 45)
    compute(small, s, 1)
    assert small.swap_out(s) is None
    assert (small.num_used_blocks(), small.swap_used, small.window_blocks(s)) == (11, 0, 5)
    small.free(s)
    assert small.num_used_blocks() == 0
    small.check_invariants()


def test_a_prefix_hits_window_is_taken_afresh():
    # B = 8, W = 16: two 40-token prompts share a 32-token prefix (4 identified blocks)
    kv = PrefixKVCache(30, 8, window=SlidingWindow(1, 16, 8))
    a, b = Seq(0, 40, prefix_group="p", prefix_tokens=32), Seq(1, 40, prefix_group="p", prefix_tokens=32)
    compute(kv, a, 40)                       # 5 full + 5 window
    assert kv.num_used_blocks() == 10
    assert kv.cached_tokens(b) == 32
    # B computes 32-40 with its 4 prefix blocks shared: 1 fresh full block; its window from c = 32:
    # skipped floor((32 - 15) / 8) = 2, ceil(40/8) - 2 = 3 blocks, anonymous (not shared with A's)
    compute(kv, b, 8, cached_tokens=32)
    assert (kv.window_blocks(b), kv.num_used_blocks()) == (3, 10 + 1 + 3)
    kv.free(a)
    kv.free(b)
    assert kv.num_used_blocks() == 0
    kv.check_invariants()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_hit_ends_where_the_window_blocks_were_kept(engine):
    # vLLM 0.33 (prefix_cache_retention_interval = 0) keeps a request's window blocks only before its prompt's
    # replay boundary, (P - 1) // B, and before a junction its lookup found. Blocks of 2, a window of 2 (one block
    # before a hit's end must be kept, ceil(1 / 2)); three requests one after another share a 4-token prefix:
    # r0 (prompt 4) keeps the window of block 0 ((4 - 1) // 2 = 1); r1 (prompt 5) finds both full-attention blocks
    # but the window of block 1 is gone: it hits 2 tokens, and keeps block 1's window (its junction, 4); r2 hits 4.
    # Every window block kept (None, vLLM's dense retention, schedlab before): 0, 4, 4.
    requests = [Request(id=i, arrival_ms=100.0 * i, prompt_tokens=4 if i == 0 else 5, output_tokens=3,
                        prefix_group=0, prefix_tokens=4) for i in range(3)]
    for retention, cached in ((0, [0, 2, 4]), (None, [0, 4, 4])):
        kv = PrefixKVCache(40, 2, window=SlidingWindow(1, 2, 2), retention=retention)
        result = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=1)), kv=kv, engine=engine)
        assert result.requests["cached_tokens"].tolist() == cached


def test_window_retention_settings():
    from schedlab.configs import FieldError
    from schedlab_plugins.kv_caches import PagedConfig, build_paged

    assert build_paged(PagedConfig(num_blocks=100, prefix_caching=True)).retention == 0
    assert build_paged(PagedConfig(num_blocks=100, prefix_caching=True, dense_window_prefix_cache=True)).retention \
        is None
    assert build_paged(PagedConfig(num_blocks=100, prefix_caching=True,
                                   prefix_cache_retention_interval=64)).retention == 64
    with pytest.raises(FieldError, match="not a multiple of block_size"):
        PagedConfig(num_blocks=100, prefix_caching=True, prefix_cache_retention_interval=20)
    with pytest.raises(ValueError, match="multiple of the block size"):
        PrefixKVCache(10, 16, retention=8)


def test_a_window_of_another_block_size_is_refused():
    with pytest.raises(ValueError, match="16-token blocks"):
        PagedKVCache(10, 8, window=SlidingWindow(1, 32, 16))


# --- 4. sizing ----------------------------------------------------------------------------------------------

# gpt-oss-20b: 2 (K and V) x 8 KV heads x 64 x 2 B = 2048 B per layer and token
PER_LAYER = 2 * 8 * 64 * 2
RESERVE = math.ceil(1.5 * GIB)


def kv_pool(mib: int) -> int:
    """What is left for the KV cache of gpt-oss-20b on a GPU reporting ``mib`` MiB, at 0.9 (the weights as the
    model preset has them: 12.8 GiB, test_model_presets)."""
    return math.floor(mib * 2**20 * 0.9) - math.ceil(GPT_OSS.weight_bytes()) - RESERVE


@pytest.mark.parametrize("gpu, mib", [("l4", 23034), ("h100-80gb", 81559)])
def test_gpt_oss_pool_holds_the_full_attention_group(gpu, mib):
    spec = PRESETS.gpu(gpu)
    assert spec.memory_gib * 1024 == mib            # the memory total nvidia-smi reports
    s = size_kv_cache(GPT_OSS, spec)
    assert s.bytes_per_token == 12 * PER_LAYER == 24576            # one group of 12 layers a block page
    assert s.bytes_per_block == 16 * 24576
    assert s.num_blocks == kv_pool(mib) // (16 * 24576)
    assert s.window == SlidingWindow(1, 128, 16)
    whole = size_kv_cache(GPT_OSS, spec, hybrid=False)            # --disable-hybrid-kv-cache-manager
    assert whole.bytes_per_token == 24 * PER_LAYER == 2 * s.bytes_per_token
    assert whole.num_blocks == kv_pool(mib) // (16 * 49152)
    assert whole.window is None and whole.sequence_blocks(2000) == 125


def test_gpt_oss_block_counts_by_hand():
    # L4: floor(23034 MiB x 0.9) = 21,737,609,625 B - 13,747,605,120 B weights - 1,610,612,736 B = 6,379,391,769 B
    assert kv_pool(23034) == 6_379_391_769
    assert size_kv_cache(GPT_OSS, PRESETS.gpu("l4")).num_blocks == 16223        # // 393,216 B
    assert size_kv_cache(GPT_OSS, PRESETS.gpu("l4"), hybrid=False).num_blocks == 8111   # // 786,432 B
    # H100: floor(81559 MiB x 0.9) = 76,968,728,985 B -> 61,610,511,129 B for the KV cache
    assert kv_pool(81559) == 61_610_511_129
    assert size_kv_cache(GPT_OSS, PRESETS.gpu("h100-80gb")).num_blocks == 156683


def test_concurrency_counts_the_window_blocks():
    s = size_kv_cache(GPT_OSS, PRESETS.gpu("l4"))                 # 16,223 blocks
    # a sequence of T tokens: ceil(T/16) + min(ceil(T/16), ceil(127/16) + 1 = 9)
    assert s.sequence_blocks(2000) == 125 + 9
    assert concurrency(s, 2000) == 16223 // 134 == 121
    assert s.sequence_blocks(100) == 7 + 7 and concurrency(s, 100) == 16223 // 14
    assert s.sequence_blocks(129) == 9 + 9 and concurrency(s, 129) == 16223 // 18
    whole = size_kv_cache(GPT_OSS, PRESETS.gpu("l4"), hybrid=False)
    assert concurrency(whole, 2000) == 8111 // 125


class _Presets:
    """Presets of the test's own models (a windowed non-gpt-oss model) and the built-in GPUs."""

    def __init__(self, *models):
        self.models = {m.name: m for m in models}

    def model(self, name):
        return self.models[name] if name in self.models else PRESETS.model(name)

    def gpu(self, name):
        return PRESETS.gpu(name)


LLAMA = PRESETS.model("llama-3-8b")   # 32 layers, 8 KV heads of 128: 4096 B per layer and token
GEMMA_LIKE = attrs.evolve(LLAMA, name="gemma-like", hf_id=None, sliding_window=4096, sliding_window_layers=24)
LLAMA4_LIKE = attrs.evolve(GEMMA_LIKE, name="llama-4-like")


def radix(model: str, **kw):
    return build_radix(RadixConfig(model=model, gpu="h100-80gb", **kw), _Presets(GEMMA_LIKE, LLAMA4_LIKE))


def test_sglang_sizing_counts_its_window_pool():
    # gpt-oss is on SGLang's hybrid SWA list: 12 full layers + 0.8 x 12 window layers = 21.6 layers a token
    kv = radix("gpt-oss-20b")
    assert kv.sizing.bytes_per_token == math.ceil(21.6 * PER_LAYER) == 44237   # 1.8 x the full layers' 24,576
    assert kv.num_blocks == 61_610_511_129 // (16 * 44237) == 87046
    assert kv.sizing.window is None and getattr(kv, "window", None) is None
    # --disable-hybrid-swa-memory: every layer keeps every token
    assert radix("gpt-oss-20b", disable_hybrid_swa_memory=True).sizing.bytes_per_token == 24 * PER_LAYER
    # another ratio: 12 + 0.5 x 12 = 18 layers
    assert radix("gpt-oss-20b", swa_full_tokens_ratio=0.5).sizing.bytes_per_token == 18 * PER_LAYER
    text = format_capacity(kv.sizing)
    assert "12 full-attention + 0.8 x 12 window layers" in text and "window layers       " not in text


def test_sglang_keeps_every_layer_for_models_off_its_list():
    # a Gemma-like model (8 full + 24 window layers): SGLang 0.5.23 gives it no hybrid SWA memory -> all 32 layers
    pool = math.floor(81559 * 2**20 * 0.9) - 2 * 8_030_261_248 - RESERVE   # 59,297,593,753 B
    kv = radix("gemma-like")
    assert kv.sizing.bytes_per_token == 32 * 4096
    assert kv.num_blocks == pool // (16 * 32 * 4096)
    # vLLM's hybrid manager: groups of 8 (24 >= 1.5 x 8), 3 window groups; a block holds a page of 8 layers
    vllm = size_kv_cache(GEMMA_LIKE, PRESETS.gpu("h100-80gb"))
    assert vllm.bytes_per_token == 8 * 4096 and vllm.num_blocks == pool // (16 * 8 * 4096)
    assert vllm.window == SlidingWindow(3, 4096, 16)
    # Llama 4 is on SGLang's list: 8 + 0.8 x 24 = 27.2 layers
    assert radix("llama-4-like").sizing.bytes_per_token == math.ceil(27.2 * 4096) == 111412


def test_sglang_decides_by_the_architecture_a_config_file_names():
    # SGLang picks hybrid SWA memory by architecture, not by what the user calls the model: gpt-oss-20b's config.json
    # read under another name gets the 21.6 layers a token of the preset; a Gemma-like model_type does not, even
    # named like gpt-oss (before: by name alone, 24 layers and 21.6 layers)
    from schedlab.hf_config import spec_from_path

    spec = attrs.evolve(spec_from_path(str(Path(__file__).parent / "data" / "hf_configs" / "gpt-oss-20b.json"), "t"),
                        name="my-oss", hf_id=None)
    assert spec.model_type == "gpt_oss"
    assert build_radix(RadixConfig(model="my-oss", gpu="h100-80gb"),
                       _Presets(spec)).sizing.bytes_per_token == math.ceil(21.6 * PER_LAYER)
    named = attrs.evolve(GEMMA_LIKE, name="gpt-oss-like", model_type="gemma2")
    assert build_radix(RadixConfig(model="gpt-oss-like", gpu="h100-80gb"),
                       _Presets(named)).sizing.bytes_per_token == 32 * 4096


# --- 5. the engines ---------------------------------------------------------------------------------------------


@st.composite
def window_setups(draw):
    requests = draw(requests_lists(max_size=10, max_prompt=120, max_output=100, max_arrival_ms=40.0, priorities=True,
                                   prefix_groups=2))
    block_size = draw(st.sampled_from([4, 8, 16]))
    window = SlidingWindow(draw(st.integers(1, 3)), draw(st.integers(16, 200)), block_size)
    cache = draw(st.sampled_from(CACHES))
    num_blocks = draw(st.integers(16, 64)) * 16 // block_size   # 256 to 1,024 tokens' worth
    seqs = draw(st.integers(2, 8))
    allocation = draw(st.sampled_from(["grow", "grow", "reserve"]))
    chunked = draw(st.booleans())
    async_scheduling = draw(st.booleans())
    swap = allocation == "grow" and not async_scheduling and draw(st.booleans())
    cfg = ContinuousConfig(
        max_num_seqs=seqs, max_num_batched_tokens=draw(st.integers(max(seqs, 16), 256)), chunked_prefill=chunked,
        allocation=allocation, policy=draw(st.sampled_from(["fcfs", "priority"])), async_scheduling=async_scheduling,
        preemption="swap" if swap else "recompute",
        # chunked: the whole-prompt admission check caps the window's blocks as vLLM does, or is off
        reserve_full_prompt=draw(st.booleans()) if chunked else True)
    swap_blocks = draw(st.sampled_from([0, 8, 64])) if swap else 0
    return requests, window, cache, num_blocks, swap_blocks, cfg


@SETTINGS
@given(window_setups())
def test_windowed_runs_agree_and_keep_every_limit(setup):
    requests, window, cache, num_blocks, swap_blocks, cfg = setup
    runs = {}
    for engine in ENGINES:
        kv = cache(num_blocks, window.block_size, window=window, swap_blocks=swap_blocks, bytes_per_block=2**20,
                   host_link_gbps=2**10 / 1e3)
        # without the whole-prompt check, vLLM's rules may preempt a chunked prefill again and again (a window
        # or not): the loop heuristic is off then
        check = IterationChecker(max_running=cfg.max_num_seqs, token_budget=cfg.max_num_batched_tokens,
                                 kv_blocks=num_blocks,
                                 loops=cfg.reserve_full_prompt or cfg.allocation == "reserve") \
            if engine == "fast" else None
        runs[engine] = run_engine(requests, ContinuousScheduler(cfg), LinearCostModel(), kv, engine=engine,
                                  check=check)
        # (a preempted request whose recompute needs more blocks at once than the cache has is turned away
        # after service, as test_a_preempted_request_whose_recompute_never_fits_is_rejected shows)
        served = any(why.startswith("its recompute of ") for why in runs[engine].rejections.values())
        check_run(runs[engine], requests, max_running=cfg.max_num_seqs, kv_blocks=num_blocks,
                  rejections="any" if served else "unserved")
        if check is not None:
            assert check.iterations == runs[engine].metrics["iterations"]
    compare_runs(runs["fast"], runs["reference"])


@pytest.mark.parametrize("cls", CACHES)
def test_windowed_decodes_run_in_bulk_with_every_block_counted(cls):
    # one prompt of 40 tokens (blocks of 8, one window group of 32 tokens), then 299 decodes, 1 ms an iteration:
    # the prompt holds 5 + 5 blocks; the decode at position s holds ceil((s + 1) / 8) full blocks and
    # ceil((s + 1) / 8) - floor((s - 31) / 8) window ones (s >= 32), whose peak is at s = 336-338:
    # 2 x 43 - 38 = 48; block x ms = 10 + the sum of those counts over s = 40..338
    block_ms = 10 + sum(2 * math.ceil((s + 1) / 8) - (s - 31) // 8 for s in range(40, 339))
    requests = [Request(id=0, arrival_ms=0.0, prompt_tokens=40, output_tokens=300)]
    cost = LinearCostModel(LinearConfig(base_ms=1.0, prefill_ms_per_token=0.0, decode_ms_per_step=0.0))
    runs = {engine: run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow")), cost,
                               cls(400, 8, window=SlidingWindow(1, 32, 8)), engine=engine) for engine in ENGINES}
    for run in runs.values():
        assert run.metrics["iterations"] == 300 and run.requests["finish_ms"].tolist() == [300.0]
        assert run.counters["kv_peak_blocks"] == 48 and run.counters["kv_block_ms"] == block_ms
    # the fast engine runs the decodes in bulk (a handful of events, not one per iteration)
    assert runs["fast"].meta["events"] < 10 and runs["reference"].meta["events"] == 300


@pytest.mark.parametrize("cls", CACHES)
@pytest.mark.parametrize("num_blocks", [59, 61, 103, 115])
def test_a_bulk_run_stops_before_decodes_must_wait_for_anothers_freed_window(cls, num_blocks):
    # blocks of 4, a window of 6 tokens: a decoder crosses a block at positions 0 mod 4 and, from position 9 on, frees
    # a window block at 1 mod 4; r0 (20-token prompt, first in the running list) crosses where r1 (21 tokens) frees.
    # With one block free, r0's two (full + window) fit only after r1 gave its one back: vLLM walks the decodes in
    # order, so r0 preempts r1 there. A run that counted the step's net need (+1) would go on through it.
    requests = [Request(id=0, arrival_ms=0.0, prompt_tokens=20, output_tokens=200),
                Request(id=1, arrival_ms=0.0, prompt_tokens=21, output_tokens=200)]
    runs = {engine: run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=2, allocation="grow")),
                               kv=cls(num_blocks, 4, window=SlidingWindow(1, 6, 4)), engine=engine)
            for engine in ENGINES}
    compare_runs(runs["fast"], runs["reference"])
    assert runs["fast"].meta["events"] * 4 < runs["reference"].meta["events"]


@pytest.mark.parametrize("cls", CACHES)
def test_a_bulk_run_stops_where_the_window_frees_stop_keeping_a_full_pool_going(cls):
    # 4 requests of 64-token prompts (blocks of 4, one window group of 9 tokens) in a pool of 100 blocks: at
    # position s a decoder holds ceil((s + 1) / 4) full blocks and ceil((s + 1) / 4) - floor((s - 8) / 4) window
    # ones -- 17 + 4 = 21 at s = 64 (crossing), 17 + 3 = 20 at s = 65-67, rising by one block per 4 tokens
    # over the run; 4 x 21 = 84 blocks at first, so the pool runs out within 4 x 4 further blocks: both engines
    # preempt at the same iteration, and the fast one reaches it in bulk
    requests = [Request(id=i, arrival_ms=0.0, prompt_tokens=64, output_tokens=60) for i in range(4)]
    runs = {engine: run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow", max_num_seqs=4)),
                               LinearCostModel(), cls(100, 4, window=SlidingWindow(1, 9, 4)), engine=engine)
            for engine in ENGINES}
    compare_runs(runs["fast"], runs["reference"])
    assert runs["fast"].requests["preemptions"].sum() >= 1
    assert runs["fast"].meta["events"] < runs["reference"].meta["events"] / 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_preempted_request_whose_recompute_never_fits_is_rejected(engine):
    # B = 8, W = 16, 20 blocks. A (priority 1) decodes alone from t = 0; B (priority 0) arrives at 600 ms, when A
    # holds about 11 full blocks; B's growth preempts A (the lower priority). A's recompute of n = 8 + generated
    # tokens in one step needs ceil(n/8) full + ceil(n/8) window blocks (nothing skipped in a step from 0) -- more
    # than 20 once n > 80: rejected once the cache is empty, not left waiting for ever.
    requests = [Request(0, 0.0, prompt_tokens=8, output_tokens=100, priority=1),
                Request(1, 600.0, prompt_tokens=24, output_tokens=60, priority=0)]
    kv = PagedKVCache(20, 8, window=SlidingWindow(1, 16, 8))
    result = run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="grow", policy="priority",
                                                                       max_num_seqs=4)), kv=kv, engine=engine)
    check_run(result, requests, kv_blocks=20, rejections="any")  # (served, then too long to recompute)
    generated = dict(zip(result.requests["id"].tolist(), result.requests["generated_tokens"].tolist()))
    assert generated[1] == 60 and 0 < generated[0] < 100
    n = 8 + generated[0]
    need = 2 * math.ceil(n / 8)
    assert need > 20
    assert result.rejections == {0: f"its recompute of {n} tokens in one step needs {need} KV blocks at once (the "
                                    "model's window layers keep every token of a step) but the cache has 20"}


# --- 6. the scheduler's limits ---------------------------------------------------------------------------


def window_cache(num_blocks: int, groups: int = 1) -> PagedKVCache:
    return PagedKVCache(num_blocks, 16, window=SlidingWindow(groups, 128, 16))


LONG = Request(0, 0.0, prompt_tokens=1000, output_tokens=10)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_recompute_the_whole_prompt_gate_can_never_pass_is_turned_away(engine):
    # blocks of 1, a window of 2 in two groups, 20 blocks: two 1-token prompts decode side by side until the pool is
    # full; r1 is preempted with 7 tokens. Its recompute in chunks of 5 would fit (7 full + 2 x 5 window blocks of
    # its first chunk = 17), but reserve_full_prompt asks the whole sequence's blocks free: 7 + min(2 x 7, vLLM's
    # admission cap 2 x (cdiv(2 - 1 + 5, 1) + 1) = 14) = 21 > 20 -- both engines stalled there before
    requests = [Request(0, 0.0, 1, 7), Request(1, 0.0, 1, 7)]
    config = ContinuousConfig(max_num_seqs=2, allocation="grow", max_num_batched_tokens=5, chunked_prefill=True)
    result = run_engine(requests, ContinuousScheduler(config), LinearCostModel(),
                        PagedKVCache(20, 1, window=SlidingWindow(2, 2, 1)), engine=engine)
    assert result.requests["rejected"].tolist() == [0, 1] and result.requests["preemptions"].tolist() == [0, 1]
    assert result.rejections[1].startswith("its recompute of 7 tokens in chunks of 5 needs 21 KV blocks at once")
    # without the gate it fits and finishes
    config = attrs.evolve(config, reserve_full_prompt=False)
    result = run_engine(requests, ContinuousScheduler(config), LinearCostModel(),
                        PagedKVCache(20, 1, window=SlidingWindow(2, 2, 1)), engine=engine)
    assert result.requests["generated_tokens"].tolist() == [7, 7]


def test_a_recompute_whose_chunks_never_fit_is_turned_away():
    # blocks of 1, a window of 4: a preempted request with 12 tokens recomputes them in chunks of 8; its first chunk
    # holds 8 window blocks beside the 12 full ones it ends with: 20 (counted together, as the arrival check counts
    # a prompt's); from a 4-token hit the chunk [4, 12) holds 12 - floor((4 - 3) / 1) = 11 window blocks: 23
    scheduler = ContinuousScheduler(ContinuousConfig(allocation="grow", max_num_batched_tokens=8, chunked_prefill=True,
                                                     max_num_seqs=4, reserve_full_prompt=False))

    class Preempted:
        num_tokens = 12

    window = SlidingWindow(1, 4, 1)
    assert scheduler._recompute_never_fits(PagedKVCache(20, 1, window=window), Preempted, 0) is None
    assert "needs 20 KV blocks" in scheduler._recompute_never_fits(PagedKVCache(19, 1, window=window), Preempted, 0)
    assert "recompute of 8 tokens in one step needs 23 KV blocks" in scheduler._recompute_never_fits(
        PagedKVCache(22, 1, window=window), Preempted, 4)
    assert scheduler._recompute_never_fits(PagedKVCache(19, 1), Preempted, 0) is None  # (no window: chunks fit)


def test_a_prompt_whose_one_step_prefill_cannot_fit_is_rejected():
    whole = ContinuousScheduler(ContinuousConfig(allocation="grow", max_num_batched_tokens=2048, max_num_seqs=8))
    # grow: 1009 tokens hold slots; decoding, 64 + 9 = 73; the prompt in one step: 63 full + 63 window = 126
    assert whole.rejection_reason(LONG, window_cache(125)) == (
        "needs 126 KV blocks (prompt 1000 + max_tokens 10) but the cache has 125")
    assert whole.rejection_reason(LONG, window_cache(126)) is None
    assert whole.rejection_reason(LONG, PagedKVCache(64, 16)) is None          # no window: ceil(1009/16) = 64
    # two window groups: 63 + 2 x 63 = 189
    assert "needs 189 KV blocks" in whole.rejection_reason(LONG, window_cache(188, groups=2))
    # reserve: 1010 tokens' blocks from admission (64) + the prompt's window in its step (63)
    reserve = ContinuousScheduler(ContinuousConfig(allocation="reserve", max_num_batched_tokens=2048, max_num_seqs=8))
    assert "needs 127 KV blocks" in reserve.rejection_reason(LONG, window_cache(126))
    assert reserve.rejection_reason(LONG, window_cache(127)) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_static_and_tgi_count_the_window_when_they_reject(engine):
    from schedlab_plugins.schedulers import StaticConfig, StaticScheduler, TgiConfig, TgiScheduler

    # both reserve a request's tokens from admission and prefill its prompt in one step: 1010 tokens' blocks (64) +
    # the prompt's 63 window blocks = 127 (a static batch); TGI reserves prompt + max_new_tokens - 1 (64 blocks too)
    # and keeps block 0 for health checks: 128. One block short, the request is turned away instead of waiting for
    # ever (a static batch stalled there before).
    static = StaticScheduler(StaticConfig(batch_size=2))
    assert "needs 127 KV blocks" in static.rejection_reason(LONG, window_cache(126))
    assert static.rejection_reason(LONG, window_cache(127)) is None
    tgi = TgiScheduler(TgiConfig(max_batch_prefill_tokens=2048, max_input_tokens=1024, max_total_tokens=2048))
    assert "needs 127 KV blocks" in tgi.rejection_reason(LONG, window_cache(127))
    assert tgi.rejection_reason(LONG, window_cache(128)) is None
    result = run_engine([LONG], StaticScheduler(StaticConfig(batch_size=2)), kv=window_cache(126), engine=engine)
    assert result.requests["rejected"].tolist() == [True]


def test_sglangs_scheduler_over_a_windowed_cache_rejects_what_cannot_fit_alone():
    from schedlab_plugins.schedulers import SglangConfig, SglangScheduler

    # SGLang's own check counts tokens (1,010 + a page fit a 2,000-token pool); over vLLM's paged cache with window
    # layers the prompt prefilled in one step holds 63 full and 63 window blocks: 126 (it stopped with "cannot decode
    # even after retraction" in a tight pool before)
    sglang = SglangScheduler(SglangConfig(chunked_prefill_size=0, overlap_schedule=False))
    assert sglang.rejection_reason(LONG, window_cache(125)) == (
        "needs 126 KV blocks (prompt 1000 + max_tokens 10, the model's window layers' blocks too) but the cache has 125")
    assert sglang.rejection_reason(LONG, window_cache(126)) is None
    assert sglang.rejection_reason(LONG, PagedKVCache(125, 16)) is None


def test_chunked_prefill_with_a_small_budget_fits_the_prompt():
    chunked = ContinuousScheduler(ContinuousConfig(allocation="grow", chunked_prefill=True, max_num_batched_tokens=100,
                                                   max_num_seqs=8, reserve_full_prompt=False))
    # chunks of 100 hold at most 15 window blocks (test_prefill_peak_by_chunks): 63 + 15 = 78 > 73 decoding
    assert chunked.rejection_reason(LONG, window_cache(100)) is None
    assert chunked.rejection_reason(LONG, window_cache(78)) is None
    assert chunked.rejection_reason(LONG, window_cache(77)) == (
        "needs 78 KV blocks (prompt 1000 + max_tokens 10) but the cache has 77")
    # chunks of 256: 63 + 24 = 87
    budget = ContinuousScheduler(ContinuousConfig(allocation="grow", chunked_prefill=True, max_num_batched_tokens=256,
                                                  max_num_seqs=8, reserve_full_prompt=False))
    assert "needs 87 KV blocks" in budget.rejection_reason(LONG, window_cache(86))
    # with the whole-prompt admission check (vLLM's default), the window's share of it is capped at
    # cdiv(127 + 256, 16) + 1 = 25 blocks: 63 + 25 = 88
    checked = ContinuousScheduler(ContinuousConfig(allocation="grow", chunked_prefill=True, max_num_batched_tokens=256,
                                                   max_num_seqs=8, reserve_full_prompt=True))
    assert "needs 88 KV blocks" in checked.rejection_reason(LONG, window_cache(87))
    assert checked.rejection_reason(LONG, window_cache(88)) is None


@pytest.mark.parametrize("cls", CACHES)
def test_a_chunked_long_prompt_is_admitted_as_vllm_caps_its_window(cls):
    # vLLM 0.33 allocate_slots(full_sequence_must_fit=True) counts the window group's blocks for the whole
    # prompt capped at max_admission_blocks_per_request = cdiv(min(127 + 100, -), 16) + 1 = 16: 63 + 16 = 79 <= 90
    # free, so it admits the prompt and prefills it in chunks of 100 (at most 63 + 15 = 78 blocks), then decodes
    # (64 + 9 = 73): it runs to the end in a 90-block pool. (Counting every window block, 63 + 63 = 126, it would
    # wait for ever.) A pool of 78 blocks holds the chunks but not the admission check's 79: rejected.
    scheduler = ContinuousScheduler(ContinuousConfig(allocation="grow", chunked_prefill=True,
                                                     max_num_batched_tokens=100, max_num_seqs=8))
    kv = cls(90, 16, window=SlidingWindow(1, 128, 16))
    assert scheduler.rejection_reason(LONG, kv) is None
    result = run_engine([LONG], scheduler, LinearCostModel(), kv)
    assert result.requests["generated_tokens"].tolist() == [10]
    assert scheduler.rejection_reason(LONG, cls(79, 16, window=SlidingWindow(1, 128, 16))) is None
    assert scheduler.rejection_reason(LONG, cls(78, 16, window=SlidingWindow(1, 128, 16))) == (
        "needs 79 KV blocks (prompt 1000 + max_tokens 10) but the cache has 78")


def test_start_up_uses_the_windows_admission_cap():
    # 100 blocks of 16, W = 128, a budget of 256 in flight: the window is budgeted cdiv(min(127 + 256, T), 16) + 1
    # = 24 + 1 = 25 blocks once T >= 383, so T fits while ceil(T/16) <= 75: T = 1200 (1201 needs 76 + 25 = 101)
    def vllm(max_model_len, **kw):
        return ContinuousScheduler(VllmConfig(max_model_len=max_model_len, max_num_batched_tokens=256, max_num_seqs=64,
                                              **{"async_scheduling": False, **kw}))

    assert vllm(1200).start_up_problem(window_cache(100)) is None
    assert vllm(1201).start_up_problem(window_cache(100)) == (
        "vLLM would refuse to start: max_model_len 1,201 > the KV pool's 1,200 tokens; set [scheduler] "
        "max_model_len <= 1,200 or \"auto\"")
    assert vllm(1201).start_up_problem(PagedKVCache(100, 16)) is None     # no window: 1,600 tokens
    assert vllm("auto").max_model_len_for(window_cache(100)) == 1200
    assert vllm("auto", model_context=1000).max_model_len_for(window_cache(100)) == 1000
    # two batches in flight (async scheduling): cdiv(127 + 512, 16) + 1 = 41 -> ceil(T/16) <= 59: T = 944
    assert vllm("auto", async_scheduling=True).max_model_len_for(window_cache(100)) == 944
    assert "max_model_len 945 > the KV pool's 944 tokens" in vllm(945, async_scheduling=True).start_up_problem(
        window_cache(100))
    # two window groups: 2 x 25 = 50 -> ceil(T/16) <= 50: T = 800
    assert vllm("auto").max_model_len_for(window_cache(100, groups=2)) == 800
    # a pool too small for the cap's 383 tokens: ceil(T/16) + cdiv(T, 16) + 1 <= 20 -> ceil(T/16) <= 9: T = 144
    assert vllm("auto").max_model_len_for(window_cache(20)) == 144
    assert ContinuousScheduler(ContinuousConfig(max_model_len="auto", max_num_batched_tokens=256)).max_model_len_for(
        window_cache(20)) == 144


EXPERIMENT = """
    [experiment]
    name = "windows"
    [workload]
    kind = "synthetic"
    num_requests = 6
    rate = 5
    prompt = {dist = "fixed", value = 300}
    output = {dist = "fixed", value = 10}
    [cost_model]
    kind = "roofline"
    model = "gpt-oss-20b"
    gpu = "h100-80gb"
    [kv_cache]
    kind = "paged"
    model = "gpt-oss-20b"
    gpu = "h100-80gb"
    [[runs]]
    name = "vllm"
    scheduler = { kind = "vllm" }
    [[runs]]
    name = "tgi"
    scheduler = { kind = "tgi" }
    kv_cache = { block_size = 16 }  # (TGI's own default is flashinfer's 1-token blocks)
    [[runs]]
    name = "tgi-hybrid"
    scheduler = { kind = "tgi" }
    kv_cache = { kind = "paged", model = "gpt-oss-20b", gpu = "h100-80gb", disable_hybrid_kv_cache_manager = false,
                 block_size = 16 }
    [[runs]]
    name = "sglang"
    scheduler = { kind = "sglang" }
    kv_cache = { kind = "radix", model = "gpt-oss-20b", gpu = "h100-80gb" }
"""


def test_a_run_keeps_the_window_for_vllm_and_not_for_tgi(tmp_path):
    from schedlab_plugins.reports.table import render

    (tmp_path / "exp.toml").write_text(textwrap.dedent(EXPERIMENT))
    results = run_experiment(load(tmp_path / "exp.toml"))
    runs = {run.name: run for run in results.all_runs()}
    kv = {name: run.meta["kv_cache"] for name, run in runs.items()}
    # vLLM: a block is a page of 12 layers; its window layers keep 128 tokens in one more group
    assert (kv["vllm"]["bytes_per_token"], kv["vllm"]["num_blocks"]) == (24576, 156683)
    assert (kv["vllm"]["window_tokens"], kv["vllm"]["window_groups"]) == (128, 1)
    # vLLM starts: 131,072 tokens (8,192 blocks) + a window budget of cdiv(127 + 2 x 8,192, 16) + 1 = 1,033 blocks
    # (8,192 tokens per batch, two in flight) fit in 156,683
    assert runs["vllm"].meta["max_model_len"] == 131072 and runs["vllm"].meta["start_up_problem"] == ""
    # TGI keeps every token in every layer (its kv_cache_defaults): 24 layers, half the blocks
    assert (kv["tgi"]["bytes_per_token"], kv["tgi"]["num_blocks"]) == (49152, 61_610_511_129 // (16 * 49152))
    assert "window_tokens" not in kv["tgi"]
    assert kv["tgi-hybrid"]["window_tokens"] == 128 and kv["tgi-hybrid"]["num_blocks"] == 156683  # asked for
    # SGLang: 12 + 0.8 x 12 layers a token
    assert (kv["sglang"]["bytes_per_token"], kv["sglang"]["swa_full_tokens_ratio"]) == (44237, 0.8)
    assert "window_tokens" not in kv["sglang"]
    lines = [line for line in render(results).splitlines() if line.startswith("KV cache:")]
    assert len(lines) == 3
    by_blocks = {blocks: [line for line in lines if f"{blocks:,} blocks" in line] for blocks in (156683, 78341, 87046)}
    assert all(len(found) == 1 for found in by_blocks.values())
    assert "window layers keep 128 tokens in 1 more group(s)" in by_blocks[156683][0]
    assert "window layers keep" not in by_blocks[78341][0] and "window layers keep" not in by_blocks[87046][0]
    assert "SGLang's window layers: a pool of 0.8 tokens per full-attention one" in by_blocks[87046][0]
    for run in runs.values():
        assert run.metrics["finished"] == 6


def test_the_table_shows_each_distinct_cache_though_runs_share_num_blocks(tmp_path):
    from schedlab_plugins.reports.table import render

    # 9,000 blocks each: with the window a block is a page of 12 layers (24 KiB a token), with every layer whole 24
    # (48 KiB); the table used to print the first one's line alone (it keyed them on model, GPU and num_blocks)
    text = EXPERIMENT.split("[[runs]]")[0] + """
    num_blocks = 9000
    [[runs]]
    name = "window"
    scheduler = { kind = "vllm", max_model_len = 4096 }
    [[runs]]
    name = "whole"
    scheduler = { kind = "vllm", max_model_len = 4096 }
    kv_cache = { disable_hybrid_kv_cache_manager = true }
"""
    (tmp_path / "exp.toml").write_text(textwrap.dedent(text))
    lines = [line for line in render(run_experiment(load(tmp_path / "exp.toml"))).splitlines()
             if line.startswith("KV cache:")]
    assert len(lines) == 2
    assert "24 KiB/token" in lines[0] and "window layers keep 128 tokens" in lines[0]
    assert "48 KiB/token" in lines[1] and "window layers keep" not in lines[1]
