"""Energy of data-parallel ranks stepping together (a MoE model with ``[cluster] data_parallel``):
the cost models' split of an iteration's work -- a rank's own part and each GPU's share of the
step's routed experts -- checked by hand on a small model.
"""

from __future__ import annotations

import pytest

from schedlab.capacity import ModelSpec, Presets
from schedlab.catalog import load_catalog
from schedlab.parallelism import Parallelism
from schedlab.protocols import Batch
from schedlab_plugins.cost_models import RooflineConfig, RooflineCostModel
from schedlab_plugins.cost_models.work import ModelWork

PRESETS = Presets.from_catalog(load_catalog(entry_points=False))


# -- the work of a step, split as its time is --------------------------------------------------------------

#: 4 experts of 100 parameters, 2 a token; 600 other parameters; 2 layers, 4 query heads, 2 KV
#: heads of 4 dimensions; 2 bytes a weight. No vocabulary declared: no embedding table apart.
TINY = ModelSpec(name="tiny-moe", num_layers=2, num_kv_heads=2, head_dim=4, num_params=1000.0, num_attention_heads=4,
                 num_experts=4, experts_per_token=2, active_params=800.0)


def test_a_ranks_work_and_its_share_of_the_experts_add_up_to_the_iteration_by_hand():
    # Two decodes over 10 context tokens and a chunk of 3 prompt tokens after 5 cached: 5 tokens.
    # Own part: 600 weights x 2 bytes = 1200, KV (10 + 5) x 64 bytes (K and V x 2 layers x 2 heads x
    # 4 x 2 bytes a token) = 960; FLOPs 2 x 600 = 1200 a token x 5, attention 128 a (query, key) pair
    # (4 x 2 layers x 4 heads x 4): the chunk's 3 x 5 + 3 x 4 / 2 = 21 pairs and the decodes' 10.
    # Experts of 5 tokens on one GPU: 4 x (1 - (1 - 2/4)^5) = 3.875 experts touched x 100 x 2
    # bytes; 2 x 2 x 100 FLOPs a token.
    w = ModelWork(TINY)
    batch = Batch(num_decode=2, decode_context_tokens=10, num_prefill=1, prefill_tokens=3, prefill_context_tokens=5)
    assert w.rank_work(batch) == (2160.0, 1200 * 5 + 128 * (21 + 10))
    assert w.experts_work((5,)) == (775.0, 2000.0)
    assert w.work(batch) == pytest.approx((2160 + 775, 9968 + 2000), rel=1e-15)
    # two ranks of 3 and 5 tokens: the 8 tokens touch 4 x (1 - 1/2^8) experts, half of them (and
    # half the 8 tokens' expert FLOPs) on each GPU; at TP 2 a quarter
    assert w.experts_work((3, 5)) == (4 * 255 / 256 * 100 * 2 / 2, 2 * 2 * 100 * 8 / 2)
    assert ModelWork(TINY, 2).experts_work((3, 5)) == (4 * 255 / 256 * 100 * 2 / 4, 2 * 2 * 100 * 8 / 4)
    assert w.rank_work(Batch()) == (0.0, 0.0)
    dense = ModelSpec(name="tiny-dense", num_layers=2, num_kv_heads=2, head_dim=4, num_params=600.0)
    assert ModelWork(dense).experts_work((3, 5)) == (0.0, 0.0)
    with pytest.raises(ValueError, match="at least one rank"):
        w.experts_work(())


def _qwen(**layout) -> RooflineCostModel:
    config = RooflineConfig(model="qwen3-30b-a3b", gpu="rtx-pro-6000-server")
    return RooflineCostModel(PRESETS.model("qwen3-30b-a3b"), PRESETS.gpu("rtx-pro-6000-server"), config,
                             parallelism=Parallelism(**layout))


@pytest.mark.parametrize("batch", [Batch(num_decode=64, decode_context_tokens=64 * 900),
                                   Batch(num_prefill=2, prefill_tokens=700, prefill_context_tokens=300),
                                   Batch(num_decode=3, decode_context_tokens=40, num_prefill=1, prefill_tokens=50)])
def test_the_rooflines_rank_work_and_experts_work_are_its_work_at_one_rank(batch):
    single = _qwen()
    tokens = batch.num_batched_tokens
    own, experts, whole = single.rank_work(batch), single.experts_work((tokens,)), single.work(batch)
    assert own[0] + experts[0] == pytest.approx(whole[0], rel=1e-12)
    assert own[1] + experts[1] == pytest.approx(whole[1], rel=1e-12)
    # Qwen3-30B-A3B on two ranks: each GPU reads half of the experts all their tokens touch (128
    # experts, 8 a token) and computes half of their pairs
    m = PRESETS.model("qwen3-30b-a3b")
    dp = _qwen(data_parallel=2, expert_parallel=True)
    touched = 128 * (1 - (1 - 8 / 128) ** (tokens + 7))
    expected = (touched * m.expert_params * 2 / 2, 2 * 8 * m.expert_params * (tokens + 7) / 2)
    assert dp.experts_work((tokens, 7)) == pytest.approx(expected, rel=1e-12)
    assert dp.rank_work(batch) == own  # a rank's own part does not depend on the layout
    with pytest.raises(ValueError, match="expected the tokens of 2 data-parallel ranks"):
        dp.experts_work((tokens,))
