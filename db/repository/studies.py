"""Studies: named sets of train jobs from one base config and a search space.

The session functions (`list_studies`, `get_study`, `study_job_ids`) are what views read
with a session of their own; `StudiesMixin` is the repository's transactions. A study's jobs
are created a few at a time (`StudiesMixin.schedule_study`), under the study row's lock, so
two jobs finishing at once never submit more than the study's ``concurrency``. Deleting a
study leaves its jobs (``ON DELETE SET NULL``).
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.enums import JobKind, JobStatus, StudyKind, StudyStatus, coerce
from db.errors import InvalidValue, StudyNotFound
from db.models import Job, Study
from db.records import JobInfo
from db.repository.base import RepositoryBase, check_json
from db.repository.jobs import job_info

MAX_NAME_LENGTH = 128
# A study's jobs that still hold one of its ``concurrency`` slots.
_OCCUPYING = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING)


@dataclass(frozen=True)
class StudyInfo:
    """A study (`db.models.Study`) with how many of its jobs are in each status."""

    id: int
    name: str
    kind: StudyKind
    status: StudyStatus
    base_config: dict[str, Any]
    search_space: dict[str, Any]
    seeds: int
    max_jobs: int
    concurrency: int
    jobs_made: int  # of the planned ones (a job deleted since still counts)
    optuna_study: str | None
    created_at: datetime
    updated_at: datetime
    job_counts: dict[str, int]  # job status -> how many


@dataclass(frozen=True)
class StudyJobRecord:
    """One job a study is about to create: its whole config, its point and its trial."""

    config: dict[str, Any]
    point: dict[str, Any]
    total_steps: int | None = None
    trial: int | None = None


# (the study, how many jobs it has, how many to add now) -> the jobs to add, in plan order
JobMaker = Callable[[StudyInfo, int, int], list[StudyJobRecord]]


def _job_counts(session: Session, study_ids: list[int]) -> dict[int, dict[str, int]]:
    statement = (
        select(Job.study_id, Job.status, func.count())
        .where(Job.study_id.in_(study_ids))
        .group_by(Job.study_id, Job.status)
    )
    counts: dict[int, dict[str, int]] = {study_id: {} for study_id in study_ids}
    for study_id, status, count in session.execute(statement):
        counts[study_id][status.value] = count
    return counts


def _info(study: Study, counts: dict[str, int]) -> StudyInfo:
    return StudyInfo(
        id=study.id,
        name=study.name,
        kind=study.kind,
        status=study.status,
        base_config=study.base_config,
        search_space=study.search_space,
        seeds=study.seeds,
        max_jobs=study.max_jobs,
        concurrency=study.concurrency,
        jobs_made=study.jobs_made,
        optuna_study=study.optuna_study,
        created_at=study.created_at,
        updated_at=study.updated_at,
        job_counts=counts,
    )


def _load(session: Session, id_or_name: int | str, *, for_update: bool = False) -> Study:
    key = Study.id if isinstance(id_or_name, int) else Study.name
    statement = select(Study).where(key == id_or_name)
    if for_update:
        statement = statement.with_for_update()
    study = session.scalars(statement).one_or_none()
    if study is None:
        raise StudyNotFound(id_or_name)
    return study


def list_studies(session: Session) -> list[StudyInfo]:
    """Every study, newest first, with its job counts."""
    studies = list(session.scalars(select(Study).order_by(Study.id.desc())))
    counts = _job_counts(session, [study.id for study in studies])
    return [_info(study, counts[study.id]) for study in studies]


def get_study(session: Session, id_or_name: int | str) -> StudyInfo:
    """A study by id (an int) or name (a str); `StudyNotFound` if there is none."""
    study = _load(session, id_or_name)
    return _info(study, _job_counts(session, [study.id])[study.id])


def study_job_ids(session: Session, study_id: int) -> list[int]:
    """The ids of a study's jobs in the order they were planned (seed sets together)."""
    statement = select(Job.id).where(Job.study_id == study_id).order_by(Job.id)
    return list(session.scalars(statement))


