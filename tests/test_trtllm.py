"""The ``trtllm`` preset against TensorRT-LLM's rules, worked out by hand on both engines.

* A request without ``max_tokens`` reserves ``max_seq_len - prompt`` under GUARANTEED_NO_EVICT
  (``BaseWorker._deduce_max_tokens``; ``kvCacheManager.cpp::getRemainingBlocksToCompletion``) and
  still stops at its own output; ``max_seq_len`` is reduced to what the KV cache holds
  (``KVCacheManager``), a longer ``max_tokens`` is cut to it, a prompt that fills it is rejected.
* With chunked context a chunk that is not a prompt's last is cut down to a multiple of the KV
  block size (``MicroBatchScheduler::setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>``), from
  the budget every generation request's token has left.
* The defaults: max_batch_size 2,048, block reuse in 32-token blocks, ``max_seq_len`` the model's
  context, the overlap scheduler on; a token budget below ``max_batch_size`` is accepted, and
  generation requests past it wait.

The linear cost model throughout: 0.05 ms a prompt token, 8 ms an iteration that decodes.
"""

from __future__ import annotations


import pytest

from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.study.experiment import load
from schedlab.study.simulation import assemble
from schedlab.testing import IterationChecker, check_run, compare_runs, run_engine
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.cost_models.linear import LinearConfig
from schedlab_plugins.schedulers.continuous import ContinuousConfig, ContinuousScheduler
from schedlab_plugins.schedulers.presets import TrtllmConfig, trtllm
from test_engine_defaults import run_text

ENGINES = ("fast", "reference")


def both(requests, config: TrtllmConfig, cost=None, **kv) -> dict:
    """The run on both engines (the scheduler drives both through the Plan protocol): they agree,
    and each run keeps the kit's conservation and capacity rules."""
    runs = {}
    for engine in ENGINES:
        runs[engine] = run_engine(requests, trtllm(config), cost, engine=engine, **kv)
        check_run(runs[engine], requests, max_running=config.max_num_seqs, kv_blocks=kv.get("kv_blocks"),
                  token_budget=config.max_num_batched_tokens)
    compare_runs(runs["fast"], runs["reference"])
    return runs


def column(run, name: str) -> list:
    return [float(x) for x in run.requests[name]]


# -- finding 1: no max_tokens -> max_seq_len - prompt reserved ----------------------------------------------


def test_a_request_without_max_tokens_reserves_the_rest_of_max_seq_len():
    # 20 blocks of 32 tokens; max_seq_len 320 = 10 blocks: each request without max_tokens reserves
    # 10 blocks, so two of three start at 0 and the third waits for them (schedlab used to reserve
    # its 150 tokens, 5 blocks, and start all three at 0). Each prefill of 100 tokens takes 5 ms,
    # then 49 decodes of 8 ms: the first two finish at 10 + 392 = 402 ms, the third starts there
    # and finishes at 402 + 5 + 392 = 799 ms.
    requests = [Request(id=i, arrival_ms=0, prompt_tokens=100, output_tokens=50) for i in range(3)]
    for overlap in (False, True):  # (the first two finish by their own EOS: no plan differs ahead)
        config = TrtllmConfig(max_seq_len=320, overlap_schedule=overlap)
        for run in both(requests, config, kv_blocks=20, block_size=32).values():
            assert column(run, "first_scheduled_ms") == [0, 0, 402]
            assert column(run, "first_token_ms") == [10, 10, 407]
            assert column(run, "finish_ms") == [402, 402, 799]
            assert list(run.requests["generated_tokens"]) == [50, 50, 50]  # (they stop at their own output)
            assert run.counters["kv_peak_blocks"] == 20


def test_a_clients_max_tokens_is_what_is_reserved():
    # max_tokens 70: prompt + max_tokens = 170 tokens, 6 blocks each -- all three fit 20 blocks at 0
    requests = [Request(id=i, arrival_ms=0, prompt_tokens=100, output_tokens=50, max_tokens=70) for i in range(3)]
    for run in both(requests, TrtllmConfig(max_seq_len=320, overlap_schedule=False), kv_blocks=20,
                    block_size=32).values():
        assert column(run, "first_scheduled_ms") == [0, 0, 0]
        assert column(run, "finish_ms") == [407] * 3  # 300 prompt tokens in 15 ms, 49 decodes
        assert run.counters["kv_peak_blocks"] == 18


