"""What operators have of a real run: summary statistics, and the same statistics of a simulation.

``schedlab calibrate --target FILE`` fits a run's cost model to statistics read here, when no
per-request log exists. The file is recognised by its content:

* ``vllm bench serve --save-result`` (with or without ``--save-detailed``): ``mean_ttft_ms``,
  ``median_ttft_ms``, ``p99_ttft_ms`` (every ``--metric-percentiles`` it was run with), the same
  for ``tpot``, ``itl`` and ``e2el``, and ``request_throughput`` (v0.3's ``request_inthroughput``),
  ``output_throughput``, ``total_token_throughput``. With ``--append-result`` the file holds one
  JSON document per run: the last is read, or the one ``index`` names;
* an inference-perf report (``summary_lifecycle_metrics.json``): ``successes.latency.
  {time_to_first_token, time_per_output_token, inter_token_latency, request_latency}`` in
  seconds (``mean``, ``median``, ``p90`` ...) and ``successes.throughput``; its ITL is per token
  (:func:`_per_token_itl`). A report of a client that timed each server-sent-event line as a
  token (before inference-perf #410/#452/#566) has its TPOT and ITL left out, with a warning
  (:func:`_sse_line_tokens`);
* inference-perf's ``summary_prometheus_metrics.json``: vLLM's own histograms as inference-perf
  queried them from Prometheus over the run (``reportgen/base.py``): ``successes.
  {time_to_first_token, time_per_output_token (vllm:request_time_per_output_token_seconds),
  inter_token_latency, request_latency, request_queue_time, iteration_tokens}`` in seconds (or
  tokens; ``request_queue_time`` read as ``loop_queue_ms``, a TGI server's as ``queue_ms``), ``mean``
  (exact) and ``median``, ``p90``, ``p99`` (``histogram_quantile`` inside buckets the file does not
  hold), and ``successes.rate`` (over a Prometheus window that runs
  ``scrape_interval`` + 2 s past the run, :func:`_inference_perf_window_pad_s`): the engine's
  view. A TGI or SGLang server (``server: type:`` in the ``config.yaml`` beside the report or a
  folder up) has its client's stand-ins for vLLM's TPOT and token rates left out
  (:data:`INFERENCE_PERF_NOT_READ`). A vLLM report without ``inter_token_latency`` (before
  inference-perf #348) has ``vllm:time_per_output_token_seconds``, the per-token gaps, as its
  ``time_per_output_token``: read as the ITL. Beside the client's lifecycle report of the same
  stage, a server count far above the client's (:func:`_other_traffic_limit`) has the rates left
  out: its Prometheus window held other traffic (:func:`_inference_perf_server_summary`);
* a guidellm report: ``benchmarks[i].metrics.{time_to_first_token_ms, inter_token_latency_ms,
  request_latency (s), requests_per_second, output_tokens_per_second,
  tokens_per_second}.successful`` (``mean``, ``median``, ``percentiles.p90`` ...) -- the JSON
  report; its YAML one is read only where PyYAML is installed. ``inter_token_latency_ms`` is
  each request's ``(last token - first) / (tokens - 1)`` weighted by its ``tokens - 1``: its
  mean is every gap's (``itl_ms.mean``), and the simulated percentiles are taken the same way
  (:func:`_gap_weighted_tpot`). ``time_per_output_token_ms`` is left out: it is no TPOT (from
  0.4 on it counts the wait for the first token, ``(last token - start) / tokens``; before, it
  divided by every token), weighted by tokens;
* a scrape of vLLM's Prometheus ``/metrics`` (text format): the histograms
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` (older vLLMs:
  ``vllm:time_per_output_token_seconds``, the same per-token gaps),
  ``vllm:request_time_per_output_token_seconds``, ``vllm:e2e_request_latency_seconds``,
  ``vllm:request_queue_time_seconds`` (``loop_queue_ms``: from ``queued_ts``, when the engine core's loop took the
  request between two steps, :mod:`schedlab.engine.taking`) and ``vllm:iteration_tokens_total``
  (``vllm/v1/metrics/loggers.py``; TTFT and E2E from ``arrival_time``, stamped before the API
  server's queue and tokenizing from vLLM 0.17 on, after them before: :data:`VLLM_RENDERER_RELEASE`,
  :func:`_clock_start`), summed over their label sets (the per-request TPOT
  histogram observes 0 for a request of one output token, ``vllm/v1/metrics/stats.py``, and so
  does the simulation read against it, where a client's TPOT leaves such a request out); with a
  second scrape taken before the run (``baseline``) the difference. A histogram gives an exact mean (``_sum /
  _count``) and quantiles only to its buckets' resolution, so the simulation's quantiles are
  read through the same buckets with the same interpolation as Prometheus' ``histogram_quantile``
  -- like is compared with like. A quantile whose rank falls in the ``+Inf`` bucket has no
  value (``histogram_quantile`` gives the last finite bound whatever the observations): left
  out, with a warning. Label sets whose buckets differ (pods of two vLLM versions in a
  federated scrape) are summed at the bounds where every set's count is known (see
  :func:`_sum_series`). Histograms renamed ``vllm_``/``sglang_`` (sgl-router's aggregated
  ``/engine_metrics``, exporters) are refused, saying so (:func:`_refuse_renamed`);
* SGLang's ``python -m sglang.bench_serving --output-file`` (sgl-project/sglang,
  ``python/sglang/bench_serving.py``; JSON Lines, one run appended per line: the last is read, or
  the one ``index`` names): vLLM's ``{mean,median,p90,p95,p99}_{ttft,tpot,itl}_ms`` but
  ``*_e2e_latency_ms``, and ``request_throughput``, ``output_throughput``, ``total_throughput``
  (older versions: ``input_throughput`` + ``output_throughput``); the client's view
  (:func:`_sglang_bench_summary`; its native backend's ITL is per token, :func:`_per_token_itl`);
* a scrape of SGLang's ``/metrics`` (``--enable-metrics``; ``python/sglang/srt/metrics/collector.py``),
  read as vLLM's: ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
  ``sglang:e2e_request_latency_seconds`` -- observed once per request (per token for the ITL) by
  the tokenizer manager, from the request's arrival at the API server (``received_time``, before
  the chat template and tokenizing: :data:`SERVER_TTFT_FROM`): the engine's view -- and
  ``sglang:queue_time_seconds`` (waiting queue to first forward, as vLLM's queue time: ``loop_queue_ms``). The last is
  observed by the scheduler, which runs on every tensor- and pipeline-parallel rank: with TP 4 the
  scrape holds four series (``tp_rank`` 0..3) of the same requests, and under DP attention (which
  labels no ``dp_rank``) ranks of different requests. Summed over every label set, each request is
  counted the same number of times (the ranks of its group), which changes neither the mean (sum
  over count) nor a bucket quantile (the counts of every bucket scale alike); taking one rank
  instead would keep only one DP-attention group's requests. So the series are summed, as vLLM's,
  and the number of requests is the E2E histogram's (the tokenizer's, counted once). The ITL
  histogram counts each of a chunk's tokens at the chunk's gap over its tokens and sums the gaps:
  its mean is the mean gap between two tokens. ``sglang:request_time_per_output_token_seconds``
  (0.5.23 on) is each request's TPOT, ``(finished - first token) / (tokens - 1)``, observed once
  for a request of two tokens or more that finished (stop or length) -- as the simulation's
  (``observability/req_time_stats.py``). Older SGLang's
  ``sglang:time_per_output_token_seconds`` is not read: it observed, at every chunk, the request's
  running mean gap since its first token (and a non-streamed request's latency over its tokens),
  neither every gap (the ITL) nor one TPOT per request;
* a scrape of text-generation-inference's router ``/metrics`` (``router/src/server.rs``): the
  histograms ``tgi_request_duration`` (E2E from the request's arrival at the router) and
  ``tgi_request_queue_duration`` (queued until its first batch: ``queue_ms``, TGI queues a request as it comes), in
  seconds; the engine's view.
  ``tgi_request_mean_time_per_token_duration`` is left out: it is the inference time (prefill
  included) over every generated token, not a TPOT; TGI has no TTFT histogram;
* NVIDIA genai-perf's ``profile_export_genai_perf.json`` or AIPerf's ``profile_export_aiperf.json``
  (the same layout): ``time_to_first_token``, ``request_latency``, ``inter_token_latency`` (per
  request, ``(latency - TTFT) / (tokens - 1)``: read as the TPOT) and AIPerf's
  ``inter_chunk_latency`` (the ITL) -- ``avg``, ``p1`` ... ``p99`` in their ``unit`` --, and
  ``request_throughput``, ``output_token_throughput``; the client's view (:func:`_genai_perf_summary`).
* an ML.ENERGY benchmark ``results.json`` (``mlenergy.llm.benchmark``): ``vllm bench serve``'s
  statistics under the same names (the ITL as the leaderboard computes it, :func:`_mlenergy_itl`),
  and the steady state: ``energy.steady_j_per_token`` and ``energy.steady_power_w`` (all GPUs),
  ``energy.steady_tokens_per_s``, and ``energy.steady_batch`` from the ``prometheus.json``
  beside it, compared with the simulated run's steady state measured the same way
  (:func:`steady_state_energy`); the client's view.

Files are UTF-8, with or without a byte-order mark. Statistics that cannot be compared are left
out and noted (``Summary.dropped``): null or not finite; TTFT, TPOT and ITL of a non-streaming
run (every TTFT 0; a :class:`TargetWarning` says so). A file of a run whose every request failed
is refused.

Statistics are named as the run's metrics are: ``ttft_ms.mean``, ``itl_ms.p99``, ``e2e_ms.p50``,
``queue_ms.mean``, ``loop_queue_ms.mean``, ``iteration_tokens.mean``, ``request_throughput_rps``,
``output_throughput_tps``, ``total_throughput_tps``, ``slo.goodput_rps`` (``vllm bench serve --goodput``'s
``request_goodput``, against the run's ``[slo]``: :func:`_goodput`). :func:`simulated` computes the same names from a
:class:`~schedlab.results.records.RunResult` (TTFT and latency as the file's source sees them:
a load generator from sending a request, a server's own metrics from its arrival there -- with a
``[frontend]``, at the API server for vLLM from 0.17 and SGLang (their histograms hold its queue and
tokenizing), at the engine's queue for older vLLMs (``[target] vllm_ttft_from``) and TGI:
:func:`_clock_start`; ITL:
every gap between two tokens of a request, an abandoned request's too, where ``vllm bench serve``
counts the successful requests' only -- the engines keep ITL per run, not per request, and per
step, as vLLM counts it, its mean per token against a source that counts each token of a step
(:func:`_per_token_itl`); the engine's TTFT over every request that got a first token; the
latencies and throughputs over the requests completed for their clients, the throughputs over
the span the source takes, :func:`_window_s`: ``vllm bench serve``'s duration starts one first
gap before the first send).

A run can carry its measured summary along (a ``[target]`` table, :class:`TargetConfig`): it
then gets ``metrics["vs_target"]``, each statistic measured, simulated and its error
(:func:`vs_target`), and the ``compare`` report prints the table.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from bisect import bisect_right
from pathlib import Path
import attrs
import numpy as np

from .configs import FieldError, int_field, not_regular_file, path_field, str_field
from .errors import ConfigError, InputWarning, brief
from .json_text import UTF16_ADVICE, JsonTextError, cut_short_note, documents_before_break, json_documents, looks_utf16

#: what every line of a per-request vLLM log holds (the ``vllm_log`` workload), which is no summary
VLLM_LOG_FIELDS = frozenset({"queued_ts", "scheduled_ts", "first_token_ts"})
#: Latency groups: the run's metric prefix, and how each source names it.
#: ``queue_ms`` runs from a request's arrival at the engine, ``loop_queue_ms`` from its engine loop taking it (vLLM's
#: and SGLang's queue-time histograms; :mod:`schedlab.engine.taking`), both to its first scheduling
GROUPS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "loop_queue_ms")
THROUGHPUTS = ("request_throughput_rps", "output_throughput_tps", "total_throughput_tps")
#: ML.ENERGY's steady-state energy statistics (all the GPUs of the run): J per output token, W
STEADY_ENERGY = ("energy.steady_j_per_token", "energy.steady_power_w")
#: ... and the rest of its steady state, which needs no power model: output tokens per second, and
#: the requests running on average (``prometheus.json``'s ``vllm:num_requests_running``)
STEADY_STATE = (*STEADY_ENERGY, "energy.steady_tokens_per_s", "energy.steady_batch")
MLENERGY_KIND = "ML.ENERGY benchmark"
#: vllm bench serve: field infix per group
BENCH = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
BENCH_RATES = {"request_throughput": "request_throughput_rps", "output_throughput": "output_throughput_tps",
               "total_token_throughput": "total_throughput_tps"}
#: vllm bench serve --goodput's request_goodput (requests a second that met every --goodput target), read as
#: the run's slo.goodput_rps taken over the same duration (:func:`_goodput`)
BENCH_GOODPUT = "slo.goodput_rps"
#: older vllm bench serve's names of BENCH_RATES' keys (v0.3-era benchmark_serving.py's typo)
BENCH_RATE_ALIASES = {"request_inthroughput": "request_throughput"}
#: the kind of a vllm bench serve result (whose throughputs divide by its duration: :func:`bench_first_gap_s`)
BENCH_KIND = "vllm bench serve"
#: inference-perf: successes.latency.<name> (seconds)
INFERENCE_PERF = {"time_to_first_token": "ttft_ms", "time_per_output_token": "tpot_ms",
                  "inter_token_latency": "itl_ms", "request_latency": "e2e_ms"}
INFERENCE_PERF_RATES = {"requests_per_sec": "request_throughput_rps", "output_tokens_per_sec": "output_throughput_tps",
                        "total_tokens_per_sec": "total_throughput_tps"}
#: inference-perf's summary_prometheus_metrics.json: successes.<name> -> (group, scale to ms or tokens). Its
#: vLLM client queries time_per_output_token from vllm:request_time_per_output_token_seconds (a request's TPOT)
#: since #348; before, from vllm:time_per_output_token_seconds, read as itl_ms (:func:`_inference_perf_server_summary`)
INFERENCE_PERF_SERVER = {"time_to_first_token": ("ttft_ms", 1e3), "time_per_output_token": ("tpot_ms", 1e3),
                         "inter_token_latency": ("itl_ms", 1e3), "request_latency": ("e2e_ms", 1e3),
                         "request_queue_time": ("loop_queue_ms", 1e3), "iteration_tokens": ("iteration_tokens", 1.0)}
#: ... but a TGI server's queue time (tgi_request_queue_duration) runs from the request's arrival: TGI queues it at once
INFERENCE_PERF_QUEUE_GROUP = {"tgi": "queue_ms"}
INFERENCE_PERF_SERVER_KIND = "inference-perf server metrics"
#: guidellm: metrics.<name> and its unit in ms
GUIDELLM = {"time_to_first_token_ms": ("ttft_ms", 1.0), "inter_token_latency_ms": ("itl_ms", 1.0),
            "request_latency": ("e2e_ms", 1e3)}
GUIDELLM_RATES = {"requests_per_second": "request_throughput_rps", "output_tokens_per_second": "output_throughput_tps",
                  "tokens_per_second": "total_throughput_tps"}
#: vLLM's Prometheus histograms (vllm/v1/metrics/loggers.py): name -> (group, scale to ms or tokens)
PROMETHEUS = {"vllm:time_to_first_token_seconds": ("ttft_ms", 1e3),
              "vllm:inter_token_latency_seconds": ("itl_ms", 1e3),
              "vllm:time_per_output_token_seconds": ("itl_ms", 1e3),  # older vLLMs: the same per-token gaps
              "vllm:request_time_per_output_token_seconds": ("tpot_ms", 1e3),
              "vllm:e2e_request_latency_seconds": ("e2e_ms", 1e3),
              "vllm:request_queue_time_seconds": ("loop_queue_ms", 1e3),  # (queued_ts: taken by the engine loop)
              "vllm:iteration_tokens_total": ("iteration_tokens", 1.0)}
#: the kind of a Prometheus scrape's summary (the only one measured by the server, not a client)
PROMETHEUS_KIND = "vLLM /metrics"
#: SGLang's Prometheus histograms (--enable-metrics; python/sglang/srt/metrics/collector.py): name -> (group,
#: scale to ms). The module docstring says what they count, per TP rank too, and why the older
#: ``sglang:time_per_output_token_seconds`` is not read
SGLANG_PROMETHEUS = {"sglang:time_to_first_token_seconds": ("ttft_ms", 1e3),
                     "sglang:inter_token_latency_seconds": ("itl_ms", 1e3),
                     "sglang:e2e_request_latency_seconds": ("e2e_ms", 1e3),
                     "sglang:queue_time_seconds": ("loop_queue_ms", 1e3),  # (queue_time_start: the same)
                     "sglang:request_time_per_output_token_seconds": ("tpot_ms", 1e3)}
SGLANG_KIND = "SGLang /metrics"
#: text-generation-inference's router histograms (router/src/server.rs), the two that are one of schedlab's
#: statistics: a request's whole time in the router, and its time queued before its first batch. Not read:
#: tgi_request_mean_time_per_token_duration (its inference time -- prefill included -- over every generated
#: token: not TPOT's (latency - TTFT) / (tokens - 1)), tgi_request_inference_duration and the tgi_batch_*
#: durations (no such statistic); TGI has no TTFT histogram
TGI_PROMETHEUS = {"tgi_request_duration": ("e2e_ms", 1e3), "tgi_request_queue_duration": ("queue_ms", 1e3)}
TGI_KIND = "TGI /metrics"
#: each engine's histograms, by the kind of a scrape of its /metrics (and the engine's name, for messages)
SCRAPES = {PROMETHEUS_KIND: ("vLLM", PROMETHEUS), SGLANG_KIND: ("SGLang", SGLANG_PROMETHEUS),
           TGI_KIND: ("TGI", TGI_PROMETHEUS)}
#: every histogram a scrape is read for, and its group and scale
SCRAPE_HISTOGRAMS = {**PROMETHEUS, **SGLANG_PROMETHEUS, **TGI_PROMETHEUS}
#: the kinds of summary measured by the server (the engine's own metrics), read in the engine's view
ENGINE_KINDS = (PROMETHEUS_KIND, INFERENCE_PERF_SERVER_KIND, SGLANG_KIND, TGI_KIND)
#: the kinds whose TPOT is vLLM's per-request histogram, a request of one output token observed as 0
ZERO_TPOT_KINDS = (PROMETHEUS_KIND, INFERENCE_PERF_SERVER_KIND)
#: SGLang's bench_serving (python/sglang/bench_serving.py): field infix per group (vLLM's names but e2e_latency)
SGLANG_BENCH = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e_latency": "e2e_ms"}
SGLANG_BENCH_RATES = {"request_throughput": "request_throughput_rps", "output_throughput": "output_throughput_tps",
                      "total_throughput": "total_throughput_tps"}
SGLANG_BENCH_KIND = "sglang bench_serving"
#: its --backend values that stream from SGLang's native /generate (the default, "sglang"), whose client counts an
#: ITL per token (:func:`_per_token_itl`); its OpenAI backends ("sglang-oai", "vllm" ...) count one per chunk
SGLANG_NATIVE_BACKENDS = ("sglang", "sglang-native")
#: genai-perf's profile_export_genai_perf.json and AIPerf's profile_export_aiperf.json: <name>.{unit, avg, p1 ...
#: p99} -> group. Their inter_token_latency is per request, (latency - TTFT) / (output tokens - 1): a TPOT;
#: AIPerf's inter_chunk_latency is every gap between two chunks of a stream: the ITL
GENAI_PERF = {"time_to_first_token": "ttft_ms", "inter_token_latency": "tpot_ms", "inter_chunk_latency": "itl_ms",
              "request_latency": "e2e_ms"}
GENAI_PERF_RATES = {"request_throughput": "request_throughput_rps", "output_token_throughput": "output_throughput_tps"}
#: the time units they write (genai-perf: ms; AIPerf: its MetricTimeUnit tags), in ms
GENAI_PERF_UNITS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1e3, "s": 1e3}
#: the groups a load generator measures only when the response is streamed
STREAMED = ("ttft_ms", "tpot_ms", "itl_ms")
#: quantiles read from each Prometheus histogram (beside its exact mean)
HISTOGRAM_QUANTILES = (50, 90, 99)
#: Where a server's own TTFT and E2E histograms start a request's clock (``Summary.ttft_from``), read in the
#: engine's view by :func:`simulated`: ``"api_server"``, when the API server received it -- before its wait for a
#: handler, the chat template and tokenizing; in a run with a ``[frontend]``, ``sent_ms + network_ms``
#: (:mod:`schedlab.frontend`) -- or ``"engine"``, when the engine's queue got it (``arrival_ms``, after all that).
#: Without a ``[frontend]`` the two are one.
API_SERVER, ENGINE = "api_server", "engine"
TTFT_STARTS = (API_SERVER, ENGINE)
#: The first vLLM release whose renderer stamps ``arrival_time`` (the start of ``vllm:time_to_first_token_seconds``
#: and ``vllm:e2e_request_latency_seconds``) first thing in ``render_chat_async`` / ``render_cmpl_async``
#: (``vllm/renderers/base.py``, new in 0.17.0), before the wait for the renderer's executor, the chat template and
#: the tokenizer. Up to 0.16 the OpenAI server rendered and tokenized first and ``InputProcessor.process_inputs``
#: (0.11: ``Processor.process_inputs``) stamped ``arrival_time = time.time()`` after: the engine's arrival
VLLM_RENDERER_RELEASE = "0.17.0"
#: where vLLM's histograms start in the vLLM schedlab's presets model (0.33, >= VLLM_RENDERER_RELEASE); a
#: ``[target]``'s ``vllm_ttft_from`` says it for another version
VLLM_TTFT_FROM = API_SERVER
#: ... and every server's, by ``Summary.server``: SGLang's tokenizer manager times from ``received_time``, stamped
#: when its OpenAI handler took the request (``OpenAIServingBase.handle_request``), before the chat template and
#: the tokenizer (``TokenizerManager._init_req_state`` runs before ``_tokenize_one_request``); TGI's router
#: histograms are read from the engine's arrival, as before (though ``tgi_request_duration`` runs from
#: ``start_time``, taken before validation and tokenizing, ``router/src/server.rs``: not changed yet)
SERVER_TTFT_FROM = {"vllm": VLLM_TTFT_FROM, "sglang": API_SERVER, "tgi": ENGINE}
#: the server whose histograms each kind of scrape holds
SCRAPE_SERVER = {PROMETHEUS_KIND: "vllm", SGLANG_KIND: "sglang", TGI_KIND: "tgi"}


class TargetWarning(InputWarning):
    """Statistics of a target file left out that the file does hold (a non-streaming run's TTFT,
    TPOT and ITL)."""


@attrs.frozen
class Histogram:
    """A Prometheus histogram: cumulative ``counts`` at the upper ``bounds`` (the last one is
    +Inf), in ms (or tokens), and the sum of the observations."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float

    @property
    def count(self) -> float:
        return self.counts[-1]

    def quantile(self, q: float) -> float:
        """Prometheus' ``histogram_quantile``: linear inside the bucket holding rank q * count
        (from 0 for the first bucket); the last finite bound when the rank is in +Inf's."""
        return bucket_quantile(self.bounds, self.counts, q)

    def beyond_last_bound(self, q: float) -> bool:
        """Whether rank q * count falls in the +Inf bucket (above the last finite bound's count):
        ``histogram_quantile`` then gives the last finite bound, whatever the observations -- no value."""
        return len(self.counts) < 2 or q * self.count > self.counts[-2]


