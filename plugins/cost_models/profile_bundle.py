"""Read a per-operator profile bundle (LLMServingSim's layout) into lookup tables, once.

A bundle is a folder ``<hardware>/<model>/<variant>/`` with ``meta.yaml`` and one ``tp<N>/``
folder per profiled tensor-parallel degree holding (times in microseconds):

* ``dense.csv`` -- ``layer,tokens,time_us``: each dense op of *one* decoder layer against
  the tokens in the iteration (``embedding`` and ``final_layernorm`` run once per iteration);
* ``per_sequence.csv`` -- ``layer,sequences,time_us``: ``lm_head``, ``sampler``;
* ``attention.csv`` -- ``prefill_chunk,kv_prefill,n_decode,kv_decode,time_us``: one layer's
  attention for a mixed batch (the profiler of vLLM 0.19; that of vLLM 0.28 writes
  ``layer,prefill_chunk,prefill_key,n_decode,kv_decode,decode_q_len,time_us``, its
  ``prefill_key`` the chunk's cached context plus the chunk: both are read, see
  :func:`read_attention`);
* ``moe.csv`` (MoE models, in ``tp1/`` only) -- ``tokens,activated_experts,time_us`` (and an
  ``ep`` column from vLLM 0.28's profiler: its rows at one expert-parallel rank are read);
* ``skew_fit.csv`` (optional) -- fitted alphas for decodes of uneven context, keyed by the
  bucket axes in ``meta.yaml``.

Interpolation follows the bundle's consumer (LLMServingSim ``serving/core/trace_generator.py``
at the commit in ``experiments/data/llmservingsim/COMMIT``) where that keeps more work from
costing less: linear on every axis, clamped below the smallest grid point, extrapolated from
the two largest above the grid; noisy 1-D profiles are made non-decreasing. Attention is the
exception: LLMServingSim interpolates it slice by slice, clamping a slice below its own axis
and taking the nearest slice for a missing corner, which lets a longer chunk cost less on
the shipped bundle; :class:`AttentionTable` says what is done instead. Every error names the
file, and the column or row.

What the composition sums is :data:`ARCHITECTURES`' list of each decoder layer's ops (the
``sequence`` of LLMServingSim's ``profiler/models/<architecture>.yaml``), and the same list is
what a bundle must hold: an op missing would count as no time (LLMServingSim skips it with a
warning), so :class:`ProfileBundle` refuses it, as it refuses a hybrid ``layer_mix``, an
architecture it does not know, a one-point table and attention without prefill or decode shots.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import warnings
from bisect import bisect_left, bisect_right
from pathlib import Path

import numpy as np

from schedlab.errors import ConfigError, InputWarning, brief
from schedlab.results.storage import repeated_column

#: Dense ops that run once per iteration, not once per decoder layer.
ONCE_PER_ITERATION = ("embedding", "final_layernorm")
#: Dense ops that run more than once per decoder layer (input and post-attention RMSNorm).
REPEATS_PER_LAYER = {"layernorm": 2}
#: Per-sequence ops (``per_sequence.csv``), once per iteration at the sequences in it.
PER_SEQUENCE_OPS = ("lm_head", "sampler")
#: the longest kernel time a bundle row may give, us (1,000 s: a row beyond is a damaged file)
MAX_KERNEL_US = 1e9


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What one decoder layer of an architecture runs, as the ``sequence`` of LLMServingSim's
    ``profiler/models/<architecture>.yaml`` lists it (``layer``: its dense ops in order, an op
    listed twice runs twice; ``moe``: its MLP is the expert block of ``moe.csv``). The bundle's
    composition sums exactly these ops (:attr:`layer_weights`) plus :data:`ONCE_PER_ITERATION`
    and :data:`PER_SEQUENCE_OPS`, and a bundle that lacks one of them is refused."""

    layer: tuple[str, ...]
    moe: bool = False

    @property
    def layer_weights(self) -> dict[str, int]:
        """op -> how many times one decoder layer runs it."""
        return {op: self.layer.count(op) for op in self.layer}


_ATTENTION_BLOCK = ("layernorm", "qkv_proj", "rotary_emb", "o_proj", "layernorm")
_QK_NORM_BLOCK = ("layernorm", "qkv_proj", "qk_norm", "rotary_emb", "o_proj", "layernorm")
_DENSE_MLP = ("gate_up_proj", "act_fn", "down_proj")
#: The architectures whose layers the composition knows (``meta.yaml: architecture``; the
#: ``sequence`` of LLMServingSim's profiler/models/*.yaml at the commit in
#: ``experiments/data/llmservingsim/COMMIT``). Every layer runs every op of its architecture:
#: a hybrid one (``layer_mix``) is not modelled.
ARCHITECTURES = {
    "llama": Architecture(_ATTENTION_BLOCK + _DENSE_MLP),
    "qwen3": Architecture(_QK_NORM_BLOCK + _DENSE_MLP),
    "qwen3_moe": Architecture(_QK_NORM_BLOCK, moe=True),
    "mixtral": Architecture(_ATTENTION_BLOCK, moe=True),
    "phimoe": Architecture(_ATTENTION_BLOCK, moe=True),
}


class BundleError(ConfigError):
    """A profile bundle is missing a file or a column, or has a bad value."""


class BundleWarning(InputWarning):
    """A profile bundle read with something unchecked or assumed (no model or architecture
    named, hardware other than the run's GPU)."""


class ProfileRangeWarning(UserWarning):
    """A run asks a profile bundle for more tokens or sequences than it measured: the times
    beyond are extrapolated. (Said while the run runs, so not an :class:`InputWarning`, which
    runs leave to the experiment's loading.)"""


# --- CSV reading ----------------------------------------------------------------------------


