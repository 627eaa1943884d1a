"""Samples gain ``resumed_at``: the response indexes at which a preempted request resumed (the
K/V of every earlier position recomputed there by that token's version), so the audit replays
it; NULL when it never resumed after its first token. A nullable column added and dropped in
place, as 0008's.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("samples", sa.Column("resumed_at", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("samples", "resumed_at")
