"""Disaggregated serving: what moves a prompt's KV cache from a prefill instance to a decode instance.

Both engines use these records; each runs the flow itself (the fast engine in
:mod:`schedlab.engine.disagg`, the reference engine in :mod:`schedlab.engine.reference_cluster`).

The flow follows vLLM 0.33's P/D serving with the NIXL connector (pull mode:
``vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py``) behind its P/D proxy
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``). Where the client's first token
comes from is a setting (``[cluster] first_token``, :data:`FIRST_TOKEN`):

* ``"decode"`` (the default, vLLM's proxy): the proxy sends the prefill instance a copy of the
  request with ``max_tokens = 1`` and discards its token; the decode instance receives the
  client's request, pulls the KV and sets ``num_computed_tokens = prompt - 1``
  (``scheduler.py``, ``_update_waiting_for_remote_kv``): it recomputes the last prompt token in
  an ordinary one-token step, which samples the client's first token, and then generates the
  rest -- all ``max_tokens`` tokens. The client's TTFT is that step's end: the prefill queue and
  prompt, the wait for decode capacity, the transfer, the wait for a running slot and the step.
  With speculative decoding that step verifies no drafts of the request (the prefill side's are
  not transferred): only the placeholder rows vLLM pads a one-token admission with
  (``pad_spec_decode``: ``1 + k`` rows, none accepted; not with drafts per batch size). A
  one-token answer goes to the decode pool too (a pull and one step).
* ``"prefill"`` (DistServe, OSDI'24): the prefill instance's token is the client's first; the
  decode instance continues from the second token, and a one-token answer finishes on the
  prefill instance and moves nothing.

1. A prefill instance serves the request as vLLM's P/D proxy sends it there: ``max_tokens = 1``.
   Its iteration that completes the prompt hands the request over (``ready_ms``). The request
   then leaves the prefill instance's running set, but its KV blocks stay allocated until the
   decode side has read them (vLLM: ``request_finished`` returns ``delay_free_blocks = True``
   for a request with ``do_remote_decode``).
2. The decode router picks a decode instance at that moment. The request waits there until
   the decode side has room: at an iteration boundary, after its scheduler has planned, with
   nothing preempted and nothing of its own waiting or swapped, and fewer running requests
   than its scheduler's ``slots`` (vLLM's waiting loop, where a remote-prefill request is
   admitted: ``scheduler.py``, ``load_kv_async``), the decode instance allocates the blocks for
   the prompt -- less what its own prefix cache already holds (vLLM asks the connector with
   the local hit; a hit found in a host-memory tier is reloaded beside the pull, and the later
   of the two lands the KV) -- plus the reservation its scheduler makes for every request
   (``kv_reservation``), keeping free what its scheduler asks (``pull_headroom``: SGLang's
   decode server pre-allocates only beyond reserved decode tokens). A full decode pool
   therefore pushes back: prefill instances keep finished prompts' blocks and, when those fill
   their caches, admit fewer new prompts.
3. The transfer then runs over the link between the two instances (:class:`KVLink`). It moves
   whole blocks, as NIXL exchanges block ids (``update_state_after_alloc``, ``remote_block_ids``):
   the prompt's blocks the decode side does not hold already (:func:`tokens_moved`). When it has
   landed, the prefill instance frees its blocks (vLLM: the NIXL notification) and tells its
   scheduler the request has finished (``on_finish``), and the request joins the decode
   instance's running set at its next iteration boundary, as soon as fewer than ``slots``
   requests run (vLLM: ``WAITING_FOR_REMOTE_KVS`` -> ``WAITING`` -> admitted): with
   ``first_token = "decode"`` with the prompt but its last token computed and no token
   generated, its first step the recompute of that token; with ``"prefill"`` with the prompt
   computed and its first token generated. It never decodes before its KV has landed.

4. A client that gives up (``[client] timeout_ms``, :mod:`schedlab.frontend`) is heard of
   ``network_ms`` after its deadline by the instance that holds its request, at that
   instance's next iteration boundary (vLLM's engine core reads aborts between steps; the
   router in front passes the disconnect on). On the prefill instance the request is aborted
   as on any instance; one whose client left during its last step is aborted after that step,
   before its output (no token), and its blocks are freed then: NixlConnector's
   ``request_finished`` keeps a prompt's blocks for the decode side only when it finished
   ``FINISHED_LENGTH_CAPPED`` (``nixl/pull_scheduler.py``; an aborted one is freed at once). On
   the decode instance a request still waiting for blocks is dropped, and the prefill side is
   told to free its blocks, at once (vLLM's ``request_finished`` queues an empty read whose
   notification frees them). Behind a proxy that does not pass the disconnect on
   (``prefill_hears_disconnect = False``) the prefill instance computes every prompt to its end;
   the proxy drops one whose client has left, and its blocks stay until the lease NixlConnector
   gave them runs out (``kv_lease_ms``: vLLM's ``kv_lease_duration``, 30 s, renewed by the decode
   side's heartbeats only for requests it holds). On the decode instance, one being pulled
   keeps its blocks here until the transfer lands, and they are freed then (vLLM frees a finished request's blocks when its ``finished_recving`` comes in:
   ``scheduler.py``, ``_update_from_kv_xfer_finished``); one landed and not yet running frees
   them at once; a running one is aborted as on any instance. The decode side's scheduler,
   which never held a request before it ran, is not told of the first three. Aborts are read
   before the boundary's landings and pulls (vLLM reads its input queue before it schedules):
   a slot an abort frees is taken at the same boundary.

A request that can never fit one pool's cache is turned away on arrival, its reason naming the
pool (``"decode pool: ..."``) and its row the instance that would have served it there (the
decode pool's first: its instances are alike).

With ``first_token = "decode"`` the decode side holds the prompt's blocks from the pull, as
vLLM's does, while the recompute of the last prompt token is still to come: a sequence whose
last prompt token opens a block keeps that block's slot as a reservation until its first step
(``Transfer.lifted``), then grows as any decode does.
"""

