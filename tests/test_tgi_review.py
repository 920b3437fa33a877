"""Fidelity fixes to the TGI model (text-generation-inference v3.3.7, commit dfb3fbe), each against
TGI's source: a prompt found whole in the radix trie computes one token (``queue.rs``
``State::next_batch``), an allocation dropped before its prefill ran puts its never-computed input
in the trie (``radix.rs`` ``RadixAllocator::free``), a request without ``max_new_tokens`` gets
``max_total_tokens - input`` (``validation.rs`` ``validate_input``), and only decode-only passes
replay a CUDA graph (``flash_causal_lm.py`` ``FlashCausalLM.forward``). Timelines worked out by
hand with 0.5 ms per prompt token and 8 ms per decode pass.
"""

from __future__ import annotations

import attrs
import pytest

from schedlab.model import Request
from schedlab.protocols import Batch
from schedlab.study.experiment import load, run_experiment
from schedlab.testing import check_run, compare_runs, run_engine
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.cost_models.step_overhead import StepTiming
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import TgiConfig, TgiScheduler
from test_engine_defaults import run_text
from test_tgi_limits import COST, ENGINES, _assembled, by_id
from test_tgi_limits import run as run_unchecked


def run(requests, config, engine, *, num_blocks=64, block_size=4, cache=PagedKVCache):
    """:func:`test_tgi_limits.run`, its run checked (conservation, capacity, causality)."""
    r = run_unchecked(requests, config, engine, num_blocks=num_blocks, block_size=block_size, cache=cache)
    check_run(r, requests, kv_blocks=num_blocks - 1)
    return r


# -- 1. a prompt found whole computes one token -----------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_a_prompt_found_whole_computes_its_last_token_only(engine):
    # 4-token blocks. A (prompt 8 = 2 blocks, 1 token) at 0: prefill 8 -> 4 ms; its allocation freed,
    # the trie holds its 8 prompt tokens. B, the same prompt, at 100: TGI finds all 8 (prefix_len 8 ==
    # input_length, so prefix_len -= 1): 1 token computed, 0.5 ms -> 100.5. (Capped a block short, as
    # before: 4 found, 4 computed -> 102.) C, a 10-token prompt of the same 8-token prefix at 200:
    # 2 whole blocks found, 2 tokens computed -> 201, either way.
    reqs = [Request(0, 0.0, 8, 1, prefix_group="g", prefix_tokens=8),
            Request(1, 100.0, 8, 1, prefix_group="g", prefix_tokens=8),
            Request(2, 200.0, 10, 1, prefix_group="g", prefix_tokens=8)]
    r = run(reqs, TgiConfig(), engine, block_size=4, cache=PrefixKVCache)
    assert by_id(r, "cached_tokens") == {0: 0, 1: 7, 2: 8}
    assert by_id(r, "finish_ms") == {0: 4.0, 1: 100.5, 2: 201.0}


def test_a_prompt_found_whole_keeps_every_block_it_found():
    # 1-token blocks: the hit is 7 tokens of 8 either way, but TGI's allocation references all 8
    # blocks found (the last token's KV is written again into its cached slot), so the request
    # takes 8 + 3 - 1 - 8 = 2 fresh blocks, not 3, and no cached block is left free to evict.
    reqs = [Request(0, 0.0, 8, 1, prefix_group="g", prefix_tokens=8),
            Request(1, 100.0, 8, 3, prefix_group="g", prefix_tokens=8)]
    kv = PrefixKVCache(32, 1)
    records = []
    run_engine(reqs, TgiScheduler(TgiConfig()), LinearCostModel(COST), kv,
               check=lambda inst, record: records.append((record.start_ms, record.kv_used_blocks, kv.lru_keys())))
    start, used, free_cached = next(rec for rec in records if rec[0] == 100.0)
    assert used == 10  # 8 found + 2 fresh (reserve 8 + 3 - 1 = 10)
    assert free_cached == []  # (before: block 7 stayed free, cached, a fresh block in its place)


