"""SGLang's side of a differential case: the settings both engines get and what is compared."""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedlab.configs import bool_field, float_field, int_field, str_field
from schedlab.diffcheck.case import MAX_MODEL_LEN, Case, Engine
from schedlab.diffcheck.shrink import smaller

POLICIES = ("fcfs", "lpm", "dfs-weight", "lof")  # (the groups' orders; ``hrrn`` has a group of its own)
ORDERS = POLICIES + ("hrrn", "shortest-prefill-first")
#: tokens SGLang keeps back when it bounds a request by the pool (``init_req_max_new_tokens``:
#: ``max_new_tokens <= capacity - prompt - page_size - 1``) -- at page size 1.
POOL_MARGIN = 2
#: the page sizes the cases use (SGLang's ``--page-size``; schedlab's ``block_size``)
PAGE_SIZES = (1, 2, 4, 8, 16)


def paged(tokens: int, page: int) -> int:
    """``tokens`` rounded up to whole pages (SGLang's ``ceil_paged_tokens``)."""
    return -(-tokens // page) * page


def memory_room(prompt: int, pool: int, page: int) -> int:
    """What SGLang leaves a request's ``max_new_tokens`` in an empty pool
    (``max_new_tokens_for_memory``): the pool less the prompt's pages, a page and a token."""
    return pool - paged(prompt, page) - page - 1


@attrs.frozen
class SglangSettings:
    """The settings both engines get: SGLang ``ServerArgs`` (``--max-total-tokens``,
    ``--max-running-requests``, ``--chunked-prefill-size``, ``--max-prefill-tokens``,
    ``--schedule-policy``, ``--schedule-conservativeness``, ``--enable-mixed-chunk``, overlap
    scheduling unless ``--disable-overlap-schedule``, ``--page-size``, ``--disable-radix-cache``)
    and schedlab's ``sglang`` scheduler over a ``radix`` cache of ``max_total_tokens /
    page_size`` blocks of ``page_size`` tokens -- or, with ``disable_radix_cache``, a ``paged``
    cache of as many blocks with ``prefix_caching = false``.

    ``max_running_requests = 0`` leaves it to SGLang (``--max-running-requests`` unset: its own
    from the pool, ``resolve_max_num_reqs``; the preset's 0 is the same rule). The pool and the
    chunks are whole pages (SGLang refuses chunks that are not, and so does schedlab).
    ``chunked_prefill_size = 0`` turns chunking off (SGLang's ``-1``); mixing needs chunking. The
    priority settings are SGLang's (``--enable-priority-scheduling`` and the rest; the preset's
    of the same names), and so is ``max_queued_requests`` (0: SGLang's default, no limit);
    ``waiting_timeout_ms`` and ``running_timeout_ms`` are SGLang's ``SGLANG_REQ_WAITING_TIMEOUT``
    and ``SGLANG_REQ_RUNNING_TIMEOUT`` (in seconds there; 0: off).
    """

    max_total_tokens: int = int_field(4096, min=16, max=10**6)
    max_running_requests: int = int_field(8, min=0, max=256)  # (0: SGLang's own, from the pool)
    chunked_prefill_size: int = int_field(0, min=0, max=MAX_MODEL_LEN)
    max_prefill_tokens: int = int_field(16384, min=1, max=10**6)
    schedule_policy: str = str_field("fcfs", choices=ORDERS)
    schedule_conservativeness: float = float_field(1.0, min=0.0, max=10.0)
    enable_mixed_chunk: bool = bool_field(False)
    overlap_schedule: bool = bool_field(False)
    enable_priority_scheduling: bool = bool_field(False)
    schedule_low_priority_values_first: bool = bool_field(False)
    priority_scheduling_preemption_threshold: int = int_field(10, min=-10, max=10)
    disable_priority_preemption: bool = bool_field(False)
    retraction_policy: str = str_field("length", choices=("length", "priority"))
    max_queued_requests: int = int_field(0, min=0, max=256)  # (0: no limit, SGLang's None)
    waiting_timeout_ms: int = int_field(0, min=0, max=10**6)  # (SGLANG_REQ_WAITING_TIMEOUT; 0: off)
    running_timeout_ms: int = int_field(0, min=0, max=10**6)  # (SGLANG_REQ_RUNNING_TIMEOUT; 0: off)
    page_size: int = int_field(1, min=1, max=64)
    disable_radix_cache: bool = bool_field(False)

    def __attrs_post_init__(self):
        page = self.page_size
        if self.max_total_tokens % page:
            raise ValueError(f"max_total_tokens {self.max_total_tokens} is not a whole number of pages of {page}")
        if self.chunked_prefill_size % page:
            raise ValueError(f"chunked_prefill_size {self.chunked_prefill_size} is not a whole number of pages of "
                             f"{page} (SGLang refuses it)")
        if self.enable_mixed_chunk and not self.chunked_prefill_size:
            raise ValueError("enable_mixed_chunk needs chunked_prefill_size > 0 (SGLang mixes only chunked prefills)")
        if self.retraction_policy == "priority" and not self.enable_priority_scheduling:
            raise ValueError("retraction_policy \"priority\" needs enable_priority_scheduling (SGLang's rule)")
        if self.enable_priority_scheduling and not self.disable_priority_preemption and self.enable_mixed_chunk:
            raise ValueError("priority preemption with enable_mixed_chunk is not modelled")

    def problems(self, requests) -> list[str]:
        """SGLang must serve each request: it refuses a prompt of ``max_total_tokens - 6`` tokens
        or more (``validate_input_length``), as schedlab does, and the harness compares served
        requests only. (It cuts ``max_new_tokens`` to ``max_total_tokens`` less the prompt's
        pages, a page and a token, as schedlab does too -- but with pages of more than a token
        that may leave nothing, which is not compared either.) Without the radix cache a request
        ignoring EOS that asks for that much is never admitted (``add_one_req_ignore_eos`` needs
        a token more): SGLang keeps it, and every request behind it, waiting, schedlab rejects it."""
        cap, page = self.max_total_tokens, self.page_size
        out = []
        for r in requests:
            room = memory_room(r.prompt_tokens, cap, page)
            if r.prompt_tokens >= cap - 6:
                out.append(f"request {r.id}: prompt of {r.prompt_tokens} reaches max_total_tokens - 6")
            elif room < 1:
                out.append(f"request {r.id}: the pool leaves its answer no room after the prompt's pages")
            elif self.disable_radix_cache and r.ignore_eos and r.limit >= room:
                out.append(f"request {r.id}: ignores EOS and asks for all the pool holds ({room} tokens), which "
                           "SGLang never admits without its radix cache")
        return out

    def simpler(self):
        """Simpler settings for the shrinker: FCFS, no chunking, then fewer requests running, a
        smaller prefill budget, a smaller pool and smaller chunks."""
        if self.overlap_schedule:
            yield {"overlap_schedule": False}
        if self.max_queued_requests:
            yield {"max_queued_requests": 0}
        if self.waiting_timeout_ms:
            yield {"waiting_timeout_ms": 0}
        if self.running_timeout_ms:
            yield {"running_timeout_ms": 0}
        if self.enable_priority_scheduling:
            yield {"enable_priority_scheduling": False, "retraction_policy": "length"}
            if self.retraction_policy != "length":
                yield {"retraction_policy": "length"}
            if not self.disable_priority_preemption:
                yield {"disable_priority_preemption": True}
        if self.schedule_policy != "fcfs":
            yield {"schedule_policy": "fcfs"}
        if self.schedule_conservativeness != 1.0:
            yield {"schedule_conservativeness": 1.0}
        if self.enable_mixed_chunk:
            yield {"enable_mixed_chunk": False}
        elif self.chunked_prefill_size:
            yield {"chunked_prefill_size": 0}
        page = self.page_size
        if page == 1:
            yield from smaller(self, (("max_running_requests", 1), ("max_prefill_tokens", 1),
                                      ("max_total_tokens", 16), ("chunked_prefill_size", 1)))
            return
        for smaller_page in PAGE_SIZES:  # (the pool and the chunks stay whole pages)
            if smaller_page < page and page % smaller_page == 0:
                yield {"page_size": smaller_page}
        yield from smaller(self, (("max_running_requests", 1), ("max_prefill_tokens", 1)))
        for name, low in (("max_total_tokens", paged(16, page)), ("chunked_prefill_size", page)):
            seen = set()
            for change in smaller(self, ((name, low),)):
                value = change[name] // page * page
                if value >= low and value not in seen:
                    seen.add(value)
                    yield {name: value}


@attrs.frozen
class Outcome:
    """What one engine did with one request (``None``: it never got there). ``chunks`` are the
    prompt tokens of every prefill step it was in, in order (first chunks, later chunks and the
    recomputation after each retraction)."""

    FIELDS: ClassVar[tuple] = ("first_scheduled_ms", "first_token_ms", "finish_ms", "retractions",
                               "cached_tokens", "chunks")
    SHORT: ClassVar[dict] = {"first_scheduled_ms": "scheduled", "first_token_ms": "first_token",
                             "finish_ms": "finish", "retractions": "retractions", "cached_tokens": "cached",
                             "chunks": "chunks"}

    first_scheduled_ms: int | None
    first_token_ms: int | None
    finish_ms: int | None
    retractions: int
    cached_tokens: int
    chunks: tuple = attrs.field(converter=tuple)


ENGINE = Engine(key="sglang", label="SGLang", tool="tools/sglang_diff.py", flag="--sglang-set", outcome=Outcome,
                settings=SglangSettings)


def case_from_json(text: str) -> Case:
    return Case.from_json(text, SglangSettings)