def test_max_seq_len_is_reduced_to_what_the_cache_holds():
    # 20 blocks of 32 = 640 tokens: a max_seq_len of 100,000 is reduced to 640 (TensorRT-LLM's
    # KVCacheManager), so each request without max_tokens reserves the whole cache and they run one
    # at a time: 5 ms of prefill and 392 ms of decodes each
    requests = [Request(id=i, arrival_ms=0, prompt_tokens=100, output_tokens=50) for i in range(3)]
    for run in both(requests, TrtllmConfig(max_seq_len=100_000, overlap_schedule=False), kv_blocks=20,
                    block_size=32).values():
        assert column(run, "first_scheduled_ms") == [0, 397, 794]
        assert column(run, "finish_ms") == [397, 794, 1191]


def test_max_tokens_past_max_seq_len_are_cut_and_a_prompt_that_fills_it_is_rejected():
    # max_seq_len 320: prompt 300 without max_tokens may generate 20 (its output of 50 is cut: the
    # deduced max_tokens); prompt 100 with max_tokens 500 is clamped to 220 (LlmRequest::validate,
    # _deduce_max_tokens), generating 220 of its 400; a prompt of 320 leaves no room (rejected:
    # "default_max_tokens must be greater than 0")
    requests = [Request(id=0, arrival_ms=0, prompt_tokens=300, output_tokens=50),
                Request(id=1, arrival_ms=0, prompt_tokens=100, output_tokens=400, max_tokens=500),
                Request(id=2, arrival_ms=0, prompt_tokens=320, output_tokens=5)]
    for run in both(requests, TrtllmConfig(max_seq_len=320, overlap_schedule=False), kv_blocks=40,
                    block_size=32).values():
        assert run.requests["generated_tokens"].tolist() == [20, 220, 0]
        assert run.requests["max_tokens"].tolist()[:2] == [20, 220]  # (as served)
        assert list(run.rejections) == [2] and "no room" in run.rejections[2]


def test_without_max_seq_len_the_preset_reserves_a_requests_own_output():
    # max_seq_len 0 (no model named): the old reservation, prompt + output, 5 blocks each
    requests = [Request(id=i, arrival_ms=0, prompt_tokens=100, output_tokens=50) for i in range(3)]
    for run in both(requests, TrtllmConfig(overlap_schedule=False), kv_blocks=20, block_size=32).values():
        assert column(run, "first_scheduled_ms") == [0, 0, 0]


def test_default_max_tokens_needs_a_max_model_len():
    with pytest.raises(ConfigError, match="needs a max_model_len"):
        ContinuousConfig(default_max_tokens="max_model_len")


# -- finding 3: chunks in whole blocks, after the decodes ---------------------------------------------------


def test_a_chunk_that_is_not_the_last_is_a_multiple_of_the_block_size():
    # block 32, budget 100, one prompt of 200: chunks of 96, 96 and 8 (TensorRT-LLM), not 100 + 100;
    # with 1 ms an iteration the first token comes at the end of the third: 3 + 0.05 x 200 = 13 ms
    cost = LinearCostModel(LinearConfig(base_ms=1.0))
    requests = [Request(id=0, arrival_ms=0, prompt_tokens=200, output_tokens=3)]
    config = TrtllmConfig(chunked_prefill=True, max_num_batched_tokens=100, max_num_seqs=4, overlap_schedule=False)
    runs = both(requests, config, cost, kv_blocks=100, block_size=32)
    for run in runs.values():
        assert column(run, "first_token_ms") == pytest.approx([13.0])
        assert list(run.requests["prefill_chunks"]) == [3]
        assert column(run, "finish_ms") == pytest.approx([13.0 + 2 * 9.0])
    assert [float(x) for x in runs["fast"].timeline["prefill_tokens"][:3]] == [96, 96, 8]


