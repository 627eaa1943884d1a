"""A study's jobs on the queue: made a few at a time (`advance_study`) when the study
starts and whenever one of its jobs ends (`job_ended`, in the ending job's task), under the
study row's lock (`db.Repository.schedule_study`), so that no more than its concurrency are
ever queued or running."""

from typing import Any

from celery import Celery

from db import JobInfo, JobKind, Repository, StudyInfo, StudyKind
from db.repository.studies import JobMaker, StudyJobRecord
from workers.specs import validate
from workers.study_spec import StudySpec, stored_spec
from workers.study_trials import distributions, optuna_study, tell_trial


def _maker(repo: Repository, spec: StudySpec, base: dict[str, Any]) -> JobMaker:
    """The `db.repository.studies.JobMaker` of a study: its next planned jobs."""
    points = None if spec.kind is StudyKind.OPTUNA else spec.points()

    def make(study: StudyInfo, made: int, room: int) -> list[StudyJobRecord]:
        records = []
        for index in range(made, min(made + room, study.max_jobs)):
            trial = None
            if points is None:
                asked = optuna_study(repo, study).ask(distributions(spec))
                point, trial = asked.params, asked.number
            else:
                point = points[index // spec.seeds]
            config = spec.job_config(base, index, point)
            total_steps = validate(JobKind.TRAIN, config)  # checked in full by `run_study`
            records.append(StudyJobRecord(config, point, total_steps, trial))
        return records

    return make


def advance_study(celery: Celery, repo: Repository, study_id: int) -> list[JobInfo]:
    """Make the study's next jobs (as many as its concurrency leaves room for) and send them
    with ``celery`` (its tasks registered)."""
    from workers.app import enqueue

    study = repo.get_study(study_id)
    make = _maker(repo, stored_spec(study), study.base_config)
    jobs = repo.schedule_study(study_id, make)[1]
    for job in jobs:
        enqueue(celery, repo, job)
    return jobs


def job_ended(repo: Repository, job_id: int) -> None:
    """After a study's job ends, in its worker: tell its trial, then make the study's next
    jobs."""
    from workers.app import app

    job = repo.get_job(job_id)
    if job.study_id is None or not job.status.is_terminal:
        return
    study = repo.get_study(job.study_id)
    if job.study_trial is not None:
        tell_trial(repo, job, study)
    advance_study(app, repo, study.id)
