"""Speculation's KV slack near its limits, hand-computed on both engines (review s80, specpp).

* A drafter with lookahead slots (EAGLE, a draft model) never holds more than ``max_model_len``
  slots (``allocate_slots`` caps them there), so a request of ``prompt + max_tokens <=
  max_model_len`` fits a cache of ``max_model_len`` tokens: it was turned away by a reserving
  scheduler, asked about one slot more than the engine takes.
* A one-token answer (``max_tokens = 1``) runs one step, its prefill, which verifies no drafts:
  its slack is the lookahead alone (it was padded by ``k`` drafts: rejected, or reserving a block
  it never wrote).
* With ``first_token = "prefill"`` a one-token answer finishes on the prefill instance and never
  reaches the decode pool, whose cache size must not turn it away.
"""

from __future__ import annotations

import pytest

from schedlab.model import Request
from schedlab.speculative import SpeculativeConfig
from schedlab.testing import run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

from test_disaggregated import by_id, pool, run

ENGINES = ("fast", "reference")


def spec_run(request, blocks, allocation, method, engine, max_model_len=0):
    scheduler = ContinuousScheduler(ContinuousConfig(max_num_seqs=8, max_num_batched_tokens=256, allocation=allocation,
                                                     max_model_len=max_model_len))
    drafted = method != "ngram"
    spec = SpeculativeConfig(method=method, num_speculative_tokens=3, acceptance_rate=0.5,
                             draft={"kind": "linear"} if drafted else None)
    return run_engine([request], scheduler, LinearCostModel(LinearConfig()), kv_blocks=blocks, block_size=16,
                      speculative=spec, draft_cost=LinearCostModel(LinearConfig()) if drafted else None, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("allocation", ["grow", "reserve"])
@pytest.mark.parametrize("method", ["ngram", "eagle", "draft_model"])
def test_a_request_within_max_model_len_fits_a_cache_of_max_model_len(method, allocation, engine):
    # max_model_len 32 = two 16-token blocks; prompt 16 + max_tokens 16. Its slots never pass 32:
    # the KV of at most 31 tokens plus lookahead slots cut at 32. It runs on two blocks, all 16 tokens.
    r = spec_run(Request(0, 0.0, 16, 16), 2, allocation, method, engine, max_model_len=32)
    assert r.rejections == {}
    assert by_id(r, "generated_tokens")[0] == 16
    assert r.counters["kv_peak_blocks"] == 2
    # one token more than max_model_len allows is still cut, and a cache of one block still refuses it
    small = spec_run(Request(0, 0.0, 16, 16), 1, allocation, method, engine, max_model_len=32)
    assert list(small.rejections) == [0]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("allocation", ["grow", "reserve"])
def test_a_one_token_answer_holds_its_prompt_and_the_lookahead_only(allocation, engine):
    # EAGLE, k = 3 (3 lookahead slots): prompt 60 + max_tokens 1. Its one step, the prefill, takes
    # 60 + 3 = 63 slots: 4 blocks of 16 -- not 60 + 1 + 3 drafts + 3 = 67 (5 blocks).
    r = spec_run(Request(0, 0.0, 60, 1), 4, allocation, "eagle", engine)
    assert r.rejections == {}
    assert by_id(r, "generated_tokens")[0] == 1
    assert r.counters["kv_peak_blocks"] == 4
    big = spec_run(Request(0, 0.0, 60, 1), 8, allocation, "eagle", engine)
    assert big.counters["kv_peak_blocks"] == 4      # (a reserving scheduler held a 5th before)
    # 62 tokens + 3 lookahead slots = 65: 5 blocks, which a 4-block cache cannot hold
    assert list(spec_run(Request(0, 0.0, 62, 1), 4, allocation, "eagle", engine).rejections) == [0]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_one_token_answer_of_the_prefill_instance_never_meets_the_decode_pool(engine):
    # prompt 64 (4 blocks), one token; with first_token = "prefill" it finishes where it was
    # prefilled: 64 x 0.5 ms = 32 ms, nothing moved. A 3-block decode pool cannot hold it, and
    # does not need to; a two-token answer does go there and is turned away by it.
    one = run([Request(0, 0.0, 64, 1)], pool(16), pool(3), engine, first_token="prefill")
    assert one.rejections == {}
    assert by_id(one, "finish_ms")[0] == pytest.approx(32.0)
    assert by_id(one, "kv_bytes")[0] == 0
    two = run([Request(0, 0.0, 64, 2)], pool(16), pool(3), engine, first_token="prefill")
    assert list(two.rejections) == [0] and two.rejections[0].startswith("decode pool:")
    # the proxy's first token is discarded with first_token = "decode": the decode pool serves it
    decode = run([Request(0, 0.0, 64, 1)], pool(16), pool(3), engine)
    assert list(decode.rejections) == [0]