def test_chunks_take_what_the_decodes_leave_in_whole_blocks():
    # four requests decode (prompt 8, 40 tokens each); budget 64, block 32; a prompt of 120 arrives at
    # 5 ms. Every decode takes its token first, so the chunk capacity is 60: chunks of 32, 32 and
    # the last 56 (not rounded). Times: the four prompts in 1.6 ms, a decode to 9.6; then
    # 8 + 1.6 = 9.6 ms twice (to 28.8) and 8 + 2.8 = 10.8 (to 39.6), the prompt's first token; its
    # second at 47.6. (Without rounding: 60 + 60, first token at 9.6 + 11 + 11 = 31.6.)
    requests = [Request(id=i, arrival_ms=0, prompt_tokens=8, output_tokens=40) for i in range(4)]
    requests.append(Request(id=4, arrival_ms=5, prompt_tokens=120, output_tokens=2))
    config = TrtllmConfig(chunked_prefill=True, max_num_batched_tokens=64, max_num_seqs=8, overlap_schedule=False)
    runs = both(requests, config, kv_blocks=100, block_size=32)
    for run in runs.values():
        assert column(run, "first_scheduled_ms")[4] == pytest.approx(9.6)
        assert column(run, "first_token_ms")[4] == pytest.approx(39.6)
        assert column(run, "finish_ms")[4] == pytest.approx(47.6)
        assert run.requests["prefill_chunks"][4] == 3
    prefill = [float(x) for x in runs["fast"].timeline["prefill_tokens"]]
    assert [x for x in prefill if x][:4] == [32, 32, 32, 56]  # (the four prompts of 8, then the chunks)


def test_a_budget_below_the_chunk_unit_rejects_longer_prompts():
    # chunks of whole 32-token blocks from a budget of 20: a prompt of 18 fits one step, one of 40 never
    requests = [Request(id=0, arrival_ms=0, prompt_tokens=18, output_tokens=2),
                Request(id=1, arrival_ms=0, prompt_tokens=40, output_tokens=2)]
    config = TrtllmConfig(chunked_prefill=True, max_num_batched_tokens=20, max_num_seqs=4, overlap_schedule=False)
    for run in both(requests, config, kv_blocks=100, block_size=32).values():
        assert run.requests["generated_tokens"].tolist() == [2, 0]
        assert list(run.rejections) == [1] and "chunk_unit" in run.rejections[1]


def test_other_schedulers_do_not_round_their_chunks():
    # the continuous default (vLLM's rule): chunks of the whole budget, 100 + 100
    requests = [Request(id=0, arrival_ms=0, prompt_tokens=200, output_tokens=3)]
    config = ContinuousConfig(chunked_prefill=True, max_num_batched_tokens=100, max_num_seqs=4)
    run = run_engine(requests, ContinuousScheduler(config), kv_blocks=100, block_size=32)
    assert list(run.requests["prefill_chunks"]) == [2]


# -- finding 2: defaults ------------------------------------------------------------------------------------


def assembled(tmp_path, scheduler: str = "", kv_cache: str = "", cluster: str = ""):
    path = tmp_path / "exp.toml"
    path.write_text(run_text("a100-80gb", scheduler, kind="trtllm", kv_cache=kv_cache) + cluster)
    exp = load(path)
    return assemble(exp.studies[0].base, exp.context, "x")


def test_a_run_takes_tensorrt_llms_defaults(tmp_path):
    scheduler, _, kv = assembled(tmp_path).instances[0]
    c = scheduler.config
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.chunked_prefill) == (2048, 8192, False)
    assert c.model_context == 8192 and c.max_model_len == "auto"  # llama-3-8b's context, capped by the cache
    assert c.default_max_tokens == "max_model_len" and c.allocation == "reserve"
    assert scheduler.plans_ahead  # the overlap scheduler
    assert kv.prefix_caching and kv.block_size == 32  # block reuse, tokens_per_block


def test_a_runs_own_settings_win(tmp_path):
    scheduler, cost, kv = assembled(tmp_path, "max_seq_len = 4096\noverlap_schedule = false",
                                    "block_size = 64\nprefix_caching = false").instances[0]
    assert scheduler.config.model_context == 4096 and not scheduler.plans_ahead
    assert not kv.prefix_caching and kv.block_size == 64
    assert cost.config.async_scheduling is False  # (no overlap: the host's work between the steps)
    assert assembled(tmp_path).instances[0][1].config.async_scheduling is True


