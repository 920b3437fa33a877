"""Read a per-operator profile bundle (LLMServingSim's layout) into lookup tables, once.

A bundle is a folder ``<hardware>/<model>/<variant>/`` with ``meta.yaml`` and one ``tp<N>/``
folder per profiled tensor-parallel degree holding (times in microseconds):

* ``dense.csv`` -- ``layer,tokens,time_us``: each dense op of *one* decoder layer against
  the tokens in the iteration (``embedding`` and ``final_layernorm`` run once per iteration);
* ``per_sequence.csv`` -- ``layer,sequences,time_us``: ``lm_head``, ``sampler``;
* ``attention.csv`` -- ``prefill_chunk,kv_prefill,n_decode,kv_decode,time_us``: one layer's
  attention for a mixed batch;
* ``moe.csv`` (MoE models, in ``tp1/`` only) -- ``tokens,activated_experts,time_us``;
* ``skew_fit.csv`` (optional) -- fitted alphas for decodes of uneven context, keyed by the
  bucket axes in ``meta.yaml``.

Interpolation follows the bundle's consumer (LLMServingSim ``serving/core/trace_generator.py``
at the commit in ``experiments/data/llmservingsim/COMMIT``): linear on every axis, clamped
below the smallest grid point, extrapolated from the two largest above the grid; attention
is bracketed on the prefill-chunk and decode-count axes, and a missing (chunk, decodes) slice
falls back to the nearest profiled one. Every error names the file, and the column or row.
"""

from __future__ import annotations

import csv
import math
from bisect import bisect_left, bisect_right
from pathlib import Path

from schedlab.errors import ConfigError

#: Dense ops that run once per iteration, not once per decoder layer.
ONCE_PER_ITERATION = ("embedding", "final_layernorm")
#: Dense ops that run more than once per decoder layer (input and post-attention RMSNorm).
REPEATS_PER_LAYER = {"layernorm": 2}


class BundleError(ConfigError):
    """A profile bundle is missing a file or a column, or has a bad value."""


# --- CSV reading ----------------------------------------------------------------------------


def read_csv(path: Path, columns: tuple[str, ...], *, text: tuple[str, ...] = (),
             signed: tuple[str, ...] = ()) -> dict[str, list]:
    """The named columns of a CSV file; numbers checked finite and >= 0 (times > 0; ``signed``
    columns may be negative).

    :raises BundleError: missing file or column, or a bad value (naming file, line, column).
    """
    if not path.is_file():
        raise BundleError(f"{path}: missing file")
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise BundleError(f"{path}: empty file (expected columns {', '.join(columns)})")
        header = [h.strip() for h in header]
        for column in columns:
            if column not in header:
                raise BundleError(f"{path}: missing column {column!r} (has {', '.join(header)})")
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
                    raise BundleError(f"{path}: line {line}: column {column!r}: not a number: {raw!r}") from None
                if not math.isfinite(value) or (value < 0 and column not in signed) or (
                        column == "time_us" and value <= 0):
                    what = "> 0" if column == "time_us" else ">= 0"
                    raise BundleError(f"{path}: line {line}: column {column!r}: out of range "
                                      f"(must be finite and {what}), got {raw}")
                out[column].append(value)
    if not out[columns[0]]:
        raise BundleError(f"{path}: no rows")
    return out


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


class Table1D:
    """Piecewise-linear ``y(x)`` through sorted grid points: clamped below the first point,
    extrapolated from the last two above the last."""

    __slots__ = ("xs", "ys", "n")

    def __init__(self, xs, ys, *, monotone: bool = False):
        self.xs = list(xs)
        self.ys = non_decreasing(list(ys)) if monotone else list(ys)
        self.n = len(self.xs)

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0] or self.n == 1:
            return ys[0]
        i = bisect_right(xs, x)
        if i >= self.n:
            i = self.n - 1
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (x - x0) * (ys[i] - ys[i - 1]) / (x1 - x0)

    def slope(self, x: float) -> float:
        """The slope just above ``x``."""
        xs, ys, n = self.xs, self.ys, self.n
        if n == 1 or x < xs[0]:
            return 0.0
        i = min(bisect_right(xs, x), n - 1)
        return (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])

    def next_break(self, x: float) -> float:
        """The next grid point strictly above ``x`` (``inf`` past the last: linear from there)."""
        i = bisect_right(self.xs, x)
        return self.xs[i] if i < self.n - 1 else math.inf


