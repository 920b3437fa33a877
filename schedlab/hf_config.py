"""A model's shape from its Hugging Face ``config.json``, for models without a preset.

``[models.<name>] config = "path/to/config.json"`` (and ``schedlab capacity --model
path/to/config.json``) reads the fields a :class:`~schedlab.capacity.ModelSpec` needs and counts
the parameters from the shapes, as the checkpoint holds them: attention (grouped-query, with
Qwen2's Q/K/V biases, or DeepSeek's multi-head latent attention), norms, a gated MLP (two
matrices for GPT-style models) or routed experts with their router, shared experts and dense
first layers (Llama 4's shared expert and interleaved dense layers; ERNIE-4.5's ``moe_*`` keys),
Qwen3-Next's gated attention and Gated DeltaNet layers, the Mamba-2 layers of Nemotron-H,
Granite-4.0-H and Bamba, the embedding table and the LM head. On the presets' checkpoints the
count is exact (Llama-3-8B 8,030,261,248; Qwen2.5-7B 7,615,616,512; DeepSeek-V3 671,026,419,200
without its MTP module: ``tests/test_hf_config.py``; current models' real files:
``tests/test_hf_configs_real.py``). Keys set beside ``config`` win over what is read.

Read as well: the KV layout (MLA's latent, sliding-window layers from ``layer_types`` or the
model family's pattern), the checkpoint's weight bytes (``quantization_config``: FP8, MXFP4
experts, 4/8-bit AWQ/GPTQ with their scales and zero points, compressed-tensors, ModelOpt
FP8/NVFP4; the embedding table and LM head at 16 bits, as those checkpoints keep them), the FP8 KV
cache a ModelOpt checkpoint asks for (``kv_cache_quant_algo``, which vLLM's ``--kv-cache-dtype
auto`` follows), and ``_name_or_path`` as the Hugging Face id when it is one. Multimodal configs
are read from their ``text_config`` (the vision tower is not counted), with the outer file's dtype
and ``quantization_config`` and the defaults transformers leaves out of a saved ``text_config``
(Gemma 3's vocabulary and head size). Not counted: biases
other than Q/K/V and DeepSeek's router bias, attention sinks, the MTP module.

Layers that do not keep every token's K and V are counted apart from the full-attention ones
(:attr:`~schedlab.capacity.ModelSpec.kv_layers`): sliding-window layers, Llama 4's chunked
layers (at most ``attention_chunk_size`` tokens), Mllama's cross-attention layers (the image's
tokens) and linear-attention layers (Qwen3-Next's Gated DeltaNet: a fixed state per sequence,
given as the tokens of full-attention KV it equals, and kept in ``state_bytes``). They share
``sliding_window_layers``; the ``sliding_window`` shown is the largest of their spans.

A layout schedlab cannot read is refused rather than read as plain attention layers: Jamba's
``attn_layer_period``, MiniMax-Text-01's ``attn_type_list``, Mamba keys of other hybrids
(Falcon-H1, Zamba), recurrent ``layer_types`` outside the families above, a
``sliding_window_pattern`` whose rule is not coded, and expert counts under names not read.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path
from typing import Any

from .configs import not_regular_file, value_text
from .errors import ConfigError

#: Families whose MLP is two matrices (up, down) rather than gated (gate, up, down). Nemotron,
#: Arcee (AFM) and Apertus (relu² / xIELU) and Persimmon too: transformers' ``NemotronMLP``,
#: ``ArceeMLP``, ``ApertusMLP`` (``up_proj``, ``down_proj``) and ``PersimmonMLP``
#: (``dense_h_to_4h``, ``dense_4h_to_h``), ``models/*/modeling_*.py`` (transformers 5.20).
UNGATED = frozenset({"gpt2", "gpt_bigcode", "gpt_neox", "starcoder2", "falcon", "opt", "phi", "bloom",
                     "nemotron", "arcee", "apertus", "persimmon"})
#: Families whose ``tie_word_embeddings`` defaults to true when the file leaves it out
#: (transformers' per-model config defaults; PretrainedConfig's own default is also true). OPT,
#: BLOOM and Cohere among them: ``OPTConfig``, ``BloomConfig``, ``CohereConfig`` and
#: ``Cohere2Config`` declare ``tie_word_embeddings: bool = True`` (transformers 5.20,
#: ``models/{opt,bloom,cohere,cohere2}/configuration_*.py``), and facebook/opt-125m's config.json
#: leaves the key out (its LM head is the embedding table: 125M parameters, not 162M). SmolLM3,
#: ERNIE-4.5 (dense and MoE) and MPT as well (``SmolLM3Config``, ``Ernie4_5Config``,
#: ``Ernie4_5_MoeConfig``, ``MptConfig``).
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "starcoder2", "gpt2", "gpt_bigcode", "falcon",
                             "opt", "bloom", "cohere", "cohere2", "smollm3", "ernie4_5", "ernie4_5_moe", "mpt"})
#: Falcon's model types (vLLM's ``falcon_model_types``): multi-query unless ``new_decoder_architecture``.
FALCON = frozenset({"falcon", "refinedweb", "refinedwebmodel"})
#: Families with per-head RMSNorms on Q and K (Llama 4's is an L2 norm without weights).
QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2", "qwen3_next", "qwen3_5_text",
                     "qwen3_5_moe_text", "apertus"})
#: Families whose attention output is gated by a second half of ``q_proj`` (Qwen3-Next always;
#: Qwen3.5 by ``attn_output_gate``).
GATED_ATTENTION = frozenset({"qwen3_next"})
#: transformers' defaults for keys its multimodal configs leave out of the ``text_config`` they save
#: (``Gemma3TextConfig``, ``Llama4TextConfig``, ``MllamaTextConfig``): the file is read as transformers reads it.
TEXT_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131072, "sliding_window": 4096, "sliding_window_pattern": 6},
    "llama4_text": {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
                    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
                    "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                    "no_rope_layer_interval": 4, "attention_chunk_size": 8192},
    "mllama_text_model": {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                          "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                          "max_position_embeddings": 131072, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]},
}
#: Keys of a multimodal config's outer file that hold for its language model when its
#: ``text_config`` does not set them.
OUTER_KEYS = ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings", "_name_or_path")
#: Families with four norms a layer (before and after attention and the MLP).
FOUR_NORMS = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})
#: Checkpoint dtypes served at 2 bytes a weight (vLLM serves a float32 checkpoint in 16 bits).
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 2, "float": 2, "half": 2}
#: Families whose ``linear_attention`` layers are Gated DeltaNet, sized from the ``linear_*`` keys.
GATED_DELTANET = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"})
#: Families whose recurrent layers are Mamba-2 mixers sized from the ``mamba_*`` keys
#: (``GraniteMoeHybridMambaLayer``, ``BambaMixer``): ``layer_types`` ``mamba`` -- or
#: ``linear_attention``, as transformers 5.20 names them (``layers_block_type``) -- and Bamba's
#: ``attn_layer_indices``.
MAMBA2_FAMILIES = frozenset({"granitemoehybrid", "bamba"})
#: Families with a shared MLP of ``shared_intermediate_size`` beside the experts (Granite MoE).
GRANITE_SHARED_MLP = frozenset({"granitemoehybrid", "granitemoeshared"})
#: Keys holding a layout of layers (or of experts) that transformers derives and schedlab does not
#: read: read as a plain transformer, such a model would get K and V in every layer.
UNREAD_LAYOUT = {
    "attn_layer_period": "Jamba's attention layers (i % attn_layer_period == attn_layer_offset, the rest Mamba)",
    "attn_layer_offset": "Jamba's attention layers (i % attn_layer_period == attn_layer_offset, the rest Mamba)",
    "expert_layer_period": "Jamba's MoE layers (i % expert_layer_period == expert_layer_offset)",
    "expert_layer_offset": "Jamba's MoE layers (i % expert_layer_period == expert_layer_offset)",
    "attn_layer_indices": "the attention layers of a Mamba hybrid (the rest Mamba)",
    "attn_type_list": "MiniMax's softmax (1) and lightning-attention (0) layers",
    "layers_block_type": "each layer's kind of a Mamba hybrid (Zamba)",
    "ssm_cfg": "the Mamba layers of a hybrid",
}


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

    def flag(self, key: str, default: bool = False) -> bool:
        """A true/false key (``"false"`` as text is no false: ``bool()`` read it as true)."""
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where}: {key}: expected true or false, got {value_text(value)}")
        return value


def _text_config(config: dict) -> dict:
    """The language model's keys: a multimodal file's ``text_config`` over the outer keys that hold
    for it (:data:`OUTER_KEYS`; the outer ``_name_or_path`` and ``vision_config`` are kept), then
    transformers' defaults for the keys a saved config leaves out (:data:`TEXT_DEFAULTS`)."""
    text = config.get("text_config")
    if isinstance(text, dict):
        outer = {k: config[k] for k in OUTER_KEYS if config.get(k) is not None}
        config = {**outer, **text, "_name_or_path": config.get("_name_or_path"),
                  "vision_config": config.get("vision_config")}
    defaults = TEXT_DEFAULTS.get(str(config.get("model_type", "")).lower())
    return {**defaults, **config} if defaults else config


