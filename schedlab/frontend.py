"""The client's view of a request: the way from the load generator to the engine and back, and
how long the client waits.

A request leaves the client at ``sent``. It crosses the network (``network_ms``) to the API
server, which handles it before the engine sees it: HTTP and JSON parsing, the chat template,
tokenizing the prompt (``request_ms + tokenize_ms_per_token x prompt tokens``). vLLM's
OpenAI-compatible server does that work one request at a time per API server process: the
asyncio loop is one thread, and the chat template and the tokenizer run on the renderer's
executor, one thread unless told (``BaseRenderer._executor``, ``ThreadPoolExecutor(max_workers=
renderer_num_workers)``, ``vllm/renderers/base.py``, ``--renderer-num-workers`` default 1, vLLM
0.28-0.33; before the renderers, ``OpenAIServing._tokenizer_executor``, one thread; more
processes with ``--api-server-count``). So requests queue for one of ``workers`` handlers, first
received first handled, and reach the engine's queue when their handling ends -- the engine's
``arrival_ms``. Every token the
engine produces is detokenized, framed as a server-sent event and sent back
(``token_ms``), then crosses the network: the client sees it ``token_ms + network_ms`` after
the iteration that produced it. Between tokens the delay cancels out, so the client's
inter-token latencies are the engine's; its first byte and its last come that much later.

Metrics are given both ways (:mod:`schedlab.results.metrics`): as the engine sees a request
(queued -> first token: ``ttft_ms``) and as the client does (sent -> first byte:
``client.ttft_ms``, what ``vllm bench serve`` reports as TTFT). vLLM's own histogram
(``vllm:time_to_first_token_seconds``) lies between: from vLLM 0.17 (to 0.33 at least) it starts
when rendering starts -- ``arrival_time = time.time()`` first in ``render_chat_async`` /
``render_cmpl_async`` (``vllm/renderers/base.py``), before the wait for the renderer's thread,
the chat template and the tokenizer -- and ends when the API server's output loop takes the
step's outputs off ZeroMQ (``IterationStats()`` in ``AsyncLLM.output_handler``). So it is this
``ttft_ms`` plus the API server's queue and tokenizing (and the ZeroMQ hops, not modelled);
vLLM 0.11-0.16 stamped ``arrival_time`` in ``Processor.process_inputs`` (``InputProcessor`` from
0.15), after tokenizing (a ``[target]``'s ``vllm_ttft_from``, :mod:`schedlab.targets`).

Defaults (``[frontend]`` with no keys; every key can be set per deployment), estimates from
public measurements, not fitted to any run:

* ``tokenize_ms_per_token`` 0.002 (2 us per prompt token): a 22k-token prompt took 41.7 ms to
  encode with a Hugging Face fast tokenizer (LightLLM PR #1258, Qwen3.5, 1.9 us/token); vLLM
  PR #10635 reports "a few hundred milliseconds" for 256K-token prompts (1-2 us/token);
* ``request_ms`` 1.0: a 131-token chat request took 1.3-2.8 ms to template and encode in a
  C++ server (tt-inference-server issue #2173), about 1 ms more than its tokens at 2 us;
  Python's HTTP, pydantic and ZeroMQ hops cost no less;
* ``token_ms`` 9.9: the way out, from the iteration that produced a token to its server-sent
  event leaving the API server -- the API server's output loop, detokenizing, the event's JSON
  -- a latency, not a cost that queues. vLLM's own client measures TTFT 8.4-12.2 ms (median
  11.0) above vLLM's server-side histogram of it (``vllm:time_to_first_token_seconds``) with
  512-token prompts and 8 requests in flight (vllm-project/vllm PR #54628: vLLM 0.28, ``vllm
  bench serve`` against ``vllm serve``, five runs; :data:`VLLM_CLIENT_TTFT_GAP_MS`). That gap
  holds what lies outside the histogram: the network both ways, the request's handling before
  rendering (here in ``request_ms``) and the way out after the output loop has the step's
  outputs. Tokenizing is inside the histogram in vLLM 0.28 (above), so not in the gap: the
  network and ``request_ms`` hold 1.1 ms of it, and the rest is this (:data:`TOKEN_MS`). (Until
  this was seen, the 1.02 ms of tokenizing 512 tokens was subtracted too: 8.88.) The ZeroMQ hops
  to the engine core and back lie inside the histogram and in neither estimate. A Python
  OpenAI-compatible test server measured ~7 ms of the client's HTTP and streaming time a request
  (schedlab issue 20). Between tokens it cancels out;
* ``network_ms`` 0.05: one way between processes on one host (``vllm bench serve`` defaults
  to 127.0.0.1); set it to the client's real round trip / 2;
* ``workers`` 1: one API server process (vLLM's ``--api-server-count`` default) with one renderer
  thread (``--renderer-num-workers`` default 1); 0 = no limit.

Not modelled: ``--stream-interval`` (vLLM 0.33's ``SchedulerConfig.stream_interval``, default
1; SGLang's ``--stream-interval``, default 1). Above 1 the API server sends a request's first
token at once, then every N tokens, and its last at once (``RequestState.make_request_output``,
``vllm/v1/engine/output_processor.py``): ``vllm bench serve`` then times one ITL per event, not
per token, while its TTFT, end-to-end latency and TPOT stay as here. The client's ITL here is
the engine's, per token (stream interval 1).

The client's patience is ``[client]``: ``timeout_ms`` (``vllm bench serve`` uses aiohttp's
``ClientTimeout(total=6 h)``), per request class in ``classes``. A request whose last byte
has not arrived ``timeout_ms`` after it was sent is abandoned: the client counts it as failed,
and its disconnect reaches the server ``network_ms`` later, where the engine aborts it at its
next step (vLLM aborts a request when its client disconnects: ``engine_client.abort``; the
engine core frees its KV blocks and slot when it next reads its input queue) -- or, if a step is
computing the request then, at that step's end, before its output: the step's token for it is
never sent (``EngineCore.step``, planned synchronously or ahead; a pipeline has its own rule). A
request still waiting for an API server handler at its disconnect is cancelled there
(``with_cancellation``): it takes no handler (:mod:`schedlab.engine.client`).
"""

