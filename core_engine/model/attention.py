"""Attention over the paged/contiguous KV pool, and the metadata it needs.

This module is a leaf: the cache and the runtime import `AttentionMetadata` from here, the model
never imports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """Where the new tokens' K/V go and which cached slots each sequence attends to.

    `gather_index[i, :context_lens[i]]` lists the KV slots of sequence i's context (positions
    0..context_len-1, the new tokens included); entries past the length are padding.
    """

    slot_mapping: torch.Tensor  # [num_new_tokens] int64
    query_lens: list[int]
    context_lens: list[int]
    gather_index: torch.Tensor  # [num_seqs, max_context] int64
    decode_mask: torch.Tensor | None = None  # [num_seqs, 1, 1, max_context] bool, decode only
    # Decode only: the first `shared_prefix` context slots are the same for every sequence (a
    # shared header in the prefix cache); they are read once and attended by all rows together.
    shared_prefix: int = 0

    @property
    def is_decode(self) -> bool:
        return self.decode_mask is not None

    @cached_property
    def prefill_groups(self) -> list[PrefillGroup]:
        """The sequences grouped by (query length, context length), in first-seen order:
        each group's attention is one batched call (computed once per forward, not per layer)."""
        members: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        start = 0
        for i, (n, ctx) in enumerate(zip(self.query_lens, self.context_lens, strict=True)):
            rows, starts = members.setdefault((n, ctx), ([], []))
            rows.append(i)
            starts.append(start)
            start += n
        device = self.slot_mapping.device
        groups = []
        for (n, ctx), (rows, starts) in members.items():
            first = torch.tensor(starts, device=device)
            tokens = (first[:, None] + torch.arange(n, device=device)).reshape(-1)
            groups.append(PrefillGroup(n, ctx, torch.tensor(rows, device=device), tokens))
        return groups


@dataclass(frozen=True)
class PrefillGroup:
    """Prefill sequences of one query length and one context length: their indices in the
    batch (`rows`) and their packed token positions (`tokens`, sequence after sequence)."""

    query_len: int
    context_len: int
    rows: torch.Tensor
    tokens: torch.Tensor


@dataclass(frozen=True)
class PackedGroup:
    """Segments of one query length and one key length. `mask` is the causal mask aligned at
    the end ([queries, keys] bool: query i sees keys up to keys - queries + i); None where the
    lengths are equal (plain causal)."""

    count: int
    query_len: int
    key_len: int
    mask: torch.Tensor | None


@dataclass(frozen=True)
class PackedLayout:
    """Token trees packed back to back: each tree is a prefix followed by its branches, every
    branch continuing the prefix (a GRPO group: one prompt, G responses), so the prefix is
    computed once for all of them. A branch's tokens attend causally over its prefix and
    itself, never across trees or branches; a tree of one branch is one causal sequence.

    `positions`: each token's position in its own sequence. Attention runs as one batched call
    per group of segments of equal (query length, key length): `query_order` lists the groups'
    query tokens and `key_order` their key tokens (a prefix's keys repeated for each branch),
    group after group; `inverse` restores packed order."""

    positions: torch.Tensor
    groups: list[PackedGroup]
    query_order: torch.Tensor
    key_order: torch.Tensor
    inverse: torch.Tensor

    @classmethod
    def from_trees(
        cls, trees: Sequence[tuple[int, Sequence[int]]], device: torch.device
    ) -> PackedLayout:
        """`trees`: (prefix length, branch lengths) each, in packed order: a tree's prefix
        tokens, then its branches' one after another."""
        segments: dict[tuple[int, int], list[tuple[int, int]]] = {}  # -> (query, key) starts
        positions: list[int] = []
        offset = 0
        for prefix, branches in trees:
            if len(branches) == 1:
                prefix, branches = prefix + branches[0], []
            segments.setdefault((prefix, prefix), []).append((offset, offset))
            positions.extend(range(prefix))
            start = offset + prefix
            for length in branches:
                segments.setdefault((length, prefix + length), []).append((start, offset))
                positions.extend(range(prefix, prefix + length))
                start += length
            offset = start
        groups, queries, keys = [], [], []
        for (query_len, key_len), starts in segments.items():
            if not query_len:
                continue
            query_starts = torch.tensor([q for q, _ in starts])
            own = query_starts[:, None] + torch.arange(query_len)
            prefix = key_len - query_len  # a branch's keys: its prefix, then its own tokens
            shared = torch.tensor([k for _, k in starts])[:, None] + torch.arange(prefix)
            queries.append(own.reshape(-1))
            keys.append(torch.cat([shared, own], 1).reshape(-1))
            mask = torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(prefix)
            groups.append(PackedGroup(len(starts), query_len, key_len, mask if prefix else None))
        query_order = torch.cat(queries) if queries else torch.zeros(0, dtype=torch.long)
        inverse = torch.empty_like(query_order)
        inverse[query_order] = torch.arange(len(query_order))
        return cls(
            torch.tensor(positions, device=device),
            groups,
            query_order.to(device),
            (torch.cat(keys) if keys else query_order).to(device),
            inverse.to(device),
        )


