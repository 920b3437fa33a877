"""What operators have of a real run: summary statistics, and the same statistics of a simulation.

``schedlab calibrate --target FILE`` fits a run's cost model to statistics read here, when no
per-request log exists. The file is recognised by its content:

* ``vllm bench serve --save-result`` (with or without ``--save-detailed``): ``mean_ttft_ms``,
  ``median_ttft_ms``, ``p99_ttft_ms`` (every ``--metric-percentiles`` it was run with), the same
  for ``tpot``, ``itl`` and ``e2el``, and ``request_throughput``, ``output_throughput``,
  ``total_token_throughput``;
* an inference-perf report (``summary_lifecycle_metrics.json``): ``successes.latency.
  {time_to_first_token, time_per_output_token, inter_token_latency, request_latency}`` in
  seconds (``mean``, ``median``, ``p90`` ...) and ``successes.throughput``;
* a guidellm report: ``benchmarks[i].metrics.{time_to_first_token_ms, time_per_output_token_ms,
  inter_token_latency_ms, request_latency (s), requests_per_second, output_tokens_per_second,
  tokens_per_second}.successful`` (``mean``, ``median``, ``percentiles.p90`` ...);
* a scrape of vLLM's Prometheus ``/metrics`` (text format): the histograms
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` (older vLLMs:
  ``vllm:time_per_output_token_seconds``, the same per-token gaps),
  ``vllm:request_time_per_output_token_seconds``, ``vllm:e2e_request_latency_seconds``,
  ``vllm:request_queue_time_seconds`` and ``vllm:iteration_tokens_total``
  (``vllm/v1/metrics/loggers.py``), summed over their label sets; with a second scrape taken
  before the run (``baseline``) the difference. A histogram gives an exact mean (``_sum /
  _count``) and quantiles only to its buckets' resolution, so the simulation's quantiles are
  read through the same buckets with the same interpolation as Prometheus' ``histogram_quantile``
  -- like is compared with like.

Statistics are named as the run's metrics are: ``ttft_ms.mean``, ``itl_ms.p99``, ``e2e_ms.p50``,
``queue_ms.mean``, ``iteration_tokens.mean``, ``request_throughput_rps``, ``output_throughput_tps``,
``total_throughput_tps``. :func:`simulated` computes the same names from a
:class:`~schedlab.results.records.RunResult` (TTFT and latency as the file's source sees them:
a load generator from sending a request, vLLM's metrics from its arrival at the engine; ITL:
every gap between two tokens of a request; throughputs over the makespan).

A run can carry its measured summary along (a ``[target]`` table, :class:`TargetConfig`): it
then gets ``metrics["vs_target"]``, each statistic measured, simulated and its error
(:func:`vs_target`), and the ``compare`` report prints the table.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
import attrs
import numpy as np

from .configs import FieldError, int_field, path_field
from .errors import ConfigError

#: Latency groups: the run's metric prefix, and how each source names it.
GROUPS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")
THROUGHPUTS = ("request_throughput_rps", "output_throughput_tps", "total_throughput_tps")
#: vllm bench serve: field infix per group
BENCH = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
BENCH_RATES = {"request_throughput": "request_throughput_rps", "output_throughput": "output_throughput_tps",
               "total_token_throughput": "total_throughput_tps"}
#: inference-perf: successes.latency.<name> (seconds)
INFERENCE_PERF = {"time_to_first_token": "ttft_ms", "time_per_output_token": "tpot_ms",
                  "inter_token_latency": "itl_ms", "request_latency": "e2e_ms"}
INFERENCE_PERF_RATES = {"requests_per_sec": "request_throughput_rps", "output_tokens_per_sec": "output_throughput_tps",
                        "total_tokens_per_sec": "total_throughput_tps"}
#: guidellm: metrics.<name> and its unit in ms
GUIDELLM = {"time_to_first_token_ms": ("ttft_ms", 1.0), "time_per_output_token_ms": ("tpot_ms", 1.0),
            "inter_token_latency_ms": ("itl_ms", 1.0), "request_latency": ("e2e_ms", 1e3)}
GUIDELLM_RATES = {"requests_per_second": "request_throughput_rps", "output_tokens_per_second": "output_throughput_tps",
                  "tokens_per_second": "total_throughput_tps"}
#: vLLM's Prometheus histograms (vllm/v1/metrics/loggers.py): name -> (group, scale to ms or tokens)
PROMETHEUS = {"vllm:time_to_first_token_seconds": ("ttft_ms", 1e3),
              "vllm:inter_token_latency_seconds": ("itl_ms", 1e3),
              "vllm:time_per_output_token_seconds": ("itl_ms", 1e3),  # older vLLMs: the same per-token gaps
              "vllm:request_time_per_output_token_seconds": ("tpot_ms", 1e3),
              "vllm:e2e_request_latency_seconds": ("e2e_ms", 1e3),
              "vllm:request_queue_time_seconds": ("queue_ms", 1e3),
              "vllm:iteration_tokens_total": ("iteration_tokens", 1.0)}
#: the kind of a Prometheus scrape's summary (the only one measured by the server, not a client)
PROMETHEUS_KIND = "vLLM /metrics"
#: quantiles read from each Prometheus histogram (beside its exact mean)
HISTOGRAM_QUANTILES = (50, 90, 99)


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

    @property
    def view(self) -> str:
        """Whose times these are: ``"engine"`` (vLLM's own metrics, from a request's arrival at
        the engine) or ``"client"`` (a load generator's, from sending it to the first and last
        byte); the simulation is read in the same view."""
        return "engine" if self.kind == PROMETHEUS_KIND else "client"

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


def read_summary(path, *, baseline=None, index: int = 0) -> Summary:
    """The summary statistics in ``path`` (format recognised by content; see the module docstring).

    :param baseline: a Prometheus scrape taken before the run, subtracted from ``path``'s.
    :param index: which benchmark of a guidellm report with several.
    :raises ConfigError: a missing or unreadable file, or one in none of the formats.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--target {path}: file not found")
    text = path.read_text()
    if _looks_prometheus(text):
        before = _parse_prometheus(Path(baseline).read_text(), str(baseline)) if baseline else {}
        return _prometheus_summary(_parse_prometheus(text, str(path)), before, str(path))
    if baseline:
        raise ConfigError(f"--target-baseline: only a Prometheus scrape has a baseline; {path} is not one")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--target {path}: neither JSON ({exc.msg}) nor a Prometheus scrape") from None
    if isinstance(data, dict) and any(f"mean_{k}_ms" in data for k in BENCH):
        return _bench_summary(data, str(path))
    if isinstance(data, dict) and isinstance(data.get("successes"), dict):
        return _inference_perf_summary(data, str(path))
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        return _guidellm_summary(data, str(path), index)
    raise ConfigError(f"--target {path}: not a vllm bench serve result, an inference-perf or guidellm report, "
                      f"or a Prometheus scrape")


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _bench_summary(data: dict, source: str) -> Summary:
    values: dict[str, float] = {}
    pattern = re.compile(r"^(mean|median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")
    for key, raw in data.items():
        match = pattern.match(key)
        value = _number(raw)
        if match is None or value is None:
            continue
        stat = "mean" if match.group(1) == "mean" else "p50" if match.group(1) == "median" else f"p{match.group(2)}"
        values[f"{BENCH[match.group(3)]}.{stat}"] = value
    for key, name in BENCH_RATES.items():
        if _number(data.get(key)) is not None:
            values[name] = float(data[key])
    completed = data.get("completed")
    return Summary(source, "vllm bench serve", _ordered(values),
                   requests=int(completed) if _number(completed) is not None else None)


