"""Guards of the profile-bundle reader and the profiled cost model against bundles that would
otherwise give a silently wrong number (a review against LLMServingSim's bundles): a missing
operator, a one-point table, attention without prefill or decode shots, a hybrid or unknown
architecture, the legacy v0 layout, a byte-order mark; and the warnings: hardware other than
the run's GPU, no model named, batches past the profiled tokens or sequences.

Each damaged bundle is a copy of a shipped one (``experiments/data/llmservingsim/profiles``)
edited in ``tmp_path``; every error and warning must name the file and the problem."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import pytest

from schedlab.capacity import Presets
from schedlab.catalog import load_catalog
from schedlab.protocols import Batch
from schedlab_plugins.cost_models.profile_bundle import (ARCHITECTURES, ONCE_PER_ITERATION, PER_SEQUENCE_OPS,
                                                        BundleError, BundleWarning, ProfileBundle,
                                                        ProfileRangeWarning)
from schedlab_plugins.cost_models.profiled import ProfiledConfig, build_profiled, gpu_family
from schedlab_plugins.cost_models.step_overhead import GPU_ONLY

PROFILES = Path(__file__).resolve().parents[1] / "experiments" / "data" / "llmservingsim" / "profiles"
LLAMA = PROFILES / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16"     # architecture: llama, tp1
QWEN_MOE = PROFILES / "RTXPRO6000" / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16"  # qwen3_moe, tp1
SHIPPED = sorted(meta.parent for meta in PROFILES.glob("*/*/*/*/meta.yaml"))


@pytest.fixture(scope="module")
def presets():
    return Presets.from_catalog(load_catalog(entry_points=False))


def copy(src: Path, tmp_path: Path) -> Path:
    """A copy of a shipped bundle, laid out as one (``<hardware>/<org>/<model>/<variant>``)."""
    dest = tmp_path / "HW" / src.parent.parent.name / src.parent.name / src.name
    shutil.copytree(src, dest)
    return dest


def keep_rows(path: Path, keep) -> None:
    """Keep the header of the CSV ``path`` and the rows for which ``keep(fields, header)`` is true
    (``fields``: the row split at commas, ``header``: the column names)."""
    header, *rows = path.read_text().splitlines()
    names = header.split(",")
    path.write_text("\n".join([header] + [row for row in rows if row and keep(row.split(","), names)]) + "\n")


def drop_rows(path: Path, first_column: str) -> None:
    """Delete the rows of ``path`` whose first column is ``first_column``."""
    keep_rows(path, lambda fields, _: fields[0] != first_column)


def set_meta(bundle: Path, key: str, value: str | None) -> None:
    """Replace (``value`` None: delete) the top-level ``key:`` line of the bundle's meta.yaml."""
    path = bundle / "meta.yaml"
    lines = [line for line in path.read_text().splitlines() if not line.startswith(f"{key}:")]
    if value is not None:
        lines.insert(0, f"{key}: {value}")
    path.write_text("\n".join(lines) + "\n")


def first_tp(bundle: Path) -> int:
    return min(int(p.name[2:]) for p in bundle.glob("tp*") if p.is_dir())


# --- F1: operators the architecture runs ---------------------------------------------------------


@pytest.mark.parametrize("op", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "layernorm", "embedding"])
def test_a_dense_operator_the_layer_runs_must_be_there(tmp_path, op):
    """Deleting gate_up_proj took 43% off a decode step without a word; every op of the llama
    layer (and the once-per-iteration ones) is now required."""
    bundle = copy(LLAMA, tmp_path)
    drop_rows(bundle / "tp1" / "dense.csv", op)
    with pytest.raises(BundleError, match=rf"tp1/dense.csv: column 'layer': no rows of {op}, which a 'llama' "
                                          rf"model runs .*would count as no time"):
        ProfileBundle(bundle, 1)


