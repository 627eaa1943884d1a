"""Enumerations stored in the database (as strings, checked by a CHECK constraint)."""

from enum import StrEnum
from typing import TypeVar

from db.errors import InvalidValue


class JobKind(StrEnum):
    TRAIN = "train"
    EVALUATE = "evaluate"
    COMPARE = "compare"


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STALLED = "stalled"  # ended early, nothing broken: no reward variance left to learn from
    PRUNED = "pruned"  # stopped early by its study's pruner (its held-out score lagged)

    @property
    def is_terminal(self) -> bool:
        return self in (
            JobStatus.CANCELLED,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.STALLED,
            JobStatus.PRUNED,
        )


class StudyKind(StrEnum):
    """How a study picks its points: every grid point, random draws, or Optuna's sampler."""

    GRID = "grid"
    RANDOM = "random"
    OPTUNA = "optuna"


class StudyStatus(StrEnum):
    RUNNING = "running"  # jobs queued, running or still to submit
    COMPLETED = "completed"  # every planned job finished
    CANCELLED = "cancelled"  # stopped: nothing more is submitted


class BatchStatus(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class EpisodeFinish(StrEnum):
    """Why a multi-turn episode ended (`core_engine.rl.episodes.runner`)."""

    DONE = "done"
    MAX_TURNS = "max_turns"
    CONTEXT_EXCEEDED = "context_exceeded"
    TOOL_PARSE_ERROR = "tool_parse_error"
    ENV_ERROR = "env_error"
    ENV_TIMEOUT = "env_timeout"
    ERROR = "error"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"

    @property
    def is_failure(self) -> bool:
        """`abort` and `error` carry an error code and are never trained on."""
        return self in (FinishReason.ABORT, FinishReason.ERROR)


E = TypeVar("E", bound=StrEnum)


def coerce(enum: type[E], value: E | str, field: str) -> E:
    """Convert a string to `enum`, raising `InvalidValue` that names the field."""
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum)
        raise InvalidValue(f"{field}: {value!r} is not one of {allowed}") from None
