"""SQLAlchemy 2.0 typed models: studies, jobs, policy versions, rollout batches and samples.

Child rows are deleted with their job by ``ON DELETE CASCADE`` in the database; a deleted
study leaves its jobs (``ON DELETE SET NULL``).
Every table uses AUTOINCREMENT on SQLite so that ids are never reused (a stale Celery task
must never find a new job under an old id).
"""

from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from db.arrays import Float32Array, Int32Array
from db.enums import BatchStatus, FinishReason, JobKind, JobStatus, StudyKind, StudyStatus
from db.records import METRIC_TYPES
from db.timestamps import UTCDateTime, utcnow

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# 64-bit ids on PostgreSQL; SQLite needs INTEGER for a rowid (autoincrementing) key.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def _enum(enum: type[StrEnum], name: str) -> Enum:
    """A portable enum column: VARCHAR plus a named CHECK constraint."""
    return Enum(
        enum,
        name=name,
        native_enum=False,
        create_constraint=True,
        values_callable=lambda members: [member.value for member in members],
        validate_strings=True,
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        float: Double(),  # explicit: SQLAlchemy 2.0 and 2.1 map float differently
    }


class Study(Base):
    """A named set of train jobs: one base config, a search space and how points are picked
    (`StudyKind`); its jobs link back with ``jobs.study_id``."""

    __tablename__ = "studies"
    __table_args__ = (
        CheckConstraint("seeds >= 1", name="seeds_positive"),
        CheckConstraint("max_jobs >= 1", name="max_jobs_positive"),
        CheckConstraint("concurrency >= 1", name="concurrency_positive"),
        CheckConstraint("jobs_made >= 0 AND jobs_made <= max_jobs", name="jobs_made_in_plan"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    kind: Mapped[StudyKind] = mapped_column(_enum(StudyKind, "study_kind"))
    status: Mapped[StudyStatus] = mapped_column(_enum(StudyStatus, "study_status"))
    base_config: Mapped[dict[str, Any]]
    search_space: Mapped[dict[str, Any]]
    seeds: Mapped[int]  # jobs per point, seeded seed, seed + 1, ...
    max_jobs: Mapped[int]
    concurrency: Mapped[int]  # jobs queued or running at once
    # how many of the planned jobs were made (the next is number ``jobs_made``), kept apart
    # from the jobs themselves: a job deleted by hand is not made again
    jobs_made: Mapped[int] = mapped_column(default=0)
    optuna_study: Mapped[str | None] = mapped_column(String(255))  # in Optuna's storage
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint("step >= 0", name="step_non_negative"),
        CheckConstraint("attempts >= 0", name="attempts_non_negative"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[JobKind] = mapped_column(_enum(JobKind, "job_kind"))
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus, "job_status"), index=True)
    config: Mapped[dict[str, Any]]
    step: Mapped[int] = mapped_column(default=0)
    total_steps: Mapped[int | None]
    current_version: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    celery_task_id: Mapped[str | None] = mapped_column(String(255))
    attempts: Mapped[int] = mapped_column(default=0)
    # The fencing token of the current attempt: +1 at every start and every recovery; a
    # worker's writes carry the token it started with and are refused once it changed.
    fence: Mapped[int] = mapped_column(default=0, server_default="0")
    heartbeat_at: Mapped[datetime | None]  # the owner's last sign of life (None: released)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    phase: Mapped[str | None] = mapped_column(Text)  # before the first step (e.g. a warm-up)
    # a LoRA job's frozen base (`core_engine.adapters.base_checksum`), recorded once
    base_checksum: Mapped[str | None] = mapped_column(String(128))
    study_id: Mapped[int | None] = mapped_column(
        ForeignKey("studies.id", ondelete="SET NULL"), index=True
    )
    # a study job's point: the values of the varied fields (its seed is in ``config``)
    study_point: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    study_trial: Mapped[int | None]  # the number of its Optuna trial (an Optuna study's job)

    versions: Mapped[list["PolicyVersion"]] = relationship(
        back_populates="job", passive_deletes=True
    )
    batches: Mapped[list["RolloutBatch"]] = relationship(back_populates="job", passive_deletes=True)


class PolicyVersion(Base):
    """One version of a job's policy weights, with the metrics of the step that produced it."""

    __tablename__ = "policy_versions"
    __table_args__ = (
        UniqueConstraint("job_id", "version"),
        CheckConstraint("version >= 0", name="version_non_negative"),
        CheckConstraint("parent_version < version", name="parent_before_version"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    version: Mapped[int]
    parent_version: Mapped[int | None]
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    weights_checksum: Mapped[str | None] = mapped_column(String(128))
    # one nullable column per named metric of `PolicyMetrics` (db.records.METRIC_TYPES)
    vars().update(
        {
            name: mapped_column(Integer if kind is int else Double, nullable=True)
            for name, kind in METRIC_TYPES.items()
        }
    )
    extra_metrics: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[Job] = relationship(back_populates="versions")


class RolloutBatch(Base):
    """A batch of rollouts, stored whole: accepted (trained on) or rejected with reasons."""

    __tablename__ = "rollout_batches"
    __table_args__ = (
        Index("ix_rollout_batches_job_status", "job_id", "status"),
        Index("ix_rollout_batches_job_order", "job_id", "id"),  # a job's batches in order
        Index("ix_rollout_batches_job_version", "job_id", "policy_version"),
        CheckConstraint("step >= 0", name="step_non_negative"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    policy_version: Mapped[int]
    step: Mapped[int]
    status: Mapped[BatchStatus] = mapped_column(_enum(BatchStatus, "batch_status"))
    rejection_reasons: Mapped[list[str]] = mapped_column(JSON)
    num_samples: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[Job] = relationship(back_populates="batches")
    samples: Mapped[list["Sample"]] = relationship(back_populates="batch", passive_deletes=True)


class Sample(Base):
    """One generated response. The per-token arrays come last so that SQLite row scans that
    only need the scalar columns stop before them."""

    __tablename__ = "samples"
    __table_args__ = (
        # Lists are ordered by (policy_version, id); each equality filter has an index that
        # ends in that order, so a page is read in order and stops after ``limit`` rows.
        Index("ix_samples_job_version", "job_id", "policy_version", "id"),
        Index("ix_samples_job_finish_reason", "job_id", "finish_reason", "policy_version", "id"),
        Index("ix_samples_job_error_code", "job_id", "error_code", "policy_version", "id"),
        Index("ix_samples_job_reward", "job_id", "reward"),
        Index("ix_samples_job_logprob_gap", "job_id", "logprob_gap_max"),
        Index("ix_samples_batch_version", "batch_id", "policy_version", "id"),
        CheckConstraint(
            "(finish_reason IN ('abort', 'error')) = (error_code IS NOT NULL)",
            name="error_code_iff_failed",
        ),
        CheckConstraint("cached_prompt_tokens >= 0", name="cached_prompt_tokens_non_negative"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("rollout_batches.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    policy_version: Mapped[int]
    prompt_index: Mapped[int]
    group_index: Mapped[int]
    finish_reason: Mapped[FinishReason] = mapped_column(_enum(FinishReason, "finish_reason"))
    error_code: Mapped[str | None] = mapped_column(String(64))
    reward: Mapped[float | None]
    advantage: Mapped[float | None]
    response_length: Mapped[int]
    cached_prompt_tokens: Mapped[int]
    seed: Mapped[int | None] = mapped_column(BigInteger)
    # max |trainer - behaviour| log-prob over the trained tokens of a trained sample (all its
    # tokens when stored without a loss record); None: not trained
    logprob_gap_max: Mapped[float | None]
    prompt_text: Mapped[str] = mapped_column(Text)
    response_text: Mapped[str] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    reference_output: Mapped[str | None] = mapped_column(Text)
    prompt_messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # name -> score of each of a job's rewards (None: a job with one reward)
    reward_components: Mapped[dict[str, float] | None] = mapped_column(JSON)
    # [[version, count], ...] of the response's tokens when several versions sampled them (a
    # weight update landed in flight); None: every token is of ``policy_version``
    token_versions: Mapped[list[list[int]] | None] = mapped_column(JSON)
    resumed_at: Mapped[list[int] | None] = mapped_column(JSON)
    segments: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    episode_finish: Mapped[str | None] = mapped_column(String(32))
    # an episode's assistant turns and the turns whose tool call could not be parsed (filters)
    turns: Mapped[int | None] = mapped_column(Integer)
    tool_errors: Mapped[int | None] = mapped_column(Integer)
    # the rank of a several-device job that generated it (0 for one device; None: not recorded)
    rank: Mapped[int | None] = mapped_column(Integer)
    response_token_ids: Mapped[list[int]] = mapped_column(Int32Array)
    behaviour_logprobs: Mapped[list[float]] = mapped_column(Float32Array)
    temperature_logprobs: Mapped[list[float] | None] = mapped_column(Float32Array)
    trainer_logprobs: Mapped[list[float] | None] = mapped_column(Float32Array)
    # what the loss did per token of a trained sample (`SampleRecord`; flags: `LossFlag` bits)
    loss_ratios: Mapped[list[float] | None] = mapped_column(Float32Array)
    loss_weights: Mapped[list[float] | None] = mapped_column(Float32Array)
    loss_flags: Mapped[list[int] | None] = mapped_column(Int32Array)

    batch: Mapped[RolloutBatch] = relationship(back_populates="samples")


class VersionSampleStats(Base):
    """Running totals of a job's samples per (policy version, finish reason), kept by the
    repository in the transaction that stores the samples, so that per-version metrics do
    not scan the samples."""

    __tablename__ = "version_sample_stats"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    policy_version: Mapped[int] = mapped_column(primary_key=True)
    finish_reason: Mapped[FinishReason] = mapped_column(
        _enum(FinishReason, "finish_reason"), primary_key=True
    )
    samples: Mapped[int]
    rewarded: Mapped[int]
    reward_sum: Mapped[float]
    response_tokens: Mapped[int] = mapped_column(BigInteger)
