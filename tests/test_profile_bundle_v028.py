"""Profile bundles from LLMServingSim's profiler of vLLM 0.28: ``attention.csv`` keyed by the
keys a chunk attends to (``prefill_key`` = its cached context + itself) with ``layer`` and
``decode_q_len`` columns, ``moe.csv`` with an ``ep`` column. Read exactly as the 0.19 layout,
on written bundles and on the shipped one rewritten in the new layout."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlab.protocols import Batch
from schedlab.testing import examples
from schedlab_plugins.cost_models.profile_bundle import BundleError, ProfileBundle
from test_profiled import NDS, KDS, PCS, model, write_bundle

#: the bundles built here are small, of no architecture: that they name none is said, and not the point
pytestmark = pytest.mark.filterwarnings("ignore:.*names no architecture:schedlab.errors.InputWarning")

KEYS = (0, 4, 32, 48, 288)
SHIPPED = (Path(__file__).resolve().parents[1] / "experiments" / "data" / "llmservingsim" / "profiles"
           / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16")


def attention_by_key_us(pc, key, nd, kd):
    """Linear in each of (chunk, keys, decodes, decode context) separately."""
    return 2.0 + 0.5 * pc + 0.001 * pc * key + nd * (0.1 + 0.02 * kd)


def write_v028_attention(bundle: Path, *, extra: tuple[str, ...] = (), time_us=attention_by_key_us) -> Path:
    """Rewrite the written bundle's attention.csv in vLLM 0.28's layout: every key from the
    chunk up (a chunk attends to at least itself), plus ``extra`` raw lines."""
    lines = ["layer,prefill_chunk,prefill_key,n_decode,kv_decode,decode_q_len,time_us"]
    for pc in PCS:
        for nd in NDS:
            if not (pc or nd):
                continue
            for key in ([k for k in KEYS if k >= pc] if pc else (0,)):
                for kd in (KDS if nd else (0,)):
                    lines.append(f"attention,{pc},{float(key)},{nd},{kd},1,{time_us(pc, key, nd, kd)}")
    (bundle / "tp1" / "attention.csv").write_text("\n".join(lines + list(extra)) + "\n")
    return bundle


@pytest.fixture(scope="module")
def v028_bundle(tmp_path_factory):
    return ProfileBundle(write_v028_attention(write_bundle(tmp_path_factory.mktemp("v028"))), 1)


def test_the_grid_points_are_read_as_measured(v028_bundle):
    for pc in PCS:
        for nd in NDS:
            for key in ([k for k in KEYS if k >= pc] if pc else (0,)):
                for kd in (KDS if nd else (0,)):
                    if pc or nd:
                        kp = key - pc if pc else 0
                        assert v028_bundle.attention(pc, kp, nd, kd) == pytest.approx(
                            attention_by_key_us(pc, key, nd, kd) * 1e-3, rel=1e-12)


@settings(max_examples=examples(200), deadline=None)
@given(st.floats(4, 32), st.floats(32, 288), st.integers(0, 8), st.floats(16, 1024))
def test_between_grid_points_the_keys_are_interpolated_exactly(v028_bundle, pc, key, nd, kd):
    """Where every corner was measured (keys of at least the largest chunk), multilinear
    interpolation reproduces a function linear in each axis, the context looked up as
    context + chunk."""
    kp = max(key - pc, 0.0)
    assert v028_bundle.attention(pc, kp, nd, kd) == pytest.approx(
        attention_by_key_us(pc, kp + pc, nd, kd) * 1e-3, rel=1e-9)


@settings(max_examples=examples(200), deadline=None)
@given(st.floats(1, 64), st.floats(0, 400), st.integers(0, 10), st.floats(0, 2000),
       st.floats(0, 64), st.floats(0, 400))
def test_more_chunk_or_more_context_never_costs_less(v028_bundle, pc, kp, nd, kd, more_pc, more_kp):
    """Below a slice's chunk no shot exists (a chunk attends to itself); those cells must not
    let a longer chunk or a longer cached context cost less."""
    base = v028_bundle.attention(pc, kp, nd, kd)
    assert v028_bundle.attention(pc + more_pc, kp, nd, kd) >= base * (1 - 1e-12)
    assert v028_bundle.attention(pc, kp + more_kp, nd, kd) >= base * (1 - 1e-12)


def test_other_layers_and_verify_rows_are_left_out(tmp_path):
    """Rows of another layer kind (a sparse indexer) or of decodes with several query rows
    (speculative verification) do not move the plain attention table."""
    noise = ("indexer,4,4.0,1,16,1,9999", "attention,4,4.0,1,16,2,9999", "attention,0,0.0,8,64,5,9999")
    plain = ProfileBundle(write_v028_attention(write_bundle(tmp_path / "a")), 1)
    noisy = ProfileBundle(write_v028_attention(write_bundle(tmp_path / "b"), extra=noise), 1)
    for shot in ((4, 0, 1, 16), (4, 10, 2, 64), (0, 0, 8, 64), (32, 100, 8, 1024)):
        assert noisy.attention(*shot) == plain.attention(*shot)


@pytest.mark.parametrize("extra, message", [
    (("attention,32,4.0,1,16,1,5",), "prefill_key below prefill_chunk"),
    (("attention,0,16.0,1,16,1,5",), "prefill_key without a prefill chunk"),
])
def test_impossible_shots_are_named(tmp_path, extra, message):
    bundle = write_v028_attention(write_bundle(tmp_path), extra=extra)
    with pytest.raises(BundleError, match=message):
        ProfileBundle(bundle, 1)


def test_a_file_without_plain_attention_rows_says_what_it_has(tmp_path):
    bundle = write_bundle(tmp_path)
    (bundle / "tp1" / "attention.csv").write_text(
        "layer,prefill_chunk,prefill_key,n_decode,kv_decode,decode_q_len,time_us\nindexer,4,4.0,1,16,1,5\n")
    with pytest.raises(BundleError, match=r"no 'attention' rows \(has indexer\)"):
        ProfileBundle(bundle, 1)
    (bundle / "tp1" / "attention.csv").write_text(
        "layer,prefill_chunk,prefill_key,n_decode,kv_decode,decode_q_len,time_us\nattention,4,4.0,1,16,2,5\n")
    with pytest.raises(BundleError, match="no rows of plain decodes"):
        ProfileBundle(bundle, 1)


def test_moe_rows_at_one_expert_parallel_rank(tmp_path):
    """vLLM 0.28's moe.csv has an ``ep`` column; the rows at ep 1 are the table, whatever the
    other ranks' rows say."""
    bundle = write_bundle(tmp_path, moe=True)
    rows = ["ep,tokens,activated_experts,time_us"]
    for ep, scale in ((1, 1.0), (2, 7.0)):
        rows += [f"{ep},{t},{e},{scale * (5 + 0.5 * t + 2 * e)}" for t in (1, 8, 64) for e in (2, 4, 8)]
    (bundle / "tp1" / "moe.csv").write_text("\n".join(rows) + "\n")
    moe = ProfileBundle(bundle, 1).moe
    for t in (1, 8, 64):
        for e in (2, 4, 8):
            assert moe(t, e) == pytest.approx((5 + 0.5 * t + 2 * e) * 1e-3, rel=1e-12)
    (bundle / "tp1" / "moe.csv").write_text("ep,tokens,activated_experts,time_us\n2,1,2,5\n")
    with pytest.raises(BundleError, match="no rows at one expert-parallel rank"):
        ProfileBundle(bundle, 1)


