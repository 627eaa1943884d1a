"""The two benchmark models: a tiny one (the overhead regime) and a random Qwen2.5-0.5B-shaped
one (the physics regime), each built twice with identical weights: ours and Hugging Face's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from core_engine.model import CausalLM, build_model, load_state
from core_engine.toy import tiny_config


def qwen05_config() -> transformers.Qwen2Config:
    """Qwen2.5-0.5B's shape with random weights (494 M parameters, tied embeddings)."""
    config = transformers.Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.02,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=None,  # no EOS anywhere: fixed output lengths in every engine
    )
    config.architectures = ["Qwen2ForCausalLM"]
    return config


MODEL_CONFIGS: dict[str, Callable[[], Any]] = {
    "tiny": lambda: tiny_config(
        "qwen2", vocab_size=1024, max_position_embeddings=2048, eos_token_id=None
    ),
    "qwen05": qwen05_config,
}


@dataclass
class Models:
    name: str
    hf: transformers.PreTrainedModel
    ours: CausalLM
    vocab_size: int
    num_params: int
    weight_bytes: int


def build_models(name: str) -> Models:
    """The HF model (sdpa) and ours with the very same fp32 weights."""
    config = MODEL_CONFIGS[name]()
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    ours = build_model(config, dtype=torch.float32)
    load_state(ours, hf.state_dict())
    params = {p.data_ptr(): p for p in ours.parameters()}.values()
    return Models(
        name=name,
        hf=hf,
        ours=ours,
        vocab_size=config.vocab_size,
        num_params=sum(p.numel() for p in params),
        weight_bytes=sum(p.numel() * p.element_size() for p in params),
    )
