"""Ordered access paths by batch: one batch's samples in page order, a job's batches in order.

The samples' batch index gains the page order (policy_version, id), so a page of one batch's
samples is read in order and stops after ``limit`` rows; it still serves the foreign key.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_samples_batch_version", "samples", ["batch_id", "policy_version", "id"])
    op.drop_index("ix_samples_batch_id", table_name="samples")
    op.create_index("ix_rollout_batches_job_order", "rollout_batches", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_rollout_batches_job_order", table_name="rollout_batches")
    op.create_index("ix_samples_batch_id", "samples", ["batch_id"])
    op.drop_index("ix_samples_batch_version", table_name="samples")