# -- 2. an allocation dropped before its prefill ran is cached all the same ---------------------------------------
# TGI's queue allocates a request's blocks before it checks the prefill budget; the request that does
# not fit goes back to the queue and its BlockAllocation is dropped, and so are a whole batch's when it
# is too small for min_size. Dropping frees it through RadixAllocator::free, which inserts the
# allocation's prefill_tokens (the input's whole blocks) in the trie: nothing records that no prefill
# ran. The request later finds its whole input and computes one token.

@pytest.mark.parametrize("engine", ENGINES)
def test_the_request_that_ends_a_batch_at_the_budget_later_finds_its_whole_prompt(engine):
    # No chunking, max_batch_prefill_tokens 16, blocks of 4. A and B (prompt 12, 2 tokens, nothing
    # shared) at 0: A's 12 fit; B is allocated (12 + 2 - 1 = 13 tokens, 4 blocks), then 12 + 12 > 16:
    # pushed back, its allocation dropped -> its 12 prompt tokens (3 blocks) go in the trie. A
    # prefills 12 (6 ms) -> 6. Next try (min_size floor(1 x 0.3) = 0): B finds all 12, prefix_len
    # 12 == input -> 11: 1 token, 0.5 ms -> 6.5; the pass after decodes both -> 14.5. (Before:
    # B found nothing, prefilled 12 -> 12, finished at 20.)
    reqs = [Request(0, 0.0, 12, 2), Request(1, 0.0, 12, 2)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=16), engine, cache=PrefixKVCache)
    assert by_id(r, "cached_tokens") == {0: 0, 1: 11}
    assert by_id(r, "first_token_ms") == {0: 6.0, 1: 6.5}
    assert by_id(r, "finish_ms") == {0: 14.5, 1: 14.5}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_too_small_for_the_ratio_leaves_its_prompts_cached(engine):
    # No chunking, budget 16, waiting_served_ratio 1.0, blocks of 4. R0, R1 (prompt 4, 6 tokens) at 0
    # prefill 8 (4 ms) -> 4. W1 (prompt 8) and W2 (prompt 12), 2 tokens each, arrive at 1. At 4:
    # min_size floor(2 x 1.0) = 2; W1 fits (8), W2 is allocated and ends the batch (8 + 12 > 16),
    # a batch of 1 < 2: W2's allocation is dropped, then W1's; both prompts go in the trie. Decode
    # -> 12. At 12 W1 finds 8 (-> 7) and W2 12 (-> 11): 1 token each, a batch of 2: prefill 2
    # tokens (1 ms) -> 13; the pass after decodes all -> 21 (W1, W2 done); R0, R1 decode on:
    # 29, 37, 45. (Before: W1 and W2 waited for R0 and R1 to finish at 44 and ran then.) The fast
    # engine asks the scheduler at 12 although its last plan was decode-only: what is cached changed.
    reqs = [Request(0, 0.0, 4, 6), Request(1, 0.0, 4, 6), Request(2, 1.0, 8, 2), Request(3, 1.0, 12, 2)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=16, waiting_served_ratio=1.0), engine, cache=PrefixKVCache)
    assert by_id(r, "cached_tokens") == {0: 0, 1: 0, 2: 7, 3: 11}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 0.0, 2: 12.0, 3: 12.0}
    assert by_id(r, "first_token_ms") == {0: 4.0, 1: 4.0, 2: 13.0, 3: 13.0}
    assert by_id(r, "finish_ms") == {0: 45.0, 1: 45.0, 2: 21.0, 3: 21.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_request_that_meets_a_full_chunking_budget_later_finds_its_whole_prompt(engine):
    # Chunking, budget 16, blocks of 4. A (prompt 16, 3 tokens) fills the budget exactly; B (prompt
    # 8, 2 tokens) is allocated, chunk_len 16 - 16 = 0: pushed back, its allocation dropped -> its 8
    # prompt tokens go in the trie. A prefills 16 (8 ms) -> 8. At 8 (budget 16 - 1, padded to 16) B
    # finds all 8 -> 7: A's decode + 1 token (8.5 ms) -> 16.5; the pass after decodes -> 24.5.
    # (Before: B prefilled 8 beside A's decode (12 ms) -> 20, finished at 28.)
    reqs = [Request(0, 0.0, 16, 3), Request(1, 0.0, 8, 2)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=16, prefill_chunking=True), engine, cache=PrefixKVCache)
    assert by_id(r, "cached_tokens") == {0: 0, 1: 7}
    assert by_id(r, "first_token_ms") == {0: 8.0, 1: 16.5}
    assert by_id(r, "finish_ms") == {0: 24.5, 1: 24.5}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_prompt_aborted_mid_prefill_is_cached_whole(engine):
    # RadixAllocator::free inserts the whole input, whatever was computed (TGI hears of a client gone
    # only when it sends a token, so it finishes the prefill first). Chunking, budget 16, blocks of
    # 4: A (prompt 40 of a shared 40-token prefix) gives up 10 ms after it was sent; its chunks of 16
    # run 0-8 and 8-16, and it is aborted at 16 with 32 tokens computed: all 10 of its prompt's blocks
    # are cached. B, the same 40 tokens, at 30: finds all 40 -> 39, 0.5 ms -> 30.5. (Before: the 8
    # computed blocks only: 32 found, 8 computed -> 34.)
    reqs = [Request(0, 0.0, 40, 2, prefix_group="g", prefix_tokens=40, timeout_ms=10.0),
            Request(1, 30.0, 40, 1, prefix_group="g", prefix_tokens=40)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=16, prefill_chunking=True), engine, cache=PrefixKVCache)
    assert by_id(r, "finish_ms") == {0: 16.0, 1: 30.5}
    assert by_id(r, "cached_tokens") == {0: 0, 1: 39}


