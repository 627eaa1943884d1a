"""The batching policy: queues, admission, preemption and group forks.

No model, no lock, no loop: it decides which tasks run in the next step and holds their KV
allocations through the cache manager. Continuous batching: a step either prefills newly
admitted tasks or decodes every running one. A running task that cannot grow preempts the
newest other task (its KV is released and recomputed later, its tokens kept); only a task that
cannot grow even alone is reported exhausted.

Prompts admitted together share their common full pages: each admitted task's pages are
published to the prefix cache before the prefill runs, so a later task of the same batch maps
them instead of computing them again (the prefill writes every K/V before attending).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from core_engine.cache import TaskCacheManager
from core_engine.task import Task, TaskStatus


@dataclass
class PrefillBatch:
    tasks: list[Task] = field(default_factory=list)  # their uncomputed tokens are prefilled
    forks: list[tuple[Task, list[Task]]] = field(default_factory=list)  # (leader, siblings)
    computed_tokens: int = 0  # prompt tokens the forward computes (hits and forks excluded)


@dataclass
class DecodeBatch:
    tasks: list[Task] = field(default_factory=list)
    preempted: list[Task] = field(default_factory=list)
    exhausted: list[Task] = field(default_factory=list)  # cannot grow even alone


class BatchingPolicy:
    """FIFO admission under request-slot, page and prefill-token limits."""

    def __init__(
        self, cache: TaskCacheManager, max_batch_size: int, max_prefill_tokens: int
    ) -> None:
        self.cache = cache
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Task] = deque()
        self.running: list[Task] = []

    def add(self, task: Task) -> None:
        self.waiting.append(task)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def started(self) -> list[Task]:
        """Running tasks and preempted ones waiting to resume (what an update drains)."""
        return [*self.running, *(t for t in self.waiting if t.output_ids)]

    def remove(self, task: Task) -> None:
        """Take a finished task out of whichever queue holds it."""
        if task in self.running:
            self.running.remove(task)
        elif task in self.waiting:
            self.waiting.remove(task)

    def schedule_prefill(self, version: int, admit_fresh: bool = True) -> PrefillBatch:
        """Admit waiting tasks (FIFO) while request slots, pages and the token budget allow.
        Untouched samples of the same group right behind an admitted task become its forks.
        Without `admit_fresh` (the update drain) only started tasks are resumed, no fork."""
        batch = PrefillBatch()
        budget = self.max_prefill_tokens
        free_slots = self.max_batch_size - len(self.running)
        while free_slots > 0 and (task := self._next_waiting(admit_fresh)) is not None:
            if batch.tasks and task.num_tokens > budget:
                break
            cached = self.cache.allocate(task.task_id, task.all_ids, version)
            if cached is None:
                break
            self.cache.publish(task.task_id, task.all_ids, version)  # shared while prefilled
            self.waiting.remove(task)
            free_slots -= 1
            budget -= task.num_tokens - cached
            batch.computed_tokens += task.num_tokens - cached
            task.num_computed_tokens = cached
            if task.num_preemptions == 0:
                task.num_cached_prompt_tokens = cached
            self._admit(task, version)
            batch.tasks.append(task)
            siblings = []
            while admit_fresh and self.waiting and free_slots > 0:
                if not _is_fresh_sibling(self.waiting[0], task):
                    break
                siblings.append(self.waiting.popleft())
                free_slots -= 1
            if siblings:
                batch.forks.append((task, siblings))
        return batch

    def fork(self, leader: Task, siblings: Sequence[Task], version: int) -> list[Task]:
        """Share the leader's prompt KV with its group siblings; returns those forked. The
        ones the pool has no room for go back to the front of the queue, in order."""
        count = self.cache.fork(leader.task_id, [t.task_id for t in siblings], leader.num_tokens)
        self.waiting.extendleft(reversed(siblings[count:]))
        for child in siblings[:count]:
            child.num_computed_tokens = child.num_cached_prompt_tokens = leader.num_tokens
            self._admit(child, version)
        return list(siblings[:count])

    def schedule_decode(self, version: int) -> DecodeBatch:
        """Every running task gets a slot for its next token; when the pool is full, the
        newest other task is preempted (recomputed later)."""
        batch = DecodeBatch()
        pending = list(self.running)
        while pending:
            task = pending.pop(0)
            while not self.cache.extend(task.task_id, task.num_tokens):
                if pending:
                    victim = pending.pop()
                elif batch.tasks:
                    victim = task
                else:
                    batch.exhausted.append(task)
                    break
                self.preempt(victim, version)
                batch.preempted.append(victim)
                if victim is task:
                    break
            else:
                batch.tasks.append(task)
        return batch

    def preempt(self, task: Task, version: int) -> None:
        """Release a running task's KV (its computed pages stay cached when `version`
        computed all of them) and requeue it first."""
        computed = task.all_ids[: task.num_computed_tokens]
        self.cache.free(task.task_id, computed, version if task.kv_version == version else None)
        task.kv_version = None
        self.running.remove(task)
        task.status = TaskStatus.WAITING
        task.num_computed_tokens = 0
        task.num_preemptions += 1
        self.waiting.appendleft(task)

    def _next_waiting(self, admit_fresh: bool) -> Task | None:
        if admit_fresh:
            return self.waiting[0] if self.waiting else None
        return next((t for t in self.waiting if t.output_ids), None)

    def _admit(self, task: Task, version: int) -> None:
        """Running under `version`: its K/V is (re)computed by it; a resumed task keeps the
        version of its first token."""
        task.status = TaskStatus.RUNNING
        if task.policy_version is None:
            task.policy_version = version
        if task.output_ids:  # resumed after a preemption: its K/V is recomputed now
            task.resumed_at.append(len(task.output_ids))
        task.kv_version = version
        task.admit_time = task.admit_time or time.perf_counter()
        self.running.append(task)


def _is_fresh_sibling(task: Task, leader: Task) -> bool:
    return (
        task.group_id is not None
        and task.group_id == leader.group_id
        and task.prompt_ids == leader.prompt_ids
        and not task.output_ids
        and not leader.output_ids
    )
