"""What a run leaves behind: per-request columns, counters, ITL runs and a timeline.

Both engines write here. Columns are appended once per request (when it finishes or is
rejected), counters once per event or bulk run; nothing is stored per token. Inter-token
latencies are kept as *runs* ``(first value, increment, count, weight)``: ``count`` values
``first, first + inc, ...``, each seen ``weight`` times. A bulk run of k decode iterations
over n sequences is one such record.

Memory stays bounded however long the run: past ``exact_requests`` rows, each block of rows,
and the ITL runs recorded meanwhile, go to a *sink* (:class:`schedlab.results.stream.RowSink`:
a file and sketches) instead of being kept; the timeline keeps at most ``timeline_points`` rows
(every row, then every 2nd, 4th, ... row once it would hold more).
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from ..frontend import client_times

REQUEST_FLOAT_COLUMNS = (
    "arrival_ms", "taken_ms", "first_scheduled_ms", "first_token_ms", "finish_ms", "waiting_ms",
    "kv_ready_ms", "kv_pulled_ms", "kv_landed_ms", "decode_joined_ms", "energy_j", "sent_ms", "client_first_ms",
    "client_done_ms", "due_ms",
)
REQUEST_INT_COLUMNS = (
    "id", "instance", "prompt_tokens", "output_tokens", "max_tokens", "generated_tokens",
    "priority", "preemptions", "recomputed_tokens", "prefill_chunks", "cached_tokens",
    "swaps", "rejected", "prefill_instance", "kv_bytes", "aborted", "timed_out",
)
# taken_ms: when the engine's loop took the request from its input (its instance's first plan at or
# after its arrival, schedlab.engine.taking); -1 for a request turned away or given up on before.
# The client's view (schedlab.frontend): when the client sent the request, received its first
# byte and its last (or gave up: timed_out); -1 for rejected requests. finish_ms of an aborted
# request is when the engine aborted it (its KV blocks freed). due_ms: when the client meant to send
# it (a capped client holds it until a slot frees: Request.due_ms), sent_ms if it did not wait.
# Disaggregated serving (see schedlab.engine.transfer): the prefill instance, the KV bytes moved,
# when the prefill instance handed the prompt over, when the decode side allocated the blocks and
# started pulling, when they arrived, and when the request joined the decode instance's running
# set. -1 (0 bytes) for requests served colocated.
NO_TRANSFER = (-1, 0, -1.0, -1.0, -1.0, -1.0)
REQUEST_TEXT_COLUMNS = ("request_class", "client")

# One row per engine event: an iteration, or (fast engine) a run of identical decode iterations
# -- the run's last iteration in a row of its own when its KV use grew; with [power], a
# data-parallel rank's dummy steps too (no tokens: schedlab.engine.lockstep). duration_ms and
# iterations make the rows slices of the busy time (Perfetto traces); the batch columns are the
# row's iterations' (decodes, prefills and prefill tokens of each); energy_j is their GPUs'
# energy (NaN in a run without [power]).
TIMELINE = ("time_ms", "instance", "running", "waiting", "kv_used", "preemptions",
            "duration_ms", "iterations", "decodes", "prefills", "prefill_tokens", "energy_j")

COUNTERS = (
    "iterations",            # iterations run
    "busy_ms",               # time spent in iterations
    "prefill_iteration_ms",  # time in iterations that computed any prefill tokens
    "decode_only_ms",        # time in iterations that only decoded
    "prefill_tokens",        # prompt/recompute tokens computed
    "decode_tokens",         # tokens produced by decode steps
    "decode_seq_steps",      # (sequence, decode step) pairs: decode_tokens / this = tokens per step
    "spec_drafts",           # speculative decoding: sequence steps that verified drafts (vLLM num_drafts)
    "spec_draft_tokens",     # draft tokens verified
    "spec_accepted_tokens",  # of those, accepted
    "spec_padded_drafts",    # of spec_drafts: admissions padded with placeholder drafts (vLLM pad_spec_decode)
    "spec_padded_tokens",    # of spec_draft_tokens: those placeholders (all rejected)
    "generated_tokens",      # all output tokens (decode steps + prefill completions; less those discarded)
    "num_preemptions",       # recompute and swap preemptions
    "recompute_preemptions",
    "in_flight_preemptions",  # of those, of requests in a pipeline's batch in flight (it still brings their token)
    "swap_preemptions",
    "requeues",              # running requests sent to the back of the queue to be prefilled again (Plan.requeue:
                             # TGI's answer segments); not preemptions
    "recomputed_tokens",     # KV tokens computed a second time after a recompute preemption
    "discarded_tokens",      # output tokens of requests preempted while the batch computing them ran, dropped to
                             # be computed again (Plan.preempt discard_in_flight: SGLang's overlap scheduler)
    "swap_failures",         # swap-outs refused because swap space was full
    "swap_out_blocks",
    "swap_in_blocks",
    "swap_transfer_ms",      # time the swaps added to iterations
    "prefix_queries",        # tokens looked up in the prefix cache at a first admission (vLLM counter)
    "prefix_hits",           # of those, tokens found cached (in either tier)
    "host_hits",             # of those, tokens loaded back from the host-memory tier
    "prefix_preempted_queries",    # the same for re-admissions after a preemption (own blocks found again),
    "prefix_preempted_hits",       # which vLLM's and SGLang's hit rates leave out (engine/plan.py)
    "prefix_preempted_host_hits",
    "host_load_blocks",      # blocks loaded from the host tier
    "host_load_ms",          # time the reloads added to iterations
    "host_store_blocks",     # blocks the GPU cache evicted into the host tier
    "host_evictions",        # blocks the host tier dropped to make room
    "kv_block_ms",           # integral of blocks in use over time
    "kv_above_ms",           # time with KV usage above the high-water threshold
    "busy_until_ms",         # the end of the last iteration (after the last finish: a discarded decode,
                             # Plan.overshoot)
    "kv_held_until_ms",      # the last time blocks were held with no iteration running (a prefill
                             # instance's lease on abandoned prompts): the KV shares' window may end there
    "kv_peak_blocks",
    "running_seq_ms",        # integral of the running count over time
    "peak_running",
    "peak_waiting",
)


ROW_COLUMNS = (
    "arrival_ms", "taken_ms", "first_scheduled_ms", "first_token_ms", "finish_ms", "waiting_ms",
    "id", "instance", "prompt_tokens", "output_tokens", "max_tokens", "generated_tokens", "priority",
    "preemptions", "recomputed_tokens", "prefill_chunks", "cached_tokens", "swaps", "rejected",
    "request_class", "client", "prefill_instance", "kv_bytes", "kv_ready_ms", "kv_pulled_ms", "kv_landed_ms",
    "decode_joined_ms", "energy_j", "sent_ms", "client_first_ms", "client_done_ms", "aborted", "timed_out",
    "due_ms",
)
_FLUSH_ROWS = 1 << 15


class Recorder:
    """Accumulates one run's raw results (shared by every instance of the run)."""

    def __init__(self, *, timeline: bool = True, kv_high_water: float = 0.9, output_delay_ms: float = 0.0,
                 sink=None, exact_requests: int | None = None, timeline_points: int | None = None):
        self.sink = sink                      # where rows go past exact_requests (None: kept)
        self.limits: dict = {}                # instance -> its ConcurrencyLimit (engine.admission), if any
        self.listener = None                  # called (seq, finish_ms, rejected, client view) per request
        self.exact_requests = exact_requests
        self.streaming = False
        self.recorded = 0
        #: when the last request the engine finished or dropped left it (-inf: none); with the
        #: counters, the end of the engine's work (:func:`schedlab.results.metrics.engine_end_ms`)
        self.last_left_ms = -math.inf
        self._first_arrival = math.inf        # of the rows turned into columns so far
        self.timeline_points = timeline_points
        self._timeline_stride = 1
        self._timeline_seen = 0
        self._rows: list[tuple] = []
        self._chunks: list[dict[str, np.ndarray]] = []
        self.rejections: dict[int, str] = {}
        self.counters: dict[str, float] = {name: 0 for name in COUNTERS}
        self.itl_first = array("d")
        self.itl_inc = array("d")
        self.itl_count = array("q")
        self.itl_weight = array("q")
        self.keep_timeline = timeline
        self.timeline = {name: array("d") for name in TIMELINE}
        self.kv_high_water = kv_high_water
        #: from the iteration that produces a token to the client receiving it (schedlab.frontend)
        self.output_delay_ms = output_delay_ms

    # -- per request -------------------------------------------------------------------------
    def request_done(self, seq, instance: int, finish_ms: float, *, rejected: bool = False,
                     aborted: bool = False) -> None:
        """Record a finished, rejected or aborted sequence's row (``finish_ms``: when it left the engine)."""
        if self.limits and not rejected and instance in self.limits:
            self.limits[instance].end(finish_ms)  # (its slot of max_concurrent_requests)
        r = seq.request
        tr = seq.transfer
        if rejected:
            client = (-1.0, -1.0, False)
        elif aborted or r.timeout_ms is not None:
            client = client_times(r, seq.first_token_ms, finish_ms, self.output_delay_ms, aborted=aborted)
        else:  # the common case, inline: no deadline to miss
            first, delay = seq.first_token_ms, self.output_delay_ms
            client = (first + delay if first >= 0 else -1.0, finish_ms + delay, False)
        self._rows.append((
            r.arrival_ms, seq.taken_ms, seq.first_scheduled_ms, seq.first_token_ms, finish_ms, seq.waiting_ms,
            r.id, instance, r.prompt_tokens, r.output_tokens, r.max_output_tokens, seq.num_generated, r.priority,
            seq.num_preemptions, seq.recomputed_tokens, seq.prefill_chunks, seq.cached_tokens_total, seq.num_swaps,
            1 if rejected else 0, r.request_class, r.client,
            *(NO_TRANSFER if tr is None else tr.row()), seq.energy_j,
            r.sent_at, client[0], client[1], 1 if aborted else 0, 1 if client[2] else 0, r.due_at,
        ))
        self.recorded += 1
        if finish_ms > self.last_left_ms:
            self.last_left_ms = finish_ms
        if self.listener is not None:
            self.listener(seq, finish_ms, rejected, client)
        if len(self._rows) >= _FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        """Turn the buffered rows into column arrays (keeps memory per request small); past
        ``exact_requests``, hand them to the sink."""
        if not self._rows:
            return
        if self.sink is not None and not self.streaming and self.recorded > self.exact_requests:
            self._start_streaming()
        chunk = self._columns_of_rows()
        arrivals = chunk["arrival_ms"]
        if arrivals.size and arrivals.min() < self._first_arrival:
            self._first_arrival = float(arrivals.min())
        if self.streaming:
            self._stream(chunk)
        else:
            self._chunks.append(chunk)

    def first_arrival_ms(self) -> float:
        """The earliest arrival of every request recorded so far, streamed ones too (inf: none)."""
        self._flush()
        return self._first_arrival

    def _start_streaming(self) -> None:
        self.streaming = True
        for chunk in self._chunks:
            self._stream(chunk)
        self._chunks = []

    def _stream(self, chunk: dict) -> None:
        reasons = {}
        if self.rejections:
            for i in chunk["id"][chunk["rejected"] != 0].tolist():
                reason = self.rejections.pop(i, None)
                if reason is not None:
                    reasons[i] = reason
        self.sink.write(chunk, reasons)
        self._hand_on_itl()

    def _hand_on_itl(self) -> None:
        self.sink.add_itl(self.itl_first, self.itl_inc, self.itl_count, self.itl_weight)
        for buf in (self.itl_first, self.itl_inc, self.itl_count, self.itl_weight):
            del buf[:]

    def finish(self) -> None:
        """The run is over: hand the last rows on (a streamed run) and close the sink."""
        self._flush()
        if self.streaming:
            self._hand_on_itl()
            self.sink.close()

    def _columns_of_rows(self) -> dict:
        cols = list(zip(*self._rows))
        self._rows = []
        chunk = {}
        for name, values in zip(ROW_COLUMNS, cols):
            if name in REQUEST_FLOAT_COLUMNS:
                chunk[name] = np.array(values, dtype=np.float64)
            elif name in REQUEST_INT_COLUMNS:
                chunk[name] = np.array(values, dtype=np.int64)
            else:
                chunk[name] = np.array(values, dtype=object)
        return chunk

    def columns(self) -> dict[str, np.ndarray]:
        """Every recorded request as column arrays, in recording order.

        The chunks are joined one column at a time, each chunk's column released as soon as
        it is copied, and the joined columns kept as the only chunk: a 2-million-request run
        never holds its rows twice."""
        self._flush()
        if not self._chunks:
            return {name: np.empty(0, dtype=np.float64 if name in REQUEST_FLOAT_COLUMNS else
                                   np.int64 if name in REQUEST_INT_COLUMNS else object) for name in ROW_COLUMNS}
        if len(self._chunks) > 1:
            joined = {}
            for name in ROW_COLUMNS:
                joined[name] = np.concatenate([chunk.pop(name) for chunk in self._chunks])
            self._chunks = [joined]
        return self._chunks[0]

    def reject(self, seq, instance: int, reason: str, at: float = -1.0) -> None:
        """A rejected request's row: refused on arrival, or turned away from the queue ``at`` then
        (``Plan.reject``; it held a slot of ``max_concurrent_requests`` till then)."""
        self.rejections[seq.request.id] = reason
        if at >= 0 and self.limits and instance in self.limits:
            self.limits[instance].end(at)
        self.request_done(seq, instance, at, rejected=True)

    # -- inter-token latency -----------------------------------------------------------------
    def itl(self, value: float, weight: int = 1) -> None:
        if weight > 0:
            self.itl_first.append(value)
            self.itl_inc.append(0.0)
            self.itl_count.append(1)
            self.itl_weight.append(weight)

    def itl_run(self, first: float, inc: float, count: int, weight: int) -> None:
        if weight > 0 and count > 0:
            self.itl_first.append(first)
            self.itl_inc.append(inc)
            self.itl_count.append(count)
            self.itl_weight.append(weight)

    # -- timeline ----------------------------------------------------------------------------
    def sample(self, time_ms: float, instance: int, running: int, waiting: int, kv_used: int,
               duration_ms: float, iterations: int, batch, energy_j: float = math.nan) -> None:
        """One timeline row: state during the ``iterations`` iterations of ``batch``'s shape that
        start at ``time_ms`` and last ``duration_ms`` in all, using ``energy_j`` (``preemptions``
        is the run's cumulative count)."""
        if self.keep_timeline:
            self._timeline_seen += 1
            if (self._timeline_seen - 1) % self._timeline_stride:
                return
            t = self.timeline
            if self.timeline_points is not None and len(t["time_ms"]) >= self.timeline_points:
                for name, column in t.items():  # keep every other row: the stride doubles
                    t[name] = column[::2]
                self._timeline_stride *= 2
                if (self._timeline_seen - 1) % self._timeline_stride:
                    return
            t["time_ms"].append(time_ms)
            t["instance"].append(instance)
            t["running"].append(running)
            t["waiting"].append(waiting)
            t["kv_used"].append(kv_used)
            t["preemptions"].append(self.counters["num_preemptions"])
            t["duration_ms"].append(duration_ms)
            t["iterations"].append(iterations)
            t["decodes"].append(batch.num_decode)
            t["prefills"].append(batch.num_prefill)
            t["prefill_tokens"].append(batch.prefill_tokens)
            t["energy_j"].append(energy_j)
