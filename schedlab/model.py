"""The request record every workload produces and every engine consumes.

A :class:`Request` is what a client sends: when, how long its prompt is, and how many tokens
it will generate. It never changes during a run; all progress lives in the engine's sequence
state (see :mod:`schedlab.engine.sequence`). Token-level state stays implicit: a sequence's
progress is a pair of counters, never one object per token.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Iterator

import attrs

from .configs import MAX_REQUESTS, MAX_TIME_MS, MAX_TOKENS, bound_text
from .errors import WorkloadError


def _whole(value) -> bool:
    """An int (numpy's too), not a bool or a float, however whole."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_request(req: "Request") -> None:
    for name in ("prompt_tokens", "output_tokens", "max_tokens", "prefix_tokens", "hash_block_tokens", "priority"):
        value = getattr(req, name)
        if value is not None and not _whole(value):  # (50.5 tokens crashed one engine and ran on the other)
            raise WorkloadError(f"request {req.id}: {name} must be a whole number (an int), got {_shown(value)} "
                                f"(a {type(value).__name__})")
    for name in ("prompt_tokens", "output_tokens", "max_tokens"):
        value = getattr(req, name)
        if value is not None and not 1 <= value <= MAX_TOKENS:
            raise WorkloadError(f"request {req.id}: {name} must be from 1 to {bound_text(MAX_TOKENS)}, got {value}")
    for name in ("client", "request_class"):
        value = getattr(req, name)
        if not isinstance(value, str):
            raise WorkloadError(f"request {req.id}: {name} must be text, got {_shown(value)} "
                                f"(a {type(value).__name__})")
    if req.block_hashes is not None and not isinstance(req.block_hashes, tuple):
        raise WorkloadError(f"request {req.id}: block_hashes must be a tuple of hash ids, got "
                            f"{_shown(req.block_hashes)} (a {type(req.block_hashes).__name__})")
    for name in ("prefix_group", "block_hashes"):
        try:
            hash(getattr(req, name))
        except TypeError:  # (a list: a prefix cache keys on it)
            raise WorkloadError(f"request {req.id}: {name} must be hashable (a str, an int or a tuple of them), got "
                                f"{_shown(getattr(req, name))}") from None
    if not 0.0 <= req.arrival_ms <= MAX_TIME_MS:  # also rejects NaN
        raise WorkloadError(f"request {req.id}: arrival_ms must be from 0 to {MAX_TIME_MS:g} (about 31.7 years), "
                            f"got {req.arrival_ms:g}")
    if req.prefix_tokens < 0 or req.prefix_tokens > req.prompt_tokens:
        raise WorkloadError(
            f"request {req.id}: prefix_tokens must be between 0 and prompt_tokens "
            f"({req.prompt_tokens}), got {req.prefix_tokens}"
        )
    if req.block_hashes is not None and req.hash_block_tokens < 1:
        raise WorkloadError(f"request {req.id}: hash_block_tokens must be >= 1")
    if req.sent_ms is not None and not 0.0 <= req.sent_ms <= req.arrival_ms:  # also rejects NaN
        raise WorkloadError(f"request {req.id}: sent_ms must be from 0 to arrival_ms ({req.arrival_ms:g}), "
                            f"got {req.sent_ms:g}")
    if req.due_ms is not None and not 0.0 <= req.due_ms <= req.sent_at:  # also rejects NaN
        raise WorkloadError(f"request {req.id}: due_ms must be from 0 to when it was sent ({req.sent_at:g}), "
                            f"got {req.due_ms:g}")
    if req.timeout_ms is not None and not req.timeout_ms > 0.0:  # also rejects NaN
        raise WorkloadError(f"request {req.id}: timeout_ms must be > 0 (leave it out for none), got {req.timeout_ms:g}")


@attrs.frozen(slots=True)
class Request:
    """One inference request.

    Sizes are bounded (:mod:`schedlab.configs`): token counts from 1 to ``MAX_TOKENS``
    (10**8), arrival times from 0 to ``MAX_TIME_MS`` (10**12 ms, about 31.7 years).

    :ivar id: index of the request in its workload, unique within a run (0, 1, 2, ...).
    :ivar arrival_ms: when the request reaches the server, in ms from the start of the run.
    :ivar prompt_tokens: prompt length in tokens (>= 1).
    :ivar output_tokens: how many tokens the model would generate if not cut off.
    :ivar max_tokens: the client's length limit (``max_tokens`` in the OpenAI API); the request
        finishes at ``min(output_tokens, max_tokens)`` tokens. It is the only length a server
        knows in advance, so reservation policies reserve ``prompt + max_tokens``.
        ``None`` means "the same as output_tokens".
    :ivar priority: lower value = more important (vLLM's convention).
    :ivar client: who sent it (token-fair scheduling, per-client metrics).
    :ivar request_class: a service class such as ``interactive`` or ``batch`` (per-class metrics).
    :ivar prefix_group: requests in the same group share their first ``prefix_tokens`` tokens
        (a system prompt); ``None`` for no declared sharing.
    :ivar block_hashes: prefix hash ids, one per ``hash_block_tokens`` tokens of the prompt,
        each naming the whole prefix up to the end of its block (the Mooncake trace format).
    :ivar sent_ms: when the client sent it, when that is earlier than ``arrival_ms`` (the
        network and the API server's front end lie in between, see :mod:`schedlab.frontend`);
        ``None``: at ``arrival_ms``.
    :ivar due_ms: when the client meant to send it, when that is earlier than sending it: a
        client capped at ``max_concurrency`` requests in flight holds a due request until a slot
        frees (``vllm bench serve``'s ``client_queue_time``, :mod:`schedlab_plugins.workloads.capped`);
        ``None``: when it was sent.
    :ivar timeout_ms: the client abandons the request this long after sending it unless its
        last token has arrived by then; the engine then aborts it (``None``: never).
    """

    id: int
    arrival_ms: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None
    priority: int = 0
    client: str = "default"
    request_class: str = "default"
    prefix_group: Any = None
    prefix_tokens: int = 0
    block_hashes: tuple | None = None
    hash_block_tokens: int = 512
    sent_ms: float | None = None
    timeout_ms: float | None = None
    due_ms: float | None = None

    def __attrs_post_init__(self) -> None:
        _check_request(self)

    @property
    def target_tokens(self) -> int:
        """Tokens the request will actually generate: its output, cut at ``max_tokens``."""
        if self.max_tokens is None:
            return self.output_tokens
        return min(self.output_tokens, self.max_tokens)

    @property
    def sent_at(self) -> float:
        """When the client sent the request (``arrival_ms`` unless ``sent_ms`` says earlier)."""
        return self.arrival_ms if self.sent_ms is None else self.sent_ms

    @property
    def due_at(self) -> float:
        """When the client meant to send the request (when it sent it unless ``due_ms`` says earlier)."""
        return self.sent_at if self.due_ms is None else self.due_ms

    @property
    def max_output_tokens(self) -> int:
        """The output length a server may assume in advance (``max_tokens`` or, if unset, the output)."""
        return self.output_tokens if self.max_tokens is None else self.max_tokens

    @property
    def shared_prefix_tokens(self) -> int:
        """Tokens at the prompt's start that other requests may share (its ``block_hashes``,
        its ``prefix_group``'s ``prefix_tokens``); 0 without declared sharing. A prefix cache
        may share only blocks that end within them: every later token is the request's own."""
        shared = 0
        if self.block_hashes is not None:
            shared = min(self.prompt_tokens, len(self.block_hashes) * self.hash_block_tokens)
        if self.prefix_group is not None and self.prefix_tokens > shared:
            shared = self.prefix_tokens
        return shared

    @property
    def stops_at_eos(self) -> bool:
        """True if the request stops at an EOS before its ``max_tokens``: no server foresees
        that, so one planning ahead may decode it once more (``Plan.overshoot``)."""
        return self.max_tokens is not None and self.output_tokens < self.max_tokens


def checked_requests(requests: Iterable, who: str) -> Iterator[Request]:
    """``requests`` one at a time as they are consumed, each checked against the Workload protocol:
    a :class:`Request`, ids 0, 1, 2, ... and arrival times that never go back; else
    :class:`WorkloadError` naming ``who`` (``"workload 'x'"``). Both engines read a run's requests
    through it: out-of-order arrivals make them disagree, repeated ids repeat rows of the results."""
    try:
        requests = iter(requests)
    except TypeError:  # (a forgotten return: enumerate(None) failed with a traceback)
        raise WorkloadError(f"{who}: requests(seed) returned {_shown(requests)} (a {type(requests).__name__}); it "
                            "returns or yields the run's schedlab.Request objects") from None
    previous = None
    for expected, request in enumerate(_naming(requests, who)):
        if expected >= MAX_REQUESTS:
            raise _too_many(who)
        if not isinstance(request, Request):
            raise WorkloadError(f"{who} yielded {_shown(request)} (a {type(request).__name__}) as its request "
                                f"{expected}; a workload yields schedlab.Request objects")
        if request.id != expected:
            after = f"after request {previous.id}" if previous is not None else "first"
            raise WorkloadError(f"{who} yielded request {request.id!r} {after} (request {expected} was due): a "
                                "workload yields requests with ids 0, 1, 2, ... in that order")
        if previous is not None and request.arrival_ms < previous.arrival_ms:
            raise WorkloadError(f"{who} yielded request {request.id} at {request.arrival_ms:g} ms after request "
                                f"{previous.id} at {previous.arrival_ms:g} ms: a workload yields requests in arrival "
                                "order")
        previous = request
        yield request


def _naming(requests: Iterator, who: str) -> Iterator[Request]:
    """``requests``, a request the workload could not make (``Request(...)`` refused a field)
    named with ``who`` that made it."""
    while True:
        try:
            request = next(requests)
        except StopIteration:
            return
        except WorkloadError as exc:
            if str(exc).startswith("request "):
                raise WorkloadError(f"{who} made {exc}") from None
            raise
        yield request


class FollowUps:
    """A closed-loop workload's ``on_finish``, its answers checked as :func:`checked_requests` checks
    a stream: an iterable of :class:`Request` (``[]`` for none), each arriving no earlier than the
    finish that released it, with an id no other request of the run has; else :class:`WorkloadError`
    naming the workload. Both engines release follow-ups through it (a ``None``, a lone Request or
    a dict failed far from the plugin; a repeated id or an arrival in the past ran on, exit 0).

    The ids are checked against every id seen so far: :meth:`stream` notes the workload's own
    requests as the engine reads them (a closed loop only: O(1) a request)."""

    __slots__ = ("_on_finish", "who", "_ids")

    def __init__(self, workload, who: str | None = None):
        self._on_finish = workload.on_finish
        self.who = who or f"workload {type(workload).__name__}"
        self._ids: set = set()

    def stream(self, requests: Iterable) -> Iterator[Request]:
        """``requests``, the workload's own, their ids noted (one a follow-up took first is refused)."""
        ids = self._ids
        for request in requests:
            if request.id in ids:
                raise self._repeated(request)
            ids.add(request.id)
            yield request

    def __call__(self, request: Request, now_ms: float) -> list[Request]:
        """The requests ``on_finish(request, now_ms)`` releases, checked."""
        answer = self._on_finish(request, now_ms)
        what = f"{self.who}'s on_finish(request {request.id}, {now_ms:g})"
        try:
            if isinstance(answer, (Request, dict, str)):  # (a lone request, or one as a dict: not a list of them)
                raise TypeError
            answer = iter(answer)
        except TypeError:
            raise WorkloadError(f"{what} returned {_shown(answer)} (a {type(answer).__name__}); it returns a list of "
                                "the requests the finish releases ([] for none)") from None
        released = list(answer)
        ids = self._ids
        for follow_up in released:
            if not isinstance(follow_up, Request):
                raise WorkloadError(f"{what} released {_shown(follow_up)} (a {type(follow_up).__name__}); it returns "
                                    "a list of schedlab.Request objects")
            if follow_up.arrival_ms < now_ms:
                raise WorkloadError(f"{what} released request {follow_up.id} at {follow_up.arrival_ms:g} ms, before "
                                    "the finish that released it: a follow-up arrives at now_ms or later")
            if follow_up.id in ids:
                raise self._repeated(follow_up)
            ids.add(follow_up.id)
        if len(ids) > MAX_REQUESTS:
            raise _too_many(self.who)
        return released

    def _repeated(self, request: Request) -> WorkloadError:
        return WorkloadError(f"{self.who} gave two requests with id {request.id} (on_finish released one of them): "
                             "each request of a run has an id of its own")


def _too_many(who: str) -> WorkloadError:
    """A workload past a run's most requests (an endless generator, a closed loop that never stops)."""
    return WorkloadError(f"{who} gave more than {MAX_REQUESTS:,} requests, a run's most: bound it (a number of "
                         "requests or a duration)")


def _shown(value, most: int = 80) -> str:
    """``value``'s repr on one line, cut to ``most`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= most else text[:most - 3] + "..."
