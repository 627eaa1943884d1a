"""The inference engine: one step function behind `run_batch` and the serving loop.

`InferenceScheduler` owns the model, the KV pool, the executor, the metrics, the lock and the
policy version; which tasks run in a step is the `BatchingPolicy`'s decision. Each `step()`
returns its token and finish events, which also go to the registered listeners (the serving
loop dispatches them to its handles). A request's bad input or numeric fault ends that request
alone; nothing escapes `run_batch`; the pool returns to idle.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from core_engine.batching import BatchingPolicy
from core_engine.cache import KVPool, TaskCacheManager
from core_engine.config import EngineConfig, plan_for
from core_engine.events import EngineEvent, FinishEvent, TokenEvent
from core_engine.intake import TaskIntake
from core_engine.metrics import EngineMetrics
from core_engine.model import CausalLM
from core_engine.outcomes import decode_text, stop_reason
from core_engine.runtime.executor import Executor
from core_engine.runtime.sample import SampleOutput
from core_engine.task import (
    ErrorCode,
    FinishReason,
    GenerationResult,
    SamplingParams,
    Task,
    TaskError,
)
from core_engine.weight_sync import StepGate, WeightSource
from core_engine.weight_updates import (
    WeightUpdateAck,
    barrier,
    check_mode,
    copy_weights,
    next_version,
    served_update,
)
from core_engine.weights import update_digest

log = logging.getLogger(__name__)
Listener = Callable[[Sequence[EngineEvent]], None]


class InferenceScheduler:
    """Every mutation of queues, pool and version happens under `self.lock`, the engine's
    gate (`core_engine.weight_sync.StepGate`): each step holds it, a weight update takes it
    ahead of the next step. `weight_source` (None: weights change only by `update_weights`
    from this process) is polled first thing in each step: a child process's channel."""

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
        self.version = policy_version
        self.kv_plan = plan = plan_for(model, config)
        self.max_seq_len = plan.max_seq_len
        self.pool = KVPool.for_model(model, **plan.pool_sizes())
        log.info("KV pool: %s", plan)
        self.cache = TaskCacheManager(self.pool)
        self.executor = Executor(model, self.cache, config.cuda_graph)
        self.batching = BatchingPolicy(
            self.cache, self.kv_plan.max_requests, config.max_prefill_tokens
        )
        self.intake = TaskIntake(
            model.config.vocab_size,
            self.max_seq_len,
            self.pool.strategy.can_ever_fit,
            tokenizer is not None,
            self.executor.device,
        )
        self.metrics = EngineMetrics()
        self.eos_token_ids = frozenset(config.eos_token_ids)
        self.lock = StepGate()
        self.weight_source: WeightSource | None = None
        self._listeners: list[Listener] = []
        self._outbox: list[EngineEvent] = []

    # ----------------------------------------------------------------- requests
    def run_batch(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        samples_per_prompt: int = 1,
        return_logprobs: bool = True,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> list[GenerationResult]:
        """Generate for every prompt on the caller's thread; one result per request, in order
        (prompt-major: prompt 0's samples first), `abort/cancelled` once `cancelled()` is true
        (asked before each step). Only a malformed call raises, queueing nothing (`make_tasks`).
        A pending weight update lands between two steps (see `update_weights`' modes)."""
        tasks = self.make_tasks(prompts, params, samples_per_prompt, return_logprobs)
        try:
            self.enqueue(tasks)
            while not all(t.finished for t in tasks) and not cancelled():
                self.step()
            for task in tasks:  # the unfinished ones were cancelled
                self.abort(task, ErrorCode.CANCELLED, "the request was cancelled")
        except Exception as exc:  # a bug outside any step: end these requests, not the caller
            log.exception("run_batch failed outside a step")
            with self.lock:
                self._fail(tasks, exc)
                self._publish()
        return [GenerationResult.from_task(t) for t in tasks]

    def make_tasks(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        samples_per_prompt: int = 1,
        return_logprobs: bool = True,
    ) -> list[Task]:
        """Validated tasks (see `TaskIntake.make_tasks`), counted in flight until they finish."""
        tasks = self.intake.make_tasks(prompts, params, samples_per_prompt, return_logprobs)
        for task in tasks:
            self.metrics.on_arrival(task.task_id)
        return tasks

    def enqueue(self, tasks: Sequence[Task]) -> list[EngineEvent]:
        """Queue valid tasks; finish invalid ones with their error at once."""
        with self.lock:
            for task in tasks:
                if task.error is not None:
                    self._finish(task, FinishReason.ERROR, task.error)
                else:
                    self.batching.add(task)
            return self._publish()

    def abort(self, task: Task, code: ErrorCode, message: str) -> list[EngineEvent]:
        """End a queued or running task now with `abort` and `code`."""
        with self.lock:
            if not task.finished:
                self._finish(task, FinishReason.ABORT, TaskError(code, message))
            return self._publish()

    def add_listener(self, listener: Listener) -> None:
        """Also deliver every batch of events to `listener` (called under the lock)."""
        self._listeners.append(listener)

    def has_work(self) -> bool:
        return self.batching.has_work()

    # ----------------------------------------------------------------- the step
    def step(self, admit_fresh: bool = True) -> list[EngineEvent]:
        """Run one prefill or decode step; returns its events. An exception inside fails that
        step's tasks with `error/internal`; the engine stays usable. With `admit_fresh=False`
        only preempted requests are (re)admitted: the weight-update drain."""
        if self.weight_source is None:
            return self._locked_step(admit_fresh)
        with self.weight_source.serving(self):
            return self._locked_step(admit_fresh)

    def _locked_step(self, admit_fresh: bool) -> list[EngineEvent]:
        with self.lock:
            in_step: list[Task] = []
            try:
                self._step(admit_fresh, in_step)
            except Exception as exc:  # any fault in a step fails only its tasks
                log.exception("engine step failed")
                self._fail(in_step, exc)
            return self._publish()

    def _step(self, admit_fresh: bool, in_step: list[Task]) -> None:
        batching, version = self.batching, self.version
        prefill = batching.schedule_prefill(version, admit_fresh)
        if prefill.tasks:
            in_step += prefill.tasks + [
                child for _, siblings in prefill.forks for child in siblings
            ]
            self.metrics.on_prefill(prefill.computed_tokens)
            logits = self.executor.forward_prefill(prefill.tasks)
            for task in prefill.tasks:
                task.num_computed_tokens = task.num_tokens
            rows = list(range(len(prefill.tasks)))
            tasks = list(prefill.tasks)
            for leader, siblings in prefill.forks:
                forked = batching.fork(leader, siblings, version)
                tasks += forked
                rows += [prefill.tasks.index(leader)] * len(forked)
            out = self.executor.sample(tasks, logits[rows], _wants_logprobs(tasks))
            self._postprocess(tasks, out)
        elif batching.running:
            decode = batching.schedule_decode(version)
            for _ in decode.preempted:
                self.metrics.on_preempt()
            for task in decode.exhausted:
                message = f"KV pool cannot hold {task.num_tokens} tokens, even for this one alone"
                self._error(task, ErrorCode.KV_EXHAUSTED, message)
            if decode.tasks:
                in_step += decode.tasks
                out = self.executor.execute_decode(decode.tasks, _wants_logprobs(decode.tasks))
                for task in decode.tasks:
                    task.num_computed_tokens = task.num_tokens
                self._postprocess(decode.tasks, out)
        elif admit_fresh and batching.waiting:  # the pool is empty and the head still cannot fit
            message = "request does not fit the empty KV pool"
            self._error(batching.waiting[0], ErrorCode.KV_EXHAUSTED, message)

    def _postprocess(self, tasks: Sequence[Task], out: SampleOutput) -> None:
        now = time.perf_counter()
        for i, task in enumerate(tasks):
            if not out.finite[i]:
                message = "NaN/inf logits, or a temperature that overflows them"
                self._error(task, ErrorCode.NON_FINITE_LOGITS, message)
                continue
            logprob = out.logprobs[i] if task.return_logprobs else None
            temp_logprob = out.temp_logprobs[i] if task.return_logprobs else None
            task.record_token(out.token_ids[i], logprob, temp_logprob, self.version, now)
            index = len(task.output_ids) - 1
            self._outbox.append(
                TokenEvent(task.task_id, index, out.token_ids[i], logprob, temp_logprob)
            )
            try:
                reason = stop_reason(task, self.eos_token_ids, self.max_seq_len, self.tokenizer)
            except Exception as exc:  # e.g. a tokenizer that cannot decode this request's tokens
                self._error(task, ErrorCode.INTERNAL, f"stop check: {type(exc).__name__}: {exc}")
                continue
            if reason is not None:
                self._finish(task, reason)

    def _finish(self, task: Task, reason: FinishReason, error: TaskError | None = None) -> None:
        """The single exit: release cache and slot, record metrics, queue the finish event."""
        task.finish(reason, error)
        task.finish_time = time.perf_counter()
        if task.policy_version is None:
            task.policy_version = self.version
        computed = task.all_ids[: task.num_computed_tokens]
        # Published only when the current version computed all of its K/V (not in flight)
        healthy = reason in (FinishReason.STOP, FinishReason.LENGTH)
        if reason is FinishReason.ERROR:  # its pages may hold garbage: never hit them again
            self.cache.unpublish(task.task_id)
        clean = healthy and task.kv_version == self.version
        self.cache.free(task.task_id, computed, self.version if clean else None)
        self.batching.remove(task)
        if task.text is None and self.tokenizer is not None:
            task.text = decode_text(self.tokenizer, task.output_ids)
        result = GenerationResult.from_task(task)
        self.metrics.on_finish(result)
        self._outbox.append(FinishEvent(result))

    def _error(self, task: Task, code: ErrorCode, message: str) -> None:
        self._finish(task, FinishReason.ERROR, TaskError(code, message))

    def _fail(self, tasks: Sequence[Task], exc: Exception) -> None:
        for task in tasks:
            if not task.finished:
                self._error(task, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _publish(self) -> list[EngineEvent]:
        events, self._outbox = self._outbox, []
        self.metrics.set_queues(len(self.batching.running), len(self.batching.waiting))
        for listener in self._listeners if events else ():
            try:
                listener(events)
            except Exception:  # a listener's fault is its own, never the step's
                log.exception("engine event listener failed")
        return events

    # ----------------------------------------------------------------- weight updates
    def update_weights(
        self, weights: Mapping[str, torch.Tensor], version: int, mode: str = "drain"
    ) -> WeightUpdateAck:
        """Serve `weights` as policy `version`, at a step boundary, and acknowledge it.

        Refuses (nothing changed) a version that is not an integer above the current one, or
        a weight set that does not fit. Requests that already have tokens are drained under the
        old weights (`mode="drain"`), ended `abort/policy_updated` (`mode="abort"`), or go on
        under the new weights from their next token (`mode="in_flight"`: each token records
        the version that sampled it; their older K/V is kept and never published to the
        prefix cache). Queued requests that have not started run under the new version. Every
        prefix-cache entry is invalidated; weights are copied in place (graphs stay valid).
        """
        start = time.perf_counter()
        check_mode(mode)
        with self.lock.writing():
            version = next_version(version, self.version)
            served = served_update(self.model, weights)
            control_start = time.perf_counter()
            aborted = barrier(self.batching, mode, self.abort, self._locked_step)
            copy_seconds = copy_weights(served, weights)
            invalidated = self.pool.strategy.invalidate()
            self.version = version
            control = time.perf_counter() - control_start - copy_seconds
            checksum = update_digest(served)
        return WeightUpdateAck(
            version, invalidated, aborted, checksum, time.perf_counter() - start, control
        )

    @contextlib.contextmanager
    def kv_released(self) -> Iterator[None]:
        """Free the KV pool's memory for the duration, e.g. the trainer's phase (vLLM's sleep
        mode). Only an idle engine sleeps; it serves nothing until it wakes, every prefix entry
        is invalidated (its K/V is gone) and decode graphs are captured again."""
        with self.lock:
            if not self.is_idle():
                raise RuntimeError("the KV pool can only be released while the engine is idle")
            self.pool.strategy.invalidate()
            self.pool.buffer.release()
            try:
                yield
            finally:
                self.pool.buffer.restore()
                self.executor = Executor(self.model, self.cache, self.config.cuda_graph)

    # ----------------------------------------------------------------- introspection
    def is_idle(self) -> bool:
        """No queued or running task, no cache held, no request in flight."""
        with self.lock:
            return (
                not self.batching.has_work()
                and not self.cache.states
                and self.metrics.in_flight == 0
            )

    def check_integrity(self) -> None:
        with self.lock:
            self.cache.check_integrity()
            held = set(self.cache.states)
            running = {t.task_id for t in self.batching.running}
            assert held == running, "cache held by a task not running"

    def stats(self) -> dict[str, Any]:
        """Metrics, pool usage, the KV sizes chosen at construction and the version."""
        with self.lock:
            return {
                **self.metrics.snapshot(),
                **self.pool.strategy.usage(),
                **self.kv_plan.stats(),
                "policy_version": self.version,
            }


def _wants_logprobs(tasks: Sequence[Task]) -> bool:
    return any(t.return_logprobs for t in tasks)