def read_csv(path: Path, columns: tuple[str, ...], *, text: tuple[str, ...] = (),
             signed: tuple[str, ...] = ()) -> dict[str, list]:
    """The named columns of a CSV file (UTF-8, a byte-order mark accepted); numbers checked
    finite and >= 0 (times > 0; ``signed`` columns may be negative).

    :raises BundleError: missing file or column, a column named twice in the header, or a bad
        value (naming file, line, column).
    """
    if not path.is_file():
        raise BundleError(f"{path}: missing file")
    with _csv_problems(path), open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise BundleError(f"{path}: empty file (expected columns {', '.join(columns)})")
        header = [h.strip() for h in header]
        for column in columns:
            if column not in header:
                raise BundleError(f"{path}: missing column {column!r} (has {brief(', '.join(header), 200)})")
        problem = repeated_column(path, header, columns)
        if problem:
            raise BundleError(problem)
        index = [header.index(c) for c in columns]
        out: dict[str, list] = {c: [] for c in columns}
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            for column, i in zip(columns, index):
                raw = row[i].strip() if i < len(row) else ""
                if column in text:
                    out[column].append(raw)
                    continue
                try:
                    value = float(raw)
                except ValueError:
                    raise BundleError(f"{path}: line {line}: column {column!r}: not a number: {brief(raw)}") from None
                if not math.isfinite(value) or (value < 0 and column not in signed) or (
                        column == "time_us" and not 0 < value <= MAX_KERNEL_US):
                    what = f"> 0 and at most {MAX_KERNEL_US:.0e} (1,000 s)" if column == "time_us" else ">= 0"
                    raise BundleError(f"{path}: line {line}: column {column!r}: out of range "
                                      f"(must be finite and {what}), got {brief(raw)}")
                out[column].append(value)
    if not out[columns[0]]:
        raise BundleError(f"{path}: no rows")
    return out


def csv_header(path: Path) -> list[str]:
    """The column names of a CSV file (:raises BundleError: no such file)."""
    if not path.is_file():
        raise BundleError(f"{path}: missing file")
    with _csv_problems(path), open(path, newline="", encoding="utf-8-sig") as fh:
        return [h.strip() for h in next(csv.reader(fh), [])]