from __future__ import annotations

import math
import statistics

import attrs

from .configs import MAX_TIME_MS, MAX_TOKENS, FieldError, float_field, int_field, table_field

INF = math.inf


#: ``vllm bench serve``'s mean TTFT minus vLLM's own TTFT histogram's mean, ms, five runs of 32
#: requests (512-token prompts, 128 tokens out, 8 in flight; completions, chat and responses
#: endpoints) against vLLM 0.28 on one GPU (vllm-project/vllm PR #54628, "Backend parity")
VLLM_CLIENT_TTFT_GAP_MS = (10.5, 12.2, 8.4, 12.0, 11.0)
#: ``request_ms``, ``tokenize_ms_per_token`` and ``network_ms`` defaults (see the module docstring)
REQUEST_MS, TOKENIZE_MS_PER_TOKEN, NETWORK_MS = 1.0, 0.002, 0.05
#: The gap's median less what the other defaults put in it: the way out. Not tokenizing: vLLM 0.28's
#: histogram starts before the prompt is tokenized (``arrival_time`` stamped first in
#: ``render_chat_async``, ``vllm/renderers/base.py``), so tokenizing lies inside it, not in the gap
TOKEN_MS = statistics.median(VLLM_CLIENT_TTFT_GAP_MS) - (REQUEST_MS + 2 * NETWORK_MS)


@attrs.frozen
class FrontendConfig:
    """The API server between the client and the engine, and the network (see the module docstring)."""

    network_ms: float = float_field(NETWORK_MS, min=0.0, max=MAX_TIME_MS,
                                    help="one-way network latency between client and server, ms")
    request_ms: float = float_field(REQUEST_MS, min=0.0, max=MAX_TIME_MS,
                                    help="handling every request before the engine queue (HTTP, JSON, chat template, "
                                         "hand-over to the engine), ms")
    tokenize_ms_per_token: float = float_field(TOKENIZE_MS_PER_TOKEN, min=0.0, max=MAX_TIME_MS / MAX_TOKENS,
                                               help="tokenizing the prompt, ms per prompt token")
    token_ms: float = float_field(TOKEN_MS, min=0.0, max=MAX_TIME_MS,
                                  help="the way out: from the iteration that produced a token to its streamed event "
                                       "leaving the API server (the output loop, detokenizing, the event), ms; a "
                                       "latency, not a cost that queues")
    workers: int = int_field(1, min=0, max=1024, help="requests the API server handles at once (vLLM: API server "
                                                      "processes x --renderer-num-workers); 0 = no limit")

    def handling_ms(self, prompt_tokens: int) -> float:
        """How long the API server works on a request before the engine sees it."""
        return self.request_ms + self.tokenize_ms_per_token * prompt_tokens

    @property
    def output_delay_ms(self) -> float:
        """From the iteration that produces a token to the client receiving it."""
        return self.token_ms + self.network_ms