class StudiesMixin(RepositoryBase):
    def create_study(
        self,
        name: str,
        kind: StudyKind | str,
        base_config: dict[str, Any],
        search_space: dict[str, Any],
        *,
        seeds: int,
        max_jobs: int,
        concurrency: int,
        optuna_study: str | None = None,
    ) -> StudyInfo:
        """A new ``running`` study with no jobs yet (`schedule_study` adds them); a taken
        name is refused (`InvalidValue`)."""
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
            raise InvalidValue(f"name: give a study name of 1 to {MAX_NAME_LENGTH} characters")
        for field, value in (
            ("seeds", seeds),
            ("max_jobs", max_jobs),
            ("concurrency", concurrency),
        ):
            if not isinstance(value, int) or value < 1:
                raise InvalidValue(f"{field}: {value!r} is not a whole number of at least 1")
        check_json(base_config, "base_config")
        check_json(search_space, "search_space")
        with self._write() as session:
            if session.scalar(select(Study.id).where(Study.name == name)) is not None:
                raise InvalidValue(f"name: a study named {name!r} exists already")
            study = Study(
                name=name,
                kind=coerce(StudyKind, kind, "kind"),
                status=StudyStatus.RUNNING,
                base_config=base_config,
                search_space=search_space,
                seeds=seeds,
                max_jobs=max_jobs,
                concurrency=concurrency,
                optuna_study=optuna_study,
            )
            session.add(study)
            session.flush()
            return _info(study, {})

    def get_study(self, id_or_name: int | str) -> StudyInfo:
        with self._read() as session:
            return get_study(session, id_or_name)

    def list_studies(self) -> list[StudyInfo]:
        with self._read() as session:
            return list_studies(session)

    def study_jobs(self, study_id: int) -> list[JobInfo]:
        """A study's jobs in plan order."""
        statement = select(Job).where(Job.study_id == study_id).order_by(Job.id)
        with self._read() as session:
            return [job_info(job) for job in session.scalars(statement)]

    def schedule_study(self, study_id: int, make: JobMaker) -> tuple[StudyInfo, list[JobInfo]]:
        """Under the study row's lock: add the next jobs of a running study (``make`` builds
        them) while fewer than ``concurrency`` of its jobs are queued or running and fewer
        than ``max_jobs`` were made; a study with every job made and none left queued or running
        becomes ``completed``. Returns the study and the new (queued) jobs, to send."""
        with self._write() as session:
            study = _load(session, study_id, for_update=True)
            counts = _job_counts(session, [study.id])[study.id]
            made = study.jobs_made
            occupied = sum(counts.get(status.value, 0) for status in _OCCUPYING)
            room = min(study.concurrency - occupied, study.max_jobs - made)
            created: list[Job] = []
            if study.status is StudyStatus.RUNNING and room > 0:
                for record in make(_info(study, counts), made, room)[:room]:
                    check_json(record.config, "config")
                    check_json(record.point, "study_point")
                    job = Job(
                        kind=JobKind.TRAIN,
                        status=JobStatus.QUEUED,
                        config=record.config,
                        total_steps=record.total_steps,
                        study_id=study.id,
                        study_point=record.point,
                        study_trial=record.trial,
                    )
                    session.add(job)
                    created.append(job)
                study.jobs_made += len(created)
                session.flush()
            finished = study.jobs_made >= study.max_jobs and occupied + len(created) == 0
            if study.status is StudyStatus.RUNNING and finished:
                study.status = StudyStatus.COMPLETED
            session.flush()
            counts = _job_counts(session, [study.id])[study.id]
            return _info(study, counts), [job_info(job) for job in created]

    def set_study_status(self, study_id: int, status: StudyStatus | str) -> StudyInfo:
        """Mark a study ``cancelled`` (nothing more is submitted) or ``running`` again."""
        with self._write() as session:
            study = _load(session, study_id, for_update=True)
            study.status = coerce(StudyStatus, status, "status")
            session.flush()
            return _info(study, _job_counts(session, [study.id])[study.id])

    def delete_study(self, study_id: int) -> None:
        """Delete a study; its jobs stay (unlinked), with everything they stored."""
        with self._write() as session:
            session.delete(_load(session, study_id, for_update=True))