@pytest.mark.parametrize("op", ["lm_head", "sampler"])
def test_a_per_sequence_operator_must_be_there(tmp_path, op):
    bundle = copy(LLAMA, tmp_path)
    drop_rows(bundle / "tp1" / "per_sequence.csv", op)
    with pytest.raises(BundleError, match=rf"tp1/per_sequence.csv: column 'layer': no rows of {op}, which a "
                                          rf"'llama' model runs"):
        ProfileBundle(bundle, 1)


def test_several_missing_operators_are_all_named(tmp_path):
    bundle = copy(LLAMA, tmp_path)
    for op in ("gate_up_proj", "down_proj"):
        drop_rows(bundle / "tp1" / "dense.csv", op)
    with pytest.raises(BundleError, match=r"tp1/dense.csv: column 'layer': no rows of gate_up_proj, down_proj"):
        ProfileBundle(bundle, 1)


def test_a_moe_architecture_needs_its_expert_table(tmp_path):
    """qwen3_moe layers run the expert block of tp1/moe.csv; without it the bundle alone used to
    load as a dense model whose MLP cost nothing."""
    bundle = copy(QWEN_MOE, tmp_path)
    (bundle / "tp1" / "moe.csv").unlink()
    with pytest.raises(BundleError, match=r"tp1/moe.csv: missing file \(meta.yaml: architecture 'qwen3_moe' is "
                                          r"a mixture of experts"):
        ProfileBundle(bundle, 1)


def test_an_operator_the_architecture_does_not_run_is_refused(tmp_path):
    """A linear_attention row (a hybrid model's) in a llama bundle: where it runs is not known."""
    bundle = copy(LLAMA, tmp_path)
    path = bundle / "tp1" / "dense.csv"
    path.write_text(path.read_text() + "linear_attention,1,10.0\nlinear_attention,2048,20.0\n")
    with pytest.raises(BundleError, match=r"tp1/dense.csv: column 'layer': linear_attention is not an operator of "
                                          r"a 'llama' model"):
        ProfileBundle(bundle, 1)


def test_the_required_operators_are_the_composed_ones():
    """One list for both: the dense ops each architecture composes are the ones required, and
    a dense-MLP model's layer has gate_up_proj and down_proj, a MoE model's the expert table."""
    for name, arch in ARCHITECTURES.items():
        assert {"qkv_proj", "o_proj", "layernorm"} <= set(arch.layer), name
        assert arch.layer_weights["layernorm"] == 2
        assert arch.moe or {"gate_up_proj", "down_proj"} <= set(arch.layer), name
    assert set(ONCE_PER_ITERATION) == {"embedding", "final_layernorm"} and "lm_head" in PER_SEQUENCE_OPS


@pytest.mark.parametrize("name, column", [("dense.csv", "tokens"), ("per_sequence.csv", "sequences")])
def test_an_operator_at_one_point_is_refused(tmp_path, name, column):
    """One token count per op made every table a constant: a 1,024-token prefill -70%."""
    bundle = copy(LLAMA, tmp_path)
    path = bundle / "tp1" / name
    seen: set[str] = set()
    keep_rows(path, lambda fields, _: fields[0] not in seen and not seen.add(fields[0]))  # each op's first row
    with pytest.raises(BundleError, match=rf"tp1/{name}: layer '\w+': one {column} value only .*a single point "
                                          rf"cannot be interpolated"):
        ProfileBundle(bundle, 1)


def test_a_moe_row_at_one_point_is_refused(tmp_path):
    bundle = copy(QWEN_MOE, tmp_path)
    path = bundle / "tp1" / "moe.csv"
    seen: list = []  # of 128 activated experts, only the first row
    keep_rows(path, lambda fields, _: fields[1] != "128" or not seen and not seen.append(fields))
    with pytest.raises(BundleError, match=r"tp1/moe.csv: activated_experts 128: one tokens value only .*a single "
                                          r"point cannot be interpolated"):
        ProfileBundle(bundle, 1)