from __future__ import annotations

import inspect
import math

import attrs

INF = math.inf

#: How long a prefill instance keeps the KV of a finished prompt nobody pulls: vLLM 0.33's
#: NixlConnector ``kv_lease_duration`` default (``kv_connector_extra_config``), seconds -> ms.
KV_LEASE_MS = 30_000.0

#: ``[cluster] first_token``: which pool samples the client's first token (see the module doc):
#: ``"decode"`` -- vLLM's P/D proxy, the default -- or ``"prefill"`` (DistServe).
FIRST_TOKEN = ("decode", "prefill")


def abort_heard_ms(request, hangup_ms: float) -> float:
    """When the engine hears that the client of ``request`` (one with a ``timeout_ms``) gave up."""
    return request.sent_at + request.timeout_ms + hangup_ms


def kv_bytes_per_token(kv) -> tuple[float, int]:
    """``(bytes one token's KV takes on each rank, ranks)`` of a KV cache plugin.

    ``bytes_per_block`` is per tensor-parallel rank (vLLM sizes every rank's pool alike); a
    cache without it but sized from presets (``sizing``) takes the model's bytes per token. A
    cache sized from presets knows its ``tensor_parallel``, otherwise one rank is assumed.
    """
    per_block = getattr(kv, "bytes_per_block", 0) or 0
    sizing = getattr(kv, "sizing", None)
    ranks = sizing.tensor_parallel if sizing is not None else 1
    if not per_block and sizing is not None:
        return float(sizing.bytes_per_token), ranks
    return per_block / kv.block_size, ranks


def pull_keywords(kv) -> dict:
    """What a decode instance's ``allocate``/``blocks_needed`` of a pulled prompt add: that the KV
    arrives computed (``received``), to a cache with sliding-window layers or whose ``allocate``
    takes it: their window slid already -- vLLM's ``allocate_external_computed_blocks`` leaves the
    blocks before the next token's window null --, and a prefix cache's host tier does not load
    the last block of a whole-block prompt to compute its last token again."""
    if getattr(kv, "window", None) is not None or _takes(type(kv), "allocate", "received"):
        return {"received": True}
    return {}


_TAKES: dict = {}


def _takes(cls, method: str, parameter: str) -> bool:
    """Whether ``cls``'s ``method`` has a parameter named ``parameter`` (a plugin's may not:
    ``allocate``'s ``received``, ``kv_reservation``'s ``kv``); known once per class."""
    key = (cls, method, parameter)
    known = _TAKES.get(key)
    if known is None:
        try:
            known = parameter in inspect.signature(getattr(cls, method)).parameters
        except (AttributeError, TypeError, ValueError):
            known = False
        _TAKES[key] = known
    return known


def pulled_hit(kv, prompt: int, hit: int) -> int:
    """A decode instance's local hit for a pulled ``prompt``: at most the whole blocks before its
    last, which comes over the link (where the prompt is computed, a prefix cache with a host tier
    finds a whole-block prompt's last block there and computes its last token again: a decode
    instance pulled that block and loaded it too, review s80 diff)."""
    most = (prompt - 1) // kv.block_size * kv.block_size
    return hit if hit <= most else most


