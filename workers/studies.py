"""Studies: one base train config and a search space (`workers.study_spec`), run as jobs on
the queue (`workers.study_queue`), with Optuna's sampler and pruner for an ``optuna`` study
(`workers.study_trials`). Run, cancel, resume and clone a study (``rlwb study``,
`workers.api`)."""

import uuid
from typing import Any

from db import (
    InvalidValue,
    JobKind,
    JobStatus,
    StudyInfo,
    StudyKind,
    StudyNotFound,
    StudyStatus,
)
from workers.job_files import absolute_paths, check_data_records, check_paths
from workers.settings import Settings
from workers.specs import SpecError
from workers.study_queue import advance_study
from workers.study_spec import StudySpec, check_caps, corner, parse_study, stored_spec, study_table
from workers.study_trials import optuna_storage, optuna_url
from workers.submission import cancel_job, celery_app, resume_job, validate_job

# Jobs of a study that `resume_study` queues again.
RESUMED = (JobStatus.CANCELLED, JobStatus.FAILED)


def _check_configs(spec: StudySpec, base: dict[str, Any]) -> None:
    """Every planned config (grid, random) or the corners of the ranges (optuna), each
    validated as a submitted job is; a refused one names its point."""
    if spec.kind is StudyKind.OPTUNA:
        corners = [
            {name: corner(space, end) for name, space in spec.ranges.items()} for end in (0, -1)
        ]
        configs = [spec.job_config(base, 0, point) for point in corners]
    else:
        points = spec.points()
        configs = [
            spec.job_config(base, i, points[i // spec.seeds]) for i in range(spec.planned_jobs)
        ]
    for config in configs:
        try:
            validate_job(JobKind.TRAIN, config)
        except SpecError as exc:
            varied = {k: config[k] for k in [*spec.grid, *spec.ranges, "seed"]}
            raise SpecError(f"study point {varied}: {exc}") from None


def _name_taken(repo: Any, name: str) -> bool:
    try:
        repo.get_study(name)
    except StudyNotFound:
        return False
    return True


def run_study(base_config: dict[str, Any], study: Any) -> StudyInfo:
    """Check a study (`parse_study`; every planned config validated as a submitted job,
    the caps, the files once), store it and send its first jobs."""
    from workers.app import repository

    base = absolute_paths(base_config) if isinstance(base_config, dict) else base_config
    if not isinstance(base, dict):
        raise SpecError("a study's base config must be a table of job fields")
    spec = parse_study(study, base)
    settings = Settings.from_env()
    check_caps(spec, settings)
    _check_configs(spec, base)
    check_paths(base, settings)
    check_data_records(base)
    repo = repository()
    if _name_taken(repo, spec.name):
        raise InvalidValue(f"name: a study named {spec.name!r} exists already")
    optuna_name = None
    if spec.kind is StudyKind.OPTUNA:  # its own name: a deleted study's may still be there
        import optuna

        optuna_name = f"rlwb-{spec.name}-{uuid.uuid4().hex[:12]}"
        storage = optuna_storage(optuna_url(repo))
        optuna.create_study(study_name=optuna_name, storage=storage, direction="maximize")
    info = repo.create_study(
        spec.name,
        spec.kind,
        base,
        spec.search_space,
        seeds=spec.seeds,
        max_jobs=spec.planned_jobs,
        concurrency=spec.concurrency,
        optuna_study=optuna_name,
    )
    advance_study(celery_app(), repo, info.id)
    return repo.get_study(info.id)


def cancel_study(id_or_name: int | str) -> StudyInfo:
    """Stop a study: nothing more is made, its queued jobs are cancelled and its running
    ones stop at their next step (each keeps what it stored)."""
    from workers.app import repository

    repo = repository()
    study = repo.set_study_status(repo.get_study(id_or_name).id, StudyStatus.CANCELLED)
    for job in repo.study_jobs(study.id):
        if job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            cancel_job(job.id)
    return repo.get_study(study.id)


def resume_study(id_or_name: int | str) -> StudyInfo:
    """Run a cancelled study on: its cancelled and failed jobs are queued again (from their
    newest versions; as many as its concurrency has room for, the rest stay as they are and
    resume one by one with ``rlwb resume``), then its unmade jobs follow."""
    from workers.app import repository

    repo = repository()
    study = repo.set_study_status(repo.get_study(id_or_name).id, StudyStatus.RUNNING)
    occupied = sum(study.job_counts.get(s.value, 0) for s in (JobStatus.QUEUED, JobStatus.RUNNING))
    stopped = [job for job in repo.study_jobs(study.id) if job.status in RESUMED]
    for job in stopped[: max(study.concurrency - occupied, 0)]:
        resume_job(job.id)
    advance_study(celery_app(), repo, study.id)
    return repo.get_study(study.id)


def clone_study(id_or_name: int | str, name: str) -> StudyInfo:
    """A new study named ``name`` with the base config and search space of another."""
    from workers.app import repository

    study = repository().get_study(id_or_name)
    return run_study(study.base_config, {**study_table(stored_spec(study)), "name": name})
