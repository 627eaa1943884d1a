"""Samples gain ``rank``: the rank (0 .. devices - 1) of a several-device job that generated
the sample; 0 for a one-device job; NULL for the samples stored before ranks were recorded.
A nullable column added and dropped in place, as 0008's.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("samples", sa.Column("rank", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("samples", "rank")