def bucket_quantile(bounds, counts, q: float) -> float:
    """``histogram_quantile(q)`` of cumulative ``counts`` at upper ``bounds`` (last = +Inf)."""
    total = counts[-1]
    if not total > 0:
        return float("nan")
    rank = q * total
    i = int(np.searchsorted(np.asarray(counts), rank, side="left"))
    i = min(i, len(bounds) - 1)
    if math.isinf(bounds[i]):
        return float(bounds[i - 1]) if i > 0 else float("nan")
    lower = bounds[i - 1] if i > 0 else 0.0
    below = counts[i - 1] if i > 0 else 0.0
    inside = counts[i] - below
    if inside <= 0:
        return float(bounds[i])
    return float(lower + (bounds[i] - lower) * (rank - below) / inside)


@attrs.frozen
class Summary:
    """Measured summary statistics (``values``: statistic name -> value), their source, and the
    histograms quantiles were read from (Prometheus)."""

    source: str
    kind: str
    values: dict[str, float]
    histograms: dict[str, Histogram] = attrs.field(factory=dict)
    requests: int | None = None
    #: statistics of the file left out, and why (``{"mean_itl_ms": "nan"}``): null (how the tools
    #: write a statistic they have no value for) or not finite
    dropped: dict[str, str] = attrs.field(factory=dict)
    #: the run's ``max_num_seqs`` where the file says it (ML.ENERGY's): ``B`` of its steady state
    batch: int | None = None
    #: the GPUs the run served on, where the file says it (ML.ENERGY's ``num_gpus``)
    gpus: int | None = None
    #: mean prompt and output tokens of a completed request, where the file says them (a
    #: benchmark's ``total_input_tokens`` and ``total_output_tokens`` over ``completed``)
    tokens: tuple[float, float] | None = None
    #: the rate the client sent at (requests/s), where the file says it and it is finite
    sent_rate: float | None = None
    #: the model the benchmark served, where the file says it (a Hugging Face id: ``model_id``)
    model: str | None = None
    #: a ``vllm bench serve`` file's wait from the start of its benchmark (where its duration starts)
    #: to its first send, in ms (:func:`bench_first_gap_s`; an ML.ENERGY file's, which names no
    #: rate, is 0): its throughputs are read over the simulated run's duration taken the same way;
    #: None for the other tools, whose span starts at the first send
    first_gap_ms: float | None = None
    #: how far the window of an inference-perf server rate runs past the run, in s: its Prometheus
    #: queries cover ``scrape_interval`` + 2 s more (:func:`_inference_perf_window_pad_s`); 0 otherwise
    window_pad_s: float = 0.0
    #: whether the file's ITL counts each token of a step that gave several (speculative decoding)
    #: rather than the step: SGLang's native client and /metrics, inference-perf's lifecycle report
    #: (:func:`_per_token_itl`)
    itl_per_token: bool = False
    #: what the reader has to say about the file, each ``(one-line message, the statistics it is about,
    #: the keys of dropped it explains)``: said in a :class:`TargetWarning` by :func:`read_summary`,
    #: unless its statistics are none of those compared
    notes: tuple = ()
    #: whose own histograms these are (``"vllm"``, ``"sglang"``, ``"tgi"``: a scrape of its /metrics, an
    #: inference-perf server report), None for a load generator's file
    server: str | None = None
    #: where the file's TTFT and E2E start a request's clock in the engine's view (:data:`TTFT_STARTS`): the
    #: server's default (:data:`SERVER_TTFT_FROM`), or a ``[target]``'s ``vllm_ttft_from``
    ttft_from: str = ENGINE

    def __attrs_post_init__(self):
        """Refuse percentiles that fall as the quantile rises (a p99 below the p50 was fitted to)."""
        by_group: dict[str, list[tuple[float, float]]] = {}
        for name, value in self.values.items():
            group, _, stat = name.partition(".")
            if stat.startswith("p") and math.isfinite(value):
                by_group.setdefault(group, []).append((float(stat[1:]), value))
        for group, points in by_group.items():
            points.sort()
            for (q_low, low), (q_high, high) in zip(points, points[1:]):
                if high < low * (1 - 1e-9):
                    raise ConfigError(f"{self.source}: {group}.p{q_high:g} ({high:g}) is below {group}.p{q_low:g} "
                                      f"({low:g}): a percentile never falls as the quantile rises")

    @property
    def view(self) -> str:
        """Whose times these are: ``"engine"`` (the engine's own metrics -- vLLM's, SGLang's, TGI's
        -- from a request's arrival at the server: the API server or the engine's queue, ``ttft_from``)
        or ``"client"`` (a load generator's, from sending it to the first and last byte); the
        simulation is read in the same view."""
        return "engine" if self.kind in ENGINE_KINDS else "client"

    def select(self, names: list[str] | None) -> "Summary":
        """Only the statistics ``names`` (all when None).

        :raises ConfigError: a name the file does not hold (the message lists those it does).
        """
        if not names:
            return self
        unknown = [n for n in names if n not in self.values]
        if unknown:
            raise ConfigError(f"--statistics: {self.source} holds no {unknown[0]!r}; it holds "
                              f"{', '.join(self.values)}")
        return attrs.evolve(self, values={n: self.values[n] for n in names})


# --- reading ----------------------------------------------------------------------------------------


#: What the messages of :func:`read_summary` call the file, its baseline and index: the options
#: of ``schedlab calibrate``, or the keys of a run's ``[target]`` table.
CLI_NAMES = {"path": "--target", "baseline": "--target-baseline", "index": "--target-index"}
TABLE_NAMES = {"path": "path", "baseline": "baseline", "index": "index"}


def read_summary(path, *, baseline=None, index: int | None = None, names: dict[str, str] = CLI_NAMES,
                 statistics=None) -> Summary:
    """The summary statistics in ``path`` (format recognised by content; see the module docstring).

    :param baseline: a Prometheus scrape taken before the run (of the same server), subtracted from
        ``path``'s.
    :param index: which benchmark of a guidellm report with several (None: the first), or which
        JSON document of a file holding several (None: the last); refused for the other files.
    :param names: what the messages call ``path``, ``baseline`` and ``index``
        (:data:`CLI_NAMES`, or :data:`TABLE_NAMES` for a ``[target]`` table).
    :param statistics: the statistics to be compared (None: all): the file's notes
        (``Summary.notes``) about none of them are not said.
    :raises ConfigError: a missing or unreadable file, one in none of the formats, a statistic
        that is not a number, or a file without a usable statistic.
    """
    path = Path(path)
    text = _read_text(path, names["path"])
    where = f"{names['path']} {path}"
    if _looks_prometheus(text):
        if index is not None:
            raise ConfigError(f"{names['index']} {index}: only a guidellm report holds several benchmarks, or a file "
                              f"several JSON documents; {path} is a Prometheus scrape")
        after = _parse_prometheus(text, str(path))
        kind = _scrape_kind(after, where)
        before = {}
        if baseline:
            before_text = _read_text(Path(baseline), names["baseline"])
            if not _looks_prometheus(before_text):
                raise ConfigError(f"{names['baseline']} {baseline}: not a Prometheus scrape (the baseline is a "
                                  f"scrape of /metrics taken before the run)")
            before = _parse_prometheus(before_text, str(baseline))
            other = _scrape_kind(before, f"{names['baseline']} {baseline}") if before else kind
            if other != kind:
                raise ConfigError(f"{names['baseline']} {baseline}: a scrape of {SCRAPES[other][0]}'s /metrics, but "
                                  f"{path} is {SCRAPES[kind][0]}'s: the baseline is the same server's, before the run")
        if not after:
            _refuse_renamed(text, where)
        return _say_notes(_prometheus_summary(after, before, str(path), where, f"{names['baseline']} {baseline}",
                                              kind), statistics)
    if baseline:
        raise ConfigError(f"{names['baseline']}: only a Prometheus scrape has a baseline; {path} is not one")
    source = str(path)
    documents = _json_documents(text, path, where, index, names['index'])
    if all(isinstance(d, dict) and VLLM_LOG_FIELDS <= d.keys() for d in documents[:3]):
        raise ConfigError(f"{where}: a per-request vLLM log (a request a line, with "
                          f"{', '.join(sorted(VLLM_LOG_FIELDS))}), not a summary of a run: replay it as the "
                          "workload ([workload] kind = \"vllm_log\"), and each run is compared with it")
    if len(documents) > 1:   # vllm bench serve --append-result: one document per run
        chosen = len(documents) - 1 if index is None else index
        if not 0 <= chosen < len(documents):
            raise ConfigError(f"{names['index']} {index}: {path} holds {len(documents)} JSON documents (runs "
                              f"appended to one file, as by vllm bench serve --append-result): 0..{len(documents) - 1}")
        label = f" (document {chosen} of {len(documents)})"
        data, index, source, where = documents[chosen], None, source + label, where + label
        benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
        if isinstance(benchmarks, list) and len(benchmarks) > 1:
            raise ConfigError(f"{where}: a guidellm report of {len(benchmarks)} benchmarks in a file of several JSON "
                              f"documents: {names['index']} picks the document; save each report to its own file")
    else:
        data = documents[0]
    if isinstance(data, dict) and any(f"{stat}_e2e_latency_ms" in data for stat in ("mean", "median")):
        summary = _sglang_bench_summary(data, source, where)
    elif isinstance(data, dict) and "steady_state_energy_per_token" in data:
        summary = _mlenergy_summary(data, source, where, path)
    elif isinstance(data, dict) and any(f"mean_{k}_ms" in data for k in BENCH):
        summary = _bench_summary(data, source, where)
    elif isinstance(data, dict) and isinstance(data.get("successes"), dict) and _server_side(data["successes"]):
        pad = _inference_perf_window_pad_s(path)
        summary = attrs.evolve(_inference_perf_server_summary(data, source, where, _inference_perf_server(path),
                                                              _inference_perf_client(path), pad), window_pad_s=pad)
    elif isinstance(data, dict) and isinstance(data.get("successes"), dict):
        summary = _inference_perf_summary(data, source, where)
    elif isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        return _say_notes(_usable(_guidellm_summary(data, source, 0 if index is None else index, where, names),
                                  where), statistics)
    elif isinstance(data, dict) and any(isinstance(data.get(key), dict) and "avg" in data[key]
                                        for key in (*GENAI_PERF, *GENAI_PERF_RATES)):
        summary = _genai_perf_summary(data, source, where)
    else:
        raise ConfigError(f"{where}: not a vllm bench serve result, an inference-perf or guidellm report, "
                          f"or a Prometheus scrape (nor an SGLang bench_serving result or a genai-perf or AIPerf "
                          f"report)")
    if index is not None:
        raise ConfigError(f"{names['index']} {index}: only a guidellm report holds several benchmarks, or a file "
                          f"several JSON documents; {path} is a {summary.kind} file")
    return _say_notes(_usable(summary, where), statistics)