def _stat_name(key: str) -> str | None:
    if key == "mean":
        return "mean"
    if key == "median":
        return "p50"
    match = re.fullmatch(r"p(\d+(?:\.\d+)?)", key)
    return key if match else None


def _inference_perf_summary(data: dict, source: str) -> Summary:
    successes = data["successes"]
    latency = successes.get("latency") or {}
    values: dict[str, float] = {}
    for key, group in INFERENCE_PERF.items():
        block = latency.get(key)
        if not isinstance(block, dict):
            continue
        for stat_key, raw in block.items():
            stat, value = _stat_name(stat_key), _number(raw)
            if stat is not None and value is not None:
                values[f"{group}.{stat}"] = value * 1e3
    for key, name in INFERENCE_PERF_RATES.items():
        value = _number((successes.get("throughput") or {}).get(key))
        if value is not None:
            values[name] = value
    count = _number(successes.get("count"))
    return Summary(source, "inference-perf", _ordered(values), requests=int(count) if count is not None else None)


def _guidellm_summary(data: dict, source: str, index: int) -> Summary:
    benchmarks = data["benchmarks"]
    if not benchmarks:
        raise ConfigError(f"--target {source}: the report holds no benchmarks")
    if not 0 <= index < len(benchmarks):
        raise ConfigError(f"--target-index {index}: {source} holds benchmarks 0..{len(benchmarks) - 1}")
    metrics = (benchmarks[index] or {}).get("metrics") or {}
    values: dict[str, float] = {}

    def successful(block):
        return (block or {}).get("successful") if isinstance(block, dict) else None

    for key, (group, scale) in GUIDELLM.items():
        dist = successful(metrics.get(key))
        if not isinstance(dist, dict):
            continue
        for stat_key in ("mean", "median"):
            value = _number(dist.get(stat_key))
            if value is not None:
                values[f"{group}.{_stat_name(stat_key)}"] = value * scale
        for stat_key, raw in (dist.get("percentiles") or {}).items():
            stat, value = _guidellm_percentile(stat_key), _number(raw)
            if stat is not None and value is not None:
                values[f"{group}.{stat}"] = value * scale
    for key, name in GUIDELLM_RATES.items():
        value = _number((successful(metrics.get(key)) or {}).get("mean"))
        if value is not None:
            values[name] = value
    count = _number((successful(metrics.get("request_latency")) or {}).get("count"))
    where = f"{source} (benchmark {index} of {len(benchmarks)})" if len(benchmarks) > 1 else source
    return Summary(where, "guidellm", _ordered(values), requests=int(count) if count is not None else None)


