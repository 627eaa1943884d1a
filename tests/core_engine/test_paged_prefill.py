"""Prefill attention over the KV pool, batched by (query length, context length) group: every
sequence's output equals causal attention over its own context, computed here per sequence in
float64 from the textbook formula, whatever the mix and order of groups in the batch."""

from __future__ import annotations

import math

import pytest
import torch

from core_engine.model.attention import AttentionMetadata, paged_attention

HEADS, KV_HEADS, DIM = 4, 2, 8


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + causal mask) v for one sequence whose n queries are the last
    n of its ctx positions; q [n, H, D], keys/values [ctx, KVH, D] -> [n, H, D] (float64)."""
    n, ctx = q.shape[0], keys.shape[0]
    out = torch.empty(n, HEADS, DIM, dtype=torch.float64)
    for head in range(HEADS):
        kv = head // (HEADS // KV_HEADS)
        scores = q[:, head].double() @ keys[:, kv].double().T / math.sqrt(DIM)
        allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out[:, head] = weights @ values[:, kv].double()
    return out


# (new tokens, context) per sequence: fresh ones of two lengths and cached-prefix ones,
# interleaved; one group of fresh sequences; one group of cached-prefix sequences
SHAPES = {
    "mixed": [(5, 5), (3, 7), (5, 5), (2, 2), (3, 7), (4, 9)],
    "fresh": [(4, 4)] * 3,
    "cached": [(2, 6)] * 3,
}


@pytest.mark.parametrize("shapes", SHAPES.values(), ids=SHAPES.keys())
def test_prefill_groups_match_per_sequence_attention(shapes):
    torch.manual_seed(0)
    slots_per_seq, num_slots = 16, 16 * len(shapes) + 1
    k_cache = torch.randn(num_slots, KV_HEADS, DIM)
    v_cache = torch.randn(num_slots, KV_HEADS, DIM)
    gather = torch.stack(
        [torch.randperm(slots_per_seq) + i * slots_per_seq for i in range(len(shapes))]
    )
    total = sum(n for n, _ in shapes)
    q = torch.randn(total, HEADS, DIM)
    k = torch.randn(total, KV_HEADS, DIM)
    v = torch.randn(total, KV_HEADS, DIM)
    new_slots = torch.cat([gather[i, ctx - n : ctx] for i, (n, ctx) in enumerate(shapes)])
    meta = AttentionMetadata(
        slot_mapping=new_slots,
        query_lens=[n for n, _ in shapes],
        context_lens=[ctx for _, ctx in shapes],
        gather_index=gather[:, : max(ctx for _, ctx in shapes)],
    )
    out = paged_attention(q, k, v, k_cache, v_cache, meta, DIM**-0.5)

    start = 0
    for i, (n, ctx) in enumerate(shapes):
        keys, values = k_cache[gather[i, :ctx]], v_cache[gather[i, :ctx]]
        expected = reference(q[start : start + n], keys, values)
        torch.testing.assert_close(out[start : start + n].double(), expected, atol=1e-5, rtol=0)
        start += n
