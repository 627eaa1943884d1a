"""Per-token training diagnostics and the job's phase.

Samples gain the trainer's per-token log-prob at training time (``trainer_logprobs``, only for
samples trained on) and their largest |trainer - behaviour| log-prob gap, indexed per job so
the Samples filter finds large importance ratios without reading the arrays. Jobs gain
``phase``: what a running job is doing before its first step (e.g. building the demo policy).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("logprob_gap_max", sa.Double(), nullable=True))
        batch.add_column(sa.Column("trainer_logprobs", sa.LargeBinary(), nullable=True))
    op.create_index("ix_samples_job_logprob_gap", "samples", ["job_id", "logprob_gap_max"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("phase", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("phase")
    op.drop_index("ix_samples_job_logprob_gap", table_name="samples")
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("trainer_logprobs")
        batch.drop_column("logprob_gap_max")