def _say_notes(summary: Summary, statistics=None) -> Summary:
    """``summary``, its notes said in a :class:`TargetWarning` each -- but those about none of
    ``statistics`` (the statistics compared; None: all)."""
    for message, about, _ in summary.notes:
        if statistics is None or any(name in statistics for name in about):
            warnings.warn(message, TargetWarning, stacklevel=3)
    return summary


def _read_text(path: Path, name: str) -> str:
    """The text of the file ``name`` (an option or a table's key) gives, or a ConfigError. UTF-8,
    with or without a byte-order mark (Windows tools write one); UTF-16 is named as such."""
    problem = not_regular_file(path)
    if problem:
        raise ConfigError(f"{name} {path}: {problem}")
    if not path.is_file():
        raise ConfigError(f"{name} {path}: file not found")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name} {path}: cannot be read ({exc.__class__.__name__}: {exc})") from None
    if looks_utf16(raw):
        raise ConfigError(f"{name} {path}: {UTF16_ADVICE}")
    if raw.startswith(b"\x1f\x8b"):
        raise ConfigError(f"{name} {path}: gzip-compressed: decompress it first (gunzip)")
    if raw.startswith(b"version https://git-lfs.github.com/spec/"):
        raise ConfigError(f"{name} {path}: this is a Git LFS pointer, not the data: run git lfs pull in its clone")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name} {path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): "
                          f"save it as UTF-8") from None


_SPACE = re.compile(r"\s*")
#: a YAML mapping's first line: ``key:`` (guidellm's YAML report begins ``args:`` or ``benchmarks:``)
_YAML_START = re.compile(r"(?:---|[A-Za-z_][\w-]*:)(?:\s|$)")


def _json_documents(text: str, path: Path, where: str, index: int | None, index_name: str) -> list:
    """The JSON documents of ``text``: one, or several one after the other (``vllm bench serve
    --append-result`` appends each run's). A YAML file (guidellm writes one) is read with
    PyYAML where it is installed, else refused saying how to write the JSON report. When a later
    document is broken (a run killed while its result was written), the ones before it are read
    if ``index`` picks one of them, with a warning.

    :raises ConfigError: an empty file, text that is no JSON, or a later document that is not
        (and ``index`` picks none before it).
    """
    start = _SPACE.match(text).end()
    if start == len(text):
        raise ConfigError(f"{where}: the file is empty")
    duplicates: list = []
    try:
        documents = json_documents(text, duplicates)
    except JsonTextError as exc:
        if exc.document > 1:
            whole = documents_before_break(exc, index)
            if whole is not None:
                warnings.warn(f"{where}: {cut_short_note(exc, index)}", TargetWarning, stacklevel=4)
                return whole
            raise ConfigError(f"{where}: not JSON ({exc.detail}); the {exc.document - 1} document(s) before it "
                              f"are whole: {index_name} 0..{exc.document - 2} reads one") from None
        if exc.line is not None and (path.suffix.lower() in (".yaml", ".yml") or _YAML_START.match(text, start)):
            return [_yaml_document(text, where)]
        raise ConfigError(f"{where}: neither JSON ({exc.where}) nor a Prometheus scrape") from None
    if duplicates:   # (json keeps the last value)
        named = ", ".join(dict.fromkeys(map(str, duplicates)))
        warnings.warn(f"{where}: {named} given twice in one object: the last value is read (an edited file, or "
                      "two joined?)", TargetWarning, stacklevel=4)
    return documents


def _yaml_document(text: str, where: str):
    """A YAML file's document (a guidellm report saved as ``.yaml``), with PyYAML -- not one of
    schedlab's dependencies: without it, a ConfigError saying to save the JSON report."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{where}: a YAML file; schedlab reads guidellm's JSON report (PyYAML is not installed): "
                          f"write it with --output-path report.json") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: neither JSON nor YAML ({' '.join(str(exc).split())[:200]})") from None


def _usable(summary: Summary, where: str) -> Summary:
    """``summary``, when it holds a statistic; else an error saying what the file held."""
    if summary.values:
        return summary
    if summary.dropped:
        found = "; ".join(f"{key} is {why}" for key, why in summary.dropped.items())
        raise ConfigError(f"{where}: no usable statistics: {found} (null is read as a statistic the tool had no "
                          f"value for; a statistic must be a finite number)")
    raise ConfigError(f"{where}: no usable statistics: the {summary.kind} file holds none of the statistics "
                      f"schedlab reads (see schedlab/targets.py)")


def _percentile(number: str, key: str, where: str) -> str:
    """``p<number>``, the statistic a file's percentile key names (``p99_ttft_ms``, genai-perf's
    ``p99``); one above 100 is refused (numpy's error on it was a traceback)."""
    if not float(number) <= 100:
        raise ConfigError(f"{where}: {key}: a percentile is from 0 to 100, got {number}")
    return f"p{number}"


def _request_count(raw, key: str, where: str) -> int | None:
    """A file's count of requests (``completed``, ``successes.count``, ...): None where it gives none
    (absent, null, not a number, beyond a float's range), else a whole number >= 0 (-3 and 1e300
    were printed as counts, 20.7 cut to 20)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    value = _float(raw)
    if math.isinf(value) and value > 0:  # (a JSON integer beyond a float's range: no number, as for a statistic)
        return None
    if not (math.isfinite(value) and value >= 0 and value == int(value) and value <= 2 ** 53):
        raise ConfigError(f"{where}: {key}: a count of requests is a whole number >= 0, got {raw!r}")
    return int(value)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = _float(value)
    return value if math.isfinite(value) else None


def _float(value: int | float) -> float:
    """``value`` as a float; a JSON integer beyond a float's range as infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _statistic(raw, key: str, where: str, dropped: dict[str, str]) -> float | None:
    """A statistic's value in a report: a finite number, or None -- noted in ``dropped`` -- for
    null (how the tools write a statistic they have no value for) and for NaN or infinity.

    :raises ConfigError: a value that is not a number (text, true/false, a list ...) or is
        negative, naming ``key``.
    """
    if raw is None:
        dropped[key] = "null"
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ConfigError(f"{where}: {key}: must be a number, got {raw!r}")
    value = _float(raw)
    if not math.isfinite(value):
        dropped[key] = str(value)
        return None
    if value < 0:  # every statistic here is a latency or a rate
        raise ConfigError(f"{where}: {key}: a latency or rate cannot be negative, got {raw!r}")
    return value


def _workload_shape(data: dict) -> dict:
    """``tokens``, ``sent_rate`` and ``model`` of a benchmark file (vLLM's and SGLang's): the mean
    prompt and output of a completed request, the client's finite ``request_rate`` and the
    ``model_id`` served. Only a check of the experiment's workload against the benchmark's, so a
    value missing or not a number is left out."""
    def number(key):
        raw = data.get(key)
        value = _float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else math.nan
        return value if math.isfinite(value) and value > 0 else None

    done, prompt, output, rate = (number(k) for k in ("completed", "total_input_tokens", "total_output_tokens",
                                                       "request_rate"))
    model = data.get("model_id")
    return {"tokens": (prompt / done, output / done) if done and prompt and output else None, "sent_rate": rate,
            "model": model if isinstance(model, str) and model.strip() else None}


def _bench_summary(data: dict, source: str, where: str) -> Summary:
    _refuse_all_failed(data.get("completed"), "completed", data.get("failed"), "failed", where)
    values: dict[str, float] = {}
    keys: dict[str, str] = {}
    dropped: dict[str, str] = {}
    pattern = re.compile(r"^(mean|median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")
    for key, raw in data.items():
        match = pattern.match(key)
        if match is None:
            continue
        value = _statistic(raw, key, where, dropped)
        if value is None:
            continue
        stat = "mean" if match.group(1) == "mean" else "p50" if match.group(1) == "median" else \
            _percentile(match.group(2), key, where)
        name = f"{BENCH[match.group(3)]}.{stat}"
        if name in values and not math.isclose(values[name], value, rel_tol=1e-9, abs_tol=1e-9):
            # (--metric-percentiles 50 writes p50_ beside median_, both numpy's median of one list)
            raise ConfigError(f"{where}: {keys[name]} ({values[name]:g}) and {key} ({value:g}) are the same statistic "
                              f"but disagree: is the file edited, or two runs' joined?")
        values[name] = value
        keys[name] = key
    for alias, key in BENCH_RATE_ALIASES.items():
        if key not in data and alias in data:
            data = {**data, key: data[alias]}
            keys[BENCH_RATES[key]] = alias
    for key, name in BENCH_RATES.items():
        value = _statistic(data[key], keys.get(name, key), where, dropped) if key in data else None
        if value is not None:
            values[name] = value
    goodput = _statistic(data["request_goodput"], "request_goodput", where, dropped) \
        if data.get("request_goodput") is not None else None   # (null without --goodput: not a statistic lost)
    if goodput is not None:
        values[BENCH_GOODPUT] = goodput
    gap = bench_first_gap_s(data)
    return Summary(source, BENCH_KIND, _ordered(_streamed_only(values, keys, dropped, where)),
                   requests=_request_count(data.get("completed"), "completed", where), dropped=dropped,
                   first_gap_ms=None if gap is None else gap * 1e3, **_workload_shape(data))


def _bench_rate(value) -> float | None:
    """A rate a ``vllm bench serve`` file writes (``request_rate``: a number or ``"inf"``;
    ``ramp_up_start_rps``): a float > 0, inf, or None when it is none of them."""
    if value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)


def bench_first_gap_s(data: dict) -> float | None:
    """How long ``vllm bench serve`` waited from the start of its benchmark to sending its first
    request, in seconds; None when the file cannot say (a ``request_rate`` that is no number,
    SGLang's ``"trace"``). A file without ``request_rate`` is read at vLLM's default, inf.

    Its ``duration`` runs from ``benchmark_start_time``, taken before ``get_request`` yields the
    first request, to the last response (failed ones too); ``get_request`` sleeps until each
    request's cumulative delay, and draws a delay for every request, the first included
    (``vllm/benchmarks/serve.py``). So the first send comes one gap after the start:

    * ``--request-rate inf`` (no ramp-up): 0;
    * ``--burstiness inf``: ``1 / rate``, or ``1 / ramp_up_start_rps`` with a ramp-up;
    * otherwise a gamma draw (without a ramp-up rescaled with the others so that the last
      request goes ``n / rate`` after the start). ``start_times`` are ``time.perf_counter()``
      readings, whose origin is arbitrary, but the start is the end less ``duration``, and the
      end is the last response: the gap is ``min(start_times) - (max(start_times + latencies) -
      duration)``, read so where the file holds the lists (``--save-detailed``) and every
      request succeeded (a failed request's end is not recorded); else the draw's mean, ``1 /
      rate`` (a rescaled first gap averages ``n / rate`` times ``E[g_1 / sum g] = 1 / n``) or
      ``1 / ramp_up_start_rps``."""
    rate = _bench_rate(data.get("request_rate", "inf"))
    if rate is None:
        return None
    ramp = data.get("ramp_up_strategy") is not None
    if ramp:
        rate = _bench_rate(data.get("ramp_up_start_rps"))
        if rate is None or math.isinf(rate):
            return None
    elif math.isinf(rate):
        return 0.0
    burstiness = data.get("burstiness", 1.0)
    if isinstance(burstiness, (int, float)) and not isinstance(burstiness, bool) and math.isinf(burstiness):
        return 1.0 / rate
    starts, latencies, errors = (data.get(k) for k in ("start_times", "latencies", "errors"))
    duration = _number(data.get("duration"))
    lists = [starts, latencies] + ([errors] if errors is not None else [])
    if duration is not None and all(isinstance(v, list) and v and len(v) == len(starts) for v in lists) \
            and not any(errors or []) and all(_number(v) is not None for v in (*starts, *latencies)):
        gap = min(starts) - (max(s + lat for s, lat in zip(starts, latencies)) - duration)
        if 0.0 <= gap <= duration:
            return float(gap)
    return 1.0 / rate


def _mlenergy_summary(data: dict, source: str, where: str, path: Path) -> Summary:
    """An ML.ENERGY benchmark ``results.json``: ``vllm bench serve``'s statistics (it writes them
    under the same names) with the inter-token latencies as ML.ENERGY reports them
    (:func:`_mlenergy_itl`), and the steady state: energy per output token and power (all GPUs),
    output tokens per second, and -- from the ``prometheus.json`` the benchmark writes beside it
    -- the requests running on average. ``batch``: the run's ``max_num_seqs``."""
    bench = _bench_summary(data, source, where)
    values, dropped = dict(bench.values), dict(bench.dropped)
    values.update(_mlenergy_itl(data, [name for name in values if name.startswith("itl_ms.")]))
    per_token = _statistic(data.get("steady_state_energy_per_token"), "steady_state_energy_per_token", where, dropped)
    if per_token is not None:
        values["energy.steady_j_per_token"] = per_token
    energy = _statistic(data.get("steady_state_energy"), "steady_state_energy", where, dropped)
    seconds = _statistic(data.get("steady_state_duration"), "steady_state_duration", where, dropped)
    if energy is not None and seconds:
        values["energy.steady_power_w"] = energy / seconds
        if per_token:   # the benchmark divides the energy by the tokens counted over the window
            values["energy.steady_tokens_per_s"] = energy / per_token / seconds
    running = _mlenergy_running(path.with_name("prometheus.json"), where)
    if running is not None:
        values["energy.steady_batch"] = running
    batch, gpus = (positive_int(data.get(key)) for key in ("max_num_seqs", "num_gpus"))
    return attrs.evolve(bench, kind=MLENERGY_KIND, values=_ordered(values), dropped=dropped, batch=batch, gpus=gpus)


