"""Thread-safe engine metrics: per-request timings and engine gauges."""

from __future__ import annotations

import statistics
import threading
from collections import Counter, deque

from core_engine.task import GenerationResult


class EngineMetrics:
    """Written by the scheduler's step, read from any thread (HTTP handlers, the UI)."""

    def __init__(self, history: int = 1024) -> None:
        self._lock = threading.Lock()
        self._in_flight: set[int] = set()
        self._recent: deque[GenerationResult] = deque(maxlen=history)
        self._finished: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._preemptions = 0
        self._tokens_generated = 0
        self._prefill_tokens = 0
        self._running = 0
        self._waiting = 0

    def on_arrival(self, task_id: int) -> None:
        with self._lock:
            self._in_flight.add(task_id)

    def on_finish(self, result: GenerationResult) -> None:
        with self._lock:
            self._in_flight.discard(result.task_id)
            self._recent.append(result)
            self._finished[result.finish_reason.value] += 1
            if result.error is not None:
                self._errors[result.error.code.value] += 1
            self._tokens_generated += len(result.output_ids)

    def on_preempt(self) -> None:
        with self._lock:
            self._preemptions += 1

    def on_prefill(self, num_tokens: int) -> None:
        """Prompt tokens actually computed (prefix hits and group forks are not)."""
        with self._lock:
            self._prefill_tokens += num_tokens

    def set_queues(self, running: int, waiting: int) -> None:
        with self._lock:
            self._running, self._waiting = running, waiting

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def snapshot(self) -> dict[str, float | int | dict[str, int]]:
        """Gauges, counters and medians of the recent requests' timings."""
        with self._lock:
            recent = list(self._recent)
            snap: dict[str, float | int | dict[str, int]] = {
                "running": self._running,
                "waiting": self._waiting,
                "in_flight": len(self._in_flight),
                "preemptions": self._preemptions,
                "tokens_generated": self._tokens_generated,
                "prefill_tokens": self._prefill_tokens,
                "finished": dict(self._finished),
                "errors": dict(self._errors),
            }
        for name, values in (
            ("queue_wait_s", [r.queue_wait_s for r in recent]),
            ("time_to_first_token_s", [r.time_to_first_token_s for r in recent]),
            ("decode_tokens_per_s", [r.decode_tokens_per_s for r in recent]),
        ):
            values = [v for v in values if v is not None]
            snap[f"median_{name}"] = statistics.median(values) if values else 0.0
        return snap
