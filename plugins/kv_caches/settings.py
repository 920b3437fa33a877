"""Settings of the ``paged`` and ``radix`` KV caches and the factories that size them.

Size the pool either directly (``num_blocks``) or as vLLM does from a model and a GPU
(``model``, ``gpu``, ``gpu_memory_utilization``, ``tensor_parallel``, ``activation_reserve_gib``,
``kv_cache_dtype``, and a speculative drafter's ``draft_model`` beside it; see
:func:`schedlab.capacity.size_kv_cache`), or both: a given
``num_blocks`` overrides the derived count, as vLLM's ``--num-gpu-blocks-override`` does, and
the model and GPU still give the bytes of a block and the host link; both caches share
these settings (:class:`PoolConfig`). For ``paged``, swap space is ``swap_space_gib`` of host
memory (vLLM's ``swap_space``, default 0 here) or ``swap_blocks``; its transfers run at the GPU
preset's host-link bandwidth unless ``host_link_gbps`` is set. Both prefix caches can have a
host-memory tier (:mod:`.host_tier`) of ``host_memory_gib`` or ``host_blocks``; its reloads run
over the same link.
"""

from __future__ import annotations

import attrs

from schedlab.capacity import (DEFAULT_ACTIVATION_RESERVE_GIB, GIB, kv_cache_dtype_field, size_kv_cache,
                               with_kv_cache_dtype)
from schedlab.configs import (
    MAX_BLOCK_SIZE, MAX_MEMORY_GIB, MAX_TENSOR_PARALLEL, FieldError, bool_field, float_field, int_field, str_field,
)
from schedlab.parallelism import SINGLE, Parallelism

from .host_tier import WRITE_POLICIES, HostTier
from .paged import PagedKVCache


@attrs.frozen
class PoolConfig:
    """How many blocks of how many tokens: given, or derived from a model and a GPU."""

    block_size: int = int_field(16, min=1, max=MAX_BLOCK_SIZE, help="tokens per KV block (vLLM 16, TensorRT-LLM 32)")
    num_blocks: int | None = int_field(None, min=1, optional=True,
                                       help="KV blocks on the accelerator (default: from model and gpu, else 16384); "
                                            "with model and gpu it overrides their count (vLLM "
                                            "--num-gpu-blocks-override), which still give the block's bytes")
    model: str | None = str_field(None, optional=True, help="model preset to size the pool from, e.g. llama-3-8b")
    gpu: str | None = str_field(None, optional=True, help="GPU preset to size the pool from, e.g. a100-80gb")
    gpu_memory_utilization: float = float_field(0.9, min=0.0, max=1.0, min_exclusive=True,
                                                help="share of GPU memory the engine may use (vLLM default 0.9)")
    tensor_parallel: int = int_field(1, min=1, max=MAX_TENSOR_PARALLEL,
                                     help="tensor-parallel ranks (divide weights and KV heads)")
    activation_reserve_gib: float = float_field(DEFAULT_ACTIVATION_RESERVE_GIB, min=0.0, max=MAX_MEMORY_GIB,
                                                help="memory kept back for activations, GiB")
    kv_cache_dtype: str = kv_cache_dtype_field()
    bytes_per_block: int | None = int_field(None, min=0, optional=True,
                                            help="bytes of one block (default: from the model)")
    host_link_gbps: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                               help="host link bandwidth for swaps and host-tier reloads, GB/s "
                                                    "(default: from the GPU, else 25)")
    host_memory_gib: float = float_field(0.0, min=0.0, max=MAX_MEMORY_GIB,
                                         help="paged: host-memory KV tier under the prefix cache, GiB (2**30 "
                                              "bytes) summed over the instance's tensor- and pipeline-parallel "
                                              "ranks, each holding its share (vLLM --kv-offloading-size); 0 = none. "
                                              "radix: use host_memory_gb")
    host_blocks: int | None = int_field(None, min=0, optional=True, help="host-memory KV tier in blocks per rank "
                                                                         "(instead of a size in bytes)")
    write_policy: str = str_field("write_through", choices=WRITE_POLICIES,
                                  help="when blocks are copied to the host tier: write_through, every full block "
                                       "as it is computed (vLLM's OffloadingConnector, SGLang's default "
                                       "--hicache-write-policy), or write_back, when the GPU evicts it")
    host_link_latency_us: float = float_field(10.0, min=0.0, help="fixed time of one host-tier reload, us "
                                                                  "(copy launch and synchronisation)")
    draft_model: str | None = str_field(
        None, optional=True, help="model preset of a speculative drafter on the same GPUs (a draft model or EAGLE "
                                  "head): its weights and KV layers come out of the pool, as in vLLM (default: "
                                  "[speculative] draft's model, when the pool is sized from model and gpu)")
    draft_shares_tables: bool = bool_field(
        False, help="the drafter uses the target's embedding and LM head, not loaded twice (vLLM's EAGLE heads; "
                    "default: true with [speculative] method = 'eagle')")

    def __attrs_post_init__(self):
        if (self.model is None) != (self.gpu is None):
            raise FieldError("model" if self.model is None else "gpu", "set both model and gpu to size the cache from them")
        if self.draft_model is not None and self.model is None:
            raise FieldError("draft_model", "sizes the pool from model and gpu: set them too")
        if self.host_memory_gib and self.host_blocks is not None:
            raise FieldError("host_blocks", "give host_memory_gib or host_blocks, not both")
        if self.kv_cache_dtype != "auto" and self.model is None:
            raise FieldError("kv_cache_dtype", "sizes the pool from model and gpu: set them too (or give "
                                               "bytes_per_block, the block's bytes in that dtype)")
        if self.host_memory_gib and not self.bytes_per_block and self.model is None:
            raise FieldError("host_memory_gib", "needs bytes_per_block, or model and gpu to derive it")

    @property
    def has_host_tier(self) -> bool:
        return bool(self.host_memory_gib or self.host_blocks)


