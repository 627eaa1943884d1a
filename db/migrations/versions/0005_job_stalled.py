"""Jobs gain the ``stalled`` status: ended early with nothing broken (no reward variance left
to learn from), with the reason as the job's error.

The status is a VARCHAR with a CHECK constraint (``ck_jobs_job_status``), so the constraint is
replaced (SQLite: by batch mode's table copy). Downgrading turns stalled jobs into failed ones,
their reason kept.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("queued", "running", "cancelling", "cancelled", "succeeded", "failed")


def _status(*values: str) -> sa.Enum:
    return sa.Enum(*values, name="job_status", native_enum=False, create_constraint=True)


def _retype(old: sa.Enum, new: sa.Enum) -> None:
    """Change the status column's type. SQLite copies the table: the copy stays AUTOINCREMENT
    and keeps the id counter, so the id of a deleted job (and its checkpoint directory,
    ``jobs/<id>``) is never given to a new one."""
    bind = op.get_bind()
    counter = "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'"
    last_id = bind.exec_driver_sql(counter).scalar() if bind.dialect.name == "sqlite" else None
    with op.batch_alter_table("jobs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("status", existing_type=old, type_=new, existing_nullable=False)
    if last_id is not None:
        op.execute("DELETE FROM sqlite_sequence WHERE name = 'jobs'")
        op.execute(
            sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', :seq)").bindparams(
                seq=last_id
            )
        )


def upgrade() -> None:
    _retype(_status(*STATUSES), _status(*STATUSES, "stalled"))


def downgrade() -> None:
    op.execute("UPDATE jobs SET status = 'failed' WHERE status = 'stalled'")
    _retype(_status(*STATUSES, "stalled"), _status(*STATUSES))
