"""A model's shape from its Hugging Face ``config.json``, for models without a preset.

``[models.<name>] config = "path/to/config.json"`` (and ``schedlab capacity --model
path/to/config.json``) reads the fields a :class:`~schedlab.capacity.ModelSpec` needs and counts
the parameters from the shapes, as the checkpoint holds them: attention (grouped-query, with
Qwen2's Q/K/V biases, or DeepSeek's multi-head latent attention), norms, a gated MLP (two
matrices for GPT-style models) or routed experts with their router, shared experts and dense
first layers, the embedding table and the LM head. On the presets' checkpoints the count is
exact (Llama-3-8B 8,030,261,248; Qwen2.5-7B 7,615,616,512; DeepSeek-V3 671,026,419,200 without
its MTP module: ``tests/test_hf_config.py``). Keys set beside ``config`` win over what is read.

Read as well: the KV layout (MLA's latent, sliding-window layers from ``layer_types`` or the
model family's pattern), the checkpoint's weight bytes (``quantization_config``: FP8, MXFP4
experts, 4/8-bit AWQ/GPTQ with their scales), and ``_name_or_path`` as the Hugging Face id
when it is one. Multimodal configs are read from their ``text_config`` (the vision tower is not
counted). Not counted: biases other than Q/K/V and DeepSeek's router bias, attention sinks,
the MTP module.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .configs import not_regular_file, value_text
from .errors import ConfigError

#: Families whose MLP is two matrices (up, down) rather than gated (gate, up, down).
UNGATED = frozenset({"gpt2", "gpt_bigcode", "gpt_neox", "starcoder2", "falcon", "opt", "phi", "bloom"})
#: Families whose ``tie_word_embeddings`` defaults to true when the file leaves it out
#: (transformers' per-model config defaults; PretrainedConfig's own default is also true).
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "qwen2", "starcoder2", "gpt2", "phi"})
#: Families with per-head RMSNorms on Q and K.
QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2"})
#: Families with four norms a layer (before and after attention and the MLP).
FOUR_NORMS = frozenset({"gemma2", "gemma3", "gemma3_text"})
#: Checkpoint dtypes served at 2 bytes a weight (vLLM serves a float32 checkpoint in 16 bits).
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 2, "float": 2, "half": 2}


def read_config(path: str | os.PathLike, where: str) -> dict:
    """The JSON object in ``path``; errors name the file and the table that asked for it."""
    path = Path(path)
    problem = not_regular_file(path)
    if problem:
        raise ConfigError(f"{where}: config: {path} {problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: config: no such file: {path}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: config: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: config: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: config: {path} is not JSON: {exc.msg} (line {exc.lineno}, column "
                          f"{exc.colno})") from None
    except RecursionError:
        raise ConfigError(f"{where}: config: {path} is not JSON: lists or objects nested too deeply to read") from None
    except ValueError:  # a whole number of more than 4,300 digits
        raise ConfigError(f"{where}: config: {path} is not JSON: a number too long to read") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: config: {path} must hold a JSON object (a Hugging Face config.json)")
    return data


class _Reader:
    """Typed reads from a config dict, with errors that name the file and the key."""

    def __init__(self, config: dict, where: str):
        self.config, self.where = config, where

    def int(self, *keys: str, default: Any = None, required: bool = False) -> Any:
        for key in keys:
            value = self.config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{self.where}: {key}: expected a whole number >= 0, got {value_text(value)}")
            if value >= 2**63:  # no config.json writer holds more; ModelSpec bounds the fields it keeps
                raise ConfigError(f"{self.where}: {key}: expected a whole number below 2**63 (64 bits), "
                                  f"got {value_text(value)}")
            return value
        if required:
            raise ConfigError(f"{self.where}: missing {' or '.join(repr(k) for k in keys)} (is this a decoder "
                              "model's config.json?)")
        return default

    def list(self, key: str, item: type) -> list:
        """A list of ``item`` (empty when absent)."""
        value = self.config.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{self.where}: {key}: expected a list of {item.__name__}s, got {value!r}")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value


def model_fields(config: dict, where: str) -> dict:
    """:class:`~schedlab.capacity.ModelSpec` keyword arguments (all but ``name``) from a
    ``config.json`` dict; ``where`` names the file in errors."""
    if isinstance(config.get("text_config"), dict):  # multimodal: the language model's part
        config = {**config["text_config"], "_name_or_path": config.get("_name_or_path")}
    r = _Reader(config, where)
    family = str(r.get("model_type", "")).lower()
    layers = r.int("num_hidden_layers", "n_layer", "num_layers", required=True)
    hidden = r.int("hidden_size", "n_embd", "d_model", required=True)
    heads = r.int("num_attention_heads", "n_head", required=True)
    vocab = r.int("vocab_size", required=True)
    if not (layers and hidden and heads and vocab):
        raise ConfigError(f"{where}: num_hidden_layers, hidden_size, num_attention_heads and vocab_size must be > 0")
    kv_heads = r.int("num_key_value_heads", "num_kv_heads", default=heads) or heads
    head_dim = r.int("head_dim", default=None) or hidden // heads
    tied = bool(r.get("tie_word_embeddings", family in TIED_BY_DEFAULT))
    experts = r.int("num_local_experts", "num_experts", "n_routed_experts", default=0)
    top_k = r.int("num_experts_per_tok", "moe_topk", default=0) if experts else 0
    if experts and not top_k:
        raise ConfigError(f"{where}: {experts} routed experts but no 'num_experts_per_tok'")
    ffn = r.int("intermediate_size", "n_inner", "ffn_dim", default=None) or 4 * hidden
    expert_ffn = r.int("moe_intermediate_size", default=None) or ffn
    mla = r.int("kv_lora_rank", default=None)

    mlp_mats = 2 if family in UNGATED else 3
    norms = (4 if family in FOUR_NORMS else 2) * hidden + (2 * head_dim if family in QK_NORM else 0)
    if mla:
        rope, nope = r.int("qk_rope_head_dim", required=True), r.int("qk_nope_head_dim", required=True)
        v_dim = r.int("v_head_dim", default=head_dim)
        q_rank = r.int("q_lora_rank", default=None)
        q = hidden * q_rank + q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        attn = q + hidden * (mla + rope) + mla + mla * heads * (nope + v_dim) + heads * v_dim * hidden
        head_dim, kv_heads = v_dim, heads
    else:
        attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        if family == "qwen2" or r.get("attention_bias", False) or r.get("qkv_bias", False):
            attn += (heads + 2 * kv_heads) * head_dim
    dense_mlp = mlp_mats * hidden * ffn
    dense_layer = attn + norms + dense_mlp
    total = active = 0
    if experts:
        first_dense = r.int("first_k_dense_replace", default=0)
        step = r.int("moe_layer_freq", "decoder_sparse_step", default=1) or 1
        only_dense = set(r.list("mlp_only_layers", int))
        expert = mlp_mats * hidden * expert_ffn
        shared = r.int("n_shared_experts", default=0) * expert
        shared_ffn = r.int("shared_expert_intermediate_size", default=0)
        if shared_ffn:  # Qwen2-MoE: one shared expert and its sigmoid gate
            shared += mlp_mats * hidden * shared_ffn + hidden
        router = hidden * experts + (experts if r.get("topk_method") == "noaux_tc" else 0)
        # layers i >= first_dense with (i + 1) a multiple of step, less the listed dense ones:
        # counted in closed form (a junk layer count must not loop for ever)
        moe_layers = max(0, layers // step - min(first_dense, layers) // step) - sum(
            1 for i in only_dense if first_dense <= i < layers and (i + 1) % step == 0)
        common = attn + norms + router + shared
        total = (layers - moe_layers) * dense_layer + moe_layers * (common + experts * expert)
        active = (layers - moe_layers) * dense_layer + moe_layers * (common + top_k * expert)
    else:
        total = active = layers * dense_layer
    tables = (1 if tied else 2) * vocab * hidden + hidden
    total, active = total + tables, active + tables

    fields: dict[str, Any] = dict(
        num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, num_params=total, num_attention_heads=heads,
        hidden_size=hidden, vocab_size=vocab, tied_embeddings=tied, num_experts=experts, experts_per_token=top_k)
    if experts:
        fields["active_params"] = active
    if mla:
        fields["kv_latent_dim"] = mla + r.int("qk_rope_head_dim")
    written = r.int("intermediate_size", default=None)
    if written:
        fields["intermediate_size"] = written
    if experts and r.int("n_shared_experts", default=0):
        fields["shared_experts"] = r.int("n_shared_experts")
    context = _context_length(r)
    if context:
        fields["max_position_embeddings"] = context
    fields.update(_sliding_window(r, family, layers))
    fields.update(_weight_bytes(r, where))
    name = r.get("_name_or_path")
    if isinstance(name, str) and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        fields["hf_id"] = name
    return fields


#: keys holding a model's context length, as vLLM reads them (the smallest one given)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_target_positions",
                "max_sequence_length", "max_seq_length", "seq_len")


def _context_length(r: _Reader) -> int | None:
    """The context length vLLM derives its default ``max_model_len`` from: the smallest of
    :data:`CONTEXT_KEYS` the file sets, or ``model_max_length`` when set (Cohere);
    ``ModelArchConfigConvertor.derive_max_model_len_and_key``, vLLM 0.33."""
    override = r.int("model_max_length", default=None)
    if override:
        return override
    given = [r.int(key) for key in CONTEXT_KEYS]
    given = [n for n in given if n]
    return min(given) if given else None


def _sliding_window(r: _Reader, family: str, layers: int) -> dict:
    """``sliding_window`` and how many layers use it: ``layer_types`` when the file lists them,
    else the family's pattern (Gemma 2 every other layer, Gemma 3 five of six), else every
    layer when a window is set and not switched off (``use_sliding_window = false``)."""
    window = r.int("sliding_window", default=None)
    if not window or r.get("use_sliding_window", True) is False:
        return {}
    types = r.list("layer_types", str)
    if types:
        sliding = sum(1 for t in types if "sliding" in str(t))
    elif family == "gemma2":
        sliding = layers // 2
    elif family in ("gemma3", "gemma3_text"):
        pattern = r.int("sliding_window_pattern", default=6) or 6
        sliding = layers - layers // pattern
    else:
        sliding = layers
    return {"sliding_window": window, "sliding_window_layers": sliding} if sliding else {}


def _weight_bytes(r: _Reader, where: str) -> dict:
    """The checkpoint's bytes per weight when they are not the 16-bit default: FP8 (1 byte), MXFP4
    experts (4 bits + an 8-bit scale per 32: 0.53125), AWQ / GPTQ at their bits plus a 16-bit
    scale per group."""
    q = r.get("quantization_config")
    if not isinstance(q, dict):
        dtype = str(r.get("torch_dtype", r.get("dtype", "bfloat16")))
        if dtype not in DTYPE_BYTES:
            raise ConfigError(f"{where}: torch_dtype: {dtype!r} is not a 16- or 32-bit float; set weight_dtype_bytes")
        return {}
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8" or method == "compressed-tensors" and "fp8" in json.dumps(q).lower():
        return {"weight_dtype_bytes": 1.0}
    if method == "mxfp4":
        return {"expert_dtype_bytes": 0.53125}
    if method in ("awq", "gptq"):
        bits = q.get("bits", q.get("w_bit", 4))
        group = q.get("group_size", q.get("q_group_size", 128))
        if not isinstance(bits, int) or bits <= 0:
            raise ConfigError(f"{where}: quantization_config.bits: expected a whole number, got {bits!r}")
        if isinstance(group, bool) or not isinstance(group, int):
            raise ConfigError(f"{where}: quantization_config.group_size: expected a whole number (-1: one group per "
                              f"row), got {group!r}")
        scale = 2.0 / group if group > 0 else 0.0
        return {"weight_dtype_bytes": bits / 8 + scale}
    raise ConfigError(f"{where}: quantization_config: quant_method {method!r} is not read; set "
                      "weight_dtype_bytes (and expert_dtype_bytes) beside config")


def spec_table(table: dict, base_dir: str | os.PathLike, where: str) -> dict:
    """A ``[models.<name>]`` table with its ``config`` file read in: the file's fields, then the
    table's own keys over them."""
    if "config" not in table:
        return table
    path = table["config"]
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{where}: config: expected the path of a config.json, got {path!r}")
    resolved = Path(base_dir, os.path.expanduser(path))
    fields = model_fields(read_config(resolved, where), f"{where}: {resolved}")
    own = {k: v for k, v in table.items() if k != "config"}
    return {**fields, **own}


def is_config_path(value: str) -> bool:
    """Whether a ``--model`` value names a config.json file rather than a preset."""
    return value.endswith(".json") or os.path.isdir(value) and os.path.exists(os.path.join(value, "config.json"))


def spec_from_path(value: str, where: str):
    """A ModelSpec from a config.json (or a folder holding one), named after its folder."""
    from .capacity import ModelSpec
    from .configs import from_table

    path = Path(value)
    if path.is_dir():
        path = path / "config.json"
    name = path.resolve().parent.name.lower() or "model"
    fields = model_fields(read_config(path, where), f"{where}: {path}")
    return from_table(ModelSpec, {"name": name, **fields}, where=f"{where}: {path}")


__all__ = ["model_fields", "read_config", "spec_table", "is_config_path", "spec_from_path"]
