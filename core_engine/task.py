"""Requests, sampling parameters and structured outcomes of the engine."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class ErrorCode(enum.StrEnum):
    EMPTY_PROMPT = "empty_prompt"
    PROMPT_TOO_LONG = "prompt_too_long"
    INVALID_TOKEN_ID = "invalid_token_id"
    INVALID_SAMPLING_PARAMS = "invalid_sampling_params"
    KV_EXHAUSTED = "kv_exhausted"
    NON_FINITE_LOGITS = "non_finite_logits"
    POLICY_UPDATED = "policy_updated"
    CANCELLED = "cancelled"
    INTERNAL = "internal"


@dataclass(frozen=True)
class TaskError:
    """Machine-readable code plus a human message for an `error` or `abort` outcome."""

    code: ErrorCode
    message: str


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings. `temperature == 0` means greedy.

    Transform order: temperature, then top-k, then top-p (on the tempered distribution).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def validation_error(self) -> str | None:
        """Why these parameters are unusable, or None when they are valid."""
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            return f"max_tokens must be a positive integer, got {self.max_tokens!r}"
        if not _finite_number(self.temperature) or self.temperature < 0:
            return f"temperature must be a finite number >= 0, got {self.temperature!r}"
        if not _finite_number(self.top_p) or not 0 < self.top_p <= 1:
            return f"top_p must be in (0, 1], got {self.top_p!r}"
        if not isinstance(self.top_k, int) or self.top_k < 0:
            return f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}"
        if self.seed is not None and not isinstance(self.seed, int):
            return f"seed must be an integer, got {self.seed!r}"
        if any(not isinstance(s, str) or not s for s in self.stop):
            return "stop strings must be non-empty strings"
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _finite_number(x: object) -> bool:
    return isinstance(x, int | float) and x == x and abs(x) != float("inf")


class TaskStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_task_ids = itertools.count()


@dataclass(eq=False)
class Task:
    """One generation request and its evolving state inside the scheduler."""

    prompt_ids: list[int]
    params: SamplingParams
    task_id: int = field(default_factory=lambda: next(_task_ids))
    group_id: int | None = None
    status: TaskStatus = TaskStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_temp_logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    error: TaskError | None = None
    num_cached_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    policy_version: int | None = None
    generator: torch.Generator | None = None
    text: str | None = None
    arrival_time: float = 0.0
    admit_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is TaskStatus.FINISHED

    def finish(self, reason: FinishReason, error: TaskError | None = None) -> None:
        self.status = TaskStatus.FINISHED
        self.finish_reason = reason
        self.error = error


@dataclass(frozen=True)
class GenerationResult:
    """The outcome of one request: exactly one finish reason, tokens and their log-probs."""

    task_id: int
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_temp_logprobs: list[float]
    finish_reason: FinishReason
    error: TaskError | None
    stop_reason: int | str | None
    policy_version: int
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    num_preemptions: int
    text: str | None
    queue_wait_s: float
    time_to_first_token_s: float | None
    decode_tokens_per_s: float | None

    @property
    def ok(self) -> bool:
        return self.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)

    @classmethod
    def from_task(cls, task: Task) -> GenerationResult:
        assert task.finish_reason is not None, "result of an unfinished task"
        ttft = decode_rate = None
        if task.first_token_time is not None:
            ttft = task.first_token_time - task.arrival_time
            decode_s = (task.finish_time or task.first_token_time) - task.first_token_time
            if len(task.output_ids) > 1 and decode_s > 0:
                decode_rate = (len(task.output_ids) - 1) / decode_s
        return cls(
            task_id=task.task_id,
            prompt_ids=list(task.prompt_ids),
            output_ids=list(task.output_ids),
            output_logprobs=list(task.output_logprobs),
            output_temp_logprobs=list(task.output_temp_logprobs),
            finish_reason=task.finish_reason,
            error=task.error,
            stop_reason=task.stop_reason,
            policy_version=task.policy_version if task.policy_version is not None else -1,
            num_prompt_tokens=len(task.prompt_ids),
            num_cached_prompt_tokens=task.num_cached_prompt_tokens,
            num_preemptions=task.num_preemptions,
            text=task.text,
            queue_wait_s=(task.admit_time or task.finish_time or task.arrival_time)
            - task.arrival_time,
            time_to_first_token_s=ttft,
            decode_tokens_per_s=decode_rate,
        )
