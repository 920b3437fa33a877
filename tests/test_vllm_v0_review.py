"""The ``vllm-v0`` preset against vLLM V0's scheduler (``vllm/core/scheduler.py``,
``vllm/core/block_manager.py``, ``vllm/engine/arg_utils.py`` and ``vllm/config.py`` at v0.8.5),
one hand-computed case per rule a source review found missing (/tmp/review_v0/FINDINGS.md,
scenarios tA, tC, tR, tO, tW, tQ). The linear cost model: a prefill-only step costs 0.05 ms a
token (1,601 tokens: 80.05 ms), a decode step 8 ms at these sizes."""

from __future__ import annotations

from schedlab.model import Request
from schedlab.testing import run_engine
from schedlab_plugins.cost_models import LinearCostModel
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.presets import MODELS
from schedlab_plugins.schedulers import ContinuousScheduler
from schedlab_plugins.schedulers.presets import VllmV0Config

from test_max_model_len import _config


def _v0(model=None, **table) -> VllmV0Config:
    """The preset as a run assembles it: ``run_defaults`` for the keys ``table`` leaves out."""
    return VllmV0Config(**{**VllmV0Config.run_defaults(None, model, table), **table})


def _run(requests, config, blocks, swap_blocks=0):
    kv = PagedKVCache(blocks, 16, swap_blocks=swap_blocks)
    return run_engine(requests, ContinuousScheduler(config), LinearCostModel(), kv)


def _steps(result) -> list[tuple]:
    """(start ms, decodes, prefills, prefill tokens) of each timeline row (a row: a run of like steps)."""
    t = result.timeline
    return [(float(t["time_ms"][i]), int(t["decodes"][i]), int(t["prefills"][i]), int(t["prefill_tokens"][i]))
            for i in range(len(t["time_ms"]))]


def _model(name):
    return next(spec for spec, _ in MODELS if spec.name == name)


# -- finding 1: chunked prefill on by default over 32K (``EngineArgs._set_default_args_v0``) -------------
def test_v0_turns_chunked_prefill_on_for_contexts_over_32k_with_a_2048_token_budget():
    # arg_utils.py _set_default_args_v0: enable_chunked_prefill unset and max_model_len > 32768 -> True;
    # config.py SchedulerConfig: then max_num_batched_tokens = _DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
    llama31, llama2 = _model("llama-3.1-8b"), _model("llama-2-7b")
    assert VllmV0Config.run_defaults(None, llama31, {}) == {
        "max_model_len": 131072, "chunked_prefill": True, "max_num_batched_tokens": 2048,
        "prefill_first": False, "running_order": "decodes_first"}
    # the user's own chunked_prefill = false wins: a budget of the whole context, as V0 sized it
    assert VllmV0Config.run_defaults(None, llama31, {"chunked_prefill": False}) == {
        "max_model_len": 131072, "max_num_batched_tokens": 131072}
    # 32,768 itself is not "> 32768"; a 4K model stays whole-prompt
    assert "chunked_prefill" not in VllmV0Config.run_defaults(None, llama31, {"max_model_len": 32768})
    assert VllmV0Config.run_defaults(None, llama2, {}) == {"max_model_len": 4096, "max_num_batched_tokens": 4096}


# -- finding 2: ``_schedule_chunked_prefill`` runs decodes first, no prefill-first step ------------------
def test_v0_chunked_prefill_schedules_decodes_then_the_started_prompt_then_new_ones():
    # tC: A, B (100-token prompts) decode from t=0; at t=100 C (2,000 tokens) and D (300) arrive; budget 512
    requests = [Request(0, 0.0, prompt_tokens=100, output_tokens=200),
                Request(1, 0.0, prompt_tokens=100, output_tokens=200),
                Request(2, 100.0, prompt_tokens=2000, output_tokens=5),
                Request(3, 100.0, prompt_tokens=300, output_tokens=5)]
    config = _v0(chunked_prefill=True, max_num_batched_tokens=512)
    assert (config.prefill_first, config.running_order) == (False, "decodes_first")
    steps = _steps(_run(requests, config, 1000))
    # every step after t=0 keeps A and B's decodes (V0 never skips them in its chunked path) ...
    assert all(decodes >= 2 for start, decodes, _, _ in steps if 0 < start < 1000)
    # ... and C gets 512 - 2 = 510 tokens a step beside them from 106 ms: 510 x 3, then its last 470 with
    # D's first 40 (D waits until C's last chunk leaves room), then D's last 260 beside three decodes
    assert [s for s in steps if s[2] and s[0] > 0] == [
        (106.0, 2, 1, 510), (139.5, 2, 1, 510), (173.0, 2, 1, 510), (206.5, 2, 2, 510), (240.0, 3, 1, 260)]
    # the user's own prefill_first wins
    assert _v0(chunked_prefill=True, prefill_first=True).prefill_first is True


