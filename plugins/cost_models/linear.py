"""The linear cost model: the seed lab's per-token prefill cost and per-step decode cost.

``iteration_ms = prefill_ms_per_token * (prefill_tokens + spec_tokens)
               + decode_ms_per_step  (if the iteration decodes anything)
               + per_seq_ms * sequences in the batch
               + per_context_token_ms * KV tokens the decodes attend to
               + base_ms``

With the defaults (0.05 ms per prompt token, 8 ms per decode step) an iteration costs what
seed 001 charges: prefill proportional to prompt length, decode a fixed step time however
many sequences share it -- the reason batching pays. ``per_context_token_ms`` makes decode
steps slow down as contexts grow (memory-bound attention); the increase per step is exact,
so the fast engine still advances decode runs in closed form.

Speculative decoding: the draft tokens a decode verifies (``spec_tokens``) are computed in
the same pass as its own token, in parallel like a prompt chunk, so each costs what a prompt
token does; they also count as context (``per_context_token_ms``). A decode that verifies
``k`` drafts therefore costs ``k * prefill_ms_per_token`` more than a plain one.
"""

from __future__ import annotations

import attrs

from schedlab.configs import float_field
from schedlab.protocols import Batch


@attrs.frozen
class LinearConfig:
    prefill_ms_per_token: float = float_field(0.05, min=0.0, help="ms per prompt (or recompute) token computed")
    decode_ms_per_step: float = float_field(8.0, min=0.0, help="ms for an iteration that decodes, whatever the batch size")
    per_seq_ms: float = float_field(0.0, min=0.0, help="extra ms per sequence in the batch")
    per_context_token_ms: float = float_field(0.0, min=0.0, help="extra ms per KV token attended by decodes")
    base_ms: float = float_field(0.0, min=0.0, help="fixed overhead per iteration (scheduling, launch)")


class LinearCostModel:
    """Iteration time linear in prefill tokens, sequences and decode context (seed 001's model)."""

    def __init__(self, config: LinearConfig | None = None):
        self.config = config or LinearConfig()
        c = self.config
        self._prefill = c.prefill_ms_per_token
        self._decode = c.decode_ms_per_step
        self._seq = c.per_seq_ms
        self._ctx = c.per_context_token_ms
        self._base = c.base_ms

    def iteration_ms(self, batch: Batch) -> float:
        ms = self._base + self._prefill * (batch.prefill_tokens + batch.spec_tokens)
        if batch.num_decode:
            ms += self._decode + self._ctx * batch.decode_context_tokens
        if self._seq:
            ms += self._seq * (batch.num_decode + batch.num_prefill)
        return ms

    def decode_step_increment(self, batch: Batch) -> float | None:
        """Each next decode-only step attends ``num_decode`` more tokens."""
        if batch.prefill_tokens or batch.spec_tokens:
            return None
        return self._ctx * batch.num_decode

    def request_cost(self, prompt_tokens, output_tokens):
        """Seed 001's per-request accounting: (prompt x prefill cost, output x decode cost).

        Works on numbers or numpy arrays."""
        return prompt_tokens * self._prefill, output_tokens * self._decode