def model_fields(config: dict, where: str) -> dict:
    """:class:`~schedlab.capacity.ModelSpec` keyword arguments (all but ``name``) from a
    ``config.json`` dict; ``where`` names the file in errors."""
    r = _Reader(_text_config(config), where)
    family = r.get("model_type", "")
    if not isinstance(family, str):  # a name: a number here is a damaged file
        raise ConfigError(f"{where}: model_type: expected a name such as \"llama\", got {value_text(family)}")
    family = family.lower()
    if isinstance(r.get("hybrid_override_pattern"), str):
        return _hybrid_pattern_fields(r, family, where)
    _refuse_unread_layout(r, family)
    layers = r.int("num_hidden_layers", "n_layer", "num_layers", required=True)
    hidden = r.int("hidden_size", "n_embd", "d_model", required=True)
    heads = r.int("num_attention_heads", "n_head", required=True)
    vocab = r.int("padded_vocab_size", "vocab_size", required=True)  # (ChatGLM's embedding is the padded one)
    if not (layers and hidden and heads and vocab):
        raise ConfigError(f"{where}: num_hidden_layers, hidden_size, num_attention_heads and vocab_size must be > 0")
    kv_heads = _kv_heads(r, family, heads)
    head_dim = r.int("head_dim", "kv_channels", default=None)
    if head_dim == 0:
        raise ConfigError(f"{where}: head_dim: a head is at least 1 wide, got 0 (leave it out for hidden_size / "
                          "num_attention_heads)")
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f"{where}: hidden_size {hidden} does not split into {heads} heads "
                              "(num_attention_heads) and no head_dim is given")
        head_dim = hidden // heads
    tied = r.flag("tie_word_embeddings", family in TIED_BY_DEFAULT)
    # ERNIE-4.5 keeps them as moe_num_experts / moe_k (Ernie4_5_MoeConfig.attribute_map)
    experts = r.int("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", default=0)
    top_k = r.int("num_experts_per_tok", "moe_topk", "moe_k", default=0) if experts else 0
    if experts and not top_k:
        raise ConfigError(f"{where}: {experts} routed experts but no 'num_experts_per_tok'")
    if not experts:
        _refuse_unread_experts(r)
    ffn = r.int("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", default=None) or 4 * hidden
    granite_shared = r.int("shared_intermediate_size", default=0) if family in GRANITE_SHARED_MLP else 0
    if granite_shared and not experts:  # (a dense Granite-4.0-H: its shared MLP is the layer's MLP)
        ffn = granite_shared
    expert_ffn = r.int("moe_intermediate_size", default=None) or ffn
    if family == "llama4_text":  # experts and the shared expert of intermediate_size, dense layers wider
        ffn = r.int("intermediate_size_mlp", default=None) or ffn
    mla = r.int("kv_lora_rank", default=None)
    kinds = _layer_kinds(r, family, layers)

    mlp_mats = 2 if family in UNGATED else 3
    norms = (4 if family in FOUR_NORMS else 2) * hidden
    if mla:
        rope, nope = r.int("qk_rope_head_dim", required=True), r.int("qk_nope_head_dim", required=True)
        v_dim = r.int("v_head_dim", default=head_dim)
        q_rank = r.int("q_lora_rank", default=None)
        q = hidden * q_rank + q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        attn = q + hidden * (mla + rope) + mla + mla * heads * (nope + v_dim) + heads * v_dim * hidden
        attention_modules = {"kv_a_proj_with_mqa": hidden * (mla + rope), "kv_b_proj": mla * heads * (nope + v_dim),
                             "o_proj": heads * v_dim * hidden,
                             **({"q_a_proj": hidden * q_rank, "q_b_proj": q_rank * heads * (nope + rope)} if q_rank
                                else {"q_proj": hidden * heads * (nope + rope)})}
        head_dim, kv_heads = v_dim, heads
    else:
        attention_modules = {"q_proj": hidden * heads * head_dim, "k_proj": hidden * kv_heads * head_dim,
                             "v_proj": hidden * kv_heads * head_dim, "o_proj": heads * head_dim * hidden}
        attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        if family.startswith("qwen2") or r.flag("attention_bias") or r.flag("qkv_bias") or r.flag("add_qkv_bias"):
            attn += (heads + 2 * kv_heads) * head_dim
        if family in GATED_ATTENTION or r.flag("attn_output_gate"):
            attn += hidden * heads * head_dim  # q_proj's second half: the output gate
        attn += 2 * head_dim if family in QK_NORM else 0
    linear, mamba = kinds.get("linear", 0), kinds.get("mamba", 0)
    attn_sum = (layers - linear - mamba) * attn + linear * _linear_attention_params(r, hidden)
    if mamba:
        attn_sum += mamba * _mamba2(r, family, hidden)["params"]
    dense_mlp = mlp_mats * hidden * ffn
    shared_count = 1 if family == "llama4_text" else r.int("n_shared_experts", "moe_num_shared_experts", default=0)
    if experts:
        first_dense = r.int("first_k_dense_replace", "moe_layer_start_index", default=0)
        step = r.int("moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_interval",
                     default=1) or 1
        last = _moe_layer_end(r, layers)  # (ERNIE-4.5: no MoE layer past moe_layer_end_index)
        only_dense = set(r.list("mlp_only_layers", int))
        listed = set(r.list("moe_layers", int))  # Llama 4 writes its MoE layers out
        expert = mlp_mats * hidden * expert_ffn
        shared = shared_count * expert
        shared_ffn = r.int("shared_expert_intermediate_size", default=0)
        if shared_ffn:  # Qwen2-MoE: one shared expert and its sigmoid gate
            shared += mlp_mats * hidden * shared_ffn + hidden
        shared += mlp_mats * hidden * granite_shared  # Granite-4.0-H's shared MLP, beside every MoE block
        router = hidden * experts + (experts if r.get("topk_method") == "noaux_tc" else 0)
        if listed:
            moe_layers = sum(1 for i in listed if 0 <= i < layers)
        else:
            # layers i >= first_dense with (i + 1) a multiple of step, less the listed dense ones:
            # counted in closed form (a junk layer count must not loop for ever)
            moe_layers = max(0, last // step - min(first_dense, last) // step) - sum(
                1 for i in only_dense if first_dense <= i < last and (i + 1) % step == 0)
        dense_part = attn_sum + layers * norms + (layers - moe_layers) * dense_mlp
        total = dense_part + moe_layers * (router + shared + experts * expert)
        active = dense_part + moe_layers * (router + shared + top_k * expert)
        routed = moe_layers * experts * expert

        def is_moe(i: int) -> bool:
            return i in listed if listed else (first_dense <= i < last and (i + 1) % step == 0
                                               and i not in only_dense)
        shared_modules = ({f"mlp.shared_experts.{p}": hidden * shared_count * expert_ffn for p in GATED_MLP}
                          if shared_count and mlp_mats == 3 else {})
        if shared_ffn and mlp_mats == 3:
            shared_modules.update({f"mlp.shared_expert.{p}": hidden * shared_ffn for p in GATED_MLP})
    else:
        total = active = attn_sum + layers * (norms + dense_mlp)
        routed, shared_modules = 0, {}

        def is_moe(i: int) -> bool:
            return False
    tables = (1 if tied else 2) * vocab * hidden + hidden
    total, active = total + tables, active + tables

    fields: dict[str, Any] = dict(
        num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, num_params=total, num_attention_heads=heads,
        hidden_size=hidden, vocab_size=vocab, tied_embeddings=tied, num_experts=experts, experts_per_token=top_k)
    if experts:
        fields["active_params"] = active
    if mla:
        fields.update(kv_latent_dim=mla + rope, kv_rope_dim=rope)
        if nope + rope != head_dim:  # (head_dim is the value head's)
            fields["qk_head_dim"] = nope + rope
        fields.update(_index_bytes(r))
    written = r.int("intermediate_size", default=None)
    if written:
        fields["intermediate_size"] = written
    if experts and shared_count:
        fields["shared_experts"] = shared_count
    if experts and 0 < moe_layers < layers:  # (some layers dense: their experts' fixed times are not paid)
        fields["moe_layers"] = moe_layers
    context = _context_length(r)
    if context:
        fields["max_position_embeddings"] = context
    fields.update(_constant_layers(r, kinds, kv_heads, head_dim))
    modules = None   # every layer's projections a checkpoint may leave in 16 bits, by path
    if layers <= MAX_NAMED_LAYERS and linear == 0 and mamba == 0:
        dense_modules = {f"mlp.{p}": hidden * ffn for p in GATED_MLP} if mlp_mats == 3 else {}
        modules = {f"layers.{i}.{path}": size for i in range(layers) for path, size in
                   ({f"self_attn.{k}": v for k, v in attention_modules.items()} | (
                       shared_modules if is_moe(i) else dense_modules)).items()}
    fields.update(_weight_bytes(r, where, bool(experts), (modules, total - tables - routed) if modules else None))
    fields.update(_kv_cache_bytes(r))
    if "state_bytes" in fields and "kv_dtype_bytes" in fields:  # (an FP8 cache: the state is more tokens of it)
        fields["sliding_window"] = _state_tokens(fields["state_bytes"], kv_heads, head_dim, fields["kv_dtype_bytes"])
    name = r.get("_name_or_path")
    if isinstance(name, str) and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        fields["hf_id"] = name
    if family:
        fields["model_type"] = family
    return fields


