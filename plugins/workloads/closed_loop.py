"""The ``closed_loop`` workload: N clients, each sending its next request when its previous
one finishes (after ``think_ms``) -- what "concurrency" means in load tests such as
``vllm bench serve --max-concurrency``.

::

    [workload]
    kind = "closed_loop"
    clients = 16
    num_requests = 2000               # and/or duration_ms
    prompt = {dist = "uniform", low = 100, high = 1000}
    output = {dist = "fixed", value = 128}
    # or: path = "requests.jsonl" (rows taken in file order, cycling)

Client ``i`` (``client = "client-<i>"``) sends its first request at ``i * stagger_ms /
clients``. Bounds: at most ``num_requests`` requests in total, counting the first ones, and
none arriving after ``duration_ms`` (one arriving exactly at ``duration_ms`` is still sent).
A client whose next request would break a bound stops.

Requests are numbered in the order they are created: the first ones 0..clients-1, then one
per completion. Lengths come from the request file's rows in that order (a row's
``arrival_ms`` and ``client`` are ignored: the loop decides when and who), or are drawn from
the distributions in that order (in blocks, from the run's seed). All per-run state lives in
a run object that ``requests(seed)`` replaces, so the same workload object runs twice with
identical results. The engine must call ``on_finish`` for every request it finishes (and for
one it rejects, if that client is to go on). A client whose requests are turned away on arrival
with ``think_ms = 0`` would resend without end at one instant: after :data:`INSTANT_RESENDS` in a
row the run stops with a :class:`~schedlab.errors.StallError` saying so.
"""

from __future__ import annotations

from typing import Iterator

import attrs

from schedlab.configs import (
    MAX_REQUESTS, MAX_TIME_MS, MAX_TOKENS, FieldError, float_field, int_field, path_field, str_field, table_field,
)
from schedlab.errors import StallError, WorkloadError
from schedlab.model import Request

from .arrivals import OUTPUT_STREAM, PROMPT_STREAM, stream_rng
from .columns import RequestColumns, check_seed
from .distributions import parse_distribution, scale_lengths
from .records import FORMATS
from .request_file import check_columns, read_request_file, request_columns
from .synthetic import output_scale_field

_DRAW_BLOCK = 1024  # lengths drawn per block; fixed, as results depend on it
#: requests in a row of one client that end the moment they arrive, each sending the next at once
#: (think_ms 0), before the run stops: nothing else can move the clock on while they go round
INSTANT_RESENDS = 10_000


@attrs.frozen
class ClosedLoopConfig:
    clients: int = int_field(min=1, max=MAX_REQUESTS, help="how many clients send requests concurrently")
    num_requests: int | None = int_field(None, min=1, max=MAX_REQUESTS, optional=True,
                                         help="total number of requests, counting each client's first one")
    duration_ms: float | None = float_field(None, min=0, max=MAX_TIME_MS, optional=True,
                                            help="no request arrives after this time (ms)")
    think_ms: float = float_field(0.0, min=0, max=MAX_TIME_MS,
                                  help="a client's pause between a finish and its next request (ms)")
    stagger_ms: float = float_field(0.0, min=0, max=MAX_TIME_MS,
                                    help="client i starts at i * stagger_ms / clients (ms)")
    path: str | None = path_field(None, optional=True,
                                  help="request file (like kind = 'file'), rows used in order, cycling; "
                                       "instead of prompt/output")
    format: str | None = str_field(None, choices=FORMATS, optional=True,
                                   help="file format when the extension does not tell: json, jsonl or csv")
    columns: dict | None = table_field(None, help="our field name -> the file's column name")
    prompt: dict | None = table_field(None, help="prompt length distribution (as in synthetic), without path")
    output: dict | None = table_field(None, help="output length distribution (as in synthetic), without path")
    output_scale: float = output_scale_field()
    max_tokens: int | None = int_field(None, min=1, max=MAX_TOKENS, optional=True,
                                       help="cap on every request's max_tokens (the client's length limit)")
    request_class: str | None = str_field(None, optional=True,
                                          help="request_class of every request (default: the file's, or 'default')")
    priority: int | None = int_field(None, optional=True,
                                     help="priority of every request (default: the file's, or 0)")

    def __attrs_post_init__(self) -> None:
        if self.num_requests is None and self.duration_ms is None:
            raise FieldError("num_requests", "set num_requests and/or duration_ms, or the clients never stop")
        if self.path is not None:
            for key in ("prompt", "output"):
                if getattr(self, key) is not None:
                    raise FieldError(key, "give either path (a request file) or prompt/output, not both")
            check_columns(self.columns)
        else:
            for key in ("prompt", "output"):
                if getattr(self, key) is None:
                    raise FieldError(key, "required when there is no path (a request file)")
                parse_distribution(getattr(self, key), field=key)
            for key in ("format", "columns"):
                if getattr(self, key) is not None:
                    raise FieldError(key, "only applies with path (a request file)")


class _FileSource:
    """Request fields from a file's rows, in order, starting over at the end."""

    def __init__(self, columns: RequestColumns):
        self._columns = columns

    def start(self, seed: int) -> Iterator[dict]:
        cols = self._columns
        prompts, outputs = cols.prompt_tokens.tolist(), cols.output_tokens.tolist()
        names = tuple(cols.per_row)
        while True:
            for row in range(len(prompts)):
                fields = {name: cols.per_row[name][row] for name in names}
                yield {"prompt_tokens": prompts[row], "output_tokens": outputs[row], **cols.constant, **fields}