def _rewrite_shipped(tmp_path: Path) -> Path:
    """The shipped TP-1 Llama bundle with its attention.csv in vLLM 0.28's layout (same shots)."""
    bundle = tmp_path / "bf16"
    shutil.copytree(SHIPPED, bundle, ignore=shutil.ignore_patterns("tp2"))
    path = bundle / "tp1" / "attention.csv"
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    lines = ["layer,prefill_chunk,prefill_key,n_decode,kv_decode,decode_q_len,time_us"]
    for r in rows:
        pc, kp = float(r["prefill_chunk"]), float(r["kv_prefill"])
        key = pc + kp if pc else 0.0
        lines.append(f"attention,{r['prefill_chunk']},{key},{r['n_decode']},{r['kv_decode']},1,{r['time_us']}")
    path.write_text("\n".join(lines) + "\n")
    return bundle


def test_the_shipped_bundle_in_the_new_layout_times_the_same_steps(tmp_path):
    """The same measured shots keyed by context + chunk: the measured points are read as they
    are, and every step (decode-only, mixed, long chunks) within 1.5% of the 0.19 layout's (the
    grids, and so the filled cells and the monotone smoothing, differ)."""
    old = model(SHIPPED, spec=_llama())
    new = model(_rewrite_shipped(tmp_path), spec=_llama())
    batches = [Batch(num_decode=n, decode_context_tokens=n * ctx, decode_context_max=ctx, decode_context_min=ctx)
               for n in (1, 16, 128) for ctx in (64, 1000, 8000)]
    batches += [Batch(num_decode=n, decode_context_tokens=n * 700, decode_context_max=700, decode_context_min=700,
                      num_prefill=1, prefill_tokens=chunk, prefill_context_tokens=cached)
                for n in (0, 8, 64) for chunk in (64, 512, 2048 - n) for cached in (0, 1500)]
    for batch in batches:
        assert new.iteration_ms(batch) == pytest.approx(old.iteration_ms(batch), rel=0.015), batch


def _llama():
    from schedlab.capacity import Presets
    from schedlab.catalog import load_catalog

    return Presets.from_catalog(load_catalog(entry_points=False)).model("llama-3.1-8b")
