"""Speculative decoding: its settings, how many drafts a step verifies, and which are accepted.

A drafter proposes ``k`` tokens for every decoding sequence; one target pass verifies them
with the sequence's last token (``1 + k`` query tokens) and keeps the drafts up to the first
one the target disagrees with, plus one token of its own. This follows vLLM 0.33
(``vllm/v1/core/sched/scheduler.py``, ``kv_cache_manager.allocate_slots``,
``config/speculative.py``, ``spec_decode/metrics.py``):

* a decoding request is scheduled for ``1 + k`` tokens (``num_tokens_with_spec -
  num_computed_tokens``) out of the same token budget as prefill chunks; when the budget runs
  short its drafts are cut (``min(num_new_tokens, token_budget)``);
* ``allocate_slots`` takes KV slots for those tokens plus ``num_lookahead_tokens`` -- ``k``
  for drafters that write KV past the verified tokens (EAGLE, a draft model), 0 for n-gram;
* every request a step schedules also takes ``max_num_new_slots_for_drafting`` input slots of
  the budget (1 for a draft model, 0 for EAGLE and n-gram): ``input_budget``;
* after the pass ``num_computed_tokens`` drops by the rejected drafts;
* ``num_speculative_tokens_per_batch_size`` picks ``k`` by batch size: the drafts proposed
  after a step (and verified in the next) number ``k`` for that step's scheduled requests.

Acceptance. Draft token ``i`` of a step is accepted with probability ``alpha``,
independently (the i.i.d. model of Leviathan et al., ICML 2023), so a step with ``k`` drafts
yields ``(1 - alpha^(k+1)) / (1 - alpha)`` tokens on average. The draws are a function of
the run's seed, the request id and the output position, nothing else: output token ``p`` of a
request is "predictable" when ``hash(seed, id, p) < alpha``. A step at output position ``g``
with ``d`` drafts accepts the predictable run starting at ``g``, at most ``d``; the token
after it is the target's own. Every position is looked at once at most, so the draws are
i.i.d., and the same in both engines whatever the order of events (and after a preemption,
which resumes at the same position). With ``acceptance_sd > 0`` each request first draws its
own rate from a Beta distribution with mean ``acceptance_rate`` (easy and hard prompts).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from .configs import FieldError, bool_field, float_field, int_field, str_field, table_field

METHODS = ("draft_model", "eagle", "ngram")
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_SALT = 0x5DEECE66D  # keeps these draws apart from the workload's, which use the same seed


def _mix(z: int) -> int:
    """SplitMix64's finaliser: a 64-bit integer hash with every output bit depending on every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mix_array(z: np.ndarray) -> np.ndarray:
    """:func:`_mix` on uint64 arrays (numpy's uint64 arithmetic wraps as the mask does)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def predictable_positions(key: int, threshold: int, count: int) -> int:
    """Bit ``p`` set when output position ``p`` (< ``count``) is predictable: ``_mix(key + p *
    golden) < threshold``. One integer per request, so a step's accepted drafts are the run
    of set bits from its position (a shift and a bit trick, whatever the draws)."""
    if threshold >= 1 << 64:
        return (1 << count) - 1
    with np.errstate(over="ignore"):
        z = np.uint64(key) + np.arange(count, dtype=np.uint64) * np.uint64(_GOLDEN)
        hits = _mix_array(z) < np.uint64(threshold)
    return int.from_bytes(np.packbits(hits, bitorder="little").tobytes(), "little")


def _rates_field():
    def convert(value):
        if isinstance(value, list):
            return tuple(value)
        return value

    def check(_inst, attribute, value):
        if not isinstance(value, tuple) or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                               for x in value):
            raise FieldError(attribute.name, f"must be a list of numbers, got {value!r}")
        if any(not 0.0 <= x <= 1.0 for x in value):
            raise FieldError(attribute.name, f"every rate must be in [0, 1], got {list(value)}")
        if any(b > a for a, b in zip(value, value[1:])):
            raise FieldError(attribute.name, f"must not increase: draft j is accepted only if draft j - 1 is, so "
                                             f"its share of the steps cannot be larger, got {list(value)}")

    return attrs.field(default=(), converter=convert, validator=check, metadata={
        "help": "[m1, m2, ...]: the share of steps whose draft 1, 2, ... is accepted, as vLLM reports per-position "
                "acceptance (spec_decode num_accepted_tokens_per_pos / drafts); replaces acceptance_rate, one rate "
                "for every draft; empty = acceptance_rate"})


def _schedule_field():
    def convert(value):
        if isinstance(value, list):
            return tuple(tuple(e) if isinstance(e, list) else e for e in value)
        return value

    def check(_inst, attribute, value):
        if not isinstance(value, tuple):
            raise FieldError(attribute.name, f"must be a list of [first, last, k] entries, got {value!r}")
        previous_end = 0
        for entry in value:
            if (not isinstance(entry, tuple) or len(entry) != 3
                    or any(isinstance(x, bool) or not isinstance(x, int) for x in entry)):
                raise FieldError(attribute.name, f"every entry must be [first, last, k] (whole numbers), got {entry!r}")
            first, last, k = entry
            if first < 1 or last < first or k < 0:
                raise FieldError(attribute.name, f"entry {list(entry)}: need 1 <= first <= last and k >= 0")
            if first <= previous_end:
                raise FieldError(attribute.name, f"entry {list(entry)}: ranges must be sorted and must not overlap")
            previous_end = last
        if value and value[0][0] != 1:
            raise FieldError(attribute.name, "the first range must start at batch size 1 (as vLLM requires)")

    return attrs.field(default=(), converter=convert, validator=check, metadata={
        "help": "[[first, last, k], ...]: drafts per sequence by batch size, ranges inclusive; gaps and sizes "
                "past the last range keep the previous k (vLLM num_speculative_tokens_per_batch_size)"})


@attrs.frozen
class SpeculativeConfig:
    """The ``[speculative]`` table: speculation is an engine setting, as in vLLM
    (``--speculative-config``), so it works with every scheduler, cost model and KV cache."""

    method: str = str_field(
        "draft_model", choices=METHODS,
        help="who drafts: 'draft_model' (a small model, its own cost model in [speculative.draft]), 'eagle' (a "
             "draft head on the target's hidden states, also [speculative.draft]) or 'ngram' (prompt lookup on "
             "the CPU: proposer_ms only); draft_model and eagle take k lookahead KV slots per step")
    num_speculative_tokens: int = int_field(3, min=1, max=64, help="k: draft tokens per decoding sequence per step")
    acceptance_rate: float = float_field(
        0.7, min=0.0, max=1.0, help="alpha: probability that each draft token is accepted (independently)")
    acceptance_sd: float = float_field(
        0.0, min=0.0, help="spread of the rate over requests: each request draws its own from a Beta distribution "
                           "with mean acceptance_rate and this standard deviation (0 = the same for all)")
    acceptance_by_position: tuple = _rates_field()
    k_by_batch_size: tuple = _schedule_field()
    draft: dict | None = table_field(
        None, help="the drafter's cost model table (kind = ..., e.g. a roofline of a small model); each step it "
                   "runs one pass over the step's tokens, then k - 1 single-token passes")
    proposer_ms: float = float_field(
        0.0, min=0.0, help="time per step spent proposing drafts outside the drafter's passes (n-gram matching "
                           "on the CPU, draft sampling), ms")
    draft_memory: bool = bool_field(
        True, help="the drafter's weights and KV layers take their share of the KV pool, as vLLM loads them on the "
                   "target's GPUs ([kv_cache] draft_model, from the draft cost model's model when the pool is sized "
                   "from model and gpu); false: the pool as without speculation")

    def __attrs_post_init__(self):
        if self.method == "ngram" and self.draft is not None:
            raise FieldError("draft", "method 'ngram' proposes on the CPU and has no drafter cost model "
                                      "(set proposer_ms instead)")
        if self.method != "ngram" and self.draft is None:
            raise FieldError("draft", f"method {self.method!r} needs the drafter's cost model: "
                                      "draft = {kind = \"roofline\", model = ..., gpu = ...}")
        rates = self.acceptance_by_position
        if rates and self.acceptance_sd:
            raise FieldError("acceptance_sd", "spreads acceptance_rate over requests; with acceptance_by_position "
                                              "leave it out")
        if rates and self.acceptance_rate != attrs.fields(SpeculativeConfig).acceptance_rate.default:
            # (it was ignored without a word: review s81 badinput, 5)
            raise FieldError("acceptance_rate", "acceptance_by_position gives each position's rate, so this one would "
                                                "not be used: leave it out")
        # (a k_by_batch_size k above it is capped at it, as vLLM caps it: k_for; counting the uncapped k
        # refused rates enough for every step: review s81 badinput, 6)
        most = self.num_speculative_tokens
        if rates and len(rates) < most:
            raise FieldError("acceptance_by_position", f"gives {len(rates)} rate(s), but a step may verify {most} "
                                                       "drafts: give one for each position")
        sd, mean = self.acceptance_sd, self.acceptance_rate
        if sd and not (0.0 < mean < 1.0 and sd * sd < mean * (1.0 - mean)):
            raise FieldError("acceptance_sd", f"must be below sqrt(rate x (1 - rate)) = "
                                              f"{math.sqrt(mean * (1.0 - mean)):.4g} for a Beta distribution "
                                              f"with mean {mean}, got {sd}")

    @property
    def lookahead(self) -> int:
        """KV slots taken past the verified tokens each step (vLLM ``num_lookahead_tokens``:
        ``num_speculative_tokens`` for EAGLE and draft models, which write KV for the next drafts)."""
        return 0 if self.method == "ngram" else self.num_speculative_tokens

    @property
    def draft_input_slots(self) -> int:
        """Input slots the drafter takes beside each scheduled request's tokens, out of the
        step's token budget (vLLM 0.33 ``max_num_new_slots_for_drafting``: a draft model's
        autoregressive input keeps one token more; EAGLE and n-gram need none)."""
        return 1 if self.method == "draft_model" else 0

    def k_for(self, batch_size: int) -> int:
        """Drafts per sequence proposed after a step that scheduled ``batch_size`` requests."""
        k = self.num_speculative_tokens
        chosen = None
        for first, _last, ranged in self.k_by_batch_size:
            if first > batch_size:
                break
            chosen = ranged
        return k if chosen is None else min(k, chosen)


def budget_problem(scheduler_config, config: SpeculativeConfig) -> str | None:
    """Why a scheduler's token budget cannot serve ``config``'s drafts (None: it can). The
    budget must exceed the drafter's lookahead slots, as vLLM 0.33 requires (``VllmConfig``:
    "not enough slots to schedule a token and support the speculative decoding settings"); a
    draft model's input slot beside every request also needs chunked prefill: unchunked, a
    prompt as long as the budget would never fit beside it (vLLM avoids that by asking for a
    budget of at least ``max_model_len`` then). Schedulers without ``max_num_batched_tokens``
    have no such budget."""
    budget = getattr(scheduler_config, "max_num_batched_tokens", None)
    if not isinstance(budget, int) or isinstance(budget, bool):
        return None
    if config.lookahead and budget <= config.lookahead:
        return (f"max_num_batched_tokens = {budget} must exceed the drafter's {config.lookahead} lookahead "
                f"slots ([speculative] {config.method}, num_speculative_tokens = {config.num_speculative_tokens})")
    if config.draft_input_slots and getattr(scheduler_config, "chunked_prefill", True) is False:
        return ("[speculative] method = \"draft_model\" takes an input slot of the token budget beside every "
                "request; set chunked_prefill = true (vLLM V1's default)")
    return None


def expected_tokens_per_step(alpha: float, k: int, by_position: tuple = ()) -> float:
    """Mean tokens a step with ``k`` drafts yields under i.i.d. acceptance: ``sum alpha^j, j = 0..k``;
    with per-position shares of accepted steps ``by_position`` (m_1 >= m_2 ...), ``1 + m_1 + ... + m_k``."""
    if by_position:
        return 1.0 + float(sum(by_position[:k]))
    if alpha == 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class Speculation:
    """The engines' side of speculative decoding in one run: ``k`` per step and acceptance draws.

    Per-request state (which output positions are predictable, as the bits of one integer)
    is kept on the engine's sequence object (``spec_state``), so nothing here grows with the run.
    """

    def __init__(self, config: SpeculativeConfig, seed: int):
        self.config = config
        self.k_max = config.num_speculative_tokens
        self.lookahead = config.lookahead
        self.draft_input_slots = config.draft_input_slots
        #: tokens after a block its prefix-cache identity covers (vLLM 0.33
        #: ``num_hash_lookahead_tokens``: 1 for EAGLE, whose KV at a block's last position reads the next token)
        self.hash_lookahead = 1 if config.method == "eagle" else 0
        #: placeholder drafts a one-token admission beside decodes is padded with (vLLM pads it to
        #: a uniform decode batch of 1 + k rows, but not with drafts per batch size)
        self.admission_padding = 0 if config.k_by_batch_size else self.k_max
        #: each decode verifies the drafts proposed after the batch that last scheduled it (with
        #: drafts per batch size they differ between requests: the sequences keep their own ``draft_k``)
        self.per_request = bool(config.k_by_batch_size)
        self.slack = self.k_max + self.lookahead  # KV slots a step may hold past the last token
        self._seed_key = _mix((seed * _GOLDEN + _SALT) & _MASK)
        self._seed = seed
        self._k_memo: dict[int, int] = {}
        #: acceptance by position: draft j is accepted, given draft j - 1 was, with m_j / m_(j-1)
        #: (as 64-bit thresholds; None: one i.i.d. rate, acceptance_rate)
        rates = config.acceptance_by_position
        self._given = None
        self.by_position = bool(rates)  # (the fast engine's inlined draws ask accepted() then)
        if rates:
            shares = (1.0,) + tuple(rates)
            self._given = tuple(int(min(1.0, b / a) * 2.0 ** 64) if a > 0 else 0
                                for a, b in zip(shares, shares[1:]))

    def slack_for(self, request) -> int:
        """KV slots ``request``'s last step may hold past its last token: that step's ``k`` drafts and
        the lookahead slots, or only the lookahead for a one-token answer (``max_tokens = 1``, every
        request a disaggregated prefill pool serves), whose one step is its prefill, verifying no
        drafts (review s80 specpp, finding 4)."""
        return self.lookahead if request.max_output_tokens <= 1 else self.slack

    def configure_cache(self, kv, scheduler=None) -> None:
        """Tell a prefix cache that keys blocks by content what this drafter's KV depends on
        (``KVCache.use_hash_lookahead``, optional), and a scheduler that plans an answer's later
        parts ahead the KV slots a step holds past its tokens (``Scheduler.use_speculative_slack``,
        optional: TGI's answer segments); the engines call it once, at construction."""
        use = getattr(kv, "use_hash_lookahead", None)
        if self.hash_lookahead and use is not None and getattr(kv, "prefix_caching", False):
            use(self.hash_lookahead)
        tell = getattr(scheduler, "use_speculative_slack", None)
        if tell is not None:
            tell(self.slack_for)

    def k_for(self, batch_size: int) -> int:
        k = self._k_memo.get(batch_size)
        if k is None:
            k = self._k_memo[batch_size] = self.config.k_for(batch_size)
        return k

    def propose(self, seqs, batch_size: int) -> None:
        """Drafts per batch size: the drafter proposes ``k_for(batch_size)`` drafts to each of
        ``seqs``, the requests of a batch of ``batch_size`` that sample a token (its decodes and
        last prompt chunks), which their next decodes verify (vLLM 0.33: the drafts of
        ``update_draft_token_ids``, or planning ahead the placeholders
        ``AsyncScheduler._update_after_schedule`` gives them when it schedules the batch)."""
        if self.per_request and batch_size:
            k = self.k_for(batch_size)
            for seq in seqs:
                seq.draft_k = k

    def rate(self, request) -> float:
        """The request's acceptance rate."""
        c = self.config
        if not c.acceptance_sd:
            return c.acceptance_rate
        mean, sd = c.acceptance_rate, c.acceptance_sd
        nu = mean * (1.0 - mean) / (sd * sd) - 1.0
        rng = np.random.default_rng([self._seed, _SALT, request.id])
        return float(rng.beta(mean * nu, (1.0 - mean) * nu))

    def predictable(self, request) -> int:
        """The request's predictable output positions as bits (see :func:`predictable_positions`),
        for every position a step may look at: up to its output plus ``k`` drafts."""
        key = _mix((self._seed_key + request.id * _GOLDEN) & _MASK)
        threshold = int(self.rate(request) * 2.0 ** 64)  # a position is predictable when its hash is below
        return predictable_positions(key, threshold, request.target_tokens + self.k_max)

    def accepted(self, seq, position: int, drafts: int) -> int:
        """How many of ``drafts`` draft tokens, for output positions ``position, position + 1,
        ...`` of ``seq``, the target accepts: the leading predictable ones; by position, the
        leading drafts each accepted given the one before (a hash of the request, ``position``
        and the draft's index against its threshold: the same in both engines, step by step)."""
        given = self._given
        if given is not None:
            key = _mix((self._seed_key + seq.request.id * _GOLDEN) & _MASK)
            m = 0
            while m < drafts and _mix((key + (position * 64 + m + 1) * _GOLDEN) & _MASK) < given[m]:
                m += 1
            return m
        bits = seq.spec_state
        if bits is None:
            bits = seq.spec_state = self.predictable(seq.request)
        x = bits >> position
        m = (~x & (x + 1)).bit_length() - 1  # trailing ones
        return m if m < drafts else drafts

    def rejection_reason(self, reason_of, request, kv, longest: int = 0) -> str | None:
        """Why ``request`` can never run with speculation, by the scheduler's own rule
        ``reason_of(request, kv)`` applied to it with ``max_tokens`` raised by the slots a last
        step's drafts and lookahead take -- no further than ``longest`` tokens (``max_model_len``;
        0: no limit), which vLLM's drafts and slots never pass; None when it fits."""
        most = request.max_output_tokens
        slack = self.slack_for(request)
        scheduler = getattr(reason_of, "scheduler", None)
        if longest and request.prompt_tokens + most + slack > longest:
            # a decode's input stays below longest, its lookahead slots at it: at most longest - 1
            # slots (longest with a lookahead), a "max_tokens" of longest - prompt (+ 1); asked as an
            # output without max_tokens, which no context rule of the scheduler's counts
            padded = min(most + slack, longest - request.prompt_tokens + (1 if self.lookahead else 0))
            asked = attrs.evolve(request, max_tokens=None, output_tokens=padded)
            reserve = getattr(scheduler, "kv_reservation", None)
            # a reserving scheduler's engine holds no more than longest slots (Plan.admit caps the
            # reservation there), which its rule counts as prompt + max_tokens (or one less): asked
            # so that its reservation stays within longest (review s80 specpp, finding 1)
            while reserve is not None and padded > most and reserve(asked) > longest:
                padded -= 1
                asked = attrs.evolve(request, max_tokens=None, output_tokens=padded)
            if padded <= most:
                return None  # (the scheduler's own rule has said it fits)
        else:
            padded = most + slack
            asked = attrs.evolve(request, max_tokens=padded)
        reason = reason_of(asked, kv)
        if reason:
            return f"{reason} (max_tokens {most} + {padded - most} speculative slots)"
        return self._first_step_reason(scheduler, request, kv, longest)

    def _first_step_reason(self, scheduler, request, kv, longest: int) -> str | None:
        """Why the prompt of ``request``, prefilled in one step, can never be admitted with its
        lookahead slots, or None: a model's window layers hold every token of that step, and the
        drafter's ``lookahead`` slots come on top (``Plan.admit``: ``prompt + lookahead`` slots, no
        further than ``longest``), which the scheduler's own rule and never-fits test leave out -- the
        request waited for ever (review specdisagg, finding 5). Asked only where the scheduler is
        known to prefill the prompt in one step (:func:`one_step_prefill`)."""
        window = getattr(kv, "window", None)
        prompt = request.prompt_tokens
        if not self.lookahead or window is None or not one_step_prefill(scheduler, prompt):
            return None
        slots = prompt + self.lookahead
        if longest and slots > longest:
            slots = max(longest, prompt)
        need = -(-slots // kv.block_size) + window.held(0, prompt)
        if need <= kv.num_blocks:
            return None
        return (f"its prompt of {prompt} tokens, prefilled in one step, needs {need} KV blocks at once (the model's "
                f"window layers keep every token of the step, plus {slots - prompt} speculative lookahead "
                f"slot{'s' if slots - prompt != 1 else ''} the drafter writes) but the cache has {kv.num_blocks}")


def one_step_prefill(scheduler, prompt: int) -> bool:
    """Whether ``scheduler`` (None: unknown) prefills a prompt of ``prompt`` tokens in one step
    when alone: a scheduler with vLLM's settings (``chunked_prefill``, ``max_num_batched_tokens``
    on its config) without chunked prefill, or with a budget that holds the prompt. False where
    unknown: a check that assumed one step would turn away prompts that fit in chunks."""
    config = getattr(scheduler, "config", None)
    chunked = getattr(config, "chunked_prefill", None)
    budget = getattr(config, "max_num_batched_tokens", None)
    if not isinstance(chunked, bool) or not isinstance(budget, int):
        return False
    return not chunked or budget >= prompt
