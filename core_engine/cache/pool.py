"""The KV pool (buffer + strategy + request slots) and the task-id -> allocation map."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from core_engine.cache.buffer import KVBuffer, RequestPool
from core_engine.cache.strategy import (
    AllocationStrategy,
    ContiguousStrategy,
    PagedStrategy,
    TaskCacheState,
)


class KVPool:
    """Physical K/V storage with the strategy that hands out its slots."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_requests: int,
        max_seq_len: int,
        strategy: str = "paged",
        page_size: int = 16,
        num_pages: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self._req_pool = RequestPool(max_requests, max_seq_len, device)
        if strategy == "paged":
            if num_pages is None:
                raise ValueError("a paged pool needs num_pages (see cache/sizing.py: plan_kv)")
            self._strategy: AllocationStrategy = PagedStrategy(self._req_pool, num_pages, page_size)
        elif strategy == "contiguous":
            self._strategy = ContiguousStrategy(self._req_pool)
        else:
            raise ValueError(f"unknown KV strategy {strategy!r}; choose paged or contiguous")
        # One slot past the strategy's: a scratch slot that absorbs the K/V writes of padded
        # rows (CUDA-graph batches); no table ever points a real token at it.
        self.scratch_slot = self._strategy.num_slots
        self.buffer = KVBuffer(
            num_layers, self._strategy.num_slots + 1, num_kv_heads, head_dim, dtype, device
        )

    @classmethod
    def for_model(cls, model: torch.nn.Module, **sizes: Any) -> KVPool:
        """A pool shaped for `model` (layers, KV heads, head dim, dtype, device)."""
        cfg = model.config
        param = next(model.parameters())
        return cls(
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dtype=param.dtype,
            device=param.device,
            **sizes,
        )

    @property
    def strategy(self) -> AllocationStrategy:
        return self._strategy

    @property
    def req_pool(self) -> RequestPool:
        return self._req_pool

    @property
    def kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.buffer.layers


class TaskCacheManager:
    """The only map from task ids to their cache state; every change rolls back on failure."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.states: dict[int, TaskCacheState] = {}

    def allocate(self, task_id: int, token_ids: Sequence[int], version: int) -> int | None:
        """Slots for a task's tokens; the count of leading tokens found cached, or None when
        there is no room now (nothing held)."""
        if task_id in self.states:
            raise ValueError(f"task {task_id} already holds cache")
        state = self._new_state()
        if state is None:
            return None
        cached = self.pool.strategy.allocate(state, token_ids, version)
        if cached is None:
            self.pool.req_pool.free(state.req_slot)
            return None
        self.states[task_id] = state
        return cached

    def fork(self, parent_id: int, child_ids: Sequence[int], num_tokens: int) -> int:
        """Share the parent's first `num_tokens` of context with new child tasks, in order,
        until the pool has no room; returns how many were forked (the rest hold nothing).
        Their private slots (a partially filled page) are copied in one pass over the layers."""
        copies = []
        for child_id in child_ids:
            state = self._new_state()
            if state is None:
                break
            copy = self.pool.strategy.fork(self.states[parent_id], state, num_tokens)
            if copy is None:
                self.pool.req_pool.free(state.req_slot)
                break
            copies.append(copy)
            self.states[child_id] = state
        if copies:
            src = torch.cat([copy.src for copy in copies])
            self.pool.buffer.copy_slots(src, torch.cat([copy.dst for copy in copies]))
        return len(copies)

    def extend(self, task_id: int, num_tokens: int) -> bool:
        return self.pool.strategy.extend(self.states[task_id], num_tokens)

    def publish(self, task_id: int, token_ids: Sequence[int], version: int) -> None:
        self.pool.strategy.publish(self.states[task_id], token_ids, version)

    def unpublish(self, task_id: int) -> None:
        """Withdraw a task's pages from the prefix cache (their K/V may be unusable)."""
        state = self.states.get(task_id)
        if state is not None:
            self.pool.strategy.unpublish(state)

    def free(
        self, task_id: int, computed_ids: Sequence[int] = (), version: int | None = None
    ) -> None:
        """Release a task's slots, first publishing its computed pages when a version is given."""
        state = self.states.pop(task_id, None)
        if state is None:
            return
        if version is not None and computed_ids:
            self.pool.strategy.publish(state, computed_ids, version)
        self.pool.strategy.release(state)
        self.pool.req_pool.free(state.req_slot)

    def req_slot(self, task_id: int) -> int:
        return self.states[task_id].req_slot

    def holds(self, task_id: int) -> bool:
        return task_id in self.states

    def check_integrity(self) -> None:
        self.pool.strategy.check_integrity(self.states.values())

    def _new_state(self) -> TaskCacheState | None:
        slot = self.pool.req_pool.allocate()
        return None if slot is None else TaskCacheState(req_slot=slot)
