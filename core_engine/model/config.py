"""The decoder's shape, read from a Hugging Face config (Llama family only)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one this engine implements."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False  # q/k/v projections
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    architecture: str = "LlamaForCausalLM"
    pad_token_id: int | None = None  # its embedding row gets no gradient, as in transformers

    @classmethod
    def from_hf(cls, hf_config: Any) -> ModelConfig:
        """Build from a `transformers` config object; refuses unknown architectures."""
        arch = _architecture_of(hf_config)
        kind = SUPPORTED_ARCHITECTURES[arch]
        rope = dict(getattr(hf_config, "rope_parameters", None) or {})
        legacy_scaling = getattr(hf_config, "rope_scaling", None) or {}
        rope = {**legacy_scaling, **rope}
        theta = rope.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None) or 10000.0
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise UnsupportedModelError(
                f"rope_type {rope_type!r} is not supported (supported: default, llama3)"
            )
        num_heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        window = None
        if kind == "mistral" or getattr(hf_config, "use_sliding_window", False):
            window = getattr(hf_config, "sliding_window", None)
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            max_position_embeddings=hf_config.max_position_embeddings,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope_theta=float(theta),
            rope_scaling={k: v for k, v in rope.items() if k != "type"}
            if rope_type != "default"
            else {},
            attention_bias=kind == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
            o_proj_bias=kind != "qwen2" and bool(getattr(hf_config, "attention_bias", False)),
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            qk_norm=kind == "qwen3",
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            sliding_window=window,
            architecture=arch,
            pad_token_id=_padding_index(hf_config),
        )

    @property
    def max_context(self) -> int:
        """Longest context this engine serves exactly (sliding-window models are capped)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies, default or llama3-scaled, in fp32."""
        dim = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if self.rope_scaling.get("rope_type") != "llama3":
            return inv
        s = self.rope_scaling
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old_len = s["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)


def _padding_index(hf_config: Any) -> int | None:
    """`pad_token_id` when it names a row of the embedding (transformers' `padding_idx`)."""
    pad = getattr(hf_config, "pad_token_id", None)
    return pad if isinstance(pad, int) and 0 <= pad < hf_config.vocab_size else None


def _architecture_of(hf_config: Any) -> str:
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs:
        by_type = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
        model_type = getattr(hf_config, "model_type", None)
        if model_type in by_type:
            archs = [by_type[model_type]]
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    raise UnsupportedModelError(
        f"unsupported architecture {archs or getattr(hf_config, 'model_type', None)!r}; "
        f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
    )