def test_an_allocation_given_back_keys_its_input_and_lets_its_request_hit_it():
    # PrefixKVCache.give_back by hand: 10 blocks of 4. A (prompt 10, 3 tokens; an 8-token shared
    # prefix) reserves 12 tokens = 3 blocks; B (prompt 8, 2 tokens, nothing shared) 9 = 3 blocks.
    # Both are allocated (6 blocks taken from the anonymous run), then freed, B first: B's 2 whole
    # blocks take its own keys (last block first, at the tail), its third block goes to the head;
    # then A's 2 whole blocks their shared keys, its third to the head.
    from schedlab.engine.plan import check_hit
    from schedlab.engine.reference import RefSequence
    from schedlab.errors import SimulationError

    kv = PrefixKVCache(10, 4)
    kv.cache_input_on_free()
    a = RefSequence(Request(0, 0.0, 10, 3, prefix_group="g", prefix_tokens=8), 0)
    b = RefSequence(Request(1, 0.0, 8, 2), 1)
    c = RefSequence(Request(2, 0.0, 8, 2), 2)
    assert kv.give_back([(a, 12), (b, 9)]) is True
    assert kv.used == 0 and a.kv_state is None and b.kv_state is None
    assert kv.free_queue_layout() == [6, ("r", 1, 1), ("r", 1, 0), ("g", "g", 7), ("g", "g", 3)]
    kv.check_invariants()
    # B, never scheduled, finds its whole prompt: the engines accept a hit past its (empty) shared
    # prefix because the cache says it cached that input before B ran; C, never given back, may not
    assert (kv.cached_tokens(a), kv.cached_tokens(b)) == (8, 7)
    assert (kv.input_cached_before_run(b), kv.input_cached_before_run(c)) == (8, 0)
    assert check_hit(kv, b, 7) == 7
    with pytest.raises(SimulationError, match="never scheduled before"):
        check_hit(kv, c, 4)
    # given back again, nothing new is cached: the same layout, no change reported
    assert kv.give_back([(a, 12), (b, 9)]) is False
    assert kv.free_queue_layout() == [6, ("r", 1, 1), ("r", 1, 0), ("g", "g", 7), ("g", "g", 3)]
    # admitted, B is no longer told apart
    assert kv.allocate(b, 1, cached_tokens=7, reserve_tokens=9)
    assert kv.input_cached_before_run(b) == 0


