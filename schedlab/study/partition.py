"""Partitioned runs: a cluster whose router ignores load, simulated as independent parts.

With a router whose choice depends only on the request and its arrival order -- round robin,
``hash`` (a prefix or the request id hashed), ``class`` with one instance per class -- the
instances never influence each other in an open loop: what one instance does depends on the
requests routed to it alone. ``[cluster] partitions = K`` then splits a run into K tasks, part
``p`` simulating the instances ``i`` with ``i % K == p`` on the requests the router sends there
(every part reads the whole workload and keeps its own), and the runner hands the parts to its
workers -- local processes (``--jobs``) or Ray tasks -- like any other task. :func:`merge_parts`
puts the parts back together: every request's row is the one a single process gives (the same
arrivals reach the same instance in the same order), counters are summed (peaks: the largest),
and the metrics are computed again over the whole run (sums of floating-point counters may
differ from one process's in the last bits, as they are added in another order).

With ``[power]`` an instance's idle energy runs to the end of the run's window -- the last
iteration's end on any instance -- which a part cannot know before the others have run. Each part
meters its instances over its own window, from its first arrival to its own last iteration's
end, and keeps where each instance's last idle stretch starts
(:func:`schedlab.energy.meter.close_part`); the merge takes 0 (where every run's window starts) and
the latest end and idles every instance on to them (:func:`schedlab.energy.meter.join_parts`), so
the record, and the energy metrics computed from it -- per instance and in all, average power,
kWh, host and facility energy, energy per token and per request -- are one process's, summed
in another order. Every request's energy share is its row's, which is the same.

A router that looks at load (least outstanding, least KV, prefix affinity placing new groups by
load) cannot be split: a part would not see the other instances.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator

import numpy as np

from ..energy.meter import join_parts
from ..errors import ConfigError
from ..results.metrics import compute_metrics, compute_streamed_metrics
from ..results.records import RunResult

PEAK_COUNTERS = ("kv_peak_blocks", "peak_running", "peak_waiting", "kv_held_until_ms", "busy_until_ms")
SUMMED_META = ("gpus", "num_blocks", "events", "slots")


def members(part: int, parts: int, instances: int) -> list[int]:
    """The instances part ``part`` of ``parts`` simulates."""
    return [i for i in range(instances) if i % parts == part]


def check_partitionable(router, where: str) -> None:
    if not callable(getattr(router, "partition", None)):
        raise ConfigError(f"{where} [cluster] partitions: router {type(router).__name__} chooses by load, so its "
                          "instances cannot be simulated apart; use round_robin, hash or class with one instance "
                          "per class, or partitions = 1")


class PartRouter:
    """Routes a part's requests to where the full cluster's router sends them."""

    def __init__(self, router, instances: int, mine: list[int]):
        self.router = router
        self.instances = instances
        self.position = {index: pos for pos, index in enumerate(mine)}
        self.targets: dict[int, int] = {}

    def requests(self, requests: Iterable) -> Iterator:
        """The requests of the whole run that go to this part's instances, in arrival order."""
        for order, request in enumerate(requests):
            target = self.router.partition(request, order, self.instances)
            pos = self.position.get(target)
            if pos is not None:
                self.targets[request.id] = pos
                yield request

    def route(self, request, instances) -> int:
        return self.targets.pop(request.id)


def merge_parts(name: str, parts: list[RunResult]) -> RunResult:
    """One run from its parts (see the module docstring), compared with the real run it
    stands for, if any, once whole."""
    from ..targets import compare_with_real_run

    merged = _merged(name, parts)
    merged.measured, merged.target = parts[0].measured, parts[0].target
    compare_with_real_run(merged)
    return merged


def _merged(name: str, parts: list[RunResult]) -> RunResult:
    first = parts[0]
    counters = {}
    for key in first.counters:
        values = [p.counters[key] for p in parts]
        counters[key] = max(values) if key in PEAK_COUNTERS else sum(values)
    meta = dict(first.meta)
    for key in SUMMED_META:
        values = [p.meta.get(key) for p in parts]
        meta[key] = sum(values) if all(v is not None for v in values) else None
    meta["wall_ms"] = sum(p.meta.get("wall_ms", 0.0) for p in parts)
    meta["cpu_ms"] = sum(p.meta.get("cpu_ms", 0.0) for p in parts)
    meta["partitions"] = len(parts)
    if "energy" in meta:  # each part's meters stopped at its own end: idle on to the whole run's
        meta["energy"] = join_parts([p.meta["energy"] for p in parts])
    timeline = _concat([p.timeline for p in parts])
    if timeline.get("time_ms") is not None and timeline["time_ms"].size:
        order = np.lexsort((timeline["instance"], timeline["time_ms"]))
        timeline = {k: v[order] for k, v in timeline.items()}
    if any(p.stream is not None for p in parts):
        return _merge_streamed(name, parts, counters, timeline, meta)
    requests = _concat([p.requests for p in parts])
    order = np.argsort(requests["id"], kind="stable")
    requests = {k: v[order] for k, v in requests.items()}
    itl = _concat([p.itl for p in parts])
    rejections = {}
    for p in parts:
        rejections.update(p.rejections)
    meta["rejections"] = rejections
    metrics = compute_metrics(requests, counters, itl, meta)
    _add_cost_totals(metrics, parts)
    return RunResult(name, first.settings, requests, counters, itl, timeline, rejections, meta, metrics,
                     dict(first.point))