@pytest.mark.parametrize("keep, message", [
    (lambda pc, nd: pc == 0, r"no shot with a prefill chunk \(prefill_chunk > 0\): a prefill's attention cannot"),
    (lambda pc, nd: nd == 0, r"no shot with decodes \(n_decode > 0\): decodes' attention cannot"),
])
def test_attention_needs_prefill_and_decode_shots(tmp_path, keep, message):
    """Decode-only shots gave a 1,024-token prefill the cheapest cell; prefill-only ones let
    decodes' attention cost about nothing."""
    bundle = copy(LLAMA, tmp_path)
    path = bundle / "tp1" / "attention.csv"
    keep_rows(path, lambda fields, names: keep(float(fields[names.index("prefill_chunk")]),
                                               float(fields[names.index("n_decode")])))
    with pytest.raises(BundleError, match=rf"tp1/attention.csv: {message}"):
        ProfileBundle(bundle, 1)


# --- F2: architectures the composition does not know ------------------------------------------------


def test_a_hybrid_layer_mix_is_refused(tmp_path):
    """The H100 Qwen3.6-35B-A3B bundle (LLMServingSim PR 34): 30 linear- and 10 full-attention
    layers, timed as 40 layers of every op: +36% on a decode step."""
    bundle = copy(LLAMA, tmp_path)
    path = bundle / "meta.yaml"
    path.write_text(path.read_text() + "layer_mix:\n  linear_attention_layers: 30\n  full_attention_layers: 10\n")
    with pytest.raises(BundleError, match=r"meta.yaml: layer_mix .*linear_attention_layers.*: a hybrid model .* is "
                                          r"not modelled"):
        ProfileBundle(bundle, 1)


def test_an_unknown_architecture_is_refused(tmp_path):
    bundle = copy(LLAMA, tmp_path)
    set_meta(bundle, "architecture", "qwen3_next")
    with pytest.raises(BundleError, match=r"meta.yaml: architecture 'qwen3_next' is not modelled: .* \(it knows "
                                          r"llama, mixtral, phimoe, qwen3, qwen3_moe\)"):
        ProfileBundle(bundle, 1)