# -- 3. TGI's default max_new_tokens ------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_without_max_tokens_gets_the_rest_of_max_total_tokens(engine):
    # max_total_tokens 40, 4-token blocks, 15 usable. No request says max_tokens: TGI gives each
    # max_new_tokens = 40 - input. A and B (prompt 8, 4 tokens) reserve 8 + 32 - 1 = 39 tokens, 10
    # blocks: one at a time. A: prefill 8 -> 4, decodes -> 12, 20, 28. B: 28 -> 32, decodes -> 56.
    # C (prompt 36, 10 tokens) passes validation with max_new_tokens 4 (36 + 4 <= 40) and its answer
    # ends there: 56 -> 74, decodes -> 82, 90, 98.
    reqs = [Request(0, 0.0, 8, 4), Request(1, 0.0, 8, 4), Request(2, 0.0, 36, 10)]
    config = TgiConfig(max_batch_prefill_tokens=64, max_total_tokens=40, default_max_tokens="max_total_tokens")
    r = run(reqs, config, engine, num_blocks=16)
    assert by_id(r, "rejected") == {0: 0, 1: 0, 2: 0}
    assert by_id(r, "finish_ms") == {0: 28.0, 1: 56.0, 2: 98.0}
    assert by_id(r, "output_tokens")[2] == 10 and by_id(r, "max_tokens")[2] == 4
    # schedlab's convention ('output'): 3 blocks each, A and B together (16 tokens -> 8, decodes
    # -> 16, 24, 32); C's 36 + 10 > 40 is refused
    old = run(reqs, attrs.evolve(config, default_max_tokens="output"), engine, num_blocks=16)
    assert by_id(old, "rejected") == {0: 0, 1: 0, 2: 1}
    assert by_id(old, "finish_ms")[0] == by_id(old, "finish_ms")[1] == 32.0


@pytest.mark.parametrize("engine", ENGINES)
def test_each_segment_asks_for_what_is_left_of_max_total_tokens(engine):
    # Segments of 4, max_total_tokens 14, chunking, 1-token blocks. A (prompt 4, 9 tokens, no
    # max_tokens): max_new_tokens 10, first segment 4: reserves 4 + 4 - 1 = 7. Its continuation
    # (input 8) asks for min(14 - 8, 4) = 4 -> 11 blocks; the next (input 12) for 2 -> 13; the answer
    # could run to 10 and ends at its own 9. prefill 4 -> 2; decodes -> 10, 18, 26 (4 tokens); back:
    # prefill 8 -> 30 (token 5), decodes -> 38, 46, 54; back: prefill 12 -> 60, its 9th token.
    reqs = [Request(0, 0.0, 4, 9)]
    config = TgiConfig(max_batch_prefill_tokens=16, prefill_chunking=True, max_total_tokens=14,
                       generation_segment=4, default_max_tokens="max_total_tokens")
    r = run(reqs, config, engine, num_blocks=15, block_size=1)
    assert by_id(r, "finish_ms") == {0: 60.0}
    assert r.metrics["requeues"] == 2
    # 12 usable blocks (a pool TGI would not start with, max_total_tokens 14 > 13: start_up_problem):
    # the last continuation's 12 + 2 - 1 = 13 tokens never fit, so the answer ends at 8
    short = run(reqs, config, engine, num_blocks=13, block_size=1)
    assert by_id(short, "max_tokens") == {0: 8}


@pytest.mark.parametrize("engine", ENGINES)
def test_an_answer_cut_at_max_total_tokens_asks_for_what_is_left(engine):
    # The same, the answer 20 tokens: cut to max_new_tokens = 14 - 4 = 10. The last continuation
    # (input 12) asks for min(14 - 12, 4) = 2, 13 tokens of the 14 usable blocks (not 12 + 4 - 1 =
    # 15, which would never fit). ... -> 54 (8 tokens); prefill 12 -> 60, a decode -> 68.
    reqs = [Request(0, 0.0, 4, 20)]
    config = TgiConfig(max_batch_prefill_tokens=16, prefill_chunking=True, max_total_tokens=14,
                       generation_segment=4, default_max_tokens="max_total_tokens")
    r = run(reqs, config, engine, num_blocks=15, block_size=1)
    assert by_id(r, "max_tokens") == {0: 10}
    assert by_id(r, "finish_ms") == {0: 68.0}