@attrs.frozen
class ClientConfig:
    """How long clients wait for a request before abandoning it (see the module docstring)."""

    timeout_ms: float = float_field(INF, min=0.0, min_exclusive=True, allow_inf=True,
                                    help="abandon a request whose last token has not arrived this long after "
                                         "sending it, ms (inf: never; vllm bench serve: 6 h)")
    classes: dict = table_field(attrs.Factory(dict), help="timeouts per request class: {batch = {timeout_ms = 600000}}")

    def __attrs_post_init__(self):
        for name, table in self.classes.items():
            if not isinstance(table, dict):
                raise FieldError("classes", f"{name} must be a table like {{timeout_ms = 30000}}, got {table!r}")
            for key, value in table.items():
                if key != "timeout_ms":
                    raise FieldError("classes", f"{name}: unknown key {key!r}; valid keys: timeout_ms")
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                    raise FieldError("classes", f"{name}.timeout_ms must be a number > 0, got {value!r}")

    def timeout_for(self, request_class: str) -> float | None:
        """The timeout of a request of ``request_class`` (None: the client never gives up)."""
        table = self.classes.get(request_class)
        value = float(table.get("timeout_ms", self.timeout_ms)) if table is not None else self.timeout_ms
        return None if value == INF else value

    @property
    def gives_up(self) -> bool:
        """True if some request may time out."""
        return self.timeout_ms != INF or any("timeout_ms" in t for t in self.classes.values())


def give_up_ms(request) -> float:
    """When the client abandons ``request`` (inf: never)."""
    return INF if request.timeout_ms is None else request.sent_at + request.timeout_ms


def client_times(request, first_token_ms: float, finish_ms: float, output_delay_ms: float, *,
                 aborted: bool = False) -> tuple[float, float, bool]:
    """``(first byte, done, timed out)`` as the client sees a request the engine finished (or
    aborted) at ``finish_ms``: the first byte ``output_delay_ms`` after the first token (-1 if
    none reached the client before it gave up); done when the last byte arrived or, timed out,
    when the client gave up. Shared by both engines' results and the drivers' closed loops.
    An aborted request failed for its client (timed out): done when its client gave up -- an
    abort of its client's comes after that -- or, dropped by the engine before then (an
    autoscaler's drain timeout, :mod:`schedlab.engine.drain`), when the engine dropped it."""
    give_up = give_up_ms(request)
    first = first_token_ms + output_delay_ms if first_token_ms >= 0 else -1.0
    done = finish_ms + output_delay_ms
    if aborted or done > give_up:
        if aborted and finish_ms < give_up:  # (its connection closed then)
            give_up = finish_ms
        return (first if 0 <= first <= give_up else -1.0), give_up, True
    return first, done, False


def disconnect_ms(request, network_ms: float) -> float:
    """When the engine learns that the client abandoned ``request`` (inf: never)."""
    return give_up_ms(request) + network_ms


@attrs.frozen
class ClientSide:
    """What lies between a run's workload and its engine: the front end and the clients'
    timeouts (either may be None). Both engines' drivers take one."""

    frontend: FrontendConfig | None = None
    client: ClientConfig | None = None

    @property
    def network_ms(self) -> float:
        return self.frontend.network_ms if self.frontend is not None else 0.0

    @property
    def output_delay_ms(self) -> float:
        return self.frontend.output_delay_ms if self.frontend is not None else 0.0

    def timeout_for(self, request) -> float | None:
        """``request``'s own timeout, else its class's (None: never)."""
        if request.timeout_ms is not None or self.client is None:
            return request.timeout_ms
        return self.client.timeout_for(request.request_class)
