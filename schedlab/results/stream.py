"""Runs too large to keep every request: rows go to a file as requests finish, metrics to sketches.

A run keeps its per-request rows in memory up to ``exact_requests`` (the default 50,000), and its
metrics are then exact, computed with numpy at the end (:mod:`schedlab.results.metrics`). Past
that the recorder hands every block of 32,768 rows to a :class:`RowSink`, which

* writes them as one row group of a Parquet file (or appends them to a CSV file), so the whole
  per-request table is on disk, in finishing order, with each rejected request's reason;
* adds them to :class:`StreamedRequests`: counts, sums and maxima exactly, latency percentiles
  from DDSketches (:mod:`schedlab.results.sketch`; within 1% of the exact value), SLO
  attainment, per class, per instance and per client, the client's view (timeouts, aborts and
  its latencies, :mod:`schedlab.frontend`) and the requests' energy shares (``[power]``), the
  same metric names as an exact run;
* keeps a uniform sample of the rows (:data:`SAMPLE_ROWS`, chosen by a hash of the request id,
  so the same run keeps the same sample) as the run's ``requests`` arrays, for the reports that
  draw distributions (CDF plots) and for the saturation check, computed on the sample.

Memory then no longer grows with the number of requests: one block of rows, the sketches and
the sample. Sketches and sums merge, so partitioned runs combine (:meth:`StreamedRequests.merge`).
"""

from __future__ import annotations

import atexit
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ..configs import int_field, str_field
from .metrics import LATENCY_NAMES
from .owners import owner_gone
from .sketch import Summary

#: Rows kept as the run's sample of requests (reports' CDF plots, the saturation check).
SAMPLE_ROWS = 20_000
ROW_FORMATS = ("parquet", "csv")
LATENCIES = LATENCY_NAMES
CLIENT_LATENCIES = ("ttft_ms", "tpot_ms", "e2el_ms", "ntpot_ms", "frontend_ms", "queue_ms", "e2el_incl_queue_ms")
_HASH = np.uint64(0x9E3779B97F4A7C15)


@attrs.frozen
class RecordSettings:
    """How a run keeps its per-request results (``[experiment]`` keys)."""

    exact_requests: int = int_field(50_000, min=0, help="runs with up to this many requests keep every row in memory "
                                                        "and compute exact metrics; larger runs stream rows to a file "
                                                        "and take percentiles from DDSketches (1% relative error)")
    request_rows: str = str_field("parquet", choices=ROW_FORMATS,
                                  help="the file a large run streams its per-request rows to: 'parquet' or 'csv'")
    timeline_points: int = int_field(100_000, min=2, help="most timeline rows a run keeps (beyond: every 2nd, "
                                                          "4th, ... row, evenly over the run)")


#: Streamed row files are named so in the spool until a results folder takes them
#: (``schedlab-requests-<owner's pid>-<random>.parquet``: see :func:`spool_owner`).
SPOOL_PREFIX = "schedlab-requests-"
#: The environment variable naming the process that owns the spool files a process writes: a
#: worker's are its main process's, which saves or drops them (:mod:`schedlab.study.executor`).
SPOOL_OWNER_ENV = "SCHEDLAB_SPOOL_OWNER"
_OWNED_SPOOL = re.compile(rf"{SPOOL_PREFIX}(?P<pid>[1-9][0-9]{{0,9}})-[a-z0-9_]{{8}}\.(?:parquet|csv)")


def spool_dir() -> Path:
    """Where streamed row files are written until the results folder takes them
    (``$SCHEDLAB_SPOOL``, else the system's temporary folder)."""
    return Path(os.environ.get("SCHEDLAB_SPOOL") or tempfile.gettempdir())


