"""The background serving loop above the engine: submit, stream, cancel.

The loop steps the engine on its own thread and dispatches the engine's events (whoever
stepped: the loop or a concurrent `run_batch`) to the handles of the requests it submitted.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from core_engine.events import EngineEvent, FinishEvent, TokenEvent
from core_engine.scheduler import InferenceScheduler
from core_engine.task import ErrorCode, GenerationResult, SamplingParams, Task

__all__ = ["RequestHandle", "ServingLoop", "TokenEvent"]

log = logging.getLogger(__name__)


class RequestHandle:
    """A submitted request: stream its tokens, wait for its result, or cancel it."""

    def __init__(self, task: Task, loop: ServingLoop) -> None:
        self.task_id = task.task_id
        self._loop = loop
        self._events: queue.Queue[TokenEvent | GenerationResult] = queue.Queue()
        self._result: GenerationResult | None = None
        self._sink: Callable[[TokenEvent | GenerationResult], None] | None = None
        self._guard = threading.Lock()

    def subscribe(self, sink: Callable[[TokenEvent | GenerationResult], None]) -> None:
        """Push events to `sink` (from the engine's thread) instead of `stream()`: events
        already queued first, in order. No thread waits on the handle."""
        with self._guard:
            while not self._events.empty():
                sink(self._events.get_nowait())
            self._sink = sink

    def _deliver(self, event: TokenEvent | GenerationResult) -> None:
        with self._guard:
            if self._sink is not None:
                self._sink(event)
            else:
                self._events.put(event)

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
    """Moves submitted tasks into the engine and steps it on a background thread. Requests
    submitted before `start()` wait for it; after `stop()` they end `abort/cancelled` at once."""

    def __init__(self, engine: InferenceScheduler) -> None:
        self.engine = engine
        self._wake = threading.Condition()
        self._inbox: deque[Task] = deque()
        self._cancels: set[int] = set()
        self._handles: dict[int, RequestHandle] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stopped = False
        engine.add_listener(self._dispatch)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        with self._wake:
            if self.running:
                return
            self._stopping = self._stopped = False
            self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the loop; requests still queued or running end `abort/cancelled`."""
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self.engine.lock, self._wake:
            self._stopped = True
            self._abort_all([*self._inbox, *self.engine.batching.waiting])
            self._abort_all(list(self.engine.batching.running))
            self._inbox.clear()

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None, n: int = 1
    ) -> list[RequestHandle]:
        """Queue `n` samples of one prompt; returns streaming handles."""
        tasks = self.engine.make_tasks([prompt_ids], [params or SamplingParams()], n)
        handles = [RequestHandle(t, self) for t in tasks]
        with self._wake:
            for task, handle in zip(tasks, handles, strict=True):
                self._handles[task.task_id] = handle
            if not self._stopped:
                self._inbox.extend(tasks)
                self._wake.notify_all()
                return handles
        with self.engine.lock:
            self._abort_all(tasks)
        return handles

    def cancel(self, task_id: int) -> None:
        with self._wake:
            self._cancels.add(task_id)
            self._wake.notify_all()

    def _abort_all(self, tasks: Sequence[Task]) -> None:
        for task in tasks:
            self.engine.abort(task, ErrorCode.CANCELLED, "the serving loop is stopped")

    def _dispatch(self, events: Sequence[EngineEvent]) -> None:
        for event in events:
            if isinstance(event, FinishEvent):
                handle = self._handles.pop(event.task_id, None)
                payload: TokenEvent | GenerationResult = event.result
            else:
                handle = self._handles.get(event.task_id)
                payload = event
            if handle is not None:
                handle._deliver(payload)

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
        batching = self.engine.batching
        for task in [*batching.waiting, *batching.running]:
            if task.task_id in task_ids:
                self.engine.abort(task, ErrorCode.CANCELLED, "cancelled by the client")