def _bracket(values: list, query: float) -> tuple[int, int, float]:
    """``(lo, hi, t)`` on a sorted axis: clamped below, extrapolated above (as LLMServingSim)."""
    n = len(values)
    if n == 1 or query <= values[0]:
        return 0, 0, 0.0
    i = bisect_right(values, query)
    lo, hi = (n - 2, n - 1) if i >= n else (i - 1, i)
    return lo, hi, (query - values[lo]) / (values[hi] - values[lo])


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
    return {layer: Table1D(sorted(p), [p[x] for x in sorted(p)], monotone=True) for layer, p in rows.items()}


class AttentionTable:
    """One layer's attention time (us) over (prefill_chunk, kv_prefill, n_decode, kv_decode)."""

    def __init__(self, data: dict, path: Path):
        slices: dict[tuple, dict[float, dict[float, float]]] = {}
        for pc, kp, nd, kd, t in zip(data["prefill_chunk"], data["kv_prefill"], data["n_decode"],
                                     data["kv_decode"], data["time_us"]):
            slices.setdefault((pc, nd), {}).setdefault(kp, {})[kd] = t
        self.pcs = sorted({pc for pc, _ in slices})
        self.nds = sorted({nd for _, nd in slices})
        # (pc, nd) -> (kp grid, [kd Table1D per kp])
        self.slices = {pair: (sorted(rows), [Table1D(sorted(r), [r[k] for k in sorted(r)], monotone=True)
                                             for _, r in sorted(rows.items())])
                       for pair, rows in slices.items()}
        self.pairs = sorted(self.slices)
        self.path = path
        self._nearest: dict[tuple, tuple] = {}
        self._corners: dict[tuple, list] = {}

    def _slice(self, pc: float, nd: float):
        s = self.slices.get((pc, nd))
        if s is None:
            pair = self._nearest.get((pc, nd))
            if pair is None:
                pair = min(self.pairs, key=lambda p: ((p[0] - pc) ** 2 + (p[1] - nd) ** 2, p))
                self._nearest[(pc, nd)] = pair
            s = self.slices[pair]
        return s

    @staticmethod
    def _in_slice(s, kp: float, kd: float) -> float:
        kps, rows = s
        lo, hi, t = _bracket(kps, kp)
        v = rows[lo](kd)
        if lo == hi:
            return v
        return v + t * (rows[hi](kd) - v)

    def corners(self, pc: float, nd: float):
        """The (weight, slice) pairs whose blend gives the time at (pc, nd) (memoised: an
        iteration's chunk and decode counts repeat)."""
        key = (pc, nd)
        found = self._corners.get(key)
        if found is None:
            found = self._corners_of(pc, nd)
            if len(self._corners) < 1 << 18:
                self._corners[key] = found
        return found

    def _corners_of(self, pc: float, nd: float):
        lo_pc, hi_pc, t_pc = _bracket(self.pcs, pc)
        lo_nd, hi_nd, t_nd = _bracket(self.nds, nd)
        p0, p1, n0, n1 = self.pcs[lo_pc], self.pcs[hi_pc], self.nds[lo_nd], self.nds[hi_nd]
        out = []
        for wp, p in ((1.0 - t_pc, p0), (t_pc, p1)):
            for wn, n in ((1.0 - t_nd, n0), (t_nd, n1)):
                w = wp * wn
                if w != 0.0:
                    out.append((w, self._slice(p, n)))
        return out

    def __call__(self, pc: float, kp: float, nd: float, kd: float) -> float:
        return sum(w * self._in_slice(s, kp, kd) for w, s in self.corners(pc, nd))

    def kd_slope(self, pc: float, kp: float, nd: float, kd: float) -> float:
        """d time / d kv_decode just above ``kd``."""
        total = 0.0
        for w, (kps, rows) in self.corners(pc, nd):
            lo, hi, t = _bracket(kps, kp)
            s = rows[lo].slope(kd)
            if lo != hi:
                s += t * (rows[hi].slope(kd) - s)
            total += w * s
        return total

    def kd_breaks(self, pc: float, kp: float, nd: float, kd: float) -> float:
        """The next kv_decode above ``kd`` where the time's slope in ``kd`` may change."""
        nxt = math.inf
        for _, (kps, rows) in self.corners(pc, nd):
            lo, hi, _ = _bracket(kps, kp)
            for row in (rows[lo], rows[hi]):
                b = row.next_break(kd)
                if b < nxt:
                    nxt = b
        return nxt


