"""Samples gain ``segments`` (a multi-turn episode's turns and observations over its response
tokens), ``episode_finish`` (why the episode ended), ``turns`` and ``tool_errors`` (its
assistant turns and those whose tool call could not be parsed); all NULL for a single turn.
Nullable columns added and dropped in place, as 0008's.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("samples", sa.Column("segments", sa.JSON(), nullable=True))
    op.add_column("samples", sa.Column("episode_finish", sa.String(32), nullable=True))
    op.add_column("samples", sa.Column("turns", sa.Integer(), nullable=True))
    op.add_column("samples", sa.Column("tool_errors", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("samples", "tool_errors")
    op.drop_column("samples", "turns")
    op.drop_column("samples", "episode_finish")
    op.drop_column("samples", "segments")