class _DistributionSource:
    """Request lengths drawn from distributions, a block at a time."""

    def __init__(self, prompt, output, output_scale: float, constant: dict):
        self._prompt, self._output = prompt, output
        self._scale, self._constant = output_scale, constant

    def start(self, seed: int) -> Iterator[dict]:
        prompt_rng, output_rng = stream_rng(seed, PROMPT_STREAM), stream_rng(seed, OUTPUT_STREAM)
        while True:
            prompts = self._prompt.sample(prompt_rng, _DRAW_BLOCK).tolist()
            outputs = scale_lengths(self._output.sample(output_rng, _DRAW_BLOCK), self._scale).tolist()
            for p, o in zip(prompts, outputs):
                yield {"prompt_tokens": p, "output_tokens": o, **self._constant}


class _Run:
    """The state of one run: ids handed out, who is waiting on which request, the length source."""

    def __init__(self, config: ClosedLoopConfig, fields: Iterator[dict]):
        self.config = config
        self.fields = fields
        self.created = 0
        self.client_of: dict[int, int] = {}
        #: per client, its requests in a row that ended the moment they arrived, the next sent at once
        self.instant: dict[int, int] = {}

    def new_request(self, client: int, arrival_ms: float) -> Request | None:
        cfg = self.config
        if cfg.num_requests is not None and self.created >= cfg.num_requests:
            return None
        if cfg.duration_ms is not None and arrival_ms > cfg.duration_ms:
            return None
        if self.created >= MAX_REQUESTS:  # only duration_ms bounds this run, and it sends too many
            raise WorkloadError(f"closed_loop: duration_ms = {cfg.duration_ms:g} would send more than "
                                f"{MAX_REQUESTS:,} requests (a run's most); set num_requests or a shorter duration")
        request = Request(id=self.created, arrival_ms=arrival_ms, client=f"client-{client}", **next(self.fields))
        self.client_of[request.id] = client
        self.created += 1
        return request


class ClosedLoopWorkload:
    """``clients`` clients in a closed loop (see the module docstring)."""

    closed_loop = True

    def __init__(self, config: ClosedLoopConfig, source):
        self.config = config
        self._source = source
        self._run: _Run | None = None
        self.num_requests = config.num_requests  # an upper bound when duration_ms also applies

    def requests(self, seed: int) -> Iterator[Request]:
        """Start a new run: forget the previous one and return each client's first request."""
        self._run = run = _Run(self.config, self._source.start(check_seed(seed)))
        clients = self.config.clients
        first = []
        for client in range(clients):
            request = run.new_request(client, client * self.config.stagger_ms / clients)
            if request is None:
                break
            first.append(request)
        return iter(first)

    def on_finish(self, request: Request, now_ms: float) -> list[Request]:
        """The next request of ``request``'s client, at ``now_ms + think_ms``; [] once a bound is hit."""
        run = self._run
        if run is None:
            raise WorkloadError("closed_loop: on_finish called before requests(seed) started a run")
        client = run.client_of.pop(request.id, None)
        if client is None:
            raise WorkloadError(f"closed_loop: request {request.id} is not an unfinished request of this run")
        if self.config.think_ms == 0 and now_ms <= request.arrival_ms:
            run.instant[client] = streak = run.instant.get(client, 0) + 1
            if streak >= INSTANT_RESENDS:
                raise StallError(
                    f"closed_loop: client {client}'s last {streak:,} requests were each turned away the moment it "
                    f"arrived, at t = {now_ms:g} ms, and with think_ms = 0 it sent the next at once: the clock cannot "
                    "move on. Give the clients a pause (think_ms > 0), bound the run with num_requests, or let the "
                    "requests in: a prompt longer than the KV cache or max_model_len, or a full queue "
                    "(max_concurrent_requests, max_queued_requests), turns them away")
        else:
            run.instant[client] = 0
        following = run.new_request(client, now_ms + self.config.think_ms)
        return [] if following is None else [following]

    def __repr__(self) -> str:
        return f"<closed_loop workload: {self.config.clients} clients>"


def make_closed_loop_workload(config: ClosedLoopConfig) -> ClosedLoopWorkload:
    overrides = {k: v for k, v in (("request_class", config.request_class), ("priority", config.priority))
                 if v is not None}
    if config.path is not None:
        records = read_request_file(config.path, format=config.format, columns=config.columns)
        columns = request_columns(records).with_max_tokens_cap(config.max_tokens)
        # The loop decides who sends what: a file's client column does not apply.
        per_row = {k: v for k, v in columns.per_row.items() if k != "client" and k not in overrides}
        constant = {**{k: v for k, v in columns.constant.items() if k != "client"}, **overrides}
        outputs = scale_lengths(columns.output_tokens, config.output_scale)
        return ClosedLoopWorkload(config, _FileSource(RequestColumns(columns.prompt_tokens, outputs, per_row, constant)))
    constant = dict(overrides)
    if config.max_tokens is not None:
        constant["max_tokens"] = config.max_tokens
    prompt = parse_distribution(config.prompt, field="prompt").sampler()
    output = parse_distribution(config.output, field="output").sampler()
    return ClosedLoopWorkload(config, _DistributionSource(prompt, output, config.output_scale, constant))

