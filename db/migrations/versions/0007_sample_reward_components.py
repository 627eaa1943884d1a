"""Samples gain ``reward_components``: a job with several rewards keeps each one's score per
sample (a JSON object name -> score; NULL for a job with one reward).

A nullable column added and dropped in place (SQLite >= 3.35 drops a column without copying
the table, so its AUTOINCREMENT counter is untouched).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("samples", sa.Column("reward_components", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("samples", "reward_components")
