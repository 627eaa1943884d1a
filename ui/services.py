"""What the UI talks to: the repository and the job queue, injectable for tests."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from db import JobInfo, Repository, StudyInfo, data_dir
from workers.api import model_roots


@dataclass(frozen=True)
class Services:
    """The UI's collaborators. ``submit_job(kind, config)`` validates and enqueues a job
    (raising `ValueError` for invalid input), ``cancel_job(job_id)`` cancels one, and
    ``queue_overview()`` describes the workers and their tasks, ``resume_job(job_id)``
    queues a failed, stalled, pruned or cancelled train job again, ``chat(job_id, version, messages,
    temperature, max_tokens, seed)`` answers a Playground turn on a worker, ``audit(sample_ids)``
    re-scores samples under their versions' weights and ``token_diff(sample_id, version_a,
    version_b, job_a, job_b)`` scores one response under two versions (of the sample's job,
    or of jobs A and B), on a worker, and ``run_study(base_config, study_table)`` stores a
    study and queues its first jobs (see `workers.api`)."""

    repository: Repository
    submit_job: Callable[[str, dict[str, Any]], JobInfo]
    cancel_job: Callable[[int], JobInfo]
    queue_overview: Callable[[], dict[str, Any]]
    resume_job: Callable[[int], JobInfo]
    chat: Callable[..., dict[str, Any]]
    audit: Callable[[list[int]], dict[str, Any]]
    token_diff: Callable[..., dict[str, Any]]
    run_study: Callable[[dict[str, Any], dict[str, Any]], StudyInfo]
    model_roots: tuple[Path, ...] = field(default_factory=model_roots)
    data_dir: Path = field(default_factory=data_dir)


def default_services() -> Services:
    """The real services: `workers.api` and the database the environment names
    (``DATABASE_URL``, else the SQLite file in ``RLWB_DATA_DIR``)."""
    from workers import api

    return Services(
        repository=Repository.from_url(),
        submit_job=api.submit_job,
        cancel_job=api.cancel_job,
        queue_overview=api.queue_overview,
        resume_job=api.resume_job,
        chat=api.chat,
        audit=api.audit,
        token_diff=api.token_diff,
        run_study=api.run_study,
    )