def tokens_moved(kv, prompt: int, hit: int) -> int:
    """The tokens' worth of KV a pull of a ``prompt``-token request moves to a decode instance whose
    prefix cache holds ``hit`` of them, in whole blocks (NIXL reads blocks by id: a prompt's last,
    partly filled block moves whole): the prompt's blocks past the ``hit // block_size`` the decode
    side holds and, with sliding-window layers, the window blocks it keeps for them (each
    ``block_size`` tokens of one group's layers)."""
    bs = kv.block_size
    blocks = -(-prompt // bs) - hit // bs
    window = getattr(kv, "window", None)
    if window is not None:
        blocks += window.held(prompt, prompt)
    return blocks * bs


class KVLink:
    """The link from one prefill instance to one decode instance.

    Each rank of the decode instance reads its KV heads from the prefill instance's ranks in
    parallel (NIXL: one transfer per rank pair), each GPU over its own ``bandwidth_gbps``
    (GB/s, one direction), so a transfer of ``n`` tokens (whole blocks': :func:`tokens_moved`) takes
    ``n x max(sender bytes per token per rank, receiver bytes per token per rank) / bandwidth``
    -- the more heavily loaded side of a tensor-parallel mismatch sets the pace -- and arrives
    ``latency_ms`` after its last byte left. Transfers over one link go one at a time, in the
    order the decode side starts them; different links do not share bandwidth.
    """

    __slots__ = ("bandwidth_gbps", "latency_ms", "per_rank_bytes", "receiver_bytes", "receiver_ranks", "free_at")

    def __init__(self, bandwidth_gbps: float, latency_ms: float, *, sender_bytes_per_token: float,
                 receiver_bytes_per_token: float, receiver_ranks: int = 1):
        self.bandwidth_gbps = bandwidth_gbps
        self.latency_ms = latency_ms
        self.per_rank_bytes = max(sender_bytes_per_token, receiver_bytes_per_token)
        self.receiver_bytes = receiver_bytes_per_token
        self.receiver_ranks = receiver_ranks
        self.free_at = 0.0

    def busy_ms(self, tokens: int) -> float:
        """How long ``tokens`` tokens' KV occupy the link."""
        if self.bandwidth_gbps == INF:
            return 0.0
        return tokens * self.per_rank_bytes / (self.bandwidth_gbps * 1e9) * 1e3

    def bytes_moved(self, tokens: int) -> int:
        """Bytes the decode instance receives, summed over its ranks."""
        return int(round(tokens * self.receiver_bytes * self.receiver_ranks))

    def start(self, now: float, tokens: int) -> float:
        """Queue a transfer of ``tokens`` tokens at ``now``; returns when it lands."""
        begin = now if now > self.free_at else self.free_at
        self.free_at = begin + self.busy_ms(tokens)
        return self.free_at + self.latency_ms


class Transfer:
    """One request's passage from a prefill instance to a decode instance.

    Times are -1 until they happen. ``seq_no`` (the request's arrival order) orders handoffs,
    pulls and landings that fall on the same instant, identically in both engines.
    """

    __slots__ = ("request", "seq_no", "prefill_index", "prefill_seq", "decode_index", "decode_seq", "ready_ms",
                 "tokens", "bytes", "pulled_ms", "landed_ms", "joined_ms", "abandoned", "reserve", "lifted")

    def __init__(self, request, seq_no: int, prefill_index: int, prefill_seq):
        self.request = request          # the client's request (the prefill instance sees max_tokens = 1)
        self.seq_no = seq_no
        self.prefill_index = prefill_index
        self.prefill_seq = prefill_seq
        self.decode_index = -1
        self.decode_seq = None
        self.ready_ms = -1.0            # handed over: the prompt's KV is complete on the prefill side
        self.tokens = 0                 # tokens whose KV moves (the prompt less the decode side's prefix hit)
        self.bytes = 0
        self.pulled_ms = -1.0           # decode side allocated the blocks and started the transfer
        self.landed_ms = -1.0
        self.joined_ms = -1.0           # joined the decode instance's running set
        self.abandoned = False          # its client gave up while the KV was on its way
        self.reserve = 0                # the decode side's reservation for it (its scheduler's kv_reservation)
        # first_token = "decode": its last prompt token opens a block, whose slot it holds as a
        # reservation from the pull to its first step (the recompute of that token), see the module doc
        self.lifted = False

    def row(self) -> tuple:
        """The recorder's per-request columns (see ``NO_TRANSFER``)."""
        return (self.prefill_index, self.bytes, self.ready_ms, self.pulled_ms, self.landed_ms, self.joined_ms)


# What a request's decode-side sequence takes over from its prefill-side one (both engines'
# sequences name these alike): its history so far, for the per-request columns.
# (taken_ms: the prefill instance took it from its queue, engine.taking)
CARRIED_OVER = ("taken_ms", "first_scheduled_ms", "waiting_ms", "num_preemptions", "recomputed_tokens",
                "prefill_chunks", "cached_tokens_total", "num_swaps", "energy_j")


def carry_over(prefill_seq, decode_seq) -> None:
    """Copy the prefill side's per-request history (``CARRIED_OVER``) onto the decode side."""
    for name in CARRIED_OVER:
        setattr(decode_seq, name, getattr(prefill_seq, name))


def pulled_counters(tr: Transfer, prompt: int, reserve: int, block_size: int, first_token: str) -> tuple[int, int]:
    """``(computed tokens, reserved tokens)`` of a decode-side sequence whose pull has just taken
    the blocks of its ``prompt`` (and its scheduler's ``reserve``): with ``first_token =
    "prefill"`` the prompt computed; with ``"decode"`` all but its last token, which its first step
    recomputes (vLLM's ``_update_waiting_for_remote_kv``), the slot of that token kept as a
    reservation when it opens a block (``tr.lifted``). Notes the reservation on ``tr``."""
    tr.reserve = reserve
    if first_token == "prefill":
        return prompt, reserve
    computed = prompt - 1
    tr.lifted = reserve < prompt and computed % block_size == 0  # (the block its last token opens)
    return computed, prompt if tr.lifted else reserve


def pool_reason(pool: str, reason: str | None) -> str | None:
    """A rejection ``reason`` of one pool's cache, naming the pool (``"decode pool: needs ..."``)."""
    return f"{pool} pool: {reason}" if reason else None


def first_step_done(seq, spec) -> bool:
    """``first_token = "decode"``: after the decode step that sampled ``seq``'s first token on a
    decode instance, whether its reservation of the last prompt token's slot (``Transfer.lifted``)
    goes back to its scheduler's: without speculation, whose steps keep their slots as a
    reservation of their own. Both engines call it."""
    tr = seq.transfer
    if tr is None or not tr.lifted:
        return False
    tr.lifted = False
    return spec is None


def prefill_request(request, hears_disconnect: bool = True):
    """The request as the prefill pool sees it: the same prompt, one token to generate
    (vLLM's P/D proxy sends the prefill instance ``max_tokens = 1``); with a proxy that does not
    pass a client's disconnect on (``hears_disconnect`` False), no timeout: the prefill instance
    never aborts it (rule 4)."""
    if not hears_disconnect and request.timeout_ms is not None:
        request = attrs.evolve(request, timeout_ms=None)
    if request.target_tokens == 1 and request.max_output_tokens == 1:
        return request
    return attrs.evolve(request, output_tokens=1, max_tokens=1)


def kv_reservation(scheduler, request, kv=None) -> int:
    """Tokens of KV ``scheduler`` holds for ``request`` from admission (0: grown as computed), on
    ``kv`` when its ``kv_reservation`` takes a ``kv`` (a reservation that depends on the context the
    cache serves: a decode instance's scheduler has seen no other cache of its own when it pulls
    its first request; without it every decode instance but the first reserved the model's whole
    context, or TGI's answer alone: review s81 diffuzz, finding 1)."""
    reserve = getattr(scheduler, "kv_reservation", None)
    if reserve is None:
        return 0
    return reserve(request, kv) if kv is not None and _takes(type(scheduler), "kv_reservation", "kv") \
        else reserve(request)


def pull_reservation(scheduler, request, spec, longest: int, kv=None) -> int:
    """Tokens of KV a decode instance holds for ``request`` when it pulls its prompt's KV, as an
    admission there would (``Plan.admit``): its scheduler's :func:`kv_reservation` and, when that
    is one and the instance speculates, the last step's drafts and lookahead slots
    (``spec.slack_for``), no further than ``longest`` (max_model_len; 0: no limit). Without the slack
    a reserving scheduler (static, TGI), which never preempts, stalled once its requests grew into
    slots they never reserved (review specdisagg, finding 1). A pull itself takes no lookahead
    slot (vLLM allocates none for remote KV). ``kv``: the decode instance's cache."""
    reserve = kv_reservation(scheduler, request, kv)
    if reserve and spec is not None:
        reserve += spec.slack_for(request)
        if longest and reserve > longest:
            reserve = max(longest, request.prompt_tokens)
    return reserve


def held_hint(used: int, held: int, transfers) -> str:
    """The stall hint of a prefill instance whose ``used`` blocks belong to ``held`` prompts it
    handed on, not yet freed (``transfers``: those still waiting to be pulled): the decode side
    has not pulled their KV, so that is where to look, not this cache (no leak)."""
    waiting = list(transfers)
    on = sorted({tr.decode_index for tr in waiting if tr.decode_index >= 0})
    where = (f"decode instance{'s' if len(on) > 1 else ''} {', '.join(map(str, on))}" if on
             else "the decode pool")
    return (f"; its {used} used KV blocks belong to {held} prompt{'s' if held != 1 else ''} handed on to the decode "
            f"pool, kept until pulled ({len(waiting)} waiting for {where} to pull them): the decode side is not "
            "taking them -- look there, not at this cache")
