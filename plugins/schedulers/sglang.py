"""SGLang's scheduler (engines.md §4), following SGLang v0.4.6.post5 (PyPI release):
``python/sglang/srt/managers/scheduler.py`` (``get_next_batch_to_run``,
``get_new_batch_prefill``, ``update_running_batch``), ``schedule_policy.py`` (``PrefillAdder``)
and ``schedule_batch.py`` (``check_decode_mem``, ``retract_decode``); constants from
``global_config.py`` and ``server_args.py``.

Each iteration:

1. **Prefill first.** If requests wait (and the batch is not marked full) or a chunked prefill
   is under way, a prefill batch is formed; if it is not empty it runs and the decodes wait --
   unless ``enable_mixed_chunk``, where the decodes ride along in the same iteration.
2. **Admission** (``PrefillAdder``) in waiting-queue order (``schedule_policy``, see
   :mod:`.sglang_policy`), stopping at the first request that does not fit:

   * the chunked request's next chunk goes first (``add_chunked_req``);
   * a request needs ``extend + min(max_new_tokens, 4096)`` tokens below the *remaining*
     tokens: free + evictable KV, minus ``min(max_new_tokens - generated, 4096) x
     new_token_ratio`` for every running request, minus what this pass admitted (its prompt
     tokens and ``min(max_new_tokens, 4096)``); checked again with the request's own cached
     prefix locked (so it no longer counts as evictable). Failing either stops admission and
     marks the batch *full*: no more attempts until a request finishes or is retracted;
   * ``max_prefill_tokens`` caps a batch's prompt tokens (the first request may exceed it);
     ``chunked_prefill_size`` caps them too, and the request that crosses it is cut there and
     continued next iteration (one chunked request at a time);
   * at most ``max_running_requests`` run.
3. **Decode**, when no prefill batch formed. If the KV cache cannot take the next decode step
   (``check_decode_mem``), requests are **retracted**: the one with the fewest generated
   tokens (ties: the longest prompt) first, at least one, until the free + evictable KV covers
   ``retract_decode_steps`` (20) tokens per remaining request, keeping at least one. A
   retracted request's KV is freed (its cached prompt stays in the tree), it goes to the back
   of the waiting queue and is prefilled again later (prompt and generated tokens).
4. **new_token_ratio**: starts at ``init_new_token_ratio x schedule_conservativeness`` (0.7),
   falls by ``(init - min) / 600`` at every decode-only iteration down to ``min = init x 0.14``;
   after a retraction it becomes ``(generated + 20 x running) / sum(max_new_tokens)`` of the
   requests still running (capped at 1), and it is reset to the initial value when the server
   goes idle.

The ratio changes at every decode iteration, but it is only read when a prefill batch is
formed, and that happens only at events (an arrival, a finish, a retraction, a chunk): while
requests wait and the batch is full nothing is attempted. So the plan is stable between
events and the ratio is computed when needed from the engine's decode-step clock
(``plan.decode_steps``), in closed form.

Simplifications (each deliberate):

* Memory is counted in KV blocks: available tokens are ``num_free_blocks() x block_size``
  (SGLang's default page size is 1 token), and the token arithmetic of admission is SGLang's
  with page size 1. A request's blocks are taken when it is admitted rather than after the
  pass, so later checks in the same pass see them (SGLang adds them to an offset instead).
* A retracted request's remaining ``max_new_tokens - generated`` is what admission reserves for
  it, as later SGLang versions do (``PrefillAdder.add_one_req`` on the main branch, e.g. commit
  00550cd, subtracts ``len(req.output_ids)``); 0.4.6.post5 reserves its whole ``max_new_tokens``,
  which can keep a long retracted request out forever.
* Finished requests leave the running batch at once; SGLang filters decode-finished requests
  out at the next decode step, so its next prefill attempt comes one iteration later (two with
  the overlap scheduler, which is not modelled).
* With ``enable_mixed_chunk`` the decodes' blocks are taken before admission and a failed
  decode allocation retracts as in step 3 (SGLang admits first and would run out of memory).
* If a chunk of the chunked request does not fit, it waits and the decodes run (SGLang would
  fail with "Prefill out of memory"); if the last running request cannot decode because the
  chunked request holds the memory, the chunked request is retracted too.
* Policies ``dfs-weight`` and ``random``, LoRA batching, grammar queues, the overlap
  scheduler, speculative decoding and data parallelism are not modelled.
"""

