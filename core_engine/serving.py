"""The background serving loop: submit, stream, cancel, over the scheduler's one step function."""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core_engine.task import ErrorCode, GenerationResult, SamplingParams, Task

if TYPE_CHECKING:
    from core_engine.scheduler import InferenceScheduler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    task_id: int
    index: int
    token_id: int
    logprob: float | None


class RequestHandle:
    """A submitted request: stream its tokens, wait for its result, or cancel it."""

    def __init__(self, task: Task, loop: ServingLoop) -> None:
        self.task_id = task.task_id
        self._loop = loop
        self._events: queue.Queue[TokenEvent | GenerationResult] = queue.Queue()
        self._result: GenerationResult | None = None

    def stream(self, timeout: float | None = None) -> Iterator[TokenEvent | GenerationResult]:
        """Token events as they are produced, then the final `GenerationResult`."""
        while self._result is None:
            event = self._events.get(timeout=timeout)
            if isinstance(event, GenerationResult):
                self._result = event
            yield event

    def result(self, timeout: float | None = None) -> GenerationResult:
        for _ in self.stream(timeout):
            pass
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        self._loop.cancel(self.task_id)


class ServingLoop:
    """Moves submitted tasks into the scheduler and steps it on a background thread."""

    def __init__(self, engine: InferenceScheduler) -> None:
        self.engine = engine
        self._wake = threading.Condition()
        self._inbox: deque[Task] = deque()
        self._cancels: set[int] = set()
        self._handles: dict[int, RequestHandle] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self.engine.lock, self._wake:
            leftovers = list(self._inbox) + list(self.engine.waiting) + list(self.engine.running)
            self._inbox.clear()
            for task in leftovers:
                self.engine.abort(task, ErrorCode.CANCELLED, "the engine was stopped")

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams, n: int
    ) -> list[RequestHandle]:
        tasks = self.engine.make_tasks([prompt_ids], [params], n)
        handles = [RequestHandle(t, self) for t in tasks]
        with self._wake:
            for task, handle in zip(tasks, handles, strict=True):
                self._handles[task.task_id] = handle
            self._inbox.extend(tasks)
            self._wake.notify_all()
        return handles

    def cancel(self, task_id: int) -> None:
        with self._wake:
            self._cancels.add(task_id)
            self._wake.notify_all()

    def on_token(self, task: Task) -> None:
        handle = self._handles.get(task.task_id)
        if handle is not None:
            logprob = task.output_logprobs[-1] if task.output_logprobs else None
            handle._events.put(
                TokenEvent(task.task_id, len(task.output_ids) - 1, task.output_ids[-1], logprob)
            )

    def on_finish(self, task: Task, result: GenerationResult) -> None:
        handle = self._handles.pop(task.task_id, None)
        if handle is not None:
            handle._events.put(result)

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._wake:
                while not (self._stopping or self._inbox or self._cancels or engine.has_work()):
                    self._wake.wait(timeout=0.05)
                if self._stopping:
                    return
                inbox, self._inbox = list(self._inbox), deque()
                cancels, self._cancels = self._cancels, set()
            try:
                engine.no_update_pending.wait()
                with engine.lock:
                    engine.enqueue(inbox)
                    self._apply_cancels(cancels)
                    if engine.has_work():
                        engine.step()
            except Exception:  # the loop must survive anything
                log.exception("engine loop iteration failed; continuing")

    def _apply_cancels(self, task_ids: set[int]) -> None:
        if not task_ids:
            return
        for task in [*self.engine.waiting, *self.engine.running]:
            if task.task_id in task_ids:
                self.engine.abort(task, ErrorCode.CANCELLED, "cancelled by the client")
