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
#: ``max_new_tokens <= capacity - prompt - page_size - 1``) -- page size 1 here.
POOL_MARGIN = 2


@attrs.frozen
class SglangSettings:
    """The settings both engines get: SGLang ``ServerArgs`` (``--max-total-tokens``,
    ``--max-running-requests``, ``--chunked-prefill-size``, ``--max-prefill-tokens``,
    ``--schedule-policy``, ``--schedule-conservativeness``, ``--enable-mixed-chunk``, overlap
    scheduling unless ``--disable-overlap-schedule``; ``--page-size 1``, the radix cache on) and
    schedlab's ``sglang`` scheduler over a ``radix`` cache of ``max_total_tokens`` blocks of one
    token.

    ``chunked_prefill_size = 0`` turns chunking off (SGLang's ``-1``); mixing needs chunking. The
    priority settings are SGLang's (``--enable-priority-scheduling`` and the rest; the preset's
    of the same names), and so is ``max_queued_requests`` (0: SGLang's default, no limit);
    ``waiting_timeout_ms`` and ``running_timeout_ms`` are SGLang's ``SGLANG_REQ_WAITING_TIMEOUT``
    and ``SGLANG_REQ_RUNNING_TIMEOUT`` (in seconds there; 0: off).
    """

    max_total_tokens: int = int_field(4096, min=16, max=10**6)
    max_running_requests: int = int_field(8, min=1, max=256)
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

    def __attrs_post_init__(self):
        if self.enable_mixed_chunk and not self.chunked_prefill_size:
            raise ValueError("enable_mixed_chunk needs chunked_prefill_size > 0 (SGLang mixes only chunked prefills)")
        if self.retraction_policy == "priority" and not self.enable_priority_scheduling:
            raise ValueError("retraction_policy \"priority\" needs enable_priority_scheduling (SGLang's rule)")
        if self.enable_priority_scheduling and not self.disable_priority_preemption and self.enable_mixed_chunk:
            raise ValueError("priority preemption with enable_mixed_chunk is not modelled")

    def problems(self, requests) -> list[str]:
        """SGLang must serve each request: it refuses a prompt of ``max_total_tokens - 6`` tokens
        or more (``validate_input_length``), as schedlab does, and the harness compares served
        requests only. (It cuts ``max_new_tokens`` to ``max_total_tokens - prompt - 2``, as
        schedlab does too.)"""
        cap = self.max_total_tokens
        return [f"request {r.id}: prompt of {r.prompt_tokens} reaches max_total_tokens - 6"
                for r in requests if r.prompt_tokens >= cap - 6]

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
        yield from smaller(self, (("max_running_requests", 1), ("max_prefill_tokens", 1), ("max_total_tokens", 16),
                                  ("chunked_prefill_size", 1)))


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