# -- finding 3: without chunking, prompts only at a step's start (``_schedule_default``) -----------------
def test_v0_a_step_that_swaps_in_admits_no_prompt():
    # tA: 100 blocks; A, B 640-token prompts (400 out), C 160 tokens (20 out) at t=2000. B is swapped out
    # when the cache fills; while it is swapped C waits; the step where A's end lets B back (3,256 ms)
    # holds B's swap-in and decode only -- C is prefilled alone in the next step, as V0 schedules it
    requests = [Request(0, 0.0, prompt_tokens=640, output_tokens=400),
                Request(1, 0.0, prompt_tokens=640, output_tokens=400),
                Request(2, 2000.0, prompt_tokens=160, output_tokens=20)]
    steps = _steps(_run(requests, _v0(preemption="swap"), 100, swap_blocks=200))
    assert not any(decodes and prefills for _, decodes, prefills, _ in steps)  # V0 never mixes them
    swap_in = next(i for i, s in enumerate(steps) if s[0] > 2000 and s[1] == 1 and steps[i + 1][2])
    assert steps[swap_in + 1][1:] == (0, 1, 160)  # C alone, B's decode skipped


# -- finding 5: without chunking, a recompute is never split (``_schedule_prefills``: can_schedule) -------
def test_v0_never_splits_a_recompute_without_chunked_prefill():
    # tR: 300 blocks, budget = max_model_len = 2048; four 1,000-token prompts with 900 out fill the
    # cache, requests 2 and 3 are preempted (recompute). When 0 and 1 finish (7,392 ms) request 2 comes
    # back whole (1,601 tokens); request 3's 1,201 do not fit the 447 left, so it waits for the next step
    # (1,201 + two 300-token prompts), never split beside request 2 nor finished beside decodes
    requests = [Request(i, 0.0, prompt_tokens=1000, output_tokens=900) for i in range(4)]
    requests += [Request(4 + i, 3000.0 + 200 * i, prompt_tokens=300, output_tokens=50) for i in range(5)]
    result = _run(requests, _v0(max_num_batched_tokens=2048, max_model_len=2048), 300)
    req = result.requests
    assert req["preemptions"].tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 0]
    assert (req["prefill_chunks"] == 1 + req["preemptions"]).all()  # a recompute is one prefill
    steps = _steps(result)
    assert [s for s in steps if 7000 < s[0] < 7600] == [(7384.0, 2, 0, 0), (7392.0, 0, 1, 1601),
                                                        (7472.05, 0, 3, 1801), (7562.1, 0, 3, 900)]
    assert not any(decodes and prefills for _, decodes, prefills, _ in steps)


# -- finding 6: V0-era API servers reject prompt + max_tokens > max_model_len (HTTP 400) ------------------
def test_v0_rejects_a_max_tokens_beyond_max_model_len():
    # tO: max_model_len 1000, prompt 900 + max_tokens 200 -> serving_engine._validate_input: 400
    assert VllmV0Config().context_overflow == "reject"
    result = _run([Request(0, 0.0, prompt_tokens=900, output_tokens=200, max_tokens=200)],
                  _v0(max_model_len=1000, max_num_batched_tokens=2048), 1000)
    assert result.requests["rejected"].tolist() == [True]
    assert "context_overflow is 'reject'" in result.rejections[0]


