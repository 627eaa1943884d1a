"""What the trainer reports: one record per step, the version it produced, why it stopped."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from core_engine.atomic_dir import Writer
from core_engine.rl.objective.loss import SampleLossRecord
from core_engine.rl.rollout.results import RawRollout


class StopReason(enum.StrEnum):
    DONE = "done"  # all configured steps were taken
    STOPPED = "stopped"  # `should_stop` asked for it (cancel, shutdown)
    STALLED = "stalled"  # too many batches in a row without any learning signal


@dataclass(frozen=True)
class VersionRecord:
    version: int
    parent: int
    checksum: str
    metrics: dict[str, float]
    checkpoint: str | None = None


@dataclass(frozen=True)
class StepRecord:
    """One rollout batch and the trainer's decision on it.

    `version` is the version this step produced (None: the step was rejected and nothing
    advanced). `rejected_groups` maps each group that must never be trained on to its reason;
    with an accepted step the other groups are the ones trained on (zero-variance groups among
    them with advantage 0). `reasons` says why the whole step was rejected, or lists the group
    problems of an accepted one.
    """

    step: int
    rollout: RawRollout | None
    version: VersionRecord | None
    reasons: list[str]
    rejected_groups: dict[int, str] = field(default_factory=dict)
    advantages: list[float] | None = None
    trainer_logprobs: list[list[float] | None] | None = None  # per sample; None: not trained
    loss_records: list[SampleLossRecord | None] | None = None  # per sample; None: not trained
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "accepted" if self.version is not None else "rejected"


@dataclass
class TrainerHooks:
    on_step: Callable[[StepRecord], None] | None = None
    should_stop: Callable[[], bool] | None = None
    checkpoint_writer: Writer | None = None  # e.g. a worker attempt's tag and fencing guard
