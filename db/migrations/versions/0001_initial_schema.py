"""Initial schema: jobs, policy versions, rollout batches, samples, per-version totals.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "kind",
            sa.Enum(
                "train",
                "evaluate",
                "compare",
                name="job_kind",
                native_enum=False,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "running",
                "cancelling",
                "cancelled",
                "succeeded",
                "failed",
                name="job_status",
                native_enum=False,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("current_version", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("celery_task_id", sa.String(length=255), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_jobs_attempts_non_negative")),
        sa.CheckConstraint("step >= 0", name=op.f("ck_jobs_step_non_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_jobs_status"), "jobs", ["status"])

    op.create_table(
        "policy_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("parent_version", sa.Integer(), nullable=True),
        sa.Column("checkpoint_path", sa.Text(), nullable=True),
        sa.Column("weights_checksum", sa.String(length=128), nullable=True),
        sa.Column("reward_mean", sa.Double(), nullable=True),
        sa.Column("reward_std", sa.Double(), nullable=True),
        sa.Column("loss", sa.Double(), nullable=True),
        sa.Column("kl", sa.Double(), nullable=True),
        sa.Column("train_infer_mismatch", sa.Double(), nullable=True),
        sa.Column("num_accepted", sa.Integer(), nullable=True),
        sa.Column("num_rejected", sa.Integer(), nullable=True),
        sa.Column("tokens_per_second", sa.Double(), nullable=True),
        sa.Column("extra_metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "parent_version < version", name=op.f("ck_policy_versions_parent_before_version")
        ),
        sa.CheckConstraint("version >= 0", name=op.f("ck_policy_versions_version_non_negative")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_policy_versions_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_versions")),
        sa.UniqueConstraint("job_id", "version", name=op.f("uq_policy_versions_job_id_version")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "rollout_batches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "accepted",
                "rejected",
                name="batch_status",
                native_enum=False,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("rejection_reasons", sa.JSON(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("step >= 0", name=op.f("ck_rollout_batches_step_non_negative")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_rollout_batches_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_batches")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_rollout_batches_job_status", "rollout_batches", ["job_id", "status"])
    op.create_index(
        "ix_rollout_batches_job_version", "rollout_batches", ["job_id", "policy_version"]
    )

    op.create_table(
        "samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("prompt_index", sa.Integer(), nullable=False),
        sa.Column("group_index", sa.Integer(), nullable=False),
        sa.Column(
            "finish_reason",
            sa.Enum(
                "stop",
                "length",
                "abort",
                "error",
                name="finish_reason",
                native_enum=False,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("advantage", sa.Double(), nullable=True),
        sa.Column("response_length", sa.Integer(), nullable=False),
        sa.Column("cached_prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("prompt_text", sa.Text(), nullable=False),
        sa.Column("response_text", sa.Text(), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("reference_output", sa.Text(), nullable=True),
        sa.Column("prompt_messages", sa.JSON(), nullable=True),
        sa.Column("response_token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("behaviour_logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("temperature_logprobs", sa.LargeBinary(), nullable=True),
        sa.CheckConstraint(
            "(finish_reason IN ('abort', 'error')) = (error_code IS NOT NULL)",
            name=op.f("ck_samples_error_code_iff_failed"),
        ),
        sa.CheckConstraint(
            "cached_prompt_tokens >= 0", name=op.f("ck_samples_cached_prompt_tokens_non_negative")
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["rollout_batches.id"],
            name=op.f("fk_samples_batch_id_rollout_batches"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_samples_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_samples_batch_id", "samples", ["batch_id"])
    op.create_index(
        "ix_samples_job_error_code", "samples", ["job_id", "error_code", "policy_version", "id"]
    )
    op.create_index(
        "ix_samples_job_finish_reason",
        "samples",
        ["job_id", "finish_reason", "policy_version", "id"],
    )
    op.create_index("ix_samples_job_reward", "samples", ["job_id", "reward"])
    op.create_index("ix_samples_job_version", "samples", ["job_id", "policy_version", "id"])
    op.create_table(
        "version_sample_stats",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column(
            "finish_reason",
            sa.Enum(
                "stop",
                "length",
                "abort",
                "error",
                name="finish_reason",
                native_enum=False,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("rewarded", sa.Integer(), nullable=False),
        sa.Column("reward_sum", sa.Double(), nullable=False),
        sa.Column("response_tokens", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_version_sample_stats_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "job_id", "policy_version", "finish_reason", name=op.f("pk_version_sample_stats")
        ),
    )


def downgrade() -> None:
    op.drop_table("version_sample_stats")
    op.drop_table("samples")
    op.drop_table("rollout_batches")
    op.drop_table("policy_versions")
    op.drop_table("jobs")