@pytest.mark.parametrize("root", SHIPPED, ids=lambda p: f"{p.parents[2].name}/{p.parent.name}")
def test_the_shipped_bundles_declare_known_architectures(root):
    """Nothing shipped is refused or warned about (llama, qwen3, qwen3_moe)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", BundleWarning)
        bundle = ProfileBundle(root, first_tp(root))
    assert bundle.architecture is ARCHITECTURES[bundle.meta["architecture"]]


# --- F8a: the legacy v0 layout ---------------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 4])
def test_the_legacy_v0_layout_is_named(tmp_path, tp):
    """``tp<N>/layers.csv`` without meta.yaml used to say only 'meta.yaml: missing file'."""
    root = tmp_path / "H100" / "meta-llama" / "Llama-3.1-8B"
    for n in (1, 2):
        (root / f"tp{n}").mkdir(parents=True)
        (root / f"tp{n}" / "layers.csv").write_text("layer_name,input,kv_cache,tp_size,latency(ns)\n"
                                                    f"embedding,1,0,{n},1000\n")
    with pytest.raises(BundleError, match=rf"{re.escape(str(root))}: this is LLMServingSim's legacy v0 layout "
                                          r"\(tp<N>/layers.csv, no meta.yaml\), which is not supported .*re-profile"):
        ProfileBundle(root, tp)
    with pytest.raises(BundleError, match=r"tp1: this is LLMServingSim's legacy v0 layout"):
        ProfileBundle(root / "tp1", 1)  # the tp folder itself


# --- F8g: a byte-order mark ------------------------------------------------------------------------


def test_a_byte_order_mark_is_accepted(tmp_path):
    bundle = copy(LLAMA, tmp_path)
    for name in ("dense.csv", "per_sequence.csv", "attention.csv", "skew_fit.csv"):
        path = bundle / "tp1" / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    path = bundle / "meta.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    marked, plain = ProfileBundle(bundle, 1), ProfileBundle(LLAMA, 1)
    for tokens in (1, 100, 2048, 5000):
        assert marked.dense_layer(tokens) == plain.dense_layer(tokens)
    assert marked.attention(512, 1024, 8, 900) == plain.attention(512, 1024, 8, 900)


# --- F8b, F8c: the model and hardware meta.yaml names ------------------------------------------------


def build(root: Path, presets, **config):
    return build_profiled(ProfiledConfig(profile=str(root), **{"model": "llama-3.1-8b", **GPU_ONLY, **config}),
                          presets)


def test_hardware_other_than_the_gpu_preset_is_warned_of(tmp_path, presets):
    """An RTX PRO 6000 bundle with gpu = "h100-80gb" ran without a word."""
    with pytest.warns(BundleWarning, match=r"Llama-3.1-8B/bf16/meta.yaml: the bundle was profiled on RTXPRO6000 / "
                                           r"NVIDIA RTX PRO 6000 Blackwell Server Edition \(RTX PRO 6000\), but the "
                                           r"cost model's gpu is 'h100-80gb' \(H100\)"):
        build(LLAMA, presets, gpu="h100-80gb")


@pytest.mark.parametrize("root, gpu", [(LLAMA, "rtx-pro-6000-server"), (LLAMA, "rtx-pro-6000"),
                                       (PROFILES / "RTX4090" / "meta-llama" / "Llama-3.1-8B" / "bf16", "rtx-4090")])
def test_the_profiled_gpu_is_not_warned_of(root, gpu, presets):
    with warnings.catch_warnings():
        warnings.simplefilter("error", BundleWarning)
        build(root, presets, gpu=gpu)


def test_gpu_families_are_matched_conservatively():
    assert gpu_family("H100") == gpu_family("h100-pcie-80gb") == gpu_family("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_family("gh200-96gb") == "GH200" and gpu_family("h200-141gb") == "H200"
    assert gpu_family("A6000") == gpu_family("rtx-a6000") == "RTX A6000" != gpu_family("RTXPRO6000")
    assert gpu_family("l40s") == "L40S" != gpu_family("l4") == "L4"
    assert gpu_family("my-custom-accelerator") is None and gpu_family(None) is None


def test_a_bundle_naming_no_model_is_warned_of(tmp_path, presets):
    """Any model is accepted then (a Llama bundle ran as qwen3-32b): say so."""
    bundle = copy(LLAMA, tmp_path)
    set_meta(bundle, "model", None)
    with pytest.warns(BundleWarning, match=r"Llama-3.1-8B/bf16/meta.yaml: names no model \(no 'model' key\), so "
                                           r"the bundle is not checked .* 'qwen3-32b': any model is accepted"):
        build(bundle, presets, model="qwen3-32b")


# --- F5: past the profiled tokens and sequences ---------------------------------------------------


def test_batches_past_the_profiled_tokens_are_warned_of_once(presets):
    cost = build(LLAMA, presets)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileRangeWarning)
        cost.iteration_ms(Batch(num_prefill=1, prefill_tokens=2048))   # the profile's top: measured
        cost.iteration_ms(Batch(num_decode=256, decode_context_tokens=256 * 500, decode_context_max=500,
                                decode_context_min=500))
    with pytest.warns(ProfileRangeWarning, match=r"Llama-3.1-8B/bf16: this run has batches of more than 2,048 "
                                                 r"tokens, the most tp1/dense.csv profiled; the profiler's engine "
                                                 r"ran max_num_batched_tokens = 2048 .*extrapolated"):
        cost.iteration_ms(Batch(num_prefill=1, prefill_tokens=4096))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileRangeWarning)
        cost.iteration_ms(Batch(num_prefill=1, prefill_tokens=8192))   # said once


def test_batches_past_the_profiled_sequences_are_warned_of(presets):
    cost = build(LLAMA, presets)
    with pytest.warns(ProfileRangeWarning, match=r"more than 256 sequences, the most tp1/per_sequence.csv "
                                                 r"profiled; the profiler's engine ran max_num_seqs = 256"):
        cost.iteration_ms(Batch(num_decode=300, decode_context_tokens=300 * 500, decode_context_max=500,
                                decode_context_min=500))