class MoeTable:
    """One MoE layer's expert time (us) over (tokens on the rank, distinct experts activated)."""

    def __init__(self, data: dict, path: Path):
        rows: dict[float, dict[float, float]] = {}
        for tokens, experts, t in zip(data["tokens"], data["activated_experts"], data["time_us"]):
            rows.setdefault(experts, {})[tokens] = t
        self.experts = sorted(rows)
        self.rows = [Table1D(sorted(r), [r[k] for k in sorted(r)], monotone=True) for _, r in sorted(rows.items())]

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

    def bucket(self, axis: str, value: float) -> int:
        """LLMServingSim's ``_bucket_label``: the first bin whose upper edge is >= value."""
        uppers, labels = self.bins[axis]
        return min(bisect_left(uppers, value), len(labels) - 1)

    def kv_big_edge(self, kv_big: float) -> float:
        """The largest longest-context value still in ``kv_big``'s bucket."""
        uppers, labels = self.bins["kv_big"]
        i = bisect_left(uppers, kv_big)
        return uppers[i] if i < len(labels) - 1 else math.inf

    def __call__(self, pc: float, n: int, skew_rate: float, kv_big: float, kp: float) -> float:
        key = (pc, self.bucket("n", n), self.bucket("skew_rate", min(1.0, max(0.0, skew_rate))),
               self.bucket("kv_big", kv_big), self.bucket("kp", kp))
        return self.table.get(key, self.default)


# --- the bundle -------------------------------------------------------------------------------


def read_meta(path: Path) -> dict:
    import yaml  # the bundle's meta file is YAML

    if not path.is_file():
        raise BundleError(f"{path}: missing file")
    try:
        meta = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BundleError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(meta, dict):
        raise BundleError(f"{path}: expected a mapping at the top level")
    return meta


class ProfileBundle:
    """The tables of one bundle at one tensor-parallel degree, times in **milliseconds**.

    :ivar dense_layer: one decoder layer's dense ops (``layernorm`` twice) against tokens;
    :ivar dense_once: once-per-iteration dense ops (embedding, final norm) against tokens;
    :ivar per_sequence: ``lm_head`` + ``sampler`` against sequences in the iteration;
    :ivar attention: one layer's attention; :ivar moe: one MoE layer (or None);
    :ivar skew: the skew alpha (or None: no correction, when the bundle has no ``skew_fit.csv``
        or ``meta.yaml`` does not mark ``skew_fit.enabled``).
    """

    def __init__(self, root, tensor_parallel: int = 1):
        self.root = Path(root)
        if not self.root.is_dir():
            raise BundleError(f"{self.root}: profile folder not found (expected <hardware>/<model>/<variant>/ "
                              f"with meta.yaml and tp<N>/)")
        self.tp = tensor_parallel
        folder = self.root / f"tp{tensor_parallel}"
        if not folder.is_dir():
            have = sorted(p.name for p in self.root.glob("tp*") if p.is_dir())
            raise BundleError(f"{folder}: missing folder: tensor_parallel = {tensor_parallel} was not profiled "
                              f"(profiled: {', '.join(have) or 'none'})")
        self.meta = read_meta(self.root / "meta.yaml")

        path = folder / "dense.csv"
        dense = _tables_by_layer(read_csv(path, ("layer", "tokens", "time_us"), text=("layer",)), "tokens", path)
        once = [(1e-3, t) for name, t in dense.items() if name in ONCE_PER_ITERATION]
        per_layer = [(1e-3 * REPEATS_PER_LAYER.get(name, 1), t) for name, t in dense.items()
                     if name not in ONCE_PER_ITERATION]
        if not per_layer:
            raise BundleError(f"{path}: column 'layer': no per-layer dense ops (only {', '.join(dense)})")
        self.dense_layers = sorted(dense)
        self.dense_layer = sum_tables(per_layer)
        self.dense_once = sum_tables(once) if once else Table1D([1.0], [0.0])

        path = folder / "per_sequence.csv"
        per_seq = _tables_by_layer(read_csv(path, ("layer", "sequences", "time_us"), text=("layer",)),
                                   "sequences", path)
        self.per_sequence = sum_tables([(1e-3, t) for t in per_seq.values()])

        path = folder / "attention.csv"
        cols = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
        data = read_csv(path, cols)
        data["time_us"] = [t * 1e-3 for t in data["time_us"]]
        self.attention = AttentionTable(data, path)

        self.moe = None
        moe_path = self.root / "tp1" / "moe.csv"
        if moe_path.is_file():
            data = read_csv(moe_path, ("tokens", "activated_experts", "time_us"))
            data["time_us"] = [t * 1e-3 for t in data["time_us"]]
            self.moe = MoeTable(data, moe_path)

        self.skew = None
        fit_path = folder / "skew_fit.csv"
        # As LLMServingSim: a fit the meta file does not declare enabled is not applied.
        if fit_path.is_file() and (self.meta.get("skew_fit") or {}).get("enabled"):
            self.skew = SkewAlpha(self.meta, tensor_parallel, fit_path, self.root / "meta.yaml")

    @property
    def is_moe(self) -> bool:
        return self.moe is not None
