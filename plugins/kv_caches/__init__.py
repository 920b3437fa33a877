"""Built-in KV caches: ``paged`` (vLLM's block pool, optional prefix caching and swap space) and
``radix`` (SGLang's radix-tree prefix cache)."""

import schedlab

from .paged import PagedKVCache
from .prefix import PrefixKVCache
from .radix import RadixKVCache
from .settings import PagedConfig, RadixConfig, build_paged, build_radix


@schedlab.hookimpl
def schedlab_register_kv_caches(register):
    register("paged", build_paged, config=PagedConfig,
             help="paged KV blocks (vLLM); sized directly or from a model and GPU; swap space; prefix caching; "
                  "a host-memory tier under it")
    register("radix", build_radix, config=RadixConfig,
             help="SGLang's radix-tree prefix cache: every computed block cached, running requests lock their "
                  "paths, LRU eviction of unlocked leaves; a host-memory tier under it (HiCache)")