#: What SGLang 0.5.23 gives hybrid SWA memory (``model_config.is_hybrid_swa_model``: an allow-list
#: of architectures; Gemma 2 and 3 have it switched off, ``model_overrides/gemma2_gemma3.py``), as a
#: preset's name or Hugging Face id shows it: gpt-oss (``GptOssForCausalLM``) and Llama 4
#: (``Llama4ForConditionalGeneration``).
SGLANG_HYBRID_SWA = ("gpt-oss", "llama-4")


#: ... and their config.json ``model_type`` (the text model's: a Llama 4 file's ``text_config`` says
#: ``llama4_text``), which SGLang decides by (its ``GptOssForCausalLM``, ``Llama4ForConditionalGeneration``)
SGLANG_HYBRID_SWA_TYPES = ("gpt_oss", "llama4", "llama4_text")


def sglang_swa_ratio(config, model) -> float | None:
    """SGLang's ``swa_full_tokens_ratio`` for ``model`` under ``config`` (a :class:`RadixConfig`),
    or None when every layer keeps every token -- switched off, or a model SGLang gives no hybrid
    SWA memory: by its architecture (``model_type``, read from a config.json), else by its preset
    name or Hugging Face id (:data:`SGLANG_HYBRID_SWA`)."""
    if config.disable_hybrid_swa_memory:
        return None
    if model.model_type is not None:
        hybrid = model.model_type.lower() in SGLANG_HYBRID_SWA_TYPES
    else:
        names = f"{model.name} {model.hf_id or ''}".lower()
        hybrid = any(family in names for family in SGLANG_HYBRID_SWA)
    return config.swa_full_tokens_ratio if hybrid else None