def _refuse_unread_layout(r: _Reader, family: str) -> None:
    """Refuse a file whose layer layout lives in keys schedlab does not read (:data:`UNREAD_LAYOUT`:
    Jamba's ``attn_layer_period`` / ``expert_layer_period``, MiniMax-Text-01's ``attn_type_list``;
    transformers' ``configuration_jamba.py`` and vLLM's ``MiniMaxText01ForCausalLM`` derive the
    attention layers from them), or Mamba keys (``mamba_*``, ``ssm_cfg``) in a family whose Mamba
    layers are not modelled (Falcon-H1, Zamba, Plamo): read as every layer attention, the KV per
    token came out 8x to 11x too large and the parameters wrong, silently. Bamba's
    ``attn_layer_indices`` and the Mamba-2 keys of :data:`MAMBA2_FAMILIES` are read; so is
    ``mamba_ssm_dtype`` beside Gated DeltaNet layers (the state's dtype)."""
    for key in sorted(k for k in r.config if isinstance(k, str) and r.config[k] is not None):
        if key in UNREAD_LAYOUT and not (key == "attn_layer_indices" and family == "bamba"):
            what = UNREAD_LAYOUT[key]
        elif (key.startswith("mamba_") or key == "ssm_cfg") and family not in MAMBA2_FAMILIES and not (
                family in GATED_DELTANET and key in ("mamba_ssm_dtype", "mamba_ssm_cache_dtype")):
            what = "a Mamba layer's shape, in a family whose Mamba layers schedlab does not model"
        else:
            continue
        raise ConfigError(f"{r.where}: {key}: {what}; schedlab does not read this layout (as plain attention "
                          "layers it would count K and V in every layer). Give the model by its keys in "
                          "[models.<name>] instead of config: num_layers = the attention layers plus the "
                          "recurrent ones, sliding_window_layers = the recurrent ones and sliding_window = their "
                          "state per sequence in tokens of one attention layer's KV, num_params from the model card")


#: keys naming how many experts a model has (``num_experts``, ``n_routed_experts``,
#: ``moe_num_shared_experts`` ...)
EXPERT_COUNT_KEY = re.compile(r"(?:moe_)?n(?:um)?_(?:\w+_)?experts")


def _refuse_unread_experts(r: _Reader) -> None:
    """Refuse a file with no routed experts read but an expert count under another name (a
    family's ``attribute_map`` may rename them, as ERNIE-4.5's ``moe_num_experts`` was): read as
    dense, ERNIE-4.5-21B-A3B came out at 3.35B parameters instead of 21.8B."""
    for key in sorted(k for k in r.config if isinstance(k, str) and EXPERT_COUNT_KEY.fullmatch(k)):
        value = r.config[key]
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            raise ConfigError(f"{r.where}: {key}: {value} experts, but no routed experts are read (num_local_experts, "
                              "num_experts, n_routed_experts or moe_num_experts); schedlab would count a dense "
                              "model. Give the model by its keys in [models.<name>] instead of config (num_experts, "
                              "experts_per_token, num_params, active_params)")