def packed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PackedLayout, scale: float
) -> torch.Tensor:
    """Attention over packed token trees (`PackedLayout`): q [T, H, D], k and v [T, KVH, D] ->
    [T, H, D]. One fused call per group, so no [T, T] scores; gathers, splits and
    concatenations have single-node backwards (a shared prefix's gradients are summed by its
    gather's)."""
    query_sizes = [g.count * g.query_len for g in layout.groups]
    key_sizes = [g.count * g.key_len for g in layout.groups]
    queries = q.index_select(0, layout.query_order).split(query_sizes)
    keys, values = (t.index_select(0, layout.key_order).split(key_sizes) for t in (k, v))
    outputs = []
    for g, qi, ki, vi in zip(layout.groups, queries, keys, values, strict=True):
        qi = qi.view(g.count, g.query_len, *qi.shape[1:]).transpose(1, 2)
        ki, vi = (t.view(g.count, g.key_len, *t.shape[1:]).transpose(1, 2) for t in (ki, vi))
        out = F.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=g.mask, is_causal=g.mask is None, scale=scale, enable_gqa=True
        )
        outputs.append(out.transpose(1, 2).reshape(g.count * g.query_len, *q.shape[1:]))
    return torch.cat(outputs).index_select(0, layout.inverse)


def gather_slots(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`cache[index]` for an index of any shape; `index_select` is several times faster than
    advanced indexing on CPU (the same copy)."""
    return cache.index_select(0, index.reshape(-1)).view(*index.shape, *cache.shape[1:])


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write the new K/V into the pool, then attend. q: [N, H, D]; k, v: [N, KVH, D]."""
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    if meta.is_decode and meta.shared_prefix:
        return cascade_decode(q, k_cache, v_cache, meta, scale)
    if meta.is_decode:
        keys = gather_slots(k_cache, meta.gather_index).transpose(1, 2)  # [B, KVH, L, D]
        values = gather_slots(v_cache, meta.gather_index).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
        )
        return out.squeeze(2)
    groups = meta.prefill_groups
    if len(groups) == 1:  # the whole batch, in order: no token is gathered or scattered
        return _prefill_group(q, k, v, k_cache, v_cache, meta.gather_index, groups[0], scale)
    out = torch.empty_like(q)
    for group in groups:
        attended = _prefill_group(
            *(t.index_select(0, group.tokens) for t in (q, k, v)),
            k_cache,
            v_cache,
            meta.gather_index,
            group,
            scale,
        )
        out.index_copy_(0, group.tokens, attended)
    return out