def pool_size(config: PoolConfig, presets=None, parallelism: Parallelism = SINGLE):
    """``(num_blocks, sizing)``: the pool's blocks and, when sized from presets, the
    :class:`~schedlab.capacity.KVSizing` derivation (else None). A given ``num_blocks`` wins over
    the derived count (a block count measured on the real server is the most common setting).
    ``parallelism`` (the run's ``[cluster]``): a data-parallel rank holds the dense weights and
    its share of the experts, a pipeline stage its layers' weights and KV."""
    if config.model is None:
        return (config.num_blocks if config.num_blocks is not None else 16384), None
    model, gpu = with_kv_cache_dtype(presets.model(config.model), config.kv_cache_dtype), presets.gpu(config.gpu)
    if isinstance(config, RadixConfig):  # SGLang: a pool of its own for the window layers, or none
        ratio = sglang_swa_ratio(config, model)
        hybrid = ratio is not None
    else:
        hybrid, ratio = not getattr(config, "disable_hybrid_kv_cache_manager", False), None
    draft = (with_kv_cache_dtype(presets.model(config.draft_model), config.kv_cache_dtype)
             if config.draft_model is not None else None)  # (its KV pages beside the target's, in their dtype)
    sizing = size_kv_cache(model, gpu, gpu_memory_utilization=config.gpu_memory_utilization,
                           tensor_parallel=config.tensor_parallel,
                           activation_reserve_gib=config.activation_reserve_gib, block_size=config.block_size,
                           parallelism=parallelism, hybrid=hybrid, swa_ratio=ratio, draft=draft,
                           draft_shares_tables=config.draft_shares_tables)
    return (sizing.num_blocks if config.num_blocks is None else config.num_blocks), sizing


def check_timed_transfers(config: PoolConfig, sizing, key: str) -> None:
    """Swap space or a host tier given in blocks (``key``) moves blocks over the host link: without
    their size in bytes (``bytes_per_block``, or ``model`` and ``gpu``) every transfer would take no
    time, silently -- swap would look strictly better than recompute. ``bytes_per_block = 0`` says
    so on purpose."""
    if config.bytes_per_block is None and sizing is None:
        raise FieldError(key, "moves blocks over the host link, timed by their size: set bytes_per_block (0: "
                              "transfers take no time), or model and gpu to derive it")


def check_bytes_per_block(config: PoolConfig, bytes_per_block: int, key: str, in_blocks: str) -> None:
    """A size in bytes (``key``) is a count of blocks only when blocks have a size: FieldError when
    ``bytes_per_block`` (given, or derived) is 0; ``in_blocks`` is the size in blocks instead."""
    if bytes_per_block:
        return
    if config.bytes_per_block == 0:  # (0 on purpose: copies that take no time, but then no size in bytes)
        raise FieldError(key, f"counts blocks of bytes_per_block bytes, and bytes_per_block = 0: give {in_blocks} "
                              "instead (or bytes_per_block > 0)")
    raise FieldError(key, "needs bytes_per_block, or model and gpu to derive it")


def link_of(config: PoolConfig, sizing) -> tuple[int, float]:
    """``(bytes_per_block, host_link_gbps)``: given, else from the presets, else 0 and 25 GB/s."""
    bytes_per_block = config.bytes_per_block
    link = config.host_link_gbps
    if sizing is not None:
        if bytes_per_block is None:
            bytes_per_block = sizing.bytes_per_block
        if link is None:
            link = sizing.gpu.host_link_gbps
    return bytes_per_block or 0, link or 25.0