def _guidellm_percentile(key: str) -> str | None:
    """guidellm names percentiles p001 (0.1), p01, p05, p10 ... p99, p999 (99.9)."""
    digits = {"p001": "0.1", "p999": "99.9"}.get(key)
    if digits is None:
        match = re.fullmatch(r"p(\d\d)", key)
        if match is None:
            return None
        digits = str(int(match.group(1)))
    return f"p{digits}"


def _looks_prometheus(text: str) -> bool:
    head = text.lstrip()[:4096]
    return head.startswith("#") or bool(re.search(r"^vllm:\w+(\{[^}]*\})?\s", head, re.M))


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LE = re.compile(r'(?:^|,)\s*le\s*=\s*"([^"]*)"')


def _parse_prometheus(text: str, source: str) -> dict[str, dict]:
    """Each histogram of :data:`PROMETHEUS`: ``{"buckets": {le: count}, "sum": s, "count": c}``,
    summed over its label sets."""
    found: dict[str, dict] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ConfigError(f"{source}: line {number}: not a Prometheus sample: {line[:80]!r}")
        name, labels, raw = match.group(1), match.group(3) or "", match.group(4)
        for metric in PROMETHEUS:
            if not name.startswith(metric):
                continue
            suffix = name[len(metric):]
            if suffix not in ("_bucket", "_sum", "_count"):
                continue
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"{source}: line {number}: {name}: not a number: {raw!r}") from None
            entry = found.setdefault(metric, {"buckets": {}, "sum": 0.0, "count": 0.0})
            if suffix == "_bucket":
                le = _LE.search(labels)
                if le is None:
                    raise ConfigError(f"{source}: line {number}: {name} without an le label")
                bound = float("inf") if le.group(1) in ("+Inf", "Inf", "inf") else float(le.group(1))
                entry["buckets"][bound] = entry["buckets"].get(bound, 0.0) + value
            else:
                entry[suffix[1:]] += value
    return found


def _prometheus_summary(after: dict, before: dict, source: str) -> Summary:
    values: dict[str, float] = {}
    histograms: dict[str, Histogram] = {}
    taken: set[str] = set()
    for metric, (group, scale) in PROMETHEUS.items():
        if metric not in after or group in taken:
            continue
        a, b = after[metric], before.get(metric, {"buckets": {}, "sum": 0.0, "count": 0.0})
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
            values[f"{group}.p{q}"] = hist.quantile(q / 100.0)
    if not values:
        raise ConfigError(f"--target {source}: none of vLLM's latency histograms "
                          f"({', '.join(PROMETHEUS)}) has an observation")
    e2e = histograms.get("e2e_ms")
    return Summary(source, PROMETHEUS_KIND, _ordered(values), histograms,
                   requests=int(e2e.count) if e2e is not None else None)


def _ordered(values: dict[str, float]) -> dict[str, float]:
    """Statistics in a stable order: group by group, mean first, then the percentiles rising."""
    def key(name):
        group, _, stat = name.partition(".")
        rank = GROUPS.index(group) if group in GROUPS else len(GROUPS) + (THROUGHPUTS.index(group) + 1
                                                                             if group in THROUGHPUTS else 0)
        return rank, group, -1.0 if stat in ("mean", "") else float(stat[1:])
    return {name: values[name] for name in sorted(values, key=key)}


# --- the same statistics of a simulated run -----------------------------------------------------


