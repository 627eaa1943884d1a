"""KV pool sizing from a byte budget and the job's real lengths.

The pool never defaults to "batch x full model context". Its size comes from a budget: an
explicit `kv_cache_bytes`, or on CUDA a fraction of the device memory still free once the
weights are loaded (like vLLM's `gpu_memory_utilization`), or on CPU `DEFAULT_CPU_KV_BYTES`.
`max_seq_len` (longest prompt + max_tokens) bounds one request. A budget that cannot hold even
one request of `max_seq_len` tokens is an `EngineSizingError` at engine construction.
The warm engines of one worker share one budget (`engines_memory_budget`), split between them
by `workers.engines.EngineCache`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

DEFAULT_CPU_KV_BYTES = 1 << 30  # 1 GiB: ~43k tokens of Qwen2.5-0.5B in fp32
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # of the free device memory after the weights


class EngineSizingError(ValueError):
    """The KV budget cannot hold one request of `max_seq_len` tokens."""


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """K and V of one token in every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def model_kv_bytes_per_token(config: object, dtype: torch.dtype) -> int:
    """`kv_bytes_per_token` for a model config (ours, `ModelConfig`, or a transformers one)."""
    layers = getattr(config, "num_layers", None) or config.num_hidden_layers
    heads = getattr(config, "num_attention_heads", None) or config.num_heads
    kv_heads = getattr(config, "num_kv_heads", None) or getattr(config, "num_key_value_heads", None)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_bytes_per_token(layers, kv_heads or heads, head_dim, dtype)


def kv_budget_bytes(
    kv_cache_bytes: int | None,
    gpu_memory_utilization: float,
    device: torch.device,
    mem_get_info: Callable[[torch.device], tuple[int, int]] | None = None,
) -> int:
    """The bytes the KV pool may take: explicit, else a fraction of free CUDA memory (read
    after the weights are loaded), else the CPU default."""
    if kv_cache_bytes is not None:
        if kv_cache_bytes <= 0:
            raise EngineSizingError(f"kv_cache_bytes must be positive, got {kv_cache_bytes}")
        return int(kv_cache_bytes)
    if device.type != "cuda":
        return DEFAULT_CPU_KV_BYTES
    if not 0 < gpu_memory_utilization <= 1:
        raise EngineSizingError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
        )
    free, _total = (mem_get_info or torch.cuda.mem_get_info)(device)
    return int(free * gpu_memory_utilization)


def engines_memory_budget(
    configured_bytes: int | None,
    device: torch.device,
    mem_get_info: Callable[[torch.device], tuple[int, int]] | None = None,
) -> int | None:
    """The bytes all warm engines of one worker share, weights and KV pools together:
    `configured_bytes`, else on CUDA `DEFAULT_GPU_MEMORY_UTILIZATION` of the device memory
    free when asked (once, when the worker's cache is made), else None: no shared budget
    (each CPU engine's pool is `DEFAULT_CPU_KV_BYTES` at most, as for a lone engine)."""
    if configured_bytes is not None:
        if configured_bytes <= 0:
            raise EngineSizingError(f"engine memory must be positive, got {configured_bytes}")
        return int(configured_bytes)
    if device.type != "cuda":
        return None
    free, _total = (mem_get_info or torch.cuda.mem_get_info)(device)
    return int(free * DEFAULT_GPU_MEMORY_UTILIZATION)


@dataclass(frozen=True)
class KVPlan:
    """The chosen pool: what `stats()` reports and the pool is built from."""

    strategy: str
    max_requests: int
    max_seq_len: int
    page_size: int
    num_pages: int  # contiguous: one "page" of max_seq_len per request slot
    bytes_per_token: int
    kv_cache_bytes: int  # the pool's K/V tensors
    budget_bytes: int | None  # None when num_pages was given explicitly

    def pool_sizes(self) -> dict[str, int | str]:
        """Keyword arguments of `KVPool` for this plan."""
        return {
            "strategy": self.strategy,
            "max_requests": self.max_requests,
            "max_seq_len": self.max_seq_len,
            "page_size": self.page_size,
            "num_pages": self.num_pages,
        }

    def stats(self) -> dict[str, int]:
        return {
            "num_pages": self.num_pages,
            "page_size": self.page_size,
            "max_seq_len": self.max_seq_len,
            "max_batch_size": self.max_requests,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_bytes_per_token": self.bytes_per_token,
        }


def plan_kv(
    *,
    strategy: str,
    max_batch_size: int,
    max_seq_len: int,
    page_size: int,
    bytes_per_token: int,
    budget_bytes: int | None,
    num_pages: int | None = None,
) -> KVPlan:
    """Pages (paged) or request slots (contiguous) that fit the budget, never more than
    `max_batch_size` full requests need; an explicit `num_pages` wins over the budget."""
    if max_seq_len < 2 or page_size < 1 or max_batch_size < 1:
        raise EngineSizingError(
            f"need max_seq_len >= 2, page_size >= 1, max_batch_size >= 1; got {max_seq_len}, "
            f"{page_size}, {max_batch_size}"
        )
    requests, page = max_batch_size, page_size
    explicit = num_pages is not None and strategy != "contiguous"
    if strategy == "contiguous":  # one region of max_seq_len slots per request slot
        slots_per_request = page = max_seq_len
        if budget_bytes is not None:
            requests = min(max_batch_size, budget_bytes // (max_seq_len * bytes_per_token))
        pages = requests
    elif explicit:
        pages = num_pages
    else:
        slots_per_request = -(-max_seq_len // page_size) * page_size
        pages = min(
            budget_bytes // (page_size * bytes_per_token),
            max_batch_size * slots_per_request // page_size,
        )
    if not explicit and pages * page < slots_per_request:
        raise EngineSizingError(
            f"a KV budget of {budget_bytes} bytes holds {pages * page} tokens at "
            f"{bytes_per_token} bytes per token, less than one request of max_seq_len="
            f"{max_seq_len}; raise kv_cache_bytes to at least "
            f"{slots_per_request * bytes_per_token} or lower max_seq_len"
        )
    if pages < 1:
        raise EngineSizingError(f"num_pages must be positive, got {pages}")
    return KVPlan(
        strategy=strategy,
        max_requests=requests,
        max_seq_len=max_seq_len,
        page_size=page,
        num_pages=pages,
        bytes_per_token=bytes_per_token,
        kv_cache_bytes=pages * page * bytes_per_token,
        budget_bytes=None if explicit else budget_bytes,
    )