@contextlib.contextmanager
def _csv_problems(path: Path):
    """A file that is not UTF-8 or not CSV (a field past csv's limit) as a BundleError naming it."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise BundleError(f"{path}: not a CSV file this reader can read: {exc}") from None


def keep_rows(data: dict[str, list], keep: list[bool]) -> dict[str, list]:
    """The rows of ``data`` (columns of equal length) where ``keep`` is true."""
    return {column: [v for v, k in zip(values, keep) if k] for column, values in data.items()}


def read_attention(path: Path) -> tuple[dict[str, list], bool]:
    """``attention.csv`` in either layout LLMServingSim's profiler writes: vLLM 0.19's
    (``kv_prefill``: the chunk's cached context) or vLLM 0.28's (a ``layer`` column;
    ``prefill_key``: the keys the chunk attends to, its cached context plus itself;
    ``decode_q_len``: the query rows of each decode, 1 for a plain decode, more for a verify
    pass). Returns the plain attention rows with one query row a decode, the prefill axis
    under ``kv_prefill``, and whether that axis is the key length."""
    header = csv_header(path)
    by_key = "prefill_key" in header and "kv_prefill" not in header
    columns = ("prefill_chunk", "prefill_key" if by_key else "kv_prefill", "n_decode", "kv_decode", "time_us")
    extra = tuple(c for c in ("layer", "decode_q_len") if c in header)
    data = read_csv(path, columns + extra, text=("layer",))
    keep = [True] * len(data["time_us"])
    if "layer" in data:
        layers = sorted(set(data["layer"]))
        if "attention" not in layers:
            raise BundleError(f"{path}: column 'layer': no 'attention' rows (has {', '.join(layers)})")
        keep = [k and layer == "attention" for k, layer in zip(keep, data["layer"])]
    if "decode_q_len" in data:
        keep = [k and q == 1.0 for k, q in zip(keep, data["decode_q_len"])]
        if not any(keep):
            raise BundleError(f"{path}: column 'decode_q_len': no rows of plain decodes (decode_q_len 1)")
    data = keep_rows({c: data[c] for c in columns}, keep)
    if by_key:
        data["kv_prefill"] = data.pop("prefill_key")
    return data, by_key


# --- interpolation --------------------------------------------------------------------------


def non_decreasing(ys: list) -> list:
    """The least-squares non-decreasing fit of ``ys`` (pool adjacent violators).

    A kernel never gets faster with more work; a profile that says otherwise is measuring
    noise (e.g. ``lm_head`` at 1 sequence slower than at 2). Monotone data is returned as is.
    """
    blocks: list[list[float]] = []  # [mean, count]
    for y in ys:
        blocks.append([y, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks[-1]
            blocks[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    out: list[float] = []
    for mean, count in blocks:
        out.extend([mean] * count)
    return out


#: Each profiled axis is extended to this multiple of its largest value (:func:`extended`,
#: :class:`AttentionTable`): far enough for any real batch.
FAR_FACTOR = 1024.0


def chord_slope(xs: list, ys: list) -> float:
    """The slope of ``ys`` over the top half of ``xs`` (from the largest ``x <= xs[-1] / 2``, or
    the first), at least 0; 0 for one point.

    Past the profiled range a kernel's time grows at its mean rate over many tokens, not at the
    slope of its last two points: a GEMM grid sampled every 16 tokens near its top steps with tile
    quantisation, and pooled to non-decreasing its last piece is nearly flat -- carried on, a
    16,384-token step cost 2.1x a 2,048-token one (1,500 TFLOPS on a 500 TFLOPS card)."""
    if len(xs) < 2:
        return 0.0
    ref = max(bisect_right(xs, xs[-1] / 2.0) - 1, 0)
    return max((ys[-1] - ys[ref]) / (xs[-1] - xs[ref]), 0.0)


def extended(xs: list, ys: list, slope: float | None = None) -> tuple[list, list]:
    """``xs`` and ``ys`` with one more point at :data:`FAR_FACTOR` times the largest ``x``, on the
    line of ``slope`` (:func:`chord_slope` when None) from the last point."""
    if len(xs) < 2:
        return list(xs), list(ys)
    slope = chord_slope(xs, ys) if slope is None else slope
    far = xs[-1] * FAR_FACTOR
    return [*xs, far], [*ys, ys[-1] + (far - xs[-1]) * slope]


class Table1D:
    """Piecewise-linear ``y(x)`` through sorted grid points: clamped below the first point,
    extrapolated from the last two above the last (a profile's tables are first
    :func:`extended`, so that piece is the chord over the profile's top half).

    ``slopes[i]`` is the slope of the piece from ``xs[i]`` (``0 <= i <= n - 2``; the last one
    goes on past the last point): with ``i = bisect_right(xs, x) - 1`` capped at ``n - 2``, the
    value at ``x >= xs[0]`` is ``ys[i] + (x - xs[i]) * slopes[i]`` and that piece ends at
    ``xs[i + 1]`` (never, for the last). The profiled cost model reads them inline."""

    __slots__ = ("xs", "ys", "n", "slopes")

    def __init__(self, xs, ys):
        self.xs = list(xs)
        self.ys = list(ys)
        self.n = len(self.xs)
        xs, ys = self.xs, self.ys
        self.slopes = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(self.n - 1)] or [0.0]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0] or self.n == 1:
            return ys[0]
        i = bisect_right(xs, x)
        if i >= self.n:
            i = self.n - 1
        return ys[i - 1] + (x - xs[i - 1]) * self.slopes[i - 1]


def sum_tables(parts: list[tuple[float, Table1D]]) -> Table1D:
    """``sum(weight * table)`` as one table on the union of the grids (exact: every part is
    linear between and beyond the union's points)."""
    xs = sorted({x for _, t in parts for x in t.xs})
    return Table1D(xs, [sum(w * t(x) for w, t in parts) for x in xs])


def _tables_by_layer(data: dict, key: str, path: Path) -> dict[str, Table1D]:
    rows: dict[str, dict[float, float]] = {}
    for layer, x, y in zip(data["layer"], data[key], data["time_us"]):
        points = rows.setdefault(layer, {})
        if x in points:
            raise BundleError(f"{path}: layer {layer!r}: {key} = {x:g} appears twice")
        points[x] = y
    for layer, points in rows.items():
        if len(points) < 2:
            raise BundleError(f"{path}: layer {layer!r}: one {key} value only ({next(iter(points)):g}): a single "
                              f"point cannot be interpolated (its time would be the same at every {key} count); "
                              f"the profile needs it at two {key} counts or more")
    return {layer: Table1D(*extended(sorted(p), non_decreasing([p[x] for x in sorted(p)])))
            for layer, p in rows.items()}


def _fill_along(grid: np.ndarray, xs: np.ndarray, axis: int, *, below: str = "nan", above: str = "nan") -> None:
    """Fill NaN cells of ``grid`` along ``axis`` (in place) from the defined cells of the same line.

    Gaps between two defined cells are interpolated linearly in ``xs``; cells beyond the
    defined ones stay NaN unless ``below`` / ``above`` is ``"clamp"`` (copy the nearest) or
    ``above`` is ``"extrapolate"`` (the line through the two largest defined cells). Lines
    with the same gaps are filled together.
    """
    moved = np.moveaxis(grid, axis, -1)
    lines = moved.reshape(-1, moved.shape[-1])
    missing = np.isnan(lines)
    todo = missing.any(axis=1) & ~missing.all(axis=1)
    if not todo.any():
        return
    patterns, group = np.unique(missing[todo], axis=0, return_inverse=True)
    rows = np.flatnonzero(todo)
    for pattern, members in zip(patterns, (rows[group.ravel() == g] for g in range(len(patterns)))):
        block = lines[members]
        known = np.flatnonzero(~pattern)
        lo, hi = known[0], known[-1]
        gap = np.flatnonzero(pattern)
        inner = gap[(gap > lo) & (gap < hi)]
        if len(inner):  # between the defined cells on either side
            right = known[np.searchsorted(known, inner)]
            left = known[np.searchsorted(known, inner) - 1]
            w = (xs[inner] - xs[left]) / (xs[right] - xs[left])
            block[:, inner] = block[:, left] * (1.0 - w) + block[:, right] * w
        under, over = gap[gap < lo], gap[gap > hi]
        if below == "clamp" and len(under):
            block[:, under] = block[:, [lo]]
        if above == "clamp" or (above == "extrapolate" and len(known) < 2):
            block[:, over] = block[:, [hi]]
        elif above == "extrapolate" and len(over):
            prev = known[-2]
            slope = (block[:, [hi]] - block[:, [prev]]) / (xs[hi] - xs[prev])
            block[:, over] = block[:, [hi]] + (xs[over] - xs[hi]) * slope
        lines[members] = block
    moved[...] = lines.reshape(moved.shape)


def isotonic(grid: np.ndarray) -> np.ndarray:
    """The grid made non-decreasing along every axis: the midpoint of its smallest
    non-decreasing majorant and largest non-decreasing minorant (the L-infinity isotonic
    regression, closed form in any dimension). Cells already in order are unchanged."""
    upper = grid
    lower = grid[(slice(None, None, -1),) * grid.ndim]
    for axis in range(grid.ndim):
        upper = np.maximum.accumulate(upper, axis=axis)
        lower = np.minimum.accumulate(lower, axis=axis)
    lower = lower[(slice(None, None, -1),) * grid.ndim]
    return (upper + lower) / 2.0


def majorant(grid: np.ndarray) -> np.ndarray:
    """The smallest grid non-decreasing along every axis and nowhere below ``grid``. After the
    far points of :class:`AttentionTable` (step 4): the profiled cells are already in order and
    stay as they are, and a far cell below a cell it dominates is raised to it. The midpoint of
    :func:`isotonic` there halved every slope past the profile -- a far cell extended along two
    axes with a slope clipped at 0 pulled down all it dominates -- reading a 131k context's KV at
    2.7 TB/s on a 1.6 TB/s card."""
    for axis in range(grid.ndim):
        grid = np.maximum.accumulate(grid, axis=axis)
    return grid


def _axis_position(xs: list, x: float) -> tuple[int, float]:
    """``(i, t)``: ``x`` lies ``t`` of the way from ``xs[i]`` to ``xs[i + 1]`` (clamped below the
    first point, extrapolated past the last; ``i = 0, t = 0`` on a one-point axis)."""
    n = len(xs)
    if n == 1 or x <= xs[0]:
        return 0, 0.0
    i = bisect_right(xs, x) - 1
    if i >= n - 1:
        i = n - 2
    x0 = xs[i]
    return i, (x - x0) / (xs[i + 1] - x0)


class AttentionTable:
    """One layer's attention time over (prefill_chunk, kv_prefill, n_decode, kv_decode), as a
    non-decreasing table on one rectilinear grid, interpolated multilinearly.

    A bundle's shots are not one grid: each (chunk, decodes) slice has its own context axes
    (the RTX PRO 6000 bundles interleave a doubling sweep from 16 tokens with a x1.5 sweep from
    512), mixed shots stop at 128 decodes while decode-only ones reach 256, and the timings
    are noisy. Interpolating slice by slice as LLMServingSim does (clamping a slice below its
    own axis, falling back to the nearest slice for a missing corner) lets more tokens cost
    less -- up to 10% on the shipped bundle, and a negative time for a chunk with 500
    decodes. So, once at load:

    1. every shot row is placed on the union of the profiled values of each axis, linear in
       kv_decode between its own points (kv_prefill is not an axis of a decode-only slice,
       nor kv_decode of a prefill-only one);
    2. cells a slice did not measure are filled from its neighbours, linearly: along
       kv_prefill within the slice, then along the chunk axis between slices that measured
       them, then along the decode axis (a missing top, e.g. 256 decodes with a chunk, on the
       line through the two largest, as every axis is extrapolated); the no-work corner
       (no chunk, no decodes) holds the cheapest measured call, so a 1-token chunk costs about
       what a tiny kernel costs;
    3. the grid is made non-decreasing along every axis (:func:`isotonic`: timing noise --
       e.g. a 128-decode shot 11% slower with no prefill context than with 512 tokens of it
       -- is averaged out; ordered cells do not move). Decode-only shots are not averaged with
       the shots that carry a chunk: at 2-8 decodes they are measured slower than the same
       decodes riding with a small chunk (12.6 vs 7.7 us at 2 decodes -- another kernel path,
       not noise), and pooling would pull every decode-only iteration, the most common kind,
       below its measurement. They are made monotone among themselves, the chunk shots among
       themselves, and a chunk shot is then raised to at least its decodes' decode-only time
       (a batch costs at least its decodes alone);
    4. each axis gets one more point at ``FAR_FACTOR`` times its largest, on the line through
       its two largest points, and the grid is raised to non-decreasing (:func:`majorant`), so extrapolating
       past the profiled range (chunks above the profiled budget, longer contexts, more
       decodes) cannot make more tokens cost less either.

    Within the grid, multilinear interpolation of a table that is non-decreasing along every
    axis is non-decreasing in every argument; below the grid it is clamped.

    With ``by_key`` (vLLM 0.28's profiler) the prefill axis holds the keys a chunk attends to,
    its cached context plus itself, and a lookup adds the chunk to the context. A chunk never
    attends to fewer keys than its own tokens, so a slice has no shot below its chunk: those
    cells, never asked for, take the slice's shortest measured key (step 2, first), which
    keeps the grid non-decreasing.
    """

    COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")

    def __init__(self, data: dict, path: Path, *, by_key: bool = False):
        self.path = path
        self.by_key = by_key
        pc, kp, nd, kd = (np.asarray(data[c], dtype=float) for c in self.COLUMNS)
        t = np.asarray(data["time_us"], dtype=float)
        self._check_shots(pc, kp, nd, kd)
        pcs, nds = np.unique(pc), np.unique(nd)
        kps = np.unique(kp[pc > 0]) if (pc > 0).any() else np.zeros(1)
        kds = np.unique(kd[nd > 0]) if (nd > 0).any() else np.zeros(1)
        grid = np.full((len(pcs), len(nds), len(kps), len(kds)), np.nan)
        rows: dict[tuple, list] = {}
        for key in zip(pc.tolist(), nd.tolist(), kp.tolist(), kd.tolist(), t.tolist()):
            rows.setdefault(key[:3], []).append(key[3:])
        for (p, n, k), points in rows.items():
            points.sort()
            xs = np.array([x for x, _ in points])
            ys = np.array([y for _, y in points])
            if n == 0:  # no decodes: kv_decode is not an axis
                curve = np.full(len(kds), ys[0])
            else:
                curve = np.interp(kds, xs, ys)
                curve[(kds < xs[0]) | (kds > xs[-1])] = np.nan
            i, j = np.searchsorted(pcs, p), np.searchsorted(nds, n)
            if p == 0:  # no chunk: kv_prefill is not an axis
                grid[i, j, :, :] = curve
            else:
                grid[i, j, np.searchsorted(kps, k), :] = curve
        if pcs[0] == 0 and nds[0] == 0:
            grid[0, 0] = t.min()
        if by_key:  # keys below a slice's chunk: its shortest measured key
            _fill_along(grid, kps, 2, below="clamp")
        _fill_along(grid, kds, 3, above="extrapolate")   # a row that stops short: its own line
        _fill_along(grid, kps, 2)                         # within a slice
        _fill_along(grid, pcs, 0)                         # between measured chunks
        _fill_along(grid, nds, 1, below="clamp", above="extrapolate")
        for axis, xs in enumerate((pcs, nds, kps, kds)):  # whatever is left: nearest / extrapolate
            _fill_along(grid, xs, axis, below="clamp", above="extrapolate")
        if np.isnan(grid).any():
            raise BundleError(f"{path}: the shots do not cover a grid (a whole prefill_chunk or "
                              f"n_decode value without any shot)")
        grid = self._monotone(grid, pcs)
        # the largest chunk profiled: a longer one is timed as chunks of it over a growing context
        self.pc_top = float(pcs[-1]) if len(pcs) >= 2 and pcs[-1] > 0 else None
        axes = [pcs, nds, kps, kds]
        for axis in range(4):
            xs = axes[axis]
            if len(xs) < 2:  # e.g. no shot with a chunk: kv_prefill is not an axis at all
                grid = np.concatenate([grid, grid], axis=axis)
                xs = axes[axis] = np.append(xs, xs[0] + 1.0)
            top = np.take(grid, [-1], axis=axis)
            slope = np.maximum((top - np.take(grid, [-2], axis=axis)) / (xs[-1] - xs[-2]), 0.0)
            far = xs[-1] * FAR_FACTOR
            grid = np.concatenate([grid, top + (far - xs[-1]) * slope], axis=axis)
            axes[axis] = np.append(xs, far)
        self.grid = majorant(grid)
        self.pcs, self.nds, self.kps, self.kds = (a.tolist() for a in axes)
        self._cells = self.grid.tolist()
        self._pc_positions: dict = {}
        self._nd_positions: dict = {}
        self._decode_rows: dict[int, Table1D] = {}

    @staticmethod
    def _monotone(grid: np.ndarray, pcs: np.ndarray) -> np.ndarray:
        """Step 3: decode-only shots and shots with a chunk made non-decreasing separately, then
        every chunk's cell raised to at least its decodes' decode-only time."""
        if pcs[0] != 0 or len(pcs) == 1:
            return isotonic(grid)
        decode = isotonic(grid[0])
        return np.concatenate([decode[None], np.maximum(isotonic(grid[1:]), decode[None])])

    def _check_shots(self, pc, kp, nd, kd) -> None:
        path = self.path
        prefill = "prefill_key" if self.by_key else "kv_prefill"
        for bad, what in (((pc == 0) & (nd == 0), "a shot with neither a prefill chunk nor decodes"),
                          ((pc == 0) & (kp != 0), f"{prefill} without a prefill chunk"),
                          ((nd == 0) & (kd != 0), "kv_decode without decodes"),
                          ((kp < pc) & self.by_key, "prefill_key below prefill_chunk (a chunk attends to itself)")):
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise BundleError(f"{path}: row {i + 1} of the data: {what} (prefill_chunk {pc[i]:g}, "
                                  f"{prefill} {kp[i]:g}, n_decode {nd[i]:g}, kv_decode {kd[i]:g})")
        keys = np.stack([pc, kp, nd, kd], axis=1)
        unique, counts = np.unique(keys, axis=0, return_counts=True)
        if (counts > 1).any():
            dup = unique[np.flatnonzero(counts > 1)[0]]
            raise BundleError(f"{path}: the shot prefill_chunk {dup[0]:g}, {prefill} {dup[1]:g}, "
                              f"n_decode {dup[2]:g}, kv_decode {dup[3]:g} appears twice")

    @staticmethod
    def _position(memo: dict, xs: list, x: float) -> tuple[int, float]:
        """:func:`_axis_position`, memoised (chunk sizes and decode counts repeat)."""
        found = memo.get(x)
        if found is None:
            found = _axis_position(xs, x)
            if len(memo) < 1 << 16:
                memo[x] = found
        return found

    def __call__(self, pc: float, kp: float, nd: float, kd: float) -> float:
        """One layer's attention time at this batch shape."""
        return self.at_contexts(pc, kp, nd, kd, kd)[0]

    def at_contexts(self, pc: float, kp: float, nd: float, kd: float, kd_other: float) -> tuple[float, float]:
        """The time at two decode contexts of the same (chunk, prefill context, decodes) --
        the mean and the longest, for the skew correction -- sharing the lookups.

        A chunk longer than the largest profiled one (``pc_top``) is timed as that chunk with the
        decodes, then the rest in chunks of ``pc_top`` tokens alone, each after the cached context
        and the chunks before it: the same (query, key) pairs, each piece on the profile's own
        context axis. (The chunk axis extrapolated on its line grew linearly with the chunk, not
        with its keys: a 16k-token prompt in one chunk had 4.5 times less attention than in
        2,048-token chunks of the same pairs: review s80 cost.)"""
        top = self.pc_top
        if top is not None and pc > top:
            first, other = self.at_contexts(top, kp, nd, kd, kd_other)
            done, context = top, kp + top
            while done < pc:
                piece = pc - done if pc - done < top else top
                alone = self.at_contexts(piece, context, 0.0, 0.0, 0.0)[0]
                first += alone
                other += alone
                done += piece
                context += piece
            return first, other
        i, ti = self._position(self._pc_positions, self.pcs, pc)
        j, tj = self._position(self._nd_positions, self.nds, nd)
        p, tp = _axis_position(self.kps, kp + pc if self.by_key else kp)
        k, tk = _axis_position(self.kds, kd)
        o, to = (k, tk) if kd_other == kd else _axis_position(self.kds, kd_other)
        cells = self._cells
        first = other = 0.0
        for w, table in (((1 - ti) * (1 - tj), cells[i][j]), ((1 - ti) * tj, cells[i][j + 1]),
                         (ti * (1 - tj), cells[i + 1][j]), (ti * tj, cells[i + 1][j + 1])):
            if w == 0.0:
                continue
            row, up = table[p], table[p + 1]
            a0, a1, b0, b1 = row[k], row[k + 1], row[o], row[o + 1]
            if tp:  # blend the two kv_prefill rows
                a0 += tp * (up[k] - a0)
                a1 += tp * (up[k + 1] - a1)
                b0 += tp * (up[o] - b0)
                b1 += tp * (up[o + 1] - b1)
            first += w * (a0 + tk * (a1 - a0))
            other += w * (b0 + to * (b1 - b0))
        return first, other

    def decode_row(self, nd: int) -> Table1D:
        """Decode-only attention time against kv_decode at ``nd`` decodes, as a piecewise-linear
        table on the grid's kv_decode points (memoised per decode count)."""
        row = self._decode_rows.get(nd)
        if row is None:
            j, tj = _axis_position(self.nds, nd)
            at0 = self._cells[0]
            lo = at0[j][0]
            ys = lo if not tj else [a + tj * (b - a) for a, b in zip(lo, at0[j + 1][0])]
            row = self._decode_rows[nd] = Table1D(self.kds, ys)
        return row


class MoeTable:
    """One MoE layer's expert time (us) over (tokens on the rank, distinct experts activated).

    Past the profiled tokens every row grows at the steepest of the rows' :func:`chord_slope`:
    top-k routing gives a token the same expert work however many experts are activated, so at
    many tokens every row is compute-bound as the fewest-experts row already is at the top of
    the profile, while a row of all experts is still reading their weights there (its own chord
    put 16,384 tokens at 400 TFLOPS of a 500 TFLOPS card)."""

    def __init__(self, data: dict, path: Path):
        rows: dict[float, dict[float, float]] = {}
        for tokens, experts, t in zip(data["tokens"], data["activated_experts"], data["time_us"]):
            rows.setdefault(experts, {})[tokens] = t
        for experts, row in sorted(rows.items()):
            if len(row) < 2:
                raise BundleError(f"{path}: activated_experts {experts:g}: one tokens value only "
                                  f"({next(iter(row)):g}): a single point cannot be interpolated; the profile "
                                  f"needs each expert count at two token counts or more")
        self.experts = sorted(rows)
        points = [(sorted(r), non_decreasing([r[k] for k in sorted(r)])) for _, r in sorted(rows.items())]
        slope = max(chord_slope(xs, ys) for xs, ys in points)  # see the class docstring
        self.rows = [Table1D(*extended(xs, ys, slope)) for xs, ys in points]
        self.min_experts = self.experts[0]                    # below these the table is clamped
        self.max_tokens = min(xs[-1] for xs, _ in points)      # beyond, a row is extrapolated
        self.min_tokens = min(row.xs[0] for row in self.rows)

    def __call__(self, tokens: float, experts: float) -> float:
        tokens, experts = max(tokens, 1.0), max(experts, 1.0)
        xs, n = self.experts, len(self.experts)
        if n == 1 or experts <= xs[0]:
            return self.rows[0](tokens)
        i = bisect_right(xs, experts)
        lo, hi = (n - 2, n - 1) if i >= n else (i - 1, i)
        v0 = self.rows[lo](tokens)
        return v0 + (experts - xs[lo]) * (self.rows[hi](tokens) - v0) / (xs[hi] - xs[lo])


class SkewAlpha:
    """Fitted alpha of a decode batch with uneven contexts (``skew_fit.csv`` + ``meta.yaml``).

    ``t = t(mean context) + alpha * (t(longest) - t(mean))``; the bucket key is
    ``(prefill chunk, decodes, skew rate, longest context, prefill history)``, labelled
    exactly as the profiler wrote them. Buckets without a fit use ``alpha_default``.
    """

    AXES = ("n", "skew_rate", "kv_big", "kp")

    def __init__(self, meta: dict, tp: int, fit_path: Path, meta_path: Path):
        fit = meta.get("skew_fit") or {}
        per_tp = fit.get("per_tp") or {}
        entry = per_tp.get(tp) or per_tp.get(str(tp)) or {}
        axes = entry.get("bucket_axes") or fit.get("bucket_axes")
        if not axes:
            raise BundleError(f"{meta_path}: skew_fit.bucket_axes is missing (needed to read {fit_path.name})")
        self.bins = {}
        for axis in self.AXES:
            bins, labels = axes.get(f"{axis}_bins"), axes.get(f"{axis}_labels")
            if not isinstance(bins, list) or not isinstance(labels, list) or len(bins) != len(labels) + 1:
                raise BundleError(f"{meta_path}: skew_fit.bucket_axes.{axis}_bins / {axis}_labels missing "
                                  f"or of mismatched lengths")
            self.bins[axis] = ([float(b) for b in bins[1:]], [str(x) for x in labels])
        self.default = float(entry.get("alpha_default", fit.get("alpha_default", 0.0)))
        data = read_csv(fit_path, ("pc", "n_label", "skew_rate_label", "kv_big_label", "kp_label", "alpha"),
                        text=("n_label", "skew_rate_label", "kv_big_label", "kp_label"), signed=("alpha",))
        index = {axis: {label: i for i, label in enumerate(self.bins[axis][1])} for axis in self.AXES}
        self.table: dict[tuple, float] = {}
        for row, (pc, n, sr, kvb, kp, alpha) in enumerate(zip(*data.values()), start=2):
            try:
                key = (pc, index["n"][n], index["skew_rate"][sr], index["kv_big"][kvb], index["kp"][kp])
            except KeyError as exc:
                raise BundleError(f"{fit_path}: line {row}: label {exc.args[0]!r} is not in "
                                  f"meta.yaml's skew_fit.bucket_axes") from None
            self.table[key] = alpha
        self._axes = tuple((self.bins[axis][0], len(self.bins[axis][1]) - 1) for axis in self.AXES)
        # Decode-only batches (no chunk, no prefill context) look alpha up by decode count,
        # skew-rate and longest-context buckets in this nested list (the same values).
        kp0 = self.bucket("kp", 0)
        self._decode = [[[self.table.get((0.0, nb, sb, kb, kp0), self.default) for kb in range(len(self.bins["kv_big"][1]))]
                         for sb in range(len(self.bins["skew_rate"][1]))] for nb in range(len(self.bins["n"][1]))]
        self._n_bucket: dict[int, int] = {}
        self._chunks = {key[0] for key in self.table}  # a chunk size without any fit: the default

    def bucket(self, axis: str, value: float) -> int:
        """LLMServingSim's ``_bucket_label``: the first bin whose upper edge is >= value."""
        uppers, labels = self.bins[axis]
        return min(bisect_left(uppers, value), len(labels) - 1)

    def kv_big_edge(self, kv_big: float) -> float:
        """The largest longest-context value still in ``kv_big``'s bucket."""
        uppers, labels = self.bins["kv_big"]
        i = bisect_left(uppers, kv_big)
        return uppers[i] if i < len(labels) - 1 else math.inf

    def decode(self, n: int, skew_rate: float, kv_big: float) -> float:
        """``self(0, n, skew_rate, kv_big, 0)``, faster (``0 <= skew_rate <= 1``)."""
        nb = self._n_bucket.get(n)
        if nb is None:
            nb = self._n_bucket[n] = self.bucket("n", n)
        (_, _), (sr_up, sr_last), (kv_up, kv_last), _ = self._axes
        return self._decode[nb][min(bisect_left(sr_up, skew_rate), sr_last)][min(bisect_left(kv_up, kv_big), kv_last)]

    def __call__(self, pc: float, n: int, skew_rate: float, kv_big: float, kp: float) -> float:
        if pc not in self._chunks:
            return self.default
        (n_up, n_last), (sr_up, sr_last), (kv_up, kv_last), (kp_up, kp_last) = self._axes  # = bucket(), inlined
        rate = 0.0 if skew_rate < 0.0 else 1.0 if skew_rate > 1.0 else skew_rate
        key = (pc, min(bisect_left(n_up, n), n_last), min(bisect_left(sr_up, rate), sr_last),
               min(bisect_left(kv_up, kv_big), kv_last), min(bisect_left(kp_up, kp), kp_last))
        return self.table.get(key, self.default)


# --- the bundle -------------------------------------------------------------------------------


def read_meta(path: Path) -> dict:
    import yaml  # the bundle's meta file is YAML

    if not path.is_file():
        raise BundleError(f"{path}: missing file")
    try:
        meta = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    except yaml.YAMLError as exc:
        raise BundleError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise BundleError(f"{path}: nested too deeply for the YAML reader") from None
    if not isinstance(meta, dict):
        raise BundleError(f"{path}: expected a mapping at the top level")
    return meta


def _tp_folders(folder: Path) -> list[str]:
    return sorted((p.name for p in folder.glob("tp*") if p.is_dir() and p.name[2:].isdigit()),
                  key=lambda name: int(name[2:]))


def _missing_tp_folder(root: Path, tp: int) -> str:
    """What is wrong with a bundle path without ``tp<tp>/``: which folders are there, which
    one is expected, and the path meant when it stops a folder short or goes one too far."""
    expected = f"tp{tp}/"
    have = _tp_folders(root)
    if have:
        return (f"{root / f'tp{tp}'}: missing folder: tensor_parallel = {tp} was not profiled "
                f"(expected {expected}; profiled: {', '.join(f + '/' for f in have)})")
    if root.name.startswith("tp") and root.name[2:].isdigit() and (root.parent / "meta.yaml").is_file():
        return (f"{root}: this is one tensor-parallel folder of a bundle; the profile is its parent "
                f"(profile = \"{root.parent}\"), which holds {', '.join(f + '/' for f in _tp_folders(root.parent))}")
    bundles = sorted(p for p in root.iterdir() if p.is_dir() and (p / "meta.yaml").is_file())
    if bundles:
        listing = ", ".join(f"{p.name}/ ({', '.join(_tp_folders(p)) or 'no tp<N>/'})" for p in bundles)
        return (f"{root}: not a profile bundle (no meta.yaml, no tp<N>/ folders); the path stops a folder "
                f"short: it holds {listing} -- e.g. profile = \"{bundles[0]}\" (which must hold {expected})")
    inside = sorted(p.name + "/" for p in root.iterdir() if p.is_dir())
    return (f"{root}: not a profile bundle: expected <hardware>/<model>/<variant>/ with meta.yaml and "
            f"{expected} (tensor_parallel = {tp}); it holds {', '.join(inside) or 'no folders'}")


def _legacy_layout(root: Path) -> str | None:
    """What to say of LLMServingSim's legacy v0 layout (``tp<N>/layers.csv``, no meta.yaml), at
    ``root`` or one of its ``tp<N>/`` folders; None for anything else."""
    if (root / "meta.yaml").is_file():
        return None
    if any((root / tp / "layers.csv").is_file() for tp in _tp_folders(root)) or (
            root.name.startswith("tp") and (root / "layers.csv").is_file()):
        return (f"{root}: this is LLMServingSim's legacy v0 layout (tp<N>/layers.csv, no meta.yaml), which is "
                f"not supported (nor read by LLMServingSim's own simulator today): re-profile the model with "
                f"LLMServingSim's current profiler (profiler/), which writes <hardware>/<model>/<variant>/ with "
                f"meta.yaml and tp<N>/dense.csv, per_sequence.csv, attention.csv")
    return None


def architecture_of(meta: dict, meta_path: Path) -> Architecture | None:
    """The :class:`Architecture` ``meta.yaml`` names (None when it names none).

    :raises BundleError: a hybrid model (``layer_mix``: linear- and full-attention layers) or an
        architecture whose layers the composition does not know.
    """
    mix = meta.get("layer_mix")
    if mix is not None:
        raise BundleError(f"{meta_path}: layer_mix {brief(mix, 120)}: a hybrid model (layers of different kinds, "
                          f"e.g. linear and full attention) is not modelled: the profiled cost model runs every "
                          f"operator of the bundle in every layer, which would time this model wrongly")
    name = meta.get("architecture")
    if name is None:
        return None
    if not isinstance(name, str) or name not in ARCHITECTURES:
        raise BundleError(f"{meta_path}: architecture {brief(name)} is not modelled: which operators its layers "
                          f"run is not known to the profiled cost model (it knows {', '.join(sorted(ARCHITECTURES))})")
    return ARCHITECTURES[name]


def _check_ops(path: Path, tables: dict, expected: tuple[str, ...], name: str, meta_path: Path) -> None:
    """Refuse a table that lacks an op the architecture runs (it would count as no time) or
    holds one it does not (where it runs is not known)."""
    missing = [op for op in dict.fromkeys(expected) if op not in tables]
    if missing:
        raise BundleError(f"{path}: column 'layer': no rows of {', '.join(missing)}, which a {name!r} model runs "
                          f"({meta_path.name}: architecture): a missing operator would count as no time; "
                          f"profile {'them' if len(missing) > 1 else 'it'} (has {', '.join(tables)})")
    extra = [op for op in tables if op not in expected]
    if extra:
        raise BundleError(f"{path}: column 'layer': {', '.join(extra)} is not an operator of a {name!r} model "
                          f"({meta_path.name}: architecture; it runs {', '.join(dict.fromkeys(expected))}): "
                          f"a bundle of another architecture?")


def _largest(data: dict, key: str) -> float:
    """The smallest, over a table's ops, of the largest ``key`` each op was profiled at."""
    top: dict[str, float] = {}
    for layer, x in zip(data["layer"], data[key]):
        top[layer] = max(top.get(layer, x), x)
    return min(top.values())


class ProfileBundle:
    """The tables of one bundle at one tensor-parallel degree, times in **milliseconds**.

    :ivar dense_layer: one decoder layer's dense ops (``layernorm`` twice) against tokens;
    :ivar dense_once: once-per-iteration dense ops (embedding, final norm) against tokens;
    :ivar per_sequence: ``lm_head`` + ``sampler`` against sequences in the iteration;
    :ivar attention: one layer's attention; :ivar moe: one MoE layer (or None);
    :ivar skew: the skew alpha (or None: no correction, when the bundle has no ``skew_fit.csv``
        or ``meta.yaml`` does not mark ``skew_fit.enabled``);
    :ivar architecture: the :class:`Architecture` ``meta.yaml`` names, whose ops the tables must
        hold exactly (None: it names none, and the ops are summed as listed);
    :ivar profiled_tokens, profiled_sequences: ``(count, file)``: the most tokens (sequences)
        every table was profiled at, and the file that stops first; beyond, times are
        extrapolated (:meth:`beyond_profile`).

    :raises BundleError: a missing or damaged file; LLMServingSim's legacy v0 layout; a hybrid
        (``layer_mix``) or unknown architecture; an op the architecture runs missing from its
        table (or one it does not run there); an op profiled at one token count only; an
        attention table without prefill shots or without decode shots.
    """

    def __init__(self, root, tensor_parallel: int = 1):
        self.root = Path(root)
        if not self.root.is_dir():
            raise BundleError(f"{self.root}: profile folder not found (expected <hardware>/<model>/<variant>/ "
                              f"with meta.yaml and tp<N>/)")
        legacy = _legacy_layout(self.root)
        if legacy:
            raise BundleError(legacy)
        self.tp = tensor_parallel
        folder = self.root / f"tp{tensor_parallel}"
        if not folder.is_dir():
            raise BundleError(_missing_tp_folder(self.root, tensor_parallel))
        meta_path = self.root / "meta.yaml"
        self.meta = read_meta(meta_path)
        #: the architecture meta.yaml names (None: a bundle that names none, its ops unchecked)
        self.architecture = architecture_of(self.meta, meta_path)
        arch = self.architecture
        name = self.meta.get("architecture")

        path = folder / "dense.csv"
        data = read_csv(path, ("layer", "tokens", "time_us"), text=("layer",))
        dense = _tables_by_layer(data, "tokens", path)
        weights = REPEATS_PER_LAYER
        if arch is not None:
            _check_ops(path, dense, arch.layer + ONCE_PER_ITERATION, name, meta_path)
            weights = arch.layer_weights
        else:
            warnings.warn(f"{meta_path}: names no architecture (LLMServingSim's profiler writes one): the ops of "
                          f"{path.parent.name}/dense.csv are summed as listed ({', '.join(dense)}), not checked "
                          f"against a model's layer", BundleWarning, stacklevel=2)
        once = [(1e-3, t) for name_, t in dense.items() if name_ in ONCE_PER_ITERATION]
        per_layer = [(1e-3 * weights.get(name_, 1), t) for name_, t in dense.items()
                     if name_ not in ONCE_PER_ITERATION]
        if not per_layer:
            raise BundleError(f"{path}: column 'layer': no per-layer dense ops (only {', '.join(dense)})")
        self.dense_layers = sorted(dense)
        self.dense_layer = sum_tables(per_layer)
        self.dense_once = sum_tables(once) if once else Table1D([1.0], [0.0])
        #: the fewest tokens any dense op was profiled up to (beyond: extrapolated), and where
        self.profiled_tokens = (_largest(data, "tokens"), path)

        path = folder / "per_sequence.csv"
        data = read_csv(path, ("layer", "sequences", "time_us"), text=("layer",))
        per_seq = _tables_by_layer(data, "sequences", path)
        if arch is not None:
            _check_ops(path, per_seq, PER_SEQUENCE_OPS, name, meta_path)
        self.per_sequence = sum_tables([(1e-3, t) for t in per_seq.values()])
        #: the fewest sequences lm_head and the sampler were profiled up to, and where
        self.profiled_sequences = (_largest(data, "sequences"), path)

        path = folder / "attention.csv"
        data, by_key = read_attention(path)
        if not any(pc > 0 for pc in data["prefill_chunk"]):
            raise BundleError(f"{path}: no shot with a prefill chunk (prefill_chunk > 0): a prefill's attention "
                              f"cannot be looked up (it would cost what the cheapest decode shot does)")
        if not any(nd > 0 for nd in data["n_decode"]):
            raise BundleError(f"{path}: no shot with decodes (n_decode > 0): decodes' attention cannot be looked "
                              f"up (it would cost what the cheapest prefill shot does)")
        data["time_us"] = [t * 1e-3 for t in data["time_us"]]
        self.attention = AttentionTable(data, path, by_key=by_key)
        decodes = max(data["n_decode"])
        if decodes < self.profiled_sequences[0]:
            self.profiled_sequences = (decodes, path)

        self.moe = None
        moe_path = self.root / "tp1" / "moe.csv"
        if arch is not None and arch.moe != moe_path.is_file():
            raise BundleError(f"{moe_path}: missing file (meta.yaml: architecture {name!r} is a mixture of experts; "
                              f"its experts are timed from this table)" if arch.moe else
                              f"{moe_path}: an expert table in a bundle whose architecture {name!r} (meta.yaml) has "
                              f"no experts")
        if moe_path.is_file():
            columns = ("tokens", "activated_experts", "time_us")
            if "ep" in csv_header(moe_path):  # vLLM 0.28's profiler: the rows at one expert-parallel rank
                data = read_csv(moe_path, columns + ("ep",))
                data = keep_rows({c: data[c] for c in columns}, [ep == 1.0 for ep in data["ep"]])
                if not data["tokens"]:
                    raise BundleError(f"{moe_path}: column 'ep': no rows at one expert-parallel rank (ep 1)")
            else:
                data = read_csv(moe_path, columns)
            data["time_us"] = [t * 1e-3 for t in data["time_us"]]
            self.moe = MoeTable(data, moe_path)
            if self.moe.max_tokens < self.profiled_tokens[0]:
                self.profiled_tokens = (self.moe.max_tokens, moe_path)

        self.skew = None
        fit_path = folder / "skew_fit.csv"
        # As LLMServingSim: a fit the meta file does not declare enabled is not applied.
        if (self.meta.get("skew_fit") or {}).get("enabled"):
            if not fit_path.is_file():  # (a fit declared and not there would silently turn off)
                raise BundleError(f"{fit_path}: missing file (meta.yaml enables skew_fit; set skew_fit.enabled "
                                  "to false to run without the uneven-context correction)")
            self.skew = SkewAlpha(self.meta, tensor_parallel, fit_path, self.root / "meta.yaml")

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def beyond_profile(self, what: str) -> str:
        """What to say of a run with more ``what`` ("tokens" or "sequences") in a batch than
        the bundle profiled (:attr:`profiled_tokens`, :attr:`profiled_sequences`)."""
        count, path = self.profiled_tokens if what == "tokens" else self.profiled_sequences
        key = "max_num_batched_tokens" if what == "tokens" else "max_num_seqs"
        engine = (self.meta.get("engine_effective") or {}) if isinstance(self.meta.get("engine_effective"), dict) \
            else {}
        ran = f"; the profiler's engine ran {key} = {engine[key]} (meta.yaml: engine_effective)" \
            if key in engine else ""
        return (f"{self.root}: this run has batches of more than {count:,.0f} {what}, the most "
                f"{path.parent.name}/{path.name} profiled{ran}: their times are extrapolated past the "
                f"profile (each table along the chord of its top half), not measured")
