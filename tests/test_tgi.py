"""The ``tgi`` scheduler: text-generation-inference v3.3.7's router, rule by rule.

Hand-computed scenarios run on both engines (every timestamp is worked out in the comments;
0.5 ms per prompt token, 8 ms per decode pass, 4-token KV blocks); hypothesis checks the rules
that hold in every run (FIFO admission, no preemption, block 0 never used, pass shapes) and the
fast engine against the reference engine.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlab.configs import from_table
from schedlab.errors import ConfigError
from schedlab.model import Request
from schedlab.testing import check_run, compare_runs, dyadic_linear_costs, examples, requests_lists, run_engine
from schedlab_plugins.cost_models import LinearConfig, LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache, PrefixKVCache
from schedlab_plugins.schedulers import TgiConfig, TgiScheduler

ENGINES = ("fast", "reference")
COST = LinearConfig(prefill_ms_per_token=0.5, decode_ms_per_step=8.0)
SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def by_id(result, column):
    return dict(zip(result.requests["id"].tolist(), result.requests[column].tolist()))


def run(requests, config, engine, *, num_blocks=64, block_size=4, **kw):
    return run_engine(requests, TgiScheduler(config), LinearCostModel(COST), PagedKVCache(num_blocks, block_size),
                      engine=engine, **kw)


# -- the block allocator: input + max_new_tokens - 1 at admission, block 0 kept back -----------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_blocks_for_input_plus_max_new_tokens_minus_one_are_taken_at_admission(engine):
    # 9 blocks of 4 tokens; TGI's allocator hands out blocks 1..8. Requests 0 and 1 (prompt 10,
    # 7 tokens) reserve 10 + 7 - 1 = 16 tokens = 4 blocks each -- 8 in all, from their first pass
    # on (prompt + max_tokens = 17 would be 5 blocks, and only one of them would fit).
    # Request 2 (prompt 4, 1 token) needs 1 block: the cache has 9, but block 0 is TGI's, so it
    # waits. t=0: prefill 0+1 (20 tokens, 10 ms) -> first tokens at 10; 6 decodes -> 58, both
    # finish and free 8 blocks. t=58: request 2's prefill (2 ms) -> its only token at 60.
    reqs = [Request(0, 0.0, 10, 7), Request(1, 0.0, 10, 7), Request(2, 0.0, 4, 1)]
    r = run(reqs, TgiConfig(), engine, num_blocks=9)
    assert by_id(r, "first_token_ms") == {0: 10.0, 1: 10.0, 2: 60.0}
    assert by_id(r, "finish_ms") == {0: 58.0, 1: 58.0, 2: 60.0}
    assert by_id(r, "first_scheduled_ms")[2] == 58.0
    assert r.counters["kv_peak_blocks"] == 8
    assert r.metrics["num_preemptions"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_that_does_not_fit_stops_the_batch(engine):
    # 6 blocks (5 usable). Request 0 reserves 4 + 12 - 1 = 15 tokens = 4 blocks; request 1 needs
    # 4 + 8 - 1 = 11 tokens = 3 blocks and does not fit; request 2 (1 block) would, but the queue
    # is first come, first served: it waits behind request 1. t=0: prefill 4 tokens (2 ms);
    # 11 decodes -> request 0 finishes at 90. t=90: 1 and 2 together (8 tokens, 4 ms) -> 94;
    # request 2 has its 2 tokens at 102, request 1 its 8 at 94 + 7 x 8 = 150.
    reqs = [Request(0, 0.0, 4, 12), Request(1, 0.0, 4, 8), Request(2, 0.0, 4, 2)]
    r = run(reqs, TgiConfig(), engine, num_blocks=6)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 90.0, 2: 90.0}
    assert by_id(r, "finish_ms") == {0: 90.0, 1: 150.0, 2: 102.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_requests_that_can_never_run_are_rejected_with_a_reason(engine):
    # 5 blocks of 4 tokens, block 0 kept: 4 blocks = 16 tokens for one request.
    # Request 0: 13 + 4 - 1 = 16 tokens fits exactly; request 1: 14 + 4 - 1 = 17 needs 5 blocks.
    # Request 2's 30-token prompt is over max_batch_prefill_tokens = 24: without chunking TGI's
    # warmup makes max_total_tokens the prefill budget, and its router refuses 30 + 1 > 24. With
    # chunking max_total_tokens is the pool's 20 tokens: refused too; allowed 64, it would fit in
    # tokens but not in blocks (30 + 1 - 1 = 30 tokens = 8 blocks).
    reqs = [Request(0, 0.0, 13, 4), Request(1, 0.0, 14, 4), Request(2, 0.0, 30, 1)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=24), engine, num_blocks=5)
    assert by_id(r, "rejected") == {0: 0, 1: 1, 2: 1}
    assert "needs 5 KV blocks" in r.rejections[1] and "has 4 (block 0" in r.rejections[1]
    assert r.rejections[2] == "`inputs` tokens + `max_new_tokens` must be <= 24. Given: 30 `inputs` tokens and 1 " \
                              "`max_new_tokens`"
    chunked = run(reqs, TgiConfig(max_batch_prefill_tokens=24, prefill_chunking=True), engine, num_blocks=5)
    assert "must be <= 20. Given: 30 `inputs` tokens and 1" in chunked.rejections[2]
    allowed = run(reqs, TgiConfig(max_batch_prefill_tokens=24, prefill_chunking=True, max_total_tokens=64), engine,
                  num_blocks=5)
    assert "needs 8 KV blocks" in allowed.rejections[2]
    wide = run(reqs, TgiConfig(max_batch_prefill_tokens=24, prefill_chunking=True), engine, num_blocks=9)
    assert by_id(wide, "rejected") == {0: 0, 1: 0, 2: 0}


# -- max_batch_prefill_tokens, rounded up to whole blocks ----------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_prefill_token_budget_is_padded_to_blocks_and_first_come_first_served(engine):
    # max_batch_prefill_tokens = 13 is padded to 16 (4-token blocks). Prompts 10, 4, 4, 2 at t=0:
    # 10 + 4 = 14 fits 16 (not 13); + 4 = 18 does not, and request 3 (2 tokens, 16 would fit)
    # stays behind request 2. t=0: prefill 14 tokens (7 ms) -> first tokens at 7.
    # t=7: 2 running, min size floor(2 x 0.3) = 0: requests 2 and 3 are prefilled alone (6 tokens,
    # 3 ms) -> 10. Then everyone decodes: 18, 26 -> all have 3 tokens at 26.
    reqs = [Request(0, 0.0, 10, 3), Request(1, 0.0, 4, 3), Request(2, 0.0, 4, 3), Request(3, 0.0, 2, 3)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=13), engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 0.0, 2: 7.0, 3: 7.0}
    assert by_id(r, "first_token_ms") == {0: 7.0, 1: 7.0, 2: 10.0, 3: 10.0}
    assert by_id(r, "finish_ms") == {0: 26.0, 1: 26.0, 2: 26.0, 3: 26.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_max_batch_size_caps_the_running_batch(engine):
    # max_batch_size = 2: requests 0 and 1 (prompt 4, 3 tokens) prefill together (4 ms) -> 4;
    # request 2 waits while the batch is full (max_size 0): decodes 12, 20. t=20: request 2
    # (2 ms) -> 22, 30, 38.
    reqs = [Request(i, 0.0, 4, 3) for i in range(3)]
    r = run(reqs, TgiConfig(max_batch_size=2), engine)
    assert by_id(r, "first_token_ms") == {0: 4.0, 1: 4.0, 2: 22.0}
    assert by_id(r, "finish_ms") == {0: 20.0, 1: 20.0, 2: 38.0}
    assert r.counters["peak_running"] == 2


# -- prefill as a pass of its own, decodes after -----------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_a_new_batch_is_prefilled_in_its_own_pass_then_everyone_decodes(engine):
    # t=0: request 0 alone (prompt 10, 5 ms) -> first token at 5. Five requests (prompt 4, 5
    # tokens) arrive at t=1. t=5: 1 running, min size floor(0.3) = 0: the five are prefilled in a
    # pass of their own (20 tokens, 10 ms, no decode cost) -> their first tokens at 15, while
    # request 0 gets nothing. Then everyone decodes: 23, 31, 39, 47 -> the five finish.
    # Request 0's second token comes at 23 (an 18 ms gap) and its 30th at 15 + 29 x 8 = 247.
    reqs = [Request(0, 0.0, 10, 30)] + [Request(i, 1.0, 4, 5) for i in range(1, 6)]
    r = run(reqs, TgiConfig(), engine)
    assert by_id(r, "first_token_ms") == {0: 5.0, **{i: 15.0 for i in range(1, 6)}}
    assert by_id(r, "finish_ms") == {0: 247.0, **{i: 47.0 for i in range(1, 6)}}
    assert r.metrics["iterations"] == 2 + 29                       # two prefill passes, 29 decodes
    assert r.counters["prefill_iteration_ms"] == 15.0              # the prefill passes carry no decode
    assert r.metrics["itl_ms"]["max"] == 18.0


@pytest.mark.parametrize("engine", ENGINES)
def test_the_pass_after_a_new_batch_decodes_before_the_next_try(engine):
    # t=0: request 0 (prompt 10, 30 tokens) alone, 5 ms. Request 1 (prompt 4) arrived at t=1:
    # at t=5 it joins (min size floor(0.3) = 0) in a 2 ms prefill pass -> 7. Request 2 arrives at
    # t=6, but batching_task decodes the batch first (7 -> 15) and only then tries again: its
    # prefill runs 15 -> 17.
    reqs = [Request(0, 0.0, 10, 30), Request(1, 1.0, 4, 5), Request(2, 6.0, 4, 5)]
    r = run(reqs, TgiConfig(), engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 5.0, 2: 15.0}
    assert by_id(r, "first_token_ms") == {0: 5.0, 1: 7.0, 2: 17.0}


# -- waiting_served_ratio and max_waiting_tokens -----------------------------------------------------------

TEN_RUNNING = [Request(i, 0.0, 4, 12) for i in range(10)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("max_waiting_tokens, joins", [(1, 20.0), (2, 28.0), (5, 52.0), (20, 108.0)])
def test_too_small_a_batch_waits_for_max_waiting_tokens(engine, max_waiting_tokens, joins):
    # t=0: ten requests (prompt 4, 12 tokens) prefill together (40 tokens, 20 ms) -> first
    # tokens at 20: waiting_tokens = 1. Two requests (prompt 4, 3 tokens) arrive at t=1; with
    # 10 running the ratio asks for floor(10 x 0.3) = 3 of them. Each decode pass adds a token:
    # waiting_tokens reaches max_waiting_tokens after max_waiting_tokens - 1 passes, at
    # 20 + 8 x (max_waiting_tokens - 1): then any batch may join (max 1: at once, t=20). With 20
    # the ten finish first (at 20 + 11 x 8 = 108) and the two start on an idle server.
    # The two: prefill 8 tokens (4 ms), then two decodes: first token at joins + 4, finish + 20.
    reqs = TEN_RUNNING + [Request(10, 1.0, 4, 3), Request(11, 1.0, 4, 3)]
    r = run(reqs, TgiConfig(max_waiting_tokens=max_waiting_tokens), engine)
    scheduled, first, finish = by_id(r, "first_scheduled_ms"), by_id(r, "first_token_ms"), by_id(r, "finish_ms")
    assert scheduled[10] == scheduled[11] == joins
    assert first[10] == first[11] == joins + 4.0
    assert finish[10] == finish[11] == joins + 20.0
    stall = 4.0 if joins < 108.0 else 0.0                         # the ten pause for the prefill pass
    assert all(finish[i] == 108.0 + stall for i in range(10))


@pytest.mark.parametrize("engine", ENGINES)
def test_enough_waiting_requests_join_at_once(engine):
    # As above with three short requests: floor(10 x 0.3) = 3 are enough at t=20. Prefill 12
    # tokens (6 ms) -> 26; decodes 34, 42: the three finish. The ten pause 6 ms: their 12th
    # token at 108 + 6 = 114.
    reqs = TEN_RUNNING + [Request(10 + i, 1.0, 4, 3) for i in range(3)]
    r = run(reqs, TgiConfig(), engine)
    assert {by_id(r, "first_scheduled_ms")[i] for i in (10, 11, 12)} == {20.0}
    assert {by_id(r, "finish_ms")[i] for i in (10, 11, 12)} == {42.0}
    assert {by_id(r, "finish_ms")[i] for i in range(10)} == {114.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_ratio_counts_the_batch_that_fits_not_the_queue(engine):
    # max_batch_prefill_tokens = 40 takes the ten's 40 prompt tokens at t=0 (first tokens at 20).
    # Three requests with 16-token prompts wait: 3 >= floor(10 x 0.3), but a new batch holds only
    # two of them (32 tokens; 48 > 40), and 2 < 3: no join until waiting_tokens = 5 (max), after
    # 4 decodes, at t=52. The two prefill (16 ms) -> 68; the pass after decodes -> 76
    # (waiting_tokens 2). The third waits: 12 running ask for 3, then 10 running for 3 once the
    # two finish at 84, until waiting_tokens = 5 again after decodes at 76, 84, 92, 100 -> t=100.
    # Its prefill (8 ms) -> 108 pauses the ten again: their 12 tokens come at 20, 28, 36, 44, 52,
    # 76, 84, 92, 100, 116, 124, 132.
    reqs = TEN_RUNNING + [Request(10 + i, 1.0, 16, 3) for i in range(3)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=40, max_waiting_tokens=5), engine)
    scheduled = by_id(r, "first_scheduled_ms")
    assert scheduled[10] == scheduled[11] == 52.0
    assert scheduled[12] == 100.0
    assert {by_id(r, "finish_ms")[i] for i in range(10)} == {132.0}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("waiting, joins", [(28, 97.0), (29, 25.0)])
def test_the_ratio_is_computed_in_single_precision(engine, waiting, joins):
    # 50 running, waiting_served_ratio 0.58: in f32 (as TGI's Rust computes it) 50 x 0.58 is
    # exactly 29.0, in f64 28.999...: TGI asks for 29 requests. 50 one-token prompts prefill in
    # 25 ms (first tokens at 25); they make 10 tokens, so they finish at 25 + 9 x 8 = 97, before
    # max_waiting_tokens (20) runs out. 28 waiting requests (arrived at t=1) start at 97; 29 join
    # at once.
    reqs = [Request(i, 0.0, 1, 10) for i in range(50)] + [Request(50 + i, 1.0, 1, 2) for i in range(waiting)]
    r = run_engine(reqs, TgiScheduler(TgiConfig(waiting_served_ratio=0.58)), LinearCostModel(COST),
                   PagedKVCache(4096, 16), engine=engine)
    assert {by_id(r, "first_scheduled_ms")[50 + i] for i in range(waiting)} == {joins}


def test_decode_runs_stop_where_max_waiting_tokens_runs_out():
    # The fast engine runs the decodes between events in one step; the ratio's wait must end
    # exactly after the 4th decode pass (max_waiting_tokens = 5). Iterations (see the test
    # above): the ten's prefill; 4 decodes (one run, to t=52); the two's prefill; 2 decodes to
    # the two's finish at 72 (one run: nothing waits, so the pass after the join and the try
    # after it are plain decodes); the ten's last 5 decodes (one run): 13 iterations in 5 events.
    reqs = TEN_RUNNING + [Request(10, 1.0, 4, 3), Request(11, 1.0, 4, 3)]
    r = run(reqs, TgiConfig(max_waiting_tokens=5), "fast")
    assert r.metrics["iterations"] == 1 + 4 + 1 + 2 + 5
    assert r.meta["events"] == 5
    assert by_id(r, "first_scheduled_ms")[10] == 52.0


# -- TGI v3's chunked prefill ---------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_chunked_prefill_by_hand(engine):
    # max_batch_prefill_tokens = 16 (a multiple of the 4-token blocks). t=0: requests 0 (prompt
    # 10, 6 tokens) and 1 (prompt 30, 3 tokens): 10 fit, request 1 is cut to the 6 left -> a
    # 16-token pass (8 ms); request 0's first token at 8. The server gives request 1 its next
    # chunk from 16 - (2 - 1) = 15 tokens: 15.
    # t=8: the running batch computes 1 + 15 = 16 tokens next: budget 0, request 2 (prompt 20,
    # arrived at t=1) waits. Pass: 0 decodes, 1 prefills 15 (8 + 7.5 ms) -> 23.5. Next chunk
    # of 1: its last 9 tokens.
    # t=23.5: current tokens 1 + 9 = 10, budget 16 - 10 = 6, padded to 8: request 2 joins with
    # an 8-token chunk. Pass: 0 decodes, 1 prefills 9 (done: first token), 2 prefills 8 ->
    # 8 + 8.5 = 16.5 ms -> 40. Request 2's next chunk: its 12 left (budget 16 - 2 = 14).
    # t=40: a new batch joined, so this pass decodes before trying again: 0 and 1 decode, 2
    # prefills 12 (8 + 6) -> 54, request 2's first token. Then decodes: 62, 70.
    reqs = [Request(0, 0.0, 10, 6), Request(1, 0.0, 30, 3), Request(2, 1.0, 20, 3)]
    r = run(reqs, TgiConfig(max_batch_prefill_tokens=16, prefill_chunking=True), engine)
    assert by_id(r, "first_scheduled_ms") == {0: 0.0, 1: 0.0, 2: 23.5}
    assert by_id(r, "first_token_ms") == {0: 8.0, 1: 40.0, 2: 54.0}
    assert by_id(r, "finish_ms") == {0: 70.0, 1: 62.0, 2: 70.0}
    assert by_id(r, "prefill_chunks") == {0: 1, 1: 3, 2: 2}


@pytest.mark.parametrize("engine", ENGINES)
def test_chunking_ignores_the_ratio(engine):
    # The ten of the ratio tests, then two waiting requests: with chunking they join the first
    # try (t=20) in the same pass as the ten's decodes: 8 prompt tokens + 10 decodes = 12 ms ->
    # 32 (the ten's second token). Then the pass after a join decodes: 40, 48.
    reqs = TEN_RUNNING + [Request(10, 1.0, 4, 3), Request(11, 1.0, 4, 3)]
    r = run(reqs, TgiConfig(prefill_chunking=True), engine)
    assert by_id(r, "first_scheduled_ms")[10] == by_id(r, "first_scheduled_ms")[11] == 20.0
    assert by_id(r, "first_token_ms")[10] == 32.0
    assert by_id(r, "finish_ms")[10] == 48.0
    assert by_id(r, "finish_ms")[0] == 32.0 + 10 * 8.0           # tokens 2..12 from t=32 on


# -- settings ------------------------------------------------------------------------------------------------------

def test_settings_are_checked_and_registered():
    with pytest.raises(ConfigError, match="waiting_served_ratio"):
        from_table(TgiConfig, {"waiting_served_ratio": -0.1}, where="x.toml [scheduler]")
    with pytest.raises(ConfigError, match="max_batch_size"):
        from_table(TgiConfig, {"max_batch_size": 0}, where="x.toml [scheduler]")
    with pytest.raises(ConfigError, match="max_waiting_tokens"):
        from_table(TgiConfig, {"max_waiting_token": 5}, where="x.toml [scheduler]")
    cfg = from_table(TgiConfig, {"max_batch_size": 8, "prefill_chunking": True}, where="x.toml [scheduler]")
    assert (cfg.max_batch_size, cfg.waiting_served_ratio, cfg.max_waiting_tokens) == (8, 0.3, 20)
    from schedlab.catalog import load_catalog

    entry = load_catalog(entry_points=False)["scheduler"].get("tgi")
    assert entry.factory is TgiScheduler and entry.config is TgiConfig


# -- properties ------------------------------------------------------------------------------------------------

@st.composite
def tgi_configs(draw):
    prefill = draw(st.integers(8, 160))
    chunking = draw(st.booleans())
    total = draw(st.none() | st.integers(2, 200 if chunking else prefill + 1))
    return TgiConfig(
        max_batch_prefill_tokens=prefill,
        waiting_served_ratio=draw(st.sampled_from([0.0, 0.3, 0.58, 1.0, 1.5])),
        max_waiting_tokens=draw(st.sampled_from([0, 1, 2, 5, 20])),
        max_batch_size=draw(st.none() | st.integers(1, 6)),
        prefill_chunking=chunking,
        generation_segment=draw(st.sampled_from([0, 1024]) | st.integers(1, 12)),
        max_total_tokens=total,
        max_input_tokens=draw(st.none() | st.integers(1, min(total or 201, 201 if chunking else prefill + 1) - 1)),
        default_max_tokens=draw(st.sampled_from(["output", "max_total_tokens"])),
    )


def tgi_limits(q, c: TgiConfig, block_size: int, num_blocks: int) -> tuple[bool, int]:
    """(never served, max_tokens served) by TGI v3.3.7's router (``validation.rs``, ``infer/mod.rs``)
    and launcher defaults, worked out segment by segment: what the tests expect."""
    total = c.max_total_tokens
    if total is None:
        total = num_blocks * block_size if c.prefill_chunking else c.max_batch_prefill_tokens
    longest = c.max_input_tokens if c.max_input_tokens is not None else total - 1
    seg = c.generation_segment
    default = q.max_tokens is None and c.default_max_tokens == "max_total_tokens"

    def max_new(tokens):  # validate_input: max_tokens, or by default what is left of max_total_tokens
        return max(total - tokens, 0) if default else q.max_output_tokens

    def chunk(tokens):
        return min(max_new(tokens), seg) if seg else max_new(tokens)

    def fits(tokens):  # the allocator's blocks, block 0 kept
        return -(-tokens // block_size) <= num_blocks - 1

    first = chunk(q.prompt_tokens)
    never = not fits(q.prompt_tokens + first - 1) or q.prompt_tokens + first > total or q.prompt_tokens > longest
    most = min(q.output_tokens, max_new(q.prompt_tokens)) if default else q.max_output_tokens
    served = first
    while served < most:  # each continuation is validated as a new request
        tokens = q.prompt_tokens + served
        if tokens > longest or tokens + chunk(tokens) > total or not fits(tokens + chunk(tokens) - 1):
            break
        served += seg
    return never, min(served, most)


class PassChecker:
    """Asserts the shape of every forward pass (attach as the fast engine's observer)."""

    def __init__(self, config: TgiConfig, block_size: int, num_blocks: int):
        self.config = config
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.passes = 0

    def __call__(self, instance, record):
        c = self.config
        b = record.batch
        self.passes += 1
        padded = -(-c.max_batch_prefill_tokens // self.block_size) * self.block_size
        assert record.kv_used_blocks <= self.num_blocks - 1, "block 0 handed out"
        if c.prefill_chunking:
            assert b.num_batched_tokens <= max(c.max_batch_prefill_tokens + self.block_size - 1, b.num_seqs)
        else:
            assert not (b.num_decode and b.num_prefill), "a prefill pass decoded"
            assert b.prefill_tokens <= padded
            if c.max_batch_size is not None:
                assert record.running <= c.max_batch_size


@SETTINGS
@given(requests_lists(max_size=12, max_prompt=64, max_output=40, prefix_groups=2), tgi_configs(),
       st.integers(1, 8), st.integers(2, 60), st.booleans())
def test_tgi_keeps_its_rules(requests, config, block_size, num_blocks, prefix):
    kv = (PrefixKVCache if prefix else PagedKVCache)(num_blocks, block_size)
    check = PassChecker(config, block_size, num_blocks)
    r = run_engine(requests, TgiScheduler(config), LinearCostModel(COST), kv, check=check)
    check_run(r, requests, kv_blocks=num_blocks - 1)
    assert r.metrics["num_preemptions"] == 0
    # rejected exactly when TGI's router refuses it or it could never be scheduled; served with
    # the segments whose continuation TGI accepts; sent back once per segment it goes past
    requeues = 0
    for q in requests:
        never, served = tgi_limits(q, config, block_size, num_blocks)
        assert by_id(r, "rejected")[q.id] == int(never)
        if not never:
            assert by_id(r, "max_tokens")[q.id] == served
            if config.generation_segment:
                requeues += (min(q.target_tokens, served) - 1) // config.generation_segment
    assert r.metrics["requeues"] == requeues
    # first come, first served: admission follows arrival
    admitted = sorted((q.arrival_ms, q.id) for q in requests if not by_id(r, "rejected")[q.id])
    starts = [by_id(r, "first_scheduled_ms")[i] for _, i in admitted]
    assert starts == sorted(starts)
    assert check.passes == r.metrics["iterations"]


@SETTINGS
@given(requests_lists(max_size=10, max_prompt=48, max_output=80, prefix_groups=2), tgi_configs(),
       dyadic_linear_costs(), st.integers(1, 8), st.integers(2, 60), st.booleans(), st.integers(1, 5) | st.just(128))
def test_tgi_fast_engine_matches_reference(requests, config, cost, block_size, num_blocks, prefix, in_flight):
    """Bulk decode runs must stop where max_waiting_tokens, a joined batch or a segment's end
    changes the next pass; both engines count the requests in flight alike."""
    config = attrs.evolve(config, max_concurrent_requests=in_flight)

    def one(engine):
        kv = (PrefixKVCache if prefix else PagedKVCache)(num_blocks, block_size)
        return run_engine(requests, TgiScheduler(config), LinearCostModel(cost), kv, engine=engine)

    fast, ref = one("fast"), one("reference")
    compare_runs(fast, ref, rel=1e-12)
    check_run(fast, requests, kv_blocks=num_blocks - 1)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_lists(max_size=10, max_prompt=400, max_output=300, all_at_zero=False), tgi_configs(),
       st.integers(20, 400))
def test_tgi_with_roofline_costs_matches_reference(requests, config, num_blocks):
    """Decode passes that slow down as contexts grow, summed in closed form between wake-ups."""
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog
    from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel

    presets = Presets.from_catalog(load_catalog(entry_points=False))
    tgi_steps = TgiConfig.cost_model_defaults({})  # (synchronous; graphs for decode-only passes up to 32)
    cost = RooflineCostModel(presets.model("llama-3-8b"), presets.gpu("l4"),
                             RooflineConfig(model="llama-3-8b", gpu="l4", **tgi_steps))
    runs = [run_engine(requests, TgiScheduler(config), cost, PagedKVCache(num_blocks, 16), engine=engine)
            for engine in ("fast", "reference")]
    compare_runs(*runs, rel=1e-9)
