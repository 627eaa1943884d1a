"""One decoder for the Llama family (Llama, Mistral, Qwen2 qkv bias, Qwen3 q/k norm; GQA).

Module and parameter names mirror Hugging Face's, so checkpoints load by name. Two forward paths
share the weights: `forward` (plain causal, for scoring and training) and `forward_engine`
(packed tokens reading and writing the KV pool).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from core_engine.model.attention import (
    AttentionMetadata,
    PackedLayout,
    packed_attention,
    paged_attention,
)
from core_engine.model.config import ModelConfig
from core_engine.model.kernels import Linear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x: [..., T, heads, D]; cos/sin: [..., T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.scale = cfg.head_dim**-0.5
        bias = cfg.attention_bias
        self.q_proj = Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_proj_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        shape = x.shape[:-1]
        q = self.q_proj(x).view(*shape, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*shape, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*shape, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Plain causal attention over x: [B, T, hidden]."""
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, cos, sin))
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).flatten(-2))

    def forward_packed(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: PackedLayout
    ) -> torch.Tensor:
        """Attention over the token trees packed back to back in x: [T, hidden] (no padding;
        no token attends across a sequence or a branch)."""
        q, k, v = self._qkv(x, cos, sin)
        return self.o_proj(packed_attention(q, k, v, layout, self.scale).flatten(-2))

    def forward_engine(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Packed tokens x: [N, hidden]; writes their K/V into the pool slots `kv`."""
        q, k, v = self._qkv(x, cos, sin)
        out = paged_attention(q, k, v, kv[0], kv[1], meta, self.scale)
        return self.o_proj(out.flatten(-2))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.mlp_bias
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv=None, meta=None, layout=None) -> torch.Tensor:
        h = self.input_layernorm(x)
        if meta is not None:
            h = self.self_attn.forward_engine(h, cos, sin, kv, meta)
        elif layout is not None:
            h = self.self_attn.forward_packed(h, cos, sin, layout)
        else:
            h = self.self_attn(h, cos, sin)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, cfg.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """A Llama-family causal LM with Hugging Face parameter names."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.reset_rope()

    def tie_weights(self) -> None:
        """The LM head reads the embedding matrix when the config ties them (again after
        `to_empty`, which gives every module a parameter of its own)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_rope(self) -> None:
        """(Re)compute the RoPE tables on the model's device and in its dtype (also after
        `to_empty`, which leaves buffers uninitialised)."""
        cfg, like = self.config, self.lm_head.weight
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, cfg.inv_freq())
        emb = torch.cat((freqs, freqs), dim=-1).to(like.device)
        self.rope_cos = emb.cos().to(like.dtype)
        self.rope_sin = emb.sin().to(like.dtype)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        cos = self.rope_cos[positions].to(dtype).unsqueeze(-2)
        sin = self.rope_sin[positions].to(dtype).unsqueeze(-2)
        return cos, sin

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Plain causal forward: input_ids [B, T] -> logits [B, T, vocab] (fp32).

        Positions are 0..T-1; pad on the right (padding never influences earlier tokens).
        """
        x = self.model.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = self._rope(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x)).float()

    def hidden_states_packed(
        self, input_ids: torch.Tensor, layout: PackedLayout, checkpointing: bool = False
    ) -> torch.Tensor:
        """Final (normed) hidden states of token trees packed back to back (`PackedLayout`:
        sequences, or prompts each followed by their responses): input_ids [T] -> [T, hidden].
        The LM head is left to the caller, so logits are only ever computed where they are
        needed. `checkpointing` recomputes each layer in the backward instead of keeping its
        activations."""
        embed = self.model.embed_tokens
        # Tied: the lookup's gradient comes back sparse and is added in place into the LM
        # head's dense one, so the backward never holds a second [vocab, hidden] tensor.
        sparse = self.config.tie_word_embeddings and torch.is_grad_enabled()
        x = F.embedding(input_ids, embed.weight, embed.padding_idx, sparse=sparse)
        cos, sin = self._rope(layout.positions, x.dtype)
        for layer in self.model.layers:
            if checkpointing and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, None, None, layout, use_reentrant=False)
            else:
                x = layer(x, cos, sin, layout=layout)
        return self.model.norm(x)

    def forward_engine(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Packed engine forward: returns fp32 logits only at `logits_indices`."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions, x.dtype)
        for layer, kv in zip(self.model.layers, kv_cache, strict=True):
            x = layer(x, cos, sin, kv, meta)
        return self.lm_head(self.model.norm(x[logits_indices])).float()
