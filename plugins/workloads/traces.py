"""Published LLM-serving traces: Azure LLM inference 2023, Vidur's splitwise files, Mooncake, BurstGPT.

* ``azure`` -- ``TIMESTAMP,ContextTokens,GeneratedTokens`` with absolute timestamps such as
  ``2023-11-16 18:17:03.9799600`` (2023) or ``2024-05-10 00:00:00.009930+00:00`` (2024: a time
  zone, ``Z`` or ``+hh:mm`` / ``-hh:mm``, is converted to UTC; a file mixing stamps with and
  without one is refused, naming the first without); arrivals become ms after the
  earliest request (Patel et al., "Splitwise", ISCA 2024; github.com/Azure/AzurePublicDataset).
  A TIMESTAMP in another form -- a number of seconds, a date alone -- is an error naming its
  line. Other columns are not read: the 2025 multimodal trace's ``NumImages`` is left out (a
  request's images are not simulated; its ``ContextTokens`` count its prompt as served).
* ``vidur`` -- Vidur's ``splitwise_*.csv``: ``arrived_at`` (seconds), ``num_prefill_tokens``,
  ``num_decode_tokens`` (the same Azure data re-based; github.com/microsoft/vidur).
* ``mooncake`` -- Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (one id per 512-token prefix block, each naming the whole
  prefix up to the end of its block; Qin et al., FAST 2025). ``jitter_ms`` spreads each request
  over ``[t, t + jitter_ms)`` of trace time before ``time_scale`` stretches the trace (the
  conversation trace's timestamps are quantised to about 3 s: ``jitter_ms = 3000`` fills every
  quantum at any scale).
* ``burstgpt`` -- BurstGPT's CSV: ``Timestamp`` (seconds), ``Model``, ``Request tokens``,
  ``Response tokens``, ``Log Type`` (columns found by their names: later releases add
  ``Session ID`` and ``Elapsed time``); failed requests, written with 0 response tokens, are
  dropped by default; ``model`` and ``log_type`` keep one model's or one kind's requests (Wang et
  al., KDD 2025).

Arrival times are bounded by the simulated clock's end (1e12 ms): a timestamp past it, or a
trace spanning more from its earliest request, is refused where the file is read, naming its
line, and a ``time_scale`` (and jitter) that would take the last arrival past it when the
workload is made.

The trace files may be gzip-compressed (``.csv.gz``, ``.jsonl.gz``: read as they are, see
:mod:`.records`).

Zero token counts. A request cannot have 0 prompt or 0 output tokens. The Azure 2023 traces
and Vidur's copies have none (smallest counts: 2 context / 7 generated tokens in conv, 3 / 6
in code), but other releases of such traces may. ``zero_tokens`` says what to do with a row
holding a 0: ``"clamp"`` (default) raises it to 1 -- a request that generated nothing still
cost a prefill, and 1 output token is the nearest request the simulator can serve;
``"drop"`` leaves the row out; ``"error"`` stops with the row's line. The workload's
``info["zero_token_rows"]`` tells how many rows were clamped or dropped.
"""

from __future__ import annotations

import attrs
import numpy as np

from schedlab.configs import MAX_TIME_MS, MAX_TOKENS, float_field, int_field, path_field, str_field
from schedlab.errors import WorkloadError

from .arrivals import JITTER_STREAM, stream_rng
from .columns import CLOCK_END, OpenLoopWorkload, RequestColumns, scaled
from .records import Records, file_suffix, read_records, show_value

ZERO_TOKEN_POLICIES = ("clamp", "drop", "error")


def _path(help: str):
    return path_field(help=help)


def _limit():
    return int_field(None, min=1, optional=True, help="use only the first N rows of the trace")


def _time_scale():
    return float_field(1.0, min=0, min_exclusive=True,
                       help="multiply every arrival time by this (2 = half the load, 0.5 = twice the load)")