from __future__ import annotations

import attrs

from schedlab.configs import FieldError, bool_field, float_field, int_field, str_field
from schedlab.errors import SimulationError

from .sglang_policy import SglangQueue, calc_priority


@attrs.frozen
class SglangConfig:
    max_running_requests: int = int_field(
        2048, min=1, help="most requests running at once (SGLang: at least 2048 request slots; memory binds first)")
    max_prefill_tokens: int = int_field(16384, min=1, help="prompt tokens of one prefill batch (the first may exceed it)")
    chunked_prefill_size: int = int_field(
        8192, min=0, help="prompt tokens per prefill iteration; longer prompts are chunked (0 = off; SGLang: 2048 "
                          "on GPUs under 25 GB, else 8192)")
    enable_mixed_chunk: bool = bool_field(False, help="decodes run in the same iteration as a prefill batch")
    schedule_policy: str = str_field("fcfs", choices=("fcfs", "lpm", "lof"),
                                     help="waiting order: arrival, longest prefix match (needs a prefix cache), "
                                          "longest max_tokens")
    schedule_conservativeness: float = float_field(1.0, min=0.0, help="scales the initial new_token_ratio")
    init_new_token_ratio: float = float_field(0.7, min=0.0, help="SGLANG_INIT_NEW_TOKEN_RATIO")
    min_new_token_ratio_factor: float = float_field(0.14, min=0.0, help="the ratio's floor as a share of the initial ratio")
    new_token_ratio_decay_steps: int = int_field(600, min=1, help="decode iterations to decay from the initial ratio "
                                                                  "to the floor")
    clip_max_new_tokens: int = int_field(4096, min=1, help="SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: cap on a request's "
                                                           "max_new_tokens in admission estimates")
    retract_decode_steps: int = int_field(20, min=0, help="decode tokens per running request to free by retraction")
    num_reserved_decode_tokens: int = int_field(
        512, min=0, help="disaggregated decode: tokens kept free per running or incoming request when pulling a "
                         "request's KV (SGLANG_NUM_RESERVED_DECODE_TOKENS)")

    def __attrs_post_init__(self):
        if self.enable_mixed_chunk and not self.chunked_prefill_size:
            raise FieldError("enable_mixed_chunk", "needs chunked_prefill_size > 0 (SGLang mixes only chunked prefills)")


class _Adder:
    """One prefill pass's budgets (SGLang ``PrefillAdder``); token counts."""

    __slots__ = ("rem_input", "rem_chunk", "offset", "count")

    def __init__(self, rem_input: int, rem_chunk: int | None):
        self.rem_input = rem_input
        self.rem_chunk = rem_chunk
        self.offset = 0.0      # future tokens promised to running and admitted requests
        self.count = 0         # requests in this prefill batch (``can_run_list``)

    def charge(self, tokens: int, max_new: int) -> None:
        self.offset += max_new
        self.rem_input -= tokens
        if self.rem_chunk is not None:
            self.rem_chunk -= tokens
        self.count += 1


CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"