def _moe_layer_end(r: _Reader, layers: int) -> int:
    """One past the last layer that may route to experts: ``moe_layer_end_index`` + 1 (ERNIE-4.5;
    -1, its default, is the last layer: ``Ernie4_5_MoeConfig``), else every layer."""
    end = r.config.get("moe_layer_end_index")
    if end is None or end == -1:
        return layers
    if isinstance(end, bool) or not isinstance(end, int) or end < 0:
        raise ConfigError(f"{r.where}: moe_layer_end_index: expected a layer index (-1: the last), got "
                          f"{value_text(end)}")
    return min(layers, end + 1)


def _mamba2_layer(hidden: int, heads: int, head_dim: int, groups: int, state: int, kernel: int, conv_bias: bool,
                  proj_bias: bool, ssm_bytes: int) -> dict:
    """One Mamba-2 mixer (transformers' ``Mamba2Mixer``, ``NemotronHMamba2Mixer``,
    ``GraniteMoeHybridMambaLayer``, ``BambaMixer``): ``params`` -- the input projection to
    x, z, B, C and dt, the causal convolution over x, B and C, ``A_log``, ``D``, ``dt_bias``, the
    gated norm and the output projection, not the block's own norm -- and ``state``, the bytes a
    sequence keeps in it, as vLLM sizes them (``mamba_utils.mamba2_state_shape``): ``kernel - 1``
    columns of the convolution in 16 bits and the SSM state ``heads x head_dim x state`` at
    ``ssm_bytes`` (vLLM's ``mamba_ssm_cache_dtype``: the model's dtype unless float32 is asked)."""
    inner = heads * head_dim
    conv_dim = inner + 2 * groups * state
    projection = inner + conv_dim + heads
    params = (hidden * projection + conv_dim * (kernel + conv_bias) + 3 * heads + inner + inner * hidden
              + (projection + hidden if proj_bias else 0))
    return {"params": params, "state": conv_dim * max(0, kernel - 1) * 2 + inner * state * ssm_bytes}


def _ssm_bytes(r: _Reader) -> int:
    """Bytes of one SSM-state element: 4 when the file asks for a float32 state
    (``mamba_ssm_cache_dtype`` / ``mamba_ssm_dtype``), else the model's 2."""
    return 4 if str(r.get("mamba_ssm_cache_dtype", r.get("mamba_ssm_dtype", ""))) == "float32" else 2