def positive_int(value) -> int | None:
    """``value`` when it is a whole number > 0 (not a bool), else None: a setting a file may hold."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _mlenergy_itl(data: dict, names: list[str]) -> dict[str, float]:
    """The inter-token latency statistics ``names`` (``itl_ms.mean``, ``itl_ms.p50`` ...) from the
    successful requests' ``itl`` lists, as ML.ENERGY's leaderboard computes them
    (``mlenergy_data``'s ``_client_itl_percentiles_ms``), or {} when the rows hold none. The
    benchmark appends a 0 for the first token and for every token that came in the same streamed
    chunk as the one before; the file's own ``mean_itl_ms`` ... count those zeros, which no step of
    an engine has. Here the zeros before the first gap are left out, and a gap followed by ``k``
    zeros counts as ``k + 1`` gaps of a ``k + 1``-th of it each."""
    rows = data.get("results")
    if not names or not isinstance(rows, list):
        return {}
    gaps = []
    for row in rows:
        if not isinstance(row, dict) or not mlenergy_succeeded(row) or not isinstance(row.get("itl"), list):
            continue
        try:
            itl = np.asarray(row["itl"], dtype=float)
        except (TypeError, ValueError):
            continue
        itl = itl[np.isfinite(itl)]
        heads = np.flatnonzero(itl != 0)   # a gap, or (never seen) a negative one, which ends a run of zeros
        if not heads.size:
            continue
        sizes = np.diff(np.append(heads, itl.size))   # each head and the zeros after it
        keep = itl[heads] > 0
        gaps.append(np.repeat(itl[heads][keep] / sizes[keep], sizes[keep]))
    if not gaps:
        return {}
    seconds = np.concatenate(gaps)
    if not seconds.size:
        return {}
    return {name: float((seconds.mean() if name == "itl_ms.mean"
                         else np.percentile(seconds, float(name.partition(".")[2][1:]))) * 1e3) for name in names}


def mlenergy_succeeded(row: dict) -> bool:
    """A request of an ML.ENERGY ``results.json`` that succeeded: ``success`` true (rows without
    that key: no ``error``)."""
    success = row.get("success")
    return success is True if "success" in row else not row.get("error")


def _mlenergy_running(path: Path, where: str) -> float | None:
    """The requests running on average over the steady state, from the ``prometheus.json`` the
    ML.ENERGY benchmark writes beside its ``results.json`` (``steady_state_stats``'
    ``vllm:num_requests_running``, summed over data-parallel engines), or None without one; an
    unreadable one is said in a :class:`TargetWarning` and left out."""
    if not path.is_file():
        return None
    try:
        stats = json.loads(path.read_text(encoding="utf-8-sig"))["steady_state_stats"]
        value = stats["vllm:num_requests_running"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"{where}: {path} holds no steady_state_stats.vllm:num_requests_running "
                      f"({type(exc).__name__}: {brief(str(exc))}): the steady state's batch is left out",
                      TargetWarning, stacklevel=4)
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        warnings.warn(f"{where}: {path}: steady_state_stats.vllm:num_requests_running is {brief(value)}, not a "
                      f"number of requests: the steady state's batch is left out", TargetWarning, stacklevel=4)
        return None
    return float(value)


def _refuse_all_failed(succeeded, succeeded_key: str, failed, failed_key: str, where: str) -> None:
    """Refuse the report of a run whose every request failed: its statistics are zeros or NaN of
    no request, nothing a simulation can be compared with."""
    if _number(succeeded) == 0:
        if not _number(failed):  # (0 failed: a run of no request; no count of failures: not known which)
            failures = f", {failed_key} is 0: an empty run?" if _number(failed) is not None else ""
            raise ConfigError(f"{where}: no request of the run completed ({succeeded_key} is 0{failures}): it has no "
                              f"statistic to compare with")
        raise ConfigError(f"{where}: every request of the run failed ({succeeded_key} is 0, {failed_key} is "
                          f"{_number(failed):g}): it has no statistic to compare with")


def _streamed_only(values: dict[str, float], keys: dict[str, str], dropped: dict[str, str],
                   where: str) -> dict[str, float]:
    """``values`` without the TTFT, TPOT and ITL of a non-streaming run -- every TTFT statistic
    exactly 0: the client saw only the whole response, so its TTFT is 0 and its TPOT the whole
    latency over the tokens -- noted in ``dropped`` (file keys from ``keys``) and said in a
    :class:`TargetWarning`. Kept when nothing else would be left (a file of zeros is refused
    where it is used, naming them)."""
    ttft = [name for name in values if name.partition(".")[0] == "ttft_ms"]
    streamed = [name for name in values if name.partition(".")[0] in STREAMED]
    if not ttft or any(values[name] != 0 for name in ttft) or len(streamed) == len(values):
        return values
    for name in streamed:
        dropped[keys[name]] = "of a non-streaming run"
    message = (f"{where}: every TTFT statistic is 0, as of a non-streaming run: its {len(streamed)} TTFT, TPOT and "
               f"ITL statistics are left out, the other {len(values) - len(streamed)} compared")
    warnings.warn(message, TargetWarning, stacklevel=4)
    return {name: value for name, value in values.items() if name not in streamed}


def _warn_non_streaming(where: str, reason: str, left_out: int, kept: int) -> None:
    """Say that a non-streaming run's TTFT, TPOT and ITL statistics are left out (``reason``: how the
    file shows the run was not streamed)."""
    warnings.warn(f"{where}: {reason}, as of a non-streaming run: its {left_out} TTFT, TPOT and ITL statistics "
                  f"are left out, the other {kept} compared", TargetWarning, stacklevel=4)


def _sglang_bench_summary(data: dict, source: str, where: str) -> Summary:
    """SGLang's ``python -m sglang.bench_serving --output-file FILE`` (sgl-project/sglang,
    ``python/sglang/bench_serving.py``): one JSON object per run, appended to the file (the last is
    read, or the one ``index`` names). vLLM's fields from the load generator's side -- ``mean_``,
    ``median_``, ``p90_``, ``p95_``, ``p99_`` of ``ttft``, ``tpot`` (``(latency - TTFT) / (tokens -
    1)``) and ``itl`` (every gap between two chunks with the OpenAI backends; with ``backend``
    ``sglang`` or ``sglang-native``, SGLang's ``/generate``, a chunk's gap over its tokens, once
    per token: ``itl_per_token``), in ms -- but E2E is ``*_e2e_latency_ms`` and the
    total throughput ``total_throughput``; versions without it write ``input_throughput`` and
    ``output_throughput`` over the same duration, whose sum it is. ``std_*``, ``concurrency`` and
    ``accept_length`` are no statistic here. A non-streaming run (``--disable-stream``) records no
    gap between tokens -- every ITL statistic is 0 (numpy's mean of ``[] or 0``) -- and its TTFT is
    the whole latency: its TTFT, TPOT and ITL are left out (noted in ``dropped``, with a
    :class:`TargetWarning`)."""
    _refuse_all_failed(data.get("completed"), "completed", None, "", where)
    pattern = re.compile(r"^(mean|median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2e_latency)_ms$")
    matched = [(key, pattern.match(key)) for key in data]
    matched = [(key, match) for key, match in matched if match is not None]
    itl = [data[key] for key, match in matched if match.group(3) == "itl"]
    streamed = not itl or any(_number(raw) != 0 for raw in itl)
    values: dict[str, float] = {}
    dropped: dict[str, str] = {}
    for key, match in matched:
        group = SGLANG_BENCH[match.group(3)]
        if not streamed and group in STREAMED:
            dropped[key] = "of a non-streaming run"
            continue
        value = _statistic(data[key], key, where, dropped)
        if value is not None:
            stat = "mean" if match.group(1) == "mean" else "p50" if match.group(1) == "median" else \
                _percentile(match.group(2), key, where)
            values[f"{group}.{stat}"] = value
    for key, name in SGLANG_BENCH_RATES.items():
        value = _statistic(data[key], key, where, dropped) if key in data else None
        if value is not None:
            values[name] = value
    if "total_throughput" not in data and "input_throughput" in data and "output_throughput" in data:
        parts = [_statistic(data[key], key, where, dropped) for key in ("input_throughput", "output_throughput")]
        if None not in parts:
            values["total_throughput_tps"] = parts[0] + parts[1]
    if not streamed:
        left_out = sum(why == "of a non-streaming run" for why in dropped.values())
        _warn_non_streaming(where, "every ITL statistic is 0", left_out, len(values))
    return Summary(source, SGLANG_BENCH_KIND, _ordered(values),
                   requests=_request_count(data.get("completed"), "completed", where), dropped=dropped,
                   itl_per_token=data.get("backend", "sglang") in SGLANG_NATIVE_BACKENDS, **_workload_shape(data))


def _genai_perf_summary(data: dict, source: str, where: str) -> Summary:
    """NVIDIA genai-perf's ``profile_export_genai_perf.json`` (triton-inference-server/perf_analyzer,
    ``genai-perf/genai_perf/export_data/json_exporter.py``, ``metrics/statistics.py``) or AIPerf's
    ``profile_export_aiperf.json``, which copies its layout (ai-dynamo/aiperf,
    ``aiperf/common/models/export_models.py``): top-level blocks ``{"unit": "ms", "avg", "p1", "p5",
    "p10", "p25", "p50", "p75", "p90", "p95", "p99", "min", "max", "std"}``, the load generator's
    view. Times are in the block's ``unit`` (genai-perf scales its nanoseconds to ms before writing;
    AIPerf writes its display unit, ms, and names others ``ns``, ``us``, ``sec``). Read:
    ``time_to_first_token``, ``request_latency`` (E2E), ``inter_token_latency`` -- per request
    ``(latency - TTFT) / (output tokens - 1)`` (``llm_profile_data_parser.py``; AIPerf's
    ``inter_token_latency_metric.py``): schedlab's TPOT --, AIPerf's ``inter_chunk_latency`` (every
    gap between two chunks: the ITL), and the ``avg`` of ``request_throughput`` and
    ``output_token_throughput``. Neither writes a total token throughput. A genai-perf run that was
    not streamed has one response per request: its TTFT is the request latency (equal in every
    statistic) and it is left out, with a :class:`TargetWarning`; AIPerf then writes none."""
    kind = "AIPerf" if "was_cancelled" in data or "error_summary" in data else "genai-perf"

    def avg(key):
        return data[key].get("avg") if isinstance(data.get(key), dict) else None

    _refuse_all_failed(avg("request_count"), "request_count.avg", avg("error_request_count"),
                       "error_request_count.avg", where)
    values: dict[str, float] = {}
    keys: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for key, group in GENAI_PERF.items():
        block = data.get(key)
        if not isinstance(block, dict):
            continue
        unit = block.get("unit", "ms")
        if not isinstance(unit, str) or unit not in GENAI_PERF_UNITS:
            raise ConfigError(f"{where}: {key}.unit: {unit!r} is not a time unit ({', '.join(GENAI_PERF_UNITS)})")
        for stat_key, raw in block.items():
            stat = "mean" if stat_key == "avg" else _percentile(stat_key[1:], f"{key}.{stat_key}", where) \
                if re.fullmatch(r"p\d+(?:\.\d+)?", stat_key) else None
            value = _statistic(raw, f"{key}.{stat_key}", where, dropped) if stat else None
            if value is not None:
                values[f"{group}.{stat}"] = value * GENAI_PERF_UNITS[unit]
                keys[f"{group}.{stat}"] = f"{key}.{stat_key}"
    for key, name in GENAI_PERF_RATES.items():
        block = data.get(key)
        value = _statistic(block["avg"], f"{key}.avg", where, dropped) if isinstance(block, dict) and "avg" in block \
            else None
        if value is not None:
            values[name] = value
    shared = [name.partition(".")[2] for name in values if name.startswith("ttft_ms.")
              and f"e2e_ms.{name.partition('.')[2]}" in values]
    if shared and all(values[f"ttft_ms.{stat}"] == values[f"e2e_ms.{stat}"] for stat in shared) and \
            not any(name.partition(".")[0] in ("tpot_ms", "itl_ms") for name in values):
        ttft = [name for name in values if name.startswith("ttft_ms.")]
        for name in ttft:
            dropped[keys[name]] = "of a non-streaming run"
            del values[name]
        _warn_non_streaming(where, "its TTFT is its request latency in every statistic", len(ttft), len(values))
    notes = ()
    if data.get("was_cancelled") is True:   # AIPerf stopped by Ctrl-C or its timeout: a partial run
        notes = ((f"{where}: the AIPerf run was cancelled (was_cancelled: true): its statistics cover only the "
                  "requests done before it stopped, not the workload the experiment replays", tuple(values), ()),)
    return Summary(source, kind, _ordered(values),
                   requests=_request_count(avg("request_count"), "request_count.avg", where), dropped=dropped,
                   notes=notes)


def _stat_name(key: str) -> str | None:
    if key == "mean":
        return "mean"
    if key == "median":
        return "p50"
    match = re.fullmatch(r"p(\d+(?:\.\d+)?)", key)
    return key if match else None


def _object(node, path: str, where: str) -> dict:
    """A report's block that must be a JSON object (``{}`` when absent or null)."""
    if node is None:
        return {}
    if not isinstance(node, dict):
        shape = {list: "a list", str: "text", bool: "true or false"}.get(type(node), "a number")
        raise ConfigError(f"{where}: {path}: expected an object ({{...}}), got {shape}: {json.dumps(node)[:60]}")
    return node


def _inference_perf_summary(data: dict, source: str, where: str) -> Summary:
    successes, failures = data["successes"], data.get("failures")
    _refuse_all_failed(successes.get("count"), "successes.count",
                       failures.get("count") if isinstance(failures, dict) else None, "failures.count", where)
    latency = _object(successes.get("latency"), "successes.latency", where)
    values: dict[str, float] = {}
    keys: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for key, group in INFERENCE_PERF.items():
        block = _object(latency.get(key), f"successes.latency.{key}", where)
        for stat_key, raw in block.items():
            stat = _stat_name(stat_key)
            value = _statistic(raw, f"successes.latency.{key}.{stat_key}", where, dropped) if stat else None
            if value is not None:
                values[f"{group}.{stat}"] = value * 1e3
                keys[f"{group}.{stat}"] = f"successes.latency.{key}.{stat_key}"
    throughput = _object(successes.get("throughput"), "successes.throughput", where)
    for key, name in INFERENCE_PERF_RATES.items():
        value = _statistic(throughput[key], f"successes.throughput.{key}", where, dropped) if key in throughput \
            else None
        if value is not None:
            values[name] = value
    notes = []
    signs = _sse_line_tokens(successes, latency)
    if signs:
        gone = [name for name in values if name.partition(".")[0] in ("tpot_ms", "itl_ms")]
        cause = "an inference-perf before PRs #410/#452/#566 (2026-04) timed each server-sent-event line, the blank " \
                "one after each event too, as a token"
        dropped.update({keys[name]: "of a client that counted SSE lines as tokens (inference-perf before #410)"
                        for name in gone})
        notes.append((f"{where}: {signs}: {cause}, so its time_per_output_token and inter_token_latency are not a "
                      f"TPOT and ITL; the {len(gone)} TPOT and ITL statistics are left out, the other "
                      f"{len(values) - len(gone)} compared", tuple(gone), tuple(keys[name] for name in gone)))
        values = {name: value for name, value in values.items() if name not in gone}
    return Summary(source, "inference-perf", _ordered(_streamed_only(values, keys, dropped, where)),
                   requests=_request_count(successes.get("count"), "successes.count", where), dropped=dropped,
                   itl_per_token=True, notes=tuple(notes))


#: the signs of an inference-perf lifecycle report that counted server-sent-event lines as tokens
#: (:func:`_sse_line_tokens`): TPOT x (output tokens - 1) under this share of the time from the first
#: token to the last, and an ITL median under this share of its mean
SSE_TPOT_SHARE = 0.7
SSE_ITL_MEDIAN_SHARE = 0.1


def _sse_line_tokens(successes: dict, latency: dict) -> str | None:
    """What shows, in an inference-perf lifecycle report, that its client counted server-sent-event
    lines as tokens (None when nothing does). Before PRs #410, #452 and #566 (2026-04; the KubeCon
    NA 2025 demo's reports, written by 7ff8150) the client took a timestamp for every line of the
    stream, the blank line after each event too, and its report divides a request's first-to-last
    time by those timestamps less one (``time_per_output_token``) and takes every gap between two
    (``inter_token_latency``). Each token has two timestamps microseconds apart, so:

    * ``time_per_output_token.mean x (output_len.mean - 1)`` is about half of
      ``request_latency.mean - time_to_first_token.mean`` (the time from the first token to the
      last, which ``output_len`` - 1 gaps span: ``output_len`` is counted from the text). A
      report that counts tokens gives about all of it; under 0.7 of it is the sign.
    * ``inter_token_latency``'s median is one of the microsecond gaps (there are as many as
      tokens, one more than the real gaps), its mean half the real gap: a median under a tenth
      of the mean, and above 0, is the sign. A later client gives the tokens of one chunk (several
      under speculative decoding) the chunk's time: gaps of exactly 0, a median of 0 -- not the
      sign.
    """
    def mean(block, stat="mean"):
        return _number(block.get(stat)) if isinstance(block, dict) else None

    signs = []
    tpot, out = mean(latency.get("time_per_output_token")), mean(successes.get("output_len"))
    e2e, ttft = mean(latency.get("request_latency")), mean(latency.get("time_to_first_token"))
    if None not in (tpot, out, e2e, ttft) and out > 1 and e2e > ttft \
            and tpot * (out - 1) < SSE_TPOT_SHARE * (e2e - ttft):
        signs.append(f"time_per_output_token x (output_len - 1) = {tpot * 1e3:.4g} ms x {out - 1:.4g} is "
                     f"{tpot * (out - 1) / (e2e - ttft):.2f} of request_latency - time_to_first_token "
                     f"({(e2e - ttft) * 1e3:.4g} ms; means)")
    itl = latency.get("inter_token_latency")
    itl_mean, itl_median = mean(itl), mean(itl, "median")
    if None not in (itl_mean, itl_median) and 0 < itl_median < SSE_ITL_MEDIAN_SHARE * itl_mean:
        signs.append(f"inter_token_latency's median {itl_median * 1e3:.3g} ms is 1/{itl_mean / itl_median:.0f} of its "
                     f"mean {itl_mean * 1e3:.4g} ms")
    return "; ".join(signs) or None


def _server_side(successes: dict) -> bool:
    """Whether inference-perf's ``successes`` is its ``summary_prometheus_metrics.json``'s (the
    server's histograms at the top level) rather than ``summary_lifecycle_metrics.json``'s (the
    client's under ``latency``)."""
    return not isinstance(successes.get("latency"), dict) and \
        any(isinstance(successes.get(key), dict) for key in INFERENCE_PERF_SERVER)


#: what inference-perf's clients of other servers put under a vLLM name that is not its statistic:
#: its TGI client queries ``time_per_output_token`` from ``tgi_request_mean_time_per_token_duration``
#: (the inference time, prefill included, over every token) and gives ``prompt_len`` and
#: ``output_len`` rates of requests, not tokens (histograms' ``_count``); its SGLang client reads
#: ``sglang:time_per_output_token_seconds``, a running mean observed at every chunk
#: (``inference_perf/client/modelserver/tgi_client.py``, ``sglang_client.py``)
INFERENCE_PERF_NOT_READ = {"tgi": ("time_per_output_token", "prompt_len", "output_len"),
                           "sglang": ("time_per_output_token",)}


def _inference_perf_config(path: Path) -> tuple[Path, dict] | None:
    """The inference-perf ``config.yaml`` beside the report (or a folder up, where a run keeps its
    stages' reports) and what it holds (block or flow style: a YAML parser reads it); None when
    there is none, or, with a warning, when it is not YAML."""
    import yaml

    for folder in (path.parent, path.parent.parent):
        config = folder / "config.yaml"
        if not config.is_file():
            continue
        try:
            data = yaml.safe_load(config.read_text(encoding="utf-8", errors="replace"))
        except (OSError, yaml.YAMLError) as exc:
            warnings.warn(f"{config}: not readable as YAML ({brief(str(exc).splitlines()[0] if str(exc) else exc)}): "
                          "the report beside it is read as a vLLM server's, with inference-perf's default scrape "
                          "interval", TargetWarning, stacklevel=4)
            return None
        return config, data if isinstance(data, dict) else {}
    return None


