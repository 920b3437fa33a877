"""Random differential cases, one generator per feature group.

Each group turns on one feature of vLLM's scheduler (0.33) against small, fast cases:

* ``budget``    -- a small ``max_num_batched_tokens`` (chunked prefill), ample KV, no threshold;
* ``threshold`` -- the same with ``long_prefill_token_threshold`` set;
* ``tight_kv``  -- a cache of 1x to 2x the largest request, so requests preempt each other;
* ``prefix``    -- prefix caching with shared prompt prefixes (1 to 3 groups), ample KV;
* ``priority``  -- vLLM's ``priority`` policy with priorities 0-3, ample or tight KV;
* ``all``       -- tight KV, a threshold and prefix caching at once, FCFS or priority;
* ``pipeline``  -- vLLM's batch queue of 2 or 3 batches in flight (``--pipeline-parallel-size``;
  one more planning ahead), tight or ample KV, FCFS or priority, in about 30% of the cases some
  requests stopping at an EOS: chunks following each other into the pipeline, decodes sitting
  out (planning ahead: staggered), and preemptions of requests whose batch is in flight;
* ``eos``       -- about half the requests stop at an EOS before their ``max_tokens``, tight or
  ample KV, FCFS or priority, sometimes prefix caching and a threshold: asynchronous
  scheduling decodes such a request once more (synchronously they end as at ``max_tokens``);
* ``abort``     -- about 40% of the requests' clients give up half a ms into some iteration 0-40
  after their arrival, tight or ample KV, FCFS or priority, sometimes prefix caching: vLLM
  aborts a request between steps, or after the step in progress before its output;
* ``pipeline_abort`` -- ``pipeline``'s settings with ``abort``'s clients: vLLM aborts a request
  when it schedules, and when a batch is back before its output;
* ``pipeline_prefix`` -- ``pipeline``'s settings with ``prefix``'s shared prompts and prefix
  caching: what vLLM has cached of a request preempted or aborted with its batch in flight
  (planning ahead, tokens in flight are not known);
* ``pipeline_spec`` -- ``spec``'s settings (but drafts per batch size) on 2 or 3 stages: the
  drafter on the last stage, and planning ahead a request's drafts in flight counted as accepted;
* ``pipeline_dynamic_k`` -- ``pipeline_spec``'s settings with drafts per batch size in every
  case (fewer than ``k`` from a batch of 2 or more): each decode verifies the drafts of the batch
  that last scheduled its request (planning ahead, not of the batch that landed last);
* ``spec``      -- speculative decoding: 1-4 drafts a decode by n-gram, a draft model or EAGLE,
  acceptance 0.2-0.95, tight or ample KV, FCFS or priority, sometimes a threshold, prefix
  caching, EOS, drafts per batch size and ``abort``'s clients: drafts cut by the budget, a
  draft model's input slots, the lookahead's KV slots (prompt chunks' too), one-token
  admissions padded to a decode's rows, EAGLE's block hashes covering the token after the
  block, rejected drafts rolled back; planning ahead, positions
  counted as computed while the drafts in flight are unverified;
* ``spec_limit`` -- ``spec``'s cases with a ``max_model_len`` just above the longest request and
  most requests ending within ``k + 1`` tokens of it: a decode's drafts cut so its input stays
  below ``max_model_len``, its KV slots (lookahead included) never past it, no padding without
  room for the sampled token.

The ``window_*`` groups (:data:`WINDOW_GROUPS`) give the model sliding-window layers: a window
of 2-64 tokens (``window_long``: 32-128, gpt-oss keeps 128) in one or two KV cache groups of their
own beside the full-attention one, all sharing the pool (vLLM's hybrid KV cache manager; schedlab's
:class:`~schedlab.kv_window.SlidingWindow`), and a pool mostly of 1x to 2x the largest request's
blocks (:meth:`DiffSettings.request_blocks`: its full-attention blocks plus at most vLLM's
per-request window cap), so that preemptions and the window's freed blocks both matter:

* ``window``        -- FCFS, chunked prefill in small budgets, sometimes a threshold;
* ``window_prefix`` -- ``prefix``'s shared prompts and prefix caching, tight or ample KV;
* ``window_all``    -- a threshold, prefix caching and the priority policy, each in about half
  the cases;
* ``window_long``   -- prompts of up to 600 tokens in budgets of 16-128 on blocks of 8 or 16:
  prompts longer than the window and the tokens in flight, whose admission vLLM caps
  (``SlidingWindowSpec.max_admission_blocks_per_request``).

No window is of one token: vLLM 0.33 never caches a block of such a window's group
(``SlidingWindowManager.reachable_block_mask`` asks for ``cdiv(W - 1, B) = 0`` blocks before each
hit boundary and so marks none), so with prefix caching it never finds a hit.

Arrivals are whole iterations (ms). A case depends only on ``(group, seed)``: the generator
is ``random.Random(f"{group}:{seed}")``.
"""

