"""Samples gain the record of what the loss did to each token of a trained sample:
``loss_ratios`` (float32), ``loss_weights`` (float32) and ``loss_flags`` (int32 `LossFlag`
bits), NULL for the samples stored before it was recorded (and for untrained ones). Nullable
columns added and dropped in place, as 0011's.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("loss_ratios", "loss_weights", "loss_flags")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("samples", sa.Column(name, sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("samples", name)