def _config_value(data: dict, *keys: str):
    """``data[keys[0]][keys[1]]...``, or None where a level is missing or not a table."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _inference_perf_server(path: Path) -> str:
    """The ``server.type`` of the inference-perf ``config.yaml`` beside the report (or a folder
    up), lower case; ``vllm`` (inference-perf's default) when there is none."""
    config = _inference_perf_config(path)
    server = _config_value(config[1], "server", "type") if config else None
    return str(server).lower() if server else "vllm"


#: inference-perf's wait past a run's end before it queries Prometheus, beyond the scrape interval
#: (``PROMETHEUS_SCRAPE_BUFFER_SEC``), and its config's default scrape interval (``PrometheusClientConfig``)
INFERENCE_PERF_SCRAPE_BUFFER_S = 2.0
INFERENCE_PERF_SCRAPE_INTERVAL_S = 15.0


def _inference_perf_window_pad_s(path: Path) -> float:
    """How far the window of inference-perf's server rates runs past the run, in seconds:
    ``metrics.prometheus.scrape_interval`` of the ``config.yaml`` beside the report or a folder
    up (15, the config's default, without one; 0 is read as its client's fallback, 30) + 2. Its
    rates are ``sum(rate(X[{duration}s]))`` (``client/modelserver/metrics/counter/base.py``) over
    a window from the run's start to the query: the summary's queried after ``wait()`` of
    ``scrape_interval + PROMETHEUS_SCRAPE_BUFFER_SEC``, a stage's at its end + the same
    (``client/server_metrics/prometheus_client/base.py``), so a run's requests are divided by its
    span and that pad.

    :raises ConfigError: a ``scrape_interval`` that is not a number of seconds >= 0.
    """
    config = _inference_perf_config(path)
    raw = _config_value(config[1], "metrics", "prometheus", "scrape_interval") if config else None
    if raw is None or raw == "":
        return INFERENCE_PERF_SCRAPE_INTERVAL_S + INFERENCE_PERF_SCRAPE_BUFFER_S
    try:
        interval = math.nan if isinstance(raw, bool) else float(raw)
    except (TypeError, ValueError):
        interval = math.nan
    if not (math.isfinite(interval) and interval >= 0):
        raise ConfigError(f"{config[0]}: metrics.prometheus.scrape_interval: must be a number of seconds >= 0, got "
                          f"{raw!r}")
    return (interval or 30.0) + INFERENCE_PERF_SCRAPE_BUFFER_S


#: how many times the requests its client sent the server may count over an inference-perf Prometheus
#: window before the window is taken to hold other traffic (:func:`_other_traffic_limit`), beyond
#: what Prometheus' extrapolation of ``increase()`` adds; and the limit when the run's length is unknown
INFERENCE_PERF_OTHER_TRAFFIC = 1.2
INFERENCE_PERF_OTHER_TRAFFIC_UNTIMED = 1.5
#: inference-perf's Prometheus reports and the client's lifecycle report of the same run or stage
_INFERENCE_PERF_SIBLING = re.compile(r"^(summary|stage_\d+)_prometheus_metrics\.json$")


def _inference_perf_client(path: Path) -> tuple[str, int, float | None] | None:
    """The client's side of the run of inference-perf's Prometheus report ``path``: the
    ``stage_<k>_lifecycle_metrics.json`` beside a ``stage_<k>_prometheus_metrics.json`` (the
    ``summary_lifecycle_metrics.json`` beside the summary): its file name, the requests it sent
    (``successes.count`` + ``failures.count``: a request the client gave up on may have finished
    on the server) and the run's length in seconds (``load_summary.send_duration``, else
    ``benchmark_time_seconds``; None when it says neither). None without such a file, or when it
    cannot be read or gives no count: a check of the report, not a file to refuse."""
    match = _INFERENCE_PERF_SIBLING.match(path.name)
    if match is None:
        return None
    sibling = path.with_name(f"{match.group(1)}_lifecycle_metrics.json")
    if not sibling.is_file():   # (none, or a FIFO a read would wait on)
        return None
    try:
        data = json.loads(sibling.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError, RecursionError):
        return None
    successes = data.get("successes") if isinstance(data, dict) else None
    if not isinstance(successes, dict):
        return None
    count = _number(successes.get("count"))
    if count is None or count < 0:
        return None
    failures = data.get("failures")
    failed = _number(failures.get("count")) if isinstance(failures, dict) else None
    load = data.get("load_summary")
    run_s = _number(load.get("send_duration")) if isinstance(load, dict) else None
    if not run_s or run_s <= 0:
        run_s = _number(data.get("benchmark_time_seconds"))
    return sibling.name, int(count + (failed if failed and failed > 0 else 0)), run_s if run_s and run_s > 0 else None


def _other_traffic_limit(run_s: float | None, pad_s: float) -> float:
    """How many times its client's requests an inference-perf Prometheus report may count before its
    window is taken to hold other traffic: ``1.2 x (run + pad) / run``; 1.5 when the run's length
    is unknown.

    Why: a report's count is ``sum(increase(..._count[D]))`` over a window ``D`` from the run's
    start to ``pad`` (``scrape_interval`` + 2 s) past its end. Prometheus' ``increase()``
    extrapolates the growth between the window's first and last scrape to the window's edges,
    which -- the run's traffic all in its first ``run`` seconds -- counts up to ``(run + pad) /
    run`` times the requests (1.28 for a 60 s stage scraped every 15 s). The 1.2 beyond it takes
    in the rest of an honest difference: requests finished after the client gave up (counted
    among the client's, with its failures) and scrapes that land unevenly. A window with other
    traffic counts far more: the KubeCon NA 2025 reports of inference-perf count 2.0-2.2 times
    their client's requests at every stage and in the summary (series counted twice), 10-15
    times at stage 0 (warm-up). 1.5, without the run's length, is the limit of a 60 s stage
    at the default 15 s scrape interval (1.2 x 77 / 60 = 1.54)."""
    if run_s is None:
        return INFERENCE_PERF_OTHER_TRAFFIC_UNTIMED
    return INFERENCE_PERF_OTHER_TRAFFIC * (1.0 + pad_s / run_s)


def _inference_perf_server_summary(data: dict, source: str, where: str, server: str = "vllm",
                                   client: tuple[str, int, float | None] | None = None,
                                   pad_s: float = 0.0) -> Summary:
    """inference-perf's ``summary_prometheus_metrics.json``: the server's histograms as Prometheus
    summed them over the run, in seconds (vLLM's, or the same statistics of the ``server`` its
    ``config.yaml`` names); the engine's view. A statistic of exactly 0 is inference-perf's value
    for a metric the server does not expose (or that saw no observation): left out, noted in
    ``dropped``, as are those another server's client fills with no such statistic
    (:data:`INFERENCE_PERF_NOT_READ`). The percentiles are ``histogram_quantile`` inside the
    server's buckets, which the file does not give: read against the simulation's exact
    percentiles.

    A vLLM server's report without an ``inter_token_latency`` block is of an inference-perf before
    #348 (fccf5e4, 2026-02): its client queried ``time_per_output_token`` from
    ``vllm:time_per_output_token_seconds``, which vLLM observes at every gap between two tokens (the
    ITL; ``vllm:inter_token_latency_seconds`` since), not from the per-request
    ``vllm:request_time_per_output_token_seconds`` it queries since, when it writes both blocks.
    There it is read as ``itl_ms``, with a note.

    ``client``: the client's report of the same run (:func:`_inference_perf_client`). When the
    server counted more than :func:`_other_traffic_limit` times the requests it sent (``pad_s``:
    the window's pad), the Prometheus window held other traffic: the request and token rates
    and the count are left out (``dropped``), with a note naming both counts."""
    successes = data["successes"]
    not_read = INFERENCE_PERF_NOT_READ.get(server, ())
    if _number(successes.get("count")) == 0:
        raise ConfigError(f"{where}: the server counted no finished request over the run (successes.count is 0): it "
                          f"has no statistic to compare with")
    per_token = server == "vllm" and isinstance(successes.get("time_per_output_token"), dict) \
        and "inter_token_latency" not in successes   # (an inference-perf before #348)
    values: dict[str, float] = {}
    dropped: dict[str, str] = {}
    notes = []
    for key, (group, scale) in INFERENCE_PERF_SERVER.items():
        block = successes.get(key)
        if not isinstance(block, dict):
            continue
        if key in not_read:
            dropped[f"successes.{key}"] = f"not this statistic on a {server} server (its client's metric)"
            continue
        if key == "time_per_output_token" and per_token:
            group = "itl_ms"
        if group == "loop_queue_ms":
            group = INFERENCE_PERF_QUEUE_GROUP.get(server, group)
        for stat_key, raw in block.items():
            stat = _stat_name(stat_key)
            name = f"successes.{key}.{stat_key}"
            value = _statistic(raw, name, where, dropped) if stat else None
            if value == 0:
                dropped[name] = "0 (no such metric on the server, or no observation)"
            elif value is not None:
                values[f"{group}.{stat}"] = value * scale
    if per_token and any(name.startswith("itl_ms.") for name in values):
        notes.append((f"{where}: no inter_token_latency block, as from an inference-perf before #348 (2026-02), whose "
                      f"time_per_output_token is vLLM's per-token histogram vllm:time_per_output_token_seconds: read "
                      f"as the ITL (itl_ms), not a request's TPOT",
                      tuple(name for name in values if name.startswith("itl_ms.")), ()))
    def rate(key):
        block = successes.get(key)
        if key in not_read:
            if isinstance(block, dict) and block.get("rate") is not None:
                dropped[f"successes.{key}.rate"] = f"requests, not tokens, a second on a {server} server"
            return (f"successes.{key}.rate", None)
        return (f"successes.{key}.rate", block.get("rate") if isinstance(block, dict) else None)

    rates = {"request_throughput_rps": [("successes.rate", successes.get("rate"))],
             "output_throughput_tps": [rate("output_len")],
             "total_throughput_tps": [rate("prompt_len"), rate("output_len")]}
    read_rates: dict[str, list[str]] = {}
    for name, parts in rates.items():
        found = [_statistic(raw, key, where, dropped) if raw is not None else None for key, raw in parts]
        if all(value is not None for value in found) and sum(found) > 0:
            values[name] = sum(found)
            read_rates[name] = [key for key, _ in parts]
    requests = _request_count(successes.get("count"), "successes.count", where)
    if client is not None and requests is not None:
        sibling, sent, run_s = client
        limit = _other_traffic_limit(run_s, pad_s)
        if requests > limit * sent:
            why = f"the server's count over a Prometheus window with other traffic ({requests} against {sent} sent)"
            keys = ["successes.count", *dict.fromkeys(key for parts in read_rates.values() for key in parts)]
            dropped.update({key: why for key in keys})
            left_out = [name for name in read_rates if name in values]
            times = f"{requests / sent:.1f}x" if sent else "more than"
            notes.append((f"{where}: the server counted {requests} finished requests, {times} the {sent} its client "
                          f"sent ({sibling} beside it; the run's own traffic counts at most {limit:.2f}x): the "
                          f"report's Prometheus window holds other traffic (an earlier stage, warm-up, series counted "
                          f"twice); its request and token rates are left out, and its latency histograms hold that "
                          f"traffic too", tuple(values), tuple(keys)))   # (about every statistic: the latencies too)
            values = {name: value for name, value in values.items() if name not in left_out}
            requests = None
    return Summary(source, INFERENCE_PERF_SERVER_KIND, _ordered(values), requests=requests, dropped=dropped,
                   notes=tuple(notes), server=server, ttft_from=SERVER_TTFT_FROM.get(server, ENGINE))


def _guidellm_summary(data: dict, source: str, index: int, where: str, names: dict[str, str]) -> Summary:
    benchmarks = data["benchmarks"]
    if not benchmarks:
        raise ConfigError(f"{where}: the report's 'benchmarks' list is empty: guidellm saved no benchmark")
    if not 0 <= index < len(benchmarks):
        raise ConfigError(f"{names['index']} {index}: {source} holds benchmarks 0..{len(benchmarks) - 1}")
    metrics = _object(_object(benchmarks[index], f"benchmarks[{index}]", where).get("metrics"),
                      f"benchmarks[{index}].metrics", where)
    values: dict[str, float] = {}
    keys: dict[str, str] = {}
    dropped: dict[str, str] = {}

    def successful(key):
        path = f"benchmarks[{index}].metrics.{key}"
        return _object(_object(metrics.get(key), path, where).get("successful"), f"{path}.successful", where)

    for key, (group, scale) in GUIDELLM.items():
        dist = successful(key)
        if not dist:
            continue
        for stat_key in ("mean", "median"):
            value = _statistic(dist[stat_key], f"metrics.{key}.successful.{stat_key}", where, dropped) \
                if stat_key in dist else None
            if value is not None:
                values[f"{group}.{_stat_name(stat_key)}"] = value * scale
                keys[f"{group}.{_stat_name(stat_key)}"] = f"metrics.{key}.successful.{stat_key}"
        percentiles = _object(dist.get("percentiles"), f"benchmarks[{index}].metrics.{key}.successful.percentiles",
                              where)
        for stat_key, raw in percentiles.items():
            stat = _guidellm_percentile(stat_key)
            value = _statistic(raw, f"metrics.{key}.successful.percentiles.{stat_key}", where, dropped) if stat \
                else None
            if value is not None:
                values[f"{group}.{stat}"] = value * scale
                keys[f"{group}.{stat}"] = f"metrics.{key}.successful.percentiles.{stat_key}"
    for key, name in GUIDELLM_RATES.items():
        dist = successful(key)
        value = _statistic(dist["mean"], f"metrics.{key}.successful.mean", where, dropped) if "mean" in dist \
            else None
        if value is not None:
            values[name] = value
    count = _request_count(successful("request_latency").get("count"), "metrics.request_latency.successful.count",
                           f"{where} (benchmark {index})" if len(benchmarks) > 1 else where)
    label = f"{source} (benchmark {index} of {len(benchmarks)})" if len(benchmarks) > 1 else source
    _refuse_all_failed(count, "metrics.request_latency.successful.count", None, "",
                       f"{where} (benchmark {index})" if len(benchmarks) > 1 else where)
    return Summary(label, "guidellm", _ordered(_streamed_only(values, keys, dropped, where)),
                   requests=count, dropped=dropped)


def _guidellm_percentile(key: str) -> str | None:
    """guidellm names percentiles p001 (0.1), p01, p05, p10 ... p99, p999 (99.9)."""
    digits = {"p001": "0.1", "p999": "99.9"}.get(key)
    if digits is None:
        match = re.fullmatch(r"p(\d\d)", key)
        if match is None:
            return None
        digits = str(int(match.group(1)))
    return f"p{digits}"


#: The names a statistic of a summary can have (:func:`check_statistic_names`).
_STATISTIC = re.compile(r"^(?:(?:%s)\.(?:mean|p(\d+(?:\.\d+)?))|%s)$"
                        % ("|".join((*GROUPS, "iteration_tokens")),
                           "|".join((*THROUGHPUTS, *map(re.escape, (*STEADY_STATE, BENCH_GOODPUT))))))


def check_statistic_names(names, option: str) -> None:
    """Refuse a name no summary can hold (``ttft_ms.mean``, ``itl_ms.p99``, ``e2e_ms.p99.9``,
    ``request_throughput_rps`` ... are the names), before any file is read.

    :raises ConfigError: an empty list, or a name not of that form (``option`` is what the
        message calls the list: ``--statistics``, a table's ``statistics``).
    """
    if not names:
        raise ConfigError(f"{option}: names no statistic; leave it out to compare every statistic the file holds")
    for name in names:
        match = _STATISTIC.match(name)
        if match is None or (match.group(1) is not None and not float(match.group(1)) <= 100):
            raise ConfigError(f"{option}: {name!r} is not a statistic; statistics are named <group>.mean or "
                              f"<group>.pNN with the group one of {', '.join((*GROUPS, 'iteration_tokens'))} "
                              f"(e.g. ttft_ms.mean, itl_ms.p99), or one of "
                              f"{', '.join((*THROUGHPUTS, *STEADY_STATE, BENCH_GOODPUT))}")


#: a line of a Prometheus scrape that no YAML file has: ``# TYPE``/``# HELP``, or a sample ``name{...} value`` or
#: ``name value`` (a name not ending in ``:``, as YAML's ``key: value`` does)
_PROMETHEUS_LINE = re.compile(r"^(?:#[ \t]*(?:TYPE|HELP)[ \t]|[A-Za-z_:][\w:]*(?<!:)(?:\{[^\n]*\})?[ \t]+"
                              r"[-+]?(?:\d|\.\d|Inf|inf|NaN|nan))", re.M)
#: an engine's sample name, as the engine writes it (``vllm:``, ``sglang:``, ``tgi_``) or renamed (``vllm_``,
#: ``sglang_``)
_ENGINE_SAMPLE = re.compile(r'^(?:\{\s*")?(?:(?:vllm|sglang):[\w:]*|(?:vllm|sglang)_[\w:]*(?<!:)|tgi_\w*)[{\s"]', re.M)


def _looks_prometheus(text: str) -> bool:
    """Whether ``text`` is a Prometheus scrape: it names an engine's metric at the start of a line
    (renamed ones too: :func:`_refuse_renamed` says so), or begins with ``#`` and has a ``# TYPE`` or
    ``# HELP`` line or a sample line -- not a YAML report that begins with ``#`` comments."""
    head = text.lstrip()[:4096]
    if _ENGINE_SAMPLE.search(head):
        return True
    return head.startswith("#") and bool(_PROMETHEUS_LINE.search(head))


def _refuse_renamed(text: str, where: str) -> None:
    """Refuse a scrape that holds no histogram schedlab reads under the engine's own name but holds
    one renamed with ``_`` for ``:`` (``sglang_time_to_first_token_seconds``: sgl-router's aggregated
    ``/engine_metrics``, an OpenTelemetry or other exporter), saying so."""
    renamed = {}
    for match in re.finditer(r"^((?:vllm|sglang)_[\w:]*?)(?:_bucket|_sum|_count)?[{\s]", text, re.M):
        metric = match.group(1).replace("_", ":", 1)
        if metric in SCRAPE_HISTOGRAMS:
            renamed.setdefault(match.group(1), metric)
    if renamed:
        (name, metric), more = next(iter(renamed.items())), len(renamed) - 1
        raise ConfigError(f"{where}: holds {name}{f' (and {more} more)' if more else ''}, not {metric}: the engine's "
                          f"histograms renamed, ':' to '_' (sgl-router's aggregated /engine_metrics, an OpenTelemetry "
                          f"or other exporter); schedlab reads the engine's own names: scrape its /metrics directly "
                          f"(an OpenMetrics scrape that escapes ':' is read with its # TYPE lines kept)")


_NAME = re.compile(r"[A-Za-z_:][\w:]*")
#: what follows a sample's name and labels: its value, a timestamp, and an OpenMetrics exemplar
#: (`` # {trace_id="..."} 0.035 1.73e+09``), which is no part of the sample
_VALUE = re.compile(r"\s+([^\s#]\S*)(?:\s+[^\s#]\S*)?(?:\s+#.*)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_]\w*|"(?:[^"\\]|\\.)*")\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
#: Prometheus 3's UTF-8 names, quoted inside the braces: ``{"vllm:time_to_first_token_seconds_bucket", le="0.1"} 5``
#: (its text format 1.0.0 with ``escaping=allow-utf-8``; label names may be quoted too)
_QUOTED_NAME = re.compile(r'\{\s*"((?:[^"\\]|\\.)*)"\s*,?')
_INF = ("+Inf", "Inf", "inf", "+inf")


def _parse_prometheus(text: str, source: str) -> dict[str, dict]:
    """Each histogram of :data:`SCRAPE_HISTOGRAMS` (vLLM's, SGLang's and TGI's): ``{"buckets": {le:
    count}, "sum": s, "count": c}``,
    summed over its label sets (:func:`_sum_series`), each of which must be a histogram
    (:func:`_check_series`). An OpenMetrics exemplar after a value is no part of the sample.

    :raises ConfigError: naming the file and line: a line that is not a sample, a value that is
        not a finite number or a negative count, a bucket without a numeric ``le``, a label set
        without its ``+Inf`` bucket or its ``_sum``, buckets whose
        cumulative counts fall, a ``_count`` that is not the ``+Inf`` bucket's, a sample whose
        name and labels an earlier line has (a scrape holds one value per series: two scrapes
        joined, whose counts would add up).
    """
    series: dict[tuple[str, str], dict] = {}
    samples: dict[tuple, int] = {}   # (name, labels, bucket bound) -> the line that gave it
    escaped = _escaped_histograms(text)
    models: set = set()              # the model_name labels of its histograms (one server serves one)
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        sample = _split_sample(line)
        if sample is None:
            raise ConfigError(f"{source}: line {number}: not a Prometheus sample: {line[:80]!r}")
        name, braces, raw = sample
        labels = braces[1:-1]
        metric, suffix = _histogram_part(escaped.get(name, name))
        if metric is None:
            continue
        value = _sample_value(raw, name, suffix, f"{source}: line {number}")
        pairs = {key.strip('"'): value for key, value in _LABEL.findall(labels)}
        le = pairs.pop("le", None)
        if "model_name" in pairs:
            models.add(pairs["model_name"])
        label_set = ",".join(f"{k}={v}" for k, v in sorted(pairs.items()))
        bound = None
        if suffix == "_bucket":
            if le is None:
                raise ConfigError(f"{source}: line {number}: {name} without an le label")
            bound = _bucket_bound(le, name, f"{source}: line {number}")
        first = samples.setdefault((name, tuple(sorted(pairs.items())), bound), number)   # le="Inf" is "+Inf"
        if first != number:
            raise ConfigError(f"{source}: line {number}: {name}{braces} repeats the sample of line "
                              f"{first} (same metric, same labels): a scrape holds one sample per series -- two "
                              f"scrapes joined in one file?")
        entry = series.setdefault((metric, label_set), {"buckets": {}, "lines": {}, "sum": None, "count": None,
                                                        "line": number})
        if suffix == "_bucket":
            entry["buckets"][bound] = entry["buckets"].get(bound, 0.0) + value
            entry["lines"][bound] = number
        elif suffix == "_count":
            entry["count"] = (value + (entry["count"] or (0.0, 0))[0], number)
        else:
            entry["sum"] = value + (entry["sum"] or 0.0)
    found: dict[str, dict] = {}
    for (metric, label_set), entry in series.items():
        _check_series(metric, label_set, entry, source)
        total = found.setdefault(metric, {"buckets": {}, "sum": 0.0, "count": 0.0, "series": [], "labels": set()})
        total["series"].append(entry["buckets"])
        total["labels"].add(label_set)
        total["sum"] += entry["sum"]
        total["count"] += entry["count"][0] if entry["count"] is not None else entry["buckets"].get(math.inf, 0.0)
    for metric, total in found.items():
        total["buckets"] = _sum_series(total.pop("series"))
        if not all(map(math.isfinite, (total["sum"], total["count"], *total["buckets"].values()))):
            raise ConfigError(f"{source}: {metric}: its label sets' counts or sums add up past a float's range "
                              "(1.8e308): not a scrape of a server's observations")
    if len(models) > 1:  # (a gateway's or a federation's scrape: several servers' requests in one distribution)
        named = ", ".join(sorted(models)[:4]) + (", ..." if len(models) > 4 else "")
        warnings.warn(f"{source}: its histograms hold {len(models)} models (model_name {named}), summed as one "
                      "server's requests: scrape the server of the model you simulate, or keep its series only",
                      TargetWarning, stacklevel=4)
    return found


def _sum_series(series: list[dict[float, float]]) -> dict[float, float]:
    """The cumulative counts of several label sets' buckets (bound -> count) summed, at every
    bound where each set's count is known: its own bucket's, or -- for a set without that bound
    (federated pods of two vLLM versions, with different buckets) -- the count of its nearest
    bound below when its nearest bound above counts the same (no observation between them; 0
    below its first bound). A bound where some set's count lies between two of its buckets is
    left out: its quantiles are read through the bounds kept, the simulation's alike."""
    own = [(sorted(buckets), buckets) for buckets in series]
    summed = {}
    for bound in sorted(set().union(*series)):
        total = 0.0
        for bounds, buckets in own:
            if bound in buckets:
                total += buckets[bound]
                continue
            above = bisect_right(bounds, bound)
            below = buckets[bounds[above - 1]] if above > 0 else 0.0
            if above == len(bounds) or buckets[bounds[above]] != below:
                break
            total += below
        else:
            summed[bound] = total
    return summed


def _split_sample(line: str) -> tuple[str, str, str] | None:
    """A sample line's name, its labels with their braces (or ""), and its value as written; None
    for a line that is no sample. The labels end at the first ``}`` outside a quoted value (a
    value may hold ``}``, ``#`` and escaped quotes); a timestamp and an exemplar are left out. A
    name quoted as the braces' first item (:data:`_QUOTED_NAME`) is read as the name."""
    quoted = _QUOTED_NAME.match(line)
    if quoted:
        name, line, end = re.sub(r"\\(.)", r"\1", quoted.group(1)), "{" + line[quoted.end():], 0
    else:
        match = _NAME.match(line)
        if match is None:
            return None
        name, end = match.group(), match.end()
    if line.startswith("{", end):
        quoted, escaped = False, False
        for i in range(end + 1, len(line)):
            char = line[i]
            if escaped:
                escaped = False
            elif quoted and char == "\\":
                escaped = True
            elif char == '"':
                quoted = not quoted
            elif char == "}" and not quoted:
                break
        else:
            return None
        braces, end = line[end:i + 1], i + 1
    else:
        braces = ""
    value = _VALUE.match(line, end)
    return (name, braces, value.group(1)) if value else None


def _escaped_histograms(text: str) -> dict[str, str]:
    """The sample names of an OpenMetrics exposition that escapes ``:`` to ``_`` (prometheus_client
    0.26, which vLLM 0.33 serves /metrics with, does so for ``Accept: application/openmetrics-text``;
    ``openmetrics/exposition.py``) mapped to the engine's own: its ``# TYPE`` line keeps the name
    (``# TYPE vllm:time_to_first_token_seconds histogram`` over
    ``vllm_time_to_first_token_seconds_bucket{...}``). An exporter's renamed histograms declare
    the renamed name, so they stay refused (:func:`_refuse_renamed`)."""
    out = {}
    for metric in re.findall(r"^#[ \t]*TYPE[ \t]+(\S+)[ \t]+histogram\b", text, re.M):
        if ":" in metric and metric in SCRAPE_HISTOGRAMS:
            out.update({metric.replace(":", "_") + suffix: metric + suffix for suffix in ("_bucket", "_sum", "_count")})
    return out


def _histogram_part(name: str) -> tuple[str | None, str]:
    """``(metric of SCRAPE_HISTOGRAMS, "_bucket" | "_sum" | "_count")`` a sample's name is part of, or
    (None, "")."""
    for metric in SCRAPE_HISTOGRAMS:
        if name.startswith(metric) and name[len(metric):] in ("_bucket", "_sum", "_count"):
            return metric, name[len(metric):]
    return None, ""


def _sample_value(raw: str, name: str, suffix: str, where: str) -> float:
    """A histogram sample's value: a finite number, and not negative (counts, and sums of times
    and token counts)."""
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{where}: {name}: not a number: {raw!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {name}: must be a finite number, got {raw!r}")
    if value < 0:
        what = "a sum of times or token counts" if suffix == "_sum" else "a count"
        raise ConfigError(f"{where}: {name}: {what} cannot be negative, got {raw}")
    return value


def _bucket_bound(le: str, name: str, where: str) -> float:
    """A bucket's upper bound: a finite number, or +Inf for the last."""
    if le in _INF:
        return math.inf
    try:
        bound = float(le)
    except ValueError:
        raise ConfigError(f"{where}: {name}: le={le!r} is not a number (a bucket's upper bound, or +Inf)") from None
    if not math.isfinite(bound):
        raise ConfigError(f"{where}: {name}: le={le!r} is not a finite bound (only the last bucket's, +Inf, is "
                          f"infinite)")
    if bound < 0:
        raise ConfigError(f"{where}: {name}: le={le!r}: a bucket's upper bound cannot be negative (its histogram "
                          "counts times and token counts)")
    return bound


def _check_series(metric: str, label_set: str, entry: dict, source: str) -> None:
    """One label set of a histogram: cumulative bucket counts that never fall, a ``+Inf`` bucket and
    a ``_sum`` (Prometheus writes both for every histogram: without them a scrape was cut or edited,
    and its count or mean would be read wrong), and a ``_count`` equal to the ``+Inf`` bucket's
    (Prometheus writes both from the same observations)."""
    previous, previous_bound = 0.0, None
    for bound in sorted(entry["buckets"]):
        count = entry["buckets"][bound]
        if count < previous:
            le = "+Inf" if math.isinf(bound) else f"{bound:g}"
            raise ConfigError(f"{source}: line {entry['lines'][bound]}: {metric}_bucket le={le!r}: {count:g} "
                              f"observations, fewer than the {previous:g} at or below {previous_bound:g} -- a "
                              f"histogram's buckets count cumulatively, each at least the one before")
        previous, previous_bound = count, bound
    named = metric + ("{" + label_set.replace("=", '="').replace(",", '",') + '"}' if label_set else "")
    for part, missing in (("_bucket{le=\"+Inf\"}", math.inf not in entry["buckets"]), ("_sum", entry["sum"] is None)):
        if missing:
            raise ConfigError(f"{source}: line {entry['line']}: {named} has no {metric}{part} "
                              f"sample: Prometheus writes one for every histogram (a scrape cut short or "
                              f"edited?)")
    if entry["count"] is not None:
        count, line = entry["count"]
        inf = entry["buckets"][math.inf]
        if not math.isclose(count, inf, rel_tol=1e-9, abs_tol=1e-9):
            raise ConfigError(f"{source}: line {line}: {metric}_count is {count:g}, but its +Inf bucket (line "
                              f"{entry['lines'][math.inf]}) counts {inf:g}: both count every observation")


def _scrape_kind(found: dict[str, dict], where: str) -> str:
    """Whose /metrics a scrape is (:data:`SCRAPES`), by the histograms it holds: vLLM's when it holds
    none (the message then names vLLM's).

    :raises ConfigError: histograms of two engines (a federated scrape of several kinds of server).
    """
    kinds = [kind for kind, (_, table) in SCRAPES.items() if any(metric in found for metric in table)]
    if len(kinds) > 1:
        raise ConfigError(f"{where}: holds the histograms of {' and '.join(SCRAPES[k][0] for k in kinds)}: one "
                          f"engine's scrape is compared with a run; scrape each server's /metrics on its own")
    return kinds[0] if kinds else PROMETHEUS_KIND


def _prometheus_summary(after: dict, before: dict, source: str, where: str = "", baseline: str = "",
                        kind: str = PROMETHEUS_KIND) -> Summary:
    """The statistics of an engine's histograms (``kind``: :data:`SCRAPES`), less the baseline's."""
    engine, table = SCRAPES[kind]
    values: dict[str, float] = {}
    histograms: dict[str, Histogram] = {}
    taken: set[str] = set()
    dropped: dict[str, str] = {}
    for metric, (group, scale) in table.items():
        if metric not in after or group in taken:
            continue
        a, b = after[metric], before.get(metric)
        if b is None:
            b = {"buckets": {}, "sum": 0.0, "count": 0.0}
        else:   # the bounds both scrapes hold (the label sets summed may keep different ones: _sum_series)
            gone = b.get("labels", set()) - a.get("labels", set())
            if gone:  # (differenced as sums, another server's counts would be taken off this one's)
                raise ConfigError(f"{baseline or source}: {metric}: the baseline's series "
                                  f"{{{sorted(gone)[0]}}} is not in the target's scrape (its series: "
                                  f"{', '.join('{' + x + '}' for x in sorted(a.get('labels', set()))[:3])}): "
                                  "scrape the same server before and after")
            common = set(a["buckets"]) & set(b["buckets"])
            if not any(map(math.isfinite, common)) and any(map(math.isfinite, a["buckets"])):
                raise ConfigError(f"{baseline or source}: {metric}: the baseline's buckets share no bound with the "
                                  f"target's but +Inf ({_bounds_text(b)} against {_bounds_text(a)}): a histogram "
                                  "is differenced bucket by bucket; scrape the same server before and after")
            a, b = ({**x, "buckets": {le: c for le, c in x["buckets"].items() if le in common}} for x in (a, b))
            _check_later(metric, a, b, source, baseline)
        bounds = sorted(a["buckets"])
        counts = [a["buckets"][le] - b["buckets"].get(le, 0.0) for le in bounds]
        count, total = a["count"] - b["count"], a["sum"] - b["sum"]
        if not bounds or not math.isinf(bounds[-1]) or count <= 0:
            continue
        taken.add(group)
        hist = Histogram(tuple(le * scale for le in bounds), tuple(counts), total * scale)
        histograms[group] = hist
        values[f"{group}.mean"] = total * scale / count
        for q in HISTOGRAM_QUANTILES:
            if hist.beyond_last_bound(q / 100.0):
                unit = " ms" if group.endswith("_ms") else ""
                last = f" (above its last bound, {hist.bounds[-2]:g}{unit})" if len(hist.bounds) > 1 else ""
                dropped[f"{group}.p{q}"] = f"in {metric}'s +Inf bucket{last}: no value"
                continue
            values[f"{group}.p{q}"] = hist.quantile(q / 100.0)
    if not values:
        raise ConfigError(f"{where or source}: none of {engine}'s latency histograms "
                          f"({', '.join(table)}) has an observation"
                          + (" since the baseline" if before else ""))
    e2e = histograms.get("e2e_ms")
    notes = ()
    if dropped:
        notes = ((f"{where or source}: {', '.join(dropped)} fall in their histogram's +Inf bucket, above its last "
                  f"bound: a quantile there has no value (histogram_quantile gives the last bound, whatever the "
                  f"observations): left out", tuple(dropped), tuple(dropped)),)
    server = SCRAPE_SERVER[kind]
    return Summary(source, kind, _ordered(values), histograms, requests=int(e2e.count) if e2e is not None else None,
                   itl_per_token=kind == SGLANG_KIND, dropped=dropped, notes=notes, server=server,
                   ttft_from=SERVER_TTFT_FROM[server])


def _bounds_text(series: dict) -> str:
    """A histogram's finite bucket bounds, shortened: ``le=0.25, 0.5, 1``."""
    bounds = [f"{le:g}" for le in sorted(series["buckets"]) if math.isfinite(le)]
    return "le=" + ", ".join(bounds[:6]) + (", ..." if len(bounds) > 6 else "")


def _check_later(metric: str, a: dict, b: dict, source: str, baseline: str) -> None:
    """The scrape ``a`` is later than the baseline ``b``: a counter only grows, so every bucket
    (each one's own observations, not the cumulative count), the count and the sum are at least
    the baseline's."""
    def own(buckets: dict) -> dict:
        out, below = {}, 0.0
        for bound in sorted(buckets):
            out[bound], below = buckets[bound] - below, buckets[bound]
        return out

    bounds = sorted(set(a["buckets"]) | set(b["buckets"]))
    mine, theirs = own(a["buckets"]), own(b["buckets"])
    falls = [("_count", a["count"], b["count"]), ("_sum", a["sum"], b["sum"])]
    falls += [(f"bucket le={'+Inf' if math.isinf(le) else f'{le:g}'} (its own observations)", mine.get(le, 0.0),
               theirs.get(le, 0.0)) for le in bounds]
    for what, later, earlier in falls:
        if later < earlier - 1e-9 * max(abs(earlier), 1.0):
            raise ConfigError(f"{baseline}: {metric}{what if what.startswith('_') else ' ' + what} is {earlier:g} "
                              f"there but {later:g} in {source}, the scrape after the run: counters only grow, so the "
                              f"baseline looks later than the target, or the server restarted between the two scrapes")


def _ordered(values: dict[str, float]) -> dict[str, float]:
    """Statistics in a stable order: group by group, mean first, then the percentiles rising."""
    def key(name):
        group, _, stat = name.partition(".")
        rank = GROUPS.index(group) if group in GROUPS else len(GROUPS) + (THROUGHPUTS.index(group) + 1
                                                                             if group in THROUGHPUTS else 0)
        order = (-1.0 if stat in ("mean", "") else float(stat[1:]) if re.fullmatch(r"p\d+(?:\.\d+)?", stat)
                 else math.inf)   # ML.ENERGY's steady state: by name, after
        return rank, group, order, stat
    return {name: values[name] for name in sorted(values, key=key)}


# --- the same statistics of a simulated run -----------------------------------------------------


def simulated(summary: Summary, result) -> dict[str, float]:
    """The statistics of ``summary`` computed from a simulated run (through the same buckets
    for the quantiles of a Prometheus histogram), in the summary's view: a load generator's
    TTFT and latency from the simulated client's side (:mod:`schedlab.frontend`; the engine's
    without a ``[frontend]``), vLLM's own from the engine's -- from the request's arrival at the API
    server for vLLM >= 0.17 and SGLang, at the engine's queue for older vLLMs and TGI
    (:func:`_clock_start`). The engine's TTFT is every request's
    that got a first token: vLLM observes it when that token's output is processed
    (``IterationStats.update_from_output``, ``v1/metrics/stats.py``), and a request its client
    abandons later is aborted with no other statistic (``OutputProcessor.abort_requests``); SGLang's
    tokenizer manager observes it at the first chunk. Its E2E, queue time and TPOT are the
    completed requests', which vLLM observes only when they finish. guidellm's percentiles are
    nearest rank (:func:`_weighted_statistic`), the other tools' numpy's linear ones.

    :raises ConfigError: ``slo.goodput_rps`` (``vllm bench serve --goodput``'s ``request_goodput``)
        for a run without an ``[slo]`` table.
    """
    from .results.metrics import client_latencies, completed, request_latencies, run_quantiles

    req = result.all_requests()
    lat = request_latencies(req)
    if summary.view == "client":
        client = client_latencies(req)
        lat = {**lat, "ttft_ms": client["ttft_ms"], "tpot_ms": client["tpot_ms"], "e2e_ms": client["e2el_ms"]}
    else:   # (a request turned away on arrival has no first token: -1)
        start = _clock_start(summary, req, result)
        first = req["first_token_ms"] >= 0
        lat = {**lat, "ttft_ms": req["first_token_ms"][first] - start[first]}
        if start is not req["arrival_ms"]:   # the server's E2E histogram starts at the same stamp
            done = completed(req)
            lat["e2e_ms"] = req["finish_ms"][done] - start[done]
    if summary.kind in ZERO_TPOT_KINDS and "tpot_ms" in lat:
        lat = {**lat, "tpot_ms": _tpot_with_zeros(req, lat["tpot_ms"])}
    ok = completed(req)   # as the tools count them: a request turned away or given up on adds nothing
    itl = result.itl
    sketch = _itl_sketch(result)
    out: dict[str, float] = {}
    wanted: dict[str, list[str]] = {}
    for name in summary.values:
        group, _, stat = name.partition(".")
        wanted.setdefault(group, []).append(stat)
    for group, stats in wanted.items():
        if group in THROUGHPUTS:
            out[group] = _throughput(group, req, ok, _window_s(summary, req, getattr(result, "measured", None)))
            continue
        if group == "slo":
            out["slo.goodput_rps"] = _goodput(summary, req, ok, result)
            continue
        if group == "energy":
            steady = steady_state_energy(result, summary.batch)
            for stat in stats:
                out[f"{group}.{stat}"] = steady[stat]
            continue
        hist = summary.histograms.get(group)
        if group == "itl_ms" and summary.kind == "guidellm":   # per request, weighted by its gaps
            values, weights = _gap_weighted_tpot(req)
            for stat in stats:
                out[f"{group}.{stat}"] = _weighted_statistic(values, weights, stat)
            continue
        if group == "itl_ms" and sketch is not None:  # a streamed run: its ITLs are a sketch
            for stat in stats:
                out[f"{group}.{stat}"] = _sketch_statistic(sketch, stat, hist)
            continue
        if hist is not None:
            counts = _simulated_counts(group, hist.bounds, lat, itl, result)
            for stat in stats:
                out[f"{group}.{stat}"] = (_simulated_mean(group, lat, itl, result) if stat == "mean"
                                          else bucket_quantile(hist.bounds, counts, float(stat[1:]) / 100.0))
            continue
        percentiles = [float(s[1:]) for s in stats if s != "mean"]
        if group == "itl_ms":
            q = run_quantiles(itl["first"], itl["inc"], itl["count"], itl["weight"], percentiles or (50.0,))
            for stat in stats:
                out[f"{group}.{stat}"] = q["mean"] if stat == "mean" else q[f"p{float(stat[1:]):g}"]
            continue
        values = _sample(group, lat, result)
        values = values[np.isfinite(values)]
        for stat in stats:
            if values.size == 0:
                out[f"{group}.{stat}"] = float("nan")
            elif stat == "mean":
                out[f"{group}.{stat}"] = float(values.mean())
            elif summary.kind == "guidellm":   # nearest rank, as guidellm takes every percentile
                out[f"{group}.{stat}"] = _weighted_statistic(values, np.ones(values.size), stat)
            else:
                out[f"{group}.{stat}"] = float(np.percentile(values, float(stat[1:])))
    if summary.itl_per_token and "itl_ms" in wanted:
        _per_token_itl(summary, req, result, sketch, wanted["itl_ms"], out)
    if "iteration_tokens" in wanted:
        _warn_preempted_prompts(summary, req)
    return out


def _clock_start(summary: Summary, req: dict, result) -> np.ndarray:
    """When each request's TTFT and E2E clock starts in ``summary``'s server-side histograms: its
    arrival at the engine's queue (``arrival_ms``), or -- ``summary.ttft_from`` ``"api_server"``
    (vLLM from 0.17, SGLang) in a run with a ``[frontend]`` -- when the API server received it,
    ``sent_ms + network_ms``: before its wait for a handler, the chat template and tokenizing, which
    such a histogram holds (vLLM stamps ``arrival_time`` first in ``render_chat_async``; SGLang its
    ``received_time`` first in its OpenAI handler). The run keeps its ``[frontend]`` settings in
    ``result.meta["frontend"]`` (empty without one: then the API server hands a request over as it
    arrives, and the two are one). ``arrival_ms`` itself when it is the engine's arrival."""
    arrival = req["arrival_ms"]
    if summary.ttft_from != API_SERVER or "sent_ms" not in req:
        return arrival
    front = (getattr(result, "meta", None) or {}).get("frontend") or {}
    if not front:
        return arrival
    from .frontend import NETWORK_MS

    received = np.asarray(req["sent_ms"], dtype=float) + float(front.get("network_ms", NETWORK_MS))
    return np.minimum(received, arrival)   # (never after the engine's arrival: the handling is >= 0)


def _tpot_with_zeros(req: dict, tpot: np.ndarray) -> np.ndarray:
    """The completed requests' TPOTs as vLLM's ``request_time_per_output_token`` histogram holds
    them: ``tpot`` (requests of two tokens or more) and a 0 for each request of fewer
    (``decode_time / (tokens - 1) if tokens > 1 else 0``, observed for every finished request)."""
    from .results.metrics import completed

    short = int((req["generated_tokens"][completed(req)] <= 1).sum())
    return np.concatenate([np.asarray(tpot, dtype=float), np.zeros(short)])


def _gap_weighted_tpot(req: dict) -> tuple[np.ndarray, np.ndarray]:
    """guidellm's ``inter_token_latency_ms`` of a simulated run: each completed request's
    ``(last token - first) / (tokens - 1)`` as its client sees it, weighted by ``tokens - 1``."""
    from .results.metrics import client_latencies, completed

    generated = req["generated_tokens"][completed(req)]
    return client_latencies(req)["tpot_ms"], (generated[generated > 1] - 1).astype(float)


def _weighted_statistic(values: np.ndarray, weights: np.ndarray, stat: str) -> float:
    """The weighted ``mean`` or ``pNN`` as guidellm takes it (``DistributionSummary.from_values``
    and ``Percentiles.from_pdf``, ``schemas/statistics.py``; v0.3.0's ``objects/statistics.py``
    alike): equal values merged, their weights over the total as probabilities, summed in order,
    and the first value whose cumulative probability reaches the share -- nearest rank, never
    between two values. The sums are taken in guidellm's order (probabilities first, then their
    ``cumsum``): a share they reach only to a rounding, as nine tenths summed to 0.8999999999999999
    for p90 of ten values, picks the value guidellm picks. NaN with no weight."""
    keep = np.isfinite(values) & (weights > 0)
    values, weights = values[keep], weights[keep]
    if not weights.size:
        return float("nan")
    if stat == "mean":
        return float(np.sum(values * weights) / np.sum(weights))
    unique, inverse = np.unique(values, return_inverse=True)
    combined = np.zeros(unique.size)
    np.add.at(combined, inverse, weights)
    cdf = np.cumsum(combined / np.sum(combined))
    share = round(float(stat[1:]) / 100.0, 6)   # (guidellm's literal 0.999, not 99.9 / 100)
    at = min(int(np.searchsorted(cdf, share, side="left")), unique.size - 1)
    return float(unique[at])


def _goodput(summary: Summary, req: dict, ok: np.ndarray, result) -> float:
    """``vllm bench serve --goodput``'s ``request_goodput`` of a simulated run: the completed
    requests that met the run's ``[slo]`` TTFT and TPOT targets as their clients saw them
    (:func:`~schedlab.results.metrics.slo_met`; a request of one token meets any TPOT, vLLM's 0)
    over vLLM's duration (:func:`_window_s`): ``good_completed / dur_s`` (``vllm/benchmarks/serve.py``).
    The file does not record its ``--goodput`` targets: the run's ``[slo]`` holds the same ones
    (vLLM's ``e2el`` target has no counterpart).

    :raises ConfigError: a run without an ``[slo]`` table.
    """
    from .results.metrics import slo_met

    slo = (getattr(result, "meta", None) or {}).get("slo")
    if not slo:
        raise ConfigError(f"{summary.source}: slo.goodput_rps (vllm bench serve --goodput's request_goodput) needs "
                          f"the run's [slo] table with the --goodput targets: add one, or leave the statistic out "
                          f"(the [target] table's statistics, calibrate's --statistics)")
    seconds = _window_s(summary, req, getattr(result, "measured", None))
    return float(slo_met(req, ok, slo).sum()) / seconds if seconds > 0 else float("nan")


def _per_token_itl(summary: Summary, req: dict, result, sketch, stats: list[str], out: dict[str, float]) -> None:
    """``itl_ms`` against a source that counts each token of a step that gave several (speculative
    decoding; ``summary.itl_per_token``): SGLang's native client gives each of a chunk's k tokens
    the gap over k (``sglang/benchmark/backends/sglang_client.py``, ``adjust_itl``), its /metrics
    histogram puts k observations in the bucket of the gap over k and the gap in its sum
    (``collector.observe_inter_token_latency``), inference-perf's lifecycle report gives the
    chunk's first token the gap and the other k - 1 a 0 (``reportgen/base.py``,
    ``summarize_requests``). Either way the mean is the gaps' sum over the tokens after each
    request's first: ``itl_ms.mean`` is set to that, every recorded gap (an abandoned request's
    too, as the per-step ITL) over the tokens after the first of every request that got one --
    the per-step mean exactly when each step gives one token. The engines do not record a step's
    tokens, so the percentiles stay per step: with steps of several tokens a
    :class:`TargetWarning` says so."""
    if sketch is not None:
        gaps, steps = float(sketch.total), float(sketch.count)
    else:
        itl = result.itl
        count, weight = np.asarray(itl["count"], float), np.asarray(itl["weight"], float)
        steps = float(np.sum(count * weight))
        gaps = float(np.sum(weight * (count * np.asarray(itl["first"], float)
                                      + np.asarray(itl["inc"], float) * count * (count - 1) / 2)))
    tokens = float(np.maximum(req["generated_tokens"][req["first_token_ms"] >= 0] - 1, 0).sum())
    if "mean" in stats:
        out["itl_ms.mean"] = gaps / tokens if tokens > 0 else float("nan")
    if tokens > steps and any(stat != "mean" for stat in stats):
        warnings.warn(f"{summary.source}: {summary.kind} counts an ITL per token, and the simulated run's steps "
                      f"gave {tokens / steps:.2f} tokens each (speculative decoding): itl_ms.mean is per token, its "
                      f"percentiles per step (the engines do not record a step's tokens)", TargetWarning, stacklevel=3)


def _warn_preempted_prompts(summary: Summary, req: dict) -> None:
    """Say when ``iteration_tokens`` may be read low: a preempted request's ``cached_tokens`` adds
    up the prefix hits of each of its admissions, where vLLM subtracts its first's from the prompt
    (:func:`_iteration_tokens`)."""
    many = int(np.sum((req["first_token_ms"] >= 0) & (req["rejected"] == 0) & (req["preemptions"] > 0)
                      & (req["cached_tokens"] > 0)))
    if many:
        warnings.warn(f"{summary.source}: iteration_tokens: {many} preempted requests' cached_tokens add up the prefix "
                      f"hits of every admission, vLLM subtracts the first's: their prompts' computed tokens may be "
                      f"read low", TargetWarning, stacklevel=3)


def steady_state_energy(result, batch: int | None = None) -> dict[str, float]:
    """ML.ENERGY's steady state of a simulated run, as its benchmark (``RequestTracker``) takes it:
    from the moment ``B`` requests have their first token to the moment ``N - B - 1`` have left
    (``N`` requests in all; ``B``: ``batch``, the run's ``max_num_seqs`` -- else the scheduler's
    slots on one instance, else the most that ran at once). Over it:

    * ``steady_tokens_per_s``: the output tokens made in it (each request's first token at its
      time, its later ones spread evenly from its first to its last) per second;
    * ``steady_batch``: the requests running on average, summed over the instances (ML.ENERGY
      calls a run whose mean batch is below 0.85 of ``max_num_seqs`` unstable); NaN without the
      timeline (``timeline = false``);
    * ``steady_j_per_token`` and ``steady_power_w``: the instances' GPU energy (from the
      timeline's iterations, each spread evenly over its time) per token made and per second; NaN
      without a ``[power]`` table or the whole timeline (thinned by ``timeline_points``).

    And the window itself, ``steady_start_ms`` and ``steady_end_ms``. All NaN with no steady state
    (``N - B - 1`` requests leave before ``B`` have begun)."""
    nan = dict.fromkeys(("steady_j_per_token", "steady_power_w", "steady_tokens_per_s", "steady_batch",
                         "steady_start_ms", "steady_end_ms"), float("nan"))
    t = result.timeline
    req = result.all_requests()
    ok = (req["rejected"] == 0) & np.isfinite(req["first_token_ms"])
    first, finish = req["first_token_ms"][ok], req["finish_ms"][ok]
    tokens = req["generated_tokens"][ok].astype(float)
    began = np.sort(first)
    left = np.sort(req["finish_ms"][np.isfinite(req["finish_ms"])])
    slots = result.meta.get("slots")
    if batch is None:
        running = t.get("running")
        batch = (int(slots) if slots and (result.meta.get("instances") or 1) == 1
                 else int(np.max(running)) if running is not None and len(running) else 0)
    n, b = int(req["rejected"].size), int(batch)
    if b < 1 or began.size < b or n - b - 1 < 1 or left.size < n - b - 1:
        return nan
    t0, t1 = float(began[b - 1]), float(left[n - b - 2])
    if not t1 > t0:
        return nan
    with np.errstate(invalid="ignore", divide="ignore"):
        span = finish - first
        inside = np.clip(np.minimum(finish, t1) - np.maximum(first, t0), 0.0, None)
        rest = np.where(span > 0, (tokens - 1) * inside / span, 0.0)
    made = float(np.sum((first >= t0) & (first <= t1)) + np.sum(rest))
    out = dict(nan, steady_tokens_per_s=made / (t1 - t0) * 1e3, steady_start_ms=t0, steady_end_ms=t1)
    if "time_ms" not in t or not len(t["time_ms"]):
        return out
    start, length = np.asarray(t["time_ms"], float), np.asarray(t["duration_ms"], float)
    covered = np.clip(np.minimum(start + length, t1) - np.maximum(start, t0), 0.0, None)
    instance = np.asarray(t["instance"]) if "instance" in t else np.zeros(start.size, int)
    mean_running = 0.0
    for i in np.unique(instance):   # each instance's mean over the time it stepped, then their sum
        mine = instance == i
        if np.sum(covered[mine]) > 0:
            mean_running += float(np.sum(np.asarray(t["running"], float)[mine] * covered[mine]) / np.sum(covered[mine]))
    out["steady_batch"] = mean_running if np.sum(covered) > 0 else float("nan")
    energy_meta = result.meta.get("energy") or {}
    if "energy_j" not in t or not len(t["energy_j"]) or not energy_meta:
        return out
    # what the rows carry when none was dropped: the iterations' energy (a pipelined instance's
    # rows: all its stages' over each, idle ones too -- its meter's rows_j)
    rows_j = sum(inst.get("rows_j", inst.get("busy_j", 0.0)) for inst in energy_meta.get("instances", ()))
    if not math.isclose(float(np.sum(t["energy_j"])), rows_j, rel_tol=1e-6, abs_tol=1e-9):
        return out  # a thinned timeline (timeline_points): its rows no longer hold every iteration
    with np.errstate(invalid="ignore", divide="ignore"):
        energy = float(np.sum(np.where(length > 0, np.asarray(t["energy_j"], float) * covered / length, 0.0)))
    out.update(steady_j_per_token=energy / made if made > 0 else float("nan"), steady_power_w=energy / (t1 - t0) * 1e3)
    return out


def _itl_sketch(result):
    """A streamed run's inter-token latencies (:class:`schedlab.results.sketch.Summary`, every
    ITL within the sketch's 1%), or None for a run that kept every request."""
    stream = getattr(result, "stream", None)
    return stream.itl if getattr(result, "rows_file", None) is not None and stream is not None else None


def _sketch_statistic(sketch, stat: str, hist) -> float:
    """``mean`` or ``pNN`` of the sketched ITLs; with a histogram target, the quantile read
    through its buckets as the real run's is (the cumulative count at each bound found by
    bisecting the sketch's quantiles)."""
    if not sketch.count:
        return float("nan")
    if stat == "mean":
        return sketch.total / sketch.count
    q = float(stat[1:]) / 100.0
    if hist is None:
        return sketch.percentile(float(stat[1:]))
    counts = []
    for edge in hist.bounds:
        if edge >= sketch.max:
            counts.append(float(sketch.count))
            continue
        low, high = 0.0, 1.0  # the largest share of ITLs whose quantile stays at or below the bound
        for _ in range(40):
            mid = (low + high) / 2
            low, high = (mid, high) if sketch.sketch.get_quantile_value(mid) <= edge else (low, mid)
        counts.append(low * sketch.count)
    return bucket_quantile(hist.bounds, counts, q)


def _sample(group: str, lat: dict, result) -> np.ndarray:
    if group == "iteration_tokens":
        tokens, weights = _iteration_tokens(result)
        return np.repeat(tokens, weights.astype(np.int64))
    if group not in lat:
        raise ConfigError(f"no simulated counterpart of {group!r}")
    return np.asarray(lat[group], dtype=float)


def _iteration_tokens(result) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per iteration as vLLM's ``vllm:iteration_tokens_total`` observes them, and how many
    iterations had them, from the run's timeline (rows of ``iterations`` identical iterations).

    vLLM 0.33 observes an iteration's outputs (``IterationStats.update_from_output``): every token
    generated, and, in the iteration that gives a request its first token, the prompt tokens it
    computed -- ``prompt_token_stats.computed``, its prompt less the prefix-cache hits of its
    first scheduling (``v1/metrics/loggers.py``, ``PrefillStats`` in ``v1/metrics/stats.py``;
    vLLMs before ``PromptTokenStats`` observed the whole prompt). A prompt's earlier chunks are in
    no observation, and an iteration that outputs nothing (only a chunk of a prompt; a
    data-parallel rank's dummy step) is none (``IterationStats()`` only ``if num_outputs``). So
    each row holds its decodes, and the iteration that ends at a request's first token
    (``time_ms + duration_ms`` on its instance) adds its prompt less its ``cached_tokens``, and
    that token. A preempted request's ``cached_tokens`` sums the hits of every admission (vLLM
    counts its first's; :func:`simulated` warns), so its computed prompt is read at least 0. A
    first token whose iteration the timeline does not hold (rows thinned out on a long run) is
    left out."""
    t = result.timeline
    if not t or "iterations" not in t or not len(t["iterations"]):
        raise ConfigError("iteration_tokens needs the run's timeline")
    tokens = np.asarray(t["decodes"], dtype=float).copy()
    iterations = np.asarray(t["iterations"], dtype=float)
    ends = {(int(i), float(s) + float(d)): row for row, (i, s, d, k) in enumerate(
        zip(t["instance"], t["time_ms"], t["duration_ms"], iterations)) if k == 1}
    req = result.all_requests()
    first = np.asarray(req["first_token_ms"], dtype=float)
    for i in np.flatnonzero(np.isfinite(first) & (req["rejected"] == 0)):
        row = ends.get((int(req["instance"][i]), float(first[i])))
        if row is not None:
            tokens[row] += max(float(req["prompt_tokens"][i]) - float(req["cached_tokens"][i]), 0.0) + 1.0
    observed = tokens > 0
    return tokens[observed], iterations[observed]


def _simulated_mean(group: str, lat: dict, itl: dict, result) -> float:
    if group == "itl_ms":
        from .results.metrics import run_quantiles

        return run_quantiles(itl["first"], itl["inc"], itl["count"], itl["weight"])["mean"]
    if group == "iteration_tokens":
        tokens, weights = _iteration_tokens(result)
        return float((tokens * weights).sum() / weights.sum()) if weights.sum() else float("nan")
    values = np.asarray(lat[group], dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def _simulated_counts(group: str, bounds, lat: dict, itl: dict, result) -> list[float]:
    """Cumulative counts of the simulated observations at the histogram's bounds."""
    from .results.metrics import counts_at_most

    edges = np.asarray(bounds, dtype=float)
    if group == "itl_ms":
        return counts_at_most(np.asarray(itl["first"], float), np.asarray(itl["inc"], float),
                              np.asarray(itl["count"], np.int64), np.asarray(itl["weight"], np.int64),
                              edges).astype(float).tolist()
    if group == "iteration_tokens":
        tokens, weights = _iteration_tokens(result)
        return [float(weights[tokens <= edge].sum()) for edge in edges]
    values = np.sort(np.asarray(lat[group], dtype=float))
    values = values[np.isfinite(values)]
    return np.searchsorted(values, edges, side="right").astype(float).tolist()


def _window_s(summary: Summary, req: dict, measured=None) -> float:
    """The span, in seconds, the throughputs of ``summary`` divide by, taken as its source takes it
    (every request's times count, a failed one's too):

    * the engine's view: the run's makespan, from the first arrival at the engine to the last
      request that left it (finished, dropped, or turned away after it queued), and for
      inference-perf's server rates the ``summary.window_pad_s`` its Prometheus window runs on;
    * a load generator's: from the first send to the last time a client heard back (a last byte,
      a client giving up, a rejection);
    * ``vllm bench serve``'s: its duration, which starts one first gap before the first send
      (``summary.first_gap_ms``; in a replay of a ``vllm_bench`` file, the replay's own start,
      ``measured.bench_start_ms``), to the same end."""
    from .results.metrics import left_the_engine

    if summary.view == "engine":
        left = left_the_engine(req)
        if not left.any():
            return float("nan")
        return (float(req["finish_ms"][left].max()) - float(req["arrival_ms"].min())) / 1e3 + summary.window_pad_s
    sent = req["sent_ms"] if "sent_ms" in req else req["arrival_ms"]
    done = req["client_done_ms"] if "client_done_ms" in req else req["finish_ms"]
    # a request turned away: its client hears of it when the engine refuses it (on arrival: at its arrival)
    heard = np.where(req["rejected"] != 0, np.maximum(req["finish_ms"], req["arrival_ms"]), done)
    if not heard.size:
        return float("nan")
    start = float(sent.min())
    if summary.first_gap_ms is not None:
        own = getattr(measured, "bench_start_ms", None)
        start = own if own is not None and math.isfinite(own) else start - summary.first_gap_ms
    return (float(heard.max()) - start) / 1e3


def _throughput(name: str, req: dict, ok: np.ndarray, seconds: float) -> float:
    """The completed requests (``ok``), or their output or total tokens, per second of ``seconds``
    (:func:`_window_s`)."""
    if not ok.any() or not seconds > 0:
        return float("nan")
    if name == "request_throughput_rps":
        return float(ok.sum()) / seconds
    output = float(req["generated_tokens"][ok].sum())
    if name == "output_throughput_tps":
        return output / seconds
    return (output + float(req["prompt_tokens"][ok].sum())) / seconds


def incomparable_left_out(summary: Summary, tables, where: str) -> Summary:
    """``summary`` without the statistics its run cannot compute, saying so: the steady-state energy
    statistics when the run has no ``[power]`` table, ``slo.goodput_rps`` (``vllm bench serve
    --goodput``'s ``request_goodput``) when it has no ``[slo]`` with the file's targets; else
    ``summary``. ``tables``: the run's table names."""
    need = {name: "[power] table" for name in summary.values if name in STEADY_ENERGY and "power" not in tables}
    if BENCH_GOODPUT in summary.values and "slo" not in tables:
        need[BENCH_GOODPUT] = "[slo] table with its --goodput targets"
    if not need:
        return summary
    for table in dict.fromkeys(need.values()):
        names = [name for name, t in need.items() if t == table]
        warnings.warn(f"{where}: {summary.source}'s {' and '.join(names)} need a {table}"
                      f" to compare: left out", TargetWarning, stacklevel=3)
    return attrs.evolve(summary, values={k: v for k, v in summary.values.items() if k not in need})


def percent_error(simulated: float, measured: float) -> float:
    """``(simulated - measured) / measured`` in percent (NaN for a measured 0), divided before it is
    scaled so that a measured value near a float's limit gives -100%, not an overflow."""
    return (simulated - measured) / measured * 100.0 if measured else float("nan")


def errors_pct(summary: Summary, result) -> dict[str, float]:
    """``(simulated - measured) / measured`` in percent, per statistic of ``summary``."""
    return vs_target(summary, result)["errors_pct"]


# --- a run checked against a summary: the [target] table ------------------------------------------


@attrs.frozen
class TargetConfig:
    """A run's ``[target]`` table: the summary of the real run it stands for."""

    path: str = path_field(help="a summary of the real run: a vllm bench serve or SGLang bench_serving result, an "
                                "inference-perf, guidellm, genai-perf or AIPerf report, or a Prometheus scrape of "
                                "vLLM's, SGLang's or TGI's /metrics")
    statistics: tuple | None = attrs.field(
        default=None, converter=lambda v: tuple(v) if isinstance(v, list) else v,
        metadata={"help": "compare only these statistics, e.g. ['ttft_ms.mean', 'e2e_ms.p99'] (default: every one "
                          "the file holds)"})
    index: int | None = int_field(None, min=0, optional=True,
                                  help="which benchmark of a guidellm report with several (default 0), or which JSON "
                                       "document of a file of several (vllm bench serve --append-result; default the "
                                       "last)")
    baseline: str | None = path_field(None, optional=True,
                                      help="a Prometheus scrape taken before the run, subtracted from path's")
    vllm_ttft_from: str | None = str_field(
        None, choices=TTFT_STARTS, optional=True,
        help="where vLLM's own TTFT and E2E histograms start, with a [frontend]: 'api_server' (vLLM >= 0.17: "
             "arrival_time is stamped before the API server's queue, chat template and tokenizing; the default, as "
             "the vllm presets model 0.33) or 'engine' (vLLM <= 0.16: stamped after tokenizing, at the engine's "
             "arrival); only for a vLLM /metrics scrape or inference-perf's server metrics of a vLLM server")

    def __attrs_post_init__(self) -> None:
        if self.statistics is not None and (not isinstance(self.statistics, tuple) or not self.statistics
                                            or not all(isinstance(n, str) for n in self.statistics)):
            raise FieldError("statistics", f"must be a non-empty list of statistic names like 'ttft_ms.mean', "
                                           f"got {self.statistics!r}")

    def read(self) -> Summary:
        """The file's statistics (only ``statistics`` when given).

        :raises ConfigError: the file cannot be read, or holds no such statistic (the message
            lists those it holds).
        """
        summary = read_summary(self.path, baseline=self.baseline, index=self.index, names=TABLE_NAMES,
                               statistics=self.statistics)
        if self.vllm_ttft_from is not None:
            problem = vllm_ttft_from_problem(summary)
            if problem is not None:
                raise FieldError("vllm_ttft_from", problem)
            summary = attrs.evolve(summary, ttft_from=self.vllm_ttft_from)
        noted = {key for _, _, keys in summary.notes for key in keys}   # (said in their own warning)
        odd = {key: why for key, why in summary.dropped.items()
               if why != "null" and key not in noted}  # null: the tool had none
        if odd and not self.statistics:
            found = ", ".join(f"{key} ({why})" for key, why in odd.items())
            warnings.warn(f"{summary.source}: left out, not a finite number: {found}; the other "
                          f"{len(summary.values)} compared", TargetWarning, stacklevel=2)
        if self.statistics:
            unknown = [n for n in self.statistics if n not in summary.values]
            if unknown:
                raise FieldError("statistics", f"{summary.source} holds no {unknown[0]!r}; it holds "
                                               f"{', '.join(summary.values)}{_loop_queue_hint(unknown[0], summary)}")
            summary = summary.select(list(self.statistics))
        return summary


def _loop_queue_hint(name: str, summary: Summary) -> str:
    """Why a file holds ``loop_queue_ms.<stat>`` where ``queue_ms.<stat>`` was asked for (vLLM's and SGLang's
    queue-time histograms start when the engine loop took the request), or ''."""
    group, _, stat = name.partition(".")
    if group != "queue_ms" or f"loop_queue_ms.{stat}" not in summary.values:
        return ""
    return (f" (its queue times run from when the engine loop took each request, between two steps: "
            f"name them loop_queue_ms.{stat}; queue_ms runs from the arrival)")


def vllm_ttft_from_problem(summary: Summary) -> str | None:
    """Why a ``vllm_ttft_from`` (a ``[target]``'s, ``calibrate --target-vllm-ttft-from``) cannot apply to
    ``summary``: it is not vLLM's own histograms; None when it can."""
    if summary.server == "vllm":
        return None
    return (f"applies to vLLM's own histograms (a scrape of its /metrics, or inference-perf's server metrics of a "
            f"vLLM server); {summary.source} is not ({summary.kind}); leave it out")


def compare_with_real_run(result) -> None:
    """Put into ``result.metrics`` its comparison with the real run it stands for: each
    request against its replay (``vs_measured``, when it replays a measured run) and its
    statistics against the real run's summary (``vs_target``, with a ``[target]``) -- over
    every request, a streamed run's too (:meth:`~schedlab.results.records.RunResult.all_requests`)."""
    if result.measured is not None:
        from .results.compare import vs_measured

        result.metrics["vs_measured"] = vs_measured(result.all_requests(), result.measured)
    if result.target is not None:
        result.metrics["vs_target"] = vs_target(result.target, result)
        result.meta["target"] = {"path": result.target.source, "kind": result.target.kind,
                                 "view": result.target.view}
        if result.target.view == "engine":   # where its TTFT and E2E start (_clock_start)
            result.meta["target"]["ttft_from"] = result.target.ttft_from
        if result.target.batch is not None:   # the measured run's max_num_seqs (ML.ENERGY's)
            result.meta["target"]["batch"] = result.target.batch
        if result.target.dropped:   # the file's statistics without a number (null, NaN): said under the table
            result.meta["target"]["left_out"] = dict(result.target.dropped)


def vs_target(summary: Summary, result) -> dict:
    """A run against the measured summary: ``{"mean_abs_error_pct", "errors_pct", "measured",
    "simulated"}`` (statistic name -> value; errors ``(simulated - measured) / measured`` in
    percent; the mean over the statistics with an error)."""
    sim = simulated(summary, result)
    errors = {name: percent_error(sim[name], value) for name, value in summary.values.items()}
    finite = [abs(e) for e in errors.values() if math.isfinite(e)]
    return {"mean_abs_error_pct": float(np.mean(finite)) if finite else float("nan"), "errors_pct": errors,
            "measured": dict(summary.values), "simulated": sim}