def _mamba2(r: _Reader, family: str, hidden: int) -> dict:
    """:func:`_mamba2_layer` of a Granite-4.0-H or Bamba Mamba layer, from the ``mamba_*`` keys
    with transformers' defaults (``GraniteMoeHybridConfig``, ``BambaConfig``: 128 heads, 1
    group, a state of 256, a kernel of 4, expand 2, ``mamba_d_head`` "auto" = expand x hidden /
    heads, a convolution bias and no projection bias)."""
    heads = r.int("mamba_n_heads", default=128)
    expand = r.int("mamba_expand", default=2)
    head_dim = r.config.get("mamba_d_head")
    head_dim = (expand * hidden // heads if heads else 0) if head_dim in (None, "auto") else r.int("mamba_d_head")
    if not heads or not head_dim or heads * head_dim != expand * hidden:
        raise ConfigError(f"{r.where}: mamba_n_heads x mamba_d_head ({heads} x {head_dim}) must be mamba_expand x "
                          f"hidden_size ({expand} x {hidden}), as transformers' {family} config requires")
    return _mamba2_layer(hidden, heads, head_dim, r.int("mamba_n_groups", default=1),
                         r.int("mamba_d_state", default=256), r.int("mamba_d_conv", default=4),
                         r.flag("mamba_conv_bias", True), r.flag("mamba_proj_bias", False), _ssm_bytes(r))


def _index_bytes(r: _Reader) -> dict:
    """``kv_index_bytes``: DeepSeek-V3.2's sparse attention (DSA; GLM-5 too) keeps, beside each
    token's latent, its key for the lightning indexer -- ``index_head_dim`` FP8 values and a 4-byte
    scale per 128 (vLLM's ``DeepseekV32IndexerCache``: 132 bytes a token and layer); and the
    ``index_topk`` keys each query attends to, the indexer's heads and their size."""
    dim = r.int("index_head_dim", default=None) if r.get("index_topk") is not None else None
    if not dim:
        return {}
    return {"kv_index_bytes": dim + 4 * -(-dim // 128), "sparse_attention_keys": r.int("index_topk"),
            "index_heads": r.int("index_n_heads", default=0), "index_head_dim": dim}


#: A hybrid pattern's letters (Nemotron-H's ``hybrid_override_pattern``): M a Mamba-2 layer, * an
#: attention layer, - an MLP, E a MoE layer -- each layer one of them, not attention and an MLP
HYBRID_LETTERS = frozenset("M*-E")


def _hybrid_pattern_fields(r: _Reader, family: str, where: str) -> dict:
    """:func:`model_fields` of a model whose layers are each one kind, as ``hybrid_override_pattern``
    spells them (Nemotron-H, Nemotron Nano 2 and 3): Mamba-2 layers (``mamba_num_heads`` x
    ``mamba_head_dim`` wide, ``n_groups`` B/C groups of ``ssm_state_size``, a causal convolution of
    ``conv_kernel``), attention layers, ungated MLPs (relu²) and MoE layers (routed and shared
    experts of two matrices, a router). Only attention layers keep K and V; a Mamba layer keeps a
    fixed state, counted as a constant layer (``sliding_window_layers``) holding the state's bytes
    as tokens of one attention layer's KV; MLP and MoE layers keep nothing, and ``num_layers`` is
    the attention and Mamba layers."""
    pattern = r.get("hybrid_override_pattern")
    layers = r.int("num_hidden_layers", default=len(pattern))
    if len(pattern) != layers or not set(pattern) <= HYBRID_LETTERS:
        raise ConfigError(f"{where}: hybrid_override_pattern: expected one of M, *, - or E per layer "
                          f"({layers} layers), got {value_text(pattern)}")
    count = {letter: pattern.count(letter) for letter in HYBRID_LETTERS}
    if not count["*"] + count["M"]:
        raise ConfigError(f"{where}: hybrid_override_pattern: no attention (*) or Mamba (M) layer")
    hidden = r.int("hidden_size", required=True)
    heads = r.int("num_attention_heads", required=True)
    vocab = r.int("vocab_size", required=True)
    if not (hidden and heads and vocab):
        raise ConfigError(f"{where}: hidden_size, num_attention_heads and vocab_size must be > 0")
    kv_heads = _kv_heads(r, family, heads)
    head_dim = r.int("head_dim", "attention_head_dim", default=None) or hidden // heads
    tied = r.flag("tie_word_embeddings", False)
    m_heads = r.int("mamba_num_heads", required=True)
    m_dim = r.int("mamba_head_dim", default=None) or r.int("expand", default=2) * hidden // max(1, m_heads)
    mixer = _mamba2_layer(hidden, m_heads, m_dim, r.int("n_groups", default=1), r.int("ssm_state_size", required=True),
                          r.int("conv_kernel", default=4), r.flag("use_conv_bias", True), False, _ssm_bytes(r))
    mamba = mixer["params"] + hidden  # (and the block's norm)
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + hidden
    ffn = r.int("intermediate_size", default=None) or 4 * hidden
    mlp = 2 * hidden * ffn + hidden
    experts = r.int("n_routed_experts", "num_experts", default=0)
    top_k = r.int("num_experts_per_tok", default=0) if experts else 0
    if count["E"] and not (experts and top_k):
        raise ConfigError(f"{where}: hybrid_override_pattern has MoE layers (E) but no n_routed_experts and "
                          "num_experts_per_tok")
    expert = 2 * hidden * (r.int("moe_intermediate_size", default=None) or ffn)
    shared_count = r.int("n_shared_experts", default=0)
    shared = shared_count * 2 * hidden * (r.int("moe_shared_expert_intermediate_size", default=None) or ffn)
    router = hidden * experts + experts + hidden
    common = count["M"] * mamba + count["*"] * attn + count["-"] * mlp + count["E"] * (router + shared)
    tables = (1 if tied else 2) * vocab * hidden + hidden
    total = common + count["E"] * experts * expert + tables
    fields: dict[str, Any] = dict(
        num_layers=count["*"] + count["M"], num_kv_heads=kv_heads, head_dim=head_dim, num_params=total,
        num_attention_heads=heads, hidden_size=hidden, vocab_size=vocab, tied_embeddings=tied,
        num_experts=experts if count["E"] else 0, experts_per_token=top_k if count["E"] else 0,
        intermediate_size=ffn, model_type=family)
    if count["E"]:
        fields["active_params"] = common + count["E"] * top_k * expert + tables
        if shared_count:
            fields["shared_experts"] = shared_count
        if count["E"] < fields["num_layers"]:  # (the experts' fixed times: in the MoE layers only)
            fields["moe_layers"] = count["E"]
    if count["M"]:
        fields["sliding_window"] = _state_tokens(mixer["state"], kv_heads, head_dim)
        fields["sliding_window_layers"] = count["M"]
        fields["state_bytes"] = max(1, mixer["state"])
    context = _context_length(r)
    if context:
        fields["max_position_embeddings"] = context
    fields.update(_weight_bytes(r, where, bool(count["E"])))
    fields.update(_kv_cache_bytes(r))
    if "state_bytes" in fields and "kv_dtype_bytes" in fields:  # (an FP8 cache: the state is more tokens of it)
        fields["sliding_window"] = _state_tokens(fields["state_bytes"], kv_heads, head_dim, fields["kv_dtype_bytes"])
    name = r.get("_name_or_path")
    if isinstance(name, str) and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        fields["hf_id"] = name
    return fields


def _kv_heads(r: _Reader, family: str, heads: int) -> int:
    """KV heads as vLLM counts them (``ModelConfig.get_total_num_kv_heads``): one for multi-query
    attention (``multi_query``: GPT-BigCode / StarCoder, Falcon-7B's old architecture), else
    ``n_head_kv`` (older Falcon), ``num_kv_heads``, ``num_key_value_heads`` or
    ``multi_query_group_num`` (ChatGLM / GLM-4), else every head."""
    new_falcon = family in FALCON and r.flag("new_decoder_architecture")
    if not new_falcon and r.flag("multi_query"):
        return 1
    keys = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    kv_heads = r.int(*keys, default=heads)
    if kv_heads == 0:  # (read as every head, it gave a quarter of the sequences a GQA model holds)
        key = next(k for k in keys if r.get(k) is not None)
        raise ConfigError(f"{r.where}: {key}: a model has at least one KV head, got 0")
    return kv_heads


def _linear_attention_params(r: _Reader, hidden: int) -> int:
    """Parameters of one Gated DeltaNet layer (Qwen3-Next, Qwen3.5): the Q/K/V/Z projection,
    the per-head beta and decay projections, the causal convolution over Q, K and V, the decay's
    ``A_log`` and ``dt_bias``, the gated norm and the output projection."""
    key = r.int("linear_num_key_heads", default=16) * r.int("linear_key_head_dim", default=128)
    v_heads, v_dim = r.int("linear_num_value_heads", default=32), r.int("linear_value_head_dim", default=128)
    value = v_heads * v_dim
    conv = (2 * key + value) * r.int("linear_conv_kernel_dim", default=4)
    return hidden * (2 * key + 2 * value) + hidden * 2 * v_heads + conv + 2 * v_heads + v_dim + value * hidden


def _layer_kinds(r: _Reader, family: str, layers: int) -> dict:
    """How many layers keep less than every token's K and V, by kind: ``sliding`` (a window),
    ``chunked`` (Llama 4's local chunks), ``cross`` (Mllama's attention to the image),
    ``linear`` (Gated DeltaNet's recurrent state: :data:`GATED_DELTANET`) and ``mamba`` (a
    Mamba-2 state: :data:`MAMBA2_FAMILIES`). From ``layer_types`` when the file lists them (Bamba:
    its ``attn_layer_indices``), else the family's pattern (Gemma 2 every other layer, Gemma 3 five
    of six, Cohere2 and EXAONE 4 three of four by ``sliding_window_pattern``, Llama 4 three of
    four, Qwen3-Next three of four), else every layer when a window is set and not switched off
    (``use_sliding_window = false``). A ``sliding_window_pattern`` of another family is refused:
    its rule is not known here."""
    window_on = bool(r.int("sliding_window", default=None)) and r.flag("use_sliding_window", True)
    types = r.list("layer_types", str)
    if not types and family == "bamba":  # BambaConfig.layers_block_type: attention in attn_layer_indices only
        attention = set(r.list("attn_layer_indices", int))
        types = ["full_attention" if i in attention else "mamba" for i in range(min(layers, 1 << 16))]
    if types and len(types) != layers:
        raise ConfigError(f"{r.where}: layer_types: {len(types)} entries for {layers} layers (num_hidden_layers); "
                          "it names each layer's kind")
    if types:
        _check_layer_types(r, types)
        recurrent = [t for t in types if "linear" in t or "mamba" in t]
        if recurrent and family not in GATED_DELTANET | MAMBA2_FAMILIES:
            raise ConfigError(f"{r.where}: layer_types: {recurrent[0]!r} layers in a {family or 'model'} model: "
                              "schedlab reads recurrent layers only for Qwen3-Next / Qwen3.5 (Gated DeltaNet, the "
                              "linear_* keys) and Granite-4.0-H / Bamba (Mamba-2, the mamba_* keys); give the model "
                              "by its keys in [models.<name>] instead of config")
        if len(recurrent) == layers:
            raise ConfigError(f"{r.where}: layer_types: every layer is {recurrent[0]!r}: a model without attention "
                              "layers keeps no KV, which schedlab does not model")
        kinds = {"sliding": sum(1 for t in types if "sliding" in t) if window_on else 0,
                 "chunked": sum(1 for t in types if "chunked" in t),
                 ("mamba" if family in MAMBA2_FAMILIES else "linear"): len(recurrent)}
    elif family in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        interval = r.int("full_attention_interval", default=4) or 4
        kinds = {"linear": layers - layers // interval}
    elif family == "llama4_text":
        rope = r.list("no_rope_layers", int)  # 1: a RoPE layer, chunked; 0: a NoPE layer, global
        interval = r.int("no_rope_layer_interval", default=4) or 4
        kinds = {"chunked": sum(1 for x in rope[:layers] if x) if rope else layers - layers // interval}
    elif family == "mllama_text_model":
        kinds = {"cross": sum(1 for i in set(r.list("cross_attention_layers", int)) if 0 <= i < layers)}
    elif not window_on:
        kinds = {}
    elif family == "gemma2":
        kinds = {"sliding": layers // 2}
    elif family in ("gemma3", "gemma3_text"):
        pattern = r.int("sliding_window_pattern", default=6) or 6
        kinds = {"sliding": layers - layers // pattern}
    elif family in ("cohere2", "exaone4"):
        # Cohere2Config / Exaone4Config (transformers 5.20): layer i slides unless (i + 1) is a multiple
        # of the pattern (Cohere2's default 4; EXAONE 4's "LLLG" text form is not read here)
        if isinstance(r.get("sliding_window_pattern"), str):
            raise ConfigError(f"{r.where}: sliding_window_pattern: {r.get('sliding_window_pattern')!r} as text is "
                              "not read; give layer_types (sliding_attention / full_attention per layer)")
        pattern = r.int("sliding_window_pattern", default=4)
        if not pattern:
            raise ConfigError(f"{r.where}: sliding_window_pattern: 0 spells no layers (every pattern-th layer is "
                              "full attention); give layer_types")
        kinds = {"sliding": layers - layers // pattern}
    elif r.get("sliding_window_pattern") is not None:
        raise ConfigError(f"{r.where}: sliding_window_pattern: how a {family or 'model'} model's layers alternate "
                          "between sliding-window and full attention is not known to schedlab (it reads the "
                          "pattern of gemma3, cohere2 and exaone4); give layer_types (sliding_attention / "
                          "full_attention per layer)")
    else:
        kinds = {"sliding": layers}
    if not r.int("attention_chunk_size", default=None):
        kinds.pop("chunked", None)
    return {kind: n for kind, n in kinds.items() if n}


#: the words of a ``layer_types`` entry :func:`_layer_kinds` reads (``full_attention``,
#: ``sliding_attention``, ``chunked_attention``, ``linear_attention``, ``mamba``, ...)
LAYER_TYPE_WORDS = ("sliding", "chunked", "linear", "mamba", "attention", "full")


def _check_layer_types(r: _Reader, types: list) -> None:
    """Refuse a ``layer_types`` entry that names none of :data:`LAYER_TYPE_WORDS` (LFM2's short
    ``conv`` layers, say): read as full attention it would give those layers K and V per token
    and count parameters they do not have."""
    unknown = sorted({t for t in types if not any(word in t for word in LAYER_TYPE_WORDS)})
    if unknown:
        layers = [i for i, t in enumerate(types) if t == unknown[0]]
        shown = ", ".join(map(str, layers[:6])) + (", ..." if len(layers) > 6 else "")
        raise ConfigError(f"{r.where}: layer_types: {', '.join(map(repr, unknown))} (layers {shown}) is a kind of "
                          "layer schedlab does not model (it reads full_attention, sliding_attention, "
                          "chunked_attention, linear_attention and mamba); give the model by its keys in "
                          "[models.<name>] instead of config")


def _constant_layers(r: _Reader, kinds: dict, kv_heads: int, head_dim: int) -> dict:
    """``sliding_window_layers``: the layers of :func:`_layer_kinds`, and ``sliding_window``: the
    most tokens one of them keeps a sequence -- its window or chunk, the image's tokens (Mllama:
    tiles x (patches + 1)), or a linear or Mamba layer's state (convolution and recurrent state,
    the latter in float32 when ``mamba_ssm_dtype`` says so) over one full-attention layer's KV per
    token."""
    if not kinds:
        return {}
    spans = []
    if "sliding" in kinds:
        # Cohere2's window layers see sliding_window + 1 tokens (vLLM commandr.py passes it so)
        spans.append(r.int("sliding_window") + (str(r.get("model_type", "")).lower() == "cohere2"))
    if "chunked" in kinds:
        spans.append(r.int("attention_chunk_size"))
    if "cross" in kinds:
        vision = r.get("vision_config", {})
        vision = _Reader(vision if isinstance(vision, dict) else {}, r.where + ": vision_config")
        patches = (vision.int("image_size", default=448) // (vision.int("patch_size", default=14) or 14)) ** 2
        spans.append(vision.int("max_num_tiles", default=4) * (patches + 1))
    states = []
    if "linear" in kinds:
        key = r.int("linear_num_key_heads", default=16) * r.int("linear_key_head_dim", default=128)
        v_heads, v_dim = r.int("linear_num_value_heads", default=32), r.int("linear_value_head_dim", default=128)
        conv = (2 * key + v_heads * v_dim) * max(0, r.int("linear_conv_kernel_dim", default=4) - 1) * 2
        state = v_heads * r.int("linear_key_head_dim", default=128) * v_dim
        state *= 4 if str(r.get("mamba_ssm_dtype", "")) == "float32" else 2
        states.append(conv + state)
    if "mamba" in kinds:
        hidden = r.int("hidden_size", "n_embd", "d_model", required=True)
        states.append(_mamba2(r, str(r.get("model_type", "")).lower(), hidden)["state"])
    spans += [_state_tokens(state, kv_heads, head_dim) for state in states]
    fields = {"sliding_window": max(1, *spans), "sliding_window_layers": sum(kinds.values())}
    if len(states) == len(spans) == 1:  # (only recurrent layers: their state is kept in bytes as well)
        fields["state_bytes"] = max(1, states[0])
    return fields


def _state_tokens(state: int, kv_heads: int, head_dim: int, kv_bytes: int = 2) -> int:
    """A recurrent layer's ``state`` bytes as tokens of one full-attention layer's KV (at
    tensor_parallel 1, ``kv_bytes`` an element): how ``sliding_window`` holds it. The state
    itself stays in ``state_bytes`` (:meth:`~schedlab.capacity.ModelSpec.window_tokens` re-derives
    the tokens per rank and KV dtype)."""
    return max(1, -(-state // max(1, 2 * kv_heads * head_dim * kv_bytes)))


#: keys holding a model's context length, as vLLM reads them (the smallest one given)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_target_positions",
                "max_sequence_length", "max_seq_length", "seq_len")


#: RoPE types whose ``factor`` vLLM does not apply to the context (the file's length is already
#: the scaled one, or per-frequency scaling keeps it)
ROPE_KEEPS_LENGTH = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})


def _context_length(r: _Reader) -> int | None:
    """vLLM's default ``max_model_len``: the smallest of :data:`CONTEXT_KEYS` the file sets, or
    ``model_max_length`` when set (Cohere) (``derive_max_model_len_and_key``); times a RoPE
    scaling ``factor`` (``linear``, ``dynamic``: not the types of :data:`ROPE_KEEPS_LENGTH`,
    nor Gemma 3's); for LongRoPE ``original_max_position_embeddings``, which vLLM defaults to
    (``_get_and_verify_max_len``, vLLM 0.33)."""
    override = r.int("model_max_length", default=None)
    given = [n for n in (r.int(key) for key in CONTEXT_KEYS) if n]
    context = override or (min(given) if given else None)
    ropes = _rope_parameters(r)
    if context and ropes and "gemma3" not in str(r.get("model_type", "")):
        factor = 1.0
        for rope in ropes:
            if rope["type"] not in ROPE_KEEPS_LENGTH:
                factor = rope.get("factor", factor)
        context = int(context * factor)
    if any(rope["type"] in ("longrope", "su") for rope in ropes):
        context = r.int("original_max_position_embeddings", default=None) or context
    return context


def _rope_parameters(r: _Reader) -> list[dict]:
    """The file's RoPE scaling (``rope_parameters``, or the older ``rope_scaling``), one dict per
    layer type when nested, each with its ``type`` (``rope_type``, or the older ``type``) and a
    ``factor`` when it has one."""
    for key in ("rope_parameters", "rope_scaling"):
        value = r.config.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{r.where}: {key}: expected an object ({{...}}), got {value_text(value)}")
        nested = value and all(isinstance(v, dict) for v in value.values())
        found = []
        for where, table in ([(f"{key}.{k}", v) for k, v in value.items()] if nested else [(key, value)]):
            kind = table.get("rope_type", table.get("type", "default"))
            if not isinstance(kind, str):
                raise ConfigError(f"{r.where}: {where}: rope_type: expected text, got {value_text(kind)}")
            rope = {"type": kind}
            factor = table.get("factor")
            if factor is not None:
                if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < 1e6:
                    raise ConfigError(f"{r.where}: {where}: factor: expected a number > 0, got {value_text(factor)}")
                rope["factor"] = float(factor)
            found.append(rope)
        return found
    return []


def _weight_bytes(r: _Reader, where: str, moe: bool, named: tuple | None = None) -> dict:
    """The checkpoint's bytes per weight when they are not the 16-bit default: FP8 (1 byte), MXFP4
    experts (4 bits + an 8-bit scale per 32: 0.53125), AWQ / GPTQ at their bits plus a 16-bit
    scale and their zero point per group, compressed-tensors and ModelOpt schemes (NVFP4: 4 bits
    + an FP8 scale per 16). The layers' projections a checkpoint names as unquantised
    (``modules_to_not_convert`` / ``ignore`` / ``exclude_modules``; ``named``: the model's
    projections by path, and its weights beside the routed experts and the tables) count at 2
    bytes, the weights beside the routed experts then at their mean (:func:`_kept_params`); a MoE
    checkpoint naming its attention in a way not matched has only its experts at those bytes.
    FP8 weights that meet FP8 activations (W8A8) say so, ``fp8_activations``: their GEMMs run at
    FP8 rate."""
    q = r.get("quantization_config")
    if not isinstance(q, dict):
        dtype = str(r.get("torch_dtype", r.get("dtype", "bfloat16")))
        if dtype not in DTYPE_BYTES:
            raise ConfigError(f"{where}: torch_dtype: {dtype!r} is not a 16- or 32-bit float; set weight_dtype_bytes")
        return {}
    method = str(q.get("quant_method", "")).lower()
    if method == "mxfp4":
        return {"expert_dtype_bytes": 0.53125}
    w8a8 = False  # FP8 weights times FP8 activations (vLLM quantises the activations on the fly)
    if method in ("fp8", "fbgemm_fp8"):
        per, w8a8 = 1.0, True
    elif method in ("awq", "gptq"):
        bits = q.get("bits", q.get("w_bit", 4))
        group = q.get("group_size", q.get("q_group_size", 128))
        if isinstance(bits, bool) or not isinstance(bits, int) or bits <= 0:
            raise ConfigError(f"{where}: quantization_config.bits: expected a whole number, got {bits!r}")
        if isinstance(group, bool) or not isinstance(group, int):
            raise ConfigError(f"{where}: quantization_config.group_size: expected a whole number (-1: one group per "
                              f"row), got {group!r}")
        # GPTQ always stores a packed zero point per group; AWQ when zero_point is set
        zero = bits / 8 if method == "gptq" or q.get("zero_point") is True else 0.0
        per = bits / 8 + ((2.0 + zero) / group if group > 0 else 0.0)
    elif method == "compressed-tensors":
        per = _compressed_tensors_bytes(q, where)
        w8a8 = per == 1.0 and _fp8_activations(q)
    elif method in ("modelopt", "modelopt_fp4"):
        algo = str(q.get("quant_algo", "")).upper()
        if algo not in MODELOPT:
            raise ConfigError(f"{where}: quantization_config.quant_algo: {algo!r} is not read ({', '.join(MODELOPT)}); "
                              "set weight_dtype_bytes beside config")
        per, w8a8 = MODELOPT[algo]
    else:
        raise ConfigError(f"{where}: quantization_config: quant_method {method!r} is not read; set "
                          "weight_dtype_bytes (and expert_dtype_bytes) beside config")
    kept = [str(m) for key in ("modules_to_not_convert", "ignore", "ignored_layers", "exclude_modules")
            for m in (q.get(key) if isinstance(q.get(key), list) else [])]
    fp8 = {"fp8_activations": True} if w8a8 else {}
    # the embedding table and the LM head stay in the checkpoint's 16 bits (none of these methods
    # quantises them by default); so do the layers' projections the checkpoint names: the weights
    # beside the routed experts then hold their mean bytes
    kept_params = _kept_params(kept, *named) if named and per < 2.0 else 0
    if kept_params:
        weights = named[1]
        mean = (kept_params * 2.0 + (weights - kept_params) * per) / weights
        if w8a8 and per == 1.0:  # the FP8 share of the dense GEMMs runs at the FP8 rate, the kept ones in 16 bits
            fp8 = {**fp8, "fp8_weight_share": (weights - kept_params) / weights}
        return {"weight_dtype_bytes": mean, "table_dtype_bytes": 2.0,
                **({"expert_dtype_bytes": per} if moe else {}), **fp8}
    if moe and any(_attention_module(m) for m in kept):   # (modules named otherwise: all but the experts kept)
        return {"expert_dtype_bytes": per, **fp8}
    return {"weight_dtype_bytes": per, "table_dtype_bytes": 2.0, **fp8}


def _kv_cache_bytes(r: _Reader) -> dict:
    """``kv_dtype_bytes`` 1 when a ModelOpt checkpoint asks for an FP8 KV cache: vLLM's
    ``--kv-cache-dtype auto`` then stores the cache in FP8 (``resolve_kv_cache_dtype_string`` and
    ``get_kv_cache_quant_algo_string``, ``vllm/utils/torch_utils.py``, vLLM issue #34752): a
    ``kv_cache_quant_algo`` of ``FP8``, or a ``kv_cache_scheme`` of static 8-bit floats, in the
    config or its ``quantization`` table (``hf_quant_config.json``). Other quantisation methods'
    cache schemes only bring scales: their cache follows ``auto`` to the model's dtype. An explicit
    ``kv_cache_dtype`` overrides it, as ``--kv-cache-dtype bfloat16`` does."""
    q = r.get("quantization_config")
    if not isinstance(q, dict) or not str(q.get("quant_method", "")).lower().startswith("modelopt"):
        return {}
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else q
    algo = (inner.get("kv_cache_scheme") or q.get("kv_cache_scheme")
            or inner.get("kv_cache_quant_algo") or q.get("kv_cache_quant_algo"))
    if isinstance(algo, dict):
        fp8 = algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float"
    else:
        fp8 = isinstance(algo, str) and algo.lower() == "fp8"
    return {"kv_dtype_bytes": 1} if fp8 else {}


#: A gated MLP's projections (Llama's and DeepSeek's names, which most models keep).
GATED_MLP = ("gate_proj", "up_proj", "down_proj")
#: Most layers whose projections are matched by name (a larger count is no checkpoint).
MAX_NAMED_LAYERS = 1024


def _kept_params(kept: list[str], modules: dict, weights: float) -> int:
    """Parameters of the layers' projections a quantised checkpoint leaves in 16 bits -- its
    ``modules_to_not_convert`` / ``ignore`` / ``exclude_modules`` entries matched against
    ``modules`` (``layers.<i>.self_attn.q_proj`` ... -> parameters): a module path, or a block of
    them (``model.layers.3.self_attn``; Llama-3.1-405B-FP8 keeps every attention and its first
    and last MLPs; DeepSeek-V3.1-NVFP4 its attention's input projections), a ``*`` glob, or a
    compressed-tensors ``re:`` pattern (Kimi-K2: attention, shared experts and dense MLPs)."""
    chosen: set[str] = set()
    for entry in kept:
        if entry.startswith("re:"):
            try:
                pattern = re.compile(entry[3:])
            except (re.error, RecursionError):
                continue
            chosen.update(m for m in modules if pattern.match(f"model.{m}"))
            continue
        at = entry.find("layers.")
        if at < 0:
            continue
        path = entry[at:]
        if path.endswith("*"):
            chosen.update(m for m in modules if fnmatch.fnmatchcase(m, path))
        elif path in modules:
            chosen.add(path)
        else:
            chosen.update(m for m in modules if m.startswith(path + "."))
    return min(int(sum(modules[m] for m in chosen)), int(weights))


#: ModelOpt's quant_algo values vLLM reads: (bytes per weight, FP8 activations): FP8 per tensor or
#: per channel (W8A8), FP8 in 128 x 128 blocks weight-only, MXFP8 (an 8-bit scale per 32), NVFP4
#: (4 bits and an FP8 scale per 16)
MODELOPT = {"FP8": (1.0, True), "FP8_PER_CHANNEL_PER_TOKEN": (1.0, True), "FP8_PB_WO": (1.0, False),
            "MXFP8": (1.0 + 1 / 32, True), "NVFP4": (0.5 + 1 / 16, False)}


def _attention_module(name: str) -> bool:
    """Whether a module a checkpoint leaves unquantised is attention's own -- a projection, or the
    whole attention block (``model.layers.0.self_attn``, ``re:.*self_attn.*``) -- rather than a
    norm or a sparse-attention indexer inside it (GLM-5 keeps those, and quantises attention)."""
    name = name.lower()
    return ("attn" in name or "attention" in name) and not re.search(r"norm|indexer|bias", name)


def with_quant_file(config: dict, folder: Path) -> dict:
    """``config`` with the quantisation a ModelOpt checkpoint keeps beside it, in
    ``hf_quant_config.json`` (``{"quantization": {"quant_algo": ..., "exclude_modules": [...]}}``,
    which vLLM reads), when ``config`` has no ``quantization_config`` of its own."""
    path = folder / "hf_quant_config.json"
    if config.get("quantization_config") is not None or not path.is_file():
        return config
    quant = read_config(path, "hf_quant_config.json").get("quantization")
    if not isinstance(quant, dict):
        raise ConfigError(f"{path}: expected a 'quantization' table (ModelOpt's hf_quant_config.json)")
    return {**config, "quantization_config": {"quant_method": "modelopt", **quant}}


def _fp8_activations(q: dict) -> bool:
    """Whether every compressed-tensors group quantises its input activations to 8-bit floats
    (W8A8-FP8; a group without ``input_activations`` is weight-only)."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return "fp8" in json.dumps(q).lower()  # (an FP8 scheme named without its groups)
    for group in groups.values():
        a = group.get("input_activations") if isinstance(group, dict) else None
        if not (isinstance(a, dict) and a.get("num_bits") == 8 and a.get("type") == "float"):
            return False
    return True


def _compressed_tensors_bytes(q: dict, where: str) -> float:
    """Bytes per weight of a compressed-tensors checkpoint (llm-compressor): its weights'
    ``num_bits``, plus per group a scale (16-bit; FP8 for 4-bit floats, NVFP4) and, when
    asymmetric, a packed zero point. Scales per channel, tensor or 128 x 128 block are left out."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        if "fp8" in json.dumps(q).lower():
            return 1.0
        raise ConfigError(f"{where}: quantization_config.config_groups: missing; set weight_dtype_bytes beside config")
    sizes = set()
    for name, group in groups.items():
        w = group.get("weights") if isinstance(group, dict) else None
        key = f"quantization_config.config_groups.{name}.weights"
        if not isinstance(w, dict):
            raise ConfigError(f"{where}: {key}: expected a table with num_bits, got {value_text(w)}")
        bits, size = w.get("num_bits"), w.get("group_size")
        if isinstance(bits, bool) or not isinstance(bits, int) or bits <= 0:
            raise ConfigError(f"{where}: {key}.num_bits: expected a whole number > 0, got {value_text(bits)}")
        per = bits / 8
        if w.get("strategy") in ("group", "tensor_group") and isinstance(size, int) and size > 0:
            scale = 1.0 if w.get("type") == "float" and bits == 4 else 2.0
            per += (scale + (0.0 if w.get("symmetric", True) else bits / 8)) / size
        sizes.add(per)
    if len(sizes) > 1:
        raise ConfigError(f"{where}: quantization_config.config_groups: groups of {sorted(sizes)} bytes a weight are "
                          "not read; set weight_dtype_bytes (and expert_dtype_bytes) beside config")
    return sizes.pop()


def spec_table(table: dict, base_dir: str | os.PathLike, where: str) -> dict:
    """A ``[models.<name>]`` table with its ``config`` file read in: the file's fields, then the
    table's own keys over them."""
    if "config" not in table:
        return table
    path = table["config"]
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{where}: config: expected the path of a config.json, got {path!r}")
    resolved = Path(base_dir, os.path.expanduser(path))
    fields = model_fields(with_quant_file(read_config(resolved, where), resolved.parent), f"{where}: {resolved}")
    own = {k: v for k, v in table.items() if k != "config"}
    return {**fields, **own}


def is_config_path(value: str) -> bool:
    """Whether a ``--model`` value names a config.json file rather than a preset."""
    return value.endswith(".json") or os.path.isdir(value) and os.path.exists(os.path.join(value, "config.json"))


def spec_from_path(value: str, where: str):
    """A ModelSpec from a config.json (or a folder holding one), named after its folder -- or after
    the file, when it has a name of its own (``falcon-7b.json``)."""
    from .capacity import ModelSpec
    from .configs import from_table

    path = Path(value)
    if path.is_dir():
        path = path / "config.json"
    config = read_config(path, where)  # (first: a path that cannot be read, a symlink loop, is named)
    name = (Path(os.path.abspath(path)).parent.name if path.name.lower() == "config.json" else path.stem).lower() \
        or "model"
    fields = model_fields(with_quant_file(config, path.parent), f"{where}: {path}")
    return from_table(ModelSpec, {"name": name, **fields}, where=f"{where}: {path}")


__all__ = ["model_fields", "read_config", "spec_table", "is_config_path", "spec_from_path"]