def host_tier(config: PoolConfig, sizing, parallelism: Parallelism = SINGLE, num_blocks: int = 0) -> HostTier | None:
    """The host-memory tier ``config`` asks for, or None; its capacity is per rank, in blocks of
    ``bytes_per_block`` (a rank's bytes).

    * ``paged``'s ``host_memory_gib`` is vLLM 0.33's ``--kv-offloading-size``: GiB summed over the
      ranks (``config/cache.py``: "the total buffer size summed across all TP ranks"; the native
      connectors split it over the world size, TP x PP), so a rank holds ``size / (TP x PP)``.
    * ``radix``'s ``host_memory_gb`` is SGLang's ``--hicache-size``: GB (10**9 bytes) per rank
      (``HostKVCache``: ``host_size * 1e9 // size_per_token``); without a size, ``hierarchical_cache``
      gives ``hicache_ratio`` x the GPU pool (``num_blocks``), and a tier no larger than the GPU pool
      is refused as SGLang refuses it at start-up."""
    if not config.has_host_tier:
        return None
    if config.host_blocks is not None:
        check_timed_transfers(config, sizing, "host_blocks")
    bytes_per_block, link = link_of(config, sizing)
    blocks = config.host_blocks
    sized = "host_memory_gib" if config.host_memory_gib else \
        "host_memory_gb" if isinstance(config, RadixConfig) and config.host_memory_gb and blocks is None else None
    if sized:
        check_bytes_per_block(config, bytes_per_block, sized, "host_blocks")
    if config.host_memory_gib:
        ranks = config.tensor_parallel * parallelism.pipeline_parallel
        blocks = int(config.host_memory_gib * GIB // (bytes_per_block * ranks))
        if not blocks:
            raise FieldError("host_memory_gib",
                             f"{config.host_memory_gib} GiB over {ranks} rank(s) holds no block of "
                             f"{bytes_per_block} bytes" if ranks > 1 else
                             f"{config.host_memory_gib} GiB holds no block of {bytes_per_block} bytes")
    key = "host_blocks"
    if isinstance(config, RadixConfig) and blocks is None:
        if config.host_memory_gb:
            key = "host_memory_gb"
            blocks = int(config.host_memory_gb * 1e9 // bytes_per_block)
        else:  # SGLang: host tokens = GPU pool tokens x ratio, rounded down to a whole page
            key = "hicache_ratio"
            check_timed_transfers(config, sizing, "hierarchical_cache")
            blocks = int(num_blocks * config.block_size * config.hicache_ratio) // config.block_size
    if isinstance(config, RadixConfig) and blocks <= num_blocks:
        raise FieldError(key, f"a host tier of {blocks} blocks is not larger than the GPU pool's {num_blocks}: "
                              "SGLang refuses to start (HostKVCache: 'The host memory should be larger than the "
                              "device memory')")
    return HostTier(blocks, bytes_per_block=bytes_per_block, link_gbps=link, latency_us=config.host_link_latency_us,
                    write_policy=config.write_policy)


@attrs.frozen
class PagedConfig(PoolConfig):
    swap_space_gib: float = float_field(0.0, min=0.0, max=MAX_MEMORY_GIB,
                                        help="CPU swap space per GPU, GiB (vLLM V0 used 4)")
    swap_blocks: int | None = int_field(None, min=0, optional=True, help="swap space in blocks (instead of GiB)")
    prefix_caching: bool = bool_field(False, help="reuse cached full prompt blocks (vLLM enable_prefix_caching)")
    disable_hybrid_kv_cache_manager: bool = bool_field(
        False, help="as vLLM's flag: a model's sliding-window layers keep every token too (default: only their "
                    "window, in KV cache groups of their own; schedlab.kv_window)")
    prefix_cache_retention_interval: int = int_field(
        0, min=0, help="vLLM's, with prefix caching and sliding-window layers: which positions' window blocks a "
                       "request keeps for later hits -- those before its prompt's replay boundary and before a "
                       "shared prefix's junction (0), and before every N tokens (N, a multiple of block_size)")
    dense_window_prefix_cache: bool = bool_field(
        False, help="vLLM's prefix_cache_retention_interval = None: every position's window blocks are kept, so a "
                    "hit reaches as far as the full-attention layers' (the interval is then ignored)")

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        if self.swap_space_gib and self.swap_blocks is not None:
            raise FieldError("swap_blocks", "give swap_space_gib or swap_blocks, not both")
        if self.prefix_cache_retention_interval % self.block_size:
            raise FieldError("prefix_cache_retention_interval",
                             f"{self.prefix_cache_retention_interval} is not a multiple of block_size "
                             f"({self.block_size}), as vLLM requires")
        if self.has_host_tier and not self.prefix_caching:
            raise FieldError("host_memory_gib" if self.host_memory_gib else "host_blocks",
                             "a host-memory tier keeps prefix-cache blocks: needs prefix_caching = true")


def build_paged(config: PagedConfig, presets=None, parallelism: Parallelism = SINGLE) -> PagedKVCache:
    """A paged (optionally prefix-caching) KV cache sized from ``config``."""
    num_blocks, sizing = pool_size(config, presets, parallelism)
    bytes_per_block, link = link_of(config, sizing)
    swap_blocks = config.swap_blocks or 0
    if swap_blocks:
        check_timed_transfers(config, sizing, "swap_blocks")
    window = sizing.window if sizing is not None else None
    if config.swap_space_gib:
        check_bytes_per_block(config, bytes_per_block, "swap_space_gib", "swap_blocks")
        swap_blocks = int(config.swap_space_gib * GIB // bytes_per_block)
    if config.prefix_caching:
        from .prefix import PrefixKVCache

        retention = None if config.dense_window_prefix_cache else config.prefix_cache_retention_interval
        kv = PrefixKVCache(num_blocks, config.block_size, swap_blocks=swap_blocks, bytes_per_block=bytes_per_block,
                           host_link_gbps=link, host=host_tier(config, sizing, parallelism), window=window,
                           retention=retention)
    else:
        kv = PagedKVCache(num_blocks, config.block_size, swap_blocks=swap_blocks, bytes_per_block=bytes_per_block,
                          host_link_gbps=link, window=window)
    kv.sizing = sizing  # shown in the run summary
    return kv


@attrs.frozen
class RadixConfig(PoolConfig):
    """Settings of the ``radix`` cache: the pool's size and its host tier (SGLang has no swap space)."""

    block_size: int = int_field(16, min=1, max=MAX_BLOCK_SIZE,
                                help="tokens per KV page (SGLang page_size; its default 1 matches "
                                     "single tokens, exact but slow for long prompts)")
    swa_full_tokens_ratio: float = float_field(
        0.8, min=0.0, max=1.0, min_exclusive=True,
        help="SGLang's hybrid SWA memory: window-layer tokens per full-attention token (its default 0.8)")
    disable_hybrid_swa_memory: bool = bool_field(
        False, help="as SGLang's flag: the window layers keep every token, as SGLang 0.5.23 has them for every "
                    "model but gpt-oss and Llama 4 (the architectures it gives hybrid SWA memory)")
    host_memory_gb: float = float_field(0.0, min=0.0, max=MAX_MEMORY_GIB,
                                        help="HiCache host-memory KV tier per rank, GB (10**9 bytes; SGLang "
                                             "--hicache-size); 0 = hicache_ratio x the GPU pool if "
                                             "hierarchical_cache, else none")
    hierarchical_cache: bool = bool_field(
        False, help="SGLang --enable-hierarchical-cache: a HiCache host tier of host_memory_gb or host_blocks, "
                    "else hicache_ratio x the GPU pool (set by any of those three)")
    hicache_ratio: float = float_field(2.0, min=0.0, max=1e6, min_exclusive=True,
                                       help="SGLang --hicache-ratio: host tier / GPU pool when no size is given "
                                            "(its default 2.0; the tier must be larger than the pool)")

    def __attrs_post_init__(self):
        if self.host_memory_gib:  # (before the shared checks, which would ask for its bytes first)
            raise FieldError("host_memory_gib", "SGLang sizes HiCache per rank in GB (10**9 bytes, --hicache-size): "
                                                "give host_memory_gb, host_blocks, or hierarchical_cache = true "
                                                "(hicache_ratio x the GPU pool)")
        super().__attrs_post_init__()
        if self.host_memory_gb and self.host_blocks is not None:
            raise FieldError("host_blocks", "give host_memory_gb or host_blocks, not both")
        if self.host_memory_gb and not self.bytes_per_block and self.model is None:
            raise FieldError("host_memory_gb", "needs bytes_per_block, or model and gpu to derive it")

    @property
    def has_host_tier(self) -> bool:
        return bool(self.host_memory_gb or self.host_blocks or self.hierarchical_cache)


def build_radix(config: RadixConfig, presets=None, parallelism: Parallelism = SINGLE):
    """SGLang's radix-tree prefix cache sized from ``config``."""
    from .radix import RadixKVCache

    num_blocks, sizing = pool_size(config, presets, parallelism)
    bytes_per_block, _ = link_of(config, sizing)
    kv = RadixKVCache(num_blocks, config.block_size, host=host_tier(config, sizing, parallelism, num_blocks),
                      bytes_per_block=bytes_per_block)
    kv.sizing = sizing
    return kv
