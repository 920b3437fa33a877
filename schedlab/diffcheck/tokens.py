"""Token ids for the real engines (vLLM, SGLang) and the matching block hashes for schedlab.

vLLM identifies a full KV block by a hash chained over its tokens and its parent block's hash
(``hash_block_tokens`` / ``get_request_block_hasher`` in vLLM 0.33's
``vllm/v1/core/kv_cache_utils.py``), for prompt and generated tokens alike. schedlab has no
tokens; a request carries ``block_hashes`` instead, one per ``hash_block_tokens`` prompt
tokens, each naming the whole prefix up to the end of its block. With
``hash_block_tokens = block_size`` the two identify the same prompt blocks when
:func:`block_hashes` chains the same way.

Token ids are disjoint by construction, so two requests share exactly their declared prefix:

* position ``i`` of group ``g``'s shared prompt: ``SHARED + g * STRIDE + i``;
* position ``i`` of request ``r``'s own prompt tokens: ``UNIQUE + r * STRIDE + i``;
* the ``k``-th token request ``r`` generates: ``OUTPUT + r * STRIDE + k`` (never EOS, and no
  two requests generate the same block, as no two real answers would by chance).

All ids stay below 2**31.
"""

from __future__ import annotations

import hashlib
import struct

from .case import MAX_GROUPS, MAX_MODEL_LEN, MAX_REQUESTS, DiffRequest

STRIDE = 100_000
SHARED = 1_000_000
UNIQUE = 100_000_000
OUTPUT = 1_000_000_000
assert MAX_MODEL_LEN < STRIDE and SHARED + MAX_GROUPS * STRIDE <= UNIQUE
assert UNIQUE + MAX_REQUESTS * STRIDE <= OUTPUT and OUTPUT + MAX_REQUESTS * STRIDE < 2**31


def prompt_token_ids(request: DiffRequest) -> list[int]:
    shared = SHARED + (request.group or 0) * STRIDE
    own = UNIQUE + request.id * STRIDE
    return [shared + i if i < request.prefix_len else own + i for i in range(request.prompt_tokens)]


def output_token_id(request_id: int, k: int) -> int:
    """The ``k``-th (from 0) token request ``request_id`` generates."""
    return OUTPUT + request_id * STRIDE + k


def block_hashes(token_ids, block_size: int) -> tuple[int, ...]:
    """One 64-bit id per *full* block of ``token_ids``, chained over the parent's id (as vLLM
    chains its block hashes), so equal ids mean equal tokens from the start to the end of
    that block."""
    out = []
    parent = b"\0" * 8
    full = len(token_ids) // block_size
    for j in range(full):
        block = token_ids[j * block_size:(j + 1) * block_size]
        parent = hashlib.blake2b(parent + struct.pack(f"<{block_size}q", *block), digest_size=8).digest()
        out.append(int.from_bytes(parent, "little"))
    return tuple(out)
