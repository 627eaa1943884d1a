"""The Llama-family decoder: config, modules, loading."""

from core_engine.model.attention import AttentionMetadata
from core_engine.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from core_engine.model.decoder import CausalLM
from core_engine.model.loader import (
    build_model,
    checkpoint_eos_ids,
    default_dtype,
    load_model,
    load_state,
)

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "AttentionMetadata",
    "CausalLM",
    "ModelConfig",
    "UnsupportedModelError",
    "build_model",
    "checkpoint_eos_ids",
    "default_dtype",
    "load_model",
    "load_state",
]