class SglangScheduler:
    """SGLang's prefill-first scheduler with new-token-ratio admission and retraction."""

    stable_between_events = True

    def __init__(self, config: SglangConfig | None = None):
        self.config = c = config or SglangConfig()
        self.slots = c.max_running_requests
        self.init_ratio = min(c.init_new_token_ratio * c.schedule_conservativeness, 1.0)
        self.min_ratio = min(self.init_ratio * c.min_new_token_ratio_factor, 1.0)
        self.ratio_decay = (self.init_ratio - self.min_ratio) / c.new_token_ratio_decay_steps
        self._ratio0 = self.init_ratio  # the ratio at decode step ``_anchor`` ...
        self._anchor = 0
        self._mixed = 0                 # ... and mixed iterations since (they do not decay it)
        self._chunked = None            # the request whose prefill continues in chunks
        self._batch_full = False
        self._last_finish_ms = 0.0
        #: one entry per retraction: (time, ids of the retracted requests in order, new ratio)
        self.retraction_log: list[tuple[float, tuple, float]] = []

    # -- optional protocol members --------------------------------------------------------
    def new_waiting_queue(self):
        return SglangQueue()

    def rejection_reason(self, request, kv) -> str | None:
        pool = kv.num_blocks * kv.block_size
        if request.prompt_tokens + request.max_output_tokens >= pool:
            return (f"prompt {request.prompt_tokens} + max_tokens {request.max_output_tokens} does not fit below the "
                    f"KV pool's {pool} tokens (SGLang's admission check; SGLang truncates max_new_tokens instead)")
        return None

    def on_finish(self, seq, now_ms: float) -> None:
        self._batch_full = False
        self._last_finish_ms = now_ms

    def pull_headroom(self, running, pending: int, block_size: int) -> int:
        """Blocks a disaggregated decode instance keeps free when it pulls a request's KV, as
        SGLang's decode server pre-allocates (``disaggregation/decode.py``,
        ``DecodePreallocQueue._allocatable_tokens``): ``num_reserved_decode_tokens`` for every
        running request and every one already being received, and at least what the longest
        running request still needs to finish were all the others retracted -- so that
        retraction, which keeps one request, can always make room."""
        reserved = -(-self.config.num_reserved_decode_tokens * (len(running) + pending) // block_size)
        if not running:
            return reserved
        clip = self.config.clip_max_new_tokens
        longest = max(-(-(s.request.prompt_tokens + min(s.request.max_output_tokens, clip)) // block_size)
                      for s in running)
        held = sum(-(-max(s.num_computed_tokens, s.reserved_tokens) // block_size) for s in running)
        return max(reserved, longest - held)

    # -- new_token_ratio ----------------------------------------------------------------------
    def new_token_ratio(self, plan) -> float:
        """The ratio now: decayed once per decode-only iteration since it was last set."""
        steps = plan.decode_steps - self._anchor - self._mixed
        if steps <= 0:
            return self._ratio0
        return max(self._ratio0 - self.ratio_decay * steps, self.min_ratio)

    def _set_ratio(self, ratio: float, anchor: int) -> None:
        self._ratio0 = ratio
        self._anchor = anchor
        self._mixed = 0

    # -- one iteration ------------------------------------------------------------------------
    def schedule(self, plan) -> None:
        if not plan.running and plan.now > self._last_finish_ms:
            self._set_ratio(self.init_ratio, plan.decode_steps)  # the server was idle
        mixed_bs = 0
        if self.config.enable_mixed_chunk and plan.num_decoding:
            if not plan.decode_all():
                self._retract(plan)
                return
            mixed_bs = plan.num_decoding
        if self._prefill(plan, mixed_bs):
            if mixed_bs:
                self._mixed += 1
            else:
                plan.skip_decode()
            return
        if plan.num_decoding and not plan.decode_all():
            self._retract(plan)

    def _prefill(self, plan, mixed_bs: int) -> bool:
        """Form a prefill batch (``get_new_batch_prefill``); True if it is not empty."""
        c = self.config
        chunked = self._chunked
        if chunked is not None and chunked.status != "prefilling":
            chunked = self._chunked = None
        if (self._batch_full or not plan.waiting) and chunked is None:
            return False
        running_bs = plan.num_decoding  # SGLang's running batch: the chunked request is not in it
        if c.max_running_requests - running_bs <= 0 and chunked is None:
            self._batch_full = True
            return False
        rem_chunk = c.chunked_prefill_size - mixed_bs if c.chunked_prefill_size else None
        adder = _Adder(c.max_prefill_tokens - mixed_bs, rem_chunk)
        if chunked is not None and not self._add_chunked(plan, chunked, adder):
            return False  # its chunk does not fit: the decodes run and free memory first
        if rem_chunk is not None and rem_chunk <= 0 and chunked is None:
            return False  # mixed decodes fill the whole chunk
        if plan.waiting:
            adder.offset += self._running_offset(plan)
            calc_priority(c.schedule_policy, plan)
            limit = c.max_running_requests - running_bs
            for seq in list(plan.waiting):
                if adder.count >= limit:
                    self._batch_full = True
                    break
                result = self._add_one(plan, seq, adder)
                if result != CONTINUE:
                    if result == NO_TOKEN:
                        self._batch_full = True
                    break
        return adder.count > 0

    def _running_offset(self, plan) -> float:
        """The running requests' future tokens: ``sum(min(max_new - generated, 4096)) x ratio``."""
        clip = self.config.clip_max_new_tokens
        left = 0
        for seq in plan.running:
            if seq.status == "decoding":
                n = seq.request.max_output_tokens - seq.num_generated
                left += n if n < clip else clip
        return left * self.new_token_ratio(plan)

    def _add_chunked(self, plan, seq, adder: _Adder) -> bool:
        """The chunked request's next chunk (``add_chunked_req``)."""
        left = seq.num_tokens - seq.num_computed_tokens
        n = min(left, adder.rem_chunk)
        if n <= 0 or not plan.prefill(seq, n):
            return False
        last = n == left
        adder.charge(n, self._max_new(seq) if last else 0)
        if last:
            self._chunked = None
        return True

    def _max_new(self, seq) -> int:
        """``min(max_new_tokens - generated, 4096)``: the decode tokens admission reserves."""
        return min(max(seq.request.max_output_tokens - seq.num_generated, 0), self.config.clip_max_new_tokens)

    def _add_one(self, plan, seq, adder: _Adder) -> str:
        """Try to add a waiting request to the batch (``add_one_req``)."""
        kv = plan.kv
        bs = kv.block_size
        hit = plan.cached_tokens(seq)
        extend = seq.num_tokens - hit
        max_new = self._max_new(seq)
        total = extend + max_new
        if total >= kv.num_free_blocks() * bs - adder.offset:
            return NO_TOKEN
        if extend > adder.rem_input and adder.count:
            return OTHER
        # with its cached prefix locked, that prefix is no longer evictable (``_lock_node``)
        locked = kv.blocks_needed(seq, 0, cached_tokens=hit) if hit else 0
        if total > (kv.num_free_blocks() - locked) * bs - adder.offset:
            return NO_TOKEN
        if adder.rem_chunk is None or extend <= adder.rem_chunk:
            if not plan.admit(seq, extend):
                return NO_TOKEN
            adder.charge(extend, max_new)
        else:
            n = adder.rem_chunk
            if n <= 0:
                return OTHER
            if not plan.admit(seq, n):
                return NO_TOKEN
            adder.charge(n, 0)
            self._chunked = seq
        return self._budget_state(kv, adder)

    @staticmethod
    def _budget_state(kv, adder: _Adder) -> str:
        free = kv.num_free_blocks() * kv.block_size
        if free - adder.offset <= 0 or free <= 0:
            return NO_TOKEN
        if adder.rem_input <= 0 or (adder.rem_chunk is not None and adder.rem_chunk <= 0):
            return OTHER
        return CONTINUE

    def _retract(self, plan) -> None:
        """Decode is out of memory (``retract_decode``): retract until it fits, then decode."""
        c = self.config
        kv = plan.kv
        running = [s for s in plan.running if s.status == "decoding"]
        # fewest generated tokens last, ties: longest prompt last (a stable sort, reversed)
        order = sorted(running, key=lambda s: (s.num_generated, -s.request.prompt_tokens), reverse=True)
        retracted = []
        while not retracted or kv.num_free_blocks() * kv.block_size < c.retract_decode_steps * len(order):
            if len(order) <= 1:
                break
            victim = order.pop()
            plan.preempt(victim)
            retracted.append(victim.request.id)
        self._batch_full = False
        generated = sum(s.num_generated for s in order)
        max_new = sum(s.request.max_output_tokens for s in order)
        ratio = min(1.0, (generated + c.retract_decode_steps * len(order)) / max_new)
        self._set_ratio(ratio, plan.decode_steps + 1)  # this iteration's decode does not decay it
        self.retraction_log.append((plan.now, tuple(retracted), ratio))
        if plan.decode_all():
            return
        chunked = self._chunked
        if chunked is not None and chunked.status == "prefilling" and not plan.is_scheduled(chunked):
            plan.preempt(chunked)
            self._chunked = None
            self.retraction_log.append((plan.now, (chunked.request.id,), ratio))
            if plan.decode_all():
                return
        raise SimulationError(
            f"SGLang scheduler: {len(order)} running request(s) cannot decode even after retraction "
            f"({kv.num_free_blocks()}/{kv.num_blocks} KV blocks free)")
