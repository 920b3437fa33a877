"""Built-in KV caches: ``paged`` (vLLM's block pool, optional prefix caching and swap space)."""

import schedlab

from .paged import PagedKVCache
from .prefix import PrefixKVCache
from .settings import PagedConfig, build_paged


@schedlab.hookimpl
def schedlab_register_kv_caches(register):
    register("paged", build_paged, config=PagedConfig,
             help="paged KV blocks (vLLM); sized directly or from a model and GPU; swap space; prefix caching")
