"""The inference scheduler: one step function behind `run_batch` and the serving loop.

Continuous batching: each step either prefills newly admitted tasks or decodes every running
one; finished tasks leave, waiting tasks join as room frees up. A batch larger than capacity
therefore runs in waves. A running task that cannot grow preempts the newest other task
(its KV is released and recomputed later, its tokens kept); only a task that cannot fit even
alone ends with `error/kv_exhausted`.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core_engine.cache import KVPool, TaskCacheManager
from core_engine.metrics import EngineMetrics
from core_engine.model import CausalLM, checkpoint_eos_ids, load_model
from core_engine.outcomes import admission_error, stop_reason
from core_engine.policy import PolicyUpdates
from core_engine.runtime.executor import Executor
from core_engine.runtime.sample import SampleOutput
from core_engine.serving import RequestHandle, ServingLoop
from core_engine.task import (
    ErrorCode,
    FinishReason,
    GenerationResult,
    SamplingParams,
    Task,
    TaskError,
    TaskStatus,
)


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 32  # request slots: tasks running at once
    max_seq_len: int | None = None  # default: the model's context
    kv_strategy: str = "paged"
    page_size: int = 16
    num_pages: int | None = None  # default: enough for max_batch_size full contexts
    max_prefill_tokens: int = 8192
    eos_token_ids: tuple[int, ...] = ()
    cuda_graph: bool = True  # capture decode graphs when serving on CUDA


class InferenceScheduler(PolicyUpdates):
    """Owns the model, the KV pool and the queues; every mutation happens under `self.lock`."""

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        tokenizer: Any = None,
        policy_version: int = 0,
    ) -> None:
        self.config = config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        self._init_policy(policy_version)
        mc = model.config
        self.max_seq_len = min(config.max_seq_len or mc.max_context, mc.max_context)
        self.pool = KVPool.for_model(
            model,
            max_requests=config.max_batch_size,
            max_seq_len=self.max_seq_len,
            strategy=config.kv_strategy,
            page_size=config.page_size,
            num_pages=config.num_pages,
        )
        self.cache = TaskCacheManager(self.pool)
        self.executor = Executor(model, self.cache, config.cuda_graph)
        self.metrics = EngineMetrics()
        self.eos_token_ids = frozenset(config.eos_token_ids)
        self.lock = threading.RLock()
        self.waiting: deque[Task] = deque()
        self.running: list[Task] = []
        self.loop = ServingLoop(self)
        self._in_step: list[Task] = []
        self._group_ids = itertools.count()
        self._seeds = random.Random()

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        config: EngineConfig | None = None,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
    ) -> InferenceScheduler:
        """Load a local checkpoint directory with its tokenizer and EOS ids."""
        from dataclasses import replace

        from transformers import AutoTokenizer

        config = config or EngineConfig()
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        eos = set(config.eos_token_ids) | set(checkpoint_eos_ids(path))
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        config = replace(config, eos_token_ids=tuple(sorted(eos)))
        return cls(load_model(path, dtype, device), config, tokenizer)

    # ----------------------------------------------------------------- synchronous API
    def run_batch(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        samples_per_prompt: int = 1,
        return_logprobs: bool = True,
    ) -> list[GenerationResult]:
        """Generate for every prompt on the caller's thread; one result per request, in order
        (prompt-major: the `samples_per_prompt` samples of prompt 0 first)."""
        self.no_update_pending.wait()
        with self.lock:
            tasks = self.make_tasks(prompts, params, samples_per_prompt)
            self.enqueue(tasks)
            while not all(t.finished for t in tasks):
                self.step(return_logprobs)
            return [GenerationResult.from_task(t) for t in tasks]

    def make_tasks(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        samples_per_prompt: int = 1,
    ) -> list[Task]:
        """Tasks for each prompt: `samples_per_prompt` of them, one group sharing the prompt.

        `params` is one for all, one per prompt (sample k is seeded `seed + k`), or one per
        sample (prompt-major; each seeded with its own `seed`). Invalid tasks carry their
        admission error and finish when enqueued."""
        g = samples_per_prompt
        if g < 1:
            raise ValueError(f"samples_per_prompt must be >= 1, got {g}")
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) == len(prompts):
            per_sample = [(p, k) for p in params for k in range(g)]
        elif len(params) == len(prompts) * g:
            per_sample = [(p, 0) for p in params]
        else:
            raise ValueError(
                f"{len(prompts)} prompts x {g} samples but {len(params)} sampling params"
            )
        tasks = []
        for i, prompt in enumerate(prompts):
            group = next(self._group_ids) if g > 1 else None
            random_base = self._seeds.getrandbits(62)
            for p, k in per_sample[i * g : (i + 1) * g]:
                base_seed = p.seed if isinstance(p.seed, int) else random_base
                task = Task(prompt_ids=list(prompt), params=p, group_id=group)
                task.arrival_time = time.perf_counter()
                task.error = admission_error(
                    task,
                    self.model.config.vocab_size,
                    self.max_seq_len,
                    self.pool.strategy.can_ever_fit,
                    self.tokenizer is not None,
                )
                if task.error is None:
                    task.generator = torch.Generator(device=self.executor.device)
                    task.generator.manual_seed(base_seed + k)
                self.metrics.on_arrival(task.task_id)
                tasks.append(task)
        return tasks

    def enqueue(self, tasks: Sequence[Task]) -> None:
        """Queue valid tasks; finish invalid ones with their error at once."""
        with self.lock:
            for task in tasks:
                if task.error is not None:
                    self._finish(task, FinishReason.ERROR, task.error)
                else:
                    self.waiting.append(task)
            self._update_gauges()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ----------------------------------------------------------------- serving API
    def start(self) -> None:
        """Start the background serving loop."""
        self.loop.start()

    def stop(self) -> None:
        """Stop the serving loop; tasks still queued or running end `abort/cancelled`."""
        self.loop.stop()

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None, n: int = 1
    ) -> list[RequestHandle]:
        """Queue `n` samples of one prompt for the serving loop; returns streaming handles."""
        return self.loop.submit(prompt_ids, params or SamplingParams(), n)

    def cancel(self, task_id: int) -> None:
        """Ask the serving loop to end a task with `abort/cancelled` at the next step boundary."""
        self.loop.cancel(task_id)

    def abort(self, task: Task, code: ErrorCode, message: str) -> None:
        """End a queued or running task now (caller holds the lock)."""
        with self.lock:
            if not task.finished:
                self._finish(task, FinishReason.ABORT, TaskError(code, message))

    # ----------------------------------------------------------------- the step
    def step(self, return_logprobs: bool = True, admit_fresh: bool = True) -> None:
        """Run one prefill or decode step over the queues. Exceptions inside fail that step's
        tasks with `error/internal`; the scheduler stays usable. With `admit_fresh=False`
        only preempted requests are (re)admitted: the weight-update drain."""
        with self.lock:
            self._in_step = []
            try:
                self._step(return_logprobs, admit_fresh)
            except Exception as exc:  # any fault in a step fails only its tasks
                error = TaskError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")
                for task in self._in_step:
                    if not task.finished:
                        self._finish(task, FinishReason.ERROR, error)
            finally:
                self._in_step = []
                self._update_gauges()

    def _step(self, return_logprobs: bool, admit_fresh: bool) -> None:
        prefill, forks = self._schedule_prefill(admit_fresh)
        if prefill:
            logits = self.executor.forward_prefill(prefill)
            for task in prefill:
                task.num_computed_tokens = task.num_tokens
                self.cache.publish(task.task_id, task.all_ids, self.version)
            rows = list(range(len(prefill)))
            forked = []
            for child, leader in forks:
                if self._fork(child, leader):
                    forked.append(child)
                    rows.append(prefill.index(leader))
            tasks = prefill + forked
            out = self.executor.sample(tasks, logits[rows], return_logprobs)
        else:
            tasks = self._schedule_decode()
            if not tasks:
                if admit_fresh:
                    self._fail_unschedulable_head()
                return
            out = self.executor.execute_decode(tasks, return_logprobs)
            for task in tasks:
                task.num_computed_tokens = task.num_tokens
        self._postprocess(tasks, out)

    def _schedule_prefill(self, admit_fresh: bool) -> tuple[list[Task], list[tuple[Task, Task]]]:
        """Admit waiting tasks (FIFO) while request slots, pages and the token budget allow.
        Untouched samples of the same group right behind an admitted task become its forks.
        Without `admit_fresh` (the update drain) only started tasks are resumed, no fork."""
        batch: list[Task] = []
        forks: list[tuple[Task, Task]] = []
        budget = self.config.max_prefill_tokens
        free_slots = self.config.max_batch_size - len(self.running)
        while free_slots > 0 and (task := self._next_waiting(admit_fresh)) is not None:
            if batch and task.num_tokens > budget:
                break
            cached = self.cache.allocate(task.task_id, task.all_ids, self.version)
            if cached is None:
                break
            self.waiting.remove(task)
            free_slots -= 1
            budget -= task.num_tokens - cached
            self.metrics.on_prefill(task.num_tokens - cached)
            task.num_computed_tokens = cached
            if task.num_preemptions == 0:
                task.num_cached_prompt_tokens = cached
            self._admit(task)
            batch.append(task)
            while (
                admit_fresh
                and self.waiting
                and free_slots > 0
                and _is_fresh_sibling(self.waiting[0], task)
            ):
                child = self.waiting.popleft()
                self._in_step.append(child)  # failed with the step if the prefill raises
                forks.append((child, task))
                free_slots -= 1
        return batch, forks

    def _next_waiting(self, admit_fresh: bool) -> Task | None:
        if admit_fresh:
            return self.waiting[0] if self.waiting else None
        return next((t for t in self.waiting if t.output_ids), None)

    def _fork(self, child: Task, leader: Task) -> bool:
        """Share the leader's prompt KV with a group sibling; requeue it when out of room."""
        if not self.cache.fork(leader.task_id, child.task_id, leader.num_tokens):
            self.waiting.appendleft(child)
            return False
        child.num_computed_tokens = child.num_cached_prompt_tokens = leader.num_tokens
        self._admit(child)
        return True

    def _admit(self, task: Task) -> None:
        task.status = TaskStatus.RUNNING
        task.policy_version = self.version
        task.admit_time = task.admit_time or time.perf_counter()
        self.running.append(task)
        self._in_step.append(task)

    def _schedule_decode(self) -> list[Task]:
        """Every running task gets a slot for its next token; when the pool is full, the
        newest other task is preempted (recomputed later)."""
        scheduled: list[Task] = []
        pending = list(self.running)
        while pending:
            task = pending.pop(0)
            while not self.cache.extend(task.task_id, task.num_tokens):
                if pending:
                    self._preempt(pending.pop())
                elif scheduled:
                    self._preempt(task)
                    break
                else:
                    self._finish(
                        task,
                        FinishReason.ERROR,
                        TaskError(
                            ErrorCode.KV_EXHAUSTED,
                            f"KV pool cannot hold {task.num_tokens} tokens, even for this "
                            "request alone",
                        ),
                    )
                    break
            else:
                scheduled.append(task)
                self._in_step.append(task)
        return scheduled

    def _preempt(self, task: Task) -> None:
        self.cache.free(task.task_id, task.all_ids[: task.num_computed_tokens], self.version)
        self.running.remove(task)
        task.status = TaskStatus.WAITING
        task.num_computed_tokens = 0
        task.num_preemptions += 1
        self.waiting.appendleft(task)
        self.metrics.on_preempt()

    def _fail_unschedulable_head(self) -> None:
        """Nothing ran and nothing could be admitted: the head can never fit."""
        if self.waiting and not self.running:
            task = self.waiting[0]
            self._finish(
                task,
                FinishReason.ERROR,
                TaskError(ErrorCode.KV_EXHAUSTED, "request does not fit the empty KV pool"),
            )

    def _postprocess(self, tasks: Sequence[Task], out: SampleOutput) -> None:
        now = time.perf_counter()
        for i, task in enumerate(tasks):
            if not out.finite[i]:
                self._finish(
                    task,
                    FinishReason.ERROR,
                    TaskError(ErrorCode.NON_FINITE_LOGITS, "the model produced NaN/inf logits"),
                )
                continue
            assert task.policy_version == self.version, "a request would mix policy versions"
            task.output_ids.append(out.token_ids[i])
            if out.logprobs:
                task.output_logprobs.append(out.logprobs[i])
                task.output_temp_logprobs.append(out.temp_logprobs[i])
            if task.first_token_time is None:
                task.first_token_time = now
            self.loop.on_token(task)
            reason = stop_reason(task, self.eos_token_ids, self.max_seq_len, self.tokenizer)
            if reason is not None:
                self._finish(task, reason)

    def _finish(self, task: Task, reason: FinishReason, error: TaskError | None = None) -> None:
        """The single exit: release cache and slot, record metrics, notify listeners."""
        task.finish(reason, error)
        task.finish_time = time.perf_counter()
        if task.policy_version is None:
            task.policy_version = self.version
        computed = task.all_ids[: task.num_computed_tokens]
        healthy = reason in (FinishReason.STOP, FinishReason.LENGTH)
        self.cache.free(task.task_id, computed, self.version if healthy else None)
        if task in self.running:
            self.running.remove(task)
        elif task in self.waiting:
            self.waiting.remove(task)
        if task.text is None and self.tokenizer is not None:
            task.text = self.tokenizer.decode(task.output_ids, skip_special_tokens=True)
        result = GenerationResult.from_task(task)
        self.metrics.on_finish(result)
        self.loop.on_finish(task, result)

    # ----------------------------------------------------------------- introspection
    def is_idle(self) -> bool:
        """No queued or running task, no cache held, no request in flight."""
        with self.lock:
            return (
                not self.waiting
                and not self.running
                and not self.cache.states
                and self.metrics.in_flight == 0
            )

    def check_integrity(self) -> None:
        with self.lock:
            self.cache.check_integrity()
            held = set(self.cache.states)
            assert held == {t.task_id for t in self.running}, "cache held by a task not running"

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                **self.metrics.snapshot(),
                **self.pool.strategy.usage(),
                "policy_version": self.version,
            }

    def _update_gauges(self) -> None:
        self.metrics.set_queues(len(self.running), len(self.waiting))


def _is_fresh_sibling(task: Task, leader: Task) -> bool:
    return (
        task.group_id is not None
        and task.group_id == leader.group_id
        and task.prompt_ids == leader.prompt_ids
        and not task.output_ids
        and not leader.output_ids
    )
