"""Engine configuration and the KV pool plan it implies for a model."""

from __future__ import annotations

from dataclasses import dataclass

from core_engine.cache.sizing import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    KVPlan,
    kv_budget_bytes,
    model_kv_bytes_per_token,
    plan_kv,
)
from core_engine.model import CausalLM


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 32  # request slots: tasks running at once
    max_seq_len: int | None = None  # longest prompt + max_tokens of the job; default: model's
    kv_strategy: str = "paged"
    page_size: int = 16
    num_pages: int | None = None  # explicit pool size; default: from the KV byte budget
    kv_cache_bytes: int | None = None  # KV budget; default: see `cache/sizing.py`
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION  # of free CUDA memory
    max_prefill_tokens: int = 8192
    eos_token_ids: tuple[int, ...] = ()
    cuda_graph: bool = True  # capture decode graphs when serving on CUDA


def plan_for(model: CausalLM, config: EngineConfig) -> KVPlan:
    """The KV pool for `model` under `config`: `max_seq_len` capped by the model's context,
    pages from `num_pages` or from the byte budget (read now, after the weights are loaded)."""
    param = next(model.parameters())
    context = model.config.max_context
    budget = None
    if config.num_pages is None:
        budget = kv_budget_bytes(config.kv_cache_bytes, config.gpu_memory_utilization, param.device)
    return plan_kv(
        strategy=config.kv_strategy,
        max_batch_size=config.max_batch_size,
        max_seq_len=min(config.max_seq_len or context, context),
        page_size=config.page_size,
        bytes_per_token=model_kv_bytes_per_token(model.config, param.dtype),
        budget_bytes=budget,
        num_pages=config.num_pages,
    )
