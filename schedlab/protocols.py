"""The contracts between the engine and its plugins.

The engine owns time, sequences and the order of events; plugins decide:

* a :class:`Scheduler` fills in each iteration through a :class:`Plan` (which sequences run
  and how many tokens each, whom to admit, whom to preempt);
* a :class:`CostModel` says how long an iteration of a given :class:`Batch` shape takes;
* a :class:`KVCache` owns the block pool: allocation, release, prefix reuse, swap space;
* a :class:`Workload` produces requests; a :class:`Router` spreads them over instances; an
  :class:`Autoscaler` decides how many of them serve;
* a :class:`PowerModel` says what power the GPUs draw during and between iterations;
* a :class:`Report` writes results.

Speed contract. The fast engine advances runs of identical decode-only iterations in one
step. It does so only when the plugins say it may:

* ``Scheduler.stable_between_events = True``: once the scheduler returns a decode-only plan
  (every decoding sequence decodes, nothing admitted, prefilled, swapped or preempted), it
  would return the same plan on every later iteration until something *changes*: an arrival,
  a sequence finishing, the time given to :meth:`Plan.wake_at`, the decode iterations given
  to :meth:`Plan.wake_after`, or the KV cache running short of blocks for the next decode step; and when nothing is waiting, prefilling or swapped
  and the next decode step fits in the cache, its plan is exactly ``decode_all()`` (so the
  engine need not ask) -- until the decode iterations its last :meth:`Plan.wake_after` gave
  have passed (0: the next iteration), when the engine asks again;
* ``CostModel.decode_step_increment(batch)`` returns how much longer each further identical
  decode-only iteration takes (``0.0`` for a constant cost, a positive number when the cost
  grows with context) instead of ``None``. A cost that is only *piecewise* linear in the
  step (interpolated profiles: the slope changes where a context crosses a grid point)
  returns ``(increment, steps)``: the increment holds for the iterations ``0 .. steps - 1``
  of the run (``steps >= 1``), and the engine ends the run there and asks again;
* ``KVCache.grow(n)`` exists, taking ``n`` decode blocks at once (a cache with a ``window``:
  ``grow(taken, freed)``, see :class:`KVCache`). A cache whose growth can
  evict cached blocks also has ``blocks_before_eviction()``: while requests wait, a run ends
  before growth evicts, because a smaller cached hit can change whom the scheduler admits.

A plugin that declares nothing still works: the engine then asks it about every iteration.
With speculative decoding on (``[speculative]``, :mod:`schedlab.speculative`) every decode
step draws how many tokens each sequence gets, so the engine runs those steps one at a time
whatever the plugins declare.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from .model import Request


class SequenceState(Protocol):
    """What plugins may read about a request inside an engine (both engines provide it).

    Counters follow vLLM V1: ``num_tokens`` = prompt + generated tokens; the scheduler helps
    ``num_computed_tokens`` (tokens whose KV is in the cache) catch up with ``num_tokens``.
    After a recompute preemption ``num_computed_tokens`` drops to 0.

    Read only, except ``kv_state`` (the KV cache's own): the engines change these fields through
    the Plan's actions. They are not guarded (that would cost every iteration), so a scheduler
    that writes one (``seq.reserved_tokens = ...``) gets runs the two engines disagree on --
    ``compare_runs`` shows it.
    """

    request: "Request"
    seq_no: int  # arrival order within the run, unique
    kv_state: Any  # free for the KV cache's own per-sequence data
    reserved_tokens: int  # tokens of KV held beyond the computed ones: reserved at admission (0 = grow as
    # you go), or with speculative decoding the slots its last step took (vLLM keeps them for its next step)
    num_preemptions: int

    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_generated(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def status(self) -> str: ...  # "waiting" | "prefilling" | "decoding" | "swapped" | "finished" | "rejected"
    # (engine-internal, never in a plan's running view: "parked", "in_flight" -- pipeline parallelism;
    # an "in_flight" sequence shows only in ``running.preemptible()``, as a possible victim)


class WaitingQueue(Protocol):
    """The waiting requests, in the order the scheduler wants to serve them.

    The engine pushes arrivals (``push``) and recompute-preempted sequences (``push_front``:
    vLLM puts them back at the front); the scheduler reads ``peek``/iterates and admits via
    :meth:`Plan.admit`, which calls ``remove``.
    """

    def push(self, seq: SequenceState) -> None: ...
    def push_front(self, seq: SequenceState) -> None: ...
    def peek(self) -> SequenceState | None: ...
    def remove(self, seq: SequenceState) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[SequenceState]: ...


@attrs.define(slots=True)
class Batch:
    """The shape of one iteration, which is all a cost model sees.

    :ivar num_decode: sequences producing a token by a decode step.
    :ivar decode_context_tokens: KV tokens the decodes attend to, summed (each decode attends
        to its ``num_tokens``: the cached context plus the token being computed).
    :ivar num_prefill: sequences computing prompt (or recompute) tokens.
    :ivar prefill_tokens: prompt/recompute tokens computed this iteration, summed.
    :ivar prefill_context_tokens: tokens already cached before each prefill chunk, summed
        (attention of a chunk reaches back over them).
    :ivar decode_context_max: the longest decode context (0 without decodes);
    :ivar decode_context_min: the shortest. Both are filled only for cost models that set
        ``needs_context_range = True`` (uneven contexts slow attention kernels down); they
        stay 0 otherwise, so engines spend nothing on them.
    :ivar spec_tokens: speculative decoding's draft tokens verified by the decodes, summed: a
        decode with ``d`` drafts computes ``1 + d`` query tokens in the same pass (the verify
        pass), and its context above counts them too. 0 without speculation.
    """

    num_decode: int = 0
    decode_context_tokens: int = 0
    num_prefill: int = 0
    prefill_tokens: int = 0
    prefill_context_tokens: int = 0
    decode_context_max: int = 0
    decode_context_min: int = 0
    spec_tokens: int = 0

    @property
    def num_seqs(self) -> int:
        return self.num_decode + self.num_prefill

    @property
    def num_batched_tokens(self) -> int:
        return self.num_decode + self.spec_tokens + self.prefill_tokens


@runtime_checkable
class CostModel(Protocol):
    """How long one iteration takes on the accelerator, in milliseconds.

    Optional members: ``needs_context_range = True`` asks the engines to fill
    :attr:`Batch.decode_context_max` and :attr:`Batch.decode_context_min`;
    ``work(batch)`` gives ``(bytes, flops)``, what one GPU of the instance reads from its memory
    and computes in the iteration (power models turn them into utilisations) -- a
    :class:`schedlab.energy.work.Work` when it can say them kernel group by kernel group
    (phases, each bound by its own resource), a plain pair otherwise; and
    ``clock_ratio(batch)``, the SM clock the iteration runs at as a share of the highest (1.0
    when absent; :mod:`schedlab.energy.clock`).

    Optional members for the layouts of ``[cluster]`` (:mod:`schedlab.parallelism`; the
    factory receives the layout as ``parallelism``):

    * data parallelism (``data_parallel = D``): ``rank_ms(batch)``, one rank's part of a step
      -- everything but the routed experts' layers -- and ``experts_ms(tokens)``, those layers
      for a step whose ``D`` ranks run ``tokens[r]`` tokens each (dispatch, the busiest GPU's
      experts, combine), or None for a model without routed experts (its ranks do not step
      together). The engine times a step as the largest rank part plus the experts
      (:mod:`schedlab.engine.lockstep`) and asks ``rank_step_increment(batch)`` (optional, as
      ``decode_step_increment`` but of ``rank_ms``; ``decode_step_increment`` when absent, which
      is right only where the part without the experts meets the host's floor exactly when the
      whole iteration does) for a rank part's growth in a decode run, the experts' part depending
      only on the tokens. With ``[power]``
      the ranks' work is split alike: ``rank_work(batch)``, the ``(bytes, flops)`` of one GPU's
      own part, and ``experts_work(tokens)``, one GPU's share of the step's experts -- the mean
      GPU's, what power models meter every GPU at (at one rank the two add up to ``work``);
      ``rank_kernel_ms(batch)``, optional, is the own part's GPU kernels without the host's
      share (:class:`schedlab.engine.rank_cost.RankCost` hands power models what a step did on a
      rank's GPUs); ``busiest_experts_work(tokens)``, optional, is the ``(bytes, flops)`` of the
      busiest expert GPU, the one ``experts_ms`` waits for, which ``[clock]`` stretches the
      experts' part on (``experts_work`` when absent; they differ when the router is uneven,
      ``[cluster] expert_balancedness`` below 1);
    * pipeline parallelism (``pipeline_parallel = P``): ``pipeline_ms(batch)``, the ``P`` stages'
      times of the iteration and the time of the activations' send from one stage to the next
      -- one number for every hop, or a sequence of each hop's (``P - 1``: a pipeline over nodes
      leaves a node on some hops only) -- (:mod:`schedlab.engine.pipeline`). With ``[power]`` or
      ``[clock]`` the work is split alike:
      ``stage_work(batch)``, the ``(bytes, flops)`` one GPU of each stage reads and computes (they
      add up to ``work``); the first stage's kernels are its time less the host's share of the
      step (``iteration_ms - kernel_ms``) (:class:`schedlab.engine.stage_cost.StageCost` hands
      power models what a batch did on a stage's GPUs). With ``[speculative]`` the drafter's
      passes are the last stage's time, work and kernels (:mod:`schedlab.drafting` adds them);
      a cost model says only the target's.
    """

    def iteration_ms(self, batch: Batch) -> float:
        """Duration of an iteration with this shape (> 0 whenever it computes anything)."""
        ...

    def decode_step_increment(self, batch: Batch) -> float | tuple[float, int] | None:
        """Optional speed declaration: for a decode-only ``batch``, how much longer each next
        identical iteration takes (the context grows by ``num_decode`` tokens per step, and
        the longest and shortest context by one). Return ``(increment, steps)`` when that
        increment holds only for the first ``steps`` iterations of the run, and ``None``
        when the cost is not linear in the step; the engine then asks :meth:`iteration_ms`
        for every iteration."""
        ...


@runtime_checkable
class KVCache(Protocol):
    """The paged KV block pool of one instance.

    A sequence holds ``max(ceil(reserved_tokens / block_size), ceil(num_computed_tokens /
    block_size))`` blocks between iterations; some of them may be shared prefix blocks.
    ``free`` blocks include cached blocks that nobody references (they are evictable).

    ``prefix_caching`` (optional, a bool; ``True`` on a cache that reuses prefixes) says whether
    :meth:`cached_tokens` may answer more than 0. Both engines read it alike: ``True``, they ask
    ``cached_tokens`` at each admission, reuse the hit, count it (``prefix_hits``) and let
    sequences share blocks; ``False``, they never ask (the hit is 0: the built-in paged cache
    without prefix caching); left out, they ask, and a hit above 0 stops the run, naming the
    cache -- the built-in schedulers read the attribute too (which freed block a decode takes,
    cache-aware queue orders), so a cache that reuses prefixes must declare it. Every answer is
    checked: a whole number from 0 to ``num_tokens - 1`` and, for a sequence never scheduled
    before, at most the whole blocks of its request's shared prefix
    (:attr:`schedlab.model.Request.shared_prefix_tokens`: requests have no tokens, so nothing
    else is another request's), else the run stops naming the cache -- unless the cache says it
    cached the request's own input before it ran (optional ``input_cached_before_run(seq)``, in
    tokens: TGI's radix allocator caches an allocation dropped before its prefill ran,
    :meth:`schedlab_plugins.kv_caches.PrefixKVCache.give_back`), when the hit may be up to that.

    Optional member: ``host``, a host-memory tier under a prefix cache
    (:class:`schedlab_plugins.kv_caches.host_tier.HostTier` or an object with its ``loaded``
    counter, ``bytes_per_block``, ``link_gbps``, ``latency_us``, ``load_ms`` and ``attach``):
    ``cached_tokens`` then counts hits in either tier, and the engines charge the blocks an
    admission's ``allocate`` loaded (the rise of ``host.loaded``) to that iteration.

    Optional with swap space (``swap_out``/``swap_in``): ``free_swapped(seq)``, which drops a
    swapped-out sequence's copy in swap space when its client gives up (it is aborted).

    Optional: ``reset_prefix_cache()`` (named after vLLM's ``KVCacheManager.reset_prefix_cache``;
    an autoscaled instance's restart, :mod:`schedlab.engine.scaling`): drop every cached prefix --
    the host tier's copies too -- and leave the cache as freshly built, so that every later call
    answers as a new cache's would. It needs an idle cache: it raises ``RuntimeError``, changing
    nothing, while a sequence holds a block or swap space (vLLM's logs a warning and returns False;
    here that would be an engine's bug, so it is never swallowed). Lifetime counters
    (``evictions``, the host tier's ``stored``...) go on counting; ``epoch`` changes. A cache
    without it keeps its prefixes over a restart.

    Optional: ``discard(seq)``, ``free`` without keeping the blocks ``seq`` computed for later
    hits (SGLang aborts a chunked prefill with ``release_kv_cache(checkpoint=False)``); the
    engines call it there when the scheduler follows SGLang's rule for aborts
    (``aborts_run_once_more``). A cache without it frees as usual.

    Optional: ``window`` (a :class:`schedlab.kv_window.SlidingWindow`, or None) and
    ``window_blocks(seq)``, for a model whose sliding-window layers keep only their window in
    KV cache groups of their own (vLLM's hybrid manager): a sequence then also holds
    ``window_blocks(seq)`` blocks, which :meth:`allocate` takes and frees as the window slides.
    The engines count them in what the sequences hold, in the fewest blocks a request needs
    (:func:`schedlab.kv_window.sequence_blocks`). Such a cache's ``grow``, if it has one, is
    ``grow(taken, freed)``: a bulk run of decodes took ``taken`` blocks and gave back ``freed``
    window blocks; a sequence whose last allocation was a decode then holds
    ``window.held(c - 1, c)`` window blocks at ``c`` computed tokens (the cache follows its
    computed tokens; the engine allocates each decoder's first decode of a run itself). And
    ``allocate_decodes(seqs)``: one more token's slot for each of ``seqs``, all or none, as
    ``allocate(seq, 1)`` for each after a check that the sum of their ``blocks_needed`` is
    free; the fast engine calls it, when the cache has it, for a decode step of a windowed cache
    or one without ``grow``.

    Optional: ``use_hash_lookahead(tokens)``, for a prefix cache that identifies blocks by their
    content: identify each block by the ``tokens`` after it too, as vLLM 0.33 hashes blocks for an
    EAGLE drafter (whose KV at a block's last position reads the next token); the engines call it
    once, before anything is cached, when ``[speculative] method = "eagle"``. A cache without it
    keeps its keys.

    Optional, for a cache that settles a scheduling pass at its end (the built-in radix cache
    under SGLang's scheduler): ``deferred_blocks`` (taken beyond the unused blocks, evicted at
    ``end_pass``: neither used nor free until then) and ``lent_blocks`` (in use yet counted free
    until the pass inserts its KV; an allocation cannot take them), both 0 when absent. The pool
    adds up as ``used + deferred + free - lent == num_blocks`` after every call
    (:class:`schedlab.testing.AccountedKV` checks it).
    """

    block_size: int
    num_blocks: int

    def num_free_blocks(self) -> int: ...
    def num_used_blocks(self) -> int: ...

    def cached_tokens(self, seq: SequenceState) -> int:
        """Tokens at the start of ``seq`` whose KV is already cached (full blocks only, from 0 to
        ``num_tokens - 1``). 0 for caches without prefix caching; above 0 only from a cache that
        declares ``prefix_caching = True`` (see above)."""
        ...

    def blocks_needed(self, seq: SequenceState, num_new_tokens: int, *, cached_tokens: int = 0,
                      reserve_tokens: int = 0) -> int:
        """Blocks :meth:`allocate` would take out of the free pool for the same arguments."""
        ...

    def allocate(self, seq: SequenceState, num_new_tokens: int, *, cached_tokens: int = 0,
                 reserve_tokens: int = 0) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``seq`` (after its computed tokens
        and, on admission, after ``cached_tokens`` reused from the prefix cache); with
        ``reserve_tokens``, hold blocks for that many tokens in total. Returns False and
        changes nothing when there are not enough free blocks."""
        ...

    def free(self, seq: SequenceState, *, preempted: bool = False) -> None:
        """Release every block ``seq`` holds (it still shows the counters it had).
        ``preempted``: the sequence will come back, so a prefix cache keeps its blocks
        findable."""
        ...

    def check_invariants(self) -> None:
        """Raise AssertionError if the internal accounting is inconsistent (used by tests)."""
        ...


class Plan(Protocol):
    """The iteration being built; a scheduler reads the state and fills it in.

    Every action takes effect at once (blocks are allocated or freed when called), as in
    vLLM's scheduler, so later decisions in the same call see the result. A plan is the
    scheduler's only within the ``schedule()`` call that gives it: an action on a plan kept for
    a later iteration is refused (:func:`schedlab.engine.plan.close`).

    ``kv`` is the instance's cache to read (free blocks, ``blocks_needed``, ...). The engines
    change it: a third-party scheduler that calls one of its changing methods (``free``,
    ``allocate``, ``swap_out``, ...: :data:`schedlab.engine.plan.KV_CHANGES`) stops the run, naming
    the Plan action to use instead (:func:`schedlab.engine.plan.kv_for`).
    """

    now: float
    kv: KVCache
    waiting: WaitingQueue

    @property
    def running(self) -> "RunningView": ...
    @property
    def prefilling(self) -> list[SequenceState]: ...
    @property
    def swapped(self) -> list[SequenceState]: ...
    @property
    def has_prefilling(self) -> bool: ...
    @property
    def has_swapped(self) -> bool: ...
    @property
    def num_decoding(self) -> int: ...
    @property
    def num_held(self) -> int:
        """Requests preempted while a pipeline's batch in flight holds them: waiting, as vLLM
        counts them, but not in ``waiting`` until those batches land (0 elsewhere)."""
        ...
    @property
    def num_scheduled_tokens(self) -> int: ...
    @property
    def preempted(self) -> list[SequenceState]: ...
    @property
    def admitted(self) -> list[SequenceState]: ...
    @property
    def decode_steps(self) -> int:
        """Decode iterations the instance has run (a clock for lazy per-sequence accounting,
        e.g. service counters that grow with every token)."""
        ...
    @property
    def spec_tokens(self) -> int:
        """Draft tokens a decode verifies in this iteration, at most (speculative decoding), so a
        decode takes up to ``1 + spec_tokens`` tokens of the budget; 0 without speculation.
        Every decode verifies this many unless drafts per batch size give it its own
        (:meth:`drafts_for`)."""
        ...

    def drafts_for(self, seq: SequenceState) -> int:
        """Draft tokens ``seq`` verifies if it decodes in this iteration: with drafts per batch
        size the ``k`` proposed after the batch that last scheduled it (vLLM sets a request's
        drafts, or its placeholders planning ahead, from the batch it was in), else
        ``spec_tokens``."""
        ...
    @property
    def draft_input_slots(self) -> int:
        """Input slots the drafter takes beside each scheduled request's tokens (a draft
        model: 1, vLLM's ``max_num_new_slots_for_drafting``); 0 without speculation."""
        ...
    @property
    def num_scheduled_seqs(self) -> int:
        """Requests with work in this iteration so far (decodes, prompt chunks, overshoots)."""
        ...
    @property
    def admission_padding(self) -> int:
        """The most placeholder drafts :meth:`admit` takes (``padding``): vLLM's ``1 + k`` rows of
        a uniform decode batch; 0 without speculation or with drafts per batch size."""
        ...

    def is_scheduled(self, seq: SequenceState) -> bool:
        """True if ``seq`` already has work in this iteration."""
        ...

    @property
    def made_ahead(self) -> bool:
        """True if this plan is made while the batch before it still runs (the scheduler's
        ``plans_ahead``, :mod:`schedlab.engine.ahead`); False when it is made synchronously."""
        ...

    def token_in_flight(self, seq: SequenceState) -> bool:
        """True if this plan is made ahead while the batch in progress computes a token of
        ``seq`` -- a decode's, or a prompt's last chunk's --, which ``seq`` already counts but
        an engine planning ahead has not seen yet: SGLang's overlap scheduler plans with every
        such request one output token short. A finished sequence still holding its slot
        (:meth:`RunningView.holding`) got its last token so; one whose abort was read as that
        batch started does not count the token it computes there (it is dropped)."""
        ...

    def unseen_finish(self, seq: SequenceState) -> bool:
        """True if this plan is made ahead and ``seq`` -- finished by the batch in progress, still
        holding its slot -- is one an engine planning ahead does not know has finished: it
        stopped at an EOS before its ``max_tokens``, or (speculative decoding) drafts that batch
        accepted took it to its last token. vLLM's asynchronous scheduler skips only a request
        whose first token in flight is its ``max_tokens``-th, and schedules these once more
        (:meth:`overshoot`)."""
        ...

    def overshoot(self, seq: SequenceState, num_tokens: int | None = None) -> bool:
        """In a plan made ahead, decode ``seq`` once more although the batch in progress has
        finished it -- at a stop the engine planning ahead cannot foresee (:meth:`unseen_finish`),
        so SGLang's overlap scheduler keeps it in the next batch and throws the token away, and
        vLLM's asynchronous scheduler schedules it again. It takes a place in the batch (the
        cost model sees one more decode), ``num_tokens`` of the budget (default 1; with
        speculative decoding up to ``1 + drafts_for(seq)``: the drafts vLLM's placeholders stand
        for, verified for nothing) and KV slots for them past the positions the engine thinks
        computed (the batch in progress's drafts counted as accepted) plus the drafter's
        lookahead, released with its blocks once the plan is made; counted in
        ``preemptions.discarded_tokens``. ``seq`` must be a finished sequence still holding its
        slot (:meth:`RunningView.holding`); preempting it withdraws the decode. False, with
        nothing changed, if the slots do not fit."""
        ...

    def decode_all(self) -> bool:
        """Give every decoding sequence its next token this iteration (allocating any new
        blocks). False, with nothing changed, if the cache lacks the blocks. This is the
        fast path: the engine does it for all sequences at once. With speculation each
        decode verifies ``spec_tokens`` drafts: ``1 + spec_tokens`` tokens of the budget, and
        KV slots for them plus the drafter's lookahead (vLLM ``allocate_slots``); after the
        pass the sequence keeps those slots (its ``reserved_tokens``), as vLLM keeps a
        request's blocks, and its next step reuses them."""
        ...

    def decode(self, seq: SequenceState, num_tokens: int | None = None) -> bool:
        """Give one decoding ``seq`` its next token (allocating its block if it needs one);
        False, with nothing changed, if the cache lacks it. Decoding sequences that get no
        token this iteration simply wait (vLLM: the budget ran out before their turn).
        Costs a pass over the running sequences at execution; prefer :meth:`decode_all`
        when everyone decodes. With speculation, ``num_tokens`` (1 to ``1 + drafts_for(seq)``,
        the default) is the verify pass's tokens: fewer cut the drafts short, as vLLM does
        when the token budget runs out."""
        ...

    def admit(self, seq: SequenceState, num_tokens: int, *, reserve: bool = False, reserve_tokens: int = 0,
              padding: int = 0) -> bool:
        """Move a waiting ``seq`` to running and compute ``num_tokens`` of it this iteration
        (after any cached prefix, see :meth:`cached_tokens`). ``reserve``: hold KV for
        ``prompt + max_tokens`` now so the sequence never needs more. ``reserve_tokens``: hold
        exactly that many tokens instead, at least ``prompt + max_tokens - 1`` (the most a request
        ever computes: its last token's KV is never written; TGI's block allocator reserves that)
        -- or, from a scheduler with an ``answer_segment``, at least ``num_tokens +
        answer_segment - 1`` (it :meth:`requeue` s the sequence before it computes more).
        With speculation a reservation also covers the slots a last step's drafts and lookahead
        take (TGI reserves ``speculate`` more). ``padding`` (speculation only, at most
        :attr:`admission_padding`): query tokens the pass computes for nothing beside the last prompt
        token, as vLLM pads a one-token admission to a decode's ``1 + k`` rows with placeholder
        drafts, all rejected; they take budget and KV slots as drafts do. False if it does not fit."""
        ...

    def prefill(self, seq: SequenceState, num_tokens: int) -> bool:
        """Compute the next ``num_tokens`` of a running sequence's unfinished prefill."""
        ...

    def preempt(self, seq: SequenceState, *, discard_in_flight: bool = False) -> None:
        """Recompute preemption: free a running sequence's blocks and put it at the front of
        the waiting queue; it will prefill ``num_tokens`` again (minus cached blocks). If
        ``seq`` was already scheduled in this iteration (a decode or a prefill chunk, not an
        admission or a swap-in), that work is withdrawn and its new blocks freed too, as
        vLLM does when its victim was scheduled earlier in the step. On a pipelined instance
        ``seq`` may be in a batch in flight (from ``running.preemptible()``): the batch still
        brings it its token when it lands (:mod:`schedlab.engine.stages`).

        ``discard_in_flight``: in a plan made ahead, the token the batch in progress computes
        for ``seq`` (:meth:`token_in_flight`) is dropped, to be computed again -- SGLang's
        overlap scheduler skips a retracted request's queued result, where vLLM keeps it. The
        client never got it: if it was the first, the first token comes later; otherwise the
        gap before it is kept as an inter-token sample and the regenerated token's gap is
        counted from it (the gaps still add up to the request's decode time). Counted in
        ``preemptions.discarded_tokens``. A finished sequence still holding its slot
        (:meth:`RunningView.holding`) got its last token so: it is un-finished -- back in the
        queue to compute that token again -- except in a closed loop, whose client the engines
        have told of the finish (its next request is on its way): there it keeps its finish."""
        ...

    def requeue(self, seq: SequenceState) -> None:
        """Free a running sequence's blocks and put it at the *back* of the waiting queue, to be
        prefilled again with its output (minus cached blocks) and go on -- not a preemption but
        a new turn: TGI's router sends a request back after each 1,024 generated tokens. Counted
        in the run's ``requeues``; the sequence is listed in :attr:`preempted` for this
        iteration. Not modelled with asynchronous scheduling or pipeline parallelism."""
        ...

    def reject(self, seq: SequenceState, reason: str) -> None:
        """Turn a waiting ``seq`` away now, as a server whose queue is full does (SGLang's
        ``--max-queued-requests``): it leaves the queue and the run, counted as rejected with
        ``reason``, its row finished at this plan's time. A request preempted earlier -- in this
        plan too -- keeps the tokens it got (its client saw them, then the error). Its client
        hears at once (a closed loop sends its next request). The scheduler calling it knows:
        ``on_finish`` is not called."""
        ...

    def swap_out(self, seq: SequenceState) -> bool:
        """Swap preemption: copy a running decoding sequence's blocks to CPU swap space (the
        copy lengthens this iteration); a decode already scheduled for it is withdrawn.
        False, with nothing changed, if swap space is full."""
        ...

    def swap_in(self, seq: SequenceState) -> bool:
        """Bring a swapped sequence back (it decodes in this iteration). False if it does not fit."""
        ...

    def skip_decode(self) -> None:
        """Decodes do not run this iteration (prefill-first engines: vLLM V0, SGLang)."""
        ...

    def wake_at(self, time_ms: float) -> None:
        """Ask to be called again at the first iteration boundary at or after ``time_ms``
        even if nothing else happens (batching windows)."""
        ...

    def wake_after(self, decode_steps: int) -> None:
        """Ask to be called again after at most ``decode_steps`` decode iterations, this one
        included, even if nothing else happens (decisions that count decode steps, such as
        TGI's ``max_waiting_tokens`` and its answer segments); 0: at the next iteration, whatever
        it is (a sequence this one prefills will have to be looked at when it decodes)."""
        ...

    def cached_tokens(self, seq: SequenceState) -> int:
        """Prefix-cache hit for a waiting ``seq``, in tokens (what :meth:`admit` will reuse)."""
        ...


class RunningView(Protocol):
    """Running sequences in admission order (read only)."""

    def __iter__(self) -> Iterator[SequenceState]: ...
    def __reversed__(self) -> Iterator[SequenceState]: ...
    def __len__(self) -> int: ...
    def __contains__(self, seq: object) -> bool: ...


@runtime_checkable
class Scheduler(Protocol):
    """Decides each iteration. See :class:`Plan` for what it can do.

    Optional members: ``stable_between_events`` (see the module docstring),
    ``new_waiting_queue()`` (the order of waiting requests; FCFS when absent),
    ``rejection_reason(request, kv)`` (a request this scheduler can never serve, or None),
    ``kv_problem(kv)`` (why the scheduler's settings can never work with this KV cache, or None:
    the run is refused when built, e.g. chunks smaller than a block), ``start_up_problem(kv)`` (why
    the real engine would refuse to start with this KV cache, or None: the run is simulated all the
    same, but a capacity plan counts the deployment infeasible), ``limit_request(request, kv)``
    (the request as served, e.g. its ``max_tokens`` cut to the context or the memory left; the
    engines call it on arrival, before ``rejection_reason``), ``on_finish(seq, plan_now)``
    (called when a sequence finishes; on a disaggregated prefill instance, when the decode side has pulled its KV and its blocks are free; also when the
    engine aborts a sequence whose client gave up, its status then ``"aborted"``: a scheduler
    that keeps sequences of its own must forget it), ``slots`` (most
    running sequences; a disaggregated decode instance lets no more join),
    ``kv_reservation(request[, kv])`` (KV tokens held from admission, 0 when grown as computed; a
    disaggregated decode instance reserves as much when it pulls a request's KV, passing its cache
    as ``kv`` when the method takes one) and
    ``max_in_flight`` (the most requests the instance holds, waiting or running, at once: the
    engines refuse an arrival beyond it, "Model is overloaded", as TGI's router does -- a request
    whose last iteration is still running at the arrival counts; :mod:`schedlab.engine.admission`),
    ``answer_segment`` (new tokens a sequence gets per admission: the scheduler
    :meth:`Plan.requeue` s it when it has them, so its reservation may stop there; TGI's
    segments), ``use_speculative_slack(slack_for)`` (with ``[speculative]``, called once at
    construction: ``slack_for(request)`` is the KV slots a step of it holds past its tokens,
    its drafts' and lookahead, for a scheduler that plans a request's later parts in
    ``limit_request``), ``pull_headroom(running, pending, block_size)`` (blocks a disaggregated decode instance
    keeps free when it pulls, given its running sequences and the requests already being
    received), ``plans_ahead`` (each batch is planned while the one before it runs, as vLLM's
    asynchronous and SGLang's overlap scheduling do: :mod:`schedlab.engine.ahead`) and
    ``overshoots`` (with ``plans_ahead``: the engines ask at every plan made beside a finished
    request still holding its slot, which the scheduler may decode once more,
    :meth:`Plan.overshoot`; with ``reads_held = False`` too, only beside one that stopped at an
    EOS, ``Request.stops_at_eos``: the scheduler ignores the others, as vLLM's does), and
    ``aborts_run_once_more`` (a running request whose client's abort the engine reads at a plan
    keeps its slot and blocks until the next iteration that computes it, which gives it no
    token, as SGLang's ``to_finish`` does; by default an abort drops it at once, and one that
    comes while an iteration computes it drops that iteration's output, as vLLM's engine core
    does), and ``stall_hint`` (after a plan: why it left a waiting request out that nothing else
    will let in, or None; a run that stalls says it). A request that joins a disaggregated
    decode instance enters its running set decoding, without ``Plan.admit``.
    """

    def schedule(self, plan: Plan) -> None: ...


@runtime_checkable
class Workload(Protocol):
    """Produces the requests of a run.

    ``requests(seed)`` yields :class:`schedlab.Request` objects in arrival order (ids 0, 1, 2, ...,
    arrival times never going back); a run refuses anything else as it reads them. A closed-loop
    workload also has ``closed_loop = True`` and ``on_finish(request, now_ms)``, which returns
    the requests that this completion releases (a client's next request).
    """

    def requests(self, seed: int) -> Iterable["Request"]: ...


@runtime_checkable
class Router(Protocol):
    """Chooses the instance for each arriving request (several-instance runs).

    ``route`` returns an index into ``instances``: views of the instances
    (:class:`schedlab.engine.load.InstanceView`) as they are at the request's arrival -- an
    iteration in progress still holds its requests and their KV blocks. Each exposes ``index``,
    ``outstanding`` (queued, swapped out or in service), ``waiting`` and ``running`` (counts),
    ``in_iteration`` and ``kv``, a gauge with ``num_used_blocks()``, ``num_free_blocks()``,
    ``num_blocks``, ``block_size`` and ``usage`` (other attributes are the cache's own, e.g. a
    prefix lookup); every read is O(1). That is all a router may read of the instances. The list
    is a :class:`schedlab.engine.pool.ViewPool`: ``instances.least_by(key, members=None)`` returns
    the position of the least view by ``key(view, position)`` (a key that does not decrease as
    KV use grows, e.g. :func:`~schedlab.engine.pool.outstanding_key`) in O(log N), from an index
    the engine keeps up to date. ``instances.now`` is the time the router is asked at: the
    request's arrival, or for a disaggregated cluster's decode pool its prompt's handoff -- a
    router keeping a clock of its own reads it through :func:`schedlab.engine.pool.routing_time`,
    not ``request.arrival_ms``. ``route`` should cost O(1) or O(log N). Optional:
    ``check_cluster(n)``, called when the run is assembled, to reject settings that do not fit a
    cluster of ``n`` (a :class:`~schedlab.errors.ConfigError`; the caller puts the file and the
    table in front of its message). Optional: ``names_instances = True`` for a router whose
    settings name instances by number (``class``): under an autoscaler ``instances`` is the
    serving instances, a list that changes and is renumbered as they come and go, so such a
    router is refused there when the file is read (``vllm_dp`` keys its load snapshot by
    ``index``, and reads it again when the list changes). Optional: ``partition(request, order,
    n) -> int`` for a router whose choice depends only on the request and its arrival order
    (``order``: 0, 1, ...), never on load: the position it picks among ``n``, so that a run can
    be split into independent per-instance simulations (see :mod:`schedlab.study.partition`)."""

    def route(self, request: "Request", instances: list[Any]) -> int: ...


@runtime_checkable
class PowerModel(Protocol):
    """The power an instance's GPUs draw (all of them, in watts; energies in joules).

    The engines call it at each iteration (an :class:`schedlab.energy.EnergyMeter` does, only
    when a run has a ``[power]`` table) and integrate the idle stretches between iterations
    themselves from three numbers: after an iteration the GPUs draw ``standby_w`` for
    ``standby_ms`` (clocks still up, as NVIDIA's driver keeps them), then ``idle_w`` -- and,
    with the optional ``tail_ms``, the last iteration's power above standby fading with that
    time constant (:mod:`schedlab.energy.idle`).

    Optional members: ``run_j`` (closed form over a bulk decode run: without it the meter
    sums ``iteration_j`` over the run's iterations, exact but one call per iteration), and
    ``run_j_peak`` (``run_j`` and the run's highest power in W at once, saving the meter two
    ``iteration_j`` calls per run);
    ``host_idle_w`` (the host's CPU, DRAM and NIC, drawn all the time), ``host_busy_w`` (more
    while iterations run) and ``pue`` (facility energy = IT energy x pue); ``standby_after(batch)``,
    the standby power after an iteration of ``batch``'s shape when it differs from ``standby_w``
    (None: ``standby_w``; the SLO governor's GPU stands by at its last iteration's clock);
    ``describe()``, a
    dict of its settings for the results. Every energy, power and time it gives is a finite
    number >= 0 (``pue`` >= 1): the meters refuse anything else, naming the method.
    """

    idle_w: float
    standby_w: float
    standby_ms: float

    def iteration_j(self, batch: Batch, duration_ms: float) -> float:
        """Energy of one iteration of shape ``batch`` lasting ``duration_ms`` (> 0)."""
        ...

    def run_j(self, batch: Batch, k: int, d0: float, inc: float) -> float:
        """Energy of ``k`` decode-only iterations: iteration ``j`` has ``batch``'s shape with
        ``j * num_decode`` more context tokens (the longest and shortest context ``j`` more) and
        lasts ``d0 + j * inc`` ms. Must equal the sum of :meth:`iteration_j` over them."""
        ...


@runtime_checkable
class Autoscaler(Protocol):
    """Decides how many instances of a colocated cluster should serve (``[cluster] autoscaler``).

    ``decide(signals)`` is called every ``interval_s`` with :class:`schedlab.engine.scaling.Signals`
    and returns the number of instances that should serve or be warming, an int >= 0 (anything else
    -- a float, text, None -- is refused); the engine clamps it to
    ``[min_instances, max_instances]``, warms the new ones for ``cold_start_s`` and drains the ones
    it removes (every request they hold finishes, or is aborted ``drain_timeout_s`` after the drain
    began if that is set). Its config (``.config``) has the keys of
    ``schedlab_plugins.autoscalers.ScalingConfig``."""

    def decide(self, signals: Any) -> int: ...


@runtime_checkable
class Report(Protocol):
    """Writes files from an experiment's results (``results`` is a :class:`schedlab.results.ExperimentResults`);
    ``write`` returns the list of files it wrote (``[]`` for none; anything else is refused)."""

    def write(self, results: Any, out_dir: Any) -> list[Any]: ...
