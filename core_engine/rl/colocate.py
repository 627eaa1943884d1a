"""The trainer's colocated engine and the update settings that follow from its dtype."""

from __future__ import annotations

from typing import Any

import torch

from core_engine.engine import load_engine
from core_engine.model import CausalLM
from core_engine.rl.config import GRPOConfig
from core_engine.rl.update import UpdateSettings
from core_engine.scheduler import EngineConfig, InferenceScheduler

DEFAULT_TIS_CAP = 2.0
# The engine shares the device with the trainer's weights, gradients and optimizer state
# (allocated at the first step, after the engine is sized): TRL's colocation default.
COLOCATED_GPU_MEMORY_UTILIZATION = 0.3


def colocated_engine(
    config: GRPOConfig, model: CausalLM, tokenizer: Any, max_seq_len: int, version: int
) -> InferenceScheduler:
    """The engine that generates the job's rollouts: sized for the job (`max_seq_len` is its
    longest prompt + `max_tokens`), serving `model` itself when the dtypes match."""
    return load_engine(
        model,
        EngineConfig(
            max_batch_size=config.engine_batch_size,
            max_seq_len=max_seq_len,
            kv_strategy=config.kv_strategy,
            kv_cache_bytes=config.kv_cache_bytes,
            gpu_memory_utilization=config.gpu_memory_utilization
            or COLOCATED_GPU_MEMORY_UTILIZATION,
        ),
        tokenizer=tokenizer,
        checkpoint=config.model,
        device=model.lm_head.weight.device,
        dtype=config.engine_dtype,
        policy_version=version,
    )


def update_settings(config: GRPOConfig, engine: InferenceScheduler) -> UpdateSettings:
    """Truncated importance sampling is on (cap 2.0) unless the engine computes in fp32 like
    the trainer; on CUDA a low-precision engine's dtype is also the trainer's autocast, except
    with LoRA, whose base already is in the engine's dtype and whose adapter computes in fp32."""
    engine_dtype = engine.model.lm_head.weight.dtype
    low_precision = engine_dtype != torch.float32
    tis_cap = config.tis_cap
    if tis_cap is None:
        tis_cap = DEFAULT_TIS_CAP if low_precision else 0.0
    on_cuda = engine.model.lm_head.weight.device.type == "cuda"
    return UpdateSettings(
        temperature=config.temperature,
        clip_eps=config.clip_eps,
        kl_coef=config.kl_coef,
        max_tokens=config.max_tokens_per_micro_batch,
        chunk_rows=config.logit_chunk_rows,
        checkpointing=config.gradient_checkpointing,
        tis_cap=tis_cap,
        autocast=engine_dtype if on_cuda and low_precision and config.lora is None else None,
    )