def _max_tokens():
    return int_field(None, min=1, max=MAX_TOKENS, optional=True, help="max_tokens (the client's length limit) for every request")


def _zero_tokens():
    return str_field("clamp", choices=ZERO_TOKEN_POLICIES,
                     help="rows with 0 prompt or output tokens: 'clamp' to 1, 'drop' them, or 'error'")


def token_counts(records: Records, policy: str,
                 rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """``(prompt, output, keep, n_zero)`` from a trace's token columns under a zero-token policy,
    over the ``rows`` (indices) a filter kept, or all.

    ``keep`` is the mask of those rows to keep (None: all); ``n_zero`` counts rows with a zero.
    """
    prompt = records.ints("prompt_tokens", min=0, max=MAX_TOKENS)
    output = records.ints("output_tokens", min=0, max=MAX_TOKENS)
    if rows is not None:
        prompt, output = prompt[rows], output[rows]
    zero = (prompt == 0) | (output == 0)
    n_zero = int(zero.sum())
    if n_zero == 0:
        return prompt, output, None, 0
    if policy == "error":
        row = int(np.flatnonzero(zero)[0])
        prompt_zero = prompt[row] == 0
        row = int(rows[row]) if rows is not None else row
        field = "prompt_tokens" if prompt_zero else "output_tokens"
        raise WorkloadError(f"{records.where(row)}: {records.label(field)}: is 0 "
                            f"(set zero_tokens = \"clamp\" or \"drop\" to accept such rows)")
    if policy == "clamp":
        return np.maximum(prompt, 1), np.maximum(output, 1), None, n_zero
    keep = ~zero
    if not keep.any():
        raise WorkloadError(f"{records.path}: every row has 0 tokens; nothing left after zero_tokens = \"drop\"")
    return prompt[keep], output[keep], keep, n_zero


#: The Azure traces' TIMESTAMP: ``YYYY-MM-DD hh:mm:ss`` with up to 9 decimals, a space or a
#: ``T`` between date and time, and an optional time zone: ``Z`` or ``+hh:mm`` / ``-hh:mm`` (the
#: 2024 traces write ``2024-05-10 00:00:00.009930+00:00``). numpy's own parser is wider and would
#: take other text silently: ``"1"`` or ``"1700000000"`` as a year (wrapping around outside
#: 1678-2261, the years int64 nanoseconds hold), ``"now"``, or an offset it applies with a
#: warning; so the offset is read here and the rest must have this shape.
_STAMP_SHAPE = "dddd-dd-dd?dd:dd:dd"
_STAMP_YEARS = (1678, 2261)
_STAMP_WIDTH = len(_STAMP_SHAPE) + 10     # with "." and up to 9 decimals
_ZONE_WIDTH = len("+hh:mm")


def _timestamp_codes(texts: list) -> np.ndarray:
    """The texts' bytes, one row each, zero-padded to the widest stamp with a time zone ("" for
    anything longer, not ASCII or not text)."""
    width = _STAMP_WIDTH + _ZONE_WIDTH
    strings = [t if isinstance(t, str) and len(t) <= width and t.isascii() else "" for t in texts]
    return np.array(strings, dtype=f"S{width}").view(np.uint8).reshape(len(texts), width).copy()


def _split_zones(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Take a trailing ``Z``, ``+hh:mm`` or ``-hh:mm`` off each row of ``codes`` (in place):
    ``(rows that had one, their offset from UTC in minutes)``."""
    n, width = codes.shape
    filled = codes != 0
    length = np.where(filled.any(axis=1), width - np.argmax(filled[:, ::-1], axis=1), 0)
    rows = np.arange(n)

    def at(back: int) -> np.ndarray:   # the byte ``back`` places before each row's end (0 before its start)
        return np.where(length >= back, codes[rows, np.maximum(length - back, 0)], 0).astype(np.int32)

    digits = {back: at(back) - 48 for back in (5, 4, 2, 1)}
    hours, minutes = digits[5] * 10 + digits[4], digits[2] * 10 + digits[1]
    zone = ((length >= len(_STAMP_SHAPE) + _ZONE_WIDTH) & ((at(6) == ord("+")) | (at(6) == ord("-")))
            & (at(3) == ord(":")) & np.logical_and.reduce([(d >= 0) & (d <= 9) for d in digits.values()])
            & (hours <= 23) & (minutes <= 59))
    offset = np.where(zone, np.where(at(6) == ord("-"), -1, 1) * (hours * 60 + minutes), 0)
    zulu = (length > len(_STAMP_SHAPE)) & (at(1) == ord("Z"))
    cut = np.where(zone, _ZONE_WIDTH, np.where(zulu, 1, 0))
    codes[np.arange(width)[None, :] >= (length - cut)[:, None]] = 0
    return zone | zulu, offset


def _timestamp_shape_ok(codes: np.ndarray) -> np.ndarray:
    """Per row of ``codes`` (a stamp's bytes, time zone taken off): True when it has the shape of
    :data:`_STAMP_SHAPE` with optional decimals and a year numpy reads exactly."""
    digit = (codes >= 48) & (codes <= 57)
    # 19 characters, or "." and 1-9 decimal digits after them (then the zeros that pad the row)
    ok = (codes[:, 19] == 0) | ((codes[:, 19] == 46) & digit[:, 20])
    pad = (codes[:, 20:] == 0).astype(np.int8)
    ok &= (digit[:, 20:] | (pad == 1)).all(axis=1) & (np.diff(pad, axis=1) >= 0).all(axis=1)
    ok &= (codes[:, _STAMP_WIDTH:] == 0).all(axis=1)
    for i, c in enumerate(_STAMP_SHAPE):
        if c == "d":
            ok &= digit[:, i]
        elif c == "?":
            ok &= (codes[:, i] == 32) | (codes[:, i] == 84)                   # " " or "T"
        else:
            ok &= codes[:, i] == ord(c)
    year = sum((codes[:, i].astype(np.int32) - 48) * 10 ** (3 - i) for i in range(4))
    return ok & (year >= _STAMP_YEARS[0]) & (year <= _STAMP_YEARS[1])


def _read_stamps(texts: list, chunk: int = 1 << 18) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(ok, stamp bytes without their time zone, had a time zone, its offset in minutes)`` per
    text, ``chunk`` rows at a time (bounds the temporaries)."""
    if len(texts) > chunk:
        parts = [_read_stamps(texts[i:i + chunk], chunk) for i in range(0, len(texts), chunk)]
        return tuple(np.concatenate(p) for p in zip(*parts))
    codes = _timestamp_codes(texts)
    zoned, minutes = _split_zones(codes)
    return _timestamp_shape_ok(codes), codes.view(f"S{codes.shape[1]}").ravel(), zoned, minutes


def _mixed_zones(records: Records, field: str, texts: list, ok: np.ndarray, zoned: np.ndarray) -> None:
    """WorkloadError naming the first well-formed stamp without a time zone in a column whose
    other stamps have one (a stamp without one would be taken as UTC: hours off, silently)."""
    bare, bad = np.flatnonzero(ok & ~zoned), np.flatnonzero(~ok)
    if not bare.size or (bad.size and bad[0] < bare[0]):
        return   # a malformed stamp comes first: the caller names it
    row, other = int(bare[0]), int(np.flatnonzero(zoned)[0])
    raise WorkloadError(f"{records.where(row)}: {records.label(field)}: {show_value(texts[row])} has no time zone, but "
                        f"{records.unit} {records.positions[other]}'s {show_value(texts[other])} has one: a file that "
                        "mixes them is likely two traces joined (a stamp without one would be read as UTC); give "
                        "every stamp its zone (+00:00 for UTC) or none")


def parse_timestamps_ns(records: Records, field: str) -> np.ndarray:
    """A column of ``YYYY-MM-DD hh:mm:ss[.fffffffff][Z|+hh:mm|-hh:mm]`` timestamps as int64
    nanoseconds, in UTC when they name a time zone (so stamps with different offsets order
    right); anything else (a number of seconds, a date alone) is an error naming the row, and so
    is a stamp without a time zone in a column whose other stamps have one."""
    texts = records.texts(field)   # all rows' text at once (a CSV's cells are text)
    ok, bodies, zoned, minutes = _read_stamps(texts)
    any_zone = bool(zoned.any())
    if any_zone and not zoned.all():
        _mixed_zones(records, field, texts, ok, zoned)
    stamps = None
    if ok.all():
        try:   # without time zones, the texts as they are (as before time zones were read)
            stamps = np.array(bodies if any_zone else texts, dtype="datetime64[ns]")
        except (ValueError, TypeError):   # a month 13, a 25th hour...: found row by row below
            pass
    if stamps is None or np.isnat(stamps).any():
        for row, text in enumerate(texts):
            try:
                good = bool(ok[row]) and not np.isnat(np.datetime64(bodies[row].decode(), "ns"))
            except (ValueError, TypeError):
                good = False
            if not good:
                raise WorkloadError(f"{records.where(row)}: {records.label(field)}: not a date and time like "
                                    f"'2023-11-16 18:17:03.9799600' or '2024-05-10 00:00:00.009930+00:00' (time "
                                    f"zone Z, +hh:mm or -hh:mm if any; years {_STAMP_YEARS[0]}-{_STAMP_YEARS[1]}), "
                                    f"got {show_value(text)}")
    stamps = stamps.astype(np.int64)
    return stamps - minutes.astype(np.int64) * 60_000_000_000 if any_zone else stamps


def _check_span(records: Records, field: str, times_ms: np.ndarray, rows: np.ndarray | None) -> None:
    """WorkloadError naming the row whose ``field`` lies further after the earliest one than the
    simulated clock reaches: a trace's arrivals count from its earliest request. ``times_ms`` are
    the kept rows' (``rows``: their indices in ``records``; None: every row)."""
    with np.errstate(over="ignore", invalid="ignore"):
        span = times_ms - times_ms.min()
    late, first = int(np.argmax(span)), int(np.argmin(times_ms))
    if not span[late] <= MAX_TIME_MS:
        row, first = (late, first) if rows is None else (int(rows[late]), int(rows[first]))
        raise WorkloadError(f"{records.where(row)}: {records.label(field)}: {span[late]:.4g} ms after the earliest "
                            f"request ({records.unit} {records.positions[first]}), past the simulated clock's end "
                            f"({MAX_TIME_MS:g} ms, about 31.7 years)")


def _trace_workload(name: str, path, arrival_ms: np.ndarray, columns: RequestColumns, *, n_zero: int,
                    time_scale: float = 1.0, jitter_ms: float = 0.0) -> OpenLoopWorkload:
    """The workload of a trace's requests, ``arrival_ms`` in the trace's own time.

    Each arrival ``t`` is first spread uniformly over ``[t, t + jitter_ms)`` with the seed -- in
    trace time, so that the jitter covers one quantum of the trace's timestamps whatever the
    scale -- and then multiplied by ``time_scale``: a request lands in ``[t x s, (t + jitter_ms)
    x s)`` of the run. The last possible arrival must be within the simulated clock (refused
    here, when the trace is read, naming ``time_scale`` and ``jitter_ms``)."""
    last = (float(arrival_ms.max()) + jitter_ms) * time_scale if len(arrival_ms) else 0.0
    if not last <= MAX_TIME_MS:
        settings = f"time_scale = {time_scale:g}" + (f" and jitter_ms = {jitter_ms:g}" if jitter_ms > 0 else "")
        raise WorkloadError(f"{path}: with {settings} the last request may arrive at {last:.4g} ms, past the "
                            f"simulated clock's end ({MAX_TIME_MS:g} ms, about 31.7 years)")
    replayed = scaled(arrival_ms, time_scale) if time_scale != 1.0 else arrival_ms

    def build(seed: int):
        if jitter_ms <= 0:
            return replayed, columns
        offsets = stream_rng(seed, JITTER_STREAM).uniform(0.0, jitter_ms, len(arrival_ms))
        # t + u can round up to t + jitter for large t; keep every arrival below it.
        ceiling = np.nextafter(arrival_ms + jitter_ms, -np.inf)
        jittered = np.minimum(arrival_ms + offsets, np.maximum(ceiling, arrival_ms))
        return (scaled(jittered, time_scale) if time_scale != 1.0 else jittered), columns

    workload = OpenLoopWorkload(build, name=name, num_requests=len(columns))
    workload.info["zero_token_rows"] = n_zero
    return workload


# --- azure ---------------------------------------------------------------------------------

AZURE_COLUMNS = {"timestamp": ("TIMESTAMP",), "prompt_tokens": ("ContextTokens",),
                 "output_tokens": ("GeneratedTokens",)}


@attrs.frozen
class AzureConfig:
    path: str = _path("Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)")
    limit: int | None = _limit()
    time_scale: float = _time_scale()
    max_tokens: int | None = _max_tokens()
    zero_tokens: str = _zero_tokens()


def load_azure(path, *, limit: int | None = None, zero_tokens: str = "clamp"):
    """``(arrival_ms, columns, n_zero)`` of an Azure 2023 trace; arrivals in ms after the earliest."""
    records = read_records(path, AZURE_COLUMNS, format="csv", required=tuple(AZURE_COLUMNS), limit=limit)
    if len(records) == 0:
        raise WorkloadError(f"{path}: no requests in the trace")
    stamps = parse_timestamps_ns(records, "timestamp")
    prompt, output, keep, n_zero = token_counts(records, zero_tokens)
    rows = np.flatnonzero(keep) if keep is not None else None
    if rows is not None:
        stamps = stamps[rows]
    # (in floats first: the int64 difference of stamps centuries apart wraps around)
    _check_span(records, "timestamp", stamps.astype(np.float64) / 1e6, rows)
    arrival_ms = (stamps - stamps.min()).astype(np.float64) / 1e6
    return arrival_ms, RequestColumns(prompt, output), n_zero


def make_azure_workload(config: AzureConfig) -> OpenLoopWorkload:
    arrival, columns, n_zero = load_azure(config.path, limit=config.limit, zero_tokens=config.zero_tokens)
    return _trace_workload("azure", config.path, arrival, columns.with_max_tokens_cap(config.max_tokens),
                           n_zero=n_zero, time_scale=config.time_scale)


# --- vidur ---------------------------------------------------------------------------------

VIDUR_COLUMNS = {"arrived_at": ("arrived_at",), "prompt_tokens": ("num_prefill_tokens",),
                 "output_tokens": ("num_decode_tokens",)}


@attrs.frozen
class VidurConfig:
    path: str = _path("Vidur trace CSV (arrived_at in seconds, num_prefill_tokens, num_decode_tokens)")
    limit: int | None = _limit()
    time_scale: float = _time_scale()
    max_tokens: int | None = _max_tokens()
    zero_tokens: str = _zero_tokens()


def load_vidur(path, *, limit: int | None = None, zero_tokens: str = "clamp"):
    """``(arrival_ms, columns, n_zero)`` of a Vidur ``splitwise_*.csv`` trace (times as in the file)."""
    records = read_records(path, VIDUR_COLUMNS, format="csv", required=tuple(VIDUR_COLUMNS), limit=limit)
    if len(records) == 0:
        raise WorkloadError(f"{path}: no requests in the trace")
    seconds = records.floats("arrived_at", min=0.0, max=MAX_TIME_MS / 1e3, why=f"s: {CLOCK_END}")
    prompt, output, keep, n_zero = token_counts(records, zero_tokens)
    if keep is not None:
        seconds = seconds[keep]
    return scaled(seconds, 1000.0), RequestColumns(prompt, output), n_zero


def make_vidur_workload(config: VidurConfig) -> OpenLoopWorkload:
    arrival, columns, n_zero = load_vidur(config.path, limit=config.limit, zero_tokens=config.zero_tokens)
    return _trace_workload("vidur", config.path, arrival, columns.with_max_tokens_cap(config.max_tokens),
                           n_zero=n_zero, time_scale=config.time_scale)


# --- mooncake ------------------------------------------------------------------------------

MOONCAKE_FIELDS = {"timestamp": ("timestamp",), "prompt_tokens": ("input_length",),
                   "output_tokens": ("output_length",), "hash_ids": ("hash_ids",)}


@attrs.frozen
class MooncakeConfig:
    path: str = _path("Mooncake FAST'25 trace, JSONL: timestamp (ms), input_length, output_length, hash_ids")
    hash_block_tokens: int = int_field(512, min=1, max=MAX_TOKENS, help="tokens per prefix block named by one hash id")
    jitter_ms: float = float_field(0.0, min=0, max=MAX_TIME_MS,
                                   help="spread each request uniformly over [t, t + jitter_ms) of trace time with the "
                                        "seed, before time_scale (the conversation trace's timestamps are quantised "
                                        "to about 3 s: jitter_ms = 3000 fills each quantum at any time_scale)")
    limit: int | None = _limit()
    time_scale: float = _time_scale()
    max_tokens: int | None = _max_tokens()
    zero_tokens: str = _zero_tokens()


def load_mooncake(path, *, hash_block_tokens: int = 512, limit: int | None = None, zero_tokens: str = "clamp"):
    """``(arrival_ms, columns, n_zero)`` of a Mooncake trace; hash ids go to ``block_hashes``."""
    fmt = "json" if file_suffix(path) == ".json" else "jsonl"   # (trace.json.gz too)
    records = read_records(path, MOONCAKE_FIELDS, format=fmt, required=tuple(MOONCAKE_FIELDS), limit=limit)
    if len(records) == 0:
        raise WorkloadError(f"{path}: no requests in the trace")
    arrival = records.floats("timestamp", min=0.0, max=MAX_TIME_MS, why=f"ms: {CLOCK_END}")
    hashes = records.int_lists("hash_ids")
    raw_prompt = records.ints("prompt_tokens", min=0, max=MAX_TOKENS)
    blocks = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
    too_many = np.flatnonzero(blocks > -(-raw_prompt // hash_block_tokens))
    if too_many.size:
        row = int(too_many[0])
        raise WorkloadError(
            f"{records.where(row)}: {records.label('hash_ids')}: {blocks[row]} hash ids for "
            f"{raw_prompt[row]} prompt tokens, more than ceil({raw_prompt[row]} / hash_block_tokens = "
            f"{hash_block_tokens}) blocks (is hash_block_tokens right?)"
        )
    prompt, output, keep, n_zero = token_counts(records, zero_tokens)
    if keep is not None:
        arrival = arrival[keep]
        hashes = [h for h, k in zip(hashes, keep.tolist()) if k]
    columns = RequestColumns(prompt, output, {"block_hashes": hashes}, {"hash_block_tokens": hash_block_tokens})
    return arrival, columns, n_zero


def make_mooncake_workload(config: MooncakeConfig) -> OpenLoopWorkload:
    arrival, columns, n_zero = load_mooncake(config.path, hash_block_tokens=config.hash_block_tokens,
                                             limit=config.limit, zero_tokens=config.zero_tokens)
    return _trace_workload("mooncake", config.path, arrival, columns.with_max_tokens_cap(config.max_tokens),
                           n_zero=n_zero, time_scale=config.time_scale, jitter_ms=config.jitter_ms)


# --- burstgpt ------------------------------------------------------------------------------

BURSTGPT_COLUMNS = {"timestamp": ("Timestamp",), "model": ("Model",), "prompt_tokens": ("Request tokens",),
                    "output_tokens": ("Response tokens",), "log_type": ("Log Type",)}


@attrs.frozen
class BurstgptConfig:
    path: str = _path("BurstGPT trace CSV (Timestamp in s, Model, Request tokens, Response tokens, Total tokens, "
                      "Log Type)")
    model: str | None = str_field(None, optional=True, help="only the requests this Model served ('ChatGPT', 'GPT-4')")
    log_type: str | None = str_field(None, optional=True,
                                     help="only this Log Type's requests ('Conversation log' or 'API log')")
    limit: int | None = _limit()
    time_scale: float = _time_scale()
    max_tokens: int | None = _max_tokens()
    zero_tokens: str = str_field("drop", choices=ZERO_TOKEN_POLICIES,
                                 help="rows with 0 tokens -- BurstGPT's failed requests (0 response tokens): 'drop' "
                                      "them, 'clamp' to 1, or 'error'")


def load_burstgpt(path, *, model: str | None = None, log_type: str | None = None, limit: int | None = None,
                  zero_tokens: str = "drop"):
    """``(arrival_ms, columns, n_zero)`` of a BurstGPT trace (Wang et al., KDD 2025;
    github.com/HPMLL/BurstGPT): ``Timestamp`` in seconds from the trace's start, the requests a
    ``model`` and ``log_type`` keep; arrivals in ms after the earliest kept. Each request's
    ``Log Type`` becomes its ``request_class`` (per-class metrics: conversations and API calls)."""
    records = read_records(path, BURSTGPT_COLUMNS, format="csv",
                           required=("timestamp", "prompt_tokens", "output_tokens"), limit=limit)
    if len(records) == 0:
        raise WorkloadError(f"{path}: no requests in the trace")
    seconds = records.floats("timestamp", min=0.0)
    logs = records.texts("log_type")
    wanted = np.ones(len(records), dtype=bool)
    for value, field in ((model, "model"), (log_type, "log_type")):
        if value is None:
            continue
        column = records.texts(field)
        if column is None:
            raise WorkloadError(f"{path}: {field} = {value!r}, but the trace has no {BURSTGPT_COLUMNS[field][0]!r} "
                                "column")
        match = np.fromiter((c == value for c in column), dtype=bool, count=len(column))
        if not match.any():
            seen = sorted({c for c in column if isinstance(c, str)})
            raise WorkloadError(f"{path}: no row has {BURSTGPT_COLUMNS[field][0]} {value!r}; the trace has "
                                f"{', '.join(map(repr, seen[:10]))}")
        wanted &= match
    rows = np.flatnonzero(wanted)
    prompt, output, keep, n_zero = token_counts(records, zero_tokens, rows)
    if keep is not None:
        rows = rows[keep]
    arrival = seconds[rows]
    _check_span(records, "timestamp", arrival * 1000.0, rows)
    per_row = {"request_class": [str(logs[i]) for i in rows]} if logs is not None else {}
    return (arrival - arrival.min()) * 1000.0, RequestColumns(prompt, output, per_row), n_zero


def make_burstgpt_workload(config: BurstgptConfig) -> OpenLoopWorkload:
    arrival, columns, n_zero = load_burstgpt(config.path, model=config.model, log_type=config.log_type,
                                             limit=config.limit, zero_tokens=config.zero_tokens)
    return _trace_workload("burstgpt", config.path, arrival, columns.with_max_tokens_cap(config.max_tokens),
                           n_zero=n_zero, time_scale=config.time_scale)