# -- finding 7: swap-in keeps the watermark free (``BlockSpaceManager._can_swap``) ---------------------
def test_v0_swap_in_leaves_the_watermark_free():
    # 100 blocks of 16, watermark int(0.01 x 100) = 1 block. X (320 tokens, 328 out), Y (480, 600 out) and
    # B (768, 50 out) take 20 + 30 + 48 = 98 blocks. The first decode needs 3 blocks: X and Y take the 2
    # free, B is swapped out (48 blocks). B comes back into ceil(769 / 16) = 49 blocks. X finishes at
    # 2,686 ms (648 tokens) with Y at 51 blocks: 49 free. V0: 49 - 49 < 1, LATER -- B waits for Y to end
    # (4,862 ms) and is swapped once. Without the watermark B comes back into the last free block and
    # is swapped out again at Y's next block (2 preemptions).
    requests = [Request(0, 0.0, prompt_tokens=320, output_tokens=328),
                Request(1, 0.0, prompt_tokens=480, output_tokens=600),
                Request(2, 0.0, prompt_tokens=768, output_tokens=50)]
    result = _run(requests, _v0(preemption="swap", max_num_batched_tokens=2048, max_model_len=2048), 100, 200)
    assert result.metrics["num_preemptions"] == 1
    assert max(result.timeline["kv_used"]) == 98
    back = next(float(t) for t, n in zip(result.timeline["time_ms"], result.timeline["running"]) if t > 100 and n == 1)
    assert back == 2694.4  # (then Y alone) and B only after Y: its finish is after Y's
    req = result.requests
    assert float(req["finish_ms"][2]) > float(req["finish_ms"][1])


# -- finding 9: arrival rejection counts the prompt against the watermark, the whole sequence against all --
def test_v0_rejects_on_arrival_by_the_prompt_against_the_watermark():
    # tW: 100 blocks of 16 (watermark 1), prompt 100 (7 blocks) + 1,490 out: 1,589 tokens, 100 blocks.
    # V0 can_allocate: 100 - 7 >= 1, OK; its decodes may take every block: it finishes alone
    config = _v0(max_model_len=1600, max_num_batched_tokens=2048)
    result = _run([Request(0, 0.0, prompt_tokens=100, output_tokens=1490)], config, 100)
    assert result.requests["rejected"].tolist() == [False]
    assert int(result.requests["generated_tokens"][0]) == 1490
    # one that cannot finish even alone (1,619 tokens: 102 blocks) is still turned away, never retried for ever
    result = _run([Request(0, 0.0, prompt_tokens=100, output_tokens=1520)], _v0(max_model_len=2048), 100)
    assert result.requests["rejected"].tolist() == [True]
    # and a prompt of 100 blocks (1,585 tokens) leaves no watermark: 100 - 100 < 1, V0 answers NEVER (99 would do)
    result = _run([Request(0, 0.0, prompt_tokens=1585, output_tokens=1)], config, 100)
    assert result.requests["rejected"].tolist() == [True] and "above the watermark" in result.rejections[0]


# -- finding 4: V0's priority policy always preempts (``_schedule_priority_preemption``) ---------------
def test_v0_priority_policy_preempts_lower_priority_requests():
    # tQ: 100 blocks; A (priority 1) 1,200-token prompt (75 blocks), 200 out, at 0; B (priority 0) 480 (30
    # blocks), 20 out, at 100: 25 free, B cannot be allocated, A ranks below it -> A preempted, B runs
    assert _v0(policy="priority").priority_preemption is True
    assert _v0(policy="priority", priority_preemption=False).priority_preemption is False  # the user's wins
    assert _v0(policy="priority", chunked_prefill=True).priority_preemption is False  # never in the chunked path
    requests = [Request(0, 0.0, prompt_tokens=1200, output_tokens=200, priority=1),
                Request(1, 100.0, prompt_tokens=480, output_tokens=20, priority=0)]
    result = _run(requests, _v0(policy="priority"), 100)
    assert result.metrics["num_preemptions"] == 1
    req = result.requests
    assert float(req["finish_ms"][1]) < float(req["finish_ms"][0])