def _concat(tables: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    keys = [k for k in tables[0]]
    return {k: np.concatenate([t[k] for t in tables]) for k in keys}


def _add_cost_totals(metrics: dict, parts: list[RunResult]) -> None:
    """The cost model's per-request totals are sums over the finished requests: add the parts' up.
    A part that finished none has no totals (as a run that finished none) and adds nothing; the run
    has them when a part that finished some has them."""
    totals = [p.metrics.get("cost", {}) for p in parts]
    costed = [t for t in totals if "total_prefill_ms" in t]
    if not costed or any("total_prefill_ms" not in t and p.metrics.get("finished") for t, p in zip(totals, parts)):
        return
    pre = sum(t["total_prefill_ms"] for t in costed)
    dec = sum(t["total_decode_ms"] for t in costed)
    metrics["cost"].update(total_prefill_ms=pre, total_decode_ms=dec,
                           decode_share=dec / (pre + dec) if pre + dec else float("nan"))


def _merge_streamed(name: str, parts: list[RunResult], counters: dict, timeline: dict, meta: dict) -> RunResult:
    """Parts past ``exact_requests`` (any of them): their sketches and sums merge, their row files join.
    The sink is a streamed part's twin -- its row format, SLO targets, client side and energy -- so
    the rows of the parts that kept theirs count as that part's do (met SLOs, shares, sample)."""
    from ..results.stream import RowSink

    first = parts[0]
    like = next(p.stream for p in parts if p.stream is not None)
    sink = RowSink(like.settings, slo=like.stats.slo or None, client_side=like.stats.client_side,
                   energy=like.stats.metered)
    for p in parts:
        if p.stream is not None:
            sink.stats.merge(p.stream.stats)
            sink.itl.merge(p.stream.itl)
        else:  # a small part kept its rows: add them as one block
            sink.stats.add(p.requests, p.rejections)
            sink.itl.add_runs(p.itl["first"], p.itl["inc"], p.itl["count"], p.itl["weight"])
    sink.path = _join_row_files(parts, sink.settings.request_rows)
    meta["rejections"] = {}
    meta["requests_sampled"] = int(sink.stats.sample["id"].size) if sink.stats.sample is not None else 0
    metrics = compute_streamed_metrics(sink.stats, counters, sink.itl, meta)
    _add_cost_totals(metrics, parts)
    cost = metrics["cost"]
    sink.stats.costed = "total_prefill_ms" in cost  # the run's sums, as the metrics give them
    if sink.stats.costed:
        sink.stats.cost = [cost["total_prefill_ms"], cost["total_decode_ms"]]
    requests = sink.stats.sample_columns()
    empty = np.empty(0)
    itl = {"first": empty, "inc": empty, "count": empty.astype(np.int64), "weight": empty.astype(np.int64)}
    return RunResult(name, first.settings, requests, counters, itl, timeline, dict(sink.stats.sample_reasons), meta,
                     metrics, dict(first.point), rows_file=str(sink.path) if sink.path else None, stream=sink)


def _join_row_files(parts: list[RunResult], kind: str) -> Any:
    """One file of every part's rows, block by block: the files of the parts that streamed (then
    removed), and the rows of those that stayed below the limit and kept them in memory."""
    files = [p for p in parts if p.rows_file]
    if not files:
        return None
    target = files[0].rows_file + ".joined"
    (_join_parquet if kind == "parquet" else _join_csv)(parts, target)
    for p in files:
        os.unlink(p.rows_file)
    final = files[0].rows_file
    os.replace(target, final)
    return final


def _kept_rows(part: RunResult, names: list[str]):
    """The rows a part below the limit kept in memory, with its rejections' reasons, as a table of
    the columns ``names`` (a streamed file's, in its order)."""
    import pyarrow as pa

    columns = dict(part.requests)
    columns["reason"] = np.array([part.rejections.get(i, "") for i in columns["id"].tolist()], dtype=object)
    return pa.table({name: pa.array(columns[name].tolist() if columns[name].dtype == object else columns[name])
                     for name in names})


def _join_parquet(parts: list[RunResult], target: str) -> None:
    import pyarrow.parquet as pq

    schema = pq.read_schema(next(p.rows_file for p in parts if p.rows_file))
    writer = pq.ParquetWriter(target, schema)
    for p in parts:
        if p.rows_file:
            for batch in pq.ParquetFile(p.rows_file).iter_batches():
                writer.write_batch(batch)
        else:
            writer.write_table(_kept_rows(p, schema.names).cast(schema))
    writer.close()


def _join_csv(parts: list[RunResult], target: str) -> None:
    """CSV files joined as text: one header, then each part's lines (a CSV reader's inferred types,
    guessed from a file's first block, could not hold every part's values)."""
    import csv
    import io
    import shutil

    import pyarrow.csv as pcsv

    with open(next(p.rows_file for p in parts if p.rows_file), newline="") as fh:
        header = fh.readline()
    names = next(csv.reader([header]))
    with open(target, "wb") as out:
        out.write(header.encode())
        for p in parts:
            if p.rows_file:
                with open(p.rows_file, "rb") as fh:
                    fh.readline()  # (its header: the same)
                    shutil.copyfileobj(fh, out)
            else:
                buffer = io.BytesIO()
                pcsv.write_csv(_kept_rows(p, names), buffer, pcsv.WriteOptions(include_header=False))
                out.write(buffer.getvalue())
