"""TGI's request validation and answer segments (text-generation-inference v3.3.7, commit dfb3fbe).

The router refuses a request whose prompt + ``max_new_tokens`` exceeds ``max_total_tokens`` or
whose prompt exceeds ``max_input_tokens`` (``router/src/validation.rs``); the warmup sets them
where the launcher was not told (``FlashCausalLM.warmup``: with chunking the KV pool or the
context, without the prefill budget). Since v3.1.1 it schedules at most 1,024 new tokens of a
request at a time and sends a request that reaches them back to the end of the queue, prefilled
again with its answer (``router/src/infer/mod.rs``); each continuation is validated like a new
request, and the answer ends where one is refused. Timelines worked out by hand with 0.5 ms per
prompt token and 8 ms per decode pass.
"""

from __future__ import annotations

import pytest

from schedlab.configs import from_table
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.study.experiment import load
from schedlab.study.simulation import assemble
from schedlab.testing import check_run, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import TgiConfig, TgiScheduler
from schedlab_plugins.schedulers.tgi_launcher import model_flop, prefill_tokens, vram_tokens
from test_engine_defaults import run_text

ENGINES = ("fast", "reference")
COST = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def run(requests, config, engine, *, num_blocks=64, block_size=4, cache=PagedKVCache):
    return run_engine(requests, TgiScheduler(config), LinearCostModel(COST), cache(num_blocks, block_size),
                      engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_long_answer_goes_back_to_the_queue_after_each_segment(engine):
    # Segments of 2 tokens; prompt 4, answer 5. t=0: prefill 4 (2 ms) -> token 1 at 2; a decode
    # -> token 2 at 10, the segment's last: back to the queue, prefilled again with its answer,
    # 4 + 2 = 6 tokens (3 ms) -> token 3 at 13; a decode -> token 4 at 21; again 8 tokens (4 ms)
    # -> token 5 at 25. Recomputed: the 5 tokens whose KV was written, then 7.
    reqs = [Request(0, 0.0, 4, 5)]
    r = run(reqs, TgiConfig(generation_segment=2), engine)
    assert by_id(r, "first_token_ms") == {0: 2.0}
    assert by_id(r, "finish_ms") == {0: 25.0}
    assert r.metrics["requeues"] == 2 and r.metrics["num_preemptions"] == 0
    assert by_id(r, "recomputed_tokens") == {0: 12}
    assert by_id(r, "max_tokens") == {0: 5}
    check_run(r, reqs, kv_blocks=63)
    # TGI v3.0's whole answers: one prefill, four decodes -> 2 + 32 = 34
    whole = run(reqs, TgiConfig(generation_segment=0), engine)
    assert by_id(whole, "finish_ms") == {0: 34.0} and whole.metrics["requeues"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cached_answer_is_not_computed_again(engine):
    # With a prefix cache (blocks of 4) the full block of the prompt is found again: the second
    # turn prefills positions 4-5 (1 ms) -> token 3 at 11, a decode -> 19; the third positions
    # 4-7 (2 ms) -> 21.
    reqs = [Request(0, 0.0, 4, 5)]
    r = run(reqs, TgiConfig(generation_segment=2), engine, cache=PrefixKVCache)
    assert by_id(r, "finish_ms") == {0: 21.0}
    assert by_id(r, "cached_tokens") == {0: 8}
    assert r.metrics["requeues"] == 2


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("block_size", [1, 2])
def test_a_continuation_finds_the_last_segments_input_not_its_answer(engine, block_size):
    # TGI's radix allocator puts an allocation's input (prefill_tokens) in its trie when the
    # allocation is freed (radix.rs free), never the tokens it generated. Prompt 4, 12 tokens,
    # segments of 4, blocks of 1 (flashinfer) or 2. Segment 1: prefill 4 (2 ms) -> token 1 at 2;
    # decodes -> 10, 18, 26 (token 4). Its input, the 4 prompt tokens, goes in the trie. Segment 2
    # (input 8): 4 found, 4 prefilled (2 ms) -> token 5 at 28; decodes -> 52. Its input, 8 tokens,
    # goes in. Segment 3 (input 12): 8 found, 4 prefilled -> 54; decodes -> 62, 70, 78. Cached 4 + 8.
    # (Finding the answer too, each continuation prefilled a token or a block: 75 or 76 ms.)
    reqs = [Request(0, 0.0, 4, 12)]
    r = run(reqs, TgiConfig(generation_segment=4), engine, block_size=block_size, cache=PrefixKVCache)
    assert by_id(r, "first_token_ms") == {0: 2.0}
    assert by_id(r, "finish_ms") == {0: 78.0}
    assert by_id(r, "cached_tokens") == {0: 12}
    assert r.metrics["requeues"] == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_prompt_is_found_only_once_its_request_has_finished(engine):
    # 1-token blocks; A, B and C have the same 8-token prompt. A (3 tokens) at 0: prefill 8 (4 ms)
    # -> 4, a decode -> 12. B (2 tokens) arrives at 5, while A runs: TGI's trie gets A's prompt when
    # A's allocation is freed, so B finds nothing and prefills 8 in a pass of its own, 12 -> 16;
    # then a decode -> 24: both finish. C at 200 finds the whole prompt, less one token (TGI keeps
    # at least one to compute): prefill 1 token (0.5 ms) -> 200.5. (Found at once, B prefilled one
    # token and both finished at 20.5.)
    reqs = [Request(0, 0.0, 8, 3, prefix_group="g", prefix_tokens=8),
            Request(1, 5.0, 8, 2, prefix_group="g", prefix_tokens=8),
            Request(2, 200.0, 8, 1, prefix_group="g", prefix_tokens=8)]
    r = run(reqs, TgiConfig(), engine, block_size=1, cache=PrefixKVCache)
    assert by_id(r, "cached_tokens") == {0: 0, 1: 0, 2: 7}
    assert by_id(r, "finish_ms") == {0: 24.0, 1: 24.0, 2: 200.5}


@pytest.mark.parametrize("engine", ENGINES)
def test_no_new_batch_while_the_block_tables_fill_the_pool(engine):
    # TGI's token_budget = max_batch_total_tokens - batch.max_tokens (backend.rs), the latter the
    # running requests' block tables, a shared prefix counted in each; at 0 next_batch returns
    # None. A pool of 42 1-token blocks, chunking. A (prompt 16, 1 token) at 0: 8 ms; its prompt
    # goes in the trie. B and C (the same prompt, 10 tokens) at 20: 15 tokens found each, one
    # prefilled each (1 ms) -> 21; their tables hold 16 + 10 - 1 = 25 blocks each, 50 > 42. D
    # (prompt 4, 1 token) at 30 would fit the free blocks, but no batch is taken until B and C
    # finish at 21 + 9 x 8 = 93: D runs 93 -> 95. (Without the check: D joins at 37, its prefill
    # beside their decodes -> 47, and they finish at 95.)
    reqs = [Request(0, 0.0, 16, 1, prefix_group="g", prefix_tokens=16),
            Request(1, 20.0, 16, 10, prefix_group="g", prefix_tokens=16),
            Request(2, 20.0, 16, 10, prefix_group="g", prefix_tokens=16),
            Request(3, 30.0, 4, 1)]
    r = run(reqs, TgiConfig(prefill_chunking=True), engine, num_blocks=42, block_size=1, cache=PrefixKVCache)
    assert by_id(r, "cached_tokens") == {0: 0, 1: 15, 2: 15, 3: 0}
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 20.0, 2: 20.0, 3: 93.0}
    assert by_id(r, "finish_ms") == {0: 8.0, 1: 93.0, 2: 93.0, 3: 95.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_sent_back_queues_behind_those_already_waiting(engine):
    # Budget 8 tokens, segments of 2. A (prompt 4, 3 tokens): prefill to 2, decode to 10. C
    # (prompt 4, 1 token) arrives at 5. At 10 A goes back to the end of the queue, behind C: the
    # new batch takes C (4 tokens) and stops at A (6 more would exceed 8) -> C's token at 12;
    # then A's 6 tokens -> 15. (Sent back to the front, A would finish at 13 and C at 15.)
    reqs = [Request(0, 0.0, 4, 3), Request(1, 5.0, 4, 1)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=8, generation_segment=2), engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 10.0}
    assert by_id(r, "finish_ms") == {0: 15.0, 1: 12.0}
    assert r.metrics["requeues"] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_continuations_are_validated_and_the_answer_ends_where_one_is_refused(engine):
    # Chunking, 5 blocks of 4 (block 0 kept): TGI's warmup gives max_total_tokens = the pool's 20
    # tokens; max_input_tokens is set to 16. Segments of 4. A (prompt 4, wants 20): its second
    # turn starts from 8 tokens and reserves 8 + 4 - 1 = 11 (3 blocks), its third from 12 (15 =
    # 4 blocks), a fourth would need 16 + 4 - 1 = 19 tokens = 5 blocks -- more than the
    # allocator has: A is served 12 tokens. B (prompt 17): 17 + 3 <= 20, but 17 > 16.
    # D (prompt 13, 6 tokens): its first segment reserves 13 + 4 - 1 = 16 tokens (4 blocks).
    reqs = [Request(0, 0.0, 4, 20), Request(1, 0.0, 17, 3), Request(2, 100.0, 13, 6)]
    config = TgiConfig(prefill_chunking=True, max_input_tokens=16, generation_segment=4)
    r = run(reqs, config, engine, num_blocks=5)
    assert by_id(r, "rejected") == {0: 0, 1: 1, 2: 0}
    assert r.rejections[1] == "`inputs` must have less than 16 tokens. Given: 17"
    assert by_id(r, "max_tokens")[0] == 12 and by_id(r, "generated_tokens")[0] == 12
    # D's second turn would start from 17 tokens, over max_input_tokens: its answer ends at 4
    assert by_id(r, "max_tokens")[2] == 4 and by_id(r, "generated_tokens")[2] == 4
    check_run(r, reqs, kv_blocks=4)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_default_answer_of_no_tokens_is_refused_not_stalled(engine):
    # Chunking, 6 blocks of 1 token: the warmup gives max_total_tokens = 6, and max_input_tokens
    # is set to 6 (TGI would not start: start_up_problem says so, the run goes on). A 6-token
    # prompt without max_tokens gets TGI's default max_new_tokens, 6 - 6 = 0: refused with TGI's
    # message (it stalled the engines, waiting for 8 blocks); a 2-token prompt gets 4 and is served.
    reqs = [Request(0, 0.0, 6, 2), Request(1, 0.0, 2, 2)]
    config = TgiConfig(prefill_chunking=True, max_batch_prefill_tokens=6, max_input_tokens=6,
                       default_max_tokens="max_total_tokens")
    r = run(reqs, config, engine, num_blocks=6, block_size=1)
    assert by_id(r, "rejected") == {0: 1, 1: 0} and by_id(r, "generated_tokens") == {0: 0, 1: 2}
    assert r.rejections[0] == "`max_new_tokens` must be strictly positive"


def test_a_default_answer_of_no_tokens_meets_tgis_checks_in_tgis_order():
    # max_total_tokens 40, max_input_tokens 39 (TGI starts). Without max_tokens the default
    # answer is 40 - prompt, at least 0 (saturating_sub); validate_input checks MaxTotalTokens,
    # then InputLength: a 50-token prompt fails the first (50 + 0 > 40), a 40-token one the
    # second (40 > 39); neither reaches "strictly positive", which TGI says only of a given 0.
    kv = PagedKVCache(64, 4)
    scheduler = TgiScheduler(TgiConfig(max_batch_prefill_tokens=40, max_total_tokens=40, max_input_tokens=39,
                                       default_max_tokens="max_total_tokens"))
    assert scheduler.start_up_problem(kv) is None
    assert scheduler.rejection_reason(Request(0, 0.0, 50, 2), kv) == (
        "`inputs` tokens + `max_new_tokens` must be <= 40. Given: 50 `inputs` tokens and 0 `max_new_tokens`")
    assert scheduler.rejection_reason(Request(0, 0.0, 40, 2), kv) == "`inputs` must have less than 39 tokens. Given: 40"
    assert scheduler.rejection_reason(Request(0, 0.0, 39, 2), kv) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_a_client_leaving_mid_chunked_prefill_leaves_no_chunk_behind(engine):
    # Chunks of 16 (0.5 ms a token: 8 ms each): request 0's 36-token prompt takes 16 + 16 + 4;
    # its client leaves at 5 ms, in the first chunk, and the engine takes it out after that
    # pass. Request 1 (19 tokens, at 1 ms) is then batched alone: the scheduler must not plan a
    # second chunk for request 0 (it raised "request 0 is aborted" in both engines).
    reqs = [Request(0, 0.0, 36, 10, timeout_ms=5.0), Request(1, 1.0, 19, 12)]
    r = run(reqs, TgiConfig(prefill_chunking=True, max_batch_prefill_tokens=16), engine, num_blocks=16)
    assert by_id(r, "aborted") == {0: 1, 1: 0} and by_id(r, "generated_tokens")[1] == 12
    check_run(r, reqs)


@pytest.mark.parametrize("engine", ENGINES)
def test_max_total_tokens_counts_only_the_first_segment(engine):
    # max_total_tokens 10 (chunking): prompt 6 asking 30 tokens passes, as 6 + min(30, 4) = 10;
    # its continuation from 10 tokens does not (10 + 4 > 10, and 10 >= max_input 9): 4 tokens.
    # Without segments the same request asks 6 + 30 > 10 and is refused with TGI's message.
    reqs = [Request(0, 0.0, 6, 30)]
    r = run(reqs, TgiConfig(prefill_chunking=True, max_total_tokens=10, generation_segment=4), engine)
    assert by_id(r, "generated_tokens") == {0: 4} and r.metrics["requeues"] == 0
    whole = run(reqs, TgiConfig(prefill_chunking=True, max_total_tokens=10, generation_segment=0), engine)
    assert whole.rejections[0] == ("`inputs` tokens + `max_new_tokens` must be <= 10. Given: 6 `inputs` tokens "
                                   "and 30 `max_new_tokens`")


def test_context_length_bounds_max_total_tokens_with_chunking():
    kv = PagedKVCache(1000, 16)  # 16,000 tokens
    assert TgiScheduler(TgiConfig(prefill_chunking=True)).limits(kv) == (15999, 16000)
    assert TgiScheduler(TgiConfig(prefill_chunking=True, context_length=8192)).limits(kv) == (8191, 8192)
    # without chunking: the warmup batch, max_batch_prefill_tokens
    assert TgiScheduler(TgiConfig(context_length=8192)).limits(kv) == (4095, 4096)
    assert TgiScheduler(TgiConfig(max_total_tokens=3000, max_input_tokens=1000)).limits(kv) == (1000, 3000)


def test_limits_tgi_refuses_to_start_with_are_config_errors():
    with pytest.raises(ConfigError, match=r"max_input_tokens.*\(10\) must be < max_total_tokens \(10\)"):
        from_table(TgiConfig, {"max_input_tokens": 10, "max_total_tokens": 10}, where="x.toml [scheduler]")
    with pytest.raises(ConfigError, match=r"max_batch_prefill_tokens.*\(4096\) must be >= max_input_tokens "
                                          r"\(4999 = max_total_tokens - 1\) without prefill chunking"):
        from_table(TgiConfig, {"max_total_tokens": 5000}, where="x.toml [scheduler]")
    ok = from_table(TgiConfig, {"max_total_tokens": 5000, "prefill_chunking": True}, where="x.toml [scheduler]")
    assert ok.generation_segment == 1024


def test_a_prefill_budget_or_max_total_tokens_over_the_pool_stops_tgi_from_starting():
    # backends/v3/src/main.rs: max_batch_prefill_tokens and max_total_tokens must be <=
    # max_batch_total_tokens, the pool's 40 blocks x 1 token
    kv = PagedKVCache(40, 1)
    problem = TgiScheduler(TgiConfig(prefill_chunking=True)).start_up_problem(kv)
    assert problem == ("TGI would refuse to start: `max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. "
                       "Given: 4096 and 40 (the KV pool's tokens); set [scheduler] max_batch_prefill_tokens <= 40")
    problem = TgiScheduler(TgiConfig(prefill_chunking=True, max_batch_prefill_tokens=32,
                                     max_total_tokens=1000)).start_up_problem(kv)
    assert problem == ("TGI would refuse to start: `max_total_tokens` must be <= `max_batch_total_tokens`. "
                       "Given: 1000 and 40 (the KV pool's tokens); set [scheduler] max_total_tokens <= 40")
    # the warmup's own max_total_tokens: with chunking the pool (40), without the budget (32)
    assert TgiScheduler(TgiConfig(prefill_chunking=True, max_batch_prefill_tokens=32)).start_up_problem(kv) is None
    assert TgiScheduler(TgiConfig(max_batch_prefill_tokens=32)).start_up_problem(kv) is None
    assert TgiScheduler(TgiConfig(max_batch_prefill_tokens=40, max_total_tokens=40)).start_up_problem(kv) is None
    # max_input_tokens given, max_total_tokens left to the warmup: 2 blocks of 1 token with chunking (a run with
    # them stalled: TGI's default max_new_tokens, max_total_tokens - input, was 0 for a 2-token prompt)
    small = PagedKVCache(2, 1)
    problem = TgiScheduler(TgiConfig(prefill_chunking=True, max_batch_prefill_tokens=2,
                                     max_input_tokens=2)).start_up_problem(small)
    assert problem == ("TGI would refuse to start: `max_input_tokens` must be < `max_total_tokens`. Given: 2 and 2 "
                       "(max_total_tokens as the warmup settles it on this KV pool); set [scheduler] max_input_tokens "
                       "< 2, or max_total_tokens")
    assert TgiScheduler(TgiConfig(prefill_chunking=True, max_batch_prefill_tokens=2,
                                  max_input_tokens=1)).start_up_problem(small) is None


# -- what TGI's launcher picks on the run's GPU and model ------------------------------------------------


def _presets():
    from schedlab_plugins.presets import GPUS, MODELS
    return {spec.name: spec for spec, _ in GPUS}, {spec.name: spec for spec, _ in MODELS}


def test_the_prefill_budget_is_the_gpus_flops_over_the_models():
    gpus, models = _presets()
    llama = models["llama-3.1-8b"]
    # Config::flop per layer: q, "attn" and o 3 x 2 x 32 x 128 x 4096 = 100,663,296; k and v
    # 2 x 2 x 8 x 128 x 4096 = 16,777,216; the MLP 6 x 4096 x 14336 = 352,321,536; x 32 layers
    assert model_flop(llama) == 15_032_385_536
    # H100 900 TFLOPS // that = 59,870; A100 312 -> 20,755; L4 121 -> 8,049 (f16, TGI's table)
    assert TgiConfig.run_defaults(gpus["h100-80gb"], llama, {}) == {
        "context_length": 131072, "prefill_chunking": True, "max_batch_prefill_tokens": 59870,
        "default_max_tokens": "max_total_tokens"}
    assert prefill_tokens(gpus["a100-80gb"], llama) == 20755
    assert prefill_tokens(gpus["l4"], llama) == 8049
    # Llama-3-8B: the same FLOPs, its 8,192-token context bounds it
    assert prefill_tokens(gpus["h100-80gb"], models["llama-3-8b"]) == 8192
    # four A100s for Llama-3-70B: 4 x 312e12 // 147,639,500,800 = 8,453 -> its context, 8,192
    assert prefill_tokens(gpus["a100-80gb"], models["llama-3-70b"], 4) == 8192
    assert prefill_tokens(gpus["a100-80gb"], models["llama-3-70b"], 1) == 2113
    # cards the launcher does not know by name: 4,096 ("NVIDIA GeForce RTX 4090" is not its "nvidia-4090")
    assert prefill_tokens(gpus["rtx-4090"], llama) == 4096
    assert prefill_tokens(None, None) == 4096
    # what the weights leave of 0.95 x 80 GiB (f32), over KV 131,072 + MLP 129,024 bytes a token:
    # (81,604,378,624 - 14,449,770,496) // 260,096
    assert vram_tokens(gpus["h100-80gb"], llama, 1) == 258_191
    # what the table says stays; a run without a GPU keeps the non-chunked default
    assert TgiConfig.run_defaults(gpus["h100-80gb"], llama, {"max_batch_prefill_tokens": 2048,
                                                             "prefill_chunking": False,
                                                             "default_max_tokens": "output"}) == {"context_length": 131072}
    assert TgiConfig.run_defaults(None, llama, {}) == {"context_length": 131072, "max_batch_prefill_tokens": 4096,
                                                       "default_max_tokens": "max_total_tokens"}


def _assembled(tmp_path, text: str):
    path = tmp_path / "exp.toml"
    path.write_text(text)
    exp = load(path)
    return assemble(exp.studies[0].base, exp.context, "x").instances[0]


def test_a_tgi_run_takes_the_launchers_defaults(tmp_path):
    scheduler, cost, kv = _assembled(tmp_path, run_text("h100-80gb", kind="tgi", model="llama-3.1-8b"))
    c = scheduler.config
    assert (c.max_batch_prefill_tokens, c.prefill_chunking, c.context_length) == (59870, True, 131072)
    assert isinstance(kv, PrefixKVCache)  # TGI v3 caches prefixes on flashinfer attention ...
    assert kv.block_size == 1  # ... in blocks of one token (globals.py BLOCK_SIZE)
    # CUDA graphs for decode batches of up to 32 (the launcher's cuda_graphs), synchronous steps
    assert (cost.config.cuda_graph_max_tokens, cost.config.async_scheduling) == (32, False)
    assert scheduler.start_up_problem(kv) is None
    # two shards: 2 x 900e12 // 15,032,385,536 = 119,741 tokens
    two = run_text("h100-80gb", kind="tgi", model="llama-3.1-8b").replace(
        'kind = "roofline"', 'kind = "roofline"\ntensor_parallel = 2').replace(
        'kind = "paged"', 'kind = "paged"\ntensor_parallel = 2')
    assert _assembled(tmp_path, two)[0].config.max_batch_prefill_tokens == 119741
    mine = run_text("h100-80gb", "max_batch_prefill_tokens = 4096\nprefill_chunking = false", kind="tgi",
                    model="llama-3.1-8b")
    assert (_assembled(tmp_path, mine)[0].config.max_batch_prefill_tokens,
            _assembled(tmp_path, mine)[0].config.prefill_chunking) == (4096, False)
    # another attention backend's blocks (paged 16, flashdecoding 256) are the [kv_cache] table's
    paged = run_text("h100-80gb", kind="tgi", model="llama-3.1-8b").replace('kind = "paged"',
                                                                             'kind = "paged"\nblock_size = 16')
    assert _assembled(tmp_path, paged)[2].block_size == 16


@pytest.mark.parametrize("engine", ENGINES)
def test_beyond_max_concurrent_requests_the_router_answers_overloaded(engine):
    # At most 2 in flight. A (prompt 4, 2 tokens), B (4, 1) and C (4, 1) at 0: C is refused. t=0:
    # A and B prefilled (8 tokens, 4 ms): B done at 4. D at 3 is refused -- B is still in flight,
    # although the iteration finishing it has begun. E at 4 is taken (B ended at 4): prefilled
    # alone to 6 (its one token). A decodes 6 -> 14. F at 10 (A in flight, E gone) is taken and
    # prefilled when A is done: 14 -> 16.
    reqs = [Request(0, 0.0, 4, 2), Request(1, 0.0, 4, 1), Request(2, 0.0, 4, 1), Request(3, 3.0, 4, 1),
            Request(4, 4.0, 4, 1), Request(5, 10.0, 4, 1)]
    r = run(reqs, TgiConfig(max_concurrent_requests=2), engine)
    assert by_id(r, "rejected") == {0: 0, 1: 0, 2: 1, 3: 1, 4: 0, 5: 0}
    assert r.rejections[2] == r.rejections[3] == "Model is overloaded: 2 requests in flight (max_concurrent_requests)"
    assert {i: t for i, t in by_id(r, "finish_ms").items() if i in (0, 1, 4, 5)} == {0: 14.0, 1: 4.0, 4: 6.0,
                                                                                      5: 16.0}
