"""Settings of the ``paged`` KV cache and the factory that sizes it."""

from __future__ import annotations

import attrs

from schedlab.configs import float_field, int_field

from .paged import PagedKVCache


@attrs.frozen
class PagedConfig:
    block_size: int = int_field(16, min=1, help="tokens per KV block (vLLM 16, TensorRT-LLM 32)")
    num_blocks: int = int_field(16384, min=1, help="KV blocks on the accelerator")
    swap_blocks: int = int_field(0, min=0, help="blocks of CPU swap space (0 = no swap)")
    bytes_per_block: int = int_field(0, min=0, help="bytes of one block (for swap transfer times)")
    host_link_gbps: float = float_field(25.0, min=0.0, min_exclusive=True, help="host link bandwidth for swaps, GB/s")


def build_paged(config: PagedConfig, presets=None) -> PagedKVCache:
    return PagedKVCache(config.num_blocks, config.block_size, swap_blocks=config.swap_blocks,
                        bytes_per_block=config.bytes_per_block, host_link_gbps=config.host_link_gbps)
