"""Samples gain ``token_versions``: the policy version of each response token when a weight
update landed while the sample was being generated (in-flight pipeline), as runs
``[[version, count], ...]``; NULL when every token is of the sample's ``policy_version``.

A nullable column added and dropped in place (SQLite >= 3.35 drops a column without copying
the table, so its AUTOINCREMENT counter is untouched).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("samples", sa.Column("token_versions", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("samples", "token_versions")