def test_a_run_naming_its_gpu_takes_tgis_default():
    scheduler, _, _ = _assembled_run(run_text("h100-80gb", kind="tgi", model="llama-3.1-8b"))
    assert scheduler.config.default_max_tokens == "max_total_tokens"
    mine = run_text("h100-80gb", 'default_max_tokens = "output"', kind="tgi", model="llama-3.1-8b")
    assert _assembled_run(mine)[0].config.default_max_tokens == "output"
    assert TgiConfig().default_max_tokens == "output"


def _assembled_run(text):
    import pathlib
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        return _assembled(pathlib.Path(tmp), text)


# -- 4. CUDA graphs for decode-only passes --------------------------------------------------------------------

def test_a_pass_that_holds_a_prefill_launches_eagerly_under_tgi():
    scheduler, cost, _ = _assembled_run(run_text("h100-80gb", kind="tgi", model="llama-3.1-8b"))
    assert (cost.config.cuda_graph_max_tokens, cost.config.cuda_graph_prefill) == (32, False)
    vllm = _assembled_run(run_text("h100-80gb", kind="vllm", model="llama-3.1-8b"))[1]
    assert vllm.config.cuda_graph_prefill is True
    # 32 layers x 262 us = 8.384 ms to launch eagerly, more than the GPU's time for 8 tokens: the
    # 8-token prefill pass costs the launch; 8 decodes replay a graph (TGI's FlashCausalLM.forward:
    # cu_seqlen_prefill is not None -> no graph)
    prefill = Batch(num_prefill=1, prefill_tokens=8)
    decode = Batch(num_decode=8, decode_context_tokens=8 * 100)
    step = cost.step
    assert cost.kernel_ms(prefill) < 8.384
    assert cost.iteration_ms(prefill) == pytest.approx(step.host_ms(1) + 32 * 0.262)
    assert cost.iteration_ms(decode) == pytest.approx(step.host_ms(8) + cost.kernel_ms(decode))
    # the same cost model as vLLM runs it replays the prefill pass too
    graphed = type(cost)(cost.model, cost.gpu, attrs.evolve(cost.config, cuda_graph_prefill=True))
    assert graphed.iteration_ms(prefill) == pytest.approx(step.host_ms(1) + cost.kernel_ms(prefill))


def test_step_timing_replays_prefills_only_when_told():
    @attrs.frozen
    class S:
        async_scheduling: bool = False
        cuda_graphs: bool = True
        cuda_graph_max_tokens: int = 32
        cuda_graph_prefill: bool = False
        host_step_us: float = 0.0
        host_per_seq_us: float = 0.0
        tp_step_us: float = 0.0
        eager_layer_us: float = 100.0
        async_gap_us: float = 0.0
        overhead_ms: float = 0.0

    tgi = StepTiming(S(), layers=10)  # eager: 10 x 100 us = 1 ms
    assert tgi.step_ms(0.25, 8, 8) == 0.25  # decodes: a graph
    assert tgi.step_ms(0.25, 8, 1, True) == 1.0  # a prefill: eager
    assert tgi.step_ms(0.25, 33, 33) == 1.0  # past the graphs
    assert tgi.launch_ms(8, True) == 1.0 and tgi.shape(8, 1, True) == (0.0, 1.0, 0.0)
    vllm = StepTiming(S(cuda_graph_prefill=True), layers=10)
    assert vllm.step_ms(0.25, 8, 1, True) == 0.25


def test_tgi_segments_without_max_new_tokens_reserve_a_whole_segment_each():
    # experiments/tgi_segments.toml, reduced: clients that send no max_new_tokens (TGI's default,
    # every request reserving prompt + 1,024 - 1) hold more of the pool than clients sending their
    # answer's length, and their continuations are evicted more often (more tokens prefilled again)
    from test_experiments import metric, run as run_experiment_file

    results = run_experiment_file("tgi_segments.toml", ["workload.classes.chat.num_requests=200",
                                                        "workload.classes.reasoning.num_requests=40"])
    seg, default = (results.study(n).runs[0] for n in ("segments", "segments_default"))
    assert metric(default, "preemptions.recomputed_tokens") > metric(seg, "preemptions.recomputed_tokens")
    assert metric(default, "kv_usage.mean") > metric(seg, "kv_usage.mean")
    assert metric(default, "requeues") == metric(seg, "requeues")