def _prefill_group(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    gather_index: torch.Tensor,
    group: PrefillGroup,
    scale: float,
) -> torch.Tensor:
    """One batched attention call for a prefill group's tokens (q, k, v: its sequences one
    after another) -> [tokens, H, D]."""
    n, ctx, batch = group.query_len, group.context_len, len(group.rows)

    def per_sequence(t: torch.Tensor) -> torch.Tensor:  # [tokens, H, D] -> [B, H, n, D]
        return t.view(batch, n, *t.shape[1:]).transpose(1, 2)

    if ctx == n:  # nothing cached: attend to the fresh K/V directly
        attended = F.scaled_dot_product_attention(
            per_sequence(q),
            per_sequence(k),
            per_sequence(v),
            is_causal=True,
            scale=scale,
            enable_gqa=True,
        )
    else:
        index = gather_index.index_select(0, group.rows)[:, :ctx]
        keys = gather_slots(k_cache, index).transpose(1, 2)  # [B, KVH, ctx, D]
        values = gather_slots(v_cache, index).transpose(1, 2)
        mask = torch.ones(n, ctx, dtype=torch.bool, device=q.device).tril(diagonal=ctx - n)
        attended = F.scaled_dot_product_attention(
            per_sequence(q), keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return attended.transpose(1, 2).reshape(batch * n, *q.shape[1:])


def cascade_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Decode attention in two parts merged by their log-sum-exp (FlashInfer's cascade): the
    shared prefix is gathered once and attended by every row's query heads in one product per
    KV head, each row's own suffix separately. q: [B, H, D] -> [B, H, D]."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    shared = meta.shared_prefix
    by_kv_head = q.view(batch, kv_heads, group, dim)
    # Prefix: [KVH, B x group, D] queries against [KVH, P, D] keys; no row copies the prefix.
    prefix_slots = meta.gather_index[0, :shared]
    out_p, lse_p = _attend(
        by_kv_head.transpose(0, 1).reshape(kv_heads, batch * group, dim),
        gather_slots(k_cache, prefix_slots).transpose(0, 1),
        gather_slots(v_cache, prefix_slots).transpose(0, 1),
        None,
        scale,
    )
    out_p = out_p.view(kv_heads, batch, group, dim).transpose(0, 1)
    lse_p = lse_p.view(kv_heads, batch, group, 1).transpose(0, 1)
    # Suffix: each row against its own slots, [B x KVH, group, D] against [B x KVH, S, D].
    suffix_slots = meta.gather_index[:, shared:]
    length = suffix_slots.shape[1]

    def rows(cache: torch.Tensor) -> torch.Tensor:
        gathered = gather_slots(cache, suffix_slots).transpose(1, 2)  # [B, KVH, S, D]
        return gathered.reshape(batch * kv_heads, length, dim)

    mask = meta.decode_mask[..., shared:].expand(batch, kv_heads, 1, length)
    out_s, lse_s = _attend(
        by_kv_head.reshape(batch * kv_heads, group, dim),
        rows(k_cache),
        rows(v_cache),
        mask.reshape(batch * kv_heads, 1, length),
        scale,
    )
    out_s = out_s.view(batch, kv_heads, group, dim)
    lse_s = lse_s.view(batch, kv_heads, group, 1)
    lse = torch.logaddexp(lse_p, lse_s)
    out = out_p * torch.exp(lse_p - lse) + out_s * torch.exp(lse_s - lse)
    return out.reshape(batch, heads, dim).to(q.dtype)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched attention without a causal order: q [N, G, D] against k, v [N, L, D]; fp32
    outputs [N, G, D] and log-sum-exps [N, G, 1]."""
    scores = torch.bmm(q.float(), k.float().transpose(1, 2)) * scale  # [N, G, L]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)  # finite: every row attends at least one slot
    weights = torch.exp(scores - top)
    total = weights.sum(dim=-1, keepdim=True)
    return torch.bmm(weights, v.float()) / total, top + total.log()