def simulated(summary: Summary, result) -> dict[str, float]:
    """The statistics of ``summary`` computed from a simulated run (through the same buckets
    for the quantiles of a Prometheus histogram), in the summary's view: a load generator's
    TTFT and latency from the simulated client's side (:mod:`schedlab.frontend`; the engine's
    without a ``[frontend]``), vLLM's own from the engine's."""
    from .results.metrics import client_latencies, request_latencies, run_quantiles

    req = result.all_requests()
    lat = request_latencies(req)
    if summary.view == "client":
        client = client_latencies(req)
        lat = {**lat, "ttft_ms": client["ttft_ms"], "tpot_ms": client["tpot_ms"], "e2e_ms": client["e2el_ms"]}
    ok = req["rejected"] == 0
    itl = result.itl
    sketch = _itl_sketch(result)
    out: dict[str, float] = {}
    wanted: dict[str, list[str]] = {}
    for name in summary.values:
        group, _, stat = name.partition(".")
        wanted.setdefault(group, []).append(stat)
    for group, stats in wanted.items():
        if group in THROUGHPUTS:
            out[group] = _throughput(group, req, ok, summary.view)
            continue
        hist = summary.histograms.get(group)
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
            else:
                out[f"{group}.{stat}"] = float(np.percentile(values, float(stat[1:])))
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
        return min(float(sketch.sketch.get_quantile_value(q)), sketch.max)
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
    """Tokens per iteration (decodes + prefill tokens) and how many iterations had them, from
    the run's timeline (rows of ``iterations`` identical iterations). Rows that compute no token
    are left out: vLLM observes the tokens of the steps its scheduler plans, and a metered
    data-parallel rank's dummy steps (and steps that only copy blocks to or from swap space)
    are none."""
    t = result.timeline
    if not t or "iterations" not in t or not len(t["iterations"]):
        raise ConfigError("iteration_tokens needs the run's timeline")
    tokens = np.asarray(t["decodes"], dtype=float) + np.asarray(t["prefill_tokens"], dtype=float)
    computed = tokens > 0
    return tokens[computed], np.asarray(t["iterations"], dtype=float)[computed]


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


def _throughput(name: str, req: dict, ok: np.ndarray, view: str = "engine") -> float:
    """Tokens or requests per second over the run: from the first arrival to the last finish,
    or for a client, from the first send to the last byte."""
    if not ok.any():
        return float("nan")
    first, last = ("sent_ms", "client_done_ms") if view == "client" and "client_done_ms" in req else \
        ("arrival_ms", "finish_ms")
    seconds = (float(req[last][ok].max()) - float(req[first].min())) / 1e3
    if not seconds > 0:
        return float("nan")
    if name == "request_throughput_rps":
        return float(ok.sum()) / seconds
    output = float(req["generated_tokens"][ok].sum())
    if name == "output_throughput_tps":
        return output / seconds
    return (output + float(req["prompt_tokens"][ok].sum())) / seconds


def errors_pct(summary: Summary, result) -> dict[str, float]:
    """``(simulated - measured) / measured`` in percent, per statistic of ``summary``."""
    return vs_target(summary, result)["errors_pct"]


# --- a run checked against a summary: the [target] table ------------------------------------------


@attrs.frozen
class TargetConfig:
    """A run's ``[target]`` table: the summary of the real run it stands for."""

    path: str = path_field(help="a summary of the real run: a vllm bench serve result, an inference-perf or "
                                "guidellm report, or a Prometheus scrape of vLLM's /metrics")
    statistics: tuple | None = attrs.field(
        default=None, converter=lambda v: tuple(v) if isinstance(v, list) else v,
        metadata={"help": "compare only these statistics, e.g. ['ttft_ms.mean', 'e2e_ms.p99'] (default: every one "
                          "the file holds)"})
    index: int = int_field(0, min=0, help="which benchmark of a guidellm report with several")
    baseline: str | None = path_field(None, optional=True,
                                      help="a Prometheus scrape taken before the run, subtracted from path's")

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
        summary = read_summary(self.path, baseline=self.baseline, index=self.index)
        if self.statistics:
            unknown = [n for n in self.statistics if n not in summary.values]
            if unknown:
                raise FieldError("statistics", f"{summary.source} holds no {unknown[0]!r}; it holds "
                                               f"{', '.join(summary.values)}")
            summary = summary.select(list(self.statistics))
        return summary


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


def vs_target(summary: Summary, result) -> dict:
    """A run against the measured summary: ``{"mean_abs_error_pct", "errors_pct", "measured",
    "simulated"}`` (statistic name -> value; errors ``(simulated - measured) / measured`` in
    percent; the mean over the statistics with an error)."""
    sim = simulated(summary, result)
    errors = {name: 100.0 * (sim[name] - value) / value if value else float("nan")
              for name, value in summary.values.items()}
    finite = [abs(e) for e in errors.values() if math.isfinite(e)]
    return {"mean_abs_error_pct": float(np.mean(finite)) if finite else float("nan"), "errors_pct": errors,
            "measured": dict(summary.values), "simulated": sim}
