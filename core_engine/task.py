"""Requests, sampling parameters and structured outcomes of the engine (no torch at import:
job validation uses `SamplingParams` without loading the engine)."""

from __future__ import annotations

import enum
import itertools
import math
import numbers
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core_engine.detokenize import StopScan

if TYPE_CHECKING:
    from core_engine.runtime.uniforms import Uniforms

# The KV pool's layouts (`core_engine.cache.pool`), named here so that torch-free callers (job
# validation, the UI's form) offer and check the same ones.
KV_STRATEGIES = ("paged", "contiguous")
# The engine's weight dtypes (`core_engine.engine.DTYPES`), named here for the same callers and
# for the OpenAI server's arguments, parsed before torch is loaded.
DTYPE_NAMES = ("float32", "bfloat16", "float16")


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
    ENV_ERROR = "env_error"  # an episode's environment failed (`core_engine.rl.episodes`)
    ENV_TIMEOUT = "env_timeout"
    UNSTORABLE = "unstorable"  # an episode's record breaks `core_engine.rl.episodes.record`


@dataclass(frozen=True)
class TaskError:
    """Machine-readable code plus a human message for an `error` or `abort` outcome."""

    code: ErrorCode
    message: str


# Ranges the sampler can execute (see `runtime/sample.py`).
MIN_TEMPERATURE = 1e-3  # below this, logits / T overflows fp32; use 0 for greedy
MAX_TEMPERATURE = 100.0
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # torch.Generator.manual_seed's range


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings. `temperature == 0` means greedy.

    Transform order: temperature, then top-k, then top-p (on the tempered distribution).
    Integer-like values (numpy integers) are normalised to `int`; a bare `stop` string is one
    stop string. Construction never raises: `validation_error()` says what is unusable.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        for name in ("max_tokens", "top_k", "seed"):
            object.__setattr__(self, name, as_int(getattr(self, name)))
        for name in ("temperature", "top_p"):
            object.__setattr__(self, name, _as_float(getattr(self, name)))
        stop = self.stop
        object.__setattr__(self, "stop", (stop,) if isinstance(stop, str) else _as_tuple(stop))
        ids = _as_tuple(self.stop_token_ids)
        if isinstance(ids, tuple):
            ids = tuple(as_int(t) for t in ids)
        object.__setattr__(self, "stop_token_ids", ids)

    def validation_error(self) -> str | None:
        """Why these parameters cannot be executed, or None when they can."""
        if not _is_int(self.max_tokens) or self.max_tokens <= 0:
            return f"max_tokens must be a positive integer, got {self.max_tokens!r}"
        t = self.temperature
        if not _finite_number(t) or not (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            return (
                f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], "
                f"got {t!r}"
            )
        if not _finite_number(self.top_p) or not 0 < self.top_p <= 1:
            return f"top_p must be in (0, 1], got {self.top_p!r}"
        if not _is_int(self.top_k) or self.top_k < 0:
            return f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}"
        if self.seed is not None and not (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX):
            return f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}], got {self.seed!r}"
        if not isinstance(self.stop_token_ids, tuple) or not all(
            _is_int(t) for t in self.stop_token_ids
        ):
            return f"stop_token_ids must be a sequence of integers, got {self.stop_token_ids!r}"
        if not isinstance(self.stop, tuple) or any(
            not isinstance(s, str) or not s for s in self.stop
        ):
            return f"stop must be a non-empty string or a sequence of them, got {self.stop!r}"
        if not isinstance(self.ignore_eos, bool):
            return f"ignore_eos must be a boolean, got {self.ignore_eos!r}"
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def as_int(value: Any) -> Any:
    """`value` as a plain int when it is integer-like (numpy, torch scalars), never a bool;
    anything else unchanged (validation reports it)."""
    if isinstance(value, bool) or _is_int(value):
        return value
    try:
        return operator.index(value)
    except Exception:  # not integer-like
        return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_float(value: Any) -> Any:
    if isinstance(value, numbers.Real) and not isinstance(value, bool | int | float):
        return float(value)
    return value


def _as_tuple(value: Any) -> Any:
    if isinstance(value, list | tuple | set | frozenset):
        return tuple(value)
    return value


def _finite_number(x: object) -> bool:
    return _is_int(x) or (isinstance(x, float) and math.isfinite(x))


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
    output_versions: list[int] = field(default_factory=list)  # the version that sampled each
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    error: TaskError | None = None
    num_cached_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    # output indexes at which it resumed after a preemption: the K/V of every earlier position
    # was recomputed there, by the version that samples that token
    resumed_at: list[int] = field(default_factory=list)
    policy_version: int | None = None  # the version of its first token (set at admission)
    kv_version: int | None = None  # oldest version whose K/V it holds (None: holds none)
    uniforms: Uniforms | None = None  # its random stream (set when admitted)
    return_logprobs: bool = True
    text: str | None = None
    stop_scan: StopScan | None = None  # the stop-string search so far (`outcomes.stop_reason`)
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

    def record_token(
        self,
        token_id: int,
        logprob: float | None,
        temp_logprob: float | None,
        version: int,
        now: float,
    ) -> None:
        """Append a sampled token, the version that sampled it and, when the request asked
        for them, its log-probs."""
        self.output_ids.append(token_id)
        self.output_versions.append(version)
        if self.return_logprobs:
            self.output_logprobs.append(logprob)
            self.output_temp_logprobs.append(temp_logprob)
        if self.first_token_time is None:
            self.first_token_time = now

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
    # [[version, count], ...]: consecutive output tokens sampled by each version (one run
    # unless a weight update landed in flight)
    token_versions: list[list[int]] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)  # `Task.resumed_at`

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
            token_versions=version_runs(task.output_versions),
            resumed_at=list(task.resumed_at),
        )


def version_runs(versions: list[int]) -> list[list[int]]:
    """Per-token versions -> `[[version, count], ...]` of consecutive equal versions."""
    runs: list[list[int]] = []
    for version in versions:
        if runs and runs[-1][0] == version:
            runs[-1][1] += 1
        else:
            runs.append([version, 1])
    return runs


def expand_runs(runs: list[list[int]]) -> list[int]:
    """`version_runs`' inverse: one version per token."""
    return [version for version, count in runs for _ in range(count)]
