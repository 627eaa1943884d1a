"""Jobs gain ``base_checksum``: the checksum of a LoRA job's frozen base checkpoint, recorded
once per job (its versions' checksums cover the adapter alone).

A nullable column added and dropped in place (SQLite >= 3.35 drops a column without copying
the table, so its AUTOINCREMENT counter is untouched).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("base_checksum", sa.String(128), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "base_checksum")