def test_run_defaults_take_the_models_context():
    class Model:
        max_position_embeddings = 131072

    assert TrtllmConfig.run_defaults(None, Model(), {}) == {"max_seq_len": 131072}
    assert TrtllmConfig.run_defaults(None, Model(), {"max_seq_len": 4096}) == {}
    assert TrtllmConfig.run_defaults(None, None, {}) == {}


def test_the_overlap_scheduler_is_off_where_its_loop_is_not_modelled(tmp_path):
    cluster = "[cluster]\npipeline_parallel = 2\n"
    scheduler = assembled(tmp_path, cluster=cluster).instances[0][0]
    assert not scheduler.plans_ahead
    # ... and asked for there by name, refused by its own name (vLLM's asynchronous rules, which
    # model vLLM with pipelines and speculation, are not TensorRT-LLM's loop there)
    for extra in (cluster, '[speculative]\nmethod = "ngram"\n'):
        with pytest.raises(ConfigError, match=r"\[scheduler\]: overlap_schedule: not modelled with "):
            assembled(tmp_path, "overlap_schedule = true", cluster=extra)


def test_a_budget_below_max_batch_size_is_accepted():
    # TensorRT-LLM accepts max_num_tokens < max_batch_size (its MicroBatchScheduler stops at the budget,
    # generation requests too); vLLM refuses it. Budget 3, 5 requests (prompt 1, 3 tokens): three
    # prompts at 0 (0.15 ms), their two decodes (to 16.15 ms) while 3 and 4 wait for the budget, then
    # 3 and 4 (prompts to 16.25, decodes to 32.25)
    with pytest.raises(ConfigError, match="vLLM refuses the same"):
        ContinuousConfig(max_num_seqs=8, max_num_batched_tokens=3)
    requests = [Request(id=i, arrival_ms=0, prompt_tokens=1, output_tokens=3) for i in range(5)]
    config = TrtllmConfig(max_num_seqs=8, max_num_batched_tokens=3, overlap_schedule=False)
    assert trtllm(config).stable_between_events is False  # (a decode-only plan may leave decodes out)
    runs = both(requests, config, kv_blocks=100, block_size=16)
    for run in runs.values():
        assert column(run, "first_token_ms") == pytest.approx([0.15] * 3 + [16.25] * 2)
        assert column(run, "finish_ms") == pytest.approx([16.15] * 3 + [32.25] * 2)
    run_engine(requests, trtllm(config), kv_blocks=100, block_size=16,
               check=IterationChecker(max_running=8, token_budget=3))


@pytest.mark.parametrize("policy", ["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"])
def test_admission_asks_the_blocks_a_prefix_hit_would_share(policy):
    """TensorRT-LLM's capacity scheduler counts a request's blocks to completion (GNE:
    ``getRemainingBlocksToCompletion``, prompt + max_tokens) or its prompt's (MU:
    ``getNeededBlocksOneStep``) without block reuse. 13 blocks of 32 tokens; A and B: 288-token
    prompts (9 blocks, the first 8 a shared 256-token prefix), max_tokens 32 (10 blocks). B arrives
    at 30 ms while A decodes with 3-4 blocks free: it waits for A (it started at once, taking
    A's 8 prefix blocks as its own), and still reuses the prefix when it goes."""
    from schedlab_plugins.kv_caches.prefix import PrefixKVCache

    requests = [Request(id=i, arrival_ms=30.0 * i, prompt_tokens=288, output_tokens=32, max_tokens=32,
                        prefix_group="sys", prefix_tokens=256) for i in range(2)]
    config = TrtllmConfig(capacity_policy=policy, overlap_schedule=False)
    runs = [run_engine(requests, trtllm(config), engine=engine, kv=PrefixKVCache(13, 32)) for engine in ENGINES]
    compare_runs(*runs)
    a_finish, b_start = runs[0].requests["finish_ms"][0], runs[0].requests["first_scheduled_ms"][1]
    assert b_start == a_finish > 30.0
    assert int(runs[0].requests["cached_tokens"][1]) == 256
    # vLLM's rule (the continuous default) lets B in at its arrival, sharing A's prefix blocks
    vllm_like = run_engine(requests, ContinuousScheduler(ContinuousConfig(allocation="reserve")),
                           kv=PrefixKVCache(13, 32))
    assert vllm_like.requests["first_scheduled_ms"][1] < a_finish