from __future__ import annotations

import random

import attrs

from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, blocks_for
from schedlab.diffcheck.workloads import random_requests

from .case import DiffSettings

GROUPS = ("budget", "threshold", "tight_kv", "prefix", "priority", "all", "pipeline", "eos", "abort", "pipeline_abort",
          "spec", "pipeline_prefix", "pipeline_spec", "pipeline_dynamic_k", "spec_limit")
#: the groups whose model has sliding-window layers (see the module docstring)
WINDOW_GROUPS = ("window", "window_prefix", "window_all", "window_long")
ALL_GROUPS = GROUPS + WINDOW_GROUPS


def _ample(requests, block_size: int, slack: int = 0, longest: int = MAX_MODEL_LEN) -> int:
    return sum(blocks_for(min(r.prompt_tokens + r.limit + slack, longest), block_size) for r in requests) + 4


def _tight(rng: random.Random, requests, block_size: int, slack: int = 0, longest: int = MAX_MODEL_LEN) -> int:
    # (by max_tokens: vLLM makes sure at start-up that its longest request fits the cache; with
    # speculation no slot passes max_model_len, ``longest``)
    largest = max(blocks_for(min(r.prompt_tokens + r.limit - 1 + slack, longest), block_size) for r in requests)
    return largest + rng.randint(0, largest)


def _near_limit(rng: random.Random, requests, k: int) -> tuple[list, int]:
    """``spec_limit``: a ``max_model_len`` just above the longest request, and most requests'
    lengths (their ``max_tokens``, or their output when they ignore EOS) moved within ``k + 1``
    tokens of it, so their last decodes' drafts and slots meet it."""
    longest = max(r.prompt_tokens + r.limit for r in requests) + rng.randint(0, k)
    moved = []
    for r in requests:
        length = longest - r.prompt_tokens - rng.randint(0, k + 1)
        if rng.random() < 0.7 and length >= 1:
            if r.max_tokens is None:
                r = attrs.evolve(r, output_tokens=length)
            elif length >= r.output_tokens:
                r = attrs.evolve(r, max_tokens=length)
        moved.append(r)
    return moved, longest


