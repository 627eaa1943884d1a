"""KV cache: physical buffer, allocation strategies, prefix cache and the pool."""

from core_engine.cache.buffer import KVBuffer, RequestPool
from core_engine.cache.pool import KVPool, TaskCacheManager
from core_engine.cache.strategy import (
    AllocationStrategy,
    ContiguousStrategy,
    PagedStrategy,
    TaskCacheState,
)

__all__ = [
    "AllocationStrategy",
    "ContiguousStrategy",
    "KVBuffer",
    "KVPool",
    "PagedStrategy",
    "RequestPool",
    "TaskCacheManager",
    "TaskCacheState",
]
