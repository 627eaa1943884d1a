"""Studies: the ``studies`` table (a named set of train jobs from one base config and a search
space), jobs linked to their study (``study_id``, ``ON DELETE SET NULL``: deleting a study
never deletes a job), the job's point (``study_point``) and Optuna trial (``study_trial``), and
the ``pruned`` job status (stopped early by the study's pruner).

The jobs table is copied on SQLite (batch mode) for the new foreign key and the status
constraint; the copy keeps the id counter, as in 0005. Downgrading turns pruned jobs into
cancelled ones (their reason kept) and drops the studies, leaving their jobs.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("queued", "running", "cancelling", "cancelled", "succeeded", "failed", "stalled")


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True)


def _sqlite_counter() -> int | None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return None
    return bind.exec_driver_sql("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").scalar()


def _restore_counter(last_id: int | None) -> None:
    """Batch mode's copy of the jobs table restarts SQLite's id counter: put it back, so the
    id of a deleted job (and its ``jobs/<id>`` folder) is never given to a new one."""
    if last_id is None:
        return
    op.execute("DELETE FROM sqlite_sequence WHERE name = 'jobs'")
    op.execute(
        sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', :seq)").bindparams(
            seq=last_id
        )
    )


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("kind", _enum("study_kind", "grid", "random", "optuna"), nullable=False),
        sa.Column(
            "status",
            _enum("study_status", "running", "completed", "cancelled"),
            nullable=False,
        ),
        sa.Column("base_config", sa.JSON(), nullable=False),
        sa.Column("search_space", sa.JSON(), nullable=False),
        sa.Column("seeds", sa.Integer(), nullable=False),
        sa.Column("max_jobs", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("jobs_made", sa.Integer(), nullable=False),
        sa.Column("optuna_study", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("seeds >= 1", name=op.f("ck_studies_seeds_positive")),
        sa.CheckConstraint("max_jobs >= 1", name=op.f("ck_studies_max_jobs_positive")),
        sa.CheckConstraint("concurrency >= 1", name=op.f("ck_studies_concurrency_positive")),
        sa.CheckConstraint(
            "jobs_made >= 0 AND jobs_made <= max_jobs", name=op.f("ck_studies_jobs_made_in_plan")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_studies")),
        sa.UniqueConstraint("name", name=op.f("uq_studies_name")),
        sqlite_autoincrement=True,
    )
    last_id = _sqlite_counter()
    with op.batch_alter_table("jobs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column(
            "status",
            existing_type=_enum("job_status", *STATUSES),
            type_=_enum("job_status", *STATUSES, "pruned"),
            existing_nullable=False,
        )
        batch.add_column(sa.Column("study_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("study_point", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("study_trial", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            batch.f("fk_jobs_study_id_studies"),
            "studies",
            ["study_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index(batch.f("ix_jobs_study_id"), ["study_id"], unique=False)
    _restore_counter(last_id)


def downgrade() -> None:
    op.execute("UPDATE jobs SET status = 'cancelled' WHERE status = 'pruned'")
    last_id = _sqlite_counter()
    with op.batch_alter_table("jobs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_index(batch.f("ix_jobs_study_id"))
        batch.drop_constraint(batch.f("fk_jobs_study_id_studies"), type_="foreignkey")
        batch.drop_column("study_trial")
        batch.drop_column("study_point")
        batch.drop_column("study_id")
        batch.alter_column(
            "status",
            existing_type=_enum("job_status", *STATUSES, "pruned"),
            type_=_enum("job_status", *STATUSES),
            existing_nullable=False,
        )
    _restore_counter(last_id)
    op.drop_table("studies")