def generate(group: str, seed: int) -> Case:
    """The case ``seed`` of feature ``group`` (one of :data:`ALL_GROUPS`)."""
    if group not in ALL_GROUPS:
        raise ValueError(f"unknown feature group {group!r}; groups: {', '.join(ALL_GROUPS)}")
    rng = random.Random(f"{group}:{seed}")
    if group in WINDOW_GROUPS:
        return _windowed(group, seed, rng)
    limited, group = group == "spec_limit", "spec" if group == "spec_limit" else group  # (spec's cases, near the limit)
    block_size = rng.choice([2, 4, 8, 16])
    max_num_seqs = rng.randint(1, 6)
    budget = rng.randint(max(max_num_seqs, 4), 64)
    speculative = group in ("spec", "pipeline_spec", "pipeline_dynamic_k")
    spec = {}
    if speculative:
        spec = {"num_speculative_tokens": rng.randint(1, 4), "spec_method": rng.choice(["ngram", "draft_model", "eagle"]),
                "acceptance_rate": round(rng.uniform(0.2, 0.95), 2)}
        budget = max(budget, spec["num_speculative_tokens"] + 1)  # (vLLM: above the drafter's lookahead)
        if group == "pipeline_dynamic_k":  # drafts per batch size, always (vLLM: max_num_seqs >= 2)
            max_num_seqs = max(max_num_seqs, 2)
            spec.update(dynamic_from=rng.randint(2, max_num_seqs), dynamic_k=rng.randint(0, spec["num_speculative_tokens"] - 1))
        elif rng.random() < 0.3 and max_num_seqs >= 2 and group == "spec":  # drafts per batch size
            spec.update(dynamic_from=rng.randint(2, max_num_seqs), dynamic_k=rng.randint(0, spec["num_speculative_tokens"]))
    policy = "fcfs"
    pipelined = group in ("pipeline", "pipeline_abort", "pipeline_prefix", "pipeline_spec", "pipeline_dynamic_k")
    aborting = group in ("abort", "pipeline_abort")
    if group == "priority" or ((group in ("all", "eos") or pipelined or aborting or speculative)
                               and rng.random() < 0.5):
        policy = "priority"
    prefixes = (group in ("prefix", "all", "pipeline_prefix")
                or (group in ("eos", "abort", "spec", "pipeline_spec", "pipeline_dynamic_k") and rng.random() < 0.5))
    requests = random_requests(rng, priorities=policy == "priority", prefixes=prefixes, block_size=block_size,
                               eos=group == "eos" or (speculative and rng.random() < 0.3))
    if aborting:
        requests = [attrs.evolve(r, abort_at=r.arrival + rng.randint(0, 40) + 0.5) if rng.random() < 0.4 else r
                    for r in requests]
    tight = group in ("tight_kv", "all") or ((group in ("priority", "eos") or pipelined or aborting or speculative)
                                             and rng.random() < 0.5)
    slack = 2 * spec["num_speculative_tokens"] if speculative else 0  # (a last step's drafts and lookahead)
    longest = MAX_MODEL_LEN
    if limited:
        requests, longest = _near_limit(rng, requests, spec["num_speculative_tokens"])
    num_blocks = (_tight(rng, requests, block_size, slack, longest) if tight
                  else _ample(requests, block_size, slack, longest))
    least = spec["num_speculative_tokens"] + 1 if speculative else 1  # (see DiffSettings.problems)
    threshold = rng.randint(least, budget) if group in ("threshold", "all") or (
        group in ("eos", "spec", "pipeline_spec", "pipeline_dynamic_k") and rng.random() < 0.3) else 0
    threshold = min(threshold, longest)  # (vLLM refuses a threshold over max_model_len)
    settings = DiffSettings(block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                            max_num_batched_tokens=budget, long_prefill_token_threshold=threshold,
                            prefix_caching=prefixes, policy=policy,
                            pipeline_parallel=rng.choice([2, 3]) if pipelined else 1, max_model_len=longest, **spec)
    if speculative and rng.random() < 0.3:  # (drawn last: the cases before aborts came in stay as they were)
        requests = [attrs.evolve(r, abort_at=r.arrival + rng.randint(0, 40) + 0.5) if rng.random() < 0.4 else r
                    for r in requests]
    if pipelined and rng.random() < 0.3:  # some stop at an EOS (drawn last, as above), each still fitting the cache
        requests = [_at_eos(rng, r, block_size, num_blocks, slack) if rng.random() < 0.5 else r for r in requests]
    return Case(settings, requests, group="spec_limit" if limited else group, seed=seed)


def _at_eos(rng: random.Random, r, block_size: int, num_blocks: int, slack: int):
    """``r`` stopping at an EOS: a ``max_tokens`` above its output, if it still fits the cache
    (with ``slack``: a last step's drafts and lookahead)."""
    limit = r.output_tokens + rng.randint(1, 10)
    fits = blocks_for(r.prompt_tokens + limit - 1 + slack, block_size) <= num_blocks
    return attrs.evolve(r, max_tokens=limit) if fits else r


def _windowed(group: str, seed: int, rng: random.Random) -> Case:
    """A case of one of the :data:`WINDOW_GROUPS` (see the module docstring)."""
    long = group == "window_long"
    block_size = rng.choice([8, 16]) if long else rng.choice([2, 4, 8, 16])
    window_tokens = rng.choice([32, 64, 100, 128]) if long else rng.choice([2, 3, 5, 8, 13, 16, 24, 32, 48, 64])
    window_groups = 2 if rng.random() < 0.3 else 1
    max_num_seqs = rng.randint(1, 6)
    budget = rng.randint(16, 128) if long else rng.randint(max(max_num_seqs, 4), 64)
    mixed = group == "window_all"
    policy = "priority" if mixed and rng.random() < 0.5 else "fcfs"
    prefixes = group == "window_prefix" or (mixed and rng.random() < 0.5)
    requests = random_requests(rng, priorities=policy == "priority", prefixes=prefixes, block_size=block_size,
                               longest_prompt=600 if long else 120, longest_output=60 if long else 30)
    threshold = rng.randint(1, budget) if (mixed or group == "window") and rng.random() < 0.4 else 0
    settings = DiffSettings(block_size=block_size, num_blocks=1, max_num_seqs=max_num_seqs,
                            max_num_batched_tokens=budget, long_prefill_token_threshold=threshold,
                            prefix_caching=prefixes, policy=policy, window_tokens=window_tokens,
                            window_groups=window_groups)
    need = [settings.request_blocks(r) for r in requests]
    tight = rng.random() < (0.5 if group == "window_prefix" else 0.8)
    num_blocks = max(need) + rng.randint(0, max(need)) if tight else sum(need) + 4
    return Case(attrs.evolve(settings, num_blocks=num_blocks), requests, group=group, seed=seed)