TGI_SEGMENTS = """
[experiment]
reports = []
engine = "{engine}"
[workload]
kind = "inline"
requests = [{{prompt_tokens = 100, output_tokens = 60, max_tokens = 60}}]
[cost_model]
kind = "linear"
[scheduler]
kind = "tgi"
max_input_tokens = 4000
max_total_tokens = 8000
generation_segment = 16
[kv_cache]
kind = "paged"
num_blocks = 2000
"""
NGRAM = '[speculative]\nmethod = "ngram"\nnum_speculative_tokens = {k}\nacceptance_rate = 0.7\n'


@pytest.mark.parametrize("k", [1, 3])
def test_a_speculative_step_stops_at_the_answer_segments_end(tmp_path, k):
    """A 60-token answer in segments of 16 is requeued at 16, 32 and 48 tokens: its prompt is
    prefilled 1 + 3 times. With speculation a step that accepted drafts jumped over the boundary
    (15 -> 17): never requeued (1 prefill, nothing recomputed), and under memory pressure it decoded
    past its reservation until the run stalled. TGI keeps a step's tokens up to its stopping
    criterion and drops the rest (flash_causal_lm.generate_token): the step ends at the segment."""
    runs = {}
    for engine, extra in (("fast", NGRAM.format(k=k)), ("reference", NGRAM.format(k=k)), ("plain", "")):
        path = tmp_path / f"{engine}.toml"
        path.write_text(TGI_SEGMENTS.format(engine="fast" if engine == "plain" else engine) + extra)
        runs[engine] = run_experiment(load(path)).all_runs()[0]
    for engine in ("fast", "reference", "plain"):
        requests = runs[engine].requests
        assert int(requests["generated_tokens"][0]) == 60
        assert int(requests["prefill_chunks"][0]) == 4, engine
        assert int(requests["recomputed_tokens"][0]) == int(runs["plain"].requests["recomputed_tokens"][0]) > 0
    assert runs["fast"].metrics["speculative"]["accepted_tokens"] > 0  # (drafts accepted: steps gave > 1 token)
    compare_runs(runs["fast"], runs["reference"], rel=1e-12)


# --- review spec82: a continuation's blocks hold its speculative slots too ----------------------------------


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("blocks, served", [(18, 4), (20, 8)])
def test_a_segment_that_fits_only_without_its_draft_slots_ends_the_answer(tmp_path, engine, blocks, served):
    """One-token blocks, 1 kept for the health check; a 10-token prompt, an answer of 10 in
    segments of 4, n-gram drafts of k = 2. With 18 blocks (17 usable) segment 1 reserves 10 + 4 - 1
    + 2 = 15 slots, segment 2 would reserve 14 + 4 - 1 + 2 = 19: the answer ends at 4 tokens (it
    waited for ever: the continuation was passed without its draft slots). With 20 blocks (19) it
    gets 8: segment 2 takes 19, segment 3 would take 18 + 4 - 1 + 2 = 23."""
    from schedlab.study.experiment import load, run_experiment

    path = tmp_path / "exp.toml"
    path.write_text(f"""
[experiment]
name = "tgi spec"
engine = "{engine}"
reports = []
[workload]
kind = "inline"
requests = [{{prompt_tokens = 10, output_tokens = 10, arrival_ms = 0.0}}]
[scheduler]
kind = "tgi"
generation_segment = 4
[cost_model]
kind = "linear"
prefill_ms_per_token = 0.5
[kv_cache]
kind = "paged"
num_blocks = {blocks}
block_size = 1
prefix_caching = false
[speculative]
method = "ngram"
num_speculative_tokens = 2
acceptance_rate = 0.0
""")
    run = next(iter(run_experiment(load(path)).all_runs()))
    assert list(run.requests["generated_tokens"]) == [served] and list(run.requests["max_tokens"]) == [served]
