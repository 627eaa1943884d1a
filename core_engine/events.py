"""What an engine step reports: a token produced, or a request finished."""

from __future__ import annotations

from dataclasses import dataclass

from core_engine.task import GenerationResult


@dataclass(frozen=True)
class TokenEvent:
    task_id: int
    index: int
    token_id: int
    logprob: float | None  # the sampled distribution's (0.0 for greedy: a point mass)
    temp_logprob: float | None = None  # log-softmax(logits / T), T = 1 for greedy


@dataclass(frozen=True)
class FinishEvent:
    result: GenerationResult

    @property
    def task_id(self) -> int:
        return self.result.task_id


EngineEvent = TokenEvent | FinishEvent