def spool_owner() -> int:
    """The process that owns the spool files this one writes: ``$SCHEDLAB_SPOOL_OWNER`` (a
    worker's main process), else this one."""
    text = os.environ.get(SPOOL_OWNER_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else os.getpid()


class SpoolFiles:
    """The spool files a process owns, removed when it exits if still there.

    A run's rows stay in the spool until a results folder takes them (moved: the path is gone
    then). A run never saved -- the Python API, a run that failed or was interrupted -- would
    leave them for ever (each can be gigabytes), so the owner drops what is left at exit; one
    killed outright leaves them to the next process that streams (:meth:`remove_abandoned`)."""

    def __init__(self):
        self.paths: set[str] = set()
        self._lock = threading.Lock()
        self._registered = False

    def own(self, path: str | os.PathLike) -> None:
        """Remove ``path`` at exit unless it has left the spool by then."""
        with self._lock:
            self.paths.add(os.fspath(path))
            if not self._registered:
                atexit.register(self.discard)
                self._registered = True

    def discard(self) -> list[str]:
        """Remove the owned files still in place (at exit); returns them."""
        with self._lock:
            paths, self.paths = sorted(self.paths), set()
        removed = []
        for path in paths:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:  # moved into a results folder, or already gone
                pass
        return removed

    @staticmethod
    def remove_abandoned(directory: str | os.PathLike) -> list[Path]:
        """Remove the spool files in ``directory`` whose owner no longer exists (a run killed
        outright); returns them. Files of an owner alive, and other names, are kept."""
        removed = []
        try:
            names = os.listdir(directory)
        except OSError:
            return removed
        for name in names:
            match = _OWNED_SPOOL.fullmatch(name)
            if match is None or not owner_gone(int(match.group("pid"))):
                continue
            path = Path(directory) / name
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
        return removed


#: This process's spool files (a process-wide resource: the files outlive any one run object).
SPOOL = SpoolFiles()


def _reason_kind(reason: str) -> str:
    return re.sub(r"\d+", "#", reason)


class Group:
    """The per-request figures of one group of requests (the run, a class, an instance)."""

    __slots__ = ("requests", "finished", "generated", "met", "latency", "energy_j")

    def __init__(self) -> None:
        self.requests = self.finished = self.generated = self.met = 0
        self.latency = {name: Summary() for name in LATENCIES}
        self.energy_j = 0.0  # every request's energy share (schedlab.energy.metrics)

    def add(self, req: dict, lat: dict, ok: np.ndarray, met: np.ndarray | None) -> None:
        """A block of rows: ``ok`` the completed ones (:func:`~schedlab.results.metrics.completed`)."""
        self.requests += int(req["id"].size)
        self.finished += int(ok.sum())
        self.generated += int(req["generated_tokens"][ok].sum())
        if met is not None:
            self.met += int(met.sum())
        for name in LATENCIES:
            self.latency[name].add(lat[name])
        self.energy_j += float(req["energy_j"].sum())

    def merge(self, other: "Group") -> None:
        self.requests += other.requests
        self.finished += other.finished
        self.generated += other.generated
        self.met += other.met
        for name in LATENCIES:
            self.latency[name].merge(other.latency[name])
        self.energy_j += other.energy_j


class EnergyShares:
    """A streamed run's energy shares (:mod:`schedlab.energy.metrics`): the completed requests'
    count, output tokens and shares' summary, and every request's shares summed."""

    __slots__ = ("finished", "generated", "j", "shares")

    def __init__(self) -> None:
        self.finished = self.generated = 0
        self.j = 0.0
        self.shares = Summary()

    def add(self, req: dict, ok: np.ndarray) -> None:
        shares = req["energy_j"]
        self.finished += int(ok.sum())
        self.generated += int(req["generated_tokens"][ok].sum())
        self.j += float(shares.sum())
        self.shares.add(shares[ok])

    def merge(self, other: "EnergyShares") -> None:
        self.finished += other.finished
        self.generated += other.generated
        self.j += other.j
        self.shares.merge(other.shares)


class StreamedRequests:
    """Everything the metrics need from a run's rows, accumulated block by block."""

    def __init__(self, slo: dict | None = None, request_cost=None, *, client_side: bool = True,
                 energy: bool = True):
        self.slo = slo or {}
        # Sketches kept only where they tell something: without a client side the client's view
        # is the engine's (ttft, tpot, e2e; frontend 0), without [power] there are no shares.
        self.client_side = client_side
        self.metered = energy
        self.request_cost = request_cost
        self.costed = request_cost is not None  # cost sums kept (the function itself is dropped at the end)
        self.run = Group()
        self.rejected = self.timed_out = self.aborted = 0
        self.client = {name: Summary() for name in CLIENT_LATENCIES}  # the client's view (schedlab.frontend)
        self.energy = EnergyShares()
        self.classes: dict[str, Group] = {}
        self.instances: dict[int, Group] = {}
        self.clients: dict[str, list] = {}  # requests, finished, prompt, generated, first arrival, last finish
        self.first_arrival = np.inf
        self.last_served = -np.inf   # of every request that left the engine (the makespan's end: left_the_engine)
        self.waiting_ms = 0.0
        self.chunks_sum = 0
        self.chunks_max = 0
        self.cost = [0.0, 0.0]
        self.reasons: dict[str, int] = {}
        self.transfers = 0
        self.transfer_bytes = 0
        self.transfer = {name: Summary() for name in ("kv_wait_ms", "transfer_ms", "join_wait_ms", "decode_queue_ms")}
        from .metrics import ABORT_PLACES

        self.aborted_places = dict.fromkeys(ABORT_PLACES, 0)
        self.sample: dict[str, np.ndarray] | None = None
        self.sample_hash = np.empty(0, dtype=np.uint64)
        self.sample_reasons: dict[int, str] = {}
        self.hour_requests = np.zeros(0)  # requests and SLO-met finishes by hour of arrival
        self.hour_met = np.zeros(0)

    # -- adding a block of rows --------------------------------------------------------------
    def add(self, req: dict[str, np.ndarray], reasons: dict[int, str]) -> None:
        from .metrics import (aborted_places, arrival_hours, client_latencies, completed, left_the_engine,
                              request_counts, request_latencies, slo_met)

        n = int(req["id"].size)
        if not n:
            return
        ok = completed(req)
        lat = request_latencies(req)
        met = slo_met(req, ok, self.slo) if self.slo else None
        self.run.add(req, lat, ok, met)
        counts = request_counts(req)
        self.rejected += counts["rejected"]
        self.timed_out += counts["timed_out"]
        self.aborted += counts["aborted"]
        if self.client_side:
            for name, values in client_latencies(req).items():
                self.client[name].add(values)
        else:  # only E2E per output token and a capped client's wait are the client's own
            generated = req["generated_tokens"][ok]
            self.client["ntpot_ms"].add(lat["e2e_ms"] / generated)
            waited = (req["sent_ms"][ok] - req["due_ms"][ok]) if "due_ms" in req else np.zeros(int(ok.sum()))
            self.client["queue_ms"].add(waited)
            self.client["e2el_incl_queue_ms"].add(lat["e2e_ms"] + waited)
        if self.metered:
            self.energy.add(req, ok)
        hours = arrival_hours(req["arrival_ms"])
        self._add_hours(np.bincount(hours), np.bincount(hours[ok], weights=met) if met is not None else None)
        self._add_groups(self.classes, req["request_class"], req, ok, met)
        self._add_groups(self.instances, req["instance"], req, ok, met)
        self.first_arrival = min(self.first_arrival, float(req["arrival_ms"].min()))
        left = left_the_engine(req)
        if left.any():
            self.last_served = max(self.last_served, float(req["finish_ms"][left].max()))
        if ok.any():
            chunks = req["prefill_chunks"][ok]
            self.chunks_sum += int(chunks.sum())
            self.chunks_max = max(self.chunks_max, int(chunks.max()))
            if self.request_cost is not None:
                pre, dec = self.request_cost(req["prompt_tokens"][ok].astype(float),
                                             req["generated_tokens"][ok].astype(float))
                self.cost[0] += float(np.sum(pre))
                self.cost[1] += float(np.sum(dec))
        self.waiting_ms += float(req["waiting_ms"].sum())
        for reason in reasons.values():
            kind = _reason_kind(reason)
            self.reasons[kind] = self.reasons.get(kind, 0) + 1
        self._add_clients(req, ok)
        moved = ok & (req["kv_pulled_ms"] >= 0)
        if "kv_pulled_ms" in req and req["aborted"].any():
            for name, n in aborted_places(req).items():
                self.aborted_places[name] += n
        if moved.any():
            first, pulled = req["kv_ready_ms"][moved], req["kv_pulled_ms"][moved]
            landed, joined = req["kv_landed_ms"][moved], req["decode_joined_ms"][moved]
            self.transfers += int(moved.sum())
            self.transfer_bytes += int(req["kv_bytes"][moved].sum())
            self.transfer["kv_wait_ms"].add(pulled - first)
            self.transfer["transfer_ms"].add(landed - pulled)
            self.transfer["join_wait_ms"].add(joined - landed)
            self.transfer["decode_queue_ms"].add(joined - first)
        self._add_sample(req, reasons)

    def _add_hours(self, requests: np.ndarray, met: np.ndarray | None) -> None:
        size = max(self.hour_requests.size, requests.size, 0 if met is None else met.size)
        for name, add in (("hour_requests", requests), ("hour_met", met)):
            have = np.zeros(size)
            mine = getattr(self, name)
            have[:mine.size] += mine
            if add is not None:
                have[:add.size] += add
            setattr(self, name, have)

    def _add_groups(self, groups: dict, keys: np.ndarray, req, ok, met) -> None:
        for key in np.unique(keys).tolist():
            sel = keys == key
            sub = {k: v[sel] for k, v in req.items()}
            from .metrics import request_latencies

            groups.setdefault(key, Group()).add(sub, request_latencies(sub), ok[sel],
                                                None if met is None else met[sel[ok]])

    def _add_clients(self, req, ok) -> None:
        clients = req["client"]
        for client in np.unique(clients).tolist():
            mine = clients == client
            done = mine & ok
            entry = self.clients.setdefault(str(client), [0, 0, 0, 0, np.inf, -np.inf])
            entry[0] += int(mine.sum())
            entry[1] += int(done.sum())
            entry[2] += int(req["prompt_tokens"][done].sum())
            entry[3] += int(req["generated_tokens"][done].sum())
            entry[4] = min(entry[4], float(req["arrival_ms"][mine].min()))
            if done.any():
                entry[5] = max(entry[5], float(req["finish_ms"][done].max()))

    def _add_sample(self, req, reasons) -> None:
        """Keep the SAMPLE_ROWS rows of smallest id hash seen so far (the same rows for the same run)."""
        h = req["id"].astype(np.uint64) * _HASH
        if self.sample is None:
            merged, hashes = req, h
        else:
            merged = {k: np.concatenate([self.sample[k], req[k]]) for k in req}
            hashes = np.concatenate([self.sample_hash, h])
        if hashes.size > SAMPLE_ROWS:
            keep = np.sort(np.argpartition(hashes, SAMPLE_ROWS - 1)[:SAMPLE_ROWS])
            merged = {k: v[keep] for k, v in merged.items()}
            hashes = hashes[keep]
        self.sample, self.sample_hash = merged, hashes
        self.sample_reasons.update(reasons)
        if len(self.sample_reasons) > 4 * SAMPLE_ROWS:
            kept = set(merged["id"].tolist())
            self.sample_reasons = {i: r for i, r in self.sample_reasons.items() if i in kept}

    def client_view(self) -> dict[str, dict[str, float]]:
        """The client's latency summaries (as :func:`~schedlab.results.metrics.client_latencies`)."""
        out = {name: summary.result() for name, summary in self.client.items()}
        if not self.client_side:
            zero = Summary()
            zero.add_weighted(0.0, self.run.finished)
            latency = self.run.latency
            out.update(ttft_ms=latency["ttft_ms"].result(), tpot_ms=latency["tpot_ms"].result(),
                       e2el_ms=latency["e2e_ms"].result(), frontend_ms=zero.result())
        return out

    def counts(self) -> dict[str, int]:
        """As :func:`schedlab.results.metrics.request_counts` of every row."""
        return {"requests": self.run.requests, "finished": self.run.finished, "rejected": self.rejected,
                "timed_out": self.timed_out, "aborted": self.aborted}

    # -- combining ---------------------------------------------------------------------------
    def merge(self, other: "StreamedRequests") -> None:
        """Add another part of the same run (a partition: other instances)."""
        self.run.merge(other.run)
        self.rejected += other.rejected
        self.timed_out += other.timed_out
        self.aborted += other.aborted
        for name, summary in other.client.items():
            self.client[name].merge(summary)
        self.client_side = self.client_side and other.client_side
        self.energy.merge(other.energy)
        self.metered = self.metered and other.metered
        for mine, theirs in ((self.classes, other.classes), (self.instances, other.instances)):
            for key, group in theirs.items():
                mine.setdefault(key, Group()).merge(group)
        for client, e in other.clients.items():
            entry = self.clients.setdefault(client, [0, 0, 0, 0, np.inf, -np.inf])
            for i in range(4):
                entry[i] += e[i]
            entry[4], entry[5] = min(entry[4], e[4]), max(entry[5], e[5])
        self.first_arrival = min(self.first_arrival, other.first_arrival)
        self.last_served = max(self.last_served, other.last_served)
        self.waiting_ms += other.waiting_ms
        self.chunks_sum += other.chunks_sum
        self.chunks_max = max(self.chunks_max, other.chunks_max)
        self.cost = [a + b for a, b in zip(self.cost, other.cost)]
        self.costed = self.costed and other.costed
        for kind, n in other.reasons.items():
            self.reasons[kind] = self.reasons.get(kind, 0) + n
        self._add_hours(other.hour_requests, other.hour_met)
        self.transfers += other.transfers
        self.transfer_bytes += other.transfer_bytes
        for name, summary in other.transfer.items():
            self.transfer[name].merge(summary)
        for name, n in other.aborted_places.items():
            self.aborted_places[name] += n
        if other.sample is not None:
            self._add_sample(other.sample, other.sample_reasons)

    def sample_columns(self) -> dict[str, np.ndarray]:
        """The sampled rows, ordered by request id."""
        order = np.argsort(self.sample["id"], kind="stable")
        return {k: v[order] for k, v in self.sample.items()}


class RowSink:
    """Writes a large run's rows to ``path`` block by block and accumulates its metrics."""

    def __init__(self, settings: RecordSettings, *, slo: dict | None = None, request_cost=None,
                 directory: Path | None = None, client_side: bool = True, energy: bool = True):
        self.settings = settings
        self.stats = StreamedRequests(slo, request_cost, client_side=client_side, energy=energy)
        self.itl = Summary()
        self.path: Path | None = None
        self._directory = directory
        self._writer = None
        self.rows = 0

    def write(self, chunk: dict[str, np.ndarray], reasons: dict[int, str]) -> None:
        """One block of rows (column arrays) and the reasons of the rejected ones among them."""
        import pyarrow as pa

        ids = chunk["id"].tolist()
        columns = dict(chunk)
        columns["reason"] = np.array([reasons.get(i, "") for i in ids], dtype=object)
        table = pa.table({k: pa.array(v.tolist() if v.dtype == object else v) for k, v in columns.items()})
        if self._writer is None:
            self._open(table.schema)
        if self.settings.request_rows == "parquet":
            self._writer.write_table(table)
        else:
            self._writer.write(table)
        self.rows += len(ids)
        self.stats.add(chunk, reasons)

    def add_itl(self, first, inc, count, weight) -> None:
        """Inter-token-latency runs recorded since the last block (array buffers)."""
        self.itl.add_runs(np.array(first, dtype=np.float64), np.array(inc, dtype=np.float64),
                          np.array(count, dtype=np.int64), np.array(weight, dtype=np.int64))

    def _open(self, schema) -> None:
        directory = self._directory or spool_dir()
        directory.mkdir(parents=True, exist_ok=True)
        suffix = "." + self.settings.request_rows
        owner = spool_owner()
        SpoolFiles.remove_abandoned(directory)  # what runs killed outright left goes first
        fd, name = tempfile.mkstemp(dir=directory, prefix=f"{SPOOL_PREFIX}{owner}-", suffix=suffix)
        os.close(fd)
        self.path = Path(name)
        if owner == os.getpid():  # (a worker's: its main process owns them when they arrive)
            SPOOL.own(self.path)
        if self.settings.request_rows == "parquet":
            import pyarrow.parquet as pq

            self._writer = pq.ParquetWriter(self.path, schema)
        else:
            import pyarrow.csv as pcsv

            self._writer = pcsv.CSVWriter(self.path, schema)

    def close(self) -> Any:
        self.stats.request_cost = None  # the cost model stays where it ran (results travel between processes)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.path


def read_rows(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A streamed run's rows back as column arrays (Parquet or CSV, by the file's suffix)."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    path = Path(path)
    table = pq.read_table(path) if path.suffix == ".parquet" else pcsv.read_csv(path)
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
